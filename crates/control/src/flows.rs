//! The rules of one bridge as the control plane keeps them: parsed specs in insertion order,
//! each with its counters and install time; built into an immutable [`Pipeline`] for the
//! datapath on every change.
//!
//! A new bridge has one rule, `table=0, priority=0 actions=NORMAL` (as OVS). While that is
//! its only rule, the datapath keeps the plain L2 path ([`BridgeRules::is_plain_normal`]).
//! Rules name ports; a name is resolved to the port's datapath id at build time, so a rule
//! may name a port that does not exist yet (it applies once the port is added).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use ferrovs_flow::pipeline::GroupStats;
use ferrovs_flow::spec::{GroupSpec, GroupType};
use ferrovs_flow::{
    ActionSpec, DpAction, Field, FlowFilter, FlowKey, FlowSpec, Match, Pipeline, RuleStats,
    TableCounters,
};

/// One installed group.
#[derive(Debug, Clone)]
pub struct StoredGroup {
    pub spec: GroupSpec,
    pub stats: GroupStats,
    /// When it was installed (duration).
    pub installed: Instant,
}

/// Why a group change is refused (each maps to OpenFlow's `OFPGMFC_*`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("group {0} already exists")]
    Exists(u32),
    #[error("no group {0}")]
    Unknown(u32),
    #[error("group {group}: a bucket sends to group {chained}, which does not exist")]
    UnknownChained { group: u32, chained: u32 },
    #[error("group {0}: its buckets send back to it (a loop)")]
    Loop(u32),
    #[error("group {group}: chains deeper than {max} groups")]
    TooDeep { group: u32, max: usize },
}

/// A saved group that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("group {index}")]
pub struct BadGroup {
    /// Which group (from 1).
    pub index: usize,
    #[source]
    pub source: ferrovs_flow::ParseError,
}

/// The groups a rule's actions (and action set) send to.
pub fn rule_groups(spec: &FlowSpec) -> Vec<u32> {
    fn walk(a: &[ActionSpec], out: &mut Vec<u32>) {
        for x in a {
            match x {
                ActionSpec::Group(g) => out.push(*g),
                ActionSpec::WriteActions(v) | ActionSpec::Clone(v) => walk(v, out),
                _ => {}
            }
        }
    }
    let mut v = Vec::new();
    walk(&spec.actions, &mut v);
    v
}

/// One installed rule.
#[derive(Debug, Clone)]
pub struct StoredRule {
    pub spec: FlowSpec,
    pub stats: Arc<RuleStats>,
    /// When it was installed (duration, hard timeout).
    pub installed: Instant,
    /// The `max_len` of each OpenFlow OUTPUT action of the rule, in order, as the FLOW_MOD
    /// that installed it gave them (OVS keeps and reports them; the pipeline ignores them
    /// for ports other than the controller). Empty: all 0, as ovs-ofctl and the CLI send.
    /// Not part of the saved text form: a restart reports 0 again (a hot upgrade carries
    /// them, `upgrade::RuleCounters::output_max_len`).
    pub output_max_len: Vec<u16>,
}

/// Why a rule was removed by the daemon itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Idle,
    Hard,
}

/// What identifies a rule for OpenFlow's add (same table, priority and match: replace).
type RuleKey = (u8, u16, Option<String>, Match);

fn rule_key(s: &FlowSpec) -> RuleKey {
    (s.table, s.priority, s.in_port.clone(), s.m)
}

/// A change of the rules since the pipeline was last published, to apply to a copy of it
/// ([`ferrovs_flow::Pipeline::insert`], [`ferrovs_flow::Pipeline::remove`]).
#[derive(Debug, Clone)]
pub enum RuleChange {
    /// Added, or replaced one of the same table, match and priority.
    Upsert(FlowSpec, Arc<RuleStats>),
    Removed(FlowSpec),
}

