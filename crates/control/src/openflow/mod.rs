//! OpenFlow 1.3 flow programming mapped onto a bridge's rules ([`BridgeRules`]): a
//! FLOW_MOD becomes the same [`FlowSpec`]s `ferrovs add-flow` installs, and a rule becomes
//! an `ofp_flow_stats` entry. Pure functions over plain data; the daemon's OpenFlow
//! connections (`daemon/openflow.rs`) call them and publish the result.
//!
//! Invariants:
//! * A FLOW_MOD either applies completely or changes nothing and returns the [`OfError`]
//!   the peer gets; what the pipeline cannot do (a field the flow key lacks, an action it
//!   has no equivalent for, groups, meters, write-actions, metadata) is refused with the
//!   precise `OFPET_*`/code, never accepted and ignored.
//! * A rule built from a FLOW_MOD prints to ovs-ofctl text that parses back to the same rule
//!   (checked on every add), so what OpenFlow installs is saved, restored and handed over
//!   exactly as what the CLI installs.
//! * Ports are named in rules; OpenFlow numbers go through [`PortMap`] (each port's
//!   `ofport`; `OFPP_LOCAL` is the port named as the bridge, when there is one).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ferrovs_flow::key::{ETH_ARP, ETH_IPV4, ETH_IPV6, IP_ICMP, IP_ICMPV6, IP_SCTP, IP_TCP, IP_UDP};
use ferrovs_flow::{ActionSpec, Field, FlowFilter, FlowSpec, Match, RuleStats};
use ferrovs_openflow::error::{bac, bic, bmc, brc, et, fmfc};
use ferrovs_openflow::message::{fc, ff, OFPTT_ALL, OFP_NO_BUFFER};
use ferrovs_openflow::multipart::{AggregateStats, FlowStats, FlowStatsRequest};
use ferrovs_openflow::oxm::{Field as Of, OFPVID_PRESENT};
use ferrovs_openflow::port::{
    OFPP_ALL, OFPP_ANY, OFPP_CONTROLLER, OFPP_FLOOD, OFPP_IN_PORT, OFPP_LOCAL, OFPP_NORMAL,
};
use ferrovs_openflow::{Action, FlowMod, Instruction, OfError, Oxm};

use std::sync::atomic::Ordering::Relaxed;

use ferrovs_flow::{BucketSpec, GroupSpec, GroupType};
use ferrovs_openflow::action::{OFPG_ALL, OFPG_MAX};
use ferrovs_openflow::error::gmfc;
use ferrovs_openflow::message::{Bucket, GroupMod};
use ferrovs_openflow::multipart::{Counter, GroupDesc, GroupFeatures, GroupStats as OfGroupStats};

use crate::flows::{BridgeRules, GroupError, StoredRule};

/// `OFPG_ANY`: no group filter.
pub const OFPG_ANY: u32 = 0xffff_ffff;
/// Tables the pipeline has (0..=253, as OVS; 254 and 255 are OpenFlow's reserved ids).
pub const N_TABLES: u8 = 254;

/// A bridge's OpenFlow port numbers and names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortMap {
    by_no: BTreeMap<u32, String>,
}

impl PortMap {
    /// From `(ofport, name)` pairs; a port named `bridge` is also `OFPP_LOCAL`.
    pub fn new<'a>(bridge: &str, ports: impl IntoIterator<Item = (u16, &'a str)>) -> PortMap {
        let mut by_no = BTreeMap::new();
        for (no, name) in ports {
            if name == bridge {
                by_no.insert(OFPP_LOCAL, name.to_string());
            } else {
                by_no.insert(u32::from(no), name.to_string());
            }
        }
        PortMap { by_no }
    }

    /// The name of port `no`.
    pub fn name(&self, no: u32) -> Option<&str> {
        self.by_no.get(&no).map(String::as_str)
    }

    /// The number of port `name`; a name that is a port number (see
    /// [`PortMap::name_or_number`]) is that number when no port has that name.
    pub fn number(&self, name: &str) -> Option<u32> {
        self.by_no
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(k, _)| *k)
            .or_else(|| absent_port_number(name))
    }

    /// The name of port `no`, or for a number the bridge has no port of (yet), the number
    /// as the name: OVS accepts rules on absent ports (`output:N`, `in_port=N`; they do
    /// nothing until a port gets that number), and ovn-controller's bundles may name a port
    /// before its view of the bridge has it. The pipeline resolves such a name by OpenFlow
    /// number when it is built (the daemon's `resolve`). `None`: a reserved number.
    pub fn name_or_number(&self, no: u32) -> Option<String> {
        match self.name(no) {
            Some(n) => Some(n.to_string()),
            None if (1..0xff00).contains(&no) => Some(no.to_string()),
            None => None,
        }
    }
}

/// The port number a rule's port name stands for when it is a number (ovs-ofctl's
/// `output:N`): decimal digits, 1..=65279 (OVS's OFPP_MAX for 16-bit numbers).
pub fn absent_port_number(name: &str) -> Option<u32> {
    if name.is_empty() || name.len() > 5 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse::<u32>()
        .ok()
        .filter(|&n| (1..0xff00).contains(&n))
}

const fn err(type_: u16, code: u16, reason: &'static str) -> OfError {
    OfError::new(type_, code, reason)
}

