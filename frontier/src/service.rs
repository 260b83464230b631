//! The frontier as one object: ingest, scheduler, filter rebuilds and crawl
//! progress, behind the operations the gRPC layer (and the embedded `crawl`
//! binary) call. Everything here is synchronous; async callers run it on
//! blocking threads, except puts, which they may take in steps that never
//! block (`prepare_*`, then [`Ingest::submit`] and [`Ingest::committed`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use bloom_core::{RebuildReport, SetHealth};

use crate::ingest::{
    DedupMode, Discovered, Ingest, IngestError, Known, ObservedFalsePositives, Outcome,
    PreparedWrite, UrlCheck,
};
use crate::record::UrlRecord;
use crate::robots_shelf::RobotsShelf;
use crate::scheduler::{QueueCounts, Scheduler, ServeRequest, Served};
use crate::scope::SkipReason;
use crate::store::{Store, StoreError};
use crate::time::Timestamp;

/// The crawl an empty crawl ID means.
pub const DEFAULT_CRAWL: &str = "DEFAULT";

/// Maps the API's empty crawl ID to [`DEFAULT_CRAWL`].
#[must_use]
pub fn crawl_or_default(crawl: &str) -> &str {
    if crawl.is_empty() {
        DEFAULT_CRAWL
    } else {
        crawl
    }
}

pub use crate::config::{
    DEFAULT_MAX_CRAWLS, DEFAULT_MAX_LEASE_SECS, DEFAULT_MAX_URLS_PER_GET, DEFAULT_MIN_FREE_BYTES,
    DEFAULT_ROBOTS_SHELF_BYTES, FrontierConfig,
};

/// What went wrong, in terms the API can answer with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontierError {
    /// Storage or ingest failed; nothing of the request was acknowledged.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The request is malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The thing asked about does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The frontier is shutting down.
    #[error("the frontier is shutting down")]
    ShuttingDown,
    /// A change is stored here but not on every copy in sync of its
    /// partition, so it is not acknowledged.
    #[error("stored here but not on every copy in sync: {0}")]
    NotReplicated(#[from] crate::ingest::NotReplicated),
    /// A thread of the frontier could not start.
    #[error("cannot start the filter rebuild thread: {0}")]
    Thread(std::io::Error),
    /// A write would start a crawl past the frontier's limit.
    #[error(
        "crawl {crawl:?} cannot be started: this frontier holds its limit of {limit} crawls \
         (--max-crawls); nothing of it was stored. Delete a crawl (DeleteCrawl) or raise the limit"
    )]
    TooManyCrawls {
        /// The crawl refused.
        crawl: String,
        /// The limit.
        limit: usize,
    },
}

impl From<StoreError> for FrontierError {
    fn from(error: StoreError) -> Self {
        FrontierError::Ingest(IngestError::Store(error))
    }
}

impl From<bloom_core::FilterError> for FrontierError {
    fn from(error: bloom_core::FilterError) -> Self {
        FrontierError::Ingest(IngestError::Filter(error))
    }
}

/// Events per second over the last minute, in one-second buckets.
#[derive(Debug, Default)]
struct RateWindow {
    // (second, count), oldest first, at most 60.
    buckets: VecDeque<(u64, u64)>,
}

impl RateWindow {
    fn add(&mut self, now_secs: u64, count: u64) {
        if count == 0 {
            return;
        }
        match self.buckets.back_mut() {
            Some((second, total)) if *second == now_secs => *total += count,
            _ => self.buckets.push_back((now_secs, count)),
        }
        self.expire(now_secs);
    }

    fn expire(&mut self, now_secs: u64) {
        while self
            .buckets
            .front()
            .is_some_and(|(second, _)| *second + 60 <= now_secs)
        {
            self.buckets.pop_front();
        }
    }

    fn per_second(&mut self, now_secs: u64) -> f64 {
        self.expire(now_secs);
        self.buckets.iter().map(|(_, count)| *count).sum::<u64>() as f64 / 60.0
    }
}

