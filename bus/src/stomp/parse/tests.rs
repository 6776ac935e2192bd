//! The decoder at every split point, the encoder, and their limits.

use super::*;

fn decode_all(bytes: &[u8]) -> Result<Vec<Item>, FrameError> {
    let mut d = FrameDecoder::default();
    let mut buf = BytesMut::from(bytes);
    let mut out = vec![];
    while let Some(item) = d.decode(&mut buf)? {
        out.push(item);
    }
    assert!(buf.is_empty(), "left over: {buf:?}");
    Ok(out)
}

fn frame(item: &Item) -> &Frame {
    match item {
        Item::Frame(f) => f,
        other => panic!("not a frame: {other:?}"),
    }
}

#[test]
fn decodes_what_rabbitmq_sends() {
    let wire = b"CONNECTED\nserver:RabbitMQ/3.10.8\nsession:session-x\nheart-beat:1000,1000\nversion:1.2\n\n\0\n\
MESSAGE\nsubscription:c1\ndestination:/exchange/gearshift/probe.cmd.n1\nmessage-id:T_c1@@session-x@@1\nredelivered:false\nack:T_c1@@session-x@@1\ncontent-length:3\n\na\0b\0\n";
    let items = decode_all(wire).unwrap();
    assert_eq!(items.len(), 4);
    assert_eq!(frame(&items[0]).command, Command::Connected);
    assert_eq!(frame(&items[0]).get("heart-beat"), Some("1000,1000"));
    assert_eq!(items[1], Item::HeartBeat);
    let m = frame(&items[2]);
    assert_eq!(m.command, Command::Message);
    assert_eq!(&m.body[..], b"a\0b");
    assert_eq!(m.get("content-length"), None, "framing is not a header");
    assert_eq!(m.get("ack"), Some("T_c1@@session-x@@1"));
    assert_eq!(items[3], Item::HeartBeat);
}

#[test]
fn accepts_crlf_and_nul_terminated_bodies() {
    let items = decode_all(b"\r\n\r\nMESSAGE\r\nk\\c1:v\\\\2\r\nraw:a:b\r\n\r\nhello\0").unwrap();
    assert_eq!(items[..2], [Item::HeartBeat, Item::HeartBeat]);
    let m = frame(&items[2]);
    assert_eq!(
        m.headers,
        vec![
            ("k:1".to_string(), "v\\2".to_string()),
            // A raw colon in a value is tolerated (the first colon splits).
            ("raw".to_string(), "a:b".to_string())
        ]
    );
    assert_eq!(&m.body[..], b"hello");
}

#[test]
fn connect_frames_are_not_unescaped() {
    let items = decode_all(b"CONNECTED\nmsg:a\\nb\n\n\0").unwrap();
    assert_eq!(frame(&items[0]).get("msg"), Some("a\\nb"));
}

#[test]
fn resumes_after_every_byte() {
    let wire =
        b"\nERROR\nmessage:bad\\cthing\ncontent-length:4\n\nbody\0\nRECEIPT\nreceipt-id:7\n\n\0";
    let whole = decode_all(wire).unwrap();
    let mut d = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut got = vec![];
    for &b in wire.iter() {
        buf.extend_from_slice(&[b]);
        while let Some(item) = d.decode(&mut buf).unwrap() {
            got.push(item);
        }
    }
    assert_eq!(got, whole);
    assert_eq!(frame(&got[1]).get("message"), Some("bad:thing"));
}

