//! Held groups paced to the applier's rate as what is held nears its
//! limit.
//!
//! Without a pace, groups go on at full rate until the limit, then all
//! wait for the applier's copy in progress (at scale its copies and
//! checkpoints take seconds): whole seconds pass without an answer, then a
//! burst. Past three quarters of the limit each group is held back for
//! the time the applier takes to write what it adds, at a rate that falls
//! to nothing as the limit nears, so answers keep coming at the rate the
//! applier sustains instead of stopping and starting again.
//!
//! What is held since the applier's last copy counts against the limit
//! until it takes its next copy, after the turn in progress and the
//! checkpoint that may follow it, so from one copy to the next the room
//! left is also spread over the time until the next is expected: in a
//! long turn (a large store's) the fresh layer otherwise went at full
//! rate to the fill where the pace begins, then on at the applier's
//! average rate into it, and groups waited whole seconds for the turn's
//! end.
//!
//! A larger copy shares more of the `url_records` pages it rewrites, and
//! a turn and its checkpoint have a cost of their own, so a pace that
//! leaves much of the limit unused at the next copy costs ingest. Hence
//! the pace by fill begins late and the expected time to the next copy
//! has a small margin; the pace by fill still bounds what a turn running
//! late lets in.

use std::time::{Duration, Instant};

/// The longest one group is held back: even at the limit's edge an answer
/// goes out this often while the applier works.
const LONGEST_WAIT: Duration = Duration::from_millis(100);

/// Weight of the newest copy in the measured rate.
const NEWEST_WEIGHT: f64 = 0.5;

/// The next copy is expected this much later than the bytes of the copy
/// just taken at the measured rate: each turn writes into a larger store
/// than the last.
const TURN_MARGIN: f64 = 1.05;

/// The share of the limit held past which groups are paced by the fill:
/// twice the applier's rate here, falling to nothing at the limit.
const PACE_FROM: f64 = 0.75;

/// Once the next copy is late, it is taken to come within this share of
/// the expected time between copies: the room left is spread over no
/// less.
const OVERRUN_SHARE: f64 = 0.1;

/// The applier's measured rate and when the next group may go.
#[derive(Debug, Default)]
pub(super) struct Pace {
    /// Bytes a second the applier writes, smoothed over its copies; `None`
    /// until it has made one.
    rate: Option<f64>,
    /// Time the applier spent on checkpoints since its last copy: time it
    /// did not spend writing copies.
    checkpoints_since_copy: Duration,
    /// When the next group may be staged.
    next: Option<Instant>,
    /// The applier's last copy: when its next is expected, and the
    /// expected time between the two.
    next_copy: Option<(Instant, Duration)>,
}

impl Pace {
    /// The applier took a copy of `bytes` to write at `now`. The rate
    /// counts checkpoints as busy time, so the copy's bytes at that rate
    /// are the expected time to the next copy, checkpoint and all.
    pub(super) fn taken(&mut self, bytes: usize, now: Instant) {
        self.next_copy = self.rate.filter(|rate| *rate > 0.0).map(|rate| {
            let length = Duration::from_secs_f64(bytes as f64 / rate * TURN_MARGIN);
            (now + length, length)
        });
    }

    /// The applier wrote a copy of `bytes` in `took`. The next copy's
    /// term stays: what is held counts against the limit until then.
    pub(super) fn copied(&mut self, bytes: usize, took: Duration) {
        let busy = took + std::mem::take(&mut self.checkpoints_since_copy);
        if bytes == 0 || busy.is_zero() {
            return;
        }
        let sample = bytes as f64 / busy.as_secs_f64();
        self.rate = Some(match self.rate {
            Some(rate) => rate * (1.0 - NEWEST_WEIGHT) + sample * NEWEST_WEIGHT,
            None => sample,
        });
    }

    /// The applier took `took` for a checkpoint.
    pub(super) fn checkpointed(&mut self, took: Duration) {
        self.checkpoints_since_copy += took;
    }

