//! Numbers for crawl IDs and queue keys: the keys of `url_records` and
//! `serving_order` hold them instead of the names, which a store would
//! otherwise keep once per URL, or twice.
//!
//! Both lists live in `urls.redb` (`crawl_names`: number → crawl ID;
//! `queue_names`: number → (crawl number, queue key)) and, whole, in
//! memory: a number is given by a group's first stage, in the same
//! transaction as the first record that uses it, and the memory copy takes
//! it before that transaction commits, so a reader who finds a number in
//! the file always finds its name. Numbers are handed out in order and
//! never reused, and names are never removed (a deleted queue keeps its
//! number for when it comes back): a name costs memory once, not per URL.
//! A group that fails takes back the numbers it gave (they were never
//! committed, so nothing holds them).

use foldhash::HashMap;
use std::sync::Arc;

use redb::ReadableTable;

use super::StoreError;
use super::locks::{OrderedReadGuard, OrderedRwLock, OrderedWriteGuard};
use super::schema::{CRAWL_NAMES, QUEUE_NAMES, open_if_exists};

/// The numbers of a store's crawls and queues, both ways.
#[derive(Debug, Default)]
pub(crate) struct Names {
    crawl_numbers: HashMap<Arc<str>, u32>,
    /// By number; numbers are dense from 0.
    crawls: Vec<Arc<str>>,
    /// Per crawl number, queue key → queue number.
    queue_numbers: HashMap<u32, HashMap<Arc<str>, u32>>,
    /// By number: (crawl number, queue key).
    queues: Vec<(u32, Arc<str>)>,
    /// How many of each list `urls.redb` holds: a group whose writes are
    /// held in memory gives numbers the file takes later (module `held`).
    persisted: NamesMark,
}

/// Names the file does not hold yet: (crawl number, ID) and (queue
/// number, crawl number, key).
pub(super) type NewNames = (Vec<(u32, Arc<str>)>, Vec<(u32, u32, Arc<str>)>);

/// How far the lists go: what a failed group is rolled back to, or what
/// the file holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NamesMark {
    crawls: usize,
    queues: usize,
}

impl Names {
    /// The names a file holds (`urls.redb`, or a read-only copy of it).
    pub(super) fn load(read: &redb::ReadTransaction) -> Result<Self, StoreError> {
        let mut names = Self::default();
        if let Some(table) = open_if_exists(read, CRAWL_NAMES)? {
            for entry in table.iter()? {
                let (number, name) = entry?;
                names.add_crawl_at(number.value(), name.value())?;
            }
        }
        if let Some(table) = open_if_exists(read, QUEUE_NAMES)? {
            for entry in table.iter()? {
                let (number, name) = entry?;
                let (crawl, key) = name.value();
                names.add_queue_at(number.value(), crawl, key)?;
            }
        }
        names.persisted = names.mark();
        Ok(names)
    }

    /// Records that the file holds every number given up to `mark`.
    pub(super) fn persisted_up_to(&mut self, mark: NamesMark) {
        self.persisted.crawls = self.persisted.crawls.max(mark.crawls);
        self.persisted.queues = self.persisted.queues.max(mark.queues);
    }

    /// The names given up to `upto` that the file does not hold yet:
    /// (crawl numbers and IDs, queue numbers and names).
    pub(super) fn unpersisted(&self, upto: NamesMark) -> NewNames {
        let crawls = (self.persisted.crawls..upto.crawls.min(self.crawls.len()))
            .map(|number| (number as u32, self.crawls[number].clone()))
            .collect();
        let queues = (self.persisted.queues..upto.queues.min(self.queues.len()))
            .map(|number| {
                let (crawl, key) = &self.queues[number];
                (number as u32, *crawl, key.clone())
            })
            .collect();
        (crawls, queues)
    }