#[derive(Debug, Default)]
struct CrawlActivity {
    skipped: HashMap<SkipReason, u64>,
    // Reports by the `outcome` their metadata names (a worker's word for
    // how the fetch ended), for the dashboard's errors by class. Clients
    // name them, so past a few dozen names the rest count as "other".
    reported: BTreeMap<String, u64>,
    discovered: RateWindow,
    leased: RateWindow,
    completed: RateWindow,
}

impl CrawlActivity {
    /// Per second over the last minute, as of `secs`.
    fn rates(&mut self, secs: u64) -> Rates {
        Rates {
            discovered: self.discovered.per_second(secs),
            leased: self.leased.per_second(secs),
            completed: self.completed.per_second(secs),
        }
    }
}

/// Outcome names counted apart per crawl; more are counted as "other".
const MAX_OUTCOME_NAMES: usize = 32;

/// Whether a report's outcome can be counted under its own name: a short
/// word of lower-case letters, digits and `_`, `-`, `.` (what a crawler
/// names a fetch's end). Anything else, which only a client up to no good
/// sends, counts as "other", so that no client text reaches an operator's
/// screen as a class name.
fn is_outcome_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b))
}

/// A crawl's progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// Counts over the crawl's queues.
    pub counts: QueueCounts,
    /// Not completed and due by now (leased ones left out).
    pub due_now: u64,
    /// Not completed and due later.
    pub scheduled_later: u64,
    /// Not completed, not leased, due within the next hour, and day.
    pub due_next_hour: u64,
    pub due_next_day: u64,
    /// The earliest due date after now (UTC epoch seconds; 0: none).
    pub next_due_at: u64,
    /// The crawl's revisit policy, and whether it is its own.
    pub revisit: (crate::revisit::Policy, bool),
    /// URLs refused since start-up, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Per second over the last minute.
    pub rates: Rates,
}

/// A crawl's rates, per second over the last minute.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// URLs stored.
    pub discovered: f64,
    /// URLs leased.
    pub leased: f64,
    /// URLs completed.
    pub completed: f64,
}

/// What the frontier knows of one partition beyond its filter's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionFigures {
    /// Keys the store holds.
    pub stored: u64,
    /// What the filter got wrong, as the store showed.
    pub observed: ObservedFalsePositives,
}

/// Filter health with the figures only the frontier knows.
#[derive(Debug, Clone)]
pub struct FilterReport {
    /// The filters' own figures.
    pub set: SetHealth,
    /// Per partition, in partition order.
    pub partitions: Vec<PartitionFigures>,
    /// The rebuild threshold.
    pub rebuild_fill_threshold: f64,
    /// The target FP rate.
    pub target_fp_rate: f64,
    /// The dedup mode.
    pub dedup: DedupMode,
}

/// Which stored URLs a listing or count takes.
#[derive(Debug, Clone, Default)]
pub struct UrlFilter {
    /// Only this queue's.
    pub queue: Option<String>,
    /// Only URLs containing this text.
    pub substring: Option<String>,
    /// Compare without regard to case.
    pub ignore_case: bool,
}

impl UrlFilter {
    /// A filter; the substring is lower-cased once when case is ignored.
    #[must_use]
    pub fn new(queue: Option<String>, substring: Option<String>, ignore_case: bool) -> Self {
        Self {
            queue,
            substring: substring.map(|s| if ignore_case { s.to_lowercase() } else { s }),
            ignore_case,
        }
    }

    fn matches(&self, url: &str, record: &UrlRecord) -> bool {
        if self.queue.as_ref().is_some_and(|q| *q != record.queue_key) {
            return false;
        }
        match &self.substring {
            None => true,
            Some(needle) if self.ignore_case => url.to_lowercase().contains(needle.as_str()),
            Some(needle) => url.contains(needle.as_str()),
        }
    }
}

/// What the frontier knows of one URL.
#[derive(Debug, Clone)]
pub struct UrlStatus {
    /// The canonical URL.
    pub canonical: String,
    /// Its stored record.
    pub record: UrlRecord,
}

