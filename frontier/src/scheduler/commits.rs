//! Memory brought in step with committed writes: each committed
//! transaction's effect on the queues, applied on the committer thread in
//! commit order (the module docs' buffer invariant).

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use proto::metadata;

use super::{Cursor, Queue, Scheduler};
use crate::record::CompactMetadata;
use crate::store::{Applied, Deletion, PreviousPlace, QueueRecord, Removed, WriteOp};
use crate::time::Timestamp;
use crate::write_ops::KnownUrl;

impl Scheduler {
    /// Brings memory in step with a committed transaction. Called by the
    /// committer, in commit order.
    pub fn on_commit(&self, ops: &[WriteOp], applied: &[Applied]) {
        // Queues a politeness group turned away and now lets go of: woken
        // once no queue's lock is held (the groups module's lock order).
        let mut to_wake: Vec<(String, Vec<String>)> = Vec::new();
        for (op, result) in ops.iter().zip(applied) {
            match (op, result) {
                (WriteOp::Discover(new), Applied::Discovered { stored: true }) => {
                    let queue = self.queue_or_new(&new.crawl, &new.record.queue_key);
                    let mut state = queue.lock();
                    state.record.urls += 1;
                    // A record stored whole (a moved partition, a salvage)
                    // may be completed already.
                    if new.record.is_completed() {
                        state.record.completed += 1;
                    } else {
                        let hash = self.store.url_hash(&new.url);
                        state.add_entry((new.record.due_at, hash, &new.url), new.partition, || {
                            Some(CompactMetadata::of(&new.record.metadata))
                        });
                        self.wake(
                            &queue,
                            &mut state,
                            Timestamp::from_unix_secs(new.record.due_at),
                        );
                    }
                }
                (
                    WriteOp::Known(known),
                    Applied::Known {
                        previous,
                        queue_key,
                        due_at,
                    },
                ) => {
                    // A report's URL mostly stays in its queue: found once.
                    let mut same_queue = None;
                    if let Some(PreviousPlace {
                        queue_key: old_queue,
                        due_at: old_due,
                    }) = previous
                    {
                        let queue = self.queue_or_new(&known.crawl, old_queue);
                        let mut state = queue.lock();
                        state.record.urls = state.record.urls.saturating_sub(1);
                        if *old_due == 0 {
                            state.record.completed = state.record.completed.saturating_sub(1);
                        }
                        let hash = self.store.url_hash(&known.url);
                        if state.remove_entry(*old_due, hash, &known.url) {
                            // A lease given back: the queue may serve again
                            // once its last one is, a delay later. The clock
                            // reads the millisecond the report came in; the
                            // delay runs from the next one, so that it is
                            // never shorter than the delay from the report
                            // (and so from the host's last answer).
                            if state.leased.is_empty() {
                                let at = (self.clock)().saturating_add(Duration::from_millis(1));
                                state.let_go(at);
                                if let Some(group) = state.group.clone() {
                                    let waiting = self.group_let_go(&queue, &group, at);
                                    to_wake.push((queue.crawl.clone(), waiting));
                                }
                            }
                            self.wake(&queue, &mut state, Timestamp::EPOCH);
                        }
                        drop(state);
                        if old_queue == queue_key {
                            same_queue = Some(queue);
                        }
                    }
                    let queue =
                        same_queue.unwrap_or_else(|| self.queue_or_new(&known.crawl, queue_key));
                    let mut state = queue.lock();
                    if let Some(address) = reported(known, metadata::ADDRESS)
                        && let Some(group) = self.politeness.address_group(address)
                    {
                        let waiting = self.regroup(&queue, &mut state, &group);
                        to_wake.push((queue.crawl.clone(), waiting));
                    }
                    if let Some(ms) =
                        reported(known, metadata::FETCH_MS).and_then(|ms| ms.parse::<u64>().ok())
                    {
                        let extra = state.answers.observe(ms);
                        if let Some(group) = self.group_of(&queue, &mut state) {
                            group.lock().extra = extra;
                        }
                    }
                    state.record.urls += 1;
                    if *due_at == 0 {
                        state.record.completed += 1;
                    } else {
                        let hash = self.store.url_hash(&known.url);
                        // A report's metadata is settled in the store
                        // (the revisit history): read when handed out.
                        state.add_entry((*due_at, hash, &known.url), known.partition, || None);
                        self.wake(&queue, &mut state, Timestamp::from_unix_secs(*due_at));
                    }
                }
                (WriteOp::Delete(deletion), Applied::Deleted(removed)) => {
                    self.apply_deletion(deletion, removed);
                }
                _ => {}
            }
        }
        for (crawl, keys) in to_wake {
            self.wake_turned_away(&crawl, &keys);
        }
    }

    fn apply_deletion(&self, deletion: &Deletion, removed: &Removed) {
        let crawl = deletion.crawl.as_str();
        // A queue that goes: emptied, so a serve holding it hands out
        // nothing and never puts it back on a wake-up list.
        let forget = |queue: &Arc<Queue>| {
            let mut state = queue.lock();
            state.record = QueueRecord::default();
            state.buffer.clear();
            state.leased.clear();
            state.held = false;
            state.cursor = Cursor::All;
            state.wake = None;
        };
        match (&deletion.queue, deletion.removes_queues()) {
            (None, true) => {
                let gone = self
                    .crawls
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(crawl);
                if let Some(gone) = gone {
                    gone.all_queues().iter().for_each(forget);
                }
                self.default_delays
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(crawl);
                self.groups
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|(of, _), _| of != crawl);
            }
            (Some(key), true) => {
                let gone = self.crawl(crawl).and_then(|c| {
                    c.queues
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(key)
                });
                if let Some(gone) = gone {
                    forget(&gone);
                }
            }
            (_, false) => {
                // Some URLs of these queues went: their memory is read
                // again from the store (leases stay; a lease of a removed
                // URL ends without it coming back, as nothing is buffered
                // before a refill reads the store).
                for (key, gone) in &removed.per_queue {
                    let Some(queue) = self.queue(crawl, key) else {
                        continue;
                    };
                    let mut state = queue.lock();
                    state.record.urls = state.record.urls.saturating_sub(gone.urls);
                    state.record.completed = state.record.completed.saturating_sub(gone.completed);
                    state.buffer.clear();
                    state.cursor = Cursor::NotLoaded;
                    self.wake(&queue, &mut state, Timestamp::EPOCH);
                }
            }
        }
    }
}

/// The first value a report carries under `key`.
fn reported<'a>(known: &'a KnownUrl, key: &str) -> Option<&'a str> {
    known.metadata.get(key)?.first().map(String::as_str)
}
