//! `OFPT_MULTIPART_REQUEST` / `OFPT_MULTIPART_REPLY` bodies, and the splitting of a long
//! reply over several messages (`OFPMPF_REPLY_MORE` on all but the last).
//!
//! Requests for queue statistics and experimenter multiparts are refused
//! (`OFPBRC_BAD_MULTIPART`, `OFPBRC_BAD_EXPERIMENTER`); a TABLE_FEATURES request must have an
//! empty body (reading the features; setting them is `OFPTFFC_EPERM`).

use crate::action::{self, Instruction};
use crate::error::{brc, et, tffc, OfError};
use crate::message::{decode_bands, decode_buckets, Bucket, MeterBand};
use crate::oxm::Match;
use crate::port::{Port, PORT_LEN};
use crate::wire::{len16, Put, Reader};
use crate::{HEADER_LEN, MAX_MESSAGE_LEN};

/// `OFPMP_*` multipart types.
pub mod mp {
    pub const DESC: u16 = 0;
    pub const FLOW: u16 = 1;
    pub const AGGREGATE: u16 = 2;
    pub const TABLE: u16 = 3;
    pub const PORT_STATS: u16 = 4;
    pub const QUEUE: u16 = 5;
    pub const GROUP: u16 = 6;
    pub const GROUP_DESC: u16 = 7;
    pub const GROUP_FEATURES: u16 = 8;
    pub const METER: u16 = 9;
    pub const METER_CONFIG: u16 = 10;
    pub const METER_FEATURES: u16 = 11;
    pub const TABLE_FEATURES: u16 = 12;
    pub const PORT_DESC: u16 = 13;
    pub const EXPERIMENTER: u16 = 0xffff;
}

/// `OFPMPF_REQ_MORE` / `OFPMPF_REPLY_MORE`: more messages of this multipart follow.
pub const OFPMPF_MORE: u16 = 1;

/// A FLOW or AGGREGATE request's filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlowStatsRequest {
    /// Table, or `OFPTT_ALL`.
    pub table_id: u8,
    /// Output port filter, or `OFPP_ANY`.
    pub out_port: u32,
    /// Output group filter, or `OFPG_ANY`.
    pub out_group: u32,
    /// Cookie the flows must have (under `cookie_mask`).
    pub cookie: u64,
    /// Which cookie bits must match.
    pub cookie_mask: u64,
    /// Match the flows must be within.
    pub match_: Match,
}

/// What a multipart request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum MultipartRequestBody {
    Desc,
    Flow(FlowStatsRequest),
    Aggregate(FlowStatsRequest),
    Table,
    /// `OFPP_ANY` for every port.
    PortStats {
        port_no: u32,
    },
    PortDesc,
    /// `OFPG_ALL` for every group.
    Group {
        group_id: u32,
    },
    GroupDesc,
    GroupFeatures,
    /// `OFPM_ALL` for every meter.
    Meter {
        meter_id: u32,
    },
    MeterConfig {
        meter_id: u32,
    },
    MeterFeatures,
    TableFeatures,
}

/// `OFPT_MULTIPART_REQUEST`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MultipartRequest {
    /// `OFPMPF_REQ_MORE`.
    pub flags: u16,
    /// What it asks for.
    pub body: MultipartRequestBody,
}

/// `ofp_desc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Desc {
    /// Manufacturer (255 bytes at most).
    pub mfr_desc: String,
    /// Hardware.
    pub hw_desc: String,
    /// Software.
    pub sw_desc: String,
    /// Serial number (31 bytes at most).
    pub serial_num: String,
    /// Which datapath.
    pub dp_desc: String,
}

/// `ofp_flow_stats`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct FlowStats {
    pub table_id: u8,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub priority: u16,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub flags: u16,
    pub cookie: u64,
    pub packet_count: u64,
    pub byte_count: u64,
    pub match_: Match,
    pub instructions: Vec<Instruction>,
}

/// `ofp_aggregate_stats_reply`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct AggregateStats {
    pub packet_count: u64,
    pub byte_count: u64,
    pub flow_count: u32,
}

/// `ofp_table_stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct TableStats {
    pub table_id: u8,
    pub active_count: u32,
    pub lookup_count: u64,
    pub matched_count: u64,
}

/// `ofp_port_stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct PortStats {
    pub port_no: u32,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_frame_err: u64,
    pub rx_over_err: u64,
    pub rx_crc_err: u64,
    pub collisions: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
}

/// A bucket's or band's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counter {
    /// Packets.
    pub packet_count: u64,
    /// Bytes.
    pub byte_count: u64,
}

/// `ofp_group_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct GroupStats {
    pub group_id: u32,
    pub ref_count: u32,
    pub packet_count: u64,
    pub byte_count: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub bucket_stats: Vec<Counter>,
}

/// `ofp_group_desc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct GroupDesc {
    pub type_: u8,
    pub group_id: u32,
    pub buckets: Vec<Bucket>,
    /// OpenFlow 1.5: the selection method property (written in 1.5 replies only).
    pub selection_method: Option<crate::message::SelectionMethod>,
}

