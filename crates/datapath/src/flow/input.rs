//! One burst through the flow pipeline: keys, EMC, megaflow cache, upcalls, and the
//! execution of each packet's datapath actions.
//!
//! Packets are decided level by level (all EMC hits first, then megaflow hits, then upcalls),
//! so packets of different flows may leave in another order than they came; packets of one
//! key are always decided at the same level within a burst and keep their order.
//!
//! Executing actions: outputs add the packet *as it is at that point* to the output's list
//! (sent at the end of the burst). A modification after an output therefore works on a copy
//! (copy on write), so what was output earlier is sent unmodified. `Normal` runs the L2
//! learning decision on the packet then ([`crate::l2::decide`]): MAC learning stays per
//! packet, and cached flows never hold a learned port.
//!
//! Connection tracking: `ct` runs the bridge's [`ferrovs_conntrack::Tracker`] on the packet
//! (with NAT it rewrites the frame, so a queued packet is copied first). `ct(table=T)` ends
//! the packet's actions and hands it, with its key made again from its frame plus the
//! recirculation id and the tracker's `ct_*` verdict, to the next *pass*: after the burst's
//! pass, the recirculated packets go through EMC, megaflow cache, upcall and execution
//! together, at most [`MAX_PASSES`] passes (then dropped, `recirc_depth_exceeded`). Nothing
//! here allocates per packet (the recirculation slots are the [`FlowCtx`]'s, `BURST` of
//! them, made once); the tracker's shard mutex is the only lock taken. Its clock is the
//! burst's ([`ct_now_ms`]); the packet path never sweeps it.
//!
//! Tunnel metadata: a packet's starts as its key's (`tun_id`, `tun_src`, `tun_dst`,
//! `tun_metadataN`: what its tunnel port received, per packet). `set_tunnel`/`set_field` to
//! a tunnel field change a copy held by the execution (`TunState`), which goes with the
//! packet to an output port that takes it (a `key=flow` tunnel port: recorded once per
//! change in the burst's table, `output.rs`) and into a recirculated pass's key. A
//! packet that meets neither never builds it.

use std::sync::Arc;

use ferrovs_conntrack::tuple::Family;
use ferrovs_conntrack::{Commit, Nat, NatRange, Tracker};
use ferrovs_counters::DropReason;
use ferrovs_flow::ct::{recirc_id, CtAction, CtNat, NatKind};
use ferrovs_flow::{DpAction, Field, FlowKey, TunnelKey};
use ferrovs_vhost::virtqueue::BURST;

use super::emc::Emc;
use super::megaflow::Megaflow;
use super::{upcall, BridgeFlows, FlowCounters};
use crate::l2::{self, Classified, Decision};
use crate::meter::{self, MeterTable};
use crate::output::{add_output_tunnel, add_outputs, Burst, Scratch, NO_TUNNEL};
use crate::port::Port;

/// Per-PMD state of the flow path, allocated once.
#[derive(Debug)]
pub struct FlowCtx {
    pub emc: Emc,
    /// The keys of the pass being looked up, by slot (see [`process`]).
    keys: Vec<FlowKey>,
    hashes: Vec<u64>,
    misses: Vec<u16>,
    groups: Groups,
    /// The packets of the recirculation pass being executed (by slot).
    cur: Recirc,
    /// The packets the pass being executed recirculates: the next pass.
    next: Recirc,
    /// Execute output-only groups at once ([`execute_outputs`]); off: packet by packet with
    /// [`execute`] (the plain path, which tests compare the grouped one with).
    pub(crate) batch_outputs: bool,
    pub counters: FlowCounters,
}

impl Default for FlowCtx {
    fn default() -> Self {
        FlowCtx {
            emc: Emc::default(),
            keys: vec![FlowKey::default(); BURST],
            hashes: vec![0; BURST],
            misses: Vec::with_capacity(BURST),
            groups: Groups::default(),
            cur: Recirc::default(),
            next: Recirc::default(),
            batch_outputs: true,
            counters: FlowCounters::default(),
        }
    }
}

// `process` marks a burst's packets in a 64-bit mask.
const _: () = assert!(BURST <= 64);

/// Most passes one packet makes through the caches in a burst (the first and up to five
/// recirculations); a packet recirculated beyond is dropped (`recirc_depth_exceeded`), as
/// OVS drops at its recirculation depth limit.
pub const MAX_PASSES: usize = 6;

/// A packet's execution state carried into a later pass ([`Recirc`]).
mod carried {
    /// The packet is in an output list: a modification works on a copy.
    pub const QUEUED: u8 = 1;
    /// The packet went somewhere already: going nowhere later is no drop.
    pub const SENT: u8 = 2;
}

/// The packets one pass hands to the next (`ct(table=T)`), allocated once: slot `j` is
/// packet `pkts[j]` (an index of the [`Scratch`]) with key `keys[j]` (its frame after the
/// tracker, the recirculation id and the `ct_*` fields). A pass recirculates each of its
/// packets at most once (the actions end at a recirculating `ct`), so `BURST` slots hold
/// any pass. `carried` lists the few packets whose state is not the fresh one
/// ([`carried`]): a packet output before its `ct`.
#[derive(Debug)]
struct Recirc {
    pkts: Vec<u16>,
    keys: Vec<FlowKey>,
    carried: Vec<(u16, u8)>,
}

