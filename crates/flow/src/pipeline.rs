//! Rule tables and the translation of a flow key through them (the slow path).
//!
//! A [`Pipeline`] is up to 255 tables, each a [`Classifier`] of compiled rules (port names
//! resolved to datapath ids). [`Pipeline::translate`] starts at table 0 and applies the
//! matched rule's actions in order, with OpenFlow semantics: field modifications change the
//! key that later lookups (`goto_table`, to a later table) see and are emitted as datapath
//! actions; an output to the packet's own input port is skipped unless the `in_port` action
//! is used; a table miss drops. The result carries the mask of every key bit the decision
//! consulted — the megaflow it can be cached as.
//!
//! Connection tracking (see [`crate::ct`]): `ct(...)` emits [`DpAction::Ct`] with the
//! metadata reached so far; with `table=T` the translation ends there (the datapath tracks
//! the packet and looks it up again with recirculation id `T + 1`), without it the later
//! actions follow with the key's `ct_*` fields unchanged. A key with a non-zero
//! recirculation id starts in the table the id names instead of 0, and the id is in every
//! mask, so a first pass's megaflow never matches a resumed pass's key or the reverse.
//! `ct_clear` emits [`DpAction::CtClear`] and zeroes the key's `ct_*` fields for later
//! lookups. The `ct_*` fields a lookup reads join the mask through the classifier, as any
//! match field; nothing else reads them.
//!
//! Thread-safety: immutable once built; the control plane builds a new one per change and
//! PMDs share it (`Arc<Pipeline>`).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::classifier::Classifier;
use crate::ct::{CtAction, CtNat, CtSpec};
use crate::key::{
    is_mpls, Field, FlowKey, SubField, ETH_ARP, ETH_IPV4, ETH_IPV6, ETH_MPLS, ETH_VLAN, IP_ICMP,
    IP_ICMPV6, IP_TCP, IP_UDP, MPLS_PAYLOAD_ARP, MPLS_PAYLOAD_IPV4, MPLS_PAYLOAD_IPV6, ND_NA,
    ND_NS, REG_WORD, VLAN_CFI,
};
use crate::learn::{Learned, ResolvedLearn};
use crate::spec::{ActionSpec, FlowSpec, GroupSpec, GroupType};
use crate::trace::TraceSink;

/// Counters of one rule, shared by the rule and the megaflows that came from it.
#[derive(Debug, Default)]
pub struct RuleStats {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Datapath clock (seconds) of the last packet; 0: never.
    pub used: AtomicU64,
}

/// What the datapath does with a packet (a cached megaflow's actions). Dropping is the
/// empty list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DpAction {
    Output(u32),
    /// Back out of the port it came in on.
    InPort,
    /// The learning bridge's decision, made per packet.
    Normal,
    /// Every port of the bridge but the input.
    Flood,
    /// Push a VLAN tag with TPID `tpid` (0x8100 802.1Q, 0x88a8 802.1ad; OpenFlow TCI:
    /// 0x1000 = present).
    PushVlan {
        tci: u16,
        tpid: u16,
    },
    /// Set the tag's TCI, pushing one if the frame has none.
    SetVlanTci {
        tci: u16,
    },
    PopVlan,
    /// Rewrite a header field (the executor fixes checksums).
    SetField(Field, u128),
    SetTunnel {
        id: u64,
    },
    SetTunnelDst(Ipv4Addr),
    /// Set `tun_metadata{index}` (a Geneve option on output to a flow-based tunnel port,
    /// through the bridge's TLV map).
    SetTunnelMetadata {
        index: u8,
        value: u32,
    },
    /// Run the packet through the bridge's meter N; a band that drops it drops it for
    /// every later action. (Looked up by id at execution: a meter's configuration changes
    /// without a new pipeline.)
    Meter(u32),
    /// A copy of the packet as it is at this point to the OpenFlow controllers: a PACKET_IN
    /// with these fields.
    Controller(ControllerAction),
    /// Insert the MPLS label stack entry `lse` (label·tc·bos·ttl, as on the wire) after the
    /// Ethernet header and its VLAN tags, the Ethertype becoming `ethertype`.
    PushMpls {
        ethertype: u16,
        lse: u32,
    },
    /// Remove the top MPLS label stack entry (if the frame is MPLS), the Ethertype becoming
    /// `ethertype`.
    PopMpls {
        ethertype: u16,
    },
    /// Run the packet through connection tracking (`ct()`, see [`crate::ct`]); with
    /// `recirc`, the packet is then looked up again and these actions end there.
    Ct(Arc<CtAction>),
    /// Forget the packet's connection-tracking state (`ct_clear`).
    CtClear,
    /// `check_pkt_larger`: the rest of the actions depend on the packet's length, decided
    /// per packet (OVS's datapath `check_pkt_len`).
    CheckPktLen(Arc<CheckPktLen>),
}

/// The datapath's length check (see [`ResolvedAction::CheckPktLarger`]): a packet longer
/// than `len` takes `larger`, any other `smaller`; either list is the whole rest of the
/// packet's actions (nothing follows a `CheckPktLen` in its list).
///
/// The length is the L2 frame as it is when the check runs (after the edits before it),
/// without FCS and without VLAN tags (ovs-actions(7)); a TSO packet's is that of its
/// largest segment (as Linux's `check_pkt_len` on a GSO skb).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckPktLen {
    pub len: u16,
    pub larger: Vec<DpAction>,
    pub smaller: Vec<DpAction>,
}

/// What a PACKET_IN says about the rule that sent it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControllerAction {
    /// The action's `max_len` (65535: `OFPCML_NO_BUFFER`). As in OVS, which buffers
    /// nothing, it truncates nothing: the whole frame goes up.
    pub max_len: u16,
    /// `OFPR_NO_MATCH` (0) from a table-miss rule, else `OFPR_ACTION` (1), unless the
    /// action names one (`controller(reason=…)`).
    pub reason: u8,
    pub table_id: u8,
    pub cookie: u64,
    /// `controller(id=N)`: only connections with this controller id receive it (0: all).
    pub controller_id: u16,
    /// `controller(userdata=…)`: `NXPINT_USERDATA` of the `NXT_PACKET_IN2`.
    pub userdata: Option<Arc<[u8]>>,
    /// `controller(pause)`: the translation stops here and the packet-in carries its
    /// continuation ([`PacketInState::frozen`]).
    pub pause: bool,
    /// `controller(meter_id=N)`: the datapath runs meter N on the copy before sending it.
    pub meter_id: Option<u32>,
    /// The pipeline's state where the action ran: set by the translation (a rule's
    /// compiled action has none).
    pub at: Option<Arc<PacketInState>>,
}

/// What the pipeline had reached at a `controller` action: the packet-in's metadata
/// (OVS's `flow_get_metadata`: OVN's pinctrl reads its logical ports and datapath from the
/// registers and metadata) and, for `controller(pause)`, the frozen translation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PacketInState {
    /// `xreg0`..`xreg7` (each `reg2i` in the high half, `reg2i+1` in the low).
    pub regs: [u64; 8],
    pub metadata: u64,
    pub ct_state: u32,
    pub ct_zone: u16,
    pub ct_mark: u32,
    pub ct_label: u128,
    /// The continuation of a `controller(pause)`.
    pub frozen: Option<Frozen>,
}

/// A translation frozen at `controller(pause)`: what is left to do, innermost first (OVS's
/// frozen state, unrolled). Resuming ([`Pipeline::resume`]) runs each frame's actions in
/// order with the frame's table as the current one, then the action set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frozen {
    pub frames: Vec<FrozenFrame>,
    /// The action set (`write_actions`) accumulated so far.
    pub action_set: Vec<ResolvedAction>,
}

/// The rest of one action list: the pausing rule's, or a rule's after the `resubmit` the
/// pause was inside. A pending `goto_table` is a `resubmit(,T)` at its end (the same thing
/// at the end of a list), `write_metadata` a `load` of `metadata`, and a `resubmit` to the
/// current table names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenFrame {
    pub table: u8,
    pub cookie: u64,
    pub actions: Vec<ResolvedAction>,
}

/// Most frames a continuation may carry (one per nested resubmit, and the pausing rule's).
pub const MAX_FROZEN_FRAMES: usize = MAX_RESUBMIT_NESTING + 1;

/// `OFPR_NO_MATCH`: the packet-in reason of a table-miss rule's controller action.
pub const REASON_NO_MATCH: u8 = 0;
/// `OFPR_ACTION`: the packet-in reason of any other rule's controller action.
pub const REASON_ACTION: u8 = 1;

/// An action with its ports resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedAction {
    Output(Option<u32>),
    Mirror(Option<u32>),
    InPort,
    Normal,
    Flood,
    Drop,
    SetField(Field, u128),
    /// The ECN bits of IpTos (the DSCP kept).
    SetEcn(u8),
    SetVlanVid(u16),
    SetVlanPcp(u8),
    PopVlan,
    /// With the tag's TPID.
    PushVlan(u16),
    SetTunnel(u64),
    GotoTable(u8),
    Meter(u32),
    Controller(ControllerAction),
    /// Through a group (a group the pipeline lacks drops).
    Group(u32),
    DecTtl,
    /// Accepted, no effect (no queues).
    SetQueue(u32),
    WriteActions(Vec<ResolvedAction>),
    ClearActions,
    WriteMetadata {
        value: u64,
        mask: u64,
    },
    PushMpls(u16),
    PopMpls(u16),
    SetMplsTtl(u8),
    DecMplsTtl,
    Ct(Box<CtSpec>),
    CtClear,
    /// Writes `value`'s bits under `mask` into `field` (a register, metadata, in_port or a
    /// packet field).
    Load {
        field: Field,
        value: u128,
        mask: u128,
    },
    /// Copies `src`'s bits to `dst`.
    Move {
        src: SubField,
        dst: SubField,
    },
    /// Looks `table` up (`None`: the current one) with in_port `port` (`None`: unchanged;
    /// `Some(None)`: a port that does not resolve, the action does nothing) and runs the
    /// rule found, then goes on with the next action.
    Resubmit {
        port: Option<Option<u32>>,
        table: Option<u8>,
    },
    /// Output to the OpenFlow port number held in `src`.
    OutputReg(SubField),
    /// `learn(...)`: what the packet teaches goes to [`Translation::learned`].
    Learn(Arc<ResolvedLearn>),
    /// Pushes `src`'s bits onto the translation's stack.
    StackPush(SubField),
    /// Pops the stack's top into `dst` (an empty stack: nothing, counted).
    StackPop(SubField),
    /// Runs the actions on a copy of the packet and translation state (see [`ActionSpec::Clone`]).
    Clone(Vec<ResolvedAction>),
    /// `check_pkt_larger(len)->dst`: the rest of the translation is made twice, with the
    /// bit 1 and with it 0, into a [`DpAction::CheckPktLen`] (see [`ActionSpec::CheckPktLarger`]).
    CheckPktLarger {
        len: u16,
        dst: SubField,
    },
    /// `conjunction(id,k/n)` (1-based `clause`): a soft rule's, which the classifier never
    /// answers with, so it never runs (a no-op if it did, as in OVS).
    Conjunction {
        id: u32,
        clause: u8,
        n_clauses: u8,
    },
}

/// Most nested resubmits that go back (to the same or an earlier table: the ones that can
/// loop) in one translation, as OVS's `MAX_DEPTH` (its `xlate_recursively` deepens only
/// for those; OVN's pipelines resubmit forward through some 40 tables per logical
/// datapath, and a packet crosses several); deeper, the translation fails and the packet
/// is dropped (counted in [`XlateCounters::too_deep`]).
pub const MAX_RESUBMIT_DEPTH: usize = 64;
/// Most nested resubmits of any direction in one translation: a bound on the translation's
/// recursion (its stack), which OVS's limits leave to [`MAX_RESUBMITS`]; OVN's deepest path
/// here (switch, router, switch: about 130) is well inside. Beyond, as too deep.
pub const MAX_RESUBMIT_NESTING: usize = 512;
/// Most resubmits (and table visits) in one translation, as OVS's `MAX_RESUBMITS`
/// (`MAX_DEPTH²`); beyond, the packet is dropped ([`XlateCounters::too_many`]).
pub const MAX_RESUBMITS: usize = MAX_RESUBMIT_DEPTH * MAX_RESUBMIT_DEPTH;

