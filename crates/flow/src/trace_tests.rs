//! `crate::trace`: what a traced translation reports (tables, nesting, rules, misses,
//! `NORMAL`, conjunctions, recirculations, drops), that it is the very translation an
//! upcall makes (same actions, same mask, random pipelines), and that it changes no state.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::ct::{self, CtAction};
use crate::key::{Field, FlowKey, ETH_IPV4, IP_TCP};
use crate::testrng::Rng;
use crate::tests::{ip_key, live, pipeline_with, random_key, random_rule, resolve};
use crate::trace::{trace, Pass, Step};
use crate::*;

/// (table, depth, priority or None for a miss) of each lookup of a pass.
fn lookups(p: &Pass) -> Vec<(u8, usize, Option<u16>)> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Lookup {
                table, depth, rule, ..
            } => Some((*table, *depth, rule.as_ref().map(|r| r.priority))),
            Step::Normal { .. } => None,
        })
        .collect()
}

fn one_pass(p: &Pipeline, k: &FlowKey) -> Pass {
    let v = trace(p, k, 1, &mut |_, _, _| unreachable!());
    assert_eq!(v.len(), 1);
    v.into_iter().next().unwrap()
}

#[test]
fn multi_table_goto_and_resubmit_nesting() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=load:0x7->NXM_NX_REG0[],goto_table:1",
            "table=1,priority=10,reg0=0x7 actions=resubmit(,2),resubmit(,3),output:p2",
            "table=2,priority=10 actions=resubmit(,4)",
            "table=4,priority=5 actions=output:p1",
        ],
        &[],
    );
    let t = one_pass(&p, &ip_key(10, 64));
    // goto_table stays at depth 0; resubmits nest; table 3 has no rule (a miss, and the
    // rule that resubmitted goes on).
    assert_eq!(
        lookups(&t),
        vec![
            (0, 0, Some(10)),
            (1, 0, Some(10)),
            (2, 1, Some(10)),
            (4, 2, Some(5)),
            (3, 1, None),
        ]
    );
    // The key each lookup saw: table 1 saw reg0 as table 0 wrote it.
    let Step::Lookup { key, .. } = &t.steps[1] else {
        panic!()
    };
    assert_eq!(key.get(Field::Reg0), 7);
    assert_eq!(
        t.translation.actions,
        vec![DpAction::Output(11), DpAction::Output(12)]
    );
    let direct = p.translate(&ip_key(10, 64));
    assert_eq!(direct.actions, t.translation.actions);
    assert_eq!(direct.mask, t.translation.mask);
}

#[test]
fn normal_is_reported_with_the_key_it_sees() {
    let p = pipeline_with(
        &["priority=10,ip actions=mod_dl_dst:02:00:00:00:00:09,NORMAL"],
        &[],
    );
    let t = one_pass(&p, &ip_key(10, 64));
    let normals: Vec<u128> = t
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Normal { key } => Some(key.get(Field::EthDst)),
            _ => None,
        })
        .collect();
    assert_eq!(normals, vec![0x0200_0000_0009]);
    assert_eq!(t.translation.actions.last(), Some(&DpAction::Normal));
}

#[test]
fn table_miss_and_drop_rules() {
    let p = pipeline_with(&["priority=10,udp actions=drop"], &[]);
    // A TCP packet misses table 0: no rule, no actions.
    let t = one_pass(&p, &ip_key(10, 64));
    assert_eq!(lookups(&t), vec![(0, 0, None)]);
    assert!(t.translation.actions.is_empty());
    let mut k = ip_key(10, 64);
    k.set(Field::IpProto, 17);
    let t = one_pass(&p, &k);
    assert_eq!(lookups(&t), vec![(0, 0, Some(10))]);
    assert!(t.translation.actions.is_empty());
    // The megaflow depends on the protocol that decided it.
    assert_ne!(t.translation.mask.get(Field::IpProto), 0);
}

#[test]
fn conjunction_is_traced_as_the_conj_id_rule() {
    let p = pipeline_with(
        &[
            "priority=100,ip,nw_src=10.0.0.1 actions=conjunction(7,1/2)",
            "priority=100,tcp,tp_dst=80 actions=conjunction(7,2/2)",
            "priority=100,conj_id=7,ip actions=output:p2",
            "priority=1 actions=output:p1",
        ],
        &[],
    );
    let mut k = ip_key(10, 64);
    k.set(Field::Ipv4Src, u128::from(0x0a00_0001u32));
    k.set(Field::TpDst, 80);
    let t = one_pass(&p, &k);
    assert_eq!(lookups(&t), vec![(0, 0, Some(100))]);
    let Step::Lookup {
        rule: Some(rule), ..
    } = &t.steps[0]
    else {
        panic!()
    };
    assert_eq!(rule.actions, vec![ResolvedAction::Output(Some(12))]);
    assert_eq!(t.translation.actions, vec![DpAction::Output(12)]);
    k.set(Field::TpDst, 81);
    let t = one_pass(&p, &k);
    assert_eq!(lookups(&t), vec![(0, 0, Some(1))]);
    assert_eq!(t.translation.actions, vec![DpAction::Output(11)]);
}

