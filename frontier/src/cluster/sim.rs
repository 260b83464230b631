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

mod batches;
mod faults;
mod moves;
mod writes;

use super::View;
use super::coordination::{Condition, LeaseId, MemCoordination, Txn, Write};
use super::map::{Member, MoveRecord, PartitionMap};
use super::protocol::{self, Keys};

const PARTITIONS: u32 = 8;
const STEPS: usize = 400;
const HEAL_STEPS: usize = 4000;

/// SplitMix64: small, seedable, and the same on every machine (the
/// scheduler's turns simulation draws from it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
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
    /// Drops what a node holds in memory only: a stop loses it, and a
    /// start begins without it.
    fn forget_memory(&mut self) {
        self.sealed.clear();
        self.noted.clear();
        self.receiving.clear();
        self.ended_at.clear();
        self.owed_again.clear();
        self.owed.clear();
        self.lags.clear();
        self.sending_to.clear();
    }

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
        node.forget_memory();
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
