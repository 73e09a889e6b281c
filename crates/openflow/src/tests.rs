//! Round trips of every message, every refusal path, framing at every split point.

use crate::action::{at, it, Action, Instruction, OFPG_ANY};
use crate::error::*;
use crate::message::*;
use crate::multipart::*;
use crate::oxm::{Field, Match, Oxm, OFPVID_PRESENT};
use crate::port::{self, Port};
use crate::{decode, encode, negotiate, FrameError, Framer, OfError};

fn port(n: u32) -> Port {
    Port {
        port_no: n,
        hw_addr: [2, 0, 0, 0, 0, n as u8],
        name: format!("port{n}"),
        config: port::config::NO_FWD,
        state: port::state::LIVE,
        curr: 1,
        advertised: 2,
        supported: 3,
        peer: 4,
        curr_speed: 5,
        max_speed: 6,
    }
}

fn full_match() -> Match {
    Match::new()
        .with(Oxm::exact(Field::InPort, 1))
        .with(Oxm::exact(Field::InPhyPort, 1))
        .with(Oxm::masked(Field::Metadata, 0x10, 0xf0))
        .with(Oxm::masked(
            Field::EthDst,
            0x0100_0000_0000,
            0x0100_0000_0000,
        ))
        .with(Oxm::exact(Field::EthSrc, 0x0200_0000_0001))
        .with(Oxm::exact(Field::EthType, 0x0800))
        .with(Oxm::masked(Field::VlanVid, 0x1000, 0x1000))
        .with(Oxm::exact(Field::VlanPcp, 5))
        .with(Oxm::exact(Field::IpDscp, 46))
        .with(Oxm::exact(Field::IpEcn, 3))
        .with(Oxm::exact(Field::IpProto, 6))
        .with(Oxm::masked(Field::Ipv4Src, 0x0a00_0000, 0xff00_0000))
        .with(Oxm::exact(Field::Ipv4Dst, 0x0a00_0001))
        .with(Oxm::exact(Field::TcpSrc, 80))
        .with(Oxm::exact(Field::TcpDst, 443))
        .with(Oxm::masked(Field::TunnelId, 5, 0xff))
        .with(Oxm::masked(Field::TunIpv4Src, 0x0101_0101, u32::MAX.into()))
        .with(Oxm::exact(Field::TunIpv4Dst, 0x0202_0202))
        .with(Oxm::masked(Field::CtState, 0x21, 0x21))
        .with(Oxm::exact(Field::CtZone, 7))
        .with(Oxm::masked(Field::CtMark, 1, 0xff))
}

fn ipv6_match() -> Match {
    Match::new()
        .with(Oxm::exact(Field::EthType, 0x86dd))
        .with(Oxm::masked(Field::Ipv6Src, 1 << 120, 0xff << 120))
        .with(Oxm::exact(Field::Ipv6Dst, 2))
        .with(Oxm::masked(Field::Ipv6Flabel, 0x12345, 0xfffff))
        .with(Oxm::masked(Field::Ipv6Exthdr, 0x1, 0x1ff))
        .with(Oxm::exact(Field::IpProto, 58))
        .with(Oxm::exact(Field::Icmpv6Type, 135))
        .with(Oxm::exact(Field::Icmpv6Code, 0))
        .with(Oxm::exact(Field::Ipv6NdTarget, 3))
        .with(Oxm::exact(Field::Ipv6NdSll, 0x0200_0000_0002))
}

fn other_matches() -> Vec<Match> {
    let m = |f: &[Oxm]| Match { fields: f.to_vec() };
    vec![
        Match::new(),
        full_match(),
        ipv6_match(),
        m(&[
            Oxm::exact(Field::EthType, 0x86dd),
            Oxm::exact(Field::IpProto, 58),
            Oxm::exact(Field::Icmpv6Type, 136),
            Oxm::exact(Field::Ipv6NdTll, 9),
        ]),
        m(&[
            Oxm::exact(Field::EthType, 0x0806),
            Oxm::exact(Field::ArpOp, 1),
            Oxm::masked(Field::ArpSpa, 0x0a000000, 0xff000000),
            Oxm::masked(Field::ArpTpa, 1, 0xffffffff),
            Oxm::masked(Field::ArpSha, 1, 0xffff),
            Oxm::exact(Field::ArpTha, 2),
        ]),
        m(&[
            Oxm::exact(Field::EthType, 0x0800),
            Oxm::exact(Field::IpProto, 17),
            Oxm::exact(Field::UdpSrc, 1),
            Oxm::exact(Field::UdpDst, 2),
        ]),
        m(&[
            Oxm::exact(Field::EthType, 0x86dd),
            Oxm::exact(Field::IpProto, 132),
            Oxm::exact(Field::SctpSrc, 1),
            Oxm::exact(Field::SctpDst, 2),
        ]),
        m(&[
            Oxm::exact(Field::EthType, 0x0800),
            Oxm::exact(Field::IpProto, 1),
            Oxm::exact(Field::Icmpv4Type, 8),
            Oxm::exact(Field::Icmpv4Code, 0),
        ]),
        m(&[
            Oxm::exact(Field::EthType, 0x8847),
            Oxm::exact(Field::MplsLabel, 0xfffff),
            Oxm::exact(Field::MplsTc, 7),
            Oxm::exact(Field::MplsBos, 1),
        ]),
        m(&[
            Oxm::exact(Field::EthType, 0x88e7),
            Oxm::masked(Field::PbbIsid, 0x123456, 0xffffff),
        ]),
    ]
}

fn all_actions() -> Vec<Action> {
    vec![
        Action::Output {
            port: port::OFPP_CONTROLLER,
            max_len: 128,
        },
        Action::Output {
            port: 3,
            max_len: 0,
        },
        Action::CopyTtlOut,
        Action::CopyTtlIn,
        Action::SetMplsTtl(9),
        Action::DecMplsTtl,
        Action::PushVlan(0x88a8),
        Action::PopVlan,
        Action::PushMpls(0x8848),
        Action::PopMpls(0x0800),
        Action::SetQueue(4),
        Action::Group(7),
        Action::SetNwTtl(3),
        Action::DecNwTtl,
        Action::SetField(Oxm::exact(Field::VlanVid, u128::from(OFPVID_PRESENT | 10))),
        Action::SetField(Oxm::exact(Field::Ipv6Dst, 1)),
        Action::SetField(Oxm::exact(Field::TunIpv4Dst, 0x01020304)),
        Action::SetField(Oxm::exact(Field::PbbIsid, 5)),
        Action::PushPbb(0x88e7),
        Action::PopPbb,
    ]
}

