//! Fields by their OVS names in the places a rule names a *subfield* (`move:SRC->DST`,
//! `load:V->DST`, `output:SRC`, `ct(zone=SRC)`), as ovs-ofctl writes them: an NXM/OXM name
//! (`NXM_NX_REG0`, `OXM_OF_METADATA`, `NXM_OF_ETH_DST`, ...) or an ovs-fields(7) name
//! (`reg0`, `xxreg1`, `eth_dst`, ...), then `[]` (every bit), `[N]` (one bit) or `[A..B]`
//! (bits A to B inclusive). Registers' match syntax (`reg0=V/M`) is in `matches`.
//!
//! A name is a view of a key field with its OVS width: `NXM_OF_IN_PORT` is in_port's 16
//! bits, `NXM_OF_ICMP_TYPE` the low 8 of the key's transport source port (where ICMP's type
//! lives). Several names view one key field (ARP's protocol addresses are the IPv4 ones);
//! printing picks the one the rule's protocol calls it (see [`fmt_subfield`]), so the text
//! parses back. Pure functions over untrusted text.

use crate::key::{
    Field, SubField, ETH_ARP, ETH_IPV4, ETH_IPV6, IP_ICMP, IP_ICMPV6, IP_SCTP, IP_TCP, IP_UDP,
};
use crate::matching::Match;

use super::ParseError;

/// A field's name: (NXM/OXM name, ovs-fields name, key field, width in bits).
struct Name {
    nxm: &'static str,
    short: &'static str,
    field: Field,
    width: u16,
}

const fn n(nxm: &'static str, short: &'static str, field: Field, width: u16) -> Name {
    Name {
        nxm,
        short,
        field,
        width,
    }
}

