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
