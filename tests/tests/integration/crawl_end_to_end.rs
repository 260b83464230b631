//! The whole system as users run it: the mock site, `frontier serve`, three
//! `worker` processes, seeding and waiting with the `frontier` CLI; then
//! what the site saw, what the workers wrote, and what the frontier says.

use std::collections::{BTreeMap, BTreeSet};

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli, read_warc_records};
use mock_site::{MockSite, NEVER_FETCHED, SiteConfig, expected_fetches};

const MAX_DEPTH: u32 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_crawl_the_site_exactly_once() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let depth = MAX_DEPTH.to_string();
    // Filters sized for 16 URLs in all: they are rebuilt during the crawl,
    // which must change nothing in its outcome.
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--partitions",
            "4",
            "--expected-urls",
            "16",
            "--default-delay-ms",
            "0",
            "--max-depth",
            &depth,
        ],
    );
    let endpoint = frontier.endpoint();
    let out = dir.path().join("out");
    let workers: Vec<WorkerProcess> = (1..=3)
        .map(|i| {
            WorkerProcess::start(
                &endpoint,
                &out,
                &format!("w{i}"),
                &[
                    "--concurrency",
                    "4",
                    "--max-body-bytes",
                    "1048576",
                    "--retry-base-secs",
                    "1",
                    "--max-retries",
                    "2",
                ],
            )
        })
        .collect();
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    // Filter health during the crawl: every page fetched so far was stored,
    // and the estimate from the fill ratio follows the exact count.
    site.answered_at_least(40).await;
    let mut admin = frontier.admin().await;
    let during = admin
        .get_filter_health(proto::admin::GetFilterHealthRequest::default())
        .await
        .unwrap()
        .into_inner()
        .total
        .unwrap();
    assert!(during.items_inserted >= 38, "{}", during.items_inserted);
    let items = during.items_inserted as f64;
    assert!(
        (during.estimated_items - items).abs() <= 0.2 * items + 5.0,
        "estimated {} for {items}",
        during.estimated_items
    );
    crawl_tests::crawl_ends(&endpoint, workers, 180);

    let expected = expected_fetches(&SiteConfig::default(), MAX_DEPTH);
    let fetched = site.page_fetches();
    let missing: Vec<_> = expected
        .keys()
        .filter(|p| !fetched.contains_key(*p))
        .collect();
    let extra: Vec<_> = fetched
        .keys()
        .filter(|p| !expected.contains_key(*p))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(
        fetched, expected,
        "each page fetched as often as the ground truth says"
    );
    for path in NEVER_FETCHED {
        assert!(!fetched.contains_key(*path), "{path} must never be fetched");
    }
    // robots.txt is read once for the deployment (the frontier shelves
    // it for the other workers), and the sitemap is a crawled URL.
    let counts = site.fetch_counts();
    for path in ["/robots.txt", "/sitemap.xml"] {
        let reads = counts.get(path).copied().unwrap_or(0);
        assert_eq!(reads, 1, "{path} read {reads} times by 3 workers");
    }
    // One host, one URL in flight at a time (--per-host 1 across workers).
    let max_in_flight = site.hits().iter().map(|h| h.in_flight).max().unwrap_or(0);
    assert_eq!(max_in_flight, 1);

    // The WARC files hold a response record per fetch, and parse back.
    let records = read_warc_records(&out);
    let mut responses: BTreeMap<String, u32> = BTreeMap::new();
    for (kind, target, body) in &records {
        if kind == "response" {
            let path = target
                .strip_prefix(&site.base())
                .unwrap_or(target)
                .to_owned();
            *responses.entry(path).or_default() += 1;
            assert!(body.starts_with(b"HTTP/"), "{target}");
        }
    }
    let mut crawled = expected.clone();
    crawled.insert("/sitemap.xml".to_owned(), 1);
    assert_eq!(responses, crawled);
    let requests = records
        .iter()
        .filter(|(kind, ..)| kind == "request")
        .count();
    assert_eq!(requests, crawled.values().sum::<u32>() as usize);
    // The crawl logs hold a line per leased URL the workers reported.
    let log_lines: usize = (1..=3)
        .map(|i| {
            std::fs::read_to_string(out.join(format!("crawl-w{i}.log.jsonl")))
                .unwrap_or_default()
                .lines()
                .inspect(|line| {
                    serde_json::from_str::<serde_json::Value>(line).expect("JSON lines");
                })
                .count()
        })
        .sum();
    // One line per fetch (the sitemap's too), plus the robots refusal of
    // /private/ (off-site targets never reach a worker: the frontier
    // refuses them).
    assert_eq!(log_lines, crawled.values().sum::<u32>() as usize + 1);

    // Filter health: one key per distinct URL the crawl stored.
    let progress = admin
        .get_progress(proto::admin::GetProgressRequest::default())
        .await
        .unwrap()
        .into_inner();
    let health = admin
        .get_filter_health(proto::admin::GetFilterHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    let total = health.total.unwrap();
    assert_eq!(total.items_inserted, progress.discovered);
    assert_eq!(progress.completed, progress.discovered);
    // Distinct stored URLs: every fetched page (the sitemap too) and the
    // robots-refused one; the calendar month past the depth limit was
    // refused, not stored.
    let distinct: BTreeSet<&String> = crawled.keys().collect();
    assert_eq!(progress.discovered, distinct.len() as u64 + 1);
    assert!(
        progress.skipped.unwrap().too_deep >= 1,
        "the calendar hit the depth limit"
    );
    assert!(total.estimated_items > 0.9 * total.items_inserted as f64);
    assert!(total.fill_ratio < health.rebuild_fill_threshold);
    assert!(
        total.rebuild_count >= 2,
        "rebuilds: {}\n{}",
        total.rebuild_count,
        frontier
            .log_text()
            .lines()
            .filter(|l| l.contains("rebuil"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

const WORKER_ARGS: &[&str] = &[
    // Bounds the pages a killed worker or frontier leaves in flight.
    "--unacked-per-host",
    "2",
    "--concurrency",
    "4",
    "--max-body-bytes",
    "1048576",
    "--retry-base-secs",
    "1",
    "--max-retries",
    "2",
    "--lease-secs",
    "3",
];

/// Checks a crawl that went through a fault: every page fetched at least
/// as often as the ground truth says, at most `extra` fetches more in all
/// (pages in flight at the fault), nothing forbidden.
fn check_with_fault(site: &MockSite, extra: u32) {
    let expected = expected_fetches(&SiteConfig::default(), MAX_DEPTH);
    let fetched = site.page_fetches();
    let mut surplus = 0;
    for (path, times) in &expected {
        let got = fetched.get(path).copied().unwrap_or(0);
        assert!(
            got >= *times,
            "{path} fetched {got} times, expected {times}"
        );
        surplus += got - times;
    }
    let unexpected: Vec<_> = fetched
        .keys()
        .filter(|p| !expected.contains_key(*p))
        .collect();
    assert!(unexpected.is_empty(), "unexpected fetches {unexpected:?}");
    assert!(
        surplus <= extra,
        "{surplus} fetches beyond the ground truth: {fetched:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_crawl_loses_nothing() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let depth = MAX_DEPTH.to_string();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--partitions",
            "4",
            "--default-delay-ms",
            "0",
            "--max-depth",
            &depth,
        ],
    );
    let endpoint = frontier.endpoint();
    let out = dir.path().join("out");
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|i| WorkerProcess::start(&endpoint, &out, &format!("w{i}"), WORKER_ARGS))
        .collect();
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    site.answered_at_least(30).await;
    workers.remove(0).kill();
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "180"]);
    assert!(status.success(), "crawl did not finish: {text}");
    // One host, one fetch at a time, and at most two pages started and not
    // yet acknowledged (--unacked-per-host 2): one fetched whose report was
    // on its way, one being fetched.
    check_with_fault(&site, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontier_killed_mid_crawl_and_restarted_loses_nothing() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let depth = MAX_DEPTH.to_string();
    let args = [
        "--partitions",
        "4",
        "--default-delay-ms",
        "0",
        "--max-depth",
        &depth,
    ];
    let frontier = FrontierProcess::start(&data, &args);
    let endpoint = frontier.endpoint();
    let listen = frontier.addr.to_string();
    let out = dir.path().join("out");
    let _workers: Vec<WorkerProcess> = (1..=3)
        .map(|i| WorkerProcess::start(&endpoint, &out, &format!("w{i}"), WORKER_ARGS))
        .collect();
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    site.answered_at_least(40).await;
    frontier.kill();
    // Workers keep their unacknowledged reports and resend them.
    let frontier = FrontierProcess::start_on(&data, &listen, &args);
    assert!(
        frontier
            .log_text()
            .contains("filters rebuilt from the store")
    );
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "180"]);
    assert!(status.success(), "crawl did not finish: {text}");
    // The restarted frontier serves nothing until the leases handed out
    // before the kill have run out, and the workers go on with theirs: only
    // a page whose report had not landed by then may be fetched again.
    check_with_fault(&site, 1);
}

