//! Frozen filters answer exactly as the filters they were frozen from, in
//! every layout, one by one and in batches, and survive the trip back.

mod common;

use bloom_core::{BloomFilter, FrozenBloomFilter, KeyHash, Layout};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any filter, any fill (down to one overfull block): the frozen copy
    /// gives the same answer for inserted and random keys, its snapshot is
    /// the same bytes, and thawing gives the same filter back.
    #[test]
    fn frozen_answers_are_the_filters_answers(
        layout in common::layouts(),
        bits in 1_u64..40_000,
        hashes in 1_u32..=64,
        inserted in prop::collection::vec(any::<u128>(), 0..400),
        probes in prop::collection::vec(any::<u128>(), 0..400),
        exclusive in any::<bool>(),
    ) {
        let mut filter =
            BloomFilter::with_params(layout, bits, layout.valid_hashes(hashes)).unwrap();
        for &hash in &inserted {
            if exclusive {
                filter.insert_hashed_mut(KeyHash::from_u128(hash));
            } else {
                filter.insert_hashed(KeyHash::from_u128(hash));
            }
        }
        let queries: Vec<KeyHash> =
            inserted.iter().chain(&probes).map(|&h| KeyHash::from_u128(h)).collect();
        let expected: Vec<bool> = queries.iter().map(|&h| filter.contains_hashed(h)).collect();
        let snapshot = filter.to_snapshot_bytes();
        let health = filter.health();

        let frozen = filter.freeze();
        let single: Vec<bool> = queries.iter().map(|&h| frozen.contains_hashed(h)).collect();
        prop_assert_eq!(&single, &expected);
        prop_assert!(single[..inserted.len()].iter().all(|&found| found));
        let mut batch = Vec::new();
        frozen.contains_batch_into(&queries, &mut batch);
        prop_assert_eq!(&batch, &expected);
        prop_assert_eq!(frozen.to_snapshot_bytes(), snapshot.clone());
        // Every figure but the struct's own size.
        prop_assert_eq!(
            frozen.health(),
            bloom_core::FilterHealth { memory_bytes: frozen.memory_bytes(), ..health }
        );

        let thawed = frozen.thaw();
        prop_assert_eq!(thawed.to_snapshot_bytes(), snapshot);
        for &hash in &inserted {
            prop_assert!(!thawed.insert_hashed(KeyHash::from_u128(hash)));
        }
    }
}

#[test]
fn frozen_filters_read_and_write_snapshots() {
    for layout in Layout::ALL {
        let filter = BloomFilter::with_layout(layout, 20_000, 0.01).unwrap();
        let keys = common::hashes(90, 20_000);
        for &hash in &keys {
            filter.insert_hashed(hash);
        }
        let bytes = filter.to_snapshot_bytes();
        let frozen = FrozenBloomFilter::from_snapshot_bytes(&bytes).unwrap();
        assert_eq!(frozen.layout(), layout);
        assert_eq!(frozen.bits(), filter.bits());
        assert_eq!(frozen.hashes(), filter.hashes());
        assert_eq!(frozen.ones(), filter.ones());
        assert!(keys.iter().all(|&hash| frozen.contains_hashed(hash)));
        let absent = common::hashes(91, 20_000);
        let false_positives = absent
            .iter()
            .filter(|&&hash| frozen.contains_hashed(hash))
            .count();
        assert_eq!(
            false_positives,
            absent
                .iter()
                .filter(|&&hash| filter.contains_hashed(hash))
                .count()
        );
        let mut written = Vec::new();
        frozen.write_snapshot(&mut written).unwrap();
        assert_eq!(written, bytes);
        let read = FrozenBloomFilter::read_snapshot(&bytes[..]).unwrap();
        assert_eq!(read.to_snapshot_bytes(), bytes);
        assert!(FrozenBloomFilter::from_snapshot_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(frozen.contains(common::url(90, 7).as_bytes()));
        assert!(frozen.memory_bytes() >= frozen.bits() / 8);
        assert!((frozen.model_fp_rate(20_000) - filter.model_fp_rate(20_000)).abs() < 1e-15);
    }
}
