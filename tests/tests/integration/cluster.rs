//! A frontier cluster as users run it: a real etcd on loopback, three
//! `frontier serve --etcd` nodes, `worker` processes pointed at different
//! nodes, mock sites on several loopback addresses (so that their hosts
//! fall in partitions of different nodes). Skipped, saying so, where no
//! etcd binary is installed; `.ci/run` installs one.

use std::path::Path;

use crawl_tests::{
    EtcdCluster, EtcdProcess, FrontierProcess, WorkerProcess, etcd_or_skip, frontier_cli,
};
use mock_site::{MockSite, NEVER_FETCHED, SiteConfig, expected_fetches};
use proto::urlfrontier as uf;

const MAX_DEPTH: u32 = 40;

const WORKER_ARGS: &[&str] = crawl_tests::CLUSTER_WORKER_ARGS;

fn node_args<'a>(etcd: &'a str, id: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let base = [
        ("--etcd", etcd),
        ("--cluster", "test"),
        ("--node-id", id),
        ("--initial-nodes", "3"),
        ("--partitions", "8"),
        ("--lease-ttl-secs", "2"),
        ("--default-delay-ms", "0"),
        ("--max-depth", "40"),
    ];
    // A flag in `extra` replaces the default one.
    let mut args: Vec<&str> = base
        .iter()
        .filter(|(flag, _)| !extra.contains(flag))
        .flat_map(|(flag, value)| [*flag, *value])
        .collect();
    args.extend_from_slice(extra);
    args
}

/// Starts three nodes and waits until each has the first partition map
/// and sees the other two.
async fn three_nodes(etcd: &EtcdProcess, dir: &Path) -> Vec<FrontierProcess> {
    three_nodes_with(&etcd.endpoint, dir, &[]).await
}

/// [`three_nodes`] over the etcd members of `endpoints`, with `extra`
/// flags.
async fn three_nodes_with(endpoints: &str, dir: &Path, extra: &[&str]) -> Vec<FrontierProcess> {
    let nodes: Vec<FrontierProcess> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| FrontierProcess::start(&dir.join(id), &node_args(endpoints, id, extra)))
        .collect();
    for node in &nodes {
        wait_for_cluster(node, 3).await;
    }
    nodes
}

/// Polls a node's own view (nothing to be told of) until the map exists
/// and `members` nodes are alive.
async fn wait_for_cluster(node: &FrontierProcess, members: usize) {
    crawl_tests::wait_for_cluster(&mut node.admin().await, members).await;
}

/// Mock sites on distinct loopback addresses: distinct hosts, so distinct
/// partitions.
async fn sites(count: u8) -> Vec<MockSite> {
    let mut sites = Vec::new();
    for i in 1..=count {
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.{i}:0"))
            .await
            .unwrap();
        sites.push(MockSite::serve(listener, SiteConfig::default()).unwrap());
    }
    sites
}

/// Every site fetched as its ground truth says, with at most `extra`
/// fetches beyond it over all sites (pages in flight at a kill).
fn check_sites(sites: &[MockSite], extra: u32) {
    let expected = expected_fetches(&SiteConfig::default(), MAX_DEPTH);
    let mut surplus = 0;
    for site in sites {
        let fetched = site.page_fetches();
        for (path, times) in &expected {
            let got = fetched.get(path).copied().unwrap_or(0);
            assert!(
                got >= *times,
                "{}{path} fetched {got} times, expected {times}",
                site.base()
            );
            surplus += got - times;
        }
        let unexpected: Vec<_> = fetched
            .keys()
            .filter(|p| !expected.contains_key(*p))
            .collect();
        assert!(unexpected.is_empty(), "unexpected fetches {unexpected:?}");
        for path in NEVER_FETCHED {
            assert!(!fetched.contains_key(*path), "{path} must never be fetched");
        }
    }
    assert!(
        surplus <= extra,
        "{surplus} fetches beyond the ground truth"
    );
}

fn seed_all(endpoint: &str, sites: &[MockSite]) {
    let mut args = vec!["seed".to_owned()];
    args.extend(sites.iter().map(|site| format!("{}/", site.base())));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, text) = frontier_cli(endpoint, &args);
    assert!(status.success(), "{text}");
}

/// A worker given each node (it finds the others from ListNodes).
fn a_worker_per_node(nodes: &[FrontierProcess], out: &Path) -> Vec<WorkerProcess> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| WorkerProcess::start(&node.endpoint(), out, &format!("w{i}"), WORKER_ARGS))
        .collect()
}

