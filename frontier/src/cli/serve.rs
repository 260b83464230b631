//! `frontier serve`: the service's options, logging, and its life from
//! opening the store to a clean shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use frontier::handback::Handback;
use frontier::ingest::{DedupMode, FilterConfig, FiltersFrom};
use frontier::scope::{Rules, ScopeMode};
use frontier::service::{Frontier, FrontierConfig};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
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
    /// Most crawls held at once; a write that would start one more is
    /// refused with RESOURCE_EXHAUSTED (DeleteCrawl makes room).
    #[arg(long, env = "FRONTIER_MAX_CRAWLS", default_value_t = frontier::service::DEFAULT_MAX_CRAWLS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_crawls: u64,
    /// Connections served at once, a quarter of them (at least 16) from
    /// one address; one more is closed as it arrives, and so is one that
    /// sends nothing in time.
    #[arg(long, env = "FRONTIER_MAX_CONNECTIONS", default_value_t = frontier::server::MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// The address other nodes and clients reach this one by (ListNodes;
    /// default: the listening address).
    #[arg(long, env = "FRONTIER_ADVERTISE")]
    advertise: Option<String>,
    /// etcd endpoints (comma-separated): this node joins a cluster whose
    /// membership and partition map live there. Without it the node is a
    /// cluster of its own and needs no etcd.
    #[arg(long, env = "FRONTIER_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The cluster's name (with --etcd): several clusters can share one
    /// etcd.
    #[arg(long, env = "FRONTIER_CLUSTER", default_value = "default")]
    cluster: String,
    /// This node's stable ID in the cluster (with --etcd), for example a
    /// StatefulSet pod's name; it owns the same partitions after a restart.
    #[arg(long, env = "FRONTIER_NODE_ID")]
    node_id: Option<String>,
    /// Nodes that must register before the first partition map is written
    /// (with --etcd); until then calls that need a partition answer
    /// UNAVAILABLE.
    #[arg(long, env = "FRONTIER_INITIAL_NODES", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    initial_nodes: u64,
    /// Copies of each partition (with --etcd), read when the cluster is
    /// created: its leader and R - 1 followers, each holding every
    /// acknowledged write, so a node that dies, disk and all, loses
    /// nothing. A node started without it takes the cluster's count.
    #[arg(long, env = "FRONTIER_REPLICAS", value_parser = clap::value_parser!(u32).range(1..=7))]
    replicas: Option<u32>,
    /// Copies, the leader's included, a write must be durable on before
    /// it is acknowledged (with --etcd); below it writes are refused
    /// (UNAVAILABLE) rather than acknowledged on fewer disks. Default: 2
    /// when the cluster keeps 2 copies or more, else 1.
    #[arg(long, env = "FRONTIER_MIN_IN_SYNC", value_parser = clap::value_parser!(u32).range(1..=7))]
    min_in_sync: Option<u32>,
    /// Seconds a partition that still takes writes (at least
    /// --min-in-sync copies) waits, short of a copy because a node is
    /// away, before it is copied to another node (with --etcd): a node
    /// that restarts within it is not worth a copy. Below --min-in-sync a
    /// partition is copied at once; `frontier cluster remove` ends the
    /// wait.
    #[arg(long, env = "FRONTIER_REPLACE_AFTER_SECS", default_value_t = 600)]
    replace_after_secs: u64,
    /// Seconds a node's registration outlives its last renewal: how soon a
    /// stopped node is seen as gone.
    #[arg(long, env = "FRONTIER_LEASE_TTL_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..))]
    lease_ttl_secs: u64,
    /// Seconds joining keeps trying an unreachable etcd before giving up.
    #[arg(long, env = "FRONTIER_ETCD_TIMEOUT_SECS", default_value_t = 60)]
    etcd_timeout_secs: u64,
    /// URLs per page when this node copies a partition moving to it
    /// (with --etcd): smaller pages hold less in memory at once and cost
    /// more round trips.
    #[arg(long, env = "FRONTIER_MOVE_PAGE_URLS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=16_384))]
    move_page_urls: u32,
    /// Serve the web endpoint on this address: the live dashboard on `/`
    /// (read-only; it asks for --admin-token when one is set) and
    /// Prometheus metrics on `/metrics`. `--metrics-listen` and
    /// FRONTIER_METRICS_LISTEN still work as other names for it.
    #[arg(long, alias = "metrics-listen", env = "FRONTIER_HTTP_LISTEN")]
    http_listen: Option<SocketAddr>,
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
    /// Serve gRPC over TLS with this PEM certificate (chain); with
    /// --tls-key. Clients then dial `https://`.
    #[arg(long, env = "FRONTIER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "FRONTIER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Ask every client for a certificate signed by this PEM CA (mutual
    /// TLS); a client without one is refused. Needs --tls-cert.
    #[arg(long, env = "FRONTIER_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// PEM CA the other nodes' certificates are checked against (with
    /// --etcd and --tls-cert; default: the public web's roots). This
    /// node shows its own --tls-cert to them.
    #[arg(long, env = "FRONTIER_TLS_CA", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// When a fetched page is due again, for crawls without a policy of
    /// their own (`frontier revisit`): `never` (a page fetched is done),
    /// `fixed` (every --revisit-min-secs) or `adaptive` (following how
    /// often the page is found changed, between --revisit-min-secs and
    /// --revisit-max-secs).
    #[arg(long, env = "FRONTIER_REVISIT", default_value = "never", value_parser = ["never", "fixed", "adaptive"])]
    revisit: String,
    /// The shortest revisit interval, in seconds.
    #[arg(long, env = "FRONTIER_REVISIT_MIN_SECS", default_value_t = 86_400)]
    revisit_min_secs: u64,
    /// The longest revisit interval (adaptive), in seconds.
    #[arg(long, env = "FRONTIER_REVISIT_MAX_SECS", default_value_t = 30 * 86_400)]
    revisit_max_secs: u64,
    /// What hosts share one politeness gap: `host` (each alone), `domain`
    /// (the hosts of one registrable domain, by the public suffix list)
    /// or `ip` (the hosts at one address: looked up before a host's first
    /// request, then as workers report it). The queues of a group take
    /// turns, each serve a delay after the group was last let go, and a
    /// Retry-After blocks the group.
    #[arg(long, env = "FRONTIER_POLITENESS", default_value = "host")]
    politeness: frontier::scheduler::Politeness,
    /// A hosts(5) file of names pinned to addresses before DNS, for
    /// politeness by address: give it the workers' --hosts-file.
    #[arg(long, env = "FRONTIER_HOSTS_FILE")]
    hosts_file: Option<PathBuf>,
    /// Milliseconds between two serves of one queue, unless SetDelay set
    /// the queue's or the crawl's own.
    #[arg(long, env = "FRONTIER_DEFAULT_DELAY_MS", default_value_t = 1000)]
    default_delay_ms: u64,
    /// MiB of memory for the store, in thirds: its page cache (redb),
    /// writes answered but not yet in its files, and the copy of them
    /// being written. Less memory, slower ingest once the store outgrows
    /// it.
    #[arg(long, env = "FRONTIER_CACHE_MB", default_value_t = 1536, value_parser = clap::value_parser!(u64).range(1..))]
    cache_mb: u64,
    /// MiB that must stay free on the data directory's disk: below it
    /// writes are refused (RESOURCE_EXHAUSTED, health NOT_SERVING) and
    /// resume by themselves once there is room.
    #[arg(long, env = "FRONTIER_MIN_FREE_MB", default_value_t = 256)]
    min_free_mb: u64,
    /// MiB of robots.txt answers kept for the workers (each origin's
    /// robots.txt is then read once per deployment, not once per worker);
    /// the oldest go first when it is full, and are read again when needed.
    #[arg(long, env = "FRONTIER_ROBOTS_CACHE_MB", default_value_t = 64)]
    robots_cache_mb: u64,
}