/// An OpenFlow match as the flow key's match and the input port's name.
pub fn match_from_of(
    m: &ferrovs_openflow::Match,
    ports: &PortMap,
) -> Result<(Match, Option<String>), OfError> {
    let mut out = Match::catchall();
    let mut in_port = None;
    for o in &m.fields {
        let (v, mask) = (o.value_u128(), o.mask_u128());
        if regs::is_internal(o.field) && o.field != Of::Metadata && o.field != Of::NxmInPort {
            // Registers (reg, xreg, xxreg views of the same key words).
            if let Some(f) = regs::of_to_key(o.field) {
                out.set(f, v, mask);
                continue;
            }
        }
        let f = match o.field {
            Of::InPort | Of::NxmInPort => {
                let no = if o.field == Of::NxmInPort {
                    ferrovs_openflow::nicira::port_from_16(v as u16)
                } else {
                    v as u32
                };
                let name = ports.name_or_number(no).ok_or(err(
                    et::BAD_MATCH,
                    bmc::BAD_VALUE,
                    "in_port is a reserved port number",
                ))?;
                in_port = Some(name);
                continue;
            }
            Of::EthDst => Field::EthDst,
            Of::EthSrc => Field::EthSrc,
            Of::EthType => Field::EthType,
            Of::VlanVid => {
                out.set(Field::VlanTci, v & 0x1fff, mask & 0x1fff);
                continue;
            }
            Of::VlanPcp => {
                out.set(Field::VlanTci, v << 13, 0xe000);
                continue;
            }
            Of::IpDscp => {
                out.set(Field::IpTos, v << 2, 0xfc);
                continue;
            }
            Of::IpEcn => {
                out.set(Field::IpTos, v, 0x03);
                continue;
            }
            Of::ArpSha | Of::Ipv6NdSll => Field::ArpSha,
            Of::ArpTha | Of::Ipv6NdTll => Field::ArpTha,
            Of::Ipv6NdTarget => Field::NdTarget,
            Of::Ipv6Flabel => Field::Ipv6Flabel,
            Of::IpProto => Field::IpProto,
            Of::Ipv4Src | Of::ArpSpa => Field::Ipv4Src,
            Of::Ipv4Dst | Of::ArpTpa => Field::Ipv4Dst,
            Of::TcpSrc | Of::UdpSrc | Of::SctpSrc => Field::TpSrc,
            Of::TcpDst | Of::UdpDst | Of::SctpDst => Field::TpDst,
            // ICMP type and code are the key's transport ports (as OVS), matched whole.
            Of::Icmpv4Type | Of::Icmpv6Type => {
                out.set(Field::TpSrc, v, 0xffff);
                continue;
            }
            Of::Icmpv4Code | Of::Icmpv6Code => {
                out.set(Field::TpDst, v, 0xffff);
                continue;
            }
            Of::ArpOp => Field::ArpOp,
            Of::Ipv6Src => Field::Ipv6Src,
            Of::Ipv6Dst => Field::Ipv6Dst,
            Of::TunnelId => Field::TunId,
            Of::TunIpv4Src => Field::TunSrc,
            Of::TunIpv4Dst => Field::TunDst,
            Of::TunMetadata0 => Field::TunMetadata0,
            Of::TunMetadata1 => Field::TunMetadata1,
            Of::TunMetadata2 => Field::TunMetadata2,
            Of::TunMetadata3 => Field::TunMetadata3,
            Of::Metadata => Field::Metadata,
            Of::MplsLabel => Field::MplsLabel,
            Of::MplsTc => Field::MplsTc,
            Of::MplsBos => Field::MplsBos,
            Of::NxIpTtl => Field::IpTtl,
            // nw_frag: its two bits (an exact match is a mask of both, as OVS).
            Of::NxIpFrag => {
                out.set(Field::IpFrag, v & 3, mask & 3);
                continue;
            }
            // The tracker's eight ct_state bits, as OVS keeps them: a value beyond them
            // is BAD_VALUE, a mask beyond them is cut to them.
            Of::CtState => {
                if v >> 8 != 0 {
                    return Err(err(
                        et::BAD_MATCH,
                        bmc::BAD_VALUE,
                        "ct_state bits the tracker does not have",
                    ));
                }
                out.set(Field::CtState, v, mask & 0xff);
                continue;
            }
            Of::CtZone => Field::CtZone,
            Of::CtMark => Field::CtMark,
            Of::CtLabel => Field::CtLabel,
            Of::CtNwProto => Field::CtNwProto,
            Of::CtNwSrc => Field::CtNwSrc,
            Of::CtNwDst => Field::CtNwDst,
            Of::CtTpSrc => Field::CtTpSrc,
            Of::CtTpDst => Field::CtTpDst,
            // Not a key field: the conjunction the rule applies to (see
            // ferrovs_flow::classifier).
            Of::ConjId => {
                out.conj_id = Some(v as u32);
                continue;
            }
            // The flow key has no such field (ct_ipv6_src/dst among them).
            _ => {
                return Err(err(
                    et::BAD_MATCH,
                    bmc::BAD_FIELD,
                    "a match field the pipeline does not have",
                ))
            }
        };
        out.set(f, v, mask);
    }
    Ok((out, in_port))
}

/// The OpenFlow match of a rule (its input port by number). Fields OpenFlow 1.3 has no
/// basic OXM for are Nicira's where OVS has one (`nw_ttl` as `NXM_NX_IP_TTL`, registers as
/// `NXM_NX_REG*`, `nw_frag` as `NXM_NX_IP_FRAG`) and left out where not (`mpls_ttl`).
pub fn match_to_of(m: &Match, in_port: Option<&str>, ports: &PortMap) -> ferrovs_openflow::Match {
    let mut fields = Vec::new();
    let oxm = |f: Of, v: u128, mask: u128, full: u128| {
        if mask == full {
            Oxm::exact(f, v)
        } else {
            Oxm::masked(f, v, mask)
        }
    };
    if let Some(no) = in_port.and_then(|n| ports.number(n)) {
        fields.push(Oxm::exact(Of::InPort, u128::from(no)));
    }
    if let Some(id) = m.conj_id {
        fields.push(Oxm::exact(Of::ConjId, u128::from(id)));
    }
    let (ty, tym) = m.field(Field::EthType);
    let ty = (tym != 0).then_some(ty as u16);
    let (pr, prm) = m.field(Field::IpProto);
    let proto = (prm != 0).then_some(pr as u8);
    for f in [Field::EthDst, Field::EthSrc] {
        let (v, mk) = m.field(f);
        if mk != 0 {
            let of = if f == Field::EthDst {
                Of::EthDst
            } else {
                Of::EthSrc
            };
            fields.push(oxm(of, v, mk, f.full()));
        }
    }
    if let Some(t) = ty {
        fields.push(Oxm::exact(Of::EthType, u128::from(t)));
    }
    let (tci, tcim) = m.field(Field::VlanTci);
    if tcim & 0x1fff != 0 {
        fields.push(oxm(Of::VlanVid, tci & 0x1fff, tcim & 0x1fff, 0x1fff));
    }
    if tcim & 0xe000 == 0xe000 && tci & u128::from(OFPVID_PRESENT) != 0 {
        fields.push(Oxm::exact(Of::VlanPcp, tci >> 13));
    }
    let (tos, tosm) = m.field(Field::IpTos);
    if tosm & 0xfc == 0xfc {
        fields.push(Oxm::exact(Of::IpDscp, tos >> 2));
    }
    if tosm & 0x03 == 0x03 {
        fields.push(Oxm::exact(Of::IpEcn, tos & 0x03));
    }
    if let Some(p) = proto {
        fields.push(Oxm::exact(Of::IpProto, u128::from(p)));
    }
    let arp = ty == Some(ETH_ARP);
    for (f, ip, a) in [
        (Field::Ipv4Src, Of::Ipv4Src, Of::ArpSpa),
        (Field::Ipv4Dst, Of::Ipv4Dst, Of::ArpTpa),
    ] {
        let (v, mk) = m.field(f);
        if mk != 0 {
            fields.push(oxm(if arp { a } else { ip }, v, mk, f.full()));
        }
    }
    for (f, of) in [(Field::Ipv6Src, Of::Ipv6Src), (Field::Ipv6Dst, Of::Ipv6Dst)] {
        let (v, mk) = m.field(f);
        if mk != 0 {
            fields.push(oxm(of, v, mk, f.full()));
        }
    }
    let ports_of = match proto {
        Some(IP_TCP) => Some((Of::TcpSrc, Of::TcpDst)),
        Some(IP_UDP) => Some((Of::UdpSrc, Of::UdpDst)),
        Some(IP_SCTP) => Some((Of::SctpSrc, Of::SctpDst)),
        Some(IP_ICMP) if ty == Some(ETH_IPV4) => Some((Of::Icmpv4Type, Of::Icmpv4Code)),
        Some(IP_ICMPV6) if ty == Some(ETH_IPV6) => Some((Of::Icmpv6Type, Of::Icmpv6Code)),
        _ => None,
    };
    if let Some((s, d)) = ports_of {
        for (f, of) in [(Field::TpSrc, s), (Field::TpDst, d)] {
            let (v, mk) = m.field(f);
            if mk != 0 {
                let full = if matches!(
                    of,
                    Of::Icmpv4Type | Of::Icmpv4Code | Of::Icmpv6Type | Of::Icmpv6Code
                ) {
                    0xff
                } else {
                    0xffff
                };
                fields.push(oxm(of, v & full, mk & full, full));
            }
        }
    }
    let (op, opm) = m.field(Field::ArpOp);
    if opm != 0 {
        fields.push(Oxm::exact(Of::ArpOp, op));
    }
    // ARP's hardware addresses, or ND's target and link-layer address options (which
    // OpenFlow 1.3 matches exactly only).
    let nd = [
        (Field::NdTarget, Of::Ipv6NdTarget, Of::Ipv6NdTarget),
        (Field::ArpSha, Of::ArpSha, Of::Ipv6NdSll),
        (Field::ArpTha, Of::ArpTha, Of::Ipv6NdTll),
    ];
    for (f, a, n) in nd {
        let (v, mk) = m.field(f);
        if mk != 0 {
            fields.push(oxm(if arp { a } else { n }, v, mk, f.full()));
        }
    }
    let (fl, flm) = m.field(Field::Ipv6Flabel);
    if flm != 0 {
        fields.push(oxm(Of::Ipv6Flabel, fl, flm, Field::Ipv6Flabel.full()));
    }
    // MPLS (no OpenFlow 1.3 basic field for mpls_ttl, which only the CLI can match).
    for (f, of) in [
        (Field::MplsLabel, Of::MplsLabel),
        (Field::MplsTc, Of::MplsTc),
        (Field::MplsBos, Of::MplsBos),
    ] {
        let (v, mk) = m.field(f);
        if mk != 0 {
            fields.push(Oxm::exact(of, v));
        }
    }
    for (f, of) in [
        (Field::Metadata, Of::Metadata),
        (Field::TunId, Of::TunnelId),
        (Field::TunSrc, Of::TunIpv4Src),
        (Field::TunDst, Of::TunIpv4Dst),
        (Field::TunMetadata0, Of::TunMetadata0),
        (Field::TunMetadata1, Of::TunMetadata1),
        (Field::TunMetadata2, Of::TunMetadata2),
        (Field::TunMetadata3, Of::TunMetadata3),
    ] {
        let (v, mk) = m.field(f);
        if mk != 0 {
            fields.push(oxm(of, v, mk, f.full()));
        }
    }
    let (ttl, ttlm) = m.field(Field::IpTtl);
    if ttlm == 0xff {
        fields.push(Oxm::exact(Of::NxIpTtl, ttl));
    }
    // nw_frag as OVS writes it: both bits matched is an exact match.
    let (frag, fragm) = m.field(Field::IpFrag);
    match fragm & 3 {
        0 => {}
        3 => fields.push(Oxm::exact(Of::NxIpFrag, frag & 3)),
        mk => fields.push(Oxm::masked(Of::NxIpFrag, frag & mk, mk)),
    }
    for (i, f) in Field::REGS.iter().enumerate() {
        let (v, mk) = m.field(*f);
        if mk != 0 {
            fields.push(oxm(Of::REGS[i], v, mk, f.full()));
        }
    }
    // Conntrack. ct_state is 32 bits on the wire and 8 in the key: it is always sent
    // masked (as OVS keeps it), never as an exact match of the 24 bits the key lacks.
    let (st, stm) = m.field(Field::CtState);
    if stm != 0 {
        fields.push(Oxm::masked(Of::CtState, st, stm));
    }
    for (f, of) in [
        (Field::CtZone, Of::CtZone),
        (Field::CtMark, Of::CtMark),
        (Field::CtLabel, Of::CtLabel),
        (Field::CtNwSrc, Of::CtNwSrc),
        (Field::CtNwDst, Of::CtNwDst),
        (Field::CtNwProto, Of::CtNwProto),
        (Field::CtTpSrc, Of::CtTpSrc),
        (Field::CtTpDst, Of::CtTpDst),
    ] {
        let (v, mk) = m.field(f);
        if mk != 0 {
            fields.push(oxm(of, v, mk, f.full()));
        }
    }
    ferrovs_openflow::Match { fields }
}

