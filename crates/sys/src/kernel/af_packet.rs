//! AF_PACKET uplinks: an existing netdev as a port.
//!
//! Receive: a TPACKET_V3 ring ([`RxRing`]) mapped from the socket. The kernel fills blocks
//! of frames in order and hands a block to us by setting `TP_STATUS_USER` in its header when
//! it is full or when it has been open for [`RETIRE_BLOCK_MS`] (so a lone packet waits at
//! most that long); we copy frames out and give the block back with `TP_STATUS_KERNEL`.
//! Polling an empty ring costs one atomic load, no system call.
//!
//! Transmit: `sendmmsg(2)` of up to [`TX_BATCH`] frames per call on the bound socket (one
//! system call per burst, no TX ring to manage: the kernel copies each frame into an skb, as
//! it would from a TPACKET TX ring, and the PMD never waits on ring slots).
//!
//! The socket is bound to one ifindex with `ETH_P_ALL`, joined to the device in promiscuous
//! mode (a per-socket membership, undone by the kernel when the socket closes) and, where
//! the kernel has it (4.20+), set to `PACKET_IGNORE_OUTGOING` so that what we (or the host)
//! send on the device does not come back to us. Frames marked `PACKET_OUTGOING` are skipped
//! on older kernels too. The kernel moves 802.1Q tags into metadata on receive; the ring
//! reader puts them back in the frame.
//!
//! Hot upgrade: a ring can be set only once per socket, but any process holding the socket
//! may map it: the new daemon receives the fd, maps the same ring ([`AfPacket::from_fd`])
//! and carries on from the position the old daemon stopped at ([`RxRing::position`]).
//!
//! Safety: the ring is memory the kernel writes while a block is kernel-owned. A block's
//! contents are read only after an Acquire load saw `TP_STATUS_USER` (the kernel does not
//! touch a user block) and are copied out with raw copies; every offset read from the ring
//! is checked against the block before use, so even a corrupt ring cannot move a read
//! outside the mapping.
//!
//! Thread-safety: [`AfPacket::send_burst`] may be called from any number of threads (one
//! system call each); an [`RxRing`] has one reader at a time (`&mut self`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::kernel::netdev::{self, TxFail};
use crate::kernel::vnet::{self, VnetHdr};
use crate::mmap::Mmap;
use crate::os::{getopt, setopt};

/// How long the kernel keeps a block open before handing it over partly filled.
pub const RETIRE_BLOCK_MS: u32 = 1;
/// Most frames one `sendmmsg` carries.
pub const TX_BATCH: usize = 64;

/// `struct tpacket3_hdr`, aligned to 16 bytes: where the `sockaddr_ll` of a frame starts.
const HDR3_LEN: usize = 48;
/// Frame header plus its `sockaddr_ll`.
const HDR3_TOTAL: usize = HDR3_LEN + std::mem::size_of::<libc::sockaddr_ll>();
/// Block descriptor fields (`struct tpacket_block_desc`).
const BLK_STATUS: usize = 8;
const BLK_NUM_PKTS: usize = 12;
const BLK_FIRST: usize = 16;
const BLK_SEQ: usize = 24;
const BLK_DESC_LEN: usize = 48;

/// Shape of an RX ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RingGeometry {
    /// Bytes per block (a multiple of the page size; bounds the largest frame).
    pub block_size: u32,
    pub block_nr: u32,
    /// Nominal frame slot (TPACKET_V3 packs frames tightly; this only sizes `tp_frame_nr`).
    pub frame_size: u32,
}

impl RingGeometry {
    /// 32 blocks of 128 KiB (4 MiB): about 1000 minimum-size frames per block.
    pub const DEFAULT: RingGeometry = RingGeometry {
        block_size: 128 << 10,
        block_nr: 32,
        frame_size: 2048,
    };

    /// Bytes of the whole ring.
    pub fn len(&self) -> usize {
        self.block_size as usize * self.block_nr as usize
    }

    /// Whether the ring has no blocks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check(&self) -> Result<(), String> {
        let ok = self.block_size >= 4096
            && self.block_size.is_multiple_of(4096)
            && self.block_size <= 4 << 20
            && (1..=1024).contains(&self.block_nr)
            && self.frame_size >= 128
            && self.frame_size.is_multiple_of(16)
            && self.frame_size <= self.block_size;
        if ok {
            Ok(())
        } else {
            Err(format!("ring geometry {self:?} is invalid"))
        }
    }
}

/// Why a handed-over [`RingPosition`] was refused (it comes from another process: untrusted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error("ring position block {block} outside a ring of {blocks} blocks")]
    BlockOutside { block: u32, blocks: u32 },
}

/// Where a reader is in the ring: the block it reads and how many frames of it it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RingPosition {
    pub block: u32,
    pub taken: u32,
}

