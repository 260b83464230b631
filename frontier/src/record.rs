//! The value stored for each URL, in a small versioned binary form.
//!
//! ```text
//! u8  record version (2)
//! var created_at      UTC epoch seconds of the first store
//! var due_at          next fetch, UTC epoch seconds; 0 = completed
//! var depth           hops from a seed
//! str queue key
//! var metadata keys, each: str key, var value count, each value a str
//! ```
//!
//! `var` is an unsigned LEB128 varint in its shortest form; `str` a var
//! length and UTF-8. A record is stored for every URL a store holds, so its
//! size is paid per URL: version 1, still read, wrote every integer and
//! length at full width (u64 dates, u32 depth, counts and lengths, all
//! little-endian), 15 bytes more for a typical record. Records are written
//! in version 2 as they change, so a store of either opens.
//!
//! Decoding checks every length against the bytes left and accepts only
//! shortest varints, so a damaged record is an error, never a panic or a
//! huge allocation, and a record read back encodes to the bytes read.

use std::collections::BTreeMap;

/// Record format written by this build.
const RECORD_VERSION: u8 = 2;
/// The format of full-width integers, read still.
const RECORD_VERSION_FIXED: u8 = 1;

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
        let mut out = Vec::with_capacity(24 + self.queue_key.len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the binary form to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.encode_with_metadata(&self.metadata, out);
    }

    /// Appends what a default record holding `metadata` encodes to, without
    /// making one: the form the log carries a report's metadata in.
    pub fn encode_metadata_into(metadata: &BTreeMap<String, Vec<String>>, out: &mut Vec<u8>) {
        Self::default().encode_with_metadata(metadata, out);
    }

    /// This record's fields but its metadata, then `metadata`.
    fn encode_with_metadata(&self, metadata: &BTreeMap<String, Vec<String>>, out: &mut Vec<u8>) {
        out.push(RECORD_VERSION);
        put_varint(out, self.created_at);
        put_varint(out, self.due_at);
        put_varint(out, u64::from(self.depth));
        put_short_str(out, &self.queue_key);
        put_metadata(out, metadata);
    }

    /// The binary form of version 1, as stores written before version 2
    /// hold it: what tests of those stores write.
    #[must_use]
    pub fn encode_version_1(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.queue_key.len());
        out.push(RECORD_VERSION_FIXED);
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

    /// The binary form in the version `bytes` (a record) was written in:
    /// what a record read back from `bytes` encodes to.
    #[must_use]
    pub fn encode_as_read(&self, bytes: &[u8]) -> Vec<u8> {
        if bytes.first() == Some(&RECORD_VERSION_FIXED) {
            self.encode_version_1()
        } else {
            self.encode()
        }
    }

    /// Reads the binary form, of either version.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let mut reader = Reader { bytes };
        let version = reader.u8()?;
        let fields = match version {
            RECORD_VERSION => Fields::Compact,
            RECORD_VERSION_FIXED => Fields::Fixed,
            other => return Err(RecordError::UnknownVersion(other)),
        };
        let created_at = fields.u64(&mut reader)?;
        let due_at = fields.u64(&mut reader)?;
        let depth = fields.u32(&mut reader)?;
        let queue_key = fields.string(&mut reader)?;
        let metadata = read_metadata(fields, &mut reader)?;
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

/// The first byte of a version 3 entry, written by schema 6 stores and
/// read still; a version 4 entry's first byte is
/// [`ENTRY_VERSION_4`] plus its URL form.
const ENTRY_VERSION_3: u8 = 3;
/// See [`ENTRY_VERSION_3`].
const ENTRY_VERSION_4: u8 = 4;

/// How an entry holds its URL: whole, or its scheme and the queue key
/// left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UrlForm {
    Whole = 0,
    Http = 1,
    Https = 2,
}

