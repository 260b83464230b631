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
//! its removal, with the LSN of the group that wrote it; the held groups'
//! queue count changes; crawl and queue numbers given but not written
//! (module `names`). A group is worked out against what is held over a
//! snapshot of `urls.redb`, so the files need not hold it yet.
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
//! It copies everything held (the groups up to the newest one), writes it
//! to `urls.redb`, then `frontier.redb`, non-durably (the log holds the
//! groups), and drops from memory what no later group has changed since.
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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use redb::ReadableDatabase;

use super::apply::{RecordAccess, RecordKey};
use super::names::GroupNames;
use super::pace::Pace;
use super::{
    APPLIED_LSN_KEY, Applied, META, MainFileChange, SERVING_ORDER, StagedGroup, Store, StoreError,
    URL_RECORDS, URLS_META, WriteOp, open_if_exists,
};
use crate::queue_counts::{GroupCounts, QueueCounts};

/// A `serving_order` key: (queue number, due date, URL hash).
pub(super) type OrderKey = (u32, u64, u64);

/// Bytes (roughly) held since the applier's last copy before a group
/// waits for it to take them: a second or two of ingest at full rate, so a
/// checkpoint of a large store passes without a writer waiting, while
/// what is held (that, and the copy being written) stays a small share of
/// memory and of the log a restart replays.
const HELD_LIMIT: usize = 64 << 20;

/// What a held entry costs beyond its key and value (map node, version).
const ENTRY_OVERHEAD: usize = 64;

/// A key's newest value (`None`: removed), and the group that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Version<V> {
    pub(super) lsn: u64,
    pub(super) value: Option<V>,
}

/// What is held.
#[derive(Debug, Default)]
pub(super) struct Held {
    pub(super) records: BTreeMap<RecordKey, Version<Vec<u8>>>,
    pub(super) order: BTreeMap<OrderKey, Version<u32>>,
    /// Queue count changes of the groups held since the applier's last
    /// copy.
    pub(super) counts: QueueCounts,
    /// The newest group held, and the newest the applier has copied.
    newest: u64,
    copied: u64,
    /// Bytes of what is held, and of what was held since the last copy.
    bytes: usize,
    new_bytes: usize,
}

impl Held {
    fn record_cost(value: Option<&Vec<u8>>) -> usize {
        ENTRY_OVERHEAD + 16 + value.map_or(0, Vec::len)
    }

    fn order_cost() -> usize {
        ENTRY_OVERHEAD + 24
    }
}

/// Held writes and what coordinates them.
#[derive(Debug, Default)]
pub(super) struct HeldWrites {
    pub(super) state: RwLock<Held>,
    /// Wakes the applier (something to write) and writers waiting for room.
    signal: Mutex<()>,
    changed: Condvar,
    /// Whether groups are held: an applier runs.
    on: AtomicBool,
    /// Held by whoever writes what is held to the files (the applier, or a
    /// drain), and by a reopening of the files.
    pub(super) applying: Mutex<()>,
    /// The applier's rate, and when the next group may go.
    pace: Mutex<Pace>,
}

impl HeldWrites {
    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, Held> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, Held> {
        self.state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn lock_applying(&self) -> std::sync::MutexGuard<'_, ()> {
        self.applying
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self) {
        let _signal = self
            .signal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.changed.notify_all();
    }

    fn wait(&self, until: impl Fn() -> bool, timeout: Duration) {
        let signal = self
            .signal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !until() {
            let _ = self.changed.wait_timeout(signal, timeout);
        }
    }
}

type RecordsReadTable = redb::ReadOnlyTable<RecordKey, &'static [u8]>;

/// What is held of a range of `url_records` keys (`None`: removed).
pub(super) type HeldRecords = Vec<(RecordKey, Option<Vec<u8>>)>;

/// What is held of a range of `serving_order` keys (`None`: removed).
pub(super) type HeldOrder = Vec<(OrderKey, Option<u32>)>;

/// URL records as a group held in memory sees them: its own writes, then
/// what is held, then `urls.redb`.
struct HeldView<'h, 't> {
    held: &'h BTreeMap<RecordKey, Version<Vec<u8>>>,
    table: Option<&'t RecordsReadTable>,
    own: BTreeMap<RecordKey, Vec<u8>>,
}

