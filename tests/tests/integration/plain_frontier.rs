//! Our worker against a minimal URL Frontier v2.6 server that stores URLs
//! exactly as given (as the API's reference implementation does, leaving
//! canonicalisation to clients) and serves nothing of this project's
//! extensions (no PutDiscovered, no admin service): the worker sends its
//! outlinks in canonical spelling, falls back to PutURLs and whole-second
//! delays, and so fetches every page of the mock site exactly once. The
//! same server with PutDiscovered but without reports in batches (a
//! frontier from before them) gets each page's report by PutURLs.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crawl_tests::WorkerProcess;
use futures::Stream;
use mock_site::{MockSite, SiteConfig, expected_fetches};
use proto::urlfrontier::{
    self as uf,
    url_frontier_server::{UrlFrontier, UrlFrontierServer},
};
use tonic::{Request, Response, Status, Streaming};

const MAX_DEPTH: u32 = 4;

#[derive(Debug)]
struct Entry {
    crawl: String,
    url: String,
    key: String,
    metadata: BTreeMap<String, uf::StringList>,
    // 0: completed.
    due: u64,
    leased_until: Option<Instant>,
}

#[derive(Debug, Default)]
struct Store {
    // In the order first stored; (crawl, URL as given) → index.
    entries: Vec<Entry>,
    index: HashMap<(String, String), usize>,
    delays: HashMap<String, u32>,
    last_serve: HashMap<String, Instant>,
    calls: BTreeMap<&'static str, u64>,
}

/// The minimal frontier: a store in memory, and a signal for when every
/// URL is completed.
#[derive(Debug, Clone, Default)]
struct PlainFrontier {
    store: Arc<Mutex<Store>>,
    settled: Arc<tokio::sync::Notify>,
    /// Serves PutDiscovered, ignoring a batch's report as a server that
    /// does not know the field does.
    takes_batches: bool,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl PlainFrontier {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, call: &'static str) {
        *self.store().calls.entry(call).or_default() += 1;
    }

    fn put(&self, item: uf::UrlItem) -> uf::AckMessage {
        let id = item.id.clone();
        let status = match item.item {
            Some(uf::url_item::Item::Discovered(d)) => self.discover(d.info.unwrap_or_default()),
            Some(uf::url_item::Item::Known(k)) => {
                self.know(k.info.unwrap_or_default(), k.refetchable_from_date)
            }
            None => uf::ack_message::Status::Skipped,
        };
        uf::AckMessage {
            id,
            status: status as i32,
        }
    }

    fn discover(&self, info: uf::UrlInfo) -> uf::ack_message::Status {
        let Some(key) = key_of(&info) else {
            return uf::ack_message::Status::Skipped;
        };
        let mut store = self.store();
        let place = (info.crawl_id.clone(), info.url.clone());
        if store.index.contains_key(&place) {
            return uf::ack_message::Status::Skipped;
        }
        let index = store.entries.len();
        store.index.insert(place, index);
        store.entries.push(Entry {
            crawl: info.crawl_id,
            url: info.url,
            key,
            metadata: info.metadata,
            due: now_secs(),
            leased_until: None,
        });
        uf::ack_message::Status::Ok
    }

    fn know(&self, info: uf::UrlInfo, due: u64) -> uf::ack_message::Status {
        let Some(key) = key_of(&info) else {
            return uf::ack_message::Status::Skipped;
        };
        {
            let mut store = self.store();
            let place = (info.crawl_id.clone(), info.url.clone());
            let entry = Entry {
                crawl: info.crawl_id,
                url: info.url,
                key,
                metadata: info.metadata,
                due,
                leased_until: None,
            };
            match store.index.get(&place).copied() {
                Some(index) => store.entries[index] = entry,
                None => {
                    let index = store.entries.len();
                    store.index.insert(place, index);
                    store.entries.push(entry);
                }
            }
        }
        if self.store().entries.iter().all(|e| e.due == 0) {
            self.settled.notify_waiters();
        }
        uf::ack_message::Status::Ok
    }

    fn serve(&self, params: &uf::GetParams) -> Vec<uf::UrlInfo> {
        let now = Instant::now();
        let now_secs = now_secs();
        let lease = Duration::from_secs(u64::from(match params.delay_requestable {
            0 => 30,
            secs => secs,
        }));
        let per_queue = match params.max_urls_per_queue {
            0 => usize::MAX,
            n => n as usize,
        };
        let mut store = self.store();
        let Store {
            entries,
            delays,
            last_serve,
            ..
        } = &mut *store;
        let mut served: Vec<uf::UrlInfo> = Vec::new();
        let mut per_key: HashMap<String, usize> = HashMap::new();
        for entry in entries.iter_mut() {
            if entry.due == 0
                || entry.due > now_secs
                || entry.leased_until.is_some_and(|until| until > now)
            {
                continue;
            }
            let delay =
                Duration::from_secs(u64::from(delays.get(&entry.key).copied().unwrap_or(0)));
            let taken = per_key.get(&entry.key).copied();
            if taken.is_none() {
                if last_serve
                    .get(&entry.key)
                    .is_some_and(|last| now < *last + delay)
                {
                    continue;
                }
                if params.max_queues > 0 && per_key.len() >= params.max_queues as usize {
                    continue;
                }
            }
            let taken = taken.unwrap_or(0);
            if taken >= per_queue {
                continue;
            }
            per_key.insert(entry.key.clone(), taken + 1);
            last_serve.insert(entry.key.clone(), now);
            entry.leased_until = Some(now + lease);
            served.push(uf::UrlInfo {
                url: entry.url.clone(),
                key: entry.key.clone(),
                metadata: entry.metadata.clone(),
                crawl_id: entry.crawl.clone(),
            });
        }
        served
    }

