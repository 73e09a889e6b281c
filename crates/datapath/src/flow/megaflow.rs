//! The megaflow cache of one bridge: wildcarded entries, each the translation of one packet
//! through the rule tables together with every key bit that translation consulted, grouped
//! into subtables by mask (tuple-space search, as OVS's dpcls).
//!
//! # Invariants
//! * Every live entry is the result the bridge's current [`Pipeline`] gives for *every* key
//!   that matches it: entries are inserted only with the generation of the pipeline they
//!   were translated with, and an insert whose generation is no longer the cache's is
//!   refused ([`MegaflowCache::insert`]); a rule change bumps the generation first and then
//!   revalidates what is cached ([`MegaflowCache::revalidate`]).
//! * An entry taken out of the cache is marked dead before the control plane acknowledges
//!   the change, so an exact-match-cache entry that still points to it misses.
//! * The number of entries never exceeds the limit: an upcall over the limit executes its
//!   translation for that packet without caching it (counted in `limit_refused`).
//!
//! # Thread-safety
//! PMDs look up under a read lock taken once per burst ([`MegaflowCache::read`]) and insert
//! after their burst's lookups, under the write lock, their upcalls' results; the control
//! plane revalidates and evicts with the write lock held only to apply what it computed
//! outside it. Entry counters are relaxed atomics (several PMDs may hit one entry); the
//! control plane reads them to push statistics to the rules.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use ferrovs_flow::{DpAction, FlowKey, Pipeline, RuleStats, Translation};

/// Default most entries per bridge (OVS's default `flow-limit` is 200 000).
pub const DEFAULT_LIMIT: usize = 200_000;
/// An entry unused this long (seconds) is evicted (OVS `max-idle`: 10 s).
pub const DEFAULT_MAX_IDLE_S: u32 = 10;

/// One cached, wildcarded flow.
#[derive(Debug)]
pub struct Megaflow {
    /// The masked key: a packet matches when `key & mask == self.key`.
    pub key: FlowKey,
    pub mask: FlowKey,
    pub actions: Box<[DpAction]>,
    /// Every rule the translation went through (their counters get this entry's).
    pub rules: Box<[Arc<RuleStats>]>,
    /// The bridge (datapath id) this entry belongs to.
    pub bridge: u32,
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Datapath clock (seconds) of the last hit; the insertion time until then.
    pub used: AtomicU32,
    dead: AtomicBool,
    /// What the control plane already pushed to the rules.
    pushed_packets: AtomicU64,
    pushed_bytes: AtomicU64,
}

impl Megaflow {
    /// False once evicted or invalidated: callers holding it (the EMC) must look up again.
    #[inline]
    pub fn alive(&self) -> bool {
        !self.dead.load(Relaxed)
    }

    /// Accounts `packets` packets of `bytes` bytes at clock `now`.
    #[inline]
    pub fn hit(&self, packets: u64, bytes: u64, now: u32) {
        self.packets.fetch_add(packets, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        // A store only when the second changed: no cache-line ping-pong per packet.
        if self.used.load(Relaxed) != now {
            self.used.store(now, Relaxed);
        }
    }

    /// Adds what this entry counted since the last push to its rules' counters.
    fn push_stats(&self) {
        let p = self.packets.load(Relaxed);
        let b = self.bytes.load(Relaxed);
        let dp = p - self.pushed_packets.swap(p, Relaxed);
        let db = b - self.pushed_bytes.swap(b, Relaxed);
        if dp == 0 {
            return;
        }
        let used = u64::from(self.used.load(Relaxed));
        for r in self.rules.iter() {
            r.packets.fetch_add(dp, Relaxed);
            r.bytes.fetch_add(db, Relaxed);
            r.used.fetch_max(used, Relaxed);
        }
    }
}

/// A fast hasher for flow keys (already well-mixed words): multiply-xorshift per word.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0 ^ w)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(31);
    }

    #[inline]
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }
}

type KeyMap = HashMap<FlowKey, Arc<Megaflow>, BuildHasherDefault<KeyHasher>>;

/// Entries sharing one mask.
#[derive(Debug)]
pub struct Subtable {
    pub mask: FlowKey,
    map: KeyMap,
    /// Hits since the last ranking.
    hits: AtomicU64,
}

/// The subtables, most hit first.
#[derive(Debug, Default)]
pub struct Subtables {
    list: Vec<Subtable>,
    count: usize,
    /// Generation of the pipeline whose translations may be inserted.
    gen: u64,
}

impl Subtables {
    /// The entry matching `key`, searching subtables in rank order (the hit is counted).
    #[inline]
    pub fn lookup(&self, key: &FlowKey) -> Option<&Arc<Megaflow>> {
        let (st, f) = self.lookup_uncounted(key)?;
        self.count_hits(st, 1);
        Some(f)
    }

