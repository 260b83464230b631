//! Reports and outlinks over long-lived streams: one PutURLs stream and
//! one PutDiscovered stream per worker, each kept open by a task that
//! numbers what it sends, matches the frontier's acks to it by ID, and,
//! when the stream breaks or the frontier answers FAIL, sends again what
//! is unacknowledged (on a new stream, to the next node). Callers wait for
//! their own item's final ack, so many pages' reports share a stream and
//! the frontier's group commits, while a page's outlinks are still
//! acknowledged before (or with) its report.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use proto::urlfrontier::{self as uf, ack_message::Status as Ack};
use tokio::sync::{mpsc, oneshot};

use crate::client::{Client, retry_delay};

/// One kind of acknowledged call.
pub(crate) trait AckedCall: Send + 'static {
    /// What is sent.
    type Item: Clone + Send + 'static;
    /// What comes back for it.
    type Ack: Send + 'static;
    /// The call's name, for logs and metrics.
    const NAME: &'static str;
    /// The item, numbered.
    fn with_id(item: Self::Item, id: String) -> Self::Item;
    /// The number of the item an ack is for.
    fn ack_id(ack: &Self::Ack) -> &str;
    /// Whether the ack settles the item (else it is sent again).
    fn is_final(ack: &Self::Ack) -> bool;
    /// Opens the call with the items to send.
    fn open(client: Client, items: mpsc::UnboundedReceiver<Self::Item>) -> OpenCall<Self::Ack>;
}

/// An opened call's acks, or why it could not open.
pub(crate) type OpenCall<A> =
    Pin<Box<dyn Future<Output = Result<tonic::Streaming<A>, tonic::Status>> + Send>>;

/// Why an item could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The frontier does not serve this call.
    Unimplemented,
}

type Reply<A> = oneshot::Sender<Result<A, Refused>>;

/// A handle on one call's stream; cheap to clone.
pub(crate) struct AckedStream<C: AckedCall> {
    requests: mpsc::UnboundedSender<(C::Item, Reply<C::Ack>)>,
}

impl<C: AckedCall> Clone for AckedStream<C> {
    fn clone(&self) -> Self {
        Self {
            requests: self.requests.clone(),
        }
    }
}

impl<C: AckedCall> std::fmt::Debug for AckedStream<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckedStream")
            .field("call", &C::NAME)
            .finish()
    }
}

impl<C: AckedCall> AckedStream<C> {
    /// Starts the task that keeps the stream; `client_at(n)` is the node
    /// for the `n`-th stream opened.
    pub(crate) fn start(client_at: impl Fn(usize) -> Client + Send + 'static) -> Self {
        let (requests, incoming) = mpsc::unbounded_channel();
        tokio::spawn(keep_stream::<C>(incoming, client_at));
        Self { requests }
    }

    /// Sends an item and waits for its final ack, however many streams
    /// that takes.
    pub(crate) async fn send(&self, item: C::Item) -> Result<C::Ack, Refused> {
        let (reply, answer) = oneshot::channel();
        // The task ends only when every handle is gone.
        let _ = self.requests.send((item, reply));
        answer.await.unwrap_or(Err(Refused::Unimplemented))
    }
}

struct Pending<C: AckedCall> {
    item: C::Item,
    reply: Reply<C::Ack>,
}

