//! The life of one leased URL, a [`LeasedPage`], in three steps the host
//! pipeline (see [`crate::pipeline`]) runs: `prepare` (robots.txt, from
//! the worker's cache, the frontier's shelf or the origin), `fetch` (the
//! request, WARC records, links), `finish` (the outlinks and the URL's
//! own report, which the frontier stores with the last of them, so it
//! never looks finished while a page's outlinks are on their way; see
//! `outlinks`). The shared [`Context`] holds what every page uses.
//!
//! robots.txt read from the origin (the first read of the deployment) is
//! shelved at the frontier for the other workers, its Crawl-delay becomes
//! the queue's delay there, and its sitemaps go out as discovered URLs
//! marked as sitemaps: the frontier deduplicates them, and whichever
//! worker leases one reads it.
//!
//! Outcomes: done (`refetchable_from_date` 0) for a success (a 304 to a
//! conditional request included: see [`crate::revisit`]), a 4xx, a
//! redirect (its target goes out as a discovered URL), a robots refusal or
//! a permanent failure; a transient failure (timeout, connection error,
//! 5xx, 429, robots.txt unavailable) is rescheduled with a doubling backoff
//! up to `max_retries`, counted in the URL's metadata, then done with its
//! reason. 429 and 503 with Retry-After also block the queue until then.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proto::time::Timestamp;

use proto::metadata;
use proto::urlfrontier::UrlInfo;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use url::Url;

pub use crate::config::{WorkerConfig, default_user_agent, product_token};
pub use crate::error::WorkerError;
use crate::fetch::{Fetched, Fetcher};
use crate::frontier_link::{FrontierLink, meta_first, meta_value};
use crate::links::{extract_links, resolve};
use crate::outlinks::{LinkBatch, LinkSink, Links, link_batches, send_links, send_page};
use crate::output::Output;
use crate::pacing::{HostPace, HostTurn};
use crate::report::{CrawlLogEntry, Outcome, Reason};
use crate::revisit::{Capture, validators_of};
use crate::robots::{Lookup, RobotsCache, Verdict};
use crate::seen::SeenCache;
use crate::sitemap::parse_sitemap;
pub use crate::stats::WorkerStats;

/// Now, in the whole UTC epoch seconds the API's dates carry.
pub(crate) fn now_secs() -> u64 {
    Timestamp::now().unix_secs()
}

/// Shared by the loop and its tasks.
pub(crate) struct Context {
    pub(crate) config: WorkerConfig,
    pub(crate) link: FrontierLink,
    fetcher: Fetcher,
    robots: RobotsCache,
    seen: SeenCache,
    output: Option<Arc<Output>>,
    stats: Arc<WorkerStats>,
}

impl Context {
    /// What sending links takes of the worker.
    fn links(&self) -> LinkSink<'_> {
        LinkSink {
            link: &self.link,
            seen: &self.seen,
            stats: &self.stats,
            max_depth: self.config.max_depth,
            max_url_length: self.config.max_url_length,
        }
    }

    pub(crate) fn open(config: WorkerConfig, stats: Arc<WorkerStats>) -> Result<Self, WorkerError> {
        config.validate()?;
        let output = match &config.output {
            Some(dir) => Some(Arc::new(
                Output::open(dir, &config.worker_id, config.warc_max_bytes).map_err(|source| {
                    WorkerError::Output {
                        path: dir.clone(),
                        source,
                    }
                })?,
            )),
            None => None,
        };
        Ok(Self {
            link: match &config.in_process {
                Some(transport) => FrontierLink::in_process(
                    &config.frontier,
                    transport.clone(),
                    config.token.as_deref(),
                )?,
                None => FrontierLink::new(&config.frontier, config.token.as_deref(), &config.tls)?,
            },
            fetcher: Fetcher::new(config.fetch.clone())?,
            robots: RobotsCache::new(
                product_token(&config.fetch.user_agent),
                config.robots_ttl,
                config.robots_unavailable_ttl,
            ),
            seen: SeenCache::new(config.seen_cache),
            output,
            stats,
            config,
        })
    }

    /// Gives the fetches in flight the shutdown grace to finish and
    /// report, abandons the rest (their leases run out), flushes output.
    pub(crate) async fn finish(&self, mut tasks: JoinSet<()>) {
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                abandoned = tasks.len(),
                "shutdown grace over: abandoning fetches in flight (their leases will expire)"
            );
            tasks.shutdown().await;
        }
        if let Some(output) = &self.output {
            let output = Arc::clone(output);
            let flushed = tokio::task::spawn_blocking(move || output.flush()).await;
            if let Ok(Err(error)) = flushed {
                tracing::error!(%error, "flushing output failed");
            }
        }
    }
}