fn all_instructions() -> Vec<Instruction> {
    vec![
        Instruction::Meter(1),
        Instruction::ApplyActions(all_actions()),
        Instruction::ClearActions,
        Instruction::WriteActions(vec![Action::Output {
            port: port::OFPP_NORMAL,
            max_len: 0,
        }]),
        Instruction::WriteMetadata {
            metadata: 1,
            mask: 3,
        },
        Instruction::GotoTable(9),
    ]
}

fn flow_mod() -> FlowMod {
    FlowMod {
        cookie: 1,
        cookie_mask: 2,
        table_id: 3,
        command: fc::ADD,
        idle_timeout: 4,
        hard_timeout: 5,
        priority: 6,
        buffer_id: OFP_NO_BUFFER,
        out_port: port::OFPP_ANY,
        out_group: OFPG_ANY,
        flags: ff::SEND_FLOW_REM | ff::CHECK_OVERLAP,
        importance: 0,
        match_: full_match(),
        instructions: all_instructions(),
    }
}

fn buckets() -> Vec<Bucket> {
    vec![
        Bucket {
            weight: 1,
            watch_port: 2,
            watch_group: OFPG_ANY,
            bucket_id: 0,
            actions: vec![Action::Output {
                port: 2,
                max_len: 0,
            }],
        },
        Bucket::default(),
    ]
}

fn bands() -> Vec<MeterBand> {
    vec![
        MeterBand::Drop {
            rate: 1,
            burst_size: 2,
        },
        MeterBand::DscpRemark {
            rate: 3,
            burst_size: 4,
            prec_level: 5,
        },
    ]
}

fn flow_stats() -> FlowStats {
    FlowStats {
        table_id: 1,
        duration_sec: 2,
        duration_nsec: 3,
        priority: 4,
        idle_timeout: 5,
        hard_timeout: 6,
        flags: 7,
        cookie: 8,
        packet_count: 9,
        byte_count: 10,
        match_: ipv6_match(),
        instructions: all_instructions(),
    }
}

fn request(body: MultipartRequestBody) -> Message {
    Message::MultipartRequest(MultipartRequest { flags: 0, body })
}

fn reply(body: MultipartReplyBody) -> Message {
    Message::MultipartReply(MultipartReply {
        flags: crate::multipart::OFPMPF_MORE,
        body,
    })
}

