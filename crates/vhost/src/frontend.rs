//! The driver side of vhost-user: a "guest" in a process.
//!
//! [`Frontend`] connects to a vhost-user backend (ferrovs, DPDK's `net_vhost`, OVS), shares a
//! memfd as guest memory, negotiates features and places the rings there, exactly as QEMU or
//! DPDK's virtio-user would. [`TxQueue`] and [`RxQueue`] then play the virtio-net driver over
//! those rings. `ferrovs-gen` is built on it, and tests use it as a mock guest — including a
//! hostile one, since every ring field and descriptor is reachable through [`Frontend::ring`]
//! and [`Frontend::memory`].
//!
//! With `VIRTIO_F_RING_PACKED` in `want_features` (and offered by the backend) the queues
//! are packed rings (`crate::frontend_packed`), placed in the same layout (descriptor ring,
//! driver event structure at the split ring's available address, device event structure at
//! its used address); [`TxQueue::ring`]/[`RxQueue::ring`] then only give the size and memory.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use ferrovs_sys::guest::memory::{BufferArea, GuestMemory, RegionDesc};
use ferrovs_sys::guest::vring::{self, Descriptor, RingAddrs, SplitRing, VRING_DESC_F_WRITE};
use ferrovs_sys::os;

use crate::conn::{Conn, ConnError};
use crate::features::*;
use crate::frontend_packed::{PackedDriver, START_BASE};
use crate::msg::{self, payload, Code};
use ferrovs_sys::guest::packed::PackedRing;

/// Frontend-virtual base of our single memory region (any consistent value works).
const UADDR_BASE: u64 = 0x7f00_0000_0000;

/// How to set the device up.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    pub queue_pairs: usize,
    pub ring_size: u16,
    /// Bytes per packet buffer.
    pub buf_size: u32,
    /// Virtio features to ask for (intersected with what the backend offers).
    pub want_features: u64,
    /// Set the device up as the destination of a postcopy migration does: POSTCOPY_ADVISE
    /// (we get the backend's userfaultfd), POSTCOPY_LISTEN, then the memory table the
    /// postcopy way. Our memory file starts empty: every page we never write stays missing,
    /// and the backend's accesses to it arrive as faults that [`Frontend::serve_fault`]
    /// serves, as QEMU would.
    pub postcopy: bool,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            queue_pairs: 1,
            ring_size: 256,
            buf_size: 2048,
            want_features: VIRTIO_F_VERSION_1
                | VIRTIO_NET_F_MRG_RXBUF
                | VIRTIO_RING_F_EVENT_IDX
                | VIRTIO_RING_F_INDIRECT_DESC
                | VIRTIO_NET_F_MQ
                | VHOST_USER_F_PROTOCOL_FEATURES,
            postcopy: false,
        }
    }
}

