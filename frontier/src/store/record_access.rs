//! [`RecordAccess`]: how a group's first stage reaches `url_records`, so
//! that applying a group knows nothing of where the records live.

use super::StoreError;
use super::schema::RecordKey;

/// Where a group's first stage reads and writes URL records: the table
/// itself, or (writes held in memory, module `held`) a view over it.
pub(super) trait RecordAccess {
    /// The value of a key.
    fn get(&self, key: RecordKey) -> Result<Option<Vec<u8>>, StoreError>;
    /// Sets a key's value; answers the one it replaced. Values are given
    /// whole, so that a view holding them in memory keeps them uncopied.
    fn insert(&mut self, key: RecordKey, value: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError>;
    /// [`Self::insert`] of a key the files are known not to hold: a view
    /// over them need not look there for what it replaced.
    fn insert_new(
        &mut self,
        key: RecordKey,
        value: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.insert(key, value)
    }
    /// [`Self::insert`] for a caller that has read the key's value
    /// already: a view over the files need not read it again.
    fn replace(&mut self, key: RecordKey, value: Vec<u8>) -> Result<(), StoreError> {
        self.insert(key, value).map(drop)
    }
}
