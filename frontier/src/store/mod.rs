//! The redb store: two files in the data directory, opened by one server
//! at a time, with a schema version checked before anything else is read.
//!
//! # Layout
//!
//! - this file: the [`Store`], its locks, the group's two stages and
//!   checkpoints;
//! - `schema`: every table and `meta` key of both files;
//! - `files`: the two redb files and their poisoning by a failed write;
//!   `main_file`: `frontier.redb`'s transactions and the second stage's
//!   progress;
//! - `locks`: the store's locks and the one order they are taken in,
//!   checked in debug builds;
//! - `types`: what each write of a group did, the queue record (the
//!   writes themselves are [`crate::write_ops`]);
//! - `queue_counts`: queue count changes summed in memory and written by
//!   the next checkpoint;
//! - `error`: [`StoreError`];
//! - `apply`: a group applied to `urls.redb`, and the changes worked out
//!   from it applied to `frontier.redb`;
//! - `read`: reads of the tables; `settings`: writes outside groups;
//! - `names`: the numbers of crawls and queues;
//! - `compact`: the clean close, which compacts the files while small;
//! - `held`: writes held in memory between a group's answer and the
//!   files, and the applier that writes them; `merged`: reads that merge
//!   what is held over a snapshot of the files, with `merge`'s iterator;
//!   `record_access`: the trait a group's first stage reaches records
//!   through, and `held_view` what it sees through it (its own writes over
//!   what is held, over the records refills kept in `recent_reads`, over
//!   the file); `pace`: groups paced to the
//!   applier's rate as what is held nears its limit; `record_map`: the
//!   `url_records` writes a layer holds; `records`: `url_records` as a
//!   base table and the recent records over it; `catch_up`:
//!   `frontier.redb` brought up to `urls.redb` after a failed write;
//! - `open`: opening, creation, the log's replay; `legacy`: the URL tables
//!   of schemas 1 to 5 and their conversion;
//! - `recover`: the files reopened in place after a failed write;
//! - [`inspect`]: the files read without changing them, for the repair
//!   tools.
//!
//! # Each URL once
//!
//! A URL is kept in one place: its entry in `url_records`, under the
//! 64-bit hash of its canonical form (`UrlHasher`, seeded with the store
//! ID), with its record. The serving order names it by queue number and
//! hash, and a serve reads the URL from its entry. Crawl IDs and queue keys
//! are numbers in keys and entries (module `names`), and an entry leaves
//! out the scheme and queue key its URL starts with (by default its host)
//! and writes its due date as a distance from its creation date (a byte
//! for a URL due when found). Schema 6 wrote entries of version 3, with the
//! due date whole: they are read as they are and written in version 4 when
//! their URL changes. What a store of schema 5 held in two keys of about 90 bytes each, the
//! URL and its queue key each twice, is now one entry of about half that
//! and a 24-byte serving key (BENCHMARKS.md has the figures).
//!
//! Dedup stays exact: a value holds the entries of every URL of its crawl
//! and partition with that hash, and a lookup compares URLs. Two such URLs
//! in one queue with one due date share a serving entry, which goes when
//! neither needs it; a serve reads every URL of the entry. The order of a
//! queue's URLs of one due date is the order of their hashes: any order
//! meets the API, which orders by date only.
//!
//! # Why two files, and how they agree
//!
//! redb runs one write transaction per file at a time, and a group's
//! B-tree work (one insert into `url_records` and one into `serving_order`
//! per new URL) is what limits ingest. With the two tables in two files,
//! they are written at once, on two threads. Groups are logged first
//! ([`crate::wal`]): the log, synced once per group, makes a group durable,
//! and the files are committed non-durably. Each file applies a group's
//! writes in key order, not arrival order (`apply_order`): the keys of a
//! group are spread over the whole tree, and sorted descents share their
//! cached pages.
//!
//! Where the committer runs ([`crate::commit`]), writes are held in memory
//! (module `held`): [`Store::stage`] logs a group and works it out against
//! what is held over `urls.redb`, the group is answered, and the applier
//! writes what is held to both files and checkpoints them while groups go
//! on. Elsewhere (tests, the repair tools, the replay at open) a group is
//! applied to the files before it is answered: [`Store::stage`] logs it and
//! applies it to `urls.redb`, working out from the records it finds the
//! changes `frontier.redb` follows with, and [`Store::finish`] applies
//! those (on another thread, while the next group is staged).
//!
//! A checkpoint commits both files durably, `frontier.redb` first, at the
//! last group both hold, then the log starts a new pass, keeping the
//! groups logged after that one. Settings writes commit `frontier.redb`
//! durably between checkpoints. So on disk `frontier.redb` is never behind
//! `urls.redb` (but for a failed write: module `catch_up`), and after a
//! kill the replay applies each logged group to `urls.redb` if that file
//! lacks it, and its changes to `frontier.redb` only if that file lacks
//! them too: the changes are worked out from `urls.redb` as it was just
//! before the group, which is how the replay finds it. Replaying the other
//! way round could not be done, which is why the order matters.
//!
//! A queue's counts change in memory and reach the `queues` table at
//! checkpoints (module `queue_counts`); after a kill the replay adds those
//! of the groups after `counts_lsn`. Readers get the table and the held
//! changes together ([`Store::for_each_queue`]).
//!
//! # Opening, and older versions
//!
//! Module `open`: an existing store must have all three files, not empty,
//! of one store ID, and a log that holds every record from the one after
//! `urls.redb`'s up to the one `frontier.redb` holds; anything else is
//! refused with an error naming the file, and nothing is removed or
//! recreated. `frontier verify` and `frontier salvage` ([`crate::repair`])
//! are the operator's tools for a refused store.
//!
//! Versions 6 and 7 are read as they are and marked 8 in both files
//! (`urls.redb` first) before anything is written: 6 wrote entries of
//! version 3, 7 had no `url_records_recent`, which reads as empty.
//! Version 1 had no log, version 2 a log; both kept every table in
//! `frontier.redb`. Opening one moves `urls` into `urls.redb` (made durable
//! first), then drops it from `frontier.redb` and marks version 3 in one
//! durable commit, so a crash in between leaves the old store, and the move
//! runs again. Version 3 had no store ID and a log of format 1: its log is
//! replayed, then the store gets its ID and a new log, and the version mark
//! comes last. A file written by a newer version of the schema, a file that
//! is not a frontier store and a corrupt file are refused the same way.
//! Versions 3 to 5 kept each URL in two keys, `urls` (partition, crawl
//! ID, URL) → record and `due` (crawl ID, queue key, due date, URL) →
//! partition, with records of version 1 (schema 4 and older) or 2; module
//! `legacy` converts them to this schema before their log is replayed,
//! one durable commit per file, so that a conversion cut short is finished
//! by the next open.

