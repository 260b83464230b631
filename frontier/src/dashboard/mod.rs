//! The web endpoint of `--http-listen`: Prometheus metrics on `/metrics`,
//! and a live, read-only dashboard on `/` whose page (its script and style
//! served beside it, nothing from elsewhere, so it works offline) polls
//! `/api/state`. The page writes every value it shows as text, under a
//! policy that runs no inline script; the endpoint holds a bounded number
//! of connections, each closed when it sends no request in time.
//!
//! `/api/state` answers this node's figures as JSON: per crawl, pages
//! done, queued, in flight and URLs known; the rates of the last fifteen
//! minutes, from totals sampled every five seconds; each partition's
//! filter health; the crawl's busiest queues (a bounded selection, so a
//! frontier of 100,000 queues answers as fast as one of ten); and, in a
//! cluster, its nodes. With `--admin-token` set it needs the token (the
//! page asks for it); `/metrics` stays open to scrapers, as before.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::auth::Access;
use crate::cluster::Cluster;
use crate::handback::Handback;
use crate::service::{DEFAULT_CRAWL, Frontier, SharedFrontier};
use crate::time::Timestamp;

/// The page, its script and its style, served as they are. The script is
/// a file of its own so that the page's policy allows no inline script.
const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// What the browser may load and run for the page: its own script and
/// style, its own data, nothing inline, nothing framing it. Markup that
/// reached the page from a client's data (a crawl ID, a queue key, an
/// outcome class) could thus run nothing, on top of the page writing
/// every value as text.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// Connections of the web endpoint at once; one past it is closed at once.
const MAX_CONNECTIONS: usize = 256;

/// How long a connection may take to send a request's headers, and how
/// long it may sit idle between requests: a client that holds a connection
/// open without a request (slowloris) loses it after this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How often totals are sampled for the rate chart.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples kept: fifteen minutes.
const SAMPLES: usize = 180;

/// Queues listed, busiest first.
const TOP_QUEUES: usize = 25;

/// Crawls listed, those with the most URLs first: the page's data stays
/// small whatever the number of crawls.
const TOP_CRAWLS: usize = 50;

/// Error classes shown, over every crawl; the rest count as "other".
const TOP_CLASSES: usize = 32;

/// Outcomes reports name that are not errors: a page fetched, or a
/// redirect followed.
const SUCCESSES: [&str; 2] = ["fetched", "redirect"];

/// Totals over every crawl at one moment.
#[derive(Debug, Clone, Default)]
struct Sample {
    at_secs: u64,
    completed: u64,
    known: u64,
    duplicates: u64,
    other_skips: u64,
    // Reports by the outcome they name.
    outcomes: BTreeMap<String, u64>,
}

impl Sample {
    fn errors(&self) -> u64 {
        self.outcomes
            .iter()
            .filter(|(name, _)| !SUCCESSES.contains(&name.as_str()))
            .map(|(_, count)| count)
            .sum()
    }
}

/// What the endpoint serves from; shared by its connections.
pub struct Dashboard {
    // Weak, so that a clean shutdown can take the frontier back once the
    // endpoint has stopped.
    frontier: Weak<Handback<Frontier>>,
    access: Access,
    // Weak too: the cluster holds the frontier.
    cluster: OnceLock<Weak<Cluster>>,
    history: Mutex<VecDeque<Sample>>,
    started: std::time::Instant,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard").finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard over `frontier`, its data guarded by `access`'s token.
    #[must_use]
    pub fn new(frontier: &SharedFrontier, access: Access) -> Arc<Self> {
        Arc::new(Self {
            frontier: Arc::downgrade(frontier),
            access,
            cluster: OnceLock::new(),
            history: Mutex::new(VecDeque::with_capacity(SAMPLES + 1)),
            started: std::time::Instant::now(),
        })
    }

    /// The cluster this node joined (after the endpoint started): its
    /// nodes and partition owners join the page.
    pub fn set_cluster(&self, cluster: &Arc<Cluster>) {
        let _ = self.cluster.set(Arc::downgrade(cluster));
    }

