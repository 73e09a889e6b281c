//! Nicira experimenter messages (`OFPT_EXPERIMENTER`, vendor `0x00002320`) that
//! ovn-controller sends on its connections, and the replies to them.
//!
//! Layout after the OpenFlow header: `vendor` (u32), `subtype` (u32), then the subtype's
//! body (OVS's `include/openflow/nicira-ext.h`):
//!
//! | subtype | message | body |
//! |---|---|---|
//! | 16 | `NXT_SET_PACKET_IN_FORMAT` | `format` u32 (0 standard, 1 `NXT_PACKET_IN`, 2 `NXT_PACKET_IN2`) |
//! | 20 | `NXT_SET_CONTROLLER_ID` | 6 pad, `controller_id` u16 |
//! | 24 | `NXT_TLV_TABLE_MOD` | `command` u16 (add 0, delete 1, clear 2), 6 pad, `nx_tlv_map`s |
//! | 25 | `NXT_TLV_TABLE_REQUEST` | none |
//! | 26 | `NXT_TLV_TABLE_REPLY` | `max_option_space` u32, `max_fields` u16, 10 pad, `nx_tlv_map`s |
//! | 28 | `NXT_RESUME` | properties (kept as bytes: the daemon refuses it) |
//! | 29 | `NXT_CT_FLUSH_ZONE` | 6 pad, `zone_id` u16 |
//! | 30 | `NXT_PACKET_IN2` | properties, see [`PacketIn2`] |
//! | 32 | `NXT_CT_FLUSH` | kept as bytes (the daemon refuses it) |
//!
//! `nx_tlv_map` (8 bytes): `option_class` u16, `option_type` u8, `option_len` u8, `index`
//! u16, 2 pad. A length that is not a multiple of 4 or above 124 is
//! `NXTTMFC_BAD_OPT_LEN`, an index of 64 or more `NXTTMFC_BAD_FIELD_IDX`, a command above
//! clear `NXTTMFC_BAD_COMMAND` (OVS's `ofputil_decode_tlv_table_mod`). Another vendor is
//! `OFPBRC_BAD_EXPERIMENTER`, another Nicira subtype (`NXT_SET_FLOW_FORMAT` included: OVS
//! defines it for OpenFlow 1.0 only) `OFPBRC_BAD_EXP_TYPE`, a body of the wrong length
//! `OFPBRC_BAD_LEN`.

use crate::error::{brc, et, OfError};
use crate::nicira::NX_VENDOR_ID;
use crate::oxm::Oxm;
use crate::wire::{pad8, Put, Reader};

/// `NXT_*` subtypes.
pub mod nxt {
    pub const SET_FLOW_FORMAT: u32 = 12;
    pub const SET_PACKET_IN_FORMAT: u32 = 16;
    pub const SET_CONTROLLER_ID: u32 = 20;
    pub const TLV_TABLE_MOD: u32 = 24;
    pub const TLV_TABLE_REQUEST: u32 = 25;
    pub const TLV_TABLE_REPLY: u32 = 26;
    pub const RESUME: u32 = 28;
    pub const CT_FLUSH_ZONE: u32 = 29;
    pub const PACKET_IN2: u32 = 30;
    pub const CT_FLUSH: u32 = 32;
}

/// `NXPIF_*`: packet-in formats.
pub mod pif {
    pub const STANDARD: u32 = 0;
    pub const NXT_PACKET_IN: u32 = 1;
    pub const NXT_PACKET_IN2: u32 = 2;
}

/// `NXTTMC_*`: TLV table commands.
pub mod ttmc {
    pub const ADD: u16 = 0;
    pub const DELETE: u16 = 1;
    pub const CLEAR: u16 = 2;
}

