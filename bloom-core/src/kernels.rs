//! The probe functions a filter calls through, chosen once when it is made
//! for its layout, hash count and CPU ([`Kernels`]).
//!
//! Why function pointers rather than a `match` on the layout in every
//! call: a filter method that inlines the code of every layout into the
//! caller's loop leaves that loop short of registers, so it reloads the
//! filter's fields from the stack on every key, and the instructions a key
//! takes are what limits throughput once the filter is out of cache (the
//! CPU overlaps the cache misses of as many keys as its instruction window
//! holds). Through a pointer the caller's loop is a load and a call, and
//! each kernel is compiled for one case: the standard layout with its hash
//! count as a constant (an unrolled probe sequence), the split-block layout
//! as AVX2 code (`accel`). Measured in BENCHMARKS.md ("Run of 2026-11-23:
//! per-filter kernels").

use crate::accel;
use crate::bits::BitArray;
use crate::filter::Layout;
use crate::hash::{KeyHash, Probes, reduce};
use crate::probe::{self, Shape, Word};
use crate::sync::{AtomicU64, set_bit_exclusive, set_bits_exclusive, set_bits_shared};

/// A query over words of type `W`.
pub(crate) type Contains<W> = unsafe fn(Shape, &BitArray<W>, KeyHash) -> bool;
/// An insert through shared access (atomic words, any number of threads).
pub(crate) type InsertShared = unsafe fn(Shape, &BitArray<AtomicU64>, KeyHash) -> bool;
/// An insert through exclusive access.
pub(crate) type InsertExclusive = unsafe fn(Shape, &mut BitArray<AtomicU64>, KeyHash) -> bool;

/// One filter's probe functions. The pointers are `unsafe fn` because some
/// are compiled for CPU features ([`Kernels::for_shape`] hands those out
/// only on a CPU that has them) and the standard layout's index their words
/// unchecked; each must be called with the shape it was chosen for and that
/// filter's array.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub(crate) contains: Contains<AtomicU64>,
    #[cfg(not(bloom_loom))]
    pub(crate) contains_plain: Contains<u64>,
    pub(crate) insert_shared: InsertShared,
    pub(crate) insert_exclusive: InsertExclusive,
}

impl Kernels {
    /// The fastest kernels this CPU runs for `shape`. Each is then called
    /// only with `shape` and an array of `shape.bits / 64` words.
    pub(crate) fn for_shape(shape: Shape) -> Self {
        Self::choose(shape, accel::available())
    }

    /// The kernels for `shape`, with the CPU-specific ones only when
    /// `accelerated` (which must then be `accel::available()`).
    #[cfg_attr(bloom_loom, allow(unused_variables))]
    fn choose(shape: Shape, accelerated: bool) -> Self {
        let mut kernels = Self {
            contains: probe::contains::<AtomicU64>,
            #[cfg(not(bloom_loom))]
            contains_plain: probe::contains::<u64>,
            insert_shared,
            insert_exclusive,
        };
        if shape.layout == Layout::Standard {
            // The hash counts sizing produces down to p near 1e-6; others
            // keep the loop over a run-time count.
            macro_rules! by_hashes {
                ($($k:literal)*) => {
                    match shape.hashes {
                        $($k => {
                            kernels.contains = contains_standard::<$k, AtomicU64>;
                            #[cfg(not(bloom_loom))]
                            {
                                kernels.contains_plain = contains_standard::<$k, u64>;
                            }
                            kernels.insert_shared = insert_standard_shared::<$k>;
                            kernels.insert_exclusive = insert_standard_exclusive::<$k>;
                        })*
                        _ => {}
                    }
                };
            }
            by_hashes!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21);
            #[cfg(not(bloom_loom))]
            if let Some(bmi2) = accel::standard_kernels(shape).filter(|_| accelerated) {
                kernels = bmi2;
            }
        }
        #[cfg(not(bloom_loom))]
        if let Some((contains_plain, insert_exclusive)) =
            accel::split_kernels(shape).filter(|_| accelerated)
        {
            kernels.contains_plain = contains_plain;
            kernels.insert_exclusive = insert_exclusive;
        }
        kernels
    }

    /// Whether every bit of the key is set, over atomic words.
    #[inline(always)]
    pub(crate) fn contains(
        &self,
        shape: Shape,
        array: &BitArray<AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for `shape` on this CPU, and
        // the filters call it only with their own shape and array.
        unsafe {
            (self.contains)(shape, array, hash)
        }
    }

    /// Whether every bit of the key is set, over plain words.
    #[cfg(not(bloom_loom))]
    #[inline(always)]
    pub(crate) fn contains_plain(
        &self,
        shape: Shape,
        array: &BitArray<u64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for `shape` on this CPU, and
        // the filters call it only with their own shape and array.
        unsafe {
            (self.contains_plain)(shape, array, hash)
        }
    }

    /// Sets the key's bits through shared access; see
    /// [`BloomFilter`](crate::BloomFilter) for what the answer guarantees.
    #[inline(always)]
    pub(crate) fn insert_shared(
        &self,
        shape: Shape,
        array: &BitArray<AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for `shape` on this CPU, and
        // the filters call it only with their own shape and array.
        unsafe {
            (self.insert_shared)(shape, array, hash)
        }
    }

    /// Sets the key's bits through exclusive access; whether any was unset.
    #[inline(always)]
    pub(crate) fn insert_exclusive(
        &self,
        shape: Shape,
        array: &mut BitArray<AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for `shape` on this CPU, and
        // the filters call it only with their own shape and array.
        unsafe {
            (self.insert_exclusive)(shape, array, hash)
        }
    }
}

