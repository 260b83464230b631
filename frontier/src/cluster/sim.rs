//! Seeded simulation of the cluster's protocol: nodes, clients and faults
//! interleaved step by step over the in-memory coordination store, every
//! decision taken by the same `protocol` functions the nodes run, and the
//! invariants checked after every step.
//!
//! A node here is what the protocol sees of one: its view (read from the
//! store when a step delivers it, so views lag and arrive twice as a
//! watch's would), the URLs on its disk per partition, and what it keeps
//! in memory and loses when it stops (seals, the writes noted since a copy
//! began, the moves it is receiving). A step is one of: a client's write
//! entering at a node, a view delivered, the leader's turn, a node's duty
//! for a move, one step of a receiver's task, or a fault (a node stops, its
//! lease ends, it restarts, a compare-and-swap loses to a concurrent
//! write, a transaction's call or answer is lost).
//!
//! With copies, a leader notes per follower the URLs it has not taken,
//! and per follower taken out of the in-sync set (lagging) the URLs
//! written since (`ReplicaLog`'s lags, lost when the leader stops); a
//! follower's disk records which leader its copy follows (kept on disk,
//! gone with a drop of the partition). A lagging copy made a copy again
//! takes only those URLs when both agree, else the whole partition.
//!
//! Checked after every step: every acknowledged URL is on the disk of the
//! node the stored map gives its partition; no two nodes acknowledge a
//! write to one partition under one epoch. Checked at the end, once the
//! faults stop and every node is back: every move has ended or rolled
//! back, and the map is balanced over the nodes.
//!
//! `SIM_SEEDS=N` runs N seeds (default in the test below); `SIM_SEED=S`
//! runs seed S alone and prints its steps.

use std::collections::{BTreeMap, BTreeSet};

use super::View;
use super::coordination::{Condition, LeaseId, MemCoordination, Txn, TxnFault, Write};
use super::map::{Member, MoveKind, MovePhase, MoveRecord, PartitionMap};
use super::protocol::{self, Duty, Keys};

const PARTITIONS: u32 = 8;
const STEPS: usize = 400;
const HEAL_STEPS: usize = 4000;

/// SplitMix64: small, seedable, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Where a receiver's task for one move is (lost when its node stops).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Receiving {
    /// Reads the move next.
    Start,
    /// Copied the owner's URLs; writes the cutover next.
    Copied { revision: i64, record: MoveRecord },
    /// Sealed the owner and took its tail; flips next.
    Sealed { revision: i64, record: MoveRecord },
}

#[derive(Debug, Default)]
struct Node {
    up: bool,
    lease: Option<LeaseId>,
    view: View,
    /// A view read but not applied yet (a refresh under way).
    pending: Option<View>,
    /// Durable: the URLs of each partition.
    disk: BTreeMap<u32, BTreeSet<u64>>,
    /// In memory: sealed partitions and the revision each seal was read at.
    sealed: BTreeMap<u32, i64>,
    /// In memory: per partition copied from here, the writes since the copy
    /// began (the tracking CopyPartition starts).
    noted: BTreeMap<u32, Vec<u64>>,
    /// In memory: the moves received here and where each task is.
    receiving: BTreeMap<u32, Receiving>,
    /// In memory: where ended receive tasks ended (`Receipts::ended_at`).
    ended_at: BTreeMap<u32, i64>,
    /// In memory: partitions taken over, and the followers not yet sent
    /// again what this node took as a follower (`ReplicaLog::owe_again`).
    owed_again: BTreeMap<u32, BTreeSet<String>>,
    /// Its disk was lost while it was stopped: it joins again as a node
    /// holding nothing (`forget_lost_copies`).
    wiped: bool,
    /// Durable: per partition, the leader this node's copy follows
    /// (`Ingest::note_followed`).
    followed: BTreeMap<u32, String>,
    /// In memory, as a leader: per (partition, follower), the URLs written
    /// here the follower has not taken (its owed steps).
    owed: BTreeMap<(u32, String), BTreeSet<u64>>,
    /// In memory, as a leader: per (partition, lagging follower), the URLs
    /// written since it last took one (`ReplicaLog::lag`).
    lags: BTreeMap<(u32, String), BTreeSet<u64>>,
    /// In memory: the followers of each partition led here as last
    /// settled (`ReplicaLog`'s, empty after a start).
    sending_to: BTreeMap<u32, Vec<String>>,
}

