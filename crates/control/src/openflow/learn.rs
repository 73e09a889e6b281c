//! `learn(...)`: Nicira's `NXAST_LEARN`/`LEARN2` ([`NxLearn`]) ⇄ the rule's
//! [`ActionSpec::Learn`] ([`LearnSpec`]).
//!
//! Fields go through [`super::regs`]'s maps (an OpenFlow field is a key field with its
//! wire width). A source field is named as the learning rule's protocol calls it, a
//! destination as the constants matched before it in the list call it (OVS's
//! `learn_check` builds the same match), so a rule prints back as OVS prints it.

use ferrovs_flow::key::SubField;
use ferrovs_flow::learn::{LearnDst, LearnItem, LearnSpec, LearnSrc};
use ferrovs_flow::{ActionSpec, Match};
use ferrovs_openflow::error::{bac, et};
use ferrovs_openflow::learn::{LearnDst as OfDst, LearnSpecItem, LearnSrc as OfSrc, NxLearn};
use ferrovs_openflow::oxm::Field as Of;
use ferrovs_openflow::OfError;

use super::regs::{key_to_of, subfield};

const fn err(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::BAD_ACTION, code, reason)
}

/// The rule's `learn` of a decoded one.
pub fn learn_from_of(l: &NxLearn) -> Result<ActionSpec, OfError> {
    let mut items = Vec::with_capacity(l.specs.len());
    if l.specs.len() > ferrovs_flow::learn::MAX_ITEMS {
        return Err(err(bac::BAD_ARGUMENT, "learn: too many flow_mod_specs"));
    }
    for s in &l.specs {
        let src = match &s.src {
            OfSrc::Field { field, ofs } => LearnSrc::Field(subfield(*field, *ofs, s.n_bits)?),
            OfSrc::Imm(b) => {
                if b.len() > 16 {
                    return Err(err(
                        bac::BAD_SET_LEN,
                        "learn: an immediate wider than 128 bits",
                    ));
                }
                let v = b.iter().fold(0u128, |v, &x| (v << 8) | u128::from(x));
                let ones = if s.n_bits >= 128 {
                    u128::MAX
                } else {
                    (1u128 << s.n_bits) - 1
                };
                LearnSrc::Imm(v & ones)
            }
        };
        let dst = match s.dst {
            OfDst::Match { field, ofs } => LearnDst::Match(subfield(field, ofs, s.n_bits)?),
            OfDst::Load { field, ofs } => LearnDst::Load(subfield(field, ofs, s.n_bits)?),
            OfDst::Output => {
                if s.n_bits > 32 {
                    return Err(err(bac::BAD_ARGUMENT, "learn: output of more than 32 bits"));
                }
                LearnDst::Output
            }
        };
        items.push(LearnItem { src, dst });
    }
    Ok(ActionSpec::Learn(Box::new(LearnSpec {
        table: l.table_id,
        idle_timeout: l.idle_timeout,
        hard_timeout: l.hard_timeout,
        fin_idle_timeout: l.fin_idle_timeout,
        fin_hard_timeout: l.fin_hard_timeout,
        priority: l.priority,
        cookie: l.cookie,
        flags: l.flags,
        limit: l.limit,
        items,
    })))
}

/// The header OVS writes for a field in a learn spec: the NXM one where the field has one
/// (OVS's `nxm_header_from_mff` takes the earliest: `NXM_OF_IP_SRC`, not
/// `OXM_OF_IPV4_SRC`), else the OXM one (`OXM_OF_METADATA`).
fn nxm_form(f: Of) -> Of {
    match f {
        Of::EthDst => Of::NxmEthDst,
        Of::EthSrc => Of::NxmEthSrc,
        Of::EthType => Of::NxmEthType,
        Of::IpProto => Of::NxmIpProto,
        Of::Ipv4Src => Of::NxmIpSrc,
        Of::Ipv4Dst => Of::NxmIpDst,
        Of::TcpSrc => Of::NxmTcpSrc,
        Of::TcpDst => Of::NxmTcpDst,
        Of::UdpSrc => Of::NxmUdpSrc,
        Of::UdpDst => Of::NxmUdpDst,
        Of::Icmpv4Type => Of::NxmIcmpType,
        Of::Icmpv4Code => Of::NxmIcmpCode,
        Of::ArpOp => Of::NxmArpOp,
        Of::ArpSpa => Of::NxmArpSpa,
        Of::ArpTpa => Of::NxmArpTpa,
        Of::ArpSha => Of::NxArpSha,
        Of::ArpTha => Of::NxArpTha,
        Of::Ipv6Src => Of::NxIpv6Src,
        Of::Ipv6Dst => Of::NxIpv6Dst,
        Of::Ipv6Flabel => Of::NxIpv6Label,
        Of::Ipv6NdTarget => Of::NxNdTarget,
        Of::Ipv6NdSll => Of::NxNdSll,
        Of::Ipv6NdTll => Of::NxNdTll,
        Of::Icmpv6Type => Of::NxIcmpv6Type,
        Of::Icmpv6Code => Of::NxIcmpv6Code,
        Of::TunnelId => Of::NxTunId,
        f => f,
    }
}

