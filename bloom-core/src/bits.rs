//! The bit array every layout stores its bits in: 64-bit words whose first
//! word starts a cache line, so that every 512-bit block of the block
//! layouts is exactly one line. Atomic words for [`crate::BloomFilter`],
//! plain ones for [`crate::FrozenBloomFilter`].

use crate::sync::AtomicU64;

/// Words in one 64-byte cache line (one block of the block layouts).
pub(crate) const WORDS_PER_BLOCK: usize = 8;

pub(crate) struct BitArray<W = AtomicU64> {
    // Seven spare words, so that a line-aligned run of `words` words fits
    // wherever the allocator put the storage. A flat slice (rather than a
    // slice of 64-byte-aligned block structs) keeps the standard layout's
    // probe to one shift and one bounds check.
    storage: Box<[W]>,
    offset: usize,
    words: usize,
}

impl BitArray<AtomicU64> {
    /// `words` zeroed words: a positive multiple of [`WORDS_PER_BLOCK`]
    /// (every array holds at least one whole block, which the vector
    /// kernels rely on).
    pub(crate) fn zeroed(words: usize) -> Self {
        assert!(
            words > 0 && words.is_multiple_of(WORDS_PER_BLOCK),
            "a bit array is whole blocks, at least one: {words} words"
        );
        let storage: Box<[AtomicU64]> = (0..words + WORDS_PER_BLOCK - 1)
            .map(|_| AtomicU64::new(0))
            .collect();
        let misalignment = (storage.as_ptr() as usize % 64) / 8;
        Self {
            storage,
            offset: (WORDS_PER_BLOCK - misalignment) % WORDS_PER_BLOCK,
            words,
        }
    }
}

impl<W> BitArray<W> {
    /// The same array over other words, each converted by `convert`. Words
    /// of the same size and alignment reuse the allocation (the standard
    /// library collects a mapped `Vec` in place), so the blocks stay on
    /// their cache lines; were it ever copied, the copy is realigned.
    #[cfg(not(bloom_loom))]
    pub(crate) fn convert<V>(self, convert: impl FnMut(W) -> V) -> BitArray<V> {
        let storage: Box<[V]> = self.storage.into_vec().into_iter().map(convert).collect();
        let misalignment = (storage.as_ptr() as usize % 64) / 8;
        let offset = (WORDS_PER_BLOCK - misalignment) % WORDS_PER_BLOCK;
        let mut array = BitArray {
            storage,
            offset: self.offset,
            words: self.words,
        };
        if offset != self.offset {
            array.storage.rotate_left(self.offset);
            array.storage.rotate_right(offset);
            array.offset = offset;
        }
        array
    }

    #[inline]
    pub(crate) fn words(&self) -> &[W] {
        &self.storage[self.offset..self.offset + self.words]
    }

    /// The words, for the probe code.
    #[inline(always)]
    pub(crate) fn lines(&self) -> Lines<'_, W> {
        Lines {
            words: self.words(),
        }
    }

    /// The words, for the probe code, with exclusive access.
    #[inline(always)]
    pub(crate) fn lines_mut(&mut self) -> LinesMut<'_, W> {
        LinesMut {
            words: self.words_mut(),
        }
    }

    #[inline]
    pub(crate) fn words_mut(&mut self) -> &mut [W] {
        &mut self.storage[self.offset..self.offset + self.words]
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val::<[W]>(&self.storage)
    }
}

/// A bit array's words as the probe code reads them: by value, two
/// registers wide (pointer and length), so that a kernel takes them as
/// arguments instead of loading and adding up the array's fields on every
/// call (22 -> 16-17 instructions a split-block-256 query; in an interleaved
/// A/B at 10 million keys its frozen queries went from 0.92-0.97x to
/// 0.97-1.01x of sbbf-rs-safe's). Only [`BitArray`]
/// makes one, so the words are whole blocks, at least one, the first on a
/// cache line: what the kernels' unchecked addressing relies on.
pub(crate) struct Lines<'a, W> {
    words: &'a [W],
}

