//! The URL tables of schemas 1 to 5, and their conversion to this schema.
//!
//! Those stores kept each URL in two keys: `urls` (partition, crawl ID,
//! URL) → record, and `due` (crawl ID, queue key, due date, URL) →
//! partition. Schema 6 on keeps it once: `url_records` is keyed by
//! numbers and the URL's hash, and `serving_order` by (queue number, due
//! date, hash). Converting reads every record, so it takes as long as a
//! pass over the store; it runs once, at the first open by a build of
//! schema 6 or later.
//!
//! It is done in two durable commits, one per file, each of which can be
//! cut short and run again:
//!
//! 1. `urls.redb`: the records are written to `url_records` (crawl and
//!    queue numbers given as they come), `urls` is dropped, and the file's
//!    own `meta` is marked converted, with the store ID that seeds the
//!    hashes, all in one transaction. A file marked converted is not
//!    converted again.
//! 2. `frontier.redb`: `due` is dropped and `serving_order` built from
//!    `url_records`, and the file takes the log position of `urls.redb`
//!    (the serving order now says what that file says, whatever settings
//!    writes had made durable beyond it) and, for schemas 4 and 5, the
//!    version mark. The log's records after that position are replayed as
//!    at any start.
//!
//! Both files are then compacted: the converted tables are about half the
//! size of the old ones, and a redb file keeps freed pages for later
//! writes unless compacted.

use redb::{Database, ReadableDatabase, ReadableTable};

use super::names::Names;
use super::records::RecordsRead;
use super::schema::{
    APPLIED_LSN_KEY, DUE, META, SERVING_ORDER, STORE_ID_KEY, URL_RECORDS, URLS, URLS_META,
    open_if_exists, urls_lsn,
};
use super::{NewUrl, Store, StoreError, UrlHasher, UrlKeys, WriteOp, decode_record};
use crate::record::StoredEntry;

/// Legacy records converted per call of the apply step (the transaction
/// is one; this bounds what is held in memory).
const CONVERT_BATCH: usize = 4096;

/// Whether `urls.redb` holds records of this schema; answers its store ID
/// if so.
pub(super) fn converted_urls_file(urls_db: &Database) -> Result<Option<u64>, StoreError> {
    let read = urls_db.begin_read()?;
    let Some(meta) = open_if_exists(&read, URLS_META)? else {
        return Ok(None);
    };
    // Schemas 6 and 7 laid `url_records` out as this one reads it.
    let version = meta.get(super::SCHEMA_VERSION_KEY)?.map(|v| v.value());
    if !version
        .is_some_and(|v| (super::OLDEST_SCHEMA_READ_AS_IS..=super::SCHEMA_VERSION).contains(&v))
    {
        return Ok(None);
    }
    Ok(meta.get(STORE_ID_KEY)?.map(|v| v.value()))
}

impl Store {
    /// Step 1: `urls.redb`'s records to `url_records`, keyed with hashes
    /// seeded by `store_id`, in one durable transaction. Answers how many
    /// records were converted.
    pub(super) fn convert_urls_file(urls_db: &Database, store_id: u64) -> Result<u64, StoreError> {
        let lsn = urls_lsn(&urls_db.begin_read()?)?;
        let names = super::locks::OrderedRwLock::new(super::locks::Rank::Names, Names::default());
        let keys = UrlKeys {
            names: &names,
            hasher: UrlHasher::new(store_id),
        };
        let mut write = urls_db.begin_write()?;
        write.set_quick_repair(true);
        let mut converted = 0_u64;
        let mut after: Option<(u32, String, String)> = None;
        loop {
            let batch = Self::legacy_batch(&write, after.as_ref())?;
            let Some(last) = batch.last() else {
                break;
            };
            after = Some((last.partition, last.crawl.clone(), last.url.clone()));
            converted += batch.len() as u64;
            let ops: Vec<WriteOp> = batch.into_iter().map(WriteOp::Discover).collect();
            Self::apply_urls_in(&write, &keys, &ops, lsn)?;
        }
        write.delete_table(URLS)?;
        {
            let mut meta = write.open_table(URLS_META)?;
            meta.insert(super::SCHEMA_VERSION_KEY, super::SCHEMA_VERSION)?;
            meta.insert(STORE_ID_KEY, store_id)?;
            meta.insert(APPLIED_LSN_KEY, lsn)?;
            write.open_table(URL_RECORDS)?;
        }
        write.commit()?;
        Ok(converted)
    }

