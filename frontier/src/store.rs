//! The redb store: one file in the data directory, opened by one server at a
//! time, with a schema version checked before anything else is read.
//!
//! # Schema, version 2
//!
//! | table | key | value | holds |
//! |---|---|---|---|
//! | `meta` | `&str` | `u64` | `schema_version`; `partitions` (fixed at creation: URL keys embed it); `clean_shutdown_token` while filter snapshots match the store |
//! | `seed_hosts` | `(crawl ID, host)` | `()` | the hosts of a crawl's seeds: its scope |
//! | `urls` | `(partition, crawl ID, canonical URL)` | [`UrlRecord`] bytes | every URL a crawl knows, grouped by filter partition so that a rebuild reads only its own |
//! | `due` | `(crawl ID, queue key, due_at, canonical URL)` | partition | every URL not completed, in serving order per queue (completed URLs have no entry) |
//! | `queues` | `(crawl ID, queue key)` | [`QueueRecord`] bytes | per queue: URL and completed counts (as of the last durable commit), delay, block, crawl limit |
//! | `crawl_settings` | crawl ID | default delay (seconds) | the delay of queues without their own |
//!
//! `meta` also holds `serving_paused` (1 while SetActive(false) holds) and
//! `applied_lsn`, the last write-ahead log record redb holds.
//!
//! Version 2 adds the write-ahead log beside the file ([`crate::wal`]);
//! the tables are those of version 1, so a version-1 store is opened as it
//! is and marked version 2, and a version-1 build, which would ignore the
//! log, refuses it.
//!
//! A URL's record and its `due` entry change in one transaction
//! ([`Store::apply`]). Its queue's counts change in memory and reach the
//! `queues` table with the next durable commit, the only kind a crash keeps,
//! so after a kill the table holds the counts of the URLs redb holds and the
//! log replay adds the rest (module `queue_counts`). Readers get the table
//! and the held changes together ([`Store::for_each_queue`]).
//!
//! A file written by a newer version of the schema, a file that is not a
//! frontier store, and a corrupt file are refused with an error naming the
//! path: never reset, and never changed beyond the version-1 mark above.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::queue_counts::{self, GroupCounts, QueueCounts};
use crate::record::{RecordError, UrlRecord};
use crate::wal::{LogRecord, Recovered, Wal, WalError};

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 2;

/// redb's page cache unless configured otherwise: redb's own default.
pub const DEFAULT_CACHE_BYTES: usize = 1 << 30;

/// The store's file name inside the data directory.
pub const FILE_NAME: &str = "frontier.redb";

const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const SCHEMA_VERSION_KEY: &str = "schema_version";
const CLEAN_TOKEN_KEY: &str = "clean_shutdown_token";
const PARTITIONS_KEY: &str = "partitions";
const URLS: TableDefinition<'_, (u32, &str, &str), &[u8]> = TableDefinition::new("urls");
const SEED_HOSTS: TableDefinition<'_, (&str, &str), ()> = TableDefinition::new("seed_hosts");
const DUE: TableDefinition<'_, (&str, &str, u64, &str), u32> = TableDefinition::new("due");
const QUEUES: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("queues");
const CRAWL_SETTINGS: TableDefinition<'_, &str, u32> = TableDefinition::new("crawl_settings");
const SERVING_PAUSED_KEY: &str = "serving_paused";
/// The LSN of the last write-ahead log record applied (see [`crate::wal`]).
const APPLIED_LSN_KEY: &str = "applied_lsn";

/// A queue's persistent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueRecord {
    /// URLs the queue holds (completed or not).
    pub urls: u64,
    /// Of those, completed.
    pub completed: u64,
    /// Served from again at this UTC epoch second; 0: not blocked.
    pub blocked_until: u64,
    /// Own minimum seconds between serves; `None`: the crawl's default.
    pub delay_secs: Option<u32>,
    /// Not served once this many URLs are completed; 0: no limit.
    pub crawl_limit: u32,
}

const QUEUE_RECORD_VERSION: u8 = 1;
const QUEUE_RECORD_LEN: usize = 1 + 8 + 8 + 8 + 4 + 4;

impl QueueRecord {
    /// The binary form: version, then little-endian urls, completed,
    /// blocked_until, delay (`u32::MAX`: the crawl's default), crawl_limit.
    #[must_use]
    pub fn encode(&self) -> [u8; QUEUE_RECORD_LEN] {
        let mut out = [0_u8; QUEUE_RECORD_LEN];
        out[0] = QUEUE_RECORD_VERSION;
        out[1..9].copy_from_slice(&self.urls.to_le_bytes());
        out[9..17].copy_from_slice(&self.completed.to_le_bytes());
        out[17..25].copy_from_slice(&self.blocked_until.to_le_bytes());
        out[25..29].copy_from_slice(&self.delay_secs.unwrap_or(u32::MAX).to_le_bytes());
        out[29..33].copy_from_slice(&self.crawl_limit.to_le_bytes());
        out
    }

