//! The `url_records` writes one held layer holds (module `held`): a hash
//! map per filter partition, sorted only when read in key order.
//!
//! Every URL a group is offered is looked up in the held layers, and every
//! URL it stores is held: at scale a layer holds millions of keys, and a
//! key-ordered map costs a walk of a dozen nodes (each a cache miss) per
//! lookup, where a hash map costs one or two. Key order is wanted only by
//! the applier (once a layer) and by range reads, which all lie within one
//! partition but a whole-store scan: a map per partition keeps their cost
//! to the partition's keys.
//!
//! What the maps cost in memory is counted per key, at the most a key's
//! share of a table can be (right after the table doubled) plus its
//! value's bytes as the allocator rounds them: the count bounds what the
//! maps take, and grows smoothly. Counted by their tables' allocations,
//! it jumped as the partitions' tables (which fill at one pace) doubled
//! together, and groups paced by it ran into the held limit.

use std::ops::{Bound, RangeBounds};

use rustc_hash::FxHashMap;

use super::schema::RecordKey;

/// A held value: `None` for a removed key. Boxed, not a `Vec`: a smaller
/// slot in the table.
pub(super) type HeldValue = Option<Box<[u8]>>;

/// One partition's keys, by (crawl number, URL hash). The hash is the
/// store's seeded hash of the URL, so its keys are spread evenly by a
/// cheap hasher.
type PartitionMap = FxHashMap<(u32, u64), HeldValue>;

/// Held `url_records` writes, by key.
#[derive(Debug, Default)]
pub(super) struct RecordMap {
    /// Indexed by partition; grown as keys of higher partitions come
    /// (partitions are few, and fixed when the store is created).
    partitions: Vec<PartitionMap>,
    /// What its keys cost, as counted (module doc).
    bytes: usize,
}

/// The most a key's share of its table can be: a slot and a control byte
/// per bucket, and a table at least 7 keys in 16 buckets once it holds
/// more than a few (it doubles when 7 in 8 are full).
const KEY_SHARE: usize = (std::mem::size_of::<((u32, u64), HeldValue)>() + 1) * 16 / 7 + 1;

/// What a value takes on the heap: its bytes rounded up to the
/// allocator's size classes (multiples of 16 bound those of small sizes).
fn value_bytes(value: &HeldValue) -> usize {
    value
        .as_ref()
        .map_or(0, |value| value.len().next_multiple_of(16))
}

impl RecordMap {
    pub(super) fn len(&self) -> usize {
        self.partitions.iter().map(PartitionMap::len).sum()
    }

