//! Thin safe wrappers over system calls that `std` does not offer.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Creates a memfd of `size` bytes; with `hugetlb`, backed by 2 MiB huge pages.
pub fn memfd(name: &str, size: u64, hugetlb: bool) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name has a NUL byte"))?;
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if hugetlb {
        flags = libc::MFD_CLOEXEC | libc::MFD_HUGETLB;
    }
    // SAFETY: `cname` is a valid C string for the duration of the call.
    let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), flags) })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd too large"))?;
    // SAFETY: plain syscall on an fd we own.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(fd)
}

/// Truncates (or extends) the file behind `fd` to `len` bytes.
pub fn truncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
    // SAFETY: plain syscall on a borrowed, valid fd.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(|_| ())
}

/// Size and preferred block size (the page size for hugetlbfs) of the file behind `fd`.
pub fn fd_size(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is a valid out-pointer for `fstat`.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: `fstat` succeeded and initialised `st`.
    let st = unsafe { st.assume_init() };
    Ok((st.st_size.max(0) as u64, st.st_blksize.max(0) as u64))
}

/// Sets or clears O_NONBLOCK.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL on a valid fd.
    let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let nfl = if on {
        fl | libc::O_NONBLOCK
    } else {
        fl & !libc::O_NONBLOCK
    };
    if nfl != fl {
        // SAFETY: F_SETFL on a valid fd with flags derived from its own.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, nfl) })?;
    }
    Ok(())
}

/// A non-blocking eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Signals an eventfd (or writes 8 bytes to whatever fd a frontend gave us: a pipe works too,
/// and a full non-blocking one just reports `WouldBlock`).
#[inline]
pub fn notify(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a valid buffer.
    cvt_size(unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) }).map(|_| ())
}

/// Drains an eventfd (or a pipe); returns the number of bytes read.
pub fn drain(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a valid buffer of the given length.
    cvt_size(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// Most fds one vhost-user message may carry.
pub const MAX_FDS: usize = 32;

/// Sends `data` with `fds` attached (SCM_RIGHTS). Returns bytes sent.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    // Enough room for MAX_FDS descriptors, aligned for cmsghdr.
    let mut cbuf = [0u64; 32];
    // SAFETY: zeroed msghdr is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points to `cbuf`, large enough for one cmsg of `space` bytes
        // (MAX_FDS * 4 + header <= 256 bytes), so CMSG_FIRSTHDR is non-null and in bounds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    // SAFETY: `msg` points to live buffers for the duration of the call.
    cvt_size(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })
}

/// Receives into `buf`, collecting any fds passed with the data (SCM_RIGHTS). Returns
/// `(bytes, fds)`; zero bytes means the peer closed. Truncated control data (more fds than
/// [`MAX_FDS`]) is an error: those fds would be lost.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 40];
    // SAFETY: zeroed msghdr is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: `msg` points to live buffers for the duration of the call.
    let n = cvt_size(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) })?;
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros,
    // which stay within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    // The kernel installed these fds in our table for us.
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many fds in one message",
        ));
    }
    Ok((n, fds))
}

/// Whether the peer of a stream socket has closed it (a non-blocking `MSG_PEEK`; data
/// waiting to be read is left in place).
pub fn peer_closed(sock: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: reads at most 1 byte into a valid buffer; MSG_PEEK leaves the data queued.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock,
    }
}

/// An epoll instance.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` is fresh and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    fn ctl(
        &self,
        op: i32,
        fd: RawFd,
        token: u64,
        readable: bool,
        writable: bool,
    ) -> io::Result<()> {
        let mut events = 0u32;
        if readable {
            events |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        }
        if writable {
            events |= libc::EPOLLOUT as u32;
        }
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    /// Watches `fd` for input (and output if `writable`), reporting `token`.
    pub fn add(&self, fd: BorrowedFd<'_>, token: u64, writable: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd.as_raw_fd(), token, true, writable)
    }

    /// Changes the interest of a watched fd.
    pub fn modify(&self, fd: BorrowedFd<'_>, token: u64, writable: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd.as_raw_fd(), token, true, writable)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd.as_raw_fd(), 0, false, false)
    }

    /// Waits up to `timeout_ms` (-1: forever); fills `out` with `(token, readable, writable,
    /// hangup)` and returns how many.
    pub fn wait(&self, out: &mut [EpollEvent], timeout_ms: i32) -> io::Result<usize> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let max = out.len().min(evs.len()) as i32;
        // SAFETY: `evs` has room for `max` events.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), max, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        for (o, e) in out.iter_mut().zip(&evs[..n as usize]) {
            let bits = e.events;
            *o = EpollEvent {
                token: e.u64,
                readable: bits & libc::EPOLLIN as u32 != 0,
                writable: bits & libc::EPOLLOUT as u32 != 0,
                hangup: bits & (libc::EPOLLHUP | libc::EPOLLRDHUP | libc::EPOLLERR) as u32 != 0,
            };
        }
        Ok(n as usize)
    }
}

/// One readiness event.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpollEvent {
    pub token: u64,
    pub readable: bool,
    pub writable: bool,
    pub hangup: bool,
}

