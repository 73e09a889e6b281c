//! The messages of OpenFlow 1.3 a switch receives and sends: one [`Message`] enum,
//! [`decode`] and [`encode`].
//!
//! `decode` takes one whole message (as [`crate::Framer`] returns it) and either returns
//! a typed value or the [`OfError`] the switch answers with. Lengths are exact: a fixed
//! size message with extra or missing bytes is `OFPBRC_BAD_LEN`. HELLO, ERROR and ECHO
//! decode whatever the version (they are the same in every version); every other message
//! must be version 0x04 (`OFPBRC_BAD_VERSION`). A type this codec does not handle is
//! `OFPBRC_BAD_TYPE`, an experimenter message `OFPBRC_BAD_EXPERIMENTER`.

use crate::action::{self, Action, Instruction, OFPG_ALL, OFPG_MAX};
use crate::error::{brc, et, fmfc, gmfc, mmfc, pmfc, rrfc, scfc, OfError};
use crate::multipart::{MultipartReply, MultipartRequest};
use crate::oxm::Match;
use crate::port::{self, Port};
use crate::wire::{len16, Put, Reader};
use crate::{HEADER_LEN, VERSION_1_3};

/// `ofp_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Wire version (`0x04` for OpenFlow 1.3).
    pub version: u8,
    /// `OFPT_*`.
    pub type_: u8,
    /// Length of the message, header included.
    pub length: u16,
    /// Transaction id; a reply carries its request's.
    pub xid: u32,
}

impl Header {
    /// Parses the first 8 bytes of `buf` (`None` if shorter).
    pub fn parse(buf: &[u8]) -> Option<Header> {
        let b = buf.get(..HEADER_LEN)?;
        Some(Header {
            version: b[0],
            type_: b[1],
            length: u16::from_be_bytes([b[2], b[3]]),
            xid: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        })
    }
}

/// `OFPT_*` message types.
pub mod ty {
    pub const HELLO: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const ECHO_REQUEST: u8 = 2;
    pub const ECHO_REPLY: u8 = 3;
    pub const EXPERIMENTER: u8 = 4;
    pub const FEATURES_REQUEST: u8 = 5;
    pub const FEATURES_REPLY: u8 = 6;
    pub const GET_CONFIG_REQUEST: u8 = 7;
    pub const GET_CONFIG_REPLY: u8 = 8;
    pub const SET_CONFIG: u8 = 9;
    pub const PACKET_IN: u8 = 10;
    pub const FLOW_REMOVED: u8 = 11;
    pub const PORT_STATUS: u8 = 12;
    pub const PACKET_OUT: u8 = 13;
    pub const FLOW_MOD: u8 = 14;
    pub const GROUP_MOD: u8 = 15;
    pub const PORT_MOD: u8 = 16;
    pub const TABLE_MOD: u8 = 17;
    pub const MULTIPART_REQUEST: u8 = 18;
    pub const MULTIPART_REPLY: u8 = 19;
    pub const BARRIER_REQUEST: u8 = 20;
    pub const BARRIER_REPLY: u8 = 21;
    pub const QUEUE_GET_CONFIG_REQUEST: u8 = 22;
    pub const QUEUE_GET_CONFIG_REPLY: u8 = 23;
    pub const ROLE_REQUEST: u8 = 24;
    pub const ROLE_REPLY: u8 = 25;
    pub const GET_ASYNC_REQUEST: u8 = 26;
    pub const GET_ASYNC_REPLY: u8 = 27;
    pub const SET_ASYNC: u8 = 28;
    pub const METER_MOD: u8 = 29;
}

/// `OFP_NO_BUFFER`: the packet is not buffered (PACKET_IN, PACKET_OUT, FLOW_MOD).
pub const OFP_NO_BUFFER: u32 = 0xffff_ffff;
/// `OFPTT_ALL` / `OFPTT_MAX`: every table (flow deletes and stats).
pub const OFPTT_ALL: u8 = 0xff;
/// `OFPTT_MAX`: the highest table number.
pub const OFPTT_MAX: u8 = 0xfe;

/// `OFPFC_*`: flow-mod commands.
pub mod fc {
    pub const ADD: u8 = 0;
    pub const MODIFY: u8 = 1;
    pub const MODIFY_STRICT: u8 = 2;
    pub const DELETE: u8 = 3;
    pub const DELETE_STRICT: u8 = 4;
}

/// `OFPFF_*`: flow-mod flags.
pub mod ff {
    pub const SEND_FLOW_REM: u16 = 1 << 0;
    pub const CHECK_OVERLAP: u16 = 1 << 1;
    pub const RESET_COUNTS: u16 = 1 << 2;
    pub const NO_PKT_COUNTS: u16 = 1 << 3;
    pub const NO_BYT_COUNTS: u16 = 1 << 4;
}