    /// The next legacy records after `after`, as URLs to store whole.
    fn legacy_batch(
        write: &redb::WriteTransaction,
        after: Option<&(u32, String, String)>,
    ) -> Result<Vec<NewUrl>, StoreError> {
        let table = match write.open_table(URLS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        };
        let start = match after {
            Some((partition, crawl, url)) => {
                std::ops::Bound::Excluded((*partition, crawl.as_str(), url.as_str()))
            }
            None => std::ops::Bound::Unbounded,
        };
        let mut batch = Vec::with_capacity(CONVERT_BATCH);
        for entry in table
            .range::<(u32, &str, &str)>((start, std::ops::Bound::Unbounded))?
            .take(CONVERT_BATCH)
        {
            let (key, value) = entry?;
            let (partition, crawl, url) = key.value();
            batch.push(NewUrl {
                crawl: crawl.to_owned(),
                url: url.to_owned(),
                partition,
                maybe_known: false,
                record: decode_record(crawl, url, value.value())?,
            });
        }
        Ok(batch)
    }

    /// Step 2: `frontier.redb`'s serving order built again from
    /// `url_records`, in one durable transaction that also takes the log
    /// position of `urls.redb` and, with `mark`, this schema's version.
    pub(super) fn rebuild_serving_order(
        db: &Database,
        urls_db: &Database,
        mark: bool,
    ) -> Result<u64, StoreError> {
        let urls_read = urls_db.begin_read()?;
        let lsn = urls_lsn(&urls_read)?;
        let mut write = db.begin_write()?;
        write.set_quick_repair(true);
        let entries = Self::rebuild_serving_order_in(&write, &urls_read)?;
        {
            let mut meta = write.open_table(META)?;
            meta.insert(APPLIED_LSN_KEY, lsn)?;
            if mark {
                meta.insert(super::SCHEMA_VERSION_KEY, super::SCHEMA_VERSION)?;
            }
        }
        write.commit()?;
        Ok(entries)
    }

