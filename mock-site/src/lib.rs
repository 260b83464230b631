//! A deterministic web site to crawl, with the traps and quirks crawlers
//! meet, that records every request and knows which pages a correct
//! crawler fetches.
//!
//! # The site
//!
//! - `/` links to the regular pages and to every special page below, in
//!   every link syntax (absolute, root-relative, relative, `./`, `../`,
//!   dot segments, fragments, percent-encoded unreserved characters,
//!   entities, an upper-case scheme).
//! - `/page/{i}.html`, `i < pages`: each links to three others in varying
//!   syntaxes, so every page is reachable from `/` by several routes.
//! - `robots.txt`: disallows `/private/`, names `/sitemap.xml`, and an
//!   optional Crawl-delay. `/sitemap.xml` lists pages linked from nowhere.
//! - Redirects: a chain (`/redirect/a` → `/redirect/b` →
//!   `/redirect-target.html`), a loop, and one off-site.
//! - `/missing.html` (404), `/flaky.html` (500 once, then 200),
//!   `/slow.html` (answers after a pause), `/huge.html` (2 MiB: a link at
//!   the start, one past any sane body cap), `/gzip.html` (gzip-encoded),
//!   `/files/doc.pdf` (not HTML: its "links" are not links).
//! - `/nofollow.html` and `/meta-nofollow.html` (links a polite crawler
//!   does not follow), `/base/page.html` (`<base href>`), `/hidden.html`
//!   (links only inside a comment and a script).
//! - `/chain/{n}`: a redirect to `/chain/{n + 1}`, without end, each
//!   target a new URL; linked from nowhere (a hostile site's trap, for the
//!   redirect limit).
//! - `/calendar/{year}/{month}`: an infinite chain of "next month" links,
//!   reachable only from `/`, so the page at month k is at depth k + 1:
//!   the depth limit bounds it exactly.
//!
//! [`expected_fetches`] is the ground truth: path → times a correct
//! crawler (seeded with `/`, a depth limit, robots and nofollow obeyed,
//! one retry allowed) fetches it. robots.txt and sitemap.xml are left out:
//! each worker reads them.
//!
//! [`wide`] is many small hosts on loopback addresses and one port, for
//! polite crawls across thousands of hosts.
//!
//! [`changing`] is another site, for continuous crawls: pages that change
//! on schedules, with validators and 304s, and the ground truth of their
//! versions over time.

pub mod changing;
pub mod wide;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;

/// How the site is generated.
#[derive(Debug, Clone, Copy)]
pub struct SiteConfig {
    /// Regular pages.
    pub pages: usize,
    /// robots.txt Crawl-delay (written in seconds, with a fraction when
    /// it has one).
    pub crawl_delay: Option<Duration>,
    /// How long `/slow.html` takes.
    pub slow: Duration,
    /// Added to every answer (a server's think time, for benchmarks).
    pub latency: Duration,
}

impl Default for SiteConfig {
    fn default() -> Self {
        Self {
            pages: 30,
            crawl_delay: None,
            slow: Duration::from_millis(800),
            latency: Duration::ZERO,
        }
    }
}

/// One request the site answered.
#[derive(Debug, Clone)]
pub struct Hit {
    /// Path and query as requested.
    pub target: String,
    /// When it arrived.
    pub started: Instant,
    /// Requests being answered when it arrived, itself included.
    pub in_flight: u64,
    /// The status answered.
    pub status: u16,
}

#[derive(Debug)]
struct State {
    hits: Mutex<Vec<Hit>>,
    in_flight: AtomicU64,
    flaky_calls: AtomicU64,
    // Requests answered so far, for tests that act after the n-th.
    answered: tokio::sync::watch::Sender<usize>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            hits: Mutex::default(),
            in_flight: AtomicU64::default(),
            flaky_calls: AtomicU64::default(),
            answered: tokio::sync::watch::channel(0).0,
        }
    }
}

