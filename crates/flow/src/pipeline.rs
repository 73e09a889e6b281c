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
//! Thread-safety: immutable once built; the control plane builds a new one per change and
//! PMDs share it (`Arc<Pipeline>`).

use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::classifier::Classifier;
use crate::key::{Field, FlowKey, VLAN_CFI};
use crate::spec::{ActionSpec, FlowSpec};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpAction {
    Output(u32),
    /// Back out of the port it came in on.
    InPort,
    /// The learning bridge's decision, made per packet.
    Normal,
    /// Every port of the bridge but the input.
    Flood,
    /// Push an 802.1Q tag (OpenFlow TCI: 0x1000 = present).
    PushVlan {
        tci: u16,
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
    /// Run the packet through the bridge's meter N; a band that drops it drops it for
    /// every later action. (Looked up by id at execution: a meter's configuration changes
    /// without a new pipeline.)
    Meter(u32),
    /// A copy of the packet as it is at this point to the OpenFlow controllers: a PACKET_IN
    /// with these fields.
    Controller(ControllerAction),
}

/// What a PACKET_IN says about the rule that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerAction {
    /// The action's `max_len` (65535: `OFPCML_NO_BUFFER`). As in OVS, which buffers
    /// nothing, it truncates nothing: the whole frame goes up.
    pub max_len: u16,
    /// `OFPR_NO_MATCH` (0) from a table-miss rule, else `OFPR_ACTION` (1).
    pub reason: u8,
    pub table_id: u8,
    pub cookie: u64,
}

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
    SetVlanVid(u16),
    SetVlanPcp(u8),
    PopVlan,
    PushVlan,
    SetTunnel(u64),
    GotoTable(u8),
    Meter(u32),
    Controller(ControllerAction),
}

/// A rule as the pipeline holds it.
#[derive(Debug)]
pub struct CompiledRule {
    pub priority: u16,
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
}