/// `OFPGC_*` group-mod commands and `OFPGT_*` group types.
pub mod group {
    pub const ADD: u16 = 0;
    pub const MODIFY: u16 = 1;
    pub const DELETE: u16 = 2;
    pub const TYPE_ALL: u8 = 0;
    pub const TYPE_SELECT: u8 = 1;
    pub const TYPE_INDIRECT: u8 = 2;
    pub const TYPE_FF: u8 = 3;
}

/// `OFPMC_*` meter-mod commands, `OFPMF_*` flags, `OFPMBT_*` band types.
pub mod meter {
    pub const ADD: u16 = 0;
    pub const MODIFY: u16 = 1;
    pub const DELETE: u16 = 2;
    pub const KBPS: u16 = 1 << 0;
    pub const PKTPS: u16 = 1 << 1;
    pub const BURST: u16 = 1 << 2;
    pub const STATS: u16 = 1 << 3;
    pub const BAND_DROP: u16 = 1;
    pub const BAND_DSCP_REMARK: u16 = 2;
    /// `OFPM_MAX`: the highest ordinary meter number.
    pub const MAX: u32 = 0xffff_0000;
    /// `OFPM_ALL`: every meter (delete, stats).
    pub const ALL: u32 = 0xffff_ffff;
}

/// `OFPCR_ROLE_*`.
pub mod role {
    pub const NOCHANGE: u32 = 0;
    pub const EQUAL: u32 = 1;
    pub const MASTER: u32 = 2;
    pub const SLAVE: u32 = 3;
}

/// `OFPT_ERROR`'s body. For `OFPET_EXPERIMENTER` errors `code` is the experimenter's
/// code and `data` begins with the experimenter id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ErrorMsg {
    /// `OFPET_*`.
    pub type_: u16,
    /// The code within the type.
    pub code: u16,
    /// Usually the first 64 bytes of the offending request.
    pub data: Vec<u8>,
}

/// `OFPT_FEATURES_REPLY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SwitchFeatures {
    /// Datapath id (low 48 bits: a MAC address by convention).
    pub datapath_id: u64,
    /// Packets the switch can buffer.
    pub n_buffers: u32,
    /// Tables.
    pub n_tables: u8,
    /// Auxiliary connection id (0 for the main connection).
    pub auxiliary_id: u8,
    /// `OFPC_*` bits.
    pub capabilities: u32,
}

/// `OFPC_*`: switch capability bits.
pub mod capabilities {
    pub const FLOW_STATS: u32 = 1 << 0;
    pub const TABLE_STATS: u32 = 1 << 1;
    pub const PORT_STATS: u32 = 1 << 2;
    pub const GROUP_STATS: u32 = 1 << 3;
    pub const IP_REASM: u32 = 1 << 5;
    pub const QUEUE_STATS: u32 = 1 << 6;
    pub const PORT_BLOCKED: u32 = 1 << 8;
}

/// `OFPT_GET_CONFIG_REPLY` / `OFPT_SET_CONFIG`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SwitchConfig {
    /// `OFPC_FRAG_*` (0 normal, 1 drop, 2 reassemble).
    pub flags: u16,
    /// Bytes of a table-miss packet sent to the controller.
    pub miss_send_len: u16,
}

/// `OFPT_PACKET_IN`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PacketIn {
    /// Buffer id, or [`OFP_NO_BUFFER`].
    pub buffer_id: u32,
    /// Full length of the frame.
    pub total_len: u16,
    /// `OFPR_*` (0 no match, 1 action, 2 invalid TTL).
    pub reason: u8,
    /// The table it was looked up in.
    pub table_id: u8,
    /// The cookie of the flow that sent it.
    pub cookie: u64,
    /// Pipeline fields (in_port at least).
    pub match_: Match,
    /// The frame (or its first `max_len`/`miss_send_len` bytes).
    pub data: Vec<u8>,
}

/// `OFPT_FLOW_REMOVED`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlowRemoved {
    /// Cookie.
    pub cookie: u64,
    /// Priority.
    pub priority: u16,
    /// `OFPRR_*` (0 idle, 1 hard, 2 delete, 3 group delete).
    pub reason: u8,
    /// Table.
    pub table_id: u8,
    /// Seconds alive.
    pub duration_sec: u32,
    /// Nanoseconds beyond `duration_sec`.
    pub duration_nsec: u32,
    /// Idle timeout.
    pub idle_timeout: u16,
    /// Hard timeout.
    pub hard_timeout: u16,
    /// Packets.
    pub packet_count: u64,
    /// Bytes.
    pub byte_count: u64,
    /// The flow's match.
    pub match_: Match,
}

/// `OFPT_PACKET_OUT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PacketOut {
    /// Buffer id, or [`OFP_NO_BUFFER`] (then `data` is the frame).
    pub buffer_id: u32,
    /// The packet's input port (`OFPP_CONTROLLER` if none).
    pub in_port: u32,
    /// Actions.
    pub actions: Vec<Action>,
    /// The frame.
    pub data: Vec<u8>,
}

