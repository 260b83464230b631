//! [`FrozenBloomFilter`]: a filter that takes no more inserts, over plain
//! words, for the fastest queries.

use crate::accel;
use crate::bits::BitArray;
use crate::error::SnapshotError;
use crate::filter::{BloomFilter, snapshot_header};
use crate::hash::KeyHash;
use crate::health::FilterHealth;
use crate::kernels::Kernels;
use crate::layout::Layout;
use crate::probe::{self, Shape};
use crate::snapshot;

/// A Bloom filter frozen from a [`BloomFilter`] (or read from its
/// snapshot): queries only, from any number of threads, with the same
/// answers the filter gave when frozen.
///
/// Why it exists: the concurrent filter must read its words with atomic
/// loads, which compilers never combine into vector loads. Over plain
/// words, on CPUs with AVX2 and BMI2 (checked at run time), a split-block
/// query is a few vector instructions and every layout's shifts are
/// cheaper (a live filter builds the same masks with vector shifts but
/// reads its words one atomic load each, so a frozen query executes fewer
/// instructions: BENCHMARKS.md, "Instructions a key"). Use it for a set that
/// is built and then only read: a finished crawl's seen-set handed to
/// another process, a block list, a snapshot being inspected.
/// [`thaw`](Self::thaw) turns it back into a filter that takes inserts,
/// without copying.
///
/// # Example
///
/// ```
/// use bloom_core::{BloomFilter, Layout};
///
/// let filter = BloomFilter::with_layout(Layout::SplitBlock, 1_000, 0.01)?;
/// filter.insert(b"https://example.com/");
/// let frozen = filter.freeze();
/// assert!(frozen.contains(b"https://example.com/"));
/// let filter = frozen.thaw();
/// assert!(!filter.insert(b"https://example.com/"));
/// # Ok::<(), bloom_core::FilterError>(())
/// ```
pub struct FrozenBloomFilter {
    shape: Shape,
    array: BitArray<u64>,
    /// Whether batches run the AVX2/BMI2 code.
    accelerated: bool,
    /// The probe functions for this shape and CPU.
    kernels: Kernels,
}

impl std::fmt::Debug for FrozenBloomFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrozenBloomFilter")
            .field("layout", &self.shape.layout)
            .field("bits", &self.shape.bits)
            .field("hashes", &self.shape.hashes)
            .field("accelerated", &self.accelerated)
            .finish()
    }
}

impl BloomFilter {
    /// This filter as a [`FrozenBloomFilter`]: no more inserts, faster
    /// queries. Takes the words over without copying them.
    #[must_use]
    pub fn freeze(self) -> FrozenBloomFilter {
        let (shape, words) = self.into_parts();
        FrozenBloomFilter::from_parts(shape, words)
    }
}

impl FrozenBloomFilter {
    pub(crate) fn from_parts(shape: Shape, array: BitArray<u64>) -> Self {
        Self {
            shape,
            array,
            accelerated: accel::available(),
            kernels: Kernels::for_shape(shape),
        }
    }

    /// Back to a filter that takes inserts, over the same words.
    #[must_use]
    pub fn thaw(self) -> BloomFilter {
        BloomFilter::from_parts(self.shape, self.array.convert(crate::sync::AtomicU64::new))
    }

    /// Whether the key may have been inserted: `false` is certain.
    #[inline]
    #[must_use]
    pub fn contains(&self, key: &[u8]) -> bool {
        self.contains_hashed(KeyHash::of(key))
    }

    /// [`contains`](Self::contains) with a hash computed once by the caller.
    #[inline]
    #[must_use]
    pub fn contains_hashed(&self, hash: KeyHash) -> bool {
        self.kernels
            .contains_plain(&self.shape, self.array.lines(), hash)
    }

    /// Queries many hashes at once, prefetching ahead as
    /// [`BloomFilter::contains_batch_into`] does; one answer per hash into
    /// `out` (cleared first).
    pub fn contains_batch_into(&self, hashes: &[KeyHash], out: &mut Vec<bool>) {
        accel::contains_batch(self.shape, &self.array, hashes, out, self.accelerated);
    }

    /// Whether queries run the AVX2/BMI2 code (this CPU has both).
    #[must_use]
    pub fn accelerated(&self) -> bool {
        self.accelerated
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> Layout {
        self.shape.layout
    }

    /// Size of the bit array (m).
    #[must_use]
    pub fn bits(&self) -> u64 {
        self.shape.bits
    }

    /// Bits set per key (k).
    #[must_use]
    pub fn hashes(&self) -> u32 {
        self.shape.hashes
    }

    /// Bits set to 1, counted exactly.
    #[must_use]
    pub fn ones(&self) -> u64 {
        probe::ones(self.array.lines())
    }

    /// Every health figure at once, as [`BloomFilter::health`] defines them.
    #[must_use]
    pub fn health(&self) -> FilterHealth {
        probe::health(self.shape, self.array.lines(), self.memory_bytes())
    }

    /// The false-positive rate the layout's model predicts after `items`
    /// distinct keys.
    #[must_use]
    pub fn model_fp_rate(&self, items: u64) -> f64 {
        probe::model_fp_rate(self.shape, items)
    }

    /// Heap and inline bytes this filter occupies.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        (self.array.memory_bytes() + std::mem::size_of::<Self>()) as u64
    }

    /// Writes a snapshot, byte for byte the one the filter it was frozen
    /// from writes.
    pub fn write_snapshot(&self, writer: impl std::io::Write) -> Result<(), SnapshotError> {
        snapshot::write(
            writer,
            snapshot_header(self.shape),
            self.array.words().iter().copied(),
        )
    }

    /// The snapshot as bytes.
    #[must_use]
    pub fn to_snapshot_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(snapshot::snapshot_len(self.shape.bits / 64) as usize);
        // Writing to a Vec cannot fail.
        let _ = self.write_snapshot(&mut out);
        out
    }

    /// Reads a [`BloomFilter`] snapshot, frozen.
    pub fn read_snapshot(reader: impl std::io::Read) -> Result<Self, SnapshotError> {
        BloomFilter::read_snapshot(reader).map(BloomFilter::freeze)
    }

    /// Reads a [`BloomFilter`] snapshot from bytes, frozen.
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        BloomFilter::from_snapshot_bytes(bytes).map(BloomFilter::freeze)
    }
}
