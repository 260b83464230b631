//! Backing off a host whose answers slow down.
//!
//! A server that takes much longer than usual to answer is often one
//! under load, and a polite crawler gives it room (Heritrix waits a
//! multiple of the last fetch's duration; Nutch and StormCrawler a
//! configured delay). Here each queue keeps a moving average of how long
//! its host took to answer, from the workers' reports
//! (`frontier.fetch_ms`). An answer that took [`SLOW`] times that average
//! or more (and at least [`SLOW_FLOOR_MS`]) adds [`BACK_OFF`] times its
//! duration to the queue's next gap, at most [`MOST_EXTRA`]; the next
//! answer in line with the average takes it away. Under a politeness
//! group the extra gap holds for the whole group, as its hosts share the
//! server that slowed.

use std::time::Duration;

/// An answer this many times the average is a slow-down.
pub const SLOW: f64 = 3.0;
/// Answers quicker than this are never a slow-down, however quick the
/// usual ones: jitter on a fast server is not load.
pub const SLOW_FLOOR_MS: u64 = 200;
/// The extra gap, in multiples of the slow answer's duration.
pub const BACK_OFF: u32 = 5;
/// The longest extra gap.
pub const MOST_EXTRA: Duration = Duration::from_secs(60);
/// Answers averaged before one may count as slow.
const WARM_UP: u32 = 3;
/// Weight of the newest answer in the moving average.
const WEIGHT: f64 = 0.2;

/// A host's answer times and the extra gap they call for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AnswerTimes {
    average_ms: f64,
    samples: u32,
    /// Added to the queue's delay before its next serve.
    pub extra: Duration,
}

impl AnswerTimes {
    /// One more answer, `ms` long: the extra gap it calls for.
    pub fn observe(&mut self, ms: u64) -> Duration {
        let slow =
            self.samples >= WARM_UP && ms >= SLOW_FLOOR_MS && ms as f64 >= SLOW * self.average_ms;
        self.extra = if slow {
            Duration::from_millis(ms.saturating_mul(u64::from(BACK_OFF))).min(MOST_EXTRA)
        } else {
            Duration::ZERO
        };
        self.average_ms = if self.samples == 0 {
            ms as f64
        } else {
            (1.0 - WEIGHT) * self.average_ms + WEIGHT * ms as f64
        };
        self.samples = self.samples.saturating_add(1);
        self.extra
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_slow_answer_widens_the_next_gap_and_a_usual_one_restores_it() {
        let mut times = AnswerTimes::default();
        for _ in 0..5 {
            assert_eq!(times.observe(100), Duration::ZERO);
        }
        assert_eq!(times.observe(250), Duration::ZERO, "not three times");
        assert_eq!(times.observe(900), Duration::from_millis(4_500));
        assert_eq!(times.extra, Duration::from_millis(4_500));
        assert_eq!(times.observe(120), Duration::ZERO);
    }

    #[test]
    fn quick_answers_and_a_first_few_never_back_off() {
        let mut fast = AnswerTimes::default();
        for _ in 0..5 {
            fast.observe(5);
        }
        assert_eq!(fast.observe(150), Duration::ZERO, "below the floor");
        let mut new = AnswerTimes::default();
        new.observe(100);
        assert_eq!(new.observe(5_000), Duration::ZERO, "still warming up");
        let mut stalled = AnswerTimes::default();
        for _ in 0..5 {
            stalled.observe(300);
        }
        assert_eq!(stalled.observe(30_000), MOST_EXTRA);
    }

    proptest! {
        #[test]
        fn the_extra_gap_is_bounded_and_only_follows_a_slow_answer(
            answers in proptest::collection::vec(0u64..100_000, 1..50),
        ) {
            let mut times = AnswerTimes::default();
            for ms in answers {
                let before = times;
                let extra = times.observe(ms);
                prop_assert!(extra <= MOST_EXTRA);
                if extra > Duration::ZERO {
                    prop_assert!(ms >= SLOW_FLOOR_MS);
                    prop_assert!(ms as f64 >= SLOW * before.average_ms);
                }
            }
        }
    }
}
