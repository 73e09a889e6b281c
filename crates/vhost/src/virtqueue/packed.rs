//! Packed rings (`VIRTIO_F_RING_PACKED`, virtio 1.1+ §2.8): both directions of the packet
//! path and the notifications over one descriptor ring with AVAIL/USED flags and wrap
//! counters, sharing the split ring's copy routines (`copy_chain_out`, `fill_chain`), dirty-log
//! marks and drop reasons.
//!
//! Invariants:
//! * A position is a slot and a wrap counter ([`Pos`]); the queue's plain state keeps it in
//!   the vhost-user encoding (bits 0–14 the slot, bit 15 the wrap counter). We complete
//!   chains in order, so at every burst boundary the used position equals the available
//!   one, and a used descriptor is written at the slot of its chain's first descriptor; the
//!   used position then moves on by the chain's length (1 for an indirect chain), as the
//!   driver expects.
//! * At the next available slot a descriptor is either available in this lap (AVAIL = wrap,
//!   USED ≠ wrap) or left from the previous lap (AVAIL ≠ wrap). AVAIL = USED = wrap (used in
//!   a lap the device has not reached: flags that lie) breaks the queue
//!   (`packed_desc_bad_flags`), as does a later descriptor of a chain that is not
//!   available, a chain longer than the ring (`desc_chain_loop`) and a buffer id not below
//!   the ring size (`packed_bad_buffer_id`). Indirect tables are supported as the split
//!   ring's: only as the sole descriptor of a chain, when negotiated, unnested, inside guest
//!   memory.
//! * Guest RX: the used descriptors of a burst's packets (several per packet with mergeable
//!   buffers) are kept in a shadow list and written at the end of the burst, the first one's
//!   flags last, so the guest never sees part of a packet, sees the burst at once, and a
//!   packet rolled back (too few buffers, postcopy) leaves nothing behind.
//! * Guest TX: the used descriptors of a burst are written as its chains are taken, except
//!   the first one's, written at the end of the burst (also when a broken chain cut it
//!   short): the driver, which reads used descriptors in order, sees the burst at once.
//!   With `VIRTIO_F_IN_ORDER` the first one is the only one: it carries the last chain's
//!   buffer id and stands for the whole burst (virtio 1.1, packed virtqueues, "In-order use
//!   of descriptors"; DPDK's vhost library does the same on packed rings).
//! * A broken chain is not returned to the guest (its length is not known): the queue is
//!   broken and stays so until the frontend re-initialises it.
//!
//! Thread-safety: as the split ring's code, with the queue's lock held for a burst.

use ferrovs_sys::guest::memory::GuestMemory;
use ferrovs_sys::guest::packed::{
    PackedRing, RING_EVENT_FLAGS_DESC, RING_EVENT_FLAGS_DISABLE, RING_EVENT_FLAGS_ENABLE,
    VRING_PACKED_DESC_F_AVAIL, VRING_PACKED_DESC_F_USED,
};
use ferrovs_sys::guest::vring::{
    self, Descriptor, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};
use ferrovs_sys::os;
use ferrovs_sys::pool::{Mbuf, Pool};

use super::chain::{ChainError, Walk};
use super::dequeue::Taken;
use super::dirty_log::{Logging, Marker, NoLog};
use super::enqueue::Fill;
use super::prefetch::{
    prefetch_ahead_packed, prefetch_burst_packed, rx_prefetch_len, BURST_PREFETCH_BYTES,
};
use super::VirtQueue;
use crate::stats::{DropReason, QueueStats};

const WRAP_BIT: u16 = 1 << 15;

/// A position in a packed ring: slot and wrap counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub(crate) slot: u16,
    pub(crate) wrap: bool,
}

impl Pos {
    /// From the vhost-user encoding (bit 15: wrap counter).
    #[inline]
    pub(crate) fn decode(v: u16) -> Pos {
        Pos {
            slot: v & !WRAP_BIT,
            wrap: v & WRAP_BIT != 0,
        }
    }

    #[inline]
    pub(crate) fn encode(self) -> u16 {
        self.slot | if self.wrap { WRAP_BIT } else { 0 }
    }

