//! Rules as users write them, in ovs-ofctl's syntax: parsing with precise errors, and a
//! canonical text form that parses back to the same rule (saved configurations use it).
//!
//! ```text
//! [table=N,][priority=N,][cookie=N,][idle_timeout=S,][hard_timeout=S,]MATCH... actions=ACTION,...
//! ```
//! Ports are names (`in_port=vm1`, `output:vm2`), resolved when the pipeline is built.
//!
//! Parsing is of untrusted text (the control socket, a flows file): every error is a
//! [`ParseError`] naming the token, never a panic, and a rule that parses prints
//! ([`std::fmt::Display`]) to a text that parses back to the same rule (the `flow` fuzz
//! target checks both). No state: plain functions, safe from any thread.
//!
//! By seam:
//! * this file: the rule and filter as written ([`FlowSpec`], [`ActionSpec`],
//!   [`FlowFilter`]), the errors, and the entry points ([`parse_flow`], [`parse_filter`],
//!   [`parse_flows_file`]);
//! * `values`: the lexical layer: tokens, numbers, addresses with masks, port names;
//! * `matches`: match fields by name, shorthands (`tcp`, `arp`, ...) and OpenFlow's
//!   prerequisites;
//! * `actions`: actions by name, checked against the rule's table and match;
//! * `ct`: connection tracking's syntax: `ct(...)`'s arguments, `ct_state`'s flags;
//! * `learn`: `learn(...)`'s arguments (parsed and printed as ovs-ofctl);
//! * `fields`: fields by their NXM/OXM and ovs-fields names as subfields (`NXM_NX_REG0[0..15]`),
//!   the registers' names, which fields `load`/`move` may write;
//! * `print`: the canonical text of rules, filters and actions.
//!
//! Calls go one way: this file → `matches`, `actions`, `values`; `matches`, `actions` →
//! `ct`, `fields`, `values`; `ct` → `fields`, `values`; `print` uses only the types here and
//! `ct`'s and `fields`' printers. No file calls back into its caller.

use crate::key::SubField;
use crate::matching::Match;
use crate::Field;

mod actions;
mod ct;
mod fields;
mod groups;
mod learn;
mod matches;
mod print;
mod values;

use actions::parse_action;
pub use groups::{parse_group, BucketSpec, GroupSpec, GroupType, OFPG_MAX};
use matches::parse_match_part;
use values::tokens;

/// Default rule priority (OpenFlow).
pub const DEFAULT_PRIORITY: u16 = 32768;

/// An action as written (ports by name).
/// What `controller(...)` says beyond `max_len` (OVS's `ofpact_controller`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControllerExt {
    /// `reason=` (`OFPR_*`); `None`: OVS's default, `action` (ferrovs, as OVS, says
    /// `no_match` for a table-miss rule's plain `CONTROLLER`).
    pub reason: Option<u8>,
    /// `id=`: the controller connection id (`NXT_SET_CONTROLLER_ID`) that receives it; 0: all.
    pub controller_id: u16,
    /// `userdata=` (hex): copied into `NXT_PACKET_IN2`'s `NXPINT_USERDATA`.
    pub userdata: Vec<u8>,
    /// `pause`: the translation stops here; the controller resumes it (`NXT_RESUME`).
    pub pause: bool,
    /// `meter_id=` (`None`: `NX_CTLR_NO_METER`).
    pub meter_id: Option<u32>,
}

