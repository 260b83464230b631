//! A partition move under load, as real `frontier serve` processes with a
//! real etcd: how fast a partition of about a million URLs travels to a
//! node that joins, how long its cutover pauses it, and what ingest does
//! during the move compared with outside one.
//!
//! Node n1 alone, `--partitions 2`, is filled with the ingest workload
//! (PutDiscovered, batches of 256, 10,000 hosts, 45% known), so each
//! partition holds about half of what is stored. Then the same feed runs
//! for a while with no move (the baseline), and again while n2 joins and
//! takes one partition: the feed stops once the move is over. Each of the
//! feed's streams keeps at most 8 batches unacknowledged, as a worker
//! does, and every batch's ack latency is recorded.
//!
//! `cargo bench -p crawl-tests --bench partition_move [-- --urls N
//! --streams S --baseline-secs T]` (defaults 3,700,000 URLs offered to
//! fill, which stores about 2 million; 4 streams; 10 s). Needs `etcd` on
//! PATH (Debian's `etcd-server`); without it the run says so and measures
//! nothing.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crawl_tests::{EtcdProcess, FrontierProcess, etcd_binary};
use proto::urlfrontier::{self as uf, url_frontier_client::UrlFrontierClient};
use tonic::transport::Channel;

#[path = "../../frontier/benches/common/mod.rs"]
mod common;
#[path = "../../frontier/benches/common/feed.rs"]
mod feed;
use common::arg;

/// Batches a feed stream leaves unacknowledged at most.
const WINDOW: usize = 8;

/// What a timed feed got back.
struct Timed {
    acked: usize,
    seconds: f64,
    /// Ack latency of every batch, in ms, sorted.
    latencies_ms: Vec<f64>,
}

impl Timed {
    fn rate(&self) -> f64 {
        self.acked as f64 / self.seconds
    }

    fn latency(&self, quantile: f64) -> f64 {
        let last = self.latencies_ms.len().saturating_sub(1);
        self.latencies_ms
            .get((last as f64 * quantile).round() as usize)
            .copied()
            .unwrap_or(0.0)
    }
}

