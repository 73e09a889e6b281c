//! Connection tracking in the flow path: real frames (the tracker's frame builder) through
//! the real burst path ([`process`]) with ports that move nothing (the output lists are
//! inspected): a stateful firewall, SNAT with its replies translated back, NAT after an
//! output (copy on write), `force`, the recirculation depth bound, and the caches deciding
//! the second pass of later packets.
//!
//! The rules are built as specs with `ct()` actions and `ct_*` matches set directly (the
//! text syntax is the flow crate's).

use std::sync::Arc;

use ferrovs_conntrack::build::{Frame, Proto};
use ferrovs_counters::DropReason;
use ferrovs_flow::ct::{state, CtNat, CtSpec, NatKind, NatSpec};
use ferrovs_flow::spec::ActionSpec;
use ferrovs_flow::{parse_flow, DpAction, Field, FlowSpec};
use ferrovs_sys::pool::Pool;

use super::input::{execute_actions, process, FlowCtx, MAX_PASSES};
use super::tests::switch_specs as switch;
use crate::output::{Burst, Scratch};
use crate::Snapshot;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

/// A rule from its text (without `ct`), then `ct_state` matched on (`value`, `mask`) when
/// given, and `ct` inserted before the other actions when given.
fn rule(text: &str, ct_state: Option<(u8, u8)>, ct: Option<CtSpec>) -> FlowSpec {
    let mut s = parse_flow(text).unwrap();
    if let Some((v, m)) = ct_state {
        s.m.set(Field::CtState, u128::from(v), u128::from(m));
    }
    if let Some(c) = ct {
        s.actions.insert(0, ActionSpec::Ct(Box::new(c)));
    }
    s
}

fn ct(commit: bool, table: Option<u8>, nat: CtNat) -> CtSpec {
    CtSpec {
        commit,
        table,
        nat,
        ..Default::default()
    }
}

/// Per output port (sorted), the frames queued to it.
type Outputs = Vec<(u32, Vec<Vec<u8>>)>;

/// A burst of `frames` received on port `inp` through the flow path; the outputs and the
/// packets dropped.
fn burst(
    snap: &Snapshot,
    pool: &Pool,
    fx: &mut FlowCtx,
    inp: u32,
    frames: &[Vec<u8>],
) -> (Outputs, u64) {
    let mut sc = Scratch::new();
    for f in frames {
        let mut m = pool.alloc_for(f.len()).unwrap();
        m.fill(f.len()).unwrap().copy_from_slice(f);
        sc.batch.push(m);
    }
    let bridge = snap.bridge(0).unwrap();
    let b = Burst {
        snap,
        bridge,
        inp: snap.port(inp).unwrap(),
        pool,
        now: 1,
    };
    let d = process(&b, bridge.flows.as_ref().unwrap(), &mut sc, fx);
    let o = outputs(&sc);
    sc.batch.clear();
    sc.reset_outputs();
    (o, d)
}

fn outputs(sc: &Scratch<'_>) -> Outputs {
    let mut v: Outputs = sc
        .outputs()
        .map(|(p, idx)| {
            (
                p,
                idx.iter()
                    .map(|&i| sc.at(usize::from(i)).data().to_vec())
                    .collect(),
            )
        })
        .collect();
    v.sort_by_key(|(p, _)| *p);
    v
}

fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, seq: u32, ack: u32, f: u8) -> Vec<u8> {
    Frame::v4(src, dst, Proto::tcp(sport, dport, seq, ack, f)).bytes()
}

/// The IPv4 source and destination and the L4 ports of a frame.
fn addrs(f: &[u8]) -> ([u8; 4], [u8; 4], u16, u16) {
    let ihl = usize::from(f[14] & 0xf) * 4;
    let l4 = 14 + ihl;
    (
        f[26..30].try_into().unwrap(),
        f[30..34].try_into().unwrap(),
        u16::from_be_bytes([f[l4], f[l4 + 1]]),
        u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]),
    )
}

fn drops(snap: &Snapshot, port: u32, r: DropReason) -> u64 {
    snap.port(port).unwrap().rx_drops.drops(r)
}