mod apply;
mod catch_up;
#[cfg(test)]
mod collisions;
mod compact;
mod error;
mod files;
mod held;
mod held_view;
pub mod inspect;
mod legacy;
mod locks;
mod main_file;
mod merge;
mod merged;
mod names;
mod open;
mod pace;
mod put_off;
mod queue_counts;
mod read;
mod recent_reads;
mod record_access;
mod record_map;
mod records;
mod recover;
mod schema;
mod settings;
mod types;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[cfg(test)]
use redb::ReadableDatabase;
use redb::{Database, ReadableTable};

pub use self::error::StoreError;
use self::files::{Files, FilesGuard, StoreFiles};
use self::locks::{OrderedMutex, OrderedMutexGuard, OrderedRwLock};
use self::main_file::{MainFile, MainFileProgress};
use self::names::Names;
pub use self::open::{OLDEST_SCHEMA_READ_AS_IS, StoreOptions};
use self::queue_counts::{GroupCounts, QueueCounts};
pub use self::read::{DueCounts, DuePage, DueUrl, PartitionUrls};
use self::schema::{
    APPLIED_LSN_KEY, COUNTS_LSN_KEY, CRAWL_REVISIT, CRAWL_SETTINGS, META, QUEUES,
    SCHEMA_VERSION_KEY, SEED_HOSTS, SERVING_ORDER, URLS_META,
};
pub use self::types::{Applied, PreviousPlace, QueueRecord, Removed, RemovedFromQueue};
use crate::record::UrlRecord;
use crate::wal::Wal;
pub use crate::write_ops::{Deletion, KnownUrl, NewUrl, WriteOp};

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 8;

/// The store's memory unless configured otherwise ([`StoreOptions`]): a
/// half-gigabyte third for each of its uses.
pub const DEFAULT_CACHE_BYTES: usize = 1536 << 20;

/// The store's main file name inside the data directory.
pub const FILE_NAME: &str = "frontier.redb";

/// The file of the `urls` table, beside [`FILE_NAME`].
pub const URLS_FILE_NAME: &str = "urls.redb";

/// The second parts of a (crawl, name) table's keys for one crawl: its
/// queue keys, or its seed hosts.
fn names_under<V: redb::Value + 'static>(
    table: &redb::Table<'_, (&str, &str), V>,
    crawl: &str,
) -> Result<Vec<String>, StoreError> {
    let mut names = Vec::new();
    for entry in table.range((crawl, "")..)? {
        let (key, _) = entry?;
        let (entry_crawl, name) = key.value();
        if entry_crawl != crawl {
            break;
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

/// Reads a stored record; damage is an error naming the URL.
fn decode_record(crawl: &str, url: &str, bytes: &[u8]) -> Result<UrlRecord, StoreError> {
    UrlRecord::decode(bytes).map_err(|source| StoreError::CorruptRecord {
        crawl: crawl.to_owned(),
        url: url.to_owned(),
        source,
    })
}

/// Reads a stored queue record; damage is an error naming the queue.
fn decode_queue(crawl: &str, queue: &str, bytes: &[u8]) -> Result<QueueRecord, StoreError> {
    QueueRecord::decode(bytes).map_err(|source| StoreError::CorruptRecord {
        crawl: crawl.to_owned(),
        url: format!("queue {queue}"),
        source,
    })
}

/// An open store.
///
/// # Locks
///
/// Each part of the store owns its lock: the log and the urls file
/// (`writer`), the main file's progress (`main_file`), the files
/// themselves (`files`), the numbers (`names`), the counts
/// (`applied_counts`), the held layer's own (module `held`). A thread takes
/// them only in the order of `locks::Rank`: checkpointing, writer,
/// applying, signal, main file, held, files, names, counts, pace, poison.
/// Debug builds check every acquisition against it and panic, naming both
/// locks, at the first out of order.
pub struct Store {
    /// The two redb files and whether a failed write left them unusable
    /// (module `files`).
    files: StoreFiles,
    /// redb's page cache per file, for a reopening.
    cache_bytes: usize,
    path: PathBuf,
    /// Writes are refused while less is free (see [`StoreOptions`]).
    min_free_bytes: u64,
    /// Groups are logged and applied to `urls.redb` under this lock, so the
    /// log's records and the urls file's transactions happen in one order.
    writer: OrderedMutex<Writer>,
    /// Transactions on `frontier.redb` and the second stage's progress
    /// (module `main_file`).
    main_file: MainFile,
    /// The numbers of crawls and queues (module `names`): given by first
    /// stages, read by everyone.
    names: OrderedRwLock<Names>,
    hasher: UrlHasher,
    /// Queue count changes of the groups in the files since the last
    /// checkpoint, not yet in the `queues` table (module `queue_counts`).
    applied_counts: OrderedMutex<QueueCounts>,
    /// Groups answered but not yet in the files (module `held`).
    held: held::HeldWrites,
    /// Records read for refills, for the reports that follow (module
    /// `recent_reads`).
    recent_reads: recent_reads::RecentReads,
}

/// What writes share under the store's lock.
struct Writer {
    wal: Wal,
}

/// A group's record in the log, and where logging it took its time (a
/// slow group's log line tells the checks, the write and the sync apart).
struct Logged {
    lsn: u64,
    record_start: u64,
    checking: Duration,
    appending: Duration,
    syncing: Duration,
}

/// A group applied to `urls.redb` (the first stage of [`Store::apply`]);
/// [`Store::finish`] applies the rest to `frontier.redb`.
#[derive(Debug)]
#[must_use = "a staged group is acknowledged only once finished"]
pub struct StagedGroup {
    lsn: u64,
    /// `None`: the group was a checkpoint, applied in full already.
    changes: Option<Vec<MainFileChange>>,
    results: Vec<Applied>,
}

/// A change a group makes to `frontier.redb`, worked out in the first stage
/// from what `urls.redb` held.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MainFileChange {
    /// A `serving_order` entry: (queue number, due date, URL hash) →
    /// partition.
    Insert {
        queue: u32,
        due_at: u64,
        hash: u64,
        partition: u32,
    },
    Remove {
        queue: u32,
        due_at: u64,
        hash: u64,
    },
    /// One queue's record goes, or (`None`) every queue of the crawl with
    /// its seed hosts and default delay.
    RemoveQueues {
        crawl: String,
        queue: Option<String>,
    },
}

/// The hash of a URL in the keys of `url_records` and `serving_order`:
/// xxh3 seeded with the store's ID, so that no site can offer URLs made to
/// collide in every store (a collision is exact, but costs the URLs of a
/// hash a longer value).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UrlHasher {
    seed: u64,
    /// Every bit, but in tests that make collisions common.
    mask: u64,
}

impl UrlHasher {
    pub(crate) fn new(store_id: u64) -> Self {
        Self {
            seed: store_id,
            mask: u64::MAX,
        }
    }

    /// The hash of a canonical URL.
    pub(crate) fn hash(&self, url: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(url.as_bytes(), self.seed) & self.mask
    }
}

/// What turns a URL into its keys: the store's names and its hash.
pub(super) struct UrlKeys<'a> {
    names: &'a OrderedRwLock<Names>,
    hasher: UrlHasher,
}

