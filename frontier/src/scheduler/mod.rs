//! Which URLs are served when: queues, the serving gate, and leases.
//!
//! # What lives where
//!
//! The store is the truth: the `due` table holds every URL not completed,
//! in serving order per queue, and `queues` holds each queue's counts and
//! settings. Memory holds, per queue, a mirror of that record, a small
//! buffer of its next due URLs, the URLs leased now, and when it was last
//! served. Leases are memory only, but a
//! lease's end is recorded durably before the lease goes out (as a
//! horizon, set a quarter lease ahead so one write covers many serves).
//! After a restart, nothing is served until that horizon has passed: a
//! worker that leased URLs from the process before keeps fetching them
//! and its reports are taken meanwhile, so a restart serves no URL again
//! while an earlier lease on it may still be in use. A URL whose lease
//! ran out before its report arrived is servable again, as always.
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
//! - a refill skips URLs leased now, and so does a commit's memory update
//!   (a refill between the commit and its update may have read and leased
//!   the URL already), so a leased URL is never buffered too.
//!
//! A URL is therefore never served while leased, and never served after it
//! was completed.
//!
//! # The gate
//!
//! Checked and applied under the queue's lock, so concurrent GetURLs calls
//! cannot both pass it: not paused, not blocked, under the crawl limit,
//! and the delay passed since the queue was last served. A serve that
//! hands out nothing does not count for the delay. Beyond that, a request
//! is served in one of two ways:
//!
//! - **Shared** (the URL Frontier API's semantics, the default): the
//!   queue's leased URLs count against `max_urls_per_queue`, and its other
//!   due URLs are served while some are leased, up to that maximum (no
//!   limit when it is 0). The delay runs from each serve.
//! - **Held** (a client that asks for it, as this project's worker does):
//!   a queue is served only when none of its URLs is leased, and the lease
//!   holds it until the last of its URLs is reported or expires; the delay
//!   then runs from that let-go, after the holder's last request started.
//!   A worker that fetches a lease's URLs spaced by the delay thus keeps
//!   every gap between request starts to the host at least the delay,
//!   whichever worker holds the queue next. A held lease carries at most
//!   as many URLs of a queue as the lease length allows at that spacing
//!   (half of it), so that a holder spacing them does not outlive its
//!   lease.
//!
//! A queue held by one client serves no other until it is let go; a queue
//! with shared leases out serves no holder until they end.
//!
//! # The partition gate
//!
//! A cluster node serves only the partitions its map gives it and that are
//! not moving: its store may hold a partition it is receiving (not served
//! until the map flips to it) or one it has handed over (not served again,
//! and deleted once the flip is durable). A buffered URL carries its
//! partition, and a queue whose next URL is of a partition not served here
//! hands nothing out and is taken off the wake-up list; a change of the
//! served set ([`Scheduler::set_served_partitions`]) reschedules every queue. A
//! queue whose key is not its URLs' host may mix partitions: its URLs wait
//! behind a head URL of a partition not served.
//!
//! # Finding servable queues without scanning them
//!
//! Each crawl has a wake-up list ordered by (time, sequence number): a
//! queue is on it with the earliest time it could be served (its next due
//! date, the end of its delay or block, its next lease expiry), or not at
//! all while it cannot be served until something happens (idle, at its
//! crawl limit, at its lease maximum): the event (a commit, a settings
//! change, a lease given back) puts it back. GetURLs takes entries whose
//! time has come, oldest first, so queues take turns; each taken queue is
//! put back at its next time. An entry is valid only while it is the one
//! the queue records; replaced ones are dropped when met. A call thus looks
//! at the queues it serves and the few it finds gated, never at all of
//! them.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use crate::partitioning::PartitionBy;
use crate::record::CompactMetadata;
use crate::store::{QueueRecord, Store, StoreError};
use crate::time::Timestamp;

mod addresses;
mod commits;
mod grouping;
mod groups;
mod partitions;
mod queue;
mod slowdown;
mod turn;
mod turns;
mod views;

pub use addresses::LOOKUP_WAIT;
pub use groups::{Politeness, UnknownPoliteness};
pub use turns::{TURN_HOLD, TURN_RENEW, TurnAnswer, TurnKeepers, TurnMessage, holder_name};
pub use views::QueueView;

use queue::{Crawl, Cursor, Lease, Queue, QueueState, WakeKey};

/// Due URLs a refill reads from the store at once, and half the most a
/// buffer holds before its tail goes back to being read from the store.
/// Small, since 100,000 queues each hold up to twice this in memory.
pub const BUFFER_REFILL: usize = 16;

/// The most a call's lists are sized for before it looks at its queues.
const SIZED_AHEAD: usize = 4096;

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
    /// At most this many URLs in all; 0: no limit. The server sets it, so
    /// that no call leases a whole crawl at once.
    pub max_urls: u32,
    /// Whether each queue served is held until its lease is let go (the
    /// module docs: the gate); otherwise the API's shared serving.
    pub hold_queues: bool,
}

impl ServeRequest {
    /// How many more URLs this call may hand out, having handed `served`.
    /// How many URLs a call may hand out, as far as it can tell before it
    /// looks (at most [`SIZED_AHEAD`]), for the lists it fills.
    fn expected(&self) -> usize {
        let per_call = match (self.max_queues, self.max_urls_per_queue) {
            (0, _) | (_, 0) => SIZED_AHEAD,
            (queues, per_queue) => (queues as usize).saturating_mul(per_queue as usize),
        };
        per_call.min(self.room(0)).min(SIZED_AHEAD)
    }

