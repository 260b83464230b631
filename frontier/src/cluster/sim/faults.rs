//! The faults the simulation injects: nodes stopped, leases ended, disks
//! lost, drains, and restarts.

use super::super::coordination::{Txn, TxnFault, Write};
use super::{PARTITIONS, Sim};

impl Sim {
    /// A node stops: its memory goes, its disk and its registration stay
    /// (until the lease ends).
    pub(super) fn stop(&mut self, id: &str) {
        let node = self.node(id);
        node.up = false;
        node.forget_memory();
        node.pending = None;
        self.note(format!("{id} stops"));
    }
    /// A stopped node's disk is lost, if every partition it holds has
    /// another copy that is not lost: losing one disk of several copies
    /// loses nothing acknowledged.
    pub(super) fn wipe(&mut self) {
        let Some(map) = self.stored_map() else {
            return;
        };
        let down: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| !node.up && !node.wiped)
            .map(|(id, _)| id.clone())
            .collect();
        for id in down {
            let safe = (0..PARTITIONS).all(|p| {
                !map.holds(&id, p)
                    || map
                        .owners
                        .iter()
                        .skip(p as usize)
                        .take(1)
                        .chain(map.followers_of(p))
                        .any(|other| *other != id && !self.nodes[other].wiped)
            });
            if safe {
                let node = self.node(&id);
                node.disk.clear();
                node.followed.clear();
                node.wiped = true;
                self.disks_shrank = true;
                self.note(format!("{id}'s disk is lost"));
                return;
            }
        }
    }
    pub(super) fn expire(&mut self, id: &str) {
        if let Some(lease) = self.node(id).lease.take() {
            self.store.expire(lease);
            self.note(format!("{id}'s lease ends"));
        }
    }
    pub(super) fn drain_one(&mut self) {
        let view = &self.nodes[&self.up_nodes()[0]].view;
        let staying = view
            .members
            .keys()
            .filter(|id| !view.draining.contains(*id))
            .count();
        if staying < 3 {
            return;
        }
        let id = view.members.keys().next().cloned().unwrap_or_default();
        let _ = self.store.apply(Txn::writes(vec![Write::put(
            self.keys.draining(&id),
            b"{}".to_vec(),
        )]));
        self.note(format!("{id} drains"));
    }
    pub(super) fn fault(&mut self, id: &str) {
        match self.rng.below(if self.replicas > 1 { 7 } else { 6 }) {
            6 => self.wipe(),
            0 => self.stop(id),
            1 => {
                let down: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|(_, node)| !node.up && node.lease.is_some())
                    .map(|(id, _)| id.clone())
                    .collect();
                if let Some(id) = down.first() {
                    self.expire(id);
                }
            }
            2 => self.revive(),
            3 => {
                let moves = self
                    .store
                    .snapshot(&format!("{}moves/", self.keys.prefix()));
                if !moves.entries.is_empty() {
                    let key = moves.entries[self.rng.below(moves.entries.len())]
                        .key
                        .clone();
                    self.store.touch(&key);
                    self.note(format!("{key} touched"));
                }
            }
            4 => self.store.fail_next_txn(TxnFault::Lost),
            _ => self.store.fail_next_txn(TxnFault::AnswerLost),
        }
    }
    /// Restarts the stopped nodes whose registration has lapsed.
    pub(super) fn revive(&mut self) {
        let down: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| !node.up)
            .map(|(id, _)| id.clone())
            .collect();
        for id in down {
            self.expire(&id);
            self.start(&id);
        }
    }
}
