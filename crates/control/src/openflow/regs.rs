//! Registers and the actions that read and write fields (Nicira's `reg_load`, `reg_load2`,
//! `reg_move`, `resubmit`, `output_reg`, OpenFlow 1.5's `copy_field` and masked
//! `set_field`) ⇄ the rule's [`ActionSpec::Load`], [`ActionSpec::Move`],
//! [`ActionSpec::Resubmit`], [`ActionSpec::OutputReg`].
//!
//! An OpenFlow field names a key field with its wire width ([`of_to_key`]): a register is
//! its register, `NXM_OF_IN_PORT` the key's in_port (16 bits of it), ICMP's type the low 8
//! bits of the transport source port. Bits beyond the key field (ct_state's upper 24) are
//! `OFPBAC_BAD_SET_LEN`; a field the key lacks `OFPBAC_BAD_SET_TYPE`. Whether a rule may write
//! a field, and the prerequisites, are the rule syntax's checks (every rule from OpenFlow
//! prints and parses back, `rule_from_flow_mod`). A rule's loads go back out as OVS writes
//! them in OpenFlow 1.3: a `NXAST_REG_LOAD` per run of bits (64 at most each), a move as
//! `NXAST_REG_MOVE`, `output:reg` as `NXAST_OUTPUT_REG`.

use ferrovs_flow::key::{
    SubField, ETH_ARP, ETH_IPV4, ETH_IPV6, IP_ICMP, IP_ICMPV6, IP_SCTP, IP_UDP,
};
use ferrovs_flow::{ActionSpec, Field, Match};
use ferrovs_openflow::error::{bac, et};
use ferrovs_openflow::nicira::{NxCheckPktLarger, NxMove, NxOutputReg, NxStack};
use ferrovs_openflow::oxm::Field as Of;
use ferrovs_openflow::port::OFPP_IN_PORT;
use ferrovs_openflow::{Action, OfError, Oxm};

use super::{PortMap, N_TABLES};

const fn err(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::BAD_ACTION, code, reason)
}

/// The key field an OpenFlow field is (`None`: the key has no such field).
pub fn of_to_key(f: Of) -> Option<Field> {
    if let Some(i) = Of::REGS.iter().position(|&r| r == f) {
        return Some(Field::REGS[i]);
    }
    if let Some(i) = Of::XREGS.iter().position(|&r| r == f) {
        return Some(Field::XREGS[i]);
    }
    if let Some(i) = Of::XXREGS.iter().position(|&r| r == f) {
        return Some(Field::XXREGS[i]);
    }
    Some(match f {
        Of::InPort | Of::NxmInPort => Field::InPort,
        Of::Metadata => Field::Metadata,
        Of::EthDst | Of::NxmEthDst => Field::EthDst,
        Of::EthSrc | Of::NxmEthSrc => Field::EthSrc,
        Of::EthType | Of::NxmEthType => Field::EthType,
        Of::IpProto | Of::NxmIpProto => Field::IpProto,
        Of::NxIpTtl => Field::IpTtl,
        Of::Ipv4Src | Of::ArpSpa | Of::NxmIpSrc | Of::NxmArpSpa => Field::Ipv4Src,
        Of::Ipv4Dst | Of::ArpTpa | Of::NxmIpDst | Of::NxmArpTpa => Field::Ipv4Dst,
        Of::TcpSrc
        | Of::UdpSrc
        | Of::SctpSrc
        | Of::Icmpv4Type
        | Of::Icmpv6Type
        | Of::NxmTcpSrc
        | Of::NxmUdpSrc
        | Of::NxmIcmpType
        | Of::NxIcmpv6Type => Field::TpSrc,
        Of::TcpDst
        | Of::UdpDst
        | Of::SctpDst
        | Of::Icmpv4Code
        | Of::Icmpv6Code
        | Of::NxmTcpDst
        | Of::NxmUdpDst
        | Of::NxmIcmpCode
        | Of::NxIcmpv6Code => Field::TpDst,
        Of::ArpOp | Of::NxmArpOp => Field::ArpOp,
        Of::ArpSha | Of::Ipv6NdSll | Of::NxArpSha | Of::NxNdSll => Field::ArpSha,
        Of::ArpTha | Of::Ipv6NdTll | Of::NxArpTha | Of::NxNdTll => Field::ArpTha,
        Of::Ipv6Src | Of::NxIpv6Src => Field::Ipv6Src,
        Of::Ipv6Dst | Of::NxIpv6Dst => Field::Ipv6Dst,
        Of::Ipv6Flabel | Of::NxIpv6Label => Field::Ipv6Flabel,
        Of::Ipv6NdTarget | Of::NxNdTarget => Field::NdTarget,
        Of::TunnelId | Of::NxTunId => Field::TunId,
        Of::TunIpv4Src => Field::TunSrc,
        Of::TunIpv4Dst => Field::TunDst,
        Of::TunMetadata0 => Field::TunMetadata0,
        Of::TunMetadata1 => Field::TunMetadata1,
        Of::TunMetadata2 => Field::TunMetadata2,
        Of::TunMetadata3 => Field::TunMetadata3,
        Of::CtMark => Field::CtMark,
        Of::CtLabel => Field::CtLabel,
        Of::CtZone => Field::CtZone,
        Of::CtState => Field::CtState,
        _ => return None,
    })
}

