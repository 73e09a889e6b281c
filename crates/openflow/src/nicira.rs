//! Nicira experimenter actions (vendor `0x00002320`): connection tracking's `NXAST_CT`
//! (`ct(...)`), `NXAST_NAT` (`nat(...)`, only inside `ct`), `NXAST_CT_CLEAR`; and the
//! register actions OVN's pipeline is built on: `NXAST_REG_LOAD` (`load:V->F[a..b]`, also
//! ovs-ofctl's encoding of a masked `set_field`, e.g. of `ct_mark` inside `ct`'s `exec`),
//! `NXAST_REG_LOAD2` (a masked OXM), `NXAST_REG_MOVE` (`move:A[..]->B[..]`),
//! `NXAST_RESUBMIT` / `NXAST_RESUBMIT_TABLE` (`resubmit(PORT,TABLE)`), `NXAST_OUTPUT_REG` /
//! `NXAST_OUTPUT_REG2` (`output:NXM_NX_REG15[]`); the register stack's `NXAST_STACK_PUSH` /
//! `NXAST_STACK_POP` (`push:F[..]`, `pop:F[..]`) and `NXAST_CLONE` (`clone(...)`).
//!
//! Layouts (big-endian, after the experimenter header `type=0xffff, len, vendor, subtype`):
//! * `NXAST_CT` (24 bytes + nested actions): `flags` (commit 1, force 2), `zone_src` (an NXM
//!   header, 0 for an immediate zone), `zone` (the immediate zone, or the source's
//!   `ofs << 6 | (n_bits - 1)`), `recirc_table` (0xff: none), 3 pad, `alg`, then an action
//!   list.
//! * `NXAST_NAT` (16 bytes + options, padded to 8): 2 pad, `flags` (src 1, dst 2,
//!   persistent 4, hash 8, random 16), `range_present` (ipv4 min 1, ipv4 max 2, ipv6 min 4,
//!   ipv6 max 8, port min 16, port max 32), then the present options in that order.
//! * `NXAST_CT_CLEAR` (16 bytes): 6 pad.
//! * `NXAST_CONJUNCTION` (16 bytes): `clause` (0-based: `conjunction(id,k/n)` has `k - 1`),
//!   `n_clauses`, `id` (u32). `n` outside 2..=64 or `k > n` is OVS's
//!   `NXBAC_BAD_CONJUNCTION` (an experimenter error, code 15); a `conjunction` with actions
//!   other than `conjunction`s is refused with the same code by the control plane.
//! * `NXAST_REG_LOAD` (24 bytes): `ofs_nbits`, `dst` (an NXM header), `value` (u64).
//! * `NXAST_REG_LOAD2` (16 bytes + an OXM TLV, padded to 8): the TLV, maybe masked.
//! * `NXAST_REG_MOVE` (24 bytes): `n_bits`, `src_ofs`, `dst_ofs`, `src`, `dst` (NXM headers).
//! * `NXAST_RESUBMIT` (16 bytes): `in_port` (16-bit port number); `NXAST_RESUBMIT_TABLE` (16
//!   bytes): `in_port`, `table` (0xff: the current one), 3 zero bytes. `OFPP_IN_PORT`
//!   (0xfff8): the packet's own.
//! * `NXAST_STACK_PUSH`/`NXAST_STACK_POP` (24 bytes): `offset`, `field` (an NXM header),
//!   `n_bits` (the number of bits, not minus one), 6 zero bytes.
//! * `NXAST_CLONE` (16 bytes + nested actions): 6 zero bytes, then an action list (of the
//!   same kind as the list the clone is in).
//! * `NXAST_OUTPUT_REG` (24 bytes): `ofs_nbits`, `src`, `max_len`, 6 zero bytes;
//!   `NXAST_OUTPUT_REG2` (24 bytes): `ofs_nbits`, `max_len`, `src`, zero bytes.
//! * `NXAST_CHECK_PKT_LARGER` (24 bytes): `pkt_len`, `offset` (the result's bit in `dst`),
//!   `dst` (an NXM header), 6 zero bytes.
//!
//! The refusals are OVS's (`decode_NXAST_RAW_CT`, `decode_NXAST_RAW_NAT`,
//! `ofpacts_verify_nested`): a wrong length is `OFPBAC_BAD_LEN`; an unknown NAT flag, src
//! with dst, hash with random, a range whose presence bits or order do not make sense, or a
//! nested action `ct` does not take is `OFPBAC_BAD_ARGUMENT`; a field-sourced zone of an
//! unknown field is `OFPBAC_BAD_SET_TYPE`, of other than 16 bits or beyond its field
//! `OFPBAC_BAD_SET_LEN`; NAT or a write of `ct_mark`/`ct_label` outside `ct` is
//! `OFPBAC_BAD_SET_ARGUMENT`; a Nicira subtype this codec does not decode (`note`,
//! `resubmit(...,ct)`, ...) is `OFPBAC_BAD_EXP_TYPE`. `NXAST_LEARN`/`LEARN2` are decoded in
//! [`crate::learn`]. A load, move or output of an unknown
//! field is `OFPBAC_BAD_SET_TYPE`, of bits beyond it `OFPBAC_BAD_SET_LEN`; bytes that must
//! be zero and are not are `OFPBAC_BAD_ARGUMENT` (OVS's `NXBRC_MUST_BE_ZERO`, a Nicira
//! error code this codec does not send).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::action::{at, decode_actions_in, encode_actions, Action, ActionContext};
use crate::error::{bac, OfError};
use crate::oxm::{Field, Oxm};
use crate::wire::{Put, Reader};

