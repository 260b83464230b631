//! When a page is worth fetching again: a crawl's revisit policy applied
//! to what the fetches of the page found. The frontier, not the crawler,
//! keeps each page's history and picks its next due date, so every worker
//! of a crawl agrees.
//!
//! - `never`: a page fetched is done (the URL Frontier default).
//! - `fixed`: every `min` seconds.
//! - `adaptive`: the interval follows the page's estimated change rate,
//!   between `min` and `max` seconds.
//!
//! The change rate is estimated as Cho and Garcia-Molina do ("Estimating
//! frequency of change", ACM TOIT 3(3), 2003, the estimator for pages
//! fetched at regular intervals, applied with the mean interval): after
//! `n` fetches that found the page changed `x` times, over `t` seconds,
//!
//! ```text
//! rate = -ln((n - x + 0.5) / (n + 0.5)) / (t / n)
//! ```
//!
//! A fetch sees at most one change however many came since the last, so
//! the plain `x / t` falls ever further below the true rate as a page
//! changes faster than it is fetched, and says nothing when every fetch
//! found a change; this estimator corrects most of that bias and stays
//! finite. It needs three counts a URL, not a list of past fetches.
//! Counts are halved past [`HISTORY_FETCHES`], so the estimate follows a
//! page whose habits change.
//!
//! The next interval is the time by which the page has changed with even
//! odds at that rate (`ln 2 / rate`), within `min` and `max`, growing at
//! most twofold a fetch: a page seen unchanged twice is not yet known to
//! be static, while a change seen shortens the interval at once (what
//! Nutch's AdaptiveFetchSchedule also does, by fixed steps).

/// A crawl's revisit policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// A fetched page is never due again.
    #[default]
    Never,
    /// Due again `secs` seconds after each fetch.
    Fixed { secs: u32 },
    /// Due again after an interval that follows the page's change rate,
    /// between `min_secs` and `max_secs`.
    Adaptive { min_secs: u32, max_secs: u32 },
}

/// Why a policy cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Intervals are whole seconds from one up.
    #[error("a revisit interval is whole seconds from 1 up, not {0}")]
    NotAnInterval(u64),
    /// The bounds of an adaptive policy are the wrong way round.
    #[error("the shortest revisit interval ({min} s) is longer than the longest ({max} s)")]
    Bounds { min: u32, max: u32 },
    /// A policy name this frontier does not know.
    #[error("unknown revisit policy {0:?}: never, fixed or adaptive")]
    Unknown(String),
}

impl Policy {
    /// The policy named `name` (`never`, `fixed`, `adaptive`) with its
    /// intervals, checked.
    pub fn parse(name: &str, min_secs: u64, max_secs: u64) -> Result<Self, PolicyError> {
        let secs = |value: u64| {
            u32::try_from(value)
                .ok()
                .filter(|secs| *secs >= 1)
                .ok_or(PolicyError::NotAnInterval(value))
        };
        match name {
            "never" => Ok(Self::Never),
            "fixed" => Ok(Self::Fixed {
                secs: secs(min_secs)?,
            }),
            "adaptive" => {
                let (min, max) = (secs(min_secs)?, secs(max_secs)?);
                if min > max {
                    return Err(PolicyError::Bounds { min, max });
                }
                Ok(Self::Adaptive {
                    min_secs: min,
                    max_secs: max,
                })
            }
            other => Err(PolicyError::Unknown(other.to_owned())),
        }
    }

    /// Its name, as `parse` takes it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Fixed { .. } => "fixed",
            Self::Adaptive { .. } => "adaptive",
        }
    }
}

/// Fetches kept in the counts before they are halved.
pub const HISTORY_FETCHES: u32 = 32;

