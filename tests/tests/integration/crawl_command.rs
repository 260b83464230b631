//! The single-machine `crawl` binary as a user runs it.

use std::process::{Command, Stdio};

use crawl_tests::binary;
use mock_site::{MockSite, SiteConfig, expected_fetches};

#[test]
fn the_demo_crawls_the_mock_site_and_checks_itself() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(binary("crawl"))
        .args(["--demo", "--out"])
        .arg(dir.path().join("demo"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("crawl finished"), "{text}");
    assert!(text.contains("demo: every page"), "{text}");
    // A clean crawl has nothing to warn of (such as the frontier ending
    // the workers' streams at its stop, every report answered).
    assert!(!text.contains("WARN") && !text.contains("ERROR"), "{text}");
    // Not a terminal: the plain progress line, no bar.
    assert!(text.contains("pages done "), "{text}");
    assert!(!text.contains("ETA"), "{text}");
}

/// On a terminal (a pseudo-terminal from util-linux's `script`), a bar
/// with the rate and ETA, ending at every known URL done.
#[test]
fn on_a_terminal_the_crawl_draws_a_progress_bar() {
    let script = std::path::Path::new("/usr/bin/script");
    if !script.exists() {
        eprintln!("SKIPPED: no /usr/bin/script (util-linux) to give the crawl a terminal");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let typescript = dir.path().join("typescript");
    let command = format!(
        "{} --demo --out {}",
        binary("crawl").display(),
        dir.path().join("demo").display()
    );
    let status = Command::new(script)
        .args(["-qfec", &command])
        .arg(&typescript)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&typescript).unwrap();
    assert!(status.success(), "{text}");
    assert!(text.contains("demo: every page"), "{text}");
    assert!(!text.contains("pages done "), "{text}");
    // The last drawing: every URL known done (the summary says how many).
    let known = text
        .split("URLs known ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the summary names the URLs known");
    assert!(
        text.contains(&format!("{known}/{known} pages")) && text.contains("ETA"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_cleanly_and_the_next_run_resumes() {
    let site = MockSite::start(SiteConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let seed = format!("{}/", site.base());
    let run = move |with_seed: bool| {
        let mut command = Command::new(binary("crawl"));
        if with_seed {
            command.arg(&seed);
        }
        command
            .args([
                "--allow-private",
                "--delay-ms",
                "0",
                "--max-depth",
                "40",
                "--workers",
                "2",
            ])
            .args(["--max-body-bytes", "1048576", "--out"])
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = run(true);
    site.answered_at_least(30).await;
    crawl_tests::signal(&first, rustix::process::Signal::INT);
    let first = tokio::task::spawn_blocking(move || first.wait_with_output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(130), "{text}");
    assert!(
        text.contains("run again with the same --out to resume"),
        "{text}"
    );
    let stopped_at = site.hits().len();

    // No seed the second time: the crawl comes from the directory.
    let second = tokio::task::spawn_blocking(move || run(false).wait_with_output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{text}");
    assert!(text.contains("resuming the crawl"), "{text}");
    assert!(text.contains("after a clean stop"), "{text}");
    assert!(site.hits().len() > stopped_at);
    // A clean stop lets fetches in flight finish and report: nothing is
    // fetched twice.
    let fetched = site.page_fetches();
    assert_eq!(fetched, expected_fetches(&SiteConfig::default(), 40));
}
