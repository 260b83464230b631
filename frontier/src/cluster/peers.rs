//! Clients of the other nodes. Puts travel over one long-lived stream per
//! peer and kind (PutDiscovered, PutURLs), each request matched to its ack
//! by an ID of this link's own; a stream that breaks fails what it had in
//! flight (the caller answers FAIL, and the client sends again) and the
//! next request opens a new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use proto::admin::admin_client::AdminClient;
use proto::bearer::Bearer;
use proto::tls::ClientTls;
use proto::urlfrontier::{self as uf, url_frontier_client::UrlFrontierClient};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::EPOCH_HEADER;

type Frontier = UrlFrontierClient<InterceptedService<Channel, Bearer>>;
type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

/// Longest wait for a peer's ack; past it the items are answered FAIL (a
/// peer that stopped without closing its connection).
pub const PEER_ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests queued for one stream before senders wait.
const LINK_QUEUE: usize = 1024;

/// A put stream of `$client`'s `$method`, opened under each request's
/// epoch.
macro_rules! put_link {
    ($client:expr, $method:ident) => {{
        let client = $client.clone();
        Link::start(move |requests, epoch| {
            let mut client = client.clone();
            async move {
                Ok(client
                    .$method(forwarded(requests, epoch))
                    .await?
                    .into_inner())
            }
        })
    }};
}

/// The clients of every peer this node has talked to, by endpoint.
pub struct Peers {
    token: Option<String>,
    node_secret: String,
    tls: ClientTls,
    // Whether the nodes serve TLS (this one does): their `host:port`
    // addresses are then dialled as `https://`.
    secure: bool,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
}

/// One peer: its clients and its put streams.
pub struct Peer {
    endpoint: String,
    frontier: Frontier,
    admin: Admin,
    discovered: Link<uf::DiscoveredBatch, uf::BatchAck>,
    known: Link<uf::UrlItem, uf::AckMessage>,
}

