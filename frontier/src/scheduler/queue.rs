//! A queue's memory: its buffer of next due URLs, its leases, its place
//! on its crawl's wake-up list (see the scheduler's docs for the
//! invariants these keep).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use foldhash::{HashMap, HashMapExt};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use super::groups::Group;
use super::slowdown::AnswerTimes;
use crate::record::CompactMetadata;
use crate::store::QueueRecord;
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Cursor {
    /// Nothing read yet: every entry is in the store only.
    NotLoaded,
    /// Entries up to this key (due date, URL hash) have been read.
    UpTo(u64, u64),
    /// Every entry is in memory.
    All,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) due_at: u64,
    pub(super) hash: u64,
    pub(super) partition: u32,
    pub(super) until: Timestamp,
}

/// A wake-up list entry's key: (when, sequence number).
pub(super) type WakeKey = (Timestamp, u64);

#[derive(Debug)]
pub(super) struct QueueState {
    pub(super) refill: usize,
    pub(super) record: QueueRecord,
    /// (due date, URL hash, URL) → partition and, when known, the
    /// metadata stored: the store's serving order, with the URLs of a hash
    /// apart.
    pub(super) buffer: BTreeMap<(u64, u64, String), (u32, Option<CompactMetadata>)>,
    pub(super) cursor: Cursor,
    pub(super) leased: HashMap<String, Lease>,
    pub(super) earliest_expiry: Timestamp,
    pub(super) last_serve: Option<Timestamp>,
    /// Whether the leases out now hold the queue (a holding serve handed
    /// them out): nothing more is served until the last ends, and the
    /// delay then runs from its end.
    pub(super) held: bool,
    // The queue's valid entry on its crawl's wake-up list, if any.
    pub(super) wake: Option<WakeKey>,
    /// Its politeness group (`None`: alone), once named.
    pub(super) group: Option<Arc<Group>>,
    pub(super) group_known: bool,
    /// Its group turned it away until then.
    pub(super) group_gate: Timestamp,
    /// Its host's address was asked for then, and has not come yet.
    pub(super) looked_up_since: Option<Timestamp>,
    /// How long its host takes to answer, and the extra gap a slow-down
    /// calls for.
    pub(super) answers: AnswerTimes,
}

impl QueueState {
    pub(super) fn new(record: QueueRecord, cursor: Cursor, refill: usize) -> Self {
        Self {
            refill,
            record,
            buffer: BTreeMap::new(),
            cursor,
            leased: HashMap::new(),
            earliest_expiry: Timestamp::NEVER,
            last_serve: None,
            held: false,
            wake: None,
            group: None,
            group_known: false,
            group_gate: Timestamp::EPOCH,
            looked_up_since: None,
            answers: AnswerTimes::default(),
        }
    }

    pub(super) fn covers(&self, due_at: u64, hash: u64) -> bool {
        match &self.cursor {
            Cursor::NotLoaded => false,
            Cursor::UpTo(due, last) => (due_at, hash) <= (*due, *last),
            Cursor::All => true,
        }
    }

    /// Buffers a URL if the buffer covers its place. `metadata`: what the
    /// store holds now (`None`: not known here, read when it is handed
    /// out), worked out only for a URL buffered.
    pub(super) fn add_entry(
        &mut self,
        (due_at, hash, url): (u64, u64, &str),
        partition: u32,
        metadata: impl FnOnce() -> Option<CompactMetadata>,
    ) {
        // A refill between a commit and its hook may have read the URL and
        // leased it already: the hook must not buffer it a second time.
        if self.covers(due_at, hash) && !self.leased.contains_key(url) {
            self.buffer
                .insert((due_at, hash, url.to_owned()), (partition, metadata()));
            if self.cursor == Cursor::All && self.buffer.len() > 2 * self.refill {
                self.trim();
            }
        }
    }

    /// Leaves the buffer's tail to the store, so a queue that only grows
    /// (a crawl discovering faster than it fetches) keeps a bounded buffer.
    /// The cursor moves back to the last key kept, so the URLs of a key
    /// (a hash collision) go back together: the store reads them as one.
    pub(super) fn trim(&mut self) {
        let mut dropped = None;
        while self.buffer.len() > self.refill
            || self
                .buffer
                .last_key_value()
                .is_some_and(|((due, hash, _), _)| dropped == Some((*due, *hash)))
        {
            if let Some(((due, hash, _), _)) = self.buffer.pop_last() {
                dropped = Some((due, hash));
            }
        }
        self.cursor = match self.buffer.last_key_value() {
            Some(((due, hash, _), _)) => Cursor::UpTo(*due, *hash),
            None => Cursor::NotLoaded,
        };
    }

    /// Removes a URL's entry; answers whether it was leased.
    pub(super) fn remove_entry(&mut self, due_at: u64, hash: u64, url: &str) -> bool {
        // Found before it is removed, so that a URL not buffered (a
        // report's, leased) costs no key of its own.
        let buffered = (self.buffer.range((due_at, hash, String::new())..))
            .take_while(|((due, at, _), _)| (*due, *at) == (due_at, hash))
            .find(|((_, _, buffered), _)| buffered == url)
            .map(|(key, _)| key.clone());
        if let Some(key) = buffered {
            self.buffer.remove(&key);
        }
        self.leased.remove(url).is_some()
    }

