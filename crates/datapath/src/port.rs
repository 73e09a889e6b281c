//! Ports as the datapath sees them.
//!
//! A [`Port`] is immutable once published; its queues carry their own locks and counters.
//! Only vhost-user ports exist so far; TAP and uplink ports (issue "kernel ports") add
//! variants to [`PortIo`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrovs_vhost::device::Queue;
use ferrovs_vhost::stats::{DropReason, QueueStats, StatsSnapshot};

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
    /// Packets a PMD could not transmit because no queue of this port was ready.
    pub tx_not_ready: AtomicU64,
}

impl Port {
    /// Queue pairs the datapath polls.
    pub fn rx_queues(&self) -> usize {
        match &self.io {
            PortIo::Vhost { queues } => queues.len() / 2,
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
        }
        s
    }
}
