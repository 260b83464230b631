//! The flips of the moves this node receives, gathered: a receiver whose
//! cutover is done queues its flip, and whoever gets the turn writes every
//! flip queued by then in one transaction ([`protocol::flip_all`]), so a
//! node that receives many partitions at once (a join) writes the map once
//! per turn rather than once per move, each write racing the others.

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::cluster::map::{MoveRecord, PartitionMap};
use crate::cluster::protocol::{self, FlipRefused, ReadyFlip};
use crate::cluster::{Cluster, ClusterError};

/// What became of a queued flip.
#[derive(Debug)]
pub(super) enum Flipped {
    /// Written at `at`: the record flipped and the map after the turn.
    Done {
        record: MoveRecord,
        map: PartitionMap,
        at: i64,
    },
    /// The map no longer gives the partition to the move's sender.
    Refused(FlipRefused),
}

type Reply = oneshot::Sender<Result<Flipped, ClusterError>>;

/// Flips waiting for a turn, and the turn.
#[derive(Debug, Default)]
pub(in crate::cluster) struct FlipQueue {
    waiting: Mutex<Vec<(ReadyFlip, Reply)>>,
    turn: tokio::sync::Mutex<()>,
}

/// Turns tried for flips whose moves are still as read before they are
/// answered [`ClusterError::Raced`] (another writer keeps changing the map).
const TURNS: usize = 8;

/// Flips one move, with whatever else is queued: answers once its flip is
/// written or refused. [`ClusterError::Raced`] when the move changed since
/// it was read, or the map kept changing.
pub(super) async fn flip(cluster: &Cluster, ready: ReadyFlip) -> Result<Flipped, ClusterError> {
    let queue = &cluster.flips;
    let partition = ready.record.partition;
    let (reply, answer) = oneshot::channel();
    queue
        .waiting
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((ready, reply));
    {
        let _turn = queue.turn.lock().await;
        let gathered =
            std::mem::take(&mut *queue.waiting.lock().unwrap_or_else(PoisonError::into_inner));
        if !gathered.is_empty() {
            flip_gathered(cluster, gathered).await;
        }
    }
    // A turn dropped mid-way (its task ended) answers nothing: raced.
    answer.await.unwrap_or_else(|_| {
        Err(ClusterError::Raced {
            key: cluster.keys.move_of(partition),
        })
    })
}

async fn flip_gathered(cluster: &Cluster, mut gathered: Vec<(ReadyFlip, Reply)>) {
    for _ in 0..TURNS {
        let (map, map_revision) = match super::current_map(cluster).await {
            Ok(read) => read,
            Err(error) => {
                let reason = error.to_string();
                for (_, reply) in gathered {
                    let _ = reply.send(Err(ClusterError::Local(reason.clone())));
                }
                return;
            }
        };
        let ready: Vec<ReadyFlip> = gathered.iter().map(|(ready, _)| ready.clone()).collect();
        let (answers, written) =
            protocol::flip_all(&cluster.keys, &ready, (&map, map_revision), super::now_ms());
        let mut flipping = Vec::new();
        for ((ready, reply), answer) in gathered.into_iter().zip(answers) {
            match answer {
                Ok(record) => flipping.push((ready, reply, record)),
                Err(refused) => {
                    let _ = reply.send(Ok(Flipped::Refused(refused)));
                }
            }
        }
        let Some((next, txn)) = written else {
            return;
        };
        match cluster.etcd.txn(txn).await {
            Ok(answer) if answer.succeeded => {
                for (_, reply, record) in flipping {
                    let _ = reply.send(Ok(Flipped::Done {
                        record,
                        map: next.clone(),
                        at: answer.revision,
                    }));
                }
                return;
            }
            Ok(_) => {}
            Err(error) => {
                let reason = error.to_string();
                for (_, reply, _) in flipping {
                    let _ = reply.send(Err(ClusterError::Local(reason.clone())));
                }
                return;
            }
        }
        // Lost to another write: moves that changed since read are
        // answered raced (their receivers read them again); the others
        // go again on the map as it is now.
        gathered = Vec::new();
        for (ready, reply, _) in flipping {
            let partition = ready.record.partition;
            match super::read_move(cluster, partition).await {
                Ok((Some((_, revision)), _)) if revision == ready.revision => {
                    gathered.push((ready, reply));
                }
                _ => {
                    let _ = reply.send(Err(ClusterError::Raced {
                        key: cluster.keys.move_of(partition),
                    }));
                }
            }
        }
        if gathered.is_empty() {
            return;
        }
    }
    for (ready, reply) in gathered {
        let _ = reply.send(Err(ClusterError::Raced {
            key: cluster.keys.move_of(ready.record.partition),
        }));
    }
}
