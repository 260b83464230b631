//! What etcd holds for a cluster, as plain data: the cluster's fixed facts,
//! its members, the partition map, the moves and the crawl-wide settings,
//! and how a first map is laid out. Nothing here talks to etcd.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Facts fixed when the cluster is created; a node that disagrees is
/// refused, so that every node files a URL under the same partition and
/// gives it the same verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFacts {
    /// Partitions of every store of the cluster.
    pub partitions: u32,
    /// The admission rules ([`crate::scope::Rules::describe`]).
    pub rules: String,
    /// Longest URL accepted, in bytes.
    pub max_url_length: usize,
    /// Copies of each partition: its leader and `replicas - 1` followers.
    #[serde(default = "one")]
    pub replicas: u32,
    /// Copies (the leader's included) a write must be durable on before it
    /// is acknowledged; below it, writes are refused.
    #[serde(default = "one")]
    pub min_in_sync: u32,
    /// What URLs' partitions follow; by host in a cluster created before
    /// the choice existed.
    #[serde(default)]
    pub partition_by: crate::partitioning::PartitionBy,
}

fn one() -> u32 {
    1
}

impl ClusterFacts {
    /// Why a node with `ours` cannot join a cluster created with `self`,
    /// if it cannot.
    #[must_use]
    pub fn mismatch(&self, ours: &ClusterFacts) -> Option<String> {
        if self.partitions != ours.partitions {
            return Some(format!(
                "the cluster has {} partitions and this node's store has {}: \
                 a store joins only a cluster of its own partition count",
                self.partitions, ours.partitions
            ));
        }
        if self.rules != ours.rules {
            return Some(format!(
                "the cluster's admission rules are {:?} and this node's are {:?}: \
                 start every node with the same scope, include, exclude, depth \
                 and path-repeat options",
                self.rules, ours.rules
            ));
        }
        if self.replicas != ours.replicas {
            return Some(format!(
                "the cluster keeps {} copies of each partition and this node asks for {}: \
                 start it without --replicas to take the cluster's, or change the \
                 cluster's with `frontier cluster replicas N`",
                self.replicas, ours.replicas
            ));
        }
        if self.min_in_sync != ours.min_in_sync {
            return Some(format!(
                "the cluster acknowledges a write once on {} copies and this node asks for {}: \
                 start it without --min-in-sync to take the cluster's",
                self.min_in_sync, ours.min_in_sync
            ));
        }
        if self.partition_by != ours.partition_by {
            return Some(format!(
                "the cluster partitions URLs by {} and this node's store by {}: a store \
                 keeps the partitioning it was created with (--politeness domain creates \
                 stores partitioned by domain, so that one node serves a domain's hosts); \
                 start this node with an empty data directory and the cluster's --politeness",
                self.partition_by.name(),
                ours.partition_by.name()
            ));
        }
        if self.max_url_length != ours.max_url_length {
            return Some(format!(
                "the cluster takes URLs up to {} bytes and this node up to {}: \
                 start every node with the same --max-url-length",
                self.max_url_length, ours.max_url_length
            ));
        }
        None
    }
}

/// A live node, as it registered under its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Stable node ID (a StatefulSet pod's name).
    pub id: String,
    /// `host:port` other nodes and clients reach it at.
    pub address: String,
    /// UTC, milliseconds since the epoch.
    pub started_at_ms: u64,
}

impl Member {
    /// The member's address to dial; the peer links add the scheme
    /// (`https` when the cluster serves TLS).
    #[must_use]
    pub fn endpoint(&self) -> String {
        self.address.trim_end_matches('/').to_owned()
    }
}

/// Which node owns each partition, and the epoch of that assignment. Only
/// the elected leader writes it, with a compare-and-swap on the previous
/// version, so epochs only grow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    /// Grows by one with every change of the map.
    pub epoch: u64,
    /// Leader per partition (index = partition): the node that serves it
    /// and takes its writes.
    pub owners: Vec<String>,
    /// In-sync followers per partition (index = partition; missing or
    /// empty: none): each holds every write acknowledged for the
    /// partition, so any of them can take over as its leader. A follower
    /// leaves the set (a new epoch) before any write is acknowledged
    /// without it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followers: Vec<Vec<String>>,
    /// Followers taken out of the in-sync set per partition (index =
    /// partition; missing or empty: none), while the leader that took
    /// them out leads it: each keeps its copy, which that leader can bring
    /// up to date from what it noted since instead of a whole copy. Cleared
    /// when the partition's leader changes or it has its copies again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lagging: Vec<Vec<String>>,
}

