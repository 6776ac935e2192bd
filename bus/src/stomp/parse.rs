//! The STOMP 1.2 decoder and encoder, pure: bytes in, frames out, no I/O.
//!
//! The decoder is resumable and bounded. It first checks that the header
//! section is complete (a blank line arrived), enforcing the line length,
//! header count and frame size limits while it scans, and only then parses
//! it. It then knows the body's length from `content-length`, refuses a body
//! over the limit before buffering it, and waits for the whole body and its
//! NUL. Without `content-length` the body ends at the first NUL. Bytes it
//! already scanned are not scanned again when more arrive. A decoder made
//! with [`FrameDecoder::skipping_oversized`] (the transport's) skips an
//! oversized body instead of failing, so that one message cannot end a
//! session.
//!
//! Between frames, a lone LF or CRLF is a heart-beat (RabbitMQ also sends one
//! LF after every frame); the decoder reports each as [`Item::HeartBeat`] so
//! that the session can count it as a sign of life.
//!
//! After an error the stream cannot be resynchronised: the decoder keeps
//! returning the same error and the connection must be dropped.

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

use super::frame::{Command, Frame, unescape};

mod encode;

pub use self::encode::{EncodeError, EncodeOptions, Eol, encode};

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
    /// A frame whose body was over [`Limits::max_body`] and was skipped
    /// (only from [`FrameDecoder::skipping_oversized`]): its command and
    /// headers, an empty body, and the body's size in bytes. It cannot be
    /// encoded.
    TooLarge {
        /// The frame without its body.
        frame: Frame,
        /// How many body bytes were skipped.
        size: usize,
    },
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
    /// The announced body is over [`Limits::max_body`] and is to be skipped.
    oversized: bool,
}

