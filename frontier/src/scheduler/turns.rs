//! Turns of politeness groups kept by another node. Under `--politeness
//! ip` the hosts at one address may be led by different nodes of a
//! cluster (an address cannot be a partition key: a host's address
//! changes, its URLs' partition must not). Each group is kept by one
//! node, the leader of the partition its name falls in: the keeper's
//! group state is the one gate of the whole cluster, and the other nodes
//! ask it for a turn before serving a queue of the group.
//!
//! A turn, as the keeper holds it, is a hold of the group by one ask of
//! one queue of one node ([`holder_name`]: the ask's serial number keeps
//! a late let-go of an earlier turn from ending a later one). It holds
//! as long as the leases the queue's serve may hand out, unless let go,
//! as a held lease holds a queue: a node that stops while its workers
//! fetch on keeps the group held for them. The holding node renews it
//! every [`TURN_RENEW`] while the queue's leases are out, [`TURN_HOLD`]
//! ahead at least, and lets it go when the last is reported, from which
//! the group's delay runs, as for a queue of the keeper's own. A keeper
//! that was not the group's keeper a moment ago (a start, a partition
//! gained) grants nothing for one [`TURN_HOLD`], or the group's delay if
//! longer: by then every hold handed out by the keeper before it was
//! renewed to it or has ended. After a start it also waits out the
//! leases of the process before it, whose own queues' holds it forgot.
//! A node that no longer keeps a group forgets the other nodes' holds
//! (they renew to the new keeper) and hands its own queue's hold to the
//! new keeper as a turn.
//!
//! The asking node's side of a group is its [`Turn`]: at most one of its
//! queues asks for or holds the group at a time, the others wait behind
//! it as behind a local holder. Messages go out through [`TurnKeepers`]
//! (the cluster's peers); answers come back through
//! [`Scheduler::ask_answered`]. A turn asked for and not answered in
//! [`ASK_WAIT`], or granted and not used in [`TURN_USE`], is dropped and
//! given back (the answer to an ask may have been a lost grant), so a
//! lost message costs a wait, never a stuck group.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::Scheduler;
use super::groups::{Group, GroupState};
use super::queue::Queue;
pub use super::turn::{ASK_WAIT, TURN_USE};
use super::turn::{RemoteGate, Turn};
use crate::time::Timestamp;

/// How far ahead a renewal holds a turn, and a new keeper's quiet: long
/// against the renewals' round trips, short as a stall after a keeper
/// changes.
pub const TURN_HOLD: Duration = Duration::from_secs(5);

/// How often a held turn is renewed.
pub const TURN_RENEW: Duration = Duration::from_secs(1);

/// The least wait before a refused ask is sent again.
const MIN_ASK_GAP: Duration = Duration::from_millis(50);

/// Where a group's turns are kept, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keeper {
    /// Here, since `since`: nothing is granted before its quiet after
    /// then has passed ([`Scheduler::quiet_end`]).
    Here { since: Timestamp },
    /// On another node.
    Elsewhere,
}

/// A message to a group's keeper. `serial` numbers the asking node's
/// asks for the group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TurnMessage {
    /// Queue `queue` asks for the group, to be served a delay after its
    /// last let-go, with leases of `lease`.
    Ask {
        crawl: String,
        group: String,
        queue: String,
        serial: u64,
        delay: Duration,
        lease: Duration,
    },
    /// Queue `queue` still holds the turn its ask `serial` was given.
    Renew {
        crawl: String,
        group: String,
        queue: String,
        serial: u64,
    },
    /// Queue `queue` lets go of that turn (or gives it back unused).
    LetGo {
        crawl: String,
        group: String,
        queue: String,
        serial: u64,
    },
    /// A Retry-After on a host of the group: no queue of it until then.
    Block {
        crawl: String,
        group: String,
        until: Timestamp,
    },
}

impl TurnMessage {
    /// The crawl and group it is about.
    #[must_use]
    pub fn group(&self) -> (&str, &str) {
        match self {
            Self::Ask { crawl, group, .. }
            | Self::Renew { crawl, group, .. }
            | Self::LetGo { crawl, group, .. }
            | Self::Block { crawl, group, .. } => (crawl, group),
        }
    }

