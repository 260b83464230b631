//! A new pass of the log that keeps the records after the durable one.
//!
//! The kept records are the groups logged while a checkpoint's durable
//! commits ran, and a busy store logs many of them: copying and syncing
//! them while the writer's lock is held stopped every group for as long.
//! So a restart goes in three steps: [`Wal::begin_restart`], under the
//! writer's lock, says what to keep and takes the spare file;
//! [`PendingRestart::copy`], off it while groups go on being logged,
//! copies those records into the spare and syncs it; and
//! [`Wal::finish_restart`], under the lock again, copies the few records
//! logged meanwhile and swaps the files (the tests run the three at once,
//! `Wal::restart_keeping`). The copy step also allocates the new pass,
//! for half again the pass that ends ([`PASS_HEADROOM`]), so that it is
//! not grown under the lock later.
//!
//! The records copied off the lock are safe to read there: a record is
//! taken back ([`Wal::unappend`]) only under the same hold of the lock
//! that appended it, so those present when the restart began are final.
//! If the log started another pass in between (a checkpoint with nothing
//! to keep), the copy is not that pass's and is dropped.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{
    HEADER_LEN, INITIAL_CAPACITY, SPARE_NAME, Wal, WalError, allocate, header, io_error, sync_dir,
};

/// Bytes copied from the log to the spare at a time.
const COPY_CHUNK: usize = 4 << 20;

/// What [`Wal::begin_restart`] found.
#[derive(Debug)]
pub enum Restart {
    /// No record after the durable one: the log started over at once.
    Done,
    /// The spare still holds records that are not durable: it cannot be
    /// written yet, and the log goes on.
    NotYet,
    /// Records to keep: [`PendingRestart::copy`] them, then
    /// [`Wal::finish_restart`].
    Pending(PendingRestart),
}

/// A restart whose kept records are being copied into the spare file.
#[derive(Debug)]
pub struct PendingRestart {
    /// A second handle on the log, to read the kept records from.
    log: File,
    log_path: PathBuf,
    spare: File,
    spare_path: PathBuf,
    /// The length the spare is allocated to.
    capacity: u64,
    /// The least capacity the new pass may have: the log's own, grown by
    /// doubling to [`PASS_HEADROOM`] times the pass that ends.
    least_capacity: u64,
    /// Bytes left free on the disk (`Wal::keep_free`).
    floor: u64,
    store_id: u64,
    durable: u64,
    /// Where the first kept record starts in the log.
    from: u64,
    /// Where the log ended when the restart began: the records before it
    /// are the ones [`Self::copy`] copies.
    copied_to: u64,
    pass: u64,
}

impl PendingRestart {
    /// Copies the records kept at the restart's beginning into the spare,
    /// after a header, and syncs it. Needs no lock: see the module docs.
    pub fn copy(&mut self) -> Result<(), WalError> {
        // The kept records are part of the pass that ended, which the
        // least capacity holds with room to spare.
        let capacity = self.capacity.max(self.least_capacity);
        debug_assert!(HEADER_LEN + (self.copied_to - self.from) <= capacity);
        self.grow_spare(capacity)?;
        copy_records(self, self.from..self.copied_to)?;
        self.spare
            .sync_data()
            .map_err(|source| io_error(&self.spare_path, source))
    }

    /// Allocates the spare to `capacity` if it is shorter, and writes its
    /// header.
    fn grow_spare(&mut self, capacity: u64) -> Result<(), WalError> {
        (|| {
            let length = self.spare.metadata()?.len();
            if length < capacity {
                let started = Instant::now();
                if capacity - length > super::room_above_floor(&self.spare_path, self.floor) {
                    return Err(super::beyond_floor(capacity - length, self.floor));
                }
                allocate(&self.spare, &self.spare_path, length, capacity)?;
                tracing::debug!(
                    from = length,
                    to = capacity,
                    seconds = started.elapsed().as_secs_f64(),
                    "the log's spare grew"
                );
            }
            self.spare.write_all_at(&header(self.store_id, capacity), 0)
        })()
        .map_err(|source| io_error(&self.spare_path, source))?;
        self.capacity = capacity;
        Ok(())
    }
}