impl Peers {
    pub fn new(token: Option<String>, node_secret: String, tls: ClientTls, secure: bool) -> Self {
        Self {
            token,
            node_secret,
            tls,
            secure,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// The peer at `endpoint` (`host:port`, or with a scheme), connecting
    /// on first use.
    pub fn get(&self, endpoint: &str) -> Result<Arc<Peer>, Status> {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(peer) = peers.get(endpoint) {
            return Ok(Arc::clone(peer));
        }
        let bearer = Bearer::new(self.token.as_deref())
            .and_then(|bearer| bearer.with_node_secret(&self.node_secret))
            .map_err(|e| Status::internal(format!("cannot send the token to peers: {e}")))?;
        let channel = self
            .tls
            .endpoint(endpoint, self.secure)
            .map_err(|e| Status::internal(format!("bad peer address: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            // A node closes a connection on which nothing arrives for long.
            .keep_alive_while_idle(true)
            .connect_lazy();
        let frontier = UrlFrontierClient::with_interceptor(channel.clone(), bearer.clone())
            .max_decoding_message_size(64 << 20);
        let admin =
            AdminClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20);
        let peer = Arc::new(Peer {
            endpoint: endpoint.to_owned(),
            discovered: put_link!(frontier, put_discovered),
            known: put_link!(frontier, put_ur_ls),
            frontier,
            admin,
        });
        peers.insert(endpoint.to_owned(), Arc::clone(&peer));
        Ok(peer)
    }
}

/// A request forwarded under `epoch`.
pub fn forwarded<T>(message: T, epoch: u64) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(EPOCH_HEADER, epoch.into());
    request
}

impl Peer {
    /// The peer's URL Frontier client.
    pub fn frontier(&self) -> Frontier {
        self.frontier.clone()
    }

    /// The peer's admin client.
    pub fn admin(&self) -> Admin {
        self.admin.clone()
    }

    /// Stores a batch at the peer; answers its ack once the peer gave it
    /// (after its commit).
    pub async fn put_discovered(
        &self,
        mut batch: uf::DiscoveredBatch,
        epoch: u64,
    ) -> Result<uf::BatchAck, Status> {
        let id = self.discovered.next_id();
        batch.id = id.clone();
        let ack = self.discovered.send(id, batch, epoch).await;
        ack.map_err(|status| self.unavailable(status))
    }

    /// Stores known or discovered items at the peer; answers one status
    /// per item, in order.
    pub async fn put_urls(&self, items: Vec<uf::UrlItem>, epoch: u64) -> Vec<Result<i32, Status>> {
        let sends = items.into_iter().map(|mut item| {
            let id = self.known.next_id();
            item.id = id.clone();
            async move {
                self.known
                    .send(id, item, epoch)
                    .await
                    .map(|ack| ack.status)
                    .map_err(|status| self.unavailable(status))
            }
        });
        futures::future::join_all(sends).await
    }

    fn unavailable(&self, status: Status) -> Status {
        if status.code() == tonic::Code::Unavailable {
            status
        } else {
            Status::unavailable(format!(
                "frontier node at {} did not acknowledge: {}",
                self.endpoint,
                status.message()
            ))
        }
    }
}

/// An ack's request ID.
trait Acked {
    fn acked_id(&self) -> &str;
}

impl Acked for uf::BatchAck {
    fn acked_id(&self) -> &str {
        &self.id
    }
}

impl Acked for uf::AckMessage {
    fn acked_id(&self) -> &str {
        &self.id
    }
}

type Reply<A> = oneshot::Sender<Result<A, Status>>;

struct Queued<R, A> {
    id: String,
    request: R,
    reply: Reply<A>,
    epoch: u64,
}

/// One long-lived stream to a peer, opened by a task of its own.
struct Link<R, A> {
    queue: mpsc::Sender<Queued<R, A>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl<R: Send + 'static, A: Acked + Send + 'static> Link<R, A> {
    fn start<O, F>(open: O) -> Self
    where
        O: Fn(tokio_stream::wrappers::ReceiverStream<R>, u64) -> F + Send + 'static,
        F: std::future::Future<Output = Result<tonic::Streaming<A>, Status>> + Send + 'static,
    {
        let (queue, queued) = mpsc::channel(LINK_QUEUE);
        tokio::spawn(run_link(queued, open));
        Self {
            queue,
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn next_id(&self) -> String {
        let n = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("fwd-{n}")
    }

    async fn send(&self, id: String, request: R, epoch: u64) -> Result<A, Status> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Queued {
                id,
                request,
                reply,
                epoch,
            })
            .await
            .map_err(|_| Status::unavailable("the peer link stopped"))?;
        match tokio::time::timeout(PEER_ACK_TIMEOUT, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Status::unavailable("the peer stream closed before its ack")),
            Err(_) => Err(Status::unavailable(format!(
                "no ack from the peer within {PEER_ACK_TIMEOUT:?}"
            ))),
        }
    }
}

/// Opens a stream for the first queued request and keeps it while it
/// works and the epoch stays; acks are matched to their requests by ID.
async fn run_link<R, A, O, F>(mut queued: mpsc::Receiver<Queued<R, A>>, open: O)
where
    R: Send + 'static,
    A: Acked + Send + 'static,
    O: Fn(tokio_stream::wrappers::ReceiverStream<R>, u64) -> F,
    F: std::future::Future<Output = Result<tonic::Streaming<A>, Status>>,
{
    let mut carried: Option<Queued<R, A>> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match queued.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let epoch = first.epoch;
        let (requests, stream) = mpsc::channel(LINK_QUEUE);
        let mut acks = match open(tokio_stream::wrappers::ReceiverStream::new(stream), epoch).await
        {
            Ok(acks) => acks,
            Err(status) => {
                let _ = first.reply.send(Err(status));
                continue;
            }
        };
        let mut pending: HashMap<String, Reply<A>> = HashMap::new();
        let mut next = Some(first);
        let failure = loop {
            if let Some(item) = next.take() {
                if item.epoch != epoch {
                    // A new map: the rest goes over a stream opened under it.
                    carried = Some(item);
                    break None;
                }
                pending.insert(item.id, item.reply);
                if requests.send(item.request).await.is_err() {
                    break Some(Status::unavailable("the peer stream closed"));
                }
                continue;
            }
            tokio::select! {
                item = queued.recv() => match item {
                    Some(item) => next = Some(item),
                    None => return,
                },
                ack = acks.message() => match ack {
                    Ok(Some(ack)) => {
                        if let Some(reply) = pending.remove(ack.acked_id()) {
                            let _ = reply.send(Ok(ack));
                        }
                    }
                    Ok(None) => break Some(Status::unavailable("the peer ended the stream")),
                    Err(status) => break Some(status),
                },
            }
        };
        let status = failure.unwrap_or_else(|| Status::unavailable("the partition map changed"));
        for (_, reply) in pending.drain() {
            let _ = reply.send(Err(status.clone()));
        }
    }
}