impl ControllerExt {
    /// Whether nothing beyond `max_len` is set (the action is a plain `CONTROLLER:N`).
    pub fn is_plain(&self) -> bool {
        matches!(self.reason, None | Some(1))
            && self.controller_id == 0
            && self.userdata.is_empty()
            && !self.pause
            && self.meter_id.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionSpec {
    Output(String),
    InPort,
    Normal,
    Flood,
    All,
    Drop,
    /// A copy of the packet as received (before any modification) to a port.
    Mirror(String),
    SetField(Field, u128),
    /// Set the two ECN bits of the IPv4 TOS / IPv6 traffic class, keeping the DSCP
    /// (`mod_nw_ecn:N`, `set_field:N->nw_ecn`).
    SetEcn(u8),
    SetVlanVid(u16),
    SetVlanPcp(u8),
    PopVlan,
    PushVlan(u16),
    SetTunnel(u64),
    GotoTable(u8),
    /// OpenFlow's meter instruction (`meter:N`, first in the list): the packet goes
    /// through meter N before the other actions, which a band may drop it for.
    Meter(u32),
    /// The packet (its first `max_len` bytes; 65535: all of it) to the OpenFlow
    /// controllers, as a PACKET_IN (`controller`, `controller:N`, `CONTROLLER:N`); with
    /// `ext`, Nicira's `controller(reason=…,max_len=…,id=…,userdata=…,pause,meter_id=…)`
    /// (`NXAST_CONTROLLER2`).
    Controller {
        max_len: u16,
        /// The parts beyond `max_len` (`None`: plain `CONTROLLER:N`).
        ext: Option<Box<ControllerExt>>,
    },
    /// Process the packet through a group (`group:N`).
    Group(u32),
    /// Decrement the IPv4 TTL / IPv6 hop limit; at 0 or 1 the packet is dropped.
    DecTtl,
    /// Accepted and ignored (ferrovs has no output queues), as `set_queue` on a port without
    /// QoS in OVS.
    SetQueue(u32),
    /// The instruction `write_actions(...)`: merged into the action set, executed when the
    /// pipeline ends.
    WriteActions(Vec<ActionSpec>),
    /// The instruction `clear_actions`: empties the action set.
    ClearActions,
    /// The instruction `write_metadata:V/M`.
    WriteMetadata {
        value: u64,
        mask: u64,
    },
    /// Push an MPLS label stack entry, the frame's Ethertype becoming 0x8847 or 0x8848
    /// (`push_mpls:ET`): a copy of the top entry with bos 0 on an MPLS frame, else label 0
    /// (2 over IPv6), bos 1, the IP TTL (64 without one or when 0) and TC from the DSCP's
    /// low 3 bits, as OVS.
    PushMpls(u16),
    /// Pop the top MPLS entry, the frame's Ethertype becoming the argument (`pop_mpls:ET`).
    PopMpls(u16),
    /// Set the top MPLS entry's TTL (`set_mpls_ttl:N`).
    SetMplsTtl(u8),
    /// Decrement the top MPLS entry's TTL; at 0 or 1 the packet is dropped (`dec_mpls_ttl`).
    DecMplsTtl,
    /// Connection tracking: `ct(commit,zone=N,table=T,nat(...),exec(...))` (see
    /// [`crate::ct`]).
    Ct(Box<crate::ct::CtSpec>),
    /// `ct_clear`: the packet's `ct_*` fields back to untracked.
    CtClear,
    /// `load:V->DST[a..b]`, `set_field:V[/M]->reg0` (registers, metadata): the bits of
    /// `field` under `mask` take `value`'s (`value` has no bit outside `mask`). A write of
    /// in_port writes an OpenFlow port number.
    Load {
        field: Field,
        value: u128,
        mask: u128,
    },
    /// `move:SRC[a..b]->DST[c..d]` (as many bits each).
    Move {
        src: SubField,
        dst: SubField,
    },
    /// `resubmit:PORT`, `resubmit(PORT,TABLE)`, `resubmit(,TABLE)`: the packet is looked up
    /// in TABLE (absent: the current one) as if it came in on PORT (absent: as it did), the
    /// rule found runs, then the actions after the resubmit (OVS's semantics: any table,
    /// earlier ones too, at most 64 deep).
    Resubmit {
        port: Option<String>,
        table: Option<u8>,
    },
    /// `output:NXM_NX_REG15[]`: output to the OpenFlow port number the field holds.
    OutputReg(SubField),
    /// `learn(...)`: a rule learned from the packet (see [`crate::learn`]).
    Learn(Box<crate::learn::LearnSpec>),
    /// `push:FIELD[a..b]`: the bits onto the translation's stack (OVS's register stack: one
    /// per translation, kept across resubmits, copied into a `clone`).
    StackPush(SubField),
    /// `pop:FIELD[a..b]`: the top of the stack (its low bits) into the bits; an empty stack
    /// leaves them as they are (as OVS).
    StackPop(SubField),
    /// `clone(...)`: the actions on a copy of the packet and of the translation's state
    /// (key, registers, stack); what follows sees the packet as before the clone.
    Clone(Vec<ActionSpec>),
    /// `check_pkt_larger(LEN)->DST[bit]`: 1 into the bit when the packet (its L2 frame as
    /// it is at the action, without FCS or VLAN tags) is longer than `len` bytes, else 0.
    /// Decided per packet in the datapath (see [`crate::pipeline::CheckPktLen`]).
    CheckPktLarger {
        len: u16,
        dst: SubField,
    },
    /// `conjunction(id,k/n)`: the rule is clause `k` (1-based, as written) of conjunction
    /// `id`'s `n` (2..=64). A rule's actions are then all `conjunction`s: it is a soft match
    /// (see [`crate::classifier`]).
    Conjunction {
        id: u32,
        clause: u8,
        n_clauses: u8,
    },
}

impl ActionSpec {
    /// The OpenFlow instruction an action belongs to, in the order instructions must come:
    /// 0 apply-actions, 1 clear_actions, 2 write_actions, 3 write_metadata, 4 goto_table.
    pub fn instruction_rank(&self) -> u8 {
        match self {
            ActionSpec::ClearActions => 1,
            ActionSpec::WriteActions(_) => 2,
            ActionSpec::WriteMetadata { .. } => 3,
            ActionSpec::GotoTable(_) => 4,
            _ => 0,
        }
    }

    /// The instruction's name, for messages.
    pub fn instruction_name(&self) -> &'static str {
        match self.instruction_rank() {
            1 => "clear_actions",
            2 => "write_actions",
            3 => "write_metadata",
            4 => "goto_table",
            _ => "apply_actions",
        }
    }
}

/// A rule as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSpec {
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    /// The input port's name (resolved at build time; not part of `m`).
    pub in_port: Option<String>,
    pub m: Match,
    pub actions: Vec<ActionSpec>,
}

