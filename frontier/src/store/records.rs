//! `url_records` as two tables of `urls.redb`: the base table, which holds
//! most records, and `url_records_recent`, where the applier's copies of
//! held writes land first and from which a share of the partitions is
//! merged into the base at each copy.
//!
//! Why two: an insert into a B-tree of random keys reads and rewrites a
//! leaf, and once the table outgrows the cache a copy of a few million
//! records rewrites most of the base's leaves, however few records each
//! leaf gains. Through the recent table, a partition's records reach the
//! base once every few copies, many to a leaf. With `n` records in the
//! base, `c` in a copy and `1/k` of the partitions merged a copy, a copy
//! rewrites about `n/k` records' worth of base leaves and a recent table
//! of about `k·c/2` records: least at `k = √(2n/c)` ([`merge_share`]).
//! A base table within a few times its page cache takes copies whole
//! (`k = 1`): its leaves are mostly cached, and writing each record twice
//! costs more than it saves.
//!
//! A key's value is the recent table's if it has the key (an empty value
//! there is a removal), else the base's. Writes outside the applier (the
//! log's replay, deletions, the repair tools) go to the base and take the
//! key out of the recent table, so that neither path leaves the other a
//! stale value.

use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU32, Ordering};

use redb::{ReadableTable, ReadableTableMetadata};

use super::StoreError;
use super::merge::Merged;
use super::record_access::RecordAccess;
use super::record_map::RecordMap;
use super::schema::{RecordKey, URL_RECORDS, URL_RECORDS_RECENT, open_if_exists};

type ReadTable = redb::ReadOnlyTable<RecordKey, &'static [u8]>;
type WriteTable<'t> = redb::Table<'t, RecordKey, &'static [u8]>;

/// A record of the recent table as a change over the base: `None` for a
/// removal.
type Change = (RecordKey, Option<Vec<u8>>);

fn change(
    (key, value): (
        redb::AccessGuard<'_, RecordKey>,
        redb::AccessGuard<'_, &'static [u8]>,
    ),
) -> Change {
    let value = value.value();
    (key.value(), (!value.is_empty()).then(|| value.to_vec()))
}

/// A key's value: the recent table's if it has the key (`None` if
/// removed there), else the base's.
fn newest_value(
    recent: Option<&impl ReadableTable<RecordKey, &'static [u8]>>,
    base: Option<&impl ReadableTable<RecordKey, &'static [u8]>>,
    key: RecordKey,
) -> Result<Option<Vec<u8>>, StoreError> {
    if let Some(recent) = recent
        && let Some(value) = recent.get(key)?
    {
        let value = value.value();
        return Ok((!value.is_empty()).then(|| value.to_vec()));
    }
    match base {
        Some(base) => Ok(base.get(key)?.map(|value| value.value().to_vec())),
        None => Ok(None),
    }
}

/// The records within `range`, the recent table's over the base's, in key
/// order.
fn newest_in<'t>(
    recent: Option<&'t impl ReadableTable<RecordKey, &'static [u8]>>,
    base: Option<&'t impl ReadableTable<RecordKey, &'static [u8]>>,
    range: RecordBounds,
) -> Result<impl Iterator<Item = Result<(RecordKey, Vec<u8>), StoreError>> + 't, StoreError> {
    let recent = match recent {
        Some(table) => Some(table.range::<RecordKey>(range)?),
        None => None,
    };
    let base = match base {
        Some(table) => Some(table.range::<RecordKey>(range)?),
        None => None,
    };
    let recent = (recent.into_iter().flatten()).map(|entry| Ok(change(entry?)));
    let base = (base.into_iter().flatten()).map(|entry| {
        let (key, value) = entry?;
        Ok((key.value(), value.value().to_vec()))
    });
    Ok(Merged::over(recent, base))
}

/// Every key of one partition.
pub(super) fn partition_keys(partition: u32) -> std::ops::RangeInclusive<RecordKey> {
    (partition, 0, 0)..=(partition, u32::MAX, u64::MAX)
}

/// A range of records' keys.
pub(super) type RecordBounds = (Bound<RecordKey>, Bound<RecordKey>);

