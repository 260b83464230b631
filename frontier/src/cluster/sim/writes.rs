//! A client's write in the simulation: routed by a node's view to the
//! partition's leader, which takes it under its own map and replicates it
//! to the followers that map names, dropping those that are stopped.

use std::collections::BTreeSet;

use super::super::map::PartitionMap;
use super::super::protocol;
use super::{PARTITIONS, Sim};

impl Sim {
    /// A client's write entering at `id`: routed by its view to the owner,
    /// which takes it only under the same epoch, for a partition its own map
    /// gives it, and not sealed.
    pub(super) fn write(&mut self, id: &str) {
        let partition = self.rng.below(PARTITIONS as usize) as u32;
        let entry = &self.nodes[id];
        let Some(map) = &entry.view.map else {
            return;
        };
        let epoch = map.epoch;
        let owner_id = map.owners[partition as usize].clone();
        let Some(owner) = self.nodes.get(&owner_id).filter(|owner| owner.up) else {
            return;
        };
        let Some(owner_map) = &owner.view.map else {
            return;
        };
        let forwarded = owner_id != id;
        if (forwarded && owner_map.epoch != epoch)
            || owner_map.owners[partition as usize] != owner_id
            || owner.sealed.contains_key(&partition)
        {
            return; // refused: the client tries again
        }
        if 1 + owner_map.followers_of(partition).len() < self.min_in_sync {
            return; // refused: too few copies in sync
        }
        let writing_epoch = owner_map.epoch;
        let owner_map = owner_map.clone();
        let owner_revision = owner.view.map_revision;
        let url = self.next_url;
        self.next_url += 1;
        let owner = self.node(&owner_id);
        owner.disk.entry(partition).or_default().insert(url);
        if let Some(noted) = owner.noted.get_mut(&partition) {
            noted.push(url);
        }
        for ((lagging_in, _), lag) in &mut owner.lags {
            if *lagging_in == partition {
                lag.insert(url);
            }
        }
        if !self.replicate(&owner_id, (&owner_map, owner_revision), partition, url) {
            return; // stored at the leader, not acknowledged
        }
        self.acked.entry(partition).or_default().insert(url);
        if self.verbose {
            self.note(format!(
                "{owner_id} acked {url} in {partition} (entered at {id})"
            ));
        }
        let writer = self
            .writers
            .entry((partition, writing_epoch))
            .or_insert_with(|| owner_id.clone());
        assert_eq!(
            *writer, owner_id,
            "two writers of partition {partition} in epoch {writing_epoch}"
        );
    }
    /// The leader sends a committed URL (and what it owes again after a
    /// takeover) to each follower its map names; a follower takes it only
    /// under its own epoch, from the leader its map names, for a partition
    /// it follows. Followers that are stopped are taken out of the in-sync
    /// set (`drop_followers`, as the sender does once its patience runs
    /// out) before the write may be acknowledged; answers whether it may.
    pub(super) fn replicate(
        &mut self,
        leader: &str,
        (map, revision): (&PartitionMap, i64),
        partition: u32,
        url: u64,
    ) -> bool {
        let leader_disk = self.nodes[leader]
            .disk
            .get(&partition)
            .cloned()
            .unwrap_or_default();
        let owed_again = self.nodes[leader].owed_again.get(&partition).cloned();
        let mut refused = BTreeSet::new();
        for follower in map.followers_of(partition) {
            let takes = self.nodes.get(follower).is_some_and(|node| {
                node.up
                    && node.view.map.as_ref().is_some_and(|own| {
                        own.epoch == map.epoch
                            && own.owners[partition as usize] == leader
                            && own.follows(follower, partition)
                    })
            });
            let key = (partition, follower.clone());
            if !takes {
                // Owed to it, in the leader's memory, until it takes it.
                self.node(leader).owed.entry(key).or_default().insert(url);
                if self.nodes.get(follower).is_some_and(|node| node.up) {
                    // Up but of another epoch: the views converge well
                    // within the sender's patience; the write waits, here
                    // unacknowledged, and the client sends it again.
                    return false;
                }
                refused.insert(follower.clone());
                continue;
            }
            let owes = owed_again
                .as_ref()
                .is_some_and(|owed| owed.contains(follower));
            let owed = self.node(leader).owed.remove(&key).unwrap_or_default();
            let node = self.node(follower);
            node.followed.insert(partition, leader.to_owned());
            let disk = node.disk.entry(partition).or_default();
            disk.insert(url);
            disk.extend(owed);
            if owes {
                disk.extend(leader_disk.iter().copied());
            }
        }
        if let Some(owed) = self.node(leader).owed_again.get_mut(&partition) {
            owed.retain(|follower| refused.contains(follower));
        }
        if refused.is_empty() {
            return true;
        }
        let led: BTreeSet<u32> = map
            .owned_by(leader)
            .filter(|&p| refused.iter().any(|f| map.follows(f, p)))
            .collect();
        let Ok(Some((next, txn))) =
            protocol::drop_followers((map, revision), &self.keys, leader, &led, &refused)
        else {
            return false;
        };
        if !self.store.apply(txn).is_ok_and(|answer| answer.succeeded) {
            return false;
        }
        self.note(format!(
            "{leader} dropped followers {refused:?} (epoch {})",
            next.epoch
        ));
        // Acknowledged only with enough copies left.
        1 + next.followers_of(partition).len() >= self.min_in_sync
    }
}