/// A leased URL on its way through its steps, with its crawl log line:
/// [`Self::prepare`], then [`Self::fetch`] unless preparing ended it, then
/// [`Self::finish`]; or, unstarted, given back ([`Self::into_info`]).
pub(crate) struct LeasedPage {
    info: UrlInfo,
    log: CrawlLogEntry,
}

/// What a leased URL needs before its fetch.
pub(crate) struct Prepared {
    /// The URL to fetch, or, with no fetch, the outcome.
    pub(crate) go: Result<Url, Outcome>,
    /// robots.txt's Crawl-delay for its origin (capped), zero when none.
    pub(crate) crawl_delay: Duration,
}

impl LeasedPage {
    /// A URL as served, its log line begun.
    pub(crate) fn new(context: &Context, info: UrlInfo) -> Self {
        let depth: u32 = meta_first(&info.metadata, metadata::DEPTH)
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
        let log = CrawlLogEntry {
            time: now_secs(),
            url: info.url.clone(),
            depth,
            worker: context.config.worker_id.clone(),
            ..CrawlLogEntry::default()
        };
        Self { info, log }
    }

    /// The URL, unstarted, to give back to the frontier.
    pub(crate) fn into_info(self) -> UrlInfo {
        self.info
    }

    /// Everything before the fetch: the URL parsed, robots.txt asked (read
    /// first if the origin is new to the deployment; that read counts as a
    /// request to the host).
    pub(crate) async fn prepare(&mut self, context: &Context, pace: &HostPace) -> Prepared {
        let Ok(url) = Url::parse(&self.info.url) else {
            return Prepared {
                go: Err(Outcome::Done(Reason::InvalidUrl)),
                crawl_delay: Duration::ZERO,
            };
        };
        let lookup = lookup_robots(context, &self.info, &url, pace).await;
        let crawl_delay = lookup
            .robots
            .crawl_delay
            .filter(|delay| delay.is_finite() && *delay > 0.0)
            .map_or(Duration::ZERO, |delay| {
                Duration::from_secs_f32(delay.min(context.config.max_crawl_delay_secs as f32))
            });
        if lookup.fresh {
            on_new_robots(context, &self.info, &url, &lookup.robots, crawl_delay).await;
        }
        let go = match robots_refusal(context, &url, &lookup, &mut self.log) {
            Some(refusal) => Err(refusal),
            None => Ok(url),
        };
        Prepared { go, crawl_delay }
    }

    /// The fetch and what it gives (see [`fetch_leased`]).
    pub(crate) async fn fetch(
        &mut self,
        context: &Context,
        url: &Url,
        turn: HostTurn,
        slot: OwnedSemaphorePermit,
    ) -> Fetch {
        fetch_leased(context, &self.info, url, &mut self.log, turn, slot).await
    }

    /// The last step: the outcome settled and logged, the report sent
    /// until acknowledged.
    pub(crate) async fn finish(self, context: &Context, fetch: Fetch) {
        finish(context, self.info, fetch, self.log).await;
    }
}

