//! Sitemap reading (sitemaps.org protocol): `<urlset>` gives page URLs,
//! `<sitemapindex>` gives more sitemaps. Gzip is detected by its magic
//! bytes and inflated up to a cap, so a compressed bomb stops there.

use std::io::Read;

use quick_xml::events::Event;

/// Most bytes a sitemap may inflate to (the protocol's limit is 50 MB).
pub const MAX_SITEMAP_BYTES: usize = 50 * 1024 * 1024;

/// Most URLs taken from one sitemap (the protocol's limit).
pub const MAX_SITEMAP_URLS: usize = 50_000;

/// What one sitemap lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sitemap {
    /// Page URLs (`<urlset>`).
    pub pages: Vec<String>,
    /// Further sitemaps (`<sitemapindex>`).
    pub sitemaps: Vec<String>,
}

/// Why a sitemap could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SitemapError {
    /// Not valid gzip.
    #[error("sitemap is not valid gzip: {0}")]
    Gzip(std::io::Error),
    /// Not well-formed XML.
    #[error("sitemap is not well-formed XML: {0}")]
    Xml(String),
}

/// Reads a sitemap, plain or gzip-compressed. A compressed one is parsed
/// as it is inflated, never inflated whole: what it holds in memory is its
/// compressed bytes and the URLs it lists.
pub fn parse_sitemap(bytes: &[u8]) -> Result<Sitemap, SitemapError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let inflating = flate2::read::MultiGzDecoder::new(bytes).take(MAX_SITEMAP_BYTES as u64);
        parse_xml(std::io::BufReader::new(inflating))
    } else {
        parse_xml(&bytes[..bytes.len().min(MAX_SITEMAP_BYTES)])
    }
}

/// A reading error: the inflater's (damaged gzip) or the XML's.
fn read_error(error: quick_xml::Error) -> SitemapError {
    match error {
        quick_xml::Error::Io(io) => {
            SitemapError::Gzip(std::io::Error::new(io.kind(), io.to_string()))
        }
        error => SitemapError::Xml(error.to_string()),
    }
}

fn parse_xml(xml: impl std::io::BufRead) -> Result<Sitemap, SitemapError> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut sitemap = Sitemap::default();
    // Element names from the root down (local names, namespaces ignored).
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut text = String::new();
    let mut buffer = Vec::new();
    loop {
        let event = reader.read_event_into(&mut buffer).map_err(read_error)?;
        match event {
            Event::Start(start) => {
                path.push(start.local_name().as_ref().to_ascii_lowercase());
                text.clear();
            }
            Event::Text(t) => {
                if let Ok(unescaped) = t.unescape() {
                    text.push_str(&unescaped);
                }
            }
            Event::CData(c) => text.push_str(&String::from_utf8_lossy(&c)),
            Event::End(_) => {
                let is_loc = path.last().is_some_and(|name| name == b"loc");
                if is_loc && path.len() >= 2 {
                    let parent = &path[path.len() - 2];
                    let loc = text.trim().to_owned();
                    if !loc.is_empty() {
                        if parent == b"url" && sitemap.pages.len() < MAX_SITEMAP_URLS {
                            sitemap.pages.push(loc);
                        } else if parent == b"sitemap" && sitemap.sitemaps.len() < MAX_SITEMAP_URLS
                        {
                            sitemap.sitemaps.push(loc);
                        }
                    }
                }
                path.pop();
                text.clear();
            }
            Event::Eof => break,
            _ => {}
        }
        buffer.clear();
    }
    Ok(sitemap)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const URLSET: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <url><loc>http://s.example/a</loc><lastmod>2024-01-01</lastmod></url>
  <url><loc> http://s.example/b?x=1&amp;y=2 </loc></url>
  <url><loc><![CDATA[http://s.example/c]]></loc></url>
</urlset>"#;

    #[test]
    fn urlsets_and_indexes_are_read() {
        let sitemap = parse_sitemap(URLSET.as_bytes()).unwrap();
        assert_eq!(
            sitemap.pages,
            vec![
                "http://s.example/a",
                "http://s.example/b?x=1&y=2",
                "http://s.example/c"
            ]
        );
        let index = r#"<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
            <sitemap><loc>http://s.example/one.xml</loc></sitemap>
            <sitemap><loc>http://s.example/two.xml.gz</loc></sitemap></sitemapindex>"#;
        let sitemap = parse_sitemap(index.as_bytes()).unwrap();
        assert!(sitemap.pages.is_empty());
        assert_eq!(sitemap.sitemaps.len(), 2);
    }

    #[test]
    fn gzip_is_inflated() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(URLSET.as_bytes()).unwrap();
        let compressed = encoder.finish().unwrap();
        assert_eq!(parse_sitemap(&compressed).unwrap().pages.len(), 3);
        assert!(matches!(
            parse_sitemap(&compressed[..compressed.len() / 2]),
            Err(SitemapError::Gzip(_))
        ));
    }

    #[test]
    fn malformed_xml_is_an_error_not_a_panic() {
        assert!(parse_sitemap(b"<urlset><url><loc>http://x/</url></urlset>").is_err());
        assert!(parse_sitemap(b"").unwrap().pages.is_empty());
    }
}