/// The rules of one bridge.
#[derive(Debug, Clone)]
pub struct BridgeRules {
    rules: Vec<StoredRule>,
    /// Each rule's position by its key, kept across adds so that rules added one at a time
    /// (OpenFlow, one FLOW_MOD each) cost O(1) each; dropped by anything that removes or may
    /// reorder rules, and built again by the next add.
    index: Option<HashMap<RuleKey, usize>>,
    /// What changed since [`BridgeRules::take_changes`]; `None`: more than a log is worth
    /// (or a change made through [`BridgeRules::rules_mut`]): build the pipeline anew.
    changes: Option<Vec<RuleChange>>,
    /// OpenFlow table statistics (lookups, matches) per table, kept across rule changes
    /// (the pipeline is rebuilt on each; these counters are handed to every build).
    tables: Vec<TableCounters>,
    groups: BTreeMap<u32, StoredGroup>,
    /// Translations that failed on a limit (resubmits too deep or too many), kept across
    /// rebuilds like `tables`.
    xlate: Arc<ferrovs_flow::pipeline::XlateCounters>,
}

/// Tables that count lookups: all of OpenFlow's (0..=253).
const COUNTED_TABLES: usize = 254;

fn table_counters() -> Vec<TableCounters> {
    (0..COUNTED_TABLES)
        .map(|_| TableCounters::default())
        .collect()
}

impl Default for BridgeRules {
    fn default() -> Self {
        BridgeRules::new()
    }
}

/// The default rule of a new bridge.
pub fn default_rule() -> FlowSpec {
    FlowSpec {
        table: 0,
        priority: 0,
        cookie: 0,
        idle_timeout: 0,
        hard_timeout: 0,
        in_port: None,
        m: Match::catchall(),
        actions: vec![ActionSpec::Normal],
    }
}

/// A saved rule that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("flow {index}")]
pub struct BadRule {
    /// Which rule (from 1).
    pub index: usize,
    #[source]
    pub source: ferrovs_flow::ParseError,
}

impl BridgeRules {
    /// A bridge's rules when created: the default NORMAL rule.
    pub fn new() -> BridgeRules {
        let mut r = BridgeRules {
            rules: vec![],
            index: None,
            changes: None,
            tables: table_counters(),
            groups: BTreeMap::new(),
            xlate: Arc::default(),
        };
        r.add(vec![default_rule()]);
        r
    }

