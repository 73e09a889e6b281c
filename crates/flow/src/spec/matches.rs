//! The match part of a rule or filter: `name[=value]` tokens into a [`Match`] (plus the
//! rule's own fields: table, priority, cookie, timeouts, input port), the ovs-ofctl
//! shorthands (`ip`, `tcp6`, `arp`, ...), and OpenFlow's prerequisites: a field is matched
//! only when the match pins the protocol that carries it, and protocols never conflict.

use crate::key::{
    is_mpls, Field, ETH_ARP, ETH_IPV4, ETH_IPV6, ETH_MPLS, ETH_MPLS_MCAST, ETH_RARP, FRAG_ANY,
    FRAG_LATER, IP_ICMP, IP_ICMPV6, IP_SCTP, IP_TCP, IP_UDP, ND_NA, ND_NS, VLAN_CFI,
};
use crate::matching::Match;

use super::values::{bad, ipv4_masked, ipv6_masked, mac, num, port_name, tokens, with_mask};
use super::ParseError;

/// What a match has been told, field by field, for prerequisite checks.
#[derive(Default)]
pub(super) struct Parsed {
    pub(super) table: Option<u8>,
    pub(super) priority: Option<u16>,
    pub(super) cookie: Option<(u64, u64)>,
    pub(super) idle: u16,
    pub(super) hard: u16,
    pub(super) in_port: Option<String>,
    pub(super) m: Match,
    /// Fields set by name, for prerequisite messages.
    pub(super) named: Vec<(String, Field)>,
}

fn set_eth_type(p: &mut Parsed, ty: u16) -> Result<(), ParseError> {
    let (v, m) = p.m.field(Field::EthType);
    if m != 0 && v != u128::from(ty) {
        return Err(ParseError::Invalid(format!(
            "conflicting Ethernet types {v:#06x} and {ty:#06x}"
        )));
    }
    p.m.set(Field::EthType, u128::from(ty), 0xffff);
    Ok(())
}

fn set_proto(p: &mut Parsed, proto: u8) -> Result<(), ParseError> {
    let (v, m) = p.m.field(Field::IpProto);
    if m != 0 && v != u128::from(proto) {
        return Err(ParseError::Invalid(format!(
            "conflicting IP protocols {v} and {proto}"
        )));
    }
    p.m.set(Field::IpProto, u128::from(proto), 0xff);
    Ok(())
}

