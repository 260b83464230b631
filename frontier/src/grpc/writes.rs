//! The URL Frontier service's write path: PutURLs chunks and PutDiscovered
//! batches. A write runs on the async threads and holds no thread while it
//! waits for its commit: the batch is worked out from memory, the store
//! reads that settle a filter's "maybe" go to the blocking pool (the one
//! step that may wait on the disk), the writes are queued with the group
//! commit, and the task awaits the answer. A crawl sends two small writes
//! a page, and each thread handed a write and woken for its answer is a
//! pair of context switches on the page's path.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use proto::urlfrontier as uf;
use tokio::sync::Semaphore;
use tonic::{Status, Streaming};

use super::{
    BoxStream, UrlFrontierService, depth_of, discovered_of, log_write_failure, metadata_in,
    until_failure,
};
use crate::commit::SubmitTurn;
use crate::ingest::{Discovered, Known, Outcome};
use crate::service::{FrontierError, SharedFrontier, crawl_or_default};

/// Write calls (a PutURLs chunk, a PutDiscovered batch) in progress at
/// once. 256 batches of 256 URLs are 64 Ki writes, the most one group
/// takes, shared between the groups in the committer's two stages and the
/// one queued behind them; more would only queue in memory, and hold
/// blocking threads for their store reads that reads (GetURLs, GetStats)
/// need too.
pub(super) const WRITE_SLOTS: usize = 256;

/// Items of a PutURLs stream taken into one store transaction at most.
const PUT_BATCH: usize = 1024;

/// Chunks of one PutURLs stream between arrival and acknowledgement at
/// once: enough for the committer's two stages and the group queued
/// behind them.
const PUT_CHUNKS_IN_FLIGHT: usize = 4;

/// Batches of one PutDiscovered stream processed at once. The committer is a
/// two-stage pipeline (urls file, then due changes): while one group is in
/// each stage, the next group must already be queued behind them, or a stage
/// idles, and larger groups share the committer's per-group costs. Paired
/// runs of the 10 M URL bench (BENCHMARKS.md, "Frontier at 10 million
/// URLs"; the runs themselves are in its history) chose this over fewer;
/// acks still arrive in order because of `buffered`.
const DISCOVERED_BATCHES_IN_FLIGHT: usize = 64;

/// Runs a write as a task of its own once a write slot is free; the slot is
/// held until the write ends. The task runs to its end also when the caller
/// has gone away: writes queued with the committer are stored, and only
/// the rest of the write teaches the filters what they stored.
async fn detached_write<T: Send + 'static>(
    slots: Arc<Semaphore>,
    write: impl Future<Output = T> + Send + 'static,
) -> Result<T, Status> {
    let slot = slots
        .acquire_owned()
        .await
        .map_err(|_| Status::unavailable("the frontier is shutting down"))?;
    tokio::spawn(async move {
        let out = write.await;
        drop(slot);
        out
    })
    .await
    .map_err(|error| Status::internal(format!("handler failed: {error}")))
}

