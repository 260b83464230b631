//! The lease loop and what happens to one leased URL.
//!
//! The loop keeps at most `concurrency` fetches in flight: it asks for as
//! many URLs as there are free slots, and backs off (50 ms doubling to
//! 1 s) when the frontier has none. Each URL: robots.txt (Crawl-delay goes
//! to the frontier as the queue's delay; Sitemap lines are read), fetch,
//! WARC records, links, then the outlinks batch, acknowledged, and only
//! then the URL's own report, so the frontier never looks finished while a
//! page's outlinks are on their way.
//!
//! Outcomes: done (`refetchable_from_date` 0) for a success, a 4xx, a
//! redirect (its target goes out as a discovered URL), a robots refusal or
//! a permanent failure; a transient failure (timeout, connection error,
//! 5xx, 429, robots.txt unavailable) is rescheduled with a doubling backoff
//! up to `max_retries`, counted in the URL's metadata, then done with its
//! reason. 429 and 503 with Retry-After also block the queue until then.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proto::metadata;
use proto::urlfrontier::{GetParams, UrlInfo, get_params};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use url::Url;

use crate::fetch::{FetchConfig, FetchError, Fetched, Fetcher};
use crate::frontier_link::{FrontierLink, LinkError, meta_first, meta_value};
use crate::links::{LinkOptions, extract_links, resolve};
use crate::output::Output;
use crate::report::{CrawlLogEntry, Outcome, Reason};
use crate::robots::{RobotsCache, Verdict};
use crate::sitemap::parse_sitemap;

/// Everything a worker is told.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The frontier's gRPC address.
    pub frontier: String,
    /// Sent as `authorization: Bearer TOKEN` on every call, for a frontier
    /// that requires its token on every call.
    pub token: Option<String>,
    /// Lease from this crawl only; `None`: any crawl.
    pub crawl: Option<String>,
    /// Most fetches in flight.
    pub concurrency: usize,
    /// Most URLs of one queue (host) in flight.
    pub per_host: u32,
    /// Lease length asked for, seconds.
    pub lease_secs: u32,
    /// WARC files and crawl log go here, when set.
    pub output: Option<PathBuf>,
    /// Names this worker's output files.
    pub worker_id: String,
    /// HTTP settings.
    pub fetch: FetchConfig,
    /// Transient failures retried this many times before giving up.
    pub max_retries: u32,
    /// Most redirects followed in a row: the target of one more is not
    /// sent (a chain of ever new URLs would otherwise run on).
    pub max_redirects: u32,
    /// First retry after this long; doubling after.
    pub retry_base: Duration,
    /// Crawl-delay values above this are capped.
    pub max_crawl_delay_secs: u32,
    /// robots.txt kept this long.
    pub robots_ttl: Duration,
    /// An unavailable robots.txt is asked again after this long.
    pub robots_unavailable_ttl: Duration,
    /// Link extraction rules.
    pub links: LinkOptions,
    /// WARC files rotate past this size.
    pub warc_max_bytes: u64,
    /// In-flight fetches get this long to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Read sitemaps (robots.txt Sitemap lines, else /sitemap.xml).
    pub sitemaps: bool,
    /// Sitemap index levels followed.
    pub max_sitemap_depth: u32,
}

impl WorkerConfig {
    /// Defaults for a frontier address.
    #[must_use]
    pub fn new(frontier: &str) -> Self {
        Self {
            frontier: frontier.to_owned(),
            token: None,
            crawl: None,
            concurrency: 64,
            per_host: 1,
            lease_secs: 120,
            output: None,
            worker_id: format!("worker-{}", std::process::id()),
            fetch: FetchConfig {
                user_agent: default_user_agent(),
                timeout: Duration::from_secs(30),
                max_body_bytes: 10 * 1024 * 1024,
                max_inflight_bytes: 256 * 1024 * 1024,
                allow_private: false,
                proxy: None,
            },
            max_retries: 3,
            max_redirects: 10,
            retry_base: Duration::from_secs(30),
            max_crawl_delay_secs: 30,
            robots_ttl: Duration::from_secs(24 * 3600),
            robots_unavailable_ttl: Duration::from_secs(600),
            links: LinkOptions::default(),
            warc_max_bytes: 1 << 30,
            shutdown_grace: Duration::from_secs(10),
            sitemaps: true,
            max_sitemap_depth: 2,
        }
    }
}

/// The default User-Agent.
#[must_use]
pub fn default_user_agent() -> String {
    format!(
        "frontierbot/{} (+https://example.invalid/crawl-frontier)",
        env!("CARGO_PKG_VERSION")
    )
}

