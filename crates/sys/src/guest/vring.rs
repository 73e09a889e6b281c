//! A split virtqueue (virtio 1.x §2.7) laid over guest memory.
//!
//! [`SplitRing::new`] checks once that the descriptor table, the available ring (with
//! `used_event`) and the used ring (with `avail_event`) each lie entirely inside one region
//! and are aligned. From then on every accessor masks its index with `size - 1`, so no
//! guest-written value can move an access outside the ring. Values read from the ring are
//! untrusted: descriptor indices, addresses and lengths are checked by the caller (the
//! `vhost` crate's chain walker) before use.
//!
//! Memory ordering follows the virtio spec: `avail.idx` is read with Acquire before the
//! entries it publishes; used entries are written before `used.idx` is stored with Release.
//! Notification suppression needs a full fence between publishing `used.idx` and reading
//! `used_event`/`avail.flags` ([`fence`]).
//!
//! Thread-safety: a `SplitRing` is owned by whoever processes the queue at a time (a PMD
//! under the queue's lock); it is `Send` but deliberately not `Sync`.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use crate::guest::memory::GuestMemory;

/// A descriptor as read from guest memory (untrusted values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

pub const VRING_DESC_F_NEXT: u16 = 1;
pub const VRING_DESC_F_WRITE: u16 = 2;
pub const VRING_DESC_F_INDIRECT: u16 = 4;
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Largest split ring the virtio spec allows.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Where the frontend placed a ring (frontend-virtual addresses, VHOST_USER_SET_VRING_ADDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingAddrs {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// Why a ring could not be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("queue size {0} is not a power of two in 1..=32768")]
    BadSize(u32),
    #[error("{0} ring is outside guest memory")]
    OutOfMemory(&'static str),
    #[error("{0} ring is misaligned")]
    Misaligned(&'static str),
}

/// A validated split ring.
#[derive(Debug)]
pub struct SplitRing {
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    size: u16,
    /// Keeps the mapping the pointers point into alive.
    mem: Arc<GuestMemory>,
}

// SAFETY: the pointers point into `mem`, which is `Send + Sync` and kept alive by the `Arc`;
// all accesses through them are atomics or raw copies (no references are formed).
unsafe impl Send for SplitRing {}

/// `avail.idx` of one split ring, readable without the ring: the one guest-memory word a
/// PMD reads to learn that an idle queue is still empty. It keeps the mapping alive (the
/// `Arc`), so a read after the frontend replaced its memory table reads the old, still
/// mapped word: a stale value, never a fault of ours. Whoever uses it must know by other
/// means that the ring it came from is still the queue's ring.
#[derive(Debug)]
pub struct AvailProbe {
    idx: *const u8,
    _mem: Arc<GuestMemory>,
}

// SAFETY: `idx` points into `_mem` (`Send + Sync`, kept alive by the `Arc`); it is only read
// with an atomic load.
unsafe impl Send for AvailProbe {}

impl AvailProbe {
    /// `avail.idx`, read with Acquire (as [`SplitRing::avail_idx`]).
    #[inline]
    pub fn avail_idx(&self) -> u16 {
        // SAFETY: `idx` is `avail + 2` of a ring checked in `SplitRing::new` (inside the
        // mapping, 2-byte aligned), and the mapping lives as long as `self._mem`. Guest
        // memory another process writes is read through an atomic, as in `atomic_u16`.
        let a = unsafe { &*(self.idx as *const AtomicU16) };
        u16::from_le(a.load(Ordering::Acquire))
    }

    /// Starts loading the line of `avail.idx` (a hint: [`crate::os::prefetch`]).
    #[inline]
    pub fn prefetch(&self) {
        crate::os::prefetch(self.idx);
    }
}

impl SplitRing {
    /// Places a ring of `size` entries at `addrs` in `mem`, checking bounds and alignment.
    pub fn new(mem: Arc<GuestMemory>, addrs: RingAddrs, size: u32) -> Result<SplitRing, RingError> {
        if size == 0 || size > MAX_QUEUE_SIZE as u32 || !size.is_power_of_two() {
            return Err(RingError::BadSize(size));
        }
        let n = size as u64;
        let place = |what: &'static str, addr: u64, len: u64, align: u64| {
            if !addr.is_multiple_of(align) {
                return Err(RingError::Misaligned(what));
            }
            mem.uaddr_range(addr, len)
                .ok_or(RingError::OutOfMemory(what))
        };
        let desc = place("descriptor", addrs.desc, 16 * n, 16)?;
        let avail = place("available", addrs.avail, 6 + 2 * n, 2)?;
        let used = place("used", addrs.used, 6 + 8 * n, 4)?;
        Ok(SplitRing {
            desc,
            avail,
            used,
            size: size as u16,
            mem,
        })
    }

    /// Number of entries.
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
        // SAFETY: callers pass offsets inside the area checked in `new` and 2-byte aligned
        // (ring bases are aligned, offsets even); the memory lives as long as `self.mem`.
        // An `AtomicU16` may alias memory another process writes: atomics are the sanctioned
        // way to share it.
        unsafe { &*(base.add(off) as *const AtomicU16) }
    }

    /// A read-only handle on this ring's `avail.idx` that outlives the ring's owner's lock
    /// (a PMD's check of an idle queue without taking it: [`AvailProbe`]).
    pub fn avail_probe(&self) -> AvailProbe {
        AvailProbe {
            idx: self.avail.wrapping_add(2),
            _mem: self.mem.clone(),
        }
    }

    /// `avail.flags`.
    #[inline]
    pub fn avail_flags(&self) -> u16 {
        u16::from_le(self.atomic_u16(self.avail, 0).load(Ordering::Acquire))
    }

    /// `avail.idx`, read with Acquire so that the entries it covers are visible.
    #[inline]
    pub fn avail_idx(&self) -> u16 {
        u16::from_le(self.atomic_u16(self.avail, 2).load(Ordering::Acquire))
    }

    /// `avail.ring[slot % size]`: an untrusted head index.
    #[inline]
    pub fn avail_entry(&self, slot: u16) -> u16 {
        let i = (slot & (self.size - 1)) as usize;
        u16::from_le(
            self.atomic_u16(self.avail, 4 + 2 * i)
                .load(Ordering::Relaxed),
        )
    }

    /// `used_event` (EVENT_IDX): the guest wants an interrupt once used.idx passes it.
    #[inline]
    pub fn used_event(&self) -> u16 {
        let off = 4 + 2 * self.size as usize;
        u16::from_le(self.atomic_u16(self.avail, off).load(Ordering::Acquire))
    }

    /// Descriptor `index` of the table, or `None` when `index >= size` (a guest error).
    #[inline]
    pub fn desc(&self, index: u16) -> Option<Descriptor> {
        if index >= self.size {
            return None;
        }
        let mut raw = [0u8; 16];
        // SAFETY: `index < size`, so the 16 bytes lie in the descriptor table checked in `new`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.desc.add(16 * index as usize), raw.as_mut_ptr(), 16)
        };
        Some(Descriptor::from_bytes(&raw))
    }

    /// Writes used-ring entry `slot % size`. Not visible to the guest until [`publish_used`].
    ///
    /// [`publish_used`]: SplitRing::publish_used
    #[inline]
    pub fn write_used(&self, slot: u16, id: u16, len: u32) {
        let i = (slot & (self.size - 1)) as usize;
        let mut raw = [0u8; 8];
        raw[..4].copy_from_slice(&(id as u32).to_le_bytes());
        raw[4..].copy_from_slice(&len.to_le_bytes());
        // SAFETY: `i < size`, so the 8 bytes lie in the used ring checked in `new`.
        unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr(), self.used.add(4 + 8 * i), 8) };
    }

    /// `used.idx`.
    #[inline]
    pub fn used_idx(&self) -> u16 {
        u16::from_le(self.atomic_u16(self.used, 2).load(Ordering::Acquire))
    }

    /// Stores `used.idx` with Release: the entries written before become visible.
    #[inline]
    pub fn publish_used(&self, idx: u16) {
        self.atomic_u16(self.used, 2)
            .store(idx.to_le(), Ordering::Release);
    }

    /// `used.flags` (VRING_USED_F_NO_NOTIFY).
    #[inline]
    pub fn set_used_flags(&self, flags: u16) {
        self.atomic_u16(self.used, 0)
            .store(flags.to_le(), Ordering::Release);
    }

    /// `used.flags`.
    #[inline]
    pub fn used_flags(&self) -> u16 {
        u16::from_le(self.atomic_u16(self.used, 0).load(Ordering::Acquire))
    }

    /// `avail_event` (EVENT_IDX): we want a kick once avail.idx passes it.
    #[inline]
    pub fn set_avail_event(&self, idx: u16) {
        let off = 4 + 8 * self.size as usize;
        self.atomic_u16(self.used, off)
            .store(idx.to_le(), Ordering::Release);
    }

    /// Frontend-virtual addresses and lengths of the three ring areas (for prefaulting and
    /// dirty logging).
    pub fn used_area_len(&self) -> u64 {
        6 + 8 * self.size as u64
    }
}

