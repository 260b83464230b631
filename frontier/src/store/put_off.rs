//! `serving_order` removals held back from `frontier.redb` after their
//! layer is written, until there are many.
//!
//! A completed URL removes its `serving_order` entry, and completions
//! spread over every queue: the removals of one applier copy land on
//! nearly every leaf page of the table, and redb rewrites each page a
//! transaction changes whole. Written with every copy, they made up most
//! of what the applier wrote to `frontier.redb`. Held back, many removals
//! share each page rewritten.
//!
//! The removals are kept as a third layer under the two of module `held`:
//! readers overlay it as they do the others, so a removed entry is never
//! read. A later insert of a removed key is written with its layer, so it
//! leaves this set then (the file has the key again, and the set must not
//! hide it or remove it).
//!
//! The removals reach the file
//! - with the applier's next copy once they outgrow their share of the
//!   held limit;
//! - before a checkpoint's durable commits, so that the log restarted
//!   after it is never needed for them;
//! - when what is held is drained (before a deletion, which writes the
//!   file itself, and at shutdown).
//!
//! `frontier.redb`'s `applied_lsn` says only the groups whose every
//! change it holds: the one before the first layer whose removals wait.
//! The file is made durable between checkpoints too (a setting, the lease
//! horizon), and after a kill then, the replay redoes the file's changes
//! of the later groups, the waiting removals among them.
//!
//! A reopening of the files after a failed write (module `recover`) takes
//! them back to their last durable commit, a checkpoint's, which held
//! nothing back, and replays the log after it, removals included: the
//! set then starts empty with the rest of what is held.
//!
//! Each time, under the held lock, the set is emptied and the held state
//! counts a layer let go, as for a written layer: a reader that copied the
//! set before sees the removals, one that copies it after opens its
//! snapshot after the commit ([`super::Store::held_and_snapshot`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use redb::ReadableTableMetadata;

use super::locks::OrderedMutexGuard;
use super::schema::{APPLIED_LSN_KEY, META, ORDER_ENTRY, OrderKey, SERVING_ORDER};
use super::{Store, StoreError};

/// The share of the held limit held-back removals may take before the
/// applier's next copy writes them: small beside the layers themselves,
/// and at the memory budget's smallest still thousands of removals a
/// leaf page of a table of a million entries.
const PUT_OFF_SHARE: usize = 4;

/// The removals held back, shared with the applier while it writes them.
#[derive(Debug, Default)]
pub(super) struct PutOff {
    keys: Arc<BTreeSet<OrderKey>>,
    /// While there are keys: the newest group whose every change
    /// `frontier.redb` holds, the one before the first layer whose
    /// removals were held back. The file's `applied_lsn` says no more: if
    /// a durable commit of the file (a setting, the lease horizon) is
    /// followed by a kill, the replay redoes the file's changes of the
    /// groups after it, the held-back removals among them.
    complete_up_to: u64,
}

impl PutOff {
    /// The removed keys in `range`, in key order.
    pub(super) fn range(
        &self,
        range: impl std::ops::RangeBounds<OrderKey>,
    ) -> impl Iterator<Item = &OrderKey> {
        self.keys.range(range)
    }

    /// Bytes the set takes, at most: a key costs no more than a held
    /// `serving_order` entry, whose value it lacks.
    pub(super) fn bytes(&self) -> usize {
        self.keys.len() * ORDER_ENTRY
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The set as it is now, for a writer off the lock.
    pub(super) fn share(&self) -> Arc<BTreeSet<OrderKey>> {
        Arc::clone(&self.keys)
    }

    /// Whether the set has outgrown its share of `held_limit`.
    pub(super) fn due(&self, held_limit: usize) -> bool {
        !self.keys.is_empty() && self.bytes() >= held_limit / PUT_OFF_SHARE
    }

    /// The newest group whose every change `frontier.redb` holds once a
    /// layer is written without its removals: the layer's groups come
    /// after `after` and go up to `newest`; `removes`: whether it holds
    /// removals.
    pub(super) fn complete_up_to(&self, after: u64, newest: u64, removes: bool) -> u64 {
        if !self.keys.is_empty() {
            self.complete_up_to
        } else if removes {
            after
        } else {
            newest
        }
    }

    /// Takes in what a layer written without its removals leaves out,
    /// given its `serving_order` changes and the newest group the files
    /// held before it (`after`): its removals join the set, its inserts
    /// (written) leave it.
    pub(super) fn absorb<'a>(
        &mut self,
        written: impl Iterator<Item = (&'a OrderKey, &'a Option<u32>)>,
        after: u64,
    ) {
        if self.keys.is_empty() {
            self.complete_up_to = after;
        }
        let keys = Arc::make_mut(&mut self.keys);
        for (key, value) in written {
            match value {
                None => {
                    keys.insert(*key);
                }
                Some(_) if !keys.is_empty() => {
                    keys.remove(key);
                }
                Some(_) => {}
            }
        }
    }

