//! The FLOW_MOD ⇄ rule mapping: every supported field and action both ways, every refusal
//! with its OpenFlow type and code, and add/modify/delete semantics.

use super::*;
use ferrovs_openflow::error::{gmfc, mmfc};
use ferrovs_openflow::Match as OfMatch;

fn ports() -> PortMap {
    PortMap::new("br0", [(1, "vm1"), (2, "vm2"), (3, "br0")])
}

fn fm(command: u8, table: u8, priority: u16, m: Vec<Oxm>, apply: Vec<Action>) -> FlowMod {
    FlowMod {
        cookie: 0,
        cookie_mask: 0,
        table_id: table,
        command,
        idle_timeout: 0,
        hard_timeout: 0,
        priority,
        buffer_id: OFP_NO_BUFFER,
        out_port: OFPP_ANY,
        out_group: OFPG_ANY,
        flags: 0,
        importance: 0,
        match_: OfMatch { fields: m },
        instructions: vec![Instruction::ApplyActions(apply)],
    }
}

fn out(p: u32) -> Action {
    Action::Output {
        port: p,
        max_len: 0,
    }
}

fn x(f: Of, v: u128) -> Oxm {
    Oxm::exact(f, v)
}

fn refusal(f: &FlowMod) -> (u16, u16) {
    let e = rule_from_flow_mod(f, &ports()).unwrap_err();
    (e.type_, e.code)
}

/// A rule from OpenFlow is the CLI's rule: same text, same spec.
fn same_as_cli(f: &FlowMod, cli: &str) {
    let spec = rule_from_flow_mod(f, &ports()).unwrap();
    assert_eq!(spec, ferrovs_flow::parse_flow(cli).unwrap(), "{spec}");
    // And back to OpenFlow: the same match and instructions (fields in our order).
    let back = match_to_of(&spec.m, spec.in_port.as_deref(), &ports());
    let (m2, p2) = match_from_of(&back, &ports()).unwrap();
    assert_eq!((m2, p2), (spec.m, spec.in_port.clone()));
    let acts = actions_from_of(&instructions_to_of(&spec, &ports()), &ports()).unwrap();
    assert_eq!(acts, spec.actions);
}

#[test]
fn every_supported_field_maps_to_the_cli_rule_and_back() {
    let ip = x(Of::EthType, 0x0800);
    let cases: Vec<(Vec<Oxm>, &str)> = vec![
        (vec![x(Of::InPort, 1)], "in_port=vm1"),
        (vec![x(Of::InPort, u128::from(OFPP_LOCAL))], "in_port=br0"),
        (
            vec![x(Of::EthDst, 0x0200_0000_0001)],
            "dl_dst=02:00:00:00:00:01",
        ),
        (
            vec![Oxm::masked(Of::EthSrc, 0x0100_0000_0000, 0x0100_0000_0000)],
            "dl_src=01:00:00:00:00:00/01:00:00:00:00:00",
        ),
        (vec![x(Of::EthType, 0x88cc)], "dl_type=0x88cc"),
        (vec![x(Of::VlanVid, 0x1000 | 10)], "dl_vlan=10"),
        (
            vec![x(Of::VlanVid, 0x1000 | 10), x(Of::VlanPcp, 5)],
            "dl_vlan=10,dl_vlan_pcp=5",
        ),
        (vec![ip.clone()], "ip"),
        (vec![ip.clone(), x(Of::IpDscp, 8)], "ip,nw_tos=32"),
        (
            vec![
                ip.clone(),
                Oxm::masked(Of::Ipv4Src, 0x0a00_0000, 0xff00_0000),
            ],
            "ip,nw_src=10.0.0.0/8",
        ),
        (
            vec![ip.clone(), x(Of::Ipv4Dst, 0x0a00_0001)],
            "ip,nw_dst=10.0.0.1",
        ),
        (
            vec![
                ip.clone(),
                x(Of::IpProto, 6),
                x(Of::TcpDst, 80),
                x(Of::TcpSrc, 1234),
            ],
            "tcp,tp_dst=80,tp_src=1234",
        ),
        (
            vec![ip.clone(), x(Of::IpProto, 17), x(Of::UdpDst, 53)],
            "udp,udp_dst=53",
        ),
        (
            vec![ip.clone(), x(Of::IpProto, 132), x(Of::SctpSrc, 9)],
            "sctp,sctp_src=9",
        ),
        (
            vec![
                ip.clone(),
                x(Of::IpProto, 1),
                x(Of::Icmpv4Type, 8),
                x(Of::Icmpv4Code, 0),
            ],
            "icmp,icmp_type=8,icmp_code=0",
        ),
        (
            vec![
                x(Of::EthType, 0x86dd),
                x(Of::IpProto, 58),
                x(Of::Icmpv6Type, 135),
            ],
            "icmp6,icmpv6_type=135",
        ),
        (
            vec![
                x(Of::EthType, 0x86dd),
                Oxm::masked(Of::Ipv6Src, 0x2001_0db8 << 96, u128::MAX << 96),
            ],
            "ipv6,ipv6_src=2001:db8::/32",
        ),
        (
            vec![x(Of::EthType, 0x86dd), x(Of::Ipv6Dst, 1)],
            "ipv6,ipv6_dst=::1",
        ),
        (
            vec![
                x(Of::EthType, 0x0806),
                x(Of::ArpOp, 1),
                x(Of::ArpTpa, 0x0a00_0001),
            ],
            "arp,arp_op=1,arp_tpa=10.0.0.1",
        ),
        (
            vec![x(Of::EthType, 0x0806), x(Of::ArpSpa, 0x0a00_0002)],
            "arp,arp_spa=10.0.0.2",
        ),
        (vec![x(Of::TunnelId, 42)], "tun_id=42"),
        (vec![x(Of::TunIpv4Src, 0x0a00_0001)], "tun_src=10.0.0.1"),
        (vec![x(Of::TunIpv4Dst, 0x0a00_0002)], "tun_dst=10.0.0.2"),
    ];
    for (m, cli) in cases {
        let f = fm(fc::ADD, 0, 100, m, vec![out(2)]);
        same_as_cli(&f, &format!("priority=100,{cli} actions=output:vm2"));
    }
}

