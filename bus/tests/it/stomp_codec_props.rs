//! Property tests of the STOMP codec: every split point and random
//! chunkings decode to the same frames, header escaping round-trips any
//! bytes, limits are enforced with the right error, garbage never panics.

use bytes::BytesMut;
use gearshift_bus::stomp::frame::{Command, Frame, escape, unescape};
use gearshift_bus::stomp::parse::{
    EncodeOptions, Eol, FrameDecoder, FrameError, Item, Limits, encode,
};
use proptest::prelude::*;

fn text(max: usize, banned: &'static [char]) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..max)
        .prop_map(move |cs| cs.into_iter().filter(|c| !banned.contains(c)).collect())
}

/// Any frame our encoder can write: arbitrary headers for escaped commands,
/// headers without CR/LF (and names without ':') for CONNECT/STOMP/CONNECTED.
fn frame() -> impl Strategy<Value = Frame> {
    let command = prop::sample::select(Command::ALL.to_vec());
    (command, prop::collection::vec(any::<u8>(), 0..96)).prop_flat_map(|(command, body)| {
        let header = if command.escapes_headers() {
            (text(12, &[]), text(24, &[])).boxed()
        } else {
            (text(12, &[':', '\r', '\n']), text(24, &['\r', '\n'])).boxed()
        };
        prop::collection::vec(header, 0..6).prop_map(move |headers| Frame {
            command,
            headers: headers
                .into_iter()
                .filter(|(k, _)| k != "content-length")
                .collect(),
            body: body.clone().into(),
        })
    })
}

fn options() -> impl Strategy<Value = EncodeOptions> {
    (any::<bool>(), any::<bool>()).prop_map(|(crlf, content_length)| EncodeOptions {
        eol: if crlf { Eol::CrLf } else { Eol::Lf },
        content_length,
    })
}

/// Encodes `frame`; without content-length its body loses its NULs.
fn wire(mut frame: Frame, opts: EncodeOptions) -> (Frame, Vec<u8>) {
    if !opts.content_length {
        let body: Vec<u8> = frame.body.iter().copied().filter(|&b| b != 0).collect();
        frame.body = body.into();
    }
    let mut buf = BytesMut::new();
    encode(
        &Item::Frame(frame.clone()),
        &mut buf,
        opts,
        &Limits::default(),
    )
    .expect("a valid frame encodes");
    (frame, buf.to_vec())
}

/// Feeds `chunks` one after the other, decoding all it can after each.
fn feed<'a>(
    limits: Limits,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<Item>, FrameError> {
    let mut d = FrameDecoder::new(limits);
    let mut buf = BytesMut::new();
    let mut out = vec![];
    for c in chunks {
        buf.extend_from_slice(c);
        while let Some(item) = d.decode(&mut buf)? {
            out.push(item);
        }
    }
    Ok(out)
}

