//! How long the partitions of a leader killed with SIGKILL take no writes:
//! from the kill to the first write acknowledged to each of them, over a
//! series of kills, in a three-node cluster keeping two copies, as real
//! `frontier serve` processes (release) with a real etcd.
//!
//! A writer keeps sending one new URL of each of the victim's partitions
//! through a surviving node, every few milliseconds, and notes when each
//! partition first acknowledges one after the kill; the victim then
//! restarts on its data directory and the next kill waits until every
//! partition has two copies again. Writes resume once a follower leads the
//! partition (the registration TTL) and, as two copies are needed
//! (`--min-in-sync 2`), once a new follower has been copied.
//!
//! `cargo bench -p crawl-tests --bench failover [-- --kills N --ttl S]`
//! (defaults 10 kills, TTL 10 s: `frontier serve`'s default). Needs `etcd`
//! on PATH (Debian's `etcd-server`); without it the run says so and
//! measures nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crawl_tests::{EtcdProcess, FrontierProcess, etcd_binary};
use proto::admin::ClusterStatus;
use proto::urlfrontier as uf;

#[path = "../../frontier/benches/common/mod.rs"]
#[allow(dead_code, reason = "this bench needs only the argument parser")]
mod common;
use common::arg;

const CRAWL: &str = "failover";
const NODES: [&str; 3] = ["n1", "n2", "n3"];

fn node_flags(etcd: &str, id: &str, ttl: u64) -> Vec<String> {
    [
        "--etcd",
        etcd,
        "--cluster",
        "failover",
        "--node-id",
        id,
        "--initial-nodes",
        "3",
        "--partitions",
        "16",
        "--replicas",
        "2",
        "--lease-ttl-secs",
        &ttl.to_string(),
        "--scope",
        "any",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn start(dir: &Path, etcd: &str, id: &str, ttl: u64) -> FrontierProcess {
    let flags = node_flags(etcd, id, ttl);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    FrontierProcess::start(&dir.join(id), &flags)
}

/// Waits until every node is back and every partition has two copies on
/// live nodes, no move in flight.
async fn wait_for_two_copies(node: &FrontierProcess) -> ClusterStatus {
    let mut admin = node.admin().await;
    crawl_tests::wait_for_cluster(&mut admin, NODES.len()).await;
    crawl_tests::wait_for_copies(&mut admin, 2, Duration::from_secs(300)).await
}

/// A URL of the crawl filed in `partition` (of `partitions`), not sent
/// before (`from` makes it new).
fn url_in(partition: u32, partitions: u32, from: &mut u64) -> String {
    loop {
        *from += 1;
        let host = format!("h{from}.example");
        if frontier::ingest::partition_of(CRAWL, &host, partitions as usize) == partition as usize {
            return format!("http://{host}/");
        }
    }
}

/// Whether one write of `url` through `client` is acknowledged OK.
async fn put_one(
    client: &mut uf::url_frontier_client::UrlFrontierClient<tonic::transport::Channel>,
    url: &str,
) -> bool {
    let batch = uf::DiscoveredBatch {
        id: "0".into(),
        done: None,
        items: vec![uf::UrlInfo {
            url: url.to_owned(),
            crawl_id: CRAWL.into(),
            ..uf::UrlInfo::default()
        }],
    };
    let Ok(acks) = client.put_discovered(futures::stream::iter([batch])).await else {
        return false;
    };
    let mut acks = acks.into_inner();
    matches!(
        acks.message().await,
        Ok(Some(ack)) if ack.statuses.first() == Some(&(uf::ack_message::Status::Ok as i32))
    )
}

async fn run(kills: usize, ttl: u64) {
    let Some(etcd_path) = etcd_binary() else {
        println!("no etcd on PATH (Debian: apt-get install etcd-server): nothing measured");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let etcd = EtcdProcess::start(&etcd_path);
    let mut nodes: BTreeMap<&str, FrontierProcess> = NODES
        .iter()
        .map(|id| (*id, start(dir.path(), &etcd.endpoint, id, ttl)))
        .collect();
    for node in nodes.values() {
        crawl_tests::wait_for_cluster(&mut node.admin().await, NODES.len()).await;
    }
    let mut serial = 0;
    let mut gaps = Vec::new();
    for kill in 0..kills {
        let victim = NODES[kill % NODES.len()];
        let witness = NODES[(kill + 1) % NODES.len()];
        let map = wait_for_two_copies(&nodes[witness]).await;
        let led: Vec<u32> = (0..map.partitions)
            .filter(|&p| map.owners[p as usize] == victim)
            .collect();
        let mut client = nodes[witness].client().await;
        // Each partition takes a write before the kill: the path is warm.
        for &partition in &led {
            let url = url_in(partition, map.partitions, &mut serial);
            assert!(put_one(&mut client, &url).await, "a write before the kill");
        }
        let killed = nodes.remove(victim).expect("the victim runs");
        let killed_at = Instant::now();
        killed.kill();
        let mut waiting: BTreeSet<u32> = led.iter().copied().collect();
        let mut worst = Duration::ZERO;
        while !waiting.is_empty() {
            assert!(
                killed_at.elapsed() < Duration::from_secs(300),
                "partitions {waiting:?} took no write in 300 s"
            );
            for partition in waiting.clone() {
                let url = url_in(partition, map.partitions, &mut serial);
                if put_one(&mut client, &url).await {
                    worst = worst.max(killed_at.elapsed());
                    waiting.remove(&partition);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "kill {}: {victim} led {} partitions; all took writes again after {:.2} s",
            kill + 1,
            led.len(),
            worst.as_secs_f64()
        );
        gaps.push(worst.as_secs_f64());
        nodes.insert(victim, start(dir.path(), &etcd.endpoint, victim, ttl));
    }
    // The last victim settles (its copies made again) before the
    // cluster shuts down.
    wait_for_two_copies(&nodes[NODES[0]]).await;
    for (id, mut node) in nodes {
        let status = node.terminate_within(Duration::from_secs(120));
        assert!(
            status.is_some_and(|status| status.success()),
            "{id} stopped with {status:?}; its log:\n{}",
            node.log_text()
        );
    }
    gaps.sort_by(f64::total_cmp);
    let middle = gaps.len() / 2;
    let median = if gaps.len() % 2 == 0 {
        f64::midpoint(gaps[middle - 1], gaps[middle])
    } else {
        gaps[middle]
    };
    let max = gaps.last().copied().unwrap_or(0.0);
    println!();
    println!("## Frontier cluster: failover after kill -9 of a leader");
    println!();
    println!(
        "3 nodes, 16 partitions, 2 copies (--min-in-sync 2), registration TTL {ttl} s; \
         {kills} kills, each of the next node in turn, restarted on its disk after."
    );
    println!();
    println!("| kills | median s | max s | max - TTL s |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {kills} | {median:.2} | {max:.2} | {:.2} |",
        max - ttl as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kills = arg(&args, "--kills", 10).max(1);
    let ttl = arg(&args, "--ttl", 10).max(2) as u64;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run(kills, ttl));
}
