//! Queue count changes held in memory between checkpoints.
//!
//! Every stored URL changes its queue's counts. Written per group, that was
//! a third B-tree update per URL on the committer thread (URLs of thousands
//! of hosts touch thousands of queue records a group). The changes are
//! summed here instead and written to the `queues` table by the next
//! durable commit, which is also the only commit a crash keeps: after a
//! kill, redb holds the counts of its last checkpoint and the log replay
//! sums the later groups' changes again, so counts and URLs still agree.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;

use super::QueueRecord;

/// A change to one queue's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CountDelta {
    /// URLs the queue holds.
    pub(crate) urls: i64,
    /// Of those, completed ones.
    pub(crate) completed: i64,
}

impl CountDelta {
    pub(crate) fn is_zero(self) -> bool {
        self.urls == 0 && self.completed == 0
    }
}

impl std::ops::AddAssign for CountDelta {
    fn add_assign(&mut self, other: Self) {
        self.urls += other.urls;
        self.completed += other.completed;
    }
}

/// Count changes per crawl, then queue: nested so that a change to a queue
/// already held is found without allocating its key. Queue keys are
/// shared with the store's names (module `names`): a group changes the
/// counts of about as many queues as it has URLs, and a copy of each key
/// per group was an allocation a URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueueCounts {
    changes: HashMap<String, HashMap<Arc<str>, CountDelta>>,
}

/// What one group did to queue counts, in the order it matters: queues it
/// removed (a crawl's, when no queue is named), then its changes, which
/// already leave out what came before each removal inside the group.
#[derive(Debug, Default)]
pub(crate) struct GroupCounts {
    pub(crate) removed: Vec<(String, Option<String>)>,
    pub(crate) changes: QueueCounts,
}

impl QueueCounts {
    /// Adds a change to a queue's counts.
    pub(crate) fn add(&mut self, crawl: &str, queue: &Arc<str>, delta: CountDelta) {
        if delta.is_zero() {
            return;
        }
        let queues = match self.changes.get_mut(crawl) {
            Some(queues) => queues,
            None => self.changes.entry(crawl.to_owned()).or_default(),
        };
        let entry = match queues.get_mut(&**queue) {
            Some(entry) => entry,
            None => queues.entry(Arc::clone(queue)).or_default(),
        };
        *entry += delta;
    }

    /// Takes a later group's changes in: its removals drop what is held for
    /// those queues (their records go with them), then its changes add up.
    pub(crate) fn absorb(&mut self, group: GroupCounts) {
        for (crawl, queue) in &group.removed {
            match queue {
                Some(queue) => {
                    if let Some(queues) = self.changes.get_mut(crawl) {
                        queues.remove(queue.as_str());
                    }
                }
                None => {
                    self.changes.remove(crawl);
                }
            }
        }
        for (crawl, queues) in group.changes.changes {
            match self.changes.get_mut(&crawl) {
                Some(held) => {
                    for (queue, delta) in queues {
                        *held.entry(queue).or_default() += delta;
                    }
                }
                None => {
                    self.changes.insert(crawl, queues);
                }
            }
        }
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Every held change, as (crawl, queue, change).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str, CountDelta)> {
        self.changes.iter().flat_map(|(crawl, queues)| {
            queues
                .iter()
                .filter(|(_, delta)| !delta.is_zero())
                .map(|(queue, delta)| (crawl.as_str(), &**queue, *delta))
        })
    }

    /// Applies the held changes to records read from the store (a queue
    /// with no record yet starts from the default one).
    pub(crate) fn apply_to(&self, records: &mut BTreeMap<(String, String), QueueRecord>) {
        for (crawl, queue, delta) in self.iter() {
            let record = records
                .entry((crawl.to_owned(), queue.to_owned()))
                .or_default();
            apply(record, delta);
        }
    }
}