/// Pins the calling thread to `cpus`.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cpu index too large",
            ));
        }
        // SAFETY: `c` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) }).map(|_| ())
}

/// CPUs the process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid out-buffer.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return vec![0];
    }
    // SAFETY: CPU_ISSET reads the set we own.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Prefetch hint for the cache line at `p`. No memory access is made, so any address is
/// harmless.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that never faults, whatever the address; SSE is part of
    // the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Prefetch hint for the cache line at `p`, which is about to be written: PREFETCHW (the
/// line arrives owned, so the store that follows takes no second miss to upgrade it) where
/// the CPU has it, else a plain prefetch. Never faults, whatever the address.
#[inline(always)]
pub fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_prefetchw() {
            // SAFETY: PREFETCHW is a hint that never faults, whatever the address, and the
            // CPU supports it (checked once by CPUID).
            unsafe {
                core::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, readonly, preserves_flags))
            };
            return;
        }
    }
    prefetch(p);
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: unknown, 1: no, 2: yes.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        2 => true,
        1 => false,
        _ => {
            // CPUID 0x8000_0001, ECX bit 8: PREFETCHW (3DNowPrefetch).
            let yes = core::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0;
            HAS.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// The CPU's time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC is available on every x86_64 CPU and has no memory effects.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::time::Instant;
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// TSC ticks per second, measured once (about 20 ms) and cached.
pub fn tsc_hz() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        let t0 = std::time::Instant::now();
        let c0 = rdtsc();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c1 = rdtsc();
        let ns = t0.elapsed().as_nanos().max(1) as u64;
        ((c1.wrapping_sub(c0)) as u128 * 1_000_000_000 / ns as u128) as u64
    })
}

/// CLOCK_MONOTONIC in nanoseconds: comparable between processes on one host (used for
/// one-way latency between two traffic-generator processes).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A `SOCK_SEQPACKET` unix socket listening at `path` (message boundaries kept: the hot
/// upgrade channel). Non-blocking, close-on-exec.
pub fn seqpacket_listener(path: &std::path::Path) -> io::Result<std::os::unix::net::UnixListener> {
    let fd = seqpacket_socket()?;
    let addr = sockaddr_un(path)?;
    // SAFETY: `addr` is a valid sockaddr_un of the length passed; `fd` is our socket.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    })?;
    // SAFETY: plain syscall on our socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 4) })?;
    set_nonblocking(std::os::fd::AsFd::as_fd(&fd), true)?;
    Ok(std::os::unix::net::UnixListener::from(fd))
}

/// Connects a `SOCK_SEQPACKET` unix socket to `path` (blocking).
pub fn seqpacket_connect(path: &std::path::Path) -> io::Result<UnixStream> {
    let fd = seqpacket_socket()?;
    let addr = sockaddr_un(path)?;
    // SAFETY: `addr` is a valid sockaddr_un of the length passed; `fd` is our socket.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    })?;
    Ok(UnixStream::from(fd))
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned by us.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr_un(path: &std::path::Path) -> io::Result<libc::sockaddr_un> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.len() >= a.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok(a)
}

/// Sets both socket buffer sizes (large handover messages on a seqpacket socket).
pub fn set_socket_buffers(sock: &UnixStream, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: `v` is a valid c_int option value of the size passed.
        cvt(unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        })?;
    }
    Ok(())
}

/// Sets a socket's receive buffer to `bytes`, past `net.core.rmem_max` when the process may
/// (`SO_RCVBUFFORCE`, CAP_NET_ADMIN), else as far as the limit allows (`SO_RCVBUF`). A
/// tunnel endpoint's socket holds what arrives while its PMD is not polling (a burst, or a
/// core shared with other work): the kernel drops what does not fit.
pub fn set_receive_buffer(fd: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    let set = |opt| {
        // SAFETY: `v` is a valid c_int option value of the size passed.
        cvt(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        })
    };
    set(libc::SO_RCVBUFFORCE)
        .or_else(|_| set(libc::SO_RCVBUF))
        .map(|_| ())
}

