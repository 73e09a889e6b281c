//! What OVN's chassis flows need beyond the registers: the register stack (`push`/`pop`),
//! `clone(...)`, `nw_frag` and `rarp` matches, `ct`'s `exec(move:...->ct_label)` and
//! `nat(src)` without a range: their syntax as ovs-ofctl prints it, their translation, and
//! the megaflow masks.

use std::sync::atomic::Ordering::Relaxed;

use crate::ct::{CtNat, NatKind};
use crate::key::{Field, FlowKey, SubField, ETH_ARP, ETH_IPV4, ETH_RARP, FRAG_ANY, FRAG_LATER};
use crate::tests::{ip_key, pipeline_with, resumed};
use crate::*;

#[test]
fn ovn_rules_parse_and_print_like_ovs_ofctl() {
    for (text, printed) in [
        // OVN's ARP responder (table 27 of scenario 2), whole.
        (
            "table=27,priority=50,arp,arp_tpa=10.0.0.1,arp_op=1,metadata=0x2 actions=push:NXM_NX_REG0[],push:NXM_NX_XXREG0[],push:NXM_OF_ETH_SRC[],push:NXM_OF_ARP_SPA[],push:NXM_NX_ARP_SHA[],pop:NXM_NX_ARP_THA[],pop:NXM_OF_ARP_TPA[],pop:NXM_OF_ETH_DST[],pop:NXM_NX_XXREG0[],pop:NXM_NX_REG0[],resubmit(,28)",
            "table=27,priority=50,arp,arp_tpa=10.0.0.1,arp_op=1,metadata=0x2 actions=push:NXM_NX_REG0[],push:NXM_NX_XXREG0[],push:NXM_OF_ETH_SRC[],push:NXM_OF_ARP_SPA[],push:NXM_NX_ARP_SHA[],pop:NXM_NX_ARP_THA[],pop:NXM_OF_ARP_TPA[],pop:NXM_OF_ETH_DST[],pop:NXM_NX_XXREG0[],pop:NXM_NX_REG0[],resubmit(,28)",
        ),
        (
            "table=8,priority=110,in_port=p0 actions=push:NXM_OF_IN_PORT[],load:0->NXM_OF_IN_PORT[],resubmit(,40),pop:NXM_OF_IN_PORT[]",
            "table=8,priority=110,in_port=p0 actions=push:NXM_OF_IN_PORT[],load:0->NXM_OF_IN_PORT[],resubmit(,40),pop:NXM_OF_IN_PORT[]",
        ),
        (
            "table=37,priority=100,reg15=0x8004,metadata=0x1 actions=clone(set_field:0x1->reg15,resubmit(,37)),set_field:0x8004->reg15,resubmit(,37)",
            "table=37,priority=100,metadata=0x1,reg15=0x8004 actions=clone(load:0x1->NXM_NX_REG15[],resubmit(,37)),load:0x8004->NXM_NX_REG15[],resubmit(,37)",
        ),
        (
            "table=40,priority=100,reg15=0x3,metadata=0x1 actions=clone(ct_clear,set_field:0->reg11,set_field:0x3->metadata,set_field:0x1->reg14,resubmit(,8))",
            "table=40,priority=100,metadata=0x1,reg15=0x3 actions=clone(ct_clear,load:0->NXM_NX_REG11[],load:0x3->OXM_OF_METADATA[],load:0x1->NXM_NX_REG14[],resubmit(,8))",
        ),
        (
            "table=12,priority=110,ip,metadata=0x1,nw_frag=not_later actions=resubmit(,13)",
            "table=12,priority=110,ip,ip_frag=not_later,metadata=0x1 actions=resubmit(,13)",
        ),
        (
            "table=0,priority=100,rarp,arp_op=3,dl_src=0a:00:00:00:ff:01 actions=drop",
            "priority=100,rarp,dl_src=0a:00:00:00:ff:01,arp_op=3 actions=drop",
        ),
        (
            "table=20,priority=100,ip actions=ct(commit,zone=NXM_NX_REG13[0..15],nat(src),exec(set_field:0/0x1->ct_mark,move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127])),resubmit(,27)",
            "table=20,priority=100,ip actions=ct(commit,zone=NXM_NX_REG13[0..15],nat(src),exec(load:0->NXM_NX_CT_MARK[0],move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127])),resubmit(,27)",
        ),
        (
            "table=10,priority=100,reg14=0x1 actions=move:NXM_NX_TUN_METADATA0[16..30]->NXM_NX_REG14[0..14],set_field:0x1/0xffffff->tun_id",
            "table=10,priority=100,reg14=0x1 actions=move:NXM_NX_TUN_METADATA0[16..30]->NXM_NX_REG14[0..14],load:0x1->NXM_NX_TUN_ID[0..23]",
        ),
    ] {
        let f = parse_flow(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(f.to_string(), printed, "{text}");
        assert_eq!(parse_flow(&f.to_string()).unwrap(), f, "{text}");
    }
    let f = parse_flow("ip,actions=ct(commit,nat(dst))").unwrap();
    let ActionSpec::Ct(c) = &f.actions[0] else {
        panic!()
    };
    assert_eq!(c.nat, CtNat::Kind(NatKind::Dst));
    for (bad, why) in [
        ("actions=pop:NXM_OF_ETH_TYPE[]", "read-only"),
        (
            "actions=push:NXM_OF_IP_SRC[]",
            "requires the rule to match ip",
        ),
        ("actions=push:NXM_NX_REG0[32]", "not within"),
        ("actions=clone(goto_table:3)", "instruction"),
        (
            "actions=write_actions(push:NXM_NX_REG0[])",
            "cannot be in the action set",
        ),
        ("ip,actions=ct(nat(src))", "requires commit"),
        (
            "ip,actions=ct(commit,exec(move:NXM_NX_REG0[]->NXM_NX_REG1[]))",
            "NXM_NX_CT_MARK or NXM_NX_CT_LABEL only",
        ),
        (
            "ip,actions=ct(exec(move:NXM_NX_REG0[]->NXM_NX_CT_MARK[]))",
            "requires commit",
        ),
    ] {
        let e = parse_flow(bad).expect_err(bad).to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

fn arp_key(in_port: u32) -> FlowKey {
    let mut k = FlowKey::default();
    k.set(Field::InPort, u128::from(in_port));
    k.set(Field::EthType, u128::from(ETH_ARP));
    k.set(Field::EthSrc, 0x0200_0000_0001);
    k.set(Field::EthDst, 0xffff_ffff_ffff);
    k.set(Field::ArpOp, 1);
    k.set(Field::Ipv4Src, 0x0a00_0002);
    k.set(Field::Ipv4Dst, 0x0a00_0001);
    k.set(Field::ArpSha, 0x0200_0000_0001);
    k
}

#[test]
fn push_and_pop_swap_fields_as_ovns_arp_responder() {
    // OVN's ARP reply: swap the addresses through the stack, then answer out of the port.
    let p = pipeline_with(
        &[
            "priority=50,arp,arp_op=1 actions=push:NXM_OF_ETH_SRC[],push:NXM_OF_ARP_SPA[],push:NXM_NX_ARP_SHA[],load:0x2->NXM_OF_ARP_OP[],mod_dl_src:0a:00:00:00:00:01,set_field:0a:00:00:00:00:01->arp_sha,set_field:10.0.0.1->arp_spa,pop:NXM_NX_ARP_THA[],pop:NXM_OF_ARP_TPA[],pop:NXM_OF_ETH_DST[],in_port",
        ],
        &[],
    );
    let t = p.translate(&arp_key(10));
    assert_eq!(t.stack_errors, 0);
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetField(Field::ArpOp, 2),
            DpAction::SetField(Field::EthSrc, 0x0a00_0000_0001),
            DpAction::SetField(Field::ArpSha, 0x0a00_0000_0001),
            DpAction::SetField(Field::Ipv4Src, 0x0a00_0001),
            DpAction::SetField(Field::ArpTha, 0x0200_0000_0001),
            DpAction::SetField(Field::Ipv4Dst, 0x0a00_0002),
            DpAction::SetField(Field::EthDst, 0x0200_0000_0001),
            DpAction::InPort,
        ]
    );
    // The values pushed were read: their fields are in the megaflow (another sender is
    // another answer).
    assert_eq!(t.mask.get(Field::EthSrc), Field::EthSrc.full());
    assert_eq!(t.mask.get(Field::Ipv4Src), Field::Ipv4Src.full());
    assert_eq!(t.mask.get(Field::ArpSha), Field::ArpSha.full());
}

#[test]
fn the_stack_lives_across_resubmits_and_a_pop_of_nothing_is_counted() {
    let p = pipeline_with(
        &[
            // Push in table 0, pop in table 1 (the stack is the translation's), pop again
            // on the empty stack (nothing happens), then output by the popped register.
            "priority=10 actions=load:0xb->NXM_NX_REG1[],push:NXM_NX_REG1[0..15],load:0->NXM_NX_REG1[],resubmit(,1),output:NXM_NX_REG2[]",
            "table=1,priority=10 actions=pop:NXM_NX_REG2[0..7],pop:NXM_NX_REG3[]",
        ],
        &[],
    );
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.actions, vec![DpAction::Output(11)]);
    assert_eq!(t.stack_errors, 1);
    assert_eq!(p.xlate_counters().stack_errors.load(Relaxed), 1);
    // A first pass's megaflow holds no register bit.
    for w in crate::key::REG_WORD..crate::key::REG_WORD + 8 {
        assert_eq!(t.mask.0[w], 0);
    }
    // A 128-bit value: popped into a narrower subfield, its low bits.
    let p = pipeline_with(
        &[
            "priority=10 actions=load:0x1122334455667788->NXM_NX_XXREG1[0..63],load:0x99->NXM_NX_XXREG1[120..127],push:NXM_NX_XXREG1[],pop:NXM_NX_REG0[8..23],resubmit(,1)",
            "table=1,priority=10,reg0=0x778800 actions=output:p2",
        ],
        &[],
    );
    assert_eq!(
        p.translate(&ip_key(10, 64)).actions,
        vec![DpAction::Output(12)]
    );
}

