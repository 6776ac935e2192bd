//! Bytes into `Envelope::decode`: it must never panic, and an envelope it
//! accepts must survive encode and decode unchanged.
#![no_main]

use gearshift_proto::Envelope;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(decoded) = Envelope::decode(data) {
        let bytes = decoded.envelope.encode();
        let again = Envelope::decode(&bytes).expect("a re-encoded envelope decodes");
        assert_eq!(again.envelope, decoded.envelope);
    }
});
