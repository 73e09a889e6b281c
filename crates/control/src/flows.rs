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
                ActionSpec::WriteActions(v) => walk(v, out),
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
}

/// Why a rule was removed by the daemon itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Idle,
    Hard,
}

/// The rules of one bridge.
#[derive(Debug, Clone)]
pub struct BridgeRules {
    rules: Vec<StoredRule>,
    groups: BTreeMap<u32, StoredGroup>,
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
            groups: BTreeMap::new(),
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
            groups: BTreeMap::new(),
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
        // Bulk loads replace by index: hash the (table, priority, match) of what is there.
        let mut index: std::collections::HashMap<(u8, u16, Option<String>, Match), usize> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    (
                        r.spec.table,
                        r.spec.priority,
                        r.spec.in_port.clone(),
                        r.spec.m,
                    ),
                    i,
                )
            })
            .collect();
        let now = Instant::now();
        for spec in specs {
            let k = (spec.table, spec.priority, spec.in_port.clone(), spec.m);
            let rule = StoredRule {
                spec,
                stats: Arc::new(RuleStats::default()),
                installed: now,
            };
            match index.get(&k) {
                Some(&i) => self.rules[i] = rule,
                None => {
                    index.insert(k, self.rules.len());
                    self.rules.push(rule);
                }
            }
        }
    }

    /// Removes the rules `filter` selects (strict: same match and priority); how many.
    pub fn delete(&mut self, filter: &FlowFilter, strict: bool) -> usize {
        let before = self.rules.len();
        self.rules.retain(|r| !filter.selects(&r.spec, strict));
        before - self.rules.len()
    }

    /// Removes the rules whose idle or hard timeout ran out at `now`; `idle_for` gives how
    /// long a rule has gone without a packet (from its counters' last-use clock).
    pub fn expire(
        &mut self,
        now: Instant,
        idle_for: impl Fn(&StoredRule) -> std::time::Duration,
    ) -> Vec<(FlowSpec, Expiry)> {
        let mut gone = Vec::new();
        self.rules.retain(|r| {
            let s = &r.spec;
            if s.hard_timeout > 0
                && now.duration_since(r.installed).as_secs() >= u64::from(s.hard_timeout)
            {
                gone.push((s.clone(), Expiry::Hard));
                return false;
            }
            if s.idle_timeout > 0 && idle_for(r).as_secs() >= u64::from(s.idle_timeout) {
                gone.push((s.clone(), Expiry::Idle));
                return false;
            }
            true
        });
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
            DpAction::PushVlan { tci } => format!("push_vlan(tci={tci:#x})"),
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
