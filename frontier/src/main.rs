//! `frontier`: `serve` runs the service; the other subcommands are an
//! operator's client of a running one (seeding, progress, filter health,
//! rebuilds, URL checks, pause and resume).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use frontier::ingest::{DedupMode, FilterConfig, FiltersFrom};
use frontier::scope::{Rules, ScopeMode};
use frontier::service::{Frontier, FrontierConfig};
use proto::admin::admin_client::AdminClient;
use proto::bearer::Bearer;
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;
use tonic::transport::Channel;

mod cli;

#[derive(Debug, Parser)]
#[command(
    name = "frontier",
    version,
    about = "The crawl frontier service and its admin client"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the frontier service.
    Serve(Box<ServeArgs>),
    /// Seed a crawl: store the URLs and make their hosts the crawl's scope.
    Seed {
        #[command(flatten)]
        client: ClientArgs,
        /// Seed URLs.
        urls: Vec<String>,
        /// A file with one seed URL per line (# starts a comment).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Show a crawl's progress; with --wait, until it is finished.
    Status {
        #[command(flatten)]
        client: ClientArgs,
        /// Wait until every URL of the crawl is completed.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (exit code 2).
        #[arg(long)]
        timeout_secs: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show filter health per partition and in total.
    Health {
        #[command(flatten)]
        client: ClientArgs,
        /// Every partition, not only the total.
        #[arg(long)]
        partitions: bool,
        /// Print JSON (always every partition).
        #[arg(long)]
        json: bool,
    },
    /// Rebuild one partition's filter, or all of them.
    Rebuild {
        #[command(flatten)]
        client: ClientArgs,
        /// Only this partition.
        #[arg(long)]
        partition: Option<u32>,
        /// Answer at once instead of when the rebuilds are done.
        #[arg(long)]
        no_wait: bool,
    },
    /// What ingest makes of a URL and what the store holds for it.
    Check {
        #[command(flatten)]
        client: ClientArgs,
        /// The URL.
        url: String,
    },
    /// Stop serving URLs (puts are still taken).
    Pause {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Serve URLs again.
    Resume {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Write a crawl's URLs as JSON lines, one URL item per line in the
    /// proto3 JSON form of the API's URLItem (completed ones first).
    Export {
        #[command(flatten)]
        client: ClientArgs,
        /// Write here instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Read URL items written by `export` and put them (as known items, so
    /// their state comes along) into a frontier's crawl. Every line is
    /// checked before anything is sent.
    Import {
        #[command(flatten)]
        client: ClientArgs,
        /// Put every URL into the crawl named by --crawl instead of the
        /// crawl each line names.
        #[arg(long)]
        into_crawl: bool,
        /// The file (`-`: stdin).
        file: PathBuf,
    },
    /// Read every file and record of a store (not running) and report
    /// whether it opens with nothing lost (exit 0) or what is damaged
    /// (exit 1). Changes nothing.
    Verify {
        /// The store's data directory.
        #[arg(long, env = "FRONTIER_DATA_DIR")]
        data_dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy whatever can be read of a damaged store into a new store in an
    /// empty directory (exit 1 when something could not be read). The
    /// damaged store is left as it is.
    Salvage {
        /// The damaged store's data directory.
        #[arg(long, env = "FRONTIER_DATA_DIR")]
        data_dir: PathBuf,
        /// An empty directory for the new store.
        #[arg(long)]
        into: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask the standard gRPC health service whether the frontier serves
    /// (exit 0) or not (exit 1): a container health check.
    Probe {
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, clap::Args)]
struct ClientArgs {
    /// The frontier's address.
    #[arg(long, env = "FRONTIER_ADDR", default_value = "http://127.0.0.1:7071")]
    addr: String,
    /// The crawl (empty: DEFAULT).
    #[arg(long, env = "FRONTIER_CRAWL", default_value = "")]
    crawl: String,
    /// The admin token, for calls that change the frontier.
    #[arg(long, env = "FRONTIER_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

type Intercepted = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

impl ClientArgs {
    async fn channel(&self) -> anyhow::Result<(Channel, Bearer)> {
        let bearer = Bearer::new(self.token.as_deref()).context("--token")?;
        Ok((connect(&self.addr).await?, bearer))
    }

    async fn admin(&self) -> anyhow::Result<AdminClient<Intercepted>> {
        let (channel, bearer) = self.channel().await?;
        Ok(AdminClient::with_interceptor(channel, bearer))
    }

    async fn frontier(&self) -> anyhow::Result<UrlFrontierClient<Intercepted>> {
        let (channel, bearer) = self.channel().await?;
        Ok(UrlFrontierClient::with_interceptor(channel, bearer))
    }
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Directory of the store and filter snapshots.
    #[arg(long, env = "FRONTIER_DATA_DIR")]
    data_dir: PathBuf,
    /// Address to listen on (port 0: any free port; the chosen address is
    /// printed).
    #[arg(long, env = "FRONTIER_LISTEN", default_value = "127.0.0.1:7071")]
    listen: SocketAddr,
    /// Filter partitions (fixed when the store is created).
    #[arg(long, env = "FRONTIER_PARTITIONS", default_value_t = 64)]
    partitions: usize,
    /// URLs the filters are sized for at first, over all partitions; a
    /// partition past --rebuild-fill is rebuilt larger.
    #[arg(long, env = "FRONTIER_EXPECTED_URLS", default_value_t = 1_000_000)]
    expected_urls: u64,
    /// Target false-positive rate of the filters.
    #[arg(long, env = "FRONTIER_FP_RATE", default_value_t = 0.001)]
    fp_rate: f64,
    /// Filter layout: standard, blocked, split-block or split-block-256.
    #[arg(long, env = "FRONTIER_LAYOUT", default_value = "standard")]
    layout: String,
    /// exact: the store confirms a filter "maybe"; bloom: a "maybe" is a
    /// duplicate.
    #[arg(long, env = "FRONTIER_DEDUP", default_value = "exact")]
    dedup: String,
    /// Fill ratio past which a partition's filter is rebuilt larger.
    #[arg(long, env = "FRONTIER_REBUILD_FILL", default_value_t = 0.5)]
    rebuild_fill: f64,
    /// Longest URL accepted, in bytes.
    #[arg(long, env = "FRONTIER_MAX_URL_LENGTH", default_value_t = 2048)]
    max_url_length: usize,
    /// Host scope: seeds, domain or any.
    #[arg(long, env = "FRONTIER_SCOPE", default_value = "seeds")]
    scope: ScopeMode,
    /// Regexes a URL must match one of (repeatable).
    #[arg(long, env = "FRONTIER_INCLUDE", value_delimiter = ',')]
    include: Vec<String>,
    /// Regexes a URL must match none of (repeatable).
    #[arg(long, env = "FRONTIER_EXCLUDE", value_delimiter = ',')]
    exclude: Vec<String>,
    /// Deepest link depth taken (seeds are 0).
    #[arg(long, env = "FRONTIER_MAX_DEPTH")]
    max_depth: Option<u32>,
    /// Most times one path segment may repeat (a crawler-trap guard).
    #[arg(long, env = "FRONTIER_MAX_PATH_REPEAT", default_value_t = 3)]
    max_path_repeat: usize,
    /// Lease length when a GetURLs call gives none, in seconds.
    #[arg(long, env = "FRONTIER_LEASE_SECS", default_value_t = 30)]
    lease_secs: u32,
    /// Most bytes of metadata one URL may carry (keys and values); an item
    /// with more is answered SKIPPED.
    #[arg(long, env = "FRONTIER_MAX_METADATA_BYTES", default_value_t = frontier::ingest::DEFAULT_MAX_METADATA_BYTES)]
    max_metadata_bytes: usize,
    /// Longest lease a GetURLs call gets, in seconds, whatever it asks for.
    #[arg(long, env = "FRONTIER_MAX_LEASE_SECS", default_value_t = frontier::service::DEFAULT_MAX_LEASE_SECS)]
    max_lease_secs: u32,
    /// Most URLs one GetURLs call hands out (the API's 0 limits mean "no
    /// limit"; a call still never leases more than this).
    #[arg(long, env = "FRONTIER_MAX_URLS_PER_GET", default_value_t = frontier::service::DEFAULT_MAX_URLS_PER_GET, value_parser = clap::value_parser!(u32).range(1..))]
    max_urls_per_get: u32,
    /// Connections served at once; one more is closed as it arrives.
    #[arg(long, env = "FRONTIER_MAX_CONNECTIONS", default_value_t = frontier::server::MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// The address other nodes and clients reach this one by (ListNodes;
    /// default: the listening address).
    #[arg(long, env = "FRONTIER_ADVERTISE")]
    advertise: Option<String>,
    /// Serve Prometheus metrics on this address (`GET /metrics`).
    #[arg(long, env = "FRONTIER_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// When set, calls that change the frontier (other than the data
    /// plane: GetURLs, PutURLs, PutDiscovered) need `authorization: Bearer
    /// TOKEN`.
    #[arg(long, env = "FRONTIER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Every call of the URL Frontier and admin services needs the admin
    /// token, reads and the data plane too (health and reflection stay
    /// open); workers then need `--token`.
    #[arg(long, env = "FRONTIER_TOKEN_FOR_ALL")]
    token_for_all: bool,
    /// Milliseconds between two serves of one queue, unless SetDelay set
    /// the queue's or the crawl's own.
    #[arg(long, env = "FRONTIER_DEFAULT_DELAY_MS", default_value_t = 1000)]
    default_delay_ms: u64,
    /// MiB of memory for the store's page cache (redb). Pages beyond it are
    /// read through the OS page cache: less memory, slower ingest once the
    /// store outgrows it.
    #[arg(long, env = "FRONTIER_CACHE_MB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    cache_mb: u64,
    /// MiB that must stay free on the data directory's disk: below it
    /// writes are refused (RESOURCE_EXHAUSTED, health NOT_SERVING) and
    /// resume by themselves once there is room.
    #[arg(long, env = "FRONTIER_MIN_FREE_MB", default_value_t = 256)]
    min_free_mb: u64,
}

fn main() -> ExitCode {
    let log_control = init_logging();
    match run(log_control) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logging to stderr, `RUST_LOG` levels (default info), changeable at run
/// time through SetLogLevel.
fn init_logging() -> frontier::grpc::LogControl {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .init();
    Arc::new(move |module: &str, level: &str| {
        let directive = if module.is_empty() {
            level.to_owned()
        } else {
            format!("{module}={level}")
        };
        let directive = directive
            .parse::<tracing_subscriber::filter::Directive>()
            .map_err(|e| format!("{module:?} is not a module path: {e}"))?;
        handle
            .modify(|filter| {
                let current = std::mem::replace(filter, tracing_subscriber::EnvFilter::new(""));
                *filter = current.add_directive(directive);
            })
            .map_err(|e| e.to_string())
    })
}

fn run(log_control: frontier::grpc::LogControl) -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // The repair tools read files; they need no runtime.
    match &cli.command {
        Command::Verify { data_dir, json } => return cli::repair::verify(data_dir, *json),
        Command::Salvage {
            data_dir,
            into,
            json,
        } => return cli::repair::salvage(data_dir, into, *json),
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve(*args, log_control).await,
            Command::Seed { client, urls, file } => seed(client, urls, file).await,
            Command::Status {
                client,
                wait,
                timeout_secs,
                json,
            } => status(client, wait, timeout_secs, json).await,
            Command::Health {
                client,
                partitions,
                json,
            } => health(client, partitions, json).await,
            Command::Rebuild {
                client,
                partition,
                no_wait,
            } => rebuild(client, partition, no_wait).await,
            Command::Check { client, url } => check(client, url).await,
            Command::Pause { client } => set_active(client, false).await,
            Command::Resume { client } => set_active(client, true).await,
            Command::Probe { client } => probe(client).await,
            Command::Export { client, output } => cli::transfer::export(client, output).await,
            Command::Import {
                client,
                into_crawl,
                file,
            } => cli::transfer::import(client, into_crawl, file).await,
            Command::Verify { .. } | Command::Salvage { .. } => {
                unreachable!("answered before the runtime started")
            }
        }
    })
}

fn config_of(args: &ServeArgs) -> anyhow::Result<FrontierConfig> {
    let layout: bloom_core::Layout = args
        .layout
        .parse()
        .with_context(|| format!("--layout {:?}", args.layout))?;
    let dedup = match args.dedup.as_str() {
        "exact" => DedupMode::Exact,
        "bloom" => DedupMode::Bloom,
        other => bail!("--dedup must be exact or bloom, not {other:?}"),
    };
    if !(args.fp_rate > 0.0 && args.fp_rate < 1.0) {
        bail!("--fp-rate must be between 0 and 1, not {}", args.fp_rate);
    }
    if !(args.rebuild_fill > 0.0 && args.rebuild_fill < 1.0) {
        bail!(
            "--rebuild-fill must be between 0 and 1, not {}",
            args.rebuild_fill
        );
    }
    if args.partitions == 0 {
        bail!("--partitions must be at least 1");
    }
    let rules = Rules::new(
        args.scope,
        &args.include,
        &args.exclude,
        args.max_depth,
        args.max_path_repeat,
    )?;
    Ok(FrontierConfig {
        data_dir: args.data_dir.clone(),
        filters: FilterConfig {
            partitions: args.partitions,
            expected_urls_per_partition: (args.expected_urls / args.partitions as u64).max(1),
            fp_rate: args.fp_rate,
            layout,
        },
        dedup,
        max_url_length: args.max_url_length,
        max_metadata_bytes: args.max_metadata_bytes,
        rules,
        rebuild_fill_threshold: args.rebuild_fill,
        default_lease_secs: args.lease_secs.max(1),
        max_lease_secs: args.max_lease_secs.max(1),
        max_urls_per_get: args.max_urls_per_get,
        default_delay_ms: args.default_delay_ms,
        cache_bytes: usize::try_from(args.cache_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        min_free_bytes: args.min_free_mb.saturating_mul(1 << 20),
    })
}

async fn serve(
    args: ServeArgs,
    log_control: frontier::grpc::LogControl,
) -> anyhow::Result<ExitCode> {
    let config = config_of(&args)?;
    let started = Instant::now();
    let frontier = tokio::task::spawn_blocking(move || Frontier::open(config))
        .await?
        .with_context(|| format!("cannot open the frontier in {}", args.data_dir.display()))?;
    match &frontier.ingest().startup().filters_from {
        FiltersFrom::Snapshots => tracing::info!("filters loaded from snapshots"),
        FiltersFrom::Store { keys, reason } => {
            tracing::info!(keys, reason = %reason, "filters rebuilt from the store");
        }
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(
        %address,
        startup_ms = started.elapsed().as_millis() as u64,
        data_dir = %args.data_dir.display(),
        "frontier listening"
    );
    let frontier = Arc::new(frontier);
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut metrics_task = None;
    let mut metrics_note = String::new();
    if let Some(metrics_address) = args.metrics_listen {
        let handle = frontier::metrics::install()
            .ok_or_else(|| anyhow::anyhow!("cannot install the metrics recorder"))?;
        let metrics_listener = tokio::net::TcpListener::bind(metrics_address)
            .await
            .with_context(|| format!("cannot listen on {metrics_address} for metrics"))?;
        let bound = metrics_listener.local_addr()?;
        metrics_note = format!(" metrics http://{bound}/metrics");
        metrics_task = Some(tokio::spawn(frontier::metrics::serve(
            metrics_listener,
            handle,
            Arc::clone(&frontier),
            async {
                let _ = metrics_stopped.await;
            },
        )));
    }
    // Scripts and tests read the chosen addresses from this line.
    println!("listening on {address}{metrics_note}");
    let access = match &args.admin_token {
        Some(token) if token.is_empty() => bail!("--admin-token must not be empty"),
        Some(token) => frontier::auth::Access::token(
            token,
            if args.token_for_all {
                frontier::auth::TokenScope::All
            } else {
                frontier::auth::TokenScope::Control
            },
        ),
        None if args.token_for_all => bail!("--token-for-all needs --admin-token"),
        None => frontier::auth::Access::open(),
    };
    let options = frontier::grpc::ServerOptions {
        access,
        node: args.advertise.clone().unwrap_or_default(),
        log_control: Some(log_control),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
    };
    frontier::server::run(listener, Arc::clone(&frontier), options, shutdown_signal()).await?;
    let _ = stop_metrics.send(());
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    tracing::info!("stopped serving; writing filter snapshots");
    // A scrape in progress holds the frontier for a moment.
    for _ in 0..100 {
        if Arc::strong_count(&frontier) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let frontier = Arc::try_unwrap(frontier)
        .map_err(|_| anyhow::anyhow!("calls still hold the frontier after shutdown"))?;
    tokio::task::spawn_blocking(move || frontier.shutdown())
        .await?
        .context(
            "clean shutdown failed (the store is intact; the next start rebuilds the filters)",
        )?;
    tracing::info!("clean shutdown");
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGTERM");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutdown signal received");
}

async fn connect(address: &str) -> anyhow::Result<Channel> {
    Channel::from_shared(address.to_owned())
        .with_context(|| format!("{address:?} is not a valid frontier address"))?
        .connect()
        .await
        .with_context(|| format!("cannot reach the frontier at {address}"))
}

async fn seed(
    client: ClientArgs,
    mut urls: Vec<String>,
    file: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    if let Some(file) = file {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        urls.extend(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_owned),
        );
    }
    if urls.is_empty() {
        bail!("no seed URLs given (pass URLs or --file)");
    }
    let mut admin = client.admin().await?;
    let response = admin
        .add_seeds(proto::admin::AddSeedsRequest {
            crawl_id: client.crawl,
            urls,
        })
        .await?
        .into_inner();
    println!(
        "added {}, already known {}, refused {}",
        response.added,
        response.already_known,
        response.refused.len()
    );
    for refused in &response.refused {
        println!("  refused {} ({})", refused.url, refused.reason);
    }
    println!("scope hosts: {}", response.scope_hosts.join(" "));
    Ok(if response.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

async fn status(
    client: ClientArgs,
    wait: bool,
    timeout_secs: Option<u64>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let show = |progress: &proto::admin::Progress| {
        if json {
            println!("{}", progress_json(progress));
        } else {
            print_progress(progress);
        }
    };
    let admin = client.admin().await?;
    let progress = |mut admin: AdminClient<Intercepted>, crawl: String| async move {
        anyhow::Ok(
            admin
                .get_progress(proto::admin::GetProgressRequest { crawl_id: crawl })
                .await?
                .into_inner(),
        )
    };
    if !wait {
        show(&progress(admin, client.crawl.clone()).await?);
        return Ok(ExitCode::SUCCESS);
    }
    // Waiting polls GetStats, which the frontier answers from memory;
    // GetProgress reads the crawl's due index, so it is asked once, at the
    // end.
    let mut frontier = client.frontier().await?;
    let started = Instant::now();
    loop {
        let stats = frontier
            .get_stats(proto::urlfrontier::QueueWithinCrawlParams {
                key: String::new(),
                crawl_id: client.crawl.clone(),
                local: false,
            })
            .await?
            .into_inner();
        let completed = stats.counts.get("completed").copied().unwrap_or(0);
        if completed > 0 && stats.size == 0 {
            show(&progress(admin, client.crawl.clone()).await?);
            return Ok(ExitCode::SUCCESS);
        }
        if timeout_secs.is_some_and(|limit| started.elapsed() >= Duration::from_secs(limit)) {
            show(&progress(admin.clone(), client.crawl.clone()).await?);
            eprintln!("crawl not finished after {} s", started.elapsed().as_secs());
            return Ok(ExitCode::from(2));
        }
        // Polling an operator's view; nothing here synchronises with it.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn progress_json(progress: &proto::admin::Progress) -> serde_json::Value {
    let skipped = progress.skipped.unwrap_or_default();
    let rates = progress.last_minute.unwrap_or_default();
    serde_json::json!({
        "crawl_id": progress.crawl_id,
        "discovered": progress.discovered,
        "completed": progress.completed,
        "leased": progress.leased,
        "due_now": progress.due_now,
        "scheduled_later": progress.scheduled_later,
        "queues": progress.queues,
        "active_queues": progress.active_queues,
        "finished": progress.discovered > 0 && progress.completed == progress.discovered,
        "skipped": {
            "duplicate": skipped.duplicate,
            "out_of_scope": skipped.out_of_scope,
            "too_deep": skipped.too_deep,
            "invalid": skipped.invalid,
            "too_long": skipped.too_long,
            "trap": skipped.trap,
            "metadata_too_large": skipped.metadata_too_large,
        },
        "per_second_last_minute": {
            "discovered": rates.discovered,
            "leased": rates.leased,
            "completed": rates.completed,
        },
    })
}

fn partition_json(p: &proto::admin::PartitionHealth) -> serde_json::Value {
    serde_json::json!({
        "partition": p.partition,
        "layout": p.layout,
        "bits": p.bits,
        "hashes": p.hashes,
        "items_inserted": p.items_inserted,
        "estimated_items": p.estimated_items,
        "ones": p.ones,
        "fill_ratio": p.fill_ratio,
        "estimated_fp_rate": p.estimated_fp_rate,
        "observed_fp_rate": p.observed_fp_rate,
        "refuted_maybes": p.refuted_maybes,
        "absent_lookups": p.absent_lookups,
        "memory_bytes": p.memory_bytes,
        "rebuild_count": p.rebuild_count,
        "state": format!("{:?}", p.state()).to_lowercase(),
        "last_rebuild": p.last_rebuild.map(|r| serde_json::json!({
            "finished_at_ms": r.finished_at_ms,
            "duration_ms": r.duration_ms,
            "bits_before": r.bits_before,
            "bits_after": r.bits_after,
            "keys": r.keys,
        })),
    })
}

fn print_progress(progress: &proto::admin::Progress) {
    let skipped = progress.skipped.unwrap_or_default();
    let rates = progress.last_minute.unwrap_or_default();
    println!("crawl {}", progress.crawl_id);
    println!(
        "  urls {}  completed {}  leased {}  due now {}  later {}",
        progress.discovered,
        progress.completed,
        progress.leased,
        progress.due_now,
        progress.scheduled_later
    );
    println!(
        "  queues {} (active {})",
        progress.queues, progress.active_queues
    );
    println!(
        "  skipped: duplicate {}  out of scope {}  too deep {}  invalid {}  too long {}  trap {}  metadata too large {}",
        skipped.duplicate,
        skipped.out_of_scope,
        skipped.too_deep,
        skipped.invalid,
        skipped.too_long,
        skipped.trap,
        skipped.metadata_too_large
    );
    println!(
        "  last minute, per second: discovered {:.1}  leased {:.1}  completed {:.1}",
        rates.discovered, rates.leased, rates.completed
    );
}

async fn health(client: ClientArgs, partitions: bool, json: bool) -> anyhow::Result<ExitCode> {
    let mut admin = client.admin().await?;
    let health = admin
        .get_filter_health(proto::admin::GetFilterHealthRequest {})
        .await?
        .into_inner();
    if json {
        let value = serde_json::json!({
            "dedup_mode": format!("{:?}", health.dedup_mode()).to_lowercase(),
            "target_fp_rate": health.target_fp_rate,
            "rebuild_fill_threshold": health.rebuild_fill_threshold,
            "total": health.total.as_ref().map(partition_json),
            "partitions": health.partitions.iter().map(partition_json).collect::<Vec<_>>(),
        });
        println!("{value}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "dedup {:?}  target fp {}  rebuild at fill {}",
        health.dedup_mode(),
        health.target_fp_rate,
        health.rebuild_fill_threshold
    );
    let print = |name: String, p: &proto::admin::PartitionHealth| {
        println!(
            "{name:>8}  items {:>10}  est {:>12.0}  bits {:>12}  k {:>2}  fill {:.4}  est fp {:.2e}  observed fp {:.2e} ({}/{})  {} B  rebuilds {}  {:?}",
            p.items_inserted,
            p.estimated_items,
            p.bits,
            p.hashes,
            p.fill_ratio,
            p.estimated_fp_rate,
            p.observed_fp_rate,
            p.refuted_maybes,
            p.absent_lookups,
            p.memory_bytes,
            p.rebuild_count,
            p.state()
        );
    };
    if partitions {
        for p in &health.partitions {
            print(format!("p{}", p.partition.unwrap_or_default()), p);
        }
    }
    if let Some(total) = &health.total {
        print("total".into(), total);
    }
    Ok(ExitCode::SUCCESS)
}

async fn rebuild(
    client: ClientArgs,
    partition: Option<u32>,
    no_wait: bool,
) -> anyhow::Result<ExitCode> {
    let mut admin = client.admin().await?;
    let response = admin
        .rebuild_filters(proto::admin::RebuildFiltersRequest { partition, no_wait })
        .await?
        .into_inner();
    println!("started {} partition rebuild(s)", response.started.len());
    for report in response.finished {
        println!(
            "  p{}: {} keys, {} -> {} bits, {} ms",
            report.partition,
            report.keys,
            report.bits_before,
            report.bits_after,
            report.duration_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn check(client: ClientArgs, url: String) -> anyhow::Result<ExitCode> {
    let mut admin = client.admin().await?;
    let response = admin
        .check_url(proto::admin::CheckUrlRequest {
            url,
            crawl_id: client.crawl,
            queue_key: String::new(),
        })
        .await?
        .into_inner();
    if !response.refused_reason.is_empty() {
        println!("refused: {}", response.refused_reason);
        return Ok(ExitCode::from(3));
    }
    println!("canonical  {}", response.canonical_url);
    println!("queue      {}", response.queue_key);
    println!("partition  {}", response.partition);
    println!("filter     {:?}", response.filter_answer());
    match response.stored {
        Some(stored) => println!(
            "stored     created {} completed {} due {} depth {} leased until {}",
            stored.created_at, stored.completed, stored.due_at, stored.depth, stored.leased_until
        ),
        None => println!("stored     no"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_active(client: ClientArgs, active: bool) -> anyhow::Result<ExitCode> {
    let mut frontier = client.frontier().await?;
    frontier
        .set_active(proto::urlfrontier::Active {
            state: active,
            local: false,
        })
        .await?;
    println!("{}", if active { "serving" } else { "paused" });
    Ok(ExitCode::SUCCESS)
}

async fn probe(client: ClientArgs) -> anyhow::Result<ExitCode> {
    let (channel, _) = client.channel().await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "urlfrontier.URLFrontier".into(),
        })
        .await?
        .into_inner();
    let serving =
        answer.status() == tonic_health::pb::health_check_response::ServingStatus::Serving;
    println!("{}", if serving { "serving" } else { "not serving" });
    Ok(if serving {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
