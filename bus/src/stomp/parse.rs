//! The STOMP 1.2 decoder and encoder, pure: bytes in, frames out, no I/O.
//!
//! The decoder is resumable and bounded. It first checks that the header
//! section is complete (a blank line arrived), enforcing the line length,
//! header count and frame size limits while it scans, and only then parses
//! it. It then knows the body's length from `content-length`, refuses a body
//! over the limit before buffering it, and waits for the whole body and its
//! NUL. Without `content-length` the body ends at the first NUL. Bytes it
//! already scanned are not scanned again when more arrive.
//!
//! Between frames, a lone LF or CRLF is a heart-beat (RabbitMQ also sends one
//! LF after every frame); the decoder reports each as [`Item::HeartBeat`] so
//! that the session can count it as a sign of life.
//!
//! After an error the stream cannot be resynchronised: the decoder keeps
//! returning the same error and the connection must be dropped.

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

use super::frame::{Command, Frame, escape_into, unescape};

/// Size limits of the decoder and encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest whole frame (command, headers, body, NUL), in bytes.
    pub max_frame: usize,
    /// Most header lines in one frame, `content-length` included.
    pub max_headers: usize,
    /// Longest command or header line, in bytes (without its end of line).
    pub max_header_line: usize,
    /// Largest body, in bytes.
    pub max_body: usize,
}

/// Largest body accepted by default: 16 MiB, like the memory transport.
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: DEFAULT_MAX_BODY + 256 * 1024,
            max_headers: 128,
            max_header_line: 16 * 1024,
            max_body: DEFAULT_MAX_BODY,
        }
    }
}

/// What the decoder yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A frame.
    Frame(Frame),
    /// An end of line between frames.
    HeartBeat,
}

/// Why bytes could not be decoded. Every variant is fatal for the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The frame is larger than [`Limits::max_frame`].
    #[error("frame larger than the limit of {limit} bytes")]
    FrameTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A command or header line is longer than [`Limits::max_header_line`].
    #[error("header line longer than the limit of {limit} bytes")]
    HeaderLineTooLong {
        /// The limit.
        limit: usize,
    },
    /// More headers than [`Limits::max_headers`].
    #[error("more than {limit} headers in one frame")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// The body is larger than [`Limits::max_body`].
    #[error("body of at least {size} bytes exceeds the limit of {limit}")]
    BodyTooLarge {
        /// The announced (or already buffered) size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The command line is not a STOMP command.
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    /// A header line without a colon.
    #[error("header line without a colon: {0:?}")]
    MalformedHeader(String),
    /// A header with an escape sequence STOMP 1.2 does not define.
    #[error("undefined escape sequence in header line {0:?}")]
    InvalidEscape(String),
    /// A command or header that is not UTF-8.
    #[error("header line is not UTF-8: {0:?}")]
    NotUtf8(String),
    /// A `content-length` that is not a decimal number.
    #[error("invalid content-length {0:?}")]
    InvalidContentLength(String),
    /// The byte after a `content-length` body is not NUL.
    #[error("body of content-length {0} is not followed by NUL")]
    MissingNul(usize),
    /// A CR between frames that is not followed by LF.
    #[error("CR not followed by LF between frames")]
    BareCr,
}

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

/// A byte string for error messages: lossy UTF-8, at most 64 characters.
fn shown(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out: String = s.chars().take(64).collect();
    if s.chars().count() > 64 {
        out.push('…');
    }
    out
}

/// Partially parsed frame: the header section is complete.
#[derive(Debug)]
struct Head {
    head_len: usize,
    command: Command,
    headers: Vec<(String, String)>,
    content_length: Option<usize>,
}

#[derive(Debug)]
enum State {
    /// Looking for the blank line that ends the header section.
    Head {
        /// Bytes of the buffer already scanned.
        scanned: usize,
        /// Start of the line being scanned.
        line_start: usize,
        /// Complete lines so far (the command line included).
        lines: usize,
    },
    /// Header section parsed; waiting for the body.
    Body {
        head: Head,
        /// Bytes of the body already scanned for NUL (no content-length).
        scanned: usize,
    },
    /// A previous error; the stream is unusable.
    Failed(FrameError),
}

const START: State = State::Head {
    scanned: 0,
    line_start: 0,
    lines: 0,
};

