//! The write-ahead log that makes an acknowledgement durable without a
//! durable redb commit per group.
//!
//! A durable redb commit writes every B-tree page the transaction touched
//! and waits for the disk; URLs of thousands of hosts touch a page each, so
//! per-group durable commits spent most of ingest writing pages. Instead
//! each group's writes are appended here (one sequential write and one
//! `fdatasync`), applied to redb with a non-durable commit (visible to every
//! reader at once), and redb is made durable by a checkpoint every few
//! seconds, after which the log is emptied. The record is synced before the
//! group reaches redb, so nothing a reader sees can be lost by a crash.
//!
//! # File format (`frontier.wal`)
//!
//! ```text
//! header  8 bytes  b"FRWAL\0\0\x01" (magic, format version 1)
//! record  u32 payload length, u32 CRC-32 of (lsn, payload), u64 lsn, payload
//! payload u32 op count, then each op: u8 tag and its fields (see `encode_ops`)
//! ```
//!
//! Integers little-endian; strings as `u32` length + UTF-8. Log sequence
//! numbers (LSNs) rise by one per record; redb's `meta` table records the
//! LSN of the last group each transaction applied, so after a crash the
//! records above the durable LSN are replayed and the ones at or below it
//! skipped. Replay stops at the first record that is torn (short, or its
//! CRC does not match) or does not continue the sequence: only a write that
//! was never acknowledged can be there, since a group is answered after its
//! record is synced.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::record::{Reader, RecordError, UrlRecord, put_str};
use crate::store::{Deletion, KnownUrl, NewUrl, WriteOp};

/// The log's file name inside the data directory.
pub const FILE_NAME: &str = "frontier.wal";

const MAGIC: &[u8; 8] = b"FRWAL\0\0\x01";
const HEADER_LEN: u64 = MAGIC.len() as u64;
const RECORD_HEADER_LEN: usize = 4 + 4 + 8;

/// How long non-durable commits may accumulate before a checkpoint. Longer
/// amortises page writes over more groups; shorter bounds the log and the
/// replay after a crash. Measured at 3 M URLs (BENCHMARKS.md): 4 s against
/// 1 s ingests 8% faster (20% at 1 M) and adds about 2.7 s to a start
/// after kill -9.
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
    /// The file does not start with the log's magic and version.
    #[error("{path} is not a frontier write-ahead log of format version 1")]
    NotALog {
        /// The log file.
        path: PathBuf,
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
    /// The first record to replay does not follow the store's durable LSN:
    /// acknowledged writes are missing.
    #[error(
        "write-ahead log {path} starts at record {first} but the store holds records up to {durable}: records in between are missing"
    )]
    Gap {
        /// The log file.
        path: PathBuf,
        /// The store's durable LSN.
        durable: u64,
        /// The first record above it.
        first: u64,
    },
    /// An earlier write or sync failed; no write is accepted until restart.
    #[error("writes are halted after a write-ahead log failure: {0}")]
    Halted(String),
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
    /// Records in LSN order, to replay those above the durable LSN.
    pub records: Vec<LogRecord>,
    /// Bytes after the last valid record (a torn, unacknowledged write).
    pub dropped_bytes: u64,
}

/// The open log. Not synchronised: the store holds it under its write lock.
#[derive(Debug)]
pub struct Wal {
    file: File,
    path: PathBuf,
    /// End of the last complete record.
    len: u64,
    last_checkpoint: Instant,
    last_lsn: u64,
    halted: Option<String>,
}

