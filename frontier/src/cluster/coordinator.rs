//! A node's life in its cluster: joining, the registration lease, the
//! leader's election and its writes (the first map, the moves it plans),
//! the watch that keeps the view current, and crawl-wide settings. The
//! decisions are `protocol`'s; this file does their I/O.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures::{FutureExt, StreamExt};

use super::coordination::{
    Condition, Coordination, CoordinationError, EtcdCoordination, LeaseId, Txn, Write,
};
use super::map::{ClusterFacts, CrawlSettings, Member};
use super::protocol::{self, DelaySetting, Keys, RevisitSetting, SeedSetting, json};
use super::{Cluster, ClusterError, ClusterOptions, View};
use crate::service::SharedFrontier;
use crate::time::Timestamp;

/// Pause between two attempts at etcd after a failure.
const RETRY: Duration = Duration::from_secs(1);

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
    let etcd = loop {
        match EtcdCoordination::connect(&options.etcd).await {
            Ok(etcd) => break etcd,
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
    let etcd: Arc<dyn Coordination> = Arc::new(etcd);
    let refused = |reason: String| ClusterError::Refused {
        cluster: options.name.clone(),
        reason,
    };
    let unreachable = |error: CoordinationError| ClusterError::Unreachable {
        endpoints: options.etcd.join(","),
        waited: started.elapsed(),
        reason: error.to_string(),
    };
    let keys = Keys::new(&options.name);
    let ours = ClusterFacts {
        partitions: frontier.ingest().filters().partition_count() as u32,
        rules: frontier.config().rules.describe(),
        max_url_length: frontier.config().max_url_length,
        partition_by: frontier.ingest().partition_by(),
        replicas: options.replicas.unwrap_or(1),
        min_in_sync: options
            .min_in_sync
            .unwrap_or_else(|| options.replicas.unwrap_or(1).min(2)),
    };
    let (stored, created) = put_if_absent(&*etcd, keys.facts(), json(&ours))
        .await
        .map_err(unreachable)?;
    if created {
        tracing::info!(partitions = ours.partitions, "created the cluster");
    }
    let facts: ClusterFacts =
        serde_json::from_slice(&stored).map_err(|e| corrupt(&keys.facts(), e))?;
    // A node that does not say how many copies takes the cluster's.
    let ours = ClusterFacts {
        replicas: options.replicas.unwrap_or(facts.replicas),
        min_in_sync: options
            .min_in_sync
            .unwrap_or(if options.replicas.is_some() {
                ours.min_in_sync
            } else {
                facts.min_in_sync
            }),
        ..ours
    };
    if let Some(reason) = facts.mismatch(&ours) {
        return Err(refused(reason));
    }
    let node_secret = create_or_read_node_secret(&*etcd, &keys).await?;
    let member = Member {
        id: options.node_id.clone(),
        address: options.advertise.clone(),
        started_at_ms: Timestamp::now().unix_millis(),
    };
    forget_lost_copies(
        &*etcd,
        &keys,
        &options.node_id,
        frontier.ingest().store().store_id(),
    )
    .await?;
    let registered_at = Instant::now();
    let lease = register(&*etcd, &keys, &member, &options)
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
        keys,
        options,
        facts,
        frontier,
        view: ArcSwap::from_pointee(View::default()),
        changes,
        etcd,
        tasks: std::sync::Mutex::new(Vec::new()),
        moves: tokio::sync::Mutex::default(),
        flips: super::moves::flip::FlipQueue::default(),
        replication: super::replication::Replication::default(),
        registered_until: std::sync::Mutex::new(None),
    });
    cluster
        .frontier
        .ingest()
        .replicas()
        .set_patience(cluster.writer_patience());
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
    cluster.registered_until(registered_at + cluster.options.lease_ttl);
    let mut tasks = vec![
        tokio::spawn(keep_registered(Arc::clone(&cluster), lease, member)),
        tokio::spawn(watch(Arc::clone(&cluster), read_at)),
        tokio::spawn(apply_settings(Arc::clone(&cluster))),
        tokio::spawn(lead(Arc::clone(&cluster))),
        tokio::spawn(super::moves::run(Arc::clone(&cluster))),
    ];
    // Only address groups span partitions, and so nodes.
    if cluster.frontier.config().politeness == crate::scheduler::Politeness::Ip {
        tasks.push(super::turns::start(&cluster));
    }
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
    etcd: &dyn Coordination,
    key: String,
    ours: Vec<u8>,
) -> Result<(Vec<u8>, bool), CoordinationError> {
    let answer = etcd
        .txn(Txn {
            when: vec![Condition::Absent(key.clone())],
            then: vec![Write::put(key.clone(), ours.clone())],
            otherwise_get: Some(key),
        })
        .await?;
    if answer.succeeded {
        return Ok((ours, true));
    }
    Ok((
        answer.got.map(|entry| entry.value).unwrap_or_default(),
        false,
    ))
}