/// OVS's stateful firewall: new connections only from vm1, replies and established
/// traffic both ways.
fn firewall() -> Vec<FlowSpec> {
    let (new, est, trk) = (state::NEW, state::EST, state::TRK);
    vec![
        rule(
            "table=0,priority=10,ip actions=drop",
            Some((0, trk)),
            Some(ct(false, Some(1), CtNat::Off)),
        ),
        rule(
            "table=1,priority=10,in_port=vm1,ip actions=output:vm2",
            Some((trk | new, trk | new)),
            Some(ct(true, None, CtNat::Off)),
        ),
        rule(
            "table=1,priority=10,in_port=vm2,ip actions=drop",
            Some((trk | new, trk | new)),
            None,
        ),
        rule(
            "table=1,priority=10,in_port=vm1,ip actions=output:vm2",
            Some((trk | est, trk | est)),
            None,
        ),
        rule(
            "table=1,priority=10,in_port=vm2,ip actions=output:vm1",
            Some((trk | est, trk | est)),
            None,
        ),
    ]
}

#[test]
fn stateful_firewall_passes_a_handshake_one_way_only() {
    let pool = Pool::new(1024).unwrap();
    let snap = switch(&firewall());
    let mut fx = FlowCtx::default();
    let c = &mut fx;
    // A → B: SYN, SYN-ACK, ACK, data.
    let syn = tcp(A, B, 40000, 80, 100, 0, SYN);
    assert_eq!(
        burst(&snap, &pool, c, 0, std::slice::from_ref(&syn)),
        (vec![(1, vec![syn])], 0)
    );
    assert_eq!(c.counters.recirculations, 1);
    let synack = tcp(B, A, 80, 40000, 500, 101, SYN | ACK);
    assert_eq!(
        burst(&snap, &pool, c, 1, std::slice::from_ref(&synack)),
        (vec![(0, vec![synack])], 0)
    );
    let ack = tcp(A, B, 40000, 80, 101, 501, ACK);
    assert_eq!(
        burst(&snap, &pool, c, 0, std::slice::from_ref(&ack)),
        (vec![(1, vec![ack])], 0)
    );
    // B → A new: dropped (after its recirculation).
    let rev = tcp(B, A, 5555, 22, 9, 0, SYN);
    assert_eq!(burst(&snap, &pool, c, 1, &[rev]), (vec![], 1));
    assert_eq!(drops(&snap, 1, DropReason::FlowDrop), 1);
    assert_eq!(c.counters.recirculations, 4);
    assert_eq!(c.counters.packets, 4);
    let t = &snap.bridge(0).unwrap().flows.as_ref().unwrap().conntrack;
    assert_eq!(t.counters().entries, 1);
}

#[test]
fn established_packets_are_decided_by_the_caches_on_both_passes() {
    let pool = Pool::new(1024).unwrap();
    let snap = switch(&firewall());
    let mut fx = FlowCtx::default();
    fx.emc.set_insert_inv_prob(1);
    let c = &mut fx;
    burst(&snap, &pool, c, 0, &[tcp(A, B, 40000, 80, 100, 0, SYN)]);
    burst(
        &snap,
        &pool,
        c,
        1,
        &[tcp(B, A, 80, 40000, 500, 101, SYN | ACK)],
    );
    let data = |seq| tcp(A, B, 40000, 80, seq, 501, ACK);
    burst(&snap, &pool, c, 0, &[data(101)]);
    let before = c.counters;
    // The same established flow again, in one burst: no upcall on either pass.
    let frames: Vec<Vec<u8>> = (0..4).map(|i| data(101 + i)).collect();
    let (o, d) = burst(&snap, &pool, c, 0, &frames);
    assert_eq!((o, d), (vec![(1, frames)], 0));
    let after = c.counters;
    assert_eq!(after.upcalls, before.upcalls);
    assert_eq!(after.recirculations - before.recirculations, 4);
    // 4 packets × 2 passes, each an EMC or megaflow hit.
    assert_eq!(
        (after.emc_hits + after.megaflow_hits) - (before.emc_hits + before.megaflow_hits),
        8
    );
    assert!(
        after.emc_hits - before.emc_hits >= 6,
        "{before:?} {after:?}"
    );
}