/// The order to apply a group's writes in: each run of writes between two
/// barriers (a `None` key) sorted by key, stably, barriers in place.
///
/// Why: a group's keys are spread over the whole B-tree, and descending it
/// in key order keeps the branch pages of one descent hot for the next,
/// where random order misses the caches on nearly every level. Writes to
/// different keys commute, stability keeps the order of writes to one key
/// (a URL discovered twice in a group is stored by the first), and a
/// barrier (a deletion of many keys) keeps its place among the others.
fn apply_order<'a, T, K: Ord>(items: &'a [T], key_of: impl Fn(&'a T) -> Option<K>) -> Vec<usize> {
    let keys: Vec<Option<K>> = items.iter().map(key_of).collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    let mut run_start = 0;
    for end in 0..=keys.len() {
        if end == keys.len() || keys[end].is_none() {
            order[run_start..end].sort_by(|&a, &b| keys[a].cmp(&keys[b]));
            run_start = end + 1;
        }
    }
    order
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

impl Store {
    fn lock_writer(&self) -> OrderedMutexGuard<'_, Writer> {
        self.writer.lock()
    }

    fn lock_counts(&self) -> OrderedMutexGuard<'_, QueueCounts> {
        self.applied_counts.lock()
    }

    fn lock_main_file(&self) -> OrderedMutexGuard<'_, MainFileProgress> {
        self.main_file.lock()
    }

    /// A group's first step either way it is applied: the store is checked
    /// to take writes, and the group appended to the log and synced.
    /// Answers its LSN, where its record starts and where its time went.
    fn log_group(&self, wal: &mut Wal, ops: &[WriteOp]) -> Result<Logged, StoreError> {
        let started = Instant::now();
        wal.check_writable()?;
        Self::check_main_file(&self.lock_main_file())?;
        self.check_poisoned()?;
        self.check_space()?;
        let lsn = wal
            .last_lsn()
            .checked_add(1)
            .ok_or_else(|| StoreError::Halted("the log's sequence numbers are used up".into()))?;
        let record_start = wal.end();
        let checked = started.elapsed();
        wal.append(lsn, ops)?;
        let appended = started.elapsed();
        if let Err(error) = wal.sync() {
            wal.unappend(record_start);
            return Err(error.into());
        }
        Ok(Logged {
            lsn,
            record_start,
            checking: checked,
            appending: appended - checked,
            syncing: started.elapsed() - appended,
        })
    }

    /// Takes back the record of a group that failed before it took effect.
    fn take_back(&self, wal: &mut Wal, record_start: u64, error: &StoreError) {
        wal.unappend(record_start);
        let _ = wal.sync();
        self.note_failure(error);
    }

    /// Fails while the store's file system has less than the configured
    /// room left, counting what is already promised to the disk: the
    /// writes held in memory, which the applier will write to redb (twice
    /// their bytes: a copy-on-write B-tree holds a page's old and new
    /// copies until its commit). The log's own growth checks the floor as
    /// it allocates (`Wal::keep_free`). A file system that cannot say is
    /// taken to have room: the check only keeps redb away from a full
    /// disk, it is not what keeps the store consistent.
    fn check_space(&self) -> Result<(), StoreError> {
        if self.min_free_bytes == 0 {
            return Ok(());
        }
        let Some(available) = crate::wal::available_bytes(self.data_dir()) else {
            return Ok(());
        };
        let promised = self.held.unwritten_bytes().saturating_mul(2);
        let needed = self.min_free_bytes.saturating_add(promised);
        if available >= needed {
            return Ok(());
        }
        Err(StoreError::DiskFull {
            path: self.data_dir().to_owned(),
            available_mb: available >> 20,
            needed_mb: needed.div_ceil(1 << 20),
        })
    }

    /// Whether writes are taken now: `Err` says why not (the disk is full,
    /// or a failure halted writes until a restart).
    pub fn write_state(&self) -> Result<(), StoreError> {
        self.check_poisoned()?;
        {
            let writer = self.lock_writer();
            writer.wal.check_writable()?;
            writer.wal.check_room()?;
        }
        Self::check_main_file(&self.lock_main_file())?;
        self.check_space()
    }

    /// The files, for one call.
    fn files(&self) -> Result<FilesGuard<'_>, StoreError> {
        self.files.get()
    }

    /// Fails while a failed write keeps the files unusable.
    fn check_poisoned(&self) -> Result<(), StoreError> {
        self.files.check_poisoned()
    }

    /// Records that a failed write left the files unusable until reopened.
    fn note_failure(&self, error: &StoreError) {
        self.files.note_failure(error);
    }

    /// Fails once a second stage has failed.
    fn check_main_file(main_file: &MainFileProgress) -> Result<(), StoreError> {
        main_file.check()
    }

    /// Runs `change` in a write transaction of `frontier.redb` committed
    /// durably. It holds settings, not URLs: `urls.redb` is made durable by
    /// checkpoints only, so `frontier.redb` is never behind it on disk.
    fn write_durably<T>(
        &self,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let writer = self.lock_writer();
        writer.wal.check_writable()?;
        let main_file = self.lock_main_file();
        Self::check_main_file(&main_file)?;
        self.check_poisoned()?;
        self.check_space()?;
        let written = self.files().and_then(|files| {
            let mut write = files.db.begin_write()?;
            write.set_quick_repair(true);
            let out = change(&write)?;
            write.commit()?;
            Ok(out)
        });
        if let Err(error) = &written {
            self.note_failure(error);
        }
        written
    }

    /// Commits both files durably, `frontier.redb` first (with the held
    /// queue counts, as of `lsn`), so that on disk it is never behind
    /// `urls.redb`. Both must hold every group up to `lsn`.
    fn make_durable(
        db: &Database,
        urls_db: &Database,
        counts: &QueueCounts,
        lsn: u64,
    ) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_quick_repair(true);
        Self::write_queue_counts(&write, counts)?;
        {
            let mut meta = write.open_table(META)?;
            meta.insert(APPLIED_LSN_KEY, lsn)?;
            meta.insert(COUNTS_LSN_KEY, lsn)?;
        }
        write.commit()?;
        let mut write = urls_db.begin_write()?;
        write.set_quick_repair(true);
        write.open_table(URLS_META)?.insert(APPLIED_LSN_KEY, lsn)?;
        write.commit()?;
        Ok(())
    }

    /// Adds held queue count changes to the `queues` table.
    fn write_queue_counts(
        write: &redb::WriteTransaction,
        counts: &QueueCounts,
    ) -> Result<(), StoreError> {
        if counts.is_empty() {
            return Ok(());
        }
        let mut queues = write.open_table(QUEUES)?;
        for (crawl, queue, delta) in counts.iter() {
            let key = (crawl, queue);
            let mut record = match queues.get(key)? {
                Some(bytes) => decode_queue(crawl, queue, bytes.value())?,
                None => QueueRecord::default(),
            };
            queue_counts::apply(&mut record, delta);
            queues.insert(key, record.encode().as_slice())?;
        }
        Ok(())
    }

    /// Waits until `frontier.redb` holds every group up to `lsn`.
    fn wait_for_main_file(&self, lsn: u64) -> Result<(), StoreError> {
        self.main_file.wait_for(lsn)
    }

    /// The writer lock, at a moment when `frontier.redb` holds every group
    /// staged. Never waits while holding the lock: a second stage may be
    /// waiting in the commit hook for a lock whose holder waits for this one.
    fn lock_drained_writer(&self) -> Result<OrderedMutexGuard<'_, Writer>, StoreError> {
        loop {
            let writer = self.lock_writer();
            writer.wal.check_writable()?;
            let staged = writer.wal.last_lsn();
            {
                let main_file = self.lock_main_file();
                Self::check_main_file(&main_file)?;
                if main_file.lsn >= staged {
                    return Ok(writer);
                }
            }
            drop(writer);
            self.wait_for_main_file(staged)?;
        }
    }

    /// Makes everything applied so far durable in both files and empties
    /// the log (at shutdown; otherwise groups do it every few seconds, see
    /// [`crate::wal::CHECKPOINT_INTERVAL`]). Waits for groups still in
    /// their second stage.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let mut writer = if self.holding() {
            // No group is held after the writer's lock is taken; what is
            // held goes to the files (in held mode no group is between the
            // two files' stages).
            let writer = self.lock_writer();
            self.drain_held()?;
            writer
        } else {
            self.lock_drained_writer()?
        };
        let _applying = self.held.lock_applying();
        let _main_file = self.lock_main_file();
        let files = self.files()?;
        let mut counts = self.lock_counts();
        Self::make_durable(&files.db, &files.urls_db, &counts, writer.wal.last_lsn())?;
        *counts = QueueCounts::default();
        writer.wal.checkpointed();
        Ok(())
    }

    /// The store file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The data directory holding the store file.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Stores every URL its crawl does not know yet, all in one transaction
    /// that is durable when this returns; answers, per URL, whether it was
    /// stored (`false`: already known, also when the same URL came earlier
    /// in `urls`).
    pub fn insert_if_absent(&self, urls: &[NewUrl]) -> Result<Vec<bool>, StoreError> {
        let ops: Vec<WriteOp> = urls.iter().cloned().map(WriteOp::Discover).collect();
        Ok(self
            .apply(&ops)?
            .into_iter()
            .map(|applied| matches!(applied, Applied::Discovered { stored: true }))
            .collect())
    }

    /// Applies writes in order, durable when this returns: URL records in
    /// `urls.redb`, then their `due` entries and queue removals in
    /// `frontier.redb`; queue counts in memory until the next checkpoint
    /// writes them. [`Self::stage`] and [`Self::finish`] in one call.
    pub fn apply(&self, ops: &[WriteOp]) -> Result<Vec<Applied>, StoreError> {
        let staged = self.stage(ops)?;
        self.finish(staged)
    }

    /// The first stage of a group: appended to the write-ahead log and
    /// synced (first, so that whatever a reader can see, a lookup answering
    /// "already known" say, is durable), then held in memory (when writes
    /// are held: module `held`; a group holding a deletion is applied to
    /// both files here) or applied to `urls.redb` with a non-durable commit.
    /// In the latter case, every [`crate::wal::CHECKPOINT_INTERVAL`] the
    /// group is a checkpoint: it waits until the groups before it are
    /// finished, is applied to both files, both are committed durably and
    /// the log emptied.
    ///
    /// Groups are staged by one thread at a time and finished in the order
    /// they were staged; a group's changes to `frontier.redb` are worked out
    /// here from what `urls.redb` held, so the next group can be staged
    /// while this one finishes.
    pub fn stage(&self, ops: &[WriteOp]) -> Result<StagedGroup, StoreError> {
        self.stage_knowing(ops, &[])
    }

    /// [`Self::stage`], told which ops discover a URL whose record key no
    /// URL the store holds has (`new_keys[i]` for `ops[i]`; missing:
    /// not known). Held in memory, such a URL is stored without looking
    /// its key up in `urls.redb`, only in what is held and in the group
    /// (a URL twice in it). A key said new that the store holds would
    /// lose that record: the caller's filters must be certain
    /// ([`crate::commit::KeyFilter`]).
    pub fn stage_knowing(
        &self,
        ops: &[WriteOp],
        new_keys: &[bool],
    ) -> Result<StagedGroup, StoreError> {
        if !self.holding() {
            return self.stage_in_files(ops);
        }
        if !ops.iter().any(|op| matches!(op, WriteOp::Delete(_))) {
            return self.stage_held(ops, new_keys);
        }
        // A deletion ranges over what the files hold: what is held goes to
        // them first, and the group reaches both before it is answered (an
        // applier writing a later group in between would put the files'
        // changes out of order).
        self.drain_held()?;
        let staged = self.stage_in_files(ops)?;
        let lsn = staged.lsn;
        let results = self.finish(staged)?;
        Ok(StagedGroup {
            lsn,
            changes: None,
            results,
        })
    }

    /// [`Self::stage`] with the group applied to `urls.redb` itself.
    fn stage_in_files(&self, ops: &[WriteOp]) -> Result<StagedGroup, StoreError> {
        let checkpoint_due = {
            let writer = self.lock_writer();
            writer.wal.checkpoint_due()
        };
        let checkpoint_started = std::time::Instant::now();
        let mut writer = if checkpoint_due {
            self.lock_drained_writer()?
        } else {
            self.lock_writer()
        };
        let Writer { wal } = &mut *writer;
        let Logged {
            lsn, record_start, ..
        } = self.log_group(wal, ops)?;
        let committed = Self::commit_urls(&self.files()?.urls_db, &self.url_keys(), ops, lsn);
        self.forget_records_snapshot();
        let (results, changes, counts) = match committed {
            Ok(applied) => applied,
            Err(error) => {
                // The group is not in redb: its record goes, so that a
                // replay does not apply it ahead of later groups. If that
                // fails, writes halt and a restart replays it (the caller
                // was told it failed; storing it then is what a retry would
                // have done).
                self.take_back(wal, record_start, &error);
                return Err(error);
            }
        };
        wal.set_last_lsn(lsn);
        if !checkpoint_due {
            self.lock_counts().absorb(counts);
            return Ok(StagedGroup {
                lsn,
                changes: Some(changes),
                results,
            });
        }
        // The main file and the files before the counts: the locks' order.
        let mut main_file = self.lock_main_file();
        let files = match self.files() {
            Ok(files) => files,
            Err(error) => {
                self.lock_counts().absorb(counts);
                return Err(error);
            }
        };
        let mut queue_counts = self.lock_counts();
        queue_counts.absorb(counts);
        if let Err(error) = Self::commit_main_file(&files.db, &changes, lsn) {
            self.note_failure(&error);
            self.halt(&mut main_file, &error, lsn);
            return Err(error);
        }
        // The group is applied and its record synced: it stands whether or
        // not the checkpoint does. A checkpoint that fails keeps the log as
        // it is (it still holds every group since the last one), and the
        // files are reopened and the log replayed once they can be written.
        main_file.lsn = lsn;
        match Self::make_durable(&files.db, &files.urls_db, &queue_counts, lsn) {
            Ok(()) => {
                *queue_counts = QueueCounts::default();
                wal.checkpointed();
                let took = checkpoint_started.elapsed();
                metrics::histogram!("frontier_checkpoint_seconds").record(took.as_secs_f64());
                tracing::debug!(lsn, seconds = took.as_secs_f64(), "checkpoint");
            }
            Err(error) => {
                tracing::warn!(%error, "checkpoint failed; the write-ahead log keeps the groups since the last one");
                self.note_failure(&error);
            }
        }
        Ok(StagedGroup {
            lsn,
            changes: None,
            results,
        })
    }

    /// The second stage of a group: its changes to `frontier.redb`,
    /// committed non-durably (the log holds the group). Groups must be
    /// finished in the order they were staged. A failure halts writes: the
    /// urls file then holds a group the other does not, which a restart's
    /// replay mends.
    pub fn finish(&self, staged: StagedGroup) -> Result<Vec<Applied>, StoreError> {
        let Some(changes) = staged.changes else {
            return Ok(staged.results);
        };
        // The lock is not held during the transaction, so that the next
        // group can be staged meanwhile: redb runs one write transaction of
        // a file at a time, which orders this one and settings writes.
        Self::check_main_file(&self.lock_main_file())?;
        let finished = self
            .files()
            .and_then(|files| Self::commit_main_file(&files.db, &changes, staged.lsn));
        let mut main_file = self.lock_main_file();
        if let Err(error) = finished {
            self.note_failure(&error);
            self.halt(&mut main_file, &error, staged.lsn);
            return Err(error);
        }
        main_file.lsn = staged.lsn;
        self.main_file.applied();
        Ok(staged.results)
    }

    /// Applies a group to `urls.redb` in a non-durable commit: the log
    /// holds the group until a checkpoint. Numbers the group gave are taken
    /// back if it fails.
    fn commit_urls(
        urls_db: &Database,
        keys: &UrlKeys<'_>,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<(Vec<Applied>, Vec<MainFileChange>, GroupCounts), StoreError> {
        let mark = keys.names.read().mark();
        let committed = (|| {
            let mut write = urls_db.begin_write()?;
            write.set_durability(redb::Durability::None)?;
            let applied = Self::apply_urls_in(&write, keys, ops, lsn)?;
            write.commit()?;
            Ok(applied)
        })();
        let mut names = keys.names.write();
        match &committed {
            Ok(_) => {
                let given = names.mark();
                names.persisted_up_to(given);
            }
            Err(_) => names.roll_back(mark),
        }
        committed
    }

    fn url_keys(&self) -> UrlKeys<'_> {
        UrlKeys {
            names: &self.names,
            hasher: self.hasher,
        }
    }

    /// The hash this store keys a URL by, which orders a queue's URLs of
    /// one due date (see [`Self::due_entries`]).
    #[must_use]
    pub fn url_hash(&self, url: &str) -> u64 {
        self.hasher.hash(url)
    }

    /// The store's ID, made at random when the store was created: another
    /// ID in the same data directory is another store.
    #[must_use]
    pub fn store_id(&self) -> u64 {
        self.hasher.seed
    }

    /// Applies a group's changes to `frontier.redb` in a non-durable commit.
    fn commit_main_file(
        db: &Database,
        changes: &[MainFileChange],
        lsn: u64,
    ) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        Self::apply_main_file_in(&write, changes, lsn)?;
        write.commit()?;
        Ok(())
    }

    /// Stops writes after a group's second stage failed (`urls.redb` then
    /// holds a group `frontier.redb` does not), and wakes its waiters.
    fn halt(&self, main_file: &mut MainFileProgress, error: &StoreError, lsn: u64) {
        tracing::error!(%error, lsn, "cannot apply a group to frontier.redb; writes halted until restart");
        main_file.halted.get_or_insert(error.to_string());
        self.main_file.applied();
    }

    /// The last log record `urls.redb` holds.
    #[cfg(test)]
    fn applied_lsn(&self) -> Result<u64, StoreError> {
        schema::urls_lsn(&self.files()?.urls_db.begin_read()?)
    }

    #[cfg(test)]
    fn set_schema_version(&self, version: u64) -> Result<(), StoreError> {
        self.write_durably(|write| {
            write
                .open_table(META)?
                .insert(SCHEMA_VERSION_KEY, version)?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::schema::{DUE, PARTITIONS_KEY, URLS, open_if_exists};
    use super::*;
    use crate::wal::WalError;
    use redb::TableDefinition;

    proptest::proptest! {
        /// The apply order is a permutation that leaves barriers in place,
        /// sorts each run between them, and keeps the order of writes to
        /// one key.
        #[test]
        fn apply_order_sorts_runs_and_keeps_barriers_and_equal_keys(
            keys in proptest::collection::vec(proptest::option::weighted(0.9, 0u8..8), 0..64),
        ) {
            let order = apply_order(&keys, |key| *key);
            let mut seen = order.clone();
            seen.sort_unstable();
            proptest::prop_assert_eq!(seen, (0..keys.len()).collect::<Vec<_>>());
            for (position, &index) in order.iter().enumerate() {
                if keys[index].is_none() || keys[position].is_none() {
                    proptest::prop_assert_eq!(index, position);
                }
            }
            for pair in order.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                if let (Some(ka), Some(kb)) = (keys[a], keys[b]) {
                    proptest::prop_assert!(ka < kb || (ka == kb && a < b));
                }
            }
        }
    }

    #[test]
    fn fresh_store_records_its_schema() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let store = Store::open(&nested).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.path(), nested.join(FILE_NAME));
        drop(store);
        // Reopening finds it.
        assert_eq!(
            Store::open(&nested).unwrap().schema_version().unwrap(),
            SCHEMA_VERSION
        );
    }

    pub(super) fn discovered(url: &str) -> WriteOp {
        WriteOp::Discover(NewUrl {
            crawl: "c".into(),
            url: url.into(),
            partition: 1,
            maybe_known: false,
            record: UrlRecord {
                created_at: 5,
                due_at: 10,
                queue_key: "q".into(),
                ..UrlRecord::default()
            },
        })
    }

    /// Writes log records straight to the log, as a server killed after
    /// syncing them but before its checkpoint would have left them.
    /// Appends records to a closed store's log where the store would
    /// write them next (a clean close checkpoints: from the first slot).
    pub(super) fn leave_in_log(dir: &Path, records: &[(u64, Vec<WriteOp>)]) {
        let main = inspect::MainFile::open(dir).unwrap();
        let (store_id, durable) = (main.store_id.unwrap(), main.applied_lsn);
        drop(main);
        let (mut wal, _) = Wal::open(dir, store_id, durable).unwrap();
        wal.checkpointed();
        for (lsn, ops) in records {
            wal.append(*lsn, ops).unwrap();
        }
        wal.sync().unwrap();
    }

    /// A closed store holding one URL; answers its durable LSN.
    fn closed_store_with_one_url(dir: &Path) -> u64 {
        let store = Store::open(dir).unwrap();
        store.apply(&[discovered("http://a/")]).unwrap();
        store.applied_lsn().unwrap()
    }

    #[test]
    fn groups_in_the_log_are_replayed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let durable = closed_store_with_one_url(dir.path());
        leave_in_log(
            dir.path(),
            &[
                // Already in the store: skipped, not applied twice (a
                // second Known would change the queue's counts).
                (durable, vec![discovered("http://stale/")]),
                (durable + 1, vec![discovered("http://b/")]),
                (
                    durable + 2,
                    vec![discovered("http://c/"), discovered("http://b/")],
                ),
            ],
        );
        let store = Store::open(dir.path()).unwrap();
        for url in ["http://a/", "http://b/", "http://c/"] {
            assert!(store.get(1, "c", url).unwrap().is_some(), "{url}");
        }
        assert!(store.get(1, "c", "http://stale/").unwrap().is_none());
        let mut counts = Vec::new();
        store
            .for_each_queue(|crawl, queue, record| {
                counts.push((crawl.to_owned(), queue.to_owned(), record.urls))
            })
            .unwrap();
        assert_eq!(counts, vec![("c".to_owned(), "q".to_owned(), 3)]);
        assert_eq!(store.applied_lsn().unwrap(), durable + 2);
        // The replay was checkpointed, and new groups continue the
        // sequence.
        store.apply(&[discovered("http://d/")]).unwrap();
        assert_eq!(store.applied_lsn().unwrap(), durable + 3);
    }

    #[test]
    fn a_log_that_skips_records_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let durable = closed_store_with_one_url(dir.path());
        leave_in_log(dir.path(), &[(durable + 2, vec![discovered("http://b/")])]);
        let error = Store::open(dir.path()).unwrap_err();
        assert!(
            matches!(error, StoreError::Wal(WalError::Gap { .. })),
            "{error}"
        );
        assert!(error.to_string().contains("missing"), "{error}");
    }

    /// The URLs of queue "q" of crawl "c" in its serving order, sorted.
    pub(super) fn due_urls(store: &Store) -> Vec<String> {
        let mut urls: Vec<String> = store
            .due_entries("c", "q", None, 100)
            .unwrap()
            .urls
            .into_iter()
            .map(|entry| entry.url)
            .collect();
        urls.sort();
        urls
    }

    pub(super) fn queue_counts(store: &Store) -> Vec<(String, u64, u64)> {
        let mut counts = Vec::new();
        store
            .for_each_queue(|_, queue, record| {
                counts.push((queue.to_owned(), record.urls, record.completed));
            })
            .unwrap();
        counts
    }

    pub(super) fn discovered_in(url: &str, queue: &str) -> WriteOp {
        let mut op = discovered(url);
        if let WriteOp::Discover(new) = &mut op {
            new.record.queue_key = queue.into();
        }
        op
    }

    pub(super) fn known(url: &str, due_at: u64) -> WriteOp {
        WriteOp::Known(KnownUrl {
            crawl: "c".into(),
            url: url.into(),
            partition: 1,
            queue_key: None,
            default_queue: "q".into(),
            due_at,
            metadata: std::collections::BTreeMap::new(),
            now: 5,
            report: None,
        })
    }

    /// Copies the store's files as they are on disk now: what a kill at
    /// this moment would leave (the store is idle while they are copied).
    pub(super) fn crash_image(from: &Path, to: &Path) {
        for name in [FILE_NAME, URLS_FILE_NAME, crate::wal::FILE_NAME] {
            std::fs::copy(from.join(name), to.join(name)).unwrap();
        }
    }

    /// A settings write makes `frontier.redb` durable ahead of `urls.redb`
    /// (made durable by checkpoints only). After a kill the replay applies
    /// the groups `frontier.redb` holds to `urls.redb` alone: applying their
    /// changes again would bring back the entry of a URL completed since, or
    /// remove the queue a settings write made after a deletion.
    #[test]
    fn a_kill_with_the_main_file_ahead_replays_urls_only() {
        let dir = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .apply(&[discovered("http://a/"), discovered_in("http://y/", "q2")])
                .unwrap();
            store.checkpoint().unwrap();
            store.apply(&[known("http://x/", 7)]).unwrap();
            store.apply(&[known("http://x/", 0)]).unwrap();
            store
                .apply(&[WriteOp::Delete(Deletion {
                    crawl: "c".into(),
                    queue: Some("q2".into()),
                    created_before: None,
                    partitions: 4,
                    partition: None,
                    urls_below: None,
                })])
                .unwrap();
            store
                .update_queue_settings("c", "q2", |record| record.delay_ms = Some(9))
                .unwrap();
            crash_image(dir.path(), image.path());
        }
        let store = Store::open(image.path()).unwrap();
        assert!(
            store
                .get(1, "c", "http://x/")
                .unwrap()
                .unwrap()
                .is_completed()
        );
        assert!(store.get(1, "c", "http://y/").unwrap().is_none());
        let due = due_urls(&store);
        assert_eq!(due, ["http://a/"]);
        let mut queues = Vec::new();
        store
            .for_each_queue(|_, queue, record| {
                queues.push((
                    queue.to_owned(),
                    record.urls,
                    record.completed,
                    record.delay_ms,
                ));
            })
            .unwrap();
        assert_eq!(
            queues,
            [
                ("q".to_owned(), 2, 1, None),
                ("q2".to_owned(), 0, 0, Some(9))
            ]
        );
    }

    /// A kill between a checkpoint's two durable commits: the `queues`
    /// table already counts the groups the replay applies to `urls.redb`,
    /// so they are not counted again.
    #[test]
    fn a_kill_inside_a_checkpoint_counts_each_group_once() {
        let dir = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.apply(&[discovered("http://a/")]).unwrap();
            store.checkpoint().unwrap();
            store.apply(&[discovered("http://b/")]).unwrap();
            store.apply(&[discovered("http://c/")]).unwrap();
            // urls.redb durable at the first group, the log holding the
            // other two: as they are just before the checkpoint's commits.
            crash_image(dir.path(), image.path());
            store.checkpoint().unwrap();
            // frontier.redb as the checkpoint's first commit left it.
            std::fs::copy(dir.path().join(FILE_NAME), image.path().join(FILE_NAME)).unwrap();
        }
        let store = Store::open(image.path()).unwrap();
        assert_eq!(store.due_entries("c", "q", None, 10).unwrap().urls.len(), 3);
        assert_eq!(queue_counts(&store), [("q".to_owned(), 3, 0)]);
        assert!(store.get(1, "c", "http://c/").unwrap().is_some());
    }

    /// Groups staged but not finished when the process dies: the log holds
    /// them, so the replay applies them to both files.
    #[test]
    fn a_kill_between_the_two_stages_replays_both() {
        let dir = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.apply(&[discovered("http://a/")]).unwrap();
            let staged = store.stage(&[discovered("http://b/")]).unwrap();
            crash_image(dir.path(), image.path());
            store.finish(staged).unwrap();
        }
        let store = Store::open(image.path()).unwrap();
        let due = due_urls(&store);
        assert_eq!(due, ["http://a/", "http://b/"]);
        assert_eq!(queue_counts(&store), [("q".to_owned(), 2, 0)]);
    }

    /// Writes a store as version 2 laid it out: every table in
    /// `frontier.redb`, queue counts as of its durable commit.
    fn write_version_2_store(dir: &Path) {
        let db = Database::create(dir.join(FILE_NAME)).unwrap();
        let write = db.begin_write().unwrap();
        {
            let mut meta = write.open_table(META).unwrap();
            meta.insert(SCHEMA_VERSION_KEY, 2).unwrap();
            meta.insert(APPLIED_LSN_KEY, 9).unwrap();
            meta.insert(PARTITIONS_KEY, 4).unwrap();
            let mut urls = write.open_table(URLS).unwrap();
            let mut due = write.open_table(DUE).unwrap();
            for (i, due_at) in [10, 0, 12].into_iter().enumerate() {
                let url = format!("http://a/{i}");
                let record = UrlRecord {
                    created_at: 5,
                    due_at,
                    queue_key: "q".into(),
                    ..UrlRecord::default()
                };
                // Stores of this age wrote records in their first version.
                urls.insert((1, "c", url.as_str()), record.encode_version_1().as_slice())
                    .unwrap();
                if due_at != 0 {
                    due.insert(("c", "q", due_at, url.as_str()), 1).unwrap();
                }
            }
            let queue = QueueRecord {
                urls: 3,
                completed: 1,
                ..QueueRecord::default()
            };
            write
                .open_table(QUEUES)
                .unwrap()
                .insert(("c", "q"), queue.encode().as_slice())
                .unwrap();
        }
        write.commit().unwrap();
        // The empty log an older build kept beside it (format 1).
        std::fs::write(dir.join(crate::wal::FILE_NAME), b"FRWAL\0\0\x01").unwrap();
    }

    #[test]
    fn a_version_2_store_moves_its_urls_to_their_own_file() {
        let dir = tempfile::tempdir().unwrap();
        write_version_2_store(dir.path());
        // A migration cut short left a partial file: it is made again.
        std::fs::write(dir.path().join(URLS_FILE_NAME), b"half a file").unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.applied_lsn().unwrap(), 9);
        let mut urls = Vec::new();
        store
            .for_each_url(|_, _, url, record| urls.push((url.to_owned(), record.due_at)))
            .unwrap();
        urls.sort();
        assert_eq!(
            urls,
            [
                ("http://a/0".to_owned(), 10),
                ("http://a/1".to_owned(), 0),
                ("http://a/2".to_owned(), 12)
            ]
        );
        assert_eq!(store.due_entries("c", "q", None, 10).unwrap().urls.len(), 2);
        assert_eq!(queue_counts(&store), [("q".to_owned(), 3, 1)]);
        // New groups follow the migrated log position, and survive a
        // restart.
        store.apply(&[discovered("http://b/")]).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.applied_lsn().unwrap(), 10);
        assert_eq!(queue_counts(&store), [("q".to_owned(), 4, 1)]);
        // The main file no longer holds a copy.
        let read = store.files().unwrap().db.begin_read().unwrap();
        assert!(open_if_exists(&read, URLS).unwrap().is_none());
    }

    #[test]
    fn a_store_missing_its_urls_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        std::fs::remove_file(dir.path().join(URLS_FILE_NAME)).unwrap();
        let error = Store::open(dir.path()).unwrap_err();
        assert!(matches!(error, StoreError::MissingFile { .. }), "{error}");
        assert!(error.to_string().contains(URLS_FILE_NAME));
        assert!(!dir.path().join(URLS_FILE_NAME).exists());
        // Not reset into a fresh store either.
        let db = Database::create(dir.path().join(FILE_NAME)).unwrap();
        let read = db.begin_read().unwrap();
        let meta = read.open_table(META).unwrap();
        assert_eq!(
            meta.get(SCHEMA_VERSION_KEY).unwrap().unwrap().value(),
            SCHEMA_VERSION
        );
    }

    /// Counts are held in memory between checkpoints: readers see them, a
    /// settings change (a durable commit of `frontier.redb`) keeps them
    /// held, and a clean close writes them.
    #[test]
    fn held_queue_counts_are_seen_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.apply(&[discovered("http://a/")]).unwrap();
            store
                .apply(&[discovered("http://b/"), discovered_in("http://x/", "q2")])
                .unwrap();
            assert!(!store.lock_counts().is_empty());
            assert_eq!(
                queue_counts(&store),
                [("q".to_owned(), 2, 0), ("q2".to_owned(), 1, 0)]
            );
            store
                .update_queue_settings("c", "q", |record| record.delay_ms = Some(7))
                .unwrap();
            // A settings write leaves the counts held, and both are seen.
            assert!(!store.lock_counts().is_empty());
            let mut delays = Vec::new();
            store
                .for_each_queue(|_, queue, record| {
                    delays.push((queue.to_owned(), record.urls, record.delay_ms))
                })
                .unwrap();
            assert_eq!(
                delays,
                [("q".to_owned(), 2, Some(7)), ("q2".to_owned(), 1, None)]
            );
            store.apply(&[discovered("http://c/")]).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            queue_counts(&store),
            [("q".to_owned(), 3, 0), ("q2".to_owned(), 1, 0)]
        );
    }

    /// After a kill, redb holds the counts of its last checkpoint and the
    /// replay sums the later groups again, removals included.
    #[test]
    fn replayed_groups_recount_queues_across_a_removal() {
        let dir = tempfile::tempdir().unwrap();
        let durable = closed_store_with_one_url(dir.path());
        let delete_queue = WriteOp::Delete(Deletion {
            crawl: "c".into(),
            queue: Some("q".into()),
            created_before: None,
            partitions: 4,
            partition: None,
            urls_below: None,
        });
        leave_in_log(
            dir.path(),
            &[
                (
                    durable + 1,
                    vec![discovered("http://b/"), discovered_in("http://x/", "q2")],
                ),
                (durable + 2, vec![delete_queue]),
                (durable + 3, vec![discovered("http://e/")]),
            ],
        );
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            queue_counts(&store),
            [("q".to_owned(), 1, 0), ("q2".to_owned(), 1, 0)]
        );
        assert!(store.lock_counts().is_empty());
    }

    /// A queue deleted in the middle of a group, and written again after:
    /// the later URL counts, in a queue record of its own.
    #[test]
    fn a_queue_deleted_and_refilled_in_one_group_counts_what_came_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let delete_queue = WriteOp::Delete(Deletion {
            crawl: "c".into(),
            queue: Some("q".into()),
            created_before: None,
            partitions: 4,
            partition: None,
            urls_below: None,
        });
        store
            .apply(&[
                discovered("http://a/"),
                delete_queue,
                discovered("http://b/"),
            ])
            .unwrap();
        assert!(store.get(1, "c", "http://a/").unwrap().is_none());
        assert!(store.get(1, "c", "http://b/").unwrap().is_some());
        let mut counts = Vec::new();
        store
            .for_each_queue(|_, queue, record| counts.push((queue.to_owned(), record.urls)))
            .unwrap();
        assert_eq!(counts, vec![("q".to_owned(), 1)]);
    }

    /// Groups between checkpoints are durable through the log only; a
    /// reader sees them at once all the same.
    #[test]
    fn applied_groups_are_visible_before_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[discovered("http://a/")]).unwrap();
        store.apply(&[discovered("http://b/")]).unwrap();
        assert!(store.get(1, "c", "http://b/").unwrap().is_some());
    }

    /// A URL the filter wrongly calls new (or that a concurrent batch just
    /// stored) is inserted blind; the original record must survive.
    #[test]
    fn a_blind_insert_of_a_known_url_keeps_the_stored_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let new = |created_at, maybe_known| NewUrl {
            crawl: "c".into(),
            url: "http://x/".into(),
            partition: 3,
            maybe_known,
            record: UrlRecord {
                created_at,
                due_at: 1,
                ..UrlRecord::default()
            },
        };
        assert_eq!(
            store.insert_if_absent(&[new(1, false)]).unwrap(),
            vec![true]
        );
        assert_eq!(
            store
                .insert_if_absent(&[new(2, false), new(3, true), new(4, false)])
                .unwrap(),
            vec![false, false, false]
        );
        assert_eq!(
            store.get(3, "c", "http://x/").unwrap().unwrap().created_at,
            1
        );
        // Within one transaction too.
        let other = |created_at| NewUrl {
            url: "http://y/".into(),
            ..new(created_at, false)
        };
        assert_eq!(
            store.insert_if_absent(&[other(5), other(6)]).unwrap(),
            vec![true, false]
        );
        assert_eq!(
            store.get(3, "c", "http://y/").unwrap().unwrap().created_at,
            5
        );
    }

    #[test]
    fn a_second_opener_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::AlreadyOpen { .. })
        ));
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path())
            .unwrap()
            .set_schema_version(SCHEMA_VERSION + 1)
            .unwrap();
        let error = Store::open(dir.path()).unwrap_err();
        assert!(
            matches!(error, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1)
        );
        assert!(error.to_string().contains("will not touch"));
        // Still the newer store: nothing was reset or rewritten.
        let db = Database::create(dir.path().join(FILE_NAME)).unwrap();
        let read = db.begin_read().unwrap();
        let meta = read.open_table(META).unwrap();
        assert_eq!(
            meta.get(SCHEMA_VERSION_KEY).unwrap().unwrap().value(),
            SCHEMA_VERSION + 1
        );
    }

    #[test]
    fn garbage_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let garbage: Vec<u8> = (0..20_000_u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join(FILE_NAME), &garbage).unwrap();
        let error = Store::open(dir.path()).unwrap_err();
        assert!(matches!(error, StoreError::Open { .. }), "{error}");
        assert!(
            std::fs::read(dir.path().join(FILE_NAME)).unwrap() == garbage,
            "file was modified"
        );
    }

    #[test]
    fn another_programs_redb_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::create(dir.path().join(FILE_NAME)).unwrap();
            let write = db.begin_write().unwrap();
            let table: TableDefinition<'_, u64, u64> = TableDefinition::new("theirs");
            write.open_table(table).unwrap().insert(1, 2).unwrap();
            write.commit().unwrap();
        }
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::NotAFrontierStore { .. })
        ));
    }
}
