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
//! as AVX2 code (`accel`); BENCHMARKS.md ("Instructions a key") counts what
//! each kernel executes. One exception: the standard layout's exclusive
//! insert runs inline, for the reason [`Kernels::insert_exclusive`] gives.

use crate::bits::{Lines, LinesMut};
use crate::hash::{KeyHash, Probes, reduce};
use crate::layout::Layout;
use crate::probe::{self, Shape, Word};
use crate::sync::{
    AtomicU64, set_bit_exclusive, set_bits_exclusive, set_bits_shared, set_masks_shared,
};

/// What a kernel needs of its filter's shape; the bits it does not need,
/// since they are the words' count times 64.
///
/// Why not the shape itself: by value, its three fields make it an argument
/// the caller passes as a pointer to a fresh copy, stored before every call
/// (three instructions a key more; in an interleaved A/B at 10 million
/// keys, k = 13, 0.66 -> 0.80x of fastbloom on prehashed absent queries);
/// by reference it points into the filter, so that the compiler must assume
/// every call may change the filter and reloads its fields (layout, words,
/// length) for every key of a caller's loop. Packed into one word, the
/// arguments take one register and point at nothing (as two scalars they
/// took two, which a caller's loop short of registers reloaded from its
/// stack on every call: one instruction a key more).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelArgs(u64);

impl KernelArgs {
    #[inline(always)]
    pub(crate) fn of(shape: &Shape) -> Self {
        let layout = shape.layout as u64;
        debug_assert_eq!(Layout::ALL[layout as usize], shape.layout);
        Self(u64::from(shape.hashes) | layout << 32)
    }

    #[inline(always)]
    fn layout(self) -> Layout {
        Layout::ALL[(self.0 >> 32) as usize]
    }

    #[inline(always)]
    fn hashes(self) -> u32 {
        self.0 as u32
    }

    /// [`of`](Self::of) a filter whose array is `words` words: its bits must
    /// be exactly those words' (every constructor rounds them up to whole
    /// blocks), since the kernels take them from the word count.
    #[inline(always)]
    fn for_words(shape: &Shape, words: usize) -> Self {
        debug_assert_eq!(shape.bits, words as u64 * 64);
        Self::of(shape)
    }

    /// The shape of the filter whose words are `words` words.
    #[inline(always)]
    fn shape(self, words: usize) -> Shape {
        Shape {
            layout: self.layout(),
            bits: words as u64 * 64,
            hashes: self.hashes(),
        }
    }
}

// The kernels' parameters come in this order so that on x86-64 the hash's
// first half arrives in `rdx`, the register `mulx` (the block choice's
// range reduction) reads, and the arguments only the portable kernels use
// come last: the split-block kernels then start with no register moves.
// With `KernelArgs` in one register as well: 29 -> 26 instructions a
// prehashed query of a split-block-256 filter (callgrind,
// `examples/instructions_per_key.rs`).

