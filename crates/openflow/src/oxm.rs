//! OXM matches (`OFPMT_OXM`): typed TLVs, the specification's checks on each, and the
//! prerequisites between them.
//!
//! An [`Oxm`] is one field with its value and optional mask, both exactly the field's
//! width (big-endian, as on the wire). Decoding enforces, in this order, for each TLV: a
//! known field ([`bmc::BAD_FIELD`]), the right length ([`bmc::BAD_LEN`]), a mask only
//! where the field allows one ([`bmc::BAD_MASK`]), a value within the field's bits
//! ([`bmc::BAD_VALUE`]) and no value bit outside its mask ([`bmc::BAD_WILDCARDS`]); then for
//! the match, no field twice ([`bmc::DUP_FIELD`]) and every prerequisite present
//! ([`Match::check_prerequisites`], [`bmc::BAD_PREREQ`]). The order of the TLVs is kept,
//! so a decoded match encodes to the same bytes.

use crate::error::{bmc, OfError};
use crate::wire::{pad8, Put, Reader};

/// `OFPXMC_OPENFLOW_BASIC`.
pub const CLASS_OPENFLOW_BASIC: u16 = 0x8000;
/// `OFPXMC_NXM_1`: Nicira's extension class (tunnel endpoints, conntrack, registers).
pub const CLASS_NXM_1: u16 = 0x0001;
/// `OFPXMC_NXM_0`: Nicira's class of OpenFlow 1.0's fields (`NXM_OF_IN_PORT`, 16 bits).
pub const CLASS_NXM_0: u16 = 0x0000;
/// `OFPXMC_PACKET_REGS`: OpenFlow 1.5's packet registers (OVS's `xreg0`..`xreg7`).
pub const CLASS_PACKET_REGS: u16 = 0x8001;
/// `OFPVID_PRESENT`: the VLAN_VID bit saying a VLAN tag is present.
pub const OFPVID_PRESENT: u16 = 0x1000;
/// `OFPMT_OXM`.
pub const OFPMT_OXM: u16 = 1;

