//! The cluster's protocol as decisions without I/O: from what a node knows
//! (its [`View`], a move's record as read) to the transaction it writes to
//! the coordination store, or the local change it makes. The coordinator
//! and the move tasks call these and do the I/O; the simulation tests
//! (`sim`) call the same functions over the in-memory store, so what they
//! check is what runs.
//!
//! Keys, all under `/crawl-frontier/NAME/` ([`Keys`]): `facts`,
//! `node-secret`, `map`, `nodes/ID` (under the node's lease), `stores/ID`,
//! `election`,
//! `moves/P`, `draining/ID`, `settings/active`, `settings/delay/HEX(CRAWL)`
//! and `seeds/HEX(CRAWL)/HOST`. Values are JSON.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::View;
use super::coordination::{Condition, Entry, Snapshot, Txn, Write};
use super::map::{ClusterFacts, Member, MoveKind, MovePhase, MoveRecord, PartitionMap};

/// Moves in flight at once, cluster-wide, per [`PARTITIONS_PER_MOVE_SLOTS`]
/// partitions: each costs its two nodes a copy of one partition, so a
/// cluster of more, smaller partitions moves as many URLs at once as one
/// of fewer, larger ones, and a node joining it settles as fast. A move's
/// fixed cost (its etcd steps, the nodes' watches) is then paid in
/// parallel rather than in turn.
pub(super) const MOVES_IN_FLIGHT: usize = 2;

/// See [`MOVES_IN_FLIGHT`].
pub(super) const PARTITIONS_PER_MOVE_SLOTS: usize = 64;

/// Moves in flight at once, cluster-wide, for a map of `partitions`.
pub(super) fn moves_in_flight(partitions: usize) -> usize {
    (MOVES_IN_FLIGHT * partitions / PARTITIONS_PER_MOVE_SLOTS).max(MOVES_IN_FLIGHT)
}

/// The keys of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Keys {
    prefix: String,
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