/// `ofp_group_features`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GroupFeatures {
    /// Bitmap of `OFPGT_*` supported.
    pub types: u32,
    /// `OFPGFC_*` bits.
    pub capabilities: u32,
    /// Maximum groups per type.
    pub max_groups: [u32; 4],
    /// Bitmaps of `OFPAT_*` supported per type.
    pub actions: [u32; 4],
}

/// `ofp_meter_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct MeterStats {
    pub meter_id: u32,
    pub flow_count: u32,
    pub packet_in_count: u64,
    pub byte_in_count: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub band_stats: Vec<Counter>,
}

/// `ofp_meter_config`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct MeterConfig {
    pub flags: u16,
    pub meter_id: u32,
    pub bands: Vec<MeterBand>,
}

/// `ofp_meter_features`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct MeterFeatures {
    pub max_meter: u32,
    /// Bitmap of `1 << OFPMBT_*`.
    pub band_types: u32,
    /// `OFPMF_*` bits.
    pub capabilities: u32,
    pub max_bands: u8,
    pub max_color: u8,
}

/// One table-feature property (`ofp_table_feature_prop_*`), kept as its type and the
/// bytes after its 4-byte header (padding excluded).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableFeatureProp {
    /// `OFPTFPT_*`.
    pub type_: u16,
    /// Body.
    pub data: Vec<u8>,
}

/// `OFPTFPT_*`: table-feature property types (each `_MISS` variant is the next number).
pub mod tfpt {
    pub const INSTRUCTIONS: u16 = 0;
    pub const NEXT_TABLES: u16 = 2;
    pub const WRITE_ACTIONS: u16 = 4;
    pub const APPLY_ACTIONS: u16 = 6;
    pub const MATCH: u16 = 8;
    pub const WILDCARDS: u16 = 10;
    pub const WRITE_SETFIELD: u16 = 12;
    pub const APPLY_SETFIELD: u16 = 14;
}

impl TableFeatureProp {
    /// `OFPTFPT_INSTRUCTIONS` (or `_MISS`): the `OFPIT_*` types the table takes.
    pub fn instructions(type_: u16, instructions: &[u16]) -> TableFeatureProp {
        let mut data = Vec::new();
        for &i in instructions {
            data.put_u16(i);
            data.put_u16(4);
        }
        TableFeatureProp { type_, data }
    }

    /// `OFPTFPT_NEXT_TABLES` (or `_MISS`): the tables a goto may name.
    pub fn next_tables(type_: u16, tables: &[u8]) -> TableFeatureProp {
        TableFeatureProp {
            type_,
            data: tables.to_vec(),
        }
    }

    /// `OFPTFPT_WRITE_ACTIONS` / `APPLY_ACTIONS` (or `_MISS`): `OFPAT_*` types.
    pub fn actions(type_: u16, actions: &[u16]) -> TableFeatureProp {
        Self::instructions(type_, actions)
    }

    /// `OFPTFPT_MATCH`, `WILDCARDS`, `WRITE_SETFIELD`, `APPLY_SETFIELD` (or `_MISS`): OXM
    /// headers of `fields` (with the has-mask bit where `masked` and the field allows it).
    pub fn oxm_ids(type_: u16, fields: &[crate::oxm::Field], masked: bool) -> TableFeatureProp {
        let mut data = Vec::new();
        for f in fields {
            let i = f.info();
            let m = masked && i.maskable;
            let len = u32::from(i.len) * if m { 2 } else { 1 };
            data.put_u32(
                (u32::from(i.class) << 16) | (u32::from(i.code) << 9) | (u32::from(m) << 8) | len,
            );
        }
        TableFeatureProp { type_, data }
    }
}

/// `ofp_table_features`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct TableFeatures {
    pub table_id: u8,
    /// At most 31 bytes.
    pub name: String,
    pub metadata_match: u64,
    pub metadata_write: u64,
    pub config: u32,
    pub max_entries: u32,
    pub properties: Vec<TableFeatureProp>,
}

/// What a multipart reply carries. A list may be split over several messages by
/// [`encode_multipart_reply`]; each decoded message carries its own part.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum MultipartReplyBody {
    Desc(Desc),
    Flow(Vec<FlowStats>),
    Aggregate(AggregateStats),
    Table(Vec<TableStats>),
    PortStats(Vec<PortStats>),
    PortDesc(Vec<Port>),
    Group(Vec<GroupStats>),
    GroupDesc(Vec<GroupDesc>),
    GroupFeatures(GroupFeatures),
    Meter(Vec<MeterStats>),
    MeterConfig(Vec<MeterConfig>),
    MeterFeatures(MeterFeatures),
    TableFeatures(Vec<TableFeatures>),
}

/// `OFPT_MULTIPART_REPLY`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MultipartReply {
    /// `OFPMPF_REPLY_MORE`.
    pub flags: u16,
    /// The reply.
    pub body: MultipartReplyBody,
}

const BAD_LEN: OfError = OfError::request(brc::BAD_LEN, "multipart body length wrong for its type");

