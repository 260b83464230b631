//! Integration tests across the workspace's crates: the real binaries over
//! real sockets, crawling the `mock-site` crate's web site.
//!
//! # Layout
//!
//! - this file: helpers the tests share: building and locating the
//!   workspace's binaries, running a `frontier serve` process on a free
//!   port, killing it (SIGKILL) or stopping it (SIGTERM), and gRPC clients.
//! - `process_items`: the URL items, PutURLs stream and stats those three
//!   share.
//! - `tests/frontier_restarts.rs`: the frontier as a real process, stopped
//!   and killed: acks survive kill -9 (during a clean stop's compaction
//!   too), completed URLs stay completed, a second server on one data
//!   directory is refused, a clean stop reuses its snapshots.
//! - `tests/frontier_api.rs`: the API as the spec says, the token, bad
//!   input, metrics. `tests/frontier_partitions.rs`: rebuilds under load,
//!   CopyPartition.
//! - `tests/store_damage.rs`: missing, emptied, shortened and corrupted
//!   store files are refused, never reset; a full disk loses nothing.
//! - `tests/conformance.rs`: the URL Frontier API, method by method.
//! - `tests/authorization.rs`: every method of both services, from their
//!   descriptors, against the token.
//! - `tests/hostile_clients.rs`, `tests/grpcio_client.rs`: the server's
//!   limits on what one client can ask for; a grpcio (C core) client.
//! - `tests/hostile_sites.rs`: the worker against sites that misbehave.
//! - `tests/crawl_end_to_end.rs`: frontier + worker processes crawling the
//!   mock site, exactly; worker and frontier kills; Crawl-delay.
//! - `tests/politeness.rs`: gaps between request starts as the site sees
//!   them, with three workers, a whole-second and a sub-second Crawl-delay
//!   on several hosts; robots.txt and the sitemap read once per host.
//! - `tests/plain_frontier.rs`: our worker against a minimal v2.6 frontier
//!   that stores URLs as given and serves none of our extensions.
//! - `tests/cluster.rs`: frontier nodes coordinated through a real etcd.
//! - `tests/cluster_moves.rs`: partitions moving as nodes join and drain.
//! - `tests/crawl_command.rs`: `crawl --demo`, stop and resume.
//! - `tests/deploy_manifests.rs`: deploy/ checked without a cluster.

pub mod process_items;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use proto::admin::admin_client::AdminClient;
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;
use tonic::transport::Channel;

/// The package that builds each binary the tests run.
fn package_of(binary: &str) -> &'static str {
    match binary {
        "frontier" => "frontier",
        "worker" => "worker",
        "mock-site" => "mock-site",
        "crawl" => "crawl",
        other => panic!("unknown binary {other}"),
    }
}

/// Path of a workspace binary, built (once per test process) with the
/// cargo running the tests, so a plain `cargo test` needs nothing else.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<std::collections::HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Benchmarks (optimised builds of this crate) measure optimised
    // binaries; tests run the debug ones they share the build with.
    let profile: &[&str] = if cfg!(debug_assertions) {
        &[]
    } else {
        &["--release"]
    };
    let output = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            package_of(name),
            "--bin",
            name,
            "--message-format=json",
        ])
        .args(profile)
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // One JSON message per line; the compiler-artifact of the binary names
    // its executable.
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .find(|path| path.file_stem().is_some_and(|stem| stem == name))
        .unwrap_or_else(|| panic!("cargo did not name the {name} executable"));
    built.insert(name.to_owned(), path.clone());
    path
}

/// How the cluster tests run workers: the mock sites' ground truth
/// assumes this body limit and these retries.
pub const CLUSTER_WORKER_ARGS: &[&str] = &[
    // Bounds the pages a killed worker or frontier leaves in flight.
    "--unacked-per-host",
    "2",
    "--concurrency",
    "4",
    "--max-body-bytes",
    "1048576",
    "--retry-base-secs",
    "1",
    "--max-retries",
    "2",
    // A restarted node serves again once the leases it handed out before
    // have run out: short leases keep the kill tests short.
    "--lease-secs",
    "10",
];

