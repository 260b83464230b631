//! Measured false-positive rates against each layout's model.

mod common;

use bloom_core::{BloomFilter, Layout};

/// Inserts n keys, queries keys never inserted, and checks the rate seen
/// against the model's prediction for the filter's actual size.
///
/// The bound is five binomial standard deviations plus 2% of the
/// expectation for the model's own approximations. The keys are fixed, so
/// the test is deterministic: it cannot flake, and a pass at 5 sigma means
/// the rate is where the model says.
fn check(layout: Layout, n: u64, p: f64) {
    let filter = BloomFilter::with_layout(layout, n, p).unwrap();
    for hash in common::hashes(1, n) {
        filter.insert_hashed(hash);
    }
    let queries = ((400.0 / p) as u64).clamp(1_000_000, 4_000_000);
    let false_positives = (0..queries)
        .filter(|&i| filter.contains(common::url(2, i).as_bytes()))
        .count() as f64;
    let predicted = filter.model_fp_rate(n);
    let expected = predicted * queries as f64;
    let sigma = (queries as f64 * predicted * (1.0 - predicted)).sqrt();
    let measured = false_positives / queries as f64;
    assert!(
        (false_positives - expected).abs() <= 5.0 * sigma + 0.02 * expected,
        "{layout} n={n} p={p}: measured {measured:.6} over {queries} queries, model {predicted:.6}"
    );
    // Sizing meets the target: the blocked layout exactly (it is sized with
    // its model), the standard one up to the textbook formula's rounding of
    // k to an integer.
    let slack = if layout == Layout::Standard {
        1.01
    } else {
        1.0
    };
    assert!(
        predicted <= p * slack,
        "{layout} n={n} p={p}: model {predicted}"
    );
}

#[test]
fn standard_layout_matches_its_model() {
    for n in [10_000, 100_000, 1_000_000] {
        for p in [0.1, 0.01, 0.001, 0.0001] {
            check(Layout::Standard, n, p);
        }
    }
}

#[test]
fn blocked_layout_matches_its_model() {
    for n in [10_000, 100_000, 1_000_000] {
        for p in [0.1, 0.01, 0.001, 0.0001] {
            check(Layout::Blocked, n, p);
        }
    }
}

#[test]
fn split_block_layout_matches_its_model() {
    for n in [10_000, 100_000, 1_000_000] {
        for p in [0.1, 0.01, 0.001, 0.0001] {
            check(Layout::SplitBlock, n, p);
        }
    }
}

#[test]
fn split_block_256_layout_matches_its_model() {
    for n in [10_000, 100_000, 1_000_000] {
        for p in [0.1, 0.01, 0.001, 0.0001] {
            check(Layout::SplitBlock256, n, p);
        }
    }
}

/// Partitions chosen from the key hash must not bias the probes: every
/// partition's rate still matches the model.
#[test]
fn hash_chosen_partitions_keep_the_rate() {
    let set = bloom_core::PartitionedBloom::new(8, Layout::Standard, 20_000, 0.01).unwrap();
    for hash in common::hashes(3, 160_000) {
        set.insert_by_hash(hash);
    }
    let queries = 1_000_000;
    let false_positives = common::hashes(4, queries)
        .into_iter()
        .filter(|&hash| set.contains_by_hash(hash))
        .count() as f64;
    let filter = set.filter(0).unwrap();
    let predicted = filter.model_fp_rate(20_000);
    let expected = predicted * queries as f64;
    let sigma = expected.sqrt();
    assert!(
        (false_positives - expected).abs() <= 5.0 * sigma + 0.05 * expected,
        "measured {false_positives} expected {expected}"
    );
    for health in set.health().partitions {
        let items = health.filter.estimated_items;
        assert!((items - 20_000.0).abs() < 20_000.0 * 0.05, "{health:?}");
    }
}