/// SNAT of vm1's connections to 192.168.0.100 (ports 5000-5001) on the way to vm2; vm2's
/// replies are translated back.
fn snat() -> Vec<FlowSpec> {
    let nat = CtNat::Bind(NatSpec {
        kind: NatKind::Src,
        addr_min: [192, 168, 0, 100].into(),
        addr_max: [192, 168, 0, 100].into(),
        ports: Some((5000, 5001)),
    });
    let (est, trk) = (state::EST, state::TRK);
    vec![
        rule(
            "table=0,priority=10,in_port=vm1,ip actions=drop",
            None,
            Some(ct(true, Some(1), nat)),
        ),
        rule(
            "table=0,priority=10,in_port=vm2,ip actions=drop",
            None,
            Some(ct(false, Some(1), CtNat::Apply)),
        ),
        rule(
            "table=1,priority=10,in_port=vm1,ip actions=output:vm2",
            Some((trk, trk)),
            None,
        ),
        rule(
            "table=1,priority=10,in_port=vm2,ip actions=output:vm1",
            Some((trk | est, trk | est)),
            None,
        ),
    ]
}

#[test]
fn snat_rewrites_the_output_and_translates_replies_back() {
    let pool = Pool::new(1024).unwrap();
    let snap = switch(&snat());
    let mut fx = FlowCtx::default();
    let c = &mut fx;
    let (o, d) = burst(&snap, &pool, c, 0, &[tcp(A, B, 40000, 80, 100, 0, SYN)]);
    assert_eq!(d, 0);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].0, 1);
    let out = &o[0].1[0];
    let (src, dst, sport, dport) = addrs(out);
    assert_eq!((src, dst, dport), ([192, 168, 0, 100], B, 80));
    assert!((5000..=5001).contains(&sport));
    // The rewritten frame is well formed (checksums included): the tracker accepts it.
    assert!(ferrovs_conntrack::tuple::parse(out, true).is_ok());
    // The reply, to the translated address, reaches vm1 translated back.
    let reply = tcp(B, [192, 168, 0, 100], 80, sport, 500, 101, SYN | ACK);
    let (o, d) = burst(&snap, &pool, c, 1, &[reply]);
    assert_eq!(d, 0);
    let (src, dst, sp, dp) = addrs(&o[0].1[0]);
    assert_eq!((o[0].0, src, dst, sp, dp), (0, B, A, 80, 40000));
    assert!(ferrovs_conntrack::tuple::parse(&o[0].1[0], true).is_ok());
    // A reply to an address nobody was translated to is new, and dropped.
    let stray = tcp(B, [192, 168, 0, 100], 80, 7777, 500, 101, SYN | ACK);
    assert_eq!(burst(&snap, &pool, c, 1, &[stray]).1, 1);
}

#[test]
fn nat_after_an_output_rewrites_a_copy() {
    let pool = Pool::new(1024).unwrap();
    let nat = CtNat::Bind(NatSpec {
        kind: NatKind::Dst,
        addr_min: [10, 0, 0, 9].into(),
        addr_max: [10, 0, 0, 9].into(),
        ports: None,
    });
    // output:vm3, ct(commit,nat(dst=10.0.0.9)), output:vm2 — no recirculation.
    let mut r = rule(
        "table=0,priority=10,ip actions=output:vm3,output:vm2",
        None,
        None,
    );
    r.actions
        .insert(1, ActionSpec::Ct(Box::new(ct(true, None, nat))));
    let snap = switch(&[r]);
    let mut fx = FlowCtx::default();
    let f = tcp(A, B, 40000, 80, 100, 0, SYN);
    let (o, d) = burst(&snap, &pool, &mut fx, 0, std::slice::from_ref(&f));
    assert_eq!(d, 0);
    assert_eq!(o[1].0, 2);
    assert_eq!(o[1].1, vec![f], "vm3 gets the frame as it was");
    assert_eq!(o[0].0, 1);
    assert_eq!(addrs(&o[0].1[0]).1, [10, 0, 0, 9], "vm2 gets it translated");
    assert_eq!(fx.counters.recirculations, 0);
}

#[test]
fn recirculating_forever_is_dropped_at_the_depth_bound() {
    let pool = Pool::new(1024).unwrap();
    // ct(table=0) in table 0: every pass recirculates again.
    let snap = switch(&[rule(
        "table=0,priority=10,ip actions=drop",
        None,
        Some(ct(false, Some(0), CtNat::Off)),
    )]);
    let mut fx = FlowCtx::default();
    let frames: Vec<Vec<u8>> = (0..3)
        .map(|i| tcp(A, B, 40000 + i, 80, 1, 0, SYN))
        .collect();
    let (o, d) = burst(&snap, &pool, &mut fx, 0, &frames);
    assert_eq!((o, d), (vec![], 3));
    assert_eq!(drops(&snap, 0, DropReason::RecircDepth), 3);
    assert_eq!(fx.counters.recirculations, 3 * (MAX_PASSES as u64 - 1));
}

