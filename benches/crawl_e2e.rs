//! End-to-end pages/s and CPU per page (user + system time of the whole
//! process over pages fetched) of `crawl` on the mock site, with 1, 2 and 4
//! workers, against `wget --recursive` on the same site in the same run;
//! then the links `crawl` sends the frontier per page with its seen cache
//! and without.
//!
//! `cargo bench --bench crawl_e2e [-- --pages N --latency-ms L --depth D
//! --rounds R --baseline PATH]` (defaults: 10,000 pages, no added latency,
//! depth limit 30 for both crawlers, one round). Each round runs wget, the
//! crawls, then wget again, and reads each crawl against the faster wget
//! beside it. `--baseline` adds another build of `crawl` (1 worker) to
//! every round, for paired before/after comparisons. One host, so both fetch one page at a time (politeness);
//! wget is skipped, with a note, where it is not installed. wget writes to
//! a tmpfs and `crawl` to the disk (see [`WGET_DIR`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mock_site::{MockSite, SiteConfig};

#[path = "../frontier/benches/common/cpu.rs"]
mod cpu;
use cpu::{Whose, cpu_seconds};

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn text_arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// One `wget --recursive` of a fresh site: pages fetched, seconds, pages/s,
/// CPU seconds.
fn run_wget(
    runtime: &tokio::runtime::Runtime,
    config: SiteConfig,
    depth: &str,
    wget: &str,
    kept: &mut Vec<tempfile::TempDir>,
) -> (usize, f64, f64, f64) {
    let (site, dir) = fresh_site(runtime, config, Path::new(WGET_DIR));
    let ((status, seconds), cpu) = with_child_cpu(|| {
        timed(|| {
            Command::new(wget)
                .args([
                    "--recursive",
                    "--level",
                    depth,
                    "--no-parent",
                    "--quiet",
                    "--tries=1",
                ])
                .arg("--directory-prefix")
                .arg(dir.path())
                .arg(format!("{}/", site.base()))
                .status()
                .expect("wget runs")
        })
    });
    // wget exits 8 when some pages answered an error (the site has a 404
    // and a 500) and 4 when a URL's host does not resolve (the site's
    // off-site redirect): still a finished crawl.
    assert!(
        matches!(status.code(), Some(0 | 4 | 8)),
        "wget failed: {status}"
    );
    let fetched = pages(&site);
    kept.push(dir);
    (fetched, seconds, fetched as f64 / seconds, cpu)
}

/// Where wget writes: a tmpfs. wget writes a file per page, and on ext4 it
/// took two to five times as long for minutes after many files were
/// deleted anywhere on the disk (the inode allocator skips recently freed
/// inodes), as they are after every crawl of this bench and every test
/// run. On a tmpfs wget runs at its best every time; `crawl` writes its
/// store (with its syncs) and WARC files to the disk as usual.
const WGET_DIR: &str = "/dev/shm";

/// A fresh mock site and a directory under `parent` (the system's temporary
/// directory where `parent` is missing) for what a crawler writes, with
/// the disk quiet: what earlier runs wrote is flushed first, so a run's
/// syncs do not wait for another's pages. The caller keeps every run's
/// directory until nothing is timed any more, so that no run creates
/// files right after a removal.
fn fresh_site(
    runtime: &tokio::runtime::Runtime,
    config: SiteConfig,
    parent: &Path,
) -> (MockSite, tempfile::TempDir) {
    let site = runtime.block_on(MockSite::start(config)).expect("site");
    let dir = tempfile::tempdir_in(parent)
        .or_else(|_| tempfile::tempdir())
        .expect("temp dir");
    let _ = Command::new("sync").status();
    (site, dir)
}

/// What `run` gives, and its wall-clock seconds.
fn timed<T>(run: impl FnOnce() -> T) -> (T, f64) {
    let started = Instant::now();
    let out = run();
    (out, started.elapsed().as_secs_f64())
}

/// What `run` gives, and the CPU seconds of the children it waited for.
fn with_child_cpu<T>(run: impl FnOnce() -> T) -> (T, f64) {
    let before = cpu_seconds(Whose::WaitedChildren);
    let out = run();
    (out, cpu_seconds(Whose::WaitedChildren) - before)
}

/// Pages the site answered (robots.txt and the sitemap left out).
fn pages(site: &MockSite) -> usize {
    site.page_fetches().values().map(|&n| n as usize).sum()
}

/// The number after `label` in a `crawl` summary.
fn summary_figure(summary: &str, label: &str) -> Option<u64> {
    let at = summary.find(label)? + label.len();
    summary[at..]
        .split_whitespace()
        .next()?
        .trim_end_matches(',')
        .parse()
        .ok()
}

