//! The store's files read without changing them, for the operator's tools
//! (`frontier verify`, `frontier salvage`): each file is opened on its own,
//! so one that is missing or damaged does not keep the others from being
//! read. A file closed cleanly is opened read-only; one left open by a
//! crash needs redb's recovery, which writes, so a copy of it in a scratch
//! directory is recovered and read instead.

use std::path::{Path, PathBuf};

use redb::{
    Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, TableHandle,
};

/// A store file opened for reading: read-only, or a recovered copy.
enum Handle {
    ReadOnly(ReadOnlyDatabase),
    Copy {
        db: Database,
        _scratch: tempfile::TempDir,
    },
}

impl Handle {
    fn begin_read(&self) -> Result<ReadTransaction, redb::TransactionError> {
        match self {
            Self::ReadOnly(db) => db.begin_read(),
            Self::Copy { db, .. } => db.begin_read(),
        }
    }

    fn recovered_copy(&self) -> bool {
        matches!(self, Self::Copy { .. })
    }
}

use super::error::open_error;
use super::names::Names;
use super::open::require_file;
use super::records::RecordsRead;
use super::schema::{
    CRAWL_SETTINGS, DUE, META, PARTITION_BY_KEY, PARTITIONS_KEY, QUEUES, SCHEMA_VERSION_KEY,
    SEED_HOSTS, SERVING_ORDER, SERVING_PAUSED_KEY, STORE_ID_KEY, URLS, URLS_META, main_lsns,
    open_if_exists, urls_lsn,
};
use super::{FILE_NAME, QueueRecord, StoreError, URLS_FILE_NAME, UrlHasher};
use crate::record::{RecordError, StoredEntry, UrlRecord};

/// `frontier.redb`, opened read-only.
pub struct MainFile {
    db: Handle,
    /// Its path.
    pub path: PathBuf,
    /// Its schema version (0: none recorded).
    pub schema: u64,
    /// Its store ID.
    pub store_id: Option<u64>,
    /// The last log record it holds.
    pub applied_lsn: u64,
    /// The partition count URL keys were made with, once recorded.
    pub partitions: Option<u32>,
    /// What URL keys' partitions follow, once recorded
    /// ([`crate::partitioning::PartitionBy::code`]).
    pub partition_by: Option<u64>,
    /// Whether serving was paused.
    pub paused: bool,
}

/// `urls.redb`, opened read-only.
pub struct UrlsFile {
    db: Handle,
    /// Its path.
    pub path: PathBuf,
    /// Its store ID.
    pub store_id: Option<u64>,
    /// The last log record it holds.
    pub applied_lsn: u64,
}

fn open_for_reading(path: &Path) -> Result<Handle, StoreError> {
    require_file(path, "is a file of the store")?;
    match ReadOnlyDatabase::open(path) {
        Ok(db) => Ok(Handle::ReadOnly(db)),
        Err(redb::DatabaseError::RepairAborted) => {
            let file_system = |source| StoreError::FileSystem {
                path: path.to_owned(),
                source,
            };
            let scratch = tempfile::tempdir().map_err(file_system)?;
            let copy = scratch.path().join(path.file_name().unwrap_or_default());
            std::fs::copy(path, &copy).map_err(file_system)?;
            let db = Database::open(&copy).map_err(open_error(path))?;
            Ok(Handle::Copy {
                db,
                _scratch: scratch,
            })
        }
        Err(source) => Err(open_error(path)(source)),
    }
}

/// Where one table's bytes go: what the figures of `frontier verify`
/// are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpace {
    /// The table's name.
    pub name: String,
    /// Its entries.
    pub rows: u64,
    /// Keys and values, as stored.
    pub stored: u64,
    /// Its B-tree's own bytes (branch pages, offsets in leaves).
    pub metadata: u64,
    /// Unused room inside its pages.
    pub fragmented: u64,
}

impl TableSpace {
    /// Every byte of the file the table takes.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.stored + self.metadata + self.fragmented
    }
}

