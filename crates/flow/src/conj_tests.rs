//! Conjunctive matches (`conjunction(id,k/n)`, `conj_id`): their syntax as ovs-ofctl
//! prints it, OVS's refusals, the lookup semantics of `crate::classifier` through the
//! pipeline (2 and 3 dimensions, overlapping conjunctions, priorities, incomplete
//! conjunctions, a clause rule removed), and the classifier against the linear reference
//! with the megaflow property.

use std::sync::Arc;

use crate::classifier::Conjunction;
use crate::key::{Field, FlowKey, ETH_IPV4, IP_TCP, IP_UDP};
use crate::reference::Linear;
use crate::testrng::Rng;
use crate::tests::{pipeline_with, resolve};
use crate::*;

#[test]
fn conjunction_and_conj_id_parse_and_print_like_ovs_ofctl() {
    for (text, printed) in [
        (
            "table=44,priority=2001,ip,reg15=0x3,metadata=0x1 actions=conjunction(7,1/2)",
            "table=44,priority=2001,ip,metadata=0x1,reg15=0x3 actions=conjunction(7,1/2)",
        ),
        (
            "priority=2001,tcp,tp_dst=80 actions=conjunction(7,2/2),conjunction(8,2/3)",
            "priority=2001,tcp,tp_dst=80 actions=conjunction(7,2/2),conjunction(8,2/3)",
        ),
        (
            "table=44,priority=2001,conj_id=7,ip,metadata=0x1 actions=resubmit(,45)",
            "table=44,priority=2001,conj_id=7,ip,metadata=0x1 actions=resubmit(,45)",
        ),
        (
            "priority=10,conj_id=0x10 actions=drop",
            "priority=10,conj_id=16 actions=drop",
        ),
        (
            "priority=1,conjunction( 4294967295 , 64 / 64 )",
            "priority=1 actions=conjunction(4294967295,64/64)",
        ),
    ] {
        let text = if text.contains("actions=") {
            text.to_string()
        } else {
            text.replace(",conjunction", " actions=conjunction")
        };
        let f = parse_flow(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(f.to_string(), printed, "{text}");
        assert_eq!(parse_flow(&f.to_string()).unwrap(), f, "{text}");
    }
    // The same match with and without conj_id are different rules (strict selection).
    let a = parse_flow("priority=5,ip actions=drop").unwrap();
    let b = parse_flow("priority=5,conj_id=3,ip actions=drop").unwrap();
    assert_ne!(a.m, b.m);
    let strict = parse_filter("priority=5,ip").unwrap();
    assert!(strict.selects(&a, true) && !strict.selects(&b, true));
    assert!(
        strict.selects(&b, false),
        "non-strict: conj_id=3 is more specific"
    );
    let only3 = parse_filter("conj_id=3").unwrap();
    assert!(only3.selects(&b, false) && !only3.selects(&a, false));
    for (bad, why) in [
        (
            "actions=conjunction(1,1/2),output:p1",
            "but not any other kind of action",
        ),
        (
            "actions=output:p1,conjunction(1,1/2)",
            "but not any other kind of action",
        ),
        ("actions=conjunction(1,1/1)", "at least 2 clauses"),
        ("actions=conjunction(1,1/65)", "at most 64 clauses"),
        ("actions=conjunction(1,0/2)", "must be positive"),
        (
            "actions=conjunction(1,3/2)",
            "less than or equal to number of clauses",
        ),
        ("actions=conjunction(1)", "syntax is"),
        ("actions=conjunction(x,1/2)", "syntax is"),
        ("actions=clone(conjunction(1,1/2))", "nested"),
        ("actions=write_actions(conjunction(1,1/2))", "conjunction"),
        ("conj_id=1/0xff,actions=drop", "conj_id"),
        ("conj_id=4294967296,actions=drop", "out of range"),
    ] {
        let e = parse_flow(bad).expect_err(bad).to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert!(parse_group("group_id=1,type=all,bucket=conjunction(1,1/2)").is_err());
}

fn tcp(src: u32, dst: u32, dport: u16) -> FlowKey {
    let mut k = FlowKey::default();
    // Not one of the ports the rules output to (an output to the input port does nothing).
    k.set(Field::InPort, 99);
    k.set(Field::EthType, u128::from(ETH_IPV4));
    k.set(Field::IpProto, u128::from(IP_TCP));
    k.set(Field::Ipv4Src, u128::from(src));
    k.set(Field::Ipv4Dst, u128::from(dst));
    k.set(Field::TpDst, u128::from(dport));
    k
}

fn out(p: &Pipeline, k: &FlowKey) -> Vec<DpAction> {
    p.translate(k).actions
}

const A: u32 = 0x0a00_0001;
const B: u32 = 0x0a00_0002;
const C: u32 = 0x0a00_0003;

/// OVN's shape: `ip4.src == {A, B} && tcp.dst == {80, 443}` as conjunction 7.
#[test]
fn two_dimensions() {
    let p = pipeline_with(
        &[
            "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
            "priority=100,ip,nw_src=10.0.0.2 actions=conjunction(7,1/2)",
            "priority=100,tcp,tp_dst=80 actions=conjunction(7,2/2)",
            "priority=100,tcp,tp_dst=443 actions=conjunction(7,2/2)",
            "priority=100,conj_id=7,ip actions=output:p1",
            "priority=0 actions=output:p2",
        ],
        &[],
    );
    let p1 = vec![DpAction::Output(11)];
    let p2 = vec![DpAction::Output(12)];
    assert_eq!(out(&p, &tcp(A, C, 80)), p1);
    assert_eq!(out(&p, &tcp(B, C, 443)), p1);
    assert_eq!(out(&p, &tcp(C, C, 80)), p2, "clause 1 missing");
    assert_eq!(out(&p, &tcp(A, C, 22)), p2, "clause 2 missing");
    // The megaflow of a completed conjunction holds the fields of both clauses.
    let t = p.translate(&tcp(A, C, 80));
    assert_eq!(t.mask.get(Field::Ipv4Src), u128::from(u32::MAX));
    assert_eq!(t.mask.get(Field::TpDst), 0xffff);
    // And that of a miss the fields of the clauses that were consulted.
    let t = p.translate(&tcp(C, C, 80));
    assert_eq!(t.mask.get(Field::Ipv4Src), u128::from(u32::MAX));
    assert_eq!(t.mask.get(Field::TpDst), 0xffff);
    // One rule per clause value: 4 soft + 1 conj_id rule stand for 2 × 2 combinations.
    assert_eq!(p.rule_count(), 6);
}

#[test]
fn three_dimensions_and_a_rule_in_several_conjunctions() {
    let p = pipeline_with(
        &[
            // Conjunction 1: src A | dst B | port 80; conjunction 2: src A | port 22.
            "priority=50,ip,nw_src=10.0.0.1 actions=conjunction(1,1/3),conjunction(2,1/2)",
            "priority=50,ip,nw_dst=10.0.0.2 actions=conjunction(1,2/3)",
            "priority=50,tcp,tp_dst=80 actions=conjunction(1,3/3)",
            "priority=50,tcp,tp_dst=22 actions=conjunction(2,2/2)",
            "priority=50,conj_id=1 actions=output:p0",
            "priority=50,conj_id=2 actions=output:p1",
        ],
        &[],
    );
    assert_eq!(out(&p, &tcp(A, B, 80)), vec![DpAction::Output(10)]);
    assert_eq!(
        out(&p, &tcp(A, C, 80)),
        vec![],
        "dimension 2 missing: no rule"
    );
    assert_eq!(out(&p, &tcp(A, C, 22)), vec![DpAction::Output(11)]);
    assert_eq!(out(&p, &tcp(A, B, 22)), vec![DpAction::Output(11)]);
    assert_eq!(out(&p, &tcp(B, B, 22)), vec![]);
}

#[test]
fn overlapping_conjunctions_lowest_id_first_and_missing_conj_id_rules() {
    // Conjunctions 3 and 5 complete at once: ids are tried in ascending order; 3 has no
    // conj_id rule, so 5's applies.
    let p = pipeline_with(
        &[
            "priority=10,ip actions=conjunction(3,1/2),conjunction(5,1/2)",
            "priority=10,tcp actions=conjunction(3,2/2),conjunction(5,2/2)",
            "priority=10,conj_id=5 actions=output:p1",
            "priority=10,conj_id=9 actions=output:p0",
        ],
        &[],
    );
    assert_eq!(out(&p, &tcp(A, B, 1)), vec![DpAction::Output(11)]);
    let both = pipeline_with(
        &[
            "priority=10,ip actions=conjunction(3,1/2),conjunction(5,1/2)",
            "priority=10,tcp actions=conjunction(3,2/2),conjunction(5,2/2)",
            "priority=10,conj_id=5 actions=output:p1",
            "priority=10,conj_id=3 actions=output:p0",
        ],
        &[],
    );
    assert_eq!(out(&both, &tcp(A, B, 1)), vec![DpAction::Output(10)]);
    // A conj_id rule alone matches nothing.
    let alone = pipeline_with(&["priority=10,conj_id=3 actions=output:p0"], &[]);
    assert_eq!(out(&alone, &tcp(A, B, 1)), vec![]);
}

#[test]
fn priorities_as_ovs() {
    let soft = [
        "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
        "priority=100,tcp,tp_dst=80 actions=conjunction(7,2/2)",
        "priority=100,conj_id=7 actions=output:p1",
    ];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = soft.to_vec();
        v.extend_from_slice(extra);
        pipeline_with(&v, &[])
    };
    let k = tcp(A, B, 80);
    // A higher-priority ordinary rule wins.
    assert_eq!(
        out(&with(&["priority=200,ip actions=output:p2"]), &k),
        vec![DpAction::Output(12)]
    );
    // One of the same priority as the soft rules too (soft rules must beat it).
    assert_eq!(
        out(&with(&["priority=100,ip actions=output:p2"]), &k),
        vec![DpAction::Output(12)]
    );
    // A lower one loses to the completed conjunction.
    assert_eq!(
        out(&with(&["priority=50,ip actions=output:p2"]), &k),
        vec![DpAction::Output(11)]
    );
    // A conj_id rule of a lower priority than an ordinary rule that matches loses to it.
    let low = pipeline_with(
        &[
            "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
            "priority=100,tcp,tp_dst=80 actions=conjunction(7,2/2)",
            "priority=20,conj_id=7 actions=output:p1",
            "priority=50,ip actions=output:p2",
        ],
        &[],
    );
    assert_eq!(out(&low, &k), vec![DpAction::Output(12)]);
    // Soft rules of a priority that completes nothing are ignored; the lookup goes on below.
    let below = pipeline_with(
        &[
            "priority=300,ip,nw_src=10.0.0.1 actions=conjunction(9,1/2)",
            "priority=300,udp actions=conjunction(9,2/2)",
            "priority=300,conj_id=9 actions=output:p0",
            "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
            "priority=100,tcp,tp_dst=80 actions=conjunction(7,2/2)",
            "priority=100,conj_id=7 actions=output:p1",
            "priority=10,ip actions=output:p2",
        ],
        &[],
    );
    assert_eq!(out(&below, &k), vec![DpAction::Output(11)]);
    let mut u = k;
    u.set(Field::IpProto, u128::from(IP_UDP));
    assert_eq!(out(&below, &u), vec![DpAction::Output(10)]);
    u.set(Field::Ipv4Src, u128::from(C));
    assert_eq!(
        out(&below, &u),
        vec![DpAction::Output(12)],
        "nothing completes"
    );
    // Clauses of different priorities do not make a conjunction.
    let split = pipeline_with(
        &[
            "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
            "priority=90,tcp,tp_dst=80 actions=conjunction(7,2/2)",
            "priority=100,conj_id=7 actions=output:p1",
        ],
        &[],
    );
    assert_eq!(out(&split, &k), vec![]);
    // A soft rule and a hard one of the same match: the hard one of a lower priority
    // still applies when the conjunction does not complete.
    let same = pipeline_with(
        &[
            "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
            "priority=50,ip,nw_src=10.0.0.1 actions=output:p2",
        ],
        &[],
    );
    assert_eq!(out(&same, &k), vec![DpAction::Output(12)]);
}

#[test]
fn deleting_a_clause_rule_breaks_the_conjunction() {
    let specs: Vec<FlowSpec> = [
        "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
        "priority=100,tcp,tp_dst=80 actions=conjunction(7,2/2)",
        "priority=100,tcp,tp_dst=443 actions=conjunction(7,2/2)",
        "priority=100,conj_id=7 actions=output:p1",
    ]
    .iter()
    .map(|s| parse_flow(s).unwrap())
    .collect();
    let mut p = Pipeline::build(
        specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
        &resolve,
    );
    let before = p.clone();
    assert_eq!(out(&p, &tcp(A, B, 80)), vec![DpAction::Output(11)]);
    p.remove(&specs[1], &resolve);
    assert_eq!(
        out(&p, &tcp(A, B, 80)),
        vec![],
        "clause 2 has no rule for 80 now"
    );
    assert_eq!(out(&p, &tcp(A, B, 443)), vec![DpAction::Output(11)]);
    p.remove(&specs[3], &resolve);
    assert_eq!(out(&p, &tcp(A, B, 443)), vec![], "no conj_id rule");
    assert_eq!(p.rule_count(), 2);
    assert_eq!(
        out(&before, &tcp(A, B, 80)),
        vec![DpAction::Output(11)],
        "the clone"
    );
    // Replacing a soft rule by a hard one of the same match and priority.
    let hard = parse_flow("priority=100,tcp,tp_dst=443 actions=output:p2").unwrap();
    p.insert(&hard, Arc::new(RuleStats::default()), &resolve);
    assert_eq!(out(&p, &tcp(A, B, 443)), vec![DpAction::Output(12)]);
}

/// The classifier against the linear reference, with soft rules, conj_id rules and ordinary
/// ones over few fields and priorities (so conjunctions complete, overlap, and compete with
/// ordinary rules), and the megaflow property: any key equal on the reported mask gets the
/// same rule.
#[test]
fn classifier_with_conjunctions_against_the_reference_with_megaflows() {
    let mut r = Rng::new(0xc0);
    let (mut cases, mut by_conj, mut soft_seen) = (0, 0, 0);
    for round in 0..60 {
        let mut c: Classifier<u32> = Classifier::new();
        let mut lin: Linear<u32> = Linear::default();
        let mut installed: Vec<(Match, u16)> = Vec::new();
        let mut conj_rule = std::collections::HashSet::new();
        let n = 5 + r.below(if round % 10 == 0 { 300 } else { 40 });
        for v in 0..n as u32 {
            let prio = [5, 10, 10, 20, 20, 30][r.below(6) as usize];
            let mut m = Match::catchall();
            let f =
                [Field::InPort, Field::Ipv4Src, Field::TpDst, Field::EthType][r.below(4) as usize];
            m.set(f, u128::from(r.below(3)), f.full());
            if r.below(3) == 0 {
                let g = [Field::IpProto, Field::TpSrc][r.below(2) as usize];
                m.set(g, u128::from(r.below(2)), g.full());
            }
            let conj: Vec<Conjunction> = if r.below(2) == 0 {
                (0..1 + r.below(2))
                    .map(|_| {
                        let id = 1 + r.below(4) as u32;
                        let n_clauses = 2 + (id % 2) as u8;
                        Conjunction {
                            id,
                            clause: r.below(u64::from(n_clauses)) as u8,
                            n_clauses,
                        }
                    })
                    .collect()
            } else {
                if r.below(3) == 0 {
                    m.conj_id = Some(r.below(5) as u32);
                }
                Vec::new()
            };
            assert_eq!(
                c.insert_conj(m, prio, v, &conj).is_some(),
                lin.insert_conj(m, prio, v, &conj).is_some()
            );
            if m.conj_id.is_some() {
                conj_rule.insert(v);
            }
            installed.push((m, prio));
            if r.below(6) == 0 {
                let (m, p) = installed.swap_remove(r.below(installed.len() as u64) as usize);
                assert_eq!(c.remove(&m, p), lin.remove(&m, p));
            }
        }
        assert_eq!(c.len(), lin.len());
        assert_eq!(c.iter().count(), lin.len());
        let key = |r: &mut Rng| {
            let mut k = FlowKey::default();
            for f in [
                Field::InPort,
                Field::Ipv4Src,
                Field::TpDst,
                Field::EthType,
                Field::IpProto,
                Field::TpSrc,
            ] {
                k.set(f, u128::from(r.below(3)));
            }
            k
        };
        for _ in 0..300 {
            let k = key(&mut r);
            let mut wc = FlowKey::default();
            let got = c.lookup(&k, &mut wc).map(|(v, p)| (*v, p));
            let want = lin.lookup(&k).map(|(v, p)| (*v, p));
            assert_eq!(got, want, "round {round} key {k:?}");
            if got.is_some_and(|(v, _)| conj_rule.contains(&v)) {
                by_conj += 1;
            }
            if wc.get(Field::IpProto) != 0 || wc.get(Field::TpSrc) != 0 {
                soft_seen += 1;
            }
            for _ in 0..3 {
                let mut k2 = key(&mut r);
                for i in 0..k2.0.len() {
                    k2.0[i] = (k2.0[i] & !wc.0[i]) | (k.0[i] & wc.0[i]);
                }
                let mut wc2 = FlowKey::default();
                assert_eq!(
                    c.lookup(&k2, &mut wc2).map(|(v, p)| (*v, p)),
                    got,
                    "megaflow property broken, round {round}"
                );
            }
            cases += 1;
        }
    }
    eprintln!("{cases} lookups, {by_conj} answered by a conj_id rule, {soft_seen} keyed on a second field");
    assert!(cases >= 18_000 && by_conj > 1000, "{by_conj}");
}
