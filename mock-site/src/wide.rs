//! A wide web in one process: thousands of small hosts, named, on
//! loopback addresses and one port, for polite crawls across many hosts.
//!
//! - Host `i` is named `h{i}.d{i / hosts_per_domain}.test`, so hosts
//!   share a registrable domain in runs of `hosts_per_domain`, and it
//!   answers on loopback address `i / hosts_per_address` (127.0.0.2 on),
//!   so hosts share an address in runs of `hosts_per_address`. Every
//!   address listens on the same port; the Host header picks the host.
//!   [`WideSite::hosts_file`] pins the names to their addresses in
//!   hosts(5) form, for a crawler to resolve them without DNS.
//! - Each host has `pages` pages: `/` links to `/p/1.html` …
//!   `/p/{pages - 1}.html`, which link back to `/`; and a `robots.txt`
//!   that allows everything and names no sitemap.
//! - Every answer waits the host's latency first (spread evenly from
//!   `latency` to twice it over the hosts, as real servers differ).
//! - A host in `throttled` answers 429 with `Retry-After` to its first
//!   request for a page, for tests of back-off.
//!
//! Every request is recorded with its host and arrival time.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, header};
use tokio::net::TcpListener;

/// How the wide web is laid out.
#[derive(Debug, Clone)]
pub struct WideConfig {
    pub hosts: usize,
    /// Pages a host, `/` included (at least 1).
    pub pages: usize,
    /// Hosts that share one loopback address (at least 1).
    pub hosts_per_address: usize,
    /// Hosts that share one registrable domain (at least 1).
    pub hosts_per_domain: usize,
    /// The least think time of a host; the most is twice it.
    pub latency: Duration,
    /// Hosts (by index) that answer 429 once a page, with this
    /// Retry-After in whole seconds.
    pub throttled: Vec<usize>,
    pub retry_after_secs: u64,
}

impl Default for WideConfig {
    fn default() -> Self {
        Self {
            hosts: 100,
            pages: 10,
            hosts_per_address: 1,
            hosts_per_domain: 1,
            latency: Duration::ZERO,
            throttled: Vec::new(),
            retry_after_secs: 1,
        }
    }
}

/// One request a host answered.
#[derive(Debug, Clone)]
pub struct WideHit {
    /// The host's index.
    pub host: usize,
    pub path: String,
    /// When it arrived.
    pub at: Instant,
    pub status: u16,
}

/// The running hosts.
#[derive(Debug, Clone)]
pub struct WideSite {
    config: Arc<WideConfig>,
    port: u16,
    hits: Arc<Mutex<Vec<WideHit>>>,
    // Requests answered so far, for tests that act after the n-th.
    answered: tokio::sync::watch::Sender<usize>,
    throttled_once: Arc<Mutex<HashSet<(usize, String)>>>,
}

/// Loopback address number `n`, counted from 127.0.0.2.
fn loopback(n: usize) -> std::io::Result<Ipv4Addr> {
    u32::try_from(n + 2)
        .ok()
        .filter(|n| *n < 1 << 24)
        .map(|n| Ipv4Addr::from(0x7f00_0000 | n))
        .ok_or_else(|| std::io::Error::other("too many loopback addresses"))
}

impl WideSite {
    /// Binds every address the hosts need on one free port and serves.
    pub async fn start(config: WideConfig) -> std::io::Result<Self> {
        if config.hosts == 0
            || config.pages == 0
            || config.hosts_per_address == 0
            || config.hosts_per_domain == 0
        {
            return Err(std::io::Error::other(
                "hosts, pages, hosts a address and hosts a domain must each be at least 1",
            ));
        }
        let addresses = config.hosts.div_ceil(config.hosts_per_address);
        // The first address picks a free port; another process may hold it
        // on a later address, so a few ports are tried.
        let mut last_error = None;
        for _ in 0..16 {
            match Self::bind_all(addresses).await {
                Ok((port, listeners)) => {
                    let site = Self {
                        config: Arc::new(config),
                        port,
                        hits: Arc::default(),
                        answered: tokio::sync::watch::channel(0).0,
                        throttled_once: Arc::default(),
                    };
                    for listener in listeners {
                        let server = site.clone();
                        super::spawn_server(listener, move |request| {
                            let site = server.clone();
                            async move { site.answer(&request).await }
                        });
                    }
                    return Ok(site);
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| std::io::Error::other("no port")))
    }

    async fn bind_all(addresses: usize) -> std::io::Result<(u16, Vec<TcpListener>)> {
        let first = TcpListener::bind((loopback(0)?, 0)).await?;
        let port = first.local_addr()?.port();
        let mut listeners = vec![first];
        for n in 1..addresses {
            listeners.push(TcpListener::bind((loopback(n)?, port)).await?);
        }
        Ok((port, listeners))
    }

    /// Host `i`'s name.
    #[must_use]
    pub fn name(&self, i: usize) -> String {
        format!("h{i}.d{}.test", i / self.config.hosts_per_domain)
    }

    /// Host `i`'s address.
    #[must_use]
    pub fn address(&self, i: usize) -> IpAddr {
        IpAddr::V4(loopback(i / self.config.hosts_per_address).expect("checked at start"))
    }

    /// Where host `i` answers.
    #[must_use]
    pub fn socket(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.address(i), self.port)
    }

    /// `http://NAME:PORT` of host `i`.
    #[must_use]
    pub fn base(&self, i: usize) -> String {
        format!("http://{}:{}", self.name(i), self.port)
    }

    /// Every host's home page, one a line: a seed file for the whole web.
    #[must_use]
    pub fn seeds(&self) -> String {
        (0..self.config.hosts)
            .map(|i| format!("{}/\n", self.base(i)))
            .collect()
    }

