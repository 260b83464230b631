//! Everything that talks to etcd: joining, the registration lease, the
//! leader's election and its one write (the partition map, by
//! compare-and-swap on the epoch), the watch that keeps the view current,
//! and crawl-wide settings.
//!
//! Keys, all under `/crawl-frontier/NAME/`: `facts` (fixed at creation),
//! `map`, `nodes/ID` (under the node's lease), `election` (etcd's
//! election), `settings/active`, `settings/delay/HEX(CRAWL)` and
//! `seeds/HEX(CRAWL)/HOST`. Values are JSON.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use serde::{Deserialize, Serialize};

use super::map::{ClusterFacts, CrawlSettings, Member, PartitionMap};
use super::{Cluster, ClusterError, ClusterOptions, View};
use crate::service::SharedFrontier;

/// Pause between two attempts at etcd after a failure.
const RETRY: Duration = Duration::from_secs(1);

pub(super) fn prefix(name: &str) -> String {
    format!("/crawl-frontier/{name}/")
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[derive(Serialize, Deserialize)]
struct DelaySetting {
    crawl: String,
    secs: u32,
}

#[derive(Serialize, Deserialize)]
struct SeedSetting {
    crawl: String,
    host: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn corrupt(key: &str, error: impl std::fmt::Display) -> ClusterError {
    ClusterError::Corrupt {
        key: key.to_owned(),
        reason: error.to_string(),
    }
}

/// Joins the cluster: reaches etcd (retrying until `join_timeout`),
/// creates the cluster's facts or checks this node against them, registers
/// under a lease, and starts the lease keeper, the watch, the settings
/// applier and the campaign for leadership.
pub async fn join(
    options: ClusterOptions,
    frontier: SharedFrontier,
) -> Result<Arc<Cluster>, ClusterError> {
    let started = Instant::now();
    let endpoints = options.etcd.join(",");
    let mut etcd = loop {
        let attempt = async {
            let connect = ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(5))
                .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
            let mut client = Client::connect(&options.etcd, Some(connect)).await?;
            client.status().await?;
            Ok::<_, etcd_client::Error>(client)
        };
        match attempt.await {
            Ok(client) => break client,
            Err(error) if started.elapsed() < options.join_timeout => {
                tracing::warn!(%error, endpoints, "cannot reach etcd yet; retrying");
                tokio::time::sleep(RETRY).await;
            }
            Err(error) => {
                return Err(ClusterError::Unreachable {
                    endpoints,
                    waited: started.elapsed(),
                    reason: error.to_string(),
                });
            }
        }
    };
    let refused = |reason: String| ClusterError::Refused {
        cluster: options.name.clone(),
        reason,
    };
    let unreachable = |error: etcd_client::Error| ClusterError::Unreachable {
        endpoints: options.etcd.join(","),
        waited: started.elapsed(),
        reason: error.to_string(),
    };
    let prefix = prefix(&options.name);
    let ours = ClusterFacts {
        partitions: frontier.ingest().filters().partition_count() as u32,
        rules: frontier.config().rules.describe(),
        max_url_length: frontier.config().max_url_length,
    };
    let facts = create_or_read_facts(&mut etcd, &prefix, &ours)
        .await
        .map_err(unreachable)?
        .map_err(|e| corrupt(&format!("{prefix}facts"), e))?;
    if let Some(reason) = facts.mismatch(&ours) {
        return Err(refused(reason));
    }
    let node_secret = create_or_read_node_secret(&mut etcd, &prefix)
        .await
        .map_err(unreachable)?
        .map_err(|reason| corrupt(&format!("{prefix}node-secret"), reason))?;
    let member = Member {
        id: options.node_id.clone(),
        address: options.advertise.clone(),
        started_at_ms: now_ms(),
    };
    let lease = register(&mut etcd, &prefix, &member, &options)
        .await
        .map_err(unreachable)?
        .map_err(refused)?;
    let (changes, _) = tokio::sync::watch::channel(0);
    // Nothing is served until a map gives this node partitions.
    frontier
        .scheduler()
        .set_served_partitions(Some(vec![false; facts.partitions as usize]));
    let cluster = Arc::new(Cluster {
        peers: super::peers::Peers::new(
            options.token.clone(),
            node_secret.clone(),
            options.tls.clone(),
            options.secure,
        ),
        node_secret,
        options,
        facts,
        frontier,
        view: ArcSwap::from_pointee(View::default()),
        changes,
        etcd,
        tasks: std::sync::Mutex::new(Vec::new()),
        moves: tokio::sync::Mutex::default(),
    });
    // The first view before any call is routed; the watch goes on from
    // its revision.
    let read_at = match refresh(&cluster).await {
        Ok(revision) => Some(revision),
        Err(error) => {
            tracing::warn!(%error, "cannot read the cluster's state yet; the watch retries");
            None
        }
    };
    super::moves::end_finished_drain(&cluster).await;
    let tasks = vec![
        tokio::spawn(keep_registered(Arc::clone(&cluster), lease, member)),
        tokio::spawn(watch(Arc::clone(&cluster), read_at)),
        tokio::spawn(apply_settings(Arc::clone(&cluster))),
        tokio::spawn(lead(Arc::clone(&cluster))),
        tokio::spawn(super::moves::run(Arc::clone(&cluster))),
    ];
    cluster
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend(tasks);
    Ok(cluster)
}

/// Puts `ours` at `key` unless the key holds a value already; answers
/// the value the key holds then, and whether it is ours.
async fn put_if_absent(
    etcd: &mut Client,
    key: String,
    ours: Vec<u8>,
) -> Result<(Vec<u8>, bool), etcd_client::Error> {
    let answer = etcd
        .txn(
            Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), ours.clone(), None)])
                .or_else([TxnOp::get(key, None)]),
        )
        .await?;
    if answer.succeeded() {
        return Ok((ours, true));
    }
    let stored = answer
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .unwrap_or_default();
    Ok((stored, false))
}

