//! The flow path driven in-process, with ports that move nothing (the output lists are
//! inspected instead): grouped execution against packet-by-packet execution and against an
//! arrival-order reference that translates every packet through the rule tables, through
//! both caches; and a micro-benchmark of the path (`bench_flow_path`, ignored by default).

use std::sync::Arc;

use ferrovs_counters::DropReason;
use ferrovs_flow::{
    parse_flow, parse_group, FlowKey, FlowSpec, GroupSpec, GroupStats, Pipeline, RuleStats,
};
use ferrovs_sys::pool::Pool;

use super::input::{execute, process, FlowCtx};
use super::{BridgeFlows, MegaflowCache};
use crate::output::{Burst, Scratch};
use crate::port::{Port, PortIo, VlanMode};
use crate::{Bridge, MacTable, Snapshot};

pub(super) const NAMES: [&str; 4] = ["vm1", "vm2", "vm3", "vm4"];

pub(super) fn port(id: u32) -> Option<Arc<Port>> {
    Some(Arc::new(Port {
        id,
        name: NAMES[id as usize].into(),
        bridge: 0,
        vlan: VlanMode::Trunk,
        io: PortIo::Vhost { queues: Vec::new() },
        rx_drops: Default::default(),
        tx_not_ready: Default::default(),
        offload: Default::default(),
        inject: Default::default(),
        capture: Default::default(),
        rxq_load: Default::default(),
    }))
}

/// One bridge with ports vm1..vm4 (ids 0..3) and `rules`.
pub(super) fn switch(rules: &[String]) -> Snapshot {
    switch_with_groups(rules, &[])
}

/// One bridge with ports vm1..vm4 (ids 0..3), `rules` and `groups` (every port live).
fn switch_with_groups(rules: &[String], groups: &[&str]) -> Snapshot {
    let specs: Vec<FlowSpec> = rules.iter().map(|r| parse_flow(r).unwrap()).collect();
    let groups: Vec<GroupSpec> = groups.iter().map(|g| parse_group(g).unwrap()).collect();
    snapshot(Pipeline::build_with_groups(
        specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
        groups.iter().map(|g| (g, GroupStats::for_group(g))),
        &resolve,
        &|_| true,
    ))
}

pub(super) fn resolve(n: &str) -> Option<u32> {
    NAMES.iter().position(|x| *x == n).map(|i| i as u32)
}

/// One bridge with ports vm1..vm4 (ids 0..3) and the rules `specs`.
pub(super) fn switch_specs(specs: &[FlowSpec]) -> Snapshot {
    snapshot(Pipeline::build(
        specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
        &resolve,
    ))
}

fn snapshot(pipeline: Pipeline) -> Snapshot {
    snapshot_with(pipeline, None)
}

/// [`snapshot`] with a packet-in queue.
pub(super) fn snapshot_with(
    pipeline: Pipeline,
    packet_in: Option<Arc<crate::packet_io::PacketInQueue>>,
) -> Snapshot {
    let bridge = Bridge {
        name: "br0".into(),
        macs: Arc::new(MacTable::new(1024, 300)),
        ports: vec![0, 1, 2, 3],
        flows: Some(BridgeFlows {
            pipeline: Arc::new(pipeline),
            gen: 0,
            cache: Arc::new(MegaflowCache::new(0)),
            meters: Default::default(),
            packet_in,
            conntrack: Arc::new(ferrovs_conntrack::Tracker::new(Default::default())),
            learn: None,
        }),
        default_rule: None,
    };
    Snapshot {
        bridges: vec![Some(Arc::new(bridge))],
        ports: (0..4).map(port).collect(),
        pmd_rxqs: Vec::new(),
    }
}

/// A 64-byte UDP frame from vm1's MAC, `src` → 10.0.0.2, ports 1000 → `dport`, with `seq`
/// in the payload.
pub(super) fn frame(src: u32, dport: u16, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&50u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&1000u16.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[38..40].copy_from_slice(&30u16.to_be_bytes());
    f[50..54].copy_from_slice(&seq.to_be_bytes());
    f
}