/// `range` as bounds that own their keys.
pub(super) fn bounds_of(range: &impl RangeBounds<RecordKey>) -> RecordBounds {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

/// The records of a snapshot of `urls.redb`.
#[derive(Debug)]
pub(super) struct RecordsRead {
    recent: Option<ReadTable>,
    base: Option<ReadTable>,
}

impl RecordsRead {
    /// `None` if the file has neither table.
    pub(super) fn open(read: &redb::ReadTransaction) -> Result<Option<Self>, StoreError> {
        let base = open_if_exists(read, URL_RECORDS)?;
        let recent = open_if_exists(read, URL_RECORDS_RECENT)?;
        Ok((base.is_some() || recent.is_some()).then_some(Self { recent, base }))
    }

    /// The value of a key.
    pub(super) fn get(&self, key: RecordKey) -> Result<Option<Vec<u8>>, StoreError> {
        newest_value(self.recent.as_ref(), self.base.as_ref(), key)
    }

    /// The records within `range`, in key order.
    pub(super) fn range(
        &self,
        range: RecordBounds,
    ) -> Result<impl Iterator<Item = Result<(RecordKey, Vec<u8>), StoreError>> + '_, StoreError>
    {
        newest_in(self.recent.as_ref(), self.base.as_ref(), range)
    }

    /// Every record, in key order.
    pub(super) fn iter(
        &self,
    ) -> Result<impl Iterator<Item = Result<(RecordKey, Vec<u8>), StoreError>> + '_, StoreError>
    {
        self.range((Bound::Unbounded, Bound::Unbounded))
    }
}

/// The records, in a write transaction on `urls.redb`.
pub(super) struct RecordsWrite<'t> {
    recent: WriteTable<'t>,
    base: WriteTable<'t>,
}

impl<'t> RecordsWrite<'t> {
    pub(super) fn open(write: &'t redb::WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            recent: write.open_table(URL_RECORDS_RECENT)?,
            base: write.open_table(URL_RECORDS)?,
        })
    }

    /// Removes a key.
    pub(super) fn remove(&mut self, key: RecordKey) -> Result<(), StoreError> {
        self.recent.remove(key)?;
        self.base.remove(key)?;
        Ok(())
    }

    /// The records of `range`, in key order.
    pub(super) fn records_in(
        &self,
        range: impl RangeBounds<RecordKey>,
    ) -> Result<Vec<(RecordKey, Vec<u8>)>, StoreError> {
        newest_in(Some(&self.recent), Some(&self.base), bounds_of(&range))?.collect()
    }

    /// Writes an applier's copy of held records: the partitions `merging`
    /// names go to the base table with what the recent table holds of
    /// them, which leaves it; the others go to the recent table.
    pub(super) fn write_copy(
        &mut self,
        copy: &RecordMap,
        merging: &MergeSlice,
    ) -> Result<(), StoreError> {
        for partition in 0..merging.span.max(copy.partitions()) {
            let held = copy.in_order_of(partition);
            if !merging.contains(partition) {
                // In key order: descents share the pages they dirty.
                for (key, value) in held {
                    self.recent.insert(key, value.as_deref().unwrap_or(&[]))?;
                }
                continue;
            }
            let older: Vec<Change> = (self.recent.range(partition_keys(partition))?)
                .map(|entry| Ok::<_, StoreError>(change(entry?)))
                .collect::<Result<_, _>>()?;
            if !older.is_empty() {
                self.recent
                    .retain_in(partition_keys(partition), |_, _| false)?;
            }
            let mut older = older.into_iter().peekable();
            for (key, value) in held {
                while let Some((older_key, older_value)) =
                    older.next_if(|(older_key, _)| *older_key < key)
                {
                    self.write_base(older_key, older_value.as_deref())?;
                }
                older.next_if(|(older_key, _)| *older_key == key);
                self.write_base(key, value.as_deref())?;
            }
            for (key, value) in older {
                self.write_base(key, value.as_deref())?;
            }
        }
        Ok(())
    }

    fn write_base(&mut self, key: RecordKey, value: Option<&[u8]>) -> Result<(), StoreError> {
        match value {
            Some(value) if !value.is_empty() => {
                self.base.insert(key, value)?;
            }
            _ => {
                self.base.remove(key)?;
            }
        }
        Ok(())
    }

    /// Records in the base table.
    pub(super) fn base_len(&self) -> Result<u64, StoreError> {
        Ok(self.base.len()?)
    }

    /// One past the highest partition the recent table holds (0: none).
    pub(super) fn recent_span(&self) -> Result<u32, StoreError> {
        Ok(match self.recent.last()? {
            Some((key, _)) => key.value().0.saturating_add(1),
            None => 0,
        })
    }
}

