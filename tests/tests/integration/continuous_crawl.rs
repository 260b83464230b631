//! Continuous crawling as users run it: `frontier serve --revisit
//! adaptive`, a worker, and a site whose pages change on schedules. The
//! frontier brings pages back as often as they change; the worker asks
//! conditionally, and archives what did not change as WARC revisit
//! records.

use std::collections::BTreeMap;
use std::time::Duration;

use crawl_tests::{FrontierProcess, WorkerProcess, frontier_cli};
use mock_site::changing::{ChangingConfig, ChangingSite, Fetch};

/// The frontier's flags: revisits between 1 s and 30 s, so that a policy
/// converges within the test's minute.
const FRONTIER_ARGS: [&str; 10] = [
    "--partitions",
    "4",
    "--default-delay-ms",
    "0",
    "--revisit",
    "adaptive",
    "--revisit-min-secs",
    "1",
    "--revisit-max-secs",
    "30",
];

const WORKER_ARGS: [&str; 4] = ["--concurrency", "4", "--retry-base-secs", "1"];

fn by_page(fetches: &[Fetch]) -> BTreeMap<&str, Vec<&Fetch>> {
    let mut pages: BTreeMap<&str, Vec<&Fetch>> = BTreeMap::new();
    for fetch in fetches {
        pages.entry(fetch.path.as_str()).or_default().push(fetch);
    }
    pages
}

fn mean_fetches(pages: &BTreeMap<&str, Vec<&Fetch>>, kind: &str) -> f64 {
    let counts: Vec<usize> = pages
        .iter()
        .filter(|(path, _)| path.starts_with(kind))
        .map(|(_, fetches)| fetches.len())
        .collect();
    counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64
}

/// A continuous crawl under way: `frontier serve` with `args` on
/// `dir/data`, one worker writing to `dir/out`, and the changing site
/// (whose clock starts with the crawl), seeded.
struct Crawl {
    frontier: FrontierProcess,
    worker: WorkerProcess,
    site: ChangingSite,
    out: std::path::PathBuf,
}

async fn crawl(dir: &std::path::Path, args: &[&str], config: ChangingConfig) -> Crawl {
    let frontier = FrontierProcess::start(&dir.join("data"), args);
    let out = dir.join("out");
    let worker = WorkerProcess::start(&frontier.endpoint(), &out, "w1", &WORKER_ARGS);
    let site = ChangingSite::start(config).await.unwrap();
    let (status, text) = frontier_cli(
        &frontier.endpoint(),
        &["seed", &format!("{}/", site.base())],
    );
    assert!(status.success(), "{text}");
    Crawl {
        frontier,
        worker,
        site,
        out,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_crawl_follows_each_page_and_archives_unchanged_ones_as_revisits() {
    let dir = tempfile::tempdir().unwrap();
    let Crawl {
        frontier,
        worker,
        site,
        out,
    } = crawl(dir.path(), &FRONTIER_ARGS, ChangingConfig::default()).await;
    let endpoint = frontier.endpoint();
    // A crawl that revisits is never done: the wait ends once it has
    // caught up with its first pass.
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "60"]);
    assert!(status.success(), "{text}");
    assert!(
        text.contains("caught up: nothing due before the next revisit"),
        "{text}"
    );
    assert!(
        text.contains("revisit adaptive between 1 and 30 s"),
        "{text}"
    );
    // The crawl runs for a minute of the site's clock: the span observed.
    let span = Duration::from_secs(60);
    tokio::time::sleep(span.saturating_sub(site.elapsed())).await;
    let until = site.elapsed();
    assert!(worker.terminate().success());

    let fetches = site.fetches();
    let pages = by_page(&fetches);
    for page in site.pages() {
        assert!(pages.contains_key(page.as_str()), "{page} never fetched");
    }
    // Pages that never change: every fetch after the first is conditional,
    // and at least nine in ten are answered 304.
    let revisits: Vec<&&Fetch> = pages
        .iter()
        .filter(|(path, _)| path.starts_with("/fixed/"))
        .flat_map(|(_, fetches)| fetches.iter().skip(1))
        .collect();
    assert!(!revisits.is_empty());
    assert!(revisits.iter().all(|f| f.conditional), "{revisits:?}");
    let not_modified = revisits.iter().filter(|f| f.status == 304).count();
    assert!(
        not_modified * 10 >= revisits.len() * 9,
        "{not_modified} of {} revisits answered 304",
        revisits.len()
    );
    // And they are fetched far less often than the pages that change
    // every few seconds.
    let (fast, fixed) = (
        mean_fetches(&pages, "/fast/"),
        mean_fetches(&pages, "/fixed/"),
    );
    assert!(fast >= 2.0 * fixed, "fast {fast:.1} fixed {fixed:.1}");
    let freshness: Vec<f64> = pages
        .keys()
        .filter(|path| path.starts_with("/fast/"))
        .map(|path| site.freshness(path, until).unwrap())
        .collect();
    let mean_freshness = freshness.iter().sum::<f64>() / freshness.len() as f64;
    eprintln!(
        "fetches a page: fast {fast:.1}, fixed {fixed:.1}; 304s {not_modified}/{}; fast pages fresh {mean_freshness:.2}",
        revisits.len()
    );
    assert!(mean_freshness >= 0.4, "fast pages fresh {freshness:?}");

    // Each 304 is archived as a revisit record of its profile, referring
    // to the capture it repeats; each 200 as a response. (The site's
    // other answers, such as its 404 for /sitemap.xml, are not pages.)
    let records: Vec<_> = worker::output::read_archive(&out)
        .unwrap()
        .into_iter()
        .filter(|r| pages.contains_key(r.target.trim_start_matches(&site.base())))
        .collect();
    let revisit_records: Vec<_> = records.iter().filter(|r| r.kind == "revisit").collect();
    let answered_304 = fetches.iter().filter(|f| f.status == 304).count();
    let answered_200 = fetches.iter().filter(|f| f.status == 200).count();
    assert_eq!(revisit_records.len(), answered_304);
    assert_eq!(
        records.iter().filter(|r| r.kind == "response").count(),
        answered_200
    );
    for record in revisit_records {
        assert_eq!(record.version, "1.1");
        assert_eq!(
            record.fields["warc-profile"],
            "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
        );
        assert_eq!(record.fields["warc-refers-to-target-uri"], record.target);
        let earlier = records.iter().find(|r| {
            r.kind == "response"
                && r.target == record.target
                && r.fields.get("warc-date") == record.fields.get("warc-refers-to-date")
        });
        assert!(earlier.is_some(), "no capture for {record:?}");
        let head = String::from_utf8_lossy(&record.block);
        assert!(head.starts_with("HTTP/1.1 304"), "{head}");
    }
}

