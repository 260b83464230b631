//! The frontier through its gRPC API over loopback, as workers use it:
//!
//! 1. Ingest: `--streams` concurrent PutDiscovered streams, batches of 256
//!    over 10,000 hosts with 45% known URLs, every ack after its commit.
//!    Printed per tenth of the run, so a collapse as the store grows shows.
//! 2. Round trip: GetURLs (1 URL from each of up to 1,000 queues) then
//!    PutURLs reporting each done, over the 10,000 queues ingest made.
//!    With `--warm-up N`, N URLs are round-tripped untimed first: redb's
//!    page caches take in every page a commit writes, and until they hold
//!    all of the files' pages (or reach their budget) the process takes
//!    fresh memory, which the kernel faults in and zeroes; a frontier that
//!    has run a while is past that.
//! 3. With `--outlinks N`: the round trip as a worker makes it, each page
//!    reporting N new outlinks, in two ways taken in turn (which goes
//!    first alternates), rounds of `--round-trips` URLs each: the outlinks' batches acknowledged, then
//!    the reports by PutURLs (two commits, two waits); and each page's
//!    report in its outlinks' batch (one commit, one wait).
//!
//! `cargo bench -p frontier --bench grpc [-- --urls N --streams S --round-trips R
//! --warm-up W --clients C --outlinks N --rounds K]` (defaults 1,000,000
//! URLs, 4 streams, 100,000 round-trip URLs, no warm-up, 1 client, no
//! outlinks, 3 rounds). Ingest stores 55% of its URLs, and past about
//! 40% of them in all (warm-up and round trips) the leases begin to find
//! queues emptied.

use std::sync::Arc;
use std::time::Instant;

use frontier::service::{Frontier, FrontierConfig};
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;
use proto::urlfrontier::{
    DiscoveredBatch, GetParams, KnownUrlItem, UrlInfo, UrlItem, ack_message::Status as Ack,
    url_item,
};

// The allocator of the `frontier` binary, so that the bench measures
// what it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;
#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/feed.rs"]
mod feed;
use common::arg;
use cpu::{Whose, cpu_seconds};

fn main() {
    frontier::allocator::configure();
    let args: Vec<String> = std::env::args().collect();
    let total = arg(&args, "--urls", 1_000_000);
    let streams = arg(&args, "--streams", 4).max(1);
    let round_trips = arg(&args, "--round-trips", 100_000);
    let warm_up = arg(&args, "--warm-up", 0);
    let clients = arg(&args, "--clients", 1).max(1);
    let outlinks = arg(&args, "--outlinks", 0);
    let rounds = arg(&args, "--rounds", 3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(
        total,
        streams,
        warm_up,
        round_trips,
        clients,
        outlinks,
        rounds,
    ));
}