/// Nicira's experimenter (vendor) id.
pub const NX_VENDOR_ID: u32 = 0x0000_2320;

/// `NXAST_*` subtypes this codec decodes.
pub mod nxast {
    pub const RESUBMIT: u16 = 1;
    pub const REG_MOVE: u16 = 6;
    pub const REG_LOAD: u16 = 7;
    pub const RESUBMIT_TABLE: u16 = 14;
    pub const CONTROLLER: u16 = 20;
    pub const CONTROLLER2: u16 = 37;
    pub const OUTPUT_REG: u16 = 15;
    pub const OUTPUT_REG2: u16 = 32;
    pub const REG_LOAD2: u16 = 33;
    pub const CT: u16 = 35;
    pub const NAT: u16 = 36;
    pub const DEC_TTL: u16 = 18;
    pub const DEC_TTL_CNT_IDS: u16 = 21;
    pub const STACK_PUSH: u16 = 27;
    pub const STACK_POP: u16 = 28;
    pub const CLONE: u16 = 42;
    pub const CT_CLEAR: u16 = 43;
    pub const CONJUNCTION: u16 = 34;
    pub const CHECK_PKT_LARGER: u16 = 49;
}

/// `NXAST_CHECK_PKT_LARGER`: bit `ofs` of `dst` becomes 1 when the packet is longer than
/// `pkt_len` bytes, else 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NxCheckPktLarger {
    /// The length compared with.
    pub pkt_len: u16,
    /// The field written.
    pub dst: Field,
    /// The bit of it written.
    pub ofs: u16,
}

/// `NXAST_STACK_PUSH`/`NXAST_STACK_POP`: bits `ofs..ofs + nbits` of `field` pushed onto
/// (popped from) the translation's stack. Decoded values have the range within the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NxStack {
    /// The field pushed or popped.
    pub field: Field,
    /// Its first bit.
    pub ofs: u16,
    /// How many bits.
    pub nbits: u16,
}

/// A copy of `nbits` bits from `src` at `src_ofs` to `dst` at `dst_ofs` (`NXAST_REG_MOVE`,
/// OpenFlow 1.5's `OFPAT_COPY_FIELD`). Decoded values have both ranges within their fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NxMove {
    /// The source field.
    pub src: Field,
    /// Its first bit.
    pub src_ofs: u16,
    /// The destination field.
    pub dst: Field,
    /// Its first bit.
    pub dst_ofs: u16,
    /// How many bits.
    pub nbits: u16,
}

/// `NXAST_OUTPUT_REG`/`NXAST_OUTPUT_REG2`: output to the port number in `nbits` bits of
/// `src` at `ofs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NxOutputReg {
    /// The field holding the port number.
    pub src: Field,
    /// Its first bit.
    pub ofs: u16,
    /// How many bits (1..=32).
    pub nbits: u16,
    /// Bytes to the controller, when the port is `OFPP_CONTROLLER`.
    pub max_len: u16,
    /// Encoded as `NXAST_OUTPUT_REG2`.
    pub v2: bool,
}

/// The 32-bit port number of OpenFlow 1.0's 16-bit one (reserved ports move to the top).
pub fn port_from_16(p: u16) -> u32 {
    if p >= 0xff00 {
        0xffff_0000 | u32::from(p)
    } else {
        u32::from(p)
    }
}

/// The 16-bit port number of a 32-bit one (reserved ports from the top).
pub fn port_to_16(p: u32) -> u16 {
    if p >= 0xffff_ff00 {
        (p & 0xffff) as u16
    } else {
        p as u16
    }
}

/// Whether bits `ofs..ofs + nbits` are within `f`.
fn within(f: Field, ofs: u16, nbits: u16) -> bool {
    nbits >= 1 && u32::from(ofs) + u32::from(nbits) <= u32::from(f.info().len) * 8
}

/// `NX_CT_F_*` flags of `NXAST_CT`.
pub mod ct_flags {
    pub const COMMIT: u16 = 1;
    pub const FORCE: u16 = 2;
}

/// `NX_NAT_F_*` flags of `NXAST_NAT`.
pub mod nat_flags {
    pub const SRC: u16 = 1;
    pub const DST: u16 = 2;
    pub const PERSISTENT: u16 = 4;
    pub const PROTO_HASH: u16 = 8;
    pub const PROTO_RANDOM: u16 = 16;
    /// Every defined flag.
    pub const MASK: u16 = 31;
}

/// `NX_NAT_RANGE_*` presence bits of `NXAST_NAT`.
pub mod nat_range {
    pub const IPV4_MIN: u16 = 1;
    pub const IPV4_MAX: u16 = 2;
    pub const IPV6_MIN: u16 = 4;
    pub const IPV6_MAX: u16 = 8;
    pub const PROTO_MIN: u16 = 16;
    pub const PROTO_MAX: u16 = 32;
}

/// `NXAC2PT_*`: the properties of `NXAST_CONTROLLER2`.
pub mod ac2pt {
    pub const MAX_LEN: u16 = 0;
    pub const CONTROLLER_ID: u16 = 1;
    pub const REASON: u16 = 2;
    pub const USERDATA: u16 = 3;
    pub const PAUSE: u16 = 4;
    pub const METER_ID: u16 = 5;
}

/// `NX_CTLR_NO_METER`: a controller action without a meter.
pub const NX_CTLR_NO_METER: u32 = u32::MAX;

/// `OFPR_ACTION`, the reason a controller action has unless it says otherwise.
const OFPR_ACTION: u8 = 1;

