//! Discovered URLs in: canonicalise, admit, test against the partitioned
//! filters, store, then teach the filters.
//!
//! # The seen test
//!
//! A URL's filter key is its crawl ID and canonical URL; its partition comes
//! from the crawl ID and its host (not the client's queue key, which can
//! change between puts: see [`partition_of`]), so one host's URLs share a
//! filter.
//!
//! - The filter says "no": the URL is certainly new to its crawl.
//! - The filter says "maybe": in exact mode the store decides, first by a
//!   read on the caller's thread, then inside the write transaction that
//!   would store the URL, so two batches racing on one URL store it once; a
//!   "maybe" the store refutes is a false positive, counted per partition
//!   for the observed FP rate. In Bloom mode a "maybe"
//!   is skipped as a duplicate without asking the store.
//!
//! # Why the filters never miss a stored key
//!
//! A URL is inserted into its filter only after the transaction that stores
//! it has committed (the store-first order `bloom_core::partitioned` relies
//! on for online rebuilds), and [`Ingest::open`] rebuilds every filter from
//! the store, so after any crash the filters start out holding exactly the
//! stored keys. Between a commit and the filter insert a concurrent batch may
//! see "no" for a stored URL; the transaction then refuses it as known, so
//! nothing is stored twice.
//!
//! # Layout
//!
//! This file: the seen test, deletions, seeds. `write`: puts, in steps an
//! async caller can take without blocking its threads. `rebuild`: filters
//! built from the store (at open, and one partition online when it
//! fills). `partition_copy`: a partition copied between stores.

use std::sync::atomic::{AtomicU64, Ordering};

use bloom_core::{FilterError, KeyHash, Layout, PartitionedBloom};

use std::sync::Arc;
use std::time::Instant;

use crate::canonical::{CanonError, CanonicalUrl, canonicalise};
use crate::commit::{CommitFailed, CommitHook, Committer, KeyFilter};
use crate::record::UrlRecord;
use crate::scope::{Rules, SeedHosts, SkipReason};
use crate::snapshots;
use crate::store::{Applied, Deletion, Removed, Store, StoreError, WriteOp};

mod followed;
mod partition_copy;
mod rebuild;
mod replica_log;
mod write;

pub use partition_copy::{Changes, PartitionUrl, SealedTail, TakeError, Taken};
pub use replica_log::{NotReplicated, ReplicaBatch, ReplicaLog, ReplicaStep};
pub use write::{InFlight, PreparedWrite};

use partition_copy::CopyTracker;

/// How a "maybe" from the filter is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DedupMode {
    /// The store confirms every "maybe": no URL is lost to a false positive.
    #[default]
    Exact,
    /// A "maybe" is taken as "seen": no store lookup, at the price of losing
    /// the filter's false positives.
    Bloom,
}

/// Sizing of the filters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilterConfig {
    /// Number of partitions.
    pub partitions: usize,
    /// URLs each partition's filter is sized for at first, at least
    /// (see [`FilterConfig::ladder_size`]).
    pub expected_urls_per_partition: u64,
    /// Target false-positive rate.
    pub fp_rate: f64,
    /// Filter layout.
    pub layout: Layout,
    /// Predicted fill ratio past which a partition's filter is rebuilt
    /// larger (the frontier's rebuild thread applies it); a rebuilt filter
    /// is sized to start well below it.
    pub rebuild_fill: f64,
    /// What a new store's partitions follow; a store keeps its own. A
    /// frontier sets it from its politeness ([`crate::service::Frontier::open`]).
    pub partition_by: PartitionBy,
}

/// A rebuilt filter is sized for this many times the keys its partition
/// holds. A filter is rebuilt once it is about as full as its false-positive
/// rate allows, so its bits a URL run from the rate's own (about 1.8 bytes
/// at 0.1%) up to this many times that, right after a rebuild, and average
/// `(growth - 1) / ln growth` times it. A smaller growth keeps them nearer
/// the rate's own, for more rebuilds: each reads its partition's keys from
/// the store, over a store's growth the keys it holds times
/// `1 / (1 - 1 / FILTER_GROWTH)`. A half (1.23 times the rate's own, three
/// times the keys read) is where the memory is about 2 bytes a URL; at
/// scale, a quarter (1.12 times, five times the keys) slowed ingest and
/// the log's syncs, which every answer waits for, more than the memory was
/// worth.
pub const FILTER_GROWTH: f64 = 1.5;
const _: () = assert!(FILTER_GROWTH > 1.0, "a filter's sizes must grow");

impl FilterConfig {
    /// The sizes partition `partition`'s filter is built at, smallest
    /// first: the configured size times [`FILTER_GROWTH`] to the power of
    /// `step` plus the partition's share of a step. Partitions fill at one
    /// pace (the host's hash spreads URLs evenly), so filters sized alike
    /// would reach their rebuild fill together: every partition rebuilt in
    /// one run of store reads, and right after it every filter at the most
    /// bits a URL it ever has (the growth times its rate's own). Offset by
    /// a share of a step each, the rebuilds are spread evenly over a
    /// store's growth and the filters' bits a URL stay near their mean,
    /// `(growth - 1) / ln growth` times the rate's own, at every size.
    #[must_use]
    pub fn ladder_size(&self, partition: usize, step: u32) -> u64 {
        let share = partition as f64 / self.partitions.max(1) as f64;
        let first = self.expected_urls_per_partition.max(1) as f64;
        (first * FILTER_GROWTH.powf(f64::from(step) + share)).ceil() as u64
    }

    /// What `partition`'s filter holding `keys` is built for: the smallest
    /// size of its ladder ([`Self::ladder_size`]) at which the keys are
    /// at most `1 / sqrt(FILTER_GROWTH)` of what reaches the rebuild fill.
    /// A filter rebuilt at that fill (its keys about what reaches it) thus
    /// goes up one step of its ladder, and one built from a store's keys
    /// (a restart without snapshots) starts between that share and its
    /// square below the fill. A filter at its capacity is half full (its
    /// rate's optimum), so below a rebuild fill of a half it holds fewer
    /// keys at that fill, and its sizes are raised to match: never a start
    /// at a fill that would have it rebuilt again at once.
    #[must_use]
    pub fn rebuilt_capacity(&self, partition: usize, keys: u64) -> u64 {
        let fill = self.rebuild_fill.clamp(f64::MIN_POSITIVE, 0.5);
        // The share of its capacity a filter holds at the rebuild fill.
        let held_at_fill = (1.0 - fill).ln() / 0.5_f64.ln();
        let wanted = keys as f64 * FILTER_GROWTH.sqrt() / held_at_fill;
        let raise = 1.0 / held_at_fill;
        let size = |step| (self.ladder_size(partition, step) as f64 * raise).ceil();
        let mut step = 0;
        while size(step) < wanted {
            step += 1;
        }
        size(step) as u64
    }
}

impl Default for FilterConfig {
    fn default() -> Self {
        Self {
            partitions: 64,
            expected_urls_per_partition: 1_000_000 / 64,
            fp_rate: 0.001,
            layout: Layout::Standard,
            rebuild_fill: 0.5,
            partition_by: PartitionBy::Host,
        }
    }
}

/// Why ingest could not start or go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The store failed; nothing of the batch was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The transaction holding the batch failed; nothing of it was stored.
    #[error(transparent)]
    Commit(#[from] CommitFailed),
    /// The store was created with another partition count (its URL keys
    /// embed the partition).
    #[error(
        "the store was created with {recorded} partitions, not {configured}: start with --partitions {recorded}"
    )]
    PartitionsChanged {
        /// The count in the store.
        recorded: usize,
        /// The count asked for.
        configured: usize,
    },
    /// More partitions than [`MAX_PARTITIONS`].
    #[error("{0} partitions is more than the supported {MAX_PARTITIONS}")]
    TooManyPartitions(usize),
    /// Filter snapshots could not be written at shutdown (the store is
    /// intact; the next start rebuilds the filters from it).
    #[error("cannot write filter snapshots: {0}")]
    Snapshot(std::io::Error),
    /// The filter configuration is impossible.
    #[error("invalid filter configuration: {0}")]
    Filter(#[from] FilterError),
    /// A partition the writes reach is being handed to another node:
    /// nothing of them was stored, and sent again they reach its new owner.
    #[error("partition {0} is moving to another node: nothing of this was stored; send it again")]
    PartitionMoving(u32),
}

