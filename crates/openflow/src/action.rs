//! Actions (`ofp_action_*`) and instructions (`ofp_instruction_*`) of OpenFlow 1.3.
//!
//! Each is a TLV whose length is a multiple of 8 and at least 8; a length that breaks this,
//! runs past its list or differs from the type's fixed size is `OFPBAC_BAD_LEN` /
//! `OFPBIC_BAD_LEN`. Of the experimenter actions, Nicira's connection-tracking ones (`ct`,
//! `nat` inside it, `ct_clear`) and register ones (`reg_load`, `reg_load2`, `reg_move`,
//! `resubmit`, `output_reg`) are decoded (see [`crate::nicira`]), and `learn` (see
//! [`crate::learn`]); Nicira's others (`note`, …) are `OFPBAC_BAD_EXP_TYPE`, another experimenter's `OFPBAC_BAD_EXPERIMENTER`, and experimenter
//! instructions `OFPBIC_BAD_EXPERIMENTER`. Checks that need the flow's context (an output to
//! `OFPP_TABLE` outside PACKET_OUT, a goto to an earlier table) are made by the message
//! that carries the list.
//!
//! OpenFlow 1.5's action forms that OVN sends (a masked `OFPAT_SET_FIELD`, `OFPAT_COPY_FIELD`)
//! are decoded by [`decode_actions_15`] only (in a 1.3 list they stay `OFPBAC_BAD_SET_ARGUMENT`
//! and `OFPBAC_BAD_TYPE`).

use crate::error::{bac, bic, bmc, OfError};
use crate::nicira::{self, NxController, NxCt, NxMove, NxNat, NxOutputReg, NxStack};
use crate::oxm::{Field, Oxm};
use crate::port;
use crate::wire::{pad8, Put, Reader};

/// `OFPG_MAX`: the highest ordinary group number.
pub const OFPG_MAX: u32 = 0xffff_ff00;
/// `OFPG_ALL`: every group (GROUP_MOD delete, stats requests).
pub const OFPG_ALL: u32 = 0xffff_fffc;
/// `OFPG_ANY`: no group (a flow-mod's or flow-stats request's wildcard).
pub const OFPG_ANY: u32 = 0xffff_ffff;
/// `OFPCML_NO_BUFFER`: send the whole packet to the controller.
pub const OFPCML_NO_BUFFER: u16 = 0xffff;

