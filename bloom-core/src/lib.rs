//! Bloom filters for the crawl frontier.
//!
//! # Layout
//!
//! - [`hash`]: the one stable 128-bit key hash ([`KeyHash`], xxh3-128 with a
//!   fixed seed) and the probe sequences derived from it.
//! - [`filter`]: [`BloomFilter`], lock-free on atomic words, in the standard,
//!   the cache-line-blocked or the split-block [`Layout`] ([`layout`]);
//!   health figures, union, batch queries and inserts, snapshots.
//! - [`frozen`]: [`FrozenBloomFilter`], a filter that takes no more inserts,
//!   over plain words, for the fastest queries.
//! - `probe` (private): where a key's bits are and whether they are set,
//!   written once for atomic and plain words; `kernels` (private): the
//!   probe functions each filter calls through, chosen when it is made for
//!   its layout, hash count and CPU (`kernel_choice`); `accel` (private): the split-block
//!   kernels and batches compiled for AVX2 and BMI2; `bits`: the
//!   cache-line-aligned word array.
//! - [`counting`]: [`CountingBloomFilter`], 4-bit saturating counters, for
//!   sets that must forget keys.
//! - [`partitioned`]: [`PartitionedBloom`], P filters with per-partition and
//!   total health, and the online rebuild of one partition.
//! - [`model`]: sizing from (n, p) and the false-positive models of every
//!   layout.
//! - [`snapshot`]: the versioned, checksummed binary format (its version
//!   in `format`).
//! - [`error`]: the typed errors.
//!
//! No I/O beyond the `Read`/`Write` a caller hands to the snapshot methods,
//! no async. `unsafe` only where a benchmark shows it pays, each use
//! documented where it is: a cache prefetch hint in batch queries and
//! inserts (`sync::prefetch`); in `kernels` the calls through each filter's
//! function pointers and the standard layout's unchecked word index; in
//! `accel` the calls into AVX2 code after the CPU was checked to have it
//! and the vector loads and stores of one block.
//!
//! Under `--cfg bloom_loom` the atomics come from loom, so that
//! `tests/loom.rs` can model-check inserts and the rebuild swap.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod accel;
mod bits;
mod format;
mod kernel_choice;
mod kernels;
mod probe;
mod sync;

pub mod counting;
pub mod error;
pub mod filter;
#[cfg(not(bloom_loom))]
pub mod frozen;
pub mod hash;
pub mod health;
pub mod layout;
pub mod model;
pub mod partitioned;
pub mod snapshot;

pub use counting::CountingBloomFilter;
pub use error::{FilterError, RemoveError, SnapshotError};
pub use filter::{BloomFilter, Layout, MAX_BITS};
#[cfg(not(bloom_loom))]
pub use frozen::FrozenBloomFilter;
pub use hash::{HASH_ID, HASH_SEED, KeyHash};
pub use health::FilterHealth;
pub use model::MAX_HASHES;
pub use partitioned::{
    PartitionHealth, PartitionedBloom, Rebuild, RebuildReport, SetHealth, TotalHealth,
};