/// Nicira's experimenter error codes (`OFPET_EXPERIMENTER`, experimenter `0x00002320`, as
/// OpenFlow 1.2+ carries them).
pub mod nxerr {
    pub const TTMFC_BAD_COMMAND: u16 = 16;
    pub const TTMFC_BAD_OPT_LEN: u16 = 17;
    pub const TTMFC_BAD_FIELD_IDX: u16 = 18;
    pub const TTMFC_TABLE_FULL: u16 = 19;
    pub const TTMFC_ALREADY_MAPPED: u16 = 20;
    pub const TTMFC_DUP_ENTRY: u16 = 21;
    pub const R_NOT_SUPPORTED: u16 = 34;
    /// The continuation is not this switch's (another process, bridge, or garbage).
    pub const R_STALE: u16 = 35;
    pub const TTMFC_INVALID_TLV_DEL: u16 = 38;
}

/// The tunnel metadata fields a switch offers (`TUN_METADATA_NUM_OPTS`).
pub const TLV_MAX_FIELDS: u16 = 64;
/// The option bytes all mapped TLVs may take together (`TUN_METADATA_TOT_OPT_SIZE`).
pub const TLV_MAX_OPTION_SPACE: u32 = 256;
/// The longest one option's data may be (`TLV_MAX_OPT_SIZE`).
pub const TLV_MAX_OPT_LEN: u8 = 124;

/// `nx_tlv_map`: Geneve option (class, type, data length) ↔ `tun_metadataN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TlvMap {
    /// Geneve option class.
    pub option_class: u16,
    /// Geneve option type.
    pub option_type: u8,
    /// Option data length in bytes (a multiple of 4, at most 124).
    pub option_len: u8,
    /// `N` of `tun_metadataN` (below 64).
    pub index: u16,
}

/// `NXT_TLV_TABLE_REPLY`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlvTableReply {
    /// Bytes of option data the switch can match on, all options together.
    pub max_option_space: u32,
    /// `tun_metadataN` fields.
    pub max_fields: u16,
    /// The mappings in place.
    pub mappings: Vec<TlvMap>,
}

/// `NXT_PACKET_IN2`: a packet-in as a list of properties (`NXPINT_*`). Written as OVS's
/// `ofputil_put_packet_in` writes it: `PACKET`, `FULL_LEN` only when the packet was cut,
/// (`BUFFER_ID` only when buffered, which OVS never does), `TABLE_ID`, `COOKIE` unless it is
/// all ones, `REASON`, `METADATA` (OXM TLVs without an `ofp_match` header), `USERDATA` when
/// there is some, `CONTINUATION` (the switch's own properties, nested) for
/// `controller(pause)`. `NXT_RESUME` carries the same properties.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PacketIn2 {
    /// The frame (possibly cut).
    pub packet: Vec<u8>,
    /// The frame's full length when `packet` is cut.
    pub full_len: Option<u32>,
    /// A buffer id, if buffered.
    pub buffer_id: Option<u32>,
    /// The table that sent it.
    pub table_id: u8,
    /// The cookie of the rule that sent it (all ones: none, no property).
    pub cookie: u64,
    /// `OFPR_*`.
    pub reason: u8,
    /// Pipeline fields (in_port, tunnel id, ...).
    pub metadata: Vec<Oxm>,
    /// `controller(userdata=...)`'s bytes.
    pub userdata: Option<Vec<u8>>,
    /// A continuation: the nested properties, opaque to the controller.
    pub continuation: Option<Vec<u8>>,
}

/// `NXPINT_*`: `NXT_PACKET_IN2` property types.
pub mod pint {
    pub const PACKET: u16 = 0;
    pub const FULL_LEN: u16 = 1;
    pub const BUFFER_ID: u16 = 2;
    pub const TABLE_ID: u16 = 3;
    pub const COOKIE: u16 = 4;
    pub const REASON: u16 = 5;
    pub const METADATA: u16 = 6;
    pub const USERDATA: u16 = 7;
    pub const CONTINUATION: u16 = 8;
}

