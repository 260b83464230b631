//! The store's two redb files as one part with its own locks: the files
//! themselves (read for every call, taken whole by a reopening) and
//! whether a failed write left them unusable. redb refuses every call
//! after a failed write until its file is reopened (module `recover`).

use redb::Database;

use super::StoreError;
use super::locks::{OrderedMutex, OrderedReadGuard, OrderedRwLock, OrderedWriteGuard, Rank};

/// The files and their poisoning.
pub(super) struct StoreFiles {
    /// `None` only while a recovery that failed left them closed.
    open: OrderedRwLock<Option<Files>>,
    /// Set when a write to the files failed.
    poisoned: OrderedMutex<Option<Poison>>,
}

/// What failed when a write left the files unusable.
#[derive(Debug, Clone)]
pub(super) struct Poison {
    reason: String,
    disk_full: bool,
}

/// The store's two redb files.
pub(super) struct Files {
    /// `frontier.redb`: everything but the `urls` table.
    pub(super) db: Database,
    /// `urls.redb`: the `urls` table.
    pub(super) urls_db: Database,
}

/// The files, read-locked for a call (a recovery takes them whole).
pub(super) struct FilesGuard<'a>(OrderedReadGuard<'a, Option<Files>>);

impl std::ops::Deref for FilesGuard<'_> {
    type Target = Files;

    fn deref(&self) -> &Files {
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("checked when the guard was made"))
    }
}

impl StoreFiles {
    pub(super) fn new(files: Files) -> Self {
        Self {
            open: OrderedRwLock::new(Rank::Files, Some(files)),
            poisoned: OrderedMutex::new(Rank::Poisoned, None),
        }
    }

    /// The files, read-locked for one call.
    pub(super) fn get(&self) -> Result<FilesGuard<'_>, StoreError> {
        let files = self.open.read();
        if files.is_none() {
            return Err(StoreError::Closed(
                "closed at shutdown, or an earlier reopening failed".to_owned(),
            ));
        }
        Ok(FilesGuard(files))
    }

    /// The files taken whole, to close or reopen them.
    pub(super) fn take_whole(&self) -> OrderedWriteGuard<'_, Option<Files>> {
        self.open.write()
    }

    /// Fails while a failed write keeps the files unusable.
    pub(super) fn check_poisoned(&self) -> Result<(), StoreError> {
        match &*self.poisoned.lock() {
            Some(poison) => Err(StoreError::Poisoned {
                reason: poison.reason.clone(),
                disk_full: poison.disk_full,
            }),
            None => Ok(()),
        }
    }

    /// Records that a failed write left the files unusable until reopened.
    pub(super) fn note_failure(&self, error: &StoreError) {
        if error.poisons() {
            let poison = Poison {
                reason: error.to_string(),
                disk_full: error.is_disk_full(),
            };
            tracing::error!(%error, "a write to the store's files failed; writes refused until they are reopened");
            self.poisoned.lock().get_or_insert(poison);
        }
    }

    /// The files were reopened: writes may go on.
    pub(super) fn cure(&self) {
        *self.poisoned.lock() = None;
    }
}
