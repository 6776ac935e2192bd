//! The STOMP 1.2 encoder, pure: a frame in, bytes out. It refuses what the
//! decoder of [`super`] would refuse with the same limits, so that whatever
//! we write can be read back.

use bytes::BytesMut;
use thiserror::Error;

use super::{Item, Limits};
use crate::stomp::frame::{Command, escape_into};

/// Why a frame could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// A header of an unescaped frame (CONNECT, STOMP, CONNECTED) contains a
    /// byte it cannot carry.
    #[error("header {name:?} of a {command} frame cannot contain {what}")]
    NotRepresentable {
        /// The command.
        command: Command,
        /// The header name.
        name: String,
        /// What it contains.
        what: &'static str,
    },
    /// A body without `content-length` cannot contain NUL.
    #[error("a body without content-length cannot contain NUL")]
    NulInBody,
    /// More header lines (`content-length` included) than [`Limits::max_headers`].
    #[error("more than {limit} header lines")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// An encoded header line longer than [`Limits::max_header_line`].
    #[error("header {name:?} makes a line longer than {limit} bytes")]
    HeaderLineTooLong {
        /// The header name.
        name: String,
        /// The limit.
        limit: usize,
    },
    /// The frame exceeds a limit.
    #[error("frame of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Size of the body or frame.
        size: usize,
        /// The limit.
        limit: usize,
    },
}

/// End of line the encoder writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eol {
    /// LF (what we send).
    #[default]
    Lf,
    /// CRLF (allowed by STOMP 1.2; used by tests).
    CrLf,
}

/// How the encoder writes frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// End of line.
    pub eol: Eol,
    /// Write `content-length` for non-empty bodies (default). Without it the
    /// body may not contain NUL.
    pub content_length: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            eol: Eol::Lf,
            content_length: true,
        }
    }
}

/// Appends `item` to `dst`. `content-length` headers of the frame are
/// ignored: the encoder writes its own from the body.
pub fn encode(
    item: &Item,
    dst: &mut BytesMut,
    opts: EncodeOptions,
    limits: &Limits,
) -> Result<(), EncodeError> {
    let eol: &[u8] = match opts.eol {
        Eol::Lf => b"\n",
        Eol::CrLf => b"\r\n",
    };
    let frame = match item {
        Item::HeartBeat => {
            dst.extend_from_slice(eol);
            return Ok(());
        }
        Item::Frame(f) => f,
        // Its body is gone: writing it would misrepresent it.
        Item::TooLarge { size, .. } => {
            return Err(EncodeError::TooLarge {
                size: *size,
                limit: limits.max_body,
            });
        }
    };
    if frame.body.len() > limits.max_body {
        return Err(EncodeError::TooLarge {
            size: frame.body.len(),
            limit: limits.max_body,
        });
    }
    let escaped = frame.command.escapes_headers();
    let mut out = Vec::with_capacity(64 + frame.headers.len() * 32);
    out.extend_from_slice(frame.command.as_str().as_bytes());
    out.extend_from_slice(eol);
    let mut lines = 0usize;
    for (name, value) in &frame.headers {
        if name == "content-length" {
            continue;
        }
        lines += 1;
        let line_start = out.len();
        if escaped {
            escape_into(name.as_bytes(), &mut out);
            out.push(b':');
            escape_into(value.as_bytes(), &mut out);
        } else {
            let bad = |what| EncodeError::NotRepresentable {
                command: frame.command,
                name: name.clone(),
                what,
            };
            if name.contains(':') {
                return Err(bad("a colon in its name"));
            }
            if name.contains(['\r', '\n']) || value.contains(['\r', '\n']) {
                return Err(bad("CR or LF"));
            }
            out.extend_from_slice(name.as_bytes());
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        }
        // What the decoder will enforce, so that whatever we write can be read back.
        if out.len() - line_start > limits.max_header_line {
            return Err(EncodeError::HeaderLineTooLong {
                name: name.clone(),
                limit: limits.max_header_line,
            });
        }
        out.extend_from_slice(eol);
    }
    if opts.content_length && !frame.body.is_empty() {
        lines += 1;
    }
    if lines > limits.max_headers {
        return Err(EncodeError::TooManyHeaders {
            limit: limits.max_headers,
        });
    }
    if opts.content_length {
        if !frame.body.is_empty() {
            out.extend_from_slice(b"content-length:");
            out.extend_from_slice(frame.body.len().to_string().as_bytes());
            out.extend_from_slice(eol);
        }
    } else if frame.body.contains(&0) {
        return Err(EncodeError::NulInBody);
    }
    out.extend_from_slice(eol);
    let size = out.len() + frame.body.len() + 1;
    if size > limits.max_frame {
        return Err(EncodeError::TooLarge {
            size,
            limit: limits.max_frame,
        });
    }
    dst.reserve(size);
    dst.extend_from_slice(&out);
    dst.extend_from_slice(&frame.body);
    dst.extend_from_slice(&[0]);
    Ok(())
}
