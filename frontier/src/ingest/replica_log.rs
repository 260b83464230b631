//! What a partition's leader owes its followers: the URLs each committed
//! group touched in partitions they follow, and the deletions, in commit
//! order, noted by the commit hook; and how far each follower has
//! confirmed them, which a writer waits on before its acknowledgement.
//!
//! A follower is sent URLs as the leader holds them when they are sent,
//! not the writes that made them: state, which taking twice changes
//! nothing, so a batch sent again after a broken call is harmless and a
//! URL written ten times between two batches travels once. Deletions go
//! as themselves, in their place in the order: a URL touched before a
//! deletion is sent before it, so the follower applies both as the leader
//! did.
//!
//! Groups are numbered as they commit. A follower has confirmed group `n`
//! once every step noted for it up to `n` was taken durably there; one
//! owed nothing is up to date at once. The set of followers changes only
//! through the cluster (a follower leaves it in etcd before any write is
//! acknowledged without it), which calls [`ReplicaLog::set_followers`].
//!
//! A follower taken out of the set of a partition this node goes on
//! leading is noted as lagging there: from then on the log keeps the keys
//! written to that partition (with those the follower was owed and had
//! not confirmed), so that when it comes back its copy is brought up to
//! date with those URLs alone ([`ReplicaLog::lag`]). The notes are
//! bounded: past [`LAG_KEYS`] keys, or once a deletion reaches the
//! partition (which keys cannot say), the follower is copied whole.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::store::{Applied, Deletion, WriteOp};

/// One step a follower is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaStep {
    /// URLs (crawl, URL) written since the last batch or deletion, per
    /// partition: one step, so that the follower takes them in one commit.
    Touched(BTreeMap<u32, BTreeSet<(String, String)>>),
    /// A deletion the leader applied.
    Deleted(Deletion),
    /// A queue (of `partition`) whose settings changed: sent as the
    /// leader holds them when sent.
    QueueSettings {
        partition: u32,
        crawl: String,
        queue: String,
    },
    /// The lease horizon was raised: confirmed once a batch that carries
    /// it (every batch carries the horizon as stored when sent) is.
    Horizon,
}

/// The steps a follower is owed, taken for one batch, and the group they
/// bring it up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaBatch {
    /// Shared with the log while the batch is out, so that a follower
    /// taken out of the set meanwhile is noted as lagging by them too.
    pub steps: Arc<Vec<ReplicaStep>>,
    pub through: u64,
}

/// Why a write is not acknowledged though it is stored here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReplicated {
    /// Followers did not confirm its group in time.
    #[error("not confirmed by follower(s) {followers:?} within {waited:?}")]
    NotConfirmed {
        followers: Vec<String>,
        waited: Duration,
    },
    /// This node no longer leads its partition (it was taken over while
    /// the write waited): the write may be on this node alone.
    #[error("this node no longer leads partition {partition}")]
    NoLongerLeader { partition: u32 },
    /// Its partition has fewer copies in sync than a write needs (a
    /// follower left the set).
    #[error("partition {partition} has {copies} copies in sync and a write needs {min_in_sync}")]
    TooFewCopies {
        partition: u32,
        copies: usize,
        min_in_sync: usize,
    },
}

/// (crawl, URL) keys.
type Keys = BTreeSet<(String, String)>;

/// Keys noted for lagging followers at most, over all of them: about a
/// hundred bytes each. Past it a lagging copy is copied whole.
pub const LAG_KEYS: usize = 1 << 19;

#[derive(Debug, Default)]
struct Owed {
    steps: Vec<ReplicaStep>,
    /// A batch is out and unconfirmed: its steps.
    in_flight: Option<Arc<Vec<ReplicaStep>>>,
    confirmed: u64,
    wake: Arc<Notify>,
}

#[derive(Debug, Default)]
struct LogState {
    /// Groups committed.
    committed: u64,
    /// Per partition (index), the followers its writes are sent to: those
    /// of the partitions this node leads.
    followers_of: Vec<Vec<String>>,
    owed: BTreeMap<String, Owed>,
    /// How long a writer waits for its followers.
    patience: Duration,
    /// Per partition (index), whether this node leads it.
    led: Vec<bool>,
    /// Copies, the leader's included, a write must be on.
    min_in_sync: usize,
    /// The highest lease horizon (UTC ms) owed to the followers, and the
    /// group it was owed in.
    horizon_owed: (u64, u64),
    /// Per partition led here, per follower taken out of its set since,
    /// the keys written to it since the follower's last confirmed batch;
    /// `None` when they cannot bring its copy up to date (too many, or a
    /// deletion came).
    lags: BTreeMap<u32, BTreeMap<String, Option<Keys>>>,
    /// Keys over every lag.
    lag_keys: usize,
}

