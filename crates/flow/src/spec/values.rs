//! The lexical layer of the rule syntax: a rule split into tokens, and the values of fields
//! and actions (numbers decimal or hex, MAC, IPv4 and IPv6 addresses, each with an optional
//! mask or prefix, port names), each refused with a [`ParseError`] that names the field.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::ParseError;

pub(super) fn bad(field: &str, value: &str, expected: &'static str) -> ParseError {
    ParseError::BadValue {
        field: field.into(),
        value: value.into(),
        expected,
    }
}

/// Parses an unsigned integer, decimal or 0x hex, at most `max`.
pub(super) fn num(field: &str, s: &str, max: u128) -> Result<u128, ParseError> {
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

pub(super) fn mac(field: &str, s: &str) -> Result<u128, ParseError> {
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

pub(super) fn ipv4(field: &str, s: &str) -> Result<u32, ParseError> {
    s.parse::<Ipv4Addr>()
        .map(u32::from)
        .map_err(|_| bad(field, s, "an IPv4 address"))
}

pub(super) fn ipv6(field: &str, s: &str) -> Result<u128, ParseError> {
    s.parse::<Ipv6Addr>()
        .map(u128::from)
        .map_err(|_| bad(field, s, "an IPv6 address"))
}

/// `VALUE[/MASK]` with `parse` for both halves; no mask: all of `full`.
pub(super) fn with_mask(
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
pub(super) fn ipv4_masked(field: &str, s: &str) -> Result<(u128, u128), ParseError> {
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

pub(super) fn ipv6_masked(field: &str, s: &str) -> Result<(u128, u128), ParseError> {
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

/// Splits on commas and spaces outside parentheses (`resubmit(,1)`).
pub(super) fn tokens(s: &str) -> Vec<&str> {
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

/// A port named in a rule: what a port may be called (letters, digits, '-', '_', '.'; at most
/// 64), so that the rule prints back as it was parsed. (Found by the `flow` fuzz target:
/// `output( =...` took " =..." as a port name, which printed as `output: =...`.)
pub(super) fn port_name(what: &str, v: &str) -> Result<String, ParseError> {
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
