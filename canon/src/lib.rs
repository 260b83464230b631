//! URL canonicalisation: one spelling per resource, so that the frontier's
//! filter and store see equivalent URLs as one key, and a worker sends its
//! outlinks already in that spelling (it then crawls exactly against any
//! URL Frontier server, including one that stores URLs as given).
//!
//! Parsing follows the WHATWG URL standard (the `url` crate, as browsers
//! do), which already gives most of RFC 3986 section 6.2.2 and 6.2.3:
//! lower-case scheme and host, IDNA (Unicode hosts to punycode), the default
//! port removed, dot segments resolved (`%2e` counted as a dot, as browsers
//! count it), an empty path made `/`. On top of that this module:
//!
//! - decodes percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`)
//!   in the path and the query, and upper-cases the hex digits of every other
//!   escape (RFC 3986 6.2.2.1 and 6.2.2.2);
//! - removes the fragment (it never reaches the server);
//! - keeps the query's parameters in their order (reordering them can name a
//!   different resource);
//! - refuses what a crawler cannot fetch: schemes other than http and https,
//!   URLs without a host, and URLs longer than the caller's limit.

use url::Url;

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonError {
    /// Not a URL at all.
    #[error("not a valid URL: {0}")]
    Invalid(String),
    /// A scheme other than http or https.
    #[error("scheme {0:?} is not crawlable (only http and https are)")]
    UnsupportedScheme(String),
    /// No host to fetch from.
    #[error("URL has no host")]
    NoHost,
    /// Longer than the limit, before or after canonicalisation.
    #[error("URL is {length} bytes, over the limit of {limit}")]
    TooLong {
        /// Its length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
}

/// A URL in canonical form, with the parts the frontier keys on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalUrl {
    url: String,
    host: String,
}

impl CanonicalUrl {
    /// The canonical spelling.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The host (lower-case, punycode for IDNs, no port): the default queue
    /// key.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The canonical spelling, owned.
    #[must_use]
    pub fn into_string(self) -> String {
        self.url
    }
}

impl std::fmt::Display for CanonicalUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// Canonicalises an absolute URL. `max_length` bounds the input and the
/// result, in bytes; parsing work is bounded by it too, since longer input
/// is refused before it is parsed.
pub fn canonicalise(input: &str, max_length: usize) -> Result<CanonicalUrl, CanonError> {
    if input.len() > max_length {
        return Err(CanonError::TooLong {
            length: input.len(),
            limit: max_length,
        });
    }
    if let Some(host) = plainly_canonical(input) {
        return Ok(CanonicalUrl {
            url: input.to_owned(),
            host: input[host].to_owned(),
        });
    }
    canonicalise_by_parsing(input, max_length)
}

/// [`canonicalise`] without its shortcut for URLs already in canonical
/// form: what the shortcut is checked against.
#[doc(hidden)]
pub fn canonicalise_by_parsing(input: &str, max_length: usize) -> Result<CanonicalUrl, CanonError> {
    if input.len() > max_length {
        return Err(CanonError::TooLong {
            length: input.len(),
            limit: max_length,
        });
    }
    let mut url = Url::parse(input).map_err(|error| CanonError::Invalid(error.to_string()))?;
    canonicalise_parsed(&mut url, max_length)
}