/// Why a run of writes failed: nothing of it is acknowledged.
#[derive(Debug, thiserror::Error)]
enum WriteFailure {
    #[error(transparent)]
    Frontier(#[from] FrontierError),
    #[error("the store read before the write failed: {0}")]
    Read(#[from] tokio::task::JoinError),
    #[error("the write is stored here but not on every copy in sync: {0}")]
    NotReplicated(#[from] crate::ingest::NotReplicated),
}

/// Items of one crawl and kind, written together.
enum Run<'a> {
    Discovered(&'a [Discovered]),
    Known(&'a [Known]),
}

impl Run<'_> {
    fn len(&self) -> usize {
        match self {
            Run::Discovered(items) => items.len(),
            Run::Known(items) => items.len(),
        }
    }
}

/// Writes one run and settles it. `turn` is given up once the run's
/// writes are queued (or refused).
async fn write_run(
    frontier: &SharedFrontier,
    crawl: &str,
    run: Run<'_>,
    turn: Option<SubmitTurn>,
) -> Result<Vec<Outcome>, WriteFailure> {
    write_runs(frontier, &[(crawl, run)], turn).await
}

/// Writes runs in one commit, which stores all of them or none, and
/// settles each; the outcomes are the runs' in order.
async fn write_runs(
    frontier: &SharedFrontier,
    runs: &[(&str, Run<'_>)],
    turn: Option<SubmitTurn>,
) -> Result<Vec<Outcome>, WriteFailure> {
    let mut joined: Option<crate::ingest::PreparedWrite> = None;
    for (crawl, run) in runs {
        let write = match run {
            Run::Discovered(items) => frontier.prepare_discovered(crawl, items)?,
            Run::Known(items) => frontier.prepare_known(crawl, items)?,
        };
        joined = Some(match joined {
            Some(before) => before.join(write),
            None => write,
        });
    }
    let Some(mut write) = joined else {
        return Ok(Vec::new());
    };
    if write.needs_store_reads() {
        let reader = Arc::clone(frontier);
        write = tokio::task::spawn_blocking(move || {
            reader.ingest().read_store(&mut write).map(|()| write)
        })
        .await?
        .map_err(FrontierError::from)?;
    }
    let partitions = write.partitions();
    let in_flight = frontier.ingest().submit(write);
    drop(turn);
    let outcomes = frontier
        .ingest()
        .committed(in_flight.map_err(FrontierError::from)?)
        .await
        .map_err(FrontierError::from)?;
    // Acknowledged only once every follower in sync holds it too.
    frontier
        .ingest()
        .replicas()
        .wait_for_followers(&partitions)
        .await?;
    let mut start = 0;
    for (crawl, run) in runs {
        let end = (start + run.len()).min(outcomes.len());
        let own = &outcomes[start..end];
        match run {
            Run::Discovered(_) => frontier.discovered_settled(crawl, own),
            Run::Known(items) => frontier.known_settled(crawl, items, own),
        }
        start = end;
    }
    Ok(outcomes)
}

impl UrlFrontierService {
    /// Stores one batch of discovered URLs (and the report it carries)
    /// here, as PutDiscovered does, answering its statuses after the
    /// commit (a cluster node's share of a batch it routes).
    pub(crate) async fn store_batch(
        &self,
        batch: uf::DiscoveredBatch,
    ) -> Result<uf::BatchAck, Status> {
        if batch.items.is_empty() && batch.done.is_none() {
            return Ok(uf::BatchAck {
                id: batch.id,
                ..uf::BatchAck::default()
            });
        }
        if let (_, Some(status)) = admitted(&self.frontier, batch_infos(&batch), |info| {
            info.crawl_id.as_str()
        }) {
            return Err(status);
        }
        let frontier = Arc::clone(&self.frontier);
        detached_write(Arc::clone(&self.write_slots), async move {
            batch_ack(&frontier, &batch).await
        })
        .await
    }

    /// Stores items here, as PutURLs does, answering one ack per item
    /// after the commit.
    pub(crate) async fn store_items(
        &self,
        items: Vec<uf::UrlItem>,
    ) -> Result<Vec<uf::AckMessage>, Status> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let (items, refused) = admitted(&self.frontier, items, |item| {
            item.info().map_or("", |info| info.crawl_id.as_str())
        });
        if let Some(status) = refused {
            return Err(status);
        }
        let frontier = Arc::clone(&self.frontier);
        let items: Vec<_> = items.into_iter().map(put_item_of).collect();
        detached_write(Arc::clone(&self.write_slots), async move {
            put_chunk(&frontier, items, None).await
        })
        .await
    }

    /// PutURLs. Whatever has arrived is taken together (up to
    /// [`PUT_BATCH`]), so a fast client's items share transactions and a
    /// slow one's are answered at once. Chunks reach the committer in the
    /// stream's order (two reports of one URL apply in the order sent), but
    /// a chunk does not wait for the one before it to commit: they share
    /// group commits, so one client's reports are not answered one commit
    /// at a time.
    pub(super) fn put_urls_stream(
        &self,
        items: Streaming<uf::UrlItem>,
    ) -> BoxStream<uf::AckMessage> {
        let frontier = Arc::clone(&self.frontier);
        let slots = Arc::clone(&self.write_slots);
        let owns = self.owns.clone();
        let mut previous = None;
        let acks = items
            .take_until(self.shutting_down())
            .ready_chunks(PUT_BATCH)
            .map(move |chunk| {
                let frontier = Arc::clone(&frontier);
                let slots = Arc::clone(&slots);
                let owns = owns.clone();
                let (turn, next) = SubmitTurn::after(previous.take());
                previous = Some(next);
                async move {
                    // Items before a message that fails (undecodable, too
                    // large) are stored and acked; the failure ends the
                    // stream after them.
                    let (items, failure) = until_failure(chunk);
                    let (items, refused) = admitted(&frontier, items, |item| {
                        item.info().map_or("", |info| info.crawl_id.as_str())
                    });
                    let failure = refused.or(failure);
                    let owned = owned_mask(owns.as_ref(), &items, uf::UrlItem::info);
                    let mut not_owned = Vec::new();
                    let mut mine = Vec::with_capacity(items.len());
                    for (item, &owned) in items.into_iter().zip(&owned) {
                        if owned {
                            mine.push(put_item_of(item));
                        } else {
                            not_owned.push(item.ack_id());
                        }
                    }
                    let items = mine;
                    let mut stored = Vec::new();
                    if !items.is_empty() {
                        let written = detached_write(slots, async move {
                            put_chunk(&frontier, items, Some(turn)).await
                        });
                        match written.await {
                            Ok(acks) => stored = acks,
                            Err(status) => return vec![Err(status)],
                        }
                    }
                    let mut not_owned = not_owned.into_iter().map(|id| uf::AckMessage {
                        id,
                        status: uf::ack_message::Status::Fail as i32,
                    });
                    let mut stored = stored.into_iter();
                    let mut acks: Vec<Result<uf::AckMessage, Status>> = owned
                        .iter()
                        .filter_map(|&owned| {
                            if owned {
                                stored.next()
                            } else {
                                not_owned.next()
                            }
                        })
                        .map(Ok)
                        .collect();
                    acks.extend(failure.map(Err));
                    acks
                }
            })
            .buffered(PUT_CHUNKS_IN_FLIGHT)
            .flat_map(futures::stream::iter);
        Box::pin(acks)
    }

    /// PutDiscovered. Several batches of one stream are in flight at once,
    /// so that one client's batches share group commits instead of each
    /// waiting for the last one's: discovered batches are independent of
    /// each other (the same URL in two of them is stored once either way).
    /// Acks keep the batches' order.
    pub(super) fn put_discovered_stream(
        &self,
        batches: Streaming<uf::DiscoveredBatch>,
    ) -> BoxStream<uf::BatchAck> {
        let frontier = Arc::clone(&self.frontier);
        let slots = Arc::clone(&self.write_slots);
        let owns = self.owns.clone();
        let acks = batches.take_until(self.shutting_down()).map(move |batch| {
            let frontier = Arc::clone(&frontier);
            let slots = Arc::clone(&slots);
            let owns = owns.clone();
            async move {
                let mut batch = batch.map_err(super::incoming_error)?;
                if batch.items.is_empty() && batch.done.is_none() {
                    return Ok(uf::BatchAck {
                        id: batch.id,
                        statuses: Vec::new(),
                        done: None,
                    });
                }
                let id = batch.id.clone();
                let (_, refused) = admitted(&frontier, batch_infos(&batch), |info| {
                    info.crawl_id.as_str()
                });
                if let Some(status) = refused {
                    return Err(status);
                }
                let owned = owned_mask(owns.as_ref(), &batch.items, |info| Some(info));
                batch.items = std::mem::take(&mut batch.items)
                    .into_iter()
                    .zip(&owned)
                    .filter_map(|(item, owned)| owned.then_some(item))
                    .collect();
                // A report this node does not own is left to its sender,
                // as its URLs are.
                let done_refused = batch.done.as_ref().is_some_and(|done| {
                    !owned_mask(owns.as_ref(), std::slice::from_ref(done), |done| {
                        done.info.as_ref()
                    })[0]
                });
                if done_refused {
                    batch.done = None;
                }
                let stored = if batch.items.is_empty() && batch.done.is_none() {
                    uf::BatchAck::default()
                } else {
                    detached_write(slots, async move { batch_ack(&frontier, &batch).await }).await?
                };
                let done = if done_refused {
                    Some(uf::ack_message::Status::Fail as i32)
                } else {
                    stored.done
                };
                let mut stored = stored.statuses.into_iter();
                let statuses = owned
                    .iter()
                    .map(|&owned| {
                        if owned {
                            stored
                                .next()
                                .unwrap_or(uf::ack_message::Status::Fail as i32)
                        } else {
                            uf::ack_message::Status::Fail as i32
                        }
                    })
                    .collect();
                Ok(uf::BatchAck { id, statuses, done })
            }
        });
        Box::pin(acks.buffered(DISCOVERED_BATCHES_IN_FLIGHT))
    }
}

/// The items before the first whose crawl the frontier will not start
/// (`--max-crawls`), and the refusal, which ends the call: SKIPPED would
/// drop the URLs unseen and FAIL would have them sent forever.
fn admitted<T>(
    frontier: &SharedFrontier,
    mut items: Vec<T>,
    crawl_of: impl Fn(&T) -> &str,
) -> (Vec<T>, Option<Status>) {
    let mut checked: Option<&str> = None;
    let mut refused = None;
    for (index, item) in items.iter().enumerate() {
        let crawl = crawl_of(item);
        if checked == Some(crawl) {
            continue;
        }
        if let Err(error) = frontier.admit_crawl(crawl) {
            refused = Some((index, super::status_of(error)));
            break;
        }
        checked = Some(crawl);
    }
    match refused {
        Some((index, status)) => {
            items.truncate(index);
            (items, Some(status))
        }
        None => (items, None),
    }
}

/// Per item, whether this node stores it: all when `owns` is unset.
/// Those it does not own are answered FAIL, which tells their sender to
/// send them again (to the owner its map names then).
fn owned_mask<T>(
    owns: Option<&super::OwnsUrl>,
    items: &[T],
    info: impl Fn(&T) -> Option<&uf::UrlInfo>,
) -> Vec<bool> {
    items
        .iter()
        .map(|item| match (owns, info(item)) {
            (Some(owns), Some(info)) => owns(info),
            _ => true,
        })
        .collect()
}

/// One item of a PutURLs stream, sorted into its kind.
enum PutItem {
    Discovered(String, Discovered),
    Known(String, Known),
    Invalid,
}

/// A report as the store takes it, the client's strings moved in.
fn known_of(info: uf::UrlInfo, due_at: u64) -> Known {
    let metadata = metadata_in(info.metadata);
    Known {
        url: info.url,
        queue_key: info.key,
        depth: depth_of(&metadata),
        due_at,
        metadata,
    }
}

fn put_item_of(item: uf::UrlItem) -> (String, PutItem) {
    let id = item.ack_id();
    let (info, kind) = match item.item {
        Some(uf::url_item::Item::Discovered(d)) => (d.info, None),
        Some(uf::url_item::Item::Known(k)) => (k.info, Some(k.refetchable_from_date)),
        None => (None, None),
    };
    let Some(info) = info else {
        return (id, PutItem::Invalid);
    };
    let crawl = crawl_or_default(&info.crawl_id).to_owned();
    match kind {
        None => (id, PutItem::Discovered(crawl, discovered_of(info))),
        Some(due_at) => (id, PutItem::Known(crawl, known_of(info, due_at))),
    }
}

fn status_code(outcome: &Outcome) -> uf::ack_message::Status {
    match outcome {
        Outcome::Stored => uf::ack_message::Status::Ok,
        Outcome::Skipped(_) => uf::ack_message::Status::Skipped,
    }
}

/// Applies one chunk of PutURLs items; runs of one crawl and kind go
/// through the frontier together, each committed before the next is
/// queued. A storage failure answers FAIL for the items it covered (they
/// were not stored; the client may resend).
async fn put_chunk(
    frontier: &SharedFrontier,
    items: Vec<(String, PutItem)>,
    mut turn: Option<SubmitTurn>,
) -> Vec<uf::AckMessage> {
    if let Some(turn) = &mut turn {
        // Waits holding a write slot, for a chunk that asked for its slot
        // earlier: the slots are handed out in order, so that chunk holds
        // one already, and the wait cannot close a cycle.
        turn.ready().await;
    }
    let mut statuses = vec![uf::ack_message::Status::Skipped; items.len()];
    let kinds: Vec<&'static str> = (items.iter())
        .map(|(_, item)| match item {
            PutItem::Known(..) => "known",
            PutItem::Discovered(..) | PutItem::Invalid => "discovered",
        })
        .collect();
    let mut items = items;
    let mut index = 0;
    while index < items.len() {
        let run_end = {
            let mut end = index + 1;
            while end < items.len() && same_run(&items[index].1, &items[end].1) {
                end += 1;
            }
            end
        };
        // The chunk's last write lets the stream's next chunk queue its
        // own behind it; earlier ones commit first, keeping the order.
        let last_turn = if run_end == items.len() {
            turn.take()
        } else {
            None
        };
        let run = &mut items[index..run_end];
        // A run's items are taken out of the chunk (only their ids and
        // kinds are left to answer with).
        let mut taken = run
            .iter_mut()
            .map(|(_, item)| std::mem::replace(item, PutItem::Invalid));
        let outcomes = match taken.next() {
            Some(PutItem::Discovered(crawl, first)) => {
                let batch: Vec<Discovered> = std::iter::once(first)
                    .chain(taken.filter_map(|item| match item {
                        PutItem::Discovered(_, d) => Some(d),
                        _ => None,
                    }))
                    .collect();
                Some(write_run(frontier, &crawl, Run::Discovered(&batch), last_turn).await)
            }
            Some(PutItem::Known(crawl, first)) => {
                let batch: Vec<Known> = std::iter::once(first)
                    .chain(taken.filter_map(|item| match item {
                        PutItem::Known(_, k) => Some(k),
                        _ => None,
                    }))
                    .collect();
                Some(write_run(frontier, &crawl, Run::Known(&batch), last_turn).await)
            }
            Some(PutItem::Invalid) | None => None,
        };
        match outcomes {
            Some(Ok(outcomes)) => {
                for (slot, outcome) in statuses[index..run_end].iter_mut().zip(&outcomes) {
                    *slot = status_code(outcome);
                }
            }
            Some(Err(error)) => {
                log_write_failure(&error, "PutURLs batch failed; its items are answered FAIL");
                statuses[index..run_end].fill(uf::ack_message::Status::Fail);
            }
            None => {}
        }
        index = run_end;
    }
    items
        .into_iter()
        .zip(statuses)
        .zip(kinds)
        .map(|(((id, _), status), kind)| {
            count_ack(kind, status);
            uf::AckMessage {
                id,
                status: status as i32,
            }
        })
        .collect()
}

fn count_ack(kind: &'static str, status: uf::ack_message::Status) {
    let status = match status {
        uf::ack_message::Status::Ok => "ok",
        uf::ack_message::Status::Skipped => "skipped",
        uf::ack_message::Status::Fail => "fail",
    };
    metrics::counter!("frontier_put_urls_total", "kind" => kind, "status" => status).increment(1);
}

fn same_run(a: &PutItem, b: &PutItem) -> bool {
    match (a, b) {
        (PutItem::Discovered(x, _), PutItem::Discovered(y, _)) => x == y,
        (PutItem::Known(x, _), PutItem::Known(y, _)) => x == y,
        (PutItem::Invalid, PutItem::Invalid) => true,
        _ => false,
    }
}

/// The URLs a batch names: its items, then its report's.
fn batch_infos(batch: &uf::DiscoveredBatch) -> Vec<&uf::UrlInfo> {
    let done = batch.done.as_ref().and_then(|done| done.info.as_ref());
    batch.items.iter().chain(done).collect()
}

/// The ack of one discovered batch: its statuses, in order, and its report's. The
/// items and the report are stored in one commit, so a page is never done
/// without its outlinks; a storage failure fails them all (nothing of the
/// batch was stored).
async fn batch_ack(frontier: &SharedFrontier, batch: &uf::DiscoveredBatch) -> uf::BatchAck {
    // Items may name different crawls: each run of one crawl goes together.
    let mut discovered: Vec<(&str, Vec<Discovered>)> = Vec::new();
    for info in &batch.items {
        let crawl = crawl_or_default(&info.crawl_id);
        match discovered.last_mut() {
            Some((last, items)) if *last == crawl => items.push(discovered_of(info.clone())),
            _ => discovered.push((crawl, vec![discovered_of(info.clone())])),
        }
    }
    let done = batch.done.as_ref().map(|done| {
        done.info.as_ref().map(|info| {
            (
                crawl_or_default(&info.crawl_id),
                [known_of(info.clone(), done.refetchable_from_date)],
            )
        })
    });
    let mut runs: Vec<(&str, Run<'_>)> = discovered
        .iter()
        .map(|(crawl, items)| (*crawl, Run::Discovered(items)))
        .collect();
    if let Some(Some((crawl, known))) = &done {
        runs.push((crawl, Run::Known(known)));
    }
    let items = batch.items.len();
    match write_runs(frontier, &runs, None).await {
        Ok(outcomes) => {
            let mut statuses: Vec<i32> = Vec::with_capacity(outcomes.len());
            for (index, outcome) in outcomes.iter().enumerate() {
                let status = status_code(outcome);
                count_ack(if index < items { "discovered" } else { "known" }, status);
                statuses.push(status as i32);
            }
            let done = match done {
                Some(Some(_)) => statuses.pop(),
                // A report without a URL is refused, as in PutURLs.
                Some(None) => {
                    count_ack("known", uf::ack_message::Status::Skipped);
                    Some(uf::ack_message::Status::Skipped as i32)
                }
                None => None,
            };
            uf::BatchAck {
                id: batch.id.clone(),
                statuses,
                done,
            }
        }
        Err(error) => {
            log_write_failure(
                &error,
                "PutDiscovered batch failed; its items are answered FAIL",
            );
            let fail = uf::ack_message::Status::Fail;
            for _ in 0..items {
                count_ack("discovered", fail);
            }
            if done.is_some() {
                count_ack("known", fail);
            }
            uf::BatchAck {
                id: batch.id.clone(),
                statuses: vec![fail as i32; items],
                done: done.map(|_| fail as i32),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write holds its slot while it runs, and waits for a free one, so
    /// the writes in progress stay bounded: with one slot, the second
    /// write runs only once the first has ended.
    #[tokio::test]
    async fn a_write_runs_only_in_a_free_slot() {
        let slots = Arc::new(Semaphore::new(1));
        let (started, first_running) = tokio::sync::oneshot::channel::<()>();
        let (release, hold) = tokio::sync::oneshot::channel::<()>();
        let first_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first = {
            let ended = Arc::clone(&first_ended);
            tokio::spawn(detached_write(Arc::clone(&slots), async move {
                started.send(()).unwrap();
                hold.await.unwrap();
                ended.store(true, std::sync::atomic::Ordering::SeqCst);
            }))
        };
        first_running.await.unwrap();
        assert_eq!(
            slots.available_permits(),
            0,
            "a running write holds no slot"
        );
        let second = {
            let ended = Arc::clone(&first_ended);
            tokio::spawn(detached_write(Arc::clone(&slots), async move {
                ended.load(std::sync::atomic::Ordering::SeqCst)
            }))
        };
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        assert!(
            second.await.unwrap().unwrap(),
            "the second write ran while the first held the only slot"
        );
        assert_eq!(slots.available_permits(), 1);
    }

    /// A write whose caller has gone runs to its end.
    #[tokio::test]
    async fn a_write_ends_when_its_caller_has_gone() {
        let slots = Arc::new(Semaphore::new(1));
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let (release, hold) = tokio::sync::oneshot::channel::<()>();
        let (ended, end) = tokio::sync::oneshot::channel::<()>();
        let caller = tokio::spawn(detached_write(Arc::clone(&slots), async move {
            started.send(()).unwrap();
            hold.await.unwrap();
            ended.send(()).unwrap();
        }));
        running.await.unwrap();
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        release.send(()).unwrap();
        end.await.unwrap();
    }
}
