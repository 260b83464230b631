//! The atomics and shared pointers the filters are built on, swapped for
//! loom's model-checked versions under `--cfg bloom_loom` so that loom can
//! explore every interleaving of concurrent inserts and rebuild swaps.

#[cfg(bloom_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(bloom_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(bloom_loom)]
pub(crate) use loom::sync::Arc;
#[cfg(not(bloom_loom))]
pub(crate) use std::sync::Arc;

/// A shared pointer that readers load without locking and a writer replaces
/// atomically: arc-swap in production, a loom mutex under the model checker
/// (arc-swap's internals are not loom-aware, and a mutex gives the same
/// linearizable load/store semantics the partition code relies on).
pub(crate) struct SwapCell<T> {
    #[cfg(not(bloom_loom))]
    inner: arc_swap::ArcSwap<T>,
    #[cfg(bloom_loom)]
    inner: loom::sync::Mutex<Arc<T>>,
}

/// What [`SwapCell::load`] hands out: keeps the loaded value alive while the
/// caller uses it, even if the cell is stored to meanwhile.
pub(crate) struct Loaded<T> {
    #[cfg(not(bloom_loom))]
    guard: arc_swap::Guard<Arc<T>>,
    #[cfg(bloom_loom)]
    guard: Arc<T>,
}

impl<T> std::ops::Deref for Loaded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> SwapCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(bloom_loom))]
            inner: arc_swap::ArcSwap::from_pointee(value),
            #[cfg(bloom_loom)]
            inner: loom::sync::Mutex::new(Arc::new(value)),
        }
    }

    pub(crate) fn load(&self) -> Loaded<T> {
        #[cfg(not(bloom_loom))]
        {
            Loaded {
                guard: self.inner.load(),
            }
        }
        #[cfg(bloom_loom)]
        {
            Loaded {
                guard: Arc::clone(&self.inner.lock().unwrap()),
            }
        }
    }

    pub(crate) fn store(&self, value: T) {
        #[cfg(not(bloom_loom))]
        self.inner.store(Arc::new(value));
        #[cfg(bloom_loom)]
        {
            *self.inner.lock().unwrap() = Arc::new(value);
        }
    }
}

/// Sets the `mask` bits of a word other threads may be using; returns
/// whether any of them was unset when this call loaded the word.
///
/// A plain load decides, and only a word missing a bit gets a locked OR,
/// whose old value is not read back. Reading it back (`fetch_or`'s result)
/// compiles to the microcoded `lock bts` for one bit, or to a
/// compare-and-swap loop for several; ORing a word whose bits are all set
/// would make a duplicate key (most of a crawl's discovered URLs) write,
/// and so take exclusive ownership of, lines other threads are reading.
/// Measured against the former version (all loads, then `fetch_or` of the
/// unset bits), this roughly halved a standard-layout insert out of cache.
/// The answer keeps the
/// guarantee `BloomFilter` documents: the first thread to set a bit loaded
/// it unset, so of racing inserts of an absent key at least one reports it
/// new.
#[inline]
pub(crate) fn set_bits_shared(word: &AtomicU64, mask: u64) -> bool {
    if word.load(Ordering::Relaxed) & mask == mask {
        return false;
    }
    word.fetch_or(mask, Ordering::Relaxed);
    true
}

/// [`set_bits_shared`] for each word and its mask; whether any bit was
/// unset.
#[inline(always)]
pub(crate) fn set_masks_shared(words: &[AtomicU64], masks: impl IntoIterator<Item = u64>) -> bool {
    let mut newly = false;
    for (word, mask) in words.iter().zip(masks) {
        newly |= set_bits_shared(word, mask);
    }
    newly
}

/// Sets the `mask` bits of a word the caller has exclusive access to, with a
/// plain read-modify-write (no locked instruction); returns those of them
/// that were unset before. Callers OR the results of all a key's words and
/// test once at the end: a test per word makes the compiler keep every old
/// word alive to the end of an unrolled probe sequence, and spill them.
#[inline]
pub(crate) fn set_bits_exclusive(word: &mut AtomicU64, mask: u64) -> u64 {
    #[cfg(not(bloom_loom))]
    {
        let word = word.get_mut();
        let unset = mask & !*word;
        *word |= mask;
        unset
    }
    #[cfg(bloom_loom)]
    {
        word.with_mut(|word| {
            let unset = mask & !*word;
            *word |= mask;
            unset
        })
    }
}

/// Sets bit `bit` (below 64) of a word the caller has exclusive access to;
/// returns whether that bit was set before. The test compiles to `bt` and
/// `setb` on the loaded word, ahead of the `bts` that sets the bit, so the
/// word needs no copy and the bit index no `cl` (one instruction a probe
/// fewer than shifting the old word down and ANDing the shifted words).
#[inline(always)]
pub(crate) fn set_bit_exclusive(word: &mut AtomicU64, bit: u32) -> bool {
    #[cfg(not(bloom_loom))]
    {
        let word = word.get_mut();
        let was = *word & (1 << bit) != 0;
        *word |= 1 << bit;
        was
    }
    #[cfg(bloom_loom)]
    {
        word.with_mut(|word| {
            let was = *word & (1 << bit) != 0;
            *word |= 1 << bit;
            was
        })
    }
}

/// Asks the CPU to start loading the cache line holding `word`.
///
/// The hint is `unsafe` (an intrinsic), and it pays by measurement: a
/// batch query that merely *loads* a word of each upcoming key cannot run
/// ahead, because each such load blocks retirement until its miss is served
/// and the reorder buffer fills with the current keys' probe arithmetic. A
/// prefetch retires at once, so the misses of the next keys overlap the
/// arithmetic of the current ones (figures in BENCHMARKS.md).
#[inline(always)]
pub(crate) fn prefetch<T>(word: &T) {
    #[cfg(all(not(bloom_loom), target_arch = "x86_64"))]
    {
        let address = std::ptr::from_ref(word).cast::<i8>();
        #[allow(unsafe_code)]
        // SAFETY: `_mm_prefetch` only hints the cache; it cannot fault, reads
        // nothing architecturally and writes nothing. SSE, which it needs, is
        // part of the x86_64 baseline. The address comes from a live
        // reference.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(address);
        }
    }
    #[cfg(not(all(not(bloom_loom), target_arch = "x86_64")))]
    {
        let _ = word;
    }
}
