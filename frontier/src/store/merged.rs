//! Reads that merge what is held in memory (module `held`) over a
//! snapshot of the files: the snapshot opened off the held lock, checking
//! that no layer was let go in between, and [`Merged`], a table's entries
//! with what is held of them in key order.

use std::sync::Arc;

use redb::ReadableDatabase;

use super::held::{Held, HeldOrder, OrderKey};
use super::records::RecordsRead;
use super::{Store, StoreError};

/// How often a read opens its snapshot off the held lock, a layer being
/// let go meanwhile each time, before it opens one under the lock.
pub(super) const SNAPSHOT_TRIES: usize = 2;

impl Store {
    /// A copy of what is held (`copy`), and a snapshot of `url_records`
    /// that holds whatever is no longer held: the applier's, if it has
    /// one, else one of the read's own ([`Self::held_and_snapshot`]).
    pub(super) fn held_and_records<T>(
        &self,
        mut copy: impl FnMut(&Held) -> T,
    ) -> Result<(T, Arc<Option<RecordsRead>>), StoreError> {
        {
            let held = self.held.read();
            if let Some(snapshot) = &held.snapshot {
                return Ok((copy(&held), Arc::clone(snapshot)));
            }
        }
        let (copied, table) = self.held_and_snapshot(copy, Self::records_snapshot)?;
        Ok((copied, Arc::new(table)))
    }

    /// What is held of `serving_order` keys in `range`, and a snapshot of
    /// `frontier.redb` that holds whatever is no longer held.
    pub(super) fn held_order_in(
        &self,
        range: impl std::ops::RangeBounds<OrderKey> + Clone,
    ) -> Result<(HeldOrder, redb::ReadTransaction), StoreError> {
        self.held_and_snapshot(
            |held| held.order_in(range.clone()),
            |files| Ok(files.db.begin_read()?),
        )
    }

    /// Tests: runs what was set to run at `point`.
    #[cfg(test)]
    pub(super) fn race_point(&self, point: &str) {
        let hook = {
            let mut race = self.held.race.lock().unwrap();
            match *race {
                Some((at, _)) if at == point => race.take(),
                _ => None,
            }
        };
        if let Some((_, hook)) = hook {
            hook(self);
        }
    }

    #[cfg(not(test))]
    pub(super) fn race_point(&self, _point: &str) {}

    /// A copy of what is held, and a snapshot of a file that holds
    /// whatever is no longer held. The snapshot is opened off the held
    /// lock: opening one sometimes waits on redb's locks for as long as a
    /// large commit takes, and under the lock it held up every group
    /// behind it. It holds what any layer let go before it held if no
    /// layer was let go between a look before it and the copy (a layer is
    /// let go after both files hold it); else this tries again, and at
    /// last opens it under the lock.
    pub(super) fn held_and_snapshot<T, S>(
        &self,
        mut copy: impl FnMut(&Held) -> T,
        open: impl Fn(&super::Files) -> Result<S, StoreError>,
    ) -> Result<(T, S), StoreError> {
        for _ in 0..SNAPSHOT_TRIES {
            let before = self.held.read().released();
            let read = open(&*self.files()?)?;
            self.race_point("snapshot opened");
            let held = self.held.read();
            if held.released() == before {
                return Ok((copy(&held), read));
            }
        }
        let held = self.held.read();
        let read = open(&*self.files()?)?;
        Ok((copy(&held), read))
    }
}

/// A table's entries merged with a newer run of changes to them, in key
/// order: a newer value replaces the table's, a newer removal (`None`)
/// drops it. The newer run is what is held in memory ([`Merged::new`]),
/// or the recent records over the base table (module `records`).
pub(super) struct Merged<N: Iterator, I: Iterator> {
    newer: std::iter::Peekable<N>,
    stored: std::iter::Peekable<I>,
}

/// A newer run that cannot fail: what is held.
type HeldRun<K, V> = std::iter::Map<
    std::vec::IntoIter<(K, Option<V>)>,
    fn((K, Option<V>)) -> Result<(K, Option<V>), StoreError>,
>;

impl<K, V, I> Merged<HeldRun<K, V>, I>
where
    I: Iterator<Item = Result<(K, V), StoreError>>,
{
    pub(super) fn new(held: Vec<(K, Option<V>)>, stored: I) -> Self {
        Self::over(held.into_iter().map(Ok as fn(_) -> _), stored)
    }
}

impl<N: Iterator, I: Iterator> Merged<N, I> {
    pub(super) fn over(newer: N, stored: I) -> Self {
        Self {
            newer: newer.peekable(),
            stored: stored.peekable(),
        }
    }
}

impl<K: Ord + Copy, V, N, I> Iterator for Merged<N, I>
where
    N: Iterator<Item = Result<(K, Option<V>), StoreError>>,
    I: Iterator<Item = Result<(K, V), StoreError>>,
{
    type Item = Result<(K, V), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let stored_key = match self.stored.peek() {
                Some(Ok((key, _))) => Some(*key),
                Some(Err(_)) => return self.stored.next(),
                None => None,
            };
            let newer_key = match self.newer.peek() {
                Some(Ok((key, _))) => Some(*key),
                Some(Err(_)) => {
                    return match self.newer.next() {
                        Some(Err(error)) => Some(Err(error)),
                        _ => None,
                    };
                }
                None => None,
            };
            match (newer_key, stored_key) {
                (None, None) => return None,
                (Some(newer), stored) if stored.is_none_or(|stored| newer <= stored) => {
                    if stored == Some(newer) {
                        self.stored.next();
                    }
                    match self.newer.next()? {
                        Ok((key, Some(value))) => return Some(Ok((key, value))),
                        Ok((_, None)) => continue,
                        Err(error) => return Some(Err(error)),
                    }
                }
                _ => return self.stored.next(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_entries_replace_and_remove_stored_ones_in_key_order() {
        let stored = vec![(1, "a"), (3, "c"), (5, "e"), (7, "g")];
        let held = vec![
            (0, Some("z")),
            (3, Some("C")),
            (5, None),
            (6, Some("f")),
            (9, None),
        ];
        let merged: Vec<(i32, &str)> = Merged::new(held, stored.into_iter().map(Ok))
            .collect::<Result<_, StoreError>>()
            .unwrap();
        assert_eq!(merged, [(0, "z"), (1, "a"), (3, "C"), (6, "f"), (7, "g")]);
    }
}
