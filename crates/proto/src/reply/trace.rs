//! The reply of `trace` (`ferrovs trace`, as OVS's `ofproto/trace`).
//!
//! Fields in name order, as every reply (see the parent module).

use serde::{Deserialize, Serialize};

/// Where a packet goes through a bridge's rules, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    pub bridge: String,
    /// Why the packet goes nowhere (absent when it is sent somewhere): `no rule matched in
    /// table N`, `dropped by the rules`, a NORMAL decision's drop reason, a translation
    /// limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop: Option<String>,
    /// The packet traced, as its key's non-zero fields (`in_port=vm1,dl_type=0x800,…`).
    pub flow: String,
    /// Port names the packet leaves by (every pass, NORMAL's and flood's expanded), in
    /// order, each once; `controller` for a packet-in.
    pub outputs: Vec<String>,
    /// One per pass: the first, then one per `ct(table=T)` recirculation.
    pub passes: Vec<TracePass>,
    /// Set when the bridge has only the default `NORMAL` rule: the datapath switches it on
    /// the plain L2 path, with no megaflow.
    pub plain_l2: bool,
}

/// One pass through the tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePass {
    /// The pass's datapath actions (as `dump-megaflows` prints them; `drop` for none).
    pub actions: String,
    /// The `ct_state` this pass starts with (a recirculated pass: what the trace assumed
    /// for the `ct()` before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ct_state: Option<String>,
    /// A translation limit hit (`too deep`, `too many resubmits`): the packet is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The megaflow the datapath would install: key and mask, as `dump-megaflows` prints
    /// its match.
    pub megaflow: String,
    /// The recirculation id the pass matches (0: the first pass).
    pub recirc_id: u16,
    pub steps: Vec<TraceStep>,
}

/// One table lookup (`kind` `rule` or `miss`) or one NORMAL decision (`normal`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStep {
    /// The rule's actions as `dump-flows` prints them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// Resubmit nesting (0: the pass's own walk, `goto_table` included).
    pub depth: usize,
    pub kind: String,
    /// The rule's match as `dump-flows` prints it (`table=1,priority=10,tcp,…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// NORMAL: the decision in words (`learned on vm2, vlan 0` / `flood, vlan 0` / a drop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal: Option<String>,
    /// NORMAL: the ports it sends to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u16>,
    pub table: u8,
}