/// `NXAST_CONTROLLER` (16 bytes: `max_len`, `controller_id`, `reason`, a zero byte) or
/// `NXAST_CONTROLLER2` (an 8-byte header with 6 zero bytes, then `NXAC2PT_*` properties,
/// each `type`, `len`, value, padded to 8), as OVS's `ofpact_controller`. Encoded as OVS's
/// `encode_CONTROLLER`: `NXAST_CONTROLLER2` when there is userdata, `pause` or a meter (or
/// it came as one, `v2`), each property only when it differs from its default (`max_len`
/// 65535, id 0, reason `OFPR_ACTION`, no meter); else `NXAST_CONTROLLER`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NxController {
    /// Bytes of the packet to send (65535: all).
    pub max_len: u16,
    /// The controller connection id that receives it (0: all).
    pub controller_id: u16,
    /// `OFPR_*`.
    pub reason: u8,
    /// `NXPINT_USERDATA` of the packet-in.
    pub userdata: Vec<u8>,
    /// Pause the pipeline (a continuation in the packet-in).
    pub pause: bool,
    /// A meter for the packet-ins ([`NX_CTLR_NO_METER`]: none).
    pub meter_id: u32,
    /// Decoded from (or to be written as) `NXAST_CONTROLLER2` even without its extras.
    pub v2: bool,
}

impl Default for NxController {
    fn default() -> Self {
        NxController {
            max_len: u16::MAX,
            controller_id: 0,
            reason: OFPR_ACTION,
            userdata: Vec::new(),
            pause: false,
            meter_id: NX_CTLR_NO_METER,
            v2: false,
        }
    }
}

impl NxController {
    /// Whether OVS writes it as `NXAST_CONTROLLER2`.
    pub fn needs_v2(&self) -> bool {
        self.v2 || !self.userdata.is_empty() || self.pause || self.meter_id != NX_CTLR_NO_METER
    }
}

/// Writes property `t` with `value`, padded to 8 (OVS's `ofpprop_put`).
fn put_prop(out: &mut Vec<u8>, t: u16, value: &[u8]) {
    let start = out.len();
    out.put_u16(t);
    out.put_u16((4 + value.len()) as u16);
    out.extend_from_slice(value);
    out.pad8_from(start);
}

pub(crate) fn encode_controller(c: &NxController, out: &mut Vec<u8>) {
    if !c.needs_v2() {
        put_header(out, nxast::CONTROLLER);
        out.put_u16(c.max_len);
        out.put_u16(c.controller_id);
        out.put_u8(c.reason);
        out.put_u8(0);
        return;
    }
    put_header(out, nxast::CONTROLLER2);
    out.put_zeros(6);
    if c.max_len != u16::MAX {
        // A 16-bit property is written in 4 bytes (ofpprop_put_u16).
        put_prop(
            out,
            ac2pt::MAX_LEN,
            &[(c.max_len >> 8) as u8, c.max_len as u8, 0, 0],
        );
    }
    if c.controller_id != 0 {
        let id = c.controller_id;
        put_prop(
            out,
            ac2pt::CONTROLLER_ID,
            &[(id >> 8) as u8, id as u8, 0, 0],
        );
    }
    if c.reason != OFPR_ACTION {
        put_prop(out, ac2pt::REASON, &[c.reason]);
    }
    if !c.userdata.is_empty() {
        put_prop(out, ac2pt::USERDATA, &c.userdata);
    }
    if c.pause {
        put_prop(out, ac2pt::PAUSE, &[]);
    }
    if c.meter_id != NX_CTLR_NO_METER {
        put_prop(out, ac2pt::METER_ID, &c.meter_id.to_be_bytes());
    }
}

/// `NXAST_CONTROLLER2`'s properties (after the 6 zero bytes), as OVS's
/// `decode_NXAST_RAW_CONTROLLER2`: a property shorter than its header or whose padded
/// length runs past the action is `OFPBPC_BAD_LEN`, as is a value too short for its type
/// (or a meter id not of 4 bytes); an unknown type is `OFPBPC_BAD_TYPE`.
fn decode_controller2(mut props: &[u8]) -> Result<NxController, OfError> {
    use crate::error::{bpc, et};
    let bad_len = |why| OfError::new(et::BAD_PROPERTY, bpc::BAD_LEN, why);
    let mut c = NxController {
        v2: true,
        ..NxController::default()
    };
    while !props.is_empty() {
        if props.len() < 4 {
            return Err(bad_len("NXAST_CONTROLLER2 property header cut"));
        }
        let t = u16::from_be_bytes([props[0], props[1]]);
        let len = usize::from(u16::from_be_bytes([props[2], props[3]]));
        if len < 4 || crate::wire::pad8(len) > props.len() {
            return Err(bad_len("NXAST_CONTROLLER2 property length past the action"));
        }
        let v = &props[4..len];
        let be16 = |v: &[u8]| {
            v.get(..2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or(bad_len("NXAST_CONTROLLER2 16-bit property too short"))
        };
        match t {
            ac2pt::MAX_LEN => c.max_len = be16(v)?,
            ac2pt::CONTROLLER_ID => c.controller_id = be16(v)?,
            ac2pt::REASON => {
                c.reason = *v
                    .first()
                    .ok_or(bad_len("NXAST_CONTROLLER2 reason without a value"))?
            }
            ac2pt::USERDATA => c.userdata = v.to_vec(),
            ac2pt::PAUSE => c.pause = true,
            ac2pt::METER_ID => {
                let b: [u8; 4] = v
                    .try_into()
                    .map_err(|_| bad_len("NXAST_CONTROLLER2 meter id not 4 bytes"))?;
                c.meter_id = u32::from_be_bytes(b);
            }
            _ => {
                return Err(OfError::new(
                    et::BAD_PROPERTY,
                    bpc::BAD_TYPE,
                    "unknown NXAST_CONTROLLER2 property",
                ))
            }
        }
        props = &props[crate::wire::pad8(len)..];
    }
    Ok(c)
}

/// `recirc_table` of a `ct` that does not recirculate.
pub const NX_CT_RECIRC_NONE: u8 = 0xff;

/// Where a `ct` action's zone comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtZoneSrc {
    /// `zone=N`.
    Imm(u16),
    /// `zone=FIELD[ofs..ofs+15]`: 16 bits of a field (OVS allows exactly 16).
    Field {
        /// The source field.
        field: Field,
        /// The first bit.
        ofs: u16,
    },
}