impl Default for Recirc {
    fn default() -> Self {
        Recirc {
            pkts: Vec::with_capacity(BURST),
            keys: vec![FlowKey::default(); BURST],
            carried: Vec::with_capacity(BURST),
        }
    }
}

impl Recirc {
    #[inline]
    fn clear(&mut self) {
        self.pkts.clear();
        self.carried.clear();
    }

    /// The carried state of packet `i` (0: fresh).
    #[inline]
    fn state_of(&self, i: u16) -> u8 {
        if self.carried.is_empty() {
            return 0;
        }
        self.carried
            .iter()
            .find(|(p, _)| *p == i)
            .map_or(0, |(_, s)| *s)
    }
}

/// Where a packet's execution hands a recirculation ([`FlowCtx`]'s next pass), and the state
/// the packet enters this pass with.
pub(crate) struct Exec<'x> {
    next: &'x mut Recirc,
    /// [`carried`] bits.
    state: u8,
    /// The packet's key in this pass (its tunnel metadata); `None`: a packet-out's, whose
    /// tunnel metadata is its input port's.
    key: Option<&'x FlowKey>,
}

impl Exec<'_> {
    /// The tunnel metadata the packet entered the actions with.
    #[inline]
    fn tunnel(&self, inp: &Port) -> TunnelKey {
        match self.key {
            Some(k) => TunnelKey::from_key(k),
            None => inp.tunnel_key().unwrap_or_default(),
        }
    }
}

/// A packet's tunnel metadata during its actions (see the module doc): built on first use.
struct TunState {
    cur: Option<TunnelKey>,
    /// `cur`'s index in the burst's table once recorded; [`NO_TUNNEL`]: not yet.
    idx: u16,
}

impl TunState {
    const NEW: TunState = TunState {
        cur: None,
        idx: NO_TUNNEL,
    };

    /// The metadata now (a copy).
    #[inline]
    fn get(&self, x: &Exec<'_>, inp: &Port) -> TunnelKey {
        self.cur.unwrap_or_else(|| x.tunnel(inp))
    }

    /// Changes the metadata with `f`.
    #[inline]
    fn change(&mut self, x: &Exec<'_>, inp: &Port, f: impl FnOnce(&mut TunnelKey)) {
        let t = self.cur.get_or_insert_with(|| x.tunnel(inp));
        f(t);
        self.idx = NO_TUNNEL;
    }

    /// The metadata's index in `sc`'s table for an output to `out` ([`NO_TUNNEL`] when `out`
    /// does not take it, or the table is full).
    #[inline]
    fn for_output(&mut self, sc: &mut Scratch<'_>, x: &Exec<'_>, inp: &Port, out: &Port) -> u16 {
        if !out.takes_tunnel_metadata() {
            return NO_TUNNEL;
        }
        if self.idx == NO_TUNNEL {
            let t = self.get(x, inp);
            match sc.push_tunnel(&t) {
                Some(i) => self.idx = i,
                None => out.rx_drops.drop(DropReason::NoMbuf, 1),
            }
        }
        self.idx
    }
}

/// A classification that makes no VLAN edit on output (OpenFlow outputs send the packet as
/// it is).
const AS_IS: Classified = Classified {
    vlan: 0,
    tagged: false,
    decision: Decision::Flood,
};

/// The connection tracker's clock for a burst at datapath time `now_s` (seconds of the
/// daemon's clock, which every PMD reads once per iteration): milliseconds, whole seconds
/// (the tracker's timeouts are whole seconds). Whoever sweeps the tracker uses the same
/// clock.
#[inline]
pub fn ct_now_ms(now_s: u32) -> u64 {
    u64::from(now_s) * 1000
}

/// Decides and queues for output every packet of `sc.batch` (received on `b.inp` of
/// `b.bridge`, whose rules are `bf`); returns how many were dropped.
///
/// Two phases (as OVS's `dfc_processing` / `packet_batch_per_flow_execute`): first every
/// packet is looked up, level by level, and joins the group of the megaflow that decided it;
/// then each group is executed: its megaflow's counters are added once, and actions that
/// only output the packet as it is ([`outputs_only`]) are resolved once for the whole group,
/// whose packets join each output's list together. Other actions run packet by packet, in
/// order.
///
/// That is one *pass*. Packets whose actions recirculate (`ct(table=T)`) come back with a
/// new key (the frame after the tracker, [`Field::RecircId`] and the `ct_*` fields) and go
/// through another pass — EMC, megaflow cache, upcall, execution — together, after the
/// whole burst's pass; at most [`MAX_PASSES`] passes.
pub(crate) fn process<'p>(
    b: &Burst<'_, 'p>,
    bf: &BridgeFlows,
    sc: &mut Scratch<'p>,
    fx: &mut FlowCtx,
) -> u64 {
    let inp = b.inp;
    let n = sc.batch.len();
    // Every port's rx_burst takes at most BURST packets (the scratch's packet indices rely
    // on it too).
    debug_assert!(n <= BURST);
    if sc.rx_tun.len() == n {
        // A tunnel port: each packet's own metadata (its VNI and options).
        for ((m, k), t) in sc.batch.iter().zip(fx.keys.iter_mut()).zip(&sc.rx_tun) {
            k.extract_into(m.data(), inp.id, Some(t));
        }
    } else {
        let tun = inp.tunnel_key();
        for (m, k) in sc.batch.iter().zip(fx.keys.iter_mut()) {
            k.extract_into(m.data(), inp.id, tun.as_ref());
        }
    }
    fx.counters.packets += n as u64;
    fx.next.clear();
    let mut dropped = pass(b, bf, sc, fx, n, false);
    let mut passes = 1;
    while !fx.next.pkts.is_empty() {
        dropped += recirculate(b, bf, sc, fx, passes);
        passes += 1;
    }
    dropped
}

