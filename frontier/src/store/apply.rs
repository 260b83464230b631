//! Applying a group to the two files: its writes to `urls.redb`, working
//! out from the records found there the changes `frontier.redb` follows
//! with, and those changes (module docs of [`super`]: why two files).
//!
//! A `url_records` value holds the entries of every URL of one crawl and
//! partition whose hash is the key's (almost always one): a write reads
//! the value, finds its URL's entry by comparing URLs, and writes the value
//! back with that entry replaced, added or removed. Two such URLs in one
//! queue with one due date share a `serving_order` entry, which goes only
//! when neither needs it.

use foldhash::HashMap;

use super::names::GroupNames;
use super::records::RecordsWrite;
use super::{
    APPLIED_LSN_KEY, Applied, CRAWL_REVISIT, CRAWL_SETTINGS, Deletion, KnownUrl, META,
    MainFileChange, NewUrl, PreviousPlace, QUEUES, Removed, SEED_HOSTS, SERVING_ORDER, Store,
    StoreError, URLS_META, UrlKeys, WriteOp, apply_order, names_under,
};

use super::queue_counts::{CountDelta, GroupCounts, QueueCounts};
use crate::record::{StoredEntry, UrlRecord};

/// What a group's first stage answers: what each write did, the changes
/// `frontier.redb` must follow with, and the group's count changes.
pub(super) type GroupOutcome = (Vec<Applied>, Vec<MainFileChange>, GroupCounts);

/// What applying a group's writes to `urls.redb` gathers for what follows:
/// the changes `frontier.redb` must make, and the group's count changes.
#[derive(Default)]
pub(super) struct GroupEffects<'a> {
    changes: Vec<MainFileChange>,
    /// Summed per (crawl, queue number): a report takes its URL out of a
    /// queue's counts and puts it back in, so most sum to one change.
    deltas: HashMap<(&'a str, u32), CountDelta>,
    /// Queues a deletion removed whole, in write order: (crawl, queue, or
    /// `None` for all of the crawl's).
    removed_queues: Vec<(String, Option<String>)>,
}

impl<'a> GroupEffects<'a> {
    fn count(&mut self, crawl: &'a str, queue: u32, delta: CountDelta) {
        *self.deltas.entry((crawl, queue)).or_default() += delta;
    }

    fn into_counts(
        self,
        names: &GroupNames<'_, '_>,
    ) -> Result<(Vec<MainFileChange>, GroupCounts), StoreError> {
        let mut counts = QueueCounts::default();
        let names = names.read();
        for ((crawl, queue), delta) in self.deltas {
            counts.add(
                crawl,
                names.shared_queue_key(queue, "a count change")?,
                delta,
            );
        }
        Ok((
            self.changes,
            GroupCounts {
                removed: self.removed_queues,
                changes: counts,
            },
        ))
    }
}

use super::record_access::RecordAccess;

/// The URLs of one hash a deletion removes.
struct Doomed {
    hash: u64,
    /// The entries that stay, as their value's bytes (empty: none).
    kept: Vec<u8>,
    /// The entries that go: (queue number, queue key, due date).
    gone: Vec<(u32, String, u64)>,
}

/// The entries of a value; damage is an error naming the crawl and a URL.
fn entries_of<'v>(
    crawl: &str,
    url: &str,
    value: &'v [u8],
) -> Result<Vec<StoredEntry<'v>>, StoreError> {
    StoredEntry::decode_all(value).map_err(|source| StoreError::CorruptRecord {
        crawl: crawl.to_owned(),
        url: url.to_owned(),
        source,
    })
}

