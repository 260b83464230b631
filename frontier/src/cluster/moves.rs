//! Partition moves: a partition's records go from one node to another while
//! the crawl goes on (docs/design/cluster.md: the move protocol).
//!
//! etcd holds each move under `moves/P` (at most a few at once), draining
//! nodes under `draining/ID`, and the map. The leader plans: it rebalances
//! the map over the live nodes that are not draining and starts the moves
//! that take a partition from a live node to a live node, rolling back a
//! move whose receiver is gone before its flip; a move starts only while
//! the map is the one the plan read. The receiver drives a move:
//!
//! 1. copy: it empties its own copy of the partition, then pages through
//!    the owner's (CopyPartition), which notes the partition's writes from
//!    the first page on;
//! 2. cutover (written to etcd first): the owner seals the partition (no
//!    writes, not served) and answers the writes noted since the copy
//!    began, or says it has none (it restarted, or a deletion reached the
//!    partition: the receiver then copies it whole again, under the seal);
//! 3. flip: one etcd transaction, conditional on the map and the move being
//!    as read (and refused, the move rolled back, when that map does not
//!    give the partition to the move's sender), gives the partition to the
//!    receiver in a new epoch and
//!    records until when the old owner's leases on it may run; the
//!    receiver serves it once they have;
//! 4. the old owner deletes its copy and says so; the receiver then removes
//!    the move.
//!
//! Every step is safe to repeat after a crash of either node: a copy starts
//! over, a seal answers all writes since the copy began, the flip happens
//! once, and a node reads its part (sealing, serving, deleting) from etcd
//! when it starts. A node drops a copy of a partition the map gives another
//! node only on a view at least as recent as the end of its own receive
//! task for it: an older view cannot show the flip that made it the owner.
//!
//! The decisions are `protocol`'s; this file does their I/O (etcd, the
//! other node, the local store), and `sim` checks them under faults.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub(super) mod copy;
pub(super) mod flip;

use copy::{
    AdminPeer, Progress, catch_up, copy_whole, decode_page, drop_local, seed_from_log, take,
    take_queue_settings,
};

use super::coordination::{Coordination, Txn, Write};
use super::map::{MoveKind, PartitionMap};
use super::protocol::{self, Duty, Keys};
use super::{Cluster, ClusterError, View};
use crate::time::Timestamp;

pub use super::map::{MovePhase, MoveRecord, Moves};
pub(super) use protocol::served_partitions;
/// Pause before a move step that failed is tried again.
const RETRY: Duration = Duration::from_secs(1);

fn now_ms() -> u64 {
    Timestamp::now().unix_millis()
}

/// Brings this node in step with the moves of a new view: seals the
/// partitions it hands over, unseals those no longer moving, and serves
/// what [`served_partitions`] says. Runs before the view is used.
pub(super) async fn settle(cluster: &Cluster, view: &View) {
    let me = cluster.options.node_id.as_str();
    let mut state = cluster.moves.lock().await;
    // A seal ends with its move: rolled back (gone from a view read after
    // the seal), or handed over (the partition deleted first, by
    // `hand_over_done`). Not on a view that predates the seal.
    let protocol::SealChanges {
        newly,
        opened,
        sealing,
    } = protocol::seal_changes(view, me, &state.sealed);
    if !opened.is_empty() || !newly.is_empty() {
        let frontier = Arc::clone(&cluster.frontier);
        let unsealing = opened.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for partition in newly {
                frontier.ingest().seal_partition(partition);
            }
            for partition in unsealing {
                frontier.ingest().unseal_partition(partition);
            }
        })
        .await;
        for partition in opened {
            state.sealed.remove(&partition);
        }
        for partition in sealing {
            state.sealed.entry(partition).or_insert(view.revision);
        }
    }
    let mut served = served_partitions(view, me, cluster.partitions(), now_ms());
    // Sealed here by a SealPartition this view may not show yet, or taken
    // over while the old leader's leases may run.
    let held = cluster.replication.held(now_ms());
    for partition in state.sealed.keys().chain(&held) {
        if let Some(slot) = served.get_mut(*partition as usize) {
            *slot = false;
        }
    }
    if state.served.as_ref() != Some(&served) {
        cluster
            .frontier
            .scheduler()
            .set_served_partitions(Some(served.clone()));
        state.served = Some(served);
    }
    state.receipts.seen(view.revision);
    let receipts = state.receipts.clone();
    drop(state);
    drop_strays(cluster, view, &receipts).await;
}

