//! The admin token on the client side: an interceptor that adds
//! `authorization: Bearer TOKEN` to every call (the CLI's `--token`, the
//! worker's `--token`).

use tonic::metadata::{Ascii, MetadataValue};

/// Adds the token to every call, when there is one.
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

/// A token that cannot travel in a header.
#[derive(Debug, thiserror::Error)]
#[error("the token cannot travel in a header: it holds a control character")]
pub struct InvalidToken;

impl Bearer {
    /// An interceptor sending `token`, or nothing.
    pub fn new(token: Option<&str>) -> Result<Self, InvalidToken> {
        token
            .map(|token| format!("Bearer {token}").parse().map_err(|_| InvalidToken))
            .transpose()
            .map(Self)
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
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
    }
}
