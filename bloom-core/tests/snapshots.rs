//! Snapshot round trips, and every way of damaging one.

mod common;

use bloom_core::{BloomFilter, CountingBloomFilter, Layout, SnapshotError};
use proptest::prelude::*;

fn filled(layout: Layout, bits: u64, keys: u64) -> BloomFilter {
    let filter = BloomFilter::with_params(layout, bits, layout.valid_hashes(4)).unwrap();
    for hash in common::hashes(70, keys) {
        filter.insert_hashed(hash);
    }
    filter
}

/// What the fuzz target checks too: any input either fails with a typed
/// error or decodes to a filter that encodes back to exactly that input.
fn decode_is_exact_or_error(bytes: &[u8]) {
    if let Ok(filter) = BloomFilter::from_snapshot_bytes(bytes) {
        assert_eq!(filter.to_snapshot_bytes(), bytes);
    }
    if let Ok(filter) = CountingBloomFilter::from_snapshot_bytes(bytes) {
        assert_eq!(filter.to_snapshot_bytes(), bytes);
    }
    let _ = BloomFilter::read_snapshot(bytes);
    let _ = CountingBloomFilter::read_snapshot(bytes);
}

#[test]
fn round_trip_preserves_everything() {
    for layout in Layout::ALL {
        let filter = filled(layout, 100_000, 10_000);
        let bytes = filter.to_snapshot_bytes();
        let mut written = Vec::new();
        filter.write_snapshot(&mut written).unwrap();
        assert_eq!(bytes, written);

        let restored = BloomFilter::read_snapshot(&bytes[..]).unwrap();
        assert_eq!(restored.layout(), layout);
        assert_eq!(restored.bits(), filter.bits());
        assert_eq!(restored.hashes(), filter.hashes());
        assert_eq!(restored.ones(), filter.ones());
        assert_eq!(restored.health(), filter.health());
        assert!(
            common::hashes(70, 10_000)
                .into_iter()
                .all(|h| restored.contains_hashed(h))
        );
        let probes = common::hashes(71, 10_000);
        assert!(
            probes
                .iter()
                .all(|&h| restored.contains_hashed(h) == filter.contains_hashed(h))
        );
        assert_eq!(restored.to_snapshot_bytes(), bytes);
    }

    let counting = CountingBloomFilter::new(1_000, 0.01).unwrap();
    for i in 0..2_000_u32 {
        counting.insert(&(i % 700).to_le_bytes());
    }
    let bytes = counting.to_snapshot_bytes();
    let restored = CountingBloomFilter::from_snapshot_bytes(&bytes).unwrap();
    assert_eq!(restored.nonzero(), counting.nonzero());
    assert_eq!(restored.saturated(), counting.saturated());
    assert_eq!(restored.health(), counting.health());
    for index in 0..counting.counters() {
        assert_eq!(restored.counter(index), counting.counter(index));
    }
    assert_eq!(restored.to_snapshot_bytes(), bytes);
}

#[test]
fn every_truncation_is_reported() {
    for bytes in [
        filled(Layout::Standard, 1024, 50).to_snapshot_bytes(),
        CountingBloomFilter::with_params(64, 3)
            .unwrap()
            .to_snapshot_bytes(),
    ] {
        for len in 0..bytes.len() {
            let bloom = BloomFilter::from_snapshot_bytes(&bytes[..len]);
            let counting = CountingBloomFilter::from_snapshot_bytes(&bytes[..len]);
            // A truncated input may fail its kind check first; it may never
            // succeed.
            assert!(bloom.is_err() && counting.is_err(), "length {len}");
            if len < 48 {
                assert!(
                    matches!(bloom, Err(SnapshotError::Truncated)),
                    "length {len}: {bloom:?}"
                );
            }
        }
        // Through a reader too, cut inside the words and inside the checksum.
        for len in [60, bytes.len() - 1] {
            let (bloom, counting) = (
                BloomFilter::read_snapshot(&bytes[..len]),
                CountingBloomFilter::read_snapshot(&bytes[..len]),
            );
            assert!(
                matches!(bloom, Err(SnapshotError::Truncated))
                    || matches!(counting, Err(SnapshotError::Truncated)),
                "length {len}: {bloom:?} {counting:?}"
            );
        }
    }
}

