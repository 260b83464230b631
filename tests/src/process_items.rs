//! What the frontier process tests share: URL items of the crawl they use,
//! PutURLs and PutDiscovered over a stream, and that crawl's stats.

use futures::StreamExt;
use proto::urlfrontier::{
    self as uf, DiscoveredUrlItem, KnownUrlItem, UrlInfo, UrlItem, ack_message::Status as Ack,
    url_item,
};

use crate::FrontierProcess;

/// A discovered URL of the crawl.
pub fn discovered(url: &str) -> UrlItem {
    UrlItem {
        item: Some(url_item::Item::Discovered(DiscoveredUrlItem {
            info: Some(UrlInfo {
                url: url.to_owned(),
                crawl_id: "kill".into(),
                ..UrlInfo::default()
            }),
        })),
        ..UrlItem::default()
    }
}

/// A known URL of the crawl, refetchable from a date (0: never).
pub fn known(url: &str, refetchable_from_date: u64) -> UrlItem {
    UrlItem {
        item: Some(url_item::Item::Known(KnownUrlItem {
            info: Some(UrlInfo {
                url: url.to_owned(),
                crawl_id: "kill".into(),
                ..UrlInfo::default()
            }),
            refetchable_from_date,
        })),
        ..UrlItem::default()
    }
}

/// The `i`th URL, on one of 37 hosts.
pub fn url(i: usize) -> String {
    format!("http://h{}.example/page/{i}", i % 37)
}

/// Streams items through PutURLs and answers the IDs acknowledged OK, in
/// order, stopping (without waiting for the rest) after `stop_after` acks.
pub async fn put_urls(
    frontier: &FrontierProcess,
    items: Vec<UrlItem>,
    stop_after: usize,
) -> Vec<String> {
    let mut client = frontier.client().await;
    let (sender, receiver) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        for item in items {
            if sender.send(item).await.is_err() {
                break;
            }
        }
    });
    let mut acks = client
        .put_ur_ls(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("PutURLs opens")
        .into_inner();
    let mut ok = Vec::new();
    let mut answered = 0;
    while let Some(Ok(ack)) = acks.next().await {
        answered += 1;
        if ack.status() == Ack::Ok {
            ok.push(ack.id);
        }
        if answered >= stop_after {
            break;
        }
    }
    ok
}

/// Sends batches on one PutDiscovered stream; answers every ack.
pub async fn put_batches(
    client: &mut uf::url_frontier_client::UrlFrontierClient<tonic::transport::Channel>,
    batches: Vec<uf::DiscoveredBatch>,
) -> Vec<uf::BatchAck> {
    client
        .put_discovered(futures::stream::iter(batches))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await
}

/// GetStats of the crawl the kill tests use.
pub async fn kill_crawl_stats(
    client: &mut uf::url_frontier_client::UrlFrontierClient<tonic::transport::Channel>,
) -> uf::Stats {
    client
        .get_stats(uf::QueueWithinCrawlParams {
            crawl_id: "kill".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}