/// `OFPT_FLOW_MOD`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlowMod {
    /// Cookie.
    pub cookie: u64,
    /// Cookie mask (modify and delete).
    pub cookie_mask: u64,
    /// Table, or [`OFPTT_ALL`] for deletes.
    pub table_id: u8,
    /// `OFPFC_*`.
    pub command: u8,
    /// Idle timeout in seconds (0: none).
    pub idle_timeout: u16,
    /// Hard timeout in seconds (0: none).
    pub hard_timeout: u16,
    /// Priority.
    pub priority: u16,
    /// A buffered packet to apply the flow to, or [`OFP_NO_BUFFER`].
    pub buffer_id: u32,
    /// Delete filter: output port, or `OFPP_ANY`.
    pub out_port: u32,
    /// Delete filter: output group, or `OFPG_ANY`.
    pub out_group: u32,
    /// `OFPFF_*`.
    pub flags: u16,
    /// Match.
    pub match_: Match,
    /// Instructions.
    pub instructions: Vec<Instruction>,
}

/// A group's bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Bucket {
    /// Weight (select groups).
    pub weight: u16,
    /// Port whose liveness decides (fast-failover), or `OFPP_ANY`.
    pub watch_port: u32,
    /// Group whose liveness decides (fast-failover), or `OFPG_ANY`.
    pub watch_group: u32,
    /// Actions.
    pub actions: Vec<Action>,
}

impl Bucket {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u16(0);
        out.put_u16(self.weight);
        out.put_u32(self.watch_port);
        out.put_u32(self.watch_group);
        out.put_zeros(4);
        action::encode_actions(&self.actions, out);
        let len = len16(out.len() - start, "bucket");
        out.patch_u16(start, len);
    }
}

/// Decodes a bucket list filling `buf`.
pub(crate) fn decode_buckets(mut buf: &[u8]) -> Result<Vec<Bucket>, OfError> {
    let bad = OfError::new(
        et::GROUP_MOD_FAILED,
        gmfc::BAD_BUCKET,
        "bucket length not a multiple of 8 within its group",
    );
    let mut out = Vec::new();
    while !buf.is_empty() {
        let mut r = Reader::new(buf, bad);
        let len = usize::from(r.u16()?);
        if len < 16 || len % 8 != 0 || len > buf.len() {
            return Err(bad);
        }
        let weight = r.u16()?;
        let watch_port = r.u32()?;
        let watch_group = r.u32()?;
        let actions = action::decode_actions(&buf[16..len])?;
        out.push(Bucket {
            weight,
            watch_port,
            watch_group,
            actions,
        });
        buf = &buf[len..];
    }
    Ok(out)
}

/// `OFPT_GROUP_MOD`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupMod {
    /// `OFPGC_*`.
    pub command: u16,
    /// `OFPGT_*`.
    pub type_: u8,
    /// Group id ([`OFPG_ALL`] for a delete of every group).
    pub group_id: u32,
    /// Buckets.
    pub buckets: Vec<Bucket>,
}

/// `OFPT_PORT_MOD`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PortMod {
    /// Port.
    pub port_no: u32,
    /// Must be the port's MAC address (a sanity check).
    pub hw_addr: [u8; 6],
    /// `OFPPC_*` bits to set.
    pub config: u32,
    /// Which `config` bits to change.
    pub mask: u32,
    /// Features to advertise (0: unchanged).
    pub advertise: u32,
}

/// A meter band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MeterBand {
    /// `OFPMBT_DROP`.
    Drop {
        /// Rate (kbps or pktps, per the meter's flags).
        rate: u32,
        /// Burst size.
        burst_size: u32,
    },
    /// `OFPMBT_DSCP_REMARK`.
    DscpRemark {
        /// Rate.
        rate: u32,
        /// Burst size.
        burst_size: u32,
        /// Drop precedence levels to add.
        prec_level: u8,
    },
}

impl MeterBand {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let (t, rate, burst, prec) = match *self {
            MeterBand::Drop { rate, burst_size } => (meter::BAND_DROP, rate, burst_size, 0),
            MeterBand::DscpRemark {
                rate,
                burst_size,
                prec_level,
            } => (meter::BAND_DSCP_REMARK, rate, burst_size, prec_level),
        };
        out.put_u16(t);
        out.put_u16(16);
        out.put_u32(rate);
        out.put_u32(burst);
        out.put_u8(prec);
        out.put_zeros(3);
    }
}

/// Decodes a band list filling `buf`.
pub(crate) fn decode_bands(mut buf: &[u8]) -> Result<Vec<MeterBand>, OfError> {
    let bad = |reason| OfError::new(et::METER_MOD_FAILED, mmfc::BAD_BAND, reason);
    let mut out = Vec::new();
    while !buf.is_empty() {
        let mut r = Reader::new(buf, bad("meter band runs past its meter"));
        let t = r.u16()?;
        let len = usize::from(r.u16()?);
        if len != 16 || len > buf.len() {
            return Err(bad("meter band length is not 16"));
        }
        let rate = r.u32()?;
        let burst_size = r.u32()?;
        let prec_level = r.u8()?;
        out.push(match t {
            meter::BAND_DROP => MeterBand::Drop { rate, burst_size },
            meter::BAND_DSCP_REMARK => MeterBand::DscpRemark {
                rate,
                burst_size,
                prec_level,
            },
            _ => return Err(bad("meter band type is neither drop nor dscp_remark")),
        });
        buf = &buf[len..];
    }
    Ok(out)
}