/// Each page's revisit history as the frontier holds it (CheckUrl).
async fn histories(
    frontier: &FrontierProcess,
    site: &ChangingSite,
) -> BTreeMap<String, (frontier::revisit::History, u64)> {
    let mut admin = frontier.admin().await;
    let mut held = BTreeMap::new();
    for page in site.pages() {
        let url = format!("{}{page}", site.base());
        let answer = admin
            .check_url(proto::admin::CheckUrlRequest {
                url: url.clone(),
                ..proto::admin::CheckUrlRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        let Some(stored) = answer.stored else {
            panic!("{url} is not stored");
        };
        let history = stored
            .metadata
            .get(proto::metadata::REVISIT)
            .and_then(|values| proto::metadata::RevisitState::of(&values.values))
            .map(|state| frontier::revisit::History::of_state(&state))
            .unwrap_or_default();
        held.insert(page, (history, stored.due_at));
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontier_killed_during_a_continuous_crawl_loses_no_url_and_no_history() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Short leases: the restarted frontier serves again once the leases
    // handed out before the kill have run out.
    let mut args = FRONTIER_ARGS.to_vec();
    args.extend(["--lease-secs", "5"]);
    let Crawl {
        frontier,
        worker: _worker,
        site,
        ..
    } = crawl(dir.path(), &args, ChangingConfig::default()).await;
    let listen = frontier.addr.to_string();
    // Several rounds of revisits, then a snapshot of what was acknowledged
    // and a kill while the crawl goes on.
    site.fetched_at_least(80).await;
    let before = histories(&frontier, &site).await;
    frontier.kill();
    let fetched_at_kill = site.fetches().len();
    let frontier = FrontierProcess::start_on(&data, &listen, &args);
    let after = histories(&frontier, &site).await;
    for (page, (was, _)) in &before {
        let (now, due_at) = after[page];
        assert!(
            now.last_fetched >= was.last_fetched && now.fetches >= was.fetches,
            "{page}: history went back from {was:?} to {now:?}"
        );
        assert!(due_at > 0, "{page} is no longer due");
    }
    assert!(
        before.values().any(|(h, _)| h.fetches >= 2),
        "revisits before the kill: {before:?}"
    );
    // The schedule resumes: every page that changes every few seconds is
    // fetched again after the restart.
    site.fetched_at_least(fetched_at_kill + 60).await;
    let resumed = site.fetches();
    for page in site.pages().iter().filter(|p| p.starts_with("/fast/")) {
        assert!(
            resumed[fetched_at_kill..].iter().any(|f| &f.path == page),
            "{page} not fetched since the restart"
        );
    }
    let progress = frontier.progress().await;
    assert_eq!(progress.completed, 0, "{progress:?}");
    assert!(progress.discovered >= site.pages().len() as u64);
}

/// A server that sends the whole page whatever the request says: the
/// worker finds an unchanged page by its payload digest, and archives it
/// as a revisit of profile identical-payload-digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_sent_again_unchanged_is_archived_as_an_identical_payload_revisit() {
    let dir = tempfile::tempdir().unwrap();
    let config = ChangingConfig {
        fast: 0,
        slow: 0,
        fixed: 3,
        answers_304: false,
        ..ChangingConfig::default()
    };
    let Crawl {
        frontier: _frontier,
        worker,
        site,
        out,
    } = crawl(dir.path(), &FRONTIER_ARGS, config).await;
    // Each of the 4 pages fetched three times: twice again unchanged.
    site.fetched_at_least(12).await;
    assert!(worker.terminate().success());
    let fetches = site.fetches();
    assert!(fetches.iter().all(|f| f.status == 200));
    let records = worker::output::read_archive(&out).unwrap();
    for page in site.pages() {
        let url = format!("{}{page}", site.base());
        let responses: Vec<_> = records
            .iter()
            .filter(|r| r.target == url && r.kind == "response")
            .collect();
        let revisits: Vec<_> = records
            .iter()
            .filter(|r| r.target == url && r.kind == "revisit")
            .collect();
        let fetched = fetches.iter().filter(|f| f.path == page).count();
        assert_eq!(responses.len(), 1, "{page}: one capture of its content");
        assert_eq!(revisits.len(), fetched - 1, "{page}");
        for revisit in revisits {
            assert_eq!(
                revisit.fields["warc-profile"],
                "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
            );
            assert_eq!(
                revisit.fields["warc-payload-digest"],
                responses[0].fields["warc-payload-digest"]
            );
            assert_eq!(
                revisit.fields.get("warc-refers-to-date"),
                responses[0].fields.get("warc-date")
            );
        }
    }
}