/// The cluster's facts: ours when the cluster is new (written only if
/// still absent), else what it was created with.
async fn create_or_read_facts(
    etcd: &mut Client,
    prefix: &str,
    ours: &ClusterFacts,
) -> Result<Result<ClusterFacts, serde_json::Error>, etcd_client::Error> {
    let value = match serde_json::to_vec(ours) {
        Ok(value) => value,
        Err(error) => return Ok(Err(error)),
    };
    let (stored, created) = put_if_absent(etcd, format!("{prefix}facts"), value).await?;
    if created {
        tracing::info!(partitions = ours.partitions, "created the cluster");
    }
    Ok(serde_json::from_slice(&stored))
}

/// The secret the cluster's nodes prove themselves to each other with:
/// made at random by the first node that finds none (also in a cluster
/// created before nodes had one), read by every other.
async fn create_or_read_node_secret(
    etcd: &mut Client,
    prefix: &str,
) -> Result<Result<String, String>, etcd_client::Error> {
    let mut bytes = [0_u8; 32];
    if let Err(error) = getrandom::fill(&mut bytes) {
        return Ok(Err(format!("no random bytes for a node secret: {error}")));
    }
    let ours: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let (stored, _) =
        put_if_absent(etcd, format!("{prefix}node-secret"), ours.into_bytes()).await?;
    Ok(match String::from_utf8(stored) {
        Ok(secret) if secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(secret)
        }
        _ => Err("not 64 hex digits".to_owned()),
    })
}

/// Registers the node under a new lease. A registration of the same ID
/// that is still alive is waited out for one lease life (it is this node's
/// previous run, killed before its lease ran out); one that outlives that
/// is another node with the same ID, and this one is refused.
async fn register(
    etcd: &mut Client,
    prefix: &str,
    member: &Member,
    options: &ClusterOptions,
) -> Result<Result<i64, String>, etcd_client::Error> {
    let key = format!("{prefix}nodes/{}", member.id);
    let value = serde_json::to_vec(member).unwrap_or_default();
    let ttl = options.lease_ttl.as_secs().max(2) as i64;
    let deadline = Instant::now() + options.lease_ttl + Duration::from_secs(2);
    loop {
        // A lease of its own each try: one granted before a wait would run
        // out during it.
        let lease = etcd.lease_grant(ttl, None).await?.id();
        let answer = etcd
            .txn(
                Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]),
            )
            .await?;
        if answer.succeeded() {
            tracing::info!(node = member.id, address = member.address, "registered");
            return Ok(Ok(lease));
        }
        let holder = answer.op_responses().into_iter().find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .and_then(|kv| serde_json::from_slice::<Member>(kv.value()).ok()),
            _ => None,
        });
        let holder = holder.map_or_else(|| "an unknown address".to_owned(), |m| m.address);
        let _ = etcd.lease_revoke(lease).await;
        if Instant::now() >= deadline {
            return Ok(Err(format!(
                "node ID {:?} is registered by a live node at {holder}: \
                 every node needs its own --node-id",
                member.id
            )));
        }
        tracing::info!(
            node = member.id,
            holder,
            "waiting for the previous registration of this node ID to expire"
        );
        tokio::time::sleep(RETRY).await;
    }
}

