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

use std::sync::Arc;

use ferrovs_flow::{DpAction, FlowKey};
use ferrovs_sys::pool::Pool;
use ferrovs_vhost::stats::DropReason;
use ferrovs_vhost::virtqueue::BURST;

use super::emc::Emc;
use super::megaflow::Megaflow;
use super::{upcall, BridgeFlows, FlowCounters};
use crate::l2::{self, Classified, Decision};
use crate::pmd::{add_output, Scratch};
use crate::port::Port;
use crate::{Bridge, Snapshot};

/// Per-PMD state of the flow path, allocated once.
#[derive(Debug)]
pub struct FlowCtx {
    pub emc: Emc,
    keys: Vec<FlowKey>,
    hashes: Vec<u64>,
    misses: Vec<u16>,
    pub counters: FlowCounters,
}

impl Default for FlowCtx {
    fn default() -> Self {
        FlowCtx {
            emc: Emc::default(),
            keys: Vec::with_capacity(BURST),
            hashes: Vec::with_capacity(BURST),
            misses: Vec::with_capacity(BURST),
            counters: FlowCounters::default(),
        }
    }
}

/// A classification that makes no VLAN edit on output (OpenFlow outputs send the packet as
/// it is).
const AS_IS: Classified = Classified {
    vlan: 0,
    tagged: false,
    decision: Decision::Flood,
};

/// Decides and queues for output every packet of `sc.batch` (received on `inp` of
/// `bridge`); returns how many were dropped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn process<'p>(
    snap: &Snapshot,
    bridge: &Bridge,
    bf: &BridgeFlows,
    inp: &Port,
    pool: &'p Pool,
    sc: &mut Scratch<'p>,
    fx: &mut FlowCtx,
    now: u32,
) -> u64 {
    let n = sc.batch.len();
    let FlowCtx {
        emc,
        keys,
        hashes,
        misses,
        counters,
    } = fx;
    keys.clear();
    hashes.clear();
    misses.clear();
    let tun = inp.tunnel_key();
    for m in &sc.batch {
        let k = FlowKey::extract(m.data(), inp.id, tun.as_ref());
        hashes.push(k.hash());
        keys.push(k);
    }
    counters.packets += n as u64;
    let mut dropped = 0u64;
    let mut hits = Hits::default();
    // 1. The exact-match cache.
    for i in 0..n {
        match emc.lookup(&keys[i], hashes[i], inp.bridge) {
            Some(f) => {
                counters.emc_hits += 1;
                hits.add(f, sc.batch[i].len() as u64, now);
                dropped += execute(snap, bridge, inp, pool, sc, i, &f.actions, now);
            }
            None => misses.push(i as u16),
        }
    }
    if misses.is_empty() {
        hits.flush(now);
        return dropped;
    }
    // 2. The megaflow cache, read-locked once for the burst.
    {
        let mf = bf.cache.read();
        let mut left = 0;
        for m in 0..misses.len() {
            let i = misses[m] as usize;
            match mf.lookup(&keys[i]) {
                Some(f) => {
                    counters.megaflow_hits += 1;
                    hits.add(f, sc.batch[i].len() as u64, now);
                    dropped += execute(snap, bridge, inp, pool, sc, i, &f.actions, now);
                    counters.emc_inserts += emc.maybe_insert(&keys[i], hashes[i], f) as u64;
                }
                None => {
                    misses[left] = i as u16;
                    left += 1;
                }
            }
        }
        misses.truncate(left);
    }
    // 3. Upcalls.
    for &i in misses.iter() {
        let i = i as usize;
        let (f, translated) = upcall::resolve(bf, &keys[i], now);
        if translated {
            counters.upcalls += 1;
        } else {
            counters.megaflow_hits += 1;
        }
        hits.add(&f, sc.batch[i].len() as u64, now);
        dropped += execute(snap, bridge, inp, pool, sc, i, &f.actions, now);
        counters.emc_inserts += emc.maybe_insert(&keys[i], hashes[i], &f) as u64;
    }
    hits.flush(now);
    dropped
}

/// A burst's hits on megaflows, added to an entry's shared counters once per run of packets
/// of that entry (not two atomic additions per packet).
#[derive(Default)]
struct Hits {
    flow: Option<Arc<Megaflow>>,
    packets: u64,
    bytes: u64,
}