    /// `n` slots on (`n <= size`), flipping the wrap counter past the end.
    #[inline]
    pub(super) fn advance(self, n: u16, size: u16) -> Pos {
        let s = u32::from(self.slot) + u32::from(n);
        if s >= u32::from(size) {
            Pos {
                slot: (s - u32::from(size)) as u16,
                wrap: !self.wrap,
            }
        } else {
            Pos {
                slot: s as u16,
                wrap: self.wrap,
            }
        }
    }

    /// The position as a count modulo `2 * size` (for the event index test).
    #[inline]
    fn lin(self, size: u16) -> u32 {
        u32::from(self.slot) + if self.wrap { u32::from(size) } else { 0 }
    }
}

/// What a descriptor's flags say at a position the device has not reached yet.
///
/// A driver with a wrong wrap counter writes AVAIL != wrap: its descriptors look like the
/// previous lap's and are not taken (it stalls only its own queue). USED == AVAIL == wrap
/// says "used by the device in this lap", which the device has not reached: a lie.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Available,
    /// Not made available yet (still the previous lap's used entry, or never written).
    NotYet,
    /// Neither: a wrong wrap counter or flags that lie.
    Bad,
}

#[inline(always)]
fn slot_state(flags: u16, wrap: bool) -> Slot {
    let a = flags & VRING_PACKED_DESC_F_AVAIL != 0;
    let u = flags & VRING_PACKED_DESC_F_USED != 0;
    match (a == wrap, u == wrap) {
        (true, false) => Slot::Available,
        (true, true) => Slot::Bad,
        // The previous lap's used entry, or (AVAIL != wrap, USED == wrap) a descriptor made
        // available in the previous lap that no used entry overwrote (a later slot of a
        // chain: the used descriptor goes to the chain's first slot only).
        (false, _) => Slot::NotYet,
    }
}

/// Descriptors the driver made available from `pos` on that the device has not taken: the
/// run of slots, at most one lap, whose flags say available in their lap.
pub(super) fn available_from(ring: &PackedRing, mut pos: Pos) -> u16 {
    let size = ring.size();
    let mut n = 0;
    while n < size {
        match ring.desc(pos.slot) {
            Some(d) if slot_state(d.flags, pos.wrap) == Slot::Available => {}
            _ => break,
        }
        n += 1;
        pos = pos.advance(1, size);
    }
    n
}

impl Slot {
    /// The state of a descriptor with `flags` at a position of the lap of `wrap`.
    #[inline(always)]
    pub(super) fn of(flags: u16, wrap: bool) -> Slot {
        slot_state(flags, wrap)
    }
}

/// Flags of a used descriptor written in the lap of `wrap`.
#[inline(always)]
fn used_flags(wrap: bool, write: bool) -> u16 {
    let mut f = if wrap {
        VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED
    } else {
        0
    };
    if write {
        f |= VRING_DESC_F_WRITE;
    }
    f
}

/// Walks one chain of a packed ring from its first slot: descriptors in ring order while
/// NEXT is set, or the entries of one indirect table. Bounded by the ring size (the table's
/// entries for an indirect chain); afterwards `slots` and `id` say how many ring slots the
/// chain took and its buffer id (the last descriptor's).
pub(super) struct PackedChain<'a> {
    ring: &'a PackedRing,
    mem: &'a GuestMemory,
    pos: Pos,
    pub(super) slots: u16,
    pub(super) id: u16,
    done: bool,
    /// An indirect table: address, entries, next entry.
    indirect: Option<(u64, u32, u32)>,
    indirect_ok: bool,
}

