//! Parser and pipeline tests: every error class, Display ↔ parse round trips on random rules,
//! and translation against a linear reference with the megaflow property.

use std::sync::Arc;

use crate::key::{Field, FlowKey, ETH_IPV4, IP_TCP, VLAN_CFI};
use crate::pipeline::{walk_with_groups, CompiledRule, GroupStats};
use crate::reference::Linear;
use crate::spec::{parse_group, GroupSpec};
use crate::testrng::Rng;
use crate::*;

#[test]
fn parses_a_rule_like_ovs_ofctl() {
    let f = parse_flow(
        "table=1,priority=100,cookie=0x2a,idle_timeout=30,in_port=vm1,tcp,nw_dst=10.0.0.0/24,\
         tp_dst=80 actions=mod_nw_tos:8,output:vm2,goto_table:3",
    )
    .unwrap();
    assert_eq!(
        (f.table, f.priority, f.cookie, f.idle_timeout),
        (1, 100, 0x2a, 30)
    );
    assert_eq!(f.in_port.as_deref(), Some("vm1"));
    assert_eq!(f.m.field(Field::EthType), (u128::from(ETH_IPV4), 0xffff));
    assert_eq!(f.m.field(Field::IpProto), (u128::from(IP_TCP), 0xff));
    assert_eq!(f.m.field(Field::Ipv4Dst), (0x0a00_0000, 0xffff_ff00));
    assert_eq!(f.m.field(Field::TpDst), (80, 0xffff));
    assert_eq!(
        f.actions,
        vec![
            ActionSpec::SetField(Field::IpTos, 8),
            ActionSpec::Output("vm2".into()),
            ActionSpec::GotoTable(3)
        ]
    );
    // Defaults, a bare port name as output, case-insensitive keywords.
    let g = parse_flow("udp actions=NORMAL,vm3").unwrap();
    assert_eq!(g.priority, 32768);
    assert_eq!(
        g.actions,
        vec![ActionSpec::Normal, ActionSpec::Output("vm3".into())]
    );
    let d =
        parse_flow("dl_vlan=10,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00 actions=drop").unwrap();
    assert_eq!(
        d.m.field(Field::VlanTci),
        (u128::from(VLAN_CFI | 10), 0x1fff)
    );
    assert_eq!(d.m.field(Field::EthDst), (1 << 40, 1 << 40));
}

#[test]
fn every_error_is_precise() {
    let cases: &[(&str, &str)] = &[
        ("nw_dts=10.0.0.1 actions=drop", "unknown field 'nw_dts'"),
        ("ip,nw_dst=10.0.0.1", "no actions"),
        (
            "tcp,tp_dst=70000 actions=drop",
            "tp_dst: 70000 is out of range 0..=65535",
        ),
        ("nw_src=10.0.0.1 actions=drop", "nw_src requires ip or arp"),
        ("tp_dst=80 actions=drop", "tp_dst requires tcp, udp or sctp"),
        (
            "udp,tcp_dst=80 actions=drop",
            "tcp_dst requires tcp or tcp6",
        ),
        ("udp,nw_proto=6 actions=drop", "conflicting IP protocols"),
        ("icmp_type=3 actions=drop", "icmp_type requires icmp"),
        ("ipv6_src=::1 actions=drop", "ipv6_src requires ipv6"),
        (
            "ip,nw_dst=10.0.0.300 actions=drop",
            "nw_dst: '10.0.0.300' is not an IPv4 address",
        ),
        ("ip,nw_dst=10.0.0.0/33 actions=drop", "prefix length 0..=32"),
        ("dl_src=00:11:22 actions=drop", "is not a MAC address"),
        (
            "table=2 actions=goto_table:1",
            "goto_table:1 must go to a later table than 2",
        ),
        (
            "actions=goto_table:1,output:vm1",
            "goto_table must be the last action",
        ),
        ("actions=drop,output:vm1", "drop must be the only action"),
        ("actions=frobnicate:3", "unknown action 'frobnicate:3'"),
        (
            "actions=mod_nw_src:1.2.3.4",
            "mod_nw_src requires the rule to match ip",
        ),
        (
            "udp actions=set_field:1->eth_type",
            "field 'eth_type' cannot be set",
        ),
        (
            "priority=70000 actions=drop",
            "priority: 70000 is out of range",
        ),
        ("ip,nw_tos=3 actions=drop", "ECN bits"),
        ("in_port actions=drop", "in_port needs a value"),
        ("cookie=1/0xff actions=drop", "a mask is for filters"),
        ("actions=push_vlan:0x9100", "only 0x8100"),
        (
            "arp,nd_sll=00:00:00:00:00:01 actions=drop",
            "nd_sll requires icmp6,icmp_type=135",
        ),
        (
            "icmp6,icmp_type=135,nd_tll=00:00:00:00:00:01 actions=drop",
            "nd_tll requires icmp6,icmp_type=136",
        ),
        (
            "ipv6,arp_sha=00:00:00:00:00:01 actions=drop",
            "arp_sha requires arp",
        ),
        ("icmp6,nd_target=::1 actions=drop", "nd_target requires"),
        ("ip,ipv6_label=1 actions=drop", "ipv6_label requires ipv6"),
        ("arp,nw_ecn=1 actions=drop", "nw_ecn requires ip or ipv6"),
        ("ip,nw_ecn=4 actions=drop", "out of range"),
        ("ipv6,ipv6_label=0x100000 actions=drop", "out of range"),
        (
            "ip actions=set_field:1->arp_op",
            "requires the rule to match arp",
        ),
        (
            "icmp6,icmp_type=136 actions=set_field:00:00:00:00:00:01->nd_sll",
            "requires the rule to match icmp6,icmp_type=135",
        ),
        (
            "tcp actions=set_field:1->icmp_type",
            "requires the rule to match icmp",
        ),
        (
            "icmp actions=set_field:1->icmpv6_code",
            "requires the rule to match icmp6",
        ),
        (
            "arp actions=mod_nw_ecn:1",
            "requires the rule to match ip or ipv6",
        ),
        ("dl_vlan=5000 actions=drop", "out of range 0..=4095"),
        (
            "ip_frag=maybe,ip actions=drop",
            "no, yes, first, later or not_later",
        ),
        // Found by the flow fuzz target: a port name that would not print back.
        (
            "actions=output( =\u{f5}vlan_\0\u{11}Do",
            "' =\u{f5}vlan_\0\u{11}Do' is not a port name",
        ),
        ("actions=mirror:a=b", "'a=b' is not a port name"),
        ("in_port=vm(1) actions=drop", "'vm(1)' is not a port name"),
    ];
    for (rule, want) in cases {
        let e = parse_flow(rule).unwrap_err().to_string();
        assert!(e.contains(want), "{rule}: got '{e}', want '{want}'");
    }
    assert!(parse_filter("in_port=vm1 actions=drop").is_err());
    assert!(parse_filter("idle_timeout=5").is_err());
    assert_eq!(parse_filter("").unwrap(), FlowFilter::default());
    let e = parse_flows_file("# x\n\nip actions=drop\nnw_dst=1.2.3.4 actions=drop\n").unwrap_err();
    assert_eq!(e.0, 4);
}

