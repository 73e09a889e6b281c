//! OpenFlow-style rules: add, delete and dump them, the megaflow cache, and the
//! revalidator's periodic pass.

use ferrovs_proto::reply::{AddFlows, DelFlows, DelGroups, FlowEntry, GroupEntry, MegaflowEntry};

use super::*;

/// A rule's OpenFlow identity (`packet_io::RuleId`): table, priority, input port, match.
fn flow_id(s: &ferrovs_flow::FlowSpec) -> super::packet_io::RuleId {
    (s.table, s.priority, s.in_port.clone(), s.m)
}

impl Daemon {
    /// The revalidator's periodic pass (see [`REVALIDATE_EVERY`]).
    pub(super) fn revalidator(&mut self) {
        let now_s = self.clock.load(Ordering::Relaxed);
        let max_idle = self
            .config
            .setting_u32("flow-max-idle", dp::flow::megaflow::DEFAULT_MAX_IDLE_S);
        let mut expired = Vec::new();
        for (name, b) in self.bridges.iter_mut() {
            if b.pipeline.is_none() && b.cache.size().0 == 0 {
                continue;
            }
            b.cache.maintain(now_s, max_idle);
            let now = Instant::now();
            let gone = b.rules.expire(now, |r| {
                match r.stats.used.load(Ordering::Relaxed) {
                    // Never hit: idle since installed.
                    0 => now.duration_since(r.installed),
                    u => Duration::from_secs(u64::from(now_s).saturating_sub(u)),
                }
            });
            if !gone.is_empty() {
                b.dirty = true;
                expired.push((name.clone(), gone));
            }
        }
        if expired.is_empty() {
            return;
        }
        for (name, _) in &expired {
            self.sync_flows_config(name);
        }
        self.publish();
        self.save();
        for (name, gone) in &expired {
            self.of_rules_expired(name, gone);
        }
    }

    /// Copies a bridge's rules into the configuration (to be saved).
    pub(super) fn sync_flows_config(&mut self, bridge: &str) {
        let Some(b) = self.bridges.get(bridge) else {
            return;
        };
        let flows = (!b.rules.is_plain_normal()).then(|| b.rules.texts());
        let groups = b.rules.group_texts();
        let flow_rem: Vec<u32> = match self.openflow.send_flow_rem.get(bridge) {
            Some(set) if !set.is_empty() && flows.is_some() => (b.rules.rules().iter())
                .enumerate()
                .filter(|(_, r)| set.contains(&flow_id(&r.spec)))
                .map(|(i, _)| i as u32)
                .collect(),
            _ => Vec::new(),
        };
        if let Some(c) = self.cfg_bridge(bridge) {
            c.flows = flows;
            c.groups = groups;
            c.send_flow_rem = flow_rem;
        }
    }

    /// Marks the saved rules at `positions` (`BridgeConfig::send_flow_rem`) as added with
    /// `OFPFF_SEND_FLOW_REM` (start-up, takeover: the bridge's rules are the saved ones, in
    /// order). A position past the rules is ignored.
    pub(super) fn restore_flow_rem(&mut self, bridge: &str, positions: &[u32]) {
        let Some(b) = self.bridges.get(bridge) else {
            return;
        };
        let rules = b.rules.rules();
        let ids: Vec<_> = positions
            .iter()
            .filter_map(|&i| rules.get(i as usize))
            .map(|r| flow_id(&r.spec))
            .collect();
        if ids.is_empty() {
            return;
        }
        let set = self
            .openflow
            .send_flow_rem
            .entry(bridge.to_string())
            .or_default();
        set.extend(ids);
        self.sync_flows_config(bridge);
    }

    /// Applies `flow-limit` to every megaflow cache.
    pub(super) fn apply_flow_limit(&self) {
        let limit = self
            .config
            .setting_u32("flow-limit", dp::flow::megaflow::DEFAULT_LIMIT as u32);
        for b in self.bridges.values() {
            b.cache.set_limit(limit as usize);
        }
    }