/// An OpenFlow 1.3 action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// `OFPAT_OUTPUT`; `max_len` matters for `OFPP_CONTROLLER` only.
    Output {
        /// Output port (a port number or a reserved `OFPP_*`).
        port: u32,
        /// Bytes of the packet sent to the controller.
        max_len: u16,
    },
    /// `OFPAT_COPY_TTL_OUT`.
    CopyTtlOut,
    /// `OFPAT_COPY_TTL_IN`.
    CopyTtlIn,
    /// `OFPAT_SET_MPLS_TTL`.
    SetMplsTtl(u8),
    /// `OFPAT_DEC_MPLS_TTL`.
    DecMplsTtl,
    /// `OFPAT_PUSH_VLAN` with its ethertype (0x8100 or 0x88a8).
    PushVlan(u16),
    /// `OFPAT_POP_VLAN`.
    PopVlan,
    /// `OFPAT_PUSH_MPLS` with its ethertype (0x8847 or 0x8848).
    PushMpls(u16),
    /// `OFPAT_POP_MPLS` with the ethertype of what follows.
    PopMpls(u16),
    /// `OFPAT_SET_QUEUE`.
    SetQueue(u32),
    /// `OFPAT_GROUP`.
    Group(u32),
    /// `OFPAT_SET_NW_TTL`.
    SetNwTtl(u8),
    /// `OFPAT_DEC_NW_TTL`.
    DecNwTtl,
    /// `OFPAT_SET_FIELD`: one unmasked OXM.
    SetField(Oxm),
    /// `OFPAT_PUSH_PBB` with its ethertype (0x88e7).
    PushPbb(u16),
    /// `OFPAT_POP_PBB`.
    PopPbb,
    /// Nicira `NXAST_CT`: `ct(...)`.
    Ct(Box<NxCt>),
    /// Nicira `NXAST_CT_CLEAR`.
    CtClear,
    /// Nicira `NXAST_NAT` (only nested in [`Action::Ct`]).
    Nat(NxNat),
    /// Nicira `NXAST_REG_LOAD` of `n_bits` bits at `ofs` of `ct_mark` or `ct_label` (only
    /// nested in [`Action::Ct`]; ovs-ofctl's form of a masked `set_field`).
    RegLoad {
        /// The field written.
        field: Field,
        /// The first bit.
        ofs: u16,
        /// How many bits (1..=64).
        nbits: u16,
        /// The bits' value.
        value: u64,
    },
    /// Nicira `NXAST_REG_LOAD2`: a field written under the OXM's mask (none: all of it).
    RegLoad2(Oxm),
    /// Nicira `NXAST_REG_MOVE` (`move:SRC[..]->DST[..]`).
    RegMove(NxMove),
    /// OpenFlow 1.5's `OFPAT_COPY_FIELD` (ovs-ofctl's `move` in 1.5).
    CopyField(NxMove),
    /// Nicira `NXAST_RESUBMIT` (`table: None`) or `NXAST_RESUBMIT_TABLE` (`Some(0xff)`: the
    /// current table); `port` as a 32-bit port number (`OFPP_IN_PORT`: the packet's own).
    Resubmit {
        /// The input port the lookup sees.
        port: u32,
        /// The table looked in.
        table: Option<u8>,
    },
    /// Nicira `NXAST_OUTPUT_REG`/`NXAST_OUTPUT_REG2` (`output:NXM_NX_REG15[]`).
    OutputReg(NxOutputReg),
    /// Nicira `NXAST_CONTROLLER` / `NXAST_CONTROLLER2` (`controller(userdata=…,pause)`).
    Controller(Box<NxController>),
    /// Nicira `NXAST_LEARN`/`NXAST_LEARN2` (`learn(...)`, see [`crate::learn`]).
    Learn(Box<crate::learn::NxLearn>),
    /// Nicira `NXAST_STACK_PUSH` (`push:FIELD[a..b]`).
    StackPush(NxStack),
    /// Nicira `NXAST_STACK_POP` (`pop:FIELD[a..b]`).
    StackPop(NxStack),
    /// Nicira `NXAST_CLONE` (`clone(...)`): the nested actions on a copy of the packet.
    Clone(Vec<Action>),
    /// Nicira `NXAST_CHECK_PKT_LARGER` (`check_pkt_larger(LEN)->DST[bit]`).
    CheckPktLarger(nicira::NxCheckPktLarger),
    /// Nicira `NXAST_CONJUNCTION` (`conjunction(id,k/n)` with `clause = k - 1`).
    Conjunction {
        /// The conjunction's id (what `conj_id` matches).
        id: u32,
        /// This rule's clause, 0-based.
        clause: u8,
        /// The conjunction's number of clauses (2..=64).
        n_clauses: u8,
    },
}

/// Where an action list sits: a `ct` action's nested list takes only `nat` and writes of
/// `ct_mark`/`ct_label`, which no other list takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActionContext {
    /// An instruction's list (apply, write), a bucket's, a PACKET_OUT's.
    Top,
    /// `NXAST_CT`'s nested actions.
    Ct,
    /// [`ActionContext::Top`] in an OpenFlow 1.5 message: `OFPAT_SET_FIELD` may carry a
    /// mask, `OFPAT_COPY_FIELD` exists.
    Top15,
    /// [`ActionContext::Ct`] in an OpenFlow 1.5 message (ovn-controller's
    /// `exec(set_field:0/0x1->ct_mark)` is a masked SET_FIELD there, its `move` a
    /// COPY_FIELD).
    Ct15,
}

impl ActionContext {
    /// Inside a `ct` action's list.
    pub(crate) fn is_ct(self) -> bool {
        matches!(self, ActionContext::Ct | ActionContext::Ct15)
    }

    /// In an OpenFlow 1.5 message.
    pub(crate) fn is_15(self) -> bool {
        matches!(self, ActionContext::Top15 | ActionContext::Ct15)
    }
}

