//! Nicira's `NXAST_CHECK_PKT_LARGER` (`check_pkt_larger(LEN)->DST[bit]`): the bytes
//! ovs-ofctl 3.1 writes, round trips, and refusals with OVS's codes.

use crate::action::{decode_actions, Action, Instruction};
use crate::decode;
use crate::error::{bac, et};
use crate::message::encode_with_version;
use crate::message::Message;
use crate::nicira::NxCheckPktLarger;
use crate::oxm::Field;

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `ovs-ofctl -O OpenFlow13 -mmmmm parse-flow 'actions=check_pkt_larger(1514)->NXM_NX_REG9[1]'`
const OVS13: &str = "040e005800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 00010004 00000000 00040020 00000000
    ffff0018 00002320 0031 05ea 0001 00011204 000000000000";

/// `ovs-ofctl -O OpenFlow15 -mmmmm parse-flow 'table=10,priority=50,ip,
/// actions=check_pkt_larger(1514)->NXM_NX_REG9[1],resubmit(,11)'` (OVN's gateway MTU check)
const OVS15: &str = "060e007000000001 0000000000000000 0000000000000000 0a00000000000032
    ffffffffffffffff ffffffff00000000 0001000a 80000a020800 000000000000
    00040030 00000000
    ffff0018 00002320 0031 05ea 0001 00011204 000000000000
    ffff0010 00002320 000e fff8 0b 000000";

fn apply(hex: &str) -> Vec<Action> {
    let bytes = unhex(hex);
    let (h, m) = decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        encode_with_version(&m, bytes[0], h.xid),
        bytes,
        "re-encoding differs"
    );
    let Message::FlowMod(f) = m else {
        panic!("{m:?}")
    };
    match &f.instructions[..] {
        [Instruction::ApplyActions(a)] => a.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn ovs_ofctl_check_pkt_larger() {
    let want = Action::CheckPktLarger(NxCheckPktLarger {
        pkt_len: 1514,
        dst: Field::Reg9,
        ofs: 1,
    });
    assert_eq!(apply(OVS13), vec![want.clone()]);
    let a = apply(OVS15);
    assert_eq!(a[0], want);
    assert!(matches!(
        a[1],
        Action::Resubmit {
            table: Some(11),
            ..
        }
    ));
}

fn action(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0xff, 0xff, 0, 0, 0, 0, 0x23, 0x20, 0, 49];
    v.extend_from_slice(body);
    let len = v.len() as u16;
    v[2..4].copy_from_slice(&len.to_be_bytes());
    v
}

#[test]
fn check_pkt_larger_refusals_as_ovs() {
    let reg9 = [0, 1, 0x12, 4];
    let z6 = [0u8; 6];
    let cases: Vec<(Vec<u8>, u16)> = vec![
        // Fine, for reference: below.
        // A wrong length.
        (
            action(&[&[5, 0xea, 0, 1][..], &reg9, &z6, &[0; 8]].concat()),
            bac::BAD_LEN,
        ),
        // Padding not zero.
        (
            action(&[&[5, 0xea, 0, 1][..], &reg9, &[0, 0, 0, 0, 0, 1]].concat()),
            bac::BAD_ARGUMENT,
        ),
        // The bit beyond the field (reg9 has 32).
        (
            action(&[&[5, 0xea, 0, 32][..], &reg9, &z6].concat()),
            bac::BAD_SET_LEN,
        ),
        // An unknown field (NXM_1 field 127).
        (
            action(&[&[5, 0xea, 0, 1][..], &[0, 1, 0xfe, 4], &z6].concat()),
            bac::BAD_SET_TYPE,
        ),
        // A read-only field (eth_type).
        (
            action(&[&[5, 0xea, 0, 1][..], &[0, 0, 0x0a, 2], &z6].concat()),
            bac::BAD_SET_TYPE,
        ),
    ];
    for (bytes, code) in cases {
        let e = decode_actions(&bytes).unwrap_err();
        assert_eq!(
            (e.type_, e.code),
            (et::BAD_ACTION, code),
            "{bytes:02x?}: {e}"
        );
    }
    let ok = action(&[&[5, 0xea, 0, 1][..], &reg9, &z6].concat());
    assert_eq!(decode_actions(&ok).unwrap().len(), 1);
}
