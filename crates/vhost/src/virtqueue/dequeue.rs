//! Guest TX: [`VirtQueue::dequeue`] moves the chains the guest made available into packet
//! buffers, one burst at a time, with the offload requests of their virtio-net headers.
//!
//! Invariants: every chain taken is returned to the guest in order, one used entry each, with
//! length 0 (nothing is written to a TX buffer): a broken, oversized, runt or refused chain
//! leaks no descriptor. A header asking for an offload that was not negotiated, or that does
//! not fit its packet, drops the packet (counted); a TSO packet goes into a large buffer or is
//! dropped. Postcopy: a chain whose page has not arrived stays available (the burst stops
//! before it). The used index is published once per burst, then its entries are marked in the
//! dirty log and the guest notified (or the notification deferred).
//!
//! Thread-safety: runs on the PMD that holds the queue's lock for the burst.

use ferrovs_sys::guest::memory::GuestMemory;
use ferrovs_sys::guest::vring::{
    SplitRing, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};
use ferrovs_sys::pool::{Mbuf, Pool};

use super::chain::{Chain, ChainError, Walk};
use super::dirty_log::{mark_used_entries, Logging, Marker, NoLog};
use super::prefetch::{prefetch_ahead, prefetch_burst, BURST_PREFETCH_BYTES};
use super::VirtQueue;
use crate::stats::{DropReason, QueueStats};

/// What became of one chain the guest sent.
pub(super) enum Taken {
    /// A packet of this many bytes is in the buffer.
    Packet(usize),
    /// Larger than the buffer can hold.
    TooBig,
    /// Its virtio-net header asks for what was not negotiated or does not fit the packet.
    BadOffload,
    /// A TSO packet and no large buffer left.
    NoLargeBuffer,
}