    /// Reads the binary form.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        if bytes.first() != Some(&QUEUE_RECORD_VERSION) {
            return Err(RecordError::UnknownVersion(
                bytes.first().copied().unwrap_or(0),
            ));
        }
        if bytes.len() != QUEUE_RECORD_LEN {
            return Err(RecordError::Truncated);
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or([0; 4]));
        let delay = u32_at(25);
        Ok(Self {
            urls: u64_at(1),
            completed: u64_at(9),
            blocked_until: u64_at(17),
            delay_secs: (delay != u32::MAX).then_some(delay),
            crawl_limit: u32_at(29),
        })
    }
}

/// A URL whose state a client reports (a URL Frontier "known" item): its
/// record is overwritten, or created when the crawl does not know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownUrl {
    /// The crawl.
    pub crawl: String,
    /// The canonical URL.
    pub url: String,
    /// The filter partition of its host.
    pub partition: u32,
    /// The queue the client named; `None`: the stored one (for a new URL,
    /// `default_queue`).
    pub queue_key: Option<String>,
    /// The queue of a URL the crawl does not know yet, when the client named
    /// none (its host).
    pub default_queue: String,
    /// Next due date; 0: completed.
    pub due_at: u64,
    /// The client's metadata, replacing what was stored.
    pub metadata: std::collections::BTreeMap<String, Vec<String>>,
    /// Creation date, for a URL the crawl does not know yet.
    pub now: u64,
}

/// One write of a group transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Store a discovered URL unless its crawl knows it.
    Discover(NewUrl),
    /// Overwrite (or create) a URL's state.
    Known(KnownUrl),
    /// Remove URLs.
    Delete(Deletion),
}

/// Which URLs a [`WriteOp::Delete`] removes: those of a crawl, optionally
/// only of one queue, optionally only those created before a date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The crawl.
    pub crawl: String,
    /// Only this queue's URLs.
    pub queue: Option<String>,
    /// Only URLs created before this UTC epoch second.
    pub created_before: Option<u64>,
    /// The store's partition count (URL keys start with the partition).
    pub partitions: u32,
}

impl Deletion {
    /// Whether whole queues (and, without a queue, the crawl) go: settings
    /// included, not only URLs.
    #[must_use]
    pub fn removes_queues(&self) -> bool {
        self.created_before.is_none()
    }
}

/// What a deletion removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// URLs removed.
    pub urls: u64,
    /// Per partition, URLs removed.
    pub per_partition: std::collections::BTreeMap<u32, u64>,
    /// Per queue, (URLs, completed URLs) removed.
    pub per_queue: std::collections::BTreeMap<String, (u64, u64)>,
}

/// What one [`WriteOp`] did, for the scheduler's memory and the caller's
/// answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A discovered URL: stored (`true`) or already known.
    Discovered {
        /// Whether it was stored.
        stored: bool,
    },
    /// A known URL's new state.
    Known {
        /// The queue and due date it had, if the crawl knew it (due 0:
        /// completed).
        previous: Option<(String, u64)>,
        /// The queue it is in now.
        queue_key: String,
    },
    /// What a deletion removed.
    Deleted(Removed),
}

