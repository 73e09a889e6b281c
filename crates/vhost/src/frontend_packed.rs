//! The driver side of a packed ring (virtio 1.1+ §2.8), for [`crate::frontend`]'s
//! [`TxQueue`](crate::frontend::TxQueue) and [`RxQueue`](crate::frontend::RxQueue) when
//! `VIRTIO_F_RING_PACKED` was negotiated: one descriptor per buffer, buffer id = buffer
//! index, a batch's first descriptor made available last, used descriptors read in ring order
//! (one slot each: we never chain), and kicks as the device's event structure asks.
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
}

impl PackedDriver {
    pub(crate) fn new(ring: PackedRing, interrupts: bool) -> PackedDriver {
        let d = PackedDriver {
            ring,
            next: 0,
            wrap: true,
            used: 0,
            used_wrap: true,
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
        let flags = self.ring.desc_flags(self.used);
        let a = flags & VRING_PACKED_DESC_F_AVAIL != 0;
        let u = flags & VRING_PACKED_DESC_F_USED != 0;
        if a != self.used_wrap || u != self.used_wrap {
            return None;
        }
        let d = self.ring.desc(self.used)?;
        self.used += 1;
        if self.used == self.ring.size() {
            self.used = 0;
            self.used_wrap = !self.used_wrap;
        }
        Some((d.id, d.len))
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
