//! Connection tracking in the pipeline: OVS's `ct()` action as written in a rule
//! ([`CtSpec`]) and as the datapath executes it ([`CtAction`]), and the `ct_state` bits.
//!
//! The tracker itself is `ferrovs_conntrack` (the datapath calls it); this crate only knows
//! what a rule asks of it. `ct(table=T)` *recirculates*: the translation ends at the action
//! (the datapath action carries the table to resume in), the executor runs the tracker,
//! re-extracts the packet's key with the `ct_*` fields and [`crate::Field::RecircId`] set,
//! and the packet is looked up again — the second pass starts in table T. The recirculation
//! id is `T + 1`: everything else a resumed translation needs (in_port, tunnel; metadata and
//! the registers, which the action carries and [`CtAction::freeze_into`] puts back)
//! travels in the key, so the same freeze point always has the same id, in every pipeline
//! generation and across a hot upgrade (nothing to intern, nothing to hand over).
//! See `docs/conntrack.md`.

use std::net::IpAddr;

use crate::key::{Field, FlowKey, SubField, REG_WORD};

/// The `ct_state` bits, with OVS's values (`ct_state=+trk+est`).
pub mod state {
    pub const NEW: u8 = 0x01;
    pub const EST: u8 = 0x02;
    pub const REL: u8 = 0x04;
    pub const RPL: u8 = 0x08;
    pub const INV: u8 = 0x10;
    pub const TRK: u8 = 0x20;
    pub const SNAT: u8 = 0x40;
    pub const DNAT: u8 = 0x80;
    /// Names in OVS's order of printing.
    pub const NAMES: [(u8, &str); 8] = [
        (NEW, "new"),
        (EST, "est"),
        (REL, "rel"),
        (RPL, "rpl"),
        (INV, "inv"),
        (TRK, "trk"),
        (SNAT, "snat"),
        (DNAT, "dnat"),
    ];
}

/// Source or destination translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    Src,
    Dst,
}

/// `nat(src|dst=IP[-IP][:PORT[-PORT]])`: an inclusive address range of one family and an
/// optional inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NatSpec {
    pub kind: NatKind,
    pub addr_min: IpAddr,
    pub addr_max: IpAddr,
    pub ports: Option<(u16, u16)>,
}

/// The `nat` part of a `ct()` action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CtNat {
    /// No `nat`: the frame is never rewritten.
    #[default]
    Off,
    /// `nat` without arguments: a packet of a connection with a binding is translated.
    Apply,
    /// `nat(src=...)`/`nat(dst=...)`: with `commit`, a new connection gets a binding from
    /// the range; a packet of an existing connection is translated by its binding.
    Bind(NatSpec),
    /// `nat(src)`/`nat(dst)` without a range (OVN's `ct_commit` writes `nat(src)`): a new
    /// connection's binding is the identity (its own addresses and ports), so the tracker
    /// does what [`CtNat::Apply`] does; kept apart to print back as written.
    Kind(NatKind),
}

/// `ct(...)` as written in a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CtSpec {
    /// `commit`: the connection enters the table (if new and valid).
    pub commit: bool,
    /// `force` (with commit): an existing connection in the other direction is ended first.
    pub force: bool,
    /// `zone=N` (0 when absent).
    pub zone: u16,
    /// `zone=FIELD[a..b]` (16 bits): the zone taken from a field (a register, as OVN does)
    /// when the translation reaches the action; `zone` is then 0.
    pub zone_src: Option<SubField>,
    /// `table=T`: recirculate, the packet continuing in table T with its `ct_*` fields set.
    pub table: Option<u8>,
    pub nat: CtNat,
    /// `exec(set_field:V/M->ct_mark)` (commit only).
    pub mark: Option<(u32, u32)>,
    /// `exec(set_field:V/M->ct_label)` (commit only).
    pub label: Option<(u128, u128)>,
    /// `exec(move:SRC[..]->NXM_NX_CT_LABEL[..])` (or `CT_MARK`; commit only): bits taken
    /// from the key when the translation reaches the action, written after `mark` and
    /// `label` (OVN's `move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127]`).
    pub moves: Vec<(SubField, SubField)>,
}

/// What the datapath executes for a `ct()` action (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CtAction {
    pub zone: u16,
    pub commit: bool,
    pub force: bool,
    pub nat: CtNat,
    pub mark: Option<(u32, u32)>,
    pub label: Option<(u128, u128)>,
    /// `Some(T)`: after tracking, the packet is looked up again with recirculation id
    /// `T + 1`, resuming in table T.
    pub recirc: Option<u8>,
    /// The OpenFlow metadata the translation had reached at the action: the recirculated
    /// key carries it (the frozen part of the translation that the packet's own key
    /// cannot give back).
    pub metadata: u64,
    /// The registers the translation had reached (the key's register words, `xreg0` to
    /// `xreg7`): the recirculated key carries them too, as OVS freezes them.
    pub regs: [u64; 8],
}

impl CtAction {
    /// The datapath action for a rule's `ct()` reached with the translation's key `k`
    /// (its metadata, its registers, and the zone when it comes from a field).
    pub fn from_spec(s: &CtSpec, k: &FlowKey) -> CtAction {
        let mut regs = [0u64; 8];
        regs.copy_from_slice(&k.0[REG_WORD..REG_WORD + 8]);
        let (mut mark, mut label) = (s.mark, s.label);
        for (src, dst) in &s.moves {
            let v = src.get(k) << dst.ofs;
            let m = dst.mask();
            match dst.field {
                Field::CtMark => {
                    let (ov, om) = mark.unwrap_or((0, 0));
                    mark = Some(((ov & !(m as u32)) | (v & m) as u32, om | m as u32));
                }
                Field::CtLabel => {
                    let (ov, om) = label.unwrap_or((0, 0));
                    label = Some(((ov & !m) | (v & m), om | m));
                }
                // The rule syntax and the codec let no other destination in.
                _ => {}
            }
        }
        CtAction {
            zone: s.zone_src.map_or(s.zone, |f| f.get(k) as u16),
            commit: s.commit,
            force: s.force,
            nat: s.nat,
            mark,
            label,
            recirc: s.table,
            metadata: k.get(Field::Metadata) as u64,
            regs,
        }
    }

    /// Puts what the translation froze at the action (metadata, registers) into the
    /// recirculated pass's key `k`.
    #[inline]
    pub fn freeze_into(&self, k: &mut FlowKey) {
        k.set(Field::Metadata, u128::from(self.metadata));
        k.0[REG_WORD..REG_WORD + 8].copy_from_slice(&self.regs);
    }
}

/// The recirculation id of a resumption in table `t`.
pub const fn recirc_id(t: u8) -> u16 {
    t as u16 + 1
}

/// The table a recirculation id resumes in (None: 0, the first pass).
pub const fn recirc_table(id: u16) -> Option<u8> {
    if id == 0 || id > 256 {
        None
    } else {
        Some((id - 1) as u8)
    }
}