/// The URL's last step: its outcome settled and logged, its outlinks and
/// report sent until acknowledged (the report with the last outlinks).
async fn finish(context: &Context, info: UrlInfo, fetch: Fetch, mut log: CrawlLogEntry) {
    let Fetch {
        outcome,
        status,
        capture,
        address,
        answer_ms,
        outlinks,
    } = fetch;
    let Settled {
        reason,
        due,
        mut metadata,
    } = settle(context, &info, outcome);
    metadata.remove(metadata::QUEUE_DELAY_MS);
    metadata.insert(metadata::OUTCOME.into(), meta_value(reason.as_str()));
    if let Some(status) = status {
        metadata.insert(metadata::STATUS.into(), meta_value(status.to_string()));
    }
    if let Some(capture) = &capture {
        capture.report_into(&mut metadata);
    }
    // Where the host answered: the frontier's politeness by address
    // groups the hosts of one server.
    if let Some(address) = address {
        metadata.insert(metadata::ADDRESS.into(), meta_value(address.to_string()));
    }
    // How long it took: the frontier backs off a host that slows down.
    if let Some(ms) = answer_ms {
        metadata.insert(metadata::FETCH_MS.into(), meta_value(ms.to_string()));
    }
    log.outcome = Some(reason);
    log.status = status;
    log.retry_at = (due > 0).then_some(due);
    if let Some(output) = &context.output
        && let Err(error) = output.log(&log)
    {
        tracing::error!(%error, "crawl log write failed");
    }
    let report = UrlInfo { metadata, ..info };
    send_page(&context.links(), outlinks, report, due).await;
    context.stats.reported.notify_one();
}

/// What a URL's report says.
struct Settled {
    /// Why it ended (or is tried again).
    reason: Reason,
    /// When it is due again, UTC epoch seconds; 0: done.
    due: u64,
    /// Its metadata, with the retry count or the failure given up on.
    metadata: BTreeMap<String, proto::urlfrontier::StringList>,
}

/// What to report for an outcome; a retry past the limit is given up.
fn settle(context: &Context, info: &UrlInfo, outcome: Outcome) -> Settled {
    let retries: u32 = meta_first(&info.metadata, metadata::RETRIES)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    let stats = &context.stats;
    let mut metadata = info.metadata.clone();
    match outcome {
        Outcome::Done(reason) => {
            stats.done.fetch_add(1, Ordering::Relaxed);
            Settled {
                reason,
                due: 0,
                metadata,
            }
        }
        Outcome::Retry(reason, at) if retries < context.config.max_retries => {
            stats.retries.fetch_add(1, Ordering::Relaxed);
            let backoff = retry_backoff_secs(context.config.retry_base, retries);
            let due = at.unwrap_or_else(|| now_secs() + backoff).max(1);
            metadata.insert(
                metadata::RETRIES.into(),
                meta_value((retries + 1).to_string()),
            );
            Settled {
                reason,
                due,
                metadata,
            }
        }
        Outcome::Retry(reason, _) => {
            stats.done.fetch_add(1, Ordering::Relaxed);
            metadata.insert(metadata::FAILURE.into(), meta_value(reason.as_str()));
            Settled {
                reason: Reason::GaveUp,
                due: 0,
                metadata,
            }
        }
    }
}

/// Seconds before the next try of a URL that failed `retries` times
/// already: the base (at least a second), doubling per try, capped at a
/// day so a large retry count never overflows or parks a URL for years.
#[must_use]
pub fn retry_backoff_secs(base: Duration, retries: u32) -> u64 {
    base.as_secs()
        .max(1)
        .saturating_mul(1 << retries.min(16))
        .min(24 * 3600)
}

fn request_head(url: &Url, user_agent: &str) -> Vec<u8> {
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or("")),
        None => url.host_str().unwrap_or("").to_owned(),
    };
    format!(
        "GET {target} HTTP/1.1\r\nhost: {host}\r\nuser-agent: {user_agent}\r\naccept-encoding: gzip, deflate, br\r\n\r\n"
    )
    .into_bytes()
}

