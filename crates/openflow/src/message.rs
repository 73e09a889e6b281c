//! The messages of OpenFlow 1.3, 1.4 and 1.5 a switch receives and sends: one [`Message`]
//! enum, [`decode`] and [`encode_with_version`].
//!
//! `decode` takes one whole message (as [`crate::Framer`] returns it) and either returns
//! a typed value or the [`OfError`] the switch answers with. Lengths are exact: a fixed
//! size message with extra or missing bytes is `OFPBRC_BAD_LEN`. HELLO, ERROR and ECHO
//! decode whatever the version (they are the same in every version); every other message
//! must be version 0x04, 0x05 or 0x06 (`OFPBRC_BAD_VERSION`). A type this codec does not
//! handle is `OFPBRC_BAD_TYPE`; an experimenter message is a Nicira one
//! ([`crate::nx_msg`]) or `OFPBRC_BAD_EXPERIMENTER`.
//!
//! Where the versions differ, the header's version picks the layout, both ways:
//!
//! | message | 1.3 | 1.4 | 1.5 |
//! |---|---|---|---|
//! | FLOW_MOD | 2 pad bytes | `importance` in them | same as 1.4 |
//! | GROUP_MOD | `ofp11_group_mod`, `ofp11_bucket` | as 1.3 | `ofp15_group_mod` (`bucket_array_len`, `command_bucket_id`, properties), `ofp15_bucket` (`bucket_id`, weight/watch as properties) |
//! | PACKET_OUT | `in_port` | as 1.3 | a match (`in_port` and pipeline fields) |
//! | PORT_STATUS, PORT_DESC reply | `ofp_port` (64 bytes) | `ofp14_port` + Ethernet property | as 1.4 |
//! | SET_ASYNC, GET_ASYNC_REPLY | three mask pairs | properties | as 1.4 |
//! | FLOW_REMOVED | `ofp12_flow_removed` | as 1.3 | `ofp15_flow_removed` with OXS statistics |
//! | BUNDLE_CONTROL / BUNDLE_ADD_MESSAGE | `OFPBRC_BAD_TYPE` | [`crate::bundle`] | as 1.4 |
//!
//! FEATURES, CONFIG, ECHO, BARRIER, ROLE, METER_MOD, PACKET_IN and the multipart
//! messages ovn-controller uses are the same in all three.

use crate::action::{self, Action, Instruction, OFPG_ALL, OFPG_MAX};
use crate::bundle::{BundleAdd, BundleCtrl};
use crate::error::{bpc, brc, et, fmfc, gmfc, mmfc, pmfc, rrfc, scfc, OfError};
use crate::multipart::{MultipartReply, MultipartRequest};
use crate::nx_msg::NxMessage;
use crate::oxm::{Field, Match, Oxm};
use crate::port::{self, Port};
use crate::wire::{len16, pad8, Put, Reader};
use crate::{HEADER_LEN, VERSION_1_3, VERSION_1_4, VERSION_1_5};

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
    pub const BUNDLE_CONTROL: u8 = 33;
    pub const BUNDLE_ADD_MESSAGE: u8 = 34;
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
    /// OpenFlow 1.5: add buckets to a group.
    pub const INSERT_BUCKET: u16 = 3;
    /// OpenFlow 1.5: remove buckets from a group.
    pub const REMOVE_BUCKET: u16 = 5;
    /// `OFPG15_BUCKET_MAX`: the highest ordinary bucket id.
    pub const BUCKET_MAX: u32 = 0xffff_ff00;
    /// `OFPG15_BUCKET_FIRST`.
    pub const BUCKET_FIRST: u32 = 0xffff_fffd;
    /// `OFPG15_BUCKET_LAST`.
    pub const BUCKET_LAST: u32 = 0xffff_fffe;
    /// `OFPG15_BUCKET_ALL`.
    pub const BUCKET_ALL: u32 = 0xffff_ffff;
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
    /// OpenFlow 1.5: the match's pipeline fields other than `in_port` (metadata, tunnel
    /// fields), in wire order; empty in 1.3.
    pub metadata: Vec<Oxm>,
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
    /// OpenFlow 1.4+: the flow's importance (eviction order); 0 in 1.3.
    pub importance: u16,
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
    /// OpenFlow 1.5's bucket id (1.3 has none: 0).
    pub bucket_id: u32,
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
            bucket_id: 0,
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
    /// OpenFlow 1.5: the bucket a command refers to ([`group::BUCKET_ALL`] in 1.3).
    pub command_bucket_id: u32,
    /// OpenFlow 1.5: Netronome's selection-method property (ovs-ofctl's
    /// `selection_method=`), if given.
    pub selection_method: Option<SelectionMethod>,
    /// Buckets.
    pub buckets: Vec<Bucket>,
}

