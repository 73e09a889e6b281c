//! AF_XDP uplinks: an existing netdev's receive queue 0 redirected to a socket by XDP.
//!
//! Pieces (all made by [`XskSocket::open`]):
//!
//! * the **UMEM**: packet memory shared with the kernel, in a memfd (so that a hot upgrade can
//!   hand it over), cut into frames of [`XskGeometry::frame_size`] bytes. Frames
//!   `0..rx_frames` are for receive, the next `tx_frames` for transmit;
//! * four **rings** mapped from the socket: *fill* (we give the kernel empty receive frames),
//!   *rx* (the kernel gives them back full), *tx* (we give frames to send), *completion* (the
//!   kernel gives sent frames back). Each is a power-of-two array with a producer and a
//!   consumer index (free-running `u32`s) in shared memory; each side writes one index;
//! * the **XDP program** ([`crate::kernel::bpf`]) redirecting queue 0 to the socket;
//! * a packet socket with no protocol holding the device in promiscuous mode (a per-socket
//!   membership, undone when the socket closes) — frames for other MAC addresses must reach
//!   XDP too.
//!
//! Frame ownership (the invariants the hot upgrade relies on):
//!
//! * **Receive frames never stay with us.** [`XskRx::release`] puts every frame it consumed
//!   back on the fill ring before it publishes the rx consumer index, so between bursts
//!   `fill.producer - rx.consumer == rx_frames` exactly. The new daemon checks it; after a
//!   roll-back, a difference tells how far a killed reader got (see [`XskRx::resync`]).
//! * **Transmit frames are free (our list) or outstanding** (posted, not yet reaped from the
//!   completion ring): `free.len() + (tx.producer - completion.consumer) == tx_frames`. The
//!   free list is plain data handed over at the freeze ([`XskTxPosition`]), checked against
//!   that count and for duplicates.
//!
//! Copy mode vs zero-copy: the socket is bound without forcing either; the kernel uses
//! zero-copy where the driver supports it (a NIC with AF_XDP support) and copy mode otherwise
//! (veth, generic XDP). The datapath copies frames in and out of the UMEM either way (the
//! switch's own buffers come from its pool), so both behave the same here.
//!
//! Safety: the rings and the UMEM are memory the kernel shares. Indices are read and written
//! with atomics (Acquire on the other side's index, Release on ours); descriptors and frame
//! bytes are moved with raw copies, never as references; every address the kernel gives
//! back is checked against the UMEM and the frame's role before use.
//!
//! Thread-safety: an [`XskRx`] has one reader, an [`XskTx`] one writer at a time (`&mut
//! self`; the datapath puts each behind its own mutex). [`XskSocket`] is shared.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::kernel::af_packet::SendReport;
use crate::kernel::bpf::{BpfError, XdpMode, XdpProgram};
use crate::kernel::netdev;
use crate::mmap::Mmap;
use crate::os::{getopt, setopt};

/// Shape of the UMEM and rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XskGeometry {
    /// Bytes per frame (a power of two, 2048..=4096; the kernel keeps 256 of them as
    /// headroom, so this bounds the largest frame).
    pub frame_size: u32,
    /// Receive frames, also the size of the fill and rx rings (a power of two).
    pub rx_frames: u32,
    /// Transmit frames, also the size of the tx and completion rings (a power of two).
    pub tx_frames: u32,
}

/// `XDP_PACKET_HEADROOM`: what the kernel keeps in front of a received frame.
pub const KERNEL_HEADROOM: u32 = 256;

impl XskGeometry {
    /// 1024 + 1024 frames of 4 KiB (8 MiB of UMEM).
    pub const DEFAULT: XskGeometry = XskGeometry {
        frame_size: 4096,
        rx_frames: 1024,
        tx_frames: 1024,
    };

    /// Bytes of UMEM.
    pub fn umem_len(&self) -> usize {
        self.frame_size as usize * (self.rx_frames as usize + self.tx_frames as usize)
    }

    /// Largest frame received or sent.
    pub fn max_frame(&self) -> usize {
        (self.frame_size - KERNEL_HEADROOM) as usize
    }

    pub fn check(&self) -> Result<(), String> {
        let ok = matches!(self.frame_size, 2048 | 4096)
            && self.rx_frames.is_power_of_two()
            && self.tx_frames.is_power_of_two()
            && (16..=16384).contains(&self.rx_frames)
            && (16..=16384).contains(&self.tx_frames);
        if ok {
            Ok(())
        } else {
            Err(format!("AF_XDP geometry {self:?} is invalid"))
        }
    }
}

/// Entries a consumer may take: `prod - cons`, never more than the ring holds.
#[inline]
pub fn ring_entries(prod: u32, cons: u32, size: u32) -> u32 {
    prod.wrapping_sub(cons).min(size)
}

/// Slots a producer may fill: the ring's size less what the consumer has not taken.
#[inline]
pub fn ring_free(prod: u32, cons: u32, size: u32) -> u32 {
    size - ring_entries(prod, cons, size)
}

/// The frame an address of the UMEM lies in, and its offset in it; `None` outside.
#[inline]
pub fn frame_of(addr: u64, frame_size: u32, frames: u32) -> Option<(u32, u32)> {
    let idx = addr / frame_size as u64;
    if idx >= frames as u64 {
        return None;
    }
    Some((idx as u32, (addr % frame_size as u64) as u32))
}

