//! The store against a model, with URL hashes cut to two bits so that
//! most URLs share a key with others: every read must still answer each
//! URL exactly, and the serving order hold every URL not completed once.
//! Run with writes applied to the files at once, and held in memory (module
//! `held`) with the applier's steps, checkpoints and crashes among the
//! writes: a crash image must hold every write answered. A discovered URL
//! whose hash no URL ever had is staged as a new key, as the committer's
//! filters would say.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;

use redb::ReadableTableMetadata;

use super::schema::{SERVING_ORDER, open_if_exists};
use super::*;

const QUEUES: [&str; 2] = ["q0", "q1"];

fn url_of(i: u8) -> String {
    format!("http://h{}/u{i}", i % 3)
}

fn open(dir: &Path, held: bool) -> Store {
    let store = Store::open_with_hash_mask(dir, StoreOptions::default(), 0b11).unwrap();
    if held {
        store.hold_writes();
    }
    store
}

#[derive(Debug, Clone)]
enum Op {
    Discover {
        url: u8,
        queue: u8,
        due: u8,
        maybe: bool,
    },
    Report {
        url: u8,
        queue: Option<u8>,
        due: u8,
    },
    DeleteQueue(u8),
    Purge(u8),
    Reopen,
    /// The applier writes what is held (with writes held).
    Apply,
    /// A checkpoint by the applier.
    Checkpoint,
    /// The files as a kill would leave them now, opened and checked.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..24_u8, 0..2_u8, 0..4_u8, any::<bool>())
            .prop_map(|(url, queue, due, maybe)| Op::Discover { url, queue, due, maybe }),
        3 => (0..24_u8, proptest::option::of(0..2_u8), 0..4_u8)
            .prop_map(|(url, queue, due)| Op::Report { url, queue, due }),
        1 => (0..2_u8).prop_map(Op::DeleteQueue),
        1 => (0..4_u8).prop_map(Op::Purge),
        1 => Just(Op::Reopen),
        2 => Just(Op::Apply),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Crash),
    ]
}

/// What the model holds of a URL: (queue, due date, created).
type Model = BTreeMap<String, (String, u64, u64)>;

