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
//! The next interval is the one that buys the most freshness (the share
//! of time the crawl holds a page's current version) for the fetches it
//! costs, after Cho and Garcia-Molina ("Synchronizing a database to
//! improve freshness", SIGMOD 2000). A page changing at `rate` and
//! fetched every `I` seconds is fresh `(1 - e^-x) / x` of the time, with
//! `x = rate * I`; the allocation that maximises mean freshness for a
//! budget of fetches gives each page the interval where the freshness
//! one more fetch a second buys, `(1 - (1 + x) e^-x) / rate`, equals the
//! same price `mu` for every page. Its shape:
//!
//! - a slowly changing page gets about `sqrt(2 mu / rate)`, far shorter
//!   than the `ln 2 / rate` of an interval proportional to its changes,
//!   because fetching it again is cheap freshness;
//! - the interval is shortest, `min`, for a page changing `1.79 / min`
//!   times a second, which is what fixes `mu` from the policy's `min`;
//! - past that rate the optimum lengthens again, since a page that
//!   changes faster than it can be fetched is rarely fresh however often
//!   it is fetched; here it stays at `min` instead, so that a change seen
//!   never lengthens the interval and a busy page is followed as closely
//!   as the policy allows.
//!
//! The interval stays within `min` and `max` and grows at most twofold a
//! fetch: a page seen unchanged twice is not yet known to be static,
//! while a change seen shortens the interval at once (what Nutch's
//! AdaptiveFetchSchedule also does, by fixed steps).

use std::collections::BTreeMap;

use proto::metadata::{self, RevisitState};

/// `x = rate * interval` at which a fetch's price in freshness is lowest
/// (the root of `e^x = 1 + x + x^2`): a page changing `X_CHEAPEST / min`
/// times a second gets the interval `min`.
const X_CHEAPEST: f64 = 1.793_282_132_977_14;

/// Freshness bought by fetching a page a little more often, per change
/// a second: `1 - (1 + x) e^-x`, rising from 0 to 1 with `x`.
fn marginal_freshness(x: f64) -> f64 {
    1.0 - (1.0 + x) * (-x).exp()
}

/// The freshness-optimal interval (module docs) for a page changing
/// `rate` times a second when the price `mu` is set by `min`; pages
/// faster than the cheapest rate get `min`.
fn freshest_interval(rate: f64, min: u32) -> f64 {
    let min = f64::from(min);
    if rate <= 0.0 {
        return f64::INFINITY;
    }
    let price = min * marginal_freshness(X_CHEAPEST) / X_CHEAPEST;
    let wanted = price * rate;
    if wanted >= marginal_freshness(X_CHEAPEST) {
        return min;
    }
    // marginal_freshness rises on [0, X_CHEAPEST]: bisect for `wanted`.
    let (mut low, mut high) = (0.0_f64, X_CHEAPEST);
    for _ in 0..60 {
        let mid = (low + high) / 2.0;
        if marginal_freshness(mid) < wanted {
            low = mid;
        } else {
            high = mid;
        }
    }
    high / rate
}

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
    /// Nothing said of the content: a client that reports no finding, or
    /// an end other than a page (a 404, a redirect, a robots refusal).
    /// The page counts as visited; its change counts stay as they were.
    Unknown,
}

impl Found {
    /// The finding a report names under [`metadata::FOUND`].
    #[must_use]
    pub fn parse(word: &str) -> Self {
        match word {
            "changed" => Self::Changed,
            "unchanged" => Self::Unchanged,
            _ => Self::Unknown,
        }
    }

    /// The word a report carries for it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Changed => "changed",
            Self::Unchanged => "unchanged",
            Self::Unknown => "unknown",
        }
    }
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
        if self.last_fetched > 0 && found != Found::Unknown {
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
    if found == Found::Unknown {
        // Nothing learnt: back off as from an unchanged page, so that a
        // page gone (404) or refused drifts to the longest interval.
        return if history.interval_secs == 0 {
            min
        } else {
            previous.saturating_mul(2).clamp(min, max)
        };
    }
    let Some(rate) = history.change_rate() else {
        return min; // first fetch: nothing known of change yet
    };
    let target = freshest_interval(rate, min).clamp(f64::from(min), f64::from(max)) as u32;
    match found {
        // A change seen: no longer than what the estimate says.
        Found::Changed => target.min(previous),
        // Unchanged: toward the estimate, at most twice as long as before.
        Found::Unchanged | Found::Unknown => target.min(previous.saturating_mul(2)).max(min),
    }
    .clamp(min, max)
}

