//! Partition moves: a partition's records go from one node to another while
//! the crawl goes on (ARCHITECTURE.md: the move protocol).
//!
//! etcd holds each move under `moves/P` (at most a few at once), draining
//! nodes under `draining/ID`, and the map. The leader plans: it rebalances
//! the map over the live nodes that are not draining and starts the moves
//! that take a partition from a live node to a live node, rolling back a
//! move whose receiver is gone before its flip. The receiver drives a move:
//!
//! 1. copy: it empties its own copy of the partition, then pages through
//!    the owner's (CopyPartition), which notes the partition's writes from
//!    the first page on;
//! 2. cutover (written to etcd first): the owner seals the partition (no
//!    writes, not served) and answers the writes noted since the copy
//!    began, or says it has none (it restarted, or a deletion reached the
//!    partition: the receiver then copies it whole again, under the seal);
//! 3. flip: one etcd transaction, conditional on the map and the move being
//!    as read, gives the partition to the receiver in a new epoch and
//!    records until when the old owner's leases on it may run; the
//!    receiver serves it once they have;
//! 4. the old owner deletes its copy and says so; the receiver then removes
//!    the move.
//!
//! Every step is safe to repeat after a crash of either node: a copy starts
//! over, a seal answers all writes since the copy began, the flip happens
//! once, and a node reads its part (sealing, serving, deleting) from etcd
//! when it starts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tonic::Status;

mod copy;

use copy::{
    AdminPeer, Progress, catch_up, copy_whole, decode_page, drop_local, take, take_queue_settings,
};

use super::map::PartitionMap;
use super::{Cluster, View};
use crate::time::Timestamp;

/// Moves in flight at once, cluster-wide: each costs its two nodes a copy.
const MOVES_IN_FLIGHT: usize = 2;
/// Pause before a move step that failed is tried again.
const RETRY: Duration = Duration::from_secs(1);

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

/// A move as etcd holds it under `moves/P`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    pub partition: u32,
    pub from: String,
    pub to: String,
    pub phase: MovePhase,
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
}

pub(super) fn move_key(cluster: &Cluster, partition: u32) -> String {
    format!(
        "{}moves/{partition}",
        super::coordinator::prefix(&cluster.options.name)
    )
}

fn map_key(cluster: &Cluster) -> String {
    format!("{}map", super::coordinator::prefix(&cluster.options.name))
}

fn now_ms() -> u64 {
    Timestamp::now().unix_millis()
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

/// Brings this node in step with the moves of a new view: seals the
/// partitions it hands over, unseals those no longer moving, and serves
/// what [`served_partitions`] says. Runs before the view is used.
pub(super) async fn settle(cluster: &Cluster, view: &View) {
    let me = cluster.options.node_id.as_str();
    let sealing: BTreeSet<u32> = view
        .moves
        .iter()
        .filter(|(_, (r, _))| r.from == me && r.phase == MovePhase::Cutover)
        .map(|(p, _)| *p)
        .collect();
    let mut state = cluster.moves.lock().await;
    // A seal ends with its move: rolled back (gone from a view read after
    // the seal), or handed over (the partition deleted first, by
    // `hand_over_done`). Not on a view that predates the seal.
    let opened: Vec<u32> = state
        .sealed
        .iter()
        .filter(|(partition, sealed_at)| {
            !view.moves.contains_key(partition) && view.revision > **sealed_at
        })
        .map(|(partition, _)| *partition)
        .collect();
    let newly: Vec<u32> = sealing
        .iter()
        .filter(|partition| !state.sealed.contains_key(partition))
        .copied()
        .collect();
    if !opened.is_empty() || !newly.is_empty() {
        let frontier = Arc::clone(&cluster.frontier);
        let unsealing = opened.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for partition in newly {
                frontier.ingest().seal_partition(partition);
            }
            for partition in unsealing {
                frontier.ingest().unseal_partition(partition);
            }
        })
        .await;
        for partition in opened {
            state.sealed.remove(&partition);
        }
        for partition in sealing {
            state.sealed.entry(partition).or_insert(view.revision);
        }
    }
    let mut served = served_partitions(view, me, cluster.partitions(), now_ms());
    // Sealed here by a SealPartition this view may not show yet.
    for partition in state.sealed.keys() {
        if let Some(slot) = served.get_mut(*partition as usize) {
            *slot = false;
        }
    }
    if state.served.as_ref() != Some(&served) {
        cluster
            .frontier
            .scheduler()
            .set_served_partitions(Some(served.clone()));
        state.served = Some(served);
    }
    let receiving = state.running.clone();
    drop(state);
    drop_strays(cluster, view, &receiving).await;
}

