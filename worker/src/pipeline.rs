//! The lease loop and the per-host pipelines.
//!
//! The loop holds as many queues (hosts) as its fetch slots can serve,
//! asking the frontier for several URLs of each at once. A held host
//! mostly waits out its delay without a slot, so a wide polite crawl
//! needs many more hosts than slots: while a slot stays free the loop
//! leases more hosts, a round every [`LEASE_ROUND`], and while every slot
//! is busy it leases none. `max_queues` caps the hosts held, when set. It
//! backs off briefly when the frontier has nothing due, and asks again as
//! soon as a host's batch is done.
//! Each leased batch runs as one host pipeline: its URLs are fetched back
//! to back, at most `per_host` at a time, and no request to the host starts
//! before every earlier one was answered and its delay (the frontier's,
//! carried on each served URL, or robots.txt's Crawl-delay if longer) has
//! passed since the latest answer. robots.txt's own read counts as a
//! request. Pacing from the answer, not the start, keeps the gaps as the
//! host sees them whatever the latency; a host's pace is shared by all its
//! batches and outlives them by the longest delay, since a plain v2.6
//! frontier may serve its next URLs before the last one was fetched. A
//! fetch holds one of `concurrency` slots; what follows it (outlinks
//! acknowledged, then the report) runs beside the next fetch.
//!
//! Our frontier serves a queue to one lease at a time and starts its delay
//! when the last URL of the lease is reported, so the gaps hold across
//! workers too. A URL is only started while its lease has room for a whole
//! fetch (or half the lease, if that is shorter); the rest of a batch, and
//! what is unstarted at shutdown or after a Retry-After, goes back to the
//! frontier due at once instead of waiting for its lease to run out.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proto::metadata;
use proto::urlfrontier::{GetParams, UrlInfo, get_params};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::WorkerConfig;
use crate::crawler::{Context, Fetch, LeasedPage, now_secs};
use crate::error::WorkerError;
use crate::frontier_link::meta_first;
use crate::pacing::Hosts;
pub use crate::pacing::{Pacer, Turn};
use crate::shutdown::Shutdown;
use crate::stats::WorkerStats;

/// How often the loop looks for idle slots to lease more hosts for: short
/// next to a polite delay, long enough for hosts just leased to take their
/// slots before more are asked for.
const LEASE_ROUND: Duration = Duration::from_millis(20);

/// Hosts asked for in one round, per idle slot: a host at a polite delay
/// keeps a slot busy only a small part of the time.
const HOSTS_PER_IDLE_SLOT: usize = 8;

/// Longest pause between leases while hosts are held and the frontier has
/// nothing due: a held host's queue is due again one delay after its last
/// report, and a later lease wastes its turn.
const IDLE_PAUSE_HOLDING: Duration = Duration::from_millis(50);

/// Longest pause between leases while nothing is held.
const IDLE_PAUSE_EMPTY: Duration = Duration::from_millis(250);

/// How many more hosts to ask for: none while every slot is busy (or at the
/// cap), else some for each idle slot, counting one when none is held.
fn hosts_wanted(held: usize, idle_slots: usize, cap: Option<usize>) -> usize {
    let room = cap.map_or(usize::MAX, |cap| cap.saturating_sub(held));
    let slots = if held == 0 {
        idle_slots.max(1)
    } else {
        idle_slots
    };
    (slots * HOSTS_PER_IDLE_SLOT).min(room)
}

