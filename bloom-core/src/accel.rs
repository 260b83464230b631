//! The probe code compiled a second time for CPUs with AVX2 and BMI2, and
//! chosen at run time (the crate is built for the x86-64 baseline, which
//! has neither).
//!
//! Split-block filters get kernels of their own, which `kernels` hands out
//! per filter. Over a frozen filter's plain words a query is two 256-bit
//! loads of the key's line and a few vector shifts; an exclusive insert is
//! two 256-bit read-modify-writes. Over a live filter's atomic words the
//! words are read one relaxed atomic load each (a vector load of words
//! other threads may be writing would be a data race), but the key's masks
//! still come from a few vector shifts instead of a few scalar instructions
//! a bit, less than half the instructions of a split-block-256 query
//! (BENCHMARKS.md, "Instructions a key"), and the same for shared inserts. Batch queries compile every layout's probe
//! here, so that its variable shifts take one instruction instead of three,
//! and inline the split-block kernels.
//!
//! `unsafe` here (besides the prefetch hint in `sync` and, in `kernels`,
//! the calls through each filter's pointers and the standard layout's
//! unchecked word index): each call of a `#[target_feature]` function
//! (sound only on a CPU that has the features, which [`available`]
//! checked), the vector loads and stores of one block, addressed by
//! pointer, and the store of a mask vector into a local array of words;
//! each block says why it is sound.

#[cfg(not(bloom_loom))]
use crate::bits::BitArray;
use crate::bits::Lines;
use crate::hash::KeyHash;
#[cfg(not(bloom_loom))]
use crate::kernels::{Contains, InsertExclusive, InsertShared, Kernels};
use crate::probe::{self, Shape};
use crate::sync::AtomicU64;

/// Whether this CPU runs the accelerated code (answered from the standard
/// library's cached CPUID reading).
#[inline]
pub(crate) fn available() -> bool {
    #[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("bmi2")
    }
    #[cfg(not(all(target_arch = "x86_64", not(bloom_loom))))]
    {
        false
    }
}

/// A split-block filter's vector kernels: its queries over atomic and over
/// plain words, and its shared and exclusive inserts.
#[cfg(not(bloom_loom))]
pub(crate) struct SplitKernels {
    pub(crate) contains: Contains<AtomicU64>,
    pub(crate) contains_plain: Contains<u64>,
    pub(crate) insert_shared: InsertShared,
    pub(crate) insert_exclusive: InsertExclusive,
}

