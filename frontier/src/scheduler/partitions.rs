//! What a cluster node's scheduler needs of partitions: which are served
//! here (module docs of [`super`]: the partition gate), the leases on one,
//! and setting a moved queue's settings whole.

use std::sync::{Arc, PoisonError};

use super::{Crawl, Queue, Scheduler};
use crate::store::{QueueRecord, StoreError};
use crate::time::Timestamp;

impl Scheduler {
    /// Serves only the partitions marked in `served` (by index), or all
    /// with `None`; every queue is looked at again, so one of a partition
    /// now served is woken.
    pub fn set_served_partitions(&self, served: Option<Vec<bool>>) {
        let now = (self.clock)();
        {
            let before = self.serving.load();
            let mut since = self
                .served_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let count = served.as_ref().map_or(0, Vec::len);
            since.resize(count, Timestamp::EPOCH);
            for (partition, slot) in since.iter_mut().enumerate() {
                let was = before
                    .as_ref()
                    .is_some_and(|b| b.get(partition).copied().unwrap_or(false));
                let is = served
                    .as_ref()
                    .is_some_and(|s| s.get(partition).copied().unwrap_or(false));
                if is && !was {
                    *slot = now;
                }
            }
        }
        self.serving.store(served.map(Arc::new));
        for queue in self.every_queue() {
            let mut state = queue.lock();
            let delay = self.delay_of(&queue.crawl, &state.record);
            self.reschedule(&queue, &mut state, delay, now);
        }
    }

    /// How many partitions the served set names (0: all served, no
    /// cluster).
    pub(super) fn partitions_served(&self) -> usize {
        self.serving
            .load()
            .as_ref()
            .map_or(0, |served| served.len())
    }

    /// When `partition` became served here; the epoch when all are, and
    /// never when it is not served.
    pub(super) fn served_since(&self, partition: usize) -> Timestamp {
        if !self
            .serving
            .load()
            .as_ref()
            .is_none_or(|served| served.get(partition).copied().unwrap_or(false))
        {
            return Timestamp::NEVER;
        }
        self.served_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(partition)
            .copied()
            .unwrap_or(Timestamp::EPOCH)
    }

    /// Counts only the partitions marked in `counted` (by index) in this
    /// node's figures, or all with `None`.
    pub fn set_counted_partitions(&self, counted: Option<Vec<bool>>) {
        self.counted.store(counted.map(Arc::new));
    }

    /// Whether this node's figures count URLs of `partition`.
    #[must_use]
    pub fn counts_partition(&self, partition: u32) -> bool {
        self.counted
            .load()
            .as_ref()
            .is_none_or(|counted| counted.get(partition as usize).copied().unwrap_or(false))
    }

    /// The URLs of a partition leased now, and when the last of those
    /// leases ends: what a partition's new owner must not serve before.
    #[must_use]
    pub fn leases_in_partition(&self, partition: u32, now: Timestamp) -> (u64, Timestamp) {
        let mut leased = 0;
        let mut last = now;
        for queue in self.every_queue() {
            let state = queue.lock();
            for lease in state.leased.values() {
                if lease.partition == partition && lease.until > now {
                    leased += 1;
                    last = last.max(lease.until);
                }
            }
        }
        (leased, last)
    }

    /// Every queue of every crawl now, no lock held.
    fn every_queue(&self) -> Vec<Arc<Queue>> {
        let crawls: Vec<Arc<Crawl>> = self
            .crawls
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        crawls.iter().flat_map(|crawl| crawl.all_queues()).collect()
    }

    /// A queue's settings (blocked until, delay, crawl limit) and counts
    /// as held now; `None` for a queue this node has never had.
    #[must_use]
    pub fn queue_record(&self, crawl: &str, queue: &str) -> Option<QueueRecord> {
        self.queue(crawl, queue).map(|queue| queue.lock().record)
    }

    /// Gives a queue the settings of a record (blocked until, delay, crawl
    /// limit; not its counts), durably: a moved queue's settings as its
    /// old owner kept them.
    pub fn set_queue_settings(
        &self,
        crawl: &str,
        queue: &str,
        settings: QueueRecord,
    ) -> Result<(), StoreError> {
        self.update_settings(crawl, queue, |record| {
            record.blocked_until = settings.blocked_until;
            record.delay_ms = settings.delay_ms;
            record.crawl_limit = settings.crawl_limit;
        })
    }
}
