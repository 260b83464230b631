//! Politeness across workers, as the site sees it: with three workers on
//! one host, every gap between request starts (robots.txt and sitemaps
//! included) is at least the host's delay, with no latency allowance; and
//! robots.txt and the sitemap are each read once for the whole deployment.

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli};
use mock_site::{MockSite, SiteConfig, expected_fetches};

const MAX_DEPTH: u32 = 2;

fn workers(endpoint: &str, out: &std::path::Path) -> Vec<WorkerProcess> {
    (1..=3)
        .map(|i| {
            WorkerProcess::start(
                endpoint,
                out,
                &format!("w{i}"),
                &[
                    "--concurrency",
                    "4",
                    "--max-body-bytes",
                    "1048576",
                    "--per-host",
                    "2",
                    "--retry-base-secs",
                    "1",
                    "--max-retries",
                    "2",
                    "--lease-secs",
                    "20",
                ],
            )
        })
        .collect()
}

async fn crawl(config: SiteConfig, dir: &std::path::Path) -> MockSite {
    let site = MockSite::start(config).await.unwrap();
    let depth = MAX_DEPTH.to_string();
    let frontier = FrontierProcess::start(
        &dir.join("data"),
        &[
            "--partitions",
            "2",
            "--default-delay-ms",
            "0",
            "--max-depth",
            &depth,
        ],
    );
    let endpoint = frontier.endpoint();
    let _workers = workers(&endpoint, &dir.join("out"));
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "240"]);
    assert!(status.success(), "crawl did not finish: {text}");
    site
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gap_between_request_starts_holds_the_crawl_delay_with_three_workers() {
    let config = SiteConfig {
        pages: 4,
        crawl_delay: Some(1),
        ..SiteConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let site = crawl(config, dir.path()).await;
    let hits = site.hits();
    assert_eq!(hits[0].target, "/robots.txt", "robots.txt is read first");
    let delay = std::time::Duration::from_secs(1);
    for pair in hits.windows(2) {
        let gap = pair[1].started - pair[0].started;
        assert!(
            gap >= delay,
            "{} then {} only {gap:?} apart",
            pair[0].target,
            pair[1].target
        );
    }
    // Every page the ground truth names, once.
    let pages: std::collections::BTreeMap<String, u32> = site
        .fetch_counts()
        .into_iter()
        .filter(|(path, _)| path != "/robots.txt" && path != "/sitemap.xml")
        .collect();
    assert_eq!(pages, expected_fetches(&config, MAX_DEPTH));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn robots_txt_and_the_sitemap_are_read_once_by_three_workers() {
    let config = SiteConfig {
        pages: 30,
        ..SiteConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let site = crawl(config, dir.path()).await;
    let counts = site.fetch_counts();
    assert_eq!(counts.get("/robots.txt"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("/sitemap.xml"), Some(&1), "{counts:?}");
}