    fn add_crawl_at(&mut self, number: u32, name: &str) -> Result<(), StoreError> {
        if number as usize != self.crawls.len() || self.crawl_numbers.contains_key(name) {
            return Err(StoreError::BadNames(format!(
                "crawl number {number} ({name:?}) is out of order or repeats a name"
            )));
        }
        let name: Arc<str> = Arc::from(name);
        self.crawl_numbers.insert(name.clone(), number);
        self.crawls.push(name);
        Ok(())
    }

    fn add_queue_at(&mut self, number: u32, crawl: u32, key: &str) -> Result<(), StoreError> {
        let repeated = self
            .queue_numbers
            .get(&crawl)
            .is_some_and(|keys| keys.contains_key(key));
        if number as usize != self.queues.len() || crawl as usize >= self.crawls.len() || repeated {
            return Err(StoreError::BadNames(format!(
                "queue number {number} ({key:?} of crawl number {crawl}) is out of order, repeats a name or names no crawl"
            )));
        }
        let key: Arc<str> = Arc::from(key);
        self.queue_numbers
            .entry(crawl)
            .or_default()
            .insert(key.clone(), number);
        self.queues.push((crawl, key));
        Ok(())
    }

    /// A crawl's number, if it has one.
    pub(crate) fn crawl_number(&self, crawl: &str) -> Option<u32> {
        self.crawl_numbers.get(crawl).copied()
    }

    /// The crawl ID of a number.
    pub(crate) fn crawl_name(&self, number: u32) -> Option<&str> {
        self.crawls.get(number as usize).map(|name| &**name)
    }

    /// A queue's number, if it has one.
    pub(crate) fn queue_number(&self, crawl: u32, key: &str) -> Option<u32> {
        self.queue_numbers.get(&crawl)?.get(key).copied()
    }

    /// The (crawl number, queue key) of a queue number.
    pub(crate) fn queue_name(&self, number: u32) -> Option<(u32, &str)> {
        self.queues
            .get(number as usize)
            .map(|(crawl, key)| (*crawl, &**key))
    }

    /// The key of a queue number; damage (a number no queue has) is an
    /// error naming where it was found.
    pub(crate) fn queue_key(&self, number: u32, found_in: &str) -> Result<&str, StoreError> {
        self.shared_queue_key(number, found_in).map(|key| &**key)
    }

    /// [`Self::queue_key`], shared: what keeps a count change per queue
    /// without a copy of its key.
    pub(crate) fn shared_queue_key(
        &self,
        number: u32,
        found_in: &str,
    ) -> Result<&Arc<str>, StoreError> {
        self.queues
            .get(number as usize)
            .map(|(_, key)| key)
            .ok_or_else(|| {
                StoreError::BadNames(format!(
                    "{found_in} names queue number {number}, which the store does not have"
                ))
            })
    }

    /// The numbers of a crawl's queues.
    pub(crate) fn queues_of(&self, crawl: u32) -> Vec<u32> {
        let mut numbers: Vec<u32> = self
            .queue_numbers
            .get(&crawl)
            .map(|keys| keys.values().copied().collect())
            .unwrap_or_default();
        numbers.sort_unstable();
        numbers
    }

    pub(super) fn mark(&self) -> NamesMark {
        NamesMark {
            crawls: self.crawls.len(),
            queues: self.queues.len(),
        }
    }

    /// Takes back the numbers given since `mark`. A file that took some
    /// of them already (written while the group was worked out) takes them
    /// again with the names they are given next.
    pub(super) fn roll_back(&mut self, mark: NamesMark) {
        self.persisted.crawls = self.persisted.crawls.min(mark.crawls);
        self.persisted.queues = self.persisted.queues.min(mark.queues);
        for (crawl, key) in self.queues.drain(mark.queues..) {
            if let Some(keys) = self.queue_numbers.get_mut(&crawl) {
                keys.remove(&key);
            }
        }
        for number in mark.crawls..self.crawls.len() {
            self.queue_numbers.remove(&(number as u32));
        }
        for name in self.crawls.drain(mark.crawls..) {
            self.crawl_numbers.remove(&name);
        }
    }
}