impl IngestError {
    /// Whether a full disk is what failed: the write may be sent again once
    /// there is room.
    #[must_use]
    pub fn is_disk_full(&self) -> bool {
        match self {
            Self::Store(error) => error.is_disk_full(),
            Self::Commit(CommitFailed(error)) => error.is_disk_full(),
            _ => false,
        }
    }
}

/// One discovered URL as a client sends it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Discovered {
    /// The URL as found.
    pub url: String,
    /// The client's queue key; empty: the URL's host.
    pub queue_key: String,
    /// Hops from a seed.
    pub depth: u32,
    /// Client metadata.
    pub metadata: std::collections::BTreeMap<String, Vec<String>>,
}

/// One URL whose state a client reports (a URL Frontier "known" item).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Known {
    /// The URL.
    pub url: String,
    /// Hops from a seed, for the scope rules a URL the crawl does not hold
    /// passes (as a discovered one would).
    pub depth: u32,
    /// The client's queue key; empty: the stored one (the host for a URL
    /// the crawl does not know).
    pub queue_key: String,
    /// Next due date, UTC epoch seconds; 0: completed.
    pub due_at: u64,
    /// Client metadata, replacing what was stored.
    pub metadata: std::collections::BTreeMap<String, Vec<String>>,
}

/// What became of one discovered URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stored, durably, and scheduled.
    Stored,
    /// Not stored, and not to be sent again.
    Skipped(SkipReason),
}

/// Where the filters came from at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FiltersFrom {
    /// The snapshots of a clean shutdown.
    Snapshots,
    /// Rebuilt from every stored key, and why.
    Store {
        /// Keys read from the store.
        keys: u64,
        /// Why the snapshots were not used.
        reason: String,
    },
}

/// What start-up did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupReport {
    /// Where the filters came from.
    pub filters_from: FiltersFrom,
    /// How long opening took.
    pub duration: std::time::Duration,
}

/// What [`Ingest::check_url`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlCheck {
    /// Ingest would refuse the URL.
    Refused(CanonError),
    /// The URL's keys and state.
    Checked {
        /// Canonical spelling.
        canonical: String,
        /// Its queue (the stored one, else the host).
        queue_key: String,
        /// Its filter partition.
        partition: usize,
        /// The filter's answer: `false` is "certainly not stored".
        filter_maybe: bool,
        /// What the store holds, if anything.
        stored: Option<UrlRecord>,
    },
}

/// The most partitions a frontier may have.
pub const MAX_PARTITIONS: usize = 1 << 16;

/// Longest queue key the API allows.
const MAX_QUEUE_KEY: usize = 255;

#[derive(Default)]
struct PartitionCounters {
    refuted_maybes: AtomicU64,
    /// Keys the store holds for the partition: exact after a rebuild from
    /// the store, estimated from the filter after loading snapshots.
    stored: AtomicU64,
    /// `stored` at start-up. Every key stored since was a lookup of a key
    /// the store did not hold, so the difference is the observed FP rate's
    /// denominator.
    stored_at_open: u64,
}

/// What a partition's filter got wrong since start-up, as the store showed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObservedFalsePositives {
    /// "Maybe" answers for keys the store did not hold.
    pub refuted_maybes: u64,
    /// Lookups of keys the store did not hold: the rate's denominator.
    pub absent_lookups: u64,
}

/// The seen test and the store behind it.
pub struct Ingest {
    store: Arc<Store>,
    // `None` only during shutdown.
    committer: Option<Committer>,
    // Read on every put, written by AddSeeds: a std RwLock, held for a
    // clone or an insert, never across I/O.
    seeds: std::sync::RwLock<std::collections::HashMap<String, Arc<SeedHosts>>>,
    startup: StartupReport,
    filters: Arc<PartitionedBloom>,
    mode: DedupMode,
    config: FilterConfig,
    max_url_length: usize,
    max_metadata_bytes: usize,
    counters: Box<[PartitionCounters]>,
    // What changed in partitions being copied out (see `partition_copy`).
    copies: Arc<CopyTracker>,
    // What this node, leading partitions, owes their followers.
    replicas: Arc<ReplicaLog>,
    // Partitions taking no writes (being handed over): a write holds this
    // shared from its check to its commit, so sealing (exclusive) waits for
    // the writes already past the check.
    sealed: std::sync::RwLock<std::collections::BTreeSet<u32>>,
    // Which leader each partition's copy here follows (see `followed`).
    followed: followed::FollowedMarks,
    // Each crawl's revisit policy, which settles its reports.
    revisits: crate::revisit::Policies,
}

/// Most bytes of metadata one URL may carry unless configured otherwise:
/// far above what crawlers keep per URL, and small enough that a GetURLs
/// answer of many URLs stays bounded.
pub const DEFAULT_MAX_METADATA_BYTES: usize = 16 << 10;

/// The bytes a URL's metadata takes: keys and values, and a length prefix
/// for each (as stored).
#[must_use]
pub fn metadata_bytes(metadata: &std::collections::BTreeMap<String, Vec<String>>) -> usize {
    metadata
        .iter()
        .map(|(key, values)| 8 + key.len() + values.iter().map(|v| 4 + v.len()).sum::<usize>())
        .sum()
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("store", &self.store)
            .field("mode", &self.mode)
            .finish()
    }
}

/// The filter key of a URL in a crawl, from the hash its store keys its
/// record by ([`Store::url_hash`]): a key no filter holds is then one no
/// stored URL's record has, hash collisions included, which is what lets
/// the committer store a new URL without looking its key up
/// ([`crate::commit::KeyFilter`]).
#[must_use]
pub fn filter_key(crawl: &str, url_hash: u64) -> KeyHash {
    // Asked for every URL in and out: a usual crawl ID is laid out on the
    // stack, a long one on the heap.
    const ON_STACK: usize = 119;
    let crawl = crawl.as_bytes();
    let mut stack = [0_u8; ON_STACK + 9];
    let mut heap = Vec::new();
    let bytes: &mut [u8] = if crawl.len() <= ON_STACK {
        &mut stack[..crawl.len() + 9]
    } else {
        heap.resize(crawl.len() + 9, 0);
        &mut heap
    };
    bytes[..crawl.len()].copy_from_slice(crawl);
    bytes[crawl.len()] = 0;
    bytes[crawl.len() + 1..].copy_from_slice(&url_hash.to_le_bytes());
    KeyHash::of(bytes)
}

/// The filters as the committer asks them whether a new URL's record key
/// is new.
impl KeyFilter for PartitionedBloom {
    fn surely_absent(&self, partition: u32, crawl: &str, url_hash: u64) -> bool {
        // An error (no such partition) is no certainty.
        self.contains(partition as usize, filter_key(crawl, url_hash))
            .is_ok_and(|maybe| !maybe)
    }

    fn add(&self, partition: u32, crawl: &str, url_hash: u64) {
        // A partition past the count has no filter to miss the key: its
        // `surely_absent` is never certain.
        let _ = self.insert(partition as usize, filter_key(crawl, url_hash));
    }
}

pub use crate::partitioning::{PartitionBy, partition_of};

impl Ingest {
    /// Opens ingest over a store. The filters come from the snapshots of a
    /// clean shutdown when the store is unchanged since (see
    /// [`crate::snapshots`]); otherwise they are rebuilt from every stored
    /// key. Either way they hold exactly the store's keys, whatever happened
    /// before (a clean stop or a kill).
    pub fn open(
        store: Store,
        config: FilterConfig,
        mode: DedupMode,
        max_url_length: usize,
    ) -> Result<Self, IngestError> {
        Self::open_with_hook(store, config, mode, max_url_length, |_| Ok(None))
    }

