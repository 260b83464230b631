//! A frontier cluster: partitions spread over several nodes, coordinated
//! through etcd, any node answering every call.
//!
//! - [`map`]: what etcd holds, as plain data (facts fixed at creation,
//!   members, the partition map with its epoch, crawl-wide settings).
//! - [`coordination`]: the calls the cluster makes to etcd, as a trait
//!   with an etcd implementation and an in-memory twin.
//! - `protocol`: the protocol's decisions without I/O (the keys, the view
//!   read from them, the leader's plan, each move step's transaction, seals
//!   and stray copies), shared by the nodes and the simulation tests.
//! - `coordinator`: joining (facts checked, registration under a lease),
//!   the leader's election and its writes, and the watch that keeps this
//!   node's [`View`] current and applies crawl-wide settings.
//! - [`moves`]: partition moves, each node's part of them.
//! - `error`: [`ClusterError`] and its one mapping to gRPC statuses.
//! - `replication`: each partition's copies on its followers (PacificA):
//!   the leader's senders, the followers' Replicate, takeovers.
//! - `peers`: clients of the other nodes, with one long-lived put stream
//!   per peer and call kind.
//! - `turns`: politeness groups kept across nodes: this node's asks for
//!   turns of groups other nodes keep, and GroupTurns, the keeper's side.
//! - `router`: the URL Frontier service of a node: puts split by owning
//!   partition, owner-only calls sent to the owner, the rest fanned out and
//!   merged.
//! - `admin`: the admin service of a node, over the whole cluster.
//! - `sim` (tests): seeded step-by-step simulation of the protocol over the
//!   in-memory twin, with faults, checking its invariants after each step.
//!
//! Fencing: a node takes writes for a partition only while its map gives
//! it that partition, and a forwarded call carries the sender's map epoch
//! ([`EPOCH_HEADER`]); a node whose epoch differs refuses it, so two nodes
//! never write one partition on the strength of two different maps.

/// Calls a method on a [`Target`]: the local service as a server would,
/// or a peer with the call marked as forwarded under our epoch.
macro_rules! call {
    ($target:expr, $method:ident, $params:expr) => {
        match $target {
            $crate::cluster::Target::Local(service) => service
                .$method(tonic::Request::new($params))
                .await
                .map(tonic::Response::into_inner),
            $crate::cluster::Target::Remote(mut client, epoch) => client
                .$method($crate::cluster::peers::forwarded($params, epoch))
                .await
                .map(tonic::Response::into_inner),
        }
    };
}

/// Calls a method on the node `$resolve` names (an expression that may
/// use `?`), resolving it anew and calling again while the nodes' maps
/// disagree ([`riding_out_map_changes`]); answers the call's answer.
macro_rules! call_at {
    ($resolve:expr, $method:ident, $params:expr) => {
        $crate::cluster::riding_out_map_changes(|| async {
            let target = $resolve;
            call!(target, $method, ::std::clone::Clone::clone(&$params))
        })
        .await
    };
}

/// Calls a method with the same parameters on every node (`live_only`:
/// every live one) through the service's `on_nodes`; answers (node ID,
/// answer) pairs or the first failure, naming its node.
macro_rules! fan_out {
    ($service:expr, $live_only:expr, $method:ident, $params:expr) => {{
        let params = $params;
        $service
            .on_nodes($live_only, |target| {
                let params = ::std::clone::Clone::clone(&params);
                async move { call!(target, $method, params) }
            })
            .await
    }};
}

mod admin;
pub mod coordination;
mod coordinator;
mod error;
pub mod map;
pub mod moves;
mod peers;
mod protocol;
mod replication;
mod router;
#[cfg(test)]
pub(crate) mod sim;
mod turns;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tonic::Status;

pub use admin::ClusterAdmin;
pub use coordinator::join;
pub use error::ClusterError;
use error::EPOCHS_DIFFER;
pub use router::ClusterRouter;

use map::{ClusterFacts, CrawlSettings, Member, PartitionMap};

use crate::service::{SharedFrontier, crawl_or_default};

/// Header of a call one node forwards to another: the sender's map epoch.
/// The receiver serves it from its own partitions only, and refuses it
/// when its own epoch differs.
pub const EPOCH_HEADER: &str = "x-frontier-epoch";