/// Copies the log's bytes in `range` to the spare, where a new pass
/// starting with the record at `pending.from` holds them.
fn copy_records(pending: &PendingRestart, range: std::ops::Range<u64>) -> Result<(), WalError> {
    let length = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
    let mut buffer = vec![0_u8; length.min(COPY_CHUNK)];
    let mut at = range.start;
    while at < range.end {
        let chunk = usize::try_from(range.end - at)
            .unwrap_or(usize::MAX)
            .min(buffer.len());
        pending
            .log
            .read_exact_at(&mut buffer[..chunk], at)
            .map_err(|source| io_error(&pending.log_path, source))?;
        pending
            .spare
            .write_all_at(&buffer[..chunk], HEADER_LEN + (at - pending.from))
            .map_err(|source| io_error(&pending.spare_path, source))?;
        at += chunk as u64;
    }
    Ok(())
}

/// The next pass is allocated for this many times the length of the pass
/// that ends. A log grows while a pass outruns it, under the writer's
/// lock, which every group waits on: writing and syncing hundreds of
/// megabytes of zeros there held up every answer for a second and more
/// once a large store's passes reached that size. Sized at the restart,
/// the new pass is allocated by the applier's thread, off that lock, and a
/// pass outgrows it only if it is over half again as long as the last.
pub(super) const PASS_HEADROOM: f64 = 1.5;

/// The capacity a new pass starts with after one of `ended` bytes in a
/// log of `capacity`: that capacity, doubled until it holds
/// [`PASS_HEADROOM`] times the pass.
pub(super) fn capacity_for_next_pass(capacity: u64, ended: u64) -> u64 {
    let wanted = (ended as f64 * PASS_HEADROOM) as u64;
    let mut grown = capacity.max(INITIAL_CAPACITY);
    while grown < wanted {
        grown = grown.saturating_mul(2);
    }
    grown
}

impl Wal {
    /// Starts a new pass after a durable redb commit that holds every
    /// record up to `durable`, keeping the records after it (groups logged
    /// while the commit ran). Without such records this is
    /// [`Self::checkpointed`]. With them, they are written from the first
    /// slot of the spare file and synced, and the two files swap names in
    /// one atomic rename: a crash before the swap leaves the log as it was,
    /// one after it the new pass. The spare is written only once its last
    /// pass is durable, so that what a replay finds after the new run is at
    /// or below the durable LSN, as after any checkpoint; until then the
    /// log goes on (answers `false`).
    #[cfg(test)]
    pub fn restart_keeping(&mut self, data_dir: &Path, durable: u64) -> Result<bool, WalError> {
        match self.begin_restart(data_dir, durable)? {
            Restart::Done => Ok(true),
            Restart::NotYet => Ok(false),
            Restart::Pending(mut pending) => {
                pending.copy()?;
                self.finish_restart(data_dir, pending)
            }
        }
    }