/// Runs the packets the last pass recirculated through pass number `passes` (or drops them
/// beyond [`MAX_PASSES`]); returns how many were dropped.
#[cold]
#[inline(never)]
fn recirculate<'p>(
    b: &Burst<'_, 'p>,
    bf: &BridgeFlows,
    sc: &mut Scratch<'p>,
    fx: &mut FlowCtx,
    passes: usize,
) -> u64 {
    std::mem::swap(&mut fx.cur, &mut fx.next);
    std::mem::swap(&mut fx.keys, &mut fx.cur.keys);
    fx.next.clear();
    let m = fx.cur.pkts.len();
    if passes >= MAX_PASSES {
        // A packet output on an earlier pass went somewhere: not a drop.
        let sent = fx
            .cur
            .carried
            .iter()
            .filter(|(_, s)| s & carried::SENT != 0)
            .count();
        let n = (m - sent) as u64;
        b.inp.rx_drops.drop(DropReason::RecircDepth, n);
        fx.cur.clear();
        return n;
    }
    fx.counters.recirculations += m as u64;
    pass(b, bf, sc, fx, m, true)
}

/// One pass over `n` packets whose keys are `fx.keys[..n]`: slot `j` is packet `j` of the
/// burst (`recirc` false), or packet `fx.cur.pkts[j]` (a recirculation).
#[inline(always)]
fn pass<'p>(
    b: &Burst<'_, 'p>,
    bf: &BridgeFlows,
    sc: &mut Scratch<'p>,
    fx: &mut FlowCtx,
    n: usize,
    recirc: bool,
) -> u64 {
    let (inp, now) = (b.inp, b.now);
    let FlowCtx {
        emc,
        keys,
        hashes,
        misses,
        groups,
        cur,
        next,
        batch_outputs,
        counters,
    } = fx;
    misses.clear();
    groups.clear();
    // The size of slot j's packet.
    let len = |sc: &Scratch<'p>, j: usize| {
        if recirc {
            sc.at(usize::from(cur.pkts[j])).len()
        } else {
            sc.batch[j].len()
        }
    };
    let use_emc = !emc.bypass_burst();
    if use_emc {
        // Packets whose key equals the previous packet's (bit i): a burst is often runs of
        // one flow, and such a packet needs no hash and no lookup of its own. (Compared in a
        // pass of its own: right after extraction, the wide loads would wait for the narrow
        // stores.)
        let mut repeat = 0u64;
        for i in 0..n {
            if i > 0 && keys[i] == keys[i - 1] {
                repeat |= 1 << i;
                hashes[i] = hashes[i - 1];
                continue;
            }
            let h = keys[i].hash();
            hashes[i] = h;
            // The lookups below come after the whole burst's hashing: the slots' lines are
            // on their way meanwhile.
            emc.prefetch(h);
        }
        // 1. The exact-match cache. A repeated key has the previous packet's outcome (the
        // EMC does not change during this pass): the same group, or a miss.
        let (mut prev_group, mut hits) = (None, 0u64);
        for i in 0..n {
            let bytes = len(sc, i);
            if repeat & (1 << i) != 0 {
                match prev_group {
                    Some(g) => {
                        hits += 1;
                        groups.add_at(g, i, bytes);
                    }
                    None => misses.push(i as u16),
                }
                continue;
            }
            match emc.lookup(&keys[i], hashes[i], inp.bridge) {
                Some(f) => {
                    hits += 1;
                    prev_group = Some(groups.add(f, i, bytes));
                }
                None => {
                    prev_group = None;
                    misses.push(i as u16);
                }
            }
        }
        counters.emc_hits += hits;
        // Repeated keys count as lookups that hit or missed like the previous one.
        emc.account(n as u64, hits);
    } else {
        counters.emc_skipped += n as u64;
        misses.extend(0..n as u16);
    }
    if !misses.is_empty() {
        // 2. The megaflow cache, read-locked once for the burst.
        let mf = bf.cache.read();
        let mut st_hits = SubtableHits::default();
        let mut left = 0;
        for m in 0..misses.len() {
            let i = misses[m] as usize;
            match mf.lookup_uncounted(&keys[i]) {
                Some((st, f)) => {
                    counters.megaflow_hits += 1;
                    st_hits.add(&mf, st);
                    groups.add(f, i, len(sc, i));
                    if use_emc {
                        counters.emc_inserts += emc.maybe_insert(&keys[i], hashes[i], f) as u64;
                    }
                }
                None => {
                    misses[left] = i as u16;
                    left += 1;
                }
            }
        }
        st_hits.flush(&mf);
        drop(mf);
        misses.truncate(left);
        // 3. Upcalls.
        for &i in misses.iter() {
            let i = i as usize;
            let (f, translated) = upcall::resolve(bf, &keys[i], now);
            if translated {
                counters.upcalls += 1;
            } else {
                counters.megaflow_hits += 1;
            }
            groups.add(&f, i, len(sc, i));
            if use_emc {
                counters.emc_inserts += emc.maybe_insert(&keys[i], hashes[i], &f) as u64;
            }
        }
    }
    // Execution, group by group (in the order the groups were made). The keys are read
    // only for their tunnel metadata (a packet whose actions touch it); recirculations
    // write the next pass's into `next.keys`.
    let mut dropped = 0u64;
    for g in groups.list[..groups.len].iter_mut() {
        let Some(f) = g.flow.take() else { continue };
        f.hit(g.pkts.len() as u64, g.bytes, now);
        if recirc {
            // Slots to packets.
            for p in g.pkts.iter_mut() {
                *p = cur.pkts[usize::from(*p)];
            }
        }
        let mut actions: &[DpAction] = &f.actions;
        // A meter first (the usual place of OpenFlow's meter instruction) meters the whole
        // group at once; the packets it drops take no further action.
        if let Some(&DpAction::Meter(id)) = actions.first() {
            actions = &actions[1..];
            dropped += meter_group(b, sc, &mut g.pkts, &bf.meters, id);
            if g.pkts.is_empty() {
                continue;
            }
        }
        if *batch_outputs && cur.carried.is_empty() && outputs_only(actions) {
            dropped += execute_outputs(b, sc, &g.pkts, actions);
        } else {
            for &i in &g.pkts {
                let (state, slot) = if recirc {
                    let slot = cur.pkts.iter().position(|&p| p == i).unwrap_or(0);
                    (cur.state_of(i), slot)
                } else {
                    (0, usize::from(i))
                };
                let mut x = Exec {
                    next,
                    state,
                    key: keys.get(slot),
                };
                dropped += execute_in(b, sc, i as usize, actions, &mut x);
            }
        }
    }
    groups.len = 0;
    if recirc {
        cur.clear();
    }
    dropped
}