/// Every name, the one printed for a field first (within what the rule's protocol picks).
const NAMES: &[Name] = &[
    n("NXM_NX_REG0", "reg0", Field::Reg0, 32),
    n("NXM_NX_REG1", "reg1", Field::Reg1, 32),
    n("NXM_NX_REG2", "reg2", Field::Reg2, 32),
    n("NXM_NX_REG3", "reg3", Field::Reg3, 32),
    n("NXM_NX_REG4", "reg4", Field::Reg4, 32),
    n("NXM_NX_REG5", "reg5", Field::Reg5, 32),
    n("NXM_NX_REG6", "reg6", Field::Reg6, 32),
    n("NXM_NX_REG7", "reg7", Field::Reg7, 32),
    n("NXM_NX_REG8", "reg8", Field::Reg8, 32),
    n("NXM_NX_REG9", "reg9", Field::Reg9, 32),
    n("NXM_NX_REG10", "reg10", Field::Reg10, 32),
    n("NXM_NX_REG11", "reg11", Field::Reg11, 32),
    n("NXM_NX_REG12", "reg12", Field::Reg12, 32),
    n("NXM_NX_REG13", "reg13", Field::Reg13, 32),
    n("NXM_NX_REG14", "reg14", Field::Reg14, 32),
    n("NXM_NX_REG15", "reg15", Field::Reg15, 32),
    n("OXM_OF_PKT_REG0", "xreg0", Field::Xreg0, 64),
    n("OXM_OF_PKT_REG1", "xreg1", Field::Xreg1, 64),
    n("OXM_OF_PKT_REG2", "xreg2", Field::Xreg2, 64),
    n("OXM_OF_PKT_REG3", "xreg3", Field::Xreg3, 64),
    n("OXM_OF_PKT_REG4", "xreg4", Field::Xreg4, 64),
    n("OXM_OF_PKT_REG5", "xreg5", Field::Xreg5, 64),
    n("OXM_OF_PKT_REG6", "xreg6", Field::Xreg6, 64),
    n("OXM_OF_PKT_REG7", "xreg7", Field::Xreg7, 64),
    n("NXM_NX_XXREG0", "xxreg0", Field::Xxreg0, 128),
    n("NXM_NX_XXREG1", "xxreg1", Field::Xxreg1, 128),
    n("NXM_NX_XXREG2", "xxreg2", Field::Xxreg2, 128),
    n("NXM_NX_XXREG3", "xxreg3", Field::Xxreg3, 128),
    n("OXM_OF_METADATA", "metadata", Field::Metadata, 64),
    n("NXM_OF_IN_PORT", "in_port", Field::InPort, 16),
    n("OXM_OF_IN_PORT", "in_port_oxm", Field::InPort, 32),
    n("NXM_OF_ETH_SRC", "eth_src", Field::EthSrc, 48),
    n("NXM_OF_ETH_DST", "eth_dst", Field::EthDst, 48),
    n("NXM_OF_ETH_TYPE", "eth_type", Field::EthType, 16),
    n("NXM_OF_IP_SRC", "ip_src", Field::Ipv4Src, 32),
    n("NXM_OF_IP_DST", "ip_dst", Field::Ipv4Dst, 32),
    n("NXM_OF_ARP_SPA", "arp_spa", Field::Ipv4Src, 32),
    n("NXM_OF_ARP_TPA", "arp_tpa", Field::Ipv4Dst, 32),
    n("NXM_OF_IP_PROTO", "nw_proto", Field::IpProto, 8),
    n("NXM_NX_IP_TTL", "nw_ttl", Field::IpTtl, 8),
    n("NXM_OF_ARP_OP", "arp_op", Field::ArpOp, 16),
    n("NXM_NX_ARP_SHA", "arp_sha", Field::ArpSha, 48),
    n("NXM_NX_ARP_THA", "arp_tha", Field::ArpTha, 48),
    n("NXM_NX_ND_SLL", "nd_sll", Field::ArpSha, 48),
    n("NXM_NX_ND_TLL", "nd_tll", Field::ArpTha, 48),
    n("NXM_NX_ND_TARGET", "nd_target", Field::NdTarget, 128),
    n("NXM_NX_IPV6_SRC", "ipv6_src", Field::Ipv6Src, 128),
    n("NXM_NX_IPV6_DST", "ipv6_dst", Field::Ipv6Dst, 128),
    n("NXM_NX_IPV6_LABEL", "ipv6_label", Field::Ipv6Flabel, 20),
    n("NXM_OF_TCP_SRC", "tcp_src", Field::TpSrc, 16),
    n("NXM_OF_TCP_DST", "tcp_dst", Field::TpDst, 16),
    n("NXM_OF_UDP_SRC", "udp_src", Field::TpSrc, 16),
    n("NXM_OF_UDP_DST", "udp_dst", Field::TpDst, 16),
    n("OXM_OF_SCTP_SRC", "sctp_src", Field::TpSrc, 16),
    n("OXM_OF_SCTP_DST", "sctp_dst", Field::TpDst, 16),
    n("NXM_OF_ICMP_TYPE", "icmp_type", Field::TpSrc, 8),
    n("NXM_OF_ICMP_CODE", "icmp_code", Field::TpDst, 8),
    n("NXM_NX_ICMPV6_TYPE", "icmpv6_type", Field::TpSrc, 8),
    n("NXM_NX_ICMPV6_CODE", "icmpv6_code", Field::TpDst, 8),
    n("NXM_NX_TUN_ID", "tun_id", Field::TunId, 64),
    n("NXM_NX_TUN_IPV4_SRC", "tun_src", Field::TunSrc, 32),
    n("NXM_NX_TUN_IPV4_DST", "tun_dst", Field::TunDst, 32),
    n(
        "NXM_NX_TUN_METADATA0",
        "tun_metadata0",
        Field::TunMetadata0,
        32,
    ),
    n(
        "NXM_NX_TUN_METADATA1",
        "tun_metadata1",
        Field::TunMetadata1,
        32,
    ),
    n(
        "NXM_NX_TUN_METADATA2",
        "tun_metadata2",
        Field::TunMetadata2,
        32,
    ),
    n(
        "NXM_NX_TUN_METADATA3",
        "tun_metadata3",
        Field::TunMetadata3,
        32,
    ),
    n("NXM_NX_CT_MARK", "ct_mark", Field::CtMark, 32),
    n("NXM_NX_CT_LABEL", "ct_label", Field::CtLabel, 128),
    n("NXM_NX_CT_ZONE", "ct_zone", Field::CtZone, 16),
];