/// The `NXAST_LEARN` of a rule's `learn` in a rule with match `m` (`None` when a field has
/// no OpenFlow form, which the parser does not let in).
pub fn learn_to_of(l: &LearnSpec, m: &Match) -> Option<NxLearn> {
    let of = |sf: &SubField, m: &Match| {
        key_to_of(sf.field, u32::from(sf.ofs) + u32::from(sf.nbits), m)
            .map(|f| (nxm_form(f), sf.ofs))
    };
    let mut dst_m = Match::catchall();
    let mut specs = Vec::with_capacity(l.items.len());
    for it in &l.items {
        let n_bits = it.nbits();
        let src = match it.src {
            LearnSrc::Field(s) => {
                let (field, ofs) = of(&s, m)?;
                OfSrc::Field { field, ofs }
            }
            LearnSrc::Imm(v) => {
                let n = usize::from(n_bits).div_ceil(8);
                OfSrc::Imm(v.to_be_bytes()[16 - n..].to_vec())
            }
        };
        let dst = match it.dst {
            LearnDst::Match(d) => {
                let (field, ofs) = of(&d, &dst_m)?;
                if let LearnSrc::Imm(v) = it.src {
                    dst_m.set(d.field, v << d.ofs, d.mask());
                }
                OfDst::Match { field, ofs }
            }
            LearnDst::Load(d) => {
                let (field, ofs) = of(&d, &dst_m)?;
                OfDst::Load { field, ofs }
            }
            LearnDst::Output => OfDst::Output,
        };
        specs.push(LearnSpecItem { n_bits, src, dst });
    }
    Some(NxLearn {
        idle_timeout: l.idle_timeout,
        hard_timeout: l.hard_timeout,
        priority: l.priority,
        cookie: l.cookie,
        flags: l.flags,
        table_id: l.table,
        fin_idle_timeout: l.fin_idle_timeout,
        fin_hard_timeout: l.fin_hard_timeout,
        limit: l.limit,
        v2: l.limit != 0,
        specs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_flow::parse_flow;

    /// OVN 23.03's hairpin learning, as ovs-ofctl prints it.
    const HAIRPIN: &str = "table=68,priority=100,ct_mark=0x2/0x2,tcp,nw_src=10.0.2.21,nw_dst=10.0.2.21,tp_dst=8080 actions=load:0x1->NXM_NX_REG10[7],learn(table=69,delete_learned,cookie=0x5e3b7d9e,OXM_OF_METADATA[],eth_type=0x800,NXM_OF_IP_SRC[],ip_dst=10.0.0.100,nw_proto=6,NXM_OF_TCP_SRC[]=NXM_OF_TCP_DST[],load:0x1->NXM_NX_REG10[7])";

    #[test]
    fn ovns_hairpin_learn_goes_to_openflow_and_back_with_ovss_headers() {
        let f = parse_flow(HAIRPIN).unwrap();
        let ActionSpec::Learn(l) = &f.actions[1] else {
            panic!("{:?}", f.actions)
        };
        let of = learn_to_of(l, &f.m).unwrap();
        assert_eq!(
            (of.table_id, of.flags, of.cookie, of.v2),
            (69, 2, 0x5e3b_7d9e, false)
        );
        let fields: Vec<(u16, Option<Of>, Option<Of>)> = of
            .specs
            .iter()
            .map(|s| {
                let src = match s.src {
                    OfSrc::Field { field, .. } => Some(field),
                    OfSrc::Imm(_) => None,
                };
                let dst = match s.dst {
                    OfDst::Match { field, .. } | OfDst::Load { field, .. } => Some(field),
                    OfDst::Output => None,
                };
                (s.n_bits, src, dst)
            })
            .collect();
        assert_eq!(
            fields,
            vec![
                (64, Some(Of::Metadata), Some(Of::Metadata)),
                (16, None, Some(Of::NxmEthType)),
                (32, Some(Of::NxmIpSrc), Some(Of::NxmIpSrc)),
                (32, None, Some(Of::NxmIpDst)),
                (8, None, Some(Of::NxmIpProto)),
                (16, Some(Of::NxmTcpDst), Some(Of::NxmTcpSrc)),
                (1, None, Some(Of::REGS[10])),
            ]
        );
        assert_eq!(of.specs[3].src, OfSrc::Imm(vec![10, 0, 0, 100]));
        assert_eq!(learn_from_of(&of).unwrap(), f.actions[1]);
    }
}