/// Runs the packets `pkts` of one group through meter `id` of `meters` and removes from
/// `pkts` those a band dropped (counted as `flow_drop` on the input port); returns how many.
/// A meter that does not exist (deleted since the megaflow was made) passes everything, as
/// OVS's datapath does.
fn meter_group(
    b: &Burst<'_, '_>,
    sc: &Scratch<'_>,
    pkts: &mut Vec<u16>,
    meters: &MeterTable,
    id: u32,
) -> u64 {
    let Some(m) = meters.get(id) else { return 0 };
    let mut sizes = [0u32; BURST];
    let n = pkts.len().min(BURST);
    for (s, &i) in sizes.iter_mut().zip(pkts.iter()) {
        *s = sc.at(usize::from(i)).len() as u32;
    }
    let drop = m.run(meter::now_ms(), &sizes[..n]);
    if drop == 0 {
        return 0;
    }
    let mut k = 0;
    pkts.retain(|_| {
        let keep = drop & (1 << k) == 0;
        k += 1;
        keep
    });
    let n = u64::from(drop.count_ones());
    b.inp.rx_drops.drop(DropReason::FlowDrop, n);
    n
}

/// Packets of one burst decided by one megaflow, in arrival order.
#[derive(Debug)]
struct Group {
    flow: Option<Arc<Megaflow>>,
    pkts: Vec<u16>,
    bytes: u64,
}

/// A burst's groups (allocated once, `BURST` of them).
#[derive(Debug)]
struct Groups {
    list: Vec<Group>,
    len: usize,
}

impl Default for Groups {
    fn default() -> Self {
        Groups {
            list: (0..BURST)
                .map(|_| Group {
                    flow: None,
                    pkts: Vec::with_capacity(BURST),
                    bytes: 0,
                })
                .collect(),
            len: 0,
        }
    }
}

/// How many of the latest groups a packet's megaflow is looked for in before it starts a
/// group of its own (bounds the search when a burst holds many megaflows; a later group of
/// the same megaflow is executed later, so order within a flow holds either way).
const GROUP_SEARCH: usize = 8;

impl Groups {
    fn clear(&mut self) {
        for g in &mut self.list[..self.len] {
            g.flow = None;
        }
        self.len = 0;
    }

    /// Adds packet `i` (of `bytes` bytes) to the latest group of `f`, or to a new one;
    /// returns the group's index.
    #[inline(always)]
    fn add(&mut self, f: &Arc<Megaflow>, i: usize, bytes: usize) -> usize {
        let n = self.len;
        let same = |g: &Group| g.flow.as_ref().is_some_and(|x| Arc::ptr_eq(x, f));
        let g = match self.list[n.saturating_sub(GROUP_SEARCH)..n]
            .iter()
            .rposition(same)
        {
            Some(k) => n.saturating_sub(GROUP_SEARCH) + k,
            None => {
                // At most one group per packet, so there is always room.
                let g = &mut self.list[n];
                g.flow = Some(f.clone());
                g.pkts.clear();
                g.bytes = 0;
                self.len += 1;
                n
            }
        };
        self.add_at(g, i, bytes);
        g
    }

