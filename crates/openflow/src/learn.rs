//! Nicira's `NXAST_LEARN` (subtype 16) and `NXAST_LEARN2` (subtype 45): `learn(...)`.
//!
//! Layout (big-endian, after the experimenter header `type=0xffff, len, vendor, subtype`):
//! `idle_timeout`, `hard_timeout`, `priority` (u16 each), `cookie` (u64), `flags` (u16:
//! send_flow_rem 1, delete_learned 2, write_result 4 in LEARN2 only), `table_id` (u8), a
//! zero byte, `fin_idle_timeout`, `fin_hard_timeout` (u16): 32 bytes. LEARN2 adds `limit`
//! (u32), `result_dst_ofs` (u16), 2 zero bytes (40 bytes), then with write_result the
//! result field's NXM header. Then flow_mod_specs to the end of the action, each a u16
//! header (`n_bits` in bits 0..9, source in bit 13: 0 field, 1 immediate; destination in
//! bits 11..12: 0 match, 1 load, 2 output), the source (a field: NXM header u32 + offset
//! u16; an immediate: `n_bits` rounded up to 16-bit units, right-aligned), the destination
//! (match or load: NXM header + offset). A zero header, or the end, ends the list; what
//! follows must be zero (padding).
//!
//! Refusals are OVS's (`decode_LEARN_common`, `decode_LEARN_specs`, `learn_check`): a
//! non-zero pad, table 255, an unknown flag, an unknown source/destination combination or
//! non-zero bytes after the list are `OFPBAC_BAD_ARGUMENT`; a spec running past the action
//! `OFPBAC_BAD_LEN`; an unknown field `OFPBAC_BAD_SET_TYPE`; bits beyond a field or 0 bits
//! `OFPBAC_BAD_SET_LEN`; a load into a read-only field `OFPBAC_BAD_SET_ARGUMENT`. LEARN2's
//! `write_result` (a learn's outcome written into a field) is not supported:
//! `OFPBAC_BAD_ARGUMENT`. The learned rule's prerequisites are the rule syntax's checks
//! (the daemon converts every action to a rule and back).

use crate::action::{at, Action};
use crate::error::{bac, OfError};
use crate::nicira::{field_of_header, nxm_header, NX_VENDOR_ID};
use crate::oxm::Field;
use crate::wire::{pad8, Put, Reader};

/// `NXAST_LEARN`.
pub const NXAST_LEARN: u16 = 16;
/// `NXAST_LEARN2`.
pub const NXAST_LEARN2: u16 = 45;

/// `NX_LEARN_F_*`.
pub mod flags {
    pub const SEND_FLOW_REM: u16 = 1;
    pub const DELETE_LEARNED: u16 = 2;
    pub const WRITE_RESULT: u16 = 4;
}

const SRC_IMMEDIATE: u16 = 1 << 13;
const DST_SHIFT: u16 = 11;
const DST_MATCH: u16 = 0;
const DST_LOAD: u16 = 1;
const DST_OUTPUT: u16 = 2;
const N_BITS_MASK: u16 = 0x3ff;

/// A flow_mod_spec's source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LearnSrc {
    /// Bits `ofs..` of a field of the packet.
    Field { field: Field, ofs: u16 },
    /// A constant: `ceil(n_bits / 8)` bytes, big-endian.
    Imm(Vec<u8>),
}

/// A flow_mod_spec's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LearnDst {
    Match { field: Field, ofs: u16 },
    Load { field: Field, ofs: u16 },
    Output,
}

/// One flow_mod_spec of `n_bits` bits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LearnSpecItem {
    pub n_bits: u16,
    pub src: LearnSrc,
    pub dst: LearnDst,
}

/// `NXAST_LEARN` / `NXAST_LEARN2`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NxLearn {
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub priority: u16,
    pub cookie: u64,
    /// `flags::*`.
    pub flags: u16,
    pub table_id: u8,
    pub fin_idle_timeout: u16,
    pub fin_hard_timeout: u16,
    /// LEARN2's limit (0: none); a non-zero one is encoded as LEARN2.
    pub limit: u32,
    /// Decoded from (or to be encoded as) LEARN2.
    pub v2: bool,
    pub specs: Vec<LearnSpecItem>,
}