/// The OpenFlow field OVS writes in OpenFlow 1.3 for bits ending at `end` of key field `f`
/// in a rule with match `m` (the protocol picks among ARP/IP, TCP/UDP/SCTP/ICMP names).
pub fn key_to_of(f: Field, end: u32, m: &Match) -> Option<Of> {
    if let Some(i) = Field::REGS.iter().position(|&r| r == f) {
        return Some(Of::REGS[i]);
    }
    if let Some(i) = Field::XREGS.iter().position(|&r| r == f) {
        return Some(Of::XREGS[i]);
    }
    if let Some(i) = Field::XXREGS.iter().position(|&r| r == f) {
        return Some(Of::XXREGS[i]);
    }
    let (ty, tym) = m.field(Field::EthType);
    let ty = (tym != 0).then_some(ty as u16);
    let (pr, prm) = m.field(Field::IpProto);
    let proto = (prm != 0).then_some(pr as u8);
    let arp = ty == Some(ETH_ARP);
    Some(match f {
        Field::InPort if end <= 16 => Of::NxmInPort,
        Field::InPort => Of::InPort,
        Field::Metadata => Of::Metadata,
        Field::EthDst => Of::EthDst,
        Field::EthSrc => Of::EthSrc,
        Field::EthType => Of::EthType,
        Field::IpProto => Of::IpProto,
        Field::IpTtl => Of::NxIpTtl,
        Field::Ipv4Src if arp => Of::ArpSpa,
        Field::Ipv4Dst if arp => Of::ArpTpa,
        Field::Ipv4Src => Of::Ipv4Src,
        Field::Ipv4Dst => Of::Ipv4Dst,
        Field::TpSrc | Field::TpDst => {
            let src = f == Field::TpSrc;
            match (ty, proto) {
                (Some(ETH_IPV4), Some(IP_ICMP)) if end <= 8 => {
                    if src {
                        Of::Icmpv4Type
                    } else {
                        Of::Icmpv4Code
                    }
                }
                (Some(ETH_IPV6), Some(IP_ICMPV6)) if end <= 8 => {
                    if src {
                        Of::Icmpv6Type
                    } else {
                        Of::Icmpv6Code
                    }
                }
                (_, Some(IP_UDP)) => {
                    if src {
                        Of::UdpSrc
                    } else {
                        Of::UdpDst
                    }
                }
                (_, Some(IP_SCTP)) => {
                    if src {
                        Of::SctpSrc
                    } else {
                        Of::SctpDst
                    }
                }
                _ => {
                    if src {
                        Of::TcpSrc
                    } else {
                        Of::TcpDst
                    }
                }
            }
        }
        Field::ArpOp => Of::ArpOp,
        Field::ArpSha if ty == Some(ETH_IPV6) => Of::Ipv6NdSll,
        Field::ArpTha if ty == Some(ETH_IPV6) => Of::Ipv6NdTll,
        Field::ArpSha => Of::ArpSha,
        Field::ArpTha => Of::ArpTha,
        Field::Ipv6Src => Of::Ipv6Src,
        Field::Ipv6Dst => Of::Ipv6Dst,
        Field::Ipv6Flabel => Of::Ipv6Flabel,
        Field::NdTarget => Of::Ipv6NdTarget,
        Field::TunId => Of::TunnelId,
        Field::TunSrc => Of::TunIpv4Src,
        Field::TunDst => Of::TunIpv4Dst,
        Field::TunMetadata0 => Of::TunMetadata0,
        Field::TunMetadata1 => Of::TunMetadata1,
        Field::TunMetadata2 => Of::TunMetadata2,
        Field::TunMetadata3 => Of::TunMetadata3,
        Field::CtMark => Of::CtMark,
        Field::CtLabel => Of::CtLabel,
        Field::CtZone => Of::CtZone,
        Field::CtState => Of::CtState,
        _ => return None,
    })
}