/// A node back with another store than the one it last joined with (its
/// disk lost, a new volume) holds none of the copies the map gives it:
/// before it registers, the partitions it leads go to live in-sync
/// followers and it leaves every in-sync set, so it comes back to them
/// only as a new follower, copied. A partition whose only copy was on the
/// lost store stays its, empty, and is named.
async fn forget_lost_copies(
    etcd: &dyn Coordination,
    keys: &Keys,
    node: &str,
    store_id: u64,
) -> Result<(), ClusterError> {
    let mine = format!("{store_id:016x}").into_bytes();
    loop {
        let (stored, created) = put_if_absent(etcd, keys.store_of(node), mine.clone()).await?;
        if created || stored == mine {
            return Ok(());
        }
        let snapshot = etcd.range(keys.prefix()).await?;
        let (view, _) = protocol::read_view(keys, &snapshot, None);
        if let Some((next, lost, txn)) = protocol::without_node(&view, keys, node) {
            if !etcd.txn(txn).await?.succeeded {
                continue; // the map changed meanwhile
            }
            tracing::warn!(
                epoch = next.epoch,
                "this node's store is not the one it last joined with: its copies were taken \
                 out of the map, and it is copied new ones"
            );
            if !lost.is_empty() {
                tracing::error!(
                    partitions = ?lost,
                    "the only copy of these partitions was on this node's lost store: their \
                     URLs are gone"
                );
            }
        }
        etcd.txn(Txn::writes(vec![Write::put(keys.store_of(node), mine)]))
            .await?;
        return Ok(());
    }
}

/// The secret the cluster's nodes prove themselves to each other with:
/// made at random by the first node that finds none (also in a cluster
/// created before nodes had one), read by every other.
async fn create_or_read_node_secret(
    etcd: &dyn Coordination,
    keys: &Keys,
) -> Result<String, ClusterError> {
    let mut bytes = [0_u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|error| corrupt(&keys.node_secret(), format!("no random bytes: {error}")))?;
    let ours: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let (stored, _) = put_if_absent(etcd, keys.node_secret(), ours.into_bytes())
        .await
        .map_err(|error| ClusterError::Coordination(error.to_string()))?;
    match String::from_utf8(stored) {
        Ok(secret) if secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(secret)
        }
        _ => Err(corrupt(&keys.node_secret(), "not 64 hex digits")),
    }
}