/// Drops what this node holds of partitions the map gives another node,
/// with no move of them to or from here in flight: what a receiver killed
/// mid-copy keeps of a move rolled back while it was away. Left, those
/// URLs would count in its figures (the crawl would never look finished)
/// though nothing serves them. The map's owner holds every URL of its
/// partition (a map changes only at a move's flip, after the copy), so
/// nothing is lost. Done before the view is used, so a later move of the
/// partition here starts after the drop.
async fn drop_strays(cluster: &Cluster, view: &View, receiving: &BTreeSet<u32>) {
    let Some(map) = &view.map else {
        return;
    };
    let me = cluster.options.node_id.as_str();
    let strays: Vec<(u32, String)> = map
        .owners
        .iter()
        .enumerate()
        .filter_map(|(partition, owner)| {
            let partition = u32::try_from(partition).ok()?;
            let moving_here_or_away = view
                .moves
                .get(&partition)
                .is_some_and(|(record, _)| record.from == me || record.to == me);
            let held = cluster
                .frontier
                .ingest()
                .stored_in_partition(partition as usize)
                .is_some_and(|stored| stored > 0);
            (owner != me && !moving_here_or_away && !receiving.contains(&partition) && held)
                .then(|| (partition, owner.clone()))
        })
        .collect();
    for (partition, owner) in strays {
        let frontier = Arc::clone(&cluster.frontier);
        let dropped =
            tokio::task::spawn_blocking(move || frontier.ingest().drop_partition(partition)).await;
        match dropped {
            Ok(Ok(dropped)) => tracing::info!(
                partition,
                owner,
                dropped,
                "dropped a stray copy of a partition another node owns"
            ),
            Ok(Err(error)) => {
                tracing::warn!(partition, %error, "a stray copy not dropped yet");
            }
            Err(error) => tracing::warn!(partition, %error, "a stray copy not dropped yet"),
        }
    }
}

/// What a node keeps of its moves in memory.
#[derive(Debug, Default)]
pub(super) struct MoveState {
    /// Partitions sealed here, with the etcd revision the seal was read at.
    sealed: BTreeMap<u32, i64>,
    served: Option<Vec<bool>>,
    /// Partitions this node is receiving now (a task each).
    running: BTreeSet<u32>,
}

/// The leader's part: roll back moves whose receiver is gone, then start
/// moves toward a balanced map, a few at a time.
pub(super) async fn plan(cluster: &Cluster, etcd: &mut Client) -> Result<(), etcd_client::Error> {
    let view = cluster.view();
    let Some(map) = &view.map else {
        return Ok(());
    };
    let live: BTreeSet<String> = view.members.keys().cloned().collect();
    let mut in_flight = 0;
    for (partition, (record, revision)) in &view.moves {
        let receiver_gone = !live.contains(&record.to) || view.draining.contains(&record.to);
        if record.phase != MovePhase::Flipped && receiver_gone {
            let key = move_key(cluster, *partition);
            if delete_if_unchanged(etcd, key, *revision).await? {
                tracing::warn!(
                    partition,
                    from = record.from,
                    to = record.to,
                    "move rolled back: its receiver is gone"
                );
            }
            continue;
        }
        // A flipped move only waits (for leases, for the old copy to go).
        if record.phase != MovePhase::Flipped {
            in_flight += 1;
        }
    }
    let eligible: BTreeSet<String> = live.difference(&view.draining).cloned().collect();
    let Some(target) = map.rebalanced(&eligible) else {
        return Ok(());
    };
    for (partition, from, to) in map.moves_to(&target) {
        if in_flight >= MOVES_IN_FLIGHT {
            break;
        }
        if view.moves.contains_key(&partition) || !live.contains(from) {
            continue; // moving already, or its data is on a node that is away
        }
        let record = MoveRecord {
            partition,
            from: from.to_owned(),
            to: to.to_owned(),
            phase: MovePhase::Copy,
            copied: 0,
            copied_bytes: 0,
            started_at_ms: now_ms(),
            cutover_at_ms: 0,
            cutover_ms: 0,
            leased: 0,
            hold_until_ms: 0,
            from_done: false,
        };
        let key = move_key(cluster, partition);
        let started = etcd
            .txn(
                Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key,
                        serde_json::to_vec(&record).unwrap_or_default(),
                        None,
                    )]),
            )
            .await?;
        if started.succeeded() {
            tracing::info!(partition, from, to, "partition move started");
            in_flight += 1;
        }
    }
    Ok(())
}