/// The subfield of key field of OpenFlow field `f`, bits `ofs..ofs + nbits`.
pub fn subfield(f: Of, ofs: u16, nbits: u16) -> Result<SubField, OfError> {
    let k = of_to_key(f).ok_or(err(bac::BAD_SET_TYPE, "a field the pipeline does not have"))?;
    SubField::new(k, ofs, nbits).ok_or(err(
        bac::BAD_SET_LEN,
        "bits beyond what the pipeline keeps of the field",
    ))
}

/// Whether `f` is written with a plain load (a register, metadata, in_port): OpenFlow's
/// SET_FIELD of them becomes [`ActionSpec::Load`].
pub fn is_internal(f: Of) -> bool {
    Of::REGS.contains(&f)
        || Of::XREGS.contains(&f)
        || Of::XXREGS.contains(&f)
        || matches!(f, Of::Metadata | Of::NxmInPort)
}

/// A SET_FIELD (maybe masked, OpenFlow 1.5) or REG_LOAD2 of `o` as a load.
pub fn load_from_oxm(o: &Oxm) -> Result<ActionSpec, OfError> {
    let k = of_to_key(o.field).ok_or(err(
        bac::BAD_SET_TYPE,
        "set_field of a field the pipeline does not have",
    ))?;
    let width = u32::from(o.field.info().len) * 8;
    let full = if width >= 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    let mask = o.mask_u128() & full;
    if mask & !k.full() != 0 {
        return Err(err(
            bac::BAD_SET_LEN,
            "set_field of bits the pipeline does not keep",
        ));
    }
    Ok(ActionSpec::Load {
        field: k,
        value: o.value_u128() & mask,
        mask,
    })
}

/// The rule's action of a decoded register action (`None`: not one of them).
pub fn action_from_of(a: &Action, ports: &PortMap) -> Result<Option<ActionSpec>, OfError> {
    Ok(Some(match a {
        Action::RegLoad {
            field,
            ofs,
            nbits,
            value,
        } => {
            let sf = subfield(*field, *ofs, *nbits)?;
            ActionSpec::Load {
                field: sf.field,
                value: u128::from(*value) << sf.ofs,
                mask: sf.mask(),
            }
        }
        Action::RegLoad2(o) => load_from_oxm(o)?,
        Action::SetField(o) if is_internal(o.field) || o.mask.is_some() => load_from_oxm(o)?,
        Action::RegMove(m) | Action::CopyField(m) => ActionSpec::Move {
            src: subfield(m.src, m.src_ofs, m.nbits)?,
            dst: subfield(m.dst, m.dst_ofs, m.nbits)?,
        },
        Action::OutputReg(o) => ActionSpec::OutputReg(subfield(o.src, o.ofs, o.nbits)?),
        Action::StackPush(s) => ActionSpec::StackPush(subfield(s.field, s.ofs, s.nbits)?),
        Action::StackPop(s) => ActionSpec::StackPop(subfield(s.field, s.ofs, s.nbits)?),
        Action::CheckPktLarger(c) => ActionSpec::CheckPktLarger {
            len: c.pkt_len,
            dst: subfield(c.dst, c.ofs, 1)?,
        },
        Action::Resubmit { port, table } => {
            let port = match *port {
                OFPP_IN_PORT => None,
                p => Some(
                    ports
                        .name_or_number(p)
                        .ok_or(err(bac::BAD_OUT_PORT, "resubmit as from a reserved port"))?,
                ),
            };
            let table = match *table {
                None | Some(0xff) => None,
                Some(t) if t >= N_TABLES => {
                    return Err(err(bac::BAD_ARGUMENT, "resubmit beyond the last table"))
                }
                Some(t) => Some(t),
            };
            if port.is_none() && table.is_none() {
                return Err(err(
                    bac::BAD_ARGUMENT,
                    "resubmit to the current table as the same port (a loop)",
                ));
            }
            ActionSpec::Resubmit { port, table }
        }
        _ => return Ok(None),
    }))
}

