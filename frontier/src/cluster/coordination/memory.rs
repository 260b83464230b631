//! [`Coordination`] in memory: the twin of etcd that tests drive step by
//! step. It keeps the contract (revisions, atomic transactions, leases
//! whose keys go with them, an election by campaign order) and lets a test
//! end a lease, touch a key as a concurrent writer would, or fail the next
//! transaction before or after it commits.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use super::{
    Changes, Condition, Coordination, CoordinationError, Entry, LeaseId, Snapshot, Txn, TxnAnswer,
    Write,
};

/// How the next transaction fails, when a test asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnFault {
    /// Unanswered and not applied (etcd unreachable).
    Lost,
    /// Applied, but the answer is lost (a timeout after the commit).
    AnswerLost,
}

#[derive(Debug, Clone)]
struct Stored {
    value: Vec<u8>,
    mod_revision: i64,
    lease: Option<LeaseId>,
}

#[derive(Debug, Default)]
struct State {
    revision: i64,
    keys: BTreeMap<String, Stored>,
    leases: BTreeMap<LeaseId, bool>,
    next_lease: LeaseId,
    /// Per election, its campaigners in order: (lease, value).
    elections: BTreeMap<String, Vec<(LeaseId, String)>>,
    /// Each revision and the keys it changed, for watches.
    history: Vec<(i64, Vec<String>)>,
    faults: VecDeque<TxnFault>,
}

impl State {
    fn holds(&self, condition: &Condition) -> bool {
        match condition {
            Condition::Absent(key) => !self.keys.contains_key(key),
            Condition::ModRevision(key, revision) => self
                .keys
                .get(key)
                .is_some_and(|stored| stored.mod_revision == *revision),
        }
    }

    fn entry(&self, key: &str) -> Option<Entry> {
        self.keys.get(key).map(|stored| Entry {
            key: key.to_owned(),
            value: stored.value.clone(),
            mod_revision: stored.mod_revision,
        })
    }

    /// Applies writes as one revision (none if they change nothing).
    fn commit(&mut self, writes: Vec<Write>) {
        let revision = self.revision + 1;
        let mut changed = Vec::new();
        for write in writes {
            match write {
                Write::Put { key, value, lease } => {
                    changed.push(key.clone());
                    self.keys.insert(
                        key,
                        Stored {
                            value,
                            mod_revision: revision,
                            lease,
                        },
                    );
                }
                Write::Delete(key) => {
                    if self.keys.remove(&key).is_some() {
                        changed.push(key);
                    }
                }
                Write::DeletePrefix(prefix) => {
                    let gone: Vec<String> = self
                        .keys
                        .range(prefix.clone()..)
                        .map(|(key, _)| key.clone())
                        .take_while(|key| key.starts_with(&prefix))
                        .collect();
                    for key in gone {
                        self.keys.remove(&key);
                        changed.push(key);
                    }
                }
            }
        }
        // As etcd: a transaction that changes nothing keeps the revision.
        if changed.is_empty() {
            return;
        }
        self.revision = revision;
        self.history.push((revision, changed));
    }

    fn end_lease(&mut self, lease: LeaseId) {
        if self.leases.insert(lease, false) != Some(true) {
            return;
        }
        let keys: Vec<Write> = self
            .keys
            .iter()
            .filter(|(_, stored)| stored.lease == Some(lease))
            .map(|(key, _)| Write::Delete(key.clone()))
            .collect();
        for campaigners in self.elections.values_mut() {
            campaigners.retain(|(held, _)| *held != lease);
        }
        self.commit(keys);
    }

    fn leader(&self, election: &str) -> Option<&(LeaseId, String)> {
        self.elections.get(election).and_then(|c| c.first())
    }
}

/// The in-memory coordination store; clones share one store.
#[derive(Debug, Clone, Default)]
pub struct MemCoordination {
    state: Arc<Mutex<State>>,
    changed: Arc<tokio::sync::Notify>,
}

impl MemCoordination {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store's revision now.
    #[must_use]
    pub fn revision(&self) -> i64 {
        self.state().revision
    }

    /// Ends a lease as if its time to live passed.
    pub fn expire(&self, lease: LeaseId) {
        self.state().end_lease(lease);
        self.changed.notify_waiters();
    }