    /// Bytes of memory it holds, as counted (module doc).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn get(&self, &(partition, crawl, hash): &RecordKey) -> Option<&HeldValue> {
        self.partitions.get(partition as usize)?.get(&(crawl, hash))
    }

    /// Sets `key`'s value; answers the one it replaces.
    pub(super) fn insert(
        &mut self,
        (partition, crawl, hash): RecordKey,
        value: HeldValue,
    ) -> Option<HeldValue> {
        let index = partition as usize;
        if index >= self.partitions.len() {
            self.partitions
                .resize_with(index + 1, PartitionMap::default);
        }
        self.bytes += value_bytes(&value);
        let replaced = self.partitions[index].insert((crawl, hash), value);
        match &replaced {
            Some(old) => self.bytes = self.bytes.saturating_sub(value_bytes(old)),
            None => self.bytes += KEY_SHARE,
        }
        replaced
    }

    /// The entries whose keys are in `range`, in no order.
    pub(super) fn entries_in<'a>(
        &'a self,
        range: &'a (impl RangeBounds<RecordKey> + 'a),
    ) -> impl Iterator<Item = (RecordKey, &'a HeldValue)> + 'a {
        let count = self.partitions.len();
        let end = match range.end_bound() {
            Bound::Included(key) | Bound::Excluded(key) => (key.0 as usize + 1).min(count),
            Bound::Unbounded => count,
        };
        let start = match range.start_bound() {
            Bound::Included(key) | Bound::Excluded(key) => (key.0 as usize).min(end),
            Bound::Unbounded => 0,
        };
        (self.partitions[start..end].iter())
            .zip(start as u32..)
            .flat_map(|(map, partition)| {
                map.iter()
                    .map(move |(&(crawl, hash), value)| ((partition, crawl, hash), value))
            })
            .filter(|(key, _)| range.contains(key))
    }

    /// Every key, in no order.
    pub(super) fn keys(&self) -> impl Iterator<Item = RecordKey> + '_ {
        (self.partitions.iter().zip(0_u32..)).flat_map(|(map, partition)| {
            map.keys()
                .map(move |&(crawl, hash)| (partition, crawl, hash))
        })
    }

    /// One past the highest partition it has held keys of.
    pub(super) fn partitions(&self) -> u32 {
        u32::try_from(self.partitions.len()).unwrap_or(u32::MAX)
    }

    /// The entries of one partition, in key order.
    pub(super) fn in_order_of(&self, partition: u32) -> Vec<(RecordKey, &HeldValue)> {
        let Some(map) = self.partitions.get(partition as usize) else {
            return Vec::new();
        };
        let mut sorted: Vec<(RecordKey, &HeldValue)> = (map.iter())
            .map(|(&(crawl, hash), value)| ((partition, crawl, hash), value))
            .collect();
        sorted.sort_unstable_by_key(|(key, _)| *key);
        sorted
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::held::{HeldRecords, HeldRecordsCopy};
    use super::*;

    fn key() -> impl Strategy<Value = RecordKey> {
        // Few values per field, so that keys repeat and ranges catch some.
        (0u32..5, 0u32..3, 0u64..20)
    }

    fn value() -> impl Strategy<Value = HeldValue> {
        proptest::option::of(
            proptest::collection::vec(any::<u8>(), 0..3).prop_map(Vec::into_boxed_slice),
        )
    }

    fn range() -> impl Strategy<Value = (Bound<RecordKey>, Bound<RecordKey>)> {
        let bound = || {
            prop_oneof![
                key().prop_map(Bound::Included),
                key().prop_map(Bound::Excluded),
                Just(Bound::Unbounded),
            ]
        };
        (bound(), bound())
    }

    fn filled(entries: &[(RecordKey, HeldValue)]) -> (RecordMap, BTreeMap<RecordKey, HeldValue>) {
        let mut map = RecordMap::default();
        let mut model = BTreeMap::new();
        for (key, value) in entries {
            assert_eq!(
                map.insert(*key, value.clone()),
                model.insert(*key, value.clone())
            );
        }
        (map, model)
    }

    /// The tables never take more than their keys are counted for, past
    /// their first few keys, as they grow.
    #[test]
    fn the_tables_take_no_more_than_their_keys_are_counted_for() {
        let partitions = 8_u32;
        let mut map = RecordMap::default();
        let mut hash = 0x9e37_79b9_7f4a_7c15_u64;
        let mut values = 0;
        for count in 1..=200_000_usize {
            hash = hash.rotate_left(17).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ count as u64;
            let value: HeldValue = Some(vec![0; count % 90].into_boxed_slice());
            values += value_bytes(&value);
            map.insert(((hash % u64::from(partitions)) as u32, 0, hash), value);
            if count >= 1_000 {
                let slot = std::mem::size_of::<((u32, u64), HeldValue)>() + 1;
                let tables: usize = (map.partitions.iter())
                    .map(|map| map.capacity().div_ceil(7) * 8 * slot)
                    .sum();
                assert!(tables <= map.bytes() - values, "{tables} for {count} keys");
            }
        }
    }

    proptest! {
        /// Lookups, length, ranges and the ordered partitions agree with a
        /// key-ordered map of the same inserts.
        #[test]
        fn a_record_map_reads_as_a_key_ordered_map(
            entries in proptest::collection::vec((key(), value()), 0..60),
            probes in proptest::collection::vec(key(), 0..20),
            (start, end) in range(),
        ) {
            let (map, model) = filled(&entries);
            prop_assert_eq!(map.len(), model.len());
            let counted = model.len() * KEY_SHARE + model.values().map(value_bytes).sum::<usize>();
            prop_assert_eq!(map.bytes(), counted);
            for probe in &probes {
                prop_assert_eq!(map.get(probe), model.get(probe));
            }
            let walked: Vec<_> = (0..map.partitions())
                .flat_map(|partition| map.in_order_of(partition))
                .map(|(key, value)| (key, value.clone()))
                .collect();
            let ordered: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
            prop_assert_eq!(walked, ordered);
            // A range whose start lies past its end is empty (BTreeMap
            // panics on it, so it is checked against a filter of the walk).
            let range = (start, end);
            let mut in_range: Vec<_> = map.entries_in(&range).map(|(k, v)| (k, v.clone())).collect();
            in_range.sort_unstable_by_key(|(key, _)| *key);
            let expected: Vec<_> = model.iter()
                .filter(|(key, _)| range.contains(key))
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            prop_assert_eq!(in_range, expected);
        }

        /// The overlay of two layers holds each key once, with the newer
        /// layer's value where both have it, in key order.
        #[test]
        fn the_newer_layer_wins_an_overlay(
            newer in proptest::collection::vec((key(), value()), 0..40),
            older in proptest::collection::vec((key(), value()), 0..40),
        ) {
            let (newer, newer_model) = filled(&newer);
            let (older, older_model) = filled(&older);
            let mut model = older_model;
            model.extend(newer_model);
            let copy = |map: &RecordMap| -> HeldRecords {
                map.entries_in(&..).map(|(k, v)| (k, v.as_deref().map(<[u8]>::to_vec))).collect()
            };
            let merged = HeldRecordsCopy { newer: copy(&newer), older: copy(&older) }.in_order();
            let expected: Vec<_> = model.into_iter().map(|(k, v)| (k, v.map(Vec::from))).collect();
            prop_assert_eq!(merged, expected);
        }
    }
}