/// `OFPAT_*` numbers.
pub mod at {
    pub const OUTPUT: u16 = 0;
    pub const COPY_TTL_OUT: u16 = 11;
    pub const COPY_TTL_IN: u16 = 12;
    pub const SET_MPLS_TTL: u16 = 15;
    pub const DEC_MPLS_TTL: u16 = 16;
    pub const PUSH_VLAN: u16 = 17;
    pub const POP_VLAN: u16 = 18;
    pub const PUSH_MPLS: u16 = 19;
    pub const POP_MPLS: u16 = 20;
    pub const SET_QUEUE: u16 = 21;
    pub const GROUP: u16 = 22;
    pub const SET_NW_TTL: u16 = 23;
    pub const DEC_NW_TTL: u16 = 24;
    pub const SET_FIELD: u16 = 25;
    pub const PUSH_PBB: u16 = 26;
    pub const POP_PBB: u16 = 27;
    /// OpenFlow 1.5.
    pub const COPY_FIELD: u16 = 28;
    pub const EXPERIMENTER: u16 = 0xffff;
}

const fn bad(code: u16, reason: &'static str) -> OfError {
    OfError::action(code, reason)
}

impl Action {
    /// The `OFPAT_*` number.
    pub fn type_(&self) -> u16 {
        match self {
            Action::Output { .. } => at::OUTPUT,
            Action::CopyTtlOut => at::COPY_TTL_OUT,
            Action::CopyTtlIn => at::COPY_TTL_IN,
            Action::SetMplsTtl(_) => at::SET_MPLS_TTL,
            Action::DecMplsTtl => at::DEC_MPLS_TTL,
            Action::PushVlan(_) => at::PUSH_VLAN,
            Action::PopVlan => at::POP_VLAN,
            Action::PushMpls(_) => at::PUSH_MPLS,
            Action::PopMpls(_) => at::POP_MPLS,
            Action::SetQueue(_) => at::SET_QUEUE,
            Action::Group(_) => at::GROUP,
            Action::SetNwTtl(_) => at::SET_NW_TTL,
            Action::DecNwTtl => at::DEC_NW_TTL,
            Action::SetField(_) => at::SET_FIELD,
            Action::PushPbb(_) => at::PUSH_PBB,
            Action::PopPbb => at::POP_PBB,
            Action::CopyField(_) => at::COPY_FIELD,
            Action::Ct(_)
            | Action::CtClear
            | Action::Nat(_)
            | Action::RegLoad { .. }
            | Action::RegLoad2(_)
            | Action::RegMove(_)
            | Action::Resubmit { .. }
            | Action::OutputReg(_)
            | Action::Controller(_)
            | Action::Learn(_)
            | Action::StackPush(_)
            | Action::StackPop(_)
            | Action::Clone(_)
            | Action::CheckPktLarger(_)
            | Action::Conjunction { .. } => at::EXPERIMENTER,
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        match self {
            Action::Ct(ct) => nicira::encode_ct(ct, out),
            Action::CtClear => nicira::encode_ct_clear(out),
            Action::Nat(nat) => nicira::encode_nat(nat, out),
            Action::RegLoad {
                field,
                ofs,
                nbits,
                value,
            } => nicira::encode_reg_load(*field, *ofs, *nbits, *value, out),
            Action::RegLoad2(o) => nicira::encode_reg_load2(o, out),
            Action::RegMove(m) => nicira::encode_reg_move(m, out),
            Action::Resubmit { port, table } => nicira::encode_resubmit(*port, *table, out),
            Action::OutputReg(o) => nicira::encode_output_reg(o, out),
            Action::Controller(c) => nicira::encode_controller(c, out),
            Action::Learn(l) => crate::learn::encode(l, out),
            Action::StackPush(st) => nicira::encode_stack(nicira::nxast::STACK_PUSH, st, out),
            Action::StackPop(st) => nicira::encode_stack(nicira::nxast::STACK_POP, st, out),
            Action::Clone(list) => nicira::encode_clone(list, out),
            Action::CheckPktLarger(c) => nicira::encode_check_pkt_larger(c, out),
            Action::Conjunction {
                id,
                clause,
                n_clauses,
            } => nicira::encode_conjunction(*id, *clause, *n_clauses, out),
            _ => {
                out.put_u16(self.type_());
                out.put_u16(0);
            }
        }
        match self {
            Action::Ct(_)
            | Action::CtClear
            | Action::Nat(_)
            | Action::RegLoad { .. }
            | Action::RegLoad2(_)
            | Action::RegMove(_)
            | Action::Resubmit { .. }
            | Action::OutputReg(_)
            | Action::Controller(_)
            | Action::Learn(_)
            | Action::StackPush(_)
            | Action::StackPop(_)
            | Action::Clone(_)
            | Action::CheckPktLarger(_)
            | Action::Conjunction { .. } => out.pad8_from(start),
            Action::CopyField(m) => {
                out.put_u16(m.nbits);
                out.put_u16(m.src_ofs);
                out.put_u16(m.dst_ofs);
                out.put_zeros(2);
                out.put_u32(nicira::nxm_header(m.src));
                out.put_u32(nicira::nxm_header(m.dst));
                out.pad8_from(start);
            }
            Action::Output { port, max_len } => {
                out.put_u32(*port);
                out.put_u16(*max_len);
                out.put_zeros(6);
            }
            Action::CopyTtlOut
            | Action::CopyTtlIn
            | Action::DecMplsTtl
            | Action::PopVlan
            | Action::DecNwTtl
            | Action::PopPbb => out.put_zeros(4),
            Action::SetMplsTtl(t) | Action::SetNwTtl(t) => {
                out.put_u8(*t);
                out.put_zeros(3);
            }
            Action::PushVlan(e) | Action::PushMpls(e) | Action::PopMpls(e) | Action::PushPbb(e) => {
                out.put_u16(*e);
                out.put_zeros(2);
            }
            Action::SetQueue(v) | Action::Group(v) => out.put_u32(*v),
            Action::SetField(oxm) => {
                oxm.encode(out);
                out.pad8_from(start);
            }
        }
        let len = crate::wire::len16(out.len() - start, "action");
        out.patch_u16(start + 2, len);
    }

    /// Decodes one action from the start of `buf` (its length already checked to be a
    /// multiple of 8, at least 8 and within `buf`).
    fn decode_one(type_: u16, body: &[u8], ctx: ActionContext) -> Result<Action, OfError> {
        let len = body.len() + 4;
        let fixed = |n: usize| {
            if len == n {
                Ok(())
            } else {
                Err(bad(bac::BAD_LEN, "action length wrong for its type"))
            }
        };
        let mut r = Reader::new(body, bad(bac::BAD_LEN, "action too short"));
        let a = match type_ {
            at::OUTPUT => {
                fixed(16)?;
                let port = r.u32()?;
                let max_len = r.u16()?;
                if !port::is_valid_output(port) {
                    return Err(bad(bac::BAD_OUT_PORT, "output to an invalid port"));
                }
                Action::Output { port, max_len }
            }
            at::COPY_TTL_OUT => fixed(8).map(|_| Action::CopyTtlOut)?,
            at::COPY_TTL_IN => fixed(8).map(|_| Action::CopyTtlIn)?,
            at::DEC_MPLS_TTL => fixed(8).map(|_| Action::DecMplsTtl)?,
            at::POP_VLAN => fixed(8).map(|_| Action::PopVlan)?,
            at::DEC_NW_TTL => fixed(8).map(|_| Action::DecNwTtl)?,
            at::POP_PBB => fixed(8).map(|_| Action::PopPbb)?,
            at::SET_MPLS_TTL => {
                fixed(8)?;
                Action::SetMplsTtl(r.u8()?)
            }
            at::SET_NW_TTL => {
                fixed(8)?;
                Action::SetNwTtl(r.u8()?)
            }
            at::PUSH_VLAN => {
                fixed(8)?;
                let e = r.u16()?;
                if e != 0x8100 && e != 0x88a8 {
                    return Err(bad(bac::BAD_ARGUMENT, "push_vlan of a non-VLAN ethertype"));
                }
                Action::PushVlan(e)
            }
            at::PUSH_MPLS => {
                fixed(8)?;
                let e = r.u16()?;
                if e != 0x8847 && e != 0x8848 {
                    return Err(bad(bac::BAD_ARGUMENT, "push_mpls of a non-MPLS ethertype"));
                }
                Action::PushMpls(e)
            }
            at::POP_MPLS => {
                fixed(8)?;
                Action::PopMpls(r.u16()?)
            }
            at::PUSH_PBB => {
                fixed(8)?;
                let e = r.u16()?;
                if e != 0x88e7 {
                    return Err(bad(bac::BAD_ARGUMENT, "push_pbb of a non-PBB ethertype"));
                }
                Action::PushPbb(e)
            }
            at::SET_QUEUE => {
                fixed(8)?;
                Action::SetQueue(r.u32()?)
            }
            at::GROUP => {
                fixed(8)?;
                let g = r.u32()?;
                if g > OFPG_MAX {
                    return Err(bad(bac::BAD_OUT_GROUP, "group action to a reserved group"));
                }
                Action::Group(g)
            }
            at::SET_FIELD => Action::SetField(decode_set_field(body, ctx)?),
            at::COPY_FIELD if ctx.is_15() => {
                if len != 24 {
                    return Err(bad(bac::BAD_LEN, "OFPAT_COPY_FIELD not 24 bytes"));
                }
                let nbits = r.u16()?;
                let src_ofs = r.u16()?;
                let dst_ofs = r.u16()?;
                r.skip(2)?;
                let src = nicira::field_of_header(r.u32()?)?;
                let dst = nicira::field_of_header(r.u32()?)?;
                let m = NxMove {
                    src,
                    src_ofs,
                    dst,
                    dst_ofs,
                    nbits,
                };
                Action::CopyField(if ctx.is_ct() {
                    nicira::check_ct_move(m)?
                } else {
                    nicira::check_move(m)?
                })
            }
            at::EXPERIMENTER => return nicira::decode_experimenter(body, ctx),
            _ => return Err(bad(bac::BAD_TYPE, "unknown action type")),
        };
        if ctx.is_ct() && !matches!(a, Action::SetField(_) | Action::CopyField(_)) {
            return Err(bad(
                bac::BAD_ARGUMENT,
                "ct nests an action other than nat or a write of ct_mark/ct_label",
            ));
        }
        Ok(a)
    }
}

fn decode_set_field(body: &[u8], ctx: ActionContext) -> Result<Oxm, OfError> {
    if body.len() < 4 {
        return Err(bad(bac::BAD_SET_LEN, "set_field without an OXM header"));
    }
    let header = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    let oxm_len = 4 + (header & 0xff) as usize;
    if pad8(4 + oxm_len) != body.len() + 4 {
        return Err(bad(
            bac::BAD_SET_LEN,
            "set_field length does not fit its OXM",
        ));
    }
    let (oxm, _) = Oxm::decode(body).map_err(|e| match e.code {
        bmc::BAD_FIELD => bad(bac::BAD_SET_TYPE, "set_field of an unknown field"),
        bmc::BAD_LEN => bad(bac::BAD_SET_LEN, "set_field OXM length wrong for its field"),
        _ => bad(bac::BAD_SET_ARGUMENT, "set_field value out of range"),
    })?;
    if oxm.mask.is_some() && !ctx.is_15() {
        return Err(bad(bac::BAD_SET_ARGUMENT, "set_field with a mask"));
    }
    // ct_mark and ct_label are written by a ct action's nested set_field only (OVS's
    // ofpacts_verify_nested); inside ct, nothing else is written.
    match (ctx, nicira::is_ct_writable(oxm.field)) {
        (ActionContext::Ct | ActionContext::Ct15, true) => return Ok(oxm),
        (ActionContext::Ct | ActionContext::Ct15, false) => {
            return Err(bad(
                bac::BAD_ARGUMENT,
                "ct nests a set_field of other than ct_mark/ct_label",
            ))
        }
        (ActionContext::Top | ActionContext::Top15, true) => {
            return Err(bad(
                bac::BAD_SET_ARGUMENT,
                "set_field of a ct field outside a ct action",
            ))
        }
        (ActionContext::Top | ActionContext::Top15, false) => {}
    }
    if !oxm.field.info().settable {
        return Err(bad(bac::BAD_SET_TYPE, "set_field of a read-only field"));
    }
    Ok(oxm)
}

/// Decodes an action list that fills `buf` exactly.
pub(crate) fn decode_actions(buf: &[u8]) -> Result<Vec<Action>, OfError> {
    decode_actions_in(buf, ActionContext::Top)
}

/// Decodes an action list of an OpenFlow 1.5 message that fills `buf` exactly: as a 1.3
/// list, plus a masked SET_FIELD and COPY_FIELD.
pub fn decode_actions_15(buf: &[u8]) -> Result<Vec<Action>, OfError> {
    decode_actions_in(buf, ActionContext::Top15)
}

/// [`decode_actions`] of a list in `ctx`.
pub(crate) fn decode_actions_in(
    mut buf: &[u8],
    ctx: ActionContext,
) -> Result<Vec<Action>, OfError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let mut r = Reader::new(buf, bad(bac::BAD_LEN, "action header runs past its list"));
        let type_ = r.u16()?;
        let len = usize::from(r.u16()?);
        if len < 8 || len % 8 != 0 || len > buf.len() {
            return Err(bad(
                bac::BAD_LEN,
                "action length not a multiple of 8 within its list",
            ));
        }
        out.push(Action::decode_one(type_, &buf[4..len], ctx)?);
        buf = &buf[len..];
    }
    Ok(out)
}