/// `NXAST_CT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NxCt {
    /// `NX_CT_F_*`.
    pub flags: u16,
    /// The zone.
    pub zone: CtZoneSrc,
    /// The table to recirculate to ([`NX_CT_RECIRC_NONE`]: none).
    pub recirc_table: u8,
    /// The application-layer gateway's port (0: none; 21 ftp, 69 tftp).
    pub alg: u16,
    /// Nested actions: [`Action::Nat`], and writes of `ct_mark`/`ct_label`
    /// ([`Action::SetField`], [`Action::RegLoad`]).
    pub actions: Vec<Action>,
}

/// `NXAST_NAT`. Address options are one family; a max without its min never occurs in a
/// decoded value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NxNat {
    /// `NX_NAT_F_*`.
    pub flags: u16,
    /// The range's first address.
    pub addr_min: Option<IpAddr>,
    /// The range's last address (absent: the first).
    pub addr_max: Option<IpAddr>,
    /// The first port.
    pub port_min: Option<u16>,
    /// The last port (absent: the first).
    pub port_max: Option<u16>,
}

const fn bad(code: u16, reason: &'static str) -> OfError {
    OfError::action(code, reason)
}

/// The NXM header of `field` without a mask (what `zone_src` and `dst` carry).
pub fn nxm_header(field: Field) -> u32 {
    let i = field.info();
    (u32::from(i.class) << 16) | (u32::from(i.code) << 9) | u32::from(i.len)
}

/// The field an unmasked NXM header names (`OFPBAC_BAD_SET_TYPE` when unknown).
pub(crate) fn field_of_header(header: u32) -> Result<Field, OfError> {
    let unknown = bad(bac::BAD_SET_TYPE, "NXM header of an unknown field");
    let f =
        Field::from_header((header >> 16) as u16, ((header >> 9) & 0x7f) as u8).ok_or(unknown)?;
    let len = (header & 0xff) as u8;
    // A tunnel option field is variable length in OVS, which writes it in an action's
    // header with the whole option space's length (124): any length up to that names it.
    let variable = matches!(
        f,
        Field::TunMetadata0 | Field::TunMetadata1 | Field::TunMetadata2 | Field::TunMetadata3
    );
    if header & 0x100 != 0 || (len != f.info().len && !(variable && (1..=124).contains(&len))) {
        return Err(unknown);
    }
    Ok(f)
}

/// `ofs << 6 | (n_bits - 1)`.
fn ofs_nbits(ofs: u16, nbits: u16) -> u16 {
    (ofs << 6) | (nbits.saturating_sub(1) & 0x3f)
}

/// Whether `f` is one a `ct` action's `exec` may write.
pub fn is_ct_writable(f: Field) -> bool {
    matches!(f, Field::CtMark | Field::CtLabel)
}

/// Writes the experimenter header of a Nicira action (length patched by the caller).
fn put_header(out: &mut Vec<u8>, subtype: u16) {
    out.put_u16(at::EXPERIMENTER);
    out.put_u16(0);
    out.put_u32(NX_VENDOR_ID);
    out.put_u16(subtype);
}

pub(crate) fn encode_ct(ct: &NxCt, out: &mut Vec<u8>) {
    put_header(out, nxast::CT);
    out.put_u16(ct.flags);
    match ct.zone {
        CtZoneSrc::Imm(z) => {
            out.put_u32(0);
            out.put_u16(z);
        }
        CtZoneSrc::Field { field, ofs } => {
            out.put_u32(nxm_header(field));
            out.put_u16(ofs_nbits(ofs, 16));
        }
    }
    out.put_u8(ct.recirc_table);
    out.put_zeros(3);
    out.put_u16(ct.alg);
    encode_actions(&ct.actions, out);
}

pub(crate) fn encode_ct_clear(out: &mut Vec<u8>) {
    put_header(out, nxast::CT_CLEAR);
    out.put_zeros(6);
}

/// `NXAST_CONJUNCTION` (16 bytes): `clause` (0-based), `n_clauses`, `id`.
pub(crate) fn encode_conjunction(id: u32, clause: u8, n_clauses: u8, out: &mut Vec<u8>) {
    put_header(out, nxast::CONJUNCTION);
    out.push(clause);
    out.push(n_clauses);
    out.put_u32(id);
}

pub(crate) fn encode_nat(nat: &NxNat, out: &mut Vec<u8>) {
    put_header(out, nxast::NAT);
    out.put_zeros(2);
    out.put_u16(nat.flags);
    let mut present = 0;
    let mut opts = Vec::new();
    for (a, v4, v6) in [
        (nat.addr_min, nat_range::IPV4_MIN, nat_range::IPV6_MIN),
        (nat.addr_max, nat_range::IPV4_MAX, nat_range::IPV6_MAX),
    ] {
        match a {
            Some(IpAddr::V4(a)) => {
                present |= v4;
                opts.extend_from_slice(&a.octets());
            }
            Some(IpAddr::V6(a)) => {
                present |= v6;
                opts.extend_from_slice(&a.octets());
            }
            None => {}
        }
    }
    for (p, bit) in [
        (nat.port_min, nat_range::PROTO_MIN),
        (nat.port_max, nat_range::PROTO_MAX),
    ] {
        if let Some(p) = p {
            present |= bit;
            opts.put_u16(p);
        }
    }
    out.put_u16(present);
    out.extend_from_slice(&opts);
}