    /// Like [`Self::open`], with a hook that sees every commit (see
    /// [`crate::commit`]). `make_hook` runs once the store is open and
    /// before the committer starts, so whatever it loads from the store
    /// misses no write.
    pub fn open_with_hook(
        store: Store,
        mut config: FilterConfig,
        mode: DedupMode,
        max_url_length: usize,
        make_hook: impl FnOnce(&Arc<Store>) -> Result<Option<CommitHook>, StoreError>,
    ) -> Result<Self, IngestError> {
        let started = Instant::now();
        if config.partitions > MAX_PARTITIONS {
            return Err(IngestError::TooManyPartitions(config.partitions));
        }
        let recorded_by = store.partition_by(config.partition_by)?;
        if recorded_by != config.partition_by {
            tracing::info!(
                recorded = recorded_by.name(),
                asked = config.partition_by.name(),
                "the store keeps the partitioning it was created with"
            );
        }
        config.partition_by = recorded_by;
        let recorded = store.partitions(config.partitions as u32)? as usize;
        if recorded != config.partitions {
            return Err(IngestError::PartitionsChanged {
                recorded,
                configured: config.partitions,
            });
        }
        let token = store.clean_shutdown_token()?;
        let loaded = token.map(|token| snapshots::load(store.data_dir(), token, config.partitions));
        let (filters, source, stored) = match loaded {
            Some(Ok(filters)) => {
                let stored = filters
                    .iter()
                    .map(|f| f.estimated_items().round() as u64)
                    .collect();
                (
                    PartitionedBloom::from_filters(filters)?,
                    FiltersFrom::Snapshots,
                    stored,
                )
            }
            not_loaded => {
                let reason = match not_loaded {
                    Some(Err(error)) => error.to_string(),
                    _ => "no clean shutdown recorded".to_owned(),
                };
                let (filters, stored) = rebuild::filters_from_store(&store, &config)?;
                let keys = stored.iter().sum();
                (filters, FiltersFrom::Store { keys, reason }, stored)
            }
        };
        if token.is_some() {
            // From the first write on, the snapshots no longer describe the
            // store: forget them before any write can happen.
            store.set_clean_shutdown_token(None)?;
        }
        let mut seeds: std::collections::HashMap<String, SeedHosts> =
            std::collections::HashMap::new();
        store.for_each_seed_host(|crawl, host| {
            seeds.entry(crawl.to_owned()).or_default().add(host)
        })?;
        let revisits = crate::revisit::Policies::default();
        for (crawl, policy) in store.revisit_policies()? {
            revisits.set(&crawl, Some(policy));
        }
        let store = Arc::new(store);
        let hook = make_hook(&store)?;
        let copies = Arc::new(CopyTracker::default());
        let tracker = Arc::clone(&copies);
        let replicas = Arc::new(ReplicaLog::default());
        let owed = Arc::clone(&replicas);
        let tracked: CommitHook = Box::new(move |ops, applied| {
            tracker.on_commit(ops, applied);
            owed.on_commit(ops, applied);
            if let Some(hook) = &hook {
                hook(ops, applied);
            }
        });
        let hook = Some(tracked);
        let filters = Arc::new(filters);
        let keys: Arc<dyn KeyFilter> = Arc::clone(&filters) as _;
        Ok(Self {
            copies,
            replicas,
            sealed: std::sync::RwLock::default(),
            followed: followed::FollowedMarks::default(),
            revisits,
            seeds: std::sync::RwLock::new(
                seeds.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
            ),
            committer: Some(Committer::start_with(Arc::clone(&store), hook, Some(keys))),
            store,
            filters,
            mode,
            config,
            max_url_length,
            max_metadata_bytes: DEFAULT_MAX_METADATA_BYTES,
            counters: stored
                .into_iter()
                .map(|stored| PartitionCounters {
                    stored: AtomicU64::new(stored),
                    stored_at_open: stored,
                    ..PartitionCounters::default()
                })
                .collect(),
            startup: StartupReport {
                filters_from: source,
                duration: started.elapsed(),
            },
        })
    }

    /// What this node owes the followers of the partitions it leads
    /// ([`ReplicaLog`]).
    #[must_use]
    pub fn replicas(&self) -> &ReplicaLog {
        &self.replicas
    }

    /// The seed hosts of a crawl (empty: the crawl is open).
    #[must_use]
    pub fn seeds_of(&self, crawl: &str) -> Arc<SeedHosts> {
        self.seeds
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(crawl)
            .cloned()
            .unwrap_or_default()
    }

    /// Stores seeds like discovered URLs at depth 0 and registers their
    /// hosts as the crawl's scope. The hosts are registered durably before
    /// the URLs are stored, so a stored seed is always in scope.
    pub fn add_seeds(
        &self,
        crawl: &str,
        urls: &[String],
        rules: &Rules,
        now: u64,
    ) -> Result<Vec<Outcome>, IngestError> {
        self.add_scope_hosts(crawl, &self.seed_hosts_of(urls))?;
        let items: Vec<Discovered> = urls
            .iter()
            .map(|url| Discovered {
                url: url.clone(),
                depth: 0,
                ..Discovered::default()
            })
            .collect();
        self.put_discovered(crawl, &items, rules, now)
    }

    /// The hosts seeding `urls` would add to a crawl's scope (canonical,
    /// as the scope compares them); URLs that do not canonicalise add none.
    #[must_use]
    pub fn seed_hosts_of(&self, urls: &[String]) -> Vec<String> {
        urls.iter()
            .filter_map(|url| canonicalise(url, self.max_url_length).ok())
            .map(|canonical| canonical.host().to_owned())
            .collect()
    }

    /// Registers hosts as seeds of a crawl (its scope), durably, without
    /// storing any URL: how a cluster node learns the seeds another node
    /// was given.
    pub fn add_scope_hosts(&self, crawl: &str, hosts: &[String]) -> Result<(), IngestError> {
        if hosts.is_empty() {
            return Ok(());
        }
        let seeds = self.seeds_of(crawl);
        if hosts.iter().all(|host| seeds.contains(host)) {
            return Ok(());
        }
        self.store.add_seed_hosts(crawl, hosts)?;
        let mut seeds = self
            .seeds
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = seeds.entry(crawl.to_owned()).or_default();
        let updated = Arc::make_mut(entry);
        hosts.iter().for_each(|host| updated.add(host));
        Ok(())
    }

    /// What ingest makes of one URL and what the store holds for it (the
    /// admin API's CheckUrl, and the basis of GetURLStatus).
    pub fn check_url(&self, crawl: &str, url: &str) -> Result<UrlCheck, IngestError> {
        let canonical = match canonicalise(url, self.max_url_length) {
            Ok(canonical) => canonical,
            Err(error) => return Ok(UrlCheck::Refused(error)),
        };
        let partition = self.partition_of(crawl, canonical.host());
        let maybe = self
            .filters
            .contains(partition, self.filter_key(crawl, canonical.as_str()))?;
        let stored = self
            .store
            .get(partition as u32, crawl, canonical.as_str())?;
        Ok(UrlCheck::Checked {
            queue_key: stored
                .as_ref()
                .map_or_else(|| canonical.host().to_owned(), |r| r.queue_key.clone()),
            canonical: canonical.into_string(),
            partition,
            filter_maybe: maybe,
            stored,
        })
    }

    /// Where the filters came from at start-up, and how long it took.
    #[must_use]
    pub fn startup(&self) -> &StartupReport {
        &self.startup
    }

