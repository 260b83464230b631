//! Writes held in memory between a group's answer and the files.
//!
//! A checkpoint commits both files durably, which at scale takes a second
//! or more (it writes every page the groups since the last one dirtied),
//! and redb runs one write transaction per file at a time: while groups
//! were answered only once both files held them, no answer went out during
//! a checkpoint. With writes held, a group is answered once its log record
//! is synced (what makes it durable) and its effects are worked out and
//! held here; the applier ([`crate::commit`] runs it on a thread of its
//! own) writes what is held to the files, and checkpoints, while groups go
//! on.
//!
//! # What is held
//!
//! Per `url_records` key and per `serving_order` key, its newest value or
//! its removal, in two layers: what groups wrote since the applier's last
//! copy (`fresh`), over what the applier is writing (`writing`); under
//! both, the `serving_order` removals of written layers, held back from
//! `frontier.redb` until there are many (module `put_off`); the held
//! groups' queue count changes; crawl and queue numbers given but not
//! written (module `names`). A group is worked out against what is held
//! over a snapshot of `urls.redb`, so the files need not hold it yet.
//!
//! # Readers
//!
//! Every read of the two tables takes what is held as newer than the
//! files. A reader copies what it needs of what is held and opens its read
//! transactions under the read side of `state`; the applier drops what it
//! wrote under the write side, after its commit. So an entry is either in
//! what the reader copied or in its snapshot.
//!
//! # The applier
//!
//! It takes the fresh layer (the groups up to the newest one) as the one
//! it writes, writes that to `urls.redb` and `frontier.redb`, non-durably
//! (the log holds the groups), and then lets it go: whatever a later group
//! changed since is in the fresh layer, which readers consult first. Both
//! steps swap a layer under the lock, so however much is held, writers and
//! readers wait on the applier for no longer than the swap.
//! The applier lets writes gather for a while before a copy
//! ([`crate::commit`] says how long), so that they share the pages the
//! copy rewrites.
//! A checkpoint makes both files durable at the last group written, then
//! restarts the log keeping the groups logged after it
//! ([`crate::wal::Wal::restart_keeping`]). The held queue counts move to
//! the applied ones as the applier copies what is held, so the counts a
//! checkpoint writes are those of the groups it makes durable.
//!
//! A group holding a deletion is not held: deletions range over keys,
//! which the files answer alone, so it waits until everything held is
//! written and is applied to both files before it is answered, as every
//! group was before writes were held. A store whose writes are not held
//! (no applier runs: tests, the repair tools, a store being opened) applies
//! every group to the files before answering it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar};
use std::time::{Duration, Instant};

use redb::ReadableDatabase;

use super::held_view::{HeldBefore, HeldView};
use super::locks::{
    OrderedMutex, OrderedMutexGuard, OrderedReadGuard, OrderedRwLock, OrderedWriteGuard, Rank,
};
use super::names::GroupNames;
use super::pace::Pace;
use super::put_off::PutOff;
use super::queue_counts::{GroupCounts, QueueCounts};
use super::record_map::RecordMap;
use super::records::{MergeCursor, RecordsRead, RecordsWrite, merging_from};
use super::schema::{
    APPLIED_LSN_KEY, CRAWL_NAMES, META, ORDER_ENTRY, OrderKey, QUEUE_NAMES, RecordKey,
    SERVING_ORDER, URLS_META,
};
use super::{Applied, MainFileChange, StagedGroup, Store, StoreError, WriteOp};
use crate::wal::{Restart, WalError};

/// A group staged slower than this is logged (at debug level) with where
/// its time went: the answer it delays is what a client waits for.
const SLOW_GROUP: Duration = Duration::from_millis(250);

/// The least [`Store::held_limit`] can be, whatever the cache.
const HELD_LIMIT_MIN: usize = 16 << 20;

/// Held writes of some groups: per key, its newest value (`None`:
/// removed).
#[derive(Debug, Default)]
pub(super) struct Layer {
    records: RecordMap,
    order: BTreeMap<OrderKey, Option<u32>>,
    /// The newest group whose writes it holds.
    newest: u64,
    /// The newest group the files held before it.
    after: u64,
    /// Whether it was given a `serving_order` removal (one a later insert
    /// replaced included).
    removes: bool,
    /// Bytes its `serving_order` entries hold, roughly.
    order_bytes: usize,
}

impl Layer {
    /// Bytes it holds, roughly.
    fn bytes(&self) -> usize {
        self.records.bytes() + self.order_bytes
    }

    fn hold_record(&mut self, key: RecordKey, value: Option<Vec<u8>>) {
        self.records.insert(key, value.map(Vec::into_boxed_slice));
    }

    fn hold_order(&mut self, key: OrderKey, value: Option<u32>) {
        self.removes |= value.is_none();
        if self.order.insert(key, value).is_none() {
            self.order_bytes += ORDER_ENTRY;
        }
    }
}

/// What is held.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// What groups wrote since the applier's last copy.
    fresh: Layer,
    /// What the applier is writing: the fresh layer as its last copy took
    /// it, until both files hold it. Shared with the applier, so that
    /// taking it needs no copy under the lock.
    writing: Arc<Layer>,
    /// `url_records` as the applier left it after its last copy (`None`
    /// inside: no such table), which held writes are worked out over;
    /// `None`: each group opens its own. Opening a snapshot sometimes
    /// waits on redb's locks for as long as a large commit of the applier
    /// takes, and a group waited with it; one opened by the applier
    /// spares the groups that wait.
    pub(super) snapshot: Option<Arc<Option<RecordsRead>>>,
    /// `serving_order` removals of written layers that `frontier.redb`
    /// has yet to make (module `put_off`).
    pub(super) put_off: PutOff,
    /// Counts the written layers let go, and the held-back removals
    /// written: a snapshot of a file opened while it stays the same holds
    /// whatever such a layer held (see [`Store::held_and_snapshot`]).
    released: u64,
    /// Queue count changes of the groups held since the applier's last
    /// copy.
    pub(super) counts: QueueCounts,
    /// The newest group held, and the newest the applier has copied.
    newest: u64,
    copied: u64,
}