impl Keys {
    pub(super) fn new(cluster: &str) -> Self {
        Self {
            prefix: format!("/crawl-frontier/{cluster}/"),
        }
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(super) fn facts(&self) -> String {
        format!("{}facts", self.prefix)
    }

    pub(super) fn node_secret(&self) -> String {
        format!("{}node-secret", self.prefix)
    }

    pub(super) fn map(&self) -> String {
        format!("{}map", self.prefix)
    }

    pub(super) fn member(&self, node: &str) -> String {
        format!("{}nodes/{node}", self.prefix)
    }

    pub(super) fn election(&self) -> String {
        format!("{}election", self.prefix)
    }

    pub(super) fn move_of(&self, partition: u32) -> String {
        format!("{}moves/{partition}", self.prefix)
    }

    /// When `frontier cluster remove` last ran (UTC ms): partitions short
    /// of a copy since before then are copied again at once.
    pub(super) fn replace_now(&self) -> String {
        format!("{}replace-now", self.prefix)
    }

    /// The ID of the store a node last joined with: a node back with
    /// another store (its disk lost) holds none of the copies the map
    /// gives it.
    pub(super) fn store_of(&self, node: &str) -> String {
        format!("{}stores/{node}", self.prefix)
    }

    pub(super) fn draining(&self, node: &str) -> String {
        format!("{}draining/{node}", self.prefix)
    }

    pub(super) fn active(&self) -> String {
        format!("{}settings/active", self.prefix)
    }

    pub(super) fn delay(&self, crawl: &str) -> String {
        format!("{}settings/delay/{}", self.prefix, hex(crawl))
    }

    pub(super) fn seeds(&self, crawl: &str) -> String {
        format!("{}seeds/{}/", self.prefix, hex(crawl))
    }
}

/// A crawl's default delay as etcd holds it.
#[derive(Serialize, Deserialize)]
pub(super) struct DelaySetting {
    pub(super) crawl: String,
    pub(super) secs: u32,
}

/// A seed host of a crawl as etcd holds it.
#[derive(Serialize, Deserialize)]
pub(super) struct SeedSetting {
    pub(super) crawl: String,
    pub(super) host: String,
}

/// JSON for etcd. Our types have string keys only, so encoding cannot fail;
/// an empty value is never written in its place.
pub(super) fn json(value: &impl Serialize) -> Vec<u8> {
    match serde_json::to_vec(value) {
        Ok(bytes) => bytes,
        Err(error) => unreachable!("cluster records encode as JSON: {error}"),
    }
}

/// The view the keys under the cluster's prefix make, and the keys left
/// out as unreadable (key, reason).
pub(super) fn read_view(
    keys: &Keys,
    snapshot: &Snapshot,
    leader: Option<String>,
) -> (View, Vec<(String, String)>) {
    let mut view = View {
        revision: snapshot.revision,
        leader,
        ..View::default()
    };
    let mut unreadable = Vec::new();
    for Entry {
        key: full_key,
        value,
        mod_revision,
    } in &snapshot.entries
    {
        let Some(key) = full_key.strip_prefix(keys.prefix()) else {
            continue;
        };
        let parsed = if key == "facts" {
            serde_json::from_slice(value).map(|facts: ClusterFacts| {
                view.facts = Some((facts, *mod_revision));
            })
        } else if key == "replace-now" {
            serde_json::from_slice(value).map(|at: u64| view.replace_now_ms = at)
        } else if key == "map" {
            serde_json::from_slice(value).map(|map: PartitionMap| {
                view.map = Some(map);
                view.map_revision = *mod_revision;
            })
        } else if let Some(partition) = key.strip_prefix("moves/") {
            serde_json::from_slice(value).map(|record: MoveRecord| {
                if partition == record.partition.to_string() {
                    view.moves.insert(record.partition, (record, *mod_revision));
                }
            })
        } else if let Some(id) = key.strip_prefix("draining/") {
            view.draining.insert(id.to_owned());
            Ok(())
        } else if let Some(id) = key.strip_prefix("nodes/") {
            serde_json::from_slice(value).map(|member: Member| {
                view.members.insert(id.to_owned(), member);
            })
        } else if key == "settings/active" {
            serde_json::from_slice(value).map(|active: bool| view.settings.active = Some(active))
        } else if key.starts_with("settings/delay/") {
            serde_json::from_slice(value).map(|delay: DelaySetting| {
                view.settings.delays.insert(delay.crawl, delay.secs);
            })
        } else if key.starts_with("seeds/") {
            serde_json::from_slice(value).map(|seed: SeedSetting| {
                view.settings
                    .seeds
                    .entry(seed.crawl)
                    .or_default()
                    .insert(seed.host);
            })
        } else {
            Ok(())
        };
        if let Err(error) = parsed {
            unreadable.push((full_key.clone(), error.to_string()));
        }
    }
    (view, unreadable)
}

/// The leader's first map, once the initial nodes have registered: written
/// only while no map exists.
pub(super) fn first_map(
    view: &View,
    keys: &Keys,
    (partitions, replicas): (u32, u32),
    initial_nodes: usize,
) -> Option<(PartitionMap, Txn)> {
    if view.map.is_some() || view.members.len() < initial_nodes {
        return None;
    }
    let nodes: BTreeSet<String> = view.members.keys().cloned().collect();
    let map = PartitionMap::first_replicated(partitions, &nodes, replicas)?;
    let txn = Txn::when(
        vec![Condition::Absent(keys.map())],
        vec![Write::put(keys.map(), json(&map))],
    );
    Some((map, txn))
}

/// One step the leader plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Planned {
    /// A move whose receiver is gone before its flip, undone.
    RollBack {
        partition: u32,
        from: String,
        to: String,
    },
    /// A move toward the balanced map, started.
    Start {
        partition: u32,
        from: String,
        to: String,
    },
    /// A new follower of a partition with fewer copies than the cluster
    /// keeps, started (a copy from its leader).
    Replicate {
        partition: u32,
        leader: String,
        to: String,
    },
    /// Followers beyond the copies the cluster keeps, let go.
    Trim { partitions: Vec<u32> },
}

