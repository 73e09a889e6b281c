//! The guest memory table.
//!
//! A vhost-user frontend describes guest RAM as regions: a guest-physical range, the
//! frontend's own virtual address of it (used for vring addresses) and an fd + offset to map.
//! [`GuestMemory::map`] validates a table once (sizes, overflow, overlaps, the fd really holds
//! what the table claims) and maps it. Afterwards every access goes through a translation that
//! checks the whole `[addr, addr + len)` range: no guest-provided address can make us touch
//! memory outside a region.
//!
//! Thread-safety: `GuestMemory` is immutable once built and shared through `Arc` by the
//! control thread and PMD threads. A new memory table builds a new `GuestMemory`; the old one
//! is unmapped when the last ring that uses it is dropped.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::mmap::Mmap;

/// One region as the frontend describes it (VHOST_USER_SET_MEM_TABLE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDesc {
    /// Guest-physical address of the region.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
    /// The frontend process's virtual address of the region.
    pub uaddr: u64,
    /// Offset of the region in its fd.
    pub mmap_offset: u64,
}

/// Why a memory table was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("region {index}: zero size")]
    ZeroSize { index: usize },
    #[error("region {index}: address range overflows")]
    Overflow { index: usize },
    #[error("region {index} overlaps region {other}")]
    Overlap { index: usize, other: usize },
    #[error("region {index}: fd holds {fd_size} bytes, table claims {claimed}")]
    FdTooSmall {
        index: usize,
        fd_size: u64,
        claimed: u64,
    },
    #[error("region {index}: cannot map")]
    Map {
        index: usize,
        #[source]
        source: io::Error,
    },
    #[error("region {index}: cannot stat fd")]
    Stat {
        index: usize,
        #[source]
        source: io::Error,
    },
    #[error("too many regions: {0}")]
    TooMany(usize),
}

/// An access outside every region of guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("guest address {addr:#x}+{len} is outside guest memory")]
pub struct OutOfBounds {
    pub addr: u64,
    pub len: u64,
}

/// Most regions a frontend may send (QEMU sends at most 8, or 509 with CONFIGURE_MEM_SLOTS).
pub const MAX_REGIONS: usize = 512;

#[derive(Debug)]
struct Region {
    desc: RegionDesc,
    /// Dropped before `map`: the range is unregistered before it is unmapped.
    sigbus: crate::sigbus::Guard,
    map: Mmap,
    fd: OwnedFd,
}

impl Region {
    /// Host pointer of region byte `off` (`off < desc.size`).
    fn host(&self, off: u64) -> *mut u8 {
        debug_assert!(off < self.desc.size);
        // SAFETY: the mapping covers `mmap_offset + size` bytes (checked in `map`), and
        // `off < size`, so the result stays inside the mapping.
        unsafe {
            self.map
                .as_ptr()
                .add((self.desc.mmap_offset + off) as usize)
        }
    }
}

/// Copies `len` bytes; small copies (packet headers, 64-byte frames) are done inline with
/// overlapping unaligned 16/8/4-byte moves instead of a call into libc's `memmove`.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the ranges must not
/// overlap.
#[inline(always)]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: every access below is within `[0, len)` of `src`/`dst`, which the
    // caller guarantees valid; unaligned reads/writes need no alignment.
    unsafe {
        if len >= 16 {
            if len > 256 {
                std::ptr::copy_nonoverlapping(src, dst, len);
                return;
            }
            let mut i = 0;
            while i + 16 <= len {
                wr(dst.add(i) as *mut u128, rd(src.add(i) as *const u128));
                i += 16;
            }
            if i < len {
                let t = len - 16;
                wr(dst.add(t) as *mut u128, rd(src.add(t) as *const u128));
            }
        } else if len >= 8 {
            wr(dst as *mut u64, rd(src as *const u64));
            wr(
                dst.add(len - 8) as *mut u64,
                rd(src.add(len - 8) as *const u64),
            );
        } else if len >= 4 {
            wr(dst as *mut u32, rd(src as *const u32));
            wr(
                dst.add(len - 4) as *mut u32,
                rd(src.add(len - 4) as *const u32),
            );
        } else {
            for i in 0..len {
                *dst.add(i) = *src.add(i);
            }
        }
    }
}

/// Mapped guest memory.
#[derive(Debug)]
pub struct GuestMemory {
    regions: Vec<Region>,
    /// Index of the region that served the last translation (a hint only).
    last: AtomicUsize,
    /// Guest-physical ranges lent out as [`BufferArea`]s (driver side only).
    claims: Mutex<Vec<(u64, u64)>>,
}

