//! How a leased URL ended, as the worker reports it to the frontier (the
//! `outcome` metadata) and writes it to its crawl log.

use serde::Serialize;

/// Why a URL is done, or why it is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Fetched with a 2xx answer.
    Fetched,
    /// 304 Not Modified to a conditional request: fetched, unchanged.
    NotModified,
    /// A 3xx answer; its target went out as a discovered URL.
    Redirect,
    /// A redirect past the limit of redirects in a row.
    TooManyRedirects,
    /// A 4xx answer other than 408 and 429.
    ClientError,
    /// robots.txt disallows it.
    Robots,
    /// Not fetched: the SSRF guard refused its address, or the request
    /// cannot succeed (a permanent fetch error).
    Refused,
    /// The URL does not parse.
    InvalidUrl,
    /// Failed transiently as often as retries allow.
    GaveUp,
    /// No answer (timeout, connection error): tried again.
    FetchError,
    /// 429, or 503: tried again, after Retry-After when given.
    ServerBusy,
    /// 408 or another 5xx: tried again.
    ServerError,
    /// robots.txt could not be read: tried again.
    RobotsUnavailable,
}

impl Reason {
    /// The word the metadata and the crawl log carry.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetched => "fetched",
            Self::NotModified => "not_modified",
            Self::Redirect => "redirect",
            Self::TooManyRedirects => "too_many_redirects",
            Self::ClientError => "client_error",
            Self::Robots => "robots",
            Self::Refused => "refused",
            Self::InvalidUrl => "invalid_url",
            Self::GaveUp => "gave_up",
            Self::FetchError => "fetch_error",
            Self::ServerBusy => "server_busy",
            Self::ServerError => "server_error",
            Self::RobotsUnavailable => "robots_unavailable",
        }
    }
}

/// How one leased URL ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: reported with no next fetch date.
    Done(Reason),
    /// Tried again later; at this UTC epoch second when the server said.
    Retry(Reason, Option<u64>),
}

impl Outcome {
    /// Whether the host asked for a pause (429 or 503 with Retry-After):
    /// its other leased URLs then wait for the frontier's block.
    #[must_use]
    pub fn holds_off_the_host(&self) -> bool {
        matches!(self, Self::Retry(Reason::ServerBusy, Some(_)))
    }
}

/// One line of the crawl log: a leased URL and what became of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CrawlLogEntry {
    /// When the fetch started, UTC epoch seconds.
    pub time: u64,
    /// The URL as leased.
    pub url: String,
    /// Its link depth.
    pub depth: u32,
    /// The worker's ID.
    pub worker: String,
    /// How it ended (`None` only while it is being worked on).
    pub outcome: Option<Reason>,
    /// The HTTP status, when there was an answer.
    pub status: Option<u16>,
    /// Time spent on it, milliseconds.
    pub duration_ms: u64,
    /// When it is tried again (UTC epoch seconds), for a retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<u64>,
    /// Why it failed or was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The answer's media type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Body bytes read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Whether the body was cut at the size limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// The WARC payload digest of the recorded body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Whether the page was found as captured before (a 304 or the same
    /// payload digest: a revisit record, no outlinks sent); `false` for
    /// new content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revisit: Option<bool>,
    /// Links found on the page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlinks: Option<usize>,
    /// A redirect's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<String>,
    /// The page asked not to be indexed (robots meta).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub noindex: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_serialise_as_the_words_the_metadata_carries() {
        for reason in [
            Reason::Fetched,
            Reason::Redirect,
            Reason::TooManyRedirects,
            Reason::ClientError,
            Reason::Robots,
            Reason::Refused,
            Reason::InvalidUrl,
            Reason::GaveUp,
            Reason::FetchError,
            Reason::ServerBusy,
            Reason::ServerError,
            Reason::RobotsUnavailable,
        ] {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::Value::from(reason.as_str())
            );
        }
    }

    #[test]
    fn a_log_line_leaves_out_what_did_not_happen() {
        let entry = CrawlLogEntry {
            time: 7,
            url: "http://a/".into(),
            worker: "w1".into(),
            outcome: Some(Reason::Robots),
            ..CrawlLogEntry::default()
        };
        assert_eq!(
            serde_json::to_value(&entry).unwrap(),
            serde_json::json!({
                "time": 7, "url": "http://a/", "depth": 0, "worker": "w1",
                "outcome": "robots", "status": null, "duration_ms": 0,
            })
        );
    }
}
