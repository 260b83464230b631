//! Time for the frontier and the worker alike.
//!
//! The dates the API and the store carry (a URL's due date and creation
//! date, a queue's block) are whole UTC epoch seconds, `u64`, as URL
//! Frontier's `refetchable_from_date` is. Finer moments (a politeness delay
//! of 250 ms, a lease that ends mid-second, when a robots.txt was read) are
//! a [`Timestamp`], a moment to the millisecond that is made from and
//! turned into epoch seconds only by name; spans are [`Duration`]s, so no
//! unit is converted by hand. [`Timestamp::now`] is the one place either
//! program reads the system clock; code whose tests drive time (the
//! scheduler) takes `now` as a parameter instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A moment, to the millisecond (UTC epoch milliseconds inside).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch: before any moment the frontier meets ("at once").
    pub const EPOCH: Self = Self(0);
    /// After every moment ("never").
    pub const NEVER: Self = Self(u64::MAX);

    /// Now, by the system clock (the epoch if the clock is before it).
    #[must_use]
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// A system time (the epoch if before it).
    #[must_use]
    pub fn from_system_time(time: SystemTime) -> Self {
        Self(
            time.duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// The start of a UTC epoch second.
    #[must_use]
    pub const fn from_unix_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1000))
    }

    /// A UTC epoch millisecond.
    #[must_use]
    pub const fn from_unix_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// The UTC epoch second this moment falls in.
    #[must_use]
    pub const fn unix_secs(self) -> u64 {
        self.0 / 1000
    }

    /// The first UTC epoch second not before this moment (a lease that
    /// ends mid-second is reported as ending at the next whole one).
    #[must_use]
    pub const fn unix_secs_rounded_up(self) -> u64 {
        self.0.div_ceil(1000)
    }

    /// UTC epoch milliseconds.
    #[must_use]
    pub const fn unix_millis(self) -> u64 {
        self.0
    }

    /// This moment plus `duration`, [`Self::NEVER`] at most.
    #[must_use]
    pub fn saturating_add(self, duration: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_meet_only_through_names() {
        let t = Timestamp::from_unix_secs(1_700_000_000);
        assert_eq!(t.unix_millis(), 1_700_000_000_000);
        assert_eq!(t.unix_secs(), 1_700_000_000);
        let later = t.saturating_add(Duration::from_millis(1999));
        assert_eq!(later.unix_secs(), 1_700_000_001);
        assert_eq!(later.unix_secs_rounded_up(), 1_700_000_002);
        assert_eq!(t.unix_secs_rounded_up(), 1_700_000_000);
        assert!(later > t);
        assert_eq!(
            Timestamp::NEVER.saturating_add(Duration::MAX),
            Timestamp::NEVER
        );
        assert_eq!(Timestamp::from_unix_secs(u64::MAX), Timestamp::NEVER);
    }
}
