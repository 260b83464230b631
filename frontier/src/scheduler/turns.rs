//! Turns of politeness groups kept by another node. Under `--politeness
//! ip` the hosts at one address may be led by different nodes of a
//! cluster (an address cannot be a partition key: a host's address
//! changes, its URLs' partition must not). Each group is kept by one
//! node, the leader of the partition its name falls in: the keeper's
//! group state is the one gate of the whole cluster, and the other nodes
//! ask it for a turn before serving a queue of the group.
//!
//! A turn, as the keeper holds it, is a hold of the group by
//! `node/queue` that lasts [`TURN_HOLD`] unless renewed: the holding node
//! renews it every [`TURN_RENEW`] while the queue's leases are out and
//! lets it go when the last is reported, from which the group's delay
//! runs, as for a queue of the keeper's own. A keeper that was not the
//! group's keeper a moment ago (a start, a partition gained) grants
//! nothing for one [`TURN_HOLD`]: by then every hold handed out by the
//! keeper before it was renewed to it or has ended.
//!
//! The asking node's side of a group is its [`Turn`]: at most one of its
//! queues asks for or holds the group at a time, the others wait behind
//! it as behind a local holder. Messages go out through [`TurnKeepers`]
//! (the cluster's peers); answers come back through
//! [`Scheduler::turn_answered`]. A turn asked for and not answered in
//! [`ASK_WAIT`], or granted and not used in [`TURN_USE`], is dropped (and
//! a granted one given back), so a lost message costs a wait, never a
//! stuck group.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::Scheduler;
use super::groups::Group;
use crate::time::Timestamp;

/// A turn's life at its keeper unless renewed: long against the renewals'
/// round trips, short as a stall after a keeper changes.
pub const TURN_HOLD: Duration = Duration::from_secs(5);

/// How often a held turn is renewed.
pub const TURN_RENEW: Duration = Duration::from_secs(1);

/// A granted turn not used in this long is given back.
pub const TURN_USE: Duration = Duration::from_secs(2);

/// An ask not answered in this long is dropped (and asked again).
pub const ASK_WAIT: Duration = Duration::from_secs(3);

/// The least wait before a refused ask is sent again.
const MIN_ASK_GAP: Duration = Duration::from_millis(50);

/// Where a group's turns are kept, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keeper {
    /// Here; asks are turned away until `quiet_until`.
    Here { quiet_until: Timestamp },
    /// On another node.
    Elsewhere,
}

/// A message to a group's keeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnMessage {
    /// Queue `queue` asks for the group, to be served a delay after its
    /// last let-go.
    Ask {
        crawl: String,
        group: String,
        queue: String,
        delay: Duration,
    },
    /// Queue `queue` still holds the group.
    Renew {
        crawl: String,
        group: String,
        queue: String,
    },
    /// Queue `queue` lets the group go (or gives back an unused turn).
    LetGo {
        crawl: String,
        group: String,
        queue: String,
    },
    /// A Retry-After on a host of the group: no queue of it until then.
    Block {
        crawl: String,
        group: String,
        until: Timestamp,
    },
}

/// The keepers of groups, as a cluster node sees them.
pub trait TurnKeepers: Send + Sync {
    /// Whether another node keeps group `group` of `crawl`.
    fn kept_elsewhere(&self, crawl: &str, group: &str) -> bool;
    /// Sends a message to the group's keeper; an Ask's answer comes back
    /// through [`Scheduler::turn_answered`].
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

/// This node's side of a group kept elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Turn {
    /// Nothing asked.
    #[default]
    Idle,
    /// `queue` asked at `since`.
    Asking { queue: String, since: Timestamp },
    /// `queue` was given the turn at `at`, not served yet.
    Granted { queue: String, at: Timestamp },
    /// `queue` holds the group with leases out.
    Holding { queue: String },
}