fn action_from_of(a: &Action, ports: &PortMap) -> Result<ActionSpec, OfError> {
    let bad_type = || {
        err(
            et::BAD_ACTION,
            bac::BAD_TYPE,
            "an action the pipeline does not have",
        )
    };
    if let Some(spec) = regs::action_from_of(a, ports)? {
        return Ok(spec);
    }
    if let Action::Learn(l) = a {
        return learn::learn_from_of(l);
    }
    Ok(match a {
        Action::Output { port, max_len } => match *port {
            OFPP_IN_PORT => ActionSpec::InPort,
            OFPP_NORMAL => ActionSpec::Normal,
            OFPP_FLOOD => ActionSpec::Flood,
            OFPP_ALL => ActionSpec::All,
            // A PACKET_IN of the first `max_len` bytes (0xffff, OFPCML_NO_BUFFER: all).
            OFPP_CONTROLLER => ActionSpec::Controller {
                max_len: *max_len,
                ext: None,
            },
            // A port the bridge does not have (yet) is accepted, as OVS does.
            p => ActionSpec::Output(ports.name_or_number(p).ok_or(err(
                et::BAD_ACTION,
                bac::BAD_OUT_PORT,
                "output to a reserved port the pipeline does not have",
            ))?),
        },
        Action::PushVlan(t @ (0x8100 | 0x88a8)) => ActionSpec::PushVlan(*t),
        Action::PushVlan(_) => {
            return Err(err(
                et::BAD_ACTION,
                bac::BAD_ARGUMENT,
                "push_vlan: only 0x8100 (802.1Q) and 0x88a8 (802.1ad)",
            ))
        }
        Action::PopVlan => ActionSpec::PopVlan,
        Action::SetNwTtl(t) => ActionSpec::SetField(Field::IpTtl, u128::from(*t)),
        // Accepted and ignored, as OVS does for a port without QoS queues.
        Action::SetQueue(q) => ActionSpec::SetQueue(*q),
        Action::DecNwTtl => ActionSpec::DecTtl,
        Action::PushMpls(e @ (0x8847 | 0x8848)) => ActionSpec::PushMpls(*e),
        Action::PushMpls(_) => {
            return Err(err(
                et::BAD_ACTION,
                bac::BAD_ARGUMENT,
                "push_mpls: the Ethertype must be 0x8847 or 0x8848",
            ))
        }
        Action::PopMpls(e) => ActionSpec::PopMpls(*e),
        Action::SetMplsTtl(t) => ActionSpec::SetMplsTtl(*t),
        Action::DecMplsTtl => ActionSpec::DecMplsTtl,
        // Whether the group exists is checked against the bridge's groups
        // ([`apply_flow_mod`], [`apply_group_mod`]).
        Action::Group(g) => ActionSpec::Group(*g),
        Action::SetField(o) => {
            let v = o.value_u128();
            match o.field {
                Of::EthSrc => ActionSpec::SetField(Field::EthSrc, v),
                Of::EthDst => ActionSpec::SetField(Field::EthDst, v),
                Of::Ipv4Src => ActionSpec::SetField(Field::Ipv4Src, v),
                Of::Ipv4Dst => ActionSpec::SetField(Field::Ipv4Dst, v),
                Of::Ipv6Src => ActionSpec::SetField(Field::Ipv6Src, v),
                Of::Ipv6Dst => ActionSpec::SetField(Field::Ipv6Dst, v),
                Of::IpDscp => ActionSpec::SetField(Field::IpTos, v << 2),
                Of::IpEcn => ActionSpec::SetEcn(v as u8),
                // ICMP's type and code are the key's ports, as in the match.
                Of::TcpSrc | Of::UdpSrc | Of::Icmpv4Type | Of::Icmpv6Type => {
                    ActionSpec::SetField(Field::TpSrc, v)
                }
                Of::TcpDst | Of::UdpDst | Of::Icmpv4Code | Of::Icmpv6Code => {
                    ActionSpec::SetField(Field::TpDst, v)
                }
                Of::ArpOp => ActionSpec::SetField(Field::ArpOp, v),
                Of::ArpSpa => ActionSpec::SetField(Field::Ipv4Src, v),
                Of::ArpTpa => ActionSpec::SetField(Field::Ipv4Dst, v),
                Of::ArpSha | Of::Ipv6NdSll => ActionSpec::SetField(Field::ArpSha, v),
                Of::ArpTha | Of::Ipv6NdTll => ActionSpec::SetField(Field::ArpTha, v),
                Of::Ipv6NdTarget => ActionSpec::SetField(Field::NdTarget, v),
                Of::Ipv6Flabel => ActionSpec::SetField(Field::Ipv6Flabel, v),
                Of::VlanVid => ActionSpec::SetVlanVid((v & 0xfff) as u16),
                Of::VlanPcp => ActionSpec::SetVlanPcp(v as u8),
                Of::TunnelId => ActionSpec::SetTunnel(v as u64),
                Of::TunIpv4Dst => ActionSpec::SetField(Field::TunDst, v),
                Of::TunMetadata0 => ActionSpec::SetField(Field::TunMetadata0, v),
                Of::TunMetadata1 => ActionSpec::SetField(Field::TunMetadata1, v),
                Of::TunMetadata2 => ActionSpec::SetField(Field::TunMetadata2, v),
                Of::TunMetadata3 => ActionSpec::SetField(Field::TunMetadata3, v),
                Of::MplsLabel => ActionSpec::SetField(Field::MplsLabel, v),
                Of::MplsTc => ActionSpec::SetField(Field::MplsTc, v),
                Of::NxIpTtl => ActionSpec::SetField(Field::IpTtl, v),
                // (ct_mark and ct_label are written inside ct only: the codec refuses
                // them here.)
                _ => {
                    return Err(err(
                        et::BAD_ACTION,
                        bac::BAD_SET_TYPE,
                        "set_field of a field the pipeline cannot rewrite",
                    ))
                }
            }
        }
        Action::Ct(c) => ActionSpec::Ct(Box::new(ct::ct_from_of(c)?)),
        Action::CtClear => ActionSpec::CtClear,
        Action::Clone(list) => ActionSpec::Clone(
            list.iter()
                .map(|a| action_from_of(a, ports))
                .collect::<Result<_, _>>()?,
        ),
        Action::Controller(c) => controller_from_of(c),
        // `clause` is 0-based on the wire, 1-based as written (the decoder checked it).
        Action::Conjunction {
            id,
            clause,
            n_clauses,
        } => ActionSpec::Conjunction {
            id: *id,
            clause: clause + 1,
            n_clauses: *n_clauses,
        },
        _ => return Err(bad_type()),
    })
}