impl VirtQueue {
    /// Guest TX: moves up to `max` packets from the ring into buffers from `pool`, appended
    /// to `out` (which must have room). Returns how many were added.
    pub fn dequeue<'p>(
        &mut self,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        stats: &QueueStats,
        // The port's name (unused since guest errors are logged by the control thread).
        _name: &str,
    ) -> usize {
        if let Some(ring) = self.packed.take() {
            let r = if self.packed_usable(&ring) {
                self.dequeue_packed(&ring, pool, out, max, stats)
            } else {
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
            0
        } else if let Some(log) = self.logging().cloned() {
            let mut m = Logging::new(&log, self.used_log_addr(), Some(stats));
            self.dequeue_ring(&ring, pool, out, max, stats, &mut m)
        } else {
            self.dequeue_ring(&ring, pool, out, max, stats, &mut NoLog)
        };
        self.check_fault(ring.mem(), stats);
        self.ring = Some(ring);
        r
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn dequeue_ring<'p, M: Marker>(
        &mut self,
        ring: &SplitRing,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        stats: &QueueStats,
        marker: &mut M,
    ) -> usize {
        if self.broken.is_some() {
            return 0;
        }
        let avail = match self.pending(ring) {
            Ok(n) => n as usize,
            Err(e) => {
                self.mark_broken(e, stats);
                return 0;
            }
        };
        let n = avail.min(max).min(out.capacity() - out.len());
        if n == 0 {
            // Nothing to take, so nothing to write: a store to `used.idx`, even of the value
            // it holds, takes the line from the frontend, which polls it.
            return 0;
        }
        let ahead =
            prefetch_burst(ring, self.state.last_avail, n, false) as u64 > BURST_PREFETCH_BYTES;
        let old_used = self.state.used_idx;
        let (mut pkts, mut bytes, mut oversize, mut runts) = (0u64, 0u64, 0u64, 0u64);
        let (mut bad_offload, mut no_large) = (0u64, 0u64);
        for _ in 0..n {
            let Some(mut m) = pool.alloc() else {
                stats.drop(DropReason::NoMbuf, 1);
                break;
            };
            let head = ring.avail_entry(self.state.last_avail);
            if ahead {
                prefetch_ahead(ring, self.state.last_avail.wrapping_add(1), u64::MAX, false);
            }
            let indirect_ok = self.indirect_ok();
            // No one-descriptor fast path here (packed rings have one): with DPDK testpmd's
            // closed loop it measured 0.75x and 0.77x, and again 0.96x and 1.01x once empty
            // polls stopped storing `used.idx`: never a gain beyond this host's noise
            // (docs/datapath.md, "One-descriptor fast paths" and "Who waits for whom").
            let res = self.copy_chain_out(
                ring.mem(),
                || Chain::new(ring, head, indirect_ok),
                &mut Chain::new(ring, head, indirect_ok),
                pool,
                &mut m,
            );
            if matches!(res, Err(ChainError::NotArrived)) {
                // Postcopy: the chain stays available; its page is being fetched.
                break;
            }
            ring.write_used(self.state.used_idx, head, 0);
            self.state.used_idx = self.state.used_idx.wrapping_add(1);
            self.state.last_avail = self.state.last_avail.wrapping_add(1);
            match res {
                Ok(Taken::Packet(len)) if len >= 14 => {
                    m.truncate(len);
                    pkts += 1;
                    bytes += len as u64;
                    out.push(m);
                }
                Ok(Taken::Packet(_)) => runts += 1,
                Ok(Taken::TooBig) => oversize += 1,
                Ok(Taken::BadOffload) => bad_offload += 1,
                Ok(Taken::NoLargeBuffer) => no_large += 1,
                Err(e) => {
                    self.mark_broken(e, stats);
                    break;
                }
            }
        }
        stats.drop(DropReason::BadOffload, bad_offload);
        stats.drop(DropReason::NoMbuf, no_large);
        ring.publish_used(self.state.used_idx);
        mark_used_entries(marker, ring.size(), old_used, self.state.used_idx);
        self.notify(ring, old_used, stats);
        stats.add(pkts, bytes);
        stats.drop(DropReason::Oversize, oversize);
        stats.drop(DropReason::Runt, runts);
        pkts as usize
    }

    /// The fast path of guest TX on packed rings for the common chain: one descriptor (no
    /// NEXT, no indirect table, read-only) holding the virtio-net header and a whole packet
    /// that needs no segmentation. Copies the packet into `m` and returns its length; `None` for anything
    /// else (another shape, a header asking for segmentation or refused, a runt, too big, an
    /// address outside guest memory or a page not arrived), which the general copy
    /// (`copy_chain_out`) then takes from the start and judges: this path has no effect of
    /// its own but the bytes it wrote into `m`, which that copy overwrites.
    #[inline(always)]
    pub(super) fn copy_single_out(
        &self,
        mem: &GuestMemory,
        addr: u64,
        dlen: u32,
        flags: u16,
        m: &mut Mbuf<'_>,
    ) -> Option<usize> {
        if flags & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE) != 0 {
            return None;
        }
        let hdr_len = self.hdr_len;
        let len = (dlen as usize).checked_sub(hdr_len)?;
        if len < 14 || len > m.max_data() {
            return None;
        }
        let mut hdr = VnetHdr::default();
        if self.tx_caps != 0 {
            let mut b = [0u8; vnet::HDR_LEN];
            mem.read(addr, &mut b).ok()?;
            hdr = self.accept_header(VnetHdr::from_bytes(&b))?;
            if hdr.gso() != vnet::GSO_NONE
                || (hdr.needs_csum()
                    && usize::from(hdr.csum_start) + usize::from(hdr.csum_offset) + 2 > len)
            {
                return None;
            }
        }
        let buf = m.fill(len)?;
        mem.read(addr.wrapping_add(hdr_len as u64), buf).ok()?;
        m.vnet = hdr;
        Some(len)
    }

    /// Reads the virtio-net header of a chain (its first bytes, usually all in the first
    /// descriptor). Errors are left to the copy that follows, which walks the same chain.
    #[inline(always)]
    fn peek_header<W: Walk>(&self, mem: &GuestMemory, mut chain: W) -> Option<VnetHdr> {
        let mut b = [0u8; vnet::HDR_LEN];
        let mut got = 0;
        while got < vnet::HDR_LEN {
            let d = chain.next().ok()??;
            let n = (d.len as usize).min(vnet::HDR_LEN - got);
            mem.read(d.addr, &mut b[got..got + n]).ok()?;
            got += n;
        }
        Some(VnetHdr::from_bytes(&b))
    }

    /// Checks a header the guest sent against what was negotiated: `None` if it asks for
    /// something else. Flags not negotiated are ignored (a driver may leave stale bits).
    #[inline(always)]
    pub(super) fn accept_header(&self, h: VnetHdr) -> Option<VnetHdr> {
        let mut h = h;
        if self.tx_caps & caps::CSUM == 0 {
            return Some(VnetHdr::default());
        }
        h.flags &= vnet::F_NEEDS_CSUM;
        if h.gso() == vnet::GSO_NONE {
            h.gso_type = vnet::GSO_NONE;
            h.gso_size = 0;
            return Some(h);
        }
        // Segmentation needs the partial checksum (the segments' checksums are recomputed).
        (h.needs_csum() && h.gso_size != 0 && caps::accepts(self.tx_caps, &h)).then_some(h)
    }

    /// Copies the packet of a chain (after the virtio-net header) into `m`, with the
    /// offload metadata of its header; a TSO packet goes into a large buffer instead. `chain`
    /// is walked to its end unless an error stops it; `peek` makes a second walker of the
    /// same chain for the header (split and packed rings share this copy).
    #[inline(always)]
    pub(super) fn copy_chain_out<'p, W: Walk>(
        &self,
        mem: &GuestMemory,
        peek: impl FnOnce() -> W,
        chain: &mut W,
        pool: &'p Pool,
        m: &mut Mbuf<'p>,
    ) -> Result<Taken, ChainError> {
        let mut hdr = VnetHdr::default();
        let mut refused = false;
        if self.tx_caps != 0 {
            match self.peek_header(mem, peek()).map(|h| self.accept_header(h)) {
                Some(Some(h)) => hdr = h,
                Some(None) => refused = true,
                None => {}
            }
            if hdr.gso() != vnet::GSO_NONE {
                match pool.alloc_large() {
                    Some(l) => *m = l,
                    None => refused = true,
                }
            }
        }
        let max = m.max_data();
        let buf = m.fill(max).ok_or(ChainError::BadIndex)?;
        let mut skip = self.hdr_len as u64;
        let mut len = 0usize;
        let mut too_big = false;
        while let Some(d) = chain.next()? {
            if d.flags & VRING_DESC_F_WRITE != 0 {
                return Err(ChainError::WrongDirection);
            }
            let s = skip.min(d.len as u64);
            skip -= s;
            let (addr, dlen) = (d.addr.wrapping_add(s), (d.len as u64 - s) as usize);
            if dlen == 0 {
                mem.check_range(d.addr, d.len as u64)?;
                continue;
            }
            if refused || too_big || len + dlen > max {
                too_big = !refused;
                mem.check_range(addr, dlen as u64)?;
                continue;
            }
            mem.read(addr, &mut buf[len..len + dlen])?;
            len += dlen;
        }
        if refused {
            let gso = hdr.gso() != vnet::GSO_NONE;
            return Ok(
                if gso && !m.is_large() && self.accept_header(hdr).is_some() {
                    Taken::NoLargeBuffer
                } else {
                    Taken::BadOffload
                },
            );
        }
        if too_big {
            return Ok(Taken::TooBig);
        }
        if hdr.needs_csum() && usize::from(hdr.csum_start) + usize::from(hdr.csum_offset) + 2 > len
        {
            return Ok(Taken::BadOffload);
        }
        m.vnet = hdr;
        Ok(Taken::Packet(len))
    }
}
