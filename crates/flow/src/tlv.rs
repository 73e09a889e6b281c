//! The tunnel option map: which Geneve option (class, type, length) a bridge calls
//! `tun_metadataN` (OVS's TLV table, set with `NXT_TLV_TABLE_MOD`; OVN maps its one
//! option, class 0x0102 type 0x80 of 4 bytes, to `tun_metadata0`).
//!
//! Plain data: the control plane builds a [`TlvMap`] (checked by [`TlvMap::new`]) and
//! publishes it to the bridge's tunnel ports; a Geneve port maps received options to
//! `tun_metadataN` with [`TlvMap::by_option`] and emits a set `tun_metadataN` as its option
//! with [`TlvMap::by_index`]. An empty map: options are checked and skipped but not matched,
//! and nothing is emitted.
//!
//! Limits (see docs/datapath.md, Geneve): at most [`TUN_METADATA`] entries, indices 0..3,
//! options of 0 or 4 bytes (a key field is 32 bits); OVS allows 64 entries of up to 124
//! bytes.

use crate::key::TUN_METADATA;

/// One mapping: option `class`/`kind` of `len` bytes is `tun_metadata{index}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlvEntry {
    pub class: u16,
    /// The option type (with its critical bit, 0x80, as on the wire).
    pub kind: u8,
    /// Option data length in bytes: 0 or 4 here.
    pub len: u8,
    /// `N` of `tun_metadataN`.
    pub index: u8,
}

/// Why a map was refused (`NXT_TLV_TABLE_MOD` answers with the matching `NXTTMFC_*` code).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TlvError {
    /// `NXTTMFC_BAD_FIELD_IDX`.
    #[error("tun_metadata{0}: only tun_metadata0..{max} are supported", max = TUN_METADATA - 1)]
    BadIndex(u8),
    /// `NXTTMFC_BAD_OPT_LEN`.
    #[error("option length {0}: only 0 or 4 bytes are supported")]
    BadLen(u8),
    /// `NXTTMFC_ALREADY_MAPPED`.
    #[error("tun_metadata{0} is mapped twice")]
    IndexTwice(u8),
    /// `NXTTMFC_DUP_ENTRY`.
    #[error("option class {0:#06x} type {1:#04x} is mapped twice")]
    OptionTwice(u16, u8),
}

/// A bridge's option map (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlvMap {
    entries: Vec<TlvEntry>,
}

impl TlvMap {
    /// A checked map.
    pub fn new(entries: impl IntoIterator<Item = TlvEntry>) -> Result<TlvMap, TlvError> {
        let mut m = TlvMap::default();
        for e in entries {
            m.add(e)?;
        }
        Ok(m)
    }

    /// Adds `e` (`NXTTMC_ADD`), checked against the entries already there.
    pub fn add(&mut self, e: TlvEntry) -> Result<(), TlvError> {
        if usize::from(e.index) >= TUN_METADATA {
            return Err(TlvError::BadIndex(e.index));
        }
        if e.len != 0 && e.len != 4 {
            return Err(TlvError::BadLen(e.len));
        }
        if self.entries.iter().any(|x| x.index == e.index) {
            return Err(TlvError::IndexTwice(e.index));
        }
        if self
            .entries
            .iter()
            .any(|x| x.class == e.class && x.kind == e.kind)
        {
            return Err(TlvError::OptionTwice(e.class, e.kind));
        }
        self.entries.push(e);
        Ok(())
    }

    /// Removes the entry of `tun_metadata{index}` (`NXTTMC_DELETE`); false if there is none.
    pub fn remove(&mut self, index: u8) -> bool {
        let n = self.entries.len();
        self.entries.retain(|e| e.index != index);
        n != self.entries.len()
    }

    pub fn entries(&self) -> &[TlvEntry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of a received option (class, type with its critical bit, data length).
    #[inline]
    pub fn by_option(&self, class: u16, kind: u8, len: usize) -> Option<&TlvEntry> {
        self.entries
            .iter()
            .find(|e| e.class == class && e.kind == kind && usize::from(e.len) == len)
    }

    /// The entry of `tun_metadata{index}`.
    #[inline]
    pub fn by_index(&self, index: usize) -> Option<&TlvEntry> {
        self.entries.iter().find(|e| usize::from(e.index) == index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OVN: TlvEntry = TlvEntry {
        class: 0x0102,
        kind: 0x80,
        len: 4,
        index: 0,
    };

    #[test]
    fn ovn_s_option_maps_both_ways() {
        let m = TlvMap::new([OVN]).unwrap();
        assert_eq!(m.by_option(0x0102, 0x80, 4), Some(&OVN));
        assert_eq!(m.by_option(0x0102, 0x80, 8), None);
        assert_eq!(m.by_option(0x0102, 0x00, 4), None);
        assert_eq!(m.by_index(0), Some(&OVN));
        assert_eq!(m.by_index(1), None);
        assert!(TlvMap::default().is_empty());
    }

    #[test]
    fn bad_maps_are_refused() {
        let e = |index, len, class, kind| TlvEntry {
            class,
            kind,
            len,
            index,
        };
        assert_eq!(TlvMap::new([e(4, 4, 1, 1)]), Err(TlvError::BadIndex(4)));
        assert_eq!(TlvMap::new([e(0, 8, 1, 1)]), Err(TlvError::BadLen(8)));
        assert_eq!(TlvMap::new([e(0, 3, 1, 1)]), Err(TlvError::BadLen(3)));
        assert_eq!(
            TlvMap::new([e(0, 4, 1, 1), e(0, 4, 1, 2)]),
            Err(TlvError::IndexTwice(0))
        );
        assert_eq!(
            TlvMap::new([e(0, 4, 1, 1), e(1, 0, 1, 1)]),
            Err(TlvError::OptionTwice(1, 1))
        );
        let mut m = TlvMap::new([e(0, 4, 1, 1), e(3, 0, 2, 2)]).unwrap();
        assert!(m.remove(0));
        assert!(!m.remove(0));
        assert_eq!(m.entries(), &[e(3, 0, 2, 2)]);
    }
}