/// The fields of ARP's hardware addresses, ICMPv6 ND, the IPv6 flow label and ECN.
#[test]
fn arp_nd_flow_label_and_ecn_fields_map_to_the_cli_rule_and_back() {
    let ip = x(Of::EthType, 0x0800);
    let arp = x(Of::EthType, 0x0806);
    let v6 = x(Of::EthType, 0x86dd);
    let icmp6 = |t: u128| vec![v6.clone(), x(Of::IpProto, 58), x(Of::Icmpv6Type, t)];
    let with = |mut v: Vec<Oxm>, o: Oxm| {
        v.push(o);
        v
    };
    let cases: Vec<(Vec<Oxm>, &str)> = vec![
        (vec![ip.clone(), x(Of::IpEcn, 1)], "ip,nw_ecn=1"),
        (
            vec![v6.clone(), x(Of::IpDscp, 8), x(Of::IpEcn, 3)],
            "ipv6,nw_tos=32,nw_ecn=3",
        ),
        (
            vec![arp.clone(), x(Of::ArpSha, 0x1211_1111_1111)],
            "arp,arp_sha=12:11:11:11:11:11",
        ),
        (
            vec![
                arp.clone(),
                Oxm::masked(Of::ArpTha, 0x2222_2200_0000, 0xffff_ff00_0000),
            ],
            "arp,arp_tha=22:22:22:00:00:00/ff:ff:ff:00:00:00",
        ),
        (
            vec![v6.clone(), x(Of::Ipv6Flabel, 100)],
            "ipv6,ipv6_label=100",
        ),
        (
            vec![v6.clone(), Oxm::masked(Of::Ipv6Flabel, 0x64, 0xff)],
            "ipv6,ipv6_label=0x64/0xff",
        ),
        (
            with(icmp6(135), x(Of::Ipv6NdTarget, 0x20 << 112 | 0x20)),
            "icmp6,icmp_type=135,nd_target=20::20",
        ),
        (
            with(icmp6(135), x(Of::Ipv6NdSll, 0x2222_2222_2222)),
            "icmp6,icmp_type=135,nd_sll=22:22:22:22:22:22",
        ),
        (
            with(icmp6(136), x(Of::Ipv6NdTll, 0x2222_2222_2222)),
            "icmp6,icmpv6_type=136,nd_tll=22:22:22:22:22:22",
        ),
    ];
    for (m, cli) in cases {
        let f = fm(fc::ADD, 0, 100, m.clone(), vec![out(2)]);
        same_as_cli(&f, &format!("priority=100,{cli} actions=output:vm2"));
        // The same OXM fields come back (OpenFlow's names: ARP's or ND's).
        let spec = rule_from_flow_mod(&f, &ports()).unwrap();
        let mut back = match_to_of(&spec.m, None, &ports()).fields;
        let mut want = m;
        back.sort_by_key(|o| o.field);
        want.sort_by_key(|o| o.field);
        assert_eq!(back, want, "{cli}");
    }
    // The rewrites, with the OpenFlow field they came as.
    let set = |f: Of, v: u128| Action::SetField(x(f, v));
    let acts: Vec<(Vec<Oxm>, Action, &str)> = vec![
        (
            vec![ip.clone()],
            set(Of::IpEcn, 1),
            "ip actions=mod_nw_ecn:1",
        ),
        (
            vec![ip.clone(), x(Of::IpProto, 1)],
            set(Of::Icmpv4Type, 0),
            "icmp actions=set_field:0->icmp_type",
        ),
        (
            vec![ip.clone(), x(Of::IpProto, 1)],
            set(Of::Icmpv4Code, 3),
            "icmp actions=set_field:3->icmp_code",
        ),
        (
            icmp6(128),
            set(Of::Icmpv6Type, 135),
            "icmp6,icmp_type=128 actions=set_field:135->icmpv6_type",
        ),
        (
            vec![v6.clone(), x(Of::IpProto, 58)],
            set(Of::Icmpv6Code, 1),
            "icmp6 actions=set_field:1->icmpv6_code",
        ),
        (
            vec![arp.clone()],
            set(Of::ArpOp, 2),
            "arp actions=set_field:2->arp_op",
        ),
        (
            vec![arp.clone()],
            set(Of::ArpSpa, 0x0a0a_0a0a),
            "arp actions=set_field:10.10.10.10->arp_spa",
        ),
        (
            vec![arp.clone()],
            set(Of::ArpTpa, 0x0a0a_0a0a),
            "arp actions=set_field:10.10.10.10->arp_tpa",
        ),
        (
            vec![arp.clone()],
            set(Of::ArpSha, 0xaaaa_aaaa_aaaa),
            "arp actions=set_field:aa:aa:aa:aa:aa:aa->arp_sha",
        ),
        (
            vec![arp.clone()],
            set(Of::ArpTha, 0xbabb_bbbb_bbbb),
            "arp actions=set_field:ba:bb:bb:bb:bb:bb->arp_tha",
        ),
        (
            vec![v6.clone()],
            set(Of::Ipv6Flabel, 203),
            "ipv6 actions=set_field:0xcb->ipv6_label",
        ),
        (
            icmp6(135),
            set(Of::Ipv6NdTarget, 0xa0 << 112 | 0xa0),
            "icmp6,icmp_type=135 actions=set_field:a0::a0->nd_target",
        ),
        (
            icmp6(135),
            set(Of::Ipv6NdSll, 0xaaaa_aaaa_aaaa),
            "icmp6,icmp_type=135 actions=set_field:aa:aa:aa:aa:aa:aa->nd_sll",
        ),
        (
            icmp6(136),
            set(Of::Ipv6NdTll, 0xaaaa_aaaa_aaaa),
            "icmp6,icmp_type=136 actions=set_field:aa:aa:aa:aa:aa:aa->nd_tll",
        ),
        (
            vec![ip.clone()],
            Action::PushVlan(0x88a8),
            "ip actions=push_vlan:0x88a8",
        ),
    ];
    for (m, a, cli) in acts {
        let f = fm(fc::ADD, 0, 7, m, vec![a.clone()]);
        same_as_cli(&f, &format!("priority=7,{cli}"));
        let spec = rule_from_flow_mod(&f, &ports()).unwrap();
        assert_eq!(
            instructions_to_of(&spec, &ports()),
            vec![Instruction::ApplyActions(vec![a])],
            "{cli}"
        );
    }
    // A rewrite of a field the match's protocol lacks: the same refusal as for any other.
    for (m, a) in [
        (vec![ip.clone()], set(Of::ArpSha, 1)),
        (icmp6(136), set(Of::Ipv6NdSll, 1)),
        (vec![v6.clone()], set(Of::Ipv6NdTarget, 1)),
        (vec![arp.clone()], set(Of::Ipv6Flabel, 1)),
        (vec![ip.clone(), x(Of::IpProto, 6)], set(Of::Icmpv4Type, 1)),
        (vec![ip.clone(), x(Of::IpProto, 17)], set(Of::TcpSrc, 1)),
        (icmp6(128), set(Of::Icmpv4Code, 1)),
    ] {
        let f = fm(fc::ADD, 0, 1, m, vec![a.clone()]);
        assert_eq!(
            refusal(&f),
            (et::BAD_ACTION, bac::MATCH_INCONSISTENT),
            "{a:?}"
        );
    }
}