    /// Adds packet `i` (of `bytes` bytes) to group `g`.
    #[inline(always)]
    fn add_at(&mut self, g: usize, i: usize, bytes: usize) {
        let g = &mut self.list[g];
        g.pkts.push(i as u16);
        g.bytes += bytes as u64;
    }
}

/// A burst's hits on megaflow subtables, added to a subtable's shared counter once per run
/// of hits on that subtable (not one atomic addition per packet).
#[derive(Default)]
struct SubtableHits {
    subtable: usize,
    n: u64,
}

impl SubtableHits {
    #[inline]
    fn add(&mut self, mf: &super::megaflow::Subtables, st: usize) {
        if self.n > 0 && self.subtable != st {
            self.flush(mf);
        }
        self.subtable = st;
        self.n += 1;
    }

    #[inline]
    fn flush(&mut self, mf: &super::megaflow::Subtables) {
        if self.n > 0 {
            mf.count_hits(self.subtable, self.n);
            self.n = 0;
        }
    }
}

/// Whether `actions` only send the packet as it is, each port at most once, or send it
/// nowhere: one output, one `in_port` or one `flood`, or outputs to distinct ports; no
/// rewrite, no tunnel metadata (a flow-based tunnel port takes it per packet), no `Normal`.
/// Such actions can be executed for a whole group at once ([`execute_outputs`]) with the
/// same result on every port's list as packet by packet. (A port named twice would get the
/// group twice in a row instead of each packet twice in a row: left to [`execute`].)
#[inline]
fn outputs_only(actions: &[DpAction]) -> bool {
    let mut sends = 0;
    for (i, a) in actions.iter().enumerate() {
        match a {
            DpAction::Output(p) => {
                sends += 1;
                if actions[..i].contains(&DpAction::Output(*p)) {
                    return false;
                }
            }
            DpAction::InPort | DpAction::Flood => sends += 2,
            _ => return false,
        }
    }
    // An `in_port` or a `flood` only alone.
    sends <= 2
        || actions
            .iter()
            .all(|a| !matches!(a, DpAction::InPort | DpAction::Flood))
}

/// Executes [`outputs_only`] `actions` on every packet of `pkts` (one group): each output
/// port is resolved once and gets the packets in their order. Returns how many went nowhere
/// (counted as `flow_drop`). The same outcome as [`execute`] packet by packet: no action
/// changes a packet, so the order of ports does not matter to what each port receives.
fn execute_outputs<'p>(
    b: &Burst<'_, 'p>,
    sc: &mut Scratch<'p>,
    pkts: &[u16],
    actions: &[DpAction],
) -> u64 {
    let Burst {
        snap,
        bridge,
        inp,
        pool,
        ..
    } = *b;
    let mut sent = false;
    for a in actions {
        match *a {
            DpAction::Output(p) => {
                if let Some(out) = snap.port(p).filter(|o| o.bridge == inp.bridge) {
                    if out.id != inp.id {
                        add_outputs(sc, pool, pkts, inp, out);
                        sent = true;
                    }
                }
            }
            DpAction::InPort => {
                add_outputs(sc, pool, pkts, inp, inp);
                sent = true;
            }
            DpAction::Flood => {
                for &p in &bridge.ports {
                    if p == inp.id {
                        continue;
                    }
                    if let Some(out) = snap.port(p) {
                        add_outputs(sc, pool, pkts, inp, out);
                        sent = true;
                    }
                }
            }
            _ => {}
        }
    }
    if sent {
        return 0;
    }
    inp.rx_drops.drop(DropReason::FlowDrop, pkts.len() as u64);
    pkts.len() as u64
}

/// Executes `actions` on packet `i` outside a burst's pass (a packet-out's own actions),
/// then the passes of its recirculations if they have any; returns 1 if the packet went
/// nowhere, else 0.
pub(crate) fn execute_actions<'p>(
    b: &Burst<'_, 'p>,
    sc: &mut Scratch<'p>,
    fx: &mut FlowCtx,
    i: usize,
    actions: &[DpAction],
) -> u64 {
    fx.next.clear();
    let mut x = Exec {
        next: &mut fx.next,
        state: 0,
        key: None,
    };
    let mut dropped = execute_in(b, sc, i, actions, &mut x);
    if let Some(bf) = b.bridge.flows.as_ref() {
        let mut passes = 1;
        while !fx.next.pkts.is_empty() {
            dropped += recirculate(b, bf, sc, fx, passes);
            passes += 1;
        }
    }
    fx.next.clear();
    dropped
}

/// [`execute_in`] for a packet that recirculates nowhere (tests' reference path).
#[cfg(test)]
pub(crate) fn execute<'p>(
    b: &Burst<'_, 'p>,
    sc: &mut Scratch<'p>,
    i: usize,
    actions: &[DpAction],
) -> u64 {
    let mut next = Recirc::default();
    execute_in(
        b,
        sc,
        i,
        actions,
        &mut Exec {
            next: &mut next,
            state: 0,
            key: None,
        },
    )
}