/// A random rule in text, as a user might write it.
pub(crate) fn random_rule(r: &mut Rng, table: u8) -> String {
    let mut parts = vec![];
    if table > 0 {
        parts.push(format!("table={table}"));
    }
    parts.push(format!(
        "priority={}",
        [0, 1, 10, 100, 32768, 65535][r.below(6) as usize]
    ));
    if r.below(3) == 0 {
        parts.push(format!("cookie={:#x}", r.below(1000)));
    }
    if r.below(4) == 0 {
        parts.push(format!("idle_timeout={}", r.below(100)));
    }
    if r.below(3) == 0 {
        parts.push(format!("in_port=p{}", r.below(3)));
    }
    let proto = [
        "", "ip", "tcp", "udp", "icmp", "arp", "ipv6", "tcp6", "icmp6", "mpls", "mplsm",
    ][r.below(11) as usize];
    if !proto.is_empty() {
        parts.push(proto.into());
    }
    if r.below(3) == 0 {
        parts.push(format!("dl_dst=02:00:00:00:00:{:02x}", r.below(4)));
    }
    if table > 0 && r.below(3) == 0 {
        parts.push(format!("metadata={:#x}/0x3", r.below(4)));
    }
    // Registers: what earlier tables (or the frozen pass before a recirculation) wrote.
    if r.below(4) == 0 {
        parts.push(format!("reg{}={:#x}/0x3", r.below(3), r.below(4)));
    }
    if r.below(12) == 0 {
        parts.push(format!("xreg0={:#x}/0x300000000", r.below(4) << 32));
    }
    if r.below(4) == 0 {
        parts.push(format!("dl_vlan={}", r.below(3)));
    }
    match proto {
        "ip" | "tcp" | "udp" | "icmp" => {
            if r.below(2) == 0 {
                parts.push(format!(
                    "nw_dst=10.0.{}.0/{}",
                    r.below(4),
                    [16, 24, 32][r.below(3) as usize]
                ));
            }
            if r.below(3) == 0 {
                parts.push(format!("nw_src=10.0.0.{}", r.below(4)));
            }
        }
        "ipv6" | "tcp6" if r.below(2) == 0 => {
            parts.push(format!(
                "ipv6_dst=2001:db8::{}/{}",
                r.below(4),
                [64, 128][r.below(2) as usize]
            ));
        }
        "arp" if r.below(2) == 0 => {
            parts.push(format!("arp_op={}", 1 + r.below(2)));
            if r.below(2) == 0 {
                parts.push(format!("arp_sha=02:00:00:00:00:{:02x}", r.below(3)));
            }
            if r.below(3) == 0 {
                parts.push(format!(
                    "arp_tha=02:00:00:00:00:{:02x}/ff:ff:ff:ff:ff:fe",
                    r.below(3)
                ));
            }
        }
        "icmp6" if r.below(3) != 0 => {
            let ty = [128, 135, 136][r.below(3) as usize];
            parts.push(format!("icmp_type={ty}"));
            if ty != 128 && r.below(2) == 0 {
                parts.push(format!("nd_target=2001:db8::{}", r.below(3)));
            }
            if ty == 135 && r.below(2) == 0 {
                parts.push(format!("nd_sll=02:00:00:00:00:{:02x}", r.below(3)));
            }
            if ty == 136 && r.below(2) == 0 {
                parts.push(format!("nd_tll=02:00:00:00:00:{:02x}", r.below(3)));
            }
        }
        _ => {}
    }
    if matches!(proto, "ipv6" | "tcp6" | "icmp6") && r.below(4) == 0 {
        parts.push(format!("ipv6_label={:#x}/0xf", r.below(3)));
    }
    if matches!(proto, "ip" | "tcp" | "ipv6") && r.below(4) == 0 {
        parts.push(format!("nw_ecn={}", r.below(4)));
    }
    if matches!(proto, "tcp" | "udp" | "tcp6") && r.below(2) == 0 {
        parts.push(format!("tp_dst={}", 80 + r.below(3)));
    }
    if proto == "icmp" && r.below(2) == 0 {
        parts.push(format!("icmp_type={}", r.below(4)));
    }
    // Connection tracking's fields (what a resumed pass matches).
    if r.below(3) == 0 {
        let st = [
            "+trk",
            "-trk",
            "+trk+est",
            "+trk+new",
            "+trk-inv",
            "new|trk",
            "0x22/0x23",
        ][r.below(7) as usize];
        parts.push(format!("ct_state={st}"));
        let valid = st.contains("est") || st.contains("new") || st == "0x22/0x23";
        if valid && r.below(3) == 0 {
            parts.push(format!("ct_nw_proto={}", [6, 17][r.below(2) as usize]));
            if r.below(2) == 0 {
                parts.push(format!("ct_tp_dst={}", 79 + r.below(3)));
            }
        }
        if valid && proto == "ip" && r.below(3) == 0 {
            parts.push(format!("ct_nw_src=10.0.0.{}/31", r.below(4)));
        }
    }
    if r.below(5) == 0 {
        parts.push(format!("ct_zone={}", r.below(3)));
    }
    if r.below(5) == 0 {
        parts.push(format!("ct_mark={:#x}/0x3", r.below(4)));
    }
    if r.below(8) == 0 {
        parts.push(format!(
            "ct_label={:#x}/0xf0000000000000000000000000000001",
            r.below(2)
        ));
    }
    let mpls = proto.starts_with("mpls");
    if mpls && r.below(2) == 0 {
        parts.push(format!("mpls_label={}", r.below(3)));
    }
    if mpls && r.below(3) == 0 {
        parts.push(format!("mpls_bos={}", r.below(2)));
    }
    if mpls && r.below(4) == 0 {
        parts.push(format!("mpls_tc={}", r.below(2)));
    }
    let l4 = matches!(proto, "tcp" | "udp" | "tcp6");
    let mut actions = vec![];
    for _ in 0..1 + r.below(3) {
        let a = match r.below(18) {
            13 => format!("load:{:#x}->NXM_NX_REG{}[0..1]", r.below(4), r.below(3)),
            14 => format!("move:NXM_OF_ETH_DST[0..1]->NXM_NX_REG{}[0..1]", r.below(3)),
            15 => format!("move:NXM_NX_REG{}[0..1]->NXM_OF_ETH_SRC[8..9]", r.below(3)),
            16 => match r.below(3) {
                0 => format!("resubmit(,{})", r.below(4)),
                1 => format!("resubmit(p{},{})", r.below(4), r.below(4)),
                _ => format!("set_field:{:#x}/0x5->reg{}", r.below(8), r.below(3)),
            },
            17 => "output:NXM_NX_REG1[0..3]".to_string(),
            0 => "NORMAL".to_string(),
            1 => format!("output:p{}", r.below(3)),
            2 => "FLOOD".into(),
            3 => format!("mod_vlan_vid:{}", r.below(5)),
            4 => "strip_vlan".into(),
            5 if proto == "ip" || proto == "tcp" || proto == "udp" => {
                format!("mod_nw_dst:10.9.9.{}", r.below(4))
            }
            6 if l4 => format!("mod_tp_dst:{}", 1000 + r.below(3)),
            7 => format!("mod_dl_src:02:00:00:00:00:{:02x}", r.below(9)),
            8 => format!("mirror:p{}", r.below(3)),
            9 => format!("group:{}", 1 + r.below(5)),
            10 => "dec_ttl".into(),
            11 => match proto {
                "ip" | "tcp" | "ipv6" => format!("mod_nw_ecn:{}", r.below(4)),
                "icmp" => format!("set_field:{}->icmp_code", r.below(3)),
                "arp" => [
                    "set_field:2->arp_op",
                    "set_field:02:00:00:00:00:01->arp_tha",
                ][r.below(2) as usize]
                    .into(),
                "icmp6" if parts.iter().any(|p| p == "icmp_type=135") => {
                    format!("set_field:02:00:00:00:00:{:02x}->nd_sll", r.below(3))
                }
                "icmp6" if parts.iter().any(|p| p == "icmp_type=136") => {
                    format!("set_field:2001:db8::{}->nd_target", r.below(3))
                }
                "icmp6" | "tcp6" => format!("set_field:{:#x}->ipv6_label", r.below(3)),
                _ => "in_port".into(),
            },
            _ => "in_port".into(),
        };
        actions.push(a);
    }
    // Connection tracking among the applied actions (before any MPLS push or pop, which
    // would take away the IP match ct() requires).
    let ip = matches!(
        proto,
        "ip" | "tcp" | "udp" | "icmp" | "ipv6" | "tcp6" | "icmp6"
    );
    if r.below(2) == 0 {
        let t = r.below(5);
        let a = match r.below(7) {
            0 if ip => format!("ct(table={t})"),
            1 if ip => format!("ct(commit,zone={})", r.below(3)),
            2 if ip => format!(
                "ct(commit,table={t},exec(set_field:{}->ct_mark))",
                r.below(3)
            ),
            3 if ip => "ct(nat)".into(),
            4 if matches!(proto, "ip" | "tcp" | "udp" | "icmp") => format!(
                "ct(commit,zone=1,table={t},nat(src=10.0.0.1-10.0.0.{}:100-200))",
                2 + r.below(3)
            ),
            _ => "ct_clear".into(),
        };
        let at = r.below(actions.len() as u64 + 1) as usize;
        actions.insert(at, a);
    }
    // MPLS actions last among the applied ones (they change the Ethertype the later
    // actions' prerequisites are checked against).
    if mpls && r.below(2) == 0 {
        actions.push(match r.below(8) {
            0 => "pop_mpls:0x0800".into(),
            1 => "pop_mpls:0x86dd".into(),
            2 => "pop_mpls:0x0806".into(),
            3 => "pop_mpls:0x8847".into(),
            4 => "dec_mpls_ttl".into(),
            5 => format!("set_mpls_ttl:{}", r.below(3)),
            6 => format!("set_field:{}->mpls_label", r.below(3)),
            _ => "push_mpls:0x8847".into(),
        });
    } else if !proto.is_empty() && r.below(4) == 0 {
        actions.push(["push_mpls:0x8847", "push_mpls:0x8848"][r.below(2) as usize].into());
    }
    if r.below(5) == 0 {
        actions.push("clear_actions".into());
    }
    if r.below(4) == 0 {
        let w = match r.below(4) {
            0 => format!("output:p{}", r.below(3)),
            1 => format!("group:{}", 1 + r.below(5)),
            2 => format!(
                "mod_dl_src:02:00:00:00:00:{:02x},output:p{}",
                r.below(9),
                r.below(3)
            ),
            _ => "dec_ttl,strip_vlan".into(),
        };
        actions.push(format!("write_actions({w})"));
    }
    if r.below(4) == 0 {
        actions.push(format!("write_metadata:{:#x}/0x3", r.below(4)));
    }
    if table < 3 && r.below(3) == 0 {
        actions.push(format!("goto_table:{}", table + 1 + r.below(2) as u8));
    }
    if r.below(15) == 0 {
        actions = vec!["drop".into()];
    }
    // Conjunctive matches (crate::classifier): soft rules of conjunctions 1..=3 (2 or 3
    // clauses; few priorities so that they meet), and rules matching conj_id.
    match r.below(12) {
        0..=1 => {
            let n = 1 + r.below(2);
            actions = (0..n)
                .map(|_| {
                    let id = 1 + r.below(3);
                    let nc = 2 + (id % 2);
                    format!("conjunction({id},{}/{nc})", 1 + r.below(nc))
                })
                .collect();
            parts[usize::from(table > 0)] = format!("priority={}", [10, 100][r.below(2) as usize]);
        }
        2 => parts.push(format!("conj_id={}", 1 + r.below(4))),
        _ => {}
    }
    format!("{} actions={}", parts.join(","), actions.join(","))
}