/// Nicira's `controller(...)` as the rule's action (OVS's defaults: reason `action`, no
/// meter, are left out of the rule's text).
fn controller_from_of(c: &ferrovs_openflow::nicira::NxController) -> ActionSpec {
    use ferrovs_openflow::nicira::NX_CTLR_NO_METER;
    let ext = ferrovs_flow::ControllerExt {
        reason: (c.reason != 1).then_some(c.reason),
        controller_id: c.controller_id,
        userdata: c.userdata.clone(),
        pause: c.pause,
        meter_id: (c.meter_id != NX_CTLR_NO_METER).then_some(c.meter_id),
    };
    ActionSpec::Controller {
        max_len: c.max_len,
        ext: (!ext.is_plain()).then(|| Box::new(ext)),
    }
}

/// A `controller(...)` beyond `max_len` on the wire: `NXAST_CONTROLLER2` when it has
/// userdata, pause or a meter, else `NXAST_CONTROLLER` (as OVS's `encode_CONTROLLER`).
fn controller_to_of(max_len: u16, e: &ferrovs_flow::ControllerExt) -> Action {
    use ferrovs_openflow::nicira::{NxController, NX_CTLR_NO_METER};
    Action::Controller(Box::new(NxController {
        max_len,
        controller_id: e.controller_id,
        reason: e.reason.unwrap_or(1),
        userdata: e.userdata.clone(),
        pause: e.pause,
        meter_id: e.meter_id.unwrap_or(NX_CTLR_NO_METER),
        v2: false,
    }))
}

/// The actions and goto of a FLOW_MOD's instructions, as the rule's action list.
pub fn actions_from_of(
    instructions: &[Instruction],
    ports: &PortMap,
) -> Result<Vec<ActionSpec>, OfError> {
    let mut actions = Vec::new();
    let mut goto = None;
    let (mut clear, mut write, mut meta) = (None, None, None);
    let dup = || {
        err(
            et::BAD_INSTRUCTION,
            bic::UNSUP_INST,
            "an instruction given twice",
        )
    };
    for i in instructions {
        match i {
            Instruction::ApplyActions(list) => {
                for a in list {
                    actions.push(action_from_of(a, ports)?);
                }
            }
            Instruction::GotoTable(t) => {
                if *t >= N_TABLES {
                    return Err(err(
                        et::BAD_INSTRUCTION,
                        bic::BAD_TABLE_ID,
                        "goto_table beyond the last table",
                    ));
                }
                goto = Some(*t)
            }
            // Metering comes before every other action (whether the meter exists is the
            // daemon's check: `meters::flow_mod_meter`).
            Instruction::Meter(m) => actions.insert(0, ActionSpec::Meter(*m)),
            Instruction::ClearActions => {
                if clear.replace(ActionSpec::ClearActions).is_some() {
                    return Err(dup());
                }
            }
            Instruction::WriteActions(list) => {
                let mut set = Vec::new();
                for a in list {
                    set.push(action_from_of(a, ports)?);
                }
                if write.replace(ActionSpec::WriteActions(set)).is_some() {
                    return Err(dup());
                }
            }
            Instruction::WriteMetadata { metadata, mask } => {
                let md = ActionSpec::WriteMetadata {
                    value: *metadata,
                    mask: *mask,
                };
                if meta.replace(md).is_some() {
                    return Err(dup());
                }
            }
        }
    }
    // The instructions in the order OpenFlow executes them (and ovs-ofctl prints them).
    actions.extend(clear);
    actions.extend(write);
    actions.extend(meta);
    if let Some(t) = goto {
        actions.push(ActionSpec::GotoTable(t));
    }
    if actions.is_empty() {
        actions.push(ActionSpec::Drop);
    }
    // OVS's ofpacts_verify: conjunction only with conjunctions (NXBAC_BAD_CONJUNCTION).
    ferrovs_flow::check_conjunctions(&actions).map_err(|_| {
        err(
            et::EXPERIMENTER,
            ferrovs_openflow::error::nxbac::BAD_CONJUNCTION,
            "conjunction with actions other than conjunctions",
        )
    })?;
    Ok(actions)
}

/// The `max_len` of each OUTPUT action of a FLOW_MOD's instructions, in order (the
/// rule's [`StoredRule::output_max_len`]); empty when all are 0.
pub fn output_max_lens(instructions: &[Instruction]) -> Vec<u16> {
    let v: Vec<u16> = instructions
        .iter()
        .filter_map(|i| match i {
            Instruction::ApplyActions(list) => Some(list),
            _ => None,
        })
        .flatten()
        .filter_map(|a| match a {
            Action::Output { max_len, .. } => Some(*max_len),
            _ => None,
        })
        .collect();
    if v.iter().all(|&l| l == 0) {
        Vec::new()
    } else {
        v
    }
}

/// A rule's actions as OpenFlow instructions (apply-actions, then goto-table).
pub fn instructions_to_of(spec: &FlowSpec, ports: &PortMap) -> Vec<Instruction> {
    instructions_to_of_with(spec, ports, &[])
}

