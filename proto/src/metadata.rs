//! The URL metadata keys the worker and the frontier agree on. Metadata is
//! the API's free-form `map<string, StringList>`; these keys give some of
//! it a meaning on both sides.

/// Link depth from the crawl's seeds (seeds are 0): the worker sets it on
/// each outlink, the frontier's depth limit reads it.
pub const DEPTH: &str = "depth";

/// The page an outlink was found on.
pub const PARENT: &str = "parent";

/// How many redirects in a row led to a URL; the worker stops following
/// a chain past its limit.
pub const REDIRECT_HOPS: &str = "redirect_hops";

/// How many times a URL failed transiently and was rescheduled.
pub const RETRIES: &str = "retries";

/// How a fetch ended, in words (`fetched`, `redirect`, `robots`, ...).
pub const OUTCOME: &str = "outcome";

/// The HTTP status of the last fetch, when there was an answer.
pub const STATUS: &str = "status";

/// Why a URL was given up after its last retry.
pub const FAILURE: &str = "failure";

/// The queue's delay between request starts, in milliseconds, as the
/// frontier serving the URL holds it: set on every URL the frontier serves
/// (a lease may carry several URLs of a queue, and their holder spaces its
/// requests by it). Never stored: the frontier drops it from reports.
pub const QUEUE_DELAY_MS: &str = "frontier.queue_delay_ms";

/// Marks a URL as a sitemap (its value: the sitemap index level, 0 for
/// one named by robots.txt): the worker reads it as a sitemap rather than
/// as a page. Sitemaps go to the frontier as discovered URLs, so each is
/// read once per crawl whichever worker finds it.
pub const SITEMAP: &str = "sitemap";

/// A GetURLs request header (gRPC metadata, not a URL's): with the value
/// `1`, each queue served is held by the lease until its last URL is
/// reported or expires, and the queue's delay runs from that moment. This
/// project's worker sends it, since it spaces a lease's requests to a host
/// itself. Without it, GetURLs serves as the URL Frontier API says: a
/// queue's leased URLs count against `max_urls_per_queue` and its delay
/// runs from each serve.
pub const HOLD_QUEUES_HEADER: &str = "x-frontier-hold-queues";

/// In a report: the ETag the fetch answered (the worker sends it as
/// `If-None-Match` next time). The frontier keeps it in [`REVISIT`].
pub const ETAG: &str = "frontier.etag";

/// In a report: the Last-Modified the fetch answered (sent as
/// `If-Modified-Since`). Kept in [`REVISIT`].
pub const LAST_MODIFIED: &str = "frontier.last_modified";

/// In a report: the payload digest (`sha1:` + base32, as WARC writes it)
/// of the content now held; a fetch with the same digest found no change.
/// Kept in [`REVISIT`].
pub const DIGEST: &str = "frontier.digest";

/// In a report: when the content of [`DIGEST`] was captured (its WARC
/// response record's date, UTC epoch seconds), what a revisit record
/// refers to. Kept in [`REVISIT`].
pub const CAPTURED: &str = "frontier.captured";

/// In a report: what the fetch found, `changed` or `unchanged` (a 304, or
/// the same digest). The frontier reads it to pick the URL's next due
/// date under the crawl's revisit policy.
pub const FOUND: &str = "frontier.found";

/// In a report: the IP address the host answered from. A frontier whose
/// politeness groups hosts by address files the host's queue under it;
/// it is not stored with the URL.
pub const ADDRESS: &str = "frontier.address";

/// In a report: how long the host took to answer, in milliseconds (the
/// request to the last byte of the body). The frontier backs off a host
/// whose answers slow down well past their average; it is not stored.
pub const FETCH_MS: &str = "frontier.fetch_ms";

/// A URL's revisit state ([`RevisitState`]), written by the frontier
/// alone and served with the URL: what a report carries under this key is
/// ignored.
pub const REVISIT: &str = "frontier.revisit";

/// The keys a report carries for revisits; the frontier folds them into
/// [`REVISIT`] and stores none of them as they came.
pub const REPORT_KEYS: [&str; 5] = [FOUND, ETAG, LAST_MODIFIED, DIGEST, CAPTURED];

/// What the frontier keeps of a URL's fetches for its revisits, in one
/// metadata value: the counts and dates its policy needs, and the
/// validators and digest of the last fetch, which the worker needs. One
/// value, not a key each, as it is stored with every URL of a crawl that
/// revisits.
///
/// Text form: `fetches changes observed_secs interval_secs last_fetched`,
/// then `|captured|digest|last_modified|etag`, each empty when unknown;
/// the ETag comes last, so that it may hold any character.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevisitState {
    /// Fetches counted, and of those the ones that found a change.
    pub fetches: u32,
    pub changes: u32,
    /// Seconds between those fetches and the fetch before each.
    pub observed_secs: u64,
    /// The interval last chosen (seconds).
    pub interval_secs: u32,
    /// When it was last fetched (UTC epoch seconds; 0: never).
    pub last_fetched: u64,
    /// When the content held was captured (UTC epoch seconds).
    pub captured: Option<u64>,
    /// The payload digest of the content held.
    pub digest: Option<String>,
    /// The validators the last fetch answered.
    pub last_modified: Option<String>,
    pub etag: Option<String>,
}

impl RevisitState {
    /// The text form (type docs).
    #[must_use]
    pub fn encode(&self) -> String {
        let text = |value: &Option<String>| value.clone().unwrap_or_default();
        format!(
            "{} {} {} {} {}|{}|{}|{}|{}",
            self.fetches,
            self.changes,
            self.observed_secs,
            self.interval_secs,
            self.last_fetched,
            self.captured.map(|at| at.to_string()).unwrap_or_default(),
            text(&self.digest),
            text(&self.last_modified),
            text(&self.etag)
        )
    }

    /// Reads the text form; `None` for anything else.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(5, '|');
        let mut counts = parts.next()?.split(' ');
        let mut number = || counts.next()?.parse::<u64>().ok();
        let (fetches, changes) = (number()?, number()?);
        let (observed_secs, interval_secs, last_fetched) = (number()?, number()?, number()?);
        if counts.next().is_some() || changes > fetches {
            return None;
        }
        let optional = |part: Option<&str>| part.filter(|p| !p.is_empty()).map(str::to_owned);
        let captured = match parts.next()? {
            "" => None,
            at => Some(at.parse().ok()?),
        };
        Some(Self {
            fetches: u32::try_from(fetches).ok()?,
            changes: u32::try_from(changes).ok()?,
            observed_secs,
            interval_secs: u32::try_from(interval_secs).ok()?,
            last_fetched,
            captured,
            digest: optional(parts.next()),
            last_modified: optional(parts.next()),
            etag: optional(parts.next()),
        })
    }

    /// The state a URL's metadata holds, if any.
    #[must_use]
    pub fn of<'a, I>(values: I) -> Option<Self>
    where
        I: IntoIterator<Item = &'a String>,
    {
        values.into_iter().next().and_then(|text| Self::parse(text))
    }
}
