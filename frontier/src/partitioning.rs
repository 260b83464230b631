//! Which partition a URL belongs to: a stable hash of its crawl and either
//! its host or its host's registrable domain, as the store was created.
//!
//! Under politeness by registrable domain the hosts of one domain share a
//! gap, which holds across a cluster only if one node serves all of them:
//! their URLs then share a partition, and a partition has one owner. A
//! store keeps the way it was created with, since a URL looked up in
//! another partition than the one it was stored in would be missed.

use bloom_core::KeyHash;

/// What a URL's partition follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionBy {
    /// Its host: hosts spread evenly over the partitions.
    #[default]
    Host,
    /// Its host's registrable domain (public suffix list): a domain's
    /// hosts share a partition, so a domain of many hosts makes its
    /// partition larger than the others.
    Domain,
}

impl PartitionBy {
    /// The value the store records.
    #[must_use]
    pub fn code(self) -> u64 {
        match self {
            Self::Host => 0,
            Self::Domain => 1,
        }
    }

    /// The way a store's recorded value names; `None` for a value this
    /// build does not know.
    #[must_use]
    pub fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(Self::Host),
            1 => Some(Self::Domain),
            _ => None,
        }
    }

    /// Its name, as the operator reads it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Domain => "domain",
        }
    }

    /// The partition of a URL of `host` in `crawl`.
    #[must_use]
    pub fn partition(self, crawl: &str, host: &str, partitions: usize) -> usize {
        match self {
            Self::Host => partition_of(crawl, host, partitions),
            Self::Domain => partition_of(crawl, crate::scope::registrable_domain(host), partitions),
        }
    }
}

/// The partition of a host in a crawl, stable across builds and platforms.
///
/// Partitions follow the host, not the client's queue key: a URL's host is
/// a function of the URL, so a URL always lands in the same partition and
/// is deduplicated there even if two clients file it under different queue
/// keys. With the default queue key (the host) the two coincide.
#[must_use]
pub fn partition_of(crawl: &str, host: &str, partitions: usize) -> usize {
    KeyHash::of(&joined(crawl, host)).partition(partitions)
}

fn joined(first: &str, second: &str) -> Vec<u8> {
    // The NUL separator keeps ("a", "bc") and ("ab", "c") apart: crawl IDs
    // and URLs never contain one that matters here (a crawl ID with a NUL
    // would only share keys with itself).
    let mut bytes = Vec::with_capacity(first.len() + 1 + second.len());
    bytes.extend_from_slice(first.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(second.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_domain_puts_a_domains_hosts_in_one_partition() {
        let by = PartitionBy::Domain;
        let home = by.partition("c", "example.co.uk", 64);
        for host in ["www.example.co.uk", "a.b.example.co.uk"] {
            assert_eq!(by.partition("c", host, 64), home, "{host}");
        }
        // Hosts of other domains spread over the partitions.
        let spread: std::collections::BTreeSet<usize> = (0..64)
            .map(|i| by.partition("c", &format!("www.d{i}.example"), 64))
            .collect();
        assert!(spread.len() > 20, "{spread:?}");
        // By host, a domain's hosts spread too.
        let hosts: std::collections::BTreeSet<usize> = (0..64)
            .map(|i| PartitionBy::Host.partition("c", &format!("h{i}.example.com"), 64))
            .collect();
        assert!(hosts.len() > 20, "{hosts:?}");
    }

    #[test]
    fn a_recorded_way_reads_back_and_an_unknown_one_is_refused() {
        for by in [PartitionBy::Host, PartitionBy::Domain] {
            assert_eq!(PartitionBy::from_code(by.code()), Some(by));
        }
        assert_eq!(PartitionBy::from_code(7), None);
    }
}
