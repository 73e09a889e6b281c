//! Any bytes as OpenFlow messages from a peer (wire input): through the framer in two
//! arbitrary splits and through the decoder. No panic; what decodes encodes back to a
//! message that decodes to the same value; a refusal builds its ERROR reply. The same
//! bytes also go straight to the action decoders, wrapped in a FLOW_MOD as an action list and
//! as the nested list of a Nicira `ct` action, so the fuzzer reaches `ct`/`nat`/`reg_load`
//! without having to find a whole flow-mod's framing first.
#![no_main]
use ferrovs_openflow::{decode, encode_with_version, Framer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() <= 1024 {
        check(&flow_mod_with_actions(data, false));
        check(&flow_mod_with_actions(data, true));
    }
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
            let again = encode_with_version(&msg, h.version, h.xid);
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

/// A FLOW_MOD (match `ip`) whose apply-actions list is `actions`, or a `ct(commit)` whose
/// nested list is `actions`. Lengths are patched to fit; what does not fit 16 bits is cut.
fn flow_mod_with_actions(actions: &[u8], in_ct: bool) -> Vec<u8> {
    let mut m = vec![4, 14, 0, 0, 0, 0, 0, 1];
    m.extend_from_slice(&[0; 16]); // cookie, cookie_mask
    m.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x80, 0]); // table, command, timeouts, priority
    m.extend_from_slice(&[0xff; 12]); // buffer_id, out_port, out_group
    m.extend_from_slice(&[0; 4]); // flags, pad
    m.extend_from_slice(&[0, 1, 0, 10, 0x80, 0, 10, 2, 8, 0, 0, 0, 0, 0, 0, 0]); // match: ip
    let inst = m.len();
    m.extend_from_slice(&[0, 4, 0, 0, 0, 0, 0, 0]);
    let ct = m.len();
    if in_ct {
        m.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0, 0x23, 0x20, 0, 35, 0, 1]);
        m.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0xff, 0, 0, 0, 0, 0]);
    }
    m.extend_from_slice(actions);
    let len = |n: usize| u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes();
    let total = m.len();
    m[2..4].copy_from_slice(&len(total));
    m[inst + 2..inst + 4].copy_from_slice(&len(total - inst));
    if in_ct {
        m[ct + 2..ct + 4].copy_from_slice(&len(total - ct));
    }
    m
}