#[test]
fn a_packet_output_before_recirculating_is_not_counted_as_dropped() {
    let pool = Pool::new(1024).unwrap();
    // output:vm3, then ct(table=1); table 1 drops.
    let mut r = rule("table=0,priority=10,ip actions=output:vm3", None, None);
    r.actions
        .push(ActionSpec::Ct(Box::new(ct(false, Some(1), CtNat::Off))));
    let drop = rule("table=1,priority=10,ip actions=drop", None, None);
    let snap = switch(&[r, drop]);
    let mut fx = FlowCtx::default();
    let f = tcp(A, B, 40000, 80, 100, 0, SYN);
    let (o, d) = burst(&snap, &pool, &mut fx, 0, std::slice::from_ref(&f));
    assert_eq!((o, d), (vec![(2, vec![f])], 0));
    assert_eq!(fx.counters.recirculations, 1);
}

#[test]
fn hand_made_actions_track_in_their_zone_and_force_ends_the_reply_connection() {
    let pool = Pool::new(1024).unwrap();
    let snap = switch(&[]);
    let bridge = snap.bridge(0).unwrap();
    let t = bridge.flows.as_ref().unwrap().conntrack.clone();
    let mut fx = FlowCtx::default();
    let run = |fx: &mut FlowCtx, inp: u32, f: &[u8], actions: &[DpAction]| {
        let mut sc = Scratch::new();
        let mut m = pool.alloc_for(f.len()).unwrap();
        m.fill(f.len()).unwrap().copy_from_slice(f);
        sc.batch.push(m);
        let b = Burst {
            snap: &snap,
            bridge,
            inp: snap.port(inp).unwrap(),
            pool: &pool,
            now: 1,
        };
        let d = execute_actions(&b, &mut sc, fx, 0, actions);
        let o = outputs(&sc);
        sc.batch.clear();
        sc.reset_outputs();
        (o, d)
    };
    let commit = |force: bool| {
        DpAction::Ct(Arc::new(ferrovs_flow::ct::CtAction {
            zone: 5,
            commit: true,
            force,
            nat: CtNat::Off,
            mark: Some((7, u32::MAX)),
            label: None,
            recirc: None,
            metadata: 0,
            regs: [0; 8],
        }))
    };
    let syn = tcp(A, B, 40000, 80, 100, 0, SYN);
    let (o, d) = run(&mut fx, 0, &syn, &[commit(false), DpAction::Output(1)]);
    assert_eq!((o, d), (vec![(1, vec![syn])], 0));
    assert_eq!(t.zone_entries(5), 1);
    assert_eq!(t.zone_entries(0), 0);
    // The reply direction with force: the connection is ended and B → A committed anew.
    let rsyn = tcp(B, A, 80, 40000, 500, 0, SYN);
    run(&mut fx, 1, &rsyn, &[commit(true)]);
    assert_eq!(t.zone_entries(5), 1);
    let b_to_a = ferrovs_conntrack::tuple::parse(&rsyn, true).unwrap().tuple;
    assert_eq!(t.lookup(5, &b_to_a, 1000).map(|(o, _)| o), Some(b_to_a));
    // CtClear alone: nothing to execute, the packet goes nowhere.
    assert_eq!(run(&mut fx, 0, &rsyn, &[DpAction::CtClear]).1, 1);
}

/// `f` (IPv4 without options, TCP) as a guest with checksum offload sends it: the TCP
/// checksum field holds the pseudo-header sum, `NEEDS_CSUM` says where to complete it.
fn partial_csum(mut f: Vec<u8>) -> (Vec<u8>, ferrovs_sys::kernel::vnet::VnetHdr) {
    use ferrovs_packet::offload::{csum_add, csum_add_word, csum_fold};
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let mut s = csum_add(0, &f[26..34]);
    s = csum_add_word(s, 6 + (total - 20) as u64);
    f[50..52].copy_from_slice(&csum_fold(s).to_be_bytes());
    let h = ferrovs_sys::kernel::vnet::VnetHdr {
        flags: ferrovs_sys::kernel::vnet::F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 16,
        ..Default::default()
    };
    (f, h)
}

