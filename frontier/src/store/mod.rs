//! The redb store: two files in the data directory, opened by one server
//! at a time, with a schema version checked before anything else is read.
//!
//! # Schema, version 4
//!
//! `frontier.redb`:
//!
//! | table | key | value | holds |
//! |---|---|---|---|
//! | `meta` | `&str` | `u64` | `schema_version`; `store_id` (random, drawn at creation; also in `urls.redb` and the log's header); `partitions` (fixed at creation: URL keys embed it); `clean_shutdown_token` while filter snapshots match the store; `serving_paused` (1 while SetActive(false) holds); `applied_lsn`, the last write-ahead log record this file holds; `counts_lsn`, the last whose queue counts `queues` holds |
//! | `seed_hosts` | `(crawl ID, host)` | `()` | the hosts of a crawl's seeds: its scope |
//! | `due` | `(crawl ID, queue key, due_at, canonical URL)` | partition | every URL not completed, in serving order per queue (completed URLs have no entry) |
//! | `queues` | `(crawl ID, queue key)` | [`QueueRecord`] bytes | per queue: URL and completed counts (as of the last checkpoint), delay, block, crawl limit |
//! | `crawl_settings` | crawl ID | default delay (seconds) | the delay of queues without their own |
//!
//! `urls.redb`:
//!
//! | table | key | value | holds |
//! |---|---|---|---|
//! | `meta` | `&str` | `u64` | `store_id`; `applied_lsn`, the last log record this file holds |
//! | `urls` | `(partition, crawl ID, canonical URL)` | [`UrlRecord`] bytes | every URL a crawl knows, grouped by filter partition so that a rebuild reads only its own |
//!
//! # Why two files, and how they agree
//!
//! redb runs one write transaction per file at a time, and a group's
//! B-tree work (one insert into `urls` and one into `due` per new URL) is
//! what limits ingest. With the two tables in two files, a group is applied
//! in two stages on two threads ([`crate::commit`]): [`Store::stage`] logs
//! it ([`crate::wal`]) and applies it to `urls.redb`, working out from the
//! records it finds the changes `frontier.redb` follows with; [`Store::finish`]
//! applies those while the next group is staged. Both commit non-durably:
//! the log makes a group durable. Each stage applies its writes in key
//! order, not arrival order (`apply_order`): the keys of a group are spread
//! over the whole tree, and sorted descents share their cached pages.
//!
//! Every few seconds a group is a checkpoint: it waits until the groups
//! before it are finished, and both files are committed durably,
//! `frontier.redb` first, then the log starts again from its first slot. Settings writes commit
//! `frontier.redb` durably between checkpoints. So on disk `frontier.redb`
//! is never behind `urls.redb`, and after a kill the replay applies each
//! logged group to `urls.redb` if that file lacks it, and its changes to
//! `frontier.redb` only if that file lacks them too: the changes are worked
//! out from `urls.redb` as it was just before the group, which is how the
//! replay finds it. Replaying the other way round could not be done, which
//! is why the order matters.
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
//! Version 1 had no log, version 2 a log; both kept every table in
//! `frontier.redb`. Opening one moves `urls` into `urls.redb` (made durable
//! first), then drops it from `frontier.redb` and marks version 3 in one
//! durable commit, so a crash in between leaves the old store, and the move
//! runs again. Version 3 had no store ID and a log of format 1: its log is
//! replayed, then the store gets its ID and a new log, and the version mark
//! comes last. A file written by a newer version of the schema, a file that
//! is not a frontier store and a corrupt file are refused the same way.
//!

pub mod inspect;
mod open;
mod recover;

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

pub use self::open::StoreOptions;
use crate::queue_counts::{self, GroupCounts, QueueCounts};
use crate::record::{RecordError, UrlRecord};
use crate::wal::{Wal, WalError};

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 4;

/// redb's page cache unless configured otherwise: redb's own default.
pub const DEFAULT_CACHE_BYTES: usize = 1 << 30;

/// How the operating system words a full disk (ENOSPC), in a failure's
/// text.
const NO_SPACE_TEXT: &str = "No space left on device";

/// The store's main file name inside the data directory.
pub const FILE_NAME: &str = "frontier.redb";