/// A running site.
#[derive(Debug, Clone)]
pub struct MockSite {
    /// Where it listens.
    pub addr: SocketAddr,
    // What its absolute links start with.
    base: String,
    config: SiteConfig,
    state: Arc<State>,
    log_hits: bool,
}

/// The months of the calendar trap a crawl with `max_depth` fetches, in
/// order: `/calendar/2024/01` is at depth 1.
#[must_use]
pub fn calendar_months(max_depth: u32) -> Vec<String> {
    (0..max_depth).map(calendar_path).collect()
}

fn calendar_path(k: u32) -> String {
    format!("/calendar/{}/{:02}", 2024 + k / 12, k % 12 + 1)
}

/// Paths a correct crawl of a site fetches with a depth limit of at least
/// 2, and how often. Regular pages are assumed within the limit: true when
/// there are at most 10 (`/` links them all) or the limit exceeds their
/// count (no chain of first discoveries is longer).
#[must_use]
pub fn expected_fetches(config: &SiteConfig, max_depth: u32) -> BTreeMap<String, u32> {
    assert!(
        max_depth >= 2,
        "the ground truth assumes a depth limit of at least 2"
    );
    let mut expected: BTreeMap<String, u32> = BTreeMap::new();
    let mut once = |path: &str| {
        expected.insert(path.to_owned(), 1);
    };
    once("/");
    // `/` links pages 0 to 9 whether they exist or not (a 404 is a fetch),
    // page 7 only with a query; page 7 itself is linked from page 6.
    for i in 0..config.pages.max(10) {
        if i != 7 || config.pages > 7 {
            once(&format!("/page/{i}.html"));
        }
    }
    // `/` → /redirect/a → /redirect/b → the target: depth 3.
    if max_depth >= 3 {
        once("/redirect-target.html");
    }
    for path in [
        "/page/7.html?x=1&y=2",
        "/redirect/a",
        "/redirect/b",
        "/redirect/loop1",
        "/redirect/loop2",
        "/redirect/offsite",
        "/missing.html",
        "/slow.html",
        "/huge.html",
        "/huge-early.html",
        "/gzip.html",
        "/from-gzip.html",
        "/files/doc.pdf",
        "/nofollow.html",
        "/meta-nofollow.html",
        "/base/page.html",
        "/based/target.html",
        "/hidden.html",
        "/sitemap-only/1.html",
        "/sitemap-only/2.html",
    ] {
        once(path);
    }
    for month in calendar_months(max_depth) {
        once(&month);
    }
    // A 500 first, then the retry.
    expected.insert("/flaky.html".into(), 2);
    expected
}

/// Paths a correct crawler never requests.
pub const NEVER_FETCHED: &[&str] = &[
    "/private/secret.html",
    "/huge-late.html",
    "/from-pdf.html",
    "/nofollow-target.html",
    "/meta-nofollow-target.html",
    "/commented.html",
    "/scripted.html",
];

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><title>{title}</title></head><body><h1>{title}</h1>\n{body}\n</body></html>\n"
    )
}

