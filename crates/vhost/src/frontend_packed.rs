//! The driver side of a packed ring (virtio 1.1+ §2.8), for [`crate::frontend`]'s
//! [`TxQueue`](crate::frontend::TxQueue) and [`RxQueue`](crate::frontend::RxQueue) when
//! `VIRTIO_F_RING_PACKED` was negotiated: one descriptor per buffer, buffer id = buffer
//! index, a batch's first descriptor made available last, used descriptors read in ring order
//! (one slot each: we never chain; on the transmit side, with `IN_ORDER`, one used descriptor
//! may stand for a batch), and kicks as the device's event structure asks.
//!
//! The backend is untrusted here too: a used descriptor with an id out of range is counted
//! and skipped, never indexed.
//!
//! Thread-safety: owned by the one thread that drives the queue.

use std::os::fd::{AsFd, OwnedFd};

use ferrovs_sys::guest::packed::{
    PackedDescriptor, PackedRing, RING_EVENT_FLAGS_DESC, RING_EVENT_FLAGS_DISABLE,
    RING_EVENT_FLAGS_ENABLE, VRING_PACKED_DESC_F_AVAIL, VRING_PACKED_DESC_F_USED,
};
use ferrovs_sys::guest::vring;
use ferrovs_sys::os;

/// The initial position (slot 0, wrap counter 1) in the vhost-user SET_VRING_BASE encoding:
/// available in bits 0–15, used in 16–31.
pub(crate) const START_BASE: u32 = 0x8000_8000;

/// A packed ring as the driver sees it.
#[derive(Debug)]
pub(crate) struct PackedDriver {
    pub(crate) ring: PackedRing,
    next: u16,
    wrap: bool,
    used: u16,
    used_wrap: bool,
    /// The buffer id made available at each slot, and how many slots are in flight: with
    /// `IN_ORDER` one used descriptor may stand for a batch (below).
    ids: Vec<u16>,
    in_flight: u16,
}

impl PackedDriver {
    pub(crate) fn new(ring: PackedRing, interrupts: bool) -> PackedDriver {
        let d = PackedDriver {
            next: 0,
            wrap: true,
            used: 0,
            used_wrap: true,
            ids: vec![0; usize::from(ring.size())],
            in_flight: 0,
            ring,
        };
        d.set_interrupts(interrupts);
        d
    }

    /// Asks the device for a notification on each used buffer, or for none (polling).
    pub(crate) fn set_interrupts(&self, on: bool) {
        let f = if on {
            RING_EVENT_FLAGS_ENABLE
        } else {
            RING_EVENT_FLAGS_DISABLE
        };
        self.ring.set_driver_event(0, f);
    }

    fn pos(&self) -> u16 {
        self.next | if self.wrap { 1 << 15 } else { 0 }
    }

    /// Makes the buffers `(addr, len, id)` available, the first one's flags written last;
    /// `write`: device-writable (receive buffers). Returns the position before them.
    pub(crate) fn post(&mut self, bufs: &[(u64, u32, u16)], write: bool) -> u16 {
        let old = self.pos();
        let mut first = None;
        for &(addr, len, id) in bufs {
            let mut flags = if self.wrap {
                VRING_PACKED_DESC_F_AVAIL
            } else {
                VRING_PACKED_DESC_F_USED
            };
            if write {
                flags |= vring::VRING_DESC_F_WRITE;
            }
            let d = PackedDescriptor {
                addr,
                len,
                id,
                flags,
            };
            if first.is_none() {
                first = Some((self.next, d));
            } else {
                self.ring.write_desc(self.next, d);
            }
            if let Some(slot) = self.ids.get_mut(usize::from(self.next)) {
                *slot = id;
            }
            self.in_flight = self.in_flight.saturating_add(1);
            self.next += 1;
            if self.next == self.ring.size() {
                self.next = 0;
                self.wrap = !self.wrap;
            }
        }
        if let Some((slot, d)) = first {
            self.ring.write_desc(slot, d);
        }
        old
    }

    /// The next used descriptor, if the device wrote it: `(id, len)`.
    pub(crate) fn take_used(&mut self) -> Option<(u16, u32)> {
        let d = self.peek_used()?;
        self.advance_used();
        Some((d.id, d.len))
    }