/// Why an AF_XDP uplink could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error(transparent)]
    Name(#[from] netdev::NameError),
    #[error("no network device named {0}")]
    NoDevice(String),
    #[error("{0} is not an Ethernet device (link type {1}); AF_XDP uplinks need one")]
    NotEthernet(String, u16),
    #[error("{name}: cannot {what}")]
    Setup {
        name: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{name}")]
    Bpf {
        name: String,
        #[source]
        source: BpfError,
    },
    #[error("handed-over AF_XDP fds: {0}")]
    BadFd(String),
}

fn socket(domain: libc::c_int, proto: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A mapped ring: its indices, flags and descriptor array.
///
/// Invariant: the mapping holds `desc + size * elem` bytes; `prod`, `cons`, `flags` are
/// 4-byte aligned offsets inside it and `desc` is 8-byte aligned; `size` is a power of two.
#[derive(Debug)]
struct RingMap {
    map: Mmap,
    prod: usize,
    cons: usize,
    flags: usize,
    desc: usize,
    size: u32,
    elem: usize,
}

impl RingMap {
    fn map(
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

    #[inline]
    fn atomic(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is one of prod/cons/flags: 4-byte aligned and inside the mapping
        // (invariant). The kernel writes it concurrently: atomics are how to share it.
        unsafe { &*(self.map.as_ptr().add(at) as *const AtomicU32) }
    }

    #[inline]
    fn producer(&self) -> &AtomicU32 {
        self.atomic(self.prod)
    }

    #[inline]
    fn consumer(&self) -> &AtomicU32 {
        self.atomic(self.cons)
    }

    #[inline]
    fn needs_wakeup(&self) -> bool {
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
    fn read_addr(&self, idx: u32) -> u64 {
        debug_assert_eq!(self.elem, 8);
        // SAFETY: an 8-byte aligned slot inside the mapping; a raw read forms no reference.
        unsafe { std::ptr::read_volatile(self.slot(idx) as *const u64) }
    }

    #[inline]
    fn write_addr(&self, idx: u32, addr: u64) {
        debug_assert_eq!(self.elem, 8);
        // SAFETY: as for `read_addr`; the slot is ours until we publish the producer.
        unsafe { std::ptr::write_volatile(self.slot(idx) as *mut u64, addr) }
    }

    #[inline]
    fn read_desc(&self, idx: u32) -> (u64, u32) {
        debug_assert_eq!(self.elem, 16);
        // SAFETY: a 16-byte slot (xdp_desc) inside the mapping, 8-byte aligned.
        let d = unsafe { std::ptr::read_volatile(self.slot(idx) as *const libc::xdp_desc) };
        (d.addr, d.len)
    }

    #[inline]
    fn write_desc(&self, idx: u32, addr: u64, len: u32) {
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
    fd: OwnedFd,
    map: Mmap,
    geo: XskGeometry,
}

impl Umem {
    /// Pointer to the start of frame `idx` (`idx < rx_frames + tx_frames`, checked).
    #[inline]
    fn frame(&self, idx: u32) -> *mut u8 {
        assert!(idx < self.geo.rx_frames + self.geo.tx_frames);
        // SAFETY: the frame lies inside the mapping (checked above, invariant).
        unsafe {
            self.map
                .as_ptr()
                .add(idx as usize * self.geo.frame_size as usize)
        }
    }
}

/// Where a receiver is (both indices are also in the shared rings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XskRxPosition {
    pub rx_cons: u32,
    pub fill_prod: u32,
}

/// Where a transmitter is, with the frames it holds free.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XskTxPosition {
    pub tx_prod: u32,
    pub cq_cons: u32,
    /// Free transmit frames (UMEM frame indices).
    #[cfg_attr(feature = "serde", serde(rename = "tx_free"))]
    pub free: Vec<u32>,
}

/// What [`XskRx::read`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XskRxFrame {
    /// A frame of this many bytes was copied into the buffer.
    Frame(usize),
    /// Larger than the buffer (skipped).
    Oversize,
    /// A descriptor outside the receive frames (skipped; never recycled).
    Bad,
}

/// The receive side: rx and fill rings.
#[derive(Debug)]
pub struct XskRx {
    umem: Arc<Umem>,
    fd: Arc<OwnedFd>,
    rx: RingMap,
    fill: RingMap,
    cons: u32,
    fill_prod: u32,
    zero_copy: bool,
    /// Frames lost to bad descriptors or a killed reader (never expected).
    lost: u64,
}

impl XskRx {
    /// Frames waiting (up to the ring's size).
    #[inline]
    pub fn available(&self) -> u32 {
        let prod = self.rx.producer().load(Ordering::Acquire);
        ring_entries(prod, self.cons, self.rx.size)
    }

    /// Copies frame `k` of those [`XskRx::available`] into `dst` (nothing is consumed).
    #[inline]
    pub fn read(&self, k: u32, dst: &mut [u8]) -> XskRxFrame {
        let geo = self.umem.geo;
        let (addr, len) = self.rx.read_desc(self.cons.wrapping_add(k));
        let Some((idx, off)) = frame_of(addr, geo.frame_size, geo.rx_frames) else {
            return XskRxFrame::Bad;
        };
        let len = len as usize;
        if off as usize + len > geo.frame_size as usize {
            return XskRxFrame::Bad;
        }
        if len > dst.len() {
            return XskRxFrame::Oversize;
        }
        // SAFETY: `[off, off + len)` lies inside receive frame `idx` (checked), which the
        // kernel handed to us and does not write until we give it back on the fill ring;
        // `dst` is a distinct Rust buffer of at least `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.umem.frame(idx).add(off as usize),
                dst.as_mut_ptr(),
                len,
            )
        };
        XskRxFrame::Frame(len)
    }

    /// Consumes the first `n` frames: their UMEM frames go back on the fill ring first, then
    /// the rx consumer index moves (so a reader killed in between leaves a state that
    /// [`XskRx::resync`] recognises).
    #[inline]
    pub fn release(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        let geo = self.umem.geo;
        let fill_cons = self.fill.consumer().load(Ordering::Acquire);
        let room = ring_free(self.fill_prod, fill_cons, self.fill.size);
        let mut posted = 0;
        for k in 0..n {
            let (addr, _) = self.rx.read_desc(self.cons.wrapping_add(k));
            match frame_of(addr, geo.frame_size, geo.rx_frames) {
                Some((idx, _)) if posted < room => {
                    let base = idx as u64 * geo.frame_size as u64;
                    self.fill
                        .write_addr(self.fill_prod.wrapping_add(posted), base);
                    posted += 1;
                }
                _ => self.lost += 1,
            }
        }
        self.fill_prod = self.fill_prod.wrapping_add(posted);
        self.fill
            .producer()
            .store(self.fill_prod, Ordering::Release);
        self.cons = self.cons.wrapping_add(n);
        self.rx.consumer().store(self.cons, Ordering::Release);
        if self.zero_copy && self.fill.needs_wakeup() {
            // The driver sleeps until told there are fill buffers (zero-copy only).
            // SAFETY: a zero-length, non-blocking recvfrom with no address.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Where the reader is.
    pub fn position(&self) -> XskRxPosition {
        XskRxPosition {
            rx_cons: self.cons,
            fill_prod: self.fill_prod,
        }
    }

    /// Receive frames given to the kernel (`fill.producer - rx.consumer`): `rx_frames`
    /// between bursts.
    pub fn posted(&self) -> u32 {
        self.fill_prod.wrapping_sub(self.cons)
    }

    /// Frames lost so far (bad descriptors, a reader killed mid-burst).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Continues where the previous reader (another daemon) stopped, checking that the
    /// shared rings say the same and that every receive frame is with the kernel.
    pub fn resume(&mut self, p: XskRxPosition) -> Result<(), ResumeError> {
        let rx_cons = self.rx.consumer().load(Ordering::Acquire);
        let fill_prod = self.fill.producer().load(Ordering::Acquire);
        if (rx_cons, fill_prod) != (p.rx_cons, p.fill_prod) {
            return Err(ResumeError::RxIndices {
                rx_cons,
                fill_prod,
                given: p,
            });
        }
        let posted = fill_prod.wrapping_sub(rx_cons);
        if posted != self.umem.geo.rx_frames {
            return Err(ResumeError::RxPosted {
                posted,
                rx_frames: self.umem.geo.rx_frames,
            });
        }
        self.cons = rx_cons;
        self.fill_prod = fill_prod;
        Ok(())
    }

    /// Finds the reader's place from the shared rings after another process may have read
    /// them (a roll-back after the new daemon was killed). A reader killed after refilling
    /// but before moving the rx consumer left `d` frames both on the fill ring and in the rx
    /// ring: they are skipped (not read twice, not posted twice). Returns frames found lost
    /// (a reader killed in a way the invariant cannot explain; never expected).
    pub fn resync(&mut self) -> u32 {
        let rx_cons = self.rx.consumer().load(Ordering::Acquire);
        let fill_prod = self.fill.producer().load(Ordering::Acquire);
        let rx_frames = self.umem.geo.rx_frames;
        let d = fill_prod.wrapping_sub(rx_cons).wrapping_sub(rx_frames) as i32;
        self.cons = rx_cons;
        self.fill_prod = fill_prod;
        if d > 0 && (d as u32) <= self.available() {
            self.cons = rx_cons.wrapping_add(d as u32);
            self.rx.consumer().store(self.cons, Ordering::Release);
            0
        } else if d != 0 {
            let lost = d.unsigned_abs();
            self.lost += lost as u64;
            lost
        } else {
            0
        }
    }
}

/// The transmit side: tx and completion rings and the free transmit frames.
#[derive(Debug)]
pub struct XskTx {
    umem: Arc<Umem>,
    fd: Arc<OwnedFd>,
    /// For link-state ioctls (error paths only).
    ctl: Arc<OwnedFd>,
    ifindex: u32,
    tx: RingMap,
    cq: RingMap,
    prod: u32,
    cq_cons: u32,
    /// Free transmit frames (UMEM indices); capacity `tx_frames`, never reallocated.
    free: Vec<u32>,
    /// Per transmit frame: whether it is in `free`.
    is_free: Vec<bool>,
    /// The last kick said the device is down: do not queue frames that would wait.
    link_down: bool,
    /// Completions naming a frame that was not outstanding (never expected).
    bad_completions: u64,
}

impl XskTx {
    fn first(&self) -> u32 {
        self.umem.geo.rx_frames
    }

    /// Takes back the frames the kernel finished sending.
    #[inline]
    fn reap(&mut self) {
        let prod = self.cq.producer().load(Ordering::Acquire);
        let n = ring_entries(prod, self.cq_cons, self.cq.size);
        if n == 0 {
            return;
        }
        let geo = self.umem.geo;
        let first = self.first();
        for k in 0..n {
            let addr = self.cq.read_addr(self.cq_cons.wrapping_add(k));
            match frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                Some((idx, _)) if idx >= first && !self.is_free[(idx - first) as usize] => {
                    self.is_free[(idx - first) as usize] = true;
                    self.free.push(idx);
                }
                _ => self.bad_completions += 1,
            }
        }
        self.cq_cons = self.cq_cons.wrapping_add(n);
        self.cq.consumer().store(self.cq_cons, Ordering::Release);
    }

    /// Whether the device is up with its carrier on (two ioctls: error paths only).
    fn device_running(&self) -> bool {
        netdev::running_by_index(self.ctl.as_fd(), self.ifindex)
    }

    /// Queues every frame of `pkts` for sending and kicks the kernel; a frame that cannot be
    /// queued is counted by reason, never retried.
    pub fn send_burst<'a, I>(&mut self, pkts: I) -> SendReport
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut rep = SendReport::default();
        self.reap();
        if self.link_down {
            if self.device_running() {
                self.link_down = false;
            } else {
                rep.link_down = pkts.into_iter().count();
                return rep;
            }
        }
        let geo = self.umem.geo;
        let max = geo.max_frame();
        let tx_cons = self.tx.consumer().load(Ordering::Acquire);
        let mut room = ring_free(self.prod, tx_cons, self.tx.size);
        for p in pkts {
            if p.len() > max {
                rep.oversize += 1;
                continue;
            }
            if room == 0 {
                rep.full += 1;
                continue;
            }
            let Some(idx) = self.free.pop() else {
                rep.full += 1;
                continue;
            };
            let first = self.first();
            self.is_free[(idx - first) as usize] = false;
            // SAFETY: frame `idx` is a free transmit frame: the kernel does not read it
            // until we post it, and `p.len() <= max < frame_size`; `p` is a Rust buffer.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.umem.frame(idx), p.len()) };
            let addr = idx as u64 * geo.frame_size as u64;
            self.tx.write_desc(self.prod, addr, p.len() as u32);
            self.prod = self.prod.wrapping_add(1);
            room -= 1;
            rep.sent += 1;
            rep.bytes += p.len() as u64;
        }
        if rep.sent > 0 {
            self.tx.producer().store(self.prod, Ordering::Release);
        }
        let queued = self.prod != self.tx.consumer().load(Ordering::Acquire);
        if queued && self.tx.needs_wakeup() {
            self.kick(&mut rep);
        }
        rep
    }

    /// Tells the kernel to send what is queued (copy mode sends from this call, up to 32
    /// frames each time; zero-copy only wakes the driver).
    fn kick(&mut self, rep: &mut SendReport) {
        for _ in 0..8 {
            let before = self.tx.consumer().load(Ordering::Acquire);
            // SAFETY: a zero-length, non-blocking sendto with no address.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            let after = self.tx.consumer().load(Ordering::Acquire);
            let done = after == self.prod;
            if r >= 0 {
                if done || after == before {
                    return;
                }
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                // More to send, or no skb/completion slot right now: the rest stays
                // queued for the next kick.
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    if done || after == before {
                        return;
                    }
                }
                // The device dropped one frame (consumed and completed, not sent).
                Some(libc::EBUSY) => {
                    rep.sent = rep.sent.saturating_sub(1);
                    if self.device_running() {
                        rep.full += 1;
                    } else {
                        rep.link_down += 1;
                        self.went_down(rep);
                        return;
                    }
                }
                Some(libc::ENETDOWN) | Some(libc::ENXIO) | Some(libc::ENODEV) => {
                    self.went_down(rep);
                    return;
                }
                _ => {
                    return;
                }
            }
        }
    }

    /// The device is down: what this burst queued will wait (or be dropped one per kick):
    /// count it as lost to the link, and queue nothing until the device runs again.
    fn went_down(&mut self, rep: &mut SendReport) {
        self.link_down = true;
        rep.link_down += rep.sent;
        rep.sent = 0;
        rep.bytes = 0;
    }

    /// Free transmit frames.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Transmit frames posted and not yet reaped (`tx.producer - completion.consumer`).
    pub fn outstanding(&self) -> u32 {
        self.prod.wrapping_sub(self.cq_cons)
    }

    /// Completions that named a frame not outstanding (never expected).
    pub fn bad_completions(&self) -> u64 {
        self.bad_completions
    }

    /// Where the transmitter is, free frames included: hand this to the next daemon.
    pub fn position(&self) -> XskTxPosition {
        XskTxPosition {
            tx_prod: self.prod,
            cq_cons: self.cq_cons,
            free: self.free.clone(),
        }
    }

    /// Continues from another daemon's position: the indices must match the shared rings,
    /// the free frames be transmit frames, each once, and with the outstanding ones account
    /// for every transmit frame.
    pub fn resume(&mut self, p: &XskTxPosition) -> Result<(), ResumeError> {
        let tx_prod = self.tx.producer().load(Ordering::Acquire);
        let cq_cons = self.cq.consumer().load(Ordering::Acquire);
        if (tx_prod, cq_cons) != (p.tx_prod, p.cq_cons) {
            return Err(ResumeError::TxIndices {
                tx_prod,
                cq_cons,
                given_tx_prod: p.tx_prod,
                given_cq_cons: p.cq_cons,
            });
        }
        let geo = self.umem.geo;
        let first = self.first();
        let mut is_free = vec![false; geo.tx_frames as usize];
        for &idx in &p.free {
            if idx < first || idx >= first + geo.tx_frames {
                return Err(ResumeError::NotTxFrame {
                    frame: idx,
                    first,
                    end: first + geo.tx_frames,
                });
            }
            if std::mem::replace(&mut is_free[(idx - first) as usize], true) {
                return Err(ResumeError::FreeTwice(idx));
            }
        }
        let outstanding = tx_prod.wrapping_sub(cq_cons);
        if p.free.len() as u64 + outstanding as u64 != geo.tx_frames as u64 {
            return Err(ResumeError::TxFrames {
                free: p.free.len(),
                outstanding,
                tx_frames: geo.tx_frames,
            });
        }
        self.prod = tx_prod;
        self.cq_cons = cq_cons;
        self.free.clear();
        self.free.extend_from_slice(&p.free);
        self.is_free = is_free;
        Ok(())
    }

    /// Finds the free frames again after another process may have used the rings (a
    /// roll-back): from our own state at the freeze, every frame posted since (tx slots
    /// `[our producer, shared producer)`) is outstanding and every frame reaped since
    /// (completion slots `[our consumer, shared consumer)`) is free. When those slots may
    /// have been overwritten (the other daemon ran for more than a ring's worth), the frames
    /// in the last `outstanding` tx slots are taken as the outstanding ones (exact when the
    /// kernel completes in order). Returns whether the exact method applied.
    pub fn resync(&mut self) -> bool {
        let geo = self.umem.geo;
        let first = self.first();
        let p1 = self.tx.producer().load(Ordering::Acquire);
        let c1 = self.cq.consumer().load(Ordering::Acquire);
        let kprod = self.cq.producer().load(Ordering::Acquire);
        let posted = p1.wrapping_sub(self.prod);
        let reaped = c1.wrapping_sub(self.cq_cons);
        let mut count: Vec<i64> = self
            .is_free
            .iter()
            .map(|f| if *f { 0 } else { 1 })
            .collect();
        let mut exact = posted <= self.tx.size
            && reaped <= self.cq.size
            && kprod.wrapping_sub(self.cq_cons) <= self.cq.size;
        if exact {
            for k in 0..posted {
                let (addr, _) = self.tx.read_desc(self.prod.wrapping_add(k));
                match frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                    Some((i, _)) if i >= first => count[(i - first) as usize] += 1,
                    _ => exact = false,
                }
            }
            for k in 0..reaped {
                let addr = self.cq.read_addr(self.cq_cons.wrapping_add(k));
                match frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                    Some((i, _)) if i >= first => count[(i - first) as usize] -= 1,
                    _ => exact = false,
                }
            }
            exact &= count.iter().all(|c| *c == 0 || *c == 1);
        }
        if !exact {
            count.iter_mut().for_each(|c| *c = 0);
            let outstanding = p1.wrapping_sub(c1).min(geo.tx_frames);
            for k in 0..outstanding {
                let (addr, _) = self.tx.read_desc(p1.wrapping_sub(1 + k));
                if let Some((i, _)) = frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                    if i >= first {
                        count[(i - first) as usize] = 1;
                    }
                }
            }
        }
        self.free.clear();
        for (k, c) in count.iter().enumerate() {
            self.is_free[k] = *c == 0;
            if *c == 0 {
                self.free.push(first + k as u32);
            }
        }
        self.prod = p1;
        self.cq_cons = c1;
        exact
    }
}