/// A match field this codec knows: every OpenFlow 1.3 basic-class field, Nicira's tunnel
/// endpoints, conntrack fields, registers (`reg`, `xxreg`; `xreg` in OpenFlow 1.5's packet
/// register class), `NXM_OF_IN_PORT` and `NXM_NX_IP_TTL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum Field {
    InPort,
    InPhyPort,
    Metadata,
    EthDst,
    EthSrc,
    EthType,
    VlanVid,
    VlanPcp,
    IpDscp,
    IpEcn,
    IpProto,
    Ipv4Src,
    Ipv4Dst,
    TcpSrc,
    TcpDst,
    UdpSrc,
    UdpDst,
    SctpSrc,
    SctpDst,
    Icmpv4Type,
    Icmpv4Code,
    ArpOp,
    ArpSpa,
    ArpTpa,
    ArpSha,
    ArpTha,
    Ipv6Src,
    Ipv6Dst,
    Ipv6Flabel,
    Icmpv6Type,
    Icmpv6Code,
    Ipv6NdTarget,
    Ipv6NdSll,
    Ipv6NdTll,
    MplsLabel,
    MplsTc,
    MplsBos,
    PbbIsid,
    TunnelId,
    Ipv6Exthdr,
    /// `NXM_NX_TUN_IPV4_SRC` (ovs-ofctl's `tun_src`).
    TunIpv4Src,
    /// `NXM_NX_TUN_IPV4_DST` (ovs-ofctl's `tun_dst`).
    TunIpv4Dst,
    /// `NXM_NX_CT_STATE`.
    CtState,
    /// `NXM_NX_CT_ZONE`.
    CtZone,
    /// `NXM_NX_CT_MARK`.
    CtMark,
    /// `NXM_NX_CT_LABEL` (128 bits).
    CtLabel,
    /// `NXM_NX_CT_NW_PROTO`: the original direction's IP protocol.
    CtNwProto,
    /// `NXM_NX_CT_NW_SRC`: the original direction's IPv4 source.
    CtNwSrc,
    /// `NXM_NX_CT_NW_DST`.
    CtNwDst,
    /// `NXM_NX_CT_IPV6_SRC`: the original direction's IPv6 source.
    CtIpv6Src,
    /// `NXM_NX_CT_IPV6_DST`.
    CtIpv6Dst,
    /// `NXM_NX_CT_TP_SRC`: the original direction's transport source port.
    CtTpSrc,
    /// `NXM_NX_CT_TP_DST`.
    CtTpDst,
    /// `NXM_NX_REG0`..`NXM_NX_REG15` (32 bits each).
    Reg0,
    Reg1,
    Reg2,
    Reg3,
    Reg4,
    Reg5,
    Reg6,
    Reg7,
    Reg8,
    Reg9,
    Reg10,
    Reg11,
    Reg12,
    Reg13,
    Reg14,
    Reg15,
    /// `OXM_OF_PKT_REG0`..`7` (64 bits: `xreg i` is `reg 2i` high, `reg 2i+1` low).
    Xreg0,
    Xreg1,
    Xreg2,
    Xreg3,
    Xreg4,
    Xreg5,
    Xreg6,
    Xreg7,
    /// `NXM_NX_XXREG0`..`3` (128 bits: `xxreg j` is `reg 4j` (high) to `reg 4j+3`).
    Xxreg0,
    Xxreg1,
    Xxreg2,
    Xxreg3,
    /// `NXM_OF_IN_PORT`: the input port in 16 bits (OVS writes it with `load:0->in_port`).
    NxmInPort,
    /// `NXM_NX_IP_TTL`: the IPv4 TTL / IPv6 hop limit (OpenFlow has no basic field).
    NxIpTtl,
    /// `NXM_NX_IP_FRAG` (ovs-ofctl's `nw_frag`): bit 0 a fragment, bit 1 a later one.
    NxIpFrag,
    /// Nicira's names of fields OpenFlow also has (`NXM_OF_ETH_SRC`, `NXM_NX_ARP_SHA`, …):
    /// what ovs-ofctl writes as a `move`'s, `load`'s or `output_reg`'s field even in
    /// OpenFlow 1.3. Decoded there only ([`Field::from_header`]), not in matches.
    NxmEthDst,
    NxmEthSrc,
    NxmEthType,
    NxmIpProto,
    NxmIpSrc,
    NxmIpDst,
    NxmTcpSrc,
    NxmTcpDst,
    NxmUdpSrc,
    NxmUdpDst,
    NxmIcmpType,
    NxmIcmpCode,
    NxmArpOp,
    NxmArpSpa,
    NxmArpTpa,
    NxTunId,
    NxArpSha,
    NxArpTha,
    NxIpv6Src,
    NxIpv6Dst,
    NxIcmpv6Type,
    NxIcmpv6Code,
    NxNdTarget,
    NxNdSll,
    NxNdTll,
    NxIpv6Label,
    /// `NXM_NX_TUN_METADATA0..3` (class 1, fields 40..43): variable length in OVS (the
    /// mapped option's); here 4 bytes, the width the pipeline keeps (another length is
    /// `OFPBMC_BAD_LEN`).
    TunMetadata0,
    TunMetadata1,
    TunMetadata2,
    TunMetadata3,
    /// `NXM_NX_CONJ_ID` (class 1, field 37, 32 bits, no mask): the conjunction a rule
    /// applies to (`conj_id=N`); not a packet field, read-only.
    ConjId,
}

/// What the wire says of a field: its class and number, its width, whether it may carry a
/// mask, how many of its low bits are meaningful, whether SET_FIELD may write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldInfo {
    /// OXM class.
    pub class: u16,
    /// OXM field number within the class.
    pub code: u8,
    /// Width in bytes.
    pub len: u8,
    /// Whether the specification allows a mask.
    pub maskable: bool,
    /// Meaningful low bits (a value beyond them is `OFPBMC_BAD_VALUE`).
    pub bits: u8,
    /// Whether SET_FIELD may write it.
    pub settable: bool,
    /// The specification's name in lower case, without `OXM_OF_` (Nicira's with `nx_`),
    /// for logs.
    pub name: &'static str,
}

const fn fi(
    class: u16,
    code: u8,
    len: u8,
    maskable: bool,
    bits: u8,
    settable: bool,
    name: &'static str,
) -> FieldInfo {
    FieldInfo {
        class,
        code,
        len,
        maskable,
        bits,
        settable,
        name,
    }
}

const B: u16 = CLASS_OPENFLOW_BASIC;
const N: u16 = CLASS_NXM_1;
const Z: u16 = CLASS_NXM_0;
const R: u16 = CLASS_PACKET_REGS;

impl Field {
    /// `NXM_NX_REG0`..`NXM_NX_REG15`.
    pub const REGS: [Field; 16] = [
        Field::Reg0,
        Field::Reg1,
        Field::Reg2,
        Field::Reg3,
        Field::Reg4,
        Field::Reg5,
        Field::Reg6,
        Field::Reg7,
        Field::Reg8,
        Field::Reg9,
        Field::Reg10,
        Field::Reg11,
        Field::Reg12,
        Field::Reg13,
        Field::Reg14,
        Field::Reg15,
    ];
    /// `OXM_OF_PKT_REG0`..`7`.
    pub const XREGS: [Field; 8] = [
        Field::Xreg0,
        Field::Xreg1,
        Field::Xreg2,
        Field::Xreg3,
        Field::Xreg4,
        Field::Xreg5,
        Field::Xreg6,
        Field::Xreg7,
    ];
    /// `NXM_NX_XXREG0`..`3`.
    pub const XXREGS: [Field; 4] = [Field::Xxreg0, Field::Xxreg1, Field::Xxreg2, Field::Xxreg3];