    /// Rewrites a key with its own value, as a concurrent writer would:
    /// a compare-and-swap on its revision made before now loses.
    pub fn touch(&self, key: &str) {
        let mut state = self.state();
        if let Some(stored) = state.keys.get(key).cloned() {
            state.commit(vec![Write::Put {
                key: key.to_owned(),
                value: stored.value,
                lease: stored.lease,
            }]);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Fails the next transaction so.
    pub fn fail_next_txn(&self, fault: TxnFault) {
        self.state().faults.push_back(fault);
    }

    /// Drops the faults not yet used.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Every key under a prefix now, at once (for tests' checks).
    #[must_use]
    pub fn snapshot(&self, prefix: &str) -> Snapshot {
        let state = self.state();
        Snapshot {
            revision: state.revision,
            entries: state
                .keys
                .range(prefix.to_owned()..)
                .take_while(|(key, _)| key.starts_with(prefix))
                .filter_map(|(key, _)| state.entry(key))
                .collect(),
        }
    }

    /// Applies a transaction at once.
    pub fn apply(&self, txn: Txn) -> Result<TxnAnswer, CoordinationError> {
        // As etcd: a transaction may write each key once.
        let mut written = std::collections::BTreeSet::new();
        for write in &txn.then {
            if let Write::Put { key, .. } | Write::Delete(key) = write
                && !written.insert(key.as_str())
            {
                return Err(CoordinationError::Unavailable(format!(
                    "etcdserver: duplicate key given in txn request: {key}"
                )));
            }
        }
        let mut state = self.state();
        let fault = state.faults.pop_front();
        if fault == Some(TxnFault::Lost) {
            return Err(CoordinationError::Unavailable("injected: lost".to_owned()));
        }
        let succeeded = txn.when.iter().all(|condition| state.holds(condition));
        let got = if succeeded {
            state.commit(txn.then);
            None
        } else {
            txn.otherwise_get.and_then(|key| state.entry(&key))
        };
        let revision = state.revision;
        drop(state);
        self.changed.notify_waiters();
        if fault == Some(TxnFault::AnswerLost) {
            return Err(CoordinationError::Unavailable(
                "injected: answer lost".to_owned(),
            ));
        }
        Ok(TxnAnswer {
            succeeded,
            revision,
            got,
        })
    }

    /// Grants a lease at once.
    #[must_use]
    pub fn grant(&self) -> LeaseId {
        let mut state = self.state();
        state.next_lease += 1;
        let lease = state.next_lease;
        state.leases.insert(lease, true);
        lease
    }

    /// Joins an election at once; answers whether this lease leads it now.
    pub fn join_election(&self, election: &str, value: &str, lease: LeaseId) -> bool {
        let mut state = self.state();
        if state.leases.get(&lease) != Some(&true) {
            return false;
        }
        let campaigners = state.elections.entry(election.to_owned()).or_default();
        if !campaigners.iter().any(|(held, _)| *held == lease) {
            campaigners.push((lease, value.to_owned()));
        }
        state
            .leader(election)
            .is_some_and(|(held, _)| *held == lease)
    }

    /// The value leading an election now.
    #[must_use]
    pub fn leader_now(&self, election: &str) -> Option<String> {
        self.state()
            .leader(election)
            .map(|(_, value)| value.clone())
    }

    /// Whether a lease lives.
    #[must_use]
    pub fn alive(&self, lease: LeaseId) -> bool {
        self.state().leases.get(&lease) == Some(&true)
    }
}

impl Coordination for MemCoordination {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, CoordinationError>> {
        let entry = self.state().entry(key);
        async move { Ok(entry) }.boxed()
    }

    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<Snapshot, CoordinationError>> {
        let snapshot = self.snapshot(prefix);
        async move { Ok(snapshot) }.boxed()
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnAnswer, CoordinationError>> {
        let answer = self.apply(txn);
        async move { answer }.boxed()
    }

    fn watch(
        &self,
        prefix: &str,
        from_revision: i64,
    ) -> BoxFuture<'_, Result<Changes, CoordinationError>> {
        let this = self.clone();
        let prefix = prefix.to_owned();
        let changes = futures::stream::unfold(from_revision, move |seen| {
            let this = this.clone();
            let prefix = prefix.clone();
            async move {
                loop {
                    let notified = this.changed.notified();
                    let next = this
                        .state()
                        .history
                        .iter()
                        .filter(|(revision, keys)| {
                            *revision > seen && keys.iter().any(|k| k.starts_with(&prefix))
                        })
                        .map(|(revision, _)| *revision)
                        .max();
                    if let Some(revision) = next {
                        return Some((Ok(revision), revision));
                    }
                    notified.await;
                }
            }
        });
        async move { Ok(changes.boxed()) }.boxed()
    }

    fn grant_lease(&self, _ttl: Duration) -> BoxFuture<'_, Result<LeaseId, CoordinationError>> {
        let lease = self.grant();
        async move { Ok(lease) }.boxed()
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<bool, CoordinationError>> {
        let alive = self.alive(lease);
        async move { Ok(alive) }.boxed()
    }

    fn lease_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<bool, CoordinationError>> {
        let alive = self.alive(lease);
        async move { Ok(alive) }.boxed()
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), CoordinationError>> {
        self.expire(lease);
        async move { Ok(()) }.boxed()
    }

    fn campaign(
        &self,
        election: &str,
        value: &str,
        lease: LeaseId,
    ) -> BoxFuture<'_, Result<(), CoordinationError>> {
        let (election, value) = (election.to_owned(), value.to_owned());
        async move {
            loop {
                let notified = self.changed.notified();
                if !self.alive(lease) {
                    return Err(CoordinationError::Unavailable(
                        "the campaign's lease ended".to_owned(),
                    ));
                }
                if self.join_election(&election, &value, lease) {
                    return Ok(());
                }
                notified.await;
            }
        }
        .boxed()
    }

    fn leader(&self, election: &str) -> BoxFuture<'_, Result<Option<String>, CoordinationError>> {
        let leader = self.leader_now(election);
        async move { Ok(leader) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;

    #[test]
    fn a_compare_and_swap_holds_until_the_key_changes_and_a_lease_takes_its_keys() {
        let store = MemCoordination::new();
        let created = store
            .apply(Txn::when(
                vec![Condition::Absent("a".into())],
                vec![Write::put("a", b"1".to_vec())],
            ))
            .unwrap();
        assert!(created.succeeded);
        let again = store
            .apply(Txn {
                when: vec![Condition::Absent("a".into())],
                then: vec![Write::put("a", b"2".to_vec())],
                otherwise_get: Some("a".into()),
            })
            .unwrap();
        assert!(!again.succeeded);
        assert_eq!(again.got.unwrap().value, b"1");
        let read = block_on(store.get("a")).unwrap().unwrap();
        assert_eq!(read.mod_revision, created.revision);
        store.touch("a");
        let lost = store
            .apply(Txn::when(
                vec![Condition::ModRevision("a".into(), read.mod_revision)],
                vec![Write::Delete("a".into())],
            ))
            .unwrap();
        assert!(!lost.succeeded, "a touched key fails its old revision");

        let lease = store.grant();
        store
            .apply(Txn::writes(vec![Write::Put {
                key: "n/1".into(),
                value: vec![],
                lease: Some(lease),
            }]))
            .unwrap();
        assert_eq!(store.snapshot("n/").entries.len(), 1);
        store.expire(lease);
        assert!(store.snapshot("n/").entries.is_empty());
        assert!(!store.alive(lease));
    }

    #[test]
    fn the_earliest_live_campaigner_leads_and_the_next_follows_when_its_lease_ends() {
        let store = MemCoordination::new();
        let (first, second) = (store.grant(), store.grant());
        assert!(store.join_election("e", "n1", first));
        assert!(!store.join_election("e", "n2", second));
        assert_eq!(store.leader_now("e").as_deref(), Some("n1"));
        store.expire(first);
        assert_eq!(store.leader_now("e").as_deref(), Some("n2"));
        assert!(block_on(store.campaign("e", "n2", second)).is_ok());
    }

    #[test]
    fn a_lost_answer_still_commits_and_a_lost_call_does_not() {
        let store = MemCoordination::new();
        store.fail_next_txn(TxnFault::Lost);
        store.fail_next_txn(TxnFault::AnswerLost);
        let put = || Txn::writes(vec![Write::put("k", b"v".to_vec())]);
        assert!(store.apply(put()).is_err());
        assert!(store.snapshot("k").entries.is_empty());
        assert!(store.apply(put()).is_err());
        assert_eq!(store.snapshot("k").entries.len(), 1);
    }

    #[tokio::test]
    async fn a_watch_yields_the_revisions_that_changed_its_prefix() {
        let store = MemCoordination::new();
        let mut changes = store.watch("p/", 0).await.unwrap();
        store
            .apply(Txn::writes(vec![Write::put("q", vec![])]))
            .unwrap();
        let written = store
            .apply(Txn::writes(vec![Write::put("p/x", vec![])]))
            .unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), written.revision);
    }
}
