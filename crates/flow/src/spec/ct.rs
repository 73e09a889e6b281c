//! Connection tracking in the rule syntax, as ovs-ofctl writes it (ovs-actions(7),
//! ovs-fields(7)): the `ct(...)` action's arguments into a [`CtSpec`] and back, the
//! `ct_state` flags, and the canonical text of the `ct_*` match fields.
//!
//! What OVS prints is the model: `ct(commit,force,table=T,zone=Z,nat(...),exec(...))` in
//! that order whatever the order written; `zone=0` left out; a NAT range collapsed when
//! its ends are equal, IPv6 addresses bracketed only when ports follow; a zone from a
//! field as `zone=NXM_NX_REG13[0..15]` (16 bits, as OVS requires); an `exec` mark or
//! label of every bit as `set_field:V->ct_mark`, of some bits as OVS's `load:V->
//! NXM_NX_CT_MARK[a..b]` per contiguous run of the mask (at most 64 bits a load). Hex numbers print as C's `%#x`
//! does (`0`, not `0x0`). Differences, each refused with a [`ParseError`] naming it: `alg=`, NAT flags (`random`, `hash`,
//! `persistent`), a second `nat`, ports above 65535 (OVS
//! silently wraps them). Several `exec` writes of one field merge into one (printed once),
//! and a whole-field `load:V->NXM_NX_CT_MARK[]` prints as the `set_field` it is.
//! Pure functions of their input: untrusted text, no panics.

use std::net::IpAddr;

use crate::ct::{state, CtNat, CtSpec, NatKind, NatSpec};
use crate::key::{ETH_IPV4, ETH_IPV6};

use super::values::{bad, num, tokens, with_mask};
use super::ParseError;

fn invalid(s: String) -> ParseError {
    ParseError::Invalid(s)
}

/// A number as C's `%#x` prints it: `0` for zero, else `0x...`.
pub(super) fn chex(v: u128) -> String {
    if v == 0 {
        "0".into()
    } else {
        format!("{v:#x}")
    }
}

fn flag(name: &str) -> Option<u8> {
    state::NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(b, _)| *b)
}

/// `ct_state=`: `+flag-flag...` (each flag once), `flag|flag` (exact), or a number with an
/// optional mask (`0x21/0x3f`). Returns (value, mask).
pub(super) fn parse_ct_state(v: &str) -> Result<(u128, u128), ParseError> {
    let name = "ct_state";
    if v.is_empty() {
        return Err(ParseError::NoValue(name.into()));
    }
    if v.starts_with(|c: char| c.is_ascii_digit()) {
        let (val, mask) = with_mask(name, v, 0xff, |s| num(name, s, 0xff))?;
        return Ok((val & mask, mask));
    }
    if v.starts_with(['+', '-']) {
        let (mut val, mut mask) = (0u128, 0u128);
        let mut rest = v;
        while !rest.is_empty() {
            let on = rest.starts_with('+');
            if !on && !rest.starts_with('-') {
                return Err(bad(name, v, "flags each preceded by + or -"));
            }
            rest = &rest[1..];
            let end = rest.find(['+', '-']).unwrap_or(rest.len());
            let f = &rest[..end];
            rest = &rest[end..];
            let b = flag(f).ok_or_else(|| {
                invalid(format!(
                    "ct_state: unknown flag '{f}' (new, est, rel, rpl, inv, trk, snat, dnat)"
                ))
            })?;
            if mask & u128::from(b) != 0 {
                return Err(invalid(format!(
                    "ct_state: flag '{f}' given more than once"
                )));
            }
            mask |= u128::from(b);
            if on {
                val |= u128::from(b);
            }
        }
        return Ok((val, mask));
    }
    let mut val = 0u128;
    for f in v.split('|') {
        let b = flag(f).ok_or_else(|| {
            invalid(format!(
                "ct_state: unknown flag '{f}' (new, est, rel, rpl, inv, trk, snat, dnat)"
            ))
        })?;
        val |= u128::from(b);
    }
    Ok((val, 0xff))
}

