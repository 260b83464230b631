//! The frontier as a real process, as its clients see it: the API as the
//! spec says, the admin token, bad input and invalid UTF-8 refused without
//! losing anything, Prometheus metrics, and the standard health and
//! reflection services.

use crawl_tests::FrontierProcess;
use crawl_tests::process_items::{discovered, known, put_batches, put_urls, url};
use futures::StreamExt;
use proto::urlfrontier::{
    self as uf, DiscoveredBatch, GetParams, UrlInfo, UrlItem, UrlStatusRequest,
    ack_message::Status as Ack, url_item,
};

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
            done: None,
            items: vec![],
        },
        DiscoveredBatch {
            id: "b1".into(),
            done: None,
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
    let acks = put_batches(&mut client, batches).await;
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

/// A batch that carries its page's report (`done`) is stored with it: the
/// page is done and its outlinks are there; a report without a URL is
/// SKIPPED, and a batch of a report alone is taken too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stores_its_pages_report_with_its_outlinks() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &[]);
    let mut client = frontier.client().await;
    let page = "http://page.example/";
    put_urls(&frontier, vec![discovered(page)], 1).await;
    let leased: Vec<UrlInfo> = client
        .get_ur_ls(GetParams {
            max_urls_per_queue: 1,
            delay_requestable: 60,
            ..GetParams::default()
        })
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(leased.len(), 1);
    // The crawl `discovered` puts its URLs in.
    let info = |url: &str| UrlInfo {
        url: url.into(),
        crawl_id: "kill".into(),
        ..UrlInfo::default()
    };
    let report = |info: Option<UrlInfo>| uf::KnownUrlItem {
        info,
        refetchable_from_date: 0,
    };
    let batches = vec![
        DiscoveredBatch {
            id: "page".into(),
            items: vec![info("http://page.example/a"), info("http://other.example/")],
            done: Some(report(leased.into_iter().next())),
        },
        DiscoveredBatch {
            id: "no url".into(),
            items: vec![info("http://page.example/b")],
            done: Some(report(None)),
        },
        DiscoveredBatch {
            id: "alone".into(),
            items: vec![],
            done: Some(report(Some(info("http://alone.example/")))),
        },
    ];
    let acks = put_batches(&mut client, batches).await;
    let answered: Vec<(&str, &[i32], Option<i32>)> = acks
        .iter()
        .map(|ack| (ack.id.as_str(), ack.statuses.as_slice(), ack.done))
        .collect();
    let (ok, skipped) = (Ack::Ok as i32, Ack::Skipped as i32);
    assert_eq!(
        answered,
        vec![
            ("page", &[ok, ok][..], Some(ok)),
            ("no url", &[ok][..], Some(skipped)),
            ("alone", &[][..], Some(ok)),
        ]
    );
    // The page and the URL reported alone are done; the outlinks wait.
    // (Batches of one stream are stored concurrently: no two name one URL.)
    let mut refetchable = Vec::new();
    for url in [
        page,
        "http://alone.example/",
        "http://page.example/a",
        "http://other.example/",
        "http://page.example/b",
    ] {
        let item = client
            .get_url_status(UrlStatusRequest {
                url: url.into(),
                crawl_id: "kill".into(),
                ..UrlStatusRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        let Some(url_item::Item::Known(known)) = item.item else {
            panic!("{url}: {item:?}");
        };
        refetchable.push(known.refetchable_from_date);
    }
    assert_eq!(refetchable[..2], [0, 0]);
    assert!(
        refetchable[2..].iter().all(|&due| due > 0),
        "{refetchable:?}"
    );
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
        done: None,
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