#[test]
fn display_parses_back_to_the_same_rule() {
    let mut r = Rng::new(7);
    for i in 0..5000 {
        let text = random_rule(&mut r, (i % 4) as u8);
        let f = parse_flow(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let printed = f.to_string();
        let back = parse_flow(&printed).unwrap_or_else(|e| panic!("{printed}: {e}"));
        assert_eq!(back, f, "{text} printed as {printed}");
        assert_eq!(back.to_string(), printed);
    }
}

#[test]
fn filters_select_like_ovs_ofctl() {
    let rule =
        parse_flow("priority=5,in_port=vm1,tcp,nw_dst=10.0.0.1,tp_dst=80 actions=drop").unwrap();
    let sel = |f: &str, strict| parse_filter(f).unwrap().selects(&rule, strict);
    assert!(sel("", false));
    assert!(sel("in_port=vm1", false));
    assert!(sel("tcp", false));
    assert!(sel("ip,nw_dst=10.0.0.0/8", false));
    assert!(!sel("udp", false));
    assert!(!sel("in_port=vm2", false));
    assert!(!sel("in_port=vm1", true));
    assert!(sel(
        "priority=5,in_port=vm1,tcp,nw_dst=10.0.0.1,tp_dst=80",
        true
    ));
    assert!(!sel(
        "priority=6,in_port=vm1,tcp,nw_dst=10.0.0.1,tp_dst=80",
        true
    ));
    assert!(!sel("table=1", false));
    let c = parse_flow("cookie=0x12,priority=1 actions=drop").unwrap();
    assert!(parse_filter("cookie=0x12/-1").unwrap().selects(&c, false));
    assert!(parse_filter("cookie=0x10/0xf0").unwrap().selects(&c, false));
    assert!(!parse_filter("cookie=0x13/-1").unwrap().selects(&c, false));
}

/// Ports p0, p1, p2 are ids 10, 11, 12.
pub(crate) fn resolve(n: &str) -> Option<u32> {
    n.strip_prefix('p')
        .and_then(|x| x.parse::<u32>().ok())
        .filter(|x| *x < 3)
        .map(|x| x + 10)
}

pub(crate) fn random_key(r: &mut Rng) -> FlowKey {
    let mut k = FlowKey::default();
    k.set(Field::InPort, u128::from(10 + r.below(3) as u32));
    let (ty, proto) = [
        (0x0800, 6),
        (0x0800, 17),
        (0x0800, 1),
        (0x0806, 0),
        (0x86dd, 6),
        (0x86dd, 17),
        (0x86dd, 58),
        (0x8847, 6),
        (0x8847, 17),
        (0x8848, 6),
    ][r.below(10) as usize];
    if ty & 0xfff0 == 0x8840 {
        // The top entry; under a bottom one, the payload parsed through (any kind).
        k.set(Field::MplsLabel, u128::from(r.below(3)));
        k.set(Field::MplsTc, u128::from(r.below(2)));
        k.set(Field::MplsBos, u128::from(r.below(3) != 0));
        k.set(Field::MplsTtl, [0, 1, 2, 64][r.below(4) as usize]);
        k.set(Field::MplsPayload, u128::from(r.below(4)));
    }
    k.set(Field::EthType, ty);
    k.set(Field::IpProto, proto);
    k.set(Field::EthDst, 0x0200_0000_0000 | u128::from(r.below(5)));
    k.set(Field::EthSrc, 0x0200_0000_0100 | u128::from(r.below(5)));
    if r.below(3) == 0 {
        k.set(
            Field::VlanTci,
            u128::from(VLAN_CFI) | u128::from(r.below(3)) | (u128::from(r.below(2)) << 13),
        );
    }
    k.set(
        Field::Ipv4Dst,
        0x0a00_0000 | (u128::from(r.below(4)) << 8) | u128::from(r.below(3)),
    );
    k.set(Field::Ipv4Src, 0x0a00_0000 | u128::from(r.below(5)));
    k.set(Field::Ipv6Dst, 0x2001_0db8 << 96 | u128::from(r.below(5)));
    k.set(Field::TpDst, 79 + u128::from(r.below(4)));
    k.set(Field::TpSrc, u128::from(r.below(4)));
    k.set(Field::ArpOp, 1 + u128::from(r.below(2)));
    if ty != 0x0806 {
        k.set(Field::IpTtl, [0, 1, 2, 64][r.below(4) as usize]);
        k.set(
            Field::IpTos,
            u128::from(r.below(4)) | u128::from(r.below(2)) << 5,
        );
    }
    if proto == 58 {
        k.set(Field::TpSrc, [128, 135, 136][r.below(3) as usize]);
        k.set(Field::TpDst, u128::from(r.below(3) == 0));
        k.set(Field::NdTarget, 0x2001_0db8 << 96 | u128::from(r.below(3)));
    }
    if ty == 0x86dd {
        k.set(Field::Ipv6Flabel, u128::from(r.below(3)));
    }
    k.set(Field::ArpSha, 0x0200_0000_0000 | u128::from(r.below(3)));
    k.set(Field::ArpTha, 0x0200_0000_0000 | u128::from(r.below(3)));
    if r.below(2) == 0 {
        // A resumed pass (ids 1..=5: tables 0..=4; 300: no table), with its metadata
        // and connection-tracking fields.
        let id = [1, 2, 3, 4, 5, 300][r.below(6) as usize];
        k.set(Field::RecircId, id);
        k.set(Field::Metadata, u128::from(r.below(4)));
        for f in [Field::Reg0, Field::Reg1, Field::Reg2] {
            k.set(f, u128::from(r.below(4)) | u128::from(r.below(2)) << 30);
        }
    }
    if r.below(2) == 0 {
        k.set(
            Field::CtState,
            [0, 0x21, 0x22, 0x2a, 0x30, 0x61, 0xa2][r.below(7) as usize],
        );
        k.set(Field::CtZone, u128::from(r.below(3)));
        k.set(Field::CtMark, u128::from(r.below(4)));
        k.set(
            Field::CtLabel,
            u128::from(r.below(2)) << 127 | u128::from(r.below(2)),
        );
        k.set(Field::CtNwProto, [6, 17][r.below(2) as usize]);
        k.set(Field::CtTpDst, 79 + u128::from(r.below(4)));
        k.set(Field::CtNwSrc, 0x0a00_0000 | u128::from(r.below(4)));
    }
    k
}

/// Random groups 1..=4 (5 is never defined): every type, buckets with rewrites, outputs,
/// watched ports (p3 does not exist, p1 is down) and chains to higher groups.
fn random_groups(r: &mut Rng) -> Vec<GroupSpec> {
    let mut v = Vec::new();
    for id in 1..=4u32 {
        if r.below(5) == 0 {
            continue;
        }
        let ty = ["all", "select", "indirect", "fast_failover"][r.below(4) as usize];
        let n = if ty == "indirect" { 1 } else { 1 + r.below(3) };
        let mut text = format!("group_id={id},type={ty}");
        for _ in 0..n {
            let mut b = String::from("bucket=");
            if ty == "select" {
                b += &format!("weight:{},", r.below(4));
            }
            if ty == "fast_failover" || r.below(4) == 0 {
                b += &format!("watch_port:p{},", r.below(4));
            }
            let mut acts = Vec::new();
            for _ in 0..1 + r.below(3) {
                acts.push(match r.below(8) {
                    0 => format!("mod_dl_dst:02:00:00:00:00:{:02x}", r.below(9)),
                    1 => format!("mod_vlan_vid:{}", r.below(5)),
                    2 => "strip_vlan".into(),
                    3 => "push_vlan:0x8100".into(),
                    4 => format!("mod_nw_dst:10.9.9.{}", r.below(4)),
                    5 if id < 4 => {
                        format!("group:{}", u64::from(id) + 1 + r.below(u64::from(5 - id)))
                    }
                    6 => "dec_ttl".into(),
                    7 if r.below(2) == 0 => match r.below(5) {
                        0 => "push_mpls:0x8847".into(),
                        1 => "pop_mpls:0x0800".into(),
                        2 => "dec_mpls_ttl".into(),
                        3 => format!("set_field:{}->mpls_label", r.below(3)),
                        _ => "pop_mpls:0x8847".into(),
                    },
                    _ => format!("output:p{}", r.below(3)),
                });
            }
            b += &format!("actions={}", acts.join(","));
            text += &format!(",{b}");
        }
        v.push(parse_group(&text).unwrap_or_else(|e| panic!("{text}: {e}")));
    }
    v
}

pub(crate) fn live(port: u32) -> bool {
    port != 11
}

#[test]
fn translation_matches_a_linear_reference_and_megaflows_hold() {
    let mut r = Rng::new(99);
    let (mut keys, mut cts, mut resumed) = (0, 0, 0);
    // Register programs were exercised: resumed passes keyed on registers, translations
    // that moved packet bits into the mask through a register, resubmit loops cut off.
    let (mut reg_keyed, mut failed) = (0, 0);
    for round in 0..80 {
        let n = 1 + r.below(if round % 8 == 0 { 300 } else { 40 });
        let specs: Vec<FlowSpec> = (0..n)
            .map(|_| {
                let t = r.below(4) as u8;
                parse_flow(&random_rule(&mut r, t)).unwrap()
            })
            .collect();
        let groups = random_groups(&mut r);
        let p = Pipeline::build_with_groups(
            specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
            groups.iter().map(|g| (g, GroupStats::for_group(g))),
            &resolve,
            &live,
        );
        // The linear reference holds the same compiled rules, inserted in the same order
        // (a replaced rule keeps its place among equal priorities in both).
        let mut compiled = std::collections::HashMap::new();
        for t in 0..p.tables() {
            for (m, prio, rule) in p.table_rules(t) {
                compiled.insert((t, m, prio), rule.clone());
            }
        }
        let mut lin: Vec<Linear<Arc<CompiledRule>>> =
            (0..p.tables()).map(|_| Linear::default()).collect();
        for s in &specs {
            let mut m = s.m;
            if let Some(n) = &s.in_port {
                match resolve(n) {
                    Some(id) => m.set(Field::InPort, u128::from(id), u128::from(u32::MAX)),
                    None => continue,
                }
            }
            let t = usize::from(s.table);
            let rule = compiled[&(t, m, s.priority)].clone();
            lin[t].insert_conj(m, s.priority, rule, &crate::spec::conjunctions(&s.actions));
        }
        for _ in 0..200 {
            let k = random_key(&mut r);
            let t = p.translate(&k);
            let reference = walk_with_groups(
                &k,
                |table, key, _wc| lin.get(table).and_then(|l| l.lookup(key)).map(|(r, _)| r),
                &|g| p.group(g),
            );
            assert_eq!(t.actions, reference.actions, "round {round}");
            if t.actions
                .iter()
                .any(|a| matches!(a, DpAction::Ct(_) | DpAction::CtClear))
            {
                cts += 1;
            }
            if k.get(Field::RecircId) != 0 && !t.rules.is_empty() {
                resumed += 1;
            }
            if k.get(Field::RecircId) != 0 && t.mask.0[21..29].iter().any(|&w| w != 0) {
                reg_keyed += 1;
            }
            if t.error.is_some() {
                failed += 1;
            }
            assert_eq!(t.rules.len(), reference.rules.len());
            for (a, b) in t.rules.iter().zip(&reference.rules) {
                assert!(Arc::ptr_eq(a, b), "round {round}: another rule matched");
            }
            // Any key equal on the mask translates the same way.
            for _ in 0..4 {
                let mut k2 = random_key(&mut r);
                for i in 0..k2.0.len() {
                    k2.0[i] = (k2.0[i] & !t.mask.0[i]) | (k.0[i] & t.mask.0[i]);
                }
                if k2.get(Field::RecircId) == 0 {
                    // A first pass's metadata and registers are 0 (the mask leaves them
                    // out for that).
                    k2.set(Field::Metadata, 0);
                    for f in Field::REGS {
                        k2.set(f, 0);
                    }
                }
                let t2 = p.translate(&k2);
                assert_eq!(
                    t2.actions, t.actions,
                    "round {round}: megaflow property broken"
                );
                assert_eq!(t2.rules.len(), t.rules.len());
            }
            keys += 1;
        }
    }
    assert!(keys >= 16_000);
    // Connection tracking was exercised: ct actions emitted, resumed passes matched.
    assert!(cts > 500 && resumed > 500, "ct {cts}, resumed {resumed}");
    eprintln!("register-keyed resumed passes {reg_keyed}, failed translations {failed}");
    assert!(reg_keyed > 500 && failed > 0, "{reg_keyed} {failed}");
}

#[test]
fn translation_semantics() {
    let specs: Vec<FlowSpec> = [
        "priority=10,in_port=p0,tcp actions=mod_tp_dst:8080,output:p1,output:p0,goto_table:1",
        "table=1,priority=1 actions=mirror:p2",
        "priority=5,in_port=p1 actions=in_port",
        "priority=1,in_port=p2,udp actions=drop",
    ]
    .iter()
    .map(|s| parse_flow(s).unwrap())
    .collect();
    let p = Pipeline::build(
        specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
        &resolve,
    );
    assert!(!p.is_plain_normal());
    let mut k = FlowKey::default();
    k.set(Field::InPort, 10);
    k.set(Field::EthType, 0x0800);
    k.set(Field::IpProto, 6);
    k.set(Field::TpDst, 80);
    let t = p.translate(&k);
    // The mirror gets the packet as received: placed before the rewrite. Output to the
    // input port (p0) is skipped.
    assert_eq!(
        t.actions,
        vec![
            DpAction::Output(12),
            DpAction::SetField(Field::TpDst, 8080),
            DpAction::Output(11),
        ]
    );
    assert_eq!(t.rules.len(), 2);
    assert_eq!(t.mask.get(Field::InPort), u128::from(u32::MAX));
    k.set(Field::InPort, 11);
    assert_eq!(p.translate(&k).actions, vec![DpAction::InPort]);
    k.set(Field::InPort, 12);
    k.set(Field::IpProto, 17);
    assert!(p.translate(&k).actions.is_empty());
    // An unknown port: its rules never match; outputs to it do nothing.
    let q = Pipeline::build(
        [
            parse_flow("in_port=nope actions=NORMAL").unwrap(),
            parse_flow("priority=1 actions=output:nope,NORMAL").unwrap(),
        ]
        .iter()
        .map(|s| (s, Arc::new(RuleStats::default()))),
        &resolve,
    );
    assert_eq!(q.rule_count(), 1);
    assert_eq!(q.translate(&k).actions, vec![DpAction::Normal]);
    let n = parse_flow("priority=0 actions=NORMAL").unwrap();
    assert!(Pipeline::build([(&n, Arc::new(RuleStats::default()))], &resolve).is_plain_normal());
}

/// A pipeline changed rule by rule ([`Pipeline::insert`], [`Pipeline::remove`] on clones, as
/// the daemon does per FLOW_MOD) decides every key as one built from the same rules, and the
/// clones it came from are unchanged.
#[test]
fn incremental_changes_translate_as_a_fresh_build() {
    let mut r = Rng::new(7);
    for round in 0..40 {
        // The rules in order, as the control plane keeps them: an add of the same table,
        // match and priority replaces in place; a removal keeps the others' order.
        let mut model: Vec<(FlowSpec, Arc<RuleStats>)> = Vec::new();
        let same = |a: &FlowSpec, b: &FlowSpec| {
            a.table == b.table && a.priority == b.priority && a.in_port == b.in_port && a.m == b.m
        };
        let mut p = Pipeline::build(std::iter::empty(), &resolve);
        for step in 0..60 {
            let before = p.clone();
            let before_keys: Vec<(FlowKey, Vec<DpAction>)> = (0..20)
                .map(|_| {
                    let k = random_key(&mut r);
                    (k, before.translate(&k).actions)
                })
                .collect();
            for _ in 0..1 + r.below(4) {
                if model.is_empty() || r.below(3) != 0 {
                    let t = r.below(3) as u8;
                    let spec = parse_flow(&random_rule(&mut r, t)).unwrap();
                    let stats = Arc::new(RuleStats::default());
                    p.insert(&spec, stats.clone(), &resolve);
                    match model.iter().position(|(s, _)| same(s, &spec)) {
                        Some(i) => model[i] = (spec, stats),
                        None => model.push((spec, stats)),
                    }
                } else {
                    let i = r.below(model.len() as u64) as usize;
                    let (spec, _) = model.remove(i);
                    p.remove(&spec, &resolve);
                }
            }
            let fresh = Pipeline::build(model.iter().map(|(s, st)| (s, st.clone())), &resolve);
            assert_eq!(
                p.rule_count(),
                fresh.rule_count(),
                "round {round} step {step}"
            );
            for _ in 0..50 {
                let k = random_key(&mut r);
                let (a, b) = (p.translate(&k), fresh.translate(&k));
                assert_eq!(a.actions, b.actions, "round {round} step {step}");
                assert_eq!(a.rules.len(), b.rules.len());
                for (x, y) in a.rules.iter().zip(&b.rules) {
                    assert!(Arc::ptr_eq(x, y), "round {round} step {step}: another rule");
                }
            }
            for (k, actions) in &before_keys {
                assert_eq!(&before.translate(k).actions, actions, "a clone changed");
            }
        }
    }
}

/// Slow-path cost: nanoseconds per translation (an upcall's classifier lookups) of random
/// keys through 10 000 rules: random ones in 3 tables (many masks), and one /32 destination
/// each (one mask, as a controller's host routes). Run with
/// `cargo test --release -p ferrovs-flow bench_translate -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_translate() {
    let mut r = Rng::new(3);
    let random: Vec<FlowSpec> = (0..10_000)
        .map(|_| {
            let t = r.below(3) as u8;
            parse_flow(&random_rule(&mut r, t)).unwrap()
        })
        .collect();
    let hosts: Vec<FlowSpec> = (0..10_000u32)
        .map(|i| {
            let a = std::net::Ipv4Addr::from(0x0a00_0000 + (i % 1024) * 256 + i / 1024);
            parse_flow(&format!("priority=100,ip,nw_dst={a} actions=output:p1")).unwrap()
        })
        .collect();
    let keys: Vec<FlowKey> = (0..4096).map(|_| random_key(&mut r)).collect();
    for (name, specs) in [("random", &random), ("hosts", &hosts)] {
        let p = Pipeline::build(
            specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
            &resolve,
        );
        let mut best = f64::MAX;
        for _ in 0..30 {
            let t0 = std::time::Instant::now();
            let mut n = 0usize;
            for k in &keys {
                n += p.translate(k).actions.len();
            }
            std::hint::black_box(n);
            best = best.min(t0.elapsed().as_nanos() as f64 / keys.len() as f64);
        }
        println!("translate {name}: {best:.0} ns per key");
    }
}

