//! HTTP fetching: one reqwest client with timeouts, transparent
//! decompression, no redirects followed (the frontier dedups their
//! targets), a body cap applied to the decoded bytes (so a decompression
//! bomb stops at the cap), and an SSRF guard that refuses every address
//! that is not public ([`crate::ssrf`]) unless allowed, proxied or not.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::Url;

use crate::pinned::PinnedNames;

/// How fetches are made.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Sent with every request.
    pub user_agent: String,
    /// Connect and total timeout.
    pub timeout: Duration,
    /// Most body bytes read (decoded); the rest is dropped and the page
    /// marked truncated.
    pub max_body_bytes: usize,
    /// Allow private, loopback and link-local addresses.
    pub allow_private: bool,
    /// Most body bytes all fetches hold at once (bodies are kept until
    /// their page is written and parsed); see [`Fetcher::get`].
    pub max_inflight_bytes: usize,
    /// Fetch through this proxy (`http://`, `https://` or `socks5://`).
    /// Without it the proxy environment variables are ignored, so that no
    /// request reaches an internal name through a proxy the guard never saw.
    pub proxy: Option<String>,
    /// Names resolved to these addresses before DNS (`--hosts-file`).
    pub pinned: Arc<PinnedNames>,
}

/// What the last fetch of a page answered, to ask whether it changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validators {
    /// Its ETag, sent as If-None-Match.
    pub etag: Option<String>,
    /// Its Last-Modified, sent as If-Modified-Since.
    pub last_modified: Option<String>,
}

/// A fetched response.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// HTTP status.
    pub status: u16,
    /// "HTTP/1.1" or "HTTP/2.0".
    pub version: String,
    /// Response headers as received.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, decoded, at most `max_body_bytes`.
    pub body: Bytes,
    /// Whether the body was cut at the cap.
    pub truncated: bool,
    /// The peer's address, when known.
    pub peer: Option<SocketAddr>,
    /// From sending the request to the end of the body.
    pub duration: Duration,
    /// The share of the fetcher's in-flight budget the body holds; given
    /// back when the last copy of this response goes.
    pub budget: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl Fetched {
    /// A header's value as text.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// The media type, lower-case, without parameters.
    #[must_use]
    pub fn media_type(&self) -> Option<String> {
        self.header("content-type").map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
    }

    /// Whether links are extracted from it.
    #[must_use]
    pub fn is_html(&self) -> bool {
        matches!(
            self.media_type().as_deref(),
            Some("text/html" | "application/xhtml+xml")
        )
    }
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The address is private and private fetches are not allowed.
    #[error(
        "refused to fetch {0}: private, loopback or link-local address (--allow-private allows it)"
    )]
    PrivateAddress(String),
    /// Timed out.
    #[error("timed out")]
    Timeout,
    /// Could not connect.
    #[error("connection failed: {0}")]
    Connect(String),
    /// Anything else on the wire.
    #[error("request failed: {0}")]
    Other(String),
}

impl FetchError {
    /// Whether trying again later may work.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        !matches!(self, FetchError::PrivateAddress(_))
    }

    fn of(error: &reqwest::Error) -> Self {
        let text = error_chain(error);
        if text.contains("private, loopback or link-local") {
            FetchError::PrivateAddress(text)
        } else if error.is_timeout() {
            FetchError::Timeout
        } else if error.is_connect() {
            FetchError::Connect(text)
        } else {
            FetchError::Other(text)
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

pub use crate::ssrf::is_public;

/// Resolves names, pinned ones first, and unless private addresses are
/// allowed drops the non-public ones, so the guard also holds for names
/// that resolve to internal hosts (DNS rebinding included: the checked
/// addresses are the ones connected to).
#[derive(Debug, Clone)]
struct Resolver {
    names: names::Names,
    public_only: bool,
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let resolver = self.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = (resolver.names.lookup(&host).await?.into_iter())
                .map(|ip| SocketAddr::new(ip, 0))
                .collect();
            let usable: Vec<SocketAddr> = all
                .into_iter()
                .filter(|a| !resolver.public_only || is_public(a.ip()))
                .collect();
            if usable.is_empty() {
                let error: Box<dyn std::error::Error + Send + Sync> =
                    format!("{host} resolves only to private, loopback or link-local addresses")
                        .into();
                return Err(error);
            }
            let addrs: Addrs = Box::new(usable.into_iter());
            Ok(addrs)
        })
    }
}