fn check(store: &Store, model: &Model) -> Result<(), TestCaseError> {
    for i in 0..24 {
        let url = url_of(i);
        let got = store
            .get(1, "c", &url)
            .unwrap()
            .map(|r| (r.queue_key, r.due_at, r.created_at));
        prop_assert_eq!(got.as_ref(), model.get(&url), "get {}", url);
    }
    let known = store
        .known_urls(
            (0..24)
                .map(url_of)
                .collect::<Vec<_>>()
                .iter()
                .map(|u| (1, "c", u.as_str())),
        )
        .unwrap();
    for (i, known) in known.into_iter().enumerate() {
        prop_assert_eq!(known, model.contains_key(&url_of(i as u8)));
    }
    // Every URL once, in pages cut anywhere.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let (page, end) = store
            .partition_page(1, after.as_deref().map(|u| ("c", u)), 2)
            .unwrap();
        after = page.last().map(|(_, url, _)| url.clone()).or(after);
        paged.extend(page.into_iter().map(|(_, url, _)| url));
        if end {
            break;
        }
    }
    paged.sort();
    prop_assert_eq!(paged, model.keys().cloned().collect::<Vec<_>>());
    // The serving order of each queue, read a page of one entry at a time.
    for queue in QUEUES {
        let mut served = Vec::new();
        let mut after = None;
        loop {
            let page = store.due_entries("c", queue, after, 1).unwrap();
            for due in &page.urls {
                served.push((due.due_at, due.url.clone()));
            }
            after = page.last.or(after);
            if page.complete {
                break;
            }
        }
        served.sort();
        let mut expected: Vec<(u64, String)> = model
            .iter()
            .filter(|(_, (q, due, _))| q == queue && *due != 0)
            .map(|(url, (_, due, _))| (*due, url.clone()))
            .collect();
        expected.sort();
        prop_assert_eq!(served, expected, "serving order of {}", queue);
    }
    // URLs of one hash, queue and due date share an entry; no other entry
    // is left.
    let keys: std::collections::BTreeSet<(&str, u64, u64)> = model
        .iter()
        .filter(|(_, (_, due, _))| *due != 0)
        .map(|(url, (queue, due, _))| (queue.as_str(), *due, store.url_hash(url)))
        .collect();
    let due = store.count_due("c", 2, |_| true).unwrap();
    let (now, later) = (due.now, due.later);
    let due_by_2 = keys.iter().filter(|(_, due, _)| *due <= 2).count() as u64;
    prop_assert_eq!((now, later), (due_by_2, keys.len() as u64 - due_by_2));
    // Once what is held is written, held-back removals included, the file
    // has exactly those entries.
    if !store.unapplied() && store.put_off_removals() == 0 {
        let read = store.files().unwrap().db.begin_read().unwrap();
        let entries = open_if_exists(&read, SERVING_ORDER)
            .unwrap()
            .map_or(0, |t| t.len().unwrap());
        prop_assert_eq!(entries, keys.len() as u64);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn colliding_urls_are_each_answered_exactly(
        ops in proptest::collection::vec(op(), 1..40),
        held in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Some(open(dir.path(), held));
        let mut model = Model::new();
        let mut keys_seen = std::collections::BTreeSet::new();
        let mut now = 10;
        for op in ops {
            now += 1;
            let live = store.as_ref().unwrap();
            match op {
                Op::Discover { url, queue, due, maybe } => {
                    let url = url_of(url);
                    let record = UrlRecord {
                        created_at: now,
                        due_at: u64::from(due),
                        queue_key: QUEUES[queue as usize].into(),
                        ..UrlRecord::default()
                    };
                    // Said new as the committer's filters would: no URL
                    // with its hash was ever stored.
                    let new_key = keys_seen.insert(live.url_hash(&url));
                    let discover = [WriteOp::Discover(NewUrl {
                        crawl: "c".into(),
                        url: url.clone(),
                        partition: 1,
                        maybe_known: maybe,
                        record: record.clone(),
                    })];
                    let staged = live.stage_knowing(&discover, &[new_key]).unwrap();
                    let stored = live.finish(staged).unwrap();
                    prop_assert_eq!(
                        stored,
                        vec![Applied::Discovered { stored: !model.contains_key(&url) }]
                    );
                    model.entry(url).or_insert((record.queue_key, record.due_at, now));
                }
                Op::Report { url, queue, due } => {
                    let url = url_of(url);
                    keys_seen.insert(live.url_hash(&url));
                    live.apply(&[WriteOp::Known(KnownUrl {
                        crawl: "c".into(),
                        url: url.clone(),
                        partition: 1,
                        queue_key: queue.map(|q| QUEUES[q as usize].to_owned()),
                        default_queue: QUEUES[0].into(),
                        due_at: u64::from(due),
                        metadata: BTreeMap::new(),
                        now,
                        report: None,
                    })]).unwrap();
                    let queue = queue
                        .map(|q| QUEUES[q as usize].to_owned())
                        .or_else(|| model.get(&url).map(|m| m.0.clone()))
                        .unwrap_or_else(|| QUEUES[0].to_owned());
                    let created = model.get(&url).map_or(now, |m| m.2);
                    model.insert(url, (queue, u64::from(due), created));
                }
                Op::DeleteQueue(queue) => {
                    let queue = QUEUES[queue as usize];
                    live.apply(&[WriteOp::Delete(Deletion {
                        crawl: "c".into(),
                        queue: Some(queue.into()),
                        created_before: None,
                        partitions: 4,
                        partition: None,
                        urls_below: None,
                    })]).unwrap();
                    model.retain(|_, (q, _, _)| q != queue);
                }
                Op::Purge(back) => {
                    let before = now.saturating_sub(u64::from(back) * 3);
                    live.apply(&[WriteOp::Delete(Deletion {
                        crawl: "c".into(),
                        queue: None,
                        created_before: Some(before),
                        partitions: 4,
                        partition: None,
                        urls_below: None,
                    })]).unwrap();
                    model.retain(|_, (_, _, created)| *created >= before);
                }
                Op::Reopen => {
                    drop(store.take());
                    store = Some(open(dir.path(), held));
                }
                Op::Apply => {
                    if held {
                        live.apply_held().unwrap();
                    }
                }
                Op::Checkpoint => {
                    // At the last group written: the log keeps those held.
                    if held {
                        live.checkpoint_held().unwrap();
                    }
                }
                Op::Crash => {
                    let image = tempfile::tempdir().unwrap();
                    let names = [FILE_NAME, URLS_FILE_NAME, crate::wal::FILE_NAME];
                    for name in names {
                        std::fs::copy(dir.path().join(name), image.path().join(name)).unwrap();
                    }
                    check(&open(image.path(), false), &model)?;
                }
            }
            check(store.as_ref().unwrap(), &model)?;
        }
    }
}

/// A filter is rebuilt from record keys: each visited once, with the
/// number of URLs under it, which colliding URLs share.
#[test]
fn record_keys_are_visited_once_with_their_urls() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false);
    let urls: Vec<NewUrl> = (0..24)
        .map(|i| NewUrl {
            crawl: "c".into(),
            url: url_of(i),
            partition: 1,
            maybe_known: false,
            record: UrlRecord {
                due_at: 1,
                queue_key: QUEUES[0].into(),
                ..UrlRecord::default()
            },
        })
        .collect();
    assert!(store.insert_if_absent(&urls).unwrap().iter().all(|s| *s));
    let mut expected: BTreeMap<u64, usize> = BTreeMap::new();
    for url in &urls {
        *expected.entry(store.url_hash(&url.url)).or_default() += 1;
    }
    let mut visited = BTreeMap::new();
    store
        .for_each_key_in_partition(1, |crawl, hash, count| {
            assert_eq!(crawl, "c");
            assert!(visited.insert(hash, count).is_none(), "{hash} twice");
        })
        .unwrap();
    assert!(visited.len() < urls.len(), "hashes of two bits collide");
    assert_eq!(visited, expected);
}