/// `ct_state`'s text as OVS prints it: every bit matched → `flag|flag` (`0` for none),
/// else `+flag`/`-flag` for each matched bit, in bit order.
pub(super) fn fmt_ct_state(v: u128, m: u128) -> String {
    let (v, m) = (v as u8, m as u8);
    if m == 0xff {
        if v == 0 {
            return "0".into();
        }
        let names: Vec<&str> = state::NAMES
            .iter()
            .filter(|(b, _)| v & b != 0)
            .map(|(_, n)| *n)
            .collect();
        return names.join("|");
    }
    state::NAMES
        .iter()
        .filter(|(b, _)| m & b != 0)
        .map(|(b, n)| format!("{}{n}", if v & b != 0 { '+' } else { '-' }))
        .collect()
}

/// Whether a match's `ct_state` (value, mask) implies a valid connection, OVS's
/// prerequisite of `ct_nw_*`/`ct_tp_*`: one of new, est, rel, rpl, snat, dnat set, or
/// `+trk-inv`.
pub(super) fn ct_valid(v: u128, m: u128) -> bool {
    let (v, m) = (v as u8, m as u8);
    let any = state::NEW | state::EST | state::REL | state::RPL | state::SNAT | state::DNAT;
    v & any != 0 || (v & state::TRK != 0 && m & state::INV != 0 && v & state::INV == 0)
}

/// The address family of a rule's match: 4, 6 or unknown (group buckets: no match).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    V4,
    V6,
    Any,
}

impl Family {
    pub(super) fn of(eth_type: Option<u16>) -> Option<Family> {
        match eth_type {
            Some(ETH_IPV4) => Some(Family::V4),
            Some(ETH_IPV6) => Some(Family::V6),
            _ => None,
        }
    }
}

/// The arguments of `ct(...)` (`None`: a bare `ct`) of a rule whose match has `family`;
/// `invalid_only`: the rule matches `ct_state=+inv` (OVS refuses to commit there).
pub(super) fn parse_ct(
    arg: Option<&str>,
    family: Family,
    invalid_only: bool,
) -> Result<CtSpec, ParseError> {
    let mut c = CtSpec::default();
    let mut nat_seen = false;
    for t in tokens(arg.unwrap_or("")) {
        let (key, val) = match t.split_once('=') {
            Some((k, v)) if !k.contains('(') => (k, Some(v)),
            _ => (t, None),
        };
        match (key, val) {
            ("commit", None) => c.commit = true,
            ("force", None) => c.force = true,
            ("zone", Some(v)) => {
                if !v.starts_with(|ch: char| ch.is_ascii_digit()) {
                    let sf = super::fields::parse_subfield(v)
                        .map_err(|e| invalid(format!("ct: zone={v}: {e}")))?;
                    if sf.nbits != 16 {
                        return Err(invalid(format!(
                            "ct: zone={v}: a zone from a field takes exactly 16 bits"
                        )));
                    }
                    c.zone = 0;
                    c.zone_src = Some(sf);
                } else {
                    c.zone = num("ct zone", v, 65535)? as u16;
                    c.zone_src = None;
                }
            }
            ("table", Some(v)) => c.table = Some(num("ct table", v, 254)? as u8),
            ("alg", Some(_)) => {
                return Err(invalid(format!(
                    "ct: {t}: application-layer gateways are not supported"
                )))
            }
            _ if key == "nat" || key.starts_with("nat(") => {
                if nat_seen {
                    return Err(invalid("ct: nat may be given once".into()));
                }
                nat_seen = true;
                c.nat = parse_nat(t, family)?;
            }
            _ if key == "exec" || key.starts_with("exec(") => {
                let inner = key
                    .strip_prefix("exec")
                    .and_then(|s| s.strip_prefix('('))
                    .map(|s| s.strip_suffix(')').unwrap_or(s))
                    .unwrap_or("");
                parse_exec(inner, &mut c)?;
            }
            _ => {
                return Err(invalid(format!(
                    "ct: unknown argument '{t}' (commit, force, zone=N, table=T, nat, nat(...), exec(...))"
                )))
            }
        }
    }
    if c.commit && invalid_only {
        return Err(invalid(
            "ct: commit in a rule that matches ct_state=+inv (an invalid packet cannot be committed)"
                .into(),
        ));
    }
    if c.force && !c.commit {
        return Err(invalid("ct: force requires commit".into()));
    }
    if !c.commit {
        if c.mark.is_some() || c.label.is_some() || !c.moves.is_empty() {
            return Err(invalid(
                "ct: exec(set_field:...->ct_mark/ct_label) requires commit".into(),
            ));
        }
        if matches!(c.nat, CtNat::Bind(_) | CtNat::Kind(_)) {
            return Err(invalid(
                "ct: nat with a range requires commit, as nat(src|dst) does (without commit: plain nat)".into(),
            ));
        }
    }
    Ok(c)
}

