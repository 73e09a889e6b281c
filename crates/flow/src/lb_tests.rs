//! OVN's load balancer in the pipeline: a select group whose buckets are
//! `ct(commit,table=T,zone=REG,nat(dst=BACKEND))` (what ovn-controller 23.03 makes of
//! `ct_lb_mark`), run as a rule's `ct` would be.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use crate::ct::{CtNat, NatKind};
use crate::key::{Field, FlowKey};
use crate::pipeline::DpAction;
use crate::spec::parse_group;
use crate::tests::{ip_key, pipeline_with};

/// OVN 23.03's group for VIP 10.0.0.100:80 over two backends (as `ovs-ofctl dump-groups`
/// prints it, without the 1.5 bucket ids and selection method).
const LB_GROUP: &str = "group_id=1,type=select,\
bucket=weight:100,actions=ct(commit,table=15,zone=NXM_NX_REG13[0..15],nat(dst=10.0.2.21:8080),exec(load:0x1->NXM_NX_CT_MARK[1])),\
bucket=weight:100,actions=ct(commit,table=15,zone=NXM_NX_REG13[0..15],nat(dst=10.0.2.22:8080),exec(load:0x1->NXM_NX_CT_MARK[1]))";

fn tcp_key(src_port: u16) -> FlowKey {
    let mut k = ip_key(10, 64);
    k.set(
        Field::Ipv4Src,
        u128::from(u32::from(Ipv4Addr::new(10, 0, 1, 11))),
    );
    k.set(
        Field::Ipv4Dst,
        u128::from(u32::from(Ipv4Addr::new(10, 0, 0, 100))),
    );
    k.set(Field::TpSrc, u128::from(src_port));
    k.set(Field::TpDst, 80);
    k
}

/// The backend a translation's ct action sends to, and that action's recirculation table,
/// zone and mark.
fn backend(actions: &[DpAction]) -> (IpAddr, Option<u8>, u16, Option<(u32, u32)>) {
    match actions {
        [DpAction::Ct(c)] => match c.nat {
            CtNat::Bind(n) => {
                assert_eq!(n.kind, NatKind::Dst);
                assert_eq!(n.ports, Some((8080, 8080)));
                (n.addr_min, c.recirc, c.zone, c.mark)
            }
            other => panic!("nat {other:?}"),
        },
        other => panic!("actions {other:?}"),
    }
}

#[test]
fn a_select_bucket_with_ct_recirculates_and_sticks_to_the_connection() {
    // The rule's actions after the group are not run: the pass ends at the bucket's ct.
    let p = pipeline_with(
        &["ip actions=set_field:0x7->reg13,group:1,output:p2"],
        &[LB_GROUP],
    );
    let mut seen = HashSet::new();
    for port in 40000..40064u16 {
        let t = p.translate(&tcp_key(port));
        let (addr, recirc, zone, mark) = backend(&t.actions);
        assert_eq!(recirc, Some(15));
        assert_eq!(zone, 7, "the zone from reg13 as the bucket reached it");
        assert_eq!(mark, Some((2, 2)));
        seen.insert(addr);
        // Same connection, same backend (and the decision's fields are in the mask).
        assert_eq!(backend(&p.translate(&tcp_key(port)).actions).0, addr);
        assert_eq!(t.mask.get(Field::TpSrc), 0xffff);
        assert_eq!(t.mask.get(Field::Ipv4Dst), Field::Ipv4Dst.full());
        // The registers are frozen with the packet (a first pass's are 0 on input and
        // functions of bits in the mask, so they leave it).
        let c = match &t.actions[..] {
            [DpAction::Ct(c)] => c,
            _ => unreachable!(),
        };
        assert_eq!(c.regs[6] & 0xffff_ffff, 7, "reg13 is the low half of xreg6");
    }
    assert_eq!(seen.len(), 2, "64 connections over both backends");
}

