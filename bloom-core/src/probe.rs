//! Where a key's bits are and whether they are set: the probe code of every
//! layout, written once over [`Word`] so that the concurrent filter (atomic
//! words) and the frozen one (plain words) answer identically. The query
//! path is `inline(always)` so that `accel` gets all of it compiled with
//! AVX2 and BMI2 (a target-feature function only speeds up what is inlined
//! into it).

use crate::bits::{Lines, WORDS_PER_BLOCK};
use crate::hash::{BlockPositions, KeyHash, Probes, SplitPositions, reduce};
use crate::health::FilterHealth;
use crate::layout::Layout;
use crate::model::{
    self, BLOCK_BITS, SPLIT_256_BUCKET_BITS, SPLIT_256_WORD_BITS, SPLIT_WORD_BITS, SPLIT_WORDS,
};
use crate::sync::{AtomicU64, Ordering, prefetch};

/// A 64-bit word a probe can read.
pub(crate) trait Word {
    fn get(&self) -> u64;
}

impl Word for AtomicU64 {
    #[inline(always)]
    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl Word for u64 {
    #[inline(always)]
    fn get(&self) -> u64 {
        *self
    }
}

/// A filter's layout, size and hash count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) layout: Layout,
    pub(crate) bits: u64,
    pub(crate) hashes: u32,
}

/// The block a key of a block layout lives in.
#[inline(always)]
pub(crate) fn block_of<W>(array: Lines<'_, W>, hash: KeyHash) -> usize {
    block_index(array.blocks() as u64, hash)
}

/// The block a key lives in among `blocks`; always below `blocks` (when
/// `blocks > 0`), which the vector kernels' unchecked addressing relies on.
#[inline(always)]
pub(crate) fn block_index(blocks: u64, hash: KeyHash) -> usize {
    reduce(hash.h1(), blocks) as usize
}

/// Words in one 256-bit bucket of [`Layout::SplitBlock256`].
pub(crate) const WORDS_PER_BUCKET: usize = 4;

/// The 256-bit bucket a key of [`Layout::SplitBlock256`] lives in among
/// `buckets`; always below `buckets` (when `buckets > 0`), which the vector
/// kernels' unchecked addressing relies on.
#[inline(always)]
pub(crate) fn bucket_index(buckets: u64, hash: KeyHash) -> usize {
    reduce(hash.h1(), buckets) as usize
}

/// The key's bucket as (line, first word of the bucket in the line).
#[inline(always)]
fn bucket_of<W>(array: Lines<'_, W>, hash: KeyHash) -> (usize, usize) {
    let bucket = bucket_index(array.blocks() as u64 * 2, hash);
    (bucket / 2, (bucket % 2) * WORDS_PER_BUCKET)
}

/// The key's bucket's four words.
#[inline(always)]
fn bucket<W>(array: Lines<'_, W>, hash: KeyHash) -> &[W] {
    let (line, first) = bucket_of(array, hash);
    &array.block(line)[first..first + WORDS_PER_BUCKET]
}

/// Whether every bit of the key is set.
#[inline(always)]
pub(crate) fn contains<W: Word>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> bool {
    match shape.layout {
        Layout::Standard => contains_standard(shape, array, hash),
        Layout::Blocked => contains_blocked(shape, array, hash),
        // k = 8, the common case, inline: one bit test per word.
        Layout::SplitBlock if shape.hashes == SPLIT_WORDS => split_all_set::<1, W>(
            array.block(block_of(array, hash)),
            &SplitPositions::new(hash),
        ),
        Layout::SplitBlock => contains_split(shape, array, hash),
        Layout::SplitBlock256 => contains_split_256(shape, array, hash),
    }
}

#[inline(always)]
fn contains_standard<W: Word>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> bool {
    let words = array.words();
    let mut probes = Probes::new(hash);
    for _ in 0..shape.hashes {
        let bit = reduce(probes.next_raw(), shape.bits);
        if words[(bit / 64) as usize].get() & (1 << (bit % 64)) == 0 {
            return false;
        }
    }
    true
}

