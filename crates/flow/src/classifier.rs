//! Tuple-space search: rules grouped into subtables by mask, one hash probe per subtable.
//!
//! Each subtable maps a masked key to the rules with exactly that match, best first
//! (priority, then insertion order). Subtables are kept sorted by the highest priority they
//! hold, so a lookup stops as soon as the next subtable cannot beat the best rule found
//! (priority pruning).
//!
//! The wildcard mask a lookup reports (`wc`) is the union of the masks of the subtables it
//! probed: any key equal to the looked-up one on those bits probes the same subtables, finds
//! the same entries and stops at the same point, so it gets the same rule — the property
//! megaflows rely on. OVS narrows `wc` further (staged lookup by field groups, prefix tries
//! for IP addresses, so a /8 rule does not make every megaflow match all 32 bits); we do not
//! yet, so megaflows here can be more specific than OVS's for the same rules.
//!
//! Each subtable's map is a persistent hash map (`imbl`): cloning a classifier costs one
//! pointer per subtable, and the clone shares every entry with the original until one of them
//! changes it. The control plane changes a copy of the published pipeline by a rule or a few
//! (an OpenFlow FLOW_MOD) in O(log n), instead of building all n rules again.
//!
//! Conjunctive matches (OVS's `conjunction(id, k/n)` and `conj_id`, ovs-fields(7)
//! "Conjunctive Match Fields"): a rule inserted with conjunctions ([`Conjunction`]; its
//! actions are only `conjunction(...)`) is *soft*: it never is a lookup's answer itself.
//! A lookup first finds the best *hard* rule H (as without conjunctions; soft rules do not
//! prune) and every soft rule that matches with a priority above H's. Then, priority by
//! priority from the highest: conjunction `id` of `n` clauses *completes* at priority P when
//! for each clause `k` of `n` some matching soft rule of priority P has `conjunction(id,
//! k/n)`; for each completed id (ascending), the lookup is done again as if the packet's
//! `conj_id` were `id`: rules matching `conj_id=id` join the hard rules, and if that finds
//! a rule (H itself, when no `conj_id=id` rule beats it), it is the answer. Otherwise the
//! soft rules of the next lower priority are tried; when none completes, the answer is H.
//! So a higher-priority ordinary rule wins, and soft rules of a priority that completes
//! nothing are ignored, as in OVS (`classifier_lookup__`). `conj_id` rules live in their
//! own tuple spaces (one per id): they take no key bits (`conj_id` is not a packet field),
//! and a lookup that completes nothing never probes them. The megaflow mask is still every
//! probed subtable's: the soft rules consulted decide which ids complete, and their
//! subtables were probed; the second lookup adds the subtables of `conj_id=id`. A soft rule
//! that also matches `conj_id` never counts (OVS would count one matching `conj_id=0`).
//!
//! Thread-safety: none inside; a classifier is built by the control plane and then shared
//! read-only (inside an immutable [`crate::Pipeline`]).

use std::sync::Arc;

use imbl::HashMap;

use crate::key::FlowKey;
use crate::matching::Match;

/// One `conjunction(id, k/n)` of a soft rule: `clause` is `k - 1` (0-based, as on the wire),
/// `n_clauses` is `n` (2..=64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conjunction {
    pub id: u32,
    pub clause: u8,
    pub n_clauses: u8,
}

#[derive(Debug, Clone)]
struct Entry<T> {
    priority: u16,
    seq: u64,
    value: T,
    /// `Some`: a soft rule, with its conjunctions (never empty).
    conj: Option<Arc<[Conjunction]>>,
}

impl<T> Entry<T> {
    /// Whether `self` wins over `other`: a higher priority, or the same and inserted earlier.
    fn beats(&self, other: &Entry<T>) -> bool {
        self.priority > other.priority || (self.priority == other.priority && self.seq < other.seq)
    }
}