/// `ntr_group_prop_selection_method` (experimenter `0x0000154d`, type 1): how a select
/// group picks its bucket (`"hash"`, `"dp_hash"`, or empty for the switch's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SelectionMethod {
    /// The experimenter id it came with: [`NTR_VENDOR_ID`] (what OVS writes) or
    /// [`NTR_COMPAT_VENDOR_ID`].
    pub experimenter: u32,
    /// The method's name (at most 15 bytes).
    pub method: String,
    /// Its parameter (a hash basis).
    pub param: u64,
    /// The fields hashed: OXM headers as bytes (4 each, 8 with a mask), unpadded.
    pub fields: Vec<u8>,
}

/// Netronome's experimenter id (`NTR_VENDOR_ID`).
pub const NTR_VENDOR_ID: u32 = 0x0000_154d;
/// `NTR_COMPAT_VENDOR_ID`, which OVS also accepts.
pub const NTR_COMPAT_VENDOR_ID: u32 = 0x0000_1540;

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
    /// A Nicira experimenter message (`OFPT_EXPERIMENTER`).
    Experimenter(NxMessage),
    /// `OFPT_BUNDLE_CONTROL` (1.4+).
    BundleControl(BundleCtrl),
    /// `OFPT_BUNDLE_ADD_MESSAGE` (1.4+).
    BundleAdd(BundleAdd),
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
            Message::Experimenter(_) => ty::EXPERIMENTER,
            Message::BundleControl(_) => ty::BUNDLE_CONTROL,
            Message::BundleAdd(_) => ty::BUNDLE_ADD_MESSAGE,
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

/// Encodes `msg` with header version `version`, in that version's layout where versions
/// differ (1.4's for 0x05, 1.5's for 0x06 and above, 1.3's below: an ERROR answering a
/// peer's HELLO of another version carries the peer's version).
pub fn encode_with_version(msg: &Message, version: u8, xid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.put_u8(version);
    out.put_u8(msg.type_());
    out.put_u16(0);
    out.put_u32(xid);
    encode_body(msg, version, &mut out);
    let len = len16(out.len(), "message");
    out.patch_u16(2, len);
    out
}

fn encode_body(msg: &Message, version: u8, out: &mut Vec<u8>) {
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
        Message::FlowRemoved(f) if version >= VERSION_1_5 => encode_flow_removed15(f, out),
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
            if version >= VERSION_1_4 {
                port.encode14(out);
            } else {
                port.encode(out);
            }
        }
        Message::PacketOut(p) if version >= VERSION_1_5 => {
            out.put_u32(p.buffer_id);
            let at = out.len();
            out.put_u16(0);
            out.put_zeros(2);
            let mut m = Match::new().with(Oxm::exact(Field::InPort, u128::from(p.in_port)));
            m.fields.extend(p.metadata.iter().cloned());
            m.encode(out);
            let start = out.len();
            action::encode_actions(&p.actions, out);
            let alen = len16(out.len() - start, "packet-out actions");
            out.patch_u16(at, alen);
            out.extend_from_slice(&p.data);
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
            out.put_u16(if version >= VERSION_1_4 {
                f.importance
            } else {
                0
            });
            f.match_.encode(out);
            action::encode_instructions(&f.instructions, out);
        }
        Message::GroupMod(g) if version >= VERSION_1_5 => encode_group_mod15(g, out),
        Message::GroupMod(g) => {
            out.put_u16(g.command);
            out.put_u8(g.type_);
            out.put_u8(0);
            out.put_u32(g.group_id);
            for b in &g.buckets {
                b.encode(out);
            }
        }
        Message::PortMod(p) if version >= VERSION_1_4 => {
            out.put_u32(p.port_no);
            out.put_zeros(4);
            out.extend_from_slice(&p.hw_addr);
            out.put_zeros(2);
            out.put_u32(p.config);
            out.put_u32(p.mask);
            // OFPPMPT14_ETHERNET.
            out.put_u16(0);
            out.put_u16(8);
            out.put_u32(p.advertise);
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
        Message::MultipartRequest(m) => m.encode(out, version),
        Message::MultipartReply(m) => m.encode(out, version),
        Message::RoleRequest(r) | Message::RoleReply(r) => {
            out.put_u32(r.role);
            out.put_zeros(4);
            out.put_u64(r.generation_id);
        }
        Message::GetAsyncReply(a) | Message::SetAsync(a) if version >= VERSION_1_4 => {
            // OFPACPT_*: slave (odd masks' index 1) then master (index 0) for each kind.
            for (i, pair) in [a.packet_in_mask, a.port_status_mask, a.flow_removed_mask]
                .iter()
                .enumerate()
            {
                for (j, mask) in [pair[1], pair[0]].iter().enumerate() {
                    out.put_u16((2 * i + j) as u16);
                    out.put_u16(8);
                    out.put_u32(*mask);
                }
            }
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
        Message::Experimenter(m) => m.encode(out),
        Message::BundleControl(b) => b.encode(out),
        Message::BundleAdd(b) => b.encode(out),
    }
}

