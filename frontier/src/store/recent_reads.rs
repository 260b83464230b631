//! Records a refill read from `urls.redb`, kept for the report that
//! follows.
//!
//! A URL's record is read from the file twice on its way through the
//! frontier: when a refill of its queue's buffer reads the due URLs, and
//! when the committer works out the report that completes it, which
//! rewrites the record. Both are B-tree lookups of the same key, a few
//! seconds apart at most in a busy crawl. The refill's values are kept
//! here, and the committer takes a key's value from here before it looks
//! in the file.
//!
//! # Why a value kept here is the file's
//!
//! A value is kept only as the file held it, never one that was held in
//! memory, and it is kept only if no change to the file has been noted
//! since before the refill opened the snapshot it read (`generation`):
//!
//! - a layer of held writes reaches the file before it is let go, and
//!   before it is let go [`RecentReads::forget`] drops the keys it wrote
//!   and counts a generation. A refill that noted the generation before
//!   that count opened its snapshot before the layer was let go: what it
//!   read of those keys may be older, and it keeps nothing, or kept it
//!   before the drop, which removed it. One that noted it after read a
//!   snapshot that holds the layer;
//! - a write to the file outside the applier (a deletion, a replay, a
//!   reopening after a failed write) is followed by [`RecentReads::clear`],
//!   which drops everything and counts a generation, with the same
//!   argument.
//!
//! So a key's value here is the file's, until a layer that changes it is
//! let go; until then that layer holds the key, and the committer, which
//! looks in what is held first, finds the newer value there.
//!
//! The values take at most a share of the page cache's budget; when they
//! would take more, all are dropped (a lookup then reads the file, as
//! without them).

use foldhash::HashMap;

use super::locks::{OrderedMutex, Rank};
use super::schema::RecordKey;

/// What one kept value costs beyond its bytes, roughly: its key, its box
/// and its slot in the map.
const ENTRY_BYTES: usize = 48;

/// Records read for refills, by key.
#[derive(Debug)]
pub(super) struct RecentReads {
    state: OrderedMutex<Reads>,
    /// Bytes the values may take.
    limit: usize,
}

#[derive(Debug, Default)]
struct Reads {
    /// Counts the changes of the file noted: a read kept is one made
    /// after the last.
    generation: u64,
    values: HashMap<RecordKey, Box<[u8]>>,
    bytes: usize,
}