async fn run(
    total: usize,
    streams: usize,
    warm_up: usize,
    round_trips: usize,
    clients: usize,
    outlinks: usize,
    rounds: usize,
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = FrontierConfig::new(dir.path().join("data"));
    config.filters.expected_urls_per_partition = (total as u64 / 64).max(1) * 2;
    config.default_delay = std::time::Duration::ZERO;
    let (frontier, returned) =
        frontier::handback::Handback::share(Frontier::open(config).expect("frontier opens"));
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
    let fed = feed::put_discovered(&client, 0..batches, streams).await;
    let seconds = started.elapsed().as_secs_f64();
    let (stored, skipped) = (fed.stored, fed.skipped);
    assert_eq!(stored + skipped, batches * 256, "every URL is acked");
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
    println!("{}", feed::rates_per_tenth(&fed.tenths));
    println!();

    // 2. Round trips, after the untimed ones.
    let warmed = if warm_up > 0 {
        timed_round_trips(&client, clients, warm_up, Report::Alone)
            .await
            .0
    } else {
        0
    };
    let cpu_before = cpu_seconds(Whose::Own);
    let (completed, seconds) =
        timed_round_trips(&client, clients, round_trips, Report::Alone).await;
    let cpu = cpu_seconds(Whose::Own) - cpu_before;
    println!(
        "## Round trip: {clients} clients, each GetURLs (1 URL from each of up to 1,000 queues) + PutURLs done"
    );
    println!();
    if warm_up > 0 {
        println!("After {warmed} URLs round-tripped untimed.");
        println!();
    }
    println!("| URLs completed | seconds | URLs/s | CPU µs a URL (server and clients) |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {completed} | {seconds:.1} | {:.0} | {:.1} |",
        completed as f64 / seconds,
        cpu * 1e6 / completed.max(1) as f64
    );

    // 3. Round trips with outlinks, the two ways in turn.
    if outlinks > 0 {
        println!();
        println!(
            "## Round trip with {outlinks} outlinks a page: {clients} clients, rounds of {round_trips} URLs"
        );
        println!();
        println!(
            "| round | outlinks acked, then reports: URLs/s | report in the outlinks' batch: URLs/s | ratio |"
        );
        println!("|---:|---:|---:|---:|");
        for round in 1..=rounds {
            // The store grows with each round's outlinks: the way that goes
            // first alternates.
            let mut ways = [Report::After(outlinks), Report::Joined(outlinks)];
            if round % 2 == 0 {
                ways.reverse();
            }
            let (mut after, mut joined) = (0.0, 0.0);
            for way in ways {
                let (done, secs) = timed_round_trips(&client, clients, round_trips, way).await;
                match way {
                    Report::Joined(_) => joined = done as f64 / secs,
                    _ => after = done as f64 / secs,
                }
            }
            println!(
                "| {round} | {after:.0} | {joined:.0} | {:.2} |",
                joined / after
            );
        }
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    drop(frontier);
    let frontier = returned
        .within(std::time::Duration::from_secs(5))
        .await
        .expect("the server let go");
    let started = Instant::now();
    frontier.shutdown().expect("clean shutdown");
    println!();
    println!(
        "Clean shutdown (snapshots): {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

/// How a leased page is reported.
#[derive(Debug, Clone, Copy)]
enum Report {
    /// Done by PutURLs, with no outlinks.
    Alone,
    /// With this many new outlinks, their batches acknowledged first.
    After(usize),
    /// With this many new outlinks, the report in their batch.
    Joined(usize),
}

/// `clients` loops of [`round_trips_until`] sharing `wanted` URLs; answers
/// how many were completed, and in how many seconds.
async fn timed_round_trips(
    client: &UrlFrontierClient<tonic::transport::Channel>,
    clients: usize,
    wanted: usize,
    report: Report,
) -> (usize, f64) {
    let started = Instant::now();
    let loops: Vec<_> = (0..clients)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(round_trips_until(client, wanted / clients, report))
        })
        .collect();
    let mut completed = 0;
    for one in loops {
        completed += one.await.expect("a round-trip loop");
    }
    (completed, started.elapsed().as_secs_f64())
}

/// One client's loop, as a worker's: lease, report every URL done, again,
/// until `wanted` are done or nothing is left to lease.
async fn round_trips_until(
    mut client: UrlFrontierClient<tonic::transport::Channel>,
    wanted: usize,
    report: Report,
) -> usize {
    let mut completed = 0;
    while completed < wanted {
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
        match report {
            Report::Alone => {}
            Report::After(outlinks) => {
                let batches: Vec<DiscoveredBatch> = (leased.iter())
                    .map(|info| outlinks_of(info, outlinks, None))
                    .collect();
                send_batches(&mut client, batches).await;
            }
            Report::Joined(outlinks) => {
                let batches: Vec<DiscoveredBatch> = (leased.into_iter())
                    .map(|info| outlinks_of(&info.clone(), outlinks, Some(info)))
                    .collect();
                completed += send_batches(&mut client, batches).await;
                continue;
            }
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
    completed
}

/// A leased page's batch of `count` new outlinks, carrying its report
/// when `done` is given.
fn outlinks_of(page: &UrlInfo, count: usize, done: Option<UrlInfo>) -> DiscoveredBatch {
    DiscoveredBatch {
        id: page.url.clone(),
        items: (0..count)
            .map(|n| UrlInfo {
                url: format!("{}/{n}", page.url.trim_end_matches(".html")),
                crawl_id: page.crawl_id.clone(),
                ..UrlInfo::default()
            })
            .collect(),
        done: done.map(|info| KnownUrlItem {
            info: Some(info),
            refetchable_from_date: 0,
        }),
    }
}

/// Sends batches on one PutDiscovered stream and waits for every ack;
/// answers how many reports they carried were stored.
async fn send_batches(
    client: &mut UrlFrontierClient<tonic::transport::Channel>,
    batches: Vec<DiscoveredBatch>,
) -> usize {
    let mut acks = client
        .put_discovered(futures::stream::iter(batches))
        .await
        .unwrap()
        .into_inner();
    let mut reports = 0;
    while let Some(ack) = acks.message().await.unwrap() {
        reports += usize::from(ack.done == Some(Ack::Ok as i32));
    }
    reports
}
