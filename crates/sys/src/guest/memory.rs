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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::guest::userfault::Userfault;
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
    #[error("region {index}: cannot register with the userfaultfd")]
    Userfault {
        index: usize,
        #[source]
        source: io::Error,
    },
}

/// An access outside every region of guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("guest address {addr:#x}+{len} is outside guest memory")]
pub struct OutOfBounds {
    pub addr: u64,
    pub len: u64,
}

/// Why a copy in or out of guest memory did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The guest named memory it does not have (a guest error).
    #[error(transparent)]
    OutOfBounds(#[from] OutOfBounds),
    /// Postcopy: the page has not arrived from the migration source yet. Not an error of the
    /// guest's: it has been asked for; try again later.
    #[error("guest page {gpa:#x} has not arrived yet (postcopy)")]
    NotResident { gpa: u64 },
}

/// Most regions a frontend may send (QEMU sends at most 8, or 509 with CONFIGURE_MEM_SLOTS).
pub const MAX_REGIONS: usize = 512;

#[derive(Debug)]
struct Region {
    desc: RegionDesc,
    /// Dropped before `map`: the range is unregistered before it is unmapped.
    sigbus: crate::guest::sigbus::Guard,
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
    /// Set when the memory was mapped during a postcopy migration: pages may be missing.
    postcopy: Option<Box<Postcopy>>,
}

/// Postcopy state of a memory mapped while its pages were still arriving.
///
/// Invariant: no copy in or out of guest memory touches a page before it is known present
/// (its bit in `present`), so a thread of ours never stops on a missing page, except the
/// memory's own fault thread, whose job that is. A page once present stays present (postcopy
/// only places pages), so a set bit is never cleared.
#[derive(Debug)]
struct Postcopy {
    /// Per region, one bit per 4 KiB page of its mapping.
    present: Vec<Box<[AtomicU64]>>,
    /// Every page has arrived (POSTCOPY_END): no more checks.
    done: AtomicBool,
    /// Pages the fault thread is asked to bring in: (region, page of its mapping).
    requests: Mutex<Vec<(usize, u64)>>,
    /// Wakes the fault thread (requests, or the memory going away).
    doorbell: OwnedFd,
    /// Accesses that found their page missing.
    missing: AtomicU64,
    /// Pages the fault thread brought in.
    fetched: AtomicU64,
}

/// Most pages one fault thread is asked for at a time (more wait for the next access).
const MAX_REQUESTS: usize = 256;

/// Postcopy counters of one memory: `(accesses that found a page missing, pages fetched by
/// the fault thread)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PostcopyStats {
    pub missing: u64,
    pub fetched: u64,
}

impl GuestMemory {
    /// Validates and maps a memory table. Takes ownership of the fds (they are kept so that
    /// the table can be handed to another process on upgrade).
    pub fn map(table: Vec<(RegionDesc, OwnedFd)>) -> Result<GuestMemory, MemoryError> {
        let regions = Self::map_regions(table)?;
        Ok(GuestMemory {
            regions,
            last: AtomicUsize::new(0),
            claims: Mutex::new(Vec::new()),
            postcopy: None,
        })
    }