/// Why a rule or filter does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown field '{0}'")]
    UnknownField(String),
    #[error("unknown action '{0}'")]
    UnknownAction(String),
    #[error("{field}: '{value}' is not {expected}")]
    BadValue {
        field: String,
        value: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("no actions (end the rule with 'actions=...'; 'actions=drop' drops)")]
    NoActions,
    #[error("{0} needs a value")]
    NoValue(String),
}

/// The conjunctions of a rule's actions as the classifier takes them (empty: a hard rule).
pub fn conjunctions(actions: &[ActionSpec]) -> Vec<crate::classifier::Conjunction> {
    actions
        .iter()
        .filter_map(|a| match *a {
            ActionSpec::Conjunction {
                id,
                clause,
                n_clauses,
            } => Some(crate::classifier::Conjunction {
                id,
                clause: clause - 1,
                n_clauses,
            }),
            _ => None,
        })
        .collect()
}

/// OVS's rule (`ofpacts_verify`): `conjunction` actions may only come with other
/// `conjunction`s (OVS also allows `note`, which ferrovs does not parse), and never nested
/// (in `clone` or `write_actions`).
pub fn check_conjunctions(actions: &[ActionSpec]) -> Result<(), ParseError> {
    fn nested(a: &ActionSpec) -> bool {
        match a {
            ActionSpec::Clone(l) | ActionSpec::WriteActions(l) => l
                .iter()
                .any(|x| matches!(x, ActionSpec::Conjunction { .. }) || nested(x)),
            _ => false,
        }
    }
    if actions.iter().any(nested) {
        return Err(ParseError::Invalid(
            "\"conjunction\" actions may not be nested (in clone or write_actions)".into(),
        ));
    }
    let is_conj = |a: &ActionSpec| matches!(a, ActionSpec::Conjunction { .. });
    if actions.iter().any(is_conj) {
        if let Some(other) = actions.iter().find(|a| !is_conj(a)) {
            return Err(ParseError::Invalid(format!(
                "\"conjunction\" actions may be used along with \"note\" but not any other \
                 kind of action (such as the \"{other}\" action used here)"
            )));
        }
    }
    Ok(())
}