#[derive(Debug, Clone)]
struct Subtable<T> {
    mask: FlowKey,
    /// Masked key → its rules, best first.
    rules: HashMap<FlowKey, Vec<Entry<T>>>,
    max_priority: u16,
    count: usize,
}

impl<T: Clone> Subtable<T> {
    fn recompute_max(&mut self) {
        self.max_priority = self
            .rules
            .values()
            .map(|v| v[0].priority)
            .max()
            .unwrap_or(0);
    }
}

/// A tuple space: subtables sorted by `max_priority`, highest first.
#[derive(Debug, Clone)]
struct Tuples<T> {
    subtables: Vec<Subtable<T>>,
}

impl<T> Default for Tuples<T> {
    fn default() -> Self {
        Tuples {
            subtables: Vec::new(),
        }
    }
}

/// The answer of a probe: a hard rule found so far.
type Best<'a, T> = Option<&'a Entry<T>>;

impl<T: Clone> Tuples<T> {
    fn resort(&mut self) {
        // Stable: equal maxima keep their order.
        self.subtables
            .sort_by_key(|s| std::cmp::Reverse(s.max_priority));
    }

    /// Adds `e` under `m`; returns the value of the entry of the same match and priority it
    /// replaced (which keeps its `seq`, so its place among equal priorities).
    fn insert(&mut self, m: &Match, mut e: Entry<T>) -> Option<T> {
        let i = match self.subtables.iter().position(|s| s.mask == m.mask) {
            Some(i) => i,
            None => {
                self.subtables.push(Subtable {
                    mask: m.mask,
                    rules: HashMap::new(),
                    max_priority: 0,
                    count: 0,
                });
                self.subtables.len() - 1
            }
        };
        let st = &mut self.subtables[i];
        let list = st.rules.entry(m.key).or_default();
        let priority = e.priority;
        if let Some(old) = list.iter_mut().find(|x| x.priority == priority) {
            e.seq = old.seq;
            return Some(std::mem::replace(old, e).value);
        }
        let at = list
            .iter()
            .position(|x| x.priority < priority)
            .unwrap_or(list.len());
        list.insert(at, e);
        st.count += 1;
        let grew = priority > st.max_priority || st.count == 1;
        if grew {
            st.max_priority = st.max_priority.max(priority);
            self.resort();
        }
        None
    }

    fn remove(&mut self, m: &Match, priority: u16) -> Option<T> {
        let i = self.subtables.iter().position(|s| s.mask == m.mask)?;
        let st = &mut self.subtables[i];
        let list = st.rules.get_mut(&m.key)?;
        let at = list.iter().position(|e| e.priority == priority)?;
        let e = list.remove(at);
        if list.is_empty() {
            st.rules.remove(&m.key);
        }
        st.count -= 1;
        if st.count == 0 {
            self.subtables.remove(i);
        } else if priority == st.max_priority {
            st.recompute_max();
            self.resort();
        }
        Some(e.value)
    }

    /// The best hard rule matching `key`, starting from `best` (what must be beaten);
    /// collects into `soft` (when given) the soft rules met on the way that could beat it.
    /// ORs every probed subtable's mask into `wc`.
    fn probe<'a>(
        &'a self,
        key: &FlowKey,
        wc: &mut FlowKey,
        mut best: Best<'a, T>,
        mut soft: Option<&mut Vec<&'a Entry<T>>>,
    ) -> Best<'a, T> {
        for st in &self.subtables {
            if let Some(b) = best {
                // Sorted by max priority: nothing further can win (equal priorities lose to
                // the earlier-inserted rule only if they were inserted earlier, so keep
                // looking at equal maxima).
                if st.max_priority < b.priority {
                    break;
                }
            }
            wc.union(&st.mask);
            let Some(list) = st.rules.get(&key.masked(&st.mask)) else {
                continue;
            };
            for e in list {
                if best.is_some_and(|b| !e.beats(b)) {
                    break;
                }
                if e.conj.is_some() {
                    // Soft: not an answer; a rule of the same match and a lower priority
                    // may still be.
                    if let Some(s) = soft.as_deref_mut() {
                        s.push(e);
                    }
                    continue;
                }
                best = Some(e);
                break;
            }
        }
        best
    }

    fn iter(&self, conj_id: Option<u32>) -> impl Iterator<Item = (Match, u16, &T)> {
        self.subtables.iter().flat_map(move |st| {
            st.rules.iter().flat_map(move |(k, list)| {
                list.iter().map(move |e| {
                    (
                        Match {
                            key: *k,
                            mask: st.mask,
                            conj_id,
                        },
                        e.priority,
                        &e.value,
                    )
                })
            })
        })
    }
}

