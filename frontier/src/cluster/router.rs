//! A cluster node's URL Frontier service: what it can answer from its own
//! partitions it hands to the node's local service; puts are split by
//! owning partition; calls about one queue go to its owner; the rest reach
//! every node and are merged, unless the call says `local`.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use proto::urlfrontier::{self as uf, url_frontier_server::UrlFrontier};
use tonic::{Request, Response, Status, Streaming};

use super::coordinator::{SettingChange, record_setting};
use super::peers::forwarded;
use super::protocol::{self, BatchAnswers, ShareAnswer};
use super::{Cluster, Owner};
use crate::grpc::UrlFrontierService;
use crate::service::crawl_or_default;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Batches of one PutDiscovered stream routed at once (each waits for its
/// owners' commits).
const BATCHES_IN_FLIGHT: usize = 64;

/// Items of a PutURLs stream routed together.
const PUT_CHUNK: usize = 1024;

/// Where one call goes.
type Target = super::Target<
    UrlFrontierService,
    uf::url_frontier_client::UrlFrontierClient<
        tonic::service::interceptor::InterceptedService<
            tonic::transport::Channel,
            proto::bearer::Bearer,
        >,
    >,
>;

/// A call about one queue: served here when forwarded or `local`, else
/// sent to the queue's owner marked `local`.
macro_rules! at_queue_owner {
    ($self:ident, $request:ident, $method:ident, $params:ident) => {{
        if $self.cluster.accept_forwarded(&$request)? || $request.get_ref().local {
            return $self.local.$method($request).await;
        }
        let params = uf::$params {
            local: true,
            ..$request.into_inner()
        };
        let answer = call_at!(
            $self.queue_owner(&params.crawl_id, &params.key).await?,
            $method,
            params
        )?;
        Ok(Response::new(answer))
    }};
}

/// The URL Frontier service of a cluster node.
#[derive(Clone)]
pub struct ClusterRouter {
    local: UrlFrontierService,
    // The local service for writes forwarded by other nodes: it stores only
    // what this node owns under its map.
    forwarded: UrlFrontierService,
    // The local service for listings fanned out by another node: only the
    // partitions this node leads (its followers' copies are listed by
    // their leaders).
    fanned: UrlFrontierService,
    cluster: Arc<Cluster>,
}

impl std::fmt::Debug for ClusterRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRouter")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl ClusterRouter {
    /// The service of a node whose own partitions `local` serves.
    #[must_use]
    pub fn new(local: UrlFrontierService, cluster: Arc<Cluster>) -> Self {
        let owner = Arc::clone(&cluster);
        let forwarded = local
            .clone()
            .writing_only(Arc::new(move |info: &uf::UrlInfo| {
                owner.owns_url(&info.crawl_id, &info.url)
            }));
        let leader = Arc::clone(&cluster);
        let fanned = local
            .clone()
            .listing_only(Arc::new(move |crawl: &str, url: &str| {
                leader
                    .partition_of_url(crawl, url)
                    .is_none_or(|partition| matches!(leader.owner_of(partition), Ok(Owner::Local)))
            }));
        Self {
            local,
            forwarded,
            fanned,
            cluster,
        }
    }

    fn target(&self, owner: Owner) -> Result<Target, Status> {
        self.cluster
            .target(owner, &self.local, super::peers::Peer::frontier)
    }

    /// The owner of a queue, for calls that change it (the key is taken as
    /// the host, as it is by default), once its partition is past any
    /// cutover.
    async fn queue_owner(&self, crawl: &str, key: &str) -> Result<Target, Status> {
        let partition = self.cluster.partition_of_host(crawl, key);
        self.cluster.past_cutovers([partition]).await;
        self.target(self.cluster.owner_of(partition)?)
    }

    /// Runs `call` on every node (see [`super::on_nodes`]).
    async fn on_nodes<T, F, Fut>(
        &self,
        live_only: bool,
        call: F,
    ) -> Result<Vec<(String, T)>, Status>
    where
        F: Fn(Target) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.on_nodes_as(&self.local, live_only, call).await
    }

    /// Runs `call` on every node, this one through `local`.
    async fn on_nodes_as<T, F, Fut>(
        &self,
        local: &UrlFrontierService,
        live_only: bool,
        call: F,
    ) -> Result<Vec<(String, T)>, Status>
    where
        F: Fn(Target) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        super::riding_out_map_changes(|| {
            let targets = self.cluster.targets(local, super::peers::Peer::frontier);
            super::on_nodes(targets, live_only, &call)
        })
        .await
    }
}

