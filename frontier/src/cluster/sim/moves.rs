//! The simulated nodes' part in moves (`moves::run`, `moves::receive_step`):
//! duties for a move in a node's view, and a receiver's task cut where the
//! real one awaits: copy (whole, or from the leader's notes), cutover,
//! seal and the flips of every move sealed.

use std::collections::BTreeSet;

use super::super::map::{MoveKind, MovePhase, MoveRecord, PartitionMap};
use super::super::protocol::{self, Duty};
use super::{Receiving, Sim};

impl Sim {
    /// A node's turn of `moves::run` for one move of its view.
    pub(super) fn duty(&mut self, id: &str, partition: u32) {
        let now_ms = self.now_ms;
        let node = self.node(id);
        let Some((record, revision)) = node.view.moves.get(&partition).cloned() else {
            return;
        };
        match protocol::duty(&record, id, now_ms) {
            Some(Duty::Receive) => {
                node.receiving.entry(partition).or_insert(Receiving::Start);
            }
            Some(Duty::HandOver) => {
                let receipts = protocol::Receipts {
                    running: BTreeSet::new(),
                    ended_at: node.ended_at.clone(),
                };
                if !protocol::view_current_for(&node.view, partition, &node.sealed, &receipts) {
                    return;
                }
                let keeps = node
                    .view
                    .map
                    .as_ref()
                    .is_some_and(|map| map.holds(id, partition));
                if !keeps {
                    node.drop_partition(partition);
                }
                node.noted.remove(&partition);
                node.sealed.remove(&partition);
                self.disks_shrank = true;
                let txn =
                    protocol::update_move(&self.keys, revision, &protocol::handed_over(&record));
                let _ = self.store.apply(txn);
                self.note(format!("{id} handed over {partition}"));
            }
            Some(Duty::Finish) => {
                let txn = protocol::end_move(&self.keys, partition, revision);
                if self.store.apply(txn).is_ok_and(|answer| answer.succeeded) {
                    self.note(format!("{id} finished the move of {partition}"));
                }
            }
            None => {}
        }
    }
    pub(super) fn read_move(&self, partition: u32) -> Option<(MoveRecord, i64)> {
        let key = self.keys.move_of(partition);
        self.store
            .snapshot(&key)
            .entries
            .into_iter()
            .find(|entry| entry.key == key)
            .map(|entry| {
                let record = serde_json::from_slice(&entry.value).expect("a move record");
                (record, entry.mod_revision)
            })
    }
    /// One step of a receiver's task (`moves::receive_step`, cut where the
    /// real one awaits).
    pub(super) fn receive(&mut self, id: &str, partition: u32) {
        let state = self.node(id).receiving.get(&partition).cloned();
        match state {
            None => {}
            Some(Receiving::Start) => {
                let read_at = self.store.revision();
                let Some((record, revision)) = self.read_move(partition) else {
                    return self.receive_ended(id, partition, read_at);
                };
                if protocol::duty(&record, id, self.now_ms) != Some(Duty::Receive) {
                    return self.receive_ended(id, partition, read_at);
                }
                let Some(owner) = self.nodes.get(&record.from).filter(|o| o.up) else {
                    return; // the owner is away: tried again later
                };
                let follows = self.nodes[id]
                    .view
                    .map
                    .as_ref()
                    .is_some_and(|map| map.follows(id, partition));
                match record.phase {
                    // An in-sync follower holds every write: straight to
                    // the cutover, its copy kept.
                    MovePhase::Copy if follows => {
                        self.node(id)
                            .receiving
                            .insert(partition, Receiving::Copied { revision, record });
                        self.note(format!("{id} follows {partition}: no copy"));
                    }
                    MovePhase::Copy => {
                        let leader_disk = owner.disk.get(&partition).cloned().unwrap_or_default();
                        // `seed_from_log`: a lagging copy that follows the
                        // leader takes what the leader noted it misses.
                        let noted = (record.kind == MoveKind::Replica
                            && self.nodes[id].followed.get(&partition) == Some(&record.from))
                        .then(|| owner.lags.get(&(partition, id.to_owned())).cloned())
                        .flatten();
                        self.node(&record.from).noted.insert(partition, Vec::new());
                        self.disks_shrank = true;
                        let node = self.node(id);
                        let how = match noted {
                            Some(noted) => {
                                node.disk
                                    .entry(partition)
                                    .or_default()
                                    .extend(noted.intersection(&leader_disk));
                                self.from_log += 1;
                                "from the leader's log"
                            }
                            None => {
                                node.drop_partition(partition);
                                node.disk.insert(partition, leader_disk);
                                self.copied_whole += 1;
                                "whole"
                            }
                        };
                        self.node(id)
                            .receiving
                            .insert(partition, Receiving::Copied { revision, record });
                        self.note(format!("{id} copied {partition} {how}"));
                    }
                    MovePhase::Cutover => self.seal(id, record, revision),
                    MovePhase::Flipped => self.receive_ended(id, partition, read_at),
                }
            }
            Some(Receiving::Copied { revision, record }) => {
                let cutover = protocol::to_cutover(&record, self.now_ms);
                let txn = protocol::update_move(&self.keys, revision, &cutover);
                match self.store.apply(txn) {
                    Ok(answer) if answer.succeeded => {
                        self.note(format!("{id} cutover of {partition}"));
                        self.seal(id, cutover, answer.revision);
                    }
                    _ => self.restart_task(id, partition),
                }
            }
            Some(Receiving::Sealed { .. }) => self.flip_sealed(id),
        }
    }
    /// The flips of every move `id` has sealed, in one transaction
    /// (`moves::flip`, which gathers those ready when it gets its turn).
    pub(super) fn flip_sealed(&mut self, id: &str) {
        let ready: Vec<protocol::ReadyFlip> = self.nodes[id]
            .receiving
            .values()
            .filter_map(|task| match task {
                Receiving::Sealed { revision, record } => Some(protocol::ReadyFlip {
                    revision: *revision,
                    record: record.clone(),
                    leases: (0, 0),
                }),
                _ => None,
            })
            .collect();
        let map_entry = self
            .store
            .snapshot(&self.keys.map())
            .entries
            .into_iter()
            .find(|entry| entry.key == self.keys.map())
            .expect("a map exists once moves do");
        let map: PartitionMap = serde_json::from_slice(&map_entry.value).expect("a map");
        let (answers, written) = protocol::flip_all(
            &self.keys,
            &ready,
            (&map, map_entry.mod_revision),
            self.now_ms,
        );
        for (one, answer) in ready.iter().zip(&answers) {
            let partition = one.record.partition;
            if let Err(refused) = answer {
                let Ok(ended) =
                    self.store
                        .apply(protocol::end_move(&self.keys, partition, one.revision))
                else {
                    self.restart_task(id, partition);
                    continue;
                };
                self.note(format!("{id} rolled back {partition}: {refused}"));
                self.receive_ended(id, partition, ended.revision);
            }
        }
        let Some((next, txn)) = written else {
            return;
        };
        let flipping = ready
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_ok())
            .map(|(one, _)| one);
        match self.store.apply(txn) {
            Ok(answer) if answer.succeeded => {
                for one in flipping {
                    let partition = one.record.partition;
                    if one.record.kind == MoveKind::Replica {
                        self.node(id)
                            .followed
                            .insert(partition, one.record.from.clone());
                    }
                    self.note(format!("{id} flipped {partition} (epoch {})", next.epoch));
                    self.receive_ended(id, partition, answer.revision);
                }
            }
            _ => {
                for one in flipping {
                    self.restart_task(id, one.record.partition);
                }
            }
        }
    }
    /// The cutover's seal at the owner (`moves::seal`), and the tail taken.
    pub(super) fn seal(&mut self, id: &str, record: MoveRecord, revision: i64) {
        let partition = record.partition;
        let from = record.from.clone();
        if !self.nodes.get(&from).is_some_and(|owner| owner.up) {
            return self.restart_task(id, partition);
        }
        let current = self.read_move(partition).map(|(record, _)| record);
        if !protocol::may_seal(current.as_ref(), &from) {
            return self.restart_task(id, partition);
        }
        let sealed_at = self.store.revision();
        let owner = self.node(&from);
        owner.sealed.entry(partition).or_insert(sealed_at);
        let tail = owner.noted.get(&partition).cloned();
        let whole = owner.disk.get(&partition).cloned().unwrap_or_default();
        self.disks_shrank = true;
        let node = self.node(id);
        let follows = node
            .view
            .map
            .as_ref()
            .is_some_and(|map| map.follows(id, partition));
        let disk = node.disk.entry(partition).or_default();
        match tail {
            _ if follows => {}
            Some(tail) => disk.extend(tail),
            // The owner restarted since the copy: the whole partition again.
            None => *disk = whole,
        }
        node.receiving
            .insert(partition, Receiving::Sealed { revision, record });
        self.note(format!("{id} sealed {partition} at {from}"));
    }
    pub(super) fn restart_task(&mut self, id: &str, partition: u32) {
        self.node(id).receiving.insert(partition, Receiving::Start);
    }
    pub(super) fn receive_ended(&mut self, id: &str, partition: u32, revision: i64) {
        let node = self.node(id);
        node.receiving.remove(&partition);
        let at = node.ended_at.entry(partition).or_insert(revision);
        *at = (*at).max(revision);
        let view = node.view.clone();
        self.settle(id, view);
    }
}
