//! Owned memory mappings.
//!
//! Invariant: a [`Mmap`] owns `len` bytes of mapped, readable and writable memory starting at
//! `ptr` for its whole life; it is unmapped exactly once, on drop. The memory may be shared
//! with another process (a guest), so its contents are never exposed as Rust references by
//! this crate's guest-facing types.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// An owned `mmap` of a file descriptor or of anonymous memory.
#[derive(Debug)]
pub struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; accesses to shared memory are
// synchronised by the users (atomics for ring indices, exclusive ownership of buffers).
unsafe impl Send for Mmap {}
// SAFETY: `Mmap` itself exposes only raw pointers; see the `Send` justification.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` from `offset`, shared and read-write.
    ///
    /// The caller must have checked that the file holds `offset + len` bytes; a file that
    /// shrinks afterwards raises SIGBUS on access, which the threat model covers.
    pub fn map_shared(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<Mmap> {
        Self::map(Some(fd), len, offset, 0)
    }

    /// Maps `len` bytes of anonymous private memory, populated.
    pub fn anonymous(len: usize) -> io::Result<Mmap> {
        Self::map(
            None,
            len,
            0,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
        )
    }

    /// Maps `len` bytes of `fd` shared and populated (used for our own packet pools).
    pub fn map_shared_populated(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mmap> {
        Self::map(Some(fd), len, 0, libc::MAP_POPULATE)
    }

    /// Maps `len` bytes of `fd` from `offset`, shared and populated (AF_XDP rings, whose
    /// offsets select the ring).
    pub fn map_shared_populated_at(
        fd: BorrowedFd<'_>,
        len: usize,
        offset: u64,
    ) -> io::Result<Mmap> {
        Self::map(Some(fd), len, offset, libc::MAP_POPULATE)
    }

    fn map(fd: Option<BorrowedFd<'_>>, len: usize, offset: u64, extra: i32) -> io::Result<Mmap> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-length mapping",
            ));
        }
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mapping offset too large"))?;
        let (flags, raw) = match fd {
            Some(fd) => (libc::MAP_SHARED | extra, fd.as_raw_fd()),
            None => (extra, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) cannot alias any Rust
        // object; the fd, if any, is borrowed and valid for the call.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Mmap { ptr, len })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never true: zero-length mappings are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Touches one byte per page of `[offset, offset + len)` so that the first access on the
    /// packet path does not take a page fault. Reads only: shared guest pages are not dirtied.
    pub fn prefault(&self, offset: usize, len: usize) {
        let end = offset.saturating_add(len).min(self.len);
        let mut at = offset;
        while at < end {
            // SAFETY: `at < self.len`, inside the mapping we own.
            unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(at)) };
            at += 4096;
        }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping we own and unmap exactly once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
