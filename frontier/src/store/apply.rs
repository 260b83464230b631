//! Applying a group to the two files: its writes to `urls.redb`, working
//! out from the records found there the changes `frontier.redb` follows
//! with, and those changes (module docs of [`super`]: why two files).

use std::collections::HashMap;

use super::{
    APPLIED_LSN_KEY, Applied, CRAWL_SETTINGS, DUE, Deletion, KnownUrl, META, MainFileChange,
    NewUrl, PreviousPlace, QUEUES, Removed, SEED_HOSTS, Store, StoreError, URLS, URLS_META,
    WriteOp, apply_order, decode_record, names_under,
};
use redb::ReadableTable;

use crate::queue_counts::{CountDelta, GroupCounts, QueueCounts};
use crate::record::UrlRecord;

/// What applying a group's writes to `urls.redb` gathers for what follows:
/// the changes `frontier.redb` must make, and the group's count changes.
#[derive(Default)]
struct GroupEffects<'a> {
    changes: Vec<MainFileChange>,
    /// Summed per (crawl, queue).
    deltas: HashMap<(&'a str, String), CountDelta>,
    /// Queues a deletion removed whole, in write order: (crawl, queue, or
    /// `None` for all of the crawl's).
    removed_queues: Vec<(String, Option<String>)>,
}

impl<'a> GroupEffects<'a> {
    fn count(&mut self, crawl: &'a str, queue: &str, delta: CountDelta) {
        *self.deltas.entry((crawl, queue.to_owned())).or_default() += delta;
    }

    fn into_counts(self) -> (Vec<MainFileChange>, GroupCounts) {
        let mut counts = QueueCounts::default();
        for ((crawl, queue), delta) in self.deltas {
            counts.add(crawl, &queue, delta);
        }
        (
            self.changes,
            GroupCounts {
                removed: self.removed_queues,
                changes: counts,
            },
        )
    }
}

type UrlsTable<'t> = redb::Table<'t, (u32, &'static str, &'static str), &'static [u8]>;