fn seq_of(p: &[u8]) -> u32 {
    // After a pushed VLAN tag the payload starts 4 bytes later.
    let at = if p[12..14] == [0x81, 0x00] { 54 } else { 50 };
    u32::from_be_bytes(p[at..at + 4].try_into().unwrap())
}

/// Per output port (in list order), the frames queued to it.
pub(super) type Outputs = Vec<(u32, Vec<Vec<u8>>)>;

fn load<'p>(sc: &mut Scratch<'p>, pool: &'p Pool, frames: &[Vec<u8>]) {
    sc.batch.clear();
    sc.reset_outputs();
    for f in frames {
        let mut m = pool.alloc_for(f.len()).unwrap();
        m.fill(f.len()).unwrap().copy_from_slice(f);
        sc.batch.push(m);
    }
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

/// A burst from vm1 through the flow path.
pub(super) fn burst(
    snap: &Snapshot,
    pool: &Pool,
    fx: &mut FlowCtx,
    frames: &[Vec<u8>],
) -> (Outputs, u64) {
    let mut sc = Scratch::new();
    load(&mut sc, pool, frames);
    let bridge = snap.bridge(0).unwrap();
    let inp = snap.port(0).unwrap();
    let b = Burst {
        snap,
        bridge,
        inp,
        pool,
        now: 1,
    };
    let d = process(&b, bridge.flows.as_ref().unwrap(), &mut sc, fx);
    let o = outputs(&sc);
    sc.batch.clear();
    sc.reset_outputs();
    (o, d)
}

/// The same burst, every packet translated through the rule tables and executed in arrival
/// order (no cache, no grouping).
fn reference(snap: &Snapshot, pool: &Pool, frames: &[Vec<u8>]) -> (Outputs, u64) {
    let mut sc = Scratch::new();
    load(&mut sc, pool, frames);
    let bridge = snap.bridge(0).unwrap();
    let inp = snap.port(0).unwrap();
    let p = &bridge.flows.as_ref().unwrap().pipeline;
    let b = Burst {
        snap,
        bridge,
        inp,
        pool,
        now: 1,
    };
    let mut d = 0;
    for i in 0..frames.len() {
        let t = p.translate(&FlowKey::extract(sc.batch[i].data(), 0, None));
        d += execute(&b, &mut sc, i, &t.actions);
    }
    let o = outputs(&sc);
    sc.batch.clear();
    sc.reset_outputs();
    (o, d)
}

/// The groups [`rules`] uses.
const GROUPS: [&str; 2] = [
    "group_id=1,type=select,bucket=output:vm2,bucket=output:vm3,bucket=mod_tp_src:9,output:vm4",
    "group_id=2,type=all,bucket=mod_nw_tos:32,output:vm2,bucket=output:vm3,bucket=group:1",
];

