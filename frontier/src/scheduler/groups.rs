//! Politeness groups: queues whose hosts are one server to be polite to
//! take turns, one delay apart.
//!
//! Many hosts share a server (shared hosting, a CDN's origin, every
//! `*.blogspot.com`), and a gap kept per host lets them all be hit at
//! once. Under `--politeness domain` the queues of one registrable domain
//! form a group; under `ip` the queues whose hosts are at one address do:
//! looked up before a queue's first serve (the addresses module), then
//! the address the worker reports it connected to. A queue keeps its
//! own URLs, delay, block and limit; its group adds one more gate: no
//! other queue of the group is held, and the serving queue's delay has
//! passed since the group was last served or let go. A 429 or 503 that
//! blocks a queue blocks its group too, and so does a host's slow-down
//! widen the group's gaps.
//!
//! Lock order: a queue's lock, then its group's; never the other way, so
//! a group never locks a queue: the queues it turned away are named in
//! `waiting` and woken by the scheduler once both locks are dropped (the
//! grouping module: the scheduler's part).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::time::Timestamp;

/// What hosts share one politeness gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Politeness {
    /// Each queue (host) alone: the URL Frontier default.
    #[default]
    Host,
    /// The hosts of one registrable domain (public suffix list).
    Domain,
    /// The hosts last fetched at one IP address.
    Ip,
}

/// A politeness mode this frontier does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown politeness {0:?}: host, domain or ip")]
pub struct UnknownPoliteness(pub String);

impl Politeness {
    /// Reads `host`, `domain` or `ip`.
    pub fn parse(name: &str) -> Result<Self, UnknownPoliteness> {
        match name {
            "host" => Ok(Self::Host),
            "domain" => Ok(Self::Domain),
            "ip" => Ok(Self::Ip),
            other => Err(UnknownPoliteness(other.to_owned())),
        }
    }

    /// How a new store under this politeness partitions its URLs: by
    /// domain when a domain is a group, so that one partition, and so one
    /// node of a cluster, holds all of a group's queues.
    #[must_use]
    pub fn partitioning(self) -> crate::partitioning::PartitionBy {
        match self {
            Self::Domain => crate::partitioning::PartitionBy::Domain,
            Self::Host | Self::Ip => crate::partitioning::PartitionBy::Host,
        }
    }

    /// Its name, as [`Self::parse`] reads it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Domain => "domain",
            Self::Ip => "ip",
        }
    }

    /// The group a queue starts in, by its key (a host, or `host:port`);
    /// `None`: alone.
    #[must_use]
    pub fn initial_group(self, queue_key: &str) -> Option<String> {
        match self {
            Self::Host | Self::Ip => None,
            Self::Domain => {
                let host = host_of(queue_key);
                let domain = crate::scope::registrable_domain(host);
                Some(format!("domain:{domain}"))
            }
        }
    }

    /// The group a fetch at `address` puts a queue in, under `ip`.
    #[must_use]
    pub fn address_group(self, address: &str) -> Option<String> {
        let ip: IpAddr = address.parse().ok()?;
        (self == Self::Ip).then(|| address_group_of(ip))
    }
}

/// The name of the group of the hosts at `ip`.
pub(super) fn address_group_of(ip: IpAddr) -> String {
    format!("ip:{ip}")
}

/// The host of a queue key: without a port, and an IPv6 literal without
/// its brackets' port.
pub(super) fn host_of(queue_key: &str) -> &str {
    if let Some(rest) = queue_key.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    queue_key.split(':').next().unwrap_or(queue_key)
}

impl std::str::FromStr for Politeness {
    type Err = UnknownPoliteness;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::parse(name)
    }
}

/// Let-gos of other nodes' holds a group remembers: more than the turns
/// a group goes through while a renewal is on its way.
const LET_GO_REMEMBERED: usize = 16;

/// One group of a crawl.
#[derive(Debug)]
pub struct Group {
    pub(super) name: String,
    state: Mutex<GroupState>,
}