/// Why a handed-over AF_XDP position ([`XskRxPosition`], [`XskTxPosition`]) was refused: it
/// comes from another process (untrusted), and is checked against the rings both share.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    #[error(
        "AF_XDP rings at rx {rx_cons}/fill {fill_prod}, handed over at {}/{}",
        .given.rx_cons,
        .given.fill_prod
    )]
    RxIndices {
        rx_cons: u32,
        fill_prod: u32,
        given: XskRxPosition,
    },
    #[error("{posted} receive frames with the kernel, expected {rx_frames}")]
    RxPosted { posted: u32, rx_frames: u32 },
    #[error(
        "AF_XDP rings at tx {tx_prod}/completion {cq_cons}, handed over at \
         {given_tx_prod}/{given_cq_cons}"
    )]
    TxIndices {
        tx_prod: u32,
        cq_cons: u32,
        given_tx_prod: u32,
        given_cq_cons: u32,
    },
    #[error("free transmit frame {frame} is not a transmit frame ({first}..{end})")]
    NotTxFrame { frame: u32, first: u32, end: u32 },
    #[error("transmit frame {0} handed over free twice")]
    FreeTwice(u32),
    #[error("{free} free + {outstanding} outstanding transmit frames, expected {tx_frames}")]
    TxFrames {
        free: usize,
        outstanding: u32,
        tx_frames: u32,
    },
}

