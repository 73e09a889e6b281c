//! A dummy port (as OVS's `netdev-dummy`): frames queued in memory are what it receives,
//! frames sent to it are captured, so the PMD loop, the output stage and the bridge can be
//! driven and checked in-process, with no device, no guest and no privilege.
//!
//! It has the kernel ports' shape (one queue each way, `rx`/`tx` counters with the same drop
//! reasons) and can play their failures: a link that is down (`kernel_link_down`), a
//! transmit queue with room for only so many frames (`kernel_tx_full`), frames too short to
//! be Ethernet (`runt`).
//!
//! A test double: it takes a lock and may allocate per burst (never on a real port's path).
//!
//! Thread-safety: every method takes `&self`; the queues sit behind mutexes, so a test may
//! feed and read a port while a PMD polls it.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use ferrovs_counters::{DropReason, QueueStats};
use ferrovs_flow::TunnelKey;
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::virtqueue::BURST;

use crate::kernel_port::{KernelPort, TxPkts};

/// Shortest Ethernet frame accepted (destination, source, type).
const MIN_FRAME: usize = 14;

/// An in-memory port.
#[derive(Debug)]
pub struct DummyIo {
    /// Frames waiting to be received (oldest first).
    pending: Mutex<VecDeque<Vec<u8>>>,
    /// Frames sent to the port (oldest first).
    sent: Mutex<Vec<Vec<u8>>>,
    /// What the port accepts of offload metadata (`vnet::caps` bits).
    caps: u8,
    link_up: AtomicBool,
    /// Frames the transmit side still takes (`usize::MAX`: no limit).
    tx_room: AtomicUsize,
    /// Transmit bursts made (the output stage's batching).
    tx_bursts: AtomicU64,
    /// Plays a `key=flow` tunnel port: receives frames with tunnel metadata
    /// ([`DummyIo::push_rx_tunnel`]) and captures the metadata of what it sends.
    tunnel: AtomicBool,
    pending_tun: Mutex<VecDeque<TunnelKey>>,
    sent_tun: Mutex<Vec<Option<TunnelKey>>>,
    /// Frames received from the port (port → switch).
    pub rx: QueueStats,
    /// Frames sent to the port (switch → port).
    pub tx: QueueStats,
}

impl Default for DummyIo {
    fn default() -> Self {
        DummyIo::new(0)
    }
}

impl DummyIo {
    /// A port whose link is up, with unlimited transmit room, accepting offload metadata
    /// `caps` (`vnet::caps` bits; 0: none, the switch completes offloads in software).
    pub fn new(caps: u8) -> DummyIo {
        DummyIo {
            pending: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
            caps,
            link_up: AtomicBool::new(true),
            tx_room: AtomicUsize::new(usize::MAX),
            tx_bursts: AtomicU64::new(0),
            tunnel: AtomicBool::new(false),
            pending_tun: Mutex::new(VecDeque::new()),
            sent_tun: Mutex::new(Vec::new()),
            rx: QueueStats::default(),
            tx: QueueStats::default(),
        }
    }

    /// Queues `frame` to be received by the next burst.
    pub fn push_rx(&self, frame: &[u8]) {
        lock(&self.pending).push_back(frame.to_vec());
    }

    /// Makes the port play a `key=flow` tunnel port (see the field).
    pub fn set_tunnel(&self, on: bool) {
        self.tunnel.store(on, Ordering::Relaxed);
    }

    /// Queues `frame`, received through the tunnel with metadata `t` (a tunnel port).
    pub fn push_rx_tunnel(&self, frame: &[u8], t: TunnelKey) {
        lock(&self.pending).push_back(frame.to_vec());
        lock(&self.pending_tun).push_back(t);
    }

    /// Takes the tunnel metadata of the frames sent so far (a tunnel port), in order.
    pub fn take_sent_tunnels(&self) -> Vec<Option<TunnelKey>> {
        std::mem::take(&mut *lock(&self.sent_tun))
    }

    /// Frames waiting to be received.
    pub fn rx_pending(&self) -> usize {
        lock(&self.pending).len()
    }

