//! Packet counters shared by every port kind: one counter per drop reason, as VPP counts its
//! errors (`foreach_l2fwd_error`), and packets, bytes and guest notifications per queue.
//!
//! vhost-user queues ([`QueueStats`] per virtqueue) and the datapath's kernel ports (TAP,
//! AF_PACKET, AF_XDP, VXLAN: one [`QueueStats`] per direction) count into the same types, so
//! the CLI, metrics and the hot-upgrade state see one shape whatever the port.
//!
//! Thread-safety: writers add once per burst (`fetch_add`, relaxed); readers (the control
//! plane) may see counters of one burst at slightly different moments, never torn values.
//!
//! With the `serde` feature (the control plane's; the datapath builds this crate without it)
//! a [`StatsSnapshot`] is (de)serialisable as the hot-upgrade wire format carries counters
//! (`docs/upgrade.md`): `packets`, `bytes`, `calls`, `calls_suppressed`, `calls_coalesced`
//! and `drops`, the non-zero drop counters as `[name, count]` pairs. Its field names are
//! therefore wire names. `dirty_pages` does not travel (a new daemon counts a migration's
//! pages afresh), and a drop reason this version does not know is left out of the
//! counters rather than refused: counters are not worth failing an upgrade for.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! reasons {
    ($($name:ident => $text:literal),* $(,)?) => {
        /// Why a packet (or a guest buffer) was dropped or refused.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum DropReason { $($name),* }
        impl DropReason {
            pub const ALL: &'static [DropReason] = &[$(DropReason::$name),*];
            /// Stable name used by the CLI, metrics and the hot-upgrade state.
            pub fn name(self) -> &'static str {
                match self { $(DropReason::$name => $text),* }
            }
            /// The reason of that [`name`](Self::name), if this version knows it.
            pub fn from_name(name: &str) -> Option<DropReason> {
                match name { $($text => Some(DropReason::$name),)* _ => None }
            }
        }
    };
}

reasons! {
    NoMbuf => "no_mbuf",
    GuestNoBuffers => "guest_no_rx_buffers",
    Oversize => "oversize",
    Runt => "runt",
    BadDescIndex => "bad_desc_index",
    ChainLoop => "desc_chain_loop",
    BadIndirect => "bad_indirect_desc",
    OutOfGuestMemory => "desc_out_of_guest_memory",
    WrongDirection => "desc_wrong_direction",
    BadAvailIdx => "bad_avail_idx",
    GuestMemoryFault => "guest_memory_fault",
    QueueBroken => "queue_broken",
    NotReady => "queue_not_ready",
    NoRoute => "no_route",
    Vlan => "vlan_mismatch",
    TxError => "tx_error",
    RxError => "rx_error",
    KernelTxFull => "kernel_tx_full",
    KernelLinkDown => "kernel_link_down",
    KernelRxDropped => "kernel_rx_dropped",
    BadOffload => "bad_offload",
    OffloadRefused => "offload_refused",
    FlowDrop => "flow_drop",
    TunnelMismatch => "tunnel_mismatch",
    PostcopyPending => "postcopy_page_pending",
    DirtyLogFault => "dirty_log_fault",
    // A packet recirculated (`ct(table=T)`) more times than the datapath allows.
    RecircDepth => "recirc_depth_exceeded",
    // A Geneve header that does not check (version, lengths, payload, OAM, an unknown
    // critical option: RFC 8926 says drop).
    TunnelBadHeader => "tunnel_bad_header",
    // Packed rings: a descriptor whose AVAIL/USED flags fit neither "available" nor "used" in
    // the lap the device expects (a wrong wrap counter), or a chain that runs into one.
    PackedBadFlags => "packed_desc_bad_flags",
    // Packed rings: a buffer id not below the queue size.
    PackedBadBufferId => "packed_bad_buffer_id",
}

pub const NUM_REASONS: usize = DropReason::ALL.len();

/// Counters of one queue (or one port).
#[derive(Debug, Default)]
pub struct QueueStats {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Guest notifications (call eventfd writes) made.
    pub calls: AtomicU64,
    /// Notification decisions where the guest asked for none (EVENT_IDX `used_event` not
    /// crossed, or NO_INTERRUPT set).
    pub calls_suppressed: AtomicU64,
    /// Bursts whose notification was deferred by coalescing (merged into a later one).
    pub calls_coalesced: AtomicU64,
    /// Live migration: guest pages marked in the dirty log (a page is counted again in each
    /// burst that writes it).
    pub dirty_pages: AtomicU64,
    drops: [AtomicU64; NUM_REASONS],
}

