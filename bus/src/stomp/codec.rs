//! The thin `tokio_util::codec` layer over the pure decoder and encoder of [`super::parse`].

use std::io;

use bytes::BytesMut;
use thiserror::Error;
use tokio_util::codec::{Decoder, Encoder};

use super::parse::{EncodeError, EncodeOptions, FrameDecoder, FrameError, Item, Limits, encode};

/// A STOMP 1.2 codec for `tokio_util::codec::Framed`.
#[derive(Debug, Default)]
pub struct StompCodec {
    decoder: FrameDecoder,
    limits: Limits,
    opts: EncodeOptions,
}

impl StompCodec {
    /// A codec with these limits, writing LF line ends and `content-length`;
    /// a body over the limit is a decoding error.
    pub fn new(limits: Limits) -> Self {
        StompCodec {
            decoder: FrameDecoder::new(limits),
            limits,
            opts: EncodeOptions::default(),
        }
    }

    /// The transport's codec: like [`StompCodec::new`], but a body over the
    /// limit is skipped and reported as [`Item::TooLarge`]
    /// ([`FrameDecoder::skipping_oversized`]).
    pub fn skipping_oversized(limits: Limits) -> Self {
        StompCodec {
            decoder: FrameDecoder::skipping_oversized(limits),
            ..Self::new(limits)
        }
    }
}

/// Errors of the codec: bad input, an unencodable frame, or I/O.
#[derive(Debug, Error)]
pub enum CodecError {
    /// The peer sent bytes that are not STOMP 1.2 within our limits.
    #[error("bad frame from the peer: {0}")]
    Decode(#[from] FrameError),
    /// A frame we wanted to send cannot be encoded.
    #[error("cannot encode frame: {0}")]
    Encode(#[from] EncodeError),
    /// The socket failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

impl Decoder for StompCodec {
    type Item = Item;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Item>, CodecError> {
        Ok(self.decoder.decode(src)?)
    }
}

impl Encoder<Item> for StompCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Item, dst: &mut BytesMut) -> Result<(), CodecError> {
        Ok(encode(&item, dst, self.opts, &self.limits)?)
    }
}
