//! What a client can make the frontier do is bounded: a lease never runs
//! longer than `--max-lease-secs`, and one GetURLs call never leases more
//! than `--max-urls-per-get`, whatever the call asks for.

use crawl_tests::FrontierProcess;
use proto::urlfrontier::{DiscoveredBatch, GetParams, UrlInfo};

async fn lease_all(frontier: &FrontierProcess, lease_secs: u32) -> Vec<String> {
    let mut stream = frontier
        .client()
        .await
        .get_ur_ls(GetParams {
            max_urls_per_queue: 0,
            max_queues: 0,
            delay_requestable: lease_secs,
            ..GetParams::default()
        })
        .await
        .expect("GetURLs")
        .into_inner();
    let mut urls = Vec::new();
    while let Some(info) = stream.message().await.expect("a URL") {
        urls.push(info.url);
    }
    urls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_urls_per_call_are_capped_whatever_the_call_asks() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--scope",
            "any",
            "--default-delay-ms",
            "0",
            "--max-lease-secs",
            "1",
            "--max-urls-per-get",
            "50",
        ],
    );
    let items: Vec<UrlInfo> = (0..200)
        .map(|i| UrlInfo {
            url: format!("http://h{}.example/{i}", i % 4),
            ..UrlInfo::default()
        })
        .collect();
    let mut acks = frontier
        .client()
        .await
        .put_discovered(futures::stream::iter([DiscoveredBatch {
            id: "all".into(),
            done: None,
            items,
        }]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acks.message().await.unwrap().unwrap().statuses.len(), 200);

    // Limits 0/0 ("no limit" in the API) and a lease of 2^32-1 seconds.
    let first = lease_all(&frontier, u32::MAX).await;
    assert_eq!(first.len(), 50, "one call leased {}", first.len());
    // The lease was cut to one second: the same URLs come back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut leased_again = std::collections::HashSet::new();
    while !first.iter().all(|url| leased_again.contains(url)) {
        assert!(
            std::time::Instant::now() < deadline,
            "URLs leased for 2^32-1 seconds never came back"
        );
        leased_again.extend(lease_all(&frontier, u32::MAX).await);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A known item is no back door: for a URL the frontier does not hold it
/// passes the rules a discovered one passes, and metadata has a size bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_items_and_metadata_cannot_bring_in_what_discovery_refuses() {
    use proto::urlfrontier::{
        KnownUrlItem, StringList, UrlItem, UrlStatusRequest, ack_message::Status as Ack,
        url_item::Item,
    };
    let dir = tempfile::tempdir().unwrap();
    let frontier =
        FrontierProcess::start(&dir.path().join("data"), &["--max-metadata-bytes", "4096"]);
    let (status, out) =
        crawl_tests::frontier_cli(&frontier.endpoint(), &["seed", "http://site.example/"]);
    assert!(status.success(), "{out}");
    let known = |url: &str, metadata_bytes: usize| UrlItem {
        item: Some(Item::Known(KnownUrlItem {
            info: Some(UrlInfo {
                url: url.to_owned(),
                metadata: [(
                    "note".to_owned(),
                    StringList {
                        values: vec!["x".repeat(metadata_bytes)],
                    },
                )]
                .into(),
                ..UrlInfo::default()
            }),
            refetchable_from_date: 1,
        })),
        ..UrlItem::default()
    };
    let items = vec![
        known("http://169.254.169.254/latest/meta-data/", 10),
        known("http://site.example/page", 10),
        known("http://site.example/heavy", 100_000),
    ];
    let mut acks = frontier
        .client()
        .await
        .put_ur_ls(futures::stream::iter(items))
        .await
        .unwrap()
        .into_inner();
    let mut statuses = Vec::new();
    while let Some(ack) = acks.message().await.unwrap() {
        let status = ack.status();
        statuses.push((ack.id, status));
    }
    assert_eq!(
        statuses,
        [
            (
                "http://169.254.169.254/latest/meta-data/".to_owned(),
                Ack::Skipped
            ),
            ("http://site.example/page".to_owned(), Ack::Ok),
            ("http://site.example/heavy".to_owned(), Ack::Skipped),
        ]
    );
    let progress = frontier.progress().await;
    let skipped = progress.skipped.unwrap();
    assert_eq!((skipped.out_of_scope, skipped.metadata_too_large), (1, 1));
    let mut client = frontier.client().await;
    for (url, held) in [
        ("http://169.254.169.254/latest/meta-data/", false),
        ("http://site.example/page", true),
        ("http://site.example/heavy", false),
    ] {
        let answer = client
            .get_url_status(UrlStatusRequest {
                url: url.into(),
                ..UrlStatusRequest::default()
            })
            .await;
        assert_eq!(answer.is_ok(), held, "{url}: {answer:?}");
    }
}

/// One connection cannot hold thousands of streams: the server announces
/// its bound on concurrent streams in its HTTP/2 settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_is_held_to_a_bounded_number_of_streams() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &[]);
    // After one call the server's settings have been read.
    let send = served_connection(&frontier).await.unwrap();
    assert_eq!(
        send.current_max_send_streams(),
        frontier::server::MAX_STREAMS_PER_CONNECTION as usize
    );
}

/// An HTTP/2 connection served by the frontier: handshake done, so the
/// server has taken it among those it serves.
async fn served_connection(
    frontier: &FrontierProcess,
) -> Result<h2::client::SendRequest<bytes::Bytes>, h2::Error> {
    let tcp = tokio::net::TcpStream::connect(frontier.addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await?;
    tokio::spawn(connection);
    let mut send = send.ready().await?;
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "{}/grpc.health.v1.Health/Check",
            frontier.endpoint()
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = send.send_request(request, false)?;
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)?;
    assert_eq!(response.await?.status(), 200);
    Ok(send)
}