impl HeldBefore for Held {
    fn record(&self, key: &RecordKey) -> Option<Option<Vec<u8>>> {
        Held::record(self, key)
    }
}

impl Held {
    /// What is held of a `url_records` key, copied: `Some(None)` if
    /// removed.
    pub(super) fn record(&self, key: &RecordKey) -> Option<Option<Vec<u8>>> {
        let held = (self.fresh.records.get(key)).or_else(|| self.writing.records.get(key))?;
        Some(held.as_deref().map(<[u8]>::to_vec))
    }

    /// What is held of `url_records` keys in `range`, copied; put in key
    /// order by [`HeldRecordsCopy::in_order`], off the lock.
    pub(super) fn records_in(
        &self,
        range: &impl std::ops::RangeBounds<RecordKey>,
    ) -> HeldRecordsCopy {
        let copy = |layer: &Layer| -> HeldRecords {
            (layer.records.entries_in(range))
                .map(|(key, value)| (key, value.as_deref().map(<[u8]>::to_vec)))
                .collect()
        };
        HeldRecordsCopy {
            newer: copy(&self.fresh),
            older: copy(&self.writing),
        }
    }

    /// What is held of `serving_order` keys in `range`, in key order.
    pub(super) fn order_in(
        &self,
        range: impl std::ops::RangeBounds<OrderKey> + Clone,
    ) -> HeldOrder {
        let held = overlay(
            self.fresh.order.range(range.clone()),
            self.writing.order.range(range.clone()),
        );
        let put_off = self.put_off.range(range).map(|key| (key, &None));
        overlay(held, put_off)
            .map(|(key, value)| (*key, *value))
            .collect()
    }

    /// How many layers have been let go: a snapshot opened after a look
    /// at this holds every key no longer held while it stays the same.
    pub(super) fn released(&self) -> u64 {
        self.released
    }

    /// Counts something let go that a file now holds.
    pub(super) fn count_released(&mut self) {
        self.released += 1;
    }

    fn bytes(&self) -> usize {
        self.fresh.bytes() + self.writing.bytes() + self.put_off.bytes()
    }
}

/// Two key-ordered runs merged in key order; where both have a key, the
/// newer's entry alone.
fn overlay<K: Ord, V>(
    newer: impl Iterator<Item = (K, V)>,
    older: impl Iterator<Item = (K, V)>,
) -> impl Iterator<Item = (K, V)> {
    let mut newer = newer.peekable();
    let mut older = older.peekable();
    std::iter::from_fn(move || match (newer.peek(), older.peek()) {
        (Some((new_key, _)), Some((old_key, _))) => match new_key.cmp(old_key) {
            std::cmp::Ordering::Less => newer.next(),
            std::cmp::Ordering::Greater => older.next(),
            std::cmp::Ordering::Equal => {
                older.next();
                newer.next()
            }
        },
        (Some(_), None) => newer.next(),
        (None, _) => older.next(),
    })
}

/// Held writes and what coordinates them.
#[derive(Debug)]
pub(super) struct HeldWrites {
    pub(super) state: OrderedRwLock<Held>,
    /// Wakes the applier (something to write) and writers waiting for room.
    signal: OrderedMutex<()>,
    changed: Condvar,
    /// Whether groups are held: an applier runs.
    on: AtomicBool,
    /// Held by whoever writes what is held to the files (the applier, or a
    /// drain), and by a reopening of the files.
    pub(super) applying: OrderedMutex<()>,
    /// The applier's rate, and when the next group may go.
    pace: OrderedMutex<Pace>,
    /// Held through a checkpoint of held writes, taken before the other
    /// locks: one at a time starts the log's new pass, which copies the
    /// kept records into the spare file off the writer's lock.
    checkpointing: OrderedMutex<()>,
    /// Where the applier's next copy starts merging the recent records
    /// into the base table (module `records`).
    merge_cursor: MergeCursor,
    /// Bytes held that the files lack (the fresh layer and the one being
    /// written), kept apart from the state's lock so that the disk floor's
    /// check under the writer's lock reads it without taking that lock.
    /// Set by [`Self::note_unwritten`] wherever the state changes size.
    unwritten_bytes: AtomicU64,
    /// Tests: keys groups looked up in `urls.redb` while worked out.
    #[cfg(test)]
    pub(super) files_read: std::sync::atomic::AtomicU64,
    /// Tests: what to run at a named point of a read, once.
    #[cfg(test)]
    pub(super) race: OrderedMutex<Option<(&'static str, RaceHook)>>,
}

impl Default for HeldWrites {
    fn default() -> Self {
        Self {
            state: OrderedRwLock::with_default(Rank::Held),
            signal: OrderedMutex::new(Rank::Signal, ()),
            changed: Condvar::new(),
            on: AtomicBool::new(false),
            applying: OrderedMutex::new(Rank::Applying, ()),
            pace: OrderedMutex::with_default(Rank::Pace),
            checkpointing: OrderedMutex::new(Rank::Checkpointing, ()),
            merge_cursor: MergeCursor::default(),
            unwritten_bytes: AtomicU64::new(0),
            #[cfg(test)]
            files_read: std::sync::atomic::AtomicU64::new(0),
            #[cfg(test)]
            race: OrderedMutex::new(Rank::TestHook, None),
        }
    }
}

impl HeldWrites {
    pub(super) fn read(&self) -> OrderedReadGuard<'_, Held> {
        self.state.read()
    }