#[derive(Debug, Default)]
pub(super) struct GroupState {
    /// The queues holding the group (held leases), each with when its
    /// hold ends: one, but for a while after its keeper changed, when
    /// holds the keeper before gave out are renewed to this one.
    holders: BTreeMap<String, Timestamp>,
    /// The group was last served or let go then; the next serve waits the
    /// serving queue's delay past it.
    last: Option<Timestamp>,
    /// No queue of the group is served before then.
    blocked_until: Timestamp,
    /// Queues turned away, woken when the group is let go.
    waiting: BTreeSet<String>,
    /// Holds of other nodes' queues let go lately: a renewal of one sent
    /// before its let-go and arriving after it is not a hold.
    let_go_lately: VecDeque<String>,
    /// Added to every gap: one of its hosts slowed down (the slowdown
    /// module).
    pub(super) extra: Duration,
    /// This node's turn, when another node keeps the group (the turns
    /// module).
    pub(super) turn: super::turn::Turn,
}

impl Group {
    pub(super) fn new(name: String) -> Self {
        Self {
            name,
            state: Mutex::default(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl GroupState {
    /// When queue `key`, with `delay`, may be served: `None` now, else the
    /// earliest time (a held group's hold end, past which it is free
    /// whether or not it was let go).
    pub(super) fn gate(&self, key: &str, delay: Duration, now: Timestamp) -> Option<Timestamp> {
        let delay = delay.saturating_add(self.extra);
        let mut last = self.last;
        let mut at = self.blocked_until;
        let mut held = false;
        for (holder, until) in &self.holders {
            if holder == key {
                continue;
            }
            if *until > now {
                held = true;
                at = at.max(until.saturating_add(delay));
            } else {
                last = Some(last.map_or(*until, |l| l.max(*until)));
            }
        }
        if held {
            return Some(at);
        }
        if let Some(last) = last
            && !delay.is_zero()
        {
            at = at.max(last.saturating_add(delay));
        }
        (at > now).then_some(at)
    }

    /// Queue `key` was turned away: woken when the group is let go.
    pub(super) fn wait(&mut self, key: &str) {
        self.waiting.insert(key.to_owned());
    }

    /// Queue `key` was served at `now`, held until `until` if `held`.
    pub(super) fn served(&mut self, key: &str, held: bool, until: Timestamp, now: Timestamp) {
        self.waiting.remove(key);
        // Holds that ended unreported count as let go when they ended.
        let ended: Vec<String> = (self.holders.iter())
            .filter(|(_, end)| **end <= now)
            .map(|(holder, _)| holder.clone())
            .collect();
        for holder in ended {
            if let Some(end) = self.holders.remove(&holder) {
                self.last = Some(self.last.map_or(end, |last| last.max(end)));
            }
        }
        if held {
            self.holders.insert(key.to_owned(), until);
        }
        self.last = Some(self.last.map_or(now, |last| last.max(now)));
    }

    /// Queue `key` let go at `at` (its last URL reported, or a lease given
    /// back): the queues waiting, to wake.
    pub(super) fn let_go(&mut self, key: &str, at: Timestamp) -> Vec<String> {
        if self.holders.remove(key).is_some() {
            self.last = Some(self.last.map_or(at, |last| last.max(at)));
        }
        if key.contains('/') {
            if self.let_go_lately.len() == LET_GO_REMEMBERED {
                self.let_go_lately.pop_front();
            }
            self.let_go_lately.push_back(key.to_owned());
        }
        self.take_waiting()
    }

    /// Holder `key` still holds the group, until `until` at least; a hold
    /// this keeper had not heard of (given out by the keeper before it) is
    /// taken as one.
    pub(super) fn renew(&mut self, key: &str, until: Timestamp) {
        if self.let_go_lately.iter().any(|gone| gone == key) {
            return;
        }
        let end = self.holders.entry(key.to_owned()).or_insert(until);
        *end = (*end).max(until);
    }

    /// Takes the hold of a queue of this node (a key without `/`) whose
    /// hold runs past `now`: the group is kept elsewhere now, and the hold
    /// goes to its keeper.
    pub(super) fn take_local_holder(&mut self, now: Timestamp) -> Option<String> {
        let holder = (self.holders.iter())
            .find(|(holder, end)| !holder.contains('/') && **end > now)
            .map(|(holder, _)| holder.clone())?;
        self.holders.remove(&holder);
        Some(holder)
    }

    /// Forgets the holds of other nodes' queues: the group is kept
    /// elsewhere now, and they renew there.
    pub(super) fn forget_remote_holders(&mut self) {
        self.holders.retain(|holder, _| !holder.contains('/'));
    }

    /// The queues turned away, to wake.
    pub(super) fn take_waiting(&mut self) -> Vec<String> {
        std::mem::take(&mut self.waiting).into_iter().collect()
    }

    /// Blocks the group until `until` (a 429 or 503's Retry-After on one
    /// of its hosts).
    pub(super) fn block(&mut self, until: Timestamp) {
        self.blocked_until = self.blocked_until.max(until);
    }

    /// Queue `key` leaves the group (a host found at another address).
    pub(super) fn leave(&mut self, key: &str) -> Vec<String> {
        self.waiting.remove(key);
        if self.holders.remove(key).is_some() {
            return self.take_waiting();
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    #[test]
    fn groups_are_named_by_domain_or_address() {
        let domain = Politeness::Domain;
        assert_eq!(
            domain.initial_group("www.example.co.uk"),
            Some("domain:example.co.uk".into())
        );
        assert_eq!(
            domain.initial_group("blog.example.org:8080"),
            Some("domain:example.org".into())
        );
        assert_eq!(
            domain.initial_group("127.0.0.1:80"),
            Some("domain:127.0.0.1".into())
        );
        assert_eq!(domain.initial_group("[::1]:80"), Some("domain:::1".into()));
        assert_eq!(Politeness::Host.initial_group("a.example"), None);
        assert_eq!(Politeness::Ip.initial_group("a.example"), None);
        assert_eq!(
            Politeness::Ip.address_group("10.0.0.7"),
            Some("ip:10.0.0.7".into())
        );
        assert_eq!(Politeness::Ip.address_group("not an address"), None);
        assert_eq!(Politeness::Domain.address_group("10.0.0.7"), None);
        for mode in [Politeness::Host, Politeness::Domain, Politeness::Ip] {
            assert_eq!(Politeness::parse(mode.name()), Ok(mode));
        }
        assert!(Politeness::parse("server").is_err());
    }

    #[test]
    fn a_held_group_serves_no_other_queue_until_let_go_and_a_delay_after() {
        let delay = Duration::from_millis(100);
        let mut group = GroupState::default();
        assert_eq!(group.gate("a", delay, at(1_000)), None);
        group.served("a", true, at(61_000), at(1_000));
        assert_eq!(
            group.gate("b", delay, at(1_050)),
            Some(at(61_100)),
            "held: at worst until its lease ends"
        );
        group.wait("b");
        assert_eq!(group.let_go("a", at(2_000)), vec!["b".to_owned()]);
        assert_eq!(group.gate("b", delay, at(2_050)), Some(at(2_100)));
        assert_eq!(group.gate("b", delay, at(2_100)), None);
    }

    #[test]
    fn a_shared_serve_spaces_the_group_and_an_expired_hold_frees_it() {
        let delay = Duration::from_millis(100);
        let mut group = GroupState::default();
        group.served("a", false, at(9_000), at(1_000));
        assert_eq!(group.gate("b", delay, at(1_010)), Some(at(1_100)));
        group.served("c", true, at(2_000), at(1_500));
        // Never let go: free a delay after its lease ended.
        assert_eq!(group.gate("b", delay, at(2_050)), Some(at(2_100)));
        assert_eq!(group.gate("b", delay, at(2_100)), None);
    }

    #[test]
    fn a_block_holds_every_queue_and_a_leaver_frees_its_hold() {
        let mut group = GroupState::default();
        group.block(at(5_000));
        assert_eq!(group.gate("a", Duration::ZERO, at(4_000)), Some(at(5_000)));
        assert_eq!(group.gate("a", Duration::ZERO, at(5_000)), None);
        group.served("a", true, at(9_000), at(5_000));
        group.wait("b");
        assert_eq!(group.leave("a"), vec!["b".to_owned()]);
        assert_eq!(group.gate("b", Duration::ZERO, at(5_001)), None);
    }
}
