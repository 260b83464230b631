//! [`PartitionedBloom`]: P independent filters, their health, and the online
//! rebuild of one partition while inserts and queries go on.
//!
//! # How a rebuild keeps every key
//!
//! Each partition holds an immutable pair `(current, pending)` behind an
//! atomically swapped pointer. Queries read `current`. A rebuild moves
//! through three states:
//!
//! ```text
//! S0 (C, none) --begin--> S1 (C, N) --finish--> S2 (N, none)
//! ```
//!
//! An insert loads the pair once and inserts into both of its filters.
//! The caller's source of keys (the frontier's store) must record each key
//! *before* inserting it into the set, and a rebuild's feed must be read
//! *after* `begin_rebuild` returned. Then every key reaches the new filter N:
//!
//! - an insert that loaded S1 or S2 put its key into N itself;
//! - an insert that loaded S0 loaded it before S1 was installed, and had
//!   recorded its key before that load; the feed, read after S1 was
//!   installed, therefore sees the key. (Had the feed's read of the store
//!   come before the key was recorded, then S1's installation would happen
//!   before the insert's load, which could not have returned S0.)
//!
//! Queries never see a filter missing a key whose insert returned: before the
//! swap they read C, which every insert that loaded S0 or S1 wrote to; after
//! it N, complete by the two points above. `tests/loom.rs` checks this
//! argument over every interleaving of an insert, a query and a rebuild.

use std::time::{Duration, Instant, SystemTime};

use crate::error::FilterError;
use crate::filter::{BloomFilter, Layout};
use crate::hash::KeyHash;
use crate::health::FilterHealth;
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering, SwapCell};

struct Slots {
    current: Arc<BloomFilter>,
    pending: Option<Arc<BloomFilter>>,
}

struct Partition {
    slots: SwapCell<Slots>,
    rebuilding: AtomicBool,
    rebuild_fed: AtomicU64,
    rebuilds: AtomicU64,
    // Written once per rebuild and read by health reports: a plain mutex is
    // the simplest correct thing and is never on the insert or query path.
    last_rebuild: std::sync::Mutex<Option<RebuildReport>>,
}

impl Partition {
    fn new(filter: BloomFilter) -> Self {
        Self {
            slots: SwapCell::new(Slots {
                current: Arc::new(filter),
                pending: None,
            }),
            rebuilding: AtomicBool::new(false),
            rebuild_fed: AtomicU64::new(0),
            rebuilds: AtomicU64::new(0),
            last_rebuild: std::sync::Mutex::new(None),
        }
    }
}

/// What one finished rebuild did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RebuildReport {
    /// The partition rebuilt.
    pub partition: usize,
    /// When the new filter was swapped in.
    pub finished_at: SystemTime,
    /// From `begin_rebuild` to the swap.
    pub duration: Duration,
    /// Size of the filter replaced.
    pub bits_before: u64,
    /// Size of the filter swapped in.
    pub bits_after: u64,
    /// Keys fed from the caller's source.
    pub keys_fed: u64,
}

/// One partition's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartitionHealth {
    /// The partition's index.
    pub partition: usize,
    /// The filter queries are answered from.
    pub filter: FilterHealth,
    /// Whether a rebuild is in progress.
    pub rebuilding: bool,
    /// Keys fed to the rebuild in progress so far.
    pub rebuild_fed: u64,
    /// Rebuilds finished since the set was created.
    pub rebuilds: u64,
    /// The last finished rebuild.
    pub last_rebuild: Option<RebuildReport>,
}

/// Figures over all partitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TotalHealth {
    /// Partitions in the set.
    pub partitions: usize,
    /// Bits over all partitions.
    pub bits: u64,
    /// Bits set over all partitions.
    pub ones: u64,
    /// `ones / bits`.
    pub fill_ratio: f64,
    /// The mean of the partitions' estimated false-positive rates, weighted
    /// by their estimated items: the rate a lookup sees when lookups fall on
    /// partitions in proportion to their keys.
    pub estimated_fp_rate: f64,
    /// Sum of the partitions' estimates.
    pub estimated_items: f64,
    /// Bytes over all partitions.
    pub memory_bytes: u64,
    /// Partitions being rebuilt now.
    pub rebuilding: usize,
    /// Rebuilds finished, over all partitions.
    pub rebuilds: u64,
}