/// Every node's answer, without the node IDs.
fn answers<T>(answers: Vec<(String, T)>) -> impl Iterator<Item = T> {
    answers.into_iter().map(|(_, answer)| answer)
}

/// Items, given by their partitions, split by owner once those partitions
/// are past any cutover, with the map epoch the split was made under
/// (owners away are logged; their items stay FAIL).
async fn split_past_cutovers(
    cluster: &Cluster,
    partitions: Vec<Option<usize>>,
) -> (u64, super::Shares) {
    cluster
        .past_cutovers(partitions.iter().copied().flatten())
        .await;
    // The epoch before the split: if the map changes between the two, the
    // owner refuses the older epoch rather than taking a share it no
    // longer owns.
    let epoch = cluster.epoch();
    let split = cluster.shares(partitions);
    if let Some(status) = &split.away {
        log_unrouted(status);
    }
    (epoch, split)
}

/// Routes one batch: each URL to its partition's owner, the statuses back
/// in order once every owner has committed its share. URLs whose owner
/// cannot be reached are answered FAIL (the client sends them again).
///
/// A report the batch carries (`done`) goes to its owner with that node's
/// share, after every other share is stored: the page is done only once
/// its outlinks are durable wherever they live. If one of them is not,
/// the report is answered FAIL and not stored.
async fn route_batch(
    local: UrlFrontierService,
    cluster: Arc<Cluster>,
    mut batch: uf::DiscoveredBatch,
) -> Result<uf::BatchAck, Status> {
    let items = batch.items.len();
    let done = batch.done.take();
    let mut partitions: Vec<Option<usize>> = batch
        .items
        .iter()
        .map(|info| cluster.partition_of_url(&info.crawl_id, &info.url))
        .collect();
    if let Some(done) = &done {
        partitions.push(
            done.info
                .as_ref()
                .and_then(|info| cluster.partition_of_url(&info.crawl_id, &info.url)),
        );
    }
    let (epoch, split) = split_past_cutovers(&cluster, partitions).await;
    let route = protocol::route(split.by_owner, items, done.is_some());
    let mut answers = BatchAnswers::new(items, done.is_some(), split.away.is_some());
    let send = |owner: Owner, indexes: Vec<usize>, done: Option<uf::KnownUrlItem>| {
        // The report's index is past the items: it names none of them.
        let items: Vec<uf::UrlInfo> = (indexes.iter())
            .filter_map(|&i| batch.items.get(i).cloned())
            .collect();
        let share = uf::DiscoveredBatch {
            id: batch.id.clone(),
            items,
            done,
        };
        let local = local.clone();
        let cluster = Arc::clone(&cluster);
        async move {
            let answer = match owner {
                Owner::Local => local.store_batch(share).await,
                Owner::Remote(member) => match cluster.peers.get(&member.endpoint()) {
                    Ok(peer) => peer.put_discovered(share, epoch).await,
                    Err(status) => Err(status),
                },
            };
            (indexes, answer)
        }
    };
    let first = (route.first.into_iter()).map(|(owner, indexes)| send(owner, indexes, None));
    for (indexes, answer) in futures::future::join_all(first).await {
        answers.place(&indexes, share_answer(answer)?, false);
    }
    if let Some((owner, indexes)) = route.last {
        // With an outlink not stored, the page stays undone: its report
        // goes nowhere and is answered FAIL, so the client sends both
        // again.
        let done = done.filter(|_| answers.report_may_go());
        let carried = done.is_some();
        let (indexes, answer) = send(owner, indexes, done).await;
        answers.place(&indexes, share_answer(answer)?, carried);
    }
    let (statuses, done) = answers.finish();
    Ok(uf::BatchAck {
        id: batch.id,
        statuses,
        done,
    })
}