    /// The asking queue and ask: `None` for a block.
    #[must_use]
    pub fn asker(&self) -> Option<(&str, u64)> {
        match self {
            Self::Ask { queue, serial, .. }
            | Self::Renew { queue, serial, .. }
            | Self::LetGo { queue, serial, .. } => Some((queue, *serial)),
            Self::Block { .. } => None,
        }
    }
}

/// The keepers of groups, as a cluster node sees them.
pub trait TurnKeepers: Send + Sync {
    /// Whether another node keeps group `group` of `crawl`.
    fn kept_elsewhere(&self, crawl: &str, group: &str) -> bool;
    /// Sends a message to the group's keeper; an Ask's answer comes back
    /// through [`Scheduler::ask_answered`].
    fn send(&self, message: TurnMessage);
}

/// A keeper's answer to an Ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnAnswer {
    /// Whether the turn is given.
    pub granted: bool,
    /// If not, the earliest it is worth asking again.
    pub not_before: Timestamp,
}

/// How long a turn granted at `now` for leases of `lease` holds unless
/// let go: as long as the leases its serve may hand out, so that a node
/// that stops (its workers fetching on) holds the group as a lease holds
/// a queue. The answer may take up to an ask's wait to arrive, and the
/// serve a grant's use.
fn hold_end(now: Timestamp, lease: Duration) -> Timestamp {
    now.saturating_add(ASK_WAIT + TURN_USE + lease.max(TURN_HOLD))
}

/// The holder name a keeper gives ask `serial` of queue `queue` of node
/// `node`: apart from its own queues' keys, which hold no `/`.
#[must_use]
pub fn holder_name(node: &str, queue: &str, serial: u64) -> String {
    format!("{node}/{serial}/{queue}")
}

impl Scheduler {
    /// Sets who keeps groups: a cluster node's peers. Without it every
    /// group is kept here.
    pub fn set_turn_keepers(&self, keepers: Arc<dyn TurnKeepers>) {
        let _ = self.turn_keepers.set(keepers);
    }

    /// When a keeper since `since` may first grant a group with `delay`:
    /// once every hold the keeper before it gave out was renewed to it or
    /// has ended, and, after a start, once the leases of the process
    /// before it (its own queues' holds, forgotten) have run out.
    fn quiet_end(&self, since: Timestamp, delay: Duration) -> Timestamp {
        if since == Timestamp::EPOCH {
            return since;
        }
        since
            .saturating_add(TURN_HOLD.max(delay))
            .max(self.held_until.saturating_add(delay))
    }

    /// Where `group`'s turns are kept. Only address groups span
    /// partitions: a domain's are one partition's, kept by its node.
    pub(super) fn keeper(&self, crawl: &str, group: &Group) -> Keeper {
        let here = Keeper::Here {
            since: Timestamp::EPOCH,
        };
        let Some(keepers) = self.turn_keepers.get() else {
            return here;
        };
        if self.politeness != super::Politeness::Ip {
            return here;
        }
        if keepers.kept_elsewhere(crawl, &group.name) {
            return Keeper::Elsewhere;
        }
        let partitions = self.partitions_served();
        if partitions == 0 {
            return here;
        }
        let partition = crate::partitioning::partition_of(crawl, &group.name, partitions);
        Keeper::Here {
            since: self.served_since(partition),
        }
    }