/// Why an uplink could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AfPacketError {
    #[error(transparent)]
    Name(#[from] netdev::NameError),
    #[error("no network device named {0}")]
    NoDevice(String),
    #[error("{name}: cannot {what}")]
    Setup {
        name: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("handed-over fd is not a TPACKET_V3 AF_PACKET socket with a ring ({0})")]
    BadFd(String),
}

/// A packet socket bound to one netdev.
#[derive(Debug)]
pub struct AfPacket {
    fd: OwnedFd,
    ifindex: u32,
    ignore_outgoing: bool,
    /// `PACKET_VNET_HDR`: a virtio-net header precedes every frame, both ways.
    vnet: bool,
}

/// What one [`AfPacket::send_burst`] came to, frame by frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendReport {
    pub sent: usize,
    pub bytes: u64,
    /// No room in the kernel (EAGAIN, ENOBUFS).
    pub full: usize,
    /// The device is down or gone (see [`TxFail::LinkDown`]).
    pub link_down: usize,
    /// Larger than the device's MTU (EMSGSIZE).
    pub oversize: usize,
    /// Any other error.
    pub errors: usize,
}

impl AfPacket {
    /// Attaches to the existing netdev `name`: a non-blocking packet socket with a
    /// TPACKET_V3 RX ring of `geo`, bound to the device, promiscuous, and the device up.
    pub fn open(name: &str, geo: RingGeometry) -> Result<(AfPacket, RxRing), AfPacketError> {
        netdev::check_name(name)?;
        geo.check().map_err(|e| AfPacketError::Setup {
            name: name.into(),
            what: "size the ring",
            source: io::Error::new(io::ErrorKind::InvalidInput, e),
        })?;
        let setup = |what| {
            move |source| AfPacketError::Setup {
                name: name.into(),
                what,
                source,
            }
        };
        let ifindex = match netdev::ifindex(name) {
            Ok(i) => i,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(AfPacketError::NoDevice(name.into()))
            }
            Err(e) => return Err(setup("look up the device")(e)),
        };
        // Protocol 0: receive nothing until bound to the device.
        // SAFETY: plain syscall; the returned fd is owned by us.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(setup("open an AF_PACKET socket")(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is fresh and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let v3 = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, &v3)
            .map_err(setup("select TPACKET_V3"))?;
        let ignore_outgoing = setopt(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1 as &libc::c_int,
        )
        .is_ok();
        // Before the ring (the kernel refuses it after): the kernel then tells us, per frame,
        // of a partial checksum or a GSO packet it hands over as is (what a local sender or
        // GRO made, up to 64 KiB), instead of leaving a pseudo-header sum where the checksum
        // should be.
        let vnet = setopt(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            &1 as &libc::c_int,
        )
        .is_ok();
        let req = libc::tpacket_req3 {
            tp_block_size: geo.block_size,
            tp_block_nr: geo.block_nr,
            tp_frame_size: geo.frame_size,
            tp_frame_nr: geo.block_size / geo.frame_size * geo.block_nr,
            tp_retire_blk_tov: RETIRE_BLOCK_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
            .map_err(setup("set up the RX ring"))?;
        let map = Mmap::map_shared(fd.as_fd(), geo.len(), 0).map_err(setup("map the RX ring"))?;
        // SAFETY: a zeroed sockaddr_ll is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as libc::c_ushort;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `sll` is a valid sockaddr_ll of the length passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(setup("bind to the device")(io::Error::last_os_error()));
        }
        netdev::join_promiscuous(fd.as_fd(), ifindex).map_err(setup("enter promiscuous mode"))?;
        netdev::set_up(name).map_err(setup("bring the device up"))?;
        let sock = AfPacket {
            fd,
            ifindex,
            ignore_outgoing,
            vnet,
        };
        Ok((sock, RxRing::new(map, geo, vnet)))
    }

    /// Adopts a socket handed over by another daemon and maps its ring (which must have
    /// shape `geo`); the reader starts at block 0 until told where the old one stopped.
    pub fn from_fd(fd: OwnedFd, geo: RingGeometry) -> Result<(AfPacket, RxRing), AfPacketError> {
        let bad = |what: &str, e: io::Error| AfPacketError::BadFd(format!("{what}: {e}"));
        geo.check()
            .map_err(|e| AfPacketError::BadFd(e.to_string()))?;
        let domain = getopt(
            fd.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            0 as libc::c_int,
        )
        .map_err(|e| bad("SO_DOMAIN", e))?;
        if domain != libc::AF_PACKET {
            return Err(AfPacketError::BadFd(format!("socket domain {domain}")));
        }
        let version = getopt(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            0 as libc::c_int,
        )
        .map_err(|e| bad("PACKET_VERSION", e))?;
        if version != libc::tpacket_versions::TPACKET_V3 as libc::c_int {
            return Err(AfPacketError::BadFd(format!("TPACKET version {version}")));
        }
        let ignore_outgoing = getopt(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            0 as libc::c_int,
        )
        .is_ok_and(|v| v != 0);
        // Sockets of daemons older than PACKET_VNET_HDR support have none: read, not assumed.
        let vnet = getopt(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            0 as libc::c_int,
        )
        .is_ok_and(|v| v != 0);
        // SAFETY: a zeroed sockaddr_ll is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `sll`/`len` are valid out-parameters of the size passed.
        let r = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                (&mut sll as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(bad("getsockname", io::Error::last_os_error()));
        }
        crate::os::set_nonblocking(fd.as_fd(), true).map_err(|e| bad("O_NONBLOCK", e))?;
        // The kernel refuses a mapping whose size is not exactly the ring's.
        let map =
            Mmap::map_shared(fd.as_fd(), geo.len(), 0).map_err(|e| bad("mapping the ring", e))?;
        let sock = AfPacket {
            fd,
            ifindex: sll.sll_ifindex.max(0) as u32,
            ignore_outgoing,
            vnet,
        };
        Ok((sock, RxRing::new(map, geo, vnet)))
    }

    /// The bound device's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Whether frames carry a virtio-net header (`PACKET_VNET_HDR`).
    pub fn vnet_hdr(&self) -> bool {
        self.vnet
    }

    /// Whether the kernel filters our own transmissions (`PACKET_IGNORE_OUTGOING`).
    pub fn ignores_outgoing(&self) -> bool {
        self.ignore_outgoing
    }

    /// Sends every frame of `pkts` on the device, [`TX_BATCH`] per system call; a frame the
    /// kernel refuses is counted in the report by reason, never retried.
    pub fn send_burst<'a, I>(&self, pkts: I) -> SendReport
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        // With PACKET_VNET_HDR every frame starts with a header: an empty one (frames sent
        // here are complete: the datapath did checksums and segmentation).
        static NO_OFFLOAD: [u8; vnet::HDR_LEN] = [0; vnet::HDR_LEN];
        let hdr = libc::iovec {
            iov_base: NO_OFFLOAD.as_ptr() as *mut _,
            iov_len: vnet::HDR_LEN,
        };
        let per = if self.vnet { 2 } else { 1 };
        let mut rep = SendReport::default();
        let mut pkts = pkts.into_iter();
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2 * TX_BATCH];
        // SAFETY: an all-zero mmsghdr (null pointers, zero lengths) is a valid value.
        let mut msgs: [libc::mmsghdr; TX_BATCH] = unsafe { std::mem::zeroed() };
        loop {
            let mut n = 0;
            for p in pkts.by_ref().take(TX_BATCH) {
                if per == 2 {
                    iov[2 * n] = hdr;
                }
                iov[per * n + per - 1] = libc::iovec {
                    iov_base: p.as_ptr() as *mut _,
                    iov_len: p.len(),
                };
                n += 1;
            }
            if n == 0 {
                return rep;
            }
            for (m, v) in msgs.iter_mut().zip(iov.chunks_exact_mut(per)).take(n) {
                m.msg_hdr.msg_iov = v.as_mut_ptr();
                m.msg_hdr.msg_iovlen = per;
            }
            let mut i = 0;
            while i < n {
                // SAFETY: `msgs[i..n]` are valid mmsghdrs whose iovecs point to live frames
                // borrowed for this call; the kernel only reads them (and writes msg_len).
                let r = unsafe {
                    libc::sendmmsg(
                        self.fd.as_raw_fd(),
                        msgs[i..].as_mut_ptr(),
                        (n - i) as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                };
                if r > 0 {
                    let r = r as usize;
                    rep.sent += r;
                    rep.bytes += iov[per * i..per * (i + r)]
                        .chunks_exact(per)
                        .map(|v| v[per - 1].iov_len as u64)
                        .sum::<u64>();
                    i += r;
                    continue;
                }
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                let mut fail = TxFail::from_io(&e);
                if e.raw_os_error() == Some(libc::ENETDOWN)
                    && netdev::running_by_index(self.fd.as_fd(), self.ifindex)
                {
                    // A noqueue device (veth) whose queue is stopped answers ENETDOWN too:
                    // with the device up and its carrier on, that is a full queue.
                    fail = TxFail::Full;
                }
                match fail {
                    // The rest of the batch would fail the same way: count it at once.
                    TxFail::Full => {
                        rep.full += n - i;
                        i = n;
                    }
                    TxFail::LinkDown => {
                        rep.link_down += n - i;
                        i = n;
                    }
                    TxFail::Oversize => {
                        rep.oversize += 1;
                        i += 1;
                    }
                    TxFail::Other => {
                        rep.errors += 1;
                        i += 1;
                    }
                }
            }
        }
    }

    /// Frames the kernel dropped for want of ring space since the last call
    /// (`PACKET_STATISTICS`, which resets the kernel's counters).
    pub fn take_drops(&self) -> io::Result<u64> {
        let s = getopt(
            self.fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            libc::tpacket_stats_v3 {
                tp_packets: 0,
                tp_drops: 0,
                tp_freeze_q_cnt: 0,
            },
        )?;
        Ok(s.tp_drops as u64)
    }
}

