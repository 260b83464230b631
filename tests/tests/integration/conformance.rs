//! URL Frontier v2.6 conformance, method by method, against a real
//! `frontier serve` over a real socket with the generated client: what
//! ../shared/specs/urlfrontier-api.md says clients rely on.

use std::collections::BTreeSet;

use crawl_tests::FrontierProcess;
use futures::StreamExt;
use proto::urlfrontier::{
    self as uf, ack_message::Status as Ack, url_frontier_client::UrlFrontierClient, url_item,
};
use tonic::transport::Channel;

fn info(url: &str, crawl: &str) -> uf::UrlInfo {
    uf::UrlInfo {
        url: url.to_owned(),
        crawl_id: crawl.to_owned(),
        ..uf::UrlInfo::default()
    }
}

async fn put(client: &mut UrlFrontierClient<Channel>, items: Vec<uf::UrlItem>) -> Vec<Ack> {
    client
        .put_ur_ls(futures::stream::iter(items))
        .await
        .unwrap()
        .into_inner()
        .map(|ack| ack.unwrap().status())
        .collect()
        .await
}

fn discovered(url: &str, crawl: &str) -> uf::UrlItem {
    uf::UrlItem {
        item: Some(url_item::Item::Discovered(uf::DiscoveredUrlItem {
            info: Some(info(url, crawl)),
        })),
        ..uf::UrlItem::default()
    }
}

fn known(url: &str, crawl: &str, refetchable_from_date: u64) -> uf::UrlItem {
    uf::UrlItem {
        item: Some(url_item::Item::Known(uf::KnownUrlItem {
            info: Some(info(url, crawl)),
            refetchable_from_date,
        })),
        ..uf::UrlItem::default()
    }
}

async fn get(client: &mut UrlFrontierClient<Channel>, params: uf::GetParams) -> Vec<String> {
    urls_of(client, tonic::Request::new(params)).await
}

/// The URLs a GetURLs call hands out.
async fn urls_of(
    client: &mut UrlFrontierClient<Channel>,
    request: tonic::Request<uf::GetParams>,
) -> Vec<String> {
    client
        .get_ur_ls(request)
        .await
        .unwrap()
        .into_inner()
        .map(|info| info.unwrap().url)
        .collect()
        .await
}

async fn list(
    client: &mut UrlFrontierClient<Channel>,
    params: uf::ListUrlParams,
) -> Vec<uf::UrlItem> {
    client
        .list_ur_ls(params)
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await
}

fn crawl(name: &str) -> Option<uf::get_params::Item> {
    Some(uf::get_params::Item::CrawlId(name.to_owned()))
}

