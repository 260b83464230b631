//! A damaged store is refused, never reset, and the operator's tools see
//! and salvage it; a full disk stops writes without losing anything and
//! writes resume when there is room. Each case runs the real `frontier`
//! binary on a store whose acknowledged URLs live in its write-ahead log
//! (killed with SIGKILL right after the acks).

use std::path::{Path, PathBuf};
use std::process::Command;

use crawl_tests::{FrontierProcess, binary};
use proto::urlfrontier::{
    CountUrlParams, DiscoveredBatch, ListUrlParams, QueueWithinCrawlParams, UrlInfo,
    ack_message::Status as Ack,
};

const CRAWL: &str = "damage";

fn url(i: usize) -> String {
    format!("http://h{}.example/page/{i}", i % 29)
}

/// Sends `urls` as PutDiscovered batches of 100 on one stream; answers
/// the URLs acknowledged OK and how many were answered FAIL.
async fn put_discovered(frontier: &FrontierProcess, urls: &[String]) -> (Vec<String>, usize) {
    let mut client = frontier.client().await;
    let batches: Vec<DiscoveredBatch> = urls
        .chunks(100)
        .enumerate()
        .map(|(i, chunk)| DiscoveredBatch {
            id: i.to_string(),
            done: None,
            items: chunk
                .iter()
                .map(|url| UrlInfo {
                    url: url.clone(),
                    crawl_id: CRAWL.into(),
                    ..UrlInfo::default()
                })
                .collect(),
        })
        .collect();
    let mut acks = client
        .put_discovered(futures::stream::iter(batches))
        .await
        .expect("PutDiscovered opens")
        .into_inner();
    let (mut ok, mut failed) = (Vec::new(), 0);
    while let Some(ack) = acks.message().await.expect("acks") {
        let batch: usize = ack.id.parse().unwrap();
        for (j, status) in ack.statuses.iter().enumerate() {
            match Ack::try_from(*status).unwrap() {
                Ack::Ok => ok.push(urls[batch * 100 + j].clone()),
                Ack::Fail => failed += 1,
                Ack::Skipped => {}
            }
        }
    }
    (ok, failed)
}

async fn count_urls(frontier: &FrontierProcess) -> u64 {
    frontier
        .client()
        .await
        .count_ur_ls(CountUrlParams {
            crawl_id: CRAWL.into(),
            ..CountUrlParams::default()
        })
        .await
        .expect("CountURLs")
        .into_inner()
        .value
}