impl AsFd for AfPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What [`RxRing::next`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxFrame {
    /// Nothing handed to us yet.
    Empty,
    /// A frame of this many bytes was copied into the buffer.
    Frame(usize),
    /// A frame the device sent (skipped).
    Outgoing,
    /// The next frame needs a buffer of this many bytes, larger than the one given (a
    /// TSO/GRO packet of up to 64 KiB): nothing was taken, call again with one that large.
    NeedBuffer(usize),
    /// A frame larger than the ring's block (skipped).
    Oversize,
    /// The block's layout made no sense; the rest of it was given back unread.
    Corrupt,
}

/// The reader of a TPACKET_V3 RX ring.
///
/// Invariant: `map` is the whole ring, `geo.len()` bytes; `block < geo.block_nr`; `offset`
/// is 0 ("find it") or the offset in the current block of the next frame's header.
#[derive(Debug)]
pub struct RxRing {
    map: Mmap,
    geo: RingGeometry,
    block: u32,
    taken: u32,
    offset: u32,
    losing: bool,
    /// Frames carry a virtio-net header in front (`PACKET_VNET_HDR`).
    vnet: bool,
    last_vnet: VnetHdr,
}

impl RxRing {
    fn new(map: Mmap, geo: RingGeometry, vnet: bool) -> RxRing {
        RxRing {
            map,
            geo,
            block: 0,
            taken: 0,
            offset: 0,
            losing: false,
            vnet,
            last_vnet: VnetHdr::default(),
        }
    }

    /// The offload metadata of the frame [`RxRing::next`] returned last (none without
    /// `PACKET_VNET_HDR`): a partial checksum or a GSO packet the kernel handed over as is.
    /// Offsets count the re-inserted 802.1Q tag.
    #[inline]
    pub fn last_vnet(&self) -> VnetHdr {
        self.last_vnet
    }

    /// The ring's shape.
    pub fn geometry(&self) -> RingGeometry {
        self.geo
    }

    /// Where the reader is: hand this to the next daemon.
    pub fn position(&self) -> RingPosition {
        RingPosition {
            block: self.block,
            taken: self.taken,
        }
    }

    /// Continues at `p` (from the daemon that read the ring before); refused if outside.
    pub fn set_position(&mut self, p: RingPosition) -> Result<(), PositionError> {
        if p.block >= self.geo.block_nr {
            return Err(PositionError::BlockOutside {
                block: p.block,
                blocks: self.geo.block_nr,
            });
        }
        self.block = p.block;
        self.taken = p.taken;
        self.offset = 0;
        Ok(())
    }

    /// Finds the reader's place from the ring itself after another process may have read
    /// it: the oldest block handed to user space (by sequence number), else the block the
    /// kernel opened last. Frames another reader took from that block are read again
    /// unless `hint` says how many of them were taken.
    pub fn resync(&mut self, hint: Option<RingPosition>) {
        let mut oldest_user: Option<(u64, u32)> = None;
        let mut newest: (u64, u32) = (0, 0);
        for b in 0..self.geo.block_nr {
            let seq = self.read_u64(b, BLK_SEQ);
            if self.status(b) & libc::TP_STATUS_USER != 0 {
                if oldest_user.is_none_or(|(s, _)| seq < s) {
                    oldest_user = Some((seq, b));
                }
            } else if seq >= newest.0 {
                newest = (seq, b);
            }
        }
        let block = oldest_user.map_or(newest.1, |(_, b)| b);
        let taken = match hint {
            Some(h) if h.block == block && oldest_user.is_some() => h.taken,
            _ => 0,
        };
        self.block = block;
        self.taken = taken;
        self.offset = 0;
    }

    /// Whether the kernel reported lost frames since the last call (a block marked
    /// `TP_STATUS_LOSING`: read [`AfPacket::take_drops`] then).
    pub fn take_losing(&mut self) -> bool {
        std::mem::take(&mut self.losing)
    }

    #[inline]
    fn block_base(&self, b: u32) -> *mut u8 {
        // SAFETY: `b < block_nr`, so the block lies inside the mapping (invariant).
        unsafe {
            self.map
                .as_ptr()
                .add(b as usize * self.geo.block_size as usize)
        }
    }

    #[inline]
    fn status_atomic(&self, b: u32) -> &AtomicU32 {
        // SAFETY: the block descriptor is at the (page-aligned) start of block `b`, inside
        // the mapping, so `block_status` is in bounds and 4-byte aligned. An `AtomicU32` may
        // alias memory the kernel writes: atomics are the sanctioned way to share it.
        unsafe { &*(self.block_base(b).add(BLK_STATUS) as *const AtomicU32) }
    }

    #[inline]
    fn status(&self, b: u32) -> u32 {
        self.status_atomic(b).load(Ordering::Acquire)
    }

    /// Reads a u32 at `off` of block `b`; `off + 4 <= block_size` is checked by the caller.
    #[inline]
    fn read_u32(&self, b: u32, off: usize) -> u32 {
        debug_assert!(off + 4 <= self.geo.block_size as usize);
        // SAFETY: inside block `b` of the mapping (caller-checked offset); an unaligned raw
        // read forms no reference to memory the kernel may share.
        unsafe { std::ptr::read_unaligned(self.block_base(b).add(off) as *const u32) }
    }

    #[inline]
    fn read_u64(&self, b: u32, off: usize) -> u64 {
        // SAFETY: as for `read_u32`; only called with the descriptor offset BLK_SEQ.
        unsafe { std::ptr::read_unaligned(self.block_base(b).add(off) as *const u64) }
    }

    #[inline]
    fn read_u8(&self, b: u32, off: usize) -> u8 {
        // SAFETY: as for `read_u32`.
        unsafe { std::ptr::read(self.block_base(b).add(off)) }
    }

    /// Copies `len` bytes at `off` of block `b` into `dst` (caller-checked bounds).
    #[inline]
    fn copy_out(&self, b: u32, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= self.geo.block_size as usize);
        // SAFETY: the source range lies inside block `b` (checked by the caller), which the
        // kernel does not write while it is user-owned; `dst` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.block_base(b).add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    /// Gives the current block back to the kernel and moves to the next one.
    #[inline]
    fn release(&mut self) {
        self.status_atomic(self.block)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.block = (self.block + 1) % self.geo.block_nr;
        self.taken = 0;
        self.offset = 0;
    }

    /// Takes the next frame, copying it into `dst` (802.1Q tag re-inserted).
    #[inline]
    pub fn next(&mut self, dst: &mut [u8]) -> RxFrame {
        loop {
            let b = self.block;
            let status = self.status(b);
            if status & libc::TP_STATUS_USER == 0 {
                return RxFrame::Empty;
            }
            let num = self.read_u32(b, BLK_NUM_PKTS);
            if self.taken < num {
                return self.take(b, status, num, dst);
            }
            // A block with nothing left (a handed-over position at its end): give it back.
            self.release();
        }
    }

    /// Takes frame `taken` of user-owned block `b` (holding `num` frames).
    #[inline]
    fn take(&mut self, b: u32, status: u32, num: u32, dst: &mut [u8]) -> RxFrame {
        let bsize = self.geo.block_size as usize;
        if self.offset == 0 {
            // First frame of the block, or a position handed over: walk to frame `taken`.
            if status & libc::TP_STATUS_LOSING != 0 {
                self.losing = true;
            }
            let mut off = self.read_u32(b, BLK_FIRST) as usize;
            for _ in 0..self.taken {
                if off < BLK_DESC_LEN || off + HDR3_TOTAL > bsize {
                    self.release();
                    return RxFrame::Corrupt;
                }
                let next = self.read_u32(b, off) as usize;
                off += next;
            }
            self.offset = off as u32;
        }
        let off = self.offset as usize;
        if off < BLK_DESC_LEN || off + HDR3_TOTAL > bsize {
            self.release();
            return RxFrame::Corrupt;
        }
        let next = self.read_u32(b, off) as usize;
        let snaplen = self.read_u32(b, off + 12) as usize;
        let len = self.read_u32(b, off + 16) as usize;
        let fstatus = self.read_u32(b, off + 20);
        let mac = (self.read_u32(b, off + 24) & 0xffff) as usize;
        let tci = self.read_u32(b, off + 32) as u16;
        let tpid = (self.read_u32(b, off + 36) & 0xffff) as u16;
        // sll_pkttype: byte 10 of the sockaddr_ll after the header.
        let pkttype = self.read_u8(b, off + HDR3_LEN + 10);
        let tagged = fstatus & libc::TP_STATUS_VLAN_VALID != 0 && snaplen >= 12;
        let fits = mac >= HDR3_TOTAL && off + mac + snaplen <= bsize;
        let need = snaplen + if tagged { 4 } else { 0 };
        if fits && pkttype != libc::PACKET_OUTGOING && snaplen >= len && need > dst.len() {
            return RxFrame::NeedBuffer(need);
        }
        self.last_vnet = VnetHdr::default();
        if self.vnet && fits && mac >= HDR3_TOTAL + vnet::HDR_LEN {
            let mut h = [0u8; vnet::HDR_LEN];
            self.copy_out(b, off + mac - vnet::HDR_LEN, &mut h);
            let mut h = VnetHdr::from_bytes(&h);
            if tagged && h.is_offload() {
                h.csum_start = h.csum_start.saturating_add(4);
                h.hdr_len = h.hdr_len.saturating_add(4);
            }
            self.last_vnet = h;
        }
        self.taken += 1;
        let last = self.taken >= num;
        if !last && next == 0 {
            self.release();
            return RxFrame::Corrupt;
        }
        self.offset = (off + next) as u32;
        let res = if mac < HDR3_TOTAL || off + mac + snaplen > bsize {
            RxFrame::Corrupt
        } else if pkttype == libc::PACKET_OUTGOING {
            RxFrame::Outgoing
        } else if snaplen < len {
            RxFrame::Oversize
        } else if fstatus & libc::TP_STATUS_VLAN_VALID != 0 && snaplen >= 12 {
            let tpid = if fstatus & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                tpid
            } else {
                0x8100
            };
            if snaplen + 4 > dst.len() {
                RxFrame::Oversize
            } else {
                self.copy_out(b, off + mac, &mut dst[..12]);
                dst[12..14].copy_from_slice(&tpid.to_be_bytes());
                dst[14..16].copy_from_slice(&tci.to_be_bytes());
                self.copy_out(b, off + mac + 12, &mut dst[16..snaplen + 4]);
                RxFrame::Frame(snaplen + 4)
            }
        } else if snaplen > dst.len() {
            RxFrame::Oversize
        } else {
            self.copy_out(b, off + mac, &mut dst[..snaplen]);
            RxFrame::Frame(snaplen)
        };
        if last || res == RxFrame::Corrupt {
            self.release();
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::test_veth::Veth;

    const GEO: RingGeometry = RingGeometry {
        block_size: 4096,
        block_nr: 4,
        frame_size: 128,
    };

    /// A ring in anonymous memory, written the way the kernel writes it.
    struct FakeRing {
        ring: RxRing,
    }

    impl FakeRing {
        fn new() -> FakeRing {
            let map = Mmap::anonymous(GEO.len()).unwrap();
            FakeRing {
                ring: RxRing::new(map, GEO, false),
            }
        }

        fn put(&self, at: usize, bytes: &[u8]) {
            assert!(at + bytes.len() <= GEO.len());
            // SAFETY: in bounds of the test's own mapping, which nothing else uses.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.ring.map.as_ptr().add(at),
                    bytes.len(),
                )
            }
        }

        fn u32_at(&self, at: usize, v: u32) {
            self.put(at, &v.to_ne_bytes());
        }

        fn status_of(&self, b: u32) -> u32 {
            self.ring.status(b)
        }

        /// Fills block `b` with `frames` (frame bytes, tp_status, pkttype, tp_len) and hands
        /// it to user space with sequence number `seq`.
        fn block(&self, b: u32, seq: u64, frames: &[(&[u8], u32, u8, Option<u32>)]) {
            let base = b as usize * GEO.block_size as usize;
            let mut off = BLK_DESC_LEN;
            self.u32_at(base + BLK_NUM_PKTS, frames.len() as u32);
            self.u32_at(base + BLK_FIRST, off as u32);
            self.put(base + BLK_SEQ, &seq.to_ne_bytes());
            for (i, (f, status, pkttype, len)) in frames.iter().enumerate() {
                let mac = HDR3_TOTAL.next_multiple_of(16);
                let next = (mac + f.len()).next_multiple_of(16);
                let h = base + off;
                let last = i + 1 == frames.len();
                self.u32_at(h, if last { 0 } else { next as u32 });
                self.u32_at(h + 12, f.len() as u32);
                self.u32_at(h + 16, len.unwrap_or(f.len() as u32));
                self.u32_at(h + 20, *status);
                self.u32_at(h + 24, mac as u32);
                self.u32_at(h + 32, 100); // VLAN TCI, if valid
                self.u32_at(h + 36, 0x88a8); // TPID, if valid
                self.put(h + HDR3_LEN + 10, &[*pkttype]);
                self.put(h + mac, f);
                off += next;
            }
            self.ring
                .status_atomic(b)
                .store(libc::TP_STATUS_USER, Ordering::Release);
        }
    }

    fn frame(tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14] = tag;
        f
    }

    #[test]
    fn reads_frames_restores_vlan_tags_and_skips_outgoing() {
        let mut r = FakeRing::new();
        let mut buf = [0u8; 256];
        assert_eq!(r.ring.next(&mut buf), RxFrame::Empty);
        let (a, b, c) = (frame(1), frame(2), frame(3));
        r.block(
            0,
            1,
            &[
                (&a, 0, libc::PACKET_HOST, None),
                (&b, libc::TP_STATUS_VLAN_VALID, libc::PACKET_OTHERHOST, None),
                (&c, 0, libc::PACKET_OUTGOING, None),
            ],
        );
        assert_eq!(r.ring.next(&mut buf), RxFrame::Frame(60));
        assert_eq!(&buf[..60], &a[..]);
        assert_eq!(r.ring.position(), RingPosition { block: 0, taken: 1 });
        // The tag comes back in the frame, 0x8100 when the TPID is not reported.
        assert_eq!(r.ring.next(&mut buf), RxFrame::Frame(64));
        assert_eq!(&buf[..12], &b[..12]);
        assert_eq!(&buf[12..16], &[0x81, 0x00, 0, 100]);
        assert_eq!(&buf[16..64], &b[12..]);
        assert_eq!(r.ring.next(&mut buf), RxFrame::Outgoing);
        // The last frame gave the block back.
        assert_eq!(r.status_of(0), libc::TP_STATUS_KERNEL);
        assert_eq!(r.ring.position(), RingPosition { block: 1, taken: 0 });
        assert_eq!(r.ring.next(&mut buf), RxFrame::Empty);
        // 802.1ad TPID reported; a frame cut by snaplen; one larger than the buffer.
        let big = [7u8; 200];
        r.block(
            1,
            2,
            &[
                (
                    &a,
                    libc::TP_STATUS_VLAN_VALID | libc::TP_STATUS_VLAN_TPID_VALID,
                    0,
                    None,
                ),
                (&b, 0, 0, Some(1500)),
                (&big, 0, 0, None),
            ],
        );
        assert_eq!(r.ring.next(&mut buf), RxFrame::Frame(64));
        assert_eq!(&buf[12..16], &[0x88, 0xa8, 0, 100]);
        assert_eq!(r.ring.next(&mut buf), RxFrame::Oversize);
        // Larger than the buffer: not taken; again with a buffer that large.
        assert_eq!(r.ring.next(&mut buf[..100]), RxFrame::NeedBuffer(200));
        assert_eq!(r.ring.next(&mut buf[..200]), RxFrame::Frame(200));
        assert_eq!(&buf[..200], &big[..]);
        assert_eq!(r.ring.position(), RingPosition { block: 2, taken: 0 });
    }

    #[test]
    fn corrupt_blocks_are_given_back_without_reading_outside() {
        let mut r = FakeRing::new();
        let mut buf = [0u8; 256];
        let a = frame(1);
        let base = 0;
        // A frame whose data would run past the block.
        r.block(0, 1, &[(&a, 0, 0, None), (&a, 0, 0, None)]);
        r.u32_at(base + BLK_DESC_LEN + 12, 1 << 20);
        assert_eq!(r.ring.next(&mut buf), RxFrame::Corrupt);
        assert_eq!(r.status_of(0), libc::TP_STATUS_KERNEL);
        // A first-frame offset outside the block.
        r.block(1, 2, &[(&a, 0, 0, None)]);
        r.u32_at(GEO.block_size as usize + BLK_FIRST, u32::MAX - 8);
        assert_eq!(r.ring.next(&mut buf), RxFrame::Corrupt);
        // A chain that ends (next offset 0) before num_pkts frames.
        r.block(2, 3, &[(&a, 0, 0, None), (&a, 0, 0, None)]);
        r.u32_at(2 * GEO.block_size as usize + BLK_DESC_LEN, 0);
        assert_eq!(r.ring.next(&mut buf), RxFrame::Corrupt);
        assert_eq!(r.ring.position(), RingPosition { block: 3, taken: 0 });
        assert_eq!(r.ring.next(&mut buf), RxFrame::Empty);
    }

    #[test]
    fn positions_hand_over_and_resync_finds_the_oldest_user_block() {
        let mut r = FakeRing::new();
        let mut buf = [0u8; 256];
        let (a, b, c) = (frame(1), frame(2), frame(3));
        r.block(2, 7, &[(&a, 0, 0, None), (&b, 0, 0, None)]);
        r.block(3, 8, &[(&c, 0, 0, None)]);
        // Another reader stopped after one frame of block 2.
        r.ring
            .set_position(RingPosition { block: 2, taken: 1 })
            .unwrap();
        assert_eq!(r.ring.next(&mut buf), RxFrame::Frame(60));
        assert_eq!(buf[14], 2);
        assert_eq!(
            r.ring.set_position(RingPosition { block: 4, taken: 0 }),
            Err(PositionError::BlockOutside {
                block: 4,
                blocks: GEO.block_nr
            })
        );
        // Block 3 is the oldest still handed to user space.
        r.ring.resync(None);
        assert_eq!(r.ring.position(), RingPosition { block: 3, taken: 0 });
        // Nothing handed over: the block the kernel opened last (highest sequence).
        assert_eq!(r.ring.next(&mut buf), RxFrame::Frame(60));
        r.put(BLK_SEQ, &9u64.to_ne_bytes());
        r.ring.resync(Some(RingPosition { block: 3, taken: 1 }));
        assert_eq!(r.ring.position(), RingPosition { block: 0, taken: 0 });
        // A hint is used only for the block it names, while that block is still ours.
        r.block(1, 10, &[(&a, 0, 0, None), (&b, 0, 0, None)]);
        r.ring.resync(Some(RingPosition { block: 1, taken: 1 }));
        assert_eq!(r.ring.position(), RingPosition { block: 1, taken: 1 });
        assert_eq!(r.ring.next(&mut buf), RxFrame::Frame(60));
        assert_eq!(buf[14], 2);
    }

    /// Waits up to 2 s for the next frame tagged `tag` (skipping the host's own traffic).
    fn wait_frame(ring: &mut RxRing, tag: u8, buf: &mut [u8]) -> usize {
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_secs(2) {
            match ring.next(buf) {
                RxFrame::Frame(n) if buf[12..14] == [0x88, 0xb5] && buf[14] == tag => return n,
                RxFrame::Frame(n) if n >= 18 && buf[16..18] == [0x88, 0xb5] && buf[18] == tag => {
                    return n
                }
                RxFrame::Empty => std::thread::sleep(std::time::Duration::from_millis(1)),
                _ => {}
            }
        }
        panic!("frame {tag} never arrived");
    }

    /// Sends `frames` in one burst, again while a veth just brought up refuses them for a
    /// moment (ENETDOWN, counted whole each time).
    fn send_all(sock: &AfPacket, frames: &[&[u8]]) -> SendReport {
        let mut rep = SendReport::default();
        for _ in 0..200 {
            rep = sock.send_burst(frames.iter().copied());
            if rep.sent > 0 {
                break;
            }
            assert_eq!(rep.full + rep.link_down, frames.len(), "{rep:?}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(rep.sent, frames.len(), "{rep:?}");
        rep
    }

    #[test]
    fn veth_frames_arrive_in_the_ring_and_the_ring_maps_again_from_a_copy_of_the_fd() {
        let Some((_guard, a, b)) = Veth::new("fvs", "r", "AF_PACKET") else {
            return;
        };
        let (rx, mut ring) = AfPacket::open(&a, RingGeometry::DEFAULT).unwrap();
        let (tx, _) = AfPacket::open(&b, RingGeometry::DEFAULT).unwrap();
        assert!(
            rx.ignores_outgoing(),
            "kernels since 4.20 have PACKET_IGNORE_OUTGOING"
        );
        let mut buf = [0u8; 2048];
        let mut tagged = frame(2);
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x0a]);
        let (f1, f3, f4) = (frame(1), frame(3), frame(4));
        let rep = send_all(&tx, &[&f1, &tagged, &f3, &f4]);
        assert_eq!(rep.bytes, 4 * 60 + 4);
        assert_eq!(wait_frame(&mut ring, 1, &mut buf), 60);
        assert_eq!(&buf[..60], &f1[..]);
        // The kernel took the tag out; the reader puts it back.
        assert_eq!(wait_frame(&mut ring, 2, &mut buf), 64);
        assert_eq!(&buf[..64], &tagged[..]);
        // Hand over: a second mapping of the same socket's ring carries on where we stopped.
        let (_rx2, mut ring2) = AfPacket::from_fd(
            rx.as_fd().try_clone_to_owned().unwrap(),
            RingGeometry::DEFAULT,
        )
        .unwrap();
        ring2.set_position(ring.position()).unwrap();
        assert_eq!(wait_frame(&mut ring2, 3, &mut buf), 60);
        assert_eq!(wait_frame(&mut ring2, 4, &mut buf), 60);
        // What we send ourselves does not come back.
        let f5 = frame(5);
        send_all(&rx, &[&f5]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        while let r @ (RxFrame::Frame(_) | RxFrame::Outgoing) = ring2.next(&mut buf) {
            assert!(
                !(r == RxFrame::Frame(60) && buf[14] == 5),
                "own frame came back"
            );
        }
        // A wrong geometry, or an fd that is not a packet socket, is refused.
        let bad = RingGeometry {
            block_nr: 16,
            ..RingGeometry::DEFAULT
        };
        assert!(AfPacket::from_fd(rx.as_fd().try_clone_to_owned().unwrap(), bad).is_err());
        let efd = crate::os::eventfd().unwrap();
        assert!(matches!(
            AfPacket::from_fd(efd, RingGeometry::DEFAULT),
            Err(AfPacketError::BadFd(_))
        ));
        assert_eq!(rx.take_drops().unwrap(), 0);
        assert!(matches!(
            AfPacket::open("fvs-nosuchdev", RingGeometry::DEFAULT),
            Err(AfPacketError::NoDevice(_))
        ));
    }
}
