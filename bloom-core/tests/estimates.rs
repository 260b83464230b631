//! Health figures: estimated items, fill, and exact counts.

mod common;

use bloom_core::{BloomFilter, CountingBloomFilter, Layout};

#[test]
fn estimated_items_within_two_percent_up_to_fill_07() {
    for layout in Layout::ALL {
        let filter = BloomFilter::with_params(layout, 1 << 22, layout.valid_hashes(7)).unwrap();
        let mut inserted = 0_u64;
        let mut checked = 0;
        for hash in common::hashes(5, 1_000_000) {
            filter.insert_hashed(hash);
            inserted += 1;
            if inserted.is_multiple_of(10_000) {
                if filter.fill_ratio() > 0.7 {
                    break;
                }
                let estimate = filter.estimated_items();
                let error = (estimate - inserted as f64).abs() / inserted as f64;
                assert!(
                    error <= 0.02,
                    "{layout}: {inserted} inserted, estimated {estimate:.0} at fill {:.3}",
                    filter.fill_ratio()
                );
                checked += 1;
            }
        }
        assert!(filter.fill_ratio() > 0.69, "the test must reach fill 0.7");
        assert!(checked > 20);
    }
}

#[test]
fn ones_is_exact() {
    for layout in Layout::ALL {
        let filter = BloomFilter::with_params(layout, 1 << 16, layout.valid_hashes(5)).unwrap();
        for hash in common::hashes(6, 5_000) {
            filter.insert_hashed(hash);
        }
        let bytes = filter.to_snapshot_bytes();
        let words = &bytes[48..bytes.len() - 8];
        let counted: u64 = words
            .chunks_exact(8)
            .map(|w| u64::from(u64::from_le_bytes(w.try_into().unwrap()).count_ones()))
            .sum();
        assert_eq!(filter.ones(), counted);
        assert_eq!(filter.fill_ratio(), counted as f64 / filter.bits() as f64);
    }
}

#[test]
fn health_figures_agree_with_methods() {
    let filter = BloomFilter::new(100_000, 0.01).unwrap();
    for hash in common::hashes(7, 100_000) {
        filter.insert_hashed(hash);
    }
    let health = filter.health();
    assert_eq!(health.bits, filter.bits());
    assert_eq!(health.hashes, 7);
    assert_eq!(health.ones, filter.ones());
    // At capacity the fill is about one half and the rate about the target.
    assert!((health.fill_ratio - 0.5).abs() < 0.02, "{health:?}");
    assert!(
        (health.estimated_fp_rate - 0.01).abs() < 0.001,
        "{health:?}"
    );
    assert!(health.memory_bytes >= filter.bits() / 8);
    assert!(health.memory_bytes < filter.bits() / 8 + 1024);

    let counting = CountingBloomFilter::new(100_000, 0.01).unwrap();
    for hash in common::hashes(7, 100_000) {
        counting.insert_hashed(hash);
    }
    let health = counting.health();
    assert!(
        (health.estimated_items - 100_000.0).abs() < 2_000.0,
        "{health:?}"
    );
    assert!(
        (health.estimated_fp_rate - 0.01).abs() < 0.001,
        "{health:?}"
    );
    assert!(health.memory_bytes >= counting.counters() / 2);
}