/// The pid of the process at the other end of a unix socket (SO_PEERCRED, set by the
/// kernel at connect time: cannot be forged by the peer).
pub fn peer_pid(sock: &UnixStream) -> io::Result<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` are valid out-parameters of the sizes passed.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(cred.pid)
}

/// Sends SIGKILL to `pid` (a process already gone is not an error).
pub fn kill_hard(pid: i32) -> io::Result<()> {
    if pid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to kill pid <= 1",
        ));
    }
    // SAFETY: plain syscall.
    match cvt(unsafe { libc::kill(pid, libc::SIGKILL) }) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Runs the calling thread under SCHED_FIFO (priority 1) when `on`, else back under the
/// normal scheduler. For short critical sections (the hot-upgrade freeze→resume window) that
/// must not wait behind other work sharing the core; the kernel's RT throttling still bounds
/// what a runaway could take.
pub fn set_realtime(on: bool) -> io::Result<()> {
    let (policy, prio) = if on {
        (libc::SCHED_FIFO, 1)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: `p` is a valid sched_param; 0 means the calling thread.
    cvt(unsafe { libc::sched_setscheduler(0, policy, &p) }).map(|_| ())
}

/// Scheduling of a thread: the normal scheduler at a nice level, or SCHED_FIFO at a
/// real-time priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadPriority {
    /// SCHED_OTHER at this nice value (-20..=19; 0 is the default).
    Nice(i32),
    /// SCHED_FIFO at this priority (1..=99).
    Fifo(i32),
}

/// Applies `p` to the calling thread. Needs CAP_SYS_NICE for a negative nice or SCHED_FIFO.
pub fn set_thread_priority(p: ThreadPriority) -> io::Result<()> {
    let (policy, prio) = match p {
        ThreadPriority::Nice(_) => (libc::SCHED_OTHER, 0),
        ThreadPriority::Fifo(r) => (libc::SCHED_FIFO, r),
    };
    let sp = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: `sp` is a valid sched_param; 0 means the calling thread.
    cvt(unsafe { libc::sched_setscheduler(0, policy, &sp) })?;
    if let ThreadPriority::Nice(n) = p {
        // SAFETY: plain syscall; who = 0 with PRIO_PROCESS is the calling thread on Linux
        // (nice values are per thread).
        cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) })?;
    }
    Ok(())
}

/// Sets the calling thread's timer slack (how late the kernel may end its sleeps and
/// timeouts to batch wake-ups; 50 us by default, far too coarse for a PMD's short sleeps).
pub fn set_timer_slack_ns(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long; no pointers.
    cvt(unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) }).map(|_| ())
}

/// Like [`poll_readable`] with a timeout in nanoseconds (`ppoll(2)`).
pub fn poll_readable_ns(fds: &[BorrowedFd<'_>], timeout_ns: u64) -> io::Result<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structures, `ts` a valid
    // timespec; a null sigmask keeps the thread's mask.
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// Waits until one of `fds` is readable or `timeout_ms` passes (`poll(2)`); returns how
/// many are ready (0 on timeout or signal).
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structures.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// Starts a new session (detaches from the caller's terminal and process group).
pub fn new_session() -> io::Result<()> {
    // SAFETY: plain syscall; fails harmlessly if we already lead a session.
    match cvt(unsafe { libc::setsid() }) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Whether process `pid` runs no more code: gone, or a zombie waiting to be reaped.
pub fn process_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st == "Z" || st == "X"),
    }
}

/// Points standard output at /dev/null (a daemon whose reader went away must not die of
/// EPIPE on a stray print).
pub fn stdout_to_null() -> io::Result<()> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // SAFETY: dup2 onto fd 1 with a valid fd we own.
    cvt(unsafe { libc::dup2(null.as_raw_fd(), 1) }).map(|_| ())
}

/// `setsockopt(2)` with a plain-data value.
pub(crate) fn setopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: `v` is a valid value of the size passed, read by the kernel only.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `getsockopt(2)` into a plain-data value, starting from `init`.
pub(crate) fn getopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    init: T,
) -> io::Result<T> {
    let mut v = init;
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v`/`len` are valid out-parameters of the size passed; `T` is plain data.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Starts a non-blocking TCP connect to `addr` (close-on-exec). The stream is returned at
/// once: `true` when already connected, else the connect is under way — the socket turns
/// writable when it is done, and `TcpStream::take_error` then says whether it failed.
pub fn tcp_connect_nonblocking(
    addr: std::net::SocketAddr,
) -> io::Result<(std::net::TcpStream, bool)> {
    let (family, sa, len) = sockaddr_in(addr);
    // SAFETY: plain syscall; the returned fd is owned by us.
    let fd = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `sa` holds a valid sockaddr of `len` bytes; `fd` is our socket.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if r == 0 {
        return Ok((std::net::TcpStream::from(fd), true));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok((std::net::TcpStream::from(fd), false))
    } else {
        Err(e)
    }
}

fn sockaddr_in(addr: std::net::SocketAddr) -> (libc::c_int, libc::sockaddr_storage, u32) {
    // SAFETY: a zeroed sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            (
                libc::AF_INET,
                ss,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        }
        std::net::SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            (
                libc::AF_INET6,
                ss,
                std::mem::size_of::<libc::sockaddr_in6>() as u32,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn fds_travel_with_data() {
        let (a, b) = UnixStream::pair().unwrap();
        let e = eventfd().unwrap();
        send_with_fds(&a, b"hello", &[e.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        notify(fds[0].as_fd()).unwrap();
        assert_eq!(drain(e.as_fd()).unwrap(), 8);
    }

    #[test]
    fn epoll_reports_readable() {
        let ep = Epoll::new().unwrap();
        let e = eventfd().unwrap();
        ep.add(e.as_fd(), 7, false).unwrap();
        let mut out = [EpollEvent::default(); 4];
        assert_eq!(ep.wait(&mut out, 0).unwrap(), 0);
        notify(e.as_fd()).unwrap();
        assert_eq!(ep.wait(&mut out, 100).unwrap(), 1);
        assert_eq!(out[0].token, 7);
        assert!(out[0].readable);
    }
}