/// Connections past `--max-connections` are closed as they arrive; one
/// that ends makes room for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &["--max-connections", "3"]);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            served_connection(&frontier)
                .await
                .expect("within the limit"),
        );
    }
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        served_connection(&frontier),
    )
    .await
    .expect("the fourth connection is answered at once");
    assert!(refused.is_err(), "a fourth connection was served");
    // The server sees a connection end asynchronously: ask until one is
    // served, within a bound.
    drop(held.pop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while served_connection(&frontier).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no room after a connection ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Connections that never send a byte cannot lock clients out, also when
/// every call needs the token: one address holds at most a quarter of
/// `--max-connections`, and a connection that sends no HTTP/2 preface is
/// closed after a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_neither_lock_clients_out_nor_stay() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--max-connections",
            "64",
            "--admin-token",
            "s3cret",
            "--token-for-all",
        ],
    );
    let started = std::time::Instant::now();
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(tokio::net::TcpStream::connect(frontier.addr).await.unwrap());
    }
    // A client from another address is answered at once.
    let channel = tonic::transport::Endpoint::from_shared(frontier.endpoint())
        .unwrap()
        .local_address(Some("127.0.0.2".parse().unwrap()))
        .connect()
        .await
        .expect("room for another address");
    let bearer = proto::bearer::Bearer::new(Some("s3cret")).unwrap();
    let mut client = proto::urlfrontier::url_frontier_client::UrlFrontierClient::with_interceptor(
        channel, bearer,
    );
    client
        .get_active(proto::urlfrontier::Local::default())
        .await
        .expect("a call beside 64 idle connections");
    // Every idle connection ends: past the address's share at once, the
    // rest once the preface timeout passed.
    let ended: Vec<std::time::Duration> =
        futures::future::join_all(idle.into_iter().map(|mut stream| async move {
            // The server's own settings may come first; then the end.
            let mut whatever = Vec::new();
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                stream.read_to_end(&mut whatever),
            )
            .await
            .expect("an idle connection held past a minute");
            started.elapsed()
        }))
        .await;
    let at_once = ended
        .iter()
        .filter(|t| **t < std::time::Duration::from_secs(4))
        .count();
    assert_eq!(at_once, 64 - 16, "closed at once past the share: {ended:?}");
    // And a client from the same address as the idle ones is served.
    served_connection(&frontier)
        .await
        .expect("served once the idle connections are gone");
}

/// Crawl IDs cannot be invented without bound: past `--max-crawls` a write
/// that would start one more ends with RESOURCE_EXHAUSTED and stores
/// nothing of it, while the crawls held take writes as before; deleting a
/// crawl makes room. The dashboard's data lists a bounded number of crawls
/// whatever their number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crawls_are_bounded_and_the_dashboard_data_with_them() {
    use proto::urlfrontier as uf;
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &[
            "--scope",
            "any",
            "--max-crawls",
            "60",
            "--http-listen",
            "127.0.0.1:0",
        ],
    );
    let mut client = frontier.client().await;
    let putter = client.clone();
    let put = |crawl: String| {
        let mut client = putter.clone();
        async move {
            let item = uf::UrlItem {
                item: Some(uf::url_item::Item::Discovered(uf::DiscoveredUrlItem {
                    info: Some(UrlInfo {
                        url: format!("http://{crawl}.example/"),
                        crawl_id: crawl,
                        ..UrlInfo::default()
                    }),
                })),
                ..uf::UrlItem::default()
            };
            let mut acks = client
                .put_ur_ls(futures::stream::iter(vec![item]))
                .await?
                .into_inner();
            let mut statuses = Vec::new();
            while let Some(ack) = acks.message().await? {
                statuses.push(ack.status());
            }
            Ok::<_, tonic::Status>(statuses)
        }
    };
    for n in 0..60 {
        assert_eq!(
            put(format!("c{n}")).await.unwrap(),
            vec![uf::ack_message::Status::Ok]
        );
    }
    let refused = put("c60".to_owned()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("--max-crawls"), "{refused:?}");
    let mut admin = frontier.admin().await;
    let seeded = admin
        .add_seeds(proto::admin::AddSeedsRequest {
            crawl_id: "c61".into(),
            urls: vec!["http://c61.example/".into()],
            ..proto::admin::AddSeedsRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(seeded.code(), tonic::Code::ResourceExhausted, "{seeded:?}");
    // A crawl held still takes writes.
    assert_eq!(
        put("c7".to_owned()).await.unwrap(),
        vec![uf::ack_message::Status::Skipped],
        "already known"
    );
    // Nothing of the refused crawls was stored.
    let crawls = client
        .list_crawls(uf::Local::default())
        .await
        .unwrap()
        .into_inner()
        .values;
    assert_eq!(crawls.len(), 60, "{crawls:?}");
    // The dashboard lists the 50 crawls with the most URLs and says how
    // many there are.
    let state = frontier
        .metrics
        .as_deref()
        .unwrap()
        .replace("/metrics", "/api/state");
    let answer = crawl_tests::http_get(&state).await;
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["crawls"].as_array().unwrap().len(), 50, "{body}");
    assert_eq!(json["crawl_count"], 60, "{body}");
    // Deleting a crawl makes room.
    client
        .delete_crawl(uf::DeleteCrawlMessage {
            value: "c0".into(),
            local: false,
        })
        .await
        .unwrap();
    assert_eq!(
        put("c60".to_owned()).await.unwrap(),
        vec![uf::ack_message::Status::Ok]
    );
}
