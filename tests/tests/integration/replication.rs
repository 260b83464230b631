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
    crawl_tests::wait_for_copies(&mut node.admin().await, copies, within).await
}

/// Nodes n1, n2 and n3 in `dir`, once every partition has two copies.
async fn start_three(
    etcd: &EtcdProcess,
    dir: &std::path::Path,
) -> (Vec<FrontierProcess>, ClusterStatus) {
    let nodes: Vec<FrontierProcess> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| FrontierProcess::start(&dir.join(id), &node_args(&etcd.endpoint, id)))
        .collect();
    for node in &nodes {
        crawl_tests::wait_for_cluster(&mut node.admin().await, 3).await;
    }
    let status = wait_for_copies(&nodes[0], 2, Duration::from_secs(60)).await;
    (nodes, status)
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
/// the URLs the frontier holds by its acks (OK, or SKIPPED: known, as a
/// URL sent again after a FAIL that stored it is) and the others (FAIL, or
/// no ack as the stream broke), which a client sends again.
async fn put_all(
    mut client: uf::url_frontier_client::UrlFrontierClient<tonic::transport::Channel>,
    urls: &[String],
) -> (Vec<String>, Vec<String>) {
    let batches: Vec<uf::DiscoveredBatch> = urls
        .chunks(20)
        .enumerate()
        .map(|(n, chunk)| uf::DiscoveredBatch {
            id: n.to_string(),
            done: None,
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
    let fail = uf::ack_message::Status::Fail as i32;
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    let mut answered = vec![false; batches.len()];
    if let Ok(acks) = client.put_discovered(futures::stream::iter(batches)).await {
        let mut acks = acks.into_inner();
        while let Ok(Some(ack)) = acks.message().await {
            let batch: usize = ack.id.parse().unwrap();
            answered[batch] = true;
            let chunk = &urls[batch * 20..(batch * 20 + 20).min(urls.len())];
            for (url, status) in chunk.iter().zip(&ack.statuses) {
                if *status == fail {
                    failed.push(url.clone());
                } else {
                    acked.push(url.clone());
                }
            }
        }
    }
    for (batch, chunk) in urls.chunks(20).enumerate() {
        if !answered[batch] {
            failed.extend(chunk.iter().cloned());
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
    let (mut nodes, status) = start_three(&etcd, dir.path()).await;
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
    let (mut acked, pending) = writes.await.unwrap();
    acked.extend(before);
    // A client sends again what was not acked, until all is: writes resume
    // once a follower leads each of n3's partitions (and has a new
    // follower: two copies are needed).
    let (more, resumed_after) = put_until_acked(&nodes, pending, killed_at).await;
    acked.extend(more);
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
    let (partition_of, status) = assert_copies_whole(&nodes, &acked).await;
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

/// Sends `pending` through the first of `nodes` again and again until all
/// is acked, as a client does; answers the URLs acked and how long after
/// `since` the first was.
async fn put_until_acked(
    nodes: &[FrontierProcess],
    mut pending: Vec<String>,
    since: Instant,
) -> (Vec<String>, Option<Duration>) {
    let mut acked = Vec::new();
    let mut first_after = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !pending.is_empty() {
        if Instant::now() >= deadline {
            let status = cluster_status(&nodes[0]).await;
            panic!(
                "{} writes still refused after 90 s: {status:?}\n{}",
                pending.len(),
                warnings(nodes)
            );
        }
        let (ok, failed) = put_all(nodes[0].client().await, &pending).await;
        if !ok.is_empty() && first_after.is_none() {
            first_after = Some(since.elapsed());
        }
        acked.extend(ok);
        pending = failed;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    (acked, first_after)
}

/// The nodes' logs but their INFO lines, for a failure's message.
fn warnings(nodes: &[FrontierProcess]) -> String {
    nodes
        .iter()
        .map(|n| {
            n.log_text()
                .lines()
                .filter(|l| !l.contains(" INFO "))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// Waits until every partition has two copies and each of `count` live
/// nodes leads its share: the cluster has nothing left to move.
async fn wait_for_balance(node: &FrontierProcess, count: usize) -> ClusterStatus {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = wait_for_copies(node, 2, Duration::from_secs(90)).await;
        let share = status.partitions as usize / count;
        let alive: Vec<&proto::admin::ClusterNode> =
            status.nodes.iter().filter(|n| n.alive).collect();
        if alive.len() == count && alive.iter().all(|n| n.partitions.len() >= share) {
            return status;
        }
        assert!(Instant::now() < deadline, "never balanced: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every copy is whole once the cluster is balanced: each node holds
/// every acked URL of each partition it leads or follows, under a map that
/// did not change while the copies were listed (a flip may let a copy
/// go). Answers each URL's partition and that map.
async fn assert_copies_whole(
    nodes: &[FrontierProcess],
    acked: &[String],
) -> (std::collections::HashMap<String, u32>, ClusterStatus) {
    let partition_of = partitions_of(&nodes[0], acked).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = wait_for_balance(&nodes[0], nodes.len()).await;
        let mut missing = Vec::new();
        for node in nodes {
            let id = node_id(node).await;
            let held = local_urls(node).await;
            for url in acked {
                let p = partition_of[url] as usize;
                let holds = status.owners[p] == id || status.followers[p].in_sync.contains(&id);
                if holds && !held.contains(url) {
                    missing.push(format!("{url} (partition {p}) on {id}"));
                }
            }
        }
        let after = cluster_status(&nodes[0]).await;
        if after.epoch == status.epoch && status.moves.is_empty() && after.moves.is_empty() {
            assert!(
                missing.is_empty(),
                "acked URLs missing on copies that hold their partition: {missing:?}\n{status:?}\n{}",
                warnings(nodes)
            );
            return (partition_of, status);
        }
        assert!(
            Instant::now() < deadline,
            "the map kept changing: {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
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
    let (nodes, _) = start_three(&etcd, dir.path()).await;
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

/// A follower killed -9 mid-ingest and restarted on its disk catches up:
/// writes go on without it (it leaves the in-sync set), it is copied what
/// it missed, and then every copy holds every acked URL. A queue blocked
/// on the leader stays blocked on the follower that takes it over when
/// the leader dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_restarted_mid_ingest_catches_up_and_queue_settings_survive_failover() {
    let Some(binary) = etcd_or_skip("a_follower_restarted_mid_ingest_catches_up") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, status) = start_three(&etcd, dir.path()).await;
    // URLs of n1's partitions, one host each; the first ten hosts blocked
    // for a day, through n2 (which routes each to n1, their leader).
    let urls = urls_led_by(&nodes[0], "n1", 400).await;
    let blocked: BTreeSet<String> = urls[..10]
        .iter()
        .map(|u| url::Url::parse(u).unwrap().host_str().unwrap().to_owned())
        .collect();
    crawl_tests::block_for_a_day(&mut nodes[1].client().await, CRAWL, &blocked).await;
    let (mut acked, _) = put_all(nodes[0].client().await, &urls[..100]).await;
    assert_eq!(acked.len(), 100);
    // The follower of n1's first partition is killed mid-stream and
    // restarted on its data directory at once.
    let first = status.owners.iter().position(|o| o == "n1").unwrap();
    let victim_id = status.followers[first].in_sync[0].clone();
    let victim_at = ["n1", "n2", "n3"]
        .iter()
        .position(|id| *id == victim_id)
        .unwrap();
    let writes = {
        let rest = urls[100..].to_vec();
        let client = nodes[0].client().await;
        tokio::spawn(async move { put_all(client, &rest).await })
    };
    let killed_at = Instant::now();
    nodes.remove(victim_at).kill();
    nodes.insert(
        victim_at,
        FrontierProcess::start(
            &dir.path().join(&victim_id),
            &node_args(&etcd.endpoint, &victim_id),
        ),
    );
    let (more, pending) = writes.await.unwrap();
    acked.extend(more);
    let (more, _) = put_until_acked(&nodes, pending, killed_at).await;
    acked.extend(more);
    assert_eq!(acked.len(), urls.len());
    // The follower is back in sync, and with the others holds every
    // acked URL.
    assert_copies_whole(&nodes, &acked).await;
    // n1 dies: its followers lead its partitions, blocked queues and all.
    let n1 = nodes.remove(0);
    n1.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = cluster_status(&nodes[0]).await;
        if status.owners.iter().all(|owner| owner != "n1") {
            break;
        }
        assert!(Instant::now() < deadline, "no failover: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wanted: BTreeSet<&String> = acked
        .iter()
        .filter(|u| !blocked.contains(url::Url::parse(u).unwrap().host_str().unwrap()))
        .collect();
    let mut served = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !wanted.iter().all(|u| served.contains(*u)) {
        assert!(
            Instant::now() < deadline,
            "{} of {} URLs of unblocked queues never served",
            wanted.iter().filter(|u| !served.contains(**u)).count(),
            wanted.len()
        );
        for node in &nodes {
            let answer = node
                .client()
                .await
                .get_ur_ls(uf::GetParams {
                    max_urls_per_queue: 10,
                    max_queues: 1000,
                    item: Some(uf::get_params::Item::CrawlId(CRAWL.into())),
                    ..uf::GetParams::default()
                })
                .await;
            let Ok(stream) = answer else { continue };
            let mut stream = stream.into_inner();
            while let Ok(Some(info)) = stream.message().await {
                served.insert(info.url);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let from_blocked: Vec<&String> = served
        .iter()
        .filter(|u| blocked.contains(url::Url::parse(u).unwrap().host_str().unwrap()))
        .collect();
    assert!(
        from_blocked.is_empty(),
        "blocked queues served after the failover: {from_blocked:?}"
    );
}

/// A follower killed -9 while writes go on, acknowledged on one copy
/// (`--min-in-sync 1`), then restarted on its data directory once its
/// leaders took it out of their in-sync sets: each partition it followed
/// is brought up to date from its leader's log, not copied whole (those it
/// led, whose leaders never sent it anything, are), and every copy holds
/// every acked URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_follower_catches_up_from_its_leaders_log() {
    let Some(binary) = etcd_or_skip("a_returning_follower_catches_up_from_its_leaders_log") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let args = |id: &'static str| {
        let mut args = node_args(&etcd.endpoint, id);
        args.extend(["--min-in-sync", "1", "--http-listen", "127.0.0.1:0"]);
        args
    };
    let mut nodes: Vec<FrontierProcess> = ["n1", "n2", "n3"]
        .into_iter()
        .map(|id| FrontierProcess::start(&dir.path().join(id), &args(id)))
        .collect();
    for node in &nodes {
        crawl_tests::wait_for_cluster(&mut node.admin().await, 3).await;
    }
    let before = wait_for_copies(&nodes[0], 2, Duration::from_secs(60)).await;
    let followed: BTreeSet<usize> = (0..before.owners.len())
        .filter(|&p| before.followers[p].in_sync.iter().any(|f| f == "n3"))
        .collect();
    let led = before.owners.iter().filter(|o| *o == "n3").count();
    assert!(!followed.is_empty() && led > 0, "{before:?}");
    let urls: Vec<String> = (0..800)
        .map(|i| format!("http://host{i}.example/page"))
        .collect();
    let (mut acked, _) = put_all(nodes[0].client().await, &urls[..300]).await;
    assert_eq!(acked.len(), 300);

    let killed_at = Instant::now();
    nodes.remove(2).kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = cluster_status(&nodes[0]).await;
        let out = status.owners.iter().all(|o| o != "n3")
            && status
                .followers
                .iter()
                .all(|f| !f.in_sync.iter().any(|id| id == "n3"))
            && followed
                .iter()
                .all(|&p| status.followers[p].lagging.iter().any(|id| id == "n3"));
        if out {
            break;
        }
        assert!(Instant::now() < deadline, "n3 never taken out: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Acknowledged on one copy while n3 is away.
    let (more, pending) = put_all(nodes[0].client().await, &urls[300..]).await;
    acked.extend(more);
    let (more, _) = put_until_acked(&nodes, pending, killed_at).await;
    acked.extend(more);
    assert_eq!(acked.len(), urls.len());

    nodes.push(FrontierProcess::start(&dir.path().join("n3"), &args("n3")));
    assert_copies_whole(&nodes, &acked).await;
    let metrics = crawl_tests::http_get(nodes[2].metrics.as_deref().expect("metrics")).await;
    let copies = |source: &str| -> usize {
        let series = format!("frontier_cluster_replica_copies_total{{source=\"{source}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}")) as usize
    };
    assert_eq!(
        (copies("log"), copies("whole")),
        (followed.len(), led),
        "copies made on n3 from the log and whole: the {} partitions it followed \
         from the log, the {led} it led whole\n{}",
        followed.len(),
        warnings(&nodes)
    );
}

/// URLs leased from a leader that is killed -9 right after its answer:
/// the follower that takes its partitions over holds them until those
/// leases could have ended, so none is served again before its lease
/// ran out (the leader's answer waited for its followers to hold the
/// horizon that covers them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_leased_just_before_the_leader_dies_wait_out_their_lease() {
    let Some(binary) = etcd_or_skip("urls_leased_just_before_the_leader_dies") else {
        return;
    };
    let etcd = EtcdProcess::start(&binary);
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _) = start_three(&etcd, dir.path()).await;
    let urls = urls_led_by(&nodes[0], "n3", 100).await;
    let (acked, _) = put_all(nodes[0].client().await, &urls).await;
    assert_eq!(acked.len(), urls.len());
    const LEASE: Duration = Duration::from_secs(10);
    let get = |lease: Duration| uf::GetParams {
        max_urls_per_queue: 10,
        max_queues: 1000,
        delay_requestable: lease.as_secs() as u32,
        item: Some(uf::get_params::Item::CrawlId(CRAWL.into())),
        ..uf::GetParams::default()
    };
    let leased_at = Instant::now();
    let mut leased = BTreeSet::new();
    let mut stream = nodes[2]
        .client()
        .await
        .get_ur_ls(get(LEASE))
        .await
        .unwrap()
        .into_inner();
    while let Some(info) = stream.message().await.unwrap() {
        leased.insert(info.url);
    }
    nodes.remove(2).kill();
    assert_eq!(leased.len(), urls.len(), "n3 leased all it leads");
    // The survivors serve every URL again, and none before its lease
    // could have ended.
    let mut served_again = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while served_again != leased {
        assert!(
            Instant::now() < deadline,
            "{} of {} URLs never served again\n{}",
            leased.len() - served_again.len(),
            leased.len(),
            warnings(&nodes)
        );
        for node in &nodes {
            let Ok(answer) = node.client().await.get_ur_ls(get(LEASE)).await else {
                continue;
            };
            let mut answer = answer.into_inner();
            while let Ok(Some(info)) = answer.message().await {
                let early = leased_at.elapsed() < LEASE;
                assert!(
                    !early,
                    "{} served again {:?} after a lease of {LEASE:?} began",
                    info.url,
                    leased_at.elapsed()
                );
                served_again.insert(info.url);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