impl PartitionMap {
    /// The first map of a cluster: partitions dealt out in turn over the
    /// node IDs in sorted order, so that counts differ by at most one.
    #[must_use]
    pub fn first(partitions: u32, nodes: &BTreeSet<String>) -> Option<Self> {
        Self::first_replicated(partitions, nodes, 1)
    }

    /// A first map with `replicas` copies of each partition (as many as
    /// there are nodes, at most): the leader as in [`Self::first`], its
    /// followers the nodes after it in turn, so that every node leads and
    /// follows about as many partitions as every other.
    #[must_use]
    pub fn first_replicated(
        partitions: u32,
        nodes: &BTreeSet<String>,
        replicas: u32,
    ) -> Option<Self> {
        if nodes.is_empty() {
            return None;
        }
        let nodes: Vec<&String> = nodes.iter().collect();
        let owners = (0..partitions as usize)
            .map(|p| nodes[p % nodes.len()].clone())
            .collect();
        let copies = (replicas.max(1) as usize).min(nodes.len());
        let followers = if copies > 1 {
            (0..partitions as usize)
                .map(|p| {
                    (1..copies)
                        .map(|k| nodes[(p + k) % nodes.len()].clone())
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        Some(Self {
            epoch: 1,
            owners,
            followers,
            lagging: Vec::new(),
        })
    }

    /// The in-sync followers of a partition.
    #[must_use]
    pub fn followers_of(&self, partition: u32) -> &[String] {
        self.followers
            .get(partition as usize)
            .map_or(&[], Vec::as_slice)
    }

    /// Whether `node` is an in-sync follower of `partition`.
    #[must_use]
    pub fn follows(&self, node: &str, partition: u32) -> bool {
        self.followers_of(partition).iter().any(|f| f == node)
    }

    /// Whether `node` holds a copy of `partition`: its leader or one of
    /// its in-sync followers.
    #[must_use]
    pub fn holds(&self, node: &str, partition: u32) -> bool {
        self.owners
            .get(partition as usize)
            .is_some_and(|o| o == node)
            || self.follows(node, partition)
    }

    /// The followers of a partition out of sync whose copy its leader can
    /// bring up to date.
    #[must_use]
    pub fn lagging_of(&self, partition: u32) -> &[String] {
        self.lagging
            .get(partition as usize)
            .map_or(&[], Vec::as_slice)
    }

    /// The lagging list of `partition`, made room for.
    pub fn lagging_mut(&mut self, partition: u32) -> &mut Vec<String> {
        if self.lagging.len() < self.owners.len() {
            self.lagging.resize(self.owners.len(), Vec::new());
        }
        &mut self.lagging[partition as usize]
    }

    /// Forgets every lagging copy of `partition` (its leader changed: the
    /// new one noted nothing for them).
    pub fn clear_lagging(&mut self, partition: u32) {
        if let Some(lagging) = self.lagging.get_mut(partition as usize) {
            lagging.clear();
        }
        if self.lagging.iter().all(Vec::is_empty) {
            self.lagging.clear();
        }
    }

    /// The partitions `node` follows.
    pub fn followed_by<'a>(&'a self, node: &'a str) -> impl Iterator<Item = u32> + 'a {
        self.followers
            .iter()
            .enumerate()
            .filter(move |(_, followers)| followers.iter().any(|f| f == node))
            .map(|(p, _)| p as u32)
    }

    /// The followers list of `partition`, made room for.
    pub fn followers_mut(&mut self, partition: u32) -> &mut Vec<String> {
        if self.followers.len() < self.owners.len() {
            self.followers.resize(self.owners.len(), Vec::new());
        }
        &mut self.followers[partition as usize]
    }

    /// The map that spreads the partitions evenly over `nodes` while moving
    /// as few as it can: each node keeps what it owns up to its share; the
    /// partitions of nodes not in `nodes` (gone, or being drained) and the
    /// excess of nodes above their share go to the nodes below theirs. The
    /// shares differ by at most one, and the larger ones go to the nodes
    /// that own most now, so that the fewest partitions move. The epoch is
    /// one more than this map's when anything moves; `None` without nodes.
    #[must_use]
    pub fn rebalanced(&self, nodes: &BTreeSet<String>) -> Option<Self> {
        if nodes.is_empty() {
            return None;
        }
        let mut owned: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
        for owner in &self.owners {
            if let Some(count) = owned.get_mut(owner.as_str()) {
                *count += 1;
            }
        }
        let mut by_holding: Vec<(&str, usize)> = owned.into_iter().collect();
        by_holding.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let (base, extra) = (
            self.owners.len() / nodes.len(),
            self.owners.len() % nodes.len(),
        );
        let mut room: BTreeMap<&str, usize> = by_holding
            .iter()
            .enumerate()
            .map(|(rank, (node, _))| (*node, base + usize::from(rank < extra)))
            .collect();
        let mut owners: Vec<Option<String>> = self
            .owners
            .iter()
            .map(|owner| match room.get_mut(owner.as_str()) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    Some(owner.clone())
                }
                _ => None,
            })
            .collect();
        let mut takers = by_holding
            .iter()
            .flat_map(|(node, _)| std::iter::repeat_n(*node, room[node]));
        for owner in owners.iter_mut().filter(|owner| owner.is_none()) {
            *owner = takers.next().map(str::to_owned);
        }
        let owners: Vec<String> = owners.into_iter().flatten().collect();
        let epoch = if owners == self.owners {
            self.epoch
        } else {
            self.epoch + 1
        };
        Some(Self {
            epoch,
            owners,
            followers: self.followers.clone(),
            lagging: self.lagging.clone(),
        })
    }

    /// The partitions whose owner differs between this map and `next`, as
    /// (partition, owner here, owner there).
    #[must_use]
    pub fn moves_to<'a>(&'a self, next: &'a Self) -> Vec<(u32, &'a str, &'a str)> {
        self.owners
            .iter()
            .zip(&next.owners)
            .enumerate()
            .filter(|(_, (from, to))| from != to)
            .map(|(p, (from, to))| (p as u32, from.as_str(), to.as_str()))
            .collect()
    }

