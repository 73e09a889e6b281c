//! The output stage of a burst: packets decided for a port join that port's list, and at the
//! end of the burst each list goes out with one [`Port::tx_burst`].
//!
//! Both pipelines feed it: the plain L2 path ([`crate::pmd`]) and the flow path
//! ([`crate::flow::input`]) call [`add_output`] / [`add_outputs`]; the PMD then calls
//! [`Scratch::flush`]. On the way to a list a packet may be copied (a VLAN tag pushed or
//! popped for that port) or worked on in software (a checksum completed, a TSO packet cut
//! into segments) when the port cannot take its offload metadata.
//!
//! Tunnel metadata (`key=flow` tunnel ports, see [`crate::tunnel`]): the flow executor
//! records a packet's metadata once per change in the burst's table ([`Scratch::push_tunnel`])
//! and passes its index with the output; only the list of a port that takes metadata keeps
//! those indices, beside its packet indices. Other ports' lists, and packets that never meet
//! such a port, pay nothing for it. Received metadata (`rx_tun`) is filled by tunnel ports
//! only, one per received packet.
//!
//! Invariants: a packet is named by a `u16` index, `i < BURST` for `batch[i]` (received) and
//! `BURST + k` for `extra[k]` (copies and segments made in this burst); every list and
//! buffer vector is allocated once at full capacity ([`Scratch::new`]) and never grows: a
//! burst that would need more drops and counts (`no_mbuf`, `no_route`). Nothing here
//! allocates, locks or makes a system call per packet.
//!
//! Thread-safety: a [`Scratch`] belongs to one PMD thread; the counters it bumps are the
//! ports' shared atomics.

use std::sync::atomic::Ordering;

use ferrovs_counters::DropReason;
use ferrovs_packet::offload::{self, TcpSegmenter};
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::virtqueue::BURST;

use ferrovs_flow::TunnelKey;

pub(crate) use crate::kernel_port::NO_TUNNEL;
use crate::l2::{self, Decision, Edit};
use crate::port::{NotifyTimers, Port, TxPkts};
use crate::{Bridge, Snapshot};

/// Most distinct output ports one burst is grouped into before flushing.
const MAX_OUTPUTS: usize = 64;
/// Most packets one burst makes beside the received ones (VLAN-edited copies, segments of
/// TSO packets for ports without TSO): 32 packets of 64 KiB cut at a 1448-byte MSS.
pub(crate) const MAX_EXTRA: usize = 1536;
/// Most packets one burst sends to one port.
const MAX_PER_OUTPUT: usize = BURST + MAX_EXTRA;
/// Most distinct tunnel metadata one burst sends with (more: dropped, `no_mbuf`).
const MAX_TUNNEL_META: usize = 256;

/// What every stage of one burst reads: the snapshot it runs under, the port the packets came
/// from and its bridge, the PMD's pool (for copies and segments) and the clock (seconds, MAC
/// aging and flow `used` times). Made once per burst by the PMD and passed by reference, in
/// place of the same five arguments on every function of the burst.
#[derive(Clone, Copy)]
pub(crate) struct Burst<'a, 'p> {
    pub snap: &'a Snapshot,
    pub bridge: &'a Bridge,
    pub inp: &'a Port,
    pub pool: &'p Pool,
    pub now: u32,
}

/// Per-output packet list.
pub(crate) struct TxList {
    port: u32,
    idx: Vec<u16>,
    /// The port takes tunnel metadata: `tun[k]` is packet `idx[k]`'s (an index into
    /// [`Scratch::tun_meta`], or [`NO_TUNNEL`]); else empty.
    meta: bool,
    tun: Vec<u16>,
}

impl TxList {
    /// Adds packet `idx` with tunnel metadata `tun` (kept if the port takes it); a full list
    /// takes nothing (it holds every packet a burst can send).
    #[inline]
    fn add(&mut self, idx: u16, tun: u16) {
        if self.idx.len() < self.idx.capacity() {
            self.idx.push(idx);
            if self.meta {
                self.tun.push(tun);
            }
        }
    }
}

/// Scratch of one PMD, allocated once.
pub(crate) struct Scratch<'p> {
    pub(crate) batch: Vec<Mbuf<'p>>,
    /// Copies with VLAN edits; referenced as `BURST + i`.
    pub(crate) extra: Vec<Mbuf<'p>>,
    /// Software segments of one packet before they join `extra`.
    segs: Vec<Mbuf<'p>>,
    outs: Vec<TxList>,
    nouts: usize,
    /// The received packets' tunnel metadata (`rx_tun[i]` is `batch[i]`'s), filled by tunnel
    /// ports only; empty for other ports.
    pub(crate) rx_tun: Vec<TunnelKey>,
    /// The tunnel metadata packets of this burst are sent with (see the module doc).
    tun_meta: Vec<TunnelKey>,
}