    /// Every field, in declaration order.
    pub const ALL: [Field; 89] = [
        Field::InPort,
        Field::InPhyPort,
        Field::Metadata,
        Field::EthDst,
        Field::EthSrc,
        Field::EthType,
        Field::VlanVid,
        Field::VlanPcp,
        Field::IpDscp,
        Field::IpEcn,
        Field::IpProto,
        Field::Ipv4Src,
        Field::Ipv4Dst,
        Field::TcpSrc,
        Field::TcpDst,
        Field::UdpSrc,
        Field::UdpDst,
        Field::SctpSrc,
        Field::SctpDst,
        Field::Icmpv4Type,
        Field::Icmpv4Code,
        Field::ArpOp,
        Field::ArpSpa,
        Field::ArpTpa,
        Field::ArpSha,
        Field::ArpTha,
        Field::Ipv6Src,
        Field::Ipv6Dst,
        Field::Ipv6Flabel,
        Field::Icmpv6Type,
        Field::Icmpv6Code,
        Field::Ipv6NdTarget,
        Field::Ipv6NdSll,
        Field::Ipv6NdTll,
        Field::MplsLabel,
        Field::MplsTc,
        Field::MplsBos,
        Field::PbbIsid,
        Field::TunnelId,
        Field::Ipv6Exthdr,
        Field::TunIpv4Src,
        Field::TunIpv4Dst,
        Field::CtState,
        Field::CtZone,
        Field::CtMark,
        Field::CtLabel,
        Field::CtNwProto,
        Field::CtNwSrc,
        Field::CtNwDst,
        Field::CtIpv6Src,
        Field::CtIpv6Dst,
        Field::CtTpSrc,
        Field::CtTpDst,
        Field::Reg0,
        Field::Reg1,
        Field::Reg2,
        Field::Reg3,
        Field::Reg4,
        Field::Reg5,
        Field::Reg6,
        Field::Reg7,
        Field::Reg8,
        Field::Reg9,
        Field::Reg10,
        Field::Reg11,
        Field::Reg12,
        Field::Reg13,
        Field::Reg14,
        Field::Reg15,
        Field::Xreg0,
        Field::Xreg1,
        Field::Xreg2,
        Field::Xreg3,
        Field::Xreg4,
        Field::Xreg5,
        Field::Xreg6,
        Field::Xreg7,
        Field::Xxreg0,
        Field::Xxreg1,
        Field::Xxreg2,
        Field::Xxreg3,
        Field::NxmInPort,
        Field::NxIpTtl,
        Field::NxIpFrag,
        Field::TunMetadata0,
        Field::TunMetadata1,
        Field::TunMetadata2,
        Field::TunMetadata3,
        Field::ConjId,
    ];