    async fn crawled(&self, timeout: Duration) {
        tokio::time::timeout(timeout, async {
            loop {
                let settled = self.settled.notified();
                tokio::pin!(settled);
                settled.as_mut().enable();
                if self.store().entries.iter().all(|e| e.due == 0) {
                    return;
                }
                settled.await;
            }
        })
        .await
        .expect("the crawl finishes");
    }
}

fn key_of(info: &uf::UrlInfo) -> Option<String> {
    if !info.key.is_empty() {
        return Some(info.key.clone());
    }
    url::Url::parse(&info.url)
        .ok()?
        .host_str()
        .map(str::to_owned)
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn unimplemented<T>(method: &str) -> Result<T, Status> {
    Err(Status::unimplemented(format!("{method} is not served")))
}

#[tonic::async_trait]
impl UrlFrontier for PlainFrontier {
    async fn list_nodes(&self, _: Request<uf::Empty>) -> Result<Response<uf::StringList>, Status> {
        Ok(Response::new(uf::StringList::default()))
    }

    async fn list_crawls(&self, _: Request<uf::Local>) -> Result<Response<uf::StringList>, Status> {
        unimplemented("ListCrawls")
    }

    async fn delete_crawl(
        &self,
        _: Request<uf::DeleteCrawlMessage>,
    ) -> Result<Response<uf::Long>, Status> {
        unimplemented("DeleteCrawl")
    }

    async fn list_queues(
        &self,
        _: Request<uf::Pagination>,
    ) -> Result<Response<uf::QueueList>, Status> {
        unimplemented("ListQueues")
    }

    type GetURLsStream = Boxed<uf::UrlInfo>;

    async fn get_ur_ls(
        &self,
        request: Request<uf::GetParams>,
    ) -> Result<Response<Self::GetURLsStream>, Status> {
        self.count("GetURLs");
        let served = self.serve(request.get_ref());
        Ok(Response::new(Box::pin(futures::stream::iter(
            served.into_iter().map(Ok),
        ))))
    }

    type PutURLsStream = Boxed<uf::AckMessage>;

    async fn put_ur_ls(
        &self,
        request: Request<Streaming<uf::UrlItem>>,
    ) -> Result<Response<Self::PutURLsStream>, Status> {
        use futures::StreamExt;
        self.count("PutURLs");
        let frontier = self.clone();
        let acks = request
            .into_inner()
            .map(move |item| item.map(|item| frontier.put(item)));
        Ok(Response::new(Box::pin(acks)))
    }

    type PutDiscoveredStream = Boxed<uf::BatchAck>;

    async fn put_discovered(
        &self,
        request: Request<Streaming<uf::DiscoveredBatch>>,
    ) -> Result<Response<Self::PutDiscoveredStream>, Status> {
        use futures::StreamExt;
        self.count("PutDiscovered");
        if !self.takes_batches {
            return unimplemented("PutDiscovered");
        }
        let frontier = self.clone();
        let acks = request.into_inner().map(move |batch| {
            batch.map(|batch| {
                if batch.done.is_some() {
                    frontier.count("a report in a batch");
                }
                uf::BatchAck {
                    id: batch.id,
                    statuses: (batch.items.into_iter())
                        .map(|info| frontier.discover(info) as i32)
                        .collect(),
                    done: None,
                }
            })
        });
        Ok(Response::new(Box::pin(acks)))
    }

    async fn get_stats(
        &self,
        _: Request<uf::QueueWithinCrawlParams>,
    ) -> Result<Response<uf::Stats>, Status> {
        unimplemented("GetStats")
    }

    async fn delete_queue(
        &self,
        _: Request<uf::QueueWithinCrawlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        unimplemented("DeleteQueue")
    }

    async fn block_queue_until(
        &self,
        _: Request<uf::BlockQueueParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        unimplemented("BlockQueueUntil")
    }

    async fn set_active(&self, _: Request<uf::Active>) -> Result<Response<uf::Empty>, Status> {
        unimplemented("SetActive")
    }

    async fn get_active(&self, _: Request<uf::Local>) -> Result<Response<uf::Boolean>, Status> {
        unimplemented("GetActive")
    }

    async fn set_delay(
        &self,
        request: Request<uf::QueueDelayParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        self.count("SetDelay");
        let params = request.into_inner();
        self.store()
            .delays
            .insert(params.key, params.delay_requestable);
        Ok(Response::new(uf::Empty {}))
    }

    async fn set_log_level(
        &self,
        _: Request<uf::LogLevelParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        unimplemented("SetLogLevel")
    }

    async fn set_crawl_limit(
        &self,
        _: Request<uf::CrawlLimitParams>,
    ) -> Result<Response<uf::Empty>, Status> {
        unimplemented("SetCrawlLimit")
    }

    async fn get_url_status(
        &self,
        _: Request<uf::UrlStatusRequest>,
    ) -> Result<Response<uf::UrlItem>, Status> {
        unimplemented("GetURLStatus")
    }

    type ListURLsStream = Boxed<uf::UrlItem>;

    async fn list_ur_ls(
        &self,
        _: Request<uf::ListUrlParams>,
    ) -> Result<Response<Self::ListURLsStream>, Status> {
        unimplemented("ListURLs")
    }

    async fn count_ur_ls(
        &self,
        _: Request<uf::CountUrlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        unimplemented("CountURLs")
    }

    async fn purge_ur_ls(
        &self,
        _: Request<uf::PurgeUrlParams>,
    ) -> Result<Response<uf::Long>, Status> {
        unimplemented("PurgeURLs")
    }
}

async fn serve(frontier: PlainFrontier) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(UrlFrontierServer::new(frontier))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_worker_crawls_exactly_once_against_a_frontier_that_stores_urls_as_given() {
    let frontier = PlainFrontier::default();
    crawl_exactly_once(&frontier).await;
    let calls = frontier.store().calls.clone();
    for call in ["SetDelay", "PutURLs", "PutDiscovered"] {
        assert!(calls.contains_key(call), "{calls:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_worker_reports_by_put_urls_to_a_frontier_that_ignores_reports_in_batches() {
    let frontier = PlainFrontier {
        takes_batches: true,
        ..PlainFrontier::default()
    };
    // Completed only if every report the server ignored in a batch came
    // again by PutURLs.
    crawl_exactly_once(&frontier).await;
    let calls = frontier.store().calls.clone();
    assert!(calls.get("a report in a batch") >= Some(&1), "{calls:?}");
    assert!(calls["PutURLs"] >= 1, "{calls:?}");
}

/// Crawls the mock site through `frontier` with one worker, and checks
/// that every page was fetched once, stored in canonical spelling, and
/// spaced by the host's Crawl-delay.
async fn crawl_exactly_once(frontier: &PlainFrontier) {
    // Ten pages: `/` links them all, so each is within the depth limit
    // whichever route finds it first.
    let config = SiteConfig {
        pages: 10,
        crawl_delay: Some(std::time::Duration::from_secs(1)),
        ..SiteConfig::default()
    };
    let site = MockSite::start(config).await.unwrap();
    frontier.discover(uf::UrlInfo {
        url: format!("{}/", site.base()),
        ..uf::UrlInfo::default()
    });
    let endpoint = serve(frontier.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // One worker: a plain v2.6 frontier may serve a host's URLs to two
    // workers at once, so spacing across workers is not the worker's to
    // keep; its own requests it spaces exactly.
    let depth = MAX_DEPTH.to_string();
    let _workers: Vec<WorkerProcess> = (1..=1)
        .map(|i| {
            WorkerProcess::start(
                &endpoint,
                &out,
                &format!("w{i}"),
                &[
                    "--max-depth",
                    &depth,
                    "--concurrency",
                    "4",
                    "--max-body-bytes",
                    "1048576",
                    "--retry-base-secs",
                    "1",
                    "--max-retries",
                    "2",
                    "--lease-secs",
                    "20",
                ],
            )
        })
        .collect();
    frontier.crawled(Duration::from_secs(240)).await;
    // Every page once, however its links spell it.
    assert_eq!(site.page_fetches(), expected_fetches(&config, MAX_DEPTH));
    // No URL was stored in two spellings.
    let stored: Vec<String> = frontier
        .store()
        .entries
        .iter()
        .map(|e| e.url.clone())
        .collect();
    for url in &stored {
        assert_eq!(
            canon::canonicalise(url, 2048)
                .map(|c| c.into_string())
                .as_ref(),
            Ok(url),
            "{url} stored as sent, not canonical"
        );
    }
    // Its Crawl-delay reached the frontier in whole seconds through the
    // API's SetDelay, and the rest through the plain calls.
    let store = frontier.store();
    assert!(
        store.delays.values().all(|secs| *secs == 1),
        "{:?}",
        store.delays
    );
    drop(store);
    // Request starts to the host stay a second apart.
    let hits = site.hits();
    for pair in hits.windows(2) {
        let gap = pair[1].started - pair[0].started;
        assert!(
            gap >= Duration::from_secs(1),
            "{} then {} only {gap:?} apart",
            pair[0].target,
            pair[1].target
        );
    }
}