/// A URL to store if its crawl does not know it yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUrl {
    /// The crawl.
    pub crawl: String,
    /// The canonical URL.
    pub url: String,
    /// The filter partition of its host.
    pub partition: u32,
    /// Whether the filter said "maybe". A "no" is certain, so the URL is
    /// inserted without a lookup first (one B-tree descent instead of two);
    /// a "maybe" is looked up first, since it is usually known.
    pub maybe_known: bool,
    /// What to store for it.
    pub record: UrlRecord,
}

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// Another server (or another handle in this one) has the store open.
    #[error(
        "{path} is already in use by another frontier (only one server may use a data directory)"
    )]
    AlreadyOpen {
        /// The store file.
        path: PathBuf,
    },
    /// Written by a newer frontier.
    #[error(
        "{path} has schema version {found}; this frontier reads version {SCHEMA_VERSION} and will not touch a newer store"
    )]
    NewerSchema {
        /// The store file.
        path: PathBuf,
        /// The version in the file.
        found: u64,
    },
    /// A redb file holding tables but no schema version: not ours.
    #[error("{path} is a redb database but not a frontier store")]
    NotAFrontierStore {
        /// The store file.
        path: PathBuf,
    },
    /// The file could not be opened as a database (corrupt, not redb, or an
    /// I/O failure).
    #[error("cannot open store {path}: {source}")]
    Open {
        /// The store file.
        path: PathBuf,
        /// What redb said.
        source: redb::DatabaseError,
    },
    /// A read or write failed.
    #[error("store operation failed: {0}")]
    Storage(#[from] redb::Error),
    /// The committer has stopped (the server is shutting down).
    #[error("the store's committer has stopped")]
    Stopped,
    /// The write-ahead log failed, or holds what cannot be replayed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// A redb transaction could not be made non-durable.
    #[error("store operation failed: {0}")]
    Durability(#[from] redb::SetDurabilityError),
    /// A stored record cannot be read.
    #[error("stored record of {url} in crawl {crawl:?} is damaged: {source}")]
    CorruptRecord {
        /// The crawl.
        crawl: String,
        /// The URL.
        url: String,
        /// What is wrong with it.
        source: RecordError,
    },
}

// redb reports each operation family with its own error type; all of them
// convert into `redb::Error`, which the store keeps.
macro_rules! storage_error_from {
    ($($source:ty),*) => {
        $(impl From<$source> for StoreError {
            fn from(error: $source) -> Self {
                StoreError::Storage(error.into())
            }
        })*
    };
}

storage_error_from!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

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

/// Opens a table for reading; a table never written yet reads as absent.
fn open_if_exists<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    table: TableDefinition<'_, K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match read.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// An open store.
pub struct Store {
    db: Database,
    path: PathBuf,
    /// Every write transaction runs under this lock, so the log's records
    /// and redb's transactions happen in one order.
    writer: Mutex<Writer>,
}

/// What writes share under the store's lock.
struct Writer {
    wal: Wal,
    /// Queue count changes of groups applied since the last durable commit,
    /// not yet in the `queues` table (see [`crate::queue_counts`]).
    queue_counts: QueueCounts,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // A clean close leaves redb durable and the log empty, so the next
        // start replays nothing. After a log failure nothing more is
        // committed: the next start replays what the log holds.
        let writable = self.lock_writer().wal.check_writable().is_ok();
        if writable && let Err(error) = self.checkpoint() {
            tracing::warn!(%error, "final checkpoint failed; the next start replays the write-ahead log");
        }
    }
}

