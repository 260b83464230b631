//! End-to-end pages/s of `crawl` on the mock site, with 1, 2 and 4
//! workers, against `wget --recursive` on the same site in the same run.
//!
//! `cargo bench --bench crawl_e2e [-- --pages N --latency-ms L --depth D]`
//! (defaults: 10,000 pages, no added latency, depth limit 30 for both
//! crawlers). One host, so both fetch one page at a time (politeness);
//! wget is skipped, with a note, where it is not installed.

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

/// Pages the site answered (robots.txt and the sitemap left out).
fn pages(site: &MockSite) -> usize {
    site.hits()
        .iter()
        .filter(|h| h.target != "/robots.txt" && h.target != "/sitemap.xml")
        .count()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = SiteConfig {
        pages: arg(&args, "--pages", 10_000) as usize,
        latency: Duration::from_millis(arg(&args, "--latency-ms", 0)),
        slow: Duration::from_millis(100),
        ..SiteConfig::default()
    };
    let depth = arg(&args, "--depth", 30).to_string();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    println!(
        "## crawl vs wget: mock site, {} regular pages, {} ms added latency, depth {depth}",
        config.pages,
        config.latency.as_millis()
    );
    println!();
    println!("| crawler | pages fetched | seconds | pages/s | ratio to wget |");
    println!("|---|---:|---:|---:|---:|");
    // wget first: its rate is what the others are compared with.
    let wget = which_wget().map(|wget| {
        let site = runtime.block_on(MockSite::start(config)).expect("site");
        let dir = tempfile::tempdir().expect("temp dir");
        let started = Instant::now();
        let status = Command::new(wget)
            .args([
                "--recursive",
                "--level",
                &depth,
                "--no-parent",
                "--quiet",
                "--tries=1",
            ])
            .arg("--directory-prefix")
            .arg(dir.path())
            .arg(format!("{}/", site.base()))
            .status()
            .expect("wget runs");
        let seconds = started.elapsed().as_secs_f64();
        // wget exits 8 when some pages answered an error (the site has a
        // 404 and a 500) and 4 when a URL's host does not resolve (the
        // site's off-site redirect): still a finished crawl.
        assert!(
            matches!(status.code(), Some(0 | 4 | 8)),
            "wget failed: {status}"
        );
        let fetched = pages(&site);
        (fetched, seconds, fetched as f64 / seconds)
    });
    let rate_of_wget = wget.map(|(_, _, rate)| rate);
    for workers in [1, 2, 4] {
        let site = runtime.block_on(MockSite::start(config)).expect("site");
        let dir = tempfile::tempdir().expect("temp dir");
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_crawl"))
            .arg(format!("{}/", site.base()))
            .args(["--allow-private", "--delay-ms", "0", "--max-depth", &depth])
            // The site's flaky page answers 500 once: retry it at once, as
            // wget would (it does not wait between tries either).
            .args(["--retry-base-secs", "1"])
            .args(["--workers", &workers.to_string(), "--out"])
            .arg(dir.path().join("out"))
            .output()
            .expect("crawl runs");
        let seconds = started.elapsed().as_secs_f64();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let fetched = pages(&site);
        let rate = fetched as f64 / seconds;
        let ratio = rate_of_wget.map_or_else(|| "n/a".to_owned(), |w| format!("{:.2}", rate / w));
        println!("| crawl, {workers} worker(s) | {fetched} | {seconds:.1} | {rate:.0} | {ratio} |");
    }
    match wget {
        Some((fetched, seconds, rate)) => {
            println!("| wget --recursive | {fetched} | {seconds:.1} | {rate:.0} | 1.00 |");
        }
        None => println!("| wget --recursive | not installed | | | |"),
    }
}

fn which_wget() -> Option<&'static str> {
    Command::new("wget")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "wget")
}