#[test]
fn enforces_limits_early() {
    let limits = Limits {
        max_frame: 200,
        max_headers: 2,
        max_header_line: 20,
        max_body: 50,
    };
    let run = |bytes: &[u8]| {
        let mut d = FrameDecoder::new(limits);
        let mut buf = BytesMut::from(bytes);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    };
    // A long line is refused before its end arrives.
    assert_eq!(
        run(&[b'A'; 30]),
        Some(FrameError::HeaderLineTooLong { limit: 20 })
    );
    assert_eq!(
        run(b"SEND\na:1\nb:2\nc:3\n\n\0"),
        Some(FrameError::TooManyHeaders { limit: 2 })
    );
    // An announced body over the limit is refused before it is buffered.
    assert_eq!(
        run(b"SEND\ncontent-length:51\n\n"),
        Some(FrameError::BodyTooLarge {
            size: 51,
            limit: 50
        })
    );
    assert_eq!(
        run(&[b"SEND\n\n".as_slice(), &[b'x'; 60]].concat()),
        Some(FrameError::BodyTooLarge {
            size: 60,
            limit: 50
        })
    );
    assert_eq!(
        run(b"SEND\ncontent-length:50\n\n"),
        None,
        "waits for the body"
    );
    assert_eq!(
        run(b"SEND\ncontent-length:2\n\nabc"),
        Some(FrameError::MissingNul(2))
    );
    assert_eq!(
        run(b"SEND\ncontent-length:-1\n\n"),
        Some(FrameError::InvalidContentLength("-1".into()))
    );
    assert_eq!(
        run(b"BOGUS\n\n\0"),
        Some(FrameError::UnknownCommand("BOGUS".into()))
    );
    assert_eq!(
        run(b"SEND\nnocolon\n\n\0"),
        Some(FrameError::MalformedHeader("nocolon".into()))
    );
    assert_eq!(
        run(b"SEND\na:\\t\n\n\0"),
        Some(FrameError::InvalidEscape("a:\\t".into()))
    );
    assert_eq!(run(b"\rX"), Some(FrameError::BareCr));
    assert_eq!(
        run(b"SEND\na:\xff\n\n\0"),
        Some(FrameError::NotUtf8("a:\u{fffd}".into()))
    );
}

#[test]
fn an_error_is_sticky() {
    let mut d = FrameDecoder::default();
    let mut buf = BytesMut::from(&b"NOPE\n\n\0SEND\n\n\0"[..]);
    let e = d.decode(&mut buf).unwrap_err();
    assert_eq!(d.decode(&mut buf).unwrap_err(), e);
}