/// The file of the `urls` table, beside [`FILE_NAME`].
pub const URLS_FILE_NAME: &str = "urls.redb";

const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const SCHEMA_VERSION_KEY: &str = "schema_version";
const CLEAN_TOKEN_KEY: &str = "clean_shutdown_token";
const PARTITIONS_KEY: &str = "partitions";
/// `urls.redb`'s own `meta`: `applied_lsn` only.
const URLS_META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const URLS: TableDefinition<'_, (u32, &str, &str), &[u8]> = TableDefinition::new("urls");
const SEED_HOSTS: TableDefinition<'_, (&str, &str), ()> = TableDefinition::new("seed_hosts");
const DUE: TableDefinition<'_, (&str, &str, u64, &str), u32> = TableDefinition::new("due");
const QUEUES: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("queues");
const CRAWL_SETTINGS: TableDefinition<'_, &str, u32> = TableDefinition::new("crawl_settings");
const SERVING_PAUSED_KEY: &str = "serving_paused";
/// The LSN of the last write-ahead log record applied (see [`crate::wal`]).
const APPLIED_LSN_KEY: &str = "applied_lsn";
/// The LSN of the last group whose queue counts the `queues` table holds.
const COUNTS_LSN_KEY: &str = "counts_lsn";

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
    /// A file of an existing store is missing.
    #[error(
        "{path} is missing, and it {holds}. The store is refused, never reset: restore the file (the whole data directory from one backup), or run `frontier verify --data-dir {dir}` to see what the other files hold and `frontier salvage --data-dir {dir} --into NEW_DIR` to copy it into a new store",
        dir = path.parent().unwrap_or(Path::new(".")).display()
    )]
    MissingFile {
        /// The missing file.
        path: PathBuf,
        /// What the file holds.
        holds: &'static str,
    },
    /// A file of an existing store is empty.
    #[error(
        "{path} is empty (0 bytes), and it {holds}. The store is refused, never reset: restore the file (the whole data directory from one backup), or run `frontier verify --data-dir {dir}` to see what the other files hold and `frontier salvage --data-dir {dir} --into NEW_DIR` to copy it into a new store",
        dir = path.parent().unwrap_or(Path::new(".")).display()
    )]
    EmptyFile {
        /// The empty file.
        path: PathBuf,
        /// What the file holds.
        holds: &'static str,
    },
    /// A file of the store belongs to another store (or to none).
    #[error(
        "{path} belongs to {found}, not to the store {expected:016x} of the files beside it: the files come from different stores; restore the data directory from one backup"
    )]
    OtherStore {
        /// The file.
        path: PathBuf,
        /// Whose it is.
        found: String,
        /// The store ID of `frontier.redb`.
        expected: u64,
    },
    /// A file could not be examined, or one left by a creation or migration
    /// that did not finish could not be removed.
    #[error("{path}: {source}")]
    FileSystem {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// Writes are refused while the disk holding the store is nearly full.
    #[error(
        "the disk holding {path} is full: {available_mb} MiB free, writes need at least {needed_mb} MiB (--min-free-mb); nothing was stored. Free some space: writes resume by themselves"
    )]
    DiskFull {
        /// The data directory.
        path: PathBuf,
        /// MiB free for the frontier.
        available_mb: u64,
        /// MiB that must stay free.
        needed_mb: u64,
    },
    /// `frontier.redb` is older on disk than `urls.redb`, which this
    /// frontier never leaves behind (files restored from different moments).
    #[error(
        "{path} holds writes up to log record {due_lsn} but urls.redb up to {urls_lsn}: the files are not from one store state"
    )]
    FilesDisagree {
        /// The store file.
        path: PathBuf,
        /// What `frontier.redb` holds.
        due_lsn: u64,
        /// What `urls.redb` holds.
        urls_lsn: u64,
    },
    /// A write to the store's files failed; redb refuses every call on
    /// them until they are reopened.
    #[error(
        "a write to the store's files failed ({reason}); writes are refused until they are reopened, which the server does by itself once the disk has room again. Nothing acknowledged is lost: the write-ahead log holds it"
    )]
    Poisoned {
        /// What failed.
        reason: String,
        /// Whether it failed for lack of room.
        disk_full: bool,
    },
    /// A reopening of the files failed, and they are closed.
    #[error(
        "the store's files could not be reopened ({0}); restart the server: the write-ahead log replays everything acknowledged"
    )]
    Closed(String),
    /// A group could not be applied to `frontier.redb` after `urls.redb`
    /// took it; writes stop until a restart replays the log.
    #[error("writes halted until restart: {0}")]
    Halted(String),
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