/// `OFPT_METER_MOD`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeterMod {
    /// `OFPMC_*`.
    pub command: u16,
    /// `OFPMF_*`.
    pub flags: u16,
    /// Meter id.
    pub meter_id: u32,
    /// Bands.
    pub bands: Vec<MeterBand>,
}

/// `OFPT_ROLE_REQUEST` / `OFPT_ROLE_REPLY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Role {
    /// `OFPCR_ROLE_*`.
    pub role: u32,
    /// Master election generation id.
    pub generation_id: u64,
}

/// `OFPT_GET_ASYNC_REPLY` / `OFPT_SET_ASYNC`: index 0 is for the master/equal role, 1
/// for slaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AsyncConfig {
    /// `OFPR_*` bits.
    pub packet_in_mask: [u32; 2],
    /// `OFPPR_*` bits.
    pub port_status_mask: [u32; 2],
    /// `OFPRR_*` bits.
    pub flow_removed_mask: [u32; 2],
}

/// An OpenFlow 1.3 message (its header's xid travels beside it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Message {
    /// `OFPT_HELLO`; `versions` are the wire versions of its version bitmap (sorted;
    /// empty: no bitmap element, the header's version alone speaks).
    Hello {
        versions: Vec<u8>,
    },
    Error(ErrorMsg),
    EchoRequest(Vec<u8>),
    EchoReply(Vec<u8>),
    FeaturesRequest,
    FeaturesReply(SwitchFeatures),
    GetConfigRequest,
    GetConfigReply(SwitchConfig),
    SetConfig(SwitchConfig),
    PacketIn(PacketIn),
    FlowRemoved(FlowRemoved),
    /// `OFPT_PORT_STATUS`; `reason` is `OFPPR_*` (0 add, 1 delete, 2 modify).
    PortStatus {
        reason: u8,
        port: Port,
    },
    PacketOut(PacketOut),
    FlowMod(FlowMod),
    GroupMod(GroupMod),
    PortMod(PortMod),
    /// `OFPT_TABLE_MOD` (accepted; 1.3 defines no config bits).
    TableMod {
        table_id: u8,
        config: u32,
    },
    MultipartRequest(MultipartRequest),
    MultipartReply(MultipartReply),
    BarrierRequest,
    BarrierReply,
    RoleRequest(Role),
    RoleReply(Role),
    GetAsyncRequest,
    GetAsyncReply(AsyncConfig),
    SetAsync(AsyncConfig),
    MeterMod(MeterMod),
}

impl Message {
    /// The `OFPT_*` type.
    pub fn type_(&self) -> u8 {
        match self {
            Message::Hello { .. } => ty::HELLO,
            Message::Error(_) => ty::ERROR,
            Message::EchoRequest(_) => ty::ECHO_REQUEST,
            Message::EchoReply(_) => ty::ECHO_REPLY,
            Message::FeaturesRequest => ty::FEATURES_REQUEST,
            Message::FeaturesReply(_) => ty::FEATURES_REPLY,
            Message::GetConfigRequest => ty::GET_CONFIG_REQUEST,
            Message::GetConfigReply(_) => ty::GET_CONFIG_REPLY,
            Message::SetConfig(_) => ty::SET_CONFIG,
            Message::PacketIn(_) => ty::PACKET_IN,
            Message::FlowRemoved(_) => ty::FLOW_REMOVED,
            Message::PortStatus { .. } => ty::PORT_STATUS,
            Message::PacketOut(_) => ty::PACKET_OUT,
            Message::FlowMod(_) => ty::FLOW_MOD,
            Message::GroupMod(_) => ty::GROUP_MOD,
            Message::PortMod(_) => ty::PORT_MOD,
            Message::TableMod { .. } => ty::TABLE_MOD,
            Message::MultipartRequest(_) => ty::MULTIPART_REQUEST,
            Message::MultipartReply(_) => ty::MULTIPART_REPLY,
            Message::BarrierRequest => ty::BARRIER_REQUEST,
            Message::BarrierReply => ty::BARRIER_REPLY,
            Message::RoleRequest(_) => ty::ROLE_REQUEST,
            Message::RoleReply(_) => ty::ROLE_REPLY,
            Message::GetAsyncRequest => ty::GET_ASYNC_REQUEST,
            Message::GetAsyncReply(_) => ty::GET_ASYNC_REPLY,
            Message::SetAsync(_) => ty::SET_ASYNC,
            Message::MeterMod(_) => ty::METER_MOD,
        }
    }
}