fn invalid(s: String) -> ParseError {
    ParseError::Invalid(s)
}

/// The register (or view) a match token names: `reg0`..`reg15`, `xreg0`..`xreg7`,
/// `xxreg0`..`xxreg3`.
pub(super) fn register_by_name(name: &str) -> Option<Field> {
    NAMES
        .iter()
        .find(|x| x.short == name && x.field.is_register())
        .map(|x| x.field)
}

/// The ovs-fields name of a whole register, register view or metadata (`reg0`,
/// `xxreg1`, `metadata`).
pub(super) fn short_name(f: Field) -> Option<&'static str> {
    NAMES
        .iter()
        .find(|x| x.field == f && u32::from(x.width) == f.bits())
        .map(|x| x.short)
}

/// Parses `NAME[]`, `NAME[N]`, `NAME[A..B]` (NAME: an NXM/OXM or ovs-fields name, any
/// case for the former).
pub(super) fn parse_subfield(s: &str) -> Result<SubField, ParseError> {
    let bad = || {
        invalid(format!(
            "'{s}' is not a field's bits (NAME[], NAME[N] or NAME[A..B], e.g. NXM_NX_REG0[0..15])"
        ))
    };
    let (name, rest) = s.split_once('[').ok_or_else(bad)?;
    let range = rest.strip_suffix(']').ok_or_else(bad)?;
    let x = NAMES
        .iter()
        .find(|x| x.nxm.eq_ignore_ascii_case(name) || x.short == name)
        .ok_or_else(|| {
            invalid(format!(
                "'{name}': no field of that name can be moved or loaded"
            ))
        })?;
    let num = |t: &str| t.trim().parse::<u16>().map_err(|_| bad());
    let (a, b) = if range.is_empty() {
        (0, x.width - 1)
    } else if let Some((a, b)) = range.split_once("..") {
        (num(a)?, num(b)?)
    } else {
        let a = num(range)?;
        (a, a)
    };
    if a > b || b >= x.width {
        return Err(invalid(format!(
            "{s}: bits {a}..{b} are not within {name}'s {} bits",
            x.width
        )));
    }
    SubField::new(x.field, a, b - a + 1).ok_or_else(bad)
}

/// The protocol a rule's match pins: (Ethertype, IP protocol), as far as it does.
fn protocol(m: &Match) -> (Option<u16>, Option<u8>) {
    let (ty, tym) = m.field(Field::EthType);
    let (pr, prm) = m.field(Field::IpProto);
    (
        (tym != 0).then_some(ty as u16),
        (prm != 0).then_some(pr as u8),
    )
}

/// Whether name `x` is what the protocol `(ty, proto)` calls its field.
fn fits(x: &Name, ty: Option<u16>, proto: Option<u8>) -> bool {
    match x.short {
        "arp_spa" | "arp_tpa" => ty == Some(ETH_ARP),
        "ip_src" | "ip_dst" => ty != Some(ETH_ARP),
        "nd_sll" | "nd_tll" => ty == Some(ETH_IPV6),
        "arp_sha" | "arp_tha" => ty != Some(ETH_IPV6),
        "tcp_src" | "tcp_dst" => !matches!(proto, Some(IP_UDP | IP_SCTP | IP_ICMP | IP_ICMPV6)),
        "udp_src" | "udp_dst" => proto == Some(IP_UDP),
        "sctp_src" | "sctp_dst" => proto == Some(IP_SCTP),
        "icmp_type" | "icmp_code" => ty == Some(ETH_IPV4) && proto == Some(IP_ICMP),
        "icmpv6_type" | "icmpv6_code" => ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6),
        _ => true,
    }
}

