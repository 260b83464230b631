//! What the user sees while the crawl runs and after it: the progress bar
//! (or line, off a terminal), how the crawl ended, and the summary.

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

/// Shows progress until the crawl is finished, Ctrl-C, or the time
/// limit: on a terminal a bar (pages done of URLs known, rate, ETA),
/// otherwise a plain line every two seconds.
pub async fn watch_progress(
    frontier: &Frontier,
    stats: &WorkerStats,
    started: Instant,
    time_limit_secs: Option<u64>,
) -> Ending {
    let mut view = if std::io::stderr().is_terminal() {
        View::Bar(bar())
    } else {
        View::Lines { printed: None }
    };
    // The end is looked for after reports (the counts are in memory), so
    // a crawl ends as its last report is taken, not at a tick; but since
    // counting walks every queue of the crawl, looks are spaced to ten
    // times what the last one took, and at least LOOK_GAP.
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut next_look = Instant::now();
    let ending = loop {
        tokio::select! {
            _ = &mut ctrl_c => break Ending::Interrupted,
            _ = ticker.tick() => {}
            () = stats.reported.notified() => {
                tokio::time::sleep_until(next_look.into()).await;
            }
        }
        let looking = Instant::now();
        let counts = frontier.counts(DEFAULT_CRAWL, "");
        next_look = looking + (10 * looking.elapsed()).max(LOOK_GAP);
        let figures = Figures {
            done: counts.completed,
            known: counts.urls,
            queued: counts.not_completed(),
            in_flight: stats.in_flight.load(Ordering::Relaxed),
            errors: stats.failures.load(Ordering::Relaxed)
                + stats.by_class[5].load(Ordering::Relaxed),
        };
        let finished = counts.urls > 0 && counts.completed == counts.urls;
        view.show(&figures, started.elapsed(), finished);
        if finished {
            break Ending::Finished;
        }
        if time_limit_secs.is_some_and(|limit| started.elapsed() >= Duration::from_secs(limit)) {
            break Ending::TimeLimit;
        }
    };
    if let View::Bar(bar) = view {
        // The bar stays, as the crawl's last figures; what follows starts
        // on a line of its own.
        bar.abandon();
        eprintln!();
    }
    ending
}

/// The counts progress is drawn from.
struct Figures {
    done: u64,
    known: u64,
    queued: u64,
    in_flight: u64,
    errors: u64,
}

enum View {
    Bar(indicatif::ProgressBar),
    Lines { printed: Option<Instant> },
}

/// The shortest time between two looks at the counts for the crawl's end.
const LOOK_GAP: Duration = Duration::from_millis(5);

/// How often the plain line is printed.
const LINE_EVERY: Duration = Duration::from_secs(2);

impl View {
    fn show(&mut self, figures: &Figures, elapsed: Duration, finished: bool) {
        match self {
            Self::Bar(bar) => {
                // The total grows as pages are discovered: the ETA is for
                // the URLs known so far.
                bar.set_length(figures.known);
                bar.set_position(figures.done);
                bar.set_message(format!(
                    "queued {}  in flight {}  errors {}",
                    figures.queued, figures.in_flight, figures.errors
                ));
            }
            Self::Lines { printed } => {
                if finished || printed.is_none_or(|at| at.elapsed() >= LINE_EVERY) {
                    *printed = Some(Instant::now());
                    eprintln!("{}", line(figures, elapsed));
                }
            }
        }
    }
}

/// The bar, drawn on stderr (stdout stays the summary's).
fn bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(0),
        indicatif::ProgressDrawTarget::stderr_with_hz(4),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:25}] {human_pos}/{human_len} pages  {rate}  \
             ETA {eta}  {wide_msg}",
        )
        .expect("the template is valid")
        .with_key(
            "rate",
            |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                let _ = write!(out, "{:.0}/s", state.per_sec());
            },
        )
        .progress_chars("=> "),
    );
    bar
}

/// The plain progress line, for logs and pipes.
fn line(figures: &Figures, elapsed: Duration) -> String {
    format!(
        "pages done {}  queued {}  in flight {}  {:.1}/s  errors {}",
        figures.done,
        figures.queued,
        figures.in_flight,
        figures.done as f64 / elapsed.as_secs_f64().max(0.001),
        figures.errors
    )
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
