//! The memory AF_XDP shares with the kernel: the four rings ([`RingMap`]) and the UMEM
//! ([`Umem`]).
//!
//! Invariants: a [`RingMap`]'s mapping holds its descriptor array and its producer, consumer
//! and flags words at the offsets the kernel gave (checked at mapping); a [`Umem`]'s mapping
//! holds every frame of its geometry. Indices are shared with the kernel and accessed only
//! as atomics (Acquire on the other side's index, Release on ours); slots and frames only
//! with raw volatile copies, never as references. Which side owns a slot is decided by
//! the ring protocol in [`super::rx`] and [`super::tx`].

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::XskGeometry;
use crate::mmap::Mmap;

/// A mapped ring: its indices, flags and descriptor array.
///
/// Invariant: the mapping holds `desc + size * elem` bytes; `prod`, `cons`, `flags` are
/// 4-byte aligned offsets inside it and `desc` is 8-byte aligned; `size` is a power of two.
#[derive(Debug)]
pub(super) struct RingMap {
    map: Mmap,
    prod: usize,
    cons: usize,
    flags: usize,
    desc: usize,
    size: u32,
    elem: usize,
}

impl RingMap {
    pub(super) fn map(
        fd: BorrowedFd<'_>,
        pgoff: u64,
        off: &libc::xdp_ring_offset,
        size: u32,
        elem: usize,
    ) -> io::Result<RingMap> {
        let desc = off.desc as usize;
        let len = desc + size as usize * elem;
        let fits = |o: u64| (o as usize).is_multiple_of(4) && o as usize + 4 <= desc;
        if !(fits(off.producer) && fits(off.consumer) && fits(off.flags) && desc.is_multiple_of(8))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected ring offsets {off:?}"),
            ));
        }
        let map = Mmap::map_shared_populated_at(fd, len, pgoff)?;
        Ok(RingMap {
            map,
            prod: off.producer as usize,
            cons: off.consumer as usize,
            flags: off.flags as usize,
            desc,
            size,
            elem,
        })
    }

    /// Slots in the ring (a power of two).
    #[inline]
    pub(super) fn size(&self) -> u32 {
        self.size
    }

    #[inline]
    fn atomic(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is one of prod/cons/flags: 4-byte aligned and inside the mapping
        // (invariant). The kernel writes it concurrently: atomics are how to share it.
        unsafe { &*(self.map.as_ptr().add(at) as *const AtomicU32) }
    }

    #[inline]
    pub(super) fn producer(&self) -> &AtomicU32 {
        self.atomic(self.prod)
    }

    #[inline]
    pub(super) fn consumer(&self) -> &AtomicU32 {
        self.atomic(self.cons)
    }

    #[inline]
    pub(super) fn needs_wakeup(&self) -> bool {
        self.atomic(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Pointer to slot `idx` (taken modulo the size).
    #[inline]
    fn slot(&self, idx: u32) -> *mut u8 {
        let i = (idx & (self.size - 1)) as usize;
        // SAFETY: `i < size`, so the slot lies inside the mapping (invariant).
        unsafe { self.map.as_ptr().add(self.desc + i * self.elem) }
    }

    #[inline]
    pub(super) fn read_addr(&self, idx: u32) -> u64 {
        debug_assert_eq!(self.elem, 8);
        // SAFETY: an 8-byte aligned slot inside the mapping; a raw read forms no reference.
        unsafe { std::ptr::read_volatile(self.slot(idx) as *const u64) }
    }

    #[inline]
    pub(super) fn write_addr(&self, idx: u32, addr: u64) {
        debug_assert_eq!(self.elem, 8);
        // SAFETY: as for `read_addr`; the slot is ours until we publish the producer.
        unsafe { std::ptr::write_volatile(self.slot(idx) as *mut u64, addr) }
    }

    #[inline]
    pub(super) fn read_desc(&self, idx: u32) -> (u64, u32) {
        debug_assert_eq!(self.elem, 16);
        // SAFETY: a 16-byte slot (xdp_desc) inside the mapping, 8-byte aligned.
        let d = unsafe { std::ptr::read_volatile(self.slot(idx) as *const libc::xdp_desc) };
        (d.addr, d.len)
    }

    #[inline]
    pub(super) fn write_desc(&self, idx: u32, addr: u64, len: u32) {
        debug_assert_eq!(self.elem, 16);
        let d = libc::xdp_desc {
            addr,
            len,
            options: 0,
        };
        // SAFETY: as for `read_desc`; the slot is ours until we publish the producer.
        unsafe { std::ptr::write_volatile(self.slot(idx) as *mut libc::xdp_desc, d) }
    }
}

/// The UMEM: a memfd mapped shared. Invariant: `map` holds `geo.umem_len()` bytes.
#[derive(Debug)]
pub struct Umem {
    pub(super) fd: OwnedFd,
    map: Mmap,
    pub(super) geo: XskGeometry,
}

impl Umem {
    /// A UMEM of `geo` in `map` (of `fd`); refused if the mapping is smaller.
    pub(super) fn new(fd: OwnedFd, map: Mmap, geo: XskGeometry) -> io::Result<Umem> {
        if map.len() < geo.umem_len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "UMEM mapping of {} bytes, {} needed",
                    map.len(),
                    geo.umem_len()
                ),
            ));
        }
        Ok(Umem { fd, map, geo })
    }

    /// Pointer to the start of frame `idx` (`idx < rx_frames + tx_frames`, checked).
    #[inline]
    pub(super) fn frame(&self, idx: u32) -> *mut u8 {
        assert!(idx < self.geo.rx_frames + self.geo.tx_frames);
        // SAFETY: the frame lies inside the mapping (checked above, invariant).
        unsafe {
            self.map
                .as_ptr()
                .add(idx as usize * self.geo.frame_size as usize)
        }
    }
}