impl<'p> Scratch<'p> {
    /// Packet `i`: `batch[i]`, or `extra[i - BURST]` from `BURST` on.
    #[inline]
    pub(crate) fn at(&self, i: usize) -> &Mbuf<'p> {
        if i < BURST {
            &self.batch[i]
        } else {
            &self.extra[i - BURST]
        }
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, i: usize) -> &mut Mbuf<'p> {
        if i < BURST {
            &mut self.batch[i]
        } else {
            &mut self.extra[i - BURST]
        }
    }

    /// Scratch with every list at its full capacity.
    pub(crate) fn new() -> Scratch<'p> {
        Scratch {
            batch: Vec::with_capacity(BURST),
            extra: Vec::with_capacity(MAX_EXTRA),
            segs: Vec::with_capacity(MAX_EXTRA),
            outs: (0..MAX_OUTPUTS)
                .map(|_| TxList {
                    port: 0,
                    idx: Vec::with_capacity(MAX_PER_OUTPUT),
                    meta: false,
                    tun: Vec::with_capacity(MAX_PER_OUTPUT),
                })
                .collect(),
            nouts: 0,
            rx_tun: Vec::with_capacity(BURST),
            tun_meta: Vec::with_capacity(MAX_TUNNEL_META),
        }
    }

    /// Records `t` as the tunnel metadata of outputs to come; its index, the last one's
    /// when equal; `None` when the table is full.
    #[inline]
    pub(crate) fn push_tunnel(&mut self, t: &TunnelKey) -> Option<u16> {
        if let Some(last) = self.tun_meta.last() {
            if last == t {
                return Some((self.tun_meta.len() - 1) as u16);
            }
        }
        if self.tun_meta.len() == MAX_TUNNEL_META {
            return None;
        }
        self.tun_meta.push(*t);
        Some((self.tun_meta.len() - 1) as u16)
    }

    /// The burst's output lists so far: (port, packet indices) in the order they were made.
    #[cfg(test)]
    pub(crate) fn outputs(&self) -> impl Iterator<Item = (u32, &[u16])> {
        self.outs[..self.nouts]
            .iter()
            .map(|l| (l.port, l.idx.as_slice()))
    }

    /// Forgets the burst's output lists and extra packets (the received ones stay).
    #[cfg(test)]
    pub(crate) fn reset_outputs(&mut self) {
        self.nouts = 0;
        self.extra.clear();
        self.tun_meta.clear();
    }

    /// A copy of packet `i` (with its offload metadata) in `extra`; its index, or `None`
    /// when no buffer is left.
    pub(crate) fn copy(&mut self, pool: &'p Pool, i: usize) -> Option<usize> {
        if self.extra.len() == self.extra.capacity() {
            return None;
        }
        let src = self.at(i);
        let len = src.len();
        let mut m = pool.alloc_for(len)?;
        m.fill(len)?.copy_from_slice(src.data());
        m.vnet = src.vnet;
        self.extra.push(m);
        Some(BURST + self.extra.len() - 1)
    }

    /// Sends every output list of the burst from PMD `pmd` (one [`Port::tx_burst`] per
    /// port) and forgets the burst's packets; returns (sent, dropped).
    #[inline]
    pub(crate) fn flush(
        &mut self,
        snap: &Snapshot,
        pmd: usize,
        timers: &mut NotifyTimers,
    ) -> (u64, u64) {
        let (mut sent, mut dropped) = (0u64, 0u64);
        for o in 0..self.nouts {
            let list = &self.outs[o];
            let Some(out) = snap.port(list.port) else {
                continue;
            };
            let pkts = TxPkts::new(&list.idx, &self.batch, &self.extra);
            let pkts = if list.meta {
                pkts.with_tunnel(&list.tun, &self.tun_meta)
            } else {
                pkts
            };
            let (s, d) = out.tx_burst(pmd, pkts, timers);
            sent += s;
            dropped += d;
        }
        self.nouts = 0;
        self.batch.clear();
        self.extra.clear();
        self.rx_tun.clear();
        self.tun_meta.clear();
        (sent, dropped)
    }
}