/// What the gate of a group kept elsewhere says to a queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RemoteGate {
    /// Serve: the queue has the turn.
    Pass,
    /// Wait until woken, or at most until then.
    Wait(Timestamp),
    /// Ask the keeper (the turn is now the queue's ask), and wait.
    Ask(Timestamp),
}

impl Turn {
    /// The gate for `queue` at `now`.
    pub(super) fn gate(&mut self, queue: &str, now: Timestamp) -> RemoteGate {
        match self {
            Self::Granted { queue: holder, .. } | Self::Holding { queue: holder }
                if holder == queue =>
            {
                RemoteGate::Pass
            }
            Self::Idle => {
                *self = Self::Asking {
                    queue: queue.to_owned(),
                    since: now,
                };
                RemoteGate::Ask(now.saturating_add(ASK_WAIT))
            }
            Self::Asking { since, .. } => RemoteGate::Wait(since.saturating_add(ASK_WAIT)),
            Self::Granted { at, .. } => RemoteGate::Wait(at.saturating_add(TURN_USE)),
            Self::Holding { .. } => RemoteGate::Wait(Timestamp::NEVER),
        }
    }

    /// `queue` was served with the turn.
    pub(super) fn served(&mut self, queue: &str) {
        *self = Self::Holding {
            queue: queue.to_owned(),
        };
    }

    /// `queue` let go of its leases: whether it held the turn (now idle).
    pub(super) fn let_go(&mut self, queue: &str) -> bool {
        let held = matches!(self, Self::Holding { queue: holder } | Self::Granted { queue: holder, .. } if holder == queue);
        if held {
            *self = Self::Idle;
        }
        held
    }

    /// The keeper answered `queue`'s ask: whether it was the ask pending.
    pub(super) fn answered(&mut self, queue: &str, granted: bool, now: Timestamp) -> bool {
        if !matches!(self, Self::Asking { queue: asker, .. } if asker == queue) {
            return false;
        }
        *self = if granted {
            Self::Granted {
                queue: queue.to_owned(),
                at: now,
            }
        } else {
            Self::Idle
        };
        true
    }

    /// Drops an ask or a grant that ran out at `now`: the queue it named,
    /// and whether a grant must be given back.
    pub(super) fn run_out(&mut self, now: Timestamp) -> Option<(String, bool)> {
        let (queue, give_back) = match self {
            Self::Asking { queue, since } if now >= since.saturating_add(ASK_WAIT) => {
                (queue.clone(), false)
            }
            Self::Granted { queue, at } if now >= at.saturating_add(TURN_USE) => {
                (queue.clone(), true)
            }
            _ => return None,
        };
        *self = Self::Idle;
        Some((queue, give_back))
    }
}

/// The holder name a keeper gives a queue of node `node`: apart from its
/// own queues' keys, which hold no `/`.
#[must_use]
pub fn holder_name(node: &str, queue: &str) -> String {
    format!("{node}/{queue}")
}

impl Scheduler {
    /// Sets who keeps groups: a cluster node's peers. Without it every
    /// group is kept here.
    pub fn set_turn_keepers(&self, keepers: Arc<dyn TurnKeepers>) {
        let _ = self.turn_keepers.set(keepers);
    }

    /// Where `group`'s turns are kept. Only address groups span
    /// partitions: a domain's are one partition's, kept by its node.
    pub(super) fn keeper(&self, crawl: &str, group: &Group) -> Keeper {
        let here = Keeper::Here {
            quiet_until: Timestamp::EPOCH,
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
            quiet_until: self.served_since(partition).saturating_add(TURN_HOLD),
        }
    }

