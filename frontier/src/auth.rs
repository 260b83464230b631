//! Who may call what: the admin token, checked once for every call by a
//! layer in front of both services (not in each handler, so that a method
//! added later cannot skip it).
//!
//! With a token set, every method of the URL Frontier and admin services
//! needs `authorization: Bearer TOKEN` except those in [`OPEN_METHODS`]:
//! reads, and the data plane crawlers use (GetURLs, PutURLs,
//! PutDiscovered). With [`TokenScope::All`] those need it too. The health
//! and reflection services stay open, for probes and tools.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;

/// The methods a token set for control calls leaves open: every read, and
/// the data plane. A method not named here needs the token, so a new
/// method is guarded until it is named.
pub const OPEN_METHODS: &[&str] = &[
    "/urlfrontier.URLFrontier/ListNodes",
    "/urlfrontier.URLFrontier/ListCrawls",
    "/urlfrontier.URLFrontier/ListQueues",
    "/urlfrontier.URLFrontier/GetURLs",
    "/urlfrontier.URLFrontier/PutURLs",
    "/urlfrontier.URLFrontier/PutDiscovered",
    "/urlfrontier.URLFrontier/GetStats",
    "/urlfrontier.URLFrontier/GetActive",
    "/urlfrontier.URLFrontier/GetURLStatus",
    "/urlfrontier.URLFrontier/ListURLs",
    "/urlfrontier.URLFrontier/CountURLs",
    "/frontier.admin.v1.Admin/GetFilterHealth",
    "/frontier.admin.v1.Admin/GetProgress",
    "/frontier.admin.v1.Admin/CheckUrl",
    "/frontier.admin.v1.Admin/GetCluster",
    "/frontier.admin.v1.Admin/GetRobots",
];

/// The services the token guards; others (health, reflection) are open.
const GUARDED_SERVICES: &[&str] = &["/urlfrontier.URLFrontier/", "/frontier.admin.v1.Admin/"];

/// Which calls the token guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenScope {
    /// Calls that change the frontier, other than the data plane.
    #[default]
    Control,
    /// Every call of the URL Frontier and admin services.
    All,
}

/// Who may call what.
#[derive(Debug, Clone, Default)]
pub struct Access {
    token: Option<Arc<str>>,
    scope: TokenScope,
}

impl Access {
    /// Everyone (no token configured).
    #[must_use]
    pub fn open() -> Self {
        Self::default()
    }

    /// Only holders of `token`, for the calls `scope` names.
    #[must_use]
    pub fn token(token: &str, scope: TokenScope) -> Self {
        Self {
            token: Some(Arc::from(token)),
            scope,
        }
    }

    /// Whether a call of `path` (`/package.Service/Method`) needs the
    /// token.
    #[must_use]
    pub fn guards(&self, path: &str) -> bool {
        self.token.is_some()
            && GUARDED_SERVICES
                .iter()
                .any(|service| path.starts_with(service))
            && (self.scope == TokenScope::All || !OPEN_METHODS.contains(&path))
    }

    /// Refuses a call of `path` that needs the token and lacks it.
    pub fn check(&self, path: &str, headers: &http::HeaderMap) -> Result<(), Status> {
        let Some(token) = self.token.as_deref().filter(|_| self.guards(path)) else {
            return Ok(());
        };
        let presented = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match presented {
            Some(presented) if constant_time_eq(presented.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Status::permission_denied("wrong admin token")),
            None => Err(Status::unauthenticated(format!(
                "{path} needs the admin token: send it as `authorization: Bearer TOKEN`"
            ))),
        }
    }
}

impl Access {
    /// Whether `headers` carry the token (or none is set): what the web
    /// dashboard's data asks, whatever the scope, since it shows every
    /// crawl's figures at once.
    #[must_use]
    pub fn holds_token(&self, headers: &http::HeaderMap) -> bool {
        let Some(token) = self.token.as_deref() else {
            return true;
        };
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|presented| constant_time_eq(presented.as_bytes(), token.as_bytes()))
    }
}

/// Compares in a time that depends on the expected token's length alone:
/// the loop runs over the expected token whatever is presented, so the
/// time says nothing of the presented token's length or of where it first
/// differs.
pub(crate) fn constant_time_eq(presented: &[u8], expected: &[u8]) -> bool {
    let mut difference = u8::from(presented.len() != expected.len());
    for (i, byte) in expected.iter().enumerate() {
        difference |= presented.get(i).map_or(0xff, |p| p ^ byte);
    }
    std::hint::black_box(difference) == 0
}

/// The layer that checks [`Access`] before any service sees a call.
#[derive(Debug, Clone)]
pub struct AuthLayer(pub Access);

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorize {
            inner,
            access: self.0.clone(),
        }
    }
}

/// A service behind [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Authorize<S> {
    inner: S,
    access: Access,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for Authorize<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.access.check(request.uri().path(), request.headers()) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_of_every_length_compare_right() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        for wrong in [
            &b""[..],
            b"s3cre",
            b"s3cret!",
            b"S3cret",
            b"s3creT",
            b"\xff\xff",
        ] {
            assert!(!constant_time_eq(wrong, b"s3cret"), "{wrong:?}");
        }
    }

    #[test]
    fn scopes_guard_what_they_say() {
        let control = Access::token("t", TokenScope::Control);
        let all = Access::token("t", TokenScope::All);
        for (path, by_control) in [
            ("/urlfrontier.URLFrontier/SetActive", true),
            ("/urlfrontier.URLFrontier/SomeNewMethod", true),
            ("/urlfrontier.URLFrontier/GetURLs", false),
            ("/frontier.admin.v1.Admin/AddSeeds", true),
            ("/frontier.admin.v1.Admin/GetProgress", false),
        ] {
            assert_eq!(control.guards(path), by_control, "{path}");
            assert!(all.guards(path), "{path}");
        }
        for open in [
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        ] {
            assert!(!all.guards(open), "{open}");
        }
        assert!(!Access::open().guards("/urlfrontier.URLFrontier/SetActive"));
    }
}
