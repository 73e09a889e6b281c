//! Rules learned by `learn(...)` actions ([`ferrovs_flow::learn`]): each bridge with rules
//! has a [`LearnQueue`] the PMDs' upcalls fill; its eventfd wakes this thread, which adds
//! the rules as OVS's `learn_execute` does (a strict modify: one with the same table,
//! priority and match is replaced; an identical one is left alone, so a relearn costs no
//! publication) and publishes the pipeline.
//!
//! Bounds and bookkeeping: at most [`MAX_LEARNED`] learned rules per bridge (beyond,
//! a learned rule is dropped and counted); each learned rule remembers the rule that
//! taught it, so that deleting a rule whose `learn` has `delete_learned` deletes what it
//! learned (checked whenever a bridge's rules change, before they are published).
//! Learned rules are ordinary rules otherwise: `dump-flows` shows them, their timeouts
//! run, a FLOW_MOD may delete them.

use std::collections::HashMap;
use std::sync::Arc;

use ferrovs_datapath::flow::learn::LearnQueue;
use ferrovs_flow::learn::{Learned, F_DELETE_LEARNED};
use ferrovs_flow::{parse_flow, ActionSpec, Field, FlowSpec, Match};
use ferrovs_openflow::port::{OFPP_ALL, OFPP_FLOOD, OFPP_IN_PORT, OFPP_LOCAL};

use super::*;
use crate::openflow::PortMap;

/// Most learned rules a bridge keeps.
pub(super) const MAX_LEARNED: usize = 65_536;

type Key = (u8, u16, Option<String>, Match);
/// The rule that taught a learned rule (table, priority, match), and its learn's flags.
type Origin = (Option<(u8, u16, Match)>, u16);

/// Counters of learning, all bridges.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LearnStats {
    /// Learned rules added or replaced.
    pub added: u64,
    /// Learned again as they were (nothing to do).
    pub unchanged: u64,
    /// Dropped: the bridge had [`MAX_LEARNED`] already.
    pub full: u64,
    /// Dropped: not a rule (a port that does not exist, a match the rule syntax refuses).
    pub refused: u64,
    /// Deleted with the rule that taught them (`delete_learned`).
    pub deleted: u64,
}

/// Each bridge's queue and learned rules.
#[derive(Debug, Default)]
pub(super) struct LearnState {
    queues: HashMap<String, Arc<LearnQueue>>,
    /// Bridge → learned rule → (the teaching rule, its learn's flags).
    learned: HashMap<String, HashMap<Key, Origin>>,
    pub(super) stats: LearnStats,
}

fn key(s: &FlowSpec) -> Key {
    (s.table, s.priority, s.in_port.clone(), s.m)
}

/// The rule `l` describes, with ports by name (`None`: it cannot be one).
fn learned_spec(l: &Learned, ports: &PortMap, bridge: &str) -> Option<FlowSpec> {
    let mut m = l.m;
    let (inp, inm) = m.field(Field::InPort);
    let in_port = if inm == 0 {
        None
    } else {
        let name = ports.name(inp as u32)?.to_string();
        m.key.set(Field::InPort, 0);
        m.mask.set(Field::InPort, 0);
        Some(name)
    };
    let mut actions: Vec<ActionSpec> = l
        .loads
        .iter()
        .map(|&(field, value, mask)| ActionSpec::Load { field, value, mask })
        .collect();
    for &p in &l.outputs {
        actions.push(match p {
            OFPP_IN_PORT => ActionSpec::InPort,
            OFPP_FLOOD => ActionSpec::Flood,
            OFPP_ALL => ActionSpec::All,
            OFPP_LOCAL => ActionSpec::Output(bridge.to_string()),
            p => ActionSpec::Output(ports.name(p)?.to_string()),
        });
    }
    if actions.is_empty() {
        actions.push(ActionSpec::Drop);
    }
    let spec = FlowSpec {
        table: l.table,
        priority: l.priority,
        cookie: l.cookie,
        idle_timeout: l.idle_timeout,
        hard_timeout: l.hard_timeout,
        in_port,
        m,
        actions,
    };
    // What the rule syntax takes (prerequisites, widths), in its canonical form.
    parse_flow(&spec.to_string()).ok()
}