/// What a fetch came to.
pub(crate) struct Fetch {
    pub(crate) outcome: Outcome,
    /// The HTTP status, when the host answered.
    pub(crate) status: Option<u16>,
    /// What it found of the page, when it reached it (a 2xx or a 304).
    pub(crate) capture: Option<Capture>,
    /// The address the host answered from.
    pub(crate) address: Option<std::net::IpAddr>,
    /// How long the host took to answer, body included.
    pub(crate) answer_ms: Option<u64>,
    /// What it links to, sent with its report.
    pub(crate) outlinks: Vec<LinkBatch>,
}

impl Fetch {
    /// A URL that ended without a request.
    pub(crate) fn unfetched(outcome: Outcome) -> Self {
        Self {
            outcome,
            status: None,
            capture: None,
            address: None,
            answer_ms: None,
            outlinks: Vec::new(),
        }
    }
}

/// A leased URL about to be fetched, as the answer's handling needs it.
struct Page<'a> {
    info: &'a UrlInfo,
    url: &'a Url,
    depth: u32,
    /// For a URL marked as a sitemap, its level in the sitemap tree.
    sitemap_level: Option<u32>,
}

/// The fetch and what it gives: WARC records, outlinks (a sitemap's URLs
/// for a URL marked as a sitemap), the outcome. The fetch slot is let go
/// once the body is read and parsed.
async fn fetch_leased(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    log: &mut CrawlLogEntry,
    turn: HostTurn,
    slot: OwnedSemaphorePermit,
) -> Fetch {
    let depth = log.depth;
    context.stats.in_flight.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("worker_in_flight").increment(1.0);
    let fetch_started = std::time::Instant::now();
    log.time = now_secs();
    let fetched = context
        .fetcher
        .get_unless_unchanged(url, &validators_of(&info.metadata))
        .await;
    let answered_in = fetch_started.elapsed();
    // The host has answered (or the request failed): the next one's turn.
    drop(turn);
    // Let the host's next request go out before this answer is parsed:
    // the pipeline woken by the turn's end would otherwise wait on this
    // thread for the parse and the WARC write.
    tokio::task::yield_now().await;
    metrics::histogram!("worker_fetch_seconds").record(answered_in.as_secs_f64());
    metrics::gauge!("worker_in_flight").decrement(1.0);
    context.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    let answer_ms = fetched
        .is_ok()
        .then(|| u64::try_from(answered_in.as_millis()).unwrap_or(u64::MAX));
    let address = fetched
        .as_ref()
        .ok()
        .and_then(|fetched| fetched.peer)
        .map(|peer| peer.ip());
    let mut outlinks = Vec::new();
    let (outcome, status, capture) = match fetched {
        Ok(fetched) => {
            let page = Page {
                info,
                url,
                depth,
                sitemap_level: meta_first(&info.metadata, metadata::SITEMAP)
                    .and_then(|level| level.parse::<u32>().ok()),
            };
            answered(context, &page, fetched, log, slot, &mut outlinks).await
        }
        Err(error) => {
            drop(slot);
            tracing::info!(url = %url, %error, "fetch failed");
            metrics::counter!("worker_fetches_total", "class" => "failed").increment(1);
            context.stats.failures.fetch_add(1, Ordering::Relaxed);
            log.error = Some(error.to_string());
            let outcome = if error.is_transient() {
                Outcome::Retry(Reason::FetchError, None)
            } else {
                Outcome::Done(Reason::Refused)
            };
            (outcome, None, None)
        }
    };
    log.duration_ms = fetch_started.elapsed().as_millis() as u64;
    Fetch {
        outcome,
        status,
        capture,
        address,
        answer_ms,
        outlinks,
    }
}

