//! robots.txt per origin (RFC 9309), read once per origin and kept for a
//! TTL: 2xx is parsed (texting_robots), 4xx allows everything, 5xx or an
//! unreachable server disallows for a while (the URL is retried later,
//! not dropped). Concurrent fetches of one origin's URLs share one
//! lookup; where the answer comes from (the frontier's shelf, or the
//! origin itself) is the caller's loader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use texting_robots::Robot;
use tokio::sync::OnceCell;
use url::Url;

use crate::fetch::Fetcher;

/// Bytes of robots.txt parsed at most (RFC 9309 asks for at least 500 KiB).
pub const MAX_ROBOTS_BYTES: usize = 512 * 1024;

/// An origin's rules.
#[derive(Debug)]
pub enum Rules {
    /// No robots.txt (4xx): everything allowed.
    AllowAll,
    /// The server could not answer (5xx, unreachable): nothing allowed
    /// until the entry expires.
    Unavailable(String),
    /// The SSRF guard refuses the origin's address: nothing is fetched
    /// from it, and nothing is retried.
    Refused(String),
    /// A parsed robots.txt.
    Parsed(Box<Robot>),
}

/// What robots.txt says about one URL.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Fetch it.
    Allowed,
    /// Never fetch it.
    Disallowed,
    /// robots.txt could not be read: try again later.
    Unavailable(String),
    /// The origin's address is refused: never fetch it.
    Refused(String),
}

/// One origin's rules and what else its robots.txt said.
#[derive(Debug)]
pub struct OriginRobots {
    /// The rules.
    pub rules: Rules,
    /// Crawl-delay, seconds.
    pub crawl_delay: Option<f32>,
    /// Sitemap lines.
    pub sitemaps: Vec<String>,
    fetched_at: Instant,
}

impl OriginRobots {
    /// The verdict for a URL of this origin.
    #[must_use]
    pub fn verdict(&self, url: &Url) -> Verdict {
        match &self.rules {
            Rules::AllowAll => Verdict::Allowed,
            Rules::Unavailable(reason) => Verdict::Unavailable(reason.clone()),
            Rules::Refused(reason) => Verdict::Refused(reason.clone()),
            Rules::Parsed(robot) => {
                if robot.allowed(url.as_str()) {
                    Verdict::Allowed
                } else {
                    Verdict::Disallowed
                }
            }
        }
    }

    /// The same rules, read at another moment (an answer another worker
    /// read, whose age the frontier kept).
    #[must_use]
    pub fn read_at(mut self, at: Instant) -> Self {
        self.fetched_at = at;
        self
    }

    /// An origin whose address the SSRF guard refuses.
    #[must_use]
    pub fn refused(reason: String) -> Self {
        Self {
            rules: Rules::Refused(reason),
            crawl_delay: None,
            sitemaps: Vec::new(),
            fetched_at: Instant::now(),
        }
    }

    /// Rules from a robots.txt answer (`None`: no answer).
    #[must_use]
    pub fn from_answer(agent: &str, answer: Option<(u16, &[u8])>) -> Self {
        let (rules, crawl_delay, sitemaps) = match answer {
            Some((status, body)) if (200..300).contains(&status) => {
                let body = &body[..body.len().min(MAX_ROBOTS_BYTES)];
                match Robot::new(agent, body) {
                    Ok(robot) => {
                        let delay = robot.delay;
                        let sitemaps = robot.sitemaps.clone();
                        (Rules::Parsed(Box::new(robot)), delay, sitemaps)
                    }
                    // Unparseable: as if there were none (RFC 9309 2.4).
                    Err(_) => (Rules::AllowAll, None, Vec::new()),
                }
            }
            Some((status, _)) if (400..500).contains(&status) => {
                (Rules::AllowAll, None, Vec::new())
            }
            Some((status, _)) => (
                Rules::Unavailable(format!("robots.txt answered {status}")),
                None,
                Vec::new(),
            ),
            None => (
                Rules::Unavailable("robots.txt unreachable".into()),
                None,
                Vec::new(),
            ),
        };
        Self {
            rules,
            crawl_delay,
            sitemaps,
            fetched_at: Instant::now(),
        }
    }
}

/// What [`RobotsCache::get`] found.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// The origin's robots.
    pub robots: Arc<OriginRobots>,
    /// Whether this call fetched it (the first for the origin, or after
    /// expiry): the caller then acts on Crawl-delay and Sitemap lines.
    pub fresh: bool,
}

type Cell = Arc<OnceCell<Arc<OriginRobots>>>;

/// robots.txt of every origin seen.
#[derive(Debug)]
pub struct RobotsCache {
    agent: String,
    ttl: Duration,
    unavailable_ttl: Duration,
    entries: Mutex<HashMap<String, Cell>>,
}

