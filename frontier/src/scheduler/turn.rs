//! This node's side of a politeness group another node keeps (the turns
//! module): which of its queues asks for or holds the group, under which
//! ask, as a state machine without I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::time::Timestamp;

/// A granted turn not used in this long is given back.
pub const TURN_USE: Duration = Duration::from_secs(2);

/// An ask not answered in this long is dropped (and asked again).
pub const ASK_WAIT: Duration = Duration::from_secs(3);

/// This node's side of a group kept elsewhere: which of its queues asks
/// for or holds the group, under which ask.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Nothing asked.
    #[default]
    Idle,
    /// `queue` asked at `since`.
    Asking {
        queue: String,
        serial: u64,
        since: Timestamp,
    },
    /// `queue` was given the turn at `at`, not served yet.
    Granted {
        queue: String,
        serial: u64,
        at: Timestamp,
    },
    /// `queue` holds the group with leases out.
    Holding { queue: String, serial: u64 },
}

/// What the gate of a group kept elsewhere says to a queue.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RemoteGate {
    /// Serve: the queue has the turn.
    Pass,
    /// Wait until woken, or at most until then.
    Wait(Timestamp),
    /// Send ask `serial` to the keeper, and wait.
    Ask(Timestamp, u64),
}

impl Turn {
    /// The gate for `queue` at `now`; a new ask takes the next of
    /// `serials`.
    pub(super) fn gate(&mut self, queue: &str, now: Timestamp, serials: &AtomicU64) -> RemoteGate {
        match self {
            Self::Granted { queue: holder, .. } | Self::Holding { queue: holder, .. }
                if holder == queue =>
            {
                RemoteGate::Pass
            }
            Self::Idle => {
                let serial = serials.fetch_add(1, Ordering::Relaxed);
                *self = Self::Asking {
                    queue: queue.to_owned(),
                    serial,
                    since: now,
                };
                RemoteGate::Ask(now.saturating_add(ASK_WAIT), serial)
            }
            Self::Asking { since, .. } => RemoteGate::Wait(since.saturating_add(ASK_WAIT)),
            Self::Granted { at, .. } => RemoteGate::Wait(at.saturating_add(TURN_USE)),
            Self::Holding { .. } => RemoteGate::Wait(Timestamp::NEVER),
        }
    }

    /// `queue` was served with its granted turn.
    pub(super) fn served(&mut self, queue: &str) {
        if let Self::Granted {
            queue: holder,
            serial,
            ..
        } = self
            && holder == queue
        {
            *self = Self::Holding {
                queue: queue.to_owned(),
                serial: *serial,
            };
        }
    }

    /// `queue` let go of its leases: the ask whose turn it held, if it
    /// held one (the turn is idle now).
    pub(super) fn let_go(&mut self, queue: &str) -> Option<u64> {
        let serial = match self {
            Self::Holding {
                queue: holder,
                serial,
            }
            | Self::Granted {
                queue: holder,
                serial,
                ..
            } if holder == queue => *serial,
            _ => return None,
        };
        *self = Self::Idle;
        Some(serial)
    }

    /// The keeper answered ask `serial`: whether it is the ask pending.
    pub(super) fn answered(&mut self, serial: u64, granted: bool, now: Timestamp) -> bool {
        let Self::Asking {
            queue,
            serial: asked,
            ..
        } = self
        else {
            return false;
        };
        if *asked != serial {
            return false;
        }
        *self = if granted {
            Self::Granted {
                queue: std::mem::take(queue),
                serial,
                at: now,
            }
        } else {
            Self::Idle
        };
        true
    }

    /// Drops an ask or a grant that ran out at `now`: the queue it named,
    /// and the serial to give back (an ask's answer may have been a grant
    /// that was lost).
    pub(super) fn run_out(&mut self, now: Timestamp) -> Option<(String, u64)> {
        let ran_out = match self {
            Self::Asking {
                queue,
                serial,
                since,
            } if now >= since.saturating_add(ASK_WAIT) => (std::mem::take(queue), *serial),
            Self::Granted { queue, serial, at } if now >= at.saturating_add(TURN_USE) => {
                (std::mem::take(queue), *serial)
            }
            _ => return None,
        };
        *self = Self::Idle;
        Some(ran_out)
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
        let asks = AtomicU64::new(1);
        assert_eq!(
            turn.gate("a", at(1_000), &asks),
            RemoteGate::Ask(at(4_000), 1)
        );
        assert_eq!(
            turn.gate("a", at(1_500), &asks),
            RemoteGate::Wait(at(4_000))
        );
        assert_eq!(
            turn.gate("b", at(1_500), &asks),
            RemoteGate::Wait(at(4_000))
        );
        assert!(!turn.answered(7, true, at(1_600)), "not the ask pending");
        assert!(turn.answered(1, true, at(1_600)));
        assert_eq!(
            turn.gate("b", at(1_700), &asks),
            RemoteGate::Wait(at(3_600))
        );
        assert_eq!(turn.gate("a", at(1_700), &asks), RemoteGate::Pass);
        turn.served("a");
        assert_eq!(
            turn.gate("b", at(9_000), &asks),
            RemoteGate::Wait(Timestamp::NEVER)
        );
        assert_eq!(turn.run_out(at(99_000)), None, "a hold never runs out");
        assert_eq!(turn.let_go("b"), None);
        assert_eq!(turn.let_go("a"), Some(1));
        assert_eq!(turn, Turn::Idle);
        assert_eq!(
            turn.gate("b", at(9_000), &asks),
            RemoteGate::Ask(at(12_000), 2)
        );
    }

    #[test]
    fn a_lost_answer_or_an_unused_grant_runs_out() {
        let mut turn = Turn::default();
        let asks = AtomicU64::new(1);
        let _ = turn.gate("a", at(1_000), &asks);
        assert_eq!(turn.run_out(at(3_999)), None);
        assert_eq!(
            turn.run_out(at(4_000)),
            Some(("a".into(), 1)),
            "given back: a grant may have been lost"
        );
        let _ = turn.gate("a", at(5_000), &asks);
        assert!(
            !turn.answered(1, true, at(5_100)),
            "the first ask's answer came late"
        );
        assert!(turn.answered(2, true, at(5_100)));
        assert_eq!(turn.run_out(at(7_100)), Some(("a".into(), 2)), "given back");
        assert_eq!(turn, Turn::Idle);
        let _ = turn.gate("a", at(8_000), &asks);
        assert!(turn.answered(3, false, at(8_100)));
        assert_eq!(turn, Turn::Idle, "refused: asked again later");
    }
}
