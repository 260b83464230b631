//! A grpcio client (Python, as most URL Frontier clients are not Rust)
//! streams 200,000 items through PutURLs while Rust clients ingest on
//! other connections: every item is acknowledged, with no GOAWAY from the
//! server's HTTP/2 layer. Skipped, with a message, where Python's grpcio
//! and grpcio-tools are not installed (`.ci/run` installs them).

use std::path::Path;
use std::process::Command;

use crawl_tests::FrontierProcess;
use proto::urlfrontier::{DiscoveredBatch, UrlInfo};

const ITEMS: usize = 200_000;

fn grpcio_available() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Streams `batches` PutDiscovered batches of 256 URLs on one stream;
/// answers how many URLs were acknowledged.
async fn ingest(frontier: &FrontierProcess, client_id: usize, batches: usize) -> usize {
    let mut client = frontier.client().await;
    let stream = futures::stream::iter((0..batches).map(move |b| {
        DiscoveredBatch {
            id: b.to_string(),
            done: None,
            items: (0..256)
                .map(|i| UrlInfo {
                    url: format!("http://rs{client_id}-{}.example/{b}/{i}", i % 31),
                    crawl_id: "rust".into(),
                    ..UrlInfo::default()
                })
                .collect(),
        }
    }));
    let mut acks = client.put_discovered(stream).await.unwrap().into_inner();
    let mut acked = 0;
    while let Some(ack) = acks.message().await.unwrap() {
        acked += ack.statuses.len();
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_client_streams_200_000_items_while_others_ingest() {
    if !grpcio_available() {
        eprintln!(
            "SKIPPED: python3 with grpcio and grpcio-tools is needed (pip install grpcio grpcio-tools; .ci/run installs them)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &["--scope", "any"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("grpcio/put_urls.py");
    let protos = root.join("../proto/proto");
    let address = frontier.addr.to_string();
    let python = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .arg(address)
            .arg(protos)
            .arg(ITEMS.to_string())
            .arg("python")
            .output()
            .expect("python3 runs")
    });
    let rust = futures::future::join_all((0..3).map(|id| ingest(&frontier, id, 200))).await;
    let output = python.await.unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the grpcio client failed: {text}");
    assert!(
        text.contains(&format!("acked {ITEMS} ok {ITEMS}")),
        "{text}"
    );
    assert_eq!(rust, vec![200 * 256; 3]);
    let count = frontier
        .client()
        .await
        .count_ur_ls(proto::urlfrontier::CountUrlParams {
            crawl_id: "python".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .value;
    assert_eq!(count, ITEMS as u64);
}