/// Keeps the lease alive; when it was lost (etcd away longer than its
/// life) registers again under a new one.
async fn keep_registered(cluster: Arc<Cluster>, mut lease: i64, member: Member) {
    let ttl = cluster.options.lease_ttl;
    let key = format!("{}nodes/{}", prefix(&cluster.options.name), member.id);
    loop {
        let mut etcd = cluster.etcd.clone();
        let kept = async {
            let (mut keeper, mut answers) = etcd.lease_keep_alive(lease).await?;
            loop {
                keeper.keep_alive().await?;
                match answers.message().await? {
                    Some(answer) if answer.ttl() > 0 => {}
                    _ => return Ok::<(), etcd_client::Error>(()),
                }
                tokio::time::sleep(ttl / 3).await;
            }
        };
        match kept.await {
            Ok(()) => tracing::warn!("the registration lease ran out; registering again"),
            Err(error) => tracing::warn!(%error, "cannot renew the registration lease"),
        }
        tokio::time::sleep(RETRY).await;
        // The old lease may still be alive (a renewal stream that broke);
        // only a lost one is replaced.
        if let Ok(answer) = etcd.lease_time_to_live(lease, None).await
            && answer.ttl() > 0
        {
            continue;
        }
        let renewed = async {
            let granted = etcd.lease_grant(ttl.as_secs().max(2) as i64, None).await?;
            let value = serde_json::to_vec(&member).unwrap_or_default();
            etcd.put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(granted.id())),
            )
            .await?;
            Ok::<i64, etcd_client::Error>(granted.id())
        };
        match renewed.await {
            Ok(new) => {
                lease = new;
                tracing::info!("registered again");
            }
            Err(error) => tracing::warn!(%error, "cannot register again yet"),
        }
    }
}

/// Gives up the registration at a clean stop.
pub(super) async fn deregister(cluster: &Cluster) {
    let key = format!(
        "{}nodes/{}",
        prefix(&cluster.options.name),
        cluster.options.node_id
    );
    let mut etcd = cluster.etcd.clone();
    if let Err(error) = etcd.delete(key, None).await {
        tracing::warn!(%error, "cannot remove the registration; it expires with its lease");
    }
}

