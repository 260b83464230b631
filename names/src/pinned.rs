//! Names pinned to addresses before DNS, read from a hosts(5) file
//! (`--hosts-file`): a crawl of hosts that DNS does not know (staging
//! servers, a mock web on loopback) or whose addresses the operator
//! fixes. The SSRF guard still checks a pinned address.

use std::collections::HashMap;
use std::net::IpAddr;

/// Names to their addresses, in the file's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedNames {
    names: HashMap<String, Vec<IpAddr>>,
}

/// Why a hosts file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinnedError {
    #[error("line {line}: {address:?} is not an IP address")]
    Address { line: usize, address: String },
    #[error("line {line}: the address {address} names no host")]
    NoName { line: usize, address: String },
}

impl PinnedNames {
    /// Reads hosts(5) text: an address, then one or more names, per line;
    /// `#` starts a comment. Names match case-insensitively; a name on
    /// several lines gets every address, in order.
    pub fn parse(text: &str) -> Result<Self, PinnedError> {
        let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let content = line.split('#').next().unwrap_or_default();
            let mut words = content.split_whitespace();
            let Some(address) = words.next() else {
                continue;
            };
            let ip: IpAddr = address.parse().map_err(|_| PinnedError::Address {
                line: line_number,
                address: address.to_owned(),
            })?;
            let mut named = false;
            for name in words {
                named = true;
                let addresses = names
                    .entry(name.trim_end_matches('.').to_ascii_lowercase())
                    .or_default();
                if !addresses.contains(&ip) {
                    addresses.push(ip);
                }
            }
            if !named {
                return Err(PinnedError::NoName {
                    line: line_number,
                    address: address.to_owned(),
                });
            }
        }
        Ok(Self { names })
    }

    /// The addresses pinned for `name`, if any.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&[IpAddr]> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.names.get(&name).map(Vec::as_slice)
    }

    /// How many names are pinned.
    #[must_use]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name is pinned.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn hosts_lines_pin_every_name_with_comments_and_blanks_ignored() {
        let pinned = PinnedNames::parse(
            "# a comment\n\n127.0.0.2 a.test  B.test # trailing\n::1 a.test\n127.0.0.3\tc.test.\n",
        )
        .unwrap();
        assert_eq!(pinned.len(), 3);
        assert_eq!(
            pinned.get("A.TEST").unwrap(),
            &[
                "127.0.0.2".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(pinned.get("b.test").unwrap().len(), 1);
        assert_eq!(pinned.get("c.test.").unwrap().len(), 1);
        assert_eq!(pinned.get("d.test"), None);
    }

    #[test]
    fn a_bad_line_is_named() {
        assert_eq!(
            PinnedNames::parse("127.0.0.2 ok\nexample.org 1.2.3.4\n"),
            Err(PinnedError::Address {
                line: 2,
                address: "example.org".into()
            })
        );
        assert_eq!(
            PinnedNames::parse("10.0.0.1\n"),
            Err(PinnedError::NoName {
                line: 1,
                address: "10.0.0.1".into()
            })
        );
    }

    proptest! {
        #[test]
        fn any_text_parses_or_names_its_line(text in "\\PC{0,200}") {
            match PinnedNames::parse(&text) {
                Ok(pinned) => prop_assert!(pinned.len() <= text.split_whitespace().count()),
                Err(PinnedError::Address { line, .. } | PinnedError::NoName { line, .. }) => {
                    prop_assert!(line >= 1 && line <= text.lines().count());
                }
            }
        }
    }
}