async fn frontier() -> (FrontierProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &["--partitions", "4", "--default-delay-ms", "0"],
    );
    (frontier, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_known_and_crawl_namespaces() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    // Discovered: stored once; known: always overwrites; crawls are
    // namespaces; an empty crawl ID is DEFAULT.
    let acks = put(
        &mut client,
        vec![
            discovered("http://a.example/1", "c1"),
            discovered("http://a.example/1", "c1"),
            discovered("http://a.example/1", "c2"),
            discovered("http://a.example/2", ""),
            known("http://a.example/3", "c1", 0),
        ],
    )
    .await;
    assert_eq!(acks, vec![Ack::Ok, Ack::Skipped, Ack::Ok, Ack::Ok, Ack::Ok]);
    let crawls = client
        .list_crawls(uf::Local::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(crawls.values, vec!["DEFAULT", "c1", "c2"]);
    // A known URL never turns back into a discovered one.
    let again = put(&mut client, vec![discovered("http://a.example/3", "c1")]).await;
    assert_eq!(again, vec![Ack::Skipped]);
    let stats = client
        .get_stats(uf::QueueWithinCrawlParams {
            crawl_id: "c1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.size, 1, "URLs not completed");
    assert_eq!(stats.counts["completed"], 1);
    assert_eq!(stats.number_of_queues, 1);
    assert_eq!(stats.crawl_id, "c1");
    // GetURLStatus: a known item; refetchable_from_date 0 when completed.
    let status = client
        .get_url_status(uf::UrlStatusRequest {
            url: "http://a.example/3".into(),
            crawl_id: "c1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let Some(url_item::Item::Known(item)) = status.item else {
        panic!("a known item")
    };
    assert_eq!(item.refetchable_from_date, 0);
    assert!(status.creation_date > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_order_and_the_gate() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    // Scheduled dates work as a priority within a queue.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    put(
        &mut client,
        vec![
            known("http://q.example/late", "g", now - 10),
            known("http://q.example/early", "g", now - 1000),
            known("http://q.example/future", "g", now + 3600),
        ],
    )
    .await;
    let one = uf::GetParams {
        max_urls_per_queue: 1,
        delay_requestable: 600,
        item: crawl("g"),
        ..Default::default()
    };
    assert_eq!(
        get(&mut client, one.clone()).await,
        vec!["http://q.example/early"]
    );
    // At its per-queue maximum: nothing more while the lease holds.
    assert!(get(&mut client, one.clone()).await.is_empty());
    let stats = client
        .get_stats(uf::QueueWithinCrawlParams {
            key: "q.example".into(),
            crawl_id: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.in_process, 1);
    assert_eq!(stats.size, 3);
    // An update ends the lease.
    put(&mut client, vec![known("http://q.example/early", "g", 0)]).await;
    assert_eq!(
        get(&mut client, one.clone()).await,
        vec!["http://q.example/late"]
    );
    // Blocked queues serve nothing; 0 unblocks.
    put(&mut client, vec![known("http://q.example/late", "g", 0)]).await;
    put(&mut client, vec![discovered("http://q.example/new", "g")]).await;
    client
        .block_queue_until(uf::BlockQueueParams {
            key: "q.example".into(),
            time: now + 3600,
            crawl_id: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(get(&mut client, one.clone()).await.is_empty());
    client
        .block_queue_until(uf::BlockQueueParams {
            key: "q.example".into(),
            time: 0,
            crawl_id: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // Paused: nothing served, puts still taken.
    client
        .set_active(uf::Active {
            state: false,
            local: false,
        })
        .await
        .unwrap();
    assert!(get(&mut client, one.clone()).await.is_empty());
    assert_eq!(
        put(
            &mut client,
            vec![discovered("http://q.example/while-paused", "g")]
        )
        .await,
        vec![Ack::Ok]
    );
    client
        .set_active(uf::Active {
            state: true,
            local: false,
        })
        .await
        .unwrap();
    // A crawl limit: 2 completed already, limit 2 → nothing served.
    client
        .set_crawl_limit(uf::CrawlLimitParams {
            key: "q.example".into(),
            limit: 2,
            crawl_id: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(get(&mut client, one.clone()).await.is_empty());
    client
        .set_crawl_limit(uf::CrawlLimitParams {
            key: "q.example".into(),
            limit: 0,
            crawl_id: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(get(&mut client, one.clone()).await.len(), 1);
}

/// A GetURLs call with the worker's request header: each queue served is
/// held by the lease until it is let go.
async fn get_holding(
    client: &mut UrlFrontierClient<Channel>,
    params: uf::GetParams,
) -> Vec<String> {
    let mut request = tonic::Request::new(params);
    request.metadata_mut().insert(
        proto::metadata::HOLD_QUEUES_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    urls_of(client, request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_urls_count_against_the_per_queue_maximum_and_no_limit_serves_the_rest() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    let items: Vec<uf::UrlItem> = (0..6)
        .map(|i| discovered(&format!("http://m.example/{i}"), "m"))
        .collect();
    put(&mut client, items).await;
    let params = |max_urls_per_queue| uf::GetParams {
        max_urls_per_queue,
        delay_requestable: 600,
        item: crawl("m"),
        ..Default::default()
    };
    let first = get(&mut client, params(2)).await;
    assert_eq!(first.len(), 2);
    assert!(
        get(&mut client, params(2)).await.is_empty(),
        "2 leased, limit 2"
    );
    // No limit: the queue's other due URLs while the 2 are still leased.
    let rest = get(&mut client, params(0)).await;
    assert_eq!(rest.len(), 4, "{rest:?}");
    let all: BTreeSet<&String> = first.iter().chain(&rest).collect();
    assert_eq!(all.len(), 6, "a URL served twice");
    // A limit counts what is in flight: one reported frees one slot of 7.
    put(&mut client, vec![discovered("http://m.example/6", "m")]).await;
    assert!(get(&mut client, params(6)).await.is_empty(), "6 in flight");
    put(&mut client, vec![known(&first[0], "m", 0)]).await;
    assert_eq!(
        get(&mut client, params(6)).await,
        vec!["http://m.example/6"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_delay_serves_its_next_due_url_while_the_first_is_leased() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    put(
        &mut client,
        vec![
            known("http://d.example/third", "d", now - 10),
            known("http://d.example/first", "d", now - 30),
            known("http://d.example/second", "d", now - 20),
        ],
    )
    .await;
    let one = uf::GetParams {
        max_urls_per_queue: 1,
        delay_requestable: 600,
        item: crawl("d"),
        ..Default::default()
    };
    let many = uf::GetParams {
        max_urls_per_queue: 0,
        ..one.clone()
    };
    assert_eq!(get(&mut client, one).await, vec!["http://d.example/first"]);
    assert_eq!(
        get(&mut client, many).await,
        vec!["http://d.example/second", "http://d.example/third"],
        "due-date order, the first still leased"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_delay_counts_from_the_serve_and_an_empty_serve_does_not_start_it() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    let items: Vec<uf::UrlItem> = (0..4)
        .map(|i| discovered(&format!("http://s.example/{i}"), "s"))
        .collect();
    put(&mut client, items).await;
    let delay = std::time::Duration::from_secs(2);
    client
        .set_delay(uf::QueueDelayParams {
            key: "s.example".into(),
            delay_requestable: 2,
            crawl_id: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let one = uf::GetParams {
        max_urls_per_queue: 1,
        delay_requestable: 600,
        item: crawl("s"),
        ..Default::default()
    };
    let before_serve = std::time::Instant::now();
    let first = get(&mut client, one.clone()).await;
    assert_eq!(first.len(), 1);
    assert!(
        get(&mut client, one.clone()).await.is_empty(),
        "within the delay"
    );
    // Reported three quarters into the delay: the next serve still comes
    // a delay after the first serve, not after the report.
    tokio::time::sleep(delay * 3 / 4).await;
    put(&mut client, vec![known(&first[0], "s", 0)]).await;
    let reported = std::time::Instant::now();
    let second = loop {
        let got = get(&mut client, one.clone()).await;
        if !got.is_empty() {
            break got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let served_again = std::time::Instant::now();
    assert_eq!(second.len(), 1);
    assert!(
        served_again - before_serve >= delay,
        "served within the delay"
    );
    assert!(
        served_again - reported < delay * 3 / 4,
        "the delay ran from the report: served {:?} after it",
        served_again - reported
    );
    // At its per-queue maximum, calls hand out nothing and do not start
    // the delay: once the lease is reported, a delay after the second
    // serve, the queue serves again.
    let at_limit = std::time::Instant::now();
    while at_limit.elapsed() < delay {
        assert!(get(&mut client, one.clone()).await.is_empty());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    put(&mut client, vec![known(&second[0], "s", 0)]).await;
    assert_eq!(get(&mut client, one.clone()).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_to_hold_queues_gets_them_until_it_lets_go() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    let items: Vec<uf::UrlItem> = (0..6)
        .map(|i| discovered(&format!("http://h.example/{i}"), "h"))
        .collect();
    put(&mut client, items).await;
    let params = uf::GetParams {
        max_urls_per_queue: 2,
        delay_requestable: 600,
        item: crawl("h"),
        ..Default::default()
    };
    let held = get_holding(&mut client, params.clone()).await;
    assert_eq!(held.len(), 2);
    let any = uf::GetParams {
        max_urls_per_queue: 0,
        ..params.clone()
    };
    assert!(get(&mut client, any.clone()).await.is_empty(), "held");
    put(&mut client, vec![known(&held[0], "h", 0)]).await;
    assert!(
        get_holding(&mut client, params.clone()).await.is_empty(),
        "still held"
    );
    put(&mut client, vec![known(&held[1], "h", 0)]).await;
    assert_eq!(get(&mut client, any).await.len(), 4, "let go");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_get_urls_against_one_queue_never_share_a_url() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    let items: Vec<uf::UrlItem> = (0..200)
        .map(|i| discovered(&format!("http://one.example/{i}"), "cc"))
        .collect();
    put(&mut client, items).await;
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for _ in 0..10 {
                    mine.extend(
                        get(
                            &mut client,
                            uf::GetParams {
                                max_urls_per_queue: 5,
                                delay_requestable: 600,
                                item: crawl("cc"),
                                ..Default::default()
                            },
                        )
                        .await,
                    );
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for call in calls {
        all.extend(call.await.unwrap());
    }
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "a URL leased twice");
    // The gate holds under concurrency: at most 5 leased from the queue.
    assert_eq!(all.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_count_and_queue_paging_at_the_edges() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    let mut items: Vec<uf::UrlItem> = (0..30)
        .map(|i| discovered(&format!("http://h{}.example/Page{i}", i % 3), "L"))
        .collect();
    items.push(known("http://h0.example/done", "L", 0));
    put(&mut client, items).await;
    // Queues: 3, paged; start past the end is empty with the total.
    let queues = |start, size, include_inactive| uf::Pagination {
        start,
        size,
        include_inactive,
        crawl_id: "L".into(),
        local: false,
    };
    let page = client
        .list_queues(queues(0, 2, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.values, vec!["h0.example", "h1.example"]);
    assert_eq!((page.total, page.start, page.size), (3, 0, 2));
    let past = client
        .list_queues(queues(10, 2, false))
        .await
        .unwrap()
        .into_inner();
    assert!(past.values.is_empty());
    assert_eq!(past.total, 3);
    let default_size = client
        .list_queues(queues(0, 0, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        default_size.values.len(),
        3,
        "size 0 means the default page"
    );
    // ListURLs: completed first, paged, filtered.
    let all = list(
        &mut client,
        uf::ListUrlParams {
            crawl_id: "L".into(),
            size: 1000,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(all.len(), 31);
    assert_eq!(all[0].id, "http://h0.example/done", "completed first");
    let page = list(
        &mut client,
        uf::ListUrlParams {
            crawl_id: "L".into(),
            start: 29,
            size: 10,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(page.len(), 2);
    let past = list(
        &mut client,
        uf::ListUrlParams {
            crawl_id: "L".into(),
            start: 100,
            ..Default::default()
        },
    )
    .await;
    assert!(past.is_empty());
    let filtered = list(
        &mut client,
        uf::ListUrlParams {
            crawl_id: "L".into(),
            filter: Some("page1".into()),
            ignore_case: Some(true),
            size: 100,
            ..Default::default()
        },
    )
    .await;
    // Page1, Page10..Page19.
    assert_eq!(filtered.len(), 11);
    let count = |filter: Option<&str>, ignore_case, key: &str| uf::CountUrlParams {
        key: key.into(),
        crawl_id: "L".into(),
        filter: filter.map(str::to_owned),
        ignore_case: Some(ignore_case),
        local: None,
    };
    let counted = |c: uf::CountUrlParams| {
        let mut client = client.clone();
        async move { client.count_ur_ls(c).await.unwrap().into_inner().value }
    };
    assert_eq!(counted(count(None, false, "")).await, 31);
    assert_eq!(
        counted(count(Some("page1"), false, "")).await,
        0,
        "case matters"
    );
    assert_eq!(counted(count(Some("page1"), true, "")).await, 11);
    assert_eq!(counted(count(None, false, "h1.example")).await, 10);
    assert_eq!(counted(count(Some("nothing-matches"), true, "")).await, 0);
    // Unknown crawl: empty answers, not errors.
    let none = client
        .count_ur_ls(uf::CountUrlParams {
            crawl_id: "no-such-crawl".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(none.value, 0);
    let nodes = client.list_nodes(uf::Empty {}).await.unwrap().into_inner();
    assert_eq!(nodes.values, vec![frontier.addr.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_let_urls_be_discovered_again() {
    for mode in ["exact", "bloom"] {
        let dir = tempfile::tempdir().unwrap();
        let frontier = FrontierProcess::start(
            &dir.path().join("data"),
            &[
                "--partitions",
                "4",
                "--dedup",
                mode,
                "--default-delay-ms",
                "0",
            ],
        );
        let mut client = frontier.client().await;
        let urls: Vec<String> = (0..40)
            .map(|i| format!("http://d{}.example/{i}", i % 4))
            .collect();
        put(
            &mut client,
            urls.iter().map(|u| discovered(u, "D")).collect(),
        )
        .await;
        put(
            &mut client,
            urls.iter().map(|u| discovered(u, "keep")).collect(),
        )
        .await;
        // DeleteQueue: that queue's URLs only.
        let gone = client
            .delete_queue(uf::QueueWithinCrawlParams {
                key: "d0.example".into(),
                crawl_id: "D".into(),
                local: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(gone.value, 10, "{mode}");
        let back = put(&mut client, vec![discovered("http://d0.example/0", "D")]).await;
        assert_eq!(back, vec![Ack::Ok], "{mode}: a deleted URL is new again");
        // DeleteCrawl: everything of the crawl, nothing of the other.
        let gone = client
            .delete_crawl(uf::DeleteCrawlMessage {
                value: "D".into(),
                local: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(gone.value, 31, "{mode}");
        let crawls = client
            .list_crawls(uf::Local::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(crawls.values, vec!["keep"], "{mode}");
        let back = put(
            &mut client,
            urls.iter().map(|u| discovered(u, "D")).collect(),
        )
        .await;
        assert!(back.iter().all(|a| *a == Ack::Ok), "{mode}: {back:?}");
        let kept = put(&mut client, vec![discovered(&urls[0], "keep")]).await;
        assert_eq!(
            kept,
            vec![Ack::Skipped],
            "{mode}: the other crawl keeps its URLs"
        );
        // PurgeURLs with 0 days: everything created before now.
        let purged = client
            .purge_ur_ls(uf::PurgeUrlParams {
                key: String::new(),
                crawl_id: "keep".into(),
                days: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(purged.value <= 40, "{mode}");
        let mut admin = frontier.admin().await;
        let health = admin
            .get_filter_health(proto::admin::GetFilterHealthRequest::default())
            .await
            .unwrap()
            .into_inner();
        let total = health.total.unwrap();
        let left = client
            .count_ur_ls(uf::CountUrlParams {
                crawl_id: "keep".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .value;
        assert_eq!(
            total.items_inserted,
            40 + left,
            "{mode}: health follows deletions"
        );
        if mode == "bloom" {
            assert!(total.rebuild_count > 0, "bloom mode forgets by rebuilding");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_log_level_changes_a_module_at_run_time() {
    let (frontier, _dir) = frontier().await;
    let mut client = frontier.client().await;
    client
        .set_log_level(uf::LogLevelParams {
            package: "frontier::grpc".into(),
            level: uf::log_level_params::Level::Debug as i32,
            local: true,
        })
        .await
        .unwrap();
    assert!(frontier.log_text().contains("log level changed"));
    let bad = client
        .set_log_level(uf::LogLevelParams {
            package: "not a [module".into(),
            level: uf::log_level_params::Level::Debug as i32,
            local: true,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_move_a_crawl_between_frontiers() {
    let (source, dir) = frontier().await;
    let mut client = source.client().await;
    let mut items: Vec<uf::UrlItem> = (0..25)
        .map(|i| discovered(&format!("http://m.example/{i}"), "move"))
        .collect();
    items.push(known("http://m.example/done", "move", 0));
    put(&mut client, items).await;
    // The crawl's own revisit policy goes with it.
    let (status, text) = crawl_tests::frontier_cli(
        &source.endpoint(),
        &[
            "revisit",
            "--crawl",
            "move",
            "--policy",
            "adaptive",
            "--min-secs",
            "600",
            "--max-secs",
            "86400",
        ],
    );
    assert!(status.success(), "{text}");
    let file = dir.path().join("crawl.jsonl");
    let (status, text) = crawl_tests::frontier_cli(
        &source.endpoint(),
        &[
            "export",
            "--crawl",
            "move",
            "--output",
            file.to_str().unwrap(),
        ],
    );
    assert!(status.success(), "{text}");
    let exported = std::fs::read_to_string(&file).unwrap();
    assert_eq!(exported.lines().count(), 27, "{exported}");
    assert!(
        exported.lines().next().unwrap().starts_with("{\"revisit\""),
        "{exported}"
    );

    let (target, _target_dir) = frontier().await;
    let (status, text) =
        crawl_tests::frontier_cli(&target.endpoint(), &["import", file.to_str().unwrap()]);
    assert!(status.success(), "{text}");
    assert!(text.contains("imported 26 of 26"), "{text}");
    let revisit = target
        .admin()
        .await
        .get_progress(proto::admin::GetProgressRequest {
            crawl_id: "move".into(),
            local: false,
        })
        .await
        .unwrap()
        .into_inner()
        .revisit
        .unwrap();
    assert_eq!(
        (
            revisit.policy.as_str(),
            revisit.min_secs,
            revisit.max_secs,
            revisit.own
        ),
        ("adaptive", 600, 86400, true)
    );
    let mut moved = target.client().await;
    let stats = moved
        .get_stats(uf::QueueWithinCrawlParams {
            crawl_id: "move".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.size, stats.counts["completed"]), (25, 1));
    // A damaged file is refused before anything is sent.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"known\":{\"info\":{\"url\":\"http://x.example/\"}}}\nnot json\n",
    )
    .unwrap();
    let (status, text) =
        crawl_tests::frontier_cli(&target.endpoint(), &["import", bad.to_str().unwrap()]);
    assert!(!status.success());
    assert!(text.contains("line 2"), "{text}");
    // So is a policy no crawl could have, with nothing set.
    std::fs::write(
        &bad,
        "{\"revisit\":{\"crawlID\":\"move\",\"policy\":\"fixed\",\"minSecs\":0}}\n\
         {\"known\":{\"info\":{\"url\":\"http://x.example/\"}}}\n",
    )
    .unwrap();
    let (status, text) =
        crawl_tests::frontier_cli(&target.endpoint(), &["import", bad.to_str().unwrap()]);
    assert!(!status.success());
    assert!(
        text.contains("line 1") && text.contains("revisit"),
        "{text}"
    );
    let nothing = moved
        .get_url_status(uf::UrlStatusRequest {
            url: "http://x.example/".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(nothing.code(), tonic::Code::NotFound);
}