/// `ofp15_flow_removed`: table, reason, priority, timeouts, cookie, match, then the
/// statistics as OXS (duration, idle time, packet and byte counts).
fn encode_flow_removed15(f: &FlowRemoved, out: &mut Vec<u8>) {
    out.put_u8(f.table_id);
    out.put_u8(f.reason);
    out.put_u16(f.priority);
    out.put_u16(f.idle_timeout);
    out.put_u16(f.hard_timeout);
    out.put_u64(f.cookie);
    f.match_.encode(out);
    oxs::put(
        out,
        &oxs::Stats {
            duration: Some((f.duration_sec, f.duration_nsec)),
            packet_count: Some(f.packet_count),
            byte_count: Some(f.byte_count),
            flow_count: None,
        },
    );
}

/// OpenFlow 1.5's flow statistics (`ofp_stats`: reserved, length, then OXS fields
/// `OFPXST_OFB_*` of class `OFPXSC_OPENFLOW_BASIC`, padded to 8), written in OVS's order
/// (duration, idle time, flow count, packets, bytes: `ovs-ofctl ofp-print`'s samples).
pub(crate) mod oxs {
    use super::{len16, pad8, Put, Reader, BAD_LEN};
    use crate::error::OfError;

    pub const CLASS: u32 = 0x8002;
    pub const DURATION: u8 = 0;
    pub const IDLE_TIME: u8 = 1;
    pub const FLOW_COUNT: u8 = 3;
    pub const PACKET_COUNT: u8 = 4;
    pub const BYTE_COUNT: u8 = 5;

    /// An OXS header: class, field, no mask, length.
    pub fn header(field: u8, len: u8) -> u32 {
        (CLASS << 16) | (u32::from(field) << 9) | u32::from(len)
    }

