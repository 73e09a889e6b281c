//! `learn(...)`'s syntax, as ovs-ofctl writes it (OVS's `learn_parse` and `learn_format`):
//!
//! ```text
//! learn([table=N,][idle_timeout=S,][hard_timeout=S,][fin_idle_timeout=S,][fin_hard_timeout=S,]
//!       [priority=N,][cookie=N,][send_flow_rem,][delete_learned,][limit=N,]ITEM,...)
//! ITEM: FIELD=VALUE                 the learned rule matches FIELD on a constant
//!       DST[bits][=SRC[bits]]       ... matches DST on the packet's SRC (default: DST)
//!       load:VALUE->DST[bits]       the learned rule loads a constant
//!       load:SRC[bits]->DST[bits]   ... loads the packet's SRC
//!       output:SRC[bits]            ... outputs to the port number SRC holds
//! ```
//! Checks as OVS's `learn_check`: a source field's prerequisites against the learning
//! rule's match (not in a group bucket: no match), a matched destination's against the
//! constants matched by the items before it (`eth_type=0x800` before `NXM_OF_IP_SRC[]`), a
//! loaded destination writable; table 255 refused; widths equal. Printing is OVS's:
//! defaults left out, `NAME=VALUE` for a whole-field constant, `DST[]` alone when the
//! source is the same bits.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::key::{Field, SubField};
use crate::learn::{LearnDst, LearnItem, LearnSpec, LearnSrc, F_DELETE_LEARNED, F_SEND_FLOW_REM};
use crate::matching::Match;

use super::ct::chex;
use super::fields::{
    fmt_subfield, parse_subfield, prerequisite, whole_by_name, whole_name, writable,
};
use super::values::{ipv4, ipv6, mac, num, tokens};
use super::ParseError;

fn invalid(s: String) -> ParseError {
    ParseError::Invalid(s)
}

/// How a field's constant is written (OVS's `mf_format` by the field's string type).
enum Kind {
    Ipv4,
    Ipv6,
    Mac,
    Decimal,
    Hex,
}

fn kind(f: Field) -> Kind {
    match f {
        Field::Ipv4Src | Field::Ipv4Dst | Field::TunSrc | Field::TunDst => Kind::Ipv4,
        Field::Ipv6Src | Field::Ipv6Dst | Field::NdTarget => Kind::Ipv6,
        Field::EthSrc | Field::EthDst | Field::ArpSha | Field::ArpTha => Kind::Mac,
        Field::IpProto
        | Field::IpTtl
        | Field::TpSrc
        | Field::TpDst
        | Field::ArpOp
        | Field::InPort
        | Field::CtZone => Kind::Decimal,
        _ => Kind::Hex,
    }
}

fn parse_value(name: &str, sf: &SubField, v: &str) -> Result<u128, ParseError> {
    match kind(sf.field) {
        Kind::Ipv4 => ipv4(name, v).map(u128::from),
        Kind::Ipv6 => ipv6(name, v),
        Kind::Mac => mac(name, v),
        Kind::Decimal | Kind::Hex => num(name, v, sf.ones()),
    }
}

fn fmt_value(sf: &SubField, v: u128) -> String {
    match kind(sf.field) {
        Kind::Ipv4 => Ipv4Addr::from(v as u32).to_string(),
        Kind::Ipv6 => Ipv6Addr::from(v).to_string(),
        Kind::Mac => {
            let b = (v as u64).to_be_bytes();
            format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                b[2], b[3], b[4], b[5], b[6], b[7]
            )
        }
        Kind::Decimal => v.to_string(),
        Kind::Hex => chex(v),
    }
}