    fn cluster(&self) -> Option<Arc<Cluster>> {
        self.cluster.get().and_then(Weak::upgrade)
    }

    /// Takes one sample of the totals; the endpoint does so every
    /// [`SAMPLE_EVERY`].
    pub fn sample(&self) {
        let Some(frontier) = self.frontier.upgrade() else {
            return;
        };
        let now = Timestamp::now();
        let mut sample = Sample {
            at_secs: now.unix_secs(),
            ..Sample::default()
        };
        for crawl in frontier.scheduler().crawls() {
            let counts = frontier.scheduler().counts(&crawl, None, now);
            sample.completed += counts.completed;
            sample.known += counts.urls;
            for (name, count) in frontier.reported_outcomes(&crawl) {
                let name =
                    if sample.outcomes.len() < TOP_CLASSES || sample.outcomes.contains_key(&name) {
                        name
                    } else {
                        "other".to_owned()
                    };
                *sample.outcomes.entry(name).or_default() += count;
            }
            for (reason, count) in frontier.skipped(&crawl) {
                if reason == "duplicate" {
                    sample.duplicates += count;
                } else {
                    sample.other_skips += count;
                }
            }
        }
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        history.push_back(sample);
        while history.len() > SAMPLES + 1 {
            history.pop_front();
        }
    }

    /// The page's data, as JSON.
    #[must_use]
    pub fn state(&self) -> Value {
        let Some(frontier) = self.frontier.upgrade() else {
            return json!({ "error": "the frontier is shutting down" });
        };
        let now = Timestamp::now();
        let scheduler = frontier.scheduler();
        let mut crawls = scheduler.crawls();
        if crawls.is_empty() {
            crawls.push(DEFAULT_CRAWL.to_owned());
        }
        let mut counted: Vec<(&String, crate::scheduler::QueueCounts)> = crawls
            .iter()
            .map(|crawl| (crawl, scheduler.counts(crawl, None, now)))
            .collect();
        let crawl_count = counted.len();
        if counted.len() > TOP_CRAWLS {
            counted.select_nth_unstable_by_key(TOP_CRAWLS - 1, |(_, counts)| {
                std::cmp::Reverse(counts.urls)
            });
            counted.truncate(TOP_CRAWLS);
            counted.sort_by_key(|(crawl, _)| *crawl);
        }
        let crawl_rows: Vec<Value> = counted
            .into_iter()
            .map(|(crawl, counts)| {
                json!({
                    "id": crawl,
                    "done": counts.completed,
                    "queued": counts.not_completed().saturating_sub(counts.leased),
                    "in_flight": counts.leased,
                    "known": counts.urls,
                    "queues": counts.queues,
                    "active_queues": counts.active_queues,
                    "revisit": frontier.ingest().revisit_policy(crawl).0.to_string(),
                })
            })
            .collect();
        let busiest = &crawls[0];
        let cluster = self.cluster();
        json!({
            "node": cluster.as_ref().map_or("", |c| c.node_id()),
            "uptime_secs": self.started.elapsed().as_secs(),
            "crawls": crawl_rows,
            "crawl_count": crawl_count,
            "rates": self.rates(),
            "filters": filter_state(&frontier, cluster.as_ref()),
            "queues": {
                "crawl": busiest,
                "top": scheduler.busiest_queues(busiest, TOP_QUEUES, now),
            },
            "cluster": cluster.as_deref().map(cluster_state),
        })
    }

