//! The write-ahead log that makes an acknowledgement durable without a
//! durable redb commit per group.
//!
//! A durable redb commit writes every B-tree page the transaction touched
//! and waits for the disk; URLs of thousands of hosts touch a page each, so
//! per-group durable commits spent most of ingest writing pages. Instead
//! each group's writes are appended here (one sequential write and one
//! `fdatasync`), applied to redb with a non-durable commit (visible to every
//! reader at once), and redb is made durable by a checkpoint every few
//! seconds, after which the log starts again from its first record slot.
//! The record is synced before the group reaches redb, so nothing a reader
//! sees can be lost by a crash.
//!
//! # File format (`frontier.wal`, version 2)
//!
//! ```text
//! header  32 bytes  b"FRWAL\0\0\x02", u64 store id, u64 capacity,
//!                   u32 CRC-32 of the 24 bytes before it, u32 zero
//! record  u32 payload length, u32 CRC-32 of (lsn, payload), u64 lsn, payload
//! payload the group's writes (module `codec`)
//! ```
//!
//! Integers little-endian. The file is allocated to its capacity when it is
//! made (and grown, header rewritten, when a record would not fit), and is
//! never truncated: a checkpoint only moves the write position back to the
//! first slot. So its length is known, and a log that was cut short is
//! told apart from one that was checkpointed.
//!
//! # Reading it back
//!
//! Log sequence numbers (LSNs) rise by one per record; redb's `meta` tables
//! record the LSN of the last group each file applied, so after a crash the
//! records above the durable LSN are replayed. Reading starts at the first
//! slot and takes the run of valid records whose LSNs follow each other.
//! What comes after the run is one of:
//!
//! - zeros, or records of an earlier pass (their LSNs are at or below the
//!   durable LSN: the checkpoint that started this pass made them durable);
//! - a torn record: the one being written at the crash. Groups are written
//!   and synced one at a time, so at most one record is ever unsynced, and
//!   it was never acknowledged;
//! - damage: a record that is not valid, followed by a valid record with a
//!   higher LSN. A later record can only have been written after the
//!   damaged one was synced and acknowledged, so this is corruption, and it
//!   is refused with both offsets named; the file is left as it is.

mod allocate;
mod codec;
mod restart;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocate::allocate;
use codec::encode_ops_into;
pub use codec::{decode_ops, encode_ops};
pub use restart::{PendingRestart, Restart};

use crate::write_ops::WriteOp;

/// The log's file name inside the data directory.
pub const FILE_NAME: &str = "frontier.wal";

/// A second log file beside it, which a restart that must keep records
/// writes them into before the two swap names (see [`Wal::begin_restart`]).
/// Never read back: a start reads the log alone.
pub const SPARE_NAME: &str = "frontier.wal.spare";

/// The magic of format version 1 (an 8-byte header, truncated at
/// checkpoints), read only to migrate a store written by an older build.
const MAGIC_V1: &[u8; 8] = b"FRWAL\0\0\x01";
const MAGIC: &[u8; 8] = b"FRWAL\0\0\x02";
/// Where the first record starts.
pub const HEADER_LEN: u64 = 32;
const RECORD_HEADER_LEN: usize = 4 + 4 + 8;

/// The most memory the record buffer keeps between appends: a rare group
/// larger than this (a bulk import's) gives its buffer back.
const RECORD_BUFFER_KEPT: usize = 16 << 20;

/// Bytes allocated for a new log; it doubles when a record does not fit.
/// Small, since most stores checkpoint long before it fills.
const INITIAL_CAPACITY: u64 = 4 << 20;

/// How long non-durable commits may accumulate before a checkpoint. Longer
/// amortises page writes over more groups; shorter bounds the log and the
/// replay after a crash; chosen in paired runs (BENCHMARKS.md's history).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(4);

/// Log size that forces a checkpoint however recent the last one.
pub const CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// An I/O failure on the log file.
    #[error("write-ahead log {path}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The file system has no room for the log.
    #[error("write-ahead log {path}: the disk is full ({source})")]
    DiskFull {
        /// The log file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The store exists but its log does not.
    #[error(
        "{path} is missing: the store's acknowledged writes since its last checkpoint live there. Restore the file from where it went; `frontier salvage` copies what the other files hold into a new store"
    )]
    Missing {
        /// The log file.
        path: PathBuf,
    },
    /// The file does not start with a log header this build reads.
    #[error(
        "{path} is not a frontier write-ahead log (it is empty, or its header is damaged); `frontier verify` reports what the store holds, `frontier salvage` copies what can be read into a new store"
    )]
    NotALog {
        /// The log file.
        path: PathBuf,
    },
    /// The log belongs to another store.
    #[error(
        "{path} belongs to store {found:016x}, not to this store ({expected:016x}): the files come from different stores"
    )]
    OtherStore {
        /// The log file.
        path: PathBuf,
        /// The store ID in the log.
        found: u64,
        /// The store ID of the store files.
        expected: u64,
    },
    /// The file is shorter than the length it was allocated to.
    #[error(
        "{path} is {length} bytes but was allocated {capacity}: it was cut short, and acknowledged writes may be gone. Restore it, or `frontier salvage` what remains"
    )]
    Shortened {
        /// The log file.
        path: PathBuf,
        /// Its length now.
        length: u64,
        /// Its length as allocated.
        capacity: u64,
    },
    /// A damaged record with valid ones after it: corruption, not a torn
    /// last write.
    #[error(
        "write-ahead log {path} is damaged at byte {offset} (where record {expected_lsn} should be), and record {later_lsn} at byte {later_offset} is intact: acknowledged writes would be lost. The file is left as it is; `frontier verify` reports, `frontier salvage` copies what can be read into a new store"
    )]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// Where the damaged record starts.
        offset: u64,
        /// The LSN the damaged record should have.
        expected_lsn: u64,
        /// A valid record found after it.
        later_lsn: u64,
        /// Where that record starts.
        later_offset: u64,
    },
    /// A record passed its CRC but cannot be decoded: written by a build
    /// that encodes differently, never a torn write.
    #[error("write-ahead log {path}: record {lsn} cannot be decoded: {reason}")]
    Undecodable {
        /// The log file.
        path: PathBuf,
        /// The record's LSN.
        lsn: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The records to replay do not follow the store's durable LSN:
    /// acknowledged writes are missing.
    #[error(
        "write-ahead log {path} does not hold record {first} onwards, but the store needs it (its files hold records up to {durable}): acknowledged writes are missing"
    )]
    Gap {
        /// The log file.
        path: PathBuf,
        /// The store's durable LSN.
        durable: u64,
        /// The first record missing.
        first: u64,
    },
    /// An earlier sync failed; no write is accepted until restart.
    #[error("writes are halted after a write-ahead log failure: {0}")]
    Halted(String),
}

