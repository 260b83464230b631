//! `frontier`: `serve` runs the service; the other subcommands are an
//! operator's client of a running one (seeding, progress, filter health,
//! rebuilds, URL checks, revisit policies, pause and resume).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use cli::admin::{
    check, cluster, drain, health, probe, rebuild, remove_node, seed, set_active, set_replicas,
    status,
};
use cli::serve::{ServeArgs, init_logging, serve};
use cli::{ClientArgs, repair, transfer};

mod cli;

// The store's held writes are allocated by the thread that stages a group
// and freed by the applier's, and every call's buffers on the runtime's
// threads; glibc's per-thread arenas kept the memory freed across threads
// resident.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// The cluster: nodes (alive, address, partitions, rates), the map's
    /// epoch and the leader, partition moves in flight; a node without a
    /// cluster shows itself.
    Cluster {
        #[command(flatten)]
        client: ClientArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<ClusterAction>,
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
    /// Set a crawl's revisit policy, live: when a page its crawlers report
    /// done is due again. In a cluster, every node's.
    Revisit {
        #[command(flatten)]
        client: ClientArgs,
        /// `never`, `fixed`, `adaptive`, or `default` (the policy the
        /// frontier was started with).
        #[arg(long, value_parser = ["never", "fixed", "adaptive", "default"])]
        policy: String,
        /// Fixed: the interval; adaptive: the shortest one (seconds).
        #[arg(long)]
        min_secs: Option<u64>,
        /// Adaptive: the longest interval (seconds).
        #[arg(long)]
        max_secs: Option<u64>,
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
    /// proto3 JSON form of the API's URLItem (completed ones first), after
    /// a line with the crawl's revisit policy when it has one of its own.
    Export {
        #[command(flatten)]
        client: ClientArgs,
        /// Write here instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Read URL items written by `export` and put them (as known items, so
    /// their state comes along) into a frontier's crawl, then set the
    /// crawl's revisit policy when the file has it. Every line is checked
    /// before anything is sent.
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

fn main() -> ExitCode {
    frontier::allocator::configure();
    let log_control = init_logging();
    match run(log_control) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(log_control: frontier::grpc::LogControl) -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // The repair tools read files; they need no runtime.
    match &cli.command {
        Command::Verify { data_dir, json } => return repair::verify(data_dir, *json),
        Command::Salvage {
            data_dir,
            into,
            json,
        } => return repair::salvage(data_dir, into, *json),
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
            Command::Cluster {
                client,
                json,
                action: None,
            } => cluster(client, json).await,
            Command::Cluster {
                client,
                action: Some(ClusterAction::Drain { node }),
                ..
            } => drain(client, node).await,
            Command::Cluster {
                client,
                action: Some(ClusterAction::Remove { node }),
                ..
            } => remove_node(client, node).await,
            Command::Cluster {
                client,
                action: Some(ClusterAction::Replicas { count }),
                ..
            } => set_replicas(client, count).await,
            Command::Rebuild {
                client,
                partition,
                no_wait,
            } => rebuild(client, partition, no_wait).await,
            Command::Check { client, url } => check(client, url).await,
            Command::Revisit {
                client,
                policy,
                min_secs,
                max_secs,
            } => cli::revisit::set_revisit(client, policy, min_secs, max_secs).await,
            Command::Pause { client } => set_active(client, false).await,
            Command::Resume { client } => set_active(client, true).await,
            Command::Probe { client } => probe(client).await,
            Command::Export { client, output } => transfer::export(client, output).await,
            Command::Import {
                client,
                into_crawl,
                file,
            } => transfer::import(client, into_crawl, file).await,
            Command::Verify { .. } | Command::Salvage { .. } => {
                unreachable!("answered before the runtime started")
            }
        }
    })
}

/// Changes to a cluster's membership.
#[derive(Subcommand, Debug)]
enum ClusterAction {
    /// Moves every partition off a node, a few at a time; once `frontier
    /// cluster` shows it owning none and no move in flight, it can be
    /// stopped and removed.
    Drain {
        /// The node's ID.
        node: String,
    },
    /// Takes a node that will not come back (its disk lost) out of the
    /// cluster at once: its partitions are led by their followers and get
    /// new followers, so each is back at the cluster's copy count. Refused
    /// while the node is alive (drain it and stop it first) or when it
    /// holds a partition's last copy.
    Remove {
        /// The node's ID.
        node: String,
    },
    /// Changes the copies kept of each partition, live: new followers are
    /// copied from each leader, or extra ones let go.
    Replicas {
        /// Copies of each partition, its leader's included (1 to 7).
        #[arg(value_parser = clap::value_parser!(u32).range(1..=7))]
        count: u32,
    },
}
