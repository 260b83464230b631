//! The crawl worker: leases URLs from a URL Frontier server, fetches them
//! politely, extracts links, writes WARC records and reports back.
//!
//! # Layout
//!
//! - [`links`]: streaming link extraction from HTML.
//! - [`fetch`]: the HTTP client: timeouts, decoding, body cap, SSRF guard;
//!   [`pinned`] and [`dns`] (the `names` crate's): names pinned to
//!   addresses before DNS (`--hosts-file`), DNS answers kept for their TTL.
//! - [`ssrf`]: which addresses are public (IANA special-purpose blocks).
//! - [`robots`]: robots.txt per origin, cached, RFC 9309 answers.
//! - [`sitemap`]: sitemap and sitemap index reading, gzip included.
//! - [`output`]: WARC 1.1 files and the crawl log.
//! - [`report`]: how a URL ended: the reasons, the crawl log's line.
//! - `outlinks`: a page's links as batches for the frontier, the last one
//!   carrying the page's report.
//! - [`frontier_link`]: leasing and acknowledged reports to the frontier,
//!   and our frontier's extensions (robots.txt shelf, millisecond delays).
//! - `acked`: the long-lived report and outlink streams under it.
//! - [`seen`]: links the frontier already acknowledged, not sent again.
//! - [`config`]: what a worker is told, and the one check of it;
//!   [`error`]: why a worker cannot run; [`stats`]: its counters.
//! - [`pacing`]: politeness per host: when a host's next request may start.
//! - [`pipeline`]: the lease loop and each leased host's pipeline;
//!   `shutdown`: the stop every loop listens to.
//! - [`crawler`]: the steps of one leased URL; [`revisit`]: a page fetched
//!   again, asked for conditionally and judged changed or not.
mod acked;
pub use names::{dns, pinned};
mod client;
pub mod config;
pub mod crawler;
pub mod error;
pub mod fetch;
pub mod frontier_link;
pub mod links;
mod outlinks;
pub mod output;
pub mod pacing;
pub mod pipeline;
pub mod report;
pub mod revisit;
pub mod robots;
pub mod seen;
mod shutdown;
pub mod sitemap;
pub mod ssrf;
pub mod stats;