/// The space each table of a file takes.
fn space_of(db: &Handle) -> Result<Vec<TableSpace>, StoreError> {
    let read = db.begin_read()?;
    let mut out = Vec::new();
    let handles: Vec<_> = read.list_tables()?.collect();
    for handle in handles {
        let name = handle.name().to_owned();
        let table = read.open_untyped_table(handle)?;
        let stats = table.stats()?;
        out.push(TableSpace {
            name,
            rows: table.len()?,
            stored: stats.stored_bytes(),
            metadata: stats.metadata_bytes(),
            fragmented: stats.fragmented_bytes(),
        });
    }
    Ok(out)
}

fn meta_value(
    db: &Handle,
    table: redb::TableDefinition<'_, &str, u64>,
    key: &str,
) -> Result<Option<u64>, StoreError> {
    let read = db.begin_read()?;
    Ok(match open_if_exists(&read, table)? {
        Some(meta) => meta.get(key)?.map(|v| v.value()),
        None => None,
    })
}

impl MainFile {
    /// Opens `frontier.redb` in `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(FILE_NAME);
        let db = open_for_reading(&path)?;
        let schema = meta_value(&db, META, SCHEMA_VERSION_KEY)?.unwrap_or(0);
        let store_id = meta_value(&db, META, STORE_ID_KEY)?;
        let partitions =
            meta_value(&db, META, PARTITIONS_KEY)?.map(|p| u32::try_from(p).unwrap_or(u32::MAX));
        let partition_by = meta_value(&db, META, PARTITION_BY_KEY)?;
        let paused = meta_value(&db, META, SERVING_PAUSED_KEY)? == Some(1);
        let (applied_lsn, _) = main_lsns(&db.begin_read()?)?;
        Ok(Self {
            db,
            path,
            schema,
            store_id,
            applied_lsn,
            partitions,
            partition_by,
            paused,
        })
    }

    /// Whether the file was left open by a crash, so a recovered copy is
    /// what is read.
    #[must_use]
    pub fn recovered_copy(&self) -> bool {
        self.db.recovered_copy()
    }

    /// The space each of its tables takes.
    pub fn space(&self) -> Result<Vec<TableSpace>, StoreError> {
        space_of(&self.db)
    }

    /// Every queue record, in key order; a damaged one is passed as the
    /// error. Answers how many entries were read.
    pub fn for_each_queue(
        &self,
        mut visit: impl FnMut(&str, &str, Result<QueueRecord, RecordError>),
    ) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, QUEUES)? else {
            return Ok(0);
        };
        let mut count = 0;
        for entry in table.iter()? {
            let (key, value) = entry?;
            let (crawl, queue) = key.value();
            visit(crawl, queue, QueueRecord::decode(value.value()));
            count += 1;
        }
        Ok(count)
    }

    /// How many entries the serving order has.
    pub fn count_serving_order(&self) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        if let Some(table) = open_if_exists(&read, SERVING_ORDER)? {
            return Ok(table.len()?);
        }
        Ok(match open_if_exists(&read, DUE)? {
            Some(table) => table.len()?,
            None => 0,
        })
    }

    /// The serving order of a store of schema 5 or older, which names each
    /// URL: (crawl, queue, due date, URL, partition). Answers how many. A
    /// store of this schema keys it by hashes, which name no URL: it
    /// answers 0.
    pub fn for_each_legacy_due(
        &self,
        mut visit: impl FnMut(&str, &str, u64, &str, u32),
    ) -> Result<u64, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, DUE)? else {
            return Ok(0);
        };
        let mut count = 0;
        for entry in table.iter()? {
            let (key, partition) = entry?;
            let (crawl, queue, due_at, url) = key.value();
            visit(crawl, queue, due_at, url, partition.value());
            count += 1;
        }
        Ok(count)
    }

    /// Every seed host: (crawl, host).
    pub fn seed_hosts(&self) -> Result<Vec<(String, String)>, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, SEED_HOSTS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, _) = entry?;
            let (crawl, host) = key.value();
            out.push((crawl.to_owned(), host.to_owned()));
        }
        Ok(out)
    }

    /// Every crawl's default delay (seconds).
    pub fn default_delays(&self) -> Result<Vec<(String, u32)>, StoreError> {
        let read = self.db.begin_read()?;
        let Some(table) = open_if_exists(&read, CRAWL_SETTINGS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (crawl, secs) = entry?;
            out.push((crawl.value().to_owned(), secs.value()));
        }
        Ok(out)
    }
}

