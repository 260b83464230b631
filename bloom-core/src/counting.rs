//! [`CountingBloomFilter`]: 4-bit saturating counters, so keys can be removed.

use crate::error::{FilterError, RemoveError, SnapshotError};
use crate::filter::{Layout, MAX_BITS};
use crate::hash::{KeyHash, Probes, reduce};
use crate::health::FilterHealth;
use crate::model::{self, MAX_HASHES};
use crate::snapshot::{self, Header, Kind};
use crate::sync::{AtomicU64, Ordering};

const COUNTER_BITS: u64 = 4;
const COUNTERS_PER_WORD: u64 = 64 / COUNTER_BITS;
/// A counter at this value has lost count and is never changed again.
pub const SATURATED: u8 = 15;
const MAX_COUNTERS: u64 = MAX_BITS / COUNTER_BITS;

/// A Bloom filter of 4-bit counters: insert adds one to each of a key's k
/// counters, remove takes one away, and a key is present while all its
/// counters are above zero.
///
/// # Saturation
///
/// A counter that reaches 15 no longer knows how many keys share it, so it
/// stays at 15 forever: inserts leave it there, and removes never decrement
/// it. Decrementing a saturated counter (as some implementations do) can
/// bring it to zero while keys that use it remain, which is a false negative.
/// The cost of saturation is only that such a counter never frees up.
///
/// # Removing keys that were never inserted
///
/// [`remove`](Self::remove) refuses a key that is certainly absent (one of
/// its counters is zero). It cannot detect a false positive: a key never
/// inserted whose counters are all above zero because other keys share them.
/// Removing such a key decrements counters that belong to other keys and can
/// bring one to zero, after which those keys read as absent: a false
/// negative. Callers must therefore only remove keys they know were
/// inserted. The frontier does: it removes a URL from its filter only in the
/// same step that deletes the URL's row from its store, so every key it
/// removes is one the store proved was inserted.
///
/// Concurrent inserts are safe; a remove must not race another remove of the
/// same key (both would pass the presence check and the key would be taken
/// away twice, which is the same hazard as removing a false positive).
///
/// ```
/// use bloom_core::CountingBloomFilter;
///
/// let filter = CountingBloomFilter::new(1_000, 0.01)?;
/// filter.insert(b"a");
/// assert!(filter.contains(b"a"));
/// filter.remove(b"a")?;
/// assert!(!filter.contains(b"a"));
/// assert!(filter.remove(b"a").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CountingBloomFilter {
    counters: u64,
    hashes: u32,
    words: Box<[AtomicU64]>,
    nonzero: AtomicU64,
    saturated: AtomicU64,
}

impl std::fmt::Debug for CountingBloomFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingBloomFilter")
            .field("counters", &self.counters)
            .field("hashes", &self.hashes)
            .field("nonzero", &self.nonzero())
            .field("saturated", &self.saturated())
            .finish()
    }
}

impl CountingBloomFilter {
    /// Sized like a standard filter: one counter where that would have one
    /// bit, so four times the memory.
    pub fn new(expected_items: u64, fp_rate: f64) -> Result<Self, FilterError> {
        if expected_items == 0 {
            return Err(FilterError::ZeroExpectedItems);
        }
        if !(fp_rate > 0.0 && fp_rate < 1.0) {
            return Err(FilterError::InvalidFpRate(fp_rate));
        }
        let counters = model::optimal_bits(expected_items, fp_rate).ceil();
        if counters > MAX_COUNTERS as f64 {
            return Err(FilterError::TooLarge {
                bits: (counters * COUNTER_BITS as f64) as u64,
            });
        }
        let counters = counters as u64;
        Self::with_params(counters, model::optimal_hashes(counters, expected_items))
    }

    /// Explicit parameters; `counters` is rounded up to a multiple of 16.
    pub fn with_params(counters: u64, hashes: u32) -> Result<Self, FilterError> {
        if counters == 0 {
            return Err(FilterError::ZeroBits);
        }
        if counters > MAX_COUNTERS {
            return Err(FilterError::TooLarge {
                bits: counters.saturating_mul(COUNTER_BITS),
            });
        }
        if hashes == 0 || hashes > MAX_HASHES {
            return Err(FilterError::InvalidHashes(hashes));
        }
        let words = counters.div_ceil(COUNTERS_PER_WORD);
        Ok(Self {
            counters: words * COUNTERS_PER_WORD,
            hashes,
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            nonzero: AtomicU64::new(0),
            saturated: AtomicU64::new(0),
        })
    }