/// Parses a rule (`ferrovs add-flow`).
pub fn parse_flow(s: &str) -> Result<FlowSpec, ParseError> {
    let lower = s.to_ascii_lowercase();
    let at = lower.find("actions=").ok_or(ParseError::NoActions)?;
    let (mpart, apart) = (&s[..at], &s[at + "actions=".len()..]);
    let p = parse_match_part(mpart)?;
    if p.cookie.is_some_and(|(_, m)| m != u64::MAX) {
        return Err(ParseError::Invalid(
            "cookie: a mask is for filters (del-flows, dump-flows), not rules".into(),
        ));
    }
    let table = p.table.unwrap_or(0);
    let mut actions = Vec::new();
    // The match as each action sees it: push_mpls and pop_mpls change the Ethertype the
    // later actions' prerequisites are checked against (as OVS's `ofpacts_check`).
    let mut seen = p.m;
    for a in tokens(apart) {
        let act = parse_action(a.trim(), table, &seen)?;
        if let ActionSpec::PushMpls(t) | ActionSpec::PopMpls(t) = act {
            seen.set(Field::EthType, u128::from(t), 0xffff);
            seen.set(Field::IpProto, 0, 0);
        }
        actions.push(act);
    }
    if actions.is_empty() {
        return Err(ParseError::NoActions);
    }
    check_conjunctions(&actions)?;
    if actions.len() > 1 && actions.contains(&ActionSpec::Drop) {
        return Err(ParseError::Invalid("drop must be the only action".into()));
    }
    let meters = actions
        .iter()
        .filter(|a| matches!(a, ActionSpec::Meter(_)))
        .count();
    if meters > 1 || (meters == 1 && !matches!(actions.first(), Some(ActionSpec::Meter(_)))) {
        return Err(ParseError::Invalid(
            "meter must be the first action, once".into(),
        ));
    }
    let gotos = actions
        .iter()
        .filter(|a| matches!(a, ActionSpec::GotoTable(_)))
        .count();
    if gotos > 1 || (gotos == 1 && !matches!(actions.last(), Some(ActionSpec::GotoTable(_)))) {
        return Err(ParseError::Invalid(
            "goto_table must be the last action, once".into(),
        ));
    }
    let mut last = 0u8;
    for a in &actions {
        let r = a.instruction_rank();
        if r < last || (r == last && r != 0) {
            return Err(ParseError::Invalid(format!(
                "instruction {} may not follow the instruction before it \
                 (order: actions, clear_actions, write_actions, write_metadata, goto_table; each once)",
                a.instruction_name()
            )));
        }
        last = r;
    }
    Ok(FlowSpec {
        table,
        priority: p.priority.unwrap_or(DEFAULT_PRIORITY),
        cookie: p.cookie.map_or(0, |c| c.0),
        idle_timeout: p.idle,
        hard_timeout: p.hard,
        in_port: p.in_port,
        m: p.m,
        actions,
    })
}

/// Selects rules (`del-flows`, `dump-flows`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowFilter {
    pub table: Option<u8>,
    pub priority: Option<u16>,
    pub in_port: Option<String>,
    pub m: Match,
    pub cookie: Option<(u64, u64)>,
}

/// Parses a filter: the match syntax, no actions; an empty string selects everything.
pub fn parse_filter(s: &str) -> Result<FlowFilter, ParseError> {
    if s.to_ascii_lowercase().contains("actions=") {
        return Err(ParseError::Invalid("a filter has no actions".into()));
    }
    let p = parse_match_part(s)?;
    if p.idle != 0 || p.hard != 0 {
        return Err(ParseError::Invalid("timeouts do not select rules".into()));
    }
    Ok(FlowFilter {
        table: p.table,
        priority: p.priority,
        in_port: p.in_port,
        m: p.m,
        cookie: p.cookie,
    })
}

impl FlowFilter {
    /// Non-strict (ovs-ofctl `del-flows`): every rule whose match is at least as specific as
    /// the filter's. Strict: the same match (and in_port) and priority (default 32768).
    pub fn selects(&self, f: &FlowSpec, strict: bool) -> bool {
        if self.table.is_some_and(|t| t != f.table) {
            return false;
        }
        if let Some((c, m)) = self.cookie {
            if f.cookie & m != c & m {
                return false;
            }
        }
        if strict {
            return self.priority.unwrap_or(DEFAULT_PRIORITY) == f.priority
                && self.in_port == f.in_port
                && self.m == f.m;
        }
        if self.in_port.is_some() && self.in_port != f.in_port {
            return false;
        }
        self.m.covers(&f.m)
    }
}

/// Parses a bulk file: one rule per line; blank lines and `#` comments skipped. An error
/// gives its line (1-based).
pub fn parse_flows_file(text: &str) -> Result<Vec<FlowSpec>, (usize, ParseError)> {
    let mut v = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        v.push(parse_flow(l).map_err(|e| (i + 1, e))?);
    }
    Ok(v)
}