/// A subfield's text in a rule with match `m`: the NXM/OXM name its protocol calls the
/// field (the narrowest that holds the bits), `[]` when it is every bit of that name.
pub(super) fn fmt_subfield(sf: &SubField, m: &Match) -> String {
    let (ty, proto) = protocol(m);
    let end = sf.ofs + sf.nbits;
    let pick = NAMES
        .iter()
        .filter(|x| x.field == sf.field && end <= x.width && fits(x, ty, proto))
        .min_by_key(|x| x.width)
        .or_else(|| {
            NAMES
                .iter()
                .filter(|x| x.field == sf.field && end <= x.width)
                .min_by_key(|x| x.width)
        });
    let Some(x) = pick else {
        // Every key field a subfield can hold has a name (parse_subfield made it).
        return format!("{:?}[{}..{}]", sf.field, sf.ofs, end - 1);
    };
    if sf.ofs == 0 && sf.nbits == x.width {
        format!("{}[]", x.nxm)
    } else if sf.nbits == 1 {
        format!("{}[{}]", x.nxm, sf.ofs)
    } else {
        format!("{}[{}..{}]", x.nxm, sf.ofs, end - 1)
    }
}

/// Whether a rule may write `f` with `load`, `move` or a masked `set_field`: registers,
/// metadata, in_port and the packet fields the datapath rewrites (not the Ethertype, the
/// IP protocol or connection tracking's fields, which OVS has read-only).
pub(super) fn writable(f: Field) -> bool {
    f.is_register()
        || matches!(
            f,
            Field::Metadata
                | Field::InPort
                | Field::EthSrc
                | Field::EthDst
                | Field::Ipv4Src
                | Field::Ipv4Dst
                | Field::Ipv6Src
                | Field::Ipv6Dst
                | Field::Ipv6Flabel
                | Field::IpTtl
                | Field::TpSrc
                | Field::TpDst
                | Field::ArpOp
                | Field::ArpSha
                | Field::ArpTha
                | Field::NdTarget
                | Field::TunId
                | Field::TunDst
                | Field::TunMetadata0
                | Field::TunMetadata1
                | Field::TunMetadata2
                | Field::TunMetadata3
        )
}

/// OpenFlow's prerequisite of reading or writing packet field `f` in a rule with match `m`
/// (`None`: met; else what the rule must match). Registers, metadata, in_port and the
/// tunnel have none.
pub(super) fn prerequisite(f: Field, m: &Match) -> Option<&'static str> {
    let (ty, proto) = protocol(m);
    let ip = matches!(ty, Some(ETH_IPV4 | ETH_IPV6));
    let ok = match f {
        Field::Ipv4Src | Field::Ipv4Dst => matches!(ty, Some(ETH_IPV4 | ETH_ARP)),
        Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Flabel => ty == Some(ETH_IPV6),
        Field::IpTtl | Field::IpProto => ip,
        Field::TpSrc | Field::TpDst => {
            ip && matches!(proto, Some(IP_TCP | IP_UDP | IP_SCTP | IP_ICMP | IP_ICMPV6))
        }
        Field::ArpOp => ty == Some(ETH_ARP),
        Field::ArpSha | Field::ArpTha => {
            ty == Some(ETH_ARP) || (ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6))
        }
        Field::NdTarget => ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6),
        _ => true,
    };
    if ok {
        return None;
    }
    Some(match f {
        Field::Ipv4Src | Field::Ipv4Dst => "ip or arp",
        Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Flabel => "ipv6",
        Field::IpTtl | Field::IpProto => "ip or ipv6",
        Field::TpSrc | Field::TpDst => "tcp, udp, sctp, icmp or icmp6",
        Field::ArpOp => "arp",
        Field::ArpSha | Field::ArpTha => "arp or icmp6",
        _ => "icmp6",
    })
}