/// An owner's answer to its share; storage failures other than an owner
/// out of reach are the client's to retry, as on one node.
fn share_answer(answer: Result<uf::BatchAck, Status>) -> Result<ShareAnswer, Status> {
    match answer {
        Ok(ack) => Ok(ShareAnswer::Answered {
            statuses: ack.statuses,
            report: ack.done,
        }),
        Err(status) if status.code() != tonic::Code::Unavailable => Err(status),
        Err(status) => {
            log_unrouted(&status);
            Ok(ShareAnswer::NotStored)
        }
    }
}

/// Routes PutURLs items like [`route_batch`], one ack per item in order.
async fn route_items(
    local: UrlFrontierService,
    cluster: Arc<Cluster>,
    items: Vec<uf::UrlItem>,
) -> Result<Vec<uf::AckMessage>, Status> {
    let mut acks: Vec<uf::AckMessage> = items
        .iter()
        .map(|item| uf::AckMessage {
            id: item.ack_id(),
            status: uf::ack_message::Status::Fail as i32,
        })
        .collect();
    let partitions = items
        .iter()
        .map(|item| {
            item.info()
                .and_then(|info| cluster.partition_of_url(&info.crawl_id, &info.url))
        })
        .collect();
    let (epoch, split) = split_past_cutovers(&cluster, partitions).await;
    let shares = split.by_owner.into_iter().map(|(owner, indexes)| {
        let share: Vec<uf::UrlItem> = indexes.iter().map(|&i| items[i].clone()).collect();
        let local = local.clone();
        let cluster = Arc::clone(&cluster);
        async move {
            let answer: Vec<Result<i32, Status>> = match owner {
                Owner::Local => match local.store_items(share).await {
                    Ok(acks) => acks.into_iter().map(|ack| Ok(ack.status)).collect(),
                    Err(status) => vec![Err(status); indexes.len()],
                },
                Owner::Remote(member) => match cluster.peers.get(&member.endpoint()) {
                    Ok(peer) => peer.put_urls(share, epoch).await,
                    Err(status) => vec![Err(status); indexes.len()],
                },
            };
            (indexes, answer)
        }
    });
    for (indexes, answer) in futures::future::join_all(shares).await {
        for (index, status) in indexes.into_iter().zip(answer) {
            match status {
                Ok(status) => acks[index].status = status,
                Err(status) if status.code() != tonic::Code::Unavailable => return Err(status),
                Err(status) => log_unrouted(&status),
            }
        }
    }
    Ok(acks)
}

fn log_unrouted(status: &Status) {
    static UNROUTED: crate::throttle::Throttle =
        crate::throttle::Throttle::new(std::time::Duration::from_secs(10));
    if let Some(suppressed) = UNROUTED.admit() {
        tracing::warn!(
            reason = status.message(),
            suppressed,
            "URLs answered FAIL: their owner cannot take them now"
        );
    }
}

/// Collects a ListURLs answer.
async fn collect_listing(
    target: Target,
    params: uf::ListUrlParams,
) -> Result<Vec<uf::UrlItem>, Status> {
    let mut stream: BoxStream<uf::UrlItem> = match target {
        Target::Local(service) => service.list_ur_ls(Request::new(params)).await?.into_inner(),
        Target::Remote(mut client, epoch) => Box::pin(
            client
                .list_ur_ls(forwarded(params, epoch))
                .await?
                .into_inner(),
        ),
    };
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        items.push(item?);
    }
    Ok(items)
}