impl RecordAccess for HeldView<'_, '_> {
    fn get(&self, key: RecordKey) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(value) = self.own.get(&key) {
            return Ok(Some(value.clone()));
        }
        if let Some(version) = self.held.get(&key) {
            return Ok(version.value.clone());
        }
        match self.table {
            Some(table) => Ok(table.get(key)?.map(|value| value.value().to_vec())),
            None => Ok(None),
        }
    }

    fn insert(&mut self, key: RecordKey, value: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let previous = self.get(key)?;
        self.own.insert(key, value.to_vec());
        Ok(previous)
    }
}

/// Entries of a copy from which its two files are written on two threads.
const PARALLEL_COPY_MIN: usize = 256;

/// A copy of what is held, for the applier to write.
struct Copied {
    records: Vec<(RecordKey, Version<Vec<u8>>)>,
    order: Vec<(OrderKey, Version<u32>)>,
    newest: u64,
}

impl Store {
    /// Holds the groups staged from now on in memory, for an applier to
    /// write ([`Self::apply_held`], [`Self::checkpoint_held_if_due`]); the
    /// caller runs one until the store is dropped.
    pub fn hold_writes(&self) {
        self.held.on.store(true, Ordering::Release);
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
    pub(super) fn stage_held(&self, ops: &[WriteOp]) -> Result<StagedGroup, StoreError> {
        self.wait_for_room()?;
        let mut writer = self.lock_writer();
        let wal = &mut writer.wal;
        let (lsn, record_start) = self.log_group(wal, ops)?;
        match self.work_out_held(ops) {
            Ok((results, records, changes, counts)) => {
                self.hold(lsn, records, changes, counts);
                wal.set_last_lsn(lsn);
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
        loop {
            if self.held.read().new_bytes < HELD_LIMIT {
                return Ok(());
            }
            self.check_poisoned()?;
            self.held.wait(
                || self.held.read().new_bytes < HELD_LIMIT,
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
            let held = self.held.read();
            let files = self.files()?;
            // Under the held lock: whatever the applier dropped from
            // memory, this snapshot holds.
            let read = files.urls_db.begin_read()?;
            let table = open_if_exists(&read, URL_RECORDS)?;
            let mut view = HeldView {
                held: &held.records,
                table: table.as_ref(),
                own: BTreeMap::new(),
            };
            let mut names = GroupNames::deferred(&self.names);
            let (results, changes, counts) =
                Self::run_ops(&mut view, &mut names, &keys, ops, |_, _, _, _| {
                    Err(StoreError::Halted(
                        "a deletion reached a group held in memory".into(),
                    ))
                })?;
            Ok((results, view.own, changes, counts))
        })();
        if worked.is_err() {
            self.names
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .roll_back(mark);
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
            let new_before = held.new_bytes;
            for (key, value) in records {
                let added = Held::record_cost(Some(&value));
                let version = Version {
                    lsn,
                    value: Some(value),
                };
                if let Some(old) = held.records.insert(key, version) {
                    held.bytes = held
                        .bytes
                        .saturating_sub(Held::record_cost(old.value.as_ref()));
                }
                held.bytes += added;
                held.new_bytes += added;
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
                if held.order.insert(key, Version { lsn, value }).is_none() {
                    held.bytes += Held::order_cost();
                }
                held.new_bytes += Held::order_cost();
            }
            held.counts.absorb(counts);
            held.newest = lsn;
            let cost = held.new_bytes - new_before;
            self.held
                .lock_pace()
                .held(cost, held.new_bytes, HELD_LIMIT, Instant::now());
        }
        self.held.notify();
    }

    /// The applier's step: writes what is held to both files (non-durably:
    /// the log holds it) and drops from memory what no group has changed
    /// since. Answers whether there was anything to write.
    pub fn apply_held(&self) -> Result<bool, StoreError> {
        let _applying = self.held.lock_applying();
        self.check_poisoned()?;
        let (copied, copied_bytes, names_upto) = {
            let mut held = self.held.write();
            if held.newest == held.copied {
                return Ok(false);
            }
            let copied_bytes = held.new_bytes;
            let counts = std::mem::take(&mut held.counts);
            self.lock_counts().absorb(GroupCounts {
                removed: Vec::new(),
                changes: counts,
            });
            held.copied = held.newest;
            held.new_bytes = 0;
            let copied = Copied {
                records: held.records.iter().map(|(k, v)| (*k, v.clone())).collect(),
                order: held.order.iter().map(|(k, v)| (*k, v.clone())).collect(),
                newest: held.newest,
            };
            (copied, copied_bytes, self.read_names().mark())
        };
        let started = Instant::now();
        let written = self.write_copied(&copied, names_upto);
        if let Err(error) = &written {
            self.note_failure(error);
        }
        written?;
        self.held
            .lock_pace()
            .copied(copied_bytes, started.elapsed());
        {
            let mut held = self.held.write();
            for (key, version) in &copied.records {
                if held.records.get(key) == Some(version) {
                    held.records.remove(key);
                    held.bytes = held
                        .bytes
                        .saturating_sub(Held::record_cost(version.value.as_ref()));
                }
            }
            for (key, version) in &copied.order {
                if held.order.get(key) == Some(version) {
                    held.order.remove(key);
                    held.bytes = held.bytes.saturating_sub(Held::order_cost());
                }
            }
            metrics::gauge!("frontier_held_bytes").set(held.bytes as f64);
        }
        self.held.notify();
        Ok(true)
    }

    /// Writes a copy of what is held to both files. A large copy writes
    /// each file on a thread of its own: redb runs one write transaction
    /// per file, and each file's B-tree work is about half of a copy's. A
    /// small one (a crawl's few writes a page) costs less than starting a
    /// thread, and is written on this one.
    fn write_copied(
        &self,
        copied: &Copied,
        names_upto: super::names::NamesMark,
    ) -> Result<(), StoreError> {
        let files = self.files()?;
        let new_names = self.read_names().unpersisted(names_upto);
        let (records, order) = if copied.records.len() + copied.order.len() < PARALLEL_COPY_MIN {
            (
                Self::write_records(&files.urls_db, copied, &new_names),
                Self::write_order(&files.db, copied),
            )
        } else {
            std::thread::scope(|scope| {
                let order = scope.spawn(|| Self::write_order(&files.db, copied));
                let records = Self::write_records(&files.urls_db, copied, &new_names);
                let order = order
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (records, order)
            })
        };
        records?;
        self.names
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .persisted_up_to(names_upto);
        order?;
        drop(files);
        let mut main_file = self.lock_main_file();
        main_file.lsn = copied.newest;
        self.main_file_applied.notify_all();
        Ok(())
    }

    /// The `url_records` part of a copy, and the names it uses, to
    /// `urls.redb`.
    fn write_records(
        urls_db: &redb::Database,
        copied: &Copied,
        (crawls, queues): &super::names::NewNames,
    ) -> Result<(), StoreError> {
        let mut write = urls_db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        {
            let mut records = write.open_table(URL_RECORDS)?;
            for (key, version) in &copied.records {
                match &version.value {
                    Some(value) => {
                        records.insert(*key, value.as_slice())?;
                    }
                    None => {
                        records.remove(*key)?;
                    }
                }
            }
            let mut crawl_names = write.open_table(super::names::CRAWL_NAMES)?;
            for (number, name) in crawls {
                crawl_names.insert(*number, &**name)?;
            }
            let mut queue_names = write.open_table(super::names::QUEUE_NAMES)?;
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

    /// The `serving_order` part of a copy, to `frontier.redb`.
    fn write_order(db: &redb::Database, copied: &Copied) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        {
            let mut order = write.open_table(SERVING_ORDER)?;
            for (key, version) in &copied.order {
                match version.value {
                    Some(partition) => {
                        order.insert(*key, partition)?;
                    }
                    None => {
                        order.remove(*key)?;
                    }
                }
            }
            write
                .open_table(META)?
                .insert(APPLIED_LSN_KEY, copied.newest)?;
        }
        write.commit()?;
        Ok(())
    }

    /// Writes everything held to the files; the caller stages nothing
    /// meanwhile.
    pub(super) fn drain_held(&self) -> Result<(), StoreError> {
        while self.apply_held()? {}
        Ok(())
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
        let applying = self.held.lock_applying();
        self.check_poisoned()?;
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
        // Let go before the writer's lock is taken: `checkpoint` takes the
        // two the other way round.
        drop(applying);
        let data_dir = self.data_dir().to_owned();
        let restarted = self.lock_writer().wal.restart_keeping(&data_dir, upto);
        if let Err(error) = &restarted {
            tracing::warn!(%error, "the write-ahead log could not start a new pass; it goes on growing");
        }
        let took = started.elapsed();
        self.held.lock_pace().checkpointed(took);
        metrics::histogram!("frontier_checkpoint_seconds").record(took.as_secs_f64());
        tracing::debug!(lsn = upto, seconds = took.as_secs_f64(), "checkpoint");
        Ok(())
    }

    /// What is held of `url_records` keys in `range`, oldest key first,
    /// and a snapshot of `urls.redb` that holds whatever is no longer held.
    pub(super) fn held_records_in(
        &self,
        range: impl std::ops::RangeBounds<RecordKey>,
    ) -> Result<(HeldRecords, redb::ReadTransaction), StoreError> {
        let held = self.held.read();
        let copy = held
            .records
            .range(range)
            .map(|(key, version)| (*key, version.value.clone()))
            .collect();
        let read = self.files()?.urls_db.begin_read()?;
        Ok((copy, read))
    }

    /// What is held of `serving_order` keys in `range`, and a snapshot of
    /// `frontier.redb` that holds whatever is no longer held.
    pub(super) fn held_order_in(
        &self,
        range: impl std::ops::RangeBounds<OrderKey>,
    ) -> Result<(HeldOrder, redb::ReadTransaction), StoreError> {
        let held = self.held.read();
        let copy = held
            .order
            .range(range)
            .map(|(key, version)| (*key, version.value))
            .collect();
        let read = self.files()?.db.begin_read()?;
        Ok((copy, read))
    }
}

/// A table's entries merged with what is held of them, in key order: a
/// held value replaces the table's, a held removal drops it.
pub(super) struct Merged<K, V, I: Iterator> {
    held: std::iter::Peekable<std::vec::IntoIter<(K, Option<V>)>>,
    stored: std::iter::Peekable<I>,
}

impl<K, V, I> Merged<K, V, I>
where
    I: Iterator<Item = Result<(K, V), StoreError>>,
{
    pub(super) fn new(held: Vec<(K, Option<V>)>, stored: I) -> Self {
        Self {
            held: held.into_iter().peekable(),
            stored: stored.peekable(),
        }
    }
}

impl<K: Ord + Copy, V, I> Iterator for Merged<K, V, I>
where
    I: Iterator<Item = Result<(K, V), StoreError>>,
{
    type Item = Result<(K, V), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let stored_key = match self.stored.peek() {
                Some(Ok((key, _))) => Some(*key),
                Some(Err(_)) => return self.stored.next(),
                None => None,
            };
            let held_key = self.held.peek().map(|(key, _)| *key);
            match (held_key, stored_key) {
                (None, None) => return None,
                (Some(held), stored) if stored.is_none_or(|stored| held <= stored) => {
                    if stored == Some(held) {
                        self.stored.next();
                    }
                    let (key, value) = self.held.next()?;
                    match value {
                        Some(value) => return Some(Ok((key, value))),
                        None => continue,
                    }
                }
                _ => return self.stored.next(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewUrl, UrlRecord};
    use redb::ReadableTableMetadata;

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
                let records = read.open_table(URL_RECORDS).unwrap().len().unwrap();
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

    #[test]
    fn held_entries_replace_and_remove_stored_ones_in_key_order() {
        let stored = vec![(1, "a"), (3, "c"), (5, "e"), (7, "g")];
        let held = vec![
            (0, Some("z")),
            (3, Some("C")),
            (5, None),
            (6, Some("f")),
            (9, None),
        ];
        let merged: Vec<(i32, &str)> = Merged::new(held, stored.into_iter().map(Ok))
            .collect::<Result<_, StoreError>>()
            .unwrap();
        assert_eq!(merged, [(0, "z"), (1, "a"), (3, "C"), (6, "f"), (7, "g")]);
    }
}
