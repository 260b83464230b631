//! Which URLs are served when: queues, the serving gate, and leases.
//!
//! # What lives where
//!
//! The store is the truth: the `due` table holds every URL not completed,
//! in serving order per queue, and `queues` holds each queue's counts and
//! settings. Memory holds, per queue, a mirror of that record, a small
//! buffer of its next due URLs, the URLs leased now, and when it was last
//! served. Leases are memory only: after a restart every URL not completed
//! is servable again, which the API allows (a lease is a promise about this
//! process's serves).
//!
//! # The buffer invariant
//!
//! For each queue, the `due` entries in the store are exactly the union of
//! the buffer, the leased URLs, and the entries after the queue's cursor
//! (none when the cursor is `All`, all when it is `NotLoaded`). It holds
//! because:
//!
//! - every committed write reaches memory through [`Scheduler::on_commit`],
//!   on the committer thread, in commit order, under the queue's lock;
//! - a refill reads the store under the queue's lock, so a commit's memory
//!   update comes either before the read (the read sees the commit) or
//!   after the refill (and corrects what the read saw);
//! - a refill skips URLs leased now, so a leased URL is never buffered too.
//!
//! A URL is therefore never served while leased, and never served after it
//! was completed.
//!
//! # The gate
//!
//! Checked and applied under the queue's lock, so concurrent GetURLs calls
//! cannot both pass it: not paused, not blocked, under the crawl limit, the
//! delay since the last serve passed, fewer leased than the per-queue
//! maximum. A serve that hands out nothing does not count for the delay.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::store::{Applied, QueueRecord, Store, StoreError, WriteOp};

/// Due URLs a refill reads from the store at once, and half the most a
/// buffer holds before its tail goes back to being read from the store.
pub const BUFFER_REFILL: usize = 256;

/// What a GetURLs call asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeRequest {
    /// At most this many URLs per queue; 0: no limit.
    pub max_urls_per_queue: u32,
    /// From at most this many queues; 0: no limit.
    pub max_queues: u32,
    /// Only this queue, when set.
    pub queue: Option<String>,
    /// Only this crawl, when set.
    pub crawl: Option<String>,
    /// Lease length in seconds.
    pub lease_secs: u32,
}

/// One URL handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The crawl.
    pub crawl: String,
    /// The queue.
    pub queue: String,
    /// The canonical URL.
    pub url: String,
    /// Its filter partition (where its record is).
    pub partition: u32,
}

/// Counts of one queue or a whole crawl.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// URLs stored.
    pub urls: u64,
    /// Of those, completed.
    pub completed: u64,
    /// Leased now.
    pub leased: u64,
    /// Queues counted.
    pub queues: u64,
    /// Queues with URLs not completed.
    pub active_queues: u64,
}