/// One value of every message (and of every multipart body).
fn samples() -> Vec<Message> {
    use MultipartReplyBody as A;
    use MultipartRequestBody as Q;
    let fsr = FlowStatsRequest {
        table_id: OFPTT_ALL,
        out_port: port::OFPP_ANY,
        out_group: OFPG_ANY,
        cookie: 1,
        cookie_mask: 1,
        match_: full_match(),
    };
    let mut v = vec![
        Message::Hello { versions: vec![] },
        Message::Hello {
            versions: vec![1, 4, 5, 6],
        },
        Message::Hello {
            versions: vec![4, 40],
        },
        Message::Error(ErrorMsg {
            type_: et::BAD_MATCH,
            code: bmc::BAD_PREREQ,
            data: vec![1, 2, 3],
        }),
        Message::EchoRequest(vec![]),
        Message::EchoReply(b"ping".to_vec()),
        Message::FeaturesRequest,
        Message::FeaturesReply(SwitchFeatures {
            datapath_id: 0x1234,
            n_buffers: 256,
            n_tables: 254,
            auxiliary_id: 1,
            capabilities: 0x4f,
        }),
        Message::GetConfigRequest,
        Message::GetConfigReply(SwitchConfig {
            flags: 1,
            miss_send_len: 128,
        }),
        Message::SetConfig(SwitchConfig {
            flags: 2,
            miss_send_len: 0xffff,
        }),
        Message::PacketIn(PacketIn {
            buffer_id: OFP_NO_BUFFER,
            total_len: 60,
            reason: 1,
            table_id: 2,
            cookie: 3,
            match_: Match::new().with(Oxm::exact(Field::InPort, 4)),
            data: vec![0xaa; 60],
        }),
        Message::FlowRemoved(FlowRemoved {
            cookie: 1,
            priority: 2,
            reason: 3,
            table_id: 4,
            duration_sec: 5,
            duration_nsec: 6,
            idle_timeout: 7,
            hard_timeout: 8,
            packet_count: 9,
            byte_count: 10,
            match_: full_match(),
        }),
        Message::PortStatus {
            reason: 1,
            port: port(3),
        },
        Message::PacketOut(PacketOut {
            buffer_id: OFP_NO_BUFFER,
            in_port: port::OFPP_CONTROLLER,
            metadata: vec![],
            actions: vec![Action::Output {
                port: port::OFPP_TABLE,
                max_len: 0,
            }],
            data: vec![1; 64],
        }),
        Message::FlowMod(flow_mod()),
        Message::FlowMod(FlowMod {
            command: fc::DELETE,
            table_id: OFPTT_ALL,
            instructions: vec![],
            match_: Match::new(),
            ..flow_mod()
        }),
        Message::GroupMod(GroupMod {
            command: group::ADD,
            type_: group::TYPE_FF,
            group_id: 1,
            command_bucket_id: crate::message::group::BUCKET_ALL,
            selection_method: None,
            buckets: buckets(),
        }),
        Message::GroupMod(GroupMod {
            command: group::DELETE,
            type_: group::TYPE_ALL,
            group_id: crate::action::OFPG_ALL,
            command_bucket_id: crate::message::group::BUCKET_ALL,
            selection_method: None,
            buckets: vec![],
        }),
        Message::PortMod(PortMod {
            port_no: 1,
            hw_addr: [2, 0, 0, 0, 0, 1],
            config: 1,
            mask: 1,
            advertise: 0,
        }),
        Message::TableMod {
            table_id: 1,
            config: 3,
        },
        Message::BarrierRequest,
        Message::BarrierReply,
        Message::RoleRequest(Role {
            role: role::MASTER,
            generation_id: 9,
        }),
        Message::RoleReply(Role {
            role: role::SLAVE,
            generation_id: 9,
        }),
        Message::GetAsyncRequest,
        Message::GetAsyncReply(AsyncConfig {
            packet_in_mask: [1, 2],
            port_status_mask: [3, 4],
            flow_removed_mask: [5, 6],
        }),
        Message::SetAsync(AsyncConfig::default()),
        Message::MeterMod(MeterMod {
            command: meter::ADD,
            flags: meter::KBPS | meter::BURST,
            meter_id: 1,
            bands: bands(),
        }),
        request(Q::Desc),
        request(Q::Flow(fsr.clone())),
        request(Q::Aggregate(fsr)),
        request(Q::Table),
        request(Q::PortStats {
            port_no: port::OFPP_ANY,
        }),
        request(Q::PortDesc),
        request(Q::Group { group_id: 1 }),
        request(Q::GroupDesc),
        request(Q::GroupFeatures),
        request(Q::Meter { meter_id: 1 }),
        request(Q::MeterConfig { meter_id: 2 }),
        request(Q::MeterFeatures),
        request(Q::TableFeatures),
        reply(A::Desc(Desc {
            mfr_desc: "ferrovs".into(),
            hw_desc: "hw".into(),
            sw_desc: "sw".into(),
            serial_num: "1".into(),
            dp_desc: "br0".into(),
        })),
        reply(A::Flow(vec![flow_stats(), flow_stats()])),
        reply(A::Aggregate(AggregateStats {
            packet_count: 1,
            byte_count: 2,
            flow_count: 3,
        })),
        reply(A::Table(vec![TableStats {
            table_id: 1,
            active_count: 2,
            lookup_count: 3,
            matched_count: 4,
        }])),
        reply(A::PortStats(vec![PortStats {
            port_no: 1,
            collisions: 7,
            duration_nsec: 3,
            ..Default::default()
        }])),
        reply(A::PortDesc(vec![port(1), port(2)])),
        reply(A::Group(vec![GroupStats {
            group_id: 1,
            ref_count: 2,
            bucket_stats: vec![Counter {
                packet_count: 1,
                byte_count: 2,
            }],
            ..Default::default()
        }])),
        reply(A::GroupDesc(vec![GroupDesc {
            type_: group::TYPE_SELECT,
            group_id: 1,
            buckets: buckets(),
            selection_method: None,
        }])),
        reply(A::GroupFeatures(GroupFeatures {
            types: 15,
            capabilities: 1,
            max_groups: [1, 2, 3, 4],
            actions: [5, 6, 7, 8],
        })),
        reply(A::Meter(vec![MeterStats {
            meter_id: 1,
            flow_count: 2,
            band_stats: vec![Counter::default(); 2],
            ..Default::default()
        }])),
        reply(A::MeterConfig(vec![MeterConfig {
            flags: meter::PKTPS,
            meter_id: 1,
            bands: bands(),
        }])),
        reply(A::MeterFeatures(MeterFeatures {
            max_meter: 1,
            band_types: 6,
            capabilities: 15,
            max_bands: 2,
            max_color: 0,
        })),
        reply(A::TableFeatures(vec![TableFeatures {
            table_id: 0,
            name: "classifier".into(),
            metadata_match: u64::MAX,
            metadata_write: u64::MAX,
            config: 0,
            max_entries: 1000,
            properties: vec![
                TableFeatureProp::instructions(tfpt::INSTRUCTIONS, &[1, 4]),
                TableFeatureProp::next_tables(tfpt::NEXT_TABLES, &[1, 2, 3]),
                TableFeatureProp::oxm_ids(tfpt::MATCH, &Field::ALL, true),
            ],
        }])),
    ];
    for m in other_matches() {
        v.push(Message::FlowMod(FlowMod {
            match_: m,
            ..flow_mod()
        }));
    }
    v
}

#[test]
fn every_message_round_trips() {
    for (i, m) in samples().iter().enumerate() {
        let xid = 0x1000 + i as u32;
        let bytes = encode(m, xid);
        assert!(bytes.len() % 8 == 0 || !matches!(m, Message::FlowMod(_)));
        let (h, back) = decode(&bytes).unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(&back, m);
        assert_eq!(h.xid, xid);
        assert_eq!(usize::from(h.length), bytes.len());
        assert_eq!(h.type_, m.type_());
        assert_eq!(encode(&back, xid), bytes, "{m:?}");
    }
}

#[test]
fn every_field_round_trips_alone_with_its_prerequisites() {
    for f in Field::ALL {
        let i = f.info();
        let v = if i.bits >= 128 {
            u128::MAX
        } else {
            (1u128 << i.bits) - 1
        };
        for oxm in [Oxm::exact(f, v & 0x1fff_ffff_ffff), Oxm::masked(f, 0, v)] {
            if oxm.mask.is_some() && !i.maskable {
                continue;
            }
            let mut m = prereqs_for(f);
            m.fields.retain(|o| o.field != f);
            m.fields.push(oxm.clone());
            let msg = Message::FlowMod(FlowMod {
                match_: m,
                ..flow_mod()
            });
            let bytes = encode(&msg, 1);
            assert_eq!(decode(&bytes).map(|d| d.1), Ok(msg), "{f}");
        }
    }
}

/// A match holding what `f` needs.
fn prereqs_for(f: Field) -> Match {
    use Field::*;
    let e = |t| Oxm::exact(EthType, t);
    let p = |t| Oxm::exact(IpProto, t);
    let fields = match f {
        InPhyPort => vec![Oxm::exact(InPort, 1)],
        VlanPcp => vec![Oxm::exact(VlanVid, 0x1001)],
        IpDscp | IpEcn | IpProto | Ipv4Src | Ipv4Dst | NxIpTtl | NxIpFrag => vec![e(0x0800)],
        TcpSrc | TcpDst => vec![e(0x0800), p(6)],
        UdpSrc | UdpDst => vec![e(0x86dd), p(17)],
        SctpSrc | SctpDst => vec![e(0x0800), p(132)],
        Icmpv4Type | Icmpv4Code => vec![e(0x0800), p(1)],
        ArpOp | ArpSpa | ArpTpa | ArpSha | ArpTha => vec![e(0x0806)],
        Ipv6Src | Ipv6Dst | Ipv6Flabel | Ipv6Exthdr => vec![e(0x86dd)],
        Icmpv6Type | Icmpv6Code => vec![e(0x86dd), p(58)],
        Ipv6NdTarget | Ipv6NdSll => vec![e(0x86dd), p(58), Oxm::exact(Icmpv6Type, 135)],
        Ipv6NdTll => vec![e(0x86dd), p(58), Oxm::exact(Icmpv6Type, 136)],
        MplsLabel | MplsTc | MplsBos => vec![e(0x8847)],
        PbbIsid => vec![e(0x88e7)],
        CtNwProto | CtNwSrc | CtNwDst | CtIpv6Src | CtIpv6Dst | CtTpSrc | CtTpDst => {
            vec![Oxm::masked(CtState, 0x20, 0x30)]
        }
        _ => vec![],
    };
    Match { fields }
}

