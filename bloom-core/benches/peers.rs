//! bloom-core against the Rust filter crates people reach for, side by side
//! in one run on the same keys and the same bits per key.
//!
//! `cargo bench -p bloom-core --bench peers` (10 million URL-like keys at
//! p = 0.01 and p = 0.0001); `-- --keys N` for another size, `-- --quick`
//! for a 200 000-key smoke run, `-- --p 0.0001` for one rate,
//! `-- --batch-only` for the batch-query and batch-insert tables alone,
//! `-- --layout split-block` for one layout's group, `-- --k-sweep` for
//! single query cost against k. Prints markdown tables for BENCHMARKS.md.
//!
//! Peers: fastbloom (standard layout, xxh3 hashing; both its plain and its
//! atomic filter), bloomfilter (SipHash, its only hasher), sbbf-rs-safe (the
//! Parquet split-block filter, SIMD; in the split-block groups also fed our
//! 128-bit key hash, so that the filters compare at equal hashing cost).
//! Standard-layout filters get the bits our standard layout chose for
//! (n, p); the blocked ones get the bits our blocked layout chose, or each
//! split-block layout chose in its group. Where split-block sizing picks k
//! above 8, a k = 8 row at the same bits (sbbf-rs-safe's k) leads its group.
//! Each figure is the median of five passes over all keys; passes of all
//! candidates are interleaved so drift hits all alike, and each ratio is
//! the median of the five per-pass ratios. Every insert's answer (whether
//! the key was new) is consumed.

use std::hint::black_box;
use std::time::Instant;

use bloom_core::{BloomFilter, FrozenBloomFilter, KeyHash, Layout};
use xxhash_rust::xxh3::{Xxh3Builder, xxh3_64};

#[path = "common/url_keys.rs"]
mod url_keys;
use url_keys::Keys;

const REPETITIONS: usize = 5;

/// One filter under test. `prehashed` operations take the hash computed
/// outside the timed loop, to compare the filters' own work.
enum Candidate {
    Ours(BloomFilter),
    /// Ours through `insert_mut`, the exclusive-access path that needs no
    /// locked instructions: the like-for-like match for fastbloom's `&mut`
    /// BloomFilter.
    OursExclusive(BloomFilter),
    /// Built through `insert_mut`, then frozen for the queries: the
    /// like-for-like match for filters inserted through `&mut` and queried
    /// over plain memory (sbbf-rs-safe).
    OursFrozen {
        building: Option<BloomFilter>,
        frozen: Option<FrozenBloomFilter>,
    },
    Fastbloom(fastbloom::BloomFilter<Xxh3Builder>),
    FastbloomAtomic(fastbloom::AtomicBloomFilter<Xxh3Builder>),
    Bloomfilter(bloomfilter::Bloom<[u8]>),
    Sbbf(sbbf_rs_safe::Filter),
    /// sbbf-rs-safe fed the low half of our 128-bit key hash instead of
    /// xxh3-64, so that its with-hashing columns pay for our hash function
    /// too (the compiler computes only the half it takes: 114 of the whole
    /// hash's 131 instructions a key, against xxh3-64's 97 on these keys;
    /// BENCHMARKS.md). The 128-bit hash is ours by requirement (one hash
    /// for partition choice and probes, persisted).
    SbbfWideHash(sbbf_rs_safe::Filter),
}

/// The low half of our key hash, which is what a 64-bit-hash filter fed
/// from it would take.
fn low_half(hash: KeyHash) -> u64 {
    hash.to_u128() as u64
}

/// Counts the keys for which `answer` is true, in a loop of its own. Each
/// `Candidate` method below matches on the filter once and then runs this
/// loop, so that every filter's loop is compiled for that filter alone, as
/// a caller's loop would be: a `match` inside one shared loop made the
/// loop keep its state on the stack for the arms that call out of line,
/// and charged those filters for the benchmark's dispatch.
#[inline(always)]
fn count(n: usize, mut answer: impl FnMut(usize) -> bool) -> usize {
    (0..n).filter(|&index| answer(index)).count()
}