#[test]
fn every_supported_action_maps_to_the_cli_rule_and_back() {
    let tcp = vec![x(Of::EthType, 0x0800), x(Of::IpProto, 6)];
    let udp6 = vec![x(Of::EthType, 0x86dd), x(Of::IpProto, 17)];
    let set = |f: Of, v: u128| Action::SetField(x(f, v));
    let cases: Vec<(Vec<Oxm>, Vec<Action>, &str)> = vec![
        (
            vec![],
            vec![out(1), out(2)],
            "actions=output:vm1,output:vm2",
        ),
        (
            vec![],
            vec![out(u128::from(OFPP_LOCAL) as u32)],
            "actions=output:br0",
        ),
        (vec![], vec![out(OFPP_IN_PORT)], "actions=in_port"),
        (vec![], vec![out(OFPP_NORMAL)], "actions=normal"),
        (vec![], vec![out(OFPP_FLOOD)], "actions=flood"),
        (vec![], vec![out(OFPP_ALL)], "actions=all"),
        (vec![], vec![], "actions=drop"),
        (
            vec![],
            vec![set(Of::EthSrc, 0x0200_0000_0009), out(1)],
            "actions=mod_dl_src:02:00:00:00:00:09,output:vm1",
        ),
        (
            vec![],
            vec![set(Of::EthDst, 0x0200_0000_0009)],
            "actions=mod_dl_dst:02:00:00:00:00:09",
        ),
        (
            tcp.clone(),
            vec![set(Of::Ipv4Src, 0x0a00_0009)],
            "tcp actions=mod_nw_src:10.0.0.9",
        ),
        (
            tcp.clone(),
            vec![set(Of::Ipv4Dst, 0x0a00_0009)],
            "tcp actions=mod_nw_dst:10.0.0.9",
        ),
        (
            tcp.clone(),
            vec![set(Of::IpDscp, 2)],
            "tcp actions=mod_nw_tos:8",
        ),
        (
            tcp.clone(),
            vec![Action::SetNwTtl(9)],
            "tcp actions=set_field:9->nw_ttl",
        ),
        (
            tcp.clone(),
            vec![set(Of::TcpDst, 8080)],
            "tcp actions=mod_tp_dst:8080",
        ),
        (
            tcp.clone(),
            vec![set(Of::TcpSrc, 99)],
            "tcp actions=mod_tp_src:99",
        ),
        (
            udp6.clone(),
            vec![set(Of::UdpDst, 53)],
            "udp6 actions=mod_tp_dst:53",
        ),
        (
            udp6.clone(),
            vec![set(Of::Ipv6Dst, 1)],
            "udp6 actions=set_field:::1->ipv6_dst",
        ),
        (
            vec![],
            vec![set(Of::VlanVid, 0x1000 | 7)],
            "actions=mod_vlan_vid:7",
        ),
        (vec![], vec![set(Of::VlanPcp, 3)], "actions=mod_vlan_pcp:3"),
        (
            vec![],
            vec![Action::PushVlan(0x8100), Action::PopVlan],
            "actions=push_vlan:0x8100,pop_vlan",
        ),
        (vec![], vec![set(Of::TunnelId, 5)], "actions=set_tunnel:5"),
        (
            vec![],
            vec![set(Of::TunIpv4Dst, 0x0a00_0001)],
            "actions=set_field:10.0.0.1->tun_dst",
        ),
    ];
    for (m, a, cli) in cases {
        let f = fm(fc::ADD, 0, 7, m, a);
        let (mp, ap) = cli.split_once("actions=").unwrap();
        let cli = format!("priority=7,{mp}actions={ap}").replace(", actions", " actions");
        same_as_cli(&f, cli.trim());
    }
    // goto_table comes last, as the CLI writes it.
    let mut f = fm(fc::ADD, 1, 7, vec![], vec![out(1)]);
    f.instructions.push(Instruction::GotoTable(3));
    same_as_cli(&f, "table=1,priority=7 actions=output:vm1,goto_table:3");
    let mut f = fm(fc::ADD, 0, 7, vec![], vec![]);
    f.instructions = vec![Instruction::GotoTable(2)];
    same_as_cli(&f, "priority=7 actions=goto_table:2");
    // Timeouts and cookie.
    let mut f = fm(fc::ADD, 0, 7, vec![], vec![out(1)]);
    f.cookie = 0x2a;
    f.idle_timeout = 30;
    f.hard_timeout = 60;
    same_as_cli(
        &f,
        "priority=7,cookie=0x2a,idle_timeout=30,hard_timeout=60 actions=output:vm1",
    );
}