impl RecentReads {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            state: OrderedMutex::with_default(Rank::RecentReads),
            limit,
        }
    }

    /// The generation a reader notes before it opens its snapshot.
    pub(super) fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// Keeps values read from the file in a snapshot opened after
    /// `generation` was noted, unless the file changed since.
    pub(super) fn keep(&self, generation: u64, read: Vec<(RecordKey, Vec<u8>)>) {
        if read.is_empty() {
            return;
        }
        let mut state = self.state.lock();
        if state.generation != generation {
            return;
        }
        for (key, value) in read {
            let bytes = value.len() + ENTRY_BYTES;
            if state.bytes + bytes > self.limit {
                state.values.clear();
                state.bytes = 0;
                if bytes > self.limit {
                    return;
                }
            }
            state.bytes += bytes;
            if let Some(replaced) = state.values.insert(key, value.into_boxed_slice()) {
                state.bytes -= replaced.len() + ENTRY_BYTES;
            }
        }
    }

    /// The file's value of `key`, if kept, taken: a report is worked out
    /// once, and the value it writes is held from then on.
    pub(super) fn take(&self, key: &RecordKey) -> Option<Vec<u8>> {
        let mut state = self.state.lock();
        let value = state.values.remove(key)?;
        state.bytes -= value.len() + ENTRY_BYTES;
        Some(value.into_vec())
    }

    /// Drops the keys a layer about to be let go wrote.
    pub(super) fn forget(&self, keys: impl Iterator<Item = RecordKey>) {
        let mut state = self.state.lock();
        state.generation += 1;
        if state.values.is_empty() {
            return;
        }
        for key in keys {
            if let Some(value) = state.values.remove(&key) {
                state.bytes -= value.len() + ENTRY_BYTES;
            }
        }
    }

    /// Drops everything: the file changed outside the applier.
    pub(super) fn clear(&self) {
        let mut state = self.state.lock();
        state.generation += 1;
        state.values.clear();
        state.bytes = 0;
    }

    /// Values kept now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.state.lock().values.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{Deletion, KnownUrl, NewUrl, Store, StoreOptions, WriteOp};
    use super::*;
    use crate::record::UrlRecord;

    /// A store whose URLs all share one record key (hashes of no bits),
    /// with writes held as the server holds them.
    fn one_key_store(dir: &std::path::Path) -> Store {
        let store = Store::open_with_hash_mask(dir, StoreOptions::default(), 0).unwrap();
        store.hold_writes();
        store
    }

    fn discover(store: &Store, url: &str) {
        store
            .apply(&[WriteOp::Discover(NewUrl {
                crawl: "c".into(),
                url: url.into(),
                partition: 0,
                maybe_known: true,
                record: UrlRecord {
                    created_at: 1,
                    due_at: 1,
                    queue_key: "q".into(),
                    ..UrlRecord::default()
                },
            })])
            .unwrap();
    }

    /// [`one_key_store`] with `http://q/a` written to the file, then
    /// refilled: its record is kept for its report.
    fn refilled_store(dir: &std::path::Path) -> Store {
        let store = one_key_store(dir);
        discover(&store, "http://q/a");
        assert!(store.apply_held().unwrap());
        store.due_entries("c", "q", None, 16).unwrap();
        assert_eq!(store.recent_reads.len(), 1);
        store
    }

    fn complete(store: &Store, url: &str) {
        store
            .apply(&[WriteOp::Known(KnownUrl {
                crawl: "c".into(),
                url: url.into(),
                partition: 0,
                queue_key: Some("q".into()),
                default_queue: "q".into(),
                due_at: 0,
                metadata: BTreeMap::new(),
                now: 2,
                report: None,
            })])
            .unwrap();
    }

    /// A refill reads its queue's record from the file; before it keeps
    /// it, a URL of the same key joins the record and the layer holding
    /// that is written and let go. The report that rewrites the key must
    /// start from the joined value, not the one the refill read.
    #[test]
    fn a_refill_that_read_before_a_layer_was_let_go_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = one_key_store(dir.path());
        discover(&store, "http://q/a");
        assert!(store.apply_held().unwrap());
        let joined: fn(&Store) = |store| {
            discover(store, "http://q/b");
            assert!(store.apply_held().unwrap());
        };
        *store.held.race.lock() = Some(("records read", joined));
        store.due_entries("c", "q", None, 16).unwrap();
        assert!(store.held.race.lock().is_none(), "the hook ran");
        assert_eq!(store.recent_reads.len(), 0);
        complete(&store, "http://q/a");
        assert!(store.get(0, "c", "http://q/b").unwrap().is_some());
        assert_eq!(store.get(0, "c", "http://q/a").unwrap().unwrap().due_at, 0);
    }

    /// What a refill kept is the report's, and the report takes it: its
    /// group reads nothing of the file.
    #[test]
    fn a_report_takes_what_the_refill_kept_and_reads_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = refilled_store(dir.path());
        let read_before = store
            .held
            .files_read
            .load(std::sync::atomic::Ordering::Relaxed);
        complete(&store, "http://q/a");
        let read_after = store
            .held
            .files_read
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(read_after, read_before);
        assert_eq!(store.recent_reads.len(), 0);
        assert_eq!(store.get(0, "c", "http://q/a").unwrap().unwrap().due_at, 0);
    }

    /// A deletion writes the files outside the applier: what a refill kept
    /// before it is dropped, so a report after it finds the URL gone.
    #[test]
    fn a_write_outside_the_applier_drops_every_value_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = refilled_store(dir.path());
        store
            .apply(&[WriteOp::Delete(Deletion {
                crawl: "c".into(),
                queue: Some("q".into()),
                created_before: None,
                partitions: 1,
                partition: None,
                urls_below: None,
            })])
            .unwrap();
        assert_eq!(store.recent_reads.len(), 0);
        complete(&store, "http://q/a");
        // Stored anew by its report: created then, not at its discovery.
        assert_eq!(
            store.get(0, "c", "http://q/a").unwrap().unwrap().created_at,
            2
        );
    }

    #[test]
    fn a_read_is_kept_only_while_the_file_is_unchanged_since_it_began() {
        let reads = RecentReads::new(1 << 20);
        let began = reads.generation();
        reads.forget(std::iter::empty());
        reads.keep(began, vec![((0, 0, 1), b"old".to_vec())]);
        assert_eq!(reads.take(&(0, 0, 1)), None, "a layer was let go meanwhile");
        let began = reads.generation();
        reads.keep(began, vec![((0, 0, 1), b"now".to_vec())]);
        assert_eq!(reads.take(&(0, 0, 1)), Some(b"now".to_vec()));
    }

    #[test]
    fn a_layer_let_go_drops_its_keys_and_a_clear_drops_all() {
        let reads = RecentReads::new(1 << 20);
        let began = reads.generation();
        reads.keep(
            began,
            vec![((0, 0, 1), b"a".to_vec()), ((0, 0, 2), b"b".to_vec())],
        );
        reads.forget([(0, 0, 1)].into_iter());
        assert_eq!(reads.take(&(0, 0, 1)), None);
        assert_eq!(reads.take(&(0, 0, 2)), Some(b"b".to_vec()));
        reads.clear();
        assert_eq!(reads.len(), 0);
    }

    #[test]
    fn values_past_the_limit_start_it_over() {
        let reads = RecentReads::new(3 * (ENTRY_BYTES + 10));
        let began = reads.generation();
        let value = |n: u64| ((0, 0, n), vec![0; 10]);
        reads.keep(began, (0..3).map(value).collect());
        assert_eq!(reads.len(), 3);
        reads.keep(began, vec![value(3)]);
        assert_eq!(reads.len(), 1, "dropped all, then kept the new one");
        assert!(reads.take(&(0, 0, 3)).is_some());
        reads.keep(began, vec![((0, 0, 9), vec![0; 4 * (ENTRY_BYTES + 10)])]);
        assert_eq!(reads.len(), 0, "a value over the limit is not kept");
    }
}