impl GuestMemory {
    /// Validates and maps a memory table. Takes ownership of the fds (they are kept so that
    /// the table can be handed to another process on upgrade).
    pub fn map(table: Vec<(RegionDesc, OwnedFd)>) -> Result<GuestMemory, MemoryError> {
        if table.len() > MAX_REGIONS {
            return Err(MemoryError::TooMany(table.len()));
        }
        for (i, (d, _)) in table.iter().enumerate() {
            if d.size == 0 {
                return Err(MemoryError::ZeroSize { index: i });
            }
            let ends_ok = d.gpa.checked_add(d.size).is_some()
                && d.uaddr.checked_add(d.size).is_some()
                && d.mmap_offset
                    .checked_add(d.size)
                    .is_some_and(|e| e < isize::MAX as u64);
            if !ends_ok {
                return Err(MemoryError::Overflow { index: i });
            }
            for (j, (o, _)) in table.iter().enumerate().take(i) {
                let gpa_overlap = d.gpa < o.gpa + o.size && o.gpa < d.gpa + d.size;
                let va_overlap = d.uaddr < o.uaddr + o.size && o.uaddr < d.uaddr + d.size;
                if gpa_overlap || va_overlap {
                    return Err(MemoryError::Overlap { index: i, other: j });
                }
            }
        }
        let mut regions = Vec::with_capacity(table.len());
        for (i, (desc, fd)) in table.into_iter().enumerate() {
            let (fd_size, blksize) =
                crate::os::fd_size(fd.as_fd()).map_err(|e| MemoryError::Stat {
                    index: i,
                    source: e,
                })?;
            let claimed = desc.mmap_offset + desc.size;
            if fd_size < claimed {
                return Err(MemoryError::FdTooSmall {
                    index: i,
                    fd_size,
                    claimed,
                });
            }
            // hugetlbfs wants lengths in whole huge pages; the fd holds them (fd_size >= claimed
            // and hugetlbfs sizes are multiples of the page size).
            let align = blksize.max(4096);
            let len = claimed.div_ceil(align) * align;
            let len = len.min(fd_size.max(claimed));
            let map =
                Mmap::map_shared(fd.as_fd(), len as usize, 0).map_err(|e| MemoryError::Map {
                    index: i,
                    source: e,
                })?;
            let sigbus = crate::sigbus::register(map.as_ptr(), map.len());
            regions.push(Region {
                desc,
                sigbus,
                map,
                fd,
            });
        }
        Ok(GuestMemory {
            regions,
            last: AtomicUsize::new(0),
            claims: Mutex::new(Vec::new()),
        })
    }

    /// Whether the frontend shrank a region's file under us and an access faulted (the
    /// access completed on a zero page; the port using this memory must stop).
    #[inline]
    pub fn faulted(&self) -> bool {
        self.regions.iter().any(|r| r.sigbus.faulted())
    }