impl From<crate::robots_shelf::ShelfError> for FrontierError {
    fn from(error: crate::robots_shelf::ShelfError) -> Self {
        Self::InvalidArgument(error.to_string())
    }
}

/// The frontier as the server's tasks share it: the last of them to let
/// go hands it back (see [`crate::handback`]) for [`Frontier::shutdown`].
pub type SharedFrontier = std::sync::Arc<crate::handback::Handback<Frontier>>;

/// The frontier.
pub struct Frontier {
    ingest: Arc<Ingest>,
    scheduler: Arc<Scheduler>,
    config: FrontierConfig,
    activity: Mutex<HashMap<String, CrawlActivity>>,
    rebuild_signal: Option<SyncSender<()>>,
    rebuild_thread: Option<JoinHandle<()>>,
    // Rebuilds run one at a time: triggered ones and asked-for ones.
    rebuild_lock: Arc<Mutex<()>>,
    robots: RobotsShelf,
    // The crawls held, or admitted by a write not yet committed (the
    // scheduler knows a crawl once its first URL is).
    crawl_names: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Frontier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontier")
            .field("data_dir", &self.config.data_dir)
            .finish()
    }
}

impl Frontier {
    /// Opens the store, loads or rebuilds the filters, loads the queues.
    pub fn open(mut config: FrontierConfig) -> Result<Self, FrontierError> {
        // A new store under domain politeness partitions by domain, so that
        // one node serves a domain's queues and keeps its gap.
        config.filters.partition_by = config.politeness.partitioning();
        let store = Store::open_with(
            &config.data_dir,
            crate::store::StoreOptions {
                cache_bytes: config.cache_bytes,
                min_free_bytes: config.min_free_bytes,
            },
        )?;
        let mut scheduler = None;
        let default_delay = config.default_delay;
        let politeness = config.politeness;
        let ingest = Ingest::open_with_hook(
            store,
            config.filters,
            config.dedup,
            config.max_url_length,
            |store| {
                let loaded = Arc::new(Scheduler::load_polite(
                    Arc::clone(store),
                    default_delay,
                    politeness,
                )?);
                scheduler = Some(Arc::clone(&loaded));
                Ok(Some(Box::new(move |ops, applied| {
                    loaded.on_commit(ops, applied);
                })))
            },
        )?
        .with_max_metadata_bytes(config.max_metadata_bytes)
        .with_default_revisit(config.revisit);
        let scheduler = scheduler.ok_or(FrontierError::ShuttingDown)?;
        let ingest = Arc::new(ingest);
        let rebuild_lock = Arc::new(Mutex::new(()));
        // One pending signal is enough: the rebuild thread looks at every
        // partition each time it wakes.
        let (signal, wakeups) = mpsc::sync_channel::<()>(1);
        let rebuild_thread = {
            let ingest = Arc::clone(&ingest);
            let lock = Arc::clone(&rebuild_lock);
            let threshold = config.filters.rebuild_fill;
            std::thread::Builder::new()
                .name("filter-rebuild".into())
                .spawn(move || {
                    while wakeups.recv().is_ok() {
                        let _one_at_a_time = lock.lock().unwrap_or_else(PoisonError::into_inner);
                        match ingest.rebuild_full_partitions(threshold) {
                            Ok(reports) => {
                                metrics::counter!("frontier_filter_rebuilds_total")
                                    .increment(reports.len() as u64);
                                for report in reports {
                                    tracing::info!(
                                        partition = report.partition,
                                        bits_before = report.bits_before,
                                        bits_after = report.bits_after,
                                        keys = report.keys_fed,
                                        ms = report.duration.as_millis() as u64,
                                        "filter rebuilt"
                                    );
                                }
                            }
                            Err(error) => tracing::error!(%error, "filter rebuild failed"),
                        }
                    }
                })
                .map_err(FrontierError::Thread)?
        };
        let frontier = Self {
            crawl_names: Mutex::new(scheduler.crawls().into_iter().collect()),
            robots: RobotsShelf::new(config.robots_shelf_bytes),
            ingest,
            scheduler,
            config,
            activity: Mutex::new(HashMap::new()),
            rebuild_signal: Some(signal),
            rebuild_thread: Some(rebuild_thread),
            rebuild_lock,
        };
        // A store opened with filters already past the threshold (a smaller
        // --expected-urls than last time) is rebuilt at once.
        frontier.signal_rebuild();
        Ok(frontier)
    }

