//! The one promise a Bloom filter makes: a key inserted is always found.

mod common;

use std::sync::Barrier;

use bloom_core::{BloomFilter, CountingBloomFilter, KeyHash, Layout, PartitionedBloom};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any keys, any size (down to one block, so filters overfill), any k.
    #[test]
    fn inserted_keys_are_found(
        layout in common::layouts(),
        bits in 1_u64..20_000,
        hashes in 1_u32..=64,
        keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..300),
    ) {
        let filter = BloomFilter::with_params(layout, bits, layout.valid_hashes(hashes)).unwrap();
        for key in &keys {
            filter.insert(key);
            prop_assert!(filter.contains(key));
        }
        for key in &keys {
            prop_assert!(filter.contains(key));
            prop_assert!(!filter.insert(key), "a second insert is never new");
        }
        prop_assert!(filter.ones() <= filter.bits());
    }

    /// Exclusive-access inserts set exactly the bits shared ones do and give
    /// the same answers.
    #[test]
    fn insert_mut_matches_insert(
        layout in common::layouts(),
        bits in 1_u64..20_000,
        hashes in 1_u32..=64,
        keys in prop::collection::vec(0_u16..500, 0..300),
    ) {
        let shared = BloomFilter::with_params(layout, bits, layout.valid_hashes(hashes)).unwrap();
        let mut exclusive = BloomFilter::with_params(layout, bits, layout.valid_hashes(hashes)).unwrap();
        for key in &keys {
            let key = key.to_le_bytes();
            prop_assert_eq!(shared.insert(&key), exclusive.insert_mut(&key));
        }
        prop_assert_eq!(shared.to_snapshot_bytes(), exclusive.to_snapshot_bytes());
    }

    /// Batch inserts, shared and exclusive, answer and set bits exactly as
    /// one-by-one inserts do, duplicates within a batch included (the later
    /// copy is not new), in batches of any length.
    #[test]
    fn batch_inserts_match_single_ones(
        layout in common::layouts(),
        bits in 1_u64..20_000,
        hashes in 1_u32..=64,
        keys in prop::collection::vec(0_u16..500, 0..300),
        batch_len in 1_usize..80,
    ) {
        let hashes = layout.valid_hashes(hashes);
        let single = BloomFilter::with_params(layout, bits, hashes).unwrap();
        let shared = BloomFilter::with_params(layout, bits, hashes).unwrap();
        let mut exclusive = BloomFilter::with_params(layout, bits, hashes).unwrap();
        let keys: Vec<KeyHash> = keys.iter().map(|key| KeyHash::of(&key.to_le_bytes())).collect();
        let expected: Vec<bool> = keys.iter().map(|&hash| single.insert_hashed(hash)).collect();
        let (mut shared_answers, mut exclusive_answers) = (vec![true; 5], Vec::new());
        let mut answers = Vec::new();
        for batch in keys.chunks(batch_len) {
            shared.insert_batch_into(batch, &mut answers);
            prop_assert_eq!(answers.len(), batch.len());
            shared_answers.extend_from_slice(&answers);
            exclusive.insert_batch_mut_into(batch, &mut answers);
            exclusive_answers.extend_from_slice(&answers);
        }
        prop_assert_eq!(&shared_answers[5..], &expected[..]);
        prop_assert_eq!(&exclusive_answers, &expected);
        prop_assert_eq!(shared.to_snapshot_bytes(), single.to_snapshot_bytes());
        prop_assert_eq!(exclusive.to_snapshot_bytes(), single.to_snapshot_bytes());
        shared.insert_batch_into(&[], &mut answers);
        prop_assert!(answers.is_empty());
    }

    /// Sized filters of both layouts, filled to and past capacity.
    #[test]
    fn sized_filters_never_miss(
        layout in common::layouts(),
        expected in 1_u64..5_000,
        exponent in 1_i32..7,
        overfill in 1_u64..4,
    ) {
        let filter = BloomFilter::with_layout(layout, expected, 10_f64.powi(-exponent)).unwrap();
        let keys = common::hashes(20, expected * overfill);
        for &hash in &keys {
            filter.insert_hashed(hash);
        }
        prop_assert!(keys.iter().all(|&hash| filter.contains_hashed(hash)));
    }

    /// Hashes with a zero half (the degenerate double-hashing case) too.
    #[test]
    fn any_hash_value_is_found(layout in common::layouts(), raw in prop::collection::vec(any::<u128>(), 1..100)) {
        let filter = BloomFilter::with_params(layout, 4096, layout.valid_hashes(9)).unwrap();
        let mut hashes: Vec<KeyHash> = raw.into_iter().map(KeyHash::from_u128).collect();
        hashes.push(KeyHash::from_u128(0));
        hashes.push(KeyHash::from_u128(u128::from(u64::MAX)));
        hashes.push(KeyHash::from_u128(u128::MAX << 64));
        for &hash in &hashes {
            filter.insert_hashed(hash);
        }
        prop_assert!(hashes.iter().all(|&hash| filter.contains_hashed(hash)));
    }

    #[test]
    fn partitioned_set_never_misses(
        layout in common::layouts(),
        partitions in 1_usize..9,
        keys in prop::collection::vec(any::<u64>(), 0..500),
    ) {
        let set = PartitionedBloom::new(partitions, layout, 100, 0.01).unwrap();
        for key in &keys {
            let hash = KeyHash::of(&key.to_le_bytes());
            set.insert_by_hash(hash);
            let named = (key % partitions as u64) as usize;
            set.insert(named, hash).unwrap();
        }
        for key in &keys {
            let hash = KeyHash::of(&key.to_le_bytes());
            prop_assert!(set.contains_by_hash(hash));
            prop_assert!(set.contains((key % partitions as u64) as usize, hash).unwrap());
        }
    }
}

