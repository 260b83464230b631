//! Opening a store: what an existing store must have, creation, migration
//! of older schemas, and the replay of the write-ahead log.
//!
//! An existing store is never reset. A missing, empty, foreign, damaged or
//! inconsistent file is refused with an error that names it and says what
//! the operator can do; nothing in the directory is removed or recreated.
//! The one exception is a creation that did not finish: it is marked by a
//! file written before the first store file and removed after the last, and
//! such a store never served a call, so its files are made again.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable};

use super::legacy::converted_urls_file;
use super::locks::{OrderedMutex, Rank};
use super::names::Names;
use super::queue_counts::QueueCounts;
use super::schema::{
    APPLIED_LSN_KEY, COUNTS_LSN_KEY, META, SCHEMA_VERSION_KEY, STORE_ID_KEY, URL_RECORDS, URLS,
    URLS_META, main_lsns, open_if_exists, urls_lsn,
};
use super::{
    DEFAULT_CACHE_BYTES, FILE_NAME, Files, SCHEMA_VERSION, Store, StoreError, URLS_FILE_NAME,
    UrlHasher, UrlKeys, Writer,
};
use crate::wal::{self, LogRecord, Wal, WalError};

/// Present while a store is being created: written before its first file,
/// removed after its last.
const CREATING_MARKER: &str = "store.creating";

/// Where a migration from a one-file schema writes the URLs before the file
/// takes its real name.
const MIGRATING_URLS: &str = "urls.redb.migrating";

const MAIN_HOLDS: &str =
    "holds the store's queues, settings, seeds and serving order (the due index)";
const URLS_HOLDS: &str = "holds every URL record of the store";

/// How a store is opened.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// The store's memory, in thirds: redb's page caches, split evenly
    /// between the two files; the writes held in memory since the
    /// applier's last turn, which wait for it at this bound; and the turn
    /// being written, which holds no more than that.
    pub cache_bytes: usize,
    /// Writes are refused with [`StoreError::DiskFull`] while less than
    /// this is free on the store's file system, so that redb never meets a
    /// full disk mid-transaction (a redb file that fails a write refuses
    /// every later call until it is reopened).
    pub min_free_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_bytes: DEFAULT_CACHE_BYTES,
            min_free_bytes: 0,
        }
    }
}

/// The oldest schema whose files this build reads as they are, up to
/// [`SCHEMA_VERSION`]: schema 6 wrote entries of version 3, which this
/// build reads; schema 7 had no `url_records_recent` table, which reads as
/// empty until the applier makes it.
pub const OLDEST_SCHEMA_READ_AS_IS: u64 = 6;

/// What `frontier.redb` says of itself before anything else is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Version 1 or 2: `urls` still in `frontier.redb`; version 1 had no log.
    OneFile { version: u64 },
    /// Version 3: two files, a log of format 1, no store ID.
    TwoFiles,
    /// Version 4 or 5: a store ID and the log of this version; each URL in
    /// two keys (module `legacy`).
    UrlKeyed,
    /// Version 6 or 7: read as they are ([`OLDEST_SCHEMA_READ_AS_IS`]).
    ReadAsIs { version: u64 },
    /// This version.
    Current,
}

/// A new store ID: random, never 0.
fn new_store_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = [0_u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes) | 1;
    }
    // No OS randomness: the standard library's per-process hash keys.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() | 1
}

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::FileSystem {
        path: path.to_owned(),
        source,
    }
}

fn exists(path: &Path) -> Result<bool, StoreError> {
    path.try_exists().map_err(file_error(path))
}

/// Fails unless `path` is there and not empty.
pub(super) fn require_file(path: &Path, holds: &'static str) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.len() == 0 => Err(StoreError::EmptyFile {
            path: path.to_owned(),
            holds,
        }),
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Err(StoreError::MissingFile {
                path: path.to_owned(),
                holds,
            })
        }
        Err(source) => Err(StoreError::FileSystem {
            path: path.to_owned(),
            source,
        }),
    }
}

