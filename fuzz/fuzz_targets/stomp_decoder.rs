//! Bytes into our STOMP decoder, cut in two at a point the input chooses so
//! that resumption is exercised: it must never panic, and every frame it
//! decodes must encode and decode again to the same frame.
#![no_main]

use bytes::BytesMut;
use gearshift_bus::stomp::parse::{EncodeError, EncodeOptions, FrameDecoder, Item, Limits, encode};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_frame: 64 * 1024,
    max_headers: 32,
    max_header_line: 1024,
    max_body: 32 * 1024,
};

fn decode_all(chunks: &[&[u8]]) -> (Vec<Item>, bool) {
    let mut d = FrameDecoder::new(LIMITS);
    let mut buf = BytesMut::new();
    let mut items = vec![];
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                Err(_) => return (items, true),
            }
        }
    }
    (items, false)
}

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    let (items, failed) = decode_all(&[&data[..split], &data[split..]]);
    // Fed whole, the decoder must find the same items.
    let (whole, whole_failed) = decode_all(&[data]);
    if failed || whole_failed {
        let n = items.len().min(whole.len());
        assert_eq!(
            items[..n],
            whole[..n],
            "result depends on how the bytes were split"
        );
    } else {
        assert_eq!(items, whole, "result depends on how the bytes were split");
    }
    for item in items {
        let Item::Frame(frame) = item else { continue };
        let mut out = BytesMut::new();
        match encode(
            &Item::Frame(frame.clone()),
            &mut out,
            EncodeOptions::default(),
            &LIMITS,
        ) {
            Ok(()) => {}
            // Only unescaped frames (CONNECT/CONNECTED) can hold bytes we cannot write.
            Err(EncodeError::NotRepresentable { .. }) => {
                assert!(
                    !frame.command.escapes_headers(),
                    "cannot re-encode {frame:?}"
                );
                continue;
            }
            // Escaping and our own content-length can push a frame that was just
            // within the limits over them; the encoder refuses it rather than
            // writing what the decoder would refuse.
            Err(_) => continue,
        }
        let (again, failed) = decode_all(&[&out]);
        assert!(!failed, "re-encoded frame does not decode: {frame:?}");
        assert_eq!(again, vec![Item::Frame(frame)]);
    }
});
