//! A site whose pages change on schedules, for continuous crawls: some
//! every few seconds, some rarely, some never, each answering with an
//! ETag and a Last-Modified date and with 304 to a conditional request
//! that names its current version. It records every fetch with the
//! version it served, and knows each page's version at any moment, so a
//! test can say how fresh a crawler kept each page.
//!
//! - `/` links to every page; it never changes.
//! - `/fast/{i}.html`, `/slow/{i}.html`: a new version every
//!   `fast_period` or `slow_period`, the pages of a kind staggered evenly
//!   over the period so that they do not all change at once.
//! - `/fixed/{i}.html`: never changes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, header};
use tokio::net::TcpListener;

/// How many pages of each kind, and how often they change.
#[derive(Debug, Clone, Copy)]
pub struct ChangingConfig {
    pub fast: usize,
    /// Whole seconds, from 1 (Last-Modified counts seconds).
    pub fast_period: Duration,
    pub slow: usize,
    /// Whole seconds, from 1.
    pub slow_period: Duration,
    pub fixed: usize,
    /// Each page's body is padded to at least this many bytes (as real
    /// pages weigh tens of kilobytes), so that what a 304 saves shows.
    pub page_bytes: usize,
    /// Whether it answers 304 to a conditional request; many servers
    /// send the whole page whatever the request says.
    pub answers_304: bool,
}

impl Default for ChangingConfig {
    fn default() -> Self {
        Self {
            fast: 5,
            fast_period: Duration::from_secs(3),
            slow: 5,
            slow_period: Duration::from_secs(60),
            fixed: 10,
            page_bytes: 0,
            answers_304: true,
        }
    }
}

/// One request for a page, as answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub path: String,
    /// Since the site started.
    pub at: Duration,
    /// 200, or 304 when the request named the current version.
    pub status: u16,
    /// The page's version then.
    pub version: u64,
    /// It carried If-None-Match or If-Modified-Since.
    pub conditional: bool,
    /// Body bytes sent.
    pub bytes: usize,
}

/// The site (module docs).
#[derive(Debug, Clone)]
pub struct ChangingSite {
    pub addr: SocketAddr,
    config: ChangingConfig,
    started: Instant,
    started_wall: SystemTime,
    fetches: Arc<Mutex<Vec<Fetch>>>,
    /// How many fetches the log holds, for waiters.
    fetched: Arc<tokio::sync::watch::Sender<usize>>,
}

/// A page's schedule: how often it changes (`None`: never), and how far
/// into its period it starts.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    period: Option<Duration>,
    offset: Duration,
}

impl ChangingSite {
    /// Serves the site on a listener the caller bound.
    pub fn serve(listener: TcpListener, config: ChangingConfig) -> std::io::Result<Self> {
        for period in [config.fast_period, config.slow_period] {
            if period.as_secs() == 0 || period.subsec_nanos() != 0 {
                return Err(std::io::Error::other(format!(
                    "a period of {period:?}: pages change every whole second or more"
                )));
            }
        }
        let site = Self {
            addr: listener.local_addr()?,
            config,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            fetches: Arc::default(),
            fetched: Arc::new(tokio::sync::watch::channel(0).0),
        };
        let server = site.clone();
        super::spawn_server(listener, move |request| {
            let answer = server.answer(&request);
            async move { answer }
        });
        Ok(site)
    }

    /// Binds `127.0.0.1:0` and serves.
    pub async fn start(config: ChangingConfig) -> std::io::Result<Self> {
        Self::serve(TcpListener::bind("127.0.0.1:0").await?, config)
    }

    /// `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Returns once the site has answered `n` page fetches.
    pub async fn fetched_at_least(&self, n: usize) {
        let mut fetched = self.fetched.subscribe();
        let _ = fetched.wait_for(|&count| count >= n).await;
    }

    /// Time since the site started, the clock of its fetch log.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Every page's path, `/` included.
    #[must_use]
    pub fn pages(&self) -> Vec<String> {
        let kinds = [
            ("fast", self.config.fast),
            ("slow", self.config.slow),
            ("fixed", self.config.fixed),
        ];
        std::iter::once("/".to_owned())
            .chain(
                kinds
                    .into_iter()
                    .flat_map(|(kind, n)| (0..n).map(move |i| format!("/{kind}/{i}.html"))),
            )
            .collect()
    }

