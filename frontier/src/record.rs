//! The value stored for each URL, in a small versioned binary form.
//!
//! ```text
//! u8  record version (1)
//! u64 created_at      UTC epoch seconds of the first store
//! u64 due_at          next fetch, UTC epoch seconds; 0 = completed
//! u32 depth           hops from a seed
//! str queue key       u32 length + UTF-8
//! u32 metadata keys, each: str key, u32 value count, each value a str
//! ```
//!
//! All integers little-endian. Decoding checks every length against the
//! bytes left, so a damaged record is an error, never a panic or a huge
//! allocation.

use std::collections::BTreeMap;

/// Record format written by this build.
const RECORD_VERSION: u8 = 1;

/// What the store knows of one URL.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UrlRecord {
    /// UTC epoch seconds of the first store.
    pub created_at: u64,
    /// Next fetch (UTC epoch seconds); 0 once completed.
    pub due_at: u64,
    /// Hops from a seed (seeds are 0).
    pub depth: u32,
    /// The queue the URL is served from.
    pub queue_key: String,
    /// Client metadata, key to values, as the API carries it.
    pub metadata: BTreeMap<String, Vec<String>>,
}

impl UrlRecord {
    /// Whether the URL is completed (never served again).
    #[must_use]
    pub fn is_completed(&self) -> bool {
        self.due_at == 0
    }

    /// The binary form.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.queue_key.len());
        out.push(RECORD_VERSION);
        out.extend_from_slice(&self.created_at.to_le_bytes());
        out.extend_from_slice(&self.due_at.to_le_bytes());
        out.extend_from_slice(&self.depth.to_le_bytes());
        put_str(&mut out, &self.queue_key);
        out.extend_from_slice(&(self.metadata.len() as u32).to_le_bytes());
        for (key, values) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&(values.len() as u32).to_le_bytes());
            for value in values {
                put_str(&mut out, value);
            }
        }
        out
    }

    /// Reads the binary form.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let mut reader = Reader { bytes };
        let version = reader.u8()?;
        if version != RECORD_VERSION {
            return Err(RecordError::UnknownVersion(version));
        }
        let created_at = reader.u64()?;
        let due_at = reader.u64()?;
        let depth = reader.u32()?;
        let queue_key = reader.string()?;
        let keys = reader.u32()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..keys {
            let key = reader.string()?;
            // Encoding writes keys in increasing order; anything else (a
            // repeated or out-of-order key) would decode to a record that
            // is not the bytes read.
            if metadata
                .keys()
                .next_back()
                .is_some_and(|last: &String| *last >= key)
            {
                return Err(RecordError::UnorderedMetadata);
            }
            let count = reader.u32()?;
            // Each value takes at least its 4-byte length: a count larger
            // than that allows is damage, refused before allocating.
            if count as usize > reader.bytes.len() / 4 {
                return Err(RecordError::Truncated);
            }
            let values = (0..count)
                .map(|_| reader.string())
                .collect::<Result<Vec<_>, _>>()?;
            metadata.insert(key, values);
        }
        if !reader.bytes.is_empty() {
            return Err(RecordError::TrailingBytes(reader.bytes.len()));
        }
        Ok(Self {
            created_at,
            due_at,
            depth,
            queue_key,
            metadata,
        })
    }
}

/// A stored record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Written by an unknown format version.
    #[error("unknown URL record version {0}")]
    UnknownVersion(u8),
    /// Ends before its fields do.
    #[error("URL record is truncated")]
    Truncated,
    /// A string is not UTF-8.
    #[error("URL record holds invalid UTF-8")]
    InvalidUtf8,
    /// Metadata keys repeated or out of order.
    #[error("URL record metadata keys are repeated or out of order")]
    UnorderedMetadata,
    /// A field holds a value no version of the form has.
    #[error("unknown tag {0}")]
    UnknownTag(u8),
    /// Bytes after the last field.
    #[error("{0} unexpected bytes after a URL record")]
    TrailingBytes(usize),
}

pub(crate) fn put_str(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Reads the little-endian fields of the store's binary forms, checking
/// each length against the bytes left.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, count: usize) -> Result<&'a [u8], RecordError> {
        if self.bytes.len() < count {
            return Err(RecordError::Truncated);
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, RecordError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, RecordError> {
        let mut word = [0_u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    pub(crate) fn string(&mut self) -> Result<String, RecordError> {
        let length = self.u32()? as usize;
        let bytes = self.take(length)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError::InvalidUtf8)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record() -> impl Strategy<Value = UrlRecord> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            ".{0,20}",
            prop::collection::btree_map(".{0,8}", prop::collection::vec(".{0,8}", 0..3), 0..4),
        )
            .prop_map(
                |(created_at, due_at, depth, queue_key, metadata)| UrlRecord {
                    created_at,
                    due_at,
                    depth,
                    queue_key,
                    metadata,
                },
            )
    }

    proptest! {
        #[test]
        fn round_trip(record in record()) {
            prop_assert_eq!(UrlRecord::decode(&record.encode()), Ok(record));
        }

        #[test]
        fn damage_is_an_error_or_an_exact_record(
            record in record(),
            cut in any::<prop::sample::Index>(),
            flip in any::<(prop::sample::Index, u8)>(),
        ) {
            let mut bytes = record.encode();
            let (at, value) = flip;
            let at = at.index(bytes.len());
            bytes[at] ^= value;
            bytes.truncate(cut.index(bytes.len() + 1));
            if let Ok(decoded) = UrlRecord::decode(&bytes) {
                prop_assert_eq!(decoded.encode(), bytes);
            }
        }
    }

    /// Found by the `record` fuzz target: a record whose metadata repeated
    /// one key decoded to a record that encoded differently.
    #[test]
    fn regression_repeated_metadata_keys_are_refused() {
        let mut bytes = UrlRecord::default().encode();
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&2_u32.to_le_bytes());
        for _ in 0..2 {
            bytes.extend_from_slice(&0_u32.to_le_bytes()); // key ""
            bytes.extend_from_slice(&0_u32.to_le_bytes()); // no values
        }
        assert_eq!(
            UrlRecord::decode(&bytes),
            Err(RecordError::UnorderedMetadata)
        );
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        let mut bytes = UrlRecord::default().encode();
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&1_u32.to_le_bytes());
        bytes.extend_from_slice(&0_u32.to_le_bytes()); // key ""
        bytes.extend_from_slice(&u32::MAX.to_le_bytes()); // 4 billion values
        assert_eq!(UrlRecord::decode(&bytes), Err(RecordError::Truncated));
        assert_eq!(UrlRecord::decode(&[9]), Err(RecordError::UnknownVersion(9)));
        assert_eq!(UrlRecord::decode(&[]), Err(RecordError::Truncated));
    }
}