fn remove_if_present(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StoreError::FileSystem {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A store ID from a `meta` table.
fn store_id_in(
    db: &impl ReadableDatabase,
    table: redb::TableDefinition<'_, &str, u64>,
) -> Result<Option<u64>, StoreError> {
    let read = db.begin_read()?;
    Ok(match open_if_exists(&read, table)? {
        Some(meta) => meta.get(STORE_ID_KEY)?.map(|v| v.value()),
        None => None,
    })
}

/// The records a start replays: those after `urls.redb`'s, which must
/// follow it without a gap and reach at least the one `frontier.redb`
/// holds; anything less lost acknowledged writes.
fn check_coverage<'a>(
    wal_path: &Path,
    urls_lsn: u64,
    due_lsn: u64,
    records: &'a [LogRecord],
) -> Result<Vec<&'a LogRecord>, StoreError> {
    let pending: Vec<&LogRecord> = records
        .iter()
        .filter(|record| record.lsn > urls_lsn)
        .collect();
    let gap = |durable: u64, first: u64| WalError::Gap {
        path: PathBuf::from(wal_path),
        durable,
        first,
    };
    if let Some(first) = pending.first()
        && first.lsn != urls_lsn.saturating_add(1)
    {
        return Err(gap(urls_lsn, urls_lsn.saturating_add(1)).into());
    }
    let last = pending.last().map_or(urls_lsn, |record| record.lsn);
    if last < due_lsn {
        return Err(gap(due_lsn, last.saturating_add(1)).into());
    }
    Ok(pending)
}

/// What the records kept for reports may take of `urls.redb`'s page cache
/// (`cache`): an eighth, which the file's cache gives up.
pub(super) fn recent_reads_limit(cache: usize) -> usize {
    cache / 8
}

/// `urls.redb`'s page cache, less what the records kept for reports take.
pub(super) fn urls_page_cache(cache: usize) -> usize {
    cache - recent_reads_limit(cache)
}

