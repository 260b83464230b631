//! The URL-like keys the benchmarks and the instruction counts share.

/// Keys stored back to back, so ten million of them cost their bytes and
/// not ten million allocations.
pub struct Keys {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Keys {
    pub fn urls(family: u32, count: usize) -> Self {
        let mut bytes = Vec::with_capacity(count * 72);
        let mut ends = Vec::with_capacity(count);
        for index in 0..count as u64 {
            use std::io::Write;
            let _ = write!(
                bytes,
                "https://www.site{}.example{family}.com/articles/{}/item-{index}?page={}",
                index % 50_021,
                index % 97,
                index.wrapping_mul(0x9e37_79b9) % 1_000
            );
            ends.push(bytes.len());
        }
        Self { bytes, ends }
    }

    /// All the keys' bytes together.
    pub fn total_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.bytes[start..self.ends[index]]
    }
}
