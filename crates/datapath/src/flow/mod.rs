//! The flow pipeline's fast path: how a PMD decides a packet of a bridge that has OpenFlow-
//! style rules, in three levels, each a file with its own counters (as OVS's
//! `dp_netdev_input__` → `dfc_processing` → `fast_path_processing` → `handle_packet_upcall`):
//!
//! 1. [`emc`]: the PMD's exact-match cache (full key → megaflow);
//! 2. [`megaflow`]: the bridge's shared megaflow cache (wildcarded entries by mask);
//! 3. [`upcall`]: on a miss, the packet's key goes through the rule tables
//!    ([`ferrovs_flow::Pipeline::translate`]), which also says which key bits it consulted;
//!    the result becomes a megaflow entry.
//!
//! [`input`] runs a burst through the levels and executes each packet's actions.
//!
//! A bridge whose only rule is the default `priority=0 actions=NORMAL` keeps the plain L2
//! path ([`crate::l2`]): no key extraction, no caches ([`BridgeFlows`] is then absent).
//!
//! # Thread-safety
//! [`BridgeFlows`] is part of the published [`crate::Snapshot`]: the pipeline it holds is
//! immutable; a rule change publishes a new one with the next generation and revalidates the
//! megaflow cache ([`megaflow::MegaflowCache::revalidate`]) before it is acknowledged.

pub mod emc;
pub mod input;
pub mod learn;
pub mod megaflow;
pub mod upcall;

#[cfg(test)]
mod chassis_tests;
#[cfg(test)]
mod ct_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tunnel_tests;

use std::sync::Arc;

use ferrovs_flow::Pipeline;

pub use emc::Emc;
pub use megaflow::{MegaflowCache, Revalidation};

/// A bridge's rules as the datapath sees them.
#[derive(Debug, Clone)]
pub struct BridgeFlows {
    pub pipeline: Arc<Pipeline>,
    /// Generation of `pipeline` (megaflows translated with another are not cached).
    pub gen: u64,
    pub cache: Arc<MegaflowCache>,
    /// The bridge's meters (`DpAction::Meter` looks its meter up here at execution, so a
    /// meter's reconfiguration needs no new pipeline).
    pub meters: Arc<crate::meter::MeterTable>,
    /// Where `controller` actions send packets (`None`: they drop them).
    pub packet_in: Option<Arc<crate::packet_io::PacketInQueue>>,
    /// The connection tracker `DpAction::Ct` runs (one per daemon, shared by bridges).
    pub conntrack: Arc<ferrovs_conntrack::Tracker>,
    /// Where the rules `learn` actions learn go (`None`: they are dropped), see [`learn`].
    pub learn: Option<Arc<learn::LearnQueue>>,
}

/// Flow-path counters of one PMD (kept locally, published with the PMD's other counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlowCounters {
    /// Packets decided through the flow pipeline.
    pub packets: u64,
    pub emc_hits: u64,
    pub megaflow_hits: u64,
    /// Misses in both caches: translated through the rule tables.
    pub upcalls: u64,
    /// EMC insertions.
    pub emc_inserts: u64,
    /// Packets that skipped the EMC while it was bypassed for its low hit rate.
    pub emc_skipped: u64,
    /// Passes after a packet's first (`ct(table=T)`): each is also counted in the cache
    /// levels above, as OVS counts recirculated passes.
    pub recirculations: u64,
}