impl QueueCounts {
    /// URLs not completed (leased ones included).
    #[must_use]
    pub fn not_completed(&self) -> u64 {
        self.urls.saturating_sub(self.completed)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Cursor {
    /// Nothing read yet: every entry is in the store only.
    NotLoaded,
    /// Entries up to this key have been read.
    UpTo(u64, String),
    /// Every entry is in memory.
    All,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    due_at: u64,
    partition: u32,
    until_ms: u64,
}

#[derive(Debug)]
struct QueueState {
    refill: usize,
    record: QueueRecord,
    buffer: BTreeMap<(u64, String), u32>,
    cursor: Cursor,
    leased: HashMap<String, Lease>,
    earliest_expiry_ms: u64,
    last_serve_ms: Option<u64>,
}

impl QueueState {
    fn new(record: QueueRecord, cursor: Cursor, refill: usize) -> Self {
        Self {
            refill,
            record,
            buffer: BTreeMap::new(),
            cursor,
            leased: HashMap::new(),
            earliest_expiry_ms: u64::MAX,
            last_serve_ms: None,
        }
    }

    fn covers(&self, due_at: u64, url: &str) -> bool {
        match &self.cursor {
            Cursor::NotLoaded => false,
            Cursor::UpTo(due, last) => (due_at, url) <= (*due, last.as_str()),
            Cursor::All => true,
        }
    }

    fn add_entry(&mut self, due_at: u64, url: &str, partition: u32) {
        if self.covers(due_at, url) {
            self.buffer.insert((due_at, url.to_owned()), partition);
            if self.cursor == Cursor::All && self.buffer.len() > 2 * self.refill {
                self.trim();
            }
        }
    }

    /// Leaves the buffer's tail to the store, so a queue that only grows
    /// (a crawl discovering faster than it fetches) keeps a bounded buffer.
    fn trim(&mut self) {
        while self.buffer.len() > self.refill {
            self.buffer.pop_last();
        }
        if let Some(((due, url), _)) = self.buffer.last_key_value() {
            self.cursor = Cursor::UpTo(*due, url.clone());
        }
    }

    fn remove_entry(&mut self, due_at: u64, url: &str) {
        self.buffer.remove(&(due_at, url.to_owned()));
        self.leased.remove(url);
    }

    fn expire_leases(&mut self, now_ms: u64) {
        if now_ms < self.earliest_expiry_ms {
            return;
        }
        let expired: Vec<(String, Lease)> = self
            .leased
            .iter()
            .filter(|(_, lease)| lease.until_ms <= now_ms)
            .map(|(url, lease)| (url.clone(), *lease))
            .collect();
        for (url, lease) in expired {
            self.leased.remove(&url);
            // Beyond the cursor the store still has it, and a refill will
            // read it now that it is no longer leased.
            self.add_entry(lease.due_at, &url, lease.partition);
        }
        self.earliest_expiry_ms = self
            .leased
            .values()
            .map(|lease| lease.until_ms)
            .min()
            .unwrap_or(u64::MAX);
    }

    fn leased_now(&self, now_ms: u64) -> u64 {
        self.leased
            .values()
            .filter(|lease| lease.until_ms > now_ms)
            .count() as u64
    }
}

/// One queue of one crawl.
#[derive(Debug)]
pub struct Queue {
    crawl: String,
    key: String,
    // A std Mutex: held for memory updates and one bounded store read,
    // never across an await.
    state: Mutex<QueueState>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Default)]
struct QueueIndex {
    by_key: HashMap<(String, String), Arc<Queue>>,
    // In creation order, for round-robin serving.
    order: Vec<Arc<Queue>>,
}

/// The scheduler of every crawl's queues.
#[derive(Debug)]
pub struct Scheduler {
    store: Arc<Store>,
    queues: RwLock<QueueIndex>,
    default_delays: RwLock<HashMap<String, u32>>,
    paused: AtomicBool,
    // Where the next GetURLs starts its round, so queues take turns.
    rotation: AtomicUsize,
    refill: usize,
}

impl Scheduler {
    /// Loads queue records and settings from the store. Must run before any
    /// write the scheduler would not see through [`Self::on_commit`].
    pub fn load(store: Arc<Store>) -> Result<Self, StoreError> {
        Self::load_with_refill(store, BUFFER_REFILL)
    }

    /// [`Self::load`] with another refill size (tests use tiny ones to
    /// exercise refills and trims with few URLs).
    pub fn load_with_refill(store: Arc<Store>, refill: usize) -> Result<Self, StoreError> {
        let refill = refill.max(1);
        let mut index = QueueIndex::default();
        store.for_each_queue(|crawl, key, record| {
            let queue = Arc::new(Queue {
                crawl: crawl.to_owned(),
                key: key.to_owned(),
                state: Mutex::new(QueueState::new(record, Cursor::NotLoaded, refill)),
            });
            index
                .by_key
                .insert((crawl.to_owned(), key.to_owned()), Arc::clone(&queue));
            index.order.push(queue);
        })?;
        let mut delays = HashMap::new();
        store.for_each_default_delay(|crawl, secs| {
            delays.insert(crawl.to_owned(), secs);
        })?;
        let paused = store.serving_paused()?;
        Ok(Self {
            store,
            queues: RwLock::new(index),
            default_delays: RwLock::new(delays),
            paused: AtomicBool::new(paused),
            rotation: AtomicUsize::new(0),
            refill,
        })
    }

    fn queue(&self, crawl: &str, key: &str) -> Option<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .by_key
            .get(&(crawl.to_owned(), key.to_owned()))
            .cloned()
    }

