//! Any bytes as a Geneve datagram from a peer (RFC 8926): the checked view and the option
//! walk must not panic, the options must tile the header exactly, mapping through a map made
//! from the first bytes must not panic, and a header written for the metadata read back
//! parses to the same VNI and mapped options.
#![no_main]
use ferrovs_datapath::geneve::{write_header, Geneve, GENEVE_HLEN, MAX_TX_HLEN};
use ferrovs_flow::{TlvEntry, TlvMap, TunnelKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    // A one-entry map from the first four bytes (refused maps: empty).
    let entry = TlvEntry {
        class: u16::from_be_bytes([data[0], data[1]]),
        kind: data[2],
        len: if data[3] & 1 == 0 { 4 } else { 0 },
        index: (data[3] >> 1) & 3,
    };
    let map = TlvMap::new([entry]).unwrap_or_default();
    let d = &data[4..];
    let Ok(g) = Geneve::parse(d) else { return };
    assert!(g.len() <= d.len());
    let total: usize = g.options().map(|o| 4 + o.data.len()).sum();
    assert_eq!(GENEVE_HLEN + total, g.len());
    let mut t = TunnelKey::default();
    if g.map_options(&map, &mut t).is_err() {
        return;
    }
    // Written back: the same VNI and mapped options.
    let mut buf = vec![0u8; MAX_TX_HLEN + 14];
    let n = write_header(&mut buf, g.vni(), Some(&t), &map);
    buf.truncate(n);
    buf.extend_from_slice(&[0u8; 14]);
    let back = Geneve::parse(&buf).expect("a header we wrote parses");
    assert_eq!(back.vni(), g.vni());
    let mut t2 = TunnelKey::default();
    back.map_options(&map, &mut t2).expect("our options are mapped");
    assert_eq!((t2.meta, t2.present), (t.meta, t.present));
});
