//! The writes a group holds: what the write-ahead log records and the
//! store applies. A leaf both import, so that the log knows nothing of the
//! store's tables and the store nothing of the log's format.

use crate::record::UrlRecord;

/// A URL whose state a client reports (a URL Frontier "known" item): its
/// record is overwritten, or created when the crawl does not know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownUrl {
    /// The crawl.
    pub crawl: String,
    /// The canonical URL.
    pub url: String,
    /// The filter partition of its host.
    pub partition: u32,
    /// The queue the client named; `None`: the stored one (for a new URL,
    /// `default_queue`).
    pub queue_key: Option<String>,
    /// The queue of a URL the crawl does not know yet, when the client named
    /// none (its host).
    pub default_queue: String,
    /// Next due date; 0: completed.
    pub due_at: u64,
    /// The client's metadata, replacing what was stored.
    pub metadata: std::collections::BTreeMap<String, Vec<String>>,
    /// Creation date, for a URL the crawl does not know yet; for a report,
    /// when it was made.
    pub now: u64,
    /// A client's report, settled under its crawl's revisit policy (see
    /// [`crate::revisit::settle`]); `None`: a state written as given (a
    /// copy of another store's record).
    pub report: Option<crate::revisit::Policy>,
}

/// One write of a group transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Store a discovered URL unless its crawl knows it.
    Discover(NewUrl),
    /// Overwrite (or create) a URL's state.
    Known(KnownUrl),
    /// Remove URLs.
    Delete(Deletion),
}

/// Which URLs a [`WriteOp::Delete`] removes: those of a crawl, optionally
/// only of one queue, optionally only those created before a date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The crawl.
    pub crawl: String,
    /// Only this queue's URLs.
    pub queue: Option<String>,
    /// Only URLs created before this UTC epoch second.
    pub created_before: Option<u64>,
    /// The store's partition count (URL keys start with the partition).
    pub partitions: u32,
    /// Only this partition's URLs (a partition handed to another node);
    /// queues keep their settings, as their other URLs may live elsewhere.
    pub partition: Option<u32>,
    /// With `partition`: only URLs whose keys sort before this URL's (in
    /// the store's order, by crawl number and URL hash), so that a whole
    /// partition is deleted a bounded chunk per commit and the node's
    /// other writes are not held up behind it.
    pub urls_below: Option<String>,
}

impl Deletion {
    /// Whether whole queues (and, without a queue, the crawl) go: settings
    /// included, not only URLs.
    #[must_use]
    pub fn removes_queues(&self) -> bool {
        self.created_before.is_none() && self.partition.is_none()
    }
}

/// A URL to store if its crawl does not know it yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUrl {
    /// The crawl.
    pub crawl: String,
    /// The canonical URL.
    pub url: String,
    /// The filter partition of its host.
    pub partition: u32,
    /// Whether the filter said "maybe". A "no" is certain, so the URL is
    /// inserted without a lookup first (one B-tree descent instead of two);
    /// a "maybe" is looked up first, since it is usually known.
    pub maybe_known: bool,
    /// What to store for it.
    pub record: UrlRecord,
}
