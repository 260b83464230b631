//! Warnings that repeat for every call while a condition lasts (a full
//! disk fails every write) are logged at most once per interval, with the
//! count of those left out since.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of repeated warning.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// At most one log line per `interval`.
    #[must_use]
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when this occurrence should be logged, `n` being how many
    /// were left out since the last one logged; `None` when it is left out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match state.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                state.suppressed += 1;
                None
            }
            _ => {
                state.last = Some(now);
                Some(std::mem::take(&mut state.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let throttle = Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(throttle.admit_at(start), Some(0));
        assert_eq!(throttle.admit_at(start + Duration::from_secs(1)), None);
        assert_eq!(throttle.admit_at(start + Duration::from_secs(9)), None);
        assert_eq!(throttle.admit_at(start + Duration::from_secs(10)), Some(2));
        assert_eq!(throttle.admit_at(start + Duration::from_secs(11)), None);
    }
}
