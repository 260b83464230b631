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

    /// The first word, for code that addresses blocks by pointer (the
    /// vector kernels); valid for [`blocks`](Self::blocks) whole blocks.
    #[cfg_attr(not(all(target_arch = "x86_64", not(bloom_loom))), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *const W {
        self.storage.as_ptr().wrapping_add(self.offset)
    }

    /// [`as_ptr`](Self::as_ptr) for writing.
    #[cfg_attr(not(all(target_arch = "x86_64", not(bloom_loom))), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut W {
        self.storage.as_mut_ptr().wrapping_add(self.offset)
    }

    #[inline]
    pub(crate) fn words_mut(&mut self) -> &mut [W] {
        &mut self.storage[self.offset..self.offset + self.words]
    }

    #[inline]
    pub(crate) fn blocks(&self) -> usize {
        self.words / WORDS_PER_BLOCK
    }

    #[inline]
    pub(crate) fn block(&self, index: usize) -> &[W; WORDS_PER_BLOCK] {
        let start = self.offset + index * WORDS_PER_BLOCK;
        self.storage[start..start + WORDS_PER_BLOCK]
            .try_into()
            .expect("a block is eight words")
    }

    #[inline]
    pub(crate) fn block_mut(&mut self, index: usize) -> &mut [W; WORDS_PER_BLOCK] {
        let start = self.offset + index * WORDS_PER_BLOCK;
        (&mut self.storage[start..start + WORDS_PER_BLOCK])
            .try_into()
            .expect("a block is eight words")
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val::<[W]>(&self.storage)
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
            assert_eq!(array.as_ptr(), array.words().as_ptr());
            assert_eq!(array.block(0).as_ptr() as usize % 64, 0);
            assert_eq!(array.blocks(), words / 8);
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
