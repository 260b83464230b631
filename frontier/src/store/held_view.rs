//! The URL records a group staged in memory reads and writes: its own
//! writes over the groups held before it, over what refills kept of
//! `urls.redb`, over the file itself.

use std::cell::Cell;
use std::collections::BTreeMap;

use super::StoreError;
use super::recent_reads::RecentReads;
use super::record_access::RecordAccess;
use super::records::RecordsRead;
use super::schema::RecordKey;

/// What the groups held before a group hold of URL records (module
/// `held` keeps them); the view reads them through this, so that it does
/// not depend on how they are kept.
pub(super) trait HeldBefore {
    /// What is held of a key, copied: `Some(None)` if removed.
    fn record(&self, key: &RecordKey) -> Option<Option<Vec<u8>>>;
}

/// URL records as a group held in memory sees them: its own writes, then
/// what is held, then `urls.redb`.
pub(super) struct HeldView<'h, 't, H: HeldBefore> {
    pub(super) held: &'h H,
    /// What refills read of the file, which `table` holds too.
    pub(super) recent: &'h RecentReads,
    pub(super) table: Option<&'t RecordsRead>,
    pub(super) own: BTreeMap<RecordKey, Vec<u8>>,
    /// Keys looked up in `urls.redb`.
    pub(super) files_read: Cell<u64>,
}

impl<H: HeldBefore> RecordAccess for HeldView<'_, '_, H> {
    fn get(&self, key: RecordKey) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(value) = self.own.get(&key) {
            return Ok(Some(value.clone()));
        }
        if let Some(value) = self.held.record(&key) {
            return Ok(value);
        }
        if let Some(value) = self.recent.take(&key) {
            return Ok(Some(value));
        }
        self.files_read.set(self.files_read.get() + 1);
        match self.table {
            Some(table) => table.get(key),
            None => Ok(None),
        }
    }

    fn insert(&mut self, key: RecordKey, value: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        let previous = self.get(key)?;
        self.own.insert(key, value);
        Ok(previous)
    }

    fn insert_new(
        &mut self,
        key: RecordKey,
        value: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let previous = match self.own.get(&key) {
            Some(value) => Some(value.clone()),
            None => self.held.record(&key).flatten(),
        };
        self.own.insert(key, value);
        Ok(previous)
    }

    fn replace(&mut self, key: RecordKey, value: Vec<u8>) -> Result<(), StoreError> {
        self.own.insert(key, value);
        Ok(())
    }
}
