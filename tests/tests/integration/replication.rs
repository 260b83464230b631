//! Partitions on two copies (`--replicas 2`): three real `frontier serve`
//! nodes over a real etcd, a leader killed with SIGKILL and its data
//! directory deleted, never to return. Every URL acknowledged before,
//! during and after the kill is found afterwards, writes resume once an
//! in-sync follower takes over, and every partition is back at two copies
//! once a new follower has been copied. Skipped, saying so, without etcd.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crawl_tests::{EtcdProcess, FrontierProcess, etcd_or_skip};
use proto::admin::{ClusterStatus, GetClusterRequest};
use proto::urlfrontier as uf;

const CRAWL: &str = "replicated";

fn node_args<'a>(etcd: &'a str, id: &'a str) -> Vec<&'a str> {
    vec![
        "--etcd",
        etcd,
        "--cluster",
        "replicas",
        "--node-id",
        id,
        "--initial-nodes",
        "3",
        "--partitions",
        "8",
        "--lease-ttl-secs",
        "2",
        "--replicas",
        "2",
    ]
}

async fn cluster_status(node: &FrontierProcess) -> ClusterStatus {
    node.admin()
        .await
        .get_cluster(GetClusterRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Polls until every partition has `copies` copies on live nodes and no
/// move is in flight.
async fn wait_for_copies(node: &FrontierProcess, copies: usize, within: Duration) -> ClusterStatus {
    let deadline = Instant::now() + within;
    loop {
        let status = cluster_status(node).await;
        let alive: BTreeSet<&str> = status
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.id.as_str())
            .collect();
        let whole = status.owners.len() == status.partitions as usize
            && status.followers.len() == status.partitions as usize
            && status.moves.is_empty()
            && status
                .owners
                .iter()
                .zip(&status.followers)
                .all(|(owner, f)| {
                    alive.contains(owner.as_str())
                        && 1 + f.in_sync.len() == copies
                        && f.in_sync.iter().all(|id| alive.contains(id.as_str()))
                });
        if whole {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "partitions not back at {copies} copies within {within:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// URLs of the crawl whose partitions `leader` leads.
async fn urls_led_by(node: &FrontierProcess, leader: &str, count: usize) -> Vec<String> {
    let status = cluster_status(node).await;
    let mut admin = node.admin().await;
    let mut urls = Vec::new();
    for i in 0.. {
        let url = format!("http://host{i}.example/page");
        let partition = partition_of(&mut admin, &url).await;
        if status.owners[partition as usize] == leader {
            urls.push(url);
            if urls.len() == count {
                break;
            }
        }
    }
    urls
}

/// Sends `urls` in batches of 20 over one PutDiscovered stream; answers
/// the URLs acked OK and those answered otherwise.
async fn put_all(
    mut client: uf::url_frontier_client::UrlFrontierClient<tonic::transport::Channel>,
    urls: &[String],
) -> (Vec<String>, Vec<String>) {
    let batches: Vec<uf::DiscoveredBatch> = urls
        .chunks(20)
        .enumerate()
        .map(|(n, chunk)| uf::DiscoveredBatch {
            id: n.to_string(),
            items: chunk
                .iter()
                .map(|url| uf::UrlInfo {
                    url: url.clone(),
                    crawl_id: CRAWL.into(),
                    ..uf::UrlInfo::default()
                })
                .collect(),
        })
        .collect();
    let mut acks = client
        .put_discovered(futures::stream::iter(batches))
        .await
        .unwrap()
        .into_inner();
    let ok = uf::ack_message::Status::Ok as i32;
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    while let Ok(Some(ack)) = acks.message().await {
        let batch: usize = ack.id.parse().unwrap();
        let chunk = &urls[batch * 20..(batch * 20 + 20).min(urls.len())];
        for (url, status) in chunk.iter().zip(&ack.statuses) {
            if *status == ok {
                acked.push(url.clone());
            } else {
                failed.push(url.clone());
            }
        }
    }
    (acked, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_with_its_disk_loses_no_acked_url_and_copies_come_back() {
    let Some(binary) = etcd_or_skip("a_leader_killed_with_its_disk_loses_no_acked_url") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<FrontierProcess> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| FrontierProcess::start(&dir.path().join(id), &node_args(&etcd.endpoint, id)))
        .collect();
    for node in &nodes {
        crawl_tests::wait_for_cluster(&mut node.admin().await, 3).await;
    }
    let status = wait_for_copies(&nodes[0], 2, Duration::from_secs(60)).await;
    assert_eq!((status.replicas, status.min_in_sync), (2, 2));
    let n3_leads: Vec<u32> = (0..status.partitions)
        .filter(|&p| status.owners[p as usize] == "n3")
        .collect();
    assert!(!n3_leads.is_empty(), "{status:?}");
    // Acked before the kill: on n3 and on its followers.
    let urls = urls_led_by(&nodes[0], "n3", 600).await;
    let (before, _) = put_all(nodes[0].client().await, &urls[..200]).await;
    assert_eq!(before.len(), 200, "every write acked while all are up");
    // n3 dies, disk and all, while a stream of writes for its partitions
    // goes on.
    let victim = nodes.remove(2);
    let killed_at = Instant::now();
    let writes = {
        let rest = urls[200..].to_vec();
        let client = nodes[0].client().await;
        tokio::spawn(async move { put_all(client, &rest).await })
    };
    victim.kill();
    std::fs::remove_dir_all(dir.path().join("n3")).unwrap();
    let (mut acked, mut pending) = writes.await.unwrap();
    acked.extend(before);
    // A client sends again what was not acked, until all is: writes resume
    // once a follower leads each of n3's partitions (and has a new
    // follower: two copies are needed).
    let mut resumed_after = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !pending.is_empty() {
        if Instant::now() >= deadline {
            let status = cluster_status(&nodes[0]).await;
            let log = nodes
                .iter()
                .map(|n| n.log_text())
                .collect::<Vec<_>>()
                .join("\n----\n");
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains(" INFO "))
                .rev()
                .take(40)
                .collect();
            panic!(
                "{} writes still refused 90 s after the kill: {status:?}\n{}",
                pending.len(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let (ok, failed) = put_all(nodes[0].client().await, &pending).await;
        if !ok.is_empty() && resumed_after.is_none() {
            resumed_after = Some(killed_at.elapsed());
        }
        acked.extend(ok);
        pending = failed;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eprintln!(
        "{} URLs acked; writes to the dead leader's partitions resumed after {resumed_after:?}",
        acked.len()
    );
    // Every acked URL is found, through either survivor.
    for node in &nodes {
        assert_all_found(node, &acked).await;
    }
    // n3 never returns: it is removed, and every partition is back at two
    // copies on n1 and n2.
    let status = wait_for_copies(&nodes[0], 2, Duration::from_secs(60)).await;
    for p in n3_leads {
        assert_ne!(status.owners[p as usize], "n3");
    }
    // n3 comes back on a new, empty disk: the cluster takes it for a node
    // holding nothing and copies it its share.
    nodes.push(FrontierProcess::start(
        &dir.path().join("n3-new"),
        &node_args(&etcd.endpoint, "n3"),
    ));
    crawl_tests::wait_for_cluster(&mut nodes[0].admin().await, 3).await;
    let status = wait_for_copies(&nodes[0], 2, Duration::from_secs(60)).await;
    // Every copy is whole: each node holds every acked URL of each
    // partition it leads or follows.
    let partition_of = partitions_of(&nodes[0], &acked).await;
    for node in &nodes {
        let id = node_id(node).await;
        let held = local_urls(node).await;
        for url in &acked {
            let p = partition_of[url] as usize;
            let holds = status.owners[p] == id || status.followers[p].in_sync.contains(&id);
            if holds {
                assert!(
                    held.contains(url),
                    "{url} (partition {p}) missing on {id}'s copy"
                );
            }
        }
    }
    // And with two of the three nodes killed, the survivor leads what it
    // held and answers for every URL acked in it.
    let survivor_id = node_id(&nodes[0]).await;
    for node in nodes.drain(1..) {
        node.kill();
    }
    let mut client = nodes[0].client().await;
    for url in &acked {
        let p = partition_of[url] as usize;
        if status.owners[p] == survivor_id || status.followers[p].in_sync.contains(&survivor_id) {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let found = client.get_url_status(status_of(url)).await;
                match found {
                    Ok(_) => break,
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        assert!(Instant::now() < deadline, "{url}: {status:?}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(status) => panic!("{url} is not on {survivor_id}: {status:?}"),
                }
            }
        }
    }
}

fn status_of(url: &str) -> uf::UrlStatusRequest {
    uf::UrlStatusRequest {
        url: url.to_owned(),
        key: String::new(),
        crawl_id: CRAWL.into(),
    }
}

/// Every URL of `urls` is found through `node`.
async fn assert_all_found(node: &FrontierProcess, urls: &[String]) {
    let mut client = node.client().await;
    for url in urls {
        let status = client.get_url_status(status_of(url)).await;
        assert!(
            status.is_ok(),
            "{url} was acked OK but is missing: {status:?}"
        );
    }
}

async fn node_id(node: &FrontierProcess) -> String {
    cluster_status(node).await.answered_by
}

/// The partition of each URL of the crawl.
async fn partitions_of(
    node: &FrontierProcess,
    urls: &[String],
) -> std::collections::HashMap<String, u32> {
    let mut admin = node.admin().await;
    let mut partitions = std::collections::HashMap::new();
    for url in urls {
        partitions.insert(url.clone(), partition_of(&mut admin, url).await);
    }
    partitions
}

/// The partition of a URL of the crawl, as the cluster files it.
async fn partition_of(
    admin: &mut proto::admin::admin_client::AdminClient<tonic::transport::Channel>,
    url: &str,
) -> u32 {
    admin
        .check_url(proto::admin::CheckUrlRequest {
            url: url.to_owned(),
            crawl_id: CRAWL.into(),
            queue_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .partition
}

/// Every URL of the crawl in one node's own store.
async fn local_urls(node: &FrontierProcess) -> BTreeSet<String> {
    let mut client = node.client().await;
    let mut urls = BTreeSet::new();
    let mut start = 0;
    loop {
        let mut page = client
            .list_ur_ls(uf::ListUrlParams {
                start,
                size: 1000,
                crawl_id: CRAWL.into(),
                local: true,
                ..uf::ListUrlParams::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut got = 0;
        while let Some(item) = page.message().await.unwrap() {
            if let Some(info) = item.info() {
                urls.insert(info.url.clone());
            }
            got += 1;
        }
        if got < 1000 {
            return urls;
        }
        start += 1000;
    }
}

/// A leader paused (SIGSTOP) until a follower has taken its partitions
/// over, then resumed: nothing it answers afterwards is acknowledged
/// without the new leaders, and it serves none of its old partitions'
/// URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_acks_and_serves_nothing_once_replaced() {
    let Some(binary) = etcd_or_skip("a_paused_leader_acks_and_serves_nothing_once_replaced") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<FrontierProcess> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| FrontierProcess::start(&dir.path().join(id), &node_args(&etcd.endpoint, id)))
        .collect();
    for node in &nodes {
        crawl_tests::wait_for_cluster(&mut node.admin().await, 3).await;
    }
    wait_for_copies(&nodes[0], 2, Duration::from_secs(60)).await;
    let urls = urls_led_by(&nodes[0], "n3", 300).await;
    let (mut acked, _) = put_all(nodes[0].client().await, &urls[..100]).await;
    assert_eq!(acked.len(), 100);
    // Clients of n3 made before the pause, so that they reach it at once
    // when it resumes.
    let paused_client = nodes[2].client().await;
    let mut paused_frontier = nodes[2].client().await;
    nodes[2].signal(rustix::process::Signal::STOP);
    // The cluster gives n3's partitions to their followers.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = cluster_status(&nodes[0]).await;
        if status.owners.iter().all(|owner| owner != "n3") {
            break;
        }
        assert!(Instant::now() < deadline, "no failover: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Writes go on through n1 meanwhile.
    let (more, _) = put_all(nodes[0].client().await, &urls[100..200]).await;
    acked.extend(more);
    nodes[2].signal(rustix::process::Signal::CONT);
    // At once, before it has seen the new map: writes sent to n3 and a
    // GetURLs of it.
    let (writes, served) = tokio::join!(put_all(paused_client, &urls[200..]), async {
        paused_frontier
            .get_ur_ls(uf::GetParams {
                max_urls_per_queue: 100,
                max_queues: 100,
                item: Some(uf::get_params::Item::CrawlId(CRAWL.into())),
                ..uf::GetParams::default()
            })
            .await
    });
    let (from_paused, _) = writes;
    eprintln!(
        "{} acked through n1, {} acked by n3 after it resumed; its GetURLs: {:?}",
        acked.len(),
        from_paused.len(),
        served.as_ref().map(|_| ()).map_err(tonic::Status::code)
    );
    if let Ok(stream) = served {
        let mut stream = stream.into_inner();
        let mut got = Vec::new();
        while let Ok(Some(info)) = stream.message().await {
            got.push(info.url);
        }
        assert!(got.is_empty(), "the replaced leader served {got:?}");
    }
    acked.extend(from_paused);
    // Every write acked, by n1 or by the resumed n3, is held by the
    // partitions' leaders now.
    assert_all_found(&nodes[0], &acked).await;
}
