//! Any bytes as a continuation an `NXT_RESUME` brings back (opaque to the controller, so
//! untrusted): decoding must not panic. The first byte picks whether the bytes follow a
//! valid bridge token (so the decoder gets past it) or stand alone.
#![no_main]
use ferrovs_control::daemon::continuation::{bridge_token, decode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let token = bridge_token(0x1234);
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first & 1 == 0 {
        let _ = decode(rest, token);
        return;
    }
    let mut c = vec![0x80, 0x00, 0x00, 0x14];
    c.extend_from_slice(&token);
    c.extend_from_slice(&[0; 4]);
    c.extend_from_slice(rest);
    if let Ok(t) = decode(&c, token) {
        assert!(t.frames.len() <= ferrovs_flow::MAX_FROZEN_FRAMES);
    }
});