/// [`instructions_to_of`] with the `max_len` of each OUTPUT action in order (missing: 0).
pub fn instructions_to_of_with(
    spec: &FlowSpec,
    ports: &PortMap,
    max_lens: &[u16],
) -> Vec<Instruction> {
    let (pr, prm) = spec.m.field(Field::IpProto);
    let proto = (prm != 0).then_some(pr as u8);
    let (ty, tym) = spec.m.field(Field::EthType);
    let arp = tym != 0 && ty as u16 == ETH_ARP;
    let mut apply = Vec::new();
    let mut goto = None;
    let mut later = Vec::new();
    let mut n_out = 0usize;
    let mut meter = None;
    for a in &spec.actions {
        match a {
            ActionSpec::ClearActions => {
                later.push(Instruction::ClearActions);
                continue;
            }
            ActionSpec::WriteActions(list) => {
                let set = FlowSpec {
                    actions: list.clone(),
                    ..spec.clone()
                };
                let acts = instructions_to_of(&set, ports)
                    .into_iter()
                    .flat_map(|i| match i {
                        Instruction::ApplyActions(v) => v,
                        _ => Vec::new(),
                    })
                    .collect();
                later.push(Instruction::WriteActions(acts));
                continue;
            }
            ActionSpec::WriteMetadata { value, mask } => {
                later.push(Instruction::WriteMetadata {
                    metadata: *value,
                    mask: *mask,
                });
                continue;
            }
            ActionSpec::Clone(list) => {
                // The nested list as an apply-actions list of its own (the output
                // max_lens of the rule are not carried into it: 0, as OVS writes them).
                let inner = FlowSpec {
                    actions: list.clone(),
                    ..spec.clone()
                };
                let acts = instructions_to_of(&inner, ports)
                    .into_iter()
                    .flat_map(|i| match i {
                        Instruction::ApplyActions(v) => v,
                        _ => Vec::new(),
                    })
                    .collect();
                apply.push(Action::Clone(acts));
                continue;
            }
            _ => {}
        }
        // Each output-like action took one OUTPUT action (and its max_len) on the wire.
        let is_out = matches!(
            a,
            ActionSpec::Output(_)
                | ActionSpec::Mirror(_)
                | ActionSpec::InPort
                | ActionSpec::Normal
                | ActionSpec::Flood
                | ActionSpec::All
        );
        let max_len = if is_out {
            n_out += 1;
            max_lens.get(n_out - 1).copied().unwrap_or(0)
        } else {
            0
        };
        let out = |p: u32| Action::Output { port: p, max_len };
        let set = |f: Of, v: u128| Action::SetField(Oxm::exact(f, v));
        match a {
            ActionSpec::Output(n) | ActionSpec::Mirror(n) => {
                // A port that does not exist (yet) has no number to show.
                if let Some(no) = ports.number(n) {
                    apply.push(out(no));
                }
            }
            ActionSpec::InPort => apply.push(out(OFPP_IN_PORT)),
            ActionSpec::Normal => apply.push(out(OFPP_NORMAL)),
            ActionSpec::Flood => apply.push(out(OFPP_FLOOD)),
            ActionSpec::All => apply.push(out(OFPP_ALL)),
            ActionSpec::Drop => {}
            ActionSpec::SetEcn(e) => apply.push(set(Of::IpEcn, u128::from(*e))),
            ActionSpec::SetField(f, v) => apply.push(match f {
                Field::EthSrc => set(Of::EthSrc, *v),
                Field::EthDst => set(Of::EthDst, *v),
                Field::Ipv4Src if arp => set(Of::ArpSpa, *v),
                Field::Ipv4Dst if arp => set(Of::ArpTpa, *v),
                Field::Ipv4Src => set(Of::Ipv4Src, *v),
                Field::Ipv4Dst => set(Of::Ipv4Dst, *v),
                Field::TpSrc if proto == Some(IP_ICMP) => set(Of::Icmpv4Type, *v),
                Field::TpDst if proto == Some(IP_ICMP) => set(Of::Icmpv4Code, *v),
                Field::TpSrc if proto == Some(IP_ICMPV6) => set(Of::Icmpv6Type, *v),
                Field::TpDst if proto == Some(IP_ICMPV6) => set(Of::Icmpv6Code, *v),
                Field::ArpOp => set(Of::ArpOp, *v),
                Field::ArpSha if arp => set(Of::ArpSha, *v),
                Field::ArpTha if arp => set(Of::ArpTha, *v),
                Field::ArpSha => set(Of::Ipv6NdSll, *v),
                Field::ArpTha => set(Of::Ipv6NdTll, *v),
                Field::NdTarget => set(Of::Ipv6NdTarget, *v),
                Field::Ipv6Flabel => set(Of::Ipv6Flabel, *v),
                Field::Ipv6Src => set(Of::Ipv6Src, *v),
                Field::Ipv6Dst => set(Of::Ipv6Dst, *v),
                Field::IpTos => set(Of::IpDscp, *v >> 2),
                Field::IpTtl => Action::SetNwTtl(*v as u8),
                Field::TpSrc if proto == Some(IP_UDP) => set(Of::UdpSrc, *v),
                Field::TpDst if proto == Some(IP_UDP) => set(Of::UdpDst, *v),
                Field::TpSrc => set(Of::TcpSrc, *v),
                Field::TpDst => set(Of::TcpDst, *v),
                Field::TunDst => set(Of::TunIpv4Dst, *v),
                Field::TunMetadata0 => set(Of::TunMetadata0, *v),
                Field::TunMetadata1 => set(Of::TunMetadata1, *v),
                Field::TunMetadata2 => set(Of::TunMetadata2, *v),
                Field::TunMetadata3 => set(Of::TunMetadata3, *v),
                Field::MplsLabel => set(Of::MplsLabel, *v),
                Field::MplsTc => set(Of::MplsTc, *v),
                Field::MplsTtl => Action::SetMplsTtl(*v as u8),
                // The CLI sets no other field.
                other => {
                    log::warn!("rule rewrites {other:?}, which has no OpenFlow form");
                    continue;
                }
            }),
            ActionSpec::SetVlanVid(v) => {
                apply.push(set(Of::VlanVid, u128::from(*v | OFPVID_PRESENT)))
            }
            ActionSpec::SetVlanPcp(p) => apply.push(set(Of::VlanPcp, u128::from(*p))),
            ActionSpec::PopVlan => apply.push(Action::PopVlan),
            ActionSpec::PushVlan(t) => apply.push(Action::PushVlan(*t)),
            ActionSpec::SetTunnel(id) => apply.push(set(Of::TunnelId, u128::from(*id))),
            ActionSpec::GotoTable(t) => goto = Some(*t),
            ActionSpec::Meter(m) => meter = Some(*m),
            ActionSpec::Controller { max_len, ext: None } => apply.push(Action::Output {
                port: OFPP_CONTROLLER,
                max_len: *max_len,
            }),
            ActionSpec::Controller {
                max_len,
                ext: Some(e),
            } => apply.push(controller_to_of(*max_len, e)),
            ActionSpec::Group(g) => apply.push(Action::Group(*g)),
            ActionSpec::DecTtl => apply.push(Action::DecNwTtl),
            ActionSpec::SetQueue(q) => apply.push(Action::SetQueue(*q)),
            ActionSpec::PushMpls(t) => apply.push(Action::PushMpls(*t)),
            ActionSpec::PopMpls(t) => apply.push(Action::PopMpls(*t)),
            ActionSpec::SetMplsTtl(t) => apply.push(Action::SetMplsTtl(*t)),
            ActionSpec::DecMplsTtl => apply.push(Action::DecMplsTtl),
            ActionSpec::Ct(c) => apply.push(Action::Ct(Box::new(ct::ct_to_of(c)))),
            ActionSpec::CtClear => apply.push(Action::CtClear),
            ActionSpec::Load { .. }
            | ActionSpec::Move { .. }
            | ActionSpec::OutputReg(_)
            | ActionSpec::Resubmit { .. }
            | ActionSpec::StackPush(_)
            | ActionSpec::StackPop(_)
            | ActionSpec::CheckPktLarger { .. } => {
                apply.extend(regs::action_to_of(a, &spec.m, ports).unwrap_or_default())
            }
            ActionSpec::Learn(l) => {
                if let Some(l) = learn::learn_to_of(l, &spec.m) {
                    apply.push(Action::Learn(Box::new(l)));
                }
            }
            ActionSpec::Conjunction {
                id,
                clause,
                n_clauses,
            } => apply.push(Action::Conjunction {
                id: *id,
                clause: clause - 1,
                n_clauses: *n_clauses,
            }),
            ActionSpec::ClearActions
            | ActionSpec::WriteActions(_)
            | ActionSpec::WriteMetadata { .. }
            | ActionSpec::Clone(_) => {}
        }
    }
    let mut v = Vec::new();
    if let Some(m) = meter {
        v.push(Instruction::Meter(m));
    }
    if !apply.is_empty() {
        v.push(Instruction::ApplyActions(apply));
    }
    v.extend(later);
    if let Some(t) = goto {
        v.push(Instruction::GotoTable(t));
    }
    v
}

