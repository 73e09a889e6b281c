//! The ct mapping: `NXAST_CT`/`NXAST_CT_CLEAR` ⇄ `ActionSpec::Ct`/`CtClear` and the ct match
//! fields ⇄ the key's, both ways, with every refusal's code. Rules are built
//! programmatically (the ct text syntax is the flow crate's).

use super::ct::{ct_from_of, ct_to_of};
use super::*;
use ferrovs_flow::ct::{CtNat, CtSpec, NatKind, NatSpec};
use ferrovs_openflow::nicira::{ct_flags, nat_flags, CtZoneSrc, NxCt, NxNat, NX_CT_RECIRC_NONE};

fn ports() -> PortMap {
    PortMap::new("br0", [(1, "vm1"), (2, "vm2")])
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

fn specs() -> Vec<CtSpec> {
    vec![
        CtSpec {
            zone: 5,
            table: Some(1),
            ..CtSpec::default()
        },
        CtSpec {
            commit: true,
            zone: 5,
            nat: CtNat::Bind(NatSpec {
                kind: NatKind::Src,
                addr_min: ip("10.0.0.1"),
                addr_max: ip("10.0.0.2"),
                ports: Some((1000, 2000)),
            }),
            mark: Some((1, u32::MAX)),
            ..CtSpec::default()
        },
        CtSpec {
            commit: true,
            force: true,
            zone: 65535,
            table: Some(253),
            nat: CtNat::Bind(NatSpec {
                kind: NatKind::Dst,
                addr_min: ip("fe80::1"),
                addr_max: ip("fe80::1"),
                ports: Some((80, 80)),
            }),
            mark: Some((0x1, 0xf0f)),
            label: Some((1, 0xffff_ffff_ffff_ffff_ffff_ffff)),
            zone_src: None,
            moves: Vec::new(),
        },
        CtSpec {
            table: Some(2),
            zone: 1,
            nat: CtNat::Apply,
            ..CtSpec::default()
        },
        CtSpec {
            commit: true,
            label: Some((0xab, u128::MAX)),
            ..CtSpec::default()
        },
        // OVN's zone from a register.
        CtSpec {
            commit: true,
            table: Some(7),
            zone_src: ferrovs_flow::SubField::new(ferrovs_flow::Field::Reg13, 0, 16),
            ..CtSpec::default()
        },
        // OVN's ct_commit: nat(src) without a range, the label's high word from xxreg0.
        CtSpec {
            commit: true,
            zone_src: ferrovs_flow::SubField::new(ferrovs_flow::Field::Reg13, 0, 16),
            nat: CtNat::Kind(NatKind::Src),
            mark: Some((0, 1)),
            moves: vec![(
                ferrovs_flow::SubField::new(ferrovs_flow::Field::Xxreg0, 0, 32).unwrap(),
                ferrovs_flow::SubField::new(ferrovs_flow::Field::CtLabel, 96, 32).unwrap(),
            )],
            ..CtSpec::default()
        },
    ]
}

/// Every CtSpec goes to NXAST_CT, through the wire codec, and back unchanged.
#[test]
fn ct_round_trips_through_the_wire() {
    for spec in specs() {
        let nx = ct_to_of(&spec);
        let fm = FlowMod {
            cookie: 0,
            cookie_mask: 0,
            table_id: 0,
            command: fc::ADD,
            idle_timeout: 0,
            hard_timeout: 0,
            priority: 1,
            buffer_id: OFP_NO_BUFFER,
            out_port: OFPP_ANY,
            out_group: OFPG_ANY,
            flags: 0,
            importance: 0,
            match_: ferrovs_openflow::Match::new().with(Oxm::exact(Of::EthType, 0x0800)),
            instructions: vec![Instruction::ApplyActions(vec![
                Action::Ct(Box::new(nx)),
                Action::CtClear,
            ])],
        };
        let bytes = ferrovs_openflow::encode(&ferrovs_openflow::Message::FlowMod(fm), 1);
        let (_, ferrovs_openflow::Message::FlowMod(back)) =
            ferrovs_openflow::decode(&bytes).unwrap_or_else(|e| panic!("{spec:?}: {e}"))
        else {
            panic!()
        };
        let acts = actions_from_of(&back.instructions, &ports()).unwrap();
        assert_eq!(
            acts,
            vec![ActionSpec::Ct(Box::new(spec.clone())), ActionSpec::CtClear],
            "{spec:?}"
        );
    }
}

/// What we send is what ovs-ofctl sends for the same ct() (the codec's fixtures are its
/// bytes): nat first, a whole mark as SET_FIELD, masked writes as REG_LOADs per bit run.
#[test]
fn ct_encodes_as_ovs() {
    let s = &specs();
    assert_eq!(
        ct_to_of(&s[1]),
        NxCt {
            flags: ct_flags::COMMIT,
            zone: CtZoneSrc::Imm(5),
            recirc_table: NX_CT_RECIRC_NONE,
            alg: 0,
            actions: vec![
                Action::Nat(NxNat {
                    flags: nat_flags::SRC,
                    addr_min: Some(ip("10.0.0.1")),
                    addr_max: Some(ip("10.0.0.2")),
                    port_min: Some(1000),
                    port_max: Some(2000),
                }),
                Action::SetField(Oxm::exact(Of::CtMark, 1)),
            ],
        }
    );
    let load = |field, ofs, nbits, value| Action::RegLoad {
        field,
        ofs,
        nbits,
        value,
    };
    // ovs-ofctl: load:0x1->NXM_NX_CT_MARK[0..3],load:0->NXM_NX_CT_MARK[8..11],
    // load:0x1->NXM_NX_CT_LABEL[0..63],load:0->NXM_NX_CT_LABEL[64..95]
    assert_eq!(
        ct_to_of(&s[2]).actions[1..],
        [
            load(Of::CtMark, 0, 4, 1),
            load(Of::CtMark, 8, 4, 0),
            load(Of::CtLabel, 0, 64, 1),
            load(Of::CtLabel, 64, 32, 0),
        ]
    );
    assert_eq!(
        ct_to_of(&s[2]).actions[0],
        Action::Nat(NxNat {
            flags: nat_flags::DST,
            addr_min: Some(ip("fe80::1")),
            addr_max: None,
            port_min: Some(80),
            port_max: None,
        })
    );
    assert_eq!(ct_to_of(&s[3]).actions, [Action::Nat(NxNat::default())]);
    assert_eq!(ct_to_of(&s[3]).recirc_table, 2);
}

/// A change to an `NXAST_CT`.
type Edit = Box<dyn Fn(&mut NxCt)>;

#[test]
fn ct_refusals() {
    let base = ct_to_of(&specs()[1]);
    let with = |f: &dyn Fn(&mut NxCt)| {
        let mut c = base.clone();
        f(&mut c);
        let e = ct_from_of(&c).expect_err("refused");
        (e.type_, e.code)
    };
    let arg = (et::BAD_ACTION, bac::BAD_ARGUMENT);
    let nat = |c: &mut NxCt, n: NxNat| c.actions[0] = Action::Nat(n);
    // A zone from a field the flow key lacks (a register's is a rule's `zone_src`).
    assert_eq!(
        with(&|c| {
            c.zone = CtZoneSrc::Field {
                field: Of::PbbIsid,
                ofs: 0,
            }
        }),
        (et::BAD_ACTION, bac::BAD_SET_TYPE)
    );
    let cases: Vec<Edit> = vec![
        Box::new(|c| c.alg = 21),
        Box::new(|c| c.flags |= 4),
        Box::new(|c| c.flags = ct_flags::FORCE),
        Box::new(|c| c.recirc_table = 254),
        Box::new(|c| c.actions.push(Action::Nat(NxNat::default()))),
        Box::new(move |c| {
            nat(
                c,
                NxNat {
                    flags: nat_flags::SRC | nat_flags::PERSISTENT,
                    addr_min: Some(ip("10.0.0.1")),
                    ..NxNat::default()
                },
            )
        }),
        Box::new(move |c| {
            nat(
                c,
                NxNat {
                    addr_min: Some(ip("10.0.0.1")),
                    ..NxNat::default()
                },
            )
        }),
    ];
    for (i, f) in cases.iter().enumerate() {
        assert_eq!(with(f.as_ref()), arg, "case {i}");
    }
}

/// Later writes of one field win where their bits overlap.
#[test]
fn ct_field_writes_merge() {
    let c = NxCt {
        flags: ct_flags::COMMIT,
        zone: CtZoneSrc::Imm(0),
        recirc_table: NX_CT_RECIRC_NONE,
        alg: 0,
        actions: vec![
            Action::SetField(Oxm::exact(Of::CtMark, 0xffff_0000)),
            Action::RegLoad {
                field: Of::CtMark,
                ofs: 16,
                nbits: 8,
                value: 0x12,
            },
            Action::RegLoad {
                field: Of::CtLabel,
                ofs: 100,
                nbits: 4,
                value: 0xa,
            },
        ],
    };
    let s = ct_from_of(&c).unwrap();
    assert_eq!(s.mark, Some((0xff12_0000, u32::MAX)));
    assert_eq!(s.label, Some((0xa << 100, 0xf << 100)));
}

fn ct_match() -> Match {
    let mut m = Match::catchall();
    m.set(Field::EthType, 0x0800, 0xffff);
    m.set(Field::CtState, 0x20, 0x30);
    m.set(Field::CtZone, 5, 0xffff);
    m.set(Field::CtMark, 1, 1);
    m.set(Field::CtLabel, 1, 0xff);
    m.set(Field::CtNwProto, 6, 0xff);
    m.set(Field::CtNwSrc, 0x0a00_0001, 0xffff_ffff);
    m.set(Field::CtNwDst, 0x0a00_0000, 0xffff_ff00);
    m.set(Field::CtTpSrc, 80, 0xffff);
    m.set(Field::CtTpDst, 0x100, 0xff00);
    m
}

#[test]
fn ct_match_fields_both_ways() {
    let m = ct_match();
    let of = match_to_of(&m, None, &ports());
    let st = of.get(Of::CtState).unwrap();
    assert_eq!((st.value_u128(), st.mask.is_some()), (0x20, true));
    // What we send passes the codec's checks (OVS's +trk-inv prerequisite among them).
    of.check_prerequisites().unwrap();
    assert_eq!(match_from_of(&of, &ports()).unwrap(), (m, None));
}

#[test]
fn ct_match_refusals() {
    let r = |o: Oxm| {
        let e = match_from_of(
            &ferrovs_openflow::Match::new()
                .with(Oxm::masked(Of::CtState, 0x20, 0x30))
                .with(o),
            &ports(),
        )
        .unwrap_err();
        (e.type_, e.code)
    };
    assert_eq!(
        r(Oxm::exact(Of::CtIpv6Src, 1)),
        (et::BAD_MATCH, bmc::BAD_FIELD)
    );
    let e = match_from_of(
        &ferrovs_openflow::Match::new().with(Oxm::masked(Of::CtState, 0x100, 0x100)),
        &ports(),
    )
    .unwrap_err();
    assert_eq!((e.type_, e.code), (et::BAD_MATCH, bmc::BAD_VALUE));
    // An exact (32-bit) ct_state is the key's eight bits, as OVS stores it.
    let (m, _) = match_from_of(
        &ferrovs_openflow::Match::new().with(Oxm::exact(Of::CtState, 0x21)),
        &ports(),
    )
    .unwrap();
    assert_eq!(m.field(Field::CtState), (0x21, 0xff));
}

/// A programmatic rule with ct actions goes to instructions and back.
#[test]
fn ct_rule_instructions_round_trip() {
    let spec = FlowSpec {
        table: 1,
        priority: 10,
        cookie: 0,
        idle_timeout: 0,
        hard_timeout: 0,
        in_port: None,
        m: ct_match(),
        actions: vec![
            ActionSpec::Ct(Box::new(specs()[1].clone())),
            ActionSpec::CtClear,
            ActionSpec::Output("vm1".into()),
        ],
    };
    let insts = instructions_to_of(&spec, &ports());
    assert_eq!(actions_from_of(&insts, &ports()).unwrap(), spec.actions);
}

/// A FLOW_MOD with ct installs the rule ovs-ofctl's text gives: needs the ct text syntax in
/// the flow crate (a rule from OpenFlow must print and parse back to itself).
#[test]
fn ct_flow_mod_is_the_cli_rule() {
    let cli = "table=1,priority=10,ct_state=+new+trk,tcp,actions=ct(commit,zone=5,nat(src=10.0.0.1-10.0.0.2:1000-2000),exec(set_field:0x1->ct_mark)),output:vm1";
    let want = ferrovs_flow::parse_flow(cli).unwrap();
    let fm = FlowMod {
        cookie: 0,
        cookie_mask: 0,
        table_id: 1,
        command: fc::ADD,
        idle_timeout: 0,
        hard_timeout: 0,
        priority: 10,
        buffer_id: OFP_NO_BUFFER,
        out_port: OFPP_ANY,
        out_group: OFPG_ANY,
        flags: 0,
        importance: 0,
        match_: match_to_of(&want.m, None, &ports()),
        instructions: instructions_to_of(&want, &ports()),
    };
    assert_eq!(rule_from_flow_mod(&fm, &ports()).unwrap(), want);
}