/// The frontier's delay for a served URL's queue, when it says.
fn frontier_delay(info: &UrlInfo) -> Duration {
    meta_first(&info.metadata, metadata::QUEUE_DELAY_MS)
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

/// Runs until `shutdown` completes: stops leasing, gives fetches in
/// flight `shutdown_grace` to finish and report, gives unstarted URLs
/// back, flushes output.
pub async fn run(
    config: WorkerConfig,
    stats: Arc<WorkerStats>,
    signal: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let context = Arc::new(Context::open(config, stats)?);
    let (trigger, shutdown) = crate::shutdown::channel();
    let ((), hosts) = tokio::join!(
        async {
            signal.await;
            trigger.start();
        },
        lease(&context, shutdown),
    );
    context.finish(hosts).await;
    Ok(())
}

/// The lease loop, until the stop: answers the host pipelines still
/// running, which hear the stop too.
async fn lease(context: &Arc<Context>, mut shutdown: Shutdown) -> JoinSet<()> {
    let slots = Arc::new(Semaphore::new(context.config.concurrency));
    let paces = Arc::new(Hosts::new(Duration::from_secs(u64::from(
        context.config.max_crawl_delay_secs,
    ))));
    let mut hosts = JoinSet::new();
    let mut idle_rounds = 0_u32;
    loop {
        while let Some(done) = hosts.try_join_next() {
            host_ended(done);
        }
        metrics::gauge!("worker_hosts_held").set(hosts.len() as f64);
        let wanted = hosts_wanted(
            hosts.len(),
            slots.available_permits(),
            context.config.max_queues,
        );
        if wanted == 0 {
            // Every slot busy or the cap reached: more hosts would only
            // wait. Look again after a round, or when a host is let go.
            tokio::select! {
                () = shutdown.started() => break,
                Some(done) = hosts.join_next() => host_ended(done),
                () = tokio::time::sleep(LEASE_ROUND) => {}
            }
            continue;
        }
        let params = GetParams {
            max_urls_per_queue: context.config.lease_per_queue,
            max_queues: u32::try_from(wanted).unwrap_or(u32::MAX),
            key: String::new(),
            delay_requestable: context.config.lease_secs,
            item: context.config.crawl.clone().map(get_params::Item::CrawlId),
        };
        let leased_at = Instant::now();
        let leased = tokio::select! {
            () = shutdown.started() => break,
            leased = context.link.lease(params) => leased,
        };
        let infos = match leased {
            Ok(infos) => infos,
            Err(status) => {
                tracing::warn!(%status, "GetURLs failed; retrying");
                idle_rounds = idle_rounds.saturating_add(1);
                tokio::select! {
                    () = shutdown.started() => break,
                    () = tokio::time::sleep(crate::frontier_link::retry_delay(idle_rounds)) => {}
                }
                continue;
            }
        };
        if infos.is_empty() {
            // Nothing due: wait a little longer each time, or until a host
            // lets its queue go (it may be due again a delay later, and its
            // outlinks may be due at once).
            idle_rounds = idle_rounds.saturating_add(1);
            let longest = if hosts.is_empty() {
                IDLE_PAUSE_EMPTY
            } else {
                IDLE_PAUSE_HOLDING
            };
            let pause = Duration::from_millis(10_u64 << idle_rounds.min(5)).min(longest);
            tokio::select! {
                () = shutdown.started() => break,
                () = tokio::time::sleep(pause) => {}
                Some(done) = hosts.join_next(), if !hosts.is_empty() => {
                    host_ended(done);
                    idle_rounds = 0;
                }
            }
            continue;
        }
        idle_rounds = 0;
        let lease_end = leased_at + Duration::from_secs(u64::from(context.config.lease_secs));
        for batch in by_queue(infos) {
            let context = Arc::clone(context);
            let slots = Arc::clone(&slots);
            let shutdown = shutdown.clone();
            let paces = Arc::clone(&paces);
            hosts.spawn(async move {
                run_host(&context, batch, lease_end, &slots, &paces, shutdown).await;
            });
        }
        // Let the hosts just leased take their slots before counting the
        // idle ones again, unless a host is let go first: its queue may be
        // due again at once, and a crawl of few hosts would otherwise lose
        // a round between each host's batches.
        tokio::select! {
            () = shutdown.started() => break,
            () = tokio::time::sleep(LEASE_ROUND) => {}
            Some(done) = hosts.join_next() => host_ended(done),
        }
    }
    tracing::info!(hosts = hosts.len(), "stopping: no more leases");
    hosts
}

/// Logs a host pipeline that panicked; its URLs' leases run out.
fn host_ended(done: Result<(), tokio::task::JoinError>) {
    if let Err(error) = done {
        tracing::error!(%error, "a host pipeline failed");
    }
}

/// Served URLs grouped by their queue, in the order served.
fn by_queue(infos: Vec<UrlInfo>) -> Vec<Vec<UrlInfo>> {
    let mut batches: Vec<Vec<UrlInfo>> = Vec::new();
    for info in infos {
        match batches
            .iter_mut()
            .find(|b| b[0].crawl_id == info.crawl_id && b[0].key == info.key)
        {
            Some(batch) => batch.push(info),
            None => batches.push(vec![info]),
        }
    }
    batches
}

/// One host's leased URLs, fetched within its politeness.
async fn run_host(
    context: &Arc<Context>,
    batch: Vec<UrlInfo>,
    lease_end: Instant,
    slots: &Arc<Semaphore>,
    paces: &Hosts,
    mut shutdown: Shutdown,
) {
    let Some(key) = batch.first().map(|info| info.key.clone()) else {
        return;
    };
    let pace = paces.of(
        &key,
        context.config.per_host,
        context.config.unacked_per_host,
    );
    let mut tails = JoinSet::new();
    // Set by a fetch that met Retry-After: the rest waits for the frontier.
    let held_off = Arc::new(AtomicBool::new(false));
    // Room a URL needs in its lease: a whole fetch and its report, or half
    // the lease when that is shorter (a short lease still starts its URLs).
    let lease = Duration::from_secs(u64::from(context.config.lease_secs));
    let needed = (context.config.fetch.timeout + Duration::from_secs(5)).min(lease / 2);
    let mut pending = batch.into_iter();
    while let Some(info) = pending.next() {
        let frontier_delay = frontier_delay(&info);
        let mut page = LeasedPage::new(context, info);
        let prepared = page.prepare(context, &pace).await;
        let delay = frontier_delay.max(prepared.crawl_delay);
        let url = match prepared.go {
            Ok(url) => url,
            Err(outcome) => {
                let context = Arc::clone(context);
                tails.spawn(async move { page.finish(&context, Fetch::unfetched(outcome)).await });
                continue;
            }
        };
        let wait_for_turn = async {
            let (turn, unreported) = pace.take_turn(delay).await?;
            let slot = Arc::clone(slots).acquire_owned().await.ok()?;
            Some((turn, unreported, slot))
        };
        let permits = tokio::select! {
            permits = wait_for_turn => permits,
            () = shutdown.started() => None,
        };
        let late = Instant::now() + needed > lease_end;
        let (Some((turn, unreported, slot)), false, false) =
            (permits, late, held_off.load(Ordering::Acquire))
        else {
            give_back(context, std::iter::once(page.into_info()).chain(pending)).await;
            break;
        };
        let context = Arc::clone(context);
        let held_off = Arc::clone(&held_off);
        tails.spawn(async move {
            let fetch = page.fetch(&context, &url, turn, slot).await;
            if fetch.outcome.holds_off_the_host() {
                held_off.store(true, Ordering::Release);
            }
            page.finish(&context, fetch).await;
            drop(unreported);
        });
    }
    while let Some(done) = tails.join_next().await {
        if let Err(error) = done {
            tracing::error!(%error, "a fetch task failed");
        }
    }
}

/// Gives leased URLs back unfetched, due at once: the frontier serves them
/// again when the queue's turn comes, rather than when their leases end.
/// They travel together on the report stream, sharing its commits, rather
/// than each waiting for the one before (a slow host's lease may give back
/// most of its URLs).
async fn give_back(context: &Context, infos: impl Iterator<Item = UrlInfo>) {
    let due = now_secs().max(1);
    futures::future::join_all(infos.map(|mut info| {
        info.metadata.remove(metadata::QUEUE_DELAY_MS);
        context.link.put_known(info, due)
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(crawl: &str, key: &str, url: &str) -> UrlInfo {
        UrlInfo {
            url: url.into(),
            key: key.into(),
            crawl_id: crawl.into(),
            metadata: std::collections::BTreeMap::new(),
        }
    }

    #[test]
    fn hosts_are_leased_for_idle_slots_only_and_within_the_cap() {
        assert_eq!(hosts_wanted(0, 0, None), HOSTS_PER_IDLE_SLOT);
        assert_eq!(hosts_wanted(0, 4, None), 4 * HOSTS_PER_IDLE_SLOT);
        assert_eq!(hosts_wanted(5_000, 0, None), 0, "every slot busy");
        assert_eq!(hosts_wanted(5_000, 2, None), 2 * HOSTS_PER_IDLE_SLOT);
        assert_eq!(hosts_wanted(10, 64, Some(12)), 2);
        assert_eq!(hosts_wanted(12, 64, Some(12)), 0);
    }

    #[test]
    fn served_urls_group_by_queue_in_order() {
        let batches = by_queue(vec![
            info("c", "a", "1"),
            info("c", "b", "2"),
            info("c", "a", "3"),
            info("d", "a", "4"),
        ]);
        let urls: Vec<Vec<&str>> = batches
            .iter()
            .map(|b| b.iter().map(|i| i.url.as_str()).collect())
            .collect();
        assert_eq!(urls, vec![vec!["1", "3"], vec!["2"], vec!["4"]]);
    }

    #[test]
    fn the_pacer_spaces_starts_from_the_latest_answer() {
        let mut pacer = Pacer::default();
        let delay = Duration::from_millis(100);
        let t0 = Instant::now();
        assert_eq!(pacer.turn(delay, t0), Turn::Now);
        pacer.started();
        pacer.started();
        assert_eq!(pacer.turn(delay, t0), Turn::AfterAnswers);
        assert_eq!(pacer.turn(Duration::ZERO, t0), Turn::Now, "no delay");
        pacer.answered(t0 + Duration::from_millis(50));
        assert_eq!(pacer.turn(delay, t0), Turn::AfterAnswers, "one unanswered");
        pacer.answered(t0 + Duration::from_millis(20));
        assert_eq!(
            pacer.turn(delay, t0),
            Turn::At(t0 + Duration::from_millis(150)),
            "from the latest answer"
        );
        pacer.heard(t0 + Duration::from_millis(80));
        assert_eq!(
            pacer.turn(delay, t0),
            Turn::At(t0 + Duration::from_millis(180))
        );
        assert_eq!(
            pacer.turn(delay, t0 + Duration::from_millis(180)),
            Turn::Now
        );
    }

    #[test]
    fn the_frontier_delay_is_read_from_the_served_url() {
        let mut served = info("c", "a", "http://a/");
        assert_eq!(frontier_delay(&served), Duration::ZERO);
        served.metadata.insert(
            metadata::QUEUE_DELAY_MS.into(),
            crate::frontier_link::meta_value("50"),
        );
        assert_eq!(frontier_delay(&served), Duration::from_millis(50));
    }
}
