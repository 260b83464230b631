//! The frontier at scale, as a process: ingest of N URLs over gRPC with
//! durable acks, resident memory per stored URL, and restart time after a
//! clean stop (SIGTERM) and after `kill -9` in the middle of ingest.
//!
//! With `--revisit never|adaptive`, every stored URL is then reported
//! fetched as this project's worker reports a page (outcome, status, and
//! what a revisit needs: ETag, Last-Modified, payload digest, capture
//! date, the finding), to a frontier started with that policy, before the
//! bytes on disk are measured: `adaptive` keeps the validators and the
//! page's history, `never` keeps none of them.
//!
//! `cargo bench -p frontier --bench scale [-- --urls N --streams S --window W --revisit P --keep-data]`
//! (defaults 10,000,000 URLs, 4 streams; `--window W`: each stream keeps
//! at most W batches unacknowledged, as a worker does, instead of sending
//! as far ahead as flow control allows; `--keep-data` leaves the data
//! directory, and the servers' logs beside it, behind for inspection). Runs the `frontier` binary of the
//! bench build with its default flags (64 partitions, filters rebuilt at
//! double size as they fill) on a temporary data directory.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proto::urlfrontier as uf;
use uf::url_frontier_client::UrlFrontierClient;

mod common;
use common::arg;
#[path = "common/feed.rs"]
mod feed;

/// A running `frontier serve` and the time it took to listen.
struct Server {
    child: Child,
    endpoint: String,
    started_in: Duration,
}

impl Server {
    fn start(data_dir: &Path, log: &Path, revisit: Option<&str>) -> Self {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_frontier"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(["--revisit", revisit.unwrap_or("never")])
            // RUST_LOG passes through, to read the server's debug lines.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("frontier starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reads stdout");
        let started_in = started.elapsed();
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "frontier did not start:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
            .split_whitespace()
            .next()
            .expect("an address")
            .to_owned();
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Self {
            child,
            endpoint: format!("http://{address}"),
            started_in,
        }
    }

    /// The numbers of `/proc/PID/FILE` lines starting with each of
    /// `names` (0 for one not found).
    fn proc_fields<const N: usize>(&self, file: &str, names: [&str; N]) -> [u64; N] {
        let text = std::fs::read_to_string(format!("/proc/{}/{file}", self.child.id()))
            .unwrap_or_default();
        names.map(|name| {
            text.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        })
    }

    /// (resident, peak resident) bytes, from /proc.
    fn memory(&self) -> (u64, u64) {
        let [resident, peak] = self.proc_fields("status", ["VmRSS:", "VmHWM:"]);
        (resident * 1024, peak * 1024)
    }

    /// (bytes read, bytes written) by the server at the block layer, from
    /// /proc: what its files cost the disk, beyond what they hold.
    fn disk_io(&self) -> (u64, u64) {
        let [read, written] = self.proc_fields("io", ["read_bytes:", "write_bytes:"]);
        (read, written)
    }

    fn terminate(mut self) -> Duration {
        let started = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        assert!(self.child.wait().expect("exits").success());
        started.elapsed()
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("exits");
    }
}

/// Feeds batches over a fresh connection.
async fn ingest(
    endpoint: &str,
    batches: std::ops::Range<usize>,
    streams: usize,
    window: Option<usize>,
) -> feed::Fed {
    let client = UrlFrontierClient::connect(endpoint.to_owned())
        .await
        .expect("connects");
    feed::put_discovered_within(&client, batches, streams, window).await
}