#[inline(always)]
fn contains_blocked<W: Word>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> bool {
    let block = array.block(block_of(array, hash));
    let positions = BlockPositions::new(hash);
    // Specialised for the hash counts sizing produces (k = 21 is p near
    // 1e-6); the general loop serves the rest.
    macro_rules! unrolled {
        ($($k:literal)*) => {
            match shape.hashes {
                $($k => return all_set::<$k, W>(block, &positions),)*
                _ => {}
            }
        };
    }
    unrolled!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21);
    let mut all = true;
    positions.for_each(shape.hashes, |position| {
        all &= block[(position / 64) as usize].get() & (1 << (position % 64)) != 0;
    });
    all
}

/// Whether every position is set in the block. Every position is tested,
/// without an early exit: after the first load the line is in L1, so the k
/// loads cost a few cycles, while an exit at a random probe mispredicts a
/// branch for most absent keys (measured in cache, an early exit made
/// absent keys about twice as slow as present ones). Each position
/// is used as soon as it is computed, which keeps them in registers.
#[inline(always)]
fn all_set<const K: u32, W: Word>(
    block: &[W; WORDS_PER_BLOCK],
    positions: &BlockPositions,
) -> bool {
    let streams = positions.streams::<K>();
    let mut all = u64::MAX;
    for index in 0..K {
        let position = BlockPositions::position_in(&streams, index);
        all &= block[(position / 64) as usize].get() >> (position % 64);
    }
    all & 1 == 1
}

#[inline(always)]
fn contains_split<W: Word>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> bool {
    let block = array.block(block_of(array, hash));
    let positions = SplitPositions::new(hash);
    macro_rules! unrolled {
        ($($streams:literal)*) => {
            match shape.hashes / SPLIT_WORDS {
                $($streams => split_all_set::<$streams, W>(block, &positions),)*
                _ => unreachable!("k is a multiple of 8 up to 64"),
            }
        };
    }
    unrolled!(1 2 3 4 5 6 7 8)
}

#[inline(always)]
fn contains_split_256<W: Word>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> bool {
    let words = bucket(array, hash);
    let positions = SplitPositions::for_buckets(hash);
    macro_rules! unrolled {
        ($($streams:literal)*) => {
            match shape.hashes / SPLIT_WORDS {
                $($streams => {
                    let streams = positions.streams::<$streams>();
                    let mut all = u64::MAX;
                    for (lane, word) in (0..SPLIT_WORDS as usize).zip(words.iter().flat_map(|word| [word, word])) {
                        let word = word.get();
                        for stream in streams {
                            all &= word >> SplitPositions::bit_in_bucket(stream, lane);
                        }
                    }
                    all & 1 == 1
                })*
                _ => unreachable!("k is a multiple of 8 up to 64"),
            }
        };
    }
    unrolled!(1 2 3 4 5 6 7 8)
}

/// Whether each word of the block has the bit every stream names set. No
/// early exit, for the reason [`all_set`] gives; a right shift by the bit
/// position brings the tested bit to bit 0. Over plain words with AVX2 this
/// loop compiles to a few vector shifts (see `FrozenBloomFilter`).
#[inline(always)]
pub(crate) fn split_all_set<const STREAMS: usize, W: Word>(
    block: &[W; WORDS_PER_BLOCK],
    positions: &SplitPositions,
) -> bool {
    let streams = positions.streams::<STREAMS>();
    let mut all = u64::MAX;
    for (index, word) in block.iter().enumerate() {
        let word = word.get();
        for stream in streams {
            all &= word >> SplitPositions::bit_in(stream, index);
        }
    }
    all & 1 == 1
}

