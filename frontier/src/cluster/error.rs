//! What goes wrong in a cluster, and the one place it becomes a gRPC
//! status (the `From` below), used at the services' edge.

use std::time::Duration;

use tonic::Status;

use super::coordination::CoordinationError;

/// What a node answers when a forwarded call's epoch is not its own;
/// callers match it to ride out a map change.
pub(super) const EPOCHS_DIFFER: &str = "partition map epochs differ";

/// Why a cluster call or step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// etcd did not answer within the join timeout.
    #[error("cannot reach etcd at {endpoints} after {waited:?}: {reason}")]
    Unreachable {
        endpoints: String,
        waited: Duration,
        reason: String,
    },
    /// The cluster refuses this node (partition count, rules, node ID).
    #[error("cannot join cluster {cluster:?}: {reason}")]
    Refused { cluster: String, reason: String },
    /// etcd answered something that is not ours.
    #[error("etcd key {key} holds something unreadable: {reason}")]
    Corrupt { key: String, reason: String },
    /// A call to etcd failed (a step is tried again).
    #[error("etcd: {0}")]
    Coordination(String),
    /// A crawl-wide setting or a drain could not be recorded.
    #[error("cannot record {what} in etcd ({reason}); nothing changed; retry when etcd is back")]
    NotRecorded { what: &'static str, reason: String },
    /// A compare-and-swap lost: what it was conditional on changed.
    #[error("{key} or the map changed meanwhile; reading again")]
    Raced { key: String },
    /// The cluster has no partition map yet.
    #[error(
        "cluster {cluster:?} is forming: {registered} of {initial} nodes registered, no partition map yet"
    )]
    Forming {
        cluster: String,
        registered: usize,
        initial: usize,
    },
    /// The map lacks a partition.
    #[error("partition {partition} is not in the map of epoch {epoch}")]
    NotInMap { partition: usize, epoch: u64 },
    /// A node a call needs is not registered.
    #[error(
        "{} is not alive (no registration in etcd); retry: it takes its \
         partitions up again when it restarts on its data directory",
        match partition {
            Some(p) => format!("partition {p} is owned by frontier node {node}, which"),
            None => format!("frontier node {node}"),
        }
    )]
    NodeAway {
        node: String,
        partition: Option<usize>,
    },
    /// A forwarded call routed with another map.
    #[error(
        "{EPOCHS_DIFFER}: the sender routed with epoch {sent}, node {node} holds \
         epoch {ours}; the sender tries again once both agree"
    )]
    EpochsDiffer { sent: u64, ours: u64, node: String },
    /// A node-to-node call without the node secret.
    #[error(
        "only the nodes of cluster {cluster:?} may make this call (it is one node's \
         call to another, and carries none of the cluster's node secret)"
    )]
    NotANode { cluster: String },
    /// SealPartition for a move that is not at its cutover from here.
    #[error("partition {partition} is not at the cutover of a move from node {node}")]
    NotAtCutover { partition: u32, node: String },
    /// A node named that the cluster does not know.
    #[error("no node {node:?} in cluster {cluster:?}")]
    UnknownNode { node: String, cluster: String },
    /// Draining the last node that could own partitions.
    #[error(
        "node {node:?} is the only node left to own partitions: start another before draining it"
    )]
    LastOwner { node: String },
    /// The partition's owner restarted mid-cutover and lost its notes.
    #[error("the partition's owner restarted during the cutover; starting it again")]
    OwnerRestarted,
    /// A moved URL's record arrived unreadable.
    #[error("the record of {url} came unreadable: {reason}")]
    UnreadableRecord { url: String, reason: String },
    /// A Replicate from a node the map does not make the partition's
    /// leader, or to a node it does not make a follower.
    #[error(
        "node {node} does not follow partition {partition} under leader {leader} (epoch {epoch})"
    )]
    NotAFollower {
        node: String,
        partition: u32,
        leader: String,
        epoch: u64,
    },
    /// A partition with fewer copies in sync than writes need.
    #[error(
        "partition {partition} has {in_sync} cop{} in sync and writes need {min_in_sync} \
         (--min-in-sync); retry: a new follower is being copied",
        if *in_sync == 1 { "y" } else { "ies" }
    )]
    TooFewCopies {
        partition: usize,
        in_sync: usize,
        min_in_sync: u32,
    },
    /// Followers did not confirm a write in time, and could not be taken
    /// out of the in-sync set: the write is not acknowledged.
    #[error("{0}; retry")]
    NotReplicated(String),
    /// This node's registration may have lapsed: it serves nothing until
    /// it has registered again.
    #[error(
        "frontier node {node} may have lost its registration in etcd (it was paused or cut \
         off): it serves no URLs until it has registered again; other nodes serve its \
         partitions meanwhile"
    )]
    RegistrationLapsed { node: String },
    /// This node's store failed a step.
    #[error("{0}")]
    Local(String),
    /// A blocking task of a step did not finish.
    #[error("a cluster task failed: {0}")]
    Task(String),
    /// A peer's answer, as it gave it.
    #[error("{0}")]
    Peer(#[from] Status),
}

impl From<CoordinationError> for ClusterError {
    fn from(error: CoordinationError) -> Self {
        Self::Coordination(error.to_string())
    }
}

impl From<tokio::task::JoinError> for ClusterError {
    fn from(error: tokio::task::JoinError) -> Self {
        Self::Task(error.to_string())
    }
}

impl From<ClusterError> for Status {
    fn from(error: ClusterError) -> Self {
        let message = error.to_string();
        match error {
            ClusterError::Peer(status) => status,
            ClusterError::UnreadableRecord { .. } => Status::data_loss(message),
            ClusterError::Unreachable { .. }
            | ClusterError::Coordination(_)
            | ClusterError::NotRecorded { .. }
            | ClusterError::Forming { .. }
            | ClusterError::NodeAway { .. }
            | ClusterError::EpochsDiffer { .. }
            | ClusterError::OwnerRestarted
            | ClusterError::NotAFollower { .. }
            | ClusterError::TooFewCopies { .. }
            | ClusterError::NotReplicated(_)
            | ClusterError::RegistrationLapsed { .. }
            | ClusterError::Local(_) => Status::unavailable(message),
            ClusterError::Raced { .. } => Status::aborted(message),
            ClusterError::Refused { .. }
            | ClusterError::NotAtCutover { .. }
            | ClusterError::LastOwner { .. } => Status::failed_precondition(message),
            ClusterError::UnknownNode { .. } => Status::not_found(message),
            ClusterError::NotANode { .. } => Status::permission_denied(message),
            ClusterError::Corrupt { .. }
            | ClusterError::NotInMap { .. }
            | ClusterError::Task(_) => Status::internal(message),
        }
    }
}
