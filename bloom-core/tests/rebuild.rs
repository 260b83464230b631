//! Online rebuild: inserts and queries go on, and no key is ever missed.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use bloom_core::{BloomFilter, FilterError, KeyHash, Layout, PartitionedBloom};

/// The frontier's protocol in miniature: a key is recorded in the store,
/// then inserted into the filter, then acknowledged. Rebuilds read the store
/// after they begin. Four threads insert (two of them into the partition
/// being rebuilt), four query every acknowledged key continuously, and the
/// rebuilder rebuilds partition 0 over and over with alternating sizes and
/// layouts. A single missed key fails the test.
#[test]
fn rebuild_while_four_threads_insert_and_query_misses_nothing() {
    const PARTITIONS: usize = 2;
    const INSERTERS: u32 = 4;
    const PER_INSERTER: u64 = 150_000;
    let set = PartitionedBloom::new(PARTITIONS, Layout::Standard, 10_000, 0.01).unwrap();
    let store: Vec<Mutex<Vec<KeyHash>>> = (0..PARTITIONS).map(|_| Mutex::new(Vec::new())).collect();
    let acked: RwLock<Vec<(usize, KeyHash)>> = RwLock::new(Vec::new());
    let inserting = AtomicUsize::new(INSERTERS as usize);
    let rebuilds = AtomicUsize::new(0);
    let overlapping = AtomicUsize::new(0);
    let checks = AtomicUsize::new(0);
    let stop_queries = AtomicBool::new(false);

    std::thread::scope(|scope| {
        for inserter in 0..INSERTERS {
            let (set, store, acked, inserting) = (&set, &store, &acked, &inserting);
            scope.spawn(move || {
                let partition = (inserter as usize) % PARTITIONS;
                for hash in common::hashes(50 + inserter, PER_INSERTER) {
                    store[partition].lock().unwrap().push(hash);
                    set.insert(partition, hash).unwrap();
                    assert!(set.contains(partition, hash).unwrap());
                    acked.write().unwrap().push((partition, hash));
                }
                inserting.fetch_sub(1, Ordering::SeqCst);
            });
        }
        for querier in 0..4_usize {
            let (set, acked, stop, checks) = (&set, &acked, &stop_queries, &checks);
            scope.spawn(move || {
                let mut position = querier * 7919;
                while !stop.load(Ordering::SeqCst) {
                    let sample: Vec<(usize, KeyHash)> = {
                        let acked = acked.read().unwrap();
                        if acked.is_empty() {
                            continue;
                        }
                        // The newest keys (the ones a swap could lose) and a
                        // moving window over older ones.
                        let newest = acked.len().saturating_sub(64);
                        position = (position + 4099) % acked.len();
                        acked[newest..]
                            .iter()
                            .chain(acked[position..].iter().take(64))
                            .copied()
                            .collect()
                    };
                    for (partition, hash) in sample {
                        assert!(
                            set.contains(partition, hash).unwrap(),
                            "acknowledged key missed"
                        );
                    }
                    checks.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let (set, store, inserting, rebuilds) = (&set, &store, &inserting, &rebuilds);
        let (stop, overlapping) = (&stop_queries, &overlapping);
        scope.spawn(move || {
            let mut round = 0_u64;
            loop {
                // The last round starts after every insert returned, so its
                // feed must hold every stored key.
                let inserts_done = inserting.load(Ordering::SeqCst) == 0;
                let layout = if round.is_multiple_of(2) {
                    Layout::Blocked
                } else {
                    Layout::Standard
                };
                let filter =
                    BloomFilter::with_layout(layout, 20_000 + round * 1_000, 0.01).unwrap();
                let report = set
                    .rebuild(0, filter, || store[0].lock().unwrap().clone())
                    .unwrap();
                assert_eq!(report.partition, 0);
                rebuilds.fetch_add(1, Ordering::SeqCst);
                if inserting.load(Ordering::SeqCst) > 0 {
                    overlapping.fetch_add(1, Ordering::SeqCst);
                }
                round += 1;
                if inserts_done && round >= 3 {
                    break;
                }
            }
            stop.store(true, Ordering::SeqCst);
        });
    });

    assert!(rebuilds.load(Ordering::SeqCst) >= 3);
    eprintln!(
        "{} rebuilds, {} of them while inserts ran",
        rebuilds.load(Ordering::SeqCst),
        overlapping.load(Ordering::SeqCst)
    );
    assert!(
        overlapping.load(Ordering::SeqCst) >= 2,
        "rebuilds must overlap the inserts"
    );
    assert!(checks.load(Ordering::Relaxed) > 0);
    for (partition, hash) in acked.read().unwrap().iter() {
        assert!(
            set.contains(*partition, *hash).unwrap(),
            "key lost after the last rebuild"
        );
    }
    let health = set.health();
    assert_eq!(
        health.partitions[0].rebuilds as usize,
        rebuilds.load(Ordering::SeqCst)
    );
    assert!(!health.partitions[0].rebuilding);
    let last = health.partitions[0].last_rebuild.unwrap();
    assert_eq!(
        last.keys_fed,
        PER_INSERTER * 2,
        "the final rebuild saw every stored key"
    );
}

#[test]
fn abandoned_rebuild_keeps_every_key_and_frees_the_partition() {
    let set = PartitionedBloom::new(1, Layout::Standard, 1_000, 0.01).unwrap();
    let before = common::hashes(60, 500);
    before.iter().for_each(|&h| {
        set.insert(0, h).unwrap();
    });
    let during = common::hashes(61, 500);
    {
        let rebuild = set
            .begin_rebuild(0, BloomFilter::new(2_000, 0.01).unwrap())
            .unwrap();
        rebuild.extend(before[..10].iter().copied());
        during.iter().for_each(|&h| {
            set.insert(0, h).unwrap();
        });
        assert!(set.health().partitions[0].rebuilding);
        assert!(set.is_rebuilding(0).unwrap());
        assert_eq!(set.health().partitions[0].rebuild_fed, 10);
        assert_eq!(
            set.begin_rebuild(0, BloomFilter::new(10, 0.1).unwrap())
                .err(),
            Some(FilterError::AlreadyRebuilding(0))
        );
        // Dropped here without finish.
    }
    assert!(
        before
            .iter()
            .chain(&during)
            .all(|&h| set.contains(0, h).unwrap())
    );
    let health = set.health().partitions[0];
    assert!(!health.rebuilding);
    assert!(!set.is_rebuilding(0).unwrap());
    assert_eq!(health.rebuilds, 0);
    assert!(
        set.begin_rebuild(0, BloomFilter::new(10, 0.1).unwrap())
            .is_ok()
    );
}

#[test]
fn rebuild_shrinks_fill_and_reports_itself() {
    // More keys than one of `extend`'s batches, so that several are fed.
    let set = PartitionedBloom::new(3, Layout::Blocked, 3_000, 0.01).unwrap();
    let keys = common::hashes(62, 10_000);
    keys.iter().for_each(|&h| {
        set.insert(1, h).unwrap();
    });
    assert_eq!(set.needs_rebuild(0.6), vec![1]);
    let bits_before = set.filter(1).unwrap().bits();
    let report = set
        .rebuild(
            1,
            BloomFilter::with_layout(Layout::Blocked, 20_000, 0.01).unwrap(),
            || keys.clone(),
        )
        .unwrap();
    assert_eq!(report.bits_before, bits_before);
    assert!(report.bits_after > bits_before);
    assert_eq!(report.keys_fed, 10_000);
    assert!(set.needs_rebuild(0.6).is_empty());
    assert!(keys.iter().all(|&h| set.contains(1, h).unwrap()));
    let health = set.health();
    assert_eq!(health.total.rebuilds, 1);
    assert_eq!(health.total.partitions, 3);
    assert_eq!(
        health.total.bits,
        health.partitions.iter().map(|p| p.filter.bits).sum::<u64>()
    );
    assert!(
        (health.total.estimated_items - 10_000.0).abs() < 300.0,
        "{:?}",
        health.total
    );
}

#[test]
fn bad_partition_indexes_are_errors() {
    let set = PartitionedBloom::new(2, Layout::Standard, 10, 0.1).unwrap();
    let hash = KeyHash::of(b"k");
    let missing = FilterError::NoSuchPartition {
        partition: 2,
        partitions: 2,
    };
    assert_eq!(set.insert(2, hash), Err(missing.clone()));
    assert_eq!(set.contains(2, hash), Err(missing.clone()));
    assert_eq!(set.filter(2).err(), Some(missing.clone()));
    assert_eq!(set.partition_health(2).err(), Some(missing));
    assert_eq!(
        PartitionedBloom::from_filters(vec![]).err(),
        Some(FilterError::ZeroPartitions)
    );
    assert!(matches!(
        PartitionedBloom::new(0, Layout::Standard, 10, 0.1),
        Err(FilterError::ZeroPartitions)
    ));
}

#[test]
fn replace_installs_a_snapshot() {
    let set = PartitionedBloom::new(2, Layout::Standard, 1_000, 0.01).unwrap();
    let keys = common::hashes(63, 500);
    keys.iter().for_each(|&h| {
        set.insert(1, h).unwrap();
    });
    let bytes = set.filter(1).unwrap().to_snapshot_bytes();
    let fresh = PartitionedBloom::new(2, Layout::Standard, 1_000, 0.01).unwrap();
    fresh
        .replace(1, BloomFilter::from_snapshot_bytes(&bytes).unwrap())
        .unwrap();
    assert!(keys.iter().all(|&h| fresh.contains(1, h).unwrap()));
}
