//! Nicira connection-tracking actions and fields against the bytes Open vSwitch 3.1's
//! `ovs-ofctl -O OpenFlow13 -mmmmm parse-flow` writes, and every refusal with OVS's code.

use std::net::IpAddr;

use crate::action::{Action, Instruction};
use crate::error::{bac, bmc, et};
use crate::message::{FlowMod, Message};
use crate::nicira::{ct_flags, nat_flags, CtZoneSrc, NxCt, NxNat, NX_CT_RECIRC_NONE};
use crate::oxm::{Field, Oxm};
use crate::{decode, encode};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Decodes an ovs-ofctl flow-mod, checks it re-encodes byte for byte, returns it.
fn flow_mod(hex: &str) -> FlowMod {
    let bytes = unhex(hex);
    let (h, m) = decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(encode(&m, h.xid), bytes, "re-encoding differs");
    match m {
        Message::FlowMod(f) => f,
        other => panic!("{other:?}"),
    }
}

fn apply(f: &FlowMod) -> &[Action] {
    match &f.instructions[..] {
        [Instruction::ApplyActions(a)] => a,
        other => panic!("{other:?}"),
    }
}

/// `table=0,ip,ct_state=-trk,actions=ct(table=1,zone=5)`
const CT_RECIRC: &str = "040e006800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 00010016 80000a020800 0001d308 00000000 00000020 0000
    00040020 00000000 ffff0018 00002320 0023 0000 00000000 0005 01 000000 0000";

/// `table=1,ct_state=+trk+new,tcp,actions=ct(commit,zone=5,exec(set_field:0x1->ct_mark),
/// nat(src=10.0.0.1-10.0.0.2:1000-2000)),output:1`
const CT_COMMIT_NAT: &str = "040e00b000000001 0000000000000000 0000000000000000 0100000000008000
    ffffffffffffffff ffffffff00000000 0001001b 80000a020800 80001401 06 0001d308 00000021 00000021
    0000000000 00040060 00000000 ffff0048 00002320 0023 0001 00000000 0005 ff 000000 0000
    00190010 0001d604 00000001 00000000
    ffff0020 00002320 0024 0000 0001 0033 0a000001 0a000002 03e8 07d0 00000000
    00000010 00000001 0000000000000000";

/// `ct_state=+trk+est-rel,ct_mark=1/1,actions=ct_clear,output:2`
const CT_CLEAR: &str = "040e007800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001001c 0001d308 00000022 00000026 0001d708 00000001
    00000001 00000000 00040028 00000000 ffff0010 00002320 002b 000000000000
    00000010 00000002 0000000000000000";

/// `ip,actions=ct(commit,exec(set_field:0x1/0xff->ct_label,set_field:0x1/0xf0f->ct_mark,
/// set_field:0xf0->ct_mark))`: masked writes become NXAST_REG_LOADs.
const CT_LOADS: &str = "040e00b800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001000a 80000a020800 000000000000 00040078 00000000
    ffff0070 00002320 0023 0001 00000000 0000 ff 000000 0000
    ffff0018 00002320 0007 0007 0001d810 0000000000000001
    ffff0018 00002320 0007 0003 0001d604 0000000000000001
    ffff0018 00002320 0007 0203 0001d604 0000000000000000
    00190010 0001d604 000000f0 00000000";

/// `ipv6,actions=ct(commit,nat(dst=[fe80::1]:80))`
const CT_NAT6: &str = "040e008800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001000a 80000a0286dd 000000000000 00040048 00000000
    ffff0040 00002320 0023 0001 00000000 0000 ff 000000 0000
    ffff0028 00002320 0024 0000 0002 0014 fe800000000000000000000000000001 0050 000000000000";