/// Reports every distinct URL of `batches` fetched, as the worker reports
/// a page, over `streams` PutURLs streams; answers the reports acked OK.
async fn report_fetched(endpoint: &str, batches: std::ops::Range<usize>, streams: usize) -> usize {
    use proto::metadata;
    let client = UrlFrontierClient::connect(endpoint.to_owned())
        .await
        .expect("connects");
    let one = |key: &str, value: String| {
        (
            key.to_owned(),
            uf::StringList {
                values: vec![value],
            },
        )
    };
    let tasks = (0..streams).map(|stream| {
        let mut client = client.clone();
        let ids = (batches.start + stream..batches.end).step_by(streams);
        let items = ids.flat_map(move |batch| {
            (batch * 256..(batch + 1) * 256)
                // The URLs of their own (the others repeat them).
                .filter(move |n| batch == 0 || n % 100 >= 45)
                .map(move |n| uf::UrlItem {
                    item: Some(uf::url_item::Item::Known(uf::KnownUrlItem {
                        info: Some(uf::UrlInfo {
                            url: common::url(batch, n),
                            metadata: [
                                one("outcome", "fetched".into()),
                                one("status", "200".into()),
                                one(metadata::ETAG, format!("\"{n:x}-5f3a9c1b\"")),
                                one(
                                    metadata::LAST_MODIFIED,
                                    "Sat, 28 Nov 2026 10:00:00 GMT".into(),
                                ),
                                one(metadata::DIGEST, format!("sha1:{:0>32}", format!("{n:X}"))),
                                one(metadata::CAPTURED, "1795860000".into()),
                                one(metadata::FOUND, "changed".into()),
                            ]
                            .into(),
                            ..uf::UrlInfo::default()
                        }),
                        refetchable_from_date: 0,
                    })),
                    id: n.to_string(),
                    ..uf::UrlItem::default()
                })
        });
        async move {
            let Ok(acks) = client.put_ur_ls(futures::stream::iter(items)).await else {
                return 0;
            };
            let mut acks = acks.into_inner();
            let mut ok = 0;
            while let Ok(Some(ack)) = acks.message().await {
                ok += usize::from(ack.status == uf::ack_message::Status::Ok as i32);
            }
            ok
        }
    });
    futures::future::join_all(tasks).await.into_iter().sum()
}

async fn count_urls(endpoint: &str) -> u64 {
    let mut client = UrlFrontierClient::connect(endpoint.to_owned())
        .await
        .expect("connects");
    client
        .count_ur_ls(uf::CountUrlParams {
            crawl_id: "DEFAULT".into(),
            ..uf::CountUrlParams::default()
        })
        .await
        .expect("CountURLs answers")
        .into_inner()
        .value
}