/// The kernel's AF_XDP counters (`XDP_STATISTICS`), cumulative for the socket's life. A hot
/// upgrade carries those already counted; on the wire they are the array `[rx_dropped,
/// rx_ring_full, rx_invalid_descs, tx_invalid_descs]` (that order is the wire format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(from = "[u64; 4]", into = "[u64; 4]")
)]
pub struct XskStats {
    /// Frames dropped on receive (no fill frame, too large for a frame).
    pub rx_dropped: u64,
    /// Frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
}

impl From<XskStats> for [u64; 4] {
    fn from(s: XskStats) -> [u64; 4] {
        [
            s.rx_dropped,
            s.rx_ring_full,
            s.rx_invalid_descs,
            s.tx_invalid_descs,
        ]
    }
}

impl From<[u64; 4]> for XskStats {
    fn from([rx_dropped, rx_ring_full, rx_invalid_descs, tx_invalid_descs]: [u64; 4]) -> Self {
        XskStats {
            rx_dropped,
            rx_ring_full,
            rx_invalid_descs,
            tx_invalid_descs,
        }
    }
}

/// The fds a hot upgrade hands over, in this order.
#[derive(Debug)]
pub struct XskFds {
    pub xsk: OwnedFd,
    pub umem: OwnedFd,
    pub promisc: OwnedFd,
    pub map: OwnedFd,
    pub prog: OwnedFd,
    pub link: OwnedFd,
}