    fn room(&self, served: usize) -> usize {
        if self.max_urls == 0 {
            usize::MAX
        } else {
            (self.max_urls as usize).saturating_sub(served)
        }
    }
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
    /// The queue's delay: the holder spaces its requests by it.
    pub delay: Duration,
    /// Its metadata as stored when it was handed out, if the queue knew it
    /// (`None`: to be read from the store).
    pub metadata: Option<CompactMetadata>,
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

/// The scheduler of every crawl's queues.
pub struct Scheduler {
    store: Arc<Store>,
    crawls: RwLock<HashMap<String, Arc<Crawl>>>,
    default_delays: RwLock<HashMap<String, Duration>>,
    default_delay: Duration,
    paused: AtomicBool,
    sequence: AtomicU64,
    refill: usize,
    // When a report lets a queue go; tests set their own time.
    clock: Clock,
    // Recorded in the store: no lease handed out outlives it.
    lease_horizon: Mutex<Timestamp>,
    // Leases of an earlier process on this store may run until then.
    held_until: Timestamp,
    // The partitions served here, by index; `None`: all (module docs: the
    // partition gate).
    serving: arc_swap::ArcSwapOption<Vec<bool>>,
    // The partitions this node's figures count, by index; `None`: all (a
    // cluster node counts only those it leads, not the copies it follows).
    counted: arc_swap::ArcSwapOption<Vec<bool>>,
    // What hosts share a politeness gap, and the groups so far by
    // (crawl, name).
    politeness: Politeness,
    // What the store's partitions follow, to find a queue's partition.
    partition_by: PartitionBy,
    groups: Mutex<HashMap<(String, String), Arc<groups::Group>>>,
    // Where hosts are sent to be looked up before their first serve
    // (addresses module).
    address_lookups: addresses::Lookups,
    // Who keeps groups that span nodes (turns module); unset: all here.
    turn_keepers: std::sync::OnceLock<Arc<dyn TurnKeepers>>,
    // When each partition became served here (partitions module), for the
    // quiet of a new keeper (turns module).
    served_since: Mutex<Vec<Timestamp>>,
    // Serial numbers of this process's asks for turns: from its start
    // time, so that a late message to an earlier process names no ask of
    // this one.
    turn_serials: AtomicU64,
}

type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// When a block until UTC epoch second `until` ends: it holds through the
/// whole of that second (0: no block, over since the epoch).
fn block_end(until: u64) -> Timestamp {
    if until == 0 {
        return Timestamp::EPOCH;
    }
    Timestamp::from_unix_secs(until).saturating_add(Duration::from_millis(1))
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("default_delay", &self.default_delay)
            .field("refill", &self.refill)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Loads queue records and settings from the store. Must run before any
    /// write the scheduler would not see through [`Self::on_commit`].
    /// Queues without a delay of their own or of their crawl wait
    /// `default_delay` between serves.
    pub fn load(store: Arc<Store>, default_delay: Duration) -> Result<Self, StoreError> {
        Self::load_with_refill(store, default_delay, BUFFER_REFILL)
    }

    /// [`Self::load`] with hosts grouped for politeness (the groups
    /// module).
    pub fn load_polite(
        store: Arc<Store>,
        default_delay: Duration,
        politeness: Politeness,
    ) -> Result<Self, StoreError> {
        let mut scheduler = Self::load_with_refill(store, default_delay, BUFFER_REFILL)?;
        scheduler.politeness = politeness;
        Ok(scheduler)
    }

    /// [`Self::load`] with another refill size (tests use tiny ones to
    /// exercise refills and trims with few URLs).
    pub fn load_with_refill(
        store: Arc<Store>,
        default_delay: Duration,
        refill: usize,
    ) -> Result<Self, StoreError> {
        let refill = refill.max(1);
        let partition_by = store.partition_by(PartitionBy::Host)?;
        let mut delays = HashMap::new();
        store.for_each_default_delay(|crawl, secs| {
            delays.insert(crawl.to_owned(), Duration::from_secs(u64::from(secs)));
        })?;
        let paused = store.serving_paused()?;
        let horizon = Timestamp::from_unix_millis(store.leases_until()?);
        let now = Timestamp::now();
        if horizon > now {
            tracing::info!(
                wait_ms = horizon.unix_millis() - now.unix_millis(),
                "serving resumes when the leases handed out before this start have run out; \
                 reports are taken meanwhile"
            );
        }
        let scheduler = Self {
            store: Arc::clone(&store),
            crawls: RwLock::new(HashMap::new()),
            default_delays: RwLock::new(delays),
            default_delay,
            clock: Arc::new(Timestamp::now),
            paused: AtomicBool::new(paused),
            sequence: AtomicU64::new(0),
            refill,
            lease_horizon: Mutex::new(horizon),
            held_until: horizon,
            serving: arc_swap::ArcSwapOption::empty(),
            counted: arc_swap::ArcSwapOption::empty(),
            politeness: Politeness::Host,
            partition_by,
            groups: Mutex::default(),
            address_lookups: addresses::Lookups::new(),
            turn_keepers: std::sync::OnceLock::new(),
            served_since: Mutex::default(),
            turn_serials: AtomicU64::new(now.unix_millis() << 16),
        };
        let mut loaded = Vec::new();
        store.for_each_queue(|crawl, key, record| {
            loaded.push((crawl.to_owned(), key.to_owned(), record));
        })?;
        for (crawl, key, record) in loaded {
            let queue = scheduler.insert_queue(&crawl, &key, record, Cursor::NotLoaded);
            let mut state = queue.lock();
            if state.record.urls > state.record.completed {
                scheduler.wake(&queue, &mut state, Timestamp::EPOCH);
            }
        }
        Ok(scheduler)
    }

    fn crawl(&self, crawl: &str) -> Option<Arc<Crawl>> {
        self.crawls
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(crawl)
            .cloned()
    }

    fn queue(&self, crawl: &str, key: &str) -> Option<Arc<Queue>> {
        self.crawl(crawl)?.queue(key)
    }

    fn insert_queue(
        &self,
        crawl: &str,
        key: &str,
        record: QueueRecord,
        cursor: Cursor,
    ) -> Arc<Queue> {
        let entry = match self.crawl(crawl) {
            Some(entry) => entry,
            None => Arc::clone(
                self.crawls
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(crawl.to_owned())
                    .or_default(),
            ),
        };
        let mut queues = entry.queues.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(queues.entry(key.to_owned()).or_insert_with(|| {
            Arc::new(Queue {
                crawl: crawl.to_owned(),
                key: key.to_owned(),
                state: Mutex::new(QueueState::new(record, cursor, self.refill)),
            })
        }))
    }

    /// The queue, created in memory if new. A queue first seen here has no
    /// entries in the store that memory has not seen: writes reach memory
    /// through [`Self::on_commit`] from the moment the scheduler is loaded.
    fn queue_or_new(&self, crawl: &str, key: &str) -> Arc<Queue> {
        self.queue(crawl, key)
            .unwrap_or_else(|| self.insert_queue(crawl, key, QueueRecord::default(), Cursor::All))
    }

    fn queues_of(&self, crawl: &str) -> Vec<Arc<Queue>> {
        self.crawl(crawl)
            .map(|c| {
                c.queues
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .values()
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Puts a queue on its crawl's wake-up list at `at`, unless it is on it
    /// for an earlier time already (that entry wakes it first, and the
    /// serve then finds its next time).
    fn wake(&self, queue: &Arc<Queue>, state: &mut QueueState, at: Timestamp) {
        if state.wake.is_some_and(|(earlier, _)| earlier <= at) {
            return;
        }
        let Some(crawl) = self.crawl(&queue.crawl) else {
            return;
        };
        let key = (at, self.sequence.fetch_add(1, Ordering::Relaxed));
        state.wake = Some(key);
        crawl
            .wakeups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Arc::clone(queue));
    }

    /// Where a queue that was just looked at goes next: the earliest time
    /// it could be served, or off the list until an event brings it back.
    fn reschedule(
        &self,
        queue: &Arc<Queue>,
        state: &mut QueueState,
        delay: Duration,
        now: Timestamp,
    ) {
        let record = state.record;
        if record.urls == record.completed {
            return; // idle: a commit wakes it
        }
        if record.crawl_limit > 0 && record.completed >= u64::from(record.crawl_limit) {
            return; // a settings change wakes it
        }
        let lease_expiry = (!state.leased.is_empty()).then_some(state.earliest_expiry);
        if let Some(expiry) = lease_expiry.filter(|_| state.held) {
            // Held: its let-go (a report) puts it back, or its leases' expiry.
            self.wake(queue, state, expiry);
            return;
        }
        let mut at = Timestamp::NEVER;
        let head_served = state
            .buffer
            .first_key_value()
            .is_none_or(|(_, (partition, _))| self.serves(*partition));
        if state.may_have_due() && head_served {
            let due = state
                .buffer
                .first_key_value()
                .map_or(now, |((due, _, _), _)| Timestamp::from_unix_secs(*due));
            let delay_end = state.delay_end(delay);
            let blocked_end = block_end(record.blocked_until);
            // A queue at this call's lease maximum stays on the list too:
            // the next call may allow more. Such queues hold leases, so
            // they are at most as many as the leases in flight.
            at = due.max(delay_end).max(blocked_end).max(state.group_gate);
        }
        if let Some(expiry) = lease_expiry {
            at = at.min(expiry);
        }
        if at != Timestamp::NEVER {
            self.wake(queue, state, at);
        }
    }

    /// Whether URLs of `partition` are served here.
    fn serves(&self, partition: u32) -> bool {
        self.serving
            .load()
            .as_ref()
            .is_none_or(|served| served.get(partition as usize).copied().unwrap_or(false))
    }

    fn delay_of(&self, crawl: &str, record: &QueueRecord) -> Duration {
        match record.delay_ms {
            Some(ms) => Duration::from_millis(u64::from(ms)),
            None => self
                .default_delays
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(crawl)
                .copied()
                .unwrap_or(self.default_delay),
        }
    }

    /// Leases due URLs as a GetURLs call asks: the queues whose time has
    /// come, oldest first, each through its gate.
    pub fn serve(&self, request: &ServeRequest, now: Timestamp) -> Result<Vec<Served>, StoreError> {
        if self.paused.load(Ordering::Acquire) || now < self.held_until {
            return Ok(Vec::new());
        }
        let served = self.serve_gated(request, now)?;
        if !served.is_empty() {
            // On failure the URLs stay leased here until their leases run
            // out, and the caller gets the error, not the URLs.
            self.cover_leases(now, Duration::from_secs(u64::from(request.lease_secs)))?;
        }
        Ok(served)
    }

    /// Until when the leases handed out so far may run, as recorded.
    #[must_use]
    pub fn lease_horizon(&self) -> Timestamp {
        *self
            .lease_horizon
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records, before leases that end at `now + lease` go out, that no
    /// lease outlives a horizon past their end.
    fn cover_leases(&self, now: Timestamp, lease: Duration) -> Result<(), StoreError> {
        let until = now.saturating_add(lease);
        let mut horizon = self
            .lease_horizon
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if until <= *horizon {
            return Ok(());
        }
        let ahead = until.saturating_add((lease / 4).max(Duration::from_secs(1)));
        self.store.set_leases_until(ahead.unix_millis())?;
        *horizon = ahead;
        Ok(())
    }

    fn serve_gated(
        &self,
        request: &ServeRequest,
        now: Timestamp,
    ) -> Result<Vec<Served>, StoreError> {
        let mut served = Vec::new();
        if let Some(key) = &request.queue {
            let crawls: Vec<String> = match &request.crawl {
                Some(crawl) => vec![crawl.clone()],
                None => self.crawl_names(),
            };
            for crawl in crawls {
                if let Some(queue) = self.queue(&crawl, key) {
                    self.serve_queue(&queue, request, now, &mut served)?;
                }
            }
            return Ok(served);
        }
        let crawls: Vec<Arc<Crawl>> = match &request.crawl {
            Some(crawl) => self.crawl(crawl).into_iter().collect(),
            None => self
                .crawls
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect(),
        };
        let mut deferred: Vec<Vec<(WakeKey, Arc<Queue>)>> = vec![Vec::new(); crawls.len()];
        let result = self.serve_due(request, now, &crawls, &mut deferred);
        for (crawl, entries) in crawls.iter().zip(deferred) {
            if !entries.is_empty() {
                crawl.put_back(entries);
            }
        }
        result
    }

    fn serve_due(
        &self,
        request: &ServeRequest,
        now: Timestamp,
        crawls: &[Arc<Crawl>],
        deferred: &mut [Vec<(WakeKey, Arc<Queue>)>],
    ) -> Result<Vec<Served>, StoreError> {
        let mut served = Vec::with_capacity(request.expected());
        // Queues this call took, by address: one it put back on the list
        // waits for the next call, so that a call looks at a queue once.
        let mut looked_at: HashSet<*const Queue> = HashSet::with_capacity(request.expected());
        let mut queues_served = 0_u32;
        while (request.max_queues == 0 || queues_served < request.max_queues)
            && request.room(served.len()) > 0
        {
            // The crawl whose earliest wake-up is earliest, then its entry
            // (another call may have taken that one: any due entry will do).
            let earliest = crawls
                .iter()
                .enumerate()
                .filter_map(|(i, crawl)| crawl.first_wake().map(|key| (key, i)))
                .filter(|(key, _)| key.0 <= now)
                .min_by_key(|(key, _)| *key);
            let Some((_, index)) = earliest else { break };
            let Some((key, queue)) = crawls[index].take_due(now, &looked_at, &mut deferred[index])
            else {
                continue;
            };
            let before = served.len();
            {
                let mut state = queue.lock();
                if state.wake != Some(key) {
                    continue; // replaced by a later wake-up
                }
                state.wake = None;
            }
            looked_at.insert(Arc::as_ptr(&queue));
            self.serve_queue(&queue, request, now, &mut served)?;
            if served.len() > before {
                queues_served += 1;
            }
        }
        Ok(served)
    }

    fn crawl_names(&self) -> Vec<String> {
        self.crawls
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    fn serve_queue(
        &self,
        queue: &Arc<Queue>,
        request: &ServeRequest,
        now: Timestamp,
        out: &mut Vec<Served>,
    ) -> Result<(), StoreError> {
        let mut state = queue.lock();
        state.expire_leases(now);
        let delay = self.delay_of(&queue.crawl, &state.record) + state.answers.extra;
        self.serve_locked(queue, &mut state, request, delay, now, out)?;
        self.reschedule(queue, &mut state, delay, now);
        Ok(())
    }

    fn serve_locked(
        &self,
        queue: &Queue,
        state: &mut QueueState,
        request: &ServeRequest,
        delay: Duration,
        now: Timestamp,
        out: &mut Vec<Served>,
    ) -> Result<(), StoreError> {
        let record = state.record;
        if record.urls == record.completed {
            return Ok(());
        }
        if block_end(record.blocked_until) > now {
            return Ok(());
        }
        if record.crawl_limit > 0 && record.completed >= u64::from(record.crawl_limit) {
            return Ok(());
        }
        if now < state.delay_end(delay) {
            return Ok(());
        }
        let in_flight = state.leased.len();
        if state.held && in_flight > 0 {
            return Ok(()); // held by another client's lease
        }
        let per_queue = match request.max_urls_per_queue {
            0 => usize::MAX,
            max => max as usize,
        };
        let lease = Duration::from_secs(u64::from(request.lease_secs));
        let wanted = if request.hold_queues {
            if in_flight > 0 {
                return Ok(()); // shared leases out: a holder waits for their end
            }
            let spaced = if delay.is_zero() {
                usize::MAX
            } else {
                usize::try_from((lease.as_millis() / (2 * delay.as_millis())).max(1))
                    .unwrap_or(usize::MAX)
            };
            per_queue.min(spaced)
        } else {
            // Leased URLs count against the per-queue maximum.
            per_queue.saturating_sub(in_flight)
        }
        .min(request.room(out.len()));
        if wanted == 0 {
            return Ok(());
        }
        if self.awaiting_address(queue, state, now) {
            return Ok(());
        }
        // The group's gate, held through the handing out (groups module).
        let group = self.group_of(queue, state);
        let mut group_state = group.as_ref().map(|group| group.lock());
        // The group adds its own extra gap to the queue's plain delay. The
        // gate answers where the group's turns are kept, so that the serve
        // is recorded by the same view of the cluster.
        let mut keeper = None;
        if let (Some(group), Some(group_state)) = (&group, group_state.as_mut()) {
            let gate = self.group_gate(
                queue,
                group,
                group_state,
                delay.saturating_sub(state.answers.extra),
                lease,
                now,
            );
            match gate {
                Ok(kept) => keeper = Some(kept),
                Err(at) => {
                    state.group_gate = at;
                    return Ok(());
                }
            }
        }
        let now_secs = now.unix_secs();
        let until = now.saturating_add(lease);
        let mut handed = 0;
        while handed < wanted {
            // A refill may find only leased URLs; the next one reads on.
            while state.buffer.is_empty() && state.cursor != Cursor::All {
                self.refill(queue, state)?;
            }
            let Some(entry) = state.buffer.first_entry() else {
                break;
            };
            if entry.key().0 > now_secs || !self.serves(entry.get().0) {
                break;
            }
            let ((due_at, hash, url), (partition, metadata)) = entry.remove_entry();
            state.leased.insert(
                url.clone(),
                Lease {
                    due_at,
                    hash,
                    partition,
                    until,
                },
            );
            state.earliest_expiry = state.earliest_expiry.min(until);
            out.push(Served {
                crawl: queue.crawl.clone(),
                queue: queue.key.clone(),
                url,
                partition,
                delay,
                metadata,
            });
            handed += 1;
        }
        if handed > 0 {
            state.last_serve = Some(now);
            state.held = request.hold_queues;
            if let (Some(group_state), Some(keeper)) = (group_state.as_mut(), keeper) {
                let held = request.hold_queues;
                Self::group_served(queue, group_state, keeper, held, until, now);
            }
        }
        // Know the next due date before rescheduling.
        while state.buffer.is_empty() && state.cursor != Cursor::All {
            self.refill(queue, state)?;
        }
        Ok(())
    }

    /// Reads the next due entries past the cursor; under the queue's lock
    /// (see the module docs for why).
    fn refill(&self, queue: &Queue, state: &mut QueueState) -> Result<(), StoreError> {
        let after = match &state.cursor {
            Cursor::NotLoaded => None,
            Cursor::UpTo(due, hash) => Some((*due, *hash)),
            Cursor::All => return Ok(()),
        };
        let page = self
            .store
            .due_entries(&queue.crawl, &queue.key, after, state.refill)?;
        if let Some((due, hash)) = page.last {
            state.cursor = Cursor::UpTo(due, hash);
        }
        for entry in page.urls {
            if !state.leased.contains_key(&entry.url) {
                state.buffer.insert(
                    (entry.due_at, entry.hash, entry.url),
                    (entry.partition, Some(entry.metadata)),
                );
            }
        }
        if page.complete {
            state.cursor = Cursor::All;
        }
        Ok(())
    }

    /// When a URL's lease runs out, if it is leased now.
    #[must_use]
    pub fn lease_of(
        &self,
        crawl: &str,
        queue: &str,
        url: &str,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let queue = self.queue(crawl, queue)?;
        let state = queue.lock();
        state
            .leased
            .get(url)
            .map(|lease| lease.until)
            .filter(|&until| until > now)
    }

    /// Counts of one queue, or of every queue of a crawl (`queue` `None`).
    #[must_use]
    pub fn counts(&self, crawl: &str, queue: Option<&str>, now: Timestamp) -> QueueCounts {
        let mut counts = QueueCounts::default();
        let queues: Vec<Arc<Queue>> = match queue {
            Some(key) => self.queue(crawl, key).into_iter().collect(),
            None => self.queues_of(crawl),
        };
        let counted = self.counted.load();
        for queue in queues {
            // A queue is counted with its key's partition, as its owner
            // is found (a key that is not its URLs' host is rare).
            if let Some(counted) = counted.as_ref() {
                let partition = self
                    .partition_by
                    .partition(crawl, &queue.key, counted.len());
                if !counted.get(partition).copied().unwrap_or(false) {
                    continue;
                }
            }
            let state = queue.lock();
            counts.urls += state.record.urls;
            counts.completed += state.record.completed;
            counts.leased += state.leased_now(now);
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
            .crawl_names()
            .into_iter()
            .filter(|crawl| {
                self.queues_of(crawl)
                    .iter()
                    .any(|q| q.lock().record.urls > 0)
            })
            .collect();
        crawls.sort();
        crawls
    }

    /// A crawl's queue keys, sorted; with `include_inactive` false only the
    /// queues with URLs not completed.
    #[must_use]
    pub fn queue_keys(&self, crawl: &str, include_inactive: bool) -> Vec<String> {
        let mut keys: Vec<String> = self
            .queues_of(crawl)
            .iter()
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
        if !queue.is_empty() {
            return self.set_queue_delay(crawl, queue, Duration::from_secs(u64::from(secs)));
        }
        {
            self.store.set_default_delay(crawl, secs)?;
            self.default_delays
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(crawl.to_owned(), Duration::from_secs(u64::from(secs)));
            // Queues waiting on the old default are looked at again.
            for queue in self.queues_of(crawl) {
                let mut state = queue.lock();
                self.wake(&queue, &mut state, Timestamp::EPOCH);
            }
        }
        Ok(())
    }

    /// Sets one queue's delay to the millisecond (a robots.txt Crawl-delay
    /// such as 0.05 s); delays past 49 days are held at that.
    pub fn set_queue_delay(
        &self,
        crawl: &str,
        queue: &str,
        delay: Duration,
    ) -> Result<(), StoreError> {
        let ms = u32::try_from(delay.as_millis())
            .unwrap_or(u32::MAX)
            .min(u32::MAX - 1);
        self.update_settings(crawl, queue, |record| record.delay_ms = Some(ms))
    }

    /// Blocks a queue until a UTC epoch second; 0 unblocks.
    pub fn block_until(&self, crawl: &str, queue: &str, until: u64) -> Result<(), StoreError> {
        self.update_settings(crawl, queue, |record| record.blocked_until = until)?;
        self.block_group(crawl, queue, until);
        Ok(())
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
        let queue = self.queue_or_new(crawl, queue);
        let mut state = queue.lock();
        self.store
            .update_queue_settings(&queue.crawl, &queue.key, &change)?;
        change(&mut state.record);
        self.wake(&queue, &mut state, Timestamp::EPOCH);
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
mod turns_sim;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::ingest::{DedupMode, Discovered, FilterConfig, Ingest, Known};
    use crate::revisit::Metadata;
    use crate::scope::Rules;
    use crate::store::WriteOp;
    use proto::metadata;

    const SEC: u64 = 1000;

    pub(super) struct Fixture {
        // The test's time (ms): a report lets a queue go at the time of the
        // last serve unless the test sets another.
        pub(super) now_ms: Arc<AtomicU64>,
        // Dropped before the directory.
        pub(super) ingest: Ingest,
        pub(super) scheduler: Arc<Scheduler>,
        pub(super) _dir: tempfile::TempDir,
    }

    fn open_in(dir: tempfile::TempDir, refill: usize) -> Fixture {
        open_polite(dir, refill, Politeness::Host)
    }

    pub(super) fn open_polite(
        dir: tempfile::TempDir,
        refill: usize,
        politeness: Politeness,
    ) -> Fixture {
        let store = Store::open(dir.path()).unwrap();
        let mut slot = None;
        let now_ms = Arc::new(AtomicU64::new(0));
        let clock_ms = Arc::clone(&now_ms);
        let ingest = Ingest::open_with_hook(
            store,
            FilterConfig {
                partitions: 4,
                ..FilterConfig::default()
            },
            DedupMode::Exact,
            2048,
            |store| {
                let mut scheduler =
                    Scheduler::load_with_refill(Arc::clone(store), Duration::ZERO, refill)?;
                scheduler.clock =
                    Arc::new(move || Timestamp::from_unix_millis(clock_ms.load(Ordering::SeqCst)));
                scheduler.politeness = politeness;
                let scheduler = Arc::new(scheduler);
                slot = Some(Arc::clone(&scheduler));
                Ok(Some(Box::new(move |ops, applied| {
                    scheduler.on_commit(ops, applied);
                })))
            },
        )
        .unwrap();
        Fixture {
            now_ms,
            ingest,
            scheduler: slot.unwrap(),
            _dir: dir,
        }
    }

    fn fixture(refill: usize) -> Fixture {
        open_in(tempfile::tempdir().unwrap(), refill)
    }

    impl Fixture {
        /// `urls` in serving order for one due date: by the store's hash.
        fn in_hash_order(&self, mut urls: Vec<String>) -> Vec<String> {
            urls.sort_by_key(|url| (self.scheduler.store.url_hash(url), url.clone()));
            urls
        }

        pub(super) fn discover(&self, urls: &[String], now_secs: u64) {
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

        pub(super) fn report(&self, url: &str, due_at: u64) {
            self.ingest
                .put_known(
                    "c",
                    &[Known {
                        url: url.to_owned(),
                        due_at,
                        ..Known::default()
                    }],
                    &Rules::default(),
                    1,
                )
                .unwrap();
        }

        /// Shut down and opened again on its directory, with a buffer of
        /// `refill` URLs.
        fn reopen(self, refill: usize) -> Fixture {
            let Fixture {
                ingest,
                scheduler,
                _dir,
                ..
            } = self;
            drop(scheduler);
            ingest.shutdown().unwrap();
            open_in(_dir, refill)
        }

        pub(super) fn serve(&self, request: &ServeRequest, now_ms: u64) -> Vec<String> {
            self.now_ms.store(now_ms, Ordering::SeqCst);
            self.scheduler
                .serve(request, Timestamp::from_unix_millis(now_ms))
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

    /// A host whose partition (of 4, crawl "c") differs from `host`'s.
    fn host_in_another_partition(host: &str) -> String {
        let partition = |host: &str| crate::ingest::partition_of("c", host, 4);
        (b'b'..=b'z')
            .map(|c| format!("{}.example", c as char))
            .find(|other| partition(other) != partition(host))
            .unwrap()
    }

    #[test]
    fn only_the_partitions_served_here_are_handed_out() {
        let f = fixture(4);
        let partition = |host: &str| crate::ingest::partition_of("c", host, 4);
        let here = "a.example";
        let away = host_in_another_partition(here);
        f.discover(&urls(here, 3), 10);
        f.discover(&urls(&away, 3), 10);
        let mut served = vec![false; 4];
        served[partition(here)] = true;
        f.scheduler.set_served_partitions(Some(served));
        let first = f.serve(&all(30), 10 * SEC);
        assert_eq!(
            first,
            f.in_hash_order(urls(here, 3)),
            "only the served partition's queue"
        );
        assert!(f.serve(&all(30), 11 * SEC).is_empty());
        f.scheduler.set_served_partitions(None);
        assert_eq!(f.serve(&all(30), 12 * SEC), f.in_hash_order(urls(&away, 3)));
        let (leased, until) = f
            .scheduler
            .leases_in_partition(partition(&away) as u32, Timestamp::from_unix_secs(20));
        assert_eq!((leased, until), (3, Timestamp::from_unix_secs(42)));
        for url in &first {
            f.report(url, 0);
        }
        // Nothing served: a URL that came in meanwhile waits too.
        f.scheduler.set_served_partitions(Some(vec![false; 4]));
        f.discover(&urls(here, 4)[3..], 13);
        assert!(f.serve(&all(30), 13 * SEC).is_empty());
        f.scheduler.set_served_partitions(None);
        assert_eq!(f.serve(&all(30), 14 * SEC), urls(here, 4)[3..].to_vec());
    }

    #[test]
    fn a_dropped_partition_is_not_served_and_its_queues_count_nothing() {
        let f = fixture(2);
        let partition = |host: &str| crate::ingest::partition_of("c", host, 4);
        let away = "a.example";
        let here = host_in_another_partition(away);
        f.discover(&urls(away, 5), 10);
        f.discover(&urls(&here, 2), 10);
        let dropped = f.ingest.drop_partition(partition(away) as u32).unwrap();
        assert_eq!(dropped, 5);
        assert_eq!(f.serve(&all(30), 10 * SEC), f.in_hash_order(urls(&here, 2)));
        let counts = f
            .scheduler
            .counts("c", Some(away), Timestamp::from_unix_secs(10));
        assert_eq!((counts.urls, counts.completed), (0, 0));
    }

    #[test]
    fn records_taken_whole_are_served_unless_completed() {
        let f = fixture(2);
        let partition = crate::ingest::partition_of("c", "a.example", 4) as u32;
        let record = |due_at| crate::record::UrlRecord {
            created_at: 1,
            due_at,
            depth: 3,
            queue_key: "a.example".into(),
            metadata: BTreeMap::new(),
        };
        let moved = |url: &str, due_at| crate::ingest::PartitionUrl {
            crawl: "c".into(),
            url: url.into(),
            record: record(due_at),
        };
        f.ingest
            .take_partition_urls(
                partition,
                vec![
                    moved("http://a.example/done", 0),
                    moved("http://a.example/due", 5),
                ],
            )
            .unwrap();
        let counts = f
            .scheduler
            .counts("c", Some("a.example"), Timestamp::from_unix_secs(10));
        assert_eq!((counts.urls, counts.completed), (2, 1));
        assert_eq!(
            f.serve(&all(30), 10 * SEC),
            vec!["http://a.example/due".to_owned()]
        );
        // The store agrees after a restart.
        let reopened = f.reopen(2);
        let counts =
            reopened
                .scheduler
                .counts("c", Some("a.example"), Timestamp::from_unix_secs(10));
        assert_eq!((counts.urls, counts.completed), (2, 1));
    }

    #[test]
    fn each_due_url_is_served_once_per_lease_across_refills_and_trims() {
        // Refill 4 with 50 URLs: every path of the buffer is taken.
        let f = fixture(4);
        let expected = urls("a.example", 50);
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
        let expected = f.in_hash_order(expected);
        assert_eq!(
            served, expected,
            "in date order (then the store's hash order), once each"
        );
        assert!(f.serve(&all(60), 10 * SEC).is_empty());
        let counts = f
            .scheduler
            .counts("c", None, Timestamp::from_unix_millis(10 * SEC));
        assert_eq!((counts.urls, counts.completed), (50, 50));
    }

    #[test]
    fn an_expired_lease_makes_the_url_servable_again() {
        let f = fixture(4);
        f.discover(&urls("a.example", 20), 10);
        let first = f.serve(&all(30), 10 * SEC);
        assert_eq!(first.len(), 20);
        assert!(f.serve(&all(30), 39 * SEC).is_empty(), "still leased");
        assert_eq!(
            f.scheduler
                .counts("c", None, Timestamp::from_unix_millis(39 * SEC))
                .leased,
            20
        );
        // Half are done before the leases run out: only the rest return.
        for url in &first[..10] {
            f.report(url, 0);
        }
        let again = f.serve(&all(30), 40 * SEC);
        assert_eq!(again, first[10..].to_vec());
    }

    #[test]
    fn a_call_sets_aside_only_the_queues_it_looked_at() {
        let f = fixture(8);
        f.discover(
            &[
                "http://a.example/1".to_owned(),
                "http://b.example/1".to_owned(),
            ],
            10,
        );
        let crawl = f.scheduler.crawl("c").unwrap();
        let a = crawl.queue("a.example").unwrap();
        // A queue woken while a call runs (by another client's report) is
        // the call's to serve; one it looked at already waits for the next.
        let looked_at: foldhash::HashSet<_> = [Arc::as_ptr(&a)].into_iter().collect();
        let mut deferred = Vec::new();
        let now = Timestamp::from_unix_millis(20 * SEC);
        let (_, taken) = crawl.take_due(now, &looked_at, &mut deferred).unwrap();
        assert_eq!(taken.key, "b.example");
        assert!(crawl.take_due(now, &looked_at, &mut deferred).is_none());
        assert_eq!(deferred.len(), 1);
        assert!(Arc::ptr_eq(&deferred[0].1, &a));
        // Put back when the call ends, it is the next call's.
        crawl.put_back(deferred);
        let (_, taken) = crawl
            .take_due(now, &foldhash::HashSet::default(), &mut Vec::new())
            .unwrap();
        assert!(Arc::ptr_eq(&taken, &a));
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
            hold_queues: true,
            ..ServeRequest::default()
        };
        f.scheduler.set_delay("c", "a.example", 5).unwrap();
        let first = f.serve(&one, 10 * SEC);
        assert_eq!(first.len(), 1);
        f.report(&first[0], 0);
        assert!(f.serve(&one, 14 * SEC).is_empty(), "delay not passed");
        // The report came in at some moment of millisecond 10 000: 5 s
        // from its end, not its start.
        assert!(
            f.serve(&one, 15 * SEC).is_empty(),
            "the delay runs from the millisecond after the report's"
        );
        let second = f.serve(&one, 15 * SEC + 1);
        assert_eq!(second.len(), 1);
        assert!(
            f.serve(&one, 30 * SEC).is_empty(),
            "held: one lease at a time"
        );
        // Let go at 40 s: the delay runs from then.
        f.now_ms.store(40 * SEC, Ordering::SeqCst);
        f.report(&second[0], 0);
        assert!(f.serve(&one, 44 * SEC).is_empty(), "delay after the let-go");
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
    fn shared_serving_counts_leased_urls_against_the_per_queue_maximum() {
        let f = fixture(8);
        let order = f.in_hash_order(urls("a.example", 6));
        f.discover(&order, 10);
        let two = ServeRequest {
            max_urls_per_queue: 2,
            lease_secs: 1000,
            ..ServeRequest::default()
        };
        let first = f.serve(&two, 10 * SEC);
        assert_eq!(first, order[..2]);
        assert!(f.serve(&two, 11 * SEC).is_empty(), "2 in flight, limit 2");
        // One reported: one slot free, while the other is still leased.
        f.report(&first[0], 0);
        assert_eq!(f.serve(&two, 12 * SEC), order[2..3]);
        // No limit: every other due URL, while two are still leased.
        assert_eq!(f.serve(&all(1000), 13 * SEC), order[3..]);
        // Leased URLs are not served again, whatever the limit.
        assert!(f.serve(&all(1000), 14 * SEC).is_empty());
    }

    #[test]
    fn shared_serving_hands_out_the_next_due_url_while_the_first_is_leased() {
        let f = fixture(8);
        let order = f.in_hash_order(urls("a.example", 3));
        f.discover(&order[..1], 9);
        f.discover(&order[1..], 10);
        let one = ServeRequest {
            max_urls_per_queue: 1,
            lease_secs: 1000,
            ..ServeRequest::default()
        };
        assert_eq!(f.serve(&one, 10 * SEC), order[..1]);
        // Delay 0, no limit: the next due URLs at the next call, in
        // due-date order, while the first is still leased.
        assert_eq!(f.serve(&all(1000), 10 * SEC), order[1..]);
    }

    #[test]
    fn shared_serving_counts_the_delay_from_each_serve_that_hands_out() {
        let f = fixture(8);
        f.discover(&urls("a.example", 4), 10);
        f.scheduler.set_delay("c", "a.example", 5).unwrap();
        let one = ServeRequest {
            max_urls_per_queue: 1,
            lease_secs: 1000,
            ..ServeRequest::default()
        };
        let first = f.serve(&one, 10 * SEC);
        assert_eq!(first.len(), 1);
        assert!(f.serve(&all(1000), 14 * SEC).is_empty(), "within the delay");
        // A report does not restart the delay: it ran from the serve.
        f.now_ms.store(14 * SEC, Ordering::SeqCst);
        f.report(&first[0], 0);
        let second = f.serve(&one, 15 * SEC);
        assert_eq!(second.len(), 1, "5 s after the serve, not the report");
        // A serve that hands out nothing (the queue at its limit) does not
        // start the delay.
        let zero_room = ServeRequest {
            max_urls_per_queue: 1,
            lease_secs: 1000,
            ..ServeRequest::default()
        };
        assert!(f.serve(&zero_room, 20 * SEC).is_empty(), "1 in flight");
        assert_eq!(f.serve(&all(1000), 20 * SEC).len(), 2);
    }

    fn hosts_of(served: &[String]) -> HashSet<String> {
        served
            .iter()
            .map(|url| url::Url::parse(url).unwrap().host_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_politeness_group_serves_one_queue_at_a_time_a_delay_after_its_let_go() {
        let f = open_polite(tempfile::tempdir().unwrap(), 8, Politeness::Domain);
        f.scheduler.set_delay("c", "", 1).unwrap();
        let mut all_urls = urls("a.example.org", 2);
        all_urls.extend(urls("b.example.org", 2));
        all_urls.extend(urls("other.example.net", 1));
        f.discover(&all_urls, 10);
        let hold = ServeRequest {
            hold_queues: true,
            ..all(1000)
        };
        let first = f.serve(&hold, 10 * SEC);
        let hosts = hosts_of(&first);
        assert_eq!(
            hosts.len(),
            2,
            "one host of example.org and the other: {first:?}"
        );
        assert!(hosts.contains("other.example.net"));
        f.now_ms.store(10 * SEC + 500, Ordering::SeqCst);
        for url in first.iter().filter(|url| url.contains("example.org")) {
            f.report(url, 0);
        }
        assert!(
            f.serve(&hold, 11 * SEC).is_empty(),
            "a delay from the let-go"
        );
        let second = f.serve(&hold, 11 * SEC + 502);
        assert_eq!(second.len(), 2, "{second:?}");
        assert_eq!(hosts_of(&second).len(), 1);
        assert!(hosts_of(&first).is_disjoint(&hosts_of(&second)));
        // A block on one host holds its group.
        f.now_ms.store(12 * SEC, Ordering::SeqCst);
        for url in &second {
            f.report(url, 100);
        }
        let blocked = hosts_of(&second).into_iter().next().unwrap();
        f.scheduler.block_until("c", &blocked, 200).unwrap();
        assert!(f.serve(&hold, 150 * SEC).is_empty(), "the group is blocked");
        assert_eq!(f.serve(&hold, 201 * SEC).len(), 2);
    }

    #[test]
    fn hosts_reported_at_one_address_join_its_group() {
        let f = open_polite(tempfile::tempdir().unwrap(), 8, Politeness::Ip);
        f.scheduler.set_delay("c", "", 1).unwrap();
        let mut all_urls = urls("x.test", 2);
        all_urls.extend(urls("y.test", 2));
        f.discover(&all_urls, 10);
        let one_each = ServeRequest {
            hold_queues: true,
            max_urls_per_queue: 1,
            ..all(1000)
        };
        let first = f.serve(&one_each, 10 * SEC);
        assert_eq!(hosts_of(&first).len(), 2, "apart until an address is known");
        f.now_ms.store(10 * SEC + 100, Ordering::SeqCst);
        for url in &first {
            f.ingest
                .put_known(
                    "c",
                    &[Known {
                        url: url.clone(),
                        metadata: [(metadata::ADDRESS.to_owned(), vec!["10.0.0.1".to_owned()])]
                            .into(),
                        ..Known::default()
                    }],
                    &Rules::default(),
                    1,
                )
                .unwrap();
        }
        let next = f.serve(&one_each, 12 * SEC);
        assert_eq!(next.len(), 1, "one address, one queue at a time: {next:?}");
    }

    #[test]
    fn under_ip_a_host_is_filed_under_its_looked_up_address_before_its_first_serve() {
        let f = open_polite(tempfile::tempdir().unwrap(), 8, Politeness::Ip);
        f.scheduler.set_delay("c", "", 1).unwrap();
        let (lookups, mut asked) = tokio::sync::mpsc::unbounded_channel();
        f.scheduler.address_lookups.set(lookups).unwrap();
        let mut all_urls = urls("x.test", 2);
        all_urls.extend(urls("y.test", 2));
        all_urls.extend(urls("10.0.0.1", 2));
        f.discover(&all_urls, 10);
        let one_each = ServeRequest {
            hold_queues: true,
            max_urls_per_queue: 1,
            ..all(1000)
        };
        // An address literal is its own address; the names wait.
        let first = f.serve(&one_each, 10 * SEC);
        assert_eq!(hosts_of(&first), ["10.0.0.1".to_owned()].into());
        let mut names = vec![asked.try_recv().unwrap(), asked.try_recv().unwrap()];
        names.sort();
        assert_eq!(
            names,
            [
                ("c".to_owned(), "x.test".to_owned()),
                ("c".to_owned(), "y.test".to_owned())
            ]
        );
        assert!(asked.try_recv().is_err(), "each host asked for once");
        let ip = "10.0.0.1".parse().unwrap();
        f.scheduler.address_found("c", "x.test", Some(ip));
        f.scheduler.address_found("c", "y.test", Some(ip));
        assert!(
            f.serve(&one_each, 10 * SEC + 10).is_empty(),
            "the literal holds the address"
        );
        f.now_ms.store(10 * SEC + 100, Ordering::SeqCst);
        for url in &first {
            f.report(url, 100);
        }
        let next = f.serve(&one_each, 12 * SEC);
        assert_eq!(next.len(), 1, "one address, one queue at a time: {next:?}");
        // A host whose lookup never answers is served alone after the wait.
        f.discover(&urls("z.test", 1), 10);
        assert!(f.serve(&one_each, 13 * SEC).is_empty());
        assert_eq!(asked.try_recv().unwrap().1, "z.test");
        let wait = u64::try_from(LOOKUP_WAIT.as_millis()).unwrap();
        assert!(f.serve(&one_each, 13 * SEC + wait - 1).is_empty());
        assert_eq!(f.serve(&one_each, 13 * SEC + wait), urls("z.test", 1));
    }

    #[test]
    fn a_held_queue_serves_no_one_until_let_go_and_shared_leases_hold_off_a_holder() {
        let f = fixture(8);
        f.discover(&urls("a.example", 6), 10);
        let hold = ServeRequest {
            max_urls_per_queue: 2,
            lease_secs: 1000,
            hold_queues: true,
            ..ServeRequest::default()
        };
        let held = f.serve(&hold, 10 * SEC);
        assert_eq!(held.len(), 2);
        assert!(
            f.serve(&all(1000), 10 * SEC).is_empty(),
            "held by its lease"
        );
        f.report(&held[0], 0);
        assert!(
            f.serve(&all(1000), 10 * SEC).is_empty(),
            "one URL still held"
        );
        f.report(&held[1], 0);
        let shared = f.serve(
            &ServeRequest {
                max_urls_per_queue: 1,
                ..all(1000)
            },
            11 * SEC,
        );
        assert_eq!(shared.len(), 1);
        assert!(f.serve(&hold, 11 * SEC).is_empty(), "a shared lease is out");
        f.report(&shared[0], 0);
        assert_eq!(f.serve(&hold, 11 * SEC).len(), 2);
    }

    #[test]
    fn settings_and_counts_survive_a_restart_and_leases_hold_serving_until_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let f = open_in(dir, 4);
        f.discover(&urls("a.example", 10), 10);
        f.discover(&urls("b.example", 3), 10);
        // Leases of 20 s from 10 s: the horizon goes 5 s past their end.
        let served = f.serve(&all(20), 10 * SEC);
        assert_eq!(served.len(), 13);
        f.report(&served[0], 0);
        f.scheduler.set_delay("c", "b.example", 7).unwrap();
        f.scheduler.set_delay("c", "", 3).unwrap();
        f.scheduler.block_until("c", "a.example", 50).unwrap();
        f.scheduler.set_active(false).unwrap();
        let f = f.reopen(4);
        assert_eq!(f._dir.path(), path);
        assert!(!f.scheduler.is_active());
        f.scheduler.set_active(true).unwrap();
        let counts = f
            .scheduler
            .counts("c", None, Timestamp::from_unix_millis(0));
        assert_eq!((counts.urls, counts.completed, counts.leased), (13, 1, 0));
        // The earlier process's leases may still be in use until the
        // horizon (35 s): nothing is served before it.
        assert!(f.serve(&all(20), 20 * SEC).is_empty());
        assert!(f.serve(&all(20), 35 * SEC - 1).is_empty());
        // Then b.example's 3 come back; a.example is blocked until 50.
        let again = f.serve(&all(60), 35 * SEC);
        assert_eq!(again.len(), 3);
        let a = f.serve(&all(60), 51 * SEC);
        assert_eq!(a.len(), 9);
    }

    /// What a served URL carries of its metadata is what the store holds:
    /// kept from the discovery's hook and from a refill; not kept after a
    /// report, whose metadata the store settles (then read when handed
    /// out).
    #[test]
    fn served_urls_carry_the_metadata_the_store_holds_or_none() {
        let tagged = |url: &str| Discovered {
            url: url.to_owned(),
            depth: 1,
            metadata: [("tag".to_owned(), vec![url.to_owned()])].into(),
            ..Discovered::default()
        };
        let serve = |f: &Fixture, now_ms: u64| -> BTreeMap<String, Option<Metadata>> {
            f.now_ms.store(now_ms, Ordering::SeqCst);
            let served = f
                .scheduler
                .serve(&all(1), Timestamp::from_unix_millis(now_ms))
                .unwrap();
            for served in &served {
                let stored = f.scheduler.store.get(served.partition, "c", &served.url);
                let stored = stored.unwrap().expect("stored").metadata;
                if let Some(kept) = &served.metadata {
                    assert_eq!(kept.decode().unwrap(), stored, "{}", served.url);
                }
            }
            (served.into_iter())
                .map(|served| {
                    (
                        served.url,
                        served.metadata.map(|kept| kept.decode().unwrap()),
                    )
                })
                .collect()
        };
        let urls = urls("m.example", 6);
        let again: Metadata = [("tag".to_owned(), vec!["again".to_owned()])].into();
        // A buffer of up to 16 URLs: the hooks buffer every one.
        let f = open_in(tempfile::tempdir().unwrap(), 8);
        let items: Vec<Discovered> = urls.iter().map(|url| tagged(url)).collect();
        (f.ingest)
            .put_discovered("c", &items, &Rules::default(), 1)
            .unwrap();
        let first = serve(&f, 2 * SEC);
        assert_eq!(first.len(), 6);
        for (url, metadata) in &first {
            assert_eq!(metadata.as_ref(), Some(&tagged(url).metadata), "{url}");
        }
        let report = Known {
            url: urls[0].clone(),
            due_at: 3,
            metadata: again.clone(),
            ..Known::default()
        };
        (f.ingest)
            .put_known("c", &[report], &Rules::default(), 2)
            .unwrap();
        let second = serve(&f, 4 * SEC);
        assert_eq!(second.len(), 6, "the report's URL and the expired leases");
        assert_eq!(second[&urls[0]], None, "settled by the store: read later");

        // Reopened with a buffer of 2 URLs: refills read every one.
        let f = f.reopen(2);
        let third = serve(&f, 100 * SEC);
        assert_eq!(third.len(), 6);
        assert_eq!(third[&urls[0]], Some(again));
        for url in &urls[1..] {
            assert_eq!(third[url], Some(tagged(url).metadata), "{url}");
        }
    }

    #[test]
    fn one_durable_horizon_covers_the_serves_of_a_quarter_lease() {
        let f = fixture(4);
        for host in 0..4 {
            f.discover(&urls(&format!("h{host}.example"), 1), 10);
        }
        let one = |at: u64| {
            f.serve(
                &ServeRequest {
                    max_queues: 1,
                    lease_secs: 10,
                    ..ServeRequest::default()
                },
                at,
            )
        };
        let horizon = || f.ingest.store().leases_until().unwrap();
        assert_eq!(horizon(), 0, "nothing leased, nothing recorded");
        assert_eq!(one(10 * SEC).len(), 1);
        assert_eq!(horizon(), 22_500, "lease end (20 s) plus a quarter lease");
        // Leases ending by the horizon need no new write.
        assert_eq!(one(12_500).len(), 1);
        assert_eq!(horizon(), 22_500);
        assert_eq!(one(13 * SEC).len(), 1);
        assert_eq!(horizon(), 25_500);
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

    /// The interleaving a refill can produce: a URL is committed, a refill
    /// reads and leases it, and only then does the commit's memory update
    /// arrive. The update must not buffer the leased URL again.
    #[test]
    fn a_commit_update_after_a_refill_leased_the_url_does_not_serve_it_twice() {
        use crate::record::UrlRecord;
        use crate::store::NewUrl;
        let f = fixture(1);
        f.discover(&urls("a.example", 3), 10);
        // A URL after the others in the serving order (by hash, in one due
        // date), so that a refill past the buffer's reads it.
        let store = &f.scheduler.store;
        let last = urls("a.example", 3)
            .iter()
            .map(|url| store.url_hash(url))
            .max()
            .unwrap();
        let url = (9000..)
            .map(|n| format!("http://a.example/p{n}"))
            .find(|url| store.url_hash(url) > last)
            .unwrap();
        let late = NewUrl {
            crawl: "c".into(),
            url,
            partition: crate::ingest::partition_of("c", "a.example", 4) as u32,
            maybe_known: false,
            record: UrlRecord {
                created_at: 10,
                due_at: 10,
                queue_key: "a.example".into(),
                ..UrlRecord::default()
            },
        };
        let ops = vec![WriteOp::Discover(late)];
        // Committed, but the hook has not run yet.
        let applied = f.ingest.store().apply(&ops).unwrap();
        let served = f.serve(&all(600), 10 * SEC);
        assert_eq!(
            served.len(),
            4,
            "the refill read the committed URL: {served:?}"
        );
        f.scheduler.on_commit(&ops, &applied);
        assert!(f.serve(&all(600), 11 * SEC).is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Discover(u8, u8),
        Complete(u8),
        Reschedule(u8, u8),
        Serve(u32, u32, bool),
        Advance(u16),
        Delay(u8, u8),
        Block(u8, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0..3_u8, 0..30_u8).prop_map(|(h, n)| Op::Discover(h, n)),
            1 => (0..90_u8).prop_map(Op::Complete),
            1 => (0..90_u8, 0..20_u8).prop_map(|(u, d)| Op::Reschedule(u, d)),
            3 => (1..15_u32, 0..4_u32, any::<bool>())
                .prop_map(|(lease, max, hold)| Op::Serve(lease, max, hold)),
            1 => (0..40_000_u16).prop_map(Op::Advance),
            1 => (0..3_u8, 0..3_u8).prop_map(|(h, secs)| Op::Delay(h, secs)),
            1 => (0..3_u8, 0..5_u8).prop_map(|(h, secs)| Op::Block(h, secs)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against a model of due dates, leases, delays and blocks, with
        /// shared and held serves mixed: a serve hands out, per queue that
        /// passes the gate, exactly its oldest due URLs not leased, up to
        /// what the per-queue maximum leaves.
        #[test]
        fn serving_matches_a_model(ops in proptest::collection::vec(op(), 1..60), refill in 1..6_usize) {
            let f = fixture(refill);
            let host_of = |i: u8| i % 3;
            let url_of = |i: u8| format!("http://h{}.example/u{i:02}", host_of(i));
            // url -> due (0: completed); url -> lease end (ms)
            let mut due: BTreeMap<u8, u64> = BTreeMap::new();
            let mut leases: BTreeMap<u8, u64> = BTreeMap::new();
            // The last serve or let-go of each queue, and whether its
            // leases hold it.
            let mut last_serve: [Option<u64>; 3] = [None; 3];
            let mut held = [false; 3];
            let mut delay_ms = [0_u64; 3];
            let mut blocked = [0_u64; 3];
            let mut now = 100 * SEC;
            for op in ops {
                match op {
                    Op::Discover(host, n) => {
                        let ids: Vec<u8> = (0..n).map(|i| host + 3 * (i % 30)).collect();
                        let list: Vec<String> = ids.iter().map(|&i| url_of(i)).collect();
                        f.discover(&list, now / SEC);
                        for id in ids {
                            due.entry(id).or_insert((now / SEC).max(1));
                        }
                    }
                    Op::Complete(i) | Op::Reschedule(i, _) => {
                        let date = match op {
                            Op::Reschedule(_, delta) => now / SEC + u64::from(delta),
                            _ => 0,
                        };
                        f.now_ms.store(now, Ordering::SeqCst);
                        f.report(&url_of(i), date);
                        due.insert(i, date);
                        let h = host_of(i);
                        let hu = h as usize;
                        if leases.remove(&i).is_some()
                            && !leases.keys().any(|&j| host_of(j) == h)
                            && std::mem::take(&mut held[hu])
                        {
                            // Let go from the millisecond after the report's.
                            let gone = now + 1;
                            last_serve[hu] = Some(last_serve[hu].map_or(gone, |l| l.max(gone)));
                        }
                    }
                    Op::Delay(h, secs) => {
                        f.scheduler.set_delay("c", &format!("h{h}.example"), u32::from(secs)).unwrap();
                        delay_ms[h as usize] = u64::from(secs) * SEC;
                    }
                    Op::Block(h, secs) => {
                        let until = if secs == 0 { 0 } else { now / SEC + u64::from(secs) };
                        f.scheduler.block_until("c", &format!("h{h}.example"), until).unwrap();
                        blocked[h as usize] = until;
                    }
                    Op::Serve(lease, max, hold) => {
                        let request = ServeRequest {
                            max_urls_per_queue: max,
                            lease_secs: lease,
                            hold_queues: hold,
                            ..ServeRequest::default()
                        };
                        let mut got = f.serve(&request, now);
                        got.sort();
                        let mut expected = Vec::new();
                        for h in 0..3_u8 {
                            let hu = h as usize;
                            // A queue is known once it holds a URL.
                            if !due.keys().any(|&i| host_of(i) == h) {
                                continue;
                            }
                            // Leases run out when the queue is looked at;
                            // all gone at once: let go at the last's end.
                            let out: Vec<(u8, u64)> = leases
                                .iter()
                                .filter(|(i, _)| host_of(**i) == h)
                                .map(|(i, until)| (*i, *until))
                                .collect();
                            let expired: Vec<(u8, u64)> =
                                out.iter().copied().filter(|(_, until)| *until <= now).collect();
                            for (i, _) in &expired {
                                leases.remove(i);
                            }
                            if !expired.is_empty()
                                && expired.len() == out.len()
                                && std::mem::take(&mut held[hu])
                            {
                                let end = expired.iter().map(|(_, until)| *until).max().unwrap_or(0);
                                last_serve[hu] = Some(last_serve[hu].map_or(end, |l| l.max(end)));
                            }
                            if blocked[hu] > 0 && blocked[hu] * SEC >= now {
                                continue;
                            }
                            if delay_ms[hu] > 0
                                && last_serve[hu].is_some_and(|last| now < last + delay_ms[hu])
                            {
                                continue;
                            }
                            let in_flight = leases.keys().filter(|&&i| host_of(i) == h).count();
                            let per_queue = if max == 0 { usize::MAX } else { max as usize };
                            let take = if in_flight > 0 && (held[hu] || hold) {
                                0
                            } else if hold {
                                let spaced = if delay_ms[hu] == 0 {
                                    usize::MAX
                                } else {
                                    (u64::from(lease) * SEC / (2 * delay_ms[hu])).max(1) as usize
                                };
                                per_queue.min(spaced)
                            } else {
                                per_queue.saturating_sub(in_flight)
                            };
                            let mut servable: Vec<(u64, u64, String, u8)> = due
                                .iter()
                                .filter(|(i, d)| {
                                    host_of(**i) == h
                                        && **d != 0
                                        && **d <= now / SEC
                                        && !leases.contains_key(i)
                                })
                                .map(|(i, d)| {
                                    let url = url_of(*i);
                                    (*d, f.scheduler.store.url_hash(&url), url, *i)
                                })
                                .collect();
                            servable.sort();
                            servable.truncate(take);
                            if !servable.is_empty() {
                                last_serve[hu] = Some(now);
                                held[hu] = hold;
                            }
                            for (_, _, _, i) in servable {
                                leases.insert(i, now + u64::from(lease) * SEC);
                                expected.push(url_of(i));
                            }
                        }
                        expected.sort();
                        prop_assert_eq!(&got, &expected);
                    }
                    Op::Advance(ms) => now += u64::from(ms),
                }
            }
        }
    }
}