pub(crate) fn encode_resubmit(port: u32, table: Option<u8>, out: &mut Vec<u8>) {
    match table {
        None => {
            put_header(out, nxast::RESUBMIT);
            out.put_u16(port_to_16(port));
            out.put_zeros(4);
        }
        Some(t) => {
            put_header(out, nxast::RESUBMIT_TABLE);
            out.put_u16(port_to_16(port));
            out.put_u8(t);
            out.put_zeros(3);
        }
    }
}

pub(crate) fn encode_reg_move(m: &NxMove, out: &mut Vec<u8>) {
    put_header(out, nxast::REG_MOVE);
    out.put_u16(m.nbits);
    out.put_u16(m.src_ofs);
    out.put_u16(m.dst_ofs);
    out.put_u32(nxm_header(m.src));
    out.put_u32(nxm_header(m.dst));
}

pub(crate) fn encode_output_reg(o: &NxOutputReg, out: &mut Vec<u8>) {
    if o.v2 {
        put_header(out, nxast::OUTPUT_REG2);
        out.put_u16(ofs_nbits(o.ofs, o.nbits));
        out.put_u16(o.max_len);
        out.put_u32(nxm_header(o.src));
        out.put_zeros(4);
    } else {
        put_header(out, nxast::OUTPUT_REG);
        out.put_u16(ofs_nbits(o.ofs, o.nbits));
        out.put_u32(nxm_header(o.src));
        out.put_u16(o.max_len);
        out.put_zeros(6);
    }
}

pub(crate) fn encode_stack(subtype: u16, st: &NxStack, out: &mut Vec<u8>) {
    put_header(out, subtype);
    out.put_u16(st.ofs);
    out.put_u32(nxm_header(st.field));
    out.put_u16(st.nbits);
    out.put_zeros(6);
}

pub(crate) fn encode_check_pkt_larger(c: &NxCheckPktLarger, out: &mut Vec<u8>) {
    put_header(out, nxast::CHECK_PKT_LARGER);
    out.put_u16(c.pkt_len);
    out.put_u16(c.ofs);
    out.put_u32(nxm_header(c.dst));
    out.put_zeros(6);
}

pub(crate) fn encode_clone(list: &[Action], out: &mut Vec<u8>) {
    put_header(out, nxast::CLONE);
    out.put_zeros(6);
    encode_actions(list, out);
}

pub(crate) fn encode_reg_load2(oxm: &Oxm, out: &mut Vec<u8>) {
    put_header(out, nxast::REG_LOAD2);
    oxm.encode(out);
}

pub(crate) fn encode_reg_load(field: Field, ofs: u16, nbits: u16, value: u64, out: &mut Vec<u8>) {
    put_header(out, nxast::REG_LOAD);
    out.put_u16(ofs_nbits(ofs, nbits));
    out.put_u32(nxm_header(field));
    out.put_u64(value);
}