/// The robots.txt product token of a User-Agent: its first word, before
/// any `/` version.
#[must_use]
pub fn product_token(user_agent: &str) -> &str {
    user_agent
        .split(|c: char| c == '/' || c.is_whitespace())
        .next()
        .unwrap_or(user_agent)
}

/// Why a worker cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The frontier address is unusable.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The HTTP client could not be built.
    #[error("cannot set up HTTP: {0}")]
    Fetch(#[from] FetchError),
    /// The output directory cannot be written.
    #[error("cannot write output in {path}: {source}")]
    Output {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Counters of a worker's work, for progress lines and summaries.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Fetches answered, by status class (index 1..=5).
    pub by_class: [AtomicU64; 6],
    /// Fetches that got no answer.
    pub failures: AtomicU64,
    /// Body bytes read.
    pub bytes: AtomicU64,
    /// URLs reported done.
    pub done: AtomicU64,
    /// URLs rescheduled after a transient failure.
    pub retries: AtomicU64,
    /// URLs refused by robots.txt.
    pub robots_refused: AtomicU64,
    /// Outlinks the frontier took as new.
    pub new_outlinks: AtomicU64,
    /// Fetches in flight now.
    pub in_flight: AtomicU64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Shared by the loop and its tasks.
struct Context {
    config: WorkerConfig,
    link: FrontierLink,
    fetcher: Fetcher,
    robots: RobotsCache,
    output: Option<Arc<Output>>,
    stats: Arc<WorkerStats>,
}

impl Context {
    fn open(config: WorkerConfig, stats: Arc<WorkerStats>) -> Result<Self, WorkerError> {
        if config.concurrency == 0 || config.per_host == 0 {
            return Err(WorkerError::Config(
                "--concurrency and --per-host must be at least 1".into(),
            ));
        }
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
            link: FrontierLink::new(&config.frontier, config.token.as_deref())?,
            fetcher: Fetcher::new(config.fetch.clone())?,
            robots: RobotsCache::new(
                product_token(&config.fetch.user_agent),
                config.robots_ttl,
                config.robots_unavailable_ttl,
            ),
            output,
            stats,
            config,
        })
    }

    /// Gives the fetches in flight the shutdown grace to finish and
    /// report, abandons the rest (their leases run out), flushes output.
    async fn finish(&self, mut tasks: JoinSet<()>) {
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

/// Runs until `shutdown` completes: stops leasing, gives fetches in
/// flight `shutdown_grace` to finish and report, flushes output. URLs
/// abandoned then come back to some worker when their leases run out.
pub async fn run(
    config: WorkerConfig,
    stats: Arc<WorkerStats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let context = Arc::new(Context::open(config, stats)?);
    let slots = Arc::new(Semaphore::new(context.config.concurrency));
    let mut tasks = JoinSet::new();
    let mut idle_rounds = 0_u32;
    tokio::pin!(shutdown);
    loop {
        while let Some(done) = tasks.try_join_next() {
            if let Err(error) = done {
                tracing::error!(%error, "a fetch task failed");
            }
        }
        let free = slots.available_permits();
        if free == 0 {
            tokio::select! {
                _ = &mut shutdown => break,
                permit = slots.acquire() => drop(permit),
            }
            continue;
        }
        let params = GetParams {
            max_urls_per_queue: context.config.per_host,
            max_queues: u32::try_from(free).unwrap_or(u32::MAX),
            key: String::new(),
            delay_requestable: context.config.lease_secs,
            item: context.config.crawl.clone().map(get_params::Item::CrawlId),
        };
        let leased = tokio::select! {
            _ = &mut shutdown => break,
            leased = context.link.lease(params) => leased,
        };
        let infos = match leased {
            Ok(infos) => infos,
            Err(status) => {
                tracing::warn!(%status, "GetURLs failed; retrying");
                idle_rounds = idle_rounds.saturating_add(1);
                tokio::select! {
                    _ = &mut shutdown => break,
                    () = tokio::time::sleep(crate::frontier_link::retry_delay(idle_rounds)) => {}
                }
                continue;
            }
        };
        if infos.is_empty() {
            // Nothing due: wait a little longer each time, or until a fetch
            // ends (its outlinks may be due at once).
            idle_rounds = idle_rounds.saturating_add(1);
            let pause = Duration::from_millis((25_u64 << idle_rounds.min(6)).min(1000));
            tokio::select! {
                _ = &mut shutdown => break,
                () = tokio::time::sleep(pause) => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
            continue;
        }
        idle_rounds = 0;
        for info in infos {
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                permit = Arc::clone(&slots).acquire_owned() => permit,
            };
            let Ok(permit) = permit else { break };
            let context = Arc::clone(&context);
            tasks.spawn(async move {
                context.stats.in_flight.fetch_add(1, Ordering::Relaxed);
                metrics::gauge!("worker_in_flight").increment(1.0);
                process(&context, info).await;
                metrics::gauge!("worker_in_flight").decrement(1.0);
                context.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
                drop(permit);
            });
        }
    }
    tracing::info!(in_flight = tasks.len(), "stopping: no more leases");
    context.finish(tasks).await;
    Ok(())
}

async fn process(context: &Context, info: UrlInfo) {
    let depth: u32 = meta_first(&info.metadata, metadata::DEPTH)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    let started = std::time::Instant::now();
    let mut log = CrawlLogEntry {
        time: now_secs(),
        url: info.url.clone(),
        depth,
        worker: context.config.worker_id.clone(),
        ..CrawlLogEntry::default()
    };
    let (outcome, status) = match Url::parse(&info.url) {
        Err(_) => (Outcome::Done(Reason::InvalidUrl), None),
        Ok(url) => fetch_and_parse(context, &info, &url, depth, &mut log).await,
    };
    let (reason, due, mut metadata) = settle(context, &info, outcome);
    metadata.insert(metadata::OUTCOME.into(), meta_value(reason.as_str()));
    if let Some(status) = status {
        metadata.insert(metadata::STATUS.into(), meta_value(status.to_string()));
    }
    log.outcome = Some(reason);
    log.status = status;
    log.duration_ms = started.elapsed().as_millis() as u64;
    log.retry_at = (due > 0).then_some(due);
    if let Some(output) = &context.output
        && let Err(error) = output.log(&log)
    {
        tracing::error!(%error, "crawl log write failed");
    }
    let report = UrlInfo { metadata, ..info };
    context.link.put_known(report, due).await;
}

/// What to report for an outcome: the reason, the next fetch date (0:
/// done) and the URL's metadata; a retry past the limit is given up.
fn settle(
    context: &Context,
    info: &UrlInfo,
    outcome: Outcome,
) -> (Reason, u64, HashMap<String, proto::urlfrontier::StringList>) {
    let retries: u32 = meta_first(&info.metadata, metadata::RETRIES)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    let stats = &context.stats;
    let mut metadata = info.metadata.clone();
    match outcome {
        Outcome::Done(reason) => {
            stats.done.fetch_add(1, Ordering::Relaxed);
            (reason, 0, metadata)
        }
        Outcome::Retry(reason, at) if retries < context.config.max_retries => {
            stats.retries.fetch_add(1, Ordering::Relaxed);
            let backoff = retry_backoff_secs(context.config.retry_base, retries);
            let due = at.unwrap_or_else(|| now_secs() + backoff).max(1);
            metadata.insert(
                metadata::RETRIES.into(),
                meta_value((retries + 1).to_string()),
            );
            (reason, due, metadata)
        }
        Outcome::Retry(reason, _) => {
            stats.done.fetch_add(1, Ordering::Relaxed);
            metadata.insert(metadata::FAILURE.into(), meta_value(reason.as_str()));
            (Reason::GaveUp, 0, metadata)
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

async fn fetch_and_parse(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    depth: u32,
    log: &mut CrawlLogEntry,
) -> (Outcome, Option<u16>) {
    if let Some(refusal) = ask_robots(context, info, url, log).await {
        return (refusal, None);
    }
    let fetch_started = std::time::Instant::now();
    let fetched = context.fetcher.get(url).await;
    metrics::histogram!("worker_fetch_seconds").record(fetch_started.elapsed().as_secs_f64());
    let fetched = match fetched {
        Ok(fetched) => fetched,
        Err(error) => {
            tracing::info!(url = %url, %error, "fetch failed");
            metrics::counter!("worker_fetches_total", "class" => "failed").increment(1);
            context.stats.failures.fetch_add(1, Ordering::Relaxed);
            log.error = Some(error.to_string());
            return if error.is_transient() {
                (Outcome::Retry(Reason::FetchError, None), None)
            } else {
                (Outcome::Done(Reason::Refused), None)
            };
        }
    };
    record_answer(context, url, &fetched, log).await;
    let outcome = match fetched.status {
        200..=299 => {
            let outlinks = if fetched.is_html() {
                html_outlinks(context, url, &fetched, log)
            } else {
                Vec::new()
            };
            log.outlinks = Some(outlinks.len());
            send_outlinks(context, info, url, depth, outlinks).await;
            Outcome::Done(Reason::Fetched)
        }
        300..=399 => follow_redirect(context, info, url, depth, &fetched, log).await,
        429 | 503 => {
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
    (outcome, Some(fetched.status))
}

/// robots.txt's answer for `url` (read first if the origin is new): `None`
/// when the fetch may go ahead, else the outcome without it.
async fn ask_robots(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    log: &mut CrawlLogEntry,
) -> Option<Outcome> {
    let lookup = context.robots.get(&context.fetcher, url).await;
    metrics::counter!(
        "worker_robots_lookups_total",
        "result" => if lookup.fresh { "fetched" } else { "cached" }
    )
    .increment(1);
    if lookup.fresh {
        on_new_robots(context, info, url, &lookup.robots).await;
    }
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

/// Counts an answer and writes its WARC records.
async fn record_answer(context: &Context, url: &Url, fetched: &Fetched, log: &mut CrawlLogEntry) {
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
        let output = Arc::clone(output);
        let head = request_head(url, &context.config.fetch.user_agent);
        let target = url.to_string();
        let copy = fetched.clone();
        match tokio::task::spawn_blocking(move || output.write_exchange(&target, &head, &copy))
            .await
        {
            Ok(Ok(digest)) => log.digest = Some(digest),
            Ok(Err(error)) => tracing::error!(%error, "WARC write failed"),
            Err(error) => tracing::error!(%error, "WARC writer panicked"),
        }
    }
}

/// A 3xx answer: its target goes out as a discovered URL carrying the
/// length of the chain, unless the chain is already too long.
async fn follow_redirect(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    depth: u32,
    fetched: &Fetched,
    log: &mut CrawlLogEntry,
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
            send_links(context, info, url, depth, vec![target], Some(hops)).await;
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
    httpdate::parse_http_date(value)
        .ok()
        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs().min(now_secs() + 24 * 3600))
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

async fn send_outlinks(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    depth: u32,
    outlinks: Vec<String>,
) {
    send_links(context, info, url, depth, outlinks, None).await;
}

/// Sends links found at `url`; a redirect's target carries the length of
/// the chain that led to it.
async fn send_links(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    depth: u32,
    links: Vec<String>,
    redirect_hops: Option<u32>,
) {
    if links.is_empty() {
        return;
    }
    let items: Vec<UrlInfo> = links
        .into_iter()
        .map(|link| {
            let mut metadata = HashMap::from([
                (
                    metadata::DEPTH.to_owned(),
                    meta_value((depth + 1).to_string()),
                ),
                (metadata::PARENT.to_owned(), meta_value(url.as_str())),
            ]);
            if let Some(hops) = redirect_hops {
                metadata.insert(
                    metadata::REDIRECT_HOPS.to_owned(),
                    meta_value(hops.to_string()),
                );
            }
            UrlInfo {
                url: link,
                key: String::new(),
                metadata,
                crawl_id: info.crawl_id.clone(),
            }
        })
        .collect();
    let new = context.link.put_outlinks(url.to_string(), items).await;
    context
        .stats
        .new_outlinks
        .fetch_add(new as u64, Ordering::Relaxed);
}

/// First contact with an origin's robots.txt: its Crawl-delay becomes the
/// queue's delay at the frontier, and its sitemaps are read.
async fn on_new_robots(
    context: &Context,
    info: &UrlInfo,
    url: &Url,
    robots: &crate::robots::OriginRobots,
) {
    if let Some(delay) = robots.crawl_delay
        && delay > 0.0
    {
        let secs = (delay.ceil() as u32).min(context.config.max_crawl_delay_secs);
        context
            .link
            .set_delay(&info.crawl_id, &info.key, secs)
            .await;
    }
    if !context.config.sitemaps {
        return;
    }
    let mut pending: Vec<(String, u32)> = if robots.sitemaps.is_empty() {
        vec![(
            format!("{}/sitemap.xml", url.origin().ascii_serialization()),
            0,
        )]
    } else {
        robots.sitemaps.iter().map(|s| (s.clone(), 0)).collect()
    };
    let mut read = 0;
    while let Some((sitemap_url, level)) = pending.pop() {
        // A bound on sitemaps read per origin, whatever the index says.
        read += 1;
        if read > 100 {
            break;
        }
        let Ok(parsed_url) = Url::parse(&sitemap_url) else {
            continue;
        };
        let Ok(fetched) = context.fetcher.get(&parsed_url).await else {
            continue;
        };
        if !(200..300).contains(&fetched.status) {
            continue;
        }
        let Ok(sitemap) = parse_sitemap(&fetched.body) else {
            tracing::info!(sitemap = %sitemap_url, "unreadable sitemap");
            continue;
        };
        if level < context.config.max_sitemap_depth {
            pending.extend(sitemap.sitemaps.into_iter().map(|s| (s, level + 1)));
        }
        let pages: Vec<String> = sitemap
            .pages
            .iter()
            .filter_map(|page| resolve(&parsed_url, page))
            .collect();
        // Sitemap pages are one hop from the crawl's start (depth 1).
        for chunk in pages.chunks(1000) {
            send_outlinks(context, info, &parsed_url, 0, chunk.to_vec()).await;
        }
    }
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