/// Executes `actions` on packet `i` (in the state `x.state` an earlier pass left it in);
/// returns 1 if the packet went nowhere (counted as a `flow_drop`, or by the reason
/// `Normal` gave), else 0. A recirculating `ct` hands the packet to `x.next` and ends the
/// actions (the packet is then neither sent nor dropped yet: 0).
#[inline]
pub(crate) fn execute_in<'p>(
    b: &Burst<'_, 'p>,
    sc: &mut Scratch<'p>,
    i: usize,
    actions: &[DpAction],
    x: &mut Exec<'_>,
) -> u64 {
    let Burst {
        snap,
        bridge,
        inp,
        pool,
        now,
    } = *b;
    let mut cur = i;
    // `cur` is in an output list: modify a copy from now on.
    let mut queued = x.state & carried::QUEUED != 0;
    let mut sent = x.state & carried::SENT != 0;
    let mut normal_drop = None;
    let mut ts = TunState::NEW;
    // A length check is last in its list: its branch replaces the rest (see
    // `ferrovs_flow::CheckPktLen`).
    let mut list = actions;
    let mut k = 0;
    while let Some(a) = list.get(k) {
        k += 1;
        match *a {
            DpAction::CheckPktLen(ref c) => {
                list = if check_len(sc.at(cur)) > usize::from(c.len) {
                    &c.larger
                } else {
                    &c.smaller
                };
                k = 0;
            }
            DpAction::Output(p) => {
                if let Some(out) = snap.port(p).filter(|o| o.bridge == inp.bridge) {
                    if out.id != inp.id {
                        let t = ts.for_output(sc, x, inp, out);
                        add_output_tunnel(sc, pool, cur, &AS_IS, inp, out, t);
                        queued = true;
                        sent = true;
                    }
                }
            }
            DpAction::InPort => {
                let t = ts.for_output(sc, x, inp, inp);
                add_output_tunnel(sc, pool, cur, &AS_IS, inp, inp, t);
                queued = true;
                sent = true;
            }
            DpAction::Flood => {
                for &p in &bridge.ports {
                    if p == inp.id {
                        continue;
                    }
                    if let Some(out) = snap.port(p) {
                        let t = ts.for_output(sc, x, inp, out);
                        add_output_tunnel(sc, pool, cur, &AS_IS, inp, out, t);
                        queued = true;
                        sent = true;
                    }
                }
            }
            DpAction::Normal => {
                let c = l2::decide(snap, bridge, inp, sc.at(cur).data(), now);
                match c.decision {
                    Decision::Drop(r) => normal_drop = Some(r),
                    Decision::Unicast(p) => {
                        if let Some(out) = snap.port(p) {
                            let t = ts.for_output(sc, x, inp, out);
                            add_output_tunnel(sc, pool, cur, &c, inp, out, t);
                            queued = true;
                            sent = true;
                        }
                    }
                    Decision::Flood => {
                        for &p in &bridge.ports {
                            if p == inp.id {
                                continue;
                            }
                            if let Some(out) = snap.port(p).filter(|o| o.vlan.carries(c.vlan)) {
                                let t = ts.for_output(sc, x, inp, out);
                                add_output_tunnel(sc, pool, cur, &c, inp, out, t);
                                queued = true;
                                sent = true;
                            }
                        }
                    }
                }
            }
            DpAction::SetField(..)
            | DpAction::PushVlan { .. }
            | DpAction::SetVlanTci { .. }
            | DpAction::PopVlan
            | DpAction::PushMpls { .. }
            | DpAction::PopMpls { .. } => {
                if queued {
                    match sc.copy(pool, cur) {
                        Some(c) => cur = c,
                        None => {
                            inp.rx_drops.drop(DropReason::NoMbuf, 1);
                            return (!sent) as u64;
                        }
                    }
                    queued = false;
                }
                modify(sc, cur, a);
            }
            // Tunnel metadata: what a flow-based tunnel port sends with.
            DpAction::SetTunnel { id } => ts.change(x, inp, |t| t.id = id),
            DpAction::SetTunnelDst(ip) => ts.change(x, inp, |t| t.dst = ip),
            DpAction::SetTunnelMetadata { index, value } => ts.change(x, inp, |t| {
                if let Some(m) = t.meta.get_mut(usize::from(index)) {
                    *m = value;
                    t.present |= 1 << index;
                }
            }),
            // A meter after other actions (a later table's rule): this packet alone.
            DpAction::Meter(id) => {
                let m = bridge.flows.as_ref().and_then(|f| f.meters.get(id));
                if let Some(m) = m {
                    let len = sc.at(cur).len() as u32;
                    if m.run(meter::now_ms(), &[len]) != 0 {
                        break;
                    }
                }
            }
            DpAction::Controller(ref c) => {
                // `controller(meter_id=N)` (OVN's CoPP): meter N decides whether this copy
                // goes up; one it drops is counted in the meter's band, and the packet
                // itself goes on with the later actions.
                if let Some(id) = c.meter_id {
                    let m = bridge.flows.as_ref().and_then(|f| f.meters.get(id));
                    if let Some(m) = m {
                        let len = sc.at(cur).len() as u32;
                        if m.run(meter::now_ms(), &[len]) != 0 {
                            continue;
                        }
                    }
                }
                // The packet as it is now (the edits so far), to the control thread.
                if let Some(q) = bridge.flows.as_ref().and_then(|f| f.packet_in.as_ref()) {
                    let tun = ts.get(x, inp).id;
                    q.push(inp.bridge, inp.id, tun, sc.at(cur).data(), c.clone());
                }
                sent = true;
            }
            DpAction::Ct(ref c) => {
                let Some(bf) = bridge.flows.as_ref() else {
                    break;
                };
                // NAT may rewrite the frame: a queued packet is copied first.
                if queued && c.nat != CtNat::Off {
                    match sc.copy(pool, cur) {
                        Some(k) => cur = k,
                        None => {
                            inp.rx_drops.drop(DropReason::NoMbuf, 1);
                            return (!sent) as u64;
                        }
                    }
                    queued = false;
                }
                let r = conntrack(&bf.conntrack, sc, cur, c, now);
                if let Some(t) = c.recirc {
                    let state = if queued { carried::QUEUED } else { 0 }
                        | if sent { carried::SENT } else { 0 };
                    let tun = ts.get(x, inp);
                    if !x.push(sc, inp, cur, c, t, &r, state, &tun) {
                        // No slot left (cannot happen: one recirculation per packet and
                        // pass): counted as too deep.
                        inp.rx_drops.drop(DropReason::RecircDepth, 1);
                        return (!sent) as u64;
                    }
                    return 0;
                }
            }
            // The packet's ct metadata lives only in the key of a recirculated pass, which
            // the next `ct` makes afresh: nothing to execute.
            DpAction::CtClear => {}
        }
    }
    if sent {
        return 0;
    }
    inp.rx_drops
        .drop(normal_drop.unwrap_or(DropReason::FlowDrop), 1);
    1
}