// The standard layout's kernels index their words unchecked: a probe's
// word is `reduce(x, bits) / 64`, below `bits / 64` because `reduce` maps
// into `0..bits`, and every filter's array holds exactly `bits / 64` words.
// The bounds check the compiler cannot remove is two instructions of the
// dozen a probe takes, and out of cache the instruction count is the
// throughput: 0.87x against 0.95-0.98x of fastbloom's exclusive insert
// with it removed, in an interleaved A/B at 10 million keys.
//
// # Safety (every function below that takes a shape and an array)
//
// `shape.bits` is 64 times the number of words of `array`: true of a
// filter's own shape and array, which is all `Kernels` is ever called with.

/// The standard layout's query with `K` hashes.
#[allow(unsafe_code)]
#[inline(always)]
pub(crate) unsafe fn contains_standard<const K: u32, W: Word>(
    shape: Shape,
    array: &BitArray<W>,
    hash: KeyHash,
) -> bool {
    let words = array.words();
    let mut probes = Probes::new(hash);
    for _ in 0..K {
        let bit = reduce(probes.next_raw(), shape.bits);
        #[allow(unsafe_code)]
        // SAFETY: `bit / 64 < words.len()` (see the section's comment).
        let word = unsafe { words.get_unchecked((bit / 64) as usize) };
        if word.get() & (1 << (bit % 64)) == 0 {
            return false;
        }
    }
    true
}

/// The standard layout's shared insert with `K` hashes.
#[allow(unsafe_code)]
#[inline(always)]
pub(crate) unsafe fn insert_standard_shared<const K: u32>(
    shape: Shape,
    array: &BitArray<AtomicU64>,
    hash: KeyHash,
) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: the caller's contract is this one's.
    unsafe {
        standard_shared(Shape { hashes: K, ..shape }, array, hash)
    }
}

/// The standard layout's exclusive insert with `K` hashes.
#[allow(unsafe_code)]
#[inline(always)]
pub(crate) unsafe fn insert_standard_exclusive<const K: u32>(
    shape: Shape,
    array: &mut BitArray<AtomicU64>,
    hash: KeyHash,
) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: the caller's contract is this one's.
    unsafe {
        standard_exclusive(Shape { hashes: K, ..shape }, array, hash)
    }
}

/// Any layout's shared insert.
#[allow(unsafe_code)]
pub(crate) unsafe fn insert_shared(
    shape: Shape,
    array: &BitArray<AtomicU64>,
    hash: KeyHash,
) -> bool {
    match shape.layout {
        #[allow(unsafe_code)]
        // SAFETY: the caller's contract is this one's.
        Layout::Standard => unsafe { standard_shared(shape, array, hash) },
        Layout::Blocked | Layout::SplitBlock => {
            let (block, masks) = probe::block_masks(shape, array, hash);
            let mut newly = false;
            for (word, mask) in array.block(block).iter().zip(masks) {
                newly |= set_bits_shared(word, mask);
            }
            newly
        }
    }
}

/// Any layout's exclusive insert, portably.
#[allow(unsafe_code)]
pub(crate) unsafe fn insert_exclusive(
    shape: Shape,
    array: &mut BitArray<AtomicU64>,
    hash: KeyHash,
) -> bool {
    match shape.layout {
        #[allow(unsafe_code)]
        // SAFETY: the caller's contract is this one's.
        Layout::Standard => unsafe { standard_exclusive(shape, array, hash) },
        Layout::Blocked | Layout::SplitBlock => {
            let (block, masks) = probe::block_masks(shape, array, hash);
            let mut unset = 0;
            for (word, mask) in array.block_mut(block).iter_mut().zip(masks) {
                unset |= set_bits_exclusive(word, mask);
            }
            unset != 0
        }
    }
}