impl QueueStats {
    #[inline]
    pub fn add(&self, packets: u64, bytes: u64) {
        if packets != 0 {
            self.packets.fetch_add(packets, Ordering::Relaxed);
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn drop(&self, reason: DropReason, n: u64) {
        if n != 0 {
            self.drops[reason as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize].load(Ordering::Relaxed)
    }

    /// Adds a plain copy's counters (carried over a hot upgrade).
    pub fn restore(&self, s: &StatsSnapshot) {
        self.packets.fetch_add(s.packets, Ordering::Relaxed);
        self.bytes.fetch_add(s.bytes, Ordering::Relaxed);
        self.calls.fetch_add(s.calls, Ordering::Relaxed);
        self.calls_suppressed
            .fetch_add(s.calls_suppressed, Ordering::Relaxed);
        self.calls_coalesced
            .fetch_add(s.calls_coalesced, Ordering::Relaxed);
        self.dirty_pages.fetch_add(s.dirty_pages, Ordering::Relaxed);
        for (a, d) in self.drops.iter().zip(&s.drops) {
            a.fetch_add(*d, Ordering::Relaxed);
        }
    }

    /// A plain copy of the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut drops = [0u64; NUM_REASONS];
        for (d, a) in drops.iter_mut().zip(&self.drops) {
            *d = a.load(Ordering::Relaxed);
        }
        StatsSnapshot {
            packets: self.packets.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            calls_suppressed: self.calls_suppressed.load(Ordering::Relaxed),
            calls_coalesced: self.calls_coalesced.load(Ordering::Relaxed),
            dirty_pages: self.dirty_pages.load(Ordering::Relaxed),
            drops,
        }
    }
}

/// Counters as plain numbers; what a hot upgrade carries (see the crate's docs for the wire
/// format).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StatsSnapshot {
    pub packets: u64,
    pub bytes: u64,
    pub calls: u64,
    /// Added within schema 1 (absent in older state: 0).
    #[cfg_attr(feature = "serde", serde(default))]
    pub calls_suppressed: u64,
    #[cfg_attr(feature = "serde", serde(default))]
    pub calls_coalesced: u64,
    /// Not carried over a hot upgrade.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub dirty_pages: u64,
    /// By [`DropReason`] index; on the wire the non-zero ones as `[name, count]` pairs.
    #[cfg_attr(feature = "serde", serde(with = "wire"))]
    pub drops: [u64; NUM_REASONS],
}

impl StatsSnapshot {
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    pub fn merge(&mut self, o: &StatsSnapshot) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.calls += o.calls;
        self.calls_suppressed += o.calls_suppressed;
        self.calls_coalesced += o.calls_coalesced;
        self.dirty_pages += o.dirty_pages;
        for (a, b) in self.drops.iter_mut().zip(&o.drops) {
            *a += b;
        }
    }

    /// Non-zero drop counters by name.
    pub fn named_drops(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|r| (r.name(), self.drops[*r as usize]))
            .filter(|(_, n)| *n != 0)
    }
}

#[cfg(feature = "serde")]
mod wire {
    //! [`StatsSnapshot::drops`] on the wire: the non-zero counters as `[name, count]` pairs in
    //! [`DropReason::ALL`] order. Reading adds a name given twice (saturating) and leaves out
    //! a name this version does not know.
    use super::{DropReason, NUM_REASONS};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(drops: &[u64; NUM_REASONS], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            DropReason::ALL
                .iter()
                .map(|r| (r.name(), drops[*r as usize]))
                .filter(|(_, n)| *n != 0),
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u64; NUM_REASONS], D::Error> {
        let mut drops = [0u64; NUM_REASONS];
        for (name, n) in Vec::<(String, u64)>::deserialize(d)? {
            if let Some(r) = DropReason::from_name(&name) {
                let c = &mut drops[r as usize];
                *c = c.saturating_add(n);
            }
        }
        Ok(drops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_indices_dense() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
            assert!(!r.name().is_empty());
            assert!(DropReason::ALL[..i].iter().all(|o| o.name() != r.name()));
        }
        assert_eq!(NUM_REASONS, DropReason::ALL.len());
        for r in DropReason::ALL {
            assert_eq!(DropReason::from_name(r.name()), Some(*r));
        }
        assert_eq!(DropReason::from_name("no_such_reason"), None);
        // Names the CLI, metrics and the upgrade fixtures rely on.
        assert_eq!(DropReason::NoMbuf.name(), "no_mbuf");
        assert_eq!(DropReason::GuestNoBuffers.name(), "guest_no_rx_buffers");
        assert_eq!(DropReason::KernelTxFull.name(), "kernel_tx_full");
        assert_eq!(DropReason::TunnelMismatch.name(), "tunnel_mismatch");
    }