/// Health per partition and in total.
#[derive(Clone, Debug, PartialEq)]
pub struct SetHealth {
    /// One entry per partition, in index order.
    pub partitions: Vec<PartitionHealth>,
    /// The totals.
    pub total: TotalHealth,
}

/// P Bloom filters, each answering for the keys of one partition.
///
/// The caller names a key's partition (the frontier partitions by host, so a
/// host's URLs share a filter that can be rebuilt or moved as a unit), or
/// lets [`KeyHash::partition`] choose. A partition can be rebuilt online
/// (see the module docs for the argument that no key is ever missed).
///
/// ```
/// use bloom_core::{KeyHash, Layout, PartitionedBloom};
///
/// let set = PartitionedBloom::new(4, Layout::Standard, 1_000, 0.01)?;
/// let hash = KeyHash::of(b"https://example.com/a");
/// let partition = hash.partition(set.partition_count());
/// set.insert(partition, hash)?;
///
/// // Rebuild the partition into a bigger filter while it stays in use.
/// let stored = vec![hash];
/// set.rebuild(partition, BloomFilter::new(10_000, 0.01)?, || stored)?;
/// assert!(set.contains(partition, hash)?);
/// # use bloom_core::BloomFilter;
/// # Ok::<(), bloom_core::FilterError>(())
/// ```
pub struct PartitionedBloom {
    partitions: Box<[Partition]>,
}

impl std::fmt::Debug for PartitionedBloom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedBloom")
            .field("partitions", &self.partitions.len())
            .finish()
    }
}

impl PartitionedBloom {
    /// `partitions` filters of one layout, each sized for
    /// `expected_items_per_partition` keys at `fp_rate`.
    pub fn new(
        partitions: usize,
        layout: Layout,
        expected_items_per_partition: u64,
        fp_rate: f64,
    ) -> Result<Self, FilterError> {
        if partitions == 0 {
            return Err(FilterError::ZeroPartitions);
        }
        let filters = (0..partitions)
            .map(|_| BloomFilter::with_layout(layout, expected_items_per_partition, fp_rate))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_filters(filters)
    }

    /// A set over filters built elsewhere (e.g. read from snapshots). They may
    /// differ in size and layout.
    pub fn from_filters(filters: Vec<BloomFilter>) -> Result<Self, FilterError> {
        if filters.is_empty() {
            return Err(FilterError::ZeroPartitions);
        }
        Ok(Self {
            partitions: filters.into_iter().map(Partition::new).collect(),
        })
    }

    /// P.
    #[must_use]
    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    /// The partition the key hash chooses, for callers without a partition
    /// key of their own.
    #[must_use]
    pub fn partition_for(&self, hash: KeyHash) -> usize {
        hash.partition(self.partitions.len())
    }

    fn partition(&self, partition: usize) -> Result<&Partition, FilterError> {
        self.partitions
            .get(partition)
            .ok_or(FilterError::NoSuchPartition {
                partition,
                partitions: self.partitions.len(),
            })
    }

    /// Inserts into one partition; `true` when the key was certainly new to
    /// its current filter (with [`BloomFilter::insert`]'s caveats).
    pub fn insert(&self, partition: usize, hash: KeyHash) -> Result<bool, FilterError> {
        let slots = self.partition(partition)?.slots.load();
        let newly = slots.current.insert_hashed(hash);
        if let Some(pending) = &slots.pending {
            pending.insert_hashed(hash);
        }
        Ok(newly)
    }

    /// Whether the key may be in the partition.
    pub fn contains(&self, partition: usize, hash: KeyHash) -> Result<bool, FilterError> {
        Ok(self
            .partition(partition)?
            .slots
            .load()
            .current
            .contains_hashed(hash))
    }

    /// Inserts into the partition the hash chooses.
    pub fn insert_by_hash(&self, hash: KeyHash) -> bool {
        // The index comes from partition_for, so it exists.
        self.insert(self.partition_for(hash), hash).unwrap_or(false)
    }

