//! Rules as users write them, in ovs-ofctl's syntax: parsing with precise errors, and a
//! canonical text form that parses back to the same rule (saved configurations use it).
//!
//! ```text
//! [table=N,][priority=N,][cookie=N,][idle_timeout=S,][hard_timeout=S,]MATCH... actions=ACTION,...
//! ```
//! Ports are names (`in_port=vm1`, `output:vm2`), resolved when the pipeline is built.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::key::{
    Field, ETH_ARP, ETH_IPV4, ETH_IPV6, FRAG_ANY, FRAG_LATER, IP_ICMP, IP_ICMPV6, IP_SCTP, IP_TCP,
    IP_UDP, VLAN_CFI,
};
use crate::matching::Match;

/// Default rule priority (OpenFlow).
pub const DEFAULT_PRIORITY: u16 = 32768;

/// An action as written (ports by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionSpec {
    Output(String),
    InPort,
    Normal,
    Flood,
    All,
    Drop,
    /// A copy of the packet as received (before any modification) to a port.
    Mirror(String),
    SetField(Field, u128),
    SetVlanVid(u16),
    SetVlanPcp(u8),
    PopVlan,
    PushVlan(u16),
    SetTunnel(u64),
    GotoTable(u8),
}

/// A rule as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSpec {
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    /// The input port's name (resolved at build time; not part of `m`).
    pub in_port: Option<String>,
    pub m: Match,
    pub actions: Vec<ActionSpec>,
}

/// Why a rule or filter does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown field '{0}'")]
    UnknownField(String),
    #[error("unknown action '{0}'")]
    UnknownAction(String),
    #[error("{field}: '{value}' is not {expected}")]
    BadValue {
        field: String,
        value: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("no actions (end the rule with 'actions=...'; 'actions=drop' drops)")]
    NoActions,
    #[error("{0} needs a value")]
    NoValue(String),
}

fn bad(field: &str, value: &str, expected: &'static str) -> ParseError {
    ParseError::BadValue {
        field: field.into(),
        value: value.into(),
        expected,
    }
}

/// Parses an unsigned integer, decimal or 0x hex, at most `max`.
fn num(field: &str, s: &str, max: u128) -> Result<u128, ParseError> {
    let v = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u128::from_str_radix(h, 16)
    } else {
        s.parse::<u128>()
    }
    .map_err(|_| bad(field, s, "a number"))?;
    if v > max {
        return Err(ParseError::Invalid(format!(
            "{field}: {s} is out of range 0..={max}"
        )));
    }
    Ok(v)
}

fn mac(field: &str, s: &str) -> Result<u128, ParseError> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(bad(field, s, "a MAC address (xx:xx:xx:xx:xx:xx)"));
    }
    let mut v = 0u128;
    for p in parts {
        let b = u8::from_str_radix(p, 16)
            .ok()
            .filter(|_| !p.is_empty() && p.len() <= 2)
            .ok_or_else(|| bad(field, s, "a MAC address (xx:xx:xx:xx:xx:xx)"))?;
        v = (v << 8) | u128::from(b);
    }
    Ok(v)
}

fn ipv4(field: &str, s: &str) -> Result<u32, ParseError> {
    s.parse::<Ipv4Addr>()
        .map(u32::from)
        .map_err(|_| bad(field, s, "an IPv4 address"))
}

fn ipv6(field: &str, s: &str) -> Result<u128, ParseError> {
    s.parse::<Ipv6Addr>()
        .map(u128::from)
        .map_err(|_| bad(field, s, "an IPv6 address"))
}

/// `VALUE[/MASK]` with `parse` for both halves; no mask: all of `full`.
fn with_mask(
    _field: &str,
    s: &str,
    full: u128,
    parse: impl Fn(&str) -> Result<u128, ParseError>,
) -> Result<(u128, u128), ParseError> {
    match s.split_once('/') {
        Some((v, m)) => Ok((parse(v)?, parse(m)?)),
        None => Ok((parse(s)?, full)),
    }
}