/// `OFPHET_VERSIONBITMAP`.
const HELLO_ELEM_VERSIONBITMAP: u16 = 1;

/// The version this side and the peer agree on (OpenFlow 1.3.1 §6.3.1): with both
/// bitmaps, the highest version in both; otherwise the lower of the two highest versions,
/// if we support it. `ours` are our versions (any order). `None`: no common version, the
/// caller answers `OFPET_HELLO_FAILED`/`OFPHFC_INCOMPATIBLE` and closes.
pub fn negotiate(ours: &[u8], peer_header_version: u8, peer_versions: &[u8]) -> Option<u8> {
    if peer_versions.is_empty() {
        let ours_max = ours.iter().copied().max()?;
        let v = ours_max.min(peer_header_version);
        ours.contains(&v).then_some(v)
    } else {
        peer_versions
            .iter()
            .copied()
            .filter(|v| ours.contains(v))
            .max()
    }
}

/// Encodes `msg` as OpenFlow 1.3 (HELLO with the highest version of its bitmap).
pub fn encode(msg: &Message, xid: u32) -> Vec<u8> {
    let version = match msg {
        Message::Hello { versions } => versions.iter().copied().max().unwrap_or(VERSION_1_3),
        _ => VERSION_1_3,
    };
    encode_with_version(msg, version, xid)
}

/// Encodes `msg` with header version `version` (an ERROR answering a peer's HELLO of
/// another version carries the peer's version; the body is 1.3's).
pub fn encode_with_version(msg: &Message, version: u8, xid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.put_u8(version);
    out.put_u8(msg.type_());
    out.put_u16(0);
    out.put_u32(xid);
    encode_body(msg, &mut out);
    let len = len16(out.len(), "message");
    out.patch_u16(2, len);
    out
}

fn encode_body(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::Hello { versions } => {
            if !versions.is_empty() {
                let words = usize::from(versions.iter().copied().max().unwrap_or(0)) / 32 + 1;
                let mut bitmap = vec![0u32; words];
                for &v in versions {
                    bitmap[usize::from(v) / 32] |= 1 << (v % 32);
                }
                let start = out.len();
                out.put_u16(HELLO_ELEM_VERSIONBITMAP);
                out.put_u16((4 + 4 * words) as u16);
                for w in bitmap {
                    out.put_u32(w);
                }
                out.pad8_from(start);
            }
        }
        Message::Error(e) => {
            out.put_u16(e.type_);
            out.put_u16(e.code);
            out.extend_from_slice(&e.data);
        }
        Message::EchoRequest(d) | Message::EchoReply(d) => out.extend_from_slice(d),
        Message::FeaturesRequest
        | Message::GetConfigRequest
        | Message::BarrierRequest
        | Message::BarrierReply
        | Message::GetAsyncRequest => {}
        Message::FeaturesReply(f) => {
            out.put_u64(f.datapath_id);
            out.put_u32(f.n_buffers);
            out.put_u8(f.n_tables);
            out.put_u8(f.auxiliary_id);
            out.put_zeros(2);
            out.put_u32(f.capabilities);
            out.put_u32(0);
        }
        Message::GetConfigReply(c) | Message::SetConfig(c) => {
            out.put_u16(c.flags);
            out.put_u16(c.miss_send_len);
        }
        Message::PacketIn(p) => {
            out.put_u32(p.buffer_id);
            out.put_u16(p.total_len);
            out.put_u8(p.reason);
            out.put_u8(p.table_id);
            out.put_u64(p.cookie);
            p.match_.encode(out);
            out.put_zeros(2);
            out.extend_from_slice(&p.data);
        }
        Message::FlowRemoved(f) => {
            out.put_u64(f.cookie);
            out.put_u16(f.priority);
            out.put_u8(f.reason);
            out.put_u8(f.table_id);
            out.put_u32(f.duration_sec);
            out.put_u32(f.duration_nsec);
            out.put_u16(f.idle_timeout);
            out.put_u16(f.hard_timeout);
            out.put_u64(f.packet_count);
            out.put_u64(f.byte_count);
            f.match_.encode(out);
        }
        Message::PortStatus { reason, port } => {
            out.put_u8(*reason);
            out.put_zeros(7);
            port.encode(out);
        }
        Message::PacketOut(p) => {
            out.put_u32(p.buffer_id);
            out.put_u32(p.in_port);
            let at = out.len();
            out.put_u16(0);
            out.put_zeros(6);
            let start = out.len();
            action::encode_actions(&p.actions, out);
            let alen = len16(out.len() - start, "packet-out actions");
            out.patch_u16(at, alen);
            out.extend_from_slice(&p.data);
        }
        Message::FlowMod(f) => {
            out.put_u64(f.cookie);
            out.put_u64(f.cookie_mask);
            out.put_u8(f.table_id);
            out.put_u8(f.command);
            out.put_u16(f.idle_timeout);
            out.put_u16(f.hard_timeout);
            out.put_u16(f.priority);
            out.put_u32(f.buffer_id);
            out.put_u32(f.out_port);
            out.put_u32(f.out_group);
            out.put_u16(f.flags);
            out.put_zeros(2);
            f.match_.encode(out);
            action::encode_instructions(&f.instructions, out);
        }
        Message::GroupMod(g) => {
            out.put_u16(g.command);
            out.put_u8(g.type_);
            out.put_u8(0);
            out.put_u32(g.group_id);
            for b in &g.buckets {
                b.encode(out);
            }
        }
        Message::PortMod(p) => {
            out.put_u32(p.port_no);
            out.put_zeros(4);
            out.extend_from_slice(&p.hw_addr);
            out.put_zeros(2);
            out.put_u32(p.config);
            out.put_u32(p.mask);
            out.put_u32(p.advertise);
            out.put_zeros(4);
        }
        Message::TableMod { table_id, config } => {
            out.put_u8(*table_id);
            out.put_zeros(3);
            out.put_u32(*config);
        }
        Message::MultipartRequest(m) => m.encode(out),
        Message::MultipartReply(m) => m.encode(out),
        Message::RoleRequest(r) | Message::RoleReply(r) => {
            out.put_u32(r.role);
            out.put_zeros(4);
            out.put_u64(r.generation_id);
        }
        Message::GetAsyncReply(a) | Message::SetAsync(a) => {
            for v in a
                .packet_in_mask
                .iter()
                .chain(&a.port_status_mask)
                .chain(&a.flow_removed_mask)
            {
                out.put_u32(*v);
            }
        }
        Message::MeterMod(m) => {
            out.put_u16(m.command);
            out.put_u16(m.flags);
            out.put_u32(m.meter_id);
            for b in &m.bands {
                b.encode(out);
            }
        }
    }
}