    /// The gate of `queue`'s group at `now` (`state` locked): where the
    /// group's turns are kept, to serve by ([`Self::group_served`]), else
    /// until when at most the queue waits. A queue of a group
    /// kept elsewhere asks for its turn; one kept here is gated here, past
    /// its keeper's quiet.
    pub(super) fn group_gate(
        &self,
        queue: &Queue,
        group: &Group,
        state: &mut GroupState,
        delay: Duration,
        lease: Duration,
        now: Timestamp,
    ) -> Result<Keeper, Timestamp> {
        let keeper = self.keeper(&queue.crawl, group);
        let turned_away = match keeper {
            Keeper::Here { since } => match state.gate(&queue.key, delay, now) {
                Some(at) => Some(at.max(self.quiet_end(since, delay))),
                None => {
                    let quiet_until = self.quiet_end(since, delay);
                    (now < quiet_until).then_some(quiet_until)
                }
            },
            Keeper::Elsewhere => match self.hand_over_local_holds(state, now).turn.gate(
                &queue.key,
                now,
                &self.turn_serials,
            ) {
                RemoteGate::Pass => None,
                RemoteGate::Wait(at) => Some(at),
                RemoteGate::Ask(at, serial) => {
                    self.send_turn(TurnMessage::Ask {
                        crawl: queue.crawl.clone(),
                        group: group.name.clone(),
                        queue: queue.key.clone(),
                        serial,
                        delay: delay.saturating_add(state.extra),
                        lease,
                    });
                    Some(at)
                }
            },
        };
        match turned_away {
            Some(at) => {
                state.wait(&queue.key);
                Err(at)
            }
            None => Ok(keeper),
        }
    }

    /// `queue` was served at `now` through its group's gate, held until
    /// `until` if `held`.
    pub(super) fn group_served(
        queue: &Queue,
        state: &mut GroupState,
        keeper: Keeper,
        held: bool,
        until: Timestamp,
        now: Timestamp,
    ) {
        match keeper {
            Keeper::Here { .. } => state.served(&queue.key, held, until, now),
            Keeper::Elsewhere => state.turn.served(&queue.key),
        }
    }

    /// `queue` let its group go at `at` (its last lease ended): the queues
    /// waiting, to wake. A turn of a group kept elsewhere goes back.
    pub(super) fn group_let_go(&self, queue: &Queue, group: &Group, at: Timestamp) -> Vec<String> {
        let mut state = group.lock();
        let waiting = state.let_go(&queue.key, at);
        self.give_turn_back(&queue.crawl, group, &mut state, &queue.key);
        waiting
    }

    /// Gives back the turn `queue_key` holds of `group`, if any.
    pub(super) fn give_turn_back(
        &self,
        crawl: &str,
        group: &Group,
        state: &mut GroupState,
        queue_key: &str,
    ) {
        if let Some(serial) = state.turn.let_go(queue_key) {
            self.send_turn(TurnMessage::LetGo {
                crawl: crawl.to_owned(),
                group: group.name.clone(),
                queue: queue_key.to_owned(),
                serial,
            });
        }
    }

    /// `queue`, held until `until`, joins `group` (its host was found at
    /// another address): it holds the group too, as its fetches go on
    /// there. A keeper elsewhere takes the renewal of a hold it has not
    /// heard of as a hold, when no one holds the group.
    pub(super) fn carry_hold(&self, queue: &Queue, group: &Group, until: Timestamp) {
        let now = (self.clock)();
        let mut state = group.lock();
        match self.keeper(&queue.crawl, group) {
            Keeper::Here { .. } => state.served(&queue.key, true, until, now),
            Keeper::Elsewhere => {
                if state.turn == Turn::Idle {
                    let serial = self.adopt_hold(&mut state, &queue.key);
                    self.send_turn(TurnMessage::Renew {
                        crawl: queue.crawl.clone(),
                        group: group.name.clone(),
                        queue: queue.key.clone(),
                        serial,
                    });
                }
            }
        }
    }

