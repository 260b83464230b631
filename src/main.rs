//! `crawl`: a single-machine crawl. An embedded frontier (its store under
//! `--out`) served on a local port, and workers in this process speaking
//! the same gRPC API as distributed ones; a progress line, a summary, and
//! a clean stop on Ctrl-C that the next run with the same `--out` resumes.
//! `crawl --demo` crawls the bundled mock site, offline.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use frontier::ingest::FiltersFrom;
use frontier::scope::{Rules, ScopeMode};
use frontier::service::{DEFAULT_CRAWL, Frontier, FrontierConfig};
use worker::crawler::{WorkerConfig, WorkerStats};

#[derive(Debug, Parser)]
#[command(
    name = "crawl",
    version,
    about = "Crawl a site from one machine: an embedded frontier and workers in one process"
)]
struct Args {
    /// Seed URLs (their hosts are the crawl's scope by default).
    urls: Vec<String>,
    /// Crawl the bundled mock site instead (offline, local).
    #[arg(long)]
    demo: bool,
    /// Workers (each with its own lease loop).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Fetches in flight per worker.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Output directory: the frontier's store, WARC files and crawl logs.
    /// Running again with the same directory resumes.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Deepest link depth followed (seeds are 0).
    #[arg(long)]
    max_depth: Option<u32>,
    /// Host scope: seeds, domain or any.
    #[arg(long, default_value = "seeds")]
    scope: ScopeMode,
    /// Milliseconds between two requests to one host (robots.txt
    /// Crawl-delay raises it).
    #[arg(long, default_value_t = 1000)]
    delay_ms: u64,
    /// Fetch private and loopback addresses (intranets; the demo sets it).
    #[arg(long)]
    allow_private: bool,
    /// Most body bytes read per page.
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    max_body_bytes: usize,
    /// A page that failed transiently (5xx, timeout) is retried after
    /// this many seconds, doubling for each further try.
    #[arg(long, default_value_t = 30)]
    retry_base_secs: u64,
    /// Stop after this many seconds (the crawl resumes on the next run).
    #[arg(long)]
    time_limit_secs: Option<u64>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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

/// How the crawl ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Finished,
    Interrupted,
    TimeLimit,
}

async fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    let mut site = None;
    if args.demo {
        let config = crawl_tests::mock_site::SiteConfig::default();
        let mock = crawl_tests::mock_site::MockSite::start(config)
            .await
            .context("cannot start the mock site")?;
        eprintln!("demo: mock site serving on {}", mock.base());
        args.urls = vec![format!("{}/", mock.base())];
        args.allow_private = true;
        args.delay_ms = 0;
        // Deep enough that no page of the site (30 pages and the special
        // ones) can be first found beyond it; the calendar trap stops here.
        args.max_depth.get_or_insert(40);
        if args.out.is_none() {
            let dir = tempfile::Builder::new()
                .prefix("crawl-demo-")
                .tempdir()
                .context("cannot create a demo directory")?;
            args.out = Some(dir.keep());
        }
        site = Some((mock, config));
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("crawl-out"));
    if args.workers == 0 || args.concurrency == 0 {
        bail!("--workers and --concurrency must be at least 1");
    }
    let mut config = FrontierConfig::new(out.join("frontier"));
    config.rules = Rules::new(args.scope, &[], &[], args.max_depth, 3)?;
    config.default_delay_ms = args.delay_ms;
    let started = Instant::now();
    let frontier = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || Frontier::open(config))
            .await?
            .with_context(|| format!("cannot open the crawl in {}", out.display()))?
    };
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
    let frontier = Arc::new(frontier);
    if !args.urls.is_empty() {
        let urls = args.urls.clone();
        let seeding = Arc::clone(&frontier);
        let outcomes =
            tokio::task::spawn_blocking(move || seeding.add_seeds(DEFAULT_CRAWL, &urls)).await??;
        for (url, outcome) in args.urls.iter().zip(outcomes) {
            if let frontier::ingest::Outcome::Skipped(reason) = outcome
                && reason != frontier::scope::SkipReason::Duplicate
            {
                bail!("seed {url} refused: {}", reason.as_str());
            }
        }
    }

    // The workers reach the embedded frontier over gRPC on a local port,
    // exactly as distributed workers would.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(frontier::server::run(
        listener,
        Arc::clone(&frontier),
        frontier::grpc::ServerOptions::open(),
        async {
            let _ = server_stopped.await;
        },
    ));
    let (stop_workers, workers_stop) = tokio::sync::watch::channel(false);
    let stats = Arc::new(WorkerStats::default());
    let warc_dir = out.join("warc");
    let mut workers = tokio::task::JoinSet::new();
    for i in 1..=args.workers {
        let mut config = WorkerConfig::new(&endpoint);
        config.crawl = Some(DEFAULT_CRAWL.to_owned());
        config.concurrency = args.concurrency;
        config.output = Some(warc_dir.clone());
        config.worker_id = format!("w{i}");
        config.fetch.allow_private = args.allow_private;
        config.fetch.max_body_bytes = args.max_body_bytes;
        config.lease_secs = 60;
        config.retry_base = Duration::from_secs(args.retry_base_secs);
        if args.demo {
            config.retry_base = Duration::from_secs(1);
            config.fetch.max_body_bytes = 1024 * 1024;
        }
        let mut stop = workers_stop.clone();
        let stats = Arc::clone(&stats);
        workers.spawn(async move {
            worker::crawler::run(config, stats, async move {
                let _ = stop.wait_for(|stop| *stop).await;
            })
            .await
        });
    }

    let ending = watch_progress(&frontier, &stats, started, args.time_limit_secs).await;
    let _ = stop_workers.send(true);
    while let Some(result) = workers.join_next().await {
        result??;
    }
    let _ = stop_server.send(());
    server.await??;
    let summary = summarize(&frontier, &stats, started, ending, &out)?;
    eprintln!("{summary}");
    let frontier = Arc::try_unwrap(frontier)
        .map_err(|_| anyhow::anyhow!("the frontier is still in use after the workers stopped"))?;
    tokio::task::spawn_blocking(move || frontier.shutdown())
        .await?
        .context("clean stop failed (the store is intact; the next run rebuilds its filters)")?;
    if let Some((site, config)) = site
        && ending == Ending::Finished
    {
        // Checked against the configuration the site was started with.
        return Ok(check_demo(
            &site,
            &config,
            args.max_depth.unwrap_or(40),
            &warc_dir,
        ));
    }
    Ok(match ending {
        Ending::Finished => ExitCode::SUCCESS,
        Ending::Interrupted | Ending::TimeLimit => ExitCode::from(130),
    })
}

async fn watch_progress(
    frontier: &Frontier,
    stats: &WorkerStats,
    started: Instant,
    time_limit_secs: Option<u64>,
) -> Ending {
    let tty = std::io::stderr().is_terminal();
    let mut ticker = tokio::time::interval(Duration::from_millis(if tty { 250 } else { 2000 }));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let ending = loop {
        tokio::select! {
            _ = &mut ctrl_c => break Ending::Interrupted,
            _ = ticker.tick() => {}
        }
        let counts = frontier.counts(DEFAULT_CRAWL, "");
        let elapsed = started.elapsed().as_secs_f64().max(0.001);
        let done = counts.completed;
        let errors =
            stats.failures.load(Ordering::Relaxed) + stats.by_class[5].load(Ordering::Relaxed);
        let line = format!(
            "pages done {done}  queued {}  in flight {}  {:.1}/s  errors {errors}",
            counts.not_completed(),
            stats.in_flight.load(Ordering::Relaxed),
            done as f64 / elapsed,
        );
        if tty {
            eprint!("\r{line}\x1b[K");
        } else {
            eprintln!("{line}");
        }
        if counts.urls > 0 && counts.completed == counts.urls {
            break Ending::Finished;
        }
        if time_limit_secs.is_some_and(|limit| started.elapsed() >= Duration::from_secs(limit)) {
            break Ending::TimeLimit;
        }
    };
    if tty {
        eprintln!();
    }
    ending
}