    /// The statistics an `ofp_stats` carries (absent: not written).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct Stats {
        pub duration: Option<(u32, u32)>,
        pub packet_count: Option<u64>,
        pub byte_count: Option<u64>,
        pub flow_count: Option<u32>,
    }

    pub fn put(out: &mut Vec<u8>, s: &Stats) {
        let start = out.len();
        out.put_u16(0); // reserved
        out.put_u16(0); // length
        if let Some((sec, nsec)) = s.duration {
            out.put_u32(header(DURATION, 8));
            out.put_u32(sec);
            out.put_u32(nsec);
        }
        if let Some(v) = s.flow_count {
            out.put_u32(header(FLOW_COUNT, 4));
            out.put_u32(v);
        }
        if let Some(v) = s.packet_count {
            out.put_u32(header(PACKET_COUNT, 8));
            out.put_u64(v);
        }
        if let Some(v) = s.byte_count {
            out.put_u32(header(BYTE_COUNT, 8));
            out.put_u64(v);
        }
        let len = len16(out.len() - start, "flow statistics");
        out.patch_u16(start + 2, len);
        out.pad8_from(start);
    }

    /// Reads an `ofp_stats` from the start of `buf`: the statistics and the bytes used
    /// (padded). An idle time is read and dropped; an unknown or masked field is
    /// `OFPBRC_BAD_LEN`.
    pub fn pull(buf: &[u8]) -> Result<(Stats, usize), OfError> {
        let mut r = Reader::new(buf, BAD_LEN);
        r.skip(2)?;
        let len = usize::from(r.u16()?);
        if len < 4 || pad8(len) > buf.len() {
            return Err(BAD_LEN);
        }
        let mut f = Reader::new(&buf[4..len], BAD_LEN);
        let mut s = Stats::default();
        while !f.is_empty() {
            let h = f.u32()?;
            if h >> 16 != CLASS || h & 0x100 != 0 {
                return Err(BAD_LEN);
            }
            match (((h >> 9) & 0x7f) as u8, (h & 0xff) as u8) {
                (DURATION, 8) => s.duration = Some((f.u32()?, f.u32()?)),
                (IDLE_TIME, 8) => {
                    f.u64()?;
                }
                (FLOW_COUNT, 4) => s.flow_count = Some(f.u32()?),
                (PACKET_COUNT, 8) => s.packet_count = Some(f.u64()?),
                (BYTE_COUNT, 8) => s.byte_count = Some(f.u64()?),
                _ => return Err(BAD_LEN),
            }
        }
        Ok((s, pad8(len)))
    }
}

fn decode_flow_removed15(r: &mut Reader<'_>, body: &[u8]) -> Result<FlowRemoved, OfError> {
    let table_id = r.u8()?;
    let reason = r.u8()?;
    let priority = r.u16()?;
    let idle_timeout = r.u16()?;
    let hard_timeout = r.u16()?;
    let cookie = r.u64()?;
    let (match_, used) = Match::decode(&body[r.pos()..])?;
    r.skip(used)?;
    let mut f = FlowRemoved {
        cookie,
        priority,
        reason,
        table_id,
        duration_sec: 0,
        duration_nsec: 0,
        idle_timeout,
        hard_timeout,
        packet_count: 0,
        byte_count: 0,
        match_,
    };
    let (st, used) = oxs::pull(&body[r.pos()..])?;
    if used != r.remaining() {
        return Err(BAD_LEN);
    }
    (f.duration_sec, f.duration_nsec) = st.duration.unwrap_or((0, 0));
    f.packet_count = st.packet_count.unwrap_or(0);
    f.byte_count = st.byte_count.unwrap_or(0);
    Ok(f)
}

/// Bucket property types (`OFPGBPT15_*`) and the group property type of experimenters.
mod gbpt {
    pub const WEIGHT: u16 = 0;
    pub const WATCH_PORT: u16 = 1;
    pub const WATCH_GROUP: u16 = 2;
    pub const EXPERIMENTER: u16 = 0xffff;
    /// `NTRT_SELECTION_METHOD`.
    pub const NTRT_SELECTION_METHOD: u32 = 1;
}

/// `ofp15_group_mod` as OVS writes it: a weight property for select groups (or any
/// non-zero weight), watch properties unless `ANY`, the selection method if any.
fn encode_group_mod15(g: &GroupMod, out: &mut Vec<u8>) {
    out.put_u16(g.command);
    out.put_u8(g.type_);
    out.put_u8(0);
    out.put_u32(g.group_id);
    let at = out.len();
    out.put_u16(0);
    out.put_zeros(2);
    out.put_u32(g.command_bucket_id);
    let start = out.len();
    encode_buckets15(g.type_, &g.buckets, out);
    let blen = len16(out.len() - start, "bucket array");
    out.patch_u16(at, blen);
    if let Some(sm) = &g.selection_method {
        encode_selection_method(sm, out);
    }
}

