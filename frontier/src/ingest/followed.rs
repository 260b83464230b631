//! Which leader this store's copy of each partition follows: what a
//! follower taken out of the in-sync set shows to be brought up to date
//! from its leader's notes rather than copied whole. Its copy holds every
//! batch that leader sent it, up to the last it confirmed, exactly when
//! the mark names that leader: the mark is set (durably) before the first
//! batch from a leader is taken, and removed (durably) before any of the
//! partition's URLs are dropped, and again after, so that a batch taken
//! meanwhile does not leave it on a partial copy.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::{Ingest, IngestError};

/// The marks as last read or written (`None`: known to have none).
#[derive(Debug, Default)]
pub(super) struct FollowedMarks(Mutex<HashMap<u32, Option<String>>>);

impl Ingest {
    /// The leader this store's copy of `partition` follows, if any.
    pub fn followed_leader(&self, partition: u32) -> Result<Option<String>, IngestError> {
        let mut marks = self
            .followed
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = marks.get(&partition) {
            return Ok(known.clone());
        }
        let read = self.store.followed_leader(partition)?;
        marks.insert(partition, read.clone());
        Ok(read)
    }

    /// Marks this store's copy of `partition` as following `leader`,
    /// durably, before a batch from it is taken; at once when it does.
    pub fn note_followed(&self, partition: u32, leader: &str) -> Result<(), IngestError> {
        let mut marks = self
            .followed
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(Some(known)) = marks.get(&partition)
            && known == leader
        {
            return Ok(());
        }
        self.store.set_followed_leader(partition, Some(leader))?;
        marks.insert(partition, Some(leader.to_owned()));
        Ok(())
    }

    /// Removes the mark of `partition`, durably: its copy here is about to
    /// lose URLs, or has.
    pub(super) fn forget_followed(&self, partition: u32) -> Result<(), IngestError> {
        let mut marks = self
            .followed
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let known = match marks.get(&partition) {
            Some(known) => known.clone(),
            None => self.store.followed_leader(partition)?,
        };
        // Most partitions dropped were never followed: no durable write.
        if known.is_some() {
            self.store.set_followed_leader(partition, None)?;
        }
        marks.insert(partition, None);
        Ok(())
    }
}
