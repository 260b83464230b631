//! The worker against sites and settings that try to misuse it: an endless
//! chain of redirects stops at the limit, an address the SSRF guard refuses
//! is recorded as refused (not retried as if the site were down), and proxy
//! variables in the environment are not followed unless `--proxy` says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli};
use mock_site::{MockSite, SiteConfig};

fn start_frontier(dir: &std::path::Path) -> FrontierProcess {
    FrontierProcess::start(&dir.join("data"), &["--default-delay-ms", "0"])
}

fn wait_for_the_crawl(endpoint: &str) {
    let (status, text) = frontier_cli(endpoint, &["status", "--wait", "--timeout-secs", "120"]);
    assert!(status.success(), "the crawl did not finish: {text}");
}

fn chain_hits(site: &MockSite) -> usize {
    site.hits()
        .iter()
        .filter(|hit| hit.target.starts_with("/chain/"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_redirect_chain_stops_at_the_limit() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let frontier = start_frontier(dir.path());
    let endpoint = frontier.endpoint();
    let _worker = WorkerProcess::start(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--max-redirects", "5", "--no-sitemaps"],
    );
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/chain/0", site.base())]);
    assert!(status.success(), "{text}");
    wait_for_the_crawl(&endpoint);
    // The seed and the five redirects after it.
    assert_eq!(chain_hits(&site), 6, "{:?}", site.fetch_counts());
    // The last page of the chain was reported as such.
    let item = frontier
        .client()
        .await
        .get_url_status(proto::urlfrontier::UrlStatusRequest {
            url: format!("{}/chain/5", site.base()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let Some(proto::urlfrontier::url_item::Item::Known(known)) = item.item else {
        panic!("{item:?}");
    };
    let outcome = &known.info.unwrap().metadata["outcome"].values;
    assert_eq!(outcome, &["too_many_redirects"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_address_is_recorded_as_refused_not_retried() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let frontier = start_frontier(dir.path());
    let endpoint = frontier.endpoint();
    // No --allow-private: the mock site on 127.0.0.1 is refused.
    let _worker = WorkerProcess::start_with_env(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--retry-base-secs", "60"],
        &[],
    );
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    // A retry would be an hour of backoff away; the crawl ends at once.
    wait_for_the_crawl(&endpoint);
    assert!(site.hits().is_empty(), "{:?}", site.fetch_counts());
    let logs: String = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .collect();
    assert!(logs.contains("refused"), "{logs}");
    assert!(!logs.contains("retrying later"), "{logs}");
}

/// A listener standing in for a proxy: it counts connections and closes
/// them.
async fn counting_listener() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (address, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_variables_are_ignored_and_a_proxy_never_sees_a_refused_target() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, connections) = counting_listener().await;
    let env = [
        ("HTTP_PROXY", proxy.as_str()),
        ("http_proxy", proxy.as_str()),
        ("ALL_PROXY", proxy.as_str()),
        ("NO_PROXY", ""),
    ];
    // The environment names a proxy: it is not used.
    let frontier = start_frontier(dir.path());
    let endpoint = frontier.endpoint();
    let worker = WorkerProcess::start_with_env(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--allow-private", "--no-sitemaps"],
        &env,
    );
    let (status, text) = frontier_cli(
        &endpoint,
        &["seed", &format!("{}/page/0.html", site.base())],
    );
    assert!(status.success(), "{text}");
    site.answered_at_least(1).await;
    drop(worker);
    assert_eq!(connections.load(Ordering::SeqCst), 0);

    // --proxy given, the target private and not allowed: refused before
    // anything reaches the proxy.
    let dir = tempfile::tempdir().unwrap();
    let frontier = start_frontier(dir.path());
    let endpoint = frontier.endpoint();
    let _worker = WorkerProcess::start_with_env(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--proxy", &proxy],
        &[],
    );
    let (status, text) = frontier_cli(
        &endpoint,
        &[
            "seed",
            &format!(
                "http://localhost:{}/",
                site.base().rsplit(':').next().unwrap()
            ),
        ],
    );
    assert!(status.success(), "{text}");
    wait_for_the_crawl(&endpoint);
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}