impl Candidate {
    /// Inserts every key; how many the filter answered were new, which the
    /// timed loops consume: a crawl frontier inserts to learn whether a URL
    /// is new, and a loop that drops the answer lets the compiler drop the
    /// work that computes it, for inlined peers but not for code behind a
    /// call.
    fn insert_all(&mut self, keys: &Keys) -> usize {
        let n = keys.len();
        match self {
            Candidate::Ours(f) => count(n, |i| f.insert(keys.get(i))),
            Candidate::OursExclusive(f) => count(n, |i| f.insert_mut(keys.get(i))),
            Candidate::OursFrozen { building, .. } => {
                let f = building.as_mut().expect("inserts come first");
                count(n, |i| f.insert_mut(keys.get(i)))
            }
            // fastbloom answers "was it already there".
            Candidate::Fastbloom(f) => count(n, |i| !f.insert(keys.get(i))),
            Candidate::FastbloomAtomic(f) => count(n, |i| !f.insert(keys.get(i))),
            Candidate::Bloomfilter(f) => count(n, |i| !f.check_and_set(keys.get(i))),
            // sbbf-rs-safe answers "was it already there" too.
            Candidate::Sbbf(f) => count(n, |i| !f.insert_hash(xxh3_64(keys.get(i)))),
            Candidate::SbbfWideHash(f) => {
                count(n, |i| !f.insert_hash(low_half(KeyHash::of(keys.get(i)))))
            }
        }
    }

    /// How many of the keys the filter reports present.
    fn contains_all(&self, keys: &Keys) -> usize {
        let n = keys.len();
        match self {
            Candidate::Ours(f) | Candidate::OursExclusive(f) => {
                count(n, |i| f.contains(keys.get(i)))
            }
            Candidate::OursFrozen { frozen, .. } => {
                let f = frozen.as_ref().expect("frozen after inserts");
                count(n, |i| f.contains(keys.get(i)))
            }
            Candidate::Fastbloom(f) => count(n, |i| f.contains(keys.get(i))),
            Candidate::FastbloomAtomic(f) => count(n, |i| f.contains(keys.get(i))),
            Candidate::Bloomfilter(f) => count(n, |i| f.check(keys.get(i))),
            Candidate::Sbbf(f) => count(n, |i| f.contains_hash(xxh3_64(keys.get(i)))),
            Candidate::SbbfWideHash(f) => {
                count(n, |i| f.contains_hash(low_half(KeyHash::of(keys.get(i)))))
            }
        }
    }

    /// Called between the inserts and the queries (not timed).
    fn inserts_done(&mut self) {
        if let Candidate::OursFrozen { building, frozen } = self
            && let Some(filter) = building.take()
        {
            *frozen = Some(filter.freeze());
        }
    }

    fn supports_prehashed(&self) -> bool {
        !matches!(self, Candidate::Bloomfilter(_))
    }

    /// [`insert_all`](Self::insert_all) with the hashes computed outside
    /// the timed loop.
    fn insert_all_prehashed(&mut self, hashes: &Hashes) -> usize {
        let n = hashes.wide.len();
        match self {
            Candidate::Ours(f) => count(n, |i| f.insert_hashed(hashes.wide[i])),
            Candidate::OursExclusive(f) => count(n, |i| f.insert_hashed_mut(hashes.wide[i])),
            Candidate::OursFrozen { building, .. } => {
                let f = building.as_mut().expect("inserts come first");
                count(n, |i| f.insert_hashed_mut(hashes.wide[i]))
            }
            Candidate::Fastbloom(f) => count(n, |i| !f.insert_hash(hashes.narrow[i])),
            Candidate::FastbloomAtomic(f) => count(n, |i| !f.insert_hash(hashes.narrow[i])),
            Candidate::Bloomfilter(_) => 0,
            Candidate::Sbbf(f) => count(n, |i| !f.insert_hash(hashes.narrow[i])),
            Candidate::SbbfWideHash(f) => count(n, |i| !f.insert_hash(low_half(hashes.wide[i]))),
        }
    }