/// The key's block and the bits it sets in each word (block layouts).
#[inline(always)]
pub(crate) fn block_masks<W>(
    shape: Shape,
    array: Lines<'_, W>,
    hash: KeyHash,
) -> (usize, [u64; WORDS_PER_BLOCK]) {
    let mut masks = [0_u64; WORDS_PER_BLOCK];
    if shape.layout == Layout::SplitBlock256 {
        // The line's words outside the key's bucket keep empty masks.
        let (line, first) = bucket_of(array, hash);
        let positions = SplitPositions::for_buckets(hash);
        for stream in 0..(shape.hashes / SPLIT_WORDS) as usize {
            let stream = positions.stream(stream);
            for lane in 0..SPLIT_WORDS as usize {
                masks[first + lane / 2] |= 1 << SplitPositions::bit_in_bucket(stream, lane);
            }
        }
        return (line, masks);
    }
    let block = block_of(array, hash);
    if shape.layout == Layout::SplitBlock {
        let positions = SplitPositions::new(hash);
        macro_rules! unrolled {
            ($($streams:literal)*) => {
                match shape.hashes / SPLIT_WORDS {
                    $($streams => {
                        for stream in positions.streams::<$streams>() {
                            for (word, mask) in masks.iter_mut().enumerate() {
                                *mask |= 1 << SplitPositions::bit_in(stream, word);
                            }
                        }
                    })*
                    _ => unreachable!("k is a multiple of 8 up to 64"),
                }
            };
        }
        unrolled!(1 2 3 4 5 6 7 8);
    } else {
        BlockPositions::new(hash).for_each(shape.hashes, |position| {
            masks[(position / 64) as usize] |= 1 << (position % 64);
        });
    }
    (block, masks)
}

/// The first word of the key's line (block layouts) or of its first probe
/// (standard layout), for prefetching.
#[inline(always)]
pub(crate) fn first_word<W>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> &W {
    match shape.layout {
        Layout::Standard => {
            &array.words()[(reduce(Probes::new(hash).next_raw(), shape.bits) / 64) as usize]
        }
        Layout::Blocked | Layout::SplitBlock => &array.block(block_of(array, hash))[0],
        Layout::SplitBlock256 => &bucket(array, hash)[0],
    }
}

/// The second probe's word (standard layout only): an absent key is usually
/// refuted by its first two probes, so a batch prefetches both.
#[inline(always)]
pub(crate) fn second_word<W>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) -> Option<&W> {
    if shape.layout != Layout::Standard || shape.hashes < 2 {
        return None;
    }
    let mut probes = Probes::new(hash);
    probes.next_raw();
    Some(&array.words()[(reduce(probes.next_raw(), shape.bits) / 64) as usize])
}

/// Runs `each` over the hashes in order, one answer per hash into `out`
/// (cleared first), calling `prefetch` for the key `ahead` places on first.
///
/// Working through keys one by one leaves the memory system idle while each
/// probe's cache miss is served. Prefetching the lines of a key a fixed
/// distance ahead overlaps the misses of upcoming keys with the current
/// key's arithmetic: a prefetch retires at once, where a load (or a locked
/// write) holds up the instruction window until its miss is served.
/// `state` is what both closures work on, passed to each call so that
/// `each` can take it exclusively.
#[inline(always)]
pub(crate) fn batch<S: ?Sized>(
    state: &mut S,
    hashes: &[KeyHash],
    out: &mut Vec<bool>,
    ahead: usize,
    prefetch: impl Fn(&S, KeyHash),
    mut each: impl FnMut(&mut S, KeyHash) -> bool,
) {
    // Sized first and written in place: a push per key would also store
    // the vector's length, a store per key more to queue behind the misses.
    out.clear();
    out.resize(hashes.len(), false);
    for &hash in hashes.iter().take(ahead) {
        prefetch(state, hash);
    }
    for (index, (answer, &hash)) in out.iter_mut().zip(hashes).enumerate() {
        if let Some(&upcoming) = hashes.get(index + ahead) {
            prefetch(state, upcoming);
        }
        *answer = each(state, hash);
    }
}