impl WalError {
    /// Whether the disk being full is what failed.
    #[must_use]
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Self::DiskFull { .. })
    }
}

/// One record read back: its LSN and operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Log sequence number.
    pub lsn: u64,
    /// The group's writes.
    pub ops: Vec<WriteOp>,
}

/// What [`Wal::open`] found in an existing log.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The run of records from the first slot, in LSN order; the store
    /// replays those above its durable LSN.
    pub records: Vec<LogRecord>,
    /// Whether a torn record (the unacknowledged write of a crash) follows
    /// them.
    pub torn_tail: bool,
}

/// What a log file holds, read without judging it (`frontier verify` and
/// `frontier salvage`).
#[derive(Debug)]
pub struct Inspection {
    /// Format version (1 or 2).
    pub version: u8,
    /// The store ID in the header (format 2).
    pub store_id: Option<u64>,
    /// The length it was allocated to (format 2).
    pub capacity: Option<u64>,
    /// Its length.
    pub length: u64,
    /// The scan of its records.
    pub scan: Scan,
}

/// A log's records as read from the first slot.
#[derive(Debug, Default)]
pub struct Scan {
    /// The run of valid records whose LSNs follow each other.
    pub records: Vec<LogRecord>,
    /// Where the run ends.
    pub end: u64,
    /// The LSN the record after the run would have.
    pub next_lsn: u64,
    /// Whether the bytes after the run start a record with the next LSN
    /// that is not valid (a torn write, or damage when `later` is not
    /// empty).
    pub torn_tail: bool,
    /// Valid records after the run with LSNs above both the run's and the
    /// store's durable LSN, with their offsets: evidence of damage, and
    /// what salvage can still read.
    pub later: Vec<(u64, LogRecord)>,
    /// Valid records that could not be decoded: (offset, LSN, reason).
    pub undecodable: Vec<(u64, u64, String)>,
}

/// The open log. Not synchronised: the store holds it under its write lock.
#[derive(Debug)]
pub struct Wal {
    file: File,
    path: PathBuf,
    /// Where the next record is written: the end of the last one.
    len: u64,
    /// The length the file is allocated to.
    capacity: u64,
    store_id: u64,
    last_checkpoint: Instant,
    last_lsn: u64,
    halted: Option<String>,
    /// The size the log last failed to grow to for lack of room: writes
    /// fail until it can, so the store reports itself unwritable.
    out_of_room: Option<u64>,
    /// (LSN, offset) of each record of this pass, oldest first.
    offsets: VecDeque<(u64, u64)>,
    /// The spare file, once made: its capacity, and the highest LSN its
    /// last pass held (its records must all be durable before it is
    /// written from its first slot again).
    spare: Option<(File, u64, u64)>,
    /// Counts the passes: a restart prepared in one is not finished in
    /// another (module `restart`).
    pass: u64,
    /// Bytes its allocations leave free on the disk ([`Self::keep_free`]).
    floor: u64,
    /// The record being written, kept between appends: a group is encoded
    /// into memory already faulted in, not into a fresh allocation of its
    /// size.
    record_buffer: Vec<u8>,
}

/// The path of the log in `data_dir`.
#[must_use]
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