/// A `frontier serve` process on a free local port.
pub struct FrontierProcess {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its metrics URL, when it serves metrics.
    pub metrics: Option<String>,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl FrontierProcess {
    /// Starts `frontier serve --data-dir DIR --listen 127.0.0.1:0 ARGS...`
    /// and waits for the line naming its address.
    pub fn start(data_dir: &Path, args: &[&str]) -> Self {
        Self::try_start(data_dir, args)
            .unwrap_or_else(|log| panic!("frontier did not start:\n{log}"))
    }

    /// Like [`Self::start`]; on failure answers the process's log.
    pub fn try_start(data_dir: &Path, args: &[&str]) -> Result<Self, String> {
        Self::try_start_on(data_dir, "127.0.0.1:0", args, &[])
    }

    /// Starts on a given address (a restart where clients expect it).
    pub fn start_on(data_dir: &Path, listen: &str, args: &[&str]) -> Self {
        Self::try_start_on(data_dir, listen, args, &[])
            .unwrap_or_else(|log| panic!("frontier did not start:\n{log}"))
    }

    /// Like [`Self::start`], with environment variables set.
    pub fn start_with_env(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::try_start_on(data_dir, "127.0.0.1:0", args, env)
            .unwrap_or_else(|log| panic!("frontier did not start:\n{log}"))
    }

    fn try_start_on(
        data_dir: &Path,
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = data_dir
            .parent()
            .unwrap_or(data_dir)
            .join(format!("frontier-{}-{run}.log", std::process::id()));
        let mut child = Command::new(binary("frontier"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", listen])
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("frontier starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        // The first line names the address; EOF means it exited.
        let _ = reader.read_line(&mut line);
        // Whatever follows is drained, so the process never writes into a
        // closed pipe.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        match line.trim().strip_prefix("listening on ") {
            Some(rest) => Ok(Self {
                addr: rest
                    .split_whitespace()
                    .next()
                    .and_then(|a| a.parse().ok())
                    .expect("an address"),
                metrics: rest
                    .split_whitespace()
                    .skip_while(|w| *w != "metrics")
                    .nth(1)
                    .map(str::to_owned),
                child,
                log,
            }),
            None => {
                let _ = child.wait();
                Err(std::fs::read_to_string(&log).unwrap_or_default())
            }
        }
    }

    /// The gRPC endpoint.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A URL Frontier client.
    pub async fn client(&self) -> UrlFrontierClient<Channel> {
        UrlFrontierClient::connect(self.endpoint())
            .await
            .expect("frontier reachable")
    }

    /// An admin client.
    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.endpoint())
            .await
            .expect("frontier reachable")
    }

    /// The default crawl's progress (the whole cluster's, for a node of
    /// one).
    pub async fn progress(&self) -> proto::admin::Progress {
        self.admin()
            .await
            .get_progress(proto::admin::GetProgressRequest::default())
            .await
            .expect("progress")
            .into_inner()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process ID.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits; answers the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(&self.child, rustix::process::Signal::TERM);
        self.child.wait().expect("frontier exits")
    }

    /// Sends a signal (SIGSTOP and SIGCONT pause and resume it).
    pub fn signal(&self, signal: rustix::process::Signal) {
        crate::signal(&self.child, signal);
    }

    /// SIGTERM, then waits at most `limit`; `None` if it has not exited
    /// by then (it is killed when dropped).
    pub fn terminate_within(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        signal(&self.child, rustix::process::Signal::TERM);
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for FrontierProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a signal to a child process.
pub fn signal(child: &Child, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// A `worker` process.
pub struct WorkerProcess {
    child: Child,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl WorkerProcess {
    /// Starts `worker --frontier ENDPOINT --allow-private --output DIR
    /// --worker-id ID ARGS...`.
    pub fn start(frontier: &str, output: &Path, id: &str, args: &[&str]) -> Self {
        let mut all = vec!["--allow-private"];
        all.extend(args);
        Self::start_with_env(frontier, output, id, &all, &[])
    }

    /// Starts `worker --frontier ENDPOINT --output DIR --worker-id ID
    /// ARGS...` (no `--allow-private` unless in ARGS) with these
    /// environment variables added.
    pub fn start_with_env(
        frontier: &str,
        output: &Path,
        id: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        std::fs::create_dir_all(output).expect("output directory");
        let log = output.join(format!("{id}.stderr.log"));
        let child = Command::new(binary("worker"))
            .args(["--frontier", frontier, "--worker-id", id])
            .arg("--output")
            .arg(output)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("worker starts");
        Self { child, log }
    }

    /// Starts a worker as [`WorkerProcess::start`] does, serving metrics on
    /// a port of its choosing; answers it with the metrics URL it printed.
    pub fn start_with_metrics(
        frontier: &str,
        output: &Path,
        id: &str,
        args: &[&str],
    ) -> (Self, String) {
        let mut args = args.to_vec();
        args.extend(["--metrics-listen", "127.0.0.1:0"]);
        let mut worker = Self::start(frontier, output, id, &args);
        let stdout = worker.child.stdout.take().expect("piped stdout");
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        // The first line names the address; EOF means it exited.
        let _ = reader.read_line(&mut line);
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        let url = line
            .trim()
            .strip_prefix("metrics ")
            .unwrap_or_else(|| {
                panic!(
                    "the worker printed no metrics address: {line:?}\n{}",
                    std::fs::read_to_string(&worker.log).unwrap_or_default()
                )
            })
            .to_owned();
        (worker, url)
    }

    /// The process ID.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(&self.child, rustix::process::Signal::TERM);
        self.child.wait().expect("worker exits")
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits, through the frontier at `endpoint`, until the crawl is over
/// (`frontier status --wait`, at most `timeout_secs`); then stops
/// `workers`, each of which must exit cleanly.
pub fn crawl_ends(
    endpoint: &str,
    workers: impl IntoIterator<Item = WorkerProcess>,
    timeout_secs: u32,
) {
    let timeout = timeout_secs.to_string();
    let (status, text) = frontier_cli(endpoint, &["status", "--wait", "--timeout-secs", &timeout]);
    assert!(status.success(), "crawl did not finish: {text}");
    for worker in workers {
        assert!(worker.terminate().success());
    }
}

/// Runs a `frontier` client subcommand against `endpoint`; answers its
/// exit status and stdout.
pub fn frontier_cli(endpoint: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let output = Command::new(binary("frontier"))
        .args(args)
        .args(["--addr", endpoint])
        .output()
        .expect("frontier CLI runs");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// Every WARC record in the `.warc.gz` files of a directory: (WARC-Type,
/// target URI, body).
pub fn read_warc_records(dir: &Path) -> Vec<(String, String, Vec<u8>)> {
    worker::output::read_archive(dir)
        .unwrap_or_else(|e| panic!("cannot read the WARC files in {}: {e}", dir.display()))
        .into_iter()
        .map(|record| (record.kind, record.target, record.block))
        .collect()
}

/// GETs a URL over a plain TCP connection (HTTP/1.1, one request).
pub async fn http_get(url: &str) -> String {
    http_request("GET", url, &[]).await
}

/// Sends one HTTP/1.1 request with these extra header lines (`name:
/// value`) over a plain TCP connection; answers the whole response.
pub async fn http_request(method: &str, url: &str, headers: &[&str]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("content-length: 0\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

/// Sends and receives raw message bytes, so a test can put on the wire what
/// no well-behaved client would encode.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut bytes = vec![0; bytes::Buf::remaining(src)];
        bytes::Buf::copy_to_slice(src, &mut bytes);
        Ok(Some(bytes))
    }
}

/// Polls a node's own view through `admin` (so over whatever link it
/// was made with) until the partition map exists and `members` nodes are
/// alive.
pub async fn wait_for_cluster(admin: &mut AdminClient<Channel>, members: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = admin
            .get_cluster(proto::admin::GetClusterRequest {})
            .await
            .map(tonic::Response::into_inner);
        if let Ok(status) = &status
            && status.epoch > 0
            && status.nodes.iter().filter(|n| n.alive).count() == members
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster did not form: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Polls a node's own view through `admin` until every partition has
/// `copies` copies on live nodes (its leader and in-sync followers) and no
/// move is in flight; answers that view.
pub async fn wait_for_copies(
    admin: &mut AdminClient<Channel>,
    copies: usize,
    within: std::time::Duration,
) -> proto::admin::ClusterStatus {
    let deadline = std::time::Instant::now() + within;
    loop {
        let status = admin
            .get_cluster(proto::admin::GetClusterRequest {})
            .await
            .map(tonic::Response::into_inner);
        if let Ok(status) = &status {
            let alive: std::collections::BTreeSet<&str> = status
                .nodes
                .iter()
                .filter(|n| n.alive)
                .map(|n| n.id.as_str())
                .collect();
            // A cluster of one copy may list no followers at all.
            let no_followers = proto::admin::PartitionFollowers::default();
            let whole = status.owners.len() == status.partitions as usize
                && (status.followers.len() == status.partitions as usize
                    || (copies == 1 && status.followers.is_empty()))
                && status.moves.is_empty()
                && status.owners.iter().enumerate().all(|(i, owner)| {
                    let f = status.followers.get(i).unwrap_or(&no_followers);
                    alive.contains(owner.as_str())
                        && 1 + f.in_sync.len() == copies
                        && f.in_sync.iter().all(|id| alive.contains(id.as_str()))
                });
            if whole {
                return status.clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "partitions not at {copies} copies within {within:?}: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Blocks each of `hosts` (queue keys) of `crawl` for a day through
/// `client`, each block acknowledged.
pub async fn block_for_a_day<'a>(
    client: &mut UrlFrontierClient<Channel>,
    crawl: &str,
    hosts: impl IntoIterator<Item = &'a String>,
) {
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_secs()
        + 86_400;
    for host in hosts {
        client
            .block_queue_until(proto::urlfrontier::BlockQueueParams {
                key: host.clone(),
                crawl_id: crawl.to_owned(),
                time: until,
                ..proto::urlfrontier::BlockQueueParams::default()
            })
            .await
            .expect("the block is acknowledged");
    }
}

/// The `etcd` binary on PATH (Debian's `etcd-server` package), if any.
#[must_use]
pub fn etcd_binary() -> Option<PathBuf> {
    on_path(&["etcd"])
}

/// The first of these programs found on PATH.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// The etcd binary, or `None` after saying the test is skipped and why
/// (`.ci/run` installs etcd, so CI always runs these tests).
#[must_use]
pub fn etcd_or_skip(test: &str) -> Option<PathBuf> {
    let found = etcd_binary();
    if found.is_none() {
        eprintln!(
            "SKIPPED {test}: no etcd binary on PATH (Debian: apt-get install etcd-server; \
             .ci/run installs it)"
        );
    }
    found
}

/// Headless Chromium (Debian's `chromium`), or `None` after saying the
/// test is skipped and why (`.ci/run` installs it).
#[must_use]
pub fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    let found = on_path(&["chromium", "chromium-browser"]);
    if found.is_none() {
        eprintln!(
            "SKIPPED {test}: no chromium on PATH (Debian: apt-get install chromium; \
             .ci/run installs it)"
        );
    }
    found
}

/// The DOM of `url` after its scripts ran (headless Chromium, up to five
/// seconds of page time).
#[must_use]
pub fn rendered_dom(chromium: &Path, url: &str) -> String {
    let output = Command::new(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A throwaway single-member etcd on loopback.
pub struct EtcdProcess {
    child: Child,
    /// Its client endpoint (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    binary: PathBuf,
    peer_url: String,
    dir: tempfile::TempDir,
}

impl EtcdProcess {
    /// Starts etcd and waits until it serves clients. etcd cannot take a
    /// listener from its parent, so its ports are found free first and a
    /// start that loses one of them to another process is tried again.
    pub fn start(binary: &Path) -> Self {
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("etcd dir");
            let (client, peer) = (free_port(), free_port());
            let endpoint = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            match Self::spawn(binary, dir.path(), &endpoint, &peer_url) {
                Ok(child) => {
                    return Self {
                        child,
                        endpoint,
                        binary: binary.to_owned(),
                        peer_url,
                        dir,
                    };
                }
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not start:\n{last_log}");
    }

    /// Runs etcd on `dir` and waits until it serves; on failure answers its
    /// log.
    fn spawn(binary: &Path, dir: &Path, endpoint: &str, peer_url: &str) -> Result<Child, String> {
        let child = Self::launch(
            binary,
            dir,
            "test",
            (endpoint, peer_url),
            &format!("test={peer_url}"),
        );
        Self::ready(child, dir)
    }

    /// Runs etcd member `name` on `dir` with its client and peer URLs, in
    /// a cluster of `initial_cluster` (etcd's `name=peer,...`).
    fn launch(
        binary: &Path,
        dir: &Path,
        name: &str,
        (endpoint, peer_url): (&str, &str),
        initial_cluster: &str,
    ) -> Child {
        Command::new(binary)
            .args(["--name", name, "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", endpoint])
            .args(["--advertise-client-urls", endpoint])
            .args(["--listen-peer-urls", peer_url])
            .args(["--initial-advertise-peer-urls", peer_url])
            .args(["--initial-cluster", initial_cluster])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log")).expect("etcd log"))
            .spawn()
            .expect("etcd starts")
    }

    /// Waits until the etcd launched on `dir` serves; on failure kills it
    /// and answers its log.
    fn ready(mut child: Child, dir: &Path) -> Result<Child, String> {
        let log = dir.join("etcd.log");
        // etcd says when it serves; its log is the only signal it gives.
        let ready = (0..600).any(|_| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("ready to serve client requests") {
                return true;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            false
        });
        if ready && child.try_wait().ok().flatten().is_none() {
            return Ok(child);
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(std::fs::read_to_string(&log).unwrap_or_default())
    }

    /// SIGKILL, then etcd again on the same data and ports: it holds what it
    /// had committed.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut last_log = String::new();
        // A port taken meanwhile by another process is waited out.
        for _ in 0..20 {
            match Self::spawn(
                &self.binary,
                self.dir.path(),
                &self.endpoint,
                &self.peer_url,
            ) {
                Ok(child) => {
                    self.child = child;
                    return;
                }
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not start again:\n{last_log}");
    }

    /// SIGKILL.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The value of one key, through etcd's JSON gateway (what an operator
    /// with access to etcd can read), or `None` when it has none.
    pub async fn get(&self, key: &str) -> Option<Vec<u8>> {
        use data_encoding::BASE64;
        let body = serde_json::json!({ "key": BASE64.encode(key.as_bytes()) });
        let json = etcd_gateway(&self.endpoint, "/v3/kv/range", &body).await;
        let value = json["kvs"][0]["value"].as_str()?;
        Some(BASE64.decode(value.as_bytes()).expect("base64"))
    }
}

/// A loopback port free now, for a server that cannot take a listener
/// (etcd): a start that loses it to another process is tried again.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One call of etcd's JSON gateway at `endpoint` (`http://HOST:PORT`).
async fn etcd_gateway(endpoint: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = endpoint.strip_prefix("http://").expect("http");
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("etcd");
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("etcd");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("etcd");
    let json = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(json).expect(&text)
}

/// A throwaway etcd of several members on loopback, as deployments run it.
pub struct EtcdCluster {
    /// Every member's client endpoint, comma-separated, as `--etcd` takes
    /// them.
    pub endpoint: String,
    /// Each member's process (`None` once killed) and client endpoint.
    members: Vec<(Option<Child>, String)>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `size` members and waits until each serves (which takes a
    /// quorum). Ports are found free first, as for [`EtcdProcess`], and a
    /// start that loses one is tried again.
    pub fn start(binary: &Path, size: usize) -> Self {
        let mut last_log = String::new();
        'attempt: for _ in 0..5 {
            let dir = tempfile::tempdir().expect("etcd dir");
            let urls: Vec<(String, String)> = (0..size)
                .map(|_| {
                    (
                        format!("http://127.0.0.1:{}", free_port()),
                        format!("http://127.0.0.1:{}", free_port()),
                    )
                })
                .collect();
            let initial = urls
                .iter()
                .enumerate()
                .map(|(i, (_, peer))| format!("m{i}={peer}"))
                .collect::<Vec<_>>()
                .join(",");
            let launched: Vec<(Child, PathBuf)> = urls
                .iter()
                .enumerate()
                .map(|(i, (client, peer))| {
                    let member_dir = dir.path().join(format!("m{i}"));
                    std::fs::create_dir_all(&member_dir).expect("a member's directory");
                    let child = EtcdProcess::launch(
                        binary,
                        &member_dir,
                        &format!("m{i}"),
                        (client, peer),
                        &initial,
                    );
                    (child, member_dir)
                })
                .collect();
            let mut members = Vec::new();
            let mut failed = false;
            for ((child, member_dir), (client, _)) in launched.into_iter().zip(&urls) {
                if failed {
                    let mut child = child;
                    let _ = child.kill();
                    let _ = child.wait();
                    continue;
                }
                match EtcdProcess::ready(child, &member_dir) {
                    Ok(child) => members.push((Some(child), client.clone())),
                    Err(log) => {
                        last_log = log;
                        failed = true;
                    }
                }
            }
            if failed {
                for (child, _) in &mut members {
                    if let Some(child) = child {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
                continue 'attempt;
            }
            let endpoint = urls
                .iter()
                .map(|(client, _)| client.as_str())
                .collect::<Vec<_>>()
                .join(",");
            return Self {
                endpoint,
                members,
                _dir: dir,
            };
        }
        panic!("etcd did not start:\n{last_log}");
    }

    /// The member that leads the etcd cluster now, by index, as the
    /// members that run report it.
    pub async fn leader(&self) -> usize {
        for (i, (child, endpoint)) in self.members.iter().enumerate() {
            if child.is_none() {
                continue;
            }
            let status =
                etcd_gateway(endpoint, "/v3/maintenance/status", &serde_json::json!({})).await;
            if status["leader"].is_string() && status["leader"] == status["header"]["member_id"] {
                return i;
            }
        }
        panic!("no etcd member leads");
    }

    /// SIGKILL of one member.
    pub fn kill_member(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for (child, _) in &mut self.members {
            if let Some(child) = child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
