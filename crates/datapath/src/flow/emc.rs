//! The exact-match cache (EMC) of one PMD: full flow keys mapped to the megaflow that decided
//! them, looked up before the megaflow cache (one hash probe and one key compare instead of a
//! probe per subtable).
//!
//! Each key has two candidate slots (from two parts of its hash). An entry is used only if its
//! megaflow is still alive and belongs to the bridge the packet entered: an entry whose
//! megaflow was evicted or invalidated by a rule change simply misses, so the EMC needs no
//! invalidation of its own. Insertion happens on a megaflow hit or an upcall, with a
//! probability of 1 in `insert_inv_prob` (OVS's `emc-insert-inv-prob`, default 100): with
//! many short flows the EMC would otherwise thrash, every insertion costing more than it
//! saves.
//!
//! **Bypass.** With many more flows than entries (100 000 flows against 8192 entries) nearly
//! every lookup misses, and a miss costs two probes of a 1 MiB table (cache lines the packets
//! need) before the megaflow cache is asked anyway. So the EMC measures its hit rate over
//! windows of [`PROBE_LOOKUPS`] lookups; below one hit in [`BYPASS_BELOW`] it is bypassed (no
//! lookup, no insertion, no hash) for [`BYPASS_BURSTS`] bursts, then probed again for a
//! window. Packets that skipped it are counted (`emc_skipped`). Bypassing changes only which
//! level decides a packet, never the decision.
//!
//! # Thread-safety
//! Owned by one PMD thread; nothing is shared but the megaflows it points to.

use std::sync::Arc;

use ferrovs_flow::FlowKey;

use super::megaflow::Megaflow;

/// Entries per PMD (as OVS's EMC).
pub const EMC_ENTRIES: usize = 8192;
const EMC_MASK: u64 = EMC_ENTRIES as u64 - 1;
/// Default insertion probability is 1 in this.
pub const DEFAULT_INSERT_INV_PROB: u32 = 100;
/// Lookups per window over which the hit rate is measured.
pub const PROBE_LOOKUPS: u64 = 1024;
/// A window with fewer hits than one in this many lookups starts a bypass.
pub const BYPASS_BELOW: u64 = 8;
/// Bursts a bypass lasts before the next probing window.
pub const BYPASS_BURSTS: u32 = 512;

/// Two cache lines: the hash, the megaflow and the first six key words in the first (all a
/// miss reads), the other five in the second.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Entry {
    hash: u64,
    flow: Option<Arc<Megaflow>>,
    key: FlowKey,
}

impl Entry {
    #[inline]
    fn usable(&self) -> bool {
        self.flow.as_ref().is_some_and(|f| f.alive())
    }
}

/// The exact-match cache of one PMD.
#[derive(Debug)]
pub struct Emc {
    entries: Box<[Entry]>,
    insert_inv_prob: u32,
    /// xorshift state for the insertion draw.
    rng: u32,
    /// The current window's lookups and hits.
    window_lookups: u64,
    window_hits: u64,
    /// Bursts left in the current bypass (0: not bypassing).
    bypass_left: u32,
}

impl Default for Emc {
    fn default() -> Self {
        Emc::new(DEFAULT_INSERT_INV_PROB)
    }
}

impl Emc {
    /// `insert_inv_prob`: insert with a probability of 1 in this (0: never, 1: always).
    pub fn new(insert_inv_prob: u32) -> Emc {
        Emc {
            entries: (0..EMC_ENTRIES).map(|_| Entry::default()).collect(),
            insert_inv_prob,
            rng: 0x9e37_79b9,
            window_lookups: 0,
            window_hits: 0,
            bypass_left: 0,
        }
    }

    /// Called once per burst: whether this burst skips the EMC (see the module doc).
    #[inline]
    pub fn bypass_burst(&mut self) -> bool {
        if self.bypass_left > 0 {
            self.bypass_left -= 1;
            true
        } else {
            false
        }
    }

