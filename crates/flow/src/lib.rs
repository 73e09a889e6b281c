//! The flow pipeline's slow path: what the datapath's caches are filled from.
//!
//! * [`key`]: the flow key (every matchable header field, the metadata and the registers
//!   in twenty-nine words) and its extraction from an untrusted frame.
//! * [`ct`]: the `ct()` action (connection tracking) as a rule writes it and as the datapath
//!   executes it, and recirculation ids.
//! * [`matching`]: a rule's match (key + mask).
//! * [`classifier`]: tuple-space search with priority pruning, reporting which key bits a
//!   decision depended on (the megaflow mask).
//! * [`pipeline`]: rule tables, and the translation of a key into datapath actions.
//! * [`spec`]: ovs-ofctl's rule syntax, parsed with precise errors and printed back.
//! * [`meter`]: OpenFlow meters in ovs-ofctl's syntax (`meter=1,kbps,band=...`).
//! * [`learn`]: the `learn(...)` action: the rule a packet teaches.
//! * [`tlv`]: the tunnel option map (Geneve option ↔ `tun_metadataN`).
//! * [`edit`]: header rewrites with incremental checksum updates.
//! * [`mod@reference`]: a linear classifier, the reference the tuple-space one is tested
//!   against.
//!
//! No control plane, no I/O: the datapath calls [`Pipeline::translate`] on a cache miss;
//! the control plane parses rules and builds pipelines. Design: `docs/flows.md`.
#![forbid(unsafe_code)]

pub mod classifier;
#[cfg(test)]
mod conj_tests;
#[cfg(test)]
mod cont_tests;
pub mod ct;
pub mod edit;
pub mod key;
#[cfg(test)]
mod lb_tests;
pub mod learn;
pub mod matching;
pub mod meter;
#[cfg(test)]
mod ovn_tests;
pub mod pipeline;
#[cfg(test)]
mod pktlen_tests;
pub mod reference;
#[cfg(test)]
mod regs_tests;
pub mod spec;
#[cfg(test)]
mod testrng;
#[cfg(test)]
mod tests;
pub mod tlv;
pub mod trace;
#[cfg(test)]
mod trace_tests;

pub use classifier::{Classifier, Conjunction};
pub use key::{Field, FlowKey, SubField, TunnelKey, KEY_WORDS, TUN_METADATA};
pub use matching::Match;
pub use pipeline::{
    is_table_miss, resolve_frame, CheckPktLen, CompiledGroup, CompiledRule, ControllerAction,
    DpAction, Frozen, FrozenFrame, GroupStats, PacketInState, Pipeline, PortNumbers,
    ResolvedAction, RuleStats, TableCounters, Translation, XlateCounters, XlateError,
    MAX_FROZEN_FRAMES, REASON_ACTION, REASON_NO_MATCH,
};
pub use spec::{
    check_conjunctions, conjunctions, parse_filter, parse_flow, parse_flows_file, parse_group,
    ActionSpec, BucketSpec, ControllerExt, FlowFilter, FlowSpec, GroupSpec, GroupType, ParseError,
};
pub use tlv::{TlvEntry, TlvError, TlvMap};
