//! Reading the tables: each call from one consistent snapshot, queue
//! counts with the changes held in memory since the last checkpoint.
//!
//! URL records are keyed by numbers and hashes (module `names`, and the
//! schema in the module docs of [`super`]): a read turns names into
//! numbers, and an entry's queue number back into the queue key its URL
//! and record need. The names' lock is held for one value at a time and
//! never while a caller's `visit` runs.

use std::ops::Bound;

use redb::{ReadableDatabase, ReadableTable};

use super::held::{Held, HeldOrder};
use super::merge::Merged;
use super::merged::SNAPSHOT_TRIES;
use super::names::Names;
use super::records::{RecordsRead, bounds_of};
use super::schema::{
    CRAWL_SETTINGS, LEASES_UNTIL_KEY, META, OrderKey, QUEUES, RecordKey, SEED_HOSTS, SERVING_ORDER,
    SERVING_PAUSED_KEY, open_if_exists,
};
use super::{QueueRecord, Store, StoreError, decode_queue};
use crate::record::{StoredEntry, UrlRecord};

/// A crawl's not-completed URLs by when they are due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueCounts {
    /// Due by now.
    pub now: u64,
    /// Due within the next hour, and within the next day (due now
    /// included in both).
    pub next_hour: u64,
    pub next_day: u64,
    /// Due after now.
    pub later: u64,
    /// The earliest due date after now (UTC epoch seconds; 0: none).
    pub next_due_at: u64,
}

impl DueCounts {
    fn count(&mut self, due_at: u64, now: u64) {
        if due_at <= now {
            self.now += 1;
        } else {
            self.later += 1;
            if self.next_due_at == 0 || due_at < self.next_due_at {
                self.next_due_at = due_at;
            }
        }
        if due_at <= now.saturating_add(3600) {
            self.next_hour += 1;
        }
        if due_at <= now.saturating_add(86_400) {
            self.next_day += 1;
        }
    }
}

/// URLs of a partition as (crawl, URL, record).
pub type PartitionUrls = Vec<(String, String, UrlRecord)>;

/// A crawl's URLs of one due date in one queue, as [`Store::due_entries`]
/// reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueUrl {
    /// When it is due (UTC epoch seconds).
    pub due_at: u64,
    /// Its hash: after the due date, what orders a queue's URLs.
    pub hash: u64,
    /// The URL.
    pub url: String,
    /// Its filter partition.
    pub partition: u32,
    /// Its metadata, as stored.
    pub metadata: crate::record::CompactMetadata,
}

/// A page of a queue's serving order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DuePage {
    /// The URLs of the entries read, in serving order.
    pub urls: Vec<DueUrl>,
    /// The key (due date, hash) of the last entry read, if any: where the
    /// next page starts. An entry whose URL has moved since (the record
    /// now says another date or queue) is read past but yields no URL.
    pub last: Option<(u64, u64)>,
    /// Whether the queue has no entries after these.
    pub complete: bool,
}

/// Calls `visit` with the serving-order entries in `range`, what is held
/// (`held_order`) merged over the snapshot `order_read`, in key order,
/// while it answers true.
fn merged_order(
    held_order: HeldOrder,
    order_read: &redb::ReadTransaction,
    range: impl std::ops::RangeBounds<OrderKey>,
    mut visit: impl FnMut(OrderKey, u32) -> bool,
) -> Result<(), StoreError> {
    let table = open_if_exists(order_read, SERVING_ORDER)?;
    let stored = match &table {
        Some(table) => Some(table.range::<OrderKey>(range)?),
        None => None,
    };
    let stored = stored.into_iter().flatten().map(|entry| {
        let (key, partition) = entry?;
        Ok((key.value(), partition.value()))
    });
    for entry in Merged::new(held_order, stored) {
        let (key, partition) = entry?;
        if !visit(key, partition) {
            break;
        }
    }
    Ok(())
}

/// The first `limit` serving-order entries in `range` as (due date, hash,
/// partition), what is held merged over the snapshot `order_read`.
fn due_keys(
    held_order: HeldOrder,
    order_read: &redb::ReadTransaction,
    range: (Bound<OrderKey>, Bound<OrderKey>),
    limit: usize,
) -> Result<Vec<(u64, u64, u32)>, StoreError> {
    let mut keys = Vec::with_capacity(limit.min(1024));
    if limit > 0 {
        merged_order(
            held_order,
            order_read,
            range,
            |(_, due_at, hash), partition| {
                keys.push((due_at, hash, partition));
                keys.len() < limit
            },
        )?;
    }
    Ok(keys)
}

