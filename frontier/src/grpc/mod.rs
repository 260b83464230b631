//! The gRPC services over a [`Frontier`]: the URL Frontier API v2.6 and our
//! admin API. Handlers translate messages and run the frontier's blocking
//! work on tokio's blocking pool, except writes, which wait for their
//! commit without holding a thread; [`status_of`] is the one place errors
//! become gRPC statuses. This file holds the URL Frontier service and what
//! both share; `writes` its write path (PutURLs, PutDiscovered); `admin`
//! the admin service. Who may call what is checked in front of both
//! ([`crate::auth`]).

pub(crate) mod admin;
mod writes;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use proto::urlfrontier as uf;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status, Streaming};

pub use self::admin::AdminService;
use crate::ingest::{Discovered, IngestError};
use crate::record::UrlRecord;
use crate::scheduler::{Scheduler, ServeRequest, Served};
use crate::service::{Frontier, FrontierError, SharedFrontier, UrlFilter, crawl_or_default};

/// URLs of a GetURLs answer read ahead of the client.
const LEASE_CHANNEL: usize = 256;

/// The one mapping of frontier errors to gRPC statuses.
#[must_use]
pub fn status_of(error: FrontierError) -> Status {
    match error {
        FrontierError::InvalidArgument(message) => Status::invalid_argument(message),
        FrontierError::NotFound(message) => Status::not_found(message),
        FrontierError::ShuttingDown | FrontierError::NotReplicated(_) => {
            Status::unavailable(error.to_string())
        }
        FrontierError::Thread(_) => Status::internal(error.to_string()),
        FrontierError::TooManyCrawls { .. } => Status::resource_exhausted(error.to_string()),
        FrontierError::Ingest(error @ IngestError::PartitionMoving(_)) => {
            Status::unavailable(error.to_string())
        }
        FrontierError::Ingest(error) => {
            log_write_failure(&error, "storage failure");
            if error.is_disk_full() {
                Status::resource_exhausted(format!("nothing was stored: {error}"))
            } else {
                Status::unavailable(format!("storage failure, nothing was stored: {error}"))
            }
        }
    }
}

/// Logs a failed write, at most once every few seconds: while the disk is
/// full every write fails, and a line per batch would flood the log.
fn log_write_failure(error: &dyn std::fmt::Display, what: &str) {
    static THROTTLE: crate::throttle::Throttle =
        crate::throttle::Throttle::new(std::time::Duration::from_secs(10));
    if let Some(suppressed) = THROTTLE.admit() {
        tracing::error!(error = %error, suppressed, "{what}");
    }
}

/// A streamed request's error as the client should see it: a message over
/// the size limit is RESOURCE_EXHAUSTED (tonic reports OUT_OF_RANGE); an
/// undecodable one is INVALID_ARGUMENT already (`proto::codec`).
pub(crate) fn incoming_error(status: Status) -> Status {
    if status.code() == tonic::Code::OutOfRange {
        Status::resource_exhausted(status.message().to_owned())
    } else {
        status
    }
}

/// The messages of a chunk before the first that failed, and that
/// failure as the client should see it ([`incoming_error`]): the items
/// before it are stored and acked, and the failure ends the stream after
/// them.
pub(crate) fn until_failure<T>(chunk: Vec<Result<T, Status>>) -> (Vec<T>, Option<Status>) {
    let mut items = Vec::with_capacity(chunk.len());
    for item in chunk {
        match item {
            Ok(item) => items.push(item),
            Err(status) => return (items, Some(incoming_error(status))),
        }
    }
    (items, None)
}

/// Changes one queue's settings through `change` (given the crawl as
/// resolved and the queue key), refused while the queue's partition
/// moves; answered once the copies of its partition hold the change too.
async fn change_queue_settings(
    frontier: &SharedFrontier,
    crawl: &str,
    queue: &str,
    change: impl FnOnce(&Scheduler, &str, &str) -> Result<(), crate::store::StoreError> + Send + 'static,
) -> Result<(), Status> {
    let (crawl, queue) = (crawl_or_default(crawl).to_owned(), queue.to_owned());
    let (crawl, queue) = blocking(frontier, move |f| {
        f.queue_settings_open(&crawl, &queue)?;
        change(f.scheduler(), &crawl, &queue)?;
        Ok((crawl, queue))
    })
    .await?;
    frontier
        .replicate_queue_settings(&crawl, &queue)
        .await
        .map_err(status_of)
}