    pub(super) fn bridge_mut(&mut self, bridge: &str) -> Result<&mut BridgeState, ConfigError> {
        self.bridges
            .get_mut(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))
    }

    /// `ferrovs add-flow(s)`: all the rules or none (the first bad one is named).
    pub(super) fn add_flows(
        &mut self,
        bridge: &str,
        flows: &[String],
    ) -> Result<AddFlows, ConfigError> {
        let mut specs = Vec::with_capacity(flows.len());
        for (i, f) in flows.iter().enumerate() {
            let spec = ferrovs_flow::parse_flow(f).map_err(|e| {
                ConfigError::Invalid(if flows.len() == 1 {
                    format!("bad flow: {e}")
                } else {
                    format!("flow {}: {e}", i + 1)
                })
            })?;
            specs.push(spec);
        }
        let n = specs.len();
        self.bridge_mut(bridge)?;
        // A rule's meter must exist (as OVS refuses such a flow-mod).
        for s in &specs {
            for a in &s.actions {
                if let ferrovs_flow::ActionSpec::Meter(m) = a {
                    if !self.has_meter(bridge, *m) {
                        return Err(ConfigError::Invalid(format!(
                            "bridge {bridge} has no meter {m} (add it with add-meter first)"
                        )));
                    }
                }
            }
        }
        let b = self.bridge_mut(bridge)?;
        for (i, s) in specs.iter().enumerate() {
            if let Some(g) = b.rules.missing_group(s) {
                return Err(ConfigError::Invalid(if n == 1 {
                    format!("bad flow: group {g} does not exist")
                } else {
                    format!("flow {}: group {g} does not exist", i + 1)
                }));
            }
        }
        b.rules.add(specs);
        b.dirty = true;
        self.sync_flows_config(bridge);
        self.publish();
        Ok(AddFlows {
            added: n,
            rules: self.bridges[bridge].rules.len(),
        })
    }

    /// `ferrovs add-group` (`modify`: `mod-group`).
    pub(super) fn add_group(
        &mut self,
        bridge: &str,
        group: &str,
        modify: bool,
    ) -> Result<(), ConfigError> {
        let spec = ferrovs_flow::parse_group(group)
            .map_err(|e| ConfigError::Invalid(format!("bad group: {e}")))?;
        let b = self.bridge_mut(bridge)?;
        let r = if modify {
            b.rules.mod_group(spec)
        } else {
            b.rules.add_group(spec)
        };
        r.map_err(|e| ConfigError::Invalid(e.to_string()))?;
        b.dirty = true;
        self.sync_flows_config(bridge);
        self.publish();
        Ok(())
    }

    /// Installs saved groups on a bridge that has none yet (a takeover: the old daemon's
    /// configuration is not yet this one's when the bridge is added).
    pub(super) fn restore_groups(
        &mut self,
        bridge: &str,
        groups: &[String],
    ) -> Result<(), ConfigError> {
        if groups.is_empty() {
            return Ok(());
        }
        let b = self.bridge_mut(bridge)?;
        if !b.rules.groups().is_empty() {
            return Ok(());
        }
        b.rules
            .load_groups(groups)
            .map_err(|e| ConfigError::Invalid(format!("bridge {bridge}: {}", with_sources(&e))))?;
        b.dirty = true;
        self.sync_flows_config(bridge);
        self.publish();
        Ok(())
    }

    /// `ferrovs del-groups`: (groups, rules) deleted.
    pub(super) fn del_groups(
        &mut self,
        bridge: &str,
        group: Option<u32>,
    ) -> Result<DelGroups, ConfigError> {
        let b = self.bridge_mut(bridge)?;
        let (groups, rules) = b.rules.del_groups(group);
        if groups > 0 {
            b.dirty = true;
            self.sync_flows_config(bridge);
            self.publish();
        }
        Ok(DelGroups { groups, rules })
    }

    /// `ferrovs dump-groups`: every group with its counters.
    pub(super) fn dump_groups(&self, bridge: &str) -> Result<Vec<GroupEntry>, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        b.cache.push_stats();
        Ok(b.rules
            .groups()
            .values()
            .map(|g| GroupEntry {
                group: g.spec.to_string(),
                duration_s: g.installed.elapsed().as_secs_f64(),
                n_packets: g.stats.group.packets.load(Ordering::Relaxed),
                n_bytes: g.stats.group.bytes.load(Ordering::Relaxed),
                buckets: g
                    .stats
                    .buckets
                    .iter()
                    .map(|s| {
                        (
                            s.packets.load(Ordering::Relaxed),
                            s.bytes.load(Ordering::Relaxed),
                        )
                    })
                    .collect(),
            })
            .collect())
    }

    /// `ferrovs del-flows`.
    pub(super) fn del_flows(
        &mut self,
        bridge: &str,
        filter: &str,
        strict: bool,
    ) -> Result<DelFlows, ConfigError> {
        let f = ferrovs_flow::parse_filter(filter)
            .map_err(|e| ConfigError::Invalid(format!("bad flow filter: {e}")))?;
        let b = self.bridge_mut(bridge)?;
        // Statistics of the rules going away are final: push them first (for nobody, but
        // the megaflows pointing to them are about to be revalidated anyway).
        let n = b.rules.delete(&f, strict);
        if n > 0 {
            b.dirty = true;
            self.sync_flows_config(bridge);
            self.publish();
        }
        Ok(DelFlows {
            deleted: n,
            rules: self.bridges[bridge].rules.len(),
        })
    }

    /// `ferrovs dump-flows`: the rules `filter` selects, with their counters.
    pub(super) fn dump_flows(
        &self,
        bridge: &str,
        filter: Option<&str>,
    ) -> Result<Vec<FlowEntry>, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        let f = ferrovs_flow::parse_filter(filter.unwrap_or(""))
            .map_err(|e| ConfigError::Invalid(format!("bad flow filter: {e}")))?;
        b.cache.push_stats();
        let v: Vec<_> = b
            .rules
            .rules()
            .iter()
            .filter(|r| f.selects(&r.spec, false))
            .map(|r| {
                let s = &r.spec;
                FlowEntry {
                    cookie: format!("{:#x}", s.cookie),
                    duration_s: r.installed.elapsed().as_millis() as f64 / 1000.0,
                    flow: s.to_string(),
                    hard_timeout: s.hard_timeout.into(),
                    idle_timeout: s.idle_timeout.into(),
                    n_bytes: r.stats.bytes.load(Ordering::Relaxed),
                    n_packets: r.stats.packets.load(Ordering::Relaxed),
                    priority: s.priority.into(),
                    table: s.table.into(),
                }
            })
            .collect();
        Ok(v)
    }

    /// `ferrovs dump-megaflows`: the bridge's cached megaflows.
    pub(super) fn dump_megaflows(&self, bridge: &str) -> Result<Vec<MegaflowEntry>, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        let names: HashMap<u32, &str> = self
            .ports
            .values()
            .map(|p| (p.id, p.cfg.name.as_str()))
            .collect();
        let now = self.clock.load(Ordering::Relaxed);
        let v: Vec<_> = b
            .cache
            .entries()
            .iter()
            .map(|f| MegaflowEntry {
                actions: crate::flows::format_dp_actions(&f.actions, &names),
                bytes: f.bytes.load(Ordering::Relaxed),
                matches: crate::flows::format_megaflow(&f.key, &f.mask, &names),
                packets: f.packets.load(Ordering::Relaxed),
                used_s_ago: now.saturating_sub(f.used.load(Ordering::Relaxed)).into(),
            })
            .collect();
        Ok(v)
    }
}
