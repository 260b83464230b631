//! The one stable key hash every filter is built on, and the probe sequences
//! derived from it.
//!
//! Filters are persisted, so the hash of a key must never change: not across
//! platforms, word sizes, endianness, compiler versions or crate versions.
//! xxh3-128 is specified bit-exactly (xxHash 0.8 format, little-endian reads),
//! and the seed below is fixed forever. Any change to either is a new
//! [`HASH_ID`], and snapshots written with another identity are refused.

use xxhash_rust::xxh3::xxh3_128_with_seed;

/// Seed of the key hash. Changing it silently would turn every persisted
/// filter into one full of false negatives, so it is part of [`HASH_ID`].
pub const HASH_SEED: u64 = 0x7f4a_7c15_9e37_79b9;

/// Identity of the hash function written into snapshots: 1 = xxh3-128 with
/// [`HASH_SEED`].
pub const HASH_ID: u8 = 1;

/// Replaces a zero second hash: with `h2 = 0` double hashing would probe one
/// place k times (the degenerate case). Any odd constant works.
const NONZERO_H2: u64 = 0x9e37_79b9_7f4a_7c15;

/// The 128-bit hash of one key, computed once and reused for the partition
/// choice and every probe of every filter the key meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash {
    h1: u64,
    h2: u64,
}

impl KeyHash {
    /// Hashes a key with the crate's stable hash.
    #[inline]
    #[must_use]
    pub fn of(key: &[u8]) -> Self {
        Self::from_u128(xxh3_128_with_seed(key, HASH_SEED))
    }

    /// Rebuilds a hash from its 128-bit value (as stored by a caller that
    /// persists hashes instead of keys).
    #[inline]
    #[must_use]
    pub const fn from_u128(value: u128) -> Self {
        Self {
            h1: value as u64,
            h2: (value >> 64) as u64,
        }
    }

    /// The 128-bit value, for callers that persist hashes.
    #[inline]
    #[must_use]
    pub const fn to_u128(self) -> u128 {
        ((self.h2 as u128) << 64) | self.h1 as u128
    }

    /// A partition in `0..partitions` chosen from the hash.
    ///
    /// The probes of the standard layout start at the high bits of `h1` and
    /// the blocked layout picks its block from them, so using those bits for
    /// the partition too would confine every key of a partition to one slice
    /// of its filter. The partition comes from a full-avalanche mix of both
    /// halves instead, which is independent of the probe positions.
    #[inline]
    #[must_use]
    pub fn partition(self, partitions: usize) -> usize {
        reduce(mix64(self.h1 ^ self.h2.rotate_left(32)), partitions as u64) as usize
    }

    #[inline]
    pub(crate) fn h1(self) -> u64 {
        self.h1
    }

    /// The second hash with the degenerate zero replaced.
    #[inline]
    pub(crate) fn h2(self) -> u64 {
        if self.h2 == 0 { NONZERO_H2 } else { self.h2 }
    }
}

/// Maps a uniform 64-bit value onto `0..range` with one 128-bit multiply
/// (Lemire's reduction). Unlike `% range` it costs no division, and unlike a
/// 32-bit version it keeps every index reachable for ranges past 2^32.
#[inline]
pub(crate) fn reduce(value: u64, range: u64) -> u64 {
    ((u128::from(value) * u128::from(range)) >> 64) as u64
}

/// The murmur3 / splitmix finaliser: every output bit depends on every input
/// bit.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Enhanced double hashing (Dillinger and Manolios): probe i is
/// `h1 + i*h2 + (i^3 - i)/6` in 64-bit arithmetic, then reduced to the range.
/// The cubic term keeps probes apart even when `h2` is a multiple of the
/// range's period, and reducing the 64-bit sum (not a 32-bit one) is what
/// lets filters beyond 2^32 bits keep their false-positive rate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probes {
    x: u64,
    y: u64,
    i: u64,
}

impl Probes {
    #[inline]
    pub(crate) fn new(hash: KeyHash) -> Self {
        Self {
            x: hash.h1(),
            y: hash.h2(),
            i: 0,
        }
    }

    /// The next probe as a uniform 64-bit value, to be reduced by the caller.
    #[inline]
    pub(crate) fn next_raw(&mut self) -> u64 {
        let current = self.x;
        self.x = self.x.wrapping_add(self.y);
        self.y = self.y.wrapping_add(self.i);
        self.i += 1;
        current
    }
}