pub(crate) fn encode_actions(actions: &[Action], out: &mut Vec<u8>) {
    for a in actions {
        a.encode(out);
    }
}

/// `actions` as OpenFlow 1.5 writes them where the switch sends rules back (flow stats,
/// group descriptions): a Nicira `NXAST_REG_LOAD` becomes a `SET_FIELD` (masked unless it
/// writes the whole field) and an `NXAST_REG_MOVE` a `COPY_FIELD`, as OVS encodes them for
/// 1.5, whose action lists have no place for either (`ovs-ofctl -O OpenFlow15 dump-flows`
/// refuses them); so do those nested in `ct`'s and `clone`'s lists.
pub fn to_15(actions: &[Action]) -> Vec<Action> {
    actions
        .iter()
        .map(|a| match a {
            Action::RegLoad {
                field,
                ofs,
                nbits,
                value,
            } => {
                let width = u32::from(field.info().len) * 8;
                let ones = if *nbits >= 128 {
                    u128::MAX
                } else {
                    (1u128 << nbits) - 1
                };
                let mask = ones << ofs;
                let v = u128::from(*value) << ofs;
                let full = if width >= 128 {
                    u128::MAX
                } else {
                    (1u128 << width) - 1
                };
                if mask == full {
                    Action::SetField(Oxm::exact(*field, v))
                } else {
                    Action::SetField(Oxm::masked(*field, v, mask))
                }
            }
            // A move is 1.5's own COPY_FIELD (NXAST_REG_MOVE has no 1.5 form either).
            Action::RegMove(m) => Action::CopyField(*m),
            Action::Ct(ct) => {
                let mut ct = ct.clone();
                ct.actions = to_15(&ct.actions);
                Action::Ct(ct)
            }
            Action::Clone(list) => Action::Clone(to_15(list)),
            other => other.clone(),
        })
        .collect()
}

