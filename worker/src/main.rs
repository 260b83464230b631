//! `worker`: leases URLs from a URL Frontier server and crawls them.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use worker::crawler::{WorkerConfig, WorkerStats, default_user_agent};
use worker::pipeline::run;

#[derive(Debug, Parser)]
#[command(
    name = "worker",
    version,
    about = "Crawl worker for a URL Frontier v2.6 server"
)]
struct Args {
    /// The frontier's gRPC address.
    #[arg(long, env = "WORKER_FRONTIER", default_value = "http://127.0.0.1:7071")]
    frontier: String,
    /// Lease from this crawl only (default: any crawl).
    #[arg(long, env = "WORKER_CRAWL")]
    crawl: Option<String>,
    /// The frontier's token, sent on every call (for a frontier started
    /// with --token-for-all).
    #[arg(long, env = "WORKER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM CA certificate the frontier's certificate is checked against,
    /// for an `https://` --frontier (default: the public web's roots).
    #[arg(long, env = "WORKER_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// PEM certificate this worker shows a frontier that asks for one
    /// (mutual TLS); with --tls-key.
    #[arg(long, env = "WORKER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "WORKER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Most fetches in flight.
    #[arg(long, env = "WORKER_CONCURRENCY", default_value_t = 256)]
    concurrency: usize,
    /// Most URLs of one host in flight.
    #[arg(long, env = "WORKER_PER_HOST", default_value_t = 1)]
    per_host: u32,
    /// Most pages of one host fetched (or being fetched) and not yet
    /// acknowledged by the frontier, per --per-host: their reports travel
    /// while the next pages are fetched. A worker killed mid-crawl leaves
    /// at most this many per host to be fetched again. It covers the
    /// frontier's two commits per page (outlinks, then the report) at
    /// the rate one host answers on loopback; fewer make the fetches wait.
    #[arg(long, env = "WORKER_UNACKED_PER_HOST", default_value_t = 16)]
    unacked_per_host: u32,
    /// Most hosts (queues) held at once, each with its leased URLs fetched
    /// within its politeness. Unset, the worker holds as many as keep its
    /// `--concurrency` fetch slots busy: a host at a polite delay needs a
    /// slot only a small part of the time.
    #[arg(long, env = "WORKER_MAX_QUEUES")]
    max_queues: Option<usize>,
    /// URLs of one host asked for per lease (the frontier gives no more
    /// than the lease has room for at the host's delay). A host's next
    /// lease waits for the last report of the one before, so a fast host
    /// pauses once per lease.
    #[arg(long, env = "WORKER_LEASE_PER_QUEUE", default_value_t = 1024)]
    lease_per_queue: u32,
    /// Links the seen cache holds: links the frontier already acknowledged
    /// are not sent again (0: send every link).
    #[arg(long, env = "WORKER_SEEN_CACHE", default_value_t = 65_536)]
    seen_cache: usize,
    /// Lease length asked of the frontier, seconds. A restarted frontier
    /// serves again once the leases it handed out have run out, so this is
    /// also the longest pause a frontier restart causes.
    #[arg(long, env = "WORKER_LEASE_SECS", default_value_t = 60)]
    lease_secs: u32,
    /// Directory for WARC files and the crawl log.
    #[arg(long, env = "WORKER_OUTPUT")]
    output: Option<PathBuf>,
    /// Names this worker's output files (default: worker-PID).
    #[arg(long, env = "WORKER_ID")]
    worker_id: Option<String>,
    /// User-Agent header; its first word is the robots.txt token.
    #[arg(long, env = "WORKER_USER_AGENT")]
    user_agent: Option<String>,
    /// Connect and total timeout per fetch, seconds.
    #[arg(long, env = "WORKER_TIMEOUT_SECS", default_value_t = 30)]
    timeout_secs: u64,
    /// Most body bytes read per page (the rest is dropped, the page marked
    /// truncated).
    #[arg(long, env = "WORKER_MAX_BODY_BYTES", default_value_t = 10 * 1024 * 1024)]
    max_body_bytes: usize,
    /// MiB of response bodies all fetches hold at once (pages and sitemaps
    /// until they are written and parsed); a body that finds no room is
    /// cut and marked truncated.
    #[arg(long, env = "WORKER_MAX_INFLIGHT_MB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_inflight_mb: u64,
    /// Transient failures retried this many times.
    #[arg(long, env = "WORKER_MAX_RETRIES", default_value_t = 3)]
    max_retries: u32,
    /// First retry after this many seconds, doubling after.
    #[arg(long, env = "WORKER_RETRY_BASE_SECS", default_value_t = 30)]
    retry_base_secs: u64,
    /// Cap on a robots.txt Crawl-delay, seconds.
    #[arg(long, env = "WORKER_MAX_CRAWL_DELAY", default_value_t = 30)]
    max_crawl_delay: u32,
    /// Fetch private, loopback and link-local addresses (tests, demos,
    /// intranets).
    #[arg(long, env = "WORKER_ALLOW_PRIVATE")]
    allow_private: bool,
    /// Fetch through this proxy (http://, https:// or socks5://). Without
    /// it HTTP_PROXY and the like are ignored; with it the SSRF guard still
    /// checks every target's addresses before the request goes out.
    #[arg(long, env = "WORKER_PROXY")]
    proxy: Option<String>,
    /// Resolve the names in this hosts(5) file to its addresses before
    /// DNS (hosts DNS does not know, or addresses the operator fixes);
    /// the SSRF guard still checks them. Not used through `--proxy`.
    #[arg(long, env = "WORKER_HOSTS_FILE")]
    hosts_file: Option<PathBuf>,
    /// Most redirects followed in a row (each target is a new URL for the
    /// frontier; the chain's length travels in its metadata).
    #[arg(long, env = "WORKER_MAX_REDIRECTS", default_value_t = 10)]
    max_redirects: u32,
    /// Follow nofollow links and pages.
    #[arg(long, env = "WORKER_IGNORE_NOFOLLOW")]
    ignore_nofollow: bool,
    /// Most links taken per page.
    #[arg(long, env = "WORKER_MAX_OUTLINKS", default_value_t = 5000)]
    max_outlinks: usize,
    /// WARC files rotate past this many bytes.
    #[arg(long, env = "WORKER_WARC_MAX_BYTES", default_value_t = 1 << 30)]
    warc_max_bytes: u64,
    /// Seconds in-flight fetches get to finish on SIGINT/SIGTERM.
    #[arg(long, env = "WORKER_SHUTDOWN_SECS", default_value_t = 10)]
    shutdown_secs: u64,
    /// Serve Prometheus metrics on this address (`GET /metrics`): fetches
    /// by status class, bytes, fetch latency, fetches in flight, robots.txt
    /// cache hits, report retries.
    #[arg(long, env = "WORKER_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Links deeper than this (hops from a seed) are not sent: for a
    /// frontier without a depth limit of its own (ours has --max-depth).
    #[arg(long, env = "WORKER_MAX_DEPTH")]
    max_depth: Option<u32>,
    /// Do not read sitemaps.
    #[arg(long, env = "WORKER_NO_SITEMAPS")]
    no_sitemaps: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match main_result() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard one: a worker holds a
/// connection to each host it fetches from, idle ones pooled, and a wide
/// crawl holds thousands of hosts, past the usual soft limit of 1,024.
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return;
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::debug!(to = ?limit.maximum, "open file limit raised"),
        Err(error) => tracing::warn!(%error, "cannot raise the open file limit"),
    }
}