    /// The first step of `restart_keeping` (tests), under the writer's
    /// lock: the records to keep, and the spare file they go to.
    pub fn begin_restart(&mut self, data_dir: &Path, durable: u64) -> Result<Restart, WalError> {
        self.check_writable()?;
        let Some(first) = self.offsets.iter().position(|&(lsn, _)| lsn > durable) else {
            self.checkpointed();
            return Ok(Restart::Done);
        };
        if self
            .spare
            .as_ref()
            .is_some_and(|&(_, _, last)| last > durable)
        {
            return Ok(Restart::NotYet);
        }
        let spare_path = data_dir.join(SPARE_NAME);
        // Taken: if the restart fails, the spare is made afresh next time.
        let (spare, capacity, _) = match self.spare.take() {
            Some(spare) => spare,
            None => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&spare_path)
                    .map_err(|source| io_error(&spare_path, source))?;
                (file, 0, 0)
            }
        };
        let log = self
            .file
            .try_clone()
            .map_err(|source| io_error(&self.path, source))?;
        Ok(Restart::Pending(PendingRestart {
            log,
            log_path: self.path.clone(),
            spare,
            spare_path,
            capacity,
            least_capacity: capacity_for_next_pass(self.capacity, self.len),
            floor: self.floor,
            store_id: self.store_id,
            durable,
            from: self.offsets[first].1,
            copied_to: self.len,
            pass: self.pass,
        }))
    }

    /// The last step of `restart_keeping` (tests), under the writer's
    /// lock: the records logged since `pending` began are copied too, and
    /// the files swap. Answers `false`, keeping the log as it is, if the
    /// log started another pass since.
    pub fn finish_restart(
        &mut self,
        data_dir: &Path,
        mut pending: PendingRestart,
    ) -> Result<bool, WalError> {
        self.check_writable()?;
        if pending.pass != self.pass || self.len < pending.copied_to {
            return Ok(false);
        }
        let needed = HEADER_LEN + (self.len - pending.from);
        if needed > pending.capacity {
            pending.grow_spare(needed.max(pending.capacity.saturating_mul(2)))?;
        }
        copy_records(&pending, pending.copied_to..self.len)?;
        pending
            .spare
            .sync_data()
            .map_err(|source| io_error(&pending.spare_path, source))?;
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &pending.spare_path,
            rustix::fs::CWD,
            &self.path,
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .map_err(|errno| io_error(&self.path, errno.into()))?;
        // Until the directory is synced the swap may not last, and records
        // appended from now on go to the new log only.
        if let Err(source) = sync_dir(data_dir) {
            self.halt(format!(
                "syncing {} after a log swap: {source}",
                data_dir.display()
            ));
            return Err(io_error(&self.path, source));
        }
        let last = self.offsets.back().map_or(0, |&(lsn, _)| lsn);
        let old = std::mem::replace(&mut self.file, pending.spare);
        self.spare = Some((old, self.capacity, last));
        self.capacity = pending.capacity;
        let first = self
            .offsets
            .iter()
            .position(|&(lsn, _)| lsn > pending.durable)
            .unwrap_or(self.offsets.len());
        let shift = pending.from - HEADER_LEN;
        self.offsets.drain(..first);
        for (_, offset) in &mut self.offsets {
            *offset -= shift;
        }
        self.len = needed;
        self.pass += 1;
        self.last_checkpoint = Instant::now();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::deletion;
    use super::super::{FILE_NAME, read_records};
    use super::*;
    use crate::write_ops::WriteOp;

    const STORE: u64 = 0x5eed;

    fn lsns(dir: &Path, durable: u64) -> Vec<u64> {
        let recovered = read_records(dir, durable).unwrap();
        recovered.records.iter().map(|r| r.lsn).collect()
    }

    fn pending(restart: Restart) -> PendingRestart {
        match restart {
            Restart::Pending(pending) => pending,
            other => panic!("records to keep, not {other:?}"),
        }
    }

    /// Groups logged while the kept records are copied (off the writer's
    /// lock) are kept too, after them, and the new pass reads back whole,
    /// from the log and after a reopen.
    #[test]
    fn records_logged_while_the_kept_ones_are_copied_are_kept_too() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        // Larger than a copy's chunk, so the copy takes several.
        let big = deletion(&"x".repeat(COPY_CHUNK + 1000));
        wal.append(1, &deletion("u1")).unwrap();
        wal.append(2, &big).unwrap();
        wal.append(3, &deletion("u3")).unwrap();
        wal.sync().unwrap();
        let mut restart = pending(wal.begin_restart(dir.path(), 1).unwrap());
        restart.copy().unwrap();
        for lsn in 4..=6 {
            wal.append(lsn, &deletion(&format!("u{lsn}"))).unwrap();
        }
        wal.sync().unwrap();
        // Not swapped yet: the log is the old pass, with every record.
        assert_eq!(lsns(dir.path(), 0), [1, 2, 3, 4, 5, 6]);
        assert!(wal.finish_restart(dir.path(), restart).unwrap());
        assert_eq!(lsns(dir.path(), 1), [2, 3, 4, 5, 6]);
        wal.append(7, &deletion("u7")).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 1).unwrap();
        let read: Vec<(u64, Vec<WriteOp>)> = (recovered.records.into_iter())
            .map(|record| (record.lsn, record.ops))
            .collect();
        assert_eq!(read.len(), 6);
        assert_eq!(read[0], (2, big));
        assert_eq!(read[1], (3, deletion("u3")));
        assert_eq!(read[5], (7, deletion("u7")));
    }

    /// More logged during the copy than the spare was allocated for: the
    /// spare grows before the swap, and its header says so.
    #[test]
    fn the_spare_grows_for_what_was_logged_during_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        wal.append(1, &deletion("u1")).unwrap();
        wal.append(2, &deletion("u2")).unwrap();
        wal.sync().unwrap();
        let mut restart = pending(wal.begin_restart(dir.path(), 1).unwrap());
        restart.copy().unwrap();
        let big = deletion(&"y".repeat(2 * INITIAL_CAPACITY as usize));
        wal.append(3, &big).unwrap();
        wal.sync().unwrap();
        assert!(wal.finish_restart(dir.path(), restart).unwrap());
        let length = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
        assert!(length > 2 * INITIAL_CAPACITY);
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 1).unwrap();
        assert_eq!(recovered.records.len(), 2);
        assert_eq!(recovered.records[1].ops, big);
    }

    /// A checkpoint that started the log over while the copy ran makes the
    /// copy stale: finishing leaves the log as that checkpoint left it, and
    /// the next restart makes the spare afresh.
    #[test]
    fn a_copy_outlived_by_another_pass_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        wal.append(1, &deletion("u1")).unwrap();
        wal.append(2, &deletion("u2")).unwrap();
        wal.sync().unwrap();
        let mut restart = pending(wal.begin_restart(dir.path(), 1).unwrap());
        restart.copy().unwrap();
        // A durable commit of everything up to 2, and a new pass.
        wal.checkpointed();
        wal.append(3, &deletion("u3")).unwrap();
        wal.append(4, &deletion("u4")).unwrap();
        wal.sync().unwrap();
        assert!(!wal.finish_restart(dir.path(), restart).unwrap());
        assert_eq!(lsns(dir.path(), 2), [3, 4]);
        assert!(wal.restart_keeping(dir.path(), 3).unwrap());
        assert_eq!(lsns(dir.path(), 3), [4]);
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 3).unwrap();
        assert_eq!(recovered.records.len(), 1);
        assert_eq!(recovered.records[0].ops, deletion("u4"));
    }

    /// A new pass is allocated at the restart, off the writer's lock, for
    /// half again the pass that ended: a pass as long as the last one then
    /// never grows the log under the lock.
    #[test]
    fn a_new_pass_is_allocated_with_room_for_one_like_the_last() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        let length = || std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
        let record = deletion(&"x".repeat(1 << 17));
        // Three quarters of the first capacity, in records of about 128 KiB.
        let per_pass = 3 * INITIAL_CAPACITY / 4 / (1 << 17);
        for lsn in 1..=per_pass {
            wal.append(lsn, &record).unwrap();
        }
        wal.sync().unwrap();
        assert_eq!(length(), INITIAL_CAPACITY);
        assert!(wal.restart_keeping(dir.path(), per_pass - 1).unwrap());
        let allocated = length();
        assert_eq!(allocated, 2 * INITIAL_CAPACITY);
        for lsn in per_pass + 1..=2 * per_pass {
            wal.append(lsn, &record).unwrap();
        }
        wal.sync().unwrap();
        assert_eq!(length(), allocated, "grown under the writer's lock");
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, per_pass - 1).unwrap();
        assert_eq!(recovered.records.len() as u64, per_pass + 1);
    }

    proptest::proptest! {
        /// The next pass's capacity: never less than the log's, the least
        /// doubling of it that holds half again the pass that ended.
        #[test]
        fn the_next_pass_is_the_least_doubling_with_headroom(
            capacity_mib in 0_u64..4096,
            ended in 0_u64..(8 << 30),
        ) {
            let capacity = capacity_mib << 20;
            let next = capacity_for_next_pass(capacity, ended);
            let wanted = (ended as f64 * PASS_HEADROOM) as u64;
            let least = capacity.max(INITIAL_CAPACITY);
            proptest::prop_assert!(next >= least && next >= wanted);
            proptest::prop_assert!(next == least || next / 2 < wanted);
            proptest::prop_assert_eq!(next % least, 0);
        }
    }
}
