//! The integration tests, one module per area, in one test binary: they
//! run the real binaries (built once for the whole run) and real servers
//! over real sockets, and share the test threads, so that a long test of
//! one area runs beside the tests of another instead of after them.

mod authorization;
mod cluster;
mod cluster_moves;
mod conformance;
mod continuous_crawl;
mod crawl_command;
mod crawl_end_to_end;
mod dashboard;
mod deploy_manifests;
mod frontier_api;
mod frontier_partitions;
mod frontier_restarts;
mod grpcio_client;
mod hostile_clients;
mod hostile_sites;
mod monitoring;
mod plain_frontier;
mod politeness;
mod politeness_groups;
mod replication;
mod store_damage;
mod tls;