/// The names of one group's first stage: lookups go to the store's lists;
/// a name they lack is given the next number and added to the lists at
/// once, and written to the file in the group's transaction, or (a group
/// held in memory) by the one that writes it to the file.
pub(super) struct GroupNames<'a, 't> {
    names: &'a OrderedRwLock<Names>,
    tables: Option<NameTables<'t>>,
}

struct NameTables<'t> {
    crawls: redb::Table<'t, u32, &'static str>,
    queues: redb::Table<'t, u32, (u32, &'static str)>,
}

impl<'a, 't> GroupNames<'a, 't> {
    pub(super) fn open(
        names: &'a OrderedRwLock<Names>,
        write: &'t redb::WriteTransaction,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            names,
            tables: Some(NameTables {
                crawls: write.open_table(CRAWL_NAMES)?,
                queues: write.open_table(QUEUE_NAMES)?,
            }),
        })
    }

    /// The names of a group whose writes are held in memory.
    pub(super) fn deferred(names: &'a OrderedRwLock<Names>) -> Self {
        Self {
            names,
            tables: None,
        }
    }

    pub(super) fn read(&self) -> OrderedReadGuard<'a, Names> {
        self.names.read()
    }

    fn write(&self) -> OrderedWriteGuard<'a, Names> {
        self.names.write()
    }

    /// A crawl's number, given now if it has none.
    pub(super) fn crawl_number(&mut self, crawl: &str) -> Result<u32, StoreError> {
        if let Some(number) = self.read().crawl_number(crawl) {
            return Ok(number);
        }
        let mut names = self.write();
        let number = u32::try_from(names.crawls.len())
            .map_err(|_| StoreError::BadNames("the store has used up its crawl numbers".into()))?;
        if let Some(tables) = &mut self.tables {
            tables.crawls.insert(number, crawl)?;
        }
        names.add_crawl_at(number, crawl)?;
        Ok(number)
    }

    /// A queue's number, given now if it has none.
    pub(super) fn queue_number(&mut self, crawl: u32, key: &str) -> Result<u32, StoreError> {
        if let Some(number) = self.read().queue_number(crawl, key) {
            return Ok(number);
        }
        let mut names = self.write();
        let number = u32::try_from(names.queues.len())
            .map_err(|_| StoreError::BadNames("the store has used up its queue numbers".into()))?;
        if let Some(tables) = &mut self.tables {
            tables.queues.insert(number, (crawl, key))?;
        }
        names.add_queue_at(number, crawl, key)?;
        Ok(number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roll_back_forgets_what_the_group_gave() {
        let mut names = Names::default();
        names.add_crawl_at(0, "a").unwrap();
        names.add_queue_at(0, 0, "q").unwrap();
        let mark = names.mark();
        names.add_crawl_at(1, "b").unwrap();
        names.add_queue_at(1, 1, "q").unwrap();
        names.add_queue_at(2, 0, "r").unwrap();
        names.roll_back(mark);
        assert_eq!(names.crawl_number("a"), Some(0));
        assert_eq!(names.crawl_number("b"), None);
        assert_eq!(names.queue_number(0, "q"), Some(0));
        assert_eq!(names.queue_number(0, "r"), None);
        assert_eq!(names.queue_number(1, "q"), None);
        assert_eq!(names.queues_of(0), [0]);
        // The numbers are given again.
        names.add_crawl_at(1, "c").unwrap();
        names.add_queue_at(1, 1, "s").unwrap();
        assert_eq!(names.queue_name(1), Some((1, "s")));
    }

    #[test]
    fn names_out_of_order_or_repeated_are_damage() {
        let mut names = Names::default();
        assert!(names.add_crawl_at(1, "a").is_err());
        names.add_crawl_at(0, "a").unwrap();
        assert!(names.add_crawl_at(1, "a").is_err());
        assert!(names.add_queue_at(0, 1, "q").is_err(), "no crawl 1");
        names.add_queue_at(0, 0, "q").unwrap();
        assert!(names.add_queue_at(1, 0, "q").is_err());
    }
}