/// Translations that failed on a limit (per pipeline; a clone of the pipeline shares
/// them, see [`Pipeline::with_xlate_counters`]). Each counts translations (upcalls), not
/// packets: the megaflow that caches the failed translation's drop is hit without
/// translating again.
#[derive(Debug, Default)]
pub struct XlateCounters {
    /// Resubmits nested deeper than [`MAX_RESUBMIT_DEPTH`].
    pub too_deep: AtomicU64,
    /// More than [`MAX_RESUBMITS`] resubmits and table visits.
    pub too_many: AtomicU64,
    /// `pop` of an empty stack (the action does nothing, as in OVS; the translation goes
    /// on), or `push` onto a full one ([`MAX_STACK`]: the value is not pushed).
    pub stack_errors: AtomicU64,
}

/// Most values on a translation's stack (OVS's grows without bound; each of OVN's
/// push/pop pairs is in one rule).
pub const MAX_STACK: usize = 1024;

/// Why a translation failed (its packet is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XlateError {
    /// [`MAX_RESUBMIT_DEPTH`] reached.
    TooDeep,
    /// [`MAX_RESUBMITS`] reached.
    TooManyResubmits,
}

/// One bucket of a compiled group.
#[derive(Debug)]
pub struct CompiledBucket {
    pub weight: u16,
    /// Whether its watched port (or group) is live; true when it watches nothing.
    pub live: bool,
    pub actions: Vec<ResolvedAction>,
    pub stats: Arc<RuleStats>,
}

/// A group as the pipeline holds it.
#[derive(Debug)]
pub struct CompiledGroup {
    pub id: u32,
    pub ty: GroupType,
    pub buckets: Vec<CompiledBucket>,
    pub stats: Arc<RuleStats>,
}

/// The counters of a group and of each of its buckets (in bucket order), shared by the
/// group and the megaflows that went through it.
#[derive(Debug, Default, Clone)]
pub struct GroupStats {
    pub group: Arc<RuleStats>,
    pub buckets: Vec<Arc<RuleStats>>,
}

impl GroupStats {
    /// Fresh counters for `g`'s buckets.
    pub fn for_group(g: &GroupSpec) -> GroupStats {
        GroupStats {
            group: Arc::default(),
            buckets: g.buckets.iter().map(|_| Arc::default()).collect(),
        }
    }

    /// The group's `(packets, bytes)` and each bucket's, in bucket order, now (plain data:
    /// a hot upgrade carries them to the new daemon's [`GroupStats::restore`]).
    pub fn snapshot(&self) -> ((u64, u64), Vec<(u64, u64)>) {
        use std::sync::atomic::Ordering;
        let get = |s: &RuleStats| {
            (
                s.packets.load(Ordering::Relaxed),
                s.bytes.load(Ordering::Relaxed),
            )
        };
        (
            get(&self.group),
            self.buckets.iter().map(|b| get(b)).collect(),
        )
    }

    /// Adds counters taken by [`GroupStats::snapshot`] of the same group to these.
    /// Buckets pair by position: counters for a bucket this group lacks are left out.
    pub fn restore(&self, group: (u64, u64), buckets: &[(u64, u64)]) {
        use std::sync::atomic::Ordering;
        let add = |s: &RuleStats, (p, b): (u64, u64)| {
            s.packets.fetch_add(p, Ordering::Relaxed);
            s.bytes.fetch_add(b, Ordering::Relaxed);
        };
        add(&self.group, group);
        for (s, &c) in self.buckets.iter().zip(buckets) {
            add(s, c);
        }
    }
}

/// Most nested groups (a bucket's `group:N` into another group) a translation follows; a
/// deeper one drops (the control plane refuses chains that loop).
pub const MAX_GROUP_DEPTH: usize = 8;

/// A rule as the pipeline holds it.
#[derive(Debug)]
pub struct CompiledRule {
    pub priority: u16,
    /// The rule's cookie (a continuation's frames carry it).
    pub cookie: u64,
    pub actions: Vec<ResolvedAction>,
    pub stats: Arc<RuleStats>,
    /// Order of insertion into the pipeline (from 1).
    pub id: u64,
}

/// The result of a translation.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    pub actions: Vec<DpAction>,
    /// Every key bit the decision depended on.
    pub mask: FlowKey,
    /// Every rule matched on the way (and, see [`Pipeline::with_table_stats`], the
    /// counters of the tables looked in).
    pub rules: Vec<Arc<RuleStats>>,
    /// Set when the translation hit a limit: `actions` is then empty (the packet dropped).
    pub error: Option<XlateError>,
    /// The rules `learn` actions learned on the way (for the control plane to add; the
    /// tables are not changed by a translation, see [`crate::learn`]).
    pub learned: Vec<Learned>,
    /// `pop`s of an empty stack and `push`es onto a full one (see
    /// [`XlateCounters::stack_errors`]).
    pub stack_errors: u32,
}

/// Most table visits per translation (loop safety; gotos only go forward anyway).
const MAX_VISITS: usize = 64;

/// The rule tables of a bridge. Cloning is cheap (the tables are persistent maps, see
/// [`Classifier`]): a change of a few rules is a clone of the published pipeline, then
/// [`Pipeline::insert`]/[`Pipeline::remove`] on it.
#[derive(Debug, Default, Clone)]
pub struct Pipeline {
    tables: Vec<Classifier<Arc<CompiledRule>>>,
    rules: usize,
    plain_normal: bool,
    /// The last [`CompiledRule::id`] given.
    next_id: u64,
    /// Per table: the counters of lookups and of lookups that matched (OpenFlow's table
    /// statistics), credited like rule counters through the megaflows; empty: not counted.
    table_stats: Vec<TableCounters>,
    groups: HashMap<u32, Arc<CompiledGroup>>,
    xlate: Arc<XlateCounters>,
    /// OpenFlow port number → datapath port id, and back (what a register holds is the
    /// number OpenFlow sees: `output:reg15`, `move` from or `load` to in_port); `None`:
    /// the numbers are the ids (tests, a bridge without OpenFlow numbers).
    port_numbers: Option<Arc<PortNumbers>>,
}

/// A bridge's OpenFlow port numbers and datapath port ids.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PortNumbers {
    to_id: HashMap<u32, u32>,
    to_no: HashMap<u32, u32>,
}

impl PortNumbers {
    /// From `(ofport, datapath id)` pairs.
    pub fn new(pairs: impl IntoIterator<Item = (u32, u32)>) -> PortNumbers {
        let mut p = PortNumbers::default();
        for (no, id) in pairs {
            p.to_id.insert(no, id);
            p.to_no.insert(id, no);
        }
        p
    }
}

/// The in_port of a key whose OpenFlow port number names no port: matches no rule's
/// `in_port` (OVS's `load:0->NXM_OF_IN_PORT[]` makes an output to the real input port
/// possible).
pub const NO_PORT_ID: u32 = u32::MAX;

/// The counters of one table: its lookups and its lookups that found a rule (their
/// `packets`), shared by the control plane and the megaflows, like [`RuleStats`].
#[derive(Debug, Default, Clone)]
pub struct TableCounters {
    pub lookup: Arc<RuleStats>,
    pub matched: Arc<RuleStats>,
}

/// An action with its ports resolved; `rule` is the rule it belongs to (a group bucket's
/// have none: their packet-ins say ACTION, table 0, cookie 0).
fn resolve_action(
    a: &ActionSpec,
    rule: Option<&FlowSpec>,
    resolve: &dyn Fn(&str) -> Option<u32>,
) -> ResolvedAction {
    match a {
        ActionSpec::Output(n) => ResolvedAction::Output(resolve(n)),
        ActionSpec::Mirror(n) => ResolvedAction::Mirror(resolve(n)),
        ActionSpec::InPort => ResolvedAction::InPort,
        ActionSpec::Normal => ResolvedAction::Normal,
        ActionSpec::Flood | ActionSpec::All => ResolvedAction::Flood,
        ActionSpec::Drop => ResolvedAction::Drop,
        ActionSpec::SetField(f, v) => ResolvedAction::SetField(*f, *v),
        ActionSpec::SetVlanVid(v) => ResolvedAction::SetVlanVid(*v),
        ActionSpec::SetVlanPcp(v) => ResolvedAction::SetVlanPcp(*v),
        ActionSpec::PopVlan => ResolvedAction::PopVlan,
        ActionSpec::SetEcn(e) => ResolvedAction::SetEcn(*e),
        ActionSpec::PushVlan(t) => ResolvedAction::PushVlan(*t),
        ActionSpec::SetTunnel(t) => ResolvedAction::SetTunnel(*t),
        ActionSpec::GotoTable(t) => ResolvedAction::GotoTable(*t),
        ActionSpec::Group(g) => ResolvedAction::Group(*g),
        ActionSpec::DecTtl => ResolvedAction::DecTtl,
        ActionSpec::SetQueue(q) => ResolvedAction::SetQueue(*q),
        ActionSpec::WriteActions(v) => ResolvedAction::WriteActions(
            v.iter().map(|a| resolve_action(a, rule, resolve)).collect(),
        ),
        ActionSpec::Meter(m) => ResolvedAction::Meter(*m),
        ActionSpec::Controller { max_len, ext } => {
            let e = ext.as_deref();
            ResolvedAction::Controller(ControllerAction {
                max_len: *max_len,
                reason: match e.and_then(|e| e.reason) {
                    Some(r) => r,
                    None if rule.is_some_and(is_table_miss) => REASON_NO_MATCH,
                    None => REASON_ACTION,
                },
                table_id: rule.map_or(0, |r| r.table),
                cookie: rule.map_or(0, |r| r.cookie),
                controller_id: e.map_or(0, |e| e.controller_id),
                userdata: e
                    .filter(|e| !e.userdata.is_empty())
                    .map(|e| Arc::from(e.userdata.as_slice())),
                pause: e.is_some_and(|e| e.pause),
                meter_id: e.and_then(|e| e.meter_id),
                at: None,
            })
        }
        ActionSpec::ClearActions => ResolvedAction::ClearActions,
        ActionSpec::WriteMetadata { value, mask } => ResolvedAction::WriteMetadata {
            value: *value,
            mask: *mask,
        },
        ActionSpec::PushMpls(t) => ResolvedAction::PushMpls(*t),
        ActionSpec::PopMpls(t) => ResolvedAction::PopMpls(*t),
        ActionSpec::SetMplsTtl(t) => ResolvedAction::SetMplsTtl(*t),
        ActionSpec::DecMplsTtl => ResolvedAction::DecMplsTtl,
        ActionSpec::Ct(c) => ResolvedAction::Ct(c.clone()),
        ActionSpec::CtClear => ResolvedAction::CtClear,
        ActionSpec::Load { field, value, mask } => ResolvedAction::Load {
            field: *field,
            value: *value,
            mask: *mask,
        },
        ActionSpec::Move { src, dst } => ResolvedAction::Move {
            src: *src,
            dst: *dst,
        },
        ActionSpec::Resubmit { port, table } => ResolvedAction::Resubmit {
            port: port.as_ref().map(|n| resolve(n)),
            table: *table,
        },
        ActionSpec::OutputReg(f) => ResolvedAction::OutputReg(*f),
        ActionSpec::Learn(l) => ResolvedAction::Learn(Arc::new(ResolvedLearn {
            spec: (**l).clone(),
            origin: rule.map(|r| (r.table, r.priority, r.m)),
        })),
        ActionSpec::StackPush(f) => ResolvedAction::StackPush(*f),
        ActionSpec::StackPop(f) => ResolvedAction::StackPop(*f),
        ActionSpec::Clone(v) => {
            ResolvedAction::Clone(v.iter().map(|a| resolve_action(a, rule, resolve)).collect())
        }
        ActionSpec::CheckPktLarger { len, dst } => ResolvedAction::CheckPktLarger {
            len: *len,
            dst: *dst,
        },
        ActionSpec::Conjunction {
            id,
            clause,
            n_clauses,
        } => ResolvedAction::Conjunction {
            id: *id,
            clause: *clause,
            n_clauses: *n_clauses,
        },
    }
}