/// An AF_XDP socket bound to queue 0 of a netdev, with its UMEM and XDP program.
#[derive(Debug)]
pub struct XskSocket {
    fd: Arc<OwnedFd>,
    umem: Arc<Umem>,
    promisc: Arc<OwnedFd>,
    prog: XdpProgram,
    ifindex: u32,
    zero_copy: bool,
}

impl XskSocket {
    /// Attaches to the existing Ethernet netdev `name`: UMEM, rings, socket bound to queue
    /// 0 (zero-copy if the driver has it, else copy), XDP program attached, device
    /// promiscuous and up. Every failure names the step and the kernel's reason.
    pub fn open(name: &str, geo: XskGeometry) -> Result<(XskSocket, XskRx, XskTx), XskError> {
        netdev::check_name(name)?;
        let setup = |what| {
            move |source| XskError::Setup {
                name: name.into(),
                what,
                source,
            }
        };
        geo.check()
            .map_err(|e| setup("size the UMEM")(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let ifindex = match netdev::ifindex(name) {
            Ok(i) => i,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(XskError::NoDevice(name.into()))
            }
            Err(e) => return Err(setup("look up the device")(e)),
        };
        // Protocol 0: this packet socket receives nothing; it only holds promiscuity.
        let promisc = socket(libc::AF_PACKET, 0).map_err(setup("open an AF_PACKET socket"))?;
        let hwtype =
            netdev::link_type(promisc.as_fd(), name).map_err(setup("read the link type"))?;
        if hwtype != libc::ARPHRD_ETHER {
            return Err(XskError::NotEthernet(name.into(), hwtype));
        }
        let fd = socket(libc::AF_XDP, 0).map_err(setup("open an AF_XDP socket"))?;
        let len = geo.umem_len();
        let memfd = crate::os::memfd("ferrovs-umem", len as u64, false)
            .map_err(setup("create the UMEM"))?;
        let map = Mmap::map_shared_populated(memfd.as_fd(), len).map_err(setup("map the UMEM"))?;
        let reg = libc::xdp_umem_reg {
            addr: map.as_ptr() as u64,
            len: len as u64,
            chunk_size: geo.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setopt(fd.as_fd(), libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
            .map_err(setup("register the UMEM"))?;
        for (opt, n) in [
            (libc::XDP_UMEM_FILL_RING, geo.rx_frames),
            (libc::XDP_UMEM_COMPLETION_RING, geo.tx_frames),
            (libc::XDP_RX_RING, geo.rx_frames),
            (libc::XDP_TX_RING, geo.tx_frames),
        ] {
            setopt(fd.as_fd(), libc::SOL_XDP, opt, &(n as libc::c_int))
                .map_err(setup("size the AF_XDP rings"))?;
        }
        let umem = Arc::new(Umem {
            fd: memfd,
            map,
            geo,
        });
        let fd = Arc::new(fd);
        let promisc = Arc::new(promisc);
        let (mut rx, tx) = map_rings(&fd, &umem, &promisc, ifindex, false)
            .map_err(setup("map the AF_XDP rings"))?;
        // Every receive frame to the kernel before it can receive anything.
        for i in 0..geo.rx_frames {
            rx.fill.write_addr(i, i as u64 * geo.frame_size as u64);
        }
        rx.fill_prod = geo.rx_frames;
        rx.fill.producer().store(rx.fill_prod, Ordering::Release);
        // SAFETY: a zeroed sockaddr_xdp is valid.
        let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
        sa.sxdp_family = libc::AF_XDP as u16;
        sa.sxdp_flags = libc::XDP_USE_NEED_WAKEUP;
        sa.sxdp_ifindex = ifindex;
        sa.sxdp_queue_id = 0;
        // SAFETY: `sa` is a valid sockaddr_xdp of the length passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(setup("bind the AF_XDP socket to queue 0")(
                io::Error::last_os_error(),
            ));
        }
        let zero_copy = zero_copy(fd.as_fd());
        rx.zero_copy = zero_copy;
        let prog = XdpProgram::attach(ifindex, fd.as_fd()).map_err(|source| XskError::Bpf {
            name: name.into(),
            source,
        })?;
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as libc::c_int,
            mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        setopt(
            promisc.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
        )
        .map_err(setup("enter promiscuous mode"))?;
        netdev::set_up(name).map_err(setup("bring the device up"))?;
        let mut tx = tx;
        tx.free.extend(geo.rx_frames..geo.rx_frames + geo.tx_frames);
        tx.is_free.iter_mut().for_each(|f| *f = true);
        let sock = XskSocket {
            fd,
            umem,
            promisc,
            prog,
            ifindex,
            zero_copy,
        };
        Ok((sock, rx, tx))
    }

