//! The canonical text of a rule, a filter and an action ([`std::fmt::Display`]): fields in a
//! fixed order, shorthands where the match is exactly one, masks as prefixes where they are
//! one; what prints parses back to the same rule.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::key::{
    Field, ETH_ARP, ETH_IPV4, ETH_IPV6, ETH_MPLS, ETH_MPLS_MCAST, ETH_RARP, FRAG_ANY, FRAG_LATER,
    IP_ICMP, IP_ICMPV6, IP_SCTP, IP_TCP, IP_UDP,
};
use crate::matching::Match;

use super::ct::chex;
use super::fields::fmt_subfield;
use super::{ActionSpec, FlowFilter, FlowSpec};
use crate::key::SubField;

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

/// The `ct_*` match fields, in OVS's order (which prints them before the protocol).
fn fmt_ct_match(out: &mut Vec<String>, m: &Match) {
    use super::ct::{chex, fmt_ct_state};
    let mut put = |name: &str, f: Field, s: &dyn Fn(u128, u128) -> String| {
        let (v, mk) = m.field(f);
        if mk != 0 {
            out.push(format!("{name}={}", s(v, mk)));
        }
    };
    let hex = |full: u128| {
        move |v: u128, mk: u128| {
            if mk == full {
                chex(v)
            } else {
                format!("{}/{}", chex(v), chex(mk))
            }
        }
    };
    put("ct_state", Field::CtState, &fmt_ct_state);
    put("ct_zone", Field::CtZone, &|v, _| v.to_string());
    put("ct_mark", Field::CtMark, &hex(Field::CtMark.full()));
    put("ct_label", Field::CtLabel, &hex(u128::MAX));
    put("ct_nw_src", Field::CtNwSrc, &fmt_ipv4);
    put("ct_nw_dst", Field::CtNwDst, &fmt_ipv4);
    put("ct_nw_proto", Field::CtNwProto, &|v, _| v.to_string());
    put("ct_tp_src", Field::CtTpSrc, &|v, mk| fmt_num(v, mk, 0xffff));
    put("ct_tp_dst", Field::CtTpDst, &|v, mk| fmt_num(v, mk, 0xffff));
}

