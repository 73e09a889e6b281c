//! `controller(...)` beyond `max_len` (OVS's syntax, printed as ovs-ofctl prints it) and
//! continuations: a translation frozen at `controller(pause)` (the actions after it and
//! the rest of every list it was inside are not run) and resumed (they run, with the
//! registers as the controller sent them back).

use crate::key::{Field, FlowKey, REG_WORD};
use crate::tests::{ip_key, pipeline_with, resolve};
use crate::*;

/// OVN 23.03's DHCP action (`tests/ovn/reference/s4-ch1.flows`).
const OVN_DHCP: &str = "controller(userdata=00.00.00.02.00.00.00.00.00.01.de.10.00.00.00.63.0a.00.01.0b.33.04.00.00.0e.10.01.04.ff.ff.ff.00.03.04.0a.00.01.01.36.04.0a.00.01.01,pause)";

#[test]
fn controller_actions_parse_and_print_like_ovs_ofctl() {
    for (text, printed) in [
        (OVN_DHCP, OVN_DHCP),
        // tests/ofp-actions.at's two controller actions.
        (
            "controller(reason=invalid_ttl,max_len=1234,id=5678)",
            "controller(reason=invalid_ttl,max_len=1234,id=5678)",
        ),
        (
            "controller(reason=invalid_ttl,max_len=1234,id=5678,userdata=01.02.03.04.05,pause)",
            "controller(reason=invalid_ttl,max_len=1234,id=5678,userdata=01.02.03.04.05,pause)",
        ),
        // OVS's order, whatever the input's; defaults left out.
        (
            "controller(pause,userdata=0102,reason=action,meter_id=4)",
            "controller(userdata=01.02,pause,meter_id=4)",
        ),
        (
            "controller(max_len=128,meter_id=4294967295)",
            "CONTROLLER:128",
        ),
        ("controller(reason=no_match)", "controller(reason=no_match)"),
    ] {
        let f = parse_flow(&format!("actions={text}")).unwrap_or_else(|e| panic!("{text}: {e}"));
        let p = f.to_string();
        assert!(p.ends_with(&format!("actions={printed}")), "{text}: {p}");
        assert_eq!(parse_flow(&p).unwrap(), f, "{text}");
    }
    for bad in [
        "controller(reason=asdf)",
        "controller(foo=bar)",
        "controller(userdata=123x456)",
        "controller(userdata=123)",
        "controller(max_len=65536)",
        "controller(meter_id=4294967296)",
    ] {
        assert!(parse_flow(&format!("actions={bad}")).is_err(), "{bad}");
    }
}

/// The controller action of `actions` (the last one).
fn packet_in(actions: &[DpAction]) -> &ControllerAction {
    match actions.last() {
        Some(DpAction::Controller(c)) => c,
        other => panic!("no packet-in last: {other:?} in {actions:?}"),
    }
}

/// `k` as the controller sends it back: the registers and metadata of the packet-in.
fn thawed(k: &FlowKey, s: &PacketInState) -> FlowKey {
    let mut k = *k;
    k.0[REG_WORD..REG_WORD + 8].copy_from_slice(&s.regs);
    k.set(Field::Metadata, u128::from(s.metadata));
    k
}

#[test]
fn a_pause_freezes_the_rest_of_every_list_it_is_inside_and_resume_runs_it() {
    let p = pipeline_with(
        &[
            "table=0,priority=10,ip actions=load:0x5->NXM_NX_REG1[],resubmit(,1),output:p2",
            "table=1,priority=10 actions=load:0x7->NXM_NX_REG2[],load:0x3->OXM_OF_METADATA[],controller(userdata=01.02,pause),load:0x9->NXM_NX_REG3[],resubmit(,2)",
            "table=2,priority=10,reg3=0x9,metadata=0x3 actions=output:p1",
            "table=2,priority=5 actions=drop",
        ],
        &[],
    );
    let k = ip_key(10, 64);
    let t = p.translate(&k);
    // Nothing after the pause ran: no output at all, the packet-in last.
    assert_eq!(t.actions.len(), 1, "{:?}", t.actions);
    let c = packet_in(&t.actions);
    assert_eq!(c.userdata.as_deref(), Some(&[1u8, 2][..]));
    assert!(c.pause);
    assert_eq!((c.table_id, c.reason), (1, REASON_ACTION));
    let s = c.at.as_deref().unwrap();
    // The registers written before the pause are in the packet-in (reg1 is xreg0's low
    // half, reg2 xreg1's high one), and the metadata.
    assert_eq!(s.regs[0], 5);
    assert_eq!(s.regs[1], 7 << 32);
    assert_eq!(s.metadata, 3);
    let fz = s.frozen.as_ref().unwrap();
    assert_eq!(fz.frames.len(), 2, "{fz:?}");
    assert_eq!(fz.frames[0].table, 1);
    assert_eq!(fz.frames[1].table, 0);
    assert_eq!(fz.frames[1].actions, vec![ResolvedAction::Output(Some(12))]);
    // A first pass's megaflow still matches no register (they are functions of it).
    assert!(t.mask.0[REG_WORD..REG_WORD + 8].iter().all(|&w| w == 0));

    // Resumed with the registers the packet-in carried: reg3 is loaded, table 2 matches
    // it, then the rest of table 0's rule.
    let r = p.resume(&thawed(&k, s), fz);
    assert_eq!(r.actions, vec![DpAction::Output(11), DpAction::Output(12)]);
    // Resumed with reg3's rule seeing other metadata (the controller changed it): table 2's
    // other rule.
    let mut s2 = s.clone();
    s2.metadata = 4;
    let r = p.resume(&thawed(&k, &s2), fz);
    assert_eq!(r.actions, vec![DpAction::Output(12)]);
}