impl Daemon {
    /// The learn queue of `bridge`, made (and its eventfd added to the epoll set) on first
    /// use; `None` without an eventfd (learned rules are then dropped, counted).
    pub(super) fn learn_queue(&mut self, bridge: &str) -> Option<Arc<LearnQueue>> {
        if let Some(q) = self.openflow.learn.queues.get(bridge) {
            return Some(q.clone());
        }
        let q = Arc::new(LearnQueue::new().ok()?);
        let t = self.token(Source::Learn, bridge);
        if self.epoll.add(q.fd(), t, false).is_err() {
            self.tokens.remove(&t);
            return None;
        }
        self.openflow
            .learn
            .queues
            .insert(bridge.to_string(), q.clone());
        Some(q)
    }

    /// `bridge`'s learn queue's eventfd fired: its learned rules into its tables.
    pub(super) fn on_learn(&mut self, bridge: &str) {
        let Some(q) = self.openflow.learn.queues.get(bridge).cloned() else {
            return;
        };
        let batch = q.take();
        if batch.is_empty() {
            return;
        }
        let ports = self.of_ports(bridge);
        let Some(b) = self.bridges.get_mut(bridge) else {
            return;
        };
        let st = &mut self.openflow.learn;
        let set = st.learned.entry(bridge.to_string()).or_default();
        let mut changed = false;
        for l in batch {
            let Some(spec) = learned_spec(&l, &ports, bridge) else {
                st.stats.refused += 1;
                continue;
            };
            if b.rules.rules().iter().any(|r| r.spec == spec) {
                st.stats.unchanged += 1;
                continue;
            }
            let k = key(&spec);
            if !set.contains_key(&k) && set.len() >= MAX_LEARNED {
                st.stats.full += 1;
                continue;
            }
            set.insert(k, (l.origin, l.flags));
            b.rules.add(vec![spec]);
            st.stats.added += 1;
            changed = true;
        }
        if changed {
            self.openflow.unpublished.insert(bridge.to_string());
            self.of_publish();
        }
    }

    /// Forgets learned rules that are gone, and deletes those whose teaching rule (with
    /// `delete_learned`) is gone. Before a publication of `bridge`'s rules.
    pub(super) fn learn_gc(&mut self, bridge: &str) {
        let Some(set) = self.openflow.learn.learned.get_mut(bridge) else {
            return;
        };
        if set.is_empty() {
            return;
        }
        let Some(b) = self.bridges.get_mut(bridge) else {
            set.clear();
            return;
        };
        let present: std::collections::HashSet<Key> =
            b.rules.rules().iter().map(|r| key(&r.spec)).collect();
        set.retain(|k, _| present.contains(k));
        let teachers: std::collections::HashSet<(u8, u16, Match)> =
            b.rules
                .rules()
                .iter()
                .filter(|r| {
                    r.spec.actions.iter().any(
                        |a| matches!(a, ActionSpec::Learn(l) if l.flags & F_DELETE_LEARNED != 0),
                    )
                })
                .map(|r| (r.spec.table, r.spec.priority, r.spec.m))
                .collect();
        let orphans: std::collections::HashSet<Key> = set
            .iter()
            .filter(|(_, (origin, flags))| {
                flags & F_DELETE_LEARNED != 0 && origin.is_some_and(|o| !teachers.contains(&o))
            })
            .map(|(k, _)| k.clone())
            .collect();
        if orphans.is_empty() {
            return;
        }
        set.retain(|k, _| !orphans.contains(k));
        b.rules
            .rules_mut()
            .retain(|r| !orphans.contains(&key(&r.spec)));
        self.openflow.learn.stats.deleted += orphans.len() as u64;
    }
}
