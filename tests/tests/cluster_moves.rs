//! Partition moves in a real cluster (a real etcd, `frontier serve --etcd`
//! processes): a node that joins takes its share of partitions with every
//! URL and its state, a drained node gives all of them back and ends up
//! holding none, and the moved partitions are served from their new owner;
//! a receiver killed with SIGKILL mid-move (also the leader) finishes the
//! moves once restarted, nothing lost or doubled. Skipped, saying so, where
//! no etcd binary is installed.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crawl_tests::{EtcdProcess, FrontierProcess, etcd_or_skip, frontier_cli};
use futures::StreamExt;
use proto::urlfrontier::{self as uf, url_item};

const CRAWL: &str = "moves";

fn start_node(etcd: &EtcdProcess, dir: &Path, id: &str) -> FrontierProcess {
    FrontierProcess::start(
        &dir.join(id),
        &[
            "--etcd",
            &etcd.endpoint,
            "--cluster",
            "moves",
            "--node-id",
            id,
            "--initial-nodes",
            "1",
            "--partitions",
            "8",
            "--lease-ttl-secs",
            "2",
            "--default-delay-ms",
            "0",
        ],
    )
}

fn url(i: usize) -> String {
    format!("http://h{}.example/p/{i}", i % 60)
}

fn item(url: &str, known: Option<u64>) -> uf::UrlItem {
    let info = Some(uf::UrlInfo {
        url: url.to_owned(),
        crawl_id: CRAWL.into(),
        ..uf::UrlInfo::default()
    });
    uf::UrlItem {
        id: url.to_owned(),
        item: Some(match known {
            Some(refetchable_from_date) => url_item::Item::Known(uf::KnownUrlItem {
                info,
                refetchable_from_date,
            }),
            None => url_item::Item::Discovered(uf::DiscoveredUrlItem { info }),
        }),
        ..uf::UrlItem::default()
    }
}

/// Puts items through PutURLs until each is acknowledged OK (a FAIL, as
/// while a partition moves, is sent again).
async fn put_all(node: &FrontierProcess, items: Vec<uf::UrlItem>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pending = items;
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} items never acknowledged",
            pending.len()
        );
        let mut client = node.client().await;
        let mut acks = client
            .put_ur_ls(tokio_stream::iter(pending.clone()))
            .await
            .unwrap()
            .into_inner();
        let mut ok = BTreeSet::new();
        while let Some(Ok(ack)) = acks.next().await {
            if ack.status() == uf::ack_message::Status::Ok {
                ok.insert(ack.id);
            }
        }
        pending.retain(|item| !ok.contains(&item.id));
    }
}

async fn local_count(node: &FrontierProcess) -> u64 {
    node.client()
        .await
        .count_ur_ls(uf::CountUrlParams {
            crawl_id: CRAWL.into(),
            local: Some(true),
            ..uf::CountUrlParams::default()
        })
        .await
        .unwrap()
        .into_inner()
        .value
}

