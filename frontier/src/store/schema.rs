//! Every table of the store's two files and every key of their `meta`
//! tables, in one place, with the reads of the log positions they hold.
//!
//! # Version 8 (`super::SCHEMA_VERSION`)
//!
//! `frontier.redb`:
//!
//! | table | key | value | holds |
//! |---|---|---|---|
//! | `meta` | `&str` | `u64` | `schema_version`; `store_id` (random, drawn at creation; also in `urls.redb` and the log's header); `partitions` (fixed at creation: URL keys embed it); `clean_shutdown_token` while filter snapshots match the store; `serving_paused` (1 while SetActive(false) holds); `applied_lsn`, the last write-ahead log record this file holds; `counts_lsn`, the last whose queue counts `queues` holds |
//! | `seed_hosts` | `(crawl ID, host)` | `()` | the hosts of a crawl's seeds: its scope |
//! | `serving_order` | `(queue number, due_at, URL hash)` | partition | every URL not completed, in serving order per queue (completed URLs have no entry) |
//! | `queues` | `(crawl ID, queue key)` | [`super::QueueRecord`] bytes | per queue: URL and completed counts (as of the last checkpoint), delay, block, crawl limit |
//! | `crawl_settings` | crawl ID | default delay (seconds) | the delay of queues without their own |
//! | `followed` | partition | leader's node ID | the leader whose writes this store's copy of the partition holds as a follower, since it last was whole there; removed before any of the partition's URLs are dropped. A store without the table follows nothing |
//!
//! `urls.redb`:
//!
//! | table | key | value | holds |
//! |---|---|---|---|
//! | `meta` | `&str` | `u64` | `store_id`; `schema_version`; `applied_lsn`, the last log record this file holds |
//! | `url_records` | `(partition, crawl number, URL hash)` | [`crate::record::StoredEntry`]s | every URL a crawl knows, grouped by filter partition so that a rebuild reads only its own, but those `url_records_recent` holds newer |
//! | `url_records_recent` | as `url_records` | as `url_records`; empty: removed | records the applier wrote since their partition last merged into `url_records` (module `records`) |
//! | `crawl_names` | crawl number | crawl ID | module `names` |
//! | `queue_names` | queue number | `(crawl number, queue key)` | module `names` |
//!

use redb::TableDefinition;

use super::StoreError;

/// A `url_records` key: (partition, crawl number, URL hash).
pub(super) type RecordKey = (u32, u32, u64);

/// `frontier.redb`'s `followed` (see the table above).
pub(super) const FOLLOWED: TableDefinition<'_, u32, &str> = TableDefinition::new("followed");

/// `frontier.redb`'s `meta`.
pub(super) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
pub(super) const SCHEMA_VERSION_KEY: &str = "schema_version";
pub(super) const CLEAN_TOKEN_KEY: &str = "clean_shutdown_token";
pub(super) const PARTITIONS_KEY: &str = "partitions";
/// [`crate::partitioning::PartitionBy::code`]; absent in a store that
/// holds a partition count: those partition by host.
pub(super) const PARTITION_BY_KEY: &str = "partition_by";
/// `urls.redb`'s own `meta`: `applied_lsn` only.
pub(super) const URLS_META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// `urls.redb`: (partition, crawl number, URL hash) → the entries of the
/// crawl's URLs of that hash ([`crate::record::StoredEntry`]).
pub(super) const URL_RECORDS: TableDefinition<'_, (u32, u32, u64), &[u8]> =
    TableDefinition::new("url_records");
pub(super) const SEED_HOSTS: TableDefinition<'_, (&str, &str), ()> =
    TableDefinition::new("seed_hosts");
/// `frontier.redb`: (queue number, due date, URL hash) → partition.
pub(super) const SERVING_ORDER: TableDefinition<'_, OrderKey, u32> =
    TableDefinition::new("serving_order");
/// A `serving_order` key: (queue number, due date, URL hash).
pub(super) type OrderKey = (u32, u64, u64);
/// What a `serving_order` entry held in memory costs (module `held`):
/// measured as what maps of such keys grow the resident memory by with
/// the server's allocator, so that the held limit bounds memory as it says
/// (the `url_records` entries count their own, module `record_map`). An
/// overestimate makes the applier's turns smaller than the memory allows,
/// and larger turns are what keep ingest up once the files outgrow the
/// cache.
pub(super) const ORDER_ENTRY: usize = 54;
pub(super) const QUEUES: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("queues");
pub(super) const CRAWL_SETTINGS: TableDefinition<'_, &str, u32> =
    TableDefinition::new("crawl_settings");
/// `frontier.redb`: crawl → its own revisit policy
/// ([`crate::revisit::Policy::encode`]).
pub(super) const CRAWL_REVISIT: TableDefinition<'_, &str, &[u8]> =
    TableDefinition::new("crawl_revisit");
pub(super) const SERVING_PAUSED_KEY: &str = "serving_paused";
/// Epoch milliseconds no lease handed out from this store outlives.
pub(super) const LEASES_UNTIL_KEY: &str = "leases_until_ms";
/// The LSN of the last write-ahead log record applied (see [`crate::wal`]).
pub(super) const APPLIED_LSN_KEY: &str = "applied_lsn";
/// The LSN of the last group whose queue counts the `queues` table holds.
pub(super) const COUNTS_LSN_KEY: &str = "counts_lsn";

/// The key of the store ID in both files' `meta`: a random number drawn at
/// creation, also in the log's header, so files of different stores are
/// never taken for one.
pub(super) const STORE_ID_KEY: &str = "store_id";

/// `urls.redb`: records newer than the base table's, by the same keys; an
/// empty value marks a removal.
pub(super) const URL_RECORDS_RECENT: TableDefinition<'_, RecordKey, &[u8]> =
    TableDefinition::new("url_records_recent");

/// Crawl number → crawl ID.
pub(super) const CRAWL_NAMES: TableDefinition<'_, u32, &str> = TableDefinition::new("crawl_names");
/// Queue number → (crawl number, queue key).
pub(super) const QUEUE_NAMES: TableDefinition<'_, u32, (u32, &str)> =
    TableDefinition::new("queue_names");

/// Schemas 1 to 5: (partition, crawl ID, URL) → record.
pub(super) const URLS: TableDefinition<'_, (u32, &str, &str), &[u8]> = TableDefinition::new("urls");
/// Schemas 1 to 5: (crawl ID, queue key, due date, URL) → partition.
pub(super) const DUE: TableDefinition<'_, (&str, &str, u64, &str), u32> =
    TableDefinition::new("due");

/// Opens a table for reading; a table never written yet reads as absent.
pub(super) fn open_if_exists<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    table: TableDefinition<'_, K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match read.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// The LSN of the last log record `urls.redb` holds.
pub(super) fn urls_lsn(read: &redb::ReadTransaction) -> Result<u64, StoreError> {
    Ok(match open_if_exists(read, URLS_META)? {
        Some(meta) => meta.get(APPLIED_LSN_KEY)?.map_or(0, |v| v.value()),
        None => 0,
    })
}

/// What `frontier.redb` holds: (the last log record applied, the last
/// whose queue counts the `queues` table holds).
pub(super) fn main_lsns(read: &redb::ReadTransaction) -> Result<(u64, u64), StoreError> {
    let Some(meta) = open_if_exists(read, META)? else {
        return Ok((0, 0));
    };
    let lsn_of = |key| -> Result<u64, StoreError> { Ok(meta.get(key)?.map_or(0, |v| v.value())) };
    Ok((lsn_of(APPLIED_LSN_KEY)?, lsn_of(COUNTS_LSN_KEY)?))
}