impl StoreError {
    /// Whether a full disk is what failed: the write may be sent again once
    /// there is room.
    #[must_use]
    pub fn is_disk_full(&self) -> bool {
        const NO_SPACE: i32 = rustix::io::Errno::NOSPC.raw_os_error();
        match self {
            Self::DiskFull { .. } => true,
            Self::Wal(error) => error.is_disk_full(),
            Self::Storage(redb::Error::Io(error)) => error.raw_os_error() == Some(NO_SPACE),
            Self::Poisoned { disk_full, .. } => *disk_full,
            _ => false,
        }
    }

    /// Whether this is a failed read or write of a file, after which redb
    /// refuses every call until the file is reopened.
    fn poisons(&self) -> bool {
        matches!(
            self,
            Self::Storage(redb::Error::Io(_) | redb::Error::PreviousIo)
        )
    }
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
    /// The two redb files; `None` only while a recovery that failed left
    /// them closed (module `recover`).
    files: std::sync::RwLock<Option<Files>>,
    /// Set when a write to the files failed: redb then refuses every call
    /// until they are reopened ([`Store::recover`]).
    poisoned: std::sync::Mutex<Option<String>>,
    /// redb's page cache per file, for a reopening.
    cache_bytes: usize,
    path: PathBuf,
    /// Writes are refused while less is free (see [`StoreOptions`]).
    min_free_bytes: u64,
    /// Groups are logged and applied to `urls.redb` under this lock, so the
    /// log's records and the urls file's transactions happen in one order.
    writer: Mutex<Writer>,
    /// Transactions on `frontier.redb` run under this lock (after `writer`
    /// when both are taken); `due_applied` wakes whoever waits for a group's
    /// second stage.
    due_side: Mutex<DueSide>,
    due_applied: Condvar,
}

/// The store's two redb files.
struct Files {
    /// `frontier.redb`: everything but the `urls` table.
    db: Database,
    /// `urls.redb`: the `urls` table.
    urls_db: Database,
}

/// The files, read-locked for a call (a recovery takes them whole).
struct FilesGuard<'a>(std::sync::RwLockReadGuard<'a, Option<Files>>);

impl std::ops::Deref for FilesGuard<'_> {
    type Target = Files;

    fn deref(&self) -> &Files {
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("checked when the guard was made"))
    }
}

/// What writes share under the store's lock.
struct Writer {
    wal: Wal,
    /// Queue count changes of groups applied since the last checkpoint,
    /// not yet in the `queues` table (see [`crate::queue_counts`]).
    queue_counts: QueueCounts,
}

/// The second stage's progress.
struct DueSide {
    /// The last group whose changes `frontier.redb` holds.
    lsn: u64,
    /// Set when a second stage failed: `urls.redb` then holds a group
    /// `frontier.redb` does not, and only a restart's replay mends that.
    halted: Option<String>,
}

/// A group applied to `urls.redb` (the first stage of [`Store::apply`]);
/// [`Store::finish`] applies the rest to `frontier.redb`.
#[derive(Debug)]
#[must_use = "a staged group is acknowledged only once finished"]
pub struct StagedGroup {
    lsn: u64,
    /// `None`: the group was a checkpoint, applied in full already.
    changes: Option<Vec<DueChange>>,
    results: Vec<Applied>,
}

/// A change a group makes to `frontier.redb`, worked out in the first stage
/// from what `urls.redb` held.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DueChange {
    Insert {
        crawl: String,
        queue: String,
        due_at: u64,
        url: String,
        partition: u32,
    },
    Remove {
        crawl: String,
        queue: String,
        due_at: u64,
        url: String,
    },
    /// One queue's record goes, or (`None`) every queue of the crawl with
    /// its seed hosts and default delay.
    RemoveQueues {
        crawl: String,
        queue: Option<String>,
    },
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
        // A clean close leaves redb durable and the log empty, so the next
        // start replays nothing. After a failure nothing more is committed:
        // the next start replays what the log holds.
        let writable = self.lock_writer().wal.check_writable().is_ok()
            && self.lock_due_side().halted.is_none();
        if writable && let Err(error) = self.checkpoint() {
            tracing::warn!(%error, "final checkpoint failed; the next start replays the write-ahead log");
        }
    }
}