    /// The group is kept elsewhere now: holds of other nodes' queues
    /// renew there, and a hold of one of this node's queues becomes this
    /// node's turn (renewed there) before any of its queues asks.
    fn hand_over_local_holds<'a>(
        &self,
        state: &'a mut GroupState,
        now: Timestamp,
    ) -> &'a mut GroupState {
        state.forget_remote_holders();
        if state.turn == Turn::Idle
            && let Some(holder) = state.take_local_holder(now)
        {
            self.adopt_hold(state, &holder);
        }
        state
    }

    /// Passes a block of `group` until `end` to its keeper, if elsewhere.
    pub(super) fn block_at_keeper(&self, crawl: &str, group: &Group, end: Timestamp) {
        if self.keeper(crawl, group) == Keeper::Elsewhere {
            self.send_turn(TurnMessage::Block {
                crawl: crawl.to_owned(),
                group: group.name.clone(),
                until: end,
            });
        }
    }

    /// Makes `queue_key` the holder of the group's turn under a new ask.
    fn adopt_hold(&self, state: &mut GroupState, queue_key: &str) -> u64 {
        let serial = self.turn_serials.fetch_add(1, Ordering::Relaxed);
        state.turn = Turn::Holding {
            queue: queue_key.to_owned(),
            serial,
        };
        serial
    }

    pub(super) fn send_turn(&self, message: TurnMessage) {
        if let Some(keepers) = self.turn_keepers.get() {
            keepers.send(message);
        }
    }

    /// The keeper answered `message`, if an ask (else nothing to do).
    pub fn ask_answered(&self, message: &TurnMessage, answer: TurnAnswer) {
        if let TurnMessage::Ask {
            crawl,
            group,
            queue,
            serial,
            ..
        } = message
        {
            self.turn_answered(crawl, group, queue, *serial, answer);
        }
    }

    /// The keeper answered ask `serial` of queue `queue` for `group`:
    /// granted, the queue is looked at again at once; refused, at
    /// `not_before`, and so are the queues waiting behind it.
    fn turn_answered(
        &self,
        crawl: &str,
        group: &str,
        queue: &str,
        serial: u64,
        answer: TurnAnswer,
    ) {
        let now = (self.clock)();
        let Some(group) = self.existing_group(crawl, group) else {
            return;
        };
        let waiting = {
            let mut state = group.lock();
            if !state.turn.answered(serial, answer.granted, now) {
                if answer.granted {
                    // A grant come too late: given back at once.
                    self.send_turn(TurnMessage::LetGo {
                        crawl: crawl.to_owned(),
                        group: group.name.clone(),
                        queue: queue.to_owned(),
                        serial,
                    });
                }
                return;
            }
            if answer.granted {
                Vec::new()
            } else {
                state.take_waiting()
            }
        };
        let at = if answer.granted {
            Timestamp::EPOCH
        } else {
            answer.not_before
        };
        for key in std::iter::once(queue.to_owned()).chain(waiting) {
            self.wake_at_gate(crawl, &key, at);
        }
    }

    /// Renews the turns held here, hands holds of groups now kept
    /// elsewhere to their keepers, and drops the asks and grants that ran
    /// out (giving the grants back); called every [`TURN_RENEW`].
    pub fn renew_turns(&self) {
        let now = (self.clock)();
        let mut groups: Vec<((String, String), Arc<Group>)> = self
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(key, group)| (key.clone(), Arc::clone(group)))
            .collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for ((crawl, name), group) in groups {
            let elsewhere = self.keeper(&crawl, &group) == Keeper::Elsewhere;
            let (holding, ran_out, waiting) = {
                let mut state = group.lock();
                if elsewhere {
                    self.hand_over_local_holds(&mut state, now);
                }
                let holding = match &state.turn {
                    Turn::Holding { queue, serial } => Some((queue.clone(), *serial)),
                    _ => None,
                };
                let ran_out = state.turn.run_out(now);
                let waiting = if ran_out.is_some() {
                    state.take_waiting()
                } else {
                    Vec::new()
                };
                (holding, ran_out, waiting)
            };
            if let Some((queue, serial)) = holding {
                // A hold whose leases all ran out unreported is let go.
                let leased = self
                    .queue(&crawl, &queue)
                    .is_some_and(|q| q.lock().leased.values().any(|lease| lease.until > now));
                if leased {
                    self.send_turn(TurnMessage::Renew {
                        crawl: crawl.clone(),
                        group: name.clone(),
                        queue,
                        serial,
                    });
                } else {
                    self.give_turn_back(&crawl, &group, &mut group.lock(), &queue);
                }
            }
            if let Some((queue, serial)) = ran_out {
                self.send_turn(TurnMessage::LetGo {
                    crawl: crawl.clone(),
                    group: name.clone(),
                    queue: queue.clone(),
                    serial,
                });
                for key in std::iter::once(queue).chain(waiting) {
                    self.wake_at_gate(&crawl, &key, Timestamp::EPOCH);
                }
            }
        }
    }

    /// A keeper's side: `holder` (an ask of a queue of another node,
    /// [`holder_name`]; none for a block) sends `message`. Asks are
    /// refused while this node's keeping is quiet (it became the group's
    /// keeper lately), and every step of a group this node does not keep
    /// (the two nodes' maps differ for a moment: the asker asks again).
    pub fn keep_turn(&self, holder: &str, message: &TurnMessage) -> TurnAnswer {
        let now = (self.clock)();
        let (crawl, name) = message.group();
        let group = self.group_named(crawl, name.to_owned());
        let mut answer = TurnAnswer {
            granted: false,
            not_before: now.saturating_add(MIN_ASK_GAP),
        };
        let Keeper::Here { since } = self.keeper(crawl, &group) else {
            return answer;
        };
        let waiting = {
            let mut state = group.lock();
            match message {
                TurnMessage::Ask { delay, lease, .. } => {
                    let quiet_until = self.quiet_end(since, *delay);
                    // Held by another: free a delay after its let-go at the
                    // soonest, so asking again then loses no time.
                    let gated = state
                        .gate(holder, *delay, now)
                        .map(|at| at.min(now.saturating_add((*delay).max(MIN_ASK_GAP))));
                    let not_before = match gated {
                        Some(at) => Some(at.max(quiet_until)),
                        None => (now < quiet_until).then_some(quiet_until),
                    };
                    match not_before {
                        Some(at) => answer.not_before = at,
                        None => {
                            state.served(holder, true, hold_end(now, *lease), now);
                            answer.granted = true;
                        }
                    }
                    let counted = if answer.granted { "granted" } else { "refused" };
                    metrics::counter!("frontier_group_turns_total", "answer" => counted)
                        .increment(1);
                    Vec::new()
                }
                TurnMessage::Renew { .. } => {
                    state.renew(holder, now.saturating_add(TURN_HOLD));
                    Vec::new()
                }
                TurnMessage::LetGo { .. } => state.let_go(holder, now),
                TurnMessage::Block { until, .. } => {
                    state.block(*until);
                    Vec::new()
                }
            }
        };
        self.wake_turned_away(crawl, &waiting);
        answer
    }

    fn existing_group(&self, crawl: &str, name: &str) -> Option<Arc<Group>> {
        self.groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(crawl.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Looks again at queue `key` at `at`, its group's gate lifted then.
    pub(super) fn wake_at_gate(&self, crawl: &str, key: &str, at: Timestamp) {
        if let Some(queue) = self.queue(crawl, key) {
            let mut state = queue.lock();
            state.group_gate = at;
            self.wake(&queue, &mut state, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    #[test]
    fn a_keepers_hold_is_one_ask_so_a_late_let_go_ends_nothing_later() {
        let mut group = GroupState::default();
        let first = holder_name("n2", "a.test", 1);
        let second = holder_name("n2", "a.test", 2);
        group.served(&first, true, at(6_000), at(1_000));
        assert!(
            group
                .gate(&second, Duration::from_secs(1), at(1_500))
                .is_some()
        );
        group.let_go(&first, at(2_000));
        group.served(&second, true, at(8_000), at(3_000));
        // The first turn's let-go, sent again or late, leaves the second.
        group.let_go(&first, at(3_100));
        assert!(
            group
                .gate("b.test", Duration::from_secs(1), at(3_200))
                .is_some()
        );
        group.renew(&second, at(9_000));
        assert_eq!(
            group.gate("b.test", Duration::ZERO, at(8_500)),
            Some(at(9_000)),
            "renewed"
        );
        // A renewal that was on its way when the turn was let go.
        group.let_go(&second, at(8_600));
        group.renew(&second, at(13_000));
        assert_eq!(group.gate("b.test", Duration::ZERO, at(8_700)), None);
    }
}
