//! Pages are untrusted: link extraction must end without panicking on any
//! bytes, and give only absolute http(s) URLs without fragments.

#![no_main]

use libfuzzer_sys::fuzz_target;
use url::Url;
use worker::links::{LinkOptions, extract_links};

fuzz_target!(|bytes: &[u8]| {
    let page = Url::parse("http://fuzz.example/dir/page.html").unwrap();
    if let Ok(found) = extract_links(bytes, &page, LinkOptions::default()) {
        for link in found.links {
            let url = Url::parse(&link).expect("links are absolute URLs");
            assert!(matches!(url.scheme(), "http" | "https"));
            assert!(url.fragment().is_none());
        }
    }
});
