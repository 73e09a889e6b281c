//! Ports as the datapath sees them.
//!
//! A [`Port`] is immutable once published; its queues carry their own locks and counters.
//! [`PortIo`] says how packets move: vhost-user virtqueues, or one of the kernel port kinds
//! (a TAP device or an existing netdev over AF_PACKET, [`crate::kernel`]; a netdev over
//! AF_XDP, [`crate::xdp`]; a VXLAN or Geneve tunnel, [`crate::tunnel`]) behind the [`KernelPort`]
//! trait (`kernel_port.rs`). [`Port::rx_burst`] and [`Port::tx_burst`] are the two entry points the PMD uses,
//! whatever the kind: vhost-user queues are handled inline, a kernel port costs one
//! dynamic call per burst, never per packet.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferrovs_counters::{DropReason, QueueStats, StatsSnapshot};
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::device::Queue;
use ferrovs_vhost::virtqueue::{VirtQueue, BURST};

use crate::kernel::{TapIo, UplinkIo};
pub use crate::kernel_port::{KernelPort, TxPkts};
use crate::tunnel::TunnelIo;
use crate::xdp::XdpIo;

/// Most queues one PMD tracks with a deferred guest notification; past that, a burst that
/// would defer notifies at once instead.
pub const MAX_DEFERRED: usize = 256;

/// The queues where one PMD deferred a guest notification (coalescing), each with when it is
/// due: the PMD's timer ([`NotifyTimers::run`]) makes them on time, so no packet waits past
/// its queue's bound. Holds the queues themselves, not port ids: a notification deferred
/// before a port was removed or the datapath frozen (hot upgrade) is still made.
#[derive(Debug)]
pub struct NotifyTimers {
    list: Vec<(Arc<Queue>, u64)>,
    /// Earliest due TSC in `list`; `u64::MAX` when empty.
    earliest: u64,
}

impl Default for NotifyTimers {
    fn default() -> Self {
        NotifyTimers {
            list: Vec::with_capacity(MAX_DEFERRED),
            earliest: u64::MAX,
        }
    }
}

impl NotifyTimers {
    /// Notes that `q` has a notification due at TSC `due`. False when the list is full (the
    /// caller notifies now).
    #[inline]
    fn note(&mut self, q: &Arc<Queue>, due: u64) -> bool {
        if !self.list.iter().any(|(x, _)| Arc::ptr_eq(x, q)) {
            if self.list.len() == self.list.capacity() {
                return false;
            }
            self.list.push((q.clone(), due));
        }
        self.earliest = self.earliest.min(due);
        true
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// TSC of the earliest deferred notification (`u64::MAX`: none).
    #[inline]
    pub fn earliest(&self) -> u64 {
        self.earliest
    }

    /// Makes the notifications due at TSC `now`. A queue busy in another thread's burst is
    /// tried again at the next iteration.
    #[inline]
    pub fn run(&mut self, now: u64) {
        if now < self.earliest {
            return;
        }
        self.earliest = u64::MAX;
        let mut i = 0;
        while i < self.list.len() {
            let (q, due) = &self.list[i];
            // Busy (another thread's burst): the due time stays past, so the next iteration
            // tries again. Else `None`: made (or made by another PMD); drop the entry.
            let next = if now < *due {
                Some(*due)
            } else {
                match q.try_lock().ok_or(()) {
                    Err(_) => Some(*due),
                    Ok(mut vq) => {
                        let still = vq.flush_due(now, &q.stats);
                        vq.deferred_until().filter(|_| still)
                    }
                }
            };
            match next {
                Some(d) => {
                    self.list[i].1 = d;
                    self.earliest = self.earliest.min(d);
                    i += 1;
                }
                None => {
                    self.list.swap_remove(i);
                }
            }
        }
    }

    /// Makes every deferred notification now (the PMD stops, or has no queue left).
    pub fn flush_all(&mut self) {
        for (q, _) in self.list.drain(..) {
            q.lock().flush(&q.stats);
        }
        self.earliest = u64::MAX;
    }
}

/// VLAN behaviour of a port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum VlanMode {
    /// Untagged frames belong to this VLAN; tagged frames are dropped.
    Access(u16),
    /// Carries tagged frames of the listed VLANs (empty: all); untagged frames are VLAN 0.
    #[default]
    Trunk,
    TrunkOf(Vec<u16>),
}