impl Store {
    /// Applies a group's writes to `urls.redb` in `write` and records its
    /// log number; answers what each did, the changes `frontier.redb` must
    /// follow with, and what the group did to queue counts.
    pub(super) fn apply_urls_in(
        write: &redb::WriteTransaction,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<(Vec<Applied>, Vec<MainFileChange>, GroupCounts), StoreError> {
        write.open_table(URLS_META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut effects = GroupEffects {
            changes: Vec::with_capacity(ops.len()),
            ..GroupEffects::default()
        };
        let mut urls = write.open_table(URLS)?;
        let mut indexed_results = Vec::with_capacity(ops.len());
        for index in apply_order(ops, |op| match op {
            WriteOp::Discover(new) => Some((new.partition, new.crawl.as_str(), new.url.as_str())),
            WriteOp::Known(known) => {
                Some((known.partition, known.crawl.as_str(), known.url.as_str()))
            }
            WriteOp::Delete(_) => None,
        }) {
            let applied = match &ops[index] {
                WriteOp::Discover(new) => Self::apply_discovered(&mut urls, new, &mut effects)?,
                WriteOp::Known(known) => Self::apply_known(&mut urls, known, &mut effects)?,
                WriteOp::Delete(deletion) => {
                    Self::apply_deletion(&mut urls, deletion, &mut effects)?
                }
            };
            indexed_results.push((index, applied));
        }
        indexed_results.sort_unstable_by_key(|(index, _)| *index);
        let results = indexed_results
            .into_iter()
            .map(|(_, applied)| applied)
            .collect();
        let (changes, counts) = effects.into_counts();
        Ok((results, changes, counts))
    }

    fn apply_discovered<'a>(
        urls: &mut UrlsTable<'_>,
        new: &'a NewUrl,
        effects: &mut GroupEffects<'a>,
    ) -> Result<Applied, StoreError> {
        let stored = Self::discover(urls, new)?;
        if stored {
            // A record stored whole (a moved partition, a salvage) may be
            // completed: it is counted so and never due.
            let completed = new.record.is_completed();
            if !completed {
                effects.changes.push(MainFileChange::Insert {
                    crawl: new.crawl.clone(),
                    queue: new.record.queue_key.clone(),
                    due_at: new.record.due_at,
                    url: new.url.clone(),
                    partition: new.partition,
                });
            }
            effects.count(
                &new.crawl,
                &new.record.queue_key,
                CountDelta {
                    urls: 1,
                    completed: i64::from(completed),
                },
            );
        }
        Ok(Applied::Discovered { stored })
    }

    /// A URL's new state: its record replaced (created, depth kept), its
    /// `due` entry moved, counts moved from its old queue to its new one.
    fn apply_known<'a>(
        urls: &mut UrlsTable<'_>,
        known: &'a KnownUrl,
        effects: &mut GroupEffects<'a>,
    ) -> Result<Applied, StoreError> {
        let key = (known.partition, known.crawl.as_str(), known.url.as_str());
        let previous = match urls.get(key)? {
            Some(bytes) => Some(decode_record(&known.crawl, &known.url, bytes.value())?),
            None => None,
        };
        let queue_key = known
            .queue_key
            .clone()
            .or_else(|| previous.as_ref().map(|r| r.queue_key.clone()))
            .unwrap_or_else(|| known.default_queue.clone());
        let record = UrlRecord {
            created_at: previous.as_ref().map_or(known.now, |r| r.created_at),
            due_at: known.due_at,
            depth: previous.as_ref().map_or(0, |r| r.depth),
            queue_key: queue_key.clone(),
            metadata: known.metadata.clone(),
        };
        urls.insert(key, record.encode().as_slice())?;
        if let Some(old) = &previous {
            if !old.is_completed() {
                effects.changes.push(MainFileChange::Remove {
                    crawl: known.crawl.clone(),
                    queue: old.queue_key.clone(),
                    due_at: old.due_at,
                    url: known.url.clone(),
                });
            }
            effects.count(
                &known.crawl,
                &old.queue_key,
                CountDelta {
                    urls: -1,
                    completed: -i64::from(old.is_completed()),
                },
            );
        }
        if !record.is_completed() {
            effects.changes.push(MainFileChange::Insert {
                crawl: known.crawl.clone(),
                queue: queue_key.clone(),
                due_at: record.due_at,
                url: known.url.clone(),
                partition: known.partition,
            });
        }
        effects.count(
            &known.crawl,
            &queue_key,
            CountDelta {
                urls: 1,
                completed: i64::from(record.is_completed()),
            },
        );
        Ok(Applied::Known {
            previous: previous.map(|old| PreviousPlace {
                queue_key: old.queue_key,
                due_at: old.due_at,
            }),
            queue_key,
        })
    }