    /// Lets go of the removals a file now holds.
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Entries of the table a scan may pass over per key it removes before
/// removing each key by itself costs less: a removal descends the tree
/// from its root, a scan steps from one entry to the next.
const SCANNED_PER_REMOVAL: u64 = 16;

/// Removes `keys` from `serving_order` in `order`. Many removals (a
/// checkpoint's, after completions all over the table) are made in one
/// scan of the span they cover, which takes the entries of a leaf out
/// together; a few, one by one.
pub(super) fn remove_from(
    order: &mut redb::Table<'_, OrderKey, u32>,
    keys: &BTreeSet<OrderKey>,
) -> Result<(), StoreError> {
    let (Some(&first), Some(&last)) = (keys.first(), keys.last()) else {
        return Ok(());
    };
    if (keys.len() as u64).saturating_mul(SCANNED_PER_REMOVAL) < order.len()? {
        for key in keys {
            order.remove(*key)?;
        }
        return Ok(());
    }
    let mut removed = keys.iter().peekable();
    order.retain_in(first..=last, |key, _| {
        while removed.next_if(|removed| **removed < key).is_some() {}
        removed.next_if_eq(&&key).is_none()
    })?;
    Ok(())
}

impl Store {
    /// Writes the held-back removals to `frontier.redb` (non-durably: the
    /// log holds their groups until a checkpoint, which calls this first),
    /// then lets them go. The caller holds `applying`, which `_applying`
    /// shows: no applier copy runs meanwhile.
    pub(super) fn write_put_off(
        &self,
        _applying: &OrderedMutexGuard<'_, ()>,
    ) -> Result<(), StoreError> {
        let keys = self.held.read().put_off.share();
        if keys.is_empty() {
            return Ok(());
        }
        // No copy runs: the file holds every group up to this but the
        // removals.
        let upto = self.lock_main_file().lsn;
        {
            let files = self.files()?;
            Self::remove_put_off_in(&files.db, &keys, upto)?;
        }
        let mut held = self.held.write();
        held.put_off.clear();
        held.count_released();
        self.held.note_unwritten(&held);
        Ok(())
    }

    /// Removes `keys` from `serving_order` in `db`, non-durably, which
    /// then holds every group up to `upto`.
    fn remove_put_off_in(
        db: &redb::Database,
        keys: &BTreeSet<OrderKey>,
        upto: u64,
    ) -> Result<(), StoreError> {
        let mut write = db.begin_write()?;
        write.set_durability(redb::Durability::None)?;
        remove_from(&mut write.open_table(SERVING_ORDER)?, keys)?;
        write.open_table(META)?.insert(APPLIED_LSN_KEY, upto)?;
        write.commit()?;
        Ok(())
    }

    /// Tests: how many removals are held back.
    #[cfg(test)]
    pub(crate) fn put_off_removals(&self) -> usize {
        self.held.read().put_off.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{KnownUrl, NewUrl, UrlRecord, WriteOp};
    use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};
    use std::collections::BTreeMap;

    fn url(i: usize) -> String {
        format!("http://h/p{i}")
    }

    /// `url(0)` to `url(count - 1)`, due at 5.
    fn new_urls(count: usize) -> Vec<NewUrl> {
        (0..count)
            .map(|i| NewUrl {
                crawl: "c".into(),
                url: url(i),
                partition: 0,
                maybe_known: false,
                record: UrlRecord {
                    created_at: 1,
                    due_at: 5,
                    queue_key: "h".into(),
                    ..UrlRecord::default()
                },
            })
            .collect()
    }

    /// A report of `url(i)`: completed (`due_at` 0) or due again.
    fn report(i: usize, due_at: u64) -> WriteOp {
        WriteOp::Known(KnownUrl {
            crawl: "c".into(),
            url: url(i),
            partition: 0,
            queue_key: None,
            default_queue: "h".into(),
            due_at,
            metadata: Default::default(),
            now: 2,
            report: None,
        })
    }

    /// A store in `dir` holding writes, with `url(0)` to `url(5)` stored
    /// and the first four completed, their removals held back.
    fn four_of_six_completed(dir: &std::path::Path) -> Store {
        let store = Store::open(dir).unwrap();
        store.hold_writes();
        store.insert_if_absent(&new_urls(6)).unwrap();
        assert!(store.apply_held().unwrap());
        store
            .apply(&(0..4).map(|i| report(i, 0)).collect::<Vec<_>>())
            .unwrap();
        assert!(store.apply_held().unwrap());
        assert_eq!(store.put_off_removals(), 4);
        store
    }

    fn file_entries(store: &Store) -> u64 {
        let read = store.files().unwrap().db.begin_read().unwrap();
        read.open_table(SERVING_ORDER).unwrap().len().unwrap()
    }

    fn due(store: &Store) -> Vec<String> {
        let page = store.due_entries("c", "h", None, 100).unwrap();
        let mut urls: Vec<String> = page.urls.into_iter().map(|due| due.url).collect();
        urls.sort();
        urls
    }