impl VlanMode {
    /// Whether the port carries `vlan`.
    #[inline]
    pub fn carries(&self, vlan: u16) -> bool {
        match self {
            VlanMode::Access(t) => *t == vlan,
            VlanMode::Trunk => true,
            VlanMode::TrunkOf(l) => vlan == 0 || l.contains(&vlan),
        }
    }
}

/// How a port moves packets.
#[derive(Debug)]
pub enum PortIo {
    /// A vhost-user port: queues in virtio order (even: guest RX, odd: guest TX).
    Vhost { queues: Vec<Arc<Queue>> },
    /// A TAP device: one queue each way.
    Tap(TapIo),
    /// An existing netdev over AF_PACKET: one queue each way.
    Uplink(UplinkIo),
    /// An existing netdev over AF_XDP: one queue each way.
    Xdp(Box<XdpIo>),
    /// A VXLAN or Geneve tunnel over the host stack: one queue each way.
    Tunnel(TunnelIo),
    /// An in-memory port for the datapath's own tests ([`crate::dummy`]).
    #[cfg(test)]
    Dummy(crate::dummy::DummyIo),
}

impl PortIo {
    /// The kernel port behind this one; `None` for vhost-user.
    #[inline]
    pub fn kernel(&self) -> Option<&dyn KernelPort> {
        match self {
            PortIo::Vhost { .. } => None,
            PortIo::Tap(t) => Some(t),
            PortIo::Uplink(u) => Some(u),
            PortIo::Xdp(x) => Some(&**x),
            PortIo::Tunnel(v) => Some(v),
            #[cfg(test)]
            PortIo::Dummy(d) => Some(d),
        }
    }

    /// How the port moves packets, as `ferrovs show` reports it.
    pub fn mode(&self) -> &'static str {
        self.kernel().map_or("vhost-user", |k| k.mode())
    }
}

/// One port.
#[derive(Debug)]
pub struct Port {
    pub id: u32,
    pub name: String,
    pub bridge: u32,
    pub vlan: VlanMode,
    pub io: PortIo,
    /// Drops decided by the switch (not by a queue) for packets received on this port.
    pub rx_drops: QueueStats,
    /// Packets a PMD could not transmit because no queue of this port was ready (vhost-user).
    pub tx_not_ready: AtomicU64,
    /// Offload work done in software for packets sent to this port.
    pub offload: OffloadStats,
    /// Frames the control plane hands the datapath as if this port had received them.
    pub inject: Inject,
    /// Packet capture (`ferrovs capture`): one relaxed load per burst while off.
    pub capture: crate::capture::CaptureHook,
    /// Processing cycles of each rx queue, charged by the PMD polling it ([`crate::rxq`]).
    pub rxq_load: crate::rxq::RxqLoads,
}

/// Frames injected as if received from a port (the RARP announcing a guest that migrated
/// to it): taken by the PMD that polls the port's first queue pair, never waiting for the
/// control plane (`try_lock`, and an atomic flag checked first).
#[derive(Debug, Default)]
pub struct Inject {
    pending: AtomicBool,
    frames: Mutex<Vec<Vec<u8>>>,
}

impl Inject {
    /// Most frames waiting at a time (more are dropped).
    const MAX: usize = 16;

    /// Queues `frame` (control plane).
    pub fn push(&self, frame: &[u8]) {
        let mut q = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() < Self::MAX {
            q.push(frame.to_vec());
        }
        self.pending.store(true, Ordering::Release);
    }

    /// Moves waiting frames into buffers from `pool`, appended to `out` (PMD).
    #[inline]
    fn take_into<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>) {
        if !self.pending.load(Ordering::Relaxed) {
            return;
        }
        self.take_slow(pool, out);
    }

    #[cold]
    fn take_slow<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>) {
        let Ok(mut q) = self.frames.try_lock() else {
            return;
        };
        while out.len() < out.capacity() {
            let Some(f) = q.pop() else { break };
            let Some(mut m) = pool.alloc() else {
                q.push(f);
                break;
            };
            match m.fill(f.len()) {
                Some(b) => {
                    b.copy_from_slice(&f);
                    out.push(m);
                }
                None => continue,
            }
        }
        self.pending.store(!q.is_empty(), Ordering::Release);
    }
}

/// Offloads done in software because the output port could not take the packet's offload
/// metadata (a guest without the feature, an uplink).
#[derive(Debug, Default)]
pub struct OffloadStats {
    /// Partial checksums completed.
    pub sw_csum: AtomicU64,
    /// TSO packets segmented.
    pub sw_tso: AtomicU64,
    /// Segments those made.
    pub sw_segments: AtomicU64,
}

