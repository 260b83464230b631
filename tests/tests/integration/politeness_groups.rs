//! Wide polite crawls. Politeness groups, as the servers see them: hosts
//! that share an address (`--politeness ip`) or a registrable domain
//! (`domain`) take turns a delay apart across two workers, and across two
//! frontier nodes of a cluster (a real etcd; skipped, saying so, where
//! none is installed), and a 429 with Retry-After on one host pauses its
//! whole group. And a worker's room for thousands of hosts: it raises its
//! open file limit.

use std::time::{Duration, Instant};

use crawl_tests::{EtcdProcess, FrontierProcess, WorkerProcess, crawl_ends, frontier_cli};
use mock_site::wide::{WideConfig, WideHit, WideSite};

const DELAY_MS: u64 = 250;

/// Crawls the site to its end with `politeness`, two workers.
async fn crawl(site: &WideSite, politeness: &str, dir: &std::path::Path) {
    let delay = DELAY_MS.to_string();
    let hosts_file = write_hosts_file(site, dir);
    let frontier = FrontierProcess::start(
        &dir.join("data"),
        &[
            "--politeness",
            politeness,
            "--default-delay-ms",
            &delay,
            "--hosts-file",
            &hosts_file,
        ],
    );
    crawl_through(site, &[frontier.endpoint()], dir);
}

/// The site's names pinned to their loopback addresses, as a hosts file
/// for the frontier and the workers; its path.
fn write_hosts_file(site: &WideSite, dir: &std::path::Path) -> String {
    let path = dir.join("hosts");
    std::fs::write(&path, site.hosts_file()).unwrap();
    path.to_string_lossy().into_owned()
}

/// Seeds every host of the site through the first of `endpoints` and
/// crawls them to the end with two workers, the i-th pointed at the i-th
/// endpoint (in turn).
fn crawl_through(site: &WideSite, endpoints: &[String], dir: &std::path::Path) {
    let workers = seed_and_start_workers(site, endpoints, dir, &[]);
    crawl_ends(&endpoints[0], workers, 120);
}

/// Seeds every host of the site through the first of `endpoints` and
/// starts two workers with `args` besides their own, the i-th pointed at
/// the i-th endpoint (in turn).
fn seed_and_start_workers(
    site: &WideSite,
    endpoints: &[String],
    dir: &std::path::Path,
    args: &[&str],
) -> Vec<WorkerProcess> {
    let hosts_file = write_hosts_file(site, dir);
    let seeds = dir.join("seeds");
    std::fs::write(&seeds, site.seeds()).unwrap();
    let mut worker_args = vec![
        "--hosts-file",
        &hosts_file,
        "--no-sitemaps",
        "--retry-base-secs",
        "1",
    ];
    worker_args.extend_from_slice(args);
    let workers: Vec<WorkerProcess> = (1..=2)
        .map(|i| {
            WorkerProcess::start(
                &endpoints[(i - 1) % endpoints.len()],
                &dir.join("out"),
                &format!("w{i}"),
                &worker_args,
            )
        })
        .collect();
    let (status, text) = frontier_cli(&endpoints[0], &["seed", "--file", &seeds.to_string_lossy()]);
    assert!(status.success(), "{text}");
    workers
}

/// Gaps between consecutive requests of one group below the delay.
fn close_gaps(hits: &[WideHit]) -> Vec<String> {
    let delay = Duration::from_millis(DELAY_MS);
    hits.windows(2)
        .filter(|pair| pair[1].at - pair[0].at < delay)
        .map(|pair| {
            format!(
                "h{} {} then h{} {} after {:?}",
                pair[0].host,
                pair[0].path,
                pair[1].host,
                pair[1].path,
                pair[1].at - pair[0].at
            )
        })
        .collect()
}

