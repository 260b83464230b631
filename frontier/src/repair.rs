//! The operator's tools for a store the frontier refuses to open:
//! [`verify`] reads every file and record and says what is wrong, and
//! [`salvage`] copies whatever can be read into a new store. Neither runs
//! by itself and neither changes the store it reads (its files are opened
//! read-only); a running frontier's store is refused, as it holds the lock.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::partitioning::PartitionBy;
use crate::record::UrlRecord;
use crate::store::inspect::{MainFile, TableSpace, UrlsFile};
use crate::store::{self, NewUrl, SCHEMA_VERSION, Store, StoreError, WriteOp};
use crate::wal::{self, LogRecord};

/// How many damaged records are named one by one before they are counted.
const NAMED_PROBLEMS: usize = 20;

/// URL records copied per salvage transaction.
const SALVAGE_BATCH: usize = 4096;

/// Why salvage could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    /// The target already holds a store.
    #[error("{0} already holds store files: salvage writes into a new, empty directory")]
    TargetNotEmpty(PathBuf),
    /// Nothing of the source store could be read.
    #[error("nothing of the store in {0} can be read: {1}")]
    NothingReadable(PathBuf, String),
    /// The new store failed.
    #[error("the new store: {0}")]
    Store(#[from] StoreError),
}

/// What verify or salvage found: facts, and problems.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// What was read, a line each.
    pub findings: Vec<String>,
    /// What is wrong, a line each; empty for a healthy store.
    pub problems: Vec<String>,
}

impl Report {
    /// Whether nothing is wrong.
    #[must_use]
    pub fn healthy(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report as JSON.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "healthy": self.healthy(),
            "findings": self.findings,
            "problems": self.problems,
        })
    }

    /// Where a file's bytes go, a line for it and one per table holding
    /// anything: what to look at when a store takes more disk than its
    /// URLs explain.
    fn space(&mut self, path: &Path, tables: Result<Vec<TableSpace>, StoreError>) {
        let tables = match tables {
            Ok(tables) => tables,
            Err(error) => {
                self.problem(format!(
                    "the space of {}'s tables cannot be read: {error}",
                    path.display()
                ));
                return;
            }
        };
        let Ok(length) = std::fs::metadata(path).map(|m| m.len()) else {
            return;
        };
        let in_tables: u64 = tables.iter().map(TableSpace::total).sum();
        self.findings.push(format!(
            "{}: {length} bytes, {in_tables} in its tables, {} free (kept by the file for later writes)",
            path.display(),
            length.saturating_sub(in_tables)
        ));
        for table in tables.iter().filter(|t| t.rows > 0) {
            self.findings.push(format!(
                "  table {}: {} entries; {} bytes of keys and values ({:.1} an entry), {} of B-tree structure, {} unused in its pages",
                table.name,
                table.rows,
                table.stored,
                table.stored as f64 / table.rows as f64,
                table.metadata,
                table.fragmented,
            ));
        }
    }

    fn problem(&mut self, text: String) {
        self.problems.push(text);
    }

    /// Names the first damaged records, then counts the rest.
    fn damaged(&mut self, named: &mut usize, text: impl FnOnce() -> String) {
        *named += 1;
        if *named <= NAMED_PROBLEMS {
            self.problems.push(text());
        }
    }

    fn more_damaged(&mut self, named: usize, what: &str) {
        if named > NAMED_PROBLEMS {
            self.problems.push(format!(
                "... and {} more damaged {what}",
                named - NAMED_PROBLEMS
            ));
        }
    }
}

fn store_id_text(id: Option<u64>) -> String {
    id.map_or_else(|| "no store ID".to_owned(), |id| format!("store {id:016x}"))
}

/// What verify learnt of `frontier.redb`.
struct MainSummary {
    store_id: Option<u64>,
    applied_lsn: u64,
    due_entries: u64,
}

/// What verify learnt of `urls.redb`.
struct UrlsSummary {
    store_id: Option<u64>,
    applied_lsn: u64,
    /// The serving order entries its URLs not completed need.
    serving_keys: u64,
}