    /// [`contains_all`](Self::contains_all) with precomputed hashes.
    fn contains_all_prehashed(&self, hashes: &Hashes) -> usize {
        let n = hashes.wide.len();
        match self {
            Candidate::Ours(f) | Candidate::OursExclusive(f) => {
                count(n, |i| f.contains_hashed(hashes.wide[i]))
            }
            Candidate::OursFrozen { frozen, .. } => {
                let f = frozen.as_ref().expect("frozen after inserts");
                count(n, |i| f.contains_hashed(hashes.wide[i]))
            }
            Candidate::Fastbloom(f) => count(n, |i| f.contains_hash(hashes.narrow[i])),
            Candidate::FastbloomAtomic(f) => count(n, |i| f.contains_hash(hashes.narrow[i])),
            Candidate::Bloomfilter(_) => 0,
            Candidate::Sbbf(f) => count(n, |i| f.contains_hash(hashes.narrow[i])),
            Candidate::SbbfWideHash(f) => count(n, |i| f.contains_hash(low_half(hashes.wide[i]))),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Candidate::Ours(f) | Candidate::OursExclusive(f) => f.memory_bytes() as usize,
            Candidate::OursFrozen { frozen, .. } => frozen
                .as_ref()
                .map_or(0, |frozen| frozen.memory_bytes() as usize),
            Candidate::Fastbloom(f) => f.num_bits() / 8,
            Candidate::FastbloomAtomic(f) => f.num_bits() / 8,
            Candidate::Bloomfilter(f) => f.as_slice().len(),
            Candidate::Sbbf(f) | Candidate::SbbfWideHash(f) => f.as_bytes().len(),
        }
    }
}

/// Precomputed hashes: ours take the 128-bit key hash, the peers a 64-bit
/// xxh3 (the hash they derive their probes from).
struct Hashes {
    wide: Vec<KeyHash>,
    narrow: Vec<u64>,
}

impl Hashes {
    fn of(keys: &Keys) -> Self {
        Self {
            wide: (0..keys.len()).map(|i| KeyHash::of(keys.get(i))).collect(),
            narrow: (0..keys.len()).map(|i| xxh3_64(keys.get(i))).collect(),
        }
    }
}

struct Spec {
    name: String,
    make: Box<dyn Fn() -> Candidate>,
}

#[derive(Default, Clone)]
struct Figures {
    insert: Vec<f64>,
    present: Vec<f64>,
    absent: Vec<f64>,
    insert_pre: Vec<f64>,
    present_pre: Vec<f64>,
    absent_pre: Vec<f64>,
    fp_rate: f64,
    bytes: usize,
}

fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn ns_per_op(start: Instant, ops: usize) -> f64 {
    start.elapsed().as_nanos() as f64 / ops as f64
}

