//! Many hosts, each with its own Crawl-delay: `crawl`'s pages/s against
//! the politeness limit (the sum over hosts of 1 / delay), the shortest gap
//! between request starts to a host as the host saw it, and how often each
//! host's robots.txt and sitemap were read.
//!
//! `cargo bench --bench politeness [-- --hosts 100 --pages 200 --workers 4
//! --min-delay-ms 100 --max-delay-ms 200]`: host i (one loopback address
//! each) has a Crawl-delay spread evenly from the least to the most.

use std::process::Command;
use std::time::{Duration, Instant};

use mock_site::{MockSite, SiteConfig};

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hosts = arg(&args, "--hosts", 100) as usize;
    let pages = arg(&args, "--pages", 200) as usize;
    let workers = arg(&args, "--workers", 4);
    let least = arg(&args, "--min-delay-ms", 100);
    let most = arg(&args, "--max-delay-ms", 200).max(least);
    let delay_of = |i: usize| {
        let spread = (most - least) * i as u64 / (hosts.max(2) - 1) as u64;
        Duration::from_millis(least + spread)
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let sites: Vec<MockSite> = runtime.block_on(async {
        let mut sites = Vec::new();
        for i in 0..hosts {
            let config = SiteConfig {
                pages,
                crawl_delay: Some(delay_of(i)),
                slow: Duration::from_millis(50),
                ..SiteConfig::default()
            };
            sites.push(MockSite::start_on_loopback(i, config).await.expect("site"));
        }
        sites
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let seeds: Vec<String> = sites.iter().map(|s| format!("{}/", s.base())).collect();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_crawl"))
        .args(&seeds)
        .args(["--allow-private", "--delay-ms", "0", "--max-depth", "30"])
        // The site's flaky page answers 500 once: retried a second later.
        .args(["--retry-base-secs", "1", "--workers", &workers.to_string()])
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .expect("crawl runs");
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut fetched = 0;
    let mut below = 0;
    let mut tightest = f64::INFINITY;
    let mut robots_most = 0;
    let mut sitemap_most = 0;
    let mut limit = 0.0;
    // A perfectly polite crawler needs (requests - 1) delays for a host;
    // the run as a whole needs the longest of those.
    let mut ideal_seconds: f64 = 0.0;
    let mut efficiencies = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        let delay = delay_of(i);
        limit += 1.0 / delay.as_secs_f64();
        let hits = site.hits();
        fetched += hits.len();
        for pair in hits.windows(2) {
            let gap = pair[1].started - pair[0].started;
            below += usize::from(gap < delay);
            tightest = tightest.min(gap.as_secs_f64() / delay.as_secs_f64());
        }
        if let (Some(first), Some(last)) = (hits.first(), hits.last()) {
            let needed = (hits.len() - 1) as f64 * delay.as_secs_f64();
            ideal_seconds = ideal_seconds.max(needed);
            let span = (last.started - first.started).as_secs_f64();
            if span > 0.0 {
                efficiencies.push(needed / span);
            }
        }
        let counts = site.fetch_counts();
        robots_most = robots_most.max(counts.get("/robots.txt").copied().unwrap_or(0));
        sitemap_most = sitemap_most.max(counts.get("/sitemap.xml").copied().unwrap_or(0));
    }
    let rate = fetched as f64 / seconds;
    let mean = efficiencies.iter().sum::<f64>() / efficiencies.len().max(1) as f64;
    let least_efficient = efficiencies.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "## Politeness: {hosts} hosts x {pages} pages, Crawl-delay {least}-{most} ms, {workers} workers"
    );
    println!();
    println!("| figure | value |");
    println!("|---|---:|");
    println!("| requests (all hosts) | {fetched} |");
    println!("| seconds (whole run, start-up included) | {seconds:.1} |");
    println!("| requests/s | {rate:.0} |");
    println!("| politeness limit/s (sum of 1/delay) | {limit:.0} |");
    println!("| seconds a perfectly polite crawler needs (longest host) | {ideal_seconds:.1} |");
    println!(
        "| run against that ideal | {:.2} |",
        ideal_seconds / seconds
    );
    println!(
        "| per host, its requests' span against (requests - 1) delays: mean, least | {mean:.3}, {least_efficient:.3} |"
    );
    println!("| gaps between request starts below the delay | {below} |");
    println!("| shortest gap / delay | {tightest:.3} |");
    println!("| robots.txt reads per host, most | {robots_most} |");
    println!("| sitemap reads per host, most | {sitemap_most} |");
}
