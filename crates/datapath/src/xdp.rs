//! AF_XDP uplinks ([`XdpIo`]): an existing netdev's queue 0 through an AF_XDP socket,
//! polled by PMDs like the AF_PACKET uplink ([`crate::kernel::UplinkIo`]), with the same
//! burst shapes.
//!
//! Receive copies frames from the UMEM into buffers of the PMD's pool and gives the UMEM
//! frames straight back to the kernel (fill ring), so no UMEM frame stays with a PMD between
//! bursts. Transmit copies into free UMEM transmit frames, posts them on the tx ring and
//! kicks the kernel once per burst when it asks (`sendto`, copy mode sends from that call);
//! sent frames come back on the completion ring, reaped at the next burst. No allocation, no
//! system call per packet.
//!
//! Every frame not delivered is counted by reason in the port's `rx`/`tx` counters, as for
//! AF_PACKET: `kernel_tx_full`, `kernel_link_down`, `oversize`, `runt`, `rx_error`,
//! `no_mbuf`, and `kernel_rx_dropped` (the kernel's `XDP_STATISTICS`, read by the control
//! thread every tick with [`XdpIo::poll_kernel_drops`]).
//!
//! Thread-safety: the receive side has one reader at a time (a mutex a PMD takes with
//! `try_lock` for one burst); the transmit side is shared by every PMD (a mutex per burst,
//! uncontended when one PMD transmits to the port).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;

use ferrovs_counters::{DropReason, QueueStats};
use ferrovs_sys::kernel::af_xdp::{XskRx, XskRxFrame, XskSocket, XskStats, XskTx};
use ferrovs_sys::pool::{Mbuf, Pool, MAX_DATA};
use ferrovs_vhost::virtqueue::BURST;

use crate::kernel::{count_sent, RxTally};
use crate::kernel_port::{KernelPort, TxPkts};

/// Shortest Ethernet frame accepted (destination, source, type).
const MIN_FRAME: usize = 14;

/// An uplink over AF_XDP.
#[derive(Debug)]
pub struct XdpIo {
    pub sock: XskSocket,
    pub rx_ring: Mutex<XskRx>,
    pub tx_ring: Mutex<XskTx>,
    /// Frames taken from the device (wire → switch).
    pub rx: QueueStats,
    /// Frames sent on the device (switch → wire).
    pub tx: QueueStats,
    /// The kernel's counters already added to `rx` (control thread only).
    pub stats_seen: Mutex<XskStats>,
}

impl XdpIo {
    pub fn new(sock: XskSocket, rx: XskRx, tx: XskTx) -> XdpIo {
        XdpIo {
            sock,
            rx_ring: Mutex::new(rx),
            tx_ring: Mutex::new(tx),
            rx: QueueStats::default(),
            tx: QueueStats::default(),
            stats_seen: Mutex::new(XskStats::default()),
        }
    }

    /// Adds what the kernel dropped on receive since the last call (`XDP_STATISTICS`: no
    /// frame to fill, rx ring full, frame larger than a UMEM frame) to `kernel_rx_dropped`.
    /// One system call; the control thread calls it every tick, never a PMD.
    pub fn poll_kernel_drops(&self) {
        let Ok(now) = self.sock.statistics() else {
            return;
        };
        let mut seen = self.stats_seen.lock().unwrap_or_else(|p| p.into_inner());
        let d = now.rx_dropped.saturating_sub(seen.rx_dropped)
            + now.rx_ring_full.saturating_sub(seen.rx_ring_full);
        let inval = now.rx_invalid_descs.saturating_sub(seen.rx_invalid_descs)
            + now.tx_invalid_descs.saturating_sub(seen.tx_invalid_descs);
        *seen = now;
        drop(seen);
        self.rx.drop(DropReason::KernelRxDropped, d);
        self.rx.drop(DropReason::RxError, inval);
    }
}

impl KernelPort for XdpIo {
    fn mode(&self) -> &'static str {
        "af_xdp"
    }

    fn stats(&self) -> [&QueueStats; 2] {
        [&self.tx, &self.rx]
    }

    /// Readable while the rx ring holds frames.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn poll_kernel_drops(&self) {
        XdpIo::poll_kernel_drops(self);
    }

    /// Takes up to `max` frames from the rx ring into buffers from `pool`, appended to `out`.
    #[inline]
    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize {
        let Ok(mut ring) = self.rx_ring.try_lock() else {
            return 0;
        };
        let max = max.min(BURST).min(out.capacity() - out.len()) as u32;
        let avail = ring.available().min(max);
        if avail == 0 {
            return 0;
        }
        let mut t = RxTally::default();
        let mut taken = 0;
        while taken < avail {
            // Out of buffers: leave the rest in the ring for the next burst.
            let Some(mut m) = pool.alloc() else {
                self.rx.drop(DropReason::NoMbuf, 1);
                break;
            };
            let Some(buf) = m.fill(MAX_DATA) else { break };
            match ring.read(taken, buf) {
                XskRxFrame::Frame(n) if n < MIN_FRAME => t.runts += 1,
                XskRxFrame::Frame(n) => {
                    m.truncate(n);
                    t.frame(n);
                    out.push(m);
                }
                XskRxFrame::Oversize => t.oversize += 1,
                XskRxFrame::Bad => t.errors += 1,
            }
            taken += 1;
        }
        ring.release(taken);
        drop(ring);
        t.count(&self.rx)
    }

    /// Sends `pkts` on the device; returns (sent, dropped).
    #[inline]
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64) {
        let r = {
            let mut ring = self.tx_ring.lock().unwrap_or_else(|p| p.into_inner());
            ring.send_burst(pkts.iter().map(|m| m.data()))
        };
        count_sent(&self.tx, &r)
    }
}