/// The bytes of a directory's files, with those below it: (what the disk
/// holds for them, their lengths). A redb file is longer than what is
/// written of it (it grows ahead of its writes), and the part never
/// written takes no room on the disk.
fn dir_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        if metadata.is_dir() {
            let (held, length) = dir_bytes(&entry.path());
            total = (total.0 + held, total.1 + length);
        } else {
            total = (total.0 + metadata.blocks() * 512, total.1 + metadata.len());
        }
    }
    total
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total = arg(&args, "--urls", 10_000_000);
    let streams = arg(&args, "--streams", 4).max(1);
    // 0: each stream sends as far ahead as flow control allows.
    let window = Some(arg(&args, "--window", 0)).filter(|&w| w > 0);
    let revisit = args
        .iter()
        .position(|a| a == "--revisit")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let batches = total / 256;

    let server = Server::start(&data, &log("first"), revisit);
    let started = Instant::now();
    let started_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let fed = runtime.block_on(ingest(&server.endpoint, 0..batches, streams, window));
    let (stored, skipped) = (fed.stored, fed.skipped);
    let seconds = started.elapsed().as_secs_f64();
    let (resident, peak) = server.memory();
    let (read, written) = server.disk_io();
    println!(
        "## Scale: {} URLs offered over gRPC, {streams} streams of PutDiscovered batches of 256 ({}), 10,000 hosts, 45% known\n",
        batches * 256,
        window.map_or_else(
            || "as far ahead as flow control allows".to_owned(),
            |w| format!("at most {w} unacknowledged each")
        )
    );
    println!("| URLs offered | stored | skipped | seconds | URLs/s |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {stored} | {skipped} | {seconds:.1} | {:.0} |\n",
        batches * 256,
        (batches * 256) as f64 / seconds
    );
    println!(
        "Rate per tenth of the run (URLs/s): {}\n",
        feed::rates_per_tenth(&fed.tenths)
    );
    println!(
        "Ack latency per batch of 256: p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms; whole seconds without an ack: {} of {}\n",
        fed.latency_ms(0.5),
        fed.latency_ms(0.99),
        fed.latency_ms(0.999),
        fed.latency_ms(1.0),
        fed.seconds_without_acks(),
        fed.acks_per_second.len()
    );
    if fed.seconds_without_acks() > 0 {
        // To match against the server's log (kept with --keep-data).
        println!(
            "Seconds without an ack, from the feed's start at {:.0} (Unix time): {:?}\n",
            started_at.as_secs_f64(),
            fed.silent_seconds()
        );
    }
    println!(
        "Memory after ingest: resident {:.0} MiB, peak {:.0} MiB: {:.0} bytes resident per stored URL\n",
        resident as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        resident as f64 / stored.max(1) as f64,
    );

    println!(
        "Disk traffic of the ingest: {:.0} MiB read, {:.0} MiB written: {:.0} bytes read and {:.0} written per stored URL\n",
        read as f64 / 1048576.0,
        written as f64 / 1048576.0,
        read as f64 / stored.max(1) as f64,
        written as f64 / stored.max(1) as f64,
    );

    if let Some(policy) = revisit {
        let started = Instant::now();
        let reported = runtime.block_on(report_fetched(&server.endpoint, 0..batches, streams));
        assert_eq!(reported, stored, "every stored URL reported");
        println!(
            "Every stored URL reported fetched, with validators, under --revisit {policy}: {reported} reports in {:.1} s\n",
            started.elapsed().as_secs_f64()
        );
    }
    let stop = server.terminate();
    let (held, length) = dir_bytes(&data);
    println!(
        "Data directory after a clean shutdown: {:.0} MiB on disk, {:.0} bytes per stored URL (the files' lengths: {:.0} MiB, {:.0} bytes per URL)\n",
        held as f64 / 1048576.0,
        held as f64 / stored.max(1) as f64,
        length as f64 / 1048576.0,
        length as f64 / stored.max(1) as f64,
    );
    let server = Server::start(&data, &log("after-clean-stop"), revisit);
    let clean_restart = server.started_in;
    let counted = runtime.block_on(count_urls(&server.endpoint));
    assert_eq!(
        counted, stored as u64,
        "every stored URL is there after a clean stop"
    );

    // kill -9 in the middle of a second ingest, then restart: the log and
    // the filters are recovered from the store.
    let extra = (batches / 10).max(1);
    let endpoint = server.endpoint.clone();
    let more_stored = runtime.block_on(async {
        let feeding = tokio::spawn(async move {
            ingest(&endpoint, batches..batches + extra, streams, window).await
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        server.kill();
        feeding.await.expect("feed ends").stored
    });
    let server = Server::start(&data, &log("after-kill"), revisit);
    let kill_restart = server.started_in;
    let counted = runtime.block_on(count_urls(&server.endpoint));
    assert!(
        counted >= (stored + more_stored) as u64,
        "every acknowledged URL survives kill -9: {counted} < {} + {more_stored}",
        stored
    );
    println!("| restart | seconds to listening |");
    println!("|---|---:|");
    println!("| clean shutdown took | {:.2} |", stop.as_secs_f64());
    println!(
        "| after a clean shutdown (snapshots) | {:.2} |",
        clean_restart.as_secs_f64()
    );
    println!(
        "| after kill -9 mid-ingest (log replay, filters rebuilt from {counted} stored URLs) | {:.2} |",
        kill_restart.as_secs_f64()
    );
    server.terminate();
    if args.iter().any(|a| a == "--keep-data") {
        println!(
            "data directory kept in {} (`frontier verify --data-dir` says where its bytes go)",
            dir.keep().join("data").display()
        );
    }
}