/// Every node's count, summed.
fn summed_longs(counts: Vec<(String, uf::Long)>) -> uf::Long {
    uf::Long {
        value: answers(counts).map(|c| c.value).sum(),
    }
}

/// A page of a listing merged from every node: each is asked for all up
/// to the page's end, and the page is cut from the merged, ordered whole.
struct Page {
    start: u32,
    size: u32,
}

impl Page {
    fn of(start: u32, size: u32) -> Self {
        let size = if size == 0 {
            crate::grpc::DEFAULT_PAGE as u32
        } else {
            size
        };
        Self { start, size }
    }

    fn end(&self) -> u32 {
        self.start.saturating_add(self.size)
    }

    fn cut<T>(&self, items: Vec<T>) -> Vec<T> {
        items
            .into_iter()
            .skip(self.start as usize)
            .take(self.size as usize)
            .collect()
    }
}

fn is_completed(item: &uf::UrlItem) -> bool {
    matches!(&item.item, Some(uf::url_item::Item::Known(known)) if known.refetchable_from_date == 0)
}

#[tonic::async_trait]
impl UrlFrontier for ClusterRouter {
    async fn list_nodes(&self, _: Request<uf::Empty>) -> Result<Response<uf::StringList>, Status> {
        let view = self.cluster.view();
        let mut values: Vec<String> = view.members.values().map(|m| m.address.clone()).collect();
        if !view.members.contains_key(self.cluster.node_id()) {
            values.push(self.cluster.options.advertise.clone());
        }
        values.sort();
        Ok(Response::new(uf::StringList { values }))
    }

    async fn list_crawls(
        &self,
        request: Request<uf::Local>,
    ) -> Result<Response<uf::StringList>, Status> {
        if request.get_ref().local {
            return self.local.list_crawls(request).await;
        }
        let lists = fan_out!(self, false, list_crawls, uf::Local { local: true })?;
        let values: BTreeSet<String> = answers(lists).flat_map(|l| l.values).collect();
        Ok(Response::new(uf::StringList {
            values: values.into_iter().collect(),
        }))
    }