/// Logging to stderr, `RUST_LOG` levels (default info), changeable at run
/// time through SetLogLevel.
pub fn init_logging() -> frontier::grpc::LogControl {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colour codes only for a person at a terminal, not in a
                // log file.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
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
            rebuild_fill: args.rebuild_fill,
            // Set from the politeness by the frontier.
            ..FilterConfig::default()
        },
        dedup,
        max_url_length: args.max_url_length,
        max_metadata_bytes: args.max_metadata_bytes,
        rules,
        default_lease_secs: args.lease_secs.max(1),
        max_lease_secs: args.max_lease_secs.max(1),
        max_urls_per_get: args.max_urls_per_get,
        default_delay: Duration::from_millis(args.default_delay_ms),
        cache_bytes: usize::try_from(args.cache_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        min_free_bytes: args.min_free_mb.saturating_mul(1 << 20),
        robots_shelf_bytes: usize::try_from(args.robots_cache_mb.saturating_mul(1 << 20))
            .unwrap_or(usize::MAX),
        max_crawls: usize::try_from(args.max_crawls).unwrap_or(usize::MAX),
        revisit: frontier::revisit::Policy::parse(
            &args.revisit,
            args.revisit_min_secs,
            args.revisit_max_secs,
        )
        .map_err(|error| anyhow::anyhow!("--revisit: {error}"))?,
        politeness: args.politeness,
        pinned_names: Arc::new(pinned_names(args.hosts_file.as_deref())?),
    })
}

