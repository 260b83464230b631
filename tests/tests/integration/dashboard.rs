//! The frontier's web dashboard in a real browser: headless Chromium loads
//! it against a frontier that crawled the mock site and holds URLs still
//! queued, and what the page shows is checked against the frontier's own
//! figures (its admin API). With an admin token, the page shows nothing
//! until given it. Skipped, saying so, where Chromium is not installed;
//! `.ci/run` installs it.

use std::collections::BTreeMap;

use crawl_tests::{
    FrontierProcess, WorkerProcess, chromium_or_skip, frontier_cli, http_get, http_request,
    rendered_dom,
};
use mock_site::{MockSite, SiteConfig};

/// The text of each `<td>` of the table row whose `attribute` is `value`,
/// by the cell's class (cells without one by position).
fn row_cells(dom: &str, attribute: &str, value: &str) -> BTreeMap<String, String> {
    let start = dom
        .find(&format!("{attribute}=\"{value}\""))
        .unwrap_or_else(|| panic!("no row {attribute}={value} in the page:\n{dom}"));
    let row = &dom[start..start + dom[start..].find("</tr>").expect("a closed row")];
    let cell = regex::Regex::new(r#"<td(?: class="([^"]*)")?>([^<]*)</td>"#).unwrap();
    cell.captures_iter(row)
        .enumerate()
        .map(|(i, found)| {
            let name = found
                .get(1)
                .map_or(i.to_string(), |c| c.as_str().to_owned());
            (name, found[2].replace(',', ""))
        })
        .collect()
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// When the newest rate of an `/api/state` answer was sampled (0: none).
fn last_sample_secs(answer: &str) -> u64 {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let state: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    state["rates"]["at"]
        .as_array()
        .and_then(|at| at.last())
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_what_the_frontier_says() {
    let Some(chromium) = chromium_or_skip("the_dashboard_shows_what_the_frontier_says") else {
        return;
    };
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--http-listen",
            "127.0.0.1:0",
            "--partitions",
            "16",
            "--default-delay-ms",
            "0",
            "--max-depth",
            "40",
        ],
    );
    let endpoint = frontier.endpoint();
    let worker = WorkerProcess::start(
        &endpoint,
        &dir.path().join("out"),
        "w1",
        &["--retry-base-secs", "1", "--max-body-bytes", "1048576"],
    );
    let (status, text) = frontier_cli(&endpoint, &["seed", &format!("{}/", site.base())]);
    assert!(status.success(), "{text}");
    let (status, text) = frontier_cli(&endpoint, &["status", "--wait", "--timeout-secs", "120"]);
    assert!(status.success(), "crawl did not finish: {text}");
    let crawl_ended_secs = unix_secs();
    assert!(worker.terminate().success());
    // URLs of two more hosts, left queued with no worker to fetch them.
    let (status, text) = frontier_cli(
        &endpoint,
        &[
            "seed",
            "http://a.invalid/",
            "http://a.invalid/2",
            "http://a.invalid/3",
            "http://b.invalid/",
        ],
    );
    assert!(status.success(), "{text}");

    let progress = frontier.progress().await;
    let page = frontier
        .metrics
        .as_deref()
        .expect("the web endpoint")
        .replace("/metrics", "/");
    // The chart draws rates between samples of the totals, taken every
    // five seconds: wait for one taken after the crawl ended.
    let state = format!("{page}api/state");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while last_sample_secs(&http_get(&state).await) <= crawl_ended_secs {
        assert!(
            std::time::Instant::now() < deadline,
            "no sample after the crawl"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let dom = rendered_dom(&chromium, &page);
    assert!(dom.contains("data-loaded=\"yes\""), "{dom}");

    let crawl = row_cells(&dom, "data-crawl", "DEFAULT");
    assert_eq!(crawl["done"], progress.completed.to_string(), "{crawl:?}");
    assert_eq!(crawl["known"], progress.discovered.to_string(), "{crawl:?}");
    assert_eq!(
        crawl["queued"],
        (progress.due_now + progress.scheduled_later).to_string(),
        "{crawl:?}"
    );
    assert_eq!(crawl["queued"], "4");
    assert_eq!(crawl["in-flight"], "0");

    // The busiest queues, most waiting first.
    let a = dom
        .find("data-queue=\"a.invalid\"")
        .expect("a.invalid listed");
    let b = dom
        .find("data-queue=\"b.invalid\"")
        .expect("b.invalid listed");
    assert!(a < b, "a.invalid (3 waiting) comes before b.invalid (1)");
    assert_eq!(row_cells(&dom, "data-queue", "a.invalid")["waiting"], "3");

    // One heatmap cell per partition, each with the fill the filter
    // health call reports.
    let mut admin = frontier.admin().await;
    let health = admin
        .get_filter_health(proto::admin::GetFilterHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dom.matches("data-partition=").count(), 16, "{dom}");
    for partition in &health.partitions {
        let cell = format!(
            "data-partition=\"{}\" data-fill=\"{}\"",
            partition.partition.unwrap(),
            partition.fill_ratio
        );
        assert!(dom.contains(&cell), "{cell} not in the page:\n{dom}");
    }
    // The rate chart has its lines.
    assert!(dom.contains("data-series=\"pages\""), "{dom}");
    // Errors by class, from the workers' reports: the site's 404 is a
    // client error (its flaky page's 500 was retried: a server error).
    assert!(dom.contains("data-class=\"client_error\""), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_admin_token_the_dashboard_shows_nothing_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &["--http-listen", "127.0.0.1:0", "--admin-token", "s3cret"],
    );
    let metrics = frontier.metrics.clone().expect("the web endpoint");
    let state = metrics.replace("/metrics", "/api/state");
    let refused = http_get(&state).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(!refused.contains("\"crawls\""), "{refused}");
    // Metrics stay open to scrapers.
    assert!(http_get(&metrics).await.starts_with("HTTP/1.1 200"));
    // The token opens the data.
    let answer = http_request("GET", &state, &["authorization: Bearer s3cret"]).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"crawls\""), "{answer}");
    // The dashboard is read-only.
    let post = http_request("POST", &state, &[]).await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");

    let Some(chromium) =
        chromium_or_skip("with_an_admin_token_the_dashboard_shows_nothing_without_it")
    else {
        return;
    };
    let dom = rendered_dom(&chromium, &metrics.replace("/metrics", "/"));
    assert!(dom.contains("token needed"), "{dom}");
    assert!(!dom.contains("data-loaded=\"yes\""), "{dom}");
    assert!(!dom.contains("data-crawl="), "{dom}");
}

/// Markup a client (or an operator's flag) can put in what the page shows
/// stays text: a crawl ID, a queue key, an outcome class, a node ID. Were
/// it to become an element, a script there could read the admin token the
/// page keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_in_every_field_the_page_shows_stays_text() {
    let Some(chromium) = chromium_or_skip("markup_in_every_field_the_page_shows_stays_text") else {
        return;
    };
    use futures::StreamExt;
    use proto::urlfrontier as uf;
    const CRAWL: &str = "<img src=x id=xss-crawl onerror=document.title='xss'>";
    const QUEUE: &str = "<svg id=xss-queue onload=document.title='xss'>";
    const OUTCOME: &str = "<b id=xss-outcome>x</b>";
    const NODE: &str = "<img src=x id=xss-node>";
    let dir = tempfile::tempdir().unwrap();
    // In a cluster when etcd is here, so that a node ID is shown too.
    let etcd = crawl_tests::etcd_binary().map(|binary| crawl_tests::EtcdProcess::start(&binary));
    let mut args = vec!["--http-listen", "127.0.0.1:0", "--default-delay-ms", "0"];
    if let Some(etcd) = &etcd {
        args.extend([
            "--etcd",
            &etcd.endpoint,
            "--cluster",
            "xss",
            "--node-id",
            NODE,
        ]);
    } else {
        eprintln!("no etcd: the node ID is not checked (.ci/run installs etcd)");
    }
    let frontier = FrontierProcess::start(&dir.path().join("data"), &args);
    if etcd.is_some() {
        crawl_tests::wait_for_cluster(&mut frontier.admin().await, 1).await;
    }
    let mut client = frontier.client().await;
    let info = |url: &str, key: &str| uf::UrlInfo {
        url: url.to_owned(),
        key: key.to_owned(),
        crawl_id: CRAWL.to_owned(),
        ..uf::UrlInfo::default()
    };
    let mut reported = info("http://x.example/done", QUEUE);
    reported.metadata.insert(
        proto::metadata::OUTCOME.to_owned(),
        uf::StringList {
            values: vec![OUTCOME.to_owned()],
        },
    );
    let items = vec![
        uf::UrlItem {
            item: Some(uf::url_item::Item::Discovered(uf::DiscoveredUrlItem {
                info: Some(info("http://x.example/queued", QUEUE)),
            })),
            ..uf::UrlItem::default()
        },
        uf::UrlItem {
            item: Some(uf::url_item::Item::Known(uf::KnownUrlItem {
                info: Some(reported),
                refetchable_from_date: 0,
            })),
            ..uf::UrlItem::default()
        },
    ];
    let acks: Vec<_> = client
        .put_ur_ls(futures::stream::iter(items))
        .await
        .unwrap()
        .into_inner()
        .map(|ack| ack.unwrap().status())
        .collect()
        .await;
    assert!(
        acks.iter().all(|a| *a == uf::ack_message::Status::Ok),
        "{acks:?}"
    );
    let page = frontier
        .metrics
        .as_deref()
        .expect("the web endpoint")
        .replace("/metrics", "/");
    // Errors by class appear once two samples (five seconds apart) exist.
    let state = format!("{page}api/state");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !http_get(&state).await.contains("\"errors_by_class\":{\"") {
        assert!(std::time::Instant::now() < deadline, "no error class");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let dom = rendered_dom(&chromium, &page);
    assert!(dom.contains("data-loaded=\"yes\""), "{dom}");
    // Shown, as text.
    let escaped = |text: &str| {
        text.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    assert!(
        dom.contains(&escaped(CRAWL)),
        "the crawl ID is not shown:\n{dom}"
    );
    assert!(
        dom.contains(&escaped(QUEUE)),
        "the queue key is not shown:\n{dom}"
    );
    if etcd.is_some() {
        assert!(
            dom.contains(&escaped(NODE)),
            "the node ID is not shown:\n{dom}"
        );
    }
    // The frontier counts an outcome that is no plain word as "other".
    assert!(dom.contains("data-class=\"other\""), "{dom}");
    // None became an element, and no script ran.
    assert!(
        !dom.contains("id=\"xss-"),
        "markup became an element:\n{dom}"
    );
    assert!(!dom.contains("<title>xss</title>"), "{dom}");
    // The page's policy runs no inline script and no sniffed type.
    let answer = http_get(&page).await.to_lowercase();
    assert!(
        answer.contains("content-security-policy: default-src 'none'; script-src 'self';"),
        "{answer}"
    );
    assert!(
        answer.contains("x-content-type-options: nosniff"),
        "{answer}"
    );
    assert!(!answer.contains("<script>"), "an inline script: {answer}");
    let head = http_request("HEAD", &page, &[]).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// Connections that never send a request (slowloris) neither take every
/// descriptor nor keep the dashboard from others: past its cap a new one is
/// closed at once, and each idle one is closed after the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_dashboard_are_capped_and_closed() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let frontier =
        FrontierProcess::start(&dir.path().join("data"), &["--http-listen", "127.0.0.1:0"]);
    let metrics = frontier.metrics.clone().expect("the web endpoint");
    let host = metrics
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    let started = std::time::Instant::now();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(tokio::net::TcpStream::connect(&host).await.unwrap());
    }
    // The gRPC port answers meanwhile.
    let mut admin = frontier.admin().await;
    admin
        .get_progress(proto::admin::GetProgressRequest::default())
        .await
        .unwrap();
    // Every idle connection ends: the ones past the cap at once, the
    // others once the header timeout passed.
    let mut ended: Vec<std::time::Duration> =
        futures::future::join_all(idle.into_iter().map(|mut stream| async move {
            let mut byte = [0_u8; 1];
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(60), stream.read(&mut byte))
                    .await
                    .expect("an idle connection held past a minute");
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
            started.elapsed()
        }))
        .await;
    ended.sort();
    assert!(
        ended[ended.len() - 1] >= std::time::Duration::from_secs(5),
        "idle connections closed before the header timeout: {ended:?}"
    );
    assert!(
        ended[0] < std::time::Duration::from_secs(5),
        "none closed at once past the cap"
    );
    // And a client that sends its request is answered.
    assert!(http_get(&metrics).await.starts_with("HTTP/1.1 200"));
}