/// Parses one `name[=value]` match token into `p`.
fn match_token(p: &mut Parsed, name: &str, value: Option<&str>) -> Result<(), ParseError> {
    let shorthand = |ty: u16, proto: Option<u8>| (ty, proto);
    let sh = match name {
        "ip" => Some(shorthand(ETH_IPV4, None)),
        "ipv6" => Some(shorthand(ETH_IPV6, None)),
        "arp" => Some(shorthand(ETH_ARP, None)),
        "rarp" => Some(shorthand(ETH_RARP, None)),
        "tcp" => Some(shorthand(ETH_IPV4, Some(IP_TCP))),
        "udp" => Some(shorthand(ETH_IPV4, Some(IP_UDP))),
        "sctp" => Some(shorthand(ETH_IPV4, Some(IP_SCTP))),
        "icmp" => Some(shorthand(ETH_IPV4, Some(IP_ICMP))),
        "tcp6" => Some(shorthand(ETH_IPV6, Some(IP_TCP))),
        "udp6" => Some(shorthand(ETH_IPV6, Some(IP_UDP))),
        "sctp6" => Some(shorthand(ETH_IPV6, Some(IP_SCTP))),
        "icmp6" => Some(shorthand(ETH_IPV6, Some(IP_ICMPV6))),
        "mpls" => Some(shorthand(ETH_MPLS, None)),
        "mplsm" => Some(shorthand(ETH_MPLS_MCAST, None)),
        _ => None,
    };
    if let Some((ty, proto)) = sh {
        if value.is_some() {
            return Err(ParseError::Invalid(format!("'{name}' takes no value")));
        }
        set_eth_type(p, ty)?;
        if let Some(pr) = proto {
            set_proto(p, pr)?;
        }
        return Ok(());
    }
    let v = value.ok_or_else(|| {
        if FIELD_NAMES.contains(&name) || super::fields::register_by_name(name).is_some() {
            ParseError::NoValue(name.into())
        } else {
            ParseError::UnknownField(name.into())
        }
    })?;
    let mut field = |f: Field, val: u128, mask: u128| {
        p.m.set(f, val, mask);
        p.named.push((name.to_string(), f));
    };
    match name {
        "table" => {
            p.table = Some(num(name, v, 254)? as u8);
        }
        "priority" => p.priority = Some(num(name, v, 65535)? as u16),
        // Not a packet field and not maskable (OVS's MFF_CONJ_ID): see crate::classifier.
        "conj_id" => p.m.conj_id = Some(num(name, v, u128::from(u32::MAX))? as u32),
        "cookie" => {
            let (c, m) = match v.split_once('/') {
                Some((c, "-1")) => (num(name, c, u128::from(u64::MAX))?, u128::from(u64::MAX)),
                Some((c, m)) => (
                    num(name, c, u128::from(u64::MAX))?,
                    num(name, m, u128::from(u64::MAX))?,
                ),
                None => (num(name, v, u128::from(u64::MAX))?, u128::from(u64::MAX)),
            };
            p.cookie = Some((c as u64, m as u64));
        }
        "idle_timeout" => p.idle = num(name, v, 65535)? as u16,
        "hard_timeout" => p.hard = num(name, v, 65535)? as u16,
        "in_port" => {
            if v.is_empty() {
                return Err(ParseError::NoValue(name.into()));
            }
            p.in_port = Some(port_name(name, v)?);
        }
        "dl_src" | "eth_src" => {
            let (a, m) = with_mask(name, v, Field::EthSrc.full(), |s| mac(name, s))?;
            field(Field::EthSrc, a, m);
        }
        "dl_dst" | "eth_dst" => {
            let (a, m) = with_mask(name, v, Field::EthDst.full(), |s| mac(name, s))?;
            field(Field::EthDst, a, m);
        }
        "dl_type" | "eth_type" => {
            set_eth_type(p, num(name, v, 0xffff)? as u16)?;
        }
        "dl_vlan" => {
            let vid = num(name, v, 0xffff)?;
            if vid == 0xffff {
                // No 802.1Q header.
                field(Field::VlanTci, 0, 0xffff);
            } else if vid > 4095 {
                return Err(ParseError::Invalid(format!(
                    "{name}: {v} is out of range 0..=4095 (0xffff: untagged)"
                )));
            } else {
                field(Field::VlanTci, u128::from(VLAN_CFI) | vid, 0x1fff);
            }
        }
        "dl_vlan_pcp" => {
            let pcp = num(name, v, 7)?;
            field(Field::VlanTci, (pcp << 13) | u128::from(VLAN_CFI), 0xf000);
        }
        "vlan_tci" => {
            let (a, m) = with_mask(name, v, 0xffff, |s| num(name, s, 0xffff))?;
            field(Field::VlanTci, a, m);
        }
        "nw_src" | "ip_src" | "arp_spa" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::Ipv4Src, a, m);
        }
        "nw_dst" | "ip_dst" | "arp_tpa" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::Ipv4Dst, a, m);
        }
        "ipv6_src" => {
            let (a, m) = ipv6_masked(name, v)?;
            field(Field::Ipv6Src, a, m);
        }
        "ipv6_dst" => {
            let (a, m) = ipv6_masked(name, v)?;
            field(Field::Ipv6Dst, a, m);
        }
        "nw_proto" | "ip_proto" => {
            let pr = num(name, v, 255)? as u8;
            set_proto(p, pr)?;
            p.named.push((name.to_string(), Field::IpProto));
        }
        "nw_tos" => {
            let t = num(name, v, 255)?;
            if t & 3 != 0 {
                return Err(ParseError::Invalid(format!(
                    "nw_tos: {v} has ECN bits set (nw_tos matches the DSCP bits: a multiple of 4)"
                )));
            }
            field(Field::IpTos, t, 0xfc);
        }
        "nw_ttl" => {
            let t = num(name, v, 255)?;
            field(Field::IpTtl, t, 0xff);
        }
        "ip_frag" | "nw_frag" => {
            let (val, mask) = match v {
                "no" => (0, FRAG_ANY),
                "yes" => (FRAG_ANY, FRAG_ANY),
                "first" => (FRAG_ANY, FRAG_ANY | FRAG_LATER),
                "later" => (FRAG_ANY | FRAG_LATER, FRAG_ANY | FRAG_LATER),
                "not_later" => (0, FRAG_LATER),
                _ => return Err(bad(name, v, "no, yes, first, later or not_later")),
            };
            field(Field::IpFrag, u128::from(val), u128::from(mask));
        }
        "tp_src" | "tcp_src" | "udp_src" | "sctp_src" | "icmp_type" | "icmpv6_type" => {
            let max = if name.starts_with("icmp") { 255 } else { 65535 };
            let (a, m) = with_mask(name, v, 0xffff, |s| num(name, s, max))?;
            field(Field::TpSrc, a, m);
        }
        "tp_dst" | "tcp_dst" | "udp_dst" | "sctp_dst" | "icmp_code" | "icmpv6_code" => {
            let max = if name.starts_with("icmp") { 255 } else { 65535 };
            let (a, m) = with_mask(name, v, 0xffff, |s| num(name, s, max))?;
            field(Field::TpDst, a, m);
        }
        "arp_op" => {
            let op = num(name, v, 0xffff)?;
            field(Field::ArpOp, op, 0xffff);
        }
        "nw_ecn" | "ip_ecn" => {
            let e = num(name, v, 3)?;
            field(Field::IpTos, e, 0x03);
        }
        "arp_sha" | "nd_sll" => {
            let (a, m) = with_mask(name, v, Field::ArpSha.full(), |s| mac(name, s))?;
            field(Field::ArpSha, a, m);
        }
        "arp_tha" | "nd_tll" => {
            let (a, m) = with_mask(name, v, Field::ArpTha.full(), |s| mac(name, s))?;
            field(Field::ArpTha, a, m);
        }
        "nd_target" => {
            let (a, m) = ipv6_masked(name, v)?;
            field(Field::NdTarget, a, m);
        }
        "ipv6_label" | "ipv6_flabel" => {
            let full = Field::Ipv6Flabel.full();
            let (a, m) = with_mask(name, v, full, |s| num(name, s, full))?;
            field(Field::Ipv6Flabel, a, m);
        }
        "metadata" => {
            let (a, m) = with_mask(name, v, u128::from(u64::MAX), |s| {
                num(name, s, u128::from(u64::MAX))
            })?;
            field(Field::Metadata, a, m);
        }
        "tun_id" | "tunnel_id" => {
            let (a, m) = with_mask(name, v, u128::from(u64::MAX), |s| {
                num(name, s, u128::from(u64::MAX))
            })?;
            field(Field::TunId, a, m);
        }
        "tun_src" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::TunSrc, a, m);
        }
        "tun_metadata0" | "tun_metadata1" | "tun_metadata2" | "tun_metadata3" => {
            let f = tun_metadata_field(name).unwrap_or(Field::TunMetadata0);
            let (a, m) = with_mask(name, v, f.full(), |s| num(name, s, f.full()))?;
            field(f, a, m);
        }
        "tun_dst" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::TunDst, a, m);
        }
        "mpls_label" => field(Field::MplsLabel, num(name, v, 0xfffff)?, 0xfffff),
        "mpls_tc" => field(Field::MplsTc, num(name, v, 7)?, 7),
        "mpls_bos" => field(Field::MplsBos, num(name, v, 1)?, 1),
        "mpls_ttl" => field(Field::MplsTtl, num(name, v, 255)?, 0xff),
        "ct_state" => {
            let (a, m) = super::ct::parse_ct_state(v)?;
            field(Field::CtState, a, m);
        }
        "ct_zone" => field(Field::CtZone, no_mask(name, v, 0xffff)?, 0xffff),
        "ct_mark" => {
            let full = Field::CtMark.full();
            let (a, m) = with_mask(name, v, full, |s| num(name, s, full))?;
            field(Field::CtMark, a, m);
        }
        "ct_label" => {
            let (a, m) = with_mask(name, v, u128::MAX, |s| num(name, s, u128::MAX))?;
            field(Field::CtLabel, a, m);
        }
        "ct_nw_src" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::CtNwSrc, a, m);
        }
        "ct_nw_dst" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::CtNwDst, a, m);
        }
        "ct_nw_proto" => {
            let pr = no_mask(name, v, 0xff)?;
            if pr == 0 {
                // OVS takes it for no match at all (and its ct_tp_* with it).
                return Err(ParseError::Invalid(
                    "ct_nw_proto=0 matches no protocol (OVS drops it): leave it out".into(),
                ));
            }
            field(Field::CtNwProto, pr, 0xff);
        }
        "ct_tp_src" => {
            let (a, m) = with_mask(name, v, 0xffff, |s| num(name, s, 0xffff))?;
            field(Field::CtTpSrc, a, m);
        }
        "ct_tp_dst" => {
            let (a, m) = with_mask(name, v, 0xffff, |s| num(name, s, 0xffff))?;
            field(Field::CtTpDst, a, m);
        }
        // Registers: reg0..reg15 (32 bits), xreg0..xreg7 (64), xxreg0..xxreg3 (128), each
        // VALUE[/MASK] (views of the same bits: xreg0 is reg0 and reg1).
        _ => {
            let Some(f) = super::fields::register_by_name(name) else {
                return Err(ParseError::UnknownField(name.into()));
            };
            let full = f.full();
            let (a, m) = with_mask(name, v, full, |s| num(name, s, full))?;
            field(f, a, m);
        }
    }
    Ok(())
}

