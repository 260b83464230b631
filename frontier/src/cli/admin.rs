//! The operator's calls to a running frontier: seeding, progress, filter
//! health, rebuilds, URL checks, pause and resume, the health probe.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::admin::admin_client::AdminClient;

use super::client::{ClientArgs, Intercepted};
use super::output::{partition_json, print_progress, progress_json};

pub async fn seed(
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
    let admin = client.admin()?;
    let request = proto::admin::AddSeedsRequest {
        crawl_id: client.crawl.clone(),
        urls,
        ..proto::admin::AddSeedsRequest::default()
    };
    let response = client
        .retry("seed", || {
            let mut admin = admin.clone();
            let request = request.clone();
            async move { admin.add_seeds(request).await }
        })
        .await?;
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

pub async fn status(
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
    let admin = client.admin()?;
    let first = crawl_progress(&client, &admin).await?;
    if !wait {
        show(&first);
        return Ok(ExitCode::SUCCESS);
    }
    if revisits(&first) {
        return wait_caught_up(&client, admin, timeout_secs, &show).await;
    }
    // Waiting polls GetStats, which the frontier answers from memory;
    // GetProgress reads the crawl's due index, so it is asked once, at the
    // end.
    let mut frontier = client.frontier()?;
    let started = Instant::now();
    let mut away_noted = false;
    loop {
        let stats = frontier
            .get_stats(proto::urlfrontier::QueueWithinCrawlParams {
                key: String::new(),
                crawl_id: client.crawl.clone(),
                local: false,
            })
            .await;
        let stats = match stats {
            Ok(stats) => stats.into_inner(),
            // A cluster node away: the crawl is not done without it.
            Err(status) if status.code() == tonic::Code::Unavailable => {
                if !away_noted {
                    eprintln!("waiting: {}", super::client::waiting_reason(&status));
                    away_noted = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        let completed = stats.counts.get("completed").copied().unwrap_or(0);
        if completed > 0 && stats.size == 0 {
            show(&crawl_progress(&client, &admin).await?);
            return Ok(ExitCode::SUCCESS);
        }
        if timeout_secs.is_some_and(|limit| started.elapsed() >= Duration::from_secs(limit)) {
            show(&crawl_progress(&client, &admin).await?);
            eprintln!("crawl not finished after {} s", started.elapsed().as_secs());
            return Ok(ExitCode::from(2));
        }
        // Polling an operator's view; nothing here synchronises with it.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The progress of the client's crawl, over the whole cluster.
async fn crawl_progress(
    client: &ClientArgs,
    admin: &AdminClient<Intercepted>,
) -> anyhow::Result<proto::admin::Progress> {
    let request = proto::admin::GetProgressRequest {
        crawl_id: client.crawl.clone(),
        local: false,
    };
    client
        .retry("status", || {
            let mut admin = admin.clone();
            let request = request.clone();
            async move { admin.get_progress(request).await }
        })
        .await
}

/// Whether a crawl revisits its pages (and so is never done).
fn revisits(progress: &proto::admin::Progress) -> bool {
    progress
        .revisit
        .as_ref()
        .is_some_and(|policy| !policy.policy.is_empty() && policy.policy != "never")
}

/// `status --wait` for a crawl that revisits: it never ends, so the wait
/// ends once the crawl has caught up, with nothing due now and nothing
/// leased, and says when the next revisit is due.
async fn wait_caught_up(
    client: &ClientArgs,
    admin: AdminClient<Intercepted>,
    timeout_secs: Option<u64>,
    show: &impl Fn(&proto::admin::Progress),
) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    loop {
        let progress = crawl_progress(client, &admin).await?;
        if progress.discovered > 0 && progress.due_now == 0 && progress.leased == 0 {
            show(&progress);
            eprintln!(
                "caught up: nothing due before the next revisit{}; the crawl revisits ({})",
                match progress.next_due_at {
                    0 => String::new(),
                    at => format!(" at {at} (in {} s)", at.saturating_sub(now_secs())),
                },
                super::revisit::describe(progress.revisit.as_ref())
            );
            return Ok(ExitCode::SUCCESS);
        }
        if timeout_secs.is_some_and(|limit| started.elapsed() >= Duration::from_secs(limit)) {
            show(&progress);
            eprintln!(
                "crawl not caught up after {} s",
                started.elapsed().as_secs()
            );
            return Ok(ExitCode::from(2));
        }
        // GetProgress reads the crawl's due index: asked once a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn now_secs() -> u64 {
    proto::time::Timestamp::now().unix_secs()
}

pub async fn health(client: ClientArgs, partitions: bool, json: bool) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let health = client
        .retry("health", || {
            let mut admin = admin.clone();
            async move {
                admin
                    .get_filter_health(proto::admin::GetFilterHealthRequest { local: false })
                    .await
            }
        })
        .await?;
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
            let name = if p.node.is_empty() {
                format!("p{}", p.partition.unwrap_or_default())
            } else {
                format!("p{}@{}", p.partition.unwrap_or_default(), p.node)
            };
            print(name, p);
        }
    }
    if let Some(total) = &health.total {
        print("total".into(), total);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn rebuild(
    client: ClientArgs,
    partition: Option<u32>,
    no_wait: bool,
) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let request = proto::admin::RebuildFiltersRequest {
        partition,
        no_wait,
        local: false,
    };
    let response = client
        .retry("rebuild", || {
            let mut admin = admin.clone();
            async move { admin.rebuild_filters(request).await }
        })
        .await?;
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

pub async fn check(client: ClientArgs, url: String) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let request = proto::admin::CheckUrlRequest {
        url,
        crawl_id: client.crawl.clone(),
        queue_key: String::new(),
    };
    let response = client
        .retry("check", || {
            let mut admin = admin.clone();
            let request = request.clone();
            async move { admin.check_url(request).await }
        })
        .await?;
    if !response.refused_reason.is_empty() {
        println!("refused: {}", response.refused_reason);
        return Ok(ExitCode::from(3));
    }
    println!("canonical  {}", response.canonical_url);
    println!("queue      {}", response.queue_key);
    println!("partition  {}", response.partition);
    println!("filter     {:?}", response.filter_answer());
    match response.stored {
        Some(stored) => {
            println!(
                "stored     created {} completed {} due {} depth {} leased until {}",
                stored.created_at,
                stored.completed,
                stored.due_at,
                stored.depth,
                stored.leased_until
            );
            let metadata = stored
                .metadata
                .iter()
                .map(|(key, values)| (key.clone(), values.values.clone()))
                .collect();
            for line in super::revisit::history_lines(&metadata, stored.due_at, stored.completed) {
                println!("{line}");
            }
        }
        None => println!("stored     no"),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn set_active(client: ClientArgs, active: bool) -> anyhow::Result<ExitCode> {
    let frontier = client.frontier()?;
    let request = proto::urlfrontier::Active {
        state: active,
        local: false,
    };
    client
        .retry(if active { "resume" } else { "pause" }, || {
            let mut frontier = frontier.clone();
            async move { frontier.set_active(request).await }
        })
        .await?;
    println!("{}", if active { "serving" } else { "paused" });
    Ok(ExitCode::SUCCESS)
}

/// Answers at once, without --retry-secs: a health check asks whether the
/// frontier serves now.
pub async fn probe(client: ClientArgs) -> anyhow::Result<ExitCode> {
    let (channel, _) = client.channel()?;
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

pub async fn drain(client: ClientArgs, node: String) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let request = proto::admin::DrainNodeRequest {
        node_id: node.clone(),
    };
    let answer = client
        .retry("cluster drain", || {
            let mut admin = admin.clone();
            let request = request.clone();
            async move { admin.drain_node(request).await }
        })
        .await?;
    println!(
        "draining {node}: its {} partitions move away a few at a time; \
         `frontier cluster` shows the moves, and {node} can stop once it owns none",
        answer.owned
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn remove_node(client: ClientArgs, node: String) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let request = proto::admin::RemoveNodeRequest {
        node_id: node.clone(),
    };
    let answer = client
        .retry("cluster remove", || {
            let mut admin = admin.clone();
            let request = request.clone();
            async move { admin.remove_node(request).await }
        })
        .await?;
    if answer.led == 0 && answer.followed == 0 {
        println!(
            "{node} is not alive and the map gives it no partition (a node that stopped is \
             taken out of the map once its registration lapses): nothing left to remove"
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "removed {node}: the {} partitions it led are led by their followers, and it follows \
         none of the {} it followed; new followers are copied (`frontier cluster` shows them)",
        answer.led, answer.followed
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn set_replicas(client: ClientArgs, count: u32) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let request = proto::admin::SetReplicasRequest { replicas: count };
    let answer = client
        .retry("cluster replicas", || {
            let mut admin = admin.clone();
            async move { admin.set_replicas(request).await }
        })
        .await?;
    println!(
        "the cluster keeps {count} copies of each partition; writes need {}; \
         `frontier cluster` shows the copies being made or let go",
        answer.min_in_sync
    );
    if answer.live_nodes < count {
        println!(
            "only {} nodes are alive: partitions get {count} copies once as many nodes are",
            answer.live_nodes
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn cluster(client: ClientArgs, json: bool) -> anyhow::Result<ExitCode> {
    let admin = client.admin()?;
    let status = client
        .retry("cluster", || {
            let mut admin = admin.clone();
            async move { admin.get_cluster(proto::admin::GetClusterRequest {}).await }
        })
        .await?;
    if json {
        println!("{}", super::output::cluster_json(&status));
    } else {
        super::output::print_cluster(&status);
    }
    Ok(ExitCode::SUCCESS)
}