/// Each of `domains` domains of `hosts_per_domain` hosts saw every page
/// and each host's robots.txt, never two requests closer than the gap.
fn assert_each_domain_kept_its_gap(
    site: &WideSite,
    domains: usize,
    hosts_per_domain: usize,
    pages: usize,
) {
    let groups = site.hits_by(|host| host / hosts_per_domain);
    assert_eq!(groups.len(), domains);
    for (domain, hits) in &groups {
        assert_eq!(
            hits.len(),
            hosts_per_domain * (pages + 1),
            "domain {domain}: {hits:?}"
        );
        let close = close_gaps(hits);
        assert!(close.is_empty(), "domain {domain}: {close:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_of_one_domain_never_see_requests_closer_than_its_gap() {
    let dir = tempfile::tempdir().unwrap();
    let site = WideSite::start(WideConfig {
        hosts: 6,
        pages: 4,
        hosts_per_domain: 3,
        ..WideConfig::default()
    })
    .await
    .unwrap();
    crawl(&site, "domain", dir.path()).await;
    assert_each_domain_kept_its_gap(&site, 2, 3, 4);
}

/// The flags of node `id` of a two-node cluster under `politeness`.
fn node_args(etcd: &str, id: &str, politeness: &str, hosts_file: &str) -> Vec<String> {
    [
        "--etcd",
        etcd,
        "--cluster",
        "polite",
        "--node-id",
        id,
        "--initial-nodes",
        "2",
        "--partitions",
        "8",
        "--lease-ttl-secs",
        "2",
        "--politeness",
        politeness,
        "--default-delay-ms",
        &DELAY_MS.to_string(),
        "--hosts-file",
        hosts_file,
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

/// Starts node `id` of a two-node cluster in `dir/id`, on `listen` when
/// given.
fn start_node(
    etcd: &EtcdProcess,
    id: &str,
    politeness: &str,
    dir: &std::path::Path,
    listen: Option<&str>,
) -> FrontierProcess {
    let hosts_file = dir.join("hosts").to_string_lossy().into_owned();
    let args = node_args(&etcd.endpoint, id, politeness, &hosts_file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match listen {
        Some(listen) => FrontierProcess::start_on(&dir.join(id), listen, &args),
        None => FrontierProcess::start(&dir.join(id), &args),
    }
}

/// A cluster of two nodes under `politeness` (the site's hosts file
/// written for them), formed.
async fn two_nodes(
    site: &WideSite,
    etcd: &EtcdProcess,
    politeness: &str,
    dir: &std::path::Path,
) -> Vec<FrontierProcess> {
    write_hosts_file(site, dir);
    let nodes: Vec<FrontierProcess> = ["n1", "n2"]
        .iter()
        .map(|id| start_node(etcd, id, politeness, dir, None))
        .collect();
    for node in &nodes {
        crawl_tests::wait_for_cluster(&mut node.admin().await, 2).await;
    }
    nodes
}

/// Crawls the site to its end through a cluster of two frontier nodes
/// (real etcd) under `politeness`, two workers, one at each node; checks
/// that both nodes served.
async fn crawl_on_two_nodes(
    site: &WideSite,
    politeness: &str,
    etcd: &std::path::Path,
    dir: &std::path::Path,
) {
    let etcd = EtcdProcess::start(etcd);
    let nodes = two_nodes(site, &etcd, politeness, dir).await;
    let endpoints: Vec<String> = nodes.iter().map(FrontierProcess::endpoint).collect();
    crawl_through(site, &endpoints, dir);
    // Both nodes served: the groups' hosts were spread over the cluster.
    let progress = nodes[0].progress().await;
    assert_eq!(progress.nodes.len(), 2, "{progress:?}");
    for node in &progress.nodes {
        assert!(node.completed > 0, "{progress:?}");
    }
}

/// Each address's requests (`hosts_per_address` hosts of `pages` pages
/// and a robots.txt each) are all there, none closer than the gap.
fn assert_each_address_kept_its_gap(site: &WideSite, hosts_per_address: usize, pages: usize) {
    for (address, hits) in &site.hits_by(|host| host / hosts_per_address) {
        assert!(
            hits.len() >= hosts_per_address * (pages + 1),
            "address {address}: {hits:?}"
        );
        let close = close_gaps(hits);
        assert!(close.is_empty(), "address {address}: {close:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domains_gap_holds_across_two_frontier_nodes() {
    let Some(etcd) = crawl_tests::etcd_or_skip("a_domains_gap_holds_across_two_frontier_nodes")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Four domains of three hosts: by host, a domain's hosts would fall
    // in partitions of both nodes, each node keeping its own gap.
    let site = WideSite::start(WideConfig {
        hosts: 12,
        pages: 3,
        hosts_per_domain: 3,
        ..WideConfig::default()
    })
    .await
    .unwrap();
    crawl_on_two_nodes(&site, "domain", &etcd, dir.path()).await;
    assert_each_domain_kept_its_gap(&site, 4, 3, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_addresss_gap_holds_across_two_frontier_nodes() {
    let Some(etcd) = crawl_tests::etcd_or_skip("an_addresss_gap_holds_across_two_frontier_nodes")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Four addresses of three hosts: partitioned by host, an address's
    // hosts are led by both nodes, and one node keeps its turns.
    let site = WideSite::start(WideConfig {
        hosts: 12,
        pages: 3,
        hosts_per_address: 3,
        ..WideConfig::default()
    })
    .await
    .unwrap();
    crawl_on_two_nodes(&site, "ip", &etcd, dir.path()).await;
    assert_eq!(site.hits_by(|host| host / 3).len(), 4);
    assert_each_address_kept_its_gap(&site, 3, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_addresss_gap_holds_while_a_node_is_killed_and_restarted() {
    let Some(etcd) =
        crawl_tests::etcd_or_skip("an_addresss_gap_holds_while_a_node_is_killed_and_restarted")
    else {
        return;
    };
    let etcd = EtcdProcess::start(&etcd);
    let dir = tempfile::tempdir().unwrap();
    let site = WideSite::start(WideConfig {
        hosts: 12,
        pages: 6,
        hosts_per_address: 3,
        ..WideConfig::default()
    })
    .await
    .unwrap();
    let mut nodes = two_nodes(&site, &etcd, "ip", dir.path()).await;
    let endpoints: Vec<String> = nodes.iter().map(FrontierProcess::endpoint).collect();
    // Short leases: a restarted node waits them out before it serves or
    // grants a turn.
    let workers = seed_and_start_workers(&site, &endpoints, dir.path(), &["--lease-secs", "5"]);
    // kill -9 one node a third into the crawl, its workers fetching on,
    // and start it again where it was.
    site.answered_at_least(12 * 7 / 3).await;
    let killed = nodes.remove(1);
    let listen = killed.addr.to_string();
    killed.kill();
    let restarted = start_node(&etcd, "n2", "ip", dir.path(), Some(&listen));
    crawl_ends(&restarted.endpoint(), workers, 180);
    // A page in flight at the kill may be fetched again; never two
    // requests to an address closer than its gap.
    assert_eq!(site.hits_by(|host| host / 3).len(), 4);
    assert_each_address_kept_its_gap(&site, 3, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_at_one_address_share_its_gap_from_their_first_request() {
    let dir = tempfile::tempdir().unwrap();
    let site = WideSite::start(WideConfig {
        hosts: 6,
        pages: 4,
        hosts_per_address: 3,
        ..WideConfig::default()
    })
    .await
    .unwrap();
    crawl(&site, "ip", dir.path()).await;
    // The frontier looks each host up before its first serve, so its
    // robots.txt already takes turns with the other hosts at its address.
    let groups = site.hits_by(|host| host / 3);
    assert_eq!(groups.len(), 2);
    for (address, hits) in &groups {
        assert_eq!(hits.len(), 3 * (4 + 1), "address {address}: {hits:?}");
    }
    assert_each_address_kept_its_gap(&site, 3, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_on_one_host_pauses_its_whole_domain() {
    let dir = tempfile::tempdir().unwrap();
    let site = WideSite::start(WideConfig {
        hosts: 2,
        pages: 3,
        hosts_per_domain: 2,
        throttled: vec![0],
        retry_after_secs: 2,
        ..WideConfig::default()
    })
    .await
    .unwrap();
    let started = Instant::now();
    crawl(&site, "domain", dir.path()).await;
    let hits = site.hits();
    let refused: Vec<&WideHit> = hits.iter().filter(|hit| hit.status == 429).collect();
    assert!(!refused.is_empty(), "host 0 was throttled: {hits:?}");
    for refusal in refused {
        // Retry-After: 2 means no request to the domain before the next
        // whole second after two (the frontier blocks to the second).
        let quiet = Duration::from_secs(1);
        let during: Vec<&WideHit> = hits
            .iter()
            .filter(|hit| hit.at > refusal.at && hit.at - refusal.at < quiet)
            .collect();
        assert!(
            during.is_empty(),
            "requests within {quiet:?} of a 429 at {:?}: {during:?}",
            refusal.at - started
        );
    }
    // Both hosts were crawled whole in the end.
    let pages: usize = hits
        .iter()
        .filter(|hit| hit.status == 200 && hit.path != "/robots.txt")
        .count();
    assert_eq!(pages, 2 * 3);
}

/// The soft and hard open file limits of a process, from /proc.
fn open_file_limits(pid: u32) -> Option<(String, String)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    let mut words = line.split_whitespace().skip(3);
    Some((words.next()?.to_owned(), words.next()?.to_owned()))
}

#[test]
fn a_worker_raises_its_open_file_limit_to_the_hard_one() {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    let worker = crawl_tests::binary("worker");
    // The shell lowers its soft limit, which the worker inherits.
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -S -n 256 && exec \"$0\" --frontier http://127.0.0.1:1",
        ])
        .arg(&worker)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let expected = hard.map_or_else(|| "unlimited".to_owned(), |hard| hard.to_string());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = None;
    // The limit is raised as the worker starts, before it dials.
    while Instant::now() < deadline {
        seen = open_file_limits(pid);
        if seen.as_ref().is_some_and(|(soft, _)| *soft == expected) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        seen,
        Some((expected.clone(), expected)),
        "started with a soft limit of 256"
    );
}