/// A field OVS matches only exactly (`ct_zone`, `ct_nw_proto`): a mask is refused.
fn no_mask(name: &str, v: &str, max: u128) -> Result<u128, ParseError> {
    if v.contains('/') {
        return Err(ParseError::Invalid(format!(
            "{name}: '{v}': {name} cannot be masked"
        )));
    }
    num(name, v, max)
}

/// Field names the parser knows (for "needs a value" vs "unknown" errors).
const FIELD_NAMES: &[&str] = &[
    "table",
    "conj_id",
    "priority",
    "cookie",
    "idle_timeout",
    "hard_timeout",
    "in_port",
    "dl_src",
    "eth_src",
    "dl_dst",
    "eth_dst",
    "dl_type",
    "eth_type",
    "dl_vlan",
    "dl_vlan_pcp",
    "vlan_tci",
    "nw_src",
    "ip_src",
    "nw_dst",
    "ip_dst",
    "arp_spa",
    "arp_tpa",
    "ipv6_src",
    "ipv6_dst",
    "nw_proto",
    "ip_proto",
    "nw_tos",
    "nw_ttl",
    "ip_frag",
    "nw_frag",
    "tp_src",
    "tp_dst",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
    "sctp_src",
    "sctp_dst",
    "icmp_type",
    "icmp_code",
    "icmpv6_type",
    "icmpv6_code",
    "arp_op",
    "nw_ecn",
    "ip_ecn",
    "arp_sha",
    "arp_tha",
    "nd_sll",
    "nd_tll",
    "nd_target",
    "ipv6_label",
    "ipv6_flabel",
    "tun_id",
    "tunnel_id",
    "metadata",
    "tun_src",
    "tun_dst",
    "tun_metadata0",
    "tun_metadata1",
    "tun_metadata2",
    "tun_metadata3",
    "mpls_label",
    "mpls_tc",
    "mpls_bos",
    "mpls_ttl",
    "ct_state",
    "ct_zone",
    "ct_mark",
    "ct_label",
    "ct_nw_src",
    "ct_nw_dst",
    "ct_nw_proto",
    "ct_tp_src",
    "ct_tp_dst",
];

