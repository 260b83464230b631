//! Names to addresses for the fetcher: a stub resolver (hickory) that
//! keeps each answer for its TTL. A wide crawl connects to thousands of
//! hosts, each again after its polite delay and again after its idle
//! connection was closed; asking the system's resolver each time costs a
//! round trip to the name server per connection, and glibc keeps no cache.
//! Where no resolver configuration can be read (`/etc/resolv.conf`), names
//! go to the system's resolver, uncached.

use std::net::IpAddr;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::ResolverConfig;
use hickory_resolver::name_server::TokioConnectionProvider;

/// Answers kept at most (records): room for the hosts of a wide crawl,
/// a few MiB at most.
const CACHED_ANSWERS: usize = 64 * 1024;

/// Looks names up, through a TTL cache when it could be set up.
#[derive(Clone)]
pub struct Dns {
    cached: Option<TokioResolver>,
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns")
            .field("cached", &self.cached.is_some())
            .finish()
    }
}

impl Dns {
    /// The system's name servers and hosts file, as `/etc/resolv.conf`
    /// names them, answers kept for their TTL.
    #[must_use]
    pub fn system() -> Self {
        match TokioResolver::builder_tokio() {
            Ok(mut builder) => {
                builder.options_mut().cache_size = CACHED_ANSWERS;
                Self {
                    cached: Some(builder.build()),
                }
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    "no resolver configuration: names go to the system's resolver, uncached"
                );
                Self { cached: None }
            }
        }
    }

    /// The name servers of `config`, answers kept for their TTL.
    #[must_use]
    pub fn with_config(config: ResolverConfig) -> Self {
        let mut builder =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default());
        builder.options_mut().cache_size = CACHED_ANSWERS;
        Self {
            cached: Some(builder.build()),
        }
    }

    /// The addresses of `host`.
    pub async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        match &self.cached {
            Some(resolver) => match resolver.lookup_ip(host).await {
                Ok(found) => Ok(found.iter().collect()),
                Err(error) => Err(std::io::Error::other(format!("{host}: {error}"))),
            },
            None => Ok(tokio::net::lookup_host((host, 0))
                .await?
                .map(|address| address.ip())
                .collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::{Arc, Mutex};

    use hickory_resolver::config::{NameServerConfig, ResolverConfig};
    use hickory_resolver::proto::op::{Message, MessageType};
    use hickory_resolver::proto::rr::rdata::A;
    use hickory_resolver::proto::rr::{RData, Record, RecordType};
    use hickory_resolver::proto::xfer::Protocol;

    use super::*;

    /// A name server on loopback: every A question about a name is
    /// answered `address` with the name's TTL, and counted.
    async fn name_server(
        ttls: HashMap<&'static str, u32>,
        address: Ipv4Addr,
    ) -> (SocketAddr, Arc<Mutex<HashMap<String, usize>>>) {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let at = socket.local_addr().unwrap();
        let asked: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counted = Arc::clone(&asked);
        tokio::spawn(async move {
            let mut buffer = vec![0; 4096];
            loop {
                let Ok((length, from)) = socket.recv_from(&mut buffer).await else {
                    return;
                };
                let Ok(question) = Message::from_vec(&buffer[..length]) else {
                    continue;
                };
                let mut answer = Message::new();
                answer
                    .set_id(question.id())
                    .set_message_type(MessageType::Response)
                    .set_recursion_desired(question.recursion_desired())
                    .set_recursion_available(true);
                for query in question.queries() {
                    answer.add_query(query.clone());
                    let name = query.name().to_string();
                    let ttl = ttls.get(name.as_str());
                    if query.query_type() == RecordType::A
                        && let Some(ttl) = ttl
                    {
                        *counted.lock().unwrap().entry(name).or_default() += 1;
                        answer.add_answer(Record::from_rdata(
                            query.name().clone(),
                            *ttl,
                            RData::A(A(address)),
                        ));
                    }
                }
                let _ = socket.send_to(&answer.to_vec().unwrap(), from).await;
            }
        });
        (at, asked)
    }

    fn dns_at(server: SocketAddr) -> Dns {
        Dns::with_config(ResolverConfig::from_parts(
            None,
            Vec::new(),
            vec![NameServerConfig::new(server, Protocol::Udp)],
        ))
    }

    #[tokio::test]
    async fn an_answer_is_kept_for_its_ttl_and_asked_again_without_one() {
        let address = Ipv4Addr::new(192, 0, 2, 7);
        let (server, asked) = name_server(
            HashMap::from([("kept.test.", 300), ("fleeting.test.", 0)]),
            address,
        )
        .await;
        let dns = dns_at(server);
        for _ in 0..3 {
            assert_eq!(
                dns.lookup("kept.test.").await.unwrap(),
                [IpAddr::V4(address)]
            );
            assert_eq!(
                dns.lookup("fleeting.test.").await.unwrap(),
                [IpAddr::V4(address)]
            );
        }
        let asked = asked.lock().unwrap().clone();
        // Kept for 300 s: asked once. A TTL of 0 keeps nothing: asked for
        // each lookup, which shows the count sees every question.
        assert_eq!(asked.get("kept.test."), Some(&1), "{asked:?}");
        assert_eq!(asked.get("fleeting.test."), Some(&3), "{asked:?}");
    }

    #[tokio::test]
    async fn a_name_without_an_address_is_an_error() {
        let (server, _) = name_server(HashMap::new(), Ipv4Addr::LOCALHOST).await;
        let error = dns_at(server).lookup("nowhere.test.").await.unwrap_err();
        assert!(error.to_string().contains("nowhere.test."), "{error}");
    }
}