/// What an answer leads to, its status, and what it found of the page.
async fn answered(
    context: &Context,
    page: &Page<'_>,
    fetched: Fetched,
    log: &mut CrawlLogEntry,
    slot: OwnedSemaphorePermit,
    outlinks: &mut Vec<LinkBatch>,
) -> (Outcome, Option<u16>, Option<Capture>) {
    let Page {
        info,
        url,
        depth,
        sitemap_level,
    } = *page;
    let capture = matches!(fetched.status, 200..=299 | 304)
        .then(|| Capture::of(url.as_str(), &info.metadata, &fetched, now_secs()));
    record_answer(context, url, &fetched, log, capture.as_ref()).await;
    let unchanged = capture.as_ref().is_some_and(|capture| !capture.changed);
    let outcome = match fetched.status {
        // The frontier holds what an unchanged page links to already.
        304 => Outcome::Done(Reason::NotModified),
        200..=299 if unchanged => {
            drop(slot);
            log.outlinks = Some(0);
            Outcome::Done(Reason::Fetched)
        }
        200..=299 if sitemap_level.is_some() => {
            let found = read_sitemap(context, url, &fetched, sitemap_level.unwrap_or(0));
            drop(slot);
            for (links, level) in found {
                let kind = level.map_or(Links::SitemapPages, Links::Sitemaps);
                outlinks.extend(link_batches(&context.links(), info, url, 0, links, kind));
            }
            Outcome::Done(Reason::Fetched)
        }
        200..=299 => {
            let links = if fetched.is_html() {
                html_outlinks(context, url, &fetched, log)
            } else {
                Vec::new()
            };
            drop(slot);
            log.outlinks = Some(links.len());
            outlinks.extend(link_batches(
                &context.links(),
                info,
                url,
                depth,
                links,
                Links::Page,
            ));
            Outcome::Done(Reason::Fetched)
        }
        300..=399 => {
            drop(slot);
            follow_redirect(context, info, url, depth, &fetched, log, outlinks)
        }
        429 | 503 => {
            drop(slot);
            let until = retry_after(&fetched);
            if let Some(until) = until {
                context
                    .link
                    .block_queue(&info.crawl_id, &info.key, until)
                    .await;
            }
            Outcome::Retry(Reason::ServerBusy, until)
        }
        408 | 500..=599 => Outcome::Retry(Reason::ServerError, None),
        _ => Outcome::Done(Reason::ClientError),
    };
    (outcome, Some(fetched.status), capture)
}

/// A sitemap's pages (sent as depth-1 links) and, below the depth limit,
/// the sitemaps it names (sent marked as sitemaps a level deeper).
fn read_sitemap(
    context: &Context,
    url: &Url,
    fetched: &Fetched,
    level: u32,
) -> Vec<(Vec<String>, Option<u32>)> {
    let Ok(sitemap) = parse_sitemap(&fetched.body) else {
        tracing::info!(sitemap = %url, "unreadable sitemap");
        return Vec::new();
    };
    let resolved = |list: &[String]| -> Vec<String> {
        list.iter().filter_map(|page| resolve(url, page)).collect()
    };
    let mut found = vec![(resolved(&sitemap.pages), None)];
    if level < context.config.max_sitemap_depth {
        found.push((resolved(&sitemap.sitemaps), Some(level + 1)));
    }
    found
}

/// robots.txt of a URL's origin: the worker's cache, else the answer
/// another worker shelved at the frontier while current, else read from
/// the origin (and shelved for the others; the read is a request to the
/// host, so the pacer counts it).
async fn lookup_robots(context: &Context, info: &UrlInfo, url: &Url, pace: &HostPace) -> Lookup {
    let lookup = context
        .robots
        .get_or_load(url, |origin| async move {
            let place = proto::admin::RobotsPlace {
                crawl_id: info.crawl_id.clone(),
                key: info.key.clone(),
                origin: origin.clone(),
            };
            if let Some(kept) = context.link.shelved_robots(place.clone()).await
                && let Some(robots) = shelved_rules(context, &kept)
            {
                return (robots, false);
            }
            let answer = crate::robots::fetch_answer(&context.fetcher, &origin).await;
            if let Ok(read) = &answer {
                let kept = proto::admin::RobotsAnswer {
                    reached: read.is_some(),
                    status: read.as_ref().map_or(0, |(status, _)| u32::from(*status)),
                    body: read
                        .as_ref()
                        .map(|(_, body)| {
                            body[..body.len().min(crate::robots::MAX_ROBOTS_BYTES)].to_vec()
                        })
                        .unwrap_or_default(),
                    fetched_at_ms: now_millis(),
                };
                context.link.shelve_robots(place, kept).await;
            }
            (context.robots.rules_of(&answer), true)
        })
        .await;
    metrics::counter!(
        "worker_robots_lookups_total",
        "result" => if lookup.fresh { "fetched" } else { "cached" }
    )
    .increment(1);
    if lookup.fresh {
        pace.robots_read();
    }
    lookup
}