    pub(super) fn write(&self) -> OrderedWriteGuard<'_, Held> {
        self.state.write()
    }

    /// Records what `held` (this state, under its lock) holds that the
    /// files lack.
    pub(super) fn note_unwritten(&self, held: &Held) {
        self.unwritten_bytes
            .store(held.bytes() as u64, Ordering::Release);
    }

    /// Bytes held that the files lack, as last noted.
    pub(super) fn unwritten_bytes(&self) -> u64 {
        self.unwritten_bytes.load(Ordering::Acquire)
    }

    pub(super) fn lock_applying(&self) -> OrderedMutexGuard<'_, ()> {
        self.applying.lock()
    }

    fn lock_pace(&self) -> OrderedMutexGuard<'_, Pace> {
        self.pace.lock()
    }

    fn notify(&self) {
        let _signal = self.signal.lock();
        self.changed.notify_all();
    }

    fn wait(&self, until: impl Fn() -> bool, timeout: Duration) {
        let signal = self.signal.lock();
        if !until() {
            let _ = signal.wait_on_timeout(&self.changed, timeout);
        }
    }
}

/// Tests: what runs at a point of a read.
#[cfg(test)]
pub(super) type RaceHook = fn(&Store);

/// What is held of a range of `url_records` keys (`None`: removed).
pub(super) type HeldRecords = Vec<(RecordKey, Option<Vec<u8>>)>;

/// What each layer holds of a range of `url_records` keys, in no order.
pub(super) struct HeldRecordsCopy {
    pub(super) newer: HeldRecords,
    pub(super) older: HeldRecords,
}

impl HeldRecordsCopy {
    /// Each key once, the newer layer's where both have it, in key order.
    pub(super) fn in_order(mut self) -> HeldRecords {
        self.newer.sort_unstable_by_key(|(key, _)| *key);
        self.older.sort_unstable_by_key(|(key, _)| *key);
        overlay(self.newer.into_iter(), self.older.into_iter()).collect()
    }
}

/// What is held of a range of `serving_order` keys (`None`: removed).
pub(super) type HeldOrder = Vec<(OrderKey, Option<u32>)>;

/// Logs, as it is dropped, where the time of a slow working out of a
/// group went: waiting for the held lock, opening the snapshot, or the
/// lookups.
struct SlowWorkingOut {
    started: Instant,
    locked: Duration,
    opened: Duration,
}

impl Drop for SlowWorkingOut {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        if took >= SLOW_GROUP {
            tracing::debug!(
                seconds = took.as_secs_f64(),
                waiting_for_the_held_lock = self.locked.as_secs_f64(),
                opening_the_snapshot = (self.opened - self.locked).as_secs_f64(),
                looking_up = (took - self.opened).as_secs_f64(),
                "a slow working out"
            );
        }
    }
}

/// Entries of a copy from which its two files are written on two threads.
const PARALLEL_COPY_MIN: usize = 256;

impl Store {
    /// Holds the groups staged from now on in memory, for an applier to
    /// write ([`Self::apply_held`], [`Self::checkpoint_held_if_due`]); the
    /// caller runs one until the store is dropped.
    pub fn hold_writes(&self) {
        self.held.on.store(true, Ordering::Release);
    }

    /// Bytes held since the applier's last copy before a group waits for
    /// it to take them: a third of the store's memory budget (`--cache-mb`),
    /// the copy being written (no larger) and the page caches being the
    /// other two, so that the store stays within its budget. Many seconds
    /// of ingest: a checkpoint of a
    /// large store passes without a writer waiting, and, once the files
    /// outgrow the cache, a copy's keys share more of the B-tree pages
    /// they dirty (one a key at worst), which is what limits ingest there;
    /// the cache they were taken from gained less.
    pub(super) fn held_limit(&self) -> usize {
        // `cache_bytes` is each file's sixth of the budget.
        (self.cache_bytes * 2).max(HELD_LIMIT_MIN)
    }

    pub(super) fn holding(&self) -> bool {
        self.held.on.load(Ordering::Acquire)
    }

    /// Whether groups are held that the files do not have yet.
    pub(super) fn unapplied(&self) -> bool {
        let held = self.held.read();
        held.newest > held.copied
    }

    /// Waits until something held is to be written, `stop` is set (and
    /// [`Self::wake_applier`] called), or `timeout` passes.
    pub fn wait_for_held(&self, timeout: Duration, stop: &AtomicBool) {
        self.held
            .wait(|| self.unapplied() || stop.load(Ordering::Acquire), timeout);
    }