    /// The field's wire description.
    pub const fn info(self) -> FieldInfo {
        use Field::*;
        match self {
            InPort => fi(B, 0, 4, false, 32, true, "in_port"),
            InPhyPort => fi(B, 1, 4, false, 32, false, "in_phy_port"),
            Metadata => fi(B, 2, 8, true, 64, true, "metadata"),
            EthDst => fi(B, 3, 6, true, 48, true, "eth_dst"),
            EthSrc => fi(B, 4, 6, true, 48, true, "eth_src"),
            EthType => fi(B, 5, 2, false, 16, false, "eth_type"),
            VlanVid => fi(B, 6, 2, true, 13, true, "vlan_vid"),
            VlanPcp => fi(B, 7, 1, false, 3, true, "vlan_pcp"),
            IpDscp => fi(B, 8, 1, false, 6, true, "ip_dscp"),
            IpEcn => fi(B, 9, 1, false, 2, true, "ip_ecn"),
            IpProto => fi(B, 10, 1, false, 8, false, "ip_proto"),
            Ipv4Src => fi(B, 11, 4, true, 32, true, "ipv4_src"),
            Ipv4Dst => fi(B, 12, 4, true, 32, true, "ipv4_dst"),
            // Bitwise maskable, as in OVS (an extension of OpenFlow 1.3, which has them exact).
            TcpSrc => fi(B, 13, 2, true, 16, true, "tcp_src"),
            TcpDst => fi(B, 14, 2, true, 16, true, "tcp_dst"),
            UdpSrc => fi(B, 15, 2, true, 16, true, "udp_src"),
            UdpDst => fi(B, 16, 2, true, 16, true, "udp_dst"),
            SctpSrc => fi(B, 17, 2, true, 16, true, "sctp_src"),
            SctpDst => fi(B, 18, 2, true, 16, true, "sctp_dst"),
            Icmpv4Type => fi(B, 19, 1, false, 8, true, "icmpv4_type"),
            Icmpv4Code => fi(B, 20, 1, false, 8, true, "icmpv4_code"),
            ArpOp => fi(B, 21, 2, false, 16, true, "arp_op"),
            ArpSpa => fi(B, 22, 4, true, 32, true, "arp_spa"),
            ArpTpa => fi(B, 23, 4, true, 32, true, "arp_tpa"),
            ArpSha => fi(B, 24, 6, true, 48, true, "arp_sha"),
            ArpTha => fi(B, 25, 6, true, 48, true, "arp_tha"),
            Ipv6Src => fi(B, 26, 16, true, 128, true, "ipv6_src"),
            Ipv6Dst => fi(B, 27, 16, true, 128, true, "ipv6_dst"),
            Ipv6Flabel => fi(B, 28, 4, true, 20, true, "ipv6_flabel"),
            Icmpv6Type => fi(B, 29, 1, false, 8, true, "icmpv6_type"),
            Icmpv6Code => fi(B, 30, 1, false, 8, true, "icmpv6_code"),
            Ipv6NdTarget => fi(B, 31, 16, false, 128, true, "ipv6_nd_target"),
            Ipv6NdSll => fi(B, 32, 6, false, 48, true, "ipv6_nd_sll"),
            Ipv6NdTll => fi(B, 33, 6, false, 48, true, "ipv6_nd_tll"),
            MplsLabel => fi(B, 34, 4, false, 20, true, "mpls_label"),
            MplsTc => fi(B, 35, 1, false, 3, true, "mpls_tc"),
            MplsBos => fi(B, 36, 1, false, 1, false, "mpls_bos"),
            PbbIsid => fi(B, 37, 3, true, 24, true, "pbb_isid"),
            TunnelId => fi(B, 38, 8, true, 64, true, "tunnel_id"),
            Ipv6Exthdr => fi(B, 39, 2, true, 9, false, "ipv6_exthdr"),
            TunIpv4Src => fi(N, 31, 4, true, 32, true, "nx_tun_ipv4_src"),
            TunIpv4Dst => fi(N, 32, 4, true, 32, true, "nx_tun_ipv4_dst"),
            CtState => fi(N, 105, 4, true, 32, false, "nx_ct_state"),
            CtZone => fi(N, 106, 2, false, 16, false, "nx_ct_zone"),
            CtMark => fi(N, 107, 4, true, 32, false, "nx_ct_mark"),
            CtLabel => fi(N, 108, 16, true, 128, false, "nx_ct_label"),
            CtNwProto => fi(N, 119, 1, false, 8, false, "nx_ct_nw_proto"),
            CtNwSrc => fi(N, 120, 4, true, 32, false, "nx_ct_nw_src"),
            CtNwDst => fi(N, 121, 4, true, 32, false, "nx_ct_nw_dst"),
            CtIpv6Src => fi(N, 122, 16, true, 128, false, "nx_ct_ipv6_src"),
            CtIpv6Dst => fi(N, 123, 16, true, 128, false, "nx_ct_ipv6_dst"),
            CtTpSrc => fi(N, 124, 2, true, 16, false, "nx_ct_tp_src"),
            CtTpDst => fi(N, 125, 2, true, 16, false, "nx_ct_tp_dst"),
            Reg0 => fi(N, 0, 4, true, 32, true, "nx_reg0"),
            Reg1 => fi(N, 1, 4, true, 32, true, "nx_reg1"),
            Reg2 => fi(N, 2, 4, true, 32, true, "nx_reg2"),
            Reg3 => fi(N, 3, 4, true, 32, true, "nx_reg3"),
            Reg4 => fi(N, 4, 4, true, 32, true, "nx_reg4"),
            Reg5 => fi(N, 5, 4, true, 32, true, "nx_reg5"),
            Reg6 => fi(N, 6, 4, true, 32, true, "nx_reg6"),
            Reg7 => fi(N, 7, 4, true, 32, true, "nx_reg7"),
            Reg8 => fi(N, 8, 4, true, 32, true, "nx_reg8"),
            Reg9 => fi(N, 9, 4, true, 32, true, "nx_reg9"),
            Reg10 => fi(N, 10, 4, true, 32, true, "nx_reg10"),
            Reg11 => fi(N, 11, 4, true, 32, true, "nx_reg11"),
            Reg12 => fi(N, 12, 4, true, 32, true, "nx_reg12"),
            Reg13 => fi(N, 13, 4, true, 32, true, "nx_reg13"),
            Reg14 => fi(N, 14, 4, true, 32, true, "nx_reg14"),
            Reg15 => fi(N, 15, 4, true, 32, true, "nx_reg15"),
            Xreg0 => fi(R, 0, 8, true, 64, true, "pkt_reg0"),
            Xreg1 => fi(R, 1, 8, true, 64, true, "pkt_reg1"),
            Xreg2 => fi(R, 2, 8, true, 64, true, "pkt_reg2"),
            Xreg3 => fi(R, 3, 8, true, 64, true, "pkt_reg3"),
            Xreg4 => fi(R, 4, 8, true, 64, true, "pkt_reg4"),
            Xreg5 => fi(R, 5, 8, true, 64, true, "pkt_reg5"),
            Xreg6 => fi(R, 6, 8, true, 64, true, "pkt_reg6"),
            Xreg7 => fi(R, 7, 8, true, 64, true, "pkt_reg7"),
            Xxreg0 => fi(N, 111, 16, true, 128, true, "nx_xxreg0"),
            Xxreg1 => fi(N, 112, 16, true, 128, true, "nx_xxreg1"),
            Xxreg2 => fi(N, 113, 16, true, 128, true, "nx_xxreg2"),
            Xxreg3 => fi(N, 114, 16, true, 128, true, "nx_xxreg3"),
            NxmInPort => fi(Z, 0, 2, false, 16, true, "nx_of_in_port"),
            NxIpTtl => fi(N, 29, 1, false, 8, true, "nx_ip_ttl"),
            NxIpFrag => fi(N, 26, 1, true, 2, false, "nx_ip_frag"),
            NxmEthDst => fi(Z, 1, 6, true, 48, true, "nx_of_eth_dst"),
            NxmEthSrc => fi(Z, 2, 6, true, 48, true, "nx_of_eth_src"),
            NxmEthType => fi(Z, 3, 2, false, 16, false, "nx_of_eth_type"),
            NxmIpProto => fi(Z, 6, 1, false, 8, false, "nx_of_ip_proto"),
            NxmIpSrc => fi(Z, 7, 4, true, 32, true, "nx_of_ip_src"),
            NxmIpDst => fi(Z, 8, 4, true, 32, true, "nx_of_ip_dst"),
            NxmTcpSrc => fi(Z, 9, 2, true, 16, true, "nx_of_tcp_src"),
            NxmTcpDst => fi(Z, 10, 2, true, 16, true, "nx_of_tcp_dst"),
            NxmUdpSrc => fi(Z, 11, 2, true, 16, true, "nx_of_udp_src"),
            NxmUdpDst => fi(Z, 12, 2, true, 16, true, "nx_of_udp_dst"),
            NxmIcmpType => fi(Z, 13, 1, false, 8, true, "nx_of_icmp_type"),
            NxmIcmpCode => fi(Z, 14, 1, false, 8, true, "nx_of_icmp_code"),
            NxmArpOp => fi(Z, 15, 2, false, 16, true, "nx_of_arp_op"),
            NxmArpSpa => fi(Z, 16, 4, true, 32, true, "nx_of_arp_spa"),
            NxmArpTpa => fi(Z, 17, 4, true, 32, true, "nx_of_arp_tpa"),
            NxTunId => fi(N, 16, 8, true, 64, true, "nx_tun_id"),
            NxArpSha => fi(N, 17, 6, true, 48, true, "nx_arp_sha"),
            NxArpTha => fi(N, 18, 6, true, 48, true, "nx_arp_tha"),
            NxIpv6Src => fi(N, 19, 16, true, 128, true, "nx_ipv6_src"),
            NxIpv6Dst => fi(N, 20, 16, true, 128, true, "nx_ipv6_dst"),
            NxIcmpv6Type => fi(N, 21, 1, false, 8, true, "nx_icmpv6_type"),
            NxIcmpv6Code => fi(N, 22, 1, false, 8, true, "nx_icmpv6_code"),
            NxNdTarget => fi(N, 23, 16, true, 128, true, "nx_nd_target"),
            NxNdSll => fi(N, 24, 6, true, 48, true, "nx_nd_sll"),
            NxNdTll => fi(N, 25, 6, true, 48, true, "nx_nd_tll"),
            NxIpv6Label => fi(N, 27, 4, true, 20, true, "nx_ipv6_label"),
            TunMetadata0 => fi(N, 40, 4, true, 32, true, "nx_tun_metadata0"),
            TunMetadata1 => fi(N, 41, 4, true, 32, true, "nx_tun_metadata1"),
            TunMetadata2 => fi(N, 42, 4, true, 32, true, "nx_tun_metadata2"),
            TunMetadata3 => fi(N, 43, 4, true, 32, true, "nx_tun_metadata3"),
            ConjId => fi(N, 37, 4, false, 32, false, "nx_conj_id"),
        }
    }