/// The match fields in text (shared by rules and filters).
fn fmt_match(out: &mut Vec<String>, m: &Match) {
    // OVS prints conj_id before the ct_* fields and the protocol.
    if let Some(id) = m.conj_id {
        out.push(format!("conj_id={id}"));
    }
    fmt_ct_match(out, m);
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
                ETH_RARP => out.push("rarp".into()),
                ETH_MPLS => out.push("mpls".into()),
                ETH_MPLS_MCAST => out.push("mplsm".into()),
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
    // IpTos holds nw_tos (the DSCP bits) and nw_ecn (the low two), matched apart.
    let (tos, tosm) = m.field(Field::IpTos);
    if tosm & 0xfc == 0xfc {
        out.push(format!("nw_tos={}", tos & 0xfc));
    }
    if tosm & 0x03 == 0x03 {
        out.push(format!("nw_ecn={}", tos & 0x03));
    }
    let mut put = |name: &str, f: Field, s: &dyn Fn(u128, u128) -> String| {
        let (v, mk) = m.field(f);
        if mk != 0 {
            out.push(format!("{name}={}", s(v, mk)));
        }
    };
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
    let mac_masked = |full: u128| {
        move |v: u128, mk: u128| {
            if mk == full {
                fmt_mac(v)
            } else {
                format!("{}/{}", fmt_mac(v), fmt_mac(mk))
            }
        }
    };
    // ARP's hardware addresses, or ND's link-layer address options (one field each).
    let (sha, tha) = if arp {
        ("arp_sha", "arp_tha")
    } else {
        ("nd_sll", "nd_tll")
    };
    put("nd_target", Field::NdTarget, &fmt_ipv6);
    put(sha, Field::ArpSha, &mac_masked(Field::ArpSha.full()));
    put(tha, Field::ArpTha, &mac_masked(Field::ArpTha.full()));
    put("ipv6_label", Field::Ipv6Flabel, &|v, mk| {
        if mk == Field::Ipv6Flabel.full() {
            format!("{v:#07x}")
        } else {
            format!("{v:#07x}/{mk:#07x}")
        }
    });
    put("tun_id", Field::TunId, &|v, mk| {
        if mk == Field::TunId.full() {
            format!("{v:#x}")
        } else {
            format!("{v:#x}/{mk:#x}")
        }
    });
    put("metadata", Field::Metadata, &|v, mk| {
        if mk == Field::Metadata.full() {
            format!("{v:#x}")
        } else {
            format!("{v:#x}/{mk:#x}")
        }
    });
    for (i, f) in Field::REGS.iter().enumerate() {
        put(&format!("reg{i}"), *f, &|v, mk| {
            if mk == f.full() {
                chex(v)
            } else {
                format!("{}/{}", chex(v), chex(mk))
            }
        });
    }
    put("tun_src", Field::TunSrc, &fmt_ipv4);
    put("tun_dst", Field::TunDst, &fmt_ipv4);
    for (n, fld) in Field::TUN_METADATA.iter().enumerate() {
        put(format!("tun_metadata{n}").as_str(), *fld, &|v, mk| {
            if mk == fld.full() {
                format!("{v:#x}")
            } else {
                format!("{v:#x}/{mk:#x}")
            }
        });
    }
    put("mpls_label", Field::MplsLabel, &|v, _| v.to_string());
    put("mpls_tc", Field::MplsTc, &|v, _| v.to_string());
    put("mpls_ttl", Field::MplsTtl, &|v, _| v.to_string());
    put("mpls_bos", Field::MplsBos, &|v, _| v.to_string());
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
                Field::ArpOp => write!(f, "set_field:{v}->arp_op"),
                Field::ArpSha => write!(f, "set_field:{}->arp_sha", fmt_mac(*v)),
                Field::ArpTha => write!(f, "set_field:{}->arp_tha", fmt_mac(*v)),
                Field::NdTarget => write!(f, "set_field:{}->nd_target", Ipv6Addr::from(*v)),
                Field::Ipv6Flabel => write!(f, "set_field:{v:#x}->ipv6_label"),
                Field::MplsLabel => write!(f, "set_field:{v}->mpls_label"),
                Field::MplsTc => write!(f, "set_field:{v}->mpls_tc"),
                Field::MplsTtl => write!(f, "set_field:{v}->mpls_ttl"),
                Field::TunMetadata0 => write!(f, "set_field:{v:#x}->tun_metadata0"),
                Field::TunMetadata1 => write!(f, "set_field:{v:#x}->tun_metadata1"),
                Field::TunMetadata2 => write!(f, "set_field:{v:#x}->tun_metadata2"),
                Field::TunMetadata3 => write!(f, "set_field:{v:#x}->tun_metadata3"),
                other => write!(f, "set_field:{v}->{other:?}"),
            },
            ActionSpec::SetEcn(v) => write!(f, "mod_nw_ecn:{v}"),
            ActionSpec::SetVlanVid(v) => write!(f, "mod_vlan_vid:{v}"),
            ActionSpec::SetVlanPcp(v) => write!(f, "mod_vlan_pcp:{v}"),
            ActionSpec::PopVlan => write!(f, "strip_vlan"),
            ActionSpec::PushVlan(t) => write!(f, "push_vlan:{t:#06x}"),
            ActionSpec::SetTunnel(t) => write!(f, "set_tunnel:{t:#x}"),
            ActionSpec::GotoTable(t) => write!(f, "goto_table:{t}"),
            ActionSpec::Meter(m) => write!(f, "meter:{m}"),
            ActionSpec::Controller { max_len, ext: None } => write!(f, "CONTROLLER:{max_len}"),
            ActionSpec::Controller {
                max_len,
                ext: Some(e),
            } => {
                // OVS's format_CONTROLLER: only what differs from the defaults.
                let mut parts = Vec::new();
                if let Some(r) = e.reason.filter(|&r| r != 1) {
                    match super::actions::PACKET_IN_REASONS.get(usize::from(r)) {
                        Some(n) => parts.push(format!("reason={n}")),
                        None => parts.push(format!("reason={r}")),
                    }
                }
                if *max_len != u16::MAX {
                    parts.push(format!("max_len={max_len}"));
                }
                if e.controller_id != 0 {
                    parts.push(format!("id={}", e.controller_id));
                }
                if !e.userdata.is_empty() {
                    let hex: Vec<String> = e.userdata.iter().map(|b| format!("{b:02x}")).collect();
                    parts.push(format!("userdata={}", hex.join(".")));
                }
                if e.pause {
                    parts.push("pause".to_string());
                }
                if let Some(m) = e.meter_id {
                    parts.push(format!("meter_id={m}"));
                }
                write!(f, "controller({})", parts.join(","))
            }
            ActionSpec::Group(g) => write!(f, "group:{g}"),
            ActionSpec::DecTtl => write!(f, "dec_ttl"),
            ActionSpec::SetQueue(q) => write!(f, "set_queue:{q}"),
            ActionSpec::ClearActions => write!(f, "clear_actions"),
            ActionSpec::WriteMetadata { value, mask } => {
                if *mask == u64::MAX {
                    write!(f, "write_metadata:{value:#x}")
                } else {
                    write!(f, "write_metadata:{value:#x}/{mask:#x}")
                }
            }
            ActionSpec::PushMpls(t) => write!(f, "push_mpls:{t:#06x}"),
            ActionSpec::PopMpls(t) => write!(f, "pop_mpls:{t:#06x}"),
            ActionSpec::SetMplsTtl(t) => write!(f, "set_mpls_ttl({t})"),
            ActionSpec::DecMplsTtl => write!(f, "dec_mpls_ttl"),
            ActionSpec::Ct(c) => write!(f, "{}", super::ct::fmt_ct(c)),
            ActionSpec::CtClear => write!(f, "ct_clear"),
            ActionSpec::Conjunction {
                id,
                clause,
                n_clauses,
            } => write!(f, "conjunction({id},{clause}/{n_clauses})"),
            ActionSpec::Load { .. }
            | ActionSpec::Move { .. }
            | ActionSpec::OutputReg(_)
            | ActionSpec::Learn(_)
            | ActionSpec::StackPush(_)
            | ActionSpec::StackPop(_)
            | ActionSpec::Clone(_)
            | ActionSpec::CheckPktLarger { .. } => {
                write!(f, "{}", fmt_action(self, &Match::catchall()))
            }
            ActionSpec::Resubmit { port, table } => match (port, table) {
                (Some(p), None) => write!(f, "resubmit:{p}"),
                (p, Some(t)) => write!(f, "resubmit({},{t})", p.as_deref().unwrap_or("")),
                (None, None) => write!(f, "resubmit(,)"),
            },
            ActionSpec::WriteActions(v) => {
                let v: Vec<String> = v.iter().map(|a| a.to_string()).collect();
                write!(f, "write_actions({})", v.join(","))
            }
        }
    }
}

