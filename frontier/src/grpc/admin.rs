//! The admin API (`frontier.admin.v1.Admin`): filter health, rebuilds,
//! seeds, progress and URL checks, over the same frontier as the URL
//! Frontier service.

use std::sync::Arc;

use proto::admin as adm;
use tonic::{Request, Response, Status};

use super::{blocking, change_queue_settings, status_of};
use crate::ingest::{DedupMode, Outcome, UrlCheck};
use crate::robots_shelf::RobotsAnswer;
use crate::service::{FrontierError, PartitionFigures, SharedFrontier, crawl_or_default};

/// The admin API.
#[derive(Debug, Clone)]
pub struct AdminService {
    frontier: SharedFrontier,
    node: String,
}

impl AdminService {
    /// The service over a frontier (the token is checked in front of it,
    /// [`crate::auth::AuthLayer`]).
    /// `node` is the address the node is known by (GetCluster).
    #[must_use]
    pub fn new(frontier: SharedFrontier, node: String) -> Self {
        Self { frontier, node }
    }
}

fn ms_since_epoch(time: std::time::SystemTime) -> u64 {
    crate::time::Timestamp::from_system_time(time).unix_millis()
}

fn rebuild_report(report: &bloom_core::RebuildReport) -> adm::RebuildReport {
    adm::RebuildReport {
        partition: report.partition as u32,
        finished_at_ms: ms_since_epoch(report.finished_at),
        duration_ms: report.duration.as_millis() as u64,
        bits_before: report.bits_before,
        bits_after: report.bits_after,
        keys: report.keys_fed,
    }
}

/// Refuted "maybe"s over lookups of absent keys; 0 before any lookup.
pub(crate) fn observed_fp_rate(refuted: u64, lookups: u64) -> f64 {
    if lookups == 0 {
        0.0
    } else {
        refuted as f64 / lookups as f64
    }
}

pub(crate) fn state_of(rebuilding: bool) -> i32 {
    if rebuilding {
        adm::PartitionState::Rebuilding as i32
    } else {
        adm::PartitionState::Ok as i32
    }
}

/// One partition's health: its filter's figures and what the store showed.
fn partition_health(
    health: &bloom_core::partitioned::PartitionHealth,
    figures: &PartitionFigures,
) -> adm::PartitionHealth {
    let filter = &health.filter;
    let stored = figures.stored;
    let refuted = figures.observed.refuted_maybes;
    let lookups = figures.observed.absent_lookups;
    adm::PartitionHealth {
        partition: Some(health.partition as u32),
        layout: filter.layout.to_string(),
        bits: filter.bits,
        hashes: filter.hashes,
        items_inserted: stored,
        estimated_items: filter.estimated_items,
        ones: filter.ones,
        fill_ratio: filter.fill_ratio,
        estimated_fp_rate: filter.estimated_fp_rate,
        observed_fp_rate: observed_fp_rate(refuted, lookups),
        refuted_maybes: refuted,
        absent_lookups: lookups,
        memory_bytes: filter.memory_bytes,
        rebuild_count: health.rebuilds,
        last_rebuild: health.last_rebuild.as_ref().map(rebuild_report),
        state: state_of(health.rebuilding),
        rebuild_fed: health.rebuild_fed,
        rebuild_total: if health.rebuilding { stored } else { 0 },
        node: String::new(),
    }
}

/// The sum over partitions: the set's own totals, and the counts the
/// partitions' answers add up to.
fn total_health(
    set: &bloom_core::partitioned::TotalHealth,
    partitions: &[adm::PartitionHealth],
) -> adm::PartitionHealth {
    let items_inserted = partitions.iter().map(|p| p.items_inserted).sum();
    let refuted_maybes = partitions.iter().map(|p| p.refuted_maybes).sum();
    let absent_lookups = partitions.iter().map(|p| p.absent_lookups).sum();
    adm::PartitionHealth {
        layout: partitions
            .first()
            .map(|p| p.layout.clone())
            .unwrap_or_default(),
        hashes: partitions.first().map_or(0, |p| p.hashes),
        bits: set.bits,
        ones: set.ones,
        fill_ratio: set.fill_ratio,
        estimated_fp_rate: set.estimated_fp_rate,
        estimated_items: set.estimated_items,
        memory_bytes: set.memory_bytes,
        rebuild_count: set.rebuilds,
        items_inserted,
        refuted_maybes,
        absent_lookups,
        observed_fp_rate: observed_fp_rate(refuted_maybes, absent_lookups),
        state: state_of(set.rebuilding > 0),
        ..adm::PartitionHealth::default()
    }
}

