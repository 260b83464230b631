//! What etcd holds for a cluster, as plain data: the cluster's fixed facts,
//! its members, the partition map and the crawl-wide settings, and how a
//! first map is laid out. Nothing here talks to etcd.

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
    /// The member's gRPC endpoint.
    #[must_use]
    pub fn endpoint(&self) -> String {
        proto::endpoint_of(&self.address)
    }
}

/// Which node owns each partition, and the epoch of that assignment. Only
/// the elected leader writes it, with a compare-and-swap on the previous
/// version, so epochs only grow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    /// Grows by one with every change of the map.
    pub epoch: u64,
    /// Node ID per partition (index = partition).
    pub owners: Vec<String>,
}

impl PartitionMap {
    /// The first map of a cluster: partitions dealt out in turn over the
    /// node IDs in sorted order, so that counts differ by at most one.
    #[must_use]
    pub fn first(partitions: u32, nodes: &BTreeSet<String>) -> Option<Self> {
        if nodes.is_empty() {
            return None;
        }
        let nodes: Vec<&String> = nodes.iter().collect();
        let owners = (0..partitions as usize)
            .map(|p| nodes[p % nodes.len()].clone())
            .collect();
        Some(Self { epoch: 1, owners })
    }

    /// The partitions `node` owns.
    pub fn owned_by<'a>(&'a self, node: &'a str) -> impl Iterator<Item = u32> + 'a {
        self.owners
            .iter()
            .enumerate()
            .filter(move |(_, owner)| owner.as_str() == node)
            .map(|(p, _)| p as u32)
    }

    /// Every node the map names, sorted.
    #[must_use]
    pub fn nodes(&self) -> BTreeSet<&str> {
        self.owners.iter().map(String::as_str).collect()
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
}

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
    }
}
