//! Group commit: concurrent writers share redb write transactions.
//!
//! Writers hand their batches to one committer thread; while a group is in
//! flight the next batches queue up, and the committer takes all of them
//! (up to a bound) into its next group. Each writer gets its own answers
//! back only after the group holding its batch is durable, so an
//! acknowledgement always follows durability.
//!
//! Three threads share the work of a group: `group-commit` logs it (one
//! sync makes it durable) and works its effects out against what the store
//! holds in memory over `urls.redb` ([`Store::stage`]), then hands it to
//! `group-finish`, which runs the hook and answers the writers, while
//! `group-commit` goes on with the next group. `group-apply` writes what is
//! held to the two files, both at once, and checkpoints them (the store's
//! module `held`): a checkpoint of a large store takes seconds, and groups
//! go on meanwhile. A group holding a deletion is applied to the files
//! before it is answered.
//!
//! An optional hook sees every committed group's writes and results, on
//! `group-finish`, in commit order, before any writer is answered:
//! the scheduler keeps its memory in step with the store through it, and
//! commit order is what keeps two updates of one URL from being applied to
//! memory the wrong way round.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::store::{Applied, NewUrl, StagedGroup, Store, StoreError, WriteOp};

/// URLs one transaction takes at most, so one commit's latency stays bounded
/// however deep the queue gets.
const MAX_URLS_PER_COMMIT: usize = 64 * 1024;

/// A writer's place in the order of one stream's writes: the next writer
/// of the stream waits for it before it queues anything, and it is given
/// up when dropped, which a writer does as soon as its writes are queued,
/// so one stream's writes reach the committer in order and still share
/// commits with each other, instead of each waiting for the last one to
/// commit.
#[derive(Debug)]
pub struct SubmitTurn {
    previous: Option<oneshot::Receiver<()>>,
    // Dropping it is the signal; nothing is ever sent.
    _release: oneshot::Sender<()>,
}

impl SubmitTurn {
    /// The turn after the one `previous` belongs to (or the first, with
    /// `None`), and the receiver the turn after this one waits on.
    #[must_use]
    pub fn after(previous: Option<oneshot::Receiver<()>>) -> (Self, oneshot::Receiver<()>) {
        let (release, next) = oneshot::channel();
        (
            Self {
                previous,
                _release: release,
            },
            next,
        )
    }

    /// Resolves once the previous writer's writes are queued or it is gone.
    pub async fn ready(&mut self) {
        if let Some(previous) = self.previous.take() {
            // Only ever closed: that is the signal.
            let _ = previous.await;
        }
    }
}

/// A group transaction that failed; every batch in it gets this error and
/// nothing of them is stored.
#[derive(Debug, Clone, thiserror::Error)]
#[error("commit failed: {0}")]
pub struct CommitFailed(pub Arc<StoreError>);

type Answer = Result<Vec<Applied>, CommitFailed>;

type Reply = oneshot::Sender<Answer>;

/// Writes queued with the committer; their answer comes once the group
/// holding them has committed (the writes go on if this is dropped).
#[derive(Debug)]
#[must_use]
pub struct PendingCommit(oneshot::Receiver<Answer>);

impl PendingCommit {
    /// Blocks until the writes have committed; for threads outside the
    /// async runtime.
    pub fn wait(self) -> Answer {
        self.0.blocking_recv().map_err(|_| stopped())?
    }

    /// Resolves once the writes have committed.
    pub async fn committed(self) -> Answer {
        self.0.await.map_err(|_| stopped())?
    }
}

fn stopped() -> CommitFailed {
    CommitFailed(Arc::new(StoreError::Stopped))
}

struct Request {
    ops: Vec<WriteOp>,
    reply: Reply,
    submitted: Instant,
}

/// Called after each commit with the transaction's writes and what they
/// did, in commit order.
pub type CommitHook = Box<dyn Fn(&[WriteOp], &[Applied]) + Send>;

