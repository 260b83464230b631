//! Why the store could not be opened or used: one error for the store,
//! naming the file and what the operator can do where there is something
//! to do.

use std::path::{Path, PathBuf};

use super::SCHEMA_VERSION;
use crate::record::RecordError;
use crate::wal::WalError;

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
    /// Partitioned a way this build does not know (a newer frontier's).
    #[error("{path} partitions its URLs in a way ({code}) this frontier does not know")]
    UnknownPartitioning {
        /// The store file.
        path: PathBuf,
        /// The recorded value.
        code: u64,
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
        "the disk holding {path} is full: {available_mb} MiB free, writes need at least {needed_mb} MiB (--min-free-mb, and twice what is held in memory for the files); nothing was stored. Free some space: writes resume by themselves"
    )]
    DiskFull {
        /// The data directory.
        path: PathBuf,
        /// MiB free for the frontier.
        available_mb: u64,
        /// MiB that must stay free.
        needed_mb: u64,
    },
    /// `frontier.redb` is older on disk than `urls.redb`, and the log does
    /// not hold the writes between (files restored from different
    /// moments); module `catch_up` mends the case the log covers.
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
    /// The store's crawl or queue numbers are damaged (see `names`).
    #[error("the store's crawl and queue numbers are damaged: {0}")]
    BadNames(String),
    /// A crawl's stored revisit policy cannot be read.
    #[error("the revisit policy stored for crawl {0:?} is damaged")]
    BadRevisitPolicy(String),
    /// A page of a partition was asked for after a crawl this store never
    /// held.
    #[error("crawl {0:?} is not one of this store's: a page can only follow a key the store gave")]
    UnknownCrawl(String),
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
    pub(super) fn poisons(&self) -> bool {
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
    redb::CommitError,
    redb::CompactionError
);

/// How a file that redb could not open is reported: another opener, or
/// the file and redb's reason.
pub(super) fn open_error(path: &Path) -> impl FnOnce(redb::DatabaseError) -> StoreError + '_ {
    move |source| match source {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen {
            path: path.to_owned(),
        },
        source => StoreError::Open {
            path: path.to_owned(),
            source,
        },
    }
}