    /// The serving order in `write` made again from the records `urls_read`
    /// sees (the older `due` table dropped); answers its entries.
    pub(super) fn rebuild_serving_order_in(
        write: &redb::WriteTransaction,
        urls_read: &redb::ReadTransaction,
    ) -> Result<u64, StoreError> {
        write.delete_table(DUE)?;
        // A conversion cut short may have left a partial one.
        write.delete_table(SERVING_ORDER)?;
        let mut entries = 0_u64;
        let mut order = write.open_table(SERVING_ORDER)?;
        if let Some(records) = RecordsRead::open(urls_read)? {
            for item in records.iter()? {
                let ((partition, crawl, hash), value) = item?;
                let decoded = StoredEntry::decode_all(&value).map_err(|source| {
                    StoreError::CorruptRecord {
                        crawl: format!("number {crawl}"),
                        url: format!("(the URLs of hash {hash:016x})"),
                        source,
                    }
                })?;
                for entry in decoded.iter().filter(|e| !e.is_completed()) {
                    order.insert((entry.queue, entry.due_at, hash), partition)?;
                    entries += 1;
                }
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::schema::{COUNTS_LSN_KEY, PARTITIONS_KEY, QUEUES};
    use super::super::tests::{discovered, due_urls, known, leave_in_log, queue_counts};
    use super::super::{FILE_NAME, QueueRecord, SCHEMA_VERSION, URLS_FILE_NAME};
    use super::*;
    use crate::record::UrlRecord;
    use crate::wal::Wal;

    const STORE_ID: u64 = 0x5eed_0000_0000_0005;

    /// Writes a store as schemas 4 and 5 laid it out: `urls` in
    /// `urls.redb`, `due` and `queues` in `frontier.redb`, both durable at
    /// log record 9, and an empty log of this format. Version 4 wrote
    /// records in their first form.
    fn write_url_keyed_store(dir: &Path, version: u64) {
        let urls_db = Database::create(dir.join(URLS_FILE_NAME)).unwrap();
        let write = urls_db.begin_write().unwrap();
        let db = Database::create(dir.join(FILE_NAME)).unwrap();
        let main_write = db.begin_write().unwrap();
        {
            let mut meta = write.open_table(URLS_META).unwrap();
            meta.insert(STORE_ID_KEY, STORE_ID).unwrap();
            meta.insert(APPLIED_LSN_KEY, 9).unwrap();
            let mut urls = write.open_table(URLS).unwrap();
            let mut due = main_write.open_table(DUE).unwrap();
            for (i, due_at) in [10, 0, 12].into_iter().enumerate() {
                let url = format!("http://a/{i}");
                let record = UrlRecord {
                    created_at: 5,
                    due_at,
                    depth: 2,
                    queue_key: "q".into(),
                    metadata: [("k".to_owned(), vec![format!("v{i}")])].into(),
                };
                let bytes = if version == 4 {
                    record.encode_version_1()
                } else {
                    record.encode()
                };
                urls.insert((1, "c", url.as_str()), bytes.as_slice())
                    .unwrap();
                if due_at != 0 {
                    due.insert(("c", "q", due_at, url.as_str()), 1).unwrap();
                }
            }
            let mut meta = main_write.open_table(META).unwrap();
            meta.insert(super::super::SCHEMA_VERSION_KEY, version)
                .unwrap();
            meta.insert(STORE_ID_KEY, STORE_ID).unwrap();
            meta.insert(APPLIED_LSN_KEY, 9).unwrap();
            meta.insert(COUNTS_LSN_KEY, 9).unwrap();
            meta.insert(PARTITIONS_KEY, 4).unwrap();
            let queue = QueueRecord {
                urls: 3,
                completed: 1,
                ..QueueRecord::default()
            };
            main_write
                .open_table(QUEUES)
                .unwrap()
                .insert(("c", "q"), queue.encode().as_slice())
                .unwrap();
        }
        write.commit().unwrap();
        main_write.commit().unwrap();
        Wal::create(dir, STORE_ID).unwrap();
    }

    fn stored(store: &Store) -> Vec<(String, UrlRecord)> {
        let mut urls = Vec::new();
        store
            .for_each_url(|_, _, url, record| urls.push((url.to_owned(), record.clone())))
            .unwrap();
        urls.sort_by(|a, b| a.0.cmp(&b.0));
        urls
    }

    fn legacy_tables_left(dir: &Path) -> (bool, bool) {
        let urls_db = Database::create(dir.join(URLS_FILE_NAME)).unwrap();
        let db = Database::create(dir.join(FILE_NAME)).unwrap();
        let urls = open_if_exists(&urls_db.begin_read().unwrap(), URLS)
            .unwrap()
            .is_some();
        let due = open_if_exists(&db.begin_read().unwrap(), DUE)
            .unwrap()
            .is_some();
        (urls, due)
    }

    /// Stores of schema 4 and 5 open converted, every record as it was,
    /// the groups their log held replayed after the conversion.
    #[test]
    fn url_keyed_stores_are_converted_with_their_records_and_their_log() {
        for version in [4, 5] {
            let dir = tempfile::tempdir().unwrap();
            write_url_keyed_store(dir.path(), version);
            // A kill after these were acknowledged: they are in the log only.
            leave_in_log(
                dir.path(),
                &[
                    (10, vec![discovered("http://b/")]),
                    (11, vec![known("http://a/0", 0)]),
                ],
            );
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
            let urls = stored(&store);
            let names: Vec<&str> = urls.iter().map(|(url, _)| url.as_str()).collect();
            assert_eq!(
                names,
                ["http://a/0", "http://a/1", "http://a/2", "http://b/"]
            );
            let kept = &urls[2].1;
            assert_eq!((kept.created_at, kept.due_at, kept.depth), (5, 12, 2));
            assert_eq!(kept.metadata["k"], ["v2"]);
            assert_eq!(urls[0].1.due_at, 0, "the logged report applied");
            assert_eq!(due_urls(&store), ["http://a/2", "http://b/"]);
            assert_eq!(queue_counts(&store), [("q".to_owned(), 4, 2)]);
            store.apply(&[discovered("http://c/")]).unwrap();
            drop(store);
            assert_eq!(legacy_tables_left(dir.path()), (false, false));
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(stored(&store).len(), 5);
            assert_eq!(queue_counts(&store), [("q".to_owned(), 5, 2)]);
        }
    }

    /// A conversion cut short after `urls.redb` (step 1) is finished by
    /// the next open, which does not convert that file twice.
    #[test]
    fn a_conversion_cut_short_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        write_url_keyed_store(dir.path(), 5);
        {
            let urls_db = Database::open(dir.path().join(URLS_FILE_NAME)).unwrap();
            assert_eq!(Store::convert_urls_file(&urls_db, STORE_ID).unwrap(), 3);
            assert_eq!(converted_urls_file(&urls_db).unwrap(), Some(STORE_ID));
        }
        assert_eq!(legacy_tables_left(dir.path()), (false, true));
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(stored(&store).len(), 3);
        assert_eq!(due_urls(&store), ["http://a/0", "http://a/2"]);
    }

    /// A store of schema 5 refused for damage is left as it was: its mark
    /// and its tables.
    #[test]
    fn a_refused_url_keyed_store_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        write_url_keyed_store(dir.path(), 5);
        drop(Store::open(other.path()).unwrap());
        std::fs::copy(
            other.path().join(URLS_FILE_NAME),
            dir.path().join(URLS_FILE_NAME),
        )
        .unwrap();
        let error = Store::open(dir.path()).unwrap_err();
        assert!(matches!(error, StoreError::OtherStore { .. }), "{error}");
        let db = Database::create(dir.path().join(FILE_NAME)).unwrap();
        let read = db.begin_read().unwrap();
        let meta = read.open_table(META).unwrap();
        assert_eq!(
            meta.get(super::super::SCHEMA_VERSION_KEY)
                .unwrap()
                .unwrap()
                .value(),
            5
        );
        assert!(open_if_exists(&read, DUE).unwrap().is_some());
    }
}