#[test]
fn every_bit_flip_is_refused() {
    for bytes in [
        filled(Layout::Standard, 512, 30).to_snapshot_bytes(),
        filled(Layout::Blocked, 1024, 30).to_snapshot_bytes(),
        filled(Layout::SplitBlock, 512, 30).to_snapshot_bytes(),
        filled(Layout::SplitBlock256, 512, 30).to_snapshot_bytes(),
        CountingBloomFilter::with_params(32, 2)
            .unwrap()
            .to_snapshot_bytes(),
    ] {
        for byte in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[byte] ^= 1 << bit;
                assert!(
                    BloomFilter::from_snapshot_bytes(&damaged).is_err(),
                    "byte {byte} bit {bit}"
                );
                assert!(
                    CountingBloomFilter::from_snapshot_bytes(&damaged).is_err(),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }
}

/// Rewrites a header field and recomputes the checksum, so that the field's
/// own check (not the checksum) must catch it.
fn with_field(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
    let mut out = bytes[..bytes.len() - 8].to_vec();
    out[at..at + value.len()].copy_from_slice(value);
    // The format's checksum: xxh3-64 (seed 0) of everything before it.
    let checksum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

#[test]
fn header_fields_get_their_own_errors() {
    let bytes = filled(Layout::Standard, 1024, 40).to_snapshot_bytes();
    assert!(
        BloomFilter::from_snapshot_bytes(&with_field(&bytes, 11, &[2])).is_ok(),
        "layout 2 is valid"
    );

    type IsExpected = fn(&SnapshotError) -> bool;
    let cases: Vec<(Vec<u8>, IsExpected)> = vec![
        (with_field(&bytes, 0, b"NOTBLOOM"), |e| {
            matches!(e, SnapshotError::BadMagic)
        }),
        (with_field(&bytes, 8, &2_u16.to_le_bytes()), |e| {
            matches!(e, SnapshotError::UnsupportedVersion(2))
        }),
        (with_field(&bytes, 10, &[2]), |e| {
            matches!(e, SnapshotError::KindMismatch { .. })
        }),
        (with_field(&bytes, 10, &[9]), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 11, &[7]), |e| {
            matches!(e, SnapshotError::UnknownLayout(7))
        }),
        // Split-block (layout 3) with this snapshot's k = 4: not a multiple
        // of 8.
        (with_field(&bytes, 11, &[3]), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 12, &[2]), |e| {
            matches!(e, SnapshotError::HashMismatch { id: 2, .. })
        }),
        (with_field(&bytes, 16, &1_u64.to_le_bytes()), |e| {
            matches!(e, SnapshotError::HashMismatch { seed: 1, .. })
        }),
        (with_field(&bytes, 13, &[1]), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 24, &1000_u64.to_le_bytes()), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 24, &2048_u64.to_le_bytes()), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 32, &0_u32.to_le_bytes()), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 32, &65_u32.to_le_bytes()), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
        (with_field(&bytes, 40, &17_u64.to_le_bytes()), |e| {
            matches!(e, SnapshotError::InvalidHeader(_))
        }),
    ];
    for (index, (damaged, expected)) in cases.iter().enumerate() {
        let error = BloomFilter::from_snapshot_bytes(damaged).unwrap_err();
        assert!(expected(&error), "case {index}: {error}");
    }

    let counting = CountingBloomFilter::with_params(64, 3)
        .unwrap()
        .to_snapshot_bytes();
    assert!(matches!(
        BloomFilter::from_snapshot_bytes(&counting),
        Err(SnapshotError::KindMismatch {
            expected: "Bloom",
            found: "counting Bloom"
        })
    ));
    assert!(matches!(
        CountingBloomFilter::from_snapshot_bytes(&bytes),
        Err(SnapshotError::KindMismatch { .. })
    ));
    assert!(matches!(
        CountingBloomFilter::from_snapshot_bytes(&with_field(&counting, 11, &[2])),
        Err(SnapshotError::InvalidHeader(_))
    ));

    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        BloomFilter::from_snapshot_bytes(&trailing),
        Err(SnapshotError::TrailingBytes(1))
    ));
    // A reader stops at the snapshot's end and leaves the rest.
    assert!(BloomFilter::read_snapshot(&trailing[..]).is_ok());

    let mut bad_checksum = bytes.clone();
    let last = bad_checksum.len() - 1;
    bad_checksum[last] ^= 0xff;
    assert!(matches!(
        BloomFilter::from_snapshot_bytes(&bad_checksum),
        Err(SnapshotError::ChecksumMismatch { .. })
    ));
}

