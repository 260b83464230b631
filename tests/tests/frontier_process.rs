//! The frontier as a real process over real sockets: what was acknowledged
//! survives kill -9, completed URLs stay completed, one data directory has
//! one server, a clean stop reuses its snapshots, and the standard health
//! and reflection services answer.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_urls_survive_kill_9_and_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let total = 12_000;
    let all: Vec<String> = (0..total).map(url).collect();
    let mut acked: BTreeSet<String> = BTreeSet::new();
    // Kill while acks are flowing, at three different points; each run
    // resends everything, so URLs stored before a kill come back SKIPPED.
    for stop_after in [1_500, 5_000, 9_000] {
        let frontier = FrontierProcess::start(&data, &["--partitions", "8"]);
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
    let stats = client
        .get_stats(uf::QueueWithinCrawlParams {
            crawl_id: "kill".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.size, total as u64);
    assert_eq!(stats.number_of_queues, 37);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_urls_stay_completed_after_kill_9_and_leases_come_back() {
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
            delay_requestable: 600,
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
    let served: Vec<String> = client
        .get_ur_ls(GetParams {
            delay_requestable: 600,
            item: Some(uf::get_params::Item::CrawlId("kill".into())),
            ..GetParams::default()
        })
        .await
        .unwrap()
        .into_inner()
        .map(|info| info.unwrap().url)
        .collect()
        .await;
    let served: BTreeSet<String> = served.into_iter().collect();
    let expected: BTreeSet<String> = urls
        .iter()
        .filter(|u| !completed.contains(u))
        .cloned()
        .collect();
    assert_eq!(
        served, expected,
        "leases are forgotten, completions are not"
    );
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

    let frontier = FrontierProcess::start(&data, &["--partitions", "4"]);
    assert!(
        frontier
            .log_text()
            .contains("filters loaded from snapshots"),
        "{}",
        frontier.log_text()
    );
    let again = put_urls(&frontier, urls.iter().map(|u| discovered(u)).collect(), 500).await;
    assert!(again.is_empty(), "snapshots lost keys: {again:?}");
    // A changed partition count is refused with the count to use.
    drop(frontier);
    let log = FrontierProcess::try_start(&data, &["--partitions", "8"])
        .err()
        .expect("refused");
    assert!(log.contains("--partitions 4"), "{log}");
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