/// What is held of the records of `keys`: `None` where nothing is.
fn held_records_of(
    held: &Held,
    crawl_number: u32,
    keys: &[(u64, u64, u32)],
) -> Vec<Option<Option<Vec<u8>>>> {
    keys.iter()
        .map(|&(_, hash, partition)| held.record(&(partition, crawl_number, hash)))
        .collect()
}

/// The page of `keys`: each entry's URLs, from what is held of its record
/// (`held_records`, in the same order) or else from the snapshot
/// `urls_read`.
fn due_page(
    crawl: (&str, u32),
    queue: (&str, u32),
    urls_read: &redb::ReadTransaction,
    keys: Vec<(u64, u64, u32)>,
    held_records: Vec<Option<Option<Vec<u8>>>>,
    limit: usize,
    from_file: &mut Vec<(RecordKey, Vec<u8>)>,
) -> Result<DuePage, StoreError> {
    let ((crawl, crawl_number), (queue, queue_number)) = (crawl, queue);
    let mut page = DuePage {
        urls: Vec::with_capacity(keys.len()),
        last: keys.last().map(|&(due, hash, _)| (due, hash)),
        complete: keys.len() < limit,
    };
    let records = RecordsRead::open(urls_read)?;
    for ((due_at, hash, partition), held) in keys.into_iter().zip(held_records) {
        let key = (partition, crawl_number, hash);
        let (value, read) = match held {
            Some(value) => (value, false),
            None => match &records {
                Some(table) => (table.get(key)?, true),
                None => (None, false),
            },
        };
        let Some(value) = value else {
            continue;
        };
        for entry in &entries_of(crawl, &value)? {
            if entry.queue == queue_number && entry.due_at == due_at {
                page.urls.push(DueUrl {
                    due_at,
                    hash,
                    url: entry.url(queue),
                    partition,
                    metadata: entry.compact_metadata(),
                });
            }
        }
        if read {
            from_file.push((key, value));
        }
    }
    Ok(page)
}

/// The entries of a value; damage is an error naming the crawl.
fn entries_of<'v>(crawl: &str, value: &'v [u8]) -> Result<Vec<StoredEntry<'v>>, StoreError> {
    StoredEntry::decode_all(value).map_err(|source| StoreError::CorruptRecord {
        crawl: crawl.to_owned(),
        url: "(a stored URL)".to_owned(),
        source,
    })
}

/// An entry's URL and record.
fn url_and_record(
    names: &Names,
    crawl: &str,
    entry: &StoredEntry<'_>,
) -> Result<(String, UrlRecord), StoreError> {
    let queue_key = names.queue_key(entry.queue, "a URL record")?;
    let url = entry.url(queue_key);
    let record =
        entry
            .record(queue_key.to_owned())
            .map_err(|source| StoreError::CorruptRecord {
                crawl: crawl.to_owned(),
                url: url.clone(),
                source,
            })?;
    Ok((url, record))
}

