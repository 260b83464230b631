//! Puts in steps, so that a caller on an async runtime keeps blocking work
//! off its threads:
//!
//! 1. [`Ingest::prepare_discovered`] and [`Ingest::prepare_known`] work a
//!    batch's writes out from memory alone: canonical form, rules, filter.
//! 2. [`Ingest::read_store`] settles what only the store can say (a
//!    filter's "maybe"; whether a crawl holds a URL the rules now refuse):
//!    the one step that may read the disk, needed only when
//!    [`PreparedWrite::needs_store_reads`] says so.
//! 3. [`Ingest::submit`] queues the writes with the group commit without
//!    waiting for it. Writes joined first ([`PreparedWrite::join`]) share
//!    one commit: a page's outlinks and its report are stored together or
//!    not at all.
//! 4. [`Ingest::committed`] (or [`Ingest::wait`] off the runtime) waits for
//!    the commit, teaches the filters what was stored and answers the
//!    outcomes. A write submitted must be taken through this step even when
//!    its caller has gone: only then does its filter hold what it stored.

use std::sync::atomic::Ordering;

use bloom_core::KeyHash;

use super::{DedupMode, Discovered, Ingest, IngestError, Known, Outcome};
use crate::commit::{CommitFailed, PendingCommit};
use crate::record::UrlRecord;
use crate::scope::{Rules, SkipReason};
use crate::store::{Applied, KnownUrl, NewUrl, StoreError, WriteOp};

/// A batch's writes, worked out and not yet queued.
#[derive(Debug)]
#[must_use]
pub struct PreparedWrite {
    /// One per item; `Stored` for the writes still to be settled.
    outcomes: Vec<Outcome>,
    /// The batches joined, in order; their items' indexes are into
    /// `outcomes`.
    writes: Vec<Writes>,
    /// Store reads are still due before the writes are queued.
    reads_pending: bool,
}

#[derive(Debug)]
enum Writes {
    Discovered(Vec<Candidate>),
    Known {
        items: Vec<KnownItem>,
        /// Items the rules refuse, as (index into `items`, reason): kept
        /// only if the crawl holds them already.
        refused: Vec<(usize, SkipReason)>,
    },
}

/// A discovered URL on its way to the store.
#[derive(Debug)]
struct Candidate {
    mark: FilterMark,
    url: NewUrl,
}

/// A reported URL on its way to the store.
#[derive(Debug)]
struct KnownItem {
    /// Its index in the batch's outcomes.
    outcome: usize,
    partition: usize,
    hash: KeyHash,
    write: KnownUrl,
}

/// What teaching the filter a stored URL needs, and where its outcome is.
#[derive(Debug)]
struct FilterMark {
    /// Its index in the batch's outcomes.
    outcome: usize,
    partition: usize,
    hash: KeyHash,
    /// The filter said "maybe" before the store was asked.
    maybe: bool,
}

/// What settling the commit's answers needs, one entry per write queued.
#[derive(Debug)]
enum Settle {
    Discovered(Vec<FilterMark>),
    /// (partition, hash) of each report.
    Known(Vec<(usize, KeyHash)>),
}

/// A batch's writes queued with the group commit.
#[derive(Debug)]
#[must_use]
pub struct InFlight {
    outcomes: Vec<Outcome>,
    /// One per batch joined, in the order of their writes.
    settle: Vec<Settle>,
    /// `None` when nothing was left to write.
    answer: Option<PendingCommit>,
}

impl PreparedWrite {
    /// The partitions the batch writes to.
    #[must_use]
    pub fn partitions(&self) -> std::collections::BTreeSet<u32> {
        let mut partitions = std::collections::BTreeSet::new();
        for writes in &self.writes {
            match writes {
                Writes::Discovered(candidates) => {
                    partitions.extend(candidates.iter().map(|c| c.mark.partition as u32));
                }
                Writes::Known { items, .. } => {
                    partitions.extend(items.iter().map(|i| i.partition as u32));
                }
            }
        }
        partitions
    }

