//! robots.txt answers the workers read, kept per crawl and origin so that
//! each origin's robots.txt is read once per deployment rather than once
//! per worker.
//!
//! A queue is held by one worker at a time (see [`crate::scheduler`]), so
//! the first worker to hold a host's queue reads robots.txt and puts the
//! answer here before it lets the queue go; the next holder finds it. The
//! workers judge an answer's age against their own TTLs (the answer keeps
//! when it was read), so the shelf holds no clock of its own. It is memory
//! only and bounded in bytes: an answer dropped to make room, or lost to a
//! restart, is read again by the next worker that needs it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

/// The most robots.txt bytes a worker parses (RFC 9309 asks for at least
/// 500 KiB), and so the most kept per origin.
pub const MAX_ROBOTS_BODY: usize = 512 * 1024;

/// One robots.txt answer as a worker read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RobotsAnswer {
    /// False: the server could not be reached.
    pub reached: bool,
    /// The HTTP status.
    pub status: u16,
    /// The body as read.
    pub body: Vec<u8>,
    /// When it was read, UTC epoch milliseconds.
    pub fetched_at_ms: u64,
}

/// Why an answer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShelfError {
    /// Longer than any worker parses.
    #[error("robots.txt body of {0} bytes is over the limit of {MAX_ROBOTS_BODY}")]
    TooLong(usize),
    /// No origin named.
    #[error("a robots.txt answer needs its origin")]
    NoOrigin,
}

type Key = (String, String);

#[derive(Debug, Default)]
struct Shelf {
    entries: HashMap<Key, (RobotsAnswer, u64)>,
    // Put order, oldest first: what goes when room is needed.
    order: BTreeMap<u64, Key>,
    bytes: usize,
    next: u64,
}

/// The answers kept, at most `max_bytes` of them (keys and bodies).
#[derive(Debug)]
pub struct RobotsShelf {
    max_bytes: usize,
    shelf: Mutex<Shelf>,
}

fn size_of(key: &Key, answer: &RobotsAnswer) -> usize {
    key.0.len() + key.1.len() + answer.body.len() + 64
}

impl RobotsShelf {
    /// An empty shelf of at most `max_bytes`.
    #[must_use]
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            shelf: Mutex::default(),
        }
    }

    /// The answer kept for a crawl's origin, if any.
    #[must_use]
    pub fn get(&self, crawl: &str, origin: &str) -> Option<RobotsAnswer> {
        let shelf = self.shelf.lock().unwrap_or_else(PoisonError::into_inner);
        shelf
            .entries
            .get(&(crawl.to_owned(), origin.to_owned()))
            .map(|(answer, _)| answer.clone())
    }

    /// Keeps an answer, replacing an older one of the origin; the oldest
    /// put go first when the shelf is full. An answer read earlier than the
    /// one kept is not taken (two workers raced; the later read wins).
    pub fn put(&self, crawl: &str, origin: &str, answer: RobotsAnswer) -> Result<(), ShelfError> {
        if answer.body.len() > MAX_ROBOTS_BODY {
            return Err(ShelfError::TooLong(answer.body.len()));
        }
        if origin.is_empty() {
            return Err(ShelfError::NoOrigin);
        }
        let key = (crawl.to_owned(), origin.to_owned());
        let size = size_of(&key, &answer);
        let mut shelf = self.shelf.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((kept, seq)) = shelf.entries.get(&key) {
            if kept.fetched_at_ms > answer.fetched_at_ms {
                return Ok(());
            }
            let (seq, kept_size) = (*seq, size_of(&key, kept));
            shelf.order.remove(&seq);
            shelf.bytes -= kept_size;
            shelf.entries.remove(&key);
        }
        if size > self.max_bytes {
            return Ok(()); // no room at all: the next worker reads it again
        }
        while shelf.bytes + size > self.max_bytes {
            let Some((_, oldest)) = shelf.order.pop_first() else {
                break;
            };
            if let Some((dropped, _)) = shelf.entries.remove(&oldest) {
                shelf.bytes -= size_of(&oldest, &dropped);
            }
        }
        let seq = shelf.next;
        shelf.next += 1;
        shelf.order.insert(seq, key.clone());
        shelf.bytes += size;
        shelf.entries.insert(key, (answer, seq));
        Ok(())
    }

    /// Bytes held now.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.shelf
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn answer(body: &str, at: u64) -> RobotsAnswer {
        RobotsAnswer {
            reached: true,
            status: 200,
            body: body.as_bytes().to_vec(),
            fetched_at_ms: at,
        }
    }

    #[test]
    fn answers_are_kept_per_crawl_and_origin_and_the_later_read_wins() {
        let shelf = RobotsShelf::new(1 << 20);
        shelf.put("c", "http://a", answer("x", 10)).unwrap();
        assert_eq!(shelf.get("c", "http://a"), Some(answer("x", 10)));
        assert_eq!(shelf.get("d", "http://a"), None);
        shelf.put("c", "http://a", answer("old", 5)).unwrap();
        assert_eq!(shelf.get("c", "http://a"), Some(answer("x", 10)));
        shelf.put("c", "http://a", answer("new", 20)).unwrap();
        assert_eq!(shelf.get("c", "http://a"), Some(answer("new", 20)));
    }

    #[test]
    fn bad_answers_are_refused() {
        let shelf = RobotsShelf::new(1 << 20);
        let long = RobotsAnswer {
            body: vec![b'a'; MAX_ROBOTS_BODY + 1],
            ..answer("", 1)
        };
        assert_eq!(
            shelf.put("c", "http://a", long),
            Err(ShelfError::TooLong(MAX_ROBOTS_BODY + 1))
        );
        assert_eq!(shelf.put("c", "", answer("", 1)), Err(ShelfError::NoOrigin));
    }

    proptest! {
        /// Whatever is put, the shelf stays within its bound, keeps the
        /// latest answer of what it holds, and always holds the last put
        /// when it fits.
        #[test]
        fn the_shelf_stays_within_its_bound(
            puts in proptest::collection::vec((0..8_u8, 0..300_usize), 1..80),
            max in 100..2000_usize,
        ) {
            let shelf = RobotsShelf::new(max);
            for (i, (origin, len)) in puts.iter().enumerate() {
                let origin = format!("http://h{origin}");
                let body = "r".repeat(*len);
                shelf.put("c", &origin, answer(&body, i as u64)).unwrap();
                prop_assert!(shelf.bytes() <= max);
                let fits = size_of(&("c".into(), origin.clone()), &answer(&body, 0)) <= max;
                prop_assert_eq!(shelf.get("c", &origin).is_some(), fits);
                if let Some(kept) = shelf.get("c", &origin) {
                    prop_assert_eq!(kept.fetched_at_ms, i as u64);
                }
            }
        }
    }
}
