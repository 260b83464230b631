//! What the generated clients send their calls through: a network channel,
//! or the server's own services in the same process.
//!
//! The in-process form is for a frontier and its workers in one process
//! (the `crawl` command): the same clients, handlers and protobuf messages,
//! without the HTTP/2 framing, connection tasks and loopback socket
//! writes that would otherwise sit between them on every call.

use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::Channel;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

/// Any error a transport gives.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Direct = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError>;

/// A network channel or a service in this process, behind one type so that
/// a client works with either.
#[derive(Clone)]
pub enum Transport {
    /// A connection (lazy, reconnecting) to a server's address.
    Network(Channel),
    /// The server's services, called directly.
    InProcess(Direct),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Network(channel) => f.debug_tuple("Network").field(channel).finish(),
            Self::InProcess(_) => f.write_str("InProcess"),
        }
    }
}

impl Transport {
    /// Calls go straight to `service` (such as a server's routes).
    pub fn in_process<S>(service: S) -> Self
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        Self::InProcess(BoxCloneSyncService::new(service.map_err(Into::into)))
    }
}

impl Service<http::Request<Body>> for Transport {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self {
            Self::Network(channel) => channel.poll_ready(cx).map_err(Into::into),
            Self::InProcess(service) => service.poll_ready(cx),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match self {
            Self::Network(channel) => {
                let call = channel.call(request);
                Box::pin(async move { call.await.map_err(Into::into) })
            }
            Self::InProcess(service) => service.call(request),
        }
    }
}