    /// Queries the partition the hash chooses.
    #[must_use]
    pub fn contains_by_hash(&self, hash: KeyHash) -> bool {
        self.contains(self.partition_for(hash), hash)
            .unwrap_or(false)
    }

    /// The filter a partition answers from now (e.g. to snapshot it).
    pub fn filter(&self, partition: usize) -> Result<Arc<BloomFilter>, FilterError> {
        Ok(Arc::clone(&self.partition(partition)?.slots.load().current))
    }

    /// Replaces a partition's filter outright, e.g. with one read from a
    /// snapshot at startup. Keys only in the old filter are gone from the
    /// partition, so this is for filters known to be complete. Refused while
    /// the partition is being rebuilt.
    pub fn replace(&self, partition: usize, filter: BloomFilter) -> Result<(), FilterError> {
        let part = self.partition(partition)?;
        if part
            .rebuilding
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(FilterError::AlreadyRebuilding(partition));
        }
        part.slots.store(Slots {
            current: Arc::new(filter),
            pending: None,
        });
        part.rebuilding.store(false, Ordering::Release);
        Ok(())
    }

    /// Starts rebuilding a partition into `filter`. From the moment this
    /// returns, every insert into the partition also goes into `filter`; the
    /// caller feeds it every key inserted before, through the returned
    /// handle, then calls [`Rebuild::finish`] to swap it in. Dropping the
    /// handle without finishing abandons the rebuild and loses nothing.
    pub fn begin_rebuild(
        &self,
        partition: usize,
        filter: BloomFilter,
    ) -> Result<Rebuild<'_>, FilterError> {
        let part = self.partition(partition)?;
        if part
            .rebuilding
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(FilterError::AlreadyRebuilding(partition));
        }
        part.rebuild_fed.store(0, Ordering::Relaxed);
        let current = Arc::clone(&part.slots.load().current);
        let filter = Arc::new(filter);
        part.slots.store(Slots {
            current: Arc::clone(&current),
            pending: Some(Arc::clone(&filter)),
        });
        Ok(Rebuild {
            part,
            partition,
            old: current,
            new: filter,
            started: Instant::now(),
            finished: false,
        })
    }

    /// A whole rebuild: begins it, calls `keys` (after the rebuild began, as
    /// the contract requires) for every key the partition must hold, feeds
    /// them, and swaps the new filter in.
    pub fn rebuild<I>(
        &self,
        partition: usize,
        filter: BloomFilter,
        keys: impl FnOnce() -> I,
    ) -> Result<RebuildReport, FilterError>
    where
        I: IntoIterator<Item = KeyHash>,
    {
        let rebuild = self.begin_rebuild(partition, filter)?;
        rebuild.extend(keys());
        Ok(rebuild.finish())
    }

    /// Whether a partition is being rebuilt now.
    pub fn is_rebuilding(&self, partition: usize) -> Result<bool, FilterError> {
        Ok(self
            .partition(partition)?
            .rebuilding
            .load(Ordering::Acquire))
    }

    /// Partitions whose fill ratio exceeds `fill_threshold` and that are not
    /// being rebuilt already. Counts the set bits of every partition (one
    /// pass over all filters); a caller that knows how many keys each
    /// partition holds can predict the fill more cheaply.
    #[must_use]
    pub fn needs_rebuild(&self, fill_threshold: f64) -> Vec<usize> {
        self.partitions
            .iter()
            .enumerate()
            .filter(|(_, part)| {
                !part.rebuilding.load(Ordering::Acquire)
                    && part.slots.load().current.fill_ratio() > fill_threshold
            })
            .map(|(index, _)| index)
            .collect()
    }

    /// One partition's figures.
    pub fn partition_health(&self, partition: usize) -> Result<PartitionHealth, FilterError> {
        let part = self.partition(partition)?;
        let rebuilding = part.rebuilding.load(Ordering::Acquire);
        Ok(PartitionHealth {
            partition,
            filter: part.slots.load().current.health(),
            rebuilding,
            rebuild_fed: if rebuilding {
                part.rebuild_fed.load(Ordering::Relaxed)
            } else {
                0
            },
            rebuilds: part.rebuilds.load(Ordering::Relaxed),
            last_rebuild: *part
                .last_rebuild
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        })
    }

    /// Figures per partition and in total.
    #[must_use]
    pub fn health(&self) -> SetHealth {
        let partitions: Vec<PartitionHealth> = (0..self.partitions.len())
            .filter_map(|index| self.partition_health(index).ok())
            .collect();
        let bits = partitions.iter().map(|p| p.filter.bits).sum::<u64>();
        let ones = partitions.iter().map(|p| p.filter.ones).sum::<u64>();
        let estimated_items = partitions
            .iter()
            .map(|p| p.filter.estimated_items)
            .sum::<f64>();
        let estimated_fp_rate = if estimated_items > 0.0 {
            partitions
                .iter()
                .map(|p| p.filter.estimated_fp_rate * p.filter.estimated_items)
                .sum::<f64>()
                / estimated_items
        } else {
            0.0
        };
        let total = TotalHealth {
            partitions: partitions.len(),
            bits,
            ones,
            fill_ratio: ones as f64 / bits.max(1) as f64,
            estimated_fp_rate,
            estimated_items,
            memory_bytes: partitions.iter().map(|p| p.filter.memory_bytes).sum(),
            rebuilding: partitions.iter().filter(|p| p.rebuilding).count(),
            rebuilds: partitions.iter().map(|p| p.rebuilds).sum(),
        };
        SetHealth { partitions, total }
    }
}