/// The rules of an answer another worker read, if still current.
fn shelved_rules(
    context: &Context,
    kept: &proto::admin::RobotsAnswer,
) -> Option<crate::robots::OriginRobots> {
    let age = Duration::from_millis(now_millis().saturating_sub(kept.fetched_at_ms));
    let read_at = std::time::Instant::now().checked_sub(age)?;
    let answer = if kept.reached {
        let status = u16::try_from(kept.status).ok()?;
        Ok(Some((status, bytes::Bytes::from(kept.body.clone()))))
    } else {
        Ok(None)
    };
    let robots = context.robots.rules_of(&answer).read_at(read_at);
    context
        .robots
        .is_current(&robots.rules, read_at)
        .then_some(robots)
}

fn now_millis() -> u64 {
    Timestamp::now().unix_millis()
}

/// Why robots.txt keeps the fetch from going ahead, if it does.
fn robots_refusal(
    context: &Context,
    url: &Url,
    lookup: &Lookup,
    log: &mut CrawlLogEntry,
) -> Option<Outcome> {
    match lookup.robots.verdict(url) {
        Verdict::Allowed => None,
        Verdict::Disallowed => {
            context.stats.robots_refused.fetch_add(1, Ordering::Relaxed);
            Some(Outcome::Done(Reason::Robots))
        }
        Verdict::Unavailable(reason) => {
            tracing::info!(url = %url, reason, "robots.txt unavailable; retrying later");
            Some(Outcome::Retry(Reason::RobotsUnavailable, None))
        }
        Verdict::Refused(reason) => {
            tracing::info!(url = %url, reason, "refused by the SSRF guard");
            context.stats.failures.fetch_add(1, Ordering::Relaxed);
            log.error = Some(reason.to_string());
            Some(Outcome::Done(Reason::Refused))
        }
    }
}

/// Counts an answer and writes its WARC records: a revisit record for a
/// page found as captured before.
async fn record_answer(
    context: &Context,
    url: &Url,
    fetched: &Fetched,
    log: &mut CrawlLogEntry,
    capture: Option<&Capture>,
) {
    let stats = &context.stats;
    stats.by_class[usize::from(fetched.status / 100).min(5)].fetch_add(1, Ordering::Relaxed);
    stats
        .bytes
        .fetch_add(fetched.body.len() as u64, Ordering::Relaxed);
    let class = match fetched.status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics::counter!("worker_fetches_total", "class" => class).increment(1);
    metrics::counter!("worker_bytes_total").increment(fetched.body.len() as u64);
    log.content_type = fetched.media_type();
    log.bytes = Some(fetched.body.len() as u64);
    log.truncated = Some(fetched.truncated);
    if let Some(output) = &context.output {
        let head = request_head(url, &context.config.fetch.user_agent);
        // Written in place: a thread hand-off per page cost more than the
        // write, which goes to the page cache.
        let written = match capture {
            Some(Capture {
                revisit: Some(revisit),
                ..
            }) => output.write_revisit(url.as_str(), &head, fetched, revisit),
            Some(Capture {
                digest: Some(digest),
                captured: Some(captured),
                ..
            }) => output.write_response(url.as_str(), &head, fetched, digest, *captured),
            _ => output
                .write_exchange(url.as_str(), &head, fetched)
                .map(drop),
        };
        if let Err(error) = written {
            tracing::error!(%error, "WARC write failed");
        }
    }
    if let Some(capture) = capture {
        log.digest.clone_from(&capture.digest);
        log.revisit = Some(!capture.changed);
    }
}

