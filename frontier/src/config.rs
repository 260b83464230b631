//! How a frontier is set up: [`FrontierConfig`] and its defaults.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::ingest::{DedupMode, FilterConfig};
use crate::scope::Rules;

/// How a frontier is set up.
#[derive(Debug, Clone)]
pub struct FrontierConfig {
    /// Where the store and filter snapshots live.
    pub data_dir: PathBuf,
    /// Filter sizing.
    pub filters: FilterConfig,
    /// How a filter "maybe" is settled.
    pub dedup: DedupMode,
    /// Longest URL accepted, in bytes.
    pub max_url_length: usize,
    /// Admission rules of every crawl.
    pub rules: Rules,
    /// Lease length when a GetURLs call gives none.
    pub default_lease_secs: u32,
    /// Longest lease a GetURLs call gets, whatever it asks for.
    pub max_lease_secs: u32,
    /// Most URLs one GetURLs call hands out (its limits 0 mean "no limit"
    /// in the API; a call never leases more than this).
    pub max_urls_per_get: u32,
    /// Delay between two serves of a queue without a delay of its own or
    /// of its crawl.
    pub default_delay: Duration,
    /// Bytes of the store's page cache.
    pub cache_bytes: usize,
    /// Most bytes of metadata one URL may carry (more: SKIPPED).
    pub max_metadata_bytes: usize,
    /// Writes are refused (and health says NOT_SERVING) while less than
    /// this is free on the store's disk; they resume by themselves once
    /// there is room.
    pub min_free_bytes: u64,
    /// Bytes of robots.txt answers kept for the workers.
    pub robots_shelf_bytes: usize,
    /// Most crawls held at once: a write that would start one more is
    /// refused (each crawl costs memory whatever its size).
    pub max_crawls: usize,
    /// The revisit policy of crawls without one of their own.
    pub revisit: crate::revisit::Policy,
    /// What hosts share one politeness gap: each host alone, the hosts of
    /// a registrable domain, or the hosts at one IP address.
    pub politeness: crate::scheduler::Politeness,
    /// Names pinned to addresses before DNS (`--hosts-file`), for politeness
    /// by address: the worker's hosts file, so both see one address.
    pub pinned_names: Arc<names::PinnedNames>,
}

/// Longest lease unless configured otherwise: an hour, far beyond any
/// fetch, short enough that a crashed client's URLs come back the same day.
pub const DEFAULT_MAX_LEASE_SECS: u32 = 3600;

/// Most URLs one GetURLs call leases unless configured otherwise.
pub const DEFAULT_MAX_URLS_PER_GET: u32 = 10_000;

/// Bytes of robots.txt answers kept unless configured otherwise: some
/// tens of thousands of hosts' robots.txt at their usual few kilobytes.
pub const DEFAULT_ROBOTS_SHELF_BYTES: usize = 64 << 20;

/// Crawls held at once unless configured otherwise: each costs some
/// kilobytes of memory (its queues' index, its activity, its settings), so
/// a client inventing crawl IDs would otherwise grow the frontier without
/// bound.
pub const DEFAULT_MAX_CRAWLS: usize = 10_000;

/// Free disk below which writes are refused unless configured otherwise:
/// room for redb to finish the transactions in flight and a checkpoint.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 256 << 20;

impl FrontierConfig {
    /// Defaults for a data directory.
    #[must_use]
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            filters: FilterConfig::default(),
            dedup: DedupMode::Exact,
            max_url_length: 2048,
            max_metadata_bytes: crate::ingest::DEFAULT_MAX_METADATA_BYTES,
            rules: Rules::default(),
            default_lease_secs: 30,
            max_lease_secs: DEFAULT_MAX_LEASE_SECS,
            max_urls_per_get: DEFAULT_MAX_URLS_PER_GET,
            default_delay: Duration::from_secs(1),
            cache_bytes: crate::store::DEFAULT_CACHE_BYTES,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
            robots_shelf_bytes: DEFAULT_ROBOTS_SHELF_BYTES,
            max_crawls: DEFAULT_MAX_CRAWLS,
            revisit: crate::revisit::Policy::Never,
            politeness: crate::scheduler::Politeness::Host,
            pinned_names: Arc::default(),
        }
    }
}
