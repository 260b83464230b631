//! Admission rules: which canonical URLs a crawl accepts, and why it refuses
//! the others (the reasons are counted in the crawl's progress).

use std::collections::HashSet;

use regex::RegexSet;

use crate::canonical::{CanonicalUrl, max_segment_repeat};

/// Why a URL was not stored. `Duplicate` and the URL-level refusals come
/// from elsewhere in ingest; the rules here produce the scope, depth and trap
/// reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// Already known to the crawl.
    Duplicate,
    /// Outside the crawl's scope (hosts, include/exclude patterns).
    OutOfScope,
    /// Deeper than the crawl's depth limit.
    TooDeep,
    /// Not a crawlable URL.
    Invalid,
    /// Over the length limit.
    TooLong,
    /// A path segment repeats more often than the trap limit allows.
    Trap,
    /// The URL's metadata is larger than the frontier takes.
    MetadataTooLarge,
}

impl SkipReason {
    /// A stable lower-case name, for logs, metrics and the admin API.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Duplicate => "duplicate",
            SkipReason::OutOfScope => "out_of_scope",
            SkipReason::TooDeep => "too_deep",
            SkipReason::Invalid => "invalid",
            SkipReason::TooLong => "too_long",
            SkipReason::Trap => "trap",
            SkipReason::MetadataTooLarge => "metadata_too_large",
        }
    }
}

/// Which hosts a crawl stays on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScopeMode {
    /// Only the hosts of the crawl's seeds. A crawl without seeds is open.
    #[default]
    Seeds,
    /// The seeds' registrable domains (example.co.uk for www.example.co.uk)
    /// and every host under them. A crawl without seeds is open.
    Domain,
    /// Any host.
    Any,
}

impl std::str::FromStr for ScopeMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "seeds" => Ok(ScopeMode::Seeds),
            "domain" => Ok(ScopeMode::Domain),
            "any" => Ok(ScopeMode::Any),
            other => Err(format!(
                "unknown scope {other:?}: expected seeds, domain or any"
            )),
        }
    }
}

/// The hosts a crawl's seeds registered, kept with their registrable
/// domains so that the domain scope costs one set lookup per suffix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedHosts {
    hosts: HashSet<String>,
    domains: HashSet<String>,
}

impl SeedHosts {
    /// Registers the host of a seed.
    pub fn add(&mut self, host: &str) {
        let host = host.to_ascii_lowercase();
        self.domains.insert(registrable_domain(&host).to_owned());
        self.hosts.insert(host);
    }

    /// Whether no seed was registered (the crawl is then open).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Whether `host` is registered (as given, lower-cased).
    #[must_use]
    pub fn contains(&self, host: &str) -> bool {
        self.hosts.contains(&host.to_ascii_lowercase())
    }

    /// The registered hosts.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.iter().map(String::as_str)
    }

    fn admits(&self, mode: ScopeMode, host: &str) -> bool {
        match mode {
            ScopeMode::Any => true,
            _ if self.is_empty() => true,
            ScopeMode::Seeds => self.hosts.contains(host),
            ScopeMode::Domain => self.domains.contains(registrable_domain(host)),
        }
    }
}

/// The registrable domain ("eTLD+1") of a host by the public suffix list;
/// IP addresses and hosts the list knows nothing of are their own domain.
pub(crate) fn registrable_domain(host: &str) -> &str {
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return host;
    }
    psl::domain_str(host).unwrap_or(host)
}

/// Errors in the rules' configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RulesError {
    /// An include or exclude pattern is not a valid regular expression.
    #[error("invalid {which} pattern: {source}")]
    Pattern {
        /// "include" or "exclude".
        which: &'static str,
        /// What the regex parser said.
        source: regex::Error,
    },
}

/// A crawl's admission rules.
#[derive(Debug, Clone)]
pub struct Rules {
    mode: ScopeMode,
    include: Option<RegexSet>,
    exclude: Option<RegexSet>,
    max_depth: Option<u32>,
    max_path_repeat: usize,
}

impl Rules {
    /// The rules in words, the same for the same configuration on every
    /// machine: cluster nodes compare it, so that a URL gets one verdict
    /// whichever node takes it.
    #[must_use]
    pub fn describe(&self) -> String {
        let patterns = |set: &Option<RegexSet>| {
            set.as_ref()
                .map_or_else(Vec::new, |set| set.patterns().to_vec())
        };
        format!(
            "scope={:?} include={:?} exclude={:?} max_depth={:?} max_path_repeat={}",
            self.mode,
            patterns(&self.include),
            patterns(&self.exclude),
            self.max_depth,
            self.max_path_repeat
        )
    }

    /// Rules from their configuration: `include` patterns (a URL must match
    /// one, when any are given), `exclude` patterns (it must match none),
    /// the depth limit (seeds are depth 0) and the path-repeat trap limit.
    pub fn new(
        mode: ScopeMode,
        include: &[String],
        exclude: &[String],
        max_depth: Option<u32>,
        max_path_repeat: usize,
    ) -> Result<Self, RulesError> {
        let compile = |patterns: &[String], which| {
            if patterns.is_empty() {
                Ok(None)
            } else {
                RegexSet::new(patterns)
                    .map(Some)
                    .map_err(|source| RulesError::Pattern { which, source })
            }
        };
        Ok(Self {
            mode,
            include: compile(include, "include")?,
            exclude: compile(exclude, "exclude")?,
            max_depth,
            max_path_repeat,
        })
    }