impl Wal {
    /// Opens (or creates) the log in `data_dir` and reads its records.
    pub fn open(data_dir: &Path) -> Result<(Self, Recovered), WalError> {
        let path = data_dir.join(FILE_NAME);
        let io = |source| WalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let recovered = if bytes.is_empty() {
            file.write_all_at(MAGIC, 0).map_err(io)?;
            file.sync_all().map_err(io)?;
            // A new file's name is durable only once its directory is
            // synced; without it, a power cut could take the whole log.
            File::open(data_dir)
                .and_then(|dir| dir.sync_all())
                .map_err(io)?;
            Recovered::default()
        } else if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(WalError::NotALog { path });
        } else {
            parse(&path, &bytes[MAGIC.len()..])?
        };
        let wal = Self {
            file,
            len: bytes.len().max(MAGIC.len()) as u64 - recovered.dropped_bytes,
            path,
            last_checkpoint: Instant::now(),
            last_lsn: 0,
            halted: None,
        };
        Ok((wal, recovered))
    }

    /// The log file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fails once a write or sync has failed: after a failed `fdatasync`
    /// the kernel may have dropped the pages, so nothing later can be
    /// trusted to be durable until the server restarts and replays.
    pub fn check_writable(&self) -> Result<(), WalError> {
        match &self.halted {
            Some(reason) => Err(WalError::Halted(reason.clone())),
            None => Ok(()),
        }
    }

    /// Whether the next group should be committed durably to redb instead.
    #[must_use]
    pub fn checkpoint_due(&self) -> bool {
        self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL || self.len >= CHECKPOINT_BYTES
    }

    /// Writes a record after the last one, without syncing it.
    pub fn append(&mut self, lsn: u64, ops: &[WriteOp]) -> Result<(), WalError> {
        self.check_writable()?;
        let payload = encode_ops(ops);
        let mut record = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
        let length = u32::try_from(payload.len()).map_err(|_| WalError::Io {
            path: self.path.clone(),
            source: std::io::Error::other("a group of writes over 4 GiB"),
        })?;
        record.extend_from_slice(&length.to_le_bytes());
        record.extend_from_slice(&checksum(lsn, &payload).to_le_bytes());
        record.extend_from_slice(&lsn.to_le_bytes());
        record.extend_from_slice(&payload);
        if let Err(source) = self.file.write_all_at(&record, self.len) {
            // Partly written bytes past `len` are cut off so the next
            // record does not follow garbage.
            self.cut_back();
            return Err(self.io(source));
        }
        self.len += record.len() as u64;
        Ok(())
    }

    /// Removes the last appended record (its group was not applied).
    pub fn unappend(&mut self, record_start: u64) {
        self.len = record_start;
        self.cut_back();
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
            return Err(self.io(source));
        }
        Ok(())
    }

    /// Empties the log after a durable redb commit that holds all of it.
    /// The truncation need not be synced: records left by a crash before it
    /// reaches the disk are at or below the durable LSN and are skipped. A
    /// truncation that fails leaves the records where they are; the next
    /// ones continue their sequence, so the log stays valid, only longer.
    pub fn checkpointed(&mut self) {
        self.last_checkpoint = Instant::now();
        if self.len == HEADER_LEN {
            return;
        }
        match self.file.set_len(HEADER_LEN) {
            Ok(()) => self.len = HEADER_LEN,
            Err(source) => {
                tracing::warn!(path = %self.path.display(), %source, "cannot empty the write-ahead log");
            }
        }
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

    fn cut_back(&mut self) {
        if let Err(source) = self.file.set_len(self.len) {
            self.halt(format!("truncating {}: {source}", self.path.display()));
        }
    }

    fn io(&self, source: std::io::Error) -> WalError {
        WalError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

fn checksum(lsn: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&lsn.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// Reads records until the bytes end or stop making a record that continues
/// the sequence.
fn parse(path: &Path, mut bytes: &[u8]) -> Result<Recovered, WalError> {
    let mut recovered = Recovered::default();
    while bytes.len() >= RECORD_HEADER_LEN {
        let length = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
        let lsn = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        let Some(payload) = bytes.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + length) else {
            break;
        };
        if checksum(lsn, payload) != crc {
            break;
        }
        if recovered
            .records
            .last()
            .is_some_and(|previous| previous.lsn.checked_add(1) != Some(lsn))
        {
            break;
        }
        let ops = decode_ops(payload).map_err(|reason| WalError::Undecodable {
            path: path.to_owned(),
            lsn,
            reason: reason.to_string(),
        })?;
        recovered.records.push(LogRecord { lsn, ops });
        bytes = &bytes[RECORD_HEADER_LEN + length..];
    }
    recovered.dropped_bytes = bytes.len() as u64;
    Ok(recovered)
}

const TAG_DISCOVER: u8 = 1;
const TAG_KNOWN: u8 = 2;
const TAG_DELETE: u8 = 3;

/// The payload of one record: a group's writes.
#[must_use]
pub fn encode_ops(ops: &[WriteOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ops.len() * 128);
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            WriteOp::Discover(new) => {
                out.push(TAG_DISCOVER);
                put_str(&mut out, &new.crawl);
                put_str(&mut out, &new.url);
                out.extend_from_slice(&new.partition.to_le_bytes());
                out.push(u8::from(new.maybe_known));
                put_bytes(&mut out, &new.record.encode());
            }
            WriteOp::Known(known) => {
                out.push(TAG_KNOWN);
                put_str(&mut out, &known.crawl);
                put_str(&mut out, &known.url);
                out.extend_from_slice(&known.partition.to_le_bytes());
                put_optional(&mut out, known.queue_key.as_deref());
                put_str(&mut out, &known.default_queue);
                out.extend_from_slice(&known.due_at.to_le_bytes());
                out.extend_from_slice(&known.now.to_le_bytes());
                // The metadata travels in a record's form, the one encoding
                // of it the store already has.
                let carrier = UrlRecord {
                    metadata: known.metadata.clone(),
                    ..UrlRecord::default()
                };
                put_bytes(&mut out, &carrier.encode());
            }
            WriteOp::Delete(deletion) => {
                out.push(TAG_DELETE);
                put_str(&mut out, &deletion.crawl);
                put_optional(&mut out, deletion.queue.as_deref());
                match deletion.created_before {
                    Some(before) => {
                        out.push(1);
                        out.extend_from_slice(&before.to_le_bytes());
                    }
                    None => out.push(0),
                }
                out.extend_from_slice(&deletion.partitions.to_le_bytes());
            }
        }
    }
    out
}

