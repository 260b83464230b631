//! Copies of each partition on several nodes, after PacificA (Lin et al.,
//! Microsoft Research, 2008): the configuration (which node leads a
//! partition, which follow it in sync) lives in the coordination store
//! and changes only by compare-and-swap, each change a new epoch; the
//! leader sends every committed write to each in-sync follower and
//! acknowledges it once all of them hold it.
//!
//! - The leader's side: one sender task per follower, taking what the
//!   follower is owed from the store's [`ReplicaLog`] and calling
//!   Replicate with it, in order. A follower that fails to take a batch for
//!   longer than the patience is taken out of the in-sync set of every
//!   partition this node leads (one compare-and-swap, the next epoch)
//!   before any write is acknowledged without it.
//! - The follower's side ([`take`]): a batch is taken only from the node
//!   this node's map, at the sender's epoch, makes the partition's leader,
//!   and only for partitions it makes this node follow. So a leader cut
//!   off from etcd and replaced cannot have a write acknowledged: its
//!   followers hold a newer epoch and refuse it.
//! - A takeover ([`settle`]): a follower that becomes a partition's leader
//!   serves none of its URLs before the old leader's leases could have
//!   ended (the horizon each batch carries), and first sends its followers
//!   again what it took lately, which they may have missed when the old
//!   leader died mid-batch.
//! - Writers wait (`ReplicaLog::wait_for_followers`) for every follower to
//!   confirm the group their write committed in.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use proto::admin as adm;
use tokio::task::JoinHandle;

use super::map::PartitionMap;
use super::peers::forwarded;
use super::{Cluster, ClusterError, View};
use crate::ingest::{PartitionUrl, ReplicaBatch, ReplicaStep};

/// URLs in one Replicate call at most; a larger batch goes in several, in
/// order.
const URLS_PER_CALL: usize = 4096;

/// How long a taken batch is remembered by its follower for a takeover:
/// well past the patience, after which a follower that missed it would
/// have left the in-sync set.
const RECENT_FOR: Duration = Duration::from_secs(120);

/// Keys remembered for a takeover at most.
const RECENT_KEYS: usize = 1 << 20;

/// A node's replication state.
#[derive(Debug, Default)]
pub(super) struct Replication {
    senders: Mutex<HashMap<String, JoinHandle<()>>>,
    /// The node left: no sender starts again. A settle that was under way
    /// as the node left (it runs outside the tasks a leave stops) would
    /// otherwise start one, which then held the frontier past the
    /// shutdown while it retried a follower that had gone.
    stopped: std::sync::atomic::AtomicBool,
    /// Per leader, the latest lease horizon it sent (UTC ms).
    horizons: Mutex<HashMap<String, u64>>,
    /// Keys taken lately, for a takeover.
    recent: Mutex<VecDeque<(Instant, u32, String, String)>>,
    /// Partitions taken over and not served before (UTC ms).
    holds: Mutex<BTreeMap<u32, u64>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Replication {
    /// Partitions taken over whose old leader's leases may still run.
    pub(super) fn held(&self, now_ms: u64) -> Vec<u32> {
        let mut holds = lock(&self.holds);
        holds.retain(|_, until| *until > now_ms);
        holds.keys().copied().collect()
    }
}

impl Cluster {
    /// How long a follower may fail to take a batch before it is taken out
    /// of the in-sync set: half a registration's life, so that a dead
    /// follower leaves it about when its registration lapses.
    pub(super) fn patience(&self) -> Duration {
        (self.options.lease_ttl / 2).max(Duration::from_secs(1))
    }

    /// How long a writer waits for its followers: twice the patience, and
    /// the compare-and-swap that takes a follower out after it.
    pub(super) fn writer_patience(&self) -> Duration {
        self.patience() * 2 + Duration::from_secs(5)
    }