/// Rules with priorities, looked up by flow key.
#[derive(Debug, Clone)]
pub struct Classifier<T> {
    /// Rules that do not match `conj_id`, hard and soft.
    main: Tuples<T>,
    /// Rules matching `conj_id=N`, by N.
    by_conj: HashMap<u32, Tuples<T>>,
    len: usize,
    /// The last insertion's number (shared by every tuple space: ties between a rule of
    /// `main` and one of `by_conj` go to the earlier inserted, as within one).
    seq: u64,
}

impl<T: Clone> Default for Classifier<T> {
    fn default() -> Self {
        Classifier::new()
    }
}

impl<T: Clone> Classifier<T> {
    pub fn new() -> Self {
        Classifier {
            main: Tuples::default(),
            by_conj: HashMap::new(),
            len: 0,
            seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of distinct masks (per tuple space: `conj_id=N` rules have their own).
    pub fn subtables(&self) -> usize {
        self.main.subtables.len()
            + self
                .by_conj
                .values()
                .map(|t| t.subtables.len())
                .sum::<usize>()
    }

    /// Adds a rule; one with the same match and priority is replaced (it keeps its place
    /// among equal priorities) and returned.
    pub fn insert(&mut self, m: Match, priority: u16, value: T) -> Option<T> {
        self.insert_conj(m, priority, value, &[])
    }

    /// [`Classifier::insert`] of a rule that is soft when `conj` is not empty: its actions
    /// are these conjunctions (see the module doc).
    pub fn insert_conj(
        &mut self,
        m: Match,
        priority: u16,
        value: T,
        conj: &[Conjunction],
    ) -> Option<T> {
        self.seq += 1;
        let e = Entry {
            priority,
            seq: self.seq,
            value,
            conj: (!conj.is_empty()).then(|| Arc::from(conj)),
        };
        let old = match m.conj_id {
            None => self.main.insert(&m, e),
            Some(id) => self.by_conj.entry(id).or_default().insert(&m, e),
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes the rule with this match and priority.
    pub fn remove(&mut self, m: &Match, priority: u16) -> Option<T> {
        let v = match m.conj_id {
            None => self.main.remove(m, priority),
            Some(id) => {
                let t = self.by_conj.get_mut(&id)?;
                let v = t.remove(m, priority);
                if t.subtables.is_empty() {
                    self.by_conj.remove(&id);
                }
                v
            }
        }?;
        self.len -= 1;
        Some(v)
    }

    /// The best rule matching `key` and its priority; ORs into `wc` every key bit the answer
    /// depended on (see the module doc). Allocates nothing unless soft rules match.
    pub fn lookup(&self, key: &FlowKey, wc: &mut FlowKey) -> Option<(&T, u16)> {
        self.lookup_entry(key, wc).map(|e| (&e.value, e.priority))
    }

    fn lookup_entry(&self, key: &FlowKey, wc: &mut FlowKey) -> Best<'_, T> {
        let mut soft: Vec<&Entry<T>> = Vec::new();
        let main_hard = self.main.probe(key, wc, None, Some(&mut soft));
        // OVS's conj_id is 0 in the ordinary lookup: `conj_id=0` rules take part.
        let hard = match self.by_conj.get(&0) {
            Some(t) => t.probe(key, wc, main_hard, None),
            None => main_hard,
        };
        if soft.is_empty() {
            return hard;
        }
        soft.retain(|e| hard.is_none_or(|h| e.priority > h.priority));
        soft.sort_by_key(|e| std::cmp::Reverse(e.priority));
        let mut ids: Vec<u32> = Vec::new();
        for group in soft.chunk_by(|a, b| a.priority == b.priority) {
            completed(
                group.iter().map(|e| e.conj.as_deref().unwrap_or(&[])),
                &mut ids,
            );
            for &id in &ids {
                let found = match self.by_conj.get(&id) {
                    _ if id == 0 => hard,
                    Some(t) => t.probe(key, wc, main_hard, None),
                    None => main_hard,
                };
                if found.is_some() {
                    return found;
                }
            }
        }
        hard
    }

    /// Every rule: (match, priority, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Match, u16, &T)> {
        self.main
            .iter(None)
            .chain(self.by_conj.iter().flat_map(|(id, t)| t.iter(Some(*id))))
    }
}

/// The conjunction ids the soft rules of one priority complete (each rule's conjunctions
/// one item), ascending, into `out`. An id completes when every clause `0..n` of one `n` is
/// present (rules that disagree on an id's `n` are counted per `n`).
pub(crate) fn completed<'a>(rules: impl Iterator<Item = &'a [Conjunction]>, out: &mut Vec<u32>) {
    out.clear();
    // (id, n) → clauses seen.
    let mut seen: std::collections::HashMap<(u32, u8), u64> = std::collections::HashMap::new();
    for conj in rules {
        for c in conj {
            *seen.entry((c.id, c.n_clauses)).or_default() |= 1u64 << (c.clause & 63);
        }
    }
    for ((id, n), bits) in seen {
        let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        if n >= 2 && bits & all == all {
            out.push(id);
        }
    }
    out.sort_unstable();
    out.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Field;
    use crate::reference::Linear;
    use crate::testrng::Rng;

    /// A random match from realistic field combinations or fully random masks.
    pub(crate) fn random_match(r: &mut Rng) -> Match {
        let mut m = Match::catchall();
        let shapes: &[&[Field]] = &[
            &[Field::InPort],
            &[Field::EthType, Field::Ipv4Dst],
            &[Field::EthType, Field::Ipv4Src, Field::IpProto, Field::TpDst],
            &[Field::EthDst],
            &[Field::InPort, Field::EthType, Field::IpProto, Field::TpSrc],
            &[Field::VlanTci, Field::EthSrc],
            &[],
        ];
        match r.below(4) {
            0..=2 => {
                for f in shapes[r.below(shapes.len() as u64) as usize] {
                    let mask = match f {
                        Field::Ipv4Dst | Field::Ipv4Src => {
                            let p = [8, 16, 24, 32][r.below(4) as usize];
                            (u128::from(u32::MAX) << (32 - p)) & f.full()
                        }
                        _ => f.full(),
                    };
                    m.set(*f, r.small_value(*f), mask);
                }
            }
            _ => {
                for _ in 0..1 + r.below(3) {
                    let f = Field::ALL[r.below(Field::ALL.len() as u64) as usize];
                    m.set(f, r.small_value(f), r.next128() & f.full() & 0xff);
                }
            }
        }
        m
    }

    /// A key near the rules: copies a random rule's matched bits over random small values.
    pub(crate) fn random_key(r: &mut Rng, rules: &[Match]) -> FlowKey {
        let mut k = FlowKey::default();
        for f in Field::ALL {
            k.set(f, r.small_value(f));
        }
        if !rules.is_empty() && r.below(4) != 0 {
            let m = rules[r.below(rules.len() as u64) as usize];
            for i in 0..k.0.len() {
                k.0[i] = (k.0[i] & !m.mask.0[i]) | m.key.0[i];
            }
        }
        k
    }

    #[test]
    fn differential_against_the_linear_reference_with_megaflow_property() {
        let mut r = Rng::new(0x5eed);
        let mut cases = 0;
        for round in 0..60 {
            let mut c: Classifier<u32> = Classifier::new();
            let mut lin: Linear<u32> = Linear::default();
            let mut installed: Vec<(Match, u16)> = Vec::new();
            let n = 1 + r.below(if round % 10 == 0 { 400 } else { 60 });
            for id in 0..n as u32 {
                // Many ties: priorities from a small set.
                let prio = [0, 1, 5, 10, 100, 1000, 65535][r.below(7) as usize];
                let m = random_match(&mut r);
                assert_eq!(
                    c.insert(m, prio, id).is_some(),
                    lin.insert(m, prio, id).is_some()
                );
                installed.push((m, prio));
                if r.below(5) == 0 && !installed.is_empty() {
                    let (m, p) = installed.swap_remove(r.below(installed.len() as u64) as usize);
                    assert_eq!(c.remove(&m, p), lin.remove(&m, p));
                }
            }
            assert_eq!(c.len(), lin.len());
            let ms: Vec<Match> = installed.iter().map(|x| x.0).collect();
            for _ in 0..300 {
                let k = random_key(&mut r, &ms);
                let mut wc = FlowKey::default();
                let got = c.lookup(&k, &mut wc).map(|(v, p)| (*v, p));
                let want = lin.lookup(&k).map(|(v, p)| (*v, p));
                assert_eq!(got, want, "round {round} key {k:?}");
                // Megaflow property: a key that agrees on wc gets the same answer.
                for _ in 0..3 {
                    let mut k2 = random_key(&mut r, &ms);
                    for i in 0..k2.0.len() {
                        k2.0[i] = (k2.0[i] & !wc.0[i]) | (k.0[i] & wc.0[i]);
                    }
                    let mut wc2 = FlowKey::default();
                    let got2 = c.lookup(&k2, &mut wc2).map(|(v, p)| (*v, p));
                    assert_eq!(got2, got, "megaflow property broken, round {round}");
                    assert_eq!(lin.lookup(&k2).map(|(v, p)| (*v, p)), got);
                }
                cases += 1;
            }
        }
        assert!(cases >= 18_000);
    }

    #[test]
    fn priority_pruning_narrows_the_mask() {
        let mut c: Classifier<&str> = Classifier::new();
        let mut hi = Match::catchall();
        hi.set(Field::InPort, 1, u128::from(u32::MAX));
        c.insert(hi, 100, "in_port");
        let mut lo = Match::catchall();
        lo.set(Field::TpDst, 80, 0xffff);
        c.insert(lo, 10, "tp_dst");
        let mut k = FlowKey::default();
        k.set(Field::InPort, 1);
        let mut wc = FlowKey::default();
        assert_eq!(c.lookup(&k, &mut wc), Some((&"in_port", 100)));
        assert_eq!(wc.get(Field::TpDst), 0, "the lower subtable was not probed");
        assert_eq!(c.subtables(), 2);
        assert_eq!(c.remove(&hi, 100), Some("in_port"));
        assert_eq!(c.subtables(), 1);
    }

    #[test]
    fn a_hundred_thousand_rules_insert_fast() {
        let mut c: Classifier<u32> = Classifier::new();
        let t = std::time::Instant::now();
        for i in 0..100_000u32 {
            let mut m = Match::catchall();
            m.set(Field::EthType, 0x0800, 0xffff);
            m.set(
                Field::Ipv4Dst,
                u128::from(0x0a00_0000 | i),
                u128::from(u32::MAX),
            );
            c.insert(m, 100, i);
        }
        assert_eq!(c.len(), 100_000);
        // Correctness, not speed, is asserted here (speed: bench/flows.sh); but a quadratic
        // insert would take minutes.
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
    }
}
