//! Host names to addresses, shared by the worker (which connects) and the
//! frontier (which files hosts under their address for politeness).
//!
//! # Layout
//!
//! - [`pinned`]: names pinned to addresses before DNS, from a hosts(5)
//!   file (`--hosts-file`).
//! - [`dns`]: DNS answers kept for their TTL.
//! - [`Names`]: the two together: pinned first, then DNS.

pub mod dns;
pub mod pinned;

use std::net::IpAddr;
use std::sync::Arc;

pub use dns::Dns;
pub use pinned::{PinnedError, PinnedNames};

/// Looks a host up as the fetcher would connect to it: a pinned name's
/// addresses, else DNS's.
#[derive(Debug, Clone)]
pub struct Names {
    pinned: Arc<PinnedNames>,
    dns: Dns,
}

impl Names {
    /// Pinned names first, then `dns`.
    #[must_use]
    pub fn new(pinned: Arc<PinnedNames>, dns: Dns) -> Self {
        Self { pinned, dns }
    }

    /// The addresses of `host` (a name or an IP literal, IPv6 with or
    /// without brackets), in the order a connection tries them.
    pub async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        if let Some(addresses) = self.pinned.get(host) {
            return Ok(addresses.to_vec());
        }
        self.dns.lookup(host).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_and_pinned_names_need_no_dns() {
        let pinned = PinnedNames::parse("127.0.0.9 a.test\n").unwrap();
        let names = Names::new(Arc::new(pinned), Dns::system());
        let a: IpAddr = "127.0.0.9".parse().unwrap();
        assert_eq!(names.lookup("a.test").await.unwrap(), [a]);
        assert_eq!(names.lookup("A.TEST.").await.unwrap(), [a]);
        assert_eq!(
            names.lookup("[::1]").await.unwrap(),
            ["::1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            names.lookup("10.1.2.3").await.unwrap(),
            ["10.1.2.3".parse::<IpAddr>().unwrap()]
        );
    }
}