/// Decodes a Nicira action's body: `body` follows the 4-byte action header (its length
/// checked to be a multiple of 8 and within its list) and starts with the vendor id.
pub(crate) fn decode_experimenter(body: &[u8], ctx: ActionContext) -> Result<Action, OfError> {
    let len = body.len() + 4;
    let mut r = Reader::new(body, bad(bac::BAD_LEN, "experimenter action too short"));
    let vendor = r.u32()?;
    if vendor != NX_VENDOR_ID {
        return Err(bad(
            bac::BAD_EXPERIMENTER,
            "experimenter action of an unknown experimenter",
        ));
    }
    let subtype = r.u16()?;
    let a = match subtype {
        nxast::CT => {
            if len < 24 {
                return Err(bad(bac::BAD_LEN, "NXAST_CT shorter than 24 bytes"));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "ct nested inside ct"));
            }
            let flags = r.u16()?;
            let zone_src = r.u32()?;
            let zone_v = r.u16()?;
            let zone = if zone_src == 0 {
                CtZoneSrc::Imm(zone_v)
            } else {
                let field = field_of_header(zone_src)?;
                let (ofs, nbits) = (zone_v >> 6, (zone_v & 0x3f) + 1);
                if u32::from(ofs) + u32::from(nbits) > u32::from(field.info().len) * 8 {
                    return Err(bad(bac::BAD_SET_LEN, "ct zone bits beyond their field"));
                }
                if nbits != 16 {
                    return Err(bad(bac::BAD_SET_LEN, "ct zone from a field not of 16 bits"));
                }
                CtZoneSrc::Field { field, ofs }
            };
            let recirc_table = r.u8()?;
            r.skip(3)?;
            let alg = r.u16()?;
            let nested = if ctx.is_15() {
                ActionContext::Ct15
            } else {
                ActionContext::Ct
            };
            let actions = decode_actions_in(r.rest(), nested)?;
            if flags & ct_flags::COMMIT == 0
                && actions.iter().any(|a| {
                    !matches!(a, Action::Nat(n) if n.flags == 0 && n.addr_min.is_none()
                        && n.port_min.is_none())
                })
            {
                return Err(bad(
                    bac::BAD_ARGUMENT,
                    "ct without commit nests more than a bare nat",
                ));
            }
            Action::Ct(Box::new(NxCt {
                flags,
                zone,
                recirc_table,
                alg,
                actions,
            }))
        }
        nxast::CONJUNCTION => {
            if len != 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_CONJUNCTION not 16 bytes"));
            }
            let clause = r.u8()?;
            let n_clauses = r.u8()?;
            let id = r.u32()?;
            // OVS's decode_NXAST_RAW_CONJUNCTION: NXBAC_BAD_CONJUNCTION.
            if !(2..=64).contains(&n_clauses) || clause >= n_clauses {
                return Err(crate::error::OfError::new(
                    crate::error::et::EXPERIMENTER,
                    crate::error::nxbac::BAD_CONJUNCTION,
                    "conjunction(id,k/n) needs 1 <= k <= n and 2 <= n <= 64",
                ));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "conjunction nested inside ct"));
            }
            Action::Conjunction {
                id,
                clause,
                n_clauses,
            }
        }
        nxast::CT_CLEAR => {
            if len != 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_CT_CLEAR not 16 bytes"));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "ct_clear nested inside ct"));
            }
            Action::CtClear
        }
        nxast::NAT => {
            if len < 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_NAT shorter than 16 bytes"));
            }
            r.skip(2)?;
            let nat = decode_nat(&mut r)?;
            if !ctx.is_ct() {
                return Err(bad(bac::BAD_SET_ARGUMENT, "nat outside a ct action"));
            }
            Action::Nat(nat)
        }
        nxast::REG_LOAD => {
            if len != 24 {
                return Err(bad(bac::BAD_LEN, "NXAST_REG_LOAD not 24 bytes"));
            }
            let on = r.u16()?;
            let field = field_of_header(r.u32()?)?;
            let value = r.u64()?;
            let (ofs, nbits) = (on >> 6, (on & 0x3f) + 1);
            if u32::from(ofs) + u32::from(nbits) > u32::from(field.info().len) * 8 {
                return Err(bad(bac::BAD_SET_LEN, "reg_load bits beyond their field"));
            }
            if nbits < 64 && value >> nbits != 0 {
                return Err(bad(
                    bac::BAD_SET_ARGUMENT,
                    "reg_load value wider than its bits",
                ));
            }
            match (ctx.is_ct(), is_ct_writable(field)) {
                (true, false) => {
                    return Err(bad(
                        bac::BAD_SET_TYPE,
                        "reg_load inside ct of a field other than ct_mark or ct_label",
                    ))
                }
                (false, true) => {
                    return Err(bad(
                        bac::BAD_SET_ARGUMENT,
                        "write of a ct field outside a ct action",
                    ))
                }
                (false, false) if !field.info().settable => {
                    return Err(bad(bac::BAD_SET_TYPE, "reg_load of a read-only field"))
                }
                _ => {}
            }
            Action::RegLoad {
                field,
                ofs,
                nbits,
                value,
            }
        }
        nxast::CONTROLLER => {
            if len != 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_CONTROLLER not 16 bytes"));
            }
            let max_len = r.u16()?;
            let controller_id = r.u16()?;
            let reason = r.u8()?;
            Action::Controller(Box::new(NxController {
                max_len,
                controller_id,
                reason,
                ..NxController::default()
            }))
        }
        nxast::CONTROLLER2 => {
            let rest = r.rest();
            if rest.len() < 6 {
                return Err(bad(bac::BAD_LEN, "NXAST_CONTROLLER2 shorter than 16 bytes"));
            }
            if rest[..6].iter().any(|&b| b != 0) {
                // OVS: NXBRC_MUST_BE_ZERO.
                return Err(bad(bac::BAD_ARGUMENT, "NXAST_CONTROLLER2 padding not zero"));
            }
            Action::Controller(Box::new(decode_controller2(&rest[6..])?))
        }
        nxast::RESUBMIT | nxast::RESUBMIT_TABLE => {
            if len != 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_RESUBMIT not 16 bytes"));
            }
            let port = port_from_16(r.u16()?);
            let table = if subtype == nxast::RESUBMIT_TABLE {
                let t = r.u8()?;
                if r.rest().iter().any(|&b| b != 0) {
                    return Err(bad(bac::BAD_ARGUMENT, "resubmit padding not zero"));
                }
                Some(t)
            } else {
                None
            };
            Action::Resubmit { port, table }
        }
        nxast::REG_MOVE => {
            if len != 24 {
                return Err(bad(bac::BAD_LEN, "NXAST_REG_MOVE not 24 bytes"));
            }
            let nbits = r.u16()?;
            let src_ofs = r.u16()?;
            let dst_ofs = r.u16()?;
            let src = field_of_header(r.u32()?)?;
            let dst = field_of_header(r.u32()?)?;
            let m = NxMove {
                src,
                src_ofs,
                dst,
                dst_ofs,
                nbits,
            };
            if ctx.is_ct() {
                Action::RegMove(check_ct_move(m)?)
            } else {
                Action::RegMove(check_move(m)?)
            }
        }
        nxast::STACK_PUSH | nxast::STACK_POP => {
            if len != 24 {
                return Err(bad(bac::BAD_LEN, "NXAST_STACK_PUSH/POP not 24 bytes"));
            }
            let ofs = r.u16()?;
            let field = field_of_header(r.u32()?)?;
            let nbits = r.u16()?;
            if r.rest().iter().any(|&b| b != 0) {
                return Err(bad(bac::BAD_ARGUMENT, "stack action padding not zero"));
            }
            if !within(field, ofs, nbits) {
                return Err(bad(bac::BAD_SET_LEN, "stack bits beyond their field"));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "push/pop nested inside ct"));
            }
            let st = NxStack { field, ofs, nbits };
            if subtype == nxast::STACK_PUSH {
                Action::StackPush(st)
            } else {
                if is_ct_writable(field) {
                    return Err(bad(bac::BAD_SET_ARGUMENT, "pop into a ct field"));
                }
                if !field.info().settable {
                    return Err(bad(bac::BAD_SET_TYPE, "pop into a read-only field"));
                }
                Action::StackPop(st)
            }
        }
        // Nicira's dec_ttl, and dec_ttl(ids) with no controller id (what ovn-controller
        // sends for OVN's dec_ttl, printed `dec_ttl()`): OpenFlow's DEC_NW_TTL (a TTL that
        // expires drops the packet; no controller asked for a packet-in). A list of ids
        // (packet-ins with reason invalid_ttl) is not supported.
        nxast::DEC_TTL | nxast::DEC_TTL_CNT_IDS => {
            if len < 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_DEC_TTL shorter than 16 bytes"));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "dec_ttl nested inside ct"));
            }
            if subtype == nxast::DEC_TTL_CNT_IDS {
                let n = r.u16()?;
                if r.array::<4>()?.iter().any(|&b| b != 0) {
                    return Err(bad(bac::BAD_ARGUMENT, "dec_ttl padding not zero"));
                }
                if 16 + crate::wire::pad8(2 * usize::from(n)) != len {
                    return Err(bad(
                        bac::BAD_LEN,
                        "dec_ttl(ids) length does not fit its ids",
                    ));
                }
                if n != 0 {
                    return Err(bad(
                        bac::BAD_EXP_TYPE,
                        "dec_ttl with controller ids is not supported",
                    ));
                }
            } else if len != 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_DEC_TTL not 16 bytes"));
            }
            Action::DecNwTtl
        }
        nxast::CLONE => {
            if len < 16 {
                return Err(bad(bac::BAD_LEN, "NXAST_CLONE shorter than 16 bytes"));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "clone nested inside ct"));
            }
            if r.array::<6>()?.iter().any(|&b| b != 0) {
                return Err(bad(bac::BAD_ARGUMENT, "clone padding not zero"));
            }
            Action::Clone(decode_actions_in(r.rest(), ctx)?)
        }
        nxast::CHECK_PKT_LARGER => {
            if len != 24 {
                return Err(bad(bac::BAD_LEN, "NXAST_CHECK_PKT_LARGER not 24 bytes"));
            }
            let pkt_len = r.u16()?;
            let ofs = r.u16()?;
            let dst = field_of_header(r.u32()?)?;
            if r.rest().iter().any(|&b| b != 0) {
                return Err(bad(bac::BAD_ARGUMENT, "check_pkt_larger padding not zero"));
            }
            if !within(dst, ofs, 1) {
                return Err(bad(
                    bac::BAD_SET_LEN,
                    "check_pkt_larger bit beyond its field",
                ));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "check_pkt_larger nested inside ct"));
            }
            if is_ct_writable(dst) {
                return Err(bad(
                    bac::BAD_SET_ARGUMENT,
                    "check_pkt_larger into a ct field",
                ));
            }
            if !dst.info().settable {
                return Err(bad(
                    bac::BAD_SET_TYPE,
                    "check_pkt_larger into a read-only field",
                ));
            }
            Action::CheckPktLarger(NxCheckPktLarger { pkt_len, dst, ofs })
        }
        nxast::OUTPUT_REG | nxast::OUTPUT_REG2 => {
            if len != 24 {
                return Err(bad(bac::BAD_LEN, "NXAST_OUTPUT_REG not 24 bytes"));
            }
            let on = r.u16()?;
            let v2 = subtype == nxast::OUTPUT_REG2;
            let (src, max_len) = if v2 {
                let m = r.u16()?;
                (field_of_header(r.u32()?)?, m)
            } else {
                let f = field_of_header(r.u32()?)?;
                (f, r.u16()?)
            };
            if r.rest().iter().any(|&b| b != 0) {
                return Err(bad(bac::BAD_ARGUMENT, "output_reg padding not zero"));
            }
            let (ofs, nbits) = (on >> 6, (on & 0x3f) + 1);
            if !within(src, ofs, nbits) {
                return Err(bad(bac::BAD_SET_LEN, "output_reg bits beyond their field"));
            }
            if ctx.is_ct() {
                return Err(bad(bac::BAD_ARGUMENT, "output_reg nested inside ct"));
            }
            Action::OutputReg(NxOutputReg {
                src,
                ofs,
                nbits,
                max_len,
                v2,
            })
        }
        nxast::REG_LOAD2 => {
            let body = r.rest();
            if body.len() < 4 {
                return Err(bad(bac::BAD_LEN, "NXAST_REG_LOAD2 without an OXM"));
            }
            let (oxm, used) = Oxm::decode(body).map_err(|e| match e.code {
                crate::error::bmc::BAD_FIELD => {
                    bad(bac::BAD_SET_TYPE, "reg_load2 of an unknown field")
                }
                crate::error::bmc::BAD_LEN => {
                    bad(bac::BAD_SET_LEN, "reg_load2 OXM length wrong for its field")
                }
                _ => bad(bac::BAD_SET_ARGUMENT, "reg_load2 value out of range"),
            })?;
            // The TLV and its padding fill the action (10 bytes of header before it).
            if crate::wire::pad8(10 + used) != len || body[used..].iter().any(|&b| b != 0) {
                return Err(bad(
                    bac::BAD_LEN,
                    "NXAST_REG_LOAD2 length does not fit its OXM",
                ));
            }
            if ctx.is_ct() || is_ct_writable(oxm.field) {
                return Err(bad(
                    bac::BAD_SET_ARGUMENT,
                    "reg_load2 inside ct or of a ct field",
                ));
            }
            if !oxm.field.info().settable {
                return Err(bad(bac::BAD_SET_TYPE, "reg_load2 of a read-only field"));
            }
            Action::RegLoad2(oxm)
        }
        crate::learn::NXAST_LEARN | crate::learn::NXAST_LEARN2 => {
            if ctx == ActionContext::Ct {
                return Err(bad(bac::BAD_ARGUMENT, "learn nested inside ct"));
            }
            crate::learn::decode(&mut r, subtype, len)?
        }
        _ => {
            return Err(bad(
                bac::BAD_EXP_TYPE,
                "Nicira action of a subtype not supported",
            ))
        }
    };
    if ctx.is_ct() && matches!(a, Action::Resubmit { .. } | Action::Controller(_)) {
        return Err(bad(
            bac::BAD_ARGUMENT,
            "ct nests a resubmit or a controller",
        ));
    }
    Ok(a)
}