const BAD_LEN: OfError = OfError::request(brc::BAD_LEN, "message length wrong for its type");

fn exact(body: &[u8], n: usize) -> Result<(), OfError> {
    if body.len() == n {
        Ok(())
    } else {
        Err(BAD_LEN)
    }
}

/// Decodes one whole message (header included, as [`crate::Framer`] returns it).
pub fn decode(buf: &[u8]) -> Result<(Header, Message), OfError> {
    let h = Header::parse(buf).ok_or(OfError::request(
        brc::BAD_LEN,
        "message shorter than its header",
    ))?;
    if usize::from(h.length) != buf.len() {
        return Err(OfError::request(
            brc::BAD_LEN,
            "header length differs from the message's",
        ));
    }
    let body = &buf[HEADER_LEN..];
    let version_free = matches!(
        h.type_,
        ty::HELLO | ty::ERROR | ty::ECHO_REQUEST | ty::ECHO_REPLY
    );
    if !version_free && h.version != VERSION_1_3 {
        return Err(OfError::request(
            brc::BAD_VERSION,
            "message of a version other than OpenFlow 1.3",
        ));
    }
    let mut r = Reader::new(body, BAD_LEN);
    let msg = match h.type_ {
        ty::HELLO => Message::Hello {
            versions: decode_hello(body)?,
        },
        ty::ERROR => Message::Error(ErrorMsg {
            type_: r.u16()?,
            code: r.u16()?,
            data: r.rest().to_vec(),
        }),
        ty::ECHO_REQUEST => Message::EchoRequest(body.to_vec()),
        ty::ECHO_REPLY => Message::EchoReply(body.to_vec()),
        ty::EXPERIMENTER => {
            return Err(OfError::request(
                brc::BAD_EXPERIMENTER,
                "experimenter messages are not supported",
            ))
        }
        ty::FEATURES_REQUEST => exact(body, 0).map(|_| Message::FeaturesRequest)?,
        ty::GET_CONFIG_REQUEST => exact(body, 0).map(|_| Message::GetConfigRequest)?,
        ty::BARRIER_REQUEST => exact(body, 0).map(|_| Message::BarrierRequest)?,
        ty::BARRIER_REPLY => exact(body, 0).map(|_| Message::BarrierReply)?,
        ty::GET_ASYNC_REQUEST => exact(body, 0).map(|_| Message::GetAsyncRequest)?,
        ty::FEATURES_REPLY => {
            exact(body, 24)?;
            let f = SwitchFeatures {
                datapath_id: r.u64()?,
                n_buffers: r.u32()?,
                n_tables: r.u8()?,
                auxiliary_id: r.u8()?,
                capabilities: {
                    r.skip(2)?;
                    r.u32()?
                },
            };
            Message::FeaturesReply(f)
        }
        ty::GET_CONFIG_REPLY | ty::SET_CONFIG => {
            exact(body, 4)?;
            let c = SwitchConfig {
                flags: r.u16()?,
                miss_send_len: r.u16()?,
            };
            if h.type_ == ty::SET_CONFIG {
                if c.flags > 3 {
                    return Err(OfError::new(
                        et::SWITCH_CONFIG_FAILED,
                        scfc::BAD_FLAGS,
                        "unknown SET_CONFIG flags",
                    ));
                }
                Message::SetConfig(c)
            } else {
                Message::GetConfigReply(c)
            }
        }
        ty::PACKET_IN => {
            let buffer_id = r.u32()?;
            let total_len = r.u16()?;
            let reason = r.u8()?;
            let table_id = r.u8()?;
            let cookie = r.u64()?;
            let (match_, used) = Match::decode(&body[r.pos()..])?;
            r.skip(used)?;
            r.skip(2)?;
            Message::PacketIn(PacketIn {
                buffer_id,
                total_len,
                reason,
                table_id,
                cookie,
                match_,
                data: r.rest().to_vec(),
            })
        }
        ty::FLOW_REMOVED => {
            let mut f = FlowRemoved {
                cookie: r.u64()?,
                priority: r.u16()?,
                reason: r.u8()?,
                table_id: r.u8()?,
                duration_sec: r.u32()?,
                duration_nsec: r.u32()?,
                idle_timeout: r.u16()?,
                hard_timeout: r.u16()?,
                packet_count: r.u64()?,
                byte_count: r.u64()?,
                match_: Match::new(),
            };
            let (m, used) = Match::decode(&body[r.pos()..])?;
            r.skip(used)?;
            if !r.is_empty() {
                return Err(BAD_LEN);
            }
            f.match_ = m;
            Message::FlowRemoved(f)
        }
        ty::PORT_STATUS => {
            exact(body, 8 + port::PORT_LEN)?;
            let reason = r.u8()?;
            r.skip(7)?;
            Message::PortStatus {
                reason,
                port: Port::decode(&mut r)?,
            }
        }
        ty::PACKET_OUT => decode_packet_out(&mut r)?,
        ty::FLOW_MOD => Message::FlowMod(decode_flow_mod(&mut r)?),
        ty::GROUP_MOD => decode_group_mod(&mut r)?,
        ty::PORT_MOD => {
            exact(body, 32)?;
            let port_no = r.u32()?;
            r.skip(4)?;
            let p = PortMod {
                port_no,
                hw_addr: r.array()?,
                config: {
                    r.skip(2)?;
                    r.u32()?
                },
                mask: r.u32()?,
                advertise: r.u32()?,
            };
            if p.port_no == 0 || (p.port_no > port::OFPP_MAX && p.port_no != port::OFPP_LOCAL) {
                return Err(OfError::new(
                    et::PORT_MOD_FAILED,
                    pmfc::BAD_PORT,
                    "port-mod of a reserved port",
                ));
            }
            Message::PortMod(p)
        }
        ty::TABLE_MOD => {
            exact(body, 8)?;
            let table_id = r.u8()?;
            r.skip(3)?;
            Message::TableMod {
                table_id,
                config: r.u32()?,
            }
        }
        ty::MULTIPART_REQUEST => Message::MultipartRequest(MultipartRequest::decode(body)?),
        ty::MULTIPART_REPLY => Message::MultipartReply(MultipartReply::decode(body)?),
        ty::ROLE_REQUEST | ty::ROLE_REPLY => {
            exact(body, 16)?;
            let role = r.u32()?;
            r.skip(4)?;
            let ro = Role {
                role,
                generation_id: r.u64()?,
            };
            if ro.role > role::SLAVE {
                return Err(OfError::new(
                    et::ROLE_REQUEST_FAILED,
                    rrfc::BAD_ROLE,
                    "unknown controller role",
                ));
            }
            if h.type_ == ty::ROLE_REQUEST {
                Message::RoleRequest(ro)
            } else {
                Message::RoleReply(ro)
            }
        }
        ty::GET_ASYNC_REPLY | ty::SET_ASYNC => {
            exact(body, 24)?;
            let a = AsyncConfig {
                packet_in_mask: [r.u32()?, r.u32()?],
                port_status_mask: [r.u32()?, r.u32()?],
                flow_removed_mask: [r.u32()?, r.u32()?],
            };
            if h.type_ == ty::SET_ASYNC {
                Message::SetAsync(a)
            } else {
                Message::GetAsyncReply(a)
            }
        }
        ty::METER_MOD => {
            let command = r.u16()?;
            let flags = r.u16()?;
            let meter_id = r.u32()?;
            if command > meter::DELETE {
                return Err(OfError::new(
                    et::METER_MOD_FAILED,
                    mmfc::BAD_COMMAND,
                    "unknown meter-mod command",
                ));
            }
            if flags & !0xf != 0 {
                return Err(OfError::new(
                    et::METER_MOD_FAILED,
                    mmfc::BAD_FLAGS,
                    "unknown meter-mod flags",
                ));
            }
            Message::MeterMod(MeterMod {
                command,
                flags,
                meter_id,
                bands: decode_bands(r.rest())?,
            })
        }
        _ => {
            return Err(OfError::request(
                brc::BAD_TYPE,
                "message type not supported",
            ))
        }
    };
    Ok((h, msg))
}