impl RecordAccess for RecordsWrite<'_> {
    fn get(&self, key: RecordKey) -> Result<Option<Vec<u8>>, StoreError> {
        newest_value(Some(&self.recent), Some(&self.base), key)
    }

    fn insert(&mut self, key: RecordKey, value: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        let recent = self.recent.remove(key)?.map(|value| value.value().to_vec());
        let base = self
            .base
            .insert(key, value.as_slice())?
            .map(|old| old.value().to_vec());
        Ok(match recent {
            Some(recent) => (!recent.is_empty()).then_some(recent),
            None => base,
        })
    }
}

/// The partitions one copy merges into the base table: `count` of them
/// from `first`, wrapping at `span`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MergeSlice {
    first: u32,
    count: u32,
    /// One past the highest partition either the copy or the recent
    /// table holds.
    span: u32,
}

impl MergeSlice {
    pub(super) fn contains(&self, partition: u32) -> bool {
        partition < self.span && (partition + self.span - self.first) % self.span < self.count
    }
}

/// How many times its file's page cache the base table outgrows before
/// copies go through the recent table: until then most of the leaves a
/// copy rewrites are cached, and writing each record twice (to the recent
/// table, then to the base) costs more B-tree work than the rewrites save
/// (BENCHMARKS.md has the paired runs).
const CACHES_BEFORE_MERGING: u64 = 8;

/// Bytes of a table's pages a record takes, about (its key, its value,
/// the B-tree's share and the room left in pages), to size the base table
/// from its length.
const RECORD_PAGE_BYTES: u64 = 80;

/// The least base table, in records, whose copies go through the recent
/// table, with a page cache of `cache_bytes`.
pub(super) fn merging_from(cache_bytes: usize) -> u64 {
    (cache_bytes as u64).saturating_mul(CACHES_BEFORE_MERGING) / RECORD_PAGE_BYTES
}

/// The share of the partitions a copy of `copied` records merges into a
/// base table of `base` records: every partition below `merging_from`
/// records, else `1/k` with `k = √(2·base/copied)` (module doc), at least
/// one partition.
pub(super) fn merge_share(base: u64, copied: u64, span: u32, merging_from: u64) -> u32 {
    if span == 0 || base < merging_from {
        return span;
    }
    let k = (2.0 * base as f64 / copied.max(1) as f64).sqrt().round();
    let k = (k as u32).clamp(1, span);
    span.div_ceil(k)
}

/// Where the next copy's merge starts: the partitions are merged in turn.
#[derive(Debug, Default)]
pub(super) struct MergeCursor(AtomicU32);

impl MergeCursor {
    /// The slice for a copy of `copied` records, and the cursor moved past
    /// it.
    pub(super) fn next_slice(
        &self,
        base: u64,
        copied: u64,
        span: u32,
        merging_from: u64,
    ) -> MergeSlice {
        let count = merge_share(base, copied, span, merging_from);
        let first = if span == 0 {
            0
        } else {
            self.0.load(Ordering::Relaxed) % span
        };
        self.0
            .store(first.saturating_add(count) % span.max(1), Ordering::Relaxed);
        MergeSlice { first, count, span }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use redb::ReadableDatabase;

    use super::*;

    #[test]
    fn the_share_merged_follows_the_square_root_of_the_sizes() {
        // Small base: every partition each copy.
        assert_eq!(merge_share(1_000, 3_000, 64, 0), 64);
        // k = √(2·90M/2.7M) ≈ 8: an eighth of 64.
        assert_eq!(merge_share(90_000_000, 2_700_000, 64, 0), 8);
        // Below the size that merges, every partition whatever k says.
        assert_eq!(merge_share(90_000_000, 2_700_000, 64, 90_000_001), 64);
        // Never less than one partition.
        assert_eq!(merge_share(u64::MAX, 1, 64, 0), 1);
        assert_eq!(merge_share(5, 0, 0, 0), 0);
    }

    /// With the default memory budget, a store of 10 M records takes
    /// copies whole and one of 100 M merges them a share at a time: the
    /// sizes whose paired runs set the threshold.
    #[test]
    fn the_default_budget_merges_at_100_million_records_not_at_10() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::Store::open(dir.path()).unwrap();
        let from = merging_from(store.cache_bytes);
        assert!((10_000_000..100_000_000).contains(&from), "{from}");
    }