/// The leader's part: roll back moves whose receiver is gone, then start
/// moves toward a balanced map over the live nodes that are not draining,
/// a few at a time. A start holds only while the map is the one the view
/// read: planned from an older map, a move could name a node that no
/// longer holds the partition.
pub(super) fn plan(view: &View, keys: &Keys, now_ms: u64) -> Vec<(Planned, Txn)> {
    let Some(map) = &view.map else {
        return Vec::new();
    };
    let mut planned = Vec::new();
    let live: BTreeSet<String> = view.members.keys().cloned().collect();
    let mut in_flight = 0;
    for (partition, (record, revision)) in &view.moves {
        let receiver_gone = !live.contains(&record.to) || view.draining.contains(&record.to);
        if record.phase != MovePhase::Flipped && receiver_gone {
            let key = keys.move_of(*partition);
            planned.push((
                Planned::RollBack {
                    partition: *partition,
                    from: record.from.clone(),
                    to: record.to.clone(),
                },
                Txn::when(
                    vec![Condition::ModRevision(key.clone(), *revision)],
                    vec![Write::Delete(key)],
                ),
            ));
            continue;
        }
        // A flipped move only waits (for leases, for the old copy to go).
        if record.phase != MovePhase::Flipped {
            in_flight += 1;
        }
    }
    let eligible: BTreeSet<String> = live.difference(&view.draining).cloned().collect();
    let Some(target) = map.rebalanced(&eligible) else {
        return planned;
    };
    let limit = moves_in_flight(map.owners.len());
    for (partition, from, to) in map.moves_to(&target) {
        if in_flight >= limit {
            break;
        }
        if view.moves.contains_key(&partition) || !live.contains(from) {
            continue; // moving already, or its data is on a node that is away
        }
        let record = MoveRecord::started(partition, (from, to), MoveKind::Move, now_ms);
        planned.push((
            Planned::Start {
                partition,
                from: from.to_owned(),
                to: to.to_owned(),
            },
            start_move(keys, view.map_revision, &record),
        ));
        in_flight += 1;
    }
    planned
}

/// A move's start: only while no move of its partition is recorded and
/// the map is the one the plan read.
fn start_move(keys: &Keys, map_revision: i64, record: &MoveRecord) -> Txn {
    let key = keys.move_of(record.partition);
    Txn::when(
        vec![
            Condition::Absent(key.clone()),
            Condition::ModRevision(keys.map(), map_revision),
        ],
        vec![Write::put(key, json(record))],
    )
}

/// When copies short of the count are made again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct CopyPolicy {
    /// Copies kept of each partition.
    pub(super) replicas: u32,
    /// Copies a write needs: a partition below it is copied at once.
    pub(super) min_in_sync: u32,
    /// How long a partition that still takes writes waits, short of a
    /// copy, for the node that held it to come back before it is copied
    /// elsewhere (a restart is not worth a copy).
    pub(super) replace_after_ms: u64,
    /// Since when (UTC ms) the elected node has seen each partition short.
    pub(super) short_since: BTreeMap<u32, u64>,
}