impl ResolvedAction {
    /// The rule syntax of this action (a continuation's frames go to the controller as
    /// OpenFlow actions through it); `name` gives a datapath port's name. `None`: the
    /// action does nothing (an output to a port that did not resolve).
    pub fn to_spec(&self, name: &dyn Fn(u32) -> Option<String>) -> Option<ActionSpec> {
        use crate::spec::ControllerExt;
        Some(match self {
            ResolvedAction::Output(p) => ActionSpec::Output(name((*p)?)?),
            ResolvedAction::Mirror(p) => ActionSpec::Mirror(name((*p)?)?),
            ResolvedAction::InPort => ActionSpec::InPort,
            ResolvedAction::Normal => ActionSpec::Normal,
            ResolvedAction::Flood => ActionSpec::Flood,
            ResolvedAction::Drop => ActionSpec::Drop,
            ResolvedAction::SetField(f, v) => ActionSpec::SetField(*f, *v),
            ResolvedAction::SetEcn(e) => ActionSpec::SetEcn(*e),
            ResolvedAction::SetVlanVid(v) => ActionSpec::SetVlanVid(*v),
            ResolvedAction::SetVlanPcp(v) => ActionSpec::SetVlanPcp(*v),
            ResolvedAction::PopVlan => ActionSpec::PopVlan,
            ResolvedAction::PushVlan(t) => ActionSpec::PushVlan(*t),
            ResolvedAction::SetTunnel(t) => ActionSpec::SetTunnel(*t),
            ResolvedAction::GotoTable(t) => ActionSpec::GotoTable(*t),
            ResolvedAction::Meter(m) => ActionSpec::Meter(*m),
            ResolvedAction::Controller(c) => {
                let ext = ControllerExt {
                    reason: (c.reason != REASON_ACTION).then_some(c.reason),
                    controller_id: c.controller_id,
                    userdata: c.userdata.as_deref().unwrap_or_default().to_vec(),
                    pause: c.pause,
                    meter_id: c.meter_id,
                };
                ActionSpec::Controller {
                    max_len: c.max_len,
                    ext: (!ext.is_plain()).then(|| Box::new(ext)),
                }
            }
            ResolvedAction::Group(g) => ActionSpec::Group(*g),
            ResolvedAction::DecTtl => ActionSpec::DecTtl,
            ResolvedAction::SetQueue(q) => ActionSpec::SetQueue(*q),
            ResolvedAction::WriteActions(list) => {
                ActionSpec::WriteActions(list.iter().filter_map(|a| a.to_spec(name)).collect())
            }
            ResolvedAction::ClearActions => ActionSpec::ClearActions,
            ResolvedAction::WriteMetadata { value, mask } => ActionSpec::WriteMetadata {
                value: *value,
                mask: *mask,
            },
            ResolvedAction::PushMpls(t) => ActionSpec::PushMpls(*t),
            ResolvedAction::PopMpls(t) => ActionSpec::PopMpls(*t),
            ResolvedAction::SetMplsTtl(t) => ActionSpec::SetMplsTtl(*t),
            ResolvedAction::DecMplsTtl => ActionSpec::DecMplsTtl,
            ResolvedAction::Ct(c) => ActionSpec::Ct(c.clone()),
            ResolvedAction::CtClear => ActionSpec::CtClear,
            ResolvedAction::Load { field, value, mask } => ActionSpec::Load {
                field: *field,
                value: *value,
                mask: *mask,
            },
            ResolvedAction::Move { src, dst } => ActionSpec::Move {
                src: *src,
                dst: *dst,
            },
            ResolvedAction::Resubmit { port, table } => ActionSpec::Resubmit {
                port: match port {
                    None => None,
                    Some(p) => Some(name((*p)?)?),
                },
                table: *table,
            },
            ResolvedAction::OutputReg(f) => ActionSpec::OutputReg(*f),
            // A resumed learn teaches as the paused one would, but no longer names the rule
            // that taught it (`delete_learned` of that rule then leaves its rule alone).
            ResolvedAction::Learn(l) => ActionSpec::Learn(Box::new(l.spec.clone())),
            ResolvedAction::StackPush(f) => ActionSpec::StackPush(*f),
            ResolvedAction::StackPop(f) => ActionSpec::StackPop(*f),
            ResolvedAction::Clone(v) => {
                ActionSpec::Clone(v.iter().filter_map(|a| a.to_spec(name)).collect())
            }
            ResolvedAction::CheckPktLarger { len, dst } => ActionSpec::CheckPktLarger {
                len: *len,
                dst: *dst,
            },
            ResolvedAction::Conjunction {
                id,
                clause,
                n_clauses,
            } => ActionSpec::Conjunction {
                id: *id,
                clause: *clause,
                n_clauses: *n_clauses,
            },
        })
    }
}

/// `actions` (a continuation's frame, back from the controller) resolved as the actions
/// of a rule of table `table` with cookie `cookie` (what their packet-ins say).
pub fn resolve_frame(
    actions: &[ActionSpec],
    table: u8,
    cookie: u64,
    resolve: &dyn Fn(&str) -> Option<u32>,
) -> Vec<ResolvedAction> {
    let rule = FlowSpec {
        table,
        priority: 1,
        cookie,
        idle_timeout: 0,
        hard_timeout: 0,
        in_port: None,
        m: crate::Match::catchall(),
        actions: Vec::new(),
    };
    actions
        .iter()
        .map(|a| resolve_action(a, Some(&rule), resolve))
        .collect()
}

impl Pipeline {
    /// Compiles `rules` (specs with their counters); `resolve` maps a port name to its id.
    /// A rule whose `in_port` does not resolve can match nothing and is left out; an output
    /// to a port that does not resolve does nothing.
    pub fn build<'a>(
        rules: impl IntoIterator<Item = (&'a FlowSpec, Arc<RuleStats>)>,
        resolve: &dyn Fn(&str) -> Option<u32>,
    ) -> Pipeline {
        let mut p = Pipeline::default();
        let mut only: Option<&FlowSpec> = None;
        let mut n = 0usize;
        for (spec, stats) in rules {
            n += 1;
            only = if n == 1 { Some(spec) } else { None };
            p.insert(spec, stats, resolve);
        }
        p.plain_normal = only.is_some_and(|s| {
            n == 1
                && s.table == 0
                && s.in_port.is_none()
                && s.m == crate::Match::catchall()
                && s.actions == [ActionSpec::Normal]
        });
        p
    }

    /// The match a rule is classified by: its own with `in_port` resolved; `None` when the
    /// port does not resolve (the rule can match nothing).
    fn classified_match(
        spec: &FlowSpec,
        resolve: &dyn Fn(&str) -> Option<u32>,
    ) -> Option<crate::Match> {
        let mut m = spec.m;
        if let Some(name) = &spec.in_port {
            let id = resolve(name)?;
            m.set(Field::InPort, u128::from(id), u128::from(u32::MAX));
        }
        Some(m)
    }

    /// Adds one rule (replacing one of the same table, match and priority), as
    /// [`Pipeline::build`] adds each. The result is no longer [`Pipeline::is_plain_normal`].
    pub fn insert(
        &mut self,
        spec: &FlowSpec,
        stats: Arc<RuleStats>,
        resolve: &dyn Fn(&str) -> Option<u32>,
    ) {
        self.plain_normal = false;
        let Some(m) = Self::classified_match(spec, resolve) else {
            return;
        };
        let actions = spec
            .actions
            .iter()
            .map(|a| resolve_action(a, Some(spec), resolve))
            .collect();
        let t = usize::from(spec.table);
        while self.tables.len() <= t {
            self.tables.push(Classifier::new());
        }
        self.next_id += 1;
        let rule = Arc::new(CompiledRule {
            priority: spec.priority,
            cookie: spec.cookie,
            actions,
            stats,
            id: self.next_id,
        });
        let conj = crate::spec::conjunctions(&spec.actions);
        if self.tables[t]
            .insert_conj(m, spec.priority, rule, &conj)
            .is_none()
        {
            self.rules += 1;
        }
    }

    /// Removes the rule of `spec`'s table, match and priority, if there is one.
    pub fn remove(&mut self, spec: &FlowSpec, resolve: &dyn Fn(&str) -> Option<u32>) {
        self.plain_normal = false;
        let Some(m) = Self::classified_match(spec, resolve) else {
            return;
        };
        if let Some(c) = self.tables.get_mut(usize::from(spec.table)) {
            if c.remove(&m, spec.priority).is_some() {
                self.rules -= 1;
            }
        }
    }

