//! The ingest workload through one frontier node alone and through a node
//! of a three-node cluster keeping one, two and three copies of each
//! partition, in the same run, as real `frontier serve` processes with a
//! real etcd: what forwarding and each copy cost per URL, and the acks'
//! latency.
//!
//! PutDiscovered, batches of 256, 10,000 hosts, 45% known, every ack after
//! its owner's commit; the client talks to one node, which keeps its own
//! share (about a third) and forwards the rest to the two others.
//!
//! Then a fourth node joins the one-copy cluster, which holds what was fed,
//! and the run times the rebalancing: from its start until every node owns
//! its share of the partitions and no move is in flight.
//!
//! `cargo bench -p crawl-tests --bench cluster [-- --urls N --streams S
//! --partitions P]` (defaults 1,000,000 URLs, 4 streams, 64 partitions).
//! Needs `etcd` on PATH (Debian's `etcd-server`); without it the run says
//! so and measures nothing.

use std::path::Path;
use std::time::Instant;

use crawl_tests::{EtcdProcess, FrontierProcess, etcd_binary};
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;

#[path = "../../frontier/benches/common/mod.rs"]
mod common;
#[path = "../../frontier/benches/common/feed.rs"]
mod feed;
use common::arg;

#[path = "common/proc.rs"]
mod proc;

/// Resident memory of a process, MiB.
fn rss_mib(pid: u32) -> f64 {
    proc::resident_bytes(pid) as f64 / f64::from(1 << 20)
}

/// What the nodes cost before any URL: mean resident MiB per node and
/// CPU percent per node over `secs` seconds idle.
async fn idle_cost(nodes: &[&FrontierProcess], secs: u64) -> (f64, f64) {
    let before: f64 = nodes.iter().map(|n| cpu_seconds(n.pid())).sum();
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    let after: f64 = nodes.iter().map(|n| cpu_seconds(n.pid())).sum();
    let count = nodes.len() as f64;
    let rss = nodes.iter().map(|n| rss_mib(n.pid())).sum::<f64>() / count;
    (rss, (after - before) * 100.0 / secs as f64 / count)
}

/// CPU seconds a process has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces, in parentheses.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}

struct Run {
    urls: usize,
    stored: usize,
    failed: usize,
    seconds: f64,
    cpu_seconds: f64,
    tenths: Vec<(usize, f64)>,
    ack_ms: (f64, f64),
    /// Before the feed: resident MiB and CPU percent per node.
    idle: (f64, f64),
}

async fn feed_through(
    entry: &FrontierProcess,
    nodes: &[&FrontierProcess],
    total: usize,
    streams: usize,
) -> Run {
    let idle = idle_cost(nodes, 5).await;
    let client = UrlFrontierClient::connect(entry.endpoint())
        .await
        .expect("connects");
    let cpu_before: f64 = nodes.iter().map(|n| cpu_seconds(n.pid())).sum();
    let batches = total / 256;
    let started = Instant::now();
    let fed = feed::put_discovered(&client, 0..batches, streams).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after: f64 = nodes.iter().map(|n| cpu_seconds(n.pid())).sum();
    assert_eq!(
        fed.stored + fed.skipped + fed.failed,
        batches * 256,
        "every URL is acked"
    );
    Run {
        urls: batches * 256,
        stored: fed.stored,
        failed: fed.failed,
        seconds,
        cpu_seconds: cpu_after - cpu_before,
        ack_ms: (fed.latency_ms(0.5), fed.latency_ms(0.99)),
        idle,
        tenths: fed.tenths,
    }
}

