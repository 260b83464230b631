//! How the client subcommands print what the frontier answers: text for
//! people, JSON (`--json`) for scripts.

pub fn progress_json(progress: &proto::admin::Progress) -> serde_json::Value {
    let skipped = progress.skipped.unwrap_or_default();
    let rates = progress.last_minute.unwrap_or_default();
    serde_json::json!({
        "crawl_id": progress.crawl_id,
        "discovered": progress.discovered,
        "completed": progress.completed,
        "leased": progress.leased,
        "due_now": progress.due_now,
        "scheduled_later": progress.scheduled_later,
        "due_next_hour": progress.due_next_hour,
        "due_next_day": progress.due_next_day,
        "next_due_at": progress.next_due_at,
        "revisit": progress.revisit.as_ref().map(|policy| serde_json::json!({
            "policy": policy.policy,
            "min_secs": policy.min_secs,
            "max_secs": policy.max_secs,
            "own": policy.own,
        })),
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
        "nodes": progress.nodes.iter().map(|node| {
            let mut value = progress_json(node);
            value["node"] = node.node.clone().into();
            value
        }).collect::<Vec<_>>(),
    })
}

pub fn partition_json(p: &proto::admin::PartitionHealth) -> serde_json::Value {
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
        "node": p.node,
        "last_rebuild": p.last_rebuild.map(|r| serde_json::json!({
            "finished_at_ms": r.finished_at_ms,
            "duration_ms": r.duration_ms,
            "bits_before": r.bits_before,
            "bits_after": r.bits_after,
            "keys": r.keys,
        })),
    })
}

pub fn print_progress(progress: &proto::admin::Progress) {
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
        "  due in the next hour {}  next day {}  next due at {}",
        progress.due_next_hour,
        progress.due_next_day,
        match progress.next_due_at {
            0 => "-".to_owned(),
            at => at.to_string(),
        }
    );
    println!(
        "  revisit {}",
        super::revisit::describe(progress.revisit.as_ref())
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
    for node in &progress.nodes {
        println!(
            "  node {}: urls {}  completed {}  leased {}  due now {}  later {}  queues {}",
            node.node,
            node.discovered,
            node.completed,
            node.leased,
            node.due_now,
            node.scheduled_later,
            node.queues
        );
    }
}

pub fn cluster_json(status: &proto::admin::ClusterStatus) -> serde_json::Value {
    serde_json::json!({
        "name": status.name,
        "epoch": status.epoch,
        "partitions": status.partitions,
        "leader": status.leader,
        "answered_by": status.answered_by,
        "draining": status.draining,
        "replicas": status.replicas,
        "min_in_sync": status.min_in_sync,
        "partition_copies": partition_copies(status),
        "moves": status.moves.iter().map(|m| serde_json::json!({
            "kind": m.kind,
            "partition": m.partition,
            "from": m.from,
            "to": m.to,
            "phase": m.phase,
            "copied": m.copied,
            "copied_bytes": m.copied_bytes,
            "started_at_ms": m.started_at_ms,
            "cutover_ms": m.cutover_ms,
            "leased": m.leased,
            "old_copy_deleted": m.old_copy_deleted,
            "from_log": m.from_log,
        })).collect::<Vec<_>>(),
        "nodes": status.nodes.iter().map(|node| {
            let rates = node.last_minute.unwrap_or_default();
            serde_json::json!({
                "id": node.id,
                "address": node.address,
                "alive": node.alive,
                "started_at_ms": node.started_at_ms,
                "partitions": node.partitions,
                "leads": node.partitions,
                "follows": node.follows,
                "per_second_last_minute": {
                    "discovered": rates.discovered,
                    "leased": rates.leased,
                    "completed": rates.completed,
                },
                "error": node.error,
            })
        }).collect::<Vec<_>>(),
    })
}

