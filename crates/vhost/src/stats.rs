//! Per-queue counters, defined in `ferrovs-counters` (shared with the datapath's kernel
//! ports) and re-exported here for the virtqueue and device code.

pub use ferrovs_counters::{DropReason, QueueStats, StatsSnapshot, NUM_REASONS};
