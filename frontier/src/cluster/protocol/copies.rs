//! The replica set's decisions: which partitions get a new follower and
//! where, which followers are let go, who leads a partition whose leader
//! is gone or removed, and which followers leave the in-sync set. Each
//! answers the map it makes and the transaction that writes it,
//! conditional on the map as read.

use std::collections::{BTreeMap, BTreeSet};

use super::super::View;
use super::super::coordination::{Condition, Txn, Write};
use super::super::map::{ClusterFacts, MoveKind, MovePhase, MoveRecord, PartitionMap};
use super::{Keys, Planned, json, moves_in_flight, start_move};

/// When copies short of the count are made again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::cluster) struct CopyPolicy {
    /// Copies kept of each partition.
    pub(in crate::cluster) replicas: u32,
    /// Copies a write needs: a partition below it is copied at once.
    pub(in crate::cluster) min_in_sync: u32,
    /// How long a partition that still takes writes waits, short of a
    /// copy, for the node that held it to come back before it is copied
    /// elsewhere (a restart is not worth a copy).
    pub(in crate::cluster) replace_after_ms: u64,
    /// Since when (UTC ms) the elected node has seen each partition short.
    pub(in crate::cluster) short_since: BTreeMap<u32, u64>,
}

impl CopyPolicy {
    /// Notes which partitions of `view` are short of copies now, keeping
    /// the time each was first seen so.
    pub(in crate::cluster) fn observe(&mut self, view: &View, now_ms: u64) {
        let Some(map) = &view.map else {
            return;
        };
        let wanted = (self.replicas.max(1) as usize).min(view.members.len().max(1));
        let short: BTreeSet<u32> = (0..map.owners.len() as u32)
            .filter(|&p| 1 + map.followers_of(p).len() < wanted)
            .collect();
        self.short_since.retain(|p, _| short.contains(p));
        for p in short {
            self.short_since.entry(p).or_insert(now_ms);
        }
    }

    /// Whether a partition short of copies is copied now: at once below
    /// the copies writes need, or once removed nodes were named after it
    /// became short (`frontier cluster remove`), else after the wait.
    fn due(&self, partition: u32, copies: usize, replace_now_ms: u64, now_ms: u64) -> bool {
        let since = self.short_since.get(&partition).copied().unwrap_or(now_ms);
        copies < self.min_in_sync as usize
            || since <= replace_now_ms
            || now_ms.saturating_sub(since) >= self.replace_after_ms
    }
}

/// The leader's part for copies: a partition with fewer than `replicas`
/// copies gets a new follower (copied from its live leader) on the live
/// node, not draining and not holding it, that lags there (at once) or
/// else holds fewest copies (when the policy says it is due); one with
/// more lets its last followers go, and one back at its copies its
/// lagging ones, in one transaction. A few copies at a time, beside the
/// moves.
pub(in crate::cluster) fn plan_copies(
    view: &View,
    keys: &Keys,
    policy: &CopyPolicy,
    now_ms: u64,
) -> Vec<(Planned, Txn)> {
    let replicas = policy.replicas;
    let Some(map) = &view.map else {
        return Vec::new();
    };
    let wanted = replicas.max(1) as usize;
    let live: BTreeSet<&String> = view.members.keys().collect();
    let eligible: Vec<&String> = live
        .iter()
        .filter(|node| !view.draining.contains(**node))
        .copied()
        .collect();
    let mut held: BTreeMap<&str, usize> = eligible.iter().map(|n| (n.as_str(), 0)).collect();
    for node in map.owners.iter().chain(map.followers.iter().flatten()) {
        if let Some(count) = held.get_mut(node.as_str()) {
            *count += 1;
        }
    }
    let mut planned = Vec::new();
    let mut in_flight = view
        .moves
        .values()
        .filter(|(r, _)| r.kind == MoveKind::Replica && r.phase != MovePhase::Flipped)
        .count();
    let mut trimmed = map.clone();
    let mut trims = Vec::new();
    for (partition, owner) in map.owners.iter().enumerate() {
        let partition = partition as u32;
        let followers = map.followers_of(partition);
        let copies = 1 + followers.len();
        if copies > wanted {
            trimmed.followers_mut(partition).truncate(wanted - 1);
            trimmed.clear_lagging(partition);
            trims.push(partition);
            continue;
        }
        if copies == wanted && !map.lagging_of(partition).is_empty() {
            // Back at its copies: the lagging ones are let go (they drop
            // them, and the leader stops noting for them).
            trimmed.clear_lagging(partition);
            trims.push(partition);
            continue;
        }
        // A lagging copy back on a live node is made a copy again at once,
        // and before any other: its leader brings it up to date from what
        // it noted since, which costs less than waiting for it.
        let lagging = map.lagging_of(partition);
        let lagging_back = lagging.iter().any(|node| held.contains_key(node.as_str()));
        if copies == wanted
            || in_flight >= moves_in_flight(map.owners.len())
            || view.moves.contains_key(&partition)
            || !live.contains(owner)
            || !(lagging_back || policy.due(partition, copies, view.replace_now_ms, now_ms))
        {
            continue;
        }
        let Some(to) = held
            .iter()
            .filter(|(node, _)| !map.holds(node, partition))
            .min_by_key(|(node, count)| (!lagging.iter().any(|l| l == **node), **count, **node))
            .map(|(node, _)| (*node).to_owned())
        else {
            continue; // every eligible node holds it already
        };
        if let Some(count) = held.get_mut(to.as_str()) {
            *count += 1;
        }
        let record = MoveRecord::started(partition, (owner, &to), MoveKind::Replica, now_ms);
        planned.push((
            Planned::Replicate {
                partition,
                leader: owner.clone(),
                to,
            },
            start_move(keys, view.map_revision, &record),
        ));
        in_flight += 1;
    }
    if !trims.is_empty() {
        trimmed.epoch += 1;
        // Before the starts: they are conditional on the map as read.
        planned.insert(
            0,
            (
                Planned::Trim { partitions: trims },
                Txn::when(
                    vec![Condition::ModRevision(keys.map(), view.map_revision)],
                    vec![Write::put(keys.map(), json(&trimmed))],
                ),
            ),
        );
    }
    planned
}

