//! Registers, `load`/`move`, `resubmit`, `output:REG` and a zone from a register: their
//! syntax as ovs-ofctl writes it, OVN-shaped multi-table programs, OVS's resubmit limits,
//! the megaflow masks (no register bit on a first pass) and registers across a `ct()`
//! recirculation.

use std::sync::atomic::Ordering::Relaxed;

use crate::key::{Field, FlowKey, SubField, REG_WORD};
use crate::pipeline::{PortNumbers, XlateError, MAX_RESUBMITS};
use crate::tests::{ip_key, pipeline_with, resumed};
use crate::*;

#[test]
fn register_rules_parse_and_print_like_ovs_ofctl() {
    for (text, printed) in [
        (
            "table=0,priority=100,in_port=p0 actions=load:0x5->NXM_NX_REG14[],load:0x1->NXM_NX_REG10[7],resubmit(,8)",
            "priority=100,in_port=p0 actions=load:0x5->NXM_NX_REG14[],load:0x1->NXM_NX_REG10[7],resubmit(,8)",
        ),
        (
            "table=8,reg14=0x5,metadata=0x1 actions=move:NXM_NX_REG14[]->NXM_NX_REG15[],resubmit(,37)",
            "table=8,priority=32768,metadata=0x1,reg14=0x5 actions=move:NXM_NX_REG14[]->NXM_NX_REG15[],resubmit(,37)",
        ),
        (
            "reg0=1/1,xreg1=0x500000006,xxreg1=0x10/0xff actions=drop",
            "priority=32768,reg0=0x1/0x1,reg2=0x5,reg3=0x6,reg7=0x10/0xff actions=drop",
        ),
        (
            "ip,actions=ct(table=10,zone=NXM_NX_REG13[0..15])",
            "priority=32768,ip actions=ct(table=10,zone=NXM_NX_REG13[0..15])",
        ),
        (
            "table=37,reg15=2 actions=output:NXM_NX_REG15[]",
            "table=37,priority=32768,reg15=0x2 actions=output:NXM_NX_REG15[]",
        ),
        (
            "arp,actions=move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]",
            "priority=32768,arp actions=move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]",
        ),
        (
            "actions=set_field:0x5/0xff->reg3,set_field:0x8->xxreg2,set_field:0x9/0x9->reg1",
            "priority=32768 actions=load:0x5->NXM_NX_REG3[0..7],load:0x8->NXM_NX_XXREG2[],set_field:0x9/0x9->reg1",
        ),
        (
            "actions=load:0->NXM_OF_IN_PORT[],load:0x1->OXM_OF_METADATA[],resubmit:p1,resubmit(p2,3)",
            "priority=32768 actions=load:0->NXM_OF_IN_PORT[],load:0x1->OXM_OF_METADATA[],resubmit:p1,resubmit(p2,3)",
        ),
        (
            "ip,actions=move:NXM_OF_IP_SRC[]->NXM_NX_XXREG0[96..127],move:NXM_NX_REG0[0..15]->NXM_OF_ETH_DST[0..15]",
            "priority=32768,ip actions=move:NXM_OF_IP_SRC[]->NXM_NX_XXREG0[96..127],move:NXM_NX_REG0[0..15]->NXM_OF_ETH_DST[0..15]",
        ),
    ] {
        let f = parse_flow(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(f.to_string(), printed, "{text}");
        assert_eq!(parse_flow(&f.to_string()).unwrap(), f, "{text}");
    }
    // xxreg0's high 32 bits are reg0, xreg0's low ones reg1.
    let f = parse_flow("actions=move:NXM_NX_XXREG0[96..127]->NXM_NX_REG1[]").unwrap();
    let ActionSpec::Move { src, .. } = f.actions[0] else {
        panic!()
    };
    let mut k = FlowKey::default();
    k.set(Field::Reg0, 0xdead_beef);
    assert_eq!(src.get(&k), 0xdead_beef);
    k.set(Field::Xreg0, 0x1_0000_0002);
    assert_eq!((k.get(Field::Reg0), k.get(Field::Reg1)), (1, 2));
    assert_eq!(k.get(Field::Xxreg0) >> 64, 0x1_0000_0002);
    for (bad, why) in [
        ("actions=load:0x100->NXM_NX_REG0[0..7]", "does not fit"),
        (
            "actions=move:NXM_NX_REG0[]->NXM_NX_REG1[0..15]",
            "the source has 32 bits",
        ),
        ("actions=load:1->NXM_OF_ETH_TYPE[]", "read-only"),
        ("actions=move:NXM_NX_REG0[]->NXM_NX_CT_MARK[]", "read-only"),
        (
            "actions=move:NXM_OF_IP_SRC[]->NXM_NX_REG0[]",
            "requires the rule to match ip",
        ),
        (
            "actions=load:1->NXM_OF_TCP_DST[]",
            "requires the rule to match tcp",
        ),
        ("actions=resubmit(,)", "needs a port or a table"),
        ("actions=resubmit(,1,ct)", "not supported"),
        ("actions=load:1->NXM_NX_REG0[32]", "not within"),
        ("actions=load:1->NXM_NX_REG16[]", "no field of that name"),
        ("actions=output:NXM_NX_XXREG0[]", "at most 32 bits"),
        ("ip,actions=ct(zone=NXM_NX_REG13[0..7])", "exactly 16 bits"),
        ("actions=set_field:0/0->reg0", "writes nothing"),
        (
            "actions=write_actions(resubmit(,1))",
            "cannot be in the action set",
        ),
    ] {
        let e = parse_flow(bad).expect_err(bad).to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert!(matches!(
        parse_flow("reg16=1 actions=drop"),
        Err(ParseError::UnknownField(_))
    ));
    assert!(matches!(
        parse_flow("reg1 actions=drop"),
        Err(ParseError::NoValue(_))
    ));
}

/// An OVN-shaped program: table 0 classifies the input port into logical registers and
/// metadata and resubmits to the ingress pipeline, which decides the logical output port;
/// the output tables map it to a port through `output:reg15` or a plain output.
fn ovn_like() -> Pipeline {
    pipeline_with(
        &[
            "table=0,priority=100,in_port=p0 actions=load:0x1->NXM_NX_REG14[],load:0x7->OXM_OF_METADATA[],resubmit(,8)",
            "table=0,priority=100,in_port=p1 actions=load:0x2->NXM_NX_REG14[],load:0x7->OXM_OF_METADATA[],resubmit(,8),output:p2",
            "table=8,priority=50,metadata=0x7,reg14=0x1 actions=load:0x2->NXM_NX_REG15[],resubmit(,9)",
            "table=8,priority=50,metadata=0x7,reg14=0x2 actions=move:NXM_OF_ETH_DST[0..7]->NXM_NX_REG15[0..7],resubmit(,9)",
            "table=9,priority=10,metadata=0x7 actions=resubmit(,37)",
            "table=37,priority=100,reg15=0x2 actions=load:0xb->NXM_NX_REG0[],output:NXM_NX_REG0[]",
            "table=37,priority=50 actions=output:NXM_NX_REG15[0..7]",
        ],
        &[],
    )
}

#[test]
fn an_ovn_like_program_translates_and_its_megaflow_has_no_register() {
    let p = ovn_like();
    // p0 (10): reg14=1 → reg15=2 → table 37 → reg0=11 → out on 11 (the ids are the numbers).
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.actions, vec![DpAction::Output(11)]);
    assert_eq!(t.error, None);
    for w in REG_WORD..REG_WORD + 8 {
        assert_eq!(
            t.mask.0[w], 0,
            "a first pass's megaflow matches no register"
        );
    }
    assert_eq!(t.mask.get(Field::Metadata), 0);
    assert_eq!(t.mask.get(Field::InPort), u128::from(u32::MAX));
    // p1 (11): reg15 from eth_dst's low byte (0x01): out on port 1; then, after the
    // resubmit returned, its own output:p2. The eth_dst bits moved are in the mask.
    let t = p.translate(&ip_key(11, 64));
    assert_eq!(t.actions, vec![DpAction::Output(1), DpAction::Output(12)]);
    assert_eq!(t.mask.get(Field::EthDst), 0xff);
    // Another eth_dst: another port, and the megaflow of the first does not cover it.
    let mut k = ip_key(11, 64);
    k.set(Field::EthDst, 0x0200_0000_0005);
    assert_eq!(
        p.translate(&k).actions,
        vec![DpAction::Output(5), DpAction::Output(12)]
    );
    // The rules' counters: every rule the packet went through.
    assert_eq!(p.translate(&ip_key(10, 64)).rules.len(), 4);
}

#[test]
fn output_reg_and_in_port_loads_use_openflow_port_numbers() {
    let mut p = ovn_like();
    // OpenFlow numbers 1, 2, 11 are datapath ports 10, 11, 12.
    p.set_port_numbers(PortNumbers::new([(1, 10), (2, 11), (11, 12)]));
    assert_eq!(
        p.translate(&ip_key(10, 64)).actions,
        vec![DpAction::Output(12)]
    );
    // From p1: reg15 = 1 from eth_dst's low byte, OpenFlow port 1: datapath port 10.
    let mut k = ip_key(10, 64);
    k.set(Field::InPort, 11);
    assert_eq!(
        p.translate(&k).actions,
        vec![DpAction::Output(10), DpAction::Output(12)]
    );
    // A number no port has: nothing.
    k.set(Field::EthDst, 0x0200_0000_0009);
    assert_eq!(p.translate(&k).actions, vec![DpAction::Output(12)]);
    // in_port as OpenFlow sees it: moved into a register, its number; loaded with 0, no
    // port (so an output to the real input port is done, OVN's hairpin trick).
    let mut p = pipeline_with(
        &[
            "priority=10 actions=move:NXM_OF_IN_PORT[]->NXM_NX_REG3[0..15],resubmit(,1)",
            "table=1,priority=10,reg3=0x2 actions=load:0->NXM_OF_IN_PORT[],output:p1",
        ],
        &[],
    );
    p.set_port_numbers(PortNumbers::new([(1, 10), (2, 11)]));
    let t = p.translate(&ip_key(11, 64));
    // The datapath's InPort: its Output never goes back out of the input port.
    assert_eq!(t.actions, vec![DpAction::InPort]);
    assert_eq!(t.mask.get(Field::InPort), u128::from(u32::MAX));
    assert!(p.translate(&ip_key(10, 64)).actions.is_empty());
}

#[test]
fn resubmit_runs_the_rule_found_and_comes_back() {
    let p = pipeline_with(
        &[
            // A resubmit to an earlier table, with another in_port, then the rest.
            "table=0,priority=10,in_port=p0 actions=resubmit(,2),output:p2",
            "table=2,priority=10 actions=load:0x3->NXM_NX_REG5[],resubmit(p1,1),output:p0",
            "table=1,priority=10,in_port=p1,reg5=0x3 actions=mod_dl_src:02:00:00:00:00:99,output:p0",
            "table=1,priority=5 actions=output:p1",
            // A table miss in a resubmit: nothing, the caller goes on.
            "table=0,priority=10,in_port=p1 actions=resubmit(,200),output:p2",
            // goto_table inside a resubmitted rule, then back.
            "table=0,priority=10,in_port=p2 actions=resubmit(,3),output:p0",
            "table=3,priority=10 actions=write_actions(output:p1),goto_table:4",
            "table=4,priority=10 actions=output:p1",
        ],
        &[],
    );
    // Table 1 sees in_port p1 (output to p0, the real input, is then allowed), the key as
    // the resubmitted rule left it; after it, in_port is p0 again (output:p0 skipped).
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetField(Field::EthSrc, 0x0200_0000_0099),
            DpAction::InPort,
            DpAction::Output(12)
        ]
    );
    assert_eq!(
        p.translate(&ip_key(11, 64)).actions,
        vec![DpAction::Output(12)]
    );
    // The action set written in a resubmitted table runs when the whole pipeline ends.
    assert_eq!(
        p.translate(&ip_key(12, 64)).actions,
        vec![
            DpAction::Output(11),
            DpAction::Output(10),
            DpAction::Output(11)
        ]
    );
}