impl Node {
    /// A partition's copy here is dropped, and with it its mark.
    fn drop_partition(&mut self, partition: u32) {
        self.disk.remove(&partition);
        self.followed.remove(&partition);
    }
}

struct Sim {
    rng: Rng,
    store: MemCoordination,
    keys: Keys,
    nodes: BTreeMap<String, Node>,
    /// Every URL acknowledged, by partition.
    acked: BTreeMap<u32, BTreeSet<u64>>,
    /// Who acknowledged writes to a partition under an epoch.
    writers: BTreeMap<(u32, u64), String>,
    next_url: u64,
    now_ms: u64,
    faults: bool,
    /// Set when a step removed URLs from a disk; the revision last checked.
    disks_shrank: bool,
    checked_at: i64,
    /// The stored map, parsed once per revision.
    map_cache: std::cell::RefCell<Option<(i64, Option<PartitionMap>)>>,
    log: Vec<String>,
    verbose: bool,
    /// Copies of each partition (`--replicas`), and copies a write needs.
    replicas: u32,
    min_in_sync: usize,
    /// New copies brought up to date from their leader's lag, and copied
    /// whole.
    from_log: usize,
    copied_whole: usize,
}

impl Sim {
    fn new(seed: u64, verbose: bool, (replicas, min_in_sync): (u32, u32)) -> Self {
        let mut sim = Self {
            rng: Rng(seed),
            store: MemCoordination::new(),
            keys: Keys::new("sim"),
            nodes: BTreeMap::new(),
            acked: BTreeMap::new(),
            writers: BTreeMap::new(),
            next_url: 0,
            now_ms: 1_000,
            faults: true,
            disks_shrank: false,
            checked_at: -1,
            map_cache: std::cell::RefCell::new(None),
            log: Vec::new(),
            verbose,
            replicas,
            min_in_sync: min_in_sync as usize,
            from_log: 0,
            copied_whole: 0,
        };
        for id in ["n1", "n2"] {
            sim.nodes.insert(id.to_owned(), Node::default());
            sim.start(id);
        }
        sim
    }

    fn note(&mut self, line: String) {
        if self.verbose {
            eprintln!("{line}");
        }
        self.log.push(line);
        if self.log.len() > 60 {
            self.log.remove(0);
        }
    }

    /// A node starts (or restarts on its disk): registers under a new
    /// lease, campaigns, reads its view and settles it.
    fn start(&mut self, id: &str) {
        if self.nodes[id].wiped {
            let view = self.read_view();
            if let Some((_, lost, txn)) = protocol::without_node(&view, &self.keys, id) {
                assert!(lost.is_empty(), "a wiped node held a last copy: {lost:?}");
                if !self.store.apply(txn).is_ok_and(|answer| answer.succeeded) {
                    return; // tried again at the next start
                }
            }
            self.node(id).wiped = false;
            self.note(format!("{id}'s copies forgotten"));
        }
        let lease = self.store.grant();
        let member = Member {
            id: id.to_owned(),
            address: format!("{id}:7071"),
            started_at_ms: self.now_ms,
        };
        let registered = self
            .store
            .apply(Txn {
                when: vec![Condition::Absent(self.keys.member(id))],
                then: vec![Write::Put {
                    key: self.keys.member(id),
                    value: protocol::json(&member),
                    lease: Some(lease),
                }],
                otherwise_get: None,
            })
            .is_ok_and(|answer| answer.succeeded);
        if !registered {
            // Its previous registration lives on: it waits that out.
            self.store.expire(lease);
            return;
        }
        self.store.join_election(&self.keys.election(), id, lease);
        let node = self.node(id);
        node.up = true;
        node.lease = Some(lease);
        node.sealed.clear();
        node.noted.clear();
        node.receiving.clear();
        node.ended_at.clear();
        node.owed_again.clear();
        node.owed.clear();
        node.lags.clear();
        node.sending_to.clear();
        self.deliver(id);
        self.note(format!("{id} starts"));
    }

