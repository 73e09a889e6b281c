//! A preallocated packet-buffer pool.
//!
//! Each PMD thread owns one pool; nothing on the packet path allocates. The pool is one
//! mapping cut into fixed-size buffers: a hugetlb memfd when huge pages are available (fewer
//! TLB misses), populated anonymous memory otherwise. A buffer is handed out as an [`Mbuf`],
//! which borrows the pool (it cannot outlive it) and returns its buffer on drop.
//!
//! Thread-safety: a `Pool` is `Send` (built by the control thread, moved to its PMD) but not
//! `Sync`; its free list is a `RefCell`, so allocation costs no atomic operation.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use crate::mmap::Mmap;

/// Bytes reserved in front of packet data (room to push VLAN or tunnel headers).
pub const HEADROOM: usize = 128;
/// Size of one buffer, headroom included (holds a 9000-byte jumbo frame).
pub const BUF_SIZE: usize = 10240;
/// Largest packet a buffer holds.
pub const MAX_DATA: usize = BUF_SIZE - HEADROOM;

const HUGE_PAGE: usize = 2 << 20;

/// A pool of packet buffers.
#[derive(Debug)]
pub struct Pool {
    map: Mmap,
    free: RefCell<Vec<u32>>,
    count: u32,
    hugepages: bool,
}

impl Pool {
    /// Allocates `count` buffers, from huge pages if the system has enough free.
    pub fn new(count: u32) -> io::Result<Pool> {
        let len = (count as usize)
            .checked_mul(BUF_SIZE)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pool too large"))?;
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
            count,
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

    /// Buffers currently free.
    pub fn available(&self) -> usize {
        self.free.borrow().len()
    }

    /// Takes a buffer; `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf<'_>> {
        let idx = self.free.borrow_mut().pop()?;
        // SAFETY: `idx < count`, so the buffer lies inside the mapping; the mapping pointer
        // is non-null.
        let ptr = unsafe { NonNull::new_unchecked(self.map.as_ptr().add(idx as usize * BUF_SIZE)) };
        Some(Mbuf {
            ptr,
            idx,
            pool: self,
            off: HEADROOM as u16,
            len: 0,
        })
    }
}

/// One packet buffer, exclusively owned until dropped.
///
/// Invariant: `off + len <= BUF_SIZE`, and `ptr` points at a `BUF_SIZE`-byte buffer of the
/// pool that no other `Mbuf` refers to.
#[derive(Debug)]
pub struct Mbuf<'p> {
    ptr: NonNull<u8>,
    idx: u32,
    pool: &'p Pool,
    off: u16,
    len: u16,
}

impl Mbuf<'_> {
    #[inline]
    fn whole(&mut self) -> &mut [u8] {
        // SAFETY: per the type invariant the buffer is BUF_SIZE bytes, exclusively ours, and
        // lives as long as the pool this value borrows.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), BUF_SIZE) }
    }

    /// The packet bytes.
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: `off + len <= BUF_SIZE` inside our exclusive buffer.
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
        BUF_SIZE - self.off as usize
    }

    /// Resets to an empty packet of `len` bytes (contents unspecified) and returns them for
    /// filling; `None` if `len` exceeds [`MAX_DATA`].
    #[inline]
    pub fn fill(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > MAX_DATA {
            return None;
        }
        self.off = HEADROOM as u16;
        self.len = len as u16;
        Some(&mut self.whole()[HEADROOM..HEADROOM + len])
    }

    /// Shortens the packet to `len` bytes.
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len as u16);
    }

    /// Grows the packet at the front by `n` bytes (for pushing a header); returns the new
    /// front, or `None` without headroom.
    #[inline]
    pub fn push_front(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.off as usize {
            return None;
        }
        self.off -= n as u16;
        self.len += n as u16;
        let o = self.off as usize;
        Some(&mut self.whole()[o..o + n])
    }

    /// Removes `n` bytes from the front; `false` if the packet is shorter.
    #[inline]
    pub fn pull_front(&mut self, n: usize) -> bool {
        if n > self.len as usize {
            return false;
        }
        self.off += n as u16;
        self.len -= n as u16;
        true
    }
}

impl Drop for Mbuf<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pool.free.borrow_mut().push(self.idx);
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
}
