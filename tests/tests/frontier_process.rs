//! The frontier as a real process over real sockets: what was acknowledged
//! survives kill -9 (during a clean stop's compaction too), completed URLs
//! stay completed, one data directory has one server, a clean stop reuses
//! its snapshots, and the standard health and reflection services answer.

use std::collections::{BTreeSet, HashSet};

use crawl_tests::FrontierProcess;
use futures::StreamExt;
use proto::urlfrontier::{
    self as uf, DiscoveredBatch, DiscoveredUrlItem, GetParams, KnownUrlItem, UrlInfo, UrlItem,
    UrlStatusRequest, ack_message::Status as Ack, url_item,
};

fn discovered(url: &str) -> UrlItem {
    UrlItem {
        item: Some(url_item::Item::Discovered(DiscoveredUrlItem {
            info: Some(UrlInfo {
                url: url.to_owned(),
                crawl_id: "kill".into(),
                ..UrlInfo::default()
            }),
        })),
        ..UrlItem::default()
    }
}

fn known(url: &str, refetchable_from_date: u64) -> UrlItem {
    UrlItem {
        item: Some(url_item::Item::Known(KnownUrlItem {
            info: Some(UrlInfo {
                url: url.to_owned(),
                crawl_id: "kill".into(),
                ..UrlInfo::default()
            }),
            refetchable_from_date,
        })),
        ..UrlItem::default()
    }
}

fn url(i: usize) -> String {
    format!("http://h{}.example/page/{i}", i % 37)
}

/// Streams items through PutURLs and answers the IDs acknowledged OK, in
/// order, stopping (without waiting for the rest) after `stop_after` acks.
async fn put_urls(
    frontier: &FrontierProcess,
    items: Vec<UrlItem>,
    stop_after: usize,
) -> Vec<String> {
    let mut client = frontier.client().await;
    let (sender, receiver) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        for item in items {
            if sender.send(item).await.is_err() {
                break;
            }
        }
    });
    let mut acks = client
        .put_ur_ls(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("PutURLs opens")
        .into_inner();
    let mut ok = Vec::new();
    let mut answered = 0;
    while let Some(Ok(ack)) = acks.next().await {
        answered += 1;
        if ack.status() == Ack::Ok {
            ok.push(ack.id);
        }
        if answered >= stop_after {
            break;
        }
    }
    ok
}