/// What the fetches of one page found, in three counts and two dates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct History {
    /// Fetches that reached the page (counted since the last halving).
    pub fetches: u32,
    /// Of those, the ones that found it changed.
    pub changes: u32,
    /// Seconds between those fetches and the fetch before each.
    pub observed_secs: u64,
    /// The interval last chosen (seconds; 0 before the first fetch).
    pub interval_secs: u32,
    /// When it was last fetched (UTC epoch seconds; 0: never).
    pub last_fetched: u64,
}

/// What one fetch of a page found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Content other than the last fetch's.
    Changed,
    /// The same content (or a 304).
    Unchanged,
}

impl History {
    /// The estimated changes a second (module docs); `None` before two
    /// fetches (the first says nothing of change).
    #[must_use]
    pub fn change_rate(&self) -> Option<f64> {
        if self.fetches == 0 || self.observed_secs == 0 {
            return None;
        }
        let n = f64::from(self.fetches);
        let x = f64::from(self.changes.min(self.fetches));
        let mean_interval = self.observed_secs as f64 / n;
        Some(-((n - x + 0.5) / (n + 0.5)).ln() / mean_interval)
    }

    /// The history with one more fetch, at `now` (UTC epoch seconds).
    #[must_use]
    pub fn fetched(mut self, found: Found, now: u64) -> Self {
        if self.last_fetched > 0 {
            self.fetches += 1;
            self.changes += u32::from(found == Found::Changed);
            self.observed_secs += now.saturating_sub(self.last_fetched).max(1);
            if self.fetches > HISTORY_FETCHES {
                self.fetches /= 2;
                self.changes /= 2;
                self.observed_secs /= 2;
            }
        }
        self.last_fetched = now;
        self
    }
}

impl Policy {
    /// A page fetched at `now` found `found`: its history then, and when
    /// it is due again (UTC epoch seconds; `None`: never).
    #[must_use]
    pub fn next(&self, history: History, found: Found, now: u64) -> (History, Option<u64>) {
        let mut history = history.fetched(found, now);
        let interval = match *self {
            Self::Never => return (history, None),
            Self::Fixed { secs } => secs,
            Self::Adaptive { min_secs, max_secs } => {
                adaptive_interval(&history, found, min_secs, max_secs)
            }
        };
        history.interval_secs = interval;
        (history, Some(now + u64::from(interval)))
    }
}

