//! The Nicira actions and fields of OVN's chassis flows beyond the registers: the register
//! stack (`NXAST_STACK_PUSH`/`POP`), `NXAST_CLONE`, `NXM_NX_IP_FRAG`, a `move` inside `ct`'s
//! `exec`, `nat(src)` without a range, and `NXM_NX_TUN_METADATA0` named with the option
//! space's length: the bytes ovs-ofctl writes, round trips, refusals with OVS's codes.

use crate::action::{decode_actions, encode_actions, Action};
use crate::error::bac;
use crate::nicira::{nat_flags, NxMove, NxNat, NxStack};
use crate::oxm::{Field, Oxm};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Decodes an action list and checks it re-encodes byte for byte.
fn round_trip(hex: &str) -> Vec<Action> {
    let bytes = unhex(hex);
    let a = decode_actions(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    encode_actions(&a, &mut out);
    assert_eq!(out, bytes, "re-encoding differs");
    a
}

/// The apply-actions of `ovs-ofctl -O OpenFlow13 -mmmmm parse-flow
/// 'icmp6,icmp_type=136,actions=push:NXM_NX_REG0[],push:NXM_NX_XXREG0[96..127],
/// pop:NXM_OF_ETH_DST[],pop:NXM_NX_ND_TLL[]'` (Open vSwitch 3.1), as the next ones.
const OVS_STACK: &str = "ffff0018 00002320 001b 0000 00010004 0020 000000000000
    ffff0018 00002320 001b 0060 0001de10 0020 000000000000
    ffff0018 00002320 001c 0000 00000206 0030 000000000000
    ffff0018 00002320 001c 0000 00013206 0030 000000000000";

/// `actions=clone(set_field:0x1->reg15,resubmit(,37)),set_field:0x8004->reg15`.
const OVS_CLONE: &str = "ffff0030 00002320 002a 000000000000
    0019 0010 00011e04 00000001 00000000
    ffff0010 00002320 000e fff8 25 000000
    0019 0010 00011e04 00008004 00000000";

/// `actions=ct(commit,zone=NXM_NX_REG13[0..15],nat(src),exec(set_field:0/0x1->ct_mark,
/// move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127]))`.
const OVS_CT_EXEC_MOVE: &str = "ffff0058 00002320 0023 0001 00011a04 000f ff 000000 0000
    ffff0010 00002320 0024 0000 0001 0000
    ffff0018 00002320 0007 0000 0001d604 0000000000000000
    ffff0018 00002320 0006 0020 0000 0060 0001de10 0001d810";

/// `actions=move:NXM_NX_TUN_METADATA0[16..30]->NXM_NX_REG14[0..14]`: OVS names the option
/// with the whole option space's length (124).
const OVS_TUN_METADATA_MOVE: &str = "ffff0018 00002320 0006 000f 0010 0000 0001507c 00011c04";

#[test]
fn stack_actions_are_ovs_ofctls_bytes() {
    let a = round_trip(OVS_STACK);
    assert_eq!(
        a,
        vec![
            Action::StackPush(NxStack {
                field: Field::Reg0,
                ofs: 0,
                nbits: 32
            }),
            Action::StackPush(NxStack {
                field: Field::Xxreg0,
                ofs: 96,
                nbits: 32
            }),
            Action::StackPop(NxStack {
                field: Field::NxmEthDst,
                ofs: 0,
                nbits: 48
            }),
            Action::StackPop(NxStack {
                field: Field::NxNdTll,
                ofs: 0,
                nbits: 48
            }),
        ]
    );
}

#[test]
fn clone_nests_a_list_and_the_rest_follows() {
    let a = round_trip(OVS_CLONE);
    assert_eq!(
        a,
        vec![
            Action::Clone(vec![
                Action::SetField(Oxm::exact(Field::Reg15, 1)),
                Action::Resubmit {
                    port: crate::port::OFPP_IN_PORT,
                    table: Some(37)
                },
            ]),
            Action::SetField(Oxm::exact(Field::Reg15, 0x8004)),
        ]
    );
    // An empty clone is 16 bytes.
    let mut out = Vec::new();
    encode_actions(&[Action::Clone(Vec::new())], &mut out);
    assert_eq!(out, unhex("ffff0010 00002320 002a 000000000000"));
    assert_eq!(
        decode_actions(&out).unwrap(),
        vec![Action::Clone(Vec::new())]
    );
}

#[test]
fn ct_exec_takes_a_move_into_the_label_and_nat_src_without_a_range() {
    let a = round_trip(OVS_CT_EXEC_MOVE);
    let [Action::Ct(ct)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(
        ct.actions,
        vec![
            Action::Nat(NxNat {
                flags: nat_flags::SRC,
                ..NxNat::default()
            }),
            Action::RegLoad {
                field: Field::CtMark,
                ofs: 0,
                nbits: 1,
                value: 0
            },
            Action::RegMove(NxMove {
                src: Field::Xxreg0,
                src_ofs: 0,
                dst: Field::CtLabel,
                dst_ofs: 96,
                nbits: 32
            }),
        ]
    );
}

#[test]
fn a_tunnel_option_is_named_with_any_length_up_to_the_option_space() {
    let bytes = unhex(OVS_TUN_METADATA_MOVE);
    let a = decode_actions(&bytes).unwrap();
    assert_eq!(
        a,
        vec![Action::RegMove(NxMove {
            src: Field::TunMetadata0,
            src_ofs: 16,
            dst: Field::Reg14,
            dst_ofs: 0,
            nbits: 15
        })]
    );
    // Written back with the width the pipeline keeps (ovs-ofctl reads either).
    let mut out = Vec::new();
    encode_actions(&a, &mut out);
    assert_eq!(
        out,
        unhex("ffff0018 00002320 0006 000f 0010 0000 00015004 00011c04")
    );
    // Beyond the option space (125 bytes): an unknown field.
    let mut b = bytes.clone();
    b[19] = 125;
    assert_eq!(decode_actions(&b).unwrap_err().code, bac::BAD_SET_TYPE);
}

#[test]
fn refusals_have_ovss_codes() {
    let code = |hex: &str| decode_actions(&unhex(hex)).unwrap_err().code;
    // A stack action of the wrong length, with non-zero padding, beyond its field.
    assert_eq!(code("ffff0010 00002320 001b 0000 00010004"), bac::BAD_LEN);
    assert_eq!(
        code("ffff0018 00002320 001b 0000 00010004 0020 000000000001"),
        bac::BAD_ARGUMENT
    );
    assert_eq!(
        code("ffff0018 00002320 001b 0010 00010004 0020 000000000000"),
        bac::BAD_SET_LEN
    );
    // A pop into a read-only field (eth_type), or into ct_mark.
    assert_eq!(
        code("ffff0018 00002320 001c 0000 00000602 0010 000000000000"),
        bac::BAD_SET_TYPE
    );
    assert_eq!(
        code("ffff0018 00002320 001c 0000 0001d604 0020 000000000000"),
        bac::BAD_SET_ARGUMENT
    );
    // A clone's nested list is checked as any list (an output to no port inside).
    assert_eq!(
        code("ffff0020 00002320 002a 000000000000 0000 0010 00000000 0000 000000000000"),
        bac::BAD_OUT_PORT
    );
    // A clone with non-zero padding; a clone inside ct.
    assert_eq!(
        code("ffff0010 00002320 002a 000000000100"),
        bac::BAD_ARGUMENT
    );
    assert_eq!(
        code("ffff0028 00002320 0023 0001 00000000 0000 ff 000000 0000 ffff0010 00002320 002a 000000000000"),
        bac::BAD_ARGUMENT
    );
    // A move inside ct into other than ct_mark/ct_label.
    assert_eq!(
        code("ffff0030 00002320 0023 0001 00000000 0000 ff 000000 0000 ffff0018 00002320 0006 0020 0000 0000 00010004 00010204"),
        bac::BAD_ARGUMENT
    );
}

#[test]
fn nw_frag_is_a_maskable_ip_field() {
    use crate::oxm::Match;
    let m = |fields: Vec<Oxm>| Match { fields };
    let ip = Oxm::exact(Field::EthType, 0x0800);
    assert!(m(vec![ip.clone(), Oxm::masked(Field::NxIpFrag, 0, 2)])
        .check_prerequisites()
        .is_ok());
    assert!(m(vec![Oxm::masked(Field::NxIpFrag, 0, 2)])
        .check_prerequisites()
        .is_err());
    // ARP's fields in RARP too.
    let rarp = Oxm::exact(Field::EthType, 0x8035);
    assert!(m(vec![rarp, Oxm::exact(Field::ArpOp, 3)])
        .check_prerequisites()
        .is_ok());
    // On the wire: NXM_NX_IP_FRAG, class 1 field 26, one byte (masked: 2).
    let mut out = Vec::new();
    Oxm::masked(Field::NxIpFrag, 0, 2).encode(&mut out);
    assert_eq!(out, unhex("00013502 00 02"));
    let (o, used) = Oxm::decode(&unhex("00013401 03")).unwrap();
    assert_eq!((o, used), (Oxm::exact(Field::NxIpFrag, 3), 5));
    // A value beyond its two bits.
    assert!(Oxm::decode(&unhex("00013401 04")).is_err());
}

/// The apply-actions of `ovs-ofctl -O OpenFlow15 -mmmmm parse-flow` of the same `ct` as
/// [`OVS_CT_EXEC_MOVE`]: what ovn-controller sends (a masked SET_FIELD and a COPY_FIELD
/// inside the ct).
const OVS15_CT_EXEC_MOVE: &str = "ffff0050 00002320 0023 0001 00011a04 000f ff 000000 0000
    ffff0010 00002320 0024 0000 0001 0000
    0019 0010 0001d708 00000000 00000001
    001c 0018 0020 0000 0060 0000 0001de10 0001d810 00000000";

#[test]
fn ct_exec_in_openflow_15_is_a_masked_set_field_and_a_copy_field() {
    let bytes = unhex(OVS15_CT_EXEC_MOVE);
    let a = crate::action::decode_actions_15(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    encode_actions(&a, &mut out);
    assert_eq!(out, bytes);
    let [Action::Ct(ct)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(
        ct.actions[1],
        Action::SetField(Oxm::masked(Field::CtMark, 0, 1))
    );
    assert!(matches!(
        ct.actions[2],
        Action::CopyField(NxMove {
            dst: Field::CtLabel,
            dst_ofs: 96,
            ..
        })
    ));
    // In OpenFlow 1.3 neither is taken inside ct.
    assert_eq!(
        decode_actions(&bytes).unwrap_err().code,
        bac::BAD_SET_ARGUMENT
    );
}

#[test]
fn nicira_dec_ttl_without_ids_is_openflows() {
    // ovn-controller's dec_ttl: NXAST_DEC_TTL_CNT_IDS with no id (`dec_ttl()`), and
    // NXAST_DEC_TTL.
    for hex in [
        "ffff0010 00002320 0015 0000 00000000",
        "ffff0010 00002320 0012 000000000000",
    ] {
        assert_eq!(decode_actions(&unhex(hex)).unwrap(), vec![Action::DecNwTtl]);
    }
    let code = |hex: &str| decode_actions(&unhex(hex)).unwrap_err().code;
    assert_eq!(code("ffff0010 00002320 0015 0001 00000000"), bac::BAD_LEN);
    assert_eq!(
        code("ffff0018 00002320 0015 0001 00000000 0000 000000000000"),
        bac::BAD_EXP_TYPE
    );
}
