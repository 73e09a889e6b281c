//! Kernel ports: a TAP device ([`TapIo`]) and an existing netdev over AF_PACKET
//! ([`UplinkIo`]), polled by PMDs like a vhost-user rx queue.
//!
//! Each has one receive queue and one transmit path. A burst is at most [`BURST`] frames
//! into buffers of the PMD's pool; nothing allocates. Costs per burst: a TAP needs one
//! `read` per frame (plus one that finds the device empty) and one `writev` per frame sent
//! (the tun driver has no batch interface); an uplink reads its mapped ring with no system
//! call and sends a whole burst with one `sendmmsg`.
//!
//! Every frame that is not delivered is counted by reason in the port's `rx`/`tx` counters
//! (`kernel_tx_full`, `kernel_link_down`, `kernel_rx_dropped`, `oversize`, `runt`,
//! `rx_error`, `tx_error`, `no_mbuf`).
//!
//! Thread-safety: transmit is one system call per frame or burst on a shared fd, so several
//! PMDs may transmit to one port at once. A TAP's receive side is the same. An uplink's ring
//! has one reader at a time: it sits behind a mutex that a PMD takes with `try_lock` for one
//! burst (uncontended in practice: one PMD polls a port's queue), as vhost-user queues do.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;

use ferrovs_counters::{DropReason, QueueStats};
use ferrovs_sys::kernel::af_packet::{AfPacket, RingGeometry, RxFrame, RxRing, SendReport};
use ferrovs_sys::kernel::netdev::TxFail;
use ferrovs_sys::kernel::tap::{Tap, VNET_HDR_LEN};
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::virtqueue::BURST;

use crate::kernel_port::{KernelPort, TxPkts};

/// Shortest Ethernet frame accepted (destination, source, type).
const MIN_FRAME: usize = 14;

/// A TAP port.
///
/// Offloads: the kernel takes every offload ferrovs knows of on what we write (the virtio-net
/// header in front of each frame says what is left to do), and, once
/// [`Tap::enable_offloads`] succeeded, hands us partial checksums and TSO packets of up to
/// 64 KiB, read into the pool's large buffers.
#[derive(Debug)]
pub struct TapIo {
    pub tap: Tap,
    /// The kernel may send us offloads (TUNSETOFFLOAD accepted).
    pub rx_offloads: bool,
    /// Frames read from the device (host → switch).
    pub rx: QueueStats,
    /// Frames written to the device (switch → host).
    pub tx: QueueStats,
}

impl TapIo {
    /// Wraps `tap`, asking the kernel for offloads; without them (an old kernel) the kernel
    /// sends complete frames, which works too.
    pub fn new(tap: Tap) -> TapIo {
        let rx_offloads = match tap.enable_offloads() {
            Ok(()) => true,
            Err(e) => {
                // Kept in `rx_offloads` (shown by `ferrovs show`: the port sends none).
                log::warn!("TAP {}: no offloads from the kernel: {e}", tap.name());
                false
            }
        };
        TapIo {
            tap,
            rx_offloads,
            rx: QueueStats::default(),
            tx: QueueStats::default(),
        }
    }

    /// What the device takes on transmit: everything.
    #[inline]
    pub fn caps(&self) -> u8 {
        caps::ALL
    }
}