fn exact(body: &[u8], n: usize) -> Result<(), OfError> {
    if body.len() == n {
        Ok(())
    } else {
        Err(BAD_LEN)
    }
}

impl MultipartRequestBody {
    /// The `OFPMP_*` type.
    pub fn type_(&self) -> u16 {
        use MultipartRequestBody as B;
        match self {
            B::Desc => mp::DESC,
            B::Flow(_) => mp::FLOW,
            B::Aggregate(_) => mp::AGGREGATE,
            B::Table => mp::TABLE,
            B::PortStats { .. } => mp::PORT_STATS,
            B::PortDesc => mp::PORT_DESC,
            B::Group { .. } => mp::GROUP,
            B::GroupDesc => mp::GROUP_DESC,
            B::GroupFeatures => mp::GROUP_FEATURES,
            B::Meter { .. } => mp::METER,
            B::MeterConfig { .. } => mp::METER_CONFIG,
            B::MeterFeatures => mp::METER_FEATURES,
            B::TableFeatures => mp::TABLE_FEATURES,
        }
    }
}

fn decode_multipart_type(type_: u16) -> Result<(), OfError> {
    match type_ {
        mp::EXPERIMENTER => Err(OfError::request(
            brc::BAD_EXPERIMENTER,
            "experimenter multipart messages are not supported",
        )),
        mp::DESC..=mp::PORT_DESC if type_ != mp::QUEUE => Ok(()),
        _ => Err(OfError::request(
            brc::BAD_MULTIPART,
            "multipart type not supported",
        )),
    }
}

impl MultipartRequest {
    pub(crate) fn encode(&self, out: &mut Vec<u8>, version: u8) {
        use MultipartRequestBody as B;
        out.put_u16(self.body.type_());
        out.put_u16(self.flags);
        out.put_zeros(4);
        match &self.body {
            B::PortDesc if version >= crate::VERSION_1_5 => {
                out.put_u32(crate::port::OFPP_ANY);
                out.put_zeros(4);
            }
            // ofp15_group_desc_request: group_id (every group: ALL), 4 pad.
            B::GroupDesc if version >= crate::VERSION_1_5 => {
                out.put_u32(crate::action::OFPG_ALL);
                out.put_zeros(4);
            }
            B::Flow(f) | B::Aggregate(f) => {
                out.put_u8(f.table_id);
                out.put_zeros(3);
                out.put_u32(f.out_port);
                out.put_u32(f.out_group);
                out.put_zeros(4);
                out.put_u64(f.cookie);
                out.put_u64(f.cookie_mask);
                f.match_.encode(out);
                if version >= crate::VERSION_1_5 && matches!(self.body, B::Aggregate(_)) {
                    // 1.5: the statistics asked for, as OVS asks (zero values).
                    crate::message::oxs::put(
                        out,
                        &crate::message::oxs::Stats {
                            duration: None,
                            packet_count: Some(0),
                            byte_count: Some(0),
                            flow_count: Some(0),
                        },
                    );
                }
            }
            B::PortStats { port_no: id }
            | B::Group { group_id: id }
            | B::Meter { meter_id: id }
            | B::MeterConfig { meter_id: id } => {
                out.put_u32(*id);
                out.put_zeros(4);
            }
            _ => {}
        }
    }