/// A damaged header claiming a filter of 2^45 bits over a few bytes of data
/// fails as truncated, quickly, without allocating the claimed size.
#[test]
fn a_huge_claimed_size_does_not_allocate_it() {
    let bytes = filled(Layout::Standard, 1024, 40).to_snapshot_bytes();
    let bits = 1_u64 << 45;
    let mut damaged = bytes[..48].to_vec();
    damaged[24..32].copy_from_slice(&bits.to_le_bytes());
    damaged[40..48].copy_from_slice(&(bits / 64).to_le_bytes());
    damaged.extend_from_slice(&[0xab; 4096]);
    assert!(matches!(
        BloomFilter::from_snapshot_bytes(&damaged),
        Err(SnapshotError::Truncated)
    ));
}

#[test]
fn io_errors_are_reported() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    impl std::io::Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    assert!(matches!(
        BloomFilter::read_snapshot(Failing),
        Err(SnapshotError::Io(_))
    ));
    assert!(matches!(
        BloomFilter::new(10, 0.1).unwrap().write_snapshot(Failing),
        Err(SnapshotError::Io(_))
    ));
}

/// A snapshot taken while other threads insert holds every key inserted
/// before it started.
#[test]
fn snapshot_during_inserts_holds_earlier_keys() {
    let filter = BloomFilter::new(200_000, 0.01).unwrap();
    let before = common::hashes(72, 50_000);
    before.iter().for_each(|&h| {
        filter.insert_hashed(h);
    });
    let bytes = std::thread::scope(|scope| {
        scope.spawn(|| {
            for hash in common::hashes(73, 100_000) {
                filter.insert_hashed(hash);
            }
        });
        filter.to_snapshot_bytes()
    });
    let restored = BloomFilter::from_snapshot_bytes(&bytes).unwrap();
    assert!(before.iter().all(|&h| restored.contains_hashed(h)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Random damage (overwrites, cuts, additions) to valid snapshots of
    /// every kind: never a panic, never a filter that is not the input.
    #[test]
    fn damaged_snapshots_never_decode_wrong(
        which in 0_usize..5,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
        extra in prop::collection::vec(any::<u8>(), 0..3),
    ) {
        let mut bytes = match which {
            0 => filled(Layout::Standard, 512, 20).to_snapshot_bytes(),
            1 => filled(Layout::Blocked, 1024, 20).to_snapshot_bytes(),
            2 => filled(Layout::SplitBlock, 1024, 20).to_snapshot_bytes(),
            3 => filled(Layout::SplitBlock256, 1024, 20).to_snapshot_bytes(),
            _ => CountingBloomFilter::with_params(48, 2).unwrap().to_snapshot_bytes(),
        };
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        bytes.extend(extra);
        decode_is_exact_or_error(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        decode_is_exact_or_error(&bytes);
    }
}
