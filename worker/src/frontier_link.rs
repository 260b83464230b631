//! The worker's side of the URL Frontier API: leasing, and reports that are
//! sent again until the frontier acknowledges them (a result is never
//! dropped because the frontier was briefly away), over one long-lived
//! stream each for reports and outlinks (see `acked`).

use std::collections::BTreeMap;
use std::time::Duration;

use proto::admin::{self as adm, admin_client::AdminClient};
use proto::bearer::Bearer;
use proto::transport::Transport;
use proto::urlfrontier::{
    self as uf, DiscoveredBatch, GetParams, UrlInfo, UrlItem, ack_message::Status as Ack,
    url_frontier_client::UrlFrontierClient,
};
use tonic::service::interceptor::InterceptedService;

use crate::acked::{AckedStream, Outlinks, Refused, Reports};

/// Why the link cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("invalid frontier address {address:?}: {reason}")]
pub struct LinkError {
    address: String,
    reason: String,
}

pub use crate::client::{Client, retry_delay};

/// The client of our frontier's admin extensions.
type Admin = AdminClient<InterceptedService<Transport, Bearer>>;

// Whether the frontier serves our admin extensions (millisecond delays,
// the robots.txt shelf): not known until the first call tells.
const EXTENSIONS_UNKNOWN: u8 = 0;
const EXTENSIONS_SERVED: u8 = 1;
const EXTENSIONS_ABSENT: u8 = 2;

/// Links to a frontier's nodes; each reconnects by itself.
///
/// A frontier cluster serves each node's own partitions from GetURLs, so
/// the link learns every node from ListNodes (asked again every
/// [`NODES_REFRESH`]) and leases from each in turn. Any node routes puts
/// and control calls, so reports go to the address the worker was given
/// and, while it fails, to the other nodes. A frontier that lists one node
/// (or itself under an address it cannot be reached at from here, such as
/// 0.0.0.0) is used at the given address alone.
#[derive(Debug, Clone)]
pub struct FrontierLink {
    entry: Client,
    entry_admin: Admin,
    extensions: std::sync::Arc<std::sync::atomic::AtomicU8>,
    /// The given address as an endpoint, to know it among the listed.
    entry_endpoint: String,
    token: Option<String>,
    tls: proto::tls::ClientTls,
    // The given address is `https://`: the other nodes' `host:port`
    // addresses are dialled over TLS too.
    secure: bool,
    nodes: std::sync::Arc<std::sync::Mutex<Nodes>>,
    // Started on first use (a runtime is needed), ended with the last clone.
    reports: std::sync::Arc<std::sync::OnceLock<AckedStream<Reports>>>,
    outlinks: std::sync::Arc<std::sync::OnceLock<AckedStream<Outlinks>>>,
    // The frontier answered UNIMPLEMENTED to PutDiscovered: outlinks go as
    // discovered items of PutURLs.
    no_put_discovered: std::sync::Arc<std::sync::atomic::AtomicBool>,
    // The frontier acknowledged a batch carrying a report without a status
    // for it: reports go by PutURLs.
    no_batched_reports: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How often the link asks for the frontier's nodes again.
pub const NODES_REFRESH: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Nodes {
    /// Every node but the entry's own address, by endpoint.
    others: Vec<(String, Client)>,
    /// Where the next lease goes (0: the entry).
    next: usize,
    refreshed: Option<std::time::Instant>,
}

impl FrontierLink {
    /// A link to `address` (e.g. `http://127.0.0.1:7071`), sending
    /// `token` on every call when given; connects on first use and again
    /// after any failure.
    pub fn new(
        address: &str,
        token: Option<&str>,
        tls: &proto::tls::ClientTls,
    ) -> Result<Self, LinkError> {
        let secure = proto::tls::is_https(address);
        let (entry, entry_admin) = clients_of(address, token, tls, secure)?;
        Ok(Self::with_entry(
            address,
            entry,
            entry_admin,
            token,
            tls,
            secure,
        ))
    }