/// How long a node tries a forwarded call again while another node holds
/// a different partition map: maps change at every node within moments of
/// each other (the watch), so a disagreement this long is not transient
/// and the caller hears of it.
const EPOCH_RETRY: Duration = Duration::from_secs(10);

/// Calls `call` again, pausing longer each time, while it fails because
/// two nodes held different partition maps, for at most [`EPOCH_RETRY`].
/// `call` resolves its targets anew each time, so a map that changed
/// sends it where the new map says.
async fn riding_out_map_changes<T, F, Fut>(mut call: F) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        match call().await {
            Err(status)
                if status.code() == tonic::Code::Unavailable
                    && status.message().contains(EPOCHS_DIFFER)
                    && started.elapsed() + pause < EPOCH_RETRY =>
            {
                tracing::debug!(%status, "forwarded call met another map; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            answer => return answer,
        }
    }
}

/// How a node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// etcd endpoints (`http://host:2379`).
    pub etcd: Vec<String>,
    /// The cluster's name: its keys live under `/crawl-frontier/NAME/`.
    pub name: String,
    /// This node's stable ID.
    pub node_id: String,
    /// `host:port` others reach this node at.
    pub advertise: String,
    /// Nodes the first partition map waits for.
    pub initial_nodes: usize,
    /// Copies of each partition, for a cluster this node creates; `None`:
    /// the cluster's (one, for a new cluster). A node that names another
    /// count than the cluster's is refused.
    pub replicas: Option<u32>,
    /// Copies a write must be durable on before it is acknowledged;
    /// `None`: the cluster's (for a new cluster, two when it keeps two
    /// copies or more, else one).
    pub min_in_sync: Option<u32>,
    /// How long a partition that still takes writes waits, short of a
    /// copy, for its node to come back before it is copied elsewhere.
    pub replace_after: Duration,
    /// Life of the registration lease: a node that stops renewing it is
    /// taken for dead this long after.
    pub lease_ttl: Duration,
    /// How long joining keeps retrying an unreachable etcd.
    pub join_timeout: Duration,
    /// Sent to the other nodes on calls that need it.
    pub token: Option<String>,
    /// URLs per page when copying a partition moving here.
    pub move_page_urls: u32,
    /// How this node dials the others (their CA; its own certificate,
    /// for nodes that ask for one).
    pub tls: proto::tls::ClientTls,
    /// Whether the nodes serve TLS: their addresses are dialled as
    /// `https://`.
    pub secure: bool,
}

/// What this node knows of the cluster, replaced whole on every change.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The partition map; `None` while the cluster forms.
    pub map: Option<PartitionMap>,
    /// The etcd revision of the map's last change.
    pub map_revision: i64,
    /// Live members by node ID.
    pub members: BTreeMap<String, Member>,
    /// The elected leader's node ID.
    pub leader: Option<String>,
    /// Crawl-wide settings.
    pub settings: CrawlSettings,
    /// Partition moves in flight.
    pub moves: moves::Moves,
    /// Nodes whose partitions move away.
    pub draining: std::collections::BTreeSet<String>,
    /// The etcd revision this view was read at.
    pub revision: i64,
    /// The cluster's facts and their etcd revision (the copy count changes
    /// live).
    pub facts: Option<(ClusterFacts, i64)>,
    /// When `frontier cluster remove` last ran (UTC ms; 0: never).
    pub replace_now_ms: u64,
}

/// Where one call goes: this node's own service, or a peer's client and
/// the epoch the call is forwarded under.
enum Target<L, R> {
    Local(L),
    Remote(Box<R>, u64),
}

/// Each node's ID and where a call for it goes, or why it cannot.
type NodeTargets<L, R> = Vec<(String, Result<Target<L, R>, Status>)>;