    fn rates(&self) -> Value {
        rates_of(&self.history.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Per second between successive samples, oldest first.
fn rates_of(history: &VecDeque<Sample>) -> Value {
    let mut series: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut at = Vec::new();
    for (before, after) in history.iter().zip(history.iter().skip(1)) {
        let secs = after.at_secs.saturating_sub(before.at_secs).max(1) as f64;
        let per_sec = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        at.push(after.at_secs);
        for (name, value) in [
            ("pages", per_sec(before.completed, after.completed)),
            ("discovered", per_sec(before.known, after.known)),
            ("duplicates", per_sec(before.duplicates, after.duplicates)),
            (
                "other_skips",
                per_sec(before.other_skips, after.other_skips),
            ),
            ("errors", per_sec(before.errors(), after.errors())),
        ] {
            series.entry(name).or_default().push(value);
        }
    }
    // Errors by class: totals, and per second between the last two
    // samples.
    let mut by_class = BTreeMap::new();
    if let Some(last) = history.back() {
        let before = history.iter().rev().nth(1);
        let secs = before.map_or(1, |b| last.at_secs.saturating_sub(b.at_secs).max(1)) as f64;
        for (name, total) in &last.outcomes {
            if SUCCESSES.contains(&name.as_str()) {
                continue;
            }
            let earlier = before.and_then(|b| b.outcomes.get(name)).copied();
            let per_sec = earlier.map(|e| total.saturating_sub(e) as f64 / secs);
            by_class.insert(name.clone(), json!({ "total": total, "per_sec": per_sec }));
        }
    }
    json!({
        "every_secs": SAMPLE_EVERY.as_secs(),
        "at": at,
        "series": series,
        "errors_by_class": by_class,
    })
}

/// Each partition's filter health, and its owner in a cluster.
fn filter_state(frontier: &Frontier, cluster: Option<&Arc<Cluster>>) -> Value {
    let report = frontier.filter_report();
    let owners = cluster.and_then(|c| c.view().map.as_ref().map(|m| m.owners.clone()));
    let partitions: Vec<Value> = report
        .set
        .partitions
        .iter()
        .zip(&report.partitions)
        .map(|(health, figures)| {
            let observed = &figures.observed;
            json!({
                "partition": health.partition,
                "fill": health.filter.fill_ratio,
                "estimated_fp": health.filter.estimated_fp_rate,
                "refuted": observed.refuted_maybes,
                "lookups": observed.absent_lookups,
                "observed_fp": if observed.absent_lookups > 0 {
                    observed.refuted_maybes as f64 / observed.absent_lookups as f64
                } else {
                    0.0
                },
                "stored": figures.stored,
                "rebuilds": health.rebuilds,
                "rebuilding": health.rebuilding,
                "node": owners.as_ref().and_then(|o| o.get(health.partition)),
            })
        })
        .collect();
    json!({
        "rebuild_fill": report.rebuild_fill_threshold,
        "target_fp": report.target_fp_rate,
        "memory_bytes": report.set.total.memory_bytes,
        "partitions": partitions,
    })
}

/// The cluster's nodes as this node sees them.
fn cluster_state(cluster: &Cluster) -> Value {
    let view = cluster.view();
    let owners = view
        .map
        .as_ref()
        .map(|m| m.owners.clone())
        .unwrap_or_default();
    let nodes: Vec<Value> = view
        .members
        .values()
        .map(|member| {
            json!({
                "id": member.id,
                "address": member.address,
                "partitions": owners.iter().filter(|o| **o == member.id).count(),
                "leader": view.leader.as_deref() == Some(member.id.as_str()),
                "draining": view.draining.contains(&member.id),
            })
        })
        .collect();
    json!({
        "name": cluster.name(),
        "epoch": view.map.as_ref().map_or(0, |m| m.epoch),
        "nodes": nodes,
        "moves": view.moves.len(),
    })
}

/// Serves `/metrics`, `/` and `/api/state` until `shutdown` completes,
/// sampling the totals for the chart meanwhile.
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    dashboard: Arc<Dashboard>,
    shutdown: impl Future<Output = ()>,
) {
    let sampler = {
        let dashboard = Arc::clone(&dashboard);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            loop {
                every.tick().await;
                let dashboard = Arc::clone(&dashboard);
                let _ = tokio::task::spawn_blocking(move || dashboard.sample()).await;
            }
        })
    };
    tokio::pin!(shutdown);
    static REFUSED: crate::throttle::Throttle =
        crate::throttle::Throttle::new(Duration::from_secs(10));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if let Some(suppressed) = REFUSED.admit() {
                tracing::warn!(
                    limit = MAX_CONNECTIONS,
                    suppressed,
                    "too many web connections; closing a new one"
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let dashboard = Arc::clone(&dashboard);
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                answer(request, Arc::clone(&dashboard), handle.clone())
            });
            // HTTP/1.1 only: a browser and a scraper need no more, and its
            // header timeout also closes a connection idle between requests.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            drop(slot);
        });
    }
    sampler.abort();
}

