//! `check_pkt_larger(LEN)->DST[bit]`: its syntax as ovs-ofctl writes it, and its
//! translation into a datapath length check whose two branches are the rest of the
//! translation with the bit 1 and 0 (one megaflow for packets of every length).

use crate::key::Field;
use crate::pipeline::{CheckPktLen, XlateError};
use crate::tests::{ip_key, pipeline_with};
use crate::*;

#[test]
fn check_pkt_larger_parses_and_prints_like_ovs_ofctl() {
    for (text, printed) in [
        (
            "table=10,priority=50,ip actions=check_pkt_larger(1514)->NXM_NX_REG9[1],resubmit(,11)",
            "table=10,priority=50,ip actions=check_pkt_larger(1514)->NXM_NX_REG9[1],resubmit(,11)",
        ),
        (
            "actions=check_pkt_larger(0x5ea)->reg0[0]",
            "priority=32768 actions=check_pkt_larger(1514)->NXM_NX_REG0[0]",
        ),
    ] {
        let f = parse_flow(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(f.to_string(), printed, "{text}");
        assert_eq!(parse_flow(&f.to_string()).unwrap(), f, "{text}");
    }
    for (bad, why) in [
        (
            "actions=check_pkt_larger(1514)->NXM_NX_REG9[0..1]",
            "not one",
        ),
        (
            "actions=check_pkt_larger(70000)->NXM_NX_REG9[1]",
            "out of range",
        ),
        ("actions=check_pkt_larger(1514)", "expected LEN)->DST"),
        (
            "actions=check_pkt_larger(1514)->NXM_OF_ETH_TYPE[0]",
            "read-only",
        ),
        (
            "actions=write_actions(check_pkt_larger(1514)->NXM_NX_REG9[1])",
            "",
        ),
    ] {
        let e = parse_flow(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

fn check(a: &DpAction) -> &CheckPktLen {
    match a {
        DpAction::CheckPktLen(c) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_rest_of_the_translation_is_made_for_both_lengths() {
    // OVN's gateway router: the check, then the next table decides on the bit.
    let p = pipeline_with(
        &[
            "priority=10,ip actions=mod_dl_src:02:00:00:00:00:aa,check_pkt_larger(1514)->NXM_NX_REG9[1],resubmit(,1),output:p2",
            "table=1,priority=20,reg9=0x2/0x2 actions=controller(userdata=00.00.00.0a)",
            "table=1,priority=10 actions=output:p1",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    assert_eq!(t.error, None);
    let [DpAction::SetField(Field::EthSrc, 0x0200_0000_00aa), c] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    let c = check(c);
    assert_eq!(c.len, 1514);
    // The larger branch reaches the controller; what followed the resubmit (output:p2)
    // ends both branches.
    assert!(
        matches!(
            &c.larger[..],
            [DpAction::Controller(_), DpAction::Output(12)]
        ),
        "{:?}",
        c.larger
    );
    assert_eq!(c.smaller, vec![DpAction::Output(11), DpAction::Output(12)]);
    // The packet-in of the larger branch carries the bit.
    let DpAction::Controller(pi) = &c.larger[0] else {
        panic!()
    };
    assert_eq!(pi.at.as_ref().unwrap().regs[4] & 2, 2);
    // Both branches' rules were consulted (the bit's register is written, not read from
    // the key: a first pass's register bits leave the mask).
    assert_eq!(t.rules.len(), 3);
    assert_eq!(t.mask.get(Field::Reg9), 0);
}

#[test]
fn frames_around_the_check_see_the_bit_as_before_and_end_both_branches() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=resubmit(,1),resubmit(,2)",
            "table=1,priority=10 actions=check_pkt_larger(100)->NXM_NX_REG0[0],resubmit(,3)",
            "table=2,priority=20,reg0=0x1/0x1 actions=drop",
            "table=2,priority=10 actions=output:p2",
            "table=3,priority=20,reg0=0x1/0x1 actions=output:p1",
            "table=3,priority=10 actions=output:p0",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    let [c] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    let c = check(c);
    assert_eq!(c.larger, vec![DpAction::Output(11), DpAction::Output(12)]);
    assert_eq!(c.smaller, vec![DpAction::Output(10), DpAction::Output(12)]);
}

#[test]
fn checks_in_a_row_nest_and_a_recirculating_branch_ends_the_pass() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=check_pkt_larger(1000)->NXM_NX_REG0[0],check_pkt_larger(100)->NXM_NX_REG0[1],resubmit(,1)",
            "table=1,priority=30,reg0=0x3/0x3 actions=output:p0",
            "table=1,priority=20,reg0=0x2/0x3 actions=output:p2",
            "table=1,priority=10,ip,reg0=0/0x3 actions=ct(zone=1,table=2)",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    let [c] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    let outer = check(c);
    assert_eq!(outer.len, 1000);
    let big = check(&outer.larger[0]);
    assert_eq!(
        (big.len, &big.larger[..]),
        (100, &[DpAction::Output(10)][..])
    );
    assert!(big.smaller.is_empty(), "{:?}", big.smaller);
    let small = check(&outer.smaller[0]);
    assert_eq!(small.larger, vec![DpAction::Output(12)]);
    assert!(matches!(&small.smaller[..], [DpAction::Ct(c)] if c.recirc == Some(2)));
}

#[test]
fn checks_in_a_row_are_bounded() {
    // 2^k branches: the translation gives up (as for too many resubmits) instead.
    let many = vec!["check_pkt_larger(100)->NXM_NX_REG0[0]"; 20].join(",");
    let p = pipeline_with(&[&format!("priority=10 actions={many},output:p1")], &[]);
    let t = p.translate(&ip_key(13, 64));
    assert_eq!(t.error, Some(XlateError::TooManyResubmits));
    assert!(t.actions.is_empty());
}

#[test]
fn a_check_inside_a_clone_has_the_clone_set_back_in_both_branches() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=clone(check_pkt_larger(100)->NXM_NX_REG0[0],resubmit(,1)),output:p2",
            "table=1,priority=20,reg0=0x1/0x1 actions=mod_dl_dst:02:00:00:00:00:77,output:p1",
            "table=1,priority=10 actions=output:p0",
        ],
        &[],
    );
    let t = p.translate(&ip_key(13, 64));
    let [c] = &t.actions[..] else {
        panic!("{:?}", t.actions)
    };
    let c = check(c);
    assert_eq!(
        c.larger,
        vec![
            DpAction::SetField(Field::EthDst, 0x0200_0000_0077),
            DpAction::Output(11),
            DpAction::SetField(Field::EthDst, 0x0200_0000_0001),
            DpAction::Output(12),
        ]
    );
    assert_eq!(
        c.smaller[..2],
        [
            DpAction::Output(10),
            DpAction::SetField(Field::EthDst, 0x0200_0000_0001)
        ]
    );
    assert_eq!(c.smaller.last(), Some(&DpAction::Output(12)));
}