fn io_error(path: &Path, source: std::io::Error) -> WalError {
    // ENOSPC, or a growth the floor refused (`beyond_floor`).
    if source.kind() == std::io::ErrorKind::StorageFull {
        WalError::DiskFull {
            path: path.to_owned(),
            source,
        }
    } else {
        WalError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

fn header(store_id: u64, capacity: u64) -> [u8; HEADER_LEN as usize] {
    let mut out = [0_u8; HEADER_LEN as usize];
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&store_id.to_le_bytes());
    out[16..24].copy_from_slice(&capacity.to_le_bytes());
    let crc = crc32fast::hash(&out[..24]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Bytes free for unprivileged use on the file system holding `dir`, if
/// it can say.
#[must_use]
pub fn available_bytes(dir: &Path) -> Option<u64> {
    let stats = rustix::fs::statvfs(dir).ok()?;
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Bytes that may still be allocated beside `path` while `floor` bytes
/// stay free; all of them when there is no floor or the file system cannot
/// say.
fn room_above_floor(path: &Path, floor: u64) -> u64 {
    if floor == 0 {
        return u64::MAX;
    }
    available_bytes(path.parent().unwrap_or(path))
        .map_or(u64::MAX, |free| free.saturating_sub(floor))
}

/// The error of an allocation of `bytes` the floor does not leave room
/// for: a full disk, as ENOSPC would be, so that writes stop and resume
/// alike, but met before the disk is.
fn beyond_floor(bytes: u64, floor: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        format!(
            "growing the log by {} MiB would leave less than the {} MiB kept free \
             (--min-free-mb)",
            bytes.div_ceil(1 << 20),
            floor.div_ceil(1 << 20)
        ),
    )
}

/// Syncs a directory, so that a file created or renamed in it stays.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Wal {
    /// Makes a new, empty log for the store `store_id` in `data_dir`,
    /// replacing any file of that name only once the new one is complete
    /// and durable (it is written beside it and renamed over it).
    pub fn create(data_dir: &Path, store_id: u64) -> Result<(), WalError> {
        let path = path_in(data_dir);
        let staging = data_dir.join(format!("{FILE_NAME}.new"));
        let made = (|| {
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&staging)?;
            allocate(&file, &staging, 0, INITIAL_CAPACITY)?;
            file.write_all_at(&header(store_id, INITIAL_CAPACITY), 0)?;
            file.sync_all()?;
            std::fs::rename(&staging, &path)?;
            sync_dir(data_dir)
        })();
        made.map_err(|source| io_error(&path, source))
    }

    /// Opens the log of the store `store_id` and reads its records;
    /// `durable_lsn` is the last record the store's files hold, so records
    /// of earlier passes are told apart from damage. A missing, empty,
    /// foreign, shortened or damaged log is refused.
    pub fn open(
        data_dir: &Path,
        store_id: u64,
        durable_lsn: u64,
    ) -> Result<(Self, Recovered), WalError> {
        let path = path_in(data_dir);
        let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(WalError::Missing { path });
            }
            Err(source) => return Err(io_error(&path, source)),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|source| io_error(&path, source))?;
        let inspection = inspect_bytes(&path, &bytes, durable_lsn)?;
        let (Some(found), Some(capacity)) = (inspection.store_id, inspection.capacity) else {
            // Version 1 is read by `read_legacy`, never opened for writing.
            return Err(WalError::NotALog { path });
        };
        if found != store_id {
            return Err(WalError::OtherStore {
                path,
                found,
                expected: store_id,
            });
        }
        if inspection.length < capacity {
            return Err(WalError::Shortened {
                path,
                length: inspection.length,
                capacity,
            });
        }
        let recovered = judge(&path, inspection.scan)?;
        let wal = Self {
            file,
            len: recovered.1,
            path,
            capacity,
            store_id,
            last_checkpoint: Instant::now(),
            last_lsn: 0,
            halted: None,
            out_of_room: None,
            offsets: VecDeque::new(),
            spare: None,
            pass: 0,
            floor: 0,
            record_buffer: Vec::new(),
        };
        // A spare left by an earlier run holds nothing needed (this start
        // replays the log alone) but records whose LSNs nothing vouches
        // for: it is made afresh when first needed.
        let spare = data_dir.join(SPARE_NAME);
        if let Err(source) = std::fs::remove_file(&spare)
            && source.kind() != std::io::ErrorKind::NotFound
        {
            return Err(io_error(&spare, source));
        }
        Ok((wal, recovered.0))
    }

    /// The log file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fails once a sync has failed: after a failed `fdatasync` the kernel
    /// may have dropped the pages, so nothing later can be trusted to be
    /// durable until the server restarts and replays.
    pub fn check_writable(&self) -> Result<(), WalError> {
        match &self.halted {
            Some(reason) => Err(WalError::Halted(reason.clone())),
            None => Ok(()),
        }
    }

    /// Keeps `bytes` free on the log's disk: a growth that would leave
    /// less fails as a full disk would, before the disk is full, so that
    /// the store's other files keep the room they need.
    pub fn keep_free(&mut self, bytes: u64) {
        self.floor = bytes;
    }

    /// Fails while the log could not grow for lack of room the last time
    /// it needed to (see [`Self::grow_again`]).
    pub fn check_room(&self) -> Result<(), WalError> {
        match self.out_of_room {
            Some(_) => Err(io_error(
                &self.path,
                std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()),
            )),
            None => Ok(()),
        }
    }

    /// Tries again the growth that last failed for lack of room; answers
    /// whether it grew now (`false` when it was not lacking room).
    pub fn grow_again(&mut self) -> Result<bool, WalError> {
        let Some(needed) = self.out_of_room else {
            return Ok(false);
        };
        self.grow(needed)?;
        tracing::info!(path = %self.path.display(), "the write-ahead log has room again; writes resume");
        Ok(true)
    }

    /// Whether no record was appended since the last checkpoint: all the
    /// log ever held is durable in the store's files.
    #[must_use]
    pub fn holds_no_records(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Whether the next group should be committed durably to redb instead.
    #[must_use]
    pub fn checkpoint_due(&self) -> bool {
        self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL || self.len >= CHECKPOINT_BYTES
    }

    /// Writes a record after the last one, without syncing it. A failed
    /// write leaves the write position where it was, so the next record
    /// takes the same slot.
    pub fn append(&mut self, lsn: u64, ops: &[WriteOp]) -> Result<(), WalError> {
        self.check_writable()?;
        let mut record = std::mem::take(&mut self.record_buffer);
        record.clear();
        record.resize(RECORD_HEADER_LEN, 0);
        encode_ops_into(ops, &mut record);
        let appended = self.append_record(lsn, &mut record);
        if record.capacity() > RECORD_BUFFER_KEPT {
            record = Vec::new();
        }
        self.record_buffer = record;
        appended
    }

    /// Writes `record`, a header's room and then the payload, once its
    /// header is filled in.
    fn append_record(&mut self, lsn: u64, record: &mut [u8]) -> Result<(), WalError> {
        let payload = &record[RECORD_HEADER_LEN..];
        let length = u32::try_from(payload.len()).map_err(|_| WalError::Io {
            path: self.path.clone(),
            source: std::io::Error::other("a group of writes over 4 GiB"),
        })?;
        let crc = checksum(lsn, payload);
        record[0..4].copy_from_slice(&length.to_le_bytes());
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        record[8..16].copy_from_slice(&lsn.to_le_bytes());
        let end = self.len + record.len() as u64;
        if end > self.capacity {
            self.grow(end)?;
        }
        self.file
            .write_all_at(record, self.len)
            .map_err(|source| io_error(&self.path, source))?;
        self.offsets.push_back((lsn, self.len));
        self.len = end;
        Ok(())
    }

    /// Grows the file to hold at least `needed` bytes: allocated and synced
    /// before the header says so, so the header never claims more than the
    /// file has.
    fn grow(&mut self, needed: u64) -> Result<(), WalError> {
        let started = Instant::now();
        // Doubling, as far as the floor allows: a full doubling that does
        // not fit must not stop writes that fit.
        let room = room_above_floor(&self.path, self.floor);
        let doubled = needed.max(self.capacity.saturating_mul(2));
        let capacity = if doubled - self.capacity <= room {
            doubled
        } else if needed.saturating_sub(self.capacity) <= room {
            needed.max(self.capacity + room / 2)
        } else {
            self.out_of_room = Some(needed);
            return Err(io_error(
                &self.path,
                beyond_floor(needed - self.capacity, self.floor),
            ));
        };
        let allocated = allocate(&self.file, &self.path, self.capacity, capacity)
            .and_then(|()| self.file.sync_all())
            .map_err(|source| io_error(&self.path, source));
        if let Err(error) = allocated {
            if error.is_disk_full() {
                self.out_of_room = Some(needed);
            }
            return Err(error);
        }
        self.out_of_room = None;
        self.file
            .write_all_at(&header(self.store_id, capacity), 0)
            .and_then(|()| self.file.sync_data())
            .map_err(|source| {
                self.halt(format!(
                    "rewriting the header of {}: {source}",
                    self.path.display()
                ));
                io_error(&self.path, source)
            })?;
        tracing::debug!(
            from = self.capacity,
            to = capacity,
            seconds = started.elapsed().as_secs_f64(),
            "the log grew under the writer's lock"
        );
        self.capacity = capacity;
        Ok(())
    }

    /// Takes back the last appended record (its group was not applied):
    /// its header is zeroed, so a replay ends before it. The caller syncs.
    pub fn unappend(&mut self, record_start: u64) {
        self.len = record_start;
        if self
            .offsets
            .back()
            .is_some_and(|&(_, offset)| offset == record_start)
        {
            self.offsets.pop_back();
        }
        if let Err(source) = self
            .file
            .write_all_at(&[0; RECORD_HEADER_LEN], record_start)
        {
            self.halt(format!(
                "erasing a record of {}: {source}",
                self.path.display()
            ));
        }
    }

    /// End of the log: where the next record starts.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.len
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<(), WalError> {
        if let Err(source) = self.file.sync_data() {
            self.halt(format!("fdatasync of {}: {source}", self.path.display()));
            return Err(io_error(&self.path, source));
        }
        Ok(())
    }

    /// Starts the log again from its first slot, after a durable redb
    /// commit that holds all of it. Nothing is written: the records left
    /// behind are at or below the durable LSN, which is how a replay tells
    /// them from new ones.
    pub fn checkpointed(&mut self) {
        self.pass += 1;
        self.last_checkpoint = Instant::now();
        self.len = HEADER_LEN;
        self.offsets.clear();
    }

    /// Gives back the room a busy run grew the log to, at a clean close:
    /// the log, empty after the final checkpoint, goes back to its first
    /// capacity, its first slot is cleared and the spare file is removed.
    /// Does nothing while the log holds records. The header is made to say the smaller capacity before
    /// the file is cut, so a crash in between leaves a file longer than its
    /// header says, which opens as any checkpointed log does (what lies
    /// past the first slot is at or below the durable LSN).
    pub fn shrink_when_empty(&mut self, data_dir: &Path) -> Result<(), WalError> {
        self.check_writable()?;
        if self.len != HEADER_LEN || !self.offsets.is_empty() {
            return Ok(());
        }
        self.spare = None;
        let spare_path = data_dir.join(SPARE_NAME);
        if let Err(source) = std::fs::remove_file(&spare_path)
            && source.kind() != std::io::ErrorKind::NotFound
        {
            return Err(io_error(&spare_path, source));
        }
        // The first slot is cleared, so the log reads as empty: neither a
        // record of the last pass cut by the shrink nor the torn record of
        // an earlier crash after that pass's run is read back as torn.
        let shrink = self.capacity > INITIAL_CAPACITY;
        let mut done = self.file.write_all_at(&[0; RECORD_HEADER_LEN], HEADER_LEN);
        if shrink {
            done = done
                .and_then(|()| {
                    self.file
                        .write_all_at(&header(self.store_id, INITIAL_CAPACITY), 0)
                })
                .and_then(|()| self.file.sync_data())
                .and_then(|()| self.file.set_len(INITIAL_CAPACITY));
        }
        done.and_then(|()| self.file.sync_all()).map_err(|source| {
            self.halt(format!("shrinking {}: {source}", self.path.display()));
            io_error(&self.path, source)
        })?;
        if shrink {
            self.capacity = INITIAL_CAPACITY;
        }
        Ok(())
    }

    /// The LSN of the last record applied to the store.
    #[must_use]
    pub fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    /// Records that the group with this LSN is applied to the store.
    pub fn set_last_lsn(&mut self, lsn: u64) {
        self.last_lsn = lsn;
    }

    /// Stops accepting writes.
    pub fn halt(&mut self, reason: String) {
        tracing::error!(%reason, "write-ahead log failed; writes halted until restart");
        self.halted.get_or_insert(reason);
    }
}