/// Reads the whole cluster state and replaces the view with it.
async fn refresh(cluster: &Cluster) -> Result<i64, etcd_client::Error> {
    let prefix = prefix(&cluster.options.name);
    let mut etcd = cluster.etcd.clone();
    let answer = etcd
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = answer.header().map_or(0, |h| h.revision());
    let mut view = View {
        revision,
        ..View::default()
    };
    for kv in answer.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        let key = &key[prefix.len()..];
        let value = kv.value();
        let parsed = if key == "map" {
            serde_json::from_slice(value).map(|map: PartitionMap| view.map = Some(map))
        } else if let Some(partition) = key.strip_prefix("moves/") {
            serde_json::from_slice(value).map(|record: super::moves::MoveRecord| {
                if partition == record.partition.to_string() {
                    view.moves
                        .insert(record.partition, (record, kv.mod_revision()));
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
            tracing::warn!(key, %error, "unreadable cluster key left out");
        }
    }
    let mut election = cluster.etcd.election_client();
    if let Ok(mut leader) = election.leader(format!("{prefix}election")).await {
        view.leader = leader
            .take_kv()
            .and_then(|kv| kv.value_str().ok().map(str::to_owned));
    }
    let previous = cluster.view();
    let epoch = view.map.as_ref().map_or(0, |m| m.epoch);
    if epoch != previous.map.as_ref().map_or(0, |m| m.epoch) {
        tracing::info!(epoch, "partition map changed");
    }
    super::moves::settle(cluster, &view).await;
    cluster.view.store(Arc::new(view));
    cluster.changes.send_modify(|generation| *generation += 1);
    Ok(revision)
}

/// Keeps the view current: watches for changes from the revision last
/// read and reads everything again on each (and after a lost watch).
/// Without etcd the last view stays: nodes keep serving on the last map
/// they saw.
async fn watch(cluster: Arc<Cluster>, mut read_at: Option<i64>) {
    let prefix = prefix(&cluster.options.name);
    loop {
        let watched = async {
            // A view read at this revision already, or a fresh one.
            let revision = match read_at.take() {
                Some(revision) => revision,
                None => refresh(&cluster).await?,
            };
            let mut etcd = cluster.etcd.clone();
            let mut stream = etcd
                .watch(
                    prefix.clone(),
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(revision + 1),
                    ),
                )
                .await?;
            while let Some(answer) = stream.message().await? {
                if answer.canceled() {
                    break;
                }
                if !answer.events().is_empty() {
                    refresh(&cluster).await?;
                }
            }
            Ok::<(), etcd_client::Error>(())
        };
        if let Err(error) = watched.await {
            tracing::warn!(%error, "lost the watch on etcd; serving on the last map seen");
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Campaigns for leadership and, once leader, writes the first partition
/// map when enough nodes have registered. A lost election (etcd away, the
/// lease gone) starts over.
async fn lead(cluster: Arc<Cluster>) {
    let prefix = prefix(&cluster.options.name);
    loop {
        let led = async {
            let mut etcd = cluster.etcd.clone();
            let lease = etcd
                .lease_grant(cluster.options.lease_ttl.as_secs().max(2) as i64, None)
                .await?
                .id();
            let (mut keeper, mut answers) = etcd.lease_keep_alive(lease).await?;
            let mut election = etcd.election_client();
            // The campaign's lease is kept while waiting to win. A campaign
            // waits for as long as another node leads, so the client's
            // request timeout ends it now and then: it is made again under
            // the same lease, which keeps this node's place in the queue.
            let won = loop {
                let campaign = election.campaign(
                    format!("{prefix}election"),
                    cluster.options.node_id.clone(),
                    lease,
                );
                tokio::pin!(campaign);
                let outcome = loop {
                    tokio::select! {
                        won = &mut campaign => break won,
                        () = tokio::time::sleep(cluster.options.lease_ttl / 3) => {
                            keeper.keep_alive().await?;
                            answers.message().await?;
                        }
                    }
                };
                match outcome {
                    Ok(won) => break won,
                    Err(etcd_client::Error::GRpcStatus(status))
                        if status.code() == tonic::Code::Cancelled => {}
                    Err(error) => return Err(error),
                }
            };
            tracing::info!(node = cluster.options.node_id, "elected leader");
            let _ = won;
            let mut changes = cluster.changes.subscribe();
            // An interval, not a sleep per turn: views that change faster
            // than a third of the lease (moves do) must not starve the
            // keep-alive.
            let mut keep_alive = tokio::time::interval(cluster.options.lease_ttl / 3);
            loop {
                write_first_map(&cluster, &mut etcd).await?;
                super::moves::plan(&cluster, &mut etcd).await?;
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return Ok(());
                        }
                    }
                    _ = keep_alive.tick() => {
                        keeper.keep_alive().await?;
                        match answers.message().await? {
                            Some(answer) if answer.ttl() > 0 => {}
                            _ => return Ok::<(), etcd_client::Error>(()),
                        }
                    }
                }
            }
        };
        if let Err(error) = led.await {
            tracing::warn!(%error, "out of the leader election; campaigning again");
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// The leader's one write here: the first map, once the initial nodes
/// have registered, by compare-and-swap so that it is written once.
async fn write_first_map(cluster: &Cluster, etcd: &mut Client) -> Result<(), etcd_client::Error> {
    let view = cluster.view();
    if view.map.is_some() || view.members.len() < cluster.options.initial_nodes {
        return Ok(());
    }
    let nodes: BTreeSet<String> = view.members.keys().cloned().collect();
    let Some(map) = PartitionMap::first(cluster.facts.partitions, &nodes) else {
        return Ok(());
    };
    let key = format!("{}map", prefix(&cluster.options.name));
    let written = etcd
        .txn(
            Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    serde_json::to_vec(&map).unwrap_or_default(),
                    None,
                )]),
        )
        .await?;
    if written.succeeded() {
        tracing::info!(epoch = map.epoch, nodes = ?nodes, "wrote the first partition map");
    }
    Ok(())
}

/// Records a crawl-wide setting in etcd (every node applies it from there,
/// now or when it next starts).
pub(super) async fn record_setting(
    cluster: &Cluster,
    change: SettingChange<'_>,
) -> Result<(), tonic::Status> {
    let prefix = prefix(&cluster.options.name);
    let mut etcd = cluster.etcd.clone();
    let unavailable = |error: etcd_client::Error| {
        tonic::Status::unavailable(format!(
            "cannot record a cluster-wide setting in etcd ({error}); \
             nothing changed; retry when etcd is back"
        ))
    };
    match change {
        SettingChange::Active(active) => {
            etcd.put(
                format!("{prefix}settings/active"),
                serde_json::to_vec(&active).unwrap_or_default(),
                None,
            )
            .await
            .map_err(unavailable)?;
        }
        SettingChange::Delay { crawl, secs } => {
            let value = DelaySetting {
                crawl: crawl.to_owned(),
                secs,
            };
            etcd.put(
                format!("{prefix}settings/delay/{}", hex(crawl)),
                serde_json::to_vec(&value).unwrap_or_default(),
                None,
            )
            .await
            .map_err(unavailable)?;
        }
        SettingChange::Seeds { crawl, hosts } => {
            let ops: Vec<TxnOp> = hosts
                .iter()
                .map(|host| {
                    let value = SeedSetting {
                        crawl: crawl.to_owned(),
                        host: host.clone(),
                    };
                    TxnOp::put(
                        format!("{prefix}seeds/{}/{host}", hex(crawl)),
                        serde_json::to_vec(&value).unwrap_or_default(),
                        None,
                    )
                })
                .collect();
            // etcd bounds the operations of one transaction (128 by default).
            for chunk in ops.chunks(100) {
                etcd.txn(Txn::new().and_then(chunk.to_vec()))
                    .await
                    .map_err(unavailable)?;
            }
        }
        SettingChange::ForgetCrawl { crawl } => {
            for key in [
                format!("{prefix}seeds/{}/", hex(crawl)),
                format!("{prefix}settings/delay/{}", hex(crawl)),
            ] {
                etcd.delete(key, Some(etcd_client::DeleteOptions::new().with_prefix()))
                    .await
                    .map_err(unavailable)?;
            }
        }
    }
    Ok(())
}

/// A crawl-wide change.
pub(super) enum SettingChange<'a> {
    Active(bool),
    Delay { crawl: &'a str, secs: u32 },
    Seeds { crawl: &'a str, hosts: &'a [String] },
    ForgetCrawl { crawl: &'a str },
}

/// Applies crawl-wide settings from the view to this node's frontier as
/// they change (a node that was away catches up here on start).
async fn apply_settings(cluster: Arc<Cluster>) {
    let mut applied = CrawlSettings::default();
    let mut changes = cluster.changes.subscribe();
    loop {
        let wanted = cluster.view().settings.clone();
        if wanted != applied {
            let frontier = Arc::clone(&cluster.frontier);
            let target = wanted.clone();
            let done = applied.clone();
            let outcome = tokio::task::spawn_blocking(move || apply(&frontier, &done, &target))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            match outcome {
                Ok(()) => applied = wanted,
                Err(error) => tracing::warn!(%error, "cannot apply crawl-wide settings yet"),
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

fn apply(
    frontier: &SharedFrontier,
    done: &CrawlSettings,
    target: &CrawlSettings,
) -> Result<(), crate::service::FrontierError> {
    if let Some(active) = target.active
        && done.active != Some(active)
        && frontier.scheduler().is_active() != active
    {
        frontier.scheduler().set_active(active)?;
    }
    for (crawl, secs) in &target.delays {
        if done.delays.get(crawl) != Some(secs) {
            frontier.scheduler().set_delay(crawl, "", *secs)?;
        }
    }
    for (crawl, hosts) in &target.seeds {
        let known = done.seeds.get(crawl);
        let new: Vec<String> = hosts
            .iter()
            .filter(|host| known.is_none_or(|known| !known.contains(*host)))
            .cloned()
            .collect();
        frontier.ingest().add_scope_hosts(crawl, &new)?;
    }
    Ok(())
}
