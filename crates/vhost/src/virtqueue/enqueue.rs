//! Guest RX: [`VirtQueue::enqueue`] copies packets into the receive buffers the guest made
//! available: the virtio-net header (offload metadata, `num_buffers`) then the packet, in one
//! chain, or across several with mergeable buffers.
//!
//! Invariants: a packet is placed whole or not at all: when the guest has too few buffers the
//! burst stops there and nothing of that packet is consumed (`roll_back`); used entries are
//! published once per burst, marked in the dirty log (also those of a packet rolled back:
//! they were written), and the guest is notified (or the notification deferred). A packet's
//! offload metadata must be what the guest accepts (`rx_caps`), else the burst stops there.
//! Postcopy: a buffer whose page has not arrived ends the burst, the packet refused with
//! `postcopy_page_pending` ([`VirtQueue::shortfall`]).
//!
//! Thread-safety: runs on the PMD that holds the queue's lock for the burst.

use ferrovs_sys::guest::memory::GuestMemory;
use ferrovs_sys::guest::vring::{
    SplitRing, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};

use super::chain::{Chain, ChainError, Walk};
use super::dirty_log::{mark_used_entries, Logging, Marker, NoLog};
use super::prefetch::{prefetch_ahead, prefetch_burst, rx_prefetch_len, BURST_PREFETCH_BYTES};
use super::VirtQueue;
use crate::stats::{DropReason, QueueStats};

impl VirtQueue {
    /// Why the last enqueue placed fewer packets than given (`guest_no_rx_buffers` unless it
    /// was something else).
    pub fn shortfall(&self) -> DropReason {
        self.shortfall.unwrap_or(DropReason::GuestNoBuffers)
    }