/// A HELLO's versions: its first version-bitmap element's bits; unknown elements are
/// skipped, as the specification asks.
fn decode_hello(mut body: &[u8]) -> Result<Vec<u8>, OfError> {
    let bad = OfError::new(
        et::HELLO_FAILED,
        crate::error::hfc::EPERM,
        "HELLO element runs past the message",
    );
    let mut versions = Vec::new();
    while body.len() >= 4 {
        let mut r = Reader::new(body, bad);
        let t = r.u16()?;
        let len = usize::from(r.u16()?);
        if len < 4 || len > body.len() {
            return Err(bad);
        }
        if t == HELLO_ELEM_VERSIONBITMAP && versions.is_empty() {
            let mut words = Reader::new(&body[4..len], bad);
            let mut base = 0u32;
            while words.remaining() >= 4 {
                let w = words.u32()?;
                for bit in 0..32 {
                    if w & (1 << bit) != 0 && base + bit <= 0xff {
                        versions.push((base + bit) as u8);
                    }
                }
                base += 32;
            }
        }
        body = &body[crate::wire::pad8(len).min(body.len())..];
    }
    Ok(versions)
}

fn decode_packet_out(r: &mut Reader<'_>) -> Result<Message, OfError> {
    let buffer_id = r.u32()?;
    let in_port = r.u32()?;
    let actions_len = usize::from(r.u16()?);
    r.skip(6)?;
    let actions = action::decode_actions(r.bytes(actions_len)?)?;
    if in_port == 0
        || (in_port > port::OFPP_MAX
            && !matches!(
                in_port,
                port::OFPP_LOCAL | port::OFPP_CONTROLLER | port::OFPP_ANY
            ))
    {
        return Err(OfError::request(
            brc::BAD_PORT,
            "packet-out from an invalid in_port",
        ));
    }
    Ok(Message::PacketOut(PacketOut {
        buffer_id,
        in_port,
        actions,
        data: r.rest().to_vec(),
    }))
}