/// The cluster as `node` sees it.
async fn cluster_of(node: &FrontierProcess) -> proto::admin::ClusterStatus {
    node.admin()
        .await
        .get_cluster(proto::admin::GetClusterRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Nodes that hold URLs of the crawl, from the cluster's own breakdown.
async fn nodes_holding_urls(node: &FrontierProcess) -> usize {
    let progress = node.progress().await;
    assert_eq!(progress.nodes.len(), 3, "{progress:?}");
    progress.nodes.iter().filter(|n| n.discovered > 0).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_and_three_workers_crawl_every_page_once() {
    let Some(binary) = etcd_or_skip("three_nodes_and_three_workers_crawl_every_page_once") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let sites = sites(4).await;
    let nodes = three_nodes(&etcd, dir.path()).await;
    let out = dir.path().join("out");
    // Each worker is given a different node and finds the others.
    let workers = a_worker_per_node(&nodes, &out);
    seed_all(&nodes[0].endpoint(), &sites);
    crawl_tests::crawl_ends(&nodes[1].endpoint(), workers, 180);
    check_sites(&sites, 0);
    for site in &sites {
        let robots = site.fetch_counts().get("/robots.txt").copied().unwrap_or(0);
        assert!((1..=3).contains(&robots), "robots.txt read {robots} times");
        // One URL of a host in flight at a time, across workers and nodes.
        let max_in_flight = site.hits().iter().map(|h| h.in_flight).max().unwrap_or(0);
        assert_eq!(max_in_flight, 1, "{}", site.base());
    }
    assert!(nodes_holding_urls(&nodes[2]).await >= 2);
    // Every node answers for the whole cluster alike.
    let expected_pages: u64 =
        sites.len() as u64 * expected_fetches(&SiteConfig::default(), MAX_DEPTH).len() as u64;
    for node in &nodes {
        let stats = node
            .client()
            .await
            .get_stats(uf::QueueWithinCrawlParams::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.size, 0);
        assert!(stats.counts["completed"] >= expected_pages, "{stats:?}");
        let listed = node
            .client()
            .await
            .list_nodes(uf::Empty {})
            .await
            .unwrap()
            .into_inner()
            .values;
        assert_eq!(listed.len(), 3);
    }
    let (status, text) = frontier_cli(&nodes[2].endpoint(), &["health", "--partitions"]);
    assert!(status.success(), "{text}");
    for id in ["n1", "n2", "n3"] {
        assert!(text.contains(&format!("@{id}")), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_crawl_and_restarted_loses_nothing() {
    let Some(binary) = etcd_or_skip("a_node_killed_mid_crawl_and_restarted_loses_nothing") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let sites = sites(4).await;
    let mut nodes = three_nodes(&etcd, dir.path()).await;
    let out = dir.path().join("out");
    let _workers = a_worker_per_node(&nodes, &out);
    seed_all(&nodes[0].endpoint(), &sites);
    sites[0].answered_at_least(10).await;
    // kill -9 the node that holds the most URLs now.
    let progress = nodes[0].progress().await;
    let busiest = progress
        .nodes
        .iter()
        .max_by_key(|n| n.discovered)
        .map(|n| n.node.clone())
        .unwrap();
    let index = ["n1", "n2", "n3"]
        .iter()
        .position(|id| *id == busiest)
        .unwrap();
    let killed = nodes.remove(index);
    let listen = killed.addr.to_string();
    killed.kill();
    // While it is away, the rest answer: calls that need it name it.
    let survivor = &nodes[0];
    let away = survivor
        .client()
        .await
        .get_stats(uf::QueueWithinCrawlParams::default())
        .await
        .expect_err("crawl-wide figures need every node");
    assert_eq!(away.code(), tonic::Code::Unavailable, "{away:?}");
    assert!(away.message().contains(&busiest), "{away:?}");
    // A crawl-wide setting made while it is away reaches it from etcd.
    let (status, text) = frontier_cli(
        &survivor.endpoint(),
        &[
            "revisit",
            "--crawl",
            "news",
            "--policy",
            "fixed",
            "--min-secs",
            "600",
        ],
    );
    assert!(status.success(), "{text}");
    let restarted = FrontierProcess::start_on(
        &dir.path().join(&busiest),
        &listen,
        &node_args(&etcd.endpoint, &busiest, &[]),
    );
    let (status, text) = frontier_cli(
        &restarted.endpoint(),
        &["status", "--wait", "--timeout-secs", "180"],
    );
    assert!(status.success(), "crawl did not finish: {text}");
    let mut admin = restarted.admin().await;
    let mut settled = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        let own = admin
            .get_progress(proto::admin::GetProgressRequest {
                crawl_id: "news".into(),
                local: true,
            })
            .await
            .unwrap()
            .into_inner()
            .revisit
            .unwrap();
        if own.own {
            assert_eq!((own.policy.as_str(), own.min_secs), ("fixed", 600));
            break;
        }
        // Polled: the node applies etcd's settings on its own task.
        settled.tick().await;
    }
    // The restarted node serves nothing until the leases it handed out
    // before the kill have run out: only a page whose report had not landed
    // by then (at most one per host) may be fetched again.
    check_sites(&sites, sites.len() as u32);
}

/// With two copies of each partition, a node killed with SIGKILL and its
/// data directory deleted stops nothing for long: its partitions' followers
/// take over, new followers are copied, and the crawl completes with every
/// page fetched once but those in flight at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lost_with_its_disk_mid_crawl_stops_nothing_with_two_copies() {
    let Some(binary) = etcd_or_skip("a_node_lost_with_its_disk_mid_crawl_stops_nothing") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let sites = sites(4).await;
    let mut nodes = three_nodes_with(&etcd.endpoint, dir.path(), &["--replicas", "2"]).await;
    let out = dir.path().join("out");
    // Workers given the nodes that stay.
    let workers = a_worker_per_node(&nodes[..2], &out);
    seed_all(&nodes[0].endpoint(), &sites);
    sites[0].answered_at_least(10).await;
    let lost = nodes.remove(2);
    lost.kill();
    std::fs::remove_dir_all(dir.path().join("n3")).unwrap();
    crawl_tests::crawl_ends(&nodes[1].endpoint(), workers, 180);
    // Pages in flight at the kill (at most one per host) may be fetched
    // again once the old leader's leases have run out; nothing else.
    check_sites(&sites, sites.len() as u32);
    // Each URL counted once, by its leader, not again by its follower.
    let expected_pages =
        sites.len() as u64 * expected_fetches(&SiteConfig::default(), MAX_DEPTH).len() as u64;
    let stats = nodes[0]
        .client()
        .await
        .get_stats(uf::QueueWithinCrawlParams::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        (expected_pages..2 * expected_pages).contains(&stats.counts["completed"]),
        "{} pages, {stats:?}",
        expected_pages
    );
    // Listed and counted once too, by the leaders.
    let counted = nodes[1]
        .client()
        .await
        .count_ur_ls(uf::CountUrlParams::default())
        .await
        .unwrap()
        .into_inner()
        .value;
    assert_eq!(counted, stats.size + stats.counts["completed"], "{stats:?}");
    let (status, text) = frontier_cli(&nodes[0].endpoint(), &["cluster", "remove", "n3"]);
    assert!(status.success(), "{text}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let cluster = cluster_of(&nodes[0]).await;
        let whole = cluster.followers.len() == 8
            && cluster.moves.is_empty()
            && cluster
                .owners
                .iter()
                .zip(&cluster.followers)
                .all(|(owner, f)| owner != "n3" && f.in_sync.len() == 1 && f.in_sync[0] != "n3");
        if whole {
            assert!(cluster.nodes.iter().all(|n| n.id != "n3"), "{cluster:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not back at two copies without n3: {cluster:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// etcd run as three members, as the deployments run it: its leader
/// killed -9 mid-crawl changes nothing. No node's registration lapses, no
/// partition changes hands, and every page is fetched exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_member_killed_mid_crawl_changes_nothing() {
    let Some(binary) = etcd_or_skip("an_etcd_member_killed_mid_crawl_changes_nothing") else {
        return;
    };
    let mut etcd = EtcdCluster::start(&binary, 3);
    let dir = tempfile::tempdir().unwrap();
    let sites = sites(4).await;
    // The default registration TTL: etcd elects a new leader and the
    // nodes' clients reach another member well within it, which a TTL of
    // 2 s does not leave room for on a loaded machine.
    let nodes = three_nodes_with(
        &etcd.endpoint,
        dir.path(),
        &["--replicas", "2", "--lease-ttl-secs", "10"],
    )
    .await;
    let before = crawl_tests::wait_for_copies(
        &mut nodes[0].admin().await,
        2,
        std::time::Duration::from_secs(60),
    )
    .await;
    let out = dir.path().join("out");
    let workers = a_worker_per_node(&nodes, &out);
    seed_all(&nodes[0].endpoint(), &sites);
    sites[0].answered_at_least(10).await;
    let leader = etcd.leader().await;
    etcd.kill_member(leader);
    crawl_tests::crawl_ends(&nodes[1].endpoint(), workers, 180);
    check_sites(&sites, 0);
    let after = cluster_of(&nodes[2]).await;
    assert_eq!(
        (after.epoch, &after.owners, &after.followers),
        (before.epoch, &before.owners, &before.followers),
        "the partition map changed"
    );
    assert!(after.nodes.iter().all(|n| n.alive), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_clear() {
    let Some(binary) = etcd_or_skip("refusals_are_clear") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // etcd down at start: a clear error once the join timeout is over.
    let unreachable = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    };
    let log = FrontierProcess::try_start(
        &dir.path().join("alone"),
        &node_args(&unreachable, "n1", &["--etcd-timeout-secs", "1"]),
    )
    .err()
    .expect("a node without etcd does not start");
    assert!(log.contains("cannot reach etcd"), "{log}");

    let etcd = EtcdProcess::start(&binary);
    let nodes = three_nodes(&etcd, dir.path()).await;
    // Another partition count than the cluster's.
    let log = FrontierProcess::try_start(
        &dir.path().join("n4"),
        &node_args(&etcd.endpoint, "n4", &["--partitions", "16"]),
    )
    .err()
    .expect("a store of another partition count is refused");
    assert!(
        log.contains("the cluster has 8 partitions and this node's store has 16"),
        "{log}"
    );
    // A node refused never said it was listening.
    assert!(!log.contains("listening"), "{log}");
    // Other admission rules than the cluster's.
    let log = FrontierProcess::try_start(
        &dir.path().join("n5"),
        &node_args(&etcd.endpoint, "n5", &["--scope", "any"]),
    )
    .err()
    .expect("other rules are refused");
    assert!(log.contains("admission rules"), "{log}");
    // A second live node under a taken ID.
    let log = FrontierProcess::try_start(
        &dir.path().join("n2-again"),
        &node_args(&etcd.endpoint, "n2", &[]),
    )
    .err()
    .expect("a taken node ID is refused");
    assert!(log.contains("registered by a live node"), "{log}");
    // A forwarded call under another epoch: the node refuses it.
    let mut client = nodes[0].client().await;
    let mut request = tonic::Request::new(uf::QueueDelayParams {
        key: "example.com".into(),
        delay_requestable: 3,
        crawl_id: String::new(),
        local: true,
    });
    request
        .metadata_mut()
        .insert("x-frontier-epoch", "999".parse().unwrap());
    let secret = etcd
        .get("/crawl-frontier/test/node-secret")
        .await
        .expect("the cluster's node secret");
    request.metadata_mut().insert(
        proto::bearer::NODE_SECRET_HEADER,
        String::from_utf8(secret).unwrap().parse().unwrap(),
    );
    let refused = client.set_delay(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(refused.message().contains("epochs differ"), "{refused:?}");
}

/// The probe's finding: a client with no token sent PutURLs with the
/// current epoch in the forwarding header (GetCluster tells it to anyone),
/// every item was acked OK, and those of partitions the node does not own
/// were later deleted as stray copies. A forwarding header without the
/// cluster's node secret is refused; and even from a node, a write for a
/// partition the receiver does not own is answered FAIL, never acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_forwarding_header_gets_nothing_acked() {
    let Some(binary) = etcd_or_skip("a_forged_forwarding_header_gets_nothing_acked") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(&etcd, dir.path()).await;
    let mut admin = nodes[0].admin().await;
    let epoch = admin
        .get_cluster(proto::admin::GetClusterRequest {})
        .await
        .unwrap()
        .into_inner()
        .epoch;
    let theirs = urls_owned_by(&nodes[0], "n2", 20).await;
    let ours = urls_owned_by(&nodes[0], "n1", 20).await;
    let items = |urls: &[String]| -> Vec<uf::UrlItem> {
        urls.iter()
            .map(|url| uf::UrlItem {
                item: Some(uf::url_item::Item::Discovered(uf::DiscoveredUrlItem {
                    info: Some(uf::UrlInfo {
                        url: url.clone(),
                        crawl_id: "acks".into(),
                        ..uf::UrlInfo::default()
                    }),
                })),
                ..uf::UrlItem::default()
            })
            .collect()
    };
    let put = |urls: Vec<uf::UrlItem>, secret: Option<String>| {
        let mut client = futures::executor::block_on(nodes[0].client());
        async move {
            let mut request = tonic::Request::new(futures::stream::iter(urls));
            request
                .metadata_mut()
                .insert("x-frontier-epoch", epoch.to_string().parse().unwrap());
            if let Some(secret) = secret {
                request
                    .metadata_mut()
                    .insert(proto::bearer::NODE_SECRET_HEADER, secret.parse().unwrap());
            }
            let mut acks = client.put_ur_ls(request).await?.into_inner();
            let mut statuses = Vec::new();
            while let Some(ack) = acks.message().await? {
                statuses.push(ack.status());
            }
            Ok::<_, tonic::Status>(statuses)
        }
    };
    let mut all = theirs.clone();
    all.extend(ours.iter().cloned());
    // A client's forwarding header: refused before anything is stored.
    let refused = put(items(&all), None).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let forged = put(items(&all), Some("0".repeat(64))).await.unwrap_err();
    assert_eq!(forged.code(), tonic::Code::PermissionDenied, "{forged:?}");
    // From a node (the secret, as etcd holds it): n1 stores its own
    // partitions' URLs and answers FAIL for n2's, so the sender routes
    // them again.
    let secret = String::from_utf8(
        etcd.get("/crawl-frontier/test/node-secret")
            .await
            .expect("the cluster's node secret"),
    )
    .unwrap();
    let statuses = put(items(&all), Some(secret)).await.unwrap();
    let (fail, ok) = statuses.split_at(theirs.len());
    assert!(
        fail.iter().all(|s| *s == uf::ack_message::Status::Fail),
        "{statuses:?}"
    );
    assert!(
        ok.iter().all(|s| *s == uf::ack_message::Status::Ok),
        "{statuses:?}"
    );
    // Nothing of n2's partitions is stored at n1, and n1 has its own.
    let count = |node: &FrontierProcess| {
        let node = node.endpoint();
        async move {
            let mut client = uf::url_frontier_client::UrlFrontierClient::connect(node)
                .await
                .unwrap();
            client
                .count_ur_ls(uf::CountUrlParams {
                    crawl_id: "acks".into(),
                    local: Some(true),
                    ..uf::CountUrlParams::default()
                })
                .await
                .unwrap()
                .into_inner()
                .value
        }
    };
    assert_eq!(count(&nodes[0]).await, 20);
    assert_eq!(count(&nodes[1]).await, 0);
    // A node's own partitions are not open to forged copies either: the
    // move protocol's calls need the secret.
    let mut admin = nodes[1].admin().await;
    let sealed = admin
        .seal_partition(proto::admin::SealPartitionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(sealed.code(), tonic::Code::PermissionDenied, "{sealed:?}");
}

/// URLs whose partitions node `owner` holds, in a crawl of its own.
async fn urls_owned_by(node: &FrontierProcess, owner: &str, count: usize) -> Vec<String> {
    let mut admin = node.admin().await;
    let mut urls = Vec::new();
    let cluster = admin
        .get_cluster(proto::admin::GetClusterRequest {})
        .await
        .unwrap()
        .into_inner();
    for i in 0.. {
        let url = format!("http://host{i}.example/page");
        let check = admin
            .check_url(proto::admin::CheckUrlRequest {
                url: url.clone(),
                crawl_id: "acks".into(),
                queue_key: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        if cluster.owners[check.partition as usize] == owner {
            urls.push(url);
            if urls.len() == count {
                break;
            }
        }
    }
    urls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ack_goes_out_before_the_owner_committed() {
    let Some(binary) = etcd_or_skip("no_ack_goes_out_before_the_owner_committed") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three_nodes(&etcd, dir.path()).await;
    // URLs n3 owns, sent to n1 in a stream while n3 is killed.
    let urls = urls_owned_by(&nodes[0], "n3", 2000).await;
    let (sender, batches) = tokio::sync::mpsc::channel(4);
    let mut client = nodes[0].client().await;
    let (ack_sender, mut acks_in) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = client
            .put_discovered(tokio_stream::wrappers::ReceiverStream::new(batches))
            .await
            .unwrap()
            .into_inner();
        while let Ok(Some(ack)) = stream.message().await {
            if ack_sender.send(ack).is_err() {
                break;
            }
        }
    });
    let feed = {
        let urls = urls.clone();
        tokio::spawn(async move {
            for (n, chunk) in urls.chunks(20).enumerate() {
                let batch = uf::DiscoveredBatch {
                    id: n.to_string(),
                    done: None,
                    items: chunk
                        .iter()
                        .map(|url| uf::UrlInfo {
                            url: url.clone(),
                            crawl_id: "acks".into(),
                            ..uf::UrlInfo::default()
                        })
                        .collect(),
                };
                if sender.send(batch).await.is_err() {
                    break;
                }
            }
        })
    };
    // The owner dies mid-stream: some batches are acked before, the rest
    // arrive while it is away.
    let mut acks = Vec::new();
    while acks.len() < 20 {
        acks.push(acks_in.recv().await.expect("acks before the kill"));
    }
    let owner = nodes.remove(2);
    let listen = owner.addr.to_string();
    owner.kill();
    feed.await.unwrap();
    while let Some(ack) = acks_in.recv().await {
        acks.push(ack);
    }
    let ok = uf::ack_message::Status::Ok as i32;
    let acked: Vec<&String> = acks
        .iter()
        .flat_map(|ack| {
            let batch: usize = ack.id.parse().unwrap();
            let chunk = &urls[batch * 20..(batch * 20 + 20).min(urls.len())];
            chunk
                .iter()
                .zip(&ack.statuses)
                .filter(|(_, status)| **status == ok)
                .map(|(url, _)| url)
                .collect::<Vec<_>>()
        })
        .collect();
    let failed = acks
        .iter()
        .flat_map(|ack| &ack.statuses)
        .filter(|s| **s == uf::ack_message::Status::Fail as i32)
        .count();
    // The owner back on its data directory holds every URL acked OK.
    let restarted = FrontierProcess::start_on(
        &dir.path().join("n3"),
        &listen,
        &node_args(&etcd.endpoint, "n3", &[]),
    );
    wait_for_cluster(&restarted, 3).await;
    let mut client = nodes[0].client().await;
    for url in &acked {
        let status = client
            .get_url_status(uf::UrlStatusRequest {
                url: (*url).clone(),
                key: String::new(),
                crawl_id: "acks".into(),
            })
            .await;
        assert!(
            status.is_ok(),
            "{url} was acked OK but is missing: {status:?}"
        );
    }
    eprintln!(
        "{} URLs acked OK and present, {failed} answered FAIL while the owner was away",
        acked.len()
    );
    assert!(
        acked.len() >= 20 * 20,
        "acks before the kill: {}",
        acked.len()
    );
    assert!(failed > 0, "the kill came after the last batch");
}

/// `frontier seed` run while the nodes start, as a user following the
/// README would: the map does not exist yet, or its epoch climbs as
/// partitions move to each node that joins. The CLI waits (saying so) and
/// every seed lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_seeded_the_moment_it_starts_takes_every_seed() {
    let Some(binary) = etcd_or_skip("a_cluster_seeded_the_moment_it_starts_takes_every_seed")
    else {
        return;
    };
    for initial_nodes in ["3", "1"] {
        let etcd = EtcdProcess::start(&binary);
        let dir = tempfile::tempdir().unwrap();
        let start = |id: &str| {
            FrontierProcess::start(
                &dir.path().join(id),
                &node_args(&etcd.endpoint, id, &["--initial-nodes", initial_nodes]),
            )
        };
        let mut nodes = vec![start("n1"), start("n2")];
        // Seeded before the third node starts: with --initial-nodes 3 there
        // is no partition map yet; with 1, partitions are moving to n2 and
        // then to n3 as it joins.
        let endpoint = nodes[0].endpoint();
        let seeding = std::thread::spawn(move || {
            // Hosts enough that every node owns some of them.
            let seeds: Vec<String> = (0..24)
                .map(|i| format!("http://seed-{i}.example/"))
                .collect();
            let mut args = vec!["seed"];
            args.extend(seeds.iter().map(String::as_str));
            frontier_cli(&endpoint, &args)
        });
        nodes.push(start("n3"));
        let (status, text) = seeding.join().unwrap();
        assert!(status.success(), "--initial-nodes {initial_nodes}: {text}");
        assert!(
            text.contains("added 24, already known 0, refused 0"),
            "{text}"
        );
        // Every seed is stored, at whichever node owns it, once the moves
        // of the forming cluster are over (a partition in flight is
        // counted at both ends until its source lets it go).
        let started = std::time::Instant::now();
        loop {
            let (status, text) = frontier_cli(&nodes[1].endpoint(), &["status", "--json"]);
            assert!(status.success(), "{text}");
            let json: serde_json::Value =
                serde_json::from_str(text.lines().next().unwrap_or_default()).expect(&text);
            if json["discovered"] == 24 {
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "--initial-nodes {initial_nodes}: {text}"
            );
            // Polling an operator's view; nothing here synchronises with it.
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

/// A page's report carried in its outlinks' batch is stored only once
/// every outlink is, wherever it lives: with the owner of some outlinks
/// down, the report is answered FAIL and the page stays undone; sent again
/// once that owner is back, both are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_is_done_only_once_its_outlinks_are_stored_on_every_node() {
    let Some(binary) =
        etcd_or_skip("a_page_is_done_only_once_its_outlinks_are_stored_on_every_node")
    else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three_nodes(&etcd, dir.path()).await;
    let page = urls_owned_by(&nodes[0], "n1", 1).await.remove(0);
    let at_n2 = urls_owned_by(&nodes[0], "n2", 3).await;
    let at_n3 = urls_owned_by(&nodes[0], "n3", 3).await;
    let info = |url: &str| uf::UrlInfo {
        url: url.to_owned(),
        crawl_id: "acks".into(),
        ..uf::UrlInfo::default()
    };
    let batch = |id: &str| uf::DiscoveredBatch {
        id: id.to_owned(),
        items: at_n2.iter().chain(&at_n3).map(|url| info(url)).collect(),
        done: Some(uf::KnownUrlItem {
            info: Some(info(&page)),
            refetchable_from_date: 0,
        }),
    };
    let (ok, skipped, fail) = (
        uf::ack_message::Status::Ok as i32,
        uf::ack_message::Status::Skipped as i32,
        uf::ack_message::Status::Fail as i32,
    );

    let n3 = nodes.remove(2);
    let listen = n3.addr.to_string();
    n3.kill();
    // Sent to n2, which owns neither the page nor all of its outlinks.
    let ack = one_batch(&nodes[1], batch("n3 away")).await;
    assert_eq!(ack.statuses, [[ok; 3], [fail; 3]].concat(), "{ack:?}");
    assert_eq!(ack.done, Some(fail), "{ack:?}");
    assert_eq!(due_of(&nodes[0], &page).await, None, "the page was stored");

    let n3 = FrontierProcess::start_on(
        &dir.path().join("n3"),
        &listen,
        &node_args(&etcd.endpoint, "n3", &[]),
    );
    wait_for_cluster(&n3, 3).await;
    // Sent again until n3's partitions are reachable from n2 once more.
    let ack = loop {
        let ack = one_batch(&nodes[1], batch("n3 back")).await;
        if ack.done != Some(fail) {
            break ack;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(ack.statuses, [[skipped; 3], [ok; 3]].concat(), "{ack:?}");
    assert_eq!(ack.done, Some(ok), "{ack:?}");
    assert_eq!(due_of(&nodes[0], &page).await, Some(0), "the page is done");
}

/// Sends one batch to `node` and answers its ack.
async fn one_batch(node: &FrontierProcess, batch: uf::DiscoveredBatch) -> uf::BatchAck {
    let mut client = node.client().await;
    let mut acks = client
        .put_discovered(futures::stream::iter([batch]))
        .await
        .unwrap()
        .into_inner();
    acks.message().await.unwrap().expect("an ack")
}

/// When a URL of crawl `acks` is due, as `node` answers; `None` when it is
/// not stored.
async fn due_of(node: &FrontierProcess, url: &str) -> Option<u64> {
    let item = node
        .client()
        .await
        .get_url_status(uf::UrlStatusRequest {
            url: url.to_owned(),
            key: String::new(),
            crawl_id: "acks".into(),
        })
        .await
        .map(|item| item.into_inner().item);
    match item {
        Ok(Some(uf::url_item::Item::Known(known))) => Some(known.refetchable_from_date),
        _ => None,
    }
}