/// Drops what this node holds of partitions the map gives another node,
/// with no move of them to or from here in flight: what a receiver killed
/// mid-copy keeps of a move rolled back while it was away. Left, those
/// URLs would count in its figures (the crawl would never look finished)
/// though nothing serves them. The map's owner holds every URL of its
/// partition (a map changes only at a move's flip, after the copy), so
/// nothing is lost. Done before the view is used, so a later move of the
/// partition here starts after the drop.
async fn drop_strays(cluster: &Cluster, view: &View, receipts: &protocol::Receipts) {
    let me = cluster.options.node_id.as_str();
    let ingest = cluster.frontier.ingest();
    let strays = protocol::strays(
        view,
        me,
        receipts,
        |partition| {
            ingest
                .stored_in_partition(partition as usize)
                .is_some_and(|stored| stored > 0)
        },
        // Unreadable: not kept (a whole copy is made if it is wanted).
        |partition| ingest.followed_leader(partition).ok().flatten(),
    );
    for (partition, owner) in strays {
        let frontier = Arc::clone(&cluster.frontier);
        let dropped =
            tokio::task::spawn_blocking(move || frontier.ingest().drop_partition(partition)).await;
        match dropped {
            Ok(Ok(dropped)) => tracing::info!(
                partition,
                owner,
                dropped,
                "dropped a stray copy of a partition another node owns"
            ),
            Ok(Err(error)) => {
                tracing::warn!(partition, %error, "a stray copy not dropped yet");
            }
            Err(error) => tracing::warn!(partition, %error, "a stray copy not dropped yet"),
        }
    }
}

/// What a node keeps of its moves in memory.
#[derive(Debug, Default)]
pub(super) struct MoveState {
    /// Partitions sealed here, with the etcd revision the seal was read at.
    sealed: BTreeMap<u32, i64>,
    served: Option<Vec<bool>>,
    /// The moves this node receives (a task each) and where ended ones
    /// ended.
    receipts: protocol::Receipts,
}