    /// The partitions `node` owns.
    pub fn owned_by<'a>(&'a self, node: &'a str) -> impl Iterator<Item = u32> + 'a {
        self.owners
            .iter()
            .enumerate()
            .filter(move |(_, owner)| owner.as_str() == node)
            .map(|(p, _)| p as u32)
    }

    /// Every node the map names, leaders and followers, sorted.
    #[must_use]
    pub fn nodes(&self) -> BTreeSet<&str> {
        self.owners
            .iter()
            .chain(self.followers.iter().flatten())
            .map(String::as_str)
            .collect()
    }
}

/// State every node needs to decide alike and that outlives any one node:
/// written to etcd by the node that took the call, applied by every node
/// (at once by the caller's fan-out, and from etcd by a node that was
/// away).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrawlSettings {
    /// Serving paused (false) or on (true); unset until someone sets it.
    pub active: Option<bool>,
    /// A crawl's default delay in seconds (SetDelay with an empty key).
    pub delays: BTreeMap<String, u32>,
    /// The seed hosts (the scope) of each crawl.
    pub seeds: BTreeMap<String, BTreeSet<String>>,
    /// The revisit policies crawls have of their own.
    pub revisits: BTreeMap<String, crate::revisit::Policy>,
}

/// Where a move is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MovePhase {
    /// The receiver copies while the owner serves.
    Copy,
    /// The owner is sealed; the receiver takes the tail and flips.
    Cutover,
    /// The map gives the partition to the receiver.
    Flipped,
}

impl MovePhase {
    /// The name etcd and GetCluster use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::Cutover => "cutover",
            Self::Flipped => "flipped",
        }
    }
}

