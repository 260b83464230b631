//! What the user sees while the crawl runs and after it: the progress
//! line, how the crawl ended, and the summary.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use frontier::service::{DEFAULT_CRAWL, Frontier};
use worker::crawler::WorkerStats;

/// How the crawl ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Finished,
    Interrupted,
    TimeLimit,
}

/// Prints the progress line until the crawl is finished, Ctrl-C, or the
/// time limit.
pub async fn watch_progress(
    frontier: &Frontier,
    stats: &WorkerStats,
    started: Instant,
    time_limit_secs: Option<u64>,
) -> Ending {
    let tty = std::io::stderr().is_terminal();
    let print_every = Duration::from_millis(if tty { 250 } else { 2000 });
    // The end is looked for often (the counts are in memory), so a short
    // crawl does not wait out a printing interval to finish.
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let mut printed: Option<Instant> = None;
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
        let finished = counts.urls > 0 && counts.completed == counts.urls;
        if finished || printed.is_none_or(|at| at.elapsed() >= print_every) {
            printed = Some(Instant::now());
            if tty {
                eprint!("\r{line}\x1b[K");
            } else {
                eprintln!("{line}");
            }
        }
        if finished {
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

/// The summary printed when the crawl stops.
pub fn summarize(
    frontier: &Frontier,
    stats: &WorkerStats,
    started: Instant,
    ending: Ending,
    out: &std::path::Path,
) -> anyhow::Result<String> {
    let progress = frontier.progress(DEFAULT_CRAWL)?;
    let health = frontier.filter_report();
    let total = &health.set.total;
    let (refuted, lookups) = health.partitions.iter().fold((0, 0), |acc, p| {
        (
            acc.0 + p.observed.refuted_maybes,
            acc.1 + p.observed.absent_lookups,
        )
    });
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
        "  links sent {}, kept back by the seen cache {}",
        stats.links_sent.load(Ordering::Relaxed),
        stats.links_cached.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        text,
        "  filters: {} keys in {} partitions, {} bytes, fill {:.4}, estimated FP {:.2e}, observed FP {}/{} maybes refuted, {} rebuilds",
        health.partitions.iter().map(|p| p.stored).sum::<u64>(),
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
