//! `frontier.redb` brought up to `urls.redb` when it is behind on disk.
//!
//! The store keeps `frontier.redb` at or ahead of `urls.redb` on disk (it
//! is made durable first), but redb makes a file's non-durable commits
//! durable when the file is closed, unless a write to that file failed.
//! After a failed write to `frontier.redb` (a full disk), closing the files
//! (a shutdown, or the reopening that mends them) leaves `urls.redb` ahead
//! by the groups since `frontier.redb`'s last durable commit. A replay
//! works out each group's changes to `frontier.redb` from `urls.redb` as it
//! was before the group, which is gone; but what those groups changed there
//! is derived from `urls.redb` as it is now: the serving order (every URL
//! not completed) and each queue's counts. The rest of `frontier.redb` is
//! written by durable commits of its own, all of them before those groups,
//! but for whole queues a deletion among them removed, which the log says.
//!
//! So when the log holds every group `frontier.redb` lacks, those groups'
//! queue removals are applied, the serving order is built again, the
//! counts are recounted, and `frontier.redb` takes `urls.redb`'s log
//! position, in one durable commit. Without those records the files are
//! refused as not of one state.

use std::collections::BTreeMap;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable};

use super::names::Names;
use super::records::RecordsRead;
use super::schema::{
    APPLIED_LSN_KEY, COUNTS_LSN_KEY, CRAWL_REVISIT, CRAWL_SETTINGS, META, QUEUES, SEED_HOSTS,
};
use super::{QueueRecord, Store, StoreError, WriteOp, decode_queue, names_under};
use crate::record::StoredEntry;
use crate::wal::LogRecord;

/// Per (crawl, queue): its URLs and, of those, completed ones.
type QueueTotals = BTreeMap<(String, String), (u64, u64)>;

impl Store {
    /// Brings `frontier.redb` (at `due_lsn`) up to `urls.redb` (at
    /// `urls_lsn`, ahead) with `records`, the log, in one durable commit;
    /// see the module docs.
    pub(super) fn catch_up_main_file(
        db: &Database,
        urls_db: &Database,
        path: &Path,
        records: &[LogRecord],
        due_lsn: u64,
        urls_lsn: u64,
    ) -> Result<(), StoreError> {
        let gap: Vec<&LogRecord> = records
            .iter()
            .filter(|record| record.lsn > due_lsn && record.lsn <= urls_lsn)
            .collect();
        let contiguous = gap.len() as u64 == urls_lsn - due_lsn
            && gap.iter().zip(due_lsn + 1..).all(|(r, lsn)| r.lsn == lsn);
        if !contiguous {
            return Err(StoreError::FilesDisagree {
                path: path.to_owned(),
                due_lsn,
                urls_lsn,
            });
        }
        let counts = Self::recount(urls_db)?;
        let urls_read = urls_db.begin_read()?;
        let mut write = db.begin_write()?;
        write.set_quick_repair(true);
        {
            let mut queues = write.open_table(QUEUES)?;
            let mut seed_hosts = write.open_table(SEED_HOSTS)?;
            let mut crawl_settings = write.open_table(CRAWL_SETTINGS)?;
            let mut crawl_revisit = write.open_table(CRAWL_REVISIT)?;
            for record in &gap {
                for op in &record.ops {
                    let WriteOp::Delete(deletion) = op else {
                        continue;
                    };
                    if !deletion.removes_queues() {
                        continue;
                    }
                    let crawl = deletion.crawl.as_str();
                    let doomed = match &deletion.queue {
                        Some(queue) => vec![queue.clone()],
                        None => names_under(&queues, crawl)?,
                    };
                    for queue in &doomed {
                        queues.remove((crawl, queue.as_str()))?;
                    }
                    if deletion.queue.is_none() {
                        for host in names_under(&seed_hosts, crawl)? {
                            seed_hosts.remove((crawl, host.as_str()))?;
                        }
                        crawl_settings.remove(crawl)?;
                        crawl_revisit.remove(crawl)?;
                    }
                }
            }
            // Every queue takes the counts of its URLs; a queue with a
            // record but no URL counts none.
            let mut records: BTreeMap<(String, String), QueueRecord> = BTreeMap::new();
            for entry in queues.iter()? {
                let (key, value) = entry?;
                let (crawl, queue) = key.value();
                records.insert(
                    (crawl.to_owned(), queue.to_owned()),
                    decode_queue(crawl, queue, value.value())?,
                );
            }
            for record in records.values_mut() {
                record.urls = 0;
                record.completed = 0;
            }
            for (key, (urls, completed)) in counts {
                let record = records.entry(key).or_default();
                record.urls = urls;
                record.completed = completed;
            }
            for ((crawl, queue), record) in &records {
                queues.insert((crawl.as_str(), queue.as_str()), record.encode().as_slice())?;
            }
        }
        Self::rebuild_serving_order_in(&write, &urls_read)?;
        {
            let mut meta = write.open_table(META)?;
            meta.insert(APPLIED_LSN_KEY, urls_lsn)?;
            meta.insert(COUNTS_LSN_KEY, urls_lsn)?;
        }
        write.commit()?;
        tracing::warn!(
            path = %path.display(),
            from = due_lsn,
            to = urls_lsn,
            "frontier.redb was behind urls.redb on disk (a failed write kept it from being made durable when the files were closed); its serving order and queue counts were derived again from urls.redb"
        );
        Ok(())
    }

