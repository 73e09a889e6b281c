//! Nicira's `ct` action ([`NxCt`]) ⇄ the rule's [`CtSpec`].
//!
//! A rule's `ct()` is written as OVS writes it: flags, an immediate zone, the table
//! (`0xff`: none), then the nested list — `nat` first, then the `ct_mark` write, then the
//! `ct_label` write. A whole-field write is a SET_FIELD, a masked one an `NXAST_REG_LOAD` per
//! run of mask bits (at most 64 bits each), as ovs-ofctl encodes `set_field:V/M->ct_mark`.
//! Reading accepts any order and merges several writes of one field (later bits win).
//!
//! A `move` into `ct_mark`/`ct_label` (OVN's `move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127]`)
//! is the rule's `moves`, written back after the constant writes; `nat(src)`/`nat(dst)`
//! without a range is [`CtNat::Kind`].
//!
//! A zone taken from a field (OVN's `zone=NXM_NX_REG13[0..15]`) is the rule's `zone_src`.
//! What a `CtSpec` cannot hold is refused with `OFPBAC_BAD_ARGUMENT`, never dropped: an
//! application-layer gateway (`alg`), unknown `ct` flags, `force`
//! without `commit`, a second `nat`, NAT's `persistent`/`hash`/`random` flags, and a range
//! without `src` or `dst`.

use ferrovs_flow::ct::{CtNat, CtSpec, NatKind, NatSpec};
use ferrovs_openflow::error::{bac, et};
use ferrovs_openflow::nicira::{ct_flags, nat_flags, CtZoneSrc, NxCt, NxNat, NX_CT_RECIRC_NONE};
use ferrovs_openflow::oxm::Field as Of;
use ferrovs_openflow::{Action, OfError, Oxm};

use super::N_TABLES;

const fn arg(reason: &'static str) -> OfError {
    OfError::new(et::BAD_ACTION, bac::BAD_ARGUMENT, reason)
}

/// `(value, mask)` with `(v, m)` written over it.
fn merge(old: Option<(u128, u128)>, v: u128, m: u128) -> (u128, u128) {
    let (ov, om) = old.unwrap_or((0, 0));
    ((ov & !m) | (v & m), om | m)
}

fn nat_from_of(n: &NxNat) -> Result<CtNat, OfError> {
    if n.flags & (nat_flags::PERSISTENT | nat_flags::PROTO_HASH | nat_flags::PROTO_RANDOM) != 0 {
        return Err(arg("nat's persistent, hash and random are not supported"));
    }
    let kind = match n.flags & (nat_flags::SRC | nat_flags::DST) {
        nat_flags::SRC => Some(NatKind::Src),
        nat_flags::DST => Some(NatKind::Dst),
        _ => None,
    };
    match (kind, n.addr_min) {
        (None, None) => Ok(CtNat::Apply),
        (Some(kind), Some(min)) => Ok(CtNat::Bind(NatSpec {
            kind,
            addr_min: min,
            addr_max: n.addr_max.unwrap_or(min),
            ports: n.port_min.map(|p| (p, n.port_max.unwrap_or(p))),
        })),
        (Some(kind), None) => Ok(CtNat::Kind(kind)),
        (None, Some(_)) => Err(arg("nat range without src or dst")),
    }
}

