//! The seen cache: links the frontier already acknowledged for a crawl,
//! so that a link repeated on every page of a site (its menu, its footer)
//! is sent once rather than once per page.
//!
//! The frontier stays the authority: a link the cache does not know is
//! always sent, and the cache only skips a link it saw acknowledged (stored
//! or refused) at the same depth or shallower. The frontier's verdict on a
//! link of a host already in scope depends on the link and its depth
//! alone, and a deeper link is never admitted where a shallower one was
//! not, so nothing the frontier would store is left unsent. Links to other
//! hosts are not cached (the crawl's scope can grow). Keys are 128-bit
//! hashes of crawl and URL; the oldest go first past the bound.
//!
//! A crawl deleted and started again under the same ID while workers run
//! should restart the workers, or their caches skip its links.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

/// A link's key: a 128-bit hash of its crawl and canonical URL.
pub type SeenKey = u128;

#[derive(Debug, Default)]
struct Entries {
    depth_of: HashMap<SeenKey, u32>,
    order: VecDeque<SeenKey>,
}

/// Links acknowledged, at most `capacity` of them.
#[derive(Debug)]
pub struct SeenCache {
    capacity: usize,
    entries: Mutex<Entries>,
}

impl SeenCache {
    /// An empty cache of at most `capacity` links (0: it keeps none).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::default(),
        }
    }

    /// The key of a crawl's canonical URL.
    #[must_use]
    pub fn key(crawl: &str, url: &str) -> SeenKey {
        let half = |seed: u64| {
            let mut hasher = std::hash::DefaultHasher::new();
            seed.hash(&mut hasher);
            crawl.hash(&mut hasher);
            url.hash(&mut hasher);
            hasher.finish()
        };
        (u128::from(half(0)) << 64) | u128::from(half(1))
    }

    /// Whether the frontier acknowledged the link at `depth` or shallower.
    #[must_use]
    pub fn knows(&self, key: SeenKey, depth: u32) -> bool {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .depth_of
            .get(&key)
            .is_some_and(|seen| *seen <= depth)
    }

    /// Records that the frontier acknowledged the link at `depth`.
    pub fn insert(&self, key: SeenKey, depth: u32) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.depth_of.get_mut(&key) {
            Some(seen) => *seen = (*seen).min(depth),
            None => {
                while entries.order.len() >= self.capacity {
                    if let Some(oldest) = entries.order.pop_front() {
                        entries.depth_of.remove(&oldest);
                    }
                }
                entries.depth_of.insert(key, depth);
                entries.order.push_back(key);
            }
        }
    }

    /// Links held now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .depth_of
            .len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_link_is_known_at_its_depth_and_deeper_only() {
        let cache = SeenCache::new(10);
        let key = SeenCache::key("c", "http://a/x");
        assert!(!cache.knows(key, 3));
        cache.insert(key, 3);
        assert!(cache.knows(key, 3) && cache.knows(key, 4));
        assert!(!cache.knows(key, 2), "a shallower link is sent again");
        cache.insert(key, 1);
        assert!(cache.knows(key, 2));
        assert_ne!(key, SeenCache::key("d", "http://a/x"), "per crawl");
    }

    #[test]
    fn a_cache_of_nothing_knows_nothing() {
        let cache = SeenCache::new(0);
        let key = SeenCache::key("c", "http://a/x");
        cache.insert(key, 0);
        assert!(!cache.knows(key, 5));
        assert!(cache.is_empty());
    }

    proptest! {
        /// Whatever is inserted, the cache stays within its bound and never
        /// knows a link it was not told of at that depth or shallower.
        #[test]
        fn bounded_and_never_knows_more_than_it_was_told(
            inserts in proptest::collection::vec((0..50_u8, 0..5_u32), 0..200),
            capacity in 0..20_usize,
        ) {
            let cache = SeenCache::new(capacity);
            let mut told: HashMap<u8, u32> = HashMap::new();
            for (link, depth) in inserts {
                let key = SeenCache::key("c", &format!("http://a/{link}"));
                cache.insert(key, depth);
                let shallowest = told.entry(link).or_insert(depth);
                *shallowest = (*shallowest).min(depth);
                prop_assert!(cache.len() <= capacity);
                for (other, shallowest) in &told {
                    let key = SeenCache::key("c", &format!("http://a/{other}"));
                    for depth in 0..5 {
                        if cache.knows(key, depth) {
                            prop_assert!(depth >= *shallowest);
                        }
                    }
                }
            }
        }
    }
}