fn adaptive_interval(history: &History, found: Found, min: u32, max: u32) -> u32 {
    let previous = history.interval_secs.clamp(min, max);
    let Some(rate) = history.change_rate() else {
        return min; // first fetch: nothing known of change yet
    };
    let target = if rate > 0.0 {
        (std::f64::consts::LN_2 / rate).clamp(f64::from(min), f64::from(max)) as u32
    } else {
        max
    };
    match found {
        // A change seen: no longer than what the estimate says.
        Found::Changed => target.min(previous),
        // Unchanged: toward the estimate, at most twice as long as before.
        Found::Unchanged => target.min(previous.saturating_mul(2)).max(min),
    }
    .clamp(min, max)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn adaptive(min_secs: u32, max_secs: u32) -> Policy {
        Policy::Adaptive { min_secs, max_secs }
    }

    #[test]
    fn policies_are_read_from_their_names_and_checked() {
        assert_eq!(Policy::parse("never", 0, 0), Ok(Policy::Never));
        assert_eq!(
            Policy::parse("fixed", 60, 0),
            Ok(Policy::Fixed { secs: 60 })
        );
        assert_eq!(Policy::parse("adaptive", 1, 10), Ok(adaptive(1, 10)));
        assert_eq!(
            Policy::parse("fixed", 0, 0),
            Err(PolicyError::NotAnInterval(0))
        );
        assert_eq!(
            Policy::parse("adaptive", 10, 1),
            Err(PolicyError::Bounds { min: 10, max: 1 })
        );
        assert!(matches!(
            Policy::parse("weekly", 1, 1),
            Err(PolicyError::Unknown(_))
        ));
        assert_eq!(adaptive(1, 2).name(), "adaptive");
    }

    #[test]
    fn never_ends_a_page_and_fixed_comes_back_after_its_interval() {
        let (history, due) = Policy::Never.next(History::default(), Found::Changed, 100);
        assert_eq!((history.last_fetched, due), (100, None));
        let (_, due) = Policy::Fixed { secs: 30 }.next(history, Found::Unchanged, 200);
        assert_eq!(due, Some(230));
    }

    /// A page that changes every `period` seconds, fetched under `policy`
    /// from 0 for `span` seconds: the intervals chosen.
    fn intervals(policy: Policy, period: u64, span: u64) -> Vec<u32> {
        let mut history = History::default();
        let mut now = 0;
        let mut version_seen = None;
        let mut chosen = Vec::new();
        while now < span {
            let version = now.checked_div(period).unwrap_or(0);
            let found = if version_seen == Some(version) {
                Found::Unchanged
            } else {
                Found::Changed
            };
            version_seen = Some(version);
            let (next, due) = policy.next(history, found, now.max(1));
            history = next;
            chosen.push(history.interval_secs);
            now = due.expect("revisited");
        }
        chosen
    }

    #[test]
    fn a_static_page_drifts_to_the_longest_interval_and_a_busy_one_stays_short() {
        let policy = adaptive(2, 600);
        let static_page = intervals(policy, 0, 100_000);
        assert_eq!(*static_page.last().unwrap(), 600);
        assert!(
            static_page.windows(2).all(|w| w[1] <= w[0].max(1) * 2),
            "grows at most twofold a fetch: {static_page:?}"
        );
        let busy = intervals(policy, 3, 600);
        let tail = &busy[busy.len() / 2..];
        assert!(
            tail.iter().all(|&i| i <= 4),
            "a page changing every 3 s: {busy:?}"
        );
        let hourly = intervals(policy, 60, 20_000);
        let settled = hourly[hourly.len() / 2..].iter().copied().max().unwrap();
        assert!(
            (10..=120).contains(&settled),
            "a page changing every minute: {hourly:?}"
        );
    }

    #[test]
    fn the_estimate_corrects_for_changes_a_fetch_cannot_see() {
        // Fetched every 10 s, found changed 9 times in 10: the naive
        // 0.09/s understates a page changing far more often.
        let history = History {
            fetches: 10,
            changes: 9,
            observed_secs: 100,
            ..History::default()
        };
        let rate = history.change_rate().unwrap();
        assert!(rate > 0.09 * 1.5, "{rate}");
        let all = History {
            changes: 10,
            ..history
        };
        assert!(all.change_rate().unwrap().is_finite());
        assert_eq!(History::default().change_rate(), None);
    }

    proptest! {
        #[test]
        fn intervals_stay_within_the_bounds_and_due_dates_follow_the_fetch(
            min in 1u32..1_000,
            extra in 0u32..100_000,
            finds in proptest::collection::vec((any::<bool>(), 1u64..200_000), 1..80),
        ) {
            let max = min + extra;
            let policy = adaptive(min, max);
            let mut history = History::default();
            let mut now = 1_000_000u64;
            for (changed, wait) in finds {
                now += wait;
                let found = if changed { Found::Changed } else { Found::Unchanged };
                let before = history;
                let (next, due) = policy.next(history, found, now);
                prop_assert!((min..=max).contains(&next.interval_secs));
                prop_assert_eq!(due, Some(now + u64::from(next.interval_secs)));
                prop_assert!(next.changes <= next.fetches);
                prop_assert!(next.fetches <= HISTORY_FETCHES);
                if before.last_fetched > 0 && found == Found::Unchanged {
                    prop_assert!(next.interval_secs <= before.interval_secs.clamp(min, max) * 2);
                }
                if found == Found::Changed && before.last_fetched > 0 {
                    prop_assert!(next.interval_secs <= before.interval_secs.clamp(min, max));
                }
                history = next;
            }
        }
    }
}
