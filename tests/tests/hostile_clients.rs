//! What a client can make the frontier do is bounded: a lease never runs
//! longer than `--max-lease-secs`, and one GetURLs call never leases more
//! than `--max-urls-per-get`, whatever the call asks for.

use crawl_tests::FrontierProcess;
use proto::urlfrontier::{DiscoveredBatch, GetParams, UrlInfo};

async fn lease_all(frontier: &FrontierProcess, lease_secs: u32) -> Vec<String> {
    let mut stream = frontier
        .client()
        .await
        .get_ur_ls(GetParams {
            max_urls_per_queue: 0,
            max_queues: 0,
            delay_requestable: lease_secs,
            ..GetParams::default()
        })
        .await
        .expect("GetURLs")
        .into_inner();
    let mut urls = Vec::new();
    while let Some(info) = stream.message().await.expect("a URL") {
        urls.push(info.url);
    }
    urls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_urls_per_call_are_capped_whatever_the_call_asks() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--scope",
            "any",
            "--default-delay-ms",
            "0",
            "--max-lease-secs",
            "1",
            "--max-urls-per-get",
            "50",
        ],
    );
    let items: Vec<UrlInfo> = (0..200)
        .map(|i| UrlInfo {
            url: format!("http://h{}.example/{i}", i % 4),
            ..UrlInfo::default()
        })
        .collect();
    let mut acks = frontier
        .client()
        .await
        .put_discovered(futures::stream::iter([DiscoveredBatch {
            id: "all".into(),
            items,
        }]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acks.message().await.unwrap().unwrap().statuses.len(), 200);

    // Limits 0/0 ("no limit" in the API) and a lease of 2^32-1 seconds.
    let first = lease_all(&frontier, u32::MAX).await;
    assert_eq!(first.len(), 50, "one call leased {}", first.len());
    // The lease was cut to one second: the same URLs come back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut leased_again = std::collections::HashSet::new();
    while !first.iter().all(|url| leased_again.contains(url)) {
        assert!(
            std::time::Instant::now() < deadline,
            "URLs leased for 2^32-1 seconds never came back"
        );
        leased_again.extend(lease_all(&frontier, u32::MAX).await);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