/// A Nicira message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NxMessage {
    /// `NXT_SET_PACKET_IN_FORMAT` (`NXPIF_*`).
    SetPacketInFormat(u32),
    /// `NXT_SET_CONTROLLER_ID`.
    SetControllerId(u16),
    /// `NXT_TLV_TABLE_MOD`.
    TlvTableMod {
        /// `NXTTMC_*`.
        command: u16,
        /// The mappings to add or delete (none for clear).
        mappings: Vec<TlvMap>,
    },
    /// `NXT_TLV_TABLE_REQUEST`.
    TlvTableRequest,
    /// `NXT_TLV_TABLE_REPLY`.
    TlvTableReply(TlvTableReply),
    /// `NXT_CT_FLUSH_ZONE`: flush one conntrack zone.
    CtFlushZone(u16),
    /// `NXT_PACKET_IN2`.
    PacketIn2(PacketIn2),
    /// `NXT_RESUME` (body kept: [`PacketIn2::decode`] reads it where it is resumed).
    Resume(Vec<u8>),
    /// `NXT_CT_FLUSH` (body kept: flushing by tuple is not supported).
    CtFlush(Vec<u8>),
}

impl NxMessage {
    /// The subtype.
    pub fn subtype(&self) -> u32 {
        match self {
            NxMessage::SetPacketInFormat(_) => nxt::SET_PACKET_IN_FORMAT,
            NxMessage::SetControllerId(_) => nxt::SET_CONTROLLER_ID,
            NxMessage::TlvTableMod { .. } => nxt::TLV_TABLE_MOD,
            NxMessage::TlvTableRequest => nxt::TLV_TABLE_REQUEST,
            NxMessage::TlvTableReply(_) => nxt::TLV_TABLE_REPLY,
            NxMessage::CtFlushZone(_) => nxt::CT_FLUSH_ZONE,
            NxMessage::PacketIn2(_) => nxt::PACKET_IN2,
            NxMessage::Resume(_) => nxt::RESUME,
            NxMessage::CtFlush(_) => nxt::CT_FLUSH,
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(NX_VENDOR_ID);
        out.put_u32(self.subtype());
        match self {
            NxMessage::SetPacketInFormat(f) => out.put_u32(*f),
            NxMessage::SetControllerId(id) => {
                out.put_zeros(6);
                out.put_u16(*id);
            }
            NxMessage::TlvTableMod { command, mappings } => {
                out.put_u16(*command);
                out.put_zeros(6);
                encode_maps(mappings, out);
            }
            NxMessage::TlvTableRequest => {}
            NxMessage::TlvTableReply(r) => {
                out.put_u32(r.max_option_space);
                out.put_u16(r.max_fields);
                out.put_zeros(10);
                encode_maps(&r.mappings, out);
            }
            NxMessage::CtFlushZone(z) => {
                out.put_zeros(6);
                out.put_u16(*z);
            }
            NxMessage::PacketIn2(p) => p.encode(out),
            NxMessage::Resume(b) | NxMessage::CtFlush(b) => out.extend_from_slice(b),
        }
    }

    /// Decodes an experimenter message's body (after the OpenFlow header).
    pub(crate) fn decode(body: &[u8]) -> Result<NxMessage, OfError> {
        let mut r = Reader::new(body, BAD_LEN);
        let vendor = r.u32()?;
        if vendor != NX_VENDOR_ID {
            return Err(OfError::request(
                brc::BAD_EXPERIMENTER,
                "experimenter message of a vendor other than Nicira",
            ));
        }
        let subtype = r.u32()?;
        let rest = r.rest();
        let mut r = Reader::new(rest, BAD_LEN);
        let exact = |n: usize| {
            if rest.len() == n {
                Ok(())
            } else {
                Err(BAD_LEN)
            }
        };
        Ok(match subtype {
            nxt::SET_PACKET_IN_FORMAT => {
                exact(4)?;
                NxMessage::SetPacketInFormat(r.u32()?)
            }
            nxt::SET_CONTROLLER_ID => {
                exact(8)?;
                r.skip(6)?;
                NxMessage::SetControllerId(r.u16()?)
            }
            nxt::TLV_TABLE_MOD => {
                let command = r.u16()?;
                r.skip(6)?;
                if command > ttmc::CLEAR {
                    return Err(nx_error(
                        nxerr::TTMFC_BAD_COMMAND,
                        "TLV table mod command out of range",
                    ));
                }
                NxMessage::TlvTableMod {
                    command,
                    mappings: decode_maps(r.rest(), TLV_MAX_FIELDS)?,
                }
            }
            nxt::TLV_TABLE_REQUEST => {
                exact(0)?;
                NxMessage::TlvTableRequest
            }
            nxt::TLV_TABLE_REPLY => {
                let max_option_space = r.u32()?;
                let max_fields = r.u16()?;
                r.skip(10)?;
                NxMessage::TlvTableReply(TlvTableReply {
                    max_option_space,
                    max_fields,
                    mappings: decode_maps(r.rest(), max_fields)?,
                })
            }
            nxt::CT_FLUSH_ZONE => {
                exact(8)?;
                r.skip(6)?;
                NxMessage::CtFlushZone(r.u16()?)
            }
            nxt::PACKET_IN2 => NxMessage::PacketIn2(PacketIn2::decode(rest)?),
            nxt::RESUME => NxMessage::Resume(rest.to_vec()),
            nxt::CT_FLUSH => NxMessage::CtFlush(rest.to_vec()),
            _ => {
                return Err(OfError::request(
                    brc::BAD_EXP_TYPE,
                    "Nicira message subtype not supported",
                ))
            }
        })
    }
}

const BAD_LEN: OfError = OfError::request(brc::BAD_LEN, "Nicira message length wrong");

/// A Nicira experimenter error (`OFPET_EXPERIMENTER`; the ERROR's data starts with
/// Nicira's id, see [`OfError::reply`]).
pub fn nx_error(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::EXPERIMENTER, code, reason)
}

