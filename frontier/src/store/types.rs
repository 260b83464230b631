//! What the store answers: what each write of a group did, and a queue's
//! stored record. The writes themselves are [`crate::write_ops`].

use crate::record::RecordError;

/// A queue's persistent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueRecord {
    /// URLs the queue holds (completed or not).
    pub urls: u64,
    /// Of those, completed.
    pub completed: u64,
    /// Served from again at this UTC epoch second; 0: not blocked.
    pub blocked_until: u64,
    /// Own minimum milliseconds between serves; `None`: the crawl's
    /// default.
    pub delay_ms: Option<u32>,
    /// Not served once this many URLs are completed; 0: no limit.
    pub crawl_limit: u32,
}

/// Version 1 held the delay in whole seconds; it is read still (records
/// are rewritten in version 2 as they change), so stores of either open.
const QUEUE_RECORD_VERSION: u8 = 2;
const QUEUE_RECORD_VERSION_SECONDS: u8 = 1;
const QUEUE_RECORD_LEN: usize = 1 + 8 + 8 + 8 + 4 + 4;

impl QueueRecord {
    /// The binary form: version, then little-endian urls, completed,
    /// blocked_until, delay in milliseconds (`u32::MAX`: the crawl's
    /// default), crawl_limit.
    #[must_use]
    pub fn encode(&self) -> [u8; QUEUE_RECORD_LEN] {
        let mut out = [0_u8; QUEUE_RECORD_LEN];
        out[0] = QUEUE_RECORD_VERSION;
        out[1..9].copy_from_slice(&self.urls.to_le_bytes());
        out[9..17].copy_from_slice(&self.completed.to_le_bytes());
        out[17..25].copy_from_slice(&self.blocked_until.to_le_bytes());
        out[25..29].copy_from_slice(&self.delay_ms.unwrap_or(u32::MAX).to_le_bytes());
        out[29..33].copy_from_slice(&self.crawl_limit.to_le_bytes());
        out
    }

    /// Reads the binary form.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let version = bytes.first().copied().unwrap_or(0);
        if version != QUEUE_RECORD_VERSION && version != QUEUE_RECORD_VERSION_SECONDS {
            return Err(RecordError::UnknownVersion(version));
        }
        if bytes.len() != QUEUE_RECORD_LEN {
            return Err(RecordError::Truncated);
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or([0; 4]));
        let delay = match u32_at(25) {
            u32::MAX => None,
            secs if version == QUEUE_RECORD_VERSION_SECONDS => {
                // Saturating below the "default" marker.
                Some(secs.saturating_mul(1000).min(u32::MAX - 1))
            }
            ms => Some(ms),
        };
        Ok(Self {
            urls: u64_at(1),
            completed: u64_at(9),
            blocked_until: u64_at(17),
            delay_ms: delay,
            crawl_limit: u32_at(29),
        })
    }
}

/// What a deletion removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// URLs removed.
    pub urls: u64,
    /// Per partition, URLs removed.
    pub per_partition: std::collections::BTreeMap<u32, u64>,
    /// Per queue, what was removed from it.
    pub per_queue: std::collections::BTreeMap<String, RemovedFromQueue>,
}

/// URLs a deletion removed from one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemovedFromQueue {
    /// URLs removed.
    pub urls: u64,
    /// Of those, completed ones.
    pub completed: u64,
}

/// Where a known URL was before a write changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousPlace {
    /// Its queue.
    pub queue_key: String,
    /// Its due date (0: completed).
    pub due_at: u64,
}

/// What one [`crate::write_ops::WriteOp`] did, for the scheduler's memory and the caller's
/// answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A discovered URL: stored (`true`) or already known.
    Discovered {
        /// Whether it was stored.
        stored: bool,
    },
    /// A known URL's new state.
    Known {
        /// Where it was, if the crawl knew it.
        previous: Option<PreviousPlace>,
        /// The queue it is in now.
        queue_key: String,
        /// Its due date now (0: completed): the report's, or the one its
        /// crawl's revisit policy picked.
        due_at: u64,
    },
    /// What a deletion removed.
    Deleted(Removed),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_records_round_trip_and_old_ones_read_their_seconds_as_milliseconds() {
        let record = QueueRecord {
            urls: 7,
            completed: 3,
            blocked_until: 99,
            delay_ms: Some(50),
            crawl_limit: 4,
        };
        assert_eq!(QueueRecord::decode(&record.encode()).unwrap(), record);
        let mut old = record.encode();
        old[0] = QUEUE_RECORD_VERSION_SECONDS;
        old[25..29].copy_from_slice(&2_u32.to_le_bytes());
        assert_eq!(QueueRecord::decode(&old).unwrap().delay_ms, Some(2000));
        old[25..29].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(QueueRecord::decode(&old).unwrap().delay_ms, None);
        old[25..29].copy_from_slice(&5_000_000_u32.to_le_bytes());
        assert_eq!(
            QueueRecord::decode(&old).unwrap().delay_ms,
            Some(u32::MAX - 1)
        );
        old[0] = 9;
        assert!(QueueRecord::decode(&old).is_err());
    }
}