impl<'a> PackedChain<'a> {
    pub(super) fn new(ring: &'a PackedRing, pos: Pos, indirect_ok: bool) -> PackedChain<'a> {
        PackedChain {
            ring,
            mem: ring.mem(),
            pos,
            slots: 0,
            id: 0,
            done: false,
            indirect: None,
            indirect_ok,
        }
    }

    /// Walks what is left of the chain (a mergeable-buffer fill stops once the packet is
    /// placed; the chain's slots must still be counted).
    #[inline]
    fn finish(&mut self) -> Result<(), ChainError> {
        while self.next()?.is_some() {}
        Ok(())
    }
}

impl Walk for PackedChain<'_> {
    #[inline(always)]
    fn next(&mut self) -> Result<Option<Descriptor>, ChainError> {
        loop {
            if let Some((table, count, i)) = self.indirect {
                if i >= count {
                    return Ok(None);
                }
                self.indirect = Some((table, count, i + 1));
                let raw = self.mem.read_obj::<16>(table + 16 * u64::from(i))?;
                let d = ferrovs_sys::guest::packed::PackedDescriptor::from_bytes(&raw);
                if d.flags & VRING_DESC_F_INDIRECT != 0 {
                    return Err(ChainError::BadIndirect);
                }
                return Ok(Some(Descriptor {
                    addr: d.addr,
                    len: d.len,
                    flags: d.flags & VRING_DESC_F_WRITE,
                    next: 0,
                }));
            }
            if self.done {
                return Ok(None);
            }
            let size = self.ring.size();
            if self.slots >= size {
                return Err(ChainError::Loop);
            }
            let d = self.ring.desc(self.pos.slot).ok_or(ChainError::BadIndex)?;
            if slot_state(d.flags, self.pos.wrap) != Slot::Available {
                // The first slot was seen available by the caller: a later one that is not
                // is a chain whose flags lie.
                return Err(ChainError::PackedBadFlags);
            }
            let first = self.slots == 0;
            self.slots += 1;
            self.id = d.id;
            self.pos = self.pos.advance(1, size);
            if d.flags & VRING_DESC_F_INDIRECT != 0 {
                let count = d.len / 16;
                if !first
                    || !self.indirect_ok
                    || d.flags & VRING_DESC_F_NEXT != 0
                    || !d.len.is_multiple_of(16)
                    || count == 0
                    || count > 65536
                {
                    return Err(ChainError::BadIndirect);
                }
                self.mem.check_range(d.addr, u64::from(d.len))?;
                self.indirect = Some((d.addr, count, 0));
                self.done = true;
                continue;
            }
            self.done = d.flags & VRING_DESC_F_NEXT == 0;
            return Ok(Some(Descriptor {
                addr: d.addr,
                len: d.len,
                flags: d.flags & VRING_DESC_F_WRITE,
                next: 0,
            }));
        }
    }
}

impl VirtQueue {
    #[inline]
    fn packed_desc_gpa(&self) -> Option<u64> {
        self.desc_gpa
    }

    /// Marks used descriptor `slot` (16 bytes in the descriptor ring) in the dirty log.
    #[inline(always)]
    fn mark_used_desc<M: Marker>(&self, m: &mut M, slot: u16) {
        if let Some(g) = self.packed_desc_gpa() {
            m.mark(g.wrapping_add(16 * u64::from(slot)), 16);
        }
    }

    /// The next available slot's state.
    #[inline]
    fn packed_next(&self, ring: &PackedRing) -> Slot {
        let p = Pos::decode(self.state.last_avail);
        slot_state(ring.desc_flags(p.slot), p.wrap)
    }

    /// Whether the guest made a chain available that we have not consumed.
    pub(super) fn packed_has_pending(&self, ring: &PackedRing) -> bool {
        self.packed_next(ring) != Slot::NotYet
    }

    /// Starting a packed ring: the used position is the available one (we complete in
    /// order); we poll, so the guest is asked not to kick.
    pub(super) fn packed_sync(&mut self, ring: &PackedRing) {
        self.state.used_idx = self.state.last_avail;
        self.signalled_used = self.state.used_idx;
        ring.set_device_event(0, RING_EVENT_FLAGS_DISABLE);
        self.log_used_now(0, 4);
        self.pending_sync = false;
    }

    /// Asks the guest to kick (interrupt mode), or not.
    pub(super) fn packed_kicks(&self, ring: &PackedRing, on: bool) {
        let flags = if on {
            RING_EVENT_FLAGS_ENABLE
        } else {
            RING_EVENT_FLAGS_DISABLE
        };
        ring.set_device_event(0, flags);
        self.log_used_now(0, 4);
    }