impl Policy {
    /// Nine bytes: the kind, then the two intervals (little-endian), as
    /// the store and the write-ahead log keep a policy.
    #[must_use]
    pub fn encode(&self) -> [u8; 9] {
        let (kind, min, max) = match *self {
            Self::Never => (0u8, 0u32, 0u32),
            Self::Fixed { secs } => (1, secs, secs),
            Self::Adaptive { min_secs, max_secs } => (2, min_secs, max_secs),
        };
        let mut out = [0; 9];
        out[0] = kind;
        out[1..5].copy_from_slice(&min.to_le_bytes());
        out[5..9].copy_from_slice(&max.to_le_bytes());
        out
    }

    /// Reads what [`Self::encode`] wrote; `None` for damaged bytes.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; 9] = bytes.try_into().ok()?;
        let min = u64::from(u32::from_le_bytes(bytes[1..5].try_into().ok()?));
        let max = u64::from(u32::from_le_bytes(bytes[5..9].try_into().ok()?));
        let name = match bytes[0] {
            0 => "never",
            1 => "fixed",
            2 => "adaptive",
            _ => return None,
        };
        Self::parse(name, min, max).ok()
    }

    /// The shortest and longest intervals (0 for `never`).
    #[must_use]
    pub fn bounds(&self) -> (u32, u32) {
        match *self {
            Self::Never => (0, 0),
            Self::Fixed { secs } => (secs, secs),
            Self::Adaptive { min_secs, max_secs } => (min_secs, max_secs),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Never => f.write_str("never"),
            Self::Fixed { secs } => write!(f, "fixed every {secs} s"),
            Self::Adaptive { min_secs, max_secs } => {
                write!(f, "adaptive between {min_secs} and {max_secs} s")
            }
        }
    }
}

impl History {
    /// The history a stored state holds.
    #[must_use]
    pub fn of_state(state: &RevisitState) -> Self {
        Self {
            fetches: state.fetches,
            changes: state.changes,
            observed_secs: state.observed_secs,
            interval_secs: state.interval_secs,
            last_fetched: state.last_fetched,
        }
    }

    /// The history a URL's metadata holds (none yet: the default).
    #[must_use]
    pub fn of(metadata: &Metadata) -> Self {
        Self::of_state(&state_of(metadata).unwrap_or_default())
    }

    fn into_state(self, state: RevisitState) -> RevisitState {
        RevisitState {
            fetches: self.fetches,
            changes: self.changes,
            observed_secs: self.observed_secs,
            interval_secs: self.interval_secs,
            last_fetched: self.last_fetched,
            ..state
        }
    }
}

/// The revisit state a URL's metadata holds, if any.
#[must_use]
pub fn state_of(metadata: &Metadata) -> Option<RevisitState> {
    metadata.get(metadata::REVISIT).and_then(RevisitState::of)
}

/// A URL's metadata, as the store keeps it.
pub type Metadata = BTreeMap<String, Vec<String>>;

/// What a report of a URL comes to: when it is due again (UTC epoch
/// seconds; 0: completed) and the metadata stored for it.
///
/// - `policy` is the crawl's. It picks the date when the report leaves it
///   to the frontier (`due_at` 0, the API's "done"); a report with a date
///   of its own (a plain URL Frontier client's, or a retry) keeps it.
/// - `stored` is the metadata the URL had, if the crawl held it.
///
/// The state (`frontier.revisit`) is the frontier's alone: the history in
/// it comes from `stored`, never from the report; the report's finding,
/// validators, digest and capture date are folded into it and not stored
/// under their own keys. A URL completed for good keeps no state, so a
/// crawl that never revisits stores none.
#[must_use]
pub fn settle(
    policy: Policy,
    stored: Option<&Metadata>,
    report: &Metadata,
    due_at: u64,
    now: u64,
) -> (u64, Metadata) {
    let mut metadata = report.clone();
    metadata.remove(metadata::REVISIT);
    // Read by the scheduler (politeness by address, slow-down), not kept.
    metadata.remove(metadata::ADDRESS);
    metadata.remove(metadata::FETCH_MS);
    let mut reported: BTreeMap<&str, String> = BTreeMap::new();
    for key in metadata::REPORT_KEYS {
        // Folded into the state, never stored as they came; a value that
        // would not read back from the state's text is left out.
        if let Some(value) = metadata.remove(key).and_then(|v| v.into_iter().next())
            && (key == metadata::ETAG || !value.contains('|'))
        {
            reported.insert(key, value);
        }
    }
    let stored = stored.and_then(state_of).unwrap_or_default();
    let due_at = match policy {
        Policy::Fixed { .. } | Policy::Adaptive { .. } if due_at == 0 => {
            let found = reported
                .get(metadata::FOUND)
                .map_or(Found::Unknown, |word| Found::parse(word));
            let history = History::of_state(&stored);
            // A clock behind the last fetch's (another node's) must not
            // move the history back.
            let now = now.max(history.last_fetched);
            let (history, due) = policy.next(history, found, now);
            let mut take = |key: &str, held: Option<String>| reported.remove(key).or(held);
            let state = RevisitState {
                captured: take(metadata::CAPTURED, None)
                    .and_then(|at| at.parse().ok())
                    .or(stored.captured),
                digest: take(metadata::DIGEST, stored.digest.clone()),
                last_modified: take(metadata::LAST_MODIFIED, stored.last_modified.clone()),
                etag: take(metadata::ETAG, stored.etag.clone()),
                ..RevisitState::default()
            };
            let state = history.into_state(state);
            metadata.insert(metadata::REVISIT.to_owned(), vec![state.encode()]);
            due.unwrap_or(0)
        }
        // Done for good: nothing of the revisits is kept.
        _ if due_at == 0 => 0,
        // A date of the client's own: the state stays as it was.
        _ => {
            if stored != RevisitState::default() {
                metadata.insert(metadata::REVISIT.to_owned(), vec![stored.encode()]);
            }
            due_at
        }
    };
    (due_at, metadata)
}