/// The dedup filters as the committer asks them, on its staging thread,
/// whether a discovered URL's record key (its partition, crawl and store
/// hash) is new: such a URL is stored without looking its key up in
/// `urls.redb`, which once the file outgrows the cache costs a page read
/// for every new URL, the staging thread's largest cost.
///
/// What makes a "no" certain: the filters hold the keys of every record
/// the store holds, the committer adding each group's keys right after
/// staging it, on the thread that asks about the next group; filters are
/// built from the store at start-up; and a filter rebuilt online gets each
/// key either from the store (held before its read began) or from an add
/// made while it was built. So a key a filter does not hold is held by no
/// URL stored, and no other URL shares it.
pub trait KeyFilter: Send + Sync {
    /// Whether no URL the store holds has this record key.
    fn surely_absent(&self, partition: u32, crawl: &str, url_hash: u64) -> bool;
    /// Adds a record key the store may now hold.
    fn add(&self, partition: u32, crawl: &str, url_hash: u64);
}

/// The committer thread and its queue. Dropping it drains the queue, commits
/// what was submitted, and joins the thread.
pub struct Committer {
    sender: Option<Sender<Request>>,
    threads: Vec<JoinHandle<()>>,
    commits: Arc<AtomicU64>,
    /// Set once the writers' threads are gone: the applier writes what is
    /// left and ends.
    stop_applying: Arc<AtomicBool>,
    applier: Option<JoinHandle<()>>,
    /// The store, to wake the applier when it is to stop.
    store: Arc<Store>,
}

/// A group between its two stages.
struct Staged {
    group: Vec<Request>,
    counts: Vec<usize>,
    ops: Vec<WriteOp>,
    /// `None` for a group of barriers alone, which has nothing to store.
    staged: Option<StagedGroup>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("commits", &self.commits())
            .finish()
    }
}

impl Committer {
    /// Starts the committer over a store.
    #[must_use]
    pub fn start(store: Arc<Store>) -> Self {
        Self::start_with_hook(store, None)
    }

    /// Starts the committer with a hook run after every commit.
    #[must_use]
    pub fn start_with_hook(store: Arc<Store>, hook: Option<CommitHook>) -> Self {
        Self::start_with(store, hook, None)
    }

    /// Starts the committer with a hook run after every commit, and the
    /// filters that spare new URLs a lookup ([`KeyFilter`]).
    #[must_use]
    pub fn start_with(
        store: Arc<Store>,
        hook: Option<CommitHook>,
        keys: Option<Arc<dyn KeyFilter>>,
    ) -> Self {
        let (sender, receiver) = mpsc::channel::<Request>();
        let (to_finish, staged) = mpsc::channel::<Staged>();
        let commits = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&commits);
        let finisher_store = Arc::clone(&store);
        let finisher = std::thread::Builder::new()
            .name("group-finish".into())
            .spawn(move || finish(&finisher_store, &staged, &counter, hook.as_ref()))
            .expect("the OS can start a thread");
        // Groups are answered from memory from now on; this thread writes
        // them to the files (the store's module `held`).
        store.hold_writes();
        let stop_applying = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stop_applying);
        let applier_store = Arc::clone(&store);
        let waker = Arc::clone(&store);
        let applier = std::thread::Builder::new()
            .name("group-apply".into())
            .spawn(move || apply(&applier_store, &stop))
            .expect("the OS can start a thread");
        let stager = std::thread::Builder::new()
            .name("group-commit".into())
            .spawn(move || stage(&store, keys.as_deref(), &receiver, &to_finish))
            .expect("the OS can start a thread");
        Self {
            sender: Some(sender),
            // The stager first: its end closes the finisher's channel.
            threads: vec![stager, finisher],
            commits,
            stop_applying,
            applier: Some(applier),
            store: waker,
        }
    }

    /// Stores the URLs their crawls do not know yet; blocks until the
    /// transaction holding them has committed. Answers per URL whether it
    /// was stored.
    pub fn insert_if_absent(&self, urls: Vec<NewUrl>) -> Result<Vec<bool>, CommitFailed> {
        let ops = urls.into_iter().map(WriteOp::Discover).collect();
        Ok(self
            .apply(ops)?
            .into_iter()
            .map(|applied| matches!(applied, Applied::Discovered { stored: true }))
            .collect())
    }

    /// Applies writes (see [`Store::apply`]); blocks until the transaction
    /// holding them has committed.
    pub fn apply(&self, ops: Vec<WriteOp>) -> Answer {
        self.submit(ops)?.wait()
    }

    /// Queues writes for the next group without waiting for it; never
    /// blocks, so an async task may call it.
    pub fn submit(&self, ops: Vec<WriteOp>) -> Result<PendingCommit, CommitFailed> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .as_ref()
            .ok_or_else(stopped)?
            .send(Request {
                ops,
                reply,
                submitted: Instant::now(),
            })
            .map_err(|_| stopped())?;
        Ok(PendingCommit(answer))
    }

    /// Blocks until every write queued before this call has committed and
    /// the hook has seen it.
    pub fn barrier(&self) -> Result<(), CommitFailed> {
        self.apply(Vec::new()).map(drop)
    }

    /// Transactions committed so far.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        drop(self.sender.take());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.stop_applying.store(true, Ordering::Release);
        self.store.wake_applier();
        if let Some(applier) = self.applier.take() {
            let _ = applier.join();
        }
    }
}