impl RobotsCache {
    /// A cache for a user agent's product token.
    #[must_use]
    pub fn new(agent: &str, ttl: Duration, unavailable_ttl: Duration) -> Self {
        Self {
            agent: agent.to_owned(),
            ttl,
            unavailable_ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The user agent's product token the rules are read for.
    #[must_use]
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Whether rules read at `fetched_at` are still good to use.
    #[must_use]
    pub fn is_current(&self, rules: &Rules, fetched_at: Instant) -> bool {
        let ttl = match rules {
            Rules::Unavailable(_) | Rules::Refused(_) => self.unavailable_ttl,
            _ => self.ttl,
        };
        fetched_at.elapsed() < ttl
    }

    fn cell(&self, origin: &str) -> Cell {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let cell = entries.entry(origin.to_owned()).or_default();
        if let Some(robots) = cell.get()
            && !self.is_current(&robots.rules, robots.fetched_at)
        {
            *cell = Arc::default();
        }
        Arc::clone(cell)
    }

    /// The robots of a URL's origin, read from the origin when not cached.
    pub async fn get(&self, fetcher: &Fetcher, url: &Url) -> Lookup {
        self.get_or_load(url, |origin| async move {
            let answer = fetch_answer(fetcher, &origin).await;
            (self.rules_of(&answer), true)
        })
        .await
    }

    /// The robots of a URL's origin; when not cached, `load` is given the
    /// origin and answers the rules and whether it read them from the
    /// origin itself (then the lookup is fresh).
    pub async fn get_or_load<F, Fut>(&self, url: &Url, load: F) -> Lookup
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = (OriginRobots, bool)>,
    {
        let origin = url.origin().ascii_serialization();
        let cell = self.cell(&origin);
        let mut fresh = false;
        let robots = cell
            .get_or_init(|| {
                let loading = load(origin.clone());
                async {
                    let (robots, from_origin) = loading.await;
                    fresh = from_origin;
                    Arc::new(robots)
                }
            })
            .await;
        Lookup {
            robots: Arc::clone(robots),
            fresh,
        }
    }

    /// The rules of an answer read from an origin.
    #[must_use]
    pub fn rules_of(&self, answer: &RobotsAnswer) -> OriginRobots {
        match answer {
            Ok(answer) => OriginRobots::from_answer(
                &self.agent,
                answer
                    .as_ref()
                    .map(|(status, body)| (*status, body.as_ref())),
            ),
            Err(refused) => OriginRobots::refused(refused.clone()),
        }
    }
}

/// What reading an origin's robots.txt gave: the status and body, `None`
/// when there was no answer to be had, or why the SSRF guard refused an
/// address on the way.
pub type RobotsAnswer = Result<Option<(u16, bytes::Bytes)>, String>;

/// Reads an origin's robots.txt (`origin` as `scheme://host[:port]`).
pub async fn fetch_answer(fetcher: &Fetcher, origin: &str) -> RobotsAnswer {
    match Url::parse(&format!("{origin}/robots.txt")) {
        Ok(robots_url) => fetch_following(fetcher, robots_url).await,
        Err(_) => Ok(None),
    }
}

/// Fetches robots.txt following up to five redirects (RFC 9309 2.3.1.2):
/// the answer, `None` when there is none to be had, or why the SSRF guard
/// refused an address on the way.
async fn fetch_following(fetcher: &Fetcher, mut url: Url) -> RobotsAnswer {
    for _ in 0..=5 {
        let fetched = match fetcher.get(&url).await {
            Ok(fetched) => fetched,
            Err(error) if !error.is_transient() => return Err(error.to_string()),
            Err(_) => return Ok(None),
        };
        if (300..400).contains(&fetched.status) {
            let Some(next) = fetched
                .header("location")
                .and_then(|location| url.join(location).ok())
            else {
                return Ok(None);
            };
            url = next;
            continue;
        }
        return Ok(Some((fetched.status, fetched.body)));
    }
    // Too many redirects: as unavailable (RFC 9309 2.3.1.2 allows treating
    // it as a 4xx; refusing is the cautious choice).
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> Url {
        Url::parse(u).unwrap()
    }

    #[test]
    fn answers_map_to_rules_as_rfc_9309_says() {
        let parsed = OriginRobots::from_answer(
            "frontierbot",
            Some((
                200,
                b"User-agent: *\nDisallow: /private\nCrawl-delay: 2\nSitemap: http://s.example/map.xml\n",
            )),
        );
        assert_eq!(
            parsed.verdict(&url("http://s.example/private/x")),
            Verdict::Disallowed
        );
        assert_eq!(
            parsed.verdict(&url("http://s.example/public")),
            Verdict::Allowed
        );
        assert_eq!(parsed.crawl_delay, Some(2.0));
        assert_eq!(parsed.sitemaps, vec!["http://s.example/map.xml"]);

        let missing = OriginRobots::from_answer("frontierbot", Some((404, b"")));
        assert_eq!(
            missing.verdict(&url("http://s.example/private")),
            Verdict::Allowed
        );

        let failing = OriginRobots::from_answer("frontierbot", Some((503, b"")));
        assert!(matches!(
            failing.verdict(&url("http://s.example/")),
            Verdict::Unavailable(_)
        ));
        let unreachable = OriginRobots::from_answer("frontierbot", None);
        assert!(matches!(
            unreachable.verdict(&url("http://s.example/")),
            Verdict::Unavailable(_)
        ));
    }

    #[test]
    fn the_agents_own_group_wins() {
        let robots = OriginRobots::from_answer(
            "frontierbot",
            Some((
                200,
                b"User-agent: *\nDisallow: /\n\nUser-agent: frontierbot\nDisallow: /only-this\n",
            )),
        );
        assert_eq!(
            robots.verdict(&url("http://s.example/page")),
            Verdict::Allowed
        );
        assert_eq!(
            robots.verdict(&url("http://s.example/only-this")),
            Verdict::Disallowed
        );
    }
}
