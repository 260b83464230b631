//! Politeness across workers, as the site sees it: with three workers,
//! every gap between request starts to a host (robots.txt and sitemaps
//! included) is at least the host's delay, with no latency allowance, a
//! sub-second Crawl-delay to the millisecond; and robots.txt and the
//! sitemap are each read once per host for the whole deployment.

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli};
use std::time::Duration;

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
    crawl_sites(std::slice::from_ref(&site), dir);
    site
}

fn crawl_sites(sites: &[MockSite], dir: &std::path::Path) {
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
    for site in sites {
        let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
        assert!(status.success(), "{text}");
    }
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "240"]);
    assert!(status.success(), "crawl did not finish: {text}");
}

/// Every gap between request starts to the site, robots.txt's included,
/// is at least `delay`, as the site saw them.
fn assert_spaced(site: &MockSite, delay: Duration) {
    let hits = site.hits();
    assert_eq!(hits[0].target, "/robots.txt", "robots.txt is read first");
    for pair in hits.windows(2) {
        let gap = pair[1].started - pair[0].started;
        assert!(
            gap >= delay,
            "{} then {} only {gap:?} apart",
            pair[0].target,
            pair[1].target
        );
    }
}

/// Every page the ground truth names, once.
fn assert_crawled_once(site: &MockSite, config: &SiteConfig) {
    assert_eq!(site.page_fetches(), expected_fetches(config, MAX_DEPTH));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gap_between_request_starts_holds_the_crawl_delay_with_three_workers() {
    let delay = Duration::from_secs(1);
    let config = SiteConfig {
        pages: 4,
        crawl_delay: Some(delay),
        ..SiteConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let site = crawl(config, dir.path()).await;
    assert_spaced(&site, delay);
    assert_crawled_once(&site, &config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_second_crawl_delay_holds_to_the_millisecond_on_each_of_three_hosts() {
    let delay = Duration::from_millis(250);
    let config = SiteConfig {
        pages: 4,
        crawl_delay: Some(delay),
        ..SiteConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let sites = MockSite::start_hosts(3, config).await.unwrap();
    crawl_sites(&sites, dir.path());
    for site in &sites {
        assert_spaced(site, delay);
        assert_crawled_once(site, &config);
        let counts = site.fetch_counts();
        assert_eq!(counts.get("/robots.txt"), Some(&1), "{counts:?}");
        assert_eq!(counts.get("/sitemap.xml"), Some(&1), "{counts:?}");
        // Not rounded up to whole seconds: the host's requests took about
        // a quarter of a second each, well under a second each.
        let hits = site.hits();
        let span = hits[hits.len() - 1].started - hits[0].started;
        let gaps = u32::try_from(hits.len() - 1).unwrap();
        assert!(
            span < Duration::from_millis(700) * gaps,
            "{} requests over {span:?}: the delay was rounded up",
            hits.len()
        );
    }
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
