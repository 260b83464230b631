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

/// The ETag the last fetch of a URL answered: the frontier keeps it and
/// serves it back, the worker sends it as `If-None-Match`.
pub const ETAG: &str = "frontier.etag";

/// The Last-Modified the last fetch answered, sent as `If-Modified-Since`.
pub const LAST_MODIFIED: &str = "frontier.last_modified";

/// The payload digest (`sha1:` + base32, as WARC writes it) of the last
/// content fetched in full: a fetch with the same digest found no change.
pub const DIGEST: &str = "frontier.digest";

/// When the content of [`DIGEST`] was captured (its WARC response
/// record's date, UTC epoch seconds): what a revisit record refers to.
pub const CAPTURED: &str = "frontier.captured";

/// In a report only: what the fetch found, `changed` or `unchanged` (a
/// 304, or the same digest). The frontier reads it to pick the URL's next
/// due date under the crawl's revisit policy, and never stores it.
pub const FOUND: &str = "frontier.found";

/// The frontier's own record of a URL's fetches under a revisit policy
/// (counts and dates, as text). Written by the frontier alone: what a
/// report carries under this key is ignored.
pub const REVISIT: &str = "frontier.revisit";

/// The keys that exist only for revisits: a URL completed for good keeps
/// none of them.
pub const REVISIT_KEYS: [&str; 6] = [ETAG, LAST_MODIFIED, DIGEST, CAPTURED, FOUND, REVISIT];