/// Bit positions inside a 512-bit block for the blocked layout: 9 bits each,
/// seven from `h2`, then seven from each fresh mix of the hash. The positions
/// are independent and uniform, which is what the blocked layout's
/// false-positive model assumes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockPositions {
    h2: u64,
    seed: u64,
}

/// Positions drawn from one 64-bit stream.
const POSITIONS_PER_STREAM: u32 = 7;

impl BlockPositions {
    #[inline]
    pub(crate) fn new(hash: KeyHash) -> Self {
        Self {
            h2: hash.h2(),
            seed: hash.h1() ^ hash.h2(),
        }
    }

    /// The streams positions 7..14 and 14..21 come from, computed only when
    /// a filter's k needs them.
    #[inline(always)]
    pub(crate) fn streams<const K: u32>(&self) -> [u64; 3] {
        [
            self.h2,
            if K > 7 { self.stream(1) } else { 0 },
            if K > 14 { self.stream(2) } else { 0 },
        ]
    }

    /// Position `index < 21` from the streams of [`streams`](Self::streams).
    #[inline(always)]
    pub(crate) fn position_in(streams: &[u64; 3], index: u32) -> u32 {
        ((streams[(index / POSITIONS_PER_STREAM) as usize] >> (9 * (index % POSITIONS_PER_STREAM)))
            & 511) as u32
    }

    /// Calls `visit` with positions `0..hashes` in order, for hash counts not
    /// known at compile time. Each 64-bit stream is mixed once and shared by
    /// its seven positions.
    #[inline]
    pub(crate) fn for_each(&self, hashes: u32, mut visit: impl FnMut(u32)) {
        let mut source = self.h2;
        for index in 0..hashes {
            let offset = index % POSITIONS_PER_STREAM;
            if offset == 0 && index > 0 {
                source = self.stream(u64::from(index / POSITIONS_PER_STREAM));
            }
            visit(((source >> (9 * offset)) & 511) as u32);
        }
    }

    #[inline]
    fn stream(&self, chunk: u64) -> u64 {
        fresh_stream(self.seed, chunk)
    }
}

/// Stream `index` (from 1) of the block layouts' positions: a fresh mix of
/// the key's seed.
#[inline(always)]
fn fresh_stream(seed: u64, index: u64) -> u64 {
    mix64(seed.wrapping_add(index.wrapping_mul(NONZERO_H2)))
}

/// Bit positions for the split-block layouts, one bit in each of eight
/// words from every stream: the block's 64-bit words get six bits of a
/// stream each ([`bit_in`](Self::bit_in)), a 256-bit bucket's 32-bit words
/// five ([`bit_in_bucket`](Self::bit_in_bucket)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitPositions {
    h2: u64,
    seed: u64,
}

impl SplitPositions {
    /// The split-block layout's streams: stream 0 is `h2` with the
    /// degenerate zero replaced, as for [`BlockPositions`].
    #[inline]
    pub(crate) fn new(hash: KeyHash) -> Self {
        let positions = BlockPositions::new(hash);
        Self {
            h2: positions.h2,
            seed: positions.seed,
        }
    }

    /// The 256-bit split-block layout's streams: stream 0 is `h2` as it is.
    /// A zero `h2` only puts the key's bits at the bottom of its words (the
    /// degenerate case is double hashing's, not this layout's), and a
    /// query saves the test for it.
    #[inline]
    pub(crate) fn for_buckets(hash: KeyHash) -> Self {
        Self {
            h2: hash.h2,
            seed: hash.h1 ^ hash.h2,
        }
    }

    /// The `STREAMS` streams, `k / 8` of them.
    #[inline(always)]
    pub(crate) fn streams<const STREAMS: usize>(&self) -> [u64; STREAMS] {
        std::array::from_fn(|index| self.stream(index))
    }

    /// Stream `index`: further streams (k above 8) are fresh mixes of the
    /// hash, as [`BlockPositions`]' are.
    #[inline(always)]
    pub(crate) fn stream(&self, index: usize) -> u64 {
        if index == 0 {
            self.h2
        } else {
            fresh_stream(self.seed, index as u64)
        }
    }

    /// The bit stream `stream` sets in word `word` of the block.
    #[inline(always)]
    pub(crate) fn bit_in(stream: u64, word: usize) -> u32 {
        ((stream >> (6 * word)) & 63) as u32
    }