/// Reads a payload written by [`encode_ops`].
pub fn decode_ops(bytes: &[u8]) -> Result<Vec<WriteOp>, RecordError> {
    let mut reader = Reader { bytes };
    let count = reader.u32()? as usize;
    // Every op takes at least a tag byte and a few lengths: a count beyond
    // the bytes left is damage, refused before allocating.
    if count > reader.bytes.len() {
        return Err(RecordError::Truncated);
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let op = match reader.u8()? {
            TAG_DISCOVER => WriteOp::Discover(NewUrl {
                crawl: reader.string()?,
                url: reader.string()?,
                partition: reader.u32()?,
                maybe_known: read_flag(&mut reader)?,
                record: UrlRecord::decode(read_bytes(&mut reader)?)?,
            }),
            TAG_KNOWN => WriteOp::Known(KnownUrl {
                crawl: reader.string()?,
                url: reader.string()?,
                partition: reader.u32()?,
                queue_key: read_optional(&mut reader)?,
                default_queue: reader.string()?,
                due_at: reader.u64()?,
                now: reader.u64()?,
                metadata: UrlRecord::decode(read_bytes(&mut reader)?)?.metadata,
            }),
            TAG_DELETE => WriteOp::Delete(Deletion {
                crawl: reader.string()?,
                queue: read_optional(&mut reader)?,
                created_before: if read_flag(&mut reader)? {
                    Some(reader.u64()?)
                } else {
                    None
                },
                partitions: reader.u32()?,
            }),
            tag => return Err(RecordError::UnknownTag(tag)),
        };
        ops.push(op);
    }
    if !reader.bytes.is_empty() {
        return Err(RecordError::TrailingBytes(reader.bytes.len()));
    }
    Ok(ops)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_optional(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => {
            out.push(1);
            put_str(out, text);
        }
        None => out.push(0),
    }
}

fn read_bytes<'a>(reader: &mut Reader<'a>) -> Result<&'a [u8], RecordError> {
    let length = reader.u32()? as usize;
    reader.take(length)
}

fn read_flag(reader: &mut Reader<'_>) -> Result<bool, RecordError> {
    match reader.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(RecordError::UnknownTag(other)),
    }
}