/// A query over words of type `W`.
pub(crate) type Contains<W> = unsafe fn(Lines<'_, W>, KeyHash, KernelArgs) -> bool;
/// An insert through shared access (atomic words, any number of threads).
pub(crate) type InsertShared = unsafe fn(Lines<'_, AtomicU64>, KeyHash, KernelArgs) -> bool;
/// An insert through exclusive access.
pub(crate) type InsertExclusive = unsafe fn(LinesMut<'_, AtomicU64>, KeyHash, KernelArgs) -> bool;

/// One filter's probe functions. The pointers are `unsafe fn` because some
/// are compiled for CPU features, which [`Kernels::for_shape`] hands out
/// only on a CPU that has them; each is meant for the shape it was chosen
/// for and that filter's words (any [`Lines`] are sound, only the answers
/// would be wrong). They take the words as [`Lines`], a pointer and a
/// length in registers, for the reason given there.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub(crate) contains: Contains<AtomicU64>,
    #[cfg(not(bloom_loom))]
    pub(crate) contains_plain: Contains<u64>,
    pub(crate) insert_shared: InsertShared,
    /// Block layouts only: the standard layout's runs inline (see
    /// [`Kernels::insert_exclusive`]).
    pub(crate) insert_exclusive: InsertExclusive,
}

impl Kernels {
    /// Whether every bit of the key is set, over atomic words.
    #[inline(always)]
    pub(crate) fn contains(
        &self,
        shape: &Shape,
        lines: Lines<'_, AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for this CPU.
        unsafe {
            (self.contains)(
                lines,
                hash,
                KernelArgs::for_words(shape, lines.words().len()),
            )
        }
    }

    /// Whether every bit of the key is set, over plain words.
    #[cfg(not(bloom_loom))]
    #[inline(always)]
    pub(crate) fn contains_plain(
        &self,
        shape: &Shape,
        lines: Lines<'_, u64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for this CPU.
        unsafe {
            (self.contains_plain)(
                lines,
                hash,
                KernelArgs::for_words(shape, lines.words().len()),
            )
        }
    }

    /// Sets the key's bits through shared access; see
    /// [`BloomFilter`](crate::BloomFilter) for what the answer guarantees.
    #[inline(always)]
    pub(crate) fn insert_shared(
        &self,
        shape: &Shape,
        lines: Lines<'_, AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for this CPU.
        unsafe {
            (self.insert_shared)(
                lines,
                hash,
                KernelArgs::for_words(shape, lines.words().len()),
            )
        }
    }

    /// Sets the key's bits through exclusive access; whether any was unset.
    ///
    /// The standard layout's probe loop runs inline in the caller, not
    /// through a kernel: each of its k probes stores to a line that is
    /// usually missing from the cache, stores leave the store buffer in
    /// order, and a call adds the return address and the kernel's saved
    /// registers (six stores a key at k = 7) to the same buffer, so fewer
    /// keys' misses overlap. In an interleaved A/B out of cache, inline
    /// brought this insert from well behind fastbloom's plain filter to
    /// parity with it (BENCHMARKS.md, "bloom-core against peer filter
    /// crates"). Queries (no stores) and shared inserts (locked stores)
    /// gained nothing inline and keep their kernels.
    #[inline(always)]
    pub(crate) fn insert_exclusive(
        &self,
        shape: &Shape,
        lines: LinesMut<'_, AtomicU64>,
        hash: KeyHash,
    ) -> bool {
        if shape.layout == Layout::Standard {
            return standard_exclusive(*shape, lines, hash);
        }
        let args = KernelArgs::for_words(shape, lines.as_lines().words().len());
        #[allow(unsafe_code)]
        // SAFETY: `for_shape` chose the kernel for this CPU.
        unsafe {
            (self.insert_exclusive)(lines, hash, args)
        }
    }
}

/// The standard layout's probes of a key into `words` words, as (word,
/// bit in word). The range comes from the array itself rather than the
/// shape, so that the word index is below `words` for any shape a caller
/// passes: `reduce` maps into `0..words * 64`, and the words come as
/// [`Lines`], which hold at least one block. That is what lets the kernels
/// index unchecked. The bounds check the compiler cannot remove is
/// two instructions of the dozen a probe takes, and out of cache the
/// instruction count is the throughput: 0.87x against 0.95-0.98x of
/// fastbloom's exclusive insert without it, in an interleaved A/B at 10
/// million keys.
#[inline(always)]
fn standard_probes(words: usize, hashes: u32, hash: KeyHash) -> impl Iterator<Item = (usize, u32)> {
    let bits = words as u64 * 64;
    let mut probes = Probes::new(hash);
    (0..hashes).map(move |_| {
        let bit = reduce(probes.next_raw(), bits);
        ((bit / 64) as usize, (bit % 64) as u32)
    })
}

/// Any layout's query, portably.
pub(crate) fn contains<W: Word>(array: Lines<'_, W>, hash: KeyHash, args: KernelArgs) -> bool {
    probe::contains(args.shape(array.words().len()), array, hash)
}

/// The standard layout's query with `K` hashes.
#[inline(always)]
pub(crate) fn contains_standard<const K: u32, W: Word>(
    array: Lines<'_, W>,
    hash: KeyHash,
    args: KernelArgs,
) -> bool {
    debug_assert_eq!((args.layout(), args.hashes()), (Layout::Standard, K));
    let words = array.words();
    standard_probes(words.len(), K, hash).all(|(index, bit)| {
        #[allow(unsafe_code)]
        // SAFETY: `index < words.len()` (see `standard_probes`).
        let word = unsafe { words.get_unchecked(index) };
        word.get() & (1 << bit) != 0
    })
}

/// The standard layout's shared insert with `K` hashes.
#[inline(always)]
pub(crate) fn insert_standard_shared<const K: u32>(
    array: Lines<'_, AtomicU64>,
    hash: KeyHash,
    args: KernelArgs,
) -> bool {
    debug_assert_eq!((args.layout(), args.hashes()), (Layout::Standard, K));
    let shape = Shape {
        layout: Layout::Standard,
        bits: array.words().len() as u64 * 64,
        hashes: K,
    };
    standard_shared(shape, array, hash)
}

/// Any layout's shared insert.
pub(crate) fn insert_shared(array: Lines<'_, AtomicU64>, hash: KeyHash, args: KernelArgs) -> bool {
    let shape = args.shape(array.words().len());
    match shape.layout {
        Layout::Standard => standard_shared(shape, array, hash),
        // A 256-bit bucket's masks leave the rest of its line empty, which
        // sets nothing there.
        Layout::Blocked | Layout::SplitBlock | Layout::SplitBlock256 => {
            let (block, masks) = probe::block_masks(shape, array, hash);
            set_masks_shared(array.block(block), masks)
        }
    }
}

/// Any layout's exclusive insert, portably.
pub(crate) fn insert_exclusive(
    mut array: LinesMut<'_, AtomicU64>,
    hash: KeyHash,
    args: KernelArgs,
) -> bool {
    let shape = args.shape(array.as_lines().words().len());
    match shape.layout {
        Layout::Standard => standard_exclusive(shape, array, hash),
        // A 256-bit bucket's masks leave the rest of its line empty, which
        // sets nothing there.
        Layout::Blocked | Layout::SplitBlock | Layout::SplitBlock256 => {
            let (block, masks) = probe::block_masks(shape, array.as_lines(), hash);
            let mut unset = 0;
            for (word, mask) in array.block_mut(block).iter_mut().zip(masks) {
                unset |= set_bits_exclusive(word, mask);
            }
            unset != 0
        }
    }
}

#[inline(always)]
fn standard_shared(shape: Shape, array: Lines<'_, AtomicU64>, hash: KeyHash) -> bool {
    debug_assert_eq!(shape.bits, array.words().len() as u64 * 64);
    let words = array.words();
    let mut newly = false;
    for (index, bit) in standard_probes(words.len(), shape.hashes, hash) {
        #[allow(unsafe_code)]
        // SAFETY: `index < words.len()` (see `standard_probes`).
        let word = unsafe { words.get_unchecked(index) };
        newly |= set_bits_shared(word, 1 << bit);
    }
    newly
}

#[inline(always)]
fn standard_exclusive(shape: Shape, mut array: LinesMut<'_, AtomicU64>, hash: KeyHash) -> bool {
    debug_assert_eq!(shape.bits, array.as_lines().words().len() as u64 * 64);
    let words = array.words_mut();
    let mut all_set = true;
    for (index, bit) in standard_probes(words.len(), shape.hashes, hash) {
        #[allow(unsafe_code)]
        // SAFETY: `index < words.len()` (see `standard_probes`).
        let word = unsafe { words.get_unchecked_mut(index) };
        all_set &= set_bit_exclusive(word, bit);
    }
    !all_set
}