    fn node(&mut self, id: &str) -> &mut Node {
        self.nodes.get_mut(id).expect("a simulated node")
    }

    fn up_nodes(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, node)| node.up)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The node reads the store and settles the view (`refresh`).
    fn deliver(&mut self, id: &str) {
        let view = self.read_view();
        self.settle(id, view);
    }

    fn read_view(&self) -> View {
        let snapshot = self.store.snapshot(self.keys.prefix());
        let leader = self.store.leader_now(&self.keys.election());
        let (view, unreadable) = protocol::read_view(&self.keys, &snapshot, leader);
        assert!(unreadable.is_empty(), "unreadable keys: {unreadable:?}");
        view
    }

    /// A refresh cut in two: the read now, the settling at a later step,
    /// while other steps (a seal) come between.
    fn refresh_in_two(&mut self, id: &str) {
        match self.node(id).pending.take() {
            // Refreshes run one after another: an older read is not applied
            // over a newer view.
            Some(view) if view.revision >= self.nodes[id].view.revision => {
                self.settle(id, view);
            }
            Some(_) => {}
            None => {
                let view = self.read_view();
                self.node(id).pending = Some(view);
            }
        }
    }

    /// `moves::settle`: seals, unseals and stray drops for a view.
    fn settle(&mut self, id: &str, view: View) {
        let node = self.node(id);
        if let Some(map) = &view.map {
            // `ReplicaLog::set_followers`: a follower of a partition led
            // here, taken out since, lags with what it was owed.
            for partition in map.owned_by(id).collect::<Vec<_>>() {
                for follower in map.lagging_of(partition) {
                    let key = (partition, follower.clone());
                    let followed_here = node
                        .sending_to
                        .get(&partition)
                        .is_some_and(|before| before.contains(follower));
                    if !node.lags.contains_key(&key) && followed_here {
                        let owed = node.owed.remove(&key).unwrap_or_default();
                        node.lags.insert(key, owed);
                    }
                }
            }
            node.lags.retain(|(p, follower), _| {
                map.owners[*p as usize] == id && map.lagging_of(*p).contains(follower)
            });
            node.owed.retain(|(p, follower), _| {
                map.owners[*p as usize] == id && map.follows(follower, *p)
            });
            node.sending_to = map
                .owned_by(id)
                .map(|p| (p, map.followers_of(p).to_vec()))
                .collect();
        }
        if let (Some(before), Some(map)) = (&node.view.map, &view.map) {
            for partition in map.owned_by(id).collect::<Vec<_>>() {
                if before.follows(id, partition) {
                    node.owed_again.insert(
                        partition,
                        map.followers_of(partition).iter().cloned().collect(),
                    );
                }
            }
        }
        let changes = protocol::seal_changes(&view, id, &node.sealed);
        for partition in &changes.opened {
            node.sealed.remove(partition);
        }
        for partition in changes.sealing {
            node.sealed.entry(partition).or_insert(view.revision);
        }
        let mut receipts = protocol::Receipts {
            running: node.receiving.keys().copied().collect(),
            ended_at: std::mem::take(&mut node.ended_at),
        };
        receipts.seen(view.revision);
        node.ended_at.clone_from(&receipts.ended_at);
        let (disk, followed) = (&node.disk, &node.followed);
        let strays = protocol::strays(
            &view,
            id,
            &receipts,
            |partition| disk.get(&partition).is_some_and(|urls| !urls.is_empty()),
            |partition| followed.get(&partition).cloned(),
        );
        for (partition, _) in &strays {
            node.drop_partition(*partition);
        }
        node.view = view;
        self.disks_shrank |= !strays.is_empty();
    }

    /// The leader's turn (`lead`): the first map, then the plan, from the
    /// leader's own view, which may lag.
    fn lead(&mut self) {
        let Some(leader) = self.store.leader_now(&self.keys.election()) else {
            return;
        };
        let Some(node) = self.nodes.get(&leader).filter(|node| node.up) else {
            return;
        };
        let view = node.view.clone();
        if let Some((_, txn)) =
            protocol::first_map(&view, &self.keys, (PARTITIONS, self.replicas), 2)
        {
            let _ = self.store.apply(txn);
        }
        if let Some((given, _, txn)) = protocol::failovers(&view, &self.keys) {
            if self.store.apply(txn).is_ok_and(|answer| answer.succeeded) {
                self.note(format!("{leader} failed over {given:?}"));
            }
            return;
        }
        let policy = protocol::CopyPolicy {
            replicas: self.replicas,
            min_in_sync: self.min_in_sync as u32,
            ..protocol::CopyPolicy::default()
        };
        let copies = protocol::plan_copies(&view, &self.keys, &policy, self.now_ms);
        let planned = copies
            .into_iter()
            .chain(protocol::plan(&view, &self.keys, self.now_ms))
            .collect();
        for (steps, txn) in protocol::together(planned) {
            if self.store.apply(txn).is_ok_and(|answer| answer.succeeded) {
                self.note(format!("{leader} planned {steps:?}"));
            }
        }
    }

    /// A node's turn of `moves::run` for one move of its view.
    fn duty(&mut self, id: &str, partition: u32) {
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

    fn read_move(&self, partition: u32) -> Option<(MoveRecord, i64)> {
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
    fn receive(&mut self, id: &str, partition: u32) {
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
    fn flip_sealed(&mut self, id: &str) {
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
    fn seal(&mut self, id: &str, record: MoveRecord, revision: i64) {
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

    fn restart_task(&mut self, id: &str, partition: u32) {
        self.node(id).receiving.insert(partition, Receiving::Start);
    }

    fn receive_ended(&mut self, id: &str, partition: u32, revision: i64) {
        let node = self.node(id);
        node.receiving.remove(&partition);
        let at = node.ended_at.entry(partition).or_insert(revision);
        *at = (*at).max(revision);
        let view = node.view.clone();
        self.settle(id, view);
    }

    /// A client's write entering at `id`: routed by its view to the owner,
    /// which takes it only under the same epoch, for a partition its own map
    /// gives it, and not sealed.
    fn write(&mut self, id: &str) {
        let partition = self.rng.below(PARTITIONS as usize) as u32;
        let entry = &self.nodes[id];
        let Some(map) = &entry.view.map else {
            return;
        };
        let epoch = map.epoch;
        let owner_id = map.owners[partition as usize].clone();
        let Some(owner) = self.nodes.get(&owner_id).filter(|owner| owner.up) else {
            return;
        };
        let Some(owner_map) = &owner.view.map else {
            return;
        };
        let forwarded = owner_id != id;
        if (forwarded && owner_map.epoch != epoch)
            || owner_map.owners[partition as usize] != owner_id
            || owner.sealed.contains_key(&partition)
        {
            return; // refused: the client tries again
        }
        if 1 + owner_map.followers_of(partition).len() < self.min_in_sync {
            return; // refused: too few copies in sync
        }
        let writing_epoch = owner_map.epoch;
        let owner_map = owner_map.clone();
        let owner_revision = owner.view.map_revision;
        let url = self.next_url;
        self.next_url += 1;
        let owner = self.node(&owner_id);
        owner.disk.entry(partition).or_default().insert(url);
        if let Some(noted) = owner.noted.get_mut(&partition) {
            noted.push(url);
        }
        for ((lagging_in, _), lag) in &mut owner.lags {
            if *lagging_in == partition {
                lag.insert(url);
            }
        }
        if !self.replicate(&owner_id, (&owner_map, owner_revision), partition, url) {
            return; // stored at the leader, not acknowledged
        }
        self.acked.entry(partition).or_default().insert(url);
        if self.verbose {
            self.note(format!(
                "{owner_id} acked {url} in {partition} (entered at {id})"
            ));
        }
        let writer = self
            .writers
            .entry((partition, writing_epoch))
            .or_insert_with(|| owner_id.clone());
        assert_eq!(
            *writer, owner_id,
            "two writers of partition {partition} in epoch {writing_epoch}"
        );
    }

    /// The leader sends a committed URL (and what it owes again after a
    /// takeover) to each follower its map names; a follower takes it only
    /// under its own epoch, from the leader its map names, for a partition
    /// it follows. Followers that are stopped are taken out of the in-sync
    /// set (`drop_followers`, as the sender does once its patience runs
    /// out) before the write may be acknowledged; answers whether it may.
    fn replicate(
        &mut self,
        leader: &str,
        (map, revision): (&PartitionMap, i64),
        partition: u32,
        url: u64,
    ) -> bool {
        let leader_disk = self.nodes[leader]
            .disk
            .get(&partition)
            .cloned()
            .unwrap_or_default();
        let owed_again = self.nodes[leader].owed_again.get(&partition).cloned();
        let mut refused = BTreeSet::new();
        for follower in map.followers_of(partition) {
            let takes = self.nodes.get(follower).is_some_and(|node| {
                node.up
                    && node.view.map.as_ref().is_some_and(|own| {
                        own.epoch == map.epoch
                            && own.owners[partition as usize] == leader
                            && own.follows(follower, partition)
                    })
            });
            let key = (partition, follower.clone());
            if !takes {
                // Owed to it, in the leader's memory, until it takes it.
                self.node(leader).owed.entry(key).or_default().insert(url);
                if self.nodes.get(follower).is_some_and(|node| node.up) {
                    // Up but of another epoch: the views converge well
                    // within the sender's patience; the write waits, here
                    // unacknowledged, and the client sends it again.
                    return false;
                }
                refused.insert(follower.clone());
                continue;
            }
            let owes = owed_again
                .as_ref()
                .is_some_and(|owed| owed.contains(follower));
            let owed = self.node(leader).owed.remove(&key).unwrap_or_default();
            let node = self.node(follower);
            node.followed.insert(partition, leader.to_owned());
            let disk = node.disk.entry(partition).or_default();
            disk.insert(url);
            disk.extend(owed);
            if owes {
                disk.extend(leader_disk.iter().copied());
            }
        }
        if let Some(owed) = self.node(leader).owed_again.get_mut(&partition) {
            owed.retain(|follower| refused.contains(follower));
        }
        if refused.is_empty() {
            return true;
        }
        let led: BTreeSet<u32> = map
            .owned_by(leader)
            .filter(|&p| refused.iter().any(|f| map.follows(f, p)))
            .collect();
        let Ok(Some((next, txn))) =
            protocol::drop_followers((map, revision), &self.keys, leader, &led, &refused)
        else {
            return false;
        };
        if !self.store.apply(txn).is_ok_and(|answer| answer.succeeded) {
            return false;
        }
        self.note(format!(
            "{leader} dropped followers {refused:?} (epoch {})",
            next.epoch
        ));
        // Acknowledged only with enough copies left.
        1 + next.followers_of(partition).len() >= self.min_in_sync
    }

    /// A node stops: its memory goes, its disk and its registration stay
    /// (until the lease ends).
    fn stop(&mut self, id: &str) {
        let node = self.node(id);
        node.up = false;
        node.sealed.clear();
        node.noted.clear();
        node.receiving.clear();
        node.ended_at.clear();
        node.owed_again.clear();
        node.owed.clear();
        node.lags.clear();
        node.sending_to.clear();
        node.pending = None;
        self.note(format!("{id} stops"));
    }

    /// A stopped node's disk is lost, if every partition it holds has
    /// another copy that is not lost: losing one disk of several copies
    /// loses nothing acknowledged.
    fn wipe(&mut self) {
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

    fn expire(&mut self, id: &str) {
        if let Some(lease) = self.node(id).lease.take() {
            self.store.expire(lease);
            self.note(format!("{id}'s lease ends"));
        }
    }

    fn stored_map(&self) -> Option<PartitionMap> {
        let revision = self.store.revision();
        if let Some((cached_at, map)) = &*self.map_cache.borrow()
            && *cached_at == revision
        {
            return map.clone();
        }
        let map = self.read_map();
        *self.map_cache.borrow_mut() = Some((revision, map.clone()));
        map
    }

    fn read_map(&self) -> Option<PartitionMap> {
        self.store
            .snapshot(&self.keys.map())
            .entries
            .into_iter()
            .find(|entry| entry.key == self.keys.map())
            .map(|entry| serde_json::from_slice(&entry.value).expect("a map"))
    }

    /// Every acknowledged URL is on its partition's owner's disk. Checked
    /// when a disk lost URLs or the store changed: a write adds its URL to
    /// the owner's disk and to the acknowledged at once.
    fn check(&mut self) {
        let revision = self.store.revision();
        if !std::mem::take(&mut self.disks_shrank) && revision == self.checked_at {
            return;
        }
        self.checked_at = revision;
        let Some(map) = self.stored_map() else {
            return;
        };
        for (partition, urls) in &self.acked {
            let owner = &map.owners[*partition as usize];
            let holders = std::iter::once(owner).chain(map.followers_of(*partition));
            for holder in holders.filter(|holder| !self.nodes[*holder].wiped) {
                let disk = self.nodes[holder].disk.get(partition);
                let lost: Vec<&u64> = urls
                    .iter()
                    .filter(|url| !disk.is_some_and(|disk| disk.contains(url)))
                    .collect();
                assert!(
                    lost.is_empty(),
                    "acknowledged URLs of partition {partition} missing at {holder}, \
                     {} (epoch {}): {lost:?}\nlast steps:\n{}",
                    if holder == owner {
                        "its leader"
                    } else {
                        "a follower in sync"
                    },
                    map.epoch,
                    self.log.join("\n")
                );
            }
        }
    }

    /// One step, chosen by the seed.
    fn step(&mut self) {
        self.now_ms += 10;
        let up = self.up_nodes();
        let pick = self.rng.below(100);
        if up.is_empty() {
            return self.revive();
        }
        let id = up[self.rng.below(up.len())].clone();
        match pick {
            0..=29 => self.write(&id),
            30..=39 => self.deliver(&id),
            40..=44 => self.refresh_in_two(&id),
            45..=54 => self.lead(),
            55..=64 => {
                let moves: Vec<u32> = self.nodes[&id].view.moves.keys().copied().collect();
                if !moves.is_empty() {
                    let partition = moves[self.rng.below(moves.len())];
                    self.duty(&id, partition);
                }
            }
            65..=84 => {
                let tasks: Vec<u32> = self.nodes[&id].receiving.keys().copied().collect();
                if !tasks.is_empty() {
                    let partition = tasks[self.rng.below(tasks.len())];
                    self.receive(&id, partition);
                }
            }
            85..=87 if !self.nodes.contains_key("n3") => {
                self.nodes.insert("n3".to_owned(), Node::default());
                self.start("n3");
            }
            88 => self.drain_one(),
            89..=99 if self.faults => self.fault(&id),
            _ => {}
        }
    }

    fn drain_one(&mut self) {
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

    fn fault(&mut self, id: &str) {
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
    fn revive(&mut self) {
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

    /// No more faults, every node back; steps until the moves are done.
    fn heal(&mut self) {
        self.faults = false;
        self.store.clear_faults();
        for step in 0..HEAL_STEPS {
            self.revive();
            if step % 16 == 0 && self.quiet() {
                return;
            }
            self.step();
            self.check();
        }
    }

    /// No move in the store, and the map balanced over the nodes that are
    /// not draining.
    fn quiet(&self) -> bool {
        let moves = self
            .store
            .snapshot(&format!("{}moves/", self.keys.prefix()));
        let Some(map) = self.stored_map() else {
            return false;
        };
        let draining: BTreeSet<String> = self
            .store
            .snapshot(&format!("{}draining/", self.keys.prefix()))
            .entries
            .iter()
            .map(|entry| entry.key.rsplit('/').next().unwrap_or_default().to_owned())
            .collect();
        let eligible: BTreeSet<String> = self
            .nodes
            .keys()
            .filter(|id| !draining.contains(*id))
            .cloned()
            .collect();
        let copies = (self.replicas as usize).min(eligible.len());
        let whole = (0..PARTITIONS).all(|p| 1 + map.followers_of(p).len() == copies);
        moves.entries.is_empty()
            && whole
            && map.rebalanced(&eligible).is_some_and(|next| next == map)
    }
}

/// Runs one seed; panics, naming the seed, when an invariant breaks.
/// Answers the new copies made from their leader's log and whole.
fn run(seed: u64, verbose: bool, copies: (u32, u32)) -> (usize, usize) {
    let mut sim = Sim::new(seed, verbose, copies);
    for _ in 0..STEPS {
        sim.step();
        sim.check();
    }
    sim.heal();
    let moves = sim.store.snapshot(&format!("{}moves/", sim.keys.prefix()));
    assert!(
        sim.quiet(),
        "seed {seed}: moves did not end: {:?}\nnodes: {:#?}\nlast steps:\n{}",
        moves.entries,
        sim.nodes
            .iter()
            .map(|(id, n)| (
                id,
                n.up,
                n.lease,
                &n.view.moves,
                &n.receiving,
                n.view.members.keys().collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>(),
        sim.log.join("\n")
    );
    sim.check();
    (sim.from_log, sim.copied_whole)
}

fn seeds(default: u64) -> (u64, u64) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match env("SIM_SEED") {
        Some(seed) => (seed, 1),
        None => (0, env("SIM_SEEDS").unwrap_or(default)),
    }
}

/// Runs the seeds; answers the new copies made from their leader's log
/// and whole, over all of them.
fn run_seeds((replicas, min_in_sync): (u32, u32), default: u64) -> (usize, usize) {
    let (first, count) = seeds(default);
    let verbose = count == 1;
    let mut copies = (0, 0);
    for seed in first..first + count {
        let outcome = std::panic::catch_unwind(|| run(seed, verbose, (replicas, min_in_sync)));
        match outcome {
            Ok((from_log, whole)) => {
                copies.0 += from_log;
                copies.1 += whole;
            }
            Err(panic) => {
                eprintln!(
                    "failing seed: {seed} with {replicas} copies, {min_in_sync} needed (SIM_SEED={seed} replays it with its steps)"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    copies
}

#[test]
fn seeded_runs_keep_every_acked_url_one_writer_per_epoch_and_end_every_move() {
    run_seeds((1, 1), 2_000);
}

/// Two copies: leaders stop, lose their disks, fail over; followers stop,
/// are taken out, and are brought up to date from their leader's log or
/// copied whole; every acknowledged URL stays on every copy in sync.
#[test]
fn seeded_runs_with_two_copies_keep_every_acked_url_on_every_copy_in_sync() {
    two_copies(2);
}

/// As above with writes acknowledged on one copy (`--min-in-sync 1`): a
/// follower taken out misses acknowledged writes, which its leader's log
/// must bring it.
#[test]
fn seeded_runs_with_two_copies_one_needed_bring_lagging_copies_up_to_date() {
    two_copies(1);
}

fn two_copies(min_in_sync: u32) {
    let (from_log, whole) = run_seeds((2, min_in_sync), 1_000);
    if seeds(1_000).1 > 1 {
        assert!(
            from_log > 0 && whole > 0,
            "the seeds exercise both ways of making a copy: {from_log} from the log, {whole} whole"
        );
    }
    eprintln!("{min_in_sync} needed: new copies: {from_log} from the leader's log, {whole} whole");
}

#[test]
fn a_seed_replays_the_same_steps() {
    let trace = |seed| {
        let mut sim = Sim::new(seed, false, (2, 2));
        for _ in 0..STEPS {
            sim.step();
        }
        (sim.log.clone(), sim.store.revision(), sim.acked.clone())
    };
    assert_eq!(trace(7), trace(7));
    assert_ne!(trace(7), trace(8));
}