impl CopyPolicy {
    /// Notes which partitions of `view` are short of copies now, keeping
    /// the time each was first seen so.
    pub(super) fn observe(&mut self, view: &View, now_ms: u64) {
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
/// node, not draining and not holding it, that holds fewest copies, when
/// the policy says it is due; one with more lets its last followers go,
/// in one transaction. A few copies at a time, beside the moves.
pub(super) fn plan_copies(
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
            trims.push(partition);
            continue;
        }
        if copies == wanted
            || in_flight >= moves_in_flight(map.owners.len())
            || view.moves.contains_key(&partition)
            || !live.contains(owner)
            || !policy.due(partition, copies, view.replace_now_ms, now_ms)
        {
            continue;
        }
        let Some(to) = held
            .iter()
            .filter(|(node, _)| !map.holds(node, partition))
            .min_by_key(|(node, count)| (**count, **node))
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
pub(super) type Failover = (u32, String, String);

/// Partitions whose leader's registration lapsed, each given to its first
/// live in-sync follower in one transaction conditional on the map as
/// read (so it races neither a flip nor a leader dropping a follower), in
/// the next epoch; the old leader becomes its last follower. Answers
/// (partition, old leader, new leader) per failover, the map and the
/// transaction; `None` when nothing fails over.
pub(super) fn failovers(view: &View, keys: &Keys) -> Option<(Vec<Failover>, PartitionMap, Txn)> {
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
        changed.push((partition, owner.clone(), successor.clone()));
    }
    if changed.is_empty() {
        return None;
    }
    next.epoch += 1;
    let txn = Txn::when(
        vec![Condition::ModRevision(keys.map(), view.map_revision)],
        vec![Write::put(keys.map(), json(&next))],
    );
    Some((changed, next, txn))
}

/// The cluster's facts with another copy count, written if unchanged
/// since read (at `revision`). The copies a write needs never exceed the
/// copies kept.
pub(super) fn set_replicas(
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
pub(super) enum RemoveRefused {
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
pub(super) fn remove_node(
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
pub(super) fn without_node(
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
                }
                None => lost.push(partition),
            }
        }
        if next.follows(node, partition) {
            next.followers_mut(partition).retain(|f| f != node);
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
pub(super) enum DropRefused {
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
pub(super) fn drop_followers(
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
            next.followers_mut(partition)
                .retain(|f| !lagging.contains(f));
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

/// What a node has to do for one move in its view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Duty {
    /// Copy, then cut over and flip: this node receives the partition.
    Receive,
    /// Delete the handed-over copy and record it: this node gave it.
    HandOver,
    /// End the move: received, the old copy gone and its leases over.
    Finish,
}

/// This node's duty for a move as its view shows it, if any.
pub(super) fn duty(record: &MoveRecord, me: &str, now_ms: u64) -> Option<Duty> {
    match record.phase {
        MovePhase::Copy | MovePhase::Cutover if record.to == me => Some(Duty::Receive),
        MovePhase::Flipped if record.from == me && !record.from_done => Some(Duty::HandOver),
        MovePhase::Flipped
            if record.to == me && record.from_done && now_ms >= record.hold_until_ms =>
        {
            Some(Duty::Finish)
        }
        _ => None,
    }
}

/// Whether a view may drive a hand-over of `partition` here: not when this
/// node learned of the partition since the view was read, by a seal (for
/// a newer move of it) or the end of a receive task (a newer move gave it
/// back here). Such a view still shows an older move's flip; acting on it
/// would unseal the newer move's cutover or delete the partition received
/// since.
pub(super) fn view_current_for(
    view: &View,
    partition: u32,
    sealed: &BTreeMap<u32, i64>,
    receipts: &Receipts,
) -> bool {
    let newer = |at: Option<&i64>| at.is_some_and(|at| *at > view.revision);
    !newer(sealed.get(&partition)) && !newer(receipts.ended_at.get(&partition))
}

/// A move's record written back if unchanged since read (at `revision`).
pub(super) fn update_move(keys: &Keys, revision: i64, record: &MoveRecord) -> Txn {
    let key = keys.move_of(record.partition);
    Txn::when(
        vec![Condition::ModRevision(key.clone(), revision)],
        vec![Write::put(key, json(record))],
    )
}

/// The move's end (or its rollback), if unchanged since read.
pub(super) fn end_move(keys: &Keys, partition: u32, revision: i64) -> Txn {
    let key = keys.move_of(partition);
    Txn::when(
        vec![Condition::ModRevision(key.clone(), revision)],
        vec![Write::Delete(key)],
    )
}

/// The copy done: the move enters its cutover.
#[must_use]
pub(super) fn to_cutover(record: &MoveRecord, now_ms: u64) -> MoveRecord {
    MoveRecord {
        phase: MovePhase::Cutover,
        cutover_at_ms: now_ms,
        ..record.clone()
    }
}

/// Why a flip cannot happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum FlipRefused {
    /// The map no longer gives the partition to the move's sender (it was
    /// planned from an older map): the move must be rolled back.
    #[error("partition {partition} is node {owner}'s in the map now, not {from}'s")]
    NotTheOwner {
        partition: u32,
        owner: String,
        from: String,
    },
}

/// The flip: one transaction, conditional on the move and the map being as
/// read, gives the partition to the receiver in the next epoch and records
/// until when the old owner's leases may run.
pub(super) fn flip(
    keys: &Keys,
    revision: i64,
    record: &MoveRecord,
    (map, map_revision): (&PartitionMap, i64),
    (leased, leases_until_ms): (u64, u64),
    now_ms: u64,
) -> Result<(MoveRecord, PartitionMap, Txn), FlipRefused> {
    let partition = record.partition;
    let owner = map
        .owners
        .get(partition as usize)
        .cloned()
        .unwrap_or_default();
    if owner != record.from {
        return Err(FlipRefused::NotTheOwner {
            partition,
            owner,
            from: record.from.clone(),
        });
    }
    let mut next_map = map.clone();
    if record.kind == MoveKind::Replica {
        if !next_map.follows(&record.to, partition) {
            next_map.followers_mut(partition).push(record.to.clone());
        }
    } else if let Some(owner) = next_map.owners.get_mut(partition as usize) {
        owner.clone_from(&record.to);
    }
    // The old leader holds every acknowledged write at the seal (its
    // followers' acks were waited for): it takes the receiver's place
    // among the followers, if the receiver was one, and keeps its copy.
    if record.kind == MoveKind::Move
        && let Some(at) = map
            .followers_of(partition)
            .iter()
            .position(|f| *f == record.to)
    {
        next_map.followers_mut(partition)[at].clone_from(&record.from);
    }
    next_map.epoch += 1;
    let flipped = MoveRecord {
        phase: MovePhase::Flipped,
        leased,
        hold_until_ms: leases_until_ms,
        cutover_ms: now_ms.saturating_sub(record.cutover_at_ms),
        ..record.clone()
    };
    let key = keys.move_of(partition);
    let txn = Txn::when(
        vec![
            Condition::ModRevision(key.clone(), revision),
            Condition::ModRevision(keys.map(), map_revision),
        ],
        vec![
            Write::put(key, json(&flipped)),
            Write::put(keys.map(), json(&next_map)),
        ],
    );
    Ok((flipped, next_map, txn))
}

/// The old owner's copy is gone.
#[must_use]
pub(super) fn handed_over(record: &MoveRecord) -> MoveRecord {
    MoveRecord {
        from_done: true,
        ..record.clone()
    }
}

/// Whether a SealPartition may seal: only for a move at its cutover from
/// this node.
pub(super) fn may_seal(record: Option<&MoveRecord>, me: &str) -> bool {
    record.is_some_and(|r| r.phase == MovePhase::Cutover && r.from == me)
}

/// The partitions this node serves in `view`: those the map gives it, less
/// one it is handing over (at its cutover) and one it received whose old
/// owner's leases may still run.
pub(super) fn served_partitions(
    view: &View,
    node: &str,
    partitions: usize,
    now_ms: u64,
) -> Vec<bool> {
    let mut served = vec![false; partitions];
    let Some(map) = &view.map else {
        return served;
    };
    for partition in map.owned_by(node) {
        if let Some(slot) = served.get_mut(partition as usize) {
            *slot = true;
        }
    }
    for (partition, (record, _)) in &view.moves {
        let handing_over = record.phase == MovePhase::Cutover && record.from == node;
        let held = record.phase == MovePhase::Flipped
            && record.to == node
            && now_ms < record.hold_until_ms;
        if (handing_over || held)
            && let Some(slot) = served.get_mut(*partition as usize)
        {
            *slot = false;
        }
    }
    served
}

/// How a node's seals change with a new view.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SealChanges {
    /// Partitions this view says to seal that are not sealed yet.
    pub(super) newly: Vec<u32>,
    /// Seals whose move is gone from a view read after the seal (rolled
    /// back); a handed-over partition is unsealed by its hand-over.
    pub(super) opened: Vec<u32>,
    /// Every partition the view has at its cutover from this node.
    pub(super) sealing: BTreeSet<u32>,
}

/// The seals a view asks of this node, against those it holds (partition
/// to the revision the seal was read at).
pub(super) fn seal_changes(view: &View, me: &str, sealed: &BTreeMap<u32, i64>) -> SealChanges {
    let sealing: BTreeSet<u32> = view
        .moves
        .iter()
        .filter(|(_, (r, _))| r.from == me && r.phase == MovePhase::Cutover)
        .map(|(p, _)| *p)
        .collect();
    let opened = sealed
        .iter()
        .filter(|(partition, sealed_at)| {
            !view.moves.contains_key(partition) && view.revision > **sealed_at
        })
        .map(|(partition, _)| *partition)
        .collect();
    let newly = sealing
        .iter()
        .filter(|partition| !sealed.contains_key(partition))
        .copied()
        .collect();
    SealChanges {
        newly,
        opened,
        sealing,
    }
}

/// What a node knows of the moves it receives, beyond its view: the
/// partitions it is receiving now, and for each whose task ended, the
/// store's revision it ended at (a flip, a rollback, the move found gone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Receipts {
    pub(super) running: BTreeSet<u32>,
    pub(super) ended_at: BTreeMap<u32, i64>,
}

impl Receipts {
    /// A task ended at `revision`.
    pub(super) fn ended(&mut self, partition: u32, revision: i64) {
        self.running.remove(&partition);
        let at = self.ended_at.entry(partition).or_insert(revision);
        *at = (*at).max(revision);
    }