fn encode_maps(maps: &[TlvMap], out: &mut Vec<u8>) {
    for m in maps {
        out.put_u16(m.option_class);
        out.put_u8(m.option_type);
        out.put_u8(m.option_len);
        out.put_u16(m.index);
        out.put_zeros(2);
    }
}

fn decode_maps(buf: &[u8], max_fields: u16) -> Result<Vec<TlvMap>, OfError> {
    if buf.len() % 8 != 0 {
        return Err(BAD_LEN);
    }
    let mut r = Reader::new(buf, BAD_LEN);
    let mut out = Vec::new();
    while !r.is_empty() {
        let m = TlvMap {
            option_class: r.u16()?,
            option_type: r.u8()?,
            option_len: r.u8()?,
            index: r.u16()?,
        };
        r.skip(2)?;
        if m.option_len % 4 != 0 || m.option_len > TLV_MAX_OPT_LEN {
            return Err(nx_error(
                nxerr::TTMFC_BAD_OPT_LEN,
                "TLV option length not a multiple of 4 up to 124",
            ));
        }
        if m.index >= max_fields {
            return Err(nx_error(
                nxerr::TTMFC_BAD_FIELD_IDX,
                "TLV field index beyond the tunnel metadata fields",
            ));
        }
        out.push(m);
    }
    Ok(out)
}

/// Starts a property (`type`, length patched by [`prop_end`]).
fn prop_start(out: &mut Vec<u8>, t: u16) -> usize {
    let at = out.len();
    out.put_u16(t);
    out.put_u16(0);
    at
}

/// Ends a property started at `at`: its length (unpadded), then padding to 8.
fn prop_end(out: &mut Vec<u8>, at: usize) {
    let len = crate::wire::len16(out.len() - at, "property");
    out.patch_u16(at + 2, len);
    out.pad8_from(at);
}