/// Appends the encoding of an action list (what [`decode_actions_15`] reads back).
pub fn encode_action_list(actions: &[Action], out: &mut Vec<u8>) {
    encode_actions(actions, out);
}

/// The encoded length of an action list.
pub fn actions_len(actions: &[Action]) -> usize {
    let mut v = Vec::new();
    encode_actions(actions, &mut v);
    v.len()
}

/// An OpenFlow 1.3 instruction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Instruction {
    /// `OFPIT_GOTO_TABLE`.
    GotoTable(u8),
    /// `OFPIT_WRITE_METADATA`.
    WriteMetadata {
        /// Bits to write.
        metadata: u64,
        /// Which bits.
        mask: u64,
    },
    /// `OFPIT_WRITE_ACTIONS`: merged into the action set.
    WriteActions(Vec<Action>),
    /// `OFPIT_APPLY_ACTIONS`: run at once.
    ApplyActions(Vec<Action>),
    /// `OFPIT_CLEAR_ACTIONS`.
    ClearActions,
    /// `OFPIT_METER`.
    Meter(u32),
}

/// `OFPIT_*` numbers.
pub mod it {
    pub const GOTO_TABLE: u16 = 1;
    pub const WRITE_METADATA: u16 = 2;
    pub const WRITE_ACTIONS: u16 = 3;
    pub const APPLY_ACTIONS: u16 = 4;
    pub const CLEAR_ACTIONS: u16 = 5;
    pub const METER: u16 = 6;
    pub const EXPERIMENTER: u16 = 0xffff;
}

