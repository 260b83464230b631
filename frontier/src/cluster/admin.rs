//! A cluster node's admin service: filter health, progress and rebuilds
//! over every node with each node's share named, seeds registered
//! cluster-wide before their URLs go to their owners, and the cluster's
//! own view (GetCluster).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proto::admin::{self as adm, admin_server::Admin};
use tonic::{Request, Response, Status};

use super::coordinator::{SettingChange, record_setting};
use super::{Cluster, Owner};
use crate::grpc::AdminService;
use crate::grpc::admin::{observed_fp_rate, state_of};
use crate::service::crawl_or_default;

/// Where one call goes.
type Target = super::Target<
    AdminService,
    adm::admin_client::AdminClient<
        tonic::service::interceptor::InterceptedService<
            tonic::transport::Channel,
            proto::bearer::Bearer,
        >,
    >,
>;

/// The admin service of a cluster node.
#[derive(Clone)]
pub struct ClusterAdmin {
    local: AdminService,
    cluster: Arc<Cluster>,
}

impl std::fmt::Debug for ClusterAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterAdmin")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl ClusterAdmin {
    /// The admin service of a node whose own figures `local` answers.
    #[must_use]
    pub fn new(local: AdminService, cluster: Arc<Cluster>) -> Self {
        Self { local, cluster }
    }

    fn target(&self, owner: Owner) -> Result<Target, Status> {
        self.cluster
            .target(owner, &self.local, super::peers::Peer::admin)
    }

    /// Where a call for a queue goes: its partition's owner.
    fn queue_owner(&self, crawl: &str, key: &str) -> Result<Target, Status> {
        let partition = self.cluster.partition_of_host(crawl, key);
        self.target(self.cluster.owner_of(partition)?)
    }

    /// Stores each seed URL at its owner. Once one owner has stored its
    /// share, a share refused as retryable (its partition moving, its owner
    /// away for a moment) is sent again here, to the owner the map names
    /// then: an error after a partial store would have the client send
    /// every seed again and count the stored ones as already known.
    async fn seed_at_owners(
        &self,
        crawl: &str,
        urls: &[String],
    ) -> Result<adm::AddSeedsResponse, Status> {
        let mut merged = adm::AddSeedsResponse::default();
        let mut pending: Vec<usize> = (0..urls.len()).collect();
        let mut stored_any = false;
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(20);
        loop {
            let split = self.cluster.shares(
                pending
                    .iter()
                    .map(|&i| self.cluster.partition_of_url(crawl, &urls[i])),
            );
            let mut refusal = split.away;
            if !stored_any && let Some(status) = refusal {
                return Err(status);
            }
            // By position in `pending`: whether an owner took it.
            let mut taken = vec![false; pending.len()];
            for (owner, positions) in split.by_owner {
                let answer = match self.target(owner) {
                    Ok(target) => {
                        call!(
                            target,
                            add_seeds,
                            adm::AddSeedsRequest {
                                crawl_id: crawl.to_owned(),
                                urls: positions
                                    .iter()
                                    .map(|&j| urls[pending[j]].clone())
                                    .collect(),
                                local: true,
                                scope_hosts: Vec::new(),
                            }
                        )
                    }
                    Err(status) => Err(status),
                };
                match answer {
                    Ok(answer) => {
                        stored_any = true;
                        merged.added += answer.added;
                        merged.already_known += answer.already_known;
                        merged.refused.extend(answer.refused);
                        merged.scope_hosts.extend(answer.scope_hosts);
                        for &j in &positions {
                            taken[j] = true;
                        }
                    }
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        refusal.get_or_insert(status);
                    }
                    Err(status) if !stored_any => return Err(status),
                    Err(status) => return Err(partly_seeded(status, &merged, urls.len())),
                }
            }
            let Some(status) = refusal else {
                return Ok(merged);
            };
            if !stored_any {
                return Err(status);
            }
            if started.elapsed() + pause >= super::CUTOVER_WAIT {
                return Err(partly_seeded(status, &merged, urls.len()));
            }
            pending = pending
                .into_iter()
                .zip(taken)
                .filter_map(|(i, taken)| (!taken).then_some(i))
                .collect();
            tracing::debug!(%status, left = pending.len(), "seeds met a partition in flight; sending them again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(500));
        }
    }

    async fn on_nodes<T, F, Fut>(
        &self,
        live_only: bool,
        call: F,
    ) -> Result<Vec<(String, T)>, Status>
    where
        F: Fn(Target) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        super::riding_out_map_changes(|| {
            let targets = self.cluster.targets(&self.local, super::peers::Peer::admin);
            super::on_nodes(targets, live_only, &call)
        })
        .await
    }
}