/// The applier: writes held groups to the files as they come, and
/// checkpoints when one is due, until told to stop with nothing held.
fn apply(store: &Store, stop: &AtomicBool) {
    /// How long the applier sleeps with nothing to write: a checkpoint
    /// falls due with time as well.
    const IDLE: Duration = Duration::from_millis(250);
    let mut last_copy = Instant::now();
    loop {
        store.wait_for_held(IDLE, stop);
        store.wait_to_gather(last_copy + GATHER_COPY, stop);
        let stopping = stop.load(Ordering::Acquire);
        last_copy = Instant::now();
        let applied = store.apply_held();
        if let Err(error) = &applied {
            // The store refuses writes until its files are reopened (the
            // server's write watcher does that); nothing held is lost, the
            // log holds it.
            tracing::warn!(%error, "held groups not written to the store's files");
            store.wait_after_failure();
        }
        if let Err(error) = store.checkpoint_held_if_due() {
            tracing::warn!(%error, "checkpoint failed");
        }
        if stopping && matches!(applied, Ok(false) | Err(_)) {
            return;
        }
    }
}

/// The least time from one of the applier's copies to the next, unless
/// much is held ([`Store::wait_to_gather`]). A copy rewrites every
/// `url_records` page it changes, and a crawl's reports and outlinks
/// spread over the whole table: copied as they came, most writes had a
/// page to themselves. Gathered, they share pages. Answers never wait for
/// a copy (the log holds their groups), and what is held stays small
/// beside its limit: a second of writes.
const GATHER_COPY: Duration = Duration::from_secs(1);

/// How long a small group waits for more writes before it is committed.
/// A group's fixed cost (a log sync, two redb commits) dwarfs a handful of
/// writes; a crawl sends a page's outlinks and its report as two small
/// writes, one after the other, and without the wait nearly every write
/// was a group of its own. The wait is about what one such group takes to
/// commit. It is taken only when writes are arriving closer together than
/// this (a lone writer waiting for each answer before its next write gains
/// nothing from it), and a group of [`GATHER_BELOW`] writes or more goes
/// at once.
const GATHER: Duration = Duration::from_micros(300);

/// Groups of at least this many writes do not wait for more.
const GATHER_BELOW: usize = 64;