/// A partition given to a follower: (partition, old leader, new leader).
pub(in crate::cluster) type Failover = (u32, String, String);

/// Partitions whose leader's registration lapsed, each given to its first
/// live in-sync follower in one transaction conditional on the map as
/// read (so it races neither a flip nor a leader dropping a follower), in
/// the next epoch; the old leader becomes its last follower. Answers
/// (partition, old leader, new leader) per failover, the map and the
/// transaction, which also ends the partitions' moves not yet flipped;
/// `None` when nothing fails over.
pub(in crate::cluster) fn failovers(
    view: &View,
    keys: &Keys,
) -> Option<(Vec<Failover>, PartitionMap, Txn)> {
    let map = view.map.as_ref()?;
    let mut next = map.clone();
    let mut changed = Vec::new();
    for (partition, owner) in map.owners.iter().enumerate() {
        let partition = u32::try_from(partition).ok()?;
        if view.members.contains_key(owner) {
            continue;
        }
        let followers = map.followers_of(partition);
        let Some(successor) = followers.iter().find(|f| view.members.contains_key(*f)) else {
            continue;
        };
        // The old leader stays as a follower: its disk holds every write
        // it acknowledged (and perhaps some it did not, which a client
        // sends again anyway), so until the new leader's sender takes it
        // out (at once, as its registration is gone) it is a copy a later
        // failover can fall back on.
        let rest: Vec<String> = followers
            .iter()
            .filter(|f| *f != successor)
            .cloned()
            .chain(std::iter::once(owner.clone()))
            .collect();
        next.owners[partition as usize].clone_from(successor);
        *next.followers_mut(partition) = rest;
        next.clear_lagging(partition);
        changed.push((partition, owner.clone(), successor.clone()));
    }
    if changed.is_empty() {
        return None;
    }
    next.epoch += 1;
    let mut when = vec![Condition::ModRevision(keys.map(), view.map_revision)];
    let mut then = vec![Write::put(keys.map(), json(&next))];
    // A move not yet flipped copies from the old leader, which is gone: it
    // ends with it. Left, its receiver (perhaps the new leader) would
    // empty its copy to take the old leader's.
    for (partition, _, _) in &changed {
        if let Some((record, revision)) = view.moves.get(partition)
            && record.phase != MovePhase::Flipped
        {
            when.push(Condition::ModRevision(keys.move_of(*partition), *revision));
            then.push(Write::Delete(keys.move_of(*partition)));
        }
    }
    Some((changed, next, Txn::when(when, then)))
}

/// The cluster's facts with another copy count, written if unchanged
/// since read (at `revision`). The copies a write needs never exceed the
/// copies kept.
pub(in crate::cluster) fn set_replicas(
    keys: &Keys,
    (facts, revision): (&ClusterFacts, i64),
    replicas: u32,
) -> (ClusterFacts, Txn) {
    let next = ClusterFacts {
        replicas,
        min_in_sync: facts.min_in_sync.min(replicas),
        ..facts.clone()
    };
    let txn = Txn::when(
        vec![Condition::ModRevision(keys.facts(), revision)],
        vec![Write::put(keys.facts(), json(&next))],
    );
    (next, txn)
}

/// Why a node cannot be removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(in crate::cluster) enum RemoveRefused {
    /// The node is registered: it is to be drained and stopped first.
    #[error(
        "node {node} is alive: drain it (`frontier cluster drain {node}`), stop it, then remove it"
    )]
    Alive { node: String },
    /// A partition it leads has no in-sync follower to take over.
    #[error(
        "partition {partition} has no copy but {node}'s: removing {node} would lose it; \
         restart {node} on its data directory instead"
    )]
    LastCopy { node: String, partition: u32 },
}