/// The position of `url`'s entry among `entries`.
fn position_of(
    names: &GroupNames<'_, '_>,
    entries: &[StoredEntry<'_>],
    url: &str,
) -> Result<Option<usize>, StoreError> {
    let names = names.read();
    for (index, entry) in entries.iter().enumerate() {
        if entry.is_url(url, names.queue_key(entry.queue, url)?) {
            return Ok(Some(index));
        }
    }
    Ok(None)
}

/// Whether an entry not completed, other than the one at `except`, needs
/// the `serving_order` entry (queue, due date) of its hash.
fn still_due(entries: &[StoredEntry<'_>], except: Option<usize>, queue: u32, due_at: u64) -> bool {
    due_at != 0
        && entries
            .iter()
            .enumerate()
            .any(|(index, e)| Some(index) != except && e.queue == queue && e.due_at == due_at)
}

impl Store {
    /// Applies a group's writes to `urls.redb` in `write` and records its
    /// log number; answers what each did, the changes `frontier.redb` must
    /// follow with, and what the group did to queue counts.
    pub(super) fn apply_urls_in(
        write: &redb::WriteTransaction,
        keys: &UrlKeys<'_>,
        ops: &[WriteOp],
        lsn: u64,
    ) -> Result<GroupOutcome, StoreError> {
        write.open_table(URLS_META)?.insert(APPLIED_LSN_KEY, lsn)?;
        let mut names = GroupNames::open(keys.names, write)?;
        let mut records = RecordsWrite::open(write)?;
        Self::run_ops(
            &mut records,
            &mut names,
            keys,
            ops,
            &[],
            |records, names, deletion, effects| {
                Self::apply_deletion(records, names, keys, deletion, effects)
            },
        )
    }

    /// Works a group's writes out against `records`, in key order (see
    /// `apply_order`); a deletion is handed to `delete`.
    pub(super) fn run_ops<R: RecordAccess>(
        records: &mut R,
        names: &mut GroupNames<'_, '_>,
        keys: &UrlKeys<'_>,
        ops: &[WriteOp],
        new_keys: &[bool],
        mut delete: impl for<'a> FnMut(
            &mut R,
            &GroupNames<'_, '_>,
            &'a Deletion,
            &mut GroupEffects<'a>,
        ) -> Result<Applied, StoreError>,
    ) -> Result<GroupOutcome, StoreError> {
        let mut effects = GroupEffects {
            changes: Vec::with_capacity(ops.len()),
            ..GroupEffects::default()
        };
        let hashes: Vec<u64> = ops
            .iter()
            .map(|op| match op {
                WriteOp::Discover(new) => keys.hasher.hash(&new.url),
                WriteOp::Known(known) => keys.hasher.hash(&known.url),
                WriteOp::Delete(_) => 0,
            })
            .collect();
        let keyed: Vec<(&WriteOp, u64)> = ops.iter().zip(hashes.iter().copied()).collect();
        let mut indexed_results = Vec::with_capacity(ops.len());
        for index in apply_order(&keyed, |(op, hash)| match op {
            WriteOp::Discover(new) => Some((new.partition, new.crawl.as_str(), *hash)),
            WriteOp::Known(known) => Some((known.partition, known.crawl.as_str(), *hash)),
            WriteOp::Delete(_) => None,
        }) {
            let hash = hashes[index];
            let applied = match &ops[index] {
                WriteOp::Discover(new) => {
                    let new_key = new_keys.get(index).copied().unwrap_or(false);
                    Self::discover(records, names, new, (hash, new_key), &mut effects)?
                }
                WriteOp::Known(known) => {
                    Self::apply_known(records, names, known, hash, &mut effects)?
                }
                WriteOp::Delete(deletion) => delete(records, names, deletion, &mut effects)?,
            };
            indexed_results.push((index, applied));
        }
        indexed_results.sort_unstable_by_key(|(index, _)| *index);
        let results = indexed_results
            .into_iter()
            .map(|(_, applied)| applied)
            .collect();
        let (changes, counts) = effects.into_counts(names)?;
        Ok((results, changes, counts))
    }

    /// Stores a discovered URL unless its crawl knows it.
    fn discover<'a>(
        records: &mut impl RecordAccess,
        names: &mut GroupNames<'_, '_>,
        new: &'a NewUrl,
        (hash, new_key): (u64, bool),
        effects: &mut GroupEffects<'a>,
    ) -> Result<Applied, StoreError> {
        let crawl = names.crawl_number(&new.crawl)?;
        let key = (new.partition, crawl, hash);
        // A "maybe" of the filter is usually a known URL: looked up first.
        // A "no" is certain, so the URL is inserted without a lookup (one
        // descent instead of two), and what the insert replaced is put back
        // if the URL was known after all (stored by a concurrent batch
        // after the filter was asked, or earlier in this group). A key the
        // committer's filters say is new is looked for only in what is
        // held and in the group, never in the files.
        if new.maybe_known
            && !new_key
            && let Some(value) = records.get(key)?
            && position_of(names, &entries_of(&new.crawl, &new.url, &value)?, &new.url)?.is_some()
        {
            return Ok(Applied::Discovered { stored: false });
        }
        let queue = names.queue_number(crawl, &new.record.queue_key)?;
        let mut entry = Vec::with_capacity(32 + new.url.len());
        StoredEntry::encode(&new.url, queue, &new.record, &mut entry);
        let replaced = if new_key {
            records.insert_new(key, entry)?
        } else {
            records.insert(key, entry)?
        };
        if let Some(mut value) = replaced {
            let known = position_of(names, &entries_of(&new.crawl, &new.url, &value)?, &new.url)?;
            if known.is_none() {
                // A hash collision: the URL joins the entries of its hash.
                StoredEntry::encode(&new.url, queue, &new.record, &mut value);
            }
            records.replace(key, value)?;
            if known.is_some() {
                return Ok(Applied::Discovered { stored: false });
            }
        }
        // A record stored whole (a moved partition, a salvage) may be
        // completed: it is counted so and never due.
        let completed = new.record.is_completed();
        if !completed {
            effects.changes.push(MainFileChange::Insert {
                queue,
                due_at: new.record.due_at,
                hash,
                partition: new.partition,
            });
        }
        effects.count(
            &new.crawl,
            queue,
            CountDelta {
                urls: 1,
                completed: i64::from(completed),
            },
        );
        Ok(Applied::Discovered { stored: true })
    }

    /// A URL's new state: its record replaced (created, depth kept), its
    /// `serving_order` entry moved, counts moved from its old queue to its
    /// new one.
    fn apply_known<'a>(
        records: &mut impl RecordAccess,
        names: &mut GroupNames<'_, '_>,
        known: &'a KnownUrl,
        hash: u64,
        effects: &mut GroupEffects<'a>,
    ) -> Result<Applied, StoreError> {
        let crawl = names.crawl_number(&known.crawl)?;
        let key = (known.partition, crawl, hash);
        let value = records.get(key)?;
        let entries = match &value {
            Some(value) => entries_of(&known.crawl, &known.url, value)?,
            None => Vec::new(),
        };
        let found = position_of(names, &entries, &known.url)?;
        let previous = match found {
            Some(index) => {
                let entry = &entries[index];
                let queue_key = names.read().queue_key(entry.queue, &known.url)?.to_owned();
                Some((entry, queue_key))
            }
            None => None,
        };
        let queue_key = known
            .queue_key
            .clone()
            .or_else(|| previous.as_ref().map(|(_, key)| key.clone()))
            .unwrap_or_else(|| known.default_queue.clone());
        let queue = names.queue_number(crawl, &queue_key)?;
        let (due_at, metadata) = match known.report {
            Some(policy) => {
                // The history lives in the stored metadata: read it only
                // where the report may need it.
                let stored = match &previous {
                    Some((entry, key))
                        if known.due_at != 0 || policy != crate::revisit::Policy::Never =>
                    {
                        Some(entry.record(key.clone()).map_err(|source| {
                            StoreError::CorruptRecord {
                                crawl: known.crawl.clone(),
                                url: known.url.clone(),
                                source,
                            }
                        })?)
                    }
                    _ => None,
                };
                crate::revisit::settle(
                    policy,
                    stored.as_ref().map(|record| &record.metadata),
                    &known.metadata,
                    known.due_at,
                    known.now,
                )
            }
            None => (known.due_at, known.metadata.clone()),
        };
        let record = UrlRecord {
            created_at: previous.as_ref().map_or(known.now, |(e, _)| e.created_at),
            due_at,
            depth: previous.as_ref().map_or(0, |(e, _)| e.depth),
            queue_key: queue_key.clone(),
            metadata,
        };
        let mut new_value = Vec::with_capacity(value.as_ref().map_or(0, Vec::len) + 32);
        for (index, entry) in entries.iter().enumerate() {
            if Some(index) == found {
                StoredEntry::encode(&known.url, queue, &record, &mut new_value);
            } else {
                new_value.extend_from_slice(entry.raw);
            }
        }
        if found.is_none() {
            StoredEntry::encode(&known.url, queue, &record, &mut new_value);
        }
        records.replace(key, new_value)?;
        if let Some((old, _)) = &previous {
            if !old.is_completed() && !still_due(&entries, found, old.queue, old.due_at) {
                effects.changes.push(MainFileChange::Remove {
                    queue: old.queue,
                    due_at: old.due_at,
                    hash,
                });
            }
            effects.count(
                &known.crawl,
                old.queue,
                CountDelta {
                    urls: -1,
                    completed: -i64::from(old.is_completed()),
                },
            );
        }
        if !record.is_completed() {
            effects.changes.push(MainFileChange::Insert {
                queue,
                due_at: record.due_at,
                hash,
                partition: known.partition,
            });
        }
        effects.count(
            &known.crawl,
            queue,
            CountDelta {
                urls: 1,
                completed: i64::from(record.is_completed()),
            },
        );
        Ok(Applied::Known {
            previous: previous.map(|(old, queue_key)| PreviousPlace {
                queue_key,
                due_at: old.due_at,
            }),
            queue_key,
            due_at: record.due_at,
        })
    }

    fn apply_deletion<'a>(
        records: &mut RecordsWrite<'_>,
        names: &GroupNames<'_, '_>,
        keys: &UrlKeys<'_>,
        deletion: &'a Deletion,
        effects: &mut GroupEffects<'a>,
    ) -> Result<Applied, StoreError> {
        let removed = Self::delete(records, names, keys, deletion, &mut effects.changes)?;
        // The queues of URLs removed have numbers: their entries held them.
        let number_of = |queue: &str| {
            let names = names.read();
            (names.crawl_number(&deletion.crawl)).and_then(|crawl| names.queue_number(crawl, queue))
        };
        for (queue, gone) in &removed.per_queue {
            let number = number_of(queue).ok_or_else(|| {
                StoreError::Halted(format!("queue {queue:?} of removed URLs has no number"))
            })?;
            effects.count(
                &deletion.crawl,
                number,
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
            // A named queue without a number holds no change to keep out.
            let named = deletion.queue.as_deref().map(number_of);
            effects.deltas.retain(|(delta_crawl, queue), _| {
                *delta_crawl != crawl || named.is_some_and(|named| named != Some(*queue))
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
        let mut serving_order = write.open_table(SERVING_ORDER)?;
        let mut queues = write.open_table(QUEUES)?;
        let mut seed_hosts = write.open_table(SEED_HOSTS)?;
        let mut crawl_settings = write.open_table(CRAWL_SETTINGS)?;
        let mut crawl_revisit = write.open_table(CRAWL_REVISIT)?;
        for index in apply_order(changes, |change| match change {
            MainFileChange::Insert {
                queue,
                due_at,
                hash,
                ..
            }
            | MainFileChange::Remove {
                queue,
                due_at,
                hash,
            } => Some((*queue, *due_at, *hash)),
            MainFileChange::RemoveQueues { .. } => None,
        }) {
            match &changes[index] {
                MainFileChange::Insert {
                    queue,
                    due_at,
                    hash,
                    partition,
                } => {
                    serving_order.insert((*queue, *due_at, *hash), *partition)?;
                }
                MainFileChange::Remove {
                    queue,
                    due_at,
                    hash,
                } => {
                    serving_order.remove((*queue, *due_at, *hash))?;
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
                        crawl_revisit.remove(crawl)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes a deletion's URLs from `url_records`, and adds the removal
    /// of their `serving_order` entries to `changes`.
    fn delete(
        records: &mut RecordsWrite<'_>,
        names: &GroupNames<'_, '_>,
        keys: &UrlKeys<'_>,
        deletion: &Deletion,
        changes: &mut Vec<MainFileChange>,
    ) -> Result<Removed, StoreError> {
        let mut removed = Removed::default();
        let crawl_name = deletion.crawl.as_str();
        let (crawl, only_queue) = {
            let names = names.read();
            let Some(crawl) = names.crawl_number(crawl_name) else {
                return Ok(removed);
            };
            let only_queue = match &deletion.queue {
                Some(key) => match names.queue_number(crawl, key) {
                    Some(number) => Some(number),
                    // A queue that never had a number holds no URL.
                    None => return Ok(removed),
                },
                None => None,
            };
            (crawl, only_queue)
        };
        let partitions = match deletion.partition {
            Some(only) => only..only.saturating_add(1).min(deletion.partitions),
            None => 0..deletion.partitions,
        };
        for partition in partitions {
            let end = match deletion.urls_below.as_deref() {
                Some(below) if deletion.partition.is_some() => {
                    std::ops::Bound::Excluded((partition, crawl, keys.hasher.hash(below)))
                }
                _ => std::ops::Bound::Included((partition, crawl, u64::MAX)),
            };
            // Collected first, since a table cannot change under its own
            // iterator.
            let mut doomed: Vec<Doomed> = Vec::new();
            let range =
                records.records_in((std::ops::Bound::Included((partition, crawl, 0)), end))?;
            for ((_, _, hash), value) in range {
                let entries = entries_of(crawl_name, "(a URL being deleted)", &value)?;
                let names = names.read();
                let mut kept = Vec::new();
                let mut gone = Vec::new();
                for entry in &entries {
                    let goes = only_queue.is_none_or(|q| q == entry.queue)
                        && deletion
                            .created_before
                            .is_none_or(|before| entry.created_at < before);
                    if goes {
                        let queue_key = names.queue_key(entry.queue, "a URL being deleted")?;
                        gone.push((entry.queue, queue_key.to_owned(), entry.due_at));
                    } else {
                        kept.extend_from_slice(entry.raw);
                    }
                }
                if !gone.is_empty() {
                    doomed.push(Doomed { hash, kept, gone });
                }
            }
            for Doomed { hash, kept, gone } in doomed {
                let key = (partition, crawl, hash);
                let kept_entries = if kept.is_empty() {
                    records.remove(key)?;
                    Vec::new()
                } else {
                    records.insert(key, kept.clone())?;
                    entries_of(crawl_name, "(a URL kept)", &kept)?
                };
                for (queue, queue_key, due_at) in gone {
                    removed.urls += 1;
                    *removed.per_partition.entry(partition).or_default() += 1;
                    let per_queue = removed.per_queue.entry(queue_key).or_default();
                    per_queue.urls += 1;
                    per_queue.completed += u64::from(due_at == 0);
                    if due_at != 0 && !still_due(&kept_entries, None, queue, due_at) {
                        changes.push(MainFileChange::Remove {
                            queue,
                            due_at,
                            hash,
                        });
                    }
                }
            }
        }
        Ok(removed)
    }
}