/// Runs blocking frontier work off the async threads.
async fn blocking<T: Send + 'static>(
    frontier: &SharedFrontier,
    work: impl FnOnce(&Frontier) -> Result<T, FrontierError> + Send + 'static,
) -> Result<T, Status> {
    let frontier = Arc::clone(frontier);
    tokio::task::spawn_blocking(move || work(&frontier))
        .await
        .map_err(|error| Status::internal(format!("handler failed: {error}")))?
        .map_err(status_of)
}

/// A client's metadata as stored: what the frontier sets on serving only
/// (the queue's delay) is left out, so a report that echoes it back does
/// not keep a stale copy.
fn metadata_in(metadata: BTreeMap<String, uf::StringList>) -> BTreeMap<String, Vec<String>> {
    metadata
        .into_iter()
        .filter(|(key, _)| key.as_str() != proto::metadata::QUEUE_DELAY_MS)
        .map(|(key, values)| (key, values.values))
        .collect()
}

fn metadata_out(metadata: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, uf::StringList> {
    metadata
        .iter()
        .map(|(key, values)| {
            (
                key.clone(),
                uf::StringList {
                    values: values.clone(),
                },
            )
        })
        .collect()
}

/// Depth of a discovered URL: the `depth` metadata a worker sends (parent's
/// depth + 1). Without it the URL counts as found on some page (depth 1),
/// so scope rules apply; seeds come through AddSeeds.
fn depth_of(metadata: &BTreeMap<String, Vec<String>>) -> u32 {
    metadata
        .get(proto::metadata::DEPTH)
        .and_then(|values| values.first())
        .and_then(|depth| depth.parse().ok())
        .unwrap_or(1)
}

/// A discovered URL as the store takes it, the client's strings moved in.
fn discovered_of(info: uf::UrlInfo) -> Discovered {
    let metadata = metadata_in(info.metadata);
    Discovered {
        url: info.url,
        queue_key: info.key,
        depth: depth_of(&metadata),
        metadata,
    }
}

fn url_item_of(url: String, record: &UrlRecord, crawl: &str) -> uf::UrlItem {
    uf::UrlItem {
        id: url.clone(),
        creation_date: record.created_at,
        item: Some(uf::url_item::Item::Known(uf::KnownUrlItem {
            info: Some(uf::UrlInfo {
                url,
                key: record.queue_key.clone(),
                metadata: metadata_out(&record.metadata),
                crawl_id: crawl.to_owned(),
            }),
            refetchable_from_date: record.due_at,
        })),
    }
}

/// A leased URL as GetURLs answers it, with its stored metadata and its
/// queue's delay; `None` when it was deleted before its record was read.
fn leased_info(frontier: &Frontier, served: Served) -> Result<Option<uf::UrlInfo>, Status> {
    let Some(stored) = frontier.leased_metadata(&served).map_err(status_of)? else {
        return Ok(None);
    };
    let mut metadata = metadata_out(&stored);
    metadata.insert(
        proto::metadata::QUEUE_DELAY_MS.to_owned(),
        uf::StringList {
            values: vec![served.delay.as_millis().to_string()],
        },
    );
    Ok(Some(uf::UrlInfo {
        metadata,
        url: served.url,
        key: served.queue,
        crawl_id: served.crawl,
    }))
}

/// Changes a module's log level at run time (SetLogLevel): given the
/// module (empty: every module) and the level name, answers an error text
/// when it cannot.
pub type LogControl = Arc<dyn Fn(&str, &str) -> Result<(), String> + Send + Sync>;

/// What the services need besides the frontier.
#[derive(Clone, Default)]
pub struct ServerOptions {
    /// Who may call what.
    pub access: crate::auth::Access,
    /// This node's address, for ListNodes (empty: the listener's).
    pub node: String,
    /// Run-time log levels; `None`: SetLogLevel answers UNIMPLEMENTED.
    pub log_control: Option<LogControl>,
    /// Connections served at once; 0: [`crate::server::MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// The cluster this node is in; `None`: a node of its own.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Serve TLS (and ask clients for certificates, when it names a CA);
    /// `None`: plaintext.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("access", &self.access)
            .field("node", &self.node)
            .field("max_connections", &self.max_connections)
            .field("log_control", &self.log_control.is_some())
            .field("cluster", &self.cluster)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ServerOptions {
    /// No token, the listener's address, no log control.
    #[must_use]
    pub fn open() -> Self {
        Self::default()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Whether this node owns a URL's partition (a cluster node's writes
/// forwarded by another node are taken only for its own partitions).
pub type OwnsUrl = Arc<dyn Fn(&uf::UrlInfo) -> bool + Send + Sync>;

/// Whether this node leads a URL's partition (crawl, URL): a cluster
/// node's share of a listing fanned out over every node.
pub type LedUrl = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// The URL Frontier API v2.6.
#[derive(Clone)]
pub struct UrlFrontierService {
    frontier: SharedFrontier,
    options: ServerOptions,
    /// Shared by every write call (see [`WRITE_SLOTS`]).
    write_slots: Arc<Semaphore>,
    /// Turns true when the server begins to shut down.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// When set, written items of URLs it does not own are answered FAIL
    /// instead of stored.
    owns: Option<OwnsUrl>,
    /// When set, ListURLs and CountURLs cover only the URLs it answers
    /// true for (the partitions this node leads, not the copies it
    /// follows, which their leaders list).
    lists: Option<LedUrl>,
}

impl std::fmt::Debug for UrlFrontierService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlFrontierService")
            .field("options", &self.options)
            .field("owned_only", &self.owns.is_some())
            .finish_non_exhaustive()
    }
}

impl UrlFrontierService {
    /// The service over a frontier (the token is checked in front of it,
    /// [`crate::auth::AuthLayer`]).
    #[must_use]
    pub fn new(frontier: SharedFrontier, options: ServerOptions) -> Self {
        Self {
            frontier,
            options,
            write_slots: Arc::new(Semaphore::new(writes::WRITE_SLOTS)),
            stopping: tokio::sync::watch::channel(false).1,
            owns: None,
            lists: None,
        }
    }

    /// The service listing and counting only the URLs `led` answers true
    /// for.
    #[must_use]
    pub fn listing_only(mut self, led: LedUrl) -> Self {
        self.lists = Some(led);
        self
    }

    /// The service storing only the URLs `owns` answers true for; the
    /// others are answered FAIL (sent again, they reach their owner).
    #[must_use]
    pub fn writing_only(mut self, owns: OwnsUrl) -> Self {
        self.owns = Some(owns);
        self
    }

    /// The service whose write streams end once `stopping` turns true.
    #[must_use]
    pub fn ending_streams_on(mut self, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stopping = stopping;
        self
    }

    /// Completes once the server begins to shut down. Write streams (which
    /// workers keep open for as long as they run) end then: what arrived
    /// before is stored and acknowledged, and the call ends, so that the
    /// shutdown does not wait on them.
    pub(crate) fn shutting_down(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.clone();
        async move {
            // No sender (a service not run by the server): never.
            if stopping.wait_for(|stopping| *stopping).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Items a page of ListURLs or ListQueues holds when the client asks for 0.
pub(crate) const DEFAULT_PAGE: usize = 100;

/// A stored URL as the API lists it.
fn listed(url: &str, record: &UrlRecord, crawl: &str) -> uf::UrlItem {
    url_item_of(url.to_owned(), record, crawl)
}

#[tonic::async_trait]
impl uf::url_frontier_server::UrlFrontier for UrlFrontierService {
    async fn list_nodes(&self, _: Request<uf::Empty>) -> Result<Response<uf::StringList>, Status> {
        // Not clustered: the node is its own cluster.
        Ok(Response::new(uf::StringList {
            values: vec![self.options.node.clone()],
        }))
    }

    async fn list_crawls(&self, _: Request<uf::Local>) -> Result<Response<uf::StringList>, Status> {
        let values = blocking(&self.frontier, |f| Ok(f.scheduler().crawls())).await?;
        Ok(Response::new(uf::StringList { values }))
    }

    async fn delete_crawl(
        &self,
        request: Request<uf::DeleteCrawlMessage>,
    ) -> Result<Response<uf::Long>, Status> {
        let crawl = request.into_inner().value;
        let value = blocking(&self.frontier, move |f| f.delete(&crawl, None, None)).await?;
        Ok(Response::new(uf::Long { value }))
    }

    async fn list_queues(
        &self,
        request: Request<uf::Pagination>,
    ) -> Result<Response<uf::QueueList>, Status> {
        let page = request.into_inner();
        let crawl = crawl_or_default(&page.crawl_id).to_owned();
        let size = if page.size == 0 {
            DEFAULT_PAGE
        } else {
            page.size as usize
        };
        let (values, total) = {
            let crawl = crawl.clone();
            blocking(&self.frontier, move |f| {
                Ok(f.list_queues(&crawl, page.start as usize, size, page.include_inactive))
            })
            .await?
        };
        Ok(Response::new(uf::QueueList {
            size: values.len() as u32,
            values,
            total: total as u64,
            start: page.start,
            crawl_id: crawl,
        }))
    }

    type GetURLsStream = BoxStream<uf::UrlInfo>;

    async fn get_ur_ls(
        &self,
        request: Request<uf::GetParams>,
    ) -> Result<Response<Self::GetURLsStream>, Status> {
        let hold_queues = request
            .metadata()
            .get(proto::metadata::HOLD_QUEUES_HEADER)
            .is_some_and(|value| value.as_bytes() == b"1");
        let params = request.into_inner();
        let crawl = match &params.item {
            Some(uf::get_params::Item::CrawlId(crawl)) => Some(crawl.clone()),
            Some(uf::get_params::Item::AnyCrawlId(_)) | None => None,
        };
        let serve = ServeRequest {
            max_urls_per_queue: params.max_urls_per_queue,
            max_queues: params.max_queues,
            queue: (!params.key.is_empty()).then_some(params.key),
            crawl,
            lease_secs: params.delay_requestable,
            max_urls: 0,
            hold_queues,
        };
        let served = blocking(&self.frontier, move |f| f.lease(serve)).await?;
        if !served.is_empty() {
            // On failure the URLs stay leased here until their leases run
            // out, and the client gets the error, not the URLs.
            self.frontier.leases_replicated().await.map_err(status_of)?;
        }
        // A URL whose queue kept its metadata needs no read: an answer of
        // only those is made here and encoded in one go, as most are.
        if served.iter().all(|served| served.metadata.is_some()) {
            let mut infos = Vec::with_capacity(served.len());
            for served in served {
                match leased_info(&self.frontier, served) {
                    Ok(Some(info)) => infos.push(Ok(info)),
                    Ok(None) => {}
                    Err(status) => {
                        infos.push(Err(status));
                        break;
                    }
                }
            }
            return Ok(Response::new(Box::pin(futures::stream::iter(infos))));
        }
        // Records are read on a blocking thread and sent as they come, so
        // an answer of many URLs is never held whole; a client that goes
        // away stops the reads (its leases run out as any do).
        let (sender, receiver) = tokio::sync::mpsc::channel(LEASE_CHANNEL);
        let frontier = Arc::clone(&self.frontier);
        tokio::task::spawn_blocking(move || {
            for served in served {
                let info = match leased_info(&frontier, served) {
                    Ok(Some(info)) => Ok(info),
                    Ok(None) => continue,
                    Err(status) => Err(status),
                };
                let failed = info.is_err();
                if sender.blocking_send(info).is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    type PutURLsStream = BoxStream<uf::AckMessage>;

    async fn put_ur_ls(
        &self,
        request: Request<Streaming<uf::UrlItem>>,
    ) -> Result<Response<Self::PutURLsStream>, Status> {
        Ok(Response::new(self.put_urls_stream(request.into_inner())))
    }

    type PutDiscoveredStream = BoxStream<uf::BatchAck>;

    async fn put_discovered(
        &self,
        request: Request<Streaming<uf::DiscoveredBatch>>,
    ) -> Result<Response<Self::PutDiscoveredStream>, Status> {
        Ok(Response::new(
            self.put_discovered_stream(request.into_inner()),
        ))
    }

    async fn get_stats(
        &self,
        request: Request<uf::QueueWithinCrawlParams>,
    ) -> Result<Response<uf::Stats>, Status> {
        let params = request.into_inner();
        let crawl = crawl_or_default(&params.crawl_id).to_owned();
        let counts = {
            let crawl = crawl.clone();
            blocking(&self.frontier, move |f| Ok(f.counts(&crawl, &params.key))).await?
        };
        let counts_map = [
            ("completed".to_owned(), counts.completed),
            ("active_queues".to_owned(), counts.active_queues),
        ]
        .into_iter()
        .collect();
        Ok(Response::new(uf::Stats {
            size: counts.not_completed(),
            in_process: u32::try_from(counts.leased).unwrap_or(u32::MAX),
            counts: counts_map,
            number_of_queues: counts.queues,
            crawl_id: crawl,
        }))
    }

    async fn delete_queue(
        &self,
        request: Request<uf::QueueWithinCrawlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        let params = request.into_inner();
        if params.key.is_empty() {
            return Err(Status::invalid_argument(
                "DeleteQueue needs a queue key (DeleteCrawl drops a whole crawl)",
            ));
        }
        let value = blocking(&self.frontier, move |f| {
            f.delete(&params.crawl_id, Some(&params.key), None)
        })
        .await?;
        Ok(Response::new(uf::Long { value }))
    }

    async fn block_queue_until(
        &self,
        request: Request<uf::BlockQueueParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        let params = request.into_inner();
        if params.key.is_empty() {
            return Err(Status::invalid_argument(
                "BlockQueueUntil needs a queue key",
            ));
        }
        let until = params.time;
        change_queue_settings(
            &self.frontier,
            &params.crawl_id,
            &params.key,
            move |s, c, q| s.block_until(c, q, until),
        )
        .await?;
        Ok(Response::new(uf::Empty {}))
    }

    async fn set_active(
        &self,
        request: Request<uf::Active>,
    ) -> Result<Response<uf::Empty>, Status> {
        let state = request.into_inner().state;
        blocking(&self.frontier, move |f| {
            Ok(f.scheduler().set_active(state)?)
        })
        .await?;
        Ok(Response::new(uf::Empty {}))
    }

    async fn get_active(&self, _: Request<uf::Local>) -> Result<Response<uf::Boolean>, Status> {
        Ok(Response::new(uf::Boolean {
            state: self.frontier.scheduler().is_active(),
        }))
    }

    async fn set_delay(
        &self,
        request: Request<uf::QueueDelayParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        let params = request.into_inner();
        let secs = params.delay_requestable;
        if params.key.is_empty() {
            // The crawl's default: every node is asked (fanned out).
            blocking(&self.frontier, move |f| {
                Ok(f.scheduler()
                    .set_delay(crawl_or_default(&params.crawl_id), "", secs)?)
            })
            .await?;
        } else {
            change_queue_settings(
                &self.frontier,
                &params.crawl_id,
                &params.key,
                move |s, c, q| s.set_delay(c, q, secs),
            )
            .await?;
        }
        Ok(Response::new(uf::Empty {}))
    }

    async fn set_log_level(
        &self,
        request: Request<uf::LogLevelParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        let Some(control) = &self.options.log_control else {
            return Err(Status::unimplemented(
                "this frontier's log levels cannot change at run time",
            ));
        };
        let params = request.into_inner();
        let level = match params.level() {
            uf::log_level_params::Level::Trace => "trace",
            uf::log_level_params::Level::Debug => "debug",
            uf::log_level_params::Level::Info => "info",
            uf::log_level_params::Level::Warn => "warn",
            uf::log_level_params::Level::Error => "error",
        };
        control(&params.package, level).map_err(Status::invalid_argument)?;
        tracing::info!(module = %params.package, level, "log level changed");
        Ok(Response::new(uf::Empty {}))
    }

    async fn set_crawl_limit(
        &self,
        request: Request<uf::CrawlLimitParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        let params = request.into_inner();
        if params.key.is_empty() {
            return Err(Status::invalid_argument("SetCrawlLimit needs a queue key"));
        }
        let limit = params.limit;
        change_queue_settings(
            &self.frontier,
            &params.crawl_id,
            &params.key,
            move |s, c, q| s.set_crawl_limit(c, q, limit),
        )
        .await?;
        Ok(Response::new(uf::Empty {}))
    }

    async fn get_url_status(
        &self,
        request: Request<uf::UrlStatusRequest>,
    ) -> Result<Response<uf::UrlItem>, Status> {
        let params = request.into_inner();
        let crawl = crawl_or_default(&params.crawl_id).to_owned();
        let lookup = {
            let (crawl, url) = (crawl.clone(), params.url.clone());
            blocking(&self.frontier, move |f| f.url_status(&crawl, &url)).await?
        };
        match lookup {
            Some(status) => Ok(Response::new(url_item_of(
                status.canonical,
                &status.record,
                &crawl,
            ))),
            None => Err(Status::not_found(format!(
                "crawl {crawl:?} does not know {:?}",
                params.url
            ))),
        }
    }

    type ListURLsStream = BoxStream<uf::UrlItem>;

    async fn list_ur_ls(
        &self,
        request: Request<uf::ListUrlParams>,
    ) -> Result<Response<Self::ListURLsStream>, Status> {
        let params = request.into_inner();
        let crawl = crawl_or_default(&params.crawl_id).to_owned();
        let filter = UrlFilter::new(
            (!params.key.is_empty()).then(|| params.key.clone()),
            params.filter.clone().filter(|f| !f.is_empty()),
            params.ignore_case.unwrap_or(false),
        );
        let skip = params.start as usize;
        let size = if params.size == 0 {
            DEFAULT_PAGE
        } else {
            params.size as usize
        };
        // Streamed from one store snapshot through a small channel: a page
        // of any size costs the channel's few items of memory.
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let frontier = Arc::clone(&self.frontier);
        let led = self.lists.clone();
        tokio::task::spawn_blocking(move || {
            let mut seen = 0_usize;
            let mut sent = 0_usize;
            let scanned = frontier.scan_urls(&crawl, &filter, |url, record| {
                if led.as_ref().is_some_and(|led| !led(&crawl, url)) {
                    return true;
                }
                seen += 1;
                if seen <= skip {
                    return true;
                }
                if sender
                    .blocking_send(Ok(listed(url, record, &crawl)))
                    .is_err()
                {
                    return false; // the client went away
                }
                sent += 1;
                sent < size
            });
            if let Err(error) = scanned {
                let _ = sender.blocking_send(Err(status_of(error)));
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn count_ur_ls(
        &self,
        request: Request<uf::CountUrlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        let params = request.into_inner();
        let filter = UrlFilter::new(
            (!params.key.is_empty()).then(|| params.key.clone()),
            params.filter.clone().filter(|f| !f.is_empty()),
            params.ignore_case.unwrap_or(false),
        );
        let led = self.lists.clone();
        let value = blocking(&self.frontier, move |f| {
            let mut count = 0;
            let crawl = crawl_or_default(&params.crawl_id);
            f.scan_urls(&params.crawl_id, &filter, |url, _| {
                if led.as_ref().is_none_or(|led| led(crawl, url)) {
                    count += 1;
                }
                true
            })?;
            Ok(count)
        })
        .await?;
        Ok(Response::new(uf::Long { value }))
    }

    async fn purge_ur_ls(
        &self,
        request: Request<uf::PurgeUrlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        let params = request.into_inner();
        let before = crate::time::Timestamp::now()
            .unix_secs()
            .saturating_sub(u64::from(params.days) * 86_400);
        let value = blocking(&self.frontier, move |f| {
            let queue = (!params.key.is_empty()).then_some(params.key.as_str());
            f.delete(&params.crawl_id, queue, Some(before))
        })
        .await?;
        Ok(Response::new(uf::Long { value }))
    }
}
