//! A packed virtqueue (virtio 1.1+ §2.8 "Packed Virtqueues") laid over guest memory.
//!
//! One descriptor ring, written by both sides, and two 4-byte event suppression structures:
//! the driver's (in the area vhost-user calls the "available" ring address) and the device's
//! (the "used" address). [`PackedRing::new`] checks once that each lies inside one region
//! and is aligned; from then on every accessor takes a slot below `size` or does nothing, so
//! no guest-written value can move an access outside the ring. Values read from the ring are
//! untrusted: the caller (the `vhost` crate's packed queue) checks flags, ids, addresses and
//! lengths before use.
//!
//! Memory ordering (§2.8.21): a descriptor's `flags` are read with Acquire before its other
//! fields, and written with Release after them, by both sides; notification suppression needs
//! a full fence between writing descriptors and reading the other side's event structure
//! ([`crate::guest::vring::fence`]).
//!
//! Thread-safety: a `PackedRing` is owned by whoever processes the queue at a time (a PMD
//! under the queue's lock, or the frontend's driver); it is `Send` but not `Sync`.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use crate::guest::memory::GuestMemory;
use crate::guest::vring::{RingAddrs, RingError};

/// Descriptor flag: the driver made it available when it equals the driver's wrap counter.
pub const VRING_PACKED_DESC_F_AVAIL: u16 = 1 << 7;
/// Descriptor flag: the device used it when it equals the device's wrap counter.
pub const VRING_PACKED_DESC_F_USED: u16 = 1 << 15;
/// Event suppression flags (`desc_event_flags`).
pub const RING_EVENT_FLAGS_ENABLE: u16 = 0;
pub const RING_EVENT_FLAGS_DISABLE: u16 = 1;
/// Notify at the descriptor named by `desc_event_off_wrap` (needs EVENT_IDX).
pub const RING_EVENT_FLAGS_DESC: u16 = 2;

/// Largest packed ring the virtio spec allows (any size up to it, not only powers of two).
pub const MAX_PACKED_SIZE: u32 = 32768;

/// A packed descriptor as read from guest memory (untrusted values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackedDescriptor {
    pub addr: u64,
    pub len: u32,
    /// Buffer id (the driver's; echoed in the used descriptor).
    pub id: u16,
    pub flags: u16,
}

impl PackedDescriptor {
    /// Decodes a descriptor from its 16 little-endian bytes.
    #[inline]
    pub fn from_bytes(raw: &[u8; 16]) -> PackedDescriptor {
        PackedDescriptor {
            addr: u64::from_le_bytes(raw[0..8].try_into().unwrap_or_default()),
            len: u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default()),
            id: u16::from_le_bytes([raw[12], raw[13]]),
            flags: u16::from_le_bytes([raw[14], raw[15]]),
        }
    }

    /// Encodes the descriptor.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&self.addr.to_le_bytes());
        raw[8..12].copy_from_slice(&self.len.to_le_bytes());
        raw[12..14].copy_from_slice(&self.id.to_le_bytes());
        raw[14..16].copy_from_slice(&self.flags.to_le_bytes());
        raw
    }
}

/// A validated packed ring.
#[derive(Debug)]
pub struct PackedRing {
    desc: *mut u8,
    driver: *mut u8,
    device: *mut u8,
    size: u16,
    /// Keeps the mapping the pointers point into alive.
    mem: Arc<GuestMemory>,
}

// SAFETY: the pointers point into `mem`, which is `Send + Sync` and kept alive by the `Arc`;
// all accesses through them are atomics or raw copies (no references are formed).
unsafe impl Send for PackedRing {}