/// `nat`, `nat(src=RANGE)`, `nat(dst=RANGE)`; RANGE is `IP[-IP][:PORT[-PORT]]` (IPv6 in
/// brackets when ports follow).
fn parse_nat(t: &str, family: Family) -> Result<CtNat, ParseError> {
    let Some(inner) = t.strip_prefix("nat(") else {
        return Ok(CtNat::Apply);
    };
    let inner = inner.strip_suffix(')').unwrap_or(inner);
    let mut spec = None;
    for a in tokens(inner) {
        let (k, v) = a.split_once('=').unwrap_or((a, ""));
        let kind = match k {
            "src" => NatKind::Src,
            "dst" => NatKind::Dst,
            "random" | "hash" | "persistent" => {
                return Err(invalid(format!(
                    "ct: nat flag '{k}' is not supported (ferrovs picks ports itself)"
                )))
            }
            _ => {
                return Err(invalid(format!(
                    "ct: nat: unknown argument '{a}' (src=RANGE or dst=RANGE)"
                )))
            }
        };
        if spec.is_some() {
            return Err(invalid(format!(
                "ct: nat({inner}): one of src= or dst=, once"
            )));
        }
        spec = Some(if v.is_empty() {
            CtNat::Kind(kind)
        } else {
            CtNat::Bind(parse_range(kind, v, family)?)
        });
    }
    Ok(spec.unwrap_or(CtNat::Apply))
}

fn parse_range(kind: NatKind, v: &str, family: Family) -> Result<NatSpec, ParseError> {
    let bad_range = |why: &str| invalid(format!("ct: nat range '{v}': {why}"));
    let (addrs, ports): (Vec<&str>, Option<&str>) = if let Some(rest) = v.strip_prefix('[') {
        // [A]-[B]:P-Q or [A]:P
        let (a, rest) = rest.split_once(']').ok_or_else(|| bad_range("no ']'"))?;
        let (b, rest) = match rest.strip_prefix("-[") {
            Some(r) => {
                let (b, r) = r.split_once(']').ok_or_else(|| bad_range("no ']'"))?;
                (Some(b), r)
            }
            None => (None, rest),
        };
        let ports = match rest {
            "" => None,
            r => Some(
                r.strip_prefix(':')
                    .ok_or_else(|| bad_range("expected ':PORT' after the address"))?,
            ),
        };
        (std::iter::once(a).chain(b).collect(), ports)
    } else if v.matches(':').count() > 1 {
        // IPv6 without brackets: no ports.
        (v.splitn(2, '-').collect(), None)
    } else {
        let (a, p) = match v.split_once(':') {
            Some((a, p)) => (a, Some(p)),
            None => (v, None),
        };
        (a.splitn(2, '-').collect(), p)
    };
    let addr = |s: &str| {
        s.parse::<IpAddr>()
            .map_err(|_| bad("ct nat", s, "an IPv4 or IPv6 address"))
    };
    let addr_min = addr(addrs[0])?;
    let addr_max = match addrs.get(1) {
        Some(b) => addr(b)?,
        None => addr_min,
    };
    if addr_min.is_ipv4() != addr_max.is_ipv4() {
        return Err(bad_range("the addresses are of two families"));
    }
    if addr_min > addr_max {
        return Err(bad_range("the first address is above the second"));
    }
    let fam = if addr_min.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    };
    if family != Family::Any && family != fam {
        return Err(invalid(format!(
            "ct: nat range '{v}' is {} but the rule matches {}",
            if fam == Family::V4 { "IPv4" } else { "IPv6" },
            if family == Family::V4 { "ip" } else { "ipv6" }
        )));
    }
    let ports = match ports {
        None => None,
        Some(p) => {
            let (a, b) = p.split_once('-').unwrap_or((p, p));
            let (a, b) = (
                num("ct nat port", a, 65535)? as u16,
                num("ct nat port", b, 65535)? as u16,
            );
            if a > b {
                return Err(bad_range("the first port is above the second"));
            }
            if a == 0 && b != 0 {
                return Err(bad_range("a port range starts at 1"));
            }
            (b != 0).then_some((a, b))
        }
    };
    Ok(NatSpec {
        kind,
        addr_min,
        addr_max,
        ports,
    })
}

