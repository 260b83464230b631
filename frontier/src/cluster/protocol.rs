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

mod batches;
mod copies;
pub(super) use batches::*;
pub(super) use copies::*;

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

    pub(super) fn revisit(&self, crawl: &str) -> String {
        format!("{}settings/revisit/{}", self.prefix, hex(crawl))
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

/// A crawl's own revisit policy as etcd holds it.
#[derive(Serialize, Deserialize)]
pub(super) struct RevisitSetting {
    pub(super) crawl: String,
    pub(super) policy: String,
    pub(super) min_secs: u32,
    pub(super) max_secs: u32,
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
        } else if key.starts_with("settings/revisit/") {
            serde_json::from_slice(value).and_then(|revisit: RevisitSetting| {
                let policy = crate::revisit::Policy::parse(
                    &revisit.policy,
                    u64::from(revisit.min_secs),
                    u64::from(revisit.max_secs),
                )
                .map_err(serde::de::Error::custom)?;
                view.settings.revisits.insert(revisit.crawl, policy);
                Ok(())
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
    /// Followers beyond the copies the cluster keeps, and lagging copies of
    /// partitions back at their copies, let go.
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
        if map.lagging_of(partition).iter().any(|node| node == to) {
            // Made a copy again first (from its leader's log), it then
            // takes the partition over without a copy.
            continue;
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

/// The leader's steps as written: starts (of moves and copies) in a row
/// go in one transaction, which holds while the map is the one the plan
/// read and none of their partitions has a move (else none starts, and
/// the next plan, on a newer view, starts them); the others alone, as is
/// a second start of one partition (a move and a copy planned from one
/// view: the later fails). A node joining a large cluster gets its moves
/// started in one write per plan rather than one each.
pub(super) fn together(planned: Vec<(Planned, Txn)>) -> Vec<(Vec<Planned>, Txn)> {
    let started = |step: &Planned| match step {
        Planned::Start { partition, .. } | Planned::Replicate { partition, .. } => Some(*partition),
        Planned::RollBack { .. } | Planned::Trim { .. } => None,
    };
    let mut grouped: Vec<(Vec<Planned>, Txn)> = Vec::new();
    for (step, txn) in planned {
        let joins = |steps: &[Planned]| {
            started(&step).is_some_and(|partition| {
                steps
                    .iter()
                    .all(|other| started(other).is_some_and(|p| p != partition))
            })
        };
        match grouped.last_mut() {
            Some((steps, together)) if joins(steps) => {
                for condition in txn.when {
                    if !together.when.contains(&condition) {
                        together.when.push(condition);
                    }
                }
                together.then.extend(txn.then);
                steps.push(step);
            }
            _ => grouped.push((vec![step], txn)),
        }
    }
    grouped
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

/// The flip: gives the partition to the receiver in the next epoch and
/// records until when the old owner's leases may run; answers the flipped
/// record and the map. [`flip_all`] writes flips, conditional on the moves
/// and the map being as read.
pub(super) fn flip(
    record: &MoveRecord,
    map: &PartitionMap,
    (leased, leases_until_ms): (u64, u64),
    now_ms: u64,
) -> Result<(MoveRecord, PartitionMap), FlipRefused> {
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
        if next_map.lagging_of(partition).contains(&record.to) {
            next_map.lagging_mut(partition).retain(|l| *l != record.to);
        }
    } else if let Some(owner) = next_map.owners.get_mut(partition as usize) {
        owner.clone_from(&record.to);
        next_map.clear_lagging(partition);
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
    Ok((flipped, next_map))
}

/// One move at its cutover, ready to flip: its record as read at
/// `revision`, and the old owner's leases (count, until when).
#[derive(Debug, Clone)]
pub(super) struct ReadyFlip {
    pub(super) revision: i64,
    pub(super) record: MoveRecord,
    pub(super) leases: (u64, u64),
}

/// A map to write and the transaction that writes it.
pub(super) type Written = (PartitionMap, Txn);

/// Several flips in one transaction, as if made one after the other with
/// nothing between: conditional on the map as read and on every move
/// flipped being as read. Answers per move its flipped record (or why it
/// cannot flip: it is left out), the map after them all and the
/// transaction; `None` when none can flip. A receiver's moves reach their
/// cutover together when a node joins: one map write for all of them,
/// rather than one each, every later one racing the earlier ones.
pub(super) fn flip_all(
    keys: &Keys,
    ready: &[ReadyFlip],
    (map, map_revision): (&PartitionMap, i64),
    now_ms: u64,
) -> (Vec<Result<MoveRecord, FlipRefused>>, Option<Written>) {
    let mut next = map.clone();
    let mut when = vec![Condition::ModRevision(keys.map(), map_revision)];
    let mut then = Vec::new();
    let answers: Vec<Result<MoveRecord, FlipRefused>> = ready
        .iter()
        .map(|one| {
            let (flipped, after) = flip(&one.record, &next, one.leases, now_ms)?;
            next = after;
            let key = keys.move_of(one.record.partition);
            when.push(Condition::ModRevision(key.clone(), one.revision));
            then.push(Write::put(key, json(&flipped)));
            Ok(flipped)
        })
        .collect();
    if then.is_empty() {
        return (answers, None);
    }
    // One epoch for the lot: each flip's own bump is one map write's.
    next.epoch = map.epoch + 1;
    then.push(Write::put(keys.map(), json(&next)));
    (answers, Some((next, Txn::when(when, then))))
}

/// The old owner's copy is gone./// The old owner's copy is gone.
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
/// task may have flipped it to this node after the view was read. A copy
/// the map lists as lagging stays while it follows the partition's leader
/// (`followed` answers which leader a copy here follows): that leader can
/// bring it up to date. Answers (partition, owner).
pub(super) fn strays(
    view: &View,
    me: &str,
    receipts: &Receipts,
    holds: impl Fn(u32) -> bool,
    followed: impl Fn(u32) -> Option<String>,
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
            let lagging_here = map.lagging_of(partition).iter().any(|l| l == me)
                && followed(partition).as_ref() == Some(owner);
            (owner != me
                && !map.follows(me, partition)
                && !moving_here_or_away
                && !receipts.running.contains(&partition)
                && !view_too_old
                && !lagging_here
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
    fn a_follower_taken_out_lags_until_it_is_a_copy_again_or_its_leader_changes() {
        let keys = Keys::new("t");
        let mut view = view(&["a", "b", "c"]);
        let map = view.map.clone().unwrap();
        // a leads 0 and 3, b follows them; b stops answering.
        let led = BTreeSet::from([0, 3]);
        let (dropped, _) = drop_followers((&map, 5), &keys, "a", &led, &nodes(&["b"]))
            .unwrap()
            .unwrap();
        for p in [0, 3] {
            assert!(dropped.followers_of(p).is_empty());
            assert_eq!(dropped.lagging_of(p), ["b".to_owned()]);
        }
        // While b lags it keeps its copies (they follow a).
        view.map = Some(dropped.clone());
        let kept = strays(
            &view,
            "b",
            &Receipts::default(),
            |_| true,
            |_| Some("a".into()),
        );
        assert!(!kept.iter().any(|(p, _)| led.contains(p)), "{kept:?}");
        let gone = strays(&view, "b", &Receipts::default(), |_| true, |_| None);
        assert!(
            led.iter().all(|p| gone.iter().any(|(q, _)| q == p)),
            "{gone:?}"
        );
        // Back, it is made a copy again at once (writes go on with one
        // copy, so no copy would be due for ten minutes), not another node.
        let waits = CopyPolicy {
            replicas: 2,
            min_in_sync: 1,
            replace_after_ms: 600_000,
            ..CopyPolicy::default()
        };
        let planned = plan_copies(&view, &keys, &waits, 1_000);
        let to_b: Vec<u32> = planned
            .iter()
            .filter_map(|(planned, _)| match planned {
                Planned::Replicate { partition, to, .. } if to == "b" => Some(*partition),
                _ => None,
            })
            .collect();
        assert_eq!(to_b, [0, 3]);
        // Not moved to b while it lags there: its copy comes first.
        let mut balanced = view.clone();
        balanced.members.insert("d".into(), member("d").1);
        assert!(
            plan(&balanced, &keys, 0)
                .iter()
                .all(|(planned, _)| !matches!(
                    planned,
                    Planned::Start { partition, to, .. } if led.contains(partition) && to == "b"
                ))
        );
        // Away, nothing is due yet.
        view.members.remove("b");
        let planned = plan_copies(&view, &keys, &waits, 1_000);
        assert!(planned.is_empty(), "{planned:?}");
        // Its copy flipped in: in sync, no longer lagging.
        let record = MoveRecord::started(0, ("a", "b"), MoveKind::Replica, 0);
        let (_, flipped) = flip(&record, &dropped, (0, 0), 0).unwrap();
        assert_eq!(flipped.followers_of(0), ["b".to_owned()]);
        assert!(flipped.lagging_of(0).is_empty());
        assert_eq!(flipped.lagging_of(3), ["b".to_owned()]);
        // Back at two copies another way: the lagging copy is let go.
        let mut full = dropped.clone();
        full.followers_mut(3).push("c".into());
        view.map = Some(full);
        let trimmed = plan_copies(&view, &keys, &waits, 1_000);
        let [(Planned::Trim { partitions }, _), ..] = &trimmed[..] else {
            panic!("{trimmed:?}");
        };
        assert!(partitions.contains(&3));
        // Its leader gone, the new one noted nothing: no longer lagging.
        let mut lagging_at_b = dropped;
        lagging_at_b.lagging_mut(1).push("a".into());
        view.map = Some(lagging_at_b);
        view.members = [member("a"), member("c")].into();
        let (given, failed_over, _) = failovers(&view, &keys).unwrap();
        assert!(given.iter().any(|(p, _, to)| *p == 1 && to == "c"));
        assert!(failed_over.lagging_of(1).is_empty());
    }

    #[test]
    fn starts_in_a_row_are_written_together_and_hold_only_all_at_once() {
        let keys = Keys::new("t");
        let joined = View {
            map: PartitionMap::first(8, &nodes(&["a", "b", "c"])),
            map_revision: 5,
            members: ["a", "b", "c", "d"].iter().map(|id| member(id)).collect(),
            revision: 9,
            ..View::default()
        };
        let planned = plan(&joined, &keys, 0);
        let starts = planned.len();
        assert!(starts >= 2, "{planned:?}");
        let rollback = (
            Planned::RollBack {
                partition: 7,
                from: "a".into(),
                to: "e".into(),
            },
            Txn::writes(vec![Write::Delete(keys.move_of(7))]),
        );
        let grouped = together(std::iter::once(rollback).chain(planned).collect());
        assert_eq!(grouped.len(), 2, "the rollback, then every start");
        let (steps, txn) = &grouped[1];
        assert_eq!(steps.len(), starts);
        assert_eq!(txn.then.len(), starts);
        let map_checks = txn
            .when
            .iter()
            .filter(|c| **c == Condition::ModRevision(keys.map(), 5))
            .count();
        assert_eq!(map_checks, 1);
        assert_eq!(txn.when.len(), 1 + starts, "each start's move absent");
        // A copy and a move of one partition, planned from one view: etcd
        // refuses a transaction that writes a key twice.
        let copy_of = |partition| {
            let record = MoveRecord::started(partition, ("a", "d"), MoveKind::Replica, 0);
            (
                Planned::Replicate {
                    partition,
                    leader: "a".into(),
                    to: "d".into(),
                },
                start_move(&keys, 5, &record),
            )
        };
        let moves = plan(&joined, &keys, 0);
        let Planned::Start { partition, .. } = moves[0].0 else {
            panic!("{moves:?}");
        };
        let mut both = vec![copy_of(partition)];
        both.extend(moves);
        let grouped = together(both);
        assert_eq!(grouped.len(), 2, "the move of the copied partition apart");
        for (steps, txn) in &grouped {
            let mut keys_written: Vec<&Write> = txn.then.iter().collect();
            keys_written.dedup();
            assert_eq!(keys_written.len(), txn.then.len(), "{steps:?}");
            let partitions: BTreeSet<u32> = steps
                .iter()
                .filter_map(|s| match s {
                    Planned::Start { partition, .. } | Planned::Replicate { partition, .. } => {
                        Some(*partition)
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(partitions.len(), steps.len(), "{steps:?}");
        }
    }

    #[test]
    fn flips_written_together_are_those_made_one_after_the_other() {
        let keys = Keys::new("t");
        let map = PartitionMap::first(6, &nodes(&["a", "b", "c"])).unwrap();
        let ready = |partition: u32, from: &str| ReadyFlip {
            revision: 10 + i64::from(partition),
            record: to_cutover(
                &MoveRecord::started(partition, (from, "d"), MoveKind::Move, 0),
                0,
            ),
            leases: (1, 500),
        };
        // 0 and 3 are a's, 1 is b's; the move of 1 says c (an older map).
        let moves = [ready(0, "a"), ready(1, "c"), ready(3, "a")];
        let (answers, written) = flip_all(&keys, &moves, (&map, 5), 100);
        assert!(answers[0].is_ok() && answers[2].is_ok());
        assert!(matches!(
            answers[1],
            Err(FlipRefused::NotTheOwner { partition: 1, .. })
        ));
        let (next, txn) = written.unwrap();
        let mut one_by_one = map.clone();
        for one in [&moves[0], &moves[2]] {
            one_by_one = flip(&one.record, &one_by_one, one.leases, 100).unwrap().1;
        }
        assert_eq!(next.owners, one_by_one.owners);
        assert_eq!(next.epoch, map.epoch + 1, "one map write, one epoch");
        assert_eq!(answers[0].as_ref().unwrap().phase, MovePhase::Flipped);
        assert_eq!(answers[0].as_ref().unwrap().hold_until_ms, 500);
        assert_eq!(
            txn.when,
            vec![
                Condition::ModRevision(keys.map(), 5),
                Condition::ModRevision(keys.move_of(0), 10),
                Condition::ModRevision(keys.move_of(3), 13),
            ]
        );
        assert_eq!(txn.then.len(), 3, "two moves and the map");
        let none = flip_all(&keys, &moves[1..2], (&map, 5), 100);
        assert!(none.1.is_none());
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
        let follower = map.followers_of(0)[0].clone();
        let leader = map.owners[0].clone();
        let record = MoveRecord::started(0, (&leader, &follower), MoveKind::Move, 0);
        let (_, next) = flip(&record, map, (0, 0), 0).unwrap();
        assert_eq!(next.owners[0], follower);
        assert_eq!(next.followers_of(0), std::slice::from_ref(&leader));
        let third = ["a", "b", "c"]
            .into_iter()
            .find(|n| !map.holds(n, 0))
            .unwrap();
        let record = MoveRecord::started(0, (&leader, third), MoveKind::Replica, 0);
        let (_, next) = flip(&record, map, (0, 0), 0).unwrap();
        assert_eq!(next.owners[0], leader, "a new copy leaves the leader");
        assert_eq!(next.followers_of(0).len(), 2);
        assert!(next.follows(third, 0));
    }

    #[test]
    fn a_follower_is_no_stray() {
        let view = view(&["a", "b", "c"]);
        let map = view.map.as_ref().unwrap();
        let strays = strays(&view, "a", &Receipts::default(), |_| true, |_| None);
        for (partition, _) in &strays {
            assert!(!map.holds("a", *partition));
        }
        assert_eq!(strays.len(), 2, "a holds four of six partitions");
    }
}