/// The first stage: takes the queued batches as one group (a small one
/// waits up to [`GATHER`] for more), logs it and applies it to the urls
/// file, and hands it on.
fn stage(
    store: &Store,
    keys: Option<&dyn KeyFilter>,
    receiver: &Receiver<Request>,
    to_finish: &Sender<Staged>,
) {
    let mut last_submitted: Option<Instant> = None;
    while let Ok(first) = receiver.recv() {
        let busy = last_submitted
            .is_some_and(|last| first.submitted.saturating_duration_since(last) < GATHER);
        let gather_until = Instant::now() + GATHER;
        last_submitted = Some(first.submitted);
        let mut group = vec![first];
        let mut urls = group[0].ops.len();
        while urls < MAX_URLS_PER_COMMIT {
            let next = match receiver.try_recv() {
                Ok(request) => Ok(request),
                Err(_) if busy && urls < GATHER_BELOW => receiver
                    .recv_timeout(gather_until.saturating_duration_since(Instant::now()))
                    .map_err(|_| ()),
                Err(_) => Err(()),
            };
            match next {
                Ok(request) => {
                    last_submitted = Some(request.submitted);
                    urls += request.ops.len();
                    group.push(request);
                }
                Err(()) => break,
            }
        }
        let counts: Vec<usize> = group.iter().map(|r| r.ops.len()).collect();
        let ops: Vec<WriteOp> = group
            .iter_mut()
            .flat_map(|r| std::mem::take(&mut r.ops))
            .collect();
        let result = if ops.is_empty() {
            Ok(None)
        } else {
            let started = std::time::Instant::now();
            let result = match keys {
                Some(keys) => {
                    let record_keys = record_keys(store, &ops);
                    let new_keys: Vec<bool> = (ops.iter().zip(&record_keys))
                        .map(|(op, key)| match (op, key) {
                            (WriteOp::Discover(_), Some((partition, crawl, hash))) => {
                                keys.surely_absent(*partition, crawl, *hash)
                            }
                            _ => false,
                        })
                        .collect();
                    let result = store.stage_knowing(&ops, &new_keys).map(Some);
                    // Before the next group is asked about, and even if
                    // this one failed: a failure may leave some of its
                    // records in the files, and a key too many costs only
                    // a lookup.
                    for (partition, crawl, hash) in record_keys.into_iter().flatten() {
                        keys.add(partition, crawl, hash);
                    }
                    result
                }
                None => store.stage(&ops).map(Some),
            };
            metrics::histogram!("frontier_commit_seconds", "stage" => "urls")
                .record(started.elapsed().as_secs_f64());
            result
        };
        match result {
            Ok(staged) => {
                let staged = Staged {
                    group,
                    counts,
                    ops,
                    staged,
                };
                if let Err(mpsc::SendError(staged)) = to_finish.send(staged) {
                    fail(staged.group, &stopped());
                }
            }
            Err(error) => fail(group, &CommitFailed(Arc::new(error))),
        }
    }
}

/// Per op, the record key (partition, crawl, store hash) of the URL it may
/// store: a discovered URL, or a reported one the store did not know.
fn record_keys<'o>(store: &Store, ops: &'o [WriteOp]) -> Vec<Option<(u32, &'o str, u64)>> {
    ops.iter()
        .map(|op| match op {
            WriteOp::Discover(new) => {
                Some((new.partition, new.crawl.as_str(), store.url_hash(&new.url)))
            }
            WriteOp::Known(known) => Some((
                known.partition,
                known.crawl.as_str(),
                store.url_hash(&known.url),
            )),
            WriteOp::Delete(_) => None,
        })
        .collect()
}

