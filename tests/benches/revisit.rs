//! Revisit policies compared on the changing mock site: `adaptive`
//! against `fixed` at the same number of fetches a minute, as real
//! `frontier serve` and `worker` processes (release).
//!
//! Adaptive runs first; fixed then gets the whole-second interval whose
//! fetches a minute (every page each `interval` seconds) come nearest to
//! adaptive's, and both rates are printed.
//! Figures per policy: fetches a minute, mean freshness (the share of
//! time the crawler held a page's current version, from its first fetch
//! on) over the pages that change and over every page, and the body bytes
//! downloaded. Pages that never change are current under any policy once
//! fetched, so freshness over every page is bounded by their share; the
//! policies differ on the pages that change.
//!
//! `cargo bench -p crawl-tests --bench revisit [-- --secs S --fast N
//! --fast-period S --slow N --slow-period S --fixed N --page-kib K]`
//! (defaults: 120 s a policy; 5 pages changing every 3 s, 5 every 60 s,
//! 40 never; 16 KiB pages).

use std::time::Duration;

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli};
use mock_site::changing::{ChangingConfig, ChangingSite};

#[path = "../../frontier/benches/common/mod.rs"]
#[allow(dead_code, reason = "this bench needs only the argument parser")]
mod common;
use common::arg;

/// Adaptive's bounds: from a second to a minute.
const ADAPTIVE: (u64, u64) = (1, 60);

struct Run {
    fetches: usize,
    per_minute: f64,
    fresh_changing: f64,
    fresh_all: f64,
    bytes: usize,
}

async fn crawl(config: ChangingConfig, secs: u64, policy: &[String]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = ["--partitions", "4", "--default-delay-ms", "0"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.extend(policy.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &args);
    let endpoint = frontier.endpoint();
    let worker = WorkerProcess::start(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--concurrency", "4"],
    );
    let site = ChangingSite::start(config).await.unwrap();
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    // The span measured: the crawl runs for it, whatever it does.
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let until = site.elapsed();
    assert!(worker.terminate().success());
    let fetches = site.fetches();
    let (mut changing, mut all) = (Vec::new(), Vec::new());
    for page in site.pages() {
        let Some(fresh) = site.freshness(&page, until) else {
            continue;
        };
        all.push(fresh);
        if page.starts_with("/fast/") || page.starts_with("/slow/") {
            changing.push(fresh);
        }
    }
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
    Run {
        fetches: fetches.len(),
        per_minute: fetches.len() as f64 * 60.0 / until.as_secs_f64(),
        fresh_changing: mean(&changing),
        fresh_all: mean(&all),
        bytes: fetches.iter().map(|f| f.bytes).sum(),
    }
}

fn row(name: &str, run: &Run) {
    println!(
        "| {name} | {:.0} | {:.3} | {:.3} | {:.1} |",
        run.per_minute,
        run.fresh_changing,
        run.fresh_all,
        run.bytes as f64 / (1 << 20) as f64
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = arg(&args, "--secs", 120) as u64;
    let config = ChangingConfig {
        fast: arg(&args, "--fast", 5),
        fast_period: Duration::from_secs(arg(&args, "--fast-period", 3) as u64),
        slow: arg(&args, "--slow", 5),
        slow_period: Duration::from_secs(arg(&args, "--slow-period", 60) as u64),
        fixed: arg(&args, "--fixed", 40),
        page_bytes: arg(&args, "--page-kib", 16) << 10,
        answers_304: true,
    };
    let pages = 1 + config.fast + config.slow + config.fixed;
    let adaptive = crawl(
        config,
        secs,
        &[
            "--revisit".into(),
            "adaptive".into(),
            "--revisit-min-secs".into(),
            ADAPTIVE.0.to_string(),
            "--revisit-max-secs".into(),
            ADAPTIVE.1.to_string(),
        ],
    )
    .await;
    // Every page each `interval`: adaptive's fetches in the span, nearest.
    let interval =
        ((pages as f64 * secs as f64 / adaptive.fetches.max(1) as f64).round() as u64).max(1);
    let fixed = crawl(
        config,
        secs,
        &[
            "--revisit".into(),
            "fixed".into(),
            "--revisit-min-secs".into(),
            interval.to_string(),
        ],
    )
    .await;
    println!(
        "{pages} pages ({} every {} s, {} every {} s, {} never, {} KiB each), {secs} s a policy",
        config.fast,
        config.fast_period.as_secs(),
        config.slow,
        config.slow_period.as_secs(),
        config.fixed + 1,
        config.page_bytes >> 10
    );
    println!(
        "| policy | fetches/min | fresh (changing pages) | fresh (all pages) | MiB downloaded |"
    );
    println!("|---|---|---|---|---|");
    row(
        &format!("adaptive {}-{} s", ADAPTIVE.0, ADAPTIVE.1),
        &adaptive,
    );
    row(&format!("fixed {interval} s"), &fixed);
    println!(
        "adaptive / fixed: freshness {:.2}x on changing pages, {:.2}x on all; fetches {:.2}x; bytes {:.2}x",
        adaptive.fresh_changing / fixed.fresh_changing.max(f64::EPSILON),
        adaptive.fresh_all / fixed.fresh_all.max(f64::EPSILON),
        adaptive.fetches as f64 / fixed.fetches.max(1) as f64,
        adaptive.bytes as f64 / fixed.bytes.max(1) as f64
    );
}
