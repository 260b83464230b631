//! Filters built from the store: all of them at open after a crash, and
//! one partition's online, when it fills.

use std::sync::atomic::Ordering;

use bloom_core::{BloomFilter, PartitionedBloom};

use super::{FilterConfig, Ingest, IngestError, filter_key};
use crate::store::Store;

/// Builds every partition's filter from the record keys the store holds
/// (no URL is built: a filter key is made from the key's hash), each sized
/// as an online rebuild would ([`FilterConfig::rebuilt_capacity`]), so
/// that no filter starts out full; partitions are spread over the
/// machine's cores. Answers the filters and each one's URLs. Runs before
/// any write, so the partitions' snapshots agree.
pub(super) fn filters_from_store(
    store: &Store,
    config: &FilterConfig,
) -> Result<(PartitionedBloom, Vec<u64>), IngestError> {
    let partitions = config.partitions;
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(partitions)
        .max(1);
    let mut built: Vec<(usize, BloomFilter, u64)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|first| {
                scope.spawn(move || -> Result<Vec<_>, IngestError> {
                    let mut built = Vec::new();
                    // One partition's keys at a time: a share of the store.
                    let mut keys = Vec::new();
                    let mut inserted = Vec::new();
                    for partition in (first..partitions).step_by(threads) {
                        keys.clear();
                        let mut count = 0;
                        store.for_each_key_in_partition(
                            partition as u32,
                            |crawl, hash, urls| {
                                keys.push(filter_key(crawl, hash));
                                count += urls as u64;
                            },
                        )?;
                        let filter = BloomFilter::with_layout(
                            config.layout,
                            config.rebuilt_capacity(partition, count),
                            config.fp_rate,
                        )?;
                        filter.insert_batch_into(&keys, &mut inserted);
                        built.push((partition, filter, count));
                    }
                    Ok(built)
                })
            })
            .collect();
        workers.into_iter().try_fold(Vec::new(), |mut all, worker| {
            let built = worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            all.extend(built);
            Ok::<_, IngestError>(all)
        })
    })?;
    built.sort_unstable_by_key(|(partition, _, _)| *partition);
    let (filters, stored) = built
        .into_iter()
        .map(|(_, filter, count)| (filter, count))
        .unzip();
    Ok((PartitionedBloom::from_filters(filters)?, stored))
}

impl Ingest {
    /// Partitions whose filter is predicted fuller than `fill_ratio` and not
    /// being rebuilt already. The prediction, `1 - e^(-kn/m)` from the keys
    /// the partition holds, costs nothing per call, where counting set bits
    /// would read every filter.
    #[must_use]
    pub fn partitions_to_rebuild(&self, fill_ratio: f64) -> Vec<usize> {
        (0..self.counters.len())
            .filter(|&partition| {
                let Ok(filter) = self.filters.filter(partition) else {
                    return false;
                };
                let keys = self.counters[partition].stored.load(Ordering::Relaxed) as f64;
                let predicted =
                    -(-f64::from(filter.hashes()) * keys / filter.bits() as f64).exp_m1();
                predicted > fill_ratio && !self.filters.is_rebuilding(partition).unwrap_or(true)
            })
            .collect()
    }

    /// Keys the store holds for a partition (see [`Self::partitions_to_rebuild`]).
    #[must_use]
    pub fn stored_in_partition(&self, partition: usize) -> Option<u64> {
        self.counters
            .get(partition)
            .map(|c| c.stored.load(Ordering::Relaxed))
    }

    /// Rebuilds every partition predicted fuller than `fill_ratio`, each one
    /// step up its sizes ([`FilterConfig::rebuilt_capacity`]), one after
    /// the other.
    pub fn rebuild_full_partitions(
        &self,
        fill_ratio: f64,
    ) -> Result<Vec<bloom_core::RebuildReport>, IngestError> {
        self.partitions_to_rebuild(fill_ratio)
            .into_iter()
            .map(|partition| {
                let keys = self.counters[partition].stored.load(Ordering::Relaxed);
                self.rebuild_partition(partition, self.config.rebuilt_capacity(partition, keys))
            })
            .collect()
    }

    /// Rebuilds one partition's filter online, sized for `capacity` URLs,
    /// from the record keys the store holds for it. Puts go on meanwhile:
    /// keys they store reach the new filter either through the store
    /// (committed before the rebuild's read began) or by being inserted
    /// into both filters (the store-first order of
    /// `bloom_core::partitioned`).
    pub fn rebuild_partition(
        &self,
        partition: usize,
        capacity: u64,
    ) -> Result<bloom_core::RebuildReport, IngestError> {
        let filter = bloom_core::BloomFilter::with_layout(
            self.config.layout,
            capacity.max(1),
            self.config.fp_rate,
        )?;
        let rebuild = self.filters.begin_rebuild(partition, filter)?;
        // Fed in batches, whose cache misses overlap (bloom_core's
        // `insert_batch_into`).
        const BATCH: usize = 4096;
        let mut keys = Vec::with_capacity(BATCH);
        // The read transaction starts now, after the rebuild began.
        self.store
            .for_each_key_in_partition(partition as u32, |crawl, hash, _| {
                keys.push(filter_key(crawl, hash));
                if keys.len() == BATCH {
                    rebuild.insert_batch(&keys);
                    keys.clear();
                }
            })?;
        rebuild.insert_batch(&keys);
        Ok(rebuild.finish())
    }
}