/// Where the host is, if `input` is a URL that canonicalisation leaves as
/// it is, judged by a conservative reading of its bytes. Most URLs a
/// frontier takes are (workers send their links canonical, and reports
/// echo what was served), and parsing one costs more than the rest of
/// its way in. `None` is no verdict: the input is parsed.
///
/// What passes: `http://` or `https://`; a host of lower-case ASCII
/// labels (letters, digits, hyphens) whose last label starts with a
/// letter (so the URL standard reads no IPv4 number into it), and no
/// label starting `xn--` (punycode, which the parser validates); no port,
/// no user; then a path of characters the parser copies as they are
/// (unreserved, sub-delimiters, `:` `@` `/`), no `.` or `..` segment, and
/// escapes with upper-case hex that do not name an unreserved character;
/// optionally a query of the same characters and `?` (not `'`, which the
/// parser escapes in a query); no fragment.
fn plainly_canonical(input: &str) -> Option<std::ops::Range<usize>> {
    let bytes = input.as_bytes();
    let host_start = if input.starts_with("http://") {
        7
    } else if input.starts_with("https://") {
        8
    } else {
        return None;
    };
    let host_end = host_start + bytes[host_start..].iter().position(|&b| b == b'/')?;
    if !plain_host(&bytes[host_start..host_end]) {
        return None;
    }
    let mut in_query = false;
    let mut segment_start = host_end + 1;
    let mut index = host_end + 1;
    while index < bytes.len() {
        let byte = bytes[index];
        if COPIED_AS_IS[usize::from(byte)] {
            index += 1;
            continue;
        }
        match byte {
            b'/' if !in_query => {
                if dot_segment(&bytes[segment_start..index]) {
                    return None;
                }
                segment_start = index + 1;
            }
            b'?' => {
                if !in_query && dot_segment(&bytes[segment_start..index]) {
                    return None;
                }
                in_query = true;
            }
            b'%' => {
                let high = hex_upper(*bytes.get(index + 1)?)?;
                let low = hex_upper(*bytes.get(index + 2)?)?;
                if is_unreserved(high * 16 + low) {
                    return None;
                }
                index += 2;
            }
            b'\'' if !in_query => {}
            b'/' => {}
            _ => return None,
        }
        index += 1;
    }
    if !in_query && dot_segment(&bytes[segment_start..]) {
        return None;
    }
    Some(host_start..host_end)
}

/// Bytes the parser copies as they are into a path and a query alike:
/// unreserved characters, sub-delimiters but the quote (which it escapes
/// in a query), `:` and `@`.
const COPIED_AS_IS: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        byte += 1;
    }
    table
};

/// A host the URL standard keeps as it is written (see
/// [`plainly_canonical`]).
fn plain_host(host: &[u8]) -> bool {
    let mut labels = host.split(|&b| b == b'.').peekable();
    while let Some(label) = labels.next() {
        let plain = !label.is_empty()
            && !label.starts_with(b"xn--")
            && label
                .iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !plain || (labels.peek().is_none() && !label[0].is_ascii_lowercase()) {
            return false;
        }
    }
    true
}

fn dot_segment(segment: &[u8]) -> bool {
    segment == b"." || segment == b".."
}

/// The value of an upper-case hex digit: a lower-case one is not
/// canonical.
fn hex_upper(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Resolves a link found on a page against the page's URL (or its
/// `<base href>`), then canonicalises it.
pub fn canonicalise_relative(
    base: &Url,
    link: &str,
    max_length: usize,
) -> Result<CanonicalUrl, CanonError> {
    if link.len() > max_length {
        return Err(CanonError::TooLong {
            length: link.len(),
            limit: max_length,
        });
    }
    let mut url = base
        .join(link)
        .map_err(|error| CanonError::Invalid(error.to_string()))?;
    canonicalise_parsed(&mut url, max_length)
}

fn canonicalise_parsed(url: &mut Url, max_length: usize) -> Result<CanonicalUrl, CanonError> {
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(CanonError::UnsupportedScheme(other.to_owned())),
    }
    let host = match url.host_str() {
        Some(host) if !host.is_empty() => host.to_owned(),
        _ => return Err(CanonError::NoHost),
    };
    url.set_fragment(None);

    // Everything up to the path is already canonical; rebuild the rest with
    // the percent-encoding normalised.
    let serialized = url.as_str();
    let path_start = serialized.len() - url[url::Position::BeforePath..].len();
    let mut canonical = String::with_capacity(serialized.len());
    canonical.push_str(&serialized[..path_start]);
    normalise_escapes(url.path(), &mut canonical);
    if let Some(query) = url.query() {
        canonical.push('?');
        normalise_escapes(query, &mut canonical);
    }
    if canonical.len() > max_length {
        return Err(CanonError::TooLong {
            length: canonical.len(),
            limit: max_length,
        });
    }
    Ok(CanonicalUrl {
        url: canonical,
        host,
    })
}