/// `ofp15_bucket`s as OVS writes them: a weight property for select groups (or any
/// non-zero weight), watch properties unless `ANY` (GROUP_MOD and 1.5's GROUP_DESC).
pub(crate) fn encode_buckets15(type_: u8, buckets: &[Bucket], out: &mut Vec<u8>) {
    for b in buckets {
        let bstart = out.len();
        out.put_u16(0);
        out.put_u16(0);
        out.put_u32(b.bucket_id);
        action::encode_actions(&action::to_15(&b.actions), out);
        let alen = len16(out.len() - bstart - 8, "bucket actions");
        out.patch_u16(bstart + 2, alen);
        if type_ == group::TYPE_SELECT || b.weight != 0 {
            out.put_u16(gbpt::WEIGHT);
            out.put_u16(8);
            out.put_u16(b.weight);
            out.put_zeros(2);
        }
        if b.watch_port != port::OFPP_ANY {
            out.put_u16(gbpt::WATCH_PORT);
            out.put_u16(8);
            out.put_u32(b.watch_port);
        }
        if b.watch_group != action::OFPG_ANY {
            out.put_u16(gbpt::WATCH_GROUP);
            out.put_u16(8);
            out.put_u32(b.watch_group);
        }
        let blen = len16(out.len() - bstart, "bucket");
        out.patch_u16(bstart, blen);
    }
}

/// The Netronome selection-method group property (padded to 8).
pub(crate) fn encode_selection_method(sm: &SelectionMethod, out: &mut Vec<u8>) {
    let pstart = out.len();
    out.put_u16(gbpt::EXPERIMENTER);
    out.put_u16(0);
    out.put_u32(sm.experimenter);
    out.put_u32(gbpt::NTRT_SELECTION_METHOD);
    out.put_zeros(4);
    out.put_string(&sm.method, 16);
    out.put_u64(sm.param);
    out.extend_from_slice(&sm.fields);
    let plen = len16(out.len() - pstart, "selection method");
    out.patch_u16(pstart + 2, plen);
    out.pad8_from(pstart);
}

fn decode_group_mod15(r: &mut Reader<'_>) -> Result<Message, OfError> {
    let command = r.u16()?;
    let type_ = r.u8()?;
    r.skip(1)?;
    let group_id = r.u32()?;
    let bucket_array_len = usize::from(r.u16()?);
    r.skip(2)?;
    let command_bucket_id = r.u32()?;
    let err = |code, reason| OfError::new(et::GROUP_MOD_FAILED, code, reason);
    if !matches!(
        command,
        group::ADD | group::MODIFY | group::DELETE | group::INSERT_BUCKET | group::REMOVE_BUCKET
    ) {
        return Err(err(gmfc::BAD_COMMAND, "unknown group-mod command"));
    }
    if type_ > group::TYPE_FF {
        return Err(err(gmfc::BAD_TYPE, "unknown group type"));
    }
    if group_id > OFPG_MAX && !(command == group::DELETE && group_id == OFPG_ALL) {
        return Err(err(gmfc::INVALID_GROUP, "group-mod of a reserved group id"));
    }
    if command_bucket_id > group::BUCKET_MAX
        && !matches!(
            command_bucket_id,
            group::BUCKET_FIRST | group::BUCKET_LAST | group::BUCKET_ALL
        )
    {
        return Err(err(gmfc::BAD_BUCKET, "command_bucket_id out of range"));
    }
    let bad_bucket = err(gmfc::BAD_BUCKET, "bucket length wrong within its group");
    let buckets = decode_buckets15(type_, r.bytes(bucket_array_len).map_err(|_| bad_bucket)?)?;
    let selection_method = decode_group_props15(r.rest())?;
    Ok(Message::GroupMod(GroupMod {
        command,
        type_,
        group_id,
        command_bucket_id,
        selection_method,
        buckets,
    }))
}