/// A whole field by its ovs-fields name (or an alias ovs-ofctl takes: `nw_src`, `dl_type`,
/// `tp_dst`, ...), as `learn`'s `NAME=VALUE` names it: the field and its OVS width.
pub(super) fn whole_by_name(name: &str) -> Option<SubField> {
    let name = match name {
        "nw_src" => "ip_src",
        "nw_dst" => "ip_dst",
        "dl_type" => "eth_type",
        "dl_src" => "eth_src",
        "dl_dst" => "eth_dst",
        "tp_src" => "tcp_src",
        "tp_dst" => "tcp_dst",
        n => n,
    };
    NAMES
        .iter()
        .find(|x| x.short == name)
        .and_then(|x| SubField::new(x.field, 0, x.width))
}

/// The ovs-fields name of a whole field in a rule with match `m` (the name `m`'s protocol
/// gives it), if `sf` is all of a named field.
pub(super) fn whole_name(sf: &SubField, m: &Match) -> Option<&'static str> {
    if sf.ofs != 0 {
        return None;
    }
    let (ty, proto) = protocol(m);
    NAMES
        .iter()
        .filter(|x| x.field == sf.field && x.width == sf.nbits)
        .find(|x| fits(x, ty, proto))
        .or_else(|| {
            NAMES
                .iter()
                .find(|x| x.field == sf.field && x.width == sf.nbits)
        })
        .map(|x| x.short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subfields_parse_and_print_back() {
        let m = Match::catchall();
        for (text, field, ofs, nbits, back) in [
            ("NXM_NX_REG0[]", Field::Reg0, 0, 32, "NXM_NX_REG0[]"),
            ("reg13[0..15]", Field::Reg13, 0, 16, "NXM_NX_REG13[0..15]"),
            ("NXM_NX_REG10[7]", Field::Reg10, 7, 1, "NXM_NX_REG10[7]"),
            (
                "nxm_nx_xxreg0[32..63]",
                Field::Xxreg0,
                32,
                32,
                "NXM_NX_XXREG0[32..63]",
            ),
            ("xreg3[]", Field::Xreg3, 0, 64, "OXM_OF_PKT_REG3[]"),
            (
                "OXM_OF_METADATA[]",
                Field::Metadata,
                0,
                64,
                "OXM_OF_METADATA[]",
            ),
            ("NXM_OF_IN_PORT[]", Field::InPort, 0, 16, "NXM_OF_IN_PORT[]"),
            (
                "NXM_OF_ETH_DST[0..23]",
                Field::EthDst,
                0,
                24,
                "NXM_OF_ETH_DST[0..23]",
            ),
        ] {
            let sf = parse_subfield(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((sf.field, sf.ofs, sf.nbits), (field, ofs, nbits), "{text}");
            assert_eq!(fmt_subfield(&sf, &m), back);
        }
        // ARP's addresses print by their ARP names in an ARP rule.
        let mut arp = Match::catchall();
        arp.set(Field::EthType, u128::from(ETH_ARP), 0xffff);
        let sf = parse_subfield("NXM_OF_ARP_SPA[]").unwrap();
        assert_eq!(fmt_subfield(&sf, &arp), "NXM_OF_ARP_SPA[]");
        assert_eq!(fmt_subfield(&sf, &m), "NXM_OF_IP_SRC[]");
        for bad in [
            "NXM_NX_REG0",
            "NXM_NX_REG0[32]",
            "NXM_NX_REG0[5..4]",
            "NXM_NX_REG0[a..b]",
            "NXM_NX_REG16[]",
            "reg0[0..32]",
            "NXM_OF_IN_PORT[16]",
        ] {
            assert!(parse_subfield(bad).is_err(), "{bad}");
        }
    }
}