/// One `crawl` of a fresh site: pages fetched, seconds, CPU seconds, the
/// summary.
fn run_crawl(
    runtime: &tokio::runtime::Runtime,
    config: SiteConfig,
    depth: &str,
    bin: &Path,
    workers: usize,
    extra: &[&str],
    kept: &mut Vec<tempfile::TempDir>,
) -> (usize, f64, f64, String) {
    let (site, dir) = fresh_site(runtime, config, &std::env::temp_dir());
    let ((output, seconds), cpu) = with_child_cpu(|| {
        timed(|| {
            Command::new(bin)
                .arg(format!("{}/", site.base()))
                .args(["--allow-private", "--delay-ms", "0", "--max-depth", depth])
                // One try per page, as wget's `--tries=1`: the site's flaky page
                // answers 500 once, and a retry would have to wait a second.
                .args(["--max-retries", "0"])
                .args(["--workers", &workers.to_string()])
                .args(extra)
                .arg("--out")
                .arg(dir.path().join("out"))
                .output()
                .expect("crawl runs")
        })
    });
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    kept.push(dir);
    (pages(&site), seconds, cpu, summary)
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
    println!(
        "| round | crawler | pages fetched | seconds | pages/s | ratio to the faster wget | CPU ms per page |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    // wget before and after the crawls of each round, and each crawl's
    // ratio against the faster of the two: the machine's speed drifts
    // within a run, and this reads the drift against `crawl`.
    let wget_bin = which_wget();
    let mut crawlers: Vec<(String, PathBuf, usize)> = [1, 2, 4]
        .into_iter()
        .map(|workers| {
            (
                format!("crawl, {workers} worker(s)"),
                PathBuf::from(env!("CARGO_BIN_EXE_crawl")),
                workers,
            )
        })
        .collect();
    if let Some(baseline) = text_arg(&args, "--baseline") {
        crawlers.push((
            "baseline build, 1 worker".to_owned(),
            PathBuf::from(baseline),
            1,
        ));
    }
    // Every run's output, removed only once nothing is timed any more.
    let mut kept = Vec::new();
    let mut wget_before = wget_bin.map(|wget| run_wget(&runtime, config, &depth, wget, &mut kept));
    for round in 1..=arg(&args, "--rounds", 1) {
        let crawls: Vec<_> = crawlers
            .iter()
            .map(|(name, bin, workers)| {
                let (fetched, seconds, cpu, _) =
                    run_crawl(&runtime, config, &depth, bin, *workers, &[], &mut kept);
                (name, fetched, seconds, cpu)
            })
            .collect();
        let wget_after = wget_bin.map(|wget| run_wget(&runtime, config, &depth, wget, &mut kept));
        let fastest_wget = wget_before
            .iter()
            .chain(wget_after.iter())
            .map(|w| w.2)
            .reduce(f64::max);
        for (name, fetched, seconds, cpu) in crawls {
            let rate = fetched as f64 / seconds;
            let ratio =
                fastest_wget.map_or_else(|| "n/a".to_owned(), |w| format!("{:.2}", rate / w));
            let cpu_ms = 1000.0 * cpu / fetched as f64;
            println!(
                "| {round} | {name} | {fetched} | {seconds:.2} | {rate:.0} | {ratio} | {cpu_ms:.3} |"
            );
        }
        for (when, wget) in [("before", &wget_before), ("after", &wget_after)] {
            match wget {
                Some((fetched, seconds, rate, cpu)) => {
                    let cpu_ms = 1000.0 * cpu / *fetched as f64;
                    let ratio = rate / fastest_wget.unwrap_or(*rate);
                    println!(
                        "| {round} | wget --recursive, {when} | {fetched} | {seconds:.2} | {rate:.0} | {ratio:.2} | {cpu_ms:.3} |"
                    );
                }
                None => println!("| {round} | wget --recursive | not installed | | | | |"),
            }
        }
        wget_before = wget_after;
    }
    println!();
    println!(
        "| crawl, 1 worker | pages fetched | links sent to the frontier | per page | links the seen cache kept back |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (name, extra) in [
        ("seen cache off", ["--seen-cache", "0"]),
        ("seen cache on (default size)", ["--seen-cache", "65536"]),
    ] {
        let (fetched, _, _, summary) = run_crawl(
            &runtime,
            config,
            &depth,
            Path::new(env!("CARGO_BIN_EXE_crawl")),
            1,
            &extra,
            &mut kept,
        );
        let sent = summary_figure(&summary, "links sent ").unwrap_or(0);
        let cached = summary_figure(&summary, "kept back by the seen cache ").unwrap_or(0);
        println!(
            "| {name} | {fetched} | {sent} | {:.2} | {cached} |",
            sent as f64 / fetched as f64
        );
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