const fn bad(code: u16, reason: &'static str) -> OfError {
    OfError::action(code, reason)
}

/// Field bits within the field, at least one.
fn check_bits(field: Field, ofs: u16, n_bits: u16) -> Result<(), OfError> {
    if n_bits == 0 || u32::from(ofs) + u32::from(n_bits) > u32::from(field.info().len) * 8 {
        return Err(bad(bac::BAD_SET_LEN, "learn: bits beyond their field"));
    }
    Ok(())
}

/// Decodes a LEARN / LEARN2 action: `r` is past the subtype; `len` the action's length.
pub(crate) fn decode(r: &mut Reader<'_>, subtype: u16, len: usize) -> Result<Action, OfError> {
    let v2 = subtype == NXAST_LEARN2;
    let min = if v2 { 40 } else { 32 };
    if len < min {
        return Err(bad(bac::BAD_LEN, "NXAST_LEARN shorter than its header"));
    }
    let idle_timeout = r.u16()?;
    let hard_timeout = r.u16()?;
    let priority = r.u16()?;
    let cookie = r.u64()?;
    let fl = r.u16()?;
    let table_id = r.u8()?;
    if r.u8()? != 0 {
        return Err(bad(bac::BAD_ARGUMENT, "learn: pad not zero"));
    }
    let fin_idle_timeout = r.u16()?;
    let fin_hard_timeout = r.u16()?;
    if table_id == 0xff {
        return Err(bad(bac::BAD_ARGUMENT, "learn: table 255"));
    }
    let mut limit = 0;
    if v2 {
        limit = r.u32()?;
        let result_ofs = r.u16()?;
        if r.u16()? != 0 {
            return Err(bad(bac::BAD_ARGUMENT, "learn2: pad not zero"));
        }
        if fl & flags::WRITE_RESULT != 0 {
            return Err(bad(
                bac::BAD_ARGUMENT,
                "learn2: result_dst is not supported (ferrovs)",
            ));
        }
        if result_ofs != 0 {
            return Err(bad(
                bac::BAD_ARGUMENT,
                "learn2: result_dst_ofs without result_dst",
            ));
        }
    }
    if fl & !(flags::SEND_FLOW_REM | flags::DELETE_LEARNED) != 0 {
        return Err(bad(bac::BAD_ARGUMENT, "learn: unknown flags"));
    }
    let mut specs = Vec::new();
    let rest = r.rest();
    let mut p = 0usize;
    while rest.len() - p >= 2 {
        let header = u16::from_be_bytes([rest[p], rest[p + 1]]);
        if header == 0 {
            break;
        }
        p += 2;
        let n_bits = header & N_BITS_MASK;
        let imm = header & SRC_IMMEDIATE != 0;
        let dst_type = (header >> DST_SHIFT) & 3;
        if header & !(N_BITS_MASK | SRC_IMMEDIATE | (3 << DST_SHIFT)) != 0
            || dst_type > DST_OUTPUT
            || (dst_type == DST_OUTPUT && imm)
        {
            return Err(bad(
                bac::BAD_ARGUMENT,
                "learn: unknown flow_mod_spec header",
            ));
        }
        let imm_units = 2 * usize::from(n_bits).div_ceil(16);
        let src_len = if imm { imm_units } else { 6 };
        let dst_len = if dst_type == DST_OUTPUT { 0 } else { 6 };
        let need = src_len + dst_len;
        if rest.len() - p < need {
            return Err(bad(bac::BAD_LEN, "learn: flow_mod_spec past the action"));
        }
        let mut sr = Reader::new(&rest[p..p + need], bad(bac::BAD_LEN, "learn spec"));
        let src = if imm {
            let b = sr.bytes(imm_units)?;
            let n = usize::from(n_bits).div_ceil(8);
            LearnSrc::Imm(b[imm_units - n..].to_vec())
        } else {
            let field = field_of_header(sr.u32()?)?;
            let ofs = sr.u16()?;
            check_bits(field, ofs, n_bits)?;
            LearnSrc::Field { field, ofs }
        };
        let dst = match dst_type {
            DST_OUTPUT => LearnDst::Output,
            t => {
                let field = field_of_header(sr.u32()?)?;
                let ofs = sr.u16()?;
                check_bits(field, ofs, n_bits)?;
                if t == DST_LOAD {
                    if !field.info().settable {
                        return Err(bad(
                            bac::BAD_SET_ARGUMENT,
                            "learn: load of a read-only field",
                        ));
                    }
                    LearnDst::Load { field, ofs }
                } else {
                    LearnDst::Match { field, ofs }
                }
            }
        };
        if n_bits == 0 {
            return Err(bad(bac::BAD_SET_LEN, "learn: an immediate of 0 bits"));
        }
        p += need;
        specs.push(LearnSpecItem { n_bits, src, dst });
    }
    if rest[p..].iter().any(|&b| b != 0) {
        return Err(bad(
            bac::BAD_ARGUMENT,
            "learn: bytes after the specs not zero",
        ));
    }
    Ok(Action::Learn(Box::new(NxLearn {
        idle_timeout,
        hard_timeout,
        priority,
        cookie,
        flags: fl,
        table_id,
        fin_idle_timeout,
        fin_hard_timeout,
        limit,
        v2,
        specs,
    })))
}