#[test]
fn resubmit_limits_drop_the_packet_and_count() {
    // A loop: 64 nested resubmits, then the translation fails and the packet is dropped
    // (what the rules before emitted is not done).
    let p = pipeline_with(&["priority=10 actions=output:p1,resubmit(,0)"], &[]);
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.error, Some(XlateError::TooDeep));
    assert!(t.actions.is_empty());
    assert_eq!(p.xlate_counters().too_deep.load(Relaxed), 1);
    // A tree: two resubmits per table over 13 tables is 16383 table visits, past 4096.
    let mut rules: Vec<String> = (0..13)
        .map(|t| {
            format!(
                "table={t},priority=1 actions=resubmit(,{n}),resubmit(,{n})",
                n = t + 1
            )
        })
        .collect();
    rules.push("table=13,priority=1 actions=output:p1".into());
    let refs: Vec<&str> = rules.iter().map(String::as_str).collect();
    let p = pipeline_with(&refs, &[]);
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.error, Some(XlateError::TooManyResubmits));
    assert!(t.actions.is_empty());
    assert_eq!(p.xlate_counters().too_many.load(Relaxed), 1);
    // Below the limits, the same shape works: 2^11 outputs over 12 tables.
    let mut rules: Vec<String> = (0..11)
        .map(|t| {
            format!(
                "table={t},priority=1 actions=resubmit(,{n}),resubmit(,{n})",
                n = t + 1
            )
        })
        .collect();
    rules.push("table=11,priority=1 actions=output:p1".into());
    let refs: Vec<&str> = rules.iter().map(String::as_str).collect();
    let t = pipeline_with(&refs, &[]).translate(&ip_key(10, 64));
    assert_eq!(t.error, None);
    assert_eq!(t.actions.len(), 2048);
    assert_eq!(MAX_RESUBMITS, 4096);
}

