//! The coordination store a cluster keeps its shared state in, as the
//! narrow set of calls the cluster makes: reads, one conditional
//! transaction, a watch, leases and an election.
//!
//! [`Coordination`] states the contract; `etcd` implements it over an etcd
//! cluster and `memory` in memory, for tests that drive the cluster's
//! protocol step by step (the same split as raft-rs's `Storage` trait and
//! its `MemStorage`).

mod etcd;
mod memory;

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

pub use etcd::EtcdCoordination;
pub use memory::{MemCoordination, TxnFault};

/// A lease's number: keys put under it go when it ends.
pub type LeaseId = i64;

/// One key as read, with the revision of its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
    /// The store's revision when the key was last written: a
    /// [`Condition::ModRevision`] on it holds until the next write.
    pub mod_revision: i64,
}

/// Every key under a prefix, read at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: i64,
    pub entries: Vec<Entry>,
}

/// What a transaction checks before it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The key does not exist.
    Absent(String),
    /// The key exists and was last written at this revision.
    ModRevision(String, i64),
}

/// One write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Sets a key, under a lease when given.
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    /// Removes a key (absent: nothing happens).
    Delete(String),
    /// Removes every key under a prefix.
    DeletePrefix(String),
}

impl Write {
    /// A put without a lease.
    #[must_use]
    pub fn put(key: impl Into<String>, value: Vec<u8>) -> Self {
        Self::Put {
            key: key.into(),
            value,
            lease: None,
        }
    }
}

/// A compare-and-swap over several keys: every write if every condition
/// holds, none otherwise; with `otherwise_get`, a failed one answers that
/// key as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub when: Vec<Condition>,
    pub then: Vec<Write>,
    pub otherwise_get: Option<String>,
}

impl Txn {
    /// Writes unconditionally.
    #[must_use]
    pub fn writes(then: Vec<Write>) -> Self {
        Self {
            then,
            ..Self::default()
        }
    }

    /// Writes if every condition holds.
    #[must_use]
    pub fn when(when: Vec<Condition>, then: Vec<Write>) -> Self {
        Self {
            when,
            then,
            otherwise_get: None,
        }
    }
}

/// A transaction's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnAnswer {
    /// Whether the conditions held and the writes happened.
    pub succeeded: bool,
    /// The store's revision after the transaction: a key it wrote has this
    /// mod revision.
    pub revision: i64,
    /// On failure, the key `otherwise_get` named, if it exists.
    pub got: Option<Entry>,
}

/// Why a call to the coordination store failed. Nothing is known to have
/// been written, but a transaction may have been: callers read again.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CoordinationError {
    /// The store did not answer, or answered an error.
    #[error("etcd: {0}")]
    Unavailable(String),
    /// A campaign ended without a result (the client's request timeout);
    /// made again under the same lease, it keeps its place.
    #[error("the campaign timed out")]
    CampaignTimedOut,
}

/// Revisions at which something under a watched prefix changed.
pub type Changes = BoxStream<'static, Result<i64, CoordinationError>>;

/// The calls a cluster makes to its coordination store.
///
/// The contract, which every implementation keeps:
///
/// - Every write (a transaction that succeeded) raises the store's
///   revision by one; the written keys take that revision as their mod
///   revision. Reads are linearizable: a read after a write sees it.
/// - A transaction's conditions and writes are atomic: no other write
///   comes between them.
/// - A lease ends when its time to live passes without a keep-alive, or
///   when revoked; its keys are then removed in one write.
/// - A watch yields, in order and at least once, each revision after
///   `from_revision` that changed a key under its prefix (several may come
///   as one: the last of them); it may end, and the caller watches again.
/// - A campaign resolves once this lease's value is the election's leader:
///   the earliest campaigner whose lease lives. The leader is that value
///   until its lease ends.
pub trait Coordination: Send + Sync + std::fmt::Debug {
    /// One key.
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, CoordinationError>>;

    /// Every key under a prefix, at one revision.
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<Snapshot, CoordinationError>>;

    /// A conditional transaction.
    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnAnswer, CoordinationError>>;

    /// Revisions after `from_revision` that changed keys under `prefix`.
    fn watch(
        &self,
        prefix: &str,
        from_revision: i64,
    ) -> BoxFuture<'_, Result<Changes, CoordinationError>>;

    /// A new lease living `ttl` unless kept alive.
    fn grant_lease(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId, CoordinationError>>;

    /// Renews a lease; answers whether it was still alive.
    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<bool, CoordinationError>>;

    /// Whether a lease is alive, without renewing it.
    fn lease_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<bool, CoordinationError>>;

    /// Ends a lease now, removing its keys.
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), CoordinationError>>;

    /// Waits to lead `election` with `value`, while `lease` lives.
    fn campaign(
        &self,
        election: &str,
        value: &str,
        lease: LeaseId,
    ) -> BoxFuture<'_, Result<(), CoordinationError>>;

    /// The value of the election's leader, if any.
    fn leader(&self, election: &str) -> BoxFuture<'_, Result<Option<String>, CoordinationError>>;
}