/// Parses `learn`'s argument list; `m`: the learning rule's match (`None`: a group
/// bucket's, whose source prerequisites are not checked).
pub(super) fn parse_learn(arg: &str, m: Option<&Match>) -> Result<LearnSpec, ParseError> {
    let mut l = LearnSpec::default();
    // The constants matched so far: a later item's prerequisites.
    let mut dst_m = Match::catchall();
    for tok in tokens(arg) {
        let split = tok.find(['=', ':']);
        let (name, value) = match split {
            Some(i) => (&tok[..i], &tok[i + 1..]),
            None => (tok, ""),
        };
        let n16 = |v: &str| num(name, v, 65535).map(|x| x as u16);
        match name {
            "table" => {
                let t = num(name, value, 255)? as u8;
                if t == 255 {
                    return Err(invalid(format!(
                        "{tok}: table id 255 not valid for `learn' action"
                    )));
                }
                l.table = t;
            }
            "priority" => l.priority = n16(value)?,
            "idle_timeout" => l.idle_timeout = n16(value)?,
            "hard_timeout" => l.hard_timeout = n16(value)?,
            "fin_idle_timeout" => l.fin_idle_timeout = n16(value)?,
            "fin_hard_timeout" => l.fin_hard_timeout = n16(value)?,
            "cookie" => l.cookie = num(name, value, u128::from(u64::MAX))? as u64,
            "limit" => l.limit = num(name, value, u128::from(u32::MAX))? as u32,
            "send_flow_rem" if value.is_empty() => l.flags |= F_SEND_FLOW_REM,
            "delete_learned" if value.is_empty() => l.flags |= F_DELETE_LEARNED,
            _ => {
                let it = parse_item(tok, name, value)?;
                check_item(tok, &it, m, &mut dst_m)?;
                if l.items.len() >= crate::learn::MAX_ITEMS {
                    return Err(invalid(format!(
                        "learn: more than {} items",
                        crate::learn::MAX_ITEMS
                    )));
                }
                l.items.push(it);
            }
        }
    }
    Ok(l)
}

fn parse_item(tok: &str, name: &str, value: &str) -> Result<LearnItem, ParseError> {
    if let Some(dst) = whole_by_name(name).filter(|_| !name.contains('[')) {
        if value.is_empty() {
            return Err(ParseError::NoValue(name.into()));
        }
        let v = parse_value(name, &dst, value)?;
        return Ok(LearnItem {
            src: LearnSrc::Imm(v),
            dst: LearnDst::Match(dst),
        });
    }
    if name.contains('[') {
        let dst = parse_subfield(name)?;
        if !value.is_empty() && !value.contains('[') {
            // DST[bits]=VALUE: the learned rule matches those bits on a constant.
            let v = num(name, value, u128::MAX)?;
            if v & !dst.ones() != 0 {
                return Err(invalid(format!(
                    "{tok}: value does not fit into {} bits",
                    dst.nbits
                )));
            }
            return Ok(LearnItem {
                src: LearnSrc::Imm(v),
                dst: LearnDst::Match(dst),
            });
        }
        let src = if value.is_empty() {
            dst
        } else {
            parse_subfield(value)?
        };
        if src.nbits != dst.nbits {
            return Err(invalid(format!(
                "{tok}: bit widths of {name} ({}) and {value} ({}) differ",
                dst.nbits, src.nbits
            )));
        }
        return Ok(LearnItem {
            src: LearnSrc::Field(src),
            dst: LearnDst::Match(dst),
        });
    }
    match name {
        "load" => {
            let (s, d) = value
                .split_once("->")
                .ok_or_else(|| invalid(format!("{tok}: missing `->' following value")))?;
            let dst = parse_subfield(d)?;
            if s.contains('[') {
                let src = parse_subfield(s)?;
                if src.nbits != dst.nbits {
                    return Err(invalid(format!(
                        "{tok}: the source has {} bits, the destination {}",
                        src.nbits, dst.nbits
                    )));
                }
                Ok(LearnItem {
                    src: LearnSrc::Field(src),
                    dst: LearnDst::Load(dst),
                })
            } else {
                let v = num("load", s, u128::MAX)?;
                if v & !dst.ones() != 0 {
                    return Err(invalid(format!(
                        "{tok}: value does not fit into {} bits",
                        dst.nbits
                    )));
                }
                Ok(LearnItem {
                    src: LearnSrc::Imm(v),
                    dst: LearnDst::Load(dst),
                })
            }
        }
        "output" => {
            let src = parse_subfield(value)?;
            if src.nbits > 32 {
                return Err(invalid(format!("{tok}: a port number has at most 32 bits")));
            }
            Ok(LearnItem {
                src: LearnSrc::Field(src),
                dst: LearnDst::Output,
            })
        }
        _ => Err(invalid(format!("{tok}: unknown keyword {name}"))),
    }
}