/// Reads every file and record of the store in `data_dir` and reports
/// whether it opens with nothing lost.
#[must_use]
pub fn verify(data_dir: &Path) -> Report {
    let mut report = Report::default();
    let main = verify_main(data_dir, &mut report);
    let urls = verify_urls(data_dir, &mut report);
    if let (Some(main), Some(urls)) = (&main, &urls)
        && main.store_id != urls.store_id
    {
        report.problem(format!(
            "{} belongs to {}, {} to {}: the files come from different stores",
            store::FILE_NAME,
            store_id_text(main.store_id),
            store::URLS_FILE_NAME,
            store_id_text(urls.store_id),
        ));
    }
    let pending = verify_log(data_dir, main.as_ref(), urls.as_ref(), &mut report);
    if let (Some(main), Some(urls), Some(0)) = (&main, &urls, pending)
        && main.due_entries != urls.serving_keys
    {
        report.problem(format!(
            "the serving order in {} has {} entries where the URLs not completed in {} need {}",
            store::FILE_NAME,
            main.due_entries,
            store::URLS_FILE_NAME,
            urls.serving_keys,
        ));
    }
    report
}

fn verify_main(data_dir: &Path, report: &mut Report) -> Option<MainSummary> {
    let main = match MainFile::open(data_dir) {
        Ok(main) => main,
        Err(error) => {
            report.problem(error.to_string());
            return None;
        }
    };
    if (store::OLDEST_SCHEMA_READ_AS_IS..SCHEMA_VERSION).contains(&main.schema) {
        // Laid out as this schema reads it.
        report.findings.push(format!(
            "{}: schema {}, read as it is; `frontier serve` marks it {SCHEMA_VERSION} at its next start",
            main.path.display(),
            main.schema
        ));
    } else if main.schema != SCHEMA_VERSION {
        report.problem(format!(
            "{} has schema version {}; this build verifies version {SCHEMA_VERSION} (`frontier serve` migrates older stores when it opens them)",
            main.path.display(),
            main.schema
        ));
    }
    let mut named = 0;
    let queues = main.for_each_queue(|crawl, queue, record| {
        if let Err(error) = record {
            report.damaged(&mut named, || {
                format!("queue {queue:?} of crawl {crawl:?} has a damaged record: {error}")
            });
        }
    });
    report.more_damaged(named, "queue records");
    let due_entries = main.count_serving_order();
    let mut summary = MainSummary {
        store_id: main.store_id,
        applied_lsn: main.applied_lsn,
        due_entries: 0,
    };
    match (queues, due_entries) {
        (Ok(queues), Ok(due)) => {
            summary.due_entries = due;
            report.findings.push(format!(
                "{}: schema {}, {}, holds log records up to {}, {} partitions, {queues} queues, {due} URLs to crawl in its serving order",
                main.path.display(),
                main.schema,
                store_id_text(main.store_id),
                main.applied_lsn,
                main.partitions.map_or_else(|| "no".to_owned(), |p| p.to_string()),
            ));
        }
        (Err(error), _) | (_, Err(error)) => {
            report.problem(format!(
                "{} cannot be read to the end: {error}",
                main.path.display()
            ));
        }
    }
    report.space(&main.path, main.space());
    Some(summary)
}

fn verify_urls(data_dir: &Path, report: &mut Report) -> Option<UrlsSummary> {
    let urls = match UrlsFile::open(data_dir) {
        Ok(urls) => urls,
        Err(error) => {
            report.problem(error.to_string());
            return None;
        }
    };
    let (mut named, mut completed) = (0, 0_u64);
    let read = urls.for_each_url(|_, crawl, url, record| match record {
        Ok(record) if record.is_completed() => completed += 1,
        Ok(_) => {}
        Err(error) => report.damaged(&mut named, || {
            format!("the record of {url} in crawl {crawl:?} is damaged: {error}")
        }),
    });
    report.more_damaged(named, "URL records");
    let mut serving_keys = 0;
    match read {
        Ok(scan) => {
            serving_keys = scan.serving_keys;
            report.findings.push(format!(
                "{}: {}, holds log records up to {}, {} URLs ({completed} completed)",
                urls.path.display(),
                store_id_text(urls.store_id),
                urls.applied_lsn,
                scan.urls,
            ));
        }
        Err(error) => report.problem(format!(
            "{} cannot be read to the end: {error}",
            urls.path.display()
        )),
    }
    report.space(&urls.path, urls.space());
    Some(UrlsSummary {
        store_id: urls.store_id,
        applied_lsn: urls.applied_lsn,
        serving_keys,
    })
}