/// Answers many hashes through `answer` (see [`batch`]). Standard layout:
/// the lines of the first two probes are prefetched (an absent key is
/// usually refuted by them); block layouts: the key's one line.
#[inline(always)]
pub(crate) fn contains_batch<W>(
    shape: Shape,
    array: Lines<'_, W>,
    hashes: &[KeyHash],
    out: &mut Vec<bool>,
    mut answer: impl FnMut(KeyHash) -> bool,
) {
    // Far enough ahead to cover a memory latency at a few nanoseconds of
    // arithmetic per key, near enough for the lines to still be in L1.
    const AHEAD: usize = 16;
    let prefetch_key = |(): &(), hash: KeyHash| {
        prefetch(first_word(shape, array, hash));
        if let Some(word) = second_word(shape, array, hash) {
            prefetch(word);
        }
    };
    batch(&mut (), hashes, out, AHEAD, prefetch_key, |(), hash| {
        answer(hash)
    });
}

/// Inserts many hashes through `insert` (see [`batch`]), prefetching every
/// line each key writes: one loop per kind of prefetch, so that neither
/// tests the layout per key. `lines` gives the words of `state`.
#[inline(always)]
pub(crate) fn insert_batch<S, W>(
    shape: Shape,
    state: &mut S,
    hashes: &[KeyHash],
    out: &mut Vec<bool>,
    lines: impl for<'a> Fn(&'a S) -> Lines<'a, W>,
    insert: impl FnMut(&mut S, KeyHash) -> bool,
) {
    let ahead = insert_batch_ahead(shape);
    if shape.layout == Layout::Standard {
        let prefetch = |state: &S, hash| prefetch_probes(shape, lines(state), hash);
        batch(state, hashes, out, ahead, prefetch, insert);
    } else {
        let prefetch = |state: &S, hash| prefetch_line(shape, lines(state), hash);
        batch(state, hashes, out, ahead, prefetch, insert);
    }
}

/// How many keys ahead a batch insert prefetches. An insert writes every
/// line it touches, so the standard layout prefetches all k of its lines
/// and runs fewer keys ahead than a block layout with its one line. Chosen
/// in an interleaved A/B out of cache (BENCHMARKS.md, "Batch queries and
/// inserts"): for each layout the smallest distance past which going
/// further ahead gained nothing measurable.
fn insert_batch_ahead(shape: Shape) -> usize {
    if shape.layout == Layout::Standard {
        16
    } else {
        32
    }
}

/// Prefetches the lines of all the key's probes (standard layout: an
/// insert writes every one).
#[inline(always)]
fn prefetch_probes<W>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) {
    debug_assert_eq!(shape.layout, Layout::Standard);
    let words = array.words();
    let mut probes = Probes::new(hash);
    for _ in 0..shape.hashes {
        prefetch(&words[(reduce(probes.next_raw(), shape.bits) / 64) as usize]);
    }
}

/// Prefetches the key's one line (block layouts).
#[inline(always)]
fn prefetch_line<W>(shape: Shape, array: Lines<'_, W>, hash: KeyHash) {
    debug_assert_ne!(shape.layout, Layout::Standard);
    prefetch(first_word(shape, array, hash));
}

/// Set bits and the false-positive rate they give, in one pass over the
/// array (the block layouts' rates need each block's count anyway).
pub(crate) fn ones_and_fp_rate<W: Word>(shape: Shape, array: Lines<'_, W>) -> (u64, f64) {
    let k = shape.hashes as i32;
    let words = array.words();
    match shape.layout {
        Layout::Standard => {
            let ones = ones(array);
            (ones, (ones as f64 / shape.bits as f64).powi(k))
        }
        Layout::Blocked => {
            let (ones, sum) =
                words
                    .chunks_exact(WORDS_PER_BLOCK)
                    .fold((0_u64, 0.0_f64), |(ones, sum), block| {
                        let in_block: u32 = block.iter().map(|word| word.get().count_ones()).sum();
                        (
                            ones + u64::from(in_block),
                            sum + (f64::from(in_block) / BLOCK_BITS as f64).powi(k),
                        )
                    });
            (ones, sum / array.blocks() as f64)
        }
        Layout::SplitBlock | Layout::SplitBlock256 => {
            // A key's bits fall in one unit (block or bucket), k/8 in each
            // of its eight split words: its rate there is the product over
            // those words of fill^(k/8).
            let per_word = (shape.hashes / SPLIT_WORDS) as i32;
            let (unit_words, word_bits) = if shape.layout == Layout::SplitBlock {
                (WORDS_PER_BLOCK, SPLIT_WORD_BITS)
            } else {
                (WORDS_PER_BUCKET, SPLIT_256_WORD_BITS)
            };
            let word_fp = |ones: u32| (f64::from(ones) / word_bits as f64).powi(per_word);
            // Set bits and rate factor of one 64-bit word: one split word,
            // or two 32-bit ones.
            let of_word = |word: u64| {
                if word_bits == 64 {
                    let ones = word.count_ones();
                    (ones, word_fp(ones))
                } else {
                    let (low, high) = ((word as u32).count_ones(), (word >> 32).count_ones());
                    (low + high, word_fp(low) * word_fp(high))
                }
            };
            let (ones, sum) =
                words
                    .chunks_exact(unit_words)
                    .fold((0_u64, 0.0_f64), |(ones, sum), unit| {
                        let (in_unit, fp) =
                            unit.iter().fold((0_u32, 1.0_f64), |(in_unit, fp), word| {
                                let (in_word, word_fp) = of_word(word.get());
                                (in_unit + in_word, fp * word_fp)
                            });
                        (ones + u64::from(in_unit), sum + fp)
                    });
            (ones, sum / (words.len() / unit_words) as f64)
        }
    }
}

