//! `crawl --demo`: the bundled mock site started in this process, the
//! crawl pointed at it, and the result checked against the site's ground
//! truth.

use std::process::ExitCode;

use anyhow::Context;
use mock_site::{MockSite, SiteConfig, expected_fetches};

use crate::Args;

/// Deep enough that no page of the site (30 pages and the special ones)
/// can be first found beyond it; the calendar trap stops here.
const DEMO_MAX_DEPTH: u32 = 40;

/// The running demo site and what it was started with.
pub struct Demo {
    site: MockSite,
    config: SiteConfig,
    max_depth: u32,
}

impl Demo {
    /// Starts the site and points `args` at it: its root as the seed,
    /// private addresses allowed (it is on loopback), no politeness delay,
    /// the demo depth unless one was given, and a fresh output directory
    /// unless one was given.
    pub async fn start(args: &mut Args) -> anyhow::Result<Self> {
        let config = SiteConfig::default();
        let site = MockSite::start(config)
            .await
            .context("cannot start the mock site")?;
        eprintln!("demo: mock site serving on {}", site.base());
        args.urls = vec![format!("{}/", site.base())];
        args.allow_private = true;
        args.delay_ms = 0;
        let max_depth = *args.max_depth.get_or_insert(DEMO_MAX_DEPTH);
        if args.out.is_none() {
            let dir = tempfile::Builder::new()
                .prefix("crawl-demo-")
                .tempdir()
                .context("cannot create a demo directory")?;
            args.out = Some(dir.keep());
        }
        Ok(Self {
            site,
            config,
            max_depth,
        })
    }

    /// Checks the crawl against the site's ground truth: every page
    /// fetched exactly as often as a correct crawler fetches it.
    pub fn check(&self, warc_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
        let expected = expected_fetches(&self.config, self.max_depth);
        let fetched: std::collections::BTreeMap<String, u32> = self
            .site
            .fetch_counts()
            .into_iter()
            .filter(|(path, _)| path != "/robots.txt" && path != "/sitemap.xml")
            .collect();
        let records = worker::output::read_archive(warc_dir)?
            .into_iter()
            .filter(|record| record.kind == "response")
            .count();
        Ok(if fetched == expected {
            eprintln!(
                "demo: every page of the mock site's ground truth fetched as often as it should be ({} pages, {} fetches, {records} WARC responses); robots, nofollow, depth limit and traps obeyed",
                expected.len(),
                expected.values().sum::<u32>()
            );
            ExitCode::SUCCESS
        } else {
            let missing: Vec<_> = expected
                .iter()
                .filter(|(path, times)| fetched.get(*path) != Some(times))
                .collect();
            let extra: Vec<_> = fetched
                .keys()
                .filter(|path| !expected.contains_key(*path))
                .collect();
            eprintln!(
                "demo: the crawl differs from the ground truth: wrong counts {missing:?}, unexpected {extra:?}"
            );
            ExitCode::FAILURE
        })
    }
}
