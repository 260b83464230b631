//! Link extraction throughput on a realistic page: about 100 KB of HTML
//! with a head, navigation, 400 links in every spelling the extractor
//! meets, paragraphs, a script and comments. Prints MB/s and links/s.
//!
//! `cargo bench -p worker --bench links [-- --iterations N]` (default 2,000).

use std::fmt::Write;
use std::time::Instant;

use url::Url;
use worker::links::{LinkOptions, extract_links};

fn page() -> String {
    let mut html = String::from(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>A realistic page</title>\
         <link rel=\"stylesheet\" href=\"/static/site.css\"><script src=\"/static/app.js\"></script>\
         <meta name=\"viewport\" content=\"width=device-width\"></head><body><nav><ul>",
    );
    for i in 0..40 {
        let _ = write!(html, "<li><a href=\"/section/{i}/\">Section {i}</a></li>");
    }
    html.push_str("</ul></nav><main>");
    for i in 0..360 {
        let href = match i % 6 {
            0 => format!("/articles/{i}.html"),
            1 => format!("https://example.org/articles/{i}?ref=home&amp;page=2"),
            2 => format!("../related/{i}"),
            3 => format!("article-{i}.html#comments"),
            4 => format!("//cdn.example.org/media/{i}.jpg"),
            _ => format!("  /tags/tag-{}  ", i % 50),
        };
        let _ = write!(
            html,
            "<article><h2>Article {i}</h2><p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do \
             eiusmod tempor incididunt ut labore et dolore magna aliqua. <a href=\"{href}\">Read more</a>\
             </p><!-- tracking pixel {i} --></article>"
        );
    }
    html.push_str("<script>window.dataLayer = window.dataLayer || []; function gtag(){dataLayer.push(arguments);}</script>");
    html.push_str("</main><footer><a href=\"/about\">About</a> <a href=\"mailto:x@example.org\">Mail</a></footer></body></html>");
    html
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iterations: usize = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let html = page();
    let base = Url::parse("https://example.org/blog/2024/post.html").unwrap();
    let mut links = 0;
    let started = Instant::now();
    for _ in 0..iterations {
        links += extract_links(html.as_bytes(), &base, LinkOptions::default())
            .unwrap()
            .links
            .len();
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("| page bytes | links per page | pages | MB/s | pages/s | links/s |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {iterations} | {:.1} | {:.0} | {:.0} |",
        html.len(),
        links / iterations.max(1),
        (html.len() * iterations) as f64 / seconds / 1e6,
        iterations as f64 / seconds,
        links as f64 / seconds
    );
}
