//! [`BloomFilter`]: one bit array of atomic words in any layout.

use crate::accel;
use crate::bits::{BitArray, LinesMut};
use crate::error::{FilterError, SnapshotError};
use crate::hash::KeyHash;
use crate::health::FilterHealth;
use crate::kernels::Kernels;
pub use crate::layout::Layout;
use crate::model::{self, BLOCK_BITS, MAX_HASHES, SPLIT_WORDS};
use crate::probe::{self, Shape};
use crate::snapshot::{self, Header, Kind};
use crate::sync::{AtomicU64, Ordering};

/// Larger filters are refused: 2^46 bits is 8 TiB, beyond any machine this
/// runs on, and the bound keeps a corrupt snapshot header from asking for an
/// absurd allocation.
pub const MAX_BITS: u64 = 1 << 46;

/// A Bloom filter whose every method takes `&self`: inserts and queries from
/// any number of threads proceed without locks, on atomic words.
///
/// # What `insert`'s answer guarantees
///
/// [`insert`](Self::insert) returns `true` when this call found at least one
/// of the key's bits unset and set it (a plain load finds it unset, a locked
/// OR sets it). Hence:
///
/// - One thread: `true` means the key was certainly not in the filter before
///   (not inserted, and not a false positive); `false` means it was already
///   reported present.
/// - Several threads inserting the same key at once, which was absent
///   (`contains` was false) before they started: at least one of them gets
///   `true` (whichever first sets a bit that was unset loaded it unset), but
///   possibly more than one, since each may find a bit unset before another
///   sets it. `true` therefore does not elect a unique first inserter;
///   a caller that needs exactly one winner must serialise inserts of a key
///   (the frontier does so per partition). `false` still always means every
///   bit was set when this call looked.
///
/// # Example
///
/// ```
/// use bloom_core::BloomFilter;
///
/// let filter = BloomFilter::new(1_000, 0.01)?;
/// assert!(filter.insert(b"https://example.com/"));
/// assert!(!filter.insert(b"https://example.com/"));
/// assert!(filter.contains(b"https://example.com/"));
/// assert!(filter.estimated_fp_rate() < 0.01);
/// # Ok::<(), bloom_core::FilterError>(())
/// ```
pub struct BloomFilter {
    shape: Shape,
    array: BitArray,
    /// The probe functions for this shape and CPU.
    kernels: Kernels,
}

impl std::fmt::Debug for BloomFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BloomFilter")
            .field("layout", &self.shape.layout)
            .field("bits", &self.shape.bits)
            .field("hashes", &self.shape.hashes)
            .field("ones", &self.ones())
            .finish()
    }
}

impl BloomFilter {
    /// A standard-layout filter for `expected_items` keys at false-positive
    /// rate `fp_rate`: `m = -n ln p / (ln 2)^2` bits (rounded up to whole
    /// 512-bit blocks) and `k = round((m/n) ln 2)` hashes.
    pub fn new(expected_items: u64, fp_rate: f64) -> Result<Self, FilterError> {
        Self::with_layout(Layout::Standard, expected_items, fp_rate)
    }

    /// A filter of the given layout sized for `expected_items` keys at
    /// `fp_rate`. The blocked layout gets the smallest size its model says
    /// meets the rate, which is larger than the standard size.
    pub fn with_layout(
        layout: Layout,
        expected_items: u64,
        fp_rate: f64,
    ) -> Result<Self, FilterError> {
        if expected_items == 0 {
            return Err(FilterError::ZeroExpectedItems);
        }
        if !(fp_rate > 0.0 && fp_rate < 1.0) {
            return Err(FilterError::InvalidFpRate(fp_rate));
        }
        let (bits, hashes) = match layout {
            Layout::Standard => {
                let bits = model::optimal_bits(expected_items, fp_rate).ceil();
                if bits > MAX_BITS as f64 {
                    return Err(FilterError::TooLarge { bits: bits as u64 });
                }
                let bits = round_up_to_block(bits as u64);
                (bits, model::optimal_hashes(bits, expected_items))
            }
            Layout::Blocked => {
                if model::optimal_bits(expected_items, fp_rate) > MAX_BITS as f64 {
                    return Err(FilterError::TooLarge { bits: MAX_BITS });
                }
                model::blocked_size(expected_items, fp_rate)
            }
            Layout::SplitBlock => model::split_block_size(expected_items, fp_rate, MAX_BITS)
                .ok_or(FilterError::TooLarge { bits: MAX_BITS })?,
            Layout::SplitBlock256 => model::split_block_256_size(expected_items, fp_rate, MAX_BITS)
                .ok_or(FilterError::TooLarge { bits: MAX_BITS })?,
        };
        Self::with_params(layout, bits, hashes)
    }

