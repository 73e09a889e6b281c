//! The action part of a rule: each `name[:arg]` (or `name(args)`, or a bare port name) into
//! an [`ActionSpec`], with the checks that need the rule: a `goto_table` only forward, a
//! rewrite only of a field the match's protocol carries.

use crate::key::{
    is_mpls, Field, ETH_ARP, ETH_IPV4, ETH_IPV6, IP_ICMP, IP_ICMPV6, IP_TCP, IP_UDP, ND_NA, ND_NS,
};
use crate::matching::Match;

use super::fields::{parse_subfield, prerequisite, register_by_name, writable};
use super::values::{ipv4, ipv6, mac, num, port_name, tokens, with_mask};
use super::{ActionSpec, ParseError};

pub(super) fn parse_action(a: &str, table: u8, m: &Match) -> Result<ActionSpec, ParseError> {
    parse_action_in(a, table, Some(m))
}

/// An action of a group's bucket: no rule, so no match to check rewrites against (a rewrite
/// of a header the packet lacks does nothing, as in OVS), and no instructions.
pub(super) fn parse_bucket_action(a: &str) -> Result<ActionSpec, ParseError> {
    // `ct(...)` and `ct_clear` are allowed (OVN's load balancers are select groups whose
    // buckets are `ct(commit,table=T,nat(dst=...))`); the translation runs them in a
    // bucket of a group that runs one bucket, and skips them in an `all` group's buckets
    // (each a copy of the packet: a tracker's verdict cannot be set back). See
    // docs/conntrack.md.
    let act = parse_action_in(a, 0, None)?;
    if act.instruction_rank() != 0 {
        return Err(ParseError::Invalid(format!(
            "{}: instructions are for rules, not group buckets",
            act.instruction_name()
        )));
    }
    Ok(act)
}

/// Whether `a` may be written into the action set (`write_actions(...)`).
fn settable(a: &ActionSpec) -> bool {
    !matches!(
        a,
        ActionSpec::Drop
            | ActionSpec::Mirror(_)
            | ActionSpec::GotoTable(_)
            | ActionSpec::WriteActions(_)
            | ActionSpec::ClearActions
            | ActionSpec::WriteMetadata { .. }
            | ActionSpec::Ct(_)
            | ActionSpec::CtClear
            | ActionSpec::Resubmit { .. }
            | ActionSpec::OutputReg(_)
            | ActionSpec::Learn(_)
            | ActionSpec::StackPush(_)
            | ActionSpec::StackPop(_)
            | ActionSpec::Clone(_)
            | ActionSpec::CheckPktLarger { .. }
            | ActionSpec::Conjunction { .. }
    )
}

/// The packet-in reasons by name (OVS's `ofputil_packet_in_reason_to_string`), by number.
pub(crate) const PACKET_IN_REASONS: [&str; 6] = [
    "no_match",
    "action",
    "invalid_ttl",
    "action_set",
    "group",
    "packet_out",
];

/// `controller:N`, or `controller(key=value,...)` with OVS's keys: `reason`, `max_len`,
/// `id`, `userdata` (hex bytes, optionally separated by `.`), `pause`, `meter_id`.
fn parse_controller(name: &str, v: &str) -> Result<ActionSpec, ParseError> {
    let bad = |m: String| ParseError::Invalid(format!("{name}({v}): {m}"));
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(ActionSpec::Controller {
            max_len: num(name, v, 65535)? as u16,
            ext: None,
        });
    }
    let mut max_len = u16::MAX;
    let mut ext = super::ControllerExt::default();
    for kv in v.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let (k, val) = match kv.split_once('=') {
            Some((k, val)) => (k.trim(), Some(val.trim())),
            None => (kv, None),
        };
        let val_of = |what: &str| val.ok_or_else(|| bad(format!("{k} needs {what}")));
        match k {
            "reason" => {
                let r = val_of("a reason")?;
                let i = PACKET_IN_REASONS
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(r))
                    .ok_or_else(|| bad(format!("unknown reason \"{r}\"")))?;
                ext.reason = Some(i as u8);
            }
            "max_len" => max_len = num(name, val_of("a length")?, 65535)? as u16,
            "id" => ext.controller_id = num(name, val_of("an id")?, 65535)? as u16,
            "userdata" => {
                ext.userdata = parse_hex(val_of("hex bytes")?).ok_or_else(|| {
                    bad("bad hex digit in `controller' action `userdata'".to_string())
                })?
            }
            "pause" if val.is_none() => ext.pause = true,
            "meter_id" => {
                ext.meter_id = Some(num(name, val_of("a meter")?, u128::from(u32::MAX))? as u32)
            }
            _ => {
                return Err(bad(format!(
                    "unknown key \"{k}\" parsing controller action"
                )))
            }
        }
    }
    if ext.meter_id == Some(u32::MAX) {
        // NX_CTLR_NO_METER: no meter.
        ext.meter_id = None;
    }
    if ext.reason == Some(1) {
        ext.reason = None;
    }
    Ok(ActionSpec::Controller {
        max_len,
        ext: (!ext.is_plain()).then(|| Box::new(ext)),
    })
}

