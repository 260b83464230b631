//! Keys shaped like the URLs the frontier stores, generated deterministically
//! so every run of a statistical test sees the same data.

#![allow(dead_code)]

use bloom_core::{KeyHash, Layout};
use proptest::prelude::*;

/// The `index`-th URL of a family; different families never share a key.
pub fn url(family: u32, index: u64) -> String {
    format!(
        "https://host{}.example{family}.org/section/{}/page-{index}.html?ref={}",
        index % 977,
        index % 13,
        index.wrapping_mul(0x9e37_79b9) % 10_007
    )
}

/// Hashes of `count` URLs of one family.
pub fn hashes(family: u32, count: u64) -> Vec<KeyHash> {
    (0..count)
        .map(|i| KeyHash::of(url(family, i).as_bytes()))
        .collect()
}

/// Every layout, for property tests.
pub fn layouts() -> impl Strategy<Value = Layout> {
    prop::sample::select(Layout::ALL.to_vec())
}