    #[test]
    fn add_and_drop_count_and_zero_is_free() {
        let s = QueueStats::default();
        s.add(0, 100);
        assert_eq!(s.snapshot(), StatsSnapshot::default());
        s.add(3, 180);
        s.add(1, 60);
        s.drop(DropReason::Runt, 2);
        s.drop(DropReason::Runt, 0);
        s.drop(DropReason::NoRoute, 5);
        let snap = s.snapshot();
        assert_eq!((snap.packets, snap.bytes), (4, 240));
        assert_eq!(s.drops(DropReason::Runt), 2);
        assert_eq!(s.drops(DropReason::NoRoute), 5);
        assert_eq!(s.drops(DropReason::Vlan), 0);
        assert_eq!(snap.total_drops(), 7);
        let named: Vec<_> = snap.named_drops().collect();
        assert_eq!(named, vec![("runt", 2), ("no_route", 5)]);
    }

    #[test]
    fn snapshot_restore_and_merge_round_trip() {
        let a = QueueStats::default();
        a.add(10, 1000);
        a.calls.fetch_add(2, Ordering::Relaxed);
        a.calls_suppressed.fetch_add(3, Ordering::Relaxed);
        a.calls_coalesced.fetch_add(4, Ordering::Relaxed);
        a.dirty_pages.fetch_add(5, Ordering::Relaxed);
        a.drop(DropReason::Oversize, 6);
        let snap = a.snapshot();
        // Restoring adds: a queue restored into a fresh one equals the original.
        let b = QueueStats::default();
        b.restore(&snap);
        assert_eq!(b.snapshot(), snap);
        b.restore(&snap);
        let mut twice = snap;
        twice.merge(&snap);
        assert_eq!(b.snapshot(), twice);
        assert_eq!(twice.packets, 20);
        assert_eq!(twice.calls_coalesced, 8);
        assert_eq!(twice.drops[DropReason::Oversize as usize], 12);
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let s = std::sync::Arc::new(QueueStats::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        s.add(1, 64);
                        QueueStats::drop(&s, DropReason::KernelTxFull, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let snap = s.snapshot();
        assert_eq!((snap.packets, snap.bytes), (40_000, 40_000 * 64));
        assert_eq!(snap.drops[DropReason::KernelTxFull as usize], 40_000);
    }

    /// The wire shape of schemas 1 and 2 (written by `StatsState` before the counters had
    /// their own serde): read, and written back the same.
    #[cfg(feature = "serde")]
    #[test]
    fn wire_format_is_the_old_stats_state() {
        let old = r#"{"packets":4,"bytes":240,"calls":2,"calls_suppressed":1,"calls_coalesced":3,"drops":[["runt",2],["no_route",5]]}"#;
        let s: StatsSnapshot = serde_json::from_str(old).unwrap();
        assert_eq!((s.packets, s.bytes, s.calls), (4, 240, 2));
        assert_eq!((s.calls_suppressed, s.calls_coalesced), (1, 3));
        assert_eq!(s.drops[DropReason::Runt as usize], 2);
        assert_eq!(s.drops[DropReason::NoRoute as usize], 5);
        assert_eq!(serde_json::to_string(&s).unwrap(), old);
        // Older state: no call counters besides `calls`; unknown reasons are left out, a name
        // given twice adds up, saturating.
        let older = r#"{"packets":1,"bytes":2,"calls":3,"drops":[["from_the_future",9],["runt",1],["runt",18446744073709551615]]}"#;
        let s: StatsSnapshot = serde_json::from_str(older).unwrap();
        assert_eq!((s.calls_suppressed, s.calls_coalesced), (0, 0));
        assert_eq!(s.drops[DropReason::Runt as usize], u64::MAX);
        assert_eq!(s.total_drops(), u64::MAX);
        // `dirty_pages` does not travel.
        let d = StatsSnapshot {
            dirty_pages: 7,
            ..StatsSnapshot::default()
        };
        let j = serde_json::to_string(&d).unwrap();
        assert_eq!(
            j,
            r#"{"packets":0,"bytes":0,"calls":0,"calls_suppressed":0,"calls_coalesced":0,"drops":[]}"#
        );
        assert!(serde_json::from_str::<StatsSnapshot>(r#"{"packets":1,"bytes":2}"#).is_err());
    }
}