    /// Adopts the fds of a socket another daemon set up (same geometry), mapping the same
    /// UMEM and rings. Nothing moves until [`XskRx::resume`] and [`XskTx::resume`].
    pub fn from_fds(
        fds: XskFds,
        geo: XskGeometry,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(XskSocket, XskRx, XskTx), XskError> {
        let bad = |what: &str, e: io::Error| XskError::BadFd(format!("{what}: {e}"));
        geo.check().map_err(XskError::BadFd)?;
        for (what, fd, want) in [
            ("AF_XDP socket", &fds.xsk, libc::AF_XDP),
            ("promiscuity socket", &fds.promisc, libc::AF_PACKET),
        ] {
            let d = getopt(
                fd.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_DOMAIN,
                0 as libc::c_int,
            )
            .map_err(|e| bad(what, e))?;
            if d != want {
                return Err(XskError::BadFd(format!("{what}: socket domain {d}")));
            }
        }
        let (size, _) = crate::os::fd_size(fds.umem.as_fd()).map_err(|e| bad("UMEM", e))?;
        if size != geo.umem_len() as u64 {
            return Err(XskError::BadFd(format!(
                "UMEM of {size} bytes, expected {}",
                geo.umem_len()
            )));
        }
        let map = Mmap::map_shared_populated(fds.umem.as_fd(), geo.umem_len())
            .map_err(|e| bad("mapping the UMEM", e))?;
        let prog = XdpProgram::from_fds(fds.map, fds.prog, fds.link, ifindex, mode)
            .map_err(|e| XskError::BadFd(e.to_string()))?;
        let umem = Arc::new(Umem {
            fd: fds.umem,
            map,
            geo,
        });
        let fd = Arc::new(fds.xsk);
        let promisc = Arc::new(fds.promisc);
        let zc = zero_copy(fd.as_fd());
        let (mut rx, tx) = map_rings(&fd, &umem, &promisc, ifindex, zc)
            .map_err(|e| bad("mapping the rings", e))?;
        rx.zero_copy = zc;
        let sock = XskSocket {
            fd,
            umem,
            promisc,
            prog,
            ifindex,
            zero_copy: zc,
        };
        Ok((sock, rx, tx))
    }

    /// The fds to hand over, in [`XskFds`] order.
    pub fn handover_fds(&self) -> [BorrowedFd<'_>; 6] {
        [
            self.fd.as_fd(),
            self.umem.fd.as_fd(),
            self.promisc.as_fd(),
            self.prog.map.as_fd(),
            self.prog.prog.as_fd(),
            self.prog.link.as_fd(),
        ]
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn geometry(&self) -> XskGeometry {
        self.umem.geo
    }

    /// Whether the kernel bound in zero-copy mode (else copy mode).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// How the XDP program is attached.
    pub fn xdp_mode(&self) -> XdpMode {
        self.prog.mode
    }

    /// The kernel's counters (one system call).
    pub fn statistics(&self) -> io::Result<XskStats> {
        // SAFETY: an all-zero xdp_statistics is a valid value.
        let s: libc::xdp_statistics = getopt(
            self.fd.as_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            unsafe { std::mem::zeroed() },
        )?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped,
            rx_ring_full: s.rx_ring_full,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
        })
    }
}