    /// [`Pipeline::build`] with groups: each with its counters; `live` says whether a port
    /// (by id) is live (link up). A bucket watching a port that does not resolve or is not
    /// live is dead; one watching a group is live when that group exists and has a bucket
    /// whose watched port is live (or that watches none).
    pub fn build_with_groups<'a>(
        rules: impl IntoIterator<Item = (&'a FlowSpec, Arc<RuleStats>)>,
        groups: impl IntoIterator<Item = (&'a GroupSpec, GroupStats)>,
        resolve: &dyn Fn(&str) -> Option<u32>,
        live: &dyn Fn(u32) -> bool,
    ) -> Pipeline {
        let mut p = Pipeline::build(rules, resolve);
        let groups: Vec<(&GroupSpec, GroupStats)> = groups.into_iter().collect();
        let port_live =
            |name: &Option<String>| name.as_ref().is_none_or(|n| resolve(n).is_some_and(live));
        let shallow: HashMap<u32, bool> = groups
            .iter()
            .map(|(g, _)| (g.id, g.buckets.iter().any(|b| port_live(&b.watch_port))))
            .collect();
        for (g, stats) in groups {
            let buckets = g
                .buckets
                .iter()
                .enumerate()
                .map(|(i, b)| CompiledBucket {
                    weight: b.weight,
                    live: port_live(&b.watch_port)
                        && b.watch_group
                            .is_none_or(|w| shallow.get(&w).copied().unwrap_or(false)),
                    actions: b
                        .actions
                        .iter()
                        .map(|a| resolve_action(a, None, resolve))
                        .collect(),
                    stats: stats.buckets.get(i).cloned().unwrap_or_default(),
                })
                .collect();
            p.groups.insert(
                g.id,
                Arc::new(CompiledGroup {
                    id: g.id,
                    ty: g.ty,
                    buckets,
                    stats: stats.group,
                }),
            );
        }
        p.plain_normal = p.plain_normal && p.groups.is_empty();
        p
    }

    /// Group `id`.
    pub fn group(&self, id: u32) -> Option<&Arc<CompiledGroup>> {
        self.groups.get(&id)
    }

    /// Rules installed (those that can match).
    pub fn rule_count(&self) -> usize {
        self.rules
    }

    /// Exactly one rule: table 0, match everything, `actions=NORMAL`.
    pub fn is_plain_normal(&self) -> bool {
        self.plain_normal
    }

    /// Counts lookups per table in `counters` (index: table id) from now on: each
    /// translation's [`Translation::rules`] then also holds the counters of the tables it
    /// looked in (and of those where a rule matched), so the packets of its megaflow are
    /// credited to them as to the rules.
    pub fn with_table_stats(mut self, counters: Vec<TableCounters>) -> Pipeline {
        self.table_stats = counters;
        self
    }

    /// Counts failed translations in `c` (shared with whoever holds it: the bridge's
    /// counters outlive a rebuilt pipeline).
    pub fn with_xlate_counters(mut self, c: Arc<XlateCounters>) -> Pipeline {
        self.xlate = c;
        self
    }

    /// The counters of failed translations.
    pub fn xlate_counters(&self) -> &Arc<XlateCounters> {
        &self.xlate
    }

    /// Sets the OpenFlow port numbers (see [`PortNumbers`]).
    pub fn set_port_numbers(&mut self, p: PortNumbers) {
        self.port_numbers = Some(Arc::new(p));
    }

    /// The rule of `table` that `k` matches, widening `wc` by what the lookup consulted:
    /// the one lookup every translation walk (upcall, trace, packet-out) runs.
    fn lookup_rule(
        &self,
        table: usize,
        k: &FlowKey,
        wc: &mut FlowKey,
    ) -> Option<&Arc<CompiledRule>> {
        self.tables
            .get(table)
            .and_then(|c| c.lookup(k, wc))
            .map(|(r, _)| r)
    }

    /// Translates `key` through the tables (see the module doc).
    pub fn translate(&self, key: &FlowKey) -> Translation {
        let lookup = |table: usize, k: &FlowKey, wc: &mut FlowKey| self.lookup_rule(table, k, wc);
        let groups = |g: u32| self.groups.get(&g);
        let ports = self.port_numbers.as_deref();
        if self.table_stats.is_empty() {
            let t = walk_full(key, &lookup, &groups, ports, None, None);
            self.count_error(&t);
            return t;
        }
        let visits = std::cell::RefCell::new(Vec::new());
        let mut t = walk_full(
            key,
            &|table, k, wc| {
                let r = lookup(table, k, wc);
                visits.borrow_mut().push((table, r.is_some()));
                r
            },
            &groups,
            ports,
            None,
            None,
        );
        self.count_error(&t);
        for (table, hit) in visits.into_inner() {
            if let Some(c) = self.table_stats.get(table) {
                t.rules.push(c.lookup.clone());
                if hit {
                    t.rules.push(c.matched.clone());
                }
            }
        }
        t
    }

    /// [`Pipeline::translate`] reporting each table visit and recirculation to `sink`
    /// (`ferrovs trace`, see [`crate::trace`]): the same walk, but it changes no state —
    /// no table or failure counters are credited (what a translation learns is returned,
    /// never applied; rule counters are only ever credited by the datapath's megaflows).
    pub fn translate_traced(&self, key: &FlowKey, sink: &mut dyn TraceSink) -> Translation {
        let lookup = |table: usize, k: &FlowKey, wc: &mut FlowKey| self.lookup_rule(table, k, wc);
        let groups = |g: u32| self.groups.get(&g);
        walk_full(
            key,
            &lookup,
            &groups,
            self.port_numbers.as_deref(),
            None,
            Some(sink),
        )
    }

    /// Translates `key` through `actions` (a PACKET_OUT's; ports resolved with `resolve`)
    /// as if a rule of table 0 had matched it: their `resubmit`s and `goto_table` look this
    /// pipeline's tables up, as OVS runs a packet-out's actions against the bridge's tables
    /// (ovn-controller's pinctrl resubmits its packets into the logical pipeline).
    pub fn translate_actions(
        &self,
        key: &FlowKey,
        actions: &[ActionSpec],
        resolve: &dyn Fn(&str) -> Option<u32>,
    ) -> Translation {
        let resolved: Vec<ResolvedAction> = actions
            .iter()
            .map(|a| resolve_action(a, None, resolve))
            .collect();
        let lookup = |table: usize, k: &FlowKey, wc: &mut FlowKey| self.lookup_rule(table, k, wc);
        let groups = |g: u32| self.groups.get(&g);
        let t = walk_full(
            key,
            &lookup,
            &groups,
            self.port_numbers.as_deref(),
            Some(&resolved),
            None,
        );
        self.count_error(&t);
        t
    }

    /// Resumes a translation frozen by `controller(pause)` (see [`Frozen`]): `key` is the
    /// packet the controller sent back with the registers, metadata and ct fields its
    /// `NXT_RESUME` carries; the frames' `resubmit`s look this pipeline's tables up (the
    /// tables as they are now, as OVS resumes against its current tables).
    pub fn resume(&self, key: &FlowKey, frozen: &Frozen) -> Translation {
        let lookup = |table: usize, k: &FlowKey, wc: &mut FlowKey| self.lookup_rule(table, k, wc);
        let groups = |g: u32| self.groups.get(&g);
        let t = walk_resume(key, &lookup, &groups, self.port_numbers.as_deref(), frozen);
        self.count_error(&t);
        t
    }

    fn count_error(&self, t: &Translation) {
        use std::sync::atomic::Ordering::Relaxed;
        if t.stack_errors != 0 {
            self.xlate
                .stack_errors
                .fetch_add(u64::from(t.stack_errors), Relaxed);
        }
        match t.error {
            Some(XlateError::TooDeep) => self.xlate.too_deep.fetch_add(1, Relaxed),
            Some(XlateError::TooManyResubmits) => self.xlate.too_many.fetch_add(1, Relaxed),
            None => 0,
        };
    }

    /// Every rule of table `t`: (match, priority, rule).
    pub fn table_rules(&self, t: usize) -> Vec<(crate::Match, u16, &Arc<CompiledRule>)> {
        self.tables
            .get(t)
            .map(|c| c.iter().collect())
            .unwrap_or_default()
    }

    /// Number of tables (the highest used + 1).
    pub fn tables(&self) -> usize {
        self.tables.len()
    }
}

/// A table-miss rule as OVS defines it (`ofproto_rule_is_table_miss`): priority 0 and a
/// match of everything. Its controller action sends `OFPR_NO_MATCH`.
pub fn is_table_miss(spec: &FlowSpec) -> bool {
    spec.priority == 0 && spec.in_port.is_none() && spec.m == crate::Match::catchall()
}

/// The translation walk over tables, with `lookup(table, key, wc)` finding a table's rule
/// (the pipeline's classifiers; a linear reference in tests). No groups: a `group:N` drops.
pub fn walk<'a>(
    key: &FlowKey,
    lookup: impl Fn(usize, &FlowKey, &mut FlowKey) -> Option<&'a Arc<CompiledRule>>,
) -> Translation {
    walk_with_groups(key, lookup, &|_| None)
}

/// Finds a table's rule for a key, OR'ing the bits it consulted into the mask.
type RuleLookup<'l, 'a> =
    dyn Fn(usize, &FlowKey, &mut FlowKey) -> Option<&'a Arc<CompiledRule>> + 'l;

/// What a translation carries from action to action.
struct State<'p> {
    t: Translation,
    /// The key as modified so far (what later lookups see).
    k: FlowKey,
    /// The port the packet came in on (datapath id), whatever the translation writes to
    /// in_port.
    origin_port: u32,
    /// The input port (datapath id) as the key has it now (a `load` or `move` to in_port,
    /// a `resubmit(PORT,T)` change it for what follows).
    in_port: u32,
    /// Set once a modification was emitted: a later mirror needs the original packet.
    modified: bool,
    /// The action set (`write_actions`), executed when the pipeline ends.
    set: Vec<ResolvedAction>,
    /// Fields written so far (a mask), so a bucket's restore depends on what it wrote, not
    /// on whether a value happened to stay equal.
    written: FlowKey,
    /// VLAN tags pushed minus popped so far (the key holds only the outer tag).
    vlan_depth: i32,
    /// MPLS label stack entries pushed minus popped so far.
    mpls_depth: i32,
    /// Set when a label that was not the bottom of the stack was popped: the key holds only
    /// the top entry, so the new top's fields are unknown (0 in the key). A later table's
    /// lookup, or an action that reads them, ends the translation (see [`walk_with_groups`]).
    mpls_unknown: bool,
    /// The table whose rule is running (`resubmit(,)` without a table resubmits to it).
    table: usize,
    /// Resubmits nested now, and resubmits and table visits so far (OVS's limits).
    depth: usize,
    resubmits: usize,
    /// Resubmits nested now, whatever their direction ([`MAX_RESUBMIT_NESTING`]).
    nesting: usize,
    /// OpenFlow port numbers (see [`PortNumbers`]).
    ports: Option<&'p PortNumbers>,
    /// The cookie of the rule whose actions run (a continuation's frames carry it).
    cookie: u64,
    /// Set by `controller(pause)`: the index of its datapath action and the continuation
    /// being unrolled (each action list the pause was inside adds its rest on the way out).
    frozen: Option<(usize, Frozen)>,
    /// While unrolling out of a `resubmit(PORT,T)`: the in_port (OpenFlow number) the
    /// caller's rest of actions runs with.
    frozen_in_port: Option<u32>,
    /// Buckets of `all` groups nested now: each runs on a copy of the packet, so
    /// connection tracking is skipped there (a tracker's verdict cannot be set back).
    copies: u32,
    /// Set when a `ct(table=T)` ended the pass (in a rule or in a group's bucket): nothing
    /// after it runs, the next pass starts in table T.
    recirculated: bool,
    /// The register stack (`push`/`pop`): each value right-aligned, as OVS keeps them.
    stack: Vec<u128>,
    /// Set once a `check_pkt_larger` joined its two branches: the key then holds the
    /// fields as before the check, whatever each branch wrote, so a bucket's or clone's
    /// restore sets back every field written (not only those whose value changed).
    forked: bool,
    /// `ferrovs trace`'s recorder ([`Pipeline::translate_traced`]); `None` on the
    /// datapath's upcalls, where it costs one untaken branch per table visit.
    trace: Option<&'p mut dyn TraceSink>,
}

impl State<'_> {
    /// The OpenFlow port number of datapath port `id`.
    fn port_no(&self, id: u32) -> u32 {
        match self.ports {
            None => id,
            Some(p) => p.to_no.get(&id).copied().unwrap_or(0),
        }
    }

    /// The datapath action that sends to port `p` (which OpenFlow's rule allows: `p` is not
    /// the in_port as the translation has it now). When `p` is the port the packet really
    /// came in on (its in_port was rewritten: OVN's `load:0xffff->NXM_OF_IN_PORT[]` before
    /// sending an ARP reply back where the request came from), that is the datapath's
    /// `InPort`: a datapath `Output` never goes back out of the input port.
    fn output(&self, p: u32) -> DpAction {
        if p == self.origin_port {
            DpAction::InPort
        } else {
            DpAction::Output(p)
        }
    }

    /// The datapath port of OpenFlow port number `no` ([`NO_PORT_ID`]: none).
    fn port_id(&self, no: u32) -> u32 {
        match self.ports {
            None => no,
            Some(p) => p.to_id.get(&no).copied().unwrap_or(NO_PORT_ID),
        }
    }
}

/// Finds a group by id.
type GroupLookup<'g> = dyn Fn(u32) -> Option<&'g Arc<CompiledGroup>> + 'g;

/// [`walk`] with groups. Groups expand into datapath actions in place: every bucket starts
/// from the packet as it entered the group, so after a bucket the fields it changed are
/// set back (datapath edits restoring the entry values, whose fields join the mask), and the
/// actions after the group see the packet as before it (as OVS). `select` picks a live
/// bucket by a hash of the L2-L4 addresses and ports, all of which join the mask, so a
/// cached decision holds for every packet it matches. Metadata and the registers are 0 on
/// a first pass's input and written only by rules already consulted (with values that are
/// functions of bits already in the mask: a `move` puts its source's bits in it), so their
/// bits leave the mask at the end; a resumed pass (recirculation id not 0) keeps them (its
/// metadata and registers come from the key).
pub fn walk_with_groups<'a>(
    key: &FlowKey,
    lookup: impl Fn(usize, &FlowKey, &mut FlowKey) -> Option<&'a Arc<CompiledRule>>,
    groups: &GroupLookup<'a>,
) -> Translation {
    walk_full(key, &lookup, groups, None, None, None)
}

/// How a run of tables ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// A rule without `goto_table` finished.
    Finished,
    /// A table had no rule for the packet.
    Missed,
    /// The packet goes no further (dropped, recirculated, a limit hit).
    Stopped,
}