fn node_flags(total: usize, partitions: usize) -> Vec<String> {
    [
        "--partitions",
        &partitions.to_string(),
        "--default-delay-ms",
        "0",
        "--expected-urls",
        &(total * 2).to_string(),
        "--scope",
        "any",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn start_node(dir: &Path, flags: &[String]) -> FrontierProcess {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    FrontierProcess::start(dir, &flags)
}

async fn run(total: usize, streams: usize, partitions: usize) {
    let Some(etcd_path) = etcd_binary() else {
        println!("no etcd on PATH (Debian: apt-get install etcd-server): nothing measured");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");

    let alone = start_node(&dir.path().join("alone"), &node_flags(total, partitions));
    let single = feed_through(&alone, &[&alone], total, streams).await;
    assert!(alone.terminate().success());

    let etcd = EtcdProcess::start(&etcd_path);
    let mut clusters = Vec::new();
    // Time to rebalance when n4 joins, partitions it took, URLs held.
    let mut joined = None;
    for replicas in [1, 2, 3] {
        let name = format!("bench-r{replicas}");
        std::fs::create_dir_all(dir.path().join(&name)).expect("a directory per cluster");
        let member = |id: &str| {
            let mut flags = node_flags(total, partitions);
            flags.extend(
                [
                    "--etcd",
                    &etcd.endpoint,
                    "--cluster",
                    &name,
                    "--node-id",
                    id,
                    "--initial-nodes",
                    "3",
                    "--replicas",
                    &replicas.to_string(),
                ]
                .iter()
                .map(|s| (*s).to_owned()),
            );
            start_node(&dir.path().join(&name).join(id), &flags)
        };
        let mut nodes: Vec<FrontierProcess> = ["n1", "n2", "n3"].map(member).into();
        crawl_tests::wait_for_copies(
            &mut nodes[0].admin().await,
            replicas,
            std::time::Duration::from_secs(60),
        )
        .await;
        let all: Vec<&FrontierProcess> = nodes.iter().collect();
        let run = feed_through(&nodes[0], &all, total, streams).await;
        let forwarded = forwarded_share(&nodes[0]).await;
        if replicas == 1 {
            let started = Instant::now();
            nodes.push(member("n4"));
            let moved = wait_for_even_owners(&nodes[0], 4, "n4").await;
            joined = Some((started.elapsed().as_secs_f64(), moved, run.stored));
        }
        for node in nodes {
            assert!(node.terminate().success());
        }
        clusters.push((replicas, run, forwarded));
    }

    let rate = |r: &Run| r.urls as f64 / r.seconds;
    let cpu_us = |r: &Run| r.cpu_seconds * 1e6 / r.urls as f64;
    println!("## Frontier cluster: ingest through one node alone and through a node of three");
    println!();
    println!(
        "PutDiscovered, {streams} streams, batches of 256, 10,000 hosts, 45% known; \
         {partitions} partitions; real processes and etcd on loopback, one 2-core machine \
         for all of them. Idle: over 5 s before the feed, every partition's copies made."
    );
    println!();
    println!(
        "| setup | idle MiB per node | idle CPU % per node | URLs offered | stored | acked FAIL | seconds | URLs/s | CPU µs per URL (all nodes) | ack p50 ms | ack p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = vec![("one node".to_owned(), &single)];
    for (replicas, run, _) in &clusters {
        rows.push((
            format!(
                "3 nodes, {replicas} cop{}, via n1",
                if *replicas == 1 { "y" } else { "ies" }
            ),
            run,
        ));
    }
    for (name, r) in &rows {
        println!(
            "| {name} | {:.0} | {:.1} | {} | {} | {} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} |",
            r.idle.0,
            r.idle.1,
            r.urls,
            r.stored,
            r.failed,
            r.seconds,
            rate(r),
            cpu_us(r),
            r.ack_ms.0,
            r.ack_ms.1
        );
    }
    println!();
    let (_, one_copy, forwarded) = &clusters[0];
    println!(
        "Forwarded to the two peers: {:.0}% of the URLs; per peer stream {:.0} URLs/s.",
        forwarded * 100.0,
        forwarded * one_copy.urls as f64 / 2.0 / one_copy.seconds
    );
    println!(
        "Cost of the cluster per URL: {:+.1} CPU µs over one node ({:.2}x the URLs/s of one node).",
        cpu_us(one_copy) - cpu_us(&single),
        rate(one_copy) / rate(&single)
    );
    for (replicas, run, _) in &clusters[1..] {
        println!(
            "{replicas} copies: {:.2}x the CPU per URL of one copy, {:.2}x its URLs/s.",
            cpu_us(run) / cpu_us(one_copy),
            rate(run) / rate(one_copy)
        );
    }
    if let Some((seconds, moved, held)) = joined {
        println!(
            "A fourth node joins the 1-copy cluster holding {held} URLs: it takes {moved} of \
             the {partitions} partitions in {seconds:.1} s (start to every node owning its \
             share, no move in flight), {:.0} ms a partition.",
            seconds * 1000.0 / moved.max(1) as f64
        );
    }
    println!();
    println!(
        "Rate per tenth, one node: {}",
        feed::rates_per_tenth(&single.tenths)
    );
}

/// Polls `entry`'s view until `members` nodes each own their share of
/// the partitions (within one) and no move is in flight; answers how many
/// partitions `joiner` owns then.
async fn wait_for_even_owners(entry: &FrontierProcess, members: usize, joiner: &str) -> usize {
    let mut admin = entry.admin().await;
    let deadline = Instant::now() + std::time::Duration::from_secs(3600);
    loop {
        let status = admin
            .get_cluster(proto::admin::GetClusterRequest {})
            .await
            .expect("the entry node answers")
            .into_inner();
        let mut owned = std::collections::BTreeMap::<&str, usize>::new();
        for owner in &status.owners {
            *owned.entry(owner.as_str()).or_default() += 1;
        }
        let share = status.partitions as usize / members;
        if status.moves.is_empty()
            && owned.len() == members
            && owned.values().all(|&n| n == share || n == share + 1)
        {
            return owned.get(joiner).copied().unwrap_or(0);
        }
        assert!(
            Instant::now() < deadline,
            "no balance within an hour: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The share of the stored URLs that the entry node does not own.
async fn forwarded_share(entry: &FrontierProcess) -> f64 {
    let progress = entry.progress().await;
    let all = progress.discovered.max(1) as f64;
    let own = progress
        .nodes
        .iter()
        .find(|n| n.node == "n1")
        .map_or(0, |n| n.discovered) as f64;
    (all - own) / all
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total = arg(&args, "--urls", 1_000_000);
    let streams = arg(&args, "--streams", 4).max(1);
    let partitions = arg(&args, "--partitions", 64).max(1);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run(total, streams, partitions));
}
