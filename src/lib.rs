//! The root package of the crawl-frontier workspace: the single-machine
//! `crawl` binary (`src/main.rs`: an embedded frontier and workers in one
//! process, and `crawl --demo` against the bundled mock site).
//!
//! # Workspace layout
//!
//! - `bloom-core/`: the filters (Bloom filters in the standard, blocked,
//!   split-block and split-block-256 layouts, a frozen read-only filter, a
//!   counting filter, the partitioned set with online rebuild, snapshots).
//! - `proto/`: the gRPC definitions (URL Frontier API v2.6 and the admin
//!   API), compiled with protox.
//! - `frontier/`: the frontier service and its admin CLI.
//! - `worker/`: the crawl worker.
//! - `mock-site/`: the deterministic web site with crawler traps and its
//!   ground truth, for tests, benchmarks and `crawl --demo`.
//! - `tests/`: cross-crate integration tests on the real binaries.
//! - `deploy/`: container image, compose file, Kubernetes manifests.