#[test]
fn registers_survive_a_ct_recirculation_and_key_the_resumed_megaflow() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=load:0x42->NXM_NX_REG0[],load:0x5->NXM_NX_REG13[0..15],move:NXM_OF_ETH_DST[0..15]->NXM_NX_XXREG3[0..15],ct(table=1,zone=NXM_NX_REG13[0..15])",
            "table=1,priority=10,ip,ct_state=+trk,reg0=0x42 actions=output:p1",
            "table=1,priority=5,ip actions=output:p2",
        ],
        &[],
    );
    let k = ip_key(10, 64);
    let t = p.translate(&k);
    let [DpAction::Ct(c)] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    // The zone came from reg13, the registers are frozen with the packet.
    assert_eq!(c.zone, 5);
    assert_eq!(c.regs[0] >> 32, 0x42);
    assert_eq!(c.regs[6] & 0xffff_ffff, 5);
    assert_eq!(c.regs[7] & 0xffff, 0x0001);
    // First pass: no register bit in the mask; eth_dst's moved bits are.
    assert_eq!(t.mask.0[REG_WORD..REG_WORD + 8], [0; 8]);
    assert_eq!(t.mask.get(Field::EthDst), 0xffff);
    // The recirculated key: what the datapath builds (ct fields, then the frozen state).
    let mut k2 = resumed(k, 1, 0, ct::state::TRK | ct::state::NEW);
    c.freeze_into(&mut k2);
    assert_eq!(k2.get(Field::Reg0), 0x42);
    let t2 = p.translate(&k2);
    assert_eq!(t2.actions, vec![DpAction::Output(11)]);
    // The resumed pass's registers are input: the ones its lookups read are in the mask.
    assert_eq!(t2.mask.get(Field::Reg0), u128::from(u32::MAX));
    // ... so another value of reg0 is another megaflow, with another decision.
    let mut k3 = k2;
    k3.set(Field::Reg0, 0x43);
    assert_eq!(p.translate(&k3).actions, vec![DpAction::Output(12)]);
    // A ct on a resumed pass freezes every register: all of them join the mask.
    let p = pipeline_with(
        &["table=1,priority=10,ip actions=ct(commit,zone=NXM_NX_REG13[0..15]),output:p1"],
        &[],
    );
    let t = p.translate(&k2);
    assert_eq!(t.mask.0[REG_WORD..REG_WORD + 8], [u64::MAX; 8]);
    let [DpAction::Ct(c2), DpAction::Output(11)] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    assert_eq!((c2.zone, c2.regs), (5, c.regs));
}

