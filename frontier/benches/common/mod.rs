//! The URL stream both ingest benchmarks offer: batches of 256 over 10,000
//! hosts, 45% of them repeats of URLs from up to seven batches back.

/// The URL at position `n` of batch `batch`.
pub fn url(batch: usize, n: usize) -> String {
    // Ids n with n % 100 >= 45 are URLs of their own; the other 45% repeat
    // one of those from up to seven batches back.
    let id = if n % 100 < 45 && batch > 0 {
        let back = n - 256 * (1 + n % 7).min(batch);
        back - back % 100 + 45 + n % 55
    } else {
        n
    };
    format!(
        "https://host{}.example.com/path/{id}/page.html",
        id % 10_000
    )
}

/// Reads `--name VALUE` from the command line.
pub fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