    async fn delete_crawl(
        &self,
        request: Request<uf::DeleteCrawlMessage>,
    ) -> Result<Response<uf::Long>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.delete_crawl(request).await;
        }
        let params = uf::DeleteCrawlMessage {
            local: true,
            ..request.into_inner()
        };
        let crawl = crawl_or_default(&params.value).to_owned();
        let counts = fan_out!(self, false, delete_crawl, params)?;
        record_setting(&self.cluster, SettingChange::ForgetCrawl { crawl: &crawl }).await?;
        Ok(Response::new(summed_longs(counts)))
    }

    async fn list_queues(
        &self,
        request: Request<uf::Pagination>,
    ) -> Result<Response<uf::QueueList>, Status> {
        if request.get_ref().local {
            return self.local.list_queues(request).await;
        }
        let request = request.into_inner();
        let page = Page::of(request.start, request.size);
        let params = uf::Pagination {
            start: 0,
            size: page.end(),
            local: true,
            ..request.clone()
        };
        let lists = fan_out!(self, false, list_queues, params)?;
        let total = lists.iter().map(|(_, l)| l.total).sum();
        let mut values: Vec<String> = answers(lists).flat_map(|l| l.values).collect();
        values.sort();
        let values = page.cut(values);
        Ok(Response::new(uf::QueueList {
            size: values.len() as u32,
            values,
            total,
            start: request.start,
            crawl_id: crawl_or_default(&request.crawl_id).to_owned(),
        }))
    }

    type GetURLsStream = BoxStream<uf::UrlInfo>;

    async fn get_ur_ls(
        &self,
        request: Request<uf::GetParams>,
    ) -> Result<Response<Self::GetURLsStream>, Status> {
        // A node serves its own partitions; workers lease from every node.
        self.cluster.check_registered()?;
        self.local.get_ur_ls(request).await
    }

    type PutURLsStream = BoxStream<uf::AckMessage>;

    async fn put_ur_ls(
        &self,
        request: Request<Streaming<uf::UrlItem>>,
    ) -> Result<Response<Self::PutURLsStream>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.forwarded.put_ur_ls(request).await;
        }
        let local = self.local.clone();
        let cluster = Arc::clone(&self.cluster);
        let acks = request
            .into_inner()
            .take_until(self.local.shutting_down())
            .ready_chunks(PUT_CHUNK)
            .then(move |chunk| {
                let local = local.clone();
                let cluster = Arc::clone(&cluster);
                async move {
                    let (items, failure) = crate::grpc::until_failure(chunk);
                    let mut out: Vec<Result<uf::AckMessage, Status>> = Vec::new();
                    match route_items(local, cluster, items).await {
                        Ok(acks) => out.extend(acks.into_iter().map(Ok)),
                        Err(status) => out.push(Err(status)),
                    }
                    out.extend(failure.map(Err));
                    out
                }
            })
            .flat_map(futures::stream::iter);
        Ok(Response::new(Box::pin(acks)))
    }

    type PutDiscoveredStream = BoxStream<uf::BatchAck>;

    async fn put_discovered(
        &self,
        request: Request<Streaming<uf::DiscoveredBatch>>,
    ) -> Result<Response<Self::PutDiscoveredStream>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.forwarded.put_discovered(request).await;
        }
        let local = self.local.clone();
        let cluster = Arc::clone(&self.cluster);
        let acks = request
            .into_inner()
            .take_until(self.local.shutting_down())
            .map(move |batch| {
                let local = local.clone();
                let cluster = Arc::clone(&cluster);
                async move {
                    let batch = batch.map_err(crate::grpc::incoming_error)?;
                    route_batch(local, cluster, batch).await
                }
            });
        Ok(Response::new(Box::pin(acks.buffered(BATCHES_IN_FLIGHT))))
    }

    async fn get_stats(
        &self,
        request: Request<uf::QueueWithinCrawlParams>,
    ) -> Result<Response<uf::Stats>, Status> {
        if request.get_ref().local {
            return self.local.get_stats(request).await;
        }
        let params = uf::QueueWithinCrawlParams {
            local: true,
            ..request.into_inner()
        };
        let all = fan_out!(self, false, get_stats, params.clone())?;
        let mut sum = uf::Stats {
            crawl_id: crawl_or_default(&params.crawl_id).to_owned(),
            ..uf::Stats::default()
        };
        for stats in answers(all) {
            sum.size += stats.size;
            sum.in_process = sum.in_process.saturating_add(stats.in_process);
            sum.number_of_queues += stats.number_of_queues;
            for (key, value) in stats.counts {
                *sum.counts.entry(key).or_default() += value;
            }
        }
        Ok(Response::new(sum))
    }

    async fn delete_queue(
        &self,
        request: Request<uf::QueueWithinCrawlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        at_queue_owner!(self, request, delete_queue, QueueWithinCrawlParams)
    }

    async fn block_queue_until(
        &self,
        request: Request<uf::BlockQueueParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        at_queue_owner!(self, request, block_queue_until, BlockQueueParams)
    }

    async fn set_active(
        &self,
        request: Request<uf::Active>,
    ) -> Result<Response<uf::Empty>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.set_active(request).await;
        }
        let state = request.into_inner().state;
        record_setting(&self.cluster, SettingChange::Active(state)).await?;
        fan_out!(self, true, set_active, uf::Active { state, local: true })?;
        Ok(Response::new(uf::Empty {}))
    }

    async fn get_active(
        &self,
        request: Request<uf::Local>,
    ) -> Result<Response<uf::Boolean>, Status> {
        if request.get_ref().local {
            return self.local.get_active(request).await;
        }
        let all = fan_out!(self, false, get_active, uf::Local { local: true })?;
        Ok(Response::new(uf::Boolean {
            state: all.iter().all(|(_, b)| b.state),
        }))
    }

    async fn set_delay(
        &self,
        request: Request<uf::QueueDelayParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.set_delay(request).await;
        }
        let params = uf::QueueDelayParams {
            local: true,
            ..request.into_inner()
        };
        if params.key.is_empty() {
            // A crawl's default delay: every node, now and after restarts.
            record_setting(
                &self.cluster,
                SettingChange::Delay {
                    crawl: crawl_or_default(&params.crawl_id),
                    secs: params.delay_requestable,
                },
            )
            .await?;
            fan_out!(self, true, set_delay, params)?;
            return Ok(Response::new(uf::Empty {}));
        }
        let answer = call_at!(
            self.queue_owner(&params.crawl_id, &params.key).await?,
            set_delay,
            params
        )?;
        Ok(Response::new(answer))
    }

    async fn set_log_level(
        &self,
        request: Request<uf::LogLevelParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        if self.cluster.accept_forwarded(&request)? || request.get_ref().local {
            return self.local.set_log_level(request).await;
        }
        let params = uf::LogLevelParams {
            local: true,
            ..request.into_inner()
        };
        fan_out!(self, false, set_log_level, params)?;
        Ok(Response::new(uf::Empty {}))
    }

    async fn set_crawl_limit(
        &self,
        request: Request<uf::CrawlLimitParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        at_queue_owner!(self, request, set_crawl_limit, CrawlLimitParams)
    }

    async fn get_url_status(
        &self,
        request: Request<uf::UrlStatusRequest>,
    ) -> Result<Response<uf::UrlItem>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.local.get_url_status(request).await;
        }
        let params = request.into_inner();
        let Some(partition) = self.cluster.partition_of_url(&params.crawl_id, &params.url) else {
            return self.local.get_url_status(Request::new(params)).await;
        };
        let answer = call_at!(
            self.target(self.cluster.owner_of(partition)?)?,
            get_url_status,
            params
        )?;
        Ok(Response::new(answer))
    }

    type ListURLsStream = BoxStream<uf::UrlItem>;

    async fn list_ur_ls(
        &self,
        request: Request<uf::ListUrlParams>,
    ) -> Result<Response<Self::ListURLsStream>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.fanned.list_ur_ls(request).await;
        }
        if request.get_ref().local {
            return self.local.list_ur_ls(request).await;
        }
        let request = request.into_inner();
        let page = Page::of(request.start, request.size);
        let params = uf::ListUrlParams {
            start: 0,
            size: page.end(),
            local: true,
            ..request
        };
        // Each node lists the partitions it leads, this one too.
        let lists = self
            .on_nodes_as(&self.fanned, false, |target| {
                collect_listing(target, params.clone())
            })
            .await?;
        let mut items: Vec<uf::UrlItem> = answers(lists).flatten().collect();
        // Completed URLs first, as on one node.
        items.sort_by_key(|item| !is_completed(item));
        let items = page.cut(items).into_iter().map(Ok);
        Ok(Response::new(Box::pin(futures::stream::iter(items))))
    }

    async fn count_ur_ls(
        &self,
        request: Request<uf::CountUrlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.fanned.count_ur_ls(request).await;
        }
        if request.get_ref().local == Some(true) {
            return self.local.count_ur_ls(request).await;
        }
        let params = uf::CountUrlParams {
            local: Some(true),
            ..request.into_inner()
        };
        let counts = self
            .on_nodes_as(&self.fanned, false, |target| {
                let params = params.clone();
                async move { call!(target, count_ur_ls, params) }
            })
            .await?;
        Ok(Response::new(summed_longs(counts)))
    }

    async fn purge_ur_ls(
        &self,
        request: Request<uf::PurgeUrlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        if self.cluster.accept_forwarded(&request)? {
            return self.local.purge_ur_ls(request).await;
        }
        let counts = fan_out!(self, false, purge_ur_ls, request.into_inner())?;
        Ok(Response::new(summed_longs(counts)))
    }
}