impl Store {
    /// Opens the store in `data_dir`, creating the directory and a new
    /// store when it holds none of the store's files.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(data_dir, StoreOptions::default())
    }

    /// Like [`Self::open`], with a memory budget of `cache_bytes` (see
    /// [`StoreOptions::cache_bytes`]).
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        Self::open_with(
            data_dir,
            StoreOptions {
                cache_bytes,
                ..StoreOptions::default()
            },
        )
    }

    /// Like [`Self::open`], with options.
    pub fn open_with(data_dir: &Path, options: StoreOptions) -> Result<Self, StoreError> {
        Self::open_with_hash_mask(data_dir, options, u64::MAX)
    }

    /// Like [`Self::open_with`], keeping only the bits of `hash_mask` of
    /// each URL's hash: tests keep few, so that URLs collide.
    pub(super) fn open_with_hash_mask(
        data_dir: &Path,
        options: StoreOptions,
        hash_mask: u64,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::CreateDir {
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join(FILE_NAME);
        let urls_path = data_dir.join(URLS_FILE_NAME);
        if exists(&data_dir.join(CREATING_MARKER))? {
            Self::discard_unfinished_creation(data_dir)?;
        }
        let mut any = false;
        for file in [&path, &urls_path, &wal::path_in(data_dir)] {
            any |= exists(file)?;
        }
        if !any {
            Self::create(data_dir)?;
        }
        require_file(&path, MAIN_HOLDS)?;
        // A third of the budget is the two files' page caches; the writes
        // held in memory take the other two (`Store::held_limit`).
        let cache = options.cache_bytes / 6;
        // `frontier.redb` first: its lock is what refuses a second server.
        let mut db = Self::open_file(&path, cache)?;
        let found = Self::check_schema(&db, &path)?;
        let mut urls_db = match found {
            Found::OneFile { .. } => Self::split_one_file(&db, data_dir, cache)?,
            _ => {
                require_file(&urls_path, URLS_HOLDS)?;
                Self::open_file(&urls_path, urls_page_cache(cache))?
            }
        };
        match found {
            Found::Current => {}
            Found::UrlKeyed => {
                let store_id = Self::check_one_store(&db, &urls_db, &path, &urls_path)?;
                Self::convert_url_keys(&db, &urls_db, store_id, true)?;
                tracing::info!(
                    path = %path.display(),
                    "store upgraded to schema {SCHEMA_VERSION} (each URL kept once, under its hash)"
                );
            }
            Found::ReadAsIs { version } => {
                let store_id = Self::check_one_store(&db, &urls_db, &path, &urls_path)?;
                Self::mark_read_as_is(&db, &urls_db, store_id)?;
                let what = if version == 6 {
                    "shorter URL entries, written as URLs change; new records merged into the rest a share at a time"
                } else {
                    "new records merged into the rest a share at a time"
                };
                tracing::info!(path = %path.display(), "store upgraded to schema {SCHEMA_VERSION} ({what})");
            }
            Found::TwoFiles => Self::upgrade_two_files(&db, &urls_db, data_dir, true)?,
            Found::OneFile { version } => {
                Self::upgrade_two_files(&db, &urls_db, data_dir, version >= 2)?;
            }
        }
        if !matches!(found, Found::Current | Found::ReadAsIs { .. }) {
            // The converted tables took fresh pages; the old ones' are free.
            db.compact()?;
            urls_db.compact()?;
        }
        let store_id = Self::check_one_store(&db, &urls_db, &path, &urls_path)?;
        let (mut wal, recovered) =
            Wal::open(data_dir, store_id, urls_lsn(&urls_db.begin_read()?)?)?;
        if recovered.torn_tail {
            tracing::warn!(
                path = %wal.path().display(),
                "the last record of the write-ahead log is incomplete: the write of a crash, never acknowledged; it is dropped"
            );
        }
        let hasher = UrlHasher {
            mask: hash_mask,
            ..UrlHasher::new(store_id)
        };
        let names = super::locks::OrderedRwLock::new(
            super::locks::Rank::Names,
            Names::load(&urls_db.begin_read()?)?,
        );
        let keys = UrlKeys {
            names: &names,
            hasher,
        };
        let last = Self::replay(&db, &urls_db, &keys, &path, wal.path(), &recovered.records)?;
        wal.set_last_lsn(last);
        wal.checkpointed();
        wal.keep_free(options.min_free_bytes);
        Ok(Self {
            files: super::files::StoreFiles::new(Files { db, urls_db }),
            cache_bytes: cache,
            path,
            min_free_bytes: options.min_free_bytes,
            writer: OrderedMutex::new(Rank::Writer, Writer { wal }),
            main_file: super::main_file::MainFile::new(last),
            names,
            hasher,
            applied_counts: OrderedMutex::with_default(Rank::Counts),
            held: super::held::HeldWrites::default(),
            recent_reads: super::recent_reads::RecentReads::new(recent_reads_limit(cache)),
        })
    }

    /// The store ID of both files, which must be one store's.
    fn check_one_store(
        db: &Database,
        urls_db: &Database,
        path: &Path,
        urls_path: &Path,
    ) -> Result<u64, StoreError> {
        let store_id = store_id_in(db, META)?.ok_or_else(|| StoreError::NotAFrontierStore {
            path: path.to_owned(),
        })?;
        match store_id_in(urls_db, URLS_META)? {
            Some(found) if found == store_id => Ok(store_id),
            found => Err(StoreError::OtherStore {
                path: urls_path.to_owned(),
                found: found.map_or_else(
                    || "no store".to_owned(),
                    |found| format!("store {found:016x}"),
                ),
                expected: store_id,
            }),
        }
    }

    /// Converts the URL tables of schemas 1 to 5 (module `legacy`): step 1
    /// unless `urls.redb` is converted already, then step 2, marking the
    /// version with it when `mark`.
    fn convert_url_keys(
        db: &Database,
        urls_db: &Database,
        store_id: u64,
        mark: bool,
    ) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let converted = match converted_urls_file(urls_db)? {
            Some(_) => None,
            None => Some(Self::convert_urls_file(urls_db, store_id)?),
        };
        let due = Self::rebuild_serving_order(db, urls_db, mark)?;
        tracing::info!(
            urls = converted,
            due,
            seconds = started.elapsed().as_secs_f64(),
            "converted the store's URL tables to numbered, hashed keys"
        );
        Ok(())
    }

    /// A store whose creation did not finish never served a call: its files
    /// are removed so that it is created again.
    fn discard_unfinished_creation(data_dir: &Path) -> Result<(), StoreError> {
        tracing::warn!(
            data_dir = %data_dir.display(),
            "a store creation did not finish here (it never served a call); creating it again"
        );
        for name in [
            FILE_NAME,
            URLS_FILE_NAME,
            wal::FILE_NAME,
            &format!("{}.new", wal::FILE_NAME),
        ] {
            remove_if_present(&data_dir.join(name))?;
        }
        let marker = data_dir.join(CREATING_MARKER);
        remove_if_present(&marker)?;
        wal::sync_dir(data_dir).map_err(file_error(data_dir))
    }

    /// Creates the files of a new store, `frontier.redb` last, inside the
    /// creation marker.
    fn create(data_dir: &Path) -> Result<(), StoreError> {
        let marker = data_dir.join(CREATING_MARKER);
        std::fs::File::create(&marker)
            .and_then(|file| file.sync_all())
            .and_then(|()| wal::sync_dir(data_dir))
            .map_err(file_error(&marker))?;
        let store_id = new_store_id();
        let urls_path = data_dir.join(URLS_FILE_NAME);
        let urls_db = Self::create_file(&urls_path)?;
        Self::write_urls_meta(&urls_db, store_id, 0)?;
        drop(urls_db);
        Wal::create(data_dir, store_id)?;
        let path = data_dir.join(FILE_NAME);
        let db = Self::create_file(&path)?;
        Self::mark_current(&db, store_id)?;
        drop(db);
        std::fs::remove_file(&marker).map_err(file_error(&marker))?;
        wal::sync_dir(data_dir).map_err(file_error(data_dir))
    }

    fn create_file(path: &Path) -> Result<Database, StoreError> {
        Database::builder()
            .create(path)
            .map_err(|source| StoreError::Open {
                path: path.to_owned(),
                source,
            })
    }

    /// Opens an existing file (never creates one).
    pub(super) fn open_file(path: &Path, cache_bytes: usize) -> Result<Database, StoreError> {
        Database::builder()
            .set_cache_size(cache_bytes)
            .open(path)
            .map_err(super::error::open_error(path))
    }

    /// Writes `urls.redb`'s store ID and applied LSN, durably.
    fn write_urls_meta(urls_db: &Database, store_id: u64, lsn: u64) -> Result<(), StoreError> {
        let mut write = urls_db.begin_write()?;
        write.set_quick_repair(true);
        {
            let mut meta = write.open_table(URLS_META)?;
            meta.insert(STORE_ID_KEY, store_id)?;
            meta.insert(APPLIED_LSN_KEY, lsn)?;
            meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
            write.open_table(URL_RECORDS)?;
        }
        write.commit()?;
        Ok(())
    }

    /// Marks `frontier.redb` as of this schema and this store, durably.
    fn mark_current(db: &Database, store_id: u64) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_quick_repair(true);
        {
            let mut meta = write.open_table(META)?;
            meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
            meta.insert(STORE_ID_KEY, store_id)?;
        }
        write.commit()?;
        Ok(())
    }

    /// Schema 6 or 7 to this one: what they hold reads as it is, but from
    /// now on entries are written in version 4 (which builds of schema 6
    /// cannot read) and records land in `url_records_recent` first (which
    /// builds of schema 7 would not read). So both files are marked,
    /// `urls.redb` first (a crash between the two leaves `frontier.redb`
    /// saying the old version, and the next open marks both again), each
    /// durably before anything is written in the new version.
    fn mark_read_as_is(db: &Database, urls_db: &Database, store_id: u64) -> Result<(), StoreError> {
        let mut write = urls_db.begin_write()?;
        write.set_quick_repair(true);
        write
            .open_table(URLS_META)?
            .insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
        write.commit()?;
        Self::mark_current(db, store_id)
    }

    fn check_schema(db: &Database, path: &Path) -> Result<Found, StoreError> {
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
            Some(SCHEMA_VERSION) => Ok(Found::Current),
            Some(version @ OLDEST_SCHEMA_READ_AS_IS..SCHEMA_VERSION) => {
                Ok(Found::ReadAsIs { version })
            }
            Some(4..=5) => Ok(Found::UrlKeyed),
            Some(3) => Ok(Found::TwoFiles),
            Some(version @ 1..=2) => Ok(Found::OneFile { version }),
            // No version: not a file this frontier wrote (creations are
            // marked, so an unfinished one never gets here).
            _ => Err(StoreError::NotAFrontierStore {
                path: path.to_owned(),
            }),
        }
    }

    /// Moves `urls` out of a version 1 or 2 `frontier.redb` into
    /// `urls.redb`: written under another name and made durable, renamed,
    /// and only then does `frontier.redb` drop its copy and take version 3
    /// in one durable commit. A crash anywhere leaves the old store whole
    /// (what a `urls.redb` beside it holds is a copy, made again) or the new
    /// one.
    fn split_one_file(
        db: &Database,
        data_dir: &Path,
        cache_bytes: usize,
    ) -> Result<Database, StoreError> {
        let started = std::time::Instant::now();
        let staging = data_dir.join(MIGRATING_URLS);
        let urls_path = data_dir.join(URLS_FILE_NAME);
        remove_if_present(&staging)?;
        let (lsn, _) = main_lsns(&db.begin_read()?)?;
        let mut moved = 0_u64;
        {
            let urls_db = Self::create_file(&staging)?;
            let read = db.begin_read()?;
            let mut write = urls_db.begin_write()?;
            write.set_quick_repair(true);
            {
                let mut meta = write.open_table(URLS_META)?;
                meta.insert(APPLIED_LSN_KEY, lsn)?;
                let mut urls = write.open_table(URLS)?;
                if let Some(table) = open_if_exists(&read, URLS)? {
                    for entry in table.iter()? {
                        let (key, value) = entry?;
                        urls.insert(key.value(), value.value())?;
                        moved += 1;
                    }
                }
            }
            write.commit()?;
        }
        std::fs::rename(&staging, &urls_path).map_err(file_error(&urls_path))?;
        wal::sync_dir(data_dir).map_err(file_error(data_dir))?;
        let mut write = db.begin_write()?;
        write.set_quick_repair(true);
        {
            let mut meta = write.open_table(META)?;
            meta.insert(SCHEMA_VERSION_KEY, 3)?;
            // Queue counts were written with every durable commit.
            meta.insert(COUNTS_LSN_KEY, lsn)?;
            meta.insert(APPLIED_LSN_KEY, lsn)?;
        }
        write.delete_table(URLS)?;
        write.commit()?;
        tracing::info!(
            urls = moved,
            path = %urls_path.display(),
            seconds = started.elapsed().as_secs_f64(),
            "moved the urls table to its own file"
        );
        Self::open_file(&urls_path, urls_page_cache(cache_bytes))
    }

    /// From version 3 (or 1 and 2, once split): the URL tables are
    /// converted (module `legacy`), the log of format 1 replayed, both
    /// files made durable, then the store gets its ID: in `urls.redb`, in a
    /// new log (renamed over the old one), and last in `frontier.redb` with
    /// the version mark. Until that mark the store is version 3 and this
    /// runs again, with the ID the converted `urls.redb` holds; the log it
    /// finds then may be the new one, with no records.
    fn upgrade_two_files(
        db: &Database,
        urls_db: &Database,
        data_dir: &Path,
        log_required: bool,
    ) -> Result<(), StoreError> {
        let path = data_dir.join(FILE_NAME);
        let store_id = match converted_urls_file(urls_db)? {
            Some(store_id) => store_id,
            None => new_store_id(),
        };
        Self::convert_url_keys(db, urls_db, store_id, false)?;
        let records = match wal::read_records(data_dir, urls_lsn(&urls_db.begin_read()?)?) {
            Ok(recovered) => recovered.records,
            Err(WalError::Missing { .. }) if !log_required => Vec::new(),
            Err(error) => return Err(error.into()),
        };
        let names = super::locks::OrderedRwLock::new(
            super::locks::Rank::Names,
            Names::load(&urls_db.begin_read()?)?,
        );
        let keys = UrlKeys {
            names: &names,
            hasher: UrlHasher::new(store_id),
        };
        let last = Self::replay(db, urls_db, &keys, &path, &wal::path_in(data_dir), &records)?;
        Self::write_urls_meta(urls_db, store_id, last)?;
        Wal::create(data_dir, store_id)?;
        Self::mark_current(db, store_id)?;
        tracing::info!(
            path = %path.display(),
            "store upgraded to schema {SCHEMA_VERSION} (a store ID, a log of format 2, each URL kept once)"
        );
        Ok(())
    }

    /// Applies the log's records the files do not hold yet, then commits
    /// both durably; answers the last LSN they hold. `frontier.redb` may be
    /// ahead of `urls.redb` (it is made durable first, and settings changes
    /// make it durable between checkpoints): a record it holds is applied
    /// to `urls.redb` only, and queue counts are added only for records
    /// after those the `queues` table holds. Every record from the one
    /// after `urls.redb`'s up to the one `frontier.redb` holds must be in
    /// the log: a log that lacks them lost acknowledged writes. A
    /// `frontier.redb` behind `urls.redb` is first caught up (module
    /// `catch_up`).
    pub(super) fn replay(
        db: &Database,
        urls_db: &Database,
        keys: &UrlKeys<'_>,
        path: &Path,
        wal_path: &Path,
        records: &[LogRecord],
    ) -> Result<u64, StoreError> {
        let urls_lsn = urls_lsn(&urls_db.begin_read()?)?;
        let (mut due_lsn, mut counts_lsn) = main_lsns(&db.begin_read()?)?;
        if due_lsn < urls_lsn {
            Self::catch_up_main_file(db, urls_db, path, records, due_lsn, urls_lsn)?;
            (due_lsn, counts_lsn) = (urls_lsn, urls_lsn);
        }
        let pending = check_coverage(wal_path, urls_lsn, due_lsn, records)?;
        let last = pending.last().map_or(urls_lsn, |record| record.lsn);
        let mut queue_counts = QueueCounts::default();
        for record in &pending {
            let (_, changes, counts) = Self::commit_urls(urls_db, keys, &record.ops, record.lsn)?;
            if record.lsn > due_lsn {
                Self::commit_main_file(db, &changes, record.lsn)?;
            }
            if record.lsn > counts_lsn {
                queue_counts.absorb(counts);
            }
        }
        Self::make_durable(db, urls_db, &queue_counts, last)?;
        if !pending.is_empty() {
            tracing::info!(
                records = pending.len(),
                ops = pending.iter().map(|r| r.ops.len()).sum::<usize>(),
                "replayed the write-ahead log"
            );
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::super::inspect;
    use super::super::tests::discovered;
    use super::*;

    /// A store killed after acknowledging `urls` (so they are in the log
    /// only), as a copy of its files at that moment.
    fn killed_store_with(urls: &[&str]) -> tempfile::TempDir {
        let live = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        let store = Store::open(live.path()).unwrap();
        for url in urls {
            store.apply(&[discovered(url)]).unwrap();
        }
        for name in [FILE_NAME, URLS_FILE_NAME, wal::FILE_NAME] {
            std::fs::copy(live.path().join(name), image.path().join(name)).unwrap();
        }
        drop(store);
        image
    }

    /// The URLs a store holds, sorted.
    fn stored_urls(store: &Store) -> Vec<String> {
        let mut urls = Vec::new();
        store
            .for_each_url(|_, _, url, _| urls.push(url.to_owned()))
            .unwrap();
        urls.sort();
        urls
    }

    fn listing(dir: &Path) -> Vec<(String, u64)> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                (
                    entry.file_name().to_string_lossy().into_owned(),
                    entry.metadata().unwrap().len(),
                )
            })
            .collect();
        files.sort();
        files
    }

    /// Opening must fail with `expected`, remove or create no file, and
    /// leave the log byte for byte as it was (redb's own crash recovery
    /// may have run on its files: it changes no record).
    fn refused(dir: &Path, expected: impl Fn(&StoreError) -> bool) -> StoreError {
        let names = |dir: &Path| -> Vec<String> {
            listing(dir).into_iter().map(|(name, _)| name).collect()
        };
        let log = || std::fs::read(dir.join(wal::FILE_NAME)).ok();
        let (files_before, log_before) = (names(dir), log());
        let error = Store::open(dir).unwrap_err();
        assert!(expected(&error), "unexpected error: {error}");
        assert_eq!(
            names(dir),
            files_before,
            "a refused store lost or gained a file"
        );
        assert!(log() == log_before, "a refused store's log was changed");
        error
    }

    #[test]
    fn a_killed_store_replays_every_acknowledged_url() {
        let image = killed_store_with(&["http://a/", "http://b/"]);
        let store = Store::open(image.path()).unwrap();
        assert_eq!(stored_urls(&store), ["http://a/", "http://b/"]);
    }

    #[test]
    fn a_missing_main_file_is_refused_and_the_others_kept() {
        let image = killed_store_with(&["http://a/"]);
        std::fs::remove_file(image.path().join(FILE_NAME)).unwrap();
        let error = refused(image.path(), |e| {
            matches!(e, StoreError::MissingFile { .. })
        });
        let text = error.to_string();
        assert!(
            text.contains("frontier.redb") && text.contains("salvage"),
            "{text}"
        );
    }

    #[test]
    fn empty_store_files_are_refused() {
        for name in [FILE_NAME, URLS_FILE_NAME] {
            let image = killed_store_with(&["http://a/"]);
            std::fs::write(image.path().join(name), b"").unwrap();
            let error = refused(image.path(), |e| matches!(e, StoreError::EmptyFile { .. }));
            assert!(error.to_string().contains(name), "{error}");
        }
        let image = killed_store_with(&["http://a/"]);
        std::fs::write(image.path().join(wal::FILE_NAME), b"").unwrap();
        refused(image.path(), |e| {
            matches!(e, StoreError::Wal(WalError::NotALog { .. }))
        });
    }

    #[test]
    fn a_missing_or_shortened_log_is_refused() {
        let image = killed_store_with(&["http://a/", "http://b/"]);
        let log = image.path().join(wal::FILE_NAME);
        let bytes = std::fs::read(&log).unwrap();
        std::fs::write(&log, &bytes[..bytes.len() / 2]).unwrap();
        refused(image.path(), |e| {
            matches!(e, StoreError::Wal(WalError::Shortened { .. }))
        });
        std::fs::remove_file(&log).unwrap();
        let error = refused(image.path(), |e| {
            matches!(e, StoreError::Wal(WalError::Missing { .. }))
        });
        assert!(error.to_string().contains("frontier.wal"), "{error}");
    }

    #[test]
    fn a_damaged_log_record_before_intact_ones_is_refused() {
        let image = killed_store_with(&["http://a/", "http://b/", "http://c/"]);
        let log = image.path().join(wal::FILE_NAME);
        let mut bytes = std::fs::read(&log).unwrap();
        // Inside the first record's payload.
        bytes[wal::HEADER_LEN as usize + 20] ^= 0x10;
        std::fs::write(&log, &bytes).unwrap();
        let error = refused(image.path(), |e| {
            matches!(e, StoreError::Wal(WalError::Corrupt { .. }))
        });
        assert!(error.to_string().contains("salvage"), "{error}");
    }

    #[test]
    fn a_file_of_another_store_is_refused() {
        let first = killed_store_with(&["http://a/"]);
        let second = killed_store_with(&["http://b/"]);
        std::fs::copy(
            second.path().join(URLS_FILE_NAME),
            first.path().join(URLS_FILE_NAME),
        )
        .unwrap();
        refused(first.path(), |e| matches!(e, StoreError::OtherStore { .. }));
        let third = killed_store_with(&["http://c/"]);
        std::fs::copy(
            second.path().join(wal::FILE_NAME),
            third.path().join(wal::FILE_NAME),
        )
        .unwrap();
        refused(third.path(), |e| {
            matches!(e, StoreError::Wal(WalError::OtherStore { .. }))
        });
    }

    /// `urls.redb` behind `frontier.redb` with the log records between them
    /// gone loses acknowledged writes: refused.
    #[test]
    fn a_log_that_does_not_reach_the_main_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[discovered("http://a/")]).unwrap();
        drop(store);
        let main = inspect::MainFile::open(dir.path()).unwrap();
        let (store_id, lsn) = (main.store_id.unwrap(), main.applied_lsn);
        drop(main);
        // urls.redb as it was before the last group.
        let urls_db = Database::open(dir.path().join(URLS_FILE_NAME)).unwrap();
        Store::write_urls_meta(&urls_db, store_id, lsn - 1).unwrap();
        drop(urls_db);
        // A log of this store without the record.
        Wal::create(dir.path(), store_id).unwrap();
        refused(dir.path(), |e| {
            matches!(e, StoreError::Wal(WalError::Gap { .. }))
        });
    }

    #[test]
    fn an_unfinished_creation_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CREATING_MARKER), b"").unwrap();
        std::fs::write(dir.path().join(URLS_FILE_NAME), b"partial").unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[discovered("http://a/")]).unwrap();
        drop(store);
        assert!(!dir.path().join(CREATING_MARKER).exists());
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(stored_urls(&store), ["http://a/"]);
    }

    /// A version 3 store (no store ID, a log of format 1 with records to
    /// replay) is upgraded in place, the records kept.
    #[test]
    fn a_version_3_store_is_upgraded_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let db = Database::open(dir.path().join(FILE_NAME)).unwrap();
        let write = db.begin_write().unwrap();
        {
            let mut meta = write.open_table(META).unwrap();
            meta.insert(SCHEMA_VERSION_KEY, 3).unwrap();
            meta.remove(STORE_ID_KEY).unwrap();
        }
        write.commit().unwrap();
        drop(db);
        let urls_db = Database::open(dir.path().join(URLS_FILE_NAME)).unwrap();
        let write = urls_db.begin_write().unwrap();
        write
            .open_table(URLS_META)
            .unwrap()
            .remove(STORE_ID_KEY)
            .unwrap();
        write.commit().unwrap();
        let lsn = urls_lsn(&urls_db.begin_read().unwrap()).unwrap();
        drop(urls_db);
        let payload = wal::encode_ops(&[discovered("http://logged/")]);
        let mut log = b"FRWAL\0\0\x01".to_vec();
        log.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&(lsn + 1).to_le_bytes());
        crc.update(&payload);
        log.extend_from_slice(&crc.finalize().to_le_bytes());
        log.extend_from_slice(&(lsn + 1).to_le_bytes());
        log.extend_from_slice(&payload);
        std::fs::write(dir.path().join(wal::FILE_NAME), &log).unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(stored_urls(&store), ["http://logged/"]);
        store.apply(&[discovered("http://after/")]).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(stored_urls(&store), ["http://after/", "http://logged/"]);
    }

    /// The schema `urls.redb` is marked with.
    fn urls_schema(dir: &Path) -> Option<u64> {
        let urls_db = Database::open(dir.join(URLS_FILE_NAME)).unwrap();
        let read = urls_db.begin_read().unwrap();
        let meta = read.open_table(URLS_META).unwrap();
        meta.get(SCHEMA_VERSION_KEY).unwrap().map(|v| v.value())
    }

    /// The versions of the entries `url_records` holds, in key order.
    fn entry_versions(dir: &Path) -> Vec<bool> {
        let urls_db = Database::open(dir.join(URLS_FILE_NAME)).unwrap();
        let read = urls_db.begin_read().unwrap();
        let table = read.open_table(URL_RECORDS).unwrap();
        let mut versions = Vec::new();
        for item in table.iter().unwrap() {
            let (_, value) = item.unwrap();
            for entry in crate::record::StoredEntry::decode_all(value.value()).unwrap() {
                versions.push(entry.is_version_3());
            }
        }
        versions
    }

    /// A store of schema 6 (entries of version 3) opens as it is, is marked
    /// with this schema in both files, and writes a URL's entry in version
    /// 4 when it changes, the others staying as they were.
    #[test]
    fn a_schema_6_store_keeps_its_entries_and_is_marked_this_schema() {
        use super::super::tests::{due_urls, known, queue_counts};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .apply(&[discovered("http://a/"), discovered("http://b/")])
            .unwrap();
        // Made a store of schema 6: both files marked 6, entries of
        // version 3.
        store.set_schema_version(6).unwrap();
        drop(store);
        let urls_db = Database::open(dir.path().join(URLS_FILE_NAME)).unwrap();
        let write = urls_db.begin_write().unwrap();
        {
            let mut table = write.open_table(URL_RECORDS).unwrap();
            let mut values = Vec::new();
            for item in table.iter().unwrap() {
                let (key, value) = item.unwrap();
                let mut old = Vec::new();
                for entry in crate::record::StoredEntry::decode_all(value.value()).unwrap() {
                    let record = entry.record(String::new()).unwrap();
                    entry.encode_again_as_version_3(&record, &mut old);
                }
                assert!(old.len() > value.value().len());
                values.push((key.value(), old));
            }
            for (key, value) in values {
                table.insert(key, value.as_slice()).unwrap();
            }
            write
                .open_table(URLS_META)
                .unwrap()
                .insert(SCHEMA_VERSION_KEY, 6)
                .unwrap();
        }
        write.commit().unwrap();
        drop(urls_db);
        assert_eq!(entry_versions(dir.path()), [true, true]);
        // Verified as it is, with the start that marks it named.
        let report = crate::repair::verify(dir.path());
        assert!(report.healthy(), "{:?}", report.problems);
        assert!(
            report
                .findings
                .iter()
                .any(|line| line.contains(&format!("marks it {SCHEMA_VERSION} at its next start"))),
            "{:?}",
            report.findings
        );

        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(due_urls(&store), ["http://a/", "http://b/"]);
        let mut records = Vec::new();
        store
            .for_each_url(|_, _, url, record| records.push((url.to_owned(), record.clone())))
            .unwrap();
        records.sort_by(|a, b| a.0.cmp(&b.0));
        for (url, record) in &records {
            assert_eq!((record.created_at, record.due_at), (5, 10), "{url}");
            assert_eq!(record.queue_key, "q");
        }
        // "a" rescheduled: its entry is written again, in version 4.
        store.apply(&[known("http://a/", 20)]).unwrap();
        drop(store);
        assert_eq!(urls_schema(dir.path()), Some(SCHEMA_VERSION));
        let mut versions = entry_versions(dir.path());
        versions.sort_unstable();
        assert_eq!(versions, [false, true]);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(due_urls(&store), ["http://a/", "http://b/"]);
        assert_eq!(queue_counts(&store), [("q".to_owned(), 2, 0)]);
        let mut due = Vec::new();
        store
            .for_each_url(|_, _, url, record| due.push((url.to_owned(), record.due_at)))
            .unwrap();
        due.sort();
        assert_eq!(
            due,
            [("http://a/".to_owned(), 20), ("http://b/".to_owned(), 10)]
        );
    }

    /// A store of schema 7 (no `url_records_recent` table) is verified as
    /// it is, opens with every URL, and is marked with this schema in both
    /// files.
    #[test]
    fn a_schema_7_store_opens_as_it_is_and_is_marked_this_schema() {
        use super::super::tests::due_urls;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .apply(&[discovered("http://a/"), discovered("http://b/")])
            .unwrap();
        store.set_schema_version(7).unwrap();
        drop(store);
        let urls_db = Database::open(dir.path().join(URLS_FILE_NAME)).unwrap();
        let write = urls_db.begin_write().unwrap();
        write
            .delete_table(super::super::schema::URL_RECORDS_RECENT)
            .unwrap();
        write
            .open_table(URLS_META)
            .unwrap()
            .insert(SCHEMA_VERSION_KEY, 7)
            .unwrap();
        write.commit().unwrap();
        drop(urls_db);
        assert_eq!(urls_schema(dir.path()), Some(7));
        let report = crate::repair::verify(dir.path());
        assert!(report.healthy(), "{:?}", report.problems);
        assert!(
            report.findings.iter().any(|line| line.contains(&format!(
                "schema 7, read as it is; `frontier serve` marks it {SCHEMA_VERSION}"
            ))),
            "{:?}",
            report.findings
        );
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(due_urls(&store), ["http://a/", "http://b/"]);
        drop(store);
        assert_eq!(urls_schema(dir.path()), Some(SCHEMA_VERSION));
    }

    /// A crash between marking the two files leaves `frontier.redb` at 6
    /// and `urls.redb` at this schema: the next open marks both.
    #[test]
    fn a_schema_6_mark_cut_short_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[discovered("http://a/")]).unwrap();
        store.set_schema_version(6).unwrap();
        drop(store);
        assert_eq!(urls_schema(dir.path()), Some(SCHEMA_VERSION));
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(stored_urls(&store), ["http://a/"]);
    }
}