/// A seeding that failed after some owners stored their shares, saying
/// so: sent again, those seeds count as already known.
fn partly_seeded(status: Status, stored: &adm::AddSeedsResponse, of: usize) -> Status {
    let done = stored.added as usize + stored.already_known as usize + stored.refused.len();
    Status::new(
        status.code(),
        format!(
            "{done} of {of} seeds were handled ({} added) before: {}; sent again, those count as already known",
            stored.added,
            status.message()
        ),
    )
}

/// The figures of all partitions summed (their `partition` unset), by the
/// rules of a node's own total: the estimated FP rate weighted by the
/// estimated items, as `bloom_core` weights it.
fn summed(partitions: &[adm::PartitionHealth]) -> adm::PartitionHealth {
    let mut total = adm::PartitionHealth::default();
    let mut weighted_fp = 0.0;
    for p in partitions {
        total.bits += p.bits;
        total.items_inserted += p.items_inserted;
        total.estimated_items += p.estimated_items;
        total.ones += p.ones;
        total.refuted_maybes += p.refuted_maybes;
        total.absent_lookups += p.absent_lookups;
        total.memory_bytes += p.memory_bytes;
        total.rebuild_count += p.rebuild_count;
        total.rebuild_fed += p.rebuild_fed;
        total.rebuild_total += p.rebuild_total;
        weighted_fp += p.estimated_fp_rate * p.estimated_items;
    }
    if let Some(first) = partitions.first() {
        total.layout.clone_from(&first.layout);
        total.hashes = first.hashes;
    }
    total.fill_ratio = total.ones as f64 / total.bits.max(1) as f64;
    if total.estimated_items > 0.0 {
        total.estimated_fp_rate = weighted_fp / total.estimated_items;
    }
    total.observed_fp_rate = observed_fp_rate(total.refuted_maybes, total.absent_lookups);
    total.state = state_of(
        partitions
            .iter()
            .any(|p| p.state == adm::PartitionState::Rebuilding as i32),
    );
    total
}

fn add_progress(sum: &mut adm::Progress, part: &adm::Progress) {
    sum.discovered += part.discovered;
    sum.due_next_hour += part.due_next_hour;
    sum.due_next_day += part.due_next_day;
    if part.next_due_at > 0 && (sum.next_due_at == 0 || part.next_due_at < sum.next_due_at) {
        sum.next_due_at = part.next_due_at;
    }
    if sum.revisit.is_none() {
        sum.revisit.clone_from(&part.revisit);
    }
    sum.due_now += part.due_now;
    sum.scheduled_later += part.scheduled_later;
    sum.leased += part.leased;
    sum.completed += part.completed;
    sum.queues += part.queues;
    sum.active_queues += part.active_queues;
    if let Some(skipped) = &part.skipped {
        let into = sum.skipped.get_or_insert_with(Default::default);
        into.duplicate += skipped.duplicate;
        into.out_of_scope += skipped.out_of_scope;
        into.too_deep += skipped.too_deep;
        into.invalid += skipped.invalid;
        into.too_long += skipped.too_long;
        into.trap += skipped.trap;
        into.metadata_too_large += skipped.metadata_too_large;
    }
    if let Some(rates) = &part.last_minute {
        let into = sum.last_minute.get_or_insert_with(Default::default);
        into.discovered += rates.discovered;
        into.leased += rates.leased;
        into.completed += rates.completed;
    }
}

