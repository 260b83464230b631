//! The frontier service: the URL Frontier API over gRPC, redb persistence and
//! partitioned Bloom filters from `bloom-core` (see `../shared/DESIGN.md`).
//!
//! # Layout
//!
//! Empty so far: the workspace is laid out first, and the service arrives
//! with its own issue (URL Frontier data path, storage, filters, admin API).