    pub(super) fn expire_leases(&mut self, now: Timestamp) {
        if now < self.earliest_expiry {
            return;
        }
        let expired: Vec<(String, Lease)> = self
            .leased
            .iter()
            .filter(|(_, lease)| lease.until <= now)
            .map(|(url, lease)| (url.clone(), *lease))
            .collect();
        metrics::counter!("frontier_lease_expiries_total").increment(expired.len() as u64);
        if !expired.is_empty() && expired.len() == self.leased.len() {
            // Let go when the last lease ran out, not when that was seen.
            if let Some(last) = expired.iter().map(|(_, lease)| lease.until).max() {
                self.let_go(last);
            }
        }
        for (url, lease) in expired {
            self.leased.remove(&url);
            // Beyond the cursor the store still has it, and a refill will
            // read it now that it is no longer leased.
            self.add_entry((lease.due_at, lease.hash, &url), lease.partition, || None);
        }
        self.earliest_expiry = self
            .leased
            .values()
            .map(|lease| lease.until)
            .min()
            .unwrap_or(Timestamp::NEVER);
    }

    /// When the queue's delay after its last serve or let-go ends. With no
    /// delay, at once: a let-go after a report is dated a millisecond
    /// ahead, which holds only a queue that has a delay.
    pub(super) fn delay_end(&self, delay: Duration) -> Timestamp {
        match self.last_serve {
            Some(last) if !delay.is_zero() => last.saturating_add(delay),
            _ => Timestamp::EPOCH,
        }
    }

    /// The queue's last lease ended at `now`. A holder let go of it: the
    /// delay runs from then. Leases that did not hold the queue leave the
    /// delay where their serve started it.
    pub(super) fn let_go(&mut self, now: Timestamp) {
        if std::mem::take(&mut self.held) {
            self.last_serve = Some(self.last_serve.map_or(now, |last| last.max(now)));
        }
    }

    pub(super) fn leased_now(&self, now: Timestamp) -> u64 {
        self.leased
            .values()
            .filter(|lease| lease.until > now)
            .count() as u64
    }

    /// Whether the queue might have due URLs it has not read yet or holds.
    pub(super) fn may_have_due(&self) -> bool {
        !self.buffer.is_empty() || self.cursor != Cursor::All
    }
}

/// One queue of one crawl.
#[derive(Debug)]
pub struct Queue {
    pub(super) crawl: String,
    pub(super) key: String,
    // A std Mutex: held for memory updates and one bounded store read,
    // never across an await.
    pub(super) state: Mutex<QueueState>,
}

impl Queue {
    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One crawl's queues and wake-up list.
#[derive(Debug, Default)]
pub(super) struct Crawl {
    pub(super) queues: RwLock<HashMap<String, Arc<Queue>>>,
    // Lock order: a queue's lock, then this; never the other way round.
    pub(super) wakeups: Mutex<Wakeups>,
}

/// A crawl's wake-up list: entries by (time, sequence number), earliest
/// first. A heap, not a map: each serve and each report adds an entry,
/// and a call takes them from the front only.
#[derive(Debug, Default)]
pub(super) struct Wakeups(BinaryHeap<Reverse<Wakeup>>);

/// One entry of a wake-up list, ordered by its key alone (keys are
/// unique: their sequence numbers are).
#[derive(Debug)]
struct Wakeup(WakeKey, Arc<Queue>);

impl PartialEq for Wakeup {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Wakeup {}

impl PartialOrd for Wakeup {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Wakeup {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl Wakeups {
    pub(super) fn insert(&mut self, key: WakeKey, queue: Arc<Queue>) {
        self.0.push(Reverse(Wakeup(key, queue)));
    }

    fn first_key(&self) -> Option<WakeKey> {
        self.0.peek().map(|Reverse(Wakeup(key, _))| *key)
    }

    fn pop_first(&mut self) -> Option<(WakeKey, Arc<Queue>)> {
        self.0.pop().map(|Reverse(Wakeup(key, queue))| (key, queue))
    }
}

impl Crawl {
    /// Every queue of the crawl now, its lock let go.
    pub(super) fn all_queues(&self) -> Vec<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    pub(super) fn queue(&self, key: &str) -> Option<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// The time of the earliest wake-up, if any.
    pub(super) fn first_wake(&self) -> Option<WakeKey> {
        self.wakeups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first_key()
    }

    /// Takes the earliest wake-up whose time has come, of a queue the call
    /// has not looked at yet; those of queues it has (`looked_at`, by
    /// address) are set aside in `deferred`, to be put back when the call
    /// ends. Queues woken meanwhile by other threads (a report's commit)
    /// are the call's to serve: were every entry newer than the call set
    /// aside, a call running while another client's reports wake its
    /// queues would find nothing and answer empty.
    pub(super) fn take_due(
        &self,
        now: Timestamp,
        looked_at: &foldhash::HashSet<*const Queue>,
        deferred: &mut Vec<(WakeKey, Arc<Queue>)>,
    ) -> Option<(WakeKey, Arc<Queue>)> {
        let mut wakeups = self.wakeups.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match wakeups.first_key() {
                Some(key) if key.0 <= now => {
                    let entry = wakeups.pop_first()?;
                    if !looked_at.contains(&Arc::as_ptr(&entry.1)) {
                        return Some(entry);
                    }
                    deferred.push(entry);
                }
                _ => return None,
            }
        }
    }

    pub(super) fn put_back(&self, entries: Vec<(WakeKey, Arc<Queue>)>) {
        let mut wakeups = self.wakeups.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, queue) in entries {
            wakeups.insert(key, queue);
        }
    }
}