/// Reports the log; answers how many records a start would replay, when
/// that is known.
fn verify_log(
    data_dir: &Path,
    main: Option<&MainSummary>,
    urls: Option<&UrlsSummary>,
    report: &mut Report,
) -> Option<usize> {
    let durable = urls.map_or(0, |u| u.applied_lsn);
    let inspection = match wal::inspect(data_dir, durable) {
        Ok(inspection) => inspection,
        Err(error) => {
            report.problem(error.to_string());
            return None;
        }
    };
    let path = wal::path_in(data_dir);
    let expected = main.and_then(|m| m.store_id);
    if inspection.version == 2 && inspection.store_id != expected {
        report.problem(format!(
            "{} belongs to {}, not to {}",
            path.display(),
            store_id_text(inspection.store_id),
            store_id_text(expected)
        ));
    }
    if let Some(capacity) = inspection.capacity
        && inspection.length < capacity
    {
        report.problem(format!(
            "{} is {} bytes but was allocated {capacity}: it was cut short",
            path.display(),
            inspection.length
        ));
    }
    let scan = &inspection.scan;
    let pending: Vec<&LogRecord> = scan.records.iter().filter(|r| r.lsn > durable).collect();
    report.findings.push(format!(
        "{}: format {}, {}, {} records to replay{}{}",
        path.display(),
        inspection.version,
        store_id_text(inspection.store_id),
        pending.len(),
        match (pending.first(), pending.last()) {
            (Some(first), Some(last)) => format!(" ({} to {})", first.lsn, last.lsn),
            _ => String::new(),
        },
        if scan.torn_tail {
            ", then the incomplete record of a crash (never acknowledged)"
        } else {
            ""
        }
    ));
    for (offset, lsn, reason) in &scan.undecodable {
        report.problem(format!(
            "{}: record {lsn} at byte {offset} passes its checksum but cannot be decoded: {reason}",
            path.display()
        ));
    }
    if let Some((offset, later)) = scan.later.first() {
        report.problem(format!(
            "{} is damaged at byte {} (where record {} should be), and {} intact records follow from record {} at byte {offset}: acknowledged writes are there",
            path.display(),
            scan.end,
            scan.next_lsn,
            scan.later.len(),
            later.lsn
        ));
    }
    if let Some(urls) = urls {
        if let Some(first) = pending.first()
            && first.lsn != urls.applied_lsn.saturating_add(1)
        {
            report.problem(format!(
                "{} lacks records {} to {}, which {} needs",
                path.display(),
                urls.applied_lsn.saturating_add(1),
                first.lsn.saturating_sub(1),
                store::URLS_FILE_NAME
            ));
        }
        let last = pending.last().map_or(urls.applied_lsn, |r| r.lsn);
        if let Some(main) = main
            && last < main.applied_lsn
        {
            report.problem(format!(
                "{} holds records up to {}, but {} has applied up to {}: records {} to {} are missing",
                path.display(),
                last,
                store::FILE_NAME,
                main.applied_lsn,
                last.saturating_add(1),
                main.applied_lsn
            ));
        }
    }
    Some(pending.len())
}

/// Copies whatever can be read of the store in `from` into a new store in
/// `into`: every readable URL record (or, when `urls.redb` cannot be read,
/// every URL of the serving order, without metadata), queue settings, seeds
/// and default delays, then every intact log record after what the files
/// hold, in order, also those after a damaged one. The report says what was
/// copied and what could not be read.
pub fn salvage(from: &Path, into: &Path) -> Result<Report, RepairError> {
    for name in [store::FILE_NAME, store::URLS_FILE_NAME, wal::FILE_NAME] {
        if into.join(name).exists() {
            return Err(RepairError::TargetNotEmpty(into.to_owned()));
        }
    }
    let mut report = Report::default();
    let main = MainFile::open(from)
        .map_err(|error| report.problem(error.to_string()))
        .ok();
    let urls = UrlsFile::open(from)
        .map_err(|error| report.problem(error.to_string()))
        .ok();
    let base = urls
        .as_ref()
        .map(|u| u.applied_lsn)
        .or(main.as_ref().map(|m| m.applied_lsn))
        .unwrap_or(0);
    let log = wal::inspect(from, base)
        .map_err(|error| report.problem(error.to_string()))
        .ok();
    if main.is_none() && urls.is_none() && log.is_none() {
        return Err(RepairError::NothingReadable(
            from.to_owned(),
            report.problems.join("; "),
        ));
    }
    let partitions = match main.as_ref().and_then(|m| m.partitions) {
        Some(partitions) => partitions,
        None => partitions_seen(urls.as_ref(), &mut report),
    };
    let partition_by = match main.as_ref().map(|m| (m.partition_by, m.partitions)) {
        Some((Some(code), _)) => match PartitionBy::from_code(code) {
            Some(by) => by,
            None => partitioning_seen(urls.as_ref(), partitions, &mut report),
        },
        // A store that recorded its count and not this partitions by host.
        Some((None, Some(_))) => PartitionBy::Host,
        _ => partitioning_seen(urls.as_ref(), partitions, &mut report),
    };
    let store = Store::open(into)?;
    // Before the count: a new store records the partitioning it is given.
    store.partition_by(partition_by)?;
    store.partitions(partitions)?;
    let mut copier = Copier {
        store: &store,
        batch: Vec::with_capacity(SALVAGE_BATCH),
        copied: 0,
        failure: None,
    };
    match (&urls, &main) {
        (Some(urls), _) => copy_url_records(urls, &mut copier, &mut report)?,
        (None, Some(main)) => copy_serving_order(main, &mut copier, &mut report)?,
        (None, None) => report.problem("no URL records could be read".to_owned()),
    }
    let copied = copier.finish()?;
    report
        .findings
        .push(format!("copied {copied} URLs into {}", into.display()));
    if let Some(main) = &main {
        copy_settings(main, &store, &mut report)?;
    }
    if let Some(log) = log {
        apply_intact_log(log, base, &store, &mut report)?;
    }
    store.checkpoint()?;
    Ok(report)
}