impl Instruction {
    /// The `OFPIT_*` number.
    pub fn type_(&self) -> u16 {
        match self {
            Instruction::GotoTable(_) => it::GOTO_TABLE,
            Instruction::WriteMetadata { .. } => it::WRITE_METADATA,
            Instruction::WriteActions(_) => it::WRITE_ACTIONS,
            Instruction::ApplyActions(_) => it::APPLY_ACTIONS,
            Instruction::ClearActions => it::CLEAR_ACTIONS,
            Instruction::Meter(_) => it::METER,
        }
    }

    /// The actions it carries (write or apply), if any.
    pub fn actions(&self) -> &[Action] {
        match self {
            Instruction::WriteActions(a) | Instruction::ApplyActions(a) => a,
            _ => &[],
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u16(self.type_());
        out.put_u16(0);
        match self {
            Instruction::GotoTable(t) => {
                out.put_u8(*t);
                out.put_zeros(3);
            }
            Instruction::WriteMetadata { metadata, mask } => {
                out.put_zeros(4);
                out.put_u64(*metadata);
                out.put_u64(*mask);
            }
            Instruction::WriteActions(a) | Instruction::ApplyActions(a) => {
                out.put_zeros(4);
                encode_actions(a, out);
            }
            Instruction::ClearActions => out.put_zeros(4),
            Instruction::Meter(m) => out.put_u32(*m),
        }
        let len = crate::wire::len16(out.len() - start, "instruction");
        out.patch_u16(start + 2, len);
    }
}

const fn ibad(code: u16, reason: &'static str) -> OfError {
    OfError::instruction(code, reason)
}

/// Decodes an instruction list that fills `buf` exactly. An instruction type twice is
/// `OFPBIC_UNSUP_INST` (OpenFlow 1.3 has no `DUP_INST` code).
pub(crate) fn decode_instructions(buf: &[u8]) -> Result<Vec<Instruction>, OfError> {
    decode_instructions_in(buf, ActionContext::Top)
}

/// [`decode_instructions`] of an OpenFlow 1.5 message: its action lists as
/// [`decode_actions_15`] reads them.
pub(crate) fn decode_instructions_15(buf: &[u8]) -> Result<Vec<Instruction>, OfError> {
    decode_instructions_in(buf, ActionContext::Top15)
}

fn decode_instructions_in(mut buf: &[u8], ctx: ActionContext) -> Result<Vec<Instruction>, OfError> {
    let mut out: Vec<Instruction> = Vec::new();
    while !buf.is_empty() {
        let mut r = Reader::new(
            buf,
            ibad(bic::BAD_LEN, "instruction header runs past its list"),
        );
        let type_ = r.u16()?;
        let len = usize::from(r.u16()?);
        if len < 8 || len % 8 != 0 || len > buf.len() {
            return Err(ibad(
                bic::BAD_LEN,
                "instruction length not a multiple of 8 within its list",
            ));
        }
        let fixed = |n: usize| {
            if len == n {
                Ok(())
            } else {
                Err(ibad(bic::BAD_LEN, "instruction length wrong for its type"))
            }
        };
        let mut r = Reader::new(&buf[4..len], ibad(bic::BAD_LEN, "instruction too short"));
        let i = match type_ {
            it::GOTO_TABLE => {
                fixed(8)?;
                let t = r.u8()?;
                if t == 0xff {
                    return Err(ibad(bic::BAD_TABLE_ID, "goto_table to OFPTT_ALL"));
                }
                Instruction::GotoTable(t)
            }
            it::WRITE_METADATA => {
                fixed(24)?;
                r.skip(4)?;
                let metadata = r.u64()?;
                let mask = r.u64()?;
                Instruction::WriteMetadata { metadata, mask }
            }
            it::WRITE_ACTIONS | it::APPLY_ACTIONS => {
                r.skip(4)?;
                let a = decode_actions_in(r.rest(), ctx)?;
                if type_ == it::WRITE_ACTIONS {
                    Instruction::WriteActions(a)
                } else {
                    Instruction::ApplyActions(a)
                }
            }
            it::CLEAR_ACTIONS => {
                fixed(8)?;
                Instruction::ClearActions
            }
            it::METER => {
                fixed(8)?;
                Instruction::Meter(r.u32()?)
            }
            it::EXPERIMENTER => {
                return Err(ibad(
                    bic::BAD_EXPERIMENTER,
                    "experimenter instructions are not supported",
                ))
            }
            _ => return Err(ibad(bic::UNKNOWN_INST, "unknown instruction type")),
        };
        if out.iter().any(|o| o.type_() == i.type_()) {
            return Err(ibad(bic::UNSUP_INST, "an instruction type appears twice"));
        }
        out.push(i);
        buf = &buf[len..];
    }
    Ok(out)
}

pub(crate) fn encode_instructions(insts: &[Instruction], out: &mut Vec<u8>) {
    for i in insts {
        i.encode(out);
    }
}
