//! Any bytes as OpenFlow messages from a peer (wire input): through the framer in two
//! arbitrary splits and through the decoder. No panic; what decodes encodes back to a
//! message that decodes to the same value; a refusal builds its ERROR reply.
#![no_main]
use ferrovs_openflow::{decode, encode, Framer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut framer = Framer::new();
    framer.set_version(4);
    framer.push(&data[..split]);
    let mut n = 0;
    loop {
        match framer.next_message() {
            Ok(Some(m)) => check(&m),
            Ok(None) if n == 0 => {
                framer.push(&data[split..]);
                n += 1;
            }
            Ok(None) | Err(ferrovs_openflow::FrameError::BadLength(_)) => break,
            Err(ferrovs_openflow::FrameError::BadVersion { message, .. }) => check(&message),
        }
    }
});

fn check(bytes: &[u8]) {
    match decode(bytes) {
        Ok((h, msg)) => {
            let again = encode(&msg, h.xid);
            let (h2, back) = decode(&again).expect("a re-encoded message decodes");
            assert_eq!(back, msg);
            assert_eq!(h2.xid, h.xid);
        }
        Err(e) => {
            let reply = e.encode_reply(bytes);
            assert!(decode(&reply).is_ok());
        }
    }
}