    /// A link to a frontier served in this process through `transport`;
    /// `address` only names it.
    pub fn in_process(
        address: &str,
        transport: Transport,
        token: Option<&str>,
    ) -> Result<Self, LinkError> {
        let (entry, entry_admin) = clients_over(address, transport, token)?;
        Ok(Self::with_entry(
            address,
            entry,
            entry_admin,
            token,
            &proto::tls::ClientTls::default(),
            false,
        ))
    }

    fn with_entry(
        address: &str,
        entry: Client,
        entry_admin: Admin,
        token: Option<&str>,
        tls: &proto::tls::ClientTls,
        secure: bool,
    ) -> Self {
        Self {
            entry,
            entry_admin,
            extensions: std::sync::Arc::default(),
            entry_endpoint: proto::tls::endpoint_with_scheme(address, secure),
            token: token.map(str::to_owned),
            tls: tls.clone(),
            secure,
            nodes: std::sync::Arc::new(std::sync::Mutex::new(Nodes {
                others: Vec::new(),
                next: 0,
                refreshed: None,
            })),
            reports: std::sync::Arc::default(),
            outlinks: std::sync::Arc::default(),
            no_put_discovered: std::sync::Arc::default(),
            no_batched_reports: std::sync::Arc::default(),
        }
    }

    /// A function giving the client for the `n`-th try, as
    /// [`Self::client_at`], that does not keep the link alive.
    fn client_picker(&self) -> impl Fn(usize) -> Client + Send + 'static {
        let entry = self.entry.clone();
        let nodes = std::sync::Arc::clone(&self.nodes);
        move |n| pick_client(&entry, &nodes, n)
    }

    fn reports(&self) -> &AckedStream<Reports> {
        self.reports
            .get_or_init(|| AckedStream::start(self.client_picker()))
    }

