//! A deliberately simple classifier: every rule scanned for every lookup. The reference the
//! tuple-space [`crate::Classifier`] and the pipeline are tested against, conjunctive
//! matches included (written straight from the rules in [`crate::classifier`]'s doc).

use crate::classifier::{completed, Conjunction};
use crate::key::FlowKey;
use crate::matching::Match;

/// A rule: match, priority, insertion number, value, conjunctions (empty: a hard rule).
type Rule<T> = (Match, u16, u64, T, Vec<Conjunction>);

/// Rules in a list.
#[derive(Debug, Clone)]
pub struct Linear<T> {
    rules: Vec<Rule<T>>,
    seq: u64,
}

impl<T> Default for Linear<T> {
    fn default() -> Self {
        Linear {
            rules: Vec::new(),
            seq: 0,
        }
    }
}

impl<T> Linear<T> {
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Same semantics as [`crate::Classifier::insert`].
    pub fn insert(&mut self, m: Match, priority: u16, value: T) -> Option<T> {
        self.insert_conj(m, priority, value, &[])
    }

    /// Same semantics as [`crate::Classifier::insert_conj`].
    pub fn insert_conj(
        &mut self,
        m: Match,
        priority: u16,
        value: T,
        conj: &[Conjunction],
    ) -> Option<T> {
        self.seq += 1;
        if let Some(r) = self.rules.iter_mut().find(|r| r.0 == m && r.1 == priority) {
            r.4 = conj.to_vec();
            return Some(std::mem::replace(&mut r.3, value));
        }
        self.rules
            .push((m, priority, self.seq, value, conj.to_vec()));
        None
    }

    pub fn remove(&mut self, m: &Match, priority: u16) -> Option<T> {
        let i = self
            .rules
            .iter()
            .position(|r| r.0 == *m && r.1 == priority)?;
        Some(self.rules.remove(i).3)
    }

    /// The best hard rule matching `key` in the lookup of conjunction `conj` (0: the
    /// ordinary one): the highest priority; ties: the earliest inserted.
    fn hard(&self, key: &FlowKey, conj: u32) -> Option<&Rule<T>> {
        self.rules
            .iter()
            .filter(|r| r.4.is_empty() && r.0.matches_in(key, conj))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
    }

    /// The rule a packet gets, conjunctions included.
    pub fn lookup(&self, key: &FlowKey) -> Option<(&T, u16)> {
        let hard = self.hard(key, 0);
        let hard_pri = hard.map(|r| i32::from(r.1)).unwrap_or(-1);
        let mut prios: Vec<u16> = self
            .rules
            .iter()
            .filter(|r| {
                !r.4.is_empty()
                    && r.0.conj_id.is_none()
                    && i32::from(r.1) > hard_pri
                    && r.0.matches_key(key)
            })
            .map(|r| r.1)
            .collect();
        prios.sort_unstable_by(|a, b| b.cmp(a));
        prios.dedup();
        let mut ids = Vec::new();
        for p in prios {
            let soft = self.rules.iter().filter(|r| {
                !r.4.is_empty() && r.0.conj_id.is_none() && r.1 == p && r.0.matches_key(key)
            });
            completed(soft.map(|r| r.4.as_slice()), &mut ids);
            for &id in &ids {
                if let Some(r) = self.hard(key, id) {
                    return Some((&r.3, r.1));
                }
            }
        }
        hard.map(|r| (&r.3, r.1))
    }
}
