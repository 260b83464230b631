//! Serving a [`Frontier`] over gRPC: the URL Frontier API, the admin API,
//! the standard health service and server reflection, on a listener the
//! caller bound (tests bind port 0 and pass it in).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

use crate::grpc::{AdminService, ServerOptions, UrlFrontierService};
use crate::service::Frontier;

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The transport failed.
    #[error("gRPC transport failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not read our descriptors.
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Accepted connections with Nagle's algorithm off: calls are small
/// request/answer exchanges, and Nagle's wait for an ACK (which the peer
/// delays) would add tens of milliseconds to each one.
fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        if let Ok(stream) = &accepted {
            let _ = stream.set_nodelay(true);
        }
        accepted
    })
}

/// Serves until `shutdown` completes, then stops taking calls and waits for
/// the ones in flight (so their acks go out after their commits). The
/// caller then shuts the frontier down. Mutating calls need
/// `options.access`.
pub async fn run(
    listener: TcpListener,
    frontier: Arc<Frontier>,
    mut options: ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    if options.node.is_empty()
        && let Ok(address) = listener.local_addr()
    {
        options.node = address.to_string();
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<proto::urlfrontier::url_frontier_server::UrlFrontierServer<UrlFrontierService>>()
        .await;
    health
        .set_serving::<proto::admin::admin_server::AdminServer<AdminService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let watcher = tokio::spawn(watch_writes(health.clone(), Arc::clone(&frontier)));
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(
            proto::urlfrontier::url_frontier_server::UrlFrontierServer::new(
                UrlFrontierService::new(Arc::clone(&frontier), options.clone()),
            ),
        )
        .add_service(proto::admin::admin_server::AdminServer::new(
            AdminService::new(frontier, options.access),
        ))
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await;
    watcher.abort();
    let _ = watcher.await;
    served?;
    Ok(())
}

/// How often the health service looks at whether the store takes writes.
const WRITE_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps the health service's answer in step with the store: NOT_SERVING
/// while it refuses writes (a full disk, or a failure that halted them), so
/// that probes and load balancers see it, SERVING again when writes resume.
/// Reads are served all along.
async fn watch_writes(health: tonic_health::server::HealthReporter, frontier: Arc<Frontier>) {
    use tonic_health::ServingStatus;
    const SERVICES: [&str; 2] = ["", "urlfrontier.URLFrontier"];
    let mut serving = true;
    let mut interval = tokio::time::interval(WRITE_CHECK_INTERVAL);
    loop {
        interval.tick().await;
        let frontier = Arc::clone(&frontier);
        let Ok(state) =
            tokio::task::spawn_blocking(move || frontier.ingest().store().write_state()).await
        else {
            continue;
        };
        if state.is_ok() == serving {
            continue;
        }
        serving = state.is_ok();
        match state {
            Ok(()) => tracing::info!("writes are taken again; health: SERVING"),
            Err(error) => tracing::warn!(%error, "writes are refused; health: NOT_SERVING"),
        }
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in SERVICES {
            health.set_service_status(service, status).await;
        }
    }
}
