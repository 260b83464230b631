//! Serving a [`Frontier`](crate::service::Frontier) over gRPC: the URL Frontier API, the admin API,
//! the standard health service and server reflection, on a listener the
//! caller bound (tests bind port 0 and pass it in).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::grpc::{AdminService, ServerOptions, UrlFrontierService};
use crate::service::SharedFrontier;

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

/// Connections served at once unless configured otherwise; more are closed
/// as they arrive (each holds HTTP/2 buffers, up to its streams times their
/// window). One address may hold a quarter of them (`admission`).
pub const MAX_CONNECTIONS: usize = 512;

/// Calls open at once on one connection. A worker needs a handful (its
/// lease loop and its put streams); the bound keeps one connection from
/// holding thousands of idle streams' buffers.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;

/// Flow-control window of one call: what a client may send ahead of what
/// the handler has read. A PutURLs call of a thousand items is about
/// 100 KiB; a window under that makes each such call wait a round trip for
/// a window update (BENCHMARKS.md, "Frontier over gRPC").
const STREAM_WINDOW: u32 = 256 << 10;

/// Flow-control window of a connection. The HTTP/2 library budgets small
/// DATA frames per connection at half this window and answers a client
/// that exhausts it with GOAWAY ENHANCE_YOUR_CALM. gRPC clients such as
/// grpcio send each small message (a URL item is about a hundred bytes) as
/// a DATA frame of its own, and while a handler commits a batch the frames
/// wait in the library's buffers; with the default windows (1 MiB each)
/// a stream's backlog alone outgrew the budget. Here every stream of a
/// connection can be backed up at once (32 streams x 256 KiB = 8 MiB)
/// within the budget (32 MiB) for messages down to about 52 bytes.
const CONNECTION_WINDOW: u32 = 64 << 20;

/// Serves until `shutdown` completes, then stops taking calls and waits for
/// the ones in flight (so their acks go out after their commits). The
/// caller then shuts the frontier down. Mutating calls need
/// `options.access`.
pub async fn run(
    listener: TcpListener,
    frontier: SharedFrontier,
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
    let max_connections = match options.max_connections {
        0 => MAX_CONNECTIONS,
        limit => limit,
    };
    frontier.start_address_lookups();
    let watcher = tokio::spawn(watch_writes(Some(health.clone()), Arc::clone(&frontier)));
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = options.tls.clone() {
        builder = builder.tls_config(tls)?;
    }
    let (stopping, stopping_seen) = tokio::sync::watch::channel(false);
    let router = builder
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .layer(crate::auth::AuthLayer(options.access.clone()))
        .add_routes(frontier_routes(frontier, &options, stopping_seen))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha);
    let (grace_starts, stopped) = tokio::sync::oneshot::channel();
    let signal = async move {
        shutdown.await;
        let _ = stopping.send(true);
        let _ = grace_starts.send(());
    };
    let serving = router.serve_with_incoming_shutdown(
        crate::admission::incoming(listener, max_connections),
        signal,
    );
    // Write streams end at the signal (workers would keep them open for as
    // long as they run); any other call still open after a grace is
    // dropped (an ack not sent is a write the client sends again; nothing
    // acknowledged is lost).
    let grace_over = async move {
        if stopped.await.is_ok() {
            tokio::time::sleep(CALLS_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let served = tokio::select! {
        served = serving => served,
        () = grace_over => {
            tracing::warn!(
                grace_secs = CALLS_GRACE.as_secs(),
                "calls still open after the shutdown's grace (such as workers' streams): closed"
            );
            Ok(())
        }
    };
    watcher.abort();
    let _ = watcher.await;
    served?;
    Ok(())
}

/// The URL Frontier and admin services of `frontier` (routed through the
/// cluster when it has one); write streams end when `stopping` turns true.
fn frontier_routes(
    frontier: SharedFrontier,
    options: &ServerOptions,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> tonic::service::Routes {
    use proto::admin::admin_server::AdminServer;
    use proto::urlfrontier::url_frontier_server::UrlFrontierServer;
    let local =
        UrlFrontierService::new(Arc::clone(&frontier), options.clone()).ending_streams_on(stopping);
    let local_admin = AdminService::new(frontier, options.node.clone());
    match &options.cluster {
        Some(cluster) => tonic::service::Routes::new(UrlFrontierServer::new(
            crate::cluster::ClusterRouter::new(local, Arc::clone(cluster)),
        ))
        .add_service(AdminServer::new(crate::cluster::ClusterAdmin::new(
            local_admin,
            Arc::clone(cluster),
        ))),
        None => tonic::service::Routes::new(UrlFrontierServer::new(local))
            .add_service(AdminServer::new(local_admin)),
    }
}

/// The frontier's services called in this process, without a network
/// connection between client and server: for workers that run beside the
/// frontier (the `crawl` command). The same handlers, access rules and
/// protobuf messages as over the network; no health or reflection service,
/// which only network clients use.
pub struct InProcess {
    routes: crate::auth::Authorize<tonic::service::Routes>,
    stopping: tokio::sync::watch::Sender<bool>,
    watcher: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Starts serving `frontier` in process (the watch that keeps writes
    /// going after a full disk included, as [`run`] has).
    pub fn start(frontier: SharedFrontier, mut options: ServerOptions) -> Self {
        if options.node.is_empty() {
            options.node = IN_PROCESS_NODE.to_owned();
        }
        let (stopping, stopping_seen) = tokio::sync::watch::channel(false);
        frontier.start_address_lookups();
        let watcher = tokio::spawn(watch_writes(None, Arc::clone(&frontier)));
        let routes = tower_layer::Layer::layer(
            &crate::auth::AuthLayer(options.access.clone()),
            frontier_routes(frontier, &options, stopping_seen).prepare(),
        );
        Self {
            routes,
            stopping,
            watcher,
        }
    }

    /// What clients call through.
    #[must_use]
    pub fn transport(&self) -> proto::transport::Transport {
        proto::transport::Transport::in_process(self.routes.clone())
    }

    /// Ends the write streams still open and the watch; clients holding a
    /// transport keep the frontier until they drop it.
    pub async fn stop(self) {
        let _ = self.stopping.send(true);
        self.watcher.abort();
        let _ = self.watcher.await;
    }
}

/// How a frontier served in process names itself in ListNodes.
pub const IN_PROCESS_NODE: &str = "in-process";

/// How long a shutdown waits for the calls in flight to end.
const CALLS_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How often the health service looks at whether the store takes writes.
const WRITE_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps the health service's answer (when served) in step with the store: NOT_SERVING
/// while it refuses writes (a full disk, or a failure that halted them), so
/// that probes and load balancers see it, SERVING again when writes resume.
/// It is also what reopens the store's files after a failed write, once
/// the disk has room ([`crate::store::Store::recover_if_needed`]).
async fn watch_writes(
    health: Option<tonic_health::server::HealthReporter>,
    frontier: SharedFrontier,
) {
    use tonic_health::ServingStatus;
    const SERVICES: [&str; 2] = ["", "urlfrontier.URLFrontier"];
    let mut serving = true;
    let mut interval = tokio::time::interval(WRITE_CHECK_INTERVAL);
    loop {
        interval.tick().await;
        let frontier = Arc::clone(&frontier);
        let Ok(state) = tokio::task::spawn_blocking(move || {
            let store = frontier.ingest().store();
            if let Err(error) = store.recover_if_needed() {
                tracing::debug!(%error, "store files not reopened yet");
            }
            store.write_state()
        })
        .await
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
            if let Some(health) = &health {
                health.set_service_status(service, status).await;
            }
        }
    }
}
