//! Reading the tables: each call from one consistent snapshot, queue
//! counts with the changes held in memory since the last checkpoint.

use redb::{ReadableDatabase, ReadableTable};

use super::{
    CRAWL_SETTINGS, DUE, LEASES_UNTIL_KEY, META, QUEUES, QueueRecord, SEED_HOSTS,
    SERVING_PAUSED_KEY, Store, StoreError, URLS, decode_queue, decode_record, open_if_exists,
};
use crate::record::UrlRecord;

impl Store {
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

    /// Epoch milliseconds no lease handed out from this store outlives
    /// (0: none recorded).
    pub fn leases_until(&self) -> Result<u64, StoreError> {
        let read = self.files()?.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta.get(LEASES_UNTIL_KEY)?.map_or(0, |v| v.value()))
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

    /// Up to `limit` URLs of one partition that follow the key `after`
    /// (crawl, URL), in key order, as (crawl, URL, record), from one
    /// snapshot: a partition is read page by page, and a reader that
    /// stopped resumes after the last key it took.
    pub fn partition_page(
        &self,
        partition: u32,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<(String, String, UrlRecord)>, StoreError> {
        use std::ops::Bound;
        let read = self.files()?.urls_db.begin_read()?;
        let Some(table) = open_if_exists(&read, URLS)? else {
            return Ok(Vec::new());
        };
        let start = match after {
            Some((crawl, url)) => Bound::Excluded((partition, crawl, url)),
            None => Bound::Included((partition, "", "")),
        };
        let end = match partition.checked_add(1) {
            Some(next) => Bound::Excluded((next, "", "")),
            None => Bound::Unbounded,
        };
        let mut page = Vec::with_capacity(limit.min(4096));
        for entry in table.range::<(u32, &str, &str)>((start, end))?.take(limit) {
            let (key, value) = entry?;
            let (_, crawl, url) = key.value();
            page.push((
                crawl.to_owned(),
                url.to_owned(),
                decode_record(crawl, url, value.value())?,
            ));
        }
        Ok(page)
    }
}