impl Hits {
    #[inline]
    fn add(&mut self, f: &Arc<Megaflow>, bytes: u64, now: u32) {
        match &self.flow {
            Some(x) if Arc::ptr_eq(x, f) => {}
            _ => {
                self.flush(now);
                self.flow = Some(f.clone());
            }
        }
        self.packets += 1;
        self.bytes += bytes;
    }

    #[inline]
    fn flush(&mut self, now: u32) {
        if let Some(f) = self.flow.take() {
            f.hit(self.packets, self.bytes, now);
        }
        self.packets = 0;
        self.bytes = 0;
    }
}

/// Executes `actions` on packet `i`; returns 1 if the packet went nowhere (counted as a
/// `flow_drop`, or by the reason `Normal` gave), else 0.
#[allow(clippy::too_many_arguments)]
#[inline]
fn execute<'p>(
    snap: &Snapshot,
    bridge: &Bridge,
    inp: &Port,
    pool: &'p Pool,
    sc: &mut Scratch<'p>,
    i: usize,
    actions: &[DpAction],
    now: u32,
) -> u64 {
    let mut cur = i;
    // `cur` is in an output list: modify a copy from now on.
    let mut queued = false;
    let mut sent = false;
    let mut normal_drop = None;
    for a in actions {
        match *a {
            DpAction::Output(p) => {
                if let Some(out) = snap.port(p).filter(|o| o.bridge == inp.bridge) {
                    if out.id != inp.id {
                        add_output(sc, pool, cur, &AS_IS, inp, out);
                        queued = true;
                        sent = true;
                    }
                }
            }
            DpAction::InPort => {
                add_output(sc, pool, cur, &AS_IS, inp, inp);
                queued = true;
                sent = true;
            }
            DpAction::Flood => {
                for &p in &bridge.ports {
                    if p == inp.id {
                        continue;
                    }
                    if let Some(out) = snap.port(p) {
                        add_output(sc, pool, cur, &AS_IS, inp, out);
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
                            add_output(sc, pool, cur, &c, inp, out);
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
                                add_output(sc, pool, cur, &c, inp, out);
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
            | DpAction::PopVlan => {
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
            // Tunnel metadata: used by tunnel ports.
            DpAction::SetTunnel { .. } | DpAction::SetTunnelDst(_) => {}
        }
    }
    if sent {
        return 0;
    }
    inp.rx_drops
        .drop(normal_drop.unwrap_or(DropReason::FlowDrop), 1);
    1
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
        DpAction::PushVlan { tci } => push_vlan(m, tci),
        DpAction::SetVlanTci { tci } => {
            let d = m.data_mut();
            if d.len() >= 18 && d[12..14] == [0x81, 0x00] {
                d[14..16].copy_from_slice(&wire_tci(tci).to_be_bytes());
            } else {
                push_vlan(m, tci);
            }
        }
        DpAction::PopVlan => {
            let d = m.data_mut();
            if d.len() >= 18 && d[12..14] == [0x81, 0x00] {
                ferrovs_packet::pop_vlan_in_place(d);
                m.pull_front(4);
                m.vnet = shift_vnet(m.vnet, -4);
            }
        }
        _ => {}
    }
}

/// The 802.1Q TCI on the wire for an OpenFlow `vlan_tci` (whose 0x1000 bit means "tagged").
#[inline]
fn wire_tci(tci: u16) -> u16 {
    tci & !0x1000
}

fn push_vlan(m: &mut ferrovs_sys::pool::Mbuf<'_>, tci: u16) {
    if m.len() < 14 || m.push_front(4).is_none() {
        return;
    }
    let d = m.data_mut();
    ferrovs_packet::push_vlan_in_place(d, 0);
    d[14..16].copy_from_slice(&wire_tci(tci).to_be_bytes());
    m.vnet = shift_vnet(m.vnet, 4);
}

/// Offload offsets after a VLAN tag was pushed (+4) or popped (-4).
fn shift_vnet(mut h: ferrovs_sys::vnet::VnetHdr, d: i32) -> ferrovs_sys::vnet::VnetHdr {
    if h.is_offload() {
        h.csum_start = (i32::from(h.csum_start) + d).max(0) as u16;
        h.hdr_len = (i32::from(h.hdr_len) + d).max(0) as u16;
    }
    h
}