fn flow_mod_err(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::FLOW_MOD_FAILED, code, reason)
}

fn decode_flow_mod(r: &mut Reader<'_>) -> Result<FlowMod, OfError> {
    let mut f = FlowMod {
        cookie: r.u64()?,
        cookie_mask: r.u64()?,
        table_id: r.u8()?,
        command: r.u8()?,
        idle_timeout: r.u16()?,
        hard_timeout: r.u16()?,
        priority: r.u16()?,
        buffer_id: r.u32()?,
        out_port: r.u32()?,
        out_group: r.u32()?,
        flags: r.u16()?,
        match_: Match::new(),
        instructions: Vec::new(),
    };
    r.skip(2)?;
    if f.command > fc::DELETE_STRICT {
        return Err(flow_mod_err(fmfc::BAD_COMMAND, "unknown flow-mod command"));
    }
    if f.flags & !0x1f != 0 {
        return Err(flow_mod_err(fmfc::BAD_FLAGS, "unknown flow-mod flags"));
    }
    let adds = f.command <= fc::MODIFY_STRICT;
    if adds && f.table_id == OFPTT_ALL {
        return Err(flow_mod_err(
            fmfc::BAD_TABLE_ID,
            "add or modify in table OFPTT_ALL",
        ));
    }
    let rest = r.rest();
    let (m, used) = Match::decode(rest)?;
    f.match_ = m;
    f.instructions = action::decode_instructions(&rest[used..])?;
    for i in &f.instructions {
        if let Instruction::GotoTable(t) = i {
            if adds && *t <= f.table_id {
                return Err(OfError::instruction(
                    crate::error::bic::BAD_TABLE_ID,
                    "goto_table to this table or an earlier one",
                ));
            }
        }
        if i.actions()
            .iter()
            .any(|a| matches!(a, Action::Output { port, .. } if *port == port::OFPP_TABLE))
        {
            return Err(OfError::action(
                crate::error::bac::BAD_OUT_PORT,
                "output to OFPP_TABLE outside a packet-out",
            ));
        }
    }
    Ok(f)
}

fn decode_group_mod(r: &mut Reader<'_>) -> Result<Message, OfError> {
    let command = r.u16()?;
    let type_ = r.u8()?;
    r.skip(1)?;
    let group_id = r.u32()?;
    let err = |code, reason| OfError::new(et::GROUP_MOD_FAILED, code, reason);
    if command > group::DELETE {
        return Err(err(gmfc::BAD_COMMAND, "unknown group-mod command"));
    }
    if type_ > group::TYPE_FF {
        return Err(err(gmfc::BAD_TYPE, "unknown group type"));
    }
    if group_id > OFPG_MAX && !(command == group::DELETE && group_id == OFPG_ALL) {
        return Err(err(gmfc::INVALID_GROUP, "group-mod of a reserved group id"));
    }
    let buckets = decode_buckets(r.rest())?;
    Ok(Message::GroupMod(GroupMod {
        command,
        type_,
        group_id,
        buckets,
    }))
}
