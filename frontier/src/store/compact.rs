//! The store's clean close ([`Store::close`]), and the redb files
//! compacted at it while they are small.
//!
//! A redb file grows by doubling until it spans a 4 GiB region, and
//! between two durable commits the pages a write copies keep their old
//! copies too: below that size, up to half of a busy file is free room.
//! redb gives it back only by compacting, which needs the file to itself,
//! so it is done at a clean close, once the final checkpoint has made both
//! files durable and emptied the log. Larger files grow a region at a
//! time, their free room is a smaller share of them, and compacting them
//! would hold up a shutdown for longer than a deployment's grace period.

use std::path::Path;
use std::time::Instant;

use redb::Database;

use super::{Files, Store, URLS_FILE_NAME};

impl Store {
    /// Closes the store, on the caller's thread: a final checkpoint leaves
    /// both files durable and the log empty (so the next start replays
    /// nothing), the log is cut back to its first size, and the files are
    /// compacted while small. Every later call is refused. After a failure
    /// nothing more is committed: the next start replays what the log
    /// holds. Dropping the store closes it too, but a clean shutdown calls
    /// this: the last handle may be dropped on a thread the process does
    /// not wait for.
    pub fn close(&self) {
        let writable = self.lock_writer().wal.check_writable().is_ok()
            && self.lock_main_file().halted.is_none();
        if !writable || self.files().is_err() {
            return;
        }
        if let Err(error) = self.checkpoint() {
            tracing::warn!(%error, "final checkpoint failed; the next start replays the write-ahead log");
            return;
        }
        let data_dir = self.data_dir().to_owned();
        if let Err(error) = self.lock_writer().wal.shrink_when_empty(&data_dir) {
            tracing::warn!(%error, "the emptied write-ahead log could not be given back its first size");
        }
        // No applier turn from here on: it would open a snapshot, which
        // compaction refuses to run beside.
        let _applying = self.held.lock_applying();
        self.forget_records_snapshot();
        // Taken under the write lock: a reader waits, then is refused.
        let mut files = self.files.take_whole();
        if let Some(Files { db, urls_db }) = files.as_mut() {
            let urls_path = data_dir.join(URLS_FILE_NAME);
            std::thread::scope(|scope| {
                scope.spawn(|| compact_at_close(urls_db, &urls_path));
                compact_at_close(db, &self.path);
            });
        }
        *files = None;
    }
}

/// Files of at least this size on disk are compacted: below it the room that
/// could be given back is not worth a shutdown's time.
const COMPACT_FROM_BYTES: u64 = 64 << 20;

/// Files larger than this on disk are left as they are: compaction time grows
/// with the file, and at this bound a shutdown took over a minute on a slow
/// VM (BENCHMARKS.md has the times; the deployment files give the frontier
/// two minutes). A lower one would leave a store of 10 M URLs uncompacted, and
/// over the disk its URLs are meant to take.
const COMPACT_UP_TO_BYTES: u64 = 3 << 30;

/// Compacts `db` (the file at `path`) if its size on disk is within the
/// bounds above. A failure is logged, not returned: the file is as durable as
/// before, only longer (redb compacts with durable commits).
pub(super) fn compact_at_close(db: &mut Database, path: &Path) {
    compact_within(db, path, COMPACT_FROM_BYTES..=COMPACT_UP_TO_BYTES);
}

/// `sizes` bounds the bytes the file holds on disk: its length may run
/// far past them, redb having grown it by a doubling it has not written
/// yet (and cuts back at close).
fn compact_within(db: &mut Database, path: &Path, sizes: std::ops::RangeInclusive<u64>) {
    use std::os::unix::fs::MetadataExt;
    let Ok((length, size)) = std::fs::metadata(path).map(|m| (m.len(), m.blocks() * 512)) else {
        return;
    };
    if !sizes.contains(&size) {
        return;
    }
    // Logged first, so an operator whose shutdown was cut short can tell
    // it was cut short in compaction, where a kill costs no data.
    tracing::info!(path = %path.display(), mb = size >> 20, "compacting at close");
    let started = Instant::now();
    match db.compact() {
        Ok(_) => {
            let after = std::fs::metadata(path).map_or(length, |m| m.len());
            tracing::info!(
                path = %path.display(),
                mb_before = length >> 20,
                mb_after = after >> 20,
                ms = started.elapsed().as_millis() as u64,
                "compacted at close"
            );
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "compaction at close failed; the file stays as it was");
        }
    }
}

#[cfg(test)]
mod tests {
    use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};

    use super::*;

    const TABLE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("t");

    /// A file whose table grew and then lost most of its rows.
    fn file_with_free_room(path: &Path) -> Database {
        let db = Database::create(path).unwrap();
        let write = db.begin_write().unwrap();
        {
            let mut table = write.open_table(TABLE).unwrap();
            for key in 0..20_000_u64 {
                table.insert(key, [7_u8; 200].as_slice()).unwrap();
            }
        }
        write.commit().unwrap();
        let write = db.begin_write().unwrap();
        {
            let mut table = write.open_table(TABLE).unwrap();
            for key in 100..20_000_u64 {
                table.remove(key).unwrap();
            }
        }
        write.commit().unwrap();
        db
    }

    #[test]
    fn a_file_within_the_bounds_is_compacted_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.redb");
        let mut db = file_with_free_room(&path);
        let before = std::fs::metadata(&path).unwrap().len();
        compact_within(&mut db, &path, 0..=u64::MAX);
        let after = std::fs::metadata(&path).unwrap().len();
        assert!(after < before / 2, "{before} -> {after}");
        let read = db.begin_read().unwrap();
        let table = read.open_table(TABLE).unwrap();
        assert_eq!(table.len().unwrap(), 100);
        assert_eq!(table.get(99).unwrap().unwrap().value(), [7_u8; 200]);
    }

    #[test]
    fn a_file_outside_the_bounds_or_in_use_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.redb");
        let mut db = file_with_free_room(&path);
        let before = std::fs::metadata(&path).unwrap().len();
        compact_within(&mut db, &path, before + 1..=u64::MAX);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), before);
        let reading = db.begin_read().unwrap();
        compact_within(&mut db, &path, 0..=u64::MAX);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), before);
        drop(reading);
    }
}