/// `ofp15_bucket`s (GROUP_MOD and 1.5's GROUP_DESC reply): each bucket's actions and its
/// weight, watch-port and watch-group properties.
pub(crate) fn decode_buckets15(type_: u8, mut buckets_buf: &[u8]) -> Result<Vec<Bucket>, OfError> {
    let err = |code, reason| OfError::new(et::GROUP_MOD_FAILED, code, reason);
    let bad_bucket = err(gmfc::BAD_BUCKET, "bucket length wrong within its group");
    let mut buckets = Vec::new();
    while !buckets_buf.is_empty() {
        let mut br = Reader::new(buckets_buf, bad_bucket);
        let len = usize::from(br.u16()?);
        let alen = usize::from(br.u16()?);
        let bucket_id = br.u32()?;
        if len < 8 || len % 8 != 0 || len > buckets_buf.len() || 8 + alen > len {
            return Err(bad_bucket);
        }
        if bucket_id > group::BUCKET_MAX {
            return Err(err(gmfc::BAD_BUCKET, "bucket id out of range"));
        }
        let actions = action::decode_actions_15(&buckets_buf[8..8 + alen])?;
        let mut b = Bucket {
            weight: u16::from(type_ == group::TYPE_SELECT),
            watch_port: port::OFPP_ANY,
            watch_group: action::OFPG_ANY,
            bucket_id,
            actions,
        };
        let mut props = &buckets_buf[8 + alen..len];
        while !props.is_empty() {
            let bad_len = OfError::new(et::BAD_PROPERTY, bpc::BAD_LEN, "bucket property length");
            let mut pr = Reader::new(props, bad_len);
            let t = pr.u16()?;
            let plen = usize::from(pr.u16()?);
            if plen != 8 || plen > props.len() {
                return Err(bad_len);
            }
            match t {
                gbpt::WEIGHT => b.weight = pr.u16()?,
                gbpt::WATCH_PORT => b.watch_port = pr.u32()?,
                gbpt::WATCH_GROUP => b.watch_group = pr.u32()?,
                _ => {
                    return Err(OfError::new(
                        et::BAD_PROPERTY,
                        bpc::BAD_TYPE,
                        "unknown bucket property",
                    ))
                }
            }
            props = &props[8..];
        }
        buckets.push(b);
        buckets_buf = &buckets_buf[len..];
    }
    Ok(buckets)
}