/// The length `check_pkt_larger` compares (ovs-actions(7)): the L2 frame as it is now,
/// without its VLAN tags (the frame holds no FCS); for a TSO packet (one large TCP segment
/// the next hop cuts), that of its largest segment: its headers and `gso_size` bytes.
fn check_len(m: &ferrovs_sys::pool::Mbuf<'_>) -> usize {
    let d = m.data();
    let mut tags = 0;
    while d
        .get(12 + 4 * tags..14 + 4 * tags)
        .is_some_and(|t| matches!(u16::from_be_bytes([t[0], t[1]]), 0x8100 | 0x88a8))
    {
        tags += 1;
    }
    let mut len = d.len() - (4 * tags).min(d.len());
    let v = &m.vnet;
    if v.gso() != ferrovs_sys::kernel::vnet::GSO_NONE && v.gso_size > 0 {
        // The TCP header's length from its data offset (csum_start is where it starts).
        let l4 = usize::from(v.csum_start);
        let th = d.get(l4 + 12).map_or(20, |b| usize::from(b >> 4) * 4);
        len = len.min((l4 + th + usize::from(v.gso_size)).saturating_sub(4 * tags));
    }
    len
}

/// Runs packet `i` through the tracker for `c` at datapath time `now` (seconds): with
/// NAT, the frame is rewritten in place. A packet with a partial L4 checksum (checksum
/// offload) is tracked without verifying it, and NAT keeps it partial.
fn conntrack(
    t: &Tracker,
    sc: &mut Scratch<'_>,
    i: usize,
    c: &CtAction,
    now: u32,
) -> ferrovs_conntrack::CtResult {
    let commit = Commit {
        commit: c.commit,
        mark: c.mark,
        label: c.label,
    };
    let now = ct_now_ms(now);
    let m = sc.at_mut(i);
    let partial = m.vnet.needs_csum();
    if c.force && c.commit {
        t.end_reply_conn(m.data(), c.zone, partial);
    }
    let nat = match c.nat {
        CtNat::Off => Nat::Off,
        // nat(src)/nat(dst) without a range: the identity binding, as plain nat.
        CtNat::Apply | CtNat::Kind(_) => Nat::Apply,
        CtNat::Bind(n) => Nat::Bind(NatRange {
            kind: match n.kind {
                NatKind::Src => ferrovs_conntrack::NatKind::Src,
                NatKind::Dst => ferrovs_conntrack::NatKind::Dst,
            },
            addr_min: n.addr_min,
            addr_max: n.addr_max,
            ports: n.ports,
        }),
    };
    if nat == Nat::Off && !partial {
        // Nothing to rewrite: the frame stays shared.
        return t.execute_with(m.data(), c.zone, &commit, now);
    }
    t.execute_offloaded(m.data_mut(), c.zone, &commit, &nat, now, partial)
}

impl Exec<'_> {
    /// Hands packet `i` (in `state`) to the next pass, its key made from its frame as it is
    /// now, the input port it came from and its tunnel metadata `tun` as the actions left
    /// it, the metadata the translation had reached, the recirculation id of table `t` and
    /// the tracker's verdict `r`. False when the next pass is full.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        sc: &Scratch<'_>,
        inp: &crate::port::Port,
        i: usize,
        c: &CtAction,
        t: u8,
        r: &ferrovs_conntrack::CtResult,
        state: u8,
        tun: &TunnelKey,
    ) -> bool {
        let n = &mut *self.next;
        let j = n.pkts.len();
        if j >= BURST {
            return false;
        }
        let k = &mut n.keys[j];
        let tun = (*tun != TunnelKey::default()).then_some(tun);
        k.extract_into(sc.at(i).data(), inp.id, tun);
        set_ct_fields(k, c, t, r);
        n.pkts.push(i as u16);
        if state != 0 {
            n.carried.push((i as u16, state));
        }
        true
    }
}