fn read_optional(reader: &mut Reader<'_>) -> Result<Option<String>, RecordError> {
    Ok(if read_flag(reader)? {
        Some(reader.string()?)
    } else {
        None
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn metadata() -> impl Strategy<Value = BTreeMap<String, Vec<String>>> {
        prop::collection::btree_map(".{0,6}", prop::collection::vec(".{0,6}", 0..3), 0..3)
    }

    fn op() -> impl Strategy<Value = WriteOp> {
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
                metadata()
            )
                .prop_map(
                    |(crawl, url, partition, queue_key, default_queue, (due_at, now), metadata)| {
                        WriteOp::Known(KnownUrl {
                            crawl,
                            url,
                            partition,
                            queue_key,
                            default_queue,
                            due_at,
                            metadata,
                            now,
                        })
                    }
                ),
            (
                ".{0,8}",
                prop::option::of(".{0,10}"),
                prop::option::of(any::<u64>()),
                any::<u32>()
            )
                .prop_map(|(crawl, queue, created_before, partitions)| {
                    WriteOp::Delete(Deletion {
                        crawl,
                        queue,
                        created_before,
                        partitions,
                    })
                }),
        ]
    }

    fn groups() -> impl Strategy<Value = Vec<Vec<WriteOp>>> {
        prop::collection::vec(prop::collection::vec(op(), 0..5), 1..5)
    }

    /// Writes `groups` as records 1, 2, ... and answers the file's bytes and
    /// the offset where each record ends.
    fn written(groups: &[Vec<WriteOp>]) -> (tempfile::TempDir, Vec<u8>, Vec<u64>) {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, recovered) = Wal::open(dir.path()).unwrap();
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

    proptest! {
        #[test]
        fn ops_round_trip(ops in prop::collection::vec(op(), 0..8)) {
            prop_assert_eq!(decode_ops(&encode_ops(&ops)), Ok(ops));
        }

        /// A log cut anywhere (a crash mid-write) reads back as exactly the
        /// records that were complete, and the rest is reported dropped.
        #[test]
        fn a_torn_log_keeps_every_complete_record(groups in groups(), cut in any::<prop::sample::Index>()) {
            let (dir, bytes, ends) = written(&groups);
            let cut = HEADER_LEN as usize + cut.index(bytes.len() - HEADER_LEN as usize + 1);
            std::fs::write(dir.path().join(FILE_NAME), &bytes[..cut]).unwrap();
            let (_, recovered) = Wal::open(dir.path()).unwrap();
            let complete = ends.iter().filter(|&&end| end as usize <= cut).count();
            prop_assert_eq!(recovered.records.len(), complete);
            for (record, (lsn, ops)) in recovered.records.iter().zip((1..).zip(&groups)) {
                prop_assert_eq!(record.lsn, lsn);
                prop_assert_eq!(&record.ops, ops);
            }
            let kept = if complete == 0 { HEADER_LEN } else { ends[complete - 1] };
            prop_assert_eq!(recovered.dropped_bytes, cut as u64 - kept);
        }

        /// A flipped byte in the last record drops that record, never
        /// yields a different one.
        #[test]
        fn a_damaged_last_record_is_dropped(groups in groups(), at in any::<prop::sample::Index>(), flip in 1_u8..) {
            let (dir, mut bytes, ends) = written(&groups);
            let start = if ends.len() > 1 { ends[ends.len() - 2] } else { HEADER_LEN } as usize;
            let at = start + at.index(bytes.len() - start);
            bytes[at] ^= flip;
            std::fs::write(dir.path().join(FILE_NAME), &bytes).unwrap();
            match Wal::open(dir.path()) {
                Ok((_, recovered)) => {
                    prop_assert_eq!(recovered.records.len(), groups.len() - 1);
                    for (record, ops) in recovered.records.iter().zip(&groups) {
                        prop_assert_eq!(&record.ops, ops);
                    }
                }
                // A flip in the length that still lands on a valid CRC is
                // out of reach; a CRC collision on a decodable payload too.
                Err(error) => prop_assert!(false, "{error}"),
            }
        }
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"not a log at all").unwrap();
        assert!(matches!(
            Wal::open(dir.path()),
            Err(WalError::NotALog { .. })
        ));
    }

    /// Records after a truncation continue the sequence; stale ones left
    /// behind by a truncation that never reached the disk end the log.
    #[test]
    fn stale_records_after_a_restart_of_the_sequence_end_the_log() {
        let groups: Vec<Vec<WriteOp>> = (0..3)
            .map(|i| {
                vec![WriteOp::Delete(Deletion {
                    crawl: format!("c{i}"),
                    queue: None,
                    created_before: None,
                    partitions: 4,
                })]
            })
            .collect();
        let (dir, bytes, _) = written(&groups);
        // Record 7 written over the start of the old records 1-3, as after
        // a checkpoint whose truncation was lost.
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        wal.len = HEADER_LEN;
        wal.append(7, &groups[0]).unwrap();
        let mut mixed = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        mixed.truncate(wal.end() as usize);
        mixed.extend_from_slice(&bytes[wal.end() as usize..]);
        std::fs::write(dir.path().join(FILE_NAME), &mixed).unwrap();
        let (_, recovered) = Wal::open(dir.path()).unwrap();
        assert_eq!(recovered.records.len(), 1);
        assert_eq!(recovered.records[0].lsn, 7);
    }
}