#[test]
fn what_the_pipeline_lacks_is_refused_with_its_code() {
    let v6 = x(Of::EthType, 0x86dd);
    let fields = [
        vec![x(Of::InPhyPort, 1), x(Of::InPort, 1)],
        vec![v6.clone(), x(Of::Ipv6Exthdr, 1)],
        vec![Oxm::masked(Of::CtState, 0x20, 0x30), x(Of::CtIpv6Src, 1)],
    ];
    for m in fields {
        let f = fm(fc::ADD, 0, 1, m.clone(), vec![out(1)]);
        assert_eq!(refusal(&f), (et::BAD_MATCH, bmc::BAD_FIELD), "{m:?}");
    }
    // A port the bridge does not have (yet) is accepted, as OVS does, by its number;
    // a reserved one the pipeline lacks is not.
    let f = fm(fc::ADD, 0, 1, vec![x(Of::InPort, 9)], vec![out(1)]);
    same_as_cli(&f, "priority=1,in_port=9,actions=output:vm1");
    let f = fm(fc::ADD, 0, 1, vec![], vec![out(9)]);
    same_as_cli(&f, "priority=1,actions=output:9");
    let spec = rule_from_flow_mod(&f, &ports()).unwrap();
    let back = instructions_to_of(&spec, &ports());
    assert_eq!(back, vec![Instruction::ApplyActions(vec![out(9)])]);
    let f = fm(
        fc::ADD,
        0,
        1,
        vec![x(Of::InPort, 0xffff_fff9)],
        vec![out(1)],
    );
    assert_eq!(refusal(&f), (et::BAD_MATCH, bmc::BAD_VALUE));
    let f = fm(fc::ADD, 0, 1, vec![], vec![out(0xffff_fff9)]);
    assert_eq!(refusal(&f), (et::BAD_ACTION, bac::BAD_OUT_PORT));
    for a in [
        // OVS 3.1 has no copy_ttl_in/out (ovs-ofctl: "unknown action") nor PBB.
        Action::CopyTtlIn,
        Action::CopyTtlOut,
        Action::PushPbb(0x88e7),
        Action::PopPbb,
    ] {
        let f = fm(fc::ADD, 0, 1, vec![], vec![a.clone()]);
        assert_eq!(refusal(&f), (et::BAD_ACTION, bac::BAD_TYPE), "{a:?}");
    }
    // A group the bridge does not have.
    let f = fm(fc::ADD, 0, 1, vec![], vec![Action::Group(1)]);
    let e = apply_flow_mod(&mut BridgeRules::new(), &f, &ports()).unwrap_err();
    assert_eq!((e.type_, e.code), (et::BAD_ACTION, bac::BAD_OUT_GROUP));
    let f = fm(fc::ADD, 0, 1, vec![], vec![Action::PushVlan(0x9100)]);
    assert_eq!(refusal(&f), (et::BAD_ACTION, bac::BAD_ARGUMENT));
    let f = fm(
        fc::ADD,
        0,
        1,
        vec![x(Of::EthType, 0x0800), x(Of::IpProto, 6)],
        vec![Action::SetField(x(Of::SctpSrc, 2))],
    );
    assert_eq!(refusal(&f), (et::BAD_ACTION, bac::BAD_SET_TYPE));
    // A rewrite the match's protocol does not carry.
    let f = fm(
        fc::ADD,
        0,
        1,
        vec![],
        vec![Action::SetField(x(Of::Ipv4Dst, 1))],
    );
    assert_eq!(refusal(&f), (et::BAD_ACTION, bac::MATCH_INCONSISTENT));
    // Instructions.
    for (i, want) in [
        (
            Instruction::GotoTable(255),
            (et::BAD_INSTRUCTION, bic::BAD_TABLE_ID),
        ),
        (
            Instruction::GotoTable(254),
            (et::BAD_INSTRUCTION, bic::BAD_TABLE_ID),
        ),
    ] {
        let mut f = fm(fc::ADD, 0, 1, vec![], vec![]);
        f.instructions = vec![i.clone()];
        assert_eq!(refusal(&f), want, "{i:?}");
    }
    let f = fm(fc::ADD, 254, 1, vec![], vec![]);
    assert_eq!(refusal(&f), (et::FLOW_MOD_FAILED, fmfc::BAD_TABLE_ID));
    let _ = mmfc::UNKNOWN_METER;
    let _ = gmfc::OUT_OF_GROUPS;
}

/// The action set, metadata and TTL actions map to the CLI's rule and back.
#[test]
fn action_set_metadata_and_ttl_map_to_the_cli_rule() {
    let ip = x(Of::EthType, 0x0800);
    let mut f = fm(
        fc::ADD,
        1,
        5,
        vec![ip, Oxm::masked(Of::Metadata, 1, 0xff)],
        vec![Action::DecNwTtl, Action::SetQueue(3), out(1)],
    );
    f.instructions.extend([
        Instruction::WriteMetadata {
            metadata: 0x20,
            mask: 0xf0,
        },
        Instruction::WriteActions(vec![Action::SetField(x(Of::Ipv4Dst, 0x0a00_0001)), out(2)]),
        Instruction::ClearActions,
        Instruction::GotoTable(3),
    ]);
    same_as_cli(
        &f,
        "table=1,priority=5,ip,metadata=0x1/0xff actions=dec_ttl,set_queue:3,output:vm1,\
         clear_actions,write_actions(mod_nw_dst:10.0.0.1,output:vm2),\
         write_metadata:0x20/0xf0,goto_table:3",
    );
    // An instruction twice is refused.
    let mut f = fm(fc::ADD, 0, 1, vec![], vec![]);
    f.instructions = vec![Instruction::ClearActions, Instruction::ClearActions];
    assert_eq!(refusal(&f), (et::BAD_INSTRUCTION, bic::UNSUP_INST));
}

fn gm(command: u16, type_: u8, id: u32, buckets: Vec<Bucket>) -> GroupMod {
    GroupMod {
        command,
        type_,
        group_id: id,
        command_bucket_id: ferrovs_openflow::message::group::BUCKET_ALL,
        selection_method: None,
        buckets,
    }
}

fn bucket(weight: u16, watch_port: u32, actions: Vec<Action>) -> Bucket {
    Bucket {
        weight,
        watch_port,
        watch_group: OFPG_ANY,
        bucket_id: 0,
        actions,
    }
}