    /// A filter with explicit parameters. `bits` is rounded up to a whole
    /// number of 512-bit blocks; [`bits`](Self::bits) reports the result.
    pub fn with_params(layout: Layout, bits: u64, hashes: u32) -> Result<Self, FilterError> {
        if bits == 0 {
            return Err(FilterError::ZeroBits);
        }
        if bits > MAX_BITS {
            return Err(FilterError::TooLarge { bits });
        }
        if hashes == 0 || hashes > MAX_HASHES {
            return Err(FilterError::InvalidHashes(hashes));
        }
        if layout.is_split() && !hashes.is_multiple_of(SPLIT_WORDS) {
            return Err(FilterError::SplitBlockHashes(hashes));
        }
        let bits = round_up_to_block(bits);
        let shape = Shape {
            layout,
            bits,
            hashes,
        };
        Ok(Self {
            shape,
            array: BitArray::zeroed((bits / 64) as usize),
            kernels: Kernels::for_shape(shape),
        })
    }

    /// Reassembles a filter from its words (little-endian bit order within a
    /// word, words in array order), as snapshots store them.
    pub(crate) fn from_words(
        layout: Layout,
        bits: u64,
        hashes: u32,
        words: &[u64],
    ) -> Result<Self, FilterError> {
        let filter = Self::with_params(layout, bits, hashes)?;
        if filter.shape.bits != bits || words.len() as u64 != bits / 64 {
            return Err(FilterError::ShapeMismatch);
        }
        for (slot, &word) in filter.words().zip(words) {
            slot.store(word, Ordering::Relaxed);
        }
        Ok(filter)
    }

    /// Inserts a key; `true` when it was certainly new (see the type's docs
    /// for what that means under concurrency).
    #[inline]
    pub fn insert(&self, key: &[u8]) -> bool {
        self.insert_hashed(KeyHash::of(key))
    }

    /// Whether the key may have been inserted: `false` is certain, `true` is
    /// wrong with the filter's false-positive probability.
    #[inline]
    #[must_use]
    pub fn contains(&self, key: &[u8]) -> bool {
        self.contains_hashed(KeyHash::of(key))
    }

    /// [`insert`](Self::insert) with a hash computed once by the caller.
    #[inline]
    pub fn insert_hashed(&self, hash: KeyHash) -> bool {
        self.kernels
            .insert_shared(&self.shape, self.array.lines(), hash)
    }

    /// [`insert`](Self::insert) for a caller with exclusive access, e.g. one
    /// building a filter before sharing it. The same bits and answer, without
    /// the locked read-modify-write instructions shared access needs
    /// (split-block with k = 8 on an AVX2 CPU: two vector
    /// read-modify-writes; BENCHMARKS.md, "bloom-core against peer filter
    /// crates", has the figures).
    #[inline]
    pub fn insert_mut(&mut self, key: &[u8]) -> bool {
        self.insert_hashed_mut(KeyHash::of(key))
    }

    /// [`insert_mut`](Self::insert_mut) with a precomputed hash.
    #[inline]
    pub fn insert_hashed_mut(&mut self, hash: KeyHash) -> bool {
        self.kernels
            .insert_exclusive(&self.shape, self.array.lines_mut(), hash)
    }

    /// [`contains`](Self::contains) with a hash computed once by the caller.
    #[inline]
    #[must_use]
    pub fn contains_hashed(&self, hash: KeyHash) -> bool {
        self.kernels.contains(&self.shape, self.array.lines(), hash)
    }

    /// Queries many hashes at once, writing one answer per hash into `out`
    /// (cleared first).
    ///
    /// Looking keys up one by one leaves the memory system idle while each
    /// probe's cache miss is served. Here the cache line of a key a fixed
    /// distance ahead is prefetched while the current key is answered, so
    /// the misses of upcoming keys overlap the current key's arithmetic.
    /// Standard layout: the lines of the first two probes (an absent key is
    /// usually refuted by them); blocked layout: the key's one line.
    pub fn contains_batch_into(&self, hashes: &[KeyHash], out: &mut Vec<bool>) {
        // The probe inline rather than a kernel call per key: the loop
        // overlaps the keys' misses through prefetching, not through the
        // instruction window.
        accel::contains_batch_shared(
            self.shape,
            self.array.lines(),
            hashes,
            out,
            accel::available(),
        );
    }

