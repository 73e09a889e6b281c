//! userfaultfd: how postcopy live migration pages guest memory in on demand.
//!
//! In postcopy the destination VM runs before all of its memory has arrived. A page that is
//! still on the source is *missing* from the guest's memory file; an access to it through a
//! mapping registered with a userfaultfd does not allocate a zero page but stops the
//! accessing thread and queues a fault message on the fd. The frontend (QEMU) reads the
//! messages, fetches the page from the source, places it into the file, and wakes the
//! stopped thread with `UFFDIO_WAKE`.
//!
//! ferrovs creates the fd (`VHOST_USER_POSTCOPY_ADVISE`), hands a copy to the frontend, and
//! registers its own guest mappings with it (`SET_MEM_TABLE` while listening). Its PMDs never
//! take such a fault themselves (a PMD stopped on a page would stall every port it polls):
//! [`crate::guest::memory`] checks pages for residency first and has the missing ones touched
//! by a per-memory fault thread instead.
//!
//! The frontend side ([`Userfault::read_fault`], [`Userfault::wake`]) exists for tests and
//! for our own driver, which play the frontend's part.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xaa;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// A userfaultfd (non-blocking, close-on-exec) after the API handshake.
#[derive(Debug)]
pub struct Userfault {
    fd: OwnedFd,
}

impl Userfault {
    /// Opens a userfaultfd. Fails where the kernel lacks it or forbids it to this process.
    pub fn new() -> io::Result<Userfault> {
        // SAFETY: plain system call with flag arguments; returns a new fd or -1.
        let r = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(r as i32) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one `uffdio_api`, which `api` is.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api as *mut UffdioApi) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Userfault { fd })
    }

    /// The fd, to hand to the frontend.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Adopts a userfaultfd received from another process (the frontend side).
    pub fn from_fd(fd: OwnedFd) -> Userfault {
        Userfault { fd }
    }

    /// Registers `[start, start + len)` of our address space for missing-page faults.
    /// `pub(crate)`: only the owner of a mapping ([`crate::guest::memory`]) may name its range.
    pub(crate) fn register(&self, start: *mut u8, len: usize) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one `uffdio_register`, which `reg` is; the
        // range is a mapping the caller owns (the kernel checks it is mapped).
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_REGISTER,
                &mut reg as *mut UffdioRegister,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads one fault (frontend side): the faulting address, `None` when none is queued.
    pub fn read_fault(&self) -> io::Result<Option<u64>> {
        let mut msg = [0u8; 32];
        // SAFETY: `msg` is a valid 32-byte buffer (one `uffd_msg`).
        let n = unsafe { libc::read(self.fd.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        if n as usize != msg.len() || msg[0] != UFFD_EVENT_PAGEFAULT {
            return Ok(None);
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&msg[16..24]);
        Ok(Some(u64::from_ne_bytes(a)))
    }

    /// Wakes the threads stopped on `[start, start + len)` (frontend side, after the page was
    /// placed).
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let range = UffdioRange { start, len };
        // SAFETY: UFFDIO_WAKE reads one `uffdio_range`, which `range` is; it does not touch
        // the range itself.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_WAKE,
                &range as *const UffdioRange,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Whether each page of `[start, start + pages * 4096)` is in memory (in the page cache of a
/// shared mapping's file: for guest memory, whether the page has arrived). `start` must be
/// page-aligned and the range inside one of our mappings.
pub(crate) fn resident(start: *mut u8, out: &mut [u8]) -> io::Result<()> {
    // SAFETY: the caller passes a page-aligned range inside a mapping it owns; mincore writes
    // one byte per page into `out`, which has that many.
    let r = unsafe { libc::mincore(start.cast(), out.len() * 4096, out.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