/// OVS's `learn_check` for one item (see the module doc); `dst_m` gathers the constants.
fn check_item(
    tok: &str,
    it: &LearnItem,
    m: Option<&Match>,
    dst_m: &mut Match,
) -> Result<(), ParseError> {
    if let (LearnSrc::Field(s), Some(m)) = (it.src, m) {
        if let Some(need) = prerequisite(s.field, m) {
            return Err(invalid(format!(
                "{tok}: reading the source requires {need}"
            )));
        }
    }
    match it.dst {
        LearnDst::Match(d) => {
            if let Some(need) = prerequisite(d.field, dst_m) {
                return Err(invalid(format!(
                    "{tok}: the learned rule must first match {need}"
                )));
            }
            if let LearnSrc::Imm(v) = it.src {
                dst_m.set(d.field, v << d.ofs, d.mask());
            }
        }
        LearnDst::Load(d) => {
            if !writable(d.field) {
                return Err(invalid(format!("{tok}: the destination is read-only")));
            }
            if let Some(need) = prerequisite(d.field, dst_m) {
                return Err(invalid(format!(
                    "{tok}: the learned rule must first match {need}"
                )));
            }
        }
        LearnDst::Output => {}
    }
    Ok(())
}

/// `learn(...)` as ovs-ofctl prints it, in a rule with match `m`.
pub(super) fn fmt_learn(l: &LearnSpec, m: &Match) -> String {
    let mut s = format!("learn(table={}", l.table);
    for (name, v) in [
        ("idle_timeout", l.idle_timeout),
        ("hard_timeout", l.hard_timeout),
        ("fin_idle_timeout", l.fin_idle_timeout),
        ("fin_hard_timeout", l.fin_hard_timeout),
    ] {
        if v != 0 {
            s += &format!(",{name}={v}");
        }
    }
    if l.priority != super::DEFAULT_PRIORITY {
        s += &format!(",priority={}", l.priority);
    }
    if l.flags & F_SEND_FLOW_REM != 0 {
        s += ",send_flow_rem";
    }
    if l.flags & F_DELETE_LEARNED != 0 {
        s += ",delete_learned";
    }
    if l.cookie != 0 {
        s += &format!(",cookie={:#x}", l.cookie);
    }
    if l.limit != 0 {
        s += &format!(",limit={}", l.limit);
    }
    let mut dst_m = Match::catchall();
    for it in &l.items {
        s.push(',');
        match (it.src, it.dst) {
            (LearnSrc::Imm(v), LearnDst::Match(d)) => {
                match whole_name(&d, &dst_m) {
                    Some(name) => s += &format!("{name}={}", fmt_value(&d, v)),
                    None => s += &format!("{}={}", fmt_subfield(&d, &dst_m), chex(v)),
                }
                dst_m.set(d.field, v << d.ofs, d.mask());
            }
            (LearnSrc::Field(src), LearnDst::Match(d)) => {
                s += &fmt_subfield(&d, &dst_m);
                if src != d {
                    s += &format!("={}", fmt_subfield(&src, m));
                }
            }
            (LearnSrc::Imm(v), LearnDst::Load(d)) => {
                s += &format!("load:{}->{}", chex(v), fmt_subfield(&d, &dst_m));
            }
            (LearnSrc::Field(src), LearnDst::Load(d)) => {
                s += &format!(
                    "load:{}->{}",
                    fmt_subfield(&src, m),
                    fmt_subfield(&d, &dst_m)
                );
            }
            (LearnSrc::Field(src), LearnDst::Output) => {
                s += &format!("output:{}", fmt_subfield(&src, m));
            }
            (LearnSrc::Imm(v), LearnDst::Output) => s += &format!("output:{}", chex(v)),
        }
    }
    s.push(')');
    s
}
