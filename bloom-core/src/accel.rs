//! The probe code compiled a second time for CPUs with AVX2 and BMI2, and
//! chosen at run time (the crate is built for the x86-64 baseline, which
//! has neither).
//!
//! Over plain words the split-block probe then becomes a handful of vector
//! shifts, and every layout's variable shifts take one instruction instead
//! of three; measured in BENCHMARKS.md ("Run of 2026-11-22: the split-block
//! layout and frozen filters"). Over atomic words it gains nothing: relaxed
//! atomic loads are never merged into vector loads, which is why only the
//! frozen filter's queries and the exclusive `insert_mut` (plain access
//! through `&mut`) come here.
//!
//! `unsafe` here, and only here besides the prefetch hint in `sync`: each
//! call of a `#[target_feature]` function (sound only on a CPU that has the
//! features, which [`available`] checked), and the vector loads and stores
//! of one block; each block says why it is sound.

use crate::bits::BitArray;
use crate::hash::KeyHash;
use crate::probe::{self, Shape};
use crate::sync::{AtomicU64, set_bits_exclusive};

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
            return x86::contains_batch(shape, array, hashes, out);
        }
    }
    let _ = accelerated;
    probe::contains_batch(shape, array, hashes, out, |hash| {
        probe::contains(shape, array, hash)
    });
}

/// One query over plain words; `accelerated` must come from [`available`].
/// Only the split-block layout is worth a call into other code per query
/// (its probe becomes a few vector instructions); the other layouts' probes
/// gain less from BMI2 than the call costs, so they stay inline.
#[cfg(not(bloom_loom))]
#[inline]
pub(crate) fn contains(
    shape: Shape,
    array: &BitArray<u64>,
    hash: KeyHash,
    accelerated: bool,
) -> bool {
    #[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
    if accelerated && shape.layout == crate::Layout::SplitBlock {
        #[allow(unsafe_code)]
        // SAFETY: `accelerated` is `available()`: this CPU has AVX2 and BMI2.
        unsafe {
            // k = 8 and 16 (p down to about 1e-4) get functions of their
            // own: out of cache, the fewer instructions a query takes, the
            // more queries' misses the CPU overlaps, and the general one
            // saves registers on entry.
            return match shape.hashes {
                8 => x86::contains_split_k::<1>(array, hash),
                16 => x86::contains_split_k::<2>(array, hash),
                _ => x86::contains_split(shape, array, hash),
            };
        }
    }
    let _ = accelerated;
    probe::contains(shape, array, hash)
}

/// Sets a key's bits through exclusive access; whether any was unset.
/// `accelerated` must come from [`available`].
#[inline]
pub(crate) fn insert_exclusive(
    shape: Shape,
    array: &mut BitArray<AtomicU64>,
    hash: KeyHash,
    accelerated: bool,
) -> bool {
    #[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
    if accelerated && shape.layout == crate::Layout::SplitBlock {
        #[allow(unsafe_code)]
        // SAFETY: `accelerated` is `available()`: this CPU has AVX2 and BMI2.
        unsafe {
            match shape.hashes {
                8 => return x86::insert_split_k::<1>(array, hash),
                16 => return x86::insert_split_k::<2>(array, hash),
                _ => {}
            }
        }
    }
    let _ = accelerated;
    insert_exclusive_portable(shape, array, hash)
}

#[inline(always)]
fn insert_exclusive_portable(shape: Shape, array: &mut BitArray<AtomicU64>, hash: KeyHash) -> bool {
    let mut newly = false;
    match shape.layout {
        crate::Layout::Standard => {
            let mut probes = crate::hash::Probes::new(hash);
            for _ in 0..shape.hashes {
                let bit = crate::hash::reduce(probes.next_raw(), shape.bits);
                let word = &mut array.words_mut()[(bit / 64) as usize];
                newly |= set_bits_exclusive(word, 1 << (bit % 64));
            }
        }
        crate::Layout::Blocked | crate::Layout::SplitBlock => {
            let (block, masks) = probe::block_masks(shape, array, hash);
            for (word, mask) in array.block_mut(block).iter_mut().zip(masks) {
                newly |= set_bits_exclusive(word, mask);
            }
        }
    }
    newly
}

