//! The frontier as a real process, moving its data: filter rebuilds under
//! concurrent puts and serves, and CopyPartition paging through a store.

use std::collections::{BTreeSet, HashSet};

use crawl_tests::FrontierProcess;
use crawl_tests::process_items::{discovered, known, put_batches, put_urls, url};
use futures::StreamExt;
use proto::urlfrontier::{
    self as uf, DiscoveredBatch, GetParams, KnownUrlItem, UrlInfo, UrlItem,
    ack_message::Status as Ack, url_item,
};

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
                    done: None,
                    items: chunk
                        .iter()
                        .map(|&n| UrlInfo {
                            url: url(n),
                            ..UrlInfo::default()
                        })
                        .collect(),
                })
                .collect();
            let acks = put_batches(&mut client, batches).await;
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
                    lag_of: String::new(),
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
