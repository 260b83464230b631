//! The crawl worker: leases URLs from a URL Frontier server, fetches them
//! politely, extracts links, writes WARC records and reports back.
//!
//! # Layout
//!
//! Empty so far: the workspace is laid out first, and the worker arrives with
//! its own issue.