/// GROUP_MOD: each type maps to the CLI's group and back; every refusal has OVS's code;
/// deleting a group deletes the rules that use it.
#[test]
fn group_mods_apply_with_ovs_errors() {
    use ferrovs_openflow::message::group as g;
    let mut r = BridgeRules::new();
    let code = |r: &mut BridgeRules, m: &GroupMod| {
        let e = apply_group_mod(r, m, &ports()).unwrap_err();
        (e.type_, e.code)
    };
    let all = gm(
        g::ADD,
        g::TYPE_ALL,
        1,
        vec![
            bucket(0, OFPP_ANY, vec![out(1)]),
            bucket(
                0,
                OFPP_ANY,
                vec![Action::SetField(x(Of::EthDst, 0x0200_0000_0009)), out(2)],
            ),
        ],
    );
    apply_group_mod(&mut r, &all, &ports()).unwrap();
    let spec = &r.groups()[&1].spec;
    assert_eq!(
        spec.to_string(),
        "group_id=1,type=all,bucket=actions=output:vm1,bucket=actions=mod_dl_dst:02:00:00:00:00:09,output:vm2"
    );
    // Bucket ids are the positions (what 1.5's GROUP_DESC shows; 1.3 has none).
    let mut numbered = all.buckets.clone();
    for (i, b) in numbered.iter_mut().enumerate() {
        b.bucket_id = i as u32;
    }
    assert_eq!(group_desc(spec, &ports()).buckets, numbered);
    assert_eq!(
        code(&mut r, &all),
        (et::GROUP_MOD_FAILED, gmfc::GROUP_EXISTS)
    );
    let ff = gm(
        g::ADD,
        g::TYPE_FF,
        2,
        vec![bucket(0, OFPP_ANY, vec![out(1)])],
    );
    assert_eq!(code(&mut r, &ff), (et::GROUP_MOD_FAILED, gmfc::BAD_WATCH));
    let ff = gm(g::ADD, g::TYPE_FF, 2, vec![bucket(0, 9, vec![out(1)])]);
    assert_eq!(code(&mut r, &ff), (et::GROUP_MOD_FAILED, gmfc::BAD_WATCH));
    let ind = gm(g::ADD, g::TYPE_INDIRECT, 3, vec![]);
    assert_eq!(
        code(&mut r, &ind),
        (et::GROUP_MOD_FAILED, gmfc::INVALID_GROUP)
    );
    let bad = gm(g::ADD, 7, 3, vec![]);
    assert_eq!(code(&mut r, &bad), (et::GROUP_MOD_FAILED, gmfc::BAD_TYPE));
    let w = gm(
        g::ADD,
        g::TYPE_ALL,
        3,
        vec![bucket(5, OFPP_ANY, vec![out(1)])],
    );
    assert_eq!(
        code(&mut r, &w),
        (et::GROUP_MOD_FAILED, gmfc::WEIGHT_UNSUPPORTED)
    );
    let own = gm(
        g::ADD,
        g::TYPE_INDIRECT,
        3,
        vec![bucket(0, OFPP_ANY, vec![Action::Group(3)])],
    );
    assert_eq!(code(&mut r, &own), (et::GROUP_MOD_FAILED, gmfc::LOOP));
    let chained = gm(
        g::ADD,
        g::TYPE_INDIRECT,
        3,
        vec![bucket(0, OFPP_ANY, vec![Action::Group(8)])],
    );
    assert_eq!(code(&mut r, &chained), (et::BAD_ACTION, bac::BAD_OUT_GROUP));
    let res = gm(g::ADD, g::TYPE_ALL, 0xffff_fff0, vec![]);
    assert_eq!(
        code(&mut r, &res),
        (et::GROUP_MOD_FAILED, gmfc::INVALID_GROUP)
    );
    let m = gm(g::MODIFY, g::TYPE_ALL, 5, vec![]);
    assert_eq!(
        code(&mut r, &m),
        (et::GROUP_MOD_FAILED, gmfc::UNKNOWN_GROUP)
    );
    let c = gm(9, g::TYPE_ALL, 5, vec![]);
    assert_eq!(code(&mut r, &c), (et::GROUP_MOD_FAILED, gmfc::BAD_COMMAND));
    // Chains: 3 -> 1 is fine; modifying 1 to send to 3 is a loop.
    let to1 = gm(
        g::ADD,
        g::TYPE_INDIRECT,
        3,
        vec![bucket(0, OFPP_ANY, vec![Action::Group(1)])],
    );
    apply_group_mod(&mut r, &to1, &ports()).unwrap();
    let back = gm(
        g::MODIFY,
        g::TYPE_ALL,
        1,
        vec![bucket(0, OFPP_ANY, vec![Action::Group(3)])],
    );
    assert_eq!(code(&mut r, &back), (et::GROUP_MOD_FAILED, gmfc::LOOP));
    // A rule using group 1; out_group selects it; deleting group 1 deletes it.
    let f = fm(fc::ADD, 0, 5, vec![], vec![Action::Group(1)]);
    apply_flow_mod(&mut r, &f, &ports()).unwrap();
    // The rules that send to it (as OVS: group 3's chaining is not counted).
    assert_eq!(group_stats(&r, 1)[0].ref_count, 1);
    assert_eq!(group_stats(&r, OFPG_ALL).len(), 2);
    let n = r.len();
    apply_group_mod(&mut r, &gm(g::DELETE, 0, 1, vec![]), &ports()).unwrap();
    assert_eq!(r.len(), n - 1);
    assert!(!r.groups().contains_key(&1));
    // Deleting what does not exist is no error; OFPG_ALL deletes every group.
    apply_group_mod(&mut r, &gm(g::DELETE, 0, 77, vec![]), &ports()).unwrap();
    apply_group_mod(&mut r, &gm(g::DELETE, 0, OFPG_ALL, vec![]), &ports()).unwrap();
    assert!(r.groups().is_empty());
    assert_eq!(group_features().types, 0xf);
}

#[test]
fn flags_and_buffers_not_honoured_are_refused() {
    let mut r = BridgeRules::new();
    let mut f = fm(fc::ADD, 0, 1, vec![], vec![out(1)]);
    // SEND_FLOW_REM is accepted (the daemon sends the FLOW_REMOVED).
    f.flags = ff::SEND_FLOW_REM;
    assert!(apply_flow_mod(&mut r, &f, &ports()).is_ok());
    f.flags = 0;
    f.buffer_id = 7;
    let e = apply_flow_mod(&mut r, &f, &ports()).unwrap_err();
    assert_eq!((e.type_, e.code), (et::BAD_REQUEST, brc::BUFFER_UNKNOWN));
    assert_eq!(r.len(), 2, "the SEND_FLOW_REM rule added, nothing else");
}

fn texts(r: &BridgeRules) -> Vec<String> {
    r.rules().iter().map(|r| r.spec.to_string()).collect()
}