/// Every node's part, on each change of the view and at least every
/// second: receive the moves addressed here, delete what was handed over,
/// end moves whose hold has passed, and serve a received partition once
/// its hold ends.
pub(super) async fn run(cluster: Arc<Cluster>) {
    let mut changes = cluster.changes.subscribe();
    loop {
        let view = cluster.view();
        settle(&cluster, &view).await;
        let me = cluster.options.node_id.clone();
        for (&partition, (record, revision)) in &view.moves {
            match protocol::duty(record, &me, now_ms()) {
                Some(Duty::Receive) => {
                    let mut state = cluster.moves.lock().await;
                    if state.receipts.running.insert(partition) {
                        tokio::spawn(receive(Arc::clone(&cluster), partition));
                    }
                }
                Some(Duty::HandOver) => {
                    let current = {
                        let state = cluster.moves.lock().await;
                        protocol::view_current_for(&view, partition, &state.sealed, &state.receipts)
                    };
                    if !current {
                        continue; // a newer view comes
                    }
                    if let Err(error) = hand_over_done(&cluster, record, *revision).await {
                        tracing::warn!(partition, %error, "cannot delete the handed-over partition yet");
                    }
                }
                Some(Duty::Finish) => {
                    if let Err(error) = finish(&cluster, partition, *revision).await {
                        tracing::warn!(partition, %error, "cannot end the move yet");
                    }
                }
                None => {}
            }
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// The receiver, once the old owner deleted its copy and the old leases
/// ended: the move is over.
async fn finish(cluster: &Cluster, partition: u32, revision: i64) -> Result<(), ClusterError> {
    fail::fail_point!("move-before-finish", |_| Err(crate::failpoint::hit(
        "move-before-finish"
    )
    .into()));
    cluster
        .etcd
        .txn(protocol::end_move(&cluster.keys, partition, revision))
        .await?;
    Ok(())
}

/// Writes a conditional transaction about a move; answers the revision it
/// wrote at, or [`ClusterError::Raced`] when its conditions no longer held.
pub(super) async fn written(
    etcd: &dyn Coordination,
    txn: Txn,
    keys: &Keys,
    partition: u32,
) -> Result<i64, ClusterError> {
    let answer = etcd.txn(txn).await?;
    if answer.succeeded {
        Ok(answer.revision)
    } else {
        Err(ClusterError::Raced {
            key: keys.move_of(partition),
        })
    }
}

/// The old owner after the flip: deletes its copy, lets writes reach the
/// partition's number again (they are routed to the new owner), and
/// records that it is done.
async fn hand_over_done(
    cluster: &Cluster,
    record: &MoveRecord,
    revision: i64,
) -> Result<(), ClusterError> {
    let partition = record.partition;
    fail::fail_point!("move-before-delete", |_| Err(crate::failpoint::hit(
        "move-before-delete"
    )
    .into()));
    let frontier = Arc::clone(&cluster.frontier);
    let started = std::time::Instant::now();
    // The leader of a new follower, or an old leader that took the
    // receiver's place among the followers, keeps its copy.
    let keeps = cluster
        .view()
        .map
        .as_ref()
        .is_some_and(|map| map.holds(&cluster.options.node_id, partition));
    let dropped = tokio::task::spawn_blocking(move || {
        let dropped = if keeps {
            Ok(0)
        } else {
            frontier.ingest().drop_partition(partition)
        };
        frontier.ingest().untrack_partition(partition);
        frontier.ingest().unseal_partition(partition);
        dropped
    })
    .await?
    .map_err(|e| ClusterError::Local(e.to_string()))?;
    cluster.moves.lock().await.sealed.remove(&partition);
    let done = protocol::handed_over(record);
    let txn = protocol::update_move(&cluster.keys, revision, &done);
    match written(&*cluster.etcd, txn, &cluster.keys, partition).await {
        Ok(_) => tracing::info!(
            partition,
            to = record.to,
            dropped,
            ms = started.elapsed().as_millis() as u64,
            "handed-over partition deleted here"
        ),
        // Recorded already by an earlier turn: nothing more to say.
        Err(ClusterError::Raced { .. }) => {}
        Err(error) => return Err(error),
    }
    Ok(())
}

/// The receiver's task for one move, until the move is flipped or gone.
async fn receive(cluster: Arc<Cluster>, partition: u32) {
    let ended_at = loop {
        match receive_step(&cluster, partition).await {
            Ok(Some(revision)) => break revision,
            Ok(None) => {}
            // Another step (such as another move's flip) changed etcd
            // meanwhile: read again at once rather than after a pause that
            // would lengthen the cutover.
            Err(error @ ClusterError::Raced { .. }) => {
                tracing::debug!(partition, %error, "partition move step raced; again");
            }
            Err(error) => {
                tracing::warn!(partition, %error, "partition move step failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let receipts = {
        let mut state = cluster.moves.lock().await;
        state.receipts.ended(partition, ended_at);
        state.receipts.clone()
    };
    // A move rolled back mid-copy leaves what was copied: dropped now,
    // not at the next change of the cluster's view, which may be long.
    drop_strays(&cluster, &cluster.view(), &receipts).await;
}

/// A move as etcd holds it now: its record and the record's revision if
/// it exists, and the store's revision at the read.
async fn read_move(
    cluster: &Cluster,
    partition: u32,
) -> Result<(Option<(MoveRecord, i64)>, i64), ClusterError> {
    let key = cluster.keys.move_of(partition);
    let snapshot = cluster.etcd.range(&key).await?;
    let Some(entry) = snapshot.entries.iter().find(|entry| entry.key == key) else {
        return Ok((None, snapshot.revision));
    };
    let record = serde_json::from_slice(&entry.value).map_err(|e| ClusterError::Corrupt {
        key: key.clone(),
        reason: e.to_string(),
    })?;
    Ok((Some((record, entry.mod_revision)), snapshot.revision))
}

/// One step of a move as etcd holds it now; once there is nothing left
/// for the receiver, the store's revision it ended at.
async fn receive_step(cluster: &Arc<Cluster>, partition: u32) -> Result<Option<i64>, ClusterError> {
    let (found, read_at) = read_move(cluster, partition).await?;
    let Some((record, revision)) = found else {
        return Ok(Some(read_at)); // rolled back or finished
    };
    if protocol::duty(&record, &cluster.options.node_id, now_ms()) != Some(Duty::Receive) {
        return Ok(Some(read_at));
    }
    let view = cluster.view();
    let Some(owner) = view.members.get(&record.from) else {
        return Err(ClusterError::NodeAway {
            node: record.from.clone(),
            partition: Some(partition as usize),
        });
    };
    let mut admin = cluster.peers.get(&owner.endpoint())?.admin();
    let mut progress = Progress::new(
        Arc::clone(&cluster.etcd),
        cluster.keys.clone(),
        revision,
        record,
    );
    match progress.record.phase {
        // An in-sync follower holds every write already: it goes straight
        // to the cutover, and never empties its copy (it may be the one
        // that takes over if the leader dies meanwhile).
        MovePhase::Copy if follows_now(cluster, partition) => {
            progress.record = protocol::to_cutover(&progress.record, now_ms());
            progress.write().await?;
            Ok(None)
        }
        // Led here already (a failover gave it to this node; it ends the
        // move too): its copy is the partition's, never emptied for a
        // copy of the old leader's.
        MovePhase::Copy if leads_now(cluster, partition) => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(None)
        }
        MovePhase::Copy => {
            progress.restart();
            let noted = seed_from_log(cluster, &mut admin, &progress.record).await?;
            progress.record.from_log = noted.is_some();
            if noted.is_none() {
                drop_local(cluster, partition).await?;
                copy_whole(cluster, &mut admin, partition, true, &mut progress).await?;
            }
            let caught_up = catch_up(cluster, &mut admin, partition).await?;
            if progress.record.from_log {
                progress.record.copied = caught_up;
            }
            progress.record = protocol::to_cutover(&progress.record, now_ms());
            progress.write().await?;
            if progress.record.kind == MoveKind::Replica {
                let source = if progress.record.from_log {
                    "log"
                } else {
                    "whole"
                };
                metrics::counter!("frontier_cluster_replica_copies_total", "source" => source)
                    .increment(1);
            }
            tracing::info!(
                partition,
                copied = progress.record.copied,
                bytes = progress.record.copied_bytes,
                caught_up,
                noted,
                from_log = progress.record.from_log,
                from = progress.record.from,
                "partition copied; cutover"
            );
            Ok(None)
        }
        MovePhase::Cutover => cut_over(cluster, &mut admin, progress).await.map(Some),
        MovePhase::Flipped => Ok(Some(read_at)),
    }
}

/// The cutover: seals the partition at its owner, takes the tail (or the
/// whole partition again when the owner cannot say what changed), the
/// queue settings, and flips the map. Answers the revision of the flip (or
/// of the rollback, when the map no longer gives the partition to its
/// sender).
async fn cut_over(
    cluster: &Arc<Cluster>,
    admin: &mut AdminPeer,
    mut progress: Progress,
) -> Result<i64, ClusterError> {
    let partition = progress.record.partition;
    let page = cluster.options.move_page_urls;
    let first = seal_page(admin, partition, None, page).await?;
    let (leased, leases_until_ms) = (first.leased, first.leases_until_ms);
    let queues = first.queues.clone();
    let tail = if follows_now(cluster, partition) {
        // The seal answered once the leader's followers, this node among
        // them, confirmed every write: nothing to take.
        0
    } else if first.tracked {
        let mut sealed = first;
        let mut tail = 0;
        loop {
            let after = sealed.urls.last().map(|last| proto::admin::PartitionKey {
                crawl_id: last.crawl_id.clone(),
                url: last.url.clone(),
            });
            let urls = decode_page(std::mem::take(&mut sealed.urls))?;
            tail += urls.len() as u64;
            take(cluster, partition, urls).await?;
            if sealed.end || after.is_none() {
                break tail;
            }
            sealed = seal_page(admin, partition, after, page).await?;
            if !sealed.tracked {
                return Err(ClusterError::OwnerRestarted);
            }
        }
    } else {
        drop_local(cluster, partition).await?;
        progress.restart();
        copy_whole(cluster, admin, partition, false, &mut progress).await?;
        progress.record.copied
    };
    take_queue_settings(cluster, queues).await?;
    if progress.record.kind == MoveKind::Replica {
        // In sync from the flip on, this copy may take the partition over
        // before a batch brings it the leader's lease horizon.
        super::replication::hold_horizon(cluster, &progress.record.from, leases_until_ms).await?;
    }
    fail::fail_point!("move-before-flip", |_| Err(crate::failpoint::hit(
        "move-before-flip"
    )
    .into()));
    // The flip, with the others ready on this node ([`flip`]), on the map
    // as etcd holds it then (the view may lag behind another move's flip).
    // Another move's flip may land first: the partition stays sealed and
    // its tail is taken, so only the flip is tried again, while the move
    // is the one read (else the receiver reads the move again from the
    // start).
    let ready = protocol::ReadyFlip {
        revision: progress.revision,
        record: progress.record.clone(),
        leases: (leased, leases_until_ms),
    };
    let (flipped, next_map, flipped_at) = loop {
        match flip::flip(cluster, ready.clone()).await {
            Ok(flip::Flipped::Done { record, map, at }) => break (record, map, at),
            Ok(flip::Flipped::Refused(refused)) => {
                // Planned from an older map: the partition's data is not
                // where the move says. Rolled back; the leader plans again.
                tracing::warn!(partition, %refused, "move rolled back");
                let ended = cluster
                    .etcd
                    .txn(protocol::end_move(
                        &cluster.keys,
                        partition,
                        progress.revision,
                    ))
                    .await?;
                return Ok(ended.revision);
            }
            Err(ClusterError::Raced { .. })
                if read_move(cluster, partition)
                    .await?
                    .0
                    .is_some_and(|(_, revision)| revision == progress.revision) => {}
            Err(error) => return Err(error),
        }
    };
    if flipped.kind == MoveKind::Replica {
        // A whole copy of what the leader holds: it follows the leader
        // from here (a write's first batch would mark it too).
        let frontier = Arc::clone(&cluster.frontier);
        let leader = flipped.from.clone();
        let marked = tokio::task::spawn_blocking(move || {
            frontier.ingest().note_followed(partition, &leader)
        })
        .await?;
        if let Err(error) = marked {
            tracing::warn!(partition, %error, "the new copy is not marked as following its leader");
        }
    }
    tracing::info!(
        partition,
        from = flipped.from,
        epoch = next_map.epoch,
        tail,
        leased = flipped.leased,
        cutover_ms = flipped.cutover_ms,
        "partition moved here"
    );
    Ok(flipped_at)
}

/// Whether this node's view makes it the leader of `partition`.
fn leads_now(cluster: &Cluster, partition: u32) -> bool {
    cluster.view().map.as_ref().is_some_and(|map| {
        map.owners.get(partition as usize).map(String::as_str) == Some(&cluster.options.node_id)
    })
}

/// Whether this node's view makes it an in-sync follower of `partition`.
fn follows_now(cluster: &Cluster, partition: u32) -> bool {
    cluster
        .view()
        .map
        .as_ref()
        .is_some_and(|map| map.follows(&cluster.options.node_id, partition))
}

/// The partition map and its revision, read from etcd.
async fn current_map(cluster: &Cluster) -> Result<(PartitionMap, i64), ClusterError> {
    let key = cluster.keys.map();
    let entry = cluster
        .etcd
        .get(&key)
        .await?
        .ok_or_else(|| ClusterError::Forming {
            cluster: cluster.options.name.clone(),
            registered: cluster.view().members.len(),
            initial: cluster.options.initial_nodes,
        })?;
    let map = serde_json::from_slice(&entry.value).map_err(|e| ClusterError::Corrupt {
        key,
        reason: e.to_string(),
    })?;
    Ok((map, entry.mod_revision))
}

async fn seal_page(
    admin: &mut AdminPeer,
    partition: u32,
    after: Option<proto::admin::PartitionKey>,
    limit: u32,
) -> Result<proto::admin::SealedPartition, ClusterError> {
    Ok(admin
        .seal_partition(proto::admin::SealPartitionRequest {
            partition,
            after,
            limit,
        })
        .await?
        .into_inner())
}

/// The owner's answer to SealPartition: only for a move etcd holds at its
/// cutover from this node. The first page (no `after`) seals and carries
/// the leases and queue settings; each page carries the tail's next URLs.
pub(super) async fn seal(
    cluster: &Cluster,
    request: proto::admin::SealPartitionRequest,
) -> Result<proto::admin::SealedPartition, ClusterError> {
    let partition = request.partition;
    // Read with the store's revision: a view read after it that lacks the
    // move unseals (the move was rolled back).
    let (found, revision) = read_move(cluster, partition).await?;
    let record = found.map(|(record, _)| record);
    if !protocol::may_seal(record.as_ref(), &cluster.options.node_id) {
        return Err(ClusterError::NotAtCutover {
            partition,
            node: cluster.options.node_id.clone(),
        });
    }
    let first = request.after.is_none();
    if first {
        // Not served from here on, before its leases are counted.
        let mut state = cluster.moves.lock().await;
        state.sealed.entry(partition).or_insert(revision);
        if let Some(served) = state.served.as_mut()
            && let Some(slot) = served.get_mut(partition as usize)
        {
            *slot = false;
            cluster
                .frontier
                .scheduler()
                .set_served_partitions(Some(served.clone()));
        }
    }
    let limit = crate::partition_page::copy_page_limit(request.limit);
    let frontier = Arc::clone(&cluster.frontier);
    let tail = tokio::task::spawn_blocking(move || {
        let tail = frontier.ingest().seal_partition(partition);
        (frontier, tail)
    })
    .await?;
    let (frontier, tail) = tail;
    // The followers hold every write to the partition before the receiver
    // hears its tail: after the flip they follow the receiver, which sends
    // them only what it writes itself.
    frontier
        .ingest()
        .replicas()
        .wait_for_followers(&std::collections::BTreeSet::new())
        .await
        .map_err(|e| ClusterError::NotReplicated(e.to_string()))?;
    let sealed = tokio::task::spawn_blocking(move || {
        let mut sealed = proto::admin::SealedPartition::default();
        if first {
            let (leased, until) = frontier
                .scheduler()
                .leases_in_partition(partition, Timestamp::now());
            sealed.leased = leased;
            sealed.leases_until_ms = until.unix_millis();
            sealed.queues = queues_with_settings(&frontier, partition)?;
        }
        let after = request.after.map(|key| (key.crawl_id, key.url));
        let page = match tail.filter(|tail| !tail.deleted) {
            Some(_) => frontier
                .ingest()
                .sealed_tail_page(partition, after.as_ref(), limit)
                .map_err(|e| ClusterError::Local(e.to_string()))?,
            None => None,
        };
        if let Some((urls, end)) = page {
            let (urls, cut) = crate::partition_page::wire_page(urls);
            sealed.tracked = true;
            sealed.end = end && !cut;
            sealed.urls = urls;
        }
        Ok::<_, ClusterError>(sealed)
    })
    .await??;
    fail::fail_point!("seal-partition-answer", |_| Err(crate::failpoint::hit(
        "seal-partition-answer"
    )
    .into()));
    Ok(sealed)
}

/// The settings of a partition's queues that have any.
fn queues_with_settings(
    frontier: &crate::service::Frontier,
    partition: u32,
) -> Result<Vec<proto::admin::MovedQueue>, ClusterError> {
    let mut queues = Vec::new();
    frontier
        .ingest()
        .store()
        .for_each_queue(|crawl, key, record| {
            let has_settings =
                record.blocked_until > 0 || record.delay_ms.is_some() || record.crawl_limit > 0;
            if has_settings && frontier.ingest().partition_of(crawl, key) == partition as usize {
                queues.push(copy::moved_queue(crawl, key, &record));
            }
        })
        .map_err(|e| ClusterError::Local(e.to_string()))?;
    Ok(queues)
}

/// Marks a node as draining: the leader moves its partitions away.
pub(super) async fn drain(cluster: &Cluster, node: &str) -> Result<u32, ClusterError> {
    let view = cluster.view();
    let known = view.members.contains_key(node)
        || view
            .map
            .as_ref()
            .is_some_and(|map| map.owners.iter().any(|o| o == node));
    if !known {
        return Err(ClusterError::UnknownNode {
            node: node.to_owned(),
            cluster: cluster.options.name.clone(),
        });
    }
    let others = view
        .members
        .keys()
        .filter(|id| *id != node && !view.draining.contains(*id))
        .count();
    if others == 0 {
        return Err(ClusterError::LastOwner {
            node: node.to_owned(),
        });
    }
    cluster
        .etcd
        .txn(Txn::writes(vec![Write::put(
            cluster.keys.draining(node),
            b"{}".to_vec(),
        )]))
        .await
        .map_err(|error| ClusterError::NotRecorded {
            what: "the drain",
            reason: error.to_string(),
        })?;
    Ok(view
        .map
        .as_ref()
        .map_or(0, |map| map.owned_by(node).count() as u32))
}

/// A node that starts owning nothing while marked as draining was drained
/// and is back (a StatefulSet scaled up again): it takes partitions again.
/// One still owning some is restarting mid-drain and stays marked.
pub(super) async fn end_finished_drain(cluster: &Cluster) {
    let view = cluster.view();
    let me = &cluster.options.node_id;
    let owns = view
        .map
        .as_ref()
        .is_some_and(|map| map.owned_by(me).next().is_some());
    if !view.draining.contains(me) || owns || view.moves.values().any(|(r, _)| &r.from == me) {
        return;
    }
    let cleared = cluster
        .etcd
        .txn(Txn::writes(vec![Write::Delete(cluster.keys.draining(me))]))
        .await;
    match cleared {
        Ok(_) => tracing::info!("this node was drained and is back: it takes partitions again"),
        Err(error) => tracing::warn!(%error, "cannot clear this node's finished drain"),
    }
}