    /// Guest TX on a packed ring (see [`VirtQueue::dequeue`]).
    pub(super) fn dequeue_packed<'p>(
        &mut self,
        ring: &PackedRing,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        stats: &QueueStats,
    ) -> usize {
        if let Some(log) = self.logging().cloned() {
            let mut m = Logging::new(&log, self.used_log_addr(), Some(stats));
            self.dequeue_packed_ring(ring, pool, out, max, stats, &mut m)
        } else {
            self.dequeue_packed_ring(ring, pool, out, max, stats, &mut NoLog)
        }
    }

    #[inline]
    fn dequeue_packed_ring<'p, M: Marker>(
        &mut self,
        ring: &PackedRing,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        stats: &QueueStats,
        marker: &mut M,
    ) -> usize {
        if self.broken.is_some() {
            return 0;
        }
        let size = ring.size();
        let mut pos = Pos::decode(self.state.last_avail);
        let n = max.min(out.capacity() - out.len());
        let indirect_ok = self.indirect_ok();
        let (mut pkts, mut bytes, mut chains) = (0u64, 0u64, 0u32);
        let (mut oversize, mut runts, mut bad_offload, mut no_large) = (0u64, 0u64, 0u64, 0u64);
        // Start loading the burst's buffers at once (as on split rings), and a large packet's
        // rest one chain ahead of its copy.
        let ahead = prefetch_burst_packed(ring, pos, n, false) as u64 > BURST_PREFETCH_BYTES;
        // The burst's first used descriptor is written last (as DPDK's shadow used ring
        // does): the driver reads used descriptors in order from that one, so it sees the
        // whole burst at once instead of reading lines we are still writing. With IN_ORDER
        // it is the only one, with the last chain's buffer id: the driver skips the batch
        // (virtio 1.1, packed virtqueues, "In-order use of descriptors"), and the lines of
        // the driver's descriptors are only read here, but one.
        let batch = self.in_order();
        let mut first: Option<(Pos, u16)> = None;
        for _ in 0..n {
            // The descriptor, its flags read first (Acquire): the rest is what the driver
            // wrote before making it available.
            let Some(d) = ring.desc(pos.slot) else { break };
            match slot_state(d.flags, pos.wrap) {
                Slot::Available => {}
                Slot::NotYet => break,
                Slot::Bad => {
                    self.mark_broken(ChainError::PackedBadFlags, stats);
                    break;
                }
            }
            let Some(mut m) = pool.alloc() else {
                stats.drop(DropReason::NoMbuf, 1);
                break;
            };
            if ahead {
                prefetch_ahead_packed(ring, pos.advance(1, size), u64::MAX, false);
            }
            let (res, id, slots) =
                match self.copy_single_out(ring.mem(), d.addr, d.len, d.flags, &mut m) {
                    Some(len) if d.id < size => (Taken::Packet(len), d.id, 1),
                    _ => {
                        let mut chain = PackedChain::new(ring, pos, indirect_ok);
                        let res = self.copy_chain_out(
                            ring.mem(),
                            || PackedChain::new(ring, pos, indirect_ok),
                            &mut chain,
                            pool,
                            &mut m,
                        );
                        match res {
                            Err(ChainError::NotArrived) => break,
                            Err(e) => {
                                self.mark_broken(e, stats);
                                break;
                            }
                            Ok(_) if chain.id >= size => {
                                self.mark_broken(ChainError::PackedBadBufferId, stats);
                                break;
                            }
                            Ok(t) => (t, chain.id, chain.slots),
                        }
                    }
                };
            match &mut first {
                None => first = Some((pos, id)),
                Some((_, first_id)) if batch => *first_id = id,
                Some(_) => {
                    ring.write_used(pos.slot, id, 0, used_flags(pos.wrap, false));
                    self.mark_used_desc(marker, pos.slot);
                }
            }
            pos = pos.advance(slots, size);
            chains += 1;
            match res {
                Taken::Packet(len) if len >= 14 => {
                    m.truncate(len);
                    pkts += 1;
                    bytes += len as u64;
                    out.push(m);
                }
                Taken::Packet(_) => runts += 1,
                Taken::TooBig => oversize += 1,
                Taken::BadOffload => bad_offload += 1,
                Taken::NoLargeBuffer => no_large += 1,
            }
        }
        // Every chain taken gets its used descriptor, a burst cut short by a broken chain too.
        if let Some((p, id)) = first {
            ring.write_used(p.slot, id, 0, used_flags(p.wrap, false));
            self.mark_used_desc(marker, p.slot);
        }
        self.state.last_avail = pos.encode();
        self.state.used_idx = pos.encode();
        self.packed_notify(ring, chains, stats);
        stats.add(pkts, bytes);
        stats.drop(DropReason::BadOffload, bad_offload);
        stats.drop(DropReason::NoMbuf, no_large);
        stats.drop(DropReason::Oversize, oversize);
        stats.drop(DropReason::Runt, runts);
        pkts as usize
    }

    /// Guest RX on a packed ring (see [`VirtQueue::enqueue`]).
    pub(super) fn enqueue_packed<'a, I>(
        &mut self,
        ring: &PackedRing,
        pkts: I,
        stats: &QueueStats,
    ) -> usize
    where
        I: IntoIterator<Item = (&'a [u8], VnetHdr)>,
    {
        if let Some(log) = self.logging().cloned() {
            let mut m = Logging::new(&log, self.used_log_addr(), Some(stats));
            self.enqueue_packed_ring(ring, pkts, stats, &mut m)
        } else {
            self.enqueue_packed_ring(ring, pkts, stats, &mut NoLog)
        }
    }

    #[inline]
    fn enqueue_packed_ring<'a, I, M: Marker>(
        &mut self,
        ring: &PackedRing,
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
        let (mut sent, mut bytes, mut chains) = (0u64, 0u64, 0u32);
        // The burst's used descriptors, written once the burst is placed (below).
        self.shadow.clear();
        let mut burst_slots = 0u32;
        let mut pkts = pkts.into_iter().peekable();
        let n = rx_prefetch_len(&pkts);
        prefetch_burst_packed(ring, Pos::decode(self.state.last_avail), n, true);
        // Large packets (judged by the first) are prefetched one ahead of their copy.
        let ahead = pkts
            .peek()
            .is_some_and(|(p, _)| (self.hdr_len + p.len()) as u64 > BURST_PREFETCH_BYTES);
        while let Some((pkt, hdr)) = pkts.next() {
            if ahead {
                if let Some((next, _)) = pkts.peek() {
                    let len = (self.hdr_len + next.len()) as u64;
                    let next_pos = Pos::decode(self.state.last_avail).advance(1, ring.size());
                    prefetch_ahead_packed(ring, next_pos, len, true);
                }
            }
            if hdr.is_offload() && !caps::accepts(self.rx_caps, &hdr) {
                stats.drop(DropReason::OffloadRefused, 1);
                break;
            }
            let placed = self.shadow.len();
            let res = self.place_packed(ring, pkt, &hdr, marker, &mut burst_slots);
            if !matches!(res, Ok(Some(_))) {
                // A packet not placed leaves nothing behind: the chains it took are not
                // returned, they stay the guest's available buffers.
                self.shadow.truncate(placed);
            }
            match res {
                Ok(Some(n)) => {
                    sent += 1;
                    bytes += pkt.len() as u64;
                    chains += n;
                }
                Ok(None) => break,
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
        self.flush_used_packed(ring, marker);
        self.packed_notify(ring, chains, stats);
        stats.add(sent, bytes);
        sent as usize
    }

    /// Writes the used descriptors of the packets placed in this burst, the first one's
    /// flags last (as DPDK's shadow used ring does for the packed ring): the driver reads
    /// used descriptors in order from that one, so it sees the whole burst at once, and
    /// does not pull a descriptor line to its core between two of our writes to it (four
    /// descriptors share a line).
    #[inline]
    fn flush_used_packed<M: Marker>(&mut self, ring: &PackedRing, marker: &mut M) {
        for &(p, id, len) in self.shadow.iter().skip(1) {
            ring.write_used(p.slot, id, len, used_flags(p.wrap, true));
            self.mark_used_desc(marker, p.slot);
        }
        if let Some(&(p, id, len)) = self.shadow.first() {
            ring.write_used(p.slot, id, len, used_flags(p.wrap, true));
            self.mark_used_desc(marker, p.slot);
        }
        self.shadow.clear();
    }

    /// Places one packet: `Some(buffers used)`, its used descriptors added to the burst's
    /// shadow list; or `None` when the guest has too few buffers (nothing consumed). On
    /// `None` or an error the caller cuts what this added to the shadow list.
    #[inline(always)]
    fn place_packed<M: Marker>(
        &mut self,
        ring: &PackedRing,
        pkt: &[u8],
        vnet: &VnetHdr,
        marker: &mut M,
        burst_slots: &mut u32,
    ) -> Result<Option<u32>, ChainError> {
        let mem = ring.mem();
        let size = ring.size();
        let mrg = self.mrg();
        let total = self.hdr_len + pkt.len();
        let start = Pos::decode(self.state.last_avail);
        let mut pos = start;
        let mut hdr = [0u8; 12];
        if vnet.is_offload() {
            hdr[..vnet::HDR_LEN].copy_from_slice(&vnet.to_bytes());
        }
        let mut taken = *burst_slots;
        // The fast path for the common buffer: one descriptor (no NEXT, no indirect table,
        // writable) that holds header and packet. Anything else, or an error in the copy
        // (which then recurs below and is judged there), takes the general path.
        if taken < u32::from(size) {
            if let Some(d) = ring.desc(start.slot) {
                if slot_state(d.flags, start.wrap) == Slot::Available
                    && d.id < size
                    && self.place_single(mem, d.addr, d.len, d.flags, &mut hdr, pkt, marker)
                {
                    self.shadow.push((start, d.id, total as u32));
                    let next = start.advance(1, size);
                    *burst_slots = taken + 1;
                    self.state.last_avail = next.encode();
                    self.state.used_idx = next.encode();
                    return Ok(Some(1));
                }
            }
        }
        let mut fill = Fill::default();
        let base = self.shadow.len();
        while fill.written < total {
            if taken >= u32::from(size) {
                // Every slot of the ring holds a buffer of this burst and the packet still
                // does not fit: never walk into our own unpublished entries.
                return Ok(None);
            }
            match slot_state(ring.desc_flags(pos.slot), pos.wrap) {
                Slot::Available => {}
                Slot::NotYet => return Ok(None),
                Slot::Bad => return Err(ChainError::PackedBadFlags),
            }
            let mut chain = PackedChain::new(ring, pos, self.indirect_ok());
            let in_buf = self.fill_chain(mem, &mut chain, &mut hdr, pkt, &mut fill, marker)?;
            chain.finish()?;
            if !mrg && fill.written < total {
                // One chain must hold the whole packet without mergeable buffers.
                return Ok(None);
            }
            if chain.id >= size {
                return Err(ChainError::PackedBadBufferId);
            }
            taken += u32::from(chain.slots);
            self.shadow.push((pos, chain.id, in_buf as u32));
            pos = pos.advance(chain.slots, size);
        }
        let nbufs = (self.shadow.len() - base) as u16;
        if mrg && !fill.single {
            if let Some(a) = fill.hdr_addr {
                mem.write(a + 10, &nbufs.to_le_bytes())?;
                marker.mark(a + 10, 2);
            }
        }
        // The packet is whole; its used descriptors wait in the shadow list for the end of
        // the burst.
        *burst_slots = taken;
        self.state.last_avail = pos.encode();
        self.state.used_idx = pos.encode();
        Ok(Some(u32::from(nbufs)))
    }

    /// After a burst that returned `chains` chains: notify the guest now or defer.
    #[inline]
    fn packed_notify(&mut self, ring: &PackedRing, chains: u32, stats: &QueueStats) {
        if chains == 0 {
            return;
        }
        if self.defer_notification(chains, stats) {
            return;
        }
        self.packed_signal(ring, stats);
    }

    /// Notifies the guest of the used descriptors since the last decision, if its event
    /// suppression structure asks for it.
    pub(super) fn packed_signal(&mut self, ring: &PackedRing, stats: &QueueStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let size = ring.size();
        let (old, new) = (
            Pos::decode(self.signalled_used),
            Pos::decode(self.state.used_idx),
        );
        self.signalled_used = self.state.used_idx;
        self.deferred_since = 0;
        self.deferred_pkts = 0;
        if old == new {
            return;
        }
        vring::fence();
        let (off_wrap, flags) = ring.driver_event();
        let want = match flags {
            RING_EVENT_FLAGS_DISABLE => false,
            RING_EVENT_FLAGS_DESC if self.event_idx() => {
                let ev = Pos::decode(off_wrap);
                if ev.slot >= size {
                    // A guest error that costs only the guest a notification too many.
                    true
                } else {
                    let m = 2 * u32::from(size);
                    let (e, n, o) = (ev.lin(size), new.lin(size), old.lin(size));
                    (n + 2 * m - e - 1) % m < (n + m - o) % m
                }
            }
            _ => true,
        };
        match &self.call {
            Some(call) if want => {
                let _ = os::notify(std::os::fd::AsFd::as_fd(call));
                stats.calls.fetch_add(1, Relaxed);
            }
            _ => {
                stats.calls_suppressed.fetch_add(1, Relaxed);
            }
        }
    }
}