    /// Guest RX: copies packets into the guest's receive buffers (mergeable when negotiated).
    /// Returns how many packets were delivered; the caller counts the rest as dropped.
    ///
    /// Each packet comes with its offload metadata, which must be what the guest accepts
    /// ([`VirtQueue::rx_caps`]: the caller did the rest in software); a packet whose metadata
    /// the guest does not take (its features changed under the caller) stops the burst there
    /// and is refused, like one for which the guest has no buffers.
    pub fn enqueue<'a, I>(&mut self, pkts: I, stats: &QueueStats, _name: &str) -> usize
    where
        I: IntoIterator<Item = (&'a [u8], VnetHdr)>,
    {
        self.shortfall = None;
        if let Some(ring) = self.packed.take() {
            let r = if self.packed_usable(&ring) {
                self.enqueue_packed(&ring, pkts, stats)
            } else {
                self.shortfall = Some(DropReason::PostcopyPending);
                0
            };
            self.check_fault(ring.mem(), stats);
            self.packed = Some(ring);
            return r;
        }
        let Some(ring) = self.ring.take() else {
            return 0;
        };
        let r = if !self.ring_usable(&ring) {
            self.shortfall = Some(DropReason::PostcopyPending);
            0
        } else if let Some(log) = self.logging().cloned() {
            let mut m = Logging::new(&log, self.used_log_addr(), Some(stats));
            self.enqueue_ring(&ring, pkts, stats, &mut m)
        } else {
            self.enqueue_ring(&ring, pkts, stats, &mut NoLog)
        };
        self.check_fault(ring.mem(), stats);
        self.ring = Some(ring);
        r
    }

    #[inline]
    fn enqueue_ring<'a, I, M: Marker>(
        &mut self,
        ring: &SplitRing,
        pkts: I,
        stats: &QueueStats,
        marker: &mut M,
    ) -> usize
    where
        I: IntoIterator<Item = (&'a [u8], VnetHdr)>,
    {
        if self.broken.is_some() {
            return 0;
        }
        let old_used = self.state.used_idx;
        let (mut sent, mut bytes) = (0u64, 0u64);
        let mut pkts = pkts.into_iter().peekable();
        if let Ok(avail) = self.pending(ring) {
            // As many buffers as there are packets (as on packed rings), not a whole burst
            // of the guest's posted buffers: with a few packets per burst the rest were
            // prefetches for nothing, each holding a line-fill buffer.
            let n = rx_prefetch_len(&pkts).min(avail as usize);
            prefetch_burst(ring, self.state.last_avail, n, true);
        }
        // Large packets (judged by the first) are prefetched one ahead of their copy.
        let ahead = pkts
            .peek()
            .is_some_and(|(p, _)| (self.hdr_len + p.len()) as u64 > BURST_PREFETCH_BYTES);
        while let Some((pkt, hdr)) = pkts.next() {
            if ahead {
                if let Some((next, _)) = pkts.peek() {
                    let len = (self.hdr_len + next.len()) as u64;
                    prefetch_ahead(ring, self.state.last_avail.wrapping_add(1), len, true);
                }
            }
            if hdr.is_offload() && !caps::accepts(self.rx_caps, &hdr) {
                stats.drop(DropReason::OffloadRefused, 1);
                break;
            }
            match self.enqueue_one(ring, pkt, &hdr, marker) {
                Ok(true) => {
                    sent += 1;
                    bytes += pkt.len() as u64;
                }
                Ok(false) => break,
                Err(ChainError::NotArrived) => {
                    self.shortfall = Some(DropReason::PostcopyPending);
                    break;
                }
                Err(e) => {
                    self.mark_broken(e, stats);
                    break;
                }
            }
        }
        if self.state.used_idx != old_used {
            // Only a moved index is stored: a store of the same value still takes the line
            // from the frontend, which polls it.
            ring.publish_used(self.state.used_idx);
        }
        mark_used_entries(marker, ring.size(), old_used, self.state.used_idx);
        self.notify(ring, old_used, stats);
        stats.add(sent, bytes);
        sent as usize
    }

    /// Places one packet; `Ok(false)` when the guest has too few buffers (nothing consumed).
    #[inline(always)]
    fn enqueue_one<M: Marker>(
        &mut self,
        ring: &SplitRing,
        pkt: &[u8],
        vnet: &VnetHdr,
        marker: &mut M,
    ) -> Result<bool, ChainError> {
        let (saved_avail, saved_used) = (self.state.last_avail, self.state.used_idx);
        let r = self.place_one(ring, pkt, vnet, marker);
        if matches!(r, Err(ChainError::NotArrived)) {
            // Postcopy: nothing was handed to the guest; the buffers stay available.
            self.roll_back(ring, saved_avail, saved_used, marker);
        }
        r
    }

    /// Takes back a packet placed in part: its buffers stay available and `used.idx` never
    /// covered it. The used entries already written for its first buffers stay in guest
    /// memory (beyond `used.idx`, unread) and are logged like every other write: the
    /// destination's copy of the ring must be the same bytes.
    #[inline]
    fn roll_back<M: Marker>(
        &mut self,
        ring: &SplitRing,
        saved_avail: u16,
        saved_used: u16,
        marker: &mut M,
    ) {
        mark_used_entries(marker, ring.size(), saved_used, self.state.used_idx);
        self.state.last_avail = saved_avail;
        self.state.used_idx = saved_used;
    }

    #[inline(always)]
    fn place_one<M: Marker>(
        &mut self,
        ring: &SplitRing,
        pkt: &[u8],
        vnet: &VnetHdr,
        marker: &mut M,
    ) -> Result<bool, ChainError> {
        let mem = ring.mem();
        let mrg = self.mrg();
        let hdr_len = self.hdr_len;
        let total = hdr_len + pkt.len();
        let (saved_avail, saved_used) = (self.state.last_avail, self.state.used_idx);
        let mut hdr = [0u8; 12];
        if vnet.is_offload() {
            hdr[..vnet::HDR_LEN].copy_from_slice(&vnet.to_bytes());
        }
        // The fast path for the common buffer: one descriptor (no NEXT, no indirect table,
        // writable) that holds header and packet. Anything else, or an error in the copy
        // (which then recurs below and is judged there), takes the general path.
        if self.pending(ring)? > 0 {
            let head = ring.avail_entry(self.state.last_avail);
            if let Some(d) = ring.desc(head) {
                if self.place_single(mem, d.addr, d.len, d.flags, &mut hdr, pkt, marker) {
                    self.state.last_avail = self.state.last_avail.wrapping_add(1);
                    ring.write_used(self.state.used_idx, head, total as u32);
                    self.state.used_idx = self.state.used_idx.wrapping_add(1);
                    return Ok(true);
                }
            }
        }
        let mut fill = Fill::default();
        let mut nbufs = 0u16;
        while fill.written < total {
            if self.pending(ring)? == 0 {
                self.roll_back(ring, saved_avail, saved_used, marker);
                return Ok(false);
            }
            let head = ring.avail_entry(self.state.last_avail);
            self.state.last_avail = self.state.last_avail.wrapping_add(1);
            let mut chain = Chain::new(ring, head, self.indirect_ok());
            let in_buf = self.fill_chain(mem, &mut chain, &mut hdr, pkt, &mut fill, marker)?;
            let written = fill.written;
            if !mrg && written < total {
                // One chain must hold the whole packet without mergeable buffers.
                self.roll_back(ring, saved_avail, saved_used, marker);
                return Ok(false);
            }
            ring.write_used(self.state.used_idx, head, in_buf as u32);
            self.state.used_idx = self.state.used_idx.wrapping_add(1);
            nbufs += 1;
        }
        if mrg && !fill.single {
            if let Some(a) = fill.hdr_addr {
                mem.write(a + 10, &nbufs.to_le_bytes())?;
                marker.mark(a + 10, 2);
            }
        }
        Ok(true)
    }
    /// The fast path of guest RX (split and packed rings) for the common buffer: one
    /// descriptor (no NEXT, no indirect table, writable) that holds the header (`hdr`, with
    /// `num_buffers` = 1 under mergeable buffers) and the packet. Returns whether it placed
    /// them (marked in the dirty log); `false` for anything else or a failed copy, with `hdr`
    /// as it was, for the general fill to take from the start and judge.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn place_single<M: Marker>(
        &self,
        mem: &GuestMemory,
        addr: u64,
        len: u32,
        flags: u16,
        hdr: &mut [u8; 12],
        pkt: &[u8],
        marker: &mut M,
    ) -> bool {
        let total = self.hdr_len + pkt.len();
        if flags & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE)
            != VRING_DESC_F_WRITE
            || (len as usize) < total
        {
            return false;
        }
        let mrg = self.mrg();
        if mrg {
            hdr[10] = 1;
        }
        if mem.write_pair(addr, &hdr[..self.hdr_len], pkt).is_err() {
            if mrg {
                hdr[10] = 0;
            }
            return false;
        }
        marker.mark(addr, total as u64);
        true
    }

    /// Writes as much of the header and packet as fits into the buffers of one chain, from
    /// `fill.written` on (all of the chain's buffers are walked without mergeable buffers: one
    /// chain must then hold the packet; with them the walk stops once the packet is placed).
    /// Returns the bytes written into this chain. Split and packed rings share it.
    #[inline(always)]
    pub(super) fn fill_chain<W: Walk, M: Marker>(
        &self,
        mem: &GuestMemory,
        chain: &mut W,
        hdr: &mut [u8; 12],
        pkt: &[u8],
        fill: &mut Fill,
        marker: &mut M,
    ) -> Result<usize, ChainError> {
        let mrg = self.mrg();
        let hdr_len = self.hdr_len;
        let total = hdr_len + pkt.len();
        let mut in_buf = 0usize;
        while let Some(d) = chain.next()? {
            if d.flags & VRING_DESC_F_WRITE == 0 {
                return Err(ChainError::WrongDirection);
            }
            let mut addr = d.addr;
            let mut room = d.len as usize;
            if fill.hdr_addr.is_none() {
                if room < hdr_len {
                    return Err(ChainError::OutOfMemory);
                }
                if mrg && room >= total {
                    // The common case: one buffer; num_buffers = 1 goes out with the header.
                    hdr[10] = 1;
                    fill.single = true;
                }
                fill.hdr_addr = Some(addr);
            }
            if fill.written == 0 && room >= total {
                // The common case: header and packet in one buffer, one translation.
                mem.write_pair(addr, &hdr[..hdr_len], pkt)?;
                marker.mark(addr, total as u64);
                fill.written = total;
                in_buf = total;
                room = 0;
            }
            while room > 0 && fill.written < total {
                let written = fill.written;
                let n = if written < hdr_len {
                    let n = (hdr_len - written).min(room);
                    mem.write(addr, &hdr[written..written + n])?;
                    n
                } else {
                    let off = written - hdr_len;
                    let n = (pkt.len() - off).min(room);
                    mem.write(addr, &pkt[off..off + n])?;
                    n
                };
                marker.mark(addr, n as u64);
                fill.written += n;
                in_buf += n;
                room -= n;
                addr += n as u64;
            }
            if fill.written == total && mrg {
                break;
            }
        }
        Ok(in_buf)
    }
}

/// Where the placing of one packet stands, across the buffers it takes.
#[derive(Default)]
pub(super) struct Fill {
    /// Bytes of header and packet written so far.
    pub(super) written: usize,
    /// Mergeable buffers: the packet fits the first buffer (`num_buffers` = 1 went with the
    /// header).
    pub(super) single: bool,
    /// Guest address of the header (its `num_buffers` is written last).
    pub(super) hdr_addr: Option<u64>,
}