/// [`walk_with_groups`] with OpenFlow port numbers; `first`: actions to run as if a rule of
/// table 0 had matched (a packet-out's) instead of looking table 0 up.
fn walk_full<'a, 'p>(
    key: &FlowKey,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    ports: Option<&'p PortNumbers>,
    first: Option<&[ResolvedAction]>,
    trace: Option<&'p mut dyn TraceSink>,
) -> Translation {
    let mut st = State::new(key, ports);
    st.trace = trace;
    // Recirculation: the same key bits with another recirculation id are another
    // packet (another pass), so the id is always in the mask; a resumed pass starts in
    // the table its id names (an id no `ct(table=T)` gives drops).
    st.t.mask.or_field(Field::RecircId, Field::RecircId.full());
    let recirc = key.get(Field::RecircId) as u16;
    let table = match (recirc, crate::ct::recirc_table(recirc)) {
        (0, _) => 0usize,
        (_, Some(t)) => usize::from(t),
        (_, None) => return st.t,
    };
    let ended = match first {
        None => run_tables(&mut st, table, lookup, groups) == Run::Finished,
        Some(actions) => {
            let mut next = None;
            if !apply(&mut st, actions, &mut next, lookup, groups, 0) {
                false
            } else {
                match next {
                    Some(n) => run_tables(&mut st, n, lookup, groups) == Run::Finished,
                    None => true,
                }
            }
        }
    };
    finish(&mut st, ended, lookup, groups);
    if recirc == 0 {
        // A first pass's metadata and registers are 0 on input; a resumed pass's are the
        // key's own (the values frozen at its ct action), which the rules' matches and
        // the actions that read them put in the mask.
        st.t.mask.set(Field::Metadata, 0);
        for w in &mut st.t.mask.0[REG_WORD..REG_WORD + 8] {
            *w = 0;
        }
    }
    st.t
}

impl<'p> State<'p> {
    fn new(key: &FlowKey, ports: Option<&'p PortNumbers>) -> State<'p> {
        State {
            t: Translation::default(),
            k: *key,
            origin_port: key.in_port(),
            in_port: key.in_port(),
            modified: false,
            set: Vec::new(),
            written: FlowKey::default(),
            vlan_depth: 0,
            mpls_depth: 0,
            mpls_unknown: false,
            table: 0,
            depth: 0,
            resubmits: 0,
            nesting: 0,
            ports,
            cookie: 0,
            frozen: None,
            frozen_in_port: None,
            copies: 0,
            recirculated: false,
            stack: Vec::new(),
            forked: false,
            trace: None,
        }
    }
}

/// The end of a translation: the action set when the pipeline `ended` (not when it
/// stopped, paused or missed), a failure's drop, a pause's continuation put into its
/// packet-in.
fn finish<'a>(st: &mut State, ended: bool, lookup: &RuleLookup<'_, 'a>, groups: &GroupLookup<'a>) {
    if ended && !st.set.is_empty() && st.t.error.is_none() && st.frozen.is_none() {
        let mut set = std::mem::take(&mut st.set);
        // OpenFlow's order; a group in the set replaces the output.
        set.sort_by_key(|a| set_slot(a).0);
        if set.iter().any(|a| matches!(a, ResolvedAction::Group(_))) {
            set.retain(|a| set_slot(a).0 != 70);
        }
        let mut next = None;
        apply(st, &set, &mut next, lookup, groups, 0);
    }
    if let Some((at, frozen)) = st.frozen.take() {
        if let Some(DpAction::Controller(c)) = st.t.actions.get_mut(at) {
            let mut s = c.at.as_deref().cloned().unwrap_or_default();
            s.frozen = Some(frozen);
            c.at = Some(Arc::new(s));
        }
    }
    if st.t.error.is_some() {
        // A failed translation drops the packet (as OVS): what it emitted is not done.
        st.t.actions.clear();
        st.t.learned.clear();
    }
    sink_after_checks(&mut st.t.actions);
}

/// Moves what follows a [`DpAction::CheckPktLen`] in its list (the actions of the frames
/// around the `check_pkt_larger`, made after its branches joined) to the end of both its
/// branches, so that a check is always last in its list and the datapath only descends.
fn sink_after_checks(actions: &mut Vec<DpAction>) {
    let Some(k) = actions
        .iter()
        .position(|a| matches!(a, DpAction::CheckPktLen(_)))
    else {
        return;
    };
    let tail = actions.split_off(k + 1);
    if let Some(DpAction::CheckPktLen(c)) = actions.last_mut() {
        let c = Arc::make_mut(c);
        for b in [&mut c.larger, &mut c.smaller] {
            b.extend(tail.iter().cloned());
            sink_after_checks(b);
        }
    }
}

/// `check_pkt_larger(len)->dst` at the head of `rest`'s list (as OVS's
/// `xlate_check_pkt_larger`): the rest of the list (with its `goto_table`) and then the
/// action set are translated twice, with the bit 1 (the `larger` branch) and with it 0,
/// from the same state, each into its own action list; the two become one
/// [`DpAction::CheckPktLen`], which the datapath decides per packet. The megaflow's mask
/// is the union of both branches' (the packet's length is not in the key: the check is in
/// the actions instead). After the branches the state is set back to where it was before
/// the check (the bit too), the action set is spent, and the frames around the check go
/// on (their actions end up in both branches, see [`sink_after_checks`]). A branch cannot
/// pause (`controller(pause)` sends its packet-in without a continuation), and a branch
/// that recirculates (`ct(table=T)`) ends the pass for both. Each check costs two of
/// [`MAX_RESUBMITS`]: checks in a row double the work, and this bounds it.
#[allow(clippy::too_many_arguments)]
fn check_pkt_larger<'a>(
    st: &mut State,
    len: u16,
    dst: &SubField,
    rest: &[ResolvedAction],
    next: &mut Option<usize>,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    depth: usize,
) -> bool {
    st.resubmits += 2;
    if st.resubmits > MAX_RESUBMITS {
        st.t.error = Some(XlateError::TooManyResubmits);
        return false;
    }
    let entry = st.k;
    let (in_port, table, cookie) = (st.in_port, st.table, st.cookie);
    let (written, vlan_depth, mpls_depth) = (st.written, st.vlan_depth, st.mpls_depth);
    let (mpls_unknown, modified) = (st.mpls_unknown, st.modified);
    let stack = st.stack.clone();
    let set = st.set.clone();
    let before = std::mem::take(&mut st.t.actions);
    let mut lists: [Vec<DpAction>; 2] = Default::default();
    let mut all_written = written;
    let mut recirculated = false;
    for (b, bit) in [(0usize, 1u128), (1, 0)] {
        st.k = entry;
        st.in_port = in_port;
        st.table = table;
        st.cookie = cookie;
        st.written = written;
        st.vlan_depth = vlan_depth;
        st.mpls_depth = mpls_depth;
        st.mpls_unknown = mpls_unknown;
        st.modified = modified;
        st.stack = stack.clone();
        st.set = set.clone();
        st.recirculated = false;
        write_bits(st, dst.field, bit << dst.ofs, dst.mask());
        let mut nx = *next;
        let mut ended = apply(st, rest, &mut nx, lookup, groups, depth + 1);
        if ended {
            if let Some(t) = nx.filter(|&t| t > table) {
                ended = run_tables(st, t, lookup, groups) == Run::Finished;
            }
        }
        if ended && !st.set.is_empty() && st.t.error.is_none() {
            let mut set = std::mem::take(&mut st.set);
            set.sort_by_key(|a| set_slot(a).0);
            if set.iter().any(|a| matches!(a, ResolvedAction::Group(_))) {
                set.retain(|a| set_slot(a).0 != 70);
            }
            let mut n = None;
            apply(st, &set, &mut n, lookup, groups, depth + 1);
        }
        if st.t.error.is_some() {
            st.t.actions = before;
            return false;
        }
        recirculated |= st.recirculated;
        all_written.union(&st.written);
        lists[b] = std::mem::take(&mut st.t.actions);
    }
    st.k = entry;
    st.in_port = in_port;
    st.table = table;
    st.cookie = cookie;
    st.written = all_written;
    st.vlan_depth = vlan_depth;
    st.mpls_depth = mpls_depth;
    st.mpls_unknown = mpls_unknown;
    st.modified = true;
    st.stack = stack;
    st.set.clear();
    st.forked = true;
    st.recirculated = recirculated;
    *next = None;
    let [larger, smaller] = lists;
    st.t.actions = before;
    st.t.actions
        .push(DpAction::CheckPktLen(Arc::new(CheckPktLen {
            len,
            larger,
            smaller,
        })));
    !recirculated
}

/// Resumes a frozen translation (see [`Frozen`]) on `key` (the packet the controller sent
/// back, with the registers, metadata and ct fields of its message).
fn walk_resume<'a>(
    key: &FlowKey,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    ports: Option<&PortNumbers>,
    frozen: &Frozen,
) -> Translation {
    let mut st = State::new(key, ports);
    st.set = frozen.action_set.clone();
    let mut ended = true;
    let n = frozen.frames.len();
    for (i, f) in frozen.frames.iter().enumerate() {
        st.table = usize::from(f.table);
        st.cookie = f.cookie;
        let mut next = None;
        let mut run = if apply(&mut st, &f.actions, &mut next, lookup, groups, 0) {
            Run::Finished
        } else {
            Run::Stopped
        };
        if run == Run::Finished {
            if let Some(t) = next.filter(|&t| t > usize::from(f.table)) {
                run = run_tables(&mut st, t, lookup, groups);
            }
        }
        match run {
            Run::Stopped => {
                if let Some((_, fz)) = st.frozen.as_mut() {
                    // Paused again: the outer frames are still to do after this one.
                    fz.frames.extend(frozen.frames[i + 1..].iter().cloned());
                }
                ended = false;
                break;
            }
            // A miss in the outermost list's goto ends the pipeline (as a first pass's
            // would); an inner one was inside a resubmit, which goes on.
            Run::Missed if i + 1 == n => ended = false,
            _ => {}
        }
    }
    finish(&mut st, ended, lookup, groups);
    st.t
}

/// `controller(pause)` at `actions[i]`: the continuation starts with the rest of this list.
fn freeze_rest(st: &mut State, rest: &[ResolvedAction], next: Option<usize>) {
    let in_port = st.frozen_in_port.take();
    let table = st.table;
    let cookie = st.cookie;
    let Some((_, fz)) = st.frozen.as_mut() else {
        return;
    };
    let mut actions = Vec::new();
    if let Some(no) = in_port {
        // Back from `resubmit(PORT,T)`: the rest runs with the caller's in_port.
        actions.push(ResolvedAction::Load {
            field: Field::InPort,
            value: u128::from(no),
            mask: Field::InPort.full(),
        });
    }
    let mut goto = next;
    for a in rest {
        match a {
            ResolvedAction::GotoTable(t) => goto = Some(usize::from(*t)),
            ResolvedAction::WriteMetadata { value, mask } => actions.push(ResolvedAction::Load {
                field: Field::Metadata,
                value: u128::from(*value),
                mask: u128::from(*mask),
            }),
            // Instructions after the pause only touch the action set: applied to the
            // frozen one now (exact unless a resubmit before them writes the same slot).
            ResolvedAction::ClearActions => fz.action_set.clear(),
            ResolvedAction::WriteActions(list) => {
                for w in list {
                    let slot = set_slot(w);
                    fz.action_set.retain(|x| set_slot(x) != slot);
                    fz.action_set.push(w.clone());
                }
            }
            // The meter instruction runs first: never after a pause.
            ResolvedAction::Meter(_) => {}
            ResolvedAction::Resubmit { port, table: None } => {
                actions.push(ResolvedAction::Resubmit {
                    port: *port,
                    table: Some(table as u8),
                })
            }
            other => actions.push(other.clone()),
        }
    }
    if let Some(t) = goto {
        actions.push(ResolvedAction::Resubmit {
            port: None,
            table: Some(t as u8),
        });
    }
    if !actions.is_empty() {
        fz.frames.push(FrozenFrame {
            table: table as u8,
            cookie,
            actions,
        });
    }
}

/// Looks `table` up and runs the rule found, then the tables its `goto_table`s name.
fn run_tables<'a>(
    st: &mut State,
    mut table: usize,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
) -> Run {
    for _ in 0..MAX_VISITS {
        if st.mpls_unknown {
            // A later table could match the MPLS entry under a popped non-bottom label,
            // which the key does not hold: the translation ends here, the packet goes only
            // where the actions so far sent it (a documented limit; OVS keeps three entries).
            return Run::Stopped;
        }
        st.resubmits += 1;
        if st.resubmits > MAX_RESUBMITS {
            st.t.error = Some(XlateError::TooManyResubmits);
            return Run::Stopped;
        }
        let found = lookup(table, &st.k, &mut st.t.mask);
        if let Some(t) = st.trace.as_deref_mut() {
            t.lookup(table as u8, st.nesting, &st.k, found);
        }
        let Some(rule) = found else {
            return Run::Missed;
        };
        st.t.rules.push(rule.stats.clone());
        st.table = table;
        st.cookie = rule.cookie;
        let mut next = None;
        if !apply(st, &rule.actions, &mut next, lookup, groups, 0) {
            // dec_ttl at TTL 0/1, a recirculation, a limit: the packet goes no further.
            return Run::Stopped;
        }
        match next {
            Some(n) if n > table => table = n,
            _ => return Run::Finished,
        }
    }
    Run::Stopped
}