#[tonic::async_trait]
impl Admin for ClusterAdmin {
    async fn get_filter_health(
        &self,
        request: Request<adm::GetFilterHealthRequest>,
    ) -> Result<Response<adm::FilterHealth>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.get_filter_health(request).await;
        }
        let local_only = adm::GetFilterHealthRequest { local: true };
        let view = self.cluster.view();
        let Some(map) = &view.map else {
            // No partition is anyone's yet: this node's figures are all there is.
            return self.local.get_filter_health(Request::new(local_only)).await;
        };
        let answers = fan_out!(self, false, get_filter_health, local_only)?;
        let by_node: BTreeMap<String, adm::FilterHealth> = answers.into_iter().collect();
        let mut partitions = Vec::with_capacity(map.owners.len());
        for (partition, owner) in map.owners.iter().enumerate() {
            let mut health = by_node
                .get(owner)
                .and_then(|h| h.partitions.get(partition).cloned())
                .unwrap_or_default();
            health.partition = Some(partition as u32);
            health.node.clone_from(owner);
            partitions.push(health);
        }
        let any = by_node.values().next().cloned().unwrap_or_default();
        Ok(Response::new(adm::FilterHealth {
            total: Some(summed(&partitions)),
            partitions,
            ..any
        }))
    }

    async fn rebuild_filters(
        &self,
        request: Request<adm::RebuildFiltersRequest>,
    ) -> Result<Response<adm::RebuildFiltersResponse>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.rebuild_filters(request).await;
        }
        let params = adm::RebuildFiltersRequest {
            local: true,
            ..request.into_inner()
        };
        if let Some(partition) = params.partition {
            let answer = call_at!(
                self.target(self.cluster.owner_of(partition as usize)?)?,
                rebuild_filters,
                params
            )?;
            return Ok(Response::new(answer));
        }
        let answers = fan_out!(self, false, rebuild_filters, params)?;
        let mut merged = adm::RebuildFiltersResponse::default();
        for (_, answer) in answers {
            merged.started.extend(answer.started);
            merged.finished.extend(answer.finished);
        }
        Ok(Response::new(merged))
    }

    async fn add_seeds(
        &self,
        request: Request<adm::AddSeedsRequest>,
    ) -> Result<Response<adm::AddSeedsResponse>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.add_seeds(request).await;
        }
        let request = request.into_inner();
        let crawl = crawl_or_default(&request.crawl_id).to_owned();
        let mut hosts = self.cluster.frontier.ingest().seed_hosts_of(&request.urls);
        hosts.extend(request.scope_hosts.iter().cloned());
        hosts.sort();
        hosts.dedup();
        // The scope first, everywhere: a seed's links may reach any node.
        record_setting(
            &self.cluster,
            SettingChange::Seeds {
                crawl: &crawl,
                hosts: &hosts,
            },
        )
        .await?;
        let scope = adm::AddSeedsRequest {
            crawl_id: crawl.clone(),
            urls: Vec::new(),
            local: true,
            scope_hosts: hosts,
        };
        fan_out!(self, true, add_seeds, scope.clone())?;
        // Then each URL at its owner.
        let mut merged = self.seed_at_owners(&crawl, &request.urls).await?;
        let mut scope_hosts: BTreeSet<String> = std::mem::take(&mut merged.scope_hosts)
            .into_iter()
            .collect();
        scope_hosts.extend(scope.scope_hosts);
        merged.scope_hosts = scope_hosts.into_iter().collect();
        Ok(Response::new(merged))
    }

    async fn get_progress(
        &self,
        request: Request<adm::GetProgressRequest>,
    ) -> Result<Response<adm::Progress>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.get_progress(request).await;
        }
        let crawl = crawl_or_default(&request.get_ref().crawl_id).to_owned();
        let params = adm::GetProgressRequest {
            crawl_id: crawl.clone(),
            local: true,
        };
        let answers = fan_out!(self, false, get_progress, params)?;
        let mut sum = adm::Progress {
            crawl_id: crawl,
            ..adm::Progress::default()
        };
        for (node, mut progress) in answers {
            add_progress(&mut sum, &progress);
            progress.node = node;
            sum.nodes.push(progress);
        }
        Ok(Response::new(sum))
    }

    async fn check_url(
        &self,
        request: Request<adm::CheckUrlRequest>,
    ) -> Result<Response<adm::CheckUrlResponse>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.local.check_url(request).await;
        }
        let params = request.into_inner();
        let Some(partition) = self.cluster.partition_of_url(&params.crawl_id, &params.url) else {
            return self.local.check_url(Request::new(params)).await;
        };
        let answer = call_at!(
            self.target(self.cluster.owner_of(partition)?)?,
            check_url,
            params
        )?;
        Ok(Response::new(answer))
    }

    async fn get_cluster(
        &self,
        request: Request<adm::GetClusterRequest>,
    ) -> Result<Response<adm::ClusterStatus>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            // A peer asking for this node's own figures.
            return self.local.get_cluster(request).await;
        }
        let view = self.cluster.view();
        let owners = view
            .map
            .as_ref()
            .map(|m| m.owners.clone())
            .unwrap_or_default();
        let followers: Vec<(Vec<String>, Vec<String>)> = view
            .map
            .as_ref()
            .map(|m| {
                (0..m.owners.len() as u32)
                    .map(|p| (m.followers_of(p).to_vec(), m.lagging_of(p).to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        let rates = self
            .cluster
            .every_node()
            .into_iter()
            .map(|(id, owner)| async move {
                let answer = match owner.and_then(|owner| self.target(owner)) {
                    Ok(target) => call!(target, get_cluster, adm::GetClusterRequest {}),
                    Err(status) => Err(status),
                };
                (id, answer)
            });
        let mut nodes = Vec::new();
        for (id, answer) in futures::future::join_all(rates).await {
            let member = view.members.get(&id);
            let (last_minute, error) = match answer {
                Ok(status) => (
                    status.nodes.into_iter().next().and_then(|n| n.last_minute),
                    String::new(),
                ),
                Err(status) => (None, status.message().to_owned()),
            };
            nodes.push(adm::ClusterNode {
                alive: member.is_some(),
                address: member.map(|m| m.address.clone()).unwrap_or_default(),
                started_at_ms: member.map_or(0, |m| m.started_at_ms),
                partitions: owners
                    .iter()
                    .enumerate()
                    .filter(|(_, owner)| **owner == id)
                    .map(|(p, _)| p as u32)
                    .collect(),
                follows: followers
                    .iter()
                    .enumerate()
                    .filter(|(_, followers)| followers.0.contains(&id))
                    .map(|(p, _)| p as u32)
                    .collect(),
                id,
                last_minute,
                error,
            });
        }
        Ok(Response::new(adm::ClusterStatus {
            name: self.cluster.name().to_owned(),
            epoch: view.map.as_ref().map_or(0, |m| m.epoch),
            partitions: self.cluster.partitions() as u32,
            leader: view.leader.clone().unwrap_or_default(),
            nodes,
            owners,
            answered_by: self.cluster.node_id().to_owned(),
            moves: view
                .moves
                .values()
                .map(|(record, _)| adm::PartitionMove {
                    partition: record.partition,
                    from: record.from.clone(),
                    to: record.to.clone(),
                    phase: record.phase.as_str().to_owned(),
                    copied: record.copied,
                    leased: record.leased,
                    copied_bytes: record.copied_bytes,
                    started_at_ms: record.started_at_ms,
                    cutover_ms: record.cutover_ms,
                    old_copy_deleted: record.from_done,
                    kind: record.kind.as_str().to_owned(),
                    from_log: record.from_log,
                })
                .collect(),
            draining: view.draining.iter().cloned().collect(),
            replicas: self.cluster.replicas(),
            min_in_sync: self.cluster.min_in_sync(),
            followers: if followers
                .iter()
                .all(|(in_sync, lagging)| in_sync.is_empty() && lagging.is_empty())
            {
                Vec::new()
            } else {
                followers
                    .into_iter()
                    .map(|(in_sync, lagging)| adm::PartitionFollowers { in_sync, lagging })
                    .collect()
            },
        }))
    }

    async fn set_queue_delay(
        &self,
        request: Request<adm::SetQueueDelayRequest>,
    ) -> Result<Response<adm::SetQueueDelayResponse>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.set_queue_delay(request).await;
        }
        let params = adm::SetQueueDelayRequest {
            local: true,
            ..request.into_inner()
        };
        // A sealed partition takes no settings: wait out its cutover.
        self.cluster
            .past_cutovers([self
                .cluster
                .partition_of_host(&params.crawl_id, &params.key)])
            .await;
        let answer = call_at!(
            self.queue_owner(&params.crawl_id, &params.key)?,
            set_queue_delay,
            params
        )?;
        Ok(Response::new(answer))
    }

    async fn get_robots(
        &self,
        request: Request<adm::GetRobotsRequest>,
    ) -> Result<Response<adm::GetRobotsResponse>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.get_robots(request).await;
        }
        let params = adm::GetRobotsRequest {
            local: true,
            ..request.into_inner()
        };
        let place = params.place.clone().unwrap_or_default();
        let answer = call_at!(
            self.queue_owner(&place.crawl_id, &place.key)?,
            get_robots,
            params
        )?;
        Ok(Response::new(answer))
    }

    async fn put_robots(
        &self,
        request: Request<adm::PutRobotsRequest>,
    ) -> Result<Response<adm::PutRobotsResponse>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.put_robots(request).await;
        }
        let params = adm::PutRobotsRequest {
            local: true,
            ..request.into_inner()
        };
        let place = params.place.clone().unwrap_or_default();
        let answer = call_at!(
            self.queue_owner(&place.crawl_id, &place.key)?,
            put_robots,
            params
        )?;
        Ok(Response::new(answer))
    }

    /// A copy reads this node's store: never fanned out or forwarded. Only
    /// a node moving a partition here asks for it.
    async fn copy_partition(
        &self,
        request: Request<adm::CopyPartitionRequest>,
    ) -> Result<Response<adm::CopyPartitionPage>, Status> {
        self.cluster.check_from_node(&request)?;
        self.local.copy_partition(request).await
    }

    /// Only a node taking a partition over seals it.
    async fn seal_partition(
        &self,
        request: Request<adm::SealPartitionRequest>,
    ) -> Result<Response<adm::SealedPartition>, Status> {
        self.cluster.check_from_node(&request)?;
        super::moves::seal(&self.cluster, request.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn drain_node(
        &self,
        request: Request<adm::DrainNodeRequest>,
    ) -> Result<Response<adm::DrainNodeResponse>, Status> {
        let owned = super::moves::drain(&self.cluster, &request.into_inner().node_id).await?;
        Ok(Response::new(adm::DrainNodeResponse { owned }))
    }

    async fn remove_node(
        &self,
        request: Request<adm::RemoveNodeRequest>,
    ) -> Result<Response<adm::RemoveNodeResponse>, Status> {
        let node = request.into_inner().node_id;
        super::replication::remove_node(&self.cluster, &node)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn set_replicas(
        &self,
        request: Request<adm::SetReplicasRequest>,
    ) -> Result<Response<adm::SetReplicasResponse>, Status> {
        let replicas = request.into_inner().replicas;
        super::replication::set_replicas(&self.cluster, replicas)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn set_revisit(
        &self,
        request: Request<adm::SetRevisitRequest>,
    ) -> Result<Response<adm::RevisitPolicy>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.set_revisit(request).await;
        }
        let params = adm::SetRevisitRequest {
            local: true,
            ..request.into_inner()
        };
        let policy = crate::grpc::admin::revisit_policy_asked(&params)?;
        // Every node, now and after restarts.
        record_setting(
            &self.cluster,
            SettingChange::Revisit {
                crawl: crawl_or_default(&params.crawl_id),
                policy,
            },
        )
        .await?;
        let answers = fan_out!(self, true, set_revisit, params)?;
        let answer = answers.into_iter().next().map(|(_, policy)| policy);
        Ok(Response::new(answer.unwrap_or_default()))
    }

    /// Only a partition's leader sends its followers its writes.
    async fn replicate(
        &self,
        request: Request<adm::ReplicateRequest>,
    ) -> Result<Response<adm::ReplicateResponse>, Status> {
        self.cluster.check_from_node(&request)?;
        super::replication::take(&self.cluster, request.into_inner())
            .await
            .map(|()| Response::new(adm::ReplicateResponse {}))
            .map_err(Status::from)
    }

    /// Only another node asks for a group's turns.
    async fn group_turns(
        &self,
        request: Request<adm::GroupTurnsRequest>,
    ) -> Result<Response<adm::GroupTurnsResponse>, Status> {
        self.cluster.check_from_node(&request)?;
        Ok(Response::new(super::turns::keep(
            &self.cluster,
            &request.into_inner(),
        )))
    }
}