/// Answers every connection `listener` accepts with `answer`, HTTP/1.1 or
/// HTTP/2, until the runtime ends.
fn spawn_server<F, Fut>(listener: TcpListener, answer: F)
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let answered = answer(request);
                    async move { Ok::<_, Infallible>(answered.await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
}

impl MockSite {
    /// Serves the site on a listener the caller bound.
    pub fn serve(listener: TcpListener, config: SiteConfig) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        Self::serve_as(listener, config, &format!("http://{addr}"), false)
    }

    /// Serves the site under a public base URL (in a container, the
    /// address it is reached by is not the one it binds), printing a line
    /// per request when `log_hits`: `HIT <status> <path and query>`.
    pub fn serve_as(
        listener: TcpListener,
        config: SiteConfig,
        base: &str,
        log_hits: bool,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let site = Self {
            addr,
            base: base.trim_end_matches('/').to_owned(),
            config,
            state: Arc::default(),
            log_hits,
        };
        let server = site.clone();
        spawn_server(listener, move |request| {
            let site = server.clone();
            async move { site.answer(request).await }
        });
        Ok(site)
    }

    /// Binds `127.0.0.1:0` and serves.
    pub async fn start(config: SiteConfig) -> std::io::Result<Self> {
        Self::serve(TcpListener::bind("127.0.0.1:0").await?, config)
    }

    /// Starts `hosts` sites, each on a loopback address of its own
    /// (127.0.0.2, 127.0.0.3, … 127.0.1.0, …), so that a crawler sees
    /// as many hosts, each with its own robots.txt, pages and politeness.
    pub async fn start_hosts(hosts: usize, config: SiteConfig) -> std::io::Result<Vec<Self>> {
        let mut sites = Vec::with_capacity(hosts);
        for i in 0..hosts {
            sites.push(Self::start_on_loopback(i, config).await?);
        }
        Ok(sites)
    }

    /// Starts the `index`-th of [`Self::start_hosts`]'s sites, on
    /// 127.0.0.(index + 2) counted on through the loopback block.
    pub async fn start_on_loopback(index: usize, config: SiteConfig) -> std::io::Result<Self> {
        // Linux routes all of 127.0.0.0/8 to the loopback interface.
        let n = u32::try_from(index + 2)
            .ok()
            .filter(|n| *n < 1 << 16)
            .ok_or_else(|| std::io::Error::other("too many loopback hosts"))?;
        let address = std::net::Ipv4Addr::from(0x7f00_0000 | n);
        Self::serve(TcpListener::bind((address, 0)).await?, config)
    }

    /// What its links start with: `http://127.0.0.1:PORT` unless served
    /// under another base.
    #[must_use]
    pub fn base(&self) -> String {
        self.base.clone()
    }

    /// Every request so far.
    #[must_use]
    pub fn hits(&self) -> Vec<Hit> {
        self.state
            .hits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until the site has answered at least `n` requests.
    pub async fn answered_at_least(&self, n: usize) {
        let mut answered = self.state.answered.subscribe();
        let _ = answered.wait_for(|&count| count >= n).await;
    }

    /// How often each path was requested.
    #[must_use]
    pub fn fetch_counts(&self) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for hit in self.hits() {
            *counts.entry(hit.target).or_default() += 1;
        }
        counts
    }

    /// How often each page was requested: [`Self::fetch_counts`] without
    /// robots.txt and the sitemap, which the ground truth leaves out.
    #[must_use]
    pub fn page_fetches(&self) -> BTreeMap<String, u32> {
        let mut counts = self.fetch_counts();
        counts.remove("/robots.txt");
        counts.remove("/sitemap.xml");
        counts
    }

    async fn answer(&self, request: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let target = request
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |pq| pq.as_str().to_owned());
        let in_flight = self.state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let started = Instant::now();
        if !self.config.latency.is_zero() {
            tokio::time::sleep(self.config.latency).await;
        }
        let response = self.route(&target).await;
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.log_hits {
            println!("HIT {} {target}", response.status().as_u16());
        }
        let answered = {
            let mut hits = self
                .state
                .hits
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            hits.push(Hit {
                target,
                started,
                in_flight,
                status: response.status().as_u16(),
            });
            hits.len()
        };
        self.state.answered.send_replace(answered);
        response
    }

    fn html(&self, status: StatusCode, body: String) -> Response<Full<Bytes>> {
        Response::builder()
            .status(status)
            .header("content-type", "text/html; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()
    }

    fn redirect(&self, status: StatusCode, location: &str) -> Response<Full<Bytes>> {
        Response::builder()
            .status(status)
            .header("location", location)
            .body(Full::new(Bytes::new()))
            .unwrap_or_default()
    }

    fn leaf(&self, title: &str) -> Response<Full<Bytes>> {
        self.html(StatusCode::OK, page(title, r#"<a href="/">home</a>"#))
    }

    async fn route(&self, target: &str) -> Response<Full<Bytes>> {
        let base = self.base();
        let path = target.split('?').next().unwrap_or(target);
        match path {
            "/" => self.html(StatusCode::OK, self.index()),
            "/robots.txt" => {
                let mut text = String::from("User-agent: *\nDisallow: /private/\n");
                if let Some(delay) = self.config.crawl_delay {
                    text.push_str(&format!("Crawl-delay: {}\n", delay.as_secs_f64()));
                }
                text.push_str(&format!("Sitemap: {base}/sitemap.xml\n"));
                Response::builder()
                    .header("content-type", "text/plain")
                    .body(Full::new(Bytes::from(text)))
                    .unwrap_or_default()
            }
            "/sitemap.xml" => Response::builder()
                .header("content-type", "application/xml")
                .body(Full::new(Bytes::from(format!(
                    r#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>{base}/sitemap-only/1.html</loc></url>
<url><loc>{base}/sitemap-only/2.html</loc></url>
<url><loc>{base}/page/0.html</loc></url>
</urlset>"#
                ))))
                .unwrap_or_default(),
            "/redirect/a" => self.redirect(StatusCode::MOVED_PERMANENTLY, "/redirect/b"),
            "/redirect/b" => self.redirect(StatusCode::FOUND, &format!("{base}/redirect-target.html")),
            "/redirect/loop1" => self.redirect(StatusCode::FOUND, "/redirect/loop2"),
            "/redirect/loop2" => self.redirect(StatusCode::FOUND, "/redirect/loop1"),
            "/redirect/offsite" => {
                self.redirect(StatusCode::FOUND, "http://offsite.invalid/landing")
            }
            "/missing.html" => self.html(StatusCode::NOT_FOUND, page("Not found", "")),
            "/flaky.html" => {
                if self.state.flaky_calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    self.html(StatusCode::INTERNAL_SERVER_ERROR, page("Oops", ""))
                } else {
                    self.leaf("Flaky, working now")
                }
            }
            "/slow.html" => {
                tokio::time::sleep(self.config.slow).await;
                self.leaf("Slow")
            }
            "/huge.html" => {
                let filler = "<p>lorem ipsum dolor sit amet</p>\n".repeat(2 * 1024 * 1024 / 34);
                self.html(
                    StatusCode::OK,
                    page(
                        "Huge",
                        &format!(
                            r#"<a href="/huge-early.html">early</a>{filler}<a href="/huge-late.html">late</a>"#
                        ),
                    ),
                )
            }
            "/gzip.html" => {
                use std::io::Write;
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                let body = page("Gzip", r#"<a href="/from-gzip.html">inside gzip</a>"#);
                let _ = encoder.write_all(body.as_bytes());
                let compressed = encoder.finish().unwrap_or_default();
                Response::builder()
                    .header("content-type", "text/html")
                    .header("content-encoding", "gzip")
                    .body(Full::new(Bytes::from(compressed)))
                    .unwrap_or_default()
            }
            "/files/doc.pdf" => Response::builder()
                .header("content-type", "application/pdf")
                .body(Full::new(Bytes::from_static(
                    b"%PDF-1.4 <a href=\"/from-pdf.html\">not a link</a> %%EOF",
                )))
                .unwrap_or_default(),
            "/nofollow.html" => self.html(
                StatusCode::OK,
                page(
                    "Nofollow",
                    r#"<a rel="nofollow" href="/nofollow-target.html">no</a> <a href="/">home</a>"#,
                ),
            ),
            "/meta-nofollow.html" => self.html(
                StatusCode::OK,
                format!(
                    "<html><head><meta name=\"robots\" content=\"nofollow\"></head><body>{}</body></html>",
                    r#"<a href="/meta-nofollow-target.html">no</a>"#
                ),
            ),
            "/base/page.html" => self.html(
                StatusCode::OK,
                format!(
                    "<html><head><base href=\"/based/\"></head><body>{}</body></html>",
                    r#"<a href="target.html">relative to base</a>"#
                ),
            ),
            "/hidden.html" => self.html(
                StatusCode::OK,
                page(
                    "Hidden",
                    r#"<!-- <a href="/commented.html">old</a> -->
<script>var s = '<a href="/scripted.html">x</a>'; document.write(s);</script>"#,
                ),
            ),
            "/redirect-target.html" | "/huge-early.html" | "/from-gzip.html"
            | "/based/target.html" | "/sitemap-only/1.html" | "/sitemap-only/2.html" => {
                self.leaf(path)
            }
            _ => self.dynamic(path),
        }
    }

    fn dynamic(&self, path: &str) -> Response<Full<Bytes>> {
        if let Some(rest) = path.strip_prefix("/chain/")
            && let Ok(n) = rest.parse::<u64>()
        {
            return self.redirect(StatusCode::FOUND, &format!("/chain/{}", n + 1));
        }
        if let Some(rest) = path.strip_prefix("/page/")
            && let Some(number) = rest.strip_suffix(".html")
            && let Ok(i) = number.parse::<usize>()
            && i < self.config.pages
        {
            return self.html(StatusCode::OK, self.regular(i));
        }
        if let Some(rest) = path.strip_prefix("/calendar/") {
            let mut parts = rest.split('/');
            if let (Some(Ok(year)), Some(Ok(month)), None) = (
                parts.next().map(str::parse::<u32>),
                parts.next().map(str::parse::<u32>),
                parts.next(),
            ) && (2024..3000).contains(&year)
                && (1..=12).contains(&month)
            {
                let k = (year - 2024) * 12 + month - 1;
                let next = calendar_path(k + 1);
                return self.html(
                    StatusCode::OK,
                    page(
                        &format!("{year}-{month:02}"),
                        &format!(r#"<a href="{next}">next month</a>"#),
                    ),
                );
            }
        }
        self.html(StatusCode::NOT_FOUND, page("Not found", ""))
    }

    fn index(&self) -> String {
        let base = self.base();
        let upper = base.replacen("http://", "HTTP://", 1);
        let links = format!(
            r#"<a href="/page/0.html">root-relative</a>
<a href="page/1.html">relative</a>
<a href="{base}/page/2.html">absolute</a>
<a href="./page/3.html">dot</a>
<a href="/page/../page/4.html">dot segments</a>
<a href="/page/5.html#section">fragment</a>
<a href="/page/%36.html">percent-encoded digit</a>
<a href="/page/7.html?x=1&amp;y=2">entities</a>
<a href="{upper}/page/8.html">upper-case scheme</a>
<a href=" /page/9.html ">padded</a>
<a href="/redirect/a">chain</a> <a href="/redirect/loop1">loop</a> <a href="/redirect/offsite">off-site</a>
<a href="/missing.html">missing</a> <a href="/flaky.html">flaky</a> <a href="/slow.html">slow</a>
<a href="/huge.html">huge</a> <a href="/gzip.html">gzip</a> <a href="/files/doc.pdf">pdf</a>
<a href="/nofollow.html">nofollow</a> <a href="/meta-nofollow.html">meta nofollow</a>
<a href="/base/page.html">base</a> <a href="/hidden.html">hidden</a>
<a href="/private/secret.html">private</a>
<a href="/calendar/2024/01">calendar</a>
<a href="mailto:someone@example.com">mail</a> <a href="javascript:void(0)">js</a>"#
        );
        page("Mock site", &links)
    }

    fn regular(&self, i: usize) -> String {
        let n = self.config.pages;
        let (a, b, c) = ((i + 1) % n, (i * 3 + 2) % n, (i * 7 + 5) % n);
        page(
            &format!("Page {i}"),
            &format!(
                r#"<a href="{a}.html">next</a> <a href="../page/{b}.html#top">up and down</a> <a href="{}/page/{c}.html">absolute</a> <a href="/">home</a>"#,
                self.base()
            ),
        )
    }
}
