//! The worker's side of the URL Frontier API: leasing, and reports that are
//! sent again until the frontier acknowledges them (a result is never
//! dropped because the frontier was briefly away).

use std::collections::HashMap;
use std::time::Duration;

use proto::bearer::Bearer;
use proto::urlfrontier::{
    self as uf, DiscoveredBatch, GetParams, UrlInfo, UrlItem, ack_message::Status as Ack,
    url_frontier_client::UrlFrontierClient,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Why the link cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("invalid frontier address {address:?}: {reason}")]
pub struct LinkError {
    address: String,
    reason: String,
}

/// The client the link calls through.
pub type Client = UrlFrontierClient<InterceptedService<Channel, Bearer>>;

/// A connection to a frontier; reconnects by itself.
#[derive(Debug, Clone)]
pub struct FrontierLink {
    client: Client,
}

/// Delay before the `attempt`-th retry: doubling from 100 ms, at most 10 s.
#[must_use]
pub fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(100_u64.saturating_mul(1 << attempt.min(7)).min(10_000))
}

impl FrontierLink {
    /// A link to `address` (e.g. `http://127.0.0.1:7071`), sending
    /// `token` on every call when given; connects on first use and again
    /// after any failure.
    pub fn new(address: &str, token: Option<&str>) -> Result<Self, LinkError> {
        let bearer = Bearer::new(token).map_err(|error| LinkError {
            address: address.to_owned(),
            reason: error.to_string(),
        })?;
        let endpoint = Channel::from_shared(address.to_owned()).map_err(|e| LinkError {
            address: address.to_owned(),
            reason: e.to_string(),
        })?;
        let channel = endpoint
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self {
            client: UrlFrontierClient::with_interceptor(channel, bearer)
                .max_decoding_message_size(64 * 1024 * 1024),
        })
    }

    /// Leases URLs (one GetURLs call).
    pub async fn lease(&self, params: GetParams) -> Result<Vec<UrlInfo>, tonic::Status> {
        let mut client = self.client.clone();
        let mut stream = client.get_ur_ls(params).await?.into_inner();
        let mut infos = Vec::new();
        while let Some(info) = stream.message().await? {
            infos.push(info);
        }
        Ok(infos)
    }

    /// Sends a page's outlinks as one batch until it is acknowledged;
    /// answers how many were new (OK).
    pub async fn put_outlinks(&self, id: String, items: Vec<UrlInfo>) -> usize {
        let batch = DiscoveredBatch { id, items };
        let ack = self
            .resend_until_acked(
                "PutDiscovered",
                |mut client| {
                    let batch = batch.clone();
                    async move {
                        first_ack(
                            client
                                .put_discovered(futures::stream::iter([batch]))
                                .await?
                                .into_inner(),
                        )
                        .await
                    }
                },
                |ack: &uf::BatchAck| !ack.statuses.contains(&(Ack::Fail as i32)),
            )
            .await;
        ack.statuses
            .iter()
            .filter(|s| **s == Ack::Ok as i32)
            .count()
    }

    /// Reports a URL's state (a known item) until it is acknowledged.
    /// SKIPPED is final too (the frontier refuses that item for good).
    pub async fn put_known(&self, info: UrlInfo, refetchable_from_date: u64) {
        let item = UrlItem {
            item: Some(uf::url_item::Item::Known(uf::KnownUrlItem {
                info: Some(info),
                refetchable_from_date,
            })),
            ..UrlItem::default()
        };
        self.resend_until_acked(
            "PutURLs",
            |mut client| {
                let item = item.clone();
                async move {
                    first_ack(
                        client
                            .put_ur_ls(futures::stream::iter([item]))
                            .await?
                            .into_inner(),
                    )
                    .await
                }
            },
            |ack: &uf::AckMessage| ack.status() != Ack::Fail,
        )
        .await;
    }

    /// Sends one report (`send` opens the call and answers its first ack)
    /// again and again, with a growing pause, until an ack is `final_ack`:
    /// an unacknowledged result is never dropped.
    async fn resend_until_acked<A, F, Fut>(
        &self,
        call: &'static str,
        send: F,
        final_ack: impl Fn(&A) -> bool,
    ) -> A
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<A, tonic::Status>>,
    {
        let mut attempt = 0;
        loop {
            match send(self.client.clone()).await {
                Ok(ack) if final_ack(&ack) => return ack,
                Ok(_) => tracing::warn!(call, "the frontier answered FAIL; resending"),
                Err(status) => tracing::warn!(%status, call, "not acknowledged; resending"),
            }
            metrics::counter!("worker_report_retries_total", "call" => call).increment(1);
            tokio::time::sleep(retry_delay(attempt)).await;
            attempt += 1;
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
            match call(self.client.clone()).await {
                Ok(()) => return,
                Err(status) => tracing::warn!(%status, queue, "{name} failed"),
            }
            tokio::time::sleep(retry_delay(attempt)).await;
        }
    }
}

/// The first ack of a streamed call.
async fn first_ack<T>(mut acks: tonic::Streaming<T>) -> Result<T, tonic::Status> {
    acks.message()
        .await?
        .ok_or_else(|| tonic::Status::unavailable("the call ended without an ack"))
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
pub fn meta_first<'a>(metadata: &'a HashMap<String, uf::StringList>, key: &str) -> Option<&'a str> {
    metadata
        .get(key)
        .and_then(|list| list.values.first())
        .map(String::as_str)
}