impl PackedRing {
    /// Places a ring of `size` descriptors at `addrs.desc`, the driver event structure at
    /// `addrs.avail` and the device's at `addrs.used`, checking bounds and alignment.
    pub fn new(
        mem: Arc<GuestMemory>,
        addrs: RingAddrs,
        size: u32,
    ) -> Result<PackedRing, RingError> {
        if size == 0 || size > MAX_PACKED_SIZE {
            return Err(RingError::BadSize(size));
        }
        let place = |what: &'static str, addr: u64, len: u64, align: u64| {
            if !addr.is_multiple_of(align) {
                return Err(RingError::Misaligned(what));
            }
            mem.uaddr_range(addr, len)
                .ok_or(RingError::OutOfMemory(what))
        };
        let desc = place("descriptor", addrs.desc, 16 * u64::from(size), 16)?;
        let driver = place("driver event", addrs.avail, 4, 4)?;
        let device = place("device event", addrs.used, 4, 4)?;
        Ok(PackedRing {
            desc,
            driver,
            device,
            size: size as u16,
            mem,
        })
    }

    /// Number of descriptors (1..=32768).
    #[inline]
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The guest memory this ring lives in.
    #[inline]
    pub fn mem(&self) -> &Arc<GuestMemory> {
        &self.mem
    }

    #[inline]
    fn atomic_u16(&self, base: *mut u8, off: usize) -> &AtomicU16 {
        // SAFETY: callers pass even offsets inside an area checked in `new` (descriptor
        // offsets are below 16 * size, event offsets below 4); bases are aligned. The memory
        // lives as long as `self.mem`; atomics are the sanctioned way to share memory another
        // process writes.
        unsafe { &*(base.add(off) as *const AtomicU16) }
    }

    /// `flags` of descriptor `slot`, read with Acquire (the descriptor's other fields read
    /// after it are those the driver wrote before making it available); 0 past the ring.
    #[inline]
    pub fn desc_flags(&self, slot: u16) -> u16 {
        if slot >= self.size {
            return 0;
        }
        u16::from_le(
            self.atomic_u16(self.desc, 16 * slot as usize + 14)
                .load(Ordering::Acquire),
        )
    }

    /// Descriptor `slot` (flags read first, with Acquire), or `None` when `slot >= size`.
    #[inline]
    pub fn desc(&self, slot: u16) -> Option<PackedDescriptor> {
        if slot >= self.size {
            return None;
        }
        let flags = self.desc_flags(slot);
        let mut raw = [0u8; 16];
        // SAFETY: `slot < size`: the first 14 bytes of the descriptor lie in the table checked
        // in `new`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.desc.add(16 * slot as usize), raw.as_mut_ptr(), 14)
        };
        let mut d = PackedDescriptor::from_bytes(&raw);
        d.flags = flags;
        Some(d)
    }

    /// Writes descriptor `slot`: address, length and id first, then `flags` with Release (what
    /// hands the descriptor over to the other side). Ignored when `slot >= size`.
    #[inline]
    pub fn write_desc(&self, slot: u16, d: PackedDescriptor) {
        if slot >= self.size {
            return;
        }
        let raw = d.to_bytes();
        // SAFETY: `slot < size`: the first 14 bytes of the descriptor lie in the table.
        unsafe {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), self.desc.add(16 * slot as usize), 14)
        };
        self.atomic_u16(self.desc, 16 * slot as usize + 14)
            .store(d.flags.to_le(), Ordering::Release);
    }

    /// Device side: writes used descriptor `slot` (`id`, `len`, then `flags` with Release;
    /// the address is left as the driver wrote it). Ignored when `slot >= size`.
    #[inline]
    pub fn write_used(&self, slot: u16, id: u16, len: u32, flags: u16) {
        if slot >= self.size {
            return;
        }
        let mut raw = [0u8; 6];
        raw[..4].copy_from_slice(&len.to_le_bytes());
        raw[4..].copy_from_slice(&id.to_le_bytes());
        // SAFETY: `slot < size`: bytes 8..14 of the descriptor lie in the table.
        unsafe {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), self.desc.add(16 * slot as usize + 8), 6)
        };
        self.atomic_u16(self.desc, 16 * slot as usize + 14)
            .store(flags.to_le(), Ordering::Release);
    }

    /// The driver's event suppression structure: `(desc_event_off_wrap, desc_event_flags)`.
    #[inline]
    pub fn driver_event(&self) -> (u16, u16) {
        (
            u16::from_le(self.atomic_u16(self.driver, 0).load(Ordering::Acquire)),
            u16::from_le(self.atomic_u16(self.driver, 2).load(Ordering::Acquire)),
        )
    }

    /// The device's event suppression structure.
    #[inline]
    pub fn device_event(&self) -> (u16, u16) {
        (
            u16::from_le(self.atomic_u16(self.device, 0).load(Ordering::Acquire)),
            u16::from_le(self.atomic_u16(self.device, 2).load(Ordering::Acquire)),
        )
    }

    /// Device side: writes its event suppression structure (offset first, then flags).
    #[inline]
    pub fn set_device_event(&self, off_wrap: u16, flags: u16) {
        self.atomic_u16(self.device, 0)
            .store(off_wrap.to_le(), Ordering::Release);
        self.atomic_u16(self.device, 2)
            .store(flags.to_le(), Ordering::Release);
    }

    /// Driver side: writes its event suppression structure.
    #[inline]
    pub fn set_driver_event(&self, off_wrap: u16, flags: u16) {
        self.atomic_u16(self.driver, 0)
            .store(off_wrap.to_le(), Ordering::Release);
        self.atomic_u16(self.driver, 2)
            .store(flags.to_le(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::memory::RegionDesc;
    use crate::os::memfd;

    fn mem() -> Arc<GuestMemory> {
        let fd = memfd("packed", 65536, false).unwrap();
        let r = RegionDesc {
            gpa: 0,
            size: 65536,
            uaddr: 0x7000_0000,
            mmap_offset: 0,
        };
        Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap())
    }

    const BASE: u64 = 0x7000_0000;
    const OK: RingAddrs = RingAddrs {
        desc: BASE,
        avail: BASE + 8192,
        used: BASE + 8196,
    };

    #[test]
    fn placement_is_checked() {
        let m = mem();
        assert!(PackedRing::new(m.clone(), OK, 256).is_ok());
        // Any size up to 32768 (not only powers of two).
        assert!(PackedRing::new(m.clone(), OK, 255).is_ok());
        assert_eq!(
            PackedRing::new(m.clone(), OK, 0).unwrap_err(),
            RingError::BadSize(0)
        );
        assert_eq!(
            PackedRing::new(m.clone(), OK, 32769).unwrap_err(),
            RingError::BadSize(32769)
        );
        let odd = RingAddrs {
            desc: BASE + 8,
            ..OK
        };
        assert_eq!(
            PackedRing::new(m.clone(), odd, 16).unwrap_err(),
            RingError::Misaligned("descriptor")
        );
        let past = RingAddrs {
            used: BASE + 65536 - 2,
            ..OK
        };
        assert!(PackedRing::new(m.clone(), past, 16).is_err());
        let big = RingAddrs {
            desc: BASE + 4096,
            ..OK
        };
        assert_eq!(
            PackedRing::new(m, big, 4096).unwrap_err(),
            RingError::OutOfMemory("descriptor")
        );
    }

    #[test]
    fn slots_past_the_ring_are_ignored() {
        let m = mem();
        let r = PackedRing::new(m.clone(), OK, 4).unwrap();
        let d = PackedDescriptor {
            addr: 0x1234,
            len: 60,
            id: 3,
            flags: VRING_PACKED_DESC_F_AVAIL,
        };
        r.write_desc(2, d);
        assert_eq!(r.desc(2), Some(d));
        r.write_desc(4, d);
        assert_eq!(r.desc(4), None);
        assert_eq!(r.desc_flags(4), 0);
        r.write_used(
            2,
            1,
            99,
            VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED,
        );
        let u = r.desc(2).unwrap();
        assert_eq!((u.addr, u.len, u.id), (0x1234, 99, 1));
        r.set_device_event(5, RING_EVENT_FLAGS_DISABLE);
        assert_eq!(r.device_event(), (5, RING_EVENT_FLAGS_DISABLE));
        r.set_driver_event(0x8001, RING_EVENT_FLAGS_DESC);
        assert_eq!(r.driver_event(), (0x8001, RING_EVENT_FLAGS_DESC));
    }
}