#[test]
fn add_modify_and_delete_follow_openflow() {
    let p = ports();
    let mut r = BridgeRules::new();
    let ip = || x(Of::EthType, 0x0800);
    let tcp80 = || vec![ip(), x(Of::IpProto, 6), x(Of::TcpDst, 80)];
    apply_flow_mod(&mut r, &fm(fc::ADD, 0, 10, tcp80(), vec![out(1)]), &p).unwrap();
    apply_flow_mod(&mut r, &fm(fc::ADD, 0, 20, vec![ip()], vec![out(2)]), &p).unwrap();
    let mut c = fm(fc::ADD, 1, 5, vec![x(Of::InPort, 1)], vec![out(2)]);
    c.cookie = 0x10;
    apply_flow_mod(&mut r, &c, &p).unwrap();
    assert_eq!(r.len(), 4);

    // CHECK_OVERLAP: same priority, overlapping match.
    let mut o = fm(fc::ADD, 0, 20, vec![ip(), x(Of::Ipv4Dst, 1)], vec![out(1)]);
    o.flags = ff::CHECK_OVERLAP;
    let e = apply_flow_mod(&mut r, &o, &p).unwrap_err();
    assert_eq!((e.type_, e.code), (et::FLOW_MOD_FAILED, fmfc::OVERLAP));
    // Disjoint (arp vs ip) is fine.
    let mut o = fm(fc::ADD, 0, 20, vec![x(Of::EthType, 0x0806)], vec![out(1)]);
    o.flags = ff::CHECK_OVERLAP;
    apply_flow_mod(&mut r, &o, &p).unwrap();
    assert_eq!(r.len(), 5);

    // Counters survive a modify unless RESET_COUNTS.
    use std::sync::atomic::Ordering::Relaxed;
    for x in r.rules() {
        x.stats.packets.store(3, Relaxed);
    }
    let m = apply_flow_mod(
        &mut r,
        &fm(fc::MODIFY, 0, 0, vec![ip()], vec![out(OFPP_FLOOD)]),
        &p,
    )
    .unwrap();
    assert_eq!(m, Applied::Modified(2), "{:?}", texts(&r));
    assert!(
        texts(&r).contains(&"priority=10,tcp,tp_dst=80 actions=FLOOD".to_string()),
        "{:?}",
        texts(&r)
    );
    assert!(r.rules().iter().all(|x| x.stats.packets.load(Relaxed) == 3));
    let mut ms = fm(fc::MODIFY_STRICT, 0, 20, vec![ip()], vec![out(1)]);
    ms.flags = ff::RESET_COUNTS;
    assert_eq!(
        apply_flow_mod(&mut r, &ms, &p).unwrap(),
        Applied::Modified(1)
    );
    let z: Vec<_> = r
        .rules()
        .iter()
        .map(|x| x.stats.packets.load(Relaxed))
        .collect();
    assert_eq!(z.iter().filter(|&&n| n == 0).count(), 1);
    // A modify that matches nothing adds nothing (1.3).
    let n = r.len();
    let none = fm(fc::MODIFY_STRICT, 0, 99, vec![ip()], vec![out(1)]);
    assert_eq!(
        apply_flow_mod(&mut r, &none, &p).unwrap(),
        Applied::Modified(0)
    );
    assert_eq!(r.len(), n);
    // A modify whose rewrite a selected rule's match cannot carry changes nothing.
    let bad = fm(
        fc::MODIFY,
        0,
        0,
        vec![],
        vec![Action::SetField(x(Of::TcpDst, 1))],
    );
    let e = apply_flow_mod(&mut r, &bad, &p).unwrap_err();
    assert_eq!((e.type_, e.code), (et::BAD_ACTION, bac::MATCH_INCONSISTENT));

    // Delete by cookie under a mask, in every table.
    let mut d = fm(fc::DELETE, OFPTT_ALL, 0, vec![], vec![]);
    d.cookie = 0x10;
    d.cookie_mask = 0xff;
    assert_eq!(apply_flow_mod(&mut r, &d, &p).unwrap(), Applied::Deleted(1));
    // Delete by out_port.
    let mut d = fm(fc::DELETE, OFPTT_ALL, 0, vec![], vec![]);
    d.out_port = 1;
    assert_eq!(
        apply_flow_mod(&mut r, &d, &p).unwrap(),
        Applied::Deleted(2),
        "{:?}",
        texts(&r)
    );
    // A group filter selects nothing (no rule has groups).
    let mut d = fm(fc::DELETE, OFPTT_ALL, 0, vec![], vec![]);
    d.out_group = 1;
    assert_eq!(apply_flow_mod(&mut r, &d, &p).unwrap(), Applied::Deleted(0));
    // Strict delete needs the priority.
    let ds = fm(fc::DELETE_STRICT, 0, 11, tcp80(), vec![]);
    assert_eq!(
        apply_flow_mod(&mut r, &ds, &p).unwrap(),
        Applied::Deleted(0)
    );
    let ds = fm(fc::DELETE_STRICT, 0, 10, tcp80(), vec![]);
    assert_eq!(
        apply_flow_mod(&mut r, &ds, &p).unwrap(),
        Applied::Deleted(1)
    );
    // A filter on a port the bridge lacks selects nothing.
    let d = fm(fc::DELETE, OFPTT_ALL, 0, vec![x(Of::InPort, 77)], vec![]);
    assert_eq!(apply_flow_mod(&mut r, &d, &p).unwrap(), Applied::Deleted(0));
    // Delete everything.
    let d = fm(fc::DELETE, OFPTT_ALL, 0, vec![], vec![]);
    assert_eq!(apply_flow_mod(&mut r, &d, &p).unwrap(), Applied::Deleted(1));
    assert!(r.is_empty());
}

#[test]
fn flow_stats_and_aggregate() {
    let p = ports();
    let mut r = BridgeRules::from_texts(&[
        "priority=5,in_port=vm1,tcp,tp_dst=22 actions=mod_vlan_vid:3,output:vm2".into(),
        "table=2,priority=1,cookie=0x7 actions=drop".into(),
    ])
    .unwrap();
    r.rules()[0]
        .stats
        .packets
        .store(4, std::sync::atomic::Ordering::Relaxed);
    r.rules()[0]
        .stats
        .bytes
        .store(400, std::sync::atomic::Ordering::Relaxed);
    let s = flow_stats(&r.rules()[0], &p);
    assert_eq!((s.priority, s.packet_count, s.byte_count), (5, 4, 400));
    assert_eq!(
        s.match_.fields,
        vec![
            x(Of::InPort, 1),
            x(Of::EthType, 0x0800),
            x(Of::IpProto, 6),
            x(Of::TcpDst, 22)
        ]
    );
    assert_eq!(
        s.instructions,
        vec![Instruction::ApplyActions(vec![
            Action::SetField(x(Of::VlanVid, 0x1003)),
            out(2)
        ])]
    );
    let s = flow_stats(&r.rules()[1], &p);
    assert_eq!((s.table_id, s.cookie), (2, 7));
    assert!(s.instructions.is_empty(), "drop has no instructions");
    let all = FlowStatsRequest {
        table_id: OFPTT_ALL,
        out_port: OFPP_ANY,
        out_group: OFPG_ANY,
        cookie: 0,
        cookie_mask: 0,
        match_: OfMatch::new(),
    };
    let a = aggregate(&r, &Selector::from_stats_request(&all, &p).unwrap());
    assert_eq!((a.flow_count, a.packet_count, a.byte_count), (2, 4, 400));
    let t2 = FlowStatsRequest {
        table_id: 2,
        ..all.clone()
    };
    let a = aggregate(&r, &Selector::from_stats_request(&t2, &p).unwrap());
    assert_eq!(a.flow_count, 1);
    let _ = &mut r;
}

