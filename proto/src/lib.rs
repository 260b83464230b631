//! The gRPC definitions the frontier and the worker speak, generated at build
//! time from `proto/*.proto` by protox (no `protoc` needed).
//!
//! # Layout
//!
//! - [`urlfrontier`]: the crawler-commons URL Frontier API v2.6, wire
//!   compatible (package `urlfrontier`, service `URLFrontier`): messages,
//!   the client ([`urlfrontier::url_frontier_client`]) and the server trait
//!   ([`urlfrontier::url_frontier_server`]).
//! - [`admin`]: the frontier's own admin API (package `frontier.admin.v1`,
//!   service `Admin`): filter health, rebuilds, seeds, progress, URL checks.
//! - [`bearer`]: the client-side interceptor that sends the admin token.
//! - [`codec`]: prost's codec, with undecodable messages answered as
//!   INVALID_ARGUMENT.
//! - [`metadata`]: the URL metadata keys worker and frontier agree on.
//! - [`metrics_endpoint`]: the Prometheus `GET /metrics` endpoint both
//!   binaries serve.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC server
//!   reflection.
//! - [`time`]: [`time::Timestamp`], the moment to the millisecond both
//!   programs use, and the one read of the system clock.
//! - [`tls`]: TLS on the client side of every gRPC link, and node
//!   addresses (as ListNodes lists them) as endpoints to dial.
//! - [`transport`]: what clients call through: a network channel, or a
//!   server's services in the same process.

pub mod bearer;
pub mod codec;
pub mod metadata;
pub mod metrics_endpoint;
pub mod time;
pub mod tls;
pub mod transport;

/// The URL Frontier API v2.6.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod urlfrontier {
    tonic::include_proto!("urlfrontier");
}

/// The frontier's admin API, `frontier.admin.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod admin {
    tonic::include_proto!("frontier.admin.v1");
}

impl urlfrontier::UrlItem {
    /// The URL the item carries, whichever its kind.
    #[must_use]
    pub fn info(&self) -> Option<&urlfrontier::UrlInfo> {
        match &self.item {
            Some(urlfrontier::url_item::Item::Discovered(d)) => d.info.as_ref(),
            Some(urlfrontier::url_item::Item::Known(k)) => k.info.as_ref(),
            None => None,
        }
    }

    /// The ID its ack carries: its own, or its URL when it has none.
    #[must_use]
    pub fn ack_id(&self) -> String {
        if self.id.is_empty() {
            self.info()
                .map_or_else(String::new, |info| info.url.clone())
        } else {
            self.id.clone()
        }
    }
}

/// Every compiled .proto file as an encoded `FileDescriptorSet`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::urlfrontier::{AckMessage, GetParams, UrlItem, get_params, url_item};

    /// Field numbers are the wire contract: encode messages by hand-built
    /// bytes and check the generated types read them as the spec says.
    #[test]
    fn field_numbers_match_the_spec() {
        // GetParams { max_urls_per_queue = 1: 5, crawlID = 6: "c" }
        let bytes = [0x08, 5, 0x32, 1, b'c'];
        let params = GetParams::decode(&bytes[..]).unwrap();
        assert_eq!(params.max_urls_per_queue, 5);
        assert_eq!(params.item, Some(get_params::Item::CrawlId("c".into())));

        // URLItem { known = 2: { refetchable_from_date = 2: 7 }, ID = 3: "x" }
        let bytes = [0x12, 2, 0x10, 7, 0x1a, 1, b'x'];
        let item = UrlItem::decode(&bytes[..]).unwrap();
        assert_eq!(item.id, "x");
        match item.item {
            Some(url_item::Item::Known(known)) => assert_eq!(known.refetchable_from_date, 7),
            other => panic!("expected a known item, got {other:?}"),
        }

        // AckMessage { status = 2: FAIL (2) }
        let ack = AckMessage::decode(&[0x10, 2][..]).unwrap();
        assert_eq!(ack.status(), super::urlfrontier::ack_message::Status::Fail);
    }

    #[test]
    fn descriptors_name_the_service() {
        let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).unwrap();
        let file = set
            .file
            .iter()
            .find(|f| f.package() == "urlfrontier")
            .unwrap();
        let service = &file.service[0];
        assert_eq!(service.name(), "URLFrontier");
        assert_eq!(service.method.len(), 19);
        let admin = set
            .file
            .iter()
            .find(|f| f.package() == "frontier.admin.v1")
            .unwrap();
        assert_eq!(admin.service[0].name(), "Admin");
        assert_eq!(admin.service[0].method.len(), 17);
    }
}
