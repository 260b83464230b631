//! A worker's counters, for progress lines and summaries.

use std::sync::atomic::AtomicU64;

/// Counters of a worker's work, for progress lines and summaries.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Fetches answered, by status class (index 1..=5).
    pub by_class: [AtomicU64; 6],
    /// Fetches that got no answer.
    pub failures: AtomicU64,
    /// Body bytes read.
    pub bytes: AtomicU64,
    /// URLs reported done.
    pub done: AtomicU64,
    /// URLs rescheduled after a transient failure.
    pub retries: AtomicU64,
    /// URLs refused by robots.txt.
    pub robots_refused: AtomicU64,
    /// Outlinks the frontier took as new.
    pub new_outlinks: AtomicU64,
    /// Fetches in flight now.
    pub in_flight: AtomicU64,
    /// Links sent to the frontier.
    pub links_sent: AtomicU64,
    /// Links not sent: the seen cache knew the frontier has them.
    pub links_cached: AtomicU64,
    /// Signalled when the frontier has taken a report, so whoever waits
    /// for a crawl's end looks at once instead of at its next tick.
    pub reported: tokio::sync::Notify,
}
