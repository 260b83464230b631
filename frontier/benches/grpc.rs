//! The frontier through its gRPC API over loopback, as workers use it:
//!
//! 1. Ingest: `--streams` concurrent PutDiscovered streams, batches of 256
//!    over 10,000 hosts with 45% known URLs, every ack after its commit.
//!    Printed per tenth of the run, so a collapse as the store grows shows.
//! 2. Round trip: GetURLs (1 URL from each of up to 1,000 queues) then
//!    PutURLs reporting each done, over the 10,000 queues ingest made.
//!
//! `cargo bench -p frontier --bench grpc [-- --urls N --streams S --round-trips R]`
//! (defaults 1,000,000 URLs, 4 streams, 100,000 round-trip URLs).

use std::sync::Arc;
use std::time::Instant;

use frontier::service::{Frontier, FrontierConfig};
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;
use proto::urlfrontier::{
    self as uf, DiscoveredBatch, GetParams, KnownUrlItem, UrlInfo, UrlItem, url_item,
};

mod common;
use common::arg;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total = arg(&args, "--urls", 1_000_000);
    let streams = arg(&args, "--streams", 4).max(1);
    let round_trips = arg(&args, "--round-trips", 100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(total, streams, round_trips));
}

async fn run(total: usize, streams: usize, round_trips: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = FrontierConfig::new(dir.path().join("data"));
    config.filters.expected_urls_per_partition = (total as u64 / 64).max(1) * 2;
    config.default_delay_ms = 0;
    let frontier = Arc::new(Frontier::open(config).expect("frontier opens"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(frontier::server::run(
        listener,
        Arc::clone(&frontier),
        frontier::grpc::ServerOptions::open(),
        async {
            let _ = stopped.await;
        },
    ));
    let client = UrlFrontierClient::connect(endpoint)
        .await
        .expect("connects");

    // 1. Ingest.
    let batches = total / 256;
    let started = Instant::now();
    let progress = Arc::new(std::sync::Mutex::new(Vec::<(usize, f64)>::new()));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..streams)
        .map(|stream| {
            let mut client = client.clone();
            let (progress, done) = (Arc::clone(&progress), Arc::clone(&done));
            tokio::spawn(async move {
                let requests =
                    futures::stream::iter((stream..batches).step_by(streams).map(|batch| {
                        DiscoveredBatch {
                            id: batch.to_string(),
                            items: (0..256)
                                .map(|i| UrlInfo {
                                    url: common::url(batch, batch * 256 + i),
                                    ..UrlInfo::default()
                                })
                                .collect(),
                        }
                    }));
                let mut acks = client.put_discovered(requests).await.unwrap().into_inner();
                let (mut ok, mut skipped) = (0_usize, 0_usize);
                while let Some(ack) = acks.message().await.unwrap() {
                    for status in ack.statuses {
                        if status == uf::ack_message::Status::Ok as i32 {
                            ok += 1;
                        } else {
                            skipped += 1;
                        }
                    }
                    let so_far = done.fetch_add(256, std::sync::atomic::Ordering::Relaxed) + 256;
                    if so_far % (total / 10).max(256) < 256 {
                        progress
                            .lock()
                            .unwrap()
                            .push((so_far, started.elapsed().as_secs_f64()));
                    }
                }
                (ok, skipped)
            })
        })
        .collect();
    let (mut stored, mut skipped) = (0, 0);
    for task in tasks {
        let (ok, skip) = task.await.unwrap();
        stored += ok;
        skipped += skip;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "## gRPC ingest: PutDiscovered, {streams} streams, batches of 256, 10,000 hosts, 45% known"
    );
    println!();
    println!("| URLs offered | stored | skipped | seconds | URLs/s |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {stored} | {skipped} | {seconds:.1} | {:.0} |",
        stored + skipped,
        (stored + skipped) as f64 / seconds
    );
    println!();
    println!("Rate per tenth of the run (URLs/s over that tenth):");
    println!();
    let mut marks = progress.lock().unwrap().clone();
    marks.sort_by_key(|m| m.0);
    let mut previous = (0, 0.0);
    let rates: Vec<String> = marks
        .iter()
        .map(|&(count, at)| {
            let rate = (count - previous.0) as f64 / (at - previous.1).max(1e-9);
            previous = (count, at);
            format!("{rate:.0}")
        })
        .collect();
    println!("{}", rates.join(" · "));
    println!();

    // 2. Round trips.
    let mut client = client.clone();
    let started = Instant::now();
    let mut completed = 0;
    while completed < round_trips {
        let leased: Vec<UrlInfo> = {
            let mut stream = client
                .get_ur_ls(GetParams {
                    max_urls_per_queue: 1,
                    max_queues: 1000,
                    delay_requestable: 300,
                    ..GetParams::default()
                })
                .await
                .unwrap()
                .into_inner();
            let mut leased = Vec::new();
            while let Some(info) = stream.message().await.unwrap() {
                leased.push(info);
            }
            leased
        };
        if leased.is_empty() {
            break;
        }
        let reports: Vec<UrlItem> = leased
            .into_iter()
            .map(|info| UrlItem {
                item: Some(url_item::Item::Known(KnownUrlItem {
                    info: Some(info),
                    refetchable_from_date: 0,
                })),
                ..UrlItem::default()
            })
            .collect();
        let mut acks = client
            .put_ur_ls(futures::stream::iter(reports))
            .await
            .unwrap()
            .into_inner();
        while acks.message().await.unwrap().is_some() {
            completed += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("## Round trip: GetURLs (1 URL from each of up to 1,000 queues) + PutURLs done");
    println!();
    println!("| URLs completed | seconds | URLs/s |");
    println!("|---:|---:|---:|");
    println!(
        "| {completed} | {seconds:.1} | {:.0} |",
        completed as f64 / seconds
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let frontier = Arc::try_unwrap(frontier).expect("the server let go");
    let started = Instant::now();
    frontier.shutdown().expect("clean shutdown");
    println!();
    println!(
        "Clean shutdown (snapshots): {:.2} s",
        started.elapsed().as_secs_f64()
    );
}