/// GetStats of the crawl the kill tests use.
async fn kill_crawl_stats(
    client: &mut uf::url_frontier_client::UrlFrontierClient<tonic::transport::Channel>,
) -> uf::Stats {
    client
        .get_stats(uf::QueueWithinCrawlParams {
            crawl_id: "kill".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_as_the_spec_says() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &[]);
    let mut client = frontier.client().await;
    // An empty batch is acked with its ID; in-batch duplicates, known URLs
    // and empty URLs are SKIPPED.
    let batches = vec![
        DiscoveredBatch {
            id: "empty".into(),
            items: vec![],
        },
        DiscoveredBatch {
            id: "b1".into(),
            items: [
                "http://a.example/x",
                "http://A.example:80/x#f",
                "",
                "ftp://a.example/",
            ]
            .iter()
            .map(|u| UrlInfo {
                url: (*u).into(),
                ..UrlInfo::default()
            })
            .collect(),
        },
    ];
    let acks: Vec<uf::BatchAck> = client
        .put_discovered(futures::stream::iter(batches))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(acks[0].id, "empty");
    assert!(acks[0].statuses.is_empty());
    assert_eq!(acks[1].id, "b1");
    assert_eq!(
        acks[1].statuses,
        vec![
            Ack::Ok as i32,
            Ack::Skipped as i32,
            Ack::Skipped as i32,
            Ack::Skipped as i32
        ]
    );
    // Unknown URL: NOT_FOUND; not a URL: INVALID_ARGUMENT.
    let missing = client
        .get_url_status(UrlStatusRequest {
            url: "http://a.example/nope".into(),
            ..UrlStatusRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let invalid = client
        .get_url_status(UrlStatusRequest {
            url: "not a url".into(),
            ..UrlStatusRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
    // The stored URL, in its canonical form, in the DEFAULT crawl.
    let crawls = client
        .list_crawls(uf::Local { local: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(crawls.values, vec!["DEFAULT".to_owned()]);
    let active = client
        .get_active(uf::Local { local: true })
        .await
        .unwrap()
        .into_inner();
    assert!(active.state);

    // The standard health service reports both services serving.
    let channel = tonic::transport::Channel::from_shared(frontier.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["urlfrontier.URLFrontier", "frontier.admin.v1.Admin"] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    }
    // Reflection lists our services, so grpcurl needs no .proto files.
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "urlfrontier.URLFrontier",
        "frontier.admin.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(names.iter().any(|n| n == expected), "{names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_guards_calls_that_change_the_frontier() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &["--admin-token", "s3cret"]);
    let mut client = frontier.client().await;
    let pause = |token: Option<&str>| {
        let mut request = tonic::Request::new(uf::Active {
            state: false,
            local: false,
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    let missing = client.set_active(pause(None)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated);
    let wrong = client.set_active(pause(Some("guess"))).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::PermissionDenied);
    // Reads need no token.
    assert!(
        client
            .get_active(uf::Local::default())
            .await
            .unwrap()
            .into_inner()
            .state
    );
    client.set_active(pause(Some("s3cret"))).await.unwrap();
    assert!(
        !client
            .get_active(uf::Local::default())
            .await
            .unwrap()
            .into_inner()
            .state
    );
    // The CLI sends it with --token.
    let cli = |args: &[&str]| {
        std::process::Command::new(crawl_tests::binary("frontier"))
            .args(args)
            .args(["--addr", &frontier.endpoint()])
            .output()
            .unwrap()
    };
    assert!(!cli(&["resume"]).status.success());
    let resumed = cli(&["resume", "--token", "s3cret"]);
    assert!(resumed.status.success(), "{resumed:?}");
    assert!(
        client
            .get_active(uf::Local::default())
            .await
            .unwrap()
            .into_inner()
            .state
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilds_under_concurrent_puts_and_serves_lose_nothing_and_serve_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    // Filters sized for 100 URLs each: they pass the fill threshold again
    // and again while 20,000 URLs arrive.
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            // A page cache far smaller than the store, so reads go past it.
            "--cache-mb",
            "1",
            "--partitions",
            "4",
            "--expected-urls",
            "400",
            "--default-delay-ms",
            "0",
        ],
    );
    let total = 20_000;
    let writer = {
        let mut client = frontier.client().await;
        tokio::spawn(async move {
            let batches: Vec<DiscoveredBatch> = (0..total)
                .collect::<Vec<_>>()
                .chunks(256)
                .enumerate()
                .map(|(i, chunk)| DiscoveredBatch {
                    id: i.to_string(),
                    items: chunk
                        .iter()
                        .map(|&n| UrlInfo {
                            url: url(n),
                            ..UrlInfo::default()
                        })
                        .collect(),
                })
                .collect();
            let acks: Vec<uf::BatchAck> = client
                .put_discovered(futures::stream::iter(batches))
                .await
                .unwrap()
                .into_inner()
                .map(Result::unwrap)
                .collect()
                .await;
            acks.iter()
                .flat_map(|ack| ack.statuses.iter())
                .filter(|s| **s == Ack::Ok as i32)
                .count()
        })
    };
    let rebuilder = {
        let mut admin = frontier.admin().await;
        tokio::spawn(async move {
            for _ in 0..3 {
                admin
                    .rebuild_filters(proto::admin::RebuildFiltersRequest {
                        partition: None,
                        no_wait: false,
                        local: false,
                    })
                    .await
                    .unwrap();
            }
        })
    };
    let mut client = frontier.client().await;
    let mut served: HashSet<String> = HashSet::new();
    let mut writer = Some(writer);
    let mut stored = None;
    while stored.is_none_or(|stored| served.len() < stored) {
        let batch: Vec<String> = client
            .get_ur_ls(GetParams {
                max_urls_per_queue: 50,
                delay_requestable: 600,
                ..GetParams::default()
            })
            .await
            .unwrap()
            .into_inner()
            .map(|info| info.unwrap().url)
            .collect()
            .await;
        for url in &batch {
            assert!(
                served.insert(url.clone()),
                "{url} served twice within its lease"
            );
        }
        // Completing them gives the leases back, so each queue (at most 50
        // leased) serves on.
        if !batch.is_empty() {
            let done: Vec<UrlItem> = batch
                .iter()
                .map(|u| UrlItem {
                    item: Some(url_item::Item::Known(KnownUrlItem {
                        info: Some(UrlInfo {
                            url: u.clone(),
                            ..UrlInfo::default()
                        }),
                        refetchable_from_date: 0,
                    })),
                    ..UrlItem::default()
                })
                .collect();
            let acks: Vec<uf::AckMessage> = client
                .put_ur_ls(futures::stream::iter(done))
                .await
                .unwrap()
                .into_inner()
                .map(Result::unwrap)
                .collect()
                .await;
            assert!(acks.iter().all(|a| a.status() == Ack::Ok));
        }
        if writer.as_ref().is_some_and(|w| w.is_finished()) {
            stored = Some(writer.take().unwrap().await.unwrap());
        }
    }
    rebuilder.await.unwrap();
    assert_eq!(stored, Some(total));
    assert_eq!(served.len(), total);
    let mut admin = frontier.admin().await;
    let health = admin
        .get_filter_health(proto::admin::GetFilterHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    let totals = health.total.unwrap();
    assert_eq!(totals.items_inserted, total as u64);
    assert!(totals.rebuild_count > 12, "{}", totals.rebuild_count);
    assert!(frontier.log_text().contains("filter rebuilt"));
    // Every stored key is in its filter after all those swaps.
    let checks = futures::stream::iter(served.into_iter().map(|url| {
        let mut admin = admin.clone();
        async move {
            let answer = admin
                .check_url(proto::admin::CheckUrlRequest {
                    url: url.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            (url, answer.filter_answer())
        }
    }))
    .buffer_unordered(16)
    .collect::<Vec<_>>()
    .await;
    for (url, answer) in checks {
        assert_eq!(
            answer,
            proto::admin::FilterAnswer::Maybe,
            "{url} missing after rebuilds"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_answers_and_the_server_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &[]);
    let mut client = frontier.client().await;
    let one_mb = format!("http://a.example/{}", "x".repeat(1 << 20));
    let items = vec![
        discovered("http://a.example/kept"),
        discovered("javascript:alert(1)"),
        discovered("http://"),
        discovered(&one_mb),
        UrlItem::default(),
        known("not a url", 0),
    ];
    let acks: Vec<uf::AckMessage> = client
        .put_ur_ls(futures::stream::iter(items))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    let statuses: Vec<Ack> = acks.iter().map(|a| a.status()).collect();
    assert_eq!(
        statuses,
        vec![
            Ack::Ok,
            Ack::Skipped,
            Ack::Skipped,
            Ack::Skipped,
            Ack::Skipped,
            Ack::Skipped
        ]
    );
    // A batch past the message limit is refused as too large.
    let huge = DiscoveredBatch {
        id: "huge".into(),
        items: (0..60_000)
            .map(|i| UrlInfo {
                url: format!("http://b.example/{i}/{}", "y".repeat(64)),
                ..UrlInfo::default()
            })
            .collect(),
    };
    let mut stream = client
        .put_discovered(futures::stream::iter([huge]))
        .await
        .map(|r| r.into_inner());
    let refused = match &mut stream {
        Ok(acks) => acks.next().await.unwrap().unwrap_err(),
        Err(status) => status.clone(),
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    // Still up, and what was acked is there.
    let mut client = frontier.client().await;
    client
        .get_url_status(UrlStatusRequest {
            url: "http://a.example/kept".into(),
            crawl_id: "kill".into(),
            ..UrlStatusRequest::default()
        })
        .await
        .unwrap();
    // Malformed control calls are INVALID_ARGUMENT.
    let no_key = client
        .block_queue_until(uf::BlockQueueParams::default())
        .await
        .unwrap_err();
    assert_eq!(no_key.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_metrics_count_puts_leases_commits_and_fill() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &["--partitions", "4", "--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = frontier
        .metrics
        .clone()
        .expect("the metrics URL is printed");
    let urls: Vec<String> = (0..100).map(url).collect();
    let mut items: Vec<UrlItem> = urls.iter().map(|u| discovered(u)).collect();
    items.push(discovered("not a url"));
    put_urls(&frontier, items, 101).await;
    let mut client = frontier.client().await;
    let leased = client
        .get_ur_ls(GetParams {
            item: Some(uf::get_params::Item::CrawlId("kill".into())),
            ..GetParams::default()
        })
        .await
        .unwrap()
        .into_inner()
        .count()
        .await;
    assert_eq!(leased, 100);
    let text = crawl_tests::http_get(&metrics).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for expected in [
        "frontier_put_urls_total{kind=\"discovered\",status=\"ok\"} 100",
        "frontier_put_urls_total{kind=\"discovered\",status=\"skipped\"} 1",
        "frontier_skipped_urls_total{reason=\"invalid\"} 1",
        "frontier_leases_total 100",
        "frontier_partition_fill_ratio{partition=\"3\"}",
        "frontier_commit_seconds_bucket",
        "frontier_urls{state=\"pending\"} 100",
    ] {
        assert!(text.contains(expected), "{expected} missing from\n{text}");
    }
    // Metrics do not keep a clean shutdown from writing its snapshots.
    assert!(frontier.terminate().success());
}

/// `message` encoded, with every `marker` in it replaced by bytes that are
/// not UTF-8 (of the same length, so every length prefix stays right).
fn with_invalid_utf8(message: &impl prost::Message, marker: &str) -> Vec<u8> {
    let mut bytes = message.encode_to_vec();
    let mut at = 0;
    while let Some(found) = bytes[at..]
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
    {
        let start = at + found;
        bytes[start..start + marker.len()].fill(0xFF);
        at = start + marker.len();
    }
    assert_ne!(bytes, message.encode_to_vec(), "marker not found");
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_from_a_raw_client_is_invalid_argument_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &[]);
    let channel = tonic::transport::Channel::from_shared(frontier.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);

    // A PutURLs stream: a good URL, then one whose metadata value is not
    // UTF-8, then another good one the server never reads.
    let mut bad = discovered("http://a.example/bad");
    if let Some(url_item::Item::Discovered(item)) = &mut bad.item {
        item.info.as_mut().unwrap().metadata.insert(
            "note".into(),
            uf::StringList {
                values: vec!["MARKER".into()],
            },
        );
    }
    let messages = vec![
        prost::Message::encode_to_vec(&discovered("http://a.example/good")),
        with_invalid_utf8(&bad, "MARKER"),
        prost::Message::encode_to_vec(&discovered("http://a.example/after")),
    ];
    grpc.ready().await.unwrap();
    let mut acks = grpc
        .streaming(
            tonic::Request::new(futures::stream::iter(messages)),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/urlfrontier.URLFrontier/PutURLs",
            ),
            crawl_tests::RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    let first = acks.message().await.unwrap().expect("the good URL's ack");
    let first: uf::AckMessage = prost::Message::decode(first.as_slice()).unwrap();
    assert_eq!(first.status(), Ack::Ok);
    let refused = acks.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    assert!(refused.message().contains("UTF-8"), "{refused}");

    // A unary call with a URL that is not UTF-8.
    let request = UrlStatusRequest {
        url: "http://a.example/MARKER".into(),
        crawl_id: "kill".into(),
        ..UrlStatusRequest::default()
    };
    grpc.ready().await.unwrap();
    let refused = grpc
        .unary(
            tonic::Request::new(with_invalid_utf8(&request, "MARKER")),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/urlfrontier.URLFrontier/GetURLStatus",
            ),
            crawl_tests::RawCodec,
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");

    // The server is up, the acknowledged URL is stored, and nothing of the
    // refused message was.
    let mut client = frontier.client().await;
    for (url, stored) in [
        ("http://a.example/good", true),
        ("http://a.example/bad", false),
    ] {
        let answer = client
            .get_url_status(UrlStatusRequest {
                url: url.into(),
                crawl_id: "kill".into(),
                ..UrlStatusRequest::default()
            })
            .await;
        assert_eq!(answer.is_ok(), stored, "{url}: {answer:?}");
    }
}

/// CopyPartition pages through each partition of the store in its order:
/// every stored URL once, in the partition its host hashes to, with its
/// whole record; the last page says so, and a partition the store does not
/// have is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_partition_pages_through_every_url_once_with_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(dir.path(), &["--partitions", "4"]);
    let urls: Vec<String> = (0..200).map(url).collect();
    let stored = put_urls(&frontier, urls.iter().map(|u| discovered(u)).collect(), 200).await;
    assert_eq!(stored.len(), 200);
    let done: BTreeSet<String> = urls.iter().step_by(3).cloned().collect();
    let reported = put_urls(
        &frontier,
        done.iter().map(|u| known(u, 0)).collect(),
        done.len(),
    )
    .await;
    assert_eq!(reported.len(), done.len());

    let mut admin = frontier.admin().await;
    let mut copied = BTreeSet::new();
    for partition in 0..4 {
        let mut after: Option<proto::admin::PartitionKey> = None;
        loop {
            let page = admin
                .copy_partition(proto::admin::CopyPartitionRequest {
                    partition,
                    after: after.clone(),
                    limit: 7,
                    track: after.is_none(),
                    catch_up: false,
                })
                .await
                .unwrap()
                .into_inner();
            assert!(page.urls.len() <= 7);
            for moved in &page.urls {
                let record = frontier::record::UrlRecord::decode(&moved.record).unwrap();
                assert_eq!(moved.crawl_id, "kill");
                assert_eq!(
                    record.is_completed(),
                    done.contains(&moved.url),
                    "{}",
                    moved.url
                );
                let host = url::Url::parse(&moved.url)
                    .unwrap()
                    .host_str()
                    .unwrap()
                    .to_owned();
                assert_eq!(record.queue_key, host);
                assert_eq!(
                    frontier::ingest::partition_of("kill", &host, 4),
                    partition as usize
                );
                assert!(copied.insert(moved.url.clone()), "{} twice", moved.url);
            }
            if page.end {
                break;
            }
            let last = page.urls.last().expect("a page before the end holds URLs");
            after = Some(proto::admin::PartitionKey {
                crawl_id: last.crawl_id.clone(),
                url: last.url.clone(),
            });
        }
    }
    assert_eq!(copied, urls.iter().cloned().collect::<BTreeSet<_>>());
    let refused = admin
        .copy_partition(proto::admin::CopyPartitionRequest {
            partition: 4,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("not one of this store's 4"));
}