impl UrlForm {
    fn prefix(self) -> &'static str {
        match self {
            Self::Whole => "",
            Self::Http => "http://",
            Self::Https => "https://",
        }
    }

    /// The form `url` is stored in under `queue_key`, and what is left of
    /// it to store.
    fn of<'u>(url: &'u str, queue_key: &str) -> (Self, &'u str) {
        [Self::Https, Self::Http]
            .into_iter()
            .find_map(|form| {
                let rest = url.strip_prefix(form.prefix())?.strip_prefix(queue_key)?;
                (!queue_key.is_empty()).then_some((form, rest))
            })
            .unwrap_or((Self::Whole, url))
    }

    fn from_tag(tag: u8) -> Result<Self, RecordError> {
        match tag {
            0 => Ok(Self::Whole),
            1 => Ok(Self::Http),
            2 => Ok(Self::Https),
            other => Err(RecordError::UnknownTag(other)),
        }
    }
}

/// The entry versions a store reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryVersion {
    /// Schema 6: the URL form in a byte of its own, the due date whole.
    Three,
    /// Schema 7 on: the form in the version byte, the due date from the
    /// creation date.
    Four,
}

/// A version 4 due date: the completed mark, the date whole, or its
/// distance from the creation date (what a URL found now and due now
/// takes a byte for, instead of five).
const DUE_COMPLETED: u64 = 0;
/// See [`DUE_COMPLETED`].
const DUE_WHOLE: u64 = 1;
/// See [`DUE_COMPLETED`]: codes from this one on are `due_at - created_at`
/// past it.
const DUE_AFTER_CREATED: u64 = 2;

/// The code of a version 4 due date, and the whole date when the code
/// says one follows.
fn due_code(created_at: u64, due_at: u64) -> (u64, Option<u64>) {
    if due_at == 0 {
        return (DUE_COMPLETED, None);
    }
    match due_at
        .checked_sub(created_at)
        .and_then(|after| after.checked_add(DUE_AFTER_CREATED))
    {
        Some(code) => (code, None),
        None => (DUE_WHOLE, Some(due_at)),
    }
}

/// The due date a version 4 code stands for, refusing any code
/// [`due_code`] would not have written for it.
fn due_from_code(created_at: u64, code: u64, reader: &mut Reader<'_>) -> Result<u64, RecordError> {
    let due_at = match code {
        DUE_COMPLETED => return Ok(0),
        DUE_WHOLE => reader.varint()?,
        code => created_at
            .checked_add(code - DUE_AFTER_CREATED)
            .ok_or(RecordError::BadNumber)?,
    };
    if due_code(created_at, due_at).0 != code {
        return Err(RecordError::BadNumber);
    }
    Ok(due_at)
}

/// One URL's record as the store holds it. A `url_records` value holds
/// the entries of every URL of its crawl and partition whose hash is the
/// key's, back to back: one, but for a hash collision.
///
/// ```text
/// version 4 (written by stores of schema 7 and later):
/// u8  4 + URL form: 0 the whole URL follows; 1 it is "http://", the
///     queue key, then what follows; 2 the same with "https://"
/// var queue number (the store's number for the URL's crawl and queue key)
/// str the URL, or what follows the queue key in it
/// var created_at
/// var due: 0 completed; 1 due_at follows, as a var; 2 + n due_at is
///     created_at + n (written whenever due_at >= created_at)
/// var depth
/// var metadata keys, each: str key, var value count, each value a str
///
/// version 3 (schema 6 stores, read still):
/// u8  3
/// var queue number
/// u8  URL form
/// str the URL, or what follows the queue key in it
/// var created_at
/// var due_at
/// var depth
/// var metadata keys, as version 4
/// ```
///
/// A queue key is by default the URL's host, so most URLs are stored
/// without their scheme and host, which their queue's name holds once for
/// all of them; the number stands for the queue's name in the record too.
/// A URL found and due now (most of a crawl's) takes a byte for its due
/// date. Decoding checks lengths, UTF-8, number forms and metadata order as
/// the record's version 2 does, and refuses a due date in any code but the
/// one written for it, so an entry read encodes back to the bytes read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry<'a> {
    /// The store's number for the URL's queue.
    pub queue: u32,
    version: EntryVersion,
    form: UrlForm,
    rest: &'a str,
    /// UTC epoch seconds of the first store.
    pub created_at: u64,
    /// Next fetch (UTC epoch seconds); 0 once completed.
    pub due_at: u64,
    /// Hops from a seed.
    pub depth: u32,
    metadata: &'a [u8],
    /// The entry's bytes in its value.
    pub raw: &'a [u8],
}

