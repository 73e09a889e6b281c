//! OpenFlow 1.3 meters as users write them, in ovs-ofctl's syntax:
//!
//! ```text
//! meter=ID,(kbps|pktps)[,burst][,stats],band[s]=type=drop,rate=R[,burst_size=B][,type=...]
//! ```
//!
//! [`parse_meter`] checks what ovs-ofctl checks before it sends a METER_MOD (one of `kbps`
//! and `pktps`, at least one band, a non-zero rate, `burst_size` exactly when `burst` is
//! set, an id in `1..=OFPM_MAX`); [`MeterSpec`]'s [`std::fmt::Display`] is the canonical
//! text, which parses back to the same meter (saved configurations use it). Whether a
//! switch *supports* a meter (its band types, its number of bands) is the switch's
//! business, not the syntax's. Plain functions over untrusted text, no state.

use std::fmt;

use crate::spec::ParseError;

/// `OFPMF_KBPS`: rates in kilobits per second.
pub const KBPS: u16 = 1 << 0;
/// `OFPMF_PKTPS`: rates in packets per second.
pub const PKTPS: u16 = 1 << 1;
/// `OFPMF_BURST`: bands have a burst size.
pub const BURST: u16 = 1 << 2;
/// `OFPMF_STATS`: collect statistics.
pub const STATS: u16 = 1 << 3;
/// `OFPM_MAX`: the highest ordinary meter id.
pub const MAX_METER_ID: u32 = 0xffff_0000;

/// What a band does to a packet that exceeds its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BandKind {
    /// `OFPMBT_DROP`.
    Drop,
    /// `OFPMBT_DSCP_REMARK` with its drop precedence increase.
    DscpRemark { prec_level: u8 },
}

/// One band of a meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BandSpec {
    pub kind: BandKind,
    /// kbps or pktps, by the meter's flags; never 0.
    pub rate: u32,
    /// kilobits or packets; 0: none given.
    pub burst_size: u32,
}

/// A meter as written (and as OpenFlow's METER_MOD carries it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeterSpec {
    /// 1..=[`MAX_METER_ID`].
    pub id: u32,
    /// `OFPMF_*` bits ([`KBPS`], [`PKTPS`], [`BURST`], [`STATS`]).
    pub flags: u16,
    pub bands: Vec<BandSpec>,
}

impl MeterSpec {
    /// Rates in packets per second (else kilobits per second).
    pub fn pktps(&self) -> bool {
        self.flags & PKTPS != 0
    }
}

fn bad(field: &str, value: &str, expected: &'static str) -> ParseError {
    ParseError::BadValue {
        field: field.into(),
        value: value.into(),
        expected,
    }
}

fn number(field: &str, v: &str) -> Result<u32, ParseError> {
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => v.parse(),
    };
    r.map_err(|_| bad(field, v, "a 32-bit number"))
}

/// Splits `s` at commas and spaces into `key[=value]` items.
fn items(s: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    s.split([',', ' ', '\t'])
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| match x.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (x, None),
        })
}

/// A meter id as `meter=` takes it in a filter: a number, or `all` (`None`).
pub fn parse_meter_id(v: &str) -> Result<Option<u32>, ParseError> {
    if v.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    let id = number("meter", v)?;
    if id == 0 || id > MAX_METER_ID {
        return Err(bad("meter", v, "a meter id from 1 to 4294901760, or all"));
    }
    Ok(Some(id))
}