/// Every URL of `urls` is stored (read in one ListURLs stream).
async fn assert_stored(frontier: &FrontierProcess, urls: &[String]) {
    let mut stream = frontier
        .client()
        .await
        .list_ur_ls(ListUrlParams {
            size: u32::MAX,
            crawl_id: CRAWL.into(),
            ..ListUrlParams::default()
        })
        .await
        .expect("ListURLs")
        .into_inner();
    let mut stored = std::collections::HashSet::new();
    while let Some(item) = stream.message().await.expect("a URL item") {
        stored.insert(item.id);
    }
    let missing: Vec<&String> = urls.iter().filter(|url| !stored.contains(*url)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged URLs missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

/// A store killed right after acknowledging 3,000 URLs: they are in its
/// log, not yet in a redb checkpoint. They are sent 100 at a time, each
/// call answered before the next, so the log holds many records (a
/// damaged last record cannot be told from the torn write of a crash, so
/// the cases below damage records with others after them).
async fn killed_store(root: &Path) -> (PathBuf, Vec<String>) {
    let data = root.join("image");
    let frontier = FrontierProcess::start(&data, &["--partitions", "8"]);
    let urls: Vec<String> = (0..3_000).map(url).collect();
    let mut acked = Vec::new();
    for chunk in urls.chunks(100) {
        let (ok, failed) = put_discovered(&frontier, chunk).await;
        assert_eq!((ok.len(), failed), (chunk.len(), 0));
        acked.extend(ok);
    }
    frontier.kill();
    (data, acked)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `frontier serve` on `data` must exit with an error naming `file`, and
/// leave the directory's files, and the log byte for byte, as they were.
fn assert_refused(data: &Path, file: &str) -> String {
    let log_before = std::fs::read(data.join("frontier.wal")).ok();
    let files_before = names(data);
    let log = match FrontierProcess::try_start(data, &["--partitions", "8"]) {
        Ok(_) => panic!("a store with a damaged {file} was opened"),
        Err(log) => log,
    };
    assert!(
        log.contains(file),
        "the refusal does not name {file}:\n{log}"
    );
    assert_eq!(names(data), files_before, "files were removed or created");
    assert!(
        std::fs::read(data.join("frontier.wal")).ok() == log_before,
        "the log was changed"
    );
    log
}

fn frontier_tool(args: &[&str]) -> (i32, String) {
    let output = Command::new(binary("frontier"))
        .args(args)
        .output()
        .expect("frontier runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_empty_or_damaged_store_files_are_refused_verified_and_salvaged() {
    let root = tempfile::tempdir().unwrap();
    let (image, acked) = killed_store(root.path()).await;
    let case = |name: &str| {
        let dir = root.path().join(name);
        copy_dir(&image, &dir);
        dir
    };
    let data = case("main-missing");
    std::fs::remove_file(data.join("frontier.redb")).unwrap();
    let log = assert_refused(&data, "frontier.redb");
    assert!(log.contains("salvage"), "{log}");
    let data = case("main-empty");
    std::fs::write(data.join("frontier.redb"), b"").unwrap();
    assert_refused(&data, "frontier.redb");
    let data = case("urls-empty");
    std::fs::write(data.join("urls.redb"), b"").unwrap();
    assert_refused(&data, "urls.redb");
    let data = case("log-missing");
    std::fs::remove_file(data.join("frontier.wal")).unwrap();
    assert_refused(&data, "frontier.wal");
    let log_len = std::fs::metadata(image.join("frontier.wal")).unwrap().len() as usize;
    let data = case("log-shortened");
    let bytes = std::fs::read(data.join("frontier.wal")).unwrap();
    std::fs::write(data.join("frontier.wal"), &bytes[..log_len / 2]).unwrap();
    assert_refused(&data, "frontier.wal");
    // A byte flipped in the first record, and one in a record in the
    // middle: intact records follow both, so neither is a torn tail.
    let flipped = case("log-flipped-early");
    flip_byte(&flipped.join("frontier.wal"), 200);
    let log = assert_refused(&flipped, "frontier.wal");
    assert!(log.contains("damaged at byte"), "{log}");
    let data = case("log-flipped-middle");
    let written = bytes.iter().rposition(|&b| b != 0).unwrap();
    flip_byte(&data.join("frontier.wal"), written / 2);
    assert_refused(&data, "frontier.wal");

    // verify: the intact image is healthy, the damaged one is not; it
    // changes neither.
    let image_arg = image.to_str().unwrap();
    let (code, out) = frontier_tool(&["verify", "--data-dir", image_arg]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: healthy"), "{out}");
    let (code, out) = frontier_tool(&["verify", "--data-dir", flipped.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("PROBLEM") && out.contains("damaged at byte"),
        "{out}"
    );
    let (code, out) = frontier_tool(&["verify", "--data-dir", image_arg, "--json"]);
    assert_eq!(code, 0, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["healthy"], true);

    // salvage of the intact image holds every acknowledged URL; of the
    // damaged log, everything but the damaged record's URLs.
    let whole = root.path().join("salvaged-whole");
    let (code, out) = frontier_tool(&[
        "salvage",
        "--data-dir",
        image_arg,
        "--into",
        whole.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    // Where the salvaged store's bytes go: its urls table has an entry per
    // URL, and its serving order one per URL to crawl.
    let (code, out) = frontier_tool(&["verify", "--data-dir", whole.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let figure_before = |marker: &str| -> u64 {
        let at = out
            .find(marker)
            .unwrap_or_else(|| panic!("{marker:?} in {out}"));
        out[..at].rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(figure_before(" URLs ("), acked.len() as u64, "{out}");
    let due = figure_before(" URLs to crawl");
    assert!(
        out.contains(&format!("table url_records: {} entries", acked.len())),
        "{out}"
    );
    assert!(
        out.contains(&format!("table serving_order: {due} entries")),
        "{out}"
    );
    assert!(out.contains("in its tables"), "{out}");
    let frontier = FrontierProcess::start(&whole, &["--partitions", "8"]);
    assert_eq!(count_urls(&frontier).await, acked.len() as u64);
    assert_stored(&frontier, &acked).await;
    drop(frontier);
    let partial = root.path().join("salvaged-partial");
    let (code, out) = frontier_tool(&[
        "salvage",
        "--data-dir",
        flipped.to_str().unwrap(),
        "--into",
        partial.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    let frontier = FrontierProcess::start(&partial, &["--partitions", "8"]);
    let salvaged = count_urls(&frontier).await;
    assert!(
        salvaged > 0 && salvaged < acked.len() as u64,
        "salvaged {salvaged} of {}",
        acked.len()
    );
    drop(frontier);
    // The refused stores were left for the operator, and the original
    // still opens with everything.
    let frontier = FrontierProcess::start(&image, &["--partitions", "8"]);
    assert_stored(&frontier, &acked).await;
}

/// A tmpfs mounted for the test and unmounted when it ends.
struct Mount(PathBuf);

/// The disk-filling tests run one at a time. Each sizes its disk and floor
/// for one frontier whose store applier keeps up: beside other frontiers
/// filling disks on two cores, an applier falls behind and its copies to
/// redb rewrite more pages than the floor's margin for held writes
/// allows for.
static ONE_DISK_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Mount {
    fn tmpfs(path: &Path, megabytes: u64) -> Option<Self> {
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(path)
            .status()
            .ok()?;
        status.success().then(|| Self(path.to_owned()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn free_bytes(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn health(frontier: &FrontierProcess) -> i32 {
    let channel = tonic::transport::Channel::from_shared(frontier.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "urlfrontier.URLFrontier".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// Polls the health service until it answers `status` (the frontier
/// looks at its disk every second).
async fn wait_for_health(frontier: &FrontierProcess, status: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while health(frontier).await != status {
        assert!(
            std::time::Instant::now() < deadline,
            "health never became {status}; the frontier's log:\n{}",
            frontier.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_writes_and_they_resume_when_there_is_room() {
    let _alone = ONE_DISK_AT_A_TIME.lock().await;
    use tonic_health::pb::health_check_response::ServingStatus;
    let root = tempfile::tempdir().unwrap();
    let Some(mount) = Mount::tmpfs(&root.path().join("disk"), 96) else {
        eprintln!("SKIPPED: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let data = mount.0.join("data");
    let frontier = FrontierProcess::start(&data, &["--partitions", "8", "--min-free-mb", "24"]);
    let before: Vec<String> = (0..1_000).map(url).collect();
    let (ok, _) = put_discovered(&frontier, &before).await;
    assert_eq!(ok.len(), before.len());
    wait_for_health(&frontier, ServingStatus::Serving as i32).await;

    // Fill the disk to below the floor.
    let filler = mount.0.join("filler");
    let room = free_bytes(&mount.0);
    std::fs::write(&filler, vec![1_u8; (room - (8 << 20)) as usize]).unwrap();
    let during: Vec<String> = (1_000..2_000).map(url).collect();
    let (ok, failed) = put_discovered(&frontier, &during).await;
    assert_eq!(
        (ok.len(), failed),
        (0, during.len()),
        "writes on a full disk"
    );
    wait_for_health(&frontier, ServingStatus::NotServing as i32).await;
    // Reads go on; unary writes say why they fail.
    assert_eq!(count_urls(&frontier).await, 1_000);
    let status = frontier
        .client()
        .await
        .block_queue_until(proto::urlfrontier::BlockQueueParams {
            key: "h1.example".into(),
            time: 1,
            crawl_id: CRAWL.into(),
            local: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("disk"), "{status:?}");
    let log = frontier.log_text();
    assert!(
        log.matches("PutDiscovered batch failed").count() <= 2,
        "warnings are not rate-limited:\n{log}"
    );

    // Room again: writes resume without a restart, and nothing is lost.
    std::fs::remove_file(&filler).unwrap();
    wait_for_health(&frontier, ServingStatus::Serving as i32).await;
    let (ok, failed) = put_discovered(&frontier, &during).await;
    assert_eq!((ok.len(), failed), (during.len(), 0));
    let stats = frontier
        .client()
        .await
        .get_stats(QueueWithinCrawlParams {
            crawl_id: CRAWL.into(),
            ..QueueWithinCrawlParams::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.size, 2_000);
    frontier.kill();
    let frontier = FrontierProcess::start(&data, &["--partitions", "8", "--min-free-mb", "24"]);
    assert_stored(&frontier, &before).await;
    assert_stored(&frontier, &during).await;
    drop(frontier);
    drop(mount);
}

/// Fills `dir`'s file system to the last byte; answers the filler.
fn fill_completely(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler-full");
    let mut file = std::fs::File::create(&filler).unwrap();
    let chunk = vec![1_u8; 1 << 20];
    loop {
        if file.write_all(&chunk).is_err() {
            break;
        }
    }
    let mut byte = [1_u8];
    while file.write_all(&byte).is_ok() {
        byte[0] = 1;
    }
    filler
}

/// With no floor, the disk fills under the store itself. Whichever write
/// meets it first (the log growing, or a checkpoint of redb, whose files
/// then refuse every call), health says NOT_SERVING; once there is room the
/// frontier grows its log, or reopens redb's files in place and replays
/// its log, with no restart, and loses nothing acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_filled_under_redb_is_recovered_without_a_restart() {
    let _alone = ONE_DISK_AT_A_TIME.lock().await;
    use tonic_health::pb::health_check_response::ServingStatus;
    let root = tempfile::tempdir().unwrap();
    let Some(mount) = Mount::tmpfs(&root.path().join("disk"), 64) else {
        eprintln!("SKIPPED: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let data = mount.0.join("data");
    let args = ["--partitions", "8", "--min-free-mb", "0"];
    let frontier = FrontierProcess::start(&data, &args);
    let mut acked = Vec::new();
    let first: Vec<String> = (0..1_000).map(url).collect();
    let (ok, _) = put_discovered(&frontier, &first).await;
    acked.extend(ok);
    let filler = fill_completely(&mount.0);
    // Writes go on into the log's allocated room until the log must grow
    // or a redb write (a checkpoint, every few seconds) meets the full disk.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut next = 1_000;
    loop {
        let batch: Vec<String> = (next..next + 100).map(url).collect();
        next += 100;
        let (ok, failed) = put_discovered(&frontier, &batch).await;
        acked.extend(ok);
        if failed > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes never failed on a full disk"
        );
    }
    wait_for_health(&frontier, ServingStatus::NotServing as i32).await;
    std::fs::remove_file(&filler).unwrap();
    wait_for_health(&frontier, ServingStatus::Serving as i32).await;
    let log = frontier.log_text();
    assert!(
        log.contains("store files reopened") || log.contains("log has room again"),
        "{log}"
    );
    assert_stored(&frontier, &acked).await;
    let after: Vec<String> = (next..next + 500).map(url).collect();
    let (ok, failed) = put_discovered(&frontier, &after).await;
    assert_eq!((ok.len(), failed), (after.len(), 0));
    acked.extend(ok);
    frontier.kill();
    let frontier = FrontierProcess::start(&data, &args);
    assert_stored(&frontier, &acked).await;
    assert_eq!(count_urls(&frontier).await, acked.len() as u64);
    drop(frontier);
    drop(mount);
}

/// The probe's case: `--min-free-mb 8` on a small disk. The floor holds
/// (writes are refused for the floor, never by ENOSPC with room left, the
/// log's allocations included); once room is freed writes resume without
/// a restart and go on; after a kill -9, a start with a floor above what
/// is free comes up read-only (reads served, health NOT_SERVING) with
/// every acknowledged URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_floor_holds_and_a_start_below_it_comes_up_read_only() {
    let _alone = ONE_DISK_AT_A_TIME.lock().await;
    use tonic_health::pb::health_check_response::ServingStatus;
    let root = tempfile::tempdir().unwrap();
    let Some(mount) = Mount::tmpfs(&root.path().join("disk"), 96) else {
        eprintln!("SKIPPED: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let data = mount.0.join("data");
    let args = [
        "--partitions",
        "8",
        "--min-free-mb",
        "8",
        "--cache-mb",
        "16",
    ];
    let frontier = FrontierProcess::start(&data, &args);
    // Room the test frees later.
    let filler = mount.0.join("filler");
    std::fs::write(&filler, vec![1_u8; 32 << 20]).unwrap();
    // Writes until they are refused for good: a refusal while writes held
    // in memory are promised to the files lifts once they are written, if
    // the floor is still there.
    let mut acked = Vec::new();
    let mut next = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let batch: Vec<String> = (next..next + 500).map(url).collect();
        next += 500;
        let (ok, failed) = put_discovered(&frontier, &batch).await;
        acked.extend(ok);
        // The health service looks at the store every second.
        if failed > 0 && health(&frontier).await == ServingStatus::NotServing as i32 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the disk never filled"
        );
    }
    let free_at_refusal = free_bytes(&mount.0);
    let log = frontier.log_text();
    assert!(
        !log.contains("No space left") && !log.contains("halted"),
        "a write met the full disk instead of the floor ({} MiB free):\n{log}",
        free_at_refusal >> 20
    );
    assert!(
        free_at_refusal >= 7 << 20,
        "{} MiB free",
        free_at_refusal >> 20
    );
    // Room again: writes resume without a restart, and go on.
    std::fs::remove_file(&filler).unwrap();
    wait_for_health(&frontier, ServingStatus::Serving as i32).await;
    for _ in 0..6 {
        let batch: Vec<String> = (next..next + 500).map(url).collect();
        next += 500;
        let (ok, failed) = put_discovered(&frontier, &batch).await;
        assert_eq!(failed, 0, "writes stopped again:\n{}", frontier.log_text());
        acked.extend(ok);
    }
    // Killed, and started with a floor above what the disk can free: it
    // comes up read-only, with every acknowledged URL.
    frontier.kill();
    let high_floor = [
        "--partitions",
        "8",
        "--min-free-mb",
        "4000",
        "--cache-mb",
        "16",
    ];
    let frontier = FrontierProcess::try_start(&data, &high_floor)
        .unwrap_or_else(|log| panic!("a start below the floor exited:\n{log}"));
    wait_for_health(&frontier, ServingStatus::NotServing as i32).await;
    assert_eq!(count_urls(&frontier).await, acked.len() as u64);
    frontier.kill();
    let frontier = FrontierProcess::start(&data, &args);
    assert_eq!(count_urls(&frontier).await, acked.len() as u64);
    assert_stored(&frontier, &acked).await;
    drop(frontier);
    drop(mount);
}
