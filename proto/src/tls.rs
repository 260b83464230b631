//! TLS on the client side of every gRPC link (worker to frontier, CLI to
//! frontier, node to node): which addresses use it, which CA their
//! certificates are checked against, and the certificate a client shows
//! a server that asks for one (mutual TLS).
//!
//! An `https://` address uses TLS, checked against `--tls-ca` when given
//! and the public web's roots otherwise; an `http://` one is plaintext. A
//! bare `host:port` (as ListNodes lists nodes) takes the scheme of the
//! address the client was given, so a cluster reached over TLS is reached
//! over TLS at every node.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Why a TLS setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {what} {path}")]
    Read {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A PEM file holds nothing of the kind asked.
    #[error("{what} {path} holds no PEM {kind}")]
    NotPem {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: String,
        /// What it should hold.
        kind: &'static str,
    },
    /// A certificate without its key, or a key without its certificate.
    #[error("--tls-cert and --tls-key go together")]
    HalfIdentity,
    /// The address is not a URI tonic can dial.
    #[error("invalid frontier address {address:?}: {reason}")]
    Address {
        /// The address.
        address: String,
        /// Why.
        reason: String,
    },
}

/// Reads a PEM file, checking that it holds a block of the kind asked
/// (`CERTIFICATE`, `PRIVATE KEY`).
///
/// # Errors
/// [`TlsError::Read`] or [`TlsError::NotPem`].
pub fn read_pem(what: &'static str, path: &Path, kind: &'static str) -> Result<Vec<u8>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })?;
    let text = String::from_utf8_lossy(&pem);
    let holds_kind = text
        .lines()
        .any(|line| line.starts_with("-----BEGIN ") && line.contains(kind));
    if !holds_kind {
        return Err(TlsError::NotPem {
            what,
            path: path.display().to_string(),
            kind,
        });
    }
    Ok(pem)
}

/// A client's TLS settings; the default dials `https://` addresses
/// against the public roots and shows no certificate.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    ca: Option<Certificate>,
    identity: Option<Identity>,
}

impl ClientTls {
    /// Settings from PEM files: the CA that signed the servers'
    /// certificates, and the client's own certificate and key (both or
    /// neither).
    ///
    /// # Errors
    /// A file that cannot be read or holds no PEM of its kind, or a
    /// certificate without its key.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let ca = ca
            .map(|path| read_pem("--tls-ca", path, "CERTIFICATE"))
            .transpose()?
            .map(Certificate::from_pem);
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some(Identity::from_pem(
                read_pem("--tls-cert", cert, "CERTIFICATE")?,
                read_pem("--tls-key", key, "PRIVATE KEY")?,
            )),
            (None, None) => None,
            _ => return Err(TlsError::HalfIdentity),
        };
        Ok(Self { ca, identity })
    }

    /// Settings from PEM bytes (tests, and callers that hold them).
    #[must_use]
    pub fn from_pem(ca: Option<&[u8]>, identity: Option<(&[u8], &[u8])>) -> Self {
        Self {
            ca: ca.map(Certificate::from_pem),
            identity: identity.map(|(cert, key)| Identity::from_pem(cert, key)),
        }
    }

    /// The endpoint to dial for `address`; a bare `host:port` takes
    /// `https` when `secure`, else `http`.
    ///
    /// # Errors
    /// [`TlsError::Address`] for an address that is not a URI.
    pub fn endpoint(&self, address: &str, secure: bool) -> Result<Endpoint, TlsError> {
        let uri = endpoint_with_scheme(address, secure);
        let invalid = |reason: String| TlsError::Address {
            address: address.to_owned(),
            reason,
        };
        let endpoint = Endpoint::from_shared(uri.clone()).map_err(|e| invalid(e.to_string()))?;
        if !uri.starts_with("https://") {
            return Ok(endpoint);
        }
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => config.ca_certificate(ca.clone()),
            None => config.with_webpki_roots(),
        };
        if let Some(identity) = &self.identity {
            config = config.identity(identity.clone());
        }
        endpoint
            .tls_config(config)
            .map_err(|e| invalid(e.to_string()))
    }
}

/// `address` as a URI: kept when it has a scheme (without a trailing
/// `/`), else `https://` or `http://` put in front.
#[must_use]
pub fn endpoint_with_scheme(address: &str, secure: bool) -> String {
    let address = address.trim_end_matches('/');
    if address.contains("://") {
        address.to_owned()
    } else if secure {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}

/// Whether an address the user gave asks for TLS.
#[must_use]
pub fn is_https(address: &str) -> bool {
    address
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("https://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_addresses_take_the_links_scheme() {
        assert_eq!(endpoint_with_scheme("n1:7071", false), "http://n1:7071");
        assert_eq!(endpoint_with_scheme("n1:7071", true), "https://n1:7071");
        assert_eq!(
            endpoint_with_scheme("http://n1:7071/", true),
            "http://n1:7071"
        );
        assert!(is_https("HTTPS://n1:7071"));
        assert!(!is_https("http://n1:7071"));
    }

    #[test]
    fn files_that_are_not_pem_are_named() {
        let dir = std::env::temp_dir().join(format!("proto-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ca.pem");
        std::fs::write(&file, "not a certificate").unwrap();
        let error = ClientTls::from_files(Some(&file), None, None).unwrap_err();
        assert!(
            error.to_string().contains("--tls-ca") && error.to_string().contains("CERTIFICATE"),
            "{error}"
        );
        let missing = ClientTls::from_files(Some(&dir.join("missing.pem")), None, None);
        assert!(matches!(missing, Err(TlsError::Read { .. })));
        assert!(matches!(
            ClientTls::from_files(None, Some(&file), None),
            Err(TlsError::HalfIdentity)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
