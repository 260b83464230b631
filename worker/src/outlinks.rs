//! A page's outlinks on their way to the frontier: spelled as the frontier
//! spells them, each once, none the seen cache knows the frontier has, in
//! batches of at most [`BATCH`]; then sent with the page's own report.
//!
//! The report rides in the last batch, so the frontier stores it in the
//! same commit as those outlinks, after it has acknowledged every earlier
//! batch: a page is never done while some of its outlinks are not
//! durable, and a page of fewer than [`BATCH`] links costs one commit and
//! one wait. A frontier that does not take reports in batches gets the
//! report by PutURLs once the last batch is acknowledged, which keeps the
//! same order.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use proto::metadata;
use proto::urlfrontier::UrlInfo;
use proto::urlfrontier::ack_message::Status as Ack;
use url::Url;

use crate::frontier_link::{FrontierLink, meta_value};
use crate::seen::{SeenCache, SeenKey};
use crate::stats::WorkerStats;

/// Links in one batch at most: the frontier takes a batch in one
/// transaction, and large sitemaps are split so that none grows huge.
pub(crate) const BATCH: usize = 1000;

/// What a batch of links is, which decides their metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Links {
    /// Found on a page: one link deeper.
    Page,
    /// A redirect's target, with the length of the chain that led to it.
    Redirect(u32),
    /// A sitemap's pages: one hop from the crawl's start (depth 1).
    SitemapPages,
    /// Sitemaps, at this sitemap index level.
    Sitemaps(u32),
}

/// What sending links takes of the worker.
pub(crate) struct LinkSink<'a> {
    pub(crate) link: &'a FrontierLink,
    pub(crate) seen: &'a SeenCache,
    pub(crate) stats: &'a WorkerStats,
    /// No link deeper than this is sent.
    pub(crate) max_depth: Option<u32>,
    /// Nor one longer than this, canonical.
    pub(crate) max_url_length: usize,
}

/// Links ready to send, and what the seen cache learns once the frontier
/// has them.
#[derive(Debug, Default)]
pub(crate) struct LinkBatch {
    items: Vec<UrlInfo>,
    /// Per item, its seen-cache key when it may be cached.
    cacheable: Vec<Option<SeenKey>>,
    /// The items' depth.
    depth: u32,
}

/// The links found at `url` (leased as `info`, at `depth`) as batches to
/// send; none when they are past the depth limit.
pub(crate) fn link_batches(
    sink: &LinkSink<'_>,
    info: &UrlInfo,
    url: &Url,
    depth: u32,
    links: Vec<String>,
    kind: Links,
) -> Vec<LinkBatch> {
    let link_depth = match kind {
        Links::Page | Links::Redirect(_) => depth + 1,
        Links::SitemapPages => 1,
        Links::Sitemaps(_) => 0,
    };
    if sink.max_depth.is_some_and(|max| link_depth > max) {
        return Vec::new();
    }
    let mut spelled = std::collections::HashSet::new();
    let mut items = Vec::new();
    let mut cacheable = Vec::new();
    for link in links {
        // A URL no frontier takes is not sent.
        let Ok(canonical) = canon::canonicalise(&link, sink.max_url_length) else {
            continue;
        };
        if !spelled.insert(canonical.as_str().to_owned()) {
            continue;
        }
        // Only a page's links to its own host are cached: the host is in
        // the crawl's scope already, so the frontier's answer for them
        // cannot change but by depth, which the cache keeps.
        let key = (kind == Links::Page && Some(canonical.host()) == url.host_str())
            .then(|| SeenCache::key(&info.crawl_id, canonical.as_str()));
        if let Some(key) = key
            && sink.seen.knows(key, link_depth)
        {
            sink.stats.links_cached.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut metadata = BTreeMap::from([
            (
                metadata::DEPTH.to_owned(),
                meta_value(link_depth.to_string()),
            ),
            (metadata::PARENT.to_owned(), meta_value(url.as_str())),
        ]);
        match kind {
            Links::Redirect(hops) => {
                metadata.insert(
                    metadata::REDIRECT_HOPS.to_owned(),
                    meta_value(hops.to_string()),
                );
            }
            Links::Sitemaps(level) => {
                metadata.insert(metadata::SITEMAP.to_owned(), meta_value(level.to_string()));
            }
            Links::Page | Links::SitemapPages => {}
        }
        items.push(UrlInfo {
            url: canonical.into_string(),
            key: String::new(),
            metadata,
            crawl_id: info.crawl_id.clone(),
        });
        cacheable.push(key);
    }
    sink.stats
        .links_sent
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    items
        .chunks(BATCH)
        .zip(cacheable.chunks(BATCH))
        .map(|(items, cacheable)| LinkBatch {
            items: items.to_vec(),
            cacheable: cacheable.to_vec(),
            depth: link_depth,
        })
        .collect()
}

/// Sends links found at `url` now, without a report (a new origin's
/// sitemaps); waits for the frontier's acknowledgement.
pub(crate) async fn send_links(
    sink: &LinkSink<'_>,
    info: &UrlInfo,
    url: &Url,
    links: Vec<String>,
    kind: Links,
) {
    for batch in link_batches(sink, info, url, 0, links, kind) {
        let statuses = sink
            .link
            .put_outlinks(url.to_string(), batch.items.clone())
            .await;
        note_acked(sink, &batch, &statuses);
    }
}

/// Sends a page's outlinks and then its report (`due` as its refetchable
/// date), the report in the last batch; returns once the frontier has
/// acknowledged all of them.
pub(crate) async fn send_page(
    sink: &LinkSink<'_>,
    batches: Vec<LinkBatch>,
    report: UrlInfo,
    due: u64,
) {
    let id = report.url.clone();
    let Some((last, earlier)) = batches.split_last() else {
        sink.link.put_known(report, due).await;
        return;
    };
    for batch in earlier {
        let statuses = sink
            .link
            .put_outlinks(id.clone(), batch.items.clone())
            .await;
        note_acked(sink, batch, &statuses);
    }
    let statuses = sink
        .link
        .put_outlinks_and_report(id, last.items.clone(), report, due)
        .await;
    note_acked(sink, last, &statuses);
}

/// What the frontier's answer to a batch teaches: the count of new URLs,
/// and the seen cache (a URL answered other than FAIL is the frontier's).
fn note_acked(sink: &LinkSink<'_>, batch: &LinkBatch, statuses: &[i32]) {
    let mut new = 0;
    for (status, key) in statuses.iter().zip(&batch.cacheable) {
        if *status == Ack::Ok as i32 {
            new += 1;
        }
        if let Some(key) = key
            && *status != Ack::Fail as i32
        {
            sink.seen.insert(*key, batch.depth);
        }
    }
    sink.stats.new_outlinks.fetch_add(new, Ordering::Relaxed);
}
