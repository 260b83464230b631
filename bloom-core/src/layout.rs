//! [`Layout`]: where a filter puts a key's bits. A leaf every lower file
//! (kernels, probes, health) names, beside the filters that use it.

use crate::error::FilterError;
use crate::model::SPLIT_WORDS;

/// How a filter places a key's k bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// k bits anywhere in the array (enhanced double hashing): the textbook
    /// filter and its false-positive rate `(1 - e^(-kn/m))^k`. A query costs
    /// up to k cache misses.
    Standard,
    /// k bits inside one 512-bit block (one cache line) picked by the key: one
    /// cache miss per operation, at the price of a somewhat higher
    /// false-positive rate for the same bits (see [`crate::model`]).
    Blocked,
    /// The key's block (one cache line, as [`Layout::Blocked`]) is split into
    /// its eight 64-bit words and the key sets `k / 8` bits in each word; k
    /// is a multiple of 8. The Parquet / Impala split-block filter's shape
    /// over 64-bit words: the probe is eight independent word tests with no
    /// data-dependent word choice, much faster to query than
    /// [`Layout::Blocked`] at a few percent more bits for the same rate (see
    /// [`crate::model::split_block_fp_rate`]).
    SplitBlock,
    /// The Parquet split-block filter's own shape: the key's 256-bit bucket
    /// (half a cache line) split into eight 32-bit words, `k / 8` bits in
    /// each; k is a multiple of 8. Half the bits [`Layout::SplitBlock`]
    /// reads, so a query is one 256-bit load and about half the vector
    /// work, at a higher false-positive rate for the same bits (smaller
    /// buckets fill less evenly; see
    /// [`crate::model::split_block_256_fp_rate`]).
    SplitBlock256,
}

impl Layout {
    /// Every layout, for callers that try each.
    pub const ALL: [Layout; 4] = [
        Layout::Standard,
        Layout::Blocked,
        Layout::SplitBlock,
        Layout::SplitBlock256,
    ];

    /// The nearest hash count this layout accepts: `hashes` itself, except
    /// that the split-block layouts round up to a multiple of 8.
    #[must_use]
    pub fn valid_hashes(self, hashes: u32) -> u32 {
        if self.is_split() {
            hashes.div_ceil(SPLIT_WORDS).max(1) * SPLIT_WORDS
        } else {
            hashes
        }
    }

    /// Whether the layout sets `k / 8` bits in each of eight words.
    pub(crate) fn is_split(self) -> bool {
        matches!(self, Layout::SplitBlock | Layout::SplitBlock256)
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Layout::Standard => 1,
            Layout::Blocked => 2,
            Layout::SplitBlock => 3,
            Layout::SplitBlock256 => 4,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Layout::Standard),
            2 => Some(Layout::Blocked),
            3 => Some(Layout::SplitBlock),
            4 => Some(Layout::SplitBlock256),
            _ => None,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Standard => "standard",
            Layout::Blocked => "blocked",
            Layout::SplitBlock => "split-block",
            Layout::SplitBlock256 => "split-block-256",
        })
    }
}

impl std::str::FromStr for Layout {
    type Err = FilterError;

    /// The names [`Display`](std::fmt::Display) writes.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "standard" => Ok(Layout::Standard),
            "blocked" => Ok(Layout::Blocked),
            "split-block" => Ok(Layout::SplitBlock),
            "split-block-256" => Ok(Layout::SplitBlock256),
            other => Err(FilterError::UnknownLayout(other.to_owned())),
        }
    }
}