fn main_result() -> anyhow::Result<()> {
    let args = Args::parse();
    raise_open_file_limit();
    let mut config = WorkerConfig::new(&args.frontier);
    config.crawl = args.crawl;
    config.token = args.token;
    config.tls = proto::tls::ClientTls::from_files(
        args.tls_ca.as_deref(),
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
    )?;
    config.concurrency = args.concurrency;
    config.per_host = args.per_host;
    config.unacked_per_host = args.unacked_per_host;
    config.max_queues = args.max_queues;
    config.lease_per_queue = args.lease_per_queue;
    config.seen_cache = args.seen_cache;
    config.lease_secs = args.lease_secs;
    config.output = args.output;
    if let Some(id) = args.worker_id {
        config.worker_id = id;
    }
    config.fetch.user_agent = args.user_agent.unwrap_or_else(default_user_agent);
    config.fetch.timeout = Duration::from_secs(args.timeout_secs.max(1));
    config.fetch.max_body_bytes = args.max_body_bytes;
    config.fetch.max_inflight_bytes =
        usize::try_from(args.max_inflight_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    config.fetch.allow_private = args.allow_private;
    config.fetch.proxy = args.proxy;
    if let Some(path) = &args.hosts_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --hosts-file {}", path.display()))?;
        let pinned = worker::pinned::PinnedNames::parse(&text)
            .with_context(|| format!("--hosts-file {}", path.display()))?;
        config.fetch.pinned = Arc::new(pinned);
    }
    config.max_redirects = args.max_redirects;
    config.max_retries = args.max_retries;
    config.retry_base = Duration::from_secs(args.retry_base_secs);
    config.max_crawl_delay_secs = args.max_crawl_delay;
    config.links.ignore_nofollow = args.ignore_nofollow;
    config.links.max_outlinks = args.max_outlinks;
    config.warc_max_bytes = args.warc_max_bytes;
    config.shutdown_grace = Duration::from_secs(args.shutdown_secs);
    config.sitemaps = !args.no_sitemaps;
    config.max_depth = args.max_depth;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let metrics_listen = args.metrics_listen;
    runtime.block_on(async move {
        if let Some(address) = metrics_listen {
            let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .context("cannot install the metrics recorder")?;
            describe_metrics();
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot serve metrics on {address}"))?;
            let bound = listener.local_addr()?;
            tokio::spawn(proto::metrics_endpoint::serve(
                listener,
                move || handle.render(),
                std::future::pending(),
            ));
            // Scripts and tests read the chosen address (port 0 works) here.
            println!("metrics http://{bound}/metrics");
        }
        tracing::info!(frontier = %config.frontier, worker = %config.worker_id, "worker starting");
        run(config, Arc::new(WorkerStats::default()), shutdown_signal()).await?;
        tracing::info!("worker stopped");
        Ok(())
    })
}

fn describe_metrics() {
    metrics::describe_counter!(
        "worker_fetches_total",
        "Fetches by status class (failed: no answer)"
    );
    metrics::describe_counter!("worker_bytes_total", "Body bytes read");
    metrics::describe_histogram!(
        "worker_fetch_seconds",
        "Time of one fetch, to the end of its body"
    );
    metrics::describe_gauge!("worker_in_flight", "URLs being processed now");
    metrics::describe_counter!(
        "worker_robots_lookups_total",
        "robots.txt lookups: cached or fetched"
    );
    metrics::describe_counter!(
        "worker_report_retries_total",
        "Reports to the frontier sent again, by call (PutURLs, PutDiscovered)"
    );
    metrics::describe_counter!(
        "worker_bodies_cut_for_memory_total",
        "Bodies cut short because the in-flight budget was spent"
    );
    // Shown at zero from the start (see the frontier's metrics): rare
    // events otherwise have no series until they first happen.
    for call in ["PutURLs", "PutDiscovered"] {
        metrics::counter!("worker_report_retries_total", "call" => call).increment(0);
    }
    metrics::counter!("worker_bodies_cut_for_memory_total").increment(0);
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutdown signal received");
}