    /// The entry matching `key` and the index of its subtable, whose hit the caller counts
    /// with [`Subtables::count_hits`] (a burst adds its hits once per subtable, not with an
    /// atomic addition per packet on a line every PMD shares).
    #[inline]
    pub fn lookup_uncounted(&self, key: &FlowKey) -> Option<(usize, &Arc<Megaflow>)> {
        for (i, st) in self.list.iter().enumerate() {
            if let Some(f) = st.map.get(&key.masked(&st.mask)) {
                return Some((i, f));
            }
        }
        None
    }

    /// Adds `n` hits to subtable `st` (for the ranking).
    #[inline]
    pub fn count_hits(&self, st: usize, n: u64) {
        if let Some(s) = self.list.get(st) {
            s.hits.fetch_add(n, Relaxed);
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes `f` out (and marks it dead); false if it was not there.
    fn remove(&mut self, f: &Megaflow) -> bool {
        let Some(i) = self.list.iter().position(|s| s.mask == f.mask) else {
            return false;
        };
        let st = &mut self.list[i];
        match st.map.get(&f.key) {
            Some(x) if std::ptr::eq(Arc::as_ptr(x), f) => {}
            _ => return false,
        }
        st.map.remove(&f.key);
        f.dead.store(true, Relaxed);
        self.count -= 1;
        if st.map.is_empty() {
            self.list.remove(i);
        }
        true
    }
}

/// Counters of a bridge's megaflow cache (the control plane's side: what PMDs count is in
/// their own statistics).
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Entries inserted by upcalls.
    pub inserted: AtomicU64,
    /// Upcall results not cached: the cache was full.
    pub limit_refused: AtomicU64,
    /// Upcall results not cached: translated with a pipeline replaced meanwhile.
    pub stale_refused: AtomicU64,
    /// Entries removed for idleness or to get back under the limit.
    pub evicted: AtomicU64,
    /// Entries removed because a rule change changed their translation.
    pub invalidated: AtomicU64,
    /// Revalidation passes after rule changes.
    pub revalidations: AtomicU64,
}

/// What one revalidation did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Revalidation {
    pub checked: usize,
    pub kept: usize,
    pub invalidated: usize,
}

/// The megaflow cache of one bridge.
#[derive(Debug)]
pub struct MegaflowCache {
    bridge: u32,
    inner: RwLock<Subtables>,
    limit: AtomicUsize,
    pub counters: CacheCounters,
}

impl MegaflowCache {
    pub fn new(bridge: u32) -> MegaflowCache {
        MegaflowCache {
            bridge,
            inner: RwLock::new(Subtables::default()),
            limit: AtomicUsize::new(DEFAULT_LIMIT),
            counters: CacheCounters::default(),
        }
    }

    pub fn bridge(&self) -> u32 {
        self.bridge
    }