    /// Decodes a request of wire version `version`. In 1.4 and 1.5 the reply to
    /// PORT_STATS has a layout this codec does not write yet: that request is
    /// `OFPBRC_BAD_MULTIPART` there.
    pub(crate) fn decode(body: &[u8], version: u8) -> Result<MultipartRequest, OfError> {
        use MultipartRequestBody as B;
        let mut r = Reader::new(body, BAD_LEN);
        let type_ = r.u16()?;
        let flags = r.u16()?;
        r.skip(4)?;
        decode_multipart_type(type_)?;
        let unwritten = match type_ {
            mp::PORT_STATS => version >= crate::VERSION_1_4,
            _ => false,
        };
        if unwritten {
            return Err(OfError::request(
                brc::BAD_MULTIPART,
                "this multipart type's OpenFlow 1.4/1.5 reply is not supported yet",
            ));
        }
        if type_ == mp::PORT_DESC && version >= crate::VERSION_1_5 {
            // ofp15_port_desc_request: port_no, 4 pad. One port only is not supported.
            exact(&body[8..], 8)?;
            let port = u32::from_be_bytes([body[8], body[9], body[10], body[11]]);
            if port != crate::port::OFPP_ANY {
                return Err(OfError::request(
                    brc::BAD_PORT,
                    "port description of one port is not supported",
                ));
            }
            return Ok(MultipartRequest {
                flags,
                body: B::PortDesc,
            });
        }
        let rest = &body[8..];
        let id = |rest: &[u8]| -> Result<u32, OfError> {
            exact(rest, 8)?;
            Ok(u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]))
        };
        let b = match type_ {
            mp::DESC => exact(rest, 0).map(|_| B::Desc)?,
            mp::TABLE => exact(rest, 0).map(|_| B::Table)?,
            mp::PORT_DESC => exact(rest, 0).map(|_| B::PortDesc)?,
            // 1.5 names a group (or ALL); every group is described whichever it names.
            mp::GROUP_DESC if version >= crate::VERSION_1_5 => id(rest).map(|_| B::GroupDesc)?,
            mp::GROUP_DESC => exact(rest, 0).map(|_| B::GroupDesc)?,
            mp::GROUP_FEATURES => exact(rest, 0).map(|_| B::GroupFeatures)?,
            mp::METER_FEATURES => exact(rest, 0).map(|_| B::MeterFeatures)?,
            mp::TABLE_FEATURES => {
                if !rest.is_empty() {
                    return Err(OfError::new(
                        et::TABLE_FEATURES_FAILED,
                        tffc::EPERM,
                        "setting table features is not supported",
                    ));
                }
                B::TableFeatures
            }
            mp::PORT_STATS => B::PortStats { port_no: id(rest)? },
            mp::GROUP => B::Group {
                group_id: id(rest)?,
            },
            mp::METER => B::Meter {
                meter_id: id(rest)?,
            },
            mp::METER_CONFIG => B::MeterConfig {
                meter_id: id(rest)?,
            },
            _ => {
                // FLOW or AGGREGATE.
                let mut r = Reader::new(rest, BAD_LEN);
                let table_id = r.u8()?;
                r.skip(3)?;
                let out_port = r.u32()?;
                let out_group = r.u32()?;
                r.skip(4)?;
                let cookie = r.u64()?;
                let cookie_mask = r.u64()?;
                let (match_, used) = Match::decode(r.rest())?;
                if version >= crate::VERSION_1_5 && type_ == mp::AGGREGATE && rest.len() > 32 + used
                {
                    // 1.5: then, optionally (ovs-ofctl 3.1 sends none), the statistics asked
                    // for (all are answered).
                    let (_, sused) = crate::message::oxs::pull(&rest[32 + used..])?;
                    exact(&rest[32..], used + sused)?;
                } else {
                    exact(&rest[32..], used)?;
                }
                let f = FlowStatsRequest {
                    table_id,
                    out_port,
                    out_group,
                    cookie,
                    cookie_mask,
                    match_,
                };
                if type_ == mp::FLOW {
                    B::Flow(f)
                } else {
                    B::Aggregate(f)
                }
            }
        };
        Ok(MultipartRequest { flags, body: b })
    }
}

impl MultipartReplyBody {
    /// The `OFPMP_*` type.
    pub fn type_(&self) -> u16 {
        use MultipartReplyBody as B;
        match self {
            B::Desc(_) => mp::DESC,
            B::Flow(_) => mp::FLOW,
            B::Aggregate(_) => mp::AGGREGATE,
            B::Table(_) => mp::TABLE,
            B::PortStats(_) => mp::PORT_STATS,
            B::PortDesc(_) => mp::PORT_DESC,
            B::Group(_) => mp::GROUP,
            B::GroupDesc(_) => mp::GROUP_DESC,
            B::GroupFeatures(_) => mp::GROUP_FEATURES,
            B::Meter(_) => mp::METER,
            B::MeterConfig(_) => mp::METER_CONFIG,
            B::MeterFeatures(_) => mp::METER_FEATURES,
            B::TableFeatures(_) => mp::TABLE_FEATURES,
        }
    }

