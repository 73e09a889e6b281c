//! Any bytes as a frame through flow-key extraction (the fast path must agree with the
//! generic one), every header rewrite and MPLS push/pop (wire input),
//! and any text through the rule, filter, group and meter parsers (control input): no panic,
//! a rewrite never changes the frame's length, and a parsed rule, group or meter prints to
//! text that parses back to the same one.
#![no_main]
use ferrovs_flow::{edit, parse_filter, parse_flow, parse_group, Field, FlowKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let k = FlowKey::extract(data, 1, None);
    let _ = k.hash();
    // The specialised extraction agrees with the generic one on every frame.
    assert_eq!(k, FlowKey::extract_generic(data, 1, None));
    if let Some(fast) = FlowKey::extract_ipv4_fast(data, 1) {
        assert_eq!(fast, k);
    }
    for f in Field::ALL {
        let mut copy = data.to_vec();
        let v = u128::from(data.first().copied().unwrap_or(0)) * 0x0101_0101;
        let _ = edit::set_field(&mut copy, f, v, data.len() % 2 == 0);
        assert_eq!(copy.len(), data.len());
    }
    // An MPLS entry pushed then popped gives the frame back (after any VLAN tags).
    if let Some(at) = edit::ethertype_at(data) {
        let ty = u16::from_be_bytes([data[at], data[at + 1]]);
        let mut roomy = vec![0u8; 4];
        roomy.extend_from_slice(data);
        assert!(edit::push_mpls_in_place(&mut roomy, 0x8847, 0x1234_5140));
        assert!(edit::pop_mpls_in_place(&mut roomy, ty));
        assert_eq!(&roomy[4..], data);
    }
    let mut copy = data.to_vec();
    if edit::pop_mpls_in_place(&mut copy, 0x0800) {
        assert_eq!(copy.len(), data.len());
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(rule) = parse_flow(s) {
            let text = rule.to_string();
            assert_eq!(parse_flow(&text).as_ref(), Ok(&rule), "{text}");
        }
        let _ = parse_filter(s);
        if let Ok(m) = ferrovs_flow::meter::parse_meter(s) {
            let text = m.to_string();
            assert_eq!(ferrovs_flow::meter::parse_meter(&text).as_ref(), Ok(&m), "{text}");
        }
        if let Ok(g) = parse_group(s) {
            let text = g.to_string();
            assert_eq!(parse_group(&text).as_ref(), Ok(&g), "{text}");
        }
    }
});
