//! The frontier as a real process, stopped and killed: what was
//! acknowledged survives kill -9 (during a clean stop's compaction too),
//! completed URLs stay completed, one data directory has one server, and a
//! clean stop reuses its snapshots.

use std::collections::{BTreeSet, HashSet};

use crawl_tests::FrontierProcess;
use crawl_tests::process_items::{discovered, kill_crawl_stats, known, put_urls, url};
use futures::StreamExt;
use proto::urlfrontier::{
    self as uf, DiscoveredUrlItem, GetParams, UrlStatusRequest, ack_message::Status as Ack,
    url_item,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_urls_survive_kill_9_and_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let total = 12_000;
    let all: Vec<String> = (0..total).map(url).collect();
    let mut acked: BTreeSet<String> = BTreeSet::new();
    let mut replays = 0;
    // Kill while acks are flowing, at three different points; each run
    // resends everything, so URLs stored before a kill come back SKIPPED.
    for stop_after in [1_500, 5_000, 9_000] {
        let frontier = FrontierProcess::start(&data, &["--partitions", "8"]);
        replays += usize::from(frontier.log_text().contains("replayed the write-ahead log"));
        let items = all.iter().map(|u| discovered(u)).collect();
        let ok = put_urls(&frontier, items, stop_after).await;
        // Nothing was acknowledged twice across runs.
        for id in &ok {
            assert!(acked.insert(id.clone()), "{id} acknowledged OK twice");
        }
        frontier.kill();
    }
    assert!(acked.len() >= 1_500, "only {} acks", acked.len());

    let frontier = FrontierProcess::start(&data, &["--partitions", "8"]);
    let log = frontier.log_text();
    assert!(log.contains("filters rebuilt from the store"), "{log}");
    replays += usize::from(log.contains("replayed the write-ahead log"));
    // Acks come from the write-ahead log between redb checkpoints (every
    // few seconds), so a kill while acks flow leaves groups only the log holds:
    // the restarts must have replayed some, or this test proves nothing
    // about the log.
    assert!(replays > 0, "no restart replayed the write-ahead log");
    // Every acknowledged URL is stored, and its filter knows it.
    let mut client = frontier.client().await;
    let mut admin = frontier.admin().await;
    for url in &acked {
        let item = client
            .get_url_status(UrlStatusRequest {
                url: url.clone(),
                crawl_id: "kill".into(),
                ..UrlStatusRequest::default()
            })
            .await
            .unwrap_or_else(|status| panic!("{url} lost after kill -9: {status}"))
            .into_inner();
        assert_eq!(item.id, *url);
        let check = admin
            .check_url(proto::admin::CheckUrlRequest {
                url: url.clone(),
                crawl_id: "kill".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            check.filter_answer(),
            proto::admin::FilterAnswer::Maybe,
            "filter misses stored {url}"
        );
    }
    // Sending everything once more stores exactly what is missing: each
    // URL ends up stored once.
    let ok = put_urls(
        &frontier,
        all.iter().map(|u| discovered(u)).collect(),
        total,
    )
    .await;
    let newly: HashSet<String> = ok.into_iter().collect();
    assert!(newly.is_disjoint(&acked.iter().cloned().collect()));
    let stats = kill_crawl_stats(&mut client).await;
    assert_eq!(stats.size, total as u64);
    assert_eq!(stats.number_of_queues, 37);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_urls_stay_completed_after_kill_9_and_leases_come_back_when_they_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let frontier = FrontierProcess::start(&data, &["--partitions", "4"]);
    let urls: Vec<String> = (0..200).map(url).collect();
    let ok = put_urls(&frontier, urls.iter().map(|u| discovered(u)).collect(), 200).await;
    assert_eq!(ok.len(), 200);
    let mut client = frontier.client().await;
    let leased: Vec<String> = client
        .get_ur_ls(GetParams {
            max_urls_per_queue: 3,
            delay_requestable: 10,
            item: Some(uf::get_params::Item::CrawlId("kill".into())),
            ..GetParams::default()
        })
        .await
        .unwrap()
        .into_inner()
        .map(|info| info.unwrap().url)
        .collect()
        .await;
    assert_eq!(leased.len(), 37 * 3);
    let completed: Vec<String> = leased[..60].to_vec();
    let done = put_urls(
        &frontier,
        completed.iter().map(|u| known(u, 0)).collect(),
        60,
    )
    .await;
    assert_eq!(done.len(), 60);
    frontier.kill();

    let frontier = FrontierProcess::start(&data, &["--partitions", "4"]);
    let mut client = frontier.client().await;
    // Queue counts are written at checkpoints; the completions above are
    // in the log only, and the replay counts them again.
    let stats = kill_crawl_stats(&mut client).await;
    assert_eq!(
        (stats.size, stats.counts.get("completed").copied()),
        (140, Some(60))
    );
    // The leases handed out before the kill may still be in use: nothing
    // is served until they have run out (the restart came well within
    // their 10 s).
    let serve = || {
        let mut client = client.clone();
        async move {
            client
                .get_ur_ls(GetParams {
                    delay_requestable: 600,
                    item: Some(uf::get_params::Item::CrawlId("kill".into())),
                    ..GetParams::default()
                })
                .await
                .unwrap()
                .into_inner()
                .map(|info| info.unwrap().url)
                .collect::<Vec<String>>()
                .await
        }
    };
    assert!(serve().await.is_empty(), "served while earlier leases run");
    assert!(
        frontier
            .log_text()
            .contains("serving resumes when the leases handed out before this start have run out")
    );
    // Then every URL not completed comes back, the leased ones included.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let served = loop {
        let served = serve().await;
        if !served.is_empty() {
            break served;
        }
        assert!(std::time::Instant::now() < deadline, "leases never ended");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let served: BTreeSet<String> = served.into_iter().collect();
    let expected: BTreeSet<String> = urls
        .iter()
        .filter(|u| !completed.contains(u))
        .cloned()
        .collect();
    assert_eq!(served, expected, "leases end, completions stay");
    let status = client
        .get_url_status(UrlStatusRequest {
            url: completed[0].clone(),
            crawl_id: "kill".into(),
            ..UrlStatusRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    match status.item {
        Some(url_item::Item::Known(known)) => assert_eq!(known.refetchable_from_date, 0),
        other => panic!("expected a known item, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _first = FrontierProcess::start(&data, &[]);
    let log = match FrontierProcess::try_start(&data, &[]) {
        Ok(_) => panic!("a second frontier started on the same data directory"),
        Err(log) => log,
    };
    assert!(log.contains("already in use"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly_and_the_next_start_uses_the_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let frontier = FrontierProcess::start(&data, &["--partitions", "4"]);
    let urls: Vec<String> = (0..500).map(url).collect();
    put_urls(&frontier, urls.iter().map(|u| discovered(u)).collect(), 500).await;
    let status = frontier.terminate();
    assert!(status.success(), "{status}");

    let frontier = restart_from_snapshots(&data);
    let again = put_urls(&frontier, urls.iter().map(|u| discovered(u)).collect(), 500).await;
    assert!(again.is_empty(), "snapshots lost keys: {again:?}");
    // A changed partition count is refused with the count to use.
    drop(frontier);
    let log = FrontierProcess::try_start(&data, &["--partitions", "8"])
        .err()
        .expect("refused");
    assert!(log.contains("--partitions 4"), "{log}");
}

/// A clean stop ends by compacting the store's files, which on a large
/// store can outlast a deployment's grace period. A kill during that
/// compaction loses nothing: the store was durable and its log empty
/// before it began, and the next start uses the stop's snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_the_compaction_of_a_clean_stop_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let frontier = FrontierProcess::start(&data, &["--partitions", "4"]);
    // Large metadata makes `urls.redb` large enough to be compacted (from
    // 64 MiB on disk) with few URLs.
    let total = 8_000;
    let all: Vec<String> = (0..total).map(url).collect();
    let padding = uf::StringList {
        values: vec!["x".repeat(12 << 10)],
    };
    let items = all
        .iter()
        .map(|u| {
            let mut item = discovered(u);
            if let Some(url_item::Item::Discovered(DiscoveredUrlItem { info: Some(info) })) =
                &mut item.item
            {
                info.metadata.insert("padding".into(), padding.clone());
            }
            item
        })
        .collect();
    assert_eq!(put_urls(&frontier, items, total).await.len(), total);

    frontier.signal(rustix::process::Signal::TERM);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !frontier.log_text().contains("compacting at close") {
        assert!(
            std::time::Instant::now() < deadline,
            "no compaction began:\n{}",
            frontier.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let log_path = frontier.log.clone();
    frontier.kill();
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(
        !log.contains("compacted at close"),
        "the compaction ended before the kill, so this run tested nothing:\n{log}"
    );

    let frontier = restart_from_snapshots(&data);
    let again = put_urls(
        &frontier,
        all.iter().map(|u| discovered(u)).collect(),
        total,
    )
    .await;
    assert!(again.is_empty(), "URLs lost: {} stored again", again.len());
    let mut client = frontier.client().await;
    assert_eq!(kill_crawl_stats(&mut client).await.size, total as u64);
    // The next clean stop compacts the file in full.
    let log_path = frontier.log.clone();
    let status = frontier.terminate();
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(log.contains("compacted at close"), "{log}");
}

/// A worker keeps its PutURLs stream open for as long as it runs: at
/// SIGTERM the stream ends after its acks, and the frontier stops clean
/// (with snapshots) instead of waiting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_write_streams_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let frontier = FrontierProcess::start(&data, &["--partitions", "4"]);
    let (items, outgoing) = tokio::sync::mpsc::channel(4);
    let mut acks = frontier
        .client()
        .await
        .put_ur_ls(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .unwrap()
        .into_inner();
    items.send(discovered(&url(1))).await.unwrap();
    let ack = acks.next().await.unwrap().unwrap();
    assert_eq!(ack.status(), Ack::Ok);
    // `items` stays open: the stream is still the client's to use.
    let mut frontier = frontier;
    let status = frontier
        .terminate_within(std::time::Duration::from_secs(60))
        .expect("the frontier stops while a client's write stream is open");
    assert!(status.success(), "{status}");
    assert!(acks.next().await.is_none_or(|end| end.is_ok()));
    drop(items);
    restart_from_snapshots(&data);
}

/// Starts the frontier again on `data`, checking that it loaded the filter
/// snapshots its clean stop wrote.
fn restart_from_snapshots(data: &std::path::Path) -> FrontierProcess {
    let frontier = FrontierProcess::start(data, &["--partitions", "4"]);
    assert!(
        frontier
            .log_text()
            .contains("filters loaded from snapshots"),
        "{}",
        frontier.log_text()
    );
    frontier
}