/// OVS keeps each OUTPUT action's max_len and reports it in flow statistics (os-ken's switch
/// tester compares them: its actions carry OFPCML_MAX); the rule itself is the same.
#[test]
fn output_max_len_is_reported_as_installed() {
    let p = ports();
    let mut r = BridgeRules::from_texts(&[]).unwrap();
    let ml = |port: u32, max_len: u16| Action::Output { port, max_len };
    let add = fm(
        fc::ADD,
        0,
        10,
        vec![x(Of::InPort, 1)],
        vec![ml(2, 0xffe5), ml(OFPP_FLOOD, 0x80)],
    );
    apply_flow_mod(&mut r, &add, &p).unwrap();
    assert_eq!(
        texts(&r),
        ["priority=10,in_port=vm1 actions=output:vm2,FLOOD"]
    );
    let s = flow_stats(&r.rules()[0], &p);
    assert_eq!(
        s.instructions,
        vec![Instruction::ApplyActions(vec![
            ml(2, 0xffe5),
            ml(OFPP_FLOOD, 0x80)
        ])]
    );
    // A modify takes the new actions' lengths; all 0 (ovs-ofctl's) stores nothing.
    let modify = fm(fc::MODIFY, 0, 10, vec![], vec![out(1)]);
    apply_flow_mod(&mut r, &modify, &p).unwrap();
    assert!(r.rules()[0].output_max_len.is_empty());
    let s = flow_stats(&r.rules()[0], &p);
    assert_eq!(
        s.instructions,
        vec![Instruction::ApplyActions(vec![out(1)])]
    );
    // Re-adding the same rule replaces it, lengths included.
    apply_flow_mod(&mut r, &add, &p).unwrap();
    assert_eq!(r.rules()[0].output_max_len, [0xffe5, 0x80]);
    assert_eq!(r.len(), 1);
}

#[test]
fn the_meter_instruction_becomes_the_first_action_and_back() {
    let p = ports();
    let mut r = BridgeRules::new();
    let mut f = fm(fc::ADD, 0, 7, vec![x(Of::InPort, 1)], vec![out(2)]);
    // After apply-actions in the message: still metered first.
    f.instructions.push(Instruction::Meter(5));
    apply_flow_mod(&mut r, &f, &p).unwrap();
    let rule = r.rules().iter().find(|x| x.spec.priority == 7).unwrap();
    assert_eq!(rule.spec.actions[0], ActionSpec::Meter(5));
    assert_eq!(
        rule.spec.to_string(),
        "priority=7,in_port=vm1 actions=meter:5,output:vm2"
    );
    let back = instructions_to_of(&rule.spec, &p);
    assert_eq!(back[0], Instruction::Meter(5));
    assert_eq!(meters::flow_mod_meter(&f.instructions), Some(5));
    // A meter alone: metered, then dropped.
    let mut f = fm(fc::ADD, 0, 8, vec![], vec![]);
    f.instructions = vec![Instruction::Meter(6)];
    apply_flow_mod(&mut r, &f, &p).unwrap();
    let rule = r.rules().iter().find(|x| x.spec.priority == 8).unwrap();
    assert_eq!(rule.spec.actions, vec![ActionSpec::Meter(6)]);
}

#[test]
fn output_to_the_controller_is_a_controller_action_with_its_max_len() {
    let ports = ports();
    let f = fm(
        fc::ADD,
        0,
        1,
        vec![],
        vec![Action::Output {
            port: OFPP_CONTROLLER,
            max_len: 128,
        }],
    );
    let spec = rule_from_flow_mod(&f, &ports).unwrap();
    assert_eq!(
        spec.actions,
        vec![ActionSpec::Controller {
            max_len: 128,
            ext: None
        }]
    );
    assert_eq!(
        instructions_to_of(&spec, &ports),
        vec![Instruction::ApplyActions(vec![Action::Output {
            port: OFPP_CONTROLLER,
            max_len: 128
        }])]
    );
}

/// A FLOW_MOD add keeps the rules' change log (the next pipeline is the published one with
/// this rule added, not a build of every rule: bench/openflow.sh's one FLOW_MOD per barrier),
/// also when it records the OUTPUT max_len.
#[test]
fn an_add_stays_incremental() {
    let p = ports();
    let mut r = BridgeRules::from_texts(&[]).unwrap();
    r.take_changes();
    let add = fm(
        fc::ADD,
        0,
        10,
        vec![x(Of::InPort, 1)],
        vec![Action::Output {
            port: 2,
            max_len: 0xffe5,
        }],
    );
    apply_flow_mod(&mut r, &add, &p).unwrap();
    let log = r.take_changes().expect("a change log, not a full rebuild");
    assert_eq!(log.len(), 1);
    assert_eq!(r.rules()[0].output_max_len, [0xffe5]);
}

/// MPLS matches and actions map to the CLI's rules and back; what OVS refuses of them is
/// refused with its code.
#[test]
fn mpls_maps_to_the_cli_rule_and_back() {
    let mpls = x(Of::EthType, 0x8847);
    same_as_cli(
        &fm(
            fc::ADD,
            0,
            1,
            vec![
                mpls.clone(),
                x(Of::MplsLabel, 5),
                x(Of::MplsTc, 2),
                x(Of::MplsBos, 1),
            ],
            vec![
                Action::DecMplsTtl,
                Action::SetMplsTtl(9),
                Action::SetField(x(Of::MplsLabel, 7)),
                Action::SetField(x(Of::MplsTc, 3)),
                Action::PopMpls(0x0800),
                Action::SetField(x(Of::Ipv4Dst, 0x0a00_0001)),
                out(2),
            ],
        ),
        "priority=1,mpls,mpls_label=5,mpls_tc=2,mpls_bos=1 actions=dec_mpls_ttl,\
         set_mpls_ttl:9,set_field:7->mpls_label,set_field:3->mpls_tc,pop_mpls:0x0800,\
         mod_nw_dst:10.0.0.1,output:vm2",
    );
    same_as_cli(
        &fm(
            fc::ADD,
            0,
            1,
            vec![x(Of::EthType, 0x0800)],
            vec![Action::PushMpls(0x8848), out(1)],
        ),
        "priority=1,ip actions=push_mpls:0x8848,output:vm1",
    );
    // push_mpls of another Ethertype; an MPLS action on a rule that is not MPLS.
    let f = fm(fc::ADD, 0, 1, vec![], vec![Action::PushMpls(0x0800)]);
    assert_eq!(refusal(&f), (et::BAD_ACTION, bac::BAD_ARGUMENT));
    for a in [
        Action::PopMpls(0x0800),
        Action::DecMplsTtl,
        Action::SetMplsTtl(1),
        Action::SetField(x(Of::MplsLabel, 1)),
    ] {
        let f = fm(fc::ADD, 0, 1, vec![x(Of::EthType, 0x0800)], vec![a.clone()]);
        assert_eq!(
            refusal(&f),
            (et::BAD_ACTION, bac::MATCH_INCONSISTENT),
            "{a:?}"
        );
    }
    // After push_mpls an IP rewrite is inconsistent, as in OVS.
    let f = fm(
        fc::ADD,
        0,
        1,
        vec![x(Of::EthType, 0x0800)],
        vec![
            Action::PushMpls(0x8847),
            Action::SetField(x(Of::Ipv4Dst, 1)),
        ],
    );
    assert_eq!(refusal(&f), (et::BAD_ACTION, bac::MATCH_INCONSISTENT));
    // mpls_bos is read-only.
    let f = fm(
        fc::ADD,
        0,
        1,
        vec![mpls],
        vec![Action::SetField(x(Of::MplsBos, 1))],
    );
    let (t, _) = refusal(&f);
    assert_eq!(t, et::BAD_ACTION);
}