    /// The table as the frontend sent it.
    pub fn regions(&self) -> impl Iterator<Item = RegionDesc> + '_ {
        self.regions.iter().map(|r| r.desc)
    }

    /// The fds of the regions, in table order (for handing them to another process).
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> + '_ {
        self.regions.iter().map(|r| r.fd.as_fd())
    }

    /// Region containing guest-physical `gpa`, and the offset of `gpa` in it.
    #[inline]
    fn find_gpa(&self, gpa: u64) -> Option<(&Region, u64)> {
        let hint = self.last.load(Ordering::Relaxed);
        if let Some(r) = self.regions.get(hint) {
            if gpa.wrapping_sub(r.desc.gpa) < r.desc.size {
                return Some((r, gpa - r.desc.gpa));
            }
        }
        for (i, r) in self.regions.iter().enumerate() {
            if gpa.wrapping_sub(r.desc.gpa) < r.desc.size {
                self.last.store(i, Ordering::Relaxed);
                return Some((r, gpa - r.desc.gpa));
            }
        }
        None
    }

    /// Host pointer of the frontend-virtual range `[uaddr, uaddr + len)`, which must lie in one
    /// region. Used to place vrings.
    pub(crate) fn uaddr_range(&self, uaddr: u64, len: u64) -> Option<*mut u8> {
        let r = self
            .regions
            .iter()
            .find(|r| uaddr.wrapping_sub(r.desc.uaddr) < r.desc.size)?;
        let off = uaddr - r.desc.uaddr;
        if len > r.desc.size - off {
            return None;
        }
        Some(r.host(off))
    }

    /// Host pointer of the guest-physical range `[gpa, gpa + len)` when it lies in one region.
    #[inline]
    pub(crate) fn gpa_range(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let (r, off) = self.find_gpa(gpa)?;
        if len > r.desc.size - off {
            return None;
        }
        Some(r.host(off))
    }

    /// Starts loading the cache line of guest-physical `gpa` (a hint: nothing happens for an
    /// address outside guest memory). Hides the cross-core miss on packet data the guest
    /// just wrote (or on a buffer we are about to write), as DPDK's `rte_prefetch0` does.
    #[inline]
    pub fn prefetch(&self, gpa: u64) {
        if let Some(p) = self.gpa_range(gpa, 1) {
            crate::os::prefetch(p);
        }
    }

    /// Translates a frontend-virtual address to guest-physical (for the dirty log).
    pub fn uaddr_to_gpa(&self, uaddr: u64) -> Option<u64> {
        let r = self
            .regions
            .iter()
            .find(|r| uaddr.wrapping_sub(r.desc.uaddr) < r.desc.size)?;
        Some(r.desc.gpa + (uaddr - r.desc.uaddr))
    }

    /// Whether `[gpa, gpa + len)` is entirely guest memory (it may span regions).
    pub fn check_range(&self, gpa: u64, len: u64) -> Result<(), OutOfBounds> {
        let oob = OutOfBounds { addr: gpa, len };
        let end = gpa.checked_add(len).ok_or(oob)?;
        let mut at = gpa;
        while at < end {
            let (r, off) = self.find_gpa(at).ok_or(oob)?;
            at += (r.desc.size - off).min(end - at);
        }
        Ok(())
    }

    /// Copies guest memory at `gpa` into `dst`. The range may span regions.
    #[inline]
    pub fn read(&self, gpa: u64, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let len = dst.len() as u64;
        if let Some(src) = self.gpa_range(gpa, len) {
            // SAFETY: `gpa_range` checked `[src, src + len)` lies in a live mapping; `dst` is
            // a distinct Rust buffer (guest memory is never borrowed as a slice).
            unsafe { copy_bytes(src, dst.as_mut_ptr(), dst.len()) };
            return Ok(());
        }
        self.read_split(gpa, dst)
    }

    #[cold]
    fn read_split(&self, gpa: u64, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let oob = OutOfBounds {
            addr: gpa,
            len: dst.len() as u64,
        };
        gpa.checked_add(dst.len() as u64).ok_or(oob)?;
        let mut done = 0usize;
        while done < dst.len() {
            let (r, off) = self.find_gpa(gpa + done as u64).ok_or(oob)?;
            let n = ((r.desc.size - off) as usize).min(dst.len() - done);
            // SAFETY: `off + n <= size` of region `r`; `dst[done..done + n]` is in bounds.
            unsafe { std::ptr::copy_nonoverlapping(r.host(off), dst.as_mut_ptr().add(done), n) };
            done += n;
        }
        Ok(())
    }

    /// Copies `src` into guest memory at `gpa`. The range may span regions.
    #[inline]
    pub fn write(&self, gpa: u64, src: &[u8]) -> Result<(), OutOfBounds> {
        let len = src.len() as u64;
        if let Some(dst) = self.gpa_range(gpa, len) {
            // SAFETY: `gpa_range` checked `[dst, dst + len)` lies in a live mapping; `src` is
            // a distinct Rust buffer.
            unsafe { copy_bytes(src.as_ptr(), dst, src.len()) };
            return Ok(());
        }
        self.write_split(gpa, src)
    }

    #[cold]
    fn write_split(&self, gpa: u64, src: &[u8]) -> Result<(), OutOfBounds> {
        let oob = OutOfBounds {
            addr: gpa,
            len: src.len() as u64,
        };
        gpa.checked_add(src.len() as u64).ok_or(oob)?;
        self.check_range(gpa, src.len() as u64)?;
        let mut done = 0usize;
        while done < src.len() {
            let (r, off) = self.find_gpa(gpa + done as u64).ok_or(oob)?;
            let n = ((r.desc.size - off) as usize).min(src.len() - done);
            // SAFETY: `off + n <= size` of region `r`; `src[done..done + n]` is in bounds.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), r.host(off), n) };
            done += n;
        }
        Ok(())
    }

    /// Reads a little-endian `u64`/`u32`/`u16` sized plain value from guest memory.
    pub fn read_obj<const N: usize>(&self, gpa: u64) -> Result<[u8; N], OutOfBounds> {
        let mut b = [0u8; N];
        self.read(gpa, &mut b)?;
        Ok(b)
    }

    /// Touches every page of the frontend-virtual range so that the packet path does not fault
    /// on it (used for rings after a hot upgrade).
    pub fn prefault_uaddr(&self, uaddr: u64, len: u64) {
        for r in &self.regions {
            let start = uaddr.max(r.desc.uaddr);
            let end = (uaddr.saturating_add(len)).min(r.desc.uaddr + r.desc.size);
            if start < end {
                let off = (r.desc.mmap_offset + (start - r.desc.uaddr)) as usize;
                r.map.prefault(off, (end - start) as usize);
            }
        }
    }
}