    /// Under politeness by address, starts looking hosts up before their
    /// first serve (on the current tokio runtime).
    pub fn start_address_lookups(&self) {
        if self.config.politeness == crate::scheduler::Politeness::Ip {
            let names =
                names::Names::new(Arc::clone(&self.config.pinned_names), names::Dns::system());
            self.scheduler.look_up_addresses(names);
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &FrontierConfig {
        &self.config
    }

    /// Ingest, for start-up reports and tests.
    #[must_use]
    pub fn ingest(&self) -> &Ingest {
        &self.ingest
    }

    /// The scheduler.
    #[must_use]
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Sends a queue's settings, changed here, to the followers of its
    /// partition when this node leads it, and waits until they hold them.
    pub async fn replicate_queue_settings(
        &self,
        crawl: &str,
        queue: &str,
    ) -> Result<(), FrontierError> {
        let partition = self.ingest().partition_of(crawl, queue) as u32;
        let log = self.ingest().replicas();
        if log.owe_queue_settings(partition, crawl, queue) {
            log.wait_for_followers(&std::collections::BTreeSet::from([partition]))
                .await?;
        }
        Ok(())
    }

    /// Refuses a change of a queue's settings while the queue's partition
    /// is sealed (being handed to another node, which takes the settings as
    /// they were at the seal): the caller sends it again to the new owner.
    pub fn queue_settings_open(&self, crawl: &str, queue: &str) -> Result<(), FrontierError> {
        let partition = self.ingest.partition_of(crawl, queue) as u32;
        if self.ingest.is_sealed(partition) {
            return Err(IngestError::PartitionMoving(partition).into());
        }
        Ok(())
    }

    /// The robots.txt answers kept for the workers.
    #[must_use]
    pub fn robots(&self) -> &RobotsShelf {
        &self.robots
    }

    fn signal_rebuild(&self) {
        if self
            .ingest
            .partitions_to_rebuild(self.config.filters.rebuild_fill)
            .is_empty()
        {
            return;
        }
        if let Some(signal) = &self.rebuild_signal {
            match signal.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {}
            }
        }
    }

    fn with_activity(&self, crawl: &str, f: impl FnOnce(&mut CrawlActivity)) {
        let mut activity = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
        f(activity.entry(crawl.to_owned()).or_default());
    }

    fn record_outcomes(&self, crawl: &str, outcomes: &[Outcome]) {
        let now = Timestamp::now().unix_secs();
        self.with_activity(crawl, |activity| {
            let stored = Self::count_skips(activity, outcomes);
            activity.discovered.add(now, stored);
        });
    }

    /// Counts the skipped outcomes by reason; answers how many were stored.
    fn count_skips(activity: &mut CrawlActivity, outcomes: &[Outcome]) -> u64 {
        let mut stored = 0;
        for outcome in outcomes {
            match outcome {
                Outcome::Stored => stored += 1,
                Outcome::Skipped(reason) => {
                    *activity.skipped.entry(*reason).or_default() += 1;
                    metrics::counter!("frontier_skipped_urls_total", "reason" => reason.as_str())
                        .increment(1);
                }
            }
        }
        stored
    }

    /// Stores the discovered URLs the crawl does not know (see
    /// [`Ingest::put_discovered`]).
    pub fn put_discovered(
        &self,
        crawl: &str,
        items: &[Discovered],
    ) -> Result<Vec<Outcome>, FrontierError> {
        let write = self.prepare_discovered(crawl, items)?;
        let outcomes = self.ingest.wait(self.ingest.submit(write)?)?;
        self.discovered_settled(crawl, &outcomes);
        Ok(outcomes)
    }

    /// Refuses a write to `crawl` that would start one crawl more than
    /// `max_crawls`. Crawls whose URLs all went since they were counted
    /// are forgotten first, so a deleted crawl makes room.
    pub fn admit_crawl(&self, crawl: &str) -> Result<(), FrontierError> {
        let crawl = crawl_or_default(crawl);
        let mut names = self
            .crawl_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if names.contains(crawl) {
            return Ok(());
        }
        if names.len() >= self.config.max_crawls {
            // Those admitted by writes still in flight are recounted once
            // they commit; until then the limit may be passed by as many
            // crawls as there are writes in flight, never more.
            *names = self.scheduler.crawls().into_iter().collect();
        }
        if names.len() >= self.config.max_crawls {
            metrics::counter!("frontier_crawls_refused_total").increment(1);
            return Err(FrontierError::TooManyCrawls {
                crawl: crawl.to_owned(),
                limit: self.config.max_crawls,
            });
        }
        names.insert(crawl.to_owned());
        Ok(())
    }

    /// The first step of [`Self::put_discovered`], for callers that take
    /// the steps themselves (see [`Ingest::prepare_discovered`]); the
    /// outcomes go to [`Self::discovered_settled`].
    pub fn prepare_discovered(
        &self,
        crawl: &str,
        items: &[Discovered],
    ) -> Result<PreparedWrite, FrontierError> {
        self.admit_crawl(crawl)?;
        Ok(self.ingest.prepare_discovered(
            crawl_or_default(crawl),
            items,
            &self.config.rules,
            Timestamp::now().unix_secs(),
        )?)
    }

    /// Counts a batch of discovered URLs settled through
    /// [`Self::prepare_discovered`].
    pub fn discovered_settled(&self, crawl: &str, outcomes: &[Outcome]) {
        self.record_outcomes(crawl_or_default(crawl), outcomes);
        self.signal_rebuild();
    }

    /// Records the states clients report (see [`Ingest::put_known`]).
    pub fn put_known(&self, crawl: &str, items: &[Known]) -> Result<Vec<Outcome>, FrontierError> {
        let write = self.prepare_known(crawl, items)?;
        let outcomes = self.ingest.wait(self.ingest.submit(write)?)?;
        self.known_settled(crawl, items, &outcomes);
        Ok(outcomes)
    }

    /// The first step of [`Self::put_known`], for callers that take the
    /// steps themselves (see [`Ingest::prepare_known`]); the outcomes go to
    /// [`Self::known_settled`].
    pub fn prepare_known(
        &self,
        crawl: &str,
        items: &[Known],
    ) -> Result<PreparedWrite, FrontierError> {
        self.admit_crawl(crawl)?;
        Ok(self.ingest.prepare_known(
            crawl_or_default(crawl),
            items,
            &self.config.rules,
            Timestamp::now().unix_secs(),
        )?)
    }

    /// Counts a batch of reports settled through [`Self::prepare_known`].
    pub fn known_settled(&self, crawl: &str, items: &[Known], outcomes: &[Outcome]) {
        let crawl = crawl_or_default(crawl);
        let completed = items
            .iter()
            .zip(outcomes)
            .filter(|(item, outcome)| item.due_at == 0 && **outcome == Outcome::Stored)
            .count() as u64;
        let now = Timestamp::now().unix_secs();
        self.with_activity(crawl, |activity| {
            Self::count_skips(activity, outcomes);
            activity.completed.add(now, completed);
            for (item, outcome) in items.iter().zip(outcomes) {
                let named = item.metadata.get(proto::metadata::OUTCOME);
                let Some(name) = named.and_then(|values| values.first()) else {
                    continue;
                };
                if *outcome != Outcome::Stored {
                    continue;
                }
                let known = activity.reported.contains_key(name);
                let key = if !is_outcome_name(name) {
                    "other"
                } else if known || activity.reported.len() < MAX_OUTCOME_NAMES {
                    name.as_str()
                } else {
                    "other"
                };
                *activity.reported.entry(key.to_owned()).or_default() += 1;
            }
        });
        self.signal_rebuild();
    }

    /// Reports a crawl received since start-up, by the outcome they name
    /// (`fetched`, `client_error`, `server_error`, ...).
    #[must_use]
    pub fn reported_outcomes(&self, crawl: &str) -> BTreeMap<String, u64> {
        let mut reported = BTreeMap::new();
        self.with_activity(crawl_or_default(crawl), |activity| {
            reported.clone_from(&activity.reported);
        });
        reported
    }

    /// Seeds a crawl: its hosts join the crawl's scope and the URLs are
    /// stored at depth 0.
    pub fn add_seeds(&self, crawl: &str, urls: &[String]) -> Result<Vec<Outcome>, FrontierError> {
        let crawl = crawl_or_default(crawl);
        self.admit_crawl(crawl)?;
        let outcomes = self.ingest.add_seeds(
            crawl,
            urls,
            &self.config.rules,
            Timestamp::now().unix_secs(),
        )?;
        self.record_outcomes(crawl, &outcomes);
        self.signal_rebuild();
        Ok(outcomes)
    }

    /// Leases due URLs through the serving gate, at most
    /// `max_urls_per_get` of them for at most `max_lease_secs`, whatever the
    /// request asks. Their metadata is decoded, or read where the queue
    /// did not keep it, one by one as the answer goes out
    /// ([`Self::leased_metadata`]).
    pub fn lease(&self, mut request: ServeRequest) -> Result<Vec<Served>, FrontierError> {
        if request.lease_secs == 0 {
            request.lease_secs = self.config.default_lease_secs;
        }
        request.lease_secs = request.lease_secs.min(self.config.max_lease_secs.max(1));
        request.max_urls = self.config.max_urls_per_get;
        if let Some(crawl) = &mut request.crawl {
            *crawl = crawl_or_default(crawl).to_owned();
        }
        let served = self.scheduler.serve(&request, Timestamp::now())?;
        let mut per_crawl: foldhash::HashMap<&str, u64> = foldhash::HashMap::default();
        for served in &served {
            *per_crawl.entry(served.crawl.as_str()).or_default() += 1;
        }
        metrics::counter!("frontier_leases_total").increment(served.len() as u64);
        let now = Timestamp::now().unix_secs();
        for (crawl, count) in per_crawl {
            self.with_activity(crawl, |activity| activity.leased.add(now, count));
        }
        Ok(served)
    }

    /// The stored metadata of a leased URL: as its queue kept it, else
    /// read; `None` when it was deleted before the read.
    pub fn leased_metadata(
        &self,
        served: &Served,
    ) -> Result<Option<crate::revisit::Metadata>, FrontierError> {
        // Kept bytes that do not decode are read again: the store names
        // the damage, if it holds it too.
        if let Some(Ok(metadata)) = served.metadata.as_ref().map(|kept| kept.decode()) {
            return Ok(Some(metadata));
        }
        let record = (self.ingest.store()).get(served.partition, &served.crawl, &served.url)?;
        Ok(record.map(|record| record.metadata))
    }

    /// What the frontier knows of one URL; `None` when nothing.
    pub fn url_status(&self, crawl: &str, url: &str) -> Result<Option<UrlStatus>, FrontierError> {
        match self.ingest.check_url(crawl_or_default(crawl), url)? {
            UrlCheck::Refused(error) => Err(FrontierError::InvalidArgument(format!(
                "{url:?} is not a crawlable URL: {error}"
            ))),
            UrlCheck::Checked {
                canonical, stored, ..
            } => Ok(stored.map(|record| UrlStatus { canonical, record })),
        }
    }

    /// What ingest makes of one URL, and when its lease runs out if leased.
    pub fn check_url(
        &self,
        crawl: &str,
        url: &str,
    ) -> Result<(UrlCheck, Option<Timestamp>), FrontierError> {
        let crawl = crawl_or_default(crawl);
        let check = self.ingest.check_url(crawl, url)?;
        let lease = match &check {
            UrlCheck::Checked {
                canonical,
                stored: Some(record),
                ..
            } => self
                .scheduler
                .lease_of(crawl, &record.queue_key, canonical, Timestamp::now()),
            _ => None,
        };
        Ok((check, lease))
    }

    /// Counts of one queue, or a whole crawl when `queue` is empty.
    #[must_use]
    pub fn counts(&self, crawl: &str, queue: &str) -> QueueCounts {
        let queue = (!queue.is_empty()).then_some(queue);
        self.scheduler
            .counts(crawl_or_default(crawl), queue, Timestamp::now())
    }

    /// Waits until the followers of the partitions this node leads hold
    /// its lease horizon, which covers every lease handed out so far: a
    /// follower that takes a partition over then serves none of its URLs
    /// before their leases could have ended. Called before leased URLs
    /// leave; immediate when the horizon was held already.
    pub async fn leases_replicated(&self) -> Result<(), FrontierError> {
        let until = self.scheduler.lease_horizon().unix_millis();
        Ok(self.ingest.replicas().horizon_replicated(until).await?)
    }

    /// A crawl's progress.
    pub fn progress(&self, crawl: &str) -> Result<Progress, FrontierError> {
        let crawl = crawl_or_default(crawl);
        let now = Timestamp::now();
        let counts = self.scheduler.counts(crawl, None, now);
        let due = self.ingest.store().count_due(crawl, now.unix_secs(), |p| {
            self.scheduler.counts_partition(p)
        })?;
        let mut progress = Progress {
            counts,
            due_now: due.now.saturating_sub(counts.leased),
            scheduled_later: due.later,
            due_next_hour: due.next_hour.saturating_sub(counts.leased),
            due_next_day: due.next_day.saturating_sub(counts.leased),
            next_due_at: due.next_due_at,
            revisit: self.ingest.revisit_policy(crawl),
            skipped: self.skipped(crawl),
            ..Progress::default()
        };
        self.with_activity(crawl, |activity| {
            progress.rates = activity.rates(now.unix_secs());
        });
        Ok(progress)
    }

    /// URLs a crawl refused since start-up, by reason (the counts
    /// [`Self::progress`] gives, without its read of the store).
    #[must_use]
    pub fn skipped(&self, crawl: &str) -> BTreeMap<&'static str, u64> {
        let mut skipped = BTreeMap::new();
        self.with_activity(crawl_or_default(crawl), |activity| {
            for (reason, count) in &activity.skipped {
                skipped.insert(reason.as_str(), *count);
            }
        });
        skipped
    }

