//! Applying a group to the two files: its writes to `urls.redb`, working
//! out from the records found there the changes `frontier.redb` follows
//! with, and those changes (module docs of [`super`]: why two files).

use super::{
    APPLIED_LSN_KEY, Applied, CRAWL_SETTINGS, DUE, Deletion, DueChange, META, NewUrl, QUEUES,
    Removed, SEED_HOSTS, Store, StoreError, URLS, URLS_META, WriteOp, apply_order, decode_record,
    names_under,
};
use redb::ReadableTable;

use crate::queue_counts::{GroupCounts, QueueCounts};
use crate::record::UrlRecord;

impl Store {
    /// Applies a group's writes to `urls.redb` in `write` and records its
    /// log number; answers what each did, the changes `frontier.redb` must
    /// follow with, and what the group did to queue counts.
    pub(super) fn apply_urls_in(
        write: &redb::WriteTransaction,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<(Vec<Applied>, Vec<DueChange>, GroupCounts), StoreError> {
        write.open_table(URLS_META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut changes = Vec::with_capacity(ops.len());
        // Queue count changes, summed per queue.
        let mut removed_queues = Vec::new();
        let mut deltas: std::collections::HashMap<(&str, String), (i64, i64)> =
            std::collections::HashMap::new();
        let mut urls = write.open_table(URLS)?;
        let mut indexed_results = Vec::with_capacity(ops.len());
        for index in apply_order(ops, |op| match op {
            WriteOp::Discover(new) => Some((new.partition, new.crawl.as_str(), new.url.as_str())),
            WriteOp::Known(known) => {
                Some((known.partition, known.crawl.as_str(), known.url.as_str()))
            }
            WriteOp::Delete(_) => None,
        }) {
            match &ops[index] {
                WriteOp::Discover(new) => {
                    let stored = Self::discover(&mut urls, new)?;
                    if stored {
                        changes.push(DueChange::Insert {
                            crawl: new.crawl.clone(),
                            queue: new.record.queue_key.clone(),
                            due_at: new.record.due_at,
                            url: new.url.clone(),
                            partition: new.partition,
                        });
                        let delta = deltas
                            .entry((new.crawl.as_str(), new.record.queue_key.clone()))
                            .or_default();
                        delta.0 += 1;
                    }
                    indexed_results.push((index, Applied::Discovered { stored }));
                }
                WriteOp::Known(known) => {
                    let key = (known.partition, known.crawl.as_str(), known.url.as_str());
                    let previous = match urls.get(key)? {
                        Some(bytes) => {
                            Some(decode_record(&known.crawl, &known.url, bytes.value())?)
                        }
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
                            changes.push(DueChange::Remove {
                                crawl: known.crawl.clone(),
                                queue: old.queue_key.clone(),
                                due_at: old.due_at,
                                url: known.url.clone(),
                            });
                        }
                        let delta = deltas
                            .entry((known.crawl.as_str(), old.queue_key.clone()))
                            .or_default();
                        delta.0 -= 1;
                        delta.1 -= i64::from(old.is_completed());
                    }
                    if !record.is_completed() {
                        changes.push(DueChange::Insert {
                            crawl: known.crawl.clone(),
                            queue: queue_key.clone(),
                            due_at: record.due_at,
                            url: known.url.clone(),
                            partition: known.partition,
                        });
                    }
                    let delta = deltas
                        .entry((known.crawl.as_str(), queue_key.clone()))
                        .or_default();
                    delta.0 += 1;
                    delta.1 += i64::from(record.is_completed());
                    indexed_results.push((
                        index,
                        Applied::Known {
                            previous: previous.map(|old| (old.queue_key, old.due_at)),
                            queue_key,
                        },
                    ));
                }
                WriteOp::Delete(deletion) => {
                    let removed = Self::delete(&mut urls, deletion, &mut changes)?;
                    for (queue, (urls_removed, completed_removed)) in &removed.per_queue {
                        let delta = deltas
                            .entry((deletion.crawl.as_str(), queue.clone()))
                            .or_default();
                        delta.0 -= *urls_removed as i64;
                        delta.1 -= *completed_removed as i64;
                    }
                    if deletion.removes_queues() {
                        // Whole queues go, settings and all (and with no
                        // queue named, the crawl's scope and default delay),
                        // in the order of the writes: a URL stored after the
                        // deletion in the same group counts in a queue of
                        // its own.
                        let crawl = deletion.crawl.as_str();
                        changes.push(DueChange::RemoveQueues {
                            crawl: crawl.to_owned(),
                            queue: deletion.queue.clone(),
                        });
                        deltas.retain(|(delta_crawl, queue), _| {
                            *delta_crawl != crawl
                                || deletion.queue.as_ref().is_some_and(|named| named != queue)
                        });
                        removed_queues.push((crawl.to_owned(), deletion.queue.clone()));
                    }
                    indexed_results.push((index, Applied::Deleted(removed)));
                }
            }
        }
        indexed_results.sort_unstable_by_key(|(index, _)| *index);
        let results = indexed_results
            .into_iter()
            .map(|(_, applied)| applied)
            .collect();
        let mut counts = QueueCounts::default();
        for ((crawl, queue), (urls, completed)) in deltas {
            counts.add(crawl, &queue, urls, completed);
        }
        Ok((
            results,
            changes,
            GroupCounts {
                removed: removed_queues,
                changes: counts,
            },
        ))
    }

    /// Applies a group's changes to `frontier.redb` in `write` and records
    /// its log number.
    pub(super) fn apply_due_in(
        write: &redb::WriteTransaction,
        changes: &[DueChange],
        lsn: u64,
    ) -> Result<(), StoreError> {
        write.open_table(META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut due = write.open_table(DUE)?;
        let mut queues = write.open_table(QUEUES)?;
        let mut seed_hosts = write.open_table(SEED_HOSTS)?;
        let mut crawl_settings = write.open_table(CRAWL_SETTINGS)?;
        for index in apply_order(changes, |change| match change {
            DueChange::Insert {
                crawl,
                queue,
                due_at,
                url,
                ..
            }
            | DueChange::Remove {
                crawl,
                queue,
                due_at,
                url,
            } => Some((crawl.as_str(), queue.as_str(), *due_at, url.as_str())),
            DueChange::RemoveQueues { .. } => None,
        }) {
            match &changes[index] {
                DueChange::Insert {
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
                DueChange::Remove {
                    crawl,
                    queue,
                    due_at,
                    url,
                } => {
                    due.remove((crawl.as_str(), queue.as_str(), *due_at, url.as_str()))?;
                }
                DueChange::RemoveQueues { crawl, queue } => {
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

    fn discover(
        urls: &mut redb::Table<'_, (u32, &str, &str), &[u8]>,
        new: &NewUrl,
    ) -> Result<bool, StoreError> {
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
        urls: &mut redb::Table<'_, (u32, &str, &str), &[u8]>,
        deletion: &Deletion,
        changes: &mut Vec<DueChange>,
    ) -> Result<Removed, StoreError> {
        let crawl = deletion.crawl.as_str();
        let mut removed = Removed::default();
        for partition in 0..deletion.partitions {
            // (URL, queue, due date) of each URL to remove; collected first,
            // since a table cannot change under its own iterator.
            let mut doomed: Vec<(String, String, u64)> = Vec::new();
            for entry in urls.range((partition, crawl, "")..(partition + 1, "", ""))? {
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
                per_queue.0 += 1;
                per_queue.1 += u64::from(due_at == 0);
                if due_at != 0 {
                    changes.push(DueChange::Remove {
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