    /// A view this recent tells all the ended tasks told: they are
    /// forgotten.
    pub(super) fn seen(&mut self, revision: i64) {
        self.ended_at.retain(|_, at| *at > revision);
    }
}

/// Partitions this node holds URLs of (`holds`) that the map gives another
/// node, with no move of them to or from here in flight and none being
/// received here: a receiver killed mid-copy keeps them after its move is
/// rolled back. The map's owner holds every URL of its partition (a map
/// changes only at a flip, after the copy), so they can go. A view older
/// than the end of a receive task here says nothing of its partition: the
/// task may have flipped it to this node after the view was read. Answers
/// (partition, owner).
pub(super) fn strays(
    view: &View,
    me: &str,
    receipts: &Receipts,
    holds: impl Fn(u32) -> bool,
) -> Vec<(u32, String)> {
    let Some(map) = &view.map else {
        return Vec::new();
    };
    map.owners
        .iter()
        .enumerate()
        .filter_map(|(partition, owner)| {
            let partition = u32::try_from(partition).ok()?;
            let moving_here_or_away = view
                .moves
                .get(&partition)
                .is_some_and(|(record, _)| record.from == me || record.to == me);
            let view_too_old = receipts
                .ended_at
                .get(&partition)
                .is_some_and(|ended| view.revision < *ended);
            (owner != me
                && !map.follows(me, partition)
                && !moving_here_or_away
                && !receipts.running.contains(&partition)
                && !view_too_old
                && holds(partition))
            .then(|| (partition, owner.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::coordination::Write;

    fn member(id: &str) -> (String, Member) {
        (
            id.to_owned(),
            Member {
                id: id.to_owned(),
                address: format!("{id}:1"),
                started_at_ms: 0,
            },
        )
    }

    fn nodes(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|id| (*id).to_owned()).collect()
    }

    /// Three nodes, six partitions, two copies each; `live` registered.
    fn view(live: &[&str]) -> View {
        View {
            map: PartitionMap::first_replicated(6, &nodes(&["a", "b", "c"]), 2),
            map_revision: 5,
            members: live.iter().map(|id| member(id)).collect(),
            revision: 9,
            ..View::default()
        }
    }

    fn policy(replicas: u32) -> CopyPolicy {
        CopyPolicy {
            replicas,
            min_in_sync: replicas.min(2),
            ..CopyPolicy::default()
        }
    }

    #[test]
    fn a_partition_that_still_takes_writes_waits_before_a_new_copy() {
        let keys = Keys::new("t");
        // Three copies wanted, two writes need; one node gone.
        let mut view = View {
            map: PartitionMap::first_replicated(6, &nodes(&["a", "b", "c", "d"]), 3),
            members: [member("a"), member("b"), member("c")].into(),
            ..View::default()
        };
        let (_, next, _) = failovers(&view, &keys).unwrap();
        let mut next = next;
        for p in 0..6 {
            next.followers_mut(p).retain(|f| f != "d");
        }
        view.map = Some(next);
        let mut policy = CopyPolicy {
            replicas: 3,
            min_in_sync: 2,
            replace_after_ms: 600_000,
            ..CopyPolicy::default()
        };
        policy.observe(&view, 1_000);
        assert!(!policy.short_since.is_empty());
        assert!(
            plan_copies(&view, &keys, &policy, 2_000).is_empty(),
            "d may come back"
        );
        assert!(
            !plan_copies(&view, &keys, &policy, 601_000).is_empty(),
            "past the wait"
        );
        // `frontier cluster remove` after they became short: at once.
        view.replace_now_ms = 1_500;
        assert!(!plan_copies(&view, &keys, &policy, 2_000).is_empty());
    }

    fn written_map(txn: &Txn) -> PartitionMap {
        match &txn.then[..] {
            [Write::Put { value, .. }] => serde_json::from_slice(value).unwrap(),
            other => panic!("one map put expected: {other:?}"),
        }
    }

    #[test]
    fn a_first_replicated_map_spreads_leaders_and_followers_alike() {
        let map = PartitionMap::first_replicated(6, &nodes(&["a", "b", "c"]), 2).unwrap();
        for node in ["a", "b", "c"] {
            assert_eq!(map.owned_by(node).count(), 2);
            assert_eq!(map.followed_by(node).count(), 2);
        }
        for p in 0..6 {
            assert!(
                !map.follows(&map.owners[p as usize], p),
                "a leader is no follower"
            );
        }
        // More copies than nodes: as many as there are nodes.
        let two = PartitionMap::first_replicated(4, &nodes(&["a", "b"]), 3).unwrap();
        assert!((0..4).all(|p| two.followers_of(p).len() == 1));
    }

    #[test]
    fn a_dead_leaders_partitions_go_to_a_live_follower_in_the_next_epoch() {
        let view = view(&["a", "b"]);
        let (given, next, txn) = failovers(&view, &Keys::new("t")).unwrap();
        let before = view.map.as_ref().unwrap();
        assert_eq!(given.len(), 2, "c led two partitions");
        for (partition, from, to) in &given {
            assert_eq!(from, "c");
            assert!(before.follows(to, *partition));
            assert_eq!(&next.owners[*partition as usize], to);
            assert!(next.follows("c", *partition), "the old leader follows");
            assert!(!next.follows(to, *partition));
        }
        assert_eq!(next.epoch, before.epoch + 1);
        assert_eq!(written_map(&txn), next);
        assert!(matches!(&txn.when[..], [Condition::ModRevision(_, 5)]));
        // Every leader alive: nothing to do.
        assert!(failovers(&self::view(&["a", "b", "c"]), &Keys::new("t")).is_none());
    }

    #[test]
    fn only_the_maps_leader_drops_followers_of_its_partitions() {
        let view = view(&["a", "b", "c"]);
        let map = view.map.as_ref().unwrap();
        let keys = Keys::new("t");
        let led: BTreeSet<u32> = map.owned_by("a").collect();
        let lagging: BTreeSet<String> = led
            .iter()
            .flat_map(|&p| map.followers_of(p).to_vec())
            .collect();
        let (next, _) = drop_followers((map, 5), &keys, "a", &led, &lagging)
            .unwrap()
            .unwrap();
        assert!(led.iter().all(|&p| next.followers_of(p).is_empty()));
        assert_eq!(next.epoch, map.epoch + 1);
        let not_led: BTreeSet<u32> = map.owned_by("b").collect();
        assert!(matches!(
            drop_followers((map, 5), &keys, "a", &not_led, &lagging),
            Err(DropRefused::NotTheLeader { .. })
        ));
    }

    #[test]
    fn a_map_of_more_partitions_moves_more_at_once() {
        assert_eq!(moves_in_flight(8), MOVES_IN_FLIGHT);
        assert_eq!(moves_in_flight(64), MOVES_IN_FLIGHT);
        assert_eq!(moves_in_flight(1024), 16 * MOVES_IN_FLIGHT);
        let keys = Keys::new("t");
        let joined = View {
            map: PartitionMap::first_replicated(1024, &nodes(&["a", "b", "c"]), 1),
            map_revision: 5,
            members: ["a", "b", "c", "d"].iter().map(|id| member(id)).collect(),
            revision: 9,
            ..View::default()
        };
        let planned = plan(&joined, &keys, 0);
        assert_eq!(planned.len(), 32);
        assert!(
            planned
                .iter()
                .all(|(step, _)| matches!(step, Planned::Start { to, .. } if to == "d"))
        );
    }

    #[test]
    fn a_removed_node_leaves_every_partition_and_short_ones_get_new_copies() {
        let keys = Keys::new("t");
        assert!(matches!(
            remove_node(&view(&["a", "b", "c"]), &keys, "c"),
            Err(RemoveRefused::Alive { .. })
        ));
        let mut removing = view(&["a", "b"]);
        let (next, _) = remove_node(&removing, &keys, "c").unwrap().unwrap();
        assert!(!next.nodes().contains("c"));
        assert_eq!(remove_node(&removing, &keys, "zz"), Ok(None));
        // Copies are planned on the two nodes left.
        removing.map = Some(next);
        let planned = plan_copies(&removing, &keys, &policy(2), 0);
        assert_eq!(planned.len(), MOVES_IN_FLIGHT, "a few at a time");
        for (step, _) in planned {
            let Planned::Replicate {
                partition,
                leader,
                to,
            } = step
            else {
                panic!("a new copy expected: {step:?}");
            };
            assert_eq!(
                removing.map.as_ref().unwrap().owners[partition as usize],
                leader
            );
            assert_ne!(leader, to);
            assert_ne!(to, "c");
        }
        // The last copy of a partition cannot go.
        let alone = View {
            map: PartitionMap::first(2, &nodes(&["a", "b"])),
            members: [member("a")].into(),
            ..View::default()
        };
        assert!(matches!(
            remove_node(&alone, &keys, "b"),
            Err(RemoveRefused::LastCopy { partition: 1, .. })
        ));
    }

    #[test]
    fn fewer_copies_wanted_lets_the_last_followers_go() {
        let view = view(&["a", "b", "c"]);
        let planned = plan_copies(&view, &Keys::new("t"), &policy(1), 0);
        let [(Planned::Trim { partitions }, txn)] = &planned[..] else {
            panic!("one trim expected: {planned:?}");
        };
        assert_eq!(partitions.len(), 6);
        assert!(written_map(txn).followers.iter().all(Vec::is_empty));
        assert!(plan_copies(&view, &Keys::new("t"), &policy(2), 0).is_empty());
    }

    #[test]
    fn a_flip_to_a_follower_swaps_it_with_the_leader_and_a_new_copy_joins() {
        let view = view(&["a", "b", "c"]);
        let map = view.map.as_ref().unwrap();
        let keys = Keys::new("t");
        let follower = map.followers_of(0)[0].clone();
        let leader = map.owners[0].clone();
        let record = MoveRecord::started(0, (&leader, &follower), MoveKind::Move, 0);
        let (_, next, _) = flip(&keys, 3, &record, (map, 5), (0, 0), 0).unwrap();
        assert_eq!(next.owners[0], follower);
        assert_eq!(next.followers_of(0), std::slice::from_ref(&leader));
        let third = ["a", "b", "c"]
            .into_iter()
            .find(|n| !map.holds(n, 0))
            .unwrap();
        let record = MoveRecord::started(0, (&leader, third), MoveKind::Replica, 0);
        let (_, next, _) = flip(&keys, 3, &record, (map, 5), (0, 0), 0).unwrap();
        assert_eq!(next.owners[0], leader, "a new copy leaves the leader");
        assert_eq!(next.followers_of(0).len(), 2);
        assert!(next.follows(third, 0));
    }

    #[test]
    fn a_follower_is_no_stray() {
        let view = view(&["a", "b", "c"]);
        let map = view.map.as_ref().unwrap();
        let strays = strays(&view, "a", &Receipts::default(), |_| true);
        for (partition, _) in &strays {
            assert!(!map.holds("a", *partition));
        }
        assert_eq!(strays.len(), 2, "a holds four of six partitions");
    }
}
