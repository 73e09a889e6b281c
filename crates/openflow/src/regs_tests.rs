//! Registers and Nicira's register actions (`reg_load`, `reg_load2`, `reg_move`, `resubmit`,
//! `output_reg`), OpenFlow 1.5's `copy_field` and masked `set_field`: round trips, the
//! bytes ovs-ofctl writes, and every refusal with OVS's code.

use crate::action::{decode_actions, decode_actions_15, encode_actions, Action, Instruction};
use crate::error::{bac, et};
use crate::message::{FlowMod, Message};
use crate::nicira::{port_from_16, port_to_16, NxMove, NxOutputReg};
use crate::oxm::{Field, Match, Oxm};
use crate::port::OFPP_IN_PORT;
use crate::{decode, encode};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Decodes an ovs-ofctl flow-mod, checks it re-encodes byte for byte, returns its
/// apply-actions and match.
fn ovs_flow_mod(hex: &str) -> (Vec<Action>, Match) {
    let bytes = unhex(hex);
    let (h, m) = decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(encode(&m, h.xid), bytes, "re-encoding differs");
    let Message::FlowMod(f) = m else {
        panic!("{m:?}")
    };
    match &f.instructions[..] {
        [Instruction::ApplyActions(a)] => (a.clone(), f.match_),
        other => panic!("{other:?}"),
    }
}

/// `ovs-ofctl -O OpenFlow13 -mmmmm parse-flow` (Open vSwitch 3.1) of OVN-shaped flows.
const OVS_INGRESS: &str = "040e008800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001000c 8000000400000001 00000000 00040048 00000000
    ffff0018 00002320 0007 001f 00011c04 0000000000000005
    ffff0018 00002320 0007 01c0 00011404 0000000000000001
    ffff0010 00002320 000e fff8 08 000000";

/// `table=8,reg14=0x5,metadata=0x1,actions=move:NXM_NX_REG14[]->NXM_NX_REG15[],
/// output:NXM_NX_REG15[]`
const OVS_MOVE_OUTPUT: &str = "040e008000000001 0000000000000000 0000000000000000 0800000000008000
    ffffffffffffffff ffffffff00000000 00010018 00011c04 00000005 80000408 0000000000000001
    00040038 00000000
    ffff0018 00002320 0006 0020 0000 0000 00011c04 00011e04
    ffff0018 00002320 000f 001f 00011e04 ffff 000000000000";

/// `ip,actions=ct(commit,zone=NXM_NX_REG13[0..15],table=10)`
const OVS_CT_ZONE_REG: &str = "040e006000000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001000a 80000a020800 000000000000 00040020 00000000
    ffff0018 00002320 0023 0001 00011a04 000f 0a 000000 0000";

/// `reg0=0x1/0x1,xxreg1=0x10/0xff,actions=resubmit(1,2),resubmit:2,load:0->NXM_OF_IN_PORT[]`
const OVS_RESUBMITS: &str = "040e009000000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001001c 00010108 0000000100000001 00010f08 00000010
    000000ff 00000000 00040040 00000000
    ffff0010 00002320 000e 0001 02 000000
    ffff0010 00002320 000e 0002 ff 000000
    ffff0018 00002320 0007 000f 00000002 0000000000000000";

/// `arp,actions=move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],move:NXM_OF_ETH_SRC[]->
/// NXM_OF_ETH_DST[],load:0x2->NXM_OF_ARP_OP[]`: ovs-ofctl names the fields by their NXM
/// headers (class 0) even in OpenFlow 1.3.
const OVS_ARP_RESPONDER: &str =
    "040e009000000006 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001000a 80000a020806 000000000000 00040050 00000000
    ffff0018 00002320 0006 0020 0000 0000 00002004 00002204
    ffff0018 00002320 0006 0030 0000 0000 00000406 00000206
    ffff0018 00002320 0007 000f 00001e02 0000000000000002";

/// The apply-actions of `ovs-ofctl -O OpenFlow15 -mmmmm parse-flow
/// 'actions=set_field:0x1/0x1->reg10,move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],
/// set_field:0x7->metadata'`: a masked SET_FIELD and COPY_FIELD.
const OVS15_ACTIONS: &str = "00190010 00011508 00000001 00000001
    001c0018 0030 0000 0000 0000 80000806 80000606 00000000
    00190010 80000408 0000000000000007";

