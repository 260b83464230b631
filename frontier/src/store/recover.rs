//! Reopening the store's files in place after a failed write.
//!
//! redb refuses every call on a file once one of its writes failed (a full
//! disk, say) until the file is reopened. The files are then closed and
//! opened again, which takes them back to their last durable commit, and
//! the write-ahead log's records after it are replayed: every group
//! acknowledged is back, with no restart. This is done only when it is
//! exact: when every group the log holds was applied to both files and
//! seen by the scheduler (a group that failed on its way was taken out of
//! the log, and a checkpoint that failed left the log whole). After a
//! failure between the two files' stages, or a failed sync of the log, a
//! restart is what mends the store. A log that could not grow for lack of
//! room failed before anything was applied: it only needs the room.

use redb::ReadableDatabase;

use super::names::Names;
use super::schema::urls_lsn;
use super::{Files, QueueCounts, Store, StoreError, URLS_FILE_NAME, UrlKeys};
use crate::wal;

impl Store {
    /// Reopens the files if a failed write left them unusable, or grows the
    /// log if it lacked room to, once the disk has room again; answers
    /// whether it did.
    pub fn recover_if_needed(&self) -> Result<bool, StoreError> {
        if self.check_poisoned().is_ok() {
            // A log that could not grow needs no reopening, only room.
            return Ok(self.lock_writer().wal.grow_again()?);
        }
        self.check_space()?;
        self.recover()?;
        Ok(true)
    }

    fn recover(&self) -> Result<(), StoreError> {
        let mut writer = self.lock_writer();
        writer.wal.check_writable()?;
        // No applier writes meanwhile; what is held is in the log, which
        // the reopened files replay.
        let _applying = self.held.lock_applying();
        let mut main_file = self.lock_main_file();
        Self::check_main_file(&main_file)?;
        if !self.holding() && main_file.lsn != writer.wal.last_lsn() {
            return Err(StoreError::Closed(format!(
                "group {} was applied to one file only; restart the server",
                main_file.lsn.saturating_add(1)
            )));
        }
        self.forget_records_snapshot();
        let mut files = self.files.take_whole();
        // Closed first: a file's lock goes with its last handle.
        drop(files.take());
        let data_dir = self.data_dir().to_owned();
        let reopened = (|| -> Result<(Files, Names, u64), StoreError> {
            let db = Self::open_file(&self.path, self.cache_bytes)?;
            let urls_db = Self::open_file(
                &data_dir.join(URLS_FILE_NAME),
                super::open::urls_page_cache(self.cache_bytes),
            )?;
            let durable = urls_lsn(&urls_db.begin_read()?)?;
            let records = wal::read_records(&data_dir, durable)?.records;
            // The names as the reopened file has them, with those of the
            // groups replayed.
            let names = super::locks::OrderedRwLock::new(
                super::locks::Rank::Names,
                Names::load(&urls_db.begin_read()?)?,
            );
            let keys = UrlKeys {
                names: &names,
                hasher: self.hasher,
            };
            let last = Self::replay(
                &db,
                &urls_db,
                &keys,
                &self.path,
                writer.wal.path(),
                &records,
            )?;
            let names = names.into_inner();
            Ok((Files { db, urls_db }, names, last))
        })();
        let (reopened, names, last) =
            reopened.map_err(|error| StoreError::Closed(error.to_string()))?;
        if last != writer.wal.last_lsn() {
            return Err(StoreError::Closed(format!(
                "the log replays up to group {last}, but groups up to {} were applied",
                writer.wal.last_lsn()
            )));
        }
        *files = Some(reopened);
        drop(files);
        // The files hold every group now. (Readers take what is held
        // before the files: it goes after they are released.)
        {
            let mut held = self.held.write();
            *held = super::held::Held::default();
            self.held.note_unwritten(&held);
        }
        // What refills read of the files before is not what they hold now.
        self.recent_reads.clear();
        *self.names.write() = names;
        // The replay made every group durable, queue counts included.
        *self.lock_counts() = QueueCounts::default();
        writer.wal.checkpointed();
        main_file.lsn = last;
        self.files.cure();
        tracing::info!(
            last,
            "store files reopened and the write-ahead log replayed; writes resume"
        );
        Ok(())
    }
}
