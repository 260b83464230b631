//! Integration tests across the workspace's crates, and the mock web site
//! they crawl.
//!
//! # Layout
//!
//! Empty so far: the mock site and the end-to-end tests arrive with the
//! end-to-end issue. Each crate's own tests live with the crate
//! (`bloom-core/tests/`, ...).