#[test]
fn ct_recirculates_with_the_assumed_state() {
    let p = pipeline_with(
        &[
            "priority=10,ip actions=load:0x3->NXM_NX_REG1[],ct(zone=5,table=1)",
            "table=1,priority=10,ct_state=+trk+new,ip actions=ct(commit,zone=5),output:p1",
            "table=1,priority=10,ct_state=+trk+est,ip actions=output:p2",
        ],
        &[],
    );
    let k = ip_key(10, 64);
    for (state, out) in [
        (ct::state::TRK | ct::state::NEW, 11),
        (ct::state::TRK | ct::state::EST, 12),
    ] {
        let mut seen = Vec::new();
        let passes = trace(&p, &k, 6, &mut |at, c: &CtAction, n| {
            seen.push((at.get(Field::Reg1), c.zone, c.recirc, n));
            let mut k = *at;
            c.freeze_into(&mut k);
            k.set(
                Field::RecircId,
                u128::from(ct::recirc_id(c.recirc.unwrap())),
            );
            k.set(Field::CtState, u128::from(state));
            k.set(Field::CtZone, u128::from(c.zone));
            k
        });
        // The ct is reached with reg1 as the rule loaded it; the second pass starts in
        // table 1 with the register frozen and the state given.
        assert_eq!(seen, vec![(3, 5, Some(1), 1)]);
        assert_eq!(passes.len(), 2);
        assert!(passes[0].recirculation().is_some());
        assert_eq!(lookups(&passes[1]), vec![(1, 0, Some(10))]);
        assert_eq!(passes[1].key.get(Field::Reg1), 3);
        assert_eq!(
            passes[1].translation.actions.last(),
            Some(&DpAction::Output(out))
        );
        // The second pass's megaflow keys on the state and the recirculation id.
        assert_ne!(passes[1].translation.mask.get(Field::CtState), 0);
        assert_ne!(passes[1].translation.mask.get(Field::RecircId), 0);
    }
    // A loop of recirculations stops at the pass limit.
    let looping = pipeline_with(&["priority=10,ip actions=ct(table=0)"], &[]);
    let passes = trace(&looping, &k, 6, &mut |at, c, _| {
        let mut k = *at;
        k.set(
            Field::RecircId,
            u128::from(ct::recirc_id(c.recirc.unwrap())),
        );
        k
    });
    assert_eq!(passes.len(), 6);
}

/// The traced translation is the upcall's: same actions, mask, error and learned rules
/// for random pipelines and keys.
#[test]
fn traced_translation_is_the_upcalls() {
    let mut r = Rng::new(2026);
    let mut compared = 0;
    for _ in 0..40 {
        let n = 1 + r.below(60);
        let specs: Vec<FlowSpec> = (0..n)
            .map(|_| {
                let t = r.below(4) as u8;
                parse_flow(&random_rule(&mut r, t)).unwrap()
            })
            .collect();
        let p = Pipeline::build_with_groups(
            specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
            std::iter::empty(),
            &resolve,
            &live,
        );
        for _ in 0..50 {
            let k = random_key(&mut r);
            let a = p.translate(&k);
            let b = one_pass(&p, &k).translation;
            assert_eq!(a.actions, b.actions);
            assert_eq!(a.mask, b.mask);
            assert_eq!(a.error, b.error);
            assert_eq!(a.learned.len(), b.learned.len());
            assert_eq!(a.rules.len(), b.rules.len());
            compared += 1;
        }
    }
    assert_eq!(compared, 2000);
}

/// A trace credits no counter: no table statistics, no failure counters (a resubmit loop
/// that a translation counts as too deep), no rule counters.
#[test]
fn a_trace_changes_no_state() {
    let counters: Vec<TableCounters> = (0..2).map(|_| TableCounters::default()).collect();
    let p = pipeline_with(
        &[
            "priority=10,ip actions=resubmit(,0)",
            "priority=5 actions=goto_table:1",
            "table=1,priority=5 actions=output:p1",
        ],
        &[],
    )
    .with_table_stats(counters.clone());
    let k = ip_key(10, 64);
    let t = one_pass(&p, &k);
    assert_eq!(t.translation.error, Some(XlateError::TooDeep));
    assert!(t.translation.actions.is_empty());
    assert_eq!(p.xlate_counters().too_deep.load(Ordering::Relaxed), 0);
    let mut k2 = FlowKey::default();
    k2.set(Field::InPort, 10);
    k2.set(Field::EthType, u128::from(ETH_IPV4 + 1));
    let t = one_pass(&p, &k2);
    assert_eq!(lookups(&t), vec![(0, 0, Some(5)), (1, 0, Some(5))]);
    // Table statistics are what a translation returns for the megaflow to credit; the
    // trace's carries only the matched rules' counters, and nothing was added to them.
    for c in &counters {
        assert_eq!(c.lookup.packets.load(Ordering::Relaxed), 0);
        assert_eq!(c.matched.packets.load(Ordering::Relaxed), 0);
    }
    for r in &t.translation.rules {
        assert_eq!(r.packets.load(Ordering::Relaxed), 0);
    }
    // The upcall's translation counts the failure.
    let _ = p.translate(&k);
    assert_eq!(p.xlate_counters().too_deep.load(Ordering::Relaxed), 1);
    let _ = IP_TCP;
}