    /// The queue, created in memory if new. A queue first seen here has no
    /// entries in the store that memory has not seen: writes reach memory
    /// through [`Self::on_commit`] from the moment the scheduler is loaded.
    fn queue_or_new(&self, crawl: &str, key: &str) -> Arc<Queue> {
        if let Some(queue) = self.queue(crawl, key) {
            return queue;
        }
        let mut index = self.queues.write().unwrap_or_else(PoisonError::into_inner);
        let queue = index
            .by_key
            .entry((crawl.to_owned(), key.to_owned()))
            .or_insert_with(|| {
                Arc::new(Queue {
                    crawl: crawl.to_owned(),
                    key: key.to_owned(),
                    state: Mutex::new(QueueState::new(
                        QueueRecord::default(),
                        Cursor::All,
                        self.refill,
                    )),
                })
            })
            .clone();
        if !index.order.iter().any(|q| Arc::ptr_eq(q, &queue)) {
            index.order.push(Arc::clone(&queue));
        }
        queue
    }

    fn snapshot(&self) -> Vec<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .order
            .clone()
    }

    /// Brings memory in step with a committed transaction. Called by the
    /// committer, in commit order.
    pub fn on_commit(&self, ops: &[WriteOp], applied: &[Applied]) {
        for (op, result) in ops.iter().zip(applied) {
            match (op, result) {
                (WriteOp::Discover(new), Applied::Discovered { stored: true }) => {
                    let queue = self.queue_or_new(&new.crawl, &new.record.queue_key);
                    let mut state = queue.lock();
                    state.record.urls += 1;
                    state.add_entry(new.record.due_at, &new.url, new.partition);
                }
                (
                    WriteOp::Known(known),
                    Applied::Known {
                        previous,
                        queue_key,
                    },
                ) => {
                    if let Some((old_queue, old_due)) = previous {
                        let queue = self.queue_or_new(&known.crawl, old_queue);
                        let mut state = queue.lock();
                        state.record.urls = state.record.urls.saturating_sub(1);
                        if *old_due == 0 {
                            state.record.completed = state.record.completed.saturating_sub(1);
                        }
                        state.remove_entry(*old_due, &known.url);
                    }
                    let queue = self.queue_or_new(&known.crawl, queue_key);
                    let mut state = queue.lock();
                    state.record.urls += 1;
                    if known.due_at == 0 {
                        state.record.completed += 1;
                    } else {
                        state.add_entry(known.due_at, &known.url, known.partition);
                    }
                }
                _ => {}
            }
        }
    }

    /// Leases due URLs as a GetURLs call asks: queues take turns, each
    /// through its gate. `now_ms` is UTC epoch milliseconds.
    pub fn serve(&self, request: &ServeRequest, now_ms: u64) -> Result<Vec<Served>, StoreError> {
        if self.paused.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let candidates: Vec<Arc<Queue>> = match (&request.queue, &request.crawl) {
            (Some(key), Some(crawl)) => self.queue(crawl, key).into_iter().collect(),
            (Some(key), None) => self
                .snapshot()
                .into_iter()
                .filter(|q| &q.key == key)
                .collect(),
            (None, _) => self.snapshot(),
        };
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let start = self.rotation.fetch_add(1, Ordering::Relaxed) % candidates.len();
        let delays = self
            .default_delays
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut served = Vec::new();
        let mut queues_served = 0_u32;
        for offset in 0..candidates.len() {
            if request.max_queues > 0 && queues_served >= request.max_queues {
                break;
            }
            let queue = &candidates[(start + offset) % candidates.len()];
            if request.crawl.as_ref().is_some_and(|c| *c != queue.crawl) {
                continue;
            }
            let default_delay = delays.get(&queue.crawl).copied().unwrap_or(0);
            let before = served.len();
            self.serve_queue(queue, request, default_delay, now_ms, &mut served)?;
            if served.len() > before {
                queues_served += 1;
            }
        }
        Ok(served)
    }

    fn serve_queue(
        &self,
        queue: &Queue,
        request: &ServeRequest,
        default_delay_secs: u32,
        now_ms: u64,
        out: &mut Vec<Served>,
    ) -> Result<(), StoreError> {
        let mut state = queue.lock();
        state.expire_leases(now_ms);
        let record = state.record;
        if record.urls == record.completed {
            return Ok(());
        }
        if record.blocked_until > 0 && record.blocked_until.saturating_mul(1000) >= now_ms {
            return Ok(());
        }
        if record.crawl_limit > 0 && record.completed >= u64::from(record.crawl_limit) {
            return Ok(());
        }
        let delay_ms = u64::from(record.delay_secs.unwrap_or(default_delay_secs)) * 1000;
        if state
            .last_serve_ms
            .is_some_and(|last| now_ms < last.saturating_add(delay_ms))
        {
            return Ok(());
        }
        let leased = state.leased.len();
        let wanted = if request.max_urls_per_queue == 0 {
            usize::MAX
        } else {
            let max = request.max_urls_per_queue as usize;
            if leased >= max {
                return Ok(());
            }
            max - leased
        };
        let now_secs = now_ms / 1000;
        let until_ms = now_ms.saturating_add(u64::from(request.lease_secs) * 1000);
        let mut handed = 0;
        while handed < wanted {
            // A refill may find only leased URLs; the next one reads on.
            while state.buffer.is_empty() && state.cursor != Cursor::All {
                self.refill(queue, &mut state)?;
            }
            let Some(entry) = state.buffer.first_entry() else {
                break;
            };
            if entry.key().0 > now_secs {
                break;
            }
            let ((due_at, url), partition) = entry.remove_entry();
            state.leased.insert(
                url.clone(),
                Lease {
                    due_at,
                    partition,
                    until_ms,
                },
            );
            state.earliest_expiry_ms = state.earliest_expiry_ms.min(until_ms);
            out.push(Served {
                crawl: queue.crawl.clone(),
                queue: queue.key.clone(),
                url,
                partition,
            });
            handed += 1;
        }
        if handed > 0 {
            state.last_serve_ms = Some(now_ms);
        }
        Ok(())
    }

    /// Reads the next due entries past the cursor; under the queue's lock
    /// (see the module docs for why).
    fn refill(&self, queue: &Queue, state: &mut QueueState) -> Result<(), StoreError> {
        let after = match &state.cursor {
            Cursor::NotLoaded => None,
            Cursor::UpTo(due, url) => Some((*due, url.clone())),
            Cursor::All => return Ok(()),
        };
        let entries = self.store.due_entries(
            &queue.crawl,
            &queue.key,
            after.as_ref().map(|(d, u)| (*d, u.as_str())),
            state.refill,
        )?;
        let complete = entries.len() < state.refill;
        if let Some((due, url, _)) = entries.last() {
            state.cursor = Cursor::UpTo(*due, url.clone());
        }
        for (due_at, url, partition) in entries {
            if !state.leased.contains_key(&url) {
                state.buffer.insert((due_at, url), partition);
            }
        }
        if complete {
            state.cursor = Cursor::All;
        }
        Ok(())
    }

    /// When a URL's lease runs out (UTC epoch ms), if it is leased now.
    #[must_use]
    pub fn lease_of(&self, crawl: &str, queue: &str, url: &str, now_ms: u64) -> Option<u64> {
        let queue = self.queue(crawl, queue)?;
        let state = queue.lock();
        state
            .leased
            .get(url)
            .map(|lease| lease.until_ms)
            .filter(|&until| until > now_ms)
    }

    /// Counts of one queue, or of every queue of a crawl (`queue` `None`).
    #[must_use]
    pub fn counts(&self, crawl: &str, queue: Option<&str>, now_ms: u64) -> QueueCounts {
        let mut counts = QueueCounts::default();
        let queues: Vec<Arc<Queue>> = match queue {
            Some(key) => self.queue(crawl, key).into_iter().collect(),
            None => self
                .snapshot()
                .into_iter()
                .filter(|q| q.crawl == crawl)
                .collect(),
        };
        for queue in queues {
            let state = queue.lock();
            counts.urls += state.record.urls;
            counts.completed += state.record.completed;
            counts.leased += state.leased_now(now_ms);
            counts.queues += 1;
            if state.record.urls > state.record.completed {
                counts.active_queues += 1;
            }
        }
        counts
    }

    /// Crawls that hold URLs, sorted.
    #[must_use]
    pub fn crawls(&self) -> Vec<String> {
        let mut crawls: Vec<String> = self
            .snapshot()
            .iter()
            .filter(|q| q.lock().record.urls > 0)
            .map(|q| q.crawl.clone())
            .collect();
        crawls.sort();
        crawls.dedup();
        crawls
    }

    /// A crawl's queue keys, sorted; with `include_inactive` false only the
    /// queues with URLs not completed.
    #[must_use]
    pub fn queue_keys(&self, crawl: &str, include_inactive: bool) -> Vec<String> {
        let mut keys: Vec<String> = self
            .snapshot()
            .iter()
            .filter(|q| q.crawl == crawl)
            .filter(|q| {
                let record = q.lock().record;
                include_inactive || record.urls > record.completed
            })
            .map(|q| q.key.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Sets one queue's delay, or the crawl's default (`queue` empty).
    pub fn set_delay(&self, crawl: &str, queue: &str, secs: u32) -> Result<(), StoreError> {
        if queue.is_empty() {
            self.store.set_default_delay(crawl, secs)?;
            self.default_delays
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(crawl.to_owned(), secs);
            return Ok(());
        }
        self.update_settings(crawl, queue, |record| record.delay_secs = Some(secs))
    }

    /// Blocks a queue until a UTC epoch second; 0 unblocks.
    pub fn block_until(&self, crawl: &str, queue: &str, until: u64) -> Result<(), StoreError> {
        self.update_settings(crawl, queue, |record| record.blocked_until = until)
    }

    /// Stops serving a queue once `limit` of its URLs are completed; 0
    /// clears.
    pub fn set_crawl_limit(&self, crawl: &str, queue: &str, limit: u32) -> Result<(), StoreError> {
        self.update_settings(crawl, queue, |record| record.crawl_limit = limit)
    }

    fn update_settings(
        &self,
        crawl: &str,
        queue: &str,
        change: impl Fn(&mut QueueRecord),
    ) -> Result<(), StoreError> {
        // Durable first; the memory copy changes under the queue's lock so a
        // serve sees the old settings or the new, never half of them.
        let queue_state = self.queue_or_new(crawl, queue);
        let mut state = queue_state.lock();
        self.store.update_queue_settings(crawl, queue, &change)?;
        change(&mut state.record);
        Ok(())
    }

    /// Pauses (`false`) or resumes serving, durably.
    pub fn set_active(&self, active: bool) -> Result<(), StoreError> {
        self.store.set_serving_paused(!active)?;
        self.paused.store(!active, Ordering::Release);
        Ok(())
    }

    /// Whether serving is active.
    #[must_use]
    pub fn is_active(&self) -> bool {
        !self.paused.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::ingest::{DedupMode, Discovered, FilterConfig, Ingest, Known};
    use crate::scope::Rules;

    const SEC: u64 = 1000;

    struct Fixture {
        // Dropped before the directory.
        ingest: Ingest,
        scheduler: Arc<Scheduler>,
        _dir: tempfile::TempDir,
    }

    fn open_in(dir: tempfile::TempDir, refill: usize) -> Fixture {
        let store = Store::open(dir.path()).unwrap();
        let mut slot = None;
        let ingest = Ingest::open_with_hook(
            store,
            FilterConfig {
                partitions: 4,
                ..FilterConfig::default()
            },
            DedupMode::Exact,
            2048,
            |store| {
                let scheduler = Arc::new(Scheduler::load_with_refill(Arc::clone(store), refill)?);
                slot = Some(Arc::clone(&scheduler));
                Ok(Some(Box::new(move |ops, applied| {
                    scheduler.on_commit(ops, applied);
                })))
            },
        )
        .unwrap();
        Fixture {
            ingest,
            scheduler: slot.unwrap(),
            _dir: dir,
        }
    }

    fn fixture(refill: usize) -> Fixture {
        open_in(tempfile::tempdir().unwrap(), refill)
    }

    impl Fixture {
        fn discover(&self, urls: &[String], now_secs: u64) {
            let items: Vec<Discovered> = urls
                .iter()
                .map(|url| Discovered {
                    url: url.clone(),
                    depth: 1,
                    ..Discovered::default()
                })
                .collect();
            self.ingest
                .put_discovered("c", &items, &Rules::default(), now_secs)
                .unwrap();
        }

        fn report(&self, url: &str, due_at: u64) {
            self.ingest
                .put_known(
                    "c",
                    &[Known {
                        url: url.to_owned(),
                        due_at,
                        ..Known::default()
                    }],
                    1,
                )
                .unwrap();
        }

        fn serve(&self, request: &ServeRequest, now_ms: u64) -> Vec<String> {
            self.scheduler
                .serve(request, now_ms)
                .unwrap()
                .into_iter()
                .map(|served| served.url)
                .collect()
        }
    }

    fn all(lease_secs: u32) -> ServeRequest {
        ServeRequest {
            lease_secs,
            ..ServeRequest::default()
        }
    }

    fn urls(host: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://{host}/p{i:04}")).collect()
    }

    #[test]
    fn each_due_url_is_served_once_per_lease_across_refills_and_trims() {
        // Refill 4 with 50 URLs: every path of the buffer is taken.
        let f = fixture(4);
        let mut expected = urls("a.example", 50);
        f.discover(&expected, 10);
        let mut served = Vec::new();
        loop {
            let batch = f.serve(
                &ServeRequest {
                    max_urls_per_queue: 3,
                    lease_secs: 60,
                    ..ServeRequest::default()
                },
                10 * SEC,
            );
            if batch.is_empty() {
                break;
            }
            // Three leased: the queue is at its limit until they are done.
            for url in &batch {
                f.report(url, 0);
            }
            served.extend(batch);
        }
        expected.sort();
        assert_eq!(
            served, expected,
            "in date order (then URL order), once each"
        );
        assert!(f.serve(&all(60), 10 * SEC).is_empty());
        let counts = f.scheduler.counts("c", None, 10 * SEC);
        assert_eq!((counts.urls, counts.completed), (50, 50));
    }

    #[test]
    fn an_expired_lease_makes_the_url_servable_again() {
        let f = fixture(4);
        f.discover(&urls("a.example", 20), 10);
        let first = f.serve(&all(30), 10 * SEC);
        assert_eq!(first.len(), 20);
        assert!(f.serve(&all(30), 39 * SEC).is_empty(), "still leased");
        assert_eq!(f.scheduler.counts("c", None, 39 * SEC).leased, 20);
        // Half are done before the leases run out: only the rest return.
        for url in &first[..10] {
            f.report(url, 0);
        }
        let again = f.serve(&all(30), 40 * SEC);
        assert_eq!(again, first[10..].to_vec());
    }

    #[test]
    fn rescheduled_urls_come_back_at_their_date_in_date_order() {
        let f = fixture(2);
        let list = urls("a.example", 6);
        f.discover(&list, 10);
        let served = f.serve(&all(30), 10 * SEC);
        assert_eq!(served.len(), 6);
        // Retry dates in reverse order of the URLs.
        for (i, url) in served.iter().enumerate() {
            f.report(url, 100 - i as u64);
        }
        assert!(f.serve(&all(30), 94 * SEC).is_empty());
        let later = f.serve(&all(30), 100 * SEC);
        let mut expected = served.clone();
        expected.reverse();
        assert_eq!(later, expected);
    }

    #[test]
    fn the_gate_holds_delay_block_limit_and_pause() {
        let f = fixture(8);
        f.discover(&urls("a.example", 10), 10);
        let one = ServeRequest {
            max_urls_per_queue: 1,
            lease_secs: 1000,
            ..ServeRequest::default()
        };
        f.scheduler.set_delay("c", "a.example", 5).unwrap();
        let first = f.serve(&one, 10 * SEC);
        assert_eq!(first.len(), 1);
        f.report(&first[0], 0);
        assert!(f.serve(&one, 14 * SEC).is_empty(), "delay not passed");
        assert_eq!(f.serve(&one, 15 * SEC).len(), 1);
        // Blocked until second 100 inclusive.
        f.scheduler.block_until("c", "a.example", 100).unwrap();
        let many = ServeRequest {
            lease_secs: 1000,
            ..ServeRequest::default()
        };
        assert!(f.serve(&many, 100 * SEC).is_empty());
        f.scheduler.block_until("c", "a.example", 0).unwrap();
        // A crawl limit of 1 completed: reached already.
        f.scheduler.set_crawl_limit("c", "a.example", 1).unwrap();
        assert!(f.serve(&many, 200 * SEC).is_empty());
        f.scheduler.set_crawl_limit("c", "a.example", 0).unwrap();
        f.scheduler.set_active(false).unwrap();
        assert!(f.serve(&many, 200 * SEC).is_empty());
        f.scheduler.set_active(true).unwrap();
        assert_eq!(f.serve(&many, 200 * SEC).len(), 8);
    }

    #[test]
    fn settings_and_counts_survive_a_restart_and_leases_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let f = open_in(dir, 4);
        f.discover(&urls("a.example", 10), 10);
        f.discover(&urls("b.example", 3), 10);
        let served = f.serve(&all(1000), 10 * SEC);
        assert_eq!(served.len(), 13);
        f.report(&served[0], 0);
        f.scheduler.set_delay("c", "b.example", 7).unwrap();
        f.scheduler.set_delay("c", "", 3).unwrap();
        f.scheduler.block_until("c", "a.example", 50).unwrap();
        f.scheduler.set_active(false).unwrap();
        let Fixture {
            ingest,
            scheduler,
            _dir,
        } = f;
        drop(scheduler);
        ingest.shutdown().unwrap();
        let f = open_in(_dir, 4);
        assert_eq!(f._dir.path(), path);
        assert!(!f.scheduler.is_active());
        f.scheduler.set_active(true).unwrap();
        let counts = f.scheduler.counts("c", None, 0);
        assert_eq!((counts.urls, counts.completed, counts.leased), (13, 1, 0));
        // a.example is blocked until 50; b.example's 3 come back (no
        // leases survive).
        let again = f.serve(&all(1000), 20 * SEC);
        assert_eq!(again.len(), 3);
        let a = f.serve(&all(1000), 51 * SEC);
        assert_eq!(a.len(), 9);
    }

    #[test]
    fn concurrent_serves_never_hand_out_a_url_twice() {
        let f = fixture(16);
        for host in 0..8 {
            f.discover(&urls(&format!("h{host}.example"), 200), 10);
        }
        let handed: Vec<Vec<String>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let batch = f.serve(
                                &ServeRequest {
                                    max_urls_per_queue: 5,
                                    max_queues: 3,
                                    lease_secs: 1000,
                                    ..ServeRequest::default()
                                },
                                10 * SEC,
                            );
                            if batch.is_empty() {
                                // Leases are the limit now: complete what
                                // this thread holds, or stop when none.
                                if mine.is_empty() {
                                    break;
                                }
                            }
                            for url in &batch {
                                f.report(url, 0);
                            }
                            let done = batch.is_empty();
                            mine.extend(batch);
                            if done {
                                break;
                            }
                        }
                        mine
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let all_handed: Vec<&String> = handed.iter().flatten().collect();
        let distinct: HashSet<&String> = all_handed.iter().copied().collect();
        assert_eq!(distinct.len(), all_handed.len(), "a URL was handed twice");
        assert_eq!(distinct.len(), 1600);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Discover(u8, u8),
        Complete(u8),
        Reschedule(u8, u8),
        Serve(u32),
        Advance(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3_u8, 0..30_u8).prop_map(|(h, n)| Op::Discover(h, n)),
            (0..90_u8).prop_map(Op::Complete),
            (0..90_u8, 0..20_u8).prop_map(|(u, d)| Op::Reschedule(u, d)),
            (1..15_u32).prop_map(Op::Serve),
            (0..40_u8).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Against a model of due dates and leases: an unlimited serve
        /// hands out exactly the URLs that are due and not leased.
        #[test]
        fn serving_matches_a_model(ops in proptest::collection::vec(op(), 1..40), refill in 1..6_usize) {
            let f = fixture(refill);
            let url_of = |i: u8| format!("http://h{}.example/u{i}", i % 3);
            // url -> due (0: completed); url -> lease end (ms)
            let mut due: BTreeMap<String, u64> = BTreeMap::new();
            let mut leases: BTreeMap<String, u64> = BTreeMap::new();
            let mut now = 100 * SEC;
            for op in ops {
                match op {
                    Op::Discover(host, n) => {
                        let list: Vec<String> = (0..n).map(|i| url_of(host + 3 * (i % 30))).collect();
                        f.discover(&list, now / SEC);
                        for url in list {
                            due.entry(url).or_insert((now / SEC).max(1));
                        }
                    }
                    Op::Complete(i) => {
                        let url = url_of(i);
                        f.report(&url, 0);
                        due.insert(url.clone(), 0);
                        leases.remove(&url);
                    }
                    Op::Reschedule(i, delta) => {
                        let url = url_of(i);
                        let date = now / SEC + u64::from(delta);
                        f.report(&url, date);
                        due.insert(url.clone(), date);
                        leases.remove(&url);
                    }
                    Op::Serve(lease) => {
                        let mut got = f.serve(&all(lease), now);
                        got.sort();
                        let mut expected: Vec<String> = due
                            .iter()
                            .filter(|(url, d)| **d != 0 && **d <= now / SEC
                                && leases.get(*url).is_none_or(|until| *until <= now))
                            .map(|(url, _)| url.clone())
                            .collect();
                        expected.sort();
                        prop_assert_eq!(&got, &expected);
                        for url in got {
                            leases.insert(url, now + u64::from(lease) * SEC);
                        }
                    }
                    Op::Advance(secs) => now += u64::from(secs) * SEC,
                }
            }
        }
    }
}