/// Per partition: its leader, and its followers, in sync or being copied
/// (with the copy's progress).
fn partition_copies(status: &proto::admin::ClusterStatus) -> Vec<serde_json::Value> {
    status
        .owners
        .iter()
        .enumerate()
        .map(|(p, leader)| {
            let mut followers: Vec<serde_json::Value> = status
                .followers
                .get(p)
                .map(|f| f.in_sync.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|id| serde_json::json!({"id": id, "in_sync": true}))
                .collect();
            followers.extend(
                status
                    .followers
                    .get(p)
                    .map(|f| f.lagging.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .filter(|id| {
                        !status
                            .moves
                            .iter()
                            .any(|m| m.partition as usize == p && m.to == **id)
                    })
                    .map(|id| serde_json::json!({"id": id, "in_sync": false, "lagging": true})),
            );
            followers.extend(
                status
                    .moves
                    .iter()
                    .filter(|m| m.partition as usize == p && m.kind == "replica")
                    .map(|m| {
                        serde_json::json!({
                            "id": m.to,
                            "in_sync": false,
                            "phase": m.phase,
                            "copied": m.copied,
                            "from_log": m.from_log,
                        })
                    }),
            );
            serde_json::json!({
                "partition": p,
                "leader": leader,
                "followers": followers,
                "copies_in_sync": 1 + status.followers.get(p).map_or(0, |f| f.in_sync.len()),
            })
        })
        .collect()
}

pub fn print_cluster(status: &proto::admin::ClusterStatus) {
    let name = if status.name.is_empty() {
        "(none: a node of its own)"
    } else {
        &status.name
    };
    println!(
        "cluster {name}  epoch {}  partitions {}  copies {} (writes need {})  leader {}",
        status.epoch,
        status.partitions,
        status.replicas.max(1),
        status.min_in_sync.max(1),
        if status.leader.is_empty() {
            "-"
        } else {
            &status.leader
        }
    );
    for node in &status.nodes {
        let rates = node.last_minute.unwrap_or_default();
        println!(
            "  {:<16} {:<22} {:<5}  leads {:>4}  follows {:>4}  ingest {:>8.1}/s  serve {:>8.1}/s  completed {:>8.1}/s{}",
            node.id,
            if node.address.is_empty() {
                "-"
            } else {
                &node.address
            },
            if node.alive { "alive" } else { "DOWN" },
            node.partitions.len(),
            node.follows.len(),
            rates.discovered,
            rates.leased,
            rates.completed,
            if node.error.is_empty() {
                String::new()
            } else {
                format!("  ({})", node.error)
            }
        );
    }
    for node in &status.draining {
        println!("  draining {node}: its partitions move away");
    }
    let now_ms = frontier::time::Timestamp::now().unix_millis();
    for moving in &status.moves {
        let mut line = format!(
            "  partition {:>4}  {} {} -> {}  {:<8} copied {:>10} URLs {:>8.1} MB  for {:.0} s",
            moving.partition,
            match (moving.kind.as_str(), moving.from_log) {
                ("replica", true) => "copy from log",
                ("replica", false) => "new copy",
                _ => "move",
            },
            moving.from,
            moving.to,
            moving.phase,
            moving.copied,
            moving.copied_bytes as f64 / 1e6,
            now_ms.saturating_sub(moving.started_at_ms) as f64 / 1e3,
        );
        if moving.phase == "flipped" {
            line.push_str(&format!(
                "  cutover {} ms, {} leased then{}",
                moving.cutover_ms,
                moving.leased,
                if moving.old_copy_deleted {
                    ", old copy deleted"
                } else {
                    ""
                }
            ));
        }
        println!("{line}");
    }
    let wanted = status.replicas.max(1) as usize;
    for (partition, leader) in status.owners.iter().enumerate() {
        let (followers, lagging) = status
            .followers
            .get(partition)
            .map(|f| (f.in_sync.as_slice(), f.lagging.as_slice()))
            .unwrap_or_default();
        if wanted > 1 || !followers.is_empty() {
            println!(
                "  partition {partition:>4}  leader {leader}  followers in sync [{}]{}{}",
                followers.join(", "),
                if lagging.is_empty() {
                    String::new()
                } else {
                    format!("  lagging [{}]", lagging.join(", "))
                },
                if 1 + followers.len() < wanted {
                    "  SHORT OF COPIES"
                } else {
                    ""
                }
            );
        }
    }
}