    /// The Nicira aliases of OpenFlow's fields (see [`Field::NxmEthDst`]).
    pub const NXM_ALIASES: [Field; 26] = [
        Field::NxmEthDst,
        Field::NxmEthSrc,
        Field::NxmEthType,
        Field::NxmIpProto,
        Field::NxmIpSrc,
        Field::NxmIpDst,
        Field::NxmTcpSrc,
        Field::NxmTcpDst,
        Field::NxmUdpSrc,
        Field::NxmUdpDst,
        Field::NxmIcmpType,
        Field::NxmIcmpCode,
        Field::NxmArpOp,
        Field::NxmArpSpa,
        Field::NxmArpTpa,
        Field::NxTunId,
        Field::NxArpSha,
        Field::NxArpTha,
        Field::NxIpv6Src,
        Field::NxIpv6Dst,
        Field::NxIcmpv6Type,
        Field::NxIcmpv6Code,
        Field::NxNdTarget,
        Field::NxNdSll,
        Field::NxNdTll,
        Field::NxIpv6Label,
    ];

    /// `NXM_NX_TUN_METADATA0..3`: variable length on the wire (see `Oxm::decode`).
    pub fn is_tun_metadata(self) -> bool {
        matches!(
            self,
            Field::TunMetadata0 | Field::TunMetadata1 | Field::TunMetadata2 | Field::TunMetadata3
        )
    }