/// Reads the log in `data_dir` without judging it: its header and every
/// record that can be read (see [`Scan`]).
pub fn inspect(data_dir: &Path, durable_lsn: u64) -> Result<Inspection, WalError> {
    let path = path_in(data_dir);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(WalError::Missing { path });
        }
        Err(source) => return Err(io_error(&path, source)),
    };
    inspect_bytes(&path, &bytes, durable_lsn)
}

/// The records of the log in `data_dir`, of either format, judged as
/// [`Wal::open`] judges, without opening it for writing: for a store being
/// upgraded from schema 3 (a log of format 1, or of format 2 when an
/// earlier upgrade stopped after replacing it), and for files reopened in
/// place.
pub fn read_records(data_dir: &Path, durable_lsn: u64) -> Result<Recovered, WalError> {
    let path = path_in(data_dir);
    let inspection = inspect(data_dir, durable_lsn)?;
    Ok(judge(&path, inspection.scan)?.0)
}

/// The records of an opened log, or the error its damage is.
fn judge(path: &Path, scan: Scan) -> Result<(Recovered, u64), WalError> {
    if let Some((_, lsn, reason)) = scan.undecodable.into_iter().next() {
        return Err(WalError::Undecodable {
            path: path.to_owned(),
            lsn,
            reason,
        });
    }
    if let Some((later_offset, later)) = scan.later.first() {
        return Err(WalError::Corrupt {
            path: path.to_owned(),
            offset: scan.end,
            expected_lsn: scan.next_lsn,
            later_lsn: later.lsn,
            later_offset: *later_offset,
        });
    }
    Ok((
        Recovered {
            records: scan.records,
            torn_tail: scan.torn_tail,
        },
        scan.end,
    ))
}