/// Copies `part`, decoding `%XX` escapes of unreserved characters,
/// upper-casing the hex digits of the others, and encoding a `%` that starts
/// no escape as `%25` (the URL standard tolerates a lone `%`; left alone, a
/// later decode could make it part of an escape it never was).
fn normalise_escapes(part: &str, out: &mut String) {
    let bytes = part.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let escape = bytes
                .get(index + 1..index + 3)
                .and_then(|hex| Some((hex_value(hex[0])?, hex_value(hex[1])?)));
            match escape {
                Some((high, low)) => {
                    let decoded = high * 16 + low;
                    if is_unreserved(decoded) {
                        out.push(char::from(decoded));
                    } else {
                        out.push('%');
                        out.push(char::from(bytes[index + 1].to_ascii_uppercase()));
                        out.push(char::from(bytes[index + 2].to_ascii_uppercase()));
                    }
                    index += 3;
                }
                None => {
                    out.push_str("%25");
                    index += 1;
                }
            }
            continue;
        }
        // The url crate's serialisation is ASCII; copy byte by byte.
        out.push(char::from(bytes[index]));
        index += 1;
    }
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The largest number of times one path segment occurs in the URL's path:
/// crawler traps (calendars, session-id loops, relative-link echoes) grow
/// paths like `/a/b/a/b/a/b/...`.
#[must_use]
pub fn max_segment_repeat(url: &CanonicalUrl) -> usize {
    // A canonical URL is ASCII and starts `http://` or `https://`: its
    // path is found and split by bytes.
    let bytes = url.url.as_bytes();
    let after_scheme = bytes
        .iter()
        .position(|&b| b == b':')
        .map_or(bytes.len(), |at| (at + 3).min(bytes.len()));
    let path_start = bytes[after_scheme..]
        .iter()
        .position(|&b| b == b'/')
        .map_or(bytes.len(), |at| after_scheme + at);
    let path_end = bytes[path_start..]
        .iter()
        .position(|&b| b == b'?')
        .map_or(bytes.len(), |at| path_start + at);
    let segments = bytes[path_start..path_end]
        .split(|&b| b == b'/')
        .filter(|segment| !segment.is_empty());
    // Every URL the frontier takes is measured, and most paths have a few
    // segments: those are compared pairwise on the stack; a long path is
    // sorted, so that no path costs more than n log n.
    let mut few: [&[u8]; SHORT_PATH] = [&[]; SHORT_PATH];
    let mut count = 0;
    for segment in segments.clone() {
        if count == SHORT_PATH {
            return longest_run(segments.collect());
        }
        few[count] = segment;
        count += 1;
    }
    let few = &few[..count];
    (0..count)
        .map(|i| few[i..].iter().filter(|other| **other == few[i]).count())
        .max()
        .unwrap_or(0)
}

/// Segments a path may have to be measured pairwise.
const SHORT_PATH: usize = 16;