    /// The gate of `queue`'s group at `now` (`state` locked): `None` to
    /// serve, else until when at most the queue waits. A queue of a group
    /// kept elsewhere asks for its turn; one kept here is gated here, past
    /// its keeper's quiet.
    pub(super) fn group_gate(
        &self,
        queue: &super::queue::Queue,
        group: &Group,
        state: &mut super::groups::GroupState,
        delay: Duration,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let turned_away = match self.keeper(&queue.crawl, group) {
            Keeper::Here { quiet_until } => match state.gate(&queue.key, delay, now) {
                Some(at) => Some(at.max(quiet_until)),
                None => (now < quiet_until).then_some(quiet_until),
            },
            Keeper::Elsewhere => match state.turn.gate(&queue.key, now) {
                RemoteGate::Pass => None,
                RemoteGate::Wait(at) => Some(at),
                RemoteGate::Ask(at) => {
                    self.send_turn(TurnMessage::Ask {
                        crawl: queue.crawl.clone(),
                        group: group.name.clone(),
                        queue: queue.key.clone(),
                        delay: delay.saturating_add(state.extra),
                    });
                    Some(at)
                }
            },
        };
        if turned_away.is_some() {
            state.wait(&queue.key);
        }
        turned_away
    }

    /// `queue` was served at `now` through its group's gate, held until
    /// `until` if `held`.
    pub(super) fn group_served(
        &self,
        queue: &super::queue::Queue,
        group: &Group,
        state: &mut super::groups::GroupState,
        held: bool,
        until: Timestamp,
        now: Timestamp,
    ) {
        match self.keeper(&queue.crawl, group) {
            Keeper::Here { .. } => state.served(&queue.key, held, until, now),
            Keeper::Elsewhere => state.turn.served(&queue.key),
        }
    }

    /// `queue` let its group go at `at` (its last lease ended): the queues
    /// waiting, to wake. A turn held of a group kept elsewhere goes back.
    pub(super) fn group_let_go(
        &self,
        queue: &super::queue::Queue,
        group: &Group,
        at: Timestamp,
    ) -> Vec<String> {
        let mut state = group.lock();
        let waiting = state.let_go(&queue.key, at);
        if state.turn.let_go(&queue.key) {
            self.send_turn(TurnMessage::LetGo {
                crawl: queue.crawl.clone(),
                group: group.name.clone(),
                queue: queue.key.clone(),
            });
        }
        waiting
    }

    pub(super) fn send_turn(&self, message: TurnMessage) {
        if let Some(keepers) = self.turn_keepers.get() {
            keepers.send(message);
        }
    }