    /// Rates over every crawl this frontier has seen activity of.
    #[must_use]
    pub fn total_rates(&self) -> Rates {
        let secs = Timestamp::now().unix_secs();
        let mut activity = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
        activity
            .values_mut()
            .fold(Rates::default(), |sum, activity| {
                let rates = activity.rates(secs);
                Rates {
                    discovered: sum.discovered + rates.discovered,
                    leased: sum.leased + rates.leased,
                    completed: sum.completed + rates.completed,
                }
            })
    }

    /// Removes a crawl's URLs: all of them (and its queues and scope), one
    /// queue's, or those created before a UTC epoch second; answers how
    /// many went (see [`Ingest::delete`]).
    pub fn delete(
        &self,
        crawl: &str,
        queue: Option<&str>,
        created_before: Option<u64>,
    ) -> Result<u64, FrontierError> {
        let removed = self
            .ingest
            .delete(crawl_or_default(crawl), queue, created_before)?;
        if queue.is_none() && created_before.is_none() {
            self.crawl_names
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(crawl_or_default(crawl));
        }
        Ok(removed.urls)
    }

    /// A crawl's queue keys from `start`, at most `size`, and how many
    /// there are in all.
    #[must_use]
    pub fn list_queues(
        &self,
        crawl: &str,
        start: usize,
        size: usize,
        include_inactive: bool,
    ) -> (Vec<String>, usize) {
        let keys = self
            .scheduler
            .queue_keys(crawl_or_default(crawl), include_inactive);
        let total = keys.len();
        (keys.into_iter().skip(start).take(size).collect(), total)
    }