/// Pairs of hex digits, optionally separated by `.`, spaces or tabs (OVS's
/// `ofpbuf_put_hex`); `None` on anything else or an odd digit.
pub(crate) fn parse_hex(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if matches!(b[i], b'.' | b' ' | b'\t') {
            i += 1;
            continue;
        }
        let hi = (*b.get(i)? as char).to_digit(16)?;
        let lo = (*b.get(i + 1)? as char).to_digit(16)?;
        out.push((hi << 4 | lo) as u8);
        i += 2;
    }
    Some(out)
}

fn parse_action_in(a: &str, table: u8, m: Option<&Match>) -> Result<ActionSpec, ParseError> {
    let colon = a.find(':');
    let paren = a.find('(');
    let (name, arg) = match (colon, paren) {
        (Some(c), p) if p.is_none_or(|p| c < p) => (&a[..c], Some(&a[c + 1..])),
        (_, Some(p)) => {
            let rest = &a[p + 1..];
            (&a[..p], Some(rest.strip_suffix(')').unwrap_or(rest)))
        }
        _ => (a, None),
    };
    let lenient = m.is_none();
    let catchall = Match::catchall();
    let m = m.unwrap_or(&catchall);
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
        if ok || lenient {
            Ok(())
        } else {
            Err(ParseError::Invalid(format!(
                "{name} requires the rule to match {what}"
            )))
        }
    };
    let ipv4 = ty == Some(ETH_IPV4);
    let mpls = ty.is_some_and(is_mpls);
    let l4 = matches!(ty, Some(ETH_IPV4 | ETH_IPV6)) && matches!(proto, Some(IP_TCP | IP_UDP));
    let arp = ty == Some(ETH_ARP);
    let icmp4 = ipv4 && proto == Some(IP_ICMP);
    let icmp6 = ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6);
    let (icmp_ty, icmp_tym) = m.field(Field::TpSrc);
    let nd_type = (icmp6 && icmp_tym & 0xff == 0xff).then_some(icmp_ty as u8);
    Ok(match (lname.as_str(), arg) {
        ("normal", None) => ActionSpec::Normal,
        ("flood", None) => ActionSpec::Flood,
        ("all", None) => ActionSpec::All,
        ("drop", None) => ActionSpec::Drop,
        ("in_port", None) => ActionSpec::InPort,
        ("strip_vlan" | "pop_vlan", None) => ActionSpec::PopVlan,
        ("controller", None) => ActionSpec::Controller {
            max_len: u16::MAX,
            ext: None,
        },
        ("controller", Some(v)) => parse_controller(name, v)?,
        ("output", _) => {
            let p = need("a port")?;
            if p.contains('[') {
                let sf = parse_subfield(p)?;
                if sf.nbits > 32 {
                    return Err(ParseError::Invalid(format!(
                        "output:{p}: a port number has at most 32 bits"
                    )));
                }
                ActionSpec::OutputReg(sf)
            } else {
                ActionSpec::Output(port_name(name, p)?)
            }
        }
        ("load", _) => {
            let a = need("VALUE->DST")?;
            let (v, d) = a.split_once("->").ok_or_else(|| {
                ParseError::Invalid(format!("load:{a}: expected VALUE->FIELD[bits]"))
            })?;
            let dst = parse_subfield(d)?;
            check_written(name, &dst, m, lenient)?;
            let value = num(name, v, u128::MAX)?;
            if value & !dst.ones() != 0 {
                return Err(ParseError::Invalid(format!(
                    "load:{a}: {v} does not fit in {} bits",
                    dst.nbits
                )));
            }
            ActionSpec::Load {
                field: dst.field,
                value: value << dst.ofs,
                mask: dst.mask(),
            }
        }
        ("move", _) => {
            let a = need("SRC->DST")?;
            let (sv, d) = a.split_once("->").ok_or_else(|| {
                ParseError::Invalid(format!("move:{a}: expected SRC[bits]->DST[bits]"))
            })?;
            let (src, dst) = (parse_subfield(sv)?, parse_subfield(d)?);
            if src.nbits != dst.nbits {
                return Err(ParseError::Invalid(format!(
                    "move:{a}: the source has {} bits, the destination {}",
                    src.nbits, dst.nbits
                )));
            }
            if let Some(need) = prerequisite(src.field, m).filter(|_| !lenient) {
                return Err(ParseError::Invalid(format!(
                    "move:{a}: {sv} requires the rule to match {need}"
                )));
            }
            check_written(name, &dst, m, lenient)?;
            ActionSpec::Move { src, dst }
        }
        ("push", _) => {
            let a = need("FIELD[bits]")?;
            let src = parse_subfield(a)?;
            if let Some(need) = prerequisite(src.field, m).filter(|_| !lenient) {
                return Err(ParseError::Invalid(format!(
                    "push:{a}: requires the rule to match {need}"
                )));
            }
            ActionSpec::StackPush(src)
        }
        ("pop", _) => {
            let dst = parse_subfield(need("FIELD[bits]")?)?;
            check_written(name, &dst, m, lenient)?;
            ActionSpec::StackPop(dst)
        }
        ("check_pkt_larger", _) => {
            let a = need("LEN)->DST[bit]")?;
            let (l, d) = a.split_once(")->").ok_or_else(|| {
                ParseError::Invalid(format!("check_pkt_larger({a}: expected LEN)->DST[bit]"))
            })?;
            let len = num(name, l.trim(), u128::from(u16::MAX))? as u16;
            let dst = parse_subfield(d.trim())?;
            if dst.nbits != 1 {
                return Err(ParseError::Invalid(format!(
                    "check_pkt_larger: {d} is {} bits, not one",
                    dst.nbits
                )));
            }
            check_written(name, &dst, m, lenient)?;
            ActionSpec::CheckPktLarger { len, dst }
        }
        ("clone", _) => {
            let inner = arg.unwrap_or("");
            let mut list = Vec::new();
            for x in tokens(inner) {
                let act = parse_action_in(x.trim(), table, (!lenient).then_some(m))?;
                if act.instruction_rank() != 0 {
                    return Err(ParseError::Invalid(format!(
                        "clone: {} is an instruction, not an action",
                        act.instruction_name()
                    )));
                }
                list.push(act);
            }
            ActionSpec::Clone(list)
        }
        ("resubmit", _) => {
            let a = need("a port or a table")?;
            let (p, t) = match a.split_once(',') {
                Some((p, t)) => (p.trim(), Some(t.trim())),
                None => (a.trim(), None),
            };
            if t.is_some_and(|t| t.contains(',')) {
                return Err(ParseError::Invalid(format!(
                    "resubmit({a}): resubmit(PORT,TABLE) only (the ct form is not supported)"
                )));
            }
            let port = match p {
                "" | "in_port" | "IN_PORT" => None,
                p => Some(port_name(name, p)?),
            };
            let table = match t {
                None | Some("") => None,
                Some(t) => Some(num(name, t, 254)? as u8),
            };
            if port.is_none() && table.is_none() {
                return Err(ParseError::Invalid(format!(
                    "resubmit({a}): needs a port or a table"
                )));
            }
            ActionSpec::Resubmit { port, table }
        }
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
        ("mod_nw_ecn", _) => {
            require(matches!(ty, Some(ETH_IPV4 | ETH_IPV6)), "ip or ipv6")?;
            ActionSpec::SetEcn(num(name, need("a value")?, 3)? as u8)
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
            if tpid != 0x8100 && tpid != 0x88a8 {
                return Err(ParseError::Invalid(format!(
                    "push_vlan:{tpid:#06x}: only 0x8100 (802.1Q) and 0x88a8 (802.1ad)"
                )));
            }
            ActionSpec::PushVlan(tpid)
        }
        ("push_mpls", _) => {
            let t = num(name, need("an Ethertype")?, 0xffff)? as u16;
            if !is_mpls(t) {
                return Err(ParseError::Invalid(format!(
                    "push_mpls:{t:#06x}: the Ethertype must be 0x8847 or 0x8848"
                )));
            }
            ActionSpec::PushMpls(t)
        }
        ("pop_mpls", _) => {
            require(mpls, "mpls or mplsm")?;
            ActionSpec::PopMpls(num(name, need("an Ethertype")?, 0xffff)? as u16)
        }
        ("set_mpls_ttl", _) => {
            require(mpls, "mpls or mplsm")?;
            ActionSpec::SetMplsTtl(num(name, need("a TTL")?, 255)? as u8)
        }
        ("dec_mpls_ttl", None) => {
            require(mpls, "mpls or mplsm")?;
            ActionSpec::DecMplsTtl
        }
        ("set_mpls_label", _) => {
            require(mpls, "mpls or mplsm")?;
            ActionSpec::SetField(Field::MplsLabel, num(name, need("a label")?, 0xfffff)?)
        }
        ("set_mpls_tc", _) => {
            require(mpls, "mpls or mplsm")?;
            ActionSpec::SetField(Field::MplsTc, num(name, need("a traffic class")?, 7)?)
        }
        ("clear_actions", None) => ActionSpec::ClearActions,
        ("ct", _) => {
            // OVS: ct() needs the rule to match IPv4 or IPv6 (a bucket: checked at run).
            let family = if lenient {
                super::ct::Family::Any
            } else {
                super::ct::Family::of(ty).ok_or_else(|| {
                    ParseError::Invalid(format!("{name} requires the rule to match ip or ipv6"))
                })?
            };
            let (cs, csm) = m.field(Field::CtState);
            let inv = u128::from(crate::ct::state::INV);
            let invalid_only = cs & csm & inv != 0;
            ActionSpec::Ct(Box::new(super::ct::parse_ct(arg, family, invalid_only)?))
        }
        ("ct_clear", None) | ("ct_clear", Some("")) => ActionSpec::CtClear,
        ("conjunction", Some(arg)) if !lenient => parse_conjunction(arg)?,
        ("conjunction", _) if lenient => {
            return Err(ParseError::Invalid(
                "conjunction is for rules, not group buckets".into(),
            ))
        }
        ("learn", Some(arg)) if a.contains('(') => ActionSpec::Learn(Box::new(
            super::learn::parse_learn(arg, (!lenient).then_some(m))?,
        )),
        ("dec_ttl", None) => ActionSpec::DecTtl,
        ("mod_nw_ttl", _) => {
            require(matches!(ty, Some(ETH_IPV4 | ETH_IPV6)), "ip or ipv6")?;
            ActionSpec::SetField(Field::IpTtl, num(name, need("a TTL")?, 255)?)
        }
        ("set_queue", _) => {
            ActionSpec::SetQueue(num(name, need("a queue id")?, u128::from(u32::MAX))? as u32)
        }
        ("group", _) => {
            let g = num(name, need("a group id")?, u128::from(super::OFPG_MAX))? as u32;
            ActionSpec::Group(g)
        }
        ("write_metadata", _) => {
            let v = need("VALUE[/MASK]")?;
            let (value, mask) = with_mask(name, v, u128::from(u64::MAX), |s| {
                num(name, s, u128::from(u64::MAX))
            })?;
            ActionSpec::WriteMetadata {
                value: value as u64,
                mask: mask as u64,
            }
        }
        ("write_actions", _) => {
            if lenient {
                return Err(ParseError::Invalid(
                    "write_actions: instructions are for rules, not group buckets".into(),
                ));
            }
            let inner = arg.unwrap_or("");
            let mut set = Vec::new();
            for x in tokens(inner) {
                let act = parse_action_in(x.trim(), table, Some(m))?;
                if !settable(&act) {
                    return Err(ParseError::Invalid(format!(
                        "write_actions: '{x}' cannot be in the action set"
                    )));
                }
                set.push(act);
            }
            ActionSpec::WriteActions(set)
        }
        ("set_tunnel" | "set_tunnel64", _) => {
            ActionSpec::SetTunnel(num(name, need("a tunnel id")?, u128::from(u64::MAX))? as u64)
        }
        ("goto_table", _) => {
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
        ("meter", _) => {
            let v = need("a meter id")?;
            match crate::meter::parse_meter_id(v)? {
                Some(id) => ActionSpec::Meter(id),
                None => return Err(ParseError::Invalid("meter:all is no meter".into())),
            }
        }
        ("set_field", _) => {
            let a = need("VALUE->FIELD")?;
            let (v, f) = a.split_once("->").ok_or_else(|| {
                ParseError::Invalid(format!("set_field:{a}: expected VALUE->FIELD"))
            })?;
            // Registers and metadata: VALUE[/MASK], a load.
            if let Some(rf) = register_by_name(f).or((f == "metadata").then_some(Field::Metadata)) {
                let full = rf.full();
                let (value, mask) = with_mask(f, v, full, |s| num(f, s, full))?;
                if mask == 0 {
                    return Err(ParseError::Invalid(format!(
                        "set_field:{a}: a mask of 0 writes nothing"
                    )));
                }
                return Ok(ActionSpec::Load {
                    field: rf,
                    value: value & mask,
                    mask,
                });
            }
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
                "nw_ecn" | "ip_ecn" => {
                    require(matches!(ty, Some(ETH_IPV4 | ETH_IPV6)), "ip or ipv6")?;
                    ActionSpec::SetEcn(num(f, v, 3)? as u8)
                }
                "icmp_type" | "icmpv4_type" => {
                    require(icmp4, "icmp")?;
                    ActionSpec::SetField(Field::TpSrc, num(f, v, 255)?)
                }
                "icmp_code" | "icmpv4_code" => {
                    require(icmp4, "icmp")?;
                    ActionSpec::SetField(Field::TpDst, num(f, v, 255)?)
                }
                "icmpv6_type" => {
                    require(icmp6, "icmp6")?;
                    ActionSpec::SetField(Field::TpSrc, num(f, v, 255)?)
                }
                "icmpv6_code" => {
                    require(icmp6, "icmp6")?;
                    ActionSpec::SetField(Field::TpDst, num(f, v, 255)?)
                }
                "arp_op" => {
                    require(arp, "arp")?;
                    ActionSpec::SetField(Field::ArpOp, num(f, v, 0xffff)?)
                }
                "arp_spa" => {
                    require(arp, "arp")?;
                    ActionSpec::SetField(Field::Ipv4Src, u128::from(self::ipv4(f, v)?))
                }
                "arp_tpa" => {
                    require(arp, "arp")?;
                    ActionSpec::SetField(Field::Ipv4Dst, u128::from(self::ipv4(f, v)?))
                }
                "arp_sha" => {
                    require(arp, "arp")?;
                    ActionSpec::SetField(Field::ArpSha, mac(f, v)?)
                }
                "arp_tha" => {
                    require(arp, "arp")?;
                    ActionSpec::SetField(Field::ArpTha, mac(f, v)?)
                }
                "nd_sll" | "ipv6_nd_sll" => {
                    require(nd_type == Some(ND_NS), "icmp6,icmp_type=135")?;
                    ActionSpec::SetField(Field::ArpSha, mac(f, v)?)
                }
                "nd_tll" | "ipv6_nd_tll" => {
                    require(nd_type == Some(ND_NA), "icmp6,icmp_type=136")?;
                    ActionSpec::SetField(Field::ArpTha, mac(f, v)?)
                }
                "nd_target" | "ipv6_nd_target" => {
                    require(
                        matches!(nd_type, Some(ND_NS | ND_NA)),
                        "icmp6,icmp_type=135 or 136",
                    )?;
                    ActionSpec::SetField(Field::NdTarget, ipv6(f, v)?)
                }
                "ipv6_label" | "ipv6_flabel" => {
                    require(ty == Some(ETH_IPV6), "ipv6")?;
                    let full = Field::Ipv6Flabel.full();
                    ActionSpec::SetField(Field::Ipv6Flabel, num(f, v, full)?)
                }
                "vlan_vid" => ActionSpec::SetVlanVid(num(f, v, 4095)? as u16),
                "vlan_pcp" => ActionSpec::SetVlanPcp(num(f, v, 7)? as u8),
                "tun_id" | "tunnel_id" if v.contains('/') => {
                    // Masked (OVN's `set_field:0x1/0xffffff->tun_id`): a load of the bits.
                    let full = u128::from(u64::MAX);
                    let (value, mask) = with_mask(f, v, full, |s| num(f, s, full))?;
                    if mask == 0 {
                        return Err(ParseError::Invalid(format!(
                            "set_field:{a}: a mask of 0 writes nothing"
                        )));
                    }
                    ActionSpec::Load {
                        field: Field::TunId,
                        value: value & mask,
                        mask,
                    }
                }
                "tun_id" | "tunnel_id" => {
                    ActionSpec::SetTunnel(num(f, v, u128::from(u64::MAX))? as u64)
                }
                "tun_dst" => ActionSpec::SetField(Field::TunDst, u128::from(self::ipv4(f, v)?)),
                "tun_metadata0" | "tun_metadata1" | "tun_metadata2" | "tun_metadata3" => {
                    let fld = super::matches::tun_metadata_field(f).unwrap_or(Field::TunMetadata0);
                    ActionSpec::SetField(fld, num(f, v, fld.full())?)
                }
                "mpls_label" => {
                    require(mpls, "mpls or mplsm")?;
                    ActionSpec::SetField(Field::MplsLabel, num(f, v, 0xfffff)?)
                }
                "mpls_tc" => {
                    require(mpls, "mpls or mplsm")?;
                    ActionSpec::SetField(Field::MplsTc, num(f, v, 7)?)
                }
                "mpls_ttl" => {
                    require(mpls, "mpls or mplsm")?;
                    ActionSpec::SetField(Field::MplsTtl, num(f, v, 255)?)
                }
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

/// A `load`/`move` destination: a field a rule may write, whose protocol the rule matches.
fn check_written(
    name: &str,
    dst: &crate::key::SubField,
    m: &Match,
    lenient: bool,
) -> Result<(), ParseError> {
    if !writable(dst.field) {
        return Err(ParseError::Invalid(format!(
            "{name}: {} is read-only",
            super::fields::fmt_subfield(dst, m)
        )));
    }
    if let Some(need) = prerequisite(dst.field, m).filter(|_| !lenient) {
        return Err(ParseError::Invalid(format!(
            "{name}: {} requires the rule to match {need}",
            super::fields::fmt_subfield(dst, m)
        )));
    }
    Ok(())
}

const KEYWORD_ACTIONS: &[&str] = &[
    "load",
    "move",
    "output",
    "mirror",
    "mod_dl_src",
    "mod_dl_dst",
    "mod_nw_src",
    "mod_nw_dst",
    "mod_nw_tos",
    "mod_nw_ecn",
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
    "meter",
    "group",
    "dec_ttl",
    "mod_nw_ttl",
    "set_queue",
    "write_actions",
    "clear_actions",
    "write_metadata",
    "push_mpls",
    "pop_mpls",
    "set_mpls_ttl",
    "dec_mpls_ttl",
    "set_mpls_label",
    "set_mpls_tc",
    "ct",
    "ct_clear",
    "conjunction",
    "push",
    "pop",
    "clone",
];

/// `conjunction(id,k/n)` (OVS's `parse_CONJUNCTION`, its messages): `1 <= k <= n`,
/// `2 <= n <= 64`.
fn parse_conjunction(arg: &str) -> Result<ActionSpec, ParseError> {
    let syntax = || ParseError::Invalid("\"conjunction\" syntax is \"conjunction(id,i/n)\"".into());
    let (id, kn) = arg.split_once(',').ok_or_else(syntax)?;
    let (k, n) = kn.split_once('/').ok_or_else(syntax)?;
    let id = num("conjunction", id.trim(), u128::from(u32::MAX)).map_err(|_| syntax())? as u32;
    let k = num("conjunction", k.trim(), 255).map_err(|_| syntax())? as u8;
    let n = num("conjunction", n.trim(), 255).map_err(|_| syntax())? as u8;
    let msg = if n < 2 {
        "conjunction must have at least 2 clauses"
    } else if n > 64 {
        "conjunction must have at most 64 clauses"
    } else if k < 1 {
        "clause index must be positive"
    } else if k > n {
        "clause index must be less than or equal to number of clauses"
    } else {
        return Ok(ActionSpec::Conjunction {
            id,
            clause: k,
            n_clauses: n,
        });
    };
    Err(ParseError::Invalid(msg.into()))
}