pub(crate) fn rates_of(rates: &crate::service::Rates) -> adm::Rates {
    adm::Rates {
        discovered: rates.discovered,
        leased: rates.leased,
        completed: rates.completed,
    }
}

#[tonic::async_trait]
impl adm::admin_server::Admin for AdminService {
    async fn get_filter_health(
        &self,
        _: Request<adm::GetFilterHealthRequest>,
    ) -> Result<Response<adm::FilterHealth>, Status> {
        let report = blocking(&self.frontier, |f| Ok(f.filter_report())).await?;
        let partitions: Vec<adm::PartitionHealth> = report
            .set
            .partitions
            .iter()
            .zip(&report.partitions)
            .map(|(health, figures)| partition_health(health, figures))
            .collect();
        let total = total_health(&report.set.total, &partitions);
        Ok(Response::new(adm::FilterHealth {
            partitions,
            total: Some(total),
            rebuild_fill_threshold: report.rebuild_fill_threshold,
            target_fp_rate: report.target_fp_rate,
            dedup_mode: match report.dedup {
                DedupMode::Exact => adm::DedupMode::Exact as i32,
                DedupMode::Bloom => adm::DedupMode::Bloom as i32,
            },
        }))
    }

    async fn rebuild_filters(
        &self,
        request: Request<adm::RebuildFiltersRequest>,
    ) -> Result<Response<adm::RebuildFiltersResponse>, Status> {
        let request = request.into_inner();
        let count = self.frontier.ingest().filters().partition_count();
        let partition = request.partition.map(|p| p as usize);
        if partition.is_some_and(|p| p >= count) {
            return Err(status_of(FrontierError::InvalidArgument(format!(
                "partition {} does not exist (there are {count})",
                request.partition.unwrap_or_default()
            ))));
        }
        let started: Vec<u32> = match partition {
            Some(p) => vec![p as u32],
            None => (0..count as u32).collect(),
        };
        let work = {
            let frontier = Arc::clone(&self.frontier);
            tokio::task::spawn_blocking(move || frontier.rebuild(partition))
        };
        if request.no_wait {
            tokio::spawn(async move {
                match work.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::error!(%error, "asked-for rebuild failed"),
                    Err(error) => tracing::error!(%error, "asked-for rebuild panicked"),
                }
            });
            return Ok(Response::new(adm::RebuildFiltersResponse {
                started,
                finished: Vec::new(),
            }));
        }
        let reports = work
            .await
            .map_err(|error| Status::internal(error.to_string()))?
            .map_err(status_of)?;
        Ok(Response::new(adm::RebuildFiltersResponse {
            started,
            finished: reports.iter().map(rebuild_report).collect(),
        }))
    }

    async fn add_seeds(
        &self,
        request: Request<adm::AddSeedsRequest>,
    ) -> Result<Response<adm::AddSeedsResponse>, Status> {
        let request = request.into_inner();
        let crawl = crawl_or_default(&request.crawl_id).to_owned();
        let urls = request.urls;
        let extra_hosts = request.scope_hosts;
        let (outcomes, urls, scope_hosts) = {
            let crawl = crawl.clone();
            blocking(&self.frontier, move |f| {
                f.admit_crawl(&crawl)?;
                f.ingest().add_scope_hosts(&crawl, &extra_hosts)?;
                let outcomes = f.add_seeds(&crawl, &urls)?;
                let hosts = f
                    .ingest()
                    .seeds_of(&crawl)
                    .hosts()
                    .map(str::to_owned)
                    .collect::<Vec<_>>();
                Ok((outcomes, urls, hosts))
            })
            .await?
        };
        let mut response = adm::AddSeedsResponse {
            scope_hosts,
            ..adm::AddSeedsResponse::default()
        };
        response.scope_hosts.sort();
        for (url, outcome) in urls.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Stored => response.added += 1,
                Outcome::Skipped(crate::scope::SkipReason::Duplicate) => {
                    response.already_known += 1;
                }
                Outcome::Skipped(reason) => response.refused.push(adm::RefusedUrl {
                    url,
                    reason: reason.as_str().to_owned(),
                }),
            }
        }
        Ok(Response::new(response))
    }

    async fn get_progress(
        &self,
        request: Request<adm::GetProgressRequest>,
    ) -> Result<Response<adm::Progress>, Status> {
        let crawl = crawl_or_default(&request.into_inner().crawl_id).to_owned();
        let progress = {
            let crawl = crawl.clone();
            blocking(&self.frontier, move |f| f.progress(&crawl)).await?
        };
        let skipped = |reason: &str| progress.skipped.get(reason).copied().unwrap_or(0);
        Ok(Response::new(adm::Progress {
            crawl_id: crawl,
            discovered: progress.counts.urls,
            due_now: progress.due_now,
            scheduled_later: progress.scheduled_later,
            leased: progress.counts.leased,
            completed: progress.counts.completed,
            skipped: Some(adm::SkipCounts {
                duplicate: skipped("duplicate"),
                out_of_scope: skipped("out_of_scope"),
                too_deep: skipped("too_deep"),
                invalid: skipped("invalid"),
                too_long: skipped("too_long"),
                trap: skipped("trap"),
                metadata_too_large: skipped("metadata_too_large"),
            }),
            queues: progress.counts.queues,
            active_queues: progress.counts.active_queues,
            last_minute: Some(rates_of(&progress.rates)),
            node: String::new(),
            nodes: Vec::new(),
            due_next_hour: progress.due_next_hour,
            due_next_day: progress.due_next_day,
            next_due_at: progress.next_due_at,
            revisit: Some(revisit_policy_of(progress.revisit)),
        }))
    }

    async fn check_url(
        &self,
        request: Request<adm::CheckUrlRequest>,
    ) -> Result<Response<adm::CheckUrlResponse>, Status> {
        let request = request.into_inner();
        let (check, lease) = blocking(&self.frontier, move |f| {
            f.check_url(&request.crawl_id, &request.url)
        })
        .await?;
        let response = match check {
            UrlCheck::Refused(error) => adm::CheckUrlResponse {
                refused_reason: error.to_string(),
                ..adm::CheckUrlResponse::default()
            },
            UrlCheck::Checked {
                canonical,
                queue_key,
                partition,
                filter_maybe,
                stored,
            } => adm::CheckUrlResponse {
                refused_reason: String::new(),
                canonical_url: canonical,
                queue_key,
                partition: partition as u32,
                filter_answer: if filter_maybe {
                    adm::FilterAnswer::Maybe as i32
                } else {
                    adm::FilterAnswer::No as i32
                },
                stored: stored.map(|record| adm::StoredUrl {
                    created_at: record.created_at,
                    completed: record.is_completed(),
                    due_at: record.due_at,
                    leased_until: lease.map_or(0, |until| until.unix_secs_rounded_up()),
                    depth: record.depth,
                    metadata: record
                        .metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), adm::MetadataValues { values: v.clone() }))
                        .collect(),
                }),
            },
        };
        Ok(Response::new(response))
    }

    async fn get_cluster(
        &self,
        _: Request<adm::GetClusterRequest>,
    ) -> Result<Response<adm::ClusterStatus>, Status> {
        // Without a cluster the node is its own, owning every partition.
        let partitions = self.frontier.ingest().filters().partition_count() as u32;
        Ok(Response::new(adm::ClusterStatus {
            name: String::new(),
            epoch: 0,
            partitions,
            leader: String::new(),
            nodes: vec![adm::ClusterNode {
                id: self.node.clone(),
                address: self.node.clone(),
                alive: true,
                started_at_ms: 0,
                partitions: (0..partitions).collect(),
                follows: Vec::new(),
                last_minute: Some(rates_of(&self.frontier.total_rates())),
                error: String::new(),
            }],
            owners: Vec::new(),
            answered_by: self.node.clone(),
            moves: Vec::new(),
            draining: Vec::new(),
            replicas: 1,
            min_in_sync: 1,
            followers: Vec::new(),
        }))
    }

    async fn set_queue_delay(
        &self,
        request: Request<adm::SetQueueDelayRequest>,
    ) -> Result<Response<adm::SetQueueDelayResponse>, Status> {
        let request = request.into_inner();
        if request.key.is_empty() {
            return Err(Status::invalid_argument(
                "SetQueueDelay needs a queue key (a crawl's default delay is set by SetDelay)",
            ));
        }
        let delay = std::time::Duration::from_millis(u64::from(request.delay_ms));
        change_queue_settings(
            &self.frontier,
            &request.crawl_id,
            &request.key,
            move |s, c, q| s.set_queue_delay(c, q, delay),
        )
        .await?;
        Ok(Response::new(adm::SetQueueDelayResponse {}))
    }

    async fn get_robots(
        &self,
        request: Request<adm::GetRobotsRequest>,
    ) -> Result<Response<adm::GetRobotsResponse>, Status> {
        let place = request.into_inner().place.unwrap_or_default();
        let kept = self
            .frontier
            .robots()
            .get(crawl_or_default(&place.crawl_id), &place.origin);
        Ok(Response::new(adm::GetRobotsResponse {
            robots: kept.map(|answer| adm::RobotsAnswer {
                reached: answer.reached,
                status: u32::from(answer.status),
                body: answer.body,
                fetched_at_ms: answer.fetched_at_ms,
            }),
        }))
    }

    async fn put_robots(
        &self,
        request: Request<adm::PutRobotsRequest>,
    ) -> Result<Response<adm::PutRobotsResponse>, Status> {
        let request = request.into_inner();
        let place = request.place.unwrap_or_default();
        let Some(answer) = request.robots else {
            return Err(Status::invalid_argument("PutRobots needs an answer"));
        };
        let status = u16::try_from(answer.status)
            .map_err(|_| Status::invalid_argument(format!("HTTP status {}", answer.status)))?;
        self.frontier
            .robots()
            .put(
                crawl_or_default(&place.crawl_id),
                &place.origin,
                RobotsAnswer {
                    reached: answer.reached,
                    status,
                    body: answer.body,
                    fetched_at_ms: answer.fetched_at_ms,
                },
            )
            .map_err(|error| status_of(error.into()))?;
        Ok(Response::new(adm::PutRobotsResponse {}))
    }

    async fn copy_partition(
        &self,
        request: Request<adm::CopyPartitionRequest>,
    ) -> Result<Response<adm::CopyPartitionPage>, Status> {
        let request = request.into_inner();
        let partitions = self.frontier.ingest().filters().partition_count();
        if request.partition as usize >= partitions {
            return Err(Status::invalid_argument(format!(
                "partition {} is not one of this store's {partitions}",
                request.partition
            )));
        }
        if request.after.is_some() {
            // Tests of a move whose owner dies mid-copy hold the copy here.
            fail::fail_point!("copy-partition-later-page", |_| Err(crate::failpoint::hit(
                "copy-partition-later-page"
            )));
        }
        let limit = crate::partition_page::copy_page_limit(request.limit);
        let catch_up = request.catch_up;
        let (page, end, round) = blocking(&self.frontier, move |f| {
            if !request.lag_of.is_empty() {
                let ingest = f.ingest();
                let seeded = ingest.track_partition_seeded(request.partition, || {
                    ingest.replicas().lag(&request.lag_of, request.partition)
                });
                return Ok((Vec::new(), true, seeded));
            }
            if request.track {
                f.ingest().track_partition(request.partition);
            }
            if catch_up {
                let after = request.after.map(|key| (key.crawl_id, key.url));
                let round = match after {
                    None => f.ingest().begin_catch_up(request.partition),
                    Some(_) => Some(0),
                };
                if round.is_none() {
                    return Ok((Vec::new(), true, None));
                }
                return Ok(
                    match f
                        .ingest()
                        .catch_up_page(request.partition, after.as_ref(), limit)?
                    {
                        Some((page, end)) => (page, end, round),
                        None => (Vec::new(), true, None),
                    },
                );
            }
            let after = request
                .after
                .as_ref()
                .map(|key| (key.crawl_id.as_str(), key.url.as_str()));
            let (page, end) = f.ingest().partition_page(request.partition, after, limit)?;
            Ok((page, end, Some(0)))
        })
        .await?;
        let (urls, cut) = crate::partition_page::wire_page(page);
        let end = end && !cut;
        Ok(Response::new(adm::CopyPartitionPage {
            urls,
            end,
            tracked: round.is_some(),
            round_urls: round.unwrap_or(0) as u64,
        }))
    }

    async fn seal_partition(
        &self,
        _request: Request<adm::SealPartitionRequest>,
    ) -> Result<Response<adm::SealedPartition>, Status> {
        Err(not_in_a_cluster("SealPartition"))
    }

    async fn drain_node(
        &self,
        _request: Request<adm::DrainNodeRequest>,
    ) -> Result<Response<adm::DrainNodeResponse>, Status> {
        Err(not_in_a_cluster("DrainNode"))
    }

    async fn remove_node(
        &self,
        _request: Request<adm::RemoveNodeRequest>,
    ) -> Result<Response<adm::RemoveNodeResponse>, Status> {
        Err(not_in_a_cluster("RemoveNode"))
    }

    async fn set_replicas(
        &self,
        _request: Request<adm::SetReplicasRequest>,
    ) -> Result<Response<adm::SetReplicasResponse>, Status> {
        Err(not_in_a_cluster("SetReplicas"))
    }

    async fn replicate(
        &self,
        _request: Request<adm::ReplicateRequest>,
    ) -> Result<Response<adm::ReplicateResponse>, Status> {
        Err(not_in_a_cluster("Replicate"))
    }

    async fn group_turns(
        &self,
        _request: Request<adm::GroupTurnsRequest>,
    ) -> Result<Response<adm::GroupTurnsResponse>, Status> {
        Err(not_in_a_cluster("GroupTurns"))
    }

    async fn set_revisit(
        &self,
        request: Request<adm::SetRevisitRequest>,
    ) -> Result<Response<adm::RevisitPolicy>, Status> {
        let request = request.into_inner();
        let policy = revisit_policy_asked(&request)?;
        let crawl = crawl_or_default(&request.crawl_id).to_owned();
        let now = blocking(&self.frontier, move |f| {
            f.ingest().set_revisit_policy(&crawl, policy)?;
            Ok(f.ingest().revisit_policy(&crawl))
        })
        .await?;
        Ok(Response::new(revisit_policy_of(now)))
    }
}

/// The policy a SetRevisit request asks for (`None`: the default again),
/// or why it cannot be had.
pub(crate) fn revisit_policy_asked(
    request: &adm::SetRevisitRequest,
) -> Result<Option<crate::revisit::Policy>, Status> {
    if request.policy.is_empty() {
        return Ok(None);
    }
    crate::revisit::Policy::parse(&request.policy, request.min_secs, request.max_secs)
        .map(Some)
        .map_err(|error| Status::invalid_argument(error.to_string()))
}

/// A revisit policy as the admin API shows it, and whether it is the
/// crawl's own.
pub(crate) fn revisit_policy_of(
    (policy, own): (crate::revisit::Policy, bool),
) -> adm::RevisitPolicy {
    let (min_secs, max_secs) = policy.bounds();
    adm::RevisitPolicy {
        policy: policy.name().to_owned(),
        min_secs,
        max_secs,
        own,
    }
}

/// A cluster call made to a node on its own.
fn not_in_a_cluster(method: &str) -> Status {
    Status::failed_precondition(format!(
        "{method} is a cluster call and this frontier is not in a cluster (start it with --etcd)"
    ))
}