/// Runs `call` on each target; a node that is away is skipped when
/// `live_only`, else its error is the answer. Answers (node ID, answer)
/// pairs, or the first failure, naming its node.
async fn on_nodes<L, R, T, F, Fut>(
    targets: NodeTargets<L, R>,
    live_only: bool,
    call: F,
) -> Result<Vec<(String, T)>, Status>
where
    F: Fn(Target<L, R>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let calls = targets.into_iter().map(|(id, target)| {
        let call = &call;
        async move {
            match target {
                Ok(target) => Some(
                    call(target)
                        .await
                        .map(|answer| (id.clone(), answer))
                        .map_err(|status| named(&id, status)),
                ),
                Err(_) if live_only => None,
                Err(status) => Some(Err(status)),
            }
        }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Items split by the node that owns them.
struct Shares {
    /// Each owner with the indexes of its items; an item with no partition
    /// (a URL that does not canonicalise) is this node's, which refuses it
    /// as any node would.
    by_owner: Vec<(Owner, Vec<usize>)>,
    /// Why some items have no reachable owner, if some have none; those
    /// items are in no share.
    away: Option<Status>,
}

/// How long a write waits for a partition's cutover to end before it is
/// refused (the cutover sends only the writes of the copy's duration, so it
/// is short).
const CUTOVER_WAIT: Duration = Duration::from_secs(30);

/// Where a partition is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This node.
    Local,
    /// Another live node.
    Remote(Member),
}

/// A node's place in its cluster.
pub struct Cluster {
    options: ClusterOptions,
    facts: ClusterFacts,
    frontier: SharedFrontier,
    view: ArcSwap<View>,
    changes: tokio::sync::watch::Sender<u64>,
    keys: protocol::Keys,
    etcd: Arc<dyn coordination::Coordination>,
    peers: peers::Peers,
    // Proves this node's calls to its peers (`proto::bearer::NODE_SECRET_HEADER`).
    node_secret: String,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    moves: tokio::sync::Mutex<moves::MoveState>,
    flips: moves::flip::FlipQueue,
    replication: replication::Replication,
    // Until when this node's registration is surely alive (its last
    // renewal's sending plus the lease's life): past it, another node may
    // lead its partitions.
    registered_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.options.name)
            .field("node_id", &self.options.node_id)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// The cluster's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.options.name
    }

    /// This node's ID.
    #[must_use]
    pub fn node_id(&self) -> &str {
        &self.options.node_id
    }

    /// The partition count of every store of the cluster.
    #[must_use]
    pub fn partitions(&self) -> usize {
        self.facts.partitions as usize
    }

    /// Copies the cluster keeps of each partition now.
    #[must_use]
    pub fn replicas(&self) -> u32 {
        self.view()
            .facts
            .as_ref()
            .map_or(self.facts.replicas, |(facts, _)| facts.replicas)
    }

    /// Copies a write must be durable on now.
    #[must_use]
    pub fn min_in_sync(&self) -> u32 {
        self.view()
            .facts
            .as_ref()
            .map_or(self.facts.min_in_sync, |(facts, _)| facts.min_in_sync)
    }

    /// Notes a renewal of the registration sent at `until - ttl`.
    fn registered_until(&self, until: std::time::Instant) {
        let mut registered = self
            .registered_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *registered = Some(registered.map_or(until, |before| before.max(until)));
    }

    /// Refuses to serve URLs once the registration may have lapsed (the
    /// node was paused or cut off from etcd): its partitions may be led by
    /// a follower that serves them, and serving here too would hand a URL
    /// out twice. Serving resumes on a view read after it registered again.
    pub fn check_registered(&self) -> Result<(), Status> {
        // Leaves the successor the time a call takes to be served.
        const MARGIN: Duration = Duration::from_millis(500);
        let until = *self
            .registered_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match until {
            Some(until) if std::time::Instant::now() + MARGIN < until => Ok(()),
            _ => Err(ClusterError::RegistrationLapsed {
                node: self.options.node_id.clone(),
            }
            .into()),
        }
    }

    /// What this node knows now.
    #[must_use]
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// The map epoch this node serves under (0 before a map exists).
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.view().map.as_ref().map_or(0, |map| map.epoch)
    }

    /// The partition of a URL in a crawl, or `None` when it does not
    /// canonicalise (any node refuses it alike).
    #[must_use]
    pub fn partition_of_url(&self, crawl: &str, url: &str) -> Option<usize> {
        let canonical = crate::canonical::canonicalise(url, self.facts.max_url_length).ok()?;
        Some(self.partition_of_host(crawl, canonical.host()))
    }

    /// Whether this node's map gives it the partition of `url`; a URL
    /// without one (not a URL) is left to the store, which refuses it.
    pub fn owns_url(&self, crawl: &str, url: &str) -> bool {
        self.partition_of_url(crawl, url).is_none_or(|partition| {
            matches!(self.owner_of(partition), Ok(Owner::Local))
                && self.check_copies(partition).is_ok()
        })
    }

    /// Waits while a move of one of `partitions` is at its cutover (its old
    /// owner takes no writes for it, and the new one does not own it yet),
    /// until the flip or the rollback, or at most 30 s: writes
    /// then go where the map says, so a write that reached the old owner
    /// during the cutover is forwarded rather than refused.
    pub async fn past_cutovers(&self, partitions: impl IntoIterator<Item = usize>) {
        let at_cutover = |view: &View, partitions: &BTreeSet<u32>| {
            view.moves.iter().any(|(partition, (record, _))| {
                record.phase == moves::MovePhase::Cutover && partitions.contains(partition)
            })
        };
        if self.view().moves.is_empty() {
            return;
        }
        let partitions: BTreeSet<u32> = partitions.into_iter().map(|p| p as u32).collect();
        let mut changes = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + CUTOVER_WAIT;
        while at_cutover(&self.view(), &partitions) {
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // Past the bound (or shutting down): the write is refused
                // and the client sends it again.
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// The partition of a host (a default queue key) in a crawl.
    #[must_use]
    pub fn partition_of_host(&self, crawl: &str, host: &str) -> usize {
        self.facts
            .partition_by
            .partition(crawl_or_default(crawl), host, self.partitions())
    }

    /// Who serves a partition: UNAVAILABLE, naming the node, when its
    /// owner is not alive or the map does not exist yet.
    pub fn owner_of(&self, partition: usize) -> Result<Owner, Status> {
        let view = self.view();
        let Some(map) = &view.map else {
            return Err(ClusterError::Forming {
                cluster: self.options.name.clone(),
                registered: view.members.len(),
                initial: self.options.initial_nodes,
            }
            .into());
        };
        let Some(owner) = map.owners.get(partition) else {
            return Err(ClusterError::NotInMap {
                partition,
                epoch: map.epoch,
            }
            .into());
        };
        if owner == &self.options.node_id {
            return Ok(Owner::Local);
        }
        match view.members.get(owner) {
            Some(member) => Ok(Owner::Remote(member.clone())),
            None => Err(node_away(owner, Some(partition))),
        }
    }

    /// Splits items, given by their partitions, by owning node.
    fn shares(&self, partitions: impl IntoIterator<Item = Option<usize>>) -> Shares {
        let mut by_owner: BTreeMap<Option<String>, (Owner, Vec<usize>)> = BTreeMap::new();
        let mut away = None;
        for (index, partition) in partitions.into_iter().enumerate() {
            let owner = match partition {
                None => Ok(Owner::Local),
                Some(partition) => self
                    .check_copies(partition)
                    .map_err(Status::from)
                    .and_then(|()| self.owner_of(partition)),
            };
            let owner = match owner {
                Ok(owner) => owner,
                Err(status) => {
                    away.get_or_insert(status);
                    continue;
                }
            };
            let key = match &owner {
                Owner::Local => None,
                Owner::Remote(member) => Some(member.id.clone()),
            };
            by_owner
                .entry(key)
                .or_insert_with(|| (owner, Vec::new()))
                .1
                .push(index);
        }
        Shares {
            by_owner: by_owner.into_values().collect(),
            away,
        }
    }

    /// Every node a cluster-wide call must reach: the map's owners and the
    /// live members, each once, this node as [`Owner::Local`]; an owner
    /// that is not alive comes as an error naming it.
    #[must_use]
    pub fn every_node(&self) -> Vec<(String, Result<Owner, Status>)> {
        let view = self.view();
        let mut ids: std::collections::BTreeSet<String> = view.members.keys().cloned().collect();
        if let Some(map) = &view.map {
            ids.extend(map.owners.iter().cloned());
        }
        ids.insert(self.options.node_id.clone());
        ids.into_iter()
            .map(|id| {
                let owner = if id == self.options.node_id {
                    Ok(Owner::Local)
                } else {
                    match view.members.get(&id) {
                        Some(member) => Ok(Owner::Remote(member.clone())),
                        None => Err(node_away(&id, None)),
                    }
                };
                (id, owner)
            })
            .collect()
    }

    /// Where a call for `owner` goes: `local` here, else the peer's
    /// client `remote` picks, under this node's epoch.
    fn target<L: Clone, R>(
        &self,
        owner: Owner,
        local: &L,
        remote: impl FnOnce(&peers::Peer) -> R,
    ) -> Result<Target<L, R>, Status> {
        Ok(match owner {
            Owner::Local => Target::Local(local.clone()),
            Owner::Remote(member) => Target::Remote(
                Box::new(remote(&*self.peers.get(&member.endpoint())?)),
                self.epoch(),
            ),
        })
    }

    /// Every node as a target (see [`Self::every_node`]).
    fn targets<L: Clone, R>(
        &self,
        local: &L,
        remote: impl Fn(&peers::Peer) -> R,
    ) -> NodeTargets<L, R> {
        self.every_node()
            .into_iter()
            .map(|(id, owner)| {
                let target = owner.and_then(|owner| self.target(owner, local, &remote));
                (id, target)
            })
            .collect()
    }

    /// Whether a call was forwarded by another node (and is to be served
    /// here alone); one forwarded under another epoch is refused, and so
    /// is one that does not prove it comes from a node: a client's
    /// forwarding header would have this node take writes for partitions
    /// it does not own.
    fn accept_forwarded<T>(&self, request: &tonic::Request<T>) -> Result<bool, Status> {
        match forwarded_epoch(request.metadata()) {
            Some(epoch) => {
                self.check_from_node(request)?;
                self.check_epoch(epoch).map(|()| true)
            }
            None => Ok(false),
        }
    }

    /// Refuses a call that only a node of the cluster may make, unless it
    /// carries the cluster's node secret.
    fn check_from_node<T>(&self, request: &tonic::Request<T>) -> Result<(), Status> {
        let presented = request
            .metadata()
            .get(proto::bearer::NODE_SECRET_HEADER)
            .map(tonic::metadata::MetadataValue::as_bytes);
        match presented {
            Some(presented)
                if crate::auth::constant_time_eq(presented, self.node_secret.as_bytes()) =>
            {
                Ok(())
            }
            _ => Err(ClusterError::NotANode {
                cluster: self.options.name.clone(),
            }
            .into()),
        }
    }

    /// Refuses a forwarded call whose sender routed with another map.
    pub fn check_epoch(&self, sent: u64) -> Result<(), Status> {
        let ours = self.epoch();
        if sent == ours {
            Ok(())
        } else {
            Err(ClusterError::EpochsDiffer {
                sent,
                ours,
                node: self.options.node_id.clone(),
            }
            .into())
        }
    }

    /// Stops the background tasks and gives up the registration, so the
    /// others see this node gone at once instead of after its lease.
    pub async fn leave(&self) {
        let tasks: Vec<_> = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            task.abort();
        }
        replication::stop(self);
        coordinator::deregister(self).await;
    }
}