/// The names `--hosts-file` pins, none without it.
fn pinned_names(path: Option<&std::path::Path>) -> anyhow::Result<names::PinnedNames> {
    let Some(path) = path else {
        return Ok(names::PinnedNames::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --hosts-file {}", path.display()))?;
    names::PinnedNames::parse(&text).with_context(|| format!("--hosts-file {}", path.display()))
}

/// Whether opening failed for want of disk room.
fn opening_needs_room(error: &frontier::service::FrontierError) -> bool {
    use frontier::service::FrontierError;
    matches!(error, FrontierError::Ingest(ingest) if ingest.is_disk_full())
        // redb reports some I/O failures as text only.
        || error.to_string().contains("No space left on device")
}

/// How long a clean shutdown waits for the last calls to let go of the
/// frontier before giving up on writing the filter snapshots.
const HOLDERS_GRACE: Duration = Duration::from_secs(5);

pub async fn serve(
    args: ServeArgs,
    log_control: frontier::grpc::LogControl,
) -> anyhow::Result<ExitCode> {
    // Faults injected on purpose, by tests of the cluster's partition moves
    // only: `FAILPOINTS=name=action;...` (the fail crate's syntax).
    let _failpoints = std::env::var_os("FAILPOINTS").map(|_| fail::FailScenario::setup());
    let config = config_of(&args)?;
    // Flags are checked before the store opens, which can take minutes.
    let access = access_of(&args)?;
    let tls = server_tls(&args)?;
    if tls.is_none() && !args.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %args.listen,
            "gRPC is served in plaintext on a non-loopback address: anyone on the network can \
             read and send calls (serve TLS with --tls-cert and --tls-key)"
        );
    }
    let cluster_options = cluster_options(&args, args.listen)?;
    let started = Instant::now();
    let frontier = match tokio::task::spawn_blocking(move || Frontier::open(config)).await? {
        Ok(frontier) => frontier,
        // Below the floor the store opens read-only; only a disk too full
        // for the log's replay keeps it from opening at all.
        Err(error) if opening_needs_room(&error) => bail!(
            "cannot open the frontier in {}: the disk is too full to replay the write-ahead \
             log into the store's files ({error}). Nothing acknowledged is lost: free some \
             space, then start it again",
            args.data_dir.display()
        ),
        Err(error) => {
            return Err(anyhow::Error::from(error).context(format!(
                "cannot open the frontier in {}",
                args.data_dir.display()
            )));
        }
    };
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
    let (frontier, returned) = Handback::share(frontier);
    let http_listen = match args.http_listen {
        Some(address) => Some(address),
        None => legacy_metrics_listen()?,
    };
    let dashboard = frontier::dashboard::Dashboard::new(&frontier, access.clone());
    let metrics = match http_listen {
        Some(address) => Some(WebEndpoint::start(address, Arc::clone(&dashboard)).await?),
        None => None,
    };
    let metrics_note = metrics.as_ref().map_or_else(String::new, |m| {
        format!(" metrics http://{0}/metrics dashboard http://{0}/", m.bound)
    });
    let cluster = match cluster_options {
        Some(mut options) => Some({
            // A port 0 to listen on is the port bound.
            options.advertise = advertised(args.advertise.as_deref(), address)?;
            let cluster = frontier::cluster::join(options, Arc::clone(&frontier))
                .await
                .context("cannot join the cluster")?;
            dashboard.set_cluster(&cluster);
            cluster
        }),
        None => None,
    };
    // Said once the node may serve: a node whose join is refused exits
    // without having claimed to listen.
    tracing::info!(
        %address,
        startup_ms = started.elapsed().as_millis() as u64,
        data_dir = %args.data_dir.display(),
        "frontier listening"
    );
    // Scripts and tests read the chosen addresses from this line.
    println!("listening on {address}{metrics_note}");
    let options = frontier::grpc::ServerOptions {
        access,
        node: args.advertise.clone().unwrap_or_default(),
        log_control: Some(log_control),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        cluster: cluster.clone(),
        tls,
    };
    frontier::server::run(listener, Arc::clone(&frontier), options, shutdown_signal()).await?;
    if let Some(cluster) = cluster {
        cluster.leave().await;
    }
    if let Some(metrics) = metrics {
        metrics.stop().await;
    }
    tracing::info!("stopped serving; writing filter snapshots");
    drop(frontier);
    // Calls cut off by the shutdown may still be finishing their blocking
    // work, and a scrape may be reading; they let go within moments.
    let frontier = returned
        .within(HOLDERS_GRACE)
        .await
        .ok_or_else(|| anyhow::anyhow!("calls still hold the frontier after shutdown"))?;
    tokio::task::spawn_blocking(move || frontier.shutdown())
        .await?
        .context(
            "clean shutdown failed (the store is intact; the next start rebuilds the filters)",
        )?;
    tracing::info!("clean shutdown");
    Ok(ExitCode::SUCCESS)
}

