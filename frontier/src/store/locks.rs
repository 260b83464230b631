//! The store's locks, each with its rank in the one order they are taken
//! ([`Rank`]), and a check of that order in debug builds: a thread that
//! takes a lock while holding one of the same or a later rank panics,
//! naming both, so that a test that would deadlock one day in a thousand
//! fails every time instead. Release builds keep no record and check
//! nothing.
//!
//! A poisoned lock is taken anyway: every holder leaves its state as
//! consistent as a failed write does (the log's length moves only past
//! whole records, counts change only after a commit).

use std::ops::{Deref, DerefMut};
use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

/// The store's locks in the order a thread may take them: one may be
/// taken only while every lock the thread holds comes earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Rank {
    /// A checkpoint of held writes, one at a time; it lets go of
    /// `Applying` before it takes `Writer`.
    Checkpointing,
    /// The log and `urls.redb`'s transactions: groups in one order.
    Writer,
    /// Writing what is held to the files (the applier, a drain, a
    /// reopening).
    Applying,
    /// The held layer's wake-ups (a condition variable's lock; a waiter
    /// reads the held state under it).
    Signal,
    /// `frontier.redb`'s transactions and the second stage's progress.
    MainFile,
    /// The writes held in memory.
    Held,
    /// The two redb files (a reopening takes them whole).
    Files,
    /// The numbers of crawls and queues.
    Names,
    /// Queue count changes not yet in the `queues` table.
    Counts,
    /// The applier's pace.
    Pace,
    /// Why the files are unusable, after a failed write.
    Poisoned,
    /// Records read for refills, kept for the reports that follow
    /// (module `recent_reads`); nothing is taken while it is held.
    RecentReads,
    /// Tests: a hook run at a point of a read.
    #[cfg(test)]
    TestHook,
}

#[cfg(debug_assertions)]
mod order {
    use std::cell::RefCell;

    use super::Rank;

    thread_local! {
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn taking(rank: Rank) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(last) = held.iter().max()
                && *last >= rank
            {
                panic!(
                    "store lock order broken: taking {rank:?} while holding {last:?} \
                     (the order is store::locks::Rank's)"
                );
            }
            held.push(rank);
        });
    }

    pub(super) fn released(rank: Rank) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(at) = held.iter().rposition(|r| *r == rank) {
                held.remove(at);
            }
        });
    }
}

#[cfg(not(debug_assertions))]
mod order {
    use super::Rank;

    #[inline(always)]
    pub(super) fn taking(_: Rank) {}

    #[inline(always)]
    pub(super) fn released(_: Rank) {}
}

/// A rank held by this thread until dropped.
#[derive(Debug)]
struct Held(Rank);

impl Held {
    fn take(rank: Rank) -> Self {
        order::taking(rank);
        Self(rank)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        order::released(self.0);
    }
}

/// A mutex with its rank.
#[derive(Debug)]
pub(super) struct OrderedMutex<T> {
    rank: Rank,
    lock: Mutex<T>,
}

/// A held [`OrderedMutex`].
pub(super) struct OrderedMutexGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    _held: Held,
}

impl<T> OrderedMutex<T> {
    pub(super) const fn new(rank: Rank, value: T) -> Self {
        Self {
            rank,
            lock: Mutex::new(value),
        }
    }

    pub(super) fn lock(&self) -> OrderedMutexGuard<'_, T> {
        let held = Held::take(self.rank);
        OrderedMutexGuard {
            guard: self.lock.lock().unwrap_or_else(PoisonError::into_inner),
            _held: held,
        }
    }
}

impl<T: Default> OrderedMutex<T> {
    pub(super) fn with_default(rank: Rank) -> Self {
        Self::new(rank, T::default())
    }
}

impl<'a, T> OrderedMutexGuard<'a, T> {
    /// Waits on `condvar`, the lock let go meanwhile (its rank stays this
    /// thread's: it takes nothing else while it waits).
    pub(super) fn wait_on(self, condvar: &Condvar) -> Self {
        let Self { guard, _held } = self;
        let guard = condvar.wait(guard).unwrap_or_else(PoisonError::into_inner);
        Self { guard, _held }
    }

    /// As [`Self::wait_on`], for at most `timeout`.
    pub(super) fn wait_on_timeout(self, condvar: &Condvar, timeout: Duration) -> Self {
        let Self { guard, _held } = self;
        let (guard, _) = condvar
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        Self { guard, _held }
    }
}

impl<T> Deref for OrderedMutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for OrderedMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A reader-writer lock with its rank.
#[derive(Debug)]
pub(super) struct OrderedRwLock<T> {
    rank: Rank,
    lock: RwLock<T>,
}

/// A [`OrderedRwLock`] held for reading.
pub(super) struct OrderedReadGuard<'a, T> {
    guard: RwLockReadGuard<'a, T>,
    _held: Held,
}

/// A [`OrderedRwLock`] held for writing.
pub(super) struct OrderedWriteGuard<'a, T> {
    guard: RwLockWriteGuard<'a, T>,
    _held: Held,
}

impl<T> OrderedRwLock<T> {
    pub(super) const fn new(rank: Rank, value: T) -> Self {
        Self {
            rank,
            lock: RwLock::new(value),
        }
    }

    /// The value, the lock consumed.
    pub(super) fn into_inner(self) -> T {
        self.lock
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn read(&self) -> OrderedReadGuard<'_, T> {
        let held = Held::take(self.rank);
        OrderedReadGuard {
            guard: self.lock.read().unwrap_or_else(PoisonError::into_inner),
            _held: held,
        }
    }

    pub(super) fn write(&self) -> OrderedWriteGuard<'_, T> {
        let held = Held::take(self.rank);
        OrderedWriteGuard {
            guard: self.lock.write().unwrap_or_else(PoisonError::into_inner),
            _held: held,
        }
    }
}

impl<T: Default> OrderedRwLock<T> {
    pub(super) fn with_default(rank: Rank) -> Self {
        Self::new(rank, T::default())
    }
}

impl<T> Deref for OrderedReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> Deref for OrderedWriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for OrderedWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_rank_order_pass() {
        let writer = OrderedMutex::new(Rank::Writer, 1);
        let held = OrderedRwLock::new(Rank::Held, 2);
        let a = writer.lock();
        let b = held.read();
        assert_eq!(*a + *b, 3);
        drop(b);
        drop(a);
        // Released ranks are forgotten: the order starts afresh.
        let _b = held.write();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "taking Writer while holding Held")]
    fn a_lock_taken_out_of_order_panics_in_debug_builds() {
        let writer = OrderedMutex::new(Rank::Writer, ());
        let held = OrderedRwLock::new(Rank::Held, ());
        let _held = held.read();
        let _writer = writer.lock();
    }
}