    /// The field with OXM class `class` and number `code`, if this codec knows it.
    pub fn from_wire(class: u16, code: u8) -> Option<Field> {
        Field::ALL
            .into_iter()
            .find(|f| f.info().class == class && f.info().code == code)
    }

    /// [`Field::from_wire`] for the field header of an action (`move`, `load`,
    /// `output_reg`, a `ct` zone): Nicira's names of OpenFlow's fields too.
    pub fn from_header(class: u16, code: u8) -> Option<Field> {
        Field::from_wire(class, code).or_else(|| {
            Field::NXM_ALIASES
                .into_iter()
                .find(|f| f.info().class == class && f.info().code == code)
        })
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.info().name)
    }
}

/// One OXM TLV: a field, its value and its mask, each exactly the field's width,
/// big-endian.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Oxm {
    /// The field.
    pub field: Field,
    /// Its value (the field's width).
    pub value: Vec<u8>,
    /// Its mask (the field's width), if any.
    pub mask: Option<Vec<u8>>,
}

fn be_bytes(v: u128, len: u8) -> Vec<u8> {
    v.to_be_bytes()[16 - usize::from(len)..].to_vec()
}

fn be_value(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |acc, &x| (acc << 8) | u128::from(x))
}

impl Oxm {
    /// An exact match of `field` on `value` (its low bytes, big-endian).
    pub fn exact(field: Field, value: u128) -> Oxm {
        Oxm {
            field,
            value: be_bytes(value, field.info().len),
            mask: None,
        }
    }

    /// A masked match of `field`.
    pub fn masked(field: Field, value: u128, mask: u128) -> Oxm {
        let len = field.info().len;
        Oxm {
            field,
            value: be_bytes(value, len),
            mask: Some(be_bytes(mask, len)),
        }
    }

    /// The value as a number.
    pub fn value_u128(&self) -> u128 {
        be_value(&self.value)
    }

    /// The mask as a number (all ones without a mask).
    pub fn mask_u128(&self) -> u128 {
        match &self.mask {
            Some(m) => be_value(m),
            None => all_ones(self.field.info().len),
        }
    }

    /// The TLV's header word.
    fn header(&self) -> u32 {
        let i = self.field.info();
        let has_mask = self.mask.is_some();
        let len = u32::from(i.len) * if has_mask { 2 } else { 1 };
        (u32::from(i.class) << 16) | (u32::from(i.code) << 9) | (u32::from(has_mask) << 8) | len
    }

