//! Snapshots are read from disk that may be damaged: any input must either
//! fail with a typed error or decode to a filter that encodes back to exactly
//! that input (a checksum collision aside), and never panic or over-allocate.

#![no_main]

use bloom_core::{BloomFilter, CountingBloomFilter, FrozenBloomFilter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(filter) = BloomFilter::from_snapshot_bytes(bytes) {
        assert_eq!(filter.to_snapshot_bytes(), bytes);
    }
    if let Ok(filter) = FrozenBloomFilter::from_snapshot_bytes(bytes) {
        assert_eq!(filter.to_snapshot_bytes(), bytes);
    }
    if let Ok(filter) = CountingBloomFilter::from_snapshot_bytes(bytes) {
        assert_eq!(filter.to_snapshot_bytes(), bytes);
    }
    let _ = BloomFilter::read_snapshot(bytes);
    let _ = CountingBloomFilter::read_snapshot(bytes);
});
