//! Politeness groups kept across nodes (the scheduler's turns module):
//! this node's [`TurnKeepers`], which finds a group's keeper in the map
//! (the leader of the partition the group's name falls in) and carries
//! the scheduler's messages to it in batches, one GroupTurns call per
//! keeper at a time; the renewals' clock; and the keeper's side of
//! GroupTurns.
//!
//! A call that fails loses its steps: an ask runs out and is asked again,
//! a renewal goes with the next one, a let-go ends with the hold's life,
//! a block holds the blocked queue itself anyway.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use proto::admin as adm;
use tokio::sync::mpsc;

use super::peers::forwarded;
use super::{Cluster, Owner};
use crate::scheduler::{TURN_RENEW, TurnAnswer, TurnKeepers, TurnMessage, holder_name};
use crate::time::Timestamp;

/// The keepers of groups, as this node's map gives them.
struct Keepers {
    cluster: Weak<Cluster>,
    outbox: mpsc::UnboundedSender<TurnMessage>,
}

impl TurnKeepers for Keepers {
    fn kept_elsewhere(&self, crawl: &str, group: &str) -> bool {
        let Some(cluster) = self.cluster.upgrade() else {
            return false;
        };
        // A keeper away or not known yet is elsewhere: its asks wait.
        !matches!(
            cluster.owner_of(keeping_partition(&cluster, crawl, group)),
            Ok(Owner::Local)
        )
    }

    fn send(&self, message: TurnMessage) {
        // Fails only once the task is gone, with the cluster.
        let _ = self.outbox.send(message);
    }
}

fn keeping_partition(cluster: &Cluster, crawl: &str, group: &str) -> usize {
    crate::partitioning::partition_of(crawl, group, cluster.partitions())
}

/// Makes this node's scheduler ask other nodes for the turns of groups
/// they keep; the task carries its messages and renews its turns.
pub(super) fn start(cluster: &Arc<Cluster>) -> tokio::task::JoinHandle<()> {
    let (outbox, mut messages) = mpsc::unbounded_channel();
    cluster
        .frontier
        .scheduler()
        .set_turn_keepers(Arc::new(Keepers {
            cluster: Arc::downgrade(cluster),
            outbox,
        }));
    let cluster = Arc::downgrade(cluster);
    tokio::spawn(async move {
        let mut renewals = tokio::time::interval(TURN_RENEW);
        renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                message = messages.recv() => match message {
                    Some(message) => Some(message),
                    None => return,
                },
                _ = renewals.tick() => None,
            };
            let Some(cluster) = cluster.upgrade() else {
                return;
            };
            match first {
                // Its renewals come back through the outbox.
                None => cluster.frontier.scheduler().renew_turns(),
                Some(first) => {
                    let mut batch = vec![first];
                    while let Ok(message) = messages.try_recv() {
                        batch.push(message);
                    }
                    send(&cluster, batch);
                }
            }
        }
    })
}

/// Sends each message to its group's keeper: this node's scheduler, or
/// one call per other keeper.
fn send(cluster: &Arc<Cluster>, batch: Vec<TurnMessage>) {
    let scheduler = cluster.frontier.scheduler();
    let me = cluster.node_id().to_owned();
    let mut by_keeper: BTreeMap<String, (super::map::Member, Vec<TurnMessage>)> = BTreeMap::new();
    for message in batch {
        let (crawl, group) = message.group();
        match cluster.owner_of(keeping_partition(cluster, crawl, group)) {
            Ok(Owner::Local) => {
                let answer = scheduler.keep_turn(&holder_of(&me, &message), &message);
                answered(cluster, &message, answer);
            }
            Ok(Owner::Remote(member)) => {
                by_keeper
                    .entry(member.id.clone())
                    .or_insert_with(|| (member, Vec::new()))
                    .1
                    .push(message);
            }
            Err(status) => tracing::debug!(%status, group, "no keeper for a group's turn"),
        }
    }
    for (_, (member, messages)) in by_keeper {
        let cluster = Arc::clone(cluster);
        let me = me.clone();
        tokio::spawn(async move {
            let request = adm::GroupTurnsRequest {
                node: me,
                steps: messages.iter().map(step_of).collect(),
            };
            let call = async {
                let mut admin = cluster.peers.get(&member.endpoint())?.admin();
                admin
                    .group_turns(forwarded(request, cluster.epoch()))
                    .await
                    .map(tonic::Response::into_inner)
            };
            match call.await {
                Ok(response) => {
                    for (message, answer) in messages.iter().zip(response.answers) {
                        let answer = TurnAnswer {
                            granted: answer.granted,
                            not_before: Timestamp::from_unix_millis(answer.not_before_ms),
                        };
                        answered(&cluster, message, answer);
                    }
                }
                Err(status) => {
                    tracing::debug!(%status, node = %member.id, "a group's keeper did not answer");
                }
            }
        });
    }
}