    /// Every host's name pinned to its address, in hosts(5) form.
    #[must_use]
    pub fn hosts_file(&self) -> String {
        (0..self.config.hosts)
            .map(|i| format!("{} {}\n", self.address(i), self.name(i)))
            .collect()
    }

    /// Host `i`'s think time.
    #[must_use]
    pub fn latency(&self, i: usize) -> Duration {
        let spread = i as f64 / self.config.hosts.max(2).saturating_sub(1) as f64;
        self.config.latency.mul_f64(1.0 + spread)
    }

    /// Every request so far, in the order they were answered.
    #[must_use]
    pub fn hits(&self) -> Vec<WideHit> {
        self.hits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Requests per host, in arrival order.
    #[must_use]
    pub fn hits_by_host(&self) -> BTreeMap<usize, Vec<WideHit>> {
        self.hits_by(|host| host)
    }

    /// Requests grouped by `group_of(host)` (a domain, an address), each
    /// group's in arrival order.
    #[must_use]
    pub fn hits_by(&self, group_of: impl Fn(usize) -> usize) -> BTreeMap<usize, Vec<WideHit>> {
        let mut groups: BTreeMap<usize, Vec<WideHit>> = BTreeMap::new();
        for hit in self.hits() {
            groups.entry(group_of(hit.host)).or_default().push(hit);
        }
        for hits in groups.values_mut() {
            hits.sort_by_key(|hit| hit.at);
        }
        groups
    }

    /// The host a Host header names, by index.
    fn host_of(&self, request: &Request<hyper::body::Incoming>) -> Option<usize> {
        let named = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| request.uri().host())?;
        let name = named.split(':').next()?;
        let index: usize = name.strip_prefix('h')?.split('.').next()?.parse().ok()?;
        (index < self.config.hosts && self.name(index) == name).then_some(index)
    }

    async fn answer(&self, request: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let at = Instant::now();
        let path = request.uri().path().to_owned();
        let Some(host) = self.host_of(request) else {
            return respond(StatusCode::NOT_FOUND, "text/plain", "no such host".into());
        };
        let latency = self.latency(host);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let throttle = self.config.throttled.contains(&host)
            && path != "/robots.txt"
            && self
                .throttled_once
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((host, path.clone()));
        let response = if throttle {
            let mut response = respond(
                StatusCode::TOO_MANY_REQUESTS,
                "text/plain",
                "slow down".into(),
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(self.config.retry_after_secs),
            );
            response
        } else {
            self.page(&path)
        };
        self.hits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(WideHit {
                host,
                path,
                at,
                status: response.status().as_u16(),
            });
        self.answered.send_modify(|count| *count += 1);
        response
    }

    /// Waits until the hosts have answered at least `n` requests.
    pub async fn answered_at_least(&self, n: usize) {
        let mut answered = self.answered.subscribe();
        let _ = answered.wait_for(|&count| count >= n).await;
    }

    fn page(&self, path: &str) -> Response<Full<Bytes>> {
        let pages = self.config.pages;
        if path == "/robots.txt" {
            return respond(
                StatusCode::OK,
                "text/plain",
                "User-agent: *\nAllow: /\n".into(),
            );
        }
        if path == "/" {
            let links: String = (1..pages)
                .map(|p| format!("<a href=\"/p/{p}.html\">page {p}</a>\n"))
                .collect();
            return respond(StatusCode::OK, "text/html", super::page("home", &links));
        }
        let known = path
            .strip_prefix("/p/")
            .and_then(|p| p.strip_suffix(".html"))
            .and_then(|p| p.parse::<usize>().ok())
            .is_some_and(|p| (1..pages).contains(&p));
        if known {
            respond(
                StatusCode::OK,
                "text/html",
                super::page(path, "<a href=\"/\">home</a>"),
            )
        } else {
            respond(StatusCode::NOT_FOUND, "text/plain", "not found".into())
        }
    }
}

fn respond(status: StatusCode, kind: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, kind)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(site: &WideSite, host: usize, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(site.socket(host))
            .await
            .unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n",
            site.name(host),
            site.port
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer[9..12].parse().unwrap();
        (status, answer)
    }

    #[tokio::test]
    async fn hosts_share_addresses_and_domains_in_runs_and_answer_by_name() {
        let site = WideSite::start(WideConfig {
            hosts: 6,
            pages: 3,
            hosts_per_address: 2,
            hosts_per_domain: 3,
            throttled: vec![5],
            ..WideConfig::default()
        })
        .await
        .unwrap();
        assert_eq!(site.address(0), site.address(1));
        assert_ne!(site.address(1), site.address(2));
        assert_eq!(site.name(2), "h2.d0.test");
        assert_eq!(site.name(3), "h3.d1.test");
        assert!(
            site.hosts_file()
                .contains(&format!("{} h4.d1.test\n", site.address(4)))
        );
        let (status, home) = get(&site, 1, "/").await;
        assert_eq!(status, 200);
        assert!(home.contains("/p/2.html") && !home.contains("/p/3.html"));
        assert_eq!(get(&site, 1, "/p/3.html").await.0, 404);
        // Host 3, of the next domain, on an address of its own.
        assert_eq!(get(&site, 3, "/robots.txt").await.0, 200);
        let (status, throttled) = get(&site, 5, "/").await;
        assert_eq!(status, 429);
        assert!(throttled.to_ascii_lowercase().contains("retry-after: 1"));
        assert_eq!(get(&site, 5, "/").await.0, 200, "once a page");
        let by_host = site.hits_by_host();
        assert_eq!(by_host[&1].len(), 2);
        assert_eq!(by_host[&5].len(), 2);
    }
}
