//! A partition's URLs copied from one store into another: the unit a
//! cluster moves between nodes. The sender reads the partition in its
//! store's order, a page at a time from a snapshot, so a copy that broke
//! resumes after the last URL taken; the receiver takes each page through the group commit and
//! teaches its filter a URL only once the URL's record is durable, so the
//! filter holds every key the store holds at every moment of the copy.
//!
//! The sender notes what is written to a partition while it is copied
//! (tracking starts before the first page is read, so every write is in a
//! page's snapshot or noted): a cutover, once writes to the partition have
//! stopped, sends only those URLs again. A deletion cannot be sent that way
//! (the receiver would not learn which URLs went), so after one the
//! receiver takes the whole partition again.
//!
//! Taking is idempotent: a URL the receiver does not hold is stored whole
//! (created date, depth, queue, due date, metadata), and one it holds takes
//! the sender's queue, due date and metadata (created date and depth never
//! change for a URL). A page taken twice, or a later copy of a URL the
//! sender changed after an earlier page, leaves the sender's latest state.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

use super::{Ingest, IngestError, canonicalise};
use crate::record::UrlRecord;
use crate::store::{Applied, Deletion, KnownUrl, NewUrl, WriteOp};

/// URLs per commit when a partition's copy is deleted.
const DROP_CHUNK: usize = 20_000;

/// One URL of a partition as it travels between stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionUrl {
    /// The crawl.
    pub crawl: String,
    /// The canonical URL.
    pub url: String,
    /// Everything the sender stores for it.
    pub record: UrlRecord,
}

/// What was written to a tracked partition since its tracking began or
/// its changes were last taken.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// (crawl, URL) of every URL stored or changed, in key order.
    pub touched: BTreeSet<(String, String)>,
    /// A deletion removed URLs of the partition.
    pub deleted: bool,
}

/// A sealed partition's tail: what was written to it during its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedTail {
    /// URLs stored or changed.
    pub urls: usize,
    /// A deletion reached the partition: the tail cannot say what went.
    pub deleted: bool,
}

/// The partitions being copied out and what was written to each; fed by
/// the commit hook, in commit order.
#[derive(Debug, Default)]
pub(super) struct CopyTracker {
    tracked: Mutex<HashMap<u32, Changes>>,
    /// Per partition, the URLs of the catch-up round being read.
    rounds: Mutex<HashMap<u32, BTreeSet<(String, String)>>>,
}