impl OffloadStats {
    /// `[sw_csum, sw_tso, sw_segments]`.
    pub fn get(&self) -> [u64; 3] {
        [&self.sw_csum, &self.sw_tso, &self.sw_segments].map(|a| a.load(Ordering::Relaxed))
    }

    /// Adds counters carried over a hot upgrade.
    pub fn restore(&self, v: [u64; 3]) {
        for (a, v) in [&self.sw_csum, &self.sw_tso, &self.sw_segments]
            .into_iter()
            .zip(v)
        {
            a.fetch_add(v, Ordering::Relaxed);
        }
    }
}

impl Port {
    /// Injects `frame` as if received from this port (control plane: the RARP announcing a
    /// guest that migrated here). The first rx queue's lock is taken and released once after
    /// queuing it: the lock count moves, so a PMD whose idle probe (`idle_probe.rs`) knew
    /// the queue empty runs a full poll next, and that poll takes the frame. The probe does
    /// not read the inject flag itself (one cache line less per idle queue).
    pub fn inject_frame(&self, frame: &[u8]) {
        self.inject.push(frame);
        if let PortIo::Vhost { queues } = &self.io {
            if let Some(q) = queues.get(1) {
                drop(q.lock());
            }
        }
    }

    /// Tunnel metadata of what this port receives (tunnel ports).
    #[inline]
    pub fn tunnel_key(&self) -> Option<ferrovs_flow::TunnelKey> {
        self.io.kernel().and_then(|k| k.tunnel_key())
    }

    /// Whether packets sent to this port carry their tunnel metadata to it (a tunnel port
    /// with `key=flow`, see [`crate::tunnel`]).
    #[inline]
    pub fn takes_tunnel_metadata(&self) -> bool {
        self.io.kernel().is_some_and(|k| k.takes_tunnel_metadata())
    }

    /// Queue pairs the datapath polls.
    pub fn rx_queues(&self) -> usize {
        match &self.io {
            PortIo::Vhost { queues } => queues.len() / 2,
            _ => 1,
        }
    }

    /// What the port accepts of a packet's offload metadata (`vnet::caps` bits): for a
    /// vhost-user port what its guest negotiated, for a TAP everything, for an uplink
    /// nothing. The PMD does the rest in software before [`Port::tx_burst`].
    #[inline]
    pub fn tx_caps(&self) -> u8 {
        match &self.io {
            PortIo::Vhost { queues } => queues
                .first()
                .map_or(0, |q| q.rx_caps.load(Ordering::Relaxed)),
            io => io.kernel().map_or(0, |k| k.tx_caps()),
        }
    }