/// An action of a rule with match `m`: where one key field is several protocols' field
/// (ARP's addresses in the IPv4 ones, ICMP's type and code in the ports, ND's link-layer
/// options in ARP's hardware addresses), the rewrite is named by the protocol the match pins,
/// so the text parses back (each name requires its protocol).
fn fmt_action(a: &ActionSpec, m: &Match) -> String {
    let (ty, tym) = m.field(Field::EthType);
    let ty = (tym != 0).then_some(ty as u16);
    let (pr, prm) = m.field(Field::IpProto);
    let proto = (prm != 0).then_some(pr as u8);
    match (a, ty, proto) {
        (ActionSpec::SetField(Field::Ipv4Src, v), Some(ETH_ARP), _) => {
            format!("set_field:{}->arp_spa", Ipv4Addr::from(*v as u32))
        }
        (ActionSpec::SetField(Field::Ipv4Dst, v), Some(ETH_ARP), _) => {
            format!("set_field:{}->arp_tpa", Ipv4Addr::from(*v as u32))
        }
        (ActionSpec::SetField(f @ (Field::TpSrc | Field::TpDst), v), Some(t), Some(p))
            if (t, p) == (ETH_IPV4, IP_ICMP) || (t, p) == (ETH_IPV6, IP_ICMPV6) =>
        {
            let v6 = if t == ETH_IPV6 { "v6" } else { "" };
            let what = if *f == Field::TpSrc { "type" } else { "code" };
            format!("set_field:{v}->icmp{v6}_{what}")
        }
        (ActionSpec::SetField(Field::ArpSha, v), Some(ETH_IPV6), _) => {
            format!("set_field:{}->nd_sll", fmt_mac(*v))
        }
        (ActionSpec::SetField(Field::ArpTha, v), Some(ETH_IPV6), _) => {
            format!("set_field:{}->nd_tll", fmt_mac(*v))
        }
        (ActionSpec::WriteActions(v), _, _) => {
            let v: Vec<String> = v.iter().map(|a| fmt_action(a, m)).collect();
            format!("write_actions({})", v.join(","))
        }
        (ActionSpec::Move { src, dst }, _, _) => {
            format!("move:{}->{}", fmt_subfield(src, m), fmt_subfield(dst, m))
        }
        (ActionSpec::OutputReg(src), _, _) => format!("output:{}", fmt_subfield(src, m)),
        (ActionSpec::Learn(l), _, _) => super::learn::fmt_learn(l, m),
        (ActionSpec::StackPush(sf), _, _) => format!("push:{}", fmt_subfield(sf, m)),
        (ActionSpec::StackPop(sf), _, _) => format!("pop:{}", fmt_subfield(sf, m)),
        (ActionSpec::Clone(v), _, _) => {
            let v: Vec<String> = v.iter().map(|a| fmt_action(a, m)).collect();
            format!("clone({})", v.join(","))
        }
        (ActionSpec::CheckPktLarger { len, dst }, _, _) => {
            format!("check_pkt_larger({len})->{}", fmt_subfield(dst, m))
        }
        (ActionSpec::Load { field, value, mask }, _, _) => fmt_load(*field, *value, *mask, m),
        _ => a.to_string(),
    }
}

/// A load: `load:V->FIELD[a..b]` when its mask is one run of bits (at most 128), else
/// `set_field:V/M->NAME` (registers and metadata only take a mask of any shape).
fn fmt_load(field: Field, value: u128, mask: u128, m: &Match) -> String {
    let ofs = mask.trailing_zeros();
    let run = mask >> ofs;
    if mask != 0 && run & run.wrapping_add(1) == 0 {
        let nbits = 128 - run.leading_zeros();
        if let Some(sf) = SubField::new(field, ofs as u16, nbits as u16) {
            return format!("load:{}->{}", chex(value >> ofs), fmt_subfield(&sf, m));
        }
    }
    let name = super::fields::short_name(field).unwrap_or("metadata");
    format!("set_field:{}/{}->{name}", chex(value), chex(mask))
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
        let actions: Vec<String> = self
            .actions
            .iter()
            .map(|a| fmt_action(a, &self.m))
            .collect();
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
