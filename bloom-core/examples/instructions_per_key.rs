//! Instructions a key that each filter's loop of the peers bench executes,
//! counted by callgrind instead of timed.
//!
//! Why: once a filter is out of cache, a loop of single inserts or queries
//! runs as fast as the CPU can overlap the cache misses of successive keys,
//! and how many keys' misses overlap is set by how many keys' instructions
//! fit in its out-of-order window. So instructions a key decide the
//! one-by-one figures of `cargo bench -p bloom-core --bench peers`, and
//! unlike times on a shared machine they are the same on every run.
//!
//! `cargo run --release -p bloom-core --example instructions_per_key`
//! (needs valgrind) runs itself under callgrind once per loop, collecting
//! only inside that loop's function, and prints markdown tables. The loops
//! mirror the bench's: the same keys, the same calls, every answer
//! consumed; the filters are sized as the bench sizes them at p = 0.01.
//! `-- --keys N` counts over N keys instead of 100 000 (CI runs a small N
//! to check the tool still finds every loop).

use std::error::Error;
use std::path::Path;
use std::process::{Command, Stdio};

use bloom_core::{BloomFilter, FrozenBloomFilter, KeyHash, Layout};
use xxhash_rust::xxh3::{Xxh3Builder, xxh3_64};

#[path = "../benches/common/url_keys.rs"]
mod url_keys;
use url_keys::Keys;

/// Enough keys that the loop's set-up and return vanish in the count.
const DEFAULT_KEYS: usize = 100_000;
const FP_RATE: f64 = 0.01;
/// Set in the child that callgrind runs: the loop to run, and over how
/// many keys.
const CHILD: &str = "INSTRUCTIONS_PER_KEY_LOOP";
const CHILD_KEYS: &str = "INSTRUCTIONS_PER_KEY_KEYS";

/// Defines each counted loop as a function of its own, never inlined, so
/// that callgrind can collect inside it alone.
macro_rules! counted_loops {
    ($($name:ident($filter:ident: $filter_type:ty, $items:ident: $items_type:ty) $body:block)*) => {
        $(
            #[inline(never)]
            fn $name($filter: $filter_type, $items: $items_type) -> usize $body
        )*
    };
}

fn each_key(keys: &Keys, mut answer: impl FnMut(&[u8]) -> bool) -> usize {
    (0..keys.len()).filter(|&i| answer(keys.get(i))).count()
}

fn low_half(hash: KeyHash) -> u64 {
    hash.to_u128() as u64
}