async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    dashboard: Arc<Dashboard>,
    handle: PrometheusHandle,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let response = |status: u16, kind: &str, body: Bytes| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", kind)
            .header("cache-control", "no-store")
            .header("content-security-policy", CONTENT_SECURITY_POLICY)
            .header("x-content-type-options", "nosniff")
            .header("x-frame-options", "DENY")
            .header("referrer-policy", "no-referrer")
            .body(Full::new(body))
            .unwrap_or_default()
    };
    // HEAD answers as GET does; hyper leaves the body out.
    if request.method() != hyper::Method::GET && request.method() != hyper::Method::HEAD {
        return Ok(response(
            405,
            "text/plain",
            Bytes::from_static(b"read-only\n"),
        ));
    }
    Ok(match request.uri().path() {
        "/metrics" => {
            let frontier = dashboard.frontier.clone();
            let text = tokio::task::spawn_blocking(move || {
                if let Some(frontier) = frontier.upgrade() {
                    crate::metrics::refresh(&frontier);
                }
                handle.render()
            })
            .await
            .unwrap_or_default();
            response(200, "text/plain; version=0.0.4", Bytes::from(text))
        }
        "/" | "/index.html" => response(
            200,
            "text/html; charset=utf-8",
            Bytes::from_static(PAGE.as_bytes()),
        ),
        "/dashboard.js" => response(
            200,
            "text/javascript; charset=utf-8",
            Bytes::from_static(SCRIPT.as_bytes()),
        ),
        "/dashboard.css" => response(
            200,
            "text/css; charset=utf-8",
            Bytes::from_static(STYLE.as_bytes()),
        ),
        "/api/state" if !dashboard.access.holds_token(request.headers()) => response(
            401,
            "application/json",
            Bytes::from_static(br#"{"error":"the admin token is needed"}"#),
        ),
        "/api/state" => {
            let state = tokio::task::spawn_blocking(move || dashboard.state())
                .await
                .unwrap_or_else(|_| json!({ "error": "state failed" }));
            response(200, "application/json", Bytes::from(state.to_string()))
        }
        _ => response(
            404,
            "text/plain",
            Bytes::from_static(b"the dashboard is at /, metrics at /metrics\n"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_between_samples() {
        let sample = |at_secs, completed, known, duplicates, errors: u64| Sample {
            at_secs,
            completed,
            known,
            duplicates,
            outcomes: [
                ("fetched".to_owned(), completed),
                ("server_error".to_owned(), errors),
            ]
            .into(),
            ..Sample::default()
        };
        let history: VecDeque<Sample> = [
            sample(100, 0, 10, 0, 0),
            sample(105, 50, 110, 5, 10),
            sample(110, 50, 110, 5, 15),
        ]
        .into();
        let rates = rates_of(&history);
        assert_eq!(rates["at"], json!([105, 110]));
        assert_eq!(rates["series"]["pages"], json!([10.0, 0.0]));
        assert_eq!(rates["series"]["discovered"], json!([20.0, 0.0]));
        assert_eq!(rates["series"]["duplicates"], json!([1.0, 0.0]));
        // Fetched pages are not errors; server errors are, by class.
        assert_eq!(rates["series"]["errors"], json!([2.0, 1.0]));
        assert_eq!(
            rates["errors_by_class"],
            json!({ "server_error": { "total": 15, "per_sec": 1.0 } })
        );
        // One sample: no rate yet.
        let one: VecDeque<Sample> = [sample(100, 1, 1, 0, 0)].into();
        assert_eq!(rates_of(&one)["at"], json!([]));
    }
}
