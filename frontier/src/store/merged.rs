//! Reads that merge what is held in memory (module `held`) over a
//! snapshot of the files: the snapshot opened off the held lock, checking
//! that no layer was let go in between (the merge itself is module
//! `merge`).

use std::sync::Arc;

use redb::ReadableDatabase;

use super::held::{Held, HeldOrder};
use super::records::RecordsRead;
use super::schema::OrderKey;
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
            let mut race = self.held.race.lock();
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