#[test]
fn ct_without_table_in_a_bucket_goes_on_and_an_all_groups_bucket_skips_ct() {
    let p = pipeline_with(
        &[
            "priority=2,tcp,tp_src=1 actions=group:2,output:p2",
            "priority=1,ip actions=group:3,output:p2",
        ],
        &[
            "group_id=2,type=indirect,bucket=ct(commit,zone=3)",
            "group_id=3,type=all,bucket=ct(commit,table=4),output:p1",
        ],
    );
    let t = p.translate(&tcp_key(1));
    assert!(
        matches!(&t.actions[..], [DpAction::Ct(c), DpAction::Output(12)] if c.zone == 3 && c.recirc.is_none())
    );
    // The all group's bucket runs on a copy: its ct is skipped, the rest of it runs.
    let t = p.translate(&tcp_key(2));
    assert_eq!(t.actions, vec![DpAction::Output(11), DpAction::Output(12)]);
}

#[test]
fn an_ovn_lb_group_prints_back_to_itself() {
    let g = parse_group(LB_GROUP).unwrap();
    assert_eq!(g.to_string(), LB_GROUP);
}

/// OVN 23.03's hairpin learning for VIP 10.0.0.100:80 (table 68 → 69), as ovs-ofctl
/// prints it.
const HAIRPIN_LEARN: &str = "table=68,priority=100,ct_mark=0x2/0x2,tcp,nw_src=10.0.2.21,nw_dst=10.0.2.21,tp_dst=8080 actions=load:0x1->NXM_NX_REG10[7],learn(table=69,delete_learned,cookie=0x5e3b7d9e,OXM_OF_METADATA[],eth_type=0x800,NXM_OF_IP_SRC[],ip_dst=10.0.0.100,nw_proto=6,NXM_OF_TCP_SRC[]=NXM_OF_TCP_DST[],load:0x1->NXM_NX_REG10[7])";