async fn keep_stream<C: AckedCall>(
    mut incoming: mpsc::UnboundedReceiver<(C::Item, Reply<C::Ack>)>,
    client_at: impl Fn(usize) -> Client,
) {
    let mut pending: HashMap<String, Pending<C>> = HashMap::new();
    let mut next_id: u64 = 0;
    let mut attempt: u32 = 0;
    let mut open_incoming = true;
    loop {
        if !open_incoming && pending.is_empty() {
            return;
        }
        if pending.is_empty() {
            // Nothing to send: wait for something before opening a stream.
            match incoming.recv().await {
                Some((item, reply)) => {
                    next_id += 1;
                    pending.insert(next_id.to_string(), Pending { item, reply });
                }
                None => return,
            }
        }
        let (out, items) = mpsc::unbounded_channel();
        for (id, waiting) in &pending {
            let _ = out.send(C::with_id(waiting.item.clone(), id.clone()));
        }
        let mut acks = match C::open(client_at(attempt as usize), items).await {
            Ok(acks) => acks,
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                refuse_all(&mut pending);
                continue;
            }
            Err(status) => {
                tracing::warn!(%status, call = C::NAME, "stream not opened; retrying");
                metrics::counter!("worker_report_retries_total", "call" => C::NAME).increment(1);
                tokio::time::sleep(retry_delay(attempt)).await;
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        // Items the frontier answered FAIL, sent again after a pause.
        let mut failed: VecDeque<(Instant, String)> = VecDeque::new();
        let broken = loop {
            let resend_at = failed.front().map(|(at, _)| *at);
            tokio::select! {
                new = incoming.recv(), if open_incoming => match new {
                    Some((item, reply)) => {
                        next_id += 1;
                        let id = next_id.to_string();
                        let _ = out.send(C::with_id(item.clone(), id.clone()));
                        pending.insert(id, Pending { item, reply });
                    }
                    None => open_incoming = false,
                },
                ack = acks.message() => match ack {
                    Ok(Some(ack)) => {
                        attempt = 0;
                        let id = C::ack_id(&ack).to_owned();
                        if C::is_final(&ack) {
                            if let Some(done) = pending.remove(&id) {
                                let _ = done.reply.send(Ok(ack));
                            }
                        } else if pending.contains_key(&id) {
                            tracing::warn!(call = C::NAME, "the frontier answered FAIL; resending");
                            metrics::counter!("worker_report_retries_total", "call" => C::NAME)
                                .increment(1);
                            failed.push_back((Instant::now() + retry_delay(0), id));
                        }
                    }
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                },
                () = sleep_until(resend_at), if resend_at.is_some() => {
                    if let Some((_, id)) = failed.pop_front()
                        && let Some(waiting) = pending.get(&id)
                    {
                        let _ = out.send(C::with_id(waiting.item.clone(), id));
                    }
                }
            }
            if !open_incoming && pending.is_empty() {
                return;
            }
        };
        match broken {
            Some(status) if status.code() == tonic::Code::Unimplemented => {
                refuse_all(&mut pending);
                continue;
            }
            Some(status) => tracing::warn!(%status, call = C::NAME, "stream broken; resending"),
            // A frontier ends its write streams when it stops: with every
            // item answered, that loses nothing, and the next item opens a
            // new stream.
            None if pending.is_empty() => {
                tracing::debug!(call = C::NAME, "stream ended with every item answered");
                attempt = 0;
                continue;
            }
            None => tracing::warn!(
                call = C::NAME,
                unanswered = pending.len(),
                "stream ended; resending"
            ),
        }
        metrics::counter!("worker_report_retries_total", "call" => C::NAME).increment(1);
        tokio::time::sleep(retry_delay(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

fn refuse_all<C: AckedCall>(pending: &mut HashMap<String, Pending<C>>) {
    for (_, waiting) in pending.drain() {
        let _ = waiting.reply.send(Err(Refused::Unimplemented));
    }
}

/// Reports of URLs' states: PutURLs.
pub(crate) struct Reports;

impl AckedCall for Reports {
    type Item = uf::UrlItem;
    type Ack = uf::AckMessage;
    const NAME: &'static str = "PutURLs";

    fn with_id(item: uf::UrlItem, id: String) -> uf::UrlItem {
        uf::UrlItem { id, ..item }
    }

    fn ack_id(ack: &uf::AckMessage) -> &str {
        &ack.id
    }

    // SKIPPED is final too: the frontier refuses that item for good.
    fn is_final(ack: &uf::AckMessage) -> bool {
        ack.status() != Ack::Fail
    }

    fn open(
        mut client: Client,
        items: mpsc::UnboundedReceiver<uf::UrlItem>,
    ) -> OpenCall<uf::AckMessage> {
        Box::pin(async move {
            let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(items);
            Ok(client.put_ur_ls(stream).await?.into_inner())
        })
    }
}

/// Batches of a page's outlinks: PutDiscovered.
pub(crate) struct Outlinks;

impl AckedCall for Outlinks {
    type Item = uf::DiscoveredBatch;
    type Ack = uf::BatchAck;
    const NAME: &'static str = "PutDiscovered";

    fn with_id(batch: uf::DiscoveredBatch, id: String) -> uf::DiscoveredBatch {
        uf::DiscoveredBatch { id, ..batch }
    }

    fn ack_id(ack: &uf::BatchAck) -> &str {
        &ack.id
    }

    // A batch carrying a page's report is final once the report is too.
    fn is_final(ack: &uf::BatchAck) -> bool {
        !ack.statuses.contains(&(Ack::Fail as i32)) && ack.done != Some(Ack::Fail as i32)
    }

    fn open(
        mut client: Client,
        items: mpsc::UnboundedReceiver<uf::DiscoveredBatch>,
    ) -> OpenCall<uf::BatchAck> {
        Box::pin(async move {
            let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(items);
            Ok(client.put_discovered(stream).await?.into_inner())
        })
    }
}