/// How long a connection idles in the pool before it is closed. Long
/// enough to carry a host's connection across its polite delay; short
/// enough that a host let go does not hold a socket for long, as a wide
/// crawl lets go of thousands.
const POOL_IDLE: Duration = Duration::from_secs(10);

/// What a body of unknown length reserves of the in-flight budget before
/// its first byte; it grows in steps of this as the body does.
const BUDGET_STEP: usize = 1 << 20;

/// The in-flight budget counts KiB, so that a `u32` of permits covers it.
fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// Fetches pages.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    dns: crate::dns::Dns,
    config: Arc<FetchConfig>,
    /// Body bytes in flight across all fetches, in KiB.
    budget: Arc<tokio::sync::Semaphore>,
    budget_kib: u32,
}

impl Fetcher {
    /// A fetcher.
    pub fn new(config: FetchConfig) -> Result<Self, FetchError> {
        let dns = crate::dns::Dns::system();
        let mut builder = reqwest::Client::builder()
            .user_agent(config.user_agent.clone())
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.timeout)
            .timeout(config.timeout)
            .gzip(true)
            .brotli(true)
            .deflate(true)
            .pool_max_idle_per_host(4)
            .pool_idle_timeout(POOL_IDLE);
        match &config.proxy {
            // The proxy resolves targets; the guard checks them itself
            // first (`get`), and the resolver must still reach the proxy.
            Some(proxy) => {
                let proxy = reqwest::Proxy::all(proxy.as_str())
                    .map_err(|error| FetchError::Other(format!("--proxy {proxy}: {error}")))?;
                builder = builder.proxy(proxy);
            }
            None => {
                builder = builder.no_proxy().dns_resolver(Arc::new(Resolver {
                    names: names::Names::new(Arc::clone(&config.pinned), dns.clone()),
                    public_only: !config.allow_private,
                }));
            }
        }
        let client = builder
            .build()
            .map_err(|error| FetchError::Other(error_chain(&error)))?;
        let budget_kib = kib(config.max_inflight_bytes).max(1);
        Ok(Self {
            client,
            dns,
            budget: Arc::new(tokio::sync::Semaphore::new(budget_kib as usize)),
            budget_kib,
            config: Arc::new(config),
        })
    }

    /// Bytes of the in-flight budget free now.
    #[must_use]
    pub fn budget_free_bytes(&self) -> usize {
        self.budget.available_permits() * 1024
    }

    /// GETs a URL; a non-2xx status is a response, not an error.
    pub async fn get(&self, url: &Url) -> Result<Fetched, FetchError> {
        self.get_unless_unchanged(url, &Validators::default()).await
    }

    /// GETs a URL conditionally: with the validators of its last fetch,
    /// the server may answer 304 Not Modified instead of the page. A
    /// validator that is not a valid header value is left out.
    pub async fn get_unless_unchanged(
        &self,
        url: &Url,
        validators: &Validators,
    ) -> Result<Fetched, FetchError> {
        // Literal addresses never reach the resolver.
        if !self.config.allow_private
            && let Some(host) = url.host()
        {
            let literal = match host {
                url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
                url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
                url::Host::Domain(_) => None,
            };
            if literal.is_some_and(|ip| !is_public(ip)) {
                return Err(FetchError::PrivateAddress(url.to_string()));
            }
            // Through a proxy no resolver of ours sees the target: every
            // address its name has must be public.
            if let (Some(_), url::Host::Domain(name)) = (&self.config.proxy, host) {
                let addresses = (self.dns.lookup(name).await)
                    .map_err(|error| FetchError::Connect(format!("{name}: {error}")))?;
                if addresses.iter().any(|address| !is_public(*address)) {
                    return Err(FetchError::PrivateAddress(format!(
                        "{url} ({name} resolves to a private, loopback or link-local address)"
                    )));
                }
            }
        }
        let started = Instant::now();
        let mut request = self.client.get(url.clone());
        for (name, value) in [
            (reqwest::header::IF_NONE_MATCH, &validators.etag),
            (
                reqwest::header::IF_MODIFIED_SINCE,
                &validators.last_modified,
            ),
        ] {
            if let Some(value) = value
                .as_deref()
                .and_then(|v| reqwest::header::HeaderValue::from_str(v).ok())
            {
                request = request.header(name, value);
            }
        }
        let response = request.send().await.map_err(|e| FetchError::of(&e))?;
        let status = response.status().as_u16();
        let version = format!("{:?}", response.version());
        let peer = response.remote_addr();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect();
        // Bodies are bounded in all, not only one by one: a body first
        // reserves its declared length (or a step when it is unknown or
        // compressed), waiting for room while it holds nothing, and grows
        // only into room that is free at once. A body that finds none is
        // cut there, marked truncated: never waiting while holding, no
        // two fetches can wait on each other.
        let cap = self.config.max_body_bytes;
        let declared = response.content_length().map_or(BUDGET_STEP, |length| {
            usize::try_from(length).unwrap_or(usize::MAX)
        });
        let first = kib(declared.min(cap).max(1)).min(self.budget_kib);
        let mut permit = Arc::clone(&self.budget)
            .acquire_many_owned(first)
            .await
            .map_err(|_| FetchError::Other("the fetcher is shutting down".into()))?;
        let mut reserved = first as usize * 1024;
        // Allocated as the budget is reserved, exactly: a buffer that
        // doubled as it grew would hold up to twice what the budget counts.
        let mut body: Vec<u8> = Vec::new();
        body.reserve_exact(reserved.min(cap));
        let mut truncated = false;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| FetchError::of(&e))?;
            let mut take = chunk.len().min(cap - body.len());
            if body.len() + take > reserved {
                let more = kib(body.len() + take - reserved).max(kib(BUDGET_STEP));
                match Arc::clone(&self.budget).try_acquire_many_owned(more) {
                    Ok(extra) => {
                        permit.merge(extra);
                        reserved += more as usize * 1024;
                        body.reserve_exact(reserved.min(cap) - body.len());
                    }
                    Err(_) => {
                        metrics::counter!("worker_bodies_cut_for_memory_total").increment(1);
                        take = reserved.saturating_sub(body.len()).min(take);
                    }
                }
            }
            body.extend_from_slice(&chunk[..take]);
            if take < chunk.len() {
                truncated = true;
                break;
            }
        }
        Ok(Fetched {
            status,
            version,
            headers,
            body: Bytes::from(body),
            truncated,
            peer,
            duration: started.elapsed(),
            budget: Some(Arc::new(permit)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_guard_refuses_loopback_literals_and_names() {
        let fetcher = Fetcher::new(FetchConfig {
            user_agent: "t".into(),
            timeout: Duration::from_secs(5),
            max_body_bytes: 100,
            max_inflight_bytes: 1 << 20,
            allow_private: false,
            proxy: None,
            pinned: Arc::default(),
        })
        .unwrap();
        for url in [
            "http://127.0.0.1:9/",
            "http://[::1]:9/",
            "http://localhost:9/",
        ] {
            let error = fetcher.get(&Url::parse(url).unwrap()).await.unwrap_err();
            assert!(
                matches!(error, FetchError::PrivateAddress(_)),
                "{url}: {error}"
            );
            assert!(!error.is_transient());
        }
    }

    /// Serves one answer of `length` bytes to every connection.
    async fn server_of(length: usize) -> String {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0_u8; 4096];
                    let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut request).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {length}\r\n\r\n"
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(&vec![b'x'; length]).await;
                });
            }
        });
        format!("http://{address}/")
    }

    /// Bodies held at once never pass the budget: a body larger than the
    /// room left is cut there, and its share comes back when it goes.
    #[tokio::test]
    async fn bodies_in_flight_stay_within_the_budget() {
        let budget = 1 << 20;
        let fetcher = Fetcher::new(FetchConfig {
            user_agent: "t".into(),
            timeout: Duration::from_secs(10),
            max_body_bytes: 4 << 20,
            max_inflight_bytes: budget,
            allow_private: true,
            proxy: None,
            pinned: Arc::default(),
        })
        .unwrap();
        let url = Url::parse(&server_of(2 << 20).await).unwrap();
        let big = fetcher.get(&url).await.unwrap();
        assert!(big.truncated);
        assert_eq!(big.body.len(), budget);
        assert_eq!(fetcher.budget_free_bytes(), 0);
        let copy = big.clone();
        drop(big);
        assert_eq!(fetcher.budget_free_bytes(), 0, "a copy still holds it");
        drop(copy);
        assert_eq!(fetcher.budget_free_bytes(), budget);
        // Small bodies share the budget.
        let small = Url::parse(&server_of(100 << 10).await).unwrap();
        let first = fetcher.get(&small).await.unwrap();
        let second = fetcher.get(&small).await.unwrap();
        assert!(!first.truncated && !second.truncated);
        assert_eq!(fetcher.budget_free_bytes(), budget - 2 * (100 << 10));
    }
}