/// The split-block kernels for `shape` when this CPU runs the vector code.
#[cfg(not(bloom_loom))]
pub(crate) fn split_kernels(shape: Shape) -> Option<SplitKernels> {
    if !shape.layout.is_split() || !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! by_streams {
            ($shared:ident $contains:ident $insert_shared:ident $insert:ident $($streams:literal)*) => {
                match shape.hashes / crate::model::SPLIT_WORDS {
                    $($streams => Some(SplitKernels {
                        contains: x86::$shared::<$streams>,
                        contains_plain: x86::$contains::<$streams>,
                        insert_shared: x86::$insert_shared::<$streams>,
                        insert_exclusive: x86::$insert::<$streams>,
                    }),)*
                    _ => None,
                }
            };
        }
        if shape.layout == crate::Layout::SplitBlock256 {
            by_streams!(contains_split_256_shared contains_split_256 insert_split_256_shared insert_split_256 1 2 3 4 5 6 7 8)
        } else {
            by_streams!(contains_split_shared contains_split insert_split_shared insert_split 1 2 3 4 5 6 7 8)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The standard layout's kernels with `K` hashes compiled for BMI2
/// (flag-free multiplies and shifts with free choice of registers: two
/// instructions a probe fewer), when this CPU has it.
#[cfg(not(bloom_loom))]
pub(crate) fn standard_kernels<const K: u32>() -> Option<Kernels> {
    if !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        Some(Kernels {
            contains: x86::contains_standard::<K, crate::sync::AtomicU64>,
            contains_plain: x86::contains_standard::<K, u64>,
            insert_shared: x86::insert_standard_shared::<K>,
            insert_exclusive: crate::kernels::insert_exclusive,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Answers a batch over plain words; `accelerated` must come from
/// [`available`].
#[cfg(not(bloom_loom))]
pub(crate) fn contains_batch(
    shape: Shape,
    array: &BitArray<u64>,
    hashes: &[KeyHash],
    out: &mut Vec<bool>,
    accelerated: bool,
) {
    #[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
    if accelerated {
        #[allow(unsafe_code)]
        // SAFETY: `accelerated` is `available()`: this CPU has AVX2 and BMI2.
        unsafe {
            return x86::contains_batch(shape, array.lines(), hashes, out);
        }
    }
    let _ = accelerated;
    let lines = array.lines();
    probe::contains_batch(shape, lines, hashes, out, |hash| {
        probe::contains(shape, lines, hash)
    });
}

/// Answers a batch over a live filter's atomic words; `accelerated` must
/// come from [`available`]. The words are read one atomic load at a time
/// either way (a vector load of words other threads may be writing would be
/// a data race), but compiled for AVX2 and BMI2 every layout's variable
/// shifts and range reductions take fewer instructions and the split
/// layouts build their masks with vector shifts; a batch that prefetches
/// is bound by its instructions, not by its misses.
pub(crate) fn contains_batch_shared(
    shape: Shape,
    array: Lines<'_, AtomicU64>,
    hashes: &[KeyHash],
    out: &mut Vec<bool>,
    accelerated: bool,
) {
    #[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
    if accelerated {
        #[allow(unsafe_code)]
        // SAFETY: `accelerated` is `available()`: this CPU has AVX2 and BMI2.
        unsafe {
            return x86::contains_batch_shared(shape, array, hashes, out);
        }
    }
    let _ = accelerated;
    probe::contains_batch(shape, array, hashes, out, |hash| {
        probe::contains(shape, array, hash)
    });
}

#[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
mod x86 {
    use std::arch::x86_64::{
        __m256i, _mm256_and_si256, _mm256_andnot_si256, _mm256_loadu_si256, _mm256_or_si256,
        _mm256_set1_epi32, _mm256_set1_epi64x, _mm256_setr_epi32, _mm256_setr_epi64x,
        _mm256_setzero_si256, _mm256_sllv_epi32, _mm256_sllv_epi64, _mm256_srlv_epi32,
        _mm256_srlv_epi64, _mm256_storeu_si256, _mm256_testc_si256, _mm256_testz_si256,
    };

    use super::{KeyHash, Lines, Shape, probe};
    use crate::bits::LinesMut;
    use crate::bits::WORDS_PER_BLOCK;
    use crate::hash::SplitPositions;
    use crate::kernels::KernelArgs;
    use crate::model::SPLIT_WORDS;
    use crate::probe::Word;
    use crate::sync::{AtomicU64, set_masks_shared};

    /// The shift counts one stream gives the block's eight words: its eight
    /// 6-bit fields, words 0-3 in the first vector and 4-7 in the second.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn field_counts(stream: u64) -> [__m256i; 2] {
        let stream = _mm256_set1_epi64x(stream as i64);
        let six_bits = _mm256_set1_epi64x(63);
        [
            _mm256_setr_epi64x(0, 6, 12, 18),
            _mm256_setr_epi64x(24, 30, 36, 42),
        ]
        .map(|starts| _mm256_and_si256(_mm256_srlv_epi64(stream, starts), six_bits))
    }

    /// Where the key's line starts, in words from the array's first.
    /// `block < blocks()` (`reduce` maps into `0..blocks`), so the block's
    /// eight words from here are within the array's: pointers offset by
    /// this stay in bounds.
    #[inline(always)]
    fn line_offset(blocks: usize, hash: KeyHash) -> usize {
        probe::block_index(blocks as u64, hash) * WORDS_PER_BLOCK
    }

    /// `probe::split_all_set` over the line, four words per instruction: a
    /// right shift of each word by its field brings the tested bit to bit
    /// 0. Shifting the words (rather than testing them against masks built
    /// by shifting ones) saves two instructions a stream.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_split<const STREAMS: usize>(
        array: Lines<'_, u64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let line = array
            .as_ptr()
            .wrapping_add(line_offset(array.blocks(), hash))
            .cast::<__m256i>();
        #[allow(unsafe_code)]
        // SAFETY: `line` addresses the key's block, eight words of `array`
        // (see `line_offset`), borrowed shared; unaligned loads are allowed.
        let halves = unsafe { [_mm256_loadu_si256(line), _mm256_loadu_si256(line.add(1))] };
        let mut all = _mm256_set1_epi64x(-1);
        for stream in SplitPositions::new(hash).streams::<STREAMS>() {
            let [low, high] = field_counts(stream);
            let tested = _mm256_and_si256(
                _mm256_srlv_epi64(halves[0], low),
                _mm256_srlv_epi64(halves[1], high),
            );
            all = _mm256_and_si256(all, tested);
        }
        // Carry set: bit 0 is set in every lane.
        _mm256_testc_si256(all, _mm256_set1_epi64x(1)) != 0
    }

    /// The masks of the key's bits in each of its line's eight words.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn split_masks<const STREAMS: usize>(hash: KeyHash) -> [__m256i; 2] {
        let one = _mm256_set1_epi64x(1);
        let mut masks = [_mm256_setzero_si256(); 2];
        for stream in SplitPositions::new(hash).streams::<STREAMS>() {
            for (mask, counts) in masks.iter_mut().zip(field_counts(stream)) {
                *mask = _mm256_or_si256(*mask, _mm256_sllv_epi64(one, counts));
            }
        }
        masks
    }

    /// The vectors' 64-bit lanes as words.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn lanes<const N: usize>(vectors: [__m256i; N]) -> [[u64; 4]; N] {
        let mut lanes = [[0_u64; 4]; N];
        for (lanes, vector) in lanes.iter_mut().zip(vectors) {
            #[allow(unsafe_code)]
            // SAFETY: `lanes` is four words, the 32 bytes the store writes
            // (unaligned is allowed).
            unsafe {
                _mm256_storeu_si256(lanes.as_mut_ptr().cast(), vector);
            }
        }
        lanes
    }

    /// A live filter's words that hold the key's bits, and the key's mask
    /// for each: the masks from vector shifts (a handful of instructions
    /// where the portable code takes a few a bit), the words to be read one
    /// relaxed atomic load each, since a vector load of words other threads
    /// may be writing would be a data race.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn split_targets<const STREAMS: usize>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
    ) -> (&[AtomicU64], [u64; WORDS_PER_BLOCK]) {
        let [low, high] = lanes(split_masks::<STREAMS>(hash));
        let mut masks = [0; WORDS_PER_BLOCK];
        masks[..4].copy_from_slice(&low);
        masks[4..].copy_from_slice(&high);
        let block = array.block(probe::block_index(array.blocks() as u64, hash));
        (block, masks)
    }

    /// Whether every bit of the masks is set in its word.
    #[inline(always)]
    fn masks_set(words: &[AtomicU64], masks: impl IntoIterator<Item = u64>) -> bool {
        let mut missing = 0;
        for (word, mask) in words.iter().zip(masks) {
            missing |= mask & !word.get();
        }
        missing == 0
    }

    /// The split-block query over a live filter's atomic words.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_split_shared<const STREAMS: usize>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let (words, masks) = split_targets::<STREAMS>(array, hash);
        masks_set(words, masks)
    }

    /// The split-block insert through shared access: per word what the
    /// portable insert does (`set_bits_shared`: a load, and a locked OR
    /// only where bits are missing), so the answer keeps its guarantee.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn insert_split_shared<const STREAMS: usize>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let (words, masks) = split_targets::<STREAMS>(array, hash);
        set_masks_shared(words, masks)
    }

    /// Sets the key's bits in the line; whether any was unset.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn insert_split<const STREAMS: usize>(
        mut array: LinesMut<'_, AtomicU64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let masks = split_masks::<STREAMS>(hash);
        let offset = line_offset(array.blocks(), hash);
        let line = array
            .as_mut_ptr()
            .cast::<u64>()
            .wrapping_add(offset)
            .cast::<__m256i>();
        #[allow(unsafe_code)]
        // SAFETY: `line` addresses the key's block, eight words of `array`
        // (see `line_offset`), exclusively borrowed: the two 32-byte halves
        // `set_bits` needs.
        let missing =
            unsafe { _mm256_or_si256(set_bits(line, masks[0]), set_bits(line.add(1), masks[1])) };
        _mm256_testz_si256(missing, missing) == 0
    }

    /// ORs `mask` into the 32 bytes at `at`; returns the bits of `mask`
    /// that were unset.
    ///
    /// # Safety
    ///
    /// `at` addresses four words the caller has exclusive access to (so no
    /// other thread reads or writes them; `AtomicU64` has the memory layout
    /// of `u64`). Unaligned is allowed.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    unsafe fn set_bits(at: *mut __m256i, mask: __m256i) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe {
            let old = _mm256_loadu_si256(at);
            _mm256_storeu_si256(at, _mm256_or_si256(old, mask));
            _mm256_andnot_si256(old, mask)
        }
    }

    /// The shift counts one stream gives a 256-bit bucket's eight 32-bit
    /// words: `SplitPositions::bit_in_bucket`'s 5-bit fields, one vector
    /// shift of the stream broadcast as 64-bit lanes (whose 32-bit halves
    /// alternate low, high).
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn field_counts_256(stream: u64) -> __m256i {
        _mm256_and_si256(
            _mm256_srlv_epi32(
                _mm256_set1_epi64x(stream as i64),
                _mm256_setr_epi32(0, 0, 5, 5, 10, 10, 15, 15),
            ),
            _mm256_set1_epi32(31),
        )
    }

    /// Where the key's 256-bit bucket starts, in words from the array's
    /// first, for an array of `words` words. The bucket is below
    /// `words / 4` (`reduce` maps into `0..buckets`), so its four words
    /// from here are within the array's.
    #[inline(always)]
    fn bucket_offset(words: usize, hash: KeyHash) -> usize {
        probe::bucket_index((words / probe::WORDS_PER_BUCKET) as u64, hash)
            * probe::WORDS_PER_BUCKET
    }

    /// The 256-bit split-block query: one load of the bucket, and per
    /// stream a right shift of each 32-bit word by its field, which brings
    /// the tested bit to bit 0.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_split_256<const STREAMS: usize>(
        array: Lines<'_, u64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let bucket = array
            .as_ptr()
            .wrapping_add(bucket_offset(array.words().len(), hash))
            .cast::<__m256i>();
        #[allow(unsafe_code)]
        // SAFETY: `bucket` addresses the key's bucket, four words of
        // `array` (see `bucket_offset`), borrowed shared; unaligned loads
        // are allowed.
        let words = unsafe { _mm256_loadu_si256(bucket) };
        let mut all = _mm256_set1_epi32(-1);
        for stream in SplitPositions::for_buckets(hash).streams::<STREAMS>() {
            all = _mm256_and_si256(all, _mm256_srlv_epi32(words, field_counts_256(stream)));
        }
        _mm256_testc_si256(all, _mm256_set1_epi32(1)) != 0
    }

    /// The mask of the key's bits in its 256-bit bucket.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn split_256_mask<const STREAMS: usize>(hash: KeyHash) -> __m256i {
        let one = _mm256_set1_epi32(1);
        let mut mask = _mm256_setzero_si256();
        for stream in SplitPositions::for_buckets(hash).streams::<STREAMS>() {
            mask = _mm256_or_si256(mask, _mm256_sllv_epi32(one, field_counts_256(stream)));
        }
        mask
    }

    /// A live filter's words that hold the key's 256-bit bucket, and the
    /// key's mask for each, as [`split_targets`] gives them.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn split_256_targets<const STREAMS: usize>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
    ) -> (&[AtomicU64], [u64; probe::WORDS_PER_BUCKET]) {
        let [masks] = lanes([split_256_mask::<STREAMS>(hash)]);
        let offset = bucket_offset(array.words().len(), hash);
        (
            &array.words()[offset..offset + probe::WORDS_PER_BUCKET],
            masks,
        )
    }

    /// The 256-bit split-block query over a live filter's atomic words.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_split_256_shared<const STREAMS: usize>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let (words, masks) = split_256_targets::<STREAMS>(array, hash);
        masks_set(words, masks)
    }

    /// The 256-bit split-block insert through shared access.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn insert_split_256_shared<const STREAMS: usize>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let (words, masks) = split_256_targets::<STREAMS>(array, hash);
        set_masks_shared(words, masks)
    }

    /// Sets the key's bits in its 256-bit bucket; whether any was unset.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn insert_split_256<const STREAMS: usize>(
        mut array: LinesMut<'_, AtomicU64>,
        hash: KeyHash,
        _args: KernelArgs,
    ) -> bool {
        let mask = split_256_mask::<STREAMS>(hash);
        let offset = bucket_offset(array.as_lines().words().len(), hash);
        let bucket = array
            .as_mut_ptr()
            .cast::<u64>()
            .wrapping_add(offset)
            .cast::<__m256i>();
        #[allow(unsafe_code)]
        // SAFETY: `bucket` addresses the key's bucket, four words of
        // `array` (see `bucket_offset`), exclusively borrowed.
        let missing = unsafe { set_bits(bucket, mask) };
        _mm256_testz_si256(missing, missing) == 0
    }

    /// `kernels::contains_standard` compiled for BMI2.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_standard<const K: u32, W: probe::Word>(
        array: Lines<'_, W>,
        hash: KeyHash,
        args: KernelArgs,
    ) -> bool {
        crate::kernels::contains_standard::<K, W>(array, hash, args)
    }

    /// `kernels::insert_standard_shared` compiled for BMI2.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn insert_standard_shared<const K: u32>(
        array: Lines<'_, AtomicU64>,
        hash: KeyHash,
        args: KernelArgs,
    ) -> bool {
        crate::kernels::insert_standard_shared::<K>(array, hash, args)
    }

    /// A batch of queries through `probe::contains_batch`, with the whole
    /// loop compiled for AVX2 and BMI2: non-split layouts get the portable
    /// probe with single-instruction variable shifts, split layouts the
    /// vector kernel for their number of streams, inlined rather than
    /// called. `$split` and `$split_256` name the kernels for the words at
    /// hand.
    macro_rules! batch_of_queries {
        ($shape:ident, $array:ident, $hashes:ident, $out:ident, $split:ident, $split_256:ident) => {
            if !$shape.layout.is_split() {
                probe::contains_batch($shape, $array, $hashes, $out, |hash| {
                    probe::contains($shape, $array, hash)
                });
            } else if $shape.layout == crate::Layout::SplitBlock256 {
                batch_of_queries!(@streams $shape, $array, $hashes, $out, $split_256, 1 2 3 4 5 6 7 8);
            } else {
                batch_of_queries!(@streams $shape, $array, $hashes, $out, $split, 1 2 3 4 5 6 7 8);
            }
        };
        (@streams $shape:ident, $array:ident, $hashes:ident, $out:ident, $kernel:ident, $($streams:literal)*) => {
            match $shape.hashes / SPLIT_WORDS {
                $($streams => probe::contains_batch($shape, $array, $hashes, $out, |hash| {
                    $kernel::<$streams>($array, hash, KernelArgs::of(&$shape))
                }),)*
                _ => unreachable!("k is a multiple of 8 up to 64"),
            }
        };
    }

    /// A batch over a live filter's atomic words.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_batch_shared(
        shape: Shape,
        array: Lines<'_, AtomicU64>,
        hashes: &[KeyHash],
        out: &mut Vec<bool>,
    ) {
        batch_of_queries!(
            shape,
            array,
            hashes,
            out,
            contains_split_shared,
            contains_split_256_shared
        );
    }

    /// A batch over a frozen filter's plain words.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_batch(
        shape: Shape,
        array: Lines<'_, u64>,
        hashes: &[KeyHash],
        out: &mut Vec<bool>,
    ) {
        batch_of_queries!(
            shape,
            array,
            hashes,
            out,
            contains_split,
            contains_split_256
        );
    }
}