    /// A clean shutdown: waits for in-flight commits, writes the filter
    /// snapshots, records in the store that they match it, and closes the
    /// store ([`Store::close`]).
    pub fn shutdown(mut self) -> Result<(), IngestError> {
        // Dropping the committer drains its queue and joins its thread.
        drop(self.committer.take());
        let mut nonce = [0_u8; 16];
        if getrandom::fill(&mut nonce).is_err() {
            // No OS randomness: a moment and the process serve to tell
            // one shutdown's snapshots from another's.
            nonce[..8].copy_from_slice(&crate::time::Timestamp::now().unix_millis().to_le_bytes());
            nonce[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        }
        let token = KeyHash::of(&nonce).to_u128() as u64;
        snapshots::write(self.store.data_dir(), &self.filters, token)
            .map_err(IngestError::Snapshot)?;
        self.store.set_clean_shutdown_token(Some(token))?;
        self.store.close();
        Ok(())
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The filters.
    #[must_use]
    pub fn filters(&self) -> &PartitionedBloom {
        &self.filters
    }

    /// What the store's partitions follow.
    #[must_use]
    pub fn partition_by(&self) -> PartitionBy {
        self.config.partition_by
    }

    /// The partition of a URL of `host` in `crawl`.
    #[must_use]
    pub fn partition_of(&self, crawl: &str, host: &str) -> usize {
        self.config
            .partition_by
            .partition(crawl, host, self.filters.partition_count())
    }

    /// The filter key of a canonical URL in a crawl ([`filter_key`]).
    #[must_use]
    pub fn filter_key(&self, crawl: &str, url: &str) -> KeyHash {
        filter_key(crawl, self.store.url_hash(url))
    }

    /// Sets the most bytes of metadata a URL may carry; items with more are
    /// answered [`SkipReason::MetadataTooLarge`].
    #[must_use]
    pub fn with_max_metadata_bytes(mut self, bytes: usize) -> Self {
        self.max_metadata_bytes = bytes;
        self
    }

    /// Crawls without a revisit policy of their own run under `policy`.
    #[must_use]
    pub fn with_default_revisit(mut self, policy: crate::revisit::Policy) -> Self {
        self.revisits = self.revisits.with_default(policy);
        self
    }

    /// The revisit policy a crawl runs under, and whether it is the
    /// crawl's own (not the default).
    #[must_use]
    pub fn revisit_policy(&self, crawl: &str) -> (crate::revisit::Policy, bool) {
        (self.revisits.of(crawl), self.revisits.is_own(crawl))
    }

    /// Gives a crawl its own revisit policy (`Some`) or the default again,
    /// durably. It settles the reports that follow; URLs already done stay
    /// done, and URLs already due keep their dates.
    pub fn set_revisit_policy(
        &self,
        crawl: &str,
        policy: Option<crate::revisit::Policy>,
    ) -> Result<(), IngestError> {
        self.store.set_revisit_policy(crawl, policy)?;
        self.revisits.set(crawl, policy);
        Ok(())
    }

    /// Observed false-positive figures of one partition since start-up.
    #[must_use]
    pub fn observed_false_positives(&self, partition: usize) -> Option<ObservedFalsePositives> {
        self.counters
            .get(partition)
            .map(|c| ObservedFalsePositives {
                refuted_maybes: c.refuted_maybes.load(Ordering::Relaxed),
                absent_lookups: c
                    .stored
                    .load(Ordering::Relaxed)
                    .saturating_sub(c.stored_at_open),
            })
    }

    /// The canonical form of a URL a client sent, or why it is refused
    /// before any rule is asked (unparseable, too long, a queue key over
    /// the API's limit).
    fn accept(
        &self,
        url: &str,
        queue_key: &str,
        metadata: &std::collections::BTreeMap<String, Vec<String>>,
    ) -> Result<CanonicalUrl, SkipReason> {
        if metadata_bytes(metadata) > self.max_metadata_bytes {
            return Err(SkipReason::MetadataTooLarge);
        }
        let canonical = canonicalise(url, self.max_url_length).map_err(|error| match error {
            CanonError::TooLong { .. } => SkipReason::TooLong,
            _ => SkipReason::Invalid,
        })?;
        if queue_key.len() > MAX_QUEUE_KEY {
            return Err(SkipReason::Invalid);
        }
        Ok(canonical)
    }

    /// Removes a crawl's URLs (all, one queue's, or those created before a
    /// date), durably; whole queues and, for a whole crawl, its scope go
    /// too. Deleted URLs can be discovered again: in exact mode the store
    /// refutes the filter's "maybe"; in Bloom mode, where a "maybe" is
    /// final, the partitions that lost keys are rebuilt from the store
    /// before this returns.
    pub fn delete(
        &self,
        crawl: &str,
        queue: Option<&str>,
        created_before: Option<u64>,
    ) -> Result<Removed, IngestError> {
        // A deletion may reach any partition; the tail of one being handed
        // over is already on its way.
        let _writes_open = self.writes_open_to(0..self.filters.partition_count())?;
        let deletion = Deletion {
            crawl: crawl.to_owned(),
            queue: queue.map(str::to_owned),
            created_before,
            partitions: self.filters.partition_count() as u32,
            partition: None,
            urls_below: None,
        };
        let whole_crawl = queue.is_none() && deletion.removes_queues();
        let committer = self.committer.as_ref().ok_or(StoreError::Stopped)?;
        let applied = committer.apply(vec![WriteOp::Delete(deletion)])?;
        let Some(Applied::Deleted(removed)) = applied.into_iter().next() else {
            return Ok(Removed::default());
        };
        for (&partition, &count) in &removed.per_partition {
            if let Some(counters) = self.counters.get(partition as usize) {
                let _ = counters
                    .stored
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        Some(n.saturating_sub(count))
                    });
            }
        }
        if whole_crawl {
            self.seeds
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(crawl);
            self.revisits.set(crawl, None);
        }
        if self.mode == DedupMode::Bloom {
            for &partition in removed.per_partition.keys() {
                let keys = self.counters[partition as usize]
                    .stored
                    .load(Ordering::Relaxed);
                self.rebuild_partition(
                    partition as usize,
                    self.config.rebuilt_capacity(partition as usize, keys),
                )?;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(url: &str) -> Discovered {
        Discovered {
            url: url.to_owned(),
            depth: 1,
            ..Discovered::default()
        }
    }

    fn host_of(url: &str) -> String {
        url::Url::parse(url).unwrap().host_str().unwrap().to_owned()
    }

    /// Checks that every stored URL is in its partition's filter; answers
    /// how many were checked.
    fn stored_keys_in_filters(ingest: &Ingest) -> u64 {
        let partitions = ingest.filters().partition_count();
        ingest
            .store()
            .for_each_url(|partition, crawl, url, record| {
                assert_eq!(
                    partition as usize,
                    partition_of(crawl, &host_of(url), partitions)
                );
                assert_eq!(record.queue_key, host_of(url));
                let hash = ingest.filter_key(crawl, url);
                assert!(
                    ingest.filters().contains(partition as usize, hash).unwrap(),
                    "{url} missing"
                );
            })
            .unwrap()
    }

    fn open(dir: &std::path::Path, config: FilterConfig, mode: DedupMode) -> Ingest {
        Ingest::open(Store::open(dir).unwrap(), config, mode, 2048).unwrap()
    }

    /// A URL the store already holds is answered from a read on the
    /// caller's thread: no write reaches the committer.
    #[test]
    fn known_urls_are_settled_without_a_commit() {
        let dir = tempfile::tempdir().unwrap();
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        let rules = Rules::default();
        let urls = [item("http://a.example/1"), item("http://a.example/2")];
        assert_eq!(
            ingest.put_discovered("c", &urls, &rules, 1).unwrap(),
            vec![Outcome::Stored, Outcome::Stored]
        );
        let commits = ingest.committer.as_ref().unwrap().commits();
        assert_eq!(
            ingest.put_discovered("c", &urls, &rules, 2).unwrap(),
            vec![
                Outcome::Skipped(SkipReason::Duplicate),
                Outcome::Skipped(SkipReason::Duplicate)
            ]
        );
        assert_eq!(ingest.committer.as_ref().unwrap().commits(), commits);
        // Mixed: the known one is settled by the read, the new one stored.
        assert_eq!(
            ingest
                .put_discovered(
                    "c",
                    &[urls[0].clone(), item("http://a.example/3")],
                    &rules,
                    3
                )
                .unwrap(),
            vec![Outcome::Skipped(SkipReason::Duplicate), Outcome::Stored]
        );
        assert_eq!(stored_keys_in_filters(&ingest), 3);
    }

    #[test]
    fn discovered_urls_are_stored_once_across_spellings_batches_and_crawls() {
        let dir = tempfile::tempdir().unwrap();
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        let rules = Rules::default();
        let first = ingest
            .put_discovered(
                "c",
                &[
                    item("http://Example.com/a"),
                    item("http://example.com:80/a#x"),
                    item("ftp://x/"),
                ],
                &rules,
                100,
            )
            .unwrap();
        assert_eq!(
            first,
            vec![
                Outcome::Stored,
                Outcome::Skipped(SkipReason::Duplicate),
                Outcome::Skipped(SkipReason::Invalid)
            ]
        );
        let again = ingest
            .put_discovered("c", &[item("http://example.com/a")], &rules, 200)
            .unwrap();
        assert_eq!(again, vec![Outcome::Skipped(SkipReason::Duplicate)]);
        let other_crawl = ingest
            .put_discovered("d", &[item("http://example.com/a")], &rules, 200)
            .unwrap();
        assert_eq!(other_crawl, vec![Outcome::Stored]);
        let record = ingest
            .store()
            .get(
                partition_of("c", "example.com", 64) as u32,
                "c",
                "http://example.com/a",
            )
            .unwrap()
            .unwrap();
        assert_eq!(record.created_at, 100);
        assert_eq!(record.queue_key, "example.com");
    }

    /// A filter far too small answers "maybe" for nearly everything: exact
    /// mode still stores every new URL and counts the refuted "maybe"s;
    /// Bloom mode loses them, as documented.
    #[test]
    fn exact_mode_never_loses_a_url_to_a_false_positive() {
        let tiny = FilterConfig {
            partitions: 2,
            expected_urls_per_partition: 1,
            fp_rate: 0.5,
            ..FilterConfig::default()
        };
        let urls: Vec<Discovered> = (0..2_000)
            .map(|i| item(&format!("http://h{}.example/{i}", i % 7)))
            .collect();
        let rules = Rules::default();

        let exact_dir = tempfile::tempdir().unwrap();
        let exact = open(exact_dir.path(), tiny, DedupMode::Exact);
        // Small batches, so that earlier ones fill the filters later ones
        // are tested against.
        let put_all = |ingest: &Ingest| -> Vec<Outcome> {
            urls.chunks(10)
                .flat_map(|batch| ingest.put_discovered("c", batch, &rules, 1).unwrap())
                .collect()
        };
        let outcomes = put_all(&exact);
        assert!(outcomes.iter().all(|o| *o == Outcome::Stored));
        assert_eq!(exact.store().for_each_url(|_, _, _, _| {}).unwrap(), 2_000);
        let (refuted, lookups) = (0..2)
            .map(|p| exact.observed_false_positives(p).unwrap())
            .fold((0, 0), |a, b| {
                (a.0 + b.refuted_maybes, a.1 + b.absent_lookups)
            });
        assert_eq!(lookups, 2_000);
        assert!(
            refuted > 1_000,
            "a saturated filter says maybe to most: {refuted}"
        );

        let bloom_dir = tempfile::tempdir().unwrap();
        let bloom = open(bloom_dir.path(), tiny, DedupMode::Bloom);
        let outcomes = put_all(&bloom);
        let stored = outcomes.iter().filter(|o| **o == Outcome::Stored).count();
        assert!(stored < 2_000, "bloom mode skips false positives");
    }

    /// After a restart (clean or not: the filters are rebuilt from the store
    /// either way) every stored URL is a "maybe" and a duplicate, whatever
    /// the filters' layout.
    #[test]
    fn reopened_filters_hold_every_stored_key() {
        let urls: Vec<Discovered> = (0..5_000)
            .map(|i| item(&format!("http://h{}.example/p/{i}", i % 50)))
            .collect();
        let rules = Rules::default();
        for layout in Layout::ALL {
            let dir = tempfile::tempdir().unwrap();
            let config = FilterConfig {
                layout,
                ..FilterConfig::default()
            };
            {
                let ingest = open(dir.path(), config, DedupMode::Exact);
                let outcomes = ingest.put_discovered("c", &urls, &rules, 1).unwrap();
                assert!(outcomes.iter().all(|o| *o == Outcome::Stored), "{layout}");
            }
            let ingest = open(dir.path(), config, DedupMode::Bloom);
            assert_eq!(stored_keys_in_filters(&ingest), 5_000, "{layout}");
            let outcomes = ingest.put_discovered("c", &urls, &rules, 2).unwrap();
            assert!(
                outcomes
                    .iter()
                    .all(|o| *o == Outcome::Skipped(SkipReason::Duplicate)),
                "{layout}"
            );
        }
    }

    #[test]
    fn bad_items_get_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let ingest = Ingest::open(
            Store::open(dir.path()).unwrap(),
            FilterConfig::default(),
            DedupMode::Exact,
            64,
        )
        .unwrap();
        let rules = Rules::new(crate::scope::ScopeMode::Any, &[], &[], Some(3), 2).unwrap();
        let long_key = Discovered {
            queue_key: "k".repeat(256),
            ..item("http://example.com/")
        };
        let items = [
            item(""),
            item(&format!("http://example.com/{}", "a".repeat(100))),
            Discovered {
                depth: 4,
                ..item("http://example.com/deep")
            },
            item("http://example.com/a/a/a"),
            long_key,
        ];
        let outcomes = ingest.put_discovered("c", &items, &rules, 1).unwrap();
        assert_eq!(
            outcomes,
            vec![
                Outcome::Skipped(SkipReason::Invalid),
                Outcome::Skipped(SkipReason::TooLong),
                Outcome::Skipped(SkipReason::TooDeep),
                Outcome::Skipped(SkipReason::Trap),
                Outcome::Skipped(SkipReason::Invalid),
            ]
        );
    }

    /// Four threads put overlapping batches at once: each URL is reported
    /// stored exactly once, and every stored URL is in its filter.
    #[test]
    fn concurrent_batches_store_each_url_once() {
        let dir = tempfile::tempdir().unwrap();
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        let rules = Rules::default();
        let stored: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|thread| {
                    let (ingest, rules) = (&ingest, &rules);
                    scope.spawn(move || {
                        let mut stored = 0;
                        for batch in 0..50_u32 {
                            // Threads 0/1 and 2/3 send the same URLs, in
                            // opposite orders of batches.
                            let batch = if thread % 2 == 0 { batch } else { 49 - batch };
                            let items: Vec<Discovered> = (0..20)
                                .map(|i| {
                                    item(&format!("http://h{}.example/{}/{i}", thread / 2, batch))
                                })
                                .collect();
                            let outcomes = ingest.put_discovered("c", &items, rules, 1).unwrap();
                            stored += outcomes.iter().filter(|o| **o == Outcome::Stored).count();
                        }
                        stored
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(stored, 2 * 50 * 20);
        assert_eq!(stored_keys_in_filters(&ingest), 2_000);
    }

    fn urls(range: std::ops::Range<u32>) -> Vec<Discovered> {
        range
            .map(|i| item(&format!("http://h{}.example/s/{i}", i % 30)))
            .collect()
    }

    /// After a crash the filters are built from the store at the size its
    /// keys need, not at the configured start size: none starts out full
    /// and due for a second rebuild.
    #[test]
    fn filters_built_from_the_store_are_sized_for_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilterConfig {
            partitions: 8,
            expected_urls_per_partition: 10,
            ..FilterConfig::default()
        };
        let first = open(dir.path(), config, DedupMode::Exact);
        first
            .put_discovered("c", &urls(0..4_000), &Rules::default(), 1)
            .unwrap();
        drop(first); // a crash: no snapshots

        let reopened = open(dir.path(), config, DedupMode::Exact);
        assert!(matches!(
            reopened.startup().filters_from,
            FiltersFrom::Store { keys: 4_000, .. }
        ));
        assert_eq!(stored_keys_in_filters(&reopened), 4_000);
        assert_eq!(
            (0..8)
                .map(|p| reopened.stored_in_partition(p).unwrap())
                .sum::<u64>(),
            4_000
        );
        assert_eq!(reopened.partitions_to_rebuild(0.5), Vec::<usize>::new());
    }

    /// New URLs are stored without looking their keys up in `urls.redb`:
    /// only a filter's false positive costs a lookup, and known URLs are
    /// settled before the committer.
    #[test]
    fn new_urls_are_staged_without_reading_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilterConfig {
            partitions: 4,
            ..FilterConfig::default()
        };
        let ingest = open(dir.path(), config, DedupMode::Exact);
        let rules = Rules::default();
        for batch in 0..8 {
            let outcomes = ingest
                .put_discovered("c", &urls(batch * 250..(batch + 1) * 250), &rules, 1)
                .unwrap();
            assert!(outcomes.iter().all(|o| *o == Outcome::Stored));
        }
        let reads = ingest.store().staging_file_reads();
        assert!(reads < 100, "{reads} of 2000 new URLs looked up");
        let outcomes = ingest
            .put_discovered("c", &urls(0..2_000), &rules, 1)
            .unwrap();
        assert!((outcomes.iter()).all(|o| *o == Outcome::Skipped(SkipReason::Duplicate)));
        assert_eq!(ingest.store().staging_file_reads(), reads);
        assert_eq!(ingest.store().for_each_url(|_, _, _, _| {}).unwrap(), 2_000);
    }

    /// Snapshots of an older build, whose filters were keyed by the URL's
    /// text, are not loaded: the filters are rebuilt with today's keys,
    /// which the committer relies on to say a key is new.
    #[test]
    fn snapshots_of_filters_keyed_otherwise_are_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilterConfig {
            partitions: 8,
            ..FilterConfig::default()
        };
        let first = open(dir.path(), config, DedupMode::Exact);
        first
            .put_discovered("c", &urls(0..1_000), &Rules::default(), 1)
            .unwrap();
        first.shutdown().unwrap();
        // The manifest as the older build wrote it.
        let manifest = dir.path().join("filters/manifest");
        let text = std::fs::read_to_string(&manifest).unwrap();
        let older: String = text
            .lines()
            .take(2)
            .map(|line| format!("{line}\n"))
            .collect();
        assert_ne!(older, text);
        std::fs::write(&manifest, older).unwrap();

        let reopened = open(dir.path(), config, DedupMode::Exact);
        match &reopened.startup().filters_from {
            FiltersFrom::Store {
                keys: 1_000,
                reason,
            } => assert!(reason.contains("keys="), "{reason}"),
            other => panic!("expected a rebuild, got {other:?}"),
        }
        for url in urls(0..1_000) {
            let canonical = canonicalise(&url.url, 2048).unwrap();
            let partition = partition_of("c", canonical.host(), 8);
            let key = reopened.filter_key("c", canonical.as_str());
            assert!(reopened.filters().contains(partition, key).unwrap());
        }
    }

    #[test]
    fn clean_restarts_load_snapshots_and_anything_else_rebuilds() {
        let dir = tempfile::tempdir().unwrap();
        let rules = Rules::default();
        let config = FilterConfig {
            partitions: 8,
            ..FilterConfig::default()
        };
        let reopen = |config| open(dir.path(), config, DedupMode::Exact);

        let first = reopen(config);
        assert!(matches!(
            first.startup().filters_from,
            FiltersFrom::Store { keys: 0, .. }
        ));
        first
            .put_discovered("c", &urls(0..3_000), &rules, 1)
            .unwrap();
        first.shutdown().unwrap();

        // Clean restart: snapshots, and the token is spent.
        let second = reopen(config);
        assert_eq!(second.startup().filters_from, FiltersFrom::Snapshots);
        assert_eq!(stored_keys_in_filters(&second), 3_000);
        assert_eq!(second.store().clean_shutdown_token().unwrap(), None);
        second
            .put_discovered("c", &urls(3_000..4_000), &rules, 1)
            .unwrap();
        drop(second); // a crash: no shutdown

        // After the crash the old snapshots would miss 1 000 keys: rebuilt.
        let third = reopen(config);
        assert!(matches!(
            third.startup().filters_from,
            FiltersFrom::Store { keys: 4_000, .. }
        ));
        assert_eq!(stored_keys_in_filters(&third), 4_000);
        third.shutdown().unwrap();

        // A damaged snapshot file: rebuilt, with the reason.
        let snapshot = dir.path().join("filters/partition-3.bloom");
        let mut bytes = std::fs::read(&snapshot).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(&snapshot, bytes).unwrap();
        let fourth = reopen(config);
        match &fourth.startup().filters_from {
            FiltersFrom::Store {
                keys: 4_000,
                reason,
            } => assert!(reason.contains("partition-3"), "{reason}"),
            other => panic!("expected a rebuild, got {other:?}"),
        }
        assert_eq!(stored_keys_in_filters(&fourth), 4_000);
        fourth.shutdown().unwrap();

        // Another partition count: refused, with the count to use.
        let error = Ingest::open(
            Store::open(dir.path()).unwrap(),
            FilterConfig {
                partitions: 16,
                ..config
            },
            DedupMode::Exact,
            2048,
        )
        .unwrap_err();
        assert!(error.to_string().contains("--partitions 8"), "{error}");
    }

    /// Two threads put while a third rebuilds partitions over and over, at
    /// growing sizes: no stored key is ever missing from its filter.
    #[test]
    fn rebuilds_under_concurrent_puts_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilterConfig {
            partitions: 4,
            expected_urls_per_partition: 100,
            ..FilterConfig::default()
        };
        let ingest = open(dir.path(), config, DedupMode::Exact);
        let rules = Rules::default();
        let putting = std::sync::atomic::AtomicUsize::new(2);
        let rebuilds = std::thread::scope(|scope| {
            for thread in 0..2_u32 {
                let (ingest, rules, putting) = (&ingest, &rules, &putting);
                scope.spawn(move || {
                    for batch in 0..60 {
                        let start = thread * 100_000 + batch * 50;
                        ingest
                            .put_discovered("c", &urls(start..start + 50), rules, 1)
                            .unwrap();
                        // Every acknowledged URL is found right away.
                        for url in urls(start..start + 50) {
                            let canonical = canonicalise(&url.url, 2048).unwrap();
                            let partition = partition_of("c", canonical.host(), 4);
                            let hash = ingest.filter_key("c", canonical.as_str());
                            assert!(ingest.filters().contains(partition, hash).unwrap());
                        }
                    }
                    putting.fetch_sub(1, Ordering::SeqCst);
                });
            }
            let (ingest, putting) = (&ingest, &putting);
            scope
                .spawn(move || {
                    let mut rebuilds = 0_u64;
                    while putting.load(Ordering::SeqCst) > 0 {
                        let partition = (rebuilds % 4) as usize;
                        ingest
                            .rebuild_partition(partition, 200 + rebuilds * 50)
                            .unwrap();
                        rebuilds += 1;
                    }
                    rebuilds
                })
                .join()
                .unwrap()
        });
        assert!(rebuilds > 0);
        assert_eq!(stored_keys_in_filters(&ingest), 6_000);
        let health = ingest.filters().health();
        assert_eq!(health.total.rebuilds, rebuilds);
    }

    proptest::proptest! {
        /// A rebuilt filter starts below the fill that has it rebuilt,
        /// whatever that fill and however many keys, so no partition is
        /// rebuilt again at once; at the default fill it costs at most the
        /// growth times the bits its rate needs a key, and a little more.
        #[test]
        fn a_rebuilt_filter_starts_below_its_rebuild_fill(
            partition in 0_usize..64,
            keys in 1_u64..50_000,
            rebuild_fill in 0.05_f64..0.95,
        ) {
            let config = FilterConfig {
                expected_urls_per_partition: 1,
                rebuild_fill,
                ..FilterConfig::default()
            };
            let capacity = config.rebuilt_capacity(partition, keys);
            proptest::prop_assert!(capacity > keys);
            let filter = bloom_core::BloomFilter::with_layout(config.layout, capacity, config.fp_rate)
                .unwrap();
            let predicted =
                -(-f64::from(filter.hashes()) * keys as f64 / filter.bits() as f64).exp_m1();
            proptest::prop_assert!(predicted < rebuild_fill.min(0.5), "{predicted}");
            if rebuild_fill >= 0.5 {
                let most = (keys as f64 * FILTER_GROWTH * FILTER_GROWTH.sqrt()).ceil() as u64 + 1;
                proptest::prop_assert!(capacity <= most, "{capacity} for {keys} keys");
                // The rate's own bits a key, -ln p / ln² 2, for the
                // capacity, up to the filter's rounding to whole blocks.
                let rate_bits = -config.fp_rate.ln() / std::f64::consts::LN_2.powi(2);
                let most = rate_bits * capacity as f64 * 1.01 + 1024.0;
                proptest::prop_assert!((filter.bits() as f64) <= most, "{} bits", filter.bits());
            }
        }

        /// A filter rebuilt at its rebuild fill (its keys about those that
        /// reach it) goes exactly one step up its partition's sizes.
        #[test]
        fn a_filter_rebuilt_at_its_fill_goes_one_step_up(
            partition in 0_usize..64,
            step in 0_u32..20,
            // The keys off those that reach the fill by up to (not quite)
            // the square root of a step either way.
            off_by_steps in -0.49_f64..0.49,
            rebuild_fill in 0.05_f64..0.95,
        ) {
            let config = FilterConfig {
                expected_urls_per_partition: 1_000,
                rebuild_fill,
                ..FilterConfig::default()
            };
            let keys_at_fill = |capacity: u64| {
                let held_at_fill = (1.0 - rebuild_fill.min(0.5)).ln() / 0.5_f64.ln();
                capacity as f64 * held_at_fill
            };
            let mut capacity = config.rebuilt_capacity(partition, 0);
            for _ in 0..step {
                capacity = config.rebuilt_capacity(partition, keys_at_fill(capacity) as u64);
            }
            let keys = (keys_at_fill(capacity) * FILTER_GROWTH.powf(off_by_steps)) as u64;
            let rebuilt = config.rebuilt_capacity(partition, keys);
            let ratio = rebuilt as f64 / capacity as f64;
            proptest::prop_assert!((ratio - FILTER_GROWTH).abs() < 1e-2, "{capacity} -> {rebuilt}");
        }
    }

    /// Partitions fill at one pace; their filters' sizes are offset so that
    /// they are rebuilt one at a time, spread over the store's growth, and
    /// the filters' capacity over the keys stays near its mean at every
    /// size (sized alike, every filter would swing together from 1 to 2).
    #[test]
    fn partitions_are_rebuilt_one_at_a_time_at_every_size() {
        let config = FilterConfig::default();
        let partitions = config.partitions;
        let mut capacities: Vec<u64> = (0..partitions)
            .map(|p| config.rebuilt_capacity(p, 0))
            .collect();
        let first = config.expected_urls_per_partition;
        let mut rebuilt_at = Vec::new();
        let (mut least, mut most) = (f64::MAX, 0.0_f64);
        // Each partition holds `keys`, growing 0.1% at a time.
        let mut keys = first as f64;
        while keys < (first * 1_000) as f64 {
            for (partition, capacity) in capacities.iter_mut().enumerate() {
                if keys >= *capacity as f64 {
                    *capacity = config.rebuilt_capacity(partition, keys as u64);
                    rebuilt_at.push(keys as u64);
                }
            }
            let ratio = capacities.iter().sum::<u64>() as f64 / (keys * partitions as f64);
            least = least.min(ratio);
            most = most.max(ratio);
            keys *= 1.001;
        }
        let mean = (FILTER_GROWTH - 1.0) / FILTER_GROWTH.ln();
        assert!(
            least > mean * 0.97 && most < mean * 1.03,
            "capacity over keys from {least} to {most}, mean {mean}"
        );
        // A thousandfold growth: each partition rebuilt once a step of its
        // ladder, no two at the same size.
        let steps = 1_000_f64.ln() / FILTER_GROWTH.ln();
        let per_partition = rebuilt_at.len() as f64 / partitions as f64;
        assert!(
            (per_partition - steps).abs() <= 1.0,
            "{per_partition} for {steps}"
        );
        rebuilt_at.dedup();
        assert_eq!(rebuilt_at.len() as f64, per_partition * partitions as f64);
    }

    #[test]
    fn full_partitions_are_rebuilt_larger() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilterConfig {
            partitions: 4,
            expected_urls_per_partition: 1_000,
            ..FilterConfig::default()
        };
        // More URLs a partition than a rebuild feeds in one batch.
        let ingest = open(dir.path(), config, DedupMode::Exact);
        assert!(ingest.partitions_to_rebuild(0.5).is_empty());
        let rules = Rules::default();
        ingest
            .put_discovered("c", &urls(0..20_000), &rules, 1)
            .unwrap();
        let full = ingest.partitions_to_rebuild(0.5);
        assert!(!full.is_empty());
        let total: u64 = (0..4).map(|p| ingest.stored_in_partition(p).unwrap()).sum();
        assert_eq!(total, 20_000);
        // The prediction agrees with the counted fill.
        for &partition in &full {
            assert!(ingest.filters().filter(partition).unwrap().fill_ratio() > 0.45);
        }
        let reports = ingest.rebuild_full_partitions(0.5).unwrap();
        assert_eq!(reports.len(), full.len());
        for report in &reports {
            assert!(report.bits_after > report.bits_before);
            assert_eq!(
                Some(report.keys_fed),
                ingest.stored_in_partition(report.partition)
            );
        }
        assert!(ingest.partitions_to_rebuild(0.5).is_empty());
        assert_eq!(stored_keys_in_filters(&ingest), 20_000);
    }