/// Driver-side accessors, for the frontend (`ferrovs-gen`, mock guests in tests), which
/// owns the ring memory and plays the guest's part.
impl SplitRing {
    /// Writes descriptor `index` (ignored when out of range).
    #[inline]
    pub fn write_desc(&self, index: u16, d: Descriptor) {
        if index >= self.size {
            return;
        }
        let raw = d.to_bytes();
        // SAFETY: `index < size`: the 16 bytes lie in the descriptor table checked in `new`.
        unsafe {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), self.desc.add(16 * index as usize), 16)
        };
    }

    /// Writes `avail.ring[slot % size]`.
    #[inline]
    pub fn write_avail_entry(&self, slot: u16, head: u16) {
        let i = (slot & (self.size - 1)) as usize;
        self.atomic_u16(self.avail, 4 + 2 * i)
            .store(head.to_le(), Ordering::Relaxed);
    }

    /// Publishes `avail.idx` with Release.
    #[inline]
    pub fn publish_avail(&self, idx: u16) {
        self.atomic_u16(self.avail, 2)
            .store(idx.to_le(), Ordering::Release);
    }

    /// `avail.flags` (VRING_AVAIL_F_NO_INTERRUPT).
    #[inline]
    pub fn set_avail_flags(&self, flags: u16) {
        self.atomic_u16(self.avail, 0)
            .store(flags.to_le(), Ordering::Release);
    }

    /// Sets `used_event` (EVENT_IDX, driver side).
    #[inline]
    pub fn set_used_event(&self, idx: u16) {
        let off = 4 + 2 * self.size as usize;
        self.atomic_u16(self.avail, off)
            .store(idx.to_le(), Ordering::Release);
    }

    /// `avail_event` (EVENT_IDX, written by the device).
    #[inline]
    pub fn avail_event(&self) -> u16 {
        let off = 4 + 8 * self.size as usize;
        u16::from_le(self.atomic_u16(self.used, off).load(Ordering::Acquire))
    }

    /// Reads used entry `slot % size` as `(id, len)` (untrusted when the device is).
    #[inline]
    pub fn read_used(&self, slot: u16) -> (u32, u32) {
        let i = (slot & (self.size - 1)) as usize;
        let mut raw = [0u8; 8];
        // SAFETY: `i < size`: the 8 bytes lie in the used ring checked in `new`.
        unsafe { std::ptr::copy_nonoverlapping(self.used.add(4 + 8 * i), raw.as_mut_ptr(), 8) };
        (
            u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]),
            u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]),
        )
    }
}