impl<'a> StoredEntry<'a> {
    /// Appends the entry of `url`, whose record names the queue numbered
    /// `queue`, to `out`.
    pub fn encode(url: &str, queue: u32, record: &UrlRecord, out: &mut Vec<u8>) {
        let (form, rest) = UrlForm::of(url, &record.queue_key);
        Self::encode_parts(EntryVersion::Four, queue, form, rest, record, out);
    }

    /// Appends this entry again, in the version and form it was read in,
    /// with the fields of `record` (what a record read from it encodes
    /// to).
    pub fn encode_again(&self, record: &UrlRecord, out: &mut Vec<u8>) {
        Self::encode_parts(self.version, self.queue, self.form, self.rest, record, out);
    }

    /// The version 3 entry of `url`, as schema 6 stores hold it: what tests
    /// of those stores write.
    #[cfg(test)]
    pub(crate) fn encode_version_3(url: &str, queue: u32, record: &UrlRecord, out: &mut Vec<u8>) {
        let (form, rest) = UrlForm::of(url, &record.queue_key);
        Self::encode_parts(EntryVersion::Three, queue, form, rest, record, out);
    }

    /// This entry again as version 3, with the fields of `record`: what
    /// tests write to make a store of schema 6 from one of this schema.
    #[cfg(test)]
    pub(crate) fn encode_again_as_version_3(&self, record: &UrlRecord, out: &mut Vec<u8>) {
        Self::encode_parts(
            EntryVersion::Three,
            self.queue,
            self.form,
            self.rest,
            record,
            out,
        );
    }

    /// Whether the entry is of the version schema 6 wrote.
    #[cfg(test)]
    pub(crate) fn is_version_3(&self) -> bool {
        self.version == EntryVersion::Three
    }

    fn encode_parts(
        version: EntryVersion,
        queue: u32,
        form: UrlForm,
        rest: &str,
        record: &UrlRecord,
        out: &mut Vec<u8>,
    ) {
        match version {
            EntryVersion::Three => {
                out.push(ENTRY_VERSION_3);
                put_varint(out, u64::from(queue));
                out.push(form as u8);
            }
            EntryVersion::Four => {
                out.push(ENTRY_VERSION_4 + form as u8);
                put_varint(out, u64::from(queue));
            }
        }
        put_short_str(out, rest);
        put_varint(out, record.created_at);
        match version {
            EntryVersion::Three => put_varint(out, record.due_at),
            EntryVersion::Four => {
                let (code, whole) = due_code(record.created_at, record.due_at);
                put_varint(out, code);
                if let Some(due_at) = whole {
                    put_varint(out, due_at);
                }
            }
        }
        put_varint(out, u64::from(record.depth));
        put_metadata(out, &record.metadata);
    }

    /// The entries of a value, in order; at least one.
    pub fn decode_all(value: &'a [u8]) -> Result<Vec<Self>, RecordError> {
        let mut reader = Reader { bytes: value };
        let mut entries = Vec::with_capacity(1);
        loop {
            let start = reader.bytes;
            let mut entry = Self::decode_one(&mut reader)?;
            entry.raw = &start[..start.len() - reader.bytes.len()];
            entries.push(entry);
            if reader.bytes.is_empty() {
                return Ok(entries);
            }
        }
    }

    fn decode_one(reader: &mut Reader<'a>) -> Result<Self, RecordError> {
        let fields = Fields::Compact;
        let (version, form, queue) = match reader.u8()? {
            ENTRY_VERSION_3 => {
                let queue = fields.u32(reader)?;
                (EntryVersion::Three, UrlForm::from_tag(reader.u8()?)?, queue)
            }
            tag @ ENTRY_VERSION_4..=u8::MAX => {
                let form = UrlForm::from_tag(tag - ENTRY_VERSION_4)
                    .map_err(|_| RecordError::UnknownVersion(tag))?;
                (EntryVersion::Four, form, fields.u32(reader)?)
            }
            other => return Err(RecordError::UnknownVersion(other)),
        };
        let length = usize::try_from(reader.varint()?).map_err(|_| RecordError::BadNumber)?;
        let rest =
            std::str::from_utf8(reader.take(length)?).map_err(|_| RecordError::InvalidUtf8)?;
        let created_at = fields.u64(reader)?;
        let due_at = match version {
            EntryVersion::Three => fields.u64(reader)?,
            EntryVersion::Four => {
                let code = reader.varint()?;
                due_from_code(created_at, code, reader)?
            }
        };
        let depth = fields.u32(reader)?;
        let metadata_start = reader.bytes;
        skip_metadata(reader)?;
        let metadata = &metadata_start[..metadata_start.len() - reader.bytes.len()];
        Ok(Self {
            queue,
            version,
            form,
            rest,
            created_at,
            due_at,
            depth,
            metadata,
            raw: &[],
        })
    }

