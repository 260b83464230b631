//! Politeness per host: when the next request to a host may start
//! ([`Pacer`]), a host's pace shared by its batches and fetches
//! (`HostPace`, and the turn a started request holds), and the hosts
//! fetched from lately (`Hosts`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Spaces request starts to one host: with a delay, a request starts only
/// once every earlier one was answered, and the delay after the latest
/// answer. An answer comes after the host saw its request, so the gaps
/// between request starts hold as the host sees them, whatever the network
/// latency.
#[derive(Debug, Default)]
pub struct Pacer {
    unanswered: usize,
    last_answer: Option<Instant>,
}

/// When the next request to a host may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Now.
    Now,
    /// At this instant.
    At(Instant),
    /// Once the requests in flight are answered.
    AfterAnswers,
}

impl Pacer {
    /// Records a request that starts now.
    pub fn started(&mut self) {
        self.unanswered += 1;
    }

    /// Records the answer (or failure) of a started request, at `at`.
    pub fn answered(&mut self, at: Instant) {
        self.unanswered = self.unanswered.saturating_sub(1);
        self.heard(at);
    }

    /// Records a request made and answered outside the pipeline (robots.txt).
    pub fn heard(&mut self, at: Instant) {
        self.last_answer = Some(self.last_answer.map_or(at, |last| last.max(at)));
    }

    /// Whether nothing is in flight and nothing was answered for `keep`.
    #[must_use]
    pub fn quiet_since(&self, now: Instant, keep: Duration) -> bool {
        self.unanswered == 0
            && self
                .last_answer
                .is_none_or(|last| now.saturating_duration_since(last) >= keep)
    }

    /// When the next request may start, for a host with this delay.
    #[must_use]
    pub fn turn(&self, delay: Duration, now: Instant) -> Turn {
        if delay.is_zero() {
            return Turn::Now;
        }
        if self.unanswered > 0 {
            return Turn::AfterAnswers;
        }
        match self.last_answer {
            Some(last) if last + delay > now => Turn::At(last + delay),
            _ => Turn::Now,
        }
    }
}

/// A host's pacer and its in-flight bound, shared by every batch of the
/// host this worker holds (a plain v2.6 frontier may serve one host's URLs
/// in several leases at once) and by the fetches they started.
#[derive(Debug)]
pub(crate) struct HostPace {
    pacer: Mutex<Pacer>,
    answers: Notify,
    in_flight: Arc<Semaphore>,
    // Fetches started and not yet reported: reports travel beside the next
    // fetches, but only so far, so a worker killed mid-crawl leaves a
    // bounded number of pages in flight.
    unreported: Arc<Semaphore>,
}

impl HostPace {
    fn new(per_host: u32, unacked_per_host: u32) -> Self {
        Self {
            pacer: Mutex::default(),
            answers: Notify::new(),
            in_flight: Arc::new(Semaphore::new(per_host as usize)),
            unreported: Arc::new(Semaphore::new(
                (per_host as usize).saturating_mul(unacked_per_host as usize),
            )),
        }
    }

    fn pacer(&self) -> std::sync::MutexGuard<'_, Pacer> {
        self.pacer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a robots.txt read from the host, answered now.
    pub(crate) fn robots_read(&self) {
        self.pacer().heard(Instant::now());
    }

    /// Waits until a request to the host may start, and starts it (in the
    /// pacer's eyes) in the same step, so two batches of one host never
    /// both take one turn. The second permit is held until the URL is
    /// reported.
    pub(crate) async fn take_turn(
        self: &Arc<Self>,
        delay: Duration,
    ) -> Option<(HostTurn, OwnedSemaphorePermit)> {
        let unreported = Arc::clone(&self.unreported).acquire_owned().await.ok()?;
        let in_flight = Arc::clone(&self.in_flight).acquire_owned().await.ok()?;
        loop {
            let answer = self.answers.notified();
            tokio::pin!(answer);
            answer.as_mut().enable();
            let turn = {
                let mut pacer = self.pacer();
                let turn = pacer.turn(delay, Instant::now());
                if turn == Turn::Now {
                    pacer.started();
                }
                turn
            };
            match turn {
                Turn::Now => {
                    let turn = HostTurn {
                        pace: Arc::clone(self),
                        _in_flight: in_flight,
                    };
                    return Some((turn, unreported));
                }
                Turn::At(at) => tokio::time::sleep_until(at.into()).await,
                Turn::AfterAnswers => answer.await,
            }
        }
    }
}

/// One started request's place in its host's pipeline: dropping it (when
/// the answer is in, or the fetch failed or never began) lets the next
/// request's turn come.
pub(crate) struct HostTurn {
    pace: Arc<HostPace>,
    _in_flight: OwnedSemaphorePermit,
}

impl Drop for HostTurn {
    fn drop(&mut self) {
        self.pace.pacer().answered(Instant::now());
        self.pace.answers.notify_waiters();
    }
}

/// The hosts this worker has fetched from lately, by queue key: a host's
/// pace outlives its batch, since the next batch (which a plain v2.6
/// frontier may serve as soon as the first was served) must keep the gap
/// after the last answer too.
#[derive(Debug)]
pub(crate) struct Hosts {
    paces: Mutex<HostMap>,
    // A pace with nothing in flight is dropped once its last answer is
    // older than this (the longest delay a host can have).
    keep: Duration,
}

#[derive(Debug, Default)]
struct HostMap {
    by_key: HashMap<String, Arc<HostPace>>,
    sweep_at: usize,
}

impl Hosts {
    pub(crate) fn new(keep: Duration) -> Self {
        Self {
            paces: Mutex::default(),
            keep,
        }
    }

    /// The host's pace, shared with its other batches.
    pub(crate) fn of(&self, key: &str, per_host: u32, unacked_per_host: u32) -> Arc<HostPace> {
        let mut map = self.paces.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pace) = map.by_key.get(key) {
            return Arc::clone(pace);
        }
        if map.by_key.len() >= map.sweep_at {
            let now = Instant::now();
            map.by_key.retain(|_, pace| {
                Arc::strong_count(pace) > 1 || !pace.pacer().quiet_since(now, self.keep)
            });
            map.sweep_at = (2 * map.by_key.len()).max(64);
        }
        let pace = Arc::new(HostPace::new(per_host, unacked_per_host));
        map.by_key.insert(key.to_owned(), Arc::clone(&pace));
        pace
    }
}