impl Store {
    /// Opens the store in `data_dir`, creating the directory and a fresh
    /// store when there is none.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(data_dir, DEFAULT_CACHE_BYTES)
    }

    /// Like [`Self::open`], with a page cache of `cache_bytes`.
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::CreateDir {
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join(FILE_NAME);
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|source| match source {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    StoreError::AlreadyOpen { path: path.clone() }
                }
                source => StoreError::Open {
                    path: path.clone(),
                    source,
                },
            })?;
        Self::check_schema(&db, &path)?;
        let (wal, recovered) = Wal::open(data_dir)?;
        let store = Self {
            db,
            path,
            writer: Mutex::new(Writer {
                wal,
                queue_counts: QueueCounts::default(),
            }),
        };
        store.replay(recovered)?;
        Ok(store)
    }

    /// Applies the log's records the durable store does not hold yet, then
    /// checkpoints, so the store starts from a durable state and an empty
    /// log.
    fn replay(&self, recovered: Recovered) -> Result<(), StoreError> {
        let durable = self.applied_lsn()?;
        let mut writer = self.lock_writer();
        let Writer { wal, queue_counts } = &mut *writer;
        let pending: Vec<&LogRecord> = recovered
            .records
            .iter()
            .filter(|record| record.lsn > durable)
            .collect();
        if let Some(first) = pending.first()
            && first.lsn != durable + 1
        {
            return Err(WalError::Gap {
                path: wal.path().to_owned(),
                durable,
                first: first.lsn,
            }
            .into());
        }
        if recovered.dropped_bytes > 0 {
            tracing::warn!(
                bytes = recovered.dropped_bytes,
                path = %wal.path().display(),
                "dropping the torn end of the write-ahead log (a group that was never acknowledged)"
            );
        }
        for record in &pending {
            let mut write = self.db.begin_write()?;
            write.set_durability(redb::Durability::None)?;
            let (_, counts) = Self::apply_in(&write, &record.ops, record.lsn)?;
            write.commit()?;
            queue_counts.absorb(counts);
        }
        let mut write = self.db.begin_write()?;
        write.set_quick_repair(true);
        Self::write_queue_counts(&write, queue_counts)?;
        write.commit()?;
        *queue_counts = QueueCounts::default();
        if let Some(last) = pending.last() {
            wal.set_last_lsn(last.lsn);
        } else {
            wal.set_last_lsn(durable);
        }
        wal.checkpointed();
        if !pending.is_empty() {
            tracing::info!(
                records = pending.len(),
                ops = pending.iter().map(|r| r.ops.len()).sum::<usize>(),
                "replayed the write-ahead log"
            );
        }
        Ok(())
    }

    /// The LSN of the last log record redb holds.
    fn applied_lsn(&self) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta.get(APPLIED_LSN_KEY)?.map_or(0, |v| v.value()))
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        // A panic while holding the lock leaves the log as consistent as any
        // failed write does: its `len` only moves past complete records; the
        // held queue counts change only after a commit.
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `change` in a write transaction committed durably; everything
    /// applied before is durable with it, so the log is emptied.
    fn write_durably<T>(
        &self,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut writer = self.lock_writer();
        writer.wal.check_writable()?;
        let mut write = self.db.begin_write()?;
        write.set_quick_repair(true);
        Self::write_queue_counts(&write, &writer.queue_counts)?;
        let out = change(&write)?;
        write.commit()?;
        writer.queue_counts = QueueCounts::default();
        writer.wal.checkpointed();
        Ok(out)
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
        for (crawl, queue, urls, completed) in counts.iter() {
            let key = (crawl, queue);
            let mut record = match queues.get(key)? {
                Some(bytes) => decode_queue(crawl, queue, bytes.value())?,
                None => QueueRecord::default(),
            };
            queue_counts::apply(&mut record, urls, completed);
            queues.insert(key, record.encode().as_slice())?;
        }
        Ok(())
    }

    /// Makes everything applied so far durable in redb and empties the log
    /// (at shutdown; otherwise writes do it every few seconds, see
    /// [`crate::wal::CHECKPOINT_INTERVAL`]).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.write_durably(|_| Ok(()))
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

    /// The schema version recorded in the file.
    pub fn schema_version(&self) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta
            .get(SCHEMA_VERSION_KEY)?
            .map(|v| v.value())
            .unwrap_or(0))
    }

    /// The token a clean shutdown recorded after writing filter snapshots,
    /// if the store has not been written since.
    pub fn clean_shutdown_token(&self) -> Result<Option<u64>, StoreError> {
        let read = self.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta.get(CLEAN_TOKEN_KEY)?.map(|v| v.value()))
    }

    /// Records (`Some`) or clears (`None`) the clean-shutdown token, durably.
    /// It is cleared before the first write after start-up, so snapshots are
    /// never trusted for a store that changed after they were taken.
    pub fn set_clean_shutdown_token(&self, token: Option<u64>) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut meta = write.open_table(META)?;
            match token {
                Some(token) => {
                    meta.insert(CLEAN_TOKEN_KEY, token)?;
                }
                None => {
                    meta.remove(CLEAN_TOKEN_KEY)?;
                }
            }
            Ok(())
        })
    }

    fn check_schema(db: &Database, path: &Path) -> Result<(), StoreError> {
        let read = db.begin_read()?;
        let found = match open_if_exists(&read, META)? {
            Some(meta) => meta.get(SCHEMA_VERSION_KEY)?.map(|v| v.value()),
            None => None,
        };
        match found {
            Some(version) if version > SCHEMA_VERSION => Err(StoreError::NewerSchema {
                path: path.to_owned(),
                found: version,
            }),
            Some(SCHEMA_VERSION) => Ok(()),
            found => {
                if found.is_none() && read.list_tables()?.next().is_some() {
                    return Err(StoreError::NotAFrontierStore {
                        path: path.to_owned(),
                    });
                }
                drop(read);
                // Fresh, or version 1: version 2 only adds the write-ahead
                // log, so the tables are read as they are; the version is
                // raised so that a version 1 build, which would ignore the
                // log, refuses the store.
                let write = db.begin_write()?;
                write
                    .open_table(META)?
                    .insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                write.commit()?;
                Ok(())
            }
        }
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

    /// Applies writes in order, all in one transaction that is durable when
    /// this returns: URL records and their `due` entries together; queue
    /// counts in memory until the next durable commit writes them.
    ///
    /// Durable through the write-ahead log: the group is appended to the
    /// log and synced, then applied with a non-durable redb commit; every
    /// [`crate::wal::CHECKPOINT_INTERVAL`] the group is committed durably to
    /// redb instead and the log emptied. The sync comes first so that whatever a reader can see
    /// (a lookup answering "already known", a URL served) is durable.
    pub fn apply(&self, ops: &[WriteOp]) -> Result<Vec<Applied>, StoreError> {
        let mut writer = self.lock_writer();
        let Writer { wal, queue_counts } = &mut *writer;
        wal.check_writable()?;
        let lsn = wal.last_lsn() + 1;
        let checkpoint = wal.checkpoint_due();
        let record_start = wal.end();
        if !checkpoint {
            wal.append(lsn, ops)?;
            if let Err(error) = wal.sync() {
                wal.unappend(record_start);
                return Err(error.into());
            }
        }
        let applied = (|| {
            let mut write = self.db.begin_write()?;
            if checkpoint {
                write.set_quick_repair(true);
            } else {
                write.set_durability(redb::Durability::None)?;
            }
            let (results, counts) = Self::apply_in(&write, ops, lsn)?;
            // A checkpoint writes the held counts and this group's; other
            // commits leave them in memory (see `queue_counts`), held only
            // once the commit succeeded.
            if checkpoint {
                let mut all = queue_counts.clone();
                all.absorb(counts);
                Self::write_queue_counts(&write, &all)?;
                write.commit()?;
                Ok((results, QueueCounts::default()))
            } else {
                write.commit()?;
                let mut all = std::mem::take(queue_counts);
                all.absorb(counts);
                Ok((results, all))
            }
        })();
        match applied {
            Err(error) => {
                if !checkpoint {
                    // The group is not in redb: its record goes, so that a
                    // replay does not apply it ahead of later groups. If
                    // that fails, writes halt and a restart replays it (the
                    // caller was told it failed; storing it then is what a
                    // retry would have done).
                    wal.unappend(record_start);
                    let _ = wal.sync();
                }
                Err(error)
            }
            Ok((results, held)) => {
                *queue_counts = held;
                wal.set_last_lsn(lsn);
                if checkpoint {
                    wal.checkpointed();
                }
                Ok(results)
            }
        }
    }

    /// Applies a group's writes in `write` and records its log number;
    /// answers what each did and what the group did to queue counts (which
    /// it does not write: see `queue_counts`).
    fn apply_in(
        write: &redb::WriteTransaction,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<(Vec<Applied>, GroupCounts), StoreError> {
        write.open_table(META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut results = Vec::with_capacity(ops.len());
        // Queue count changes, summed per queue.
        let mut removed_queues = Vec::new();
        let mut deltas: std::collections::HashMap<(&str, String), (i64, i64)> =
            std::collections::HashMap::new();
        {
            let mut urls = write.open_table(URLS)?;
            let mut due = write.open_table(DUE)?;
            let mut queues = write.open_table(QUEUES)?;
            let mut seed_hosts = write.open_table(SEED_HOSTS)?;
            let mut crawl_settings = write.open_table(CRAWL_SETTINGS)?;
            for op in ops {
                match op {
                    WriteOp::Discover(new) => {
                        let stored = Self::discover(&mut urls, new)?;
                        if stored {
                            due.insert(
                                (
                                    new.crawl.as_str(),
                                    new.record.queue_key.as_str(),
                                    new.record.due_at,
                                    new.url.as_str(),
                                ),
                                new.partition,
                            )?;
                            let delta = deltas
                                .entry((new.crawl.as_str(), new.record.queue_key.clone()))
                                .or_default();
                            delta.0 += 1;
                        }
                        results.push(Applied::Discovered { stored });
                    }
                    WriteOp::Known(known) => {
                        let key = (known.partition, known.crawl.as_str(), known.url.as_str());
                        let previous = match urls.get(key)? {
                            Some(bytes) => {
                                Some(decode_record(&known.crawl, &known.url, bytes.value())?)
                            }
                            None => None,
                        };
                        let queue_key = known
                            .queue_key
                            .clone()
                            .or_else(|| previous.as_ref().map(|r| r.queue_key.clone()))
                            .unwrap_or_else(|| known.default_queue.clone());
                        let record = UrlRecord {
                            created_at: previous.as_ref().map_or(known.now, |r| r.created_at),
                            due_at: known.due_at,
                            depth: previous.as_ref().map_or(0, |r| r.depth),
                            queue_key: queue_key.clone(),
                            metadata: known.metadata.clone(),
                        };
                        urls.insert(key, record.encode().as_slice())?;
                        if let Some(old) = &previous {
                            if !old.is_completed() {
                                due.remove((
                                    known.crawl.as_str(),
                                    old.queue_key.as_str(),
                                    old.due_at,
                                    known.url.as_str(),
                                ))?;
                            }
                            let delta = deltas
                                .entry((known.crawl.as_str(), old.queue_key.clone()))
                                .or_default();
                            delta.0 -= 1;
                            delta.1 -= i64::from(old.is_completed());
                        }
                        if !record.is_completed() {
                            due.insert(
                                (
                                    known.crawl.as_str(),
                                    queue_key.as_str(),
                                    record.due_at,
                                    known.url.as_str(),
                                ),
                                known.partition,
                            )?;
                        }
                        let delta = deltas
                            .entry((known.crawl.as_str(), queue_key.clone()))
                            .or_default();
                        delta.0 += 1;
                        delta.1 += i64::from(record.is_completed());
                        results.push(Applied::Known {
                            previous: previous.map(|old| (old.queue_key, old.due_at)),
                            queue_key,
                        });
                    }
                    WriteOp::Delete(deletion) => {
                        let removed = Self::delete(&mut urls, &mut due, deletion)?;
                        for (queue, (urls_removed, completed_removed)) in &removed.per_queue {
                            let delta = deltas
                                .entry((deletion.crawl.as_str(), queue.clone()))
                                .or_default();
                            delta.0 -= *urls_removed as i64;
                            delta.1 -= *completed_removed as i64;
                        }
                        if deletion.removes_queues() {
                            // Whole queues go, settings and all (and with no
                            // queue named, the crawl's scope and default
                            // delay), here, in the order of the writes: a URL
                            // stored after the deletion in the same group
                            // counts in a queue of its own.
                            let crawl = deletion.crawl.as_str();
                            let doomed: Vec<String> = match &deletion.queue {
                                Some(queue) => vec![queue.clone()],
                                None => names_under(&queues, crawl)?,
                            };
                            for queue in &doomed {
                                queues.remove((crawl, queue.as_str()))?;
                            }
                            deltas.retain(|(delta_crawl, queue), _| {
                                *delta_crawl != crawl
                                    || deletion.queue.as_ref().is_some_and(|named| named != queue)
                            });
                            removed_queues.push((crawl.to_owned(), deletion.queue.clone()));
                            if deletion.queue.is_none() {
                                for host in names_under(&seed_hosts, crawl)? {
                                    seed_hosts.remove((crawl, host.as_str()))?;
                                }
                                crawl_settings.remove(crawl)?;
                            }
                        }
                        results.push(Applied::Deleted(removed));
                    }
                }
            }
        }
        let mut changes = QueueCounts::default();
        for ((crawl, queue), (urls, completed)) in deltas {
            changes.add(crawl, &queue, urls, completed);
        }
        Ok((
            results,
            GroupCounts {
                removed: removed_queues,
                changes,
            },
        ))
    }

    fn discover(
        urls: &mut redb::Table<'_, (u32, &str, &str), &[u8]>,
        new: &NewUrl,
    ) -> Result<bool, StoreError> {
        let key = (new.partition, new.crawl.as_str(), new.url.as_str());
        if new.maybe_known && urls.get(key)?.is_some() {
            return Ok(false);
        }
        let previous = urls
            .insert(key, new.record.encode().as_slice())?
            .map(|old| old.value().to_vec());
        match previous {
            // Known after all (a concurrent batch stored it after the filter
            // was asked, or it came earlier in this transaction): put the
            // stored record back.
            Some(old) => {
                urls.insert(key, old.as_slice())?;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    fn delete(
        urls: &mut redb::Table<'_, (u32, &str, &str), &[u8]>,
        due: &mut redb::Table<'_, (&str, &str, u64, &str), u32>,
        deletion: &Deletion,
    ) -> Result<Removed, StoreError> {
        let crawl = deletion.crawl.as_str();
        let mut removed = Removed::default();
        for partition in 0..deletion.partitions {
            // (URL, queue, due date) of each URL to remove; collected first,
            // since a table cannot change under its own iterator.
            let mut doomed: Vec<(String, String, u64)> = Vec::new();
            for entry in urls.range((partition, crawl, "")..(partition + 1, "", ""))? {
                let (key, value) = entry?;
                let (_, entry_crawl, url) = key.value();
                if entry_crawl != crawl {
                    break;
                }
                let record = decode_record(crawl, url, value.value())?;
                if deletion
                    .queue
                    .as_ref()
                    .is_some_and(|q| *q != record.queue_key)
                {
                    continue;
                }
                if deletion
                    .created_before
                    .is_some_and(|before| record.created_at >= before)
                {
                    continue;
                }
                doomed.push((url.to_owned(), record.queue_key, record.due_at));
            }
            for (url, queue, due_at) in doomed {
                urls.remove((partition, crawl, url.as_str()))?;
                if due_at != 0 {
                    due.remove((crawl, queue.as_str(), due_at, url.as_str()))?;
                }
                removed.urls += 1;
                *removed.per_partition.entry(partition).or_default() += 1;
                let per_queue = removed.per_queue.entry(queue).or_default();
                per_queue.0 += 1;
                per_queue.1 += u64::from(due_at == 0);
            }
        }
        Ok(removed)
    }

    /// Calls `visit(partition, url, record)` for a crawl's URLs, partition
    /// by partition, from one consistent snapshot, until it answers
    /// `false`. Memory stays bounded however many URLs the crawl has.
    pub fn scan_crawl(
        &self,
        crawl: &str,
        partitions: u32,
        mut visit: impl FnMut(u32, &str, UrlRecord) -> bool,
    ) -> Result<(), StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, URLS)? else {
            return Ok(());
        };
        for partition in 0..partitions {
            for entry in table.range((partition, crawl, "")..(partition + 1, "", ""))? {
                let (key, value) = entry?;
                let (_, entry_crawl, url) = key.value();
                if entry_crawl != crawl {
                    break;
                }
                let record = decode_record(crawl, url, value.value())?;
                if !visit(partition, url, record) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Every queue and its record, in key order, counts up to date (those
    /// held in memory since the last checkpoint included).
    pub fn for_each_queue(
        &self,
        mut visit: impl FnMut(&str, &str, QueueRecord),
    ) -> Result<(), StoreError> {
        // The snapshot and the held counts are taken together, so no group
        // is counted twice or missed.
        let (read, held) = {
            let writer = self.lock_writer();
            (self.db.begin_read()?, writer.queue_counts.clone())
        };
        let mut records = std::collections::BTreeMap::new();
        if let Some(table) = open_if_exists(&read, QUEUES)? {
            for entry in table.iter()? {
                let (key, value) = entry?;
                let (crawl, queue) = key.value();
                records.insert(
                    (crawl.to_owned(), queue.to_owned()),
                    decode_queue(crawl, queue, value.value())?,
                );
            }
        }
        held.apply_to(&mut records);
        for ((crawl, queue), record) in records {
            visit(&crawl, &queue, record);
        }
        Ok(())
    }

    /// Changes a queue's settings (not its counts), durably.
    pub fn update_queue_settings(
        &self,
        crawl: &str,
        queue: &str,
        change: impl FnOnce(&mut QueueRecord),
    ) -> Result<QueueRecord, StoreError> {
        self.write_durably(|write| {
            let mut queues = write.open_table(QUEUES)?;
            let mut record = match queues.get((crawl, queue))? {
                Some(bytes) => decode_queue(crawl, queue, bytes.value())?,
                None => QueueRecord::default(),
            };
            change(&mut record);
            queues.insert((crawl, queue), record.encode().as_slice())?;
            Ok(record)
        })
    }

    /// Sets the default delay of a crawl's queues, durably.
    pub fn set_default_delay(&self, crawl: &str, secs: u32) -> Result<(), StoreError> {
        self.write_durably(|write| {
            write.open_table(CRAWL_SETTINGS)?.insert(crawl, secs)?;
            Ok(())
        })
    }

    /// Every crawl's default delay.
    pub fn for_each_default_delay(
        &self,
        mut visit: impl FnMut(&str, u32),
    ) -> Result<(), StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, CRAWL_SETTINGS)? else {
            return Ok(());
        };
        for entry in table.iter()? {
            let (crawl, secs) = entry?;
            visit(crawl.value(), secs.value());
        }
        Ok(())
    }

    /// Whether serving is paused (SetActive(false)).
    pub fn serving_paused(&self) -> Result<bool, StoreError> {
        let read = self.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta
            .get(SERVING_PAUSED_KEY)?
            .is_some_and(|v| v.value() == 1))
    }

    /// Records whether serving is paused, durably.
    pub fn set_serving_paused(&self, paused: bool) -> Result<(), StoreError> {
        self.write_durably(|write| {
            write
                .open_table(META)?
                .insert(SERVING_PAUSED_KEY, u64::from(paused))?;
            Ok(())
        })
    }

    /// Up to `limit` due entries of one queue after `after` (exclusive;
    /// `None`: from the first), in serving order: (due_at, url, partition).
    pub fn due_entries(
        &self,
        crawl: &str,
        queue: &str,
        after: Option<(u64, &str)>,
        limit: usize,
    ) -> Result<Vec<(u64, String, u32)>, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, DUE)? else {
            return Ok(Vec::new());
        };
        let (due_from, url_from) = after.unwrap_or((0, ""));
        let mut out = Vec::with_capacity(limit.min(1024));
        for entry in table.range((crawl, queue, due_from, url_from)..)? {
            let (key, partition) = entry?;
            let (entry_crawl, entry_queue, due_at, url) = key.value();
            if entry_crawl != crawl || entry_queue != queue {
                break;
            }
            if after.is_some_and(|(d, u)| d == due_at && u == url) {
                continue;
            }
            out.push((due_at, url.to_owned(), partition.value()));
            if out.len() == limit {
                break;
            }
        }
        Ok(out)
    }

    /// A crawl's not-completed URLs split into due by `now` and later.
    pub fn count_due(&self, crawl: &str, now: u64) -> Result<(u64, u64), StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, DUE)? else {
            return Ok((0, 0));
        };
        let (mut due_now, mut later) = (0, 0);
        for entry in table.range((crawl, "", 0, "")..)? {
            let (key, _) = entry?;
            let (entry_crawl, _, due_at, _) = key.value();
            if entry_crawl != crawl {
                break;
            }
            if due_at <= now {
                due_now += 1;
            } else {
                later += 1;
            }
        }
        Ok((due_now, later))
    }

    /// Registers hosts as seeds of a crawl, durably.
    pub fn add_seed_hosts(&self, crawl: &str, hosts: &[String]) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut table = write.open_table(SEED_HOSTS)?;
            for host in hosts {
                table.insert((crawl, host.as_str()), ())?;
            }
            Ok(())
        })
    }

    /// Calls `visit(crawl, host)` for every registered seed host.
    pub fn for_each_seed_host(&self, mut visit: impl FnMut(&str, &str)) -> Result<(), StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, SEED_HOSTS)? else {
            return Ok(());
        };
        for entry in table.iter()? {
            let (key, _) = entry?;
            let (crawl, host) = key.value();
            visit(crawl, host);
        }
        Ok(())
    }

    /// What the store holds for one URL of a partition.
    pub fn get(
        &self,
        partition: u32,
        crawl: &str,
        url: &str,
    ) -> Result<Option<UrlRecord>, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, URLS)? else {
            return Ok(None);
        };
        let Some(bytes) = table.get((partition, crawl, url))? else {
            return Ok(None);
        };
        decode_record(crawl, url, bytes.value()).map(Some)
    }

    /// Whether each (partition, crawl, URL) is stored, from one snapshot.
    /// What this finds is durable: a group's log record is synced before
    /// redb shows it.
    pub fn known_urls<'a>(
        &self,
        keys: impl IntoIterator<Item = (u32, &'a str, &'a str)>,
    ) -> Result<Vec<bool>, StoreError> {
        let read = self.db.begin_read()?;
        let table = open_if_exists(&read, URLS)?;
        keys.into_iter()
            .map(|key| match &table {
                Some(table) => Ok(table.get(key)?.is_some()),
                None => Ok(false),
            })
            .collect()
    }

    /// The partition count URL keys were made with; recorded on first use.
    pub fn partitions(&self, configured: u32) -> Result<u32, StoreError> {
        let recorded = self.write_durably(|write| {
            let mut meta = write.open_table(META)?;
            let recorded = meta.get(PARTITIONS_KEY)?.map(|v| v.value());
            Ok(match recorded {
                Some(recorded) => recorded,
                None => {
                    meta.insert(PARTITIONS_KEY, u64::from(configured))?;
                    u64::from(configured)
                }
            })
        })?;
        u32::try_from(recorded).map_err(|_| StoreError::NotAFrontierStore {
            path: self.path.clone(),
        })
    }

    /// Calls `visit(partition, crawl, url, record)` for every stored URL, in
    /// key order, from one consistent snapshot; answers how many there were.
    pub fn for_each_url(
        &self,
        mut visit: impl FnMut(u32, &str, &str, &UrlRecord),
    ) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, URLS)? else {
            return Ok(0);
        };
        let mut count = 0;
        for entry in table.iter()? {
            let (key, value) = entry?;
            let (partition, crawl, url) = key.value();
            let record = decode_record(crawl, url, value.value())?;
            visit(partition, crawl, url, &record);
            count += 1;
        }
        Ok(count)
    }

    /// Calls `visit(crawl, url)` for every URL stored in one filter
    /// partition, from one consistent snapshot; answers how many.
    pub fn for_each_url_in_partition(
        &self,
        partition: u32,
        mut visit: impl FnMut(&str, &str),
    ) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, URLS)? else {
            return Ok(0);
        };
        let mut count = 0;
        for entry in table.range((partition, "", "")..(partition + 1, "", ""))? {
            let (key, _) = entry?;
            let (_, crawl, url) = key.value();
            visit(crawl, url);
            count += 1;
        }
        Ok(count)
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
    use super::*;

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

    fn discovered(url: &str) -> WriteOp {
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
    fn leave_in_log(dir: &Path, records: &[(u64, Vec<WriteOp>)]) {
        let (mut wal, _) = Wal::open(dir).unwrap();
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
        // The replay was checkpointed: the log is empty, and new groups
        // continue the sequence.
        assert_eq!(
            std::fs::metadata(dir.path().join(crate::wal::FILE_NAME))
                .unwrap()
                .len(),
            8
        );
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

    fn queue_counts(store: &Store) -> Vec<(String, u64, u64)> {
        let mut counts = Vec::new();
        store
            .for_each_queue(|_, queue, record| {
                counts.push((queue.to_owned(), record.urls, record.completed));
            })
            .unwrap();
        counts
    }

    fn discovered_in(url: &str, queue: &str) -> WriteOp {
        let mut op = discovered(url);
        if let WriteOp::Discover(new) = &mut op {
            new.record.queue_key = queue.into();
        }
        op
    }

    /// Counts are held in memory between checkpoints: readers see them, a
    /// settings change (a durable commit) writes them without losing either,
    /// and a clean close keeps them.
    #[test]
    fn held_queue_counts_are_seen_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.apply(&[discovered("http://a/")]).unwrap();
            store
                .apply(&[discovered("http://b/"), discovered_in("http://x/", "q2")])
                .unwrap();
            assert!(!store.lock_writer().queue_counts.is_empty());
            assert_eq!(
                queue_counts(&store),
                [("q".to_owned(), 2, 0), ("q2".to_owned(), 1, 0)]
            );
            let record = store
                .update_queue_settings("c", "q", |record| record.delay_secs = Some(7))
                .unwrap();
            assert_eq!((record.urls, record.delay_secs), (2, Some(7)));
            assert!(store.lock_writer().queue_counts.is_empty());
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
        assert!(store.lock_writer().queue_counts.is_empty());
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
