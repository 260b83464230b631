//! Bloom filters for the crawl frontier.
//!
//! # Layout
//!
//! - [`hash`]: the one stable 128-bit key hash ([`KeyHash`], xxh3-128 with a
//!   fixed seed) and the probe sequences derived from it.
//! - [`filter`]: [`BloomFilter`], lock-free on atomic words, in the standard
//!   or the cache-line-blocked [`Layout`]; health figures, union, batch
//!   queries, snapshots.
//! - [`counting`]: [`CountingBloomFilter`], 4-bit saturating counters, for
//!   sets that must forget keys.
//! - [`partitioned`]: [`PartitionedBloom`], P filters with per-partition and
//!   total health, and the online rebuild of one partition.
//! - [`model`]: sizing from (n, p) and the false-positive models of both
//!   layouts.
//! - [`snapshot`]: the versioned, checksummed binary format.
//! - [`error`]: the typed errors.
//!
//! No I/O beyond the `Read`/`Write` a caller hands to the snapshot methods,
//! no async. One `unsafe` block, a cache prefetch hint that the batch query
//! needs and the benchmarks show pays (`sync::prefetch`).
//!
//! Under `--cfg bloom_loom` the atomics come from loom, so that
//! `tests/loom.rs` can model-check inserts and the rebuild swap.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod bits;
mod sync;

pub mod counting;
pub mod error;
pub mod filter;
pub mod hash;
pub mod health;
pub mod model;
pub mod partitioned;
pub mod snapshot;

pub use counting::CountingBloomFilter;
pub use error::{FilterError, RemoveError, SnapshotError};
pub use filter::{BloomFilter, Layout, MAX_BITS};
pub use hash::{HASH_ID, HASH_SEED, KeyHash};
pub use health::FilterHealth;
pub use model::MAX_HASHES;
pub use partitioned::{
    PartitionHealth, PartitionedBloom, Rebuild, RebuildReport, SetHealth, TotalHealth,
};