/// The rule a FLOW_MOD add (or a modify that adds) installs.
pub fn rule_from_flow_mod(fm: &FlowMod, ports: &PortMap) -> Result<FlowSpec, OfError> {
    if fm.table_id >= N_TABLES {
        return Err(err(
            et::FLOW_MOD_FAILED,
            fmfc::BAD_TABLE_ID,
            "table beyond the last table",
        ));
    }
    let (m, in_port) = match_from_of(&fm.match_, ports)?;
    let actions = actions_from_of(&fm.instructions, ports)?;
    transport_rewrites_fit(&fm.instructions, &m)?;
    let spec = FlowSpec {
        table: fm.table_id,
        priority: fm.priority,
        cookie: fm.cookie,
        idle_timeout: fm.idle_timeout,
        hard_timeout: fm.hard_timeout,
        in_port,
        m,
        actions,
    };
    // The rule must be one the CLI syntax holds (saved configuration, handover) and pass
    // its checks (a rewrite needs the match's protocol: OFPBAC_MATCH_INCONSISTENT).
    match ferrovs_flow::parse_flow(&spec.to_string()) {
        Ok(back) if back == spec => Ok(spec),
        Ok(_) => Err(err(
            et::FLOW_MOD_FAILED,
            fmfc::UNKNOWN,
            "the rule has no exact text form",
        )),
        Err(e) => {
            log::debug!("OpenFlow rule {spec} refused: {e}");
            Err(err(
                et::BAD_ACTION,
                bac::MATCH_INCONSISTENT,
                "an action inconsistent with the match",
            ))
        }
    }
}

/// The transport-header rewrites (TCP's, UDP's ports, ICMP's type and code) all become
/// the key's port fields, whose text form cannot tell them apart: each must name the protocol
/// the match pins (OpenFlow's SET_FIELD prerequisites), else `OFPBAC_MATCH_INCONSISTENT`.
fn transport_rewrites_fit(instructions: &[Instruction], m: &Match) -> Result<(), OfError> {
    let (ty, tym) = m.field(Field::EthType);
    let ty = (tym != 0).then_some(ty as u16);
    let (pr, prm) = m.field(Field::IpProto);
    let proto = (prm != 0).then_some(pr as u8);
    let ip = matches!(ty, Some(ETH_IPV4 | ETH_IPV6));
    for i in instructions {
        let list = match i {
            Instruction::ApplyActions(l) | Instruction::WriteActions(l) => l,
            _ => continue,
        };
        for a in list {
            let Action::SetField(o) = a else { continue };
            let ok = match o.field {
                Of::TcpSrc | Of::TcpDst => ip && proto == Some(IP_TCP),
                Of::UdpSrc | Of::UdpDst => ip && proto == Some(IP_UDP),
                Of::Icmpv4Type | Of::Icmpv4Code => ty == Some(ETH_IPV4) && proto == Some(IP_ICMP),
                Of::Icmpv6Type | Of::Icmpv6Code => ty == Some(ETH_IPV6) && proto == Some(IP_ICMPV6),
                _ => true,
            };
            if !ok {
                return Err(err(
                    et::BAD_ACTION,
                    bac::MATCH_INCONSISTENT,
                    "set_field of a transport field the match's protocol does not have",
                ));
            }
        }
    }
    Ok(())
}

/// Which rules a FLOW_MOD modify/delete or a flow-statistics request selects.
#[derive(Debug, Clone)]
pub struct Selector {
    filter: FlowFilter,
    /// Only rules with an output to this port (`None`: any).
    out_port: Option<Option<String>>,
    /// Only rules that send to this group (`None`: any).
    out_group: Option<u32>,
    strict: bool,
}

impl Selector {
    /// From the fields FLOW_MOD and `ofp_flow_stats_request` share.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        table_id: u8,
        priority: Option<u16>,
        cookie: u64,
        cookie_mask: u64,
        out_port: u32,
        out_group: u32,
        m: &ferrovs_openflow::Match,
        strict: bool,
        ports: &PortMap,
    ) -> Result<Selector, OfError> {
        let (mm, in_port) = match m.fields.iter().any(|o| o.field == Of::InPort) {
            // A filter on a port the bridge lacks selects nothing (not an error).
            true if m
                .get(Of::InPort)
                .is_some_and(|o| ports.name(o.value_u128() as u32).is_none()) =>
            {
                let rest = ferrovs_openflow::Match {
                    fields: m
                        .fields
                        .iter()
                        .filter(|o| o.field != Of::InPort)
                        .cloned()
                        .collect(),
                };
                let (mm, _) = match_from_of(&rest, ports)?;
                (mm, Some("\0none".to_string()))
            }
            _ => match_from_of(m, ports)?,
        };
        let out_port = (out_port != OFPP_ANY).then(|| ports.name(out_port).map(str::to_string));
        Ok(Selector {
            filter: FlowFilter {
                table: (table_id != OFPTT_ALL).then_some(table_id),
                priority,
                in_port,
                m: mm,
                cookie: (cookie_mask != 0).then_some((cookie, cookie_mask)),
            },
            out_port,
            out_group: (out_group != OFPG_ANY).then_some(out_group),
            strict,
        })
    }

    /// For a flow-statistics or aggregate request.
    pub fn from_stats_request(r: &FlowStatsRequest, ports: &PortMap) -> Result<Selector, OfError> {
        Selector::new(
            r.table_id,
            None,
            r.cookie,
            r.cookie_mask,
            r.out_port,
            r.out_group,
            &r.match_,
            false,
            ports,
        )
    }

    /// Whether the rule is selected.
    pub fn selects(&self, spec: &FlowSpec) -> bool {
        if let Some(g) = self.out_group {
            if !crate::flows::rule_groups(spec).contains(&g) {
                return false;
            }
        }
        if let Some(p) = &self.out_port {
            let Some(p) = p else { return false };
            let outputs = spec
                .actions
                .iter()
                .any(|a| matches!(a, ActionSpec::Output(n) if n == p));
            if !outputs {
                return false;
            }
        }
        self.filter.selects(spec, self.strict)
    }
}