/// The longest run of equal segments once sorted.
fn longest_run(mut segments: Vec<&[u8]>) -> usize {
    segments.sort_unstable();
    segments
        .chunk_by(|a, b| a == b)
        .map(<[&[u8]]>::len)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LIMIT: usize = 2048;

    fn canon(input: &str) -> String {
        canonicalise(input, LIMIT).unwrap().into_string()
    }

    #[test]
    fn rfc_3986_normalisations() {
        let cases = [
            ("HTTP://Example.COM/", "http://example.com/"),
            ("http://example.com", "http://example.com/"),
            ("http://example.com:80/a", "http://example.com/a"),
            ("https://example.com:443/a", "https://example.com/a"),
            ("http://example.com:8080/a", "http://example.com:8080/a"),
            ("http://example.com/a/./b/../c", "http://example.com/a/c"),
            ("http://example.com/a/%2e%2E/c", "http://example.com/c"),
            (
                "http://example.com/%7Euser/%41%62%2d",
                "http://example.com/~user/Ab-",
            ),
            ("http://example.com/a%2fb%3a", "http://example.com/a%2Fb%3A"),
            (
                "http://example.com/?q=%7e%2F&a=1",
                "http://example.com/?q=~%2F&a=1",
            ),
            ("http://example.com/a#section", "http://example.com/a"),
            ("http://example.com/?b=2&a=1", "http://example.com/?b=2&a=1"),
            ("http://bücher.example/", "http://xn--bcher-kva.example/"),
            ("http://example.com/a b", "http://example.com/a%20b"),
            ("  http://example.com/  ", "http://example.com/"),
            ("http://example.com/100%", "http://example.com/100%25"),
            ("http://example.com/%zz%4", "http://example.com/%25zz%254"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), expected, "{input}");
        }
    }

    #[test]
    fn refusals_are_typed() {
        assert!(matches!(
            canonicalise("not a url", LIMIT),
            Err(CanonError::Invalid(_))
        ));
        assert_eq!(
            canonicalise("ftp://example.com/", LIMIT),
            Err(CanonError::UnsupportedScheme("ftp".into()))
        );
        assert_eq!(
            canonicalise("mailto:someone@example.com", LIMIT),
            Err(CanonError::UnsupportedScheme("mailto".into()))
        );
        let long = format!("http://example.com/{}", "a".repeat(3000));
        assert!(matches!(
            canonicalise(&long, LIMIT),
            Err(CanonError::TooLong { .. })
        ));
        // Growing past the limit through percent-encoding is refused too.
        let spaces = format!("http://example.com/a{}b", " ".repeat(1000));
        assert!(matches!(
            canonicalise(&spaces, 1100),
            Err(CanonError::TooLong { .. })
        ));
    }

    #[test]
    fn relative_links_resolve_against_the_page() {
        let base = Url::parse("http://example.com/dir/page.html").unwrap();
        let resolve = |link| {
            canonicalise_relative(&base, link, LIMIT)
                .unwrap()
                .into_string()
        };
        assert_eq!(resolve("other.html"), "http://example.com/dir/other.html");
        assert_eq!(resolve("../up.html"), "http://example.com/up.html");
        assert_eq!(resolve("/root"), "http://example.com/root");
        assert_eq!(resolve("//other.org/x"), "http://other.org/x");
        assert_eq!(resolve("#frag"), "http://example.com/dir/page.html");
        assert_eq!(resolve("?q=1"), "http://example.com/dir/page.html?q=1");
        assert!(canonicalise_relative(&base, "javascript:void(0)", LIMIT).is_err());
    }

    #[test]
    fn repeated_segments_are_counted() {
        let url = canonicalise("http://example.com/a/b/a/b/a/c?a/a/a/a", LIMIT).unwrap();
        assert_eq!(max_segment_repeat(&url), 3);
        let root = canonicalise("http://example.com/", LIMIT).unwrap();
        assert_eq!(max_segment_repeat(&root), 0);
    }

    proptest! {
        #[test]
        fn segment_repeats_match_a_count_of_each_segment(
            segments in prop::collection::vec("[ab]{1,2}", 0..40),
        ) {
            let url = canonicalise(&format!("http://example.com/{}", segments.join("/")), LIMIT).unwrap();
            let mut counts = std::collections::HashMap::new();
            for segment in &segments {
                *counts.entry(segment.as_str()).or_insert(0) += 1;
            }
            prop_assert_eq!(max_segment_repeat(&url), counts.values().copied().max().unwrap_or(0));
        }
    }

    /// Inputs near the shortcut's edges: its alphabet and what it must
    /// leave to the parser (dots, escapes, quotes, upper case, ports,
    /// numbers and punycode in hosts).
    fn near_canonical() -> impl Strategy<Value = String> {
        let host = prop::collection::vec(
            prop::sample::select(vec![
                "a",
                "example",
                "com",
                "0",
                "12",
                "0x1f",
                "xn--bcher-kva",
                "xn--zz",
                "-",
                "a-b",
                "B",
                "",
                "é",
                "_",
            ]),
            1..4,
        )
        .prop_map(|labels| labels.join("."));
        let path = prop::collection::vec(
            prop::sample::select(vec![
                "/", "a", "Z", ".", "..", "%2e", "%2E", "%41", "%2F", "%2f", "%3A", "%", "%G1",
                "?", "'", "!", "$", "&", "(", "*", "+", ",", ";", "=", ":", "@", "~", "-", "_",
                " ", "#", "\\", "^", "|", "`", "{", "\"", "<", "\t", "é",
            ]),
            0..12,
        )
        .prop_map(|parts| parts.concat());
        (
            prop::sample::select(vec!["http://", "https://", "HTTP://", "ftp://", "http:/"]),
            host,
            prop::sample::select(vec!["", ":80", ":8080", ":"]),
            path,
        )
            .prop_map(|(scheme, host, port, path)| format!("{scheme}{host}{port}/{path}"))
    }

    proptest! {
        #[test]
        fn the_shortcut_answers_as_parsing_does(input in near_canonical()) {
            prop_assert_eq!(
                canonicalise(&input, LIMIT),
                canonicalise_by_parsing(&input, LIMIT)
            );
            if let Some(host) = plainly_canonical(&input) {
                let parsed = canonicalise_by_parsing(&input, LIMIT).unwrap();
                prop_assert_eq!(parsed.as_str(), input.as_str());
                prop_assert_eq!(parsed.host(), &input[host]);
            }
        }

        #[test]
        fn the_shortcut_takes_every_canonical_url_of_a_plain_alphabet(
            input in "https?://[a-z]{1,3}(\\.[a-z]{1,3}){0,2}/[a-zA-Z0-9/~_-]{0,10}(\\?[a-z=&/?]{0,8})?",
        ) {
            let parsed = canonicalise_by_parsing(&input, LIMIT).unwrap();
            if parsed.as_str() == input {
                prop_assert!(plainly_canonical(&input).is_some(), "{} was parsed", input);
            }
        }
    }

    fn segment() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                prop::char::range('a', 'z').prop_map(String::from),
                prop::char::range('A', 'Z').prop_map(String::from),
                Just("-".to_string()),
                Just("~".to_string()),
                Just("%20".to_string()),
                Just("%2F".to_string()),
                Just("é".to_string()),
            ],
            1..6,
        )
        .prop_map(|parts| parts.concat())
    }

    fn url_parts() -> impl Strategy<Value = (String, Vec<String>, Option<String>)> {
        (
            prop::sample::select(vec![
                "example.com",
                "a.example.org",
                "bücher.de",
                "10.0.0.1",
            ]),
            prop::collection::vec(segment(), 0..5),
            prop::option::of(segment()),
        )
            .prop_map(|(host, segments, query)| (host.to_string(), segments, query))
    }

    /// Percent-encodes every ASCII letter of a string outside its escapes,
    /// the way a careless client might.
    fn over_encode(text: &str) -> String {
        let mut out = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '%' {
                out.push(c);
                out.extend(chars.by_ref().take(2));
            } else if c.is_ascii_alphabetic() {
                out.push_str(&format!("%{:02x}", c as u8));
            } else {
                out.push(c);
            }
        }
        out
    }

    proptest! {
        #[test]
        fn canonicalisation_is_idempotent(input in "[ -~]{0,80}") {
            let with_scheme = format!("http://example.com/{input}");
            if let Ok(once) = canonicalise(&with_scheme, LIMIT) {
                let twice = canonicalise(once.as_str(), LIMIT).unwrap();
                prop_assert_eq!(once.as_str(), twice.as_str());
            }
        }

        #[test]
        fn equivalent_spellings_meet((host, segments, query) in url_parts(), fragment in "[a-z]{0,5}") {
            let path = segments.join("/");
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            let plain = format!("http://{host}/{path}{query}");
            let shouted = format!("HTTP://{}:80/./{}{query}#{fragment}", host.to_uppercase(), over_encode(&path));
            prop_assert_eq!(canon(&plain), canon(&shouted));
        }

        #[test]
        fn distinct_resources_stay_distinct(
            (host, segments, query) in url_parts(),
            (other_host, other_segments, other_query) in url_parts(),
        ) {
            let build = |host: &str, segments: &[String], query: &Option<String>| {
                format!(
                    "http://{host}/{}{}",
                    segments.join("/"),
                    query.as_ref().map(|q| format!("?{q}")).unwrap_or_default()
                )
            };
            let a = canon(&build(&host, &segments, &query));
            let b = canon(&build(&other_host, &other_segments, &other_query));
            // Same canonical form only if the parts are equal once letters
            // are compared the way canonicalisation compares them: hosts
            // case-insensitively, paths and queries exactly.
            let same_parts = host.eq_ignore_ascii_case(&other_host)
                && segments == other_segments
                && query == other_query;
            prop_assert_eq!(a == b, same_parts, "{} vs {}", a, b);
        }
    }
}
