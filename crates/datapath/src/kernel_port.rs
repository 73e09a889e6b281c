//! The kernel-port trait: what the PMD needs of a port that is not a vhost-user device (a TAP,
//! a netdev over AF_PACKET or AF_XDP, a VXLAN tunnel, the in-memory dummy port), and the
//! packets a transmit burst takes ([`TxPkts`]).
//!
//! A file of its own so that the port kinds ([`crate::kernel`], [`crate::xdp`],
//! [`crate::tunnel`], [`crate::dummy`]) and [`crate::port`], which holds them in
//! [`crate::PortIo`], depend on it and not on each other.
//!
//! Thread-safety: a port is shared by every PMD (`&self` everywhere): an implementation
//! guards its receive side (one reader at a time, `try_lock`) and lets any PMD transmit.

use std::os::fd::BorrowedFd;

use ferrovs_counters::QueueStats;
use ferrovs_flow::TunnelKey;
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::virtqueue::BURST;

/// The packets of one burst chosen for one port, in order: indices into the burst's
/// received packets (`i < BURST`) and the copies and segments it made (`BURST + k`).
///
/// For a port that takes per-packet tunnel metadata ([`KernelPort::takes_tunnel_metadata`])
/// `tun` holds, for each packet, an index into `meta` (the burst's tunnel metadata table), or
/// [`NO_TUNNEL`]; for every other port it is empty.
#[derive(Debug, Clone, Copy)]
pub struct TxPkts<'a, 'p> {
    idx: &'a [u16],
    batch: &'a [Mbuf<'p>],
    extra: &'a [Mbuf<'p>],
    tun: &'a [u16],
    meta: &'a [TunnelKey],
}

/// A packet without tunnel metadata of its own (a flow-based tunnel port sends it with VNI 0
/// and no option).
pub const NO_TUNNEL: u16 = u16::MAX;

impl<'a, 'p> TxPkts<'a, 'p> {
    /// Packets `idx` of `batch` (below `BURST`) and `extra` (from `BURST` on).
    #[inline]
    pub fn new(idx: &'a [u16], batch: &'a [Mbuf<'p>], extra: &'a [Mbuf<'p>]) -> Self {
        TxPkts {
            idx,
            batch,
            extra,
            tun: &[],
            meta: &[],
        }
    }

    /// With per-packet tunnel metadata: packet `k`'s is `meta[tun[k]]`.
    #[inline]
    pub fn with_tunnel(self, tun: &'a [u16], meta: &'a [TunnelKey]) -> Self {
        TxPkts { tun, meta, ..self }
    }

    /// The tunnel metadata of the `k`-th packet, if it has any.
    #[inline]
    pub fn tunnel(&self, k: usize) -> Option<&'a TunnelKey> {
        let meta = self.meta;
        self.tun.get(k).and_then(move |&t| meta.get(usize::from(t)))
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.idx.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.idx.is_empty()
    }

    /// The packets, in order.
    #[inline]
    pub fn iter(self) -> impl Iterator<Item = &'a Mbuf<'p>> + 'a
    where
        'p: 'a,
    {
        let (batch, extra) = (self.batch, self.extra);
        self.idx.iter().map(move |&i| {
            let i = usize::from(i);
            if i < BURST {
                &batch[i]
            } else {
                &extra[i - BURST]
            }
        })
    }
}

/// A kernel port kind (TAP, AF_PACKET, AF_XDP, VXLAN, and the in-memory dummy port): one
/// queue each way, polled by a PMD in bursts, with a receive and a transmit counter.
///
/// Called once per burst through `&dyn KernelPort` ([`crate::PortIo::kernel`]); implementations
/// allocate nothing per packet and count every frame they do not deliver by reason in
/// their [`KernelPort::stats`].
pub trait KernelPort {
    /// How the port moves packets, as `ferrovs show` reports it (`mode`).
    fn mode(&self) -> &'static str;

    /// Receives up to `max` (at most `BURST`) frames into buffers from `pool`, appended to
    /// `out`; returns how many.
    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize;

    /// Transmits `pkts`; returns (sent, dropped). Their offload metadata is what
    /// [`KernelPort::tx_caps`] accepts.
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64);

    /// What the port accepts of a packet's offload metadata (`vnet::caps` bits).
    #[inline]
    fn tx_caps(&self) -> u8 {
        0
    }

    /// The port's counters: `[to the port, from the port]`.
    fn stats(&self) -> [&QueueStats; 2];

    /// An fd that is readable (level-triggered) while frames wait, for a PMD to sleep on;
    /// `None`: the PMD cannot sleep on this port and keeps polling.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>>;

    /// Adds the drops the kernel counted on its side since the last call to the receive
    /// counters (a system call: the control thread's periodic tick, never a PMD).
    fn poll_kernel_drops(&self) {}

    /// Tunnel metadata of what the port receives (tunnel ports): what every frame's starts
    /// from ([`KernelPort::rx_burst_tunnel`] gives each frame's own).
    #[inline]
    fn tunnel_key(&self) -> Option<TunnelKey> {
        None
    }

    /// [`KernelPort::rx_burst`], with each received frame's tunnel metadata appended to
    /// `tun` (one per frame, in order) by a tunnel port; other ports leave it alone.
    #[inline]
    fn rx_burst_tunnel<'p>(
        &self,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        _tun: Option<&mut Vec<TunnelKey>>,
    ) -> usize {
        self.rx_burst(pool, out, max)
    }

    /// Whether [`KernelPort::tx_burst`] wants each packet's tunnel metadata
    /// ([`TxPkts::tunnel`]): a tunnel port with `key=flow`.
    #[inline]
    fn takes_tunnel_metadata(&self) -> bool {
        false
    }
}