counted_loops! {
    ours_insert_keys(f: &mut BloomFilter, keys: &Keys) { each_key(keys, |k| f.insert_mut(k)) }
    ours_insert_hashes(f: &mut BloomFilter, hashes: &[KeyHash]) {
        hashes.iter().filter(|&&h| f.insert_hashed_mut(h)).count()
    }
    ours_shared_insert_keys(f: &BloomFilter, keys: &Keys) { each_key(keys, |k| f.insert(k)) }
    ours_shared_insert_hashes(f: &BloomFilter, hashes: &[KeyHash]) {
        hashes.iter().filter(|&&h| f.insert_hashed(h)).count()
    }
    ours_query_keys(f: &BloomFilter, keys: &Keys) { each_key(keys, |k| f.contains(k)) }
    ours_query_hashes(f: &BloomFilter, hashes: &[KeyHash]) {
        hashes.iter().filter(|&&h| f.contains_hashed(h)).count()
    }
    ours_frozen_query_keys(f: &FrozenBloomFilter, keys: &Keys) { each_key(keys, |k| f.contains(k)) }
    ours_frozen_query_hashes(f: &FrozenBloomFilter, hashes: &[KeyHash]) {
        hashes.iter().filter(|&&h| f.contains_hashed(h)).count()
    }
    sbbf_insert_keys(f: &mut sbbf_rs_safe::Filter, keys: &Keys) {
        each_key(keys, |k| !f.insert_hash(xxh3_64(k)))
    }
    sbbf_insert_hashes(f: &mut sbbf_rs_safe::Filter, hashes: &[u64]) {
        hashes.iter().filter(|&&h| !f.insert_hash(h)).count()
    }
    sbbf_query_keys(f: &sbbf_rs_safe::Filter, keys: &Keys) {
        each_key(keys, |k| f.contains_hash(xxh3_64(k)))
    }
    sbbf_query_hashes(f: &sbbf_rs_safe::Filter, hashes: &[u64]) {
        hashes.iter().filter(|&&h| f.contains_hash(h)).count()
    }
    sbbf_our_hash_insert_keys(f: &mut sbbf_rs_safe::Filter, keys: &Keys) {
        each_key(keys, |k| !f.insert_hash(low_half(KeyHash::of(k))))
    }
    sbbf_our_hash_query_keys(f: &sbbf_rs_safe::Filter, keys: &Keys) {
        each_key(keys, |k| f.contains_hash(low_half(KeyHash::of(k))))
    }
    fastbloom_insert_keys(f: &mut fastbloom::BloomFilter<Xxh3Builder>, keys: &Keys) {
        each_key(keys, |k| !f.insert(k))
    }
    fastbloom_insert_hashes(f: &mut fastbloom::BloomFilter<Xxh3Builder>, hashes: &[u64]) {
        hashes.iter().filter(|&&h| !f.insert_hash(h)).count()
    }
    fastbloom_query_keys(f: &fastbloom::BloomFilter<Xxh3Builder>, keys: &Keys) {
        each_key(keys, |k| f.contains(k))
    }
    fastbloom_query_hashes(f: &fastbloom::BloomFilter<Xxh3Builder>, hashes: &[u64]) {
        hashes.iter().filter(|&&h| f.contains_hash(h)).count()
    }
    live_batch_query(f: &BloomFilter, hashes: &[KeyHash]) {
        let mut answers = Vec::new();
        f.contains_batch_into(hashes, &mut answers);
        answers.iter().filter(|&&found| found).count()
    }
    frozen_batch_query(f: &FrozenBloomFilter, hashes: &[KeyHash]) {
        let mut answers = Vec::new();
        f.contains_batch_into(hashes, &mut answers);
        answers.iter().filter(|&&found| found).count()
    }
    xxh3_64_alone(_no_filter: (), keys: &Keys) { each_key(keys, |k| xxh3_64(k) & 1 == 0) }
    // Both halves consumed: testing one bit of the low half alone lets
    // the compiler drop the high half's final mix.
    key_hash_alone(_no_filter: (), keys: &Keys) {
        each_key(keys, |k| {
            let hash = KeyHash::of(k).to_u128();
            (hash as u64 ^ (hash >> 64) as u64) & 1 == 0
        })
    }
    key_hash_low_half_alone(_no_filter: (), keys: &Keys) {
        each_key(keys, |k| low_half(KeyHash::of(k)) & 1 == 0)
    }
}

/// The inputs every loop draws on: keys present (inserted) and absent,
/// and their hashes, 128-bit for ours and xxh3-64 for the peers.
struct Inputs {
    present: Keys,
    absent: Keys,
    present_wide: Vec<KeyHash>,
    absent_wide: Vec<KeyHash>,
    present_narrow: Vec<u64>,
    absent_narrow: Vec<u64>,
}

impl Inputs {
    fn new(keys: usize) -> Self {
        let present = Keys::urls(1, keys);
        let absent = Keys::urls(2, keys);
        let wide = |keys: &Keys| (0..keys.len()).map(|i| KeyHash::of(keys.get(i))).collect();
        let narrow = |keys: &Keys| (0..keys.len()).map(|i| xxh3_64(keys.get(i))).collect();
        Self {
            present_wide: wide(&present),
            absent_wide: wide(&absent),
            present_narrow: narrow(&present),
            absent_narrow: narrow(&absent),
            present,
            absent,
        }
    }
}

/// One row of the tables: an operation or a layout, and each candidate's loop for it
/// (`None` where the candidate has no such call).
struct Row {
    label: &'static str,
    loops: Vec<Option<&'static str>>,
}

struct Table {
    title: &'static str,
    /// What the rows are: operations, or layouts.
    rows_are: &'static str,
    candidates: Vec<&'static str>,
    rows: Vec<Row>,
}

