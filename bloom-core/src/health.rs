//! Health figures: what an operator reads to judge a filter.

use crate::layout::Layout;

/// One filter's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilterHealth {
    /// The layout.
    pub layout: Layout,
    /// Size of the bit array (m), or the number of counters of a counting
    /// filter.
    pub bits: u64,
    /// Bits (or counters) per key (k).
    pub hashes: u32,
    /// Bits set (counters above zero), exact.
    pub ones: u64,
    /// `ones / bits`.
    pub fill_ratio: f64,
    /// The false-positive rate the current bits give.
    pub estimated_fp_rate: f64,
    /// Distinct keys inserted, estimated from the fill ratio.
    pub estimated_items: f64,
    /// Bytes of memory held.
    pub memory_bytes: u64,
}
