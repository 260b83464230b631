//! The Prometheus text endpoint both binaries serve: `GET /metrics` on a
//! listener the caller bound (so that a caller asking for port 0 can report
//! the port it got), rendered on a blocking thread because rendering reads
//! every metric.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;
use tokio::net::TcpListener;

/// Serves `GET /metrics` with the text `render` answers, until `shutdown`
/// completes. Other paths answer 404.
pub async fn serve<R>(listener: TcpListener, render: R, shutdown: impl Future<Output = ()>)
where
    R: Fn() -> String + Clone + Send + Sync + 'static,
{
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let render = render.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let render = render.clone();
                    async move {
                        let response = if request.uri().path() == "/metrics" {
                            let text = tokio::task::spawn_blocking(render)
                                .await
                                .unwrap_or_default();
                            hyper::Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(text)))
                        } else {
                            hyper::Response::builder()
                                .status(404)
                                .body(Full::new(Bytes::from_static(b"metrics are at /metrics\n")))
                        };
                        Ok::<_, Infallible>(response.unwrap_or_default())
                    }
                },
            );
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
        });
    }
}