    /// This batch and `other` as one write: one commit stores both or
    /// neither, and the outcomes are this batch's followed by `other`'s.
    pub fn join(mut self, other: PreparedWrite) -> PreparedWrite {
        let shift = self.outcomes.len();
        self.outcomes.extend(other.outcomes);
        self.reads_pending |= other.reads_pending;
        for mut writes in other.writes {
            match &mut writes {
                Writes::Discovered(candidates) => {
                    for candidate in candidates {
                        candidate.mark.outcome += shift;
                    }
                }
                Writes::Known { items, .. } => {
                    for item in items {
                        item.outcome += shift;
                    }
                }
            }
            self.writes.push(writes);
        }
        self
    }

    /// Whether [`Ingest::read_store`] has work to do for this batch.
    #[must_use]
    pub fn needs_store_reads(&self) -> bool {
        self.reads_pending
    }
}

impl Ingest {
    /// Works out the writes of discovered URLs (see [`Ingest::put_discovered`])
    /// without reading the store.
    pub fn prepare_discovered(
        &self,
        crawl: &str,
        items: &[Discovered],
        rules: &Rules,
        now: u64,
    ) -> Result<PreparedWrite, IngestError> {
        let seeds = self.seeds_of(crawl);
        let mut outcomes = Vec::with_capacity(items.len());
        let mut candidates = Vec::new();
        for item in items {
            let canonical = match self.accept(&item.url, &item.queue_key, &item.metadata) {
                Ok(canonical) => canonical,
                Err(reason) => {
                    outcomes.push(Outcome::Skipped(reason));
                    continue;
                }
            };
            if let Err(reason) = rules.admit(&canonical, item.depth, &seeds) {
                outcomes.push(Outcome::Skipped(reason));
                continue;
            }
            let queue_key = if item.queue_key.is_empty() {
                canonical.host().to_owned()
            } else {
                item.queue_key.clone()
            };
            let partition = self.partition_of(crawl, canonical.host());
            let hash = self.filter_key(crawl, canonical.as_str());
            let maybe = self.filters.contains(partition, hash)?;
            if maybe && self.mode == DedupMode::Bloom {
                outcomes.push(Outcome::Skipped(SkipReason::Duplicate));
                continue;
            }
            candidates.push(Candidate {
                mark: FilterMark {
                    outcome: outcomes.len(),
                    partition,
                    hash,
                    maybe,
                },
                url: NewUrl {
                    crawl: crawl.to_owned(),
                    // At most MAX_PARTITIONS, checked at open.
                    partition: partition as u32,
                    maybe_known: maybe,
                    url: canonical.into_string(),
                    record: UrlRecord {
                        created_at: now,
                        due_at: now.max(1),
                        depth: item.depth,
                        queue_key,
                        metadata: item.metadata.clone(),
                    },
                },
            });
            outcomes.push(Outcome::Stored);
        }
        Ok(PreparedWrite {
            reads_pending: candidates.iter().any(|c| c.mark.maybe),
            outcomes,
            writes: vec![Writes::Discovered(candidates)],
        })
    }

    /// Works out the writes of reported URLs (see [`Ingest::put_known`])
    /// without reading the store.
    pub fn prepare_known(
        &self,
        crawl: &str,
        items: &[Known],
        rules: &Rules,
        now: u64,
    ) -> Result<PreparedWrite, IngestError> {
        let seeds = self.seeds_of(crawl);
        let policy = self.revisits.of(crawl);
        let mut outcomes = Vec::with_capacity(items.len());
        let mut accepted = Vec::with_capacity(items.len());
        let mut refused = Vec::new();
        for item in items {
            let canonical = match self.accept(&item.url, &item.queue_key, &item.metadata) {
                Ok(canonical) => canonical,
                Err(reason) => {
                    outcomes.push(Outcome::Skipped(reason));
                    continue;
                }
            };
            let partition = self.partition_of(crawl, canonical.host());
            if let Err(reason) = rules.admit(&canonical, item.depth, &seeds) {
                refused.push((accepted.len(), reason));
            }
            accepted.push(KnownItem {
                outcome: outcomes.len(),
                partition,
                hash: self.filter_key(crawl, canonical.as_str()),
                write: KnownUrl {
                    crawl: crawl.to_owned(),
                    partition: partition as u32,
                    queue_key: (!item.queue_key.is_empty()).then(|| item.queue_key.clone()),
                    default_queue: canonical.host().to_owned(),
                    url: canonical.into_string(),
                    due_at: item.due_at,
                    metadata: item.metadata.clone(),
                    now,
                    report: Some(policy),
                },
            });
            outcomes.push(Outcome::Stored);
        }
        Ok(PreparedWrite {
            reads_pending: !refused.is_empty(),
            outcomes,
            writes: vec![Writes::Known {
                items: accepted,
                refused,
            }],
        })
    }