    /// Inserts many hashes, one answer per hash into `out` (cleared first),
    /// each the answer [`insert_hashed`](Self::insert_hashed) gives.
    ///
    /// The lines of the key some places ahead are prefetched while the
    /// current key is inserted, so the cache misses of many keys overlap (a
    /// locked write, which a shared insert takes, otherwise waits out its
    /// miss before the next key starts). A filter that fits in the caches
    /// has no misses to overlap and gains little (BENCHMARKS.md, "Batch
    /// queries and inserts").
    pub fn insert_batch_into(&self, hashes: &[KeyHash], out: &mut Vec<bool>) {
        let (shape, kernels) = (self.shape, self.kernels);
        probe::insert_batch(
            shape,
            &mut self.array.lines(),
            hashes,
            out,
            |lines| *lines,
            |lines, hash| kernels.insert_shared(&shape, *lines, hash),
        );
    }

    /// [`insert_batch_into`](Self::insert_batch_into) with exclusive
    /// access: the answers of [`insert_hashed_mut`](Self::insert_hashed_mut).
    /// Out of cache it is several times the one-by-one `insert_hashed_mut`
    /// (BENCHMARKS.md, "Batch queries and inserts"); in cache it costs more
    /// than it saves (each key's lines are computed twice), so it is for
    /// filters larger than the caches.
    pub fn insert_batch_mut_into(&mut self, hashes: &[KeyHash], out: &mut Vec<bool>) {
        let (shape, kernels) = (self.shape, self.kernels);
        probe::insert_batch(
            shape,
            &mut self.array.lines_mut(),
            hashes,
            out,
            LinesMut::as_lines,
            |lines, hash| kernels.insert_exclusive(&shape, lines.reborrow(), hash),
        );
    }

    /// Adds every key of `other` to `self`. Both must have the same layout,
    /// size and hash count. Safe to run while other threads insert and query.
    pub fn union_with(&self, other: &BloomFilter) -> Result<(), FilterError> {
        if self.shape != other.shape {
            return Err(FilterError::ShapeMismatch);
        }
        for (mine, theirs) in self.words().zip(other.words()) {
            let incoming = theirs.load(Ordering::Relaxed);
            if incoming & !mine.load(Ordering::Relaxed) != 0 {
                mine.fetch_or(incoming, Ordering::Relaxed);
            }
        }
        Ok(())
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

    /// Bits set to 1, counted exactly by one pass over the array (a
    /// population count, a small fraction of a millisecond per megabyte).
    /// Not kept as a running
    /// counter: that would add a shared locked increment to every insert of
    /// a new key, a cost paid millions of times to save one paid per health
    /// report. Under concurrent inserts the count lies between the counts
    /// before and after the pass.
    #[must_use]
    pub fn ones(&self) -> u64 {
        probe::ones(self.array.lines())
    }

    /// Fraction of bits set.
    #[must_use]
    pub fn fill_ratio(&self) -> f64 {
        self.ones() as f64 / self.shape.bits as f64
    }

    /// The probability that a key never inserted is reported present, given
    /// the bits as they are now. Standard layout: `fill^k`. Blocked layout:
    /// the mean over blocks of `(ones in block / 512)^k`; split-block layout:
    /// the mean over blocks of the product over its words of
    /// `(ones in word / 64)^(k/8)`. Both cost one pass over the array and are
    /// exact for the current state.
    #[must_use]
    pub fn estimated_fp_rate(&self) -> f64 {
        self.ones_and_fp_rate().1
    }

    fn ones_and_fp_rate(&self) -> (u64, f64) {
        probe::ones_and_fp_rate(self.shape, self.array.lines())
    }

    /// Distinct keys inserted, estimated from the fill ratio.
    ///
    /// Standard layout: the inverse of `E[ones] = m (1 - (1 - 1/m)^(kn))`,
    /// i.e. about `-(m/k) ln(1 - ones/m)`. Blocked layout: keys per block are
    /// Poisson(λ) and a key sets a given bit of its block with probability
    /// `q = 1 - (1 - 1/512)^k`, so `E[fill] = 1 - e^(-λq)` and
    /// `n = -B ln(1 - fill) / q`. Split-block layout: the same with
    /// `q = 1 - (1 - 1/64)^(k/8)` (a key sets k/8 bits of each 64-bit word).
    #[must_use]
    pub fn estimated_items(&self) -> f64 {
        self.items_from_ones(self.ones())
    }

    fn items_from_ones(&self, ones: u64) -> f64 {
        probe::items_from_ones(self.shape, ones)
    }

    /// Heap and inline bytes this filter occupies.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        (self.array.memory_bytes() + std::mem::size_of::<Self>()) as u64
    }