/// The resumable, bounded STOMP 1.2 decoder.
#[derive(Debug)]
pub struct FrameDecoder {
    limits: Limits,
    state: State,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl FrameDecoder {
    /// A decoder with these limits.
    pub fn new(limits: Limits) -> Self {
        FrameDecoder {
            limits,
            state: START,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Decodes the next item from the front of `buf`, removing its bytes.
    /// `Ok(None)`: more bytes are needed (nothing is removed).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, FrameError> {
        match self.step(buf) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.state = State::Failed(e.clone());
                Err(e)
            }
        }
    }

    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, FrameError> {
        let limits = self.limits;
        loop {
            match &mut self.state {
                State::Failed(e) => return Err(e.clone()),
                State::Head {
                    scanned,
                    line_start,
                    lines,
                } => {
                    if *scanned == 0 {
                        // Between frames: heart-beats.
                        match buf.first() {
                            None => return Ok(None),
                            Some(b'\n') => {
                                buf.advance(1);
                                return Ok(Some(Item::HeartBeat));
                            }
                            Some(b'\r') => match buf.get(1) {
                                None => return Ok(None),
                                Some(b'\n') => {
                                    buf.advance(2);
                                    return Ok(Some(Item::HeartBeat));
                                }
                                Some(_) => return Err(FrameError::BareCr),
                            },
                            Some(_) => {}
                        }
                    }
                    let mut head_len = None;
                    let mut i = *scanned;
                    while let Some(off) = buf[i..].iter().position(|&b| b == b'\n') {
                        let end = i + off;
                        let mut content_end = end;
                        if content_end > *line_start && buf[content_end - 1] == b'\r' {
                            content_end -= 1;
                        }
                        let len = content_end - *line_start;
                        if len > limits.max_header_line {
                            return Err(FrameError::HeaderLineTooLong {
                                limit: limits.max_header_line,
                            });
                        }
                        i = end + 1;
                        if i > limits.max_frame {
                            return Err(FrameError::FrameTooLarge {
                                limit: limits.max_frame,
                            });
                        }
                        if len == 0 {
                            head_len = Some(i);
                            break;
                        }
                        *lines += 1;
                        if *lines > limits.max_headers + 1 {
                            return Err(FrameError::TooManyHeaders {
                                limit: limits.max_headers,
                            });
                        }
                        *line_start = i;
                    }
                    let Some(head_len) = head_len else {
                        // Incomplete: check what is buffered against the limits now,
                        // so that a peer cannot make us buffer without bound.
                        if buf.len() - *line_start > limits.max_header_line + 1 {
                            return Err(FrameError::HeaderLineTooLong {
                                limit: limits.max_header_line,
                            });
                        }
                        if buf.len() > limits.max_frame {
                            return Err(FrameError::FrameTooLarge {
                                limit: limits.max_frame,
                            });
                        }
                        *scanned = buf.len();
                        return Ok(None);
                    };
                    let head = parse_head(&buf[..head_len], head_len, &limits)?;
                    self.state = State::Body { head, scanned: 0 };
                }
                State::Body { head, scanned } => {
                    let start = head.head_len;
                    let body_len = match head.content_length {
                        Some(n) => {
                            let total = start + n + 1;
                            if buf.len() < total {
                                buf.reserve(total - buf.len());
                                return Ok(None);
                            }
                            if buf[start + n] != 0 {
                                return Err(FrameError::MissingNul(n));
                            }
                            n
                        }
                        None => match buf[start + *scanned..].iter().position(|&b| b == 0) {
                            Some(off) => {
                                let n = *scanned + off;
                                if n > limits.max_body {
                                    return Err(FrameError::BodyTooLarge {
                                        size: n,
                                        limit: limits.max_body,
                                    });
                                }
                                n
                            }
                            None => {
                                let have = buf.len() - start;
                                if have > limits.max_body {
                                    return Err(FrameError::BodyTooLarge {
                                        size: have,
                                        limit: limits.max_body,
                                    });
                                }
                                if buf.len() > limits.max_frame {
                                    return Err(FrameError::FrameTooLarge {
                                        limit: limits.max_frame,
                                    });
                                }
                                *scanned = have;
                                return Ok(None);
                            }
                        },
                    };
                    let mut raw = buf.split_to(start + body_len + 1).freeze();
                    raw.truncate(start + body_len);
                    let body: Bytes = raw.slice(start..);
                    let State::Body { head, .. } = std::mem::replace(&mut self.state, START) else {
                        unreachable!("state checked above")
                    };
                    return Ok(Some(Item::Frame(Frame {
                        command: head.command,
                        headers: head.headers,
                        body,
                    })));
                }
            }
        }
    }
}

/// Parses a complete header section (`raw` ends with the blank line).
fn parse_head(raw: &[u8], head_len: usize, limits: &Limits) -> Result<Head, FrameError> {
    let mut lines = raw.split(|&b| b == b'\n').map(|l| match l.last() {
        Some(b'\r') => &l[..l.len() - 1],
        _ => l,
    });
    let cmd_line = lines.next().unwrap_or_default();
    let command =
        Command::parse(cmd_line).ok_or_else(|| FrameError::UnknownCommand(shown(cmd_line)))?;
    let escaped = command.escapes_headers();
    let mut headers = Vec::new();
    let mut content_length = None;
    let mut seen_length = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| FrameError::MalformedHeader(shown(line)))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let text = |part: &[u8]| -> Result<String, FrameError> {
            let bytes = if escaped {
                unescape(part).map_err(|_| FrameError::InvalidEscape(shown(line)))?
            } else {
                part.to_vec()
            };
            String::from_utf8(bytes).map_err(|_| FrameError::NotUtf8(shown(line)))
        };
        let (name, value) = (text(name)?, text(value)?);
        if name == "content-length" {
            // The first occurrence counts; every occurrence is framing, not a header.
            if !seen_length {
                seen_length = true;
                let n = parse_length(&value)
                    .ok_or_else(|| FrameError::InvalidContentLength(shown(value.as_bytes())))?;
                if n > limits.max_body {
                    return Err(FrameError::BodyTooLarge {
                        size: n,
                        limit: limits.max_body,
                    });
                }
                if head_len.saturating_add(n).saturating_add(1) > limits.max_frame {
                    return Err(FrameError::FrameTooLarge {
                        limit: limits.max_frame,
                    });
                }
                content_length = Some(n);
            }
            continue;
        }
        headers.push((name, value));
    }
    Ok(Head {
        head_len,
        command,
        headers,
        content_length,
    })
}

fn parse_length(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
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

#[cfg(test)]
mod tests;