/// An IPv4 address with an optional `/N` prefix or `/a.b.c.d` mask.
fn ipv4_masked(field: &str, s: &str) -> Result<(u128, u128), ParseError> {
    let (a, m) = match s.split_once('/') {
        None => (s, None),
        Some((a, m)) => (a, Some(m)),
    };
    let v = ipv4(field, a)?;
    let mask = match m {
        None => u32::MAX,
        Some(m) if m.contains('.') => ipv4(field, m)?,
        Some(m) => {
            let n: u32 = m
                .parse()
                .ok()
                .filter(|n| *n <= 32)
                .ok_or_else(|| bad(field, s, "an IPv4 address with a prefix length 0..=32"))?;
            if n == 0 {
                0
            } else {
                u32::MAX << (32 - n)
            }
        }
    };
    Ok((u128::from(v), u128::from(mask)))
}

fn ipv6_masked(field: &str, s: &str) -> Result<(u128, u128), ParseError> {
    let (a, m) = match s.split_once('/') {
        None => (s, None),
        Some((a, m)) => (a, Some(m)),
    };
    let v = ipv6(field, a)?;
    let mask = match m {
        None => u128::MAX,
        Some(m) if m.contains(':') => ipv6(field, m)?,
        Some(m) => {
            let n: u32 = m
                .parse()
                .ok()
                .filter(|n| *n <= 128)
                .ok_or_else(|| bad(field, s, "an IPv6 address with a prefix length 0..=128"))?;
            if n == 0 {
                0
            } else {
                u128::MAX << (128 - n)
            }
        }
    };
    Ok((v, mask))
}