/// `resubmit(PORT,TABLE)`: false when the packet goes no further.
fn resubmit<'a>(
    st: &mut State,
    port: Option<Option<u32>>,
    table: Option<u8>,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
) -> bool {
    let port = match port {
        Some(None) => return true,
        Some(Some(p)) => Some(p),
        None => None,
    };
    let target = table.map_or(st.table, usize::from);
    // Only a resubmit that goes back can loop: OVS deepens for those alone.
    let deepens = usize::from(target <= st.table);
    if st.depth + deepens > MAX_RESUBMIT_DEPTH || st.nesting >= MAX_RESUBMIT_NESTING {
        st.t.error = Some(XlateError::TooDeep);
        return false;
    }
    let (saved_key_port, saved_in_port, saved_table) = (st.k.in_port(), st.in_port, st.table);
    let saved_cookie = st.cookie;
    if let Some(p) = port {
        st.k.set(Field::InPort, u128::from(p));
        st.in_port = p;
    }
    st.depth += deepens;
    st.nesting += 1;
    let r = run_tables(st, target, lookup, groups);
    st.nesting -= 1;
    st.depth -= deepens;
    st.table = saved_table;
    st.cookie = saved_cookie;
    if port.is_some() && st.frozen.is_some() {
        st.frozen_in_port = Some(st.port_no(saved_key_port));
    }
    if port.is_some() {
        st.k.set(Field::InPort, u128::from(saved_key_port));
        st.in_port = saved_in_port;
    }
    r != Run::Stopped
}

/// Writes `value`'s bits under `mask` into `field` of the translation's key: a register,
/// metadata or in_port only there (and in the mask's view: nothing to emit), a packet
/// field as a rewrite (the field's bits the write keeps join the mask).
fn write_bits(st: &mut State, field: Field, value: u128, mask: u128) {
    let mask = mask & field.full();
    if mask == 0 {
        return;
    }
    if field.is_register() || field == Field::Metadata {
        let old = st.k.get(field);
        st.k.set(field, (old & !mask) | (value & mask));
        return;
    }
    if field == Field::InPort {
        // What OpenFlow writes is a port number: the key holds the datapath id.
        let old = u128::from(st.port_no(st.k.in_port()));
        let no = ((old & !mask) | (value & mask)) as u32;
        let id = st.port_id(no);
        st.k.set(Field::InPort, u128::from(id));
        st.in_port = id;
        return;
    }
    let old = st.k.get(field);
    if mask != field.full() {
        st.t.mask.or_field(field, field.full() & !mask);
    }
    let v = (old & !mask) | (value & mask);
    set_field(st, field, v);
}

/// The bits of `src` in the key, as OpenFlow sees them (in_port as its port number);
/// they join the mask.
fn read_bits(st: &mut State, src: &SubField) -> u128 {
    st.t.mask.or_field(src.field, src.mask());
    if src.field == Field::InPort {
        let no = u128::from(st.port_no(st.k.in_port()));
        return (no >> src.ofs) & src.ones();
    }
    src.get(&st.k)
}

/// An action's place in the action set: (order of execution, which slot it takes; an
/// action replaces the one in its slot).
fn set_slot(a: &ResolvedAction) -> (u8, u32) {
    // OpenFlow 1.3 5.10: pop, push-MPLS, push-VLAN, decrement TTL, set, qos, group, output.
    match a {
        ResolvedAction::PopVlan => (10, 0),
        ResolvedAction::PopMpls(_) => (10, 1),
        ResolvedAction::PushMpls(_) => (20, 0),
        ResolvedAction::PushVlan(_) => (21, 0),
        ResolvedAction::DecTtl => (30, 0),
        ResolvedAction::DecMplsTtl => (30, 1),
        ResolvedAction::SetField(f, _) => (40, *f as u32),
        ResolvedAction::SetMplsTtl(_) => (40, Field::MplsTtl as u32),
        ResolvedAction::SetEcn(_) => (40, 1002),
        ResolvedAction::SetVlanVid(_) => (40, 1000),
        ResolvedAction::SetVlanPcp(_) => (40, 1001),
        ResolvedAction::SetTunnel(_) => (40, Field::TunId as u32),
        ResolvedAction::Load { field, .. } => (40, 3000 + *field as u32),
        ResolvedAction::Move { dst, .. } => (40, 4000 + dst.field as u32),
        ResolvedAction::SetQueue(_) => (50, 0),
        ResolvedAction::Group(_) => (60, 0),
        _ => (70, 0),
    }
}

/// The fields of the top MPLS label stack entry (and how the payload under it was parsed).
const MPLS_LSE: [Field; 5] = [
    Field::MplsLabel,
    Field::MplsTc,
    Field::MplsBos,
    Field::MplsTtl,
    Field::MplsPayload,
];

/// The top label stack entry of `k` as on the wire (label·tc·bos·ttl).
fn lse_of(k: &FlowKey) -> u32 {
    (k.get(Field::MplsLabel) as u32) << 12
        | (k.get(Field::MplsTc) as u32) << 9
        | (k.get(Field::MplsBos) as u32) << 8
        | k.get(Field::MplsTtl) as u32
}

/// Fields a packet's key takes from its Ethernet header, its tunnel or the pipeline: the
/// rest (L3, L4 and MPLS) depends on the Ethertype.
fn is_l2_or_meta(f: Field) -> bool {
    f.is_register()
        || matches!(
            f,
            Field::InPort
                | Field::EthType
                | Field::VlanTci
                | Field::EthDst
                | Field::EthSrc
                | Field::TunId
                | Field::TunSrc
                | Field::TunDst
                | Field::Metadata
                | Field::TunMetadata0
                | Field::TunMetadata1
                | Field::TunMetadata2
                | Field::TunMetadata3
        )
}

/// `push_mpls:ety` (see [`ActionSpec::PushMpls`]); false when the entry to copy is unknown.
fn push_mpls(st: &mut State, ety: u16) -> bool {
    st.t.mask.or_field(Field::EthType, 0xffff);
    let ty = st.k.eth_type();
    let lse = if is_mpls(ty) {
        if st.mpls_unknown {
            return false;
        }
        for f in MPLS_LSE {
            st.t.mask.or_field(f, f.full());
        }
        // A copy of the top entry, no longer the bottom of the stack.
        lse_of(&st.k) & !0x100
    } else {
        let (mut ttl, mut tc) = (64u32, 0u32);
        if matches!(ty, ETH_IPV4 | ETH_IPV6) {
            // OVS's flow_push_mpls: TC from the DSCP's low bits, the IP TTL unless 0.
            st.t.mask.or_field(Field::IpTos, 0x1c);
            st.t.mask.or_field(Field::IpTtl, 0xff);
            tc = ((st.k.get(Field::IpTos) as u32) >> 2) & 7;
            let t = st.k.get(Field::IpTtl) as u32;
            if t != 0 {
                ttl = t;
            }
        }
        let kind = match ty {
            ETH_IPV4 => MPLS_PAYLOAD_IPV4,
            ETH_IPV6 => MPLS_PAYLOAD_IPV6,
            ETH_ARP => MPLS_PAYLOAD_ARP,
            _ => 0,
        };
        st.k.set(Field::MplsPayload, u128::from(kind));
        // Label 0 (IPv4 explicit null), 2 (IPv6 explicit null) over IPv6, as OVS.
        let label = if ty == ETH_IPV6 { 2u32 } else { 0 };
        label << 12 | tc << 9 | 1 << 8 | ttl
    };
    st.k.set(Field::MplsLabel, u128::from(lse >> 12));
    st.k.set(Field::MplsTc, u128::from((lse >> 9) & 7));
    st.k.set(Field::MplsBos, u128::from((lse >> 8) & 1));
    st.k.set(Field::MplsTtl, u128::from(lse & 0xff));
    st.k.set(Field::EthType, u128::from(ety));
    for f in MPLS_LSE.into_iter().chain([Field::EthType]) {
        st.written.or_field(f, f.full());
    }
    st.modified = true;
    st.mpls_depth += 1;
    st.t.actions.push(DpAction::PushMpls {
        ethertype: ety,
        lse,
    });
    true
}

/// `pop_mpls:ety`: on a bottom-of-stack entry the parsed-through payload fields become the
/// key's when they were parsed as `ety` says (else they are cleared, as extracting the
/// popped frame would leave them); under a non-bottom entry the new top is unknown. False
/// when the entry to pop is itself unknown.
fn pop_mpls(st: &mut State, ety: u16) -> bool {
    st.t.mask.or_field(Field::EthType, 0xffff);
    if !is_mpls(st.k.eth_type()) {
        return true;
    }
    if st.mpls_unknown {
        return false;
    }
    st.t.mask.or_field(Field::MplsBos, 1);
    let keep = if st.k.get(Field::MplsBos) == 1 {
        st.t.mask.or_field(Field::MplsPayload, 3);
        let kind = st.k.get(Field::MplsPayload) as u8;
        matches!(
            (kind, ety),
            (MPLS_PAYLOAD_IPV4, ETH_IPV4)
                | (MPLS_PAYLOAD_IPV6, ETH_IPV6)
                | (MPLS_PAYLOAD_ARP, ETH_ARP)
        )
    } else {
        st.mpls_unknown = is_mpls(ety);
        false
    };
    for f in Field::ALL {
        if is_l2_or_meta(f) {
            continue;
        }
        // Only the key forgets a payload parsed as another protocol: the packet's bytes
        // stay, so those fields are not "written" (a bucket's restore must not rewrite them).
        if MPLS_LSE.contains(&f) {
            st.written.or_field(f, f.full());
            st.k.set(f, 0);
        } else if !keep {
            st.k.set(f, 0);
        }
    }
    st.k.set(Field::EthType, u128::from(ety));
    st.written.or_field(Field::EthType, 0xffff);
    st.modified = true;
    st.mpls_depth -= 1;
    st.t.actions.push(DpAction::PopMpls { ethertype: ety });
    true
}

/// Whether the key carries the header `f` lives in (a bucket's rewrite is not checked
/// against a match); the protocol fields join the mask.
fn carries(st: &mut State, f: Field) -> bool {
    let ty = st.k.eth_type();
    let ip = || matches!(ty, ETH_IPV4 | ETH_IPV6);
    match f {
        Field::Ipv4Src | Field::Ipv4Dst => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            // ARP's protocol addresses are these fields too.
            matches!(ty, ETH_IPV4 | ETH_ARP)
        }
        Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Flabel => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            ty == ETH_IPV6
        }
        Field::IpTos | Field::IpTtl => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            ip()
        }
        Field::TpSrc | Field::TpDst => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            st.t.mask.or_field(Field::IpProto, 0xff);
            let p = st.k.ip_proto();
            // TCP/UDP ports, or ICMP's type and code.
            (ip() && matches!(p, IP_TCP | IP_UDP))
                || (ty == ETH_IPV4 && p == IP_ICMP)
                || (ty == ETH_IPV6 && p == IP_ICMPV6)
        }
        Field::ArpOp => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            ty == ETH_ARP
        }
        // ARP's hardware addresses, or an NS's/NA's link-layer address options.
        Field::ArpSha | Field::ArpTha | Field::NdTarget => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            if ty == ETH_ARP {
                return f != Field::NdTarget;
            }
            st.t.mask.or_field(Field::IpProto, 0xff);
            if ty != ETH_IPV6 || st.k.ip_proto() != IP_ICMPV6 {
                return false;
            }
            st.t.mask.or_field(Field::TpSrc, 0xffff);
            st.t.mask.or_field(Field::TpDst, 0xffff);
            // ND fields are extracted from code 0 only.
            st.k.tp_dst() == 0
                && matches!(st.k.tp_src(), t if t == u16::from(ND_NS) || t == u16::from(ND_NA))
        }
        Field::MplsLabel | Field::MplsTc | Field::MplsTtl | Field::MplsBos => {
            st.t.mask.or_field(Field::EthType, 0xffff);
            is_mpls(ty)
        }
        _ => true,
    }
}