/// Registers the node under a new lease. A registration of the same ID
/// that is still alive is waited out for one lease life (it is this node's
/// previous run, killed before its lease ran out); one that outlives that
/// is another node with the same ID, and this one is refused.
async fn register(
    etcd: &dyn Coordination,
    keys: &Keys,
    member: &Member,
    options: &ClusterOptions,
) -> Result<Result<LeaseId, String>, CoordinationError> {
    let key = keys.member(&member.id);
    let value = json(member);
    let deadline = Instant::now() + options.lease_ttl + Duration::from_secs(2);
    loop {
        // A lease of its own each try: one granted before a wait would run
        // out during it.
        let lease = etcd.grant_lease(options.lease_ttl).await?;
        let answer = etcd
            .txn(Txn {
                when: vec![Condition::Absent(key.clone())],
                then: vec![Write::Put {
                    key: key.clone(),
                    value: value.clone(),
                    lease: Some(lease),
                }],
                otherwise_get: Some(key.clone()),
            })
            .await?;
        if answer.succeeded {
            tracing::info!(node = member.id, address = member.address, "registered");
            return Ok(Ok(lease));
        }
        let holder = answer
            .got
            .and_then(|entry| serde_json::from_slice::<Member>(&entry.value).ok())
            .map_or_else(|| "an unknown address".to_owned(), |m| m.address);
        let _ = etcd.revoke(lease).await;
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
async fn keep_registered(cluster: Arc<Cluster>, mut lease: LeaseId, member: Member) {
    let ttl = cluster.options.lease_ttl;
    let key = cluster.keys.member(&member.id);
    let etcd = &*cluster.etcd;
    loop {
        let kept = async {
            loop {
                let sent = Instant::now();
                if !etcd.keep_alive(lease).await? {
                    break;
                }
                cluster.registered_until(sent + ttl);
                tokio::time::sleep(ttl / 3).await;
            }
            Ok::<(), CoordinationError>(())
        };
        match kept.await {
            Ok(()) => tracing::warn!("the registration lease ran out; registering again"),
            Err(error) => tracing::warn!(%error, "cannot renew the registration lease"),
        }
        tokio::time::sleep(RETRY).await;
        // The old lease may still be alive (a renewal that failed); only a
        // lost one is replaced.
        if let Ok(true) = etcd.lease_alive(lease).await {
            continue;
        }
        let sent = Instant::now();
        let renewed = async {
            let granted = etcd.grant_lease(ttl).await?;
            etcd.txn(Txn::writes(vec![Write::Put {
                key: key.clone(),
                value: json(&member),
                lease: Some(granted),
            }]))
            .await?;
            Ok::<LeaseId, CoordinationError>(granted)
        };
        match renewed.await {
            Ok(new) => {
                lease = new;
                // Serving again only on a view read after the new
                // registration: the old view may give this node partitions
                // that failed over while it was away.
                match refresh(&cluster).await {
                    Ok(_) => {
                        cluster.registered_until(sent + ttl);
                        tracing::info!("registered again");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "registered again; the view is not read yet")
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot register again yet"),
        }
    }
}

/// Gives up the registration at a clean stop.
pub(super) async fn deregister(cluster: &Cluster) {
    let key = cluster.keys.member(&cluster.options.node_id);
    if let Err(error) = cluster
        .etcd
        .txn(Txn::writes(vec![Write::Delete(key)]))
        .await
    {
        tracing::warn!(%error, "cannot remove the registration; it expires with its lease");
    }
}

/// Reads the whole cluster state and replaces the view with it.
async fn refresh(cluster: &Arc<Cluster>) -> Result<i64, CoordinationError> {
    let snapshot = cluster.etcd.range(cluster.keys.prefix()).await?;
    let leader = cluster
        .etcd
        .leader(&cluster.keys.election())
        .await
        .unwrap_or(None);
    let (view, unreadable) = protocol::read_view(&cluster.keys, &snapshot, leader);
    for (key, error) in unreadable {
        tracing::warn!(key, %error, "unreadable cluster key left out");
    }
    let previous = cluster.view();
    let epoch = view.map.as_ref().map_or(0, |m| m.epoch);
    if epoch != previous.map.as_ref().map_or(0, |m| m.epoch) {
        tracing::info!(epoch, "partition map changed");
    }
    super::replication::settle(cluster, &previous, &view);
    super::moves::settle(cluster, &view).await;
    let revision = view.revision;
    cluster.view.store(Arc::new(view));
    cluster.changes.send_modify(|generation| *generation += 1);
    Ok(revision)
}

/// Keeps the view current: watches for changes from the revision last
/// read and reads everything again on each (and after a lost watch).
/// Without etcd the last view stays: nodes keep serving on the last map
/// they saw.
async fn watch(cluster: Arc<Cluster>, mut read_at: Option<i64>) {
    loop {
        let watched = async {
            // A view read at this revision already, or a fresh one.
            let revision = match read_at.take() {
                Some(revision) => revision,
                None => refresh(&cluster).await?,
            };
            let mut changes = cluster.etcd.watch(cluster.keys.prefix(), revision).await?;
            while let Some(change) = changes.next().await {
                change?;
                // One read of everything covers every change that came
                // while the last was being read: a burst of them (many
                // moves at once) costs one refresh, not one each.
                while let Some(Some(more)) = changes.next().now_or_never() {
                    more?;
                }
                refresh(&cluster).await?;
            }
            Ok::<(), CoordinationError>(())
        };
        if let Err(error) = watched.await {
            tracing::warn!(%error, "lost the watch on etcd; serving on the last map seen");
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Campaigns for leadership and, once leader, writes the first partition
/// map when enough nodes have registered and plans moves. A lost election
/// (etcd away, the lease gone) starts over.
async fn lead(cluster: Arc<Cluster>) {
    let ttl = cluster.options.lease_ttl;
    let etcd = &*cluster.etcd;
    loop {
        let led = async {
            let lease = etcd.grant_lease(ttl).await?;
            // The campaign's lease is kept while waiting to win. A campaign
            // waits for as long as another node leads, so the client's
            // request timeout ends it now and then: it is made again under
            // the same lease, which keeps this node's place in the queue.
            loop {
                let campaign =
                    etcd.campaign(&cluster.keys.election(), &cluster.options.node_id, lease);
                tokio::pin!(campaign);
                let outcome = loop {
                    tokio::select! {
                        won = &mut campaign => break won,
                        () = tokio::time::sleep(ttl / 3) => {
                            etcd.keep_alive(lease).await?;
                        }
                    }
                };
                match outcome {
                    Ok(()) => break,
                    Err(CoordinationError::CampaignTimedOut) => {}
                    Err(error) => return Err(error),
                }
            }
            tracing::info!(node = cluster.options.node_id, "elected leader");
            let mut changes = cluster.changes.subscribe();
            // Since when partitions are short of a copy, as this node has
            // seen them since it was elected.
            let mut copies = protocol::CopyPolicy::default();
            // An interval, not a sleep per turn: views that change faster
            // than a third of the lease (moves do) must not starve the
            // keep-alive.
            let mut keep_alive = tokio::time::interval(ttl / 3);
            loop {
                write_first_map(&cluster).await?;
                plan(&cluster, &mut copies).await?;
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return Ok(());
                        }
                    }
                    _ = keep_alive.tick() => {
                        if !etcd.keep_alive(lease).await? {
                            return Ok::<(), CoordinationError>(());
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

/// The first map, once the initial nodes have registered, written once.
async fn write_first_map(cluster: &Cluster) -> Result<(), CoordinationError> {
    let view = cluster.view();
    let Some((map, txn)) = protocol::first_map(
        &view,
        &cluster.keys,
        (cluster.facts.partitions, cluster.facts.replicas),
        cluster.options.initial_nodes,
    ) else {
        return Ok(());
    };
    if cluster.etcd.txn(txn).await?.succeeded {
        tracing::info!(epoch = map.epoch, nodes = ?map.nodes(), "wrote the first partition map");
    }
    Ok(())
}

/// The leader's moves: rollbacks, then starts toward a balanced map.
async fn plan(
    cluster: &Cluster,
    copies: &mut protocol::CopyPolicy,
) -> Result<(), CoordinationError> {
    let view = cluster.view();
    if let Some((failovers, map, txn)) = protocol::failovers(&view, &cluster.keys) {
        if cluster.etcd.txn(txn).await?.succeeded {
            for (partition, from, to) in failovers {
                tracing::warn!(
                    partition,
                    from,
                    to,
                    epoch = map.epoch,
                    "failover: the leader's registration lapsed; an in-sync follower leads"
                );
            }
        }
        // The plan waits for a view with the new map.
        return Ok(());
    }
    let now = Timestamp::now().unix_millis();
    copies.replicas = cluster.replicas();
    copies.min_in_sync = cluster.min_in_sync();
    copies.replace_after_ms = cluster.options.replace_after.as_millis() as u64;
    copies.observe(&view, now);
    let copying = protocol::plan_copies(&view, &cluster.keys, copies, now);
    let planned: Vec<_> = copying
        .into_iter()
        .chain(protocol::plan(&view, &cluster.keys, now))
        .collect();
    for (steps, txn) in protocol::together(planned) {
        if !cluster.etcd.txn(txn).await?.succeeded {
            continue;
        }
        for planned in steps {
            match planned {
                protocol::Planned::RollBack {
                    partition,
                    from,
                    to,
                } => tracing::warn!(
                    partition,
                    from,
                    to,
                    "move rolled back: its receiver is gone"
                ),
                protocol::Planned::Start {
                    partition,
                    from,
                    to,
                } => tracing::info!(partition, from, to, "partition move started"),
                protocol::Planned::Replicate {
                    partition,
                    leader,
                    to,
                } => tracing::info!(partition, leader, to, "new follower's copy started"),
                protocol::Planned::Trim { partitions } => {
                    tracing::info!(?partitions, "followers beyond the copies kept let go");
                    // The starts were planned from the map before the trim.
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// Records a crawl-wide setting in etcd (every node applies it from there,
/// now or when it next starts).
pub(super) async fn record_setting(
    cluster: &Cluster,
    change: SettingChange<'_>,
) -> Result<(), ClusterError> {
    let keys = &cluster.keys;
    let writes: Vec<Write> = match change {
        SettingChange::Active(active) => vec![Write::put(keys.active(), json(&active))],
        SettingChange::Delay { crawl, secs } => {
            let value = DelaySetting {
                crawl: crawl.to_owned(),
                secs,
            };
            vec![Write::put(keys.delay(crawl), json(&value))]
        }
        SettingChange::Seeds { crawl, hosts } => hosts
            .iter()
            .map(|host| {
                let value = SeedSetting {
                    crawl: crawl.to_owned(),
                    host: host.clone(),
                };
                Write::put(format!("{}{host}", keys.seeds(crawl)), json(&value))
            })
            .collect(),
        SettingChange::Revisit {
            crawl,
            policy: Some(policy),
        } => {
            let (min_secs, max_secs) = policy.bounds();
            let value = RevisitSetting {
                crawl: crawl.to_owned(),
                policy: policy.name().to_owned(),
                min_secs,
                max_secs,
            };
            vec![Write::put(keys.revisit(crawl), json(&value))]
        }
        SettingChange::Revisit {
            crawl,
            policy: None,
        } => vec![Write::Delete(keys.revisit(crawl))],
        SettingChange::ForgetCrawl { crawl } => vec![
            Write::DeletePrefix(keys.seeds(crawl)),
            Write::Delete(keys.delay(crawl)),
            Write::Delete(keys.revisit(crawl)),
        ],
    };
    // etcd bounds the operations of one transaction (128 by default).
    for chunk in writes.chunks(100) {
        cluster
            .etcd
            .txn(Txn::writes(chunk.to_vec()))
            .await
            .map_err(|error| ClusterError::NotRecorded {
                what: "a cluster-wide setting",
                reason: error.to_string(),
            })?;
    }
    Ok(())
}

/// A crawl-wide change.
pub(super) enum SettingChange<'a> {
    Active(bool),
    Delay {
        crawl: &'a str,
        secs: u32,
    },
    Seeds {
        crawl: &'a str,
        hosts: &'a [String],
    },
    /// A crawl's own revisit policy (`None`: the nodes' default again).
    Revisit {
        crawl: &'a str,
        policy: Option<crate::revisit::Policy>,
    },
    ForgetCrawl {
        crawl: &'a str,
    },
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
    for (crawl, policy) in &target.revisits {
        if done.revisits.get(crawl) != Some(policy) {
            frontier.ingest().set_revisit_policy(crawl, Some(*policy))?;
        }
    }
    for crawl in done.revisits.keys() {
        if !target.revisits.contains_key(crawl) {
            frontier.ingest().set_revisit_policy(crawl, None)?;
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