/// What a move makes of its receiver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MoveKind {
    /// The partition's leader: the sender gives the partition up (or stays
    /// as a follower in the receiver's place, when the receiver was one).
    #[default]
    Move,
    /// A new in-sync follower: the sender stays the leader.
    Replica,
}

impl MoveKind {
    /// The name etcd and GetCluster use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Move => "move",
            Self::Replica => "replica",
        }
    }
}

/// A move as etcd holds it under `moves/P`: a copy of a partition from its
/// leader to another node, ending in a flip of the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    pub partition: u32,
    pub from: String,
    pub to: String,
    pub phase: MovePhase,
    #[serde(default)]
    pub kind: MoveKind,
    /// URLs copied so far.
    #[serde(default)]
    pub copied: u64,
    /// Bytes of the URLs and records copied so far.
    #[serde(default)]
    pub copied_bytes: u64,
    /// When the leader started the move (UTC ms).
    #[serde(default)]
    pub started_at_ms: u64,
    /// When the cutover began (UTC ms).
    #[serde(default)]
    pub cutover_at_ms: u64,
    /// From the cutover's start to the flip.
    #[serde(default)]
    pub cutover_ms: u64,
    /// URLs the old owner had leased at the cutover.
    #[serde(default)]
    pub leased: u64,
    /// The receiver serves the partition from then on (UTC ms): the last
    /// of those leases has ended.
    #[serde(default)]
    pub hold_until_ms: u64,
    /// The old owner has deleted its copy.
    #[serde(default)]
    pub from_done: bool,
    /// A replica brought up to date from its leader's notes of what it
    /// missed, not copied whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_log: bool,
}

impl MoveRecord {
    /// A move the leader starts now, at its copy.
    #[must_use]
    pub fn started(partition: u32, (from, to): (&str, &str), kind: MoveKind, now_ms: u64) -> Self {
        Self {
            partition,
            from: from.to_owned(),
            to: to.to_owned(),
            phase: MovePhase::Copy,
            kind,
            copied: 0,
            copied_bytes: 0,
            started_at_ms: now_ms,
            cutover_at_ms: 0,
            cutover_ms: 0,
            leased: 0,
            hold_until_ms: 0,
            from_done: false,
            from_log: false,
        }
    }
}