fn tables() -> Vec<Table> {
    let row = |label, loops: &[Option<&'static str>]| Row {
        label,
        loops: loops.to_vec(),
    };
    vec![
        Table {
            title: "Split-block-256 layout, k = 8, equal bits",
            rows_are: "operation",
            candidates: vec![
                "bloom-core (insert_mut; frozen for queries)",
                "sbbf-rs-safe 0.3",
                "sbbf-rs-safe 0.3, fed our 128-bit hash",
            ],
            rows: vec![
                row(
                    "insert, with hashing",
                    &[
                        Some("split:ours_insert_keys"),
                        Some("split:sbbf_insert_keys"),
                        Some("split:sbbf_our_hash_insert_keys"),
                    ],
                ),
                row(
                    "query present, with hashing",
                    &[
                        Some("split:ours_frozen_query_keys"),
                        Some("split:sbbf_query_keys"),
                        Some("split:sbbf_our_hash_query_keys"),
                    ],
                ),
                row(
                    "insert, prehashed",
                    &[
                        Some("split:ours_insert_hashes"),
                        Some("split:sbbf_insert_hashes"),
                        None,
                    ],
                ),
                row(
                    "query present, prehashed",
                    &[
                        Some("split:ours_frozen_query_hashes"),
                        Some("split:sbbf_query_hashes"),
                        None,
                    ],
                ),
                row(
                    "insert, with hashing, live filter (&self)",
                    &[Some("split:ours_shared_insert_keys"), None, None],
                ),
                row(
                    "insert, prehashed, live filter (&self)",
                    &[Some("split:ours_shared_insert_hashes"), None, None],
                ),
                row(
                    "query present, with hashing, live filter (&self)",
                    &[Some("split live:ours_query_keys"), None, None],
                ),
                row(
                    "query present, prehashed, live filter (&self)",
                    &[Some("split live:ours_query_hashes"), None, None],
                ),
            ],
        },
        Table {
            title: "Standard layout, k = 7, equal bits",
            rows_are: "operation",
            candidates: vec!["bloom-core (insert_mut)", "fastbloom 0.17 BloomFilter"],
            rows: vec![
                row(
                    "insert, with hashing",
                    &[
                        Some("standard:ours_insert_keys"),
                        Some("standard:fastbloom_insert_keys"),
                    ],
                ),
                row(
                    "query present, with hashing",
                    &[
                        Some("standard present:ours_query_keys"),
                        Some("standard present:fastbloom_query_keys"),
                    ],
                ),
                row(
                    "query absent, with hashing",
                    &[
                        Some("standard absent:ours_query_keys"),
                        Some("standard absent:fastbloom_query_keys"),
                    ],
                ),
                row(
                    "insert, prehashed",
                    &[
                        Some("standard:ours_insert_hashes"),
                        Some("standard:fastbloom_insert_hashes"),
                    ],
                ),
                row(
                    "query present, prehashed",
                    &[
                        Some("standard present:ours_query_hashes"),
                        Some("standard present:fastbloom_query_hashes"),
                    ],
                ),
                row(
                    "query absent, prehashed",
                    &[
                        Some("standard absent:ours_query_hashes"),
                        Some("standard absent:fastbloom_query_hashes"),
                    ],
                ),
            ],
        },
        Table {
            title: "Batch queries of present keys, each layout sized for p",
            rows_are: "layout",
            candidates: vec![
                "live filter, contains_batch_into",
                "frozen filter, contains_batch_into",
            ],
            rows: vec![
                row(
                    "standard",
                    &[
                        Some("batch standard:live_batch_query"),
                        Some("batch standard:frozen_batch_query"),
                    ],
                ),
                row(
                    "blocked",
                    &[
                        Some("batch blocked:live_batch_query"),
                        Some("batch blocked:frozen_batch_query"),
                    ],
                ),
                row(
                    "split-block",
                    &[
                        Some("batch split-block:live_batch_query"),
                        Some("batch split-block:frozen_batch_query"),
                    ],
                ),
                row(
                    "split-block-256",
                    &[
                        Some("batch split-block-256:live_batch_query"),
                        Some("batch split-block-256:frozen_batch_query"),
                    ],
                ),
            ],
        },
        Table {
            title: "The hash alone",
            rows_are: "operation",
            candidates: vec![
                "bloom-core KeyHash (xxh3-128)",
                "its low half only (what sbbf-rs-safe fed our hash computes)",
                "xxh3-64",
            ],
            rows: vec![row(
                "hash a key",
                &[
                    Some("keys:key_hash_alone"),
                    Some("keys:key_hash_low_half_alone"),
                    Some("keys:xxh3_64_alone"),
                ],
            )],
        },
    ]
}