#[test]
fn bad_parameters_are_typed_errors() {
    use bloom_core::FilterError;
    assert_eq!(
        BloomFilter::new(0, 0.01).unwrap_err(),
        FilterError::ZeroExpectedItems
    );
    for p in [0.0, 1.0, -0.5, f64::NAN, 2.0] {
        assert!(
            matches!(BloomFilter::new(10, p), Err(FilterError::InvalidFpRate(_))),
            "{p}"
        );
    }
    assert_eq!(
        BloomFilter::with_params(Layout::Standard, 0, 3).unwrap_err(),
        FilterError::ZeroBits
    );
    assert_eq!(
        BloomFilter::with_params(Layout::Standard, 1024, 0).unwrap_err(),
        FilterError::InvalidHashes(0)
    );
    assert_eq!(
        BloomFilter::with_params(Layout::Blocked, 1024, 65).unwrap_err(),
        FilterError::InvalidHashes(65)
    );
    assert_eq!(
        BloomFilter::with_params(Layout::SplitBlock, 1024, 12).unwrap_err(),
        FilterError::SplitBlockHashes(12)
    );
    assert_eq!(
        BloomFilter::with_params(Layout::SplitBlock256, 1024, 7).unwrap_err(),
        FilterError::SplitBlockHashes(7)
    );
    for layout in Layout::ALL {
        assert_eq!(layout.to_string().parse::<Layout>(), Ok(layout));
    }
    assert_eq!(
        "split".parse::<Layout>(),
        Err(FilterError::UnknownLayout("split".into()))
    );
    assert!(matches!(
        BloomFilter::with_params(Layout::Standard, u64::MAX, 3),
        Err(FilterError::TooLarge { .. })
    ));
    assert!(matches!(
        BloomFilter::new(u64::MAX / 2, 1e-9),
        Err(FilterError::TooLarge { .. })
    ));
    assert!(matches!(
        BloomFilter::with_layout(Layout::Blocked, u64::MAX / 2, 1e-9),
        Err(FilterError::TooLarge { .. })
    ));
}

#[test]
fn union_adds_every_key_and_refuses_other_shapes() {
    let a = BloomFilter::new(10_000, 0.01).unwrap();
    let b = BloomFilter::new(10_000, 0.01).unwrap();
    let left = common::hashes(8, 3_000);
    let right = common::hashes(9, 3_000);
    left.iter().for_each(|&h| {
        a.insert_hashed(h);
    });
    right.iter().for_each(|&h| {
        b.insert_hashed(h);
    });
    let both = BloomFilter::new(10_000, 0.01).unwrap();
    left.iter().chain(&right).for_each(|&h| {
        both.insert_hashed(h);
    });
    a.union_with(&b).unwrap();
    assert!(left.iter().chain(&right).all(|&h| a.contains_hashed(h)));
    assert_eq!(a.ones(), both.ones());
    assert_eq!(a.to_snapshot_bytes(), both.to_snapshot_bytes());

    let other = BloomFilter::new(20_000, 0.01).unwrap();
    assert!(a.union_with(&other).is_err());
    let blocked = BloomFilter::with_params(Layout::Blocked, a.bits(), a.hashes()).unwrap();
    assert!(a.union_with(&blocked).is_err());
}

#[test]
fn batch_queries_answer_like_single_ones() {
    for layout in Layout::ALL {
        let filter = BloomFilter::with_layout(layout, 10_000, 0.01).unwrap();
        let present = common::hashes(10, 10_000);
        present.iter().for_each(|&h| {
            filter.insert_hashed(h);
        });
        let mut queries = present.clone();
        queries.extend(common::hashes(11, 10_003));
        let mut answers = vec![true; 3];
        filter.contains_batch_into(&queries, &mut answers);
        assert_eq!(answers.len(), queries.len());
        for (hash, answer) in queries.iter().zip(&answers) {
            assert_eq!(filter.contains_hashed(*hash), *answer);
        }
        assert!(answers[..10_000].iter().all(|&a| a));
        filter.contains_batch_into(&[], &mut answers);
        assert!(answers.is_empty());
    }
}

/// Beyond 2^32 bits every index must stay reachable. Were the index
/// truncated to 32 bits (the bug other crates had), k = 1 keys would land in
/// the low 2^32 bits only and the false-positive rate would double.
#[test]
fn filters_beyond_two_to_the_32_bits_keep_their_rate() {
    for layout in Layout::ALL {
        let bits = 1_u64 << 33;
        let filter = BloomFilter::with_params(layout, bits, layout.valid_hashes(1)).unwrap();
        let n = 1_u64 << 22;
        for i in 0..n {
            filter.insert(common::url(12, i).as_bytes());
        }
        let queries = 1_u64 << 22;
        let hits = (0..queries)
            .filter(|&i| filter.contains(common::url(13, i).as_bytes()))
            .count() as f64;
        let predicted = filter.model_fp_rate(n) * queries as f64;
        assert!(
            (hits - predicted).abs() < 6.0 * predicted.sqrt(),
            "{layout}: {hits} false positives, model {predicted:.0}"
        );
        let estimate = filter.estimated_items();
        assert!(
            (estimate - n as f64).abs() / (n as f64) < 0.01,
            "{layout}: {estimate}"
        );
    }
}