#[cfg(all(test, not(bloom_loom)))]
mod tests {
    use super::*;
    use crate::Layout;
    use crate::kernels::KernelArgs;
    use crate::sync::AtomicU64;

    const SPLIT_LAYOUTS: [Layout; 2] = [Layout::SplitBlock, Layout::SplitBlock256];

    fn split_shape(layout: Layout, blocks: u64, hashes: u32) -> Shape {
        Shape {
            layout,
            bits: blocks * 512,
            hashes,
        }
    }

    /// A live filter's batch compiled for BMI2 answers as the portable
    /// batch and as one query at a time, for every layout, hash counts from
    /// both ends of the range, keys present and absent.
    #[test]
    fn accelerated_shared_batch_matches_the_portable_one() {
        for layout in Layout::ALL {
            for hashes in [1, 7, 8, 13, 16, 24, 64] {
                if layout.is_split() && hashes % 8 != 0 {
                    continue;
                }
                // Bits in proportion to k, the filter near half full: at
                // small k some absent keys are false positives too.
                let words = 8 * hashes as usize;
                let shape = Shape {
                    layout,
                    bits: words as u64 * 64,
                    hashes,
                };
                let array = BitArray::zeroed(words);
                let inserted: Vec<KeyHash> = (0..300_u32)
                    .map(|key| KeyHash::of(&key.to_le_bytes()))
                    .collect();
                for &hash in &inserted {
                    crate::kernels::insert_shared(array.lines(), hash, KernelArgs::of(&shape));
                }
                let mut queries = inserted.clone();
                queries.extend((300..1_300_u32).map(|key| KeyHash::of(&key.to_le_bytes())));
                let (mut portable, mut accelerated) = (Vec::new(), vec![true; 5]);
                contains_batch_shared(shape, array.lines(), &queries, &mut portable, false);
                contains_batch_shared(
                    shape,
                    array.lines(),
                    &queries,
                    &mut accelerated,
                    available(),
                );
                assert_eq!(portable, accelerated, "{layout} k={hashes}");
                for (&hash, &answer) in queries.iter().zip(&portable) {
                    let single = probe::contains(shape, array.lines(), hash);
                    assert_eq!(answer, single, "{layout} k={hashes} {hash:?}");
                }
                assert!(
                    portable[..300].iter().all(|&found| found),
                    "{layout} k={hashes}"
                );
                assert!(
                    portable[300..].iter().any(|&found| !found),
                    "{layout} k={hashes}: every absent key answered present"
                );
            }
        }
    }

