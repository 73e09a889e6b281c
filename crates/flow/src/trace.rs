//! Tracing a translation (`ferrovs trace`, as OVS's `ofproto/trace`): which tables a key
//! visits, at which resubmit nesting, the rule each lookup found (or the miss), where the
//! learning bridge (`NORMAL`) is asked to decide, and where a `ct(table=T)` recirculates.
//!
//! The trace runs the translation the datapath's upcall runs ([`Pipeline::translate`]):
//! [`Pipeline::translate_traced`] is the same walk with a [`TraceSink`] in its state, which
//! the walk calls at each table lookup, each `NORMAL` and each recirculating `ct`. An
//! upcall's state holds no sink (`None`): the cost there is one untaken branch per table
//! visit, `NORMAL` and recirculation, on the slow path only (the caches never translate).
//!
//! A trace changes nothing: no rule, table or failure counter is credited, what `learn`
//! actions learn is only reported, and the connection tracker is not run — a recirculated
//! pass's `ct_*` fields are what the caller assumes ([`trace`]'s `next` builds the key, as
//! OVS's `--ct-next`).
//!
//! Thread-safety: a trace borrows the (immutable) pipeline; it can run beside the PMDs.

use std::sync::Arc;

use crate::ct::CtAction;
use crate::key::FlowKey;
use crate::pipeline::{CompiledRule, DpAction, Pipeline, Translation};

/// What a traced translation reports as it goes.
pub trait TraceSink {
    /// Table `table` was looked up with `key` (the key as modified so far) at resubmit
    /// nesting `depth` (0: the pipeline's own walk, `goto_table` included); `rule` is the
    /// rule found, `None` a miss.
    fn lookup(&mut self, table: u8, depth: usize, key: &FlowKey, rule: Option<&Arc<CompiledRule>>);
    /// A `NORMAL` action was reached with `key` (the packet as the learning bridge will see
    /// it: its Ethernet addresses and VLAN).
    fn normal(&mut self, _key: &FlowKey) {}
    /// A `ct(table=T)` ended the pass with `key` (the packet as the tracker will see it).
    fn recirculate(&mut self, _key: &FlowKey) {}
}

/// One event of a pass.
#[derive(Debug, Clone)]
pub enum Step {
    Lookup {
        table: u8,
        depth: usize,
        key: FlowKey,
        rule: Option<Arc<CompiledRule>>,
    },
    Normal {
        key: FlowKey,
    },
}

/// One pass of a packet through the tables (the first, or one after a recirculation).
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// The key the pass started with.
    pub key: FlowKey,
    pub steps: Vec<Step>,
    /// The translation: the datapath actions of this pass and its megaflow mask.
    pub translation: Translation,
    /// The key at the recirculating `ct`, if the pass ended in one.
    pub recirc_key: Option<FlowKey>,
}

impl TraceSink for Pass {
    fn lookup(&mut self, table: u8, depth: usize, key: &FlowKey, rule: Option<&Arc<CompiledRule>>) {
        self.steps.push(Step::Lookup {
            table,
            depth,
            key: *key,
            rule: rule.cloned(),
        });
    }

    fn normal(&mut self, key: &FlowKey) {
        self.steps.push(Step::Normal { key: *key });
    }

    fn recirculate(&mut self, key: &FlowKey) {
        self.recirc_key = Some(*key);
    }
}

impl Pass {
    /// The recirculating `ct` action this pass ended with (the last datapath action).
    pub fn recirculation(&self) -> Option<&Arc<CtAction>> {
        match self.translation.actions.last() {
            Some(DpAction::Ct(c)) if c.recirc.is_some() => Some(c),
            _ => None,
        }
    }
}

/// Traces `key` through `p`, pass after pass: a pass that ends in `ct(table=T)` is followed
/// by one with the key `next(key at the ct, the action, index of the next pass)` builds
/// (the datapath's recirculated key with the `ct_*` fields the caller assumes), up to
/// `max_passes` passes (the datapath drops a packet beyond; the last pass then still
/// ends in its `ct`).
pub fn trace(
    p: &Pipeline,
    key: &FlowKey,
    max_passes: usize,
    next: &mut dyn FnMut(&FlowKey, &CtAction, usize) -> FlowKey,
) -> Vec<Pass> {
    let mut passes: Vec<Pass> = Vec::new();
    let mut k = *key;
    let max_passes = max_passes.max(1);
    while passes.len() < max_passes {
        let mut pass = Pass {
            key: k,
            ..Pass::default()
        };
        pass.translation = p.translate_traced(&k, &mut pass);
        let following = pass
            .recirculation()
            .filter(|_| passes.len() + 1 < max_passes)
            .map(|c| next(pass.recirc_key.as_ref().unwrap_or(&k), c, passes.len() + 1));
        passes.push(pass);
        match following {
            Some(n) => k = n,
            None => break,
        }
    }
    passes
}