    /// Visits a crawl's stored URLs that match, completed ones first, until
    /// `visit` answers `false`; memory stays bounded (one store snapshot,
    /// one record at a time).
    pub fn scan_urls(
        &self,
        crawl: &str,
        filter: &UrlFilter,
        mut visit: impl FnMut(&str, &UrlRecord) -> bool,
    ) -> Result<(), FrontierError> {
        let crawl = crawl_or_default(crawl);
        let partitions = self.ingest.filters().partition_count() as u32;
        for completed_pass in [true, false] {
            let mut going = true;
            self.ingest
                .store()
                .scan_crawl(crawl, partitions, |_, url, record| {
                    if record.is_completed() == completed_pass && filter.matches(url, &record) {
                        going = visit(url, &record);
                    }
                    going
                })?;
            if !going {
                break;
            }
        }
        Ok(())
    }

    /// Filter health.
    #[must_use]
    pub fn filter_report(&self) -> FilterReport {
        let set = self.ingest.filters().health();
        let partitions = (0..set.partitions.len())
            .map(|p| PartitionFigures {
                stored: self.ingest.stored_in_partition(p).unwrap_or(0),
                observed: self.ingest.observed_false_positives(p).unwrap_or_default(),
            })
            .collect();
        FilterReport {
            set,
            partitions,
            rebuild_fill_threshold: self.config.filters.rebuild_fill,
            target_fp_rate: self.config.filters.fp_rate,
            dedup: self.config.dedup,
        }
    }

