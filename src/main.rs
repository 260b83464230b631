//! `crawl`: a single-machine crawl. An embedded frontier (its store under
//! `--out`), and workers in this process calling it through the same gRPC
//! clients and handlers as distributed ones, without a socket; a progress bar (a plain line
//! off a terminal), a summary, and a clean stop on Ctrl-C that the next
//! run with the same `--out` resumes.
//! `crawl --demo` crawls the bundled mock site, offline.
//!
//! - this file: the options and the crawl's course, start to stop.
//! - `demo.rs`: the mock site for `--demo` and the check of the result.
//! - `progress.rs`: the progress bar or line, how the crawl ended, the
//!   summary.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use frontier::handback::{Handback, Returned};
use frontier::ingest::FiltersFrom;
use frontier::scope::{Rules, ScopeMode};
use frontier::service::{DEFAULT_CRAWL, Frontier, FrontierConfig, SharedFrontier};
use tokio::task::JoinSet;
use worker::crawler::{WorkerConfig, WorkerStats};

use demo::Demo;
use progress::{Ending, summarize, watch_progress};

// The crawl allocates and frees a page's buffers, links and records many
// thousand times a second across threads, where glibc's allocator spent a
// quarter of the process's CPU in a profile.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod demo;
mod progress;

#[derive(Debug, Parser)]
#[command(
    name = "crawl",
    version,
    about = "Crawl a site from one machine: an embedded frontier and workers in one process"
)]
pub struct Args {
    /// Seed URLs (their hosts are the crawl's scope by default).
    pub urls: Vec<String>,
    /// Crawl the bundled mock site instead (offline, local).
    #[arg(long)]
    pub demo: bool,
    /// Workers (each with its own lease loop).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Fetches in flight per worker.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Same-host links each worker remembers the frontier acknowledged,
    /// and does not send again (0: send every link).
    #[arg(long, default_value_t = 65_536)]
    pub seen_cache: usize,
    /// Output directory: the frontier's store, WARC files and crawl logs.
    /// Running again with the same directory resumes.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Deepest link depth followed (seeds are 0).
    #[arg(long)]
    pub max_depth: Option<u32>,
    /// Host scope: seeds, domain or any.
    #[arg(long, default_value = "seeds")]
    pub scope: ScopeMode,
    /// Milliseconds between two requests to one host (robots.txt
    /// Crawl-delay raises it).
    #[arg(long, default_value_t = 1000)]
    pub delay_ms: u64,
    /// What shares one politeness gap: host (each alone), domain (the
    /// hosts of one registrable domain) or ip (the hosts at one address).
    #[arg(long, default_value = "host")]
    pub politeness: frontier::scheduler::Politeness,
    /// Fetch private and loopback addresses (intranets; the demo sets it).
    #[arg(long)]
    pub allow_private: bool,
    /// Most body bytes read per page.
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// A page that failed transiently (5xx, timeout) is retried after
    /// this many seconds, doubling for each further try.
    #[arg(long, default_value_t = 30)]
    pub retry_base_secs: u64,
    /// Tries after the first for a page that failed transiently; then it
    /// is given up (0: one try, as `wget --tries=1`).
    #[arg(long, default_value_t = 3)]
    pub max_retries: u32,
    /// Stop after this many seconds (the crawl resumes on the next run).
    #[arg(long)]
    pub time_limit_secs: Option<u64>,
}

fn main() -> ExitCode {
    frontier::allocator::configure();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(async_threads());
    }
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(Args::parse())) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Threads for the crawl's tasks: a core each but one, which is left to the
/// store's commit threads (logging, applying, answering), busy all through
/// a crawl. On two cores a second task thread cost CPU and time
/// (BENCHMARKS.md): tasks woke each other across threads, and the threads
/// took turns on the core the commit needed.
fn async_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .saturating_sub(1)
        .max(1)
}

/// How long the stop waits for the last calls to let go of the frontier.
const HOLDERS_GRACE: Duration = Duration::from_secs(5);

async fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    let demo = match args.demo {
        true => Some(Demo::start(&mut args).await?),
        false => None,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("crawl-out"));
    if args.workers == 0 || args.concurrency == 0 {
        bail!("--workers and --concurrency must be at least 1");
    }
    let started = Instant::now();
    let (frontier, returned) = Handback::share(open_frontier(&args, &out).await?);

    // The workers call the embedded frontier through the same gRPC clients
    // and handlers distributed workers use, in process: no HTTP/2
    // connection or loopback socket between them.
    let server = frontier::server::InProcess::start(
        Arc::clone(&frontier),
        frontier::grpc::ServerOptions::open(),
    );
    let (stop_workers, workers_stop) = tokio::sync::watch::channel(false);
    let stats = Arc::new(WorkerStats::default());
    let warc_dir = out.join("warc");
    let mut workers = start_workers(&args, &server, &warc_dir, &stats, workers_stop);

    let ending = watch_progress(&frontier, &stats, started, args.time_limit_secs).await;
    let _ = stop_workers.send(true);
    while let Some(result) = workers.join_next().await {
        result??;
    }
    server.stop().await;
    let summary = summarize(&frontier, &stats, started, ending, &out)?;
    eprintln!("{summary}");
    shut_down(frontier, returned).await?;
    if let Some(demo) = demo
        && ending == Ending::Finished
    {
        return demo.check(&warc_dir);
    }
    Ok(match ending {
        Ending::Finished => ExitCode::SUCCESS,
        Ending::Interrupted | Ending::TimeLimit => ExitCode::from(130),
    })
}

/// Opens (or resumes) the crawl's frontier under `out` and stores the
/// seeds; a new crawl needs seeds.
async fn open_frontier(args: &Args, out: &Path) -> anyhow::Result<Frontier> {
    let mut config = FrontierConfig::new(out.join("frontier"));
    config.rules = Rules::new(args.scope, &[], &[], args.max_depth, 3)?;
    config.default_delay = Duration::from_millis(args.delay_ms);
    config.politeness = args.politeness;
    let frontier = tokio::task::spawn_blocking(move || Frontier::open(config))
        .await?
        .with_context(|| format!("cannot open the crawl in {}", out.display()))?;
    let resumed = frontier.counts(DEFAULT_CRAWL, "").urls > 0;
    if resumed {
        let how = match &frontier.ingest().startup().filters_from {
            FiltersFrom::Snapshots => "after a clean stop",
            FiltersFrom::Store { .. } => "after an interruption; filters rebuilt",
        };
        eprintln!("resuming the crawl in {} ({how})", out.display());
    } else if args.urls.is_empty() {
        bail!(
            "give seed URLs (or --demo); {} holds no crawl to resume",
            out.display()
        );
    }
    if args.urls.is_empty() {
        return Ok(frontier);
    }
    let urls = args.urls.clone();
    let (frontier, outcomes) = tokio::task::spawn_blocking(move || {
        let outcomes = frontier.add_seeds(DEFAULT_CRAWL, &urls);
        (frontier, outcomes)
    })
    .await?;
    for (url, outcome) in args.urls.iter().zip(outcomes?) {
        if let frontier::ingest::Outcome::Skipped(reason) = outcome
            && reason != frontier::scope::SkipReason::Duplicate
        {
            bail!("seed {url} refused: {}", reason.as_str());
        }
    }
    Ok(frontier)
}

/// The in-process workers, each with its own lease loop, until `stop`.
fn start_workers(
    args: &Args,
    server: &frontier::server::InProcess,
    warc_dir: &Path,
    stats: &Arc<WorkerStats>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> JoinSet<Result<(), worker::crawler::WorkerError>> {
    let mut workers = JoinSet::new();
    for i in 1..=args.workers {
        let mut config = WorkerConfig::new(frontier::server::IN_PROCESS_NODE);
        config.in_process = Some(server.transport());
        config.crawl = Some(DEFAULT_CRAWL.to_owned());
        config.concurrency = args.concurrency;
        config.seen_cache = args.seen_cache;
        config.output = Some(warc_dir.to_owned());
        config.worker_id = format!("w{i}");
        config.fetch.allow_private = args.allow_private;
        config.fetch.max_body_bytes = args.max_body_bytes;
        config.lease_secs = 60;
        config.retry_base = Duration::from_secs(args.retry_base_secs);
        config.max_retries = args.max_retries;
        if args.demo {
            config.retry_base = Duration::from_secs(1);
            config.fetch.max_body_bytes = 1024 * 1024;
        }
        let mut stop = stop.clone();
        let stats = Arc::clone(stats);
        workers.spawn(async move {
            worker::pipeline::run(config, stats, async move {
                let _ = stop.wait_for(|stop| *stop).await;
            })
            .await
        });
    }
    workers
}

/// The clean stop: once the server and workers have let go of the
/// frontier, its filter snapshots are written for the next run.
async fn shut_down(frontier: SharedFrontier, returned: Returned<Frontier>) -> anyhow::Result<()> {
    drop(frontier);
    let frontier = returned
        .within(HOLDERS_GRACE)
        .await
        .context("the frontier is still in use after the workers stopped")?;
    tokio::task::spawn_blocking(move || frontier.shutdown())
        .await?
        .context("clean stop failed (the store is intact; the next run rebuilds its filters)")?;
    Ok(())
}