/// With table counters attached, a translation carries the lookup counter of every table it
/// looked in and the match counter of those where a rule matched (OpenFlow table stats:
/// a table miss counts a lookup and no match); without them, nothing changes.
#[test]
fn translations_carry_the_counters_of_the_tables_they_looked_in() {
    let specs: Vec<FlowSpec> = [
        "priority=10,tcp actions=goto_table:2",
        "table=2,priority=5,tcp,tp_dst=80 actions=output:p1",
    ]
    .iter()
    .map(|s| parse_flow(s).unwrap())
    .collect();
    let build = || {
        Pipeline::build(
            specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
            &resolve,
        )
    };
    let counters: Vec<TableCounters> = (0..4).map(|_| TableCounters::default()).collect();
    let p = build().with_table_stats(counters.clone());
    let is = |a: &Arc<RuleStats>, b: &Arc<RuleStats>| Arc::ptr_eq(a, b);
    let mut k = FlowKey::default();
    k.set(Field::InPort, 10);
    k.set(Field::EthType, 0x0800);
    k.set(Field::IpProto, 6);
    k.set(Field::TpDst, 80);
    // Both tables matched: two rules, two lookups, two matches.
    let t = p.translate(&k);
    assert_eq!(t.rules.len(), 6);
    for c in [&counters[0], &counters[2]] {
        assert!(t.rules.iter().any(|r| is(r, &c.lookup)));
        assert!(t.rules.iter().any(|r| is(r, &c.matched)));
    }
    // Table 2 misses: its lookup counts, its match does not.
    k.set(Field::TpDst, 81);
    let t = p.translate(&k);
    assert_eq!(t.rules.len(), 4);
    assert!(t.rules.iter().any(|r| is(r, &counters[2].lookup)));
    assert!(!t.rules.iter().any(|r| is(r, &counters[2].matched)));
    // Table 0 misses.
    k.set(Field::IpProto, 17);
    let t = p.translate(&k);
    assert_eq!(t.rules.len(), 1);
    assert!(is(&t.rules[0], &counters[0].lookup));
    // No counters attached: only the rules.
    k.set(Field::IpProto, 6);
    assert_eq!(build().translate(&k).rules.len(), 1);
}

#[test]
fn controller_actions_parse_print_and_carry_their_packet_in_reason() {
    for (text, max_len) in [
        ("controller", 65535),
        ("CONTROLLER:65535", 65535),
        ("controller:128", 128),
        ("controller(max_len=64)", 64),
    ] {
        let f = parse_flow(&format!("actions={text}")).unwrap();
        assert_eq!(
            f.actions,
            vec![ActionSpec::Controller { max_len, ext: None }],
            "{text}"
        );
        let printed = f.to_string();
        assert!(
            printed.ends_with(&format!("actions=CONTROLLER:{max_len}")),
            "{printed}"
        );
        assert_eq!(parse_flow(&printed).unwrap(), f);
    }
    assert!(parse_flow("actions=controller:65536").is_err());
    let resolve = |_: &str| None;
    let k = FlowKey::default();
    // The table-miss rule (priority 0, match everything): OFPR_NO_MATCH.
    let miss = parse_flow("table=0,priority=0,cookie=0x7 actions=CONTROLLER:65535").unwrap();
    let p = Pipeline::build([(&miss, Arc::new(RuleStats::default()))], &resolve);
    assert_eq!(
        without_state(p.translate(&k).actions),
        vec![DpAction::Controller(ControllerAction {
            max_len: 65535,
            reason: REASON_NO_MATCH,
            table_id: 0,
            cookie: 7,
            ..Default::default()
        })]
    );
    // Any other rule (a priority, or a match): OFPR_ACTION, with its table and cookie; an
    // edit before it is in the packet that goes up (the action is in order).
    for text in [
        "table=0,priority=1 actions=mod_dl_src:00:00:00:00:00:01,controller:100",
        "table=0,priority=0,dl_type=0x0800 actions=mod_dl_src:00:00:00:00:00:01,controller:100",
    ] {
        let f = parse_flow(text).unwrap();
        let p = Pipeline::build([(&f, Arc::new(RuleStats::default()))], &resolve);
        let mut k = k;
        k.set(Field::EthType, 0x0800);
        assert_eq!(
            without_state(p.translate(&k).actions),
            vec![
                DpAction::SetField(Field::EthSrc, 1),
                DpAction::Controller(ControllerAction {
                    max_len: 100,
                    reason: REASON_ACTION,
                    table_id: 0,
                    cookie: 0,
                    ..Default::default()
                })
            ],
            "{text}"
        );
    }
}

pub(crate) fn pipeline_with(rules: &[&str], groups: &[&str]) -> Pipeline {
    let specs: Vec<FlowSpec> = rules.iter().map(|s| parse_flow(s).unwrap()).collect();
    let gs: Vec<GroupSpec> = groups.iter().map(|g| parse_group(g).unwrap()).collect();
    Pipeline::build_with_groups(
        specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
        gs.iter().map(|g| (g, GroupStats::for_group(g))),
        &resolve,
        &live,
    )
}

pub(crate) fn ip_key(in_port: u32, ttl: u8) -> FlowKey {
    let mut k = FlowKey::default();
    k.set(Field::InPort, u128::from(in_port));
    k.set(Field::EthType, u128::from(ETH_IPV4));
    k.set(Field::IpProto, u128::from(IP_TCP));
    k.set(Field::EthDst, 0x0200_0000_0001);
    k.set(Field::IpTtl, u128::from(ttl));
    k
}

#[test]
fn groups_parse_and_print_like_ovs_ofctl() {
    for (text, printed) in [
        (
            "group_id=1,type=all,bucket=output:p1,bucket=mod_dl_dst:02:00:00:00:00:09,output:p2",
            "group_id=1,type=all,bucket=actions=output:p1,bucket=actions=mod_dl_dst:02:00:00:00:00:09,output:p2",
        ),
        (
            "group_id=2,type=select,bucket=weight:3,actions=output:p1,bucket=output:p2",
            "group_id=2,type=select,bucket=weight:3,actions=output:p1,bucket=weight:1,actions=output:p2",
        ),
        (
            "group_id=3,type=fast_failover,bucket=watch_port:p1,output:p1,bucket=watch_port:p2,actions=output:p2",
            "group_id=3,type=fast_failover,bucket=watch_port:p1,actions=output:p1,bucket=watch_port:p2,actions=output:p2",
        ),
        (
            "group_id=4,type=indirect,bucket=actions=push_vlan:0x8100,mod_vlan_vid:7,group:1",
            "group_id=4,type=indirect,bucket=actions=push_vlan:0x8100,mod_vlan_vid:7,group:1",
        ),
    ] {
        let g = parse_group(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(g.to_string(), printed);
        assert_eq!(parse_group(printed).unwrap(), g);
    }
    for (text, want) in [
        ("type=all,bucket=output:p1", "group_id=N"),
        (
            "group_id=1,type=nope",
            "all, select, indirect or fast_failover",
        ),
        (
            "group_id=1,type=indirect,bucket=output:p1,bucket=output:p2",
            "exactly one bucket",
        ),
        (
            "group_id=1,type=fast_failover,bucket=output:p1",
            "watch_port or watch_group",
        ),
        ("group_id=1,bucket=group:1", "its own group"),
        ("group_id=1,bucket=goto_table:1", "not group buckets"),
        ("group_id=4294967040000,bucket=output:p1", "out of range"),
    ] {
        let e = parse_group(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: got '{e}', want '{want}'");
    }
}

#[test]
fn an_all_group_gives_each_bucket_the_packet_as_it_entered() {
    let p = pipeline_with(
        &["priority=1 actions=group:1,output:p2"],
        &[
            "group_id=1,type=all,bucket=mod_dl_dst:02:00:00:00:00:09,output:p1,\
           bucket=push_vlan:0x8100,mod_vlan_vid:5,output:p0",
        ],
    );
    let t = p.translate(&ip_key(12, 64));
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetField(Field::EthDst, 0x0200_0000_0009),
            DpAction::Output(11),
            DpAction::SetField(Field::EthDst, 0x0200_0000_0001),
            DpAction::PushVlan {
                tci: VLAN_CFI,
                tpid: 0x8100
            },
            DpAction::SetVlanTci { tci: VLAN_CFI | 5 },
            DpAction::Output(10),
            DpAction::PopVlan,
            // After the group the packet is as before it; output:p2 is its input port.
        ]
    );
    // rule + group + two buckets counted.
    assert_eq!(t.rules.len(), 4);
}

