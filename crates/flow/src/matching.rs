//! A rule's match: a key and a mask; a packet matches when its key agrees with the match's
//! key on every bit of the mask. A match may also name a conjunction (`conj_id=N`, see
//! [`crate::classifier`]): `conj_id` is not a packet field and takes no key bits; such a
//! rule matches only during the lookup that follows a completed conjunction `N`.

use crate::key::{Field, FlowKey};

/// A match. Invariant: `key` has no bit outside `mask` (kept by [`Match::set`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Match {
    pub key: FlowKey,
    pub mask: FlowKey,
    /// `conj_id=N`: the rule applies when conjunction `N` completed (`None`: any).
    pub conj_id: Option<u32>,
}

impl Match {
    /// Matches every packet.
    pub fn catchall() -> Match {
        Match::default()
    }

    /// Matches field `f` on the bits of `mask` (OR'ed into what the field already matched).
    pub fn set(&mut self, f: Field, value: u128, mask: u128) {
        let m = (self.mask.get(f) | mask) & f.full();
        let v = (self.key.get(f) & !mask) | (value & mask);
        self.mask.set(f, m);
        self.key.set(f, v & m);
    }

    /// The value and mask this match has for `f`.
    pub fn field(&self, f: Field) -> (u128, u128) {
        (self.key.get(f), self.mask.get(f))
    }

    /// Whether a packet with key `k` matches, outside a conjunction's lookup (a
    /// `conj_id=N` rule matches only in it, see [`Match::matches_in`]).
    #[inline]
    pub fn matches(&self, k: &FlowKey) -> bool {
        self.matches_in(k, 0)
    }

    /// Whether `k` matches in the lookup of conjunction `conj` (0: the ordinary lookup, as
    /// OVS's `conj_id` is 0 there).
    #[inline]
    pub fn matches_in(&self, k: &FlowKey, conj: u32) -> bool {
        self.conj_id.is_none_or(|c| c == conj) && self.matches_key(k)
    }

    /// Whether `k` agrees with the match on every bit of its mask (`conj_id` left aside).
    #[inline]
    pub fn matches_key(&self, k: &FlowKey) -> bool {
        k.0.iter()
            .zip(&self.mask.0)
            .zip(&self.key.0)
            .all(|((k, m), v)| k & m == *v)
    }

    /// Whether every packet `other` matches also matches `self` (`other` is at least as
    /// specific on every bit `self` looks at, with the same values there).
    pub fn covers(&self, other: &Match) -> bool {
        self.conj_id.is_none_or(|c| other.conj_id == Some(c))
            && self.mask.is_subset_of(&other.mask)
            && other.key.masked(&self.mask) == self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_match_and_cover() {
        let mut m24 = Match::catchall();
        m24.set(Field::EthType, 0x0800, 0xffff);
        m24.set(Field::Ipv4Dst, 0x0a00_0105, 0xffff_ff00);
        assert_eq!(m24.field(Field::Ipv4Dst), (0x0a00_0100, 0xffff_ff00));
        let mut k = FlowKey::default();
        k.set(Field::EthType, 0x0800);
        k.set(Field::Ipv4Dst, 0x0a00_01fe);
        assert!(m24.matches(&k));
        k.set(Field::Ipv4Dst, 0x0a00_02fe);
        assert!(!m24.matches(&k));
        let mut m32 = m24;
        m32.set(Field::Ipv4Dst, 0x0a00_0107, u128::from(u32::MAX));
        assert!(m24.covers(&m32));
        assert!(!m32.covers(&m24));
        assert!(Match::catchall().covers(&m24));
    }
}