#[allow(clippy::too_many_arguments)]
fn run_group(
    title: &str,
    bits_per_key: f64,
    specs: &[Spec],
    present: &Keys,
    absent: &Keys,
    present_hashes: &Hashes,
    absent_hashes: &Hashes,
) {
    let n = present.len();
    let mut figures = vec![Figures::default(); specs.len()];
    for _ in 0..REPETITIONS {
        for (spec, figures) in specs.iter().zip(figures.iter_mut()) {
            let mut filter = (spec.make)();
            let start = Instant::now();
            let new_keys = filter.insert_all(present);
            figures.insert.push(ns_per_op(start, n));
            // Distinct keys into a filter sized for them: all but a few
            // (those already false positives) must be reported new. Catches
            // a peer's answer read the wrong way round.
            assert!(new_keys > n / 2, "{}: insert answers inverted", spec.name);
            filter.inserts_done();

            let start = Instant::now();
            let found = filter.contains_all(present);
            figures.present.push(ns_per_op(start, n));
            assert_eq!(found, n, "{}: false negatives", spec.name);

            let start = Instant::now();
            let false_positives = filter.contains_all(absent);
            figures.absent.push(ns_per_op(start, n));
            figures.fp_rate = false_positives as f64 / n as f64;
            figures.bytes = filter.bytes();

            if filter.supports_prehashed() {
                let mut filter = (spec.make)();
                let start = Instant::now();
                let new_keys = filter.insert_all_prehashed(present_hashes);
                figures.insert_pre.push(ns_per_op(start, n));
                assert!(new_keys > n / 2, "{}: insert answers inverted", spec.name);
                filter.inserts_done();
                let start = Instant::now();
                let found = filter.contains_all_prehashed(present_hashes);
                figures.present_pre.push(ns_per_op(start, n));
                assert_eq!(found, n, "{}: false negatives", spec.name);
                let start = Instant::now();
                black_box(filter.contains_all_prehashed(absent_hashes));
                figures.absent_pre.push(ns_per_op(start, n));
            }
        }
    }

    println!("\n### {title}: {n} keys, {bits_per_key:.2} bits per key\n");
    println!(
        "| filter | insert ns | query present ns | query absent ns | prehashed insert / present / absent ns | measured FP | MB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (spec, f) in specs.iter().zip(&figures) {
        let prehashed = if f.insert_pre.is_empty() {
            "n/a".to_string()
        } else {
            format!(
                "{:.1} / {:.1} / {:.1}",
                median(&f.insert_pre),
                median(&f.present_pre),
                median(&f.absent_pre)
            )
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} | {:.5} | {:.1} |",
            spec.name,
            median(&f.insert),
            median(&f.present),
            median(&f.absent),
            prehashed,
            f.fp_rate,
            f.bytes as f64 / 1e6
        );
    }
    let ours = &figures[0];
    println!(
        "\nRatios, peer time / {} time, median of the per-pass ratios (above 1: ours is faster):\n",
        specs[0].name
    );
    println!(
        "| peer | insert | query present | query absent | prehashed insert | prehashed present | prehashed absent | FP ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (spec, f) in specs.iter().zip(&figures).skip(1) {
        // The median of the per-pass ratios: the passes of all candidates
        // run back to back, so each pass's ratio cancels the slow and fast
        // phases this shared machine drifts through, which a ratio of two
        // medians does not.
        let ratio = |peer: &[f64], mine: &[f64]| {
            if peer.is_empty() {
                "n/a".to_string()
            } else {
                let per_pass: Vec<f64> = peer.iter().zip(mine).map(|(p, m)| p / m).collect();
                format!("{:.2}", median(&per_pass))
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} |",
            spec.name,
            ratio(&f.insert, &ours.insert),
            ratio(&f.present, &ours.present),
            ratio(&f.absent, &ours.absent),
            ratio(&f.insert_pre, &ours.insert_pre),
            ratio(&f.present_pre, &ours.present_pre),
            ratio(&f.absent_pre, &ours.absent_pre),
            f.fp_rate / ours.fp_rate.max(f64::MIN_POSITIVE),
        );
    }
}

/// Batch queries against the machine's own cost of independent random
/// loads: loads of one word at the first probe position of each key, from an
/// array of the filter's size, issued the same way the batch issues them.
/// A filter the batch table measures: live (atomic words) or frozen.
enum Batched<'a> {
    Live(&'a BloomFilter),
    Frozen(&'a FrozenBloomFilter),
}

impl Batched<'_> {
    fn contains_batch_into(&self, hashes: &[KeyHash], out: &mut Vec<bool>) {
        match self {
            Batched::Live(filter) => filter.contains_batch_into(hashes, out),
            Batched::Frozen(filter) => filter.contains_batch_into(hashes, out),
        }
    }

    fn contains_hashed(&self, hash: KeyHash) -> bool {
        match self {
            Batched::Live(filter) => filter.contains_hashed(hash),
            Batched::Frozen(filter) => filter.contains_hashed(hash),
        }
    }

    fn layout(&self) -> Layout {
        match self {
            Batched::Live(filter) => filter.layout(),
            Batched::Frozen(filter) => filter.layout(),
        }
    }

    fn hashes(&self) -> u32 {
        match self {
            Batched::Live(filter) => filter.hashes(),
            Batched::Frozen(filter) => filter.hashes(),
        }
    }

    fn memory_bytes(&self) -> u64 {
        match self {
            Batched::Live(filter) => filter.memory_bytes(),
            Batched::Frozen(filter) => filter.memory_bytes(),
        }
    }

    fn name(&self) -> String {
        match self {
            Batched::Live(filter) => filter.layout().to_string(),
            Batched::Frozen(filter) => format!("{}, frozen", filter.layout()),
        }
    }
}