impl PacketIn2 {
    fn encode(&self, out: &mut Vec<u8>) {
        let p = prop_start(out, pint::PACKET);
        out.extend_from_slice(&self.packet);
        prop_end(out, p);
        if let Some(l) = self.full_len {
            let p = prop_start(out, pint::FULL_LEN);
            out.put_u32(l);
            prop_end(out, p);
        }
        if let Some(b) = self.buffer_id {
            let p = prop_start(out, pint::BUFFER_ID);
            out.put_u32(b);
            prop_end(out, p);
        }
        let p = prop_start(out, pint::TABLE_ID);
        out.put_u8(self.table_id);
        prop_end(out, p);
        if self.cookie != u64::MAX {
            // A 64-bit property value is aligned: 4 pad bytes first (ofpprop_put_be64).
            let p = prop_start(out, pint::COOKIE);
            out.put_zeros(4);
            out.put_u64(self.cookie);
            prop_end(out, p);
        }
        let p = prop_start(out, pint::REASON);
        out.put_u8(self.reason);
        prop_end(out, p);
        let p = prop_start(out, pint::METADATA);
        for o in &self.metadata {
            o.encode(out);
        }
        prop_end(out, p);
        if let Some(u) = &self.userdata {
            let p = prop_start(out, pint::USERDATA);
            out.extend_from_slice(u);
            prop_end(out, p);
        }
        if let Some(c) = &self.continuation {
            let p = prop_start(out, pint::CONTINUATION);
            out.put_zeros(4);
            out.extend_from_slice(c);
            prop_end(out, p);
        }
    }

    /// Decodes `NXT_PACKET_IN2`'s (or `NXT_RESUME`'s: the same properties) body.
    pub fn decode(mut buf: &[u8]) -> Result<PacketIn2, OfError> {
        let bad_prop = |code, reason| OfError::new(et::BAD_PROPERTY, code, reason);
        let mut p = PacketIn2 {
            packet: Vec::new(),
            full_len: None,
            buffer_id: None,
            table_id: 0,
            cookie: u64::MAX,
            reason: 0,
            metadata: Vec::new(),
            userdata: None,
            continuation: None,
        };
        let mut seen_packet = false;
        while !buf.is_empty() {
            let mut r = Reader::new(buf, BAD_LEN);
            let t = r.u16()?;
            let len = usize::from(r.u16()?);
            if len < 4 || len > buf.len() {
                return Err(bad_prop(
                    crate::error::bpc::BAD_LEN,
                    "property length past its message",
                ));
            }
            let v = &buf[4..len];
            let mut vr = Reader::new(v, bad_prop(crate::error::bpc::BAD_LEN, "short property"));
            match t {
                pint::PACKET => {
                    p.packet = v.to_vec();
                    seen_packet = true;
                }
                pint::FULL_LEN => p.full_len = Some(vr.u32()?),
                pint::BUFFER_ID => p.buffer_id = Some(vr.u32()?),
                pint::TABLE_ID => p.table_id = vr.u8()?,
                pint::COOKIE => {
                    vr.skip(4)?;
                    p.cookie = vr.u64()?;
                }
                pint::REASON => p.reason = vr.u8()?,
                pint::METADATA => {
                    let mut rest = v;
                    while !rest.is_empty() {
                        let (o, used) = Oxm::decode(rest)?;
                        p.metadata.push(o);
                        rest = &rest[used..];
                    }
                }
                pint::USERDATA => p.userdata = Some(v.to_vec()),
                pint::CONTINUATION => {
                    vr.skip(4)?;
                    p.continuation = Some(vr.rest().to_vec());
                }
                _ => {
                    return Err(bad_prop(
                        crate::error::bpc::BAD_TYPE,
                        "unknown NXT_PACKET_IN2 property",
                    ))
                }
            }
            buf = &buf[pad8(len).min(buf.len())..];
        }
        if !seen_packet {
            return Err(OfError::request(
                brc::BAD_LEN,
                "NXT_PACKET_IN2 without a packet",
            ));
        }
        Ok(p)
    }
}