    /// Rules from their saved text form (one rule per string). Errors name the rule.
    pub fn from_texts(texts: &[String]) -> Result<BridgeRules, BadRule> {
        let mut specs = Vec::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            specs.push(ferrovs_flow::parse_flow(t).map_err(|source| BadRule {
                index: i + 1,
                source,
            })?);
        }
        let mut r = BridgeRules {
            rules: vec![],
            index: None,
            changes: None,
            tables: table_counters(),
            groups: BTreeMap::new(),
            xlate: Arc::default(),
        };
        r.add(specs);
        Ok(r)
    }

    /// The rules' text form, for saving (round-trips through [`BridgeRules::from_texts`]).
    pub fn texts(&self) -> Vec<String> {
        self.rules.iter().map(|r| r.spec.to_string()).collect()
    }

    pub fn rules(&self) -> &[StoredRule] {
        &self.rules
    }

    /// The rules to change in place (OpenFlow's modify and delete, `crate::openflow`).
    pub fn rules_mut(&mut self) -> &mut Vec<StoredRule> {
        self.index = None;
        self.changes = None;
        &mut self.rules
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Adds rules in order; a rule with the same table, priority and match as an installed
    /// one replaces it (its counters start again), as OpenFlow's add.
    pub fn add(&mut self, specs: Vec<FlowSpec>) {
        let rules = &self.rules;
        let index = self.index.get_or_insert_with(|| {
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| (rule_key(&r.spec), i))
                .collect()
        });
        let now = Instant::now();
        for spec in specs {
            let k = rule_key(&spec);
            let stats = Arc::new(RuleStats::default());
            if let Some(log) = &mut self.changes {
                log.push(RuleChange::Upsert(spec.clone(), stats.clone()));
            }
            let rule = StoredRule {
                spec,
                stats,
                installed: now,
                output_max_len: Vec::new(),
            };
            match index.get(&k) {
                Some(&i) => self.rules[i] = rule,
                None => {
                    index.insert(k, self.rules.len());
                    self.rules.push(rule);
                }
            }
        }
        self.bound_log();
    }

    /// Sets the OUTPUT `max_len`s a rule was given (OpenFlow; reported in flow stats, not
    /// part of the pipeline: nothing to rebuild), found through the key index.
    pub fn set_output_max_len(&mut self, spec: &FlowSpec, lens: Vec<u16>) {
        let rules = &self.rules;
        let index = self.index.get_or_insert_with(|| {
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| (rule_key(&r.spec), i))
                .collect()
        });
        if let Some(&i) = index.get(&rule_key(spec)) {
            self.rules[i].output_max_len = lens;
        }
    }

    /// Each rule's install time, to set (a hot upgrade keeps the old daemon's); the rules
    /// themselves do not change.
    pub fn rules_installed_mut(&mut self) -> impl Iterator<Item = &mut Instant> {
        self.rules.iter_mut().map(|r| &mut r.installed)
    }

    /// Group `id`'s install time, to set (a hot upgrade keeps the old daemon's).
    pub fn group_installed_mut(&mut self, id: u32) -> Option<&mut Instant> {
        self.groups.get_mut(&id).map(|g| &mut g.installed)
    }

    /// The changes since the last call (`None`: build the pipeline from all rules), and a
    /// fresh log from here on.
    pub fn take_changes(&mut self) -> Option<Vec<RuleChange>> {
        self.changes.replace(Vec::new())
    }

    /// A log longer than the rules is not worth applying one by one.
    fn bound_log(&mut self) {
        if self
            .changes
            .as_ref()
            .is_some_and(|l| l.len() > self.rules.len().max(64))
        {
            self.changes = None;
        }
    }

    /// Removes the rules `filter` selects (strict: same match and priority); how many.
    pub fn delete(&mut self, filter: &FlowFilter, strict: bool) -> usize {
        let before = self.rules.len();
        let log = &mut self.changes;
        self.rules.retain(|r| {
            let keep = !filter.selects(&r.spec, strict);
            if !keep {
                if let Some(log) = log {
                    log.push(RuleChange::Removed(r.spec.clone()));
                }
            }
            keep
        });
        if self.rules.len() != before {
            self.index = None;
        }
        self.bound_log();
        before - self.rules.len()
    }

    /// Removes the rules whose idle or hard timeout ran out at `now`; `idle_for` gives how
    /// long a rule has gone without a packet (from its counters' last-use clock).
    pub fn expire(
        &mut self,
        now: Instant,
        idle_for: impl Fn(&StoredRule) -> std::time::Duration,
    ) -> Vec<(StoredRule, Expiry)> {
        let mut gone = Vec::new();
        self.rules.retain(|r| {
            let s = &r.spec;
            if s.hard_timeout > 0
                && now.duration_since(r.installed).as_secs() >= u64::from(s.hard_timeout)
            {
                gone.push((r.clone(), Expiry::Hard));
                return false;
            }
            if s.idle_timeout > 0 && idle_for(r).as_secs() >= u64::from(s.idle_timeout) {
                gone.push((r.clone(), Expiry::Idle));
                return false;
            }
            true
        });
        if !gone.is_empty() {
            self.index = None;
            if let Some(log) = &mut self.changes {
                log.extend(
                    gone.iter()
                        .map(|(r, _)| RuleChange::Removed(r.spec.clone())),
                );
            }
            self.bound_log();
        }
        gone
    }

    /// Whether the datapath may skip the flow pipeline: the only rule is a catch-all
    /// `actions=NORMAL` in table 0 without timeouts.
    pub fn is_plain_normal(&self) -> bool {
        match &self.rules[..] {
            [r] => {
                let s = &r.spec;
                s.table == 0
                    && s.in_port.is_none()
                    && s.m == Match::catchall()
                    && s.idle_timeout == 0
                    && s.hard_timeout == 0
                    && s.actions == [ActionSpec::Normal]
            }
            _ => false,
        }
    }

    /// The datapath's pipeline; `resolve` maps a port name to its id in this bridge.
    pub fn build(&self, resolve: &dyn Fn(&str) -> Option<u32>) -> Pipeline {
        self.build_live(resolve, &|_| true)
    }

    /// [`BridgeRules::build`] with port liveness (by id) for fast_failover buckets.
    pub fn build_live(
        &self,
        resolve: &dyn Fn(&str) -> Option<u32>,
        live: &dyn Fn(u32) -> bool,
    ) -> Pipeline {
        Pipeline::build_with_groups(
            self.rules.iter().map(|r| (&r.spec, r.stats.clone())),
            self.groups.values().map(|g| (&g.spec, g.stats.clone())),
            resolve,
            live,
        )
        .with_table_stats(self.tables.clone())
        .with_xlate_counters(self.xlate.clone())
    }

    /// Translations that failed on a limit: (resubmits nested too deep, too many
    /// resubmits), each counted once per translation (upcall).
    pub fn xlate_failures(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.xlate.too_deep.load(Relaxed),
            self.xlate.too_many.load(Relaxed),
        )
    }

    /// Table `t`'s lookups and matches so far (as pushed from the datapath's caches).
    pub fn table_lookups(&self, t: u8) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.tables.get(usize::from(t)).map_or((0, 0), |c| {
            (
                c.lookup.packets.load(Relaxed),
                c.matched.packets.load(Relaxed),
            )
        })
    }

    /// The pipeline after the changes since the last call: `current` (the one published,
    /// built with the same `resolve`) with the logged changes applied — O(changes · log n) —
    /// or, without a usable log or `current` (a group changed, the ports did), built from
    /// every rule and group ([`BridgeRules::build_live`]).
    pub fn rebuild(
        &mut self,
        current: Option<&Pipeline>,
        resolve: &dyn Fn(&str) -> Option<u32>,
        live: &dyn Fn(u32) -> bool,
    ) -> Pipeline {
        match (self.take_changes(), current) {
            (Some(log), Some(cur)) => {
                let mut p = cur.clone();
                for c in log {
                    match c {
                        RuleChange::Upsert(spec, stats) => p.insert(&spec, stats, resolve),
                        RuleChange::Removed(spec) => p.remove(&spec, resolve),
                    }
                }
                p
            }
            _ => self.build_live(resolve, live),
        }
    }

    /// The groups, by id.
    pub fn groups(&self) -> &BTreeMap<u32, StoredGroup> {
        &self.groups
    }

    /// Whether a bucket watches a port (a link change must rebuild the pipeline).
    pub fn watches_ports(&self) -> bool {
        self.groups
            .values()
            .any(|g| g.spec.buckets.iter().any(|b| b.watch_port.is_some()))
    }

    /// The groups' text form, for saving (round-trips through
    /// [`BridgeRules::load_groups`]).
    pub fn group_texts(&self) -> Vec<String> {
        self.groups.values().map(|g| g.spec.to_string()).collect()
    }

    /// Loads saved groups (replacing none: the bridge has none yet). Not checked for
    /// chains: they were when added.
    pub fn load_groups(&mut self, texts: &[String]) -> Result<(), BadGroup> {
        // Groups are compiled with the pipeline: the next one is built from everything.
        self.changes = None;
        self.index = None;
        for (i, t) in texts.iter().enumerate() {
            let spec = ferrovs_flow::parse_group(t).map_err(|source| BadGroup {
                index: i + 1,
                source,
            })?;
            self.groups.insert(
                spec.id,
                StoredGroup {
                    stats: GroupStats::for_group(&spec),
                    spec,
                    installed: Instant::now(),
                },
            );
        }
        Ok(())
    }

    /// Checks that `spec`'s chained groups exist (`spec` itself as given) and form no loop
    /// nor a chain deeper than the pipeline follows.
    fn check_chains(&self, spec: &GroupSpec) -> Result<(), GroupError> {
        let get = |id: u32| {
            if id == spec.id {
                Some(spec)
            } else {
                self.groups.get(&id).map(|g| &g.spec)
            }
        };
        for c in spec.chained() {
            if get(c).is_none() {
                return Err(GroupError::UnknownChained {
                    group: spec.id,
                    chained: c,
                });
            }
        }
        // Depth-first from `spec`: a path back to it is a loop.
        let max = ferrovs_flow::pipeline::MAX_GROUP_DEPTH;
        let mut stack = vec![(spec.id, 0usize)];
        let mut steps = 0usize;
        while let Some((g, d)) = stack.pop() {
            steps += 1;
            if steps > 100_000 {
                return Err(GroupError::TooDeep {
                    group: spec.id,
                    max,
                });
            }
            let Some(gs) = get(g) else { continue };
            for c in gs.chained() {
                if c == spec.id {
                    return Err(GroupError::Loop(spec.id));
                }
                if d + 1 >= max {
                    return Err(GroupError::TooDeep {
                        group: spec.id,
                        max,
                    });
                }
                stack.push((c, d + 1));
            }
        }
        Ok(())
    }

    /// Adds a group (OpenFlow `OFPGC_ADD`).
    pub fn add_group(&mut self, spec: GroupSpec) -> Result<(), GroupError> {
        // Groups are compiled with the pipeline: the next one is built from everything.
        self.changes = None;
        self.index = None;
        if self.groups.contains_key(&spec.id) {
            return Err(GroupError::Exists(spec.id));
        }
        self.check_chains(&spec)?;
        self.groups.insert(
            spec.id,
            StoredGroup {
                stats: GroupStats::for_group(&spec),
                spec,
                installed: Instant::now(),
            },
        );
        Ok(())
    }

    /// Replaces a group's type and buckets (OpenFlow `OFPGC_MODIFY`); its counters go on,
    /// its buckets' start again.
    pub fn mod_group(&mut self, spec: GroupSpec) -> Result<(), GroupError> {
        // Groups are compiled with the pipeline: the next one is built from everything.
        self.changes = None;
        self.index = None;
        let Some(old) = self.groups.get(&spec.id) else {
            return Err(GroupError::Unknown(spec.id));
        };
        let group = old.stats.group.clone();
        let installed = old.installed;
        self.check_chains(&spec)?;
        let mut stats = GroupStats::for_group(&spec);
        stats.group = group;
        self.groups.insert(
            spec.id,
            StoredGroup {
                spec,
                stats,
                installed,
            },
        );
        Ok(())
    }

    /// Deletes group `id` (`None`: every group) and, as OVS, the rules that send to a
    /// deleted group; (groups, rules) deleted. Groups that chained to a deleted group
    /// keep their bucket (it drops).
    pub fn del_groups(&mut self, id: Option<u32>) -> (usize, usize) {
        // Groups are compiled with the pipeline: the next one is built from everything.
        self.changes = None;
        self.index = None;
        let gone: Vec<u32> = match id {
            Some(g) => self.groups.remove(&g).map(|_| g).into_iter().collect(),
            None => {
                let v = self.groups.keys().copied().collect();
                self.groups.clear();
                v
            }
        };
        if gone.is_empty() {
            return (0, 0);
        }
        let before = self.rules.len();
        self.rules
            .retain(|r| !rule_groups(&r.spec).iter().any(|g| gone.contains(g)));
        (gone.len(), before - self.rules.len())
    }

    /// The first group `spec` sends to that does not exist.
    pub fn missing_group(&self, spec: &FlowSpec) -> Option<u32> {
        rule_groups(spec)
            .into_iter()
            .find(|g| !self.groups.contains_key(g))
    }

    /// Whether the type of group `id` is `ty`.
    pub fn group_type(&self, id: u32) -> Option<GroupType> {
        self.groups.get(&id).map(|g| g.spec.ty)
    }
}