/// What a match has been told, field by field, for prerequisite checks.
#[derive(Default)]
struct Parsed {
    table: Option<u8>,
    priority: Option<u16>,
    cookie: Option<(u64, u64)>,
    idle: u16,
    hard: u16,
    in_port: Option<String>,
    m: Match,
    /// Fields set by name, for prerequisite messages.
    named: Vec<(String, Field)>,
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
        "tcp" => Some(shorthand(ETH_IPV4, Some(IP_TCP))),
        "udp" => Some(shorthand(ETH_IPV4, Some(IP_UDP))),
        "sctp" => Some(shorthand(ETH_IPV4, Some(IP_SCTP))),
        "icmp" => Some(shorthand(ETH_IPV4, Some(IP_ICMP))),
        "tcp6" => Some(shorthand(ETH_IPV6, Some(IP_TCP))),
        "udp6" => Some(shorthand(ETH_IPV6, Some(IP_UDP))),
        "sctp6" => Some(shorthand(ETH_IPV6, Some(IP_SCTP))),
        "icmp6" => Some(shorthand(ETH_IPV6, Some(IP_ICMPV6))),
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
        if FIELD_NAMES.contains(&name) {
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
        "ip_frag" => {
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
        "tun_dst" => {
            let (a, m) = ipv4_masked(name, v)?;
            field(Field::TunDst, a, m);
        }
        _ => return Err(ParseError::UnknownField(name.into())),
    }
    Ok(())
}

/// Field names the parser knows (for "needs a value" vs "unknown" errors).
const FIELD_NAMES: &[&str] = &[
    "table",
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
    "tun_id",
    "tunnel_id",
    "tun_src",
    "tun_dst",
];

/// OpenFlow prerequisites: a field may only be matched when the match pins the protocol
/// that carries it.
fn check_prerequisites(p: &Parsed) -> Result<(), ParseError> {
    let (ty, tym) = p.m.field(Field::EthType);
    let ty = if tym != 0 { Some(ty as u16) } else { None };
    let (pr, prm) = p.m.field(Field::IpProto);
    let proto = if prm != 0 { Some(pr as u8) } else { None };
    let ip = matches!(ty, Some(ETH_IPV4 | ETH_IPV6));
    for (name, f) in &p.named {
        let ok = match f {
            Field::Ipv4Src | Field::Ipv4Dst => {
                if name.starts_with("arp") {
                    ty == Some(ETH_ARP)
                } else {
                    matches!(ty, Some(ETH_IPV4 | ETH_ARP))
                }
            }
            Field::ArpOp => ty == Some(ETH_ARP),
            Field::Ipv6Src | Field::Ipv6Dst => ty == Some(ETH_IPV6),
            Field::IpProto | Field::IpTos | Field::IpTtl | Field::IpFrag => ip,
            Field::TpSrc | Field::TpDst => {
                if name.starts_with("icmpv6") {
                    ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6)
                } else if name.starts_with("icmp") {
                    ty == Some(ETH_IPV4) && proto == Some(IP_ICMP)
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
                Field::Ipv4Src | Field::Ipv4Dst if name.starts_with("arp") => "arp",
                Field::Ipv4Src | Field::Ipv4Dst => "ip or arp (dl_type=0x0800 or 0x0806)",
                Field::ArpOp => "arp (dl_type=0x0806)",
                Field::Ipv6Src | Field::Ipv6Dst => "ipv6 (dl_type=0x86dd)",
                Field::TpSrc | Field::TpDst if name.starts_with("icmpv6") => "icmp6",
                Field::TpSrc | Field::TpDst if name.starts_with("icmp") => "icmp",
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

/// Splits on commas and spaces outside parentheses (`resubmit(,1)`).
fn tokens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | ' ' | '\t' if depth == 0 => {
                if i > start {
                    out.push(&s[start..i]);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

fn parse_match_part(s: &str) -> Result<Parsed, ParseError> {
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

/// A port named in a rule: what a port may be called (letters, digits, '-', '_', '.'; at most
/// 64), so that the rule prints back as it was parsed. (Found by the `flow` fuzz target:
/// `output( =...` took " =..." as a port name, which printed as `output: =...`.)
fn port_name(what: &str, v: &str) -> Result<String, ParseError> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(v.to_string())
    } else {
        Err(ParseError::Invalid(format!(
            "{what}: '{v}' is not a port name (letters, digits, '-', '_', '.')"
        )))
    }
}

fn parse_action(a: &str, table: u8, m: &Match) -> Result<ActionSpec, ParseError> {
    let (name, arg) = match a.split_once(':') {
        Some((n, v)) => (n, Some(v)),
        None => match a.split_once('(') {
            Some((n, v)) => (n, Some(v.trim_end_matches(')'))),
            None => (a, None),
        },
    };
    let lname = name.to_ascii_lowercase();
    let need = |what: &'static str| {
        arg.filter(|x| !x.is_empty())
            .ok_or_else(|| ParseError::Invalid(format!("{name} needs {what}")))
    };
    let (ty, tym) = m.field(Field::EthType);
    let ty = (tym != 0).then_some(ty as u16);
    let (pr, prm) = m.field(Field::IpProto);
    let proto = (prm != 0).then_some(pr as u8);
    let require = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(ParseError::Invalid(format!(
                "{name} requires the rule to match {what}"
            )))
        }
    };
    let ipv4 = ty == Some(ETH_IPV4);
    let l4 = matches!(ty, Some(ETH_IPV4 | ETH_IPV6)) && matches!(proto, Some(IP_TCP | IP_UDP));
    Ok(match (lname.as_str(), arg) {
        ("normal", None) => ActionSpec::Normal,
        ("flood", None) => ActionSpec::Flood,
        ("all", None) => ActionSpec::All,
        ("drop", None) => ActionSpec::Drop,
        ("in_port", None) => ActionSpec::InPort,
        ("strip_vlan" | "pop_vlan", None) => ActionSpec::PopVlan,
        ("output", _) => ActionSpec::Output(port_name(name, need("a port")?)?),
        ("mirror", _) => ActionSpec::Mirror(port_name(name, need("a port")?)?),
        ("mod_dl_src", _) => ActionSpec::SetField(Field::EthSrc, mac(name, need("a MAC")?)?),
        ("mod_dl_dst", _) => ActionSpec::SetField(Field::EthDst, mac(name, need("a MAC")?)?),
        ("mod_nw_src", _) => {
            require(ipv4, "ip")?;
            ActionSpec::SetField(
                Field::Ipv4Src,
                u128::from(self::ipv4(name, need("an address")?)?),
            )
        }
        ("mod_nw_dst", _) => {
            require(ipv4, "ip")?;
            ActionSpec::SetField(
                Field::Ipv4Dst,
                u128::from(self::ipv4(name, need("an address")?)?),
            )
        }
        ("mod_nw_tos", _) => {
            require(matches!(ty, Some(ETH_IPV4 | ETH_IPV6)), "ip or ipv6")?;
            let t = num(name, need("a value")?, 255)?;
            if t & 3 != 0 {
                return Err(ParseError::Invalid(format!(
                    "mod_nw_tos: {t} has ECN bits set (a multiple of 4)"
                )));
            }
            ActionSpec::SetField(Field::IpTos, t)
        }
        ("mod_tp_src", _) => {
            require(l4, "tcp or udp")?;
            ActionSpec::SetField(Field::TpSrc, num(name, need("a port")?, 65535)?)
        }
        ("mod_tp_dst", _) => {
            require(l4, "tcp or udp")?;
            ActionSpec::SetField(Field::TpDst, num(name, need("a port")?, 65535)?)
        }
        ("mod_vlan_vid", _) => ActionSpec::SetVlanVid(num(name, need("a VLAN id")?, 4095)? as u16),
        ("mod_vlan_pcp", _) => ActionSpec::SetVlanPcp(num(name, need("a priority")?, 7)? as u8),
        ("push_vlan", _) => {
            let tpid = num(name, need("an Ethertype")?, 0xffff)? as u16;
            if tpid != 0x8100 {
                return Err(ParseError::Invalid(format!(
                    "push_vlan:{tpid:#06x}: only 0x8100 (802.1Q) is supported"
                )));
            }
            ActionSpec::PushVlan(tpid)
        }
        ("set_tunnel" | "set_tunnel64", _) => {
            ActionSpec::SetTunnel(num(name, need("a tunnel id")?, u128::from(u64::MAX))? as u64)
        }
        ("goto_table" | "resubmit", _) => {
            let t = need("a table")?;
            let t = t.strip_prefix(',').unwrap_or(t);
            let n = num(name, t, 254)? as u8;
            if n <= table {
                return Err(ParseError::Invalid(format!(
                    "{name}:{n} must go to a later table than {table}"
                )));
            }
            ActionSpec::GotoTable(n)
        }
        ("set_field", _) => {
            let a = need("VALUE->FIELD")?;
            let (v, f) = a.split_once("->").ok_or_else(|| {
                ParseError::Invalid(format!("set_field:{a}: expected VALUE->FIELD"))
            })?;
            match f {
                "eth_src" | "dl_src" => ActionSpec::SetField(Field::EthSrc, mac(f, v)?),
                "eth_dst" | "dl_dst" => ActionSpec::SetField(Field::EthDst, mac(f, v)?),
                "ip_src" | "nw_src" => {
                    require(ipv4, "ip")?;
                    ActionSpec::SetField(Field::Ipv4Src, u128::from(self::ipv4(f, v)?))
                }
                "ip_dst" | "nw_dst" => {
                    require(ipv4, "ip")?;
                    ActionSpec::SetField(Field::Ipv4Dst, u128::from(self::ipv4(f, v)?))
                }
                "ipv6_src" => {
                    require(ty == Some(ETH_IPV6), "ipv6")?;
                    ActionSpec::SetField(Field::Ipv6Src, ipv6(f, v)?)
                }
                "ipv6_dst" => {
                    require(ty == Some(ETH_IPV6), "ipv6")?;
                    ActionSpec::SetField(Field::Ipv6Dst, ipv6(f, v)?)
                }
                "nw_ttl" => {
                    require(matches!(ty, Some(ETH_IPV4 | ETH_IPV6)), "ip or ipv6")?;
                    ActionSpec::SetField(Field::IpTtl, num(f, v, 255)?)
                }
                "nw_tos" => {
                    require(matches!(ty, Some(ETH_IPV4 | ETH_IPV6)), "ip or ipv6")?;
                    ActionSpec::SetField(Field::IpTos, num(f, v, 255)? & 0xfc)
                }
                "tp_src" | "tcp_src" | "udp_src" => {
                    require(l4, "tcp or udp")?;
                    ActionSpec::SetField(Field::TpSrc, num(f, v, 65535)?)
                }
                "tp_dst" | "tcp_dst" | "udp_dst" => {
                    require(l4, "tcp or udp")?;
                    ActionSpec::SetField(Field::TpDst, num(f, v, 65535)?)
                }
                "vlan_vid" => ActionSpec::SetVlanVid(num(f, v, 4095)? as u16),
                "vlan_pcp" => ActionSpec::SetVlanPcp(num(f, v, 7)? as u8),
                "tun_id" | "tunnel_id" => {
                    ActionSpec::SetTunnel(num(f, v, u128::from(u64::MAX))? as u64)
                }
                "tun_dst" => ActionSpec::SetField(Field::TunDst, u128::from(self::ipv4(f, v)?)),
                _ => {
                    return Err(ParseError::Invalid(format!(
                        "set_field: field '{f}' cannot be set"
                    )))
                }
            }
        }
        // ovs-ofctl accepts a bare port name as output.
        (_, None)
            if !KEYWORD_ACTIONS.contains(&lname.as_str()) && port_name("output", a).is_ok() =>
        {
            ActionSpec::Output(a.to_string())
        }
        _ => return Err(ParseError::UnknownAction(a.into())),
    })
}

const KEYWORD_ACTIONS: &[&str] = &[
    "output",
    "mirror",
    "mod_dl_src",
    "mod_dl_dst",
    "mod_nw_src",
    "mod_nw_dst",
    "mod_nw_tos",
    "mod_tp_src",
    "mod_tp_dst",
    "mod_vlan_vid",
    "mod_vlan_pcp",
    "push_vlan",
    "set_tunnel",
    "set_tunnel64",
    "goto_table",
    "resubmit",
    "set_field",
    "controller",
    "local",
];

/// Parses a rule (`ferrovs add-flow`).
pub fn parse_flow(s: &str) -> Result<FlowSpec, ParseError> {
    let lower = s.to_ascii_lowercase();
    let at = lower.find("actions=").ok_or(ParseError::NoActions)?;
    let (mpart, apart) = (&s[..at], &s[at + "actions=".len()..]);
    let p = parse_match_part(mpart)?;
    if p.cookie.is_some_and(|(_, m)| m != u64::MAX) {
        return Err(ParseError::Invalid(
            "cookie: a mask is for filters (del-flows, dump-flows), not rules".into(),
        ));
    }
    let table = p.table.unwrap_or(0);
    let mut actions = Vec::new();
    for a in tokens(apart) {
        actions.push(parse_action(a.trim(), table, &p.m)?);
    }
    if actions.is_empty() {
        return Err(ParseError::NoActions);
    }
    if actions.len() > 1 && actions.contains(&ActionSpec::Drop) {
        return Err(ParseError::Invalid("drop must be the only action".into()));
    }
    let gotos = actions
        .iter()
        .filter(|a| matches!(a, ActionSpec::GotoTable(_)))
        .count();
    if gotos > 1 || (gotos == 1 && !matches!(actions.last(), Some(ActionSpec::GotoTable(_)))) {
        return Err(ParseError::Invalid(
            "goto_table must be the last action, once".into(),
        ));
    }
    Ok(FlowSpec {
        table,
        priority: p.priority.unwrap_or(DEFAULT_PRIORITY),
        cookie: p.cookie.map_or(0, |c| c.0),
        idle_timeout: p.idle,
        hard_timeout: p.hard,
        in_port: p.in_port,
        m: p.m,
        actions,
    })
}

/// Selects rules (`del-flows`, `dump-flows`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowFilter {
    pub table: Option<u8>,
    pub priority: Option<u16>,
    pub in_port: Option<String>,
    pub m: Match,
    pub cookie: Option<(u64, u64)>,
}

/// Parses a filter: the match syntax, no actions; an empty string selects everything.
pub fn parse_filter(s: &str) -> Result<FlowFilter, ParseError> {
    if s.to_ascii_lowercase().contains("actions=") {
        return Err(ParseError::Invalid("a filter has no actions".into()));
    }
    let p = parse_match_part(s)?;
    if p.idle != 0 || p.hard != 0 {
        return Err(ParseError::Invalid("timeouts do not select rules".into()));
    }
    Ok(FlowFilter {
        table: p.table,
        priority: p.priority,
        in_port: p.in_port,
        m: p.m,
        cookie: p.cookie,
    })
}

impl FlowFilter {
    /// Non-strict (ovs-ofctl `del-flows`): every rule whose match is at least as specific as
    /// the filter's. Strict: the same match (and in_port) and priority (default 32768).
    pub fn selects(&self, f: &FlowSpec, strict: bool) -> bool {
        if self.table.is_some_and(|t| t != f.table) {
            return false;
        }
        if let Some((c, m)) = self.cookie {
            if f.cookie & m != c & m {
                return false;
            }
        }
        if strict {
            return self.priority.unwrap_or(DEFAULT_PRIORITY) == f.priority
                && self.in_port == f.in_port
                && self.m == f.m;
        }
        if self.in_port.is_some() && self.in_port != f.in_port {
            return false;
        }
        self.m.covers(&f.m)
    }
}

/// Parses a bulk file: one rule per line; blank lines and `#` comments skipped. An error
/// gives its line (1-based).
pub fn parse_flows_file(text: &str) -> Result<Vec<FlowSpec>, (usize, ParseError)> {
    let mut v = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        v.push(parse_flow(l).map_err(|e| (i + 1, e))?);
    }
    Ok(v)
}

// ---- Printing --------------------------------------------------------------------------

fn fmt_mac(v: u128) -> String {
    let b = (v as u64).to_be_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn fmt_ipv4(v: u128, m: u128) -> String {
    let a = Ipv4Addr::from(v as u32);
    let m = m as u32;
    if m == u32::MAX {
        a.to_string()
    } else if m.leading_ones() + m.trailing_zeros() == 32 {
        format!("{a}/{}", m.leading_ones())
    } else {
        format!("{a}/{}", Ipv4Addr::from(m))
    }
}

fn fmt_ipv6(v: u128, m: u128) -> String {
    let a = Ipv6Addr::from(v);
    if m == u128::MAX {
        a.to_string()
    } else if m.leading_ones() + m.trailing_zeros() == 128 {
        format!("{a}/{}", m.leading_ones())
    } else {
        format!("{a}/{}", Ipv6Addr::from(m))
    }
}

fn fmt_num(v: u128, m: u128, full: u128) -> String {
    if m == full {
        v.to_string()
    } else {
        format!("{v:#x}/{m:#x}")
    }
}

/// The match fields in text (shared by rules and filters).
fn fmt_match(out: &mut Vec<String>, m: &Match) {
    let (ty, tym) = m.field(Field::EthType);
    let (pr, prm) = m.field(Field::IpProto);
    let mut proto_done = false;
    if tym == 0xffff {
        let sh = match (ty as u16, (prm == 0xff).then_some(pr as u8)) {
            (ETH_IPV4, Some(IP_TCP)) => Some("tcp"),
            (ETH_IPV4, Some(IP_UDP)) => Some("udp"),
            (ETH_IPV4, Some(IP_SCTP)) => Some("sctp"),
            (ETH_IPV4, Some(IP_ICMP)) => Some("icmp"),
            (ETH_IPV6, Some(IP_TCP)) => Some("tcp6"),
            (ETH_IPV6, Some(IP_UDP)) => Some("udp6"),
            (ETH_IPV6, Some(IP_SCTP)) => Some("sctp6"),
            (ETH_IPV6, Some(IP_ICMPV6)) => Some("icmp6"),
            _ => None,
        };
        match sh {
            Some(s) => {
                out.push(s.into());
                proto_done = true;
            }
            None => match ty as u16 {
                ETH_IPV4 => out.push("ip".into()),
                ETH_IPV6 => out.push("ipv6".into()),
                ETH_ARP => out.push("arp".into()),
                t => out.push(format!("dl_type={t:#06x}")),
            },
        }
    } else if tym != 0 {
        out.push(format!("dl_type={ty:#06x}/{tym:#06x}"));
    }
    let mut put = |name: &str, f: Field, s: &dyn Fn(u128, u128) -> String| {
        let (v, mk) = m.field(f);
        if mk != 0 {
            out.push(format!("{name}={}", s(v, mk)));
        }
    };
    if !proto_done {
        put("nw_proto", Field::IpProto, &|v, mk| fmt_num(v, mk, 0xff));
    }
    put("dl_src", Field::EthSrc, &|v, mk| {
        if mk == Field::EthSrc.full() {
            fmt_mac(v)
        } else {
            format!("{}/{}", fmt_mac(v), fmt_mac(mk))
        }
    });
    put("dl_dst", Field::EthDst, &|v, mk| {
        if mk == Field::EthDst.full() {
            fmt_mac(v)
        } else {
            format!("{}/{}", fmt_mac(v), fmt_mac(mk))
        }
    });
    put("vlan_tci", Field::VlanTci, &|v, mk| {
        format!("{v:#06x}/{mk:#06x}")
    });
    let arp = tym == 0xffff && ty as u16 == ETH_ARP;
    put(
        if arp { "arp_spa" } else { "nw_src" },
        Field::Ipv4Src,
        &fmt_ipv4,
    );
    put(
        if arp { "arp_tpa" } else { "nw_dst" },
        Field::Ipv4Dst,
        &fmt_ipv4,
    );
    put("ipv6_src", Field::Ipv6Src, &fmt_ipv6);
    put("ipv6_dst", Field::Ipv6Dst, &fmt_ipv6);
    put("nw_tos", Field::IpTos, &|v, mk| {
        if mk == 0xfc {
            v.to_string()
        } else {
            format!("{v:#x}/{mk:#x}")
        }
    });
    put("nw_ttl", Field::IpTtl, &|v, mk| fmt_num(v, mk, 0xff));
    put("ip_frag", Field::IpFrag, &|v, mk| {
        let (v, mk) = (v as u8, mk as u8);
        match (v, mk) {
            (0, FRAG_ANY) => "no".into(),
            (FRAG_ANY, FRAG_ANY) => "yes".into(),
            (FRAG_ANY, 3) => "first".into(),
            (3, 3) => "later".into(),
            (0, FRAG_LATER) => "not_later".into(),
            _ => "no".into(),
        }
    });
    let icmp = prm == 0xff && (pr as u8 == IP_ICMP || pr as u8 == IP_ICMPV6);
    let v6 = ty as u16 == ETH_IPV6;
    let (s_name, d_name) = match (icmp, v6) {
        (true, false) => ("icmp_type", "icmp_code"),
        (true, true) => ("icmpv6_type", "icmpv6_code"),
        _ => ("tp_src", "tp_dst"),
    };
    put(s_name, Field::TpSrc, &|v, mk| fmt_num(v, mk, 0xffff));
    put(d_name, Field::TpDst, &|v, mk| fmt_num(v, mk, 0xffff));
    put("arp_op", Field::ArpOp, &|v, mk| fmt_num(v, mk, 0xffff));
    put("tun_id", Field::TunId, &|v, mk| {
        if mk == Field::TunId.full() {
            format!("{v:#x}")
        } else {
            format!("{v:#x}/{mk:#x}")
        }
    });
    put("tun_src", Field::TunSrc, &fmt_ipv4);
    put("tun_dst", Field::TunDst, &fmt_ipv4);
}

impl fmt::Display for ActionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActionSpec::Output(p) => write!(f, "output:{p}"),
            ActionSpec::Mirror(p) => write!(f, "mirror:{p}"),
            ActionSpec::InPort => write!(f, "in_port"),
            ActionSpec::Normal => write!(f, "NORMAL"),
            ActionSpec::Flood => write!(f, "FLOOD"),
            ActionSpec::All => write!(f, "ALL"),
            ActionSpec::Drop => write!(f, "drop"),
            ActionSpec::SetField(fld, v) => match fld {
                Field::EthSrc => write!(f, "mod_dl_src:{}", fmt_mac(*v)),
                Field::EthDst => write!(f, "mod_dl_dst:{}", fmt_mac(*v)),
                Field::Ipv4Src => write!(f, "mod_nw_src:{}", Ipv4Addr::from(*v as u32)),
                Field::Ipv4Dst => write!(f, "mod_nw_dst:{}", Ipv4Addr::from(*v as u32)),
                Field::IpTos => write!(f, "mod_nw_tos:{v}"),
                Field::TpSrc => write!(f, "mod_tp_src:{v}"),
                Field::TpDst => write!(f, "mod_tp_dst:{v}"),
                Field::IpTtl => write!(f, "set_field:{v}->nw_ttl"),
                Field::Ipv6Src => write!(f, "set_field:{}->ipv6_src", Ipv6Addr::from(*v)),
                Field::Ipv6Dst => write!(f, "set_field:{}->ipv6_dst", Ipv6Addr::from(*v)),
                Field::TunDst => write!(f, "set_field:{}->tun_dst", Ipv4Addr::from(*v as u32)),
                other => write!(f, "set_field:{v}->{other:?}"),
            },
            ActionSpec::SetVlanVid(v) => write!(f, "mod_vlan_vid:{v}"),
            ActionSpec::SetVlanPcp(v) => write!(f, "mod_vlan_pcp:{v}"),
            ActionSpec::PopVlan => write!(f, "strip_vlan"),
            ActionSpec::PushVlan(t) => write!(f, "push_vlan:{t:#06x}"),
            ActionSpec::SetTunnel(t) => write!(f, "set_tunnel:{t:#x}"),
            ActionSpec::GotoTable(t) => write!(f, "goto_table:{t}"),
        }
    }
}

