//! The root package of the crawl-frontier workspace: the single-machine
//! `crawl` binary (`src/main.rs`: an embedded frontier and workers in one
//! process, and `crawl --demo` against the bundled mock site).
//!
//! # Workspace layout
//!
//! - `bloom-core/`: the filters (standard and blocked Bloom filters, counting
//!   filter, partitioned set with online rebuild, snapshots).
//! - `proto/`: the gRPC definitions (URL Frontier API v2.6 and the admin
//!   API), compiled with protox.
//! - `frontier/`: the frontier service and its admin CLI.
//! - `worker/`: the crawl worker.
//! - `tests/`: cross-crate integration tests and the mock web site.
//! - `deploy/`: container image, compose file, Kubernetes manifests.