/// A node that will not come back, taken out of the map at once (without
/// waiting for its followers' senders to give up on it): each partition it
/// leads goes to its first live in-sync follower, and it follows nothing.
/// The partitions left short of copies then get new followers. `Ok(None)`
/// when the map names it nowhere.
pub(in crate::cluster) fn remove_node(
    view: &View,
    keys: &Keys,
    node: &str,
) -> Result<Option<(PartitionMap, Txn)>, RemoveRefused> {
    if view.members.contains_key(node) {
        return Err(RemoveRefused::Alive {
            node: node.to_owned(),
        });
    }
    match without_node(view, keys, node) {
        Some((_, lost, _)) if !lost.is_empty() => Err(RemoveRefused::LastCopy {
            node: node.to_owned(),
            partition: lost[0],
        }),
        Some((next, _, txn)) => Ok(Some((next, txn))),
        None => Ok(None),
    }
}

/// The map without `node`'s copies, in the next epoch, conditional on the
/// map as read: what it leads goes to an in-sync follower (a live one if
/// any), what it follows it no longer does, and moves to or from it are
/// deleted. Answers the map, the
/// partitions it leads that have no follower (their only copy: they stay
/// its), and the transaction; `None` when the map names it nowhere.
pub(in crate::cluster) fn without_node(
    view: &View,
    keys: &Keys,
    node: &str,
) -> Option<(PartitionMap, Vec<u32>, Txn)> {
    let map = view.map.as_ref()?;
    let receiving = view
        .moves
        .values()
        .any(|(record, _)| record.to == node || record.from == node);
    if !map.nodes().contains(node) && !receiving {
        return None;
    }
    let mut next = map.clone();
    let mut lost = Vec::new();
    for partition in 0..map.owners.len() as u32 {
        if map.owners[partition as usize] == node {
            // A live follower leads at once; one that is away holds every
            // acknowledged write on its disk and leads once it is back.
            let followers = map.followers_of(partition);
            let successor = followers
                .iter()
                .find(|f| *f != node && view.members.contains_key(*f))
                .or_else(|| followers.iter().find(|f| *f != node));
            match successor {
                Some(successor) => {
                    next.owners[partition as usize].clone_from(successor);
                    let successor = successor.clone();
                    next.followers_mut(partition).retain(|f| *f != successor);
                    next.clear_lagging(partition);
                }
                None => lost.push(partition),
            }
        }
        if next.follows(node, partition) {
            next.followers_mut(partition).retain(|f| f != node);
        }
        if next.lagging_of(partition).iter().any(|l| l == node) {
            next.lagging_mut(partition).retain(|l| l != node);
            if next.lagging.iter().all(Vec::is_empty) {
                next.lagging.clear();
            }
        }
    }
    next.epoch += 1;
    // Moves to or from it end with it: what it copied, or would send, is
    // gone with its store.
    let mut when = vec![Condition::ModRevision(keys.map(), view.map_revision)];
    let mut then = vec![Write::put(keys.map(), json(&next))];
    for (partition, (record, revision)) in &view.moves {
        if record.to == node || record.from == node {
            when.push(Condition::ModRevision(keys.move_of(*partition), *revision));
            then.push(Write::Delete(keys.move_of(*partition)));
        }
    }
    Some((next, lost, Txn::when(when, then)))
}

/// Why followers cannot be dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(in crate::cluster) enum DropRefused {
    /// The map does not make the asking node the leader of a partition it
    /// would drop a follower of: its view is old, or it was replaced.
    #[error("partition {partition} is led by {owner} in the map now, not by {leader}")]
    NotTheLeader {
        partition: u32,
        owner: String,
        leader: String,
    },
}

/// A leader takes followers that stopped acknowledging out of the in-sync
/// set of `partitions` (which it leads), in the next epoch, conditional on
/// the map as read: from then on writes are acknowledged without them,
/// and they refuse this leader's older epoch. Answers the map and its
/// transaction; `Ok(None)` when none of them follows those partitions.
pub(in crate::cluster) fn drop_followers(
    (map, map_revision): (&PartitionMap, i64),
    keys: &Keys,
    leader: &str,
    partitions: &BTreeSet<u32>,
    lagging: &BTreeSet<String>,
) -> Result<Option<(PartitionMap, Txn)>, DropRefused> {
    let mut next = map.clone();
    let mut changed = false;
    for &partition in partitions {
        let owner = map
            .owners
            .get(partition as usize)
            .cloned()
            .unwrap_or_default();
        if owner != leader {
            return Err(DropRefused::NotTheLeader {
                partition,
                owner,
                leader: leader.to_owned(),
            });
        }
        if map
            .followers_of(partition)
            .iter()
            .any(|f| lagging.contains(f))
        {
            let dropped: Vec<String> = map
                .followers_of(partition)
                .iter()
                .filter(|f| lagging.contains(*f))
                .cloned()
                .collect();
            next.followers_mut(partition)
                .retain(|f| !lagging.contains(f));
            let listed = next.lagging_mut(partition);
            for node in dropped {
                if !listed.contains(&node) {
                    listed.push(node);
                }
            }
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    next.epoch += 1;
    let txn = Txn::when(
        vec![Condition::ModRevision(keys.map(), map_revision)],
        vec![Write::put(keys.map(), json(&next))],
    );
    Ok(Some((next, txn)))
}