fn summarize(
    frontier: &Frontier,
    stats: &WorkerStats,
    started: Instant,
    ending: Ending,
    out: &std::path::Path,
) -> anyhow::Result<String> {
    let progress = frontier.progress(DEFAULT_CRAWL)?;
    let health = frontier.filter_report();
    let total = &health.set.total;
    let (refuted, lookups) = health
        .partitions
        .iter()
        .fold((0, 0), |acc, p| (acc.0 + p.1, acc.1 + p.2));
    let class = |i: usize| stats.by_class[i].load(Ordering::Relaxed);
    let mut text = String::new();
    use std::fmt::Write;
    let _ = writeln!(
        text,
        "{} after {:.1} s",
        match ending {
            Ending::Finished => "crawl finished",
            Ending::Interrupted =>
                "crawl stopped (Ctrl-C); run again with the same --out to resume",
            Ending::TimeLimit => "time limit reached; run again with the same --out to resume",
        },
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        text,
        "  fetches: 2xx {}  3xx {}  4xx {}  5xx {}  failed {}  robots refused {}  retries {}",
        class(2),
        class(3),
        class(4),
        class(5),
        stats.failures.load(Ordering::Relaxed),
        stats.robots_refused.load(Ordering::Relaxed),
        stats.retries.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        text,
        "  bytes {}  URLs known {}  completed {}",
        stats.bytes.load(Ordering::Relaxed),
        progress.counts.urls,
        progress.counts.completed
    );
    let skipped: Vec<String> = progress
        .skipped
        .iter()
        .map(|(reason, count)| format!("{reason} {count}"))
        .collect();
    let _ = writeln!(text, "  links refused: {}", skipped.join("  "));
    let _ = writeln!(
        text,
        "  filters: {} keys in {} partitions, {} bytes, fill {:.4}, estimated FP {:.2e}, observed FP {}/{} maybes refuted, {} rebuilds",
        health.partitions.iter().map(|p| p.0).sum::<u64>(),
        health.set.partitions.len(),
        total.memory_bytes,
        total.fill_ratio,
        total.estimated_fp_rate,
        refuted,
        lookups,
        total.rebuilds
    );
    let _ = write!(text, "  output: {}", out.display());
    Ok(text)
}

/// The demo checks itself against the mock site's ground truth.
fn check_demo(
    site: &crawl_tests::mock_site::MockSite,
    config: &crawl_tests::mock_site::SiteConfig,
    max_depth: u32,
    warc_dir: &std::path::Path,
) -> ExitCode {
    let expected = crawl_tests::mock_site::expected_fetches(config, max_depth);
    let fetched: std::collections::BTreeMap<String, u32> = site
        .fetch_counts()
        .into_iter()
        .filter(|(path, _)| path != "/robots.txt" && path != "/sitemap.xml")
        .collect();
    let records = crawl_tests::read_warc_records(warc_dir)
        .into_iter()
        .filter(|(kind, ..)| kind == "response")
        .count();
    if fetched == expected {
        eprintln!(
            "demo: every page of the mock site's ground truth fetched as often as it should be ({} pages, {} fetches, {records} WARC responses); robots, nofollow, depth limit and traps obeyed",
            expected.len(),
            expected.values().sum::<u32>()
        );
        ExitCode::SUCCESS
    } else {
        let missing: Vec<_> = expected
            .iter()
            .filter(|(path, times)| fetched.get(*path) != Some(times))
            .collect();
        let extra: Vec<_> = fetched
            .keys()
            .filter(|path| !expected.contains_key(*path))
            .collect();
        eprintln!(
            "demo: the crawl differs from the ground truth: wrong counts {missing:?}, unexpected {extra:?}"
        );
        ExitCode::FAILURE
    }
}