impl Descriptor {
    /// Decodes a descriptor from its 16 little-endian bytes.
    #[inline]
    pub fn from_bytes(raw: &[u8; 16]) -> Descriptor {
        Descriptor {
            addr: u64::from_le_bytes(raw[0..8].try_into().unwrap_or_default()),
            len: u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default()),
            flags: u16::from_le_bytes([raw[12], raw[13]]),
            next: u16::from_le_bytes([raw[14], raw[15]]),
        }
    }

    /// Encodes the descriptor (used by the frontend side: ferrovs-gen and test drivers).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&self.addr.to_le_bytes());
        raw[8..12].copy_from_slice(&self.len.to_le_bytes());
        raw[12..14].copy_from_slice(&self.flags.to_le_bytes());
        raw[14..16].copy_from_slice(&self.next.to_le_bytes());
        raw
    }
}

/// A full memory fence, for the notification-suppression races of virtio §2.7.7/§2.7.10.
#[inline]
pub fn fence() {
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// `vring_need_event` of the virtio spec: whether moving an index from `old` to `new` crosses
/// `event`.
#[inline]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::memory::RegionDesc;
    use crate::os::memfd;

    fn mem() -> Arc<GuestMemory> {
        let fd = memfd("ring", 65536, false).unwrap();
        let r = RegionDesc {
            gpa: 0,
            size: 65536,
            uaddr: 0x7000_0000,
            mmap_offset: 0,
        };
        Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap())
    }

    #[test]
    fn rejects_bad_placement() {
        let m = mem();
        let base = 0x7000_0000;
        let ok = RingAddrs {
            desc: base,
            avail: base + 4096,
            used: base + 8192,
        };
        assert!(SplitRing::new(m.clone(), ok, 256).is_ok());
        assert_eq!(
            SplitRing::new(m.clone(), ok, 255).unwrap_err(),
            RingError::BadSize(255)
        );
        assert_eq!(
            SplitRing::new(m.clone(), ok, 65536).unwrap_err(),
            RingError::BadSize(65536)
        );
        let past_end = RingAddrs {
            used: base + 65536 - 8,
            ..ok
        };
        assert_eq!(
            SplitRing::new(m.clone(), past_end, 256).unwrap_err(),
            RingError::OutOfMemory("used")
        );
        let odd = RingAddrs {
            desc: base + 8,
            ..ok
        };
        assert_eq!(
            SplitRing::new(m.clone(), odd, 256).unwrap_err(),
            RingError::Misaligned("descriptor")
        );
        let outside = RingAddrs {
            avail: 0x1000,
            ..ok
        };
        assert_eq!(
            SplitRing::new(m, outside, 256).unwrap_err(),
            RingError::OutOfMemory("available")
        );
    }

    #[test]
    fn indices_are_masked() {
        let m = mem();
        let base = 0x7000_0000;
        let r = SplitRing::new(
            m.clone(),
            RingAddrs {
                desc: base,
                avail: base + 4096,
                used: base + 8192,
            },
            4,
        )
        .unwrap();
        r.write_used(7, 3, 99); // slot 7 → entry 3
        r.publish_used(8);
        let e = m.read_obj::<8>(8192 + 4 + 8 * 3).unwrap();
        assert_eq!(u32::from_le_bytes(e[..4].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(e[4..].try_into().unwrap()), 99);
        assert_eq!(r.used_idx(), 8);
        assert!(r.desc(4).is_none());
        assert!(r.desc(3).is_some());
    }

    #[test]
    fn need_event_matches_spec() {
        assert!(need_event(0, 1, 0));
        assert!(!need_event(1, 1, 0));
        assert!(need_event(5, 10, 3));
        assert!(!need_event(10, 10, 3));
        assert!(need_event(65535, 2, 65534)); // wraps
    }
}
