//! Sitemaps are untrusted (and may be gzip): reading must end without
//! panicking on any bytes, within the URL cap.

#![no_main]

use libfuzzer_sys::fuzz_target;
use worker::sitemap::{MAX_SITEMAP_URLS, parse_sitemap};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(sitemap) = parse_sitemap(bytes) {
        assert!(sitemap.pages.len() <= MAX_SITEMAP_URLS);
        assert!(sitemap.sitemaps.len() <= MAX_SITEMAP_URLS);
    }
});