    /// Whether writes to `partition` may be taken: it has enough copies in
    /// sync.
    pub(super) fn check_copies(&self, partition: usize) -> Result<(), ClusterError> {
        let view = self.view();
        let Some(map) = &view.map else {
            return Ok(());
        };
        let in_sync = 1 + map.followers_of(partition as u32).len();
        let min_in_sync = self.min_in_sync();
        if in_sync < min_in_sync as usize {
            return Err(ClusterError::TooFewCopies {
                partition,
                in_sync,
                min_in_sync,
            });
        }
        Ok(())
    }
}

/// Brings replication in step with a new view, before it is used: the
/// followers each led partition is sent to, a sender per follower, and
/// for partitions taken over from a leader that is gone, their hold and
/// the keys its followers are owed again.
pub(super) fn settle(cluster: &Arc<Cluster>, previous: &View, view: &View) {
    let me = cluster.options.node_id.as_str();
    let Some(map) = &view.map else {
        return;
    };
    // Per partition, of those led here only.
    let led_only = |of: fn(&PartitionMap, u32) -> &[String]| -> Vec<Vec<String>> {
        (0..map.owners.len() as u32)
            .map(|p| {
                if map.owners[p as usize] == me {
                    of(map, p).to_vec()
                } else {
                    Vec::new()
                }
            })
            .collect()
    };
    let followers_of = led_only(PartitionMap::followers_of);
    let lagging_of = led_only(PartitionMap::lagging_of);
    let led: Vec<bool> = map.owners.iter().map(|owner| owner == me).collect();
    // The copies followed here are counted by their leaders.
    cluster
        .frontier
        .scheduler()
        .set_counted_partitions(Some(led.clone()));
    let log = cluster.frontier.ingest().replicas();
    let min_in_sync = view
        .facts
        .as_ref()
        .map_or(cluster.facts.min_in_sync, |(facts, _)| facts.min_in_sync);
    log.set_followers(followers_of, lagging_of, led, min_in_sync as usize);
    let taken_over: Vec<(u32, String)> = previous
        .map
        .as_ref()
        .map(|before| {
            map.owned_by(me)
                .filter(|&p| before.follows(me, p))
                .map(|p| (p, before.owners[p as usize].clone()))
                .collect()
        })
        .unwrap_or_default();
    if !taken_over.is_empty() {
        let mut owed: BTreeMap<u32, BTreeSet<(String, String)>> = BTreeMap::new();
        for (_, partition, crawl, url) in lock(&cluster.replication.recent).iter() {
            if taken_over.iter().any(|(p, _)| p == partition) {
                owed.entry(*partition)
                    .or_default()
                    .insert((crawl.clone(), url.clone()));
            }
        }
        let horizons = lock(&cluster.replication.horizons).clone();
        let mut holds = lock(&cluster.replication.holds);
        for (partition, old_leader) in taken_over {
            let until = horizons.get(&old_leader).copied().unwrap_or(0);
            let keys = owed.remove(&partition).unwrap_or_default();
            tracing::warn!(
                partition,
                old_leader,
                hold_until_ms = until,
                sent_again = keys.len(),
                "took the partition over as its leader"
            );
            holds.insert(partition, until);
            log.owe_again(partition, keys);
        }
    }
    let wanted: BTreeSet<String> = log.followers().into_iter().collect();
    let mut senders = lock(&cluster.replication.senders);
    if cluster.replication.stopped.load(Ordering::Acquire) {
        return;
    }
    senders.retain(|follower, task| {
        let keep = wanted.contains(follower) && !task.is_finished();
        if !keep {
            task.abort();
        }
        keep
    });
    for follower in wanted {
        senders
            .entry(follower.clone())
            .or_insert_with(|| tokio::spawn(send(Arc::clone(cluster), follower)));
    }
}

/// Stops every sender (the node leaves).
pub(super) fn stop(cluster: &Cluster) {
    // Set before the senders are taken: a settle checks it under their
    // lock.
    (cluster.replication.stopped).store(true, Ordering::Release);
    for (_, task) in lock(&cluster.replication.senders).drain() {
        task.abort();
    }
}

/// One follower's sender: takes what it is owed and sends it, in order,
/// at once when owed something and at least every second (the lease
/// horizon travels with every batch). It runs until `settle` stops it:
/// a follower left and added again finds it still there.
async fn send(cluster: Arc<Cluster>, follower: String) {
    let log = cluster.frontier.ingest().replicas();
    let mut failing_since: Option<Instant> = None;
    loop {
        // Asked each turn: a follower added again has a new one.
        let Some(wake) = log.waker(&follower) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(batch) = log.take(&follower) else {
            continue;
        };
        match send_batch(&cluster, &follower, &batch).await {
            Ok(()) => {
                log.confirmed(&follower, batch.through);
                failing_since = None;
            }
            Err(error) => {
                log.failed(&follower, batch);
                let since = *failing_since.get_or_insert_with(Instant::now);
                let away = !cluster.view().members.contains_key(&follower);
                if away || since.elapsed() >= cluster.patience() {
                    tracing::warn!(follower, %error, away, "a follower stopped taking writes; taking it out of the in-sync set");
                    if let Err(error) = drop_follower(&cluster, &follower).await {
                        tracing::warn!(follower, %error, "cannot take the follower out yet");
                    }
                } else {
                    tracing::debug!(follower, %error, "a batch to a follower failed; again");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
    }
}

/// Sends one batch: URLs read as the store holds them now, in calls of at
/// most [`URLS_PER_CALL`], in order.
async fn send_batch(
    cluster: &Cluster,
    follower: &str,
    batch: &ReplicaBatch,
) -> Result<(), ClusterError> {
    let view = cluster.view();
    let member = view
        .members
        .get(follower)
        .ok_or_else(|| ClusterError::NodeAway {
            node: follower.to_owned(),
            partition: None,
        })?;
    let mut admin = cluster.peers.get(&member.endpoint())?.admin();
    let epoch = cluster.epoch();
    let frontier = Arc::clone(&cluster.frontier);
    let steps = std::sync::Arc::clone(&batch.steps);
    let (steps, leases_until_ms) = tokio::task::spawn_blocking(move || {
        let ingest = frontier.ingest();
        let mut wire = Vec::new();
        for step in steps.iter() {
            match step {
                ReplicaStep::Touched(partitions) => {
                    for (&partition, keys) in partitions {
                        let urls = ingest
                            .partition_urls(partition, keys)
                            .map_err(|e| ClusterError::Local(e.to_string()))?;
                        for chunk in urls.chunks(URLS_PER_CALL) {
                            wire.push(adm::ReplicatedStep {
                                step: Some(adm::replicated_step::Step::Urls(adm::ReplicatedUrls {
                                    partition,
                                    urls: wire_urls(chunk),
                                })),
                            });
                        }
                    }
                }
                // The batch carries the horizon, read below.
                ReplicaStep::Horizon => {}
                ReplicaStep::QueueSettings { crawl, queue, .. } => {
                    let record = frontier
                        .scheduler()
                        .queue_record(crawl, queue)
                        .unwrap_or_default();
                    wire.push(adm::ReplicatedStep {
                        step: Some(adm::replicated_step::Step::QueueSettings(
                            super::moves::copy::moved_queue(crawl, queue, &record),
                        )),
                    });
                }
                ReplicaStep::Deleted(deletion) => wire.push(adm::ReplicatedStep {
                    step: Some(adm::replicated_step::Step::Deletion(
                        adm::ReplicatedDeletion {
                            crawl_id: deletion.crawl.clone(),
                            queue: deletion.queue.clone(),
                            created_before: deletion.created_before,
                            partition: deletion.partition,
                            urls_below: deletion.urls_below.clone(),
                        },
                    )),
                }),
            }
        }
        let horizon = ingest
            .store()
            .leases_until()
            .map_err(|e| ClusterError::Local(e.to_string()))?;
        Ok::<_, ClusterError>((wire, horizon))
    })
    .await??;
    let mut calls: Vec<Vec<adm::ReplicatedStep>> = vec![Vec::new()];
    let mut urls_in_call = 0;
    for step in steps {
        let urls = match &step.step {
            Some(adm::replicated_step::Step::Urls(urls)) => urls.urls.len(),
            _ => 0,
        };
        if urls_in_call + urls > URLS_PER_CALL && urls_in_call > 0 {
            calls.push(Vec::new());
            urls_in_call = 0;
        }
        urls_in_call += urls;
        if let Some(call) = calls.last_mut() {
            call.push(step);
        }
    }
    for steps in calls {
        let request = adm::ReplicateRequest {
            leader: cluster.options.node_id.clone(),
            epoch,
            steps,
            leases_until_ms,
        };
        tokio::time::timeout(
            cluster.patience(),
            admin.replicate(forwarded(request, epoch)),
        )
        .await
        .map_err(|_| {
            ClusterError::NotReplicated(format!(
                "follower {follower} did not answer in {:?}",
                cluster.patience()
            ))
        })?
        .map_err(ClusterError::Peer)?;
    }
    Ok(())
}

fn wire_urls(urls: &[PartitionUrl]) -> Vec<adm::PartitionUrl> {
    urls.iter()
        .map(|moved| adm::PartitionUrl {
            crawl_id: moved.crawl.clone(),
            url: moved.url.clone(),
            record: moved.record.encode(),
        })
        .collect()
}

/// Takes `follower` out of the in-sync set of every partition this node
/// leads, in etcd.
async fn drop_follower(cluster: &Cluster, follower: &str) -> Result<(), ClusterError> {
    let view = cluster.view();
    let Some(map) = &view.map else {
        return Ok(());
    };
    let me = cluster.options.node_id.as_str();
    let led: BTreeSet<u32> = map
        .owned_by(me)
        .filter(|&p| map.follows(follower, p))
        .collect();
    let lagging = BTreeSet::from([follower.to_owned()]);
    let Some((next, txn)) = super::protocol::drop_followers(
        (map, view.map_revision),
        &cluster.keys,
        me,
        &led,
        &lagging,
    )
    .map_err(|e| ClusterError::Local(e.to_string()))?
    else {
        return Ok(());
    };
    if cluster.etcd.txn(txn).await?.succeeded {
        tracing::warn!(follower, epoch = next.epoch, partitions = ?led, "follower taken out of the in-sync set");
        Ok(())
    } else {
        Err(ClusterError::Raced {
            key: cluster.keys.map(),
        })
    }
}

/// A follower takes a leader's batch (the Replicate call): checked against
/// its map, applied in order, durable before it answers.
pub(super) async fn take(
    cluster: &Cluster,
    request: adm::ReplicateRequest,
) -> Result<(), ClusterError> {
    cluster
        .check_epoch(request.epoch)
        .map_err(ClusterError::Peer)?;
    let view = cluster.view();
    let me = cluster.options.node_id.clone();
    let epoch = request.epoch;
    let leader = request.leader.clone();
    let mut partitions = BTreeSet::new();
    for step in &request.steps {
        let partition = match &step.step {
            Some(adm::replicated_step::Step::Urls(urls)) => urls.partition,
            Some(adm::replicated_step::Step::QueueSettings(queue)) => {
                cluster.partition_of_host(&queue.crawl_id, &queue.key) as u32
            }
            _ => continue,
        };
        let follows = view.map.as_ref().is_some_and(|map| {
            map.owners.get(partition as usize) == Some(&leader) && map.follows(&me, partition)
        });
        if !follows {
            return Err(ClusterError::NotAFollower {
                node: me,
                partition,
                leader,
                epoch,
            });
        }
        partitions.insert(partition);
    }
    let frontier = Arc::clone(&cluster.frontier);
    let taken = tokio::task::spawn_blocking(move || {
        let ingest = frontier.ingest();
        // Before the batch: a copy marked as following this leader holds
        // what it sent (it can be brought up to date from its notes).
        for &partition in &partitions {
            ingest
                .note_followed(partition, &leader)
                .map_err(|e| ClusterError::Local(e.to_string()))?;
        }
        let mut taken = Vec::new();
        // URLs up to a deletion or queue settings are taken in one commit.
        let mut pages = Vec::new();
        let take = |pages: &mut Vec<(u32, Vec<PartitionUrl>)>| {
            if pages.is_empty() {
                return Ok(());
            }
            ingest
                .take_pages(std::mem::take(pages))
                .map(drop)
                .map_err(|e| ClusterError::Local(e.to_string()))
        };
        for step in request.steps {
            match step.step {
                Some(adm::replicated_step::Step::Urls(urls)) => {
                    let partition = urls.partition;
                    let page = super::moves::copy::decode_page(urls.urls)?;
                    taken.extend(
                        page.iter()
                            .map(|u| (partition, u.crawl.clone(), u.url.clone())),
                    );
                    pages.push((partition, page));
                }
                Some(adm::replicated_step::Step::QueueSettings(queue)) => {
                    take(&mut pages)?;
                    let settings = super::moves::copy::settings_of(&queue);
                    frontier
                        .scheduler()
                        .set_queue_settings(&queue.crawl_id, &queue.key, settings)
                        .map_err(|e| ClusterError::Local(e.to_string()))?;
                }
                Some(adm::replicated_step::Step::Deletion(deletion)) => {
                    take(&mut pages)?;
                    ingest
                        .delete(
                            &deletion.crawl_id,
                            deletion.queue.as_deref(),
                            deletion.created_before,
                        )
                        .map_err(|e| ClusterError::Local(e.to_string()))?;
                }
                None => {}
            }
        }
        take(&mut pages)?;
        Ok::<_, ClusterError>(taken)
    })
    .await??;
    let now = Instant::now();
    {
        let mut recent = lock(&cluster.replication.recent);
        recent.extend(
            taken
                .into_iter()
                .map(|(p, crawl, url)| (now, p, crawl, url)),
        );
        while recent.len() > RECENT_KEYS
            || recent
                .front()
                .is_some_and(|(at, ..)| now.duration_since(*at) > RECENT_FOR)
        {
            recent.pop_front();
        }
    }
    hold_horizon(cluster, &request.leader, request.leases_until_ms).await
}

/// Notes that `leader`'s leases may run until `until_ms` (UTC ms): this
/// node, taking its partitions over, serves none of their URLs before;
/// kept durably when raised, so also after a restart.
pub(super) async fn hold_horizon(
    cluster: &Cluster,
    leader: &str,
    until_ms: u64,
) -> Result<(), ClusterError> {
    let raised = {
        let mut horizons = lock(&cluster.replication.horizons);
        let horizon = horizons.entry(leader.to_owned()).or_insert(0);
        let raised = until_ms > *horizon;
        *horizon = (*horizon).max(until_ms);
        raised
    };
    if raised {
        let frontier = Arc::clone(&cluster.frontier);
        tokio::task::spawn_blocking(move || {
            let store = frontier.ingest().store();
            match store.leases_until() {
                Ok(ours) if ours >= until_ms => Ok(()),
                _ => store.set_leases_until(until_ms),
            }
        })
        .await?
        .map_err(|e| ClusterError::Local(e.to_string()))?;
    }
    Ok(())
}

/// `frontier cluster remove`: [`super::protocol::remove_node`], written. A
/// node the map names nowhere (taken out already when its followers' and
/// leaders' senders gave up on it) answers zero partitions.
pub(super) async fn remove_node(
    cluster: &Cluster,
    node: &str,
) -> Result<adm::RemoveNodeResponse, ClusterError> {
    let view = cluster.view();
    // Partitions short of a copy since before now are copied again at
    // once, without waiting for a node that will not come back.
    let now = crate::time::Timestamp::now().unix_millis();
    cluster
        .etcd
        .txn(super::coordination::Txn::writes(vec![
            super::coordination::Write::put(
                cluster.keys.replace_now(),
                super::protocol::json(&now),
            ),
        ]))
        .await?;
    let removed = super::protocol::remove_node(&view, &cluster.keys, node).map_err(|refused| {
        ClusterError::Refused {
            cluster: cluster.options.name.clone(),
            reason: refused.to_string(),
        }
    })?;
    let Some((next, txn)) = removed else {
        return Ok(adm::RemoveNodeResponse::default());
    };
    let map = view.map.as_ref().expect("a map names the node");
    let answer = adm::RemoveNodeResponse {
        led: map.owned_by(node).count() as u32,
        followed: map.followed_by(node).count() as u32,
    };
    if !cluster.etcd.txn(txn).await?.succeeded {
        return Err(ClusterError::Raced {
            key: cluster.keys.map(),
        });
    }
    tracing::warn!(
        node,
        epoch = next.epoch,
        led = answer.led,
        followed = answer.followed,
        "node removed from the cluster"
    );
    Ok(answer)
}

/// `frontier cluster replicas N`: the cluster's copy count, in etcd.
pub(super) async fn set_replicas(
    cluster: &Cluster,
    replicas: u32,
) -> Result<adm::SetReplicasResponse, ClusterError> {
    if !(1..=7).contains(&replicas) {
        return Err(ClusterError::Refused {
            cluster: cluster.options.name.clone(),
            reason: format!("{replicas} copies: a cluster keeps 1 to 7"),
        });
    }
    let view = cluster.view();
    let (facts, revision) = view
        .facts
        .clone()
        .ok_or_else(|| ClusterError::NotRecorded {
            what: "the copy count",
            reason: "this node has not read the cluster's facts yet".into(),
        })?;
    let (next, txn) = super::protocol::set_replicas(&cluster.keys, (&facts, revision), replicas);
    if !cluster.etcd.txn(txn).await?.succeeded {
        return Err(ClusterError::Raced {
            key: cluster.keys.facts(),
        });
    }
    tracing::info!(
        replicas,
        min_in_sync = next.min_in_sync,
        "copies per partition changed"
    );
    Ok(adm::SetReplicasResponse {
        min_in_sync: next.min_in_sync,
        live_nodes: view.members.len() as u32,
    })
}