fn rules() -> Vec<String> {
    [
        "priority=100,in_port=vm1,udp,tp_dst=1 actions=output:vm2",
        "priority=100,in_port=vm1,udp,tp_dst=2 actions=output:vm2,output:vm3",
        "priority=100,in_port=vm1,udp,tp_dst=3 actions=drop",
        "priority=100,in_port=vm1,udp,tp_dst=4 actions=mod_tp_dst:7,output:vm3",
        "priority=100,in_port=vm1,udp,tp_dst=5 actions=output:vm2,mod_nw_tos:32,output:vm4",
        "priority=100,in_port=vm1,udp,tp_dst=6 actions=flood",
        "priority=100,in_port=vm1,udp,tp_dst=7 actions=in_port",
        "priority=100,in_port=vm1,udp,tp_dst=8 actions=normal",
        "priority=100,in_port=vm1,udp,tp_dst=9 actions=output:vm1",
        "priority=100,in_port=vm1,udp,tp_dst=10 actions=output:vm4,output:vm2,output:vm4",
        "priority=100,in_port=vm1,udp,tp_dst=11 actions=push_vlan:0x8100,mod_vlan_vid:5,output:vm2",
        // Groups and metadata: a select group (its bucket by the packet's hash), and an all
        // group that rewrites in one bucket (restored for the next), reached from a second
        // table by the metadata the first wrote.
        "priority=100,in_port=vm1,udp,tp_dst=12 actions=group:1",
        "priority=100,in_port=vm1,udp,tp_dst=0,nw_src=10.0.0.1 actions=write_metadata:0x5/0xff,goto_table:1",
        "priority=90,in_port=vm1,udp,tp_dst=0 actions=write_metadata:0x6,goto_table:1",
        "table=1,priority=10,metadata=0x5/0xff actions=group:2",
        "table=1,priority=5,ip actions=mod_nw_tos:16,group:1",
        "priority=50,in_port=vm1,ip,nw_src=10.0.0.3 actions=output:vm4",
        "priority=0 actions=normal",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// What every port receives in `got` is what it receives in the reference `want`, each
/// flow's packets (by their input key) in arrival order.
fn same_as_reference(got: &Outputs, want: &Outputs, frames: &[Vec<u8>], first: u32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: ports");
    for ((pg, fg), (pr, fr)) in got.iter().zip(want) {
        assert_eq!(pg, pr);
        let mut a = fg.clone();
        let mut b = fr.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{what}: what port {pg} receives");
        let key = |p: &[u8]| frames[(seq_of(p) - first) as usize][26..38].to_vec();
        for (i, x) in fg.iter().enumerate() {
            for y in &fg[i + 1..] {
                if key(x) == key(y) {
                    assert!(seq_of(x) <= seq_of(y), "{what}: port {pg} reordered a flow");
                }
            }
        }
    }
}

/// Grouped execution (output-only groups at once) gives exactly what packet-by-packet
/// execution of the same groups gives, and what every port receives is what an arrival-order
/// translation of every packet sends it, each flow's packets in their order; drops and
/// megaflow counters agree. Random bursts of a dozen rule shapes (outputs, several outputs,
/// drop, rewrites between outputs, flood, in_port, NORMAL, an output to the input port,
/// VLAN push, a select group, an all group with a rewrite in one bucket and a nested group,
/// metadata written in table 0 and matched in table 1), few or many flows per rule, through the EMC (insertion always), the megaflow
/// cache and upcalls; and the same with the EMC never filled, so that it is bypassed.
#[test]
fn grouped_execution_equals_packet_by_packet_and_the_reference() {
    let pool = Pool::new(1024).unwrap();
    let rules = rules();
    let (grouped, plain, bypass, refsw) = (
        switch_with_groups(&rules, &GROUPS),
        switch_with_groups(&rules, &GROUPS),
        switch_with_groups(&rules, &GROUPS),
        switch_with_groups(&rules, &GROUPS),
    );
    let mut fx_g = FlowCtx::default();
    let mut fx_p = FlowCtx::default();
    let mut fx_b = FlowCtx::default();
    fx_p.batch_outputs = false;
    fx_g.emc.set_insert_inv_prob(1);
    fx_p.emc.set_insert_inv_prob(1);
    fx_b.emc.set_insert_inv_prob(0);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut seq = 0u32;
    let mut total = 0u64;
    for round in 0..600 {
        let n = 1 + (rng.next() % 32) as usize;
        // Few distinct flows in some bursts (long runs of one megaflow), many in others.
        let spread = [1, 3, 40][round % 3];
        let first = seq + 1;
        let frames: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let r = rng.next();
                let dport = if spread == 1 { 1 } else { (r % 13) as u16 };
                let src = 0x0a00_0001 + ((r >> 8) % spread) as u32;
                seq += 1;
                frame(src, dport, seq)
            })
            .collect();
        total += n as u64;
        let (og, dg) = burst(&grouped, &pool, &mut fx_g, &frames);
        let (op, dp) = burst(&plain, &pool, &mut fx_p, &frames);
        let (ob, db) = burst(&bypass, &pool, &mut fx_b, &frames);
        let (or, dr) = reference(&refsw, &pool, &frames);
        assert_eq!(og, op, "round {round}: grouped vs packet by packet");
        assert_eq!(dg, dp, "round {round}");
        assert_eq!(dg, dr, "round {round}: drops vs the reference");
        assert_eq!(
            db, dr,
            "round {round}: drops (EMC bypassed) vs the reference"
        );
        same_as_reference(&og, &or, &frames, first, &format!("round {round}"));
        same_as_reference(&ob, &or, &frames, first, &format!("round {round}, bypass"));
    }
    for (snap, fx) in [(&grouped, &fx_g), (&plain, &fx_p), (&bypass, &fx_b)] {
        let bf = snap.bridge(0).unwrap().flows.as_ref().unwrap();
        let counted: u64 = bf
            .cache
            .entries()
            .iter()
            .map(|f| f.packets.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        assert_eq!(counted, total);
        assert_eq!(fx.counters.packets, total);
        assert_eq!(
            fx.counters.emc_hits + fx.counters.megaflow_hits + fx.counters.upcalls,
            total
        );
        let drops = snap.port(0).unwrap().rx_drops.drops(DropReason::FlowDrop);
        assert!(drops > 0);
    }
    assert!(fx_g.counters.emc_hits > total / 2, "{:?}", fx_g.counters);
    assert_eq!(fx_g.counters.emc_skipped, 0);
    assert_eq!(
        fx_g.counters, fx_p.counters,
        "both took the same cache levels"
    );
    // The never-filled EMC was bypassed, and probed again after each bypass.
    let b = fx_b.counters;
    assert_eq!(b.emc_hits, 0);
    assert!(b.emc_skipped > total / 2 && b.emc_skipped < total, "{b:?}");
}

/// Cycles per packet of the flow path (key extraction, caches, execution into output
/// lists; no port I/O) for 1, 1 000, 100 000 and 1 000 000 flows through one rule (plus
/// two that never match), as bench/flows.sh's traffic. Run with
/// `cargo test --release -p ferrovs-datapath bench_flow_path -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_flow_path() {
    let pool = Pool::new(1024).unwrap();
    let rules: Vec<String> = [
        "priority=10,in_port=vm1,ip,nw_dst=10.0.0.2 actions=output:vm2",
        "priority=20,in_port=vm1,ip,nw_dst=10.200.0.1 actions=drop",
        "priority=15,in_port=vm1,udp,tp_dst=10 actions=drop",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Many short windows, the fastest counts: on a shared machine some run undisturbed.
    let bursts: u32 = std::env::var("FLOW_BENCH_BURSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let reps: u32 = std::env::var("FLOW_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let list: Vec<u32> = std::env::var("FLOW_BENCH_FLOWS")
        .unwrap_or_else(|_| "1 1000 100000 1000000".into())
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    for flows in list {
        let snap = switch(&rules);
        let mut fx = FlowCtx::default();
        let mut sc = Scratch::new();
        let frames: Vec<Vec<u8>> = (0..32).map(|i| frame(0x0a00_0001, 9, i)).collect();
        load(&mut sc, &pool, &frames);
        let bridge = snap.bridge(0).unwrap();
        let bf = bridge.flows.as_ref().unwrap();
        let inp = snap.port(0).unwrap();
        let mut next = 0u32;
        let mut best = u64::MAX;
        for rep in 0..reps + 20 {
            let t0 = ferrovs_sys::os::rdtsc();
            for _ in 0..bursts {
                for m in sc.batch.iter_mut() {
                    let src = 0x0a00_0001 + next;
                    next = (next + 1) % flows;
                    m.data_mut()[26..30].copy_from_slice(&src.to_be_bytes());
                }
                let b = Burst {
                    snap: &snap,
                    bridge,
                    inp,
                    pool: &pool,
                    now: 1,
                };
                let d = process(&b, bf, &mut sc, &mut fx);
                assert_eq!(d, 0);
                sc.reset_outputs();
            }
            let c = ferrovs_sys::os::rdtsc() - t0;
            // The first repetitions warm the caches up.
            if rep >= 20 {
                best = best.min(c);
            }
        }
        let cpp = best as f64 / (f64::from(bursts) * 32.0);
        println!(
            "flow path: {flows:>7} flows  {cpp:6.1} cycles/packet (best of {reps} x {bursts} bursts; {:?})",
            fx.counters
        );
    }
}

/// A rule with `meter:1` meters every packet, through upcalls and cache hits alike (the
/// megaflow carries the meter), grouped or not; an unmetered rule beside it is untouched; a
/// reconfigured meter takes effect on the next burst without a new pipeline; a deleted
/// meter lets everything through.
#[test]
fn metered_rules_meter_every_packet_through_both_caches() {
    use ferrovs_flow::meter::parse_meter;
    let pool = Pool::new(1024).unwrap();
    let snap = switch(&[
        "priority=100,in_port=vm1,udp,tp_dst=1 actions=meter:1,output:vm2".to_string(),
        "priority=100,in_port=vm1,udp,tp_dst=2 actions=output:vm3".to_string(),
    ]);
    let bf = snap.bridge(0).unwrap().flows.as_ref().unwrap();
    // One packet a second, a bucket of 10: a test's bursts see the bucket alone.
    bf.meters
        .set(&parse_meter("meter=1,pktps,burst,band=type=drop,rate=1,burst_size=10").unwrap());
    let frames: Vec<Vec<u8>> = (0..32)
        .map(|i| frame(0x0a00_0001, 1 + (i % 2) as u16, i))
        .collect();
    for (round, batch_outputs) in [true, false].into_iter().enumerate() {
        let mut fx = FlowCtx::default();
        fx.batch_outputs = batch_outputs;
        bf.meters
            .set(&parse_meter("meter=1,pktps,burst,band=type=drop,rate=1,burst_size=10").unwrap());
        // The first burst upcalls, the second hits the caches: 10 metered packets pass in
        // all, the first ten in order; every unmetered one passes.
        let (o1, d1) = burst(&snap, &pool, &mut fx, &frames);
        let (o2, d2) = burst(&snap, &pool, &mut fx, &frames);
        // (The megaflow cache is the bridge's: the second round finds it filled.)
        assert!(round == 1 || fx.counters.upcalls > 0);
        assert!(fx.counters.emc_hits + fx.counters.megaflow_hits > 0);
        let to = |o: &Outputs, p: u32| -> Vec<u32> {
            o.iter()
                .find(|(q, _)| *q == p)
                .map(|(_, f)| f.iter().map(|x| seq_of(x)).collect())
                .unwrap_or_default()
        };
        let vm2: Vec<u32> = to(&o1, 1).into_iter().chain(to(&o2, 1)).collect();
        assert_eq!(
            vm2,
            (0..20).step_by(2).collect::<Vec<u32>>(),
            "{batch_outputs}"
        );
        assert_eq!(to(&o1, 2).len() + to(&o2, 2).len(), 32);
        assert_eq!(d1 + d2, 22);
        // Meter drops count as flow drops of the input port.
        let drops = snap.port(0).unwrap().rx_drops.drops(DropReason::FlowDrop);
        assert_eq!(drops, 22 * (round as u64 + 1));
        let m = bf.meters.get(1).unwrap().counters();
        assert_eq!((m.packets, m.bands[0].0), (32, 22));
        // A new configuration, the same pipeline and cached megaflows: all 16 pass.
        bf.meters
            .set(&parse_meter("meter=1,pktps,burst,band=type=drop,rate=1,burst_size=100").unwrap());
        let (o3, d3) = burst(&snap, &pool, &mut fx, &frames);
        assert_eq!((to(&o3, 1).len(), d3), (16, 0));
        // Deleted: the megaflow's meter action lets everything through.
        bf.meters.remove(1);
        let (o4, d4) = burst(&snap, &pool, &mut fx, &frames);
        assert_eq!((to(&o4, 1).len(), d4), (16, 0));
    }
}
