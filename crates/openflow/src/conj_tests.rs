//! `NXAST_CONJUNCTION` and `NXM_NX_CONJ_ID`: the bytes ovs-ofctl 3.1 sends (captured from
//! `ovs-ofctl -O OpenFlow13|OpenFlow15 add-flow unix:SOCK` against a socket listening in
//! place of a switch), round trips, and OVS's refusals.

use crate::action::{decode_actions, encode_actions, Action, Instruction};
use crate::error::{bac, et, nxbac};
use crate::message::{decode, encode_with_version, Message};
use crate::oxm::{Field, Oxm};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `ovs-ofctl -O OpenFlow13 add-flow ... 'priority=100,ip,nw_src=10.0.0.1
/// actions=conjunction(7,1/2)'`.
const OVS_SOFT_13: &str = "040e0060 00000002 0000000000000000 0000000000000000 00 00 0000 0000 0064
    ffffffff ffffffff ffffffff 0000 0000
    0001 0012 80000a02 0800 80001604 0a000001 000000000000
    0004 0018 00000000 ffff0010 00002320 0022 00 02 00000007";

/// `'priority=100,conj_id=7,ip actions=output:1'` (the same bytes but the version in 1.5).
const OVS_CONJ_ID_13: &str =
    "040e0060 00000002 0000000000000000 0000000000000000 00 00 0000 0000 0064
    ffffffff ffffffff ffffffff 0000 0000
    0001 0012 00014a04 00000007 80000a02 0800 000000000000
    0004 0018 00000000 0000 0010 00000001 0000 000000000000";

/// `'priority=100,ip actions=conjunction(8,2/3),conjunction(9,1/2)'` in OpenFlow 1.5.
const OVS_TWO_15: &str = "060e0068 00000002 0000000000000000 0000000000000000 00 00 0000 0000 0064
    ffffffff ffffffff ffffffff 0000 0000
    0001 000a 80000a02 0800 000000000000
    0004 0028 00000000 ffff0010 00002320 0022 01 03 00000008
    ffff0010 00002320 0022 00 02 00000009";

fn flow_mod(hex: &str) -> crate::message::FlowMod {
    let bytes = unhex(hex);
    let (h, m) = decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        encode_with_version(&m, h.version, h.xid),
        bytes,
        "re-encoding differs"
    );
    let Message::FlowMod(f) = m else {
        panic!("not a flow mod")
    };
    f
}

#[test]
fn conjunction_and_conj_id_are_ovs_ofctls_bytes() {
    let f = flow_mod(OVS_SOFT_13);
    assert_eq!(
        f.instructions,
        vec![Instruction::ApplyActions(vec![Action::Conjunction {
            id: 7,
            clause: 0,
            n_clauses: 2
        }])]
    );
    let f = flow_mod(OVS_CONJ_ID_13);
    assert_eq!(f.match_.fields[0], Oxm::exact(Field::ConjId, 7));
    let v15 = OVS_CONJ_ID_13.replacen("040e", "060e", 1);
    let f = flow_mod(&v15);
    assert_eq!(f.match_.fields[0], Oxm::exact(Field::ConjId, 7));
    let f = flow_mod(OVS_TWO_15);
    assert_eq!(
        f.instructions,
        vec![Instruction::ApplyActions(vec![
            Action::Conjunction {
                id: 8,
                clause: 1,
                n_clauses: 3
            },
            Action::Conjunction {
                id: 9,
                clause: 0,
                n_clauses: 2
            }
        ])]
    );
}

#[test]
fn bad_conjunctions_are_refused_as_ovs_refuses_them() {
    let conj = |clause: u8, n: u8| {
        let mut v = unhex("ffff0010 00002320 0022");
        v.extend_from_slice(&[clause, n, 0, 0, 0, 7]);
        v
    };
    let mut out = Vec::new();
    encode_actions(
        &[Action::Conjunction {
            id: 7,
            clause: 63,
            n_clauses: 64,
        }],
        &mut out,
    );
    assert_eq!(out, conj(63, 64));
    assert!(decode_actions(&conj(63, 64)).is_ok());
    for (clause, n) in [(0, 1), (0, 0), (2, 2), (0, 65), (64, 64)] {
        let e = decode_actions(&conj(clause, n)).expect_err("refused");
        assert!(
            e.is(et::EXPERIMENTER, nxbac::BAD_CONJUNCTION),
            "{clause}/{n}: {e}"
        );
        assert_eq!(e.name(), Some("NXBAC_BAD_CONJUNCTION"));
    }
    // A wrong length.
    let mut long = unhex("ffff0018 00002320 0022 0002 00000007");
    long.extend_from_slice(&[0; 8]);
    let e = decode_actions(&long).expect_err("refused");
    assert!(e.is(et::BAD_ACTION, bac::BAD_LEN), "{e}");
    // conj_id takes no mask.
    let masked = unhex("00014b08 00000007 000000ff");
    assert!(crate::oxm::Match::decode(&{
        let mut m = unhex("0001 0010");
        m.extend_from_slice(&masked);
        m.extend_from_slice(&[0; 0]);
        m
    })
    .is_err());
}
