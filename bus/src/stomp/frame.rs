//! STOMP 1.2 frames: commands, headers and header escaping. No I/O.
//!
//! A frame is a command line, header lines `name:value`, a blank line, a
//! body and a NUL byte. In every frame except `CONNECT`, `STOMP` and
//! `CONNECTED`, header names and values escape four bytes:
//!
//! | byte | escaped |
//! | --- | --- |
//! | CR (0x0d) | `\r` |
//! | LF (0x0a) | `\n` |
//! | `:` | `\c` |
//! | `\` | `\\` |
//!
//! Any other backslash sequence is a protocol error (STOMP 1.2, "Value Encoding").

use std::fmt;

use bytes::Bytes;
use thiserror::Error;

/// A STOMP command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Client: open a session.
    Connect,
    /// Client: open a session (STOMP 1.2 synonym of CONNECT).
    Stomp,
    /// Server: session opened.
    Connected,
    /// Client: send a message to a destination.
    Send,
    /// Client: subscribe to a destination.
    Subscribe,
    /// Client: cancel a subscription.
    Unsubscribe,
    /// Client: acknowledge a message.
    Ack,
    /// Client: reject a message.
    Nack,
    /// Client: begin a transaction.
    Begin,
    /// Client: commit a transaction.
    Commit,
    /// Client: abort a transaction.
    Abort,
    /// Client: close the session.
    Disconnect,
    /// Server: a message for a subscription.
    Message,
    /// Server: a frame with a `receipt` header was processed.
    Receipt,
    /// Server: something went wrong (usually followed by a close).
    Error,
}

impl Command {
    /// Every command, in the order of the STOMP specification.
    pub const ALL: [Command; 15] = [
        Command::Connect,
        Command::Stomp,
        Command::Connected,
        Command::Send,
        Command::Subscribe,
        Command::Unsubscribe,
        Command::Ack,
        Command::Nack,
        Command::Begin,
        Command::Commit,
        Command::Abort,
        Command::Disconnect,
        Command::Message,
        Command::Receipt,
        Command::Error,
    ];

    /// The command as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Connected => "CONNECTED",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
            Command::Message => "MESSAGE",
            Command::Receipt => "RECEIPT",
            Command::Error => "ERROR",
        }
    }

    /// Parses a command line (without its end of line).
    pub fn parse(line: &[u8]) -> Option<Command> {
        Command::ALL
            .into_iter()
            .find(|c| c.as_str().as_bytes() == line)
    }

    /// Whether header names and values of this command are escaped
    /// (all but `CONNECT`, `STOMP` and `CONNECTED`).
    pub fn escapes_headers(self) -> bool {
        !matches!(self, Command::Connect | Command::Stomp | Command::Connected)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One frame. `content-length` is not kept among the headers: it is framing,
/// derived from the body when encoding and checked when decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The command.
    pub command: Command,
    /// Headers in wire order; a repeated name keeps every occurrence, and
    /// only the first one counts (STOMP 1.2, "Repeated Header Entries").
    pub headers: Vec<(String, String)>,
    /// The body (empty for most commands).
    pub body: Bytes,
}

impl Frame {
    /// A frame with no headers and no body.
    pub fn new(command: Command) -> Self {
        Frame {
            command,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Adds a header (builder style).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds a header.
    pub fn push_header(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.headers.push((name.into(), value.into()));
    }

    /// Sets the body (builder style).
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// The value of the first header called `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A header value or name with an escape sequence STOMP 1.2 does not define.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("undefined escape sequence at byte {at}")]
pub struct EscapeError {
    /// Offset of the backslash.
    pub at: usize,
}

/// Appends `raw` to `out` with the four STOMP 1.2 escapes applied.
pub fn escape_into(raw: &[u8], out: &mut Vec<u8>) {
    for &b in raw {
        match b {
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b':' => out.extend_from_slice(b"\\c"),
            b'\\' => out.extend_from_slice(b"\\\\"),
            _ => out.push(b),
        }
    }
}

/// `raw` with the four STOMP 1.2 escapes applied.
pub fn escape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    escape_into(raw, &mut out);
    out
}

/// Reverses [`escape`]; an undefined sequence (`\t`, a trailing `\`) is an error.
pub fn unescape(escaped: &[u8]) -> Result<Vec<u8>, EscapeError> {
    let mut out = Vec::with_capacity(escaped.len());
    let mut i = 0;
    while i < escaped.len() {
        let b = escaped[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let decoded = match escaped.get(i + 1) {
            Some(b'r') => b'\r',
            Some(b'n') => b'\n',
            Some(b'c') => b':',
            Some(b'\\') => b'\\',
            _ => return Err(EscapeError { at: i }),
        };
        out.push(decoded);
        i += 2;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        for c in Command::ALL {
            assert_eq!(Command::parse(c.as_str().as_bytes()), Some(c));
        }
        assert_eq!(Command::parse(b"send"), None);
        assert_eq!(Command::parse(b""), None);
        assert!(!Command::Connect.escapes_headers());
        assert!(!Command::Connected.escapes_headers());
        assert!(Command::Message.escapes_headers());
    }

    #[test]
    fn escaping_follows_the_spec() {
        assert_eq!(escape(b"a:b\\c\r\nd"), b"a\\cb\\\\c\\r\\nd".to_vec());
        assert_eq!(
            unescape(b"a\\cb\\\\c\\r\\nd").unwrap(),
            b"a:b\\c\r\nd".to_vec()
        );
        assert_eq!(unescape(b"tab\\t"), Err(EscapeError { at: 3 }));
        assert_eq!(unescape(b"end\\"), Err(EscapeError { at: 3 }));
    }

    #[test]
    fn first_header_wins() {
        let f = Frame::new(Command::Message)
            .header("a", "1")
            .header("a", "2");
        assert_eq!(f.get("a"), Some("1"));
        assert_eq!(f.get("b"), None);
    }
}