    /// Maps a memory table during a postcopy migration: as [`GuestMemory::map`], and every
    /// region is registered with `uf` for missing-page faults, which the frontend serves.
    /// Copies check each page for residency first; a missing page is touched by a fault
    /// thread of this memory (which the frontend wakes once the page has arrived) while the
    /// copy fails with [`AccessError::NotResident`].
    pub fn map_postcopy(
        table: Vec<(RegionDesc, OwnedFd)>,
        uf: &Userfault,
    ) -> Result<Arc<GuestMemory>, MemoryError> {
        let regions = Self::map_regions(table)?;
        let mut present = Vec::with_capacity(regions.len());
        for (i, r) in regions.iter().enumerate() {
            uf.register(r.map.as_ptr(), r.map.len())
                .map_err(|e| MemoryError::Userfault {
                    index: i,
                    source: e,
                })?;
            let pages = r.map.len().div_ceil(4096);
            present.push((0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect());
        }
        let doorbell = crate::os::eventfd().map_err(|e| MemoryError::Userfault {
            index: 0,
            source: e,
        })?;
        let wake = doorbell.try_clone().map_err(|e| MemoryError::Userfault {
            index: 0,
            source: e,
        })?;
        let mem = Arc::new(GuestMemory {
            regions,
            last: AtomicUsize::new(0),
            claims: Mutex::new(Vec::new()),
            postcopy: Some(Box::new(Postcopy {
                present,
                done: AtomicBool::new(false),
                requests: Mutex::new(Vec::with_capacity(MAX_REQUESTS)),
                doorbell,
                missing: AtomicU64::new(0),
                fetched: AtomicU64::new(0),
            })),
        });
        let weak = Arc::downgrade(&mem);
        std::thread::Builder::new()
            .name("postcopy-fault".into())
            .spawn(move || fault_thread(weak, wake))
            .map_err(|e| MemoryError::Userfault {
                index: 0,
                source: e,
            })?;
        Ok(mem)
    }

    fn map_regions(table: Vec<(RegionDesc, OwnedFd)>) -> Result<Vec<Region>, MemoryError> {
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
            let sigbus = crate::guest::sigbus::register(map.as_ptr(), map.len());
            regions.push(Region {
                desc,
                sigbus,
                map,
                fd,
            });
        }
        Ok(regions)
    }

    /// Whether the memory was mapped during a postcopy migration that has not ended.
    #[inline]
    pub fn in_postcopy(&self) -> bool {
        self.postcopy
            .as_ref()
            .is_some_and(|p| !p.done.load(Ordering::Relaxed))
    }

    /// Whether the memory was mapped during a postcopy migration (ended or not).
    pub fn postcopy_mapped(&self) -> bool {
        self.postcopy.is_some()
    }

    /// Postcopy ended: every page has arrived; copies stop checking.
    pub fn postcopy_done(&self) {
        if let Some(p) = &self.postcopy {
            p.done.store(true, Ordering::Release);
            let _ = crate::os::notify(p.doorbell.as_fd());
        }
    }

    /// Postcopy counters (zero for a memory mapped outside postcopy).
    pub fn postcopy_stats(&self) -> PostcopyStats {
        self.postcopy
            .as_ref()
            .map(|p| PostcopyStats {
                missing: p.missing.load(Ordering::Relaxed),
                fetched: p.fetched.load(Ordering::Relaxed),
            })
            .unwrap_or_default()
    }

    /// Our own address of each region's first byte, in table order: what a postcopy frontend
    /// needs to translate the faults it reads on the userfaultfd back to its regions.
    pub fn host_bases(&self) -> Vec<u64> {
        self.regions.iter().map(|r| r.host(0) as u64).collect()
    }

