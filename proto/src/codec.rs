//! The protobuf codec of the generated clients and servers: prost's, except
//! that a message that does not decode (invalid UTF-8 in a string field, a
//! truncated field, a wrong wire type) is INVALID_ARGUMENT, not INTERNAL.
//!
//! The gRPC library convention reports parse failures as INTERNAL, which
//! reads as a fault of the server; for a frontier fed by many independent
//! crawlers, a request that cannot be decoded is the caller's to fix, and
//! the status should say so. The message keeps prost's account of which
//! field was wrong.

use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Encodes `T` and decodes `U` with prost.
#[derive(Debug)]
pub struct Codec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(ProstDecoder::default())
    }
}

/// prost's decoder with decode failures as INVALID_ARGUMENT.
#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        tonic::codec::Decoder::decode(&mut self.0, buf).map_err(|status| {
            Status::invalid_argument(format!("malformed message: {}", status.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        tonic::codec::Decoder::buffer_settings(&self.0)
    }
}