#[cfg(all(target_arch = "x86_64", not(bloom_loom)))]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_andnot_si128, _mm_cvtsi128_si64, _mm_loadu_si128, _mm_or_si128,
        _mm_set_epi64x, _mm_set1_epi64x, _mm_setzero_si128, _mm_sllv_epi64, _mm_srlv_epi64,
        _mm_storeu_si128, _mm_testz_si128, _mm_unpackhi_epi64,
    };

    use super::{BitArray, KeyHash, Shape, probe};
    use crate::hash::SplitPositions;
    use crate::model::SPLIT_WORDS;
    use crate::sync::AtomicU64;

    /// Where each word's 6-bit field starts in a stream, by pairs of words
    /// (lane 0 holds the even word).
    const FIELD_STARTS: [[i64; 2]; 4] = [[0, 6], [12, 18], [24, 30], [36, 42]];

    /// A split-block query with k = 8 `STREAMS`.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_split_k<const STREAMS: usize>(
        array: &BitArray<u64>,
        hash: KeyHash,
    ) -> bool {
        split_all_set::<STREAMS>(
            array.block(probe::block_of(array, hash)),
            &SplitPositions::new(hash),
        )
    }

    /// A split-block query. 128-bit vectors rather than 256-bit ones: the
    /// wider registers would make the function end in `vzeroupper`, which
    /// costs more per call than the halved shift count saves (measured in a
    /// prototype outside the crate: 12-15 against 14-19 ns per query at 10
    /// million keys; a 256-bit version of this kernel was also slower in
    /// the peers benchmark).
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    pub(super) fn contains_split(shape: Shape, array: &BitArray<u64>, hash: KeyHash) -> bool {
        let block = array.block(probe::block_of(array, hash));
        let positions = SplitPositions::new(hash);
        macro_rules! unrolled {
            ($($streams:literal)*) => {
                match shape.hashes / SPLIT_WORDS {
                    $($streams => split_all_set::<$streams>(block, &positions),)*
                    _ => unreachable!("k is a multiple of 8 up to 64"),
                }
            };
        }
        unrolled!(1 2 3 4 5 6 7 8)
    }

    /// `probe::split_all_set` two words per instruction: each stream's
    /// eight 6-bit fields become per-lane shift counts, and a right shift
    /// of each word by its count brings the tested bit to bit 0.
    #[target_feature(enable = "avx2,bmi2")]
    #[inline]
    fn split_all_set<const STREAMS: usize>(block: &[u64; 8], positions: &SplitPositions) -> bool {
        let pairs = block.as_ptr().cast::<__m128i>();
        #[allow(unsafe_code)]
        // SAFETY: `pairs` points at the block's eight words, so pair 0..4
        // addresses two of them; the block is borrowed shared and never
        // written while a frozen filter exists. Unaligned loads are allowed.
        // (Building the vectors from eight scalar reads instead compiles to
        // a load and a lane insert per pair.)
        let words = unsafe { [0, 1, 2, 3].map(|pair| _mm_loadu_si128(pairs.add(pair))) };
        let field_starts = FIELD_STARTS.map(|starts| _mm_set_epi64x(starts[1], starts[0]));
        let six_bits = _mm_set1_epi64x(63);
        let mut all = _mm_set1_epi64x(-1);
        for stream in positions.streams::<STREAMS>() {
            let stream = _mm_set1_epi64x(stream as i64);
            for (words, starts) in words.iter().zip(&field_starts) {
                let counts = _mm_and_si128(_mm_srlv_epi64(stream, *starts), six_bits);
                all = _mm_and_si128(all, _mm_srlv_epi64(*words, counts));
            }
        }
        let all = _mm_and_si128(all, _mm_unpackhi_epi64(all, all));
        _mm_cvtsi128_si64(all) & 1 == 1
    }

    /// A batch, with the whole loop compiled for AVX2 and BMI2 (so every
    /// layout's probe gets single-instruction variable shifts).
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn contains_batch(
        shape: Shape,
        array: &BitArray<u64>,
        hashes: &[KeyHash],
        out: &mut Vec<bool>,
    ) {
        probe::contains_batch(shape, array, hashes, out, |hash| {
            if shape.layout == crate::Layout::SplitBlock && shape.hashes == SPLIT_WORDS {
                contains_split_k::<1>(array, hash)
            } else if shape.layout == crate::Layout::SplitBlock && shape.hashes == 2 * SPLIT_WORDS {
                contains_split_k::<2>(array, hash)
            } else if shape.layout == crate::Layout::SplitBlock {
                contains_split(shape, array, hash)
            } else {
                probe::contains(shape, array, hash)
            }
        });
    }

    /// A split-block insert with k = 8 `STREAMS`: the masks, the old words
    /// and the new ones stay in vector registers, two words per
    /// instruction. Eight scalar read-modify-writes instead take three
    /// times the instructions, and out of cache the instruction count per
    /// insert is what limits how many inserts' misses the CPU overlaps.
    #[target_feature(enable = "avx2,bmi2")]
    pub(super) fn insert_split_k<const STREAMS: usize>(
        array: &mut BitArray<AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        let block = array.block_mut(probe::block_of(array, hash));
        let streams = SplitPositions::new(hash)
            .streams::<STREAMS>()
            .map(|stream| _mm_set1_epi64x(stream as i64));
        let six_bits = _mm_set1_epi64x(63);
        let one = _mm_set1_epi64x(1);
        let pairs = block.as_mut_ptr().cast::<__m128i>();
        let mut missing = _mm_setzero_si128();
        for (pair, starts) in FIELD_STARTS.iter().enumerate() {
            let starts = _mm_set_epi64x(starts[1], starts[0]);
            let masks = streams.iter().fold(_mm_setzero_si128(), |masks, stream| {
                let bits = _mm_and_si128(_mm_srlv_epi64(*stream, starts), six_bits);
                _mm_or_si128(masks, _mm_sllv_epi64(one, bits))
            });
            #[allow(unsafe_code)]
            // SAFETY: `pairs` points at the block's eight words, exclusively
            // borrowed, so `pair` (0..4) addresses two of them; `AtomicU64`
            // has the memory layout of `u64`, and no other thread can touch
            // the words while `&mut` is held. Unaligned access is allowed.
            unsafe {
                let old = _mm_loadu_si128(pairs.add(pair));
                missing = _mm_or_si128(missing, _mm_andnot_si128(old, masks));
                _mm_storeu_si128(pairs.add(pair), _mm_or_si128(old, masks));
            }
        }
        _mm_testz_si128(missing, missing) == 0
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::Layout;

        /// The vector kernel answers exactly as the portable probe.
        #[test]
        fn vector_split_block_probe_matches_the_portable_one() {
            if !super::super::available() {
                return;
            }
            // Dense enough words for k that both answers are common: each
            // word ORs `draws` random words (fill 1 - 2^-draws).
            for (hashes, draws) in [(8, 2), (16, 3), (64, 6)] {
                let shape = Shape {
                    layout: Layout::SplitBlock,
                    bits: 512 * 64,
                    hashes,
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
                for _ in 0..20_000 {
                    let hash = KeyHash::from_u128(u128::from(next()) << 64 | u128::from(next()));
                    let portable = probe::contains(shape, &array, hash);
                    #[allow(unsafe_code)]
                    // SAFETY: `available()` was checked above.
                    let vector = unsafe {
                        if hashes == 8 {
                            contains_split_k::<1>(&array, hash)
                        } else if hashes == 16 {
                            contains_split_k::<2>(&array, hash)
                        } else {
                            contains_split(shape, &array, hash)
                        }
                    };
                    assert_eq!(portable, vector, "k={hashes} {hash:?}");
                    if portable { present += 1 } else { absent += 1 }
                }
                assert!(
                    present > 100 && absent > 100,
                    "k={hashes}: {present} / {absent}"
                );
            }
        }

        /// The vector insert sets the same bits and gives the same answers
        /// as the portable one, for k = 8 and 16.
        #[test]
        fn vector_split_block_insert_matches_the_portable_one() {
            if !super::super::available() {
                return;
            }
            for hashes in [8, 16] {
                let shape = Shape {
                    layout: Layout::SplitBlock,
                    bits: 512 * 16,
                    hashes,
                };
                let mut vector = BitArray::zeroed(128);
                let mut portable = BitArray::zeroed(128);
                let mut newly = 0;
                for key in 0..3_000_u32 {
                    // Keys repeat, so that "already there" answers occur too.
                    let hash = KeyHash::of(&(key % 2_000).to_le_bytes());
                    #[allow(unsafe_code)]
                    // SAFETY: `available()` was checked above.
                    let answer = unsafe {
                        if hashes == 8 {
                            insert_split_k::<1>(&mut vector, hash)
                        } else {
                            insert_split_k::<2>(&mut vector, hash)
                        }
                    };
                    assert_eq!(
                        answer,
                        super::super::insert_exclusive_portable(shape, &mut portable, hash),
                        "k={hashes} key {key}"
                    );
                    newly += u32::from(answer);
                }
                // At 4 bits per key some new keys are false positives
                // already.
                assert!((1_000..=2_000).contains(&newly), "k={hashes}: {newly}");
                let words = |array: BitArray<AtomicU64>| -> Vec<u64> {
                    array.convert(AtomicU64::into_inner).words().to_vec()
                };
                assert_eq!(words(vector), words(portable), "k={hashes}");
            }
        }
    }
}