fn run_batch(filter: Batched<'_>, present: &Hashes, absent: &Hashes) {
    let n = present.wide.len();
    let words = (filter.memory_bytes() / 8) as usize;
    let table: Vec<u64> = (0..words as u64).collect();
    let big_words = 256 << 20 >> 3;
    let big: Vec<u64> = (0..big_words as u64).collect();
    let mut out = Vec::new();
    let (mut present_ns, mut absent_ns, mut single_ns, mut load_ns, mut big_load_ns) =
        (vec![], vec![], vec![], vec![], vec![]);
    let load = |table: &[u64]| {
        let start = Instant::now();
        let mut sum = 0_u64;
        for hash in &present.narrow {
            sum =
                sum.wrapping_add(table[((u128::from(*hash) * table.len() as u128) >> 64) as usize]);
        }
        black_box(sum);
        ns_per_op(start, n)
    };
    for _ in 0..REPETITIONS {
        let start = Instant::now();
        filter.contains_batch_into(&present.wide, &mut out);
        present_ns.push(ns_per_op(start, n));
        assert!(out.iter().all(|&found| found));
        let start = Instant::now();
        filter.contains_batch_into(&absent.wide, &mut out);
        absent_ns.push(ns_per_op(start, n));
        let start = Instant::now();
        black_box(
            absent
                .wide
                .iter()
                .filter(|&&h| filter.contains_hashed(h))
                .count(),
        );
        single_ns.push(ns_per_op(start, n));
        load_ns.push(load(&table));
        big_load_ns.push(load(&big));
    }
    let lines_present = match filter.layout() {
        Layout::Standard => f64::from(filter.hashes()),
        _ => 1.0,
    };
    println!(
        "| {} | {:.1} | {:.1} | {:.1} | {:.1} ({:.2} per line) | {:.1} | {:.1} |",
        filter.name(),
        median(&present_ns),
        median(&absent_ns),
        median(&single_ns),
        median(&load_ns),
        median(&present_ns) / lines_present / median(&load_ns),
        median(&big_load_ns),
        median(&present_ns) / lines_present / median(&big_load_ns),
    );
}