    #[test]
    fn slices_go_round_every_partition_in_turn() {
        let cursor = MergeCursor::default();
        let mut merged = vec![0; 10];
        for _ in 0..5 {
            // k = 2 over 10 partitions: halves, alternately.
            let slice = cursor.next_slice(200, 100, 10, 0);
            for (partition, count) in merged.iter_mut().enumerate() {
                *count += u32::from(slice.contains(partition as u32));
            }
        }
        assert!(
            merged.iter().all(|&count| (2..=3).contains(&count)),
            "{merged:?}"
        );
        let wrapping = MergeSlice {
            first: 8,
            count: 3,
            span: 10,
        };
        let inside: Vec<u32> = (0..12).filter(|&p| wrapping.contains(p)).collect();
        assert_eq!(inside, [0, 8, 9]);
    }

    /// URLs over eight partitions.
    fn new_urls(range: std::ops::Range<usize>, maybe_known: bool) -> Vec<super::super::NewUrl> {
        range
            .map(|i| super::super::NewUrl {
                crawl: "c".into(),
                url: format!("http://h{}/p{i}", i % 5),
                partition: (i % 8) as u32,
                maybe_known,
                record: super::super::UrlRecord {
                    created_at: 1,
                    due_at: 5,
                    queue_key: format!("h{}", i % 5),
                    ..Default::default()
                },
            })
            .collect()
    }

    fn recent_records(store: &super::super::Store) -> u64 {
        let files = store.files().unwrap();
        let read = files.urls_db.begin_read().unwrap();
        open_if_exists(&read, URL_RECORDS_RECENT)
            .unwrap()
            .map_or(0, |table| table.len().unwrap())
    }

