//! `frontier.redb`'s side of the write path as one part with its own lock:
//! its transactions run under the lock, which also holds the last group
//! the file has applied, and whoever waits for a group's second stage is
//! woken when it is in (or when a second stage failed).

use std::sync::Condvar;

use super::StoreError;
use super::locks::{OrderedMutex, OrderedMutexGuard, Rank};

/// The main file's progress and its waiters.
pub(super) struct MainFile {
    progress: OrderedMutex<MainFileProgress>,
    applied: Condvar,
}

/// The second stage's progress.
pub(super) struct MainFileProgress {
    /// The last group whose changes `frontier.redb` holds.
    pub(super) lsn: u64,
    /// Set when a second stage failed: `urls.redb` then holds a group
    /// `frontier.redb` does not, and only a restart's replay mends that.
    pub(super) halted: Option<String>,
}

impl MainFileProgress {
    /// Fails once a second stage has failed.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        match &self.halted {
            Some(reason) => Err(StoreError::Halted(reason.clone())),
            None => Ok(()),
        }
    }
}

impl MainFile {
    /// A main file that holds every group up to `lsn`.
    pub(super) fn new(lsn: u64) -> Self {
        Self {
            progress: OrderedMutex::new(Rank::MainFile, MainFileProgress { lsn, halted: None }),
            applied: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> OrderedMutexGuard<'_, MainFileProgress> {
        self.progress.lock()
    }

    /// Wakes whoever waits for a second stage.
    pub(super) fn applied(&self) {
        self.applied.notify_all();
    }

    /// Waits until the file holds every group up to `lsn`.
    pub(super) fn wait_for(&self, lsn: u64) -> Result<(), StoreError> {
        let mut progress = self.lock();
        while progress.lsn < lsn {
            progress.check()?;
            progress = progress.wait_on(&self.applied);
        }
        progress.check()
    }
}