impl UrlsFile {
    /// Opens `urls.redb` in `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(URLS_FILE_NAME);
        let db = open_for_reading(&path)?;
        let store_id = meta_value(&db, URLS_META, STORE_ID_KEY)?;
        let applied_lsn = urls_lsn(&db.begin_read()?)?;
        Ok(Self {
            db,
            path,
            store_id,
            applied_lsn,
        })
    }

    /// Whether the file was left open by a crash, so a recovered copy is
    /// what is read.
    #[must_use]
    pub fn recovered_copy(&self) -> bool {
        self.db.recovered_copy()
    }

    /// The space each of its tables takes.
    pub fn space(&self) -> Result<Vec<TableSpace>, StoreError> {
        space_of(&self.db)
    }

    /// Every URL record in key order: (partition, crawl, URL, the record or
    /// why it cannot be read). An error ends the scan where the file could
    /// not be read further. Reads the tables of this schema, or those of
    /// schema 5 and older in a file not converted yet.
    pub fn for_each_url(
        &self,
        mut visit: impl FnMut(u32, &str, &str, Result<UrlRecord, RecordError>),
    ) -> Result<UrlsScan, StoreError> {
        let read = self.db.begin_read()?;
        let mut scan = UrlsScan::default();
        if let Some(table) = open_if_exists(&read, URLS)? {
            for entry in table.iter()? {
                let (key, value) = entry?;
                let (partition, crawl, url) = key.value();
                let record = UrlRecord::decode(value.value());
                if record.as_ref().is_ok_and(|r| !r.is_completed()) {
                    scan.serving_keys += 1;
                }
                visit(partition, crawl, url, record);
                scan.urls += 1;
            }
            return Ok(scan);
        }
        let Some(records) = RecordsRead::open(&read)? else {
            return Ok(scan);
        };
        let names = Names::load(&read)?;
        let hasher = self.store_id.map(UrlHasher::new);
        for entry in records.iter()? {
            let ((partition, crawl_number, hash), value) = entry?;
            let crawl = names.crawl_name(crawl_number).map_or_else(
                || format!("(crawl number {crawl_number}, which has no name)"),
                str::to_owned,
            );
            let entries = match StoredEntry::decode_all(&value) {
                Ok(entries) => entries,
                Err(error) => {
                    visit(
                        partition,
                        &crawl,
                        &format!("(the URLs of hash {hash:016x})"),
                        Err(error),
                    );
                    scan.urls += 1;
                    continue;
                }
            };
            let mut due_keys: Vec<(u32, u64)> = Vec::new();
            for entry in &entries {
                scan.urls += 1;
                let Some((_, queue_key)) = names.queue_name(entry.queue) else {
                    visit(
                        partition,
                        &crawl,
                        &format!("(a URL of hash {hash:016x})"),
                        Err(RecordError::UnknownQueue(entry.queue)),
                    );
                    continue;
                };
                let url = entry.url(queue_key);
                if hasher.is_some_and(|hasher| hasher.hash(&url) != hash) {
                    visit(partition, &crawl, &url, Err(RecordError::WrongKey));
                    continue;
                }
                if !entry.is_completed() && !due_keys.contains(&(entry.queue, entry.due_at)) {
                    due_keys.push((entry.queue, entry.due_at));
                }
                visit(partition, &crawl, &url, entry.record(queue_key.to_owned()));
            }
            scan.serving_keys += due_keys.len() as u64;
        }
        Ok(scan)
    }
}

/// What a pass over `urls.redb` counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UrlsScan {
    /// URL entries read, damaged ones included.
    pub urls: u64,
    /// The serving order entries the URLs not completed need (URLs of one
    /// hash, queue and due date share one).
    pub serving_keys: u64,
}