#[test]
fn fast_failover_select_and_ttl() {
    // p1 (11) is down: the first bucket is dead.
    let p = pipeline_with(
        &[
            "priority=1,in_port=p0 actions=group:3",
            "priority=1,in_port=p2 actions=group:2",
        ],
        &[
            "group_id=3,type=fast_failover,bucket=watch_port:p1,output:p1,bucket=watch_port:p2,output:p2",
            "group_id=2,type=select,bucket=weight:1,output:p0,bucket=weight:0,output:p1",
        ],
    );
    assert_eq!(
        p.translate(&ip_key(10, 64)).actions,
        vec![DpAction::Output(12)]
    );
    let t = p.translate(&ip_key(12, 64));
    assert_eq!(t.actions, vec![DpAction::Output(10)]);
    // The hashed fields are in the mask.
    assert_eq!(t.mask.get(Field::EthDst), Field::EthDst.full());
    assert_eq!(t.mask.get(Field::TpDst), 0xffff);
    // dec_ttl: decremented; at 1 the packet goes no further (nor the action set).
    let q = pipeline_with(
        &["ip actions=dec_ttl,output:p2,write_actions(output:p1)"],
        &[],
    );
    let t = q.translate(&ip_key(10, 64));
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetField(Field::IpTtl, 63),
            DpAction::Output(12),
            DpAction::Output(11)
        ]
    );
    assert_eq!(t.mask.get(Field::IpTtl), 0xff);
    assert!(q.translate(&ip_key(10, 1)).actions.is_empty());
}

#[test]
fn metadata_and_the_action_set() {
    let p = pipeline_with(
        &[
            "priority=1 actions=write_actions(output:p1),write_metadata:0x5/0xf,goto_table:1",
            "table=1,priority=2,metadata=0x5/0xf actions=write_actions(group:1),goto_table:2",
            "table=1,priority=1 actions=clear_actions",
            "table=2,priority=1 actions=write_actions(mod_dl_dst:02:00:00:00:00:07)",
        ],
        &["group_id=1,type=indirect,bucket=output:p2"],
    );
    let t = p.translate(&ip_key(10, 64));
    // The set: output:p1 replaced by nothing (a group in the set drops the output), the
    // rewrite before the group.
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetField(Field::EthDst, 0x0200_0000_0007),
            DpAction::Output(12),
        ]
    );
    // Metadata is internal: never in the mask.
    assert_eq!(t.mask.get(Field::Metadata), 0);
}

#[test]
fn random_groups_print_back_to_themselves() {
    let mut r = Rng::new(5);
    for _ in 0..500 {
        for g in random_groups(&mut r) {
            let text = g.to_string();
            assert_eq!(parse_group(&text).unwrap(), g, "{text}");
        }
    }
    let g = parse_group("group_id=9,type=select,bucket=weight:0,output:p1").unwrap();
    assert_eq!(g.buckets[0].weight, 0);
    assert_eq!(parse_group(&g.to_string()).unwrap(), g);
}