    /// The vector kernels answer exactly as the portable probe, for every
    /// number of streams.
    #[test]
    fn vector_split_block_probe_matches_the_portable_one() {
        // Dense enough words for k that both answers are common: each word
        // ORs `draws` random words (fill 1 - 2^-draws).
        let cases = [(8, 2), (16, 3), (24, 4), (32, 4), (64, 6)];
        for (layout, (hashes, draws)) in SPLIT_LAYOUTS
            .into_iter()
            .flat_map(|layout| cases.map(|case| (layout, case)))
        {
            let shape = split_shape(layout, 64, hashes);
            let Some(SplitKernels {
                contains: contains_shared,
                contains_plain: contains,
                ..
            }) = split_kernels(shape)
            else {
                assert!(!available(), "no kernels for k = {hashes} on an AVX2 CPU");
                return;
            };
            let mut array = BitArray::zeroed(512).convert(AtomicU64::into_inner);
            let mut state = 0x1234_5678_9abc_def0_u64;
            let mut next = || {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                crate::hash::mix64(state)
            };
            for word in array.words_mut() {
                *word = (0..draws).fold(0, |word, _| word | next());
            }
            let (mut present, mut absent) = (0, 0);
            let hashes_seen: Vec<KeyHash> = (0..20_000)
                .map(|_| KeyHash::from_u128(u128::from(next()) << 64 | u128::from(next())))
                .collect();
            let mut batch = Vec::new();
            contains_batch(shape, &array, &hashes_seen, &mut batch, true);
            let live = BitArray::zeroed(512);
            for (word, &value) in live.words().iter().zip(array.words()) {
                word.store(value, crate::sync::Ordering::Relaxed);
            }
            let mut live_batch = Vec::new();
            contains_batch_shared(shape, live.lines(), &hashes_seen, &mut live_batch, true);
            for ((&hash, &batched), &live_batched) in
                hashes_seen.iter().zip(&batch).zip(&live_batch)
            {
                let portable = probe::contains(shape, live.lines(), hash);
                #[allow(unsafe_code)]
                // SAFETY: `split_kernels` checked this CPU.
                let (vector, shared) = unsafe {
                    (
                        contains(array.lines(), hash, KernelArgs::of(&shape)),
                        contains_shared(live.lines(), hash, KernelArgs::of(&shape)),
                    )
                };
                assert_eq!(portable, vector, "{layout} k={hashes} {hash:?}");
                assert_eq!(
                    portable, shared,
                    "atomic words, {layout} k={hashes} {hash:?}"
                );
                assert_eq!(portable, batched, "batch, {layout} k={hashes} {hash:?}");
                assert_eq!(
                    portable, live_batched,
                    "live batch, {layout} k={hashes} {hash:?}"
                );
                if portable { present += 1 } else { absent += 1 }
            }
            assert!(
                present > 100 && absent > 100,
                "{layout} k={hashes}: {present} / {absent}"
            );
        }
    }