    fn apply_deletion<'a>(
        urls: &mut UrlsTable<'_>,
        deletion: &'a Deletion,
        effects: &mut GroupEffects<'a>,
    ) -> Result<Applied, StoreError> {
        let removed = Self::delete(urls, deletion, &mut effects.changes)?;
        for (queue, gone) in &removed.per_queue {
            effects.count(
                &deletion.crawl,
                queue,
                CountDelta {
                    urls: -(gone.urls as i64),
                    completed: -(gone.completed as i64),
                },
            );
        }
        if deletion.removes_queues() {
            // Whole queues go, settings and all (and with no queue named,
            // the crawl's scope and default delay), in the order of the
            // writes: a URL stored after the deletion in the same group
            // counts in a queue of its own.
            let crawl = deletion.crawl.as_str();
            effects.changes.push(MainFileChange::RemoveQueues {
                crawl: crawl.to_owned(),
                queue: deletion.queue.clone(),
            });
            effects.deltas.retain(|(delta_crawl, queue), _| {
                *delta_crawl != crawl || deletion.queue.as_ref().is_some_and(|named| named != queue)
            });
            effects
                .removed_queues
                .push((crawl.to_owned(), deletion.queue.clone()));
        }
        Ok(Applied::Deleted(removed))
    }

    /// Applies a group's changes to `frontier.redb` in `write` and records
    /// its log number.
    pub(super) fn apply_main_file_in(
        write: &redb::WriteTransaction,
        changes: &[MainFileChange],
        lsn: u64,
    ) -> Result<(), StoreError> {
        write.open_table(META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut due = write.open_table(DUE)?;
        let mut queues = write.open_table(QUEUES)?;
        let mut seed_hosts = write.open_table(SEED_HOSTS)?;
        let mut crawl_settings = write.open_table(CRAWL_SETTINGS)?;
        for index in apply_order(changes, |change| match change {
            MainFileChange::Insert {
                crawl,
                queue,
                due_at,
                url,
                ..
            }
            | MainFileChange::Remove {
                crawl,
                queue,
                due_at,
                url,
            } => Some((crawl.as_str(), queue.as_str(), *due_at, url.as_str())),
            MainFileChange::RemoveQueues { .. } => None,
        }) {
            match &changes[index] {
                MainFileChange::Insert {
                    crawl,
                    queue,
                    due_at,
                    url,
                    partition,
                } => {
                    due.insert(
                        (crawl.as_str(), queue.as_str(), *due_at, url.as_str()),
                        *partition,
                    )?;
                }
                MainFileChange::Remove {
                    crawl,
                    queue,
                    due_at,
                    url,
                } => {
                    due.remove((crawl.as_str(), queue.as_str(), *due_at, url.as_str()))?;
                }
                MainFileChange::RemoveQueues { crawl, queue } => {
                    let crawl = crawl.as_str();
                    let doomed: Vec<String> = match queue {
                        Some(queue) => vec![queue.clone()],
                        None => names_under(&queues, crawl)?,
                    };
                    for queue in &doomed {
                        queues.remove((crawl, queue.as_str()))?;
                    }
                    if queue.is_none() {
                        for host in names_under(&seed_hosts, crawl)? {
                            seed_hosts.remove((crawl, host.as_str()))?;
                        }
                        crawl_settings.remove(crawl)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn discover(urls: &mut UrlsTable<'_>, new: &NewUrl) -> Result<bool, StoreError> {
        let key = (new.partition, new.crawl.as_str(), new.url.as_str());
        if new.maybe_known && urls.get(key)?.is_some() {
            return Ok(false);
        }
        let previous = urls
            .insert(key, new.record.encode().as_slice())?
            .map(|old| old.value().to_vec());
        match previous {
            // Known after all (a concurrent batch stored it after the filter
            // was asked, or it came earlier in this transaction): put the
            // stored record back.
            Some(old) => {
                urls.insert(key, old.as_slice())?;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    /// Removes a deletion's URLs from `urls`, and adds the removal of their
    /// `due` entries to `changes`.
    fn delete(
        urls: &mut UrlsTable<'_>,
        deletion: &Deletion,
        changes: &mut Vec<MainFileChange>,
    ) -> Result<Removed, StoreError> {
        let crawl = deletion.crawl.as_str();
        let mut removed = Removed::default();
        let partitions = match deletion.partition {
            Some(only) => only..only.saturating_add(1).min(deletion.partitions),
            None => 0..deletion.partitions,
        };
        for partition in partitions {
            // (URL, queue, due date) of each URL to remove; collected first,
            // since a table cannot change under its own iterator.
            let mut doomed: Vec<(String, String, u64)> = Vec::new();
            let entries = match deletion.urls_below.as_deref() {
                Some(below) if deletion.partition.is_some() => {
                    urls.range((partition, crawl, "")..(partition, crawl, below))?
                }
                _ => urls.range((partition, crawl, "")..(partition + 1, "", ""))?,
            };
            for entry in entries {
                let (key, value) = entry?;
                let (_, entry_crawl, url) = key.value();
                if entry_crawl != crawl {
                    break;
                }
                let record = decode_record(crawl, url, value.value())?;
                if deletion
                    .queue
                    .as_ref()
                    .is_some_and(|q| *q != record.queue_key)
                {
                    continue;
                }
                if deletion
                    .created_before
                    .is_some_and(|before| record.created_at >= before)
                {
                    continue;
                }
                doomed.push((url.to_owned(), record.queue_key, record.due_at));
            }
            for (url, queue, due_at) in doomed {
                urls.remove((partition, crawl, url.as_str()))?;
                removed.urls += 1;
                *removed.per_partition.entry(partition).or_default() += 1;
                let per_queue = removed.per_queue.entry(queue.clone()).or_default();
                per_queue.urls += 1;
                per_queue.completed += u64::from(due_at == 0);
                if due_at != 0 {
                    changes.push(MainFileChange::Remove {
                        crawl: crawl.to_owned(),
                        queue,
                        due_at,
                        url,
                    });
                }
            }
        }
        Ok(removed)
    }
}