/// Runs the loop `name` (in the child callgrind runs). Set-up (sizing,
/// the inserts a query loop needs first) happens outside the counted
/// function.
fn run_loop(name: &str, keys: usize) -> Result<usize, Box<dyn Error>> {
    let inputs = Inputs::new(keys);
    let n = keys as u64;
    let split = BloomFilter::with_layout(Layout::SplitBlock256, n, FP_RATE)?;
    let (split_bits, split_k) = (split.bits(), split.hashes());
    let standard = BloomFilter::new(n, FP_RATE)?;
    let (standard_bits, standard_k) = (standard.bits(), standard.hashes());
    let split_filter = || BloomFilter::with_params(Layout::SplitBlock256, split_bits, split_k);
    let sbbf = || sbbf_rs_safe::Filter::new(split_bits as usize, 1);
    let fastbloom = || {
        fastbloom::BloomFilter::with_num_bits(standard_bits as usize)
            .hasher(Xxh3Builder::new())
            .hashes(standard_k)
    };
    let filled_sbbf = || {
        let mut filter = sbbf();
        sbbf_insert_hashes(&mut filter, &inputs.present_narrow);
        filter
    };
    let filled_split = || -> Result<BloomFilter, Box<dyn Error>> {
        let mut filter = split_filter()?;
        ours_insert_hashes(&mut filter, &inputs.present_wide);
        Ok(filter)
    };
    let filled_frozen =
        || -> Result<FrozenBloomFilter, Box<dyn Error>> { Ok(filled_split()?.freeze()) };
    let standard_filter = || BloomFilter::with_params(Layout::Standard, standard_bits, standard_k);
    let filled_standard = || -> Result<BloomFilter, Box<dyn Error>> {
        let mut filter = standard_filter()?;
        ours_insert_hashes(&mut filter, &inputs.present_wide);
        Ok(filter)
    };
    let filled_fastbloom = || {
        let mut filter = fastbloom();
        fastbloom_insert_hashes(&mut filter, &inputs.present_narrow);
        filter
    };
    let (present, absent) = (&inputs.present, &inputs.absent);
    if let Some((layout, function)) = name
        .strip_prefix("batch ")
        .and_then(|rest| rest.split_once(':'))
    {
        let layout: Layout = layout
            .parse()
            .map_err(|error| format!("loop {name}: {error}"))?;
        let mut filter = BloomFilter::with_layout(layout, n, FP_RATE)?;
        ours_insert_hashes(&mut filter, &inputs.present_wide);
        return Ok(match function {
            "live_batch_query" => live_batch_query(&filter, &inputs.present_wide),
            "frozen_batch_query" => frozen_batch_query(&filter.freeze(), &inputs.present_wide),
            other => return Err(format!("no batch loop named {other}").into()),
        });
    }
    Ok(match name {
        "split:ours_insert_keys" => ours_insert_keys(&mut split_filter()?, present),
        "split:ours_insert_hashes" => {
            ours_insert_hashes(&mut split_filter()?, &inputs.present_wide)
        }
        "split:ours_frozen_query_keys" => ours_frozen_query_keys(&filled_frozen()?, present),
        "split:ours_shared_insert_keys" => ours_shared_insert_keys(&split_filter()?, present),
        "split:ours_shared_insert_hashes" => {
            ours_shared_insert_hashes(&split_filter()?, &inputs.present_wide)
        }
        "split live:ours_query_keys" => ours_query_keys(&filled_split()?, present),
        "split live:ours_query_hashes" => ours_query_hashes(&filled_split()?, &inputs.present_wide),
        "split:ours_frozen_query_hashes" => {
            ours_frozen_query_hashes(&filled_frozen()?, &inputs.present_wide)
        }
        "split:sbbf_insert_keys" => sbbf_insert_keys(&mut sbbf(), present),
        "split:sbbf_insert_hashes" => sbbf_insert_hashes(&mut sbbf(), &inputs.present_narrow),
        "split:sbbf_query_keys" => sbbf_query_keys(&filled_sbbf(), present),
        "split:sbbf_query_hashes" => sbbf_query_hashes(&filled_sbbf(), &inputs.present_narrow),
        "split:sbbf_our_hash_insert_keys" => sbbf_our_hash_insert_keys(&mut sbbf(), present),
        "split:sbbf_our_hash_query_keys" => {
            let mut filter = sbbf();
            sbbf_our_hash_insert_keys(&mut filter, present);
            sbbf_our_hash_query_keys(&filter, present)
        }
        "standard:ours_insert_keys" => ours_insert_keys(&mut standard_filter()?, present),
        "standard:ours_insert_hashes" => {
            ours_insert_hashes(&mut standard_filter()?, &inputs.present_wide)
        }
        "standard present:ours_query_keys" => ours_query_keys(&filled_standard()?, present),
        "standard absent:ours_query_keys" => ours_query_keys(&filled_standard()?, absent),
        "standard present:ours_query_hashes" => {
            ours_query_hashes(&filled_standard()?, &inputs.present_wide)
        }
        "standard absent:ours_query_hashes" => {
            ours_query_hashes(&filled_standard()?, &inputs.absent_wide)
        }
        "standard:fastbloom_insert_keys" => fastbloom_insert_keys(&mut fastbloom(), present),
        "standard:fastbloom_insert_hashes" => {
            fastbloom_insert_hashes(&mut fastbloom(), &inputs.present_narrow)
        }
        "standard present:fastbloom_query_keys" => {
            fastbloom_query_keys(&filled_fastbloom(), present)
        }
        "standard absent:fastbloom_query_keys" => fastbloom_query_keys(&filled_fastbloom(), absent),
        "standard present:fastbloom_query_hashes" => {
            fastbloom_query_hashes(&filled_fastbloom(), &inputs.present_narrow)
        }
        "standard absent:fastbloom_query_hashes" => {
            fastbloom_query_hashes(&filled_fastbloom(), &inputs.absent_narrow)
        }
        "keys:key_hash_alone" => key_hash_alone((), present),
        "keys:key_hash_low_half_alone" => key_hash_low_half_alone((), present),
        "keys:xxh3_64_alone" => xxh3_64_alone((), present),
        other => return Err(format!("no loop named {other}").into()),
    })
}