/// Every health figure at once.
pub(crate) fn health<W: Word>(
    shape: Shape,
    array: Lines<'_, W>,
    memory_bytes: u64,
) -> FilterHealth {
    let (ones, estimated_fp_rate) = ones_and_fp_rate(shape, array);
    FilterHealth {
        layout: shape.layout,
        bits: shape.bits,
        hashes: shape.hashes,
        ones,
        fill_ratio: ones as f64 / shape.bits as f64,
        estimated_fp_rate,
        estimated_items: items_from_ones(shape, ones),
        memory_bytes,
    }
}

/// Bits set, counted exactly.
pub(crate) fn ones<W: Word>(array: Lines<'_, W>) -> u64 {
    array
        .words()
        .iter()
        .map(|word| u64::from(word.get().count_ones()))
        .sum()
}

/// Distinct keys inserted, estimated from the set bits (see
/// `BloomFilter::estimated_items` for the models).
pub(crate) fn items_from_ones(shape: Shape, ones: u64) -> f64 {
    match shape.layout {
        Layout::Standard => model::items_from_ones(shape.bits, shape.hashes, ones),
        Layout::Blocked | Layout::SplitBlock | Layout::SplitBlock256 => {
            // Draws a key makes into each bin set, bins in a set, and the
            // number of blocks (or buckets) a key chooses from.
            let (draws, bins, blocks) = match shape.layout {
                Layout::Blocked => (shape.hashes, BLOCK_BITS, shape.bits / BLOCK_BITS),
                Layout::SplitBlock => (
                    shape.hashes / SPLIT_WORDS,
                    SPLIT_WORD_BITS,
                    shape.bits / BLOCK_BITS,
                ),
                _ => (
                    shape.hashes / SPLIT_WORDS,
                    SPLIT_256_WORD_BITS,
                    shape.bits / SPLIT_256_BUCKET_BITS,
                ),
            };
            let blocks = blocks as f64;
            let ones = ones.min(shape.bits - 1) as f64;
            let fill = ones / shape.bits as f64;
            let per_key = -(f64::from(draws) * (-1.0 / bins as f64).ln_1p()).exp_m1();
            -blocks * (-fill).ln_1p() / per_key
        }
    }
}

/// The false-positive rate the layout's model predicts after `items` keys.
pub(crate) fn model_fp_rate(shape: Shape, items: u64) -> f64 {
    match shape.layout {
        Layout::Standard => model::standard_fp_rate(shape.bits, shape.hashes, items),
        Layout::Blocked => model::blocked_fp_rate(shape.bits, shape.hashes, items),
        Layout::SplitBlock => model::split_block_fp_rate(shape.bits, shape.hashes, items),
        Layout::SplitBlock256 => model::split_block_256_fp_rate(shape.bits, shape.hashes, items),
    }
}