/// Encodes as OVS does: LEARN2 when it came as one or has a limit, specs, zero padding.
pub(crate) fn encode(l: &NxLearn, out: &mut Vec<u8>) {
    let start = out.len();
    let v2 = l.v2 || l.limit != 0;
    out.put_u16(at::EXPERIMENTER);
    out.put_u16(0);
    out.put_u32(NX_VENDOR_ID);
    out.put_u16(if v2 { NXAST_LEARN2 } else { NXAST_LEARN });
    out.put_u16(l.idle_timeout);
    out.put_u16(l.hard_timeout);
    out.put_u16(l.priority);
    out.put_u64(l.cookie);
    out.put_u16(l.flags);
    out.put_u8(l.table_id);
    out.put_u8(0);
    out.put_u16(l.fin_idle_timeout);
    out.put_u16(l.fin_hard_timeout);
    if v2 {
        out.put_u32(l.limit);
        out.put_u16(0);
        out.put_u16(0);
    }
    for s in &l.specs {
        let (imm, dst_type) = (
            matches!(s.src, LearnSrc::Imm(_)),
            match s.dst {
                LearnDst::Match { .. } => DST_MATCH,
                LearnDst::Load { .. } => DST_LOAD,
                LearnDst::Output => DST_OUTPUT,
            },
        );
        let src_bit = if imm { SRC_IMMEDIATE } else { 0 };
        out.put_u16((s.n_bits & N_BITS_MASK) | src_bit | (dst_type << DST_SHIFT));
        match &s.src {
            LearnSrc::Field { field, ofs } => {
                out.put_u32(nxm_header(*field));
                out.put_u16(*ofs);
            }
            LearnSrc::Imm(b) => {
                let units = 2 * usize::from(s.n_bits).div_ceil(16);
                out.put_zeros(units.saturating_sub(b.len()));
                out.extend_from_slice(&b[b.len().saturating_sub(units)..]);
            }
        }
        match s.dst {
            LearnDst::Match { field, ofs } | LearnDst::Load { field, ofs } => {
                out.put_u32(nxm_header(field));
                out.put_u16(ofs);
            }
            LearnDst::Output => {}
        }
    }
    let len = pad8(out.len() - start);
    out.resize(start + len, 0);
    let l16 = (len as u16).to_be_bytes();
    out[start + 2] = l16[0];
    out[start + 3] = l16[1];
}