/// Rewrites packet field `f` to `v` (when the packet carries it): the key, the datapath
/// action, the mask of what the action depends on.
fn set_field(st: &mut State, f: Field, v: u128) {
    if !carries(st, f) {
        return;
    }
    st.modified = true;
    st.written.or_field(f, f.full());
    if f == Field::VlanTci && st.k.vlan_tci() & VLAN_CFI == 0 {
        st.vlan_depth += 1;
    }
    let (t, k) = (&mut st.t, &mut st.k);
    match f {
        Field::VlanTci => {
            let tci = (v as u16) | VLAN_CFI;
            k.set(Field::VlanTci, u128::from(tci));
            t.actions.push(DpAction::SetVlanTci { tci });
            t.mask.or_field(Field::VlanTci, u128::from(VLAN_CFI));
        }
        Field::TunId => {
            k.set(f, v);
            t.actions.push(DpAction::SetTunnel { id: v as u64 });
        }
        Field::TunDst => {
            k.set(f, v);
            t.actions
                .push(DpAction::SetTunnelDst(Ipv4Addr::from(v as u32)));
        }
        _ => {
            k.set(f, v);
            t.actions.push(set_action(f, v & f.full()));
        }
    }
}

/// Applies `actions` (a rule's, a bucket's, or the action set); `next` gets a goto's table.
/// False when the packet was dropped (dec_ttl at TTL 0 or 1): the list ends there.
fn apply<'a>(
    st: &mut State,
    actions: &[ResolvedAction],
    next: &mut Option<usize>,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    depth: usize,
) -> bool {
    for (i, a) in actions.iter().enumerate() {
        if st.t.error.is_some() {
            return false;
        }
        let in_port = st.in_port;
        match *a {
            ResolvedAction::Output(Some(p)) => {
                // OpenFlow: never back out of the input port unless asked.
                st.t.mask.or_field(Field::InPort, u128::from(u32::MAX));
                if p != in_port {
                    st.t.actions.push(st.output(p));
                }
            }
            ResolvedAction::Mirror(Some(p)) => {
                st.t.mask.or_field(Field::InPort, u128::from(u32::MAX));
                if p != in_port {
                    let out = st.output(p);
                    if st.modified {
                        // The copy as received: insert it before any edit.
                        st.t.actions.insert(0, out);
                    } else {
                        st.t.actions.push(out);
                    }
                }
            }
            ResolvedAction::Output(None) | ResolvedAction::Mirror(None) => {}
            ResolvedAction::InPort => st.t.actions.push(DpAction::InPort),
            ResolvedAction::Normal => {
                if let Some(t) = st.trace.as_deref_mut() {
                    t.normal(&st.k);
                }
                st.t.actions.push(DpAction::Normal)
            }
            ResolvedAction::Flood => st.t.actions.push(DpAction::Flood),
            ResolvedAction::Drop => {}
            ResolvedAction::SetField(f, v) => {
                if f.is_register() || matches!(f, Field::Metadata | Field::InPort) {
                    write_bits(st, f, v, f.full());
                } else {
                    set_field(st, f, v);
                }
            }
            ResolvedAction::Load { field, value, mask } => write_bits(st, field, value, mask),
            ResolvedAction::Move { src, dst } => {
                let v = read_bits(st, &src);
                write_bits(st, dst.field, v << dst.ofs, dst.mask());
            }
            ResolvedAction::OutputReg(src) => {
                let no = read_bits(st, &src) as u32;
                let p = st.port_id(no);
                st.t.mask.or_field(Field::InPort, u128::from(u32::MAX));
                if p != NO_PORT_ID && p != st.in_port {
                    let out = st.output(p);
                    st.t.actions.push(out);
                }
            }
            ResolvedAction::Resubmit { port, table } => {
                if !resubmit(st, port, table, lookup, groups) {
                    freeze_rest(st, &actions[i + 1..], *next);
                    return false;
                }
            }
            ResolvedAction::StackPush(src) => {
                let v = read_bits(st, &src);
                if st.stack.len() < MAX_STACK {
                    st.stack.push(v);
                } else {
                    st.t.stack_errors += 1;
                }
            }
            ResolvedAction::StackPop(dst) => match st.stack.pop() {
                Some(v) => write_bits(st, dst.field, (v & dst.ones()) << dst.ofs, dst.mask()),
                None => st.t.stack_errors += 1,
            },
            ResolvedAction::Clone(ref list) => {
                if !run_clone(st, list, lookup, groups, depth) {
                    return false;
                }
            }
            ResolvedAction::CheckPktLarger { len, dst } => {
                let rest = &actions[i + 1..];
                return check_pkt_larger(st, len, &dst, rest, next, lookup, groups, depth);
            }
            // A soft rule's: never the answer of a lookup (see crate::classifier).
            ResolvedAction::Conjunction { .. } => {}
            ResolvedAction::SetVlanVid(vid) => {
                st.modified = true;
                // The result depends on whether the frame has a tag (its PCP is kept).
                st.t.mask.or_field(Field::VlanTci, 0xffff);
                st.written.or_field(Field::VlanTci, 0xffff);
                let old = st.k.vlan_tci();
                if old & VLAN_CFI == 0 {
                    st.vlan_depth += 1;
                }
                let tci = (old & 0xe000) | VLAN_CFI | (vid & 0x0fff);
                st.k.set(Field::VlanTci, u128::from(tci));
                st.t.actions.push(DpAction::SetVlanTci { tci });
            }
            ResolvedAction::SetVlanPcp(pcp) => {
                st.modified = true;
                st.t.mask.or_field(Field::VlanTci, 0xffff);
                st.written.or_field(Field::VlanTci, 0xffff);
                let old = st.k.vlan_tci();
                if old & VLAN_CFI == 0 {
                    st.vlan_depth += 1;
                }
                let tci = (old & 0x0fff) | VLAN_CFI | (u16::from(pcp & 7) << 13);
                st.k.set(Field::VlanTci, u128::from(tci));
                st.t.actions.push(DpAction::SetVlanTci { tci });
            }
            ResolvedAction::PushVlan(tpid) => {
                st.modified = true;
                // A new outer tag, VID 0 until set (OpenFlow push_vlan).
                let tci = VLAN_CFI;
                st.written.or_field(Field::VlanTci, 0xffff);
                st.vlan_depth += 1;
                st.k.set(Field::VlanTci, u128::from(tci));
                st.t.actions.push(DpAction::PushVlan { tci, tpid });
            }
            ResolvedAction::SetEcn(ecn) => {
                if !carries(st, Field::IpTos) {
                    continue;
                }
                // The datapath writes the whole byte: the DSCP it keeps joins the mask.
                st.modified = true;
                st.t.mask.or_field(Field::IpTos, 0xfc);
                st.written.or_field(Field::IpTos, 0xff);
                let tos = (st.k.get(Field::IpTos) & 0xfc) | u128::from(ecn & 3);
                st.k.set(Field::IpTos, tos);
                st.t.actions.push(DpAction::SetField(Field::IpTos, tos));
            }
            ResolvedAction::PopVlan => {
                st.modified = true;
                st.t.mask.or_field(Field::VlanTci, u128::from(VLAN_CFI));
                if st.k.vlan_tci() & VLAN_CFI != 0 {
                    st.written.or_field(Field::VlanTci, 0xffff);
                    st.vlan_depth -= 1;
                    st.k.set(Field::VlanTci, 0);
                    st.t.actions.push(DpAction::PopVlan);
                }
            }
            ResolvedAction::SetTunnel(id) => {
                st.written.or_field(Field::TunId, Field::TunId.full());
                st.k.set(Field::TunId, u128::from(id));
                st.t.actions.push(DpAction::SetTunnel { id });
            }
            ResolvedAction::GotoTable(n) => *next = Some(usize::from(n)),
            ResolvedAction::DecTtl => {
                if !carries(st, Field::IpTtl) {
                    continue;
                }
                st.t.mask.or_field(Field::IpTtl, 0xff);
                let ttl = st.k.get(Field::IpTtl);
                if ttl <= 1 {
                    return false;
                }
                st.modified = true;
                st.written.or_field(Field::IpTtl, 0xff);
                st.k.set(Field::IpTtl, ttl - 1);
                st.t.actions.push(DpAction::SetField(Field::IpTtl, ttl - 1));
            }
            ResolvedAction::SetQueue(_) => {}
            ResolvedAction::WriteMetadata { value, mask } => {
                let old = st.k.get(Field::Metadata) as u64;
                st.k.set(Field::Metadata, u128::from((old & !mask) | (value & mask)));
            }
            ResolvedAction::ClearActions => st.set.clear(),
            ResolvedAction::WriteActions(ref list) => {
                for w in list {
                    let slot = set_slot(w);
                    st.set.retain(|x| set_slot(x) != slot);
                    st.set.push(w.clone());
                }
            }
            ResolvedAction::Group(g) => {
                run_group(st, g, lookup, groups, depth);
                if st.recirculated {
                    // A bucket's ct(table=T): the pass ends there (as a rule's).
                    return false;
                }
            }
            ResolvedAction::Meter(m) => st.t.actions.push(DpAction::Meter(m)),
            ResolvedAction::Controller(ref c) => {
                if controller(st, c, depth) {
                    freeze_rest(st, &actions[i + 1..], *next);
                    return false;
                }
            }
            ResolvedAction::PushMpls(ety) => {
                if !push_mpls(st, ety) {
                    return false;
                }
            }
            ResolvedAction::PopMpls(ety) => {
                if !pop_mpls(st, ety) {
                    return false;
                }
            }
            ResolvedAction::SetMplsTtl(ttl) => {
                if !carries(st, Field::MplsTtl) {
                    continue;
                }
                st.modified = true;
                st.written.or_field(Field::MplsTtl, 0xff);
                st.k.set(Field::MplsTtl, u128::from(ttl));
                st.t.actions
                    .push(DpAction::SetField(Field::MplsTtl, u128::from(ttl)));
            }
            // Connection tracking is not run in an `all` group's bucket (a copy of the
            // packet whose effects are set back after it); in a select, indirect or
            // fast_failover group's one bucket it runs as in a rule (OVN's load balancer).
            ResolvedAction::Ct(_) | ResolvedAction::CtClear if st.copies > 0 => {}
            ResolvedAction::Ct(ref spec) => {
                // The action carries the metadata and the registers: on a resumed pass
                // their bits come from the key (a first pass's mask drops them at the
                // end, they are 0 there). A zone from a field reads that field.
                st.t.mask.or_field(Field::Metadata, Field::Metadata.full());
                for w in &mut st.t.mask.0[REG_WORD..REG_WORD + 8] {
                    *w = u64::MAX;
                }
                if let Some(z) = &spec.zone_src {
                    st.t.mask.or_field(z.field, z.mask());
                }
                for (src, _) in &spec.moves {
                    st.t.mask.or_field(src.field, src.mask());
                }
                if spec.nat != CtNat::Off {
                    // The tracker may rewrite the frame: a later mirror needs the original.
                    st.modified = true;
                }
                st.t.actions
                    .push(DpAction::Ct(Arc::new(CtAction::from_spec(spec, &st.k))));
                if spec.table.is_some() {
                    st.recirculated = true;
                    if let Some(t) = st.trace.as_deref_mut() {
                        t.recirculate(&st.k);
                    }
                    // Recirculation: the rest happens on the next pass (which starts in
                    // table T with the ct fields set). Unlike OVS, the pending action set
                    // is dropped (OVS freezes it with the packet) and this rule's later
                    // actions are not run on the untracked packet (docs/conntrack.md).
                    return false;
                }
                // Without a table the key's ct fields stay as they were (as OVS): a later
                // lookup sees the state from before this action.
            }
            ResolvedAction::Learn(ref l) => {
                l.spec.mask_sources(&mut st.t.mask);
                let no = st.port_no(st.k.in_port());
                let mut x = l.spec.learn(&st.k, no);
                x.origin = l.origin;
                st.t.learned.push(x);
            }
            ResolvedAction::CtClear => {
                st.t.actions.push(DpAction::CtClear);
                for f in CT_FIELDS {
                    st.k.set(f, 0);
                }
            }
            ResolvedAction::DecMplsTtl => {
                if !carries(st, Field::MplsTtl) {
                    continue;
                }
                if st.mpls_unknown {
                    return false;
                }
                st.t.mask.or_field(Field::MplsTtl, 0xff);
                let ttl = st.k.get(Field::MplsTtl);
                if ttl <= 1 {
                    // OVS sends a PACKET_IN with OFPR_INVALID_TTL only to a controller that
                    // asked for that reason (not OpenFlow 1.3's default): it drops here.
                    return false;
                }
                st.modified = true;
                st.written.or_field(Field::MplsTtl, 0xff);
                st.k.set(Field::MplsTtl, ttl - 1);
                st.t.actions
                    .push(DpAction::SetField(Field::MplsTtl, ttl - 1));
            }
        }
    }
    true
}