#[test]
fn a_pending_goto_and_the_action_set_run_on_resume() {
    let p = pipeline_with(
        &[
            "table=0,priority=10,ip actions=controller(pause),write_actions(output:p2),goto_table:3",
            "table=3,priority=10 actions=output:p1",
        ],
        &[],
    );
    let k = ip_key(10, 64);
    let t = p.translate(&k);
    assert_eq!(t.actions.len(), 1, "{:?}", t.actions);
    let s = packet_in(&t.actions).at.clone().unwrap();
    let fz = s.frozen.as_ref().unwrap();
    assert_eq!(fz.action_set, vec![ResolvedAction::Output(Some(12))]);
    assert_eq!(
        fz.frames[0].actions,
        vec![ResolvedAction::Resubmit {
            port: None,
            table: Some(3)
        }]
    );
    let r = p.resume(&thawed(&k, &s), fz);
    assert_eq!(r.actions, vec![DpAction::Output(11), DpAction::Output(12)]);
}

#[test]
fn a_resumed_translation_may_pause_again() {
    let p = pipeline_with(
        &[
            "table=0,priority=10,ip actions=resubmit(,1),output:p2",
            "table=1,priority=10 actions=controller(userdata=01,pause),resubmit(,2)",
            "table=2,priority=10 actions=controller(userdata=02,pause),output:p1",
        ],
        &[],
    );
    let k = ip_key(10, 64);
    let t = p.translate(&k);
    let s = packet_in(&t.actions).at.clone().unwrap();
    let r = p.resume(&k, s.frozen.as_ref().unwrap());
    assert_eq!(r.actions.len(), 1, "{:?}", r.actions);
    let c = packet_in(&r.actions);
    assert_eq!(c.userdata.as_deref(), Some(&[2u8][..]));
    assert_eq!(c.table_id, 2);
    let fz = c.at.as_deref().unwrap().frozen.as_ref().unwrap();
    // Table 2's rest, then (table 1 had nothing left) table 0's.
    assert_eq!(fz.frames.len(), 2, "{fz:?}");
    let r = p.resume(&k, fz);
    assert_eq!(r.actions, vec![DpAction::Output(11), DpAction::Output(12)]);
}

#[test]
fn a_resubmit_with_a_port_gives_the_caller_its_in_port_back_on_resume() {
    let p = pipeline_with(
        &[
            "table=0,priority=10,ip actions=resubmit(p1,1),output:p2",
            "table=1,priority=10 actions=controller(pause)",
        ],
        &[],
    );
    let t = p.translate(&ip_key(10, 64));
    let s = packet_in(&t.actions).at.clone().unwrap();
    let fz = s.frozen.as_ref().unwrap();
    assert_eq!(fz.frames.len(), 1);
    assert_eq!(
        fz.frames[0].actions[0],
        ResolvedAction::Load {
            field: Field::InPort,
            value: 10,
            mask: Field::InPort.full(),
        }
    );
}

#[test]
fn a_controller_action_without_pause_goes_on_and_carries_no_continuation() {
    let p = pipeline_with(
        &["table=0,priority=10,ip actions=controller(userdata=0a.0b),output:p1"],
        &[],
    );
    let t = p.translate(&ip_key(10, 64));
    assert_eq!(t.actions.len(), 2);
    match &t.actions[0] {
        DpAction::Controller(c) => {
            assert!(c.at.as_ref().unwrap().frozen.is_none());
            assert_eq!(c.userdata.as_deref(), Some(&[10u8, 11][..]));
        }
        a => panic!("{a:?}"),
    }
    assert_eq!(t.actions[1], DpAction::Output(11));
}

#[test]
fn resolved_actions_go_back_to_their_rule_syntax() {
    let f = parse_flow(&format!(
        "ip,actions=load:0x7->NXM_NX_REG2[],{OVN_DHCP},resubmit(,29),output:p1,resubmit(p0,3)"
    ))
    .unwrap();
    let name = |id: u32| Some(format!("p{}", id - 10));
    let back: Vec<ActionSpec> = resolve_frame(&f.actions, 0, 0, &resolve)
        .iter()
        .filter_map(|a| a.to_spec(&name))
        .collect();
    assert_eq!(back, f.actions);
}