/// How this node joins its cluster, when --etcd is given.
fn cluster_options(
    args: &ServeArgs,
    listen: SocketAddr,
) -> anyhow::Result<Option<frontier::cluster::ClusterOptions>> {
    if args.etcd.is_empty() {
        return Ok(None);
    }
    let Some(node_id) = args.node_id.clone().filter(|id| !id.is_empty()) else {
        bail!("--etcd needs --node-id (a stable name per node, such as a StatefulSet pod's)");
    };
    let advertise = advertised(args.advertise.as_deref(), listen)?;
    if node_id.contains('/') {
        bail!("--node-id {node_id:?} must not contain '/'");
    }
    if let (Some(min), Some(replicas)) = (args.min_in_sync, args.replicas)
        && min > replicas
    {
        bail!(
            "--min-in-sync {min} is more than --replicas {replicas}: no write could be acknowledged"
        );
    }
    Ok(Some(frontier::cluster::ClusterOptions {
        etcd: args.etcd.clone(),
        name: args.cluster.clone(),
        node_id,
        advertise,
        initial_nodes: usize::try_from(args.initial_nodes).unwrap_or(usize::MAX),
        replicas: args.replicas,
        min_in_sync: args.min_in_sync,
        replace_after: Duration::from_secs(args.replace_after_secs),
        lease_ttl: Duration::from_secs(args.lease_ttl_secs),
        join_timeout: Duration::from_secs(args.etcd_timeout_secs),
        token: args.admin_token.clone(),
        move_page_urls: args.move_page_urls,
        tls: proto::tls::ClientTls::from_files(
            args.tls_ca.as_deref(),
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
        )?,
        secure: args.tls_cert.is_some(),
    }))
}