/// MPLS rules in ovs-ofctl's syntax: what `ovs-ofctl dump-flows` prints for them parses and
/// prints back the same; prerequisites follow the Ethertype through push/pop.
#[test]
fn mpls_rules_parse_and_print_like_ovs_ofctl() {
    for text in [
        "priority=32768,in_port=p0,mpls,mpls_label=5 actions=pop_mpls:0x0800,goto_table:1",
        "priority=32768,mpls,mpls_label=6 actions=dec_mpls_ttl,set_mpls_ttl(9),set_field:7->mpls_label,set_field:3->mpls_tc,output:p1",
        "priority=32768,mplsm,mpls_label=8,mpls_tc=2,mpls_bos=0 actions=pop_mpls:0x8847,goto_table:1",
        "priority=32768,ip actions=push_mpls:0x8847,output:p1",
        "priority=32768,arp actions=push_mpls:0x8848,set_field:12->mpls_label,output:p1",
        "priority=32768,mpls actions=pop_mpls:0x0800,mod_nw_dst:10.0.0.1,output:p1",
    ] {
        let f = parse_flow(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(f.to_string(), text);
    }
    let f = parse_flow("mpls,mpls_ttl=3 actions=set_mpls_ttl:4,set_mpls_label:9,set_mpls_tc:1")
        .unwrap();
    assert_eq!(f.m.field(Field::MplsTtl), (3, 0xff));
    assert_eq!(
        f.actions,
        vec![
            ActionSpec::SetMplsTtl(4),
            ActionSpec::SetField(Field::MplsLabel, 9),
            ActionSpec::SetField(Field::MplsTc, 1),
        ]
    );
    for (rule, want) in [
        (
            "mpls_label=5 actions=drop",
            "mpls_label requires mpls or mplsm",
        ),
        ("ip,mpls_bos=1 actions=drop", "mpls_bos requires mpls"),
        (
            "mpls,nw_dst=10.0.0.1 actions=drop",
            "nw_dst requires ip or arp",
        ),
        (
            "ip actions=pop_mpls:0x0800",
            "pop_mpls requires the rule to match mpls",
        ),
        (
            "ip actions=dec_mpls_ttl",
            "dec_mpls_ttl requires the rule to match mpls",
        ),
        (
            "actions=set_field:1->mpls_label",
            "requires the rule to match mpls",
        ),
        ("actions=push_mpls:0x0800", "must be 0x8847 or 0x8848"),
        (
            "mpls actions=set_field:1->mpls_bos",
            "'mpls_bos' cannot be set",
        ),
        (
            "mpls actions=mod_nw_dst:10.0.0.1",
            "requires the rule to match ip",
        ),
        (
            "ip actions=push_mpls:0x8847,mod_nw_dst:10.0.0.1",
            "requires the rule to match ip",
        ),
        ("mpls,mpls_label=0x100000 actions=drop", "out of range"),
    ] {
        let e = parse_flow(rule).unwrap_err().to_string();
        assert!(e.contains(want), "{rule}: got '{e}', want '{want}'");
    }
}

fn mpls_key(label: u32, bos: bool, ttl: u8, payload: u8) -> FlowKey {
    let mut k = ip_key(10, 64);
    k.set(Field::EthType, 0x8847);
    k.set(Field::MplsLabel, u128::from(label));
    k.set(Field::MplsTc, 5);
    k.set(Field::MplsBos, u128::from(bos));
    k.set(Field::MplsTtl, u128::from(ttl));
    k.set(Field::MplsPayload, u128::from(payload));
    k
}

#[test]
fn mpls_translations_follow_ovs() {
    use crate::key::{MPLS_PAYLOAD_ARP, MPLS_PAYLOAD_IPV4};
    // After pop_mpls a later table sees the inner IPv4 header (parsed through).
    let p = pipeline_with(
        &[
            "priority=10,mpls,mpls_label=5 actions=pop_mpls:0x0800,goto_table:1",
            "priority=10,mpls,mpls_label=6 actions=pop_mpls:0x0806,goto_table:1",
            "priority=10,mpls,mpls_label=8 actions=pop_mpls:0x8847,goto_table:1",
            "priority=10,mpls,mpls_label=9 actions=dec_mpls_ttl,output:p1",
            "priority=10,mpls,mpls_label=10 actions=push_mpls:0x8848,output:p1",
            "priority=10,mpls,mpls_label=11 actions=group:2",
            "table=1,priority=10,ip,nw_dst=10.0.1.2 actions=dec_ttl,output:p1",
            "table=1,priority=5,ip actions=output:p2",
            "table=1,priority=1 actions=output:p0",
        ],
        &["group_id=2,type=indirect,bucket=mod_nw_dst:10.0.0.9,output:p1"],
    );
    let mut k = mpls_key(5, true, 40, MPLS_PAYLOAD_IPV4);
    k.set(Field::Ipv4Dst, 0x0a00_0102);
    let t = p.translate(&k);
    assert_eq!(
        t.actions,
        vec![
            DpAction::PopMpls { ethertype: 0x0800 },
            DpAction::SetField(Field::IpTtl, 63),
            DpAction::Output(11),
        ]
    );
    // The megaflow: the label, the bottom bit, how the payload was parsed, the inner
    // destination and TTL (not the MPLS TTL, not the source).
    assert_eq!(t.mask.get(Field::MplsLabel), 0xfffff);
    assert_eq!(t.mask.get(Field::MplsBos), 1);
    assert_eq!(t.mask.get(Field::MplsPayload), 3);
    assert_eq!(t.mask.get(Field::Ipv4Dst), 0xffff_ffff);
    assert_eq!(t.mask.get(Field::IpTtl), 0xff);
    assert_eq!(t.mask.get(Field::MplsTtl), 0);
    assert_eq!(t.mask.get(Field::Ipv4Src), 0);
    // The payload was ARP, popped as IPv4: the key forgets the ARP fields (the frame's
    // IPv4 header is not one), so table 1's `ip` rule without nw_dst takes it.
    k.set(Field::MplsPayload, u128::from(MPLS_PAYLOAD_ARP));
    assert_eq!(
        p.translate(&k).actions,
        vec![
            DpAction::PopMpls { ethertype: 0x0800 },
            DpAction::Output(12)
        ]
    );
    // A non-bottom label popped: the new top is unknown, the translation ends at the goto.
    let k8 = mpls_key(8, false, 40, 0);
    assert_eq!(
        p.translate(&k8).actions,
        vec![DpAction::PopMpls { ethertype: 0x8847 }]
    );
    // dec_mpls_ttl: decremented; at 1 (or 0) the packet is dropped.
    assert_eq!(
        p.translate(&mpls_key(9, true, 40, 1)).actions,
        vec![DpAction::SetField(Field::MplsTtl, 39), DpAction::Output(11)]
    );
    for ttl in [0, 1] {
        let t = p.translate(&mpls_key(9, true, ttl, 1));
        assert!(t.actions.is_empty(), "{ttl}");
        assert_eq!(t.mask.get(Field::MplsTtl), 0xff);
    }
    // push_mpls on MPLS: a copy of the top entry with bos 0.
    let t = p.translate(&mpls_key(10, true, 40, 1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::PushMpls {
                ethertype: 0x8848,
                lse: 10 << 12 | 5 << 9 | 40,
            },
            DpAction::Output(11)
        ]
    );
    // No IP rewrite while the packet is MPLS (the key's IP fields are hidden; a bucket's
    // rewrite is not checked against a match, the translation skips it).
    assert_eq!(
        p.translate(&mpls_key(11, true, 40, 1)).actions,
        vec![DpAction::Output(11)]
    );

    // push_mpls on IP: label 0 (2 over IPv6), TC from the DSCP, TTL from the IP TTL (64
    // when 0 or without IP), as OVS's flow_push_mpls.
    let q = pipeline_with(&["priority=1 actions=push_mpls:0x8847,output:p1"], &[]);
    let mut k = ip_key(10, 33);
    k.set(Field::IpTos, 0xb8);
    let t = q.translate(&k);
    assert_eq!(
        t.actions[0],
        DpAction::PushMpls {
            ethertype: 0x8847,
            lse: 6 << 9 | 1 << 8 | 33
        }
    );
    assert_eq!(t.mask.get(Field::IpTtl), 0xff);
    k.set(Field::IpTtl, 0);
    k.set(Field::IpTos, 0);
    assert_eq!(
        q.translate(&k).actions[0],
        DpAction::PushMpls {
            ethertype: 0x8847,
            lse: 1 << 8 | 64
        }
    );
    k.set(Field::EthType, 0x86dd);
    k.set(Field::IpTtl, 5);
    assert_eq!(
        q.translate(&k).actions[0],
        DpAction::PushMpls {
            ethertype: 0x8847,
            lse: 2 << 12 | 1 << 8 | 5
        }
    );
    k.set(Field::EthType, 0x0806);
    let t = q.translate(&k);
    assert_eq!(
        t.actions[0],
        DpAction::PushMpls {
            ethertype: 0x8847,
            lse: 1 << 8 | 64
        }
    );
    assert_eq!(t.mask.get(Field::IpTtl), 0);
}

#[test]
fn a_bucket_that_pushes_or_pops_mpls_is_undone_for_the_next() {
    let p = pipeline_with(
        &["priority=1,mpls actions=group:1,output:p2"],
        &["group_id=1,type=all,bucket=pop_mpls:0x0800,mod_nw_dst:10.0.0.9,output:p0,bucket=push_mpls:0x8847,output:p1"],
    );
    let mut k = mpls_key(4, true, 40, crate::key::MPLS_PAYLOAD_IPV4);
    k.set(Field::InPort, 12);
    let entry = 4 << 12 | 5 << 9 | 1 << 8 | 40;
    assert_eq!(
        p.translate(&k).actions,
        vec![
            DpAction::PopMpls { ethertype: 0x0800 },
            DpAction::SetField(Field::Ipv4Dst, 0x0a00_0009),
            DpAction::Output(10),
            DpAction::SetField(Field::Ipv4Dst, k.get(Field::Ipv4Dst)),
            DpAction::PushMpls {
                ethertype: 0x8847,
                lse: entry
            },
            DpAction::PushMpls {
                ethertype: 0x8847,
                lse: entry & !0x100
            },
            DpAction::Output(11),
            DpAction::PopMpls { ethertype: 0x8847 },
        ]
    );
}

#[test]
fn group_counters_snapshot_and_restore_by_bucket() {
    use std::sync::atomic::Ordering;
    let g = parse_group("group_id=1,type=select,bucket=output:p1,bucket=output:p2").unwrap();
    let old = GroupStats::for_group(&g);
    old.group.packets.store(30, Ordering::Relaxed);
    old.group.bytes.store(3000, Ordering::Relaxed);
    old.buckets[0].packets.store(10, Ordering::Relaxed);
    old.buckets[1].bytes.store(2000, Ordering::Relaxed);
    let (group, buckets) = old.snapshot();
    assert_eq!(group, (30, 3000));
    assert_eq!(buckets, vec![(10, 0), (0, 2000)]);
    let new = GroupStats::for_group(&g);
    new.group.packets.store(1, Ordering::Relaxed);
    // A bucket the new group lacks is left out.
    new.restore(group, &[(10, 0), (0, 2000), (7, 7)]);
    assert_eq!(new.snapshot(), ((31, 3000), vec![(10, 0), (0, 2000)]));
}

/// Rules with connection tracking, each with what `ovs-ofctl -O OpenFlow13 parse-flow`
/// (Open vSwitch 3.1) prints for it: ferrovs prints the same (after its `priority=`).
#[test]
fn ct_rules_parse_and_print_like_ovs_ofctl() {
    let cases: &[(&str, &str)] = &[
        ("ct_state=+trk+est-new,ip actions=ct(commit,zone=3,table=2,nat(src=10.0.0.1-10.0.0.5:100-200),exec(set_field:1->ct_mark,set_field:0x3/0xff->ct_label))", "ct_state=-new+est+trk,ip actions=ct(commit,table=2,zone=3,nat(src=10.0.0.1-10.0.0.5:100-200),exec(set_field:0x1->ct_mark,load:0x3->NXM_NX_CT_LABEL[0..7]))"),
        ("ct_state=0x21/0x3f,ip actions=ct(table=1)", "ct_state=+new-est-rel-rpl-inv+trk,ip actions=ct(table=1)"),
        ("ct_state=0x21,ip actions=ct(zone=0)", "ct_state=new|trk,ip actions=ct()"),
        ("ct_state=new|trk,ip actions=ct()", "ct_state=new|trk,ip actions=ct()"),
        ("ct_state=trk,ip actions=ct", "ct_state=trk,ip actions=ct()"),
        ("ct_state=0,ip actions=ct(nat)", "ct_state=0,ip actions=ct(nat)"),
        ("ct_state=+trk+snat+dnat-rel-rpl-inv,ip actions=ct(commit,nat)", "ct_state=-rel-rpl-inv+trk+snat+dnat,ip actions=ct(commit,nat)"),
        ("ct_state=-new-est-rel-rpl-inv+trk-snat-dnat,ip actions=ct(commit,force,zone=0)", "ct_state=trk,ip actions=ct(commit,force)"),
        ("ct_state=0xef,ipv6 actions=ct(commit,nat(dst=[fe80::1]-[fe80::5]:80-90))", "ct_state=new|est|rel|rpl|trk|snat|dnat,ipv6 actions=ct(commit,nat(dst=[fe80::1]-[fe80::5]:80-90))"),
        ("ct_state=+trk+est,ct_label=0x1/0x1,ct_mark=5,ct_zone=0,ipv6 actions=ct(commit,nat(dst=fe80::1))", "ct_state=+est+trk,ct_zone=0,ct_mark=0x5,ct_label=0x1/0x1,ipv6 actions=ct(commit,nat(dst=fe80::1))"),
        ("ct_label=0xffffffffffffffffffffffffffffffff,ipv6 actions=ct(commit,nat(src=[fe80::1]:80))", "ct_label=0xffffffffffffffffffffffffffffffff,ipv6 actions=ct(commit,nat(src=[fe80::1]:80))"),
        ("ct_mark=0xffffffff/0xffffffff,ct_label=1/0xffffffffffffffffffffffffffffffff,ipv6 actions=ct(commit,nat(src=fe80::1-fe80::2))", "ct_mark=0xffffffff,ct_label=0x1,ipv6 actions=ct(commit,nat(src=fe80::1-fe80::2))"),
        ("ct_mark=0,ct_label=0,ip actions=ct(commit,exec(set_field:0x5/0xf0f->ct_mark,set_field:0xffffffffffffffffffffffffffffffff->ct_label))", "ct_mark=0,ct_label=0,ip actions=ct(commit,exec(load:0x5->NXM_NX_CT_MARK[0..3],load:0->NXM_NX_CT_MARK[8..11],set_field:0xffffffffffffffffffffffffffffffff->ct_label))"),
        ("ct_mark=0/0xff,ct_label=0/0xff,ip actions=ct(commit,exec(set_field:0x0/0xff00->ct_mark,set_field:0x0/0xff000000000000000000000000->ct_label))", "ct_mark=0/0xff,ct_label=0/0xff,ip actions=ct(commit,exec(load:0->NXM_NX_CT_MARK[8..15],load:0->NXM_NX_CT_LABEL[96..103]))"),
        // OVS keeps a whole-field load as written (`load:0x5->NXM_NX_CT_MARK[]`); ferrovs
        // holds the write, not its spelling, and prints it as set_field (the same action).
        ("ct_zone=65535,ip actions=ct(commit,exec(load:0x5->NXM_NX_CT_MARK[],load:1->NXM_NX_CT_LABEL[3..10]))", "ct_zone=65535,ip actions=ct(commit,exec(set_field:0x5->ct_mark,load:0x1->NXM_NX_CT_LABEL[3..10]))"),
        ("ct_state=+new,ct_nw_src=10.0.0.0/8,ip actions=ct(commit,exec(set_field:0->ct_mark))", "ct_state=+new,ct_nw_src=10.0.0.0/8,ip actions=ct(commit,exec(set_field:0->ct_mark))"),
        ("ct_state=+est,ct_nw_dst=1.2.3.4/32,ct_nw_src=10.0.0.0/255.0.255.0,ip actions=ct(table=254),output:1", "ct_state=+est,ct_nw_src=10.0.0.0/255.0.255.0,ct_nw_dst=1.2.3.4,ip actions=ct(table=254),output:1"),
        ("ct_state=+trk-inv,ct_nw_proto=6,ct_tp_src=5,ct_tp_dst=80,ip actions=ct(zone=65535,table=0)", "ct_state=-inv+trk,ct_nw_proto=6,ct_tp_src=5,ct_tp_dst=80,ip actions=ct(table=0,zone=65535)"),
        ("ct_state=+rpl,ct_nw_proto=17,ct_tp_src=5/0xff00,ipv6 actions=ct_clear,output:2", "ct_state=+rpl,ct_nw_proto=17,ct_tp_src=0x0/0xff00,ipv6 actions=ct_clear,output:2"),
        ("ct_state=+snat,ct_nw_proto=1,ct_tp_dst=0x8/0xf8 actions=ct_clear", "ct_state=+snat,ct_nw_proto=1,ct_tp_dst=0x8/0xf8 actions=ct_clear"),
        ("ip actions=ct(commit,nat(dst=10.0.0.1-10.0.0.1:80-80))", "ip actions=ct(commit,nat(dst=10.0.0.1:80))"),
        ("ip actions=ct(commit,nat(src=10.0.0.1:0))", "ip actions=ct(commit,nat(src=10.0.0.1))"),
        ("ip actions=ct(commit,exec(load:1->NXM_NX_CT_MARK[3]))", "ip actions=ct(commit,exec(load:0x1->NXM_NX_CT_MARK[3]))"),
        ("ip actions=ct(commit,exec(set_field:0x8/0x8->ct_mark))", "ip actions=ct(commit,exec(load:0x1->NXM_NX_CT_MARK[3]))"),
        ("ip actions=ct(commit,exec(set_field:0x10/0xf->ct_mark))", "ip actions=ct(commit,exec(load:0->NXM_NX_CT_MARK[0..3]))"),
        ("ip actions=ct(commit,exec(set_field:0xffffffff->ct_mark,set_field:0xffffffffffffffff0000000000000000/0xffffffffffffffff0000000000000000->ct_label))", "ip actions=ct(commit,exec(set_field:0xffffffff->ct_mark,load:0xffffffffffffffff->NXM_NX_CT_LABEL[64..127]))"),
        ("ip actions=ct(table=1,nat,commit,force,zone=7,exec(set_field:1->ct_mark))", "ip actions=ct(commit,force,table=1,zone=7,nat,exec(set_field:0x1->ct_mark))"),
        ("ip actions=ct(commit,exec(set_field:0x1/0x0->ct_mark))", "ip actions=ct(commit)"),
        ("ip actions=ct(commit,exec())", "ip actions=ct(commit)"),
        ("ip actions=CT(commit, zone=5),ct(table=1),output:2", "ip actions=ct(commit,zone=5),ct(table=1),output:2"),
        ("ip actions=ct(commit,exec(set_field:1->ct_label))", "ip actions=ct(commit,exec(set_field:0x1->ct_label))"),
        ("ip actions=ct(commit,exec(set_field:0xf0f0/0xff00ff00->ct_label))", "ip actions=ct(commit,exec(load:0xf0->NXM_NX_CT_LABEL[8..15],load:0->NXM_NX_CT_LABEL[24..31]))"),
        ("ip actions=ct_clear(),ct(commit),ct_clear", "ip actions=ct_clear,ct(commit),ct_clear"),
    ];
    for (text, ovs) in cases {
        let f = parse_flow(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let sep = if ovs.starts_with("actions=") {
            " "
        } else {
            ","
        };
        let want = format!("priority=32768{sep}{ovs}");
        assert_eq!(f.to_string(), want, "{text}");
        assert_eq!(parse_flow(&want).unwrap(), f, "{want}");
    }
    // The parsed values.
    let f = parse_flow(cases[0].0).unwrap();
    assert_eq!(f.m.field(Field::CtState), (0x22, 0x23));
    let ActionSpec::Ct(c) = &f.actions[0] else {
        panic!("{:?}", f.actions)
    };
    assert_eq!(
        **c,
        ct::CtSpec {
            commit: true,
            force: false,
            zone: 3,
            zone_src: None,
            table: Some(2),
            nat: ct::CtNat::Bind(ct::NatSpec {
                kind: ct::NatKind::Src,
                addr_min: "10.0.0.1".parse().unwrap(),
                addr_max: "10.0.0.5".parse().unwrap(),
                ports: Some((100, 200)),
            }),
            mark: Some((1, u32::MAX)),
            label: Some((3, 0xff)),
            moves: Vec::new(),
        }
    );
}

#[test]
fn ct_errors_are_precise() {
    let cases: &[(&str, &str)] = &[
        ("ct_state=+foo actions=drop", "ct_state: unknown flag 'foo'"),
        ("ct_state=+TRK actions=drop", "unknown flag 'TRK'"),
        (
            "ct_state=+trk+trk actions=drop",
            "flag 'trk' given more than once",
        ),
        (
            "ct_state=+trk-trk actions=drop",
            "flag 'trk' given more than once",
        ),
        (
            "ct_state=0x100 actions=drop",
            "ct_state: 0x100 is out of range 0..=255",
        ),
        ("ct_state=trk|bar actions=drop", "unknown flag 'bar'"),
        ("ct_state=+ actions=drop", "unknown flag ''"),
        ("ct_state=trk+new actions=drop", "unknown flag 'trk+new'"),
        ("ct_state= actions=drop", "ct_state needs a value"),
        (
            "ct_zone=65536 actions=drop",
            "ct_zone: 65536 is out of range 0..=65535",
        ),
        ("ct_zone=5/0xff actions=drop", "ct_zone cannot be masked"),
        ("ct_mark=0x100000000 actions=drop", "out of range"),
        (
            "ct_label=0x100000000000000000000000000000000 actions=drop",
            "is not a number",
        ),
        (
            "ct_nw_proto=6 actions=drop",
            "ct_nw_proto requires a ct_state implying a connection",
        ),
        (
            "ct_state=+trk,ct_nw_proto=6 actions=drop",
            "ct_nw_proto requires",
        ),
        (
            "ct_state=-inv,ct_nw_proto=6 actions=drop",
            "ct_nw_proto requires",
        ),
        (
            "ct_state=+new,ct_nw_proto=6/0xf actions=drop",
            "ct_nw_proto cannot be masked",
        ),
        (
            "ct_state=+new,ct_nw_proto=0 actions=drop",
            "ct_nw_proto=0 matches no protocol",
        ),
        (
            "ct_state=+new,ct_nw_src=10.0.0.1 actions=drop",
            "ct_nw_src requires ip and",
        ),
        (
            "ct_state=+new,ipv6,ct_nw_dst=10.0.0.1 actions=drop",
            "ct_nw_dst requires ip and",
        ),
        (
            "ct_state=+new,ip,ct_tp_dst=80 actions=drop",
            "ct_tp_dst requires ct_nw_proto",
        ),
        (
            "ct_state=+new,ct_nw_proto=6,ct_tp_src=65536 actions=drop",
            "out of range 0..=65535",
        ),
        (
            "ct_ipv6_src=::1 actions=drop",
            "unknown field 'ct_ipv6_src'",
        ),
        (
            "actions=ct(commit)",
            "ct requires the rule to match ip or ipv6",
        ),
        ("arp actions=ct", "ct requires the rule to match ip or ipv6"),
        (
            "ip actions=ct(zone=65536)",
            "ct zone: 65536 is out of range 0..=65535",
        ),
        (
            "ip actions=ct(zone=NXM_NX_REG0[0..31])",
            "a zone from a field takes exactly 16 bits",
        ),
        (
            "ip actions=ct(zone=NXM_NX_REG99[0..15])",
            "no field of that name",
        ),
        (
            "ip actions=ct(table=255)",
            "ct table: 255 is out of range 0..=254",
        ),
        ("ip actions=ct(table=x)", "ct table: 'x' is not a number"),
        ("ip actions=ct(COMMIT)", "ct: unknown argument 'COMMIT'"),
        ("ip actions=ct(force)", "ct: force requires commit"),
        (
            "ip actions=ct(alg=ftp,commit)",
            "application-layer gateways are not supported",
        ),
        (
            "ip actions=ct(exec(set_field:1->ct_mark))",
            "requires commit",
        ),
        (
            "ip actions=ct(nat(src=10.0.0.1))",
            "nat with a range requires commit",
        ),
        (
            "ip actions=ct(commit,exec(output:1))",
            "only set_field:V->ct_mark",
        ),
        (
            "ip actions=ct(commit,exec(set_field:1->ct_zone))",
            "ct_zone is read-only",
        ),
        (
            "ip actions=ct(commit,exec(set_field:1->nw_ttl))",
            "field 'nw_ttl' cannot be set here",
        ),
        (
            "ip actions=ct(commit,exec(set_field:0x100000000->ct_mark))",
            "out of range",
        ),
        (
            "ip actions=ct(commit,exec(load:0x10->NXM_NX_CT_MARK[0..3]))",
            "does not fit in 4 bits",
        ),
        (
            "ip actions=ct(commit,exec(load:1->NXM_NX_CT_MARK[0..32]))",
            "out of range 0..=31",
        ),
        (
            "ip actions=ct(commit,exec(load:1->NXM_NX_CT_MARK[5..3]))",
            "start is after its end",
        ),
        (
            "ip actions=ct(commit,exec(load:1->NXM_NX_REG0[]))",
            "'NXM_NX_REG0' cannot be loaded here",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.1-fe80::1))",
            "the addresses are of two families",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.5-10.0.0.1))",
            "the first address is above the second",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.1:90-80))",
            "the first port is above the second",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.1:0-5))",
            "a port range starts at 1",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.1:70000))",
            "out of range 0..=65535",
        ),
        (
            "ip actions=ct(commit,nat(src=fe80::1))",
            "is IPv6 but the rule matches ip",
        ),
        (
            "ipv6 actions=ct(commit,nat(dst=10.0.0.1))",
            "is IPv4 but the rule matches ipv6",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.x))",
            "is not an IPv4 or IPv6 address",
        ),
        ("ipv6 actions=ct(commit,nat(src=[fe80::1))", "no ']'"),
        (
            "ipv6 actions=ct(commit,nat(src=[fe80::1]80))",
            "expected ':PORT'",
        ),
        ("ip actions=ct(nat(src))", "requires commit"),
        (
            "ip actions=ct(commit,nat(src=10.0.0.1,random))",
            "nat flag 'random' is not supported",
        ),
        (
            "ip actions=ct(commit,nat(foo=1))",
            "nat: unknown argument 'foo=1'",
        ),
        (
            "ip actions=ct(commit,nat(src=10.0.0.1,dst=10.0.0.2))",
            "one of src= or dst=, once",
        ),
        (
            "ip actions=ct(commit,nat,nat(src=10.0.0.1))",
            "nat may be given once",
        ),
        (
            "ct_state=+inv,ip actions=ct(commit)",
            "commit in a rule that matches ct_state=+inv",
        ),
        (
            "ip actions=write_actions(ct(commit))",
            "cannot be in the action set",
        ),
        (
            "ip actions=write_actions(ct_clear)",
            "cannot be in the action set",
        ),
        ("ip actions=ct_clear:1", "unknown action 'ct_clear:1'"),
    ];
    for (text, want) in cases {
        match parse_flow(text) {
            Ok(f) => panic!("{text} parsed as {f}"),
            Err(e) => assert!(e.to_string().contains(want), "{text}: '{e}' lacks '{want}'"),
        }
    }
    // Buckets may hold connection tracking (OVN's load balancers; `lb_tests`).
    for b in ["ct(commit)", "ct_clear"] {
        let g = parse_group(&format!("group_id=1,type=all,bucket=actions={b}")).unwrap();
        assert_eq!(parse_group(&g.to_string()).unwrap(), g, "{b}");
    }
}

