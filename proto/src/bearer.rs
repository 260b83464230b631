//! The admin token on the client side: an interceptor that adds
//! `authorization: Bearer TOKEN` to every call (the CLI's `--token`, the
//! worker's `--token`), and, on the calls of one cluster node to another,
//! the cluster's node secret.

use tonic::metadata::{Ascii, MetadataValue};

/// The header that proves a call comes from a node of the cluster: the
/// secret its nodes share (kept in etcd). A call forwarded from node to
/// node means something only with it.
pub const NODE_SECRET_HEADER: &str = "x-frontier-node-secret";

/// Adds the token to every call, when there is one (and the node secret,
/// on a node's calls to its peers).
#[derive(Debug, Clone, Default)]
pub struct Bearer {
    token: Option<MetadataValue<Ascii>>,
    node_secret: Option<MetadataValue<Ascii>>,
}

/// A token that cannot travel in a header.
#[derive(Debug, thiserror::Error)]
#[error("the token cannot travel in a header: it holds a control character")]
pub struct InvalidToken;

impl Bearer {
    /// An interceptor sending `token`, or nothing.
    pub fn new(token: Option<&str>) -> Result<Self, InvalidToken> {
        let token = token
            .map(|token| format!("Bearer {token}").parse().map_err(|_| InvalidToken))
            .transpose()?;
        Ok(Self {
            token,
            node_secret: None,
        })
    }

    /// The same, also sending a cluster's node secret.
    pub fn with_node_secret(self, secret: &str) -> Result<Self, InvalidToken> {
        Ok(Self {
            node_secret: Some(secret.parse().map_err(|_| InvalidToken)?),
            ..self
        })
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        if let Some(value) = &self.node_secret {
            request
                .metadata_mut()
                .insert(NODE_SECRET_HEADER, value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    #[test]
    fn the_token_goes_on_every_call() {
        let mut bearer = Bearer::new(Some("s3cret")).unwrap();
        let request = bearer.call(tonic::Request::new(())).unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer s3cret"
        );
        let mut none = Bearer::new(None).unwrap();
        assert!(
            none.call(tonic::Request::new(()))
                .unwrap()
                .metadata()
                .get("authorization")
                .is_none()
        );
        assert!(Bearer::new(Some("new\nline")).is_err());
        let mut node = Bearer::new(None).unwrap().with_node_secret("n0de").unwrap();
        let request = node.call(tonic::Request::new(())).unwrap();
        assert_eq!(request.metadata().get(NODE_SECRET_HEADER).unwrap(), "n0de");
        assert!(request.metadata().get("authorization").is_none());
    }
}
