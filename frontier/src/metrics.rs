//! Prometheus metrics: recorded through the `metrics` facade where things
//! happen (puts and acks by status, skips by reason, leases, lease
//! expiries, commits and their latency, rebuilds), plus figures read at
//! scrape time (per-partition fill ratio, URL counts), served as text on
//! `GET /metrics` by the web endpoint ([`crate::dashboard`]).

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::service::Frontier;

/// Installs the process-wide Prometheus recorder; answers its handle, or
/// `None` when a recorder is installed already (the first one stays).
#[must_use]
pub fn install() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            &[
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
            ],
        )
        .ok()?
        .install_recorder()
        .ok()?;
    describe();
    Some(handle)
}

fn describe() {
    metrics::describe_counter!(
        "frontier_put_urls_total",
        "URLs put, by kind (discovered, known) and ack status (ok, skipped, fail)"
    );
    metrics::describe_counter!("frontier_skipped_urls_total", "URLs not stored, by reason");
    metrics::describe_counter!("frontier_leases_total", "URLs handed out by GetURLs");
    metrics::describe_counter!(
        "frontier_lease_expiries_total",
        "Leases that ran out before their URL was reported"
    );
    metrics::describe_counter!("frontier_commits_total", "Group-commit transactions");
    metrics::describe_histogram!(
        "frontier_commit_seconds",
        "Time of one group's stage: stage=\"urls\" logs it (synced) and applies it to urls.redb, stage=\"due\" applies its due entries to frontier.redb"
    );
    metrics::describe_counter!(
        "frontier_store_staging_file_reads_total",
        "Record keys groups looked up in urls.redb as they were staged with writes held: a discovered URL whose key the filters say is new needs none"
    );
    metrics::describe_histogram!(
        "frontier_checkpoint_seconds",
        "Time of one checkpoint, from waiting for the groups before it to both files made durable: no group is acknowledged meanwhile"
    );
    metrics::describe_counter!(
        "frontier_filter_rebuilds_total",
        "Partition filter rebuilds"
    );
    metrics::describe_gauge!(
        "frontier_partition_fill_ratio",
        "Fill ratio of each partition's filter"
    );
    metrics::describe_gauge!("frontier_filter_memory_bytes", "Memory of all filters");
    metrics::describe_gauge!("frontier_urls", "Stored URLs by state (completed, pending)");
    metrics::describe_counter!(
        "frontier_cluster_replica_copies_total",
        "New copies of partitions made on this node, by source: log (a lagging copy brought up to date with what its leader noted it missed) or whole (copied whole)"
    );
    metrics::describe_counter!(
        "frontier_address_lookups_total",
        "Hosts looked up before their first serve under politeness by address, by result (found, none)"
    );
    metrics::describe_counter!(
        "frontier_group_turns_total",
        "Asks for the turn of an address group this node keeps, by answer (granted, refused)"
    );
    for result in ["found", "none"] {
        metrics::counter!("frontier_address_lookups_total", "result" => result).increment(0);
    }
    for answer in ["granted", "refused"] {
        metrics::counter!("frontier_group_turns_total", "answer" => answer).increment(0);
    }
    for source in ["log", "whole"] {
        metrics::counter!("frontier_cluster_replica_copies_total", "source" => source).increment(0);
    }
    // Counters that may stay at zero for a long time are shown from the
    // start: a series that appears only on its first event reads as "no
    // data" in dashboards and breaks rate() until then.
    for counter in [
        "frontier_leases_total",
        "frontier_lease_expiries_total",
        "frontier_commits_total",
        "frontier_store_staging_file_reads_total",
        "frontier_filter_rebuilds_total",
    ] {
        metrics::counter!(counter).increment(0);
    }
}

/// Sets the gauges read at scrape time.
pub(crate) fn refresh(frontier: &Frontier) {
    let report = frontier.filter_report();
    for partition in &report.set.partitions {
        metrics::gauge!("frontier_partition_fill_ratio", "partition" => partition.partition.to_string())
            .set(partition.filter.fill_ratio);
    }
    metrics::gauge!("frontier_filter_memory_bytes").set(report.set.total.memory_bytes as f64);
    let (mut completed, mut pending) = (0, 0);
    for crawl in frontier.scheduler().crawls() {
        let counts = frontier.counts(&crawl, "");
        completed += counts.completed;
        pending += counts.not_completed();
    }
    metrics::gauge!("frontier_urls", "state" => "completed").set(completed as f64);
    metrics::gauge!("frontier_urls", "state" => "pending").set(pending as f64);
}
