//! Link extraction from HTML, streaming (lol_html): `a[href]` and
//! `area[href]`, resolved against `<base href>` (which applies to the whole
//! document, links before it included) or the page URL.
//!
//! Comments and script or style contents are never parsed as markup, so
//! links inside them are not extracted. `rel=nofollow` links and, under
//! `<meta name=robots content=nofollow>`, all links are left out unless
//! the caller ignores nofollow; `noindex` is recorded. Non-fetchable
//! schemes (javascript:, mailto:, tel:, data:, ...) are dropped, fragments
//! removed, and at most `max_outlinks` distinct links are kept, from at
//! most four times as many hrefs read (a page of a million tiny links
//! costs what one of twenty thousand does).

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use lol_html::{HtmlRewriter, Settings, element};
use url::Url;

/// How links are extracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOptions {
    /// Follow `rel=nofollow` links and nofollow pages anyway.
    pub ignore_nofollow: bool,
    /// Most links kept per page.
    pub max_outlinks: usize,
}

impl Default for LinkOptions {
    fn default() -> Self {
        Self {
            ignore_nofollow: false,
            max_outlinks: 5000,
        }
    }
}

/// What a page links to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageLinks {
    /// Absolute http(s) URLs without fragments, distinct, in document order.
    pub links: Vec<String>,
    /// The page asked robots not to index it.
    pub noindex: bool,
    /// The page asked robots not to follow its links.
    pub nofollow: bool,
    /// Links left out because they were nofollow.
    pub nofollow_skipped: usize,
    /// Links beyond `max_outlinks`, left out: the distinct ones among
    /// the hrefs collected, and every href past the collection bound
    /// (four times `max_outlinks`), which is not read.
    pub truncated: usize,
}

/// Raw hrefs collected per page, as a multiple of `max_outlinks`: room
/// for duplicates and nofollow links among them, while a page of a million
/// tiny links holds a bounded number in memory.
const HREFS_PER_OUTLINK: usize = 4;

#[derive(Default)]
struct Found {
    hrefs: Vec<(String, bool)>,
    // Hrefs past the collection bound, left out unread.
    uncollected: usize,
    base: Option<String>,
    noindex: bool,
    nofollow: bool,
}

/// Why a page could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("HTML parsing failed: {0}")]
pub struct ParseError(String);

fn has_token(value: &str, token: &str) -> bool {
    value
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .any(|part| part.eq_ignore_ascii_case(token))
}