/// The revisit policy of each crawl: its own when set, else the default.
#[derive(Debug, Default)]
pub struct Policies {
    default: Policy,
    // Read on every report, written by an operator: held for a copy or an
    // insert, never across I/O.
    by_crawl: std::sync::RwLock<std::collections::HashMap<String, Policy>>,
}

impl Policies {
    /// Crawls without a policy of their own take `default`.
    #[must_use]
    pub fn new(default: Policy) -> Self {
        Self {
            default,
            by_crawl: std::sync::RwLock::default(),
        }
    }

    /// The same crawls' own policies, with another default.
    #[must_use]
    pub fn with_default(self, default: Policy) -> Self {
        Self { default, ..self }
    }

    /// The policy `crawl` runs under.
    #[must_use]
    pub fn of(&self, crawl: &str) -> Policy {
        self.by_crawl
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(crawl)
            .copied()
            .unwrap_or(self.default)
    }

    /// Whether `crawl` has a policy of its own (not the default).
    #[must_use]
    pub fn is_own(&self, crawl: &str) -> bool {
        self.by_crawl
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(crawl)
    }

    /// Gives `crawl` its own policy (`Some`) or the default again.
    pub fn set(&self, crawl: &str, policy: Option<Policy>) {
        let mut by_crawl = self
            .by_crawl
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match policy {
            Some(policy) => by_crawl.insert(crawl.to_owned(), policy),
            None => by_crawl.remove(crawl),
        };
    }
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
        // Square-root allocation: about sqrt(2 mu / rate) = 8.5 s, where
        // an interval proportional to the changes would be 41 s.
        let minutely = intervals(policy, 60, 20_000);
        let settled = minutely[minutely.len() / 2..]
            .iter()
            .copied()
            .max()
            .unwrap();
        assert!(
            (5..=16).contains(&settled),
            "a page changing every minute: {minutely:?}"
        );
    }

    #[test]
    fn the_freshest_interval_is_shortest_at_the_cheapest_rate_and_grows_as_a_root() {
        let x = X_CHEAPEST;
        assert!((x.exp() - (1.0 + x + x * x)).abs() < 1e-9);
        let min = 10;
        let at_cheapest = freshest_interval(X_CHEAPEST / 10.0, min);
        assert!((at_cheapest - 10.0).abs() < 1e-6, "{at_cheapest}");
        assert_eq!(freshest_interval(100.0, min), 10.0);
        assert_eq!(freshest_interval(0.0, min), f64::INFINITY);
        // Slower pages: longer intervals, growing as 1 / sqrt(rate).
        let rates = [0.1, 0.01, 0.001, 0.0001, 0.000_01];
        let chosen: Vec<f64> = rates.iter().map(|&r| freshest_interval(r, min)).collect();
        assert!(chosen.windows(2).all(|w| w[1] > w[0]), "{chosen:?}");
        let ratio = chosen[4] / chosen[3];
        assert!((ratio - 10f64.sqrt()).abs() < 0.05, "{chosen:?}");
        // Far below the cheapest rate, shorter than proportional.
        for (rate, interval) in rates.iter().zip(&chosen).skip(1) {
            assert!(*interval < std::f64::consts::LN_2 / rate, "{chosen:?}");
        }
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

    fn meta(pairs: &[(&str, &str)]) -> Metadata {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
            .collect()
    }

    #[test]
    fn a_report_under_a_policy_is_due_again_and_keeps_the_frontiers_history() {
        let policy = Policy::Fixed { secs: 60 };
        let report = meta(&[
            (metadata::FOUND, "changed"),
            (metadata::ETAG, "\"v1|x\""),
            (metadata::LAST_MODIFIED, "Sat, 28 Nov 2026 10:00:00 GMT"),
            (metadata::DIGEST, "sha1:AAAA"),
            (metadata::CAPTURED, "999"),
            (metadata::REVISIT, "99 99 9 9 9||||"),
        ]);
        let (due, stored) = settle(policy, None, &report, 0, 1_000);
        assert_eq!(due, 1_060);
        // One key holds it all; what the report carried is folded in.
        assert_eq!(stored.keys().collect::<Vec<_>>(), vec![metadata::REVISIT]);
        let state = state_of(&stored).unwrap();
        assert_eq!(
            (
                state.etag.as_deref(),
                state.captured,
                state.digest.as_deref()
            ),
            (Some("\"v1|x\""), Some(999), Some("sha1:AAAA"))
        );
        let history = History::of(&stored);
        assert_eq!((history.fetches, history.last_fetched), (0, 1_000));
        // An unchanged page's report without validators keeps the held ones.
        let report = meta(&[(metadata::FOUND, "unchanged")]);
        let (due, again) = settle(policy, Some(&stored), &report, 0, 1_070);
        assert_eq!(due, 1_130);
        let history = History::of(&again);
        assert_eq!((history.fetches, history.changes), (1, 0));
        assert_eq!(state_of(&again).unwrap().etag, state.etag);
        // A clock behind the last fetch does not move the history back.
        let (_, back) = settle(policy, Some(&again), &report, 0, 10);
        assert_eq!(History::of(&back).last_fetched, 1_070);
    }

    #[test]
    fn a_url_done_for_good_keeps_no_revisit_keys_and_a_clients_date_wins() {
        let report = meta(&[
            (metadata::FOUND, "changed"),
            (metadata::DIGEST, "sha1:X"),
            ("outcome", "fetched"),
        ]);
        let (due, stored) = settle(Policy::Never, None, &report, 0, 5);
        assert_eq!(due, 0);
        assert_eq!(stored, meta(&[("outcome", "fetched")]));
        let held = meta(&[(metadata::REVISIT, "3 1 30 10 100|90|sha1:Y||")]);
        let (due, stored) = settle(Policy::Never, Some(&held), &report, 777, 5);
        assert_eq!(due, 777);
        assert_eq!(stored[metadata::REVISIT], held[metadata::REVISIT]);
        assert!(!stored.contains_key(metadata::FOUND));
    }

    #[test]
    fn policies_fall_back_to_the_default() {
        let policies = Policies::new(Policy::Fixed { secs: 5 });
        assert_eq!(policies.of("a"), Policy::Fixed { secs: 5 });
        policies.set("a", Some(Policy::Never));
        assert_eq!(policies.of("a"), Policy::Never);
        assert!(policies.is_own("a"));
        policies.set("a", None);
        assert!(!policies.is_own("a"));
    }

    proptest! {
        #[test]
        fn policies_and_histories_read_back_as_written(
            kind in 0u8..3, min in 1u32.., extra in 0u32..1_000,
            fetches in 0u32..=HISTORY_FETCHES, changes in 0u32..=HISTORY_FETCHES,
            observed in any::<u64>(), interval in any::<u32>(), last in any::<u64>(),
        ) {
            let name = ["never", "fixed", "adaptive"][usize::from(kind)];
            let max = min.saturating_add(extra);
            let policy = Policy::parse(name, u64::from(min), u64::from(max)).unwrap();
            prop_assert_eq!(Policy::decode(&policy.encode()), Some(policy));
            let state = RevisitState {
                fetches,
                changes: changes.min(fetches),
                observed_secs: observed,
                interval_secs: interval,
                last_fetched: last,
                captured: last.checked_sub(1),
                digest: Some(format!("sha1:{observed:X}")),
                last_modified: (interval % 2 == 0).then(|| "Sat, 28 Nov 2026 10:00:00 GMT".into()),
                etag: Some(format!("W/\"{extra}|{kind} \"")),
            };
            prop_assert_eq!(RevisitState::parse(&state.encode()), Some(state));
        }

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