    /// Postcopy: checks that every page of region `ri`'s bytes `[off, off + len)` (`len > 0`,
    /// inside the region) is present; the first missing one is asked for and reported.
    #[cold]
    #[inline(never)]
    fn check_resident(&self, ri: usize, off: u64, len: u64) -> Result<(), AccessError> {
        let Some(pc) = &self.postcopy else {
            return Ok(());
        };
        if pc.done.load(Ordering::Relaxed) {
            return Ok(());
        }
        let r = &self.regions[ri];
        let bits = &pc.present[ri];
        let at = r.desc.mmap_offset + off;
        let (first, last) = (at / 4096, (at + len - 1) / 4096);
        for page in first..=last {
            let (w, b) = ((page / 64) as usize, 1u64 << (page % 64));
            if bits[w].load(Ordering::Acquire) & b != 0 {
                continue;
            }
            // Ask the kernel about the 64 pages of this word at once.
            let base = page & !63;
            let pages = (r.map.len() as u64).div_ceil(4096);
            let n = (pages - base).min(64) as usize;
            let mut v = [0u8; 64];
            // SAFETY: `base * 4096` is page-aligned and `base + n <= pages`: inside the
            // mapping of region `r`.
            let start = unsafe { r.map.as_ptr().add((base * 4096) as usize) };
            let mut found = 0u64;
            if crate::guest::userfault::resident(start, &mut v[..n]).is_ok() {
                for (i, x) in v[..n].iter().enumerate() {
                    if x & 1 != 0 {
                        found |= 1 << i;
                    }
                }
                bits[w].fetch_or(found, Ordering::AcqRel);
            }
            if found & b == 0 {
                pc.missing.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut q) = pc.requests.try_lock() {
                    if q.len() < MAX_REQUESTS && !q.contains(&(ri, page)) {
                        q.push((ri, page));
                        let _ = crate::os::notify(pc.doorbell.as_fd());
                    }
                }
                let gpa = r.desc.gpa + (page * 4096).saturating_sub(r.desc.mmap_offset);
                return Err(AccessError::NotResident { gpa });
            }
        }
        Ok(())
    }

    /// Postcopy: whether the frontend-virtual range `[uaddr, uaddr + len)` (a ring) is present;
    /// a missing page is asked for. Always `Ok` outside postcopy.
    pub fn check_resident_uaddr(&self, uaddr: u64, len: u64) -> Result<(), AccessError> {
        if !self.in_postcopy() || len == 0 {
            return Ok(());
        }
        let oob = OutOfBounds { addr: uaddr, len };
        let (ri, r) = self
            .regions
            .iter()
            .enumerate()
            .find(|(_, r)| uaddr.wrapping_sub(r.desc.uaddr) < r.desc.size)
            .ok_or(oob)?;
        let off = uaddr - r.desc.uaddr;
        if len > r.desc.size - off {
            return Err(oob.into());
        }
        self.check_resident(ri, off, len)
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

    /// Region containing guest-physical `gpa` (its index), and the offset of `gpa` in it.
    #[inline(always)]
    fn find_gpa(&self, gpa: u64) -> Option<(usize, &Region, u64)> {
        let hint = self.last.load(Ordering::Relaxed);
        if let Some(r) = self.regions.get(hint) {
            if gpa.wrapping_sub(r.desc.gpa) < r.desc.size {
                return Some((hint, r, gpa - r.desc.gpa));
            }
        }
        for (i, r) in self.regions.iter().enumerate() {
            if gpa.wrapping_sub(r.desc.gpa) < r.desc.size {
                self.last.store(i, Ordering::Relaxed);
                return Some((i, r, gpa - r.desc.gpa));
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
    #[inline(always)]
    pub(crate) fn gpa_range(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let (_, r, off) = self.find_gpa(gpa)?;
        if len > r.desc.size - off {
            return None;
        }
        Some(r.host(off))
    }

    /// Host pointer of `[gpa, gpa + len)` (`len > 0`) when it lies in one region and, in
    /// postcopy, every page of it has arrived; `Ok(None)` when it spans regions.
    #[inline(always)]
    fn access_range(&self, gpa: u64, len: u64) -> Result<Option<*mut u8>, AccessError> {
        let Some((ri, r, off)) = self.find_gpa(gpa) else {
            return Err(OutOfBounds { addr: gpa, len }.into());
        };
        if len > r.desc.size - off {
            return Ok(None);
        }
        if self.in_postcopy() {
            self.check_resident(ri, off, len)?;
        }
        Ok(Some(r.host(off)))
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

    /// Starts loading the cache lines of `[gpa, gpa + len)` (at most `max_lines` of them,
    /// the first ones), for writing if `write`. A hint, like [`GuestMemory::prefetch`]:
    /// nothing happens outside guest memory. A 64-byte frame behind its 12-byte virtio-net
    /// header spans two lines; prefetching one left every packet a miss.
    #[inline(always)]
    pub fn prefetch_range(&self, gpa: u64, len: u64, max_lines: u64, write: bool) {
        let first = gpa & !63;
        let lines = ((gpa.saturating_add(len.max(1) - 1) - first) / 64 + 1).min(max_lines);
        let (p, lines) = match self.gpa_range(first, lines * 64) {
            Some(p) => (p, lines),
            // Lines past the first leave the region (or the first line starts before it).
            None => match self.gpa_range(gpa, 1) {
                Some(p) => (p, 1),
                None => return,
            },
        };
        for i in 0..lines {
            // SAFETY: `i * 64` stays inside the range `gpa_range` checked.
            let q = unsafe { p.add((i * 64) as usize) as *const u8 };
            if write {
                crate::os::prefetch_write(q);
            } else {
                crate::os::prefetch(q);
            }
        }
    }

    /// Starts loading the first one or two cache lines of `[gpa, gpa + len)`: the line of
    /// `gpa`, and the next one when the range reaches into it (a 64-byte frame behind its
    /// 12-byte virtio-net header spans two) and it lies in the same region; for writing if
    /// `write`. The burst prefetch's cheap form of [`GuestMemory::prefetch_range`]: one
    /// translation, no loop. A hint: nothing happens outside guest memory.
    #[inline(always)]
    pub fn prefetch_head(&self, gpa: u64, len: u64, write: bool) {
        let Some((_, r, off)) = self.find_gpa(gpa) else {
            return;
        };
        let p = r.host(off);
        let to_next = 64 - (gpa & 63);
        let second = len > to_next && to_next < r.desc.size - off;
        // SAFETY: `off + to_next < size` when `second`: the byte lies in the region's
        // mapping (a prefetch never faults anyway; the pointer must still be in bounds).
        let q = second.then(|| unsafe { p.add(to_next as usize) as *const u8 });
        if write {
            crate::os::prefetch_write(p);
            if let Some(q) = q {
                crate::os::prefetch_write(q);
            }
        } else {
            crate::os::prefetch(p);
            if let Some(q) = q {
                crate::os::prefetch(q);
            }
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
            let (_, r, off) = self.find_gpa(at).ok_or(oob)?;
            at += (r.desc.size - off).min(end - at);
        }
        Ok(())
    }

    /// Copies guest memory at `gpa` into `dst`. The range may span regions.
    #[inline(always)]
    pub fn read(&self, gpa: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        if dst.is_empty() {
            return self.check_range(gpa, 0).map_err(Into::into);
        }
        if let Some(src) = self.access_range(gpa, dst.len() as u64)? {
            // SAFETY: `access_range` checked `[src, src + len)` lies in a live mapping; `dst`
            // is a distinct Rust buffer (guest memory is never borrowed as a slice).
            unsafe { copy_bytes(src, dst.as_mut_ptr(), dst.len()) };
            return Ok(());
        }
        self.read_split(gpa, dst)
    }

    #[cold]
    fn read_split(&self, gpa: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        let oob = OutOfBounds {
            addr: gpa,
            len: dst.len() as u64,
        };
        gpa.checked_add(dst.len() as u64).ok_or(oob)?;
        self.check_range(gpa, dst.len() as u64)?;
        let mut done = 0usize;
        while done < dst.len() {
            let (ri, r, off) = self.find_gpa(gpa + done as u64).ok_or(oob)?;
            let n = ((r.desc.size - off) as usize).min(dst.len() - done);
            self.check_resident(ri, off, n as u64)?;
            // SAFETY: `off + n <= size` of region `r`; `dst[done..done + n]` is in bounds.
            unsafe { std::ptr::copy_nonoverlapping(r.host(off), dst.as_mut_ptr().add(done), n) };
            done += n;
        }
        Ok(())
    }

    /// Copies `src` into guest memory at `gpa`. The range may span regions.
    #[inline(always)]
    pub fn write(&self, gpa: u64, src: &[u8]) -> Result<(), AccessError> {
        if src.is_empty() {
            return self.check_range(gpa, 0).map_err(Into::into);
        }
        if let Some(dst) = self.access_range(gpa, src.len() as u64)? {
            // SAFETY: `access_range` checked `[dst, dst + len)` lies in a live mapping; `src`
            // is a distinct Rust buffer.
            unsafe { copy_bytes(src.as_ptr(), dst, src.len()) };
            return Ok(());
        }
        self.write_split(gpa, src)
    }

    /// Copies `a` then `b` into guest memory at `gpa`, contiguously: one translation for a
    /// header and the packet behind it.
    #[inline(always)]
    pub fn write_pair(&self, gpa: u64, a: &[u8], b: &[u8]) -> Result<(), AccessError> {
        let len = (a.len() + b.len()) as u64;
        if !a.is_empty() && !b.is_empty() {
            if let Some(dst) = self.access_range(gpa, len)? {
                // SAFETY: `access_range` checked `[dst, dst + len)` lies in a live mapping;
                // `a` and `b` are distinct Rust buffers and fill it exactly.
                unsafe {
                    copy_bytes(a.as_ptr(), dst, a.len());
                    copy_bytes(b.as_ptr(), dst.add(a.len()), b.len());
                }
                return Ok(());
            }
        }
        // Spanning regions (or an empty part): one part at a time, every page checked first.
        self.check_range(gpa, len)?;
        self.write(gpa, a)?;
        self.write(gpa + a.len() as u64, b)
    }

    #[cold]
    fn write_split(&self, gpa: u64, src: &[u8]) -> Result<(), AccessError> {
        let oob = OutOfBounds {
            addr: gpa,
            len: src.len() as u64,
        };
        gpa.checked_add(src.len() as u64).ok_or(oob)?;
        self.check_range(gpa, src.len() as u64)?;
        // Every page first, so that a missing one leaves nothing half written.
        let mut done = 0usize;
        while done < src.len() {
            let (ri, r, off) = self.find_gpa(gpa + done as u64).ok_or(oob)?;
            let n = ((r.desc.size - off) as usize).min(src.len() - done);
            self.check_resident(ri, off, n as u64)?;
            done += n;
        }
        let mut done = 0usize;
        while done < src.len() {
            let (_, r, off) = self.find_gpa(gpa + done as u64).ok_or(oob)?;
            let n = ((r.desc.size - off) as usize).min(src.len() - done);
            // SAFETY: `off + n <= size` of region `r`; `src[done..done + n]` is in bounds.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), r.host(off), n) };
            done += n;
        }
        Ok(())
    }

    /// Reads a little-endian `u64`/`u32`/`u16` sized plain value from guest memory.
    pub fn read_obj<const N: usize>(&self, gpa: u64) -> Result<[u8; N], AccessError> {
        let mut b = [0u8; N];
        self.read(gpa, &mut b)?;
        Ok(b)
    }

    /// Touches every page of the frontend-virtual range so that the packet path does not fault
    /// on it (used for rings after a hot upgrade).
    pub fn prefault_uaddr(&self, uaddr: u64, len: u64) {
        if self.in_postcopy() {
            // Touching a page that has not arrived would stop this thread until it does.
            return;
        }
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

impl Drop for Postcopy {
    fn drop(&mut self) {
        // The fault thread sees the memory gone and ends.
        let _ = crate::os::notify(self.doorbell.as_fd());
    }
}

/// The fault thread of a memory mapped in postcopy: touches the pages copies found missing,
/// which stops it until the frontend has placed them, and records them present. It holds
/// the memory only while it works, so the memory goes when its last user lets go; a touch
/// that never completes (a frontend that stopped serving its own faults) keeps this thread
/// and that one mapping, nothing else.
fn fault_thread(mem: Weak<GuestMemory>, doorbell: OwnedFd) {
    loop {
        let _ = crate::os::poll_readable(&[doorbell.as_fd()], 1000);
        let _ = crate::os::drain(doorbell.as_fd());
        let Some(mem) = mem.upgrade() else { return };
        let Some(pc) = &mem.postcopy else { return };
        if pc.done.load(Ordering::Acquire) {
            return;
        }
        let work = std::mem::take(&mut *pc.requests.lock().unwrap_or_else(|e| e.into_inner()));
        for (ri, page) in work {
            let r = &mem.regions[ri];
            let (w, b) = ((page / 64) as usize, 1u64 << (page % 64));
            if pc.present[ri][w].load(Ordering::Acquire) & b != 0 {
                continue;
            }
            // SAFETY: `page` was computed from an offset inside region `r`'s mapping, which
            // `mem` keeps alive; a read of one byte is all it takes to fault the page in.
            unsafe { std::ptr::read_volatile(r.map.as_ptr().add((page * 4096) as usize)) };
            pc.present[ri][w].fetch_or(b, Ordering::AcqRel);
            pc.fetched.fetch_add(1, Ordering::Relaxed);
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
            Err(AccessError::OutOfBounds(OutOfBounds {
                addr: 8190,
                len: 16
            }))
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

    /// Postcopy mechanics end to end with a real userfaultfd: a copy never stops on a
    /// missing page, the fault thread asks for it, a "frontend" places it and wakes us, and
    /// the copy then succeeds with the placed bytes.
    #[test]
    fn postcopy_copies_never_wait_and_missing_pages_are_fetched() {
        let uf = match Userfault::new() {
            Ok(u) => u,
            Err(e) => {
                eprintln!("SKIP: no userfaultfd here: {e}");
                return;
            }
        };
        let size = 64 * 4096u64;
        let fd = memfd("postcopy", size, false).unwrap();
        // The "frontend": its own mapping of the same file; page 3 has arrived already.
        let fmap = crate::mmap::Mmap::map_shared(fd.as_fd(), size as usize, 0).unwrap();
        // SAFETY: in bounds of the test's own mapping of the file.
        unsafe { std::ptr::write_bytes(fmap.as_ptr().add(3 * 4096), 0x33, 4096) };
        let r = RegionDesc {
            gpa: 0x10_0000,
            size,
            uaddr: 0x7000_0000,
            mmap_offset: 0,
        };
        let m = GuestMemory::map_postcopy(vec![(r, fd.try_clone().unwrap())], &uf).unwrap();
        assert!(m.in_postcopy());
        let base = m.host_bases()[0];
        let mut b = [0u8; 8];
        m.read(0x10_0000 + 3 * 4096, &mut b).unwrap();
        assert_eq!(b, [0x33; 8], "an arrived page is read at once");
        // Page 5 is missing: the copy fails at once, and the fault thread's touch arrives
        // on the userfaultfd.
        assert_eq!(
            m.write(0x10_0000 + 5 * 4096 + 100, &[1, 2, 3]),
            Err(AccessError::NotResident {
                gpa: 0x10_0000 + 5 * 4096
            })
        );
        let t = std::time::Instant::now();
        let addr = loop {
            if let Some(a) = uf.read_fault().unwrap() {
                break a;
            }
            assert!(t.elapsed().as_secs() < 5, "no fault arrived");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        assert_eq!(addr & !4095, base + 5 * 4096);
        assert_eq!(m.postcopy_stats().fetched, 0, "still waiting for the page");
        // Place it (through the frontend's mapping) and wake the fault thread.
        // SAFETY: in bounds of the test's own mapping of the file.
        unsafe { std::ptr::write_bytes(fmap.as_ptr().add(5 * 4096), 0x55, 4096) };
        uf.wake(addr & !4095, 4096).unwrap();
        let t = std::time::Instant::now();
        while m.postcopy_stats().fetched == 0 {
            assert!(t.elapsed().as_secs() < 5, "the fault thread did not finish");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        m.write(0x10_0000 + 5 * 4096 + 100, &[1, 2, 3]).unwrap();
        let mut b = [0u8; 4];
        m.read(0x10_0000 + 5 * 4096 + 99, &mut b).unwrap();
        assert_eq!(b, [0x55, 1, 2, 3]);
        assert!(m.postcopy_stats().missing >= 1);
        // After POSTCOPY_END nothing is checked (the rest has arrived by then).
        m.postcopy_done();
        assert!(!m.in_postcopy());
    }
}
