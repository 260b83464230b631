//! In-process ingest throughput: batches of 256 discovered URLs over 10 000
//! hosts, 45% of them already known, from several writer threads sharing
//! group commits, every batch durable before its answer.
//!
//! `cargo bench -p frontier --bench ingest [-- --urls N --writers W]`
//! (defaults 1 000 000 URLs, 4 writers). This measures ingest without the
//! gRPC layer; `--bench grpc` measures it through the server.

use std::time::Instant;

use frontier::ingest::{DedupMode, Discovered, FilterConfig, Ingest, Outcome};
use frontier::scope::Rules;
use frontier::store::Store;

mod common;
use common::arg;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total = arg(&args, "--urls", 1_000_000);
    let writers = arg(&args, "--writers", 4);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = FilterConfig {
        partitions: 64,
        expected_urls_per_partition: (total as u64 / 64).max(1) * 2,
        fp_rate: 0.001,
        ..FilterConfig::default()
    };
    let ingest = Ingest::open(
        Store::open(dir.path()).unwrap(),
        config,
        DedupMode::Exact,
        2048,
    )
    .unwrap();
    let rules = Rules::default();
    let batches = total / 256;
    let start = Instant::now();
    let (stored, skipped): (usize, usize) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|writer| {
                let (ingest, rules) = (&ingest, &rules);
                scope.spawn(move || {
                    let (mut stored, mut skipped) = (0, 0);
                    for batch in (writer..batches).step_by(writers) {
                        let items: Vec<Discovered> = (0..256)
                            .map(|i| Discovered {
                                url: common::url(batch, batch * 256 + i),
                                depth: 1,
                                ..Discovered::default()
                            })
                            .collect();
                        for outcome in ingest.put_discovered("bench", &items, rules, 1).unwrap() {
                            if outcome == Outcome::Stored {
                                stored += 1;
                            } else {
                                skipped += 1;
                            }
                        }
                    }
                    (stored, skipped)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    let seconds = start.elapsed().as_secs_f64();
    // Deletion: one host's queue in exact mode (the store alone), then the
    // rebuild of its partition that Bloom mode adds so the filter forgets.
    let queue = "host57.example.com";
    let deleting = Instant::now();
    let removed = ingest.delete("bench", Some(queue), None).unwrap();
    let delete_ms = deleting.elapsed().as_secs_f64() * 1000.0;
    let partition = *removed.per_partition.keys().next().unwrap_or(&0) as usize;
    let keys = ingest.stored_in_partition(partition).unwrap_or(0);
    let rebuilding = Instant::now();
    ingest.rebuild_partition(partition, keys * 2).unwrap();
    let rebuild_ms = rebuilding.elapsed().as_secs_f64() * 1000.0;
    let size: u64 = [frontier::store::FILE_NAME, frontier::store::URLS_FILE_NAME]
        .iter()
        .map(|name| std::fs::metadata(dir.path().join(name)).map_or(0, |m| m.len()))
        .sum();
    println!("| URLs offered | writers | stored | skipped | seconds | URLs/s offered | store MB |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {writers} | {stored} | {skipped} | {seconds:.1} | {:.0} | {:.0} |",
        stored + skipped,
        (stored + skipped) as f64 / seconds,
        size as f64 / 1e6
    );
    println!();
    println!(
        "DeleteQueue of {queue}: {} URLs in {delete_ms:.1} ms; Bloom mode adds the rebuild of partition {partition} ({keys} keys): {rebuild_ms:.1} ms",
        removed.urls
    );
}