    /// The body's entries in wire version `version`, each encoded on its own (a fixed
    /// body is one entry).
    fn entries_for(&self, version: u8) -> Vec<Vec<u8>> {
        use MultipartReplyBody as B;
        fn each<T>(v: &[T], f: impl Fn(&T, &mut Vec<u8>)) -> Vec<Vec<u8>> {
            v.iter()
                .map(|x| {
                    let mut o = Vec::new();
                    f(x, &mut o);
                    o
                })
                .collect()
        }
        let one = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut o = Vec::new();
            f(&mut o);
            vec![o]
        };
        match self {
            B::Desc(d) => one(&|o| {
                o.put_string(&d.mfr_desc, 256);
                o.put_string(&d.hw_desc, 256);
                o.put_string(&d.sw_desc, 256);
                o.put_string(&d.serial_num, 32);
                o.put_string(&d.dp_desc, 256);
            }),
            B::Aggregate(a) if version >= crate::VERSION_1_5 => one(&|o| {
                crate::message::oxs::put(
                    o,
                    &crate::message::oxs::Stats {
                        duration: None,
                        packet_count: Some(a.packet_count),
                        byte_count: Some(a.byte_count),
                        flow_count: Some(a.flow_count),
                    },
                )
            }),
            B::Aggregate(a) => one(&|o| {
                o.put_u64(a.packet_count);
                o.put_u64(a.byte_count);
                o.put_u32(a.flow_count);
                o.put_zeros(4);
            }),
            B::GroupFeatures(g) => one(&|o| {
                o.put_u32(g.types);
                o.put_u32(g.capabilities);
                for v in g.max_groups.iter().chain(&g.actions) {
                    o.put_u32(*v);
                }
            }),
            B::MeterFeatures(m) => one(&|o| {
                o.put_u32(m.max_meter);
                o.put_u32(m.band_types);
                o.put_u32(m.capabilities);
                o.put_u8(m.max_bands);
                o.put_u8(m.max_color);
                o.put_zeros(2);
            }),
            B::Flow(v) if version >= crate::VERSION_1_5 => each(v, |f, o| {
                // ofp15_flow_desc: length, 2 pad, table, reason (stats request), priority,
                // timeouts, flags, importance, cookie; match, OXS statistics, instructions.
                o.put_u16(0);
                o.put_zeros(2);
                o.put_u8(f.table_id);
                o.put_u8(0);
                o.put_u16(f.priority);
                o.put_u16(f.idle_timeout);
                o.put_u16(f.hard_timeout);
                o.put_u16(f.flags);
                o.put_u16(0);
                o.put_u64(f.cookie);
                f.match_.encode(o);
                crate::message::oxs::put(
                    o,
                    &crate::message::oxs::Stats {
                        duration: Some((f.duration_sec, f.duration_nsec)),
                        packet_count: Some(f.packet_count),
                        byte_count: Some(f.byte_count),
                        flow_count: None,
                    },
                );
                let insts: Vec<action::Instruction> = f
                    .instructions
                    .iter()
                    .map(|i| match i {
                        action::Instruction::ApplyActions(a) => {
                            action::Instruction::ApplyActions(action::to_15(a))
                        }
                        action::Instruction::WriteActions(a) => {
                            action::Instruction::WriteActions(action::to_15(a))
                        }
                        other => other.clone(),
                    })
                    .collect();
                action::encode_instructions(&insts, o);
                let len = len16(o.len(), "flow stats entry");
                o.patch_u16(0, len);
            }),
            B::Flow(v) => each(v, |f, o| {
                o.put_u16(0);
                o.put_u8(f.table_id);
                o.put_u8(0);
                o.put_u32(f.duration_sec);
                o.put_u32(f.duration_nsec);
                o.put_u16(f.priority);
                o.put_u16(f.idle_timeout);
                o.put_u16(f.hard_timeout);
                o.put_u16(f.flags);
                o.put_zeros(4);
                o.put_u64(f.cookie);
                o.put_u64(f.packet_count);
                o.put_u64(f.byte_count);
                f.match_.encode(o);
                action::encode_instructions(&f.instructions, o);
                let len = len16(o.len(), "flow stats entry");
                o.patch_u16(0, len);
            }),
            B::Table(v) => each(v, |t, o| {
                o.put_u8(t.table_id);
                o.put_zeros(3);
                o.put_u32(t.active_count);
                o.put_u64(t.lookup_count);
                o.put_u64(t.matched_count);
            }),
            B::PortStats(v) => each(v, |p, o| {
                o.put_u32(p.port_no);
                o.put_zeros(4);
                for c in [
                    p.rx_packets,
                    p.tx_packets,
                    p.rx_bytes,
                    p.tx_bytes,
                    p.rx_dropped,
                    p.tx_dropped,
                    p.rx_errors,
                    p.tx_errors,
                    p.rx_frame_err,
                    p.rx_over_err,
                    p.rx_crc_err,
                    p.collisions,
                ] {
                    o.put_u64(c);
                }
                o.put_u32(p.duration_sec);
                o.put_u32(p.duration_nsec);
            }),
            B::PortDesc(v) if version >= crate::VERSION_1_4 => each(v, |p, o| p.encode14(o)),
            B::PortDesc(v) => each(v, |p, o| p.encode(o)),
            B::Group(v) => each(v, |g, o| {
                o.put_u16(0);
                o.put_zeros(2);
                o.put_u32(g.group_id);
                o.put_u32(g.ref_count);
                o.put_zeros(4);
                o.put_u64(g.packet_count);
                o.put_u64(g.byte_count);
                o.put_u32(g.duration_sec);
                o.put_u32(g.duration_nsec);
                for c in &g.bucket_stats {
                    o.put_u64(c.packet_count);
                    o.put_u64(c.byte_count);
                }
                let len = len16(o.len(), "group stats entry");
                o.patch_u16(0, len);
            }),
            B::GroupDesc(v) if version >= crate::VERSION_1_5 => each(v, |g, o| {
                // ofp15_group_desc: length, type, pad, group_id, bucket_list_len, 6 pad,
                // ofp15_buckets, then the group's properties.
                o.put_u16(0);
                o.put_u8(g.type_);
                o.put_u8(0);
                o.put_u32(g.group_id);
                o.put_u16(0);
                o.put_zeros(6);
                crate::message::encode_buckets15(g.type_, &g.buckets, o);
                let blen = len16(o.len() - 16, "group desc buckets");
                o.patch_u16(8, blen);
                if let Some(sm) = &g.selection_method {
                    crate::message::encode_selection_method(sm, o);
                }
                let len = len16(o.len(), "group desc entry");
                o.patch_u16(0, len);
            }),
            B::GroupDesc(v) => each(v, |g, o| {
                o.put_u16(0);
                o.put_u8(g.type_);
                o.put_u8(0);
                o.put_u32(g.group_id);
                for b in &g.buckets {
                    b.encode(o);
                }
                let len = len16(o.len(), "group desc entry");
                o.patch_u16(0, len);
            }),
            B::Meter(v) => each(v, |m, o| {
                o.put_u32(m.meter_id);
                o.put_u16(0);
                o.put_zeros(6);
                o.put_u32(m.flow_count);
                o.put_u64(m.packet_in_count);
                o.put_u64(m.byte_in_count);
                o.put_u32(m.duration_sec);
                o.put_u32(m.duration_nsec);
                for c in &m.band_stats {
                    o.put_u64(c.packet_count);
                    o.put_u64(c.byte_count);
                }
                let len = len16(o.len(), "meter stats entry");
                o.patch_u16(4, len);
            }),
            B::MeterConfig(v) => each(v, |m, o| {
                o.put_u16(0);
                o.put_u16(m.flags);
                o.put_u32(m.meter_id);
                for b in &m.bands {
                    b.encode(o);
                }
                let len = len16(o.len(), "meter config entry");
                o.patch_u16(0, len);
            }),
            B::TableFeatures(v) => each(v, |t, o| {
                o.put_u16(0);
                o.put_u8(t.table_id);
                o.put_zeros(5);
                o.put_string(&t.name, 32);
                o.put_u64(t.metadata_match);
                o.put_u64(t.metadata_write);
                o.put_u32(t.config);
                o.put_u32(t.max_entries);
                for p in &t.properties {
                    let start = o.len();
                    o.put_u16(p.type_);
                    o.put_u16(len16(4 + p.data.len(), "table feature property"));
                    o.extend_from_slice(&p.data);
                    o.pad8_from(start);
                }
                let len = len16(o.len(), "table features entry");
                o.patch_u16(0, len);
            }),
        }
    }

    /// Whether the body is a list (which a long reply splits between entries).
    fn is_list(&self) -> bool {
        use MultipartReplyBody as B;
        !matches!(
            self,
            B::Desc(_) | B::Aggregate(_) | B::GroupFeatures(_) | B::MeterFeatures(_)
        )
    }
}