#[test]
fn a_bucket_sets_registers_back_and_loads_rewrite_packet_bits() {
    let p = pipeline_with(
        &[
            "priority=10 actions=load:0x1->NXM_NX_REG2[],group:1,resubmit(,1)",
            "table=1,priority=10,reg2=0x1 actions=load:0xab->NXM_OF_ETH_DST[0..7],output:p1",
        ],
        &["group_id=1,type=all,bucket=load:0x2->NXM_NX_REG2[],resubmit(,1),output:p2"],
    );
    // The bucket's reg2=2 sees no rule in table 1; after the group reg2 is 1 again.
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Output(12),
            DpAction::SetField(Field::EthDst, 0x0200_0000_00ab),
            DpAction::Output(11)
        ]
    );
    // A partial write of a packet field reads the bits it keeps.
    assert_eq!(
        t.mask.get(Field::EthDst) & !0xff,
        Field::EthDst.full() & !0xff
    );
    let sf = SubField::new(Field::EthDst, 0, 8).unwrap();
    assert_eq!(sf.mask(), 0xff);
    assert_eq!(SubField::new(Field::Reg0, 31, 2), None);
}

/// As OVS's `xlate_recursively`, only a resubmit to the same or an earlier table deepens:
/// OVN's pipelines resubmit forward through ~40 tables per logical datapath and a packet
/// crosses several (switch, router, switch), far past 64 nested resubmits. A chain of 200
/// forward resubmits, then back to table 0 under another in_port and forward again, works;
/// 65 backward ones do not.
#[test]
fn only_backward_resubmits_count_toward_the_depth_limit() {
    let mut rules: Vec<String> = (0..200)
        .map(|t| {
            format!(
                "table={t},priority=1,in_port=p0 actions=resubmit(,{})",
                t + 1
            )
        })
        .collect();
    rules.push("table=200,priority=1,in_port=p0 actions=resubmit(p1,0)".into());
    rules.extend((0..200).map(|t| {
        format!(
            "table={t},priority=1,in_port=p1 actions=resubmit(,{})",
            t + 1
        )
    }));
    rules.push("table=200,priority=1,in_port=p1 actions=output:p2".into());
    let refs: Vec<&str> = rules.iter().map(String::as_str).collect();
    let p = pipeline_with(&refs, &[]);
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.error, None);
    assert_eq!(t.actions, vec![DpAction::Output(12)]);
    // Backward: each resubmit to table 0 deepens.
    let p = pipeline_with(
        &[
            "priority=10,reg0=0x40 actions=output:p1",
            "priority=1 actions=load:0x1->NXM_NX_REG1[],resubmit(,0)",
        ],
        &[],
    );
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.error, Some(XlateError::TooDeep));
}