/// Feeds new batches (numbered on from `next`) over `streams` streams
/// until `stop` is set.
async fn feed_until(
    client: &UrlFrontierClient<Channel>,
    next: &Arc<AtomicUsize>,
    streams: usize,
    stop: &Arc<AtomicBool>,
) -> Timed {
    let started = Instant::now();
    let tasks = (0..streams).map(|_| {
        let mut client = client.clone();
        let (next, stop) = (Arc::clone(next), Arc::clone(stop));
        async move {
            let window = Arc::new(tokio::sync::Semaphore::new(WINDOW));
            let sent = Arc::new(Mutex::new(VecDeque::new()));
            let requests = {
                let sent = Arc::clone(&sent);
                futures::stream::unfold((), move |()| {
                    let (window, sent, next, stop) = (
                        Arc::clone(&window),
                        Arc::clone(&sent),
                        Arc::clone(&next),
                        Arc::clone(&stop),
                    );
                    async move {
                        let permit = window.acquire_owned().await.ok()?;
                        if stop.load(Ordering::Relaxed) {
                            return None;
                        }
                        let batch = next.fetch_add(1, Ordering::Relaxed);
                        sent.lock().unwrap().push_back((Instant::now(), permit));
                        Some((
                            uf::DiscoveredBatch {
                                id: batch.to_string(),
                                done: None,
                                items: (0..256)
                                    .map(|i| uf::UrlInfo {
                                        url: common::url(batch, batch * 256 + i),
                                        ..uf::UrlInfo::default()
                                    })
                                    .collect(),
                            },
                            (),
                        ))
                    }
                })
            };
            let mut acked = 0;
            let mut latencies = Vec::new();
            let mut acks = client
                .put_discovered(requests)
                .await
                .expect("PutDiscovered")
                .into_inner();
            while let Some(ack) = acks.message().await.expect("acks") {
                acked += ack.statuses.len();
                let (at, permit) = sent.lock().unwrap().pop_front().expect("a sent batch");
                latencies.push(at.elapsed().as_secs_f64() * 1e3);
                drop(permit);
            }
            (acked, latencies)
        }
    });
    let mut acked = 0;
    let mut latencies_ms = Vec::new();
    for (count, latencies) in futures::future::join_all(tasks).await {
        acked += count;
        latencies_ms.extend(latencies);
    }
    latencies_ms.sort_by(f64::total_cmp);
    Timed {
        acked,
        seconds: started.elapsed().as_secs_f64(),
        latencies_ms,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What was seen of the move, polling GetCluster.
#[derive(Default)]
struct Watched {
    started_at_ms: u64,
    cutover_seen_ms: u64,
    flipped_seen_ms: u64,
    done_ms: u64,
    copied: u64,
    copied_bytes: u64,
    cutover_ms: u64,
}

/// Polls until one move has started and ended, noting its phases.
async fn watch_move(node: &FrontierProcess) -> Watched {
    let mut admin = node.admin().await;
    let mut seen = Watched::default();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let status = admin
            .get_cluster(proto::admin::GetClusterRequest {})
            .await
            .expect("GetCluster")
            .into_inner();
        let now = unix_ms();
        match status.moves.first() {
            Some(moving) => {
                seen.started_at_ms = moving.started_at_ms;
                seen.copied = moving.copied;
                seen.copied_bytes = moving.copied_bytes;
                match moving.phase.as_str() {
                    "cutover" if seen.cutover_seen_ms == 0 => seen.cutover_seen_ms = now,
                    "flipped" => {
                        if seen.flipped_seen_ms == 0 {
                            seen.flipped_seen_ms = now;
                        }
                        seen.cutover_ms = moving.cutover_ms;
                    }
                    _ => {}
                }
            }
            None if seen.started_at_ms > 0 => {
                seen.done_ms = now;
                return seen;
            }
            None => {}
        }
        assert!(Instant::now() < deadline, "the move did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn node_flags(etcd: &str, id: &str, expected: usize) -> Vec<String> {
    [
        "--partitions",
        "2",
        "--default-delay-ms",
        "0",
        "--expected-urls",
        &expected.to_string(),
        "--scope",
        "any",
        "--etcd",
        etcd,
        "--cluster",
        "movebench",
        "--node-id",
        id,
        "--lease-ttl-secs",
        "10",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn start_node(dir: &Path, flags: &[String]) -> FrontierProcess {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    FrontierProcess::start(dir, &flags)
}

async fn run(fill: usize, streams: usize, baseline_secs: u64) {
    let Some(etcd_path) = etcd_binary() else {
        println!("no etcd on PATH (Debian: apt-get install etcd-server): nothing measured");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let etcd = EtcdProcess::start(&etcd_path);
    let n1 = start_node(
        &dir.path().join("n1"),
        &node_flags(&etcd.endpoint, "n1", fill * 2),
    );
    let client = UrlFrontierClient::connect(n1.endpoint())
        .await
        .expect("connects");
    // Wait for n1's map before feeding.
    let mut admin = n1.admin().await;
    while admin
        .get_cluster(proto::admin::GetClusterRequest {})
        .await
        .map_or(true, |s| s.get_ref().epoch == 0)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let batches = fill / 256;
    let filled = feed::put_discovered(&client, 0..batches, streams).await;
    let next = Arc::new(AtomicUsize::new(batches));

    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(baseline_secs)).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let outside = feed_until(&client, &next, streams, &stop).await;
    timer.await.expect("timer");

    let n2 = start_node(
        &dir.path().join("n2"),
        &node_flags(&etcd.endpoint, "n2", fill * 2),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = Arc::clone(&stop);
        let n1 = &n1;
        async move {
            let seen = watch_move(n1).await;
            stop.store(true, Ordering::Relaxed);
            seen
        }
    };
    let (during, seen) = tokio::join!(feed_until(&client, &next, streams, &stop), watcher);
    let held_by_n2 = n2
        .client()
        .await
        .count_ur_ls(uf::CountUrlParams {
            local: Some(true),
            ..uf::CountUrlParams::default()
        })
        .await
        .expect("CountURLs")
        .into_inner()
        .value;

    let copy_secs = seen.cutover_seen_ms.saturating_sub(seen.started_at_ms) as f64 / 1e3;
    let whole_secs = seen.done_ms.saturating_sub(seen.started_at_ms) as f64 / 1e3;
    println!("## Frontier cluster: a partition move under load");
    println!();
    println!(
        "Filled n1 (2 partitions) with {} URLs offered, {} stored; n2 joins and takes one \
         partition while {streams} PutDiscovered streams go on (at most {WINDOW} batches of \
         256 unacknowledged each). Real processes and etcd on loopback, one 2-core machine \
         for all of them.",
        batches * 256,
        filled.stored
    );
    println!();
    println!("| move | figure |");
    println!("|---|---:|");
    println!("| URLs copied | {} |", seen.copied);
    println!(
        "| MB copied (URLs and records) | {:.1} |",
        seen.copied_bytes as f64 / 1e6
    );
    println!("| copy, s | {copy_secs:.1} |");
    println!(
        "| copy rate, URLs/s | {:.0} |",
        seen.copied as f64 / copy_secs.max(1e-9)
    );
    println!(
        "| copy rate, MB/s | {:.1} |",
        seen.copied_bytes as f64 / 1e6 / copy_secs.max(1e-9)
    );
    println!("| cutover (seal to flip), ms | {} |", seen.cutover_ms);
    println!("| whole move (start to removal), s | {whole_secs:.1} |");
    println!("| URLs the receiver holds after | {held_by_n2} |");
    println!();
    println!("| ingest | URLs acked | seconds | URLs/s | ack p50 ms | ack p99 ms | ack max ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, timed) in [("outside a move", &outside), ("during the move", &during)] {
        println!(
            "| {name} | {} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} |",
            timed.acked,
            timed.seconds,
            timed.rate(),
            timed.latency(0.5),
            timed.latency(0.99),
            timed.latency(1.0)
        );
    }
    println!();
    println!(
        "Ingest during the move: {:.2}x the rate outside one.",
        during.rate() / outside.rate()
    );
    for line in n1.log_text().lines() {
        if line.contains("handed-over partition deleted here") {
            println!();
            println!("n1: {line}");
        }
    }
    println!();
    println!(
        "Fill ({} stored, {} known already): URLs/s per tenth {}",
        filled.stored,
        filled.skipped,
        feed::rates_per_tenth(&filled.tenths)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fill = arg(&args, "--urls", 3_700_000);
    let streams = arg(&args, "--streams", 4).max(1);
    let baseline_secs = arg(&args, "--baseline-secs", 10).max(1) as u64;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run(fill, streams, baseline_secs));
}
