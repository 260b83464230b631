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

use crawl_tests::{CLUSTER_WORKER_ARGS, EtcdProcess, FrontierProcess, etcd_or_skip, frontier_cli};
use futures::StreamExt;
use proto::urlfrontier::{self as uf, url_item};

const CRAWL: &str = "moves";

fn start_node(etcd: &EtcdProcess, dir: &Path, id: &str) -> FrontierProcess {
    start_node_with(etcd, dir, id, &[], &[])
}

/// A node of cluster "moves" (8 partitions, short leases), with more
/// flags and environment variables.
fn start_node_with(
    etcd: &EtcdProcess,
    dir: &Path,
    id: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> FrontierProcess {
    let mut args = vec![
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
    ];
    args.extend_from_slice(extra);
    FrontierProcess::start_with_env(&dir.join(id), &args, env)
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
/// etcd, and node n1 alone in its cluster holding URLs 0 to 599.
async fn one_node_holding_600_urls(
    etcd_binary: &Path,
) -> (EtcdProcess, tempfile::TempDir, FrontierProcess) {
    let etcd = EtcdProcess::start(etcd_binary);
    let dir = tempfile::tempdir().unwrap();
    let n1 = start_node(&etcd, dir.path(), "n1");
    wait_until_settled(&[&n1], &["n1"], &[8], &[0]).await;
    put_all(&n1, (0..600).map(|i| item(&url(i), None)).collect()).await;
    (etcd, dir, n1)
}

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
    local_count_of(node, CRAWL).await
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
    let (etcd, dir, n1) = one_node_holding_600_urls(&binary).await;
    let urls: Vec<String> = (0..600).map(url).collect();
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
    crawl_tests::block_for_a_day(&mut n1.client().await, CRAWL, blocked_hosts.values()).await;
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

/// A node started with a failpoint (`FAILPOINTS`, see the `fail` crate)
/// that holds its moves at one step: the step fails on purpose, logs so,
/// and is tried again, so the move waits there until the node is killed.
fn start_node_failing_at(
    etcd: &EtcdProcess,
    dir: &Path,
    id: &str,
    failpoint: Option<&str>,
) -> FrontierProcess {
    let setting = failpoint.map(|name| format!("{name}=return"));
    let env: Vec<(&str, &str)> = setting
        .iter()
        .map(|setting| ("FAILPOINTS", setting.as_str()))
        .collect();
    // Pages of a few URLs: a copy takes several, so it can break between
    // two.
    start_node_with(etcd, dir, id, &["--move-page-urls", "40"], &env)
}

/// Waits until a node's log says its failpoint was reached more than
/// `seen` times; answers how many times.
async fn wait_for_failpoint_after(node: &FrontierProcess, name: &str, seen: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let log = node.log_text();
        let hits = log
            .lines()
            .filter(|l| l.contains("failpoint hit") && l.contains(name))
            .count();
        if hits > seen {
            return hits;
        }
        assert!(
            Instant::now() < deadline,
            "the move never reached {name}:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_failpoint(node: &FrontierProcess, name: &str) -> usize {
    wait_for_failpoint_after(node, name, 0).await
}

/// A receiver drained mid-copy: its move is rolled back, and it drops the
/// pages it had copied of a partition it does not own (left, they would
/// count in its figures and the crawl would never look finished). A
/// receiver killed mid-copy and back after its move was rolled back is
/// left with the same partial copy, dropped the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_whose_move_is_rolled_back_drops_its_partial_copy() {
    let Some(binary) = etcd_or_skip("a_receiver_whose_move_is_rolled_back_drops_its_partial_copy")
    else {
        return;
    };
    let (etcd, dir, n1) = one_node_holding_600_urls(&binary).await;

    let n2 = start_node_failing_at(&etcd, dir.path(), "n2", Some("move-copy-page"));
    wait_for_failpoint(&n2, "move-copy-page").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while local_count(&n2).await == 0 {
        assert!(Instant::now() < deadline, "n2 never held a copied page");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, text) = frontier_cli(&n1.endpoint(), &["cluster", "drain", "n2"]);
    assert!(status.success(), "{text}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (a, b) = (local_count(&n1).await, local_count(&n2).await);
        if a == 600 && b == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "n2 kept {b} URLs of partitions n1 owns (n1 holds {a}):\n{}",
            n2.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        n1.log_text()
            .contains("move rolled back: its receiver is gone"),
        "{}",
        n1.log_text()
    );
    assert!(
        n2.log_text()
            .contains("dropped a stray copy of a partition another node owns"),
        "{}",
        n2.log_text()
    );
    assert_eq!(cluster_of(&n1).await.owners, vec!["n1"; 8]);
}

/// Checks that a node's view comes to hold a move at `phase` (and, when
/// given, with its old copy deleted or not). Called while another node
/// stands at a failpoint past that phase: the view, fed by a watch of
/// etcd, may be a moment behind what that node read, never ahead.
async fn assert_a_move(node: &FrontierProcess, phase: &str, old_copy_deleted: Option<bool>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let moves = cluster_of(node).await.moves;
        if moves.iter().any(|m| {
            m.phase == phase && old_copy_deleted.is_none_or(|deleted| m.old_copy_deleted == deleted)
        }) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no move at {phase} ({old_copy_deleted:?}): {moves:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// kill -9 at each step of a move, on the side that holds the move there:
/// the old owner mid-copy, sealed at its cutover, and after the flip before
/// it deleted its copy; the receiver mid-copy, before its flip, and before
/// it ended the move; both nodes down at once; etcd restarted at a cutover;
/// the old owner stopped at a cutover until taken for gone, then resumed.
/// Writes go on through the moves. Each time the move completes, and every
/// URL acknowledged is held by its owner alone, found, and served once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_at_any_step_completes_with_nothing_lost() {
    let Some(binary) = etcd_or_skip("a_move_killed_at_any_step_completes_with_nothing_lost") else {
        return;
    };
    let mut etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let first = 2400;
    let urls: Vec<String> = (0..first + 800).map(url).collect();

    // Join (n1 -> n2), with faults on the old owner's side.
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", Some("copy-partition-later-page"));
    wait_until_settled(&[&n1], &["n1"], &[8], &[0]).await;
    put_all(&n1, urls[..first].iter().map(|u| item(u, None)).collect()).await;
    let n2 = start_node_failing_at(&etcd, dir.path(), "n2", None);
    wait_for_failpoint(&n1, "copy-partition-later-page").await;
    assert!(
        local_count(&n2).await > 0,
        "the receiver holds a partial copy"
    );
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", Some("seal-partition-answer"));
    let seen = wait_for_failpoint(&n1, "seal-partition-answer").await;
    assert_a_move(&n2, "cutover", None).await;
    // etcd restarted at the cutover: the move goes on from what it holds.
    etcd.restart();
    wait_for_failpoint_after(&n1, "seal-partition-answer", seen).await;
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", Some("move-before-delete"));
    wait_for_failpoint(&n1, "move-before-delete").await;
    assert_a_move(&n2, "flipped", Some(false)).await;
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", None);
    // Writes through either node meanwhile, some to partitions at their
    // cutover: acknowledged once they reach the partition's owner.
    put_all(
        &n2,
        urls[first..first + 400]
            .iter()
            .map(|u| item(u, None))
            .collect(),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let (kept, moved) = loop {
        let status = cluster_of(&n1).await;
        let (a, b) = (local_count(&n1).await, local_count(&n2).await);
        if status.moves.is_empty()
            && status.owners.iter().filter(|o| *o == "n2").count() == 4
            && a + b == first as u64 + 400
        {
            break (a, b);
        }
        assert!(
            Instant::now() < deadline,
            "the join never finished: {status:?}, held {a} + {b}\n{}\n{}",
            n1.log_text(),
            n2.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(kept > 0 && moved > 0, "held {kept} + {moved}");

    // Drain (n2 -> n1), with faults on the receiver's side.
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", Some("move-copy-page"));
    let (status, text) = frontier_cli(&n2.endpoint(), &["cluster", "drain", "n2"]);
    assert!(status.success(), "{text}");
    wait_for_failpoint(&n1, "move-copy-page").await;
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", Some("move-before-flip"));
    let seen = wait_for_failpoint(&n1, "move-before-flip").await;
    // The old owner, sealed, stopped (SIGSTOP) until the cluster takes it
    // for gone, then resumed with the view it had: the move goes on.
    let alive = |status: &proto::admin::ClusterStatus, id: &str| {
        status.nodes.iter().any(|node| node.id == id && node.alive)
    };
    n2.signal(rustix::process::Signal::STOP);
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive(&cluster_of(&n1).await, "n2") {
        assert!(Instant::now() < deadline, "n2 never seen gone");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    n2.signal(rustix::process::Signal::CONT);
    while !alive(&cluster_of(&n1).await, "n2") {
        assert!(Instant::now() < deadline, "n2 never back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_failpoint_after(&n1, "move-before-flip", seen).await;
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", Some("move-before-finish"));
    wait_for_failpoint(&n1, "move-before-finish").await;
    assert_a_move(&n1, "flipped", Some(true)).await;
    // Both down, the old owner first; then both back in the other order.
    n2.kill();
    n1.kill();
    let n1 = start_node_failing_at(&etcd, dir.path(), "n1", None);
    let n2 = start_node_failing_at(&etcd, dir.path(), "n2", None);
    put_all(
        &n1,
        urls[first + 400..].iter().map(|u| item(u, None)).collect(),
    )
    .await;
    wait_until_settled(&[&n1, &n2], &["n1", "n2"], &[8, 0], &[urls.len() as u64, 0]).await;
    for probe in [&n1, &n2] {
        let mut client = probe.client().await;
        for u in urls.iter().step_by(11) {
            client
                .get_url_status(uf::UrlStatusRequest {
                    url: u.clone(),
                    crawl_id: CRAWL.into(),
                    ..uf::UrlStatusRequest::default()
                })
                .await
                .unwrap_or_else(|e| panic!("{u}: {e}"));
        }
    }
    let mut served = lease_all(&n1).await;
    served.extend(lease_all(&n2).await);
    let distinct: BTreeSet<String> = served.iter().cloned().collect();
    assert_eq!(distinct.len(), served.len(), "a URL served twice");
    assert_eq!(distinct, urls.iter().cloned().collect::<BTreeSet<_>>());
}

/// Waits until no move is in flight and the map gives each of `ids` the
/// partitions of `shares` (in any order).
async fn wait_for_shares(node: &FrontierProcess, ids: &[&str], shares: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut wanted = shares.to_vec();
    wanted.sort_unstable();
    loop {
        let status = cluster_of(node).await;
        let mut owned: Vec<usize> = ids
            .iter()
            .map(|id| status.owners.iter().filter(|o| o == id).count())
            .collect();
        owned.sort_unstable();
        if status.moves.is_empty() && owned == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "shares {owned:?} never became {wanted:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// URLs leased by an old owner at the cutovers of the moves to a node, as
/// its log reports them: the only pages a move may have fetched twice.
fn leased_at_cutovers(log: &str) -> u32 {
    log.lines()
        .filter(|line| line.contains("partition moved here"))
        .filter_map(|line| {
            let line = without_colours(line);
            let at = line.find("leased=")? + "leased=".len();
            line[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u32>()
                .ok()
        })
        .sum()
}

/// A log line without its terminal colour codes (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The crawl as users run it while the frontier grows from one node to
/// three (one of the receivers killed with SIGKILL mid-move and started
/// again) and shrinks to two (the third drained, then stopped): workers
/// given the first node find the others, the crawl completes, and every
/// page of twelve hosts is fetched exactly once, apart from URLs an old
/// owner had leased at a cutover and pages in flight at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_goes_on_while_the_cluster_grows_to_three_and_shrinks_to_two() {
    let Some(binary) =
        etcd_or_skip("a_crawl_goes_on_while_the_cluster_grows_to_three_and_shrinks_to_two")
    else {
        return;
    };
    const MAX_DEPTH: &str = "40";
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let config = mock_site::SiteConfig {
        pages: 60,
        // Think time: URLs stay leased a while, so cutovers meet leases.
        latency: Duration::from_millis(100),
        ..mock_site::SiteConfig::default()
    };
    let sites = mock_site::MockSite::start_hosts(12, config).await.unwrap();
    let node = |id: &str| {
        FrontierProcess::start(
            &dir.path().join(id),
            &[
                "--etcd",
                &etcd.endpoint,
                "--cluster",
                "resize",
                "--node-id",
                id,
                "--partitions",
                "8",
                "--lease-ttl-secs",
                "2",
                "--max-depth",
                MAX_DEPTH,
                // Politeness stretches the crawl over the resizes.
                "--default-delay-ms",
                "400",
            ],
        )
    };
    let n1 = node("n1");
    wait_for_shares(&n1, &["n1"], &[8]).await;
    let out = dir.path().join("out");
    let workers = [
        crawl_tests::WorkerProcess::start(&n1.endpoint(), &out, "w1", CLUSTER_WORKER_ARGS),
        crawl_tests::WorkerProcess::start(&n1.endpoint(), &out, "w2", CLUSTER_WORKER_ARGS),
    ];
    let mut seed = vec!["seed".to_owned()];
    seed.extend(sites.iter().map(|site| format!("{}/", site.base())));
    let seed: Vec<&str> = seed.iter().map(String::as_str).collect();
    let (status, text) = frontier_cli(&n1.endpoint(), &seed);
    assert!(status.success(), "{text}");
    if tokio::time::timeout(Duration::from_secs(60), sites[0].answered_at_least(5))
        .await
        .is_err()
    {
        let logs: Vec<String> = workers
            .iter()
            .map(|w| std::fs::read_to_string(&w.log).unwrap_or_default())
            .collect();
        panic!(
            "the crawl never started:\n{}\n{}",
            n1.log_text(),
            logs.join("\n")
        );
    }

    let n2 = node("n2");
    let n3 = node("n3");
    // kill -9 of a receiver mid-move, mid-crawl; started again, it finishes.
    let phase = a_move_in_flight(&n1).await;
    let killed_log_file = n2.log.clone();
    n2.kill();
    let killed_log = std::fs::read_to_string(killed_log_file).unwrap();
    eprintln!("killed n2 during a move at its {phase} step");
    let n2 = node("n2");
    wait_for_shares(&n1, &["n1", "n2", "n3"], &[3, 3, 2]).await;
    let (status, text) = frontier_cli(&n1.endpoint(), &["cluster", "drain", "n3"]);
    assert!(status.success(), "{text}");
    wait_for_shares(&n1, &["n1", "n2", "n3"], &[4, 4, 0]).await;
    let progress = n1.progress().await;
    assert!(
        progress.due_now + progress.scheduled_later + progress.leased > 0,
        "the crawl ended before the cluster shrank: the test no longer \
         crawls through the moves ({progress:?})"
    );
    assert_eq!(
        local_count_of(&n3, "").await,
        0,
        "a drained node holds nothing"
    );
    let leased = [n1.log_text(), killed_log, n2.log_text(), n3.log_text()]
        .iter()
        .map(|log| leased_at_cutovers(log))
        .sum::<u32>();
    // Stopped while workers still hold streams to it: it shuts down clean.
    let mut n3 = n3;
    let exit = n3.terminate_within(Duration::from_secs(60));
    let log = n3.log_text();
    assert!(
        exit.is_some_and(|exit| exit.success()) && log.contains("clean shutdown"),
        "{exit:?}: {log}"
    );

    crawl_tests::crawl_ends(&n2.endpoint(), workers, 240);
    let expected = mock_site::expected_fetches(&config, MAX_DEPTH.parse().unwrap());
    let mut surplus = 0;
    for site in &sites {
        let fetched = site.page_fetches();
        for (path, times) in &expected {
            let got = fetched.get(path).copied().unwrap_or(0);
            assert!(got >= *times, "{}{path} fetched {got} times", site.base());
            surplus += got - times;
        }
        let beyond: Vec<&String> = fetched
            .keys()
            .filter(|path| !expected.contains_key(*path))
            .collect();
        assert!(beyond.is_empty(), "{}: fetched {beyond:?}", site.base());
    }
    // Pages in flight at the kill may be fetched again too: at most
    // `--unacked-per-host` per host.
    let in_flight_at_kill = 2 * sites.len() as u32;
    assert!(
        surplus <= leased + in_flight_at_kill,
        "{surplus} pages fetched twice; {leased} were leased at cutovers"
    );
    eprintln!("pages fetched twice: {surplus}; leased at cutovers: {leased}");
}

async fn local_count_of(node: &FrontierProcess, crawl: &str) -> u64 {
    node.client()
        .await
        .count_ur_ls(uf::CountUrlParams {
            crawl_id: crawl.into(),
            local: Some(true),
            ..uf::CountUrlParams::default()
        })
        .await
        .unwrap()
        .into_inner()
        .value
}
