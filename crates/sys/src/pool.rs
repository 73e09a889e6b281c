//! A preallocated packet-buffer pool.
//!
//! Each PMD thread owns one pool; nothing on the packet path allocates. The pool is one
//! mapping cut into fixed-size buffers: a hugetlb memfd when huge pages are available (fewer
//! TLB misses), populated anonymous memory otherwise. A buffer is handed out as an [`Mbuf`],
//! which borrows the pool (it cannot outlive it) and returns its buffer on drop.
//!
//! Two sizes: [`BUF_SIZE`] buffers for ordinary frames (up to a 9000-byte jumbo), and a few
//! [`LARGE_BUF_SIZE`] buffers for the 64 KiB TCP segments that TSO lets a guest or the host
//! stack hand us (the packet stays one contiguous buffer: no segment chains to walk).
//!
//! Thread-safety: a `Pool` is `Send` (built by the control thread, moved to its PMD) but not
//! `Sync`; its free list is a `RefCell`, so allocation costs no atomic operation.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use crate::kernel::vnet::VnetHdr;
use crate::mmap::Mmap;

/// Bytes reserved in front of packet data (room to push VLAN or tunnel headers).
pub const HEADROOM: usize = 128;
/// Size of one buffer, headroom included (holds a 9000-byte jumbo frame).
pub const BUF_SIZE: usize = 10240;
/// Largest packet a buffer holds.
pub const MAX_DATA: usize = BUF_SIZE - HEADROOM;
/// Size of a large buffer: a 64 KiB TSO segment with its headers, and headroom.
pub const LARGE_BUF_SIZE: usize = 68 << 10;
/// Largest packet a large buffer holds.
pub const MAX_LARGE_DATA: usize = LARGE_BUF_SIZE - HEADROOM;

const HUGE_PAGE: usize = 2 << 20;

/// A pool of packet buffers.
#[derive(Debug)]
pub struct Pool {
    map: Mmap,
    free: RefCell<Vec<u32>>,
    free_large: RefCell<Vec<u32>>,
    count: u32,
    large: u32,
    hugepages: bool,
}

impl Pool {
    /// Allocates `count` buffers and no large one, from huge pages if the system has enough.
    pub fn new(count: u32) -> io::Result<Pool> {
        Pool::with_large(count, 0)
    }

    /// Allocates `count` buffers and `large` large buffers (after them in the mapping).
    pub fn with_large(count: u32, large: u32) -> io::Result<Pool> {
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "pool too large");
        let len = (count as usize)
            .checked_mul(BUF_SIZE)
            .and_then(|l| l.checked_add((large as usize).checked_mul(LARGE_BUF_SIZE)?))
            .ok_or_else(too_large)?;
        let huge_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        let huge = crate::os::memfd("ferrovs-pool", huge_len as u64, true)
            .and_then(|fd| Mmap::map_shared_populated(fd.as_fd(), huge_len));
        let (map, hugepages) = match huge {
            Ok(m) => (m, true),
            Err(_) => (Mmap::anonymous(len)?, false),
        };
        Ok(Pool {
            map,
            free: RefCell::new((0..count).rev().collect()),
            free_large: RefCell::new((count..count + large).rev().collect()),
            count,
            large,
            hugepages,
        })
    }

    /// Whether the buffers live in huge pages.
    pub fn hugepages(&self) -> bool {
        self.hugepages
    }

    /// Total buffers.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Large buffers in total.
    pub fn large_count(&self) -> u32 {
        self.large
    }

    /// Buffers currently free.
    pub fn available(&self) -> usize {
        self.free.borrow().len()
    }

    /// Large buffers currently free.
    pub fn available_large(&self) -> usize {
        self.free_large.borrow().len()
    }

    /// Takes a buffer; `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf<'_>> {
        let idx = self.free.borrow_mut().pop()?;
        Some(self.mbuf(idx))
    }

    /// Takes a large buffer; `None` when there is none left.
    #[inline]
    pub fn alloc_large(&self) -> Option<Mbuf<'_>> {
        let idx = self.free_large.borrow_mut().pop()?;
        Some(self.mbuf(idx))
    }

    /// Takes a buffer that holds `len` bytes of packet: an ordinary one if it fits.
    #[inline]
    pub fn alloc_for(&self, len: usize) -> Option<Mbuf<'_>> {
        if len <= MAX_DATA {
            self.alloc()
        } else if len <= MAX_LARGE_DATA {
            self.alloc_large()
        } else {
            None
        }
    }

    /// Where buffer `idx` starts in the mapping, and its size.
    #[inline]
    fn place(&self, idx: u32) -> (usize, usize) {
        if idx < self.count {
            (idx as usize * BUF_SIZE, BUF_SIZE)
        } else {
            let large = (idx - self.count) as usize;
            (
                self.count as usize * BUF_SIZE + large * LARGE_BUF_SIZE,
                LARGE_BUF_SIZE,
            )
        }
    }

    #[inline]
    fn mbuf(&self, idx: u32) -> Mbuf<'_> {
        let (at, size) = self.place(idx);
        // SAFETY: `idx` came from a free list, so `idx < count + large` and the buffer
        // [at, at + size) lies inside the mapping; the mapping pointer is non-null.
        let ptr = unsafe { NonNull::new_unchecked(self.map.as_ptr().add(at)) };
        Mbuf {
            ptr,
            idx,
            pool: self,
            off: HEADROOM as u32,
            len: 0,
            size: size as u32,
            vnet: VnetHdr::default(),
        }
    }
}

