//! The ferrovs datapath: PMD threads that poll port queues in bursts, switch packets through
//! the bridge, and transmit them — with no allocation, lock or system call per packet.
//!
//! * [`port`]: ports as the datapath sees them (vhost-user queues, TAP, AF_PACKET uplinks).
//! * [`kernel_port`]: the trait every kernel port kind implements (bursts each way,
//!   counters, an fd to sleep on).
//! * [`kernel`]: the kernel ports' bursts (TAP devices, netdevs over AF_PACKET).
//! * [`xdp`]: netdevs over AF_XDP (the uplink's first choice).
//! * [`tunnel`]: VXLAN and Geneve tunnel ports over the host stack; [`geneve`]: the Geneve
//!   header as a checked view, and its encoding.
//! * [`capture`]: packet capture on a port: the per-burst hook, the cBPF filter, the ring.
//! * [`dummy`]: an in-memory port (frames queued in, frames captured out) for tests.
//! * [`mac_table`]: the lock-free MAC learning table of a bridge.
//! * [`meter`]: a bridge's OpenFlow meters (token buckets with drop bands).
//! * [`l2`]: the learning-bridge decision for one packet (VLAN access/trunk, flood, learn).
//! * [`flow`]: bridges with OpenFlow-style rules: exact-match cache, megaflow cache, upcalls
//!   to the rule tables, action execution.
//! * `output`: the output stage of a burst: per-port lists, VLAN-edited copies, software
//!   offloads, one transmit per port.
//! * [`pmd`]: the poll-mode thread loop and its cycle accounting.
//! * [`rxq`]: rx queues' measured load and their assignment to PMDs (`pmd-rxq-assign`).
//! * [`Datapath`]: what the control plane publishes, RCU-style through `arc-swap`: a new
//!   [`Snapshot`] replaces the old one atomically; PMDs pick it up at the next iteration and
//!   the old one is freed when the last PMD lets go of it.
//!
//! This crate depends on no control-plane code (no serde, no config parsing, no async).
#![forbid(unsafe_code)]

pub mod capture;
pub mod dummy;
pub mod flow;
pub mod geneve;
mod idle_probe;
pub mod kernel;
pub mod kernel_port;
pub mod l2;
pub mod mac_table;
pub mod meter;
mod output;
pub mod packet_io;
pub mod pmd;
pub mod port;
pub mod quiet;
pub mod rxq;
#[cfg(test)]
mod testutil;
pub mod tunnel;
pub mod xdp;

use std::sync::Arc;

use arc_swap::ArcSwap;

pub use kernel::{TapIo, UplinkIo};
pub use mac_table::MacTable;
pub use pmd::{PmdHandle, PmdStats};
pub use port::{KernelPort, NotifyTimers, Port, PortIo, TxPkts, VlanMode};
pub use tunnel::{Encap, TlvTable, TunnelEndpoint, TunnelIo, TunnelVni, VxlanIo};
pub use xdp::XdpIo;

/// A bridge as the datapath sees it.
#[derive(Debug)]
pub struct Bridge {
    pub name: String,
    pub macs: Arc<MacTable>,
    /// Ports of this bridge (indices into [`Snapshot::ports`]).
    pub ports: Vec<u32>,
    /// The rule pipeline and its caches; `None` while the only rule is the default
    /// `actions=NORMAL` (plain L2 switching, no flow keys).
    pub flows: Option<flow::BridgeFlows>,
    /// The default rule's counters, counted per burst on the plain L2 path.
    pub default_rule: Option<Arc<ferrovs_flow::RuleStats>>,
}

/// One rx queue assigned to a PMD: a port and its queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxqRef {
    pub port: u32,
    pub pair: u16,
}

/// Everything a PMD needs, immutable once published.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Indexed by bridge id; `None` for a deleted bridge's slot.
    pub bridges: Vec<Option<Arc<Bridge>>>,
    /// Indexed by port id; `None` for a deleted port's slot.
    pub ports: Vec<Option<Arc<Port>>>,
    /// Rx queues each PMD polls.
    pub pmd_rxqs: Vec<Vec<RxqRef>>,
}

impl Snapshot {
    #[inline]
    pub fn bridge(&self, id: u32) -> Option<&Arc<Bridge>> {
        self.bridges.get(id as usize).and_then(|b| b.as_ref())
    }

    #[inline]
    pub fn port(&self, id: u32) -> Option<&Arc<Port>> {
        self.ports.get(id as usize).and_then(|p| p.as_ref())
    }
}

/// The published datapath configuration.
#[derive(Debug, Default)]
pub struct Datapath {
    snap: ArcSwap<Snapshot>,
    /// Hot-upgrade standby: PMDs park (no spinning beside the old daemon's PMDs on the same
    /// cores) until [`PmdHandle::wake`] after the takeover.
    standby: std::sync::atomic::AtomicBool,
    /// [`RxMode`] of every PMD.
    rx_mode: std::sync::atomic::AtomicU8,
    /// Adaptive mode: idle time before sleeping, in ns (0: the default, 300 us).
    sleep_after_ns: std::sync::atomic::AtomicU64,
    /// Load-based sleep maximum in ns (0: off), as OVS `pmd-maxsleep`.
    sleep_max_ns: std::sync::atomic::AtomicU64,
    /// Interval between polls of quiet rx queues while a PMD is busy, in ns (0: every queue
    /// every iteration; the daemon sets its default, [`quiet::DEFAULT_POLL_US`]).
    quiet_poll_ns: std::sync::atomic::AtomicU64,
    /// EMC insertion probability: 1 in this, plus one (0: the default, 100).
    emc_inv_prob: std::sync::atomic::AtomicU64,
    /// Packet-outs waiting for a PMD ([`packet_io`]).
    packet_out: packet_io::PacketOutQueue,
}