    /// Each queue's URLs and completed URLs, as `urls.redb` holds them.
    fn recount(urls_db: &Database) -> Result<QueueTotals, StoreError> {
        let read = urls_db.begin_read()?;
        let names = Names::load(&read)?;
        let mut counts: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        if let Some(records) = RecordsRead::open(&read)? {
            for item in records.iter()? {
                let ((_, crawl, hash), value) = item?;
                let entries = StoredEntry::decode_all(&value).map_err(|source| {
                    StoreError::CorruptRecord {
                        crawl: format!("number {crawl}"),
                        url: format!("(the URLs of hash {hash:016x})"),
                        source,
                    }
                })?;
                for entry in entries {
                    let count = counts.entry(entry.queue).or_default();
                    count.0 += 1;
                    count.1 += u64::from(entry.is_completed());
                }
            }
        }
        counts
            .into_iter()
            .map(|(number, count)| {
                let (crawl, key) = names.queue_name(number).ok_or_else(|| {
                    StoreError::BadNames(format!(
                        "a URL record names queue number {number}, which the store does not have"
                    ))
                })?;
                let crawl = names.crawl_name(crawl).ok_or_else(|| {
                    StoreError::BadNames(format!(
                        "queue number {number} names crawl number {crawl}, which the store does not have"
                    ))
                })?;
                Ok(((crawl.to_owned(), key.to_owned()), count))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        crash_image, discovered, discovered_in, due_urls, known, queue_counts,
    };
    use super::super::{Deletion, QueueRecord};
    use super::*;

    /// A store whose `frontier.redb` could not be made durable when its
    /// files were closed, while `urls.redb` was: the groups between are
    /// derived again, a queue deleted among them stays deleted, and the
    /// store goes on from there.
    #[test]
    fn a_main_file_behind_the_urls_file_is_caught_up_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .apply(&[discovered("http://a/"), discovered_in("http://x/", "q2")])
                .unwrap();
            store
                .update_queue_settings("c", "q2", |record| record.delay_ms = Some(5))
                .unwrap();
            store.checkpoint().unwrap();
            store
                .apply(&[discovered("http://b/"), known("http://a/", 0)])
                .unwrap();
            let delete_q2 = WriteOp::Delete(Deletion {
                crawl: "c".into(),
                queue: Some("q2".into()),
                created_before: None,
                partitions: 4,
                partition: None,
                urls_below: None,
            });
            store
                .apply(&[delete_q2, discovered_in("http://y/", "q3")])
                .unwrap();
            // urls.redb made durable alone, as closing it would.
            let files = store.files().unwrap();
            let mut write = files.urls_db.begin_write().unwrap();
            write.set_quick_repair(true);
            write.commit().unwrap();
            drop(files);
            crash_image(dir.path(), image.path());
        }
        let store = Store::open(image.path()).unwrap();
        let mut urls = Vec::new();
        store
            .for_each_url(|_, _, url, record| urls.push((url.to_owned(), record.due_at)))
            .unwrap();
        urls.sort();
        assert_eq!(
            urls,
            [
                ("http://a/".to_owned(), 0),
                ("http://b/".to_owned(), 10),
                ("http://y/".to_owned(), 10)
            ]
        );
        assert_eq!(due_urls(&store), ["http://b/"]);
        assert_eq!(
            queue_counts(&store),
            [("q".to_owned(), 2, 1), ("q3".to_owned(), 1, 0)]
        );
        let mut q2 = None;
        store
            .for_each_queue(|_, queue, record| {
                if queue == "q2" {
                    q2 = Some(record);
                }
            })
            .unwrap();
        assert_eq!(q2, None::<QueueRecord>, "the deleted queue's settings went");
        store.apply(&[discovered("http://c/")]).unwrap();
        drop(store);
        let store = Store::open(image.path()).unwrap();
        assert_eq!(queue_counts(&store)[0], ("q".to_owned(), 3, 1));
    }

    /// Without the log records between the two files, they are refused.
    #[test]
    fn a_main_file_behind_without_the_records_between_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[discovered("http://a/")]).unwrap();
        let files = store.files().unwrap();
        let (db, urls_db) = (&files.db, &files.urls_db);
        let error = Store::catch_up_main_file(db, urls_db, dir.path(), &[], 0, 1).unwrap_err();
        assert!(matches!(error, StoreError::FilesDisagree { .. }), "{error}");
    }
}