async fn cluster_of(node: &FrontierProcess) -> proto::admin::ClusterStatus {
    node.admin()
        .await
        .get_cluster(proto::admin::GetClusterRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Polls until no move is in flight, each node owns `owned[i]` partitions
/// and holds `held[i]` URLs of the crawl.
async fn wait_until_settled(
    nodes: &[&FrontierProcess],
    ids: &[&str],
    owned: &[usize],
    held: &[u64],
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = cluster_of(nodes[0]).await;
        let mut counts = Vec::new();
        for node in nodes {
            counts.push(local_count(node).await);
        }
        let owns: Vec<usize> = ids
            .iter()
            .map(|id| status.owners.iter().filter(|o| o == id).count())
            .collect();
        if status.moves.is_empty() && owns == owned && counts == held {
            return;
        }
        if Instant::now() >= deadline {
            for node in nodes {
                eprintln!("---- node log ----\n{}", node.log_text());
            }
        }
        assert!(
            Instant::now() < deadline,
            "not settled: owners {owns:?} (want {owned:?}), URLs held {counts:?} (want {held:?}), moves {:?}",
            status.moves
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Leases every due URL of the crawl from `node` (the cluster's whole
/// answer comes from its own partitions).
async fn lease_all(node: &FrontierProcess) -> Vec<String> {
    let mut served = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut stream = node
            .client()
            .await
            .get_ur_ls(uf::GetParams {
                max_urls_per_queue: 0,
                max_queues: 0,
                delay_requestable: 10,
                item: Some(uf::get_params::Item::CrawlId(CRAWL.into())),
                ..uf::GetParams::default()
            })
            .await
            .unwrap()
            .into_inner();
        let before = served.len();
        while let Some(Ok(info)) = stream.next().await {
            served.push(info.url);
        }
        if served.len() == before
            && Instant::now() > deadline.checked_sub(Duration::from_secs(28)).unwrap()
        {
            return served;
        }
        assert!(Instant::now() < deadline);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_takes_its_share_and_a_drained_node_gives_all_back() {
    let Some(binary) =
        etcd_or_skip("a_joining_node_takes_its_share_and_a_drained_node_gives_all_back")
    else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let n1 = start_node(&etcd, dir.path(), "n1");
    wait_until_settled(&[&n1], &["n1"], &[8], &[0]).await;
    let urls: Vec<String> = (0..600).map(url).collect();
    put_all(&n1, urls.iter().map(|u| item(u, None)).collect()).await;
    // A third of them completed: their state must travel too.
    let completed: BTreeSet<String> = urls.iter().step_by(3).cloned().collect();
    put_all(&n1, completed.iter().map(|u| item(u, Some(0))).collect()).await;
    // One blocked queue in each partition: queue settings travel too.
    let mut blocked_hosts = std::collections::BTreeMap::new();
    for i in 0..60 {
        let host = format!("h{i}.example");
        let partition = frontier::ingest::partition_of(CRAWL, &host, 8);
        blocked_hosts.entry(partition).or_insert(host);
    }
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 86_400;
    let mut client = n1.client().await;
    for host in blocked_hosts.values() {
        client
            .block_queue_until(uf::BlockQueueParams {
                key: host.clone(),
                crawl_id: CRAWL.into(),
                time: until,
                ..uf::BlockQueueParams::default()
            })
            .await
            .unwrap();
    }
    let blocked: BTreeSet<&str> = blocked_hosts.values().map(String::as_str).collect();

    let n2 = start_node(&etcd, dir.path(), "n2");
    let deadline = Instant::now() + Duration::from_secs(120);
    let (moved_count, kept_count) = loop {
        let status = cluster_of(&n1).await;
        let (a, b) = (local_count(&n1).await, local_count(&n2).await);
        if status.moves.is_empty()
            && status.owners.iter().filter(|o| *o == "n2").count() == 4
            && a + b == 600
        {
            break (b, a);
        }
        assert!(
            Instant::now() < deadline,
            "n2 never took its share: {status:?}, held {a} + {b}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(moved_count > 0, "n2 holds URLs of its partitions");
    // Every URL is found through either node, with its state.
    for probe in [&n1, &n2] {
        let mut client = probe.client().await;
        for u in urls.iter().step_by(7) {
            let status = client
                .get_url_status(uf::UrlStatusRequest {
                    url: u.clone(),
                    crawl_id: CRAWL.into(),
                    ..uf::UrlStatusRequest::default()
                })
                .await
                .unwrap_or_else(|e| panic!("{u}: {e}"))
                .into_inner();
            let done = matches!(
                status.item,
                Some(url_item::Item::Known(uf::KnownUrlItem {
                    refetchable_from_date: 0,
                    ..
                }))
            );
            assert_eq!(done, completed.contains(u), "{u}: {status:?}");
        }
    }
    // Each node serves its own partitions, each URL once, none of a
    // blocked queue (blocked before its partition moved).
    let mut served = lease_all(&n1).await;
    served.extend(lease_all(&n2).await);
    let distinct: BTreeSet<String> = served.iter().cloned().collect();
    assert_eq!(distinct.len(), served.len(), "a URL served twice");
    let host_of = |u: &str| url::Url::parse(u).unwrap().host_str().unwrap().to_owned();
    let due: BTreeSet<String> = urls
        .iter()
        .filter(|u| !completed.contains(*u) && !blocked.contains(host_of(u).as_str()))
        .cloned()
        .collect();
    assert_eq!(distinct, due, "kept {kept_count}");

    // Drain n2: everything comes back to n1 and n2 holds nothing.
    let (status, text) = frontier_cli(&n1.endpoint(), &["cluster", "drain", "n2"]);
    assert!(status.success(), "{text}");
    wait_until_settled(&[&n1, &n2], &["n1", "n2"], &[8, 0], &[600, 0]).await;
    let (status, text) = frontier_cli(&n1.endpoint(), &["cluster", "drain", "n1"]);
    assert!(!status.success(), "the last node cannot be drained: {text}");
    assert!(text.contains("only node left"), "{text}");
    // Stopped and started again, the drained node takes its share again.
    assert!(n2.terminate().success());
    let n2 = start_node(&etcd, dir.path(), "n2");
    wait_until_settled(
        &[&n1, &n2],
        &["n1", "n2"],
        &[4, 4],
        &[kept_count, moved_count],
    )
    .await;
    let (status, text) = frontier_cli(&n1.endpoint(), &["cluster", "drain", "n9"]);
    assert!(
        !status.success() && text.contains("no node") && text.contains("n9"),
        "{text}"
    );
}

/// Polls until the cluster shows a move in flight, and answers its phase.
async fn a_move_in_flight(node: &FrontierProcess) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(moving) = cluster_of(node).await.moves.first() {
            return moving.phase.clone();
        }
        assert!(Instant::now() < deadline, "no move started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// kill -9 of the receiver while partitions move to it, and of the
/// receiver of a drain: each time the restarted node finishes or redoes
/// the moves, and every URL is held once, found, and served once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_survive_kill_9_of_either_node() {
    let Some(binary) = etcd_or_skip("moves_survive_kill_9_of_either_node") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let n1 = start_node(&etcd, dir.path(), "n1");
    wait_until_settled(&[&n1], &["n1"], &[8], &[0]).await;
    let total = 3000;
    let urls: Vec<String> = (0..total).map(url).collect();
    put_all(&n1, urls.iter().map(|u| item(u, None)).collect()).await;

    // The receiver killed while moves to it are under way, then started
    // again on its data directory.
    let n2 = start_node(&etcd, dir.path(), "n2");
    let phase = a_move_in_flight(&n1).await;
    n2.kill();
    eprintln!("killed the receiver during a move at its {phase} step");
    let n2 = start_node(&etcd, dir.path(), "n2");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = cluster_of(&n1).await;
        let (a, b) = (local_count(&n1).await, local_count(&n2).await);
        if status.moves.is_empty()
            && status.owners.iter().filter(|o| *o == "n2").count() == 4
            && a + b == total as u64
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled after the kill: {status:?}, held {a} + {b}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The drain's receiver (n1) killed while n2's partitions move to it.
    let (status, text) = frontier_cli(&n2.endpoint(), &["cluster", "drain", "n2"]);
    assert!(status.success(), "{text}");
    let phase = a_move_in_flight(&n2).await;
    n1.kill();
    eprintln!("killed the drain's receiver during a move at its {phase} step");
    let n1 = start_node(&etcd, dir.path(), "n1");
    wait_until_settled(&[&n1, &n2], &["n1", "n2"], &[8, 0], &[total as u64, 0]).await;
    let mut served = lease_all(&n1).await;
    served.extend(lease_all(&n2).await);
    let distinct: BTreeSet<String> = served.iter().cloned().collect();
    assert_eq!(distinct.len(), served.len(), "a URL served twice");
    assert_eq!(distinct, urls.iter().cloned().collect::<BTreeSet<_>>());
}