/// `ip,ct_state=+trk-inv,ct_label=0x1/0xff,ct_nw_proto=6,ct_nw_src=10.0.0.1,
/// ct_nw_dst=10.0.0.0/24,ct_tp_src=80,ct_tp_dst=0x100/0xff00,ct_zone=5,actions=drop`
const CT_MATCH: &str = "040e009800000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 00010067 80000a020800 0001d308 00000020 00000030
    0001d402 0005 0001d920 00000000000000000000000000000001 000000000000000000000000000000ff
    0001f004 0a000001 0001f308 0a000000 ffffff00 0001ee01 06 0001f802 0050 0001fb04 0100 ff00
    00";

/// `ip,actions=ct(table=2,zone=1,nat)`
const CT_BARE_NAT: &str = "040e007000000001 0000000000000000 0000000000000000 0000000000008000
    ffffffffffffffff ffffffff00000000 0001000a 80000a020800 000000000000 00040030 00000000
    ffff0028 00002320 0023 0000 00000000 0001 02 000000 0000
    ffff0010 00002320 0024 0000 0000 0000";

#[test]
fn ovs_ct_recirc() {
    let f = flow_mod(CT_RECIRC);
    let st = f.match_.get(Field::CtState).unwrap();
    assert_eq!((st.value_u128(), st.mask_u128()), (0, 0x20));
    assert_eq!(
        apply(&f),
        [Action::Ct(Box::new(NxCt {
            flags: 0,
            zone: CtZoneSrc::Imm(5),
            recirc_table: 1,
            alg: 0,
            actions: vec![],
        }))]
    );
}

#[test]
fn ovs_ct_commit_mark_nat() {
    let f = flow_mod(CT_COMMIT_NAT);
    let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    assert_eq!(
        apply(&f),
        [
            Action::Ct(Box::new(NxCt {
                flags: ct_flags::COMMIT,
                zone: CtZoneSrc::Imm(5),
                recirc_table: NX_CT_RECIRC_NONE,
                alg: 0,
                actions: vec![
                    Action::SetField(Oxm::exact(Field::CtMark, 1)),
                    Action::Nat(NxNat {
                        flags: nat_flags::SRC,
                        addr_min: ip("10.0.0.1"),
                        addr_max: ip("10.0.0.2"),
                        port_min: Some(1000),
                        port_max: Some(2000),
                    }),
                ],
            })),
            Action::Output {
                port: 1,
                max_len: 0
            },
        ]
    );
}

#[test]
fn ovs_ct_clear_and_loads_and_nat6() {
    let f = flow_mod(CT_CLEAR);
    assert_eq!(apply(&f)[0], Action::CtClear);
    let m = f.match_.get(Field::CtMark).unwrap();
    assert_eq!((m.value_u128(), m.mask_u128()), (1, 1));

    let f = flow_mod(CT_LOADS);
    let Action::Ct(ct) = &apply(&f)[0] else {
        panic!()
    };
    assert_eq!(
        ct.actions[..3],
        [
            Action::RegLoad {
                field: Field::CtLabel,
                ofs: 0,
                nbits: 8,
                value: 1
            },
            Action::RegLoad {
                field: Field::CtMark,
                ofs: 0,
                nbits: 4,
                value: 1
            },
            Action::RegLoad {
                field: Field::CtMark,
                ofs: 8,
                nbits: 4,
                value: 0
            },
        ]
    );

    let f = flow_mod(CT_NAT6);
    let Action::Ct(ct) = &apply(&f)[0] else {
        panic!()
    };
    assert_eq!(
        ct.actions,
        [Action::Nat(NxNat {
            flags: nat_flags::DST,
            addr_min: Some("fe80::1".parse().unwrap()),
            addr_max: None,
            port_min: Some(80),
            port_max: None,
        })]
    );

    let f = flow_mod(CT_BARE_NAT);
    let Action::Ct(ct) = &apply(&f)[0] else {
        panic!()
    };
    assert_eq!((ct.recirc_table, ct.zone), (2, CtZoneSrc::Imm(1)));
    assert_eq!(ct.actions, [Action::Nat(NxNat::default())]);
}