impl fmt::Display for FlowSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.table != 0 {
            parts.push(format!("table={}", self.table));
        }
        if self.cookie != 0 {
            parts.push(format!("cookie={:#x}", self.cookie));
        }
        if self.idle_timeout != 0 {
            parts.push(format!("idle_timeout={}", self.idle_timeout));
        }
        if self.hard_timeout != 0 {
            parts.push(format!("hard_timeout={}", self.hard_timeout));
        }
        parts.push(format!("priority={}", self.priority));
        if let Some(p) = &self.in_port {
            parts.push(format!("in_port={p}"));
        }
        fmt_match(&mut parts, &self.m);
        let actions: Vec<String> = self.actions.iter().map(|a| a.to_string()).collect();
        write!(f, "{} actions={}", parts.join(","), actions.join(","))
    }
}

impl fmt::Display for FlowFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(t) = self.table {
            parts.push(format!("table={t}"));
        }
        if let Some((c, m)) = self.cookie {
            parts.push(format!("cookie={c:#x}/{m:#x}"));
        }
        if let Some(p) = self.priority {
            parts.push(format!("priority={p}"));
        }
        if let Some(p) = &self.in_port {
            parts.push(format!("in_port={p}"));
        }
        fmt_match(&mut parts, &self.m);
        write!(f, "{}", parts.join(","))
    }
}