/// The fields a recirculated key takes from the pipeline and the tracker (see
/// [`ferrovs_flow::ct`]): the metadata and registers, the recirculation id of table `t`, `ct_state`,
/// `ct_zone`, `ct_mark`, `ct_label` and the connection's original-direction tuple
/// (`ct_nw_src`/`ct_nw_dst` for IPv4 only; ICMP's `ct_tp_src`/`ct_tp_dst` are its type and
/// code).
#[inline]
pub fn set_ct_fields(k: &mut FlowKey, c: &CtAction, t: u8, r: &ferrovs_conntrack::CtResult) {
    c.freeze_into(k);
    k.set(Field::RecircId, u128::from(recirc_id(t)));
    k.set(Field::CtState, u128::from(r.state.0));
    k.set(Field::CtZone, u128::from(r.zone));
    k.set(Field::CtMark, u128::from(r.mark));
    k.set(Field::CtLabel, r.label);
    if let Some(o) = &r.orig {
        k.set(Field::CtNwProto, u128::from(o.proto));
        if o.family == Family::V4 {
            let a = |b: &[u8; 16]| u128::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            k.set(Field::CtNwSrc, a(&o.src));
            k.set(Field::CtNwDst, a(&o.dst));
        }
        let (sp, dp) = if o.is_icmp() {
            (o.dport >> 8, o.dport & 0xff)
        } else {
            (o.sport, o.dport)
        };
        k.set(Field::CtTpSrc, u128::from(sp));
        k.set(Field::CtTpDst, u128::from(dp));
    }
}

/// Applies one modifying action to packet `i` in place. A packet without the header the
/// action edits is left as it is (as OVS does: the rule's match normally guarantees it).
fn modify(sc: &mut Scratch<'_>, i: usize, a: &DpAction) {
    let m = sc.at_mut(i);
    match *a {
        DpAction::SetField(f, v) => {
            let partial = m.vnet.needs_csum();
            let _ = ferrovs_flow::edit::set_field(m.data_mut(), f, v, partial);
        }
        DpAction::PushVlan { tci, tpid } => push_vlan(m, tci, tpid),
        DpAction::SetVlanTci { tci } => {
            let d = m.data_mut();
            if d.len() >= 18 && is_tag(d) {
                d[14..16].copy_from_slice(&wire_tci(tci).to_be_bytes());
            } else {
                push_vlan(m, tci, 0x8100);
            }
        }
        DpAction::PopVlan => {
            let d = m.data_mut();
            if d.len() >= 18 && is_tag(d) {
                ferrovs_packet::pop_vlan_in_place(d);
                m.pull_front(4);
                m.vnet = shift_vnet(m.vnet, -4);
            }
        }
        DpAction::PushMpls { ethertype, lse } => {
            // A 4-byte shim after the MAC addresses and VLAN tags (a frame cut before its
            // Ethertype is left as it is).
            if ferrovs_flow::edit::ethertype_at(m.data()).is_none() || m.push_front(4).is_none() {
                return;
            }
            if ferrovs_flow::edit::push_mpls_in_place(m.data_mut(), ethertype, lse) {
                m.vnet = shift_vnet(m.vnet, 4);
            }
        }
        DpAction::PopMpls { ethertype } => pop_mpls(m, ethertype),
        _ => {}
    }
}

/// The 802.1Q TCI on the wire for an OpenFlow `vlan_tci` (whose 0x1000 bit means "tagged").
#[inline]
fn wire_tci(tci: u16) -> u16 {
    tci & !0x1000
}

/// Removes the top MPLS entry of an MPLS frame (others are left as they are).
fn pop_mpls(m: &mut ferrovs_sys::pool::Mbuf<'_>, ethertype: u16) {
    if ferrovs_flow::edit::pop_mpls_in_place(m.data_mut(), ethertype) {
        m.pull_front(4);
        m.vnet = shift_vnet(m.vnet, -4);
    }
}

/// Whether the frame's outer Ethertype is a VLAN tag: 802.1Q, or 802.1ad (which only a
/// `push_vlan:0x88a8` puts there; the 802.1Q check comes first and decides the common case).
#[inline]
fn is_tag(d: &[u8]) -> bool {
    d[12..14] == [0x81, 0x00] || d[12..14] == [0x88, 0xa8]
}

/// Pushes a tag with TPID `tpid` (0x8100 or 0x88a8) and TCI `tci`.
fn push_vlan(m: &mut ferrovs_sys::pool::Mbuf<'_>, tci: u16, tpid: u16) {
    if m.len() < 14 || m.push_front(4).is_none() {
        return;
    }
    let d = m.data_mut();
    ferrovs_packet::push_vlan_in_place(d, 0);
    d[12..14].copy_from_slice(&tpid.to_be_bytes());
    d[14..16].copy_from_slice(&wire_tci(tci).to_be_bytes());
    m.vnet = shift_vnet(m.vnet, 4);
}

/// Offload offsets after a VLAN tag was pushed (+4) or popped (-4).
fn shift_vnet(
    mut h: ferrovs_sys::kernel::vnet::VnetHdr,
    d: i32,
) -> ferrovs_sys::kernel::vnet::VnetHdr {
    if h.is_offload() {
        h.csum_start = (i32::from(h.csum_start) + d).max(0) as u16;
        h.hdr_len = (i32::from(h.hdr_len) + d).max(0) as u16;
    }
    h
}