/// The rule's `ct()` of a decoded `NXAST_CT`.
pub fn ct_from_of(ct: &NxCt) -> Result<CtSpec, OfError> {
    if ct.flags & !(ct_flags::COMMIT | ct_flags::FORCE) != 0 {
        return Err(arg("ct with unknown flags"));
    }
    let commit = ct.flags & ct_flags::COMMIT != 0;
    let force = ct.flags & ct_flags::FORCE != 0;
    if force && !commit {
        return Err(arg("ct's force without commit"));
    }
    let (zone, zone_src) = match ct.zone {
        CtZoneSrc::Imm(z) => (z, None),
        // A register (as OVN's zone=NXM_NX_REG13[0..15]), any key field in fact.
        CtZoneSrc::Field { field, ofs } => (0, Some(super::regs::subfield(field, ofs, 16)?)),
    };
    if ct.alg != 0 {
        return Err(arg(
            "ct's application-layer gateways (alg) are not supported",
        ));
    }
    let table = match ct.recirc_table {
        NX_CT_RECIRC_NONE => None,
        t if t >= N_TABLES => return Err(arg("ct recirculates beyond the last table")),
        t => Some(t),
    };
    let mut spec = CtSpec {
        commit,
        force,
        zone,
        zone_src,
        table,
        ..CtSpec::default()
    };
    let mut nat_seen = false;
    let mut mark: Option<(u128, u128)> = None;
    let mut label: Option<(u128, u128)> = None;
    for a in &ct.actions {
        let (field, v, m) = match a {
            Action::Nat(n) => {
                if std::mem::replace(&mut nat_seen, true) {
                    return Err(arg("ct nests two nat actions"));
                }
                spec.nat = nat_from_of(n)?;
                continue;
            }
            Action::SetField(o) => (o.field, o.value_u128(), o.mask_u128()),
            Action::RegMove(m) | Action::CopyField(m) => {
                let src = super::regs::subfield(m.src, m.src_ofs, m.nbits)?;
                let dst = super::regs::subfield(m.dst, m.dst_ofs, m.nbits)?;
                spec.moves.push((src, dst));
                continue;
            }
            Action::RegLoad {
                field,
                ofs,
                nbits,
                value,
            } => {
                let ones = if *nbits >= 64 {
                    u128::from(u64::MAX)
                } else {
                    (1u128 << nbits) - 1
                };
                (*field, u128::from(*value) << ofs, ones << ofs)
            }
            // The codec lets nothing else into a ct's list.
            _ => return Err(arg("ct nests an action other than nat or a ct field write")),
        };
        match field {
            Of::CtMark => mark = Some(merge(mark, v, m)),
            Of::CtLabel => label = Some(merge(label, v, m)),
            _ => return Err(arg("ct writes a field other than ct_mark or ct_label")),
        }
    }
    spec.mark = mark.map(|(v, m)| (v as u32, m as u32));
    spec.label = label;
    Ok(spec)
}

/// The writes of `(value, mask)` into `field` of `width` bits: one SET_FIELD when the mask
/// is whole, else a REG_LOAD per run of mask bits, each at most 64 bits.
fn writes(field: Of, value: u128, mask: u128, width: u32, out: &mut Vec<Action>) {
    let full = if width >= 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    let mask = mask & full;
    if mask == full {
        out.push(Action::SetField(Oxm::exact(field, value & full)));
        return;
    }
    super::regs::reg_loads(field, value, mask, out);
}

/// The `NXAST_CT` of a rule's `ct()`.
pub fn ct_to_of(spec: &CtSpec) -> NxCt {
    let mut actions = Vec::new();
    match spec.nat {
        CtNat::Off => {}
        CtNat::Apply => actions.push(Action::Nat(NxNat::default())),
        CtNat::Kind(k) => actions.push(Action::Nat(NxNat {
            flags: match k {
                NatKind::Src => nat_flags::SRC,
                NatKind::Dst => nat_flags::DST,
            },
            ..NxNat::default()
        })),
        CtNat::Bind(n) => actions.push(Action::Nat(NxNat {
            flags: match n.kind {
                NatKind::Src => nat_flags::SRC,
                NatKind::Dst => nat_flags::DST,
            },
            addr_min: Some(n.addr_min),
            addr_max: (n.addr_max != n.addr_min).then_some(n.addr_max),
            port_min: n.ports.map(|p| p.0),
            port_max: n.ports.filter(|p| p.1 != p.0).map(|p| p.1),
        })),
    }
    if let Some((v, m)) = spec.mark {
        writes(Of::CtMark, u128::from(v), u128::from(m), 32, &mut actions);
    }
    if let Some((v, m)) = spec.label {
        writes(Of::CtLabel, v, m, 128, &mut actions);
    }
    let any = ferrovs_flow::Match::catchall();
    for (src, dst) in &spec.moves {
        let end = |sf: &ferrovs_flow::SubField| u32::from(sf.ofs) + u32::from(sf.nbits);
        if let (Some(s), Some(d)) = (
            super::regs::key_to_of(src.field, end(src), &any),
            super::regs::key_to_of(dst.field, end(dst), &any),
        ) {
            actions.push(Action::RegMove(ferrovs_openflow::nicira::NxMove {
                src: s,
                src_ofs: src.ofs,
                dst: d,
                dst_ofs: dst.ofs,
                nbits: src.nbits,
            }));
        }
    }
    NxCt {
        flags: if spec.commit { ct_flags::COMMIT } else { 0 }
            | if spec.force { ct_flags::FORCE } else { 0 },
        zone: match spec.zone_src.and_then(|sf| {
            super::regs::key_to_of(
                sf.field,
                u32::from(sf.ofs) + 16,
                &ferrovs_flow::Match::catchall(),
            )
            .map(|f| (f, sf.ofs))
        }) {
            Some((field, ofs)) => CtZoneSrc::Field { field, ofs },
            None => CtZoneSrc::Imm(spec.zone),
        },
        recirc_table: spec.table.unwrap_or(NX_CT_RECIRC_NONE),
        alg: 0,
        actions,
    }
}