impl MultipartReply {
    pub(crate) fn encode(&self, out: &mut Vec<u8>, version: u8) {
        out.put_u16(self.body.type_());
        out.put_u16(self.flags);
        out.put_zeros(4);
        for e in self.body.entries_for(version) {
            out.extend_from_slice(&e);
        }
    }

    pub(crate) fn decode(body: &[u8], version: u8) -> Result<MultipartReply, OfError> {
        use MultipartReplyBody as B;
        let mut r = Reader::new(body, BAD_LEN);
        let type_ = r.u16()?;
        let flags = r.u16()?;
        r.skip(4)?;
        decode_multipart_type(type_)?;
        let rest = &body[8..];
        let mut r = Reader::new(rest, BAD_LEN);
        let string = |r: &mut Reader<'_>, n| {
            r.string(n, OfError::request(brc::EPERM, "description is not UTF-8"))
        };
        let b = match type_ {
            mp::DESC => {
                exact(rest, 1056)?;
                B::Desc(Desc {
                    mfr_desc: string(&mut r, 256)?,
                    hw_desc: string(&mut r, 256)?,
                    sw_desc: string(&mut r, 256)?,
                    serial_num: string(&mut r, 32)?,
                    dp_desc: string(&mut r, 256)?,
                })
            }
            mp::AGGREGATE if version >= crate::VERSION_1_5 => {
                let (s, used) = crate::message::oxs::pull(rest)?;
                exact(rest, used)?;
                B::Aggregate(AggregateStats {
                    packet_count: s.packet_count.unwrap_or(0),
                    byte_count: s.byte_count.unwrap_or(0),
                    flow_count: s.flow_count.unwrap_or(0),
                })
            }
            mp::AGGREGATE => {
                exact(rest, 24)?;
                B::Aggregate(AggregateStats {
                    packet_count: r.u64()?,
                    byte_count: r.u64()?,
                    flow_count: r.u32()?,
                })
            }
            mp::GROUP_FEATURES => {
                exact(rest, 40)?;
                B::GroupFeatures(GroupFeatures {
                    types: r.u32()?,
                    capabilities: r.u32()?,
                    max_groups: [r.u32()?, r.u32()?, r.u32()?, r.u32()?],
                    actions: [r.u32()?, r.u32()?, r.u32()?, r.u32()?],
                })
            }
            mp::METER_FEATURES => {
                exact(rest, 16)?;
                B::MeterFeatures(MeterFeatures {
                    max_meter: r.u32()?,
                    band_types: r.u32()?,
                    capabilities: r.u32()?,
                    max_bands: r.u8()?,
                    max_color: r.u8()?,
                })
            }
            mp::TABLE => B::Table(fixed_entries(rest, 24, |r| {
                let table_id = r.u8()?;
                r.skip(3)?;
                Ok(TableStats {
                    table_id,
                    active_count: r.u32()?,
                    lookup_count: r.u64()?,
                    matched_count: r.u64()?,
                })
            })?),
            mp::PORT_STATS => B::PortStats(fixed_entries(rest, 112, |r| {
                let port_no = r.u32()?;
                r.skip(4)?;
                Ok(PortStats {
                    port_no,
                    rx_packets: r.u64()?,
                    tx_packets: r.u64()?,
                    rx_bytes: r.u64()?,
                    tx_bytes: r.u64()?,
                    rx_dropped: r.u64()?,
                    tx_dropped: r.u64()?,
                    rx_errors: r.u64()?,
                    tx_errors: r.u64()?,
                    rx_frame_err: r.u64()?,
                    rx_over_err: r.u64()?,
                    rx_crc_err: r.u64()?,
                    collisions: r.u64()?,
                    duration_sec: r.u32()?,
                    duration_nsec: r.u32()?,
                })
            })?),
            mp::PORT_DESC if version >= crate::VERSION_1_4 => {
                B::PortDesc(var_entries(rest, 4, 40, |e| {
                    let mut r = Reader::new(e, BAD_LEN);
                    Port::decode14(&mut r)
                })?)
            }
            mp::PORT_DESC => B::PortDesc(fixed_entries(rest, PORT_LEN, Port::decode)?),
            mp::FLOW if version >= crate::VERSION_1_5 => B::Flow(var_entries(rest, 0, 24, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                r.skip(4)?;
                let table_id = r.u8()?;
                r.skip(1)?;
                let priority = r.u16()?;
                let idle_timeout = r.u16()?;
                let hard_timeout = r.u16()?;
                let flags = r.u16()?;
                r.skip(2)?;
                let cookie = r.u64()?;
                let (match_, used) = Match::decode(&e[24..])?;
                let (s, sused) = crate::message::oxs::pull(&e[24 + used..])?;
                let (duration_sec, duration_nsec) = s.duration.unwrap_or((0, 0));
                Ok(FlowStats {
                    table_id,
                    duration_sec,
                    duration_nsec,
                    priority,
                    idle_timeout,
                    hard_timeout,
                    flags,
                    cookie,
                    packet_count: s.packet_count.unwrap_or(0),
                    byte_count: s.byte_count.unwrap_or(0),
                    match_,
                    instructions: action::decode_instructions(&e[24 + used + sused..])?,
                })
            })?),
            mp::FLOW => B::Flow(var_entries(rest, 0, 56, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                r.skip(2)?;
                let table_id = r.u8()?;
                r.skip(1)?;
                let mut f = FlowStats {
                    table_id,
                    duration_sec: r.u32()?,
                    duration_nsec: r.u32()?,
                    priority: r.u16()?,
                    idle_timeout: r.u16()?,
                    hard_timeout: r.u16()?,
                    flags: r.u16()?,
                    cookie: {
                        r.skip(4)?;
                        r.u64()?
                    },
                    packet_count: r.u64()?,
                    byte_count: r.u64()?,
                    match_: Match::new(),
                    instructions: Vec::new(),
                };
                let (m, used) = Match::decode(&e[48..])?;
                f.match_ = m;
                f.instructions = action::decode_instructions(&e[48 + used..])?;
                Ok(f)
            })?),
            mp::GROUP => B::Group(var_entries(rest, 0, 40, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                r.skip(4)?;
                let group_id = r.u32()?;
                let ref_count = r.u32()?;
                r.skip(4)?;
                let mut g = GroupStats {
                    group_id,
                    ref_count,
                    packet_count: r.u64()?,
                    byte_count: r.u64()?,
                    duration_sec: r.u32()?,
                    duration_nsec: r.u32()?,
                    bucket_stats: Vec::new(),
                };
                g.bucket_stats = counters(r.rest())?;
                Ok(g)
            })?),
            mp::GROUP_DESC if version >= crate::VERSION_1_5 => {
                B::GroupDesc(var_entries(rest, 0, 16, |e| {
                    // ofp15_group_desc: length, type, pad, group_id, bucket_list_len, 6 pad,
                    // ofp15_buckets, then the group's properties.
                    let mut r = Reader::new(e, BAD_LEN);
                    r.skip(2)?;
                    let type_ = r.u8()?;
                    r.skip(1)?;
                    let group_id = r.u32()?;
                    let blen = usize::from(r.u16()?);
                    r.skip(6)?;
                    let buckets = r.bytes(blen)?;
                    Ok(GroupDesc {
                        type_,
                        group_id,
                        buckets: crate::message::decode_buckets15(type_, buckets)?,
                        selection_method: crate::message::decode_group_props15(r.rest())?,
                    })
                })?)
            }
            mp::GROUP_DESC => B::GroupDesc(var_entries(rest, 0, 8, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                r.skip(2)?;
                let type_ = r.u8()?;
                r.skip(1)?;
                Ok(GroupDesc {
                    type_,
                    group_id: r.u32()?,
                    buckets: decode_buckets(r.rest())?,
                    selection_method: None,
                })
            })?),
            mp::METER => B::Meter(var_entries(rest, 4, 40, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                let meter_id = r.u32()?;
                r.skip(8)?;
                let mut m = MeterStats {
                    meter_id,
                    flow_count: r.u32()?,
                    packet_in_count: r.u64()?,
                    byte_in_count: r.u64()?,
                    duration_sec: r.u32()?,
                    duration_nsec: r.u32()?,
                    band_stats: Vec::new(),
                };
                m.band_stats = counters(r.rest())?;
                Ok(m)
            })?),
            mp::METER_CONFIG => B::MeterConfig(var_entries(rest, 0, 8, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                r.skip(2)?;
                Ok(MeterConfig {
                    flags: r.u16()?,
                    meter_id: r.u32()?,
                    bands: decode_bands(r.rest())?,
                })
            })?),
            _ => B::TableFeatures(var_entries(rest, 0, 64, |e| {
                let mut r = Reader::new(e, BAD_LEN);
                r.skip(2)?;
                let table_id = r.u8()?;
                r.skip(5)?;
                let mut t = TableFeatures {
                    table_id,
                    name: string(&mut r, 32)?,
                    metadata_match: r.u64()?,
                    metadata_write: r.u64()?,
                    config: r.u32()?,
                    max_entries: r.u32()?,
                    properties: Vec::new(),
                };
                let mut p = r.rest();
                while !p.is_empty() {
                    let mut pr = Reader::new(p, BAD_LEN);
                    let type_ = pr.u16()?;
                    let len = usize::from(pr.u16()?);
                    let padded = crate::wire::pad8(len);
                    if len < 4 || padded > p.len() {
                        return Err(BAD_LEN);
                    }
                    t.properties.push(TableFeatureProp {
                        type_,
                        data: p[4..len].to_vec(),
                    });
                    p = &p[padded..];
                }
                Ok(t)
            })?),
        };
        Ok(MultipartReply { flags, body: b })
    }
}