    /// Every fetch of a page so far.
    #[must_use]
    pub fn fetches(&self) -> Vec<Fetch> {
        self.fetches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn schedule(&self, path: &str) -> Option<Schedule> {
        if path == "/" {
            return Some(Schedule {
                period: None,
                offset: Duration::ZERO,
            });
        }
        let (kind, rest) = path.strip_prefix('/')?.split_once('/')?;
        let i: usize = rest.strip_suffix(".html")?.parse().ok()?;
        let (count, period) = match kind {
            "fast" => (self.config.fast, Some(self.config.fast_period)),
            "slow" => (self.config.slow, Some(self.config.slow_period)),
            "fixed" => (self.config.fixed, None),
            _ => return None,
        };
        (i < count).then(|| Schedule {
            period,
            offset: period.map_or(Duration::ZERO, |p| p.mul_f64(i as f64 / count as f64)),
        })
    }

    /// A page's version `at` (since the site started); `None` for a path
    /// that is not a page.
    #[must_use]
    pub fn version_at(&self, path: &str, at: Duration) -> Option<u64> {
        let schedule = self.schedule(path)?;
        Some(schedule.period.map_or(0, |period| {
            ((at + schedule.offset).as_nanos() / period.as_nanos()) as u64
        }))
    }

    /// When a page's `version` began, since the site started (0 for the
    /// first).
    fn version_began(schedule: Schedule, version: u64) -> Duration {
        schedule.period.map_or(Duration::ZERO, |period| {
            (period * u32::try_from(version).unwrap_or(u32::MAX)).saturating_sub(schedule.offset)
        })
    }

    /// The share of the time from a page's first fetch to `until` (since
    /// the site started) during which the last version fetched (a 304
    /// confirms the one held) was its current one; `None` before its first
    /// fetch.
    #[must_use]
    pub fn freshness(&self, path: &str, until: Duration) -> Option<f64> {
        let fetches: Vec<Fetch> = self
            .fetches()
            .into_iter()
            .filter(|f| f.path == path && f.at <= until)
            .collect();
        let first = fetches.first()?.at;
        let span = until.checked_sub(first)?;
        if span.is_zero() {
            return Some(1.0);
        }
        // Sampled finely enough for periods of a second and more.
        let step = Duration::from_millis(10);
        let (mut fresh, mut samples, mut next) = (0u64, 0u64, 0usize);
        let mut held = None;
        let mut t = first;
        while t < until {
            while next < fetches.len() && fetches[next].at <= t {
                held = Some(fetches[next].version);
                next += 1;
            }
            samples += 1;
            if held == self.version_at(path, t) {
                fresh += 1;
            }
            t += step;
        }
        Some(fresh as f64 / samples.max(1) as f64)
    }

    fn answer(&self, request: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_owned();
        let at = self.started.elapsed();
        let Some(schedule) = self.schedule(&path) else {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Full::new(Bytes::from_static(b"not found")))
                .expect("a response");
        };
        let version = self.version_at(&path, at).unwrap_or(0);
        let etag = format!("\"v{version}\"");
        let modified = self.started_wall + Self::version_began(schedule, version);
        let headers = request.headers();
        let if_none_match = headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok());
        let if_modified_since = headers
            .get(header::IF_MODIFIED_SINCE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok());
        // If-None-Match wins over If-Modified-Since (RFC 9110, 13.2.2).
        let not_modified = self.config.answers_304
            && match (if_none_match, if_modified_since) {
                (Some(tags), _) => tags.split(',').any(|tag| tag.trim() == etag),
                (None, Some(since)) => {
                    httpdate::fmt_http_date(modified) == httpdate::fmt_http_date(since)
                        || modified < since
                }
                (None, None) => false,
            };
        let status = if not_modified {
            StatusCode::NOT_MODIFIED
        } else {
            StatusCode::OK
        };
        let mut body = if not_modified {
            String::new()
        } else if path == "/" {
            let links: String = self
                .pages()
                .iter()
                .skip(1)
                .map(|page| format!("<a href=\"{page}\">{page}</a>\n"))
                .collect();
            super::page("A changing site", &links)
        } else {
            super::page(
                &format!("{path} version {version}"),
                &format!("<p>Version {version} of {path}.</p><a href=\"/\">home</a>"),
            )
        };
        if !not_modified && body.len() < self.config.page_bytes {
            let pad = self.config.page_bytes - body.len();
            body.push_str(&format!("<!--{}-->", "x".repeat(pad.saturating_sub(7))));
        }
        let count = {
            let mut fetches = self.fetches.lock().unwrap_or_else(PoisonError::into_inner);
            fetches.push(Fetch {
                path: path.clone(),
                at,
                status: status.as_u16(),
                version,
                conditional: if_none_match.is_some() || if_modified_since.is_some(),
                bytes: body.len(),
            });
            fetches.len()
        };
        self.fetched.send_replace(count);
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
            .header(header::ETAG, etag)
            .header(header::LAST_MODIFIED, httpdate::fmt_http_date(modified))
            .body(Full::new(Bytes::from(body)))
            .expect("a response")
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// One HTTP/1.1 request on a connection of its own: the status and
    /// the headers' text.
    async fn get(site: &ChangingSite, path: &str, extra: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(site.addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer[9..12].parse().unwrap();
        (status, answer)
    }

    fn header<'a>(answer: &'a str, name: &str) -> &'a str {
        answer
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(": ")?;
                key.eq_ignore_ascii_case(name).then_some(value)
            })
            .unwrap()
    }

    #[tokio::test]
    async fn pages_answer_304_to_their_current_version_and_the_log_says_what_was_served() {
        let config = ChangingConfig {
            fast: 2,
            fast_period: Duration::from_secs(1),
            slow: 1,
            slow_period: Duration::from_secs(3600),
            fixed: 1,
            page_bytes: 4096,
            answers_304: true,
        };
        let site = ChangingSite::start(config).await.unwrap();
        assert_eq!(site.pages().len(), 5);
        let (status, answer) = get(&site, "/fixed/0.html", "").await;
        assert_eq!(status, 200);
        let etag = header(&answer, "etag").to_owned();
        let modified = header(&answer, "last-modified").to_owned();
        let (status, _) = get(
            &site,
            "/fixed/0.html",
            &format!("If-None-Match: {etag}\r\n"),
        )
        .await;
        assert_eq!(status, 304);
        let (status, _) = get(
            &site,
            "/fixed/0.html",
            &format!("If-Modified-Since: {modified}\r\n"),
        )
        .await;
        assert_eq!(status, 304);
        let (status, _) = get(&site, "/fixed/0.html", "If-None-Match: \"v9\"\r\n").await;
        assert_eq!(status, 200);
        assert_eq!(get(&site, "/other.html", "").await.0, 404);
        // A fast page moves on within a period and its old tag is stale.
        let (_, answer) = get(&site, "/fast/1.html", "").await;
        let old = header(&answer, "etag").to_owned();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (status, _) =
                get(&site, "/fast/1.html", &format!("If-None-Match: {old}\r\n")).await;
            if status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "never changed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let fetches = site.fetches();
        assert!(fetches.iter().filter(|f| f.status == 304).count() >= 2);
        assert!(
            fetches
                .iter()
                .all(|f| f.path == "/other.html" || f.version < 100)
        );
        assert!(fetches[1].conditional && !fetches[0].conditional);
        // Bodies are padded to the configured weight; a 304 sends none.
        assert!(
            fetches[0].bytes >= 4096 && fetches[1].bytes == 0,
            "{fetches:?}"
        );
    }

    #[test]
    fn versions_follow_the_schedule_and_freshness_is_the_share_of_time_held_current() {
        let config = ChangingConfig {
            fast: 2,
            fast_period: Duration::from_secs(2),
            ..ChangingConfig::default()
        };
        let site = ChangingSite {
            addr: ([127, 0, 0, 1], 0).into(),
            config,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            fetches: Arc::default(),
            fetched: Arc::new(tokio::sync::watch::channel(0).0),
        };
        let at = Duration::from_secs;
        // Page 1 of 2 is a period's half ahead of page 0.
        assert_eq!(site.version_at("/fast/0.html", at(1)), Some(0));
        assert_eq!(site.version_at("/fast/1.html", at(1)), Some(1));
        assert_eq!(site.version_at("/fast/0.html", at(5)), Some(2));
        assert_eq!(site.version_at("/fixed/3.html", at(500)), Some(0));
        assert_eq!(site.version_at("/fixed/99.html", at(0)), None);
        // Fetched at 0 s (version 0), and not again: fresh until 2 s of 4.
        site.fetches.lock().unwrap().push(Fetch {
            path: "/fast/0.html".into(),
            at: at(0),
            status: 200,
            version: 0,
            conditional: false,
            bytes: 0,
        });
        let fresh = site.freshness("/fast/0.html", at(4)).unwrap();
        assert!((fresh - 0.5).abs() < 0.01, "{fresh}");
        assert_eq!(site.freshness("/fast/1.html", at(4)), None);
    }
}
