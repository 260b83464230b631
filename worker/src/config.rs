//! What a worker is told ([`WorkerConfig`]), with its defaults and the one
//! check of its values ([`WorkerConfig::validate`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::WorkerError;
use crate::fetch::FetchConfig;
use crate::links::LinkOptions;

/// Everything a worker is told.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The frontier's gRPC address.
    pub frontier: String,
    /// Calls go through this instead, to a frontier in this process
    /// (`frontier` then only names it).
    pub in_process: Option<proto::transport::Transport>,
    /// Sent as `authorization: Bearer TOKEN` on every call, for a frontier
    /// that requires its token on every call.
    pub token: Option<String>,
    /// TLS for `https://` frontier addresses: the CA to check the
    /// frontier's certificate against, and this worker's own certificate
    /// for a frontier that asks for one.
    pub tls: proto::tls::ClientTls,
    /// Lease from this crawl only; `None`: any crawl.
    pub crawl: Option<String>,
    /// Most fetches in flight.
    pub concurrency: usize,
    /// Most queues (hosts) held at once, each with its leased URLs;
    /// `None`: as many as the fetch slots keep busy.
    pub max_queues: Option<usize>,
    /// URLs of one queue asked for in one lease (the frontier may give
    /// fewer: no more than its lease has room for at the host's delay).
    pub lease_per_queue: u32,
    /// Most URLs of one queue (host) in flight.
    pub per_host: u32,
    /// Most pages of one host started and not yet reported, per
    /// `per_host` (at least 1: with 1 a fetch waits for the previous
    /// report).
    pub unacked_per_host: u32,
    /// Lease length asked for, seconds.
    pub lease_secs: u32,
    /// WARC files and crawl log go here, when set.
    pub output: Option<PathBuf>,
    /// Names this worker's output files.
    pub worker_id: String,
    /// HTTP settings.
    pub fetch: FetchConfig,
    /// Transient failures retried this many times before giving up.
    pub max_retries: u32,
    /// Most redirects followed in a row: the target of one more is not
    /// sent (a chain of ever new URLs would otherwise run on).
    pub max_redirects: u32,
    /// First retry after this long; doubling after.
    pub retry_base: Duration,
    /// Crawl-delay values above this are capped.
    pub max_crawl_delay_secs: u32,
    /// robots.txt kept this long.
    pub robots_ttl: Duration,
    /// An unavailable robots.txt is asked again after this long.
    pub robots_unavailable_ttl: Duration,
    /// Link extraction rules.
    pub links: LinkOptions,
    /// Longest URL sent (the frontier's limit; longer ones it refuses).
    pub max_url_length: usize,
    /// Links deeper than this are not sent, for a frontier with no depth
    /// limit of its own; `None`: the frontier decides.
    pub max_depth: Option<u32>,
    /// URLs the seen cache holds (0: none): links the frontier already
    /// acknowledged are not sent again.
    pub seen_cache: usize,
    /// WARC files rotate past this size.
    pub warc_max_bytes: u64,
    /// In-flight fetches get this long to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Read sitemaps (robots.txt Sitemap lines, else /sitemap.xml).
    pub sitemaps: bool,
    /// Sitemap index levels followed.
    pub max_sitemap_depth: u32,
}

impl WorkerConfig {
    /// Defaults for a frontier address.
    #[must_use]
    pub fn new(frontier: &str) -> Self {
        Self {
            frontier: frontier.to_owned(),
            in_process: None,
            token: None,
            tls: proto::tls::ClientTls::default(),
            crawl: None,
            concurrency: 256,
            max_queues: None,
            lease_per_queue: 1024,
            per_host: 1,
            unacked_per_host: 16,
            lease_secs: 60,
            output: None,
            worker_id: format!("worker-{}", std::process::id()),
            fetch: FetchConfig {
                user_agent: default_user_agent(),
                timeout: Duration::from_secs(30),
                max_body_bytes: 10 * 1024 * 1024,
                max_inflight_bytes: 256 * 1024 * 1024,
                allow_private: false,
                proxy: None,
                pinned: std::sync::Arc::default(),
            },
            max_retries: 3,
            max_redirects: 10,
            retry_base: Duration::from_secs(30),
            max_crawl_delay_secs: 30,
            robots_ttl: Duration::from_secs(24 * 3600),
            robots_unavailable_ttl: Duration::from_secs(600),
            links: LinkOptions::default(),
            max_url_length: 2048,
            max_depth: None,
            seen_cache: 65_536,
            warc_max_bytes: 1 << 30,
            shutdown_grace: Duration::from_secs(10),
            sitemaps: true,
            max_sitemap_depth: 2,
        }
    }

    /// Checks every value before anything runs; the error names each one
    /// out of range, with the flag that sets it.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let mut bad = Vec::new();
        let at_least_one = [
            ("--concurrency", self.concurrency as u64),
            ("--max-queues", self.max_queues.map_or(1, |cap| cap as u64)),
            ("--lease-per-queue", u64::from(self.lease_per_queue)),
            ("--per-host", u64::from(self.per_host)),
            ("--unacked-per-host", u64::from(self.unacked_per_host)),
        ];
        for (flag, value) in at_least_one {
            if value == 0 {
                bad.push(format!("{flag} is 0 and must be at least 1"));
            }
        }
        if self.fetch.timeout.is_zero() {
            bad.push("the fetch timeout is 0 and must be positive".to_owned());
        }
        if self.max_url_length == 0 {
            bad.push("the longest URL is 0 bytes and must be positive".to_owned());
        }
        if self.worker_id.is_empty() || self.worker_id.contains(['/', '\\']) {
            bad.push(format!(
                "the worker ID {:?} must be non-empty and without path separators \
                 (it names the output files)",
                self.worker_id
            ));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(WorkerError::Config(bad.join("; ")))
        }
    }
}

/// The default User-Agent.
#[must_use]
pub fn default_user_agent() -> String {
    format!(
        "frontierbot/{} (+https://example.invalid/crawl-frontier)",
        env!("CARGO_PKG_VERSION")
    )
}

/// The robots.txt product token of a User-Agent: its first word, before
/// any `/` version.
#[must_use]
pub fn product_token(user_agent: &str) -> &str {
    user_agent
        .split(|c: char| c == '/' || c.is_whitespace())
        .next()
        .unwrap_or(user_agent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_each_bad_value_is_named() {
        assert!(WorkerConfig::new("http://127.0.0.1:1").validate().is_ok());
        let mut config = WorkerConfig::new("http://127.0.0.1:1");
        config.concurrency = 0;
        config.per_host = 0;
        config.worker_id = "a/b".to_owned();
        let message = config.validate().unwrap_err().to_string();
        for named in ["--concurrency", "--per-host", "\"a/b\""] {
            assert!(message.contains(named), "{named} not named in: {message}");
        }
        assert!(!message.contains("--max-queues"), "{message}");
    }
}
