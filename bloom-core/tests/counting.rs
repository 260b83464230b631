//! The counting filter against a model of its counters.

use bloom_core::{CountingBloomFilter, RemoveError, counting::SATURATED};
use proptest::prelude::*;

/// A plain array of counters with the same rules: +1 on insert, -1 on
/// remove, and 15 stays 15.
struct Model {
    counters: Vec<u8>,
}

impl Model {
    fn apply(&mut self, indexes: &[u64], insert: bool) {
        for &index in indexes {
            let counter = &mut self.counters[index as usize];
            if *counter == SATURATED {
                continue;
            }
            if insert {
                *counter += 1;
            } else {
                *counter -= 1;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Insert/remove sequences over a small key universe (so keys share
    /// counters and some saturate): every counter equals the model's, removes
    /// of absent keys are refused without effect, and keys with a positive
    /// multiset count are always found.
    #[test]
    fn counters_follow_the_multiset_model(
        counters in 16_u64..400,
        hashes in 1_u32..6,
        ops in prop::collection::vec((any::<bool>(), 0_u8..30), 0..800),
    ) {
        let filter = CountingBloomFilter::with_params(counters, hashes).unwrap();
        let mut model = Model { counters: vec![0; filter.counters() as usize] };
        let mut multiset = std::collections::HashMap::<u8, u32>::new();
        for (insert, key) in ops {
            let indexes: Vec<u64> = filter.counter_indexes(&[key]).collect();
            let count = multiset.entry(key).or_default();
            if insert {
                let was_absent = indexes.iter().any(|&i| model.counters[i as usize] == 0);
                prop_assert_eq!(filter.insert(&[key]), was_absent);
                model.apply(&indexes, true);
                *count += 1;
            } else if *count > 0 {
                filter.remove(&[key]).unwrap();
                model.apply(&indexes, false);
                *count -= 1;
            } else {
                let certainly_absent = indexes.iter().any(|&i| model.counters[i as usize] == 0);
                if certainly_absent {
                    prop_assert_eq!(filter.remove(&[key]), Err(RemoveError::NotPresent));
                }
                // Otherwise the key is a false positive: removing it is the
                // caller error the docs warn about, so the model skips it.
            }
            for (index, &expected) in model.counters.iter().enumerate() {
                prop_assert_eq!(filter.counter(index as u64), expected, "counter {}", index);
            }
            let nonzero = model.counters.iter().filter(|&&c| c > 0).count() as u64;
            let saturated = model.counters.iter().filter(|&&c| c == SATURATED).count() as u64;
            prop_assert_eq!(filter.nonzero(), nonzero);
            prop_assert_eq!(filter.saturated(), saturated);
            for (&key, &count) in &multiset {
                if count > 0 {
                    prop_assert!(filter.contains(&[key]));
                }
            }
        }
    }
}

#[test]
fn saturated_counters_stay_and_never_cause_a_false_negative() {
    let filter = CountingBloomFilter::with_params(64, 3).unwrap();
    for _ in 0..40 {
        filter.insert(b"hot");
    }
    filter.insert(b"cold");
    let hot: Vec<u64> = filter.counter_indexes(b"hot").collect();
    assert!(hot.iter().all(|&i| filter.counter(i) == SATURATED));
    // Removing "hot" 40 times: saturated counters do not move.
    for _ in 0..40 {
        filter.remove(b"hot").unwrap();
    }
    assert!(hot.iter().all(|&i| filter.counter(i) == SATURATED));
    assert!(
        filter.contains(b"hot"),
        "saturation keeps the key (a known false positive)"
    );
    assert!(
        filter.contains(b"cold"),
        "a key sharing saturated counters is never lost"
    );
    assert_eq!(
        filter.saturated(),
        hot.iter().collect::<std::collections::HashSet<_>>().len() as u64
    );
}

#[test]
fn removing_an_absent_key_is_refused_and_changes_nothing() {
    let filter = CountingBloomFilter::new(1_000, 0.001).unwrap();
    filter.insert(b"a");
    let before = filter.to_snapshot_bytes();
    assert_eq!(
        filter.remove(b"never inserted"),
        Err(RemoveError::NotPresent)
    );
    assert_eq!(filter.to_snapshot_bytes(), before);
    filter.remove(b"a").unwrap();
    assert_eq!(filter.nonzero(), 0);
    assert_eq!(filter.remove(b"a"), Err(RemoveError::NotPresent));
}