/// The match of `-O OpenFlow15 … 'reg14=0x5,reg15=0x2,actions=drop'`: OpenFlow 1.5 matches
/// registers as packet registers (xreg7 = reg14:reg15).
const OVS15_XREG_MATCH: &str = "0001001080010e08 0000000500000002";

#[test]
fn ovs_ofctl_register_flow_mods() {
    let (a, m) = ovs_flow_mod(OVS_INGRESS);
    assert_eq!(m.get(Field::InPort).unwrap().value_u128(), 1);
    assert_eq!(
        a,
        vec![
            Action::RegLoad {
                field: Field::Reg14,
                ofs: 0,
                nbits: 32,
                value: 5
            },
            Action::RegLoad {
                field: Field::Reg10,
                ofs: 7,
                nbits: 1,
                value: 1
            },
            Action::Resubmit {
                port: OFPP_IN_PORT,
                table: Some(8)
            },
        ]
    );
    let (a, m) = ovs_flow_mod(OVS_MOVE_OUTPUT);
    assert_eq!(m.get(Field::Reg14).unwrap().value_u128(), 5);
    assert_eq!(
        a,
        vec![
            Action::RegMove(moves()),
            Action::OutputReg(NxOutputReg {
                src: Field::Reg15,
                ofs: 0,
                nbits: 32,
                max_len: u16::MAX,
                v2: false
            }),
        ]
    );
    let (a, _) = ovs_flow_mod(OVS_CT_ZONE_REG);
    let [Action::Ct(ct)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(
        ct.zone,
        crate::nicira::CtZoneSrc::Field {
            field: Field::Reg13,
            ofs: 0
        }
    );
    assert_eq!(ct.recirc_table, 10);
    let (a, m) = ovs_flow_mod(OVS_RESUBMITS);
    let xx = m.get(Field::Reg7).unwrap();
    assert_eq!((xx.value_u128(), xx.mask_u128()), (0x10, 0xff));
    assert_eq!(
        a,
        vec![
            Action::Resubmit {
                port: 1,
                table: Some(2)
            },
            Action::Resubmit {
                port: 2,
                table: Some(0xff)
            },
            Action::RegLoad {
                field: Field::NxmInPort,
                ofs: 0,
                nbits: 16,
                value: 0
            },
        ]
    );
    let (a, _) = ovs_flow_mod(OVS_ARP_RESPONDER);
    assert_eq!(
        a[..2],
        [
            Action::RegMove(NxMove {
                src: Field::NxmArpSpa,
                src_ofs: 0,
                dst: Field::NxmArpTpa,
                dst_ofs: 0,
                nbits: 32
            }),
            Action::RegMove(NxMove {
                src: Field::NxmEthSrc,
                src_ofs: 0,
                dst: Field::NxmEthDst,
                dst_ofs: 0,
                nbits: 48
            }),
        ]
    );
}

#[test]
fn ovs_ofctl_openflow_15_register_actions() {
    let bytes = unhex(OVS15_ACTIONS);
    let a = decode_actions_15(&bytes).unwrap();
    assert_eq!(
        a,
        vec![
            Action::SetField(Oxm::masked(Field::Reg10, 1, 1)),
            Action::CopyField(NxMove {
                src: Field::EthSrc,
                src_ofs: 0,
                dst: Field::EthDst,
                dst_ofs: 0,
                nbits: 48
            }),
            Action::SetField(Oxm::exact(Field::Metadata, 7)),
        ]
    );
    assert_eq!(enc(&a), bytes);
    let m = unhex(OVS15_XREG_MATCH);
    let (oxm, _) = Oxm::decode(&m[4..]).unwrap();
    assert_eq!(oxm, Oxm::exact(Field::Xreg7, 0x5_0000_0002));
}

fn enc(a: &[Action]) -> Vec<u8> {
    let mut v = Vec::new();
    encode_actions(a, &mut v);
    v
}

fn moves() -> NxMove {
    NxMove {
        src: Field::Reg14,
        src_ofs: 0,
        dst: Field::Reg15,
        dst_ofs: 0,
        nbits: 32,
    }
}

#[test]
fn every_register_action_round_trips() {
    let actions = vec![
        Action::RegLoad {
            field: Field::Reg14,
            ofs: 0,
            nbits: 32,
            value: 5,
        },
        Action::RegLoad {
            field: Field::Xxreg0,
            ofs: 64,
            nbits: 64,
            value: u64::MAX,
        },
        Action::RegLoad {
            field: Field::NxmInPort,
            ofs: 0,
            nbits: 16,
            value: 0,
        },
        Action::RegLoad2(Oxm::masked(Field::Reg3, 5, 0xff)),
        Action::RegLoad2(Oxm::exact(Field::Xreg1, 7)),
        Action::RegMove(moves()),
        Action::RegMove(NxMove {
            src: Field::Ipv4Src,
            src_ofs: 0,
            dst: Field::Xxreg3,
            dst_ofs: 96,
            nbits: 32,
        }),
        Action::Resubmit {
            port: OFPP_IN_PORT,
            table: Some(8),
        },
        Action::Resubmit {
            port: 2,
            table: None,
        },
        Action::Resubmit {
            port: 1,
            table: Some(0xff),
        },
        Action::OutputReg(NxOutputReg {
            src: Field::Reg15,
            ofs: 0,
            nbits: 16,
            max_len: u16::MAX,
            v2: false,
        }),
        Action::OutputReg(NxOutputReg {
            src: Field::Xreg7,
            ofs: 32,
            nbits: 32,
            max_len: 128,
            v2: true,
        }),
        Action::SetField(Oxm::exact(Field::Reg0, 0x1234)),
        Action::SetField(Oxm::exact(Field::Xxreg2, 8)),
    ];
    let bytes = enc(&actions);
    assert_eq!(decode_actions(&bytes), Ok(actions.clone()));
    assert_eq!(enc(&decode_actions(&bytes).unwrap()), bytes);
    // Each is a multiple of 8 long: resubmits 16, the rest 24 (REG_LOAD2 of a 4-byte
    // register with a mask: 10 + 12 → 24).
    let lens: Vec<usize> = actions
        .iter()
        .map(|a| enc(std::slice::from_ref(a)).len())
        .collect();
    assert_eq!(
        lens,
        [24, 24, 24, 24, 24, 24, 24, 16, 16, 16, 24, 24, 16, 24]
    );
    // In a FLOW_MOD, with register matches of every width.
    let fm = Message::FlowMod(FlowMod {
        match_: Match::new()
            .with(Oxm::masked(Field::Reg0, 1, 1))
            .with(Oxm::exact(Field::Xreg1, 0x5_0000_0006))
            .with(Oxm::masked(Field::Xxreg1, 0x10, 0xff))
            .with(Oxm::exact(Field::NxmInPort, 3)),
        instructions: vec![Instruction::ApplyActions(actions)],
        cookie: 0,
        cookie_mask: 0,
        table_id: 0,
        command: crate::message::fc::ADD,
        idle_timeout: 0,
        hard_timeout: 0,
        priority: 1,
        importance: 0,
        buffer_id: crate::message::OFP_NO_BUFFER,
        out_port: crate::port::OFPP_ANY,
        out_group: crate::action::OFPG_ANY,
        flags: 0,
    });
    let b = encode(&fm, 7);
    assert_eq!(decode(&b).map(|d| d.1), Ok(fm));
}

#[test]
fn ports_convert_between_16_and_32_bits() {
    assert_eq!(port_from_16(0xfff8), OFPP_IN_PORT);
    assert_eq!(port_to_16(OFPP_IN_PORT), 0xfff8);
    assert_eq!(port_from_16(7), 7);
    assert_eq!(port_to_16(7), 7);
}

/// A Nicira action's bytes: the experimenter header with `subtype`, then `body`.
fn nx(subtype: u16, body: &[u8]) -> Vec<u8> {
    let len = 10 + body.len();
    let mut v = vec![0xff, 0xff, 0, len as u8, 0, 0, 0x23, 0x20];
    v.extend_from_slice(&subtype.to_be_bytes());
    v.extend_from_slice(body);
    v
}

#[test]
fn refusals_as_ovs() {
    let reg0 = [0, 1, 0, 4];
    let reg1 = [0, 1, 2, 4];
    let unknown = [0, 1, 0xfe, 4]; // NXM_1 field 127
    let a = |code| (et::BAD_ACTION, code);
    let cases: Vec<(Vec<u8>, (u16, u16))> = vec![
        // resubmit: the wrong length; RESUBMIT_TABLE's padding not zero.
        (
            nx(1, &[0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            a(bac::BAD_LEN),
        ),
        (nx(14, &[0, 1, 2, 0, 0, 1]), a(bac::BAD_ARGUMENT)),
        // reg_move: an unknown field, bits beyond the field, 0 bits, into ct_mark.
        (
            nx(6, &[&[0, 32, 0, 0, 0, 0][..], &unknown, &reg1].concat()),
            a(bac::BAD_SET_TYPE),
        ),
        (
            nx(6, &[&[0, 32, 0, 1, 0, 0][..], &reg0, &reg1].concat()),
            a(bac::BAD_SET_LEN),
        ),
        (
            nx(6, &[&[0, 0, 0, 0, 0, 0][..], &reg0, &reg1].concat()),
            a(bac::BAD_SET_LEN),
        ),
        (
            nx(
                6,
                &[&[0, 32, 0, 0, 0, 0][..], &reg0, &[0, 1, 0xd6, 4]].concat(),
            ),
            a(bac::BAD_SET_ARGUMENT),
        ),
        // A move into a read-only field (eth_type).
        (
            nx(
                6,
                &[&[0, 16, 0, 0, 0, 0][..], &reg0, &[0x80, 0, 0x0a, 2]].concat(),
            ),
            a(bac::BAD_SET_TYPE),
        ),
        // reg_load of a read-only field; of a register with a value too wide.
        (
            nx(7, &[&[0, 15][..], &[0x80, 0, 0x0a, 2], &[0; 8]].concat()),
            a(bac::BAD_SET_TYPE),
        ),
        (
            nx(7, &[&[0, 0][..], &reg0, &[0, 0, 0, 0, 0, 0, 0, 2]].concat()),
            a(bac::BAD_SET_ARGUMENT),
        ),
        // output_reg: padding not zero; bits beyond the field.
        (
            nx(
                15,
                &[&[0, 31][..], &reg0, &[0xff, 0xff, 0, 0, 0, 0, 0, 1]].concat(),
            ),
            a(bac::BAD_ARGUMENT),
        ),
        (
            nx(
                15,
                &[&[0x08, 31][..], &reg0, &[0xff, 0xff, 0, 0, 0, 0, 0, 0]].concat(),
            ),
            a(bac::BAD_SET_LEN),
        ),
        (
            nx(
                32,
                &[&[0, 31, 0xff, 0xff][..], &reg0, &[0, 0, 0, 0, 0, 1]].concat(),
            ),
            a(bac::BAD_ARGUMENT),
        ),
        // reg_load2: a TLV that does not fill the action; of ct_mark outside ct.
        (
            nx(33, &[&reg0[..], &[0, 0, 0, 1], &[0; 14]].concat()),
            a(bac::BAD_LEN),
        ),
        (
            nx(33, &[&[0, 1, 0xd6, 4][..], &[0, 0, 0, 1], &[0; 6]].concat()),
            a(bac::BAD_SET_ARGUMENT),
        ),
        // resubmit(…,ct): NXAST_RESUBMIT_TABLE_CT is not decoded.
        (nx(44, &[0xff, 0xf8, 2, 0, 0, 0]), a(bac::BAD_EXP_TYPE)),
    ];
    for (bytes, (t, c)) in cases {
        assert_eq!(bytes.len() % 8, 0, "{bytes:02x?}");
        let e = decode_actions(&bytes).expect_err("refused");
        assert!(e.is(t, c), "{bytes:02x?}: {e}");
    }
}

#[test]
fn openflow_15_lists_take_a_masked_set_field_and_copy_field() {
    let masked = vec![Action::SetField(Oxm::masked(Field::Reg10, 0x80, 0x80))];
    let bytes = enc(&masked);
    // OpenFlow 1.3: a mask is refused; 1.5: taken.
    let e = decode_actions(&bytes).unwrap_err();
    assert!(e.is(et::BAD_ACTION, bac::BAD_SET_ARGUMENT));
    assert_eq!(decode_actions_15(&bytes), Ok(masked));
    let copy = vec![Action::CopyField(NxMove {
        src: Field::EthSrc,
        src_ofs: 0,
        dst: Field::EthDst,
        dst_ofs: 0,
        nbits: 48,
    })];
    let bytes = enc(&copy);
    assert_eq!(bytes.len(), 24);
    assert_eq!(&bytes[..4], &[0, 28, 0, 24]);
    assert_eq!(decode_actions_15(&bytes), Ok(copy));
    assert!(decode_actions(&bytes)
        .unwrap_err()
        .is(et::BAD_ACTION, bac::BAD_TYPE));
    // Its refusals are reg_move's.
    let mut bad = bytes.clone();
    bad[5] = 49;
    assert!(decode_actions_15(&bad)
        .unwrap_err()
        .is(et::BAD_ACTION, bac::BAD_SET_LEN));
}