    /// The bit stream `stream` sets in 32-bit word `word` (0..8) of a
    /// 256-bit bucket, as a bit of the bucket's 64-bit word `word / 2`
    /// (the 32-bit word is its low half when `word` is even). The 5-bit
    /// fields of the even words are bits 0-19 of the stream, those of the
    /// odd words bits 32-51: a 64-bit broadcast of the stream seen as eight
    /// 32-bit lanes alternates its halves, so one vector shift with counts
    /// 0, 0, 5, 5, 10, 10, 15, 15 brings every lane's field down.
    #[inline(always)]
    pub(crate) fn bit_in_bucket(stream: u64, word: usize) -> u32 {
        let half = 32 * (word as u32 & 1);
        half + ((stream >> (half + 5 * (word as u32 >> 1))) & 31) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned outputs: if a dependency update or a platform changed the hash,
    /// every persisted filter would silently go wrong. These values must
    /// never change; a failure here means the hash identity changed.
    #[test]
    fn hash_is_pinned() {
        assert_eq!(
            xxhash_rust::xxh3::xxh3_64(b""),
            0x2d06_8005_38d3_94c2,
            "xxh3-64 of the empty input (reference test vector)"
        );
        // Values from the reference C implementation of XXH3_128bits_withSeed
        // (python-xxhash) with HASH_SEED; the 300-byte key takes xxh3's
        // long-input path.
        let long_key = [b'x'; 300];
        let pinned: [(&[u8], u128); 4] = [
            (b"", 0x3ca3_3f9a_a728_469c_8dca_da9a_176e_cf45),
            (
                b"https://example.com/",
                0x7cf3_dab3_3137_4402_5b2c_9600_f363_233e,
            ),
            (b"a", 0xe00c_96c6_e41f_c6f7_d33e_4b6f_f877_e2c9),
            (&long_key, 0x0762_2b35_6c10_2eb1_89f8_d592_15e3_683d),
        ];
        for (key, value) in pinned {
            let got = KeyHash::of(key).to_u128();
            assert_eq!(got, value, "key {key:?}: got {got:#034x}");
        }
    }

    #[test]
    fn zero_h2_is_replaced() {
        let hash = KeyHash::from_u128(12345);
        assert_ne!(hash.h2(), 0);
        let mut probes = Probes::new(hash);
        let first = probes.next_raw();
        let second = probes.next_raw();
        assert_ne!(reduce(first, 1 << 20), reduce(second, 1 << 20));
    }

    #[test]
    fn reduce_covers_ranges_beyond_u32() {
        let range = (1_u64 << 33) + 12345;
        assert_eq!(reduce(u64::MAX, range), range - 1);
        assert_eq!(reduce(0, range), 0);
        // Top half of the range is reached by top half of the inputs.
        assert!(reduce(1 << 63, range) >= range / 2 - 1);
    }

    /// The 256-bit split-block layout's fields are persisted: even words
    /// take bits 0-19 of the stream, odd words bits 32-51, five each, as
    /// bits of the low and high halves of the bucket's 64-bit words.
    #[test]
    fn bucket_fields_are_pinned() {
        assert_eq!(SplitPositions::bit_in_bucket(0b11111 << 5, 2), 31);
        assert_eq!(SplitPositions::bit_in_bucket(0b00001 << 37, 3), 32 + 1);
        assert_eq!(SplitPositions::bit_in_bucket(0b10110 << 15, 6), 0b10110);
        assert_eq!(
            SplitPositions::bit_in_bucket(0b10110 << 47, 7),
            32 + 0b10110
        );
        assert_eq!(SplitPositions::bit_in_bucket(!0 ^ (0b11111 << 32), 1), 32);
        assert_eq!(SplitPositions::bit_in_bucket(1 << 20, 0), 0);
    }

    #[test]
    fn unrolled_positions_match_the_general_ones() {
        let positions = BlockPositions::new(KeyHash::of(b"positions"));
        let streams = positions.streams::<21>();
        let mut general = Vec::new();
        positions.for_each(21, |position| general.push(position));
        let unrolled: Vec<u32> = (0..21)
            .map(|index| BlockPositions::position_in(&streams, index))
            .collect();
        assert_eq!(general, unrolled);
        // Past the unrolled range the streams keep coming.
        let mut long = Vec::new();
        positions.for_each(64, |position| long.push(position));
        assert_eq!(long[..21], general[..]);
        assert!(long[21..].iter().any(|&p| p != long[21]));
    }

    #[test]
    fn round_trip_u128() {
        let hash = KeyHash::of(b"round trip");
        assert_eq!(KeyHash::from_u128(hash.to_u128()), hash);
    }
}