/// Eight threads inserting at once, in both layouts: every key found, and
/// the bits are exactly those of the same keys inserted by one thread (so
/// the exact `ones` count survived the races too).
#[test]
fn concurrent_inserts_lose_nothing() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 50_000;
    for layout in Layout::ALL {
        let filter = BloomFilter::with_layout(layout, THREADS * PER_THREAD, 0.01).unwrap();
        let start = Barrier::new(THREADS as usize);
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (filter, start) = (&filter, &start);
                scope.spawn(move || {
                    let keys = common::hashes(30 + thread as u32, PER_THREAD);
                    start.wait();
                    for &hash in &keys {
                        filter.insert_hashed(hash);
                    }
                });
            }
        });
        let sequential = BloomFilter::with_layout(layout, THREADS * PER_THREAD, 0.01).unwrap();
        for thread in 0..THREADS {
            for hash in common::hashes(30 + thread as u32, PER_THREAD) {
                assert!(filter.contains_hashed(hash), "{layout}: key lost");
                sequential.insert_hashed(hash);
            }
        }
        assert_eq!(filter.ones(), sequential.ones(), "{layout}");
        assert_eq!(
            filter.to_snapshot_bytes(),
            sequential.to_snapshot_bytes(),
            "{layout}"
        );
    }
}

/// The documented guarantee of `insert` under a race on one key: when the
/// key was absent before, at least one of the racing inserts reports it new
/// (several may). Checked over thousands of races with the threads released
/// together by a barrier for every key.
#[test]
fn racing_inserts_of_one_key_report_it_new_at_least_once() {
    const THREADS: usize = 4;
    const KEYS: u64 = 2_000;
    for layout in Layout::ALL {
        let filter = BloomFilter::with_params(layout, 1 << 22, layout.valid_hashes(7)).unwrap();
        let keys = common::hashes(40, KEYS);
        let absent_before: Vec<bool> = keys.iter().map(|&h| !filter.contains_hashed(h)).collect();
        let barrier = Barrier::new(THREADS);
        let answers: Vec<Vec<bool>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (filter, barrier, keys) = (&filter, &barrier, &keys);
                    scope.spawn(move || {
                        keys.iter()
                            .map(|&hash| {
                                barrier.wait();
                                filter.insert_hashed(hash)
                            })
                            .collect::<Vec<bool>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (index, absent) in absent_before.iter().enumerate() {
            let winners = answers.iter().filter(|a| a[index]).count();
            if *absent {
                assert!(
                    winners >= 1,
                    "{layout}: key {index} absent before, no insert said new"
                );
            } else {
                assert_eq!(winners, 0, "{layout}: key {index} was present before");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The counting filter never forgets a key inserted more often than it
    /// was removed, whatever the order of operations and however much the
    /// counters saturate.
    #[test]
    fn counting_filter_never_misses(
        counters in 16_u64..2_000,
        hashes in 1_u32..8,
        ops in prop::collection::vec((any::<bool>(), 0_u8..40), 0..600),
    ) {
        let filter = CountingBloomFilter::with_params(counters, hashes).unwrap();
        let mut model = std::collections::HashMap::<u8, u32>::new();
        for (insert, key) in ops {
            let count = model.entry(key).or_default();
            if insert {
                filter.insert(&[key]);
                *count += 1;
            } else if *count > 0 {
                filter.remove(&[key]).unwrap();
                *count -= 1;
            }
            for (&key, &count) in &model {
                if count > 0 {
                    prop_assert!(filter.contains(&[key]), "key {key} with count {count} missed");
                }
            }
        }
    }
}
