//! The gRPC client the worker calls its frontier through, and how long it
//! waits before calling again after a failure. A leaf: the frontier link
//! and its acknowledged streams both use it.

use std::time::Duration;

use proto::bearer::Bearer;
use proto::transport::Transport;
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;
use tonic::service::interceptor::InterceptedService;

/// The client the link calls through.
pub type Client = UrlFrontierClient<InterceptedService<Transport, Bearer>>;

/// Delay before the `attempt`-th retry: doubling from 100 ms, at most 10 s.
#[must_use]
pub fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(100_u64.saturating_mul(1 << attempt.min(7)).min(10_000))
}