impl LogState {
    /// Notes keys written to `partition` for its lagging followers.
    fn lagged(&mut self, partition: u32, keys: &[(String, String)]) {
        let Some(lags) = self.lags.get_mut(&partition) else {
            return;
        };
        for lag in lags.values_mut() {
            let Some(touched) = lag else { continue };
            for key in keys {
                if touched.insert(key.clone()) {
                    self.lag_keys += 1;
                }
            }
            if self.lag_keys > LAG_KEYS {
                self.lag_keys -= touched.len();
                *lag = None;
            }
        }
    }

    /// A deletion reached `partition` (every partition: `None`): its lags
    /// can no longer say what changed.
    fn lag_deleted(&mut self, partition: Option<u32>) {
        for (p, lags) in &mut self.lags {
            if partition.is_none_or(|only| only == *p) {
                for lag in lags.values_mut() {
                    if let Some(touched) = lag.take() {
                        self.lag_keys -= touched.len();
                    }
                }
            }
        }
    }

    /// What `steps` owe of `partition`: its keys, and whether a deletion
    /// is among them.
    fn owed_of(steps: &[ReplicaStep], partition: u32, keys: &mut Vec<(String, String)>) -> bool {
        let mut deleted = false;
        for step in steps {
            match step {
                ReplicaStep::Touched(partitions) => {
                    keys.extend(partitions.get(&partition).into_iter().flatten().cloned());
                }
                ReplicaStep::Deleted(_) => deleted = true,
                ReplicaStep::QueueSettings { .. } | ReplicaStep::Horizon => {}
            }
        }
        deleted
    }
}

impl Owed {
    /// Drops what is owed of `partition`.
    fn forget(&mut self, partition: u32) {
        keep_partitions(&mut self.steps, |p| p != partition);
    }

    /// Notes URLs of `partition` as owed, in the step after the last
    /// deletion owed (the order that matters: a URL touched after a
    /// deletion is sent after it).
    fn touched(&mut self, partition: u32, keys: impl IntoIterator<Item = (String, String)>) {
        if !matches!(self.steps.last(), Some(ReplicaStep::Touched(_))) {
            self.steps.push(ReplicaStep::Touched(BTreeMap::new()));
        }
        if let Some(ReplicaStep::Touched(partitions)) = self.steps.last_mut() {
            partitions.entry(partition).or_default().extend(keys);
        }
    }
}

/// Drops from `steps` what is owed of partitions `keep` refuses (the
/// follower would refuse them).
fn keep_partitions(steps: &mut Vec<ReplicaStep>, keep: impl Fn(u32) -> bool) {
    steps.retain_mut(|step| match step {
        ReplicaStep::Touched(partitions) => {
            partitions.retain(|p, _| keep(*p));
            !partitions.is_empty()
        }
        ReplicaStep::QueueSettings { partition, .. } => keep(*partition),
        ReplicaStep::Deleted(_) | ReplicaStep::Horizon => true,
    });
}

/// A group numbered `committed` is noted: the followers owed something
/// are woken, and those owed nothing, with no batch out, are up to date.
/// Answers whether any became so.
fn group_noted(
    committed: u64,
    owed: &mut BTreeMap<String, Owed>,
    woken: &BTreeSet<String>,
) -> bool {
    let mut confirmed_now = false;
    for (follower, owed) in owed.iter_mut() {
        if woken.contains(follower) {
            owed.wake.notify_one();
        } else if owed.steps.is_empty() && owed.in_flight.is_none() {
            owed.confirmed = committed;
            confirmed_now = true;
        }
    }
    confirmed_now
}

/// The log of one node (module docs).
#[derive(Debug)]
pub struct ReplicaLog {
    state: Mutex<LogState>,
    /// Bumped when a follower confirms or the set changes.
    progress: watch::Sender<u64>,
}

impl Default for ReplicaLog {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            progress: watch::channel(0).0,
        }
    }
}