/// Adds count changes to a record; counts never go below zero.
pub(crate) fn apply(record: &mut QueueRecord, delta: CountDelta) {
    record.urls = record.urls.saturating_add_signed(delta.urls);
    record.completed = record.completed.saturating_add_signed(delta.completed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(removed: &[(&str, Option<&str>)], changes: &[(&str, &str, i64, i64)]) -> GroupCounts {
        let mut counts = QueueCounts::default();
        for &(crawl, queue, urls, completed) in changes {
            counts.add(crawl, &Arc::from(queue), delta(urls, completed));
        }
        GroupCounts {
            removed: removed
                .iter()
                .map(|(crawl, queue)| ((*crawl).to_owned(), queue.map(str::to_owned)))
                .collect(),
            changes: counts,
        }
    }

    fn delta(urls: i64, completed: i64) -> CountDelta {
        CountDelta { urls, completed }
    }

    fn held(counts: &QueueCounts) -> Vec<(String, String, i64, i64)> {
        let mut out: Vec<_> = counts
            .iter()
            .map(|(c, q, d)| (c.to_owned(), q.to_owned(), d.urls, d.completed))
            .collect();
        out.sort();
        out
    }

    #[derive(Debug, Clone)]
    enum Event {
        Add(&'static str, &'static str, i64, i64),
        Remove(&'static str, Option<&'static str>),
    }

    fn event() -> impl proptest::strategy::Strategy<Value = Event> {
        use proptest::prelude::*;
        let crawl = prop::sample::select(vec!["c", "d"]);
        let queue = prop::sample::select(vec!["a", "b", "e"]);
        prop_oneof![
            4 => (crawl.clone(), queue.clone(), -2_i64..4, -1_i64..2)
                .prop_map(|(c, q, u, d)| Event::Add(c, q, u, d)),
            1 => (crawl, prop::option::of(queue)).prop_map(|(c, q)| Event::Remove(c, q)),
        ]
    }

    /// What a group hands over, built as `Store::apply_in` builds it: its
    /// own changes before a removal are dropped there, and the removal is
    /// recorded for what earlier groups left held.
    fn as_group(events: &[Event]) -> GroupCounts {
        let mut local: BTreeMap<(&str, &str), (i64, i64)> = BTreeMap::new();
        let mut removed = Vec::new();
        for event in events {
            match *event {
                Event::Add(crawl, queue, urls, completed) => {
                    let entry = local.entry((crawl, queue)).or_default();
                    entry.0 += urls;
                    entry.1 += completed;
                }
                Event::Remove(crawl, queue) => {
                    local.retain(|(c, q), _| *c != crawl || queue.is_some_and(|n| n != *q));
                    removed.push((crawl.to_owned(), queue.map(str::to_owned)));
                }
            }
        }
        let mut changes = QueueCounts::default();
        for ((crawl, queue), (urls, completed)) in local {
            changes.add(crawl, &Arc::from(queue), delta(urls, completed));
        }
        GroupCounts { removed, changes }
    }

    proptest::proptest! {
        /// However events are cut into groups, what is held equals the
        /// events applied one by one.
        #[test]
        fn grouped_counts_equal_the_events_in_order(
            events in proptest::collection::vec(event(), 0..40),
            cuts in proptest::collection::vec(0_usize..40, 0..6),
        ) {
            let mut model: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
            for event in &events {
                match *event {
                    Event::Add(crawl, queue, urls, completed) => {
                        let entry = model.entry((crawl.into(), queue.into())).or_default();
                        entry.0 += urls;
                        entry.1 += completed;
                    }
                    Event::Remove(crawl, queue) => model.retain(|(c, q), _| {
                        c != crawl || queue.is_some_and(|n| n != q)
                    }),
                }
            }
            model.retain(|_, (urls, completed)| *urls != 0 || *completed != 0);
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(events.len())).collect();
            bounds.extend([0, events.len()]);
            bounds.sort_unstable();
            let mut held = QueueCounts::default();
            for window in bounds.windows(2) {
                held.absorb(as_group(&events[window[0]..window[1]]));
            }
            let held: BTreeMap<(String, String), (i64, i64)> = held
                .iter()
                .map(|(c, q, d)| ((c.to_owned(), q.to_owned()), (d.urls, d.completed)))
                .collect();
            proptest::prop_assert_eq!(held, model);
        }
    }

    #[test]
    fn groups_add_up_per_queue() {
        let mut counts = QueueCounts::default();
        counts.absorb(group(&[], &[("c", "a", 2, 0), ("c", "b", 1, 0)]));
        counts.absorb(group(&[], &[("c", "a", -1, 1), ("d", "a", 5, 0)]));
        assert_eq!(
            held(&counts),
            [
                ("c".into(), "a".into(), 1, 1),
                ("c".into(), "b".into(), 1, 0),
                ("d".into(), "a".into(), 5, 0)
            ]
        );
    }

    #[test]
    fn a_removed_queue_keeps_only_what_came_after() {
        let mut counts = QueueCounts::default();
        counts.absorb(group(
            &[],
            &[("c", "a", 3, 0), ("c", "b", 4, 0), ("d", "a", 1, 0)],
        ));
        // Queue a of crawl c removed, then one URL stored in it again.
        counts.absorb(group(&[("c", Some("a"))], &[("c", "a", 1, 0)]));
        assert_eq!(
            held(&counts),
            [
                ("c".into(), "a".into(), 1, 0),
                ("c".into(), "b".into(), 4, 0),
                ("d".into(), "a".into(), 1, 0)
            ]
        );
        // The whole crawl c removed: crawl d keeps its counts.
        counts.absorb(group(&[("c", None)], &[]));
        assert_eq!(held(&counts), [("d".into(), "a".into(), 1, 0)]);
    }

    #[test]
    fn changes_that_cancel_out_are_not_written() {
        let mut counts = QueueCounts::default();
        counts.absorb(group(&[], &[("c", "a", 1, 0)]));
        counts.absorb(group(&[], &[("c", "a", -1, 0)]));
        assert_eq!(counts.iter().count(), 0);
    }

    #[test]
    fn records_never_count_below_zero() {
        let mut records = BTreeMap::new();
        records.insert(
            ("c".to_owned(), "a".to_owned()),
            QueueRecord {
                urls: 1,
                ..QueueRecord::default()
            },
        );
        let mut counts = QueueCounts::default();
        counts.add("c", &Arc::from("a"), delta(-3, -1));
        counts.add("c", &Arc::from("new"), delta(2, 1));
        counts.apply_to(&mut records);
        assert_eq!(records[&("c".to_owned(), "a".to_owned())].urls, 0);
        assert_eq!(records[&("c".to_owned(), "a".to_owned())].completed, 0);
        let new = records[&("c".to_owned(), "new".to_owned())];
        assert_eq!((new.urls, new.completed), (2, 1));
    }
}