/// Reads a log's bytes (as [`inspect`] reads its file); `path` only names
/// it in errors.
pub fn inspect_bytes(path: &Path, bytes: &[u8], durable_lsn: u64) -> Result<Inspection, WalError> {
    let not_a_log = || WalError::NotALog {
        path: path.to_owned(),
    };
    let magic = bytes.get(..8).ok_or_else(not_a_log)?;
    let (version, store_id, capacity, header_len) = if magic == MAGIC {
        let header = bytes.get(..HEADER_LEN as usize).ok_or_else(not_a_log)?;
        let crc = u32::from_le_bytes(header[24..28].try_into().unwrap_or_default());
        if crc32fast::hash(&header[..24]) != crc {
            return Err(not_a_log());
        }
        let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().unwrap_or_default());
        (2, Some(u64_at(8)), Some(u64_at(16)), HEADER_LEN)
    } else if magic == MAGIC_V1 {
        (1, None, None, MAGIC_V1.len() as u64)
    } else {
        return Err(not_a_log());
    };
    Ok(Inspection {
        version,
        store_id,
        capacity,
        length: bytes.len() as u64,
        scan: scan(bytes, header_len, durable_lsn),
    })
}

fn checksum(lsn: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&lsn.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// A valid record at `offset` (its CRC matches): its LSN, payload and
/// length.
fn record_at(bytes: &[u8], offset: usize) -> Option<(u64, &[u8], usize)> {
    let header = bytes.get(offset..offset + RECORD_HEADER_LEN)?;
    let length = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().unwrap_or_default());
    let lsn = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    let start = offset + RECORD_HEADER_LEN;
    let payload = bytes.get(start..start.checked_add(length)?)?;
    (checksum(lsn, payload) == crc).then_some((lsn, payload, RECORD_HEADER_LEN + length))
}

/// Whether the bytes `from_first` bytes after the first slot could start a
/// record of this pass with an LSN above `above` (the run's and the
/// store's): checked before a CRC is computed over the length they claim.
///
/// Records of a pass are written one after the other from the first slot
/// with consecutive LSNs from `pass_start` (the run's first, or the one
/// after `above` when the run is empty: the checkpoint that began the pass
/// is durable), and each takes at least a header. So the record at an
/// offset has an LSN of at most `pass_start` plus the headers that fit
/// before it. Without that bound, stale records of earlier passes were a
/// trap: their payloads hold integers such as dates that read as LSNs
/// above a young store's, and each such offset claimed a length to check
/// a CRC over, which made reading a log of stale passes take hours.
fn could_be_later(lsn: u64, above: u64, pass_start: u64, from_first: usize) -> bool {
    let headers_before = (from_first / RECORD_HEADER_LEN) as u64;
    lsn > above && lsn <= pass_start.saturating_add(headers_before)
}