/// Adds packet `i` (`BURST + k`: `extra[k]`) to `out`'s list, making a VLAN-edited copy if
/// the port needs one, and doing in software the offloads the packet asks for that the port
/// cannot take.
#[inline]
pub(crate) fn add_output<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    i: usize,
    c: &l2::Classified,
    inp: &Port,
    out: &Port,
) {
    add_output_tunnel(sc, pool, i, c, inp, out, NO_TUNNEL)
}

/// [`add_output`] with the packet's tunnel metadata `tun` (an index from
/// [`Scratch::push_tunnel`], or [`NO_TUNNEL`]), kept if `out` takes it.
#[inline]
pub(crate) fn add_output_tunnel<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    i: usize,
    c: &l2::Classified,
    inp: &Port,
    out: &Port,
    tun: u16,
) {
    let edit = l2::egress_edit(c, out);
    let ol = sc.at(i).vnet;
    if ol.is_offload() && !caps::accepts(out.tx_caps(), &ol) {
        match software_offload(sc, pool, i, edit, out, tun) {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => {
                inp.rx_drops.drop(DropReason::BadOffload, 1);
                return;
            }
        }
    }
    let idx = match edit {
        Edit::None => i as u16,
        _ => {
            if sc.extra.len() == sc.extra.capacity() {
                out.rx_drops.drop(DropReason::NoMbuf, 1);
                return;
            }
            let src = sc.at(i);
            let len = src.len() + if matches!(edit, Edit::Push(_)) { 4 } else { 0 };
            let Some(mut m) = pool.alloc_for(len) else {
                out.rx_drops.drop(DropReason::NoMbuf, 1);
                return;
            };
            let Some(b) = m.fill(len) else { return };
            match edit {
                Edit::Push(v) => {
                    b[4..].copy_from_slice(src.data());
                    ferrovs_packet::push_vlan_in_place(b, v);
                }
                _ => {
                    b.copy_from_slice(src.data());
                    ferrovs_packet::pop_vlan_in_place(b);
                    m.pull_front(4);
                }
            }
            m.vnet = shift_offsets(src.vnet, edit);
            sc.extra.push(m);
            (BURST + sc.extra.len() - 1) as u16
        }
    };
    push_output(&mut sc.outs, &mut sc.nouts, out, idx, tun);
}

/// [`add_output`] for the first packet of a run of packets with one decision: also returns
/// the slot of `out`'s list when `out` takes the packets of this classification as they are
/// (no VLAN edit), for the rest of the run to [`Scratch::join`].
#[inline]
pub(crate) fn add_output_run<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    i: usize,
    c: &l2::Classified,
    inp: &Port,
    out: &Port,
) -> Option<usize> {
    add_output(sc, pool, i, c, inp, out);
    if l2::egress_edit(c, out) != Edit::None {
        return None;
    }
    sc.outs[..sc.nouts].iter().position(|l| l.port == out.id)
}

impl Scratch<'_> {
    /// Adds packet `i` of a run to the list at `slot` (from [`add_output_run`] for the run's
    /// first packet), as [`add_output`] would for a packet sent as it is: `false`, and nothing
    /// done, when the packet asks for an offload (which [`add_output`] must judge).
    #[inline]
    pub(crate) fn join(&mut self, slot: usize, i: usize) -> bool {
        if self.at(i).vnet.is_offload() {
            return false;
        }
        self.outs[slot].add(i as u16, NO_TUNNEL);
        true
    }
}

/// [`add_output`] for several packets sent as they are (no VLAN edit) to one port: the
/// output's list is found once and the packets join it in order; a packet asking for an
/// offload `out` cannot take goes through [`add_output`] (software offload) in its place.
#[inline]
pub(crate) fn add_outputs<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    pkts: &[u16],
    inp: &Port,
    out: &Port,
) {
    let Some(slot) = output_slot(&mut sc.outs, &mut sc.nouts, out) else {
        out.rx_drops.drop(DropReason::NoRoute, pkts.len() as u64);
        return;
    };
    for &i in pkts {
        let ol = sc.at(i as usize).vnet;
        if ol.is_offload() && !caps::accepts(out.tx_caps(), &ol) {
            add_output(sc, pool, i as usize, &AS_IS, inp, out);
            continue;
        }
        sc.outs[slot].add(i, NO_TUNNEL);
    }
}

/// A classification that sends packets as they are (no VLAN edit on any port).
const AS_IS: l2::Classified = l2::Classified {
    vlan: 0,
    tagged: false,
    decision: Decision::Flood,
};