/// Hands an ask's answer to the scheduler.
fn answered(cluster: &Cluster, message: &TurnMessage, answer: TurnAnswer) {
    cluster.frontier.scheduler().ask_answered(message, answer);
}

/// The keeper's side of GroupTurns: each step through the scheduler, a
/// step it cannot read refused.
pub(super) fn keep(cluster: &Cluster, request: &adm::GroupTurnsRequest) -> adm::GroupTurnsResponse {
    let scheduler = cluster.frontier.scheduler();
    let answers = request
        .steps
        .iter()
        .map(|step| match message_of(step) {
            Some(message) => {
                let answer = scheduler.keep_turn(&holder_of(&request.node, &message), &message);
                adm::GroupTurnAnswer {
                    granted: answer.granted,
                    not_before_ms: answer.not_before.unix_millis(),
                }
            }
            None => adm::GroupTurnAnswer::default(),
        })
        .collect();
    adm::GroupTurnsResponse { answers }
}

/// The keeper's name for the hold a message is about (none for a block).
fn holder_of(node: &str, message: &TurnMessage) -> String {
    message
        .asker()
        .map(|(queue, serial)| holder_name(node, queue, serial))
        .unwrap_or_default()
}

fn step_of(message: &TurnMessage) -> adm::GroupTurnStep {
    use adm::group_turn_step::Kind;
    let (crawl, group) = message.group();
    let (queue, serial) = message.asker().unwrap_or_default();
    let mut step = adm::GroupTurnStep {
        crawl: crawl.to_owned(),
        group: group.to_owned(),
        queue: queue.to_owned(),
        serial,
        ..adm::GroupTurnStep::default()
    };
    match message {
        TurnMessage::Ask { delay, lease, .. } => {
            step.kind = Kind::Ask.into();
            step.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            step.lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        }
        TurnMessage::Renew { .. } => step.kind = Kind::Renew.into(),
        TurnMessage::LetGo { .. } => step.kind = Kind::LetGo.into(),
        TurnMessage::Block { until, .. } => {
            step.kind = Kind::Block.into();
            step.until_ms = until.unix_millis();
        }
    }
    step
}

fn message_of(step: &adm::GroupTurnStep) -> Option<TurnMessage> {
    use adm::group_turn_step::Kind;
    let crawl = step.crawl.clone();
    let group = step.group.clone();
    let queue = step.queue.clone();
    let serial = step.serial;
    Some(match Kind::try_from(step.kind).ok()? {
        Kind::Ask => TurnMessage::Ask {
            crawl,
            group,
            queue,
            serial,
            delay: std::time::Duration::from_millis(step.delay_ms),
            lease: std::time::Duration::from_millis(step.lease_ms),
        },
        Kind::Renew => TurnMessage::Renew {
            crawl,
            group,
            queue,
            serial,
        },
        Kind::LetGo => TurnMessage::LetGo {
            crawl,
            group,
            queue,
            serial,
        },
        Kind::Block => TurnMessage::Block {
            crawl,
            group,
            until: Timestamp::from_unix_millis(step.until_ms),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_crosses_the_wire_unchanged() {
        let messages = [
            TurnMessage::Ask {
                crawl: "c".into(),
                group: "ip:10.0.0.1".into(),
                queue: "a.test".into(),
                serial: 1,
                delay: std::time::Duration::from_millis(250),
                lease: std::time::Duration::from_secs(30),
            },
            TurnMessage::Renew {
                crawl: "c".into(),
                group: "ip:10.0.0.1".into(),
                queue: "a.test".into(),
                serial: 2,
            },
            TurnMessage::LetGo {
                crawl: "c".into(),
                group: "ip:10.0.0.1".into(),
                queue: "a.test:8080".into(),
                serial: u64::MAX,
            },
            TurnMessage::Block {
                crawl: "c".into(),
                group: "ip:::1".into(),
                until: Timestamp::from_unix_millis(1_700_000_000_001),
            },
        ];
        for message in messages {
            assert_eq!(message_of(&step_of(&message)), Some(message));
        }
        let unknown = adm::GroupTurnStep {
            kind: 99,
            ..adm::GroupTurnStep::default()
        };
        assert_eq!(message_of(&unknown), None);
    }
}