#[test]
fn clone_runs_on_a_copy_and_what_follows_sees_the_packet_as_before() {
    // OVN's table 37 for a multicast group: each member through a clone, registers set
    // back after it; packet edits inside the clone are undone for what follows.
    let p = pipeline_with(
        &[
            "priority=10 actions=load:0x5->NXM_NX_REG15[],clone(load:0x1->NXM_NX_REG15[],mod_dl_dst:02:00:00:00:00:77,push:NXM_NX_REG15[],resubmit(,37)),resubmit(,37),pop:NXM_NX_REG4[],resubmit(,38)",
            "table=37,priority=10,reg15=0x1 actions=output:p1",
            "table=37,priority=10,reg15=0x5 actions=output:p2",
            "table=38,priority=10,reg4=0 actions=output:p0",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetField(Field::EthDst, 0x0200_0000_0077),
            DpAction::Output(11),
            DpAction::SetField(Field::EthDst, 0x0200_0000_0001),
            DpAction::Output(12),
            DpAction::Output(10),
        ]
    );
    // The restore depends on eth_dst's value: it is in the mask.
    assert_eq!(t.mask.get(Field::EthDst), Field::EthDst.full());
    // The clone's push did not survive it: the pop after it found an empty stack.
    assert_eq!(t.stack_errors, 1);
}