    /// Settles against the store what the filter and the rules left open:
    /// a URL found behind a filter's "maybe" is durably stored, so
    /// "duplicate" is final and it leaves the batch (one not found, a false
    /// positive or stored since, is settled again by the committer's
    /// insert); a URL the rules refuse stays only if its crawl holds it.
    /// Reads here keep most known URLs off the committer thread, the
    /// frontier's bottleneck.
    pub fn read_store(&self, write: &mut PreparedWrite) -> Result<(), IngestError> {
        if !write.reads_pending {
            return Ok(());
        }
        let outcomes = &mut write.outcomes;
        for writes in &mut write.writes {
            self.read_store_for(writes, outcomes)?;
        }
        write.reads_pending = false;
        Ok(())
    }

    /// [`Self::read_store`] for one of the batches joined.
    fn read_store_for(
        &self,
        writes: &mut Writes,
        outcomes: &mut [Outcome],
    ) -> Result<(), IngestError> {
        match writes {
            Writes::Discovered(candidates) => {
                let mut known =
                    self.store
                        .known_urls(
                            candidates.iter().filter(|c| c.mark.maybe).map(|c| {
                                (c.url.partition, c.url.crawl.as_str(), c.url.url.as_str())
                            }),
                        )?
                        .into_iter();
                candidates.retain(|candidate| {
                    let duplicate = candidate.mark.maybe && known.next() == Some(true);
                    if duplicate {
                        outcomes[candidate.mark.outcome] = Outcome::Skipped(SkipReason::Duplicate);
                    }
                    !duplicate
                });
            }
            Writes::Known { items, refused } => {
                let held = self.store.known_urls(refused.iter().map(|&(index, _)| {
                    let write = &items[index].write;
                    (write.partition, write.crawl.as_str(), write.url.as_str())
                }))?;
                for (&(index, reason), held) in refused.iter().zip(held) {
                    if !held {
                        outcomes[items[index].outcome] = Outcome::Skipped(reason);
                    }
                }
                items.retain(|item| outcomes[item.outcome] == Outcome::Stored);
                refused.clear();
            }
        }
        Ok(())
    }

    /// Queues a batch's writes with the group commit (reading the store
    /// first if [`Ingest::read_store`] was not called), or refuses them if
    /// one of their partitions is sealed for a move. Never waits for a
    /// commit.
    pub fn submit(&self, mut write: PreparedWrite) -> Result<InFlight, IngestError> {
        self.read_store(&mut write)?;
        let mut settle = Vec::with_capacity(write.writes.len());
        let mut ops: Vec<WriteOp> = Vec::new();
        let mut partitions: Vec<usize> = Vec::new();
        for writes in write.writes {
            match writes {
                Writes::Discovered(candidates) => {
                    partitions.extend(candidates.iter().map(|c| c.mark.partition));
                    let (marks, batch_ops): (Vec<FilterMark>, Vec<WriteOp>) = candidates
                        .into_iter()
                        .map(|c| (c.mark, WriteOp::Discover(c.url)))
                        .unzip();
                    ops.extend(batch_ops);
                    settle.push(Settle::Discovered(marks));
                }
                Writes::Known { items, .. } => {
                    partitions.extend(items.iter().map(|item| item.partition));
                    let (keys, batch_ops): (Vec<(usize, KeyHash)>, Vec<WriteOp>) = items
                        .into_iter()
                        .map(|item| ((item.partition, item.hash), WriteOp::Known(item.write)))
                        .unzip();
                    ops.extend(batch_ops);
                    settle.push(Settle::Known(keys));
                }
            }
        }
        let answer = if ops.is_empty() {
            None
        } else {
            // Held until the writes are queued: a seal waits for it, then
            // for the commit of everything queued (a barrier), before it
            // reads the partition's tail.
            let _writes_open = self.writes_open_to(partitions)?;
            let committer = self.committer.as_ref().ok_or(StoreError::Stopped)?;
            Some(committer.submit(ops)?)
        };
        Ok(InFlight {
            outcomes: write.outcomes,
            settle,
            answer,
        })
    }