/// Reads the run of records from `first` (see the module docs), then looks
/// at every offset after it for valid records above both the run and
/// `durable_lsn` that this pass could have written.
fn scan(bytes: &[u8], first: u64, durable_lsn: u64) -> Scan {
    let mut result = Scan::default();
    let mut offset = first as usize;
    let decode =
        |offset: usize, lsn: u64, payload: &[u8], result: &mut Scan| match decode_ops(payload) {
            Ok(ops) => Some(LogRecord { lsn, ops }),
            Err(reason) => {
                result
                    .undecodable
                    .push((offset as u64, lsn, reason.to_string()));
                None
            }
        };
    while let Some((lsn, payload, length)) = record_at(bytes, offset) {
        if result
            .records
            .last()
            .is_some_and(|previous| previous.lsn.checked_add(1) != Some(lsn))
        {
            break;
        }
        let Some(record) = decode(offset, lsn, payload, &mut result) else {
            break;
        };
        result.records.push(record);
        offset += length;
    }
    result.end = offset as u64;
    let run_last = result.records.last().map_or(0, |r| r.lsn);
    let above = run_last.max(durable_lsn);
    // LSNs come from damaged bytes too: none may overflow.
    let next = result
        .records
        .last()
        .map_or(durable_lsn, |r| r.lsn)
        .saturating_add(1);
    result.next_lsn = next;
    result.torn_tail = bytes
        .get(offset + 8..offset + 16)
        .is_some_and(|lsn| u64::from_le_bytes(lsn.try_into().unwrap_or_default()) == next);
    // Every offset is looked at, and the LSN bound rejects nearly all of
    // them before a CRC is computed (see `could_be_later`).
    let pass_start = result
        .records
        .first()
        .map_or(above.saturating_add(1), |r| r.lsn);
    let mut at = offset + 1;
    while at + RECORD_HEADER_LEN <= bytes.len() {
        let lsn = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap_or_default());
        if could_be_later(lsn, above, pass_start, at - first as usize)
            && let Some((lsn, payload, length)) = record_at(bytes, at)
        {
            if let Some(record) = decode(at, lsn, payload, &mut result) {
                result.later.push((at as u64, record));
            }
            at += length;
            continue;
        }
        at += 1;
    }
    result
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::record::UrlRecord;
    use crate::write_ops::{Deletion, KnownUrl, NewUrl};

    const STORE: u64 = 0x5eed;

    fn metadata() -> impl Strategy<Value = BTreeMap<String, Vec<String>>> {
        prop::collection::btree_map(".{0,6}", prop::collection::vec(".{0,6}", 0..3), 0..3)
    }

    pub(super) fn op() -> impl Strategy<Value = WriteOp> {
        prop_oneof![
            (
                ".{0,8}",
                ".{0,30}",
                any::<u32>(),
                any::<bool>(),
                any::<(u64, u64, u32)>(),
                ".{0,10}",
                metadata()
            )
                .prop_map(
                    |(
                        crawl,
                        url,
                        partition,
                        maybe_known,
                        (created_at, due_at, depth),
                        queue_key,
                        metadata,
                    )| {
                        WriteOp::Discover(NewUrl {
                            crawl,
                            url,
                            partition,
                            maybe_known,
                            record: UrlRecord {
                                created_at,
                                due_at,
                                depth,
                                queue_key,
                                metadata,
                            },
                        })
                    }
                ),
            (
                ".{0,8}",
                ".{0,30}",
                any::<u32>(),
                prop::option::of(".{0,10}"),
                ".{0,10}",
                any::<(u64, u64)>(),
                (
                    metadata(),
                    prop::option::of((0u8..3, 1u32..1_000, 0u32..1_000))
                )
            )
                .prop_map(
                    |(
                        crawl,
                        url,
                        partition,
                        queue_key,
                        default_queue,
                        (due_at, now),
                        (metadata, report),
                    )| {
                        WriteOp::Known(KnownUrl {
                            crawl,
                            url,
                            partition,
                            queue_key,
                            default_queue,
                            due_at,
                            metadata,
                            now,
                            report: report.map(|(kind, min, extra)| {
                                let name = ["never", "fixed", "adaptive"][usize::from(kind)];
                                crate::revisit::Policy::parse(
                                    name,
                                    u64::from(min),
                                    u64::from(min + extra),
                                )
                                .unwrap()
                            }),
                        })
                    }
                ),
            (
                ".{0,8}",
                prop::option::of(".{0,10}"),
                prop::option::of(any::<u64>()),
                any::<u32>(),
                prop::option::of(any::<u32>()),
                prop::option::of(".{0,10}")
            )
                .prop_map(
                    |(crawl, queue, created_before, partitions, partition, below)| {
                        WriteOp::Delete(Deletion {
                            crawl,
                            queue,
                            created_before,
                            partitions,
                            partition,
                            // A bound is kept only within a partition.
                            urls_below: partition.and(below),
                        })
                    }
                ),
        ]
    }

    fn groups() -> impl Strategy<Value = Vec<Vec<WriteOp>>> {
        prop::collection::vec(prop::collection::vec(op(), 1..5), 1..6)
    }

    pub(super) fn deletion(crawl: &str) -> Vec<WriteOp> {
        vec![WriteOp::Delete(Deletion {
            crawl: crawl.to_owned(),
            queue: None,
            created_before: None,
            partitions: 4,
            partition: None,
            urls_below: None,
        })]
    }

    /// Writes `groups` as records 1, 2, ... into a new log and answers the
    /// file's bytes and the offset where each record ends.
    fn written(groups: &[Vec<WriteOp>]) -> (tempfile::TempDir, Vec<u8>, Vec<u64>) {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, recovered) = Wal::open(dir.path(), STORE, 0).unwrap();
        assert!(recovered.records.is_empty());
        let mut ends = Vec::new();
        for (lsn, ops) in (1..).zip(groups) {
            wal.append(lsn, ops).unwrap();
            ends.push(wal.end());
        }
        wal.sync().unwrap();
        let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        (dir, bytes, ends)
    }

    fn rewrite(dir: &Path, bytes: &[u8]) {
        std::fs::write(dir.join(FILE_NAME), bytes).unwrap();
    }

    proptest! {
        // Each case writes and reads a whole log file.
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn ops_round_trip(ops in prop::collection::vec(op(), 0..8)) {
            prop_assert_eq!(decode_ops(&encode_ops(&ops)), Ok(ops));
        }

        /// A log whose writing stopped anywhere (a crash mid-write: what
        /// follows is still the zeros it was allocated with) reads back as
        /// exactly the records that were complete.
        #[test]
        fn a_torn_log_keeps_every_complete_record(groups in groups(), cut in any::<prop::sample::Index>()) {
            let (dir, mut bytes, ends) = written(&groups);
            let last_end = *ends.last().unwrap() as usize;
            let cut = HEADER_LEN as usize + cut.index(last_end - HEADER_LEN as usize + 1);
            // A record whose missing bytes would have been zeros anyway is
            // complete.
            let intact = |end: u64| bytes[cut.min(end as usize)..end as usize].iter().all(|&b| b == 0);
            let complete = ends.iter().take_while(|&&end| intact(end)).count();
            bytes[cut..].fill(0);
            rewrite(dir.path(), &bytes);
            let (_, recovered) = Wal::open(dir.path(), STORE, 0).unwrap();
            prop_assert_eq!(recovered.records.len(), complete);
            for (record, (lsn, ops)) in recovered.records.iter().zip((1..).zip(&groups)) {
                prop_assert_eq!(record.lsn, lsn);
                prop_assert_eq!(&record.ops, ops);
            }
        }

        /// A flipped byte in any record but the last is corruption, refused
        /// with the damaged offset; in the last it is a torn write, dropped.
        #[test]
        fn a_damaged_record_is_refused_unless_it_is_the_last(groups in groups(), which in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), flip in 1_u8..) {
            let (dir, mut bytes, ends) = written(&groups);
            let damaged = which.index(groups.len());
            let start = if damaged == 0 { HEADER_LEN } else { ends[damaged - 1] } as usize;
            let end = ends[damaged] as usize;
            bytes[start + at.index(end - start)] ^= flip;
            rewrite(dir.path(), &bytes);
            match Wal::open(dir.path(), STORE, 0) {
                Ok((_, recovered)) => {
                    prop_assert_eq!(damaged, groups.len() - 1, "damage before intact records was taken as a torn tail");
                    prop_assert_eq!(recovered.records.len(), damaged);
                }
                Err(WalError::Corrupt { offset, expected_lsn, later_lsn, .. }) => {
                    prop_assert!(damaged < groups.len() - 1);
                    prop_assert_eq!(offset, start as u64);
                    prop_assert_eq!(expected_lsn, damaged as u64 + 1);
                    prop_assert!(later_lsn > expected_lsn);
                }
                Err(error) => prop_assert!(false, "{error}"),
            }
        }
    }

    #[test]
    fn records_of_an_earlier_pass_are_not_damage() {
        let groups: Vec<Vec<WriteOp>> = (0..6).map(|i| deletion(&format!("crawl{i}"))).collect();
        let (dir, _, _) = written(&groups);
        let (mut wal, recovered) = Wal::open(dir.path(), STORE, 6).unwrap();
        assert_eq!(recovered.records.len(), 6);
        // A checkpoint at 6, then a shorter record 7 over the start of 1.
        wal.checkpointed();
        wal.append(7, &deletion("c")).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 6).unwrap();
        let lsns: Vec<u64> = recovered.records.iter().map(|r| r.lsn).collect();
        assert_eq!(lsns, [7]);
        // With nothing written since the checkpoint, the old run is read
        // (and skipped by the store's replay, being at or below 6).
        let (mut wal, _) = Wal::open(dir.path(), STORE, 7).unwrap();
        wal.checkpointed();
        drop(wal);
        assert!(Wal::open(dir.path(), STORE, 7).is_ok());
    }

    /// A stale record can hold, inside its payload, bytes that form a valid
    /// record whose LSN is a date (here inside a crawl name). Read as a
    /// record written after the run, it made a healthy store be refused as
    /// damaged; a pass cannot have written a record with that LSN there.
    #[test]
    fn a_record_inside_a_stale_payload_is_not_taken_for_a_later_one() {
        // A date of November 2025 whose bytes are all ASCII, as a name's
        // must be.
        let date = 0x6924_7f00_u64;
        let fake = (0..100_000)
            .map(|k| {
                let payload = encode_ops(&deletion(&format!("c{k}")));
                let mut record = Vec::new();
                record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
                record.extend_from_slice(&checksum(date, &payload).to_le_bytes());
                record.extend_from_slice(&date.to_le_bytes());
                record.extend_from_slice(&payload);
                record
            })
            .find_map(|record| String::from_utf8(record).ok())
            .expect("a name whose record's checksum is ASCII");
        // Far enough in that the next pass's first record, and the zeroed
        // header after it, leave it whole.
        let padding = "stale ".repeat(40);
        let (dir, bytes, _) = written(&[deletion(&format!("{padding}{fake}"))]);
        let hidden = bytes.windows(fake.len()).position(|w| w == fake.as_bytes());
        assert!(hidden.is_some(), "the fake record is in the stale one");
        let (mut wal, _) = Wal::open(dir.path(), STORE, 1).unwrap();
        wal.checkpointed();
        wal.append(2, &deletion("c")).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let after = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(
            after.windows(fake.len()).position(|w| w == fake.as_bytes()),
            hidden,
            "the fake record is still in the stale bytes"
        );
        let (_, recovered) = Wal::open(dir.path(), STORE, 1).unwrap();
        let lsns: Vec<u64> = recovered.records.iter().map(|r| r.lsn).collect();
        assert_eq!(lsns, [2]);
    }

    #[test]
    fn a_later_record_is_bounded_by_the_headers_that_fit_before_it() {
        // A record 160 bytes after the first slot has at most 10 records
        // before it in its pass.
        assert!(could_be_later(15, 6, 5, 160));
        assert!(!could_be_later(16, 6, 5, 160));
        assert!(!could_be_later(6, 6, 5, 160));
        assert!(!could_be_later(u64::MAX, 6, u64::MAX - 20, 160));
        assert!(could_be_later(u64::MAX, 6, u64::MAX - 10, 160));
    }

    #[test]
    fn missing_empty_foreign_and_shortened_logs_are_refused() {
        let groups = vec![deletion("a"), deletion("b")];
        let (dir, bytes, ends) = written(&groups);
        let path = dir.path().join(FILE_NAME);
        assert!(matches!(
            Wal::open(dir.path(), STORE + 1, 0),
            Err(WalError::OtherStore { found: STORE, .. })
        ));
        std::fs::write(&path, &bytes[..ends[1] as usize]).unwrap();
        assert!(matches!(
            Wal::open(dir.path(), STORE, 0),
            Err(WalError::Shortened { .. })
        ));
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            Wal::open(dir.path(), STORE, 0),
            Err(WalError::NotALog { .. })
        ));
        let mut damaged_header = bytes.clone();
        damaged_header[17] ^= 1;
        std::fs::write(&path, &damaged_header).unwrap();
        assert!(matches!(
            Wal::open(dir.path(), STORE, 0),
            Err(WalError::NotALog { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            Wal::open(dir.path(), STORE, 0),
            Err(WalError::Missing { .. })
        ));
    }

    #[test]
    fn an_unappended_record_ends_the_log_and_its_slot_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        wal.append(1, &deletion("a")).unwrap();
        let start = wal.end();
        wal.append(2, &deletion("b")).unwrap();
        wal.unappend(start);
        wal.sync().unwrap();
        let (_, recovered) = Wal::open(dir.path(), STORE, 0).unwrap();
        assert_eq!(recovered.records.len(), 1);
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        wal.append(2, &deletion("c")).unwrap();
        wal.sync().unwrap();
        let (_, recovered) = Wal::open(dir.path(), STORE, 0).unwrap();
        assert_eq!(recovered.records[1].ops, deletion("c"));
    }

    /// A restart after a durable commit that did not reach the last
    /// records keeps them: they start the new pass, in the spare file
    /// swapped in; the spare is written again only once its own records
    /// are durable.
    #[test]
    fn a_restart_keeps_the_records_after_the_durable_one() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        // Read as a start would, without opening the log for writing.
        let lsns = |dir: &Path, durable| {
            let recovered = read_records(dir, durable).unwrap();
            recovered.records.iter().map(|r| r.lsn).collect::<Vec<_>>()
        };
        for lsn in 1..=5 {
            wal.append(lsn, &deletion(&format!("u{lsn}"))).unwrap();
        }
        wal.sync().unwrap();
        assert!(wal.restart_keeping(dir.path(), 3).unwrap());
        assert_eq!(lsns(dir.path(), 3), [4, 5]);
        wal.append(6, &deletion("u6")).unwrap();
        wal.sync().unwrap();
        assert_eq!(lsns(dir.path(), 3), [4, 5, 6]);
        // The spare holds records up to 5: not yet durable at 4.
        assert!(!wal.restart_keeping(dir.path(), 4).unwrap());
        assert_eq!(lsns(dir.path(), 3), [4, 5, 6]);
        assert!(wal.restart_keeping(dir.path(), 5).unwrap());
        wal.append(7, &deletion("u7")).unwrap();
        wal.sync().unwrap();
        let (_, recovered) = Wal::open(dir.path(), STORE, 5).unwrap();
        assert_eq!(
            recovered.records.iter().map(|r| r.lsn).collect::<Vec<_>>(),
            [6, 7]
        );
        assert_eq!(recovered.records[0].ops, deletion("u6"));
        // With nothing after the durable record, the log starts over.
        assert!(wal.restart_keeping(dir.path(), 7).unwrap());
        wal.append(8, &deletion("u8")).unwrap();
        wal.sync().unwrap();
        assert_eq!(lsns(dir.path(), 7), [8]);
    }

    #[test]
    fn a_record_larger_than_the_file_grows_it() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        let big: Vec<WriteOp> = (0..3)
            .map(|i| {
                let mut ops = deletion(&"x".repeat(2 << 20));
                if let WriteOp::Delete(deletion) = &mut ops[0] {
                    deletion.partitions = i;
                }
                ops.remove(0)
            })
            .collect();
        wal.append(1, &big).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let length = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
        assert!(length > INITIAL_CAPACITY);
        let (_, recovered) = Wal::open(dir.path(), STORE, 0).unwrap();
        assert_eq!(recovered.records[0].ops, big);
    }

    #[test]
    fn an_emptied_log_shrinks_back_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        Wal::create(dir.path(), STORE).unwrap();
        let (mut wal, _) = Wal::open(dir.path(), STORE, 0).unwrap();
        let big = deletion(&"x".repeat(5 << 20));
        wal.append(1, &big).unwrap();
        wal.append(2, &deletion("kept")).unwrap();
        wal.sync().unwrap();
        // Record 2 goes to the spare, which then holds the log's capacity.
        assert!(wal.restart_keeping(dir.path(), 1).unwrap());
        assert!(dir.path().join(SPARE_NAME).exists());
        let length = |dir: &Path| std::fs::metadata(dir.join(FILE_NAME)).unwrap().len();
        assert!(length(dir.path()) > INITIAL_CAPACITY);
        // Not while the log holds records.
        wal.shrink_when_empty(dir.path()).unwrap();
        assert!(length(dir.path()) > INITIAL_CAPACITY);
        wal.checkpointed();
        wal.shrink_when_empty(dir.path()).unwrap();
        assert_eq!(length(dir.path()), INITIAL_CAPACITY);
        assert!(!dir.path().join(SPARE_NAME).exists());
        drop(wal);
        let (mut wal, recovered) = Wal::open(dir.path(), STORE, 2).unwrap();
        assert!(recovered.records.is_empty());
        // It grows again as it did the first time.
        wal.append(3, &big).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 2).unwrap();
        assert_eq!(recovered.records[0].ops, big);
    }

    #[test]
    fn an_emptied_log_reads_as_empty_after_a_clean_close() {
        let (dir, _, _) = written(&[deletion("a"), deletion("b")]);
        let (mut wal, recovered) = Wal::open(dir.path(), STORE, 2).unwrap();
        assert_eq!(recovered.records.len(), 2);
        wal.checkpointed();
        wal.shrink_when_empty(dir.path()).unwrap();
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 2).unwrap();
        assert!(recovered.records.is_empty() && !recovered.torn_tail);
    }

    #[test]
    fn a_crash_between_the_smaller_header_and_the_cut_opens() {
        let (dir, mut bytes, ends) = written(&[deletion(&"x".repeat(5 << 20)), deletion("b")]);
        assert!(bytes.len() as u64 > INITIAL_CAPACITY);
        assert!(ends[0] > INITIAL_CAPACITY);
        // Both records are durable; the shrink has cleared the first slot
        // and written the smaller header, not yet cut the file.
        bytes[..HEADER_LEN as usize].copy_from_slice(&header(STORE, INITIAL_CAPACITY));
        bytes[HEADER_LEN as usize..HEADER_LEN as usize + RECORD_HEADER_LEN].fill(0);
        rewrite(dir.path(), &bytes);
        let (mut wal, recovered) = Wal::open(dir.path(), STORE, 2).unwrap();
        assert!(recovered.records.is_empty() && !recovered.torn_tail);
        wal.append(3, &deletion("c")).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, recovered) = Wal::open(dir.path(), STORE, 2).unwrap();
        let lsns: Vec<u64> = recovered.records.iter().map(|r| r.lsn).collect();
        assert_eq!(lsns, [3]);
    }

    /// Found by the fuzzer: LSNs come from damaged bytes too, and the
    /// largest one must not overflow the next one's arithmetic.
    #[test]
    fn a_record_with_the_largest_lsn_is_read_without_overflow() {
        let mut bytes = header(STORE, 0).to_vec();
        let payload = encode_ops(&deletion("a"));
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&checksum(u64::MAX, &payload).to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&payload);
        for durable in [0, u64::MAX - 1, u64::MAX] {
            let inspection = inspect_bytes(Path::new("t"), &bytes, durable).unwrap();
            assert_eq!(inspection.scan.records.len(), 1);
            assert_eq!(inspection.scan.next_lsn, u64::MAX);
        }
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE_NAME),
            b"not a log at all, not even close",
        )
        .unwrap();
        assert!(matches!(
            Wal::open(dir.path(), STORE, 0),
            Err(WalError::NotALog { .. })
        ));
    }

    /// A version 1 log (8-byte header, truncated at checkpoints) is read
    /// for migration with the same judgement.
    #[test]
    fn version_1_logs_are_read_for_migration() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = MAGIC_V1.to_vec();
        for (lsn, ops) in (1..).zip([deletion("a"), deletion("b")]) {
            let payload = encode_ops(&ops);
            bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&checksum(lsn, &payload).to_le_bytes());
            bytes.extend_from_slice(&lsn.to_le_bytes());
            bytes.extend_from_slice(&payload);
        }
        rewrite(dir.path(), &bytes);
        let recovered = read_records(dir.path(), 0).unwrap();
        assert_eq!(recovered.records.len(), 2);
        bytes[MAGIC_V1.len() + 20] ^= 0x40;
        rewrite(dir.path(), &bytes);
        assert!(matches!(
            read_records(dir.path(), 0),
            Err(WalError::Corrupt { .. })
        ));
        assert!(matches!(
            Wal::open(dir.path(), STORE, 0),
            Err(WalError::NotALog { .. })
        ));
    }
}