    /// Removals one by one and in one scan leave the same table, whether
    /// they are few or many beside it, present or not.
    #[test]
    fn removals_one_by_one_and_in_a_scan_leave_the_same_entries() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("order.redb")).unwrap();
        let entries: Vec<OrderKey> = (0..3_000_u64)
            .map(|n| ((n % 7) as u32, n / 7, n.wrapping_mul(0x9e37_79b9)))
            .collect();
        // Every 2nd (a scan), every 97th (one by one), and keys absent.
        for step in [2, 97] {
            let write = db.begin_write().unwrap();
            write.delete_table(SERVING_ORDER).unwrap();
            {
                let mut order = write.open_table(SERVING_ORDER).unwrap();
                for key in &entries {
                    order.insert(*key, 1).unwrap();
                }
                let mut keys: BTreeSet<OrderKey> = entries.iter().step_by(step).copied().collect();
                keys.extend([(0, 0, 1), (9, 0, 0), (3, 7, 5)]);
                remove_from(&mut order, &keys).unwrap();
                let left: Vec<OrderKey> = (order.iter().unwrap())
                    .map(|entry| entry.unwrap().0.value())
                    .collect();
                let mut expected: Vec<OrderKey> = entries
                    .iter()
                    .filter(|key| !keys.contains(key))
                    .copied()
                    .collect();
                expected.sort_unstable();
                assert_eq!(left, expected, "every {step}th removed");
            }
            write.commit().unwrap();
        }
    }

    /// Completed URLs' entries stay in the file after their layer is
    /// written, yet are neither served nor counted; a URL due again at its
    /// old date keeps its entry; a checkpoint removes the rest, and a
    /// reopened store serves what it served before.
    #[test]
    fn removals_held_back_hide_their_entries_until_a_checkpoint_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        let served = [url(0), url(4), url(5)];
        {
            let store = four_of_six_completed(dir.path());
            assert_eq!(file_entries(&store), 6, "the removals are held back");
            assert_eq!(due(&store), [url(4), url(5)]);
            assert_eq!(store.count_due("c", 10, |_| true).unwrap().now, 2);

            store.apply(&[report(0, 5)]).unwrap();
            assert!(store.apply_held().unwrap());
            assert_eq!(store.put_off_removals(), 3, "written again: not removed");
            assert_eq!(due(&store), served);

            store.checkpoint_held().unwrap();
            assert_eq!(store.put_off_removals(), 0);
            assert_eq!(file_entries(&store), 3);
            assert_eq!(due(&store), served);
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(file_entries(&store), 3);
        assert_eq!(due(&store), served);
    }

    /// A drain (before a deletion, at shutdown) writes the held-back
    /// removals too.
    #[test]
    fn a_drain_writes_the_removals_held_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.hold_writes();
        let urls = new_urls(3);
        store.insert_if_absent(&urls).unwrap();
        store.apply(&[report(1, 0)]).unwrap();
        assert!(store.apply_held().unwrap());
        assert_eq!(store.put_off_removals(), 1);
        store.drain_held().unwrap();
        assert_eq!(store.put_off_removals(), 0);
        assert_eq!(file_entries(&store), 2);
    }

    #[test]
    fn a_later_insert_takes_a_key_out_and_a_removal_puts_it_in() {
        let mut put_off = PutOff::default();
        let layer = BTreeMap::from([((1, 5, 9), None), ((1, 6, 9), None)]);
        put_off.absorb(layer.iter(), 7);
        let later = BTreeMap::from([((1, 5, 9), Some(3)), ((2, 1, 1), Some(3))]);
        put_off.absorb(later.iter(), 8);
        assert_eq!(put_off.range(..).copied().collect::<Vec<_>>(), [(1, 6, 9)]);
        assert!(put_off.due(ORDER_ENTRY * PUT_OFF_SHARE));
        assert!(!put_off.due(ORDER_ENTRY * PUT_OFF_SHARE * 2));
        // Complete up to the group before the first layer held back.
        assert_eq!(put_off.complete_up_to(9, 12, true), 7);
        put_off.clear();
        assert_eq!(put_off.complete_up_to(9, 12, true), 9);
        assert_eq!(put_off.complete_up_to(9, 12, false), 12);
    }

    /// A durable commit of `frontier.redb` between checkpoints (the lease
    /// horizon, a setting), then a kill: the removals held back are not in
    /// that commit, and the reopened store replays them.
    #[test]
    fn a_kill_after_a_durable_commit_of_the_main_file_loses_no_removal() {
        let live = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        {
            let store = four_of_six_completed(live.path());
            store.set_leases_until(1_000).unwrap();
            for name in [super::super::FILE_NAME, super::super::URLS_FILE_NAME] {
                std::fs::copy(live.path().join(name), image.path().join(name)).unwrap();
            }
            let log = crate::wal::FILE_NAME;
            std::fs::copy(live.path().join(log), image.path().join(log)).unwrap();
        }
        let store = Store::open(image.path()).unwrap();
        assert_eq!(file_entries(&store), 2);
        assert_eq!(due(&store), [url(4), url(5)]);
    }
}
