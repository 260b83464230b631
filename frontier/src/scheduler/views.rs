//! Read-only views of the queues for the dashboard: the busiest queues of
//! a crawl, chosen without sorting them all.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Scheduler;
use crate::time::Timestamp;

/// One queue as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueView {
    /// The queue's key (its host, by default).
    pub key: String,
    /// URLs not completed and not leased now.
    pub waiting: u64,
    /// URLs leased now.
    pub in_flight: u64,
    /// URLs completed.
    pub completed: u64,
    /// Milliseconds between serves (its own, or the crawl's default).
    pub delay_ms: u64,
    /// Served from again at this UTC epoch second; 0: not blocked.
    pub blocked_until: u64,
    /// Not served once this many are completed; 0: no limit.
    pub crawl_limit: u32,
}

impl Scheduler {
    /// The `count` queues of a crawl with the most URLs waiting (ties: the
    /// most in flight, then by key), most first. A bounded heap keeps this
    /// at one pass over the queues, however many there are.
    #[must_use]
    pub fn busiest_queues(&self, crawl: &str, count: usize, now: Timestamp) -> Vec<QueueView> {
        if count == 0 {
            return Vec::new();
        }
        let mut kept: BinaryHeap<Reverse<(u64, u64, Reverse<String>)>> = BinaryHeap::new();
        let queues = self.queues_of(crawl);
        let mut views = std::collections::HashMap::new();
        for queue in &queues {
            let state = queue.lock();
            let in_flight = state.leased_now(now);
            let waiting = state
                .record
                .urls
                .saturating_sub(state.record.completed)
                .saturating_sub(in_flight);
            if waiting == 0 && in_flight == 0 {
                continue;
            }
            let rank = (waiting, in_flight, Reverse(queue.key.clone()));
            if kept.len() < count {
                kept.push(Reverse(rank));
            } else if kept.peek().is_some_and(|Reverse(least)| rank > *least) {
                if let Some(Reverse((_, _, Reverse(dropped)))) = kept.pop() {
                    views.remove(&dropped);
                }
                kept.push(Reverse(rank));
            } else {
                continue;
            }
            let delay = self.delay_of(crawl, &state.record);
            views.insert(
                queue.key.clone(),
                QueueView {
                    key: queue.key.clone(),
                    waiting,
                    in_flight,
                    completed: state.record.completed,
                    delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    blocked_until: state.record.blocked_until,
                    crawl_limit: state.record.crawl_limit,
                },
            );
        }
        let mut ranked: Vec<_> = kept.into_iter().map(|Reverse(rank)| rank).collect();
        ranked.sort_by(|a, b| b.cmp(a));
        ranked
            .into_iter()
            .filter_map(|(_, _, Reverse(key))| views.remove(&key))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::scheduler::Scheduler;
    use crate::store::{NewUrl, Store, WriteOp};
    use crate::time::Timestamp;

    #[test]
    fn the_busiest_queues_come_first_and_idle_ones_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let scheduler = Scheduler::load(Arc::clone(&store), Duration::from_millis(250)).unwrap();
        let mut ops = Vec::new();
        for (host, urls) in [("a", 3), ("b", 7), ("c", 1), ("d", 5)] {
            for i in 0..urls {
                ops.push(WriteOp::Discover(NewUrl {
                    crawl: "c".into(),
                    url: format!("http://{host}/{i}"),
                    partition: 0,
                    maybe_known: false,
                    record: crate::record::UrlRecord {
                        due_at: 1,
                        queue_key: host.into(),
                        ..crate::record::UrlRecord::default()
                    },
                }));
            }
        }
        let applied = store.apply(&ops).unwrap();
        scheduler.on_commit(&ops, &applied);
        let top = scheduler.busiest_queues("c", 3, Timestamp::from_unix_secs(10));
        let keys: Vec<&str> = top.iter().map(|q| q.key.as_str()).collect();
        assert_eq!(keys, ["b", "d", "a"]);
        assert_eq!(top[0].waiting, 7);
        assert_eq!(top[0].delay_ms, 250);
        assert!(
            scheduler
                .busiest_queues("c", 0, Timestamp::from_unix_secs(10))
                .is_empty()
        );
        assert!(
            scheduler
                .busiest_queues("none", 3, Timestamp::from_unix_secs(10))
                .is_empty()
        );
    }
}