/// Field names and printing styles for megaflow dumps.
const DUMP_FIELDS: &[(Field, &str, Style)] = &[
    (Field::InPort, "in_port", Style::Port),
    (Field::EthSrc, "eth_src", Style::Mac),
    (Field::EthDst, "eth_dst", Style::Mac),
    (Field::EthType, "eth_type", Style::Hex),
    (Field::VlanTci, "vlan_tci", Style::Hex),
    (Field::Ipv4Src, "nw_src", Style::Ipv4),
    (Field::Ipv4Dst, "nw_dst", Style::Ipv4),
    (Field::Ipv6Src, "ipv6_src", Style::Ipv6),
    (Field::Ipv6Dst, "ipv6_dst", Style::Ipv6),
    (Field::IpProto, "nw_proto", Style::Dec),
    (Field::IpTos, "nw_tos", Style::Dec),
    (Field::IpTtl, "nw_ttl", Style::Dec),
    (Field::IpFrag, "ip_frag", Style::Hex),
    (Field::TpSrc, "tp_src", Style::Dec),
    (Field::TpDst, "tp_dst", Style::Dec),
    (Field::ArpOp, "arp_op", Style::Dec),
    (Field::TunId, "tun_id", Style::Hex),
    (Field::TunSrc, "tun_src", Style::Ipv4),
    (Field::TunDst, "tun_dst", Style::Ipv4),
    (Field::TunMetadata0, "tun_metadata0", Style::Hex),
    (Field::TunMetadata1, "tun_metadata1", Style::Hex),
    (Field::TunMetadata2, "tun_metadata2", Style::Hex),
    (Field::TunMetadata3, "tun_metadata3", Style::Hex),
    (Field::MplsLabel, "mpls_label", Style::Dec),
    (Field::MplsTc, "mpls_tc", Style::Dec),
    (Field::MplsTtl, "mpls_ttl", Style::Dec),
    (Field::MplsBos, "mpls_bos", Style::Dec),
    (Field::MplsPayload, "mpls_payload", Style::Dec),
    // A resumed pass (after ct(table=T)) matches the registers it was frozen with; a first
    // pass's megaflow never has them.
    (Field::Reg0, "reg0", Style::Hex),
    (Field::Reg1, "reg1", Style::Hex),
    (Field::Reg2, "reg2", Style::Hex),
    (Field::Reg3, "reg3", Style::Hex),
    (Field::Reg4, "reg4", Style::Hex),
    (Field::Reg5, "reg5", Style::Hex),
    (Field::Reg6, "reg6", Style::Hex),
    (Field::Reg7, "reg7", Style::Hex),
    (Field::Reg8, "reg8", Style::Hex),
    (Field::Reg9, "reg9", Style::Hex),
    (Field::Reg10, "reg10", Style::Hex),
    (Field::Reg11, "reg11", Style::Hex),
    (Field::Reg12, "reg12", Style::Hex),
    (Field::Reg13, "reg13", Style::Hex),
    (Field::Reg14, "reg14", Style::Hex),
    (Field::Reg15, "reg15", Style::Hex),
];