/// OpenFlow prerequisites: a field may only be matched when the match pins the protocol
/// that carries it.
fn check_prerequisites(p: &Parsed) -> Result<(), ParseError> {
    let (ty, tym) = p.m.field(Field::EthType);
    let ty = if tym != 0 { Some(ty as u16) } else { None };
    let (pr, prm) = p.m.field(Field::IpProto);
    let proto = if prm != 0 { Some(pr as u8) } else { None };
    let ip = matches!(ty, Some(ETH_IPV4 | ETH_IPV6));
    let (icmp_ty, icmp_tym) = p.m.field(Field::TpSrc);
    let icmp6 = ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6);
    // An ND message: ICMPv6 with the type matched exactly.
    let nd_type = (icmp6 && icmp_tym & 0xff == 0xff).then_some(icmp_ty as u8);
    // OVS's "CT" prerequisite: a ct_state match implying a valid connection.
    let (cs, csm) = p.m.field(Field::CtState);
    let ct_valid = super::ct::ct_valid(cs, csm);
    let ct_proto = p.m.field(Field::CtNwProto).1 != 0;
    for (name, f) in &p.named {
        let ok = match f {
            Field::CtNwSrc | Field::CtNwDst => ct_valid && ty == Some(ETH_IPV4),
            Field::CtNwProto => ct_valid,
            Field::CtTpSrc | Field::CtTpDst => ct_valid && ct_proto,
            Field::Ipv4Src | Field::Ipv4Dst => {
                if name.starts_with("arp") {
                    ty == Some(ETH_ARP)
                } else {
                    matches!(ty, Some(ETH_IPV4 | ETH_ARP))
                }
            }
            Field::ArpOp => matches!(ty, Some(ETH_ARP | ETH_RARP)),
            Field::ArpSha if name == "nd_sll" => nd_type == Some(ND_NS),
            Field::ArpTha if name == "nd_tll" => nd_type == Some(ND_NA),
            Field::ArpSha | Field::ArpTha => matches!(ty, Some(ETH_ARP | ETH_RARP)),
            Field::NdTarget => matches!(nd_type, Some(ND_NS | ND_NA)),
            Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Flabel => ty == Some(ETH_IPV6),
            Field::IpProto | Field::IpTos | Field::IpTtl | Field::IpFrag => ip,
            Field::MplsLabel | Field::MplsTc | Field::MplsBos | Field::MplsTtl => {
                ty.is_some_and(is_mpls)
            }
            Field::TpSrc | Field::TpDst => {
                if name.starts_with("icmpv6") {
                    icmp6
                } else if name.starts_with("icmp") {
                    // ovs-ofctl's icmp_type/icmp_code name ICMPv6's too (and print them so).
                    (ty == Some(ETH_IPV4) && proto == Some(IP_ICMP)) || icmp6
                } else if name.starts_with("tcp") {
                    ip && proto == Some(IP_TCP)
                } else if name.starts_with("udp") {
                    ip && proto == Some(IP_UDP)
                } else if name.starts_with("sctp") {
                    ip && proto == Some(IP_SCTP)
                } else {
                    ip && matches!(proto, Some(IP_TCP | IP_UDP | IP_SCTP))
                }
            }
            _ => true,
        };
        if !ok {
            let need = match f {
                Field::CtNwSrc | Field::CtNwDst => {
                    "ip and a ct_state implying a connection (+new, +est, +rel, +rpl, +snat, +dnat or +trk-inv)"
                }
                Field::CtNwProto => {
                    "a ct_state implying a connection (+new, +est, +rel, +rpl, +snat, +dnat or +trk-inv)"
                }
                Field::CtTpSrc | Field::CtTpDst => {
                    "ct_nw_proto and a ct_state implying a connection (+new, +est, +rel, +rpl, +snat, +dnat or +trk-inv)"
                }
                Field::Ipv4Src | Field::Ipv4Dst if name.starts_with("arp") => "arp",
                Field::Ipv4Src | Field::Ipv4Dst => "ip or arp (dl_type=0x0800 or 0x0806)",
                Field::ArpOp => "arp (dl_type=0x0806)",
                Field::ArpSha if name == "nd_sll" => "icmp6,icmp_type=135",
                Field::ArpTha if name == "nd_tll" => "icmp6,icmp_type=136",
                Field::ArpSha | Field::ArpTha => "arp (dl_type=0x0806)",
                Field::NdTarget => "icmp6,icmp_type=135 or icmp6,icmp_type=136",
                Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Flabel => "ipv6 (dl_type=0x86dd)",
                Field::MplsLabel | Field::MplsTc | Field::MplsBos | Field::MplsTtl => {
                    "mpls or mplsm (dl_type=0x8847 or 0x8848)"
                }
                Field::TpSrc | Field::TpDst if name.starts_with("icmpv6") => "icmp6",
                Field::TpSrc | Field::TpDst if name.starts_with("icmp") => "icmp or icmp6",
                Field::TpSrc | Field::TpDst if name.starts_with("tcp") => "tcp or tcp6",
                Field::TpSrc | Field::TpDst if name.starts_with("udp") => "udp or udp6",
                Field::TpSrc | Field::TpDst if name.starts_with("sctp") => "sctp or sctp6",
                Field::TpSrc | Field::TpDst => "tcp, udp or sctp (or their IPv6 forms)",
                _ => "ip or ipv6",
            };
            return Err(ParseError::Invalid(format!("{name} requires {need}")));
        }
    }
    Ok(())
}

pub(super) fn parse_match_part(s: &str) -> Result<Parsed, ParseError> {
    let mut p = Parsed::default();
    for t in tokens(s) {
        let (name, value) = match t.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (t.trim(), None),
        };
        match_token(&mut p, &name.to_ascii_lowercase(), value)?;
    }
    check_prerequisites(&p)?;
    Ok(p)
}

/// `tun_metadataN` (N = 0..3) by name.
pub(crate) fn tun_metadata_field(name: &str) -> Option<Field> {
    let n: usize = name.strip_prefix("tun_metadata")?.parse().ok()?;
    Field::TUN_METADATA.get(n).copied()
}