/// Extracts the links of an HTML document fetched from `page`.
pub fn extract_links(
    html: &[u8],
    page: &Url,
    options: LinkOptions,
) -> Result<PageLinks, ParseError> {
    let found = Rc::new(RefCell::new(Found::default()));
    let collect_at_most = options.max_outlinks.saturating_mul(HREFS_PER_OUTLINK);
    {
        let on_link = {
            let found = Rc::clone(&found);
            move |el: &mut lol_html::html_content::Element<'_, '_>| {
                if found.borrow().hrefs.len() >= collect_at_most {
                    found.borrow_mut().uncollected += 1;
                    return Ok(());
                }
                if let Some(href) = el.get_attribute("href") {
                    let nofollow = el
                        .get_attribute("rel")
                        .is_some_and(|rel| has_token(&rel, "nofollow"));
                    found.borrow_mut().hrefs.push((href, nofollow));
                }
                Ok(())
            }
        };
        let on_area = on_link.clone();
        let on_base = {
            let found = Rc::clone(&found);
            move |el: &mut lol_html::html_content::Element<'_, '_>| {
                let mut found = found.borrow_mut();
                // The first <base href> counts (HTML's rule).
                if found.base.is_none() {
                    found.base = el.get_attribute("href");
                }
                Ok(())
            }
        };
        let on_meta = {
            let found = Rc::clone(&found);
            move |el: &mut lol_html::html_content::Element<'_, '_>| {
                let is_robots = el.get_attribute("name").is_some_and(|name| {
                    name.eq_ignore_ascii_case("robots") || name.eq_ignore_ascii_case("googlebot")
                });
                if is_robots && let Some(content) = el.get_attribute("content") {
                    let mut found = found.borrow_mut();
                    let none = has_token(&content, "none");
                    found.noindex |= none || has_token(&content, "noindex");
                    found.nofollow |= none || has_token(&content, "nofollow");
                }
                Ok(())
            }
        };
        let mut rewriter = HtmlRewriter::new(
            Settings {
                element_content_handlers: vec![
                    element!("a[href]", on_link),
                    element!("area[href]", on_area),
                    element!("base[href]", on_base),
                    element!("meta[name][content]", on_meta),
                ],
                ..Settings::new()
            },
            |_: &[u8]| {},
        );
        rewriter
            .write(html)
            .map_err(|e| ParseError(e.to_string()))?;
        rewriter.end().map_err(|e| ParseError(e.to_string()))?;
    }
    let found = Rc::try_unwrap(found)
        .map_err(|_| ParseError("handlers outlived the parser".into()))?
        .into_inner();
    let base = found
        .base
        .as_deref()
        .and_then(|base| {
            page.join(html_escape::decode_html_entities(base).trim())
                .ok()
        })
        .filter(|base| matches!(base.scheme(), "http" | "https"))
        .unwrap_or_else(|| page.clone());
    let mut result = PageLinks {
        noindex: found.noindex,
        nofollow: found.nofollow,
        truncated: found.uncollected,
        ..PageLinks::default()
    };
    let mut seen = HashSet::new();
    for (href, nofollow) in found.hrefs {
        let Some(url) = resolve(&base, &href) else {
            continue;
        };
        if !options.ignore_nofollow && (nofollow || found.nofollow) {
            result.nofollow_skipped += 1;
            continue;
        }
        if !seen.insert(url.clone()) {
            continue;
        }
        if result.links.len() >= options.max_outlinks {
            result.truncated += 1;
            continue;
        }
        result.links.push(url);
    }
    Ok(result)
}