/// A key of a resumed pass: recirculation id of table `t`, metadata and ct_state.
pub(crate) fn resumed(mut k: FlowKey, t: u8, metadata: u64, ct_state: u8) -> FlowKey {
    k.set(Field::RecircId, u128::from(ct::recirc_id(t)));
    k.set(Field::Metadata, u128::from(metadata));
    k.set(Field::CtState, u128::from(ct_state));
    k
}

#[test]
fn ct_translation_recirculates_and_megaflows_hold() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=write_actions(output:p2),write_metadata:0x5,goto_table:1",
            "table=1,priority=10,ip,ct_state=-trk actions=ct(zone=3,table=2),output:p1",
            "table=1,priority=5 actions=output:p0",
            "table=2,priority=10,ip,ct_state=+trk+est,metadata=0x5 actions=output:p2",
            "table=2,priority=5,ip,ct_state=+trk+new actions=ct(commit,zone=3,exec(set_field:0x7->ct_mark)),output:p0",
            "table=2,priority=20,ip,ct_mark=0x7 actions=ct_clear,goto_table:3",
            "table=3,priority=10,ct_state=-trk actions=output:p1",
            "table=3,priority=5 actions=drop",
        ],
        &[],
    );
    let k = ip_key(13, 64);
    // First pass: tracked in zone 3, to resume in table 2 with the metadata reached; the
    // rule's later output and the pending action set are not executed.
    let t = p.translate(&k);
    let want = ct::CtAction {
        zone: 3,
        commit: false,
        force: false,
        nat: ct::CtNat::Off,
        mark: None,
        label: None,
        recirc: Some(2),
        metadata: 5,
        regs: [0; 8],
    };
    assert_eq!(t.actions, vec![DpAction::Ct(Arc::new(want))]);
    assert_eq!(t.mask.get(Field::RecircId), Field::RecircId.full());
    assert_eq!(t.mask.get(Field::CtState), u128::from(ct::state::TRK));
    assert_eq!(t.mask.get(Field::Metadata), 0);
    // Second pass, established: table 2 on the metadata the key carries.
    let k2 = resumed(k, 2, 5, ct::state::TRK | ct::state::EST);
    let t2 = p.translate(&k2);
    assert_eq!(t2.actions, vec![DpAction::Output(12)]);
    assert_eq!(t2.mask.get(Field::RecircId), Field::RecircId.full());
    assert_eq!(t2.mask.get(Field::Metadata), u128::from(u64::MAX));
    assert_ne!(t2.mask.get(Field::CtState), 0);
    // ... with other metadata: no rule of table 2 matches.
    assert!(p
        .translate(&resumed(k, 2, 6, ct::state::TRK | ct::state::EST))
        .actions
        .is_empty());
    // New: committed (no table: the translation goes on), then out.
    let t3 = p.translate(&resumed(k, 2, 5, ct::state::TRK | ct::state::NEW));
    let commit = ct::CtAction {
        zone: 3,
        commit: true,
        force: false,
        nat: ct::CtNat::Off,
        mark: Some((7, u32::MAX)),
        label: None,
        recirc: None,
        metadata: 5,
        regs: [0; 8],
    };
    assert_eq!(
        t3.actions,
        vec![DpAction::Ct(Arc::new(commit)), DpAction::Output(10)]
    );
    // ct_clear: the later lookup sees an untracked packet.
    let mut k4 = resumed(k, 2, 5, ct::state::TRK | ct::state::EST);
    k4.set(Field::CtMark, 7);
    let t4 = p.translate(&k4);
    assert_eq!(t4.actions, vec![DpAction::CtClear, DpAction::Output(11)]);
    // The same key bits on the first pass are another megaflow: table 0's.
    let mut k5 = k4;
    k5.set(Field::RecircId, 0);
    k5.set(Field::Metadata, 0);
    assert_eq!(
        p.translate(&k5).actions,
        vec![DpAction::Output(10), DpAction::Output(12)]
    );
    // A recirculation id no ct(table=T) gives: dropped.
    let mut k6 = k2;
    k6.set(Field::RecircId, 300);
    let t6 = p.translate(&k6);
    assert!(t6.actions.is_empty());
    assert_eq!(t6.mask.get(Field::RecircId), Field::RecircId.full());
}