/// One packet buffer, exclusively owned until dropped.
///
/// Invariant: `off + len <= size`, and `ptr` points at a `size`-byte buffer of the pool
/// that no other `Mbuf` refers to.
#[derive(Debug)]
pub struct Mbuf<'p> {
    ptr: NonNull<u8>,
    idx: u32,
    pool: &'p Pool,
    off: u32,
    len: u32,
    size: u32,
    /// Offload metadata: what the sender left to the next hop (partial checksum, TSO).
    /// Reset to none by [`Mbuf::fill`].
    pub vnet: VnetHdr,
}

impl Mbuf<'_> {
    #[inline]
    fn whole(&mut self) -> &mut [u8] {
        // SAFETY: per the type invariant the buffer is `size` bytes, exclusively ours, and
        // lives as long as the pool this value borrows.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size as usize) }
    }

    /// Whether this is a large buffer.
    #[inline]
    pub fn is_large(&self) -> bool {
        self.size as usize == LARGE_BUF_SIZE
    }

    /// Largest packet this buffer holds.
    #[inline]
    pub fn max_data(&self) -> usize {
        self.size as usize - HEADROOM
    }

    /// The packet bytes.
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: `off + len <= size` inside our exclusive buffer.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(self.off as usize), self.len as usize)
        }
    }

    /// The packet bytes, mutable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (o, l) = (self.off as usize, self.len as usize);
        &mut self.whole()[o..o + l]
    }

    /// Packet length.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the packet is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room after `off` for packet data.
    #[inline]
    pub fn capacity(&self) -> usize {
        (self.size - self.off) as usize
    }

    /// Resets to an empty packet of `len` bytes (contents unspecified, no offload metadata)
    /// and returns them for filling; `None` if `len` exceeds [`Mbuf::max_data`].
    #[inline]
    pub fn fill(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.max_data() {
            return None;
        }
        self.off = HEADROOM as u32;
        self.len = len as u32;
        self.vnet = VnetHdr::default();
        Some(&mut self.whole()[HEADROOM..HEADROOM + len])
    }

    /// Shortens the packet to `len` bytes.
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len as u32);
    }

    /// Grows the packet at the front by `n` bytes (for pushing a header); returns the new
    /// front, or `None` without headroom.
    #[inline]
    pub fn push_front(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.off as usize {
            return None;
        }
        self.off -= n as u32;
        self.len += n as u32;
        let o = self.off as usize;
        Some(&mut self.whole()[o..o + n])
    }

    /// Removes `n` bytes from the front; `false` if the packet is shorter.
    #[inline]
    pub fn pull_front(&mut self, n: usize) -> bool {
        if n > self.len as usize {
            return false;
        }
        self.off += n as u32;
        self.len -= n as u32;
        true
    }
}

impl Drop for Mbuf<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.idx < self.pool.count {
            self.pool.free.borrow_mut().push(self.idx);
        } else {
            self.pool.free_large.borrow_mut().push(self.idx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_and_headroom() {
        let p = Pool::new(4).unwrap();
        let mut a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert_eq!(p.available(), 2);
        a.fill(6).unwrap().copy_from_slice(b"abcdef");
        a.push_front(2).unwrap().copy_from_slice(b"XY");
        assert_eq!(a.data(), b"XYabcdef");
        assert!(a.pull_front(4));
        assert_eq!(a.data(), b"cdef");
        assert!(a.fill(MAX_DATA + 1).is_none());
        assert!(a.push_front(HEADROOM + 100).is_none());
        drop(b);
        drop(a);
        assert_eq!(p.available(), 4);
        let all: Vec<_> = (0..4).map(|_| p.alloc().unwrap()).collect();
        assert!(p.alloc().is_none());
        drop(all);
    }

    #[test]
    fn large_buffers_are_separate_and_bounded() {
        let p = Pool::with_large(2, 2).unwrap();
        let mut small = p.alloc_for(MAX_DATA).unwrap();
        assert!(!small.is_large() && small.fill(MAX_DATA + 1).is_none());
        let mut big = p.alloc_for(MAX_DATA + 1).unwrap();
        assert!(big.is_large());
        let b = big.fill(MAX_LARGE_DATA).unwrap();
        b[0] = 1;
        b[MAX_LARGE_DATA - 1] = 2;
        assert!(big.fill(MAX_LARGE_DATA + 1).is_none());
        assert!(p.alloc_for(MAX_LARGE_DATA + 1).is_none());
        big.vnet.flags = crate::kernel::vnet::F_NEEDS_CSUM;
        big.fill(10).unwrap();
        assert_eq!(big.vnet, VnetHdr::default(), "fill resets the metadata");
        let other = p.alloc_large().unwrap();
        assert!(p.alloc_large().is_none());
        assert_eq!((p.available(), p.available_large()), (1, 0));
        drop((small, big, other));
        assert_eq!((p.available(), p.available_large()), (2, 2));
    }
}