    /// Every health figure at once.
    #[must_use]
    pub fn health(&self) -> FilterHealth {
        probe::health(self.shape, self.array.lines(), self.memory_bytes())
    }

    /// The filter's shape and its words as plain ones, taken over without
    /// copying (freezing).
    #[cfg(not(bloom_loom))]
    pub(crate) fn into_parts(self) -> (Shape, BitArray<u64>) {
        (self.shape, self.array.convert(AtomicU64::into_inner))
    }

    /// A filter over the words of a frozen one.
    #[cfg(not(bloom_loom))]
    pub(crate) fn from_parts(shape: Shape, array: BitArray) -> Self {
        Self {
            shape,
            array,
            kernels: Kernels::for_shape(shape),
        }
    }

    /// The false-positive rate the layout's model predicts after `items`
    /// distinct keys (see [`crate::model`]).
    #[must_use]
    pub fn model_fp_rate(&self, items: u64) -> f64 {
        probe::model_fp_rate(self.shape, items)
    }

    /// Whether `other` has the same layout, size and hash count.
    #[must_use]
    pub fn same_shape(&self, other: &BloomFilter) -> bool {
        self.shape == other.shape
    }

    pub(crate) fn words(&self) -> impl Iterator<Item = &AtomicU64> {
        self.array.words().iter()
    }
}

pub(crate) fn round_up_to_block(bits: u64) -> u64 {
    bits.div_ceil(BLOCK_BITS).max(1) * BLOCK_BITS
}

/// Snapshots: see [`crate::snapshot`] for the format.
impl BloomFilter {
    /// Writes a snapshot. Concurrent inserts may go on; the snapshot then
    /// holds every key whose insert returned before this call began, and
    /// possibly some later ones (whole or partly: a caller that needs them
    /// must replay keys inserted after the snapshot started).
    pub fn write_snapshot(&self, writer: impl std::io::Write) -> Result<(), SnapshotError> {
        snapshot::write(
            writer,
            self.snapshot_header(),
            self.words().map(|word| word.load(Ordering::Relaxed)),
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

    /// Reads a snapshot written by [`write_snapshot`](Self::write_snapshot).
    pub fn read_snapshot(reader: impl std::io::Read) -> Result<Self, SnapshotError> {
        let (header, words) = snapshot::read(reader, Kind::Bloom, check_bloom_shape)?;
        Self::from_snapshot_parts(header, &words)
    }

    /// Reads a snapshot from bytes; bytes after its end are an error.
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let (header, words) = snapshot::read_bytes(bytes, Kind::Bloom, check_bloom_shape)?;
        Self::from_snapshot_parts(header, &words)
    }

    fn from_snapshot_parts(header: Header, words: &[u64]) -> Result<Self, SnapshotError> {
        Self::from_words(header.layout, header.bits, header.hashes, words)
            .map_err(|error| SnapshotError::InvalidHeader(error.to_string()))
    }

    fn snapshot_header(&self) -> Header {
        snapshot_header(self.shape)
    }
}

pub(crate) fn snapshot_header(shape: Shape) -> Header {
    Header {
        kind: Kind::Bloom,
        layout: shape.layout,
        bits: shape.bits,
        hashes: shape.hashes,
        words: shape.bits / 64,
    }
}

fn check_bloom_shape(header: &Header) -> Result<(), String> {
    if header.bits == 0 || !header.bits.is_multiple_of(BLOCK_BITS) || header.bits > MAX_BITS {
        return Err(format!(
            "{} bits is not a whole number of 512-bit blocks up to {MAX_BITS}",
            header.bits
        ));
    }
    if header.hashes == 0 || header.hashes > MAX_HASHES {
        return Err(format!(
            "hash count {} is outside 1..={MAX_HASHES}",
            header.hashes
        ));
    }
    if header.layout.is_split() && !header.hashes.is_multiple_of(SPLIT_WORDS) {
        return Err(format!(
            "hash count {} of a split-block filter is not a multiple of {SPLIT_WORDS}",
            header.hashes
        ));
    }
    if header.words != header.bits / 64 {
        return Err(format!(
            "{} words do not hold {} bits",
            header.words, header.bits
        ));
    }
    Ok(())
}