    /// How long a group about to be staged at `now` waits.
    pub(super) fn wait(&self, now: Instant) -> Duration {
        self.next
            .map_or(Duration::ZERO, |next| next.saturating_duration_since(now))
    }

    /// A group costing `cost` was held at `now`, leaving `held` bytes held
    /// since the applier's last copy, of `limit`: sets when the next group
    /// may go.
    pub(super) fn held(&mut self, cost: usize, held: usize, limit: usize, now: Instant) {
        let Some(rate) = self.rate else {
            return;
        };
        let fill = held as f64 / limit.max(1) as f64;
        let mut allowed = if fill < PACE_FROM {
            f64::INFINITY
        } else {
            rate * 2.0 * ((1.0 - fill) / (1.0 - PACE_FROM)).max(0.0)
        };
        if let Some((end, length)) = self.next_copy {
            let remaining = (end.saturating_duration_since(now))
                .max(length.mul_f64(OVERRUN_SHARE))
                .max(Duration::from_millis(1));
            let room = limit.saturating_sub(held) as f64;
            allowed = allowed.min(room / remaining.as_secs_f64());
        }
        if allowed.is_infinite() {
            self.next = None;
            return;
        }
        let wait = if allowed > 0.0 {
            Duration::from_secs_f64((cost as f64 / allowed).min(LONGEST_WAIT.as_secs_f64()))
        } else {
            LONGEST_WAIT
        };
        let from = self.next.filter(|&next| next > now).unwrap_or(now);
        self.next = Some(from + wait);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LIMIT: usize = 64 << 20;

    /// Held bytes halfway from where the pace by fill begins to the
    /// limit: there it lets groups in at the applier's rate.
    fn halfway_to_the_limit() -> usize {
        (LIMIT as f64 * (1.0 + PACE_FROM) / 2.0) as usize
    }

    #[test]
    fn no_group_waits_before_a_copy_is_measured_or_below_the_paced_fill() {
        let now = Instant::now();
        let mut pace = Pace::default();
        pace.held(1 << 20, LIMIT - 1, LIMIT, now);
        assert_eq!(pace.wait(now), Duration::ZERO);
        pace.copied(10 << 20, Duration::from_secs(1));
        let below = (LIMIT as f64 * PACE_FROM) as usize - 1;
        pace.held(1 << 20, below, LIMIT, now);
        assert_eq!(pace.wait(now), Duration::ZERO);
    }

    #[test]
    fn halfway_to_the_limit_a_group_waits_the_applier_time_for_it() {
        let now = Instant::now();
        let mut pace = Pace::default();
        pace.copied(10 << 20, Duration::from_secs(1));
        pace.held(1 << 20, halfway_to_the_limit(), LIMIT, now);
        let wait = pace.wait(now).as_secs_f64();
        assert!((wait - 0.1).abs() < 1e-6, "{wait}");
    }

    #[test]
    fn checkpoints_count_as_time_the_applier_was_busy() {
        let now = Instant::now();
        let mut pace = Pace::default();
        pace.checkpointed(Duration::from_secs(3));
        pace.copied(40 << 20, Duration::from_secs(1));
        pace.held(1 << 20, halfway_to_the_limit(), LIMIT, now);
        // 10 MiB a second: a MiB takes 0.1 s.
        assert!((pace.wait(now).as_secs_f64() - 0.1).abs() < 1e-6);
    }

    #[test]
    fn a_turn_in_progress_spreads_the_room_left_over_its_expected_length() {
        let now = Instant::now();
        let mut pace = Pace::default();
        pace.copied(10 << 20, Duration::from_secs(1));
        // 20 MiB at 10 MiB a second, and the margin.
        pace.taken(20 << 20, now);
        let length = 2.0 * TURN_MARGIN;
        // A quarter held: no wait without a turn in progress; with one,
        // 48 MiB of room over the turn's length.
        let cost = 64 << 10;
        pace.held(cost, LIMIT / 4, LIMIT, now);
        let wait = pace.wait(now).as_secs_f64();
        let expected = cost as f64 * length / (LIMIT as f64 * 0.75);
        assert!((wait - expected).abs() < 1e-6, "{wait} against {expected}");
        // Its end passed: a tenth of its length left, at least.
        let mut pace = Pace::default();
        pace.copied(10 << 20, Duration::from_secs(1));
        pace.taken(20 << 20, now);
        let late = now + Duration::from_secs(10);
        pace.held(cost, LIMIT / 4, LIMIT, late);
        let wait = pace.wait(late).as_secs_f64();
        let expected = cost as f64 * length * OVERRUN_SHARE / (LIMIT as f64 * 0.75);
        assert!((wait - expected).abs() < 1e-6, "{wait} against {expected}");
        // Written (at the same rate), the term stays until the next copy:
        // what is held leaves only then.
        pace.copied(20 << 20, Duration::from_secs(2));
        let later = late + Duration::from_secs(1);
        pace.held(cost, LIMIT / 4, LIMIT, later);
        let wait = pace.wait(later).as_secs_f64();
        assert!((wait - expected).abs() < 1e-6, "{wait} against {expected}");
        // The next copy sets the next term.
        pace.taken(40 << 20, later);
        let after = later + Duration::from_secs(1);
        pace.held(cost, LIMIT / 4, LIMIT, after);
        let wait = pace.wait(after).as_secs_f64();
        let expected = cost as f64 * (4.0 * TURN_MARGIN - 1.0) / (LIMIT as f64 * 0.75);
        assert!((wait - expected).abs() < 1e-6, "{wait} against {expected}");
    }

    /// Groups staged as fast as the pace lets them, through a turn that
    /// ends when expected, fill the room it leaves without reaching the
    /// limit.
    #[test]
    fn groups_paced_through_a_turn_stay_under_the_limit() {
        let start = Instant::now();
        let mut pace = Pace::default();
        // 4 MiB a second: a turn of a whole limit takes 16 s.
        pace.copied(4 << 20, Duration::from_secs(1));
        pace.taken(LIMIT, start);
        let end = start + Duration::from_secs_f64(16.0 * TURN_MARGIN);
        let cost = 256 << 10;
        let (mut held, mut now) = (0, start);
        while now < end {
            held += cost;
            assert!(
                held < LIMIT,
                "the limit reached {:?} into the turn",
                now - start
            );
            pace.held(cost, held, LIMIT, now);
            now = (now + Duration::from_micros(1)).max(start + (pace.wait(start)));
        }
        assert!(
            held > LIMIT * 3 / 4,
            "{held} of {LIMIT}: the room went unused"
        );
    }

    proptest! {
        /// Waits only grow as what is held nears the limit, never pass the
        /// longest wait per group, and add up over groups staged at once.
        #[test]
        fn waits_rise_with_the_fill_and_are_bounded(
            rate in 1_usize..(1 << 30),
            cost in 1_usize..(1 << 20),
            fills in prop::collection::vec(0.0_f64..1.2, 2..20),
        ) {
            let now = Instant::now();
            let mut sorted = fills.clone();
            sorted.sort_by(f64::total_cmp);
            let mut previous = Duration::ZERO;
            for fill in sorted {
                let mut pace = Pace::default();
                pace.copied(rate, Duration::from_secs(1));
                pace.held(cost, (fill * LIMIT as f64) as usize, LIMIT, now);
                let wait = pace.wait(now);
                prop_assert!(wait >= previous);
                prop_assert!(wait <= LONGEST_WAIT);
                previous = wait;
            }
            let mut pace = Pace::default();
            pace.copied(rate, Duration::from_secs(1));
            let mut total = Duration::ZERO;
            for fill in &fills {
                let before = pace.wait(now);
                pace.held(cost, (fill * LIMIT as f64) as usize, LIMIT, now);
                let after = pace.wait(now);
                if *fill >= PACE_FROM {
                    prop_assert!(after >= before);
                    total = after;
                } else {
                    prop_assert_eq!(after, Duration::ZERO);
                    total = Duration::ZERO;
                }
            }
            prop_assert!(total <= LONGEST_WAIT * fills.len() as u32);
        }
    }
}
