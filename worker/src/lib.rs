//! The crawl worker: leases URLs from a URL Frontier server, fetches them
//! politely, extracts links, writes WARC records and reports back.
//!
//! # Layout
//!
//! - [`links`]: streaming link extraction from HTML.
pub mod links;
