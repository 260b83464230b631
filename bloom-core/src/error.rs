//! Typed errors, one enum per family of operations.

/// Building or combining filters with parameters that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// Sizing needs at least one expected item.
    #[error("expected items must be at least 1")]
    ZeroExpectedItems,
    /// The false-positive rate must lie strictly between 0 and 1.
    #[error("false-positive rate must be in (0, 1), got {0}")]
    InvalidFpRate(f64),
    /// A filter needs at least one bit.
    #[error("a filter needs at least one bit")]
    ZeroBits,
    /// Beyond [`crate::MAX_BITS`].
    #[error(
        "{bits} bits is more than the supported maximum of {}",
        crate::MAX_BITS
    )]
    TooLarge {
        /// The size asked for.
        bits: u64,
    },
    /// The hash count must be in `1..=MAX_HASHES`.
    #[error("hash count must be between 1 and {max}, got {0}", max = crate::MAX_HASHES)]
    InvalidHashes(u32),
    /// The split-block layout sets the same number of bits in each of a
    /// block's eight words, so its hash count is a multiple of 8.
    #[error("a split-block filter's hash count must be a multiple of 8, got {0}")]
    SplitBlockHashes(u32),
    /// A layout name other than `standard`, `blocked` or `split-block`.
    #[error("unknown filter layout {0:?}: expected standard, blocked or split-block")]
    UnknownLayout(String),
    /// Two filters must share layout, size and hash count to be combined.
    #[error("filters differ in layout, size or hash count")]
    ShapeMismatch,
    /// A partition index past the set's end.
    #[error("partition {partition} does not exist (the set has {partitions})")]
    NoSuchPartition {
        /// The index asked for.
        partition: usize,
        /// How many partitions there are.
        partitions: usize,
    },
    /// A set needs at least one partition.
    #[error("a partitioned set needs at least one partition")]
    ZeroPartitions,
    /// One rebuild per partition at a time.
    #[error("partition {0} is already being rebuilt")]
    AlreadyRebuilding(usize),
}

/// Reading a snapshot that is truncated, corrupt or not meant for this
/// filter type or hash. Never a panic, never a silently wrong filter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The underlying reader or writer failed.
    #[error("snapshot I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The input ended before the snapshot did.
    #[error("snapshot is truncated")]
    Truncated,
    /// The input does not start with the snapshot magic.
    #[error("not a bloom-core snapshot (bad magic)")]
    BadMagic,
    /// Written by a format version this build does not read.
    #[error("snapshot format version {0} is not supported (this build reads version {supported})", supported = crate::format::FORMAT_VERSION)]
    UnsupportedVersion(u16),
    /// A snapshot of another filter type (e.g. a counting filter read as a
    /// plain one).
    #[error("snapshot holds a {found} filter, expected a {expected} filter")]
    KindMismatch {
        /// The kind the caller asked for.
        expected: &'static str,
        /// The kind the snapshot holds.
        found: &'static str,
    },
    /// The layout code is unknown.
    #[error("unknown layout code {0}")]
    UnknownLayout(u8),
    /// Written with another hash function or seed: its bits mean nothing
    /// under ours.
    #[error(
        "snapshot was written with hash id {id} seed {seed:#x}; this build uses hash id {} seed {:#x}",
        crate::HASH_ID,
        crate::HASH_SEED
    )]
    HashMismatch {
        /// The hash identity in the snapshot.
        id: u8,
        /// The seed in the snapshot.
        seed: u64,
    },
    /// The header's parameters are impossible or inconsistent.
    #[error("snapshot header is invalid: {0}")]
    InvalidHeader(String),
    /// The checksum does not match the content.
    #[error("snapshot checksum mismatch (stored {stored:#018x}, computed {computed:#018x})")]
    ChecksumMismatch {
        /// The checksum the snapshot carries.
        stored: u64,
        /// The checksum of what was read.
        computed: u64,
    },
    /// Bytes follow the end of the snapshot.
    #[error("{0} unexpected bytes after the end of the snapshot")]
    TrailingBytes(usize),
}

/// Removing from a counting filter a key that is certainly absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoveError {
    /// At least one of the key's counters is zero: the key was never
    /// inserted (or already removed as often as inserted).
    #[error("key is not in the filter")]
    NotPresent,
}