/// A move inside `ct`: it writes ct_mark or ct_label only (OVN's
/// `move:NXM_NX_XXREG0[0..31]->NXM_NX_CT_LABEL[96..127]`), its ranges within their fields.
pub(crate) fn check_ct_move(m: NxMove) -> Result<NxMove, OfError> {
    if !within(m.src, m.src_ofs, m.nbits) || !within(m.dst, m.dst_ofs, m.nbits) {
        return Err(bad(bac::BAD_SET_LEN, "move bits beyond their field"));
    }
    if !is_ct_writable(m.dst) {
        return Err(bad(
            bac::BAD_ARGUMENT,
            "ct nests a move into other than ct_mark/ct_label",
        ));
    }
    Ok(m)
}

/// A move's ranges within their fields (`OFPBAC_BAD_SET_LEN`), its destination writable
/// (`OFPBAC_BAD_SET_TYPE`; ct fields only by `ct`'s own writes: `OFPBAC_BAD_SET_ARGUMENT`).
pub(crate) fn check_move(m: NxMove) -> Result<NxMove, OfError> {
    if !within(m.src, m.src_ofs, m.nbits) || !within(m.dst, m.dst_ofs, m.nbits) {
        return Err(bad(bac::BAD_SET_LEN, "move bits beyond their field"));
    }
    if is_ct_writable(m.dst) {
        return Err(bad(bac::BAD_SET_ARGUMENT, "move into a ct field"));
    }
    if !m.dst.info().settable {
        return Err(bad(bac::BAD_SET_TYPE, "move into a read-only field"));
    }
    Ok(m)
}