/// Writes salvaged URLs into the new store in batches; the first failed
/// write stops the copy.
struct Copier<'a> {
    store: &'a Store,
    batch: Vec<WriteOp>,
    copied: u64,
    failure: Option<StoreError>,
}

impl Copier<'_> {
    fn add(&mut self, op: WriteOp) {
        if self.failure.is_some() {
            return;
        }
        self.batch.push(op);
        self.copied += 1;
        if self.batch.len() == SALVAGE_BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.batch.is_empty() && self.failure.is_none() {
            self.failure = self.store.apply(&self.batch).err();
            self.batch.clear();
        }
    }

    /// Writes what is left; answers how many URLs were copied.
    fn finish(mut self) -> Result<u64, StoreError> {
        self.flush();
        match self.failure {
            Some(error) => Err(error),
            None => Ok(self.copied),
        }
    }

    fn failed(&self) -> bool {
        self.failure.is_some()
    }
}

/// Copies every readable URL record; damaged ones are named in the report.
fn copy_url_records(
    urls: &UrlsFile,
    copier: &mut Copier<'_>,
    report: &mut Report,
) -> Result<(), RepairError> {
    let mut named = 0;
    let read = urls.for_each_url(|partition, crawl, url, record| match record {
        Ok(record) => copier.add(discovered(partition, crawl, url, record)),
        Err(error) => report.damaged(&mut named, || {
            format!("not copied: the record of {url} in crawl {crawl:?} is damaged: {error}")
        }),
    });
    report.more_damaged(named, "URL records not copied");
    if copier.failed() {
        return Ok(()); // the copier's finish answers the failure
    }
    if let Err(error) = read {
        report.problem(format!(
            "{} could be read only up to a point: {error}",
            urls.path.display()
        ));
    }
    Ok(())
}

/// With `urls.redb` unreadable: the URLs still to crawl, from the serving
/// order in `frontier.redb` (without metadata, depth or creation date).
fn copy_serving_order(
    main: &MainFile,
    copier: &mut Copier<'_>,
    report: &mut Report,
) -> Result<(), RepairError> {
    let read = main.for_each_legacy_due(|crawl, queue, due_at, url, partition| {
        let record = UrlRecord {
            due_at,
            queue_key: queue.to_owned(),
            ..UrlRecord::default()
        };
        copier.add(discovered(partition, crawl, url, record));
    });
    if copier.failed() {
        return Ok(());
    }
    report.problem(format!(
        "the URL records were not readable: the URLs still to crawl were taken from the serving order in {} (without metadata, depth or creation date); completed URLs are not known",
        main.path.display()
    ));
    if let Err(error) = read {
        report.problem(format!(
            "{} could be read only up to a point: {error}",
            main.path.display()
        ));
    }
    Ok(())
}

/// Applies every intact log record after `base`, in order, also those
/// after a damaged one.
fn apply_intact_log(
    log: wal::Inspection,
    base: u64,
    store: &Store,
    report: &mut Report,
) -> Result<(), RepairError> {
    if !log.scan.later.is_empty() {
        report.problem(format!(
            "the log is damaged at byte {} (record {}): that record could not be read and its writes are lost; the {} intact records after it were applied",
            log.scan.end,
            log.scan.next_lsn,
            log.scan.later.len()
        ));
    }
    let mut records: BTreeMap<u64, Vec<WriteOp>> = BTreeMap::new();
    for record in log
        .scan
        .records
        .into_iter()
        .chain(log.scan.later.into_iter().map(|(_, r)| r))
    {
        if record.lsn > base {
            records.entry(record.lsn).or_insert(record.ops);
        }
    }
    let count = records.len();
    for ops in records.into_values() {
        store.apply(&ops)?;
    }
    report
        .findings
        .push(format!("applied {count} log records after record {base}"));
    if !log.scan.undecodable.is_empty() {
        report.problem(format!(
            "{} log records could not be decoded and were not applied",
            log.scan.undecodable.len()
        ));
    }
    Ok(())
}

