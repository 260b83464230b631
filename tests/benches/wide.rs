//! A wide polite crawl: many small hosts at one delay, crawled by real
//! `frontier serve` and `worker` processes (release), against the polite
//! best, `hosts x pages / ((pages + 1) x delay)` pages a second (each host's
//! pages and its robots.txt one delay apart, every host at once).
//!
//! Figures: pages a second and their share of the polite best, gaps
//! between two requests to one host shorter than the delay (as the host
//! saw them), the most hosts a worker held at once, and each worker's
//! resident memory grown over its idle start, per host held.
//!
//! `cargo bench -p crawl-tests --bench wide [-- --hosts 1000 --pages 10
//! --delay-ms 1000 --latency-ms 0 --workers 2 --max-queues N]`: the wide
//! mock site (`mock_site::wide`), one host an address; the frontier's
//! default delay is the politeness; workers on their default flags (with
//! `--max-queues` when given: a fixed cap on the hosts held, for
//! comparison), sitemaps off (the site has none, and the polite best
//! counts robots.txt alone).

use std::time::{Duration, Instant};

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli};
use mock_site::wide::{WideConfig, WideSite};

#[path = "../../frontier/benches/common/mod.rs"]
#[allow(dead_code, reason = "this bench needs only the argument parser")]
mod common;
use common::arg;

#[path = "common/proc.rs"]
mod proc;
use proc::resident_bytes as rss;

/// The `worker_hosts_held` gauge a worker's metrics page shows.
async fn hosts_held(client: &reqwest::Client, metrics: &str) -> u64 {
    let Ok(response) = client.get(metrics).send().await else {
        return 0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix("worker_hosts_held "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |held| held as u64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hosts = arg(&args, "--hosts", 1000);
    let pages = arg(&args, "--pages", 10);
    let delay = Duration::from_millis(arg(&args, "--delay-ms", 1000) as u64);
    let latency = Duration::from_millis(arg(&args, "--latency-ms", 0) as u64);
    let workers = arg(&args, "--workers", 2);
    let max_queues = arg(&args, "--max-queues", 0);
    let site = WideSite::start(WideConfig {
        hosts,
        pages,
        latency,
        ..WideConfig::default()
    })
    .await
    .expect("the wide site starts");
    let dir = tempfile::tempdir().unwrap();
    let hosts_file = dir.path().join("hosts");
    std::fs::write(&hosts_file, site.hosts_file()).unwrap();
    let seeds = dir.path().join("seeds");
    std::fs::write(&seeds, site.seeds()).unwrap();
    let delay_ms = delay.as_millis().to_string();
    let frontier =
        FrontierProcess::start(&dir.path().join("data"), &["--default-delay-ms", &delay_ms]);
    let endpoint = frontier.endpoint();
    let hosts_file = hosts_file.to_string_lossy().into_owned();
    let cap = max_queues.to_string();
    let mut worker_args = vec!["--hosts-file", hosts_file.as_str(), "--no-sitemaps"];
    if max_queues > 0 {
        worker_args.extend(["--max-queues", cap.as_str()]);
    }
    let mut running = Vec::new();
    for w in 0..workers {
        let (worker, metrics) = WorkerProcess::start_with_metrics(
            &endpoint,
            &dir.path().join("out"),
            &format!("w{w}"),
            &worker_args,
        );
        let idle_rss = rss(worker.pid());
        running.push((worker, metrics, idle_rss));
    }
    let client = reqwest::Client::new();
    let (status, text) = frontier_cli(&endpoint, &["seed", "--file", &seeds.to_string_lossy()]);
    assert!(status.success(), "{text}");
    let wanted = hosts * pages;
    let mut most_held = vec![0_u64; workers];
    let mut rss_at_most = vec![0_u64; workers];
    let deadline = Instant::now()
        + delay * u32::try_from(pages + 1).unwrap_or(u32::MAX) * 20
        + Duration::from_secs(120);
    // Sampled, not waited on: the crawl runs at its own pace.
    loop {
        for (w, (worker, metrics, _)) in running.iter().enumerate() {
            let held = hosts_held(&client, metrics).await;
            if held > most_held[w] {
                most_held[w] = held;
                rss_at_most[w] = rss(worker.pid());
            }
        }
        let fetched = site
            .hits()
            .iter()
            .filter(|hit| hit.status == 200 && hit.path != "/robots.txt")
            .count();
        if fetched >= wanted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {fetched} of {wanted} pages fetched"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hits = site.hits();
    let first = hits.iter().map(|hit| hit.at).min().unwrap();
    let last_page = hits
        .iter()
        .filter(|hit| hit.path != "/robots.txt")
        .map(|hit| hit.at)
        .max()
        .unwrap();
    let seconds = (last_page - first).as_secs_f64();
    let mut below = 0;
    let mut tightest = f64::INFINITY;
    for host_hits in site.hits_by_host().values() {
        for pair in host_hits.windows(2) {
            let gap = pair[1].at - pair[0].at;
            below += usize::from(gap < delay);
            tightest = tightest.min(gap.as_secs_f64() / delay.as_secs_f64());
        }
    }
    let rate = wanted as f64 / seconds;
    let best = (hosts * pages) as f64 / ((pages + 1) as f64 * delay.as_secs_f64());
    let per_host: Vec<String> = running
        .iter()
        .zip(most_held.iter().zip(&rss_at_most))
        .map(|((_, _, idle), (held, at_most))| {
            format!(
                "{} KiB",
                at_most.saturating_sub(*idle) / (*held).max(1) / 1024
            )
        })
        .collect();
    for (worker, _, _) in running {
        assert!(worker.terminate().success());
    }
    let cap = if max_queues > 0 {
        format!("--max-queues {max_queues}")
    } else {
        "default flags".to_owned()
    };
    println!(
        "{hosts} hosts x {pages} pages, delay {} ms, latency {}-{} ms, {workers} workers ({cap})",
        delay.as_millis(),
        latency.as_millis(),
        latency.as_millis() * 2
    );
    println!("| figure | value |");
    println!("|---|---:|");
    println!("| pages | {wanted} |");
    println!("| seconds (first request to last page) | {seconds:.1} |");
    println!("| pages/s | {rate:.0} |");
    println!("| polite best, pages/s | {best:.0} |");
    println!("| against the polite best | {:.2} |", rate / best);
    println!("| gaps to a host below the delay | {below} |");
    println!("| shortest gap / delay | {tightest:.3} |");
    println!(
        "| hosts held at once, most, per worker | {} |",
        most_held
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| resident memory grown per host held, per worker | {} |",
        per_host.join(", ")
    );
}
