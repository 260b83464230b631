//! The frontier service: the URL Frontier API over gRPC, redb persistence and
//! partitioned Bloom filters from `bloom-core` (ARCHITECTURE.md at the
//! repository root says how it works and why).
//!
//! # Layout
//!
//! - [`allocator`]: settings of mimalloc, the binaries' allocator.
//! - [`auth`]: the admin token, checked by one layer in front of both
//!   services, and which calls it guards.
//! - [`canonical`]: URL canonicalisation (the `canon` crate, shared with the
//!   worker so both spell a URL alike), the queue key, and the path-repeat
//!   trap measure.
//! - [`scope`]: admission rules (host scope from the seeds, include/exclude
//!   patterns, depth limit, path-repeat traps) and the skip reasons.
//! - [`record`]: the stored value of one URL and its binary form.
//! - [`repair`]: `frontier verify` and `frontier salvage`, the operator's
//!   tools for a store the frontier refuses to open.
//! - [`revisit`]: revisit policies (never, fixed, adaptive) and the change
//!   rate estimate that picks a page's next due date from its history.
//! - [`snapshots`]: filter snapshots written at a clean shutdown and
//!   trusted only while the store is unchanged since.
//! - [`store`]: the redb store: single-opener lock, schema version checks,
//!   URLs in `urls.redb`, the due index, queues and crawl settings in
//!   `frontier.redb`, a group applied to one then the other.
//! - [`write_ops`]: the writes a group holds, which the log records and
//!   the store applies.
//! - [`wal`]: the write-ahead log that makes a group durable between redb
//!   checkpoints, and its replay after a crash.
//! - [`commit`]: group commit, so concurrent writers share transactions;
//!   two threads, one per store file, so that consecutive groups overlap.
//! - [`ingest`]: discovered and known URLs in: canonicalise, admit, exact
//!   (or Bloom) dedup against partitioned filters that always hold every
//!   stored key; deletions; online filter rebuilds; a partition copied
//!   page by page into another store (`ingest/partition_copy.rs`).
//! - [`scheduler`]: queues, leases, the serving gate, wake-up lists.
//! - [`robots_shelf`]: robots.txt answers kept for the workers, per origin.
//! - [`config`]: how a frontier is set up, and the defaults.
//! - [`service`]: the frontier as one object (ingest, scheduler, rebuild
//!   thread, progress), what the gRPC layer and `crawl` call.
//! - [`grpc`]: the URL Frontier v2.6 and admin services, errors to statuses
//!   in one place, the admin token.
//! - [`server`]: both services with health and reflection on a listener.
//! - `admission`: which connections the server takes and for how long
//!   (a limit, a share per address, closed when they send nothing).
//! - [`cluster`]: partitions spread over several nodes through etcd:
//!   membership, the partition map and its epoch, routing of every call
//!   to the nodes that hold its partitions.
//! - [`partition_page`]: a partition's URLs as pages between nodes.
//! - [`partitioning`]: which partition a URL belongs to (by host, or by
//!   registrable domain so that one node serves a domain's hosts).
//! - [`failpoint`]: faults injected on purpose in move tests.
//! - [`handback`]: the frontier shared by the server's tasks, handed back
//!   for a clean shutdown when the last of them lets go.
//! - [`metrics`]: Prometheus metrics.
//! - [`dashboard`]: the web endpoint: `/metrics` and the live dashboard.
//! - [`time`]: [`time::Timestamp`] (from `proto`, shared with the
//!   worker) and how it meets the epoch seconds the API and the store
//!   carry.
//! - `throttle`: warnings that repeat while a condition lasts, logged at
//!   most once per interval.
//!
//! `src/main.rs` is the `frontier` binary: `serve` and the admin client.

mod admission;
pub mod allocator;
pub mod auth;
pub use canon as canonical;
pub mod cluster;
pub mod commit;
pub mod config;
pub mod dashboard;
pub mod failpoint;
pub mod grpc;
pub mod handback;
pub mod ingest;
pub mod metrics;
pub mod partition_page;
pub mod partitioning;
pub mod record;
pub mod repair;
pub mod revisit;
pub mod robots_shelf;
pub mod scheduler;
pub mod scope;
pub mod server;
pub mod service;
pub mod snapshots;
pub mod store;
mod throttle;
pub use proto::time;
pub mod wal;
pub mod write_ops;