// By hand: a derive would require `W: Copy`, and atomic words are not.
impl<W> Clone for Lines<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W> Copy for Lines<'_, W> {}

impl<'a, W> Lines<'a, W> {
    #[inline(always)]
    pub(crate) fn words(self) -> &'a [W] {
        self.words
    }

    #[inline(always)]
    pub(crate) fn blocks(self) -> usize {
        self.words.len() / WORDS_PER_BLOCK
    }

    #[inline(always)]
    pub(crate) fn block(self, index: usize) -> &'a [W; WORDS_PER_BLOCK] {
        let start = index * WORDS_PER_BLOCK;
        self.words[start..start + WORDS_PER_BLOCK]
            .try_into()
            .expect("a block is eight words")
    }

    /// The first word, for code that addresses blocks by pointer (the
    /// vector kernels); valid for [`blocks`](Self::blocks) whole blocks.
    #[cfg_attr(not(all(target_arch = "x86_64", not(bloom_loom))), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn as_ptr(self) -> *const W {
        self.words.as_ptr()
    }
}

/// [`Lines`] with exclusive access.
pub(crate) struct LinesMut<'a, W> {
    words: &'a mut [W],
}

impl<W> LinesMut<'_, W> {
    #[inline(always)]
    pub(crate) fn as_lines(&self) -> Lines<'_, W> {
        Lines { words: self.words }
    }

    /// The same words for a shorter borrow, for one call of a kernel.
    #[inline(always)]
    pub(crate) fn reborrow(&mut self) -> LinesMut<'_, W> {
        LinesMut { words: self.words }
    }

    #[inline(always)]
    pub(crate) fn words_mut(&mut self) -> &mut [W] {
        self.words
    }

    #[cfg_attr(not(all(target_arch = "x86_64", not(bloom_loom))), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn blocks(&self) -> usize {
        self.words.len() / WORDS_PER_BLOCK
    }

    #[inline(always)]
    pub(crate) fn block_mut(&mut self, index: usize) -> &mut [W; WORDS_PER_BLOCK] {
        let start = index * WORDS_PER_BLOCK;
        (&mut self.words[start..start + WORDS_PER_BLOCK])
            .try_into()
            .expect("a block is eight words")
    }

    /// [`Lines::as_ptr`] for writing.
    #[cfg_attr(not(all(target_arch = "x86_64", not(bloom_loom))), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut W {
        self.words.as_mut_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_start_cache_lines() {
        for words in [8, 64, 8 * 1000] {
            let array = BitArray::zeroed(words);
            assert_eq!(array.words().len(), words);
            assert_eq!(array.words().as_ptr() as usize % 64, 0);
            assert_eq!(array.lines().as_ptr(), array.words().as_ptr());
            assert_eq!(array.lines().block(0).as_ptr() as usize % 64, 0);
            assert_eq!(array.lines().blocks(), words / 8);
        }
    }

    #[cfg(not(bloom_loom))]
    #[test]
    fn converted_arrays_keep_their_words_on_cache_lines() {
        for words in [8, 64, 8 * 1000] {
            let array = BitArray::zeroed(words);
            for (index, word) in array.words().iter().enumerate() {
                word.store(index as u64 * 3 + 1, crate::sync::Ordering::Relaxed);
            }
            let plain = array.convert(AtomicU64::into_inner);
            assert_eq!(plain.words().as_ptr() as usize % 64, 0);
            let expected: Vec<u64> = (0..words as u64).map(|index| index * 3 + 1).collect();
            assert_eq!(plain.words(), &expected[..]);
            let back = plain.convert(AtomicU64::new);
            assert_eq!(back.words().as_ptr() as usize % 64, 0);
            assert_eq!(
                back.words()[words - 1].load(crate::sync::Ordering::Relaxed),
                expected[words - 1]
            );
        }
    }
}