    /// Adds one to each of the key's counters; `true` when one of them was
    /// zero, i.e. the key was certainly absent before.
    pub fn insert(&self, key: &[u8]) -> bool {
        self.insert_hashed(KeyHash::of(key))
    }

    /// [`insert`](Self::insert) with a precomputed hash.
    pub fn insert_hashed(&self, hash: KeyHash) -> bool {
        let mut was_absent = false;
        let mut probes = Probes::new(hash);
        for _ in 0..self.hashes {
            let index = reduce(probes.next_raw(), self.counters);
            let before =
                self.update_counter(index, |count| (count < SATURATED).then_some(count + 1));
            was_absent |= before == 0;
            if before == 0 {
                self.nonzero.fetch_add(1, Ordering::Relaxed);
            }
            if before == SATURATED - 1 {
                self.saturated.fetch_add(1, Ordering::Relaxed);
            }
        }
        was_absent
    }

    /// Whether the key may be present (all its counters above zero).
    #[must_use]
    pub fn contains(&self, key: &[u8]) -> bool {
        self.contains_hashed(KeyHash::of(key))
    }

    /// [`contains`](Self::contains) with a precomputed hash.
    #[must_use]
    pub fn contains_hashed(&self, hash: KeyHash) -> bool {
        let mut probes = Probes::new(hash);
        (0..self.hashes).all(|_| self.counter(reduce(probes.next_raw(), self.counters)) > 0)
    }

    /// Takes one away from each of the key's counters, saturated ones
    /// excepted. Refused, changing nothing, when the key is certainly absent.
    /// See the type's docs: only remove keys that were inserted.
    pub fn remove(&self, key: &[u8]) -> Result<(), RemoveError> {
        self.remove_hashed(KeyHash::of(key))
    }

    /// [`remove`](Self::remove) with a precomputed hash.
    pub fn remove_hashed(&self, hash: KeyHash) -> Result<(), RemoveError> {
        if !self.contains_hashed(hash) {
            return Err(RemoveError::NotPresent);
        }
        let mut probes = Probes::new(hash);
        for _ in 0..self.hashes {
            let index = reduce(probes.next_raw(), self.counters);
            let before = self.update_counter(index, |count| {
                (count > 0 && count < SATURATED).then(|| count - 1)
            });
            if before == 1 {
                self.nonzero.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The value of one counter (for tests and inspection).
    #[must_use]
    pub fn counter(&self, index: u64) -> u8 {
        let word = self.words[(index / COUNTERS_PER_WORD) as usize].load(Ordering::Relaxed);
        ((word >> ((index % COUNTERS_PER_WORD) * COUNTER_BITS)) & 0xF) as u8
    }

    /// The indexes of a key's counters, in probe order (a counter may appear
    /// twice).
    pub fn counter_indexes(&self, key: &[u8]) -> impl Iterator<Item = u64> + '_ {
        let mut probes = Probes::new(KeyHash::of(key));
        (0..self.hashes).map(move |_| reduce(probes.next_raw(), self.counters))
    }

    /// Applies `change` to one counter atomically; returns its value before.
    /// `change` returning `None` leaves the counter as it is.
    fn update_counter(&self, index: u64, change: impl Fn(u8) -> Option<u8>) -> u8 {
        let word = &self.words[(index / COUNTERS_PER_WORD) as usize];
        let shift = (index % COUNTERS_PER_WORD) * COUNTER_BITS;
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let count = ((current >> shift) & 0xF) as u8;
            let Some(new_count) = change(count) else {
                return count;
            };
            let new = (current & !(0xF << shift)) | (u64::from(new_count) << shift);
            match word.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return count,
                Err(actual) => current = actual,
            }
        }
    }

    /// Number of counters (m).
    #[must_use]
    pub fn counters(&self) -> u64 {
        self.counters
    }

    /// Counters per key (k).
    #[must_use]
    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    /// Counters above zero, exact.
    #[must_use]
    pub fn nonzero(&self) -> u64 {
        self.nonzero.load(Ordering::Relaxed)
    }