/// Why [`GuestMemory::claim_buffers`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error(transparent)]
    OutOfBounds(#[from] OutOfBounds),
    #[error("guest range {addr:#x}+{len} is not in one region")]
    NotContiguous { addr: u64, len: u64 },
    #[error("guest range {addr:#x}+{len} is already claimed")]
    Claimed { addr: u64, len: u64 },
}

impl GuestMemory {
    /// Lends the driver side (our own frontend, `ferrovs-gen`) exclusive slice access to
    /// `count` packet buffers of `slot` bytes at `gpa`, so that it builds and checks frames in
    /// place instead of copying them through a bounce buffer. A range is lent once at a time:
    /// a second claim overlapping a live one is refused, which is what makes handing out
    /// `&mut [u8]` sound. The device side (the switch) never claims: it only copies, because a
    /// guest may change its memory at any moment.
    pub fn claim_buffers(
        self: &Arc<Self>,
        gpa: u64,
        slot: usize,
        count: usize,
    ) -> Result<BufferArea, ClaimError> {
        let len = (slot as u64).checked_mul(count as u64).ok_or(OutOfBounds {
            addr: gpa,
            len: u64::MAX,
        })?;
        self.check_range(gpa, len)?;
        let base = self
            .gpa_range(gpa, len)
            .ok_or(ClaimError::NotContiguous { addr: gpa, len })?;
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        if claims.iter().any(|&(a, l)| gpa < a + l && a < gpa + len) {
            return Err(ClaimError::Claimed { addr: gpa, len });
        }
        claims.push((gpa, len));
        Ok(BufferArea {
            mem: Arc::clone(self),
            base,
            gpa,
            slot,
            count,
        })
    }
}

/// A driver's exclusively claimed array of equal packet buffers in shared memory (see
/// [`GuestMemory::claim_buffers`]). Slot `i` is borrowed through `&self`/`&mut self`, so the
/// borrow checker keeps the driver's own accesses apart; the device reads or writes a slot
/// only while the driver has posted it, by protocol.
#[derive(Debug)]
pub struct BufferArea {
    mem: Arc<GuestMemory>,
    base: *mut u8,
    gpa: u64,
    slot: usize,
    count: usize,
}

// SAFETY: the area is a plain pointer into a mapping kept alive by `mem` (itself Send + Sync);
// it is only dereferenced through `&self`/`&mut self` borrows.
unsafe impl Send for BufferArea {}

impl BufferArea {
    /// Guest-physical address of slot `i` (`i < count`).
    #[inline]
    pub fn gpa(&self, i: usize) -> u64 {
        assert!(i < self.count);
        self.gpa + (i * self.slot) as u64
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot
    }

    /// Slot `i`, read-only.
    #[inline]
    pub fn slot(&self, i: usize) -> &[u8] {
        assert!(i < self.count);
        // SAFETY: `[base, base + slot * count)` was checked to lie in one live mapping (kept
        // by `mem`) and is claimed by this area alone; `i < count`.
        unsafe { std::slice::from_raw_parts(self.base.add(i * self.slot), self.slot) }
    }

    /// Slot `i`, writable.
    #[inline]
    pub fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.count);
        // SAFETY: as in `slot`; `&mut self` makes this the only borrow of the area.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(i * self.slot), self.slot) }
    }

    /// The memory the area lies in.
    pub fn mem(&self) -> &Arc<GuestMemory> {
        &self.mem
    }
}