/// How PMDs wait for packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxMode {
    /// Poll while busy; after an idle threshold, ask the guests to kick and sleep until one
    /// does (or a port is added, or 10 ms pass).
    #[default]
    Adaptive,
    /// Always busy-poll (lowest latency, a full core always).
    Poll,
    /// Sleep as soon as a poll finds nothing.
    Interrupt,
}

impl RxMode {
    pub fn name(self) -> &'static str {
        match self {
            RxMode::Adaptive => "adaptive",
            RxMode::Poll => "poll",
            RxMode::Interrupt => "interrupt",
        }
    }

    pub fn parse(s: &str) -> Option<RxMode> {
        [RxMode::Adaptive, RxMode::Poll, RxMode::Interrupt]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

/// Default idle time before an adaptive PMD sleeps.
pub const DEFAULT_SLEEP_AFTER_US: u64 = 300;

impl Datapath {
    /// The packet-out queue every PMD drains ([`packet_io::PacketOutQueue`]).
    pub fn packet_out(&self) -> &packet_io::PacketOutQueue {
        &self.packet_out
    }

    pub fn new() -> Datapath {
        Datapath::default()
    }

    /// Sets the exact-match caches' insertion probability to 1 in `p` (0: EMC off).
    pub fn set_emc_insert_inv_prob(&self, p: u32) {
        self.emc_inv_prob
            .store(u64::from(p) + 1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The EMC insertion probability's inverse (see [`Datapath::set_emc_insert_inv_prob`]).
    #[inline]
    pub fn emc_insert_inv_prob(&self) -> u32 {
        match self.emc_inv_prob.load(std::sync::atomic::Ordering::Relaxed) {
            0 => flow::emc::DEFAULT_INSERT_INV_PROB,
            p => (p - 1) as u32,
        }
    }

    /// Publishes a new snapshot; PMDs use it from their next iteration.
    pub fn publish(&self, s: Snapshot) {
        self.snap.store(Arc::new(s));
    }

    /// Sets how PMDs wait for packets; `sleep_after_us` is the adaptive idle threshold.
    pub fn set_rx_mode(&self, mode: RxMode, sleep_after_us: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = match mode {
            RxMode::Adaptive => 0,
            RxMode::Poll => 1,
            RxMode::Interrupt => 2,
        };
        self.sleep_after_ns.store(sleep_after_us * 1000, Relaxed);
        self.rx_mode.store(m, Relaxed);
    }

    /// The current mode and adaptive threshold (ns).
    #[inline]
    pub fn rx_mode(&self) -> (RxMode, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let mode = match self.rx_mode.load(Relaxed) {
            1 => RxMode::Poll,
            2 => RxMode::Interrupt,
            _ => RxMode::Adaptive,
        };
        let ns = match self.sleep_after_ns.load(Relaxed) {
            0 => DEFAULT_SLEEP_AFTER_US * 1000,
            n => n,
        };
        (mode, ns)
    }

    /// Sets the load-based sleep maximum (0: off): a PMD whose queues give less than half a
    /// burst sleeps 1 us more each iteration up to this, and polls flat out again as soon as
    /// one gives more (OVS `pmd-maxsleep`). Works in poll and adaptive mode.
    pub fn set_sleep_max_us(&self, us: u64) {
        self.sleep_max_ns
            .store(us * 1000, std::sync::atomic::Ordering::Relaxed);
    }

    /// The load-based sleep maximum in ns (0: off).
    #[inline]
    pub fn sleep_max_ns(&self) -> u64 {
        self.sleep_max_ns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets how often a busy PMD polls its quiet rx queues (`quiet.rs`), in µs; 0 polls
    /// every queue every iteration.
    pub fn set_quiet_rxq_poll_us(&self, us: u64) {
        self.quiet_poll_ns
            .store(us * 1000, std::sync::atomic::Ordering::Relaxed);
    }

    /// The quiet-queue poll interval in ns (0: off).
    #[inline]
    pub fn quiet_rxq_poll_ns(&self) -> u64 {
        self.quiet_poll_ns
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Enters or leaves standby (see the field).
    pub fn set_standby(&self, on: bool) {
        self.standby.store(on, std::sync::atomic::Ordering::Release);
    }

    /// Whether the PMDs park (a new daemon before the resume): a parked PMD holds no
    /// snapshot, so the control plane need not wait for it to finish an iteration.
    #[inline]
    pub fn standby(&self) -> bool {
        self.standby.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The current snapshot.
    pub fn load(&self) -> Arc<Snapshot> {
        self.snap.load_full()
    }

    pub(crate) fn guard(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snap.load()
    }
}

/// Every rx queue of `ports`, in port order.
pub fn all_rxqs(ports: &[Option<Arc<Port>>]) -> Vec<RxqRef> {
    ports
        .iter()
        .flatten()
        .flat_map(|p| {
            (0..p.rx_queues()).map(|pair| RxqRef {
                port: p.id,
                pair: pair as u16,
            })
        })
        .collect()
}

/// Spreads rx queues over `pmds` PMDs round-robin (`pmd-rxq-assign=roundrobin`; the control
/// plane deals them by load with [`rxq::assign`]).
pub fn assign_rxqs(ports: &[Option<Arc<Port>>], pmds: usize) -> Vec<Vec<RxqRef>> {
    let qs: Vec<rxq::RxqInfo> = all_rxqs(ports)
        .into_iter()
        .map(|rxq| rxq::RxqInfo {
            rxq,
            load: 0,
            pin: None,
        })
        .collect();
    rxq::assign(rxq::AssignMode::RoundRobin, &qs, pmds)
}