    pub fn set_limit(&self, n: usize) {
        self.limit.store(n.max(1), Relaxed);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Relaxed)
    }

    /// The read side, for a burst's lookups. A poisoned lock (a panic while inserting) is
    /// still consistent: every update is a single map operation.
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, Subtables> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Subtables> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// (entries, subtables).
    pub fn size(&self) -> (usize, usize) {
        let g = self.read();
        (g.count, g.list.len())
    }

    /// Caches the translation of `key` made with the pipeline of generation `gen`. Returns
    /// the entry to use for this packet: the new one, one another PMD inserted for the same
    /// key meanwhile, or a private (never cached, already dead) one when the cache is full or
    /// the pipeline changed since (the packet still gets the decision it was translated for:
    /// it arrived before the change was acknowledged).
    pub fn insert(&self, gen: u64, key: &FlowKey, t: Translation, now: u32) -> Arc<Megaflow> {
        let mut mask = t.mask;
        // Entries are always per input port (the EMC and port removal rely on it).
        mask.set(ferrovs_flow::Field::InPort, u128::from(u32::MAX));
        let f = Arc::new(Megaflow {
            key: key.masked(&mask),
            mask,
            actions: t.actions.into_boxed_slice(),
            rules: t.rules.into_boxed_slice(),
            bridge: self.bridge,
            packets: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            used: AtomicU32::new(now),
            dead: AtomicBool::new(false),
            pushed_packets: AtomicU64::new(0),
            pushed_bytes: AtomicU64::new(0),
        });
        let mut g = self.write();
        if g.gen != gen {
            drop(g);
            self.counters.stale_refused.fetch_add(1, Relaxed);
            f.dead.store(true, Relaxed);
            return f;
        }
        if g.count >= self.limit.load(Relaxed) {
            drop(g);
            self.counters.limit_refused.fetch_add(1, Relaxed);
            f.dead.store(true, Relaxed);
            return f;
        }
        let i = match g.list.iter().position(|s| s.mask == f.mask) {
            Some(i) => i,
            None => {
                g.list.push(Subtable {
                    mask: f.mask,
                    map: KeyMap::default(),
                    hits: AtomicU64::new(0),
                });
                g.list.len() - 1
            }
        };
        if let Some(x) = g.list[i].map.get(&f.key) {
            return x.clone();
        }
        g.list[i].map.insert(f.key, f.clone());
        g.count += 1;
        drop(g);
        self.counters.inserted.fetch_add(1, Relaxed);
        f
    }

    /// Every entry (a snapshot: for revalidation, statistics and dumps).
    pub fn entries(&self) -> Vec<Arc<Megaflow>> {
        let g = self.read();
        let mut v = Vec::with_capacity(g.count);
        for st in &g.list {
            v.extend(st.map.values().cloned());
        }
        v
    }

    /// Pushes every entry's new packets and bytes to its rules.
    pub fn push_stats(&self) {
        for f in self.entries() {
            f.push_stats();
        }
    }

    /// Removes `dead` entries (pushing their last statistics first).
    fn remove_all(&self, dead: &[Arc<Megaflow>]) -> usize {
        if dead.is_empty() {
            return 0;
        }
        let mut n = 0;
        let mut g = self.write();
        for f in dead {
            n += g.remove(f) as usize;
        }
        drop(g);
        for f in dead {
            f.push_stats();
        }
        n
    }

    /// After the bridge's rules changed: from now on only translations by the pipeline of
    /// generation `gen` are cached, and every entry the new `pipeline` would translate
    /// differently (other actions or rules, or a mask that needs bits the entry ignores) is removed
    /// and marked dead. `None`: the bridge went back to plain L2 switching; every entry
    /// goes. The caller then waits for every PMD to finish its current iteration before it
    /// acknowledges the change.
    pub fn revalidate(&self, pipeline: Option<&Pipeline>, gen: u64) -> Revalidation {
        self.write().gen = gen;
        let all = self.entries();
        let mut dead = Vec::new();
        for f in &all {
            let keep = pipeline.is_some_and(|p| {
                let t = p.translate(&f.key);
                let mut m = t.mask;
                m.set(ferrovs_flow::Field::InPort, u128::from(u32::MAX));
                // Same actions, no bit beyond the entry's mask, and the same rules (a
                // replaced rule has new counters the entry must feed).
                m.masked(&f.mask) == m
                    && t.actions[..] == f.actions[..]
                    && t.rules.len() == f.rules.len()
                    && t.rules
                        .iter()
                        .zip(f.rules.iter())
                        .all(|(a, b)| Arc::ptr_eq(a, b))
            });
            if !keep {
                dead.push(f.clone());
            }
        }
        let n = self.remove_all(&dead);
        self.counters.invalidated.fetch_add(n as u64, Relaxed);
        self.counters.revalidations.fetch_add(1, Relaxed);
        Revalidation {
            checked: all.len(),
            kept: all.len() - dead.len(),
            invalidated: n,
        }
    }

    /// Removes every entry (a port of the bridge went away or the bridge is deleted).
    pub fn flush(&self) -> usize {
        let all = self.entries();
        let n = self.remove_all(&all);
        self.counters.invalidated.fetch_add(n as u64, Relaxed);
        n
    }

    /// The revalidator's periodic pass at clock `now`: pushes statistics, evicts entries
    /// idle for `max_idle` seconds and, over the limit, the least recently used, and ranks
    /// subtables by their hits since the last pass.
    pub fn maintain(&self, now: u32, max_idle: u32) -> usize {
        let all = self.entries();
        for f in &all {
            f.push_stats();
        }
        let mut dead: Vec<Arc<Megaflow>> = all
            .iter()
            .filter(|f| now.saturating_sub(f.used.load(Relaxed)) >= max_idle)
            .cloned()
            .collect();
        let limit = self.limit.load(Relaxed);
        let left = all.len() - dead.len();
        if left > limit {
            let mut live: Vec<&Arc<Megaflow>> = all
                .iter()
                .filter(|f| now.saturating_sub(f.used.load(Relaxed)) < max_idle)
                .collect();
            live.sort_by_key(|f| f.used.load(Relaxed));
            dead.extend(live[..left - limit].iter().map(|f| (*f).clone()));
        }
        let n = self.remove_all(&dead);
        self.counters.evicted.fetch_add(n as u64, Relaxed);
        let mut g = self.write();
        let mut ranked: Vec<(u64, Subtable)> = g
            .list
            .drain(..)
            .map(|s| (s.hits.swap(0, Relaxed), s))
            .collect();
        // Stable: ties keep their order.
        ranked.sort_by_key(|(h, _)| std::cmp::Reverse(*h));
        g.list = ranked.into_iter().map(|(_, s)| s).collect();
        n
    }
}