impl Drop for BufferArea {
    fn drop(&mut self) {
        let mut claims = self.mem.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.retain(|&(a, _)| a != self.gpa);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::memfd;

    #[test]
    fn buffer_claims_are_exclusive_and_released() {
        let m =
            Arc::new(mem(16384, &[(0, 8192, 0x10000, 0), (8192, 8192, 0x30000, 8192)]).unwrap());
        let mut a = m.claim_buffers(0, 1024, 4).unwrap();
        assert!(matches!(
            m.claim_buffers(2048, 1024, 1),
            Err(ClaimError::Claimed { .. })
        ));
        assert!(matches!(
            m.claim_buffers(4096, 4096, 2),
            Err(ClaimError::NotContiguous { .. })
        ));
        assert!(matches!(
            m.claim_buffers(16000, 1024, 1),
            Err(ClaimError::OutOfBounds(_))
        ));
        a.slot_mut(1)[..3].copy_from_slice(b"abc");
        let mut got = [0u8; 3];
        m.read(1024, &mut got).unwrap();
        assert_eq!(&got, b"abc");
        assert_eq!(a.gpa(3), 3072);
        drop(a);
        m.claim_buffers(2048, 1024, 1).unwrap();
    }

    fn mem(size: u64, regions: &[(u64, u64, u64, u64)]) -> Result<GuestMemory, MemoryError> {
        let fd = memfd("test", size, false).unwrap();
        let table = regions
            .iter()
            .map(|&(gpa, size, uaddr, mmap_offset)| {
                (
                    RegionDesc {
                        gpa,
                        size,
                        uaddr,
                        mmap_offset,
                    },
                    fd.try_clone().unwrap(),
                )
            })
            .collect();
        GuestMemory::map(table)
    }

    #[test]
    fn reads_and_writes_within_and_across_regions() {
        // Two regions adjacent in guest-physical space, backed by one fd.
        let m = mem(8192, &[(0, 4096, 0x10000, 0), (4096, 4096, 0x20000, 4096)]).unwrap();
        m.write(4090, b"0123456789ab").unwrap();
        let mut b = [0u8; 12];
        m.read(4090, &mut b).unwrap();
        assert_eq!(&b, b"0123456789ab");
        assert_eq!(m.uaddr_to_gpa(0x20010), Some(4096 + 0x10));
    }

    #[test]
    fn small_and_large_copies_are_exact() {
        let m = mem(8192, &[(0, 8192, 0, 0)]).unwrap();
        for len in [
            0usize, 1, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 255, 256, 257, 1500,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            m.write(0, &[0xaa; 2000]).unwrap();
            m.write(1, &src).unwrap();
            let mut back = vec![0u8; len + 2];
            m.read(0, &mut back).unwrap();
            assert_eq!(back[0], 0xaa);
            assert_eq!(&back[1..=len], &src[..], "len {len}");
            assert_eq!(back[len + 1], 0xaa, "no write past the end, len {len}");
        }
    }

    #[test]
    fn refuses_out_of_bounds() {
        let m = mem(8192, &[(0, 8192, 0, 0)]).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(
            m.read(8190, &mut b),
            Err(OutOfBounds {
                addr: 8190,
                len: 16
            })
        );
        assert!(m.read(u64::MAX - 3, &mut b).is_err());
        assert!(m.write(8192, &b).is_err());
        assert!(m.gpa_range(0, 8193).is_none());
        assert!(m.uaddr_range(8000, 200).is_none());
    }

    #[test]
    fn refuses_table_claiming_more_than_fd_holds() {
        let e = mem(4096, &[(0, 8192, 0, 0)]).unwrap_err();
        assert!(matches!(
            e,
            MemoryError::FdTooSmall {
                fd_size: 4096,
                claimed: 8192,
                ..
            }
        ));
        let e = mem(8192, &[(0, 4096, 0, 8192)]).unwrap_err();
        assert!(matches!(e, MemoryError::FdTooSmall { .. }), "{e}");
    }

    #[test]
    fn refuses_overlaps_overflow_and_zero() {
        assert!(matches!(
            mem(8192, &[(0, 4096, 0, 0), (4095, 10, 0x9000, 0)]).unwrap_err(),
            MemoryError::Overlap { index: 1, other: 0 }
        ));
        assert!(matches!(
            mem(8192, &[(u64::MAX - 10, 4096, 0, 0)]).unwrap_err(),
            MemoryError::Overflow { .. }
        ));
        assert!(matches!(
            mem(8192, &[(0, 0, 0, 0)]).unwrap_err(),
            MemoryError::ZeroSize { .. }
        ));
    }
}