/// Resolves one href as written in the markup: character references
/// decoded (lol_html hands attributes over raw), whitespace trimmed (HTML
/// strips it from URLs), fetchable schemes only, fragment removed.
#[must_use]
pub fn resolve(base: &Url, href: &str) -> Option<String> {
    let decoded = html_escape::decode_html_entities(href);
    let href = decoded.trim_matches(|c: char| c.is_ascii_whitespace());
    if href.is_empty() || href.starts_with('#') {
        return None;
    }
    let mut url = base.join(href).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    url.set_fragment(None);
    Some(url.into())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn links(html: &str) -> PageLinks {
        extract_links(
            html.as_bytes(),
            &Url::parse("http://site.example/dir/page.html").unwrap(),
            LinkOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn every_spelling_resolves_against_the_page() {
        let found = links(
            r##"<a href="http://other.example/x">abs</a>
               <a href="/root">root</a>
               <a href="rel">rel</a>
               <a href="../up">up</a>
               <a href="  spaced  ">ws</a>
               <a href="frag#part">frag</a>
               <a href="#only">same page</a>
               <a href="a&amp;b?x=1&amp;y=2">entities</a>
               <area href="/area" />
               <a href='single'>q</a><a href=bare>b</a>"##,
        );
        assert_eq!(
            found.links,
            vec![
                "http://other.example/x",
                "http://site.example/root",
                "http://site.example/dir/rel",
                "http://site.example/up",
                "http://site.example/dir/spaced",
                "http://site.example/dir/frag",
                "http://site.example/dir/a&b?x=1&y=2",
                "http://site.example/area",
                "http://site.example/dir/single",
                "http://site.example/dir/bare",
            ]
        );
    }

    #[test]
    fn base_href_applies_to_the_whole_document() {
        let found = links(
            r#"<a href="before">b</a><base href="http://cdn.example/base/"><a href="after">a</a>"#,
        );
        assert_eq!(
            found.links,
            vec![
                "http://cdn.example/base/before",
                "http://cdn.example/base/after"
            ]
        );
    }

    #[test]
    fn comments_scripts_and_unfetchable_schemes_give_no_links() {
        let found = links(
            r#"<!-- <a href="/commented">c</a> -->
               <script>document.write('<a href="/scripted">s</a>')</script>
               <style>a[href="/styled"] {}</style>
               <a href="javascript:void(0)">j</a><a href="mailto:x@y">m</a>
               <a href="tel:123">t</a><a href="data:text/html,hi">d</a>
               <a href="ftp://files.example/">f</a><a href="/real">r</a>"#,
        );
        assert_eq!(found.links, vec!["http://site.example/real"]);
    }

    #[test]
    fn nofollow_is_respected_unless_ignored() {
        let html = r#"<a href="/a" rel="nofollow">n</a><a href="/b" rel="external NoFollow">n</a><a href="/c">c</a>"#;
        let found = links(html);
        assert_eq!(found.links, vec!["http://site.example/c"]);
        assert_eq!(found.nofollow_skipped, 2);
        let page = r#"<meta name="ROBOTS" content="noindex, nofollow"><a href="/a">a</a>"#;
        let found = links(page);
        assert!(found.links.is_empty());
        assert!(found.noindex && found.nofollow);
        let ignored = extract_links(
            page.as_bytes(),
            &Url::parse("http://site.example/").unwrap(),
            LinkOptions {
                ignore_nofollow: true,
                ..LinkOptions::default()
            },
        )
        .unwrap();
        assert_eq!(ignored.links, vec!["http://site.example/a"]);
    }

    #[test]
    fn duplicates_are_dropped_and_the_count_is_capped() {
        let html: String = (0..10)
            .map(|i| format!(r##"<a href="/p{i}">x</a><a href="/p{i}#again">y</a>"##))
            .collect();
        let found = extract_links(
            html.as_bytes(),
            &Url::parse("http://site.example/").unwrap(),
            LinkOptions {
                max_outlinks: 4,
                ..LinkOptions::default()
            },
        )
        .unwrap();
        assert_eq!(found.links.len(), 4);
        // p4 to p7 among the 16 hrefs collected (four per link kept), and
        // the 4 hrefs after those, unread.
        assert_eq!(found.truncated, 8);
    }

    #[test]
    fn a_page_of_a_hundred_thousand_links_keeps_the_cap_and_counts_the_rest() {
        let html: String = (0..100_000)
            .map(|i| format!(r#"<a href="/{i}">x</a>"#))
            .collect();
        let found = extract_links(
            html.as_bytes(),
            &Url::parse("http://site.example/").unwrap(),
            LinkOptions {
                max_outlinks: 10,
                ..LinkOptions::default()
            },
        )
        .unwrap();
        assert_eq!(found.links.len(), 10);
        assert_eq!(found.links[9], "http://site.example/9");
        assert_eq!(found.truncated, 100_000 - 10);
    }

    #[test]
    fn malformed_html_still_yields_its_links() {
        let found = links(
            r#"<div><a href="/one">unclosed <p><a href=/two><table><a href="/three"</table>"#,
        );
        assert!(found.links.contains(&"http://site.example/one".to_owned()));
        assert!(found.links.contains(&"http://site.example/two".to_owned()));
    }

    proptest! {
        /// Whatever the bytes, extraction ends without panicking and every
        /// link it gives is an absolute http(s) URL without a fragment.
        #[test]
        fn any_input_gives_only_fetchable_links(html in proptest::collection::vec(any::<u8>(), 0..2000),
                                               hrefs in proptest::collection::vec("[ -~]{0,20}", 0..10)) {
            let mut doc = html;
            for href in &hrefs {
                doc.extend_from_slice(format!("<a href=\"{href}\">x</a>").as_bytes());
            }
            if let Ok(found) = extract_links(&doc, &Url::parse("http://site.example/d/").unwrap(), LinkOptions::default()) {
                for link in found.links {
                    let url = Url::parse(&link).unwrap();
                    prop_assert!(matches!(url.scheme(), "http" | "https"));
                    prop_assert!(url.fragment().is_none());
                }
            }
        }
    }
}