impl ReplicaLog {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.progress.send_modify(|n| *n += 1);
    }

    /// Notes a committed group (the commit hook, in commit order).
    pub(super) fn on_commit(&self, ops: &[WriteOp], applied: &[Applied]) {
        let mut state = self.lock();
        state.committed += 1;
        if !state.lags.is_empty() {
            for (op, applied) in ops.iter().zip(applied) {
                let (partition, crawl, url) = match (op, applied) {
                    (WriteOp::Discover(new), Applied::Discovered { stored: true }) => {
                        (new.partition, &new.crawl, &new.url)
                    }
                    (WriteOp::Known(known), _) => (known.partition, &known.crawl, &known.url),
                    (WriteOp::Delete(deletion), _) => {
                        state.lag_deleted(deletion.partition);
                        continue;
                    }
                    _ => continue,
                };
                // Keys are copied only for a partition someone lags in.
                if state.lags.contains_key(&partition) {
                    state.lagged(partition, &[(crawl.clone(), url.clone())]);
                }
            }
        }
        if state.owed.is_empty() {
            return;
        }
        let LogState {
            committed,
            followers_of,
            owed,
            ..
        } = &mut *state;
        let mut woken = BTreeSet::new();
        for (op, applied) in ops.iter().zip(applied) {
            let (partition, crawl, url) = match (op, applied) {
                (WriteOp::Discover(new), Applied::Discovered { stored: true }) => {
                    (new.partition, &new.crawl, &new.url)
                }
                (WriteOp::Known(known), _) => (known.partition, &known.crawl, &known.url),
                (WriteOp::Delete(deletion), _) if deletion.partition.is_none() => {
                    for (follower, owed) in owed.iter_mut() {
                        owed.steps.push(ReplicaStep::Deleted(deletion.clone()));
                        woken.insert(follower.clone());
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(followers) = followers_of.get(partition as usize) else {
                continue;
            };
            for follower in followers {
                let Some(owed) = owed.get_mut(follower) else {
                    continue;
                };
                owed.touched(partition, [(crawl.clone(), url.clone())]);
                woken.insert(follower.clone());
            }
        }
        let confirmed_now = group_noted(*committed, owed, &woken);
        drop(state);
        if confirmed_now {
            self.bump();
        }
    }

    /// The followers of each partition this node leads (index =
    /// partition; others empty), and those taken out of their set that
    /// lag. A follower that leaves is owed nothing more; one that joins is
    /// owed what commits from now on. A follower that leaves a partition
    /// it followed here and lags there is noted as lagging (module docs),
    /// with what it was owed of it; one that lags without having followed
    /// here is not (this node cannot say what its copy misses).
    pub fn set_followers(
        &self,
        followers_of: Vec<Vec<String>>,
        lagging_of: Vec<Vec<String>>,
        led: Vec<bool>,
        min_in_sync: usize,
    ) {
        let mut state = self.lock();
        let previous = std::mem::take(&mut state.followers_of);
        for (partition, lagging) in lagging_of.iter().enumerate() {
            let partition = partition as u32;
            if !led.get(partition as usize).copied().unwrap_or(false) {
                continue;
            }
            for follower in lagging {
                let followed = previous
                    .get(partition as usize)
                    .is_some_and(|before| before.contains(follower));
                let known = state
                    .lags
                    .get(&partition)
                    .is_some_and(|lags| lags.contains_key(follower));
                if known || !followed {
                    continue;
                }
                let mut keys = Vec::new();
                let deleted = state.owed.get(follower).is_some_and(|owed| {
                    let pending = LogState::owed_of(&owed.steps, partition, &mut keys);
                    let out = owed
                        .in_flight
                        .as_ref()
                        .is_some_and(|steps| LogState::owed_of(steps, partition, &mut keys));
                    pending || out
                });
                state
                    .lags
                    .entry(partition)
                    .or_default()
                    .insert(follower.clone(), (!deleted).then(BTreeSet::new));
                if !deleted {
                    state.lagged(partition, &keys);
                }
            }
        }
        // Lags end with the lagging (back in sync, copied elsewhere, or
        // the partition led elsewhere).
        let mut freed = 0;
        state.lags.retain(|partition, lags| {
            lags.retain(|follower, lag| {
                let keep = led.get(*partition as usize).copied().unwrap_or(false)
                    && lagging_of
                        .get(*partition as usize)
                        .is_some_and(|l| l.contains(follower));
                if !keep {
                    freed += lag.as_ref().map_or(0, BTreeSet::len);
                }
                keep
            });
            !lags.is_empty()
        });
        state.lag_keys -= freed;
        // A follower that stays but left some partitions is owed nothing
        // more of them: it would refuse them.
        for (follower, owed) in &mut state.owed {
            for (partition, before) in previous.iter().enumerate() {
                let partition = partition as u32;
                let still = followers_of
                    .get(partition as usize)
                    .is_some_and(|now| now.contains(follower));
                if before.contains(follower) && !still {
                    owed.forget(partition);
                }
            }
        }
        state.led = led;
        state.min_in_sync = min_in_sync;
        let wanted: BTreeSet<String> = followers_of.iter().flatten().cloned().collect();
        let committed = state.committed;
        state.owed.retain(|follower, _| wanted.contains(follower));
        for follower in wanted {
            if !state.owed.contains_key(&follower) {
                // A new follower has not seen the horizon: the next lease
                // owes it again, to every follower.
                state.horizon_owed = (0, 0);
                state.owed.insert(
                    follower,
                    Owed {
                        confirmed: committed,
                        ..Owed::default()
                    },
                );
            }
        }
        state.followers_of = followers_of;
        drop(state);
        self.bump();
    }

    /// Notes URLs of a partition as owed to its followers again, as a
    /// group of their own: a new leader's first step, so that its
    /// followers hold what it received from the leader before it and they
    /// may not have. A writer answered after this waits for it too.
    pub fn owe_again(&self, partition: u32, keys: BTreeSet<(String, String)>) {
        if keys.is_empty() {
            return;
        }
        self.owe_group(partition, |owed| {
            owed.touched(partition, keys.iter().cloned())
        });
    }

    /// Notes a queue's settings, changed here, as owed to the followers of
    /// its partition, as a group of their own; answers whether any is owed
    /// them (a writer then waits as for a write). Only a partition's leader
    /// owes them: a change made on a follower stays there.
    #[must_use]
    pub fn owe_queue_settings(&self, partition: u32, crawl: &str, queue: &str) -> bool {
        self.owe_group(partition, |owed| {
            owed.steps.push(ReplicaStep::QueueSettings {
                partition,
                crawl: crawl.to_owned(),
                queue: queue.to_owned(),
            });
        })
    }

    /// Waits until every follower holds a lease horizon of at least
    /// `until_ms` (stored here already): owed to them as a group of its
    /// own the first time, for the next batch to carry. Immediate with no
    /// followers, or once they confirmed it.
    pub async fn horizon_replicated(&self, until_ms: u64) -> Result<(), NotReplicated> {
        let (group, patience) = {
            let mut state = self.lock();
            if state.owed.is_empty() {
                return Ok(());
            }
            if until_ms > state.horizon_owed.0 {
                state.committed += 1;
                for owed in state.owed.values_mut() {
                    owed.steps.push(ReplicaStep::Horizon);
                    owed.wake.notify_one();
                }
                state.horizon_owed = (until_ms, state.committed);
            }
            (state.horizon_owed.1, state.patience)
        };
        self.replicated(group, patience).await
    }

    /// Notes a group of its own for the followers of `partition`, each
    /// given `step`; answers whether it has any.
    fn owe_group(&self, partition: u32, step: impl Fn(&mut Owed)) -> bool {
        let mut state = self.lock();
        state.committed += 1;
        let LogState {
            committed,
            followers_of,
            owed,
            ..
        } = &mut *state;
        let mut woken = BTreeSet::new();
        for follower in followers_of.get(partition as usize).into_iter().flatten() {
            if let Some(owed) = owed.get_mut(follower) {
                step(owed);
                woken.insert(follower.clone());
            }
        }
        let confirmed_now = group_noted(*committed, owed, &woken);
        drop(state);
        if confirmed_now {
            self.bump();
        }
        !woken.is_empty()
    }

    /// The followers owed anything, now.
    #[must_use]
    pub fn followers(&self) -> Vec<String> {
        self.lock().owed.keys().cloned().collect()
    }

    /// What wakes a follower's sender when it is owed new steps; `None`
    /// when it is no follower here.
    #[must_use]
    pub fn waker(&self, follower: &str) -> Option<Arc<Notify>> {
        self.lock()
            .owed
            .get(follower)
            .map(|owed| Arc::clone(&owed.wake))
    }

    /// Takes what a follower is owed, for one batch (empty steps: nothing
    /// owed, and the batch still carries the lease horizon); `None` when it
    /// is no follower here.
    #[must_use]
    pub fn take(&self, follower: &str) -> Option<ReplicaBatch> {
        let mut state = self.lock();
        let through = state.committed;
        let owed = state.owed.get_mut(follower)?;
        let steps = Arc::new(std::mem::take(&mut owed.steps));
        owed.in_flight = Some(Arc::clone(&steps));
        Some(ReplicaBatch { steps, through })
    }

    /// A batch taken for `follower` is durable there.
    pub fn confirmed(&self, follower: &str, through: u64) {
        let mut state = self.lock();
        let committed = state.committed;
        let Some(owed) = state.owed.get_mut(follower) else {
            return;
        };
        owed.in_flight = None;
        // Groups after the batch that owed it nothing count as confirmed.
        let upto = if owed.steps.is_empty() {
            committed
        } else {
            through
        };
        owed.confirmed = owed.confirmed.max(upto);
        drop(state);
        self.bump();
    }

    /// A batch taken for `follower` failed: its steps are owed again,
    /// before any noted since, but those of partitions it left meanwhile.
    pub fn failed(&self, follower: &str, batch: ReplicaBatch) {
        let mut state = self.lock();
        let LogState {
            followers_of, owed, ..
        } = &mut *state;
        if let Some(owed) = owed.get_mut(follower) {
            owed.in_flight = None;
            let later = std::mem::take(&mut owed.steps);
            owed.steps = Arc::unwrap_or_clone(batch.steps);
            keep_partitions(&mut owed.steps, |p| {
                followers_of
                    .get(p as usize)
                    .is_some_and(|followers| followers.iter().any(|f| f == follower))
            });
            owed.steps.extend(later);
        }
    }

    /// The keys written to `partition` since `follower`, lagging there,
    /// last confirmed a batch: the URLs that bring its copy up to date.
    /// `None` when it is not noted as lagging there, or they cannot
    /// (module docs): it is copied whole.
    #[must_use]
    pub fn lag(&self, follower: &str, partition: u32) -> Option<BTreeSet<(String, String)>> {
        self.lock()
            .lags
            .get(&partition)
            .and_then(|lags| lags.get(follower))
            .cloned()
            .flatten()
    }

    /// Groups committed so far: a writer answered by the group commit is
    /// in one of them.
    #[must_use]
    pub fn committed(&self) -> u64 {
        self.lock().committed
    }

    /// Followers that have not confirmed group `group`.
    fn behind(&self, group: u64) -> Vec<String> {
        self.lock()
            .owed
            .iter()
            .filter(|(_, owed)| owed.confirmed < group)
            .map(|(follower, _)| follower.clone())
            .collect()
    }

    /// Sets how long [`Self::wait_for_followers`] waits: long enough for a
    /// follower that stopped answering to be taken out of the set.
    pub fn set_patience(&self, patience: Duration) {
        self.lock().patience = patience;
    }

    /// Waits until every follower holds what was committed so far (a
    /// writer's group among it), or has left the set; then a write to
    /// `partitions` is acknowledged only if those this node leads still
    /// have enough copies in sync (a follower may have left meanwhile).
    pub async fn wait_for_followers(
        &self,
        partitions: &BTreeSet<u32>,
    ) -> Result<(), NotReplicated> {
        let (group, patience, idle) = {
            let state = self.lock();
            (state.committed, state.patience, state.owed.is_empty())
        };
        if !idle {
            self.replicated(group, patience).await?;
        }
        let state = self.lock();
        for &partition in partitions {
            let p = partition as usize;
            if state.led.is_empty() {
                break; // not in a cluster
            }
            // Followers leave the set also when this node stops leading
            // (another took the partition over): that releases no write.
            if !state.led.get(p).copied().unwrap_or(false) {
                return Err(NotReplicated::NoLongerLeader { partition });
            }
            let copies = 1 + state.followers_of.get(p).map_or(0, Vec::len);
            if copies < state.min_in_sync {
                return Err(NotReplicated::TooFewCopies {
                    partition,
                    copies,
                    min_in_sync: state.min_in_sync,
                });
            }
        }
        Ok(())
    }

    /// Waits until every follower has confirmed group `group` (or left the
    /// set), for at most `patience`.
    pub async fn replicated(&self, group: u64, patience: Duration) -> Result<(), NotReplicated> {
        let mut progress = self.progress.subscribe();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let behind = self.behind(group);
            if behind.is_empty() {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, progress.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(NotReplicated::NotConfirmed {
                        followers: behind,
                        waited: patience,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{KnownUrl, Removed};

    fn known(partition: u32, url: &str) -> WriteOp {
        WriteOp::Known(KnownUrl {
            crawl: "c".into(),
            url: url.into(),
            partition,
            queue_key: None,
            default_queue: "h".into(),
            due_at: 0,
            metadata: BTreeMap::new(),
            now: 1,
            report: None,
        })
    }

    fn applied_known() -> Applied {
        Applied::Known {
            previous: None,
            queue_key: "h".into(),
            due_at: 0,
        }
    }

    fn urls(batch: &ReplicaBatch) -> Vec<(u32, Vec<String>)> {
        batch
            .steps
            .iter()
            .flat_map(|step| match step {
                ReplicaStep::Touched(partitions) => partitions
                    .iter()
                    .map(|(partition, keys)| {
                        (
                            *partition,
                            keys.iter().map(|(_, url)| url.clone()).collect(),
                        )
                    })
                    .collect(),
                ReplicaStep::Deleted(_)
                | ReplicaStep::QueueSettings { .. }
                | ReplicaStep::Horizon => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn each_follower_is_owed_the_writes_of_the_partitions_it_follows_in_order() {
        let log = ReplicaLog::default();
        log.set_followers(
            vec![vec!["b".into()], vec!["b".into(), "c".into()], vec![]],
            Vec::new(),
            Vec::new(),
            1,
        );
        log.on_commit(
            &[
                known(0, "u0"),
                known(1, "u1"),
                known(2, "u2"),
                known(0, "v0"),
            ],
            &[
                applied_known(),
                applied_known(),
                applied_known(),
                applied_known(),
            ],
        );
        let b = log.take("b").unwrap();
        assert_eq!(
            urls(&b),
            vec![(0, vec!["u0".into(), "v0".into()]), (1, vec!["u1".into()])]
        );
        assert_eq!(b.steps.len(), 1, "one step: one commit on the follower");
        assert_eq!(b.through, 1);
        let c = log.take("c").unwrap();
        assert_eq!(urls(&c), vec![(1, vec!["u1".into()])]);
        assert!(log.take("d").is_none(), "no follower, nothing owed");
    }

    #[tokio::test]
    async fn a_writer_waits_for_every_follower_or_its_leaving() {
        let log = ReplicaLog::default();
        log.set_followers(
            vec![vec!["b".into(), "c".into()]],
            Vec::new(),
            Vec::new(),
            1,
        );
        log.on_commit(&[known(0, "u")], &[applied_known()]);
        let group = log.committed();
        let short = Duration::from_millis(1);
        let err = log.replicated(group, short).await.unwrap_err();
        assert!(
            matches!(&err, NotReplicated::NotConfirmed { followers, .. } if followers == &["b", "c"])
        );
        let b = log.take("b").unwrap();
        log.confirmed("b", b.through);
        let err = log.replicated(group, short).await.unwrap_err();
        assert!(
            matches!(&err, NotReplicated::NotConfirmed { followers, .. } if followers == &["c"])
        );
        // c leaves the set (in etcd first): the write waits for b alone.
        log.set_followers(vec![vec!["b".into()]], Vec::new(), Vec::new(), 1);
        log.replicated(group, short).await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_batch_is_owed_again_before_later_writes_and_idle_followers_keep_up() {
        let log = ReplicaLog::default();
        log.set_followers(
            vec![vec!["b".into()], vec!["c".into()]],
            Vec::new(),
            Vec::new(),
            1,
        );
        log.on_commit(&[known(0, "first")], &[applied_known()]);
        let batch = log.take("b").unwrap();
        log.on_commit(&[known(0, "second")], &[applied_known()]);
        // c follows nothing written: up to date at every group.
        let c_only = log.committed();
        assert_eq!(log.behind(c_only), vec!["b".to_owned()]);
        log.failed("b", batch);
        let again = log.take("b").unwrap();
        assert_eq!(
            urls(&again),
            vec![(0, vec!["first".into()]), (0, vec!["second".into()])],
            "the failed batch's step comes before the later one"
        );
        log.confirmed("b", again.through);
        log.replicated(c_only, Duration::from_millis(1))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_write_to_a_partition_left_short_of_copies_is_not_acknowledged() {
        let log = ReplicaLog::default();
        // Partition 0 led here with one follower, partition 1 led here
        // alone (its follower left), partition 2 another node's.
        log.set_followers(
            vec![vec!["b".into()], vec![], vec![]],
            Vec::new(),
            vec![true, true, false],
            2,
        );
        let fine = BTreeSet::from([0]);
        log.wait_for_followers(&fine).await.unwrap();
        // Taken over while it waited: the follower leaving releases nothing.
        assert!(matches!(
            log.wait_for_followers(&BTreeSet::from([2])).await,
            Err(NotReplicated::NoLongerLeader { partition: 2 })
        ));
        let short = BTreeSet::from([0, 1]);
        assert!(matches!(
            log.wait_for_followers(&short).await,
            Err(NotReplicated::TooFewCopies {
                partition: 1,
                copies: 1,
                min_in_sync: 2
            })
        ));
    }

    #[tokio::test]
    async fn keys_owed_again_hold_up_the_next_writer() {
        let log = ReplicaLog::default();
        log.set_followers(vec![vec!["b".into()]], Vec::new(), Vec::new(), 1);
        log.owe_again(0, BTreeSet::from([("c".into(), "u".into())]));
        let group = log.committed();
        assert!(
            log.replicated(group, Duration::from_millis(1))
                .await
                .is_err()
        );
        let batch = log.take("b").unwrap();
        assert_eq!(urls(&batch), vec![(0, vec!["u".into()])]);
        log.confirmed("b", batch.through);
        log.replicated(group, Duration::from_millis(1))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn queue_settings_are_owed_in_their_place_to_the_followers_of_their_partition() {
        let log = ReplicaLog::default();
        log.set_followers(
            vec![vec!["b".into()], vec![]],
            Vec::new(),
            vec![true, false],
            1,
        );
        log.on_commit(&[known(0, "before")], &[applied_known()]);
        assert!(log.owe_queue_settings(0, "c", "h"));
        assert!(
            !log.owe_queue_settings(1, "c", "h2"),
            "a partition without followers here owes nothing"
        );
        log.on_commit(&[known(0, "after")], &[applied_known()]);
        let group = log.committed();
        let batch = log.take("b").unwrap();
        assert_eq!(
            batch.steps[1],
            ReplicaStep::QueueSettings {
                partition: 0,
                crawl: "c".into(),
                queue: "h".into()
            }
        );
        assert_eq!(
            urls(&batch),
            vec![(0, vec!["before".into()]), (0, vec!["after".into()])]
        );
        assert!(
            log.replicated(group, Duration::from_millis(1))
                .await
                .is_err()
        );
        log.confirmed("b", batch.through);
        log.replicated(group, Duration::from_millis(1))
            .await
            .unwrap();
    }

    #[test]
    fn a_crawl_deletion_is_owed_to_every_follower_in_its_place() {
        let log = ReplicaLog::default();
        log.set_followers(vec![vec!["b".into()]], Vec::new(), Vec::new(), 1);
        let deletion = Deletion {
            crawl: "c".into(),
            queue: None,
            created_before: None,
            partitions: 1,
            partition: None,
            urls_below: None,
        };
        log.on_commit(
            &[
                known(0, "before"),
                WriteOp::Delete(deletion.clone()),
                known(0, "after"),
            ],
            &[
                applied_known(),
                Applied::Deleted(Removed::default()),
                applied_known(),
            ],
        );
        let batch = log.take("b").unwrap();
        assert_eq!(batch.steps.len(), 3);
        assert_eq!(batch.steps[1], ReplicaStep::Deleted(deletion));
    }

    #[tokio::test]
    async fn leases_leave_once_every_follower_holds_the_raised_horizon() {
        let alone = ReplicaLog::default();
        alone.horizon_replicated(5_000).await.unwrap();
        let log = ReplicaLog::default();
        log.set_patience(Duration::from_millis(1));
        log.set_followers(
            vec![vec!["b".into()], vec!["c".into()]],
            Vec::new(),
            vec![true, true],
            1,
        );
        assert!(
            log.horizon_replicated(5_000).await.is_err(),
            "owed to b and c, confirmed by neither"
        );
        for follower in ["b", "c"] {
            let batch = log.take(follower).unwrap();
            assert_eq!(*batch.steps, vec![ReplicaStep::Horizon]);
            log.confirmed(follower, batch.through);
        }
        log.horizon_replicated(5_000).await.unwrap();
        log.horizon_replicated(4_000).await.unwrap();
        assert_eq!(*log.take("b").unwrap().steps, Vec::new(), "owed once");
        log.confirmed("b", log.committed());
        // A follower that joins has not seen it: the next lease waits for
        // it, and the horizon is owed to every follower again.
        log.set_followers(
            vec![vec!["b".into(), "d".into()], vec!["c".into()]],
            Vec::new(),
            vec![true, true],
            1,
        );
        assert!(log.horizon_replicated(5_000).await.is_err());
        for follower in ["b", "c", "d"] {
            let batch = log.take(follower).unwrap();
            assert_eq!(*batch.steps, vec![ReplicaStep::Horizon]);
            log.confirmed(follower, batch.through);
        }
        log.horizon_replicated(5_000).await.unwrap();
    }

    fn keys(urls: &[&str]) -> Option<BTreeSet<(String, String)>> {
        Some(
            urls.iter()
                .map(|u| ("c".to_owned(), (*u).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn a_follower_taken_out_lags_with_what_it_missed_until_it_is_back() {
        let log = ReplicaLog::default();
        let both = || vec![vec!["b".into()], vec!["b".into()]];
        log.set_followers(both(), Vec::new(), vec![true, true], 1);
        log.on_commit(&[known(0, "sent")], &[applied_known()]);
        let out = log.take("b").unwrap();
        log.on_commit(&[known(0, "owed")], &[applied_known()]);
        // b is taken out of 0's set (not 1's): it lags there with the
        // batch it was sent and what it was owed.
        log.set_followers(
            vec![vec![], vec!["b".into()]],
            vec![vec!["b".into()], vec![]],
            vec![true, true],
            1,
        );
        assert_eq!(log.lag("b", 0), keys(&["owed", "sent"]));
        assert_eq!(log.lag("b", 1), None, "it follows 1");
        log.failed("b", out);
        assert!(
            urls(&log.take("b").unwrap()).is_empty(),
            "nothing of 0 owed"
        );
        log.on_commit(
            &[known(0, "later"), known(1, "other")],
            &[applied_known(), applied_known()],
        );
        assert_eq!(log.lag("b", 0), keys(&["later", "owed", "sent"]));
        // A node that lags without having followed here: nothing noted.
        log.set_followers(
            vec![vec![], vec!["b".into()]],
            vec![vec!["b".into()], vec!["c".into()]],
            vec![true, true],
            1,
        );
        assert_eq!(log.lag("c", 1), None);
        assert_eq!(log.lag("b", 0), keys(&["later", "owed", "sent"]));
        // Back in sync: nothing noted any more.
        log.set_followers(both(), Vec::new(), vec![true, true], 1);
        assert_eq!(log.lag("b", 0), None);
        assert_eq!(log.lock().lag_keys, 0);
    }

    #[test]
    fn a_deletion_or_too_many_keys_leave_a_lagging_follower_to_a_whole_copy() {
        let log = ReplicaLog::default();
        log.set_followers(
            vec![vec!["b".into()], vec!["b".into()]],
            Vec::new(),
            vec![true, true],
            1,
        );
        log.set_followers(
            vec![vec![], vec![]],
            vec![vec!["b".into()], vec!["b".into()]],
            vec![true, true],
            1,
        );
        let many: Vec<WriteOp> = (0..=LAG_KEYS).map(|n| known(1, &format!("u{n}"))).collect();
        let applied = vec![applied_known(); many.len()];
        log.on_commit(&many, &applied);
        assert_eq!(log.lag("b", 1), None, "past the bound");
        assert_eq!(log.lag("b", 0), keys(&[]));
        let deletion = Deletion {
            crawl: "c".into(),
            queue: None,
            created_before: None,
            partitions: 2,
            partition: None,
            urls_below: None,
        };
        log.on_commit(&[WriteOp::Delete(deletion)], &[applied_known()]);
        assert_eq!(log.lag("b", 0), None, "a deletion");
        assert_eq!(log.lock().lag_keys, 0);
    }
}