impl KernelPort for TapIo {
    fn mode(&self) -> &'static str {
        "tap"
    }

    #[inline]
    fn tx_caps(&self) -> u8 {
        self.caps()
    }

    fn stats(&self) -> [&QueueStats; 2] {
        [&self.tx, &self.rx]
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.tap.as_fd())
    }

    /// Reads up to `max` frames into buffers from `pool`, appended to `out`.
    #[inline]
    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize {
        let max = max.min(BURST).min(out.capacity() - out.len());
        let mut t = RxTally::default();
        for _ in 0..max {
            let m = if self.rx_offloads {
                pool.alloc_large().or_else(|| pool.alloc())
            } else {
                pool.alloc()
            };
            let Some(mut m) = m else {
                self.rx.drop(DropReason::NoMbuf, 1);
                break;
            };
            let cap = m.max_data();
            let Some(buf) = m.fill(cap) else { break };
            match self.tap.recv(buf) {
                Ok(None) => break,
                Ok(Some(n)) if n == cap => t.oversize += 1,
                Ok(Some(n)) if n < VNET_HDR_LEN + MIN_FRAME => t.runts += 1,
                Ok(Some(n)) => {
                    let mut h = [0u8; vnet::HDR_LEN];
                    h.copy_from_slice(&buf[..vnet::HDR_LEN]);
                    let h = VnetHdr::from_bytes(&h);
                    let len = n - VNET_HDR_LEN;
                    if !kernel_header_ok(&h, len) {
                        t.bad_offload += 1;
                        continue;
                    }
                    m.truncate(n);
                    m.pull_front(VNET_HDR_LEN);
                    m.vnet = VnetHdr {
                        flags: h.flags & vnet::F_NEEDS_CSUM,
                        ..h
                    };
                    t.frame(len);
                    out.push(m);
                }
                Err(_) => {
                    t.errors += 1;
                    break;
                }
            }
        }
        t.count(&self.rx)
    }

    /// Writes `pkts` to the device, each behind its offload metadata; returns (sent,
    /// dropped).
    #[inline]
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64) {
        let mut r = SendReport::default();
        for m in pkts.iter() {
            let p = m.data();
            let mut hdr = [0u8; VNET_HDR_LEN];
            if m.vnet.is_offload() {
                hdr[..vnet::HDR_LEN].copy_from_slice(&m.vnet.to_bytes());
            }
            match self.tap.send(&hdr, p) {
                Ok(()) => {
                    r.sent += 1;
                    r.bytes += p.len() as u64;
                }
                Err(TxFail::Full) => r.full += 1,
                Err(TxFail::LinkDown) => r.link_down += 1,
                Err(TxFail::Oversize) => r.oversize += 1,
                Err(TxFail::Other) => r.errors += 1,
            }
        }
        count_sent(&self.tx, &r)
    }
}

/// What one receive burst from a kernel device came to: frames taken, and frames dropped
/// per reason.
#[derive(Debug, Default)]
pub(crate) struct RxTally {
    pub pkts: u64,
    pub bytes: u64,
    pub runts: u64,
    pub oversize: u64,
    pub errors: u64,
    pub bad_offload: u64,
}

impl RxTally {
    /// One frame of `len` bytes taken.
    #[inline]
    pub fn frame(&mut self, len: usize) {
        self.pkts += 1;
        self.bytes += len as u64;
    }

    /// Adds the burst to the port's receive counters; returns the frames taken.
    #[inline]
    pub fn count(&self, rx: &QueueStats) -> usize {
        rx.add(self.pkts, self.bytes);
        rx.drop(DropReason::Runt, self.runts);
        rx.drop(DropReason::Oversize, self.oversize);
        rx.drop(DropReason::RxError, self.errors);
        rx.drop(DropReason::BadOffload, self.bad_offload);
        self.pkts as usize
    }
}

/// Adds a send burst's report to the port's transmit counters; returns (sent, dropped).
#[inline]
pub(crate) fn count_sent(tx: &QueueStats, r: &SendReport) -> (u64, u64) {
    tx.add(r.sent as u64, r.bytes);
    tx.drop(DropReason::KernelTxFull, r.full as u64);
    tx.drop(DropReason::KernelLinkDown, r.link_down as u64);
    tx.drop(DropReason::Oversize, r.oversize as u64);
    tx.drop(DropReason::TxError, r.errors as u64);
    let dropped = r.full + r.link_down + r.oversize + r.errors;
    (r.sent as u64, dropped as u64)
}