    /// Blocks until a batch's writes have committed, then settles them (see
    /// the module doc); for threads outside the async runtime.
    pub fn wait(&self, mut in_flight: InFlight) -> Result<Vec<Outcome>, IngestError> {
        let applied = in_flight.answer.take().map(PendingCommit::wait);
        self.settle(in_flight, applied)
    }

    /// Resolves once a batch's writes have committed, and settles them
    /// (see the module doc).
    pub async fn committed(&self, mut in_flight: InFlight) -> Result<Vec<Outcome>, IngestError> {
        let applied = match in_flight.answer.take() {
            Some(answer) => Some(answer.committed().await),
            None => None,
        };
        self.settle(in_flight, applied)
    }

    /// Durable now: a URL its crawl did not hold joins its filter (store
    /// first, filter second), and the outcomes say what was stored.
    fn settle(
        &self,
        in_flight: InFlight,
        applied: Option<Result<Vec<Applied>, CommitFailed>>,
    ) -> Result<Vec<Outcome>, IngestError> {
        let applied = applied.transpose()?.unwrap_or_default();
        let mut outcomes = in_flight.outcomes;
        let mut applied = applied.as_slice();
        for settle in &in_flight.settle {
            let ops = match settle {
                Settle::Discovered(marks) => marks.len(),
                Settle::Known(keys) => keys.len(),
            };
            let (own, rest) = applied.split_at(ops.min(applied.len()));
            applied = rest;
            self.settle_batch(settle, own, &mut outcomes)?;
        }
        Ok(outcomes)
    }

    /// [`Self::settle`] for one of the batches joined, given its share of
    /// the commit's answers.
    fn settle_batch(
        &self,
        settle: &Settle,
        applied: &[Applied],
        outcomes: &mut [Outcome],
    ) -> Result<(), IngestError> {
        match settle {
            Settle::Discovered(marks) => {
                for (mark, applied) in marks.iter().zip(applied) {
                    let counters = &self.counters[mark.partition];
                    if matches!(applied, Applied::Discovered { stored: true }) {
                        self.filters.insert(mark.partition, mark.hash)?;
                        counters.stored.fetch_add(1, Ordering::Relaxed);
                        if mark.maybe {
                            counters.refuted_maybes.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        outcomes[mark.outcome] = Outcome::Skipped(SkipReason::Duplicate);
                    }
                }
            }
            Settle::Known(keys) => {
                for (&(partition, hash), applied) in keys.iter().zip(applied) {
                    if matches!(applied, Applied::Known { previous: None, .. }) {
                        self.filters.insert(partition, hash)?;
                        self.counters[partition]
                            .stored
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(())
    }

    /// Records the state clients report for URLs: each record is
    /// overwritten (or created, when the crawl does not know the URL), and
    /// its due entry moves. `Stored` outcomes are durable when this returns.
    /// A URL the crawl holds is updated whatever the rules say now (the
    /// client reports on a URL it was given); one it does not hold passes
    /// the rules a discovered URL passes, so a known item cannot bring in
    /// what discovery would refuse.
    pub fn put_known(
        &self,
        crawl: &str,
        items: &[Known],
        rules: &Rules,
        now: u64,
    ) -> Result<Vec<Outcome>, IngestError> {
        let write = self.prepare_known(crawl, items, rules, now)?;
        self.wait(self.submit(write)?)
    }

    /// Stores the discovered URLs a crawl does not know yet. The answer has
    /// one outcome per item, in order; `Stored` ones are durable when this
    /// returns. Safe to call from many threads at once: their batches share
    /// commits. On a store error nothing is acknowledged (the caller answers
    /// FAIL, and the client may send the batch again).
    pub fn put_discovered(
        &self,
        crawl: &str,
        items: &[Discovered],
        rules: &Rules,
        now: u64,
    ) -> Result<Vec<Outcome>, IngestError> {
        let write = self.prepare_discovered(crawl, items, rules, now)?;
        self.wait(self.submit(write)?)
    }
}