    /// Whether the crawl takes `url` found at `depth`. Seeds pass `depth`
    /// 0 and are admitted whatever the host scope says (they define it).
    pub fn admit(
        &self,
        url: &CanonicalUrl,
        depth: u32,
        seeds: &SeedHosts,
    ) -> Result<(), SkipReason> {
        if self.max_depth.is_some_and(|limit| depth > limit) {
            return Err(SkipReason::TooDeep);
        }
        if depth > 0 && !seeds.admits(self.mode, url.host()) {
            return Err(SkipReason::OutOfScope);
        }
        if let Some(include) = &self.include
            && !include.is_match(url.as_str())
        {
            return Err(SkipReason::OutOfScope);
        }
        if let Some(exclude) = &self.exclude
            && exclude.is_match(url.as_str())
        {
            return Err(SkipReason::OutOfScope);
        }
        if max_segment_repeat(url) > self.max_path_repeat {
            return Err(SkipReason::Trap);
        }
        Ok(())
    }
}

impl Default for Rules {
    /// Seeds scope, no patterns, no depth limit, a segment may repeat 3
    /// times.
    fn default() -> Self {
        Self {
            mode: ScopeMode::Seeds,
            include: None,
            exclude: None,
            max_depth: None,
            max_path_repeat: 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::canonicalise;

    fn url(text: &str) -> CanonicalUrl {
        canonicalise(text, 2048).unwrap()
    }

    fn seeds(hosts: &[&str]) -> SeedHosts {
        let mut seeds = SeedHosts::default();
        hosts.iter().for_each(|host| seeds.add(host));
        seeds
    }

    #[test]
    fn seeds_scope_keeps_to_seed_hosts() {
        let rules = Rules::default();
        let seeds = seeds(&["www.example.co.uk"]);
        assert_eq!(
            rules.admit(&url("http://www.example.co.uk/a"), 1, &seeds),
            Ok(())
        );
        assert_eq!(
            rules.admit(&url("http://shop.example.co.uk/a"), 1, &seeds),
            Err(SkipReason::OutOfScope)
        );
        // A seed itself defines the scope, so it is always admitted.
        assert_eq!(rules.admit(&url("http://other.org/"), 0, &seeds), Ok(()));
        // No seeds: open.
        assert_eq!(
            rules.admit(&url("http://other.org/"), 5, &SeedHosts::default()),
            Ok(())
        );
    }

    #[test]
    fn domain_scope_uses_the_public_suffix_list() {
        let rules = Rules::new(ScopeMode::Domain, &[], &[], None, 3).unwrap();
        let seeds = seeds(&["www.example.co.uk", "10.0.0.1"]);
        for inside in [
            "http://shop.example.co.uk/",
            "http://example.co.uk/",
            "http://10.0.0.1/x",
        ] {
            assert_eq!(rules.admit(&url(inside), 1, &seeds), Ok(()), "{inside}");
        }
        for outside in [
            "http://other.co.uk/",
            "http://example.com/",
            "http://10.0.0.2/",
        ] {
            assert_eq!(
                rules.admit(&url(outside), 1, &seeds),
                Err(SkipReason::OutOfScope),
                "{outside}"
            );
        }
    }

    #[test]
    fn patterns_depth_and_traps() {
        let rules = Rules::new(
            ScopeMode::Any,
            &["^https?://example\\.com/".into()],
            &["\\.pdf$".into(), "/private/".into()],
            Some(2),
            2,
        )
        .unwrap();
        let none = SeedHosts::default();
        assert_eq!(rules.admit(&url("http://example.com/a"), 2, &none), Ok(()));
        assert_eq!(
            rules.admit(&url("http://example.com/a"), 3, &none),
            Err(SkipReason::TooDeep)
        );
        assert_eq!(
            rules.admit(&url("http://other.com/a"), 1, &none),
            Err(SkipReason::OutOfScope)
        );
        assert_eq!(
            rules.admit(&url("http://example.com/x.pdf"), 1, &none),
            Err(SkipReason::OutOfScope)
        );
        assert_eq!(
            rules.admit(&url("http://example.com/private/a"), 1, &none),
            Err(SkipReason::OutOfScope)
        );
        assert_eq!(
            rules.admit(&url("http://example.com/cal/2024/cal/2025/cal/"), 1, &none),
            Err(SkipReason::Trap)
        );
        assert!(matches!(
            Rules::new(ScopeMode::Any, &["(".into()], &[], None, 3),
            Err(RulesError::Pattern {
                which: "include",
                ..
            })
        ));
        assert_eq!("domain".parse::<ScopeMode>(), Ok(ScopeMode::Domain));
        assert!("hosts".parse::<ScopeMode>().is_err());
    }
}