fn decode_nat(r: &mut Reader<'_>) -> Result<NxNat, OfError> {
    let arg = |reason| bad(bac::BAD_ARGUMENT, reason);
    let flags = r.u16()?;
    let present = r.u16()?;
    if flags & !nat_flags::MASK != 0
        || (flags & nat_flags::SRC != 0 && flags & nat_flags::DST != 0)
        || (flags & nat_flags::PROTO_HASH != 0 && flags & nat_flags::PROTO_RANDOM != 0)
    {
        return Err(arg("nat flags unknown or contradictory"));
    }
    let short = || arg("nat range option runs past the action");
    let v4 = |r: &mut Reader<'_>| {
        r.array::<4>()
            .map(|b| IpAddr::V4(Ipv4Addr::from(b)))
            .map_err(|_| short())
    };
    let v6 = |r: &mut Reader<'_>| {
        r.array::<16>()
            .map(|b| IpAddr::V6(Ipv6Addr::from(b)))
            .map_err(|_| short())
    };
    let mut nat = NxNat {
        flags,
        ..NxNat::default()
    };
    use nat_range::*;
    if present & IPV4_MIN != 0 {
        if present & (IPV6_MIN | IPV6_MAX) != 0 {
            return Err(arg("nat range of both families"));
        }
        let min = v4(r)?;
        if min == IpAddr::V4(Ipv4Addr::UNSPECIFIED) {
            return Err(arg("nat range from 0.0.0.0"));
        }
        nat.addr_min = Some(min);
        if present & IPV4_MAX != 0 {
            let max = v4(r)?;
            if max < min {
                return Err(arg("nat address range ends before it starts"));
            }
            nat.addr_max = Some(max);
        }
    } else if present & IPV4_MAX != 0 {
        return Err(arg("nat range with a max address and no min"));
    } else if present & IPV6_MIN != 0 {
        let min = v6(r)?;
        if min == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
            return Err(arg("nat range from ::"));
        }
        nat.addr_min = Some(min);
        if present & IPV6_MAX != 0 {
            let max = v6(r)?;
            if max < min {
                return Err(arg("nat address range ends before it starts"));
            }
            nat.addr_max = Some(max);
        }
    } else if present & IPV6_MAX != 0 {
        return Err(arg("nat range with a max address and no min"));
    }
    if present & PROTO_MIN != 0 {
        if nat.addr_min.is_none() {
            return Err(arg("nat port range without addresses"));
        }
        let min = r.u16().map_err(|_| short())?;
        if min == 0 {
            return Err(arg("nat port range from 0"));
        }
        nat.port_min = Some(min);
        if present & PROTO_MAX != 0 {
            let max = r.u16().map_err(|_| short())?;
            if max < min {
                return Err(arg("nat port range ends before it starts"));
            }
            nat.port_max = Some(max);
        }
    } else if present & PROTO_MAX != 0 {
        return Err(arg("nat range with a max port and no min"));
    }
    Ok(nat)
}
