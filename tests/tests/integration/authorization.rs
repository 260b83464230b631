//! The admin token is checked in one place for every method of both
//! services. The methods are read from the services' own descriptors, so a
//! method added later is covered without this test naming it: without the
//! token every method outside the open list (reads and the data plane) is
//! refused, and with `--token-for-all` every method is.

use crawl_tests::{FrontierProcess, RawCodec};
use prost::Message;

/// Every method of the URL Frontier and admin services, as gRPC paths.
fn every_method() -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut paths = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                paths.push(format!(
                    "/{}.{}/{}",
                    file.package(),
                    service.name(),
                    method.name()
                ));
            }
        }
    }
    assert!(paths.len() >= 24, "{paths:?}");
    paths
}

/// Calls `path` with one empty message and no token; answers the status
/// code it failed with, if it failed at once.
async fn call_without_token(frontier: &FrontierProcess, path: &str) -> Option<tonic::Code> {
    let channel = tonic::transport::Channel::from_shared(frontier.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let request = tonic::Request::new(futures::stream::iter([Vec::<u8>::new()]));
    match grpc
        .streaming(request, path.parse().unwrap(), RawCodec)
        .await
    {
        Ok(response) => {
            let mut stream = response.into_inner();
            // Drain the answer; a call that fails later says so here.
            loop {
                match stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return None,
                    Err(status) => return Some(status.code()),
                }
            }
        }
        Err(status) => Some(status.code()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_outside_the_open_list_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(&dir.path().join("data"), &["--admin-token", "s3cret"]);
    let open = frontier::auth::OPEN_METHODS;
    for path in every_method() {
        let code = call_without_token(&frontier, &path).await;
        if open.contains(&path.as_str()) {
            assert_ne!(code, Some(tonic::Code::Unauthenticated), "{path} is open");
        } else {
            assert_eq!(
                code,
                Some(tonic::Code::Unauthenticated),
                "{path} needs the token"
            );
        }
    }
    // Every open method is a method the services have.
    let methods = every_method();
    for path in open {
        assert!(methods.iter().any(|m| m == path), "{path} is not a method");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_token_for_all_every_method_needs_it_but_health() {
    let dir = tempfile::tempdir().unwrap();
    let frontier = FrontierProcess::start(
        &dir.path().join("data"),
        &["--admin-token", "s3cret", "--token-for-all"],
    );
    for path in every_method() {
        assert_eq!(
            call_without_token(&frontier, &path).await,
            Some(tonic::Code::Unauthenticated),
            "{path}"
        );
    }
    let (status, out) = crawl_tests::frontier_cli(&frontier.endpoint(), &["probe"]);
    assert!(status.success(), "health must stay open: {out}");
    let (status, out) =
        crawl_tests::frontier_cli(&frontier.endpoint(), &["status", "--token", "s3cret"]);
    assert!(status.success(), "{out}");
}
