//! A deliberately simple classifier: every rule scanned for every lookup. The reference the
//! tuple-space [`crate::Classifier`] and the pipeline are tested against.

use crate::key::FlowKey;
use crate::matching::Match;

/// Rules in a list.
#[derive(Debug, Clone)]
pub struct Linear<T> {
    rules: Vec<(Match, u16, u64, T)>,
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
        if let Some(r) = self.rules.iter_mut().find(|r| r.0 == m && r.1 == priority) {
            return Some(std::mem::replace(&mut r.3, value));
        }
        self.seq += 1;
        self.rules.push((m, priority, self.seq, value));
        None
    }

    pub fn remove(&mut self, m: &Match, priority: u16) -> Option<T> {
        let i = self
            .rules
            .iter()
            .position(|r| r.0 == *m && r.1 == priority)?;
        Some(self.rules.remove(i).3)
    }

    /// The highest priority matching rule; ties: the earliest inserted.
    pub fn lookup(&self, key: &FlowKey) -> Option<(&T, u16)> {
        self.rules
            .iter()
            .filter(|r| r.0.matches(key))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
            .map(|r| (&r.3, r.1))
    }
}