/// What a FLOW_MOD did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Added,
    Modified(usize),
    Deleted(usize),
}

fn bad_out_group() -> OfError {
    err(
        et::BAD_ACTION,
        bac::BAD_OUT_GROUP,
        "a group action to a group that does not exist",
    )
}

/// A GROUP_MOD's group (add or modify) as the CLI's group. Checks that need the bridge's
/// other groups (existence, chains, loops) are [`apply_group_mod`]'s.
pub fn group_from_of(gm: &GroupMod, ports: &PortMap) -> Result<GroupSpec, OfError> {
    use ferrovs_openflow::message::group as g;
    let gerr = |code, reason| err(et::GROUP_MOD_FAILED, code, reason);
    if gm.group_id > OFPG_MAX {
        return Err(gerr(gmfc::INVALID_GROUP, "a reserved group id"));
    }
    let ty = match gm.type_ {
        g::TYPE_ALL => GroupType::All,
        g::TYPE_SELECT => GroupType::Select,
        g::TYPE_INDIRECT => GroupType::Indirect,
        g::TYPE_FF => GroupType::FastFailover,
        _ => return Err(gerr(gmfc::BAD_TYPE, "an unknown group type")),
    };
    let mut buckets = Vec::with_capacity(gm.buckets.len());
    for b in &gm.buckets {
        let watch_port = match b.watch_port {
            OFPP_ANY => None,
            p => Some(
                ports
                    .name(p)
                    .ok_or(gerr(
                        gmfc::BAD_WATCH,
                        "watch_port is no port of this bridge",
                    ))?
                    .to_string(),
            ),
        };
        let watch_group = (b.watch_group != OFPG_ANY).then_some(b.watch_group);
        if ty == GroupType::FastFailover && watch_port.is_none() && watch_group.is_none() {
            return Err(gerr(
                gmfc::BAD_WATCH,
                "a fast_failover bucket watches neither a port nor a group",
            ));
        }
        if ty != GroupType::Select && b.weight != 0 {
            return Err(gerr(
                gmfc::WEIGHT_UNSUPPORTED,
                "a weight in a bucket of a group that is not select",
            ));
        }
        let mut actions = Vec::with_capacity(b.actions.len());
        for a in &b.actions {
            actions.push(action_from_of(a, ports)?);
        }
        buckets.push(BucketSpec {
            weight: b.weight,
            watch_port,
            watch_group,
            actions,
        });
    }
    if ty == GroupType::Indirect && buckets.len() != 1 {
        return Err(gerr(
            gmfc::INVALID_GROUP,
            "an indirect group has exactly one bucket",
        ));
    }
    let sm = gm
        .selection_method
        .as_ref()
        .filter(|s| !s.method.is_empty());
    let spec = GroupSpec {
        id: gm.group_id,
        ty,
        buckets,
        selection_method: sm.map(|s| s.method.clone()),
        selection_param: sm.map_or(0, |s| s.param),
    };
    if spec.chained().any(|c| c == spec.id) {
        return Err(gerr(gmfc::LOOP, "a bucket sends to its own group"));
    }
    // What OpenFlow installs is saved as text: it must parse back to itself.
    match ferrovs_flow::parse_group(&spec.to_string()) {
        Ok(back) if back == spec => Ok(spec),
        _ => Err(err(
            et::BAD_ACTION,
            bac::BAD_TYPE,
            "a bucket action with no text form",
        )),
    }
}

/// A group as `ofp_group_desc`.
pub fn group_desc(spec: &GroupSpec, ports: &PortMap) -> GroupDesc {
    use ferrovs_openflow::message::group as g;
    let type_ = match spec.ty {
        GroupType::All => g::TYPE_ALL,
        GroupType::Select => g::TYPE_SELECT,
        GroupType::Indirect => g::TYPE_INDIRECT,
        GroupType::FastFailover => g::TYPE_FF,
    };
    let buckets = spec
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let as_rule = FlowSpec {
                table: 0,
                priority: 0,
                cookie: 0,
                idle_timeout: 0,
                hard_timeout: 0,
                in_port: None,
                m: Match::catchall(),
                actions: b.actions.clone(),
            };
            let actions = instructions_to_of(&as_rule, ports)
                .into_iter()
                .flat_map(|i| match i {
                    Instruction::ApplyActions(v) => v,
                    _ => Vec::new(),
                })
                .collect();
            Bucket {
                weight: b.weight,
                watch_port: b
                    .watch_port
                    .as_deref()
                    .and_then(|n| ports.number(n))
                    .unwrap_or(OFPP_ANY),
                watch_group: b.watch_group.unwrap_or(OFPG_ANY),
                // OVS numbers buckets given without ids (OpenFlow 1.3) from 0, and OVN
                // gives them in order from 0: the position is the id.
                bucket_id: i as u32,
                actions,
            }
        })
        .collect();
    GroupDesc {
        type_,
        group_id: spec.id,
        buckets,
        selection_method: spec.selection_method.as_ref().map(|m| {
            ferrovs_openflow::SelectionMethod {
                experimenter: ferrovs_openflow::message::NTR_VENDOR_ID,
                method: m.clone(),
                param: spec.selection_param,
                fields: Vec::new(),
            }
        }),
    }
}

/// Applies a GROUP_MOD to `rules` (all or nothing); deleting a group deletes the rules that
/// send to it (as OVS). Deleting a group that does not exist is no error.
pub fn apply_group_mod(
    rules: &mut BridgeRules,
    gm: &GroupMod,
    ports: &PortMap,
) -> Result<(), OfError> {
    use ferrovs_openflow::message::group as g;
    let gerr = |code, reason| err(et::GROUP_MOD_FAILED, code, reason);
    let map = |e: GroupError| match e {
        GroupError::Exists(_) => gerr(gmfc::GROUP_EXISTS, "the group exists"),
        GroupError::Unknown(_) => gerr(gmfc::UNKNOWN_GROUP, "no such group"),
        GroupError::UnknownChained { .. } => bad_out_group(),
        GroupError::Loop(_) => gerr(gmfc::LOOP, "the group's buckets lead back to it"),
        GroupError::TooDeep { .. } => gerr(gmfc::CHAINING_UNSUPPORTED, "groups chained too deep"),
    };
    match gm.command {
        g::ADD => rules.add_group(group_from_of(gm, ports)?).map_err(map),
        g::MODIFY => {
            if !rules.groups().contains_key(&gm.group_id) {
                return Err(gerr(gmfc::UNKNOWN_GROUP, "no such group"));
            }
            rules.mod_group(group_from_of(gm, ports)?).map_err(map)
        }
        g::DELETE => {
            if gm.group_id == OFPG_ALL {
                rules.del_groups(None);
            } else if gm.group_id <= OFPG_MAX {
                rules.del_groups(Some(gm.group_id));
            }
            Ok(())
        }
        _ => Err(gerr(gmfc::BAD_COMMAND, "an unknown group-mod command")),
    }
}