/// A 3xx answer: its target goes out as a discovered URL carrying the
/// length of the chain, unless the chain is already too long.
fn follow_redirect(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    depth: u32,
    fetched: &Fetched,
    log: &mut CrawlLogEntry,
    outlinks: &mut Vec<LinkBatch>,
) -> Outcome {
    let target = fetched
        .header("location")
        .and_then(|location| resolve(url, location));
    log.redirect.clone_from(&target);
    let hops = meta_first(&info.metadata, metadata::REDIRECT_HOPS)
        .and_then(|hops| hops.parse::<u32>().ok())
        .unwrap_or(0)
        .saturating_add(1);
    match target {
        Some(_) if hops > context.config.max_redirects => {
            log.error = Some(format!(
                "more than {} redirects in a row",
                context.config.max_redirects
            ));
            Outcome::Done(Reason::TooManyRedirects)
        }
        Some(target) => {
            outlinks.extend(link_batches(
                &context.links(),
                info,
                url,
                depth,
                vec![target],
                Links::Redirect(hops),
            ));
            Outcome::Done(Reason::Redirect)
        }
        None => Outcome::Done(Reason::Redirect),
    }
}

/// A Retry-After header as a UTC epoch second (seconds or an HTTP date).
fn retry_after(fetched: &Fetched) -> Option<u64> {
    let value = fetched.header("retry-after")?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(now_secs() + secs.min(24 * 3600));
    }
    httpdate::parse_http_date(value).ok().map(|time| {
        Timestamp::from_system_time(time)
            .unix_secs()
            .min(now_secs() + 24 * 3600)
    })
}

fn html_outlinks(
    context: &Context,
    url: &Url,
    fetched: &Fetched,
    log: &mut CrawlLogEntry,
) -> Vec<String> {
    match extract_links(&fetched.body, url, context.config.links) {
        Ok(found) => {
            log.noindex = found.noindex;
            found.links
        }
        Err(error) => {
            tracing::info!(url = %url, %error, "unparseable HTML");
            Vec::new()
        }
    }
}

/// First read of an origin's robots.txt in the deployment: its
/// Crawl-delay becomes the queue's delay at the frontier, and its sitemaps
/// (or `/sitemap.xml` when it names none) go to the frontier marked as
/// sitemaps.
async fn on_new_robots(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    robots: &crate::robots::OriginRobots,
    crawl_delay: Duration,
) {
    if !crawl_delay.is_zero() {
        context
            .link
            .set_queue_delay(&info.crawl_id, &info.key, crawl_delay)
            .await;
    }
    if !context.config.sitemaps {
        return;
    }
    let sitemaps: Vec<String> = if robots.sitemaps.is_empty() {
        vec![format!(
            "{}/sitemap.xml",
            url.origin().ascii_serialization()
        )]
    } else {
        robots.sitemaps.clone()
    };
    send_links(&context.links(), info, url, sitemaps, Links::Sitemaps(0)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_doubling_from_the_base_up_to_a_day() {
        let base = Duration::from_secs(30);
        let schedule: Vec<u64> = (0..4).map(|r| retry_backoff_secs(base, r)).collect();
        assert_eq!(schedule, vec![30, 60, 120, 240]);
        assert_eq!(retry_backoff_secs(Duration::ZERO, 0), 1, "never zero");
        assert_eq!(retry_backoff_secs(base, 40), 24 * 3600, "capped");
        assert_eq!(
            retry_backoff_secs(Duration::from_secs(u64::MAX), 3),
            24 * 3600
        );
    }

    #[test]
    fn frontier_retries_double_from_100_ms_to_10_s() {
        use crate::frontier_link::retry_delay;
        assert_eq!(retry_delay(0), Duration::from_millis(100));
        assert_eq!(retry_delay(1), Duration::from_millis(200));
        assert_eq!(retry_delay(6), Duration::from_millis(6400));
        assert_eq!(retry_delay(7), Duration::from_secs(10));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn the_robots_token_is_the_user_agents_first_word() {
        assert_eq!(product_token("frontierbot/0.1 (+https://x)"), "frontierbot");
        assert_eq!(product_token("MyBot"), "MyBot");
    }
}
