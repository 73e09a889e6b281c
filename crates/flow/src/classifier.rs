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
//! Thread-safety: none inside; a classifier is built by the control plane and then shared
//! read-only (inside an immutable [`crate::Pipeline`]).

use imbl::HashMap;

use crate::key::FlowKey;
use crate::matching::Match;

#[derive(Debug, Clone)]
struct Entry<T> {
    priority: u16,
    seq: u64,
    value: T,
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

/// Rules with priorities, looked up by flow key.
#[derive(Debug, Clone)]
pub struct Classifier<T> {
    /// Sorted by `max_priority`, highest first.
    subtables: Vec<Subtable<T>>,
    len: usize,
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
            subtables: Vec::new(),
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

    /// Number of distinct masks.
    pub fn subtables(&self) -> usize {
        self.subtables.len()
    }

    fn resort(&mut self) {
        // Stable: equal maxima keep their order.
        self.subtables
            .sort_by_key(|s| std::cmp::Reverse(s.max_priority));
    }

    /// Adds a rule; one with the same match and priority is replaced (it keeps its place
    /// among equal priorities) and returned.
    pub fn insert(&mut self, m: Match, priority: u16, value: T) -> Option<T> {
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
        if let Some(e) = list.iter_mut().find(|e| e.priority == priority) {
            return Some(std::mem::replace(&mut e.value, value));
        }
        self.seq += 1;
        let at = list
            .iter()
            .position(|e| e.priority < priority)
            .unwrap_or(list.len());
        list.insert(
            at,
            Entry {
                priority,
                seq: self.seq,
                value,
            },
        );
        st.count += 1;
        self.len += 1;
        let grew = priority > st.max_priority || st.count == 1;
        if grew {
            st.max_priority = st.max_priority.max(priority);
            self.resort();
        }
        None
    }

    /// Removes the rule with this match and priority.
    pub fn remove(&mut self, m: &Match, priority: u16) -> Option<T> {
        let i = self.subtables.iter().position(|s| s.mask == m.mask)?;
        let st = &mut self.subtables[i];
        let list = st.rules.get_mut(&m.key)?;
        let at = list.iter().position(|e| e.priority == priority)?;
        let e = list.remove(at);
        if list.is_empty() {
            st.rules.remove(&m.key);
        }
        st.count -= 1;
        self.len -= 1;
        if st.count == 0 {
            self.subtables.remove(i);
        } else if priority == st.max_priority {
            st.recompute_max();
            self.resort();
        }
        Some(e.value)
    }

    /// The best rule matching `key` and its priority; ORs into `wc` every key bit the answer
    /// depended on (see the module doc). Allocates nothing.
    pub fn lookup(&self, key: &FlowKey, wc: &mut FlowKey) -> Option<(&T, u16)> {
        let mut best: Option<&Entry<T>> = None;
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
            if let Some(list) = st.rules.get(&key.masked(&st.mask)) {
                let e = &list[0];
                let better = match best {
                    None => true,
                    Some(b) => {
                        e.priority > b.priority || (e.priority == b.priority && e.seq < b.seq)
                    }
                };
                if better {
                    best = Some(e);
                }
            }
        }
        best.map(|e| (&e.value, e.priority))
    }

    /// Every rule: (match, priority, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Match, u16, &T)> {
        self.subtables.iter().flat_map(|st| {
            st.rules.iter().flat_map(move |(k, list)| {
                list.iter().map(move |e| {
                    (
                        Match {
                            key: *k,
                            mask: st.mask,
                        },
                        e.priority,
                        &e.value,
                    )
                })
            })
        })
    }
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