    /// Receives a burst from queue pair `pair` into buffers from `pool`, appended to `out`;
    /// returns how many. A queue that is not ready, or is being reconfigured, gives nothing.
    #[inline]
    pub fn rx_burst<'p>(
        &self,
        pair: u16,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        timers: &mut NotifyTimers,
    ) -> usize {
        self.rx_burst_tunnel(pair, pool, out, None, timers)
    }

    /// [`Port::rx_burst`], with a tunnel port's per-frame tunnel metadata appended to `tun`
    /// (one per frame it appended to `out`; other ports leave `tun` alone).
    #[inline]
    pub fn rx_burst_tunnel<'p>(
        &self,
        pair: u16,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        tun: Option<&mut Vec<ferrovs_flow::TunnelKey>>,
        timers: &mut NotifyTimers,
    ) -> usize {
        let start = out.len();
        let n = self.rx_burst_io(pair, pool, out, tun, timers);
        if let Some(got) = out.get(start..) {
            self.capture.offer(crate::capture::Dir::In, got.iter());
        }
        n
    }

    #[inline]
    fn rx_burst_io<'p>(
        &self,
        pair: u16,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        tun: Option<&mut Vec<ferrovs_flow::TunnelKey>>,
        timers: &mut NotifyTimers,
    ) -> usize {
        match &self.io {
            PortIo::Vhost { queues } => {
                if pair == 0 {
                    self.inject.take_into(pool, out);
                }
                let Some(q) = queues.get(2 * pair as usize + 1) else {
                    return out.len();
                };
                if !q.ready.load(Ordering::Acquire) {
                    return out.len();
                }
                let Some(mut vq) = q.try_lock() else {
                    return 0;
                };
                vq.dequeue(pool, out, BURST, &q.stats, &self.name);
                defer_or_flush(q, &mut vq, timers);
                out.len()
            }
            io => io
                .kernel()
                .map_or(0, |k| k.rx_burst_tunnel(pool, out, BURST, tun)),
        }
    }

    /// Transmits `pkts` from PMD `pmd`; returns (sent, dropped). Every packet not sent is
    /// counted by reason in this port's counters. A packet's offload metadata must be what
    /// [`Port::tx_caps`] accepts.
    #[inline]
    pub fn tx_burst(
        &self,
        pmd: usize,
        pkts: TxPkts<'_, '_>,
        timers: &mut NotifyTimers,
    ) -> (u64, u64) {
        let n = pkts.len();
        self.capture.offer(crate::capture::Dir::Out, pkts.iter());
        match &self.io {
            PortIo::Vhost { queues } => {
                let pairs = queues.len() / 2;
                // Each PMD prefers its own queue pair; any ready one will do.
                let q = (0..pairs)
                    .map(|k| &queues[2 * ((pmd + k) % pairs)])
                    .find(|q| q.ready.load(Ordering::Acquire));
                let Some(q) = q else {
                    self.tx_not_ready.fetch_add(n as u64, Ordering::Relaxed);
                    return (0, n as u64);
                };
                let (sent, why) = {
                    let mut vq = q.lock();
                    let sent = vq.enqueue(
                        pkts.iter().map(|m| (m.data(), m.vnet)),
                        &q.stats,
                        &self.name,
                    );
                    defer_or_flush(q, &mut vq, timers);
                    (sent, vq.shortfall())
                };
                let dropped = (n - sent) as u64;
                q.stats.drop(why, dropped);
                (sent as u64, dropped)
            }
            io => match io.kernel() {
                Some(k) => k.tx_burst(pkts),
                None => (0, n as u64),
            },
        }
    }

    /// A kernel port's counters: `[to the kernel, from the kernel]`; `None` for vhost-user
    /// ports (their counters are per queue).
    pub fn kernel_stats(&self) -> Option<[&QueueStats; 2]> {
        self.io.kernel().map(|k| k.stats())
    }

    /// Adds the drops a kernel port's kernel counted on its side (AF_XDP's
    /// `XDP_STATISTICS`) to its counters: a system call, for the control thread's tick.
    pub fn poll_kernel_drops(&self) {
        if let Some(k) = self.io.kernel() {
            k.poll_kernel_drops();
        }
    }

    /// Counters of packets received from the port (guest TX), summed over queues.
    pub fn rx_stats(&self) -> StatsSnapshot {
        let mut s = self.rx_drops.snapshot();
        match &self.io {
            PortIo::Vhost { queues } => {
                for q in queues.iter().skip(1).step_by(2) {
                    s.merge(&q.stats.snapshot());
                }
            }
            io => {
                if let Some(k) = io.kernel() {
                    s.merge(&k.stats()[1].snapshot());
                }
            }
        }
        s
    }

    /// Counters of packets sent to the port (guest RX), summed over queues.
    pub fn tx_stats(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot::default();
        s.drops[DropReason::NotReady as usize] = self.tx_not_ready.load(Ordering::Relaxed);
        match &self.io {
            PortIo::Vhost { queues } => {
                for q in queues.iter().step_by(2) {
                    s.merge(&q.stats.snapshot());
                }
            }
            io => {
                if let Some(k) = io.kernel() {
                    s.merge(&k.stats()[0].snapshot());
                }
            }
        }
        s
    }
}