    /// Takes the frames sent to the port so far.
    pub fn take_sent(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *lock(&self.sent))
    }

    /// Transmit bursts made so far.
    pub fn tx_bursts(&self) -> u64 {
        self.tx_bursts.load(Ordering::Relaxed)
    }

    /// Sets the link up or down (down: every frame sent counts as `kernel_link_down`).
    pub fn set_link(&self, up: bool) {
        self.link_up.store(up, Ordering::Relaxed);
    }

    /// Lets the transmit side take `n` more frames (then `kernel_tx_full`); `None`: no limit.
    pub fn set_tx_room(&self, n: Option<usize>) {
        self.tx_room
            .store(n.unwrap_or(usize::MAX), Ordering::Relaxed);
    }
}

impl KernelPort for DummyIo {
    fn mode(&self) -> &'static str {
        "dummy"
    }

    #[inline]
    fn tx_caps(&self) -> u8 {
        self.caps
    }

    fn stats(&self) -> [&QueueStats; 2] {
        [&self.tx, &self.rx]
    }

    /// None: nothing to sleep on (a PMD polling a dummy port keeps polling).
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    #[inline]
    fn takes_tunnel_metadata(&self) -> bool {
        self.tunnel.load(Ordering::Relaxed)
    }

    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize {
        self.rx_burst_tunnel(pool, out, max, None)
    }

    /// Takes up to `max` queued frames into buffers from `pool`, appended to `out` (a tunnel
    /// port: with their metadata appended to `tun`).
    fn rx_burst_tunnel<'p>(
        &self,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        mut tun: Option<&mut Vec<TunnelKey>>,
    ) -> usize {
        let max = max.min(BURST).min(out.capacity() - out.len());
        let tunnel = self.tunnel.load(Ordering::Relaxed);
        let mut tq = lock(&self.pending_tun);
        let mut q = lock(&self.pending);
        let (mut pkts, mut bytes, mut runts, mut oversize) = (0u64, 0u64, 0u64, 0u64);
        while (pkts as usize) < max {
            let Some(f) = q.pop_front() else { break };
            let t = tq.pop_front().unwrap_or_default();
            if f.len() < MIN_FRAME {
                runts += 1;
                continue;
            }
            let Some(mut m) = pool.alloc_for(f.len()) else {
                q.push_front(f);
                tq.push_front(t);
                self.rx.drop(DropReason::NoMbuf, 1);
                break;
            };
            let Some(b) = m.fill(f.len()) else {
                oversize += 1;
                continue;
            };
            b.copy_from_slice(&f);
            pkts += 1;
            bytes += f.len() as u64;
            out.push(m);
            if let (true, Some(tun)) = (tunnel, tun.as_deref_mut()) {
                tun.push(t);
            }
        }
        drop(q);
        drop(tq);
        self.rx.add(pkts, bytes);
        self.rx.drop(DropReason::Runt, runts);
        self.rx.drop(DropReason::Oversize, oversize);
        pkts as usize
    }

    /// Captures `pkts`; returns (sent, dropped).
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64) {
        self.tx_bursts.fetch_add(1, Ordering::Relaxed);
        let up = self.link_up.load(Ordering::Relaxed);
        let mut room = self.tx_room.load(Ordering::Relaxed);
        let (mut sent, mut bytes, mut down, mut full) = (0u64, 0u64, 0u64, 0u64);
        let mut out = lock(&self.sent);
        let mut out_tun = lock(&self.sent_tun);
        let tunnel = self.tunnel.load(Ordering::Relaxed);
        for (k, m) in pkts.iter().enumerate() {
            if !up {
                down += 1;
            } else if room == 0 {
                full += 1;
            } else {
                if room != usize::MAX {
                    room -= 1;
                }
                out.push(m.data().to_vec());
                if tunnel {
                    out_tun.push(pkts.tunnel(k).copied());
                }
                sent += 1;
                bytes += m.len() as u64;
            }
        }
        drop(out);
        drop(out_tun);
        self.tx_room.store(room, Ordering::Relaxed);
        self.tx.add(sent, bytes);
        self.tx.drop(DropReason::KernelLinkDown, down);
        self.tx.drop(DropReason::KernelTxFull, full);
        (sent, down + full)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