/// The packet-in fields a `controller` action reads from the key (they join the mask).
const PACKET_IN_CT: [Field; 4] = [Field::CtState, Field::CtZone, Field::CtMark, Field::CtLabel];

/// A `controller` action: its packet-in with the pipeline's state here. True when it
/// pauses the translation (`pause`, not inside a group's bucket: a bucket's effects are set
/// back after it, which a continuation could not do).
fn controller(st: &mut State, c: &ControllerAction, depth: usize) -> bool {
    // The message carries the metadata, the registers and the ct fields as they are now:
    // every bit of them is part of the decision (a first pass's registers and metadata
    // leave the mask at the end, being functions of the bits already in it).
    st.t.mask.or_field(Field::Metadata, Field::Metadata.full());
    for w in &mut st.t.mask.0[REG_WORD..REG_WORD + 8] {
        *w = u64::MAX;
    }
    for f in PACKET_IN_CT {
        st.t.mask.or_field(f, f.full());
    }
    let mut regs = [0u64; 8];
    regs.copy_from_slice(&st.k.0[REG_WORD..REG_WORD + 8]);
    let state = PacketInState {
        regs,
        metadata: st.k.get(Field::Metadata) as u64,
        ct_state: st.k.get(Field::CtState) as u32,
        ct_zone: st.k.get(Field::CtZone) as u16,
        ct_mark: st.k.get(Field::CtMark) as u32,
        ct_label: st.k.get(Field::CtLabel),
        frozen: None,
    };
    let mut c = c.clone();
    c.at = Some(Arc::new(state));
    let pause = c.pause && depth == 0;
    if !pause {
        c.pause = false;
    }
    st.t.actions.push(DpAction::Controller(c));
    if pause {
        st.frozen = Some((
            st.t.actions.len() - 1,
            Frozen {
                frames: Vec::new(),
                action_set: st.set.clone(),
            },
        ));
    }
    pause
}

/// The datapath action that writes `v` into field `f`: the tunnel fields (`tun_id`,
/// `tun_dst`, `tun_metadataN`) are packet metadata a flow-based tunnel port sends with,
/// every other field a header edit. (Whatever writes a field, `set_field`, a bucket's
/// restore or a `load`/`move`, emits through here.)
#[inline]
pub(crate) fn set_action(f: Field, v: u128) -> DpAction {
    match f {
        Field::TunId => DpAction::SetTunnel { id: v as u64 },
        Field::TunDst => DpAction::SetTunnelDst(Ipv4Addr::from(v as u32)),
        _ => match f.tun_metadata_index() {
            Some(index) => DpAction::SetTunnelMetadata {
                index: index as u8,
                value: v as u32,
            },
            None => DpAction::SetField(f, v),
        },
    }
}

/// The fields `ct_clear` sets back to untracked (0).
const CT_FIELDS: [Field; 9] = [
    Field::CtState,
    Field::CtZone,
    Field::CtMark,
    Field::CtLabel,
    Field::CtNwSrc,
    Field::CtNwDst,
    Field::CtNwProto,
    Field::CtTpSrc,
    Field::CtTpDst,
];

/// The fields a `select` group hashes (all join the mask).
const SELECT_FIELDS: [Field; 10] = [
    Field::EthSrc,
    Field::EthDst,
    Field::EthType,
    Field::IpProto,
    Field::Ipv4Src,
    Field::Ipv4Dst,
    Field::Ipv6Src,
    Field::Ipv6Dst,
    Field::TpSrc,
    Field::TpDst,
];

/// Expands group `id` (see [`walk_with_groups`]).
fn run_group<'a>(
    st: &mut State,
    id: u32,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    depth: usize,
) {
    if depth >= MAX_GROUP_DEPTH {
        return;
    }
    let Some(g) = groups(id) else {
        return;
    };
    st.t.rules.push(g.stats.clone());
    match g.ty {
        GroupType::All => {
            st.copies += 1;
            for b in g.buckets.iter().filter(|b| b.live) {
                run_bucket(st, b, lookup, groups, depth);
            }
            st.copies -= 1;
        }
        GroupType::Indirect => {
            if let Some(b) = g.buckets.first() {
                run_bucket(st, b, lookup, groups, depth);
            }
        }
        GroupType::FastFailover => {
            if let Some(b) = g.buckets.iter().find(|b| b.live) {
                run_bucket(st, b, lookup, groups, depth);
            }
        }
        GroupType::Select => {
            let total: u64 = g
                .buckets
                .iter()
                .filter(|b| b.live)
                .map(|b| u64::from(b.weight))
                .sum();
            if total == 0 {
                return;
            }
            let mut h = FlowKey::default();
            for f in SELECT_FIELDS {
                st.t.mask.or_field(f, f.full());
                h.set(f, st.k.get(f));
            }
            let mut pick = h.hash() % total;
            for b in g.buckets.iter().filter(|b| b.live) {
                let w = u64::from(b.weight);
                if pick < w {
                    run_bucket(st, b, lookup, groups, depth);
                    break;
                }
                pick -= w;
            }
        }
    }
}

/// `clone(...)`: runs `actions` on the packet and translation state as they are, then sets
/// back what they changed (packet fields through datapath edits, as a group's bucket; the
/// key, registers, metadata, input port, stack and action set from a saved copy), as OVS's
/// `xlate_clone`. A clone whose actions end the packet's pass (a `ct(table=T)`
/// recirculation inside it, usually through a resubmit) takes the packet with it: what
/// follows the clone is not run (ferrovs has no datapath clone to run it on a copy; OVN
/// puts its clones that reach a `ct` last). False then, or when the translation failed.
fn run_clone<'a>(
    st: &mut State,
    actions: &[ResolvedAction],
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    depth: usize,
) -> bool {
    let entry = st.k;
    let (written, vlan_depth) = (st.written, st.vlan_depth);
    let (mpls_depth, mpls_unknown) = (st.mpls_depth, st.mpls_unknown);
    let (in_port, table) = (st.in_port, st.table);
    let stack = st.stack.clone();
    let set = st.set.clone();
    st.written = FlowKey::default();
    let mut next = None;
    let went_on = apply(st, actions, &mut next, lookup, groups, depth);
    if st.t.error.is_some() {
        return false;
    }
    if !went_on
        && (st.recirculated
            || matches!(st.t.actions.last(), Some(DpAction::Ct(c)) if c.recirc.is_some()))
    {
        return false;
    }
    restore(st, &entry, vlan_depth, mpls_depth);
    st.k = entry;
    st.in_port = in_port;
    st.table = table;
    st.mpls_unknown = mpls_unknown;
    st.stack = stack;
    st.set = set;
    st.written.union(&written);
    true
}

/// Runs one bucket on the packet as it entered the group, then sets back what it changed.
fn run_bucket<'a>(
    st: &mut State,
    b: &CompiledBucket,
    lookup: &RuleLookup<'_, 'a>,
    groups: &GroupLookup<'a>,
    depth: usize,
) {
    st.t.rules.push(b.stats.clone());
    let entry = st.k;
    let (written, vlan_depth) = (st.written, st.vlan_depth);
    let (mpls_depth, mpls_unknown) = (st.mpls_depth, st.mpls_unknown);
    st.written = FlowKey::default();
    let mut next = None;
    let in_port = st.in_port;
    // A limit hit in the bucket fails the whole translation (`error` is set); anything
    // else that stops a bucket (dec_ttl at 1) stops only it.
    apply(st, &b.actions, &mut next, lookup, groups, depth + 1);
    if st.recirculated {
        // A ct(table=T) in the bucket ended the pass: the packet is the tracker's now,
        // the next pass starts from the key as the bucket left it (nothing to set back).
        return;
    }
    st.in_port = in_port;
    restore(st, &entry, vlan_depth, mpls_depth);
    st.mpls_unknown = mpls_unknown;
    st.written.union(&written);
}

/// Emits the edits that bring the packet back to `entry`'s fields (those the bucket wrote;
/// each joins the mask, since what is emitted depends on its entry value), and its VLAN
/// tags back to `vlan_depth`.
fn restore(st: &mut State, entry: &FlowKey, vlan_depth: i32, mpls_depth: i32) {
    let delta = st.vlan_depth - vlan_depth;
    st.vlan_depth = vlan_depth;
    // MPLS entries the bucket pushed are popped first (the fields under them are then
    // restored as usual); one it popped is pushed back last, after the payload's fields.
    let mdelta = st.mpls_depth - mpls_depth;
    st.mpls_depth = mpls_depth;
    if mdelta > 0 {
        st.t.mask.or_field(Field::EthType, 0xffff);
        for i in 0..mdelta {
            let ethertype = if i + 1 == mdelta {
                entry.eth_type()
            } else {
                ETH_MPLS
            };
            st.t.actions.push(DpAction::PopMpls { ethertype });
        }
    }
    for f in Field::ALL {
        if matches!(f, Field::EthType | Field::MplsPayload)
            || (mdelta != 0 && MPLS_LSE.contains(&f))
        {
            st.k.set(f, entry.get(f));
            continue;
        }
        if st.written.get(f) == 0 || matches!(f, Field::Metadata | Field::InPort) {
            // Unwritten, but maybe forgotten by a pop_mpls (see there).
            if f != Field::Metadata {
                st.k.set(f, entry.get(f));
            }
            continue;
        }
        let (now, was) = (st.k.get(f), entry.get(f));
        // After a check's branches joined, `now` is not what each branch left.
        let now = if st.forked { !was } else { now };
        st.k.set(f, was);
        match f {
            Field::VlanTci => {
                st.t.mask.or_field(Field::VlanTci, 0xffff);
                let (now, was) = (now as u16, was as u16);
                for _ in 0..delta.max(0) {
                    st.t.actions.push(DpAction::PopVlan);
                }
                for _ in 0..(-delta).max(0) {
                    st.t.actions.push(DpAction::PushVlan {
                        tci: was,
                        tpid: ETH_VLAN,
                    });
                }
                if delta >= 0 && was & VLAN_CFI != 0 && (delta > 0 || now != was) {
                    st.t.actions.push(DpAction::SetVlanTci { tci: was });
                }
            }
            Field::TunId => {
                st.t.mask.or_field(f, f.full());
                if now != was {
                    st.t.actions.push(DpAction::SetTunnel { id: was as u64 });
                }
            }
            Field::TunDst => {
                st.t.mask.or_field(f, f.full());
                if now != was {
                    st.t.actions
                        .push(DpAction::SetTunnelDst(Ipv4Addr::from(was as u32)));
                }
            }
            _ => {
                st.t.mask.or_field(f, f.full());
                if now != was {
                    st.t.actions.push(set_action(f, was));
                }
            }
        }
    }
    if mdelta < 0 {
        for f in MPLS_LSE {
            st.t.mask.or_field(f, f.full());
        }
        for _ in 0..-mdelta {
            st.t.actions.push(DpAction::PushMpls {
                ethertype: entry.eth_type(),
                lse: lse_of(entry),
            });
        }
    }
}