    /// The vector insert sets the same bits and gives the same answers as
    /// the portable one.
    #[test]
    fn vector_split_block_insert_matches_the_portable_one() {
        for (layout, hashes) in SPLIT_LAYOUTS
            .into_iter()
            .flat_map(|layout| [8, 16, 24, 64].map(|hashes| (layout, hashes)))
        {
            // Words in proportion to k, so that each word sees the same
            // number of bits set.
            let blocks = 16 * u64::from(hashes / 8);
            let shape = split_shape(layout, blocks, hashes);
            let Some(SplitKernels {
                insert_exclusive: insert,
                ..
            }) = split_kernels(shape)
            else {
                assert!(!available(), "no kernels for k = {hashes} on an AVX2 CPU");
                return;
            };
            let mut vector = BitArray::zeroed(blocks as usize * 8);
            let mut portable = BitArray::zeroed(blocks as usize * 8);
            let mut newly = 0;
            for key in 0..3_000_u32 {
                // Keys repeat, so that "already there" answers occur too.
                let hash = KeyHash::of(&(key % 2_000).to_le_bytes());
                #[allow(unsafe_code)]
                // SAFETY: `split_kernels` checked this CPU.
                let answer = unsafe { insert(vector.lines_mut(), hash, KernelArgs::of(&shape)) };
                let expected = crate::kernels::insert_exclusive(
                    portable.lines_mut(),
                    hash,
                    KernelArgs::of(&shape),
                );
                assert_eq!(answer, expected, "{layout} k={hashes} key {key}");
                newly += u32::from(answer);
            }
            // At 4 bits per key per stream some new keys are false
            // positives already.
            assert!(
                (1_000..=2_000).contains(&newly),
                "{layout} k={hashes}: {newly}"
            );
            let words = |array: BitArray<AtomicU64>| -> Vec<u64> {
                array.convert(AtomicU64::into_inner).words().to_vec()
            };
            assert_eq!(words(vector), words(portable), "{layout} k={hashes}");
        }
    }

    /// Kernels exist exactly for split-block shapes on AVX2/BMI2 CPUs.
    #[test]
    fn kernels_only_for_split_block_shapes() {
        for layout in [Layout::Standard, Layout::Blocked] {
            let shape = Shape {
                layout,
                bits: 512 * 16,
                hashes: 8,
            };
            assert!(split_kernels(shape).is_none(), "{layout}");
        }
        for layout in SPLIT_LAYOUTS {
            assert_eq!(
                split_kernels(split_shape(layout, 16, 8)).is_some(),
                available()
            );
        }
    }
}