    /// Whether the URL is completed (never served again).
    #[must_use]
    pub fn is_completed(&self) -> bool {
        self.due_at == 0
    }

    /// The URL, given the name of the entry's queue.
    #[must_use]
    pub fn url(&self, queue_key: &str) -> String {
        let prefix = self.form.prefix();
        let mut url = String::with_capacity(prefix.len() + queue_key.len() + self.rest.len());
        self.write_url(queue_key, &mut url);
        url
    }

    /// Appends the URL to `out`, given the name of the entry's queue.
    pub fn write_url(&self, queue_key: &str, out: &mut String) {
        out.push_str(self.form.prefix());
        if self.form != UrlForm::Whole {
            out.push_str(queue_key);
        }
        out.push_str(self.rest);
    }

    /// Whether the entry is `url`'s, given the name of its queue.
    #[must_use]
    pub fn is_url(&self, url: &str, queue_key: &str) -> bool {
        if self.form == UrlForm::Whole {
            return url == self.rest;
        }
        url.strip_prefix(self.form.prefix())
            .and_then(|url| url.strip_prefix(queue_key))
            .is_some_and(|rest| rest == self.rest)
    }

    /// The entry's metadata, still encoded.
    #[must_use]
    pub fn compact_metadata(&self) -> CompactMetadata {
        CompactMetadata::from_bytes(self.metadata)
    }

    /// The whole record, given the name of the entry's queue.
    pub fn record(&self, queue_key: String) -> Result<UrlRecord, RecordError> {
        let mut reader = Reader {
            bytes: self.metadata,
        };
        Ok(UrlRecord {
            created_at: self.created_at,
            due_at: self.due_at,
            depth: self.depth,
            queue_key,
            metadata: read_metadata(Fields::Compact, &mut reader)?,
        })
    }
}

/// Reads past compact metadata, checking it as [`read_metadata`] does,
/// without copying it.
fn skip_metadata(reader: &mut Reader<'_>) -> Result<(), RecordError> {
    let fields = Fields::Compact;
    let keys = fields.u32(reader)?;
    let mut last_key: Option<&str> = None;
    let string = |reader: &mut Reader<'_>| -> Result<(), RecordError> {
        let length = usize::try_from(reader.varint()?).map_err(|_| RecordError::BadNumber)?;
        std::str::from_utf8(reader.take(length)?).map_err(|_| RecordError::InvalidUtf8)?;
        Ok(())
    };
    for _ in 0..keys {
        let length = usize::try_from(reader.varint()?).map_err(|_| RecordError::BadNumber)?;
        let key =
            std::str::from_utf8(reader.take(length)?).map_err(|_| RecordError::InvalidUtf8)?;
        if last_key.is_some_and(|last| last >= key) {
            return Err(RecordError::UnorderedMetadata);
        }
        last_key = Some(key);
        let count = fields.u32(reader)?;
        for _ in 0..count {
            string(reader)?;
        }
    }
    Ok(())
}