fn discovered(partition: u32, crawl: &str, url: &str, record: UrlRecord) -> WriteOp {
    WriteOp::Discover(NewUrl {
        crawl: crawl.to_owned(),
        url: url.to_owned(),
        partition,
        maybe_known: false,
        record,
    })
}

/// The partition count when `frontier.redb` cannot say: one more than the
/// highest partition a URL key has.
fn partitions_seen(urls: Option<&UrlsFile>, report: &mut Report) -> u32 {
    let mut highest = None;
    if let Some(urls) = urls {
        let _ = urls.for_each_url(|partition, _, _, _| {
            highest = Some(highest.map_or(partition, |h: u32| h.max(partition)));
        });
    }
    let partitions = highest.map_or(
        crate::ingest::FilterConfig::default().partitions as u32,
        |h| h + 1,
    );
    report.problem(format!(
        "the partition count is not recorded where it could be read; the new store takes {partitions} (start it with --partitions {partitions})"
    ));
    partitions
}

/// What URL keys' partitions follow when `frontier.redb` cannot say: the
/// way that puts every URL read where it is (by host where both do).
fn partitioning_seen(urls: Option<&UrlsFile>, partitions: u32, report: &mut Report) -> PartitionBy {
    let (mut host_misses, mut domain_misses) = (0_u64, 0_u64);
    if let Some(urls) = urls {
        let _ = urls.for_each_url(|partition, crawl, url, _| {
            let Some(host) = url::Url::parse(url)
                .ok()
                .and_then(|url| url.host_str().map(str::to_owned))
            else {
                return;
            };
            let home = |by: PartitionBy| by.partition(crawl, &host, partitions as usize);
            host_misses += u64::from(home(PartitionBy::Host) != partition as usize);
            domain_misses += u64::from(home(PartitionBy::Domain) != partition as usize);
        });
    }
    let by = if domain_misses < host_misses {
        PartitionBy::Domain
    } else {
        PartitionBy::Host
    };
    report.problem(format!(
        "what partitions follow is not recorded where it could be read; the URLs read sit \
         where partitions by {} put them, which the new store takes",
        by.name()
    ));
    by
}

/// Copies queue settings, seeds, default delays and the paused flag.
fn copy_settings(main: &MainFile, store: &Store, report: &mut Report) -> Result<(), StoreError> {
    let mut settings = Vec::new();
    let read = main.for_each_queue(|crawl, queue, record| {
        if let Ok(record) = record
            && (record.blocked_until != 0 || record.delay_ms.is_some() || record.crawl_limit != 0)
        {
            settings.push((crawl.to_owned(), queue.to_owned(), record));
        }
    });
    if let Err(error) = read {
        report.problem(format!(
            "queue settings could be read only up to a point: {error}"
        ));
    }
    for (crawl, queue, old) in &settings {
        store.update_queue_settings(crawl, queue, |record| {
            record.blocked_until = old.blocked_until;
            record.delay_ms = old.delay_ms;
            record.crawl_limit = old.crawl_limit;
        })?;
    }
    let mut seeds: BTreeMap<String, Vec<String>> = BTreeMap::new();
    match main.seed_hosts() {
        Ok(hosts) => {
            for (crawl, host) in hosts {
                seeds.entry(crawl).or_default().push(host);
            }
        }
        Err(error) => report.problem(format!("seed hosts could not be read: {error}")),
    }
    for (crawl, hosts) in &seeds {
        store.add_seed_hosts(crawl, hosts)?;
    }
    match main.default_delays() {
        Ok(delays) => {
            for (crawl, secs) in delays {
                store.set_default_delay(&crawl, secs)?;
            }
        }
        Err(error) => report.problem(format!("default delays could not be read: {error}")),
    }
    if main.paused {
        store.set_serving_paused(true)?;
    }
    report.findings.push(format!(
        "copied the settings of {} queues and the seeds of {} crawls",
        settings.len(),
        seeds.len()
    ));
    Ok(())
}