impl Store {
    pub(super) fn read_names(&self) -> super::locks::OrderedReadGuard<'_, Names> {
        self.names.read()
    }

    /// The URLs and records of one value, in entry order.
    fn decode_value(
        &self,
        crawl: &str,
        value: &[u8],
    ) -> Result<Vec<(String, UrlRecord)>, StoreError> {
        let entries = entries_of(crawl, value)?;
        let names = self.read_names();
        entries
            .iter()
            .map(|entry| url_and_record(&names, crawl, entry))
            .collect()
    }

    /// `url`'s record in a value, if the value holds it.
    fn find_in_value(
        &self,
        crawl: &str,
        url: &str,
        value: &[u8],
    ) -> Result<Option<UrlRecord>, StoreError> {
        let entries = entries_of(crawl, value)?;
        let names = self.read_names();
        for entry in &entries {
            let queue_key = names.queue_key(entry.queue, url)?;
            if entry.is_url(url, queue_key) {
                return url_and_record(&names, crawl, entry).map(|(_, record)| Some(record));
            }
        }
        Ok(None)
    }

    /// Calls `visit(partition, url, record)` for a crawl's URLs, partition
    /// by partition, each from one consistent view, until it answers
    /// `false`. Memory stays bounded however many URLs the crawl has.
    pub fn scan_crawl(
        &self,
        crawl: &str,
        partitions: u32,
        mut visit: impl FnMut(u32, &str, UrlRecord) -> bool,
    ) -> Result<(), StoreError> {
        let Some(number) = self.read_names().crawl_number(crawl) else {
            return Ok(());
        };
        for partition in 0..partitions {
            let range = (partition, number, 0)..=(partition, number, u64::MAX);
            let mut going = true;
            self.for_each_record_in(range, |_, value| {
                for (url, record) in self.decode_value(crawl, value)? {
                    going = visit(partition, &url, record);
                    if !going {
                        break;
                    }
                }
                Ok(going)
            })?;
            if !going {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Calls `visit(key, value)` for the `url_records` entries in `range`,
    /// in key order, what is held merged over one snapshot of the file
    /// (module `held`), until it answers `false`.
    fn for_each_record_in(
        &self,
        range: impl std::ops::RangeBounds<RecordKey> + Clone,
        mut visit: impl FnMut(RecordKey, &[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let (held, table) = self.held_and_records(|held| held.records_in(&range))?;
        let held = held.in_order();
        let stored = match table.as_ref() {
            Some(table) => Some(table.range(bounds_of(&range))?),
            None => None,
        };
        for entry in Merged::new(held, stored.into_iter().flatten()) {
            let (key, value) = entry?;
            if !visit(key, &value)? {
                break;
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
            let _writer = self.lock_drained_writer()?;
            let files = self.files()?;
            let counts = self.lock_counts();
            (files.db.begin_read()?, counts.clone())
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

    /// The next `limit` entries of a queue's serving order after the key
    /// `after` (exclusive; `None`: from the first), with their URLs. The
    /// order is (due date, URL hash); the URLs of one entry (a collision)
    /// come together.
    ///
    /// The entries are read from `frontier.redb`, then the URLs from a
    /// snapshot of `urls.redb` taken after it: a group reaches `urls.redb`
    /// first, so every entry read finds its record there, or the record's
    /// newer state (a URL that has moved since yields nothing; the group
    /// that moved it tells the scheduler).
    pub fn due_entries(
        &self,
        crawl: &str,
        queue: &str,
        after: Option<(u64, u64)>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        let numbers = {
            let names = self.read_names();
            names
                .crawl_number(crawl)
                .and_then(|c| Some((c, names.queue_number(c, queue)?)))
        };
        let Some((crawl_number, queue_number)) = numbers else {
            return Ok(DuePage {
                complete: true,
                ..DuePage::default()
            });
        };
        let start = match after {
            Some((due, hash)) => Bound::Excluded((queue_number, due, hash)),
            None => Bound::Included((queue_number, 0, 0)),
        };
        let end = Bound::Included((queue_number, u64::MAX, u64::MAX));
        // Noted before any snapshot opens: what the page reads of the file
        // is kept for the reports that follow (module `recent_reads`).
        let generation = self.recent_reads.generation();
        // The snapshots are opened off the held lock (as in
        // `held_and_snapshot`), and what is held of the records is looked
        // up under it only if no layer was let go since they were opened:
        // then every key no longer held is in them.
        let (keys, held_records, urls_read) = 'read: {
            for _ in 0..SNAPSHOT_TRIES {
                let ((held_order, released), (order_read, urls_read)) = self.held_and_snapshot(
                    |held| (held.order_in((start, end)), held.released()),
                    |files| Ok((files.db.begin_read()?, files.urls_db.begin_read()?)),
                )?;
                let keys = due_keys(held_order, &order_read, (start, end), limit)?;
                drop(order_read);
                self.race_point("order read");
                let held = self.held.read();
                if held.released() == released {
                    let held_records = held_records_of(&held, crawl_number, &keys);
                    break 'read (keys, held_records, urls_read);
                }
            }
            // Layers kept being let go: everything under the held lock.
            let held = self.held.read();
            let files = self.files()?;
            let order_read = files.db.begin_read()?;
            let urls_read = files.urls_db.begin_read()?;
            let held_order = held.order_in((start, end));
            let keys = due_keys(held_order, &order_read, (start, end), limit)?;
            let held_records = held_records_of(&held, crawl_number, &keys);
            (keys, held_records, urls_read)
        };
        let mut from_file = Vec::new();
        let page = due_page(
            (crawl, crawl_number),
            (queue, queue_number),
            &urls_read,
            keys,
            held_records,
            limit,
            &mut from_file,
        )?;
        drop(urls_read);
        self.race_point("records read");
        self.recent_reads.keep(generation, from_file);
        Ok(page)
    }

    /// A crawl's not-completed URLs of the partitions `counted` takes, by
    /// when they are due from `now` on.
    pub fn count_due(
        &self,
        crawl: &str,
        now: u64,
        counted: impl Fn(u32) -> bool,
    ) -> Result<DueCounts, StoreError> {
        let queues = {
            let names = self.read_names();
            match names.crawl_number(crawl) {
                Some(number) => names.queues_of(number),
                None => return Ok(DueCounts::default()),
            }
        };
        let mut counts = DueCounts::default();
        for queue in queues {
            let range = (queue, 0, 0)..=(queue, u64::MAX, u64::MAX);
            let (held, read) = self.held_order_in(range.clone())?;
            merged_order(held, &read, range, |(_, due_at, _), partition| {
                if counted(partition) {
                    counts.count(due_at, now);
                }
                true
            })?;
        }
        Ok(counts)
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
        let Some(number) = self.read_names().crawl_number(crawl) else {
            return Ok(None);
        };
        let key = (partition, number, self.hasher.hash(url));
        let (held, table) = self.held_and_records(|held| held.record(&key))?;
        let value = match held {
            Some(value) => value,
            None => match table.as_ref() {
                Some(table) => table.get(key)?,
                None => None,
            },
        };
        match value {
            Some(value) => self.find_in_value(crawl, url, &value),
            None => Ok(None),
        }
    }

    /// Whether each (partition, crawl, URL) is stored, from one snapshot.
    /// What this finds is durable: a group's log record is synced before
    /// redb shows it.
    pub fn known_urls<'a>(
        &self,
        keys: impl IntoIterator<Item = (u32, &'a str, &'a str)>,
    ) -> Result<Vec<bool>, StoreError> {
        // For each URL of a crawl the store has: its key, what is held of
        // it, its crawl and the URL.
        type Asked<'u> = (RecordKey, Option<Option<Vec<u8>>>, &'u str, &'u str);
        let keys: Vec<(u32, &'a str, &'a str)> = keys.into_iter().collect();
        let (asked, table) = self.held_and_records(|held| {
            let names = self.read_names();
            (keys.iter())
                .map(|&(partition, crawl, url)| {
                    names.crawl_number(crawl).map(|number| {
                        let key = (partition, number, self.hasher.hash(url));
                        let held = held.record(&key);
                        (key, held, crawl, url)
                    })
                })
                .collect::<Vec<Option<Asked<'a>>>>()
        })?;
        asked
            .into_iter()
            .map(|asked| {
                let Some((key, held, crawl, url)) = asked else {
                    return Ok(false);
                };
                let value = match held {
                    Some(value) => value,
                    None => match table.as_ref() {
                        Some(table) => table.get(key)?,
                        None => None,
                    },
                };
                let Some(value) = value else {
                    return Ok(false);
                };
                let entries = entries_of(crawl, &value)?;
                let names = self.read_names();
                for entry in &entries {
                    if entry.is_url(url, names.queue_key(entry.queue, url)?) {
                        return Ok(true);
                    }
                }
                Ok(false)
            })
            .collect()
    }

    /// Calls `visit(partition, crawl, url, record)` for every stored URL, in
    /// key order, from one consistent snapshot; answers how many there were.
    pub fn for_each_url(
        &self,
        mut visit: impl FnMut(u32, &str, &str, &UrlRecord),
    ) -> Result<u64, StoreError> {
        let mut count = 0;
        self.for_each_record_in(.., |(partition, crawl_number, _), value| {
            let crawl = self.crawl_name(crawl_number)?;
            for (url, record) in self.decode_value(&crawl, value)? {
                visit(partition, &crawl, &url, &record);
                count += 1;
            }
            Ok(true)
        })?;
        Ok(count)
    }

    fn crawl_name(&self, number: u32) -> Result<String, StoreError> {
        self.read_names()
            .crawl_name(number)
            .map(str::to_owned)
            .ok_or_else(|| {
                StoreError::BadNames(format!(
                    "a URL record names crawl number {number}, which the store does not have"
                ))
            })
    }

    /// Calls `visit(crawl, hash, urls)` for every record key stored in one
    /// filter partition (the store's hash of the URLs under it, and how
    /// many there are), from one consistent snapshot, without building
    /// the URLs: what a filter is rebuilt from.
    pub fn for_each_key_in_partition(
        &self,
        partition: u32,
        mut visit: impl FnMut(&str, u64, usize),
    ) -> Result<(), StoreError> {
        self.for_each_value_in_partition(partition, |crawl, hash, value| {
            visit(crawl, hash, entries_of(crawl, value)?.len());
            Ok(())
        })
    }

    /// Calls `visit(crawl, hash, value)` for every record of one partition,
    /// from one consistent snapshot, its crawl's name looked up once a run.
    fn for_each_value_in_partition(
        &self,
        partition: u32,
        mut visit: impl FnMut(&str, u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut crawl: Option<(u32, String)> = None;
        let range = (partition, 0, 0)..=(partition, u32::MAX, u64::MAX);
        self.for_each_record_in(range, |(_, crawl_number, hash), value| {
            if crawl
                .as_ref()
                .is_none_or(|(number, _)| *number != crawl_number)
            {
                crawl = Some((crawl_number, self.crawl_name(crawl_number)?));
            }
            let crawl_name = crawl.as_ref().map_or("", |(_, name)| name.as_str());
            visit(crawl_name, hash, value)?;
            Ok(true)
        })
    }

    /// Calls `visit(crawl, url)` for every URL stored in one filter
    /// partition, from one consistent snapshot; answers how many.
    pub fn for_each_url_in_partition(
        &self,
        partition: u32,
        mut visit: impl FnMut(&str, &str),
    ) -> Result<u64, StoreError> {
        let mut count = 0;
        // The strings are kept from value to value: a partition copy reads
        // every URL of the partition.
        let mut urls: Vec<String> = Vec::new();
        self.for_each_value_in_partition(partition, |crawl_name, _, value| {
            let entries = entries_of(crawl_name, value)?;
            let mut used = 0;
            {
                let names = self.read_names();
                for entry in &entries {
                    if used == urls.len() {
                        urls.push(String::new());
                    }
                    let url = &mut urls[used];
                    url.clear();
                    entry.write_url(names.queue_key(entry.queue, "a URL record")?, url);
                    used += 1;
                }
            }
            for url in &urls[..used] {
                visit(crawl_name, url);
                count += 1;
            }
            Ok(())
        })?;
        Ok(count)
    }

    /// Up to `limit` URLs of one partition that follow the URL `after`
    /// (crawl, URL) in the partition's order (by crawl number and hash,
    /// then by place in a value), as (crawl, URL, record), from one
    /// snapshot, and whether the partition ends with them: a partition is
    /// read page by page, and a reader that stopped resumes after the last
    /// URL it took, wherever its page was cut. If that URL has gone since,
    /// the page starts with the other URLs of its hash (taking some twice
    /// does no harm to a copy; missing one would).
    pub fn partition_page(
        &self,
        partition: u32,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<(PartitionUrls, bool), StoreError> {
        let (start, mut skip_through) = match after {
            Some((crawl, url)) => {
                let number = self
                    .read_names()
                    .crawl_number(crawl)
                    .ok_or_else(|| StoreError::UnknownCrawl(crawl.to_owned()))?;
                let key = (partition, number, self.hasher.hash(url));
                (Bound::Included(key), Some((key, url)))
            }
            None => (Bound::Included((partition, 0, 0)), None),
        };
        let end = Bound::Included((partition, u32::MAX, u64::MAX));
        let mut page = Vec::with_capacity(limit.min(4096));
        let mut ended = true;
        self.for_each_record_in((start, end), |key, value| {
            let crawl = self.crawl_name(key.1)?;
            let mut urls = self.decode_value(&crawl, value)?;
            if let Some((after_key, after_url)) = skip_through.take()
                && after_key == key
                && let Some(at) = urls.iter().position(|(url, _)| url == after_url)
            {
                urls.drain(..=at);
            }
            for (url, record) in urls {
                if page.len() == limit {
                    ended = false;
                    return Ok(false);
                }
                page.push((crawl.clone(), url, record));
            }
            Ok(true)
        })?;
        Ok((page, ended))
    }
}