    /// The keeper answered queue `queue`'s ask for `group`: granted, it is
    /// looked at again at once; refused, at `not_before`, and so are the
    /// queues waiting behind it.
    pub fn turn_answered(&self, crawl: &str, group: &str, queue: &str, answer: TurnAnswer) {
        let now = (self.clock)();
        let Some(group) = self.existing_group(crawl, group) else {
            return;
        };
        let waiting = {
            let mut state = group.lock();
            if !state.turn.answered(queue, answer.granted, now) {
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

    /// Renews the turns held here and drops the asks and grants that ran
    /// out (giving the grants back); called every [`TURN_RENEW`].
    pub fn renew_turns(&self) {
        let now = (self.clock)();
        let groups: Vec<((String, String), Arc<Group>)> = self
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(key, group)| (key.clone(), Arc::clone(group)))
            .collect();
        for ((crawl, name), group) in groups {
            let (holding, ran_out, waiting) = {
                let mut state = group.lock();
                let holding = match &state.turn {
                    super::turns::Turn::Holding { queue } => Some(queue.clone()),
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
            if let Some(queue) = holding {
                // A hold whose leases all ran out unreported is let go.
                let leased = self
                    .queue(&crawl, &queue)
                    .is_some_and(|q| q.lock().leased.values().any(|lease| lease.until > now));
                let message = if leased {
                    TurnMessage::Renew {
                        crawl: crawl.clone(),
                        group: name.clone(),
                        queue,
                    }
                } else {
                    if !group.lock().turn.let_go(&queue) {
                        continue;
                    }
                    TurnMessage::LetGo {
                        crawl: crawl.clone(),
                        group: name.clone(),
                        queue,
                    }
                };
                self.send_turn(message);
            }
            if let Some((queue, give_back)) = ran_out {
                if give_back {
                    self.send_turn(TurnMessage::LetGo {
                        crawl: crawl.clone(),
                        group: name.clone(),
                        queue: queue.clone(),
                    });
                }
                for key in std::iter::once(queue).chain(waiting) {
                    self.wake_at_gate(&crawl, &key, Timestamp::EPOCH);
                }
            }
        }
    }

    /// A keeper's side: `holder` (a queue of another node,
    /// [`holder_name`]) sends `message`. Asks are refused while this
    /// node's keeping is quiet (it became the group's keeper lately), and
    /// every step of a group this node does not keep (the two nodes'
    /// maps differ for a moment: the asker asks again).
    pub fn keep_turn(&self, holder: &str, message: &TurnMessage) -> TurnAnswer {
        let now = (self.clock)();
        let (crawl, group) = match message {
            TurnMessage::Ask { crawl, group, .. }
            | TurnMessage::Renew { crawl, group, .. }
            | TurnMessage::LetGo { crawl, group, .. }
            | TurnMessage::Block { crawl, group, .. } => (crawl, group),
        };
        let group = self.group_named(crawl, group.clone());
        let quiet_until = match self.keeper(crawl, &group) {
            Keeper::Here { quiet_until } => quiet_until,
            Keeper::Elsewhere => {
                return TurnAnswer {
                    granted: false,
                    not_before: now.saturating_add(MIN_ASK_GAP),
                };
            }
        };
        let mut answer = TurnAnswer {
            granted: false,
            not_before: Timestamp::EPOCH,
        };
        let waiting = {
            let mut state = group.lock();
            match message {
                TurnMessage::Ask { delay, .. } => {
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
                            state.served(holder, true, now.saturating_add(TURN_HOLD), now);
                            answer.granted = true;
                        }
                    }
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

    fn wake_at_gate(&self, crawl: &str, key: &str, at: Timestamp) {
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
    fn one_queue_asks_and_holds_while_the_others_wait() {
        let mut turn = Turn::default();
        assert_eq!(turn.gate("a", at(1_000)), RemoteGate::Ask(at(4_000)));
        assert_eq!(turn.gate("a", at(1_500)), RemoteGate::Wait(at(4_000)));
        assert_eq!(turn.gate("b", at(1_500)), RemoteGate::Wait(at(4_000)));
        assert!(!turn.answered("b", true, at(1_600)), "not b's ask");
        assert!(turn.answered("a", true, at(1_600)));
        assert_eq!(turn.gate("b", at(1_700)), RemoteGate::Wait(at(3_600)));
        assert_eq!(turn.gate("a", at(1_700)), RemoteGate::Pass);
        turn.served("a");
        assert_eq!(
            turn.gate("b", at(9_000)),
            RemoteGate::Wait(Timestamp::NEVER)
        );
        assert_eq!(turn.run_out(at(99_000)), None, "a hold never runs out");
        assert!(!turn.let_go("b"));
        assert!(turn.let_go("a"));
        assert_eq!(turn, Turn::Idle);
    }

    #[test]
    fn a_lost_answer_or_an_unused_grant_runs_out() {
        let mut turn = Turn::default();
        let _ = turn.gate("a", at(1_000));
        assert_eq!(turn.run_out(at(3_999)), None);
        assert_eq!(turn.run_out(at(4_000)), Some(("a".into(), false)));
        let _ = turn.gate("a", at(5_000));
        assert!(turn.answered("a", true, at(5_100)));
        assert_eq!(
            turn.run_out(at(7_100)),
            Some(("a".into(), true)),
            "given back"
        );
        assert_eq!(turn, Turn::Idle);
        let _ = turn.gate("a", at(8_000));
        assert!(turn.answered("a", false, at(8_100)));
        assert_eq!(turn, Turn::Idle, "refused: asked again later");
    }
}