#[derive(Debug, Clone, Copy)]
enum Style {
    Port,
    Mac,
    Hex,
    Dec,
    Ipv4,
    Ipv6,
}

fn style(v: u128, st: Style, names: &HashMap<u32, &str>) -> String {
    match st {
        Style::Port => names
            .get(&(v as u32))
            .map_or_else(|| v.to_string(), |n| n.to_string()),
        Style::Mac => ferrovs_packet::mac_to_string(v as u64),
        Style::Hex => format!("{v:#x}"),
        Style::Dec => v.to_string(),
        Style::Ipv4 => std::net::Ipv4Addr::from(v as u32).to_string(),
        Style::Ipv6 => std::net::Ipv6Addr::from(v).to_string(),
    }
}

/// Every bit of field `f`.
fn full_mask(f: Field) -> u128 {
    let mut k = FlowKey::default();
    k.set(f, u128::MAX);
    k.get(f)
}

/// A megaflow's match as text: every field it depends on, `=value` or `=value/mask` when
/// only some of the field's bits count.
pub fn format_megaflow(key: &FlowKey, mask: &FlowKey, names: &HashMap<u32, &str>) -> String {
    let mut out = Vec::new();
    for &(f, name, st) in DUMP_FIELDS {
        let m = mask.get(f);
        if m == 0 {
            continue;
        }
        let full = full_mask(f);
        let v = style(key.get(f), st, names);
        if m == full {
            out.push(format!("{name}={v}"));
        } else {
            let ms = match st {
                Style::Port | Style::Dec => format!("{m:#x}"),
                _ => style(m, st, names),
            };
            out.push(format!("{name}={v}/{ms}"));
        }
    }
    if out.is_empty() {
        return "(any)".into();
    }
    out.join(",")
}