    /// Waits until `until`, until `stop` is set (and
    /// [`Self::wake_applier`] called), or until the fresh layer holds a
    /// quarter of the held limit, well before groups are paced (module
    /// `pace`): the applier gathers writes for its next copy.
    pub fn wait_to_gather(&self, until: Instant, stop: &AtomicBool) {
        let limit = self.held_limit() / 4;
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let gathered =
                || stop.load(Ordering::Acquire) || self.held.read().fresh.bytes() >= limit;
            if gathered() {
                return;
            }
            self.held.wait(gathered, until - now);
        }
    }

    /// Wakes an applier waiting in [`Self::wait_for_held`], to see its
    /// stop flag.
    pub fn wake_applier(&self) {
        self.held.notify();
    }

    /// Waits a while after the applier failed: the files are unusable
    /// until reopened, which wakes it.
    pub fn wait_after_failure(&self) {
        self.held.wait(|| false, Duration::from_secs(1));
    }

    /// The first stage of a group held in memory: logged and synced, worked
    /// out against what is held over `urls.redb`, and held.
    pub(super) fn stage_held(
        &self,
        ops: &[WriteOp],
        new_keys: &[bool],
    ) -> Result<StagedGroup, StoreError> {
        let started = Instant::now();
        self.wait_for_room()?;
        let waited = started.elapsed();
        let mut writer = self.lock_writer();
        let locked = started.elapsed();
        let wal = &mut writer.wal;
        let logged_group = self.log_group(wal, ops)?;
        let (lsn, record_start) = (logged_group.lsn, logged_group.record_start);
        let logged = started.elapsed();
        match self.work_out_held(ops, new_keys) {
            Ok((results, records, changes, counts)) => {
                let worked = started.elapsed();
                self.hold(lsn, records, changes, counts);
                wal.set_last_lsn(lsn);
                let took = started.elapsed();
                if took >= SLOW_GROUP {
                    tracing::debug!(
                        lsn,
                        seconds = took.as_secs_f64(),
                        waiting_for_room = waited.as_secs_f64(),
                        waiting_for_the_log = (locked - waited).as_secs_f64(),
                        logging = (logged - locked).as_secs_f64(),
                        checking = logged_group.checking.as_secs_f64(),
                        appending = logged_group.appending.as_secs_f64(),
                        syncing = logged_group.syncing.as_secs_f64(),
                        working_out = (worked - logged).as_secs_f64(),
                        holding = (took - worked).as_secs_f64(),
                        "a slow group"
                    );
                }
                Ok(StagedGroup {
                    lsn,
                    changes: None,
                    results,
                })
            }
            Err(error) => {
                // Nothing of the group is held: its record goes, as when a
                // group fails to reach the files.
                self.take_back(wal, record_start, &error);
                Err(error)
            }
        }
    }

    /// Waits for the group's turn at the applier's pace (module `pace`),
    /// and while too much is held, unless the applier cannot write.
    fn wait_for_room(&self) -> Result<(), StoreError> {
        let turn = self.held.lock_pace().wait(Instant::now());
        if !turn.is_zero() {
            std::thread::sleep(turn);
        }
        let mut waited = None;
        loop {
            if self.held.read().fresh.bytes() < self.held_limit() {
                if let Some(since) = waited.map(|since: Instant| since.elapsed()) {
                    tracing::debug!(
                        seconds = since.as_secs_f64(),
                        "a group waited for the applier: held writes at their limit"
                    );
                }
                return Ok(());
            }
            waited.get_or_insert_with(Instant::now);
            self.check_poisoned()?;
            self.held.wait(
                || self.held.read().fresh.bytes() < self.held_limit(),
                Duration::from_millis(100),
            );
        }
    }

    /// A group's effects, worked out against what is held over a snapshot
    /// of `urls.redb`: its answers, the records it writes, its serving
    /// order changes and count changes. Numbers it gives are taken back if
    /// it fails.
    #[allow(clippy::type_complexity)]
    fn work_out_held(
        &self,
        ops: &[WriteOp],
        new_keys: &[bool],
    ) -> Result<
        (
            Vec<Applied>,
            BTreeMap<RecordKey, Vec<u8>>,
            Vec<MainFileChange>,
            GroupCounts,
        ),
        StoreError,
    > {
        let keys = self.url_keys();
        let mark = self.read_names().mark();
        let worked = (|| {
            let started = Instant::now();
            let held = self.held.read();
            let locked = started.elapsed();
            // Under the held lock: whatever the applier dropped from
            // memory, this snapshot holds.
            let table = match &held.snapshot {
                Some(snapshot) => Arc::clone(snapshot),
                None => Arc::new(Self::records_snapshot(&*self.files()?)?),
            };
            let opened = started.elapsed();
            let _slow = SlowWorkingOut {
                started,
                locked,
                opened,
            };
            let mut view = HeldView {
                held: &*held,
                recent: &self.recent_reads,
                table: table.as_ref().as_ref(),
                own: BTreeMap::new(),
                files_read: std::cell::Cell::new(0),
            };
            let mut names = GroupNames::deferred(&self.names);
            let (results, changes, counts) =
                Self::run_ops(&mut view, &mut names, &keys, ops, new_keys, |_, _, _, _| {
                    Err(StoreError::Halted(
                        "a deletion reached a group held in memory".into(),
                    ))
                })?;
            metrics::counter!("frontier_store_staging_file_reads_total")
                .increment(view.files_read.get());
            #[cfg(test)]
            self.held
                .files_read
                .fetch_add(view.files_read.get(), Ordering::Relaxed);
            Ok((results, view.own, changes, counts))
        })();
        if worked.is_err() {
            self.names.write().roll_back(mark);
        }
        worked
    }

    /// Holds a group's effects.
    fn hold(
        &self,
        lsn: u64,
        records: BTreeMap<RecordKey, Vec<u8>>,
        changes: Vec<MainFileChange>,
        counts: GroupCounts,
    ) {
        {
            let mut held = self.held.write();
            let fresh = &mut held.fresh;
            let bytes_before = fresh.bytes();
            for (key, value) in records {
                fresh.hold_record(key, Some(value));
            }
            for change in changes {
                let (key, value) = match change {
                    MainFileChange::Insert {
                        queue,
                        due_at,
                        hash,
                        partition,
                    } => ((queue, due_at, hash), Some(partition)),
                    MainFileChange::Remove {
                        queue,
                        due_at,
                        hash,
                    } => ((queue, due_at, hash), None),
                    // Only groups holding deletions remove queues, and
                    // those are not held.
                    MainFileChange::RemoveQueues { .. } => continue,
                };
                fresh.hold_order(key, value);
            }
            let cost = fresh.bytes().saturating_sub(bytes_before);
            let fresh_bytes = fresh.bytes();
            held.counts.absorb(counts);
            held.newest = lsn;
            self.held.note_unwritten(&held);
            self.held
                .lock_pace()
                .held(cost, fresh_bytes, self.held_limit(), Instant::now());
        }
        self.held.notify();
    }

    /// The applier's step: writes the fresh layer to both files
    /// (non-durably: the log holds it), then lets it go. Answers whether
    /// there was anything to write.
    pub fn apply_held(&self) -> Result<bool, StoreError> {
        let _applying = self.held.lock_applying();
        self.check_poisoned()?;
        let Some(taken) = self.take_fresh() else {
            return Ok(false);
        };
        self.write_taken(taken)?;
        Ok(true)
    }

    /// The fresh layer made the one being written, with the mark of the
    /// names given up to it; `None` if no group is held that the files
    /// lack. The caller holds `applying`.
    fn take_fresh(&self) -> Option<(Arc<Layer>, super::names::NamesMark)> {
        let mut held = self.held.write();
        if held.newest == held.copied {
            return None;
        }
        let counts = std::mem::take(&mut held.counts);
        self.lock_counts().absorb(GroupCounts {
            removed: Vec::new(),
            changes: counts,
        });
        let mut layer = std::mem::take(&mut held.fresh);
        layer.after = held.copied;
        layer.newest = held.newest;
        held.copied = held.newest;
        self.held.lock_pace().taken(layer.bytes(), Instant::now());
        held.writing = Arc::new(layer);
        Some((Arc::clone(&held.writing), self.read_names().mark()))
    }

    /// Writes the layer [`Self::take_fresh`] took to both files, then lets
    /// it go.
    fn write_taken(
        &self,
        (writing, names_upto): (Arc<Layer>, super::names::NamesMark),
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        // Taken now, unchanged until the layer is let go: only the applier
        // (which this is) changes it.
        let (put_off, order_lsn) = {
            let held = self.held.read();
            let flush = held.put_off.due(self.held_limit());
            let order_lsn = if flush {
                writing.newest
            } else {
                (held.put_off).complete_up_to(writing.after, writing.newest, writing.removes)
            };
            (flush.then(|| held.put_off.share()), order_lsn)
        };
        let copy = (&*writing, order_lsn);
        let written = self.write_copied(copy, names_upto, put_off.as_deref());
        if let Err(error) = &written {
            self.note_failure(error);
        }
        written?;
        let took = started.elapsed();
        tracing::debug!(
            records = writing.records.len(),
            order = writing.order.len(),
            bytes = writing.bytes(),
            seconds = took.as_secs_f64(),
            "held writes written"
        );
        self.held.lock_pace().copied(writing.bytes(), took);
        // Opened after both files hold the layer, and swapped in with its
        // going: groups see the layer or this snapshot, never neither.
        let snapshot = (self.files().ok())
            .and_then(|files| Self::records_snapshot(&files).ok())
            .map(Arc::new);
        // After the files hold the layer, before it is let go (module
        // `recent_reads`).
        self.recent_reads.forget(writing.records.keys());
        let written = {
            let mut held = self.held.write();
            held.snapshot = snapshot;
            held.released += 1;
            let written = std::mem::take(&mut held.writing);
            if put_off.is_some() {
                held.put_off.clear();
            } else {
                held.put_off.absorb(written.order.iter(), written.after);
            }
            metrics::gauge!("frontier_held_bytes").set(held.bytes() as f64);
            self.held.note_unwritten(&held);
            written
        };
        self.held.notify();
        // Freed here, off the lock.
        drop((written, writing, put_off));
        Ok(())
    }

    /// A snapshot of `url_records` as `urls.redb` holds it now.
    pub(super) fn records_snapshot(
        files: &super::Files,
    ) -> Result<Option<RecordsRead>, StoreError> {
        let read = files.urls_db.begin_read()?;
        RecordsRead::open(&read)
    }

    /// Lets go of the applier's snapshot: after a write to `urls.redb`
    /// outside the applier (which the snapshot would miss), and before the
    /// files close or are compacted (which an open snapshot would keep or
    /// refuse).
    pub(super) fn forget_records_snapshot(&self) {
        self.held.write().snapshot = None;
        self.recent_reads.clear();
    }

    /// Writes a copy of what is held to both files. A large copy writes
    /// each file on a thread of its own: redb runs one write transaction
    /// per file, and each file's B-tree work is about half of a copy's. A
    /// small one (a crawl's few writes a page) costs less than starting a
    /// thread, and is written on this one.
    /// `put_off`: the held-back removals, when they go with this copy
    /// (else the copy's own removals are held back: module `put_off`).
    /// `order_lsn`: the newest group whose every change `frontier.redb`
    /// holds with this copy.
    fn write_copied(
        &self,
        (copied, order_lsn): (&Layer, u64),
        names_upto: super::names::NamesMark,
        put_off: Option<&BTreeSet<OrderKey>>,
    ) -> Result<(), StoreError> {
        let files = self.files()?;
        let new_names = self.read_names().unpersisted(names_upto);
        let (records, order) = if copied.records.len() + copied.order.len() < PARALLEL_COPY_MIN {
            (
                self.write_records(&files.urls_db, copied, &new_names),
                Self::write_order(&files.db, (copied, order_lsn), put_off),
            )
        } else {
            std::thread::scope(|scope| {
                let order =
                    scope.spawn(|| Self::write_order(&files.db, (copied, order_lsn), put_off));
                let records = self.write_records(&files.urls_db, copied, &new_names);
                let order = order
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (records, order)
            })
        };
        records?;
        self.names.write().persisted_up_to(names_upto);
        order?;
        drop(files);
        let mut main_file = self.lock_main_file();
        main_file.lsn = copied.newest;
        self.main_file.applied();
        Ok(())
    }

    /// The `url_records` part of a copy, and the names it uses, to
    /// `urls.redb`: a share of the partitions into the base table, the
    /// rest into the recent one (module `records`).
    fn write_records(
        &self,
        urls_db: &redb::Database,
        copied: &Layer,
        (crawls, queues): &super::names::NewNames,
    ) -> Result<(), StoreError> {
        let mut write = urls_db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        {
            let mut records = RecordsWrite::open(&write)?;
            let span = records.recent_span()?.max(copied.records.partitions());
            let slice = self.held.merge_cursor.next_slice(
                records.base_len()?,
                copied.records.len() as u64,
                span,
                merging_from(self.cache_bytes),
            );
            records.write_copy(&copied.records, &slice)?;
            let mut crawl_names = write.open_table(CRAWL_NAMES)?;
            for (number, name) in crawls {
                crawl_names.insert(*number, &**name)?;
            }
            let mut queue_names = write.open_table(QUEUE_NAMES)?;
            for (number, crawl, key) in queues {
                queue_names.insert(*number, (*crawl, &**key))?;
            }
            write
                .open_table(URLS_META)?
                .insert(APPLIED_LSN_KEY, copied.newest)?;
        }
        write.commit()?;
        Ok(())
    }

    /// The `serving_order` part of a copy, to `frontier.redb`: its
    /// inserts, and its removals only with the held-back ones (`put_off`),
    /// which go first: a key the copy inserts again stays.
    fn write_order(
        db: &redb::Database,
        (copied, order_lsn): (&Layer, u64),
        put_off: Option<&BTreeSet<OrderKey>>,
    ) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        {
            let mut order = write.open_table(SERVING_ORDER)?;
            if let Some(keys) = put_off {
                super::put_off::remove_from(&mut order, keys)?;
            }
            for (key, value) in &copied.order {
                match *value {
                    Some(partition) => {
                        order.insert(*key, partition)?;
                    }
                    None if put_off.is_some() => {
                        order.remove(*key)?;
                    }
                    None => {}
                }
            }
            write.open_table(META)?.insert(APPLIED_LSN_KEY, order_lsn)?;
        }
        write.commit()?;
        Ok(())
    }

    /// Writes everything held to the files; the caller stages nothing
    /// meanwhile.
    pub(super) fn drain_held(&self) -> Result<(), StoreError> {
        while self.apply_held()? {}
        let applying = self.held.lock_applying();
        self.write_put_off(&applying)
    }

    /// The applier's checkpoint: when one is due, both files are made
    /// durable at the last group written to them, and the log restarts
    /// keeping the groups after it. Answers whether it checkpointed.
    pub fn checkpoint_held_if_due(&self) -> Result<bool, StoreError> {
        {
            let mut writer = self.lock_writer();
            if !writer.wal.checkpoint_due() {
                return Ok(false);
            }
            // An idle store has nothing to make durable: no disk syncs.
            if writer.wal.holds_no_records() {
                writer.wal.checkpointed();
                return Ok(false);
            }
        }
        self.checkpoint_held().map(|()| true)
    }

    /// The applier's checkpoint, due or not.
    pub(super) fn checkpoint_held(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let _checkpointing = self.held.checkpointing.lock();
        let applying = self.held.lock_applying();
        self.check_poisoned()?;
        // The restarted log keeps no group before `upto`: the removals held
        // back from those groups are made durable with them.
        if let Err(error) = self.write_put_off(&applying) {
            tracing::warn!(%error, "checkpoint failed; the write-ahead log keeps the groups since the last one");
            self.note_failure(&error);
            return Err(error);
        }
        let upto = self.lock_main_file().lsn;
        {
            let files = self.files()?;
            // Held across the commits: a reader of the counts sees them
            // either all in the table or all in memory.
            let mut counts = self.lock_counts();
            if let Err(error) = Self::make_durable(&files.db, &files.urls_db, &counts, upto) {
                tracing::warn!(%error, "checkpoint failed; the write-ahead log keeps the groups since the last one");
                self.note_failure(&error);
                return Err(error);
            }
            *counts = QueueCounts::default();
        }
        let durable_took = started.elapsed();
        // Let go before the writer's lock is taken: `checkpoint` takes the
        // two the other way round.
        drop(applying);
        let data_dir = self.data_dir().to_owned();
        let restarted = self.restart_log(&data_dir, upto);
        if let Err(error) = &restarted {
            tracing::warn!(%error, "the write-ahead log could not start a new pass; it goes on growing");
        }
        let took = started.elapsed();
        self.held.lock_pace().checkpointed(took);
        metrics::histogram!("frontier_checkpoint_seconds").record(took.as_secs_f64());
        tracing::debug!(
            lsn = upto,
            seconds = took.as_secs_f64(),
            commits_seconds = durable_took.as_secs_f64(),
            "checkpoint"
        );
        Ok(())
    }

    /// The log's new pass after a checkpoint up to `durable`. The records
    /// it keeps, the groups logged while the commits ran, are copied while
    /// groups go on being logged; the writer's lock is taken only to begin
    /// and to finish ([`crate::wal::PendingRestart`]).
    fn restart_log(&self, data_dir: &Path, durable: u64) -> Result<bool, WalError> {
        let begun = self.lock_writer().wal.begin_restart(data_dir, durable)?;
        let mut pending = match begun {
            Restart::Done => return Ok(true),
            Restart::NotYet => return Ok(false),
            Restart::Pending(pending) => pending,
        };
        pending.copy()?;
        self.lock_writer().wal.finish_restart(data_dir, pending)
    }

    /// Tests: keys groups looked up in `urls.redb` as they were worked out.
    #[cfg(test)]
    pub(crate) fn staging_file_reads(&self) -> u64 {
        self.held.files_read.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewUrl, UrlRecord};
    use redb::{ReadableTable, ReadableTableMetadata};

    fn new_urls(range: std::ops::Range<usize>) -> Vec<NewUrl> {
        range
            .map(|i| NewUrl {
                crawl: "c".into(),
                url: format!("http://h{}/p{i}", i % 7),
                partition: 0,
                maybe_known: false,
                record: UrlRecord {
                    created_at: 1,
                    due_at: 5,
                    queue_key: format!("h{}", i % 7),
                    ..UrlRecord::default()
                },
            })
            .collect()
    }

    /// Written with a copy, the held-back removals go before the copy's
    /// changes: a key the copy inserts again stays, and the copy's own
    /// removals are written too.
    #[test]
    fn removals_written_with_a_copy_go_before_its_inserts() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("order.redb")).unwrap();
        {
            let write = db.begin_write().unwrap();
            let mut order = write.open_table(SERVING_ORDER).unwrap();
            for key in [(1, 5, 1), (1, 5, 2), (1, 5, 3)] {
                order.insert(key, 0).unwrap();
            }
            drop(order);
            write.commit().unwrap();
        }
        let put_off = BTreeSet::from([(1, 5, 1), (1, 5, 2)]);
        let mut copy = Layer::default();
        copy.hold_order((1, 5, 1), Some(0));
        copy.hold_order((1, 5, 3), None);
        copy.hold_order((1, 6, 4), Some(0));
        Store::write_order(&db, (&copy, 0), Some(&put_off)).unwrap();
        let read = db.begin_read().unwrap();
        let order = read.open_table(SERVING_ORDER).unwrap();
        let keys: Vec<OrderKey> = (order.iter().unwrap())
            .map(|entry| entry.unwrap().0.value())
            .collect();
        assert_eq!(keys, [(1, 5, 1), (1, 6, 4)]);
    }

    /// The applier's wait for writes to gather ends at its time, when told
    /// to stop, or once a quarter of the held limit is held, whichever
    /// comes first.
    #[test]
    fn gathering_ends_at_its_time_at_a_stop_or_at_a_quarter_of_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_cache(dir.path(), 1 << 20).unwrap();
        store.hold_writes();
        let later = Instant::now() + Duration::from_secs(3600);
        let stop = AtomicBool::new(false);
        store.wait_to_gather(Instant::now(), &stop);
        stop.store(true, Ordering::Release);
        store.wait_to_gather(later, &stop);
        stop.store(false, Ordering::Release);
        let mut offered = 0;
        while store.held.read().fresh.bytes() < store.held_limit() / 4 {
            store
                .insert_if_absent(&new_urls(offered..offered + 2048))
                .unwrap();
            offered += 2048;
        }
        store.wait_to_gather(later, &stop);
    }

    /// A copy large enough to be written on two threads and one written on
    /// the applier's alone both reach the files, and a reopened store
    /// answers every URL of both.
    #[test]
    fn small_and_large_copies_both_reach_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [PARALLEL_COPY_MIN + 10, 3];
        {
            let store = Store::open(dir.path()).unwrap();
            store.hold_writes();
            let mut offered = 0;
            for size in sizes {
                let urls = new_urls(offered..offered + size);
                offered += size;
                assert!(store.insert_if_absent(&urls).unwrap().iter().all(|s| *s));
                assert!(store.apply_held().unwrap(), "something was held");
                assert!(!store.unapplied());
                let files = store.files().unwrap();
                let read = files.urls_db.begin_read().unwrap();
                let records = RecordsRead::open(&read).unwrap().unwrap();
                let records = records.iter().unwrap().count() as u64;
                let read = files.db.begin_read().unwrap();
                let order = read.open_table(SERVING_ORDER).unwrap().len().unwrap();
                assert_eq!((records, order), (offered as u64, offered as u64));
            }
            store.checkpoint_held().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let total = sizes.iter().sum();
        for url in new_urls(0..total) {
            assert!(
                store.get(0, "c", &url.url).unwrap().is_some(),
                "{}",
                url.url
            );
        }
    }

    /// Groups are worked out over the snapshot the applier opened after
    /// its last copy; a write to the files outside the applier (a
    /// deletion) makes that snapshot stale, and a group after it must not
    /// find the URLs it removed.
    #[test]
    fn a_deletion_outside_the_applier_is_seen_by_the_next_group() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.hold_writes();
        // Looked up whatever the filters would say.
        let urls: Vec<NewUrl> = (new_urls(0..3).into_iter())
            .map(|url| NewUrl {
                maybe_known: true,
                ..url
            })
            .collect();
        assert!(store.insert_if_absent(&urls).unwrap().iter().all(|s| *s));
        assert!(store.apply_held().unwrap());
        assert!(store.held.read().snapshot.is_some());
        // Known through the applier's snapshot.
        assert!(store.insert_if_absent(&urls).unwrap().iter().all(|s| !*s));
        store
            .apply(&[WriteOp::Delete(crate::store::Deletion {
                crawl: "c".into(),
                queue: None,
                created_before: None,
                partitions: 1,
                partition: None,
                urls_below: None,
            })])
            .unwrap();
        assert!(store.held.read().snapshot.is_none());
        assert!(
            store.insert_if_absent(&urls).unwrap().iter().all(|s| *s),
            "the deleted URLs are new again"
        );
    }

    /// Reads open their snapshots off the held lock: a layer the applier
    /// lets go after a read opened its snapshot, and before it copies or
    /// looks up what is held, is in neither, and the read must try again.
    #[test]
    fn a_layer_let_go_while_a_read_opens_its_snapshot_is_not_missed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.hold_writes();
        let let_go: fn(&Store) = |store| {
            store.forget_records_snapshot();
            assert!(store.apply_held().unwrap(), "a layer to let go");
            store.forget_records_snapshot();
        };
        let reads = |store: &Store, urls: &[NewUrl]| {
            let due: usize = (0..7)
                .map(|host| {
                    let page = store.due_entries("c", &format!("h{host}"), None, 1 << 10);
                    page.unwrap().urls.len()
                })
                .sum();
            let known = (urls.iter())
                .map(|url| (0, "c", url.url.as_str()))
                .collect::<Vec<_>>();
            let known = store.known_urls(known).unwrap();
            let got = urls
                .iter()
                .filter(|url| store.get(0, "c", &url.url).unwrap().is_some());
            (due, known.iter().filter(|k| **k).count(), got.count())
        };
        let mut inserted = 0;
        let mut point = |store: &Store, at: &'static str| {
            let urls = new_urls(inserted..inserted + 5);
            assert!(store.insert_if_absent(&urls).unwrap().iter().all(|s| *s));
            inserted += 5;
            store.forget_records_snapshot();
            *store.held.race.lock() = Some((at, let_go));
            inserted
        };
        // The serving order's snapshots, opened before the layer goes.
        let n = point(&store, "snapshot opened");
        assert_eq!(reads(&store, &new_urls(0..n)).0, n);
        // The order read, the records' layer let go before their lookup.
        let n = point(&store, "order read");
        assert_eq!(reads(&store, &new_urls(0..n)).0, n);
        // A batch's lookups, and one URL's.
        let n = point(&store, "snapshot opened");
        let urls = new_urls(0..n);
        let known = (urls.iter())
            .map(|url| (0, "c", url.url.as_str()))
            .collect::<Vec<_>>();
        assert!(store.known_urls(known).unwrap().iter().all(|k| *k));
        let n = point(&store, "snapshot opened");
        let last = new_urls(n - 1..n).remove(0);
        assert!(store.get(0, "c", &last.url).unwrap().is_some());
        assert_eq!(reads(&store, &new_urls(0..n)), (n, n, n));
    }

    /// A discovered URL whose key the caller says is new is stored without
    /// a lookup in `urls.redb`, and still found in what is held and in its
    /// own group; one not said new is looked up.
    #[test]
    fn keys_said_new_are_not_looked_up_in_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.hold_writes();
        let files_read = || store.staging_file_reads();
        let discover = |urls: Vec<NewUrl>| -> Vec<WriteOp> {
            urls.into_iter().map(WriteOp::Discover).collect()
        };
        let stored = |applied: Vec<Applied>| -> Vec<bool> {
            (applied.into_iter())
                .map(|applied| matches!(applied, Applied::Discovered { stored: true }))
                .collect()
        };
        assert!(
            store
                .insert_if_absent(&new_urls(0..50))
                .unwrap()
                .iter()
                .all(|s| *s)
        );
        assert!(store.apply_held().unwrap());
        assert!(
            store.held.read().snapshot.is_some(),
            "groups read the files"
        );

        let read = files_read();
        let ops = discover(new_urls(100..120));
        let staged = store.stage_knowing(&ops, &[true; 20]).unwrap();
        assert_eq!(stored(store.finish(staged).unwrap()), [true; 20]);
        assert_eq!(files_read(), read, "no key said new was looked up");

        let ops = discover(new_urls(120..130));
        let staged = store.stage_knowing(&ops, &[]).unwrap();
        assert_eq!(stored(store.finish(staged).unwrap()), [true; 10]);
        assert_eq!(files_read(), read + 10, "one lookup a key not said new");

        // Held, not yet written: found there. Twice in a group: once.
        let read = files_read();
        let mut twice = new_urls(110..111);
        twice.extend(new_urls(130..131));
        twice.extend(new_urls(130..131));
        let staged = store.stage_knowing(&discover(twice), &[true; 3]).unwrap();
        assert_eq!(stored(store.finish(staged).unwrap()), [false, true, false]);
        assert_eq!(files_read(), read);
        assert!(store.apply_held().unwrap());
        for url in new_urls(0..50).into_iter().chain(new_urls(100..131)) {
            assert!(
                store.get(0, "c", &url.url).unwrap().is_some(),
                "{}",
                url.url
            );
        }
    }

    /// A URL changed while the applier writes its older state reads as
    /// changed before, during and after that write, from every reader, and
    /// after a reopen.
    #[test]
    fn a_change_made_while_the_older_state_is_written_reads_as_newest() {
        let dir = tempfile::tempdir().unwrap();
        let url = new_urls(0..1).remove(0);
        let completed = WriteOp::Known(crate::store::KnownUrl {
            crawl: "c".into(),
            url: url.url.clone(),
            partition: 0,
            queue_key: None,
            default_queue: url.record.queue_key.clone(),
            due_at: 0,
            metadata: Default::default(),
            now: 2,
            report: None,
        });
        let reads = |store: &Store| {
            let record = store.get(0, "c", &url.url).unwrap().expect("stored");
            let due = store
                .due_entries("c", &url.record.queue_key, None, 10)
                .unwrap();
            let known = store.known_urls([(0, "c", url.url.as_str())]).unwrap();
            (record.due_at, due.urls.len(), known)
        };
        {
            let store = Store::open(dir.path()).unwrap();
            store.hold_writes();
            assert_eq!(
                store.insert_if_absent(std::slice::from_ref(&url)).unwrap(),
                [true]
            );
            assert_eq!(reads(&store), (5, 1, vec![true]));
            let taken = store.take_fresh().expect("the insert is held");
            store.apply(&[completed]).unwrap();
            assert_eq!(reads(&store), (0, 0, vec![true]), "while written");
            store.write_taken(taken).unwrap();
            assert_eq!(reads(&store), (0, 0, vec![true]), "older state written");
            assert!(store.apply_held().unwrap(), "the change is still held");
            assert_eq!(reads(&store), (0, 0, vec![true]), "all written");
            store.checkpoint_held().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(reads(&store), (0, 0, vec![true]), "reopened");
    }

    proptest::proptest! {
        /// The overlay of two layers is the newer one's entries over the
        /// older one's, in key order.
        #[test]
        fn overlay_is_the_newer_layer_over_the_older(
            older in proptest::collection::btree_map(0u8..32, 0u8..4, 0..24),
            newer in proptest::collection::btree_map(0u8..32, 4u8..8, 0..24),
        ) {
            let mut expected = older.clone();
            expected.extend(newer.clone());
            let merged: Vec<(u8, u8)> = overlay(newer.iter(), older.iter())
                .map(|(key, value)| (*key, *value))
                .collect();
            proptest::prop_assert_eq!(merged, expected.into_iter().collect::<Vec<_>>());
        }
    }

    /// What a store holds before writers wait follows the cache budget it
    /// was given, with a floor for tiny ones.
    #[test]
    fn the_held_limit_is_a_third_of_the_memory_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_cache(dir.path(), 1536 << 20).unwrap();
        assert_eq!(store.held_limit(), 512 << 20);
        // The page caches take the same third, the copy being written no
        // more than what was held.
        assert_eq!(store.cache_bytes * 2, 512 << 20);
        drop(store);
        let store = Store::open_with_cache(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.held_limit(), HELD_LIMIT_MIN);
    }
}