/// The mock site and a frontier for a small crawl of it: depth 2, no
/// default delay between serves of a queue.
async fn small_crawl(config: SiteConfig, dir: &std::path::Path) -> (MockSite, FrontierProcess) {
    let site = MockSite::start(config).await.unwrap();
    let frontier = FrontierProcess::start(
        &dir.join("data"),
        &[
            "--partitions",
            "2",
            "--default-delay-ms",
            "0",
            "--max-depth",
            "2",
        ],
    );
    (site, frontier)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_delay_spaces_requests_to_its_host() {
    let config = SiteConfig {
        pages: 3,
        crawl_delay: Some(std::time::Duration::from_secs(1)),
        ..SiteConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let (site, frontier) = small_crawl(config, dir.path()).await;
    let endpoint = frontier.endpoint();
    let out = dir.path().join("out");
    let _workers: Vec<WorkerProcess> = (1..=2)
        .map(|i| WorkerProcess::start(&endpoint, &out, &format!("w{i}"), WORKER_ARGS))
        .collect();
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "180"]);
    assert!(status.success(), "crawl did not finish: {text}");
    assert_eq!(site.page_fetches(), expected_fetches(&config, 2));
    // The frontier spaces its serves of the host by the Crawl-delay; a
    // request starts a little after its serve (the first one also after
    // the robots.txt and sitemap reads). So each gap between request starts
    // is at least the delay less that latency, bounded here at 250 ms even
    // on a loaded machine, and the whole span at least (n - 1) delays less
    // the first request's latency: jitter cannot fake that one.
    let starts: Vec<std::time::Instant> = site
        .hits()
        .iter()
        .filter(|h| h.target != "/robots.txt" && h.target != "/sitemap.xml")
        .map(|h| h.started)
        .collect();
    let delay = std::time::Duration::from_secs(1);
    let latency = std::time::Duration::from_millis(250);
    for (i, pair) in starts.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        assert!(
            gap + latency >= delay,
            "requests {i} and {} only {gap:?} apart",
            i + 1
        );
    }
    let span = starts[starts.len() - 1] - starts[0];
    assert!(
        span + latency >= delay * (starts.len() as u32 - 1),
        "{} requests in {span:?}",
        starts.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_prometheus_metrics() {
    let config = SiteConfig {
        pages: 3,
        ..SiteConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let (site, frontier) = small_crawl(config, dir.path()).await;
    let endpoint = frontier.endpoint();
    let (_worker, metrics_url) =
        WorkerProcess::start_with_metrics(&endpoint, &dir.path().join("out"), "m1", WORKER_ARGS);
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "120"]);
    assert!(status.success(), "{text}");
    let text = crawl_tests::http_get(&metrics_url).await;
    for expected in [
        "worker_fetches_total{class=\"2xx\"}".to_owned(),
        "worker_fetches_total{class=\"5xx\"} 1".to_owned(),
        "worker_robots_lookups_total{result=\"fetched\"} 1".to_owned(),
        "worker_robots_lookups_total{result=\"cached\"}".to_owned(),
        "worker_fetch_seconds".to_owned(),
        "worker_bytes_total".to_owned(),
        "worker_in_flight 0".to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected} missing:\n{text}");
    }
}