#[allow(unsafe_code)]
#[inline(always)]
unsafe fn standard_shared(shape: Shape, array: &BitArray<AtomicU64>, hash: KeyHash) -> bool {
    let words = array.words();
    let mut newly = false;
    let mut probes = Probes::new(hash);
    for _ in 0..shape.hashes {
        let bit = reduce(probes.next_raw(), shape.bits);
        #[allow(unsafe_code)]
        // SAFETY: `bit / 64 < words.len()` (see the section's comment).
        let word = unsafe { words.get_unchecked((bit / 64) as usize) };
        newly |= set_bits_shared(word, 1 << (bit % 64));
    }
    newly
}

#[allow(unsafe_code)]
#[inline(always)]
unsafe fn standard_exclusive(shape: Shape, array: &mut BitArray<AtomicU64>, hash: KeyHash) -> bool {
    let words = array.words_mut();
    let mut all_set = u64::MAX;
    let mut probes = Probes::new(hash);
    for _ in 0..shape.hashes {
        let bit = reduce(probes.next_raw(), shape.bits);
        #[allow(unsafe_code)]
        // SAFETY: `bit / 64 < words.len()` (see the section's comment).
        let word = unsafe { words.get_unchecked_mut((bit / 64) as usize) };
        all_set &= set_bit_exclusive(word, (bit % 64) as u32);
    }
    // Bit 0 of each shifted old word said whether its bit was set.
    all_set & 1 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel a shape can get, on this CPU and portably, answers and
    /// sets bits exactly as the portable code over a run-time hash count
    /// does.
    #[test]
    fn chosen_kernels_match_the_portable_code() {
        for accelerated in [false, accel::available()] {
            check_kernels(accelerated);
        }
    }

    fn check_kernels(accelerated: bool) {
        for layout in [Layout::Standard, Layout::Blocked, Layout::SplitBlock] {
            for hashes in [1, 7, 8, 13, 16, 21, 22, 24] {
                if layout == Layout::SplitBlock && hashes % 8 != 0 {
                    continue;
                }
                // Bits in proportion to k: the filter ends half full.
                let words = 336 * hashes as usize;
                let shape = Shape {
                    layout,
                    bits: words as u64 * 64,
                    hashes,
                };
                let kernels = Kernels::choose(shape, accelerated);
                let mut fast = BitArray::zeroed(words);
                let fast_shared = BitArray::zeroed(words);
                let mut portable = BitArray::zeroed(words);
                let (mut found, mut missed) = (0, 0);
                for key in 0..20_000_u32 {
                    // Keys repeat, so that "already there" answers occur.
                    let hash = KeyHash::of(&(key % 15_000).to_le_bytes());
                    #[allow(unsafe_code)]
                    // SAFETY: `shape` describes the arrays' words.
                    let expected = unsafe { insert_exclusive(shape, &mut portable, hash) };
                    let label = format!("{layout} k={hashes} key {key}");
                    assert_eq!(
                        kernels.insert_exclusive(shape, &mut fast, hash),
                        expected,
                        "{label}"
                    );
                    assert_eq!(
                        kernels.insert_shared(shape, &fast_shared, hash),
                        expected,
                        "{label}"
                    );
                    // Every other query is of an inserted key.
                    let probe = if key % 2 == 0 {
                        KeyHash::of(&(key / 2 % 15_000).to_le_bytes())
                    } else {
                        KeyHash::of(&(key + 1_000_000).to_le_bytes())
                    };
                    let expected = probe::contains(shape, &portable, probe);
                    assert_eq!(
                        kernels.contains(shape, &portable, probe),
                        expected,
                        "{label}"
                    );
                    if expected { found += 1 } else { missed += 1 }
                }
                assert!(found > 1_000 && missed > 1_000, "{layout} k={hashes}");
                let words = |array: &BitArray<AtomicU64>| -> Vec<u64> {
                    array
                        .words()
                        .iter()
                        .map(|word| word.load(crate::sync::Ordering::Relaxed))
                        .collect()
                };
                assert_eq!(words(&fast), words(&portable), "{layout} k={hashes}");
                assert_eq!(words(&fast_shared), words(&portable), "{layout} k={hashes}");
                #[cfg(not(bloom_loom))]
                {
                    let plain = portable.convert(AtomicU64::into_inner);
                    for key in 0..20_000_u32 {
                        let probe = KeyHash::of(&(key / 2 + 1_000_000 * (key % 2)).to_le_bytes());
                        assert_eq!(
                            kernels.contains_plain(shape, &plain, probe),
                            probe::contains(shape, &plain, probe),
                            "{layout} k={hashes} plain, key {key}"
                        );
                    }
                }
            }
        }
    }
}