/// The offload metadata of a packet after a VLAN edit moved its headers.
#[inline]
fn shift_offsets(mut h: VnetHdr, edit: Edit) -> VnetHdr {
    if h.is_offload() {
        let d: i32 = match edit {
            Edit::Push(_) => 4,
            Edit::Pop => -4,
            Edit::None => 0,
        };
        h.csum_start = (i32::from(h.csum_start) + d).max(0) as u16;
        h.hdr_len = (i32::from(h.hdr_len) + d).max(0) as u16;
    }
    h
}

/// Adds packet `idx` (`BURST + k`: `extra[k]`) to `out`'s list, with tunnel metadata `tun`
/// if the port takes it.
#[inline]
fn push_output(outs: &mut [TxList], nouts: &mut usize, out: &Port, idx: u16, tun: u16) {
    let Some(slot) = output_slot(outs, nouts, out) else {
        out.rx_drops.drop(DropReason::NoRoute, 1);
        return;
    };
    outs[slot].add(idx, tun);
}

/// The index of `out`'s list in `outs`, started if needed; `None` when `MAX_OUTPUTS` lists
/// are already in use.
#[inline]
fn output_slot(outs: &mut [TxList], nouts: &mut usize, out: &Port) -> Option<usize> {
    match outs[..*nouts].iter().position(|l| l.port == out.id) {
        Some(s) => Some(s),
        None if *nouts < MAX_OUTPUTS => {
            let l = &mut outs[*nouts];
            l.port = out.id;
            l.idx.clear();
            l.meta = out.takes_tunnel_metadata();
            l.tun.clear();
            *nouts += 1;
            Some(*nouts - 1)
        }
        None => None,
    }
}

/// Does for port `out` what packet `i` asks of the next hop and `out` cannot do. A partial
/// checksum is completed in place (the packet stays valid for every other port: it is then
/// simply complete), and `Ok(false)` says to send it on as usual. A TSO packet is cut into
/// segments (with `edit` applied to each) added to `out`'s list: `Ok(true)`. `Err`: the
/// header does not describe the packet (the input port counts it).
#[cold]
fn software_offload<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    i: usize,
    edit: Edit,
    out: &Port,
    tun: u16,
) -> Result<bool, offload::OffloadError> {
    let Scratch {
        batch,
        extra,
        segs,
        outs,
        nouts,
        ..
    } = sc;
    let src = if i < BURST {
        &batch[i]
    } else {
        &extra[i - BURST]
    };
    let h = src.vnet;
    if h.gso() != vnet::GSO_NONE {
        let seg = TcpSegmenter::new(src.data(), h.gso_size, h.csum_start)?;
        if seg.count() > 1 {
            out.offload.sw_tso.fetch_add(1, Ordering::Relaxed);
            // Segments go to `segs` first (the source may be in `extra`), then join `extra`
            // at the indices already given to `out`'s list.
            let base = extra.len();
            segs.clear();
            for k in 0..seg.count() {
                let len = seg.len(k);
                let m = (base + segs.len() < extra.capacity())
                    .then(|| pool.alloc_for(len))
                    .flatten();
                let Some(mut m) = m else {
                    out.rx_drops
                        .drop(DropReason::NoMbuf, (seg.count() - k) as u64);
                    break;
                };
                let Some(b) = m.fill(len) else { break };
                seg.write(k, b);
                match edit {
                    Edit::None => {}
                    Edit::Push(v) => {
                        if let Some(_front) = m.push_front(4) {
                            ferrovs_packet::push_vlan_in_place(m.data_mut(), v);
                        }
                    }
                    Edit::Pop => {
                        ferrovs_packet::pop_vlan_in_place(m.data_mut());
                        m.pull_front(4);
                    }
                }
                push_output(outs, nouts, out, (BURST + base + segs.len()) as u16, tun);
                segs.push(m);
            }
            let made = segs.len() as u64;
            extra.append(segs);
            out.offload.sw_segments.fetch_add(made, Ordering::Relaxed);
            return Ok(true);
        }
    }
    // One segment's worth, or only a checksum: complete it in place.
    let m = if i < BURST {
        &mut batch[i]
    } else {
        &mut extra[i - BURST]
    };
    offload::complete_csum(
        m.data_mut(),
        usize::from(h.csum_start),
        usize::from(h.csum_offset),
    )?;
    m.vnet = VnetHdr::default();
    out.offload.sw_csum.fetch_add(1, Ordering::Relaxed);
    Ok(false)
}