/// Whether a header the kernel wrote describes the `len`-byte frame behind it with offloads
/// the datapath handles (TCP segmentation, partial checksums inside the frame).
fn kernel_header_ok(h: &VnetHdr, len: usize) -> bool {
    if h.needs_csum() && usize::from(h.csum_start) + usize::from(h.csum_offset) + 2 > len {
        return false;
    }
    match h.gso() {
        vnet::GSO_NONE => true,
        vnet::GSO_TCPV4 | vnet::GSO_TCPV6 => h.needs_csum() && h.gso_size != 0,
        _ => false,
    }
}

/// An uplink: an existing netdev over an AF_PACKET socket.
#[derive(Debug)]
pub struct UplinkIo {
    pub sock: AfPacket,
    pub ring: Mutex<RxRing>,
    /// The ring's shape (fixed: readable without the ring's lock).
    pub geometry: RingGeometry,
    /// Frames taken from the ring (wire → switch).
    pub rx: QueueStats,
    /// Frames sent on the device (switch → wire).
    pub tx: QueueStats,
}

impl UplinkIo {
    pub fn new(sock: AfPacket, ring: RxRing) -> UplinkIo {
        UplinkIo {
            sock,
            geometry: ring.geometry(),
            ring: Mutex::new(ring),
            rx: QueueStats::default(),
            tx: QueueStats::default(),
        }
    }
}

impl KernelPort for UplinkIo {
    fn mode(&self) -> &'static str {
        "af_packet"
    }

    fn stats(&self) -> [&QueueStats; 2] {
        [&self.tx, &self.rx]
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    /// Takes up to `max` frames from the ring into buffers from `pool`, appended to `out`.
    /// The kernel's own drops (`PACKET_STATISTICS`) are read here, one system call, only
    /// after the ring reported a loss.
    #[inline]
    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize {
        let Ok(mut ring) = self.ring.try_lock() else {
            return 0;
        };
        let max = max.min(BURST).min(out.capacity() - out.len());
        let mut t = RxTally::default();
        // Outgoing frames (only seen without PACKET_IGNORE_OUTGOING) do not count towards
        // the burst, but the loop stays bounded.
        let mut budget = 4 * BURST;
        let mut next = pool.alloc();
        while (t.pkts as usize) < max && budget > 0 {
            budget -= 1;
            let Some(mut m) = next.take().or_else(|| pool.alloc()) else {
                self.rx.drop(DropReason::NoMbuf, 1);
                break;
            };
            let cap = m.max_data();
            let Some(buf) = m.fill(cap) else { break };
            match ring.next(buf) {
                RxFrame::Empty => break,
                RxFrame::NeedBuffer(n) => {
                    // A GSO/GRO packet of up to 64 KiB: again, into a large buffer.
                    match pool.alloc_for(n) {
                        Some(l) if l.max_data() >= n => next = Some(l),
                        _ => {
                            self.rx.drop(DropReason::NoMbuf, 1);
                            break;
                        }
                    }
                }
                RxFrame::Frame(n) if n < MIN_FRAME => t.runts += 1,
                RxFrame::Frame(n) => {
                    let h = ring.last_vnet();
                    if !kernel_header_ok(&h, n) {
                        t.bad_offload += 1;
                        continue;
                    }
                    m.truncate(n);
                    m.vnet = VnetHdr {
                        flags: h.flags & vnet::F_NEEDS_CSUM,
                        ..h
                    };
                    t.frame(n);
                    out.push(m);
                }
                RxFrame::Outgoing => {}
                RxFrame::Oversize => t.oversize += 1,
                RxFrame::Corrupt => t.errors += 1,
            }
        }
        if ring.take_losing() {
            // One system call, only after the kernel reported a loss.
            if let Ok(n) = self.sock.take_drops() {
                self.rx.drop(DropReason::KernelRxDropped, n);
            }
        }
        drop(ring);
        t.count(&self.rx)
    }

    /// Sends `pkts` on the device with one `sendmmsg`; returns (sent, dropped).
    #[inline]
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64) {
        count_sent(
            &self.tx,
            &self.sock.send_burst(pkts.iter().map(|m| m.data())),
        )
    }
}