/// Moves as a view lists them: partition to (record, etcd mod revision).
pub type Moves = BTreeMap<u32, (MoveRecord, i64)>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_first_map_gives_every_partition_to_a_node_and_balances(
            partitions in 1u32..300,
            nodes in proptest::collection::btree_set("[a-z]{1,6}", 1..8),
        ) {
            let map = PartitionMap::first(partitions, &nodes).unwrap();
            prop_assert_eq!(map.owners.len(), partitions as usize);
            prop_assert_eq!(map.epoch, 1);
            let counts: Vec<usize> = nodes.iter().map(|n| map.owned_by(n).count()).collect();
            prop_assert_eq!(counts.iter().sum::<usize>(), partitions as usize);
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(max - min <= 1);
            // The same nodes, in any order of arrival, give the same map.
            let again = PartitionMap::first(partitions, &nodes.iter().rev().cloned().collect());
            prop_assert_eq!(Some(map), again);
        }
    }

    fn map_over(partitions: usize, owners: &[usize], names: &[String]) -> PartitionMap {
        PartitionMap {
            epoch: 7,
            owners: (0..partitions)
                .map(|p| names[owners[p % owners.len()] % names.len()].clone())
                .collect(),
            followers: Vec::new(),
            lagging: Vec::new(),
        }
    }

    proptest! {
        #[test]
        fn a_rebalanced_map_is_even_moves_the_fewest_and_leaves_drained_nodes_empty(
            partitions in 1usize..200,
            layout in proptest::collection::vec(0usize..8, 1..50),
            names in proptest::collection::btree_set("[a-z]{1,4}", 1..8),
            keep in proptest::collection::vec(proptest::bool::ANY, 8),
        ) {
            let names: Vec<String> = names.into_iter().collect();
            let map = map_over(partitions, &layout, &names);
            // Some nodes stay, some leave, one may join.
            let mut nodes: BTreeSet<String> = names
                .iter()
                .zip(&keep)
                .filter(|(_, keep)| **keep)
                .map(|(name, _)| name.clone())
                .collect();
            nodes.insert("joiner".to_owned());
            let next = map.rebalanced(&nodes).unwrap();
            prop_assert_eq!(next.owners.len(), partitions);
            let counts: Vec<usize> = nodes.iter().map(|n| next.owned_by(n).count()).collect();
            prop_assert_eq!(counts.iter().sum::<usize>(), partitions);
            prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
            // Fewest moves: every partition of a node that left moves, and
            // of a staying node only what it holds above the largest share.
            let share = partitions.div_ceil(nodes.len());
            let floor = partitions / nodes.len();
            let mut held: Vec<usize> = nodes.iter().map(|n| map.owned_by(n).count()).collect();
            held.sort_unstable_by(|a, b| b.cmp(a));
            let extra = partitions % nodes.len();
            let least: usize = (0..partitions)
                .filter(|&p| !nodes.contains(&map.owners[p]))
                .count()
                + held
                    .iter()
                    .enumerate()
                    .map(|(rank, &h)| h.saturating_sub(if rank < extra { share } else { floor }))
                    .sum::<usize>();
            let moves = map.moves_to(&next);
            prop_assert_eq!(moves.len(), least);
            for (_, from, to) in &moves {
                prop_assert!(nodes.contains(*to));
                prop_assert_ne!(from, to);
            }
            prop_assert_eq!(next.epoch, if moves.is_empty() { 7 } else { 8 });
            // A balanced map stays as it is.
            prop_assert_eq!(next.rebalanced(&nodes), Some(next.clone()));
        }
    }

    #[test]
    fn a_joining_node_takes_partitions_from_each_and_a_drained_one_gives_all_back() {
        let three: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let map = PartitionMap::first(12, &three).unwrap();
        let four: BTreeSet<String> = ["a", "b", "c", "d"].map(String::from).into();
        let grown = map.rebalanced(&four).unwrap();
        assert_eq!(grown.owned_by("d").count(), 3);
        assert_eq!(map.moves_to(&grown).len(), 3);
        for node in ["a", "b", "c"] {
            assert_eq!(grown.owned_by(node).count(), 3, "{node} gave one");
        }
        let without_b: BTreeSet<String> = ["a", "c", "d"].map(String::from).into();
        let drained = grown.rebalanced(&without_b).unwrap();
        assert_eq!(drained.owned_by("b").count(), 0);
        assert_eq!(grown.moves_to(&drained).len(), 3);
        assert_eq!(drained.epoch, grown.epoch + 1);
    }

    #[test]
    fn no_nodes_no_map() {
        assert_eq!(PartitionMap::first(4, &BTreeSet::new()), None);
    }

    #[test]
    fn facts_that_differ_are_named() {
        let ours = ClusterFacts {
            partitions: 64,
            rules: "r".into(),
            max_url_length: 2048,
            replicas: 1,
            min_in_sync: 1,
            partition_by: crate::partitioning::PartitionBy::Host,
        };
        assert_eq!(ours.mismatch(&ours.clone()), None);
        let other = ClusterFacts {
            partitions: 32,
            ..ours.clone()
        };
        assert!(other.mismatch(&ours).unwrap().contains("32 partitions"));
        let other = ClusterFacts {
            rules: "s".into(),
            ..ours.clone()
        };
        assert!(other.mismatch(&ours).unwrap().contains("admission rules"));
        let other = ClusterFacts {
            partition_by: crate::partitioning::PartitionBy::Domain,
            ..ours.clone()
        };
        assert!(other.mismatch(&ours).unwrap().contains("by domain"));
        // Facts written before the choice existed partition by host.
        let old: ClusterFacts = serde_json::from_str(
            r#"{"partitions":64,"rules":"r","max_url_length":2048,"replicas":1,"min_in_sync":1}"#,
        )
        .unwrap();
        assert_eq!(old, ours);
    }
}