/// The function callgrind collects inside for a loop: loops are named
/// `set-up:function`.
fn counted_function(name: &str) -> String {
    let (_, function) = name
        .split_once(':')
        .expect("loops are named set-up:function");
    format!("instructions_per_key::{function}")
}

/// Instructions a key of one loop: runs this program under callgrind,
/// collecting only inside the loop's function.
fn count(exe: &Path, name: &str, keys: usize) -> Result<f64, Box<dyn Error>> {
    let out = std::env::temp_dir().join(format!(
        "instructions-per-key-{}-{name}.callgrind",
        std::process::id()
    ));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect={}", counted_function(name)))
        .arg(exe)
        .env(CHILD, name)
        .env(CHILD_KEYS, keys.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|error| format!("running valgrind (is it installed?): {error}"))?;
    if !status.success() {
        return Err(format!("valgrind failed on loop {name}: {status}").into());
    }
    let text = std::fs::read_to_string(&out)?;
    std::fs::remove_file(&out)?;
    let total: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("totals: "))
        .or_else(|| text.lines().find_map(|line| line.strip_prefix("summary: ")))
        .ok_or_else(|| format!("no totals in callgrind's output for {name}"))?
        .trim()
        .parse()?;
    if total == 0 {
        return Err(format!("callgrind counted nothing in {}", counted_function(name)).into());
    }
    Ok(total as f64 / keys as f64)
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Ok(name) = std::env::var(CHILD) {
        let keys = std::env::var(CHILD_KEYS)?.parse()?;
        let answered = run_loop(&name, keys)?;
        std::hint::black_box(answered);
        return Ok(());
    }
    let args: Vec<String> = std::env::args().collect();
    let keys = match args.iter().position(|arg| arg == "--keys") {
        Some(position) => args
            .get(position + 1)
            .and_then(|value| value.parse().ok())
            .filter(|&keys: &usize| keys > 0)
            .ok_or("--keys needs a positive number")?,
        None => DEFAULT_KEYS,
    };
    let exe = std::env::current_exe()?;
    let sample = Keys::urls(1, keys);
    println!(
        "Instructions a key (callgrind; {keys} URL-like keys of {:.0} bytes on average; filters sized for p = {FP_RATE})",
        sample.total_bytes() as f64 / sample.len() as f64
    );
    for table in tables() {
        println!("\n#### {}\n", table.title);
        let mut header = format!("| {} |", table.rows_are);
        for candidate in &table.candidates {
            header.push_str(&format!(" {candidate} |"));
        }
        println!("{header}");
        println!("|---|{}", "---:|".repeat(table.candidates.len()));
        for row in &table.rows {
            let mut line = format!("| {} |", row.label);
            for name in &row.loops {
                match name {
                    Some(name) => line.push_str(&format!(" {:.1} |", count(&exe, name, keys)?)),
                    None => line.push_str(" n/a |"),
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}