/// Reads a record's metadata: a count of keys, each with its values.
fn read_metadata(
    fields: Fields,
    reader: &mut Reader<'_>,
) -> Result<BTreeMap<String, Vec<String>>, RecordError> {
    let keys = fields.u32(reader)?;
    // Each key takes at least a byte: a count larger than that allows is
    // damage, refused before reading on.
    if keys as usize > reader.bytes.len() {
        return Err(RecordError::Truncated);
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..keys {
        let key = fields.string(reader)?;
        // Encoding writes keys in increasing order; anything else (a
        // repeated or out-of-order key) would decode to a record that is
        // not the bytes read.
        if metadata
            .keys()
            .next_back()
            .is_some_and(|last: &String| *last >= key)
        {
            return Err(RecordError::UnorderedMetadata);
        }
        let count = fields.u32(reader)?;
        // Each value takes at least its length: a count larger than that
        // allows is damage, refused before allocating.
        if count as usize > reader.bytes.len() / fields.least_string_len() {
            return Err(RecordError::Truncated);
        }
        let values = (0..count)
            .map(|_| fields.string(reader))
            .collect::<Result<Vec<_>, _>>()?;
        metadata.insert(key, values);
    }
    Ok(metadata)
}

/// A URL's metadata in the compact form of its entry, decoded only when
/// needed: what a queue keeps of a URL it is about to hand out, so that a
/// lease needs no second read of the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactMetadata(
    /// Empty: no metadata (no allocation for the common case).
    Box<[u8]>,
);

impl CompactMetadata {
    /// `metadata` encoded.
    #[must_use]
    pub fn of(metadata: &BTreeMap<String, Vec<String>>) -> Self {
        if metadata.is_empty() {
            return Self::default();
        }
        let mut out = Vec::new();
        put_metadata(&mut out, metadata);
        Self(out.into_boxed_slice())
    }

    fn from_bytes(bytes: &[u8]) -> Self {
        match bytes {
            [0] => Self::default(),
            bytes => Self(bytes.into()),
        }
    }

    /// The metadata.
    pub fn decode(&self) -> Result<BTreeMap<String, Vec<String>>, RecordError> {
        if self.0.is_empty() {
            return Ok(BTreeMap::new());
        }
        let mut reader = Reader { bytes: &self.0 };
        let metadata = read_metadata(Fields::Compact, &mut reader)?;
        if !reader.bytes.is_empty() {
            return Err(RecordError::TrailingBytes(reader.bytes.len()));
        }
        Ok(metadata)
    }
}