    #[test]
    fn check_url_reports_canonical_form_partition_filter_and_store() {
        let dir = tempfile::tempdir().unwrap();
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        let rules = Rules::default();
        ingest
            .put_discovered("c", &[item("http://example.com/a")], &rules, 7)
            .unwrap();
        match ingest
            .check_url("c", "HTTP://EXAMPLE.com:80/a#top")
            .unwrap()
        {
            UrlCheck::Checked {
                canonical,
                queue_key,
                partition,
                filter_maybe,
                stored,
            } => {
                assert_eq!(canonical, "http://example.com/a");
                assert_eq!(queue_key, "example.com");
                assert_eq!(partition, partition_of("c", "example.com", 64));
                assert!(filter_maybe);
                assert_eq!(stored.unwrap().created_at, 7);
            }
            other => panic!("{other:?}"),
        }
        match ingest
            .check_url("other-crawl", "http://example.com/a")
            .unwrap()
        {
            UrlCheck::Checked { stored, .. } => assert_eq!(stored, None),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ingest.check_url("c", "mailto:x@y").unwrap(),
            UrlCheck::Refused(_)
        ));
    }

    /// A report that leaves the date to the frontier comes due again under
    /// its crawl's revisit policy, with the history the frontier keeps; the
    /// policy and the history outlive a restart, and a crawl that never
    /// revisits keeps no revisit keys.
    #[test]
    fn reports_come_due_again_under_their_crawls_revisit_policy() {
        use crate::revisit::{History, Policy};
        use proto::metadata;
        let dir = tempfile::tempdir().unwrap();
        let rules = Rules::default();
        let report = |found: &str| Known {
            url: "http://site.example/a".to_owned(),
            metadata: [
                (metadata::FOUND.to_owned(), vec![found.to_owned()]),
                (metadata::DIGEST.to_owned(), vec!["sha1:AAAA".to_owned()]),
            ]
            .into(),
            ..Known::default()
        };
        let stored = |ingest: &Ingest, crawl: &str| match ingest
            .check_url(crawl, "http://site.example/a")
            .unwrap()
        {
            UrlCheck::Checked {
                stored: Some(record),
                ..
            } => record,
            other => panic!("{other:?}"),
        };
        {
            let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
            ingest
                .set_revisit_policy("c", Some(Policy::Fixed { secs: 30 }))
                .unwrap();
            ingest
                .put_known("c", &[report("changed")], &rules, 100)
                .unwrap();
            let record = stored(&ingest, "c");
            assert_eq!(record.due_at, 130);
            assert!(!record.metadata.contains_key(metadata::FOUND));
            ingest
                .put_known("c", &[report("unchanged")], &rules, 140)
                .unwrap();
            ingest
                .put_known("d", &[report("changed")], &rules, 140)
                .unwrap();
            let record = stored(&ingest, "d");
            assert_eq!(record.due_at, 0);
            assert!(!record.metadata.contains_key(metadata::DIGEST));
        }
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        assert_eq!(
            ingest.revisit_policy("c"),
            (Policy::Fixed { secs: 30 }, true)
        );
        let record = stored(&ingest, "c");
        assert_eq!(record.due_at, 170);
        let history = History::of(&record.metadata);
        assert_eq!(
            (history.fetches, history.changes, history.last_fetched),
            (1, 0, 140)
        );
        ingest.delete("c", None, None).unwrap();
        assert_eq!(ingest.revisit_policy("c"), (Policy::Never, false));
        drop(ingest);
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        assert_eq!(ingest.revisit_policy("c"), (Policy::Never, false));
    }

    /// A known item brings in no URL that discovery would refuse; a URL
    /// the crawl already holds is updated whatever the rules say now.
    #[test]
    fn known_items_for_urls_not_held_pass_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let rules = Rules::default();
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        ingest
            .add_seeds("c", &["http://site.example/".into()], &rules, 1)
            .unwrap();
        let known = |url: &str, depth: u32| Known {
            url: url.to_owned(),
            depth,
            due_at: 0,
            ..Known::default()
        };
        let outcomes = ingest
            .put_known(
                "c",
                &[
                    known("http://169.254.169.254/latest/meta-data/", 1),
                    known("http://site.example/a", 1),
                    known("not a url", 1),
                ],
                &rules,
                2,
            )
            .unwrap();
        assert_eq!(
            outcomes,
            vec![
                Outcome::Skipped(SkipReason::OutOfScope),
                Outcome::Stored,
                Outcome::Skipped(SkipReason::Invalid),
            ]
        );
        assert!(
            ingest
                .check_url("c", "http://169.254.169.254/latest/meta-data/")
                .is_ok_and(|check| matches!(check, UrlCheck::Checked { stored: None, .. }))
        );
        // Held, then out of the rules (a depth limit added later): still
        // updated.
        let strict = Rules::new(crate::scope::ScopeMode::Seeds, &[], &[], Some(0), 3).unwrap();
        assert_eq!(
            ingest
                .put_known("c", &[known("http://site.example/a", 1)], &strict, 3)
                .unwrap(),
            vec![Outcome::Stored]
        );
    }

    #[test]
    fn metadata_over_the_limit_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let rules = Rules::default();
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact)
            .with_max_metadata_bytes(1024);
        let heavy: std::collections::BTreeMap<String, Vec<String>> =
            [("k".to_owned(), vec!["v".repeat(2000)])].into();
        let light: std::collections::BTreeMap<String, Vec<String>> =
            [("k".to_owned(), vec!["v".repeat(500)])].into();
        let discovered =
            |url: &str, metadata: &std::collections::BTreeMap<String, Vec<String>>| Discovered {
                metadata: metadata.clone(),
                ..item(url)
            };
        assert_eq!(
            ingest
                .put_discovered(
                    "c",
                    &[
                        discovered("http://a.example/1", &heavy),
                        discovered("http://a.example/2", &light)
                    ],
                    &rules,
                    1
                )
                .unwrap(),
            vec![
                Outcome::Skipped(SkipReason::MetadataTooLarge),
                Outcome::Stored
            ]
        );
        let known = Known {
            url: "http://a.example/2".into(),
            metadata: heavy,
            ..Known::default()
        };
        assert_eq!(
            ingest.put_known("c", &[known], &rules, 2).unwrap(),
            vec![Outcome::Skipped(SkipReason::MetadataTooLarge)]
        );
    }

    #[test]
    fn seeds_define_the_scope_and_survive_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let rules = Rules::default();
        {
            let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
            // No seeds: the crawl is open.
            assert_eq!(
                ingest
                    .put_discovered("c", &[item("http://anywhere.org/")], &rules, 1)
                    .unwrap(),
                vec![Outcome::Stored]
            );
            let outcomes = ingest
                .add_seeds(
                    "c",
                    &["http://Example.com/".into(), "bad".into()],
                    &rules,
                    1,
                )
                .unwrap();
            assert_eq!(
                outcomes,
                vec![Outcome::Stored, Outcome::Skipped(SkipReason::Invalid)]
            );
            assert_eq!(
                ingest.seeds_of("c").hosts().collect::<Vec<_>>(),
                vec!["example.com"]
            );
            assert!(ingest.seeds_of("other").is_empty());
        }
        let ingest = open(dir.path(), FilterConfig::default(), DedupMode::Exact);
        let outcomes = ingest
            .put_discovered(
                "c",
                &[item("http://example.com/x"), item("http://elsewhere.org/")],
                &rules,
                2,
            )
            .unwrap();
        assert_eq!(
            outcomes,
            vec![Outcome::Stored, Outcome::Skipped(SkipReason::OutOfScope)]
        );
        let seed = ingest.store().get(
            partition_of("c", "example.com", 64) as u32,
            "c",
            "http://example.com/",
        );
        assert_eq!(seed.unwrap().unwrap().depth, 0);
    }

    #[test]
    fn a_store_keeps_the_partitioning_it_was_created_with() {
        let open = |dir: &std::path::Path, by: PartitionBy| {
            Ingest::open(
                Store::open(dir).unwrap(),
                FilterConfig {
                    partition_by: by,
                    ..FilterConfig::default()
                },
                DedupMode::Exact,
                2048,
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let ingest = open(dir.path(), PartitionBy::Domain);
        assert_eq!(ingest.partition_by(), PartitionBy::Domain);
        let url = "http://www.example.co.uk/a";
        let rules = Rules::default();
        ingest.put_discovered("c", &[item(url)], &rules, 1).unwrap();
        let home = ingest.partition_of("c", "www.example.co.uk");
        assert_eq!(home, ingest.partition_of("c", "example.co.uk"));
        ingest.shutdown().unwrap();
        // Opened under another politeness, it finds its URLs where it
        // stored them.
        let ingest = open(dir.path(), PartitionBy::Host);
        assert_eq!(ingest.partition_by(), PartitionBy::Domain);
        assert!(matches!(
            ingest.check_url("c", url).unwrap(),
            UrlCheck::Checked {
                stored: Some(_),
                ..
            }
        ));
        ingest.shutdown().unwrap();
        // A store that holds a partition count but no partitioning was
        // made by host, whatever a new store would be.
        let old = tempfile::tempdir().unwrap();
        {
            let store = Store::open(old.path()).unwrap();
            store.partitions(64).unwrap();
        }
        let ingest = open(old.path(), PartitionBy::Domain);
        assert_eq!(ingest.partition_by(), PartitionBy::Host);
        ingest.shutdown().unwrap();
    }

    #[test]
    fn a_salvaged_store_keeps_its_partitioning() {
        let open = |dir: &std::path::Path| {
            Ingest::open(
                Store::open(dir).unwrap(),
                FilterConfig {
                    partition_by: PartitionBy::Host,
                    ..FilterConfig::default()
                },
                DedupMode::Exact,
                2048,
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        // Two hosts of each of 100 domains: some partition holds the last
        // partition's URLs, so the count read from the URLs is the one
        // recorded too.
        let urls: Vec<String> = (0..200)
            .map(|i| format!("http://w{}.d{}.co.uk/a", i % 2, i / 2))
            .collect();
        {
            let ingest = Ingest::open(
                Store::open(dir.path()).unwrap(),
                FilterConfig {
                    partition_by: PartitionBy::Domain,
                    ..FilterConfig::default()
                },
                DedupMode::Exact,
                2048,
            )
            .unwrap();
            let items: Vec<Discovered> = urls.iter().map(|url| item(url)).collect();
            ingest
                .put_discovered("c", &items, &Rules::default(), 1)
                .unwrap();
            ingest.shutdown().unwrap();
        }
        let found_in = |salvaged: &std::path::Path| {
            let ingest = open(salvaged);
            assert_eq!(ingest.partition_by(), PartitionBy::Domain);
            for url in &urls {
                assert!(
                    matches!(
                        ingest.check_url("c", url).unwrap(),
                        UrlCheck::Checked {
                            stored: Some(_),
                            ..
                        }
                    ),
                    "{url}"
                );
            }
            ingest.shutdown().unwrap();
        };
        // As recorded.
        let into = tempfile::tempdir().unwrap();
        crate::repair::salvage(dir.path(), into.path()).unwrap();
        found_in(into.path());
        // Without the file that records it: read from where the URLs sit.
        std::fs::remove_file(dir.path().join(crate::store::FILE_NAME)).unwrap();
        let into = tempfile::tempdir().unwrap();
        crate::repair::salvage(dir.path(), into.path()).unwrap();
        found_in(into.path());
    }

    #[test]
    fn partitions_follow_the_queue() {
        let a = partition_of("crawl", "example.com", 64);
        assert_eq!(a, partition_of("crawl", "example.com", 64));
        let spread: std::collections::HashSet<usize> = (0..1_000)
            .map(|i| partition_of("crawl", &format!("host{i}"), 64))
            .collect();
        assert_eq!(spread.len(), 64);
    }

    /// A page's outlinks and its report joined in one write are stored
    /// together or not at all: with the report's partition sealed for a
    /// move, the outlinks (in other partitions) are refused with it.
    #[test]
    fn a_joined_write_stores_outlinks_and_report_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilterConfig {
            partitions: 8,
            ..FilterConfig::default()
        };
        let ingest = open(dir.path(), config, DedupMode::Exact);
        let rules = Rules::default();
        let page = "http://page.example/";
        ingest
            .put_discovered("c", &[item(page)], &rules, 1)
            .unwrap();
        let report = Known {
            url: page.to_owned(),
            ..Known::default()
        };
        let page_partition = ingest.partition_of("c", "page.example");
        let outlinks: Vec<Discovered> = (0..40)
            .map(|i| item(&format!("http://out{i}.example/")))
            .filter(|link| ingest.partition_of("c", &host_of(&link.url)) != page_partition)
            .collect();
        assert!(outlinks.len() > 10);
        let joined = |ingest: &Ingest| {
            ingest
                .prepare_discovered("c", &outlinks, &rules, 2)
                .unwrap()
                .join(
                    ingest
                        .prepare_known("c", std::slice::from_ref(&report), &rules, 2)
                        .unwrap(),
                )
        };
        let stored = |ingest: &Ingest, url: &str| match ingest.check_url("c", url).unwrap() {
            UrlCheck::Checked { stored, .. } => stored,
            UrlCheck::Refused(error) => panic!("{url}: {error}"),
        };

        let _untracked = ingest.seal_partition(page_partition as u32);
        assert!(matches!(
            ingest.submit(joined(&ingest)),
            Err(IngestError::PartitionMoving(p)) if p as usize == page_partition
        ));
        for link in &outlinks {
            assert!(stored(&ingest, &link.url).is_none(), "{} stored", link.url);
        }
        assert!(!stored(&ingest, page).unwrap().is_completed());

        ingest.unseal_partition(page_partition as u32);
        let outcomes = ingest
            .wait(ingest.submit(joined(&ingest)).unwrap())
            .unwrap();
        assert_eq!(outcomes, vec![Outcome::Stored; outlinks.len() + 1]);
        for link in &outlinks {
            assert!(stored(&ingest, &link.url).is_some(), "{} lost", link.url);
        }
        assert!(stored(&ingest, page).unwrap().is_completed());
        assert_eq!(stored_keys_in_filters(&ingest), outlinks.len() as u64 + 1);
    }
}