/// One `NXAST_REG_LOAD` per run of set bits of `mask` (at most 64 bits each), loading the
/// bits of `value` under it into `field`.
pub(super) fn reg_loads(field: Of, value: u128, mask: u128, out: &mut Vec<Action>) {
    let end = 128 - mask.leading_zeros();
    let mut bit = mask.trailing_zeros().min(end);
    while bit < end {
        if (mask >> bit) & 1 == 0 {
            bit += 1;
            continue;
        }
        let mut e = bit;
        while e < end && e - bit < 64 && (mask >> e) & 1 == 1 {
            e += 1;
        }
        let nbits = e - bit;
        let ones = if nbits >= 64 {
            u128::from(u64::MAX)
        } else {
            (1u128 << nbits) - 1
        };
        out.push(Action::RegLoad {
            field,
            ofs: bit as u16,
            nbits: nbits as u16,
            value: ((value >> bit) & ones) as u64,
        });
        bit = e;
    }
}

/// The OpenFlow 1.3 actions of a rule's register action (`None`: not one of them; an
/// empty list: a port or field with no OpenFlow form, logged).
pub fn action_to_of(a: &ActionSpec, m: &Match, ports: &PortMap) -> Option<Vec<Action>> {
    let of = |sf: &SubField| key_to_of(sf.field, u32::from(sf.ofs) + u32::from(sf.nbits), m);
    Some(match a {
        ActionSpec::Load { field, value, mask } => {
            let ofs = mask.trailing_zeros();
            let end = 128 - mask.leading_zeros();
            let Some(f) = key_to_of(*field, end, m) else {
                log::warn!("rule loads {field:?}, which has no OpenFlow form");
                return Some(Vec::new());
            };
            // A whole field wider than a REG_LOAD's 64 bits (an xxreg): one SET_FIELD, as
            // ovs-ofctl writes it.
            if end - ofs > 64 && *mask == field.full() {
                return Some(vec![Action::SetField(Oxm::exact(f, *value))]);
            }
            let mut out = Vec::new();
            reg_loads(f, *value, *mask, &mut out);
            out
        }
        ActionSpec::Move { src, dst } => match (of(src), of(dst)) {
            (Some(s), Some(d)) => vec![Action::RegMove(NxMove {
                src: s,
                src_ofs: src.ofs,
                dst: d,
                dst_ofs: dst.ofs,
                nbits: src.nbits,
            })],
            _ => Vec::new(),
        },
        ActionSpec::StackPush(sf) | ActionSpec::StackPop(sf) => match of(sf) {
            Some(f) => {
                let st = NxStack {
                    field: f,
                    ofs: sf.ofs,
                    nbits: sf.nbits,
                };
                vec![if matches!(a, ActionSpec::StackPush(_)) {
                    Action::StackPush(st)
                } else {
                    Action::StackPop(st)
                }]
            }
            None => Vec::new(),
        },
        ActionSpec::CheckPktLarger { len, dst } => match of(dst) {
            Some(f) => vec![Action::CheckPktLarger(NxCheckPktLarger {
                pkt_len: *len,
                dst: f,
                ofs: dst.ofs,
            })],
            None => Vec::new(),
        },
        ActionSpec::OutputReg(src) => match of(src) {
            Some(s) => vec![Action::OutputReg(NxOutputReg {
                src: s,
                ofs: src.ofs,
                nbits: src.nbits,
                max_len: u16::MAX,
                v2: false,
            })],
            None => Vec::new(),
        },
        ActionSpec::Resubmit { port, table } => {
            let port = match port {
                None => OFPP_IN_PORT,
                Some(n) => match ports.number(n) {
                    Some(no) => no,
                    // A port that does not exist (yet) has no number to show.
                    None => return Some(Vec::new()),
                },
            };
            // NXAST_RESUBMIT_TABLE, 0xff for the current table, as ovs-ofctl writes even
            // `resubmit:PORT`.
            vec![Action::Resubmit {
                port,
                table: Some(table.unwrap_or(0xff)),
            }]
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_register_maps_both_ways() {
        let m = Match::catchall();
        for (i, r) in Of::REGS.iter().enumerate() {
            assert_eq!(of_to_key(*r), Some(Field::REGS[i]));
            assert_eq!(key_to_of(Field::REGS[i], 32, &m), Some(*r));
        }
        for (i, r) in Of::XXREGS.iter().enumerate() {
            assert_eq!(of_to_key(*r), Some(Field::XXREGS[i]));
            assert_eq!(key_to_of(Field::XXREGS[i], 128, &m), Some(*r));
        }
        assert_eq!(key_to_of(Field::InPort, 16, &m), Some(Of::NxmInPort));
        assert_eq!(key_to_of(Field::InPort, 17, &m), Some(Of::InPort));
        let mut icmp = Match::catchall();
        icmp.set(Field::EthType, u128::from(ETH_IPV4), 0xffff);
        icmp.set(Field::IpProto, u128::from(IP_ICMP), 0xff);
        assert_eq!(key_to_of(Field::TpSrc, 8, &icmp), Some(Of::Icmpv4Type));
        // ct_state's upper bits are not in the key.
        assert!(subfield(Of::CtState, 8, 8).is_err());
        assert!(subfield(Of::PbbIsid, 0, 8).is_err());
    }
}

#[cfg(test)]
mod flow_mod_tests {
    //! FLOW_MODs of OVN's shape ⇄ the CLI's rules, through `rule_from_flow_mod` (which
    //! checks every rule prints and parses back) and the instructions flow stats echo.
    use super::*;
    use crate::openflow::rule_from_flow_mod;
    use crate::openflow::{actions_from_of, instructions_to_of, match_from_of, match_to_of};
    use ferrovs_openflow::action::{Instruction, OFPG_ANY};
    use ferrovs_openflow::message::{fc, FlowMod, OFP_NO_BUFFER};
    use ferrovs_openflow::nicira::{CtZoneSrc, NxCt};
    use ferrovs_openflow::port::OFPP_ANY;
    use ferrovs_openflow::Match as OfMatch;

    fn ports() -> PortMap {
        PortMap::new("br0", [(1, "vm1"), (2, "vm2")])
    }

    fn fm(table: u8, m: Vec<Oxm>, apply: Vec<Action>) -> FlowMod {
        FlowMod {
            cookie: 0,
            cookie_mask: 0,
            table_id: table,
            command: fc::ADD,
            idle_timeout: 0,
            hard_timeout: 0,
            priority: 100,
            buffer_id: OFP_NO_BUFFER,
            out_port: OFPP_ANY,
            out_group: OFPG_ANY,
            flags: 0,
            importance: 0,
            match_: OfMatch { fields: m },
            instructions: vec![Instruction::ApplyActions(apply)],
        }
    }

    fn load(field: Of, ofs: u16, nbits: u16, value: u64) -> Action {
        Action::RegLoad {
            field,
            ofs,
            nbits,
            value,
        }
    }

    /// The rule is the CLI's; its matches and actions go back out to the same rule.
    fn same_as_cli(f: &FlowMod, cli: &str) -> ferrovs_flow::FlowSpec {
        let spec = rule_from_flow_mod(f, &ports()).unwrap_or_else(|e| panic!("{cli}: {e}"));
        assert_eq!(spec, ferrovs_flow::parse_flow(cli).unwrap(), "{spec}");
        let back = match_to_of(&spec.m, spec.in_port.as_deref(), &ports());
        assert_eq!(
            match_from_of(&back, &ports()).unwrap(),
            (spec.m, spec.in_port.clone())
        );
        let acts = actions_from_of(&instructions_to_of(&spec, &ports()), &ports()).unwrap();
        assert_eq!(acts, spec.actions, "{cli}");
        spec
    }

    #[test]
    fn ovn_shaped_flow_mods_are_the_cli_rules() {
        let f = fm(
            0,
            vec![Oxm::exact(Of::InPort, 1)],
            vec![
                load(Of::Reg14, 0, 32, 1),
                Action::SetField(Oxm::exact(Of::Metadata, 7)),
                Action::Resubmit {
                    port: OFPP_IN_PORT,
                    table: Some(8),
                },
            ],
        );
        same_as_cli(
            &f,
            "priority=100,in_port=vm1 actions=load:0x1->NXM_NX_REG14[],load:0x7->OXM_OF_METADATA[],resubmit(,8)",
        );
        let f = fm(
            8,
            vec![
                Oxm::exact(Of::Metadata, 7),
                Oxm::exact(Of::Reg14, 1),
                Oxm::masked(Of::Xxreg0, 0x10 << 96, 0xff << 96),
            ],
            vec![
                Action::RegMove(NxMove {
                    src: Of::Reg14,
                    src_ofs: 0,
                    dst: Of::Reg15,
                    dst_ofs: 0,
                    nbits: 32,
                }),
                Action::OutputReg(NxOutputReg {
                    src: Of::Reg15,
                    ofs: 0,
                    nbits: 16,
                    max_len: u16::MAX,
                    v2: false,
                }),
                Action::Resubmit {
                    port: 2,
                    table: Some(9),
                },
                Action::Resubmit {
                    port: 1,
                    table: None,
                },
            ],
        );
        same_as_cli(
            &f,
            "table=8,priority=100,metadata=0x7,reg0=0x10/0xff,reg14=0x1 actions=move:NXM_NX_REG14[]->NXM_NX_REG15[],output:NXM_NX_REG15[0..15],resubmit(vm2,9),resubmit:vm1",
        );
        // A zone from a register; in_port loaded with 0; an ARP responder's moves.
        let ct = NxCt {
            flags: 1,
            zone: CtZoneSrc::Field {
                field: Of::Reg13,
                ofs: 0,
            },
            recirc_table: 10,
            alg: 0,
            actions: vec![],
        };
        let f = fm(
            0,
            vec![Oxm::exact(Of::EthType, 0x0800)],
            vec![Action::Ct(Box::new(ct)), load(Of::NxmInPort, 0, 16, 0)],
        );
        same_as_cli(
            &f,
            "priority=100,ip actions=ct(commit,table=10,zone=NXM_NX_REG13[0..15]),load:0->NXM_OF_IN_PORT[]",
        );
        let f = fm(
            0,
            vec![Oxm::exact(Of::EthType, 0x0806)],
            vec![
                Action::RegMove(NxMove {
                    src: Of::ArpSpa,
                    src_ofs: 0,
                    dst: Of::ArpTpa,
                    dst_ofs: 0,
                    nbits: 32,
                }),
                Action::RegLoad2(Oxm::masked(Of::Reg3, 5, 0x0f)),
            ],
        );
        same_as_cli(
            &f,
            "priority=100,arp actions=move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],load:0x5->NXM_NX_REG3[0..3]",
        );
        // The flow stats' instructions: loads as REG_LOADs, the zone from its register.
        let spec = rule_from_flow_mod(&f, &ports()).unwrap();
        let i = instructions_to_of(&spec, &ports());
        assert_eq!(
            i,
            vec![Instruction::ApplyActions(vec![
                Action::RegMove(NxMove {
                    src: Of::ArpSpa,
                    src_ofs: 0,
                    dst: Of::ArpTpa,
                    dst_ofs: 0,
                    nbits: 32,
                }),
                load(Of::Reg3, 0, 4, 5),
            ])]
        );
    }

    #[test]
    fn refusals() {
        let bad = |apply: Vec<Action>| {
            let e = rule_from_flow_mod(&fm(0, vec![], apply), &ports()).unwrap_err();
            (e.type_, e.code)
        };
        // A resubmit from a reserved port the pipeline lacks (a port the bridge does not
        // have yet is its number); to the same table as the same port.
        assert_eq!(
            bad(vec![Action::Resubmit {
                port: 0xffff_fff9,
                table: Some(1)
            }]),
            (et::BAD_ACTION, bac::BAD_OUT_PORT)
        );
        assert_eq!(
            bad(vec![Action::Resubmit {
                port: OFPP_IN_PORT,
                table: Some(0xff)
            }]),
            (et::BAD_ACTION, bac::BAD_ARGUMENT)
        );
        // ct_state's upper 24 bits are not in the key; PBB's I-SID neither.
        assert_eq!(
            bad(vec![Action::RegMove(NxMove {
                src: Of::CtState,
                src_ofs: 8,
                dst: Of::Reg0,
                dst_ofs: 0,
                nbits: 8,
            })]),
            (et::BAD_ACTION, bac::BAD_SET_LEN)
        );
        assert_eq!(
            bad(vec![load(Of::PbbIsid, 0, 8, 1)]),
            (et::BAD_ACTION, bac::BAD_SET_TYPE)
        );
        // A move of an IP field in a rule that does not match IP: the text check refuses.
        assert!(rule_from_flow_mod(
            &fm(
                0,
                vec![],
                vec![Action::RegMove(NxMove {
                    src: Of::Ipv4Src,
                    src_ofs: 0,
                    dst: Of::Reg0,
                    dst_ofs: 0,
                    nbits: 32,
                })]
            ),
            &ports()
        )
        .is_err());
    }
}