    /// Rebuilds one partition's filter or all of them, each sized for the
    /// keys it holds grown by [`crate::ingest::FILTER_GROWTH`] (at least the
    /// configured size), one at a time.
    pub fn rebuild(&self, partition: Option<usize>) -> Result<Vec<RebuildReport>, FrontierError> {
        let partitions: Vec<usize> = match partition {
            Some(p) if p >= self.ingest.filters().partition_count() => {
                return Err(FrontierError::InvalidArgument(format!(
                    "partition {p} does not exist (there are {})",
                    self.ingest.filters().partition_count()
                )));
            }
            Some(p) => vec![p],
            None => (0..self.ingest.filters().partition_count()).collect(),
        };
        let _one_at_a_time = self
            .rebuild_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        metrics::counter!("frontier_filter_rebuilds_total").increment(partitions.len() as u64);
        partitions
            .into_iter()
            .map(|p| {
                let keys = self.ingest.stored_in_partition(p).unwrap_or(0);
                let capacity = self.config.filters.rebuilt_capacity(p, keys);
                Ok(self.ingest.rebuild_partition(p, capacity)?)
            })
            .collect()
    }

    /// A clean shutdown: stops rebuilds, drains commits, writes filter
    /// snapshots. Callers stop every other use of the frontier first; with
    /// other handles still alive the snapshots are skipped and the next
    /// start rebuilds the filters from the store (slower, equally exact).
    pub fn shutdown(mut self) -> Result<(), FrontierError> {
        drop(self.rebuild_signal.take());
        if let Some(thread) = self.rebuild_thread.take() {
            let _ = thread.join();
        }
        let ingest = Arc::try_unwrap(self.ingest).map_err(|_| FrontierError::ShuttingDown)?;
        ingest.shutdown()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_classes_are_short_plain_words_or_other() {
        for name in ["fetched", "server_error", "robots", "http-429", "tls.error"] {
            assert!(is_outcome_name(name), "{name}");
        }
        let long = "x".repeat(33);
        for name in [
            "",
            "<img src=x onerror=alert(1)>",
            "Server Error",
            "é",
            long.as_str(),
        ] {
            assert!(!is_outcome_name(name), "{name}");
        }
    }
}