fn counters(mut b: &[u8]) -> Result<Vec<Counter>, OfError> {
    if b.len() % 16 != 0 {
        return Err(BAD_LEN);
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let mut r = Reader::new(&b[..16], BAD_LEN);
        out.push(Counter {
            packet_count: r.u64()?,
            byte_count: r.u64()?,
        });
        b = &b[16..];
    }
    Ok(out)
}

fn fixed_entries<T>(
    rest: &[u8],
    size: usize,
    f: impl Fn(&mut Reader<'_>) -> Result<T, OfError>,
) -> Result<Vec<T>, OfError> {
    if rest.len() % size != 0 {
        return Err(BAD_LEN);
    }
    rest.chunks(size)
        .map(|c| f(&mut Reader::new(c, BAD_LEN)))
        .collect()
}

/// Entries that carry their own u16 length at `len_at`, at least `min` long and a multiple
/// of 8.
fn var_entries<T>(
    mut rest: &[u8],
    len_at: usize,
    min: usize,
    f: impl Fn(&[u8]) -> Result<T, OfError>,
) -> Result<Vec<T>, OfError> {
    let mut out = Vec::new();
    while !rest.is_empty() {
        let b = rest.get(len_at..len_at + 2).ok_or(BAD_LEN)?;
        let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
        if len < min || len % 8 != 0 || len > rest.len() {
            return Err(BAD_LEN);
        }
        out.push(f(&rest[..len])?);
        rest = &rest[len..];
    }
    Ok(out)
}

/// Encodes a multipart reply as as many messages as it needs (each at most 65535 bytes,
/// `OFPMPF_REPLY_MORE` on all but the last), all with `xid`. A fixed body (DESC,
/// AGGREGATE, GROUP_FEATURES, METER_FEATURES) and an empty list give one message.
pub fn encode_multipart_reply(body: &MultipartReplyBody, xid: u32) -> Vec<Vec<u8>> {
    encode_multipart_reply_with_version(body, crate::VERSION_1_3, xid)
}

/// [`encode_multipart_reply`] in wire version `version` (1.4's port descriptions from
/// 0x05 on).
pub fn encode_multipart_reply_with_version(
    body: &MultipartReplyBody,
    version: u8,
    xid: u32,
) -> Vec<Vec<u8>> {
    let entries = body.entries_for(version);
    let capacity = MAX_MESSAGE_LEN - HEADER_LEN - 8;
    let mut parts: Vec<Vec<u8>> = vec![Vec::new()];
    for e in entries {
        let last = parts.last_mut().expect("parts is never empty");
        if !last.is_empty() && last.len() + e.len() > capacity && body.is_list() {
            parts.push(Vec::new());
        }
        parts
            .last_mut()
            .expect("parts is never empty")
            .extend_from_slice(&e);
    }
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut out = Vec::with_capacity(HEADER_LEN + 8 + p.len());
            out.put_u8(version);
            out.put_u8(crate::message::ty::MULTIPART_REPLY);
            out.put_u16(0);
            out.put_u32(xid);
            out.put_u16(body.type_());
            out.put_u16(if i + 1 < n { OFPMPF_MORE } else { 0 });
            out.put_zeros(4);
            out.extend_from_slice(&p);
            let len = len16(out.len(), "multipart reply");
            out.patch_u16(2, len);
            out
        })
        .collect()
}