fn put_metadata(out: &mut Vec<u8>, metadata: &BTreeMap<String, Vec<String>>) {
    put_varint(out, metadata.len() as u64);
    for (key, values) in metadata {
        put_short_str(out, key);
        put_varint(out, values.len() as u64);
        for value in values {
            put_short_str(out, value);
        }
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
    /// A varint longer than its shortest form, or beyond its field's range.
    #[error("URL record holds a malformed or out-of-range number")]
    BadNumber,
    /// An entry names a queue number the store does not have.
    #[error("URL record names queue number {0}, which the store does not have")]
    UnknownQueue(u32),
    /// An entry is stored under a key its URL does not hash to.
    #[error("URL record is stored under another URL's key")]
    WrongKey,
}

/// How a version writes its integers and lengths.
#[derive(Clone, Copy)]
enum Fields {
    Compact,
    Fixed,
}

impl Fields {
    fn u64(self, reader: &mut Reader<'_>) -> Result<u64, RecordError> {
        match self {
            Self::Compact => reader.varint(),
            Self::Fixed => reader.u64(),
        }
    }

    fn u32(self, reader: &mut Reader<'_>) -> Result<u32, RecordError> {
        match self {
            Self::Compact => u32::try_from(reader.varint()?).map_err(|_| RecordError::BadNumber),
            Self::Fixed => reader.u32(),
        }
    }

    fn string(self, reader: &mut Reader<'_>) -> Result<String, RecordError> {
        match self {
            Self::Compact => {
                let length =
                    usize::try_from(reader.varint()?).map_err(|_| RecordError::BadNumber)?;
                reader.utf8(length)
            }
            Self::Fixed => reader.string(),
        }
    }

    fn least_string_len(self) -> usize {
        match self {
            Self::Compact => 1,
            Self::Fixed => 4,
        }
    }
}

/// Appends `value` as an unsigned LEB128 varint, shortest form.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_short_str(out: &mut Vec<u8>, text: &str) {
    put_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
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

    /// An unsigned LEB128 varint in its shortest form.
    pub(crate) fn varint(&mut self) -> Result<u64, RecordError> {
        let mut value = 0_u64;
        for index in 0..10 {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte holds only the top bit of a u64.
            if index == 9 && byte > 1 {
                return Err(RecordError::BadNumber);
            }
            value |= bits << (7 * index);
            if byte & 0x80 == 0 {
                // A last byte of zero after others is a longer form of a
                // shorter number.
                if byte == 0 && index > 0 {
                    return Err(RecordError::BadNumber);
                }
                return Ok(value);
            }
        }
        Err(RecordError::BadNumber)
    }

    pub(crate) fn string(&mut self) -> Result<String, RecordError> {
        let length = self.u32()? as usize;
        self.utf8(length)
    }

    /// The next `length` bytes, as UTF-8.
    fn utf8(&mut self, length: usize) -> Result<String, RecordError> {
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
            prop_assert_eq!(UrlRecord::decode(&record.encode()), Ok(record.clone()));
            prop_assert_eq!(UrlRecord::decode(&record.encode_version_1()), Ok(record));
        }

        #[test]
        fn damage_is_an_error_or_an_exact_record(
            record in record(),
            version_1 in any::<bool>(),
            cut in any::<prop::sample::Index>(),
            flip in any::<(prop::sample::Index, u8)>(),
        ) {
            let mut bytes = if version_1 { record.encode_version_1() } else { record.encode() };
            let (at, value) = flip;
            let at = at.index(bytes.len());
            bytes[at] ^= value;
            bytes.truncate(cut.index(bytes.len() + 1));
            if let Ok(decoded) = UrlRecord::decode(&bytes) {
                prop_assert_eq!(decoded.encode_as_read(&bytes), bytes);
            }
        }
    }

    fn url() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["http://", "https://", "ftp://", ""]),
            prop::sample::select(vec!["a.example", "b.example", ""]),
            ".{0,12}",
        )
            .prop_map(|(scheme, host, rest)| format!("{scheme}{host}{rest}"))
    }

    proptest! {
        /// Entries back to back read as they were written, each URL whole
        /// whatever its form, and only its own URL matches it.
        #[test]
        fn entries_round_trip(
            entries in prop::collection::vec((url(), any::<u32>(), record(), any::<bool>()), 1..4),
        ) {
            let mut value = Vec::new();
            for (url, queue, record, version_3) in &entries {
                if *version_3 {
                    StoredEntry::encode_version_3(url, *queue, record, &mut value);
                } else {
                    StoredEntry::encode(url, *queue, record, &mut value);
                }
            }
            let decoded = StoredEntry::decode_all(&value).unwrap();
            prop_assert_eq!(decoded.len(), entries.len());
            let mut again = Vec::new();
            for (entry, (url, queue, record, _)) in decoded.iter().zip(&entries) {
                prop_assert_eq!(entry.queue, *queue);
                prop_assert_eq!(&entry.url(&record.queue_key), url);
                prop_assert!(entry.is_url(url, &record.queue_key));
                let longer = format!("{url}x");
                prop_assert!(!entry.is_url(&longer, &record.queue_key));
                prop_assert_eq!(&entry.record(record.queue_key.clone()).unwrap(), record);
                entry.encode_again(record, &mut again);
            }
            prop_assert_eq!(again, value);
        }

        #[test]
        fn damaged_entries_are_an_error_or_exact(
            url in url(),
            record in record(),
            version_3 in any::<bool>(),
            cut in any::<prop::sample::Index>(),
            flip in any::<(prop::sample::Index, u8)>(),
        ) {
            let mut bytes = Vec::new();
            if version_3 {
                StoredEntry::encode_version_3(&url, 7, &record, &mut bytes);
            } else {
                StoredEntry::encode(&url, 7, &record, &mut bytes);
            }
            let (at, value) = flip;
            let at = at.index(bytes.len());
            bytes[at] ^= value;
            bytes.truncate(cut.index(bytes.len() + 1));
            if let Ok(entries) = StoredEntry::decode_all(&bytes) {
                let mut again = Vec::new();
                for entry in &entries {
                    let read = entry.record("q".to_owned()).unwrap();
                    entry.encode_again(&read, &mut again);
                }
                prop_assert_eq!(again, bytes);
            }
        }
    }

    /// The log's metadata carrier is byte for byte a default record
    /// holding the metadata, which the log's reader decodes.
    #[test]
    fn metadata_alone_encodes_as_a_default_record_holding_it() {
        let metadata = BTreeMap::from([
            ("depth".to_owned(), vec!["2".to_owned()]),
            ("seed".to_owned(), vec!["a".to_owned(), String::new()]),
        ]);
        let mut carrier = vec![7];
        UrlRecord::encode_metadata_into(&metadata, &mut carrier);
        let record = UrlRecord {
            metadata,
            ..UrlRecord::default()
        };
        assert_eq!(carrier[1..], record.encode());
        assert_eq!(UrlRecord::decode(&carrier[1..]).unwrap(), record);
    }

    /// A typical URL is stored without its scheme and host, which its
    /// queue's name holds.
    #[test]
    fn an_entry_leaves_out_the_scheme_and_queue_key() {
        let mut value = Vec::new();
        let url = "https://www.example.com/a/page.html";
        StoredEntry::encode(url, 3, &typical(), &mut value);
        // version and form, queue number, the rest with its length, the
        // creation date in five bytes, due then in one, depth, no metadata
        assert_eq!(value.len(), 2 + 1 + "/a/page.html".len() + 5 + 1 + 1 + 1);
        let entry = &StoredEntry::decode_all(&value).unwrap()[0];
        assert_eq!(entry.url("www.example.com"), url);
        assert!(StoredEntry::decode_all(&[]).is_err());
        // Version 3 spent a byte on the form and five on the due date.
        let mut version_3 = Vec::new();
        StoredEntry::encode_version_3(url, 3, &typical(), &mut version_3);
        assert_eq!(version_3.len() - value.len(), 5);
        let old = &StoredEntry::decode_all(&version_3).unwrap()[0];
        assert_eq!(old.url("www.example.com"), url);
        assert_eq!(old.record("www.example.com".to_owned()).unwrap(), typical());
    }

    /// Every due date reads back, in the one code written for it: the
    /// completed mark, the distance from the creation date, or the date
    /// whole when it falls before the creation date.
    #[test]
    fn due_dates_take_the_code_written_for_them() {
        let cases = [
            (1_764_000_000, 0, DUE_COMPLETED),
            (1_764_000_000, 1_764_000_000, DUE_AFTER_CREATED),
            (1_764_000_000, 1_764_086_400, DUE_AFTER_CREATED + 86_400),
            (1_764_000_000, 5, DUE_WHOLE),
            (0, u64::MAX - 2, u64::MAX),
            (0, u64::MAX, DUE_WHOLE),
            (u64::MAX, u64::MAX, DUE_AFTER_CREATED),
        ];
        for (created_at, due_at, code) in cases {
            assert_eq!(
                due_code(created_at, due_at).0,
                code,
                "{created_at} {due_at}"
            );
            let record = UrlRecord {
                created_at,
                due_at,
                ..typical()
            };
            let mut value = Vec::new();
            StoredEntry::encode("https://www.example.com/", 1, &record, &mut value);
            let entry = &StoredEntry::decode_all(&value).unwrap()[0];
            assert_eq!((entry.created_at, entry.due_at), (created_at, due_at));
        }
        // A code that reads as a date it is not written for is refused:
        // a whole date the distance could say, a distance to date 0, a
        // distance past the largest date.
        let entry = |created_at: u64, code: u64, whole: Option<u64>| {
            let mut bytes = vec![ENTRY_VERSION_4, 1, 0];
            put_varint(&mut bytes, created_at);
            put_varint(&mut bytes, code);
            if let Some(due_at) = whole {
                put_varint(&mut bytes, due_at);
            }
            bytes.extend_from_slice(&[0, 0]);
            StoredEntry::decode_all(&bytes).map(|entries| entries[0].due_at)
        };
        assert_eq!(entry(10, DUE_WHOLE, Some(5)), Ok(5));
        assert_eq!(entry(10, DUE_WHOLE, Some(12)), Err(RecordError::BadNumber));
        assert_eq!(entry(10, DUE_WHOLE, Some(0)), Err(RecordError::BadNumber));
        assert_eq!(
            entry(0, DUE_AFTER_CREATED, None),
            Err(RecordError::BadNumber)
        );
        assert_eq!(
            entry(u64::MAX, DUE_AFTER_CREATED + 1, None),
            Err(RecordError::BadNumber)
        );
        // A form beyond the three is no version this build knows.
        assert_eq!(
            StoredEntry::decode_all(&[ENTRY_VERSION_4 + 3]),
            Err(RecordError::UnknownVersion(ENTRY_VERSION_4 + 3))
        );
    }

    /// Metadata kept compact decodes to what was encoded, an entry's empty
    /// metadata keeps nothing, and extra bytes are refused.
    #[test]
    fn compact_metadata_round_trips() {
        let metadata: BTreeMap<String, Vec<String>> = [
            ("a".to_owned(), vec!["1".to_owned(), String::new()]),
            ("b".to_owned(), vec![]),
        ]
        .into();
        let kept = CompactMetadata::of(&metadata);
        assert_eq!(kept.decode().unwrap(), metadata);
        assert_eq!(
            CompactMetadata::of(&BTreeMap::new()),
            CompactMetadata::default()
        );
        assert_eq!(
            CompactMetadata::from_bytes(&[0]),
            CompactMetadata::default()
        );
        assert_eq!(
            CompactMetadata::default().decode().unwrap(),
            BTreeMap::new()
        );
        let mut longer = kept.0.to_vec();
        longer.push(0);
        assert_eq!(
            CompactMetadata::from_bytes(&longer).decode(),
            Err(RecordError::TrailingBytes(1))
        );
    }

    /// Found by the `record` fuzz target: a record whose metadata repeated
    /// one key decoded to a record that encoded differently.
    #[test]
    fn regression_repeated_metadata_keys_are_refused() {
        let mut bytes = UrlRecord::default().encode_version_1();
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
        let mut bytes = UrlRecord::default().encode_version_1();
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&1_u32.to_le_bytes());
        bytes.extend_from_slice(&0_u32.to_le_bytes()); // key ""
        bytes.extend_from_slice(&u32::MAX.to_le_bytes()); // 4 billion values
        assert_eq!(UrlRecord::decode(&bytes), Err(RecordError::Truncated));
        assert_eq!(UrlRecord::decode(&[9]), Err(RecordError::UnknownVersion(9)));
        assert_eq!(UrlRecord::decode(&[]), Err(RecordError::Truncated));
    }

    fn typical() -> UrlRecord {
        UrlRecord {
            created_at: 1_764_000_000,
            due_at: 1_764_000_000,
            depth: 3,
            queue_key: "www.example.com".to_owned(),
            metadata: BTreeMap::new(),
        }
    }

    #[test]
    fn version_2_is_15_bytes_shorter_for_a_typical_record() {
        let record = typical();
        assert_eq!(record.encode_version_1().len() - record.encode().len(), 15);
    }

    #[test]
    fn a_number_longer_than_its_shortest_form_is_refused() {
        // depth 3 written in two bytes instead of one
        let mut bytes = vec![2];
        put_varint(&mut bytes, 1);
        put_varint(&mut bytes, 0);
        bytes.extend_from_slice(&[0x83, 0x00]);
        bytes.extend_from_slice(&[0, 0]); // queue "", no metadata
        assert_eq!(UrlRecord::decode(&bytes), Err(RecordError::BadNumber));
        // eleven bytes, and a tenth byte beyond a u64
        let mut bytes = vec![2];
        bytes.extend_from_slice(&[0xff; 9]);
        bytes.push(0x02);
        assert_eq!(UrlRecord::decode(&bytes), Err(RecordError::BadNumber));
        // a depth beyond u32
        let mut bytes = vec![2, 0, 0];
        put_varint(&mut bytes, u64::from(u32::MAX) + 1);
        bytes.extend_from_slice(&[0, 0]);
        assert_eq!(UrlRecord::decode(&bytes), Err(RecordError::BadNumber));
    }

    #[test]
    fn the_largest_numbers_round_trip() {
        let record = UrlRecord {
            created_at: u64::MAX,
            due_at: u64::MAX,
            depth: u32::MAX,
            ..typical()
        };
        assert_eq!(UrlRecord::decode(&record.encode()), Ok(record));
    }
}
