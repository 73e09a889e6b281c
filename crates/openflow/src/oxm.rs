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
/// `OFPXMC_NXM_1`: Nicira's extension class (tunnel endpoints, conntrack).
pub const CLASS_NXM_1: u16 = 0x0001;
/// `OFPVID_PRESENT`: the VLAN_VID bit saying a VLAN tag is present.
pub const OFPVID_PRESENT: u16 = 0x1000;
/// `OFPMT_OXM`.
pub const OFPMT_OXM: u16 = 1;

/// A match field this codec knows: every OpenFlow 1.3 basic-class field, and Nicira's
/// tunnel endpoints and conntrack fields.
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
    /// `NXM_NX_TUN_METADATA0..3` (class 1, fields 40..43): variable length in OVS (the
    /// mapped option's); here 4 bytes, the width the pipeline keeps (another length is
    /// `OFPBMC_BAD_LEN`).
    TunMetadata0,
    TunMetadata1,
    TunMetadata2,
    TunMetadata3,
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

impl Field {
    /// Every field, in declaration order.
    pub const ALL: [Field; 57] = [
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
        Field::TunMetadata0,
        Field::TunMetadata1,
        Field::TunMetadata2,
        Field::TunMetadata3,
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
            TunMetadata0 => fi(N, 40, 4, true, 32, true, "nx_tun_metadata0"),
            TunMetadata1 => fi(N, 41, 4, true, 32, true, "nx_tun_metadata1"),
            TunMetadata2 => fi(N, 42, 4, true, 32, true, "nx_tun_metadata2"),
            TunMetadata3 => fi(N, 43, 4, true, 32, true, "nx_tun_metadata3"),
        }
    }

    /// The field with OXM class `class` and number `code`, if this codec knows it.
    pub fn from_wire(class: u16, code: u8) -> Option<Field> {
        Field::ALL
            .into_iter()
            .find(|f| f.info().class == class && f.info().code == code)
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
                ArpOp | ArpSpa | ArpTpa | ArpSha | ArpTha => eth == Some(0x0806),
                Ipv6Src | Ipv6Dst | Ipv6Flabel | Ipv6Exthdr => is_v6,
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