    fn outlinks(&self) -> &AckedStream<Outlinks> {
        self.outlinks
            .get_or_init(|| AckedStream::start(self.client_picker()))
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, Nodes> {
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The client for the `n`-th try of a call: the entry first, then the
    /// other nodes in turn.
    fn client_at(&self, n: usize) -> Client {
        pick_client(&self.entry, &self.nodes, n)
    }

    /// Asks for the frontier's nodes when the last answer is old.
    async fn refresh_nodes(&self) {
        if self
            .nodes()
            .refreshed
            .is_some_and(|at| at.elapsed() < NODES_REFRESH)
        {
            return;
        }
        let next = self.nodes().next;
        let mut client = self.client_at(next);
        let listed = client.list_nodes(uf::Empty {}).await;
        let mut nodes = self.nodes();
        nodes.refreshed = Some(std::time::Instant::now());
        let Ok(listed) = listed else { return };
        let listed = listed.into_inner().values;
        if listed.len() <= 1 {
            nodes.others.clear();
            return;
        }
        let mut others = Vec::new();
        for address in listed {
            let endpoint = proto::tls::endpoint_with_scheme(&address, self.secure);
            if endpoint == self.entry_endpoint {
                continue;
            }
            let existing = nodes.others.iter().find(|(e, _)| *e == endpoint);
            let client = match existing {
                Some((_, client)) => client.clone(),
                None => {
                    match clients_of(&endpoint, self.token.as_deref(), &self.tls, self.secure) {
                        Ok((client, _)) => client,
                        Err(error) => {
                            tracing::warn!(%error, "a frontier node's address is unusable");
                            continue;
                        }
                    }
                }
            };
            others.push((endpoint, client));
        }
        if others.len() != nodes.others.len() {
            tracing::info!(nodes = others.len() + 1, "frontier nodes");
        }
        nodes.others = others;
    }

    /// Leases URLs: one GetURLs call to the next node in turn; a node that
    /// fails is passed over for the next, and an error comes back only when
    /// every node failed.
    pub async fn lease(&self, params: GetParams) -> Result<Vec<UrlInfo>, tonic::Status> {
        self.refresh_nodes().await;
        let count = self.nodes().others.len() + 1;
        let mut last_error = None;
        for _ in 0..count {
            let client = {
                let mut nodes = self.nodes();
                let n = nodes.next;
                nodes.next = (n + 1) % count;
                drop(nodes);
                self.client_at(n)
            };
            match lease_from(client, params.clone()).await {
                Ok(infos) => return Ok(infos),
                Err(status) => {
                    tracing::debug!(%status, "GetURLs failed at one node");
                    last_error = Some(status);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| tonic::Status::unavailable("no frontier node")))
    }

    fn note_no_put_discovered(&self) {
        if !self
            .no_put_discovered
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(
                "the frontier lacks PutDiscovered: outlinks go as discovered items of PutURLs"
            );
        }
    }

    /// Sends a page's outlinks as one batch until it is acknowledged;
    /// answers each item's status (OK: stored as new). A frontier without
    /// PutDiscovered gets them as discovered items of PutURLs.
    pub async fn put_outlinks(&self, id: String, items: Vec<UrlInfo>) -> Vec<i32> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.no_put_discovered.load(Relaxed) {
            let batch = DiscoveredBatch {
                id,
                items: items.clone(),
                done: None,
            };
            match self.outlinks().send(batch).await {
                Ok(ack) => return ack.statuses,
                Err(Refused::Unimplemented) => self.note_no_put_discovered(),
            }
        }
        let sends = items.into_iter().map(|info| {
            self.reports().send(UrlItem {
                item: Some(uf::url_item::Item::Discovered(uf::DiscoveredUrlItem {
                    info: Some(info),
                })),
                ..UrlItem::default()
            })
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .map(|ack| ack.map_or(Ack::Fail as i32, |ack| ack.status))
            .collect()
    }

    /// Sends a page's last outlinks with its report (`refetchable_from_date`
    /// `due`) as one batch until it is acknowledged, so that the frontier
    /// stores them in one commit; answers each outlink's status. A frontier
    /// that leaves the report untaken (one without reports in batches, or
    /// without PutDiscovered) gets it by PutURLs after the outlinks.
    pub async fn put_outlinks_and_report(
        &self,
        id: String,
        items: Vec<UrlInfo>,
        report: UrlInfo,
        due: u64,
    ) -> Vec<i32> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.no_put_discovered.load(Relaxed) && !self.no_batched_reports.load(Relaxed) {
            let batch = DiscoveredBatch {
                id: id.clone(),
                items: items.clone(),
                done: Some(uf::KnownUrlItem {
                    info: Some(report.clone()),
                    refetchable_from_date: due,
                }),
            };
            match self.outlinks().send(batch).await {
                Ok(ack) if ack.done.is_some() => return ack.statuses,
                Ok(ack) => {
                    if !self.no_batched_reports.swap(true, Relaxed) {
                        tracing::info!(
                            "the frontier does not take reports in outlink batches: reports go \
                             by PutURLs"
                        );
                    }
                    self.put_known(report, due).await;
                    return ack.statuses;
                }
                Err(Refused::Unimplemented) => self.note_no_put_discovered(),
            }
        }
        let statuses = self.put_outlinks(id, items).await;
        self.put_known(report, due).await;
        statuses
    }

    /// Reports a URL's state (a known item) until it is acknowledged.
    /// SKIPPED is final too (the frontier refuses that item for good).
    pub async fn put_known(&self, info: UrlInfo, refetchable_from_date: u64) {
        let url = info.url.clone();
        let item = UrlItem {
            item: Some(uf::url_item::Item::Known(uf::KnownUrlItem {
                info: Some(info),
                refetchable_from_date,
            })),
            ..UrlItem::default()
        };
        if let Err(Refused::Unimplemented) = self.reports().send(item).await {
            tracing::error!(
                %url,
                "the frontier does not serve PutURLs: this URL's report cannot be sent"
            );
        }
    }

    /// Sets a queue's delay (robots Crawl-delay).
    pub async fn set_delay(&self, crawl: &str, queue: &str, secs: u32) {
        let params = uf::QueueDelayParams {
            key: queue.to_owned(),
            delay_requestable: secs,
            crawl_id: crawl.to_owned(),
            local: false,
        };
        self.control("SetDelay", queue, |mut client| {
            let params = params.clone();
            async move { client.set_delay(params).await.map(|_| ()) }
        })
        .await;
    }

    /// Whether the frontier is known to lack our admin extensions.
    fn extensions_absent(&self) -> bool {
        self.extensions.load(std::sync::atomic::Ordering::Relaxed) == EXTENSIONS_ABSENT
    }

    /// Learns from an answer whether the frontier serves our extensions.
    fn note_extensions<T>(&self, answer: &Result<T, tonic::Status>) {
        let known = match answer {
            Ok(_) => EXTENSIONS_SERVED,
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    "the frontier lacks this project's admin extensions: robots.txt is read by \
                     each worker, and delays are whole seconds"
                );
                EXTENSIONS_ABSENT
            }
            Err(_) => return,
        };
        let _ = self.extensions.compare_exchange(
            EXTENSIONS_UNKNOWN,
            known,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The robots.txt answer another worker read for an origin, as the
    /// frontier keeps it; `None` when it keeps none or cannot say (the
    /// caller then reads robots.txt itself).
    pub async fn shelved_robots(&self, place: adm::RobotsPlace) -> Option<adm::RobotsAnswer> {
        if self.extensions_absent() {
            return None;
        }
        let answer = self
            .entry_admin
            .clone()
            .get_robots(adm::GetRobotsRequest {
                place: Some(place),
                local: false,
            })
            .await;
        self.note_extensions(&answer);
        match answer {
            Ok(answer) => answer.into_inner().robots,
            Err(status) => {
                tracing::debug!(%status, "GetRobots failed; reading robots.txt here");
                None
            }
        }
    }

    /// Keeps a robots.txt answer at the frontier for the other workers; a
    /// few tries (losing it costs one more robots.txt read elsewhere).
    pub async fn shelve_robots(&self, place: adm::RobotsPlace, robots: adm::RobotsAnswer) {
        if self.extensions_absent() {
            return;
        }
        let request = adm::PutRobotsRequest {
            place: Some(place),
            robots: Some(robots),
            local: false,
        };
        for attempt in 0..3 {
            let answer = self.entry_admin.clone().put_robots(request.clone()).await;
            self.note_extensions(&answer);
            match answer {
                Ok(_) => return,
                Err(status) if status.code() == tonic::Code::Unimplemented => return,
                Err(status) => tracing::warn!(%status, "PutRobots failed"),
            }
            tokio::time::sleep(retry_delay(attempt)).await;
        }
    }

    /// Sets a queue's delay (robots.txt Crawl-delay) to the millisecond
    /// where the frontier can hold it, else rounded up to whole seconds
    /// (the URL Frontier API's SetDelay).
    pub async fn set_queue_delay(&self, crawl: &str, queue: &str, delay: Duration) {
        if !self.extensions_absent() {
            let request = adm::SetQueueDelayRequest {
                crawl_id: crawl.to_owned(),
                key: queue.to_owned(),
                delay_ms: u32::try_from(delay.as_millis()).unwrap_or(u32::MAX),
                local: false,
            };
            for attempt in 0..5 {
                let answer = self
                    .entry_admin
                    .clone()
                    .set_queue_delay(request.clone())
                    .await;
                self.note_extensions(&answer);
                match answer {
                    Ok(_) => return,
                    Err(status) if status.code() == tonic::Code::Unimplemented => break,
                    Err(status) => tracing::warn!(%status, queue, "SetQueueDelay failed"),
                }
                tokio::time::sleep(retry_delay(attempt)).await;
            }
            if !self.extensions_absent() {
                return;
            }
        }
        let secs = u32::try_from(delay.as_millis().div_ceil(1000)).unwrap_or(u32::MAX);
        self.set_delay(crawl, queue, secs).await;
    }

    /// Blocks a queue until a UTC epoch second (Retry-After).
    pub async fn block_queue(&self, crawl: &str, queue: &str, until: u64) {
        let params = uf::BlockQueueParams {
            key: queue.to_owned(),
            time: until,
            crawl_id: crawl.to_owned(),
            local: false,
        };
        self.control("BlockQueueUntil", queue, |mut client| {
            let params = params.clone();
            async move { client.block_queue_until(params).await.map(|_| ()) }
        })
        .await;
    }

    /// A control call, tried a few times: losing one costs politeness for
    /// a while (the next robots.txt read or answer sends it again), never
    /// a result.
    async fn control<F, Fut>(&self, name: &str, queue: &str, call: F)
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<(), tonic::Status>>,
    {
        for attempt in 0..5 {
            match call(self.client_at(attempt as usize)).await {
                Ok(()) => return,
                Err(status) => tracing::warn!(%status, queue, "{name} failed"),
            }
            tokio::time::sleep(retry_delay(attempt)).await;
        }
    }
}

/// The client for the `n`-th try of a call: the entry first, then the
/// other nodes in turn.
fn pick_client(entry: &Client, nodes: &std::sync::Mutex<Nodes>, n: usize) -> Client {
    let nodes = nodes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match n % (nodes.others.len() + 1) {
        0 => entry.clone(),
        i => nodes.others[i - 1].1.clone(),
    }
}

/// The clients of one node: the URL Frontier API and our admin API, over
/// one channel.
fn clients_of(
    address: &str,
    token: Option<&str>,
    tls: &proto::tls::ClientTls,
    secure: bool,
) -> Result<(Client, Admin), LinkError> {
    let endpoint = tls.endpoint(address, secure).map_err(|e| LinkError {
        address: address.to_owned(),
        reason: e.to_string(),
    })?;
    // Pings while idle: a frontier closes a connection on which nothing
    // arrives for long, and a worker's streams may be quiet that long.
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(60))
        .keep_alive_while_idle(true)
        .connect_lazy();
    clients_over(address, Transport::Network(channel), token)
}

fn clients_over(
    address: &str,
    transport: Transport,
    token: Option<&str>,
) -> Result<(Client, Admin), LinkError> {
    let bearer = Bearer::new(token).map_err(|error| LinkError {
        address: address.to_owned(),
        reason: error.to_string(),
    })?;
    Ok((
        UrlFrontierClient::with_interceptor(transport.clone(), bearer.clone())
            .max_decoding_message_size(64 * 1024 * 1024),
        AdminClient::with_interceptor(transport, bearer),
    ))
}

/// One GetURLs call, its answer collected. The worker spaces a lease's
/// requests to a host itself, so it asks the frontier to hold each queue it
/// serves until the lease is let go.
async fn lease_from(mut client: Client, params: GetParams) -> Result<Vec<UrlInfo>, tonic::Status> {
    let mut request = tonic::Request::new(params);
    request.metadata_mut().insert(
        proto::metadata::HOLD_QUEUES_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let mut stream = client.get_ur_ls(request).await?.into_inner();
    let mut infos = Vec::new();
    while let Some(info) = stream.message().await? {
        infos.push(info);
    }
    Ok(infos)
}

/// One metadata value as the API carries it.
#[must_use]
pub fn meta_value(value: impl Into<String>) -> uf::StringList {
    uf::StringList {
        values: vec![value.into()],
    }
}

/// The first value of a metadata key.
#[must_use]
pub fn meta_first<'a>(
    metadata: &'a BTreeMap<String, uf::StringList>,
    key: &str,
) -> Option<&'a str> {
    metadata
        .get(key)
        .and_then(|list| list.values.first())
        .map(String::as_str)
}