/// The server's TLS, when --tls-cert is given: its identity, and the CA
/// client certificates must be signed by under mutual TLS.
fn server_tls(args: &ServeArgs) -> anyhow::Result<Option<tonic::transport::ServerTlsConfig>> {
    use proto::tls::read_pem;
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let identity = Identity::from_pem(
        read_pem("--tls-cert", cert, "CERTIFICATE")?,
        read_pem("--tls-key", key, "PRIVATE KEY")?,
    );
    // A client that opens a connection and never finishes its handshake
    // lets go of its connection slot.
    let mut config = ServerTlsConfig::new()
        .identity(identity)
        .timeout(Duration::from_secs(10));
    if let Some(ca) = &args.tls_client_ca {
        config = config.client_ca_root(Certificate::from_pem(read_pem(
            "--tls-client-ca",
            ca,
            "CERTIFICATE",
        )?));
    }
    Ok(Some(config))
}

/// The address other nodes and workers reach this one at: `--advertise`,
/// its port 0 (or none) meaning the port bound; without it, the bound
/// address itself unless that is a wildcard no one can dial.
fn advertised(advertise: Option<&str>, bound: SocketAddr) -> anyhow::Result<String> {
    let Some(advertise) = advertise.filter(|a| !a.is_empty()) else {
        if bound.ip().is_unspecified() {
            bail!(
                "--etcd needs --advertise HOST:PORT when listening on {bound}: \
                 the address other nodes and workers reach this node at"
            );
        }
        return Ok(bound.to_string());
    };
    Ok(match advertise.rsplit_once(':') {
        Some((host, "0")) => format!("{host}:{}", bound.port()),
        Some((_, port)) if port.parse::<u16>().is_ok() => advertise.to_owned(),
        _ => format!("{advertise}:{}", bound.port()),
    })
}

/// Who may call what: the token's scope, or an open frontier.
fn access_of(args: &ServeArgs) -> anyhow::Result<frontier::auth::Access> {
    Ok(match &args.admin_token {
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
    })
}

/// FRONTIER_METRICS_LISTEN, the web endpoint's name before it served the
/// dashboard, still read when FRONTIER_HTTP_LISTEN is not set.
fn legacy_metrics_listen() -> anyhow::Result<Option<SocketAddr>> {
    match std::env::var("FRONTIER_METRICS_LISTEN") {
        Ok(value) if !value.is_empty() => value
            .parse()
            .map(Some)
            .with_context(|| format!("FRONTIER_METRICS_LISTEN={value:?} is not an address")),
        _ => Ok(None),
    }
}

/// The web endpoint (dashboard and metrics), served beside the gRPC
/// listener.
struct WebEndpoint {
    bound: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl WebEndpoint {
    async fn start(
        address: SocketAddr,
        dashboard: Arc<frontier::dashboard::Dashboard>,
    ) -> anyhow::Result<Self> {
        let handle = frontier::metrics::install()
            .ok_or_else(|| anyhow::anyhow!("cannot install the metrics recorder"))?;
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("cannot listen on {address} for the dashboard and metrics"))?;
        let bound = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(frontier::dashboard::serve(
            listener,
            handle,
            dashboard,
            async {
                let _ = stopped.await;
            },
        ));
        Ok(Self { bound, stop, task })
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
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