impl CopyTracker {
    pub(super) fn on_commit(&self, ops: &[WriteOp], applied: &[Applied]) {
        let mut tracked = self.tracked.lock().unwrap_or_else(PoisonError::into_inner);
        if tracked.is_empty() {
            return;
        }
        for (op, applied) in ops.iter().zip(applied) {
            let (partition, crawl, url) = match (op, applied) {
                (WriteOp::Discover(new), Applied::Discovered { stored: true }) => {
                    (new.partition, &new.crawl, &new.url)
                }
                (WriteOp::Known(known), _) => (known.partition, &known.crawl, &known.url),
                (WriteOp::Delete(_), Applied::Deleted(removed)) => {
                    for partition in removed.per_partition.keys() {
                        if let Some(changes) = tracked.get_mut(partition) {
                            changes.deleted = true;
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            if let Some(changes) = tracked.get_mut(&partition) {
                changes.touched.insert((crawl.clone(), url.clone()));
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Changes>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, HashMap<u32, BTreeSet<(String, String)>>> {
        self.rounds.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Up to `limit` keys of `keys` after `after`, and whether none follow.
fn keys_after(
    keys: &BTreeSet<(String, String)>,
    after: Option<&(String, String)>,
    limit: usize,
) -> (Vec<(String, String)>, bool) {
    let mut page: Vec<(String, String)> = match after {
        Some(after) => keys
            .range::<(String, String), _>((
                std::ops::Bound::Excluded(after),
                std::ops::Bound::Unbounded,
            ))
            .take(limit + 1)
            .cloned()
            .collect(),
        None => keys.iter().take(limit + 1).cloned().collect(),
    };
    let end = page.len() <= limit;
    page.truncate(limit);
    (page, end)
}

/// What taking a page did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Taken {
    /// URLs this store did not hold, now stored.
    pub stored: u64,
    /// URLs it held, now in the sender's state.
    pub updated: u64,
}

/// Why a page cannot be taken; nothing of it was stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TakeError {
    /// A URL does not belong where it was sent: not canonical, or of
    /// another partition (the stores differ in partition count or rules of
    /// canonicalisation, or the page is damaged).
    #[error("{url:?} of crawl {crawl:?} is not a canonical URL of partition {partition}: {reason}")]
    Misplaced {
        crawl: String,
        url: String,
        partition: u32,
        reason: String,
    },
    /// The partition is not one of this store's.
    #[error("partition {partition} is not one of this store's {partitions}")]
    NoSuchPartition { partition: u32, partitions: usize },
    /// The store failed.
    #[error(transparent)]
    Ingest(#[from] IngestError),
}

/// The write that gives a URL the sender's state: its queue, due date and
/// metadata (its created date and depth never change).
fn known_state(partition: u32, moved: &PartitionUrl) -> WriteOp {
    WriteOp::Known(KnownUrl {
        crawl: moved.crawl.clone(),
        url: moved.url.clone(),
        partition,
        queue_key: Some(moved.record.queue_key.clone()),
        default_queue: moved.record.queue_key.clone(),
        due_at: moved.record.due_at,
        metadata: moved.record.metadata.clone(),
        now: moved.record.created_at,
        report: None,
    })
}

impl Ingest {
    /// Up to `limit` URLs of a partition after the URL `after` (crawl,
    /// URL), in the store's order, from one snapshot, and whether the
    /// partition ends with them ([`crate::store::Store::partition_page`]).
    pub fn partition_page(
        &self,
        partition: u32,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<(Vec<PartitionUrl>, bool), IngestError> {
        let (page, end) = self.store.partition_page(partition, after, limit)?;
        let page = page
            .into_iter()
            .map(|(crawl, url, record)| PartitionUrl { crawl, url, record })
            .collect();
        Ok((page, end))
    }

    /// Takes a page of another store's partition in (module docs); durable
    /// when this returns.
    pub fn take_partition_urls(
        &self,
        partition: u32,
        urls: Vec<PartitionUrl>,
    ) -> Result<Taken, TakeError> {
        self.take_pages(vec![(partition, urls)])
    }

    /// Takes pages of several partitions in, as [`Self::take_partition_urls`]
    /// does one, in one commit: a leader's batch to its follower.
    ///
    /// A URL the filter has never seen is new for certain and is stored
    /// whole; one it may hold is stored whole if new and then, in the same
    /// group, given the sender's state (a write after a write of the same
    /// key sees the first). Were a URL the filter called new stored by
    /// another write meanwhile, a second commit gives it the sender's state.
    pub fn take_pages(&self, pages: Vec<(u32, Vec<PartitionUrl>)>) -> Result<Taken, TakeError> {
        let partitions = self.filters.partition_count();
        for (partition, urls) in &pages {
            if *partition as usize >= partitions {
                return Err(TakeError::NoSuchPartition {
                    partition: *partition,
                    partitions,
                });
            }
            for moved in urls {
                self.check_placed(*partition, moved)?;
            }
        }
        let committer = self
            .committer
            .as_ref()
            .ok_or(IngestError::Store(crate::store::StoreError::Stopped))?;
        let mut ops = Vec::new();
        // Per URL: its partition, its discovery's index in `ops`, and
        // whether a state follows it there.
        let mut placed = Vec::new();
        for (partition, urls) in &pages {
            for moved in urls {
                let maybe = self
                    .filters
                    .contains(
                        *partition as usize,
                        self.filter_key(&moved.crawl, &moved.url),
                    )
                    .map_err(IngestError::from)?;
                placed.push((*partition, ops.len(), maybe));
                ops.push(WriteOp::Discover(NewUrl {
                    crawl: moved.crawl.clone(),
                    url: moved.url.clone(),
                    partition: *partition,
                    maybe_known: maybe,
                    record: moved.record.clone(),
                }));
                if maybe {
                    ops.push(known_state(*partition, moved));
                }
            }
        }
        let applied = committer.apply(ops).map_err(IngestError::from)?;
        let mut taken = Taken::default();
        let mut held = Vec::new();
        let urls = pages.iter().flat_map(|(_, urls)| urls);
        for (&(partition, at, maybe), moved) in placed.iter().zip(urls) {
            match (&applied[at], maybe) {
                (Applied::Discovered { stored: true }, _) => {
                    self.learn(partition, moved)?;
                    taken.stored += 1;
                }
                (_, true) => taken.updated += 1,
                (_, false) => held.push((partition, moved)),
            }
        }
        if held.is_empty() {
            return Ok(taken);
        }
        let ops = held
            .iter()
            .map(|(partition, moved)| known_state(*partition, moved))
            .collect();
        let applied = committer.apply(ops).map_err(IngestError::from)?;
        for ((partition, moved), applied) in held.iter().zip(applied) {
            // Removed between the two commits (a deletion) and so created
            // again by the second: the filter learns it as new.
            if matches!(applied, Applied::Known { previous: None, .. }) {
                self.learn(*partition, moved)?;
                taken.stored += 1;
            } else {
                taken.updated += 1;
            }
        }
        Ok(taken)
    }

    /// Removes every URL of a partition, of every crawl, durably: the
    /// sender's copy, once the partition's new owner serves it and no
    /// writes for it come here. The partition's filter is then rebuilt from
    /// the store, so it does not go on holding the keys that left. Queues
    /// keep their settings. Answers how many URLs went.
    pub fn drop_partition(&self, partition: u32) -> Result<u64, TakeError> {
        self.drop_partition_in_chunks(partition, DROP_CHUNK)
    }

    fn drop_partition_in_chunks(&self, partition: u32, chunk: usize) -> Result<u64, TakeError> {
        let partitions = self.filters.partition_count();
        if partition as usize >= partitions {
            return Err(TakeError::NoSuchPartition {
                partition,
                partitions,
            });
        }
        self.forget_followed(partition)?;
        // Per crawl, every `chunk`-th URL ends a chunk (the chunk is
        // what sorts before it), and a last deletion takes the crawl's rest.
        let mut chunks: Vec<(String, Option<String>)> = Vec::new();
        let mut current: Option<String> = None;
        let mut in_chunk = 0;
        self.store
            .for_each_url_in_partition(partition, |crawl, url| {
                if current.as_deref() != Some(crawl) {
                    if let Some(done) = current.replace(crawl.to_owned()) {
                        chunks.push((done, None));
                    }
                    in_chunk = 0;
                }
                if in_chunk == chunk {
                    chunks.push((crawl.to_owned(), Some(url.to_owned())));
                    in_chunk = 0;
                }
                in_chunk += 1;
            })
            .map_err(IngestError::from)?;
        if let Some(done) = current {
            chunks.push((done, None));
        }
        let mut dropped = 0;
        let committer = self
            .committer
            .as_ref()
            .ok_or(IngestError::Store(crate::store::StoreError::Stopped))?;
        // One commit per chunk, so the node's other writes go on between.
        for (crawl, below) in chunks {
            let op = WriteOp::Delete(Deletion {
                crawl,
                queue: None,
                created_before: None,
                partitions: partitions as u32,
                partition: Some(partition),
                urls_below: below,
            });
            for applied in committer.apply(vec![op]).map_err(IngestError::from)? {
                if let Applied::Deleted(removed) = applied {
                    dropped += removed.urls;
                }
            }
        }
        self.forget_followed(partition)?;
        self.counters[partition as usize]
            .stored
            .store(0, Ordering::Relaxed);
        self.rebuild_partition(
            partition as usize,
            self.config.rebuilt_capacity(partition as usize, 0),
        )?;
        Ok(dropped)
    }

    /// Starts noting what is written to a partition, from nothing (also
    /// when it was tracked already): call before a copy reads its first
    /// page.
    pub fn track_partition(&self, partition: u32) {
        self.copies.lock().insert(partition, Changes::default());
        self.copies.rounds().remove(&partition);
    }

    /// Starts noting what is written to a partition as
    /// [`Self::track_partition`] does, seeded with the keys `noted` answers
    /// once noting has begun (what a leader noted for a lagging follower:
    /// every write is then in one or the other), so that the catch-up
    /// rounds send them. Answers how many were seeded; `None`, and nothing
    /// is noted, when `noted` has none to give.
    pub fn track_partition_seeded(
        &self,
        partition: u32,
        noted: impl FnOnce() -> Option<BTreeSet<(String, String)>>,
    ) -> Option<usize> {
        self.track_partition(partition);
        let Some(keys) = noted() else {
            self.untrack_partition(partition);
            return None;
        };
        let seeded = keys.len();
        if let Some(changes) = self.copies.lock().get_mut(&partition) {
            changes.touched.extend(keys);
        }
        Some(seeded)
    }

    /// Begins a catch-up round of a tracked partition: what was written to
    /// it since its tracking began (or the last round began) becomes the
    /// round, read with [`Self::catch_up_page`], and noting starts afresh.
    /// Answers the round's size; `None` when the partition is not tracked
    /// or a deletion reached it (a round cannot say what went: the seal
    /// will answer it has no tail, and the receiver copies it whole).
    /// Rounds before the seal leave it only what was written during the
    /// last one, so the cutover is short.
    pub fn begin_catch_up(&self, partition: u32) -> Option<usize> {
        let mut tracked = self.copies.lock();
        let changes = tracked.get_mut(&partition)?;
        if changes.deleted {
            return None;
        }
        let round = std::mem::take(&mut changes.touched);
        drop(tracked);
        let size = round.len();
        self.copies.rounds().insert(partition, round);
        Some(size)
    }

    /// Up to `limit` URLs of a partition's catch-up round after the key
    /// `after`, as this store holds them now, and whether the round ends
    /// with them; `None` when no round is under way (the owner restarted).
    pub fn catch_up_page(
        &self,
        partition: u32,
        after: Option<&(String, String)>,
        limit: usize,
    ) -> Result<Option<(Vec<PartitionUrl>, bool)>, IngestError> {
        let found = (self.copies.rounds())
            .get(&partition)
            .map(|round| keys_after(round, after, limit));
        self.urls_of_keys(partition, found)
    }

    /// The URLs of a page of keys (and whether it ends its set), as this
    /// store holds them now.
    fn urls_of_keys(
        &self,
        partition: u32,
        found: Option<(Vec<(String, String)>, bool)>,
    ) -> Result<Option<(Vec<PartitionUrl>, bool)>, IngestError> {
        let Some((keys, end)) = found else {
            return Ok(None);
        };
        Ok(Some((self.partition_urls(partition, &keys)?, end)))
    }

    /// What was written to a partition since its tracking began or this was
    /// last asked; tracking goes on. `None` when the partition is not
    /// tracked, as after a restart: the receiver then takes it whole.
    pub fn take_partition_changes(&self, partition: u32) -> Option<Changes> {
        self.copies.lock().get_mut(&partition).map(std::mem::take)
    }

    /// Stops tracking a partition.
    pub fn untrack_partition(&self, partition: u32) {
        self.copies.lock().remove(&partition);
        self.copies.rounds().remove(&partition);
    }

    /// The URLs of `keys` (crawl, URL) as this store holds them now; those
    /// it does not hold are left out.
    pub fn partition_urls<'a>(
        &self,
        partition: u32,
        keys: impl IntoIterator<Item = &'a (String, String)>,
    ) -> Result<Vec<PartitionUrl>, IngestError> {
        let mut held = Vec::new();
        for (crawl, url) in keys {
            if let Some(record) = self.store.get(partition, crawl, url)? {
                held.push(PartitionUrl {
                    crawl: crawl.clone(),
                    url: url.clone(),
                    record,
                });
            }
        }
        Ok(held)
    }

    /// Stops writes to a partition (a write already past its check is
    /// waited for), then answers the size of what was written to it since
    /// its tracking began (or its changes were last taken), or `None` if it
    /// was not tracked; [`Self::sealed_tail_page`] reads it. Deletions are
    /// refused while any partition is sealed. Sealing again answers the
    /// same, so a receiver that crashed after a seal gets the whole tail
    /// again.
    pub fn seal_partition(&self, partition: u32) -> Option<SealedTail> {
        self.sealed
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(partition);
        // Writes past their check are queued (they hold the lock until
        // then); the tail is complete once they have committed. A barrier
        // that fails shares its group's failure: those writes were not
        // stored either.
        if let Some(committer) = &self.committer {
            let _ = committer.barrier();
        }
        self.copies
            .lock()
            .get(&partition)
            .map(|changes| SealedTail {
                urls: changes.touched.len(),
                deleted: changes.deleted,
            })
    }

    /// Up to `limit` URLs of a sealed partition's tail after the key
    /// `after`, in key order, as this store holds them now (a URL since
    /// deleted is left out), and whether the tail ends with them; `None`
    /// when the partition is not tracked. Paged so that a tail of any size
    /// travels in bounded answers.
    pub fn sealed_tail_page(
        &self,
        partition: u32,
        after: Option<&(String, String)>,
        limit: usize,
    ) -> Result<Option<(Vec<PartitionUrl>, bool)>, IngestError> {
        let found = (self.copies.lock())
            .get(&partition)
            .map(|changes| keys_after(&changes.touched, after, limit));
        self.urls_of_keys(partition, found)
    }

    /// Whether a partition takes no writes now.
    #[must_use]
    pub fn is_sealed(&self, partition: u32) -> bool {
        self.open_for_writes().contains(&partition)
    }

    /// Lets writes reach a partition again.
    pub fn unseal_partition(&self, partition: u32) {
        self.sealed
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&partition);
    }

    /// The sealed partitions, held shared until the caller's write has
    /// committed.
    fn open_for_writes(&self) -> std::sync::RwLockReadGuard<'_, BTreeSet<u32>> {
        self.sealed.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds writes to `partitions` open until the guard drops (keep it
    /// until the write has committed), or refuses if one of them is sealed.
    pub(super) fn writes_open_to(
        &self,
        partitions: impl IntoIterator<Item = usize>,
    ) -> Result<std::sync::RwLockReadGuard<'_, BTreeSet<u32>>, IngestError> {
        let sealed = self.open_for_writes();
        match partitions
            .into_iter()
            .find(|partition| sealed.contains(&(*partition as u32)))
        {
            Some(partition) => Err(IngestError::PartitionMoving(partition as u32)),
            None => Ok(sealed),
        }
    }

    /// A URL the store now holds joins its partition's filter.
    fn learn(&self, partition: u32, moved: &PartitionUrl) -> Result<(), IngestError> {
        let partition = partition as usize;
        self.filters
            .insert(partition, self.filter_key(&moved.crawl, &moved.url))?;
        self.counters[partition]
            .stored
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn check_placed(&self, partition: u32, moved: &PartitionUrl) -> Result<(), TakeError> {
        let misplaced = |reason: String| TakeError::Misplaced {
            crawl: moved.crawl.clone(),
            url: moved.url.clone(),
            partition,
            reason,
        };
        let canonical = canonicalise(&moved.url, self.max_url_length)
            .map_err(|error| misplaced(error.to_string()))?;
        if canonical.as_str() != moved.url {
            return Err(misplaced(format!("its canonical form is {canonical}")));
        }
        let home = self.partition_of(&moved.crawl, canonical.host());
        if home != partition as usize {
            return Err(misplaced(format!("its partition here is {home}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::ingest::{DedupMode, Discovered, FilterConfig, Known, Outcome, partition_of};
    use crate::scope::Rules;
    use crate::store::Store;

    fn open(dir: &std::path::Path) -> Ingest {
        let config = FilterConfig {
            partitions: 4,
            expected_urls_per_partition: 1000,
            ..FilterConfig::default()
        };
        Ingest::open(Store::open(dir).unwrap(), config, DedupMode::Exact, 2048).unwrap()
    }

    fn discover(ingest: &Ingest, crawl: &str, urls: &[String]) {
        let items: Vec<Discovered> = urls
            .iter()
            .map(|url| Discovered {
                url: url.clone(),
                depth: 2,
                ..Discovered::default()
            })
            .collect();
        let outcomes = ingest
            .put_discovered(crawl, &items, &Rules::default(), 1_000)
            .unwrap();
        assert!(outcomes.iter().all(|o| *o == Outcome::Stored));
    }

    /// Every URL of `partition`, read a page of `page` at a time.
    fn whole(ingest: &Ingest, partition: u32, page: usize) -> Vec<PartitionUrl> {
        let mut all: Vec<PartitionUrl> = Vec::new();
        loop {
            let after = all.last().map(|u| (u.crawl.clone(), u.url.clone()));
            let (next, end) = ingest
                .partition_page(
                    partition,
                    after.as_ref().map(|(c, u)| (c.as_str(), u.as_str())),
                    page,
                )
                .unwrap();
            all.extend(next);
            if end {
                return all;
            }
        }
    }

    /// URLs in (crawl, URL) order: two stores order a partition by their
    /// own hashes.
    fn sorted(mut urls: Vec<PartitionUrl>) -> Vec<PartitionUrl> {
        urls.sort_by(|a, b| (&a.crawl, &a.url).cmp(&(&b.crawl, &b.url)));
        urls
    }

    #[test]
    fn a_partition_copied_page_by_page_arrives_whole_and_its_filter_holds_every_key() {
        let (from_dir, to_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (from, to) = (open(from_dir.path()), open(to_dir.path()));
        let urls: Vec<String> = (0..40)
            .map(|i| format!("http://host{}.example/p/{i}", i % 7))
            .collect();
        discover(&from, "c1", &urls);
        discover(&from, "c2", &urls[..10]);
        let mut copied = 0;
        for partition in 0..4 {
            let pages = whole(&from, partition, 3);
            let expected = from.partition_page(partition, None, usize::MAX).unwrap().0;
            assert_eq!(
                pages, expected,
                "paging reads each URL once, in the store's order"
            );
            for chunk in pages.chunks(5) {
                to.take_partition_urls(partition, chunk.to_vec()).unwrap();
            }
            // Taken twice: nothing new, every URL updated in place.
            let again = to.take_partition_urls(partition, pages.clone()).unwrap();
            assert_eq!(again.stored, 0);
            assert_eq!(again.updated, pages.len() as u64);
            assert_eq!(sorted(whole(&to, partition, 1000)), sorted(pages.clone()));
            for moved in &pages {
                let key = to.filter_key(&moved.crawl, &moved.url);
                assert!(to.filters().contains(partition as usize, key).unwrap());
            }
            copied += pages.len();
        }
        assert_eq!(copied, 50);
        // The copy deduplicates as the original does.
        let outcomes = to
            .put_discovered(
                "c1",
                &[Discovered {
                    url: urls[3].clone(),
                    ..Discovered::default()
                }],
                &Rules::default(),
                2_000,
            )
            .unwrap();
        assert_ne!(outcomes[0], Outcome::Stored);
    }

    #[test]
    fn pages_of_several_partitions_are_taken_in_one_commit_in_the_senders_state() {
        let (from_dir, to_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (from, to) = (open(from_dir.path()), open(to_dir.path()));
        let urls: Vec<String> = (0..40)
            .map(|i| format!("http://host{}.example/p/{i}", i % 7))
            .collect();
        discover(&from, "c1", &urls);
        let first: Vec<(u32, Vec<PartitionUrl>)> =
            (0..4).map(|p| (p, whole(&from, p, 1000))).collect();
        let half: Vec<(u32, Vec<PartitionUrl>)> = first
            .iter()
            .map(|(p, urls)| (*p, urls.iter().step_by(2).cloned().collect()))
            .collect();
        let held: u64 = half.iter().map(|(_, urls)| urls.len() as u64).sum();
        to.take_pages(half).unwrap();
        // The sender completes some URLs and reschedules others.
        let changed: Vec<Known> = urls
            .iter()
            .step_by(3)
            .enumerate()
            .map(|(i, url)| Known {
                url: url.clone(),
                due_at: if i % 2 == 0 { 0 } else { 5_000 },
                metadata: BTreeMap::from([("k".into(), vec![i.to_string()])]),
                ..Known::default()
            })
            .collect();
        from.put_known("c1", &changed, &Rules::default(), 2_000)
            .unwrap();
        let now: Vec<(u32, Vec<PartitionUrl>)> =
            (0..4).map(|p| (p, whole(&from, p, 1000))).collect();
        let committer = to.committer.as_ref().unwrap();
        let commits = committer.commits();
        let taken = to.take_pages(now.clone()).unwrap();
        assert_eq!(
            committer.commits(),
            commits + 1,
            "one commit for every partition"
        );
        assert_eq!(taken.stored, 40 - held, "those not taken before");
        assert_eq!(taken.updated, held);
        for (partition, urls) in now {
            assert_eq!(sorted(whole(&to, partition, 1000)), sorted(urls.clone()));
            for moved in &urls {
                let key = to.filter_key(&moved.crawl, &moved.url);
                assert!(to.filters().contains(partition as usize, key).unwrap());
            }
        }
    }

    #[test]
    fn the_leader_a_copy_follows_is_kept_on_disk_until_the_partition_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let ingest = open(dir.path());
        assert_eq!(ingest.followed_leader(1).unwrap(), None, "a new store");
        ingest.note_followed(1, "n1").unwrap();
        ingest.note_followed(2, "n1").unwrap();
        ingest.note_followed(1, "n2").unwrap();
        drop(ingest);
        let ingest = open(dir.path());
        assert_eq!(ingest.followed_leader(1).unwrap().as_deref(), Some("n2"));
        assert_eq!(ingest.followed_leader(2).unwrap().as_deref(), Some("n1"));
        ingest.drop_partition(1).unwrap();
        assert_eq!(ingest.followed_leader(1).unwrap(), None);
        drop(ingest);
        let ingest = open(dir.path());
        assert_eq!(ingest.followed_leader(1).unwrap(), None, "gone on disk");
        assert_eq!(ingest.followed_leader(2).unwrap().as_deref(), Some("n1"));
    }

    #[test]
    fn a_dropped_partition_leaves_the_others_whole_and_its_urls_can_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let from = open(dir.path());
        let urls: Vec<String> = (0..40)
            .map(|i| format!("http://host{}.example/p/{i}", i % 7))
            .collect();
        discover(&from, "c1", &urls);
        discover(&from, "c2", &urls[..10]);
        let before: Vec<Vec<PartitionUrl>> = (0..4).map(|p| whole(&from, p, 100)).collect();
        let gone = before
            .iter()
            .position(|urls| urls.iter().filter(|u| u.crawl == "c2").count() > 3)
            .unwrap() as u32;
        // Chunks of 3: several commits per crawl, the last taking the rest.
        let dropped = from.drop_partition_in_chunks(gone, 3).unwrap();
        assert_eq!(dropped, before[gone as usize].len() as u64);
        for partition in 0..4 {
            let left = whole(&from, partition, 100);
            if partition == gone {
                assert!(left.is_empty());
            } else {
                assert_eq!(left, before[partition as usize]);
            }
        }
        // A URL that left can be stored again: the filter forgot it too,
        // or the store refutes its "maybe".
        let back = &before[gone as usize][0];
        let outcomes = from
            .put_discovered(
                &back.crawl,
                &[Discovered {
                    url: back.url.clone(),
                    ..Discovered::default()
                }],
                &Rules::default(),
                3_000,
            )
            .unwrap();
        assert_eq!(outcomes, vec![Outcome::Stored]);
        assert_eq!(from.drop_partition(gone).unwrap(), 1);
        assert_eq!(from.drop_partition(gone).unwrap(), 0);
        assert!(matches!(
            from.drop_partition(4),
            Err(TakeError::NoSuchPartition { .. })
        ));
    }

    #[test]
    fn a_copy_while_writes_go_on_plus_the_noted_changes_is_exact() {
        let (from_dir, to_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (from, to) = (open(from_dir.path()), open(to_dir.path()));
        let host = |i: usize| format!("http://h{}.example/", i % 3);
        let urls: Vec<String> = (0..30).map(|i| format!("{}{i}", host(i))).collect();
        discover(&from, "c", &urls[..20]);
        let partition = partition_of("c", "h0.example", 4) as u32;
        assert_eq!(from.take_partition_changes(partition), None, "not tracked");
        from.track_partition(partition);
        // Copy the first page, then writes land: new URLs, a report.
        let first = from.partition_page(partition, None, 2).unwrap().0;
        to.take_partition_urls(partition, first.clone()).unwrap();
        discover(&from, "c", &urls[20..]);
        let reported = first[0].clone();
        from.put_known(
            "c",
            &[crate::ingest::Known {
                url: reported.url.clone(),
                due_at: 0,
                ..crate::ingest::Known::default()
            }],
            &Rules::default(),
            5,
        )
        .unwrap();
        let after = (first[1].crawl.as_str(), first[1].url.as_str());
        let rest = from
            .partition_page(partition, Some(after), usize::MAX)
            .unwrap()
            .0;
        to.take_partition_urls(partition, rest).unwrap();
        // The cutover: what changed is sent again.
        let changes = from.take_partition_changes(partition).unwrap();
        assert!(!changes.deleted);
        assert!(
            changes
                .touched
                .contains(&(reported.crawl.clone(), reported.url.clone()))
        );
        let tail = from.partition_urls(partition, &changes.touched).unwrap();
        to.take_partition_urls(partition, tail).unwrap();
        assert_eq!(
            sorted(whole(&to, partition, 7)),
            sorted(whole(&from, partition, 7))
        );
        assert_eq!(
            from.take_partition_changes(partition),
            Some(Changes::default())
        );
        // A deletion is noted as such; untracked, nothing is noted.
        from.delete("c", Some("h0.example"), None).unwrap();
        let changes = from.take_partition_changes(partition).unwrap();
        assert!(changes.deleted);
        from.untrack_partition(partition);
        assert_eq!(from.take_partition_changes(partition), None);
    }

    #[test]
    fn a_sealed_partition_takes_no_writes_until_unsealed() {
        let dir = tempfile::tempdir().unwrap();
        let from = open(dir.path());
        let partition = partition_of("c", "a.example", 4) as u32;
        let other = (b'b'..=b'z')
            .map(|c| format!("{}.example", c as char))
            .find(|host| partition_of("c", host, 4) as u32 != partition)
            .unwrap();
        from.track_partition(partition);
        discover(&from, "c", &["http://a.example/1".to_owned()]);
        let tail = from.seal_partition(partition).unwrap();
        assert_eq!(
            tail,
            SealedTail {
                urls: 1,
                deleted: false
            }
        );
        let refused = from
            .put_discovered(
                "c",
                &[Discovered {
                    url: "http://a.example/2".into(),
                    ..Discovered::default()
                }],
                &Rules::default(),
                1,
            )
            .unwrap_err();
        assert!(matches!(refused, IngestError::PartitionMoving(p) if p == partition));
        let known = crate::ingest::Known {
            url: "http://a.example/1".into(),
            ..crate::ingest::Known::default()
        };
        assert!(matches!(
            from.put_known("c", std::slice::from_ref(&known), &Rules::default(), 1),
            Err(IngestError::PartitionMoving(_))
        ));
        assert!(matches!(
            from.delete("c", None, None),
            Err(IngestError::PartitionMoving(_))
        ));
        // Other partitions take writes; nothing reached the sealed one.
        discover(&from, "c", &[format!("http://{other}/1")]);
        assert_eq!(from.partition_page(partition, None, 10).unwrap().0.len(), 1);
        assert_eq!(
            from.seal_partition(partition),
            Some(tail),
            "sealed again: the same tail"
        );
        from.unseal_partition(partition);
        discover(&from, "c", &["http://a.example/2".to_owned()]);
        from.put_known("c", &[known], &Rules::default(), 1).unwrap();
    }

    #[test]
    fn a_sealed_tail_is_read_in_pages_in_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let from = open(dir.path());
        let partition = partition_of("c", "a.example", 4) as u32;
        assert_eq!(from.sealed_tail_page(partition, None, 2).unwrap(), None);
        discover(&from, "c", &["http://a.example/before".to_owned()]);
        from.track_partition(partition);
        let written: Vec<String> = (0..7).map(|i| format!("http://a.example/{i}")).collect();
        discover(&from, "c", &written);
        assert_eq!(from.seal_partition(partition).unwrap().urls, 7);
        let mut after = None;
        let mut read = Vec::new();
        let mut pages = 0;
        loop {
            let (page, end) = from
                .sealed_tail_page(partition, after.as_ref(), 3)
                .unwrap()
                .unwrap();
            pages += 1;
            assert!(page.len() <= 3);
            after = page.last().map(|u| (u.crawl.clone(), u.url.clone()));
            read.extend(page.into_iter().map(|u| u.url));
            if end {
                break;
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(read, written, "every URL written since tracking, once");
    }

    #[test]
    fn catch_up_rounds_each_take_what_the_one_before_left_and_the_seal_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let from = open(dir.path());
        let partition = partition_of("c", "a.example", 4) as u32;
        assert_eq!(from.begin_catch_up(partition), None, "not tracked");
        from.track_partition(partition);
        let during_copy: Vec<String> = (0..5).map(|i| format!("http://a.example/c{i}")).collect();
        discover(&from, "c", &during_copy);
        assert_eq!(from.begin_catch_up(partition), Some(5));
        let during_round: Vec<String> = (0..2).map(|i| format!("http://a.example/r{i}")).collect();
        discover(&from, "c", &during_round);
        let (first, end) = from.catch_up_page(partition, None, 3).unwrap().unwrap();
        assert!(!end);
        let after = first.last().map(|u| (u.crawl.clone(), u.url.clone()));
        let (rest, end) = from
            .catch_up_page(partition, after.as_ref(), 3)
            .unwrap()
            .unwrap();
        assert!(end);
        let round: Vec<String> = first.iter().chain(&rest).map(|u| u.url.clone()).collect();
        assert_eq!(round, during_copy);
        // The next round is what arrived during this one; then the seal
        // answers only what came after that.
        assert_eq!(from.begin_catch_up(partition), Some(2));
        assert_eq!(from.seal_partition(partition).unwrap().urls, 0);
        from.unseal_partition(partition);
        // After a deletion no round can say what went.
        from.delete("c", Some("a.example"), None).unwrap();
        assert_eq!(from.begin_catch_up(partition), None);
        from.untrack_partition(partition);
        assert_eq!(from.catch_up_page(partition, None, 3).unwrap(), None);
    }

    #[test]
    fn a_later_copy_of_a_url_brings_the_senders_latest_state() {
        let (from_dir, to_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (from, to) = (open(from_dir.path()), open(to_dir.path()));
        let url = "http://a.example/x".to_owned();
        discover(&from, "c", std::slice::from_ref(&url));
        let partition = partition_of("c", "a.example", 4) as u32;
        let first = from.partition_page(partition, None, 10).unwrap().0;
        to.take_partition_urls(partition, first.clone()).unwrap();
        let mut later = first[0].clone();
        later.record.due_at = 0;
        later.record.queue_key = "elsewhere".into();
        later.record.metadata.insert("k".into(), vec!["v".into()]);
        let taken = to
            .take_partition_urls(partition, vec![later.clone()])
            .unwrap();
        assert_eq!(
            taken,
            Taken {
                stored: 0,
                updated: 1
            }
        );
        let held = to.partition_page(partition, None, 10).unwrap().0;
        assert_eq!(held, vec![later.clone()]);
        assert_eq!(held[0].record.created_at, first[0].record.created_at);
        assert_eq!(held[0].record.depth, 2);
    }

    #[test]
    fn urls_of_another_partition_or_not_canonical_are_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let to = open(dir.path());
        let home = partition_of("c", "a.example", 4) as u32;
        let elsewhere = (home + 1) % 4;
        let good = PartitionUrl {
            crawl: "c".into(),
            url: "http://a.example/x".into(),
            record: UrlRecord {
                due_at: 5,
                queue_key: "a.example".into(),
                ..UrlRecord::default()
            },
        };
        let error = to
            .take_partition_urls(elsewhere, vec![good.clone()])
            .unwrap_err();
        assert!(
            error.to_string().contains("its partition here is"),
            "{error}"
        );
        let spelled = PartitionUrl {
            url: "HTTP://A.example/x".into(),
            ..good.clone()
        };
        let error = to
            .take_partition_urls(home, vec![good.clone(), spelled])
            .unwrap_err();
        assert!(error.to_string().contains("canonical form"), "{error}");
        assert!(to.partition_page(home, None, 10).unwrap().0.is_empty());
        let error = to.take_partition_urls(9, vec![good]).unwrap_err();
        assert!(matches!(error, TakeError::NoSuchPartition { .. }));
    }
}