    /// Counters stuck at 15, exact.
    #[must_use]
    pub fn saturated(&self) -> u64 {
        self.saturated.load(Ordering::Relaxed)
    }

    /// Fraction of counters above zero.
    #[must_use]
    pub fn fill_ratio(&self) -> f64 {
        self.nonzero() as f64 / self.counters as f64
    }

    /// `fill^k`.
    #[must_use]
    pub fn estimated_fp_rate(&self) -> f64 {
        self.fill_ratio().powi(self.hashes as i32)
    }

    /// Keys present (inserted and not removed), from the fill ratio.
    #[must_use]
    pub fn estimated_items(&self) -> f64 {
        model::items_from_ones(self.counters, self.hashes, self.nonzero())
    }

    /// Bytes of memory held.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        (std::mem::size_of_val::<[AtomicU64]>(&self.words) + std::mem::size_of::<Self>()) as u64
    }

    /// Every health figure at once; `bits` and `ones` count counters.
    #[must_use]
    pub fn health(&self) -> FilterHealth {
        FilterHealth {
            layout: Layout::Standard,
            bits: self.counters,
            hashes: self.hashes,
            ones: self.nonzero(),
            fill_ratio: self.fill_ratio(),
            estimated_fp_rate: self.estimated_fp_rate(),
            estimated_items: self.estimated_items(),
            memory_bytes: self.memory_bytes(),
        }
    }

    /// Writes a snapshot (format in [`crate::snapshot`]).
    pub fn write_snapshot(&self, writer: impl std::io::Write) -> Result<(), SnapshotError> {
        let header = Header {
            kind: Kind::Counting,
            layout: Layout::Standard,
            bits: self.counters,
            hashes: self.hashes,
            words: self.words.len() as u64,
        };
        snapshot::write(
            writer,
            header,
            self.words.iter().map(|w| w.load(Ordering::Relaxed)),
        )
    }

    /// The snapshot as bytes.
    #[must_use]
    pub fn to_snapshot_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(snapshot::snapshot_len(self.words.len() as u64) as usize);
        // Writing to a Vec cannot fail.
        let _ = self.write_snapshot(&mut out);
        out
    }

    /// Reads a snapshot written by [`write_snapshot`](Self::write_snapshot).
    pub fn read_snapshot(reader: impl std::io::Read) -> Result<Self, SnapshotError> {
        let (header, words) = snapshot::read(reader, Kind::Counting, check_counting_shape)?;
        Ok(Self::from_words(header, &words))
    }

    /// Reads a snapshot from bytes; bytes after its end are an error.
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let (header, words) = snapshot::read_bytes(bytes, Kind::Counting, check_counting_shape)?;
        Ok(Self::from_words(header, &words))
    }

    fn from_words(header: Header, words: &[u64]) -> Self {
        let mut nonzero = 0;
        let mut saturated = 0;
        for &word in words {
            for slot in 0..COUNTERS_PER_WORD {
                match (word >> (slot * COUNTER_BITS)) & 0xF {
                    0 => {}
                    15 => {
                        nonzero += 1;
                        saturated += 1;
                    }
                    _ => nonzero += 1,
                }
            }
        }
        Self {
            counters: header.bits,
            hashes: header.hashes,
            words: words.iter().map(|&w| AtomicU64::new(w)).collect(),
            nonzero: AtomicU64::new(nonzero),
            saturated: AtomicU64::new(saturated),
        }
    }
}

fn check_counting_shape(header: &Header) -> Result<(), String> {
    if header.layout != Layout::Standard {
        return Err(format!("counting filters have no {} layout", header.layout));
    }
    if header.bits == 0
        || !header.bits.is_multiple_of(COUNTERS_PER_WORD)
        || header.bits > MAX_COUNTERS
    {
        return Err(format!(
            "{} counters is not a positive multiple of {COUNTERS_PER_WORD} up to {MAX_COUNTERS}",
            header.bits
        ));
    }
    if header.hashes == 0 || header.hashes > MAX_HASHES {
        return Err(format!(
            "hash count {} is outside 1..={MAX_HASHES}",
            header.hashes
        ));
    }
    if header.words != header.bits / COUNTERS_PER_WORD {
        return Err(format!(
            "{} words do not hold {} counters",
            header.words, header.bits
        ));
    }
    Ok(())
}
