//! Settings written outside groups (queue settings, default delays, the
//! paused flag, seeds, the partition count, the clean-shutdown token):
//! durable commits of `frontier.redb` under the writer's lock, so the log
//! and the file agree on order; and the file's own marks read back.

use redb::{ReadableDatabase, ReadableTable};

use super::schema::{
    CLEAN_TOKEN_KEY, CRAWL_REVISIT, CRAWL_SETTINGS, FOLLOWED, LEASES_UNTIL_KEY, META,
    PARTITION_BY_KEY, PARTITIONS_KEY, QUEUES, SCHEMA_VERSION_KEY, SEED_HOSTS, SERVING_PAUSED_KEY,
    open_if_exists,
};
use super::{QueueRecord, Store, StoreError, decode_queue};
use crate::partitioning::PartitionBy;

impl Store {
    /// The schema version recorded in the file.
    pub fn schema_version(&self) -> Result<u64, StoreError> {
        let read = self.files()?.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta
            .get(SCHEMA_VERSION_KEY)?
            .map(|v| v.value())
            .unwrap_or(0))
    }

    /// The token a clean shutdown recorded after writing filter snapshots,
    /// if the store has not been written since.
    pub fn clean_shutdown_token(&self) -> Result<Option<u64>, StoreError> {
        let read = self.files()?.db.begin_read()?;
        let meta = read.open_table(META)?;
        Ok(meta.get(CLEAN_TOKEN_KEY)?.map(|v| v.value()))
    }

    /// Records (`Some`) or clears (`None`) the clean-shutdown token, durably.
    /// It is cleared before the first write after start-up, so snapshots are
    /// never trusted for a store that changed after they were taken.
    pub fn set_clean_shutdown_token(&self, token: Option<u64>) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut meta = write.open_table(META)?;
            match token {
                Some(token) => {
                    meta.insert(CLEAN_TOKEN_KEY, token)?;
                }
                None => {
                    meta.remove(CLEAN_TOKEN_KEY)?;
                }
            }
            Ok(())
        })
    }

    /// Changes a queue's settings (not its counts, which stay held in
    /// memory until the next checkpoint), durably.
    pub fn update_queue_settings(
        &self,
        crawl: &str,
        queue: &str,
        change: impl FnOnce(&mut QueueRecord),
    ) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut queues = write.open_table(QUEUES)?;
            let mut record = match queues.get((crawl, queue))? {
                Some(bytes) => decode_queue(crawl, queue, bytes.value())?,
                None => QueueRecord::default(),
            };
            change(&mut record);
            queues.insert((crawl, queue), record.encode().as_slice())?;
            Ok(())
        })
    }

    /// Sets the default delay of a crawl's queues, durably.
    pub fn set_default_delay(&self, crawl: &str, secs: u32) -> Result<(), StoreError> {
        self.write_durably(|write| {
            write.open_table(CRAWL_SETTINGS)?.insert(crawl, secs)?;
            Ok(())
        })
    }

    /// Gives a crawl its own revisit policy (`Some`) or the default again,
    /// durably.
    pub fn set_revisit_policy(
        &self,
        crawl: &str,
        policy: Option<crate::revisit::Policy>,
    ) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut table = write.open_table(CRAWL_REVISIT)?;
            match policy {
                Some(policy) => {
                    table.insert(crawl, policy.encode().as_slice())?;
                }
                None => {
                    table.remove(crawl)?;
                }
            }
            Ok(())
        })
    }

    /// Every crawl's own revisit policy.
    pub fn revisit_policies(&self) -> Result<Vec<(String, crate::revisit::Policy)>, StoreError> {
        let read = self.files()?.db.begin_read()?;
        let Some(table) = open_if_exists(&read, CRAWL_REVISIT)? else {
            return Ok(Vec::new());
        };
        let mut policies = Vec::new();
        for entry in table.iter()? {
            let (crawl, bytes) = entry?;
            let policy = crate::revisit::Policy::decode(bytes.value())
                .ok_or_else(|| StoreError::BadRevisitPolicy(crawl.value().to_owned()))?;
            policies.push((crawl.value().to_owned(), policy));
        }
        Ok(policies)
    }

    /// Records whether serving is paused, durably.
    pub fn set_serving_paused(&self, paused: bool) -> Result<(), StoreError> {
        self.write_durably(|write| {
            write
                .open_table(META)?
                .insert(SERVING_PAUSED_KEY, u64::from(paused))?;
            Ok(())
        })
    }

    /// Records that no lease handed out from now on outlives `millis`
    /// (epoch milliseconds), durably, before such leases go out.
    pub fn set_leases_until(&self, millis: u64) -> Result<(), StoreError> {
        self.write_durably(|write| {
            write.open_table(META)?.insert(LEASES_UNTIL_KEY, millis)?;
            Ok(())
        })
    }

    /// The leader whose writes this store's copy of `partition` holds as
    /// its follower, if recorded (module `schema`, table `followed`).
    pub fn followed_leader(&self, partition: u32) -> Result<Option<String>, StoreError> {
        let read = self.files()?.db.begin_read()?;
        let Some(table) = open_if_exists(&read, FOLLOWED)? else {
            return Ok(None);
        };
        Ok(table.get(partition)?.map(|v| v.value().to_owned()))
    }

    /// Records (`Some`) or removes (`None`) the leader this store's copy
    /// of `partition` follows, durably.
    pub fn set_followed_leader(
        &self,
        partition: u32,
        leader: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut table = write.open_table(FOLLOWED)?;
            match leader {
                Some(leader) => {
                    table.insert(partition, leader)?;
                }
                None => {
                    table.remove(partition)?;
                }
            }
            Ok(())
        })
    }

    /// Registers hosts as seeds of a crawl, durably.
    pub fn add_seed_hosts(&self, crawl: &str, hosts: &[String]) -> Result<(), StoreError> {
        self.write_durably(|write| {
            let mut table = write.open_table(SEED_HOSTS)?;
            for host in hosts {
                table.insert((crawl, host.as_str()), ())?;
            }
            Ok(())
        })
    }

    /// What URLs' partitions follow: `configured` for a new store, as
    /// recorded for any other (by host for a store from before the choice
    /// existed). Read without a write once recorded, as the count is.
    pub fn partition_by(&self, configured: PartitionBy) -> Result<PartitionBy, StoreError> {
        let (by, count) = {
            let read = self.files()?.db.begin_read()?;
            let meta = read.open_table(META)?;
            (
                meta.get(PARTITION_BY_KEY)?.map(|v| v.value()),
                meta.get(PARTITIONS_KEY)?.map(|v| v.value()),
            )
        };
        let code = match (by, count) {
            (Some(code), _) => code,
            (None, Some(_)) => self.record_once(PARTITION_BY_KEY, PartitionBy::Host.code())?,
            (None, None) => self.record_once(PARTITION_BY_KEY, configured.code())?,
        };
        PartitionBy::from_code(code).ok_or_else(|| StoreError::UnknownPartitioning {
            path: self.path.clone(),
            code,
        })
    }

    /// The partition count URL keys were made with; recorded on first use.
    /// Read without a write once recorded, so that a store opens on a disk
    /// too full for writes (read-only until there is room).
    pub fn partitions(&self, configured: u32) -> Result<u32, StoreError> {
        let read = {
            let read = self.files()?.db.begin_read()?;
            let meta = read.open_table(META)?;
            meta.get(PARTITIONS_KEY)?.map(|v| v.value())
        };
        let recorded = match read {
            Some(recorded) => recorded,
            None => self.record_once(PARTITIONS_KEY, u64::from(configured))?,
        };
        u32::try_from(recorded).map_err(|_| StoreError::NotAFrontierStore {
            path: self.path.clone(),
        })
    }

    /// `value` under `key` in `meta` unless a value is there already,
    /// durably; answers the value there now.
    fn record_once(&self, key: &str, value: u64) -> Result<u64, StoreError> {
        self.write_durably(|write| {
            let mut meta = write.open_table(META)?;
            let recorded = meta.get(key)?.map(|v| v.value());
            Ok(match recorded {
                Some(recorded) => recorded,
                None => {
                    meta.insert(key, value)?;
                    value
                }
            })
        })
    }
}