impl Head {
    /// What is reported for a skipped frame: its headers, no body.
    fn into_too_large(self, size: usize) -> Item {
        Item::TooLarge {
            frame: Frame {
                command: self.command,
                headers: self.headers,
                body: Bytes::new(),
            },
            size,
        }
    }
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
    /// An oversized body is being discarded as it arrives (its header
    /// section is already consumed).
    Skip {
        head: Head,
        /// Body bytes still to discard; `None` without `content-length`
        /// (the body ends at the first NUL).
        remaining: Option<usize>,
        /// Body bytes discarded so far.
        size: usize,
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
    /// Skip over-limit bodies instead of failing (see [`FrameDecoder::skipping_oversized`]).
    skip_oversized: bool,
    state: State,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

/// What one step of the decoder did.
enum Step {
    /// An item is ready.
    Item(Item),
    /// More bytes are needed.
    More,
    /// The state changed; step again.
    Again,
}

impl FrameDecoder {
    /// A decoder with these limits; a body over [`Limits::max_body`] is a
    /// [`FrameError::BodyTooLarge`], fatal for the stream.
    pub fn new(limits: Limits) -> Self {
        FrameDecoder {
            limits,
            skip_oversized: false,
            state: START,
        }
    }

    /// A decoder that survives bodies over [`Limits::max_body`]: it reads
    /// the header section, then discards the body bytes as they arrive
    /// (never holding more than one read of them) and yields
    /// [`Item::TooLarge`] with the headers and the body's size. With
    /// `content-length` this is decided before any body byte is buffered;
    /// without it, once the body has passed the limit. Header limits stay fatal.
    pub fn skipping_oversized(limits: Limits) -> Self {
        FrameDecoder {
            skip_oversized: true,
            ..Self::new(limits)
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Decodes the next item from the front of `buf`, removing its bytes.
    /// `Ok(None)`: more bytes are needed (nothing is removed, except the
    /// body bytes of a frame being skipped).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, FrameError> {
        loop {
            let r = match &mut self.state {
                State::Failed(e) => Err(e.clone()),
                State::Head { .. } => self.step_head(buf),
                State::Body { .. } => self.step_body(buf),
                State::Skip { .. } => self.step_skip(buf),
            };
            match r {
                Ok(Step::Item(item)) => return Ok(Some(item)),
                Ok(Step::More) => return Ok(None),
                Ok(Step::Again) => {}
                Err(e) => {
                    self.state = State::Failed(e.clone());
                    return Err(e);
                }
            }
        }
    }

    /// Between frames and in the header section.
    fn step_head(&mut self, buf: &mut BytesMut) -> Result<Step, FrameError> {
        let limits = self.limits;
        let State::Head {
            scanned,
            line_start,
            lines,
        } = &mut self.state
        else {
            unreachable!("called in the Head state")
        };
        if *scanned == 0
            && let Some(step) = between_frames(buf)?
        {
            return Ok(step);
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
            return Ok(Step::More);
        };
        let head = parse_head(&buf[..head_len], head_len, &limits, self.skip_oversized)?;
        self.state = if head.oversized {
            buf.advance(head_len);
            let remaining = head.content_length;
            State::Skip {
                head,
                remaining,
                size: 0,
            }
        } else {
            State::Body { head, scanned: 0 }
        };
        Ok(Step::Again)
    }

    /// The header section is parsed; the body is awaited whole.
    fn step_body(&mut self, buf: &mut BytesMut) -> Result<Step, FrameError> {
        let limits = self.limits;
        let State::Body { head, scanned } = &mut self.state else {
            unreachable!("called in the Body state")
        };
        let start = head.head_len;
        let body_len = match head.content_length {
            Some(n) => {
                let total = start + n + 1;
                if buf.len() < total {
                    buf.reserve(total - buf.len());
                    return Ok(Step::More);
                }
                if buf[start + n] != 0 {
                    return Err(FrameError::MissingNul(n));
                }
                n
            }
            None => match buf[start + *scanned..].iter().position(|&b| b == 0) {
                Some(off) if *scanned + off <= limits.max_body => *scanned + off,
                found => {
                    let have = match found {
                        Some(off) => *scanned + off,
                        None => buf.len() - start,
                    };
                    if have > limits.max_body {
                        if !self.skip_oversized {
                            return Err(FrameError::BodyTooLarge {
                                size: have,
                                limit: limits.max_body,
                            });
                        }
                        // Discard what came so far and the rest as it comes.
                        let State::Body { head, .. } = std::mem::replace(&mut self.state, START)
                        else {
                            unreachable!("state checked above")
                        };
                        buf.advance(start);
                        self.state = State::Skip {
                            head,
                            remaining: None,
                            size: 0,
                        };
                        return Ok(Step::Again);
                    }
                    if buf.len() > limits.max_frame {
                        return Err(FrameError::FrameTooLarge {
                            limit: limits.max_frame,
                        });
                    }
                    *scanned = have;
                    return Ok(Step::More);
                }
            },
        };
        let mut raw = buf.split_to(start + body_len + 1).freeze();
        raw.truncate(start + body_len);
        let body: Bytes = raw.slice(start..);
        let State::Body { head, .. } = std::mem::replace(&mut self.state, START) else {
            unreachable!("state checked above")
        };
        Ok(Step::Item(Item::Frame(Frame {
            command: head.command,
            headers: head.headers,
            body,
        })))
    }

    /// Discards an oversized body, then its NUL.
    fn step_skip(&mut self, buf: &mut BytesMut) -> Result<Step, FrameError> {
        let State::Skip {
            remaining, size, ..
        } = &mut self.state
        else {
            unreachable!("called in the Skip state")
        };
        match remaining {
            Some(left) if *left > 0 => {
                let n = (*left).min(buf.len());
                buf.advance(n);
                *left -= n;
                *size += n;
                if *left > 0 {
                    return Ok(Step::More);
                }
                Ok(Step::Again)
            }
            Some(_) => match buf.first() {
                None => Ok(Step::More),
                Some(0) => {
                    buf.advance(1);
                    Ok(Step::Item(self.finish_skip()))
                }
                Some(_) => Err(FrameError::MissingNul(*size)),
            },
            None => match buf.iter().position(|&b| b == 0) {
                Some(off) => {
                    *size += off;
                    buf.advance(off + 1);
                    Ok(Step::Item(self.finish_skip()))
                }
                None => {
                    *size += buf.len();
                    buf.clear();
                    Ok(Step::More)
                }
            },
        }
    }

    fn finish_skip(&mut self) -> Item {
        let State::Skip { head, size, .. } = std::mem::replace(&mut self.state, START) else {
            unreachable!("called in the Skip state")
        };
        head.into_too_large(size)
    }
}

/// Between frames: a heart-beat (LF or CRLF), more bytes needed, or `None`
/// when a frame starts.
fn between_frames(buf: &mut BytesMut) -> Result<Option<Step>, FrameError> {
    match buf.first() {
        None => Ok(Some(Step::More)),
        Some(b'\n') => {
            buf.advance(1);
            Ok(Some(Step::Item(Item::HeartBeat)))
        }
        Some(b'\r') => match buf.get(1) {
            None => Ok(Some(Step::More)),
            Some(b'\n') => {
                buf.advance(2);
                Ok(Some(Step::Item(Item::HeartBeat)))
            }
            Some(_) => Err(FrameError::BareCr),
        },
        Some(_) => Ok(None),
    }
}

/// Parses a complete header section (`raw` ends with the blank line).
/// With `skip`, a `content-length` over the body limit marks the frame
/// oversized instead of failing.
fn parse_head(
    raw: &[u8],
    head_len: usize,
    limits: &Limits,
    skip: bool,
) -> Result<Head, FrameError> {
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
    let mut oversized = false;
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
                    if !skip {
                        return Err(FrameError::BodyTooLarge {
                            size: n,
                            limit: limits.max_body,
                        });
                    }
                    oversized = true;
                } else if head_len.saturating_add(n).saturating_add(1) > limits.max_frame {
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
        oversized,
    })
}

fn parse_length(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests;