impl Store {
    fn lock_writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        // A panic while holding the lock leaves the log as consistent as any
        // failed write does: its `len` only moves past complete records; the
        // held queue counts change only after a commit.
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_due_side(&self) -> std::sync::MutexGuard<'_, DueSide> {
        self.due_side
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails while the store's file system has less than the configured
    /// room left. A file system that cannot say is taken to have room: the
    /// check only keeps redb away from a full disk, it is not what keeps
    /// the store consistent.
    fn check_space(&self) -> Result<(), StoreError> {
        if self.min_free_bytes == 0 {
            return Ok(());
        }
        let Ok(stats) = rustix::fs::statvfs(self.data_dir()) else {
            return Ok(());
        };
        let available = stats.f_bavail.saturating_mul(stats.f_frsize);
        if available >= self.min_free_bytes {
            return Ok(());
        }
        Err(StoreError::DiskFull {
            path: self.data_dir().to_owned(),
            available_mb: available >> 20,
            needed_mb: self.min_free_bytes.div_ceil(1 << 20),
        })
    }

    /// Whether writes are taken now: `Err` says why not (the disk is full,
    /// or a failure halted writes until a restart).
    pub fn write_state(&self) -> Result<(), StoreError> {
        self.check_poisoned()?;
        self.lock_writer().wal.check_writable()?;
        Self::check_due_side(&self.lock_due_side())?;
        self.check_space()
    }