/// Errors of the frontend.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("i/o")]
    Io(#[from] io::Error),
    #[error("connection")]
    Conn(#[from] ConnError),
    #[error("backend refused {0:?} (ack {1})")]
    Refused(Code, u64),
    #[error("backend sent a malformed reply to {0:?}")]
    BadReply(Code),
    #[error("backend offers {offered} queue pairs, {wanted} wanted")]
    TooFewQueues { offered: u64, wanted: usize },
    #[error("guest memory")]
    Memory(#[from] ferrovs_sys::guest::memory::MemoryError),
    #[error("ring")]
    Ring(#[from] ferrovs_sys::guest::vring::RingError),
    #[error("packet buffers")]
    Buffers(#[from] ferrovs_sys::guest::memory::ClaimError),
}

/// Layout of one queue in our memory.
#[derive(Debug, Clone, Copy)]
struct QueueLayout {
    desc: u64,
    avail: u64,
    used: u64,
    bufs: u64,
}

/// A connected frontend.
#[derive(Debug)]
pub struct Frontend {
    conn: Conn,
    mem: Arc<GuestMemory>,
    pub features: u64,
    pub protocol: u64,
    cfg: FrontendConfig,
    layouts: Vec<QueueLayout>,
    kicks: Vec<OwnedFd>,
    calls: Vec<OwnedFd>,
    /// Our guest-memory file (tests shrink it to play a hostile guest).
    mem_fd: OwnedFd,
    /// Postcopy: the backend's userfaultfd and its address of our region.
    postcopy: Option<(ferrovs_sys::guest::userfault::Userfault, u64)>,
    /// Live migration (source side): the dirty log we gave the backend.
    log: Option<Arc<ferrovs_sys::guest::dirty_log::DirtyLog>>,
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Frontend {
    /// Connects to the backend listening at `path`.
    pub fn connect(path: &std::path::Path, cfg: FrontendConfig) -> Result<Frontend, FrontendError> {
        let sock = UnixStream::connect(path)?;
        Frontend::over(sock, cfg)
    }

    /// Sets the device up over an already-connected socket (either side may have listened).
    pub fn over(sock: UnixStream, cfg: FrontendConfig) -> Result<Frontend, FrontendError> {
        let n = cfg.ring_size as u64;
        let nq = 2 * cfg.queue_pairs;
        let mut layouts = Vec::with_capacity(nq);
        let mut at = 0u64;
        for _ in 0..nq {
            let desc = at;
            let avail = desc + 16 * n;
            let used = align(avail + 6 + 2 * n, 4096);
            let bufs = align(used + 6 + 8 * n, 4096);
            at = align(bufs + n * cfg.buf_size as u64, 4096);
            layouts.push(QueueLayout {
                desc,
                avail,
                used,
                bufs,
            });
        }
        let size = align(at, 2 << 20);
        let fd = os::memfd("ferrovs-gen-guest", size, false)?;
        let region = RegionDesc {
            gpa: 0,
            size,
            uaddr: UADDR_BASE,
            mmap_offset: 0,
        };
        let mem = Arc::new(GuestMemory::map(vec![(region, fd.try_clone()?)])?);
        let mut fe = Frontend {
            conn: Conn::new(sock, false)?,
            mem,
            features: 0,
            protocol: 0,
            cfg,
            layouts,
            kicks: Vec::new(),
            calls: Vec::new(),
            mem_fd: fd.try_clone()?,
            postcopy: None,
            log: None,
        };
        fe.setup(region, fd)?;
        Ok(fe)
    }

    fn send(&mut self, code: Code, p: &[u8], fds: &[i32]) -> Result<(), FrontendError> {
        let ack = self.protocol & PROTOCOL_F_REPLY_ACK != 0 && !code.has_reply();
        let flags = if ack { msg::FLAG_NEED_REPLY } else { 0 };
        self.conn.send(&msg::encode(code as u32, flags, p), fds)?;
        if ack {
            let v = self.reply(code)?;
            if v != 0 {
                return Err(FrontendError::Refused(code, v));
            }
        }
        Ok(())
    }

    fn reply(&mut self, code: Code) -> Result<u64, FrontendError> {
        let (h, p, _) = self.conn.recv_blocking()?;
        if h.code != code as u32 || h.flags & msg::FLAG_REPLY == 0 || p.len() < 8 {
            return Err(FrontendError::BadReply(code));
        }
        Ok(u64::from_le_bytes(
            p[..8]
                .try_into()
                .map_err(|_| FrontendError::BadReply(code))?,
        ))
    }

    fn get(&mut self, code: Code) -> Result<u64, FrontendError> {
        self.conn.send(&msg::encode(code as u32, 0, &[]), &[])?;
        self.reply(code)
    }

    fn setup(&mut self, region: RegionDesc, fd: OwnedFd) -> Result<(), FrontendError> {
        let offered = self.get(Code::GetFeatures)?;
        self.features = offered & self.cfg.want_features;
        if self.features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let p = self.get(Code::GetProtocolFeatures)?;
            self.protocol = p
                & (PROTOCOL_F_MQ
                    | PROTOCOL_F_REPLY_ACK
                    | PROTOCOL_F_LOG_SHMFD
                    | PROTOCOL_F_RARP
                    | PROTOCOL_F_PAGEFAULT);
            self.send(Code::SetProtocolFeatures, &payload::u64(self.protocol), &[])?;
        }
        if self.cfg.queue_pairs > 1 {
            let q = if self.protocol & PROTOCOL_F_MQ != 0 {
                self.get(Code::GetQueueNum)?
            } else {
                1
            };
            if (q as usize) < self.cfg.queue_pairs {
                return Err(FrontendError::TooFewQueues {
                    offered: q,
                    wanted: self.cfg.queue_pairs,
                });
            }
        }
        self.send(Code::SetOwner, &[], &[])?;
        self.send(Code::SetFeatures, &payload::u64(self.features), &[])?;
        if self.cfg.postcopy {
            self.postcopy_mem_table(region, fd)?;
        } else {
            self.send(
                Code::SetMemTable,
                &payload::mem_table(&[region]),
                &[fd.as_raw_fd()],
            )?;
        }
        for q in 0..self.layouts.len() {
            let l = self.layouts[q];
            let n = self.cfg.ring_size as u32;
            self.send(Code::SetVringNum, &payload::state(q as u32, n), &[])?;
            let addrs = RingAddrs {
                desc: UADDR_BASE + l.desc,
                avail: UADDR_BASE + l.avail,
                used: UADDR_BASE + l.used,
            };
            self.send(Code::SetVringAddr, &payload::addr(q as u32, addrs), &[])?;
            let base = if self.features & VIRTIO_F_RING_PACKED != 0 {
                START_BASE
            } else {
                0
            };
            self.send(Code::SetVringBase, &payload::state(q as u32, base), &[])?;
            let call = os::eventfd()?;
            self.send(
                Code::SetVringCall,
                &payload::u64(q as u64),
                &[call.as_raw_fd()],
            )?;
            let kick = os::eventfd()?;
            self.send(
                Code::SetVringKick,
                &payload::u64(q as u64),
                &[kick.as_raw_fd()],
            )?;
            self.kicks.push(kick);
            self.calls.push(call);
        }
        if self.features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            for q in 0..self.layouts.len() {
                self.send(Code::SetVringEnable, &payload::state(q as u32, 1), &[])?;
            }
        }
        Ok(())
    }

    /// The postcopy set-up, as QEMU's destination does it: POSTCOPY_ADVISE (the reply
    /// carries the backend's userfaultfd), POSTCOPY_LISTEN, SET_MEM_TABLE answered with the
    /// backend's address of each region, and our ack of that answer.
    fn postcopy_mem_table(&mut self, region: RegionDesc, fd: OwnedFd) -> Result<(), FrontendError> {
        self.conn
            .send(&msg::encode(Code::PostcopyAdvise as u32, 0, &[]), &[])?;
        let (h, p, mut fds) = self.conn.recv_blocking()?;
        if h.code != Code::PostcopyAdvise as u32 || !p.is_empty() || fds.len() != 1 {
            return Err(FrontendError::BadReply(Code::PostcopyAdvise));
        }
        let uf = ferrovs_sys::guest::userfault::Userfault::from_fd(fds.remove(0));
        self.conn.send(
            &msg::encode(Code::PostcopyListen as u32, msg::FLAG_NEED_REPLY, &[]),
            &[],
        )?;
        let v = self.reply(Code::PostcopyListen)?;
        if v != 0 {
            return Err(FrontendError::Refused(Code::PostcopyListen, v));
        }
        let table = payload::mem_table(&[region]);
        self.conn.send(
            &msg::encode(Code::SetMemTable as u32, 0, &table),
            &[fd.as_raw_fd()],
        )?;
        let (h, p, _) = self.conn.recv_blocking()?;
        if h.code != Code::SetMemTable as u32 || p.len() != table.len() {
            return Err(FrontendError::BadReply(Code::SetMemTable));
        }
        let base = u64::from_le_bytes(
            p[24..32]
                .try_into()
                .map_err(|_| FrontendError::BadReply(Code::SetMemTable))?,
        );
        self.conn.send(
            &msg::encode(Code::SetMemTable as u32, 0, &payload::u64(0)),
            &[],
        )?;
        self.postcopy = Some((uf, base));
        Ok(())
    }

    /// Postcopy: serves one fault of the backend, if one is queued: "fetches" the page (here:
    /// writes it through our own mapping, which places it in the shared file, with `fill`
    /// choosing its bytes when we never wrote it) and wakes the backend. Returns the page's
    /// guest-physical address.
    pub fn serve_fault(&self) -> Result<Option<u64>, FrontendError> {
        let Some((uf, base)) = &self.postcopy else {
            return Ok(None);
        };
        let Some(addr) = uf.read_fault()? else {
            return Ok(None);
        };
        let page = (addr & !4095).wrapping_sub(*base);
        // Reading and writing back one byte makes the page exist with whatever it holds.
        let mut b = [0u8; 1];
        self.mem
            .read(page, &mut b)
            .map_err(|_| FrontendError::Io(io::Error::other("fault outside our memory")))?;
        self.mem
            .write(page, &b)
            .map_err(|_| FrontendError::Io(io::Error::other("fault outside our memory")))?;
        uf.wake(addr & !4095, 4096)?;
        Ok(Some(page))
    }

    /// The postcopy userfaultfd (to wait on it).
    pub fn userfault(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.postcopy.as_ref().map(|(u, _)| u.fd())
    }

    /// POSTCOPY_END: every page has arrived.
    pub fn postcopy_end(&mut self) -> Result<(), FrontendError> {
        self.conn.send(
            &msg::encode(Code::PostcopyEnd as u32, msg::FLAG_NEED_REPLY, &[]),
            &[],
        )?;
        let v = self.reply(Code::PostcopyEnd)?;
        if v != 0 {
            return Err(FrontendError::Refused(Code::PostcopyEnd, v));
        }
        self.postcopy = None;
        Ok(())
    }

    /// Starts a live migration's dirty logging, as QEMU does: SET_LOG_BASE with a shared log
    /// sized for our memory (answered), SET_FEATURES with VHOST_F_LOG_ALL, and each ring's
    /// used address for the log. Returns our view of the log.
    pub fn start_logging(
        &mut self,
    ) -> Result<Arc<ferrovs_sys::guest::dirty_log::DirtyLog>, FrontendError> {
        let pages = self
            .mem
            .regions()
            .map(|r| r.gpa + r.size)
            .max()
            .unwrap_or(0)
            / 4096;
        let size = pages.div_ceil(64) * 8;
        let fd = os::memfd("ferrovs-gen-log", size, false)?;
        self.conn.send(
            &msg::encode(Code::SetLogBase as u32, 0, &payload::log(size, 0)),
            &[fd.as_raw_fd()],
        )?;
        let (h, p, _) = self.conn.recv_blocking()?;
        if h.code != Code::SetLogBase as u32 || !p.is_empty() {
            return Err(FrontendError::BadReply(Code::SetLogBase));
        }
        let log = Arc::new(
            ferrovs_sys::guest::dirty_log::DirtyLog::map(fd, size, 0)
                .map_err(|e| FrontendError::Io(io::Error::other(e.to_string())))?,
        );
        self.set_logging(true)?;
        self.log = Some(log.clone());
        Ok(log)
    }

    /// Stops dirty logging (the migration ended or was cancelled).
    pub fn stop_logging(&mut self) -> Result<(), FrontendError> {
        self.set_logging(false)?;
        self.log = None;
        Ok(())
    }

    fn set_logging(&mut self, on: bool) -> Result<(), FrontendError> {
        let f = if on {
            self.features | VHOST_F_LOG_ALL
        } else {
            self.features
        };
        self.send(Code::SetFeatures, &payload::u64(f), &[])?;
        for q in 0..self.layouts.len() {
            let l = self.layouts[q];
            let addrs = RingAddrs {
                desc: UADDR_BASE + l.desc,
                avail: UADDR_BASE + l.avail,
                used: UADDR_BASE + l.used,
            };
            let log = on.then_some(l.used);
            self.send(
                Code::SetVringAddr,
                &payload::addr_logged(q as u32, addrs, log),
                &[],
            )?;
        }
        Ok(())
    }

    /// Guest-physical ranges of queue `q`'s used ring and of its packet buffers.
    pub fn queue_areas(&self, q: usize) -> ((u64, u64), (u64, u64)) {
        let l = self.layouts[q];
        let n = u64::from(self.cfg.ring_size);
        (
            (l.used, 6 + 8 * n),
            (l.bufs, n * u64::from(self.cfg.buf_size)),
        )
    }

    /// SEND_RARP: asks the backend to announce `mac` (what QEMU does after a migration for a
    /// guest without GUEST_ANNOUNCE).
    pub fn send_rarp(&mut self, mac: [u8; 6]) -> Result<(), FrontendError> {
        let mut p = [0u8; 8];
        p[..6].copy_from_slice(&mac);
        self.send(Code::SendRarp, &p, &[])
    }

    /// Our view of the guest memory.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.mem
    }

    /// Direct access to queue `q`'s ring (for tests that misbehave on purpose).
    pub fn ring(&self, q: usize) -> Result<SplitRing, FrontendError> {
        let l = self.layouts[q];
        let addrs = RingAddrs {
            desc: UADDR_BASE + l.desc,
            avail: UADDR_BASE + l.avail,
            used: UADDR_BASE + l.used,
        };
        Ok(SplitRing::new(
            self.mem.clone(),
            addrs,
            self.cfg.ring_size as u32,
        )?)
    }

    /// Sends a raw message and returns the raw reply if one arrives (tests of bad input).
    pub fn raw_request(&mut self, bytes: &[u8], fds: &[i32]) -> Result<(), FrontendError> {
        self.conn.send(bytes, fds)?;
        Ok(())
    }

    /// Sends a raw message and waits for the backend's answer (tests of bad input that
    /// expect one).
    pub fn call_raw(
        &mut self,
        bytes: &[u8],
        fds: &[i32],
    ) -> Result<(msg::Header, Vec<u8>, Vec<OwnedFd>), FrontendError> {
        self.conn.send(bytes, fds)?;
        Ok(self.conn.recv_blocking()?)
    }

    /// GET_VRING_BASE: stops queue `q` in the backend and returns its last_avail_idx.
    pub fn get_vring_base(&mut self, q: u32) -> Result<u32, FrontendError> {
        self.conn.send(
            &msg::encode(Code::GetVringBase as u32, 0, &payload::state(q, 0)),
            &[],
        )?;
        let (h, p, _) = self.conn.recv_blocking()?;
        if h.code != Code::GetVringBase as u32 || p.len() != 8 {
            return Err(FrontendError::BadReply(Code::GetVringBase));
        }
        Ok(u32::from_le_bytes([p[4], p[5], p[6], p[7]]))
    }

    /// Whether the queues are packed rings (negotiated `VIRTIO_F_RING_PACKED`).
    pub fn packed(&self) -> bool {
        self.features & VIRTIO_F_RING_PACKED != 0
    }

    /// Queue `q` as a packed ring, when negotiated.
    fn packed_ring(&self, q: usize) -> Result<Option<PackedRing>, FrontendError> {
        if !self.packed() {
            return Ok(None);
        }
        let l = self.layouts[q];
        let addrs = RingAddrs {
            desc: UADDR_BASE + l.desc,
            avail: UADDR_BASE + l.avail,
            used: UADDR_BASE + l.used,
        };
        Ok(Some(PackedRing::new(
            self.mem.clone(),
            addrs,
            self.cfg.ring_size as u32,
        )?))
    }

    /// Driver for guest TX queue of pair `pair`.
    pub fn tx_queue(&self, pair: usize) -> Result<TxQueue, FrontendError> {
        let q = 2 * pair + 1;
        TxQueue::new(
            self.ring(q)?,
            self.layouts[q].bufs,
            self.cfg.buf_size,
            self.features,
            self.kicks[q].try_clone()?,
            self.packed_ring(q)?,
        )
    }

    /// Driver for guest RX queue of pair `pair`; posts every buffer.
    pub fn rx_queue(&self, pair: usize) -> Result<RxQueue, FrontendError> {
        let q = 2 * pair;
        RxQueue::new(
            self.ring(q)?,
            self.layouts[q].bufs,
            self.cfg.buf_size,
            self.features,
            self.kicks[q].try_clone()?,
            self.packed_ring(q)?,
        )
    }

    /// The call (interrupt) eventfd of virtqueue `q`, for a driver that waits on it.
    pub fn call_fd(&self, q: usize) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.calls.get(q).map(|c| c.as_fd())
    }

    pub fn config(&self) -> &FrontendConfig {
        &self.cfg
    }

    /// Replaces the kick (driver-to-device notification) fd of queue `q` (tests: a pipe). The
    /// queue handles from [`Frontend::tx_queue`] / [`Frontend::rx_queue`] still kick the old
    /// eventfd, which the backend no longer watches: the caller notifies through `fd`'s peer.
    pub fn set_kick_fd(
        &mut self,
        q: u32,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), FrontendError> {
        self.set_vring_fd(Code::SetVringKick, q, fd)
    }

    /// Replaces the call (guest-interrupt) fd of queue `q` (tests: a pipe nobody reads).
    pub fn set_call_fd(
        &mut self,
        q: u32,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), FrontendError> {
        self.set_vring_fd(Code::SetVringCall, q, fd)
    }

    /// SET_VRING_KICK / SET_VRING_CALL for queue `q` with `fd`.
    fn set_vring_fd(
        &mut self,
        code: Code,
        q: u32,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), FrontendError> {
        self.send(code, &payload::u64(q as u64), &[fd.as_raw_fd()])
    }

    /// Truncates the guest-memory file to `len` bytes under the backend's mapping (tests:
    /// a hostile guest). Our own accesses past `len` then fault too.
    pub fn truncate_memory(&self, len: u64) -> Result<(), FrontendError> {
        Ok(os::truncate(self.mem_fd.as_fd(), len)?)
    }

    /// Whether the backend closed the connection (a non-blocking peek).
    pub fn peer_closed(&self) -> bool {
        os::peer_closed(self.conn.socket())
    }
}

fn kick_if_needed(ring: &SplitRing, features: u64, kick: &OwnedFd, old: u16, new: u16) {
    vring::fence();
    let want = if features & VIRTIO_RING_F_EVENT_IDX != 0 {
        vring::need_event(ring.avail_event(), new, old)
    } else {
        ring.used_flags() & vring::VRING_USED_F_NO_NOTIFY == 0
    };
    if want {
        let _ = os::notify(kick.as_fd());
    }
}

/// Guest transmit side: packets go to the backend.
#[derive(Debug)]
pub struct TxQueue {
    ring: SplitRing,
    /// One buffer per descriptor id, built in place.
    bufs: BufferArea,
    hdr_len: usize,
    features: u64,
    kick: OwnedFd,
    /// Free descriptor ids, reused in FIFO order so the backend sees ids in ring order (as
    /// in-order drivers produce them: sequential descriptor reads).
    free: std::collections::VecDeque<u16>,
    avail_idx: u16,
    used_seen: u16,
    /// The ring is packed: this drives it (`ring` then only gives size and memory).
    packed: Option<PackedDriver>,
}

impl TxQueue {
    fn new(
        ring: SplitRing,
        bufs: u64,
        buf_size: u32,
        features: u64,
        kick: OwnedFd,
        packed: Option<PackedRing>,
    ) -> Result<TxQueue, FrontendError> {
        let bufs = ring
            .mem()
            .claim_buffers(bufs, buf_size as usize, ring.size() as usize)?;
        let n = ring.size();
        let packed = packed.map(|r| PackedDriver::new(r, false));
        if packed.is_some() {
            // The split ring's fields are not there: nothing to set.
        } else if features & VIRTIO_RING_F_EVENT_IDX != 0 {
            ring.set_used_event(u16::MAX / 2);
        } else {
            ring.set_avail_flags(vring::VRING_AVAIL_F_NO_INTERRUPT);
        }
        Ok(TxQueue {
            ring,
            bufs,
            hdr_len: net_hdr_len(features),
            features,
            kick,
            free: (0..n).collect(),
            avail_idx: 0,
            used_seen: 0,
            packed,
        })
    }

    /// Reclaims buffers the backend has consumed; returns how many.
    #[inline]
    pub fn reclaim(&mut self) -> usize {
        if let Some(p) = &mut self.packed {
            let mut n = 0;
            let size = p.ring.size();
            let free = &mut self.free;
            while let Some(k) = p.take_used_batch(|id| {
                if id < size {
                    free.push_back(id);
                }
            }) {
                n += k;
            }
            return n;
        }
        let used = self.ring.used_idx();
        let n = used.wrapping_sub(self.used_seen);
        for i in 0..n {
            let (id, _) = self.ring.read_used(self.used_seen.wrapping_add(i));
            if (id as u16) < self.ring.size() {
                self.free.push_back(id as u16);
            }
        }
        self.used_seen = used;
        if self.features & VIRTIO_RING_F_EVENT_IDX != 0 {
            self.ring
                .set_used_event(used.wrapping_sub(1).wrapping_add(u16::MAX / 2));
        }
        n as usize
    }

    /// Free slots.
    pub fn room(&self) -> usize {
        self.free.len()
    }

    /// Queues packets produced by `fill(i, buf) -> len` (buf excludes the virtio-net header)
    /// for up to `max` packets; publishes them at once. Returns how many were queued.
    #[inline]
    pub fn send_with(
        &mut self,
        max: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> usize,
    ) -> usize {
        let old = self.avail_idx;
        let hdr_len = self.hdr_len;
        let mut n = 0;
        let mut batch = [(0u64, 0u32, 0u16); 64];
        while n < max {
            if self.packed.is_some() && n == batch.len() {
                break;
            }
            let Some(id) = self.free.pop_front() else {
                break;
            };
            let buf = self.bufs.slot_mut(id as usize);
            let (hdr, body) = buf.split_at_mut(hdr_len);
            hdr.fill(0);
            let len = fill(n, body).min(body.len());
            if self.packed.is_some() {
                batch[n] = (self.bufs.gpa(id as usize), (hdr_len + len) as u32, id);
                n += 1;
                continue;
            }
            self.ring.write_desc(
                id,
                Descriptor {
                    addr: self.bufs.gpa(id as usize),
                    len: (hdr_len + len) as u32,
                    flags: 0,
                    next: 0,
                },
            );
            self.ring.write_avail_entry(self.avail_idx, id);
            self.avail_idx = self.avail_idx.wrapping_add(1);
            n += 1;
        }
        if let (Some(p), true) = (&mut self.packed, n > 0) {
            let old = p.post(&batch[..n], false);
            p.kick_if_needed(&self.kick, old);
            return n;
        }
        if n > 0 {
            self.ring.publish_avail(self.avail_idx);
            kick_if_needed(&self.ring, self.features, &self.kick, old, self.avail_idx);
        }
        n
    }

    /// Sends one packet behind a virtio-net header carrying `hdr` (offload tests: a partial
    /// checksum, a TSO packet); false when the ring is full or the packet does not fit a
    /// buffer.
    pub fn send_offload(&mut self, pkt: &[u8], hdr: &ferrovs_sys::kernel::vnet::VnetHdr) -> bool {
        self.reclaim();
        let Some(id) = self.free.front().copied() else {
            return false;
        };
        let hdr_len = self.hdr_len;
        let buf = self.bufs.slot_mut(id as usize);
        if buf.len() < hdr_len + pkt.len() {
            return false;
        }
        buf[..ferrovs_sys::kernel::vnet::HDR_LEN].copy_from_slice(&hdr.to_bytes());
        buf[ferrovs_sys::kernel::vnet::HDR_LEN..hdr_len].fill(0);
        buf[hdr_len..hdr_len + pkt.len()].copy_from_slice(pkt);
        self.free.pop_front();
        if let Some(p) = &mut self.packed {
            let b = (self.bufs.gpa(id as usize), (hdr_len + pkt.len()) as u32, id);
            let old = p.post(&[b], false);
            p.kick_if_needed(&self.kick, old);
            return true;
        }
        let old = self.avail_idx;
        self.ring.write_desc(
            id,
            Descriptor {
                addr: self.bufs.gpa(id as usize),
                len: (hdr_len + pkt.len()) as u32,
                flags: 0,
                next: 0,
            },
        );
        self.ring.write_avail_entry(self.avail_idx, id);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.ring.publish_avail(self.avail_idx);
        kick_if_needed(&self.ring, self.features, &self.kick, old, self.avail_idx);
        true
    }

    /// Sends one packet (convenience for tests); false when the ring is full.
    pub fn send(&mut self, pkt: &[u8]) -> bool {
        self.reclaim();
        self.send_with(1, |_, b| {
            b[..pkt.len()].copy_from_slice(pkt);
            pkt.len()
        }) == 1
    }

    /// The ring, for tests that corrupt it on purpose.
    pub fn ring(&self) -> &SplitRing {
        &self.ring
    }

    /// Publishes a raw available entry (tests: hostile chains).
    pub fn publish_raw(&mut self, head: u16) {
        self.ring.write_avail_entry(self.avail_idx, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.ring.publish_avail(self.avail_idx);
    }
}

/// Guest receive side: packets come from the backend.
#[derive(Debug)]
pub struct RxQueue {
    ring: SplitRing,
    /// One buffer per descriptor id, read in place.
    bufs: BufferArea,
    hdr_len: usize,
    features: u64,
    kick: OwnedFd,
    avail_idx: u16,
    used_seen: u16,
    /// Interrupt-driven: asks for a notification on the next used entry (else polling: asks
    /// for none).
    interrupts: bool,
    /// Malformed completions seen (bad id or length from the backend).
    pub errors: u64,
    /// The ring is packed: this drives it (`ring` then only gives size and memory).
    packed: Option<PackedDriver>,
}

impl RxQueue {
    /// Switches between polling (no notifications wanted; the default) and interrupts (a
    /// notification for the next used entry, as a NAPI driver re-arms after each poll).
    pub fn set_interrupts(&mut self, on: bool) {
        self.interrupts = on;
        self.arm();
    }

    fn arm(&self) {
        if let Some(p) = &self.packed {
            p.set_interrupts(self.interrupts);
            return;
        }
        let event_idx = self.features & VIRTIO_RING_F_EVENT_IDX != 0;
        match (event_idx, self.interrupts) {
            (true, true) => self.ring.set_used_event(self.used_seen),
            (true, false) => self
                .ring
                .set_used_event(self.used_seen.wrapping_add(u16::MAX / 2)),
            (false, true) => self.ring.set_avail_flags(0),
            (false, false) => self.ring.set_avail_flags(vring::VRING_AVAIL_F_NO_INTERRUPT),
        }
    }

    fn new(
        ring: SplitRing,
        bufs: u64,
        buf_size: u32,
        features: u64,
        kick: OwnedFd,
        packed: Option<PackedRing>,
    ) -> Result<RxQueue, FrontendError> {
        let bufs = ring
            .mem()
            .claim_buffers(bufs, buf_size as usize, ring.size() as usize)?;
        if let Some(p) = packed {
            let mut p = PackedDriver::new(p, false);
            let all: Vec<_> = (0..ring.size())
                .map(|id| (bufs.gpa(id as usize), bufs.slot_size() as u32, id))
                .collect();
            p.post(&all, true);
            return Ok(RxQueue {
                ring,
                bufs,
                hdr_len: net_hdr_len(features),
                features,
                kick,
                avail_idx: 0,
                used_seen: 0,
                interrupts: false,
                errors: 0,
                packed: Some(p),
            });
        }
        if features & VIRTIO_RING_F_EVENT_IDX != 0 {
            ring.set_used_event(u16::MAX / 2);
        } else {
            ring.set_avail_flags(vring::VRING_AVAIL_F_NO_INTERRUPT);
        }
        let mut q = RxQueue {
            ring,
            bufs,
            hdr_len: net_hdr_len(features),
            features,
            kick,
            avail_idx: 0,
            used_seen: 0,
            interrupts: false,
            errors: 0,
            packed: None,
        };
        for id in 0..q.ring.size() {
            q.post(id);
        }
        q.ring.publish_avail(q.avail_idx);
        Ok(q)
    }

    fn post(&mut self, id: u16) {
        self.ring.write_desc(
            id,
            Descriptor {
                addr: self.bufs.gpa(id as usize),
                len: self.bufs.slot_size() as u32,
                flags: VRING_DESC_F_WRITE,
                next: 0,
            },
        );
        self.ring.write_avail_entry(self.avail_idx, id);
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Receives up to `max` packets, calling `f(packet_without_header)` for each, and
    /// re-posts their buffers. Returns how many.
    #[inline]
    pub fn recv_with(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        self.recv_with_hdr(max, |_, p| f(p))
    }

    /// As [`RxQueue::recv_with`], with each packet's virtio-net header (its offload part).
    #[inline]
    pub fn recv_with_hdr(
        &mut self,
        max: usize,
        mut f: impl FnMut(ferrovs_sys::kernel::vnet::VnetHdr, &[u8]),
    ) -> usize {
        if self.packed.is_some() {
            return self.recv_packed(max, f);
        }
        let used = self.ring.used_idx();
        let n = (used.wrapping_sub(self.used_seen) as usize).min(max);
        if n == 0 {
            return 0;
        }
        let old = self.avail_idx;
        for i in 0..n {
            let (id, len) = self.ring.read_used(self.used_seen.wrapping_add(i as u16));
            let len = len as usize;
            if id as u16 >= self.ring.size() || len < self.hdr_len || len > self.bufs.slot_size() {
                self.errors += 1;
                if (id as u16) < self.ring.size() {
                    self.post(id as u16);
                }
                continue;
            }
            let slot = self.bufs.slot(id as usize);
            let mut h = [0u8; ferrovs_sys::kernel::vnet::HDR_LEN];
            h.copy_from_slice(&slot[..ferrovs_sys::kernel::vnet::HDR_LEN]);
            f(
                ferrovs_sys::kernel::vnet::VnetHdr::from_bytes(&h),
                &slot[self.hdr_len..len],
            );
            self.post(id as u16);
        }
        self.used_seen = self.used_seen.wrapping_add(n as u16);
        if self.features & VIRTIO_RING_F_EVENT_IDX != 0 {
            self.arm();
        }
        self.ring.publish_avail(self.avail_idx);
        kick_if_needed(&self.ring, self.features, &self.kick, old, self.avail_idx);
        n
    }

    pub fn ring(&self) -> &SplitRing {
        &self.ring
    }

    /// [`RxQueue::recv_with_hdr`] on a packed ring: each used buffer is re-posted at once.
    fn recv_packed(
        &mut self,
        max: usize,
        mut f: impl FnMut(ferrovs_sys::kernel::vnet::VnetHdr, &[u8]),
    ) -> usize {
        let Some(p) = &mut self.packed else { return 0 };
        let size = p.ring.size();
        let mut repost = [(0u64, 0u32, 0u16); 64];
        let mut n = 0;
        // Bounded however the backend writes the ring: at most one lap per call.
        for _ in 0..size {
            if n == max.min(repost.len()) {
                break;
            }
            let Some((id, len)) = p.take_used() else {
                break;
            };
            let len = len as usize;
            if id >= size {
                // Not ours to re-post: the slot's buffer is lost to this driver.
                self.errors += 1;
                continue;
            }
            if len < self.hdr_len || len > self.bufs.slot_size() {
                self.errors += 1;
            } else {
                let slot = self.bufs.slot(id as usize);
                let mut h = [0u8; ferrovs_sys::kernel::vnet::HDR_LEN];
                h.copy_from_slice(&slot[..ferrovs_sys::kernel::vnet::HDR_LEN]);
                f(
                    ferrovs_sys::kernel::vnet::VnetHdr::from_bytes(&h),
                    &slot[self.hdr_len..len],
                );
            }
            repost[n] = (self.bufs.gpa(id as usize), self.bufs.slot_size() as u32, id);
            n += 1;
        }
        if n > 0 {
            let old = p.post(&repost[..n], true);
            p.kick_if_needed(&self.kick, old);
        }
        n
    }
}