#[test]
fn encodes_with_escapes_and_content_length() {
    let f = Frame::new(Command::Send)
        .header("destination", "/exchange/gearshift/a.b")
        .header("we:ird", "line\nbreak\\")
        .header("content-length", "999")
        .body(&b"x\0y"[..]);
    let mut dst = BytesMut::new();
    encode(
        &Item::Frame(f.clone()),
        &mut dst,
        EncodeOptions::default(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(
        &dst[..],
        b"SEND\ndestination:/exchange/gearshift/a.b\nwe\\cird:line\\nbreak\\\\\ncontent-length:3\n\nx\0y\0"
    );
    let items = decode_all(&dst).unwrap();
    let mut expected = f;
    expected.headers.retain(|(k, _)| k != "content-length");
    assert_eq!(items, vec![Item::Frame(expected)]);
}

#[test]
fn refuses_what_cannot_be_encoded() {
    let mut dst = BytesMut::new();
    let l = Limits::default();
    let bad = Frame::new(Command::Connect).header("login", "a\nb");
    assert!(matches!(
        encode(&Item::Frame(bad), &mut dst, EncodeOptions::default(), &l),
        Err(EncodeError::NotRepresentable { .. })
    ));
    let nul = Frame::new(Command::Send).body(&b"a\0"[..]);
    let opts = EncodeOptions {
        content_length: false,
        ..EncodeOptions::default()
    };
    assert_eq!(
        encode(&Item::Frame(nul), &mut dst, opts, &l),
        Err(EncodeError::NulInBody)
    );
    let big = Frame::new(Command::Send).body(vec![0u8; l.max_body + 1]);
    assert!(matches!(
        encode(&Item::Frame(big), &mut dst, EncodeOptions::default(), &l),
        Err(EncodeError::TooLarge { .. })
    ));
    // What the decoder would refuse is refused when writing: our own
    // content-length counts as a header line, and escaping lengthens lines.
    let small = Limits {
        max_headers: 2,
        max_header_line: 8,
        ..Limits::default()
    };
    let two = Frame::new(Command::Send).header("a", "1").header("b", "2");
    assert!(
        encode(
            &Item::Frame(two.clone()),
            &mut dst,
            EncodeOptions::default(),
            &small
        )
        .is_ok()
    );
    dst.clear();
    assert_eq!(
        encode(
            &Item::Frame(two.body(&b"x"[..])),
            &mut dst,
            EncodeOptions::default(),
            &small
        ),
        Err(EncodeError::TooManyHeaders { limit: 2 })
    );
    let colons = Frame::new(Command::Message).header("k", "::::");
    assert_eq!(
        encode(
            &Item::Frame(colons),
            &mut dst,
            EncodeOptions::default(),
            &small
        ),
        Err(EncodeError::HeaderLineTooLong {
            name: "k".into(),
            limit: 8
        })
    );
    assert!(dst.is_empty(), "nothing written on error");
}

/// Feeds `wire` in chunks of `size` to a skipping decoder; every item, and
/// the largest buffer it ever held.
fn skim(wire: &[u8], limits: Limits, size: usize) -> (Result<Vec<Item>, FrameError>, usize) {
    let mut d = FrameDecoder::skipping_oversized(limits);
    let mut buf = BytesMut::new();
    let mut out = vec![];
    let mut held = 0;
    for chunk in wire.chunks(size.max(1)) {
        buf.extend_from_slice(chunk);
        held = held.max(buf.len());
        loop {
            match d.decode(&mut buf) {
                Ok(Some(item)) => out.push(item),
                Ok(None) => break,
                Err(e) => return (Err(e), held),
            }
        }
    }
    assert!(buf.is_empty(), "left over: {buf:?}");
    (Ok(out), held)
}

#[test]
fn a_skipping_decoder_drops_oversized_bodies_and_goes_on() {
    let limits = Limits {
        max_frame: 400,
        max_headers: 8,
        max_header_line: 100,
        max_body: 50,
    };
    let big = [b'x'; 1000];
    let with_length = [
        b"MESSAGE\nsubscription:s1\nack:a1\ncontent-length:1000\n\n".as_slice(),
        &big,
        b"\0\nMESSAGE\nsubscription:s1\nack:a2\n\nsmall\0",
    ]
    .concat();
    let without_length = [
        b"MESSAGE\nsubscription:s1\nack:a1\n\n".as_slice(),
        &big,
        b"\0\nMESSAGE\nsubscription:s1\nack:a2\ncontent-length:5\n\nsmall\0",
    ]
    .concat();
    for wire in [with_length, without_length] {
        let whole = skim(&wire, limits, wire.len()).0.unwrap();
        assert_eq!(whole.len(), 3, "{whole:?}");
        match &whole[0] {
            Item::TooLarge { frame, size } => {
                assert_eq!(*size, 1000);
                assert_eq!(frame.get("ack"), Some("a1"));
                assert!(frame.body.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(whole[1], Item::HeartBeat);
        assert_eq!(&frame(&whole[2]).body[..], b"small");
        // The same at every chunk size; the body is never held whole.
        for size in 1..wire.len() {
            let (items, held) = skim(&wire, limits, size);
            assert_eq!(items.unwrap(), whole, "chunks of {size}");
            if size < 100 {
                assert!(held < 300, "held {held} bytes with chunks of {size}");
            }
        }
    }
    // A wrong byte after a skipped content-length body is still an error,
    // and the plain decoder keeps refusing oversized bodies.
    let bad = [b"SEND\ncontent-length:60\n\n".as_slice(), &[b'y'; 61]].concat();
    assert_eq!(skim(&bad, limits, 7).0, Err(FrameError::MissingNul(60)));
    let mut plain = FrameDecoder::new(limits);
    let mut buf = BytesMut::from(&b"SEND\ncontent-length:60\n\n"[..]);
    assert_eq!(
        plain.decode(&mut buf),
        Err(FrameError::BodyTooLarge {
            size: 60,
            limit: 50
        })
    );
    // A skipped frame cannot be encoded.
    let item = Item::TooLarge {
        frame: Frame::new(Command::Message),
        size: 60,
    };
    assert!(
        encode(
            &item,
            &mut BytesMut::new(),
            EncodeOptions::default(),
            &limits
        )
        .is_err()
    );
}