    /// The TLV's wire length (header included).
    pub fn wire_len(&self) -> usize {
        4 + self.value.len() + self.mask.as_ref().map_or(0, Vec::len)
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.header());
        out.extend_from_slice(&self.value);
        if let Some(m) = &self.mask {
            out.extend_from_slice(m);
        }
    }

    /// Decodes one TLV from the start of `buf`; returns it and its length. Errors are
    /// `OFPET_BAD_MATCH` codes (SET_FIELD maps them onto its own).
    pub(crate) fn decode(buf: &[u8]) -> Result<(Oxm, usize), OfError> {
        let mut r = Reader::new(
            buf,
            OfError::matching(bmc::BAD_LEN, "OXM TLV runs past the match"),
        );
        let header = r.u32()?;
        let class = (header >> 16) as u16;
        let code = ((header >> 9) & 0x7f) as u8;
        let has_mask = header & 0x100 != 0;
        let len = (header & 0xff) as usize;
        let field = Field::from_wire(class, code)
            .ok_or(OfError::matching(bmc::BAD_FIELD, "unknown OXM field"))?;
        let info = field.info();
        let width = usize::from(info.len);
        if field.is_tun_metadata() {
            // Variable length in OVS: ovs-ofctl writes a value in as few bytes as it
            // takes (`set_field:0x2->tun_metadata0` is one byte), at most the option
            // space's 124. Kept as the 4 bytes the pipeline holds; a value or mask bit
            // beyond them is `OFPBMC_BAD_VALUE`.
            let n = if has_mask { len / 2 } else { len };
            if n == 0 || n > 124 || (has_mask && len % 2 != 0) {
                return Err(OfError::matching(
                    bmc::BAD_LEN,
                    "OXM length does not fit a tunnel option",
                ));
            }
            let take = |r: &mut Reader<'_>| -> Result<Vec<u8>, OfError> {
                let b = r.bytes(n)?;
                let cut = n.saturating_sub(width);
                if b[..cut].iter().any(|&x| x != 0) {
                    return Err(OfError::matching(
                        bmc::BAD_VALUE,
                        "tunnel option value wider than the pipeline keeps",
                    ));
                }
                let mut v = vec![0u8; width - (n - cut)];
                v.extend_from_slice(&b[cut..]);
                Ok(v)
            };
            let value = take(&mut r)?;
            let mask = if has_mask { Some(take(&mut r)?) } else { None };
            let oxm = Oxm { field, value, mask };
            if oxm.value_u128() & !oxm.mask_u128() != 0 {
                return Err(OfError::matching(
                    bmc::BAD_WILDCARDS,
                    "OXM value has bits outside its mask",
                ));
            }
            return Ok((oxm, r.pos()));
        }
        if len != width * if has_mask { 2 } else { 1 } {
            return Err(OfError::matching(
                bmc::BAD_LEN,
                "OXM length does not match the field's width",
            ));
        }
        let value = r.bytes(width)?.to_vec();
        let mask = if has_mask {
            Some(r.bytes(width)?.to_vec())
        } else {
            None
        };
        if has_mask && !info.maskable {
            return Err(OfError::matching(
                bmc::BAD_MASK,
                "OXM field may not carry a mask",
            ));
        }
        let oxm = Oxm { field, value, mask };
        let v = oxm.value_u128();
        if u32::from(info.bits) < 128 && v >> info.bits != 0 {
            return Err(OfError::matching(
                bmc::BAD_VALUE,
                "OXM value has bits beyond the field's width",
            ));
        }
        if v & !oxm.mask_u128() != 0 {
            return Err(OfError::matching(
                bmc::BAD_WILDCARDS,
                "OXM value has bits outside its mask",
            ));
        }
        Ok((oxm, r.pos()))
    }
}

fn all_ones(len: u8) -> u128 {
    if len >= 16 {
        u128::MAX
    } else {
        (1u128 << (u32::from(len) * 8)) - 1
    }
}

/// An `ofp_match` of type `OFPMT_OXM`: an ordered list of fields, none twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Match {
    /// The TLVs in wire order.
    pub fields: Vec<Oxm>,
}

impl Match {
    /// The empty match (every packet).
    pub fn new() -> Match {
        Match::default()
    }

    /// Adds a TLV (builder style).
    pub fn with(mut self, oxm: Oxm) -> Match {
        self.fields.push(oxm);
        self
    }

    /// The TLV of `field`, if present.
    pub fn get(&self, field: Field) -> Option<&Oxm> {
        self.fields.iter().find(|o| o.field == field)
    }

    fn exact(&self, field: Field) -> Option<u128> {
        self.get(field)
            .filter(|o| o.mask.is_none())
            .map(Oxm::value_u128)
    }

    /// The length of the encoded match, padding included.
    pub fn wire_len(&self) -> usize {
        pad8(4 + self.fields.iter().map(Oxm::wire_len).sum::<usize>())
    }

