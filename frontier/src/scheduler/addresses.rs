//! Politeness by address from a host's first request. Under `--politeness
//! ip` a queue's host is looked up before its first serve, so that its
//! robots.txt and first page already take turns with the other hosts at
//! its address (Heritrix likewise resolves a host before fetching from
//! it). The worker's report of the address it connected to files the
//! queue again should the two differ.
//!
//! Lookups run on a task of their own, through the same hosts file and
//! DNS cache the worker uses (the `names` crate); the serve path only asks
//! and turns the queue away until the answer comes, at most
//! [`LOOKUP_WAIT`]. A host with no answer by then goes alone until its
//! first report names its address; so does every host when no lookup
//! task runs (a frontier embedded without a runtime).

use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::queue::{Queue, QueueState};
use super::{Politeness, Scheduler};
use crate::time::Timestamp;

/// Longest a queue waits for its host's address before it is served
/// alone: past any healthy resolver's answer, short against a crawl.
pub const LOOKUP_WAIT: Duration = Duration::from_secs(10);

/// Lookups in flight at once: a wide crawl's first minute asks for
/// thousands of hosts, and a name server answers many at once.
const LOOKUPS_AT_ONCE: usize = 64;

/// (crawl, queue key) whose host to look up.
pub(super) type LookupSender = mpsc::UnboundedSender<(String, String)>;

impl Scheduler {
    /// Starts looking up hosts' addresses with `names` before their first
    /// serve, on the current tokio runtime; only under `ip` politeness,
    /// once. The task ends with the scheduler.
    pub fn look_up_addresses(self: &Arc<Self>, names: names::Names) {
        if self.politeness != Politeness::Ip {
            return;
        }
        let (sender, mut requests) = mpsc::unbounded_channel::<(String, String)>();
        if self.address_lookups.set(sender).is_err() {
            return;
        }
        let scheduler: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let at_once = Arc::new(Semaphore::new(LOOKUPS_AT_ONCE));
            while let Some((crawl, key)) = requests.recv().await {
                let Ok(permit) = Arc::clone(&at_once).acquire_owned().await else {
                    return;
                };
                let names = names.clone();
                let scheduler = Weak::clone(&scheduler);
                tokio::spawn(async move {
                    let host = super::groups::host_of(&key);
                    let found = match tokio::time::timeout(LOOKUP_WAIT, names.lookup(host)).await {
                        Ok(Ok(addresses)) => addresses.first().copied(),
                        Ok(Err(error)) => {
                            tracing::debug!(%error, host, "no address before the first fetch");
                            None
                        }
                        Err(_) => None,
                    };
                    metrics::counter!(
                        "frontier_address_lookups_total",
                        "result" => if found.is_some() { "found" } else { "none" }
                    )
                    .increment(1);
                    drop(permit);
                    if let Some(scheduler) = scheduler.upgrade() {
                        scheduler.address_found(&crawl, &key, found);
                    }
                });
            }
        });
    }

    /// Whether the queue waits for its host's address before it may be
    /// served (its gate then says until when at most). Names the queue's
    /// group as soon as it can: at once for an address literal, else
    /// when the lookup answers.
    pub(super) fn awaiting_address(
        &self,
        queue: &Queue,
        state: &mut QueueState,
        now: Timestamp,
    ) -> bool {
        if self.politeness != Politeness::Ip || state.group_known {
            return false;
        }
        let host = super::groups::host_of(&queue.key);
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.file_under_address(queue, state, ip);
            return false;
        }
        let Some(lookups) = self.address_lookups.get() else {
            state.group_known = true; // alone until its first report
            return false;
        };
        let asked = *state.looked_up_since.get_or_insert_with(|| {
            // A send fails only once the task is gone: the wait then runs out.
            let _ = lookups.send((queue.crawl.clone(), queue.key.clone()));
            now
        });
        let given_up = asked.saturating_add(LOOKUP_WAIT);
        if now >= given_up {
            tracing::debug!(queue = %queue.key, "no address in time: served alone");
            state.group_known = true;
            state.looked_up_since = None;
            return false;
        }
        state.group_gate = given_up;
        true
    }

    fn file_under_address(&self, queue: &Queue, state: &mut QueueState, ip: IpAddr) -> Vec<String> {
        self.regroup(queue, state, &super::groups::address_group_of(ip))
    }

    /// The lookup of a queue's host answered `found`: the queue is filed
    /// under that address (unless a report filed it meanwhile) and looked
    /// at again.
    pub(super) fn address_found(&self, crawl: &str, key: &str, found: Option<IpAddr>) {
        let Some(queue) = self.queue(crawl, key) else {
            return;
        };
        let woken = {
            let mut state = queue.lock();
            if state.looked_up_since.take().is_none() || state.group_known {
                return;
            }
            let woken = match found {
                Some(ip) => self.file_under_address(&queue, &mut state, ip),
                None => Vec::new(),
            };
            state.group_known = true;
            state.group_gate = Timestamp::EPOCH;
            self.wake(&queue, &mut state, Timestamp::EPOCH);
            woken
        };
        self.wake_turned_away(crawl, &woken);
    }
}

/// The lookups a scheduler asks for: set once their task runs.
pub(super) type Lookups = std::sync::OnceLock<LookupSender>;