/// A 1.5 group's properties after its buckets: the Netronome selection method, at most once.
pub(crate) fn decode_group_props15(mut props: &[u8]) -> Result<Option<SelectionMethod>, OfError> {
    let mut selection_method = None;
    while !props.is_empty() {
        let bad_len = OfError::new(et::BAD_PROPERTY, bpc::BAD_LEN, "group property length");
        let mut pr = Reader::new(props, bad_len);
        let t = pr.u16()?;
        let plen = usize::from(pr.u16()?);
        if plen < 4 || pad8(plen) > props.len() {
            return Err(bad_len);
        }
        if t != gbpt::EXPERIMENTER {
            return Err(OfError::new(
                et::BAD_PROPERTY,
                bpc::BAD_TYPE,
                "unknown group property",
            ));
        }
        let vendor = pr.u32()?;
        let exp_type = pr.u32()?;
        if vendor != NTR_VENDOR_ID && vendor != NTR_COMPAT_VENDOR_ID {
            return Err(OfError::new(
                et::BAD_PROPERTY,
                bpc::BAD_EXPERIMENTER,
                "group property of an unknown experimenter",
            ));
        }
        if exp_type != gbpt::NTRT_SELECTION_METHOD {
            return Err(OfError::new(
                et::BAD_PROPERTY,
                bpc::BAD_EXP_TYPE,
                "unknown Netronome group property",
            ));
        }
        if plen < 40 || selection_method.is_some() {
            return Err(bad_len);
        }
        pr.skip(4)?;
        let method = pr.string(
            16,
            OfError::new(
                et::BAD_PROPERTY,
                bpc::BAD_VALUE,
                "selection method not UTF-8",
            ),
        )?;
        let param = pr.u64()?;
        selection_method = Some(SelectionMethod {
            experimenter: vendor,
            method,
            param,
            fields: props[40..plen].to_vec(),
        });
        props = &props[pad8(plen)..];
    }
    Ok(selection_method)
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
    if !version_free && !(VERSION_1_3..=VERSION_1_5).contains(&h.version) {
        return Err(OfError::request(
            brc::BAD_VERSION,
            "message of a version other than OpenFlow 1.3, 1.4 or 1.5",
        ));
    }
    let v = h.version;
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
        ty::EXPERIMENTER => Message::Experimenter(NxMessage::decode(body)?),
        ty::BUNDLE_CONTROL if v >= VERSION_1_4 => {
            Message::BundleControl(BundleCtrl::decode(&mut r)?)
        }
        ty::BUNDLE_ADD_MESSAGE if v >= VERSION_1_4 => {
            Message::BundleAdd(BundleAdd::decode(&h, &mut r)?)
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
        ty::FLOW_REMOVED if v >= VERSION_1_5 => {
            Message::FlowRemoved(decode_flow_removed15(&mut r, body)?)
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
        ty::PORT_STATUS if v >= VERSION_1_4 => {
            let reason = r.u8()?;
            r.skip(7)?;
            let port = Port::decode14(&mut r)?;
            if !r.is_empty() {
                return Err(BAD_LEN);
            }
            Message::PortStatus { reason, port }
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
        ty::PACKET_OUT if v >= VERSION_1_5 => decode_packet_out15(&mut r)?,
        ty::PACKET_OUT => decode_packet_out(&mut r)?,
        ty::FLOW_MOD => Message::FlowMod(decode_flow_mod(&mut r, v)?),
        ty::GROUP_MOD if v >= VERSION_1_5 => decode_group_mod15(&mut r)?,
        ty::GROUP_MOD => decode_group_mod(&mut r)?,
        ty::PORT_MOD => {
            let port_no = r.u32()?;
            r.skip(4)?;
            let hw_addr = r.array()?;
            r.skip(2)?;
            let config = r.u32()?;
            let mask = r.u32()?;
            let advertise = if v >= VERSION_1_4 {
                decode_port_mod_props(r.rest())?
            } else {
                let a = r.u32()?;
                r.skip(4)?;
                if !r.is_empty() {
                    return Err(BAD_LEN);
                }
                a
            };
            let p = PortMod {
                port_no,
                hw_addr,
                config,
                mask,
                advertise,
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
        ty::MULTIPART_REQUEST => Message::MultipartRequest(MultipartRequest::decode(body, v)?),
        ty::MULTIPART_REPLY => Message::MultipartReply(MultipartReply::decode(body, v)?),
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
        ty::GET_ASYNC_REPLY | ty::SET_ASYNC if v >= VERSION_1_4 => {
            let a = decode_async_props(body)?;
            if h.type_ == ty::SET_ASYNC {
                Message::SetAsync(a)
            } else {
                Message::GetAsyncReply(a)
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
        metadata: Vec::new(),
        actions,
        data: r.rest().to_vec(),
    }))
}

/// OpenFlow 1.5's PACKET_OUT: `in_port` and the other pipeline fields in a match (OVS's
/// `ofputil_decode_packet_out`: no in_port → `OFPBRC_BAD_PORT`, a field that is not a
/// pipeline field → `OFPBRC_PIPELINE_FIELDS_ONLY`).
fn decode_packet_out15(r: &mut Reader<'_>) -> Result<Message, OfError> {
    let buffer_id = r.u32()?;
    let actions_len = usize::from(r.u16()?);
    r.skip(2)?;
    let fields = decode_pipeline_match(r)?;
    let actions = action::decode_actions_15(r.bytes(actions_len)?)?;
    let mut in_port = None;
    let mut metadata = Vec::new();
    for o in fields {
        match o.field {
            Field::InPort => in_port = Some(o.value_u128() as u32),
            Field::Metadata | Field::TunnelId | Field::TunIpv4Src | Field::TunIpv4Dst => {
                metadata.push(o)
            }
            _ => {
                return Err(OfError::request(
                    brc::PIPELINE_FIELDS_ONLY,
                    "packet-out match with other than pipeline fields",
                ))
            }
        }
    }
    let bad_port = OfError::request(brc::BAD_PORT, "packet-out from an invalid in_port");
    let in_port = in_port.ok_or(bad_port)?;
    if in_port == 0
        || (in_port > port::OFPP_MAX
            && !matches!(
                in_port,
                port::OFPP_LOCAL | port::OFPP_CONTROLLER | port::OFPP_ANY
            ))
    {
        return Err(bad_port);
    }
    Ok(Message::PacketOut(PacketOut {
        buffer_id,
        in_port,
        metadata,
        actions,
        data: r.rest().to_vec(),
    }))
}

/// A PACKET_OUT's match (1.5): its TLVs, each checked, none twice, without the
/// prerequisite check (pipeline fields have none; the caller refuses the others).
fn decode_pipeline_match(r: &mut Reader<'_>) -> Result<Vec<Oxm>, OfError> {
    use crate::error::bmc;
    let short = OfError::matching(bmc::BAD_LEN, "match runs past the message");
    let type_ = r.u16()?;
    let len = usize::from(r.u16()?);
    if type_ != 1 {
        return Err(OfError::matching(
            bmc::BAD_TYPE,
            "match is not of type OFPMT_OXM",
        ));
    }
    if len < 4 || pad8(len) - 4 > r.remaining() {
        return Err(short);
    }
    let mut body = r.bytes(len - 4)?;
    r.skip(pad8(len) - len)?;
    let mut out: Vec<Oxm> = Vec::new();
    while !body.is_empty() {
        // OVS reads this match loosely (`oxm_pull_match_loose`): a TLV without a value
        // (its samples pad the match with one) is skipped; anything else is checked.
        if body.len() >= 4 && body[3] == 0 {
            body = &body[4..];
            continue;
        }
        let (o, used) = Oxm::decode(body)?;
        if out.iter().any(|x| x.field == o.field) {
            return Err(OfError::matching(
                bmc::DUP_FIELD,
                "a match field appears twice",
            ));
        }
        out.push(o);
        body = &body[used..];
    }
    Ok(out)
}

/// OpenFlow 1.4's PORT_MOD properties: the Ethernet one (`advertise`) at most once.
fn decode_port_mod_props(mut p: &[u8]) -> Result<u32, OfError> {
    let bad_len = OfError::new(et::BAD_PROPERTY, bpc::BAD_LEN, "port-mod property length");
    let mut advertise = 0;
    while !p.is_empty() {
        let mut r = Reader::new(p, bad_len);
        let t = r.u16()?;
        let len = usize::from(r.u16()?);
        if len < 4 || pad8(len) > p.len() {
            return Err(bad_len);
        }
        match (t, len) {
            (0, 8) => advertise = r.u32()?,
            (0, _) => return Err(bad_len),
            _ => {
                return Err(OfError::new(
                    et::BAD_PROPERTY,
                    bpc::BAD_TYPE,
                    "port-mod property not supported",
                ))
            }
        }
        p = &p[pad8(len)..];
    }
    Ok(advertise)
}

/// OpenFlow 1.4's asynchronous configuration properties (`OFPACPT_*`, each 8 bytes: type,
/// length, mask). Role-status, table-status and request-forward masks (types 6 to 11) are
/// accepted and not kept (ferrovs sends none of those messages); experimenter ones are
/// `OFPBPC_BAD_EXPERIMENTER`, others `OFPBPC_BAD_TYPE`.
fn decode_async_props(mut p: &[u8]) -> Result<AsyncConfig, OfError> {
    let bad_len = OfError::new(et::BAD_PROPERTY, bpc::BAD_LEN, "async property length");
    let mut a = AsyncConfig::default();
    while !p.is_empty() {
        let mut r = Reader::new(p, bad_len);
        let t = r.u16()?;
        let len = usize::from(r.u16()?);
        if t >= 0xfffe {
            return Err(OfError::new(
                et::BAD_PROPERTY,
                bpc::BAD_EXPERIMENTER,
                "experimenter async property",
            ));
        }
        if len != 8 || p.len() < 8 {
            return Err(bad_len);
        }
        let mask = r.u32()?;
        // Even types are the slave's (index 1), odd the master's (index 0).
        let role = if t % 2 == 0 { 1 } else { 0 };
        match t / 2 {
            0 => a.packet_in_mask[role] = mask,
            1 => a.port_status_mask[role] = mask,
            2 => a.flow_removed_mask[role] = mask,
            3..=5 => {}
            _ => {
                return Err(OfError::new(
                    et::BAD_PROPERTY,
                    bpc::BAD_TYPE,
                    "unknown async property",
                ))
            }
        }
        p = &p[8..];
    }
    Ok(a)
}

fn flow_mod_err(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::FLOW_MOD_FAILED, code, reason)
}

fn decode_flow_mod(r: &mut Reader<'_>, version: u8) -> Result<FlowMod, OfError> {
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
        importance: 0,
        match_: Match::new(),
        instructions: Vec::new(),
    };
    let importance = r.u16()?;
    if version >= VERSION_1_4 {
        f.importance = importance;
    }
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
    f.instructions = if version >= VERSION_1_5 {
        action::decode_instructions_15(&rest[used..])?
    } else {
        action::decode_instructions(&rest[used..])?
    };
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
        command_bucket_id: group::BUCKET_ALL,
        selection_method: None,
        buckets,
    }))
}