#[test]
fn snat_of_a_packet_with_a_partial_checksum_keeps_it_partial_and_right() {
    let pool = Pool::new(1024).unwrap();
    let snap = switch(&snat());
    let mut fx = FlowCtx::default();
    let (f, h) = partial_csum(tcp(A, B, 40000, 80, 100, 0, SYN).into_iter().collect());
    // The partial frame is not valid as it is: the tracker must not verify it.
    assert!(ferrovs_conntrack::tuple::parse(&f, true).is_err());
    let mut sc = Scratch::new();
    let mut m = pool.alloc_for(f.len()).unwrap();
    m.fill(f.len()).unwrap().copy_from_slice(&f);
    m.vnet = h;
    sc.batch.push(m);
    let bridge = snap.bridge(0).unwrap();
    let b = Burst {
        snap: &snap,
        bridge,
        inp: snap.port(0).unwrap(),
        pool: &pool,
        now: 1,
    };
    assert_eq!(
        process(&b, bridge.flows.as_ref().unwrap(), &mut sc, &mut fx),
        0
    );
    // The dummy port takes no offload: the output stage completed the checksum the way a
    // device would, from the partial sum NAT kept up to date.
    let (_, idx) = sc.outputs().next().unwrap();
    let m = sc.at(usize::from(idx[0]));
    assert!(!m.vnet.needs_csum());
    let out = m.data().to_vec();
    assert_eq!(addrs(&out).0, [192, 168, 0, 100]);
    assert!(ferrovs_conntrack::tuple::parse(&out, true).is_ok());
    sc.batch.clear();
    sc.reset_outputs();
}

#[test]
fn the_trackers_state_bits_are_the_keys() {
    // `set_ct_fields` copies the tracker's bits into the key as they are.
    use ferrovs_conntrack::CtState;
    for (ours, theirs) in [
        (state::NEW, CtState::NEW),
        (state::EST, CtState::EST),
        (state::REL, CtState::REL),
        (state::RPL, CtState::RPL),
        (state::INV, CtState::INV),
        (state::TRK, CtState::TRK),
        (state::SNAT, CtState::SNAT),
        (state::DNAT, CtState::DNAT),
    ] {
        assert_eq!(ours, theirs);
    }
}

/// Registers written before a `ct(table=1)` decide the resumed pass: the datapath puts the
/// frozen registers into the recirculated key (OVN marks the logical ports in reg14/reg15
/// and takes the zone from reg13 the same way). Through both caches on the second burst.
#[test]
fn registers_written_before_a_recirculation_decide_the_resumed_pass() {
    let pool = Pool::new(1024).unwrap();
    let rules: Vec<FlowSpec> = [
        "priority=10,in_port=vm1,ip actions=load:0x1->NXM_NX_REG14[],load:0x7->NXM_NX_REG13[0..15],ct(table=1,zone=NXM_NX_REG13[0..15])",
        "priority=10,in_port=vm2,ip actions=load:0x2->NXM_NX_REG14[],load:0x7->NXM_NX_REG13[0..15],ct(table=1,zone=NXM_NX_REG13[0..15])",
        "table=1,priority=10,ip,ct_state=+trk,reg14=0x1 actions=ct(commit,zone=NXM_NX_REG13[0..15]),output:vm2",
        "table=1,priority=10,ip,ct_state=+trk,reg14=0x2 actions=output:vm1",
        "table=1,priority=1 actions=drop",
    ]
    .iter()
    .map(|t| parse_flow(t).unwrap())
    .collect();
    let snap = switch(&rules);
    let mut fx = FlowCtx::default();
    fx.emc.set_insert_inv_prob(1);
    let c = &mut fx;
    let syn = tcp(A, B, 40000, 80, 100, 0, SYN);
    let synack = tcp(B, A, 80, 40000, 500, 101, SYN | ACK);
    for round in 0..2 {
        let before = c.counters;
        assert_eq!(
            burst(&snap, &pool, c, 0, std::slice::from_ref(&syn)),
            (vec![(1, vec![syn.clone()])], 0),
            "round {round}"
        );
        assert_eq!(
            burst(&snap, &pool, c, 1, std::slice::from_ref(&synack)),
            (vec![(0, vec![synack.clone()])], 0),
            "round {round}"
        );
        assert_eq!(c.counters.recirculations - before.recirculations, 2);
        if round == 1 {
            // The same packets again: every pass decided by the caches.
            assert_eq!(c.counters.upcalls, before.upcalls);
        }
    }
    // Committed once, in the zone reg13 held.
    let t = &snap.bridge(0).unwrap().flows.as_ref().unwrap().conntrack;
    assert_eq!(t.counters().entries, 1);
}