fn flow_mod_bytes(m: &Match, insts: &[Instruction]) -> Vec<u8> {
    encode(
        &Message::FlowMod(FlowMod {
            match_: m.clone(),
            instructions: insts.to_vec(),
            ..flow_mod()
        }),
        1,
    )
}

/// A FLOW_MOD whose match is the raw TLV bytes `tlvs`.
fn raw_match(tlvs: &[u8]) -> Vec<u8> {
    let mut b = flow_mod_bytes(&Match::new(), &[]);
    b.truncate(48);
    let len = 4 + tlvs.len();
    b.extend_from_slice(&1u16.to_be_bytes());
    b.extend_from_slice(&(len as u16).to_be_bytes());
    b.extend_from_slice(tlvs);
    b.resize(48 + len.div_ceil(8) * 8, 0);
    let l = b.len() as u16;
    b[2..4].copy_from_slice(&l.to_be_bytes());
    b
}

fn tlv(class: u16, field: u8, has_mask: bool, payload: &[u8]) -> Vec<u8> {
    let h = (u32::from(class) << 16)
        | (u32::from(field) << 9)
        | (u32::from(has_mask) << 8)
        | payload.len() as u32;
    let mut v = h.to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

fn err(bytes: &[u8]) -> (u16, u16) {
    let e = decode(bytes).expect_err("decoded what it should refuse");
    (e.type_, e.code)
}

#[test]
fn l4_ports_take_bitwise_masks_as_in_ovs() {
    // OpenFlow 1.3 has TCP/UDP/SCTP ports exact; OVS (and os-ken's, ovn-controller's and
    // ovs-ofctl's `tp_src=0/1`) masks them bitwise.
    let b = 0x8000;
    let m = [
        tlv(b, 5, false, &[8, 0]),
        tlv(b, 10, false, &[6]),
        tlv(b, 13, true, &[0, 0, 0, 1]),
    ]
    .concat();
    decode(&raw_match(&m)).expect("a masked tcp_src");
}

#[test]
fn match_refusals() {
    let b = 0x8000;
    let eth_ip = tlv(b, 5, false, &[8, 0]);
    let cases: Vec<(Vec<u8>, u16)> = vec![
        // The same field twice.
        ([eth_ip.clone(), eth_ip.clone()].concat(), bmc::DUP_FIELD),
        // IN_PORT with 3 bytes.
        (tlv(b, 0, false, &[0, 0, 1]), bmc::BAD_LEN),
        // A TLV running past the match.
        (tlv(b, 0, false, &[0, 0, 0, 1])[..6].to_vec(), bmc::BAD_LEN),
        // ETH_TYPE with a mask.
        (tlv(b, 5, true, &[8, 0, 0xff, 0xff]), bmc::BAD_MASK),
        // ICMPV4_TYPE with a mask (exact in OpenFlow 1.3 and in OVS).
        (
            [
                eth_ip.clone(),
                tlv(b, 10, false, &[1]),
                tlv(b, 19, true, &[8, 0xff]),
            ]
            .concat(),
            bmc::BAD_MASK,
        ),
        // Value bits outside the mask.
        (
            [
                eth_ip.clone(),
                tlv(b, 11, true, &[10, 0, 0, 1, 255, 0, 0, 0]),
            ]
            .concat(),
            bmc::BAD_WILDCARDS,
        ),
        // Value beyond the field's bits.
        (tlv(b, 6, false, &[0x20, 0]), bmc::BAD_VALUE),
        (
            [eth_ip.clone(), tlv(b, 8, false, &[64])].concat(),
            bmc::BAD_VALUE,
        ),
        // Unknown fields: basic class 40+, a Nicira field (pkt_mark), an experimenter class.
        (tlv(b, 40, false, &[0, 0, 0, 1]), bmc::BAD_FIELD),
        (tlv(0x0001, 33, false, &[0, 0, 0, 1]), bmc::BAD_FIELD),
        (
            tlv(0xffff, 1, false, &[0, 0, 0, 1, 0, 0, 0, 0]),
            bmc::BAD_FIELD,
        ),
        // Prerequisites.
        (tlv(b, 13, false, &[0, 80]), bmc::BAD_PREREQ),
        (
            [eth_ip.clone(), tlv(b, 13, false, &[0, 80])].concat(),
            bmc::BAD_PREREQ,
        ),
        (
            [
                eth_ip.clone(),
                tlv(b, 10, false, &[17]),
                tlv(b, 13, false, &[0, 80]),
            ]
            .concat(),
            bmc::BAD_PREREQ,
        ),
        (
            [
                tlv(b, 5, false, &[0x86, 0xdd]),
                tlv(b, 11, false, &[1, 1, 1, 1]),
            ]
            .concat(),
            bmc::BAD_PREREQ,
        ),
        (tlv(b, 1, false, &[0, 0, 0, 1]), bmc::BAD_PREREQ),
        (tlv(b, 7, false, &[1]), bmc::BAD_PREREQ),
        (
            [tlv(b, 6, false, &[0, 0]), tlv(b, 7, false, &[1])].concat(),
            bmc::BAD_PREREQ,
        ),
        (
            [
                eth_ip.clone(),
                tlv(b, 10, false, &[1]),
                tlv(b, 29, false, &[1]),
            ]
            .concat(),
            bmc::BAD_PREREQ,
        ),
        (tlv(b, 34, false, &[0, 0, 0, 1]), bmc::BAD_PREREQ),
        (tlv(b, 37, false, &[0, 0, 1]), bmc::BAD_PREREQ),
        (
            [
                tlv(b, 5, false, &[0x86, 0xdd]),
                tlv(b, 10, false, &[58]),
                tlv(b, 29, false, &[136]),
                tlv(b, 32, false, &[0, 0, 0, 0, 0, 1]),
            ]
            .concat(),
            bmc::BAD_PREREQ,
        ),
    ];
    for (tlvs, code) in cases {
        assert_eq!(err(&raw_match(&tlvs)), (et::BAD_MATCH, code), "{tlvs:02x?}");
    }
    let e = decode(&raw_match(&tlv(b, 13, false, &[0, 80]))).unwrap_err();
    assert_eq!(e.name(), Some("OFPBMC_BAD_PREREQ"));
    // Order does not matter for prerequisites.
    let ok = raw_match(&[tlv(b, 13, false, &[0, 80]), tlv(b, 10, false, &[6]), eth_ip].concat());
    assert!(decode(&ok).is_ok());
    // A match of type OFPMT_STANDARD, and one whose length is below 4.
    let mut b = raw_match(&[]);
    b[49] = 0;
    assert_eq!(err(&b), (et::BAD_MATCH, bmc::BAD_TYPE));
    let mut b = raw_match(&[]);
    b[51] = 2;
    assert_eq!(err(&b), (et::BAD_MATCH, bmc::BAD_LEN));
    // A match longer than the message.
    let mut b = raw_match(&[]);
    b[51] = 40;
    assert_eq!(err(&b), (et::BAD_MATCH, bmc::BAD_LEN));
}

/// A FLOW_MOD with an APPLY_ACTIONS of the raw action bytes `acts`.
fn raw_actions(acts: &[u8]) -> Vec<u8> {
    let mut i = (it::APPLY_ACTIONS as u32).to_be_bytes()[2..].to_vec();
    i.extend_from_slice(&((8 + acts.len()) as u16).to_be_bytes());
    i.extend_from_slice(&[0; 4]);
    i.extend_from_slice(acts);
    // Keep the instruction aligned so the action itself is what is refused.
    i.resize(i.len().div_ceil(8) * 8, 0);
    let l = i.len() as u16;
    i[2..4].copy_from_slice(&l.to_be_bytes());
    raw_instructions(&i)
}

fn raw_instructions(insts: &[u8]) -> Vec<u8> {
    let mut b = flow_mod_bytes(&Match::new(), &[]);
    b.extend_from_slice(insts);
    let l = b.len() as u16;
    b[2..4].copy_from_slice(&l.to_be_bytes());
    b
}

fn act(type_: u16, body: &[u8]) -> Vec<u8> {
    let mut v = type_.to_be_bytes().to_vec();
    v.extend_from_slice(&((4 + body.len()) as u16).to_be_bytes());
    v.extend_from_slice(body);
    v
}

#[test]
fn action_refusals() {
    let set_field = |oxm: &[u8]| {
        let mut body = oxm.to_vec();
        body.resize((4 + oxm.len()).div_ceil(8) * 8 - 4, 0);
        act(at::SET_FIELD, &body)
    };
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (act(at::OUTPUT, &[0, 0, 0, 1, 0, 0, 0, 0]), bac::BAD_LEN),
        (
            act(
                at::OUTPUT,
                &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            bac::BAD_LEN,
        ),
        (act(at::POP_VLAN, &[0; 3]), bac::BAD_LEN),
        (
            [act(at::POP_VLAN, &[0; 4])[..2].to_vec(), vec![0, 16, 0, 0]].concat(),
            bac::BAD_LEN,
        ),
        (act(at::POP_VLAN, &[0; 4])[..2].to_vec(), bac::BAD_LEN),
        (act(99, &[0; 4]), bac::BAD_TYPE),
        (
            act(
                at::EXPERIMENTER,
                // NXAST_NOTE (8).
                &[0, 0, 0x23, 0x20, 0, 8, 0, 0, 0, 0, 0, 0],
            ),
            bac::BAD_EXP_TYPE,
        ),
        (
            act(
                at::EXPERIMENTER,
                &[0, 0, 0x23, 0x21, 0, 1, 0, 0, 0, 0, 0, 0],
            ),
            bac::BAD_EXPERIMENTER,
        ),
        (
            act(at::OUTPUT, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            bac::BAD_OUT_PORT,
        ),
        (
            act(
                at::OUTPUT,
                &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            bac::BAD_OUT_PORT,
        ),
        (
            act(
                at::OUTPUT,
                &[0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            bac::BAD_OUT_PORT,
        ),
        // Output to TABLE outside a packet-out.
        (
            act(
                at::OUTPUT,
                &[0xff, 0xff, 0xff, 0xf9, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            bac::BAD_OUT_PORT,
        ),
        (act(at::PUSH_VLAN, &[0x08, 0x00, 0, 0]), bac::BAD_ARGUMENT),
        (act(at::PUSH_MPLS, &[0x81, 0x00, 0, 0]), bac::BAD_ARGUMENT),
        (act(at::PUSH_PBB, &[0x81, 0x00, 0, 0]), bac::BAD_ARGUMENT),
        (
            act(at::GROUP, &[0xff, 0xff, 0xff, 0xfc]),
            bac::BAD_OUT_GROUP,
        ),
        (
            set_field(&tlv(0x8000, 40, false, &[0, 0, 0, 1])),
            bac::BAD_SET_TYPE,
        ),
        (
            set_field(&tlv(0x8000, 5, false, &[8, 0])),
            bac::BAD_SET_TYPE,
        ),
        (set_field(&tlv(0x8000, 3, false, &[0; 5])), bac::BAD_SET_LEN),
        // An action 8 bytes longer than its OXM needs.
        (
            act(at::SET_FIELD, &[&[0x80, 0, 6, 6][..], &[0; 16]].concat()),
            bac::BAD_SET_LEN,
        ),
        (act(at::SET_FIELD, &[0x80, 0]), bac::BAD_LEN),
        (
            set_field(&tlv(0x8000, 6, false, &[0x20, 0])),
            bac::BAD_SET_ARGUMENT,
        ),
        (
            set_field(&tlv(0x8000, 3, true, &[0; 12])),
            bac::BAD_SET_ARGUMENT,
        ),
    ];
    for (a, code) in cases {
        assert_eq!(err(&raw_actions(&a)), (et::BAD_ACTION, code), "{a:02x?}");
    }
    // OFPP_TABLE is fine in a packet-out.
    let po = encode(
        &Message::PacketOut(PacketOut {
            buffer_id: OFP_NO_BUFFER,
            in_port: 1,
            metadata: vec![],
            actions: vec![Action::Output {
                port: port::OFPP_TABLE,
                max_len: 0,
            }],
            data: vec![],
        }),
        1,
    );
    assert!(decode(&po).is_ok());
}

#[test]
fn instruction_refusals() {
    let ins = |t: u16, body: &[u8]| act(t, body);
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (ins(it::GOTO_TABLE, &[5, 0, 0, 0, 0, 0, 0, 0]), bic::BAD_LEN),
        (ins(it::GOTO_TABLE, &[5, 0, 0]), bic::BAD_LEN),
        (
            ins(it::GOTO_TABLE, &[5, 0, 0, 0])[..4].to_vec(),
            bic::BAD_LEN,
        ),
        (ins(it::WRITE_METADATA, &[0; 12]), bic::BAD_LEN),
        (ins(it::CLEAR_ACTIONS, &[0; 12]), bic::BAD_LEN),
        (ins(it::METER, &[0; 12]), bic::BAD_LEN),
        (ins(77, &[0; 4]), bic::UNKNOWN_INST),
        (
            ins(it::EXPERIMENTER, &[0, 0, 0x23, 0x20]),
            bic::BAD_EXPERIMENTER,
        ),
        (ins(it::GOTO_TABLE, &[0xff, 0, 0, 0]), bic::BAD_TABLE_ID),
        // The flow-mod is in table 3: a goto to 3 or below.
        (ins(it::GOTO_TABLE, &[3, 0, 0, 0]), bic::BAD_TABLE_ID),
        (
            [
                ins(it::CLEAR_ACTIONS, &[0; 4]),
                ins(it::CLEAR_ACTIONS, &[0; 4]),
            ]
            .concat(),
            bic::UNSUP_INST,
        ),
    ];
    for (i, code) in cases {
        assert_eq!(
            err(&raw_instructions(&i)),
            (et::BAD_INSTRUCTION, code),
            "{i:02x?}"
        );
    }
}

#[test]
fn message_refusals() {
    let with = |m: &Message, f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = encode(m, 1);
        f(&mut b);
        let l = b.len() as u16;
        b[2..4].copy_from_slice(&l.to_be_bytes());
        b
    };
    let fm = Message::FlowMod(flow_mod());
    let gm = Message::GroupMod(GroupMod {
        command: group::ADD,
        type_: group::TYPE_ALL,
        group_id: 1,
        command_bucket_id: crate::message::group::BUCKET_ALL,
        selection_method: None,
        buckets: buckets(),
    });
    let mm = Message::MeterMod(MeterMod {
        command: meter::ADD,
        flags: 0,
        meter_id: 1,
        bands: bands(),
    });
    let cases: Vec<(Vec<u8>, (u16, u16))> = vec![
        (vec![4, 0, 0, 8, 0, 0, 0], (et::BAD_REQUEST, brc::BAD_LEN)),
        (
            vec![4, 5, 0, 9, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_LEN),
        ),
        (
            vec![4, 5, 0, 9, 0, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_LEN),
        ),
        (
            vec![1, 5, 0, 8, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_VERSION),
        ),
        (
            vec![4, 22, 0, 8, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_TYPE),
        ),
        (
            vec![4, 30, 0, 8, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_TYPE),
        ),
        (
            vec![4, 4, 0, 16, 0, 0, 0, 0, 0, 0, 0x23, 0x20, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_EXP_TYPE),
        ),
        (
            vec![4, 4, 0, 16, 0, 0, 0, 0, 0, 0, 0x15, 0x4d, 0, 0, 0, 0],
            (et::BAD_REQUEST, brc::BAD_EXPERIMENTER),
        ),
        (
            with(&fm, &|b| b[25] = 5),
            (et::FLOW_MOD_FAILED, fmfc::BAD_COMMAND),
        ),
        (
            with(&fm, &|b| b[44] = 0x80),
            (et::FLOW_MOD_FAILED, fmfc::BAD_FLAGS),
        ),
        (
            with(&fm, &|b| b[24] = 0xff),
            (et::FLOW_MOD_FAILED, fmfc::BAD_TABLE_ID),
        ),
        (
            with(&fm, &|b| b.truncate(40)),
            (et::BAD_REQUEST, brc::BAD_LEN),
        ),
        (
            with(&gm, &|b| b[9] = 3),
            (et::GROUP_MOD_FAILED, gmfc::BAD_COMMAND),
        ),
        (
            with(&gm, &|b| b[10] = 4),
            (et::GROUP_MOD_FAILED, gmfc::BAD_TYPE),
        ),
        (
            with(&gm, &|b| b[12..16].copy_from_slice(&[0xff; 4])),
            (et::GROUP_MOD_FAILED, gmfc::INVALID_GROUP),
        ),
        (
            with(&gm, &|b| b[17] = 12),
            (et::GROUP_MOD_FAILED, gmfc::BAD_BUCKET),
        ),
        (
            with(&mm, &|b| b[9] = 3),
            (et::METER_MOD_FAILED, mmfc::BAD_COMMAND),
        ),
        (
            with(&mm, &|b| b[11] = 0x10),
            (et::METER_MOD_FAILED, mmfc::BAD_FLAGS),
        ),
        (
            with(&mm, &|b| b[17] = 3),
            (et::METER_MOD_FAILED, mmfc::BAD_BAND),
        ),
        (
            with(&mm, &|b| b[19] = 8),
            (et::METER_MOD_FAILED, mmfc::BAD_BAND),
        ),
        (
            with(&Message::SetConfig(SwitchConfig::default()), &|b| b[9] = 4),
            (et::SWITCH_CONFIG_FAILED, scfc::BAD_FLAGS),
        ),
        (
            with(&Message::RoleRequest(Role::default()), &|b| b[11] = 4),
            (et::ROLE_REQUEST_FAILED, rrfc::BAD_ROLE),
        ),
        (
            with(&Message::PortMod(PortMod::default()), &|b| {
                b[8..12].copy_from_slice(&port::OFPP_FLOOD.to_be_bytes())
            }),
            (et::PORT_MOD_FAILED, pmfc::BAD_PORT),
        ),
        (
            with(&Message::PortMod(PortMod::default()), &|_| {}),
            (et::PORT_MOD_FAILED, pmfc::BAD_PORT),
        ),
        (
            with(
                &Message::PacketOut(PacketOut {
                    buffer_id: OFP_NO_BUFFER,
                    in_port: port::OFPP_FLOOD,
                    metadata: vec![],
                    actions: vec![],
                    data: vec![],
                }),
                &|_| {},
            ),
            (et::BAD_REQUEST, brc::BAD_PORT),
        ),
        (
            with(&request(MultipartRequestBody::Desc), &|b| b[9] = 5),
            (et::BAD_REQUEST, brc::BAD_MULTIPART),
        ),
        (
            with(&request(MultipartRequestBody::Desc), &|b| b[9] = 14),
            (et::BAD_REQUEST, brc::BAD_MULTIPART),
        ),
        (
            with(&request(MultipartRequestBody::Desc), &|b| {
                b[8] = 0xff;
                b[9] = 0xff
            }),
            (et::BAD_REQUEST, brc::BAD_EXPERIMENTER),
        ),
        (
            with(&request(MultipartRequestBody::Desc), &|b| b.push(0)),
            (et::BAD_REQUEST, brc::BAD_LEN),
        ),
        (
            with(&request(MultipartRequestBody::TableFeatures), &|b| {
                b.extend_from_slice(&[0; 64])
            }),
            (et::TABLE_FEATURES_FAILED, tffc::EPERM),
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(err(&bytes), want, "{bytes:02x?}");
    }
    // A header whose length disagrees with the buffer.
    let mut b = encode(&Message::BarrierRequest, 1);
    b.push(0);
    assert_eq!(err(&b), (et::BAD_REQUEST, brc::BAD_LEN));
}

#[test]
fn error_reply_carries_64_bytes_of_the_request() {
    let req = encode(&Message::FlowMod(flow_mod()), 0x77);
    assert!(req.len() > 64);
    let e = decode(&raw_match(&tlv(0x8000, 13, false, &[0, 80]))).unwrap_err();
    let reply = e.encode_reply(&req);
    let (h, m) = decode(&reply).unwrap();
    assert_eq!(h.xid, 0x77);
    assert_eq!(
        m,
        Message::Error(ErrorMsg {
            type_: et::BAD_MATCH,
            code: bmc::BAD_PREREQ,
            data: req[..64].to_vec()
        })
    );
    // A short request is carried whole; a refused version is answered in that version.
    let hello10 = [1u8, 0, 0, 8, 0, 0, 0, 5];
    let r = OfError::new(et::HELLO_FAILED, hfc::INCOMPATIBLE, "t").encode_reply(&hello10);
    assert_eq!(r[0], 1);
    assert_eq!(&r[12..], &hello10);
}

#[test]
fn hello_versions_and_negotiation() {
    let b = encode(
        &Message::Hello {
            versions: vec![1, 4, 6],
        },
        0,
    );
    assert_eq!(b[0], 6);
    assert_eq!(&b[8..16], &[0, 1, 0, 8, 0, 0, 0, 0x52]);
    // A 1.0 HELLO without elements; one with an unknown element first.
    assert_eq!(
        decode(&[1, 0, 0, 8, 0, 0, 0, 1]).unwrap().1,
        Message::Hello { versions: vec![] }
    );
    let odd = [
        4, 0, 0, 24, 0, 0, 0, 1, 0, 9, 0, 4, 0, 0, 0, 0, 0, 1, 0, 8, 0, 0, 0, 0x10,
    ];
    assert_eq!(
        decode(&odd).unwrap().1,
        Message::Hello { versions: vec![4] }
    );
    let ours = [1, 4, 5, 6];
    assert_eq!(negotiate(&ours, 4, &[1, 4]), Some(4));
    assert_eq!(negotiate(&[4], 6, &[1, 4, 5, 6]), Some(4));
    assert_eq!(negotiate(&[4], 6, &[1, 5, 6]), None);
    assert_eq!(negotiate(&[4], 4, &[]), Some(4));
    assert_eq!(negotiate(&[4], 6, &[]), Some(4));
    assert_eq!(negotiate(&[4], 1, &[]), None);
    assert_eq!(negotiate(&ours, 1, &[]), Some(1));
}

#[test]
fn multipart_reply_splits_over_messages() {
    let flows = vec![flow_stats(); 400];
    let parts = encode_multipart_reply(&MultipartReplyBody::Flow(flows.clone()), 9);
    assert!(parts.len() > 1);
    let mut all = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        assert!(p.len() <= crate::MAX_MESSAGE_LEN);
        let (h, m) = decode(p).unwrap();
        assert_eq!(h.xid, 9);
        let Message::MultipartReply(r) = m else {
            panic!()
        };
        assert_eq!(r.flags == OFPMPF_MORE, i + 1 < parts.len());
        let MultipartReplyBody::Flow(v) = r.body else {
            panic!()
        };
        all.extend(v);
    }
    assert_eq!(all, flows);
    // An empty list and a fixed body: one message, no MORE flag.
    for body in [
        MultipartReplyBody::PortDesc(vec![]),
        MultipartReplyBody::MeterFeatures(MeterFeatures::default()),
    ] {
        let parts = encode_multipart_reply(&body, 1);
        assert_eq!(parts.len(), 1);
        assert_eq!(
            decode(&parts[0]).unwrap().1,
            Message::MultipartReply(MultipartReply { flags: 0, body })
        );
    }
}

#[test]
fn port_names_are_cut_at_15_bytes_on_a_char_boundary() {
    let mut p = port(1);
    p.name = "ééééééééé".into(); // 18 bytes
    let b = encode(&Message::PortStatus { reason: 0, port: p }, 1);
    let Message::PortStatus { port, .. } = decode(&b).unwrap().1 else {
        panic!()
    };
    assert_eq!(port.name, "ééééééé");
}

fn stream() -> (Vec<Vec<u8>>, Vec<u8>) {
    let msgs: Vec<Vec<u8>> = samples()
        .iter()
        .take(20)
        .enumerate()
        .map(|(i, m)| encode(m, i as u32))
        .collect();
    let all = msgs.concat();
    (msgs, all)
}

fn drain(f: &mut Framer, out: &mut Vec<Vec<u8>>) {
    while let Some(m) = f.next_message().unwrap() {
        out.push(m);
    }
}

#[test]
fn framing_at_every_split_point() {
    let (msgs, all) = stream();
    for split in 0..=all.len() {
        let mut f = Framer::new();
        let mut got = Vec::new();
        f.push(&all[..split]);
        drain(&mut f, &mut got);
        f.push(&all[split..]);
        drain(&mut f, &mut got);
        assert_eq!(got, msgs, "split at {split}");
        assert_eq!(f.pending(), 0);
    }
    // Byte by byte.
    let mut f = Framer::new();
    let mut got = Vec::new();
    for b in &all {
        f.push(std::slice::from_ref(b));
        drain(&mut f, &mut got);
    }
    assert_eq!(got, msgs);
}

/// A framer's unread bytes, pushed into a new framer (a hot upgrade's handover of a
/// connection), give the same messages from the exact byte, at every split point.
#[test]
fn unread_bytes_continue_in_a_new_framer() {
    let (msgs, all) = stream();
    for split in 0..=all.len() {
        let mut f = Framer::new();
        let mut got = Vec::new();
        f.push(&all[..split]);
        // The first message only: the rest stays unread, whole or in part.
        if let Some(m) = f.next_message().unwrap() {
            got.push(m);
        }
        let mut g = Framer::new();
        g.push(f.unread());
        assert_eq!(f.unread().len(), f.pending());
        g.push(&all[split..]);
        drain(&mut g, &mut got);
        assert_eq!(got, msgs, "split at {split}");
    }
}

#[test]
fn framing_refusals() {
    let mut f = Framer::new();
    f.push(&[4, 0, 0, 7, 0, 0, 0, 0]);
    assert_eq!(f.next_message(), Err(FrameError::BadLength(7)));
    assert_eq!(f.next_message(), Err(FrameError::BadLength(7)));
    assert!(FrameError::BadLength(7)
        .of_error()
        .is(et::BAD_REQUEST, brc::BAD_LEN));
    // A message of another version is consumed and handed back; the next one is fine.
    let mut f = Framer::new();
    f.set_version(4);
    let other = [1u8, 2, 0, 8, 0, 0, 0, 3];
    f.push(&other);
    f.push(&encode(&Message::BarrierRequest, 4));
    assert_eq!(
        f.next_message(),
        Err(FrameError::BadVersion {
            version: 1,
            message: other.to_vec()
        })
    );
    assert_eq!(f.next_message().unwrap().unwrap()[1], ty::BARRIER_REQUEST);
    let e = FrameError::BadVersion {
        version: 1,
        message: other.to_vec(),
    };
    let reply = e.of_error().encode_reply(&other);
    assert_eq!(
        decode(&reply).unwrap().1,
        Message::Error(ErrorMsg {
            type_: et::BAD_REQUEST,
            code: brc::BAD_VERSION,
            data: other.to_vec()
        })
    );
    assert_eq!(f.next_message(), Ok(None));
}

/// Deterministic fuzz: every truncation and single-byte corruption of every sample either
/// decodes to a value that round-trips or is refused, never panics.
#[test]
fn corrupted_messages_never_panic() {
    for m in samples() {
        let b = encode(&m, 1);
        let check = |bytes: &[u8]| {
            if let Ok((h, v)) = decode(bytes) {
                let again = encode(&v, h.xid);
                assert_eq!(decode(&again).map(|d| d.1), Ok(v));
            }
        };
        for n in 0..b.len() {
            let mut t = b[..n].to_vec();
            if n >= 4 {
                t[2..4].copy_from_slice(&(n as u16).to_be_bytes());
            }
            check(&t);
        }
        for i in 0..b.len() {
            for x in [0x00, 0x01, 0x80, 0xff] {
                let mut c = b.clone();
                c[i] ^= x;
                check(&c);
            }
        }
    }
}

/// `NXM_NX_TUN_METADATA0` as OVS sends it for OVN's 4-byte option: class 1, field 40,
/// 4 bytes (`00 01 50 04`), masked `00 01 51 08`; another width is refused.
#[test]
fn tun_metadata_fields_have_ovs_s_encoding() {
    let exact = [0x00, 0x01, 0x50, 0x04, 0x00, 0x01, 0x00, 0x02];
    assert_eq!(tlv(0x0001, 40, false, &[0, 1, 0, 2]), exact);
    let (_, m) = decode(&raw_match(&exact)).unwrap();
    let Message::FlowMod(fm) = m else {
        panic!("{m:?}")
    };
    assert_eq!(
        fm.match_.fields,
        vec![Oxm::exact(Field::TunMetadata0, 0x0001_0002)]
    );
    let masked = tlv(0x0001, 43, true, &[0, 0, 0, 2, 0, 0, 0x7f, 0xff]);
    assert_eq!(masked[..4], [0x00, 0x01, 0x57, 0x08]);
    let (_, m) = decode(&raw_match(&masked)).unwrap();
    let Message::FlowMod(fm) = m else {
        panic!("{m:?}")
    };
    assert_eq!(
        fm.match_.fields,
        vec![Oxm::masked(Field::TunMetadata3, 2, 0x7fff)]
    );
    // OVS's tun_metadata is variable length (ovs-ofctl writes a value in as few bytes as
    // it takes, up to 124): any length is read, a value within the 4 bytes the pipeline
    // keeps is kept, one beyond them is BAD_VALUE.
    for payload in [&[2u8][..], &[0, 0, 0, 0, 0, 0, 0, 2][..]] {
        let (_, m) = decode(&raw_match(&tlv(0x0001, 40, false, payload))).unwrap();
        let Message::FlowMod(fm) = m else {
            panic!("{m:?}")
        };
        assert_eq!(fm.match_.fields, vec![Oxm::exact(Field::TunMetadata0, 2)]);
    }
    assert_eq!(
        err(&raw_match(&tlv(0x0001, 40, false, &[1, 0, 0, 0, 2]))),
        (et::BAD_MATCH, bmc::BAD_VALUE)
    );
    assert_eq!(
        err(&raw_match(&tlv(0x0001, 40, true, &[0, 2, 0]))),
        (et::BAD_MATCH, bmc::BAD_LEN)
    );
    assert_eq!(
        err(&raw_match(&tlv(0x0001, 40, false, &[0; 125]))),
        (et::BAD_MATCH, bmc::BAD_LEN)
    );
}
