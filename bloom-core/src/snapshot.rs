//! The snapshot format shared by every filter type: a fixed header, the
//! words, and a checksum over both.
//!
//! ```text
//! offset size field
//!      0    8 magic "BLMCORE\0"
//!      8    2 format version (1)
//!     10    1 kind: 1 = Bloom filter, 2 = counting Bloom filter
//!     11    1 layout: 1 = standard, 2 = blocked (512-bit blocks)
//!     12    1 hash identity: 1 = xxh3-128
//!     13    3 reserved, zero
//!     16    8 hash seed
//!     24    8 bits (Bloom) or counters (counting)
//!     32    4 hashes per key
//!     36    4 reserved, zero
//!     40    8 number of 64-bit words that follow
//!     48  8*w the words
//!  48+8w    8 xxh3-64 of every byte before it
//! ```
//!
//! All integers are little-endian. A reader checks everything it can before
//! it trusts a byte: the magic, version, kind, layout, hash identity and
//! parameters in the header; that the word count agrees with the parameters;
//! then the checksum. Words are read in bounded chunks, so a corrupt header
//! that claims a huge filter fails with `Truncated` when the data runs out,
//! not with an allocation of the claimed size.

use std::io::{Read, Write};

use xxhash_rust::xxh3::Xxh3;

use crate::error::SnapshotError;
use crate::hash::{HASH_ID, HASH_SEED};
use crate::layout::Layout;

pub use crate::format::FORMAT_VERSION;

const MAGIC: [u8; 8] = *b"BLMCORE\0";
const HEADER_LEN: usize = 48;
/// Words are read this many at a time.
const CHUNK_WORDS: usize = 8192;

/// What a snapshot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Bloom,
    Counting,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Bloom => 1,
            Kind::Counting => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Bloom => "Bloom",
            Kind::Counting => "counting Bloom",
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Kind::Bloom),
            2 => Some(Kind::Counting),
            _ => None,
        }
    }
}

/// The parameters a snapshot header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) layout: Layout,
    pub(crate) bits: u64,
    pub(crate) hashes: u32,
    pub(crate) words: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0_u8; HEADER_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[10] = self.kind.code();
        out[11] = self.layout.code();
        out[12] = HASH_ID;
        out[16..24].copy_from_slice(&HASH_SEED.to_le_bytes());
        out[24..32].copy_from_slice(&self.bits.to_le_bytes());
        out[32..36].copy_from_slice(&self.hashes.to_le_bytes());
        out[40..48].copy_from_slice(&self.words.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; HEADER_LEN], expected: Kind) -> Result<Self, SnapshotError> {
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if bytes[0..8] != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion(version));
        }
        let kind = Kind::from_code(bytes[10]).ok_or_else(|| {
            SnapshotError::InvalidHeader(format!("unknown filter kind {}", bytes[10]))
        })?;
        if kind != expected {
            return Err(SnapshotError::KindMismatch {
                expected: expected.name(),
                found: kind.name(),
            });
        }
        let layout = Layout::from_code(bytes[11]).ok_or(SnapshotError::UnknownLayout(bytes[11]))?;
        let seed = u64_at(16);
        if bytes[12] != HASH_ID || seed != HASH_SEED {
            return Err(SnapshotError::HashMismatch {
                id: bytes[12],
                seed,
            });
        }
        if bytes[13..16] != [0; 3] || bytes[36..40] != [0; 4] {
            return Err(SnapshotError::InvalidHeader(
                "reserved bytes are not zero".into(),
            ));
        }
        Ok(Header {
            kind,
            layout,
            bits: u64_at(24),
            hashes: u32::from_le_bytes([bytes[32], bytes[33], bytes[34], bytes[35]]),
            words: u64_at(40),
        })
    }
}

/// Writes a header, the words and the checksum.
pub(crate) fn write(
    mut writer: impl Write,
    header: Header,
    words: impl Iterator<Item = u64>,
) -> Result<(), SnapshotError> {
    let mut checksum = Xxh3::new();
    let encoded = header.encode();
    checksum.update(&encoded);
    writer.write_all(&encoded)?;
    let mut buffer = Vec::with_capacity(CHUNK_WORDS * 8);
    let mut written = 0_u64;
    for word in words {
        buffer.extend_from_slice(&word.to_le_bytes());
        written += 1;
        if buffer.len() == buffer.capacity() {
            checksum.update(&buffer);
            writer.write_all(&buffer)?;
            buffer.clear();
        }
    }
    debug_assert_eq!(written, header.words, "word count must match the header");
    checksum.update(&buffer);
    writer.write_all(&buffer)?;
    writer.write_all(&checksum.digest().to_le_bytes())?;
    writer.flush()?;
    Ok(())
}

/// Reads a snapshot of the expected kind. `check_shape` validates the
/// header's parameters (and the word count they imply) before any word is
/// read.
pub(crate) fn read(
    mut reader: impl Read,
    expected: Kind,
    check_shape: impl Fn(&Header) -> Result<(), String>,
) -> Result<(Header, Vec<u64>), SnapshotError> {
    let mut encoded = [0_u8; HEADER_LEN];
    read_exact(&mut reader, &mut encoded)?;
    let header = Header::decode(&encoded, expected)?;
    check_shape(&header).map_err(SnapshotError::InvalidHeader)?;

    let mut checksum = Xxh3::new();
    checksum.update(&encoded);
    let total = usize::try_from(header.words)
        .map_err(|_| SnapshotError::InvalidHeader("word count does not fit in memory".into()))?;
    let mut words = Vec::with_capacity(total.min(CHUNK_WORDS));
    let mut buffer = vec![0_u8; CHUNK_WORDS * 8];
    while words.len() < total {
        let chunk = (total - words.len()).min(CHUNK_WORDS);
        let bytes = &mut buffer[..chunk * 8];
        read_exact(&mut reader, bytes)?;
        checksum.update(bytes);
        words.extend(
            bytes
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])),
        );
    }
    let mut stored = [0_u8; 8];
    read_exact(&mut reader, &mut stored)?;
    let stored = u64::from_le_bytes(stored);
    let computed = checksum.digest();
    if stored != computed {
        return Err(SnapshotError::ChecksumMismatch { stored, computed });
    }
    Ok((header, words))
}

/// Reads a snapshot from a byte slice, refusing bytes after its end.
pub(crate) fn read_bytes(
    bytes: &[u8],
    expected: Kind,
    check_shape: impl Fn(&Header) -> Result<(), String>,
) -> Result<(Header, Vec<u64>), SnapshotError> {
    let mut cursor = bytes;
    let result = read(&mut cursor, expected, check_shape)?;
    if !cursor.is_empty() {
        return Err(SnapshotError::TrailingBytes(cursor.len()));
    }
    Ok(result)
}

/// `read_exact` with a clean end of input reported as truncation.
fn read_exact(reader: &mut impl Read, buffer: &mut [u8]) -> Result<(), SnapshotError> {
    reader.read_exact(buffer).map_err(|error| {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            SnapshotError::Truncated
        } else {
            SnapshotError::Io(error)
        }
    })
}

/// Size in bytes of a snapshot of `words` words.
#[must_use]
pub fn snapshot_len(words: u64) -> u64 {
    HEADER_LEN as u64 + 8 * words + 8
}