/// A rebuild in progress; see [`PartitionedBloom::begin_rebuild`].
#[must_use = "a rebuild is abandoned unless finished"]
pub struct Rebuild<'a> {
    part: &'a Partition,
    partition: usize,
    old: Arc<BloomFilter>,
    new: Arc<BloomFilter>,
    started: Instant,
    finished: bool,
}

impl Rebuild<'_> {
    /// Feeds one key the partition must hold.
    pub fn insert(&self, hash: KeyHash) {
        self.new.insert_hashed(hash);
        self.part.rebuild_fed.fetch_add(1, Ordering::Relaxed);
    }

    /// Feeds a slice of keys as one batch (see
    /// [`BloomFilter::insert_batch_into`]: the misses of many keys overlap).
    pub fn insert_batch(&self, hashes: &[KeyHash]) {
        let mut answers = Vec::with_capacity(hashes.len());
        self.new.insert_batch_into(hashes, &mut answers);
        self.part
            .rebuild_fed
            .fetch_add(hashes.len() as u64, Ordering::Relaxed);
    }

    /// Feeds many keys, in batches of 4096.
    pub fn extend(&self, hashes: impl IntoIterator<Item = KeyHash>) {
        const BATCH: usize = 4096;
        let mut hashes = hashes.into_iter();
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            batch.clear();
            batch.extend(hashes.by_ref().take(BATCH));
            if batch.is_empty() {
                break;
            }
            self.insert_batch(&batch);
        }
    }

    /// Keys fed so far.
    #[must_use]
    pub fn fed(&self) -> u64 {
        self.part.rebuild_fed.load(Ordering::Relaxed)
    }

    /// Swaps the new filter in.
    pub fn finish(mut self) -> RebuildReport {
        self.part.slots.store(Slots {
            current: Arc::clone(&self.new),
            pending: None,
        });
        self.finished = true;
        let report = RebuildReport {
            partition: self.partition,
            finished_at: SystemTime::now(),
            duration: self.started.elapsed(),
            bits_before: self.old.bits(),
            bits_after: self.new.bits(),
            keys_fed: self.fed(),
        };
        *self
            .part
            .last_rebuild
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(report);
        self.part.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.part.rebuilding.store(false, Ordering::Release);
        report
    }
}

impl Drop for Rebuild<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // Abandoned: the old filter received every insert meanwhile, so
            // going back to it loses nothing.
            self.part.slots.store(Slots {
                current: Arc::clone(&self.old),
                pending: None,
            });
            self.part.rebuilding.store(false, Ordering::Release);
        }
    }
}