    /// Accounts a burst's `lookups` and `hits` (bursts that did look up); ends a window and
    /// maybe starts a bypass.
    #[inline]
    pub fn account(&mut self, lookups: u64, hits: u64) {
        self.window_lookups += lookups;
        self.window_hits += hits;
        if self.window_lookups >= PROBE_LOOKUPS {
            if self.window_hits * BYPASS_BELOW < self.window_lookups {
                self.bypass_left = BYPASS_BURSTS;
            }
            self.window_lookups = 0;
            self.window_hits = 0;
        }
    }

    pub fn set_insert_inv_prob(&mut self, p: u32) {
        self.insert_inv_prob = p;
    }

    #[inline]
    fn slots(hash: u64) -> [usize; 2] {
        [
            (hash & EMC_MASK) as usize,
            ((hash >> 32) & EMC_MASK) as usize,
        ]
    }

    /// Starts loading the first line of both candidate slots of a key hashing to `hash`
    /// (done for a whole burst before its lookups, so their cache misses overlap).
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        for s in Self::slots(hash) {
            ferrovs_sys::os::prefetch(std::ptr::from_ref(&self.entries[s]).cast());
        }
    }

    /// The live megaflow cached for `key` (whose [`FlowKey::hash`] is `hash`) on `bridge`.
    #[inline]
    pub fn lookup(&self, key: &FlowKey, hash: u64, bridge: u32) -> Option<&Arc<Megaflow>> {
        for s in Self::slots(hash) {
            let e = &self.entries[s];
            if e.hash == hash && e.key == *key {
                if let Some(f) = &e.flow {
                    if f.alive() && f.bridge == bridge {
                        return Some(f);
                    }
                }
            }
        }
        None
    }

    /// Maybe caches `flow` for `key` (see the module doc for the probability). Returns
    /// whether it did.
    #[inline]
    pub fn maybe_insert(&mut self, key: &FlowKey, hash: u64, flow: &Arc<Megaflow>) -> bool {
        match self.insert_inv_prob {
            0 => return false,
            1 => {}
            p => {
                let mut x = self.rng;
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                self.rng = x;
                if !x.is_multiple_of(p) {
                    return false;
                }
            }
        }
        if !flow.alive() {
            return false;
        }
        let [a, b] = Self::slots(hash);
        // The key's own slot, a free or stale one, else the second candidate (the first
        // keeps the older, likelier still-hot entry half the time: alternate by hash).
        let s = if self.entries[a].hash == hash && self.entries[a].key == *key {
            a
        } else if self.entries[b].hash == hash && self.entries[b].key == *key {
            b
        } else if !self.entries[a].usable() {
            a
        } else if !self.entries[b].usable() {
            b
        } else if hash & (1 << 20) == 0 {
            a
        } else {
            b
        };
        let e = &mut self.entries[s];
        e.hash = hash;
        e.key = *key;
        e.flow = Some(flow.clone());
        true
    }

    /// Live entries (for statistics; walks the whole cache).
    pub fn occupancy(&self) -> usize {
        self.entries.iter().filter(|e| e.usable()).count()
    }

    /// Drops every entry (their megaflows may then be freed).
    pub fn clear(&mut self) {
        for e in self.entries.iter_mut() {
            e.flow = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bypass_starts_on_a_low_hit_rate_and_ends_with_a_probe() {
        let mut e = Emc::default();
        // A window at the threshold: no bypass.
        assert!(!e.bypass_burst());
        e.account(PROBE_LOOKUPS, PROBE_LOOKUPS / BYPASS_BELOW);
        assert!(!e.bypass_burst());
        // A window just under it, in bursts of 32: bypass from the next burst on.
        for _ in 0..PROBE_LOOKUPS / 32 - 1 {
            e.account(32, 3);
            assert!(!e.bypass_burst());
        }
        e.account(32, 0);
        for _ in 0..BYPASS_BURSTS {
            assert!(e.bypass_burst());
        }
        // Then a probing window: lookups again, and a good one keeps them.
        assert!(!e.bypass_burst());
        e.account(PROBE_LOOKUPS, PROBE_LOOKUPS / 2);
        assert!(!e.bypass_burst());
    }
}