/// UNAVAILABLE for a node that is away (and the partition that needed
/// it, when one did).
fn node_away(node: &str, partition: Option<usize>) -> Status {
    ClusterError::NodeAway {
        node: node.to_owned(),
        partition,
    }
    .into()
}

/// A node's failure, with the node named. A peer call cancelled under us
/// means the peer's connection broke mid-call (a node killed between its
/// last registration and its lease's end): the caller should retry, as for
/// any node that is away, so it answers UNAVAILABLE.
fn named(node: &str, status: Status) -> Status {
    let code = match status.code() {
        tonic::Code::Cancelled => tonic::Code::Unavailable,
        code => code,
    };
    let message = if status.message().contains(node) {
        status.message().to_string()
    } else {
        format!("frontier node {node}: {}", status.message())
    };
    Status::new(code, message)
}

/// The epoch a forwarded call carries, if it is one.
fn forwarded_epoch(metadata: &tonic::metadata::MetadataMap) -> Option<u64> {
    metadata
        .get(EPOCH_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_call_cancelled_by_a_broken_connection_is_unavailable() {
        let status = named("n2", Status::cancelled("operation was canceled"));
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "frontier node n2: operation was canceled");
        let refused = named("n2", Status::invalid_argument("frontier node n2: bad URL"));
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert_eq!(refused.message(), "frontier node n2: bad URL");
    }
}
