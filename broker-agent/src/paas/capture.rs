//! Bounded capture of a tool's output: the first and the last bytes are
//! kept, the middle is dropped and counted.
//!
//! Both ends matter: `oo-admin-ctl-district` prints each node's result
//! first and the `ERROR OUTPUT:` section last; `oo-admin-move` prints its
//! refusal after all of its debug lines.

use std::collections::VecDeque;

/// Output kept from one stream, at most `max` bytes.
#[derive(Debug, Clone)]
pub struct Capture {
    head_max: usize,
    tail_max: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    dropped: u64,
}

impl Capture {
    /// A capture keeping at most `max` bytes: half from the start, half
    /// from the end.
    pub fn new(max: usize) -> Capture {
        let head_max = max / 2;
        Capture {
            head_max,
            tail_max: max - head_max,
            head: Vec::new(),
            tail: VecDeque::new(),
            dropped: 0,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, mut bytes: &[u8]) {
        let room = self.head_max - self.head.len();
        if room > 0 {
            let n = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= self.tail_max {
            let skip = bytes.len() - self.tail_max;
            self.dropped += (self.tail.len() + skip) as u64;
            self.tail.clear();
            bytes = &bytes[skip..];
        } else {
            let over = (self.tail.len() + bytes.len()).saturating_sub(self.tail_max);
            self.tail.drain(..over);
            self.dropped += over as u64;
        }
        self.tail.extend(bytes);
    }

    /// The text kept (invalid UTF-8 replaced), with a marker where bytes were dropped.
    pub fn text(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            out.push_str(&format!("\n[... {} bytes not kept ...]\n", self.dropped));
        }
        let (a, b) = self.tail.as_slices();
        out.push_str(&String::from_utf8_lossy(&[a, b].concat()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = Capture::new(16);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.text(), "hello world");
    }

    #[test]
    fn long_output_keeps_both_ends_at_any_split() {
        let data: Vec<u8> = (0..200u8).map(|i| b'a' + i % 26).collect();
        for chunk in [1, 3, 7, 10, 64, 200] {
            let mut c = Capture::new(20);
            for piece in data.chunks(chunk) {
                c.push(piece);
            }
            let t = c.text();
            let head = String::from_utf8_lossy(&data[..10]).into_owned();
            let tail = String::from_utf8_lossy(&data[190..]).into_owned();
            assert_eq!(
                t,
                format!("{head}\n[... 180 bytes not kept ...]\n{tail}"),
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let mut c = Capture::new(64);
        c.push(b"ok \xff end");
        assert_eq!(c.text(), "ok \u{fffd} end");
    }
}