    /// The next used descriptor, as a batch: the ids of the buffers it stands for, in ring
    /// order, to `each`. With `IN_ORDER` the device may write one used descriptor for a
    /// batch, with the last buffer's id, at the batch's first slot (virtio 1.1, packed
    /// virtqueues, "In-order use of descriptors"); the slots up to the one that held that id
    /// are then used too. An id no buffer in flight has is taken as one buffer (the caller
    /// checks it). Returns how many buffers, or `None` when nothing is used.
    pub(crate) fn take_used_batch(&mut self, mut each: impl FnMut(u16)) -> Option<usize> {
        let d = self.peek_used()?;
        let size = self.ring.size();
        let mut span = 1;
        let mut slot = self.used;
        for k in 1..=self.in_flight {
            if self.ids.get(usize::from(slot)) == Some(&d.id) {
                span = k;
                break;
            }
            slot = if slot + 1 == size { 0 } else { slot + 1 };
        }
        if span == 1 {
            self.advance_used();
            each(d.id);
            return Some(1);
        }
        for _ in 0..span {
            each(
                self.ids
                    .get(usize::from(self.used))
                    .copied()
                    .unwrap_or(u16::MAX),
            );
            self.advance_used();
        }
        Some(usize::from(span))
    }

    fn peek_used(&self) -> Option<PackedDescriptor> {
        let flags = self.ring.desc_flags(self.used);
        let a = flags & VRING_PACKED_DESC_F_AVAIL != 0;
        let u = flags & VRING_PACKED_DESC_F_USED != 0;
        if a != self.used_wrap || u != self.used_wrap {
            return None;
        }
        self.ring.desc(self.used)
    }

    fn advance_used(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.used += 1;
        if self.used == self.ring.size() {
            self.used = 0;
            self.used_wrap = !self.used_wrap;
        }
    }

    /// Kicks the device after making buffers available from position `old` on, if its event
    /// structure asks for it.
    pub(crate) fn kick_if_needed(&self, kick: &OwnedFd, old: u16) {
        vring::fence();
        let (off_wrap, flags) = self.ring.device_event();
        let want = match flags {
            RING_EVENT_FLAGS_DISABLE => false,
            RING_EVENT_FLAGS_DESC => {
                let size = u32::from(self.ring.size());
                let lin = |v: u16| u32::from(v & 0x7fff) + if v & 0x8000 != 0 { size } else { 0 };
                let m = 2 * size;
                let (e, n, o) = (lin(off_wrap), lin(self.pos()), lin(old));
                (n + 2 * m - e - 1) % m < (n + m - o) % m
            }
            _ => true,
        };
        if want {
            let _ = os::notify(kick.as_fd());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_sys::guest::memory::{GuestMemory, RegionDesc};
    use ferrovs_sys::guest::vring::RingAddrs;
    use ferrovs_sys::os::memfd;
    use std::sync::Arc;

    const BASE: u64 = 0x3000_0000;
    const USED: u16 = VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED;

    fn driver() -> PackedDriver {
        let fd = memfd("frontend-packed", 65536, false).unwrap();
        let r = RegionDesc {
            gpa: 0,
            size: 65536,
            uaddr: BASE,
            mmap_offset: 0,
        };
        let mem = Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap());
        let addrs = RingAddrs {
            desc: BASE,
            avail: BASE + 8192,
            used: BASE + 8196,
        };
        PackedDriver::new(PackedRing::new(mem, addrs, 16).unwrap(), false)
    }

    fn batch(d: &mut PackedDriver) -> Option<Vec<u16>> {
        let mut ids = Vec::new();
        let n = d.take_used_batch(|id| ids.push(id))?;
        assert_eq!(n, ids.len());
        Some(ids)
    }

    /// One used descriptor with the last buffer's id stands for the batch up to it (an
    /// in-order device); one per buffer reads as before; an id no buffer in flight has is
    /// one buffer, not a walk over the ring.
    #[test]
    fn a_used_descriptor_stands_for_the_in_order_batch_up_to_its_id() {
        let mut d = driver();
        let bufs: Vec<_> = (10..15)
            .map(|id| (0x1000 * u64::from(id), 64, id))
            .collect();
        d.post(&bufs, false);
        assert_eq!(batch(&mut d), None);
        d.ring.write_used(0, 13, 0, USED);
        assert_eq!(batch(&mut d), Some(vec![10, 11, 12, 13]));
        assert_eq!(batch(&mut d), None);
        d.ring.write_used(4, 14, 0, USED);
        assert_eq!(batch(&mut d), Some(vec![14]));
        d.post(&[(0x1000, 64, 3)], false);
        d.ring.write_used(5, 99, 0, USED);
        assert_eq!(batch(&mut d), Some(vec![99]));
        assert_eq!(d.in_flight, 0);
    }
}
