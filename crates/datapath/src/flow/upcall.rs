//! The slow path: a packet no cache knows goes through the bridge's rule tables, and the
//! translation (actions, plus the mask of every key bit it consulted) is cached as a
//! megaflow.
//!
//! Upcalls run inline in the PMD, after its burst's cache lookups (the read side of the
//! megaflow cache is released first). Unlike the cached levels they allocate (the
//! translation's action list and the entry): a miss costs microseconds, a hit tens of
//! nanoseconds; the megaflow cache is what keeps misses rare.

use std::sync::Arc;

use ferrovs_flow::FlowKey;

use super::megaflow::Megaflow;
use super::BridgeFlows;

/// The megaflow deciding `key`: one another burst (or PMD) cached since this burst's lookup,
/// else a fresh translation (cached when the cache has room and the pipeline is current).
/// The bool says whether a translation was needed (an upcall).
#[cold]
pub fn resolve(bf: &BridgeFlows, key: &FlowKey, now: u32) -> (Arc<Megaflow>, bool) {
    if let Some(f) = bf.cache.read().lookup(key) {
        return (f.clone(), false);
    }
    let mut t = bf.pipeline.translate(key);
    if !t.learned.is_empty() {
        // What `learn` actions learned goes to the control plane (see `learn`).
        let l = std::mem::take(&mut t.learned);
        if let Some(q) = &bf.learn {
            q.push(l);
        }
    }
    (bf.cache.insert(bf.gen, key, t, now), true)
}