/// A frontier that requires its token on every call is crawled by workers
/// that send it: the whole site, each page once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_with_the_token_crawl_a_frontier_that_requires_it_everywhere() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let depth = MAX_DEPTH.to_string();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--default-delay-ms",
            "0",
            "--max-depth",
            &depth,
            "--admin-token",
            "s3cret",
            "--token-for-all",
        ],
    );
    let endpoint = frontier.endpoint();
    let out = dir.path().join("out");
    let mut args = WORKER_ARGS.to_vec();
    args.extend(["--token", "s3cret"]);
    let _workers: Vec<WorkerProcess> = (1..=2)
        .map(|i| WorkerProcess::start(&endpoint, &out, &format!("w{i}"), &args))
        .collect();
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(
        !status.success(),
        "seeding without the token worked: {text}"
    );
    let (status, text) = frontier_cli(
        &endpoint,
        &["seed", "--token", "s3cret", &format!("{}/", site.base())],
    );
    assert!(status.success(), "{text}");
    let (status, text) = frontier_cli(
        &endpoint,
        &[
            "status",
            "--token",
            "s3cret",
            "--wait",
            "--timeout-secs",
            "180",
        ],
    );
    assert!(status.success(), "crawl did not finish: {text}");
    check_with_fault(&site, 0);
}
