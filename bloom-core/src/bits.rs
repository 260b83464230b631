//! The bit array both layouts store their bits in: atomic 64-bit words whose
//! first word starts a cache line, so that every 512-bit block of the blocked
//! layout is exactly one line.

use crate::sync::AtomicU64;

/// Words in one 64-byte cache line (one block of the blocked layout).
pub(crate) const WORDS_PER_BLOCK: usize = 8;

pub(crate) struct BitArray {
    // Seven spare words, so that a line-aligned run of `words` words fits
    // wherever the allocator put the storage. A flat slice (rather than a
    // slice of 64-byte-aligned block structs) keeps the standard layout's
    // probe to one shift and one bounds check.
    storage: Box<[AtomicU64]>,
    offset: usize,
    words: usize,
}

impl BitArray {
    /// `words` zeroed words; `words` is a multiple of [`WORDS_PER_BLOCK`].
    pub(crate) fn zeroed(words: usize) -> Self {
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

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        &self.storage[self.offset..self.offset + self.words]
    }

    #[inline]
    pub(crate) fn words_mut(&mut self) -> &mut [AtomicU64] {
        &mut self.storage[self.offset..self.offset + self.words]
    }

    #[inline]
    pub(crate) fn blocks(&self) -> usize {
        self.words / WORDS_PER_BLOCK
    }

    #[inline]
    pub(crate) fn block(&self, index: usize) -> &[AtomicU64; WORDS_PER_BLOCK] {
        let start = self.offset + index * WORDS_PER_BLOCK;
        self.storage[start..start + WORDS_PER_BLOCK]
            .try_into()
            .expect("a block is eight words")
    }

    #[inline]
    pub(crate) fn block_mut(&mut self, index: usize) -> &mut [AtomicU64; WORDS_PER_BLOCK] {
        let start = self.offset + index * WORDS_PER_BLOCK;
        (&mut self.storage[start..start + WORDS_PER_BLOCK])
            .try_into()
            .expect("a block is eight words")
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val::<[AtomicU64]>(&self.storage)
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
            assert_eq!(array.block(0).as_ptr() as usize % 64, 0);
            assert_eq!(array.blocks(), words / 8);
        }
    }
}
