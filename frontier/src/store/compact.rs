//! The redb files compacted at a clean close, while they are small.
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

/// Files of at least this length are compacted: below it the room that
/// could be given back is not worth a shutdown's time.
const COMPACT_FROM_BYTES: u64 = 64 << 20;

/// Files longer than this are left as they are: compaction time grows
/// with the file, and this keeps a shutdown within the 30 s a container
/// runtime gives by default (BENCHMARKS.md has the times).
const COMPACT_UP_TO_BYTES: u64 = 3 << 30;

/// Compacts `db` (the file at `path`) if its length is within the bounds
/// above. A failure is logged, not returned: the file is as durable as
/// before, only longer (redb compacts with durable commits).
pub(super) fn compact_at_close(db: &mut Database, path: &Path) {
    compact_within(db, path, COMPACT_FROM_BYTES..=COMPACT_UP_TO_BYTES);
}

fn compact_within(db: &mut Database, path: &Path, lengths: std::ops::RangeInclusive<u64>) {
    let Ok(length) = std::fs::metadata(path).map(|m| m.len()) else {
        return;
    };
    if !lengths.contains(&length) {
        return;
    }
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