    /// The files, for one call.
    fn files(&self) -> Result<FilesGuard<'_>, StoreError> {
        let files = self
            .files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if files.is_none() {
            return Err(StoreError::Closed("an earlier reopening failed".to_owned()));
        }
        Ok(FilesGuard(files))
    }

    /// Fails while a failed write keeps the files unusable.
    fn check_poisoned(&self) -> Result<(), StoreError> {
        match &*self
            .poisoned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some(reason) => Err(StoreError::Poisoned {
                reason: reason.clone(),
                disk_full: reason.contains(NO_SPACE_TEXT),
            }),
            None => Ok(()),
        }
    }

    /// Records that a failed write left the files unusable until reopened.
    fn note_failure(&self, error: &StoreError) {
        if error.poisons() {
            let mut reason = error.to_string();
            if error.is_disk_full() && !reason.contains(NO_SPACE_TEXT) {
                reason.push_str(": ");
                reason.push_str(NO_SPACE_TEXT);
            }
            tracing::error!(%error, "a write to the store's files failed; writes refused until they are reopened");
            self.poisoned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert(reason);
        }
    }

    /// Fails once a second stage has failed.
    fn check_due_side(due_side: &DueSide) -> Result<(), StoreError> {
        match &due_side.halted {
            Some(reason) => Err(StoreError::Halted(reason.clone())),
            None => Ok(()),
        }
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
        let due_side = self.lock_due_side();
        Self::check_due_side(&due_side)?;
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

    /// Waits until `frontier.redb` holds every group up to `lsn`.
    fn wait_for_due(&self, lsn: u64) -> Result<(), StoreError> {
        let mut due_side = self.lock_due_side();
        while due_side.lsn < lsn {
            Self::check_due_side(&due_side)?;
            due_side = self
                .due_applied
                .wait(due_side)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        Self::check_due_side(&due_side)
    }

    /// The writer lock, at a moment when `frontier.redb` holds every group
    /// staged. Never waits while holding the lock: a second stage may be
    /// waiting in the commit hook for a lock whose holder waits for this one.
    fn lock_drained_writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>, StoreError> {
        loop {
            let writer = self.lock_writer();
            writer.wal.check_writable()?;
            let staged = writer.wal.last_lsn();
            {
                let due_side = self.lock_due_side();
                Self::check_due_side(&due_side)?;
                if due_side.lsn >= staged {
                    return Ok(writer);
                }
            }
            drop(writer);
            self.wait_for_due(staged)?;
        }
    }

    /// Makes everything applied so far durable in both files and empties
    /// the log (at shutdown; otherwise groups do it every few seconds, see
    /// [`crate::wal::CHECKPOINT_INTERVAL`]). Waits for groups still in
    /// their second stage.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let mut writer = self.lock_drained_writer()?;
        let Writer { wal, queue_counts } = &mut *writer;
        let _due_side = self.lock_due_side();
        let files = self.files()?;
        Self::make_durable(&files.db, &files.urls_db, queue_counts, wal.last_lsn())?;
        *queue_counts = QueueCounts::default();
        wal.checkpointed();
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

    /// The schema version recorded in the file.
    pub fn schema_version(&self) -> Result<u64, StoreError> {
        let read = self.files()?.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta
            .get(SCHEMA_VERSION_KEY)?
            .map(|v| v.value())
            .unwrap_or(0))
    }

    /// The token a clean shutdown recorded after writing filter snapshots,
    /// if the store has not been written since.
    pub fn clean_shutdown_token(&self) -> Result<Option<u64>, StoreError> {
        let read = self.files()?.db.begin_read()?;
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
    /// synced, then applied to `urls.redb` with a non-durable commit (the
    /// sync comes first so that whatever a reader can see, a lookup
    /// answering "already known" say, is durable). Every
    /// [`crate::wal::CHECKPOINT_INTERVAL`] the group is a checkpoint: it
    /// waits until the groups before it are finished, is applied to both
    /// files, both are committed durably and the log emptied.
    ///
    /// Groups are staged by one thread at a time and finished in the order
    /// they were staged; a group's changes to `frontier.redb` are worked out
    /// here from what `urls.redb` held, so the next group can be staged
    /// while this one finishes.
    pub fn stage(&self, ops: &[WriteOp]) -> Result<StagedGroup, StoreError> {
        let checkpoint_due = {
            let writer = self.lock_writer();
            writer.wal.checkpoint_due()
        };
        let mut writer = if checkpoint_due {
            self.lock_drained_writer()?
        } else {
            self.lock_writer()
        };
        let Writer { wal, queue_counts } = &mut *writer;
        wal.check_writable()?;
        Self::check_due_side(&self.lock_due_side())?;
        self.check_poisoned()?;
        self.check_space()?;
        let lsn = wal.last_lsn() + 1;
        let record_start = wal.end();
        wal.append(lsn, ops)?;
        if let Err(error) = wal.sync() {
            wal.unappend(record_start);
            return Err(error.into());
        }
        let committed = Self::commit_urls(&self.files()?.urls_db, ops, lsn);
        let (results, changes, counts) = match committed {
            Ok(applied) => applied,
            Err(error) => {
                // The group is not in redb: its record goes, so that a
                // replay does not apply it ahead of later groups. If that
                // fails, writes halt and a restart replays it (the caller
                // was told it failed; storing it then is what a retry would
                // have done).
                wal.unappend(record_start);
                let _ = wal.sync();
                self.note_failure(&error);
                return Err(error);
            }
        };
        wal.set_last_lsn(lsn);
        queue_counts.absorb(counts);
        if !checkpoint_due {
            return Ok(StagedGroup {
                lsn,
                changes: Some(changes),
                results,
            });
        }
        let mut due_side = self.lock_due_side();
        let files = self.files()?;
        if let Err(error) = Self::commit_due(&files.db, &changes, lsn) {
            self.note_failure(&error);
            self.halt(&mut due_side, &error, lsn);
            return Err(error);
        }
        // The group is applied and its record synced: it stands whether or
        // not the checkpoint does. A checkpoint that fails keeps the log as
        // it is (it still holds every group since the last one), and the
        // files are reopened and the log replayed once they can be written.
        due_side.lsn = lsn;
        match Self::make_durable(&files.db, &files.urls_db, queue_counts, lsn) {
            Ok(()) => {
                *queue_counts = QueueCounts::default();
                wal.checkpointed();
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
        Self::check_due_side(&self.lock_due_side())?;
        let finished = self
            .files()
            .and_then(|files| Self::commit_due(&files.db, &changes, staged.lsn));
        let mut due_side = self.lock_due_side();
        if let Err(error) = finished {
            self.note_failure(&error);
            self.halt(&mut due_side, &error, staged.lsn);
            return Err(error);
        }
        due_side.lsn = staged.lsn;
        self.due_applied.notify_all();
        Ok(staged.results)
    }

    /// Applies a group to `urls.redb` in a non-durable commit: the log
    /// holds the group until a checkpoint.
    fn commit_urls(
        urls_db: &Database,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<(Vec<Applied>, Vec<DueChange>, GroupCounts), StoreError> {
        let mut write = urls_db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        let applied = Self::apply_urls_in(&write, ops, lsn)?;
        write.commit()?;
        Ok(applied)
    }

    /// Applies a group's changes to `frontier.redb` in a non-durable commit.
    fn commit_due(db: &Database, changes: &[DueChange], lsn: u64) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        Self::apply_due_in(&write, changes, lsn)?;
        write.commit()?;
        Ok(())
    }

    /// Stops writes after a group's second stage failed (`urls.redb` then
    /// holds a group `frontier.redb` does not), and wakes its waiters.
    fn halt(&self, due_side: &mut DueSide, error: &StoreError, lsn: u64) {
        tracing::error!(%error, lsn, "cannot apply a group to frontier.redb; writes halted until restart");
        due_side.halted.get_or_insert(error.to_string());
        self.due_applied.notify_all();
    }

    /// Applies a group's writes to `urls.redb` in `write` and records its
    /// log number; answers what each did, the changes `frontier.redb` must
    /// follow with, and what the group did to queue counts.
    fn apply_urls_in(
        write: &redb::WriteTransaction,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<(Vec<Applied>, Vec<DueChange>, GroupCounts), StoreError> {
        write.open_table(URLS_META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut changes = Vec::with_capacity(ops.len());
        // Queue count changes, summed per queue.
        let mut removed_queues = Vec::new();
        let mut deltas: std::collections::HashMap<(&str, String), (i64, i64)> =
            std::collections::HashMap::new();
        let mut urls = write.open_table(URLS)?;
        let mut indexed_results = Vec::with_capacity(ops.len());
        for index in apply_order(ops, |op| match op {
            WriteOp::Discover(new) => Some((new.partition, new.crawl.as_str(), new.url.as_str())),
            WriteOp::Known(known) => {
                Some((known.partition, known.crawl.as_str(), known.url.as_str()))
            }
            WriteOp::Delete(_) => None,
        }) {
            match &ops[index] {
                WriteOp::Discover(new) => {
                    let stored = Self::discover(&mut urls, new)?;
                    if stored {
                        changes.push(DueChange::Insert {
                            crawl: new.crawl.clone(),
                            queue: new.record.queue_key.clone(),
                            due_at: new.record.due_at,
                            url: new.url.clone(),
                            partition: new.partition,
                        });
                        let delta = deltas
                            .entry((new.crawl.as_str(), new.record.queue_key.clone()))
                            .or_default();
                        delta.0 += 1;
                    }
                    indexed_results.push((index, Applied::Discovered { stored }));
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
                            changes.push(DueChange::Remove {
                                crawl: known.crawl.clone(),
                                queue: old.queue_key.clone(),
                                due_at: old.due_at,
                                url: known.url.clone(),
                            });
                        }
                        let delta = deltas
                            .entry((known.crawl.as_str(), old.queue_key.clone()))
                            .or_default();
                        delta.0 -= 1;
                        delta.1 -= i64::from(old.is_completed());
                    }
                    if !record.is_completed() {
                        changes.push(DueChange::Insert {
                            crawl: known.crawl.clone(),
                            queue: queue_key.clone(),
                            due_at: record.due_at,
                            url: known.url.clone(),
                            partition: known.partition,
                        });
                    }
                    let delta = deltas
                        .entry((known.crawl.as_str(), queue_key.clone()))
                        .or_default();
                    delta.0 += 1;
                    delta.1 += i64::from(record.is_completed());
                    indexed_results.push((
                        index,
                        Applied::Known {
                            previous: previous.map(|old| (old.queue_key, old.due_at)),
                            queue_key,
                        },
                    ));
                }
                WriteOp::Delete(deletion) => {
                    let removed = Self::delete(&mut urls, deletion, &mut changes)?;
                    for (queue, (urls_removed, completed_removed)) in &removed.per_queue {
                        let delta = deltas
                            .entry((deletion.crawl.as_str(), queue.clone()))
                            .or_default();
                        delta.0 -= *urls_removed as i64;
                        delta.1 -= *completed_removed as i64;
                    }
                    if deletion.removes_queues() {
                        // Whole queues go, settings and all (and with no
                        // queue named, the crawl's scope and default delay),
                        // in the order of the writes: a URL stored after the
                        // deletion in the same group counts in a queue of
                        // its own.
                        let crawl = deletion.crawl.as_str();
                        changes.push(DueChange::RemoveQueues {
                            crawl: crawl.to_owned(),
                            queue: deletion.queue.clone(),
                        });
                        deltas.retain(|(delta_crawl, queue), _| {
                            *delta_crawl != crawl
                                || deletion.queue.as_ref().is_some_and(|named| named != queue)
                        });
                        removed_queues.push((crawl.to_owned(), deletion.queue.clone()));
                    }
                    indexed_results.push((index, Applied::Deleted(removed)));
                }
            }
        }
        indexed_results.sort_unstable_by_key(|(index, _)| *index);
        let results = indexed_results
            .into_iter()
            .map(|(_, applied)| applied)
            .collect();
        let mut counts = QueueCounts::default();
        for ((crawl, queue), (urls, completed)) in deltas {
            counts.add(crawl, &queue, urls, completed);
        }
        Ok((
            results,
            changes,
            GroupCounts {
                removed: removed_queues,
                changes: counts,
            },
        ))
    }

    /// Applies a group's changes to `frontier.redb` in `write` and records
    /// its log number.
    fn apply_due_in(
        write: &redb::WriteTransaction,
        changes: &[DueChange],
        lsn: u64,
    ) -> Result<(), StoreError> {
        write.open_table(META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut due = write.open_table(DUE)?;
        let mut queues = write.open_table(QUEUES)?;
        let mut seed_hosts = write.open_table(SEED_HOSTS)?;
        let mut crawl_settings = write.open_table(CRAWL_SETTINGS)?;
        for index in apply_order(changes, |change| match change {
            DueChange::Insert {
                crawl,
                queue,
                due_at,
                url,
                ..
            }
            | DueChange::Remove {
                crawl,
                queue,
                due_at,
                url,
            } => Some((crawl.as_str(), queue.as_str(), *due_at, url.as_str())),
            DueChange::RemoveQueues { .. } => None,
        }) {
            match &changes[index] {
                DueChange::Insert {
                    crawl,
                    queue,
                    due_at,
                    url,
                    partition,
                } => {
                    due.insert(
                        (crawl.as_str(), queue.as_str(), *due_at, url.as_str()),
                        *partition,
                    )?;
                }
                DueChange::Remove {
                    crawl,
                    queue,
                    due_at,
                    url,
                } => {
                    due.remove((crawl.as_str(), queue.as_str(), *due_at, url.as_str()))?;
                }
                DueChange::RemoveQueues { crawl, queue } => {
                    let crawl = crawl.as_str();
                    let doomed: Vec<String> = match queue {
                        Some(queue) => vec![queue.clone()],
                        None => names_under(&queues, crawl)?,
                    };
                    for queue in &doomed {
                        queues.remove((crawl, queue.as_str()))?;
                    }
                    if queue.is_none() {
                        for host in names_under(&seed_hosts, crawl)? {
                            seed_hosts.remove((crawl, host.as_str()))?;
                        }
                        crawl_settings.remove(crawl)?;
                    }
                }
            }
        }
        Ok(())
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

    /// Removes a deletion's URLs from `urls`, and adds the removal of their
    /// `due` entries to `changes`.
    fn delete(
        urls: &mut redb::Table<'_, (u32, &str, &str), &[u8]>,
        deletion: &Deletion,
        changes: &mut Vec<DueChange>,
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
                removed.urls += 1;
                *removed.per_partition.entry(partition).or_default() += 1;
                let per_queue = removed.per_queue.entry(queue.clone()).or_default();
                per_queue.0 += 1;
                per_queue.1 += u64::from(due_at == 0);
                if due_at != 0 {
                    changes.push(DueChange::Remove {
                        crawl: crawl.to_owned(),
                        queue,
                        due_at,
                        url,
                    });
                }
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
        let read = self.files()?.urls_db.begin_read()?;
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
            let writer = self.lock_drained_writer()?;
            (self.files()?.db.begin_read()?, writer.queue_counts.clone())
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

    /// Changes a queue's settings (not its counts, which stay held in
    /// memory until the next checkpoint), durably.
    pub fn update_queue_settings(
        &self,
        crawl: &str,
        queue: &str,
        change: impl FnOnce(&mut QueueRecord),
    ) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut queues = write.open_table(QUEUES)?;
            let mut record = match queues.get((crawl, queue))? {
                Some(bytes) => decode_queue(crawl, queue, bytes.value())?,
                None => QueueRecord::default(),
            };
            change(&mut record);
            queues.insert((crawl, queue), record.encode().as_slice())?;
            Ok(())
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
        let read = self.files()?.db.begin_read()?;
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
        let read = self.files()?.db.begin_read()?;
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
        let read = self.files()?.db.begin_read()?;
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
        let read = self.files()?.db.begin_read()?;
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
        let read = self.files()?.db.begin_read()?;
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
        let read = self.files()?.urls_db.begin_read()?;
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
        let read = self.files()?.urls_db.begin_read()?;
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
        let read = self.files()?.urls_db.begin_read()?;
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
        let read = self.files()?.urls_db.begin_read()?;
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

    /// The last log record `urls.redb` holds.
    #[cfg(test)]
    fn applied_lsn(&self) -> Result<u64, StoreError> {
        open::urls_lsn(&self.files()?.urls_db.begin_read()?)
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
    /// Appends records to a closed store's log where the store would
    /// write them next (a clean close checkpoints: from the first slot).
    fn leave_in_log(dir: &Path, records: &[(u64, Vec<WriteOp>)]) {
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

    fn known(url: &str, due_at: u64) -> WriteOp {
        WriteOp::Known(KnownUrl {
            crawl: "c".into(),
            url: url.into(),
            partition: 1,
            queue_key: None,
            default_queue: "q".into(),
            due_at,
            metadata: std::collections::BTreeMap::new(),
            now: 5,
        })
    }

    /// Copies the store's files as they are on disk now: what a kill at
    /// this moment would leave (the store is idle while they are copied).
    fn crash_image(from: &Path, to: &Path) {
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
                })])
                .unwrap();
            store
                .update_queue_settings("c", "q2", |record| record.delay_secs = Some(9))
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
        let due: Vec<String> = store
            .due_entries("c", "q", None, 10)
            .unwrap()
            .into_iter()
            .map(|(_, url, _)| url)
            .collect();
        assert_eq!(due, ["http://a/"]);
        let mut queues = Vec::new();
        store
            .for_each_queue(|_, queue, record| {
                queues.push((
                    queue.to_owned(),
                    record.urls,
                    record.completed,
                    record.delay_secs,
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
        assert_eq!(store.due_entries("c", "q", None, 10).unwrap().len(), 3);
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
        let due: Vec<String> = store
            .due_entries("c", "q", None, 10)
            .unwrap()
            .into_iter()
            .map(|(_, url, _)| url)
            .collect();
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
                urls.insert((1, "c", url.as_str()), record.encode().as_slice())
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
        assert_eq!(
            urls,
            [
                ("http://a/0".to_owned(), 10),
                ("http://a/1".to_owned(), 0),
                ("http://a/2".to_owned(), 12)
            ]
        );
        assert_eq!(store.due_entries("c", "q", None, 10).unwrap().len(), 2);
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
            assert!(!store.lock_writer().queue_counts.is_empty());
            assert_eq!(
                queue_counts(&store),
                [("q".to_owned(), 2, 0), ("q2".to_owned(), 1, 0)]
            );
            store
                .update_queue_settings("c", "q", |record| record.delay_secs = Some(7))
                .unwrap();
            // A settings write leaves the counts held, and both are seen.
            assert!(!store.lock_writer().queue_counts.is_empty());
            let mut delays = Vec::new();
            store
                .for_each_queue(|_, queue, record| {
                    delays.push((queue.to_owned(), record.urls, record.delay_secs))
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