/// OVN's chassis flows beyond the registers: the register stack, clone, nw_frag, rarp, a
/// masked tun_id write, a move from a tunnel option.
#[test]
fn ovn_stack_clone_and_frag_flows_are_the_cli_rules() {
    use ferrovs_openflow::nicira::{NxMove, NxStack};
    let st = |field, ofs, nbits| NxStack { field, ofs, nbits };
    let ip = x(Of::EthType, 0x0800);
    let arp = x(Of::EthType, 0x0806);
    let f = fm(
        fc::ADD,
        27,
        50,
        vec![arp, x(Of::ArpOp, 1)],
        vec![
            Action::StackPush(st(Of::NxmEthSrc, 0, 48)),
            Action::StackPush(st(Of::Xxreg0, 96, 32)),
            Action::StackPop(st(Of::NxmEthDst, 0, 48)),
            Action::StackPop(st(Of::NxmArpTpa, 0, 32)),
            out(OFPP_IN_PORT),
        ],
    );
    same_as_cli(
        &f,
        "table=27,priority=50,arp,arp_op=1,actions=push:NXM_OF_ETH_SRC[],push:NXM_NX_XXREG0[96..127],pop:NXM_OF_ETH_DST[],pop:NXM_OF_ARP_TPA[],in_port",
    );
    let f = fm(
        fc::ADD,
        37,
        100,
        vec![x(Of::Reg15, 0x8004)],
        vec![
            Action::Clone(vec![
                Action::CtClear,
                Action::SetField(x(Of::Reg15, 1)),
                Action::Resubmit {
                    port: OFPP_IN_PORT,
                    table: Some(37),
                },
            ]),
            Action::SetField(x(Of::Reg15, 0x8004)),
            Action::Resubmit {
                port: OFPP_IN_PORT,
                table: Some(38),
            },
        ],
    );
    same_as_cli(
        &f,
        "table=37,priority=100,reg15=0x8004,actions=clone(ct_clear,load:0x1->NXM_NX_REG15[],resubmit(,37)),load:0x8004->NXM_NX_REG15[],resubmit(,38)",
    );
    let f = fm(
        fc::ADD,
        12,
        110,
        vec![ip.clone(), Oxm::masked(Of::NxIpFrag, 0, 2)],
        vec![Action::RegLoad {
            field: Of::NxTunId,
            ofs: 0,
            nbits: 24,
            value: 1,
        }],
    );
    same_as_cli(
        &f,
        "table=12,priority=110,ip,nw_frag=not_later,actions=set_field:0x1/0xffffff->tun_id",
    );
    let f = fm(
        fc::ADD,
        0,
        100,
        vec![x(Of::EthType, 0x8035), x(Of::ArpOp, 3)],
        vec![Action::RegMove(NxMove {
            src: Of::TunMetadata0,
            src_ofs: 16,
            dst: Of::Reg14,
            dst_ofs: 0,
            nbits: 15,
        })],
    );
    same_as_cli(
        &f,
        "priority=100,rarp,arp_op=3,actions=move:NXM_NX_TUN_METADATA0[16..30]->NXM_NX_REG14[0..14]",
    );
    // nw_frag goes out as OVS writes it: both bits matched is an exact match.
    let spec = ferrovs_flow::parse_flow("ip,nw_frag=later,actions=drop").unwrap();
    let m = match_to_of(&spec.m, None, &ports());
    assert!(m.fields.contains(&x(Of::NxIpFrag, 3)), "{m:?}");
}

#[test]
fn conjunctions_and_conj_id_map_to_the_cli_rule_and_back() {
    let ip = x(Of::EthType, 0x0800);
    let conj = |id, clause, n_clauses| Action::Conjunction {
        id,
        clause,
        n_clauses,
    };
    same_as_cli(
        &fm(
            fc::ADD,
            0,
            100,
            vec![ip.clone(), x(Of::Ipv4Src, 0x0a00_0001)],
            vec![conj(7, 0, 2), conj(8, 2, 3)],
        ),
        "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2),conjunction(8,3/3)",
    );
    same_as_cli(
        &fm(
            fc::ADD,
            0,
            100,
            vec![x(Of::ConjId, 7), ip.clone()],
            vec![out(2)],
        ),
        "priority=100,conj_id=7,ip actions=output:vm2",
    );
    // OVS's ofpacts_verify: a conjunction only with conjunctions, NXBAC_BAD_CONJUNCTION.
    let mixed = fm(fc::ADD, 0, 1, vec![], vec![conj(7, 0, 2), out(2)]);
    assert_eq!(
        refusal(&mixed),
        (
            et::EXPERIMENTER,
            ferrovs_openflow::error::nxbac::BAD_CONJUNCTION
        )
    );
    let nested = fm(
        fc::ADD,
        0,
        1,
        vec![],
        vec![Action::Clone(vec![conj(7, 0, 2)])],
    );
    assert_eq!(
        refusal(&nested),
        (
            et::EXPERIMENTER,
            ferrovs_openflow::error::nxbac::BAD_CONJUNCTION
        )
    );
}