/// `ofp_group_stats` of every group (`group_id`: one, or `OFPG_ALL`).
pub fn group_stats(rules: &BridgeRules, group_id: u32) -> Vec<OfGroupStats> {
    rules
        .groups()
        .values()
        .filter(|g| group_id == OFPG_ALL || g.spec.id == group_id)
        .map(|g| {
            let d = g.installed.elapsed();
            let refs = rules
                .rules()
                .iter()
                .filter(|r| crate::flows::rule_groups(&r.spec).contains(&g.spec.id))
                .count();
            OfGroupStats {
                group_id: g.spec.id,
                ref_count: refs as u32,
                packet_count: g.stats.group.packets.load(Relaxed),
                byte_count: g.stats.group.bytes.load(Relaxed),
                duration_sec: d.as_secs() as u32,
                duration_nsec: d.subsec_nanos(),
                bucket_stats: g
                    .stats
                    .buckets
                    .iter()
                    .map(|b| Counter {
                        packet_count: b.packets.load(Relaxed),
                        byte_count: b.bytes.load(Relaxed),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// What the group table supports (`ofp_group_features`).
pub fn group_features() -> GroupFeatures {
    // OFPAT_OUTPUT, COPY_TTL_*, ..: the bits of the actions a bucket may hold.
    let acts: u32 = (1 << 0) // output
        | (1 << 17) // push_vlan
        | (1 << 18) // pop_vlan
        | (1 << 21) // set_queue
        | (1 << 22) // group
        | (1 << 23) // set_nw_ttl
        | (1 << 24) // dec_nw_ttl
        | (1 << 25); // set_field
    GroupFeatures {
        types: 0b1111,
        // OFPGFC_SELECT_WEIGHT | SELECT_LIVENESS | CHAINING
        capabilities: 1 | 2 | 4,
        max_groups: [MAX_GROUPS; 4],
        actions: [acts; 4],
    }
}

/// Most groups of each type a bridge has.
pub const MAX_GROUPS: u32 = 65_536;

/// Applies a FLOW_MOD to `rules`: all or nothing.
pub fn apply_flow_mod(
    rules: &mut BridgeRules,
    fm: &FlowMod,
    ports: &PortMap,
) -> Result<Applied, OfError> {
    if fm.buffer_id != OFP_NO_BUFFER {
        return Err(err(
            et::BAD_REQUEST,
            brc::BUFFER_UNKNOWN,
            "the switch buffers no packets",
        ));
    }
    // SEND_FLOW_REM is the daemon's to keep (it sends the FLOW_REMOVED, `daemon/packet_io`).
    match fm.command {
        fc::ADD => {
            let spec = rule_from_flow_mod(fm, ports)?;
            if rules.missing_group(&spec).is_some() {
                return Err(bad_out_group());
            }
            if fm.flags & ff::CHECK_OVERLAP != 0 && overlaps(rules, &spec) {
                return Err(err(
                    et::FLOW_MOD_FAILED,
                    fmfc::OVERLAP,
                    "overlaps a rule of the same priority",
                ));
            }
            let lens = output_max_lens(&fm.instructions);
            rules.add(vec![spec.clone()]);
            if !lens.is_empty() {
                rules.set_output_max_len(&spec, lens);
            }
            Ok(Applied::Added)
        }
        fc::MODIFY | fc::MODIFY_STRICT => {
            let strict = fm.command == fc::MODIFY_STRICT;
            let spec = rule_from_flow_mod(fm, ports)?;
            if rules.missing_group(&spec).is_some() {
                return Err(bad_out_group());
            }
            let sel = Selector::new(
                fm.table_id,
                strict.then_some(fm.priority),
                fm.cookie,
                fm.cookie_mask,
                OFPP_ANY,
                OFPG_ANY,
                &fm.match_,
                strict,
                ports,
            )?;
            // The new actions must be valid for each rule's own match (a rewrite needs
            // the protocol): check all before changing any.
            let mut hits = Vec::new();
            for (i, r) in rules.rules().iter().enumerate() {
                if sel.selects(&r.spec) {
                    let mut s = r.spec.clone();
                    s.actions = spec.actions.clone();
                    if ferrovs_flow::parse_flow(&s.to_string()).ok() != Some(s.clone()) {
                        return Err(err(
                            et::BAD_ACTION,
                            bac::MATCH_INCONSISTENT,
                            "an action inconsistent with a selected rule's match",
                        ));
                    }
                    hits.push(i);
                }
            }
            let reset = fm.flags & ff::RESET_COUNTS != 0;
            let lens = output_max_lens(&fm.instructions);
            let all = rules.rules_mut();
            for &i in &hits {
                all[i].spec.actions = spec.actions.clone();
                all[i].output_max_len = lens.clone();
                if reset {
                    all[i].stats = Arc::new(RuleStats::default());
                    all[i].installed = Instant::now();
                }
            }
            Ok(Applied::Modified(hits.len()))
        }
        fc::DELETE | fc::DELETE_STRICT => {
            let strict = fm.command == fc::DELETE_STRICT;
            let sel = Selector::new(
                fm.table_id,
                strict.then_some(fm.priority),
                fm.cookie,
                fm.cookie_mask,
                fm.out_port,
                fm.out_group,
                &fm.match_,
                strict,
                ports,
            )?;
            let all = rules.rules_mut();
            let before = all.len();
            all.retain(|r| !sel.selects(&r.spec));
            Ok(Applied::Deleted(before - all.len()))
        }
        _ => Err(err(
            et::FLOW_MOD_FAILED,
            fmfc::BAD_COMMAND,
            "unknown flow-mod command",
        )),
    }
}

/// Whether a packet could match both `spec` and a rule of the same table and priority.
fn overlaps(rules: &BridgeRules, spec: &FlowSpec) -> bool {
    rules.rules().iter().any(|r| {
        let s = &r.spec;
        if s.table != spec.table || s.priority != spec.priority {
            return false;
        }
        if s.in_port.is_some() && spec.in_port.is_some() && s.in_port != spec.in_port {
            return false;
        }
        if s.m.conj_id.is_some() && spec.m.conj_id.is_some() && s.m.conj_id != spec.m.conj_id {
            return false;
        }
        // Both care about a bit and disagree on it: disjoint.
        s.m.mask
            .0
            .iter()
            .zip(&spec.m.mask.0)
            .zip(s.m.key.0.iter().zip(&spec.m.key.0))
            .all(|((ma, mb), (ka, kb))| (ka ^ kb) & ma & mb == 0)
    })
}

/// A rule as an `ofp_flow_stats` entry (counters as of now).
pub fn flow_stats(r: &StoredRule, ports: &PortMap) -> FlowStats {
    use std::sync::atomic::Ordering::Relaxed;
    let d = r.installed.elapsed();
    let s = &r.spec;
    FlowStats {
        table_id: s.table,
        duration_sec: d.as_secs() as u32,
        duration_nsec: d.subsec_nanos(),
        priority: s.priority,
        idle_timeout: s.idle_timeout,
        hard_timeout: s.hard_timeout,
        flags: 0,
        cookie: s.cookie,
        packet_count: r.stats.packets.load(Relaxed),
        byte_count: r.stats.bytes.load(Relaxed),
        match_: match_to_of(&s.m, s.in_port.as_deref(), ports),
        instructions: instructions_to_of_with(s, ports, &r.output_max_len),
    }
}

/// The sums of an aggregate request over the selected rules.
pub fn aggregate(rules: &BridgeRules, sel: &Selector) -> AggregateStats {
    use std::sync::atomic::Ordering::Relaxed;
    let mut a = AggregateStats::default();
    for r in rules.rules().iter().filter(|r| sel.selects(&r.spec)) {
        a.packet_count += r.stats.packets.load(Relaxed);
        a.byte_count += r.stats.bytes.load(Relaxed);
        a.flow_count += 1;
    }
    a
}

pub mod ct;
#[cfg(test)]
mod ct_tests;
pub mod learn;
pub mod meters;
pub mod regs;
#[cfg(test)]
mod tests;