#[test]
fn a_clone_that_recirculates_takes_the_packet_with_it() {
    // OVN's switch-to-router hop: clone(ct_clear, registers, resubmit into the router's
    // pipeline), which reaches a ct(table=T).
    let p = pipeline_with(
        &[
            "priority=10,ip actions=clone(ct_clear,load:0x3->OXM_OF_METADATA[],resubmit(,8)),output:p2",
            "table=8,priority=10,ip,metadata=0x3 actions=ct(zone=7,table=9)",
            "table=9,priority=10,ip,metadata=0x3,ct_state=+trk actions=output:p1",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    let [DpAction::CtClear, DpAction::Ct(c)] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    assert_eq!((c.zone, c.recirc, c.metadata), (7, Some(9), 3));
    // The resumed pass carries the clone's metadata.
    let r = p.translate(&resumed(ip_key(13, 64), 9, 3, 0x20));
    assert_eq!(r.actions, vec![DpAction::Output(11)]);
}

#[test]
fn nw_frag_and_rarp_match_what_the_key_extracts() {
    let p = pipeline_with(
        &[
            "priority=20,ip,nw_frag=not_later actions=output:p1",
            "priority=10,ip actions=output:p2",
            "priority=30,rarp,arp_op=3 actions=output:p0",
        ],
        &[],
    );
    let mut k = ip_key(13, 64);
    assert_eq!(p.translate(&k).actions, vec![DpAction::Output(11)]);
    k.set(Field::IpFrag, u128::from(FRAG_ANY));
    assert_eq!(p.translate(&k).actions, vec![DpAction::Output(11)]);
    k.set(Field::IpFrag, u128::from(FRAG_ANY | FRAG_LATER));
    let t = p.translate(&k);
    assert_eq!(t.actions, vec![DpAction::Output(12)]);
    assert_ne!(t.mask.get(Field::IpFrag) & u128::from(FRAG_LATER), 0);
    // A RARP request (opcode 3) from its frame.
    let mut f = vec![0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x0a, 0, 0, 0, 0xff, 1]);
    f[12..14].copy_from_slice(&ETH_RARP.to_be_bytes());
    f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]);
    let rk = FlowKey::extract(&f, 13, None);
    assert_eq!(rk.get(Field::ArpOp), 3);
    assert_eq!(p.translate(&rk).actions, vec![DpAction::Output(10)]);
    let _ = ETH_IPV4;
}

#[test]
fn ct_exec_move_writes_the_label_from_the_key() {
    let p = pipeline_with(
        &["priority=10,ip actions=load:0xabcd->NXM_NX_XXREG0[0..31],ct(commit,zone=5,nat(src),exec(set_field:0/0x1->ct_mark,move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127]))"],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    let [DpAction::Ct(c)] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    assert_eq!(c.mark, Some((0, 1)));
    assert_eq!(c.label, Some((0xabcd << 96, 0xffff_ffffu128 << 96)));
    assert_eq!(c.nat, CtNat::Kind(NatKind::Src));
    let sf = SubField::new(Field::Xxreg0, 0, 32).unwrap();
    assert_eq!(sf.get(&FlowKey::default()), 0);
}