/// Merges `value` on the bits of `mask` into an exec write.
fn merge<T>(slot: &mut Option<(T, T)>, value: T, mask: T)
where
    T: Copy
        + std::ops::BitAnd<Output = T>
        + std::ops::BitOr<Output = T>
        + std::ops::Not<Output = T>
        + Default
        + PartialEq,
{
    if mask == T::default() {
        return;
    }
    let (v0, m0) = slot.unwrap_or_default();
    *slot = Some(((v0 & !mask) | (value & mask), m0 | mask));
}

/// `exec(...)`: `set_field:V[/M]->ct_mark|ct_label`, `load:V->NXM_NX_CT_MARK[...]`,
/// `load:V->NXM_NX_CT_LABEL[...]`.
fn parse_exec(inner: &str, c: &mut CtSpec) -> Result<(), ParseError> {
    for a in tokens(inner) {
        let nested = || {
            invalid(format!(
                "ct: exec: '{a}': only set_field:V->ct_mark, set_field:V->ct_label (or load) may be nested"
            ))
        };
        let (op, rest) = a.split_once(':').ok_or_else(nested)?;
        if op == "move" {
            let (sv, d) = rest
                .split_once("->")
                .ok_or_else(|| invalid(format!("ct: exec: {a}: expected SRC[bits]->DST[bits]")))?;
            let src = super::fields::parse_subfield(sv)?;
            let dst = super::fields::parse_subfield(d)?;
            if !matches!(dst.field, crate::Field::CtMark | crate::Field::CtLabel) {
                return Err(invalid(format!(
                    "ct: exec: {a}: a move writes NXM_NX_CT_MARK or NXM_NX_CT_LABEL only"
                )));
            }
            if src.nbits != dst.nbits {
                return Err(invalid(format!(
                    "ct: exec: {a}: the source has {} bits, the destination {}",
                    src.nbits, dst.nbits
                )));
            }
            c.moves.push((src, dst));
            continue;
        }
        if op != "set_field" && op != "load" {
            return Err(nested());
        }
        let (v, dst) = rest
            .split_once("->")
            .ok_or_else(|| invalid(format!("ct: exec: {a}: expected VALUE->FIELD")))?;
        let (value, mask, label) = match op {
            "set_field" => {
                let label = match dst {
                    "ct_mark" => false,
                    "ct_label" => true,
                    "ct_zone" | "ct_state" => {
                        return Err(invalid(format!("ct: exec: {dst} is read-only")))
                    }
                    _ => {
                        return Err(invalid(format!(
                            "ct: exec: field '{dst}' cannot be set here (only ct_mark and ct_label)"
                        )))
                    }
                };
                let full = if label {
                    u128::MAX
                } else {
                    u128::from(u32::MAX)
                };
                let (val, mask) = with_mask(dst, v, full, |s| num(dst, s, full))?;
                (val & mask, mask, label)
            }
            "load" => {
                let (fname, range) = dst
                    .split_once('[')
                    .ok_or_else(|| invalid(format!("ct: exec: {a}: expected FIELD[...]")))?;
                let (label, width) = match fname {
                    "NXM_NX_CT_MARK" => (false, 32u32),
                    "NXM_NX_CT_LABEL" => (true, 128u32),
                    _ => {
                        return Err(invalid(format!(
                            "ct: exec: field '{fname}' cannot be loaded here (only NXM_NX_CT_MARK and NXM_NX_CT_LABEL)"
                        )))
                    }
                };
                let range = range
                    .strip_suffix(']')
                    .ok_or_else(|| invalid(format!("ct: exec: {a}: expected ']'")))?;
                let (lo, hi) = if range.is_empty() {
                    (0, width - 1)
                } else {
                    let (l, h) = range.split_once("..").unwrap_or((range, range));
                    (
                        num(fname, l, u128::from(width - 1))? as u32,
                        num(fname, h, u128::from(width - 1))? as u32,
                    )
                };
                if lo > hi {
                    return Err(invalid(format!(
                        "ct: exec: {a}: the range's start is after its end"
                    )));
                }
                let n = hi - lo + 1;
                let max = if n == 128 {
                    u128::MAX
                } else {
                    (1u128 << n) - 1
                };
                let val = num(fname, v, u128::MAX)?;
                if val > max {
                    return Err(invalid(format!(
                        "ct: exec: {a}: the value does not fit in {n} bits"
                    )));
                }
                (val << lo, max << lo, label)
            }
            _ => return Err(nested()),
        };
        if label {
            merge(&mut c.label, value, mask);
        } else {
            merge(&mut c.mark, value as u32, mask as u32);
        }
    }
    Ok(())
}