/// Prehashed single queries against k at a fixed 22 bits per key (about
/// 28 MB for 10 million keys), both layouts: how the cost of one query
/// grows with its instruction count once the filter is out of cache.
fn run_k_sweep(present: &Hashes) {
    let n = present.wide.len();
    println!("\n### Single prehashed present queries by k, 22 bits per key\n");
    println!("| k | blocked ns | standard ns |");
    println!("|---:|---:|---:|");
    for k in [1, 4, 7, 12] {
        let mut row = format!("| {k} |");
        for layout in [Layout::Blocked, Layout::Standard] {
            let filter = BloomFilter::with_params(layout, 22 * n as u64, k).unwrap();
            for &hash in &present.wide {
                filter.insert_hashed(hash);
            }
            let times: Vec<f64> = (0..REPETITIONS)
                .map(|_| {
                    let start = Instant::now();
                    black_box(
                        present
                            .wide
                            .iter()
                            .filter(|&&h| filter.contains_hashed(h))
                            .count(),
                    );
                    ns_per_op(start, n)
                })
                .collect();
            row.push_str(&format!(" {:.1} |", median(&times)));
        }
        println!("{row}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut keys = 10_000_000;
    if args.iter().any(|a| a == "--quick") {
        keys = 200_000;
    }
    if let Some(position) = args.iter().position(|a| a == "--keys") {
        keys = args
            .get(position + 1)
            .and_then(|v| v.parse().ok())
            .expect("--keys needs a number");
    }

    let rates: Vec<f64> = match args.iter().position(|a| a == "--p") {
        Some(position) => vec![
            args.get(position + 1)
                .and_then(|v| v.parse().ok())
                .expect("--p needs a false-positive rate"),
        ],
        None => vec![0.01, 0.0001],
    };
    let batch_only = args.iter().any(|a| a == "--batch-only");
    // `--layout NAME`: only that layout's group (and batch row).
    let only: Option<Layout> = args.iter().position(|a| a == "--layout").map(|position| {
        args.get(position + 1)
            .and_then(|v| v.parse().ok())
            .expect("--layout needs standard, blocked, split-block or split-block-256")
    });
    let wanted = |layout: Layout| !batch_only && only.is_none_or(|o| o == layout);

    println!("# bloom-core peers benchmark");
    let present = Keys::urls(1, keys);
    let absent = Keys::urls(2, keys);
    println!(
        "\nKeys: {keys} URL-like strings ({:.1} bytes on average), absent keys from a disjoint family.",
        present.total_bytes() as f64 / present.len() as f64
    );
    let present_hashes = Hashes::of(&present);
    let absent_hashes = Hashes::of(&absent);
    let n = keys as u64;
    if args.iter().any(|a| a == "--k-sweep") {
        run_k_sweep(&present_hashes);
        return;
    }

    for p in rates {
        let standard = BloomFilter::new(n, p).expect("valid parameters");
        let blocked = BloomFilter::with_layout(Layout::Blocked, n, p).expect("valid parameters");
        let (bits_s, k_s) = (standard.bits() as usize, standard.hashes());
        let (bits_b, k_b) = (blocked.bits() as usize, blocked.hashes());
        drop((standard, blocked));

        let standard_specs = vec![
            Spec {
                name: "bloom-core standard".into(),
                make: Box::new(move || Candidate::Ours(BloomFilter::new(n, p).unwrap())),
            },
            Spec {
                name: "bloom-core standard, insert_mut".into(),
                make: Box::new(move || Candidate::OursExclusive(BloomFilter::new(n, p).unwrap())),
            },
            Spec {
                name: "fastbloom 0.17 BloomFilter".into(),
                make: Box::new(move || {
                    Candidate::Fastbloom(
                        fastbloom::BloomFilter::with_num_bits(bits_s)
                            .hasher(Xxh3Builder::new())
                            .hashes(k_s),
                    )
                }),
            },
            Spec {
                name: "fastbloom 0.17 AtomicBloomFilter".into(),
                make: Box::new(move || {
                    Candidate::FastbloomAtomic(
                        fastbloom::AtomicBloomFilter::with_num_bits(bits_s)
                            .hasher(Xxh3Builder::new())
                            .hashes(k_s),
                    )
                }),
            },
            Spec {
                name: "bloomfilter 3".into(),
                make: Box::new(move || {
                    Candidate::Bloomfilter(
                        bloomfilter::Bloom::new_with_seed(bits_s / 8, keys, &[7; 32]).unwrap(),
                    )
                }),
            },
        ];
        if wanted(Layout::Standard) {
            run_group(
                &format!("Standard layout, p = {p} (k = {k_s})"),
                bits_s as f64 / keys as f64,
                &standard_specs,
                &present,
                &absent,
                &present_hashes,
                &absent_hashes,
            );
        }
        if wanted(Layout::Blocked) {
            let blocked_specs = vec![
                Spec {
                    name: "bloom-core blocked".into(),
                    make: Box::new(move || {
                        Candidate::Ours(BloomFilter::with_layout(Layout::Blocked, n, p).unwrap())
                    }),
                },
                Spec {
                    name: "bloom-core blocked, insert_mut".into(),
                    make: Box::new(move || {
                        Candidate::OursExclusive(
                            BloomFilter::with_layout(Layout::Blocked, n, p).unwrap(),
                        )
                    }),
                },
                Spec {
                    name: "sbbf-rs-safe 0.3".into(),
                    make: Box::new(move || Candidate::Sbbf(sbbf_rs_safe::Filter::new(bits_b, 1))),
                },
            ];
            run_group(
                &format!("Blocked layout, p = {p} (k = {k_b})"),
                bits_b as f64 / keys as f64,
                &blocked_specs,
                &present,
                &absent,
                &present_hashes,
                &absent_hashes,
            );
        }

        for layout in [Layout::SplitBlock, Layout::SplitBlock256] {
            if !wanted(layout) {
                continue;
            }
            let sized = BloomFilter::with_layout(layout, n, p).expect("valid parameters");
            let (bits, k) = (sized.bits(), sized.hashes());
            drop(sized);
            let ours = move || BloomFilter::with_layout(layout, n, p).unwrap();
            let mut specs = vec![
                Spec {
                    name: format!("bloom-core {layout}, insert_mut, frozen for queries"),
                    make: Box::new(move || Candidate::OursFrozen {
                        building: Some(ours()),
                        frozen: None,
                    }),
                },
                Spec {
                    name: format!("bloom-core {layout}"),
                    make: Box::new(move || Candidate::Ours(ours())),
                },
                Spec {
                    name: format!("bloom-core {layout}, insert_mut"),
                    make: Box::new(move || Candidate::OursExclusive(ours())),
                },
                Spec {
                    name: "sbbf-rs-safe 0.3".into(),
                    make: Box::new(move || {
                        Candidate::Sbbf(sbbf_rs_safe::Filter::new(bits as usize, 1))
                    }),
                },
                Spec {
                    name: "sbbf-rs-safe 0.3, fed our 128-bit hash".into(),
                    make: Box::new(move || {
                        Candidate::SbbfWideHash(sbbf_rs_safe::Filter::new(bits as usize, 1))
                    }),
                },
            ];
            if k > 8 {
                // sbbf-rs-safe's k at the same bits, what a caller gets who
                // asks for its speed with `with_params` rather than for p;
                // first, so that the ratios compare sbbf-rs-safe with it.
                specs.insert(
                    0,
                    Spec {
                        name: format!("bloom-core {layout} k = 8, insert_mut, frozen for queries"),
                        make: Box::new(move || Candidate::OursFrozen {
                            building: Some(BloomFilter::with_params(layout, bits, 8).unwrap()),
                            frozen: None,
                        }),
                    },
                );
            }
            let title = match layout {
                Layout::SplitBlock => "Split-block",
                _ => "Split-block-256",
            };
            run_group(
                &format!("{title} layout, p = {p} (k = {k})"),
                bits as f64 / keys as f64,
                &specs,
                &present,
                &absent,
                &present_hashes,
                &absent_hashes,
            );
        }

        println!("\n### Batch queries, p = {p} (prehashed, ns per key)\n");
        println!(
            "| layout | batch present | batch absent | one by one absent | random load, filter-sized array (batch present per line / load) | random load, 256 MB array | batch present per line / 256 MB load |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for layout in Layout::ALL {
            if only.is_some_and(|o| o != layout) {
                continue;
            }
            let filter = BloomFilter::with_layout(layout, n, p).unwrap();
            for &hash in &present_hashes.wide {
                filter.insert_hashed(hash);
            }
            run_batch(Batched::Live(&filter), &present_hashes, &absent_hashes);
            if matches!(layout, Layout::SplitBlock | Layout::SplitBlock256) {
                let frozen = filter.freeze();
                run_batch(Batched::Frozen(&frozen), &present_hashes, &absent_hashes);
            }
        }

        println!("\n### Batch inserts, p = {p} (prehashed, ns per key)\n");
        println!(
            "Batches of {INSERT_BATCH} hashes into an empty filter sized for all the keys. The peer is the layout's group's: fastbloom's plain filter for the standard layout, sbbf-rs-safe for the block layouts, at the same bits, one by one (neither has a batch insert). Ratios are medians of the per-pass ratios (above 1: the batch is faster).\n"
        );
        println!(
            "| layout | insert_mut one by one | insert_batch_mut_into | insert (&self) one by one | insert_batch_into (&self) | peer one by one | one by one / batch, exclusive | one by one / batch, &self | peer / insert_batch_mut_into | peer / insert_batch_into |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for layout in Layout::ALL {
            if only.is_some_and(|o| o != layout) {
                continue;
            }
            run_batch_inserts(layout, n, p, &present_hashes);
        }
    }
}

/// Hashes a batch insert takes at once in the batch-insert table, as
/// `PartitionedBloom`'s rebuild feeds them.
const INSERT_BATCH: usize = 4096;

/// One row of the batch-insert table: our exclusive and shared inserts one
/// by one and in batches, and the layout's peer one by one, in interleaved
/// passes.
fn run_batch_inserts(layout: Layout, n: u64, p: f64, hashes: &Hashes) {
    let ours = || BloomFilter::with_layout(layout, n, p).unwrap();
    let (bits, k) = {
        let sized = ours();
        (sized.bits() as usize, sized.hashes())
    };
    let peer = move || match layout {
        Layout::Standard => Candidate::Fastbloom(
            fastbloom::BloomFilter::with_num_bits(bits)
                .hasher(Xxh3Builder::new())
                .hashes(k),
        ),
        _ => Candidate::Sbbf(sbbf_rs_safe::Filter::new(bits, 1)),
    };
    let batched = |insert: &mut dyn FnMut(&[KeyHash], &mut Vec<bool>)| {
        let mut out = Vec::with_capacity(INSERT_BATCH);
        let mut new_keys = 0;
        for batch in hashes.wide.chunks(INSERT_BATCH) {
            insert(batch, &mut out);
            new_keys += out.iter().filter(|&&new| new).count();
        }
        new_keys
    };
    let n_keys = hashes.wide.len();
    // Single exclusive, batch exclusive, single shared, batch shared, peer.
    let mut times: [Vec<f64>; 5] = Default::default();
    for _ in 0..REPETITIONS {
        let mut answers = Vec::new();
        let mut timed = |times: &mut Vec<f64>, run: &mut dyn FnMut() -> usize| {
            let start = Instant::now();
            answers.push(run());
            times.push(ns_per_op(start, n_keys));
        };
        let mut filter = Candidate::OursExclusive(ours());
        timed(&mut times[0], &mut || filter.insert_all_prehashed(hashes));
        let mut filter = ours();
        timed(&mut times[1], &mut || {
            batched(&mut |batch, out| filter.insert_batch_mut_into(batch, out))
        });
        let mut filter = Candidate::Ours(ours());
        timed(&mut times[2], &mut || filter.insert_all_prehashed(hashes));
        let filter = ours();
        timed(&mut times[3], &mut || {
            batched(&mut |batch, out| filter.insert_batch_into(batch, out))
        });
        let mut filter = peer();
        timed(&mut times[4], &mut || filter.insert_all_prehashed(hashes));
        assert!(answers[0] > n_keys / 2, "{layout}: insert answers inverted");
        assert!(
            answers[..4].iter().all(|&new_keys| new_keys == answers[0]),
            "{layout}: batch answers differ from one-by-one ones: {answers:?}"
        );
    }
    let ratio = |slow: &[f64], fast: &[f64]| {
        let per_pass: Vec<f64> = slow.iter().zip(fast).map(|(s, f)| s / f).collect();
        median(&per_pass)
    };
    println!(
        "| {layout} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
        median(&times[0]),
        median(&times[1]),
        median(&times[2]),
        median(&times[3]),
        median(&times[4]),
        ratio(&times[0], &times[1]),
        ratio(&times[2], &times[3]),
        ratio(&times[4], &times[1]),
        ratio(&times[4], &times[3]),
    );
}
