//! Seeded simulation of a politeness group kept across nodes (the turns
//! module): three schedulers, each over a store of its own as three
//! nodes are, whose hosts all share one address; a worker per node that
//! leases and reports; the messages between the nodes delivered late,
//! out of order or not at all; the group's keeper moved from node to
//! node; and nodes restarted (memory lost, store kept) while their
//! workers fetch on. Every decision is the schedulers' own; the simulation only
//! carries messages and keeps time.
//!
//! The network it assumes is the one the turns rely on: a message
//! arrives within [`MAX_LATENCY_MS`] or never, and renewals are not lost
//! (a node whose renewals stop for a turn's life is taken for gone).
//!
//! Checked after every step: no two queues of the group are served at
//! once across the nodes, and each serve comes at least the group's
//! delay after the previous one's let-go. At the end, once the faults
//! stop, every URL is crawled: no turn is stuck.
//!
//! `SIM_SEEDS=N` runs N seeds (default in the test below); `SIM_SEED=S`
//! runs seed S alone and prints its steps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::tests::{Fixture, open_polite};
use super::{Politeness, ServeRequest, TurnAnswer, TurnKeepers, TurnMessage, holder_name};
use crate::cluster::sim::Rng;
use crate::time::Timestamp;

const NODES: usize = 3;
const HOSTS_PER_NODE: usize = 2;
const PAGES: usize = 8;
const DELAY_MS: u64 = 1000;
const MAX_LATENCY_MS: u64 = 800;
const STEPS: usize = 2500;
const HEAL_STEPS: usize = 20_000;
const PARTITIONS: usize = 4;
/// Time starts here, well past the epoch.
const START_MS: u64 = 1_000_000_000;

/// A node's keepers: the simulation's keeper, and an outbox it carries.
struct SimKeepers {
    me: usize,
    keeper: Arc<AtomicUsize>,
    outbox: Mutex<Vec<TurnMessage>>,
}

impl TurnKeepers for SimKeepers {
    fn kept_elsewhere(&self, _crawl: &str, _group: &str) -> bool {
        self.keeper.load(Ordering::SeqCst) != self.me
    }

    fn send(&self, message: TurnMessage) {
        self.outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(message);
    }
}

enum Envelope {
    /// A node's message to the keeper it named when sending.
    Step {
        from: usize,
        to: usize,
        message: TurnMessage,
    },
    /// A keeper's answer to an ask.
    Answer {
        to: usize,
        message: TurnMessage,
        answer: TurnAnswer,
    },
}

struct Node {
    fixture: Fixture,
    keepers: Arc<SimKeepers>,
    /// Hosts its scheduler asked to look up.
    asked: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    /// What its worker holds, and when it has fetched it.
    leased: Vec<String>,
    fetched_at: u64,
    next_renewal: u64,
}

struct Sim {
    rng: Rng,
    now: u64,
    nodes: Vec<Node>,
    keeper: Arc<AtomicUsize>,
    /// (delivery time, envelope).
    network: Vec<(u64, Envelope)>,
    faults: bool,
    /// The node whose worker holds the group, and since when.
    holding: Option<(usize, u64)>,
    /// The last let-go of the group.
    last_let_go: Option<u64>,
    group_partition: usize,
    address: String,
    urls: usize,
    verbose: bool,
}

/// An address whose group's partition is none of the hosts', so that
/// moving the group's keeping moves no host's URLs.
fn address() -> String {
    let hosts: Vec<usize> = (0..NODES)
        .flat_map(|me| (0..HOSTS_PER_NODE).map(move |host| format!("h{me}-{host}.test")))
        .map(|host| crate::partitioning::partition_of("c", &host, PARTITIONS))
        .collect();
    (1..=255)
        .map(|n| format!("10.0.0.{n}"))
        .find(|ip| {
            let group = crate::partitioning::partition_of("c", &format!("ip:{ip}"), PARTITIONS);
            !hosts.contains(&group)
        })
        .expect("an address whose group's partition holds no host")
}

impl Node {
    /// Node `me` over `fixture`, at `now`: its keepers and lookups set.
    fn boot(me: usize, fixture: Fixture, keeper: &Arc<AtomicUsize>, now: u64) -> Self {
        fixture.now_ms.store(now, Ordering::SeqCst);
        let keepers = Arc::new(SimKeepers {
            me,
            keeper: Arc::clone(keeper),
            outbox: Mutex::default(),
        });
        fixture
            .scheduler
            .set_turn_keepers(Arc::clone(&keepers) as Arc<dyn TurnKeepers>);
        // Names, each found at the one address when looked up.
        let (lookups, asked) = tokio::sync::mpsc::unbounded_channel();
        fixture.scheduler.address_lookups.set(lookups).unwrap();
        Self {
            fixture,
            keepers,
            asked,
            leased: Vec::new(),
            fetched_at: 0,
            next_renewal: now,
        }
    }
}