impl AsFd for XskSocket {
    /// The AF_XDP socket: readable while the rx ring has frames.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn zero_copy(fd: BorrowedFd<'_>) -> bool {
    getopt(
        fd,
        libc::SOL_XDP,
        libc::XDP_OPTIONS,
        libc::xdp_options { flags: 0 },
    )
    .is_ok_and(|o| o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
}

/// Maps the four rings of `fd` (sized by the UMEM's geometry); local indices are read from
/// the shared rings (a fresh socket's are all zero).
fn map_rings(
    fd: &Arc<OwnedFd>,
    umem: &Arc<Umem>,
    ctl: &Arc<OwnedFd>,
    ifindex: u32,
    zero_copy: bool,
) -> io::Result<(XskRx, XskTx)> {
    let geo = umem.geo;
    // SAFETY: an all-zero xdp_mmap_offsets is a valid value.
    let off: libc::xdp_mmap_offsets =
        getopt(fd.as_fd(), libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, unsafe {
            std::mem::zeroed()
        })?;
    let desc = std::mem::size_of::<libc::xdp_desc>();
    let rx = RingMap::map(
        fd.as_fd(),
        libc::XDP_PGOFF_RX_RING as u64,
        &off.rx,
        geo.rx_frames,
        desc,
    )?;
    let tx = RingMap::map(
        fd.as_fd(),
        libc::XDP_PGOFF_TX_RING as u64,
        &off.tx,
        geo.tx_frames,
        desc,
    )?;
    let fill = RingMap::map(
        fd.as_fd(),
        libc::XDP_UMEM_PGOFF_FILL_RING,
        &off.fr,
        geo.rx_frames,
        8,
    )?;
    let cq = RingMap::map(
        fd.as_fd(),
        libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        &off.cr,
        geo.tx_frames,
        8,
    )?;
    let rx = XskRx {
        umem: umem.clone(),
        fd: fd.clone(),
        cons: rx.consumer().load(Ordering::Acquire),
        fill_prod: fill.producer().load(Ordering::Acquire),
        rx,
        fill,
        zero_copy,
        lost: 0,
    };
    let tx = XskTx {
        umem: umem.clone(),
        fd: fd.clone(),
        ctl: ctl.clone(),
        ifindex,
        prod: tx.producer().load(Ordering::Acquire),
        cq_cons: cq.consumer().load(Ordering::Acquire),
        tx,
        cq,
        free: Vec::with_capacity(geo.tx_frames as usize),
        is_free: vec![false; geo.tx_frames as usize],
        link_down: false,
        bad_completions: 0,
    };
    Ok((rx, tx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::af_packet::{AfPacket, RingGeometry, RxFrame};
    use crate::kernel::test_veth::Veth;

    #[test]
    fn ring_arithmetic_wraps() {
        assert_eq!(ring_entries(5, 3, 8), 2);
        assert_eq!(ring_free(5, 3, 8), 6);
        // Free-running indices wrap around u32.
        assert_eq!(ring_entries(2, u32::MAX - 1, 8), 4);
        assert_eq!(ring_free(2, u32::MAX - 1, 8), 4);
        // A full ring, and a corrupt pair (producer "behind"): never more than the size.
        assert_eq!(ring_entries(8, 0, 8), 8);
        assert_eq!(ring_free(8, 0, 8), 0);
        assert_eq!(ring_entries(0, 1, 8), 8);
        assert_eq!(ring_free(0, 1, 8), 0);
        assert_eq!(frame_of(4096 * 3 + 256, 4096, 4), Some((3, 256)));
        assert_eq!(frame_of(4096 * 4, 4096, 4), None);
        assert_eq!(frame_of(u64::MAX, 4096, 4), None);
        let g = XskGeometry::DEFAULT;
        assert!(g.check().is_ok());
        assert_eq!(g.umem_len(), 8 << 20);
        assert_eq!(g.max_frame(), 3840);
        assert!(XskGeometry {
            frame_size: 1000,
            ..g
        }
        .check()
        .is_err());
        assert!(XskGeometry {
            rx_frames: 1000,
            ..g
        }
        .check()
        .is_err());
    }

    fn frame(tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14] = tag;
        f
    }

    /// Receives frames until one tagged `tag` (skipping the host's own traffic).
    fn recv_tag(rx: &mut XskRx, tag: u8) -> Vec<u8> {
        let t = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        while t.elapsed() < std::time::Duration::from_secs(3) {
            let n = rx.available();
            let mut found = None;
            for k in 0..n {
                if let XskRxFrame::Frame(len) = rx.read(k, &mut buf) {
                    if found.is_none() && buf[12..14] == [0x88, 0xb5] && buf[14] == tag {
                        found = Some(buf[..len].to_vec());
                    }
                }
            }
            rx.release(n);
            if let Some(f) = found {
                return f;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("frame {tag} never arrived");
    }

    #[test]
    fn veth_frames_both_ways_and_the_rings_hand_over() {
        let Some((_guard, a, b)) = Veth::new("fvx", "x", "AF_XDP") else {
            return;
        };
        let (sock, mut rx, mut tx) = XskSocket::open(&a, XskGeometry::DEFAULT).unwrap();
        assert!(!sock.zero_copy(), "veth has no zero-copy");
        let (peer, mut peer_ring) = AfPacket::open(&b, RingGeometry::DEFAULT).unwrap();
        assert_eq!(rx.posted(), XskGeometry::DEFAULT.rx_frames);
        // Wire -> us. (A veth just brought up refuses frames for a moment.)
        let f1 = frame(1);
        for _ in 0..200 {
            if peer.send_burst([&f1[..]]).sent == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(recv_tag(&mut rx, 1), f1);
        assert_eq!(rx.posted(), XskGeometry::DEFAULT.rx_frames);
        // Us -> wire.
        let f2 = frame(2);
        let mut sent = 0;
        for _ in 0..200 {
            sent = tx.send_burst([&f2[..]]).sent;
            if sent == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(sent, 1);
        let mut buf = [0u8; 2048];
        let t = std::time::Instant::now();
        loop {
            match peer_ring.next(&mut buf) {
                RxFrame::Frame(60) if buf[14] == 2 => break,
                RxFrame::Empty => std::thread::sleep(std::time::Duration::from_millis(1)),
                _ => {}
            }
            assert!(t.elapsed().as_secs() < 3, "frame 2 never arrived");
        }
        // Hand over: a second mapping from copies of the fds carries on exactly.
        let dup = |f: BorrowedFd<'_>| f.try_clone_to_owned().unwrap();
        let [x, u, p, m, pr, l] = sock.handover_fds();
        let fds = XskFds {
            xsk: dup(x),
            umem: dup(u),
            promisc: dup(p),
            map: dup(m),
            prog: dup(pr),
            link: dup(l),
        };
        let (sock2, mut rx2, mut tx2) =
            XskSocket::from_fds(fds, XskGeometry::DEFAULT, sock.ifindex(), sock.xdp_mode())
                .unwrap();
        // Ring positions that do not match, or a free list that does not add up, are refused,
        // each with its own error.
        let good = rx.position();
        let bad = XskRxPosition {
            rx_cons: good.rx_cons.wrapping_add(1),
            ..good
        };
        assert!(matches!(
            rx2.resume(bad),
            Err(ResumeError::RxIndices { given, .. }) if given == bad
        ));
        rx2.resume(good).unwrap();
        let mut bad = tx.position();
        bad.tx_prod = bad.tx_prod.wrapping_add(1);
        assert!(matches!(
            tx2.resume(&bad),
            Err(ResumeError::TxIndices { .. })
        ));
        let mut bad = tx.position();
        let lost = bad.free.pop().unwrap();
        let e = tx2.resume(&bad).unwrap_err();
        let want = ResumeError::TxFrames {
            free: bad.free.len(),
            outstanding: tx.outstanding(),
            tx_frames: XskGeometry::DEFAULT.tx_frames,
        };
        assert_eq!(e, want);
        bad.free.push(bad.free[0]);
        assert_eq!(tx2.resume(&bad), Err(ResumeError::FreeTwice(bad.free[0])));
        bad.free.pop();
        bad.free.push(lost);
        bad.free[0] = 0;
        assert!(matches!(
            tx2.resume(&bad),
            Err(ResumeError::NotTxFrame { frame: 0, .. })
        ));
        tx2.resume(&tx.position()).unwrap();
        assert_eq!(
            tx2.free_frames() as u32 + tx2.outstanding(),
            XskGeometry::DEFAULT.tx_frames
        );
        let f3 = frame(3);
        assert_eq!(peer.send_burst([&f3[..]]).sent, 1);
        assert_eq!(recv_tag(&mut rx2, 3), f3);
        assert_eq!(tx2.send_burst([&f2[..]]).sent, 1);
        // Roll-back: the first reader finds its place again from the rings.
        assert_eq!(rx.resync(), 0);
        assert_eq!(rx.position(), rx2.position());
        assert!(tx.resync());
        std::thread::sleep(std::time::Duration::from_millis(20));
        tx.reap();
        tx2.reap();
        assert_eq!(tx.free_frames(), tx2.free_frames());
        assert_eq!(tx.outstanding(), 0);
        let s = sock2.statistics().unwrap();
        assert_eq!(s.rx_invalid_descs + s.tx_invalid_descs, 0);
        // Not a valid device, not Ethernet.
        assert!(matches!(
            XskSocket::open("fvx-nosuchdev", XskGeometry::DEFAULT),
            Err(XskError::NoDevice(_))
        ));
        let e = XskSocket::open("lo", XskGeometry::DEFAULT).unwrap_err();
        assert!(matches!(e, XskError::NotEthernet(_, 772)), "{e}");
    }
}