/// Every node's part, on each change of the view and at least every
/// second: receive the moves addressed here, delete what was handed over,
/// end moves whose hold has passed, and serve a received partition once
/// its hold ends.
pub(super) async fn run(cluster: Arc<Cluster>) {
    let mut changes = cluster.changes.subscribe();
    loop {
        let view = cluster.view();
        settle(&cluster, &view).await;
        let me = cluster.options.node_id.clone();
        for (&partition, (record, revision)) in &view.moves {
            match record.phase {
                MovePhase::Copy | MovePhase::Cutover if record.to == me => {
                    let mut state = cluster.moves.lock().await;
                    if state.running.insert(partition) {
                        tokio::spawn(receive(Arc::clone(&cluster), partition));
                    }
                }
                MovePhase::Flipped if record.from == me && !record.from_done => {
                    if let Err(error) = hand_over_done(&cluster, record, *revision).await {
                        tracing::warn!(partition, %error, "cannot delete the handed-over partition yet");
                    }
                }
                MovePhase::Flipped
                    if record.to == me && record.from_done && now_ms() >= record.hold_until_ms =>
                {
                    if let Err(error) = finish(&cluster, partition, *revision).await {
                        tracing::warn!(partition, %error, "cannot end the move yet");
                    }
                }
                _ => {}
            }
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// The receiver, once the old owner deleted its copy and the old leases
/// ended: the move is over.
async fn finish(cluster: &Cluster, partition: u32, revision: i64) -> Result<(), Status> {
    fail::fail_point!("move-before-finish", |_| Err(crate::failpoint::hit(
        "move-before-finish"
    )));
    let key = move_key(cluster, partition);
    let mut etcd = cluster.etcd.clone();
    delete_if_unchanged(&mut etcd, key, revision)
        .await
        .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
    Ok(())
}

/// The old owner after the flip: deletes its copy, lets writes reach the
/// partition's number again (they are routed to the new owner), and
/// records that it is done.
async fn hand_over_done(
    cluster: &Cluster,
    record: &MoveRecord,
    revision: i64,
) -> Result<(), String> {
    let partition = record.partition;
    fail::fail_point!("move-before-delete", |_| Err(crate::failpoint::hit(
        "move-before-delete"
    )
    .message()
    .to_owned()));
    let frontier = Arc::clone(&cluster.frontier);
    let started = std::time::Instant::now();
    let dropped = tokio::task::spawn_blocking(move || {
        let dropped = frontier.ingest().drop_partition(partition);
        frontier.ingest().untrack_partition(partition);
        frontier.ingest().unseal_partition(partition);
        dropped
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    cluster.moves.lock().await.sealed.remove(&partition);
    let done = MoveRecord {
        from_done: true,
        ..record.clone()
    };
    let key = move_key(cluster, partition);
    let mut etcd = cluster.etcd.clone();
    match put_if_unchanged(&mut etcd, &key, revision, &done, None).await {
        Ok(_) => tracing::info!(
            partition,
            to = record.to,
            dropped,
            ms = started.elapsed().as_millis() as u64,
            "handed-over partition deleted here"
        ),
        // Recorded already by an earlier turn: nothing more to say.
        Err(status) if status.code() == tonic::Code::Aborted => {}
        Err(status) => return Err(status.message().to_owned()),
    }
    Ok(())
}

/// The receiver's task for one move, until the move is flipped or gone.
async fn receive(cluster: Arc<Cluster>, partition: u32) {
    loop {
        match receive_step(&cluster, partition).await {
            Ok(true) => break,
            Ok(false) => {}
            // Another step (such as another move's flip) changed etcd
            // meanwhile: read again at once rather than after a pause that
            // would lengthen the cutover.
            Err(error) if error.code() == tonic::Code::Aborted => {
                tracing::debug!(partition, %error, "partition move step raced; again");
            }
            Err(error) => {
                tracing::warn!(partition, %error, "partition move step failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
    let receiving = {
        let mut state = cluster.moves.lock().await;
        state.running.remove(&partition);
        state.running.clone()
    };
    // A move rolled back mid-copy leaves what was copied: dropped now,
    // not at the next change of the cluster's view, which may be long.
    drop_strays(&cluster, &cluster.view(), &receiving).await;
}

/// One step of a move as etcd holds it now; `Ok(true)` once there is
/// nothing left for the receiver.
async fn receive_step(cluster: &Arc<Cluster>, partition: u32) -> Result<bool, Status> {
    let mut etcd = cluster.etcd.clone();
    let key = move_key(cluster, partition);
    let unavailable = |e: etcd_client::Error| Status::unavailable(format!("etcd: {e}"));
    let answer = etcd.get(key.clone(), None).await.map_err(unavailable)?;
    let Some(kv) = answer.kvs().first() else {
        return Ok(true); // rolled back or finished
    };
    let revision = kv.mod_revision();
    let record: MoveRecord = serde_json::from_slice(kv.value())
        .map_err(|e| Status::internal(format!("{key} is unreadable: {e}")))?;
    if record.to != cluster.options.node_id || record.phase == MovePhase::Flipped {
        return Ok(true);
    }
    let view = cluster.view();
    let Some(owner) = view.members.get(&record.from) else {
        return Err(Status::unavailable(format!(
            "node {} (the partition's owner) is away",
            record.from
        )));
    };
    let mut admin = cluster.peers.get(&owner.endpoint())?.admin();
    let mut progress = Progress::new(etcd, key, revision, record);
    match progress.record.phase {
        MovePhase::Copy => {
            drop_local(cluster, partition).await?;
            progress.restart();
            copy_whole(cluster, &mut admin, partition, true, &mut progress).await?;
            let caught_up = catch_up(cluster, &mut admin, partition).await?;
            progress.record.phase = MovePhase::Cutover;
            progress.record.cutover_at_ms = now_ms();
            progress.write().await?;
            tracing::info!(
                partition,
                copied = progress.record.copied,
                bytes = progress.record.copied_bytes,
                caught_up,
                from = progress.record.from,
                "partition copied; cutover"
            );
            Ok(false)
        }
        MovePhase::Cutover => {
            cut_over(cluster, &mut admin, progress).await?;
            Ok(true)
        }
        MovePhase::Flipped => Ok(true),
    }
}

/// The cutover: seals the partition at its owner, takes the tail (or the
/// whole partition again when the owner cannot say what changed), the
/// queue settings, and flips the map.
async fn cut_over(
    cluster: &Arc<Cluster>,
    admin: &mut AdminPeer,
    mut progress: Progress,
) -> Result<(), Status> {
    let partition = progress.record.partition;
    let page = cluster.options.move_page_urls;
    let first = seal_page(admin, partition, None, page).await?;
    let (leased, leases_until_ms) = (first.leased, first.leases_until_ms);
    let queues = first.queues.clone();
    let tail = if first.tracked {
        let mut sealed = first;
        let mut tail = 0;
        loop {
            let after = sealed.urls.last().map(|last| proto::admin::PartitionKey {
                crawl_id: last.crawl_id.clone(),
                url: last.url.clone(),
            });
            let urls = decode_page(std::mem::take(&mut sealed.urls))?;
            tail += urls.len() as u64;
            take(cluster, partition, urls).await?;
            if sealed.end || after.is_none() {
                break tail;
            }
            sealed = seal_page(admin, partition, after, page).await?;
            if !sealed.tracked {
                return Err(Status::unavailable(
                    "the partition's owner restarted during the cutover; starting it again",
                ));
            }
        }
    } else {
        drop_local(cluster, partition).await?;
        progress.restart();
        copy_whole(cluster, admin, partition, false, &mut progress).await?;
        progress.record.copied
    };
    take_queue_settings(cluster, queues).await?;
    fail::fail_point!("move-before-flip", |_| Err(crate::failpoint::hit(
        "move-before-flip"
    )));
    // The map as etcd holds it now (the view may lag behind another
    // move's flip): the flip is conditional on it.
    let (map, map_revision) = current_map(cluster).await?;
    let mut next_map = map.clone();
    if let Some(owner) = next_map.owners.get_mut(partition as usize) {
        owner.clone_from(&progress.record.to);
    }
    next_map.epoch += 1;
    let record = &mut progress.record;
    record.phase = MovePhase::Flipped;
    record.leased = leased;
    record.hold_until_ms = leases_until_ms;
    record.cutover_ms = now_ms().saturating_sub(record.cutover_at_ms);
    let flipped = record.clone();
    put_if_unchanged(
        &mut progress.etcd,
        &progress.key,
        progress.revision,
        &flipped,
        Some((map_key(cluster), map_revision, &next_map)),
    )
    .await?;
    tracing::info!(
        partition,
        from = flipped.from,
        epoch = next_map.epoch,
        tail,
        leased = flipped.leased,
        cutover_ms = flipped.cutover_ms,
        "partition moved here"
    );
    Ok(())
}

/// The partition map and its revision, read from etcd.
async fn current_map(cluster: &Cluster) -> Result<(PartitionMap, i64), Status> {
    let mut etcd = cluster.etcd.clone();
    let answer = etcd
        .get(map_key(cluster), None)
        .await
        .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
    let kv = answer
        .kvs()
        .first()
        .ok_or_else(|| Status::unavailable("no partition map yet"))?;
    let map = serde_json::from_slice(kv.value())
        .map_err(|e| Status::internal(format!("the partition map is unreadable: {e}")))?;
    Ok((map, kv.mod_revision()))
}

async fn seal_page(
    admin: &mut AdminPeer,
    partition: u32,
    after: Option<proto::admin::PartitionKey>,
    limit: u32,
) -> Result<proto::admin::SealedPartition, Status> {
    Ok(admin
        .seal_partition(proto::admin::SealPartitionRequest {
            partition,
            after,
            limit,
        })
        .await?
        .into_inner())
}

/// Deletes a key if it is as read; answers whether it was.
async fn delete_if_unchanged(
    etcd: &mut Client,
    key: String,
    revision: i64,
) -> Result<bool, etcd_client::Error> {
    let deleted = etcd
        .txn(
            Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::delete(key, None)]),
        )
        .await?;
    Ok(deleted.succeeded())
}

/// Writes a move's next state (and with it, for the flip, the map) if
/// neither changed since read; answers the key's new revision.
async fn put_if_unchanged(
    etcd: &mut Client,
    key: &str,
    revision: i64,
    record: &MoveRecord,
    map: Option<(String, i64, &PartitionMap)>,
) -> Result<i64, Status> {
    let mut when = vec![Compare::mod_revision(key, CompareOp::Equal, revision)];
    let mut then = vec![TxnOp::put(
        key,
        serde_json::to_vec(record).unwrap_or_default(),
        None,
    )];
    if let Some((map_key, map_revision, map)) = map {
        when.push(Compare::mod_revision(
            map_key.clone(),
            CompareOp::Equal,
            map_revision,
        ));
        then.push(TxnOp::put(
            map_key,
            serde_json::to_vec(map).unwrap_or_default(),
            None,
        ));
    }
    let written = etcd
        .txn(Txn::new().when(when).and_then(then))
        .await
        .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
    if written.succeeded() {
        // The transaction's revision is the key's new mod revision.
        Ok(written.header().map_or(0, |h| h.revision()))
    } else {
        Err(Status::aborted(format!(
            "{key} or the map changed meanwhile; reading again"
        )))
    }
}

/// The owner's answer to SealPartition: only for a move etcd holds at its
/// cutover from this node. The first page (no `after`) seals and carries
/// the leases and queue settings; each page carries the tail's next URLs.
pub(super) async fn seal(
    cluster: &Cluster,
    request: proto::admin::SealPartitionRequest,
) -> Result<proto::admin::SealedPartition, Status> {
    let partition = request.partition;
    let mut etcd = cluster.etcd.clone();
    let key = move_key(cluster, partition);
    let answer = etcd
        .get(key.clone(), None)
        .await
        .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
    let record: Option<MoveRecord> = answer
        .kvs()
        .first()
        .and_then(|kv| serde_json::from_slice(kv.value()).ok());
    match &record {
        Some(r) if r.phase == MovePhase::Cutover && r.from == cluster.options.node_id => {}
        _ => {
            return Err(Status::failed_precondition(format!(
                "partition {partition} is not at the cutover of a move from node {}",
                cluster.options.node_id
            )));
        }
    }
    let revision = answer.header().map_or(0, |h| h.revision());
    let first = request.after.is_none();
    if first {
        // Not served from here on, before its leases are counted.
        let mut state = cluster.moves.lock().await;
        state.sealed.entry(partition).or_insert(revision);
        if let Some(served) = state.served.as_mut()
            && let Some(slot) = served.get_mut(partition as usize)
        {
            *slot = false;
            cluster
                .frontier
                .scheduler()
                .set_served_partitions(Some(served.clone()));
        }
    }
    let limit = crate::partition_page::copy_page_limit(request.limit);
    let frontier = Arc::clone(&cluster.frontier);
    let sealed = tokio::task::spawn_blocking(move || {
        let tail = frontier.ingest().seal_partition(partition);
        let mut sealed = proto::admin::SealedPartition::default();
        if first {
            let (leased, until) = frontier
                .scheduler()
                .leases_in_partition(partition, Timestamp::now());
            sealed.leased = leased;
            sealed.leases_until_ms = until.unix_millis();
            sealed.queues = queues_with_settings(&frontier, partition)?;
        }
        let after = request.after.map(|key| (key.crawl_id, key.url));
        let page = match tail.filter(|tail| !tail.deleted) {
            Some(_) => frontier
                .ingest()
                .sealed_tail_page(partition, after.as_ref(), limit)
                .map_err(|e| Status::unavailable(e.to_string()))?,
            None => None,
        };
        if let Some((urls, end)) = page {
            let (urls, cut) = crate::partition_page::wire_page(urls);
            sealed.tracked = true;
            sealed.end = end && !cut;
            sealed.urls = urls;
        }
        Ok::<_, Status>(sealed)
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))??;
    fail::fail_point!("seal-partition-answer", |_| Err(crate::failpoint::hit(
        "seal-partition-answer"
    )));
    Ok(sealed)
}

/// The settings of a partition's queues that have any.
fn queues_with_settings(
    frontier: &crate::service::Frontier,
    partition: u32,
) -> Result<Vec<proto::admin::MovedQueue>, Status> {
    let partitions = frontier.ingest().filters().partition_count();
    let mut queues = Vec::new();
    frontier
        .ingest()
        .store()
        .for_each_queue(|crawl, key, record| {
            let has_settings =
                record.blocked_until > 0 || record.delay_ms.is_some() || record.crawl_limit > 0;
            if has_settings
                && crate::ingest::partition_of(crawl, key, partitions) == partition as usize
            {
                queues.push(proto::admin::MovedQueue {
                    crawl_id: crawl.to_owned(),
                    key: key.to_owned(),
                    blocked_until: record.blocked_until,
                    delay_ms: record.delay_ms,
                    crawl_limit: record.crawl_limit,
                });
            }
        })
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(queues)
}

/// Marks a node as draining: the leader moves its partitions away.
pub(super) async fn drain(cluster: &Cluster, node: &str) -> Result<u32, Status> {
    let view = cluster.view();
    let known = view.members.contains_key(node)
        || view
            .map
            .as_ref()
            .is_some_and(|map| map.owners.iter().any(|o| o == node));
    if !known {
        return Err(Status::not_found(format!(
            "no node {node:?} in cluster {:?}",
            cluster.options.name
        )));
    }
    let others: BTreeSet<&String> = view
        .members
        .keys()
        .filter(|id| *id != node && !view.draining.contains(*id))
        .collect();
    if others.is_empty() {
        return Err(Status::failed_precondition(format!(
            "node {node:?} is the only node left to own partitions: start another before draining it"
        )));
    }
    let key = format!(
        "{}draining/{node}",
        super::coordinator::prefix(&cluster.options.name)
    );
    let mut etcd = cluster.etcd.clone();
    etcd.put(key, b"{}".to_vec(), None).await.map_err(|e| {
        Status::unavailable(format!("cannot record the drain in etcd ({e}); retry"))
    })?;
    Ok(view
        .map
        .as_ref()
        .map_or(0, |map| map.owned_by(node).count() as u32))
}

/// A node that starts owning nothing while marked as draining was drained
/// and is back (a StatefulSet scaled up again): it takes partitions again.
/// One still owning some is restarting mid-drain and stays marked.
pub(super) async fn end_finished_drain(cluster: &Cluster) {
    let view = cluster.view();
    let me = &cluster.options.node_id;
    let owns = view
        .map
        .as_ref()
        .is_some_and(|map| map.owned_by(me).next().is_some());
    if !view.draining.contains(me) || owns || view.moves.values().any(|(r, _)| &r.from == me) {
        return;
    }
    let key = format!(
        "{}draining/{me}",
        super::coordinator::prefix(&cluster.options.name)
    );
    let mut etcd = cluster.etcd.clone();
    match etcd.delete(key, None).await {
        Ok(_) => tracing::info!("this node was drained and is back: it takes partitions again"),
        Err(error) => tracing::warn!(%error, "cannot clear this node's finished drain"),
    }
}

/// Moves as a view lists them: partition to (record, etcd mod revision).
pub type Moves = BTreeMap<u32, (MoveRecord, i64)>;
