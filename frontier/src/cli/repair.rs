//! `frontier verify` and `frontier salvage`: the library's repair tools
//! ([`frontier::repair`]) with their output and exit codes.

use std::path::Path;
use std::process::ExitCode;

use frontier::repair::{self, Report};

fn print(report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
        return Ok(());
    }
    for line in &report.findings {
        println!("{line}");
    }
    for line in &report.problems {
        println!("PROBLEM: {line}");
    }
    Ok(())
}

/// Exit 0: the store opens and loses nothing; 1: it has problems.
pub fn verify(data_dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let report = repair::verify(data_dir);
    print(&report, json)?;
    if !json {
        println!(
            "{}",
            if report.healthy() {
                "verdict: healthy"
            } else {
                "verdict: damaged (see PROBLEM lines; `frontier salvage` copies what can be read into a new store)"
            }
        );
    }
    Ok(if report.healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Exit 0: everything was read and copied; 1: the new store holds what
/// could be read, and the report says what could not.
pub fn salvage(from: &Path, into: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let report = repair::salvage(from, into)?;
    print(&report, json)?;
    if !json {
        println!(
            "new store in {}: start it with `frontier serve --data-dir {}`",
            into.display(),
            into.display()
        );
    }
    Ok(if report.healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