/// After a burst on `q`: a notification coalescing deferred goes to the PMD's timers (or is
/// made now if they are full).
#[inline]
fn defer_or_flush(q: &Arc<Queue>, vq: &mut VirtQueue, timers: &mut NotifyTimers) {
    if let Some(due) = vq.deferred_until() {
        if !timers.note(q, due) {
            vq.flush(&q.stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{dummy_port, frame, mac, BCAST};

    #[test]
    fn vlan_modes_carry_their_vlans() {
        assert!(VlanMode::Access(10).carries(10));
        assert!(!VlanMode::Access(10).carries(0));
        assert!(VlanMode::Trunk.carries(0) && VlanMode::Trunk.carries(4094));
        let t = VlanMode::TrunkOf(vec![10, 20]);
        assert!(t.carries(0) && t.carries(10) && t.carries(20));
        assert!(!t.carries(30));
    }

    #[test]
    fn a_kernel_shaped_port_receives_sends_and_counts() {
        let pool = Pool::new(64).unwrap();
        let p = dummy_port(3, VlanMode::Trunk, ferrovs_sys::kernel::vnet::caps::ALL);
        assert_eq!(p.io.mode(), "dummy");
        assert_eq!(p.rx_queues(), 1);
        assert_eq!(p.tx_caps(), ferrovs_sys::kernel::vnet::caps::ALL);
        assert!(p.tunnel_key().is_none());
        let PortIo::Dummy(d) = &p.io else {
            unreachable!()
        };
        let f = frame(BCAST, mac(1), None, 7);
        d.push_rx(&f);
        d.push_rx(&[1, 2, 3]);
        let mut timers = NotifyTimers::default();
        let mut out = Vec::with_capacity(BURST);
        assert_eq!(p.rx_burst(0, &pool, &mut out, &mut timers), 1);
        assert_eq!(out[0].data(), &f[..]);
        let (sent, dropped) = p.tx_burst(0, TxPkts::new(&[0], &out, &[]), &mut timers);
        assert_eq!((sent, dropped), (1, 0));
        assert_eq!(d.take_sent(), vec![f.clone()]);
        d.set_link(false);
        assert_eq!(
            p.tx_burst(0, TxPkts::new(&[0], &out, &[]), &mut timers),
            (0, 1)
        );
        // Switch drops and the port's own counters meet in rx_stats / tx_stats.
        p.rx_drops.drop(DropReason::Vlan, 2);
        let rx = p.rx_stats();
        assert_eq!((rx.packets, rx.bytes), (1, f.len() as u64));
        assert_eq!(rx.drops[DropReason::Runt as usize], 1);
        assert_eq!(rx.drops[DropReason::Vlan as usize], 2);
        let tx = p.tx_stats();
        assert_eq!(tx.packets, 1);
        assert_eq!(tx.drops[DropReason::KernelLinkDown as usize], 1);
        let [ktx, krx] = p.kernel_stats().unwrap();
        assert_eq!(
            (
                ktx.packets.load(Ordering::Relaxed),
                krx.drops(DropReason::Runt)
            ),
            (1, 1)
        );
        assert!(timers.is_empty());
        drop(out);
        assert_eq!(pool.available(), 64);
    }

    #[test]
    fn a_vhost_port_without_ready_queues_counts_not_ready_and_takes_injected_frames() {
        let pool = Pool::new(64).unwrap();
        let p = Port {
            io: PortIo::Vhost { queues: Vec::new() },
            ..dummy_port(0, VlanMode::Trunk, 0)
        };
        assert_eq!(p.io.mode(), "vhost-user");
        assert_eq!((p.rx_queues(), p.tx_caps()), (0, 0));
        assert!(p.kernel_stats().is_none());
        let mut timers = NotifyTimers::default();
        let mut out = Vec::with_capacity(BURST);
        assert_eq!(p.rx_burst(0, &pool, &mut out, &mut timers), 0);
        // A frame the control plane injects (a RARP after migration) arrives on pair 0.
        let rarp = ferrovs_packet::rarp_announce(mac(1));
        p.inject.push(&rarp);
        assert_eq!(p.rx_burst(1, &pool, &mut out, &mut timers), 0);
        assert_eq!(p.rx_burst(0, &pool, &mut out, &mut timers), 1);
        assert_eq!(out[0].data(), &rarp[..]);
        assert_eq!(p.rx_burst(0, &pool, &mut out, &mut timers), 1);
        // No ready queue to send on: every packet counts as queue_not_ready.
        assert_eq!(
            p.tx_burst(0, TxPkts::new(&[0], &out, &[]), &mut timers),
            (0, 1)
        );
        assert_eq!(p.tx_stats().drops[DropReason::NotReady as usize], 1);
        drop(out);
        assert_eq!(pool.available(), 64);
    }

    #[test]
    fn injected_frames_are_bounded() {
        let pool = Pool::new(64).unwrap();
        let inject = Inject::default();
        for i in 0..Inject::MAX + 5 {
            inject.push(&frame(BCAST, mac(i as u8), None, 0));
        }
        let mut out = Vec::with_capacity(BURST);
        inject.take_into(&pool, &mut out);
        assert_eq!(out.len(), Inject::MAX);
        out.clear();
        inject.take_into(&pool, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn timers_with_nothing_deferred_do_nothing() {
        let mut t = NotifyTimers::default();
        assert!(t.is_empty());
        assert_eq!(t.earliest(), u64::MAX);
        t.run(u64::MAX - 1);
        t.flush_all();
        assert!(t.is_empty());
    }
}