    /// Records the applier leaves in the recent table are found by every
    /// read (lookups, the known check, scans), once each, and survive a
    /// restart whose replay writes the same URLs to the base table again.
    #[test]
    fn records_left_in_the_recent_table_are_found_once_and_kept() {
        use super::super::Store;
        let dir = tempfile::tempdir().unwrap();
        let total = 432;
        // A budget whose page caches a base of 400 records outgrows.
        let budget = 6 * 2048;
        {
            let store = Store::open_with_cache(dir.path(), budget).unwrap();
            assert!(merging_from(store.cache_bytes) <= 400);
            store.hold_writes();
            // Into an empty base, a copy merges every partition; then
            // copies of 8 into a base of 400 merge one partition of the
            // eight each (k = √(2·400/8) = 10, at most 8).
            assert!(
                store
                    .insert_if_absent(&new_urls(0..400, false))
                    .unwrap()
                    .iter()
                    .all(|s| *s)
            );
            assert!(store.apply_held().unwrap());
            assert_eq!(recent_records(&store), 0);
            for start in (400..total).step_by(8) {
                let urls = new_urls(start..start + 8, false);
                assert!(store.insert_if_absent(&urls).unwrap().iter().all(|s| *s));
                assert!(store.apply_held().unwrap());
            }
            assert!(
                recent_records(&store) > 0,
                "some records wait in the recent table"
            );
            let known = store.insert_if_absent(&new_urls(0..total, true)).unwrap();
            assert!(known.iter().all(|stored| !stored), "every URL is known");
            assert!(store.apply_held().unwrap() || !store.unapplied());
            for url in new_urls(0..total, true) {
                assert!(
                    store.get(url.partition, "c", &url.url).unwrap().is_some(),
                    "{}",
                    url.url
                );
            }
            let mut seen = Vec::new();
            store
                .for_each_url(|_, _, url, _| seen.push(url.to_owned()))
                .unwrap();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), total);
            // Logged, held, never copied: the reopening replays them into
            // the base table.
            let again = store
                .insert_if_absent(&new_urls(total..total + 8, false))
                .unwrap();
            assert!(again.iter().all(|s| *s));
        }
        let store = Store::open_with_cache(dir.path(), budget).unwrap();
        let mut scanned = 0;
        store.for_each_url(|_, _, _, _| scanned += 1).unwrap();
        assert_eq!(scanned, total + 8);
        let known = store
            .insert_if_absent(&new_urls(0..total + 8, true))
            .unwrap();
        assert!(known.iter().all(|stored| !stored));
    }

    /// A change to the model of the records: `None` removes.
    type Step = (RecordKey, Option<Vec<u8>>);

    fn key() -> impl Strategy<Value = RecordKey> {
        (0u32..4, 0u32..2, 0u64..12)
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            key(),
            proptest::option::of(proptest::collection::vec(1u8..=255, 1..4)),
        )
    }

    /// What a run of copies and direct writes leaves, read back.
    fn read_back(db: &redb::Database) -> Vec<(RecordKey, Vec<u8>)> {
        let read = db.begin_read().unwrap();
        let records = RecordsRead::open(&read).unwrap().unwrap();
        records.iter().unwrap().collect::<Result<_, _>>().unwrap()
    }

    proptest! {
        /// Copies through the recent table (each merging a slice) and
        /// direct writes to the base read back, by key and by range, as
        /// the newest write of each key.
        #[test]
        fn records_read_back_as_the_newest_write_of_each_key(
            rounds in proptest::collection::vec(
                (proptest::collection::vec(step(), 0..12), any::<bool>(), 0u64..40),
                1..8,
            ),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let db = redb::Database::create(dir.path().join("urls.redb")).unwrap();
            let cursor = MergeCursor::default();
            let mut model: BTreeMap<RecordKey, Vec<u8>> = BTreeMap::new();
            for (steps, direct, base_size) in rounds {
                let write = db.begin_write().unwrap();
                {
                    let mut records = RecordsWrite::open(&write).unwrap();
                    if direct {
                        for (key, value) in &steps {
                            match value {
                                Some(value) => {
                                    let old = records.insert(*key, value.clone()).unwrap();
                                    prop_assert_eq!(old, model.insert(*key, value.clone()));
                                }
                                None => {
                                    prop_assert_eq!(
                                        records.get(*key).unwrap(),
                                        model.remove(key)
                                    );
                                    records.remove(*key).unwrap();
                                }
                            }
                        }
                    } else {
                        let mut copy = RecordMap::default();
                        for (key, value) in &steps {
                            copy.insert(*key, value.clone().map(Vec::into_boxed_slice));
                            match value {
                                Some(value) => model.insert(*key, value.clone()),
                                None => model.remove(key),
                            };
                        }
                        let span = records.recent_span().unwrap().max(copy.partitions());
                        // Sizes that make slices of one partition up to all.
                        let slice = cursor.next_slice(base_size, steps.len() as u64, span, 0);
                        records.write_copy(&copy, &slice).unwrap();
                    }
                    for (key, value) in &model {
                        prop_assert_eq!(records.get(*key).unwrap(), Some(value.clone()));
                    }
                    let range = (1, 0, 3)..=(2, 1, 7);
                    let expected: Vec<_> = model
                        .range(range.clone())
                        .map(|(key, value)| (*key, value.clone()))
                        .collect();
                    prop_assert_eq!(records.records_in(range).unwrap(), expected);
                }
                write.commit().unwrap();
                let expected: Vec<_> =
                    model.iter().map(|(key, value)| (*key, value.clone())).collect();
                prop_assert_eq!(read_back(&db), expected);
            }
        }
    }
}