/// A packet's key as text: its non-zero fields (`ferrovs trace`'s input).
pub fn format_key(key: &FlowKey, names: &HashMap<u32, &str>) -> String {
    let mut mask = FlowKey::default();
    for &(f, _, _) in DUMP_FIELDS {
        if key.get(f) != 0 || f == Field::InPort {
            mask.set(f, full_mask(f));
        }
    }
    format_megaflow(key, &mask, names)
}

/// Datapath actions as text.
pub fn format_dp_actions(actions: &[DpAction], names: &HashMap<u32, &str>) -> String {
    if actions.is_empty() {
        return "drop".into();
    }
    let port = |p: u32| {
        names
            .get(&p)
            .map_or_else(|| p.to_string(), |n| n.to_string())
    };
    actions
        .iter()
        .map(|a| match a {
            DpAction::Output(p) => format!("output:{}", port(*p)),
            DpAction::InPort => "in_port".into(),
            DpAction::Normal => "normal".into(),
            DpAction::Flood => "flood".into(),
            DpAction::PushVlan { tci, tpid: 0x8100 } => format!("push_vlan(tci={tci:#x})"),
            DpAction::PushVlan { tci, tpid } => {
                format!("push_vlan(tpid={tpid:#06x},tci={tci:#x})")
            }
            DpAction::SetVlanTci { tci } => format!("set_vlan(tci={tci:#x})"),
            DpAction::PopVlan => "pop_vlan".into(),
            DpAction::SetField(f, v) => {
                let (name, st) = DUMP_FIELDS
                    .iter()
                    .find(|x| x.0 == *f)
                    .map_or(("?", Style::Hex), |x| (x.1, x.2));
                format!("set({name}={})", style(*v, st, names))
            }
            DpAction::SetTunnel { id } => format!("set(tun_id={id:#x})"),
            DpAction::SetTunnelDst(ip) => format!("set(tun_dst={ip})"),
            DpAction::SetTunnelMetadata { index, value } => {
                format!("set(tun_metadata{index}={value:#x})")
            }
            DpAction::Meter(m) => format!("meter({m})"),
            DpAction::Controller(c) => format!("userspace(controller,max_len={})", c.max_len),
            DpAction::PushMpls { ethertype, lse } => format!(
                "push_mpls(label={},tc={},ttl={},bos={},eth_type={ethertype:#x})",
                lse >> 12,
                (lse >> 9) & 7,
                lse & 0xff,
                (lse >> 8) & 1
            ),
            DpAction::PopMpls { ethertype } => format!("pop_mpls(eth_type={ethertype:#x})"),
            DpAction::Ct(c) => {
                let mut s = format!("ct(zone={}", c.zone);
                if c.commit {
                    s.push_str(",commit");
                }
                s.push(')');
                if let Some(t) = c.recirc {
                    s.push_str(&format!(",recirc({:#x})", ferrovs_flow::ct::recirc_id(t)));
                }
                s
            }
            DpAction::CtClear => "ct_clear".into(),
            DpAction::CheckPktLen(c) => format!(
                "check_pkt_len(size={},gt({}),le({}))",
                c.len,
                format_dp_actions(&c.larger, names),
                format_dp_actions(&c.smaller, names)
            ),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(v: &[&str]) -> Vec<FlowSpec> {
        v.iter()
            .map(|s| ferrovs_flow::parse_flow(s).unwrap())
            .collect()
    }

    #[test]
    fn a_new_bridge_has_the_normal_rule_and_stays_plain_until_a_rule_is_added() {
        let mut r = BridgeRules::new();
        assert!(r.is_plain_normal());
        assert_eq!(r.texts().len(), 1);
        r.add(specs(&["priority=100,in_port=vm1 actions=drop"]));
        assert!(!r.is_plain_normal());
        let f = ferrovs_flow::parse_filter("in_port=vm1").unwrap();
        assert_eq!(r.delete(&f, false), 1);
        assert!(r.is_plain_normal());
    }

    /// The rules of `r` as (table, priority, text) in a canonical order, from a pipeline.
    fn pipeline_rules(p: &Pipeline) -> Vec<(usize, u16, String)> {
        let mut v: Vec<(usize, u16, String)> = (0..p.tables())
            .flat_map(|t| {
                p.table_rules(t)
                    .into_iter()
                    .map(move |(m, prio, rule)| (t, prio, format!("{m:?} {:?}", rule.actions)))
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_change_log_rebuilds_the_pipeline_a_full_build_would() {
        let resolve = |n: &str| n.strip_prefix("vm").and_then(|x| x.parse().ok());
        let mut r = BridgeRules::new();
        r.add(specs(&[
            "priority=10,in_port=vm1 actions=output:vm2",
            "priority=20,ip,nw_dst=10.0.0.1 actions=drop",
        ]));
        // No log yet: built from every rule.
        let mut p = r.rebuild(None, &resolve, &|_| true);
        assert_eq!(pipeline_rules(&p), pipeline_rules(&r.build(&resolve)));
        let steps: [&dyn Fn(&mut BridgeRules); 4] = [
            &|r| {
                r.add(specs(&[
                    "priority=20,ip,nw_dst=10.0.0.1 actions=output:vm1",
                ]))
            },
            &|r| {
                r.add(specs(&[
                    "table=1,priority=5,ip actions=normal",
                    "priority=1 actions=drop",
                ]))
            },
            &|r| {
                let f = ferrovs_flow::parse_filter("in_port=vm1").unwrap();
                assert_eq!(r.delete(&f, false), 1);
            },
            &|r| {
                let far = Instant::now() + std::time::Duration::from_secs(3600);
                r.add(specs(&["priority=7,hard_timeout=1,arp actions=flood"]));
                assert_eq!(r.expire(far, |_| std::time::Duration::ZERO).len(), 1);
            },
        ];
        for (i, step) in steps.iter().enumerate() {
            step(&mut r);
            assert!(
                r.changes.as_ref().is_some_and(|l| !l.is_empty()),
                "step {i} logged nothing"
            );
            p = r.rebuild(Some(&p), &resolve, &|_| true);
            assert_eq!(
                pipeline_rules(&p),
                pipeline_rules(&r.build(&resolve)),
                "step {i}"
            );
        }
        // A change through rules_mut has no log: the next rebuild is a full one.
        r.rules_mut()[0].spec.actions = vec![ActionSpec::Drop];
        assert!(r.take_changes().is_none());
    }

    #[test]
    fn adding_the_same_match_and_priority_replaces_and_resets_counters() {
        let mut r = BridgeRules::new();
        r.add(specs(&["priority=5,ip,nw_dst=10.0.0.1 actions=normal"]));
        r.rules[1]
            .stats
            .packets
            .store(7, std::sync::atomic::Ordering::Relaxed);
        r.add(specs(&["priority=5,ip,nw_dst=10.0.0.1 actions=drop"]));
        assert_eq!(r.len(), 2);
        assert_eq!(r.rules[1].spec.actions, vec![ActionSpec::Drop]);
        assert_eq!(
            r.rules[1]
                .stats
                .packets
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        // Another priority is another rule.
        r.add(specs(&["priority=6,ip,nw_dst=10.0.0.1 actions=drop"]));
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn saved_texts_come_back_as_the_same_rules() {
        let mut r = BridgeRules::new();
        r.add(specs(&[
            "table=0,priority=10,in_port=vm1,tcp,tp_dst=80 actions=mod_nw_tos:8,goto_table:1",
            "table=1,priority=1,cookie=0x2a,idle_timeout=30 actions=output:vm2",
        ]));
        let back = BridgeRules::from_texts(&r.texts()).unwrap();
        let a: Vec<_> = r.rules.iter().map(|x| &x.spec).collect();
        let b: Vec<_> = back.rules.iter().map(|x| &x.spec).collect();
        assert_eq!(a, b);
        let e = BridgeRules::from_texts(&[
            "priority=1 actions=output:vm2".into(),
            "bogus=1 actions=drop".into(),
        ])
        .unwrap_err();
        assert_eq!(e.index, 2, "{e}");
    }

    #[test]
    fn hard_and_idle_timeouts_expire_rules() {
        let mut r = BridgeRules::new();
        r.add(specs(&[
            "priority=1,hard_timeout=5,tcp actions=drop",
            "priority=2,idle_timeout=3,udp actions=drop",
        ]));
        let t0 = r.rules[1].installed;
        let never_idle = |_: &StoredRule| std::time::Duration::ZERO;
        assert!(r
            .expire(t0 + std::time::Duration::from_secs(4), never_idle)
            .is_empty());
        let gone = r.expire(t0 + std::time::Duration::from_secs(5), never_idle);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].1, Expiry::Hard);
        let gone = r.expire(t0, |_| std::time::Duration::from_secs(3));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].1, Expiry::Idle);
        assert!(r.is_plain_normal());
    }
}