    /// Checks the specification's prerequisites (OpenFlow 1.3 §7.2.3.6): each field's
    /// prerequisite fields are present with an exact value that satisfies it. The TLVs'
    /// order does not matter. A missing or unsatisfied one is `OFPBMC_BAD_PREREQ`.
    pub fn check_prerequisites(&self) -> Result<(), OfError> {
        let eth = self.exact(Field::EthType);
        let proto = self.exact(Field::IpProto);
        let is_ip = matches!(eth, Some(0x0800) | Some(0x86dd));
        let is_v4 = eth == Some(0x0800);
        let is_v6 = eth == Some(0x86dd);
        let icmp6 = self.exact(Field::Icmpv6Type);
        let vlan_present = self.get(Field::VlanVid).is_some_and(|o| {
            let p = u128::from(OFPVID_PRESENT);
            o.value_u128() & p != 0 && o.mask_u128() & p != 0
        });
        // OVS's "CT valid" prerequisite of the original-direction fields: the match pins
        // ct_state's trk and inv bits to +trk-inv.
        let ct_valid = self.get(Field::CtState).is_some_and(|o| {
            let (v, m) = (o.value_u128(), o.mask_u128());
            m & 0x30 == 0x30 && v & 0x30 == 0x20
        });
        for o in &self.fields {
            use Field::*;
            let ok = match o.field {
                CtNwProto | CtNwSrc | CtNwDst | CtIpv6Src | CtIpv6Dst | CtTpSrc | CtTpDst => {
                    ct_valid
                }
                InPhyPort => self.get(InPort).is_some(),
                VlanPcp => vlan_present,
                IpDscp | IpEcn | IpProto => is_ip,
                Ipv4Src | Ipv4Dst => is_v4,
                TcpSrc | TcpDst => is_ip && proto == Some(6),
                UdpSrc | UdpDst => is_ip && proto == Some(17),
                SctpSrc | SctpDst => is_ip && proto == Some(132),
                Icmpv4Type | Icmpv4Code => is_v4 && proto == Some(1),
                // ARP's fields, of RARP too (OVS's `is_arp`).
                ArpOp | ArpSpa | ArpTpa | ArpSha | ArpTha => matches!(eth, Some(0x0806 | 0x8035)),
                Ipv6Src | Ipv6Dst | Ipv6Flabel | Ipv6Exthdr => is_v6,
                NxIpTtl | NxIpFrag => is_ip,
                Icmpv6Type | Icmpv6Code => is_v6 && proto == Some(58),
                Ipv6NdTarget => is_v6 && proto == Some(58) && matches!(icmp6, Some(135 | 136)),
                Ipv6NdSll => is_v6 && proto == Some(58) && icmp6 == Some(135),
                Ipv6NdTll => is_v6 && proto == Some(58) && icmp6 == Some(136),
                MplsLabel | MplsTc | MplsBos => matches!(eth, Some(0x8847 | 0x8848)),
                PbbIsid => eth == Some(0x88e7),
                _ => true,
            };
            if !ok {
                log::debug!("OXM field {} lacks its prerequisite", o.field);
                return Err(OfError::matching(
                    bmc::BAD_PREREQ,
                    "a match field lacks its prerequisite",
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u16(OFPMT_OXM);
        out.put_u16(0);
        for o in &self.fields {
            o.encode(out);
        }
        let len = out.len() - start;
        out.patch_u16(start + 2, crate::wire::len16(len, "match"));
        out.pad8_from(start);
    }

    /// Decodes a match from the start of `buf`: checks each TLV, duplicates and
    /// prerequisites. Returns it and its padded length.
    pub(crate) fn decode(buf: &[u8]) -> Result<(Match, usize), OfError> {
        let short = OfError::matching(bmc::BAD_LEN, "match runs past the message");
        let mut r = Reader::new(buf, short);
        let type_ = r.u16()?;
        let len = usize::from(r.u16()?);
        if type_ != OFPMT_OXM {
            return Err(OfError::matching(
                bmc::BAD_TYPE,
                "match is not of type OFPMT_OXM",
            ));
        }
        if len < 4 {
            return Err(OfError::matching(bmc::BAD_LEN, "match length below 4"));
        }
        if pad8(len) > buf.len() {
            return Err(short);
        }
        let mut body = &buf[4..len];
        let mut m = Match::new();
        while !body.is_empty() {
            let (oxm, used) = Oxm::decode(body)?;
            if m.get(oxm.field).is_some() {
                return Err(OfError::matching(
                    bmc::DUP_FIELD,
                    "a match field appears twice",
                ));
            }
            m.fields.push(oxm);
            body = &body[used..];
        }
        if buf[len..pad8(len)].iter().any(|&b| b != 0) {
            log::debug!("match padding is not zero (ignored)");
        }
        m.check_prerequisites()?;
        Ok((m, pad8(len)))
    }
}