impl Sim {
    fn new(seed: u64, verbose: bool) -> Self {
        let keeper = Arc::new(AtomicUsize::new(0));
        let address = address();
        let group_partition =
            crate::partitioning::partition_of("c", &format!("ip:{address}"), PARTITIONS);
        let mut nodes = Vec::new();
        let mut urls = 0;
        for me in 0..NODES {
            let fixture = open_polite(tempfile::tempdir().unwrap(), 8, Politeness::Ip);
            fixture.scheduler.set_delay("c", "", 1).unwrap();
            let mut node_urls = Vec::new();
            for host in 0..HOSTS_PER_NODE {
                for page in 0..PAGES {
                    node_urls.push(format!("http://h{me}-{host}.test/p{page}"));
                }
            }
            urls += node_urls.len();
            fixture.discover(&node_urls, START_MS / 1000);
            nodes.push(Node::boot(me, fixture, &keeper, START_MS));
        }
        let sim = Self {
            rng: Rng(seed),
            now: START_MS,
            nodes,
            keeper,
            network: Vec::new(),
            faults: true,
            holding: None,
            last_let_go: None,
            group_partition,
            address,
            urls,
            verbose,
        };
        for node in 0..NODES {
            sim.serve_partitions(node);
        }
        sim
    }

    /// Every partition but the group's, and the group's on its keeper.
    fn serve_partitions(&self, node: usize) {
        let keeper = self.keeper.load(Ordering::SeqCst);
        let served = (0..PARTITIONS)
            .map(|p| p != self.group_partition || node == keeper)
            .collect();
        self.nodes[node]
            .fixture
            .scheduler
            .set_served_partitions(Some(served));
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            println!("{:>7} {}", self.now - START_MS, what());
        }
    }

    fn step(&mut self) {
        self.now += self.rng.below(200) as u64;
        for node in &self.nodes {
            node.fixture.now_ms.store(self.now, Ordering::SeqCst);
        }
        for node in 0..NODES {
            if self.now >= self.nodes[node].next_renewal {
                self.nodes[node].fixture.scheduler.renew_turns();
                self.nodes[node].next_renewal += super::TURN_RENEW.as_millis() as u64;
            }
        }
        let ip = self.address.parse().unwrap();
        for node in &mut self.nodes {
            while let Ok((crawl, key)) = node.asked.try_recv() {
                node.fixture.scheduler.address_found(&crawl, &key, Some(ip));
            }
        }
        self.post_outboxes();
        match self.rng.below(1000) {
            0..400 => self.deliver(),
            400..800 => {
                let node = self.rng.below(NODES);
                self.work(node);
            }
            800..802 if self.faults => self.move_keeper(),
            802..803 if self.faults => self.restart(),
            _ => {}
        }
        self.post_outboxes();
    }

    /// Puts what the nodes sent on the network, to the keeper each names
    /// now; a node's message to itself is taken at once, as a call.
    fn post_outboxes(&mut self) {
        loop {
            let mut sent = Vec::new();
            for (from, node) in self.nodes.iter().enumerate() {
                let mut outbox = node
                    .keepers
                    .outbox
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                outbox.sort();
                sent.extend(outbox.drain(..).map(|message| (from, message)));
            }
            if sent.is_empty() {
                return;
            }
            for (from, message) in sent {
                let to = self.keeper.load(Ordering::SeqCst);
                if to == from {
                    self.take(from, to, &message);
                    continue;
                }
                let lost = self.faults
                    && !matches!(message, TurnMessage::Renew { .. })
                    && self.rng.below(20) == 0;
                if lost {
                    self.log(|| format!("lost {from}->{to} {message:?}"));
                    continue;
                }
                let at = self.now + self.rng.below(MAX_LATENCY_MS as usize) as u64;
                self.network
                    .push((at, Envelope::Step { from, to, message }));
            }
        }
    }

    /// Keeper `to` takes `message` from node `from`; an ask's answer goes
    /// back (at once to itself).
    fn take(&mut self, from: usize, to: usize, message: &TurnMessage) {
        let holder = message
            .asker()
            .map(|(queue, serial)| holder_name(&format!("n{from}"), queue, serial))
            .unwrap_or_default();
        let answer = self.nodes[to].fixture.scheduler.keep_turn(&holder, message);
        self.log(|| format!("n{to} takes from n{from} {message:?}: {answer:?}"));
        if !matches!(message, TurnMessage::Ask { .. }) {
            return;
        }
        if to == from {
            self.answered(from, message, answer);
            return;
        }
        if self.faults && self.rng.below(20) == 0 {
            self.log(|| "answer lost".to_owned());
            return;
        }
        let at = self.now + self.rng.below(MAX_LATENCY_MS as usize) as u64;
        self.network.push((
            at,
            Envelope::Answer {
                to: from,
                message: message.clone(),
                answer,
            },
        ));
    }

    fn answered(&self, to: usize, message: &TurnMessage, answer: TurnAnswer) {
        self.nodes[to]
            .fixture
            .scheduler
            .ask_answered(message, answer);
    }

    /// Delivers one message whose time has come, any of them: the network
    /// keeps no order.
    fn deliver(&mut self) {
        let ready: Vec<usize> = (0..self.network.len())
            .filter(|&i| self.network[i].0 <= self.now)
            .collect();
        if ready.is_empty() {
            return;
        }
        let pick = ready[self.rng.below(ready.len())];
        let (_, envelope) = self.network.swap_remove(pick);
        match envelope {
            Envelope::Step { from, to, message } => self.take(from, to, &message),
            Envelope::Answer {
                to,
                message,
                answer,
            } => {
                self.log(|| format!("n{to} hears {answer:?} to {message:?}"));
                self.answered(to, &message, answer);
            }
        }
    }

    /// Node `node`'s worker leases if it holds nothing, else reports what
    /// it holds; each serve checked against the group's last let-go.
    fn work(&mut self, node: usize) {
        let now = self.now;
        if self.nodes[node].leased.is_empty() {
            let request = ServeRequest {
                hold_queues: true,
                max_urls_per_queue: 1,
                lease_secs: 60,
                ..ServeRequest::default()
            };
            let served = self.nodes[node].fixture.serve(&request, now);
            if served.is_empty() {
                return;
            }
            self.log(|| format!("n{node} serves {served:?}"));
            if let Some((holder, since)) = self.holding {
                panic!(
                    "n{node} served {served:?} at {} while n{holder} held the group since {}",
                    now - START_MS,
                    since - START_MS
                );
            }
            if let Some(last) = self.last_let_go {
                assert!(
                    now >= last + DELAY_MS,
                    "n{node} served {served:?} {} ms after the group's let-go",
                    now - last
                );
            }
            self.holding = Some((node, now));
            self.nodes[node].leased = served;
            // Now and then a slow host: a fetch past a turn's life.
            let fetch = if self.rng.below(10) == 0 {
                2 * super::TURN_HOLD.as_millis() as u64
            } else {
                self.rng.below(1000) as u64
            };
            self.nodes[node].fetched_at = now + fetch;
        } else if now >= self.nodes[node].fetched_at {
            let leased = std::mem::take(&mut self.nodes[node].leased);
            self.log(|| format!("n{node} reports {leased:?}"));
            for url in &leased {
                self.nodes[node].fixture.report(url, 0);
            }
            self.holding = None;
            self.last_let_go = Some(now);
        }
    }

    /// The group's partition, and so its keeping, moves to another node.
    fn move_keeper(&mut self) {
        let old = self.keeper.load(Ordering::SeqCst);
        let new = (old + 1 + self.rng.below(NODES - 1)) % NODES;
        self.keeper.store(new, Ordering::SeqCst);
        self.log(|| format!("keeper n{old} -> n{new}"));
        self.serve_partitions(old);
        self.serve_partitions(new);
    }

    /// A node stops and starts again: its memory (turns, groups) is
    /// lost, its store kept; its worker fetches on and reports to the new
    /// process.
    fn restart(&mut self) {
        let me = self.rng.below(NODES);
        self.log(|| format!("n{me} restarts"));
        let old = self.nodes.remove(me);
        let (leased, fetched_at) = (old.leased, old.fetched_at);
        let Fixture {
            ingest,
            scheduler,
            _dir,
            ..
        } = old.fixture;
        drop(scheduler);
        ingest.shutdown().unwrap();
        let fixture = open_polite(_dir, 8, Politeness::Ip);
        let mut node = Node::boot(me, fixture, &self.keeper, self.now);
        node.leased = leased;
        node.fetched_at = fetched_at;
        self.nodes.insert(me, node);
        self.serve_partitions(me);
    }

    fn completed(&self) -> usize {
        let now = Timestamp::from_unix_millis(self.now);
        self.nodes
            .iter()
            .map(|node| node.fixture.scheduler.counts("c", None, now).completed as usize)
            .sum()
    }
}

fn run(seed: u64, verbose: bool) {
    let mut sim = Sim::new(seed, verbose);
    for _ in 0..STEPS {
        sim.step();
    }
    sim.faults = false;
    for _ in 0..HEAL_STEPS {
        if sim.completed() == sim.urls {
            return;
        }
        sim.step();
    }
    panic!(
        "seed {seed}: {} of {} URLs crawled once the faults stopped",
        sim.completed(),
        sim.urls
    );
}

#[test]
fn an_address_group_kept_across_nodes_serves_one_queue_at_a_time_a_delay_apart() {
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        run(seed, true);
        return;
    }
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    for seed in 0..seeds {
        let outcome = std::panic::catch_unwind(|| run(seed, false));
        assert!(
            outcome.is_ok(),
            "seed {seed} failed: SIM_SEED={seed} shows its steps"
        );
    }
}