/// The second stage: applies each staged group's `due` changes, in the
/// order staged, runs the hook and answers the writers.
fn finish(
    store: &Store,
    staged: &Receiver<Staged>,
    commits: &AtomicU64,
    hook: Option<&CommitHook>,
) {
    while let Ok(Staged {
        group,
        counts,
        ops,
        staged,
    }) = staged.recv()
    {
        let Some(staged) = staged else {
            answer_all(group, || Ok(Vec::new()));
            continue;
        };
        let started = std::time::Instant::now();
        let result = store.finish(staged);
        metrics::histogram!("frontier_commit_seconds", "stage" => "due")
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(applied) => {
                commits.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("frontier_commits_total").increment(1);
                if let Some(hook) = hook {
                    hook(&ops, &applied);
                }
                let mut answers = applied.into_iter();
                for (request, count) in group.into_iter().zip(counts) {
                    let mine: Vec<Applied> = answers.by_ref().take(count).collect();
                    let _ = request.reply.send(Ok(mine));
                }
            }
            Err(error) => fail(group, &CommitFailed(Arc::new(error))),
        }
    }
}

fn fail(group: Vec<Request>, error: &CommitFailed) {
    answer_all(group, || Err(error.clone()));
}

/// Gives every writer of a group the same answer.
fn answer_all(group: Vec<Request>, answer: impl Fn() -> Answer) {
    for request in group {
        let _ = request.reply.send(answer());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::record::UrlRecord;

    fn new_url(url: String) -> NewUrl {
        NewUrl {
            crawl: "c".into(),
            url,
            partition: 0,
            // Forces the insert-first path, whose restore this test covers.
            maybe_known: false,
            record: UrlRecord {
                due_at: 1,
                queue_key: "q".into(),
                ..UrlRecord::default()
            },
        }
    }

    /// Eight writers with overlapping batches: every URL is stored exactly
    /// once, exactly one writer is told it stored it, and every answer came
    /// after a commit.
    #[test]
    fn concurrent_writers_store_each_url_once() {
        concurrent_writers_store_each_url_once_with(None);
    }

    /// An exact set of record keys, as the filters are asked.
    #[derive(Default)]
    struct KeySet {
        keys: std::sync::Mutex<std::collections::HashSet<(u32, String, u64)>>,
        said_new: AtomicU64,
    }

    impl KeyFilter for KeySet {
        fn surely_absent(&self, partition: u32, crawl: &str, url_hash: u64) -> bool {
            let keys = self.keys.lock().unwrap();
            let absent = !keys.contains(&(partition, crawl.to_owned(), url_hash));
            self.said_new
                .fetch_add(u64::from(absent), Ordering::Relaxed);
            absent
        }

        fn add(&self, partition: u32, crawl: &str, url_hash: u64) {
            let mut keys = self.keys.lock().unwrap();
            keys.insert((partition, crawl.to_owned(), url_hash));
        }
    }

    /// As above, the filters saying which keys are new: a URL sent by two
    /// writers is new to the first group that has it (to both of its
    /// batches if they share that group) and to no later one, and is
    /// stored once.
    #[test]
    fn concurrent_writers_store_each_url_once_with_keys_said_new() {
        let keys = Arc::new(KeySet::default());
        concurrent_writers_store_each_url_once_with(Some(Arc::clone(&keys) as Arc<dyn KeyFilter>));
        assert_eq!(keys.keys.lock().unwrap().len(), 4_000);
        assert!((4_000..=8_000).contains(&keys.said_new.load(Ordering::Relaxed)));
    }

    fn concurrent_writers_store_each_url_once_with(keys: Option<Arc<dyn KeyFilter>>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let committer = Committer::start_with(Arc::clone(&store), None, keys);
        let told_stored: Vec<Vec<String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|writer| {
                    let committer = &committer;
                    scope.spawn(move || {
                        let mut stored = Vec::new();
                        for batch in 0..40 {
                            // Writers overlap: URL i is sent by two writers.
                            let urls: Vec<String> = (0..25)
                                .map(|i| {
                                    format!("http://x/{}", (writer / 2) * 10_000 + batch * 25 + i)
                                })
                                .collect();
                            let answers = committer
                                .insert_if_absent(urls.iter().cloned().map(new_url).collect())
                                .unwrap();
                            stored.extend(
                                urls.into_iter()
                                    .zip(answers)
                                    .filter(|(_, s)| *s)
                                    .map(|(u, _)| u),
                            );
                        }
                        stored
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut times_told: HashMap<String, usize> = HashMap::new();
        for url in told_stored.into_iter().flatten() {
            *times_told.entry(url).or_default() += 1;
        }
        assert_eq!(times_told.len(), 4 * 40 * 25);
        assert!(times_told.values().all(|&n| n == 1));
        assert_eq!(store.for_each_url(|_, _, _, _| {}).unwrap(), 4_000);
        assert!(committer.commits() >= 1 && committer.commits() <= 320);
    }

    fn report(due_at: u64) -> WriteOp {
        WriteOp::Known(crate::store::KnownUrl {
            crawl: "c".into(),
            url: "http://x/".into(),
            partition: 0,
            queue_key: None,
            default_queue: "x".into(),
            due_at,
            metadata: std::collections::BTreeMap::new(),
            now: 1,
            report: None,
        })
    }

    /// A committer whose hook records the due dates of the reports it sees.
    fn recording_committer(store: &Arc<Store>) -> (Committer, Arc<std::sync::Mutex<Vec<u64>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorder = Arc::clone(&seen);
        let hook: CommitHook = Box::new(move |ops, _| {
            for op in ops {
                if let WriteOp::Known(known) = op {
                    recorder.lock().unwrap().push(known.due_at);
                }
            }
        });
        (
            Committer::start_with_hook(Arc::clone(store), Some(hook)),
            seen,
        )
    }

    /// The later of two turns starts waiting first and still reaches the
    /// committer second, and the turn after a writer that went away
    /// does not wait forever.
    #[tokio::test]
    async fn turns_queue_writes_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let (committer, seen) = recording_committer(&store);
        let committer = Arc::new(committer);
        let (mut first, after_first) = SubmitTurn::after(None);
        let (mut second, after_second) = SubmitTurn::after(Some(after_first));
        let (gone, after_gone) = SubmitTurn::after(Some(after_second));
        let (mut last, _) = SubmitTurn::after(Some(after_gone));
        let (started, second_started) = oneshot::channel();
        let later = tokio::spawn({
            let committer = Arc::clone(&committer);
            async move {
                started.send(()).unwrap();
                second.ready().await;
                let pending = committer.submit(vec![report(0)]);
                drop(second);
                pending.unwrap().committed().await
            }
        });
        second_started.await.unwrap();
        first.ready().await;
        let pending = committer.submit(vec![report(5)]).unwrap();
        drop(first);
        pending.committed().await.unwrap();
        later.await.unwrap().unwrap();
        drop(gone);
        last.ready().await;
        let pending = committer.submit(vec![report(7)]).unwrap();
        pending.committed().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![5, 0, 7]);
    }

    /// A barrier returns only once the writes queued before it have
    /// committed and the hook has seen them.
    #[test]
    fn a_barrier_waits_for_the_writes_queued_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let (committer, seen) = recording_committer(&store);
        let pending: Vec<PendingCommit> = (1..=20)
            .map(|due_at| committer.submit(vec![report(due_at)]).unwrap())
            .collect();
        committer.barrier().unwrap();
        assert_eq!(*seen.lock().unwrap(), (1..=20).collect::<Vec<u64>>());
        for pending in pending {
            assert_eq!(pending.wait().unwrap().len(), 1);
        }
    }

    #[test]
    fn dropping_the_committer_stops_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let committer = Committer::start(Arc::clone(&store));
        assert_eq!(
            committer
                .insert_if_absent(vec![new_url("http://x/".into())])
                .unwrap(),
            vec![true]
        );
        drop(committer);
        // The thread released its handle on the store.
        assert_eq!(Arc::strong_count(&store), 1);
    }
}