/// An exec write's text: the whole field as `set_field`, else one `load` per contiguous
/// run of the mask, a run longer than 64 bits as several (as OVS prints it).
fn fmt_write(out: &mut Vec<String>, v: u128, m: u128, width: u32, name: &str, nxm: &str) {
    let full = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    if m == full {
        out.push(format!("set_field:{}->{name}", chex(v)));
        return;
    }
    let mut bit = 0u32;
    while bit < width {
        if m >> bit & 1 == 0 {
            bit += 1;
            continue;
        }
        let lo = bit;
        while bit < width && m >> bit & 1 == 1 {
            bit += 1;
        }
        // A load carries at most 64 bits: a longer run is several, from its low end.
        let end = bit;
        let mut lo = lo;
        while lo < end {
            let hi = (lo + 63).min(end - 1);
            let n = hi - lo + 1;
            let run = (v >> lo) & ((1u128 << n) - 1);
            let range = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo}..{hi}")
            };
            out.push(format!("load:{}->{nxm}[{range}]", chex(run)));
            lo = hi + 1;
        }
    }
}

fn fmt_range(s: &NatSpec) -> String {
    let kind = match s.kind {
        NatKind::Src => "src",
        NatKind::Dst => "dst",
    };
    let v6 = s.addr_min.is_ipv6();
    let br = |a: IpAddr| {
        if v6 && s.ports.is_some() {
            format!("[{a}]")
        } else {
            a.to_string()
        }
    };
    let mut t = format!("{kind}={}", br(s.addr_min));
    if s.addr_max != s.addr_min {
        t += &format!("-{}", br(s.addr_max));
    }
    if let Some((a, b)) = s.ports {
        t += &format!(":{a}");
        if b != a {
            t += &format!("-{b}");
        }
    }
    t
}

/// `ct(...)` as OVS prints it.
pub(super) fn fmt_ct(c: &CtSpec) -> String {
    let mut parts = Vec::new();
    if c.commit {
        parts.push("commit".to_string());
    }
    if c.force {
        parts.push("force".into());
    }
    if let Some(t) = c.table {
        parts.push(format!("table={t}"));
    }
    if let Some(sf) = &c.zone_src {
        parts.push(format!(
            "zone={}",
            super::fields::fmt_subfield(sf, &crate::Match::catchall())
        ));
    } else if c.zone != 0 {
        parts.push(format!("zone={}", c.zone));
    }
    match &c.nat {
        CtNat::Off => {}
        CtNat::Apply => parts.push("nat".into()),
        CtNat::Bind(s) => parts.push(format!("nat({})", fmt_range(s))),
        CtNat::Kind(NatKind::Src) => parts.push("nat(src)".into()),
        CtNat::Kind(NatKind::Dst) => parts.push("nat(dst)".into()),
    }
    let mut exec = Vec::new();
    if let Some((v, m)) = c.mark {
        fmt_write(
            &mut exec,
            u128::from(v),
            u128::from(m),
            32,
            "ct_mark",
            "NXM_NX_CT_MARK",
        );
    }
    if let Some((v, m)) = c.label {
        fmt_write(&mut exec, v, m, 128, "ct_label", "NXM_NX_CT_LABEL");
    }
    for (src, dst) in &c.moves {
        let any = crate::Match::catchall();
        exec.push(format!(
            "move:{}->{}",
            super::fields::fmt_subfield(src, &any),
            super::fields::fmt_subfield(dst, &any)
        ));
    }
    if !exec.is_empty() {
        parts.push(format!("exec({})", exec.join(",")));
    }
    format!("ct({})", parts.join(","))
}
