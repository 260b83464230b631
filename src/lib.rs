//! The root package of the crawl-frontier workspace. It will hold the
//! single-machine `crawl` binary (an embedded frontier plus workers in one
//! process); until then it only anchors the workspace.
//!
//! # Workspace layout
//!
//! - `bloom-core/`: the filters (standard and blocked Bloom filters, counting
//!   filter, partitioned set with online rebuild, snapshots).
//! - `proto/`: the gRPC definitions (URL Frontier API v2.6), compiled with
//!   protox.
//! - `frontier/`: the frontier service.
//! - `worker/`: the crawl worker.
//! - `tests/`: cross-crate integration tests and the mock web site.