/// Parses a meter (`ferrovs add-meter`, `mod-meter`, a saved configuration).
pub fn parse_meter(s: &str) -> Result<MeterSpec, ParseError> {
    let lower = s.to_ascii_lowercase();
    // Everything after `band=`/`bands=` describes bands.
    let (head, bands_text) = match lower.find("bands=").or_else(|| lower.find("band=")) {
        Some(at) => {
            let rest = &s[at..];
            let eq = rest.find('=').unwrap_or(0);
            (&s[..at], Some(&rest[eq + 1..]))
        }
        None => (s, None),
    };
    let mut id = None;
    let mut flags = 0u16;
    for (k, v) in items(head) {
        match (k.to_ascii_lowercase().as_str(), v) {
            ("meter", Some(v)) => {
                id = Some(parse_meter_id(v)?.ok_or_else(|| bad("meter", v, "one meter id"))?)
            }
            ("kbps", None) => flags |= KBPS,
            ("pktps", None) => flags |= PKTPS,
            ("burst", None) => flags |= BURST,
            ("stats", None) => flags |= STATS,
            _ => return Err(ParseError::UnknownField(k.into())),
        }
    }
    let id = id.ok_or_else(|| ParseError::NoValue("meter".into()))?;
    if flags & (KBPS | PKTPS) == 0 || flags & (KBPS | PKTPS) == KBPS | PKTPS {
        return Err(ParseError::Invalid(
            "a meter has exactly one of 'kbps' and 'pktps'".into(),
        ));
    }
    let Some(bands_text) = bands_text else {
        return Err(ParseError::Invalid(
            "a meter needs bands ('band=...')".into(),
        ));
    };
    let mut bands: Vec<(BandSpec, bool, bool)> = Vec::new();
    for (k, v) in items(bands_text) {
        let v = v.ok_or_else(|| ParseError::NoValue(k.into()))?;
        let lk = k.to_ascii_lowercase();
        if lk == "type" {
            let kind = match v.to_ascii_lowercase().as_str() {
                "drop" => BandKind::Drop,
                "dscp_remark" => BandKind::DscpRemark { prec_level: 0 },
                _ => return Err(bad("type", v, "drop or dscp_remark")),
            };
            bands.push((
                BandSpec {
                    kind,
                    rate: 0,
                    burst_size: 0,
                },
                false,
                false,
            ));
            continue;
        }
        let Some((b, has_rate, has_burst)) = bands.last_mut() else {
            return Err(ParseError::Invalid(format!(
                "band field '{k}' before the band's 'type='"
            )));
        };
        match lk.as_str() {
            "rate" => {
                b.rate = number(k, v)?;
                *has_rate = true;
            }
            "burst_size" => {
                b.burst_size = number(k, v)?;
                *has_burst = true;
            }
            "prec_level" => match &mut b.kind {
                BandKind::DscpRemark { prec_level } => {
                    let p = number(k, v)?;
                    *prec_level = u8::try_from(p).map_err(|_| bad(k, v, "0 to 255"))?;
                }
                BandKind::Drop => {
                    return Err(ParseError::Invalid(
                        "prec_level is for dscp_remark bands".into(),
                    ))
                }
            },
            _ => return Err(ParseError::UnknownField(k.into())),
        }
    }
    if bands.is_empty() {
        return Err(ParseError::Invalid(
            "a meter needs bands ('band=...')".into(),
        ));
    }
    let mut out = Vec::with_capacity(bands.len());
    for (b, has_rate, has_burst) in bands {
        if !has_rate || b.rate == 0 {
            return Err(ParseError::Invalid("a band needs a non-zero 'rate'".into()));
        }
        if has_burst && flags & BURST == 0 {
            return Err(ParseError::Invalid(
                "a band may have 'burst_size' only when the meter has 'burst'".into(),
            ));
        }
        if !has_burst && flags & BURST != 0 {
            return Err(ParseError::Invalid(
                "with 'burst', every band needs 'burst_size'".into(),
            ));
        }
        out.push(b);
    }
    Ok(MeterSpec {
        id,
        flags,
        bands: out,
    })
}

impl fmt::Display for MeterSpec {
    /// `meter=1,kbps,burst,stats,bands=type=drop,rate=1000,burst_size=100[,type=...]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "meter={}", self.id)?;
        for (bit, name) in [
            (KBPS, "kbps"),
            (PKTPS, "pktps"),
            (BURST, "burst"),
            (STATS, "stats"),
        ] {
            if self.flags & bit != 0 {
                write!(f, ",{name}")?;
            }
        }
        f.write_str(",bands=")?;
        for (i, b) in self.bands.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match b.kind {
                BandKind::Drop => f.write_str("type=drop")?,
                BandKind::DscpRemark { prec_level } => {
                    write!(f, "type=dscp_remark,prec_level={prec_level}")?
                }
            }
            write!(f, ",rate={}", b.rate)?;
            if self.flags & BURST != 0 || b.burst_size != 0 {
                write!(f, ",burst_size={}", b.burst_size)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_parse_print_and_parse_back() {
        for (text, want) in [
            (
                "meter=1,kbps,burst,band=type=drop,rate=1000,burst_size=100",
                "meter=1,kbps,burst,bands=type=drop,rate=1000,burst_size=100",
            ),
            (
                "meter=2,pktps,stats,bands=type=drop,rate=10 type=drop,rate=20",
                "meter=2,pktps,stats,bands=type=drop,rate=10,type=drop,rate=20",
            ),
            (
                "meter=0x10,kbps,band=type=dscp_remark,rate=5,prec_level=1",
                "meter=16,kbps,bands=type=dscp_remark,prec_level=1,rate=5",
            ),
            (
                "meter=4294901760,kbps,band=type=drop,rate=5",
                "meter=4294901760,kbps,bands=type=drop,rate=5",
            ),
        ] {
            let m = parse_meter(text).unwrap();
            assert_eq!(m.to_string(), want, "{text}");
            assert_eq!(parse_meter(&m.to_string()).unwrap(), m);
        }
    }

    #[test]
    fn what_ovs_ofctl_refuses_is_refused() {
        for text in [
            "meter=0,kbps,band=type=drop,rate=5",
            "meter=4294901761,kbps,band=type=drop,rate=5",
            "meter=1,band=type=drop,rate=5",
            "meter=1,kbps,pktps,band=type=drop,rate=5",
            "meter=1,kbps",
            "meter=1,kbps,band=type=drop,rate=0",
            "meter=1,kbps,band=type=drop",
            "meter=1,kbps,band=type=drop,rate=5,burst_size=7",
            "meter=1,kbps,burst,band=type=drop,rate=5",
            "meter=1,kbps,band=type=bogus,rate=5",
            "meter=1,kbps,band=rate=5",
            "meter=1,kbps,frob,band=type=drop,rate=5",
            "kbps,band=type=drop,rate=5",
            "meter=1,kbps,band=type=drop,rate=5,prec_level=2",
        ] {
            assert!(parse_meter(text).is_err(), "{text} was accepted");
        }
    }
}