#[test]
fn ct_in_a_bucket_is_skipped() {
    // The rule syntax refuses ct in a bucket; a group built another way (OpenFlow) with
    // one skips it, the bucket's other actions run.
    let g = GroupSpec {
        id: 1,
        ty: crate::spec::GroupType::All,
        buckets: vec![crate::spec::BucketSpec {
            actions: vec![
                ActionSpec::Ct(Box::new(ct::CtSpec {
                    table: Some(1),
                    ..Default::default()
                })),
                ActionSpec::CtClear,
                ActionSpec::Output("p1".into()),
            ],
            ..parse_group("group_id=1,type=all,bucket=actions=output:p1")
                .unwrap()
                .buckets[0]
                .clone()
        }],
        selection_method: None,
        selection_param: 0,
    };
    let spec = parse_flow("ip actions=group:1,output:p2").unwrap();
    let p = Pipeline::build_with_groups(
        [(&spec, Arc::new(RuleStats::default()))],
        [(&g, GroupStats::for_group(&g))],
        &resolve,
        &live,
    );
    let t = p.translate(&ip_key(13, 64));
    assert_eq!(t.actions, vec![DpAction::Output(11), DpAction::Output(12)]);
}

/// The `flow` fuzz target's seeds (fuzz/seeds/flow, connection tracking's rules) are rules
/// that parse and print back, so the fuzzer starts from valid syntax.
#[test]
fn fuzz_seeds_are_rules() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/flow");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/seeds/flow") {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let f = parse_flow(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(parse_flow(&f.to_string()).unwrap(), f, "{}", path.display());
        n += 1;
    }
    assert!(n >= 30);
}

/// A random mask: none, all, a prefix or random bits of `full`.
fn random_mask(r: &mut Rng, full: u128) -> u128 {
    match r.below(4) {
        0 => full,
        1 => full & !(full >> (1 + r.below(u64::from(full.count_ones())))),
        2 => r.next128() & full,
        _ => 0,
    }
}

/// A random rule exercising every part of the ct syntax (only what OVS and ferrovs both
/// accept and print alike: see docs/conntrack.md for what differs).
fn random_ct_rule(r: &mut Rng) -> String {
    let proto = ["ip", "ipv6", "tcp", "udp6"][r.below(4) as usize];
    let v4 = !proto.ends_with('6');
    let mut parts = vec![];
    let sm = random_mask(r, 0xff);
    let sv = r.next128() & sm;
    if sm != 0 {
        parts.push(format!("ct_state={sv:#x}/{sm:#x}"));
    }
    if r.below(3) == 0 {
        parts.push(format!("ct_zone={}", r.below(65536)));
    }
    if r.below(3) == 0 {
        let m = random_mask(r, 0xffff_ffff);
        parts.push(format!("ct_mark={:#x}/{m:#x}", r.next128() & 0xffff_ffff));
    }
    if r.below(4) == 0 {
        let m = random_mask(r, u128::MAX);
        parts.push(format!("ct_label={:#x}/{m:#x}", r.next128()));
    }
    let valid = {
        let (v, m) = (sv as u8, sm as u8);
        v & 0xcf != 0 || (v & 0x20 != 0 && m & 0x10 != 0 && v & 0x10 == 0)
    };
    if valid && v4 && r.below(2) == 0 {
        let a = std::net::Ipv4Addr::from(r.next() as u32);
        parts.push(format!("ct_nw_src={a}/{}", r.below(33)));
    }
    if valid && v4 && r.below(3) == 0 {
        parts.push(format!(
            "ct_nw_dst={}",
            std::net::Ipv4Addr::from(r.next() as u32)
        ));
    }
    if valid && r.below(2) == 0 {
        parts.push(format!("ct_nw_proto={}", 1 + r.below(255)));
        for f in ["ct_tp_src", "ct_tp_dst"] {
            if r.below(2) == 0 {
                let m = random_mask(r, 0xffff);
                parts.push(format!("{f}={:#x}/{m:#x}", r.below(65536)));
            }
        }
    }
    parts.push(proto.into());
    let mut actions = vec![];
    for _ in 0..1 + r.below(3) {
        if r.below(4) == 0 {
            actions.push("ct_clear".to_string());
            continue;
        }
        let mut a = vec![];
        let commit = r.below(2) == 0 && sv & 0x10 == 0;
        if commit {
            a.push("commit".to_string());
            if r.below(3) == 0 {
                a.push("force".into());
            }
        }
        if r.below(3) == 0 {
            a.push(format!("table={}", r.below(255)));
        }
        if r.below(2) == 0 {
            a.push(format!("zone={}", r.below(65536)));
        }
        match r.below(3) {
            0 => a.push("nat".into()),
            1 if commit => {
                let kind = ["src", "dst"][r.below(2) as usize];
                let (lo, hi) = if v4 {
                    let x = r.next() as u32;
                    let y = x.saturating_add(r.below(3) as u32);
                    (
                        std::net::Ipv4Addr::from(x).to_string(),
                        std::net::Ipv4Addr::from(y).to_string(),
                    )
                } else {
                    let x = r.next128();
                    let y = x.saturating_add(u128::from(r.below(3)));
                    (
                        format!("[{}]", std::net::Ipv6Addr::from(x)),
                        format!("[{}]", std::net::Ipv6Addr::from(y)),
                    )
                };
                let ports = match r.below(3) {
                    0 => String::new(),
                    _ => {
                        let p = 1 + r.below(65535);
                        let q = p + r.below(65536 - p);
                        format!(":{p}-{q}")
                    }
                };
                a.push(format!("nat({kind}={lo}-{hi}{ports})"));
            }
            _ => {}
        }
        if commit && r.below(2) == 0 {
            let mut ex = vec![];
            let m = random_mask(r, 0xffff_ffff);
            if m != 0xffff_ffff || r.below(2) == 0 {
                ex.push(format!("set_field:{:#x}/{m:#x}->ct_mark", r.next() as u32));
            }
            if r.below(2) == 0 {
                let m = random_mask(r, u128::MAX);
                ex.push(format!("set_field:{:#x}/{m:#x}->ct_label", r.next128()));
            }
            a.push(format!("exec({})", ex.join(",")));
        }
        actions.push(format!("ct({})", a.join(",")));
    }
    if r.below(2) == 0 {
        actions.push("output:1".into());
    }
    format!("{} actions={}", parts.join(","), actions.join(","))
}

/// Random ct rules through the real `ovs-ofctl parse-flow` (Open vSwitch's own parser and
/// printer, which print as `dump-flows` does): ferrovs prints what it prints. Skipped when
/// ovs-ofctl is not installed (a failure under `CI=true`).
#[test]
fn ct_rules_print_as_the_real_ovs_ofctl() {
    let have = std::process::Command::new("ovs-ofctl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "ovs-ofctl is not installed"
        );
        eprintln!("skipped: ovs-ofctl is not installed");
        return;
    }
    let mut r = Rng::new(19);
    for _ in 0..300 {
        let text = random_ct_rule(&mut r);
        let ours = parse_flow(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let out = std::process::Command::new("ovs-ofctl")
            .args(["-O", "OpenFlow13", "parse-flow", &text])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ovs = stdout
            .lines()
            .find_map(|l| l.split_once("ADD ").map(|(_, x)| x.to_string()))
            .unwrap_or_else(|| {
                panic!(
                    "{text}: ovs-ofctl refused it: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        let sep = if ovs.starts_with("actions=") {
            " "
        } else {
            ","
        };
        assert_eq!(
            ours.to_string(),
            format!("priority=32768{sep}{ovs}"),
            "{text}"
        );
        assert_eq!(parse_flow(&ours.to_string()).unwrap(), ours);
    }
}

#[test]
fn ct_without_a_table_goes_on_with_the_state_from_before() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=ct(zone=1,nat),mirror:p0,goto_table:1",
            "table=1,priority=10,ct_state=-trk actions=output:p1",
            "table=1,priority=5,ct_state=+trk actions=output:p2",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    let ct = ct::CtAction {
        zone: 1,
        commit: false,
        force: false,
        nat: ct::CtNat::Apply,
        mark: None,
        label: None,
        recirc: None,
        metadata: 0,
        regs: [0; 8],
    };
    // The mirror gets the packet as received (NAT may have rewritten it); the later lookup
    // sees the key's ct_state as it was (untracked), as OVS.
    assert_eq!(
        t.actions,
        vec![
            DpAction::Output(10),
            DpAction::Ct(Arc::new(ct)),
            DpAction::Output(11)
        ]
    );
    assert_eq!(t.mask.get(Field::RecircId), Field::RecircId.full());
}

/// `tun_metadata0..3` as OVN uses them: matched, set (as tunnel metadata, not a header
/// edit), restored after a group bucket, printed and parsed back.
#[test]
fn tun_metadata_matches_sets_and_prints() {
    let rule = "priority=5,in_port=p0,tun_id=0x7b,tun_metadata0=0x10002/0x7fff7fff \
                actions=set_field:0x30004->tun_metadata0,set_field:0x5->tun_metadata3,output:p1";
    let spec = parse_flow(rule).unwrap();
    let printed = spec.to_string();
    assert!(
        printed.contains("tun_metadata0=0x10002/0x7fff7fff"),
        "{printed}"
    );
    assert!(
        printed.contains("set_field:0x30004->tun_metadata0"),
        "{printed}"
    );
    assert_eq!(parse_flow(&printed).unwrap(), spec);
    let p = pipeline_with(&[rule], &[]);
    let mut k = ip_key(10, 64);
    k.set(Field::TunId, 0x7b);
    k.set(Field::TunMetadata0, 0x8001_0002);
    let t = p.translate(&k);
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetTunnelMetadata {
                index: 0,
                value: 0x30004
            },
            DpAction::SetTunnelMetadata { index: 3, value: 5 },
            DpAction::Output(11),
        ]
    );
    assert_eq!(t.mask.get(Field::TunMetadata0), 0x7fff_7fff);
    // Another value under the mask: no match.
    k.set(Field::TunMetadata0, 0x0001_0003);
    assert!(p.translate(&k).actions.is_empty());
    // A bucket that sets one is undone after it (as any field).
    let p = pipeline_with(
        &["priority=1 actions=group:1,output:p2"],
        &["group_id=1,type=all,bucket=set_field:0x9->tun_metadata1,output:p1"],
    );
    let t = p.translate(&ip_key(12, 64));
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetTunnelMetadata { index: 1, value: 9 },
            DpAction::Output(11),
            DpAction::SetTunnelMetadata { index: 1, value: 0 },
        ]
    );
    // Beyond 32 bits: refused.
    assert!(parse_flow("tun_metadata0=0x100000000 actions=drop").is_err());
    assert!(parse_flow("actions=set_field:0x100000000->tun_metadata2").is_err());
    assert!(parse_flow("tun_metadata4=1 actions=drop").is_err());
}

/// `actions` with the controller actions' pipeline state left out.
fn without_state(actions: Vec<DpAction>) -> Vec<DpAction> {
    actions
        .into_iter()
        .map(|a| match a {
            DpAction::Controller(mut c) => {
                c.at = None;
                DpAction::Controller(c)
            }
            a => a,
        })
        .collect()
}