fn chunked(bytes: &[u8], sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut rest = bytes;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(1)
            .clamp(1, rest.len());
        out.push(rest[..n].to_vec());
        rest = &rest[n..];
        i += 1;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_split_point_decodes_the_same_frame(
        f in frame(),
        opts in options(),
        beats in 0usize..3,
    ) {
        let (f, bytes) = wire(f, opts);
        let eol: &[u8] = if opts.eol == Eol::CrLf { b"\r\n" } else { b"\n" };
        let mut all = eol.repeat(beats);
        all.extend_from_slice(&bytes);
        all.extend_from_slice(eol);
        let mut expected = vec![Item::HeartBeat; beats];
        expected.push(Item::Frame(f));
        expected.push(Item::HeartBeat);
        for split in 0..=all.len() {
            let (a, b) = all.split_at(split);
            let got = feed(Limits::default(), [a, b]).unwrap();
            prop_assert_eq!(&got, &expected, "split at {}", split);
        }
    }

    #[test]
    fn random_chunkings_of_many_frames_decode_the_same(
        frames in prop::collection::vec((frame(), options()), 1..5),
        sizes in prop::collection::vec(1usize..40, 1..20),
    ) {
        let mut all = vec![];
        let mut expected = vec![];
        for (f, opts) in frames {
            let (f, bytes) = wire(f, opts);
            all.extend_from_slice(&bytes);
            all.push(b'\n');
            expected.push(Item::Frame(f));
            expected.push(Item::HeartBeat);
        }
        let chunks = chunked(&all, &sizes);
        let got = feed(Limits::default(), chunks.iter().map(Vec::as_slice)).unwrap();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn escaping_round_trips_any_bytes(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        let e = escape(&raw);
        prop_assert!(!e.iter().any(|b| matches!(b, b'\r' | b'\n' | b':')));
        prop_assert_eq!(unescape(&e).unwrap(), raw);
    }

    #[test]
    fn oversized_header_lines_are_refused(
        len in 65usize..400,
        sizes in prop::collection::vec(1usize..64, 1..8),
    ) {
        let limits = Limits { max_header_line: 64, ..Limits::default() };
        let f = Frame::new(Command::Send).header("h", "v".repeat(len));
        let (_, bytes) = wire(f, EncodeOptions::default());
        let chunks = chunked(&bytes, &sizes);
        let r = feed(limits, chunks.iter().map(Vec::as_slice));
        prop_assert_eq!(r, Err(FrameError::HeaderLineTooLong { limit: 64 }));
    }

    #[test]
    fn too_many_headers_are_refused(n in 9usize..40, split in 0usize..2000) {
        let limits = Limits { max_headers: 8, ..Limits::default() };
        let mut f = Frame::new(Command::Message);
        for i in 0..n {
            f.push_header(format!("h{i}"), "v");
        }
        let (_, bytes) = wire(f, EncodeOptions::default());
        let (a, b) = bytes.split_at(split.min(bytes.len()));
        prop_assert_eq!(feed(limits, [a, b]), Err(FrameError::TooManyHeaders { limit: 8 }));
    }

    #[test]
    fn oversized_bodies_are_refused(
        extra in 1usize..300,
        content_length in any::<bool>(),
        sizes in prop::collection::vec(1usize..128, 1..8),
    ) {
        let limits = Limits { max_body: 100, ..Limits::default() };
        let f = Frame::new(Command::Send).body(vec![b'x'; 100 + extra]);
        let opts = EncodeOptions { content_length, ..EncodeOptions::default() };
        let (_, bytes) = wire(f, opts);
        let chunks = chunked(&bytes, &sizes);
        match feed(limits, chunks.iter().map(Vec::as_slice)) {
            Err(FrameError::BodyTooLarge { size, limit: 100 }) => prop_assert!(size > 100),
            other => prop_assert!(false, "expected BodyTooLarge, got {:?}", other),
        }
    }

    #[test]
    fn oversized_frames_are_refused(body in 50usize..200, headers in 1usize..20) {
        let limits = Limits { max_frame: 120, ..Limits::default() };
        let mut f = Frame::new(Command::Send).body(vec![b'y'; body]);
        for i in 0..headers {
            f.push_header(format!("header-{i}"), "value");
        }
        let mut bytes = BytesMut::new();
        encode(&Item::Frame(f), &mut bytes, EncodeOptions::default(), &Limits::default()).unwrap();
        prop_assume!(bytes.len() > 120);
        prop_assert_eq!(
            feed(limits, [&bytes[..]]),
            Err(FrameError::FrameTooLarge { limit: 120 })
        );
    }

    #[test]
    fn garbage_never_panics_and_what_decodes_re_encodes(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        sizes in prop::collection::vec(1usize..64, 1..8),
    ) {
        let limits = Limits { max_frame: 300, max_headers: 6, max_header_line: 40, max_body: 200 };
        let chunks = chunked(&bytes, &sizes);
        let mut d = FrameDecoder::new(limits);
        let mut buf = BytesMut::new();
        let mut frames = vec![];
        'outer: for c in &chunks {
            buf.extend_from_slice(c);
            loop {
                match d.decode(&mut buf) {
                    Ok(Some(Item::Frame(f))) => frames.push(f),
                    Ok(Some(Item::HeartBeat)) => {}
                    Ok(Some(Item::TooLarge { .. })) => prop_assert!(false, "only a skipping decoder skips"),
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
        }
        for f in frames {
            let mut out = BytesMut::new();
            // Re-encoded under the same limits, it must decode under them again.
            if encode(&Item::Frame(f.clone()), &mut out, EncodeOptions::default(), &limits).is_ok() {
                let again = feed(limits, [&out[..]]).unwrap();
                prop_assert_eq!(again, vec![Item::Frame(f)]);
            }
        }
    }
}

#[test]
fn rabbitmq_style_stream_with_interleaved_heart_beats() {
    // RabbitMQ sends an LF after every frame and bare LFs as heart-beats.
    let wire =
        b"CONNECTED\nversion:1.2\nheart-beat:1000,1000\n\n\0\n\n\nRECEIPT\nreceipt-id:r1\n\n\0\n";
    for split in 0..=wire.len() {
        let (a, b) = wire.split_at(split);
        let got = feed(Limits::default(), [a, b]).unwrap();
        let beats = got.iter().filter(|i| **i == Item::HeartBeat).count();
        assert_eq!(beats, 4, "split {split}");
        assert_eq!(got.len(), 6, "split {split}");
    }
}

proptest! {
    #[test]
    fn a_skipping_decoder_gets_the_frame_after_an_oversized_one(
        extra in 1usize..400,
        content_length in any::<bool>(),
        sizes in prop::collection::vec(1usize..64, 1..8),
    ) {
        let limits = Limits { max_body: 100, ..Limits::default() };
        let big = Frame::new(Command::Message).header("ack", "a1").body(vec![b'x'; 100 + extra]);
        let small = Frame::new(Command::Message).header("ack", "a2").body(&b"ok"[..]);
        let opts = EncodeOptions { content_length, ..EncodeOptions::default() };
        let (_, mut bytes) = wire(big, opts);
        bytes.extend(wire(small.clone(), EncodeOptions::default()).1);
        let mut d = FrameDecoder::skipping_oversized(limits);
        let mut buf = BytesMut::new();
        let mut items = vec![];
        for c in chunked(&bytes, &sizes) {
            buf.extend_from_slice(&c);
            while let Some(item) = d.decode(&mut buf).expect("no error") {
                items.push(item);
            }
            // Never more than a chunk and a header section held.
            prop_assert!(buf.len() <= 64 + 200, "held {}", buf.len());
        }
        prop_assert_eq!(items.len(), 2);
        match &items[0] {
            Item::TooLarge { frame, size } => {
                prop_assert_eq!(*size, 100 + extra);
                prop_assert_eq!(frame.get("ack"), Some("a1"));
            }
            other => prop_assert!(false, "expected TooLarge, got {:?}", other),
        }
        prop_assert_eq!(&items[1], &Item::Frame(small));
    }
}
