//! The scheduler's part of politeness groups (the groups module): a
//! queue's group named on first use, filed anew where its host was found,
//! the queues a group turned away woken, a block passed to the group.

use std::sync::{Arc, PoisonError};

use super::Scheduler;
use super::groups::Group;
use super::queue::{Queue, QueueState};
use crate::time::Timestamp;

impl Scheduler {
    /// The queue's group, named on first use; `None`: alone.
    pub(super) fn group_of(&self, queue: &Queue, state: &mut QueueState) -> Option<Arc<Group>> {
        if !state.group_known {
            state.group_known = true;
            state.group = self
                .politeness
                .initial_group(&queue.key)
                .map(|name| self.group_named(&queue.crawl, name));
        }
        state.group.clone()
    }

    pub(super) fn group_named(&self, crawl: &str, name: String) -> Arc<Group> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = groups.entry((crawl.to_owned(), name.clone()));
        Arc::clone(entry.or_insert_with(|| Arc::new(Group::new(name))))
    }

    /// Files the queue under group `name` (its host answered from an
    /// address): the queues its old group turned away, to wake. A queue
    /// held now holds its new group too, as its fetches go on there.
    pub(super) fn regroup(&self, queue: &Queue, state: &mut QueueState, name: &str) -> Vec<String> {
        state.group_known = true;
        if state.group.as_ref().is_some_and(|group| group.name == name) {
            return Vec::new();
        }
        let woken = state
            .group
            .take()
            .map(|old| {
                let mut old_state = old.lock();
                self.give_turn_back(&queue.crawl, &old, &mut old_state, &queue.key);
                old_state.leave(&queue.key)
            })
            .unwrap_or_default();
        let group = self.group_named(&queue.crawl, name.to_owned());
        if state.held
            && let Some(until) = state.leased.values().map(|lease| lease.until).max()
        {
            self.carry_hold(queue, &group, until);
        }
        state.group = Some(group);
        woken
    }

    /// Looks again at queues a group turned away, once no lock is held.
    pub(super) fn wake_turned_away(&self, crawl: &str, keys: &[String]) {
        for key in keys {
            self.wake_at_gate(crawl, key, Timestamp::EPOCH);
        }
    }

    /// Blocks the queue's group with it (a Retry-After on one of its
    /// hosts holds the server's other hosts too).
    pub(super) fn block_group(&self, crawl: &str, key: &str, until: u64) {
        if until == 0 {
            return;
        }
        if let Some(queue) = self.queue(crawl, key) {
            let mut state = queue.lock();
            if let Some(group) = self.group_of(&queue, &mut state) {
                let end = super::block_end(until);
                group.lock().block(end);
                self.block_at_keeper(crawl, &group, end);
            }
        }
    }
}