#[test]
fn ovns_learn_parses_and_prints_as_ovs() {
    let f = crate::parse_flow(HAIRPIN_LEARN).unwrap();
    assert_eq!(f.to_string(), HAIRPIN_LEARN);
    let back = crate::parse_flow(&f.to_string()).unwrap();
    assert_eq!(back, f);
    // Other forms, as ovs-ofctl prints them.
    for (text, want) in [
        (
            "actions=learn(table=1,priority=10,idle_timeout=5,hard_timeout=7,fin_idle_timeout=1,fin_hard_timeout=2,send_flow_rem,limit=9,NXM_NX_REG0[0..11],NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[],output:NXM_OF_IN_PORT[])",
            "priority=32768 actions=learn(table=1,idle_timeout=5,hard_timeout=7,fin_idle_timeout=1,fin_hard_timeout=2,priority=10,send_flow_rem,limit=9,NXM_NX_REG0[0..11],NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[],output:NXM_OF_IN_PORT[])",
        ),
        (
            "ip actions=learn(table=2,dl_type=0x800,nw_dst=10.0.0.1,NXM_OF_IP_SRC[]=NXM_OF_IP_DST[],load:NXM_OF_IP_SRC[]->NXM_NX_REG1[],NXM_NX_REG2[3..4]=0x2)",
            "priority=32768,ip actions=learn(table=2,eth_type=0x800,ip_dst=10.0.0.1,NXM_OF_IP_SRC[]=NXM_OF_IP_DST[],load:NXM_OF_IP_SRC[]->NXM_NX_REG1[],NXM_NX_REG2[3..4]=0x2)",
        ),
    ] {
        let f = crate::parse_flow(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(f.to_string(), want);
        assert_eq!(crate::parse_flow(want).unwrap(), f);
    }
}

#[test]
fn hostile_learn_specs_are_refused() {
    for (text, want) in [
        ("ip actions=learn(table=255,NXM_NX_REG0[])", "table id 255"),
        (
            "ip actions=learn(NXM_NX_REG0[0..3]=NXM_NX_REG1[0..4])",
            "bit widths",
        ),
        (
            "ip actions=learn(load:0x10->NXM_NX_REG0[0..3])",
            "does not fit into 4 bits",
        ),
        ("ip actions=learn(load:0x1)", "missing `->'"),
        ("ip actions=learn(foo)", "unknown keyword"),
        ("ip actions=learn(NXM_NX_REG0[40])", "not within"),
        // The learned rule's prerequisites: ip_src needs eth_type first.
        ("ip actions=learn(NXM_OF_IP_SRC[])", "must first match"),
        // The source's prerequisites: tcp_dst needs a tcp rule.
        (
            "ip actions=learn(eth_type=0x800,nw_proto=6,NXM_OF_TCP_SRC[]=NXM_OF_TCP_DST[])",
            "requires",
        ),
        ("ip actions=learn(load:0x1->NXM_OF_ETH_TYPE[])", "read-only"),
        (
            "ip actions=learn(output:NXM_NX_XXREG0[])",
            "at most 32 bits",
        ),
    ] {
        match crate::parse_flow(text) {
            Ok(f) => panic!("{text} parsed as {f}"),
            Err(e) => assert!(e.to_string().contains(want), "{text}: '{e}' lacks '{want}'"),
        }
    }
    let many: Vec<String> = (0..65).map(|_| "NXM_NX_REG0[]".to_string()).collect();
    let e = crate::parse_flow(&format!("actions=learn({})", many.join(","))).unwrap_err();
    assert!(e.to_string().contains("more than 64"), "{e}");
}

#[test]
fn learn_lists_the_rule_a_packet_teaches_and_masks_its_sources() {
    let p = pipeline_with(
        &[
            "ip actions=set_field:0x5->metadata,resubmit(,68)",
            HAIRPIN_LEARN,
        ],
        &[],
    );
    let mut k = ip_key(10, 64);
    k.set(
        Field::Ipv4Src,
        u128::from(u32::from(Ipv4Addr::new(10, 0, 2, 21))),
    );
    k.set(
        Field::Ipv4Dst,
        u128::from(u32::from(Ipv4Addr::new(10, 0, 2, 21))),
    );
    k.set(Field::TpSrc, 33333);
    k.set(Field::TpDst, 8080);
    k.set(Field::CtMark, 2);
    let t = p.translate(&k);
    let [l] = &t.learned[..] else {
        panic!("{:?}", t.learned)
    };
    assert_eq!((l.table, l.priority, l.cookie), (69, 32768, 0x5e3b_7d9e));
    let m = &l.m;
    assert_eq!(m.field(Field::Metadata), (5, u128::from(u64::MAX)));
    assert_eq!(m.field(Field::EthType), (0x800, 0xffff));
    assert_eq!(
        m.field(Field::Ipv4Src).0,
        u128::from(u32::from(Ipv4Addr::new(10, 0, 2, 21)))
    );
    assert_eq!(
        m.field(Field::Ipv4Dst).0,
        u128::from(u32::from(Ipv4Addr::new(10, 0, 0, 100)))
    );
    assert_eq!(m.field(Field::IpProto), (6, 0xff));
    assert_eq!(m.field(Field::TpSrc), (8080, 0xffff));
    assert_eq!(m.field(Field::TpDst).1, 0);
    assert_eq!(l.loads, vec![(Field::Reg10, 0x80, 0x80)]);
    assert_eq!(l.origin.map(|o| (o.0, o.1)), Some((68, 100)));
    // The sources are in the mask; the client's port is not a source.
    assert_eq!(t.mask.get(Field::Ipv4Src), Field::Ipv4Src.full());
    assert_eq!(t.mask.get(Field::TpDst), 0xffff);
    // A translation that fails learns nothing; one that does not reach the rule neither.
    k.set(Field::CtMark, 0);
    assert!(p.translate(&k).learned.is_empty());
}