/// The counters of one table: its lookups and its lookups that found a rule (their
/// `packets`), shared by the control plane and the megaflows, like [`RuleStats`].
#[derive(Debug, Default, Clone)]
pub struct TableCounters {
    pub lookup: Arc<RuleStats>,
    pub matched: Arc<RuleStats>,
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
            .map(|a| match a {
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
                ActionSpec::PushVlan(_) => ResolvedAction::PushVlan,
                ActionSpec::SetTunnel(t) => ResolvedAction::SetTunnel(*t),
                ActionSpec::GotoTable(t) => ResolvedAction::GotoTable(*t),
                ActionSpec::Meter(m) => ResolvedAction::Meter(*m),
                ActionSpec::Controller { max_len } => {
                    ResolvedAction::Controller(ControllerAction {
                        max_len: *max_len,
                        reason: if is_table_miss(spec) {
                            REASON_NO_MATCH
                        } else {
                            REASON_ACTION
                        },
                        table_id: spec.table,
                        cookie: spec.cookie,
                    })
                }
            })
            .collect();
        let t = usize::from(spec.table);
        while self.tables.len() <= t {
            self.tables.push(Classifier::new());
        }
        self.next_id += 1;
        let rule = Arc::new(CompiledRule {
            priority: spec.priority,
            actions,
            stats,
            id: self.next_id,
        });
        if self.tables[t].insert(m, spec.priority, rule).is_none() {
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

    /// Translates `key` through the tables (see the module doc).
    pub fn translate(&self, key: &FlowKey) -> Translation {
        let lookup = |table: usize, k: &FlowKey, wc: &mut FlowKey| {
            self.tables
                .get(table)
                .and_then(|c| c.lookup(k, wc))
                .map(|(r, _)| r)
        };
        if self.table_stats.is_empty() {
            return walk(key, lookup);
        }
        let visits = std::cell::RefCell::new(Vec::new());
        let mut t = walk(key, |table, k, wc| {
            let r = lookup(table, k, wc);
            visits.borrow_mut().push((table, r.is_some()));
            r
        });
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
/// (the pipeline's classifiers; a linear reference in tests).
pub fn walk<'a>(
    key: &FlowKey,
    lookup: impl Fn(usize, &FlowKey, &mut FlowKey) -> Option<&'a Arc<CompiledRule>>,
) -> Translation {
    let mut t = Translation::default();
    let mut k = *key;
    let mut table = 0usize;
    let in_port = key.in_port();
    // Set once a modification was emitted: a later mirror needs the original packet.
    let mut modified = false;
    for _ in 0..MAX_VISITS {
        let Some(rule) = lookup(table, &k, &mut t.mask) else {
            break;
        };
        t.rules.push(rule.stats.clone());
        let mut next = None;
        for a in &rule.actions {
            match *a {
                ResolvedAction::Output(Some(p)) => {
                    // OpenFlow: never back out of the input port unless asked.
                    t.mask.or_field(Field::InPort, u128::from(u32::MAX));
                    if p != in_port {
                        t.actions.push(DpAction::Output(p));
                    }
                }
                ResolvedAction::Mirror(Some(p)) => {
                    t.mask.or_field(Field::InPort, u128::from(u32::MAX));
                    if p != in_port {
                        if modified {
                            // The copy as received: insert it before any edit.
                            t.actions.insert(0, DpAction::Output(p));
                        } else {
                            t.actions.push(DpAction::Output(p));
                        }
                    }
                }
                ResolvedAction::Output(None) | ResolvedAction::Mirror(None) => {}
                ResolvedAction::InPort => t.actions.push(DpAction::InPort),
                ResolvedAction::Normal => t.actions.push(DpAction::Normal),
                ResolvedAction::Flood => t.actions.push(DpAction::Flood),
                ResolvedAction::Drop => {}
                ResolvedAction::SetField(f, v) => {
                    modified = true;
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
                            t.actions.push(DpAction::SetField(f, v & f.full()));
                        }
                    }
                }
                ResolvedAction::SetVlanVid(vid) => {
                    modified = true;
                    // The result depends on whether the frame has a tag (its PCP is kept).
                    t.mask.or_field(Field::VlanTci, 0xffff);
                    let old = k.vlan_tci();
                    let tci = (old & 0xe000) | VLAN_CFI | (vid & 0x0fff);
                    k.set(Field::VlanTci, u128::from(tci));
                    t.actions.push(DpAction::SetVlanTci { tci });
                }
                ResolvedAction::SetVlanPcp(pcp) => {
                    modified = true;
                    t.mask.or_field(Field::VlanTci, 0xffff);
                    let old = k.vlan_tci();
                    let tci = (old & 0x0fff) | VLAN_CFI | (u16::from(pcp & 7) << 13);
                    k.set(Field::VlanTci, u128::from(tci));
                    t.actions.push(DpAction::SetVlanTci { tci });
                }
                ResolvedAction::PushVlan => {
                    modified = true;
                    // A new outer tag, VID 0 until set (OpenFlow push_vlan).
                    let tci = VLAN_CFI;
                    k.set(Field::VlanTci, u128::from(tci));
                    t.actions.push(DpAction::PushVlan { tci });
                }
                ResolvedAction::PopVlan => {
                    modified = true;
                    t.mask.or_field(Field::VlanTci, u128::from(VLAN_CFI));
                    if k.vlan_tci() & VLAN_CFI != 0 {
                        k.set(Field::VlanTci, 0);
                        t.actions.push(DpAction::PopVlan);
                    }
                }
                ResolvedAction::SetTunnel(id) => {
                    k.set(Field::TunId, u128::from(id));
                    t.actions.push(DpAction::SetTunnel { id });
                }
                ResolvedAction::GotoTable(n) => next = Some(usize::from(n)),
                ResolvedAction::Meter(m) => t.actions.push(DpAction::Meter(m)),
                ResolvedAction::Controller(c) => t.actions.push(DpAction::Controller(c)),
            }
        }
        match next {
            Some(n) if n > table => table = n,
            _ => break,
        }
    }
    t
}