#[test]
fn ovs_ct_match_fields() {
    let f = flow_mod(CT_MATCH);
    let get = |fl| {
        let o = f.match_.get(fl).unwrap();
        (o.value_u128(), o.mask_u128())
    };
    assert_eq!(get(Field::CtZone), (5, 0xffff));
    assert_eq!(get(Field::CtLabel), (1, 0xff));
    assert_eq!(get(Field::CtNwProto), (6, 0xff));
    assert_eq!(get(Field::CtNwSrc), (0x0a00_0001, 0xffff_ffff));
    assert_eq!(get(Field::CtNwDst), (0x0a00_0000, 0xffff_ff00));
    assert_eq!(get(Field::CtTpSrc), (80, 0xffff));
    assert_eq!(get(Field::CtTpDst), (0x100, 0xff00));
}

/// Bytes written at an offset.
type Patch<'a> = (usize, &'a [u8]);

/// The flow-mod of `hex` with one patch (offset, bytes) decodes to the error `code`.
fn refused(hex: &str, patches: &[Patch], type_: u16, code: u16) {
    let mut b = unhex(hex);
    for (at, bytes) in patches {
        b[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    let e = decode(&b).expect_err("refused");
    assert!(e.is(type_, code), "{patches:?}: {e}");
}

#[test]
fn refusals_as_ovs() {
    // Offsets into CT_COMMIT_NAT: the ct action starts at 0x58, its nested set_field at
    // 0x70, the nat at 0x80 (flags at 0x8c, range_present at 0x8e).
    let a = |code| (et::BAD_ACTION, code);
    let cases: &[(&[Patch], (u16, u16))] = &[
        // nat: src with dst, hash with random, an unknown flag.
        (&[(0x8c, &[0, 3])], a(bac::BAD_ARGUMENT)),
        (&[(0x8c, &[0, 0x19])], a(bac::BAD_ARGUMENT)),
        (&[(0x8c, &[0, 0x21])], a(bac::BAD_ARGUMENT)),
        // ipv4 min with ipv6 bits; max without min; port max without min.
        (&[(0x8e, &[0, 0x37])], a(bac::BAD_ARGUMENT)),
        (&[(0x8e, &[0, 0x02])], a(bac::BAD_ARGUMENT)),
        (&[(0x8e, &[0, 0x23])], a(bac::BAD_ARGUMENT)),
        // An address range ending before it starts; a port range likewise; port 0.
        (&[(0x94, &[10, 0, 0, 0])], a(bac::BAD_ARGUMENT)),
        (&[(0x9a, &[0, 1])], a(bac::BAD_ARGUMENT)),
        (&[(0x98, &[0, 0])], a(bac::BAD_ARGUMENT)),
        // The min address 0.0.0.0.
        (&[(0x90, &[0, 0, 0, 0])], a(bac::BAD_ARGUMENT)),
        // A NAT too short for its options (24 bytes: the ports run past it), as OVS.
        (
            &[
                (0x82, &[0, 0x18]),
                (0x98, &[0xff, 0xff, 0, 0x10]),
                (0x5a, &[0, 0x40]),
            ],
            a(bac::BAD_ARGUMENT),
        ),
        // Without commit, ct nests only a bare nat: set_field is refused.
        (&[(0x62, &[0, 0])], a(bac::BAD_ARGUMENT)),
        // A set_field of ct_state (not ct_mark/ct_label) inside ct.
        (&[(0x76, &[0xd2])], a(bac::BAD_ARGUMENT)),
        // A zone from an unknown field; from a known field but 8 bits; beyond its field.
        (&[(0x64, &[0, 0, 0x44, 0x04])], a(bac::BAD_SET_TYPE)),
        (
            &[(0x64, &[0, 1, 0xd6, 0x04]), (0x68, &[0, 7])],
            a(bac::BAD_SET_LEN),
        ),
        (
            &[(0x64, &[0, 1, 0xd6, 0x04]), (0x68, &[0x04, 0x4f])],
            a(bac::BAD_SET_LEN),
        ),
        // An unknown Nicira subtype; another experimenter.
        (&[(0x60, &[0, 0x63])], a(bac::BAD_EXP_TYPE)),
        (&[(0x5f, &[0x21])], a(bac::BAD_EXPERIMENTER)),
        // NXAST_CT shorter than its 24 bytes.
        (
            &[(0x5a, &[0, 0x10]), (0x68, &[0xff, 0xff, 0, 0x38])],
            a(bac::BAD_LEN),
        ),
    ];
    for (patches, (t, c)) in cases {
        refused(CT_COMMIT_NAT, patches, *t, *c);
    }
    // NAT outside ct; ct_clear of the wrong length; set_field of ct_mark outside ct.
    let nat_top = "040e005800000001 0000000000000000 0000000000000000 0000000000008000
        ffffffffffffffff ffffffff00000000 0001000a 80000a020800 000000000000 00040018 00000000
        ffff0010 00002320 0024 0000 0000 0000";
    refused(nat_top, &[], et::BAD_ACTION, bac::BAD_SET_ARGUMENT);
    refused(
        nat_top,
        &[(0x4a, &[0, 0x18]), (0x42, &[0, 0x10])],
        et::BAD_ACTION,
        bac::BAD_LEN,
    );
    refused(
        nat_top,
        &[(0x50, &[0, 0x2b]), (0x4a, &[0, 0x18])],
        et::BAD_ACTION,
        bac::BAD_LEN,
    );
    refused(
        nat_top,
        &[(
            0x48,
            &[0, 0x19, 0, 0x10, 0, 1, 0xd6, 4, 0, 0, 0, 1, 0, 0, 0, 0],
        )],
        et::BAD_ACTION,
        bac::BAD_SET_ARGUMENT,
    );
    // reg_load of a value wider than its bits, bits beyond the field.
    refused(
        CT_LOADS,
        &[(0x76, &[1])],
        et::BAD_ACTION,
        bac::BAD_SET_ARGUMENT,
    );
    refused(
        CT_LOADS,
        &[(0x6a, &[0x20, 0x07])],
        et::BAD_ACTION,
        bac::BAD_SET_LEN,
    );
    // ct_nw_proto without ct_state=+trk-inv (here +trk only).
    refused(CT_MATCH, &[(0x45, &[0x20])], et::BAD_MATCH, bmc::BAD_PREREQ);
}

#[test]
fn every_ct_action_round_trips() {
    let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    let ct = NxCt {
        flags: ct_flags::COMMIT | ct_flags::FORCE,
        zone: CtZoneSrc::Field {
            field: Field::Metadata,
            ofs: 16,
        },
        recirc_table: 7,
        alg: 21,
        actions: vec![
            Action::Nat(NxNat {
                flags: nat_flags::DST | nat_flags::PERSISTENT | nat_flags::PROTO_HASH,
                addr_min: ip("2001:db8::1"),
                addr_max: ip("2001:db8::9"),
                port_min: Some(1),
                port_max: Some(65535),
            }),
            Action::SetField(Oxm::exact(Field::CtLabel, u128::MAX)),
            Action::RegLoad {
                field: Field::CtLabel,
                ofs: 64,
                nbits: 64,
                value: u64::MAX,
            },
        ],
    };
    let bytes = unhex(CT_RECIRC);
    let (_, Message::FlowMod(mut f)) = decode(&bytes).unwrap() else {
        panic!()
    };
    f.instructions = vec![Instruction::ApplyActions(vec![
        Action::Ct(Box::new(ct)),
        Action::CtClear,
    ])];
    let m = Message::FlowMod(f);
    let b = encode(&m, 9);
    assert_eq!(decode(&b).map(|d| d.1), Ok(m));
}
