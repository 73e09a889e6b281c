//! Groups as users write them, in ovs-ofctl's syntax (`add-group`):
//!
//! ```text
//! group_id=N,type=all|select|indirect|fast_failover,bucket=BUCKET[,bucket=BUCKET...]
//! BUCKET: [weight:N,][watch_port:PORT,][watch_group:N,][actions=]ACTION[,ACTION...]
//! ```
//! A bucket runs to the next `bucket=`. Its actions are a rule's apply-actions without the
//! instructions; a rewrite is not checked against a match (there is none: a header the
//! packet lacks is left alone when the bucket runs, as in OVS). Ports are names, resolved
//! when the pipeline is built. What parses prints back to the same group.

use std::fmt;

use super::actions::parse_bucket_action;
use super::values::{num, port_name, tokens};
use super::{ActionSpec, ParseError};

/// The highest group id a group can have (OpenFlow `OFPG_MAX`).
pub const OFPG_MAX: u32 = 0xffff_ff00;

/// A group's type (OpenFlow `ofp_group_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupType {
    /// Every bucket, each on its own copy of the packet.
    All,
    /// One bucket, chosen by a hash of the flow, in proportion to the weights.
    Select,
    /// The one bucket.
    Indirect,
    /// The first live bucket.
    FastFailover,
}

impl GroupType {
    /// The name in ovs-ofctl's syntax.
    pub fn name(self) -> &'static str {
        match self {
            GroupType::All => "all",
            GroupType::Select => "select",
            GroupType::Indirect => "indirect",
            GroupType::FastFailover => "fast_failover",
        }
    }
}

/// One bucket as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    pub weight: u16,
    /// The port whose liveness the bucket's depends on (fast_failover).
    pub watch_port: Option<String>,
    /// The group whose liveness the bucket's depends on (fast_failover).
    pub watch_group: Option<u32>,
    pub actions: Vec<ActionSpec>,
}

/// A group as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub id: u32,
    pub ty: GroupType,
    pub buckets: Vec<BucketSpec>,
    /// OpenFlow 1.5's (Netronome's) selection method of a select group (`dp_hash`, `hash`)
    /// and its parameter, as given: kept and shown; the pipeline's select hashes the L2-L4
    /// fields whatever the method (OVS's `dp_hash` is a 5-tuple hash too). The method's
    /// `fields(...)` are not kept.
    pub selection_method: Option<String>,
    pub selection_param: u64,
}

impl GroupSpec {
    /// The groups this group's buckets send to (`group:N` actions).
    pub fn chained(&self) -> impl Iterator<Item = u32> + '_ {
        self.buckets.iter().flat_map(|b| {
            b.actions.iter().filter_map(|a| match a {
                ActionSpec::Group(g) => Some(*g),
                _ => None,
            })
        })
    }

    /// The type's rules on buckets: indirect has exactly one; every fast_failover bucket
    /// watches a port or a group.
    pub fn check(&self) -> Result<(), ParseError> {
        if self.ty == GroupType::Indirect && self.buckets.len() != 1 {
            return Err(ParseError::Invalid(format!(
                "group {}: an indirect group has exactly one bucket (it has {})",
                self.id,
                self.buckets.len()
            )));
        }
        if self.ty == GroupType::FastFailover
            && self
                .buckets
                .iter()
                .any(|b| b.watch_port.is_none() && b.watch_group.is_none())
        {
            return Err(ParseError::Invalid(format!(
                "group {}: every fast_failover bucket needs watch_port or watch_group",
                self.id
            )));
        }
        if self.chained().any(|g| g == self.id) {
            return Err(ParseError::Invalid(format!(
                "group {}: a bucket sends to its own group",
                self.id
            )));
        }
        Ok(())
    }
}

fn parse_type(v: &str) -> Result<GroupType, ParseError> {
    Ok(match v.to_ascii_lowercase().as_str() {
        "all" => GroupType::All,
        "select" => GroupType::Select,
        "indirect" => GroupType::Indirect,
        "fast_failover" | "ff" => GroupType::FastFailover,
        _ => {
            return Err(ParseError::BadValue {
                field: "type".into(),
                value: v.into(),
                expected: "all, select, indirect or fast_failover",
            })
        }
    })
}

/// Parses a group (`ferrovs add-group`). Untrusted text: errors name the token.
pub fn parse_group(s: &str) -> Result<GroupSpec, ParseError> {
    let mut id = None;
    let mut ty = None;
    let mut buckets: Vec<BucketSpec> = Vec::new();
    // Within a bucket: once `actions=` was seen, every token is an action.
    let mut in_actions = false;
    // Buckets given a weight (ovs-ofctl's default for a select bucket is 1, not 0).
    let mut weighted = Vec::new();
    let (mut selection_method, mut selection_param) = (None, 0u64);
    for tok in tokens(s) {
        let tok = tok.trim();
        let lower = tok.to_ascii_lowercase();
        let body = if let Some(b) = lower.strip_prefix("bucket=") {
            let b = &tok[tok.len() - b.len()..];
            in_actions = false;
            weighted.push(false);
            buckets.push(BucketSpec {
                weight: 0,
                watch_port: None,
                watch_group: None,
                actions: Vec::new(),
            });
            if b.is_empty() {
                continue;
            }
            b
        } else {
            tok
        };
        let Some(bucket) = buckets.last_mut() else {
            let (k, v) = body
                .split_once('=')
                .ok_or_else(|| ParseError::NoValue(body.into()))?;
            match k.to_ascii_lowercase().as_str() {
                "group_id" => {
                    let g = num(k, v, u128::from(OFPG_MAX))? as u32;
                    id = Some(g);
                }
                "type" => ty = Some(parse_type(v)?),
                "selection_method" => {
                    let ok = !v.is_empty()
                        && v.len() <= 15
                        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !ok {
                        return Err(ParseError::BadValue {
                            field: k.into(),
                            value: v.into(),
                            expected: "a method name (dp_hash, hash)",
                        });
                    }
                    selection_method = Some(v.to_string());
                }
                "selection_method_param" => {
                    selection_param = num(k, v, u128::from(u64::MAX))? as u64;
                }
                _ => return Err(ParseError::UnknownField(k.into())),
            }
            continue;
        };
        let lb = body.to_ascii_lowercase();
        let act = if let Some(a) = lb.strip_prefix("actions=") {
            in_actions = true;
            let a = &body[body.len() - a.len()..];
            if a.is_empty() {
                continue;
            }
            a
        } else if !in_actions {
            if let Some((k, v)) = body.split_once(':') {
                match k.to_ascii_lowercase().as_str() {
                    "weight" => {
                        bucket.weight = num(k, v, 65535)? as u16;
                        if let Some(w) = weighted.last_mut() {
                            *w = true;
                        }
                        continue;
                    }
                    "watch_port" => {
                        bucket.watch_port = Some(port_name(k, v)?);
                        continue;
                    }
                    "watch_group" => {
                        bucket.watch_group = Some(num(k, v, u128::from(OFPG_MAX))? as u32);
                        continue;
                    }
                    "bucket_id" => {
                        num(k, v, u128::from(u32::MAX))?;
                        continue;
                    }
                    _ => {}
                }
            }
            body
        } else {
            body
        };
        bucket.actions.push(parse_bucket_action(act)?);
    }
    let id = id.ok_or_else(|| ParseError::Invalid("a group needs group_id=N".into()))?;
    let ty = ty.unwrap_or(GroupType::All);
    if ty == GroupType::Select {
        // ovs-ofctl's default weight for a select bucket.
        for (b, w) in buckets.iter_mut().zip(&weighted) {
            if !w {
                b.weight = 1;
            }
        }
    }
    for b in &buckets {
        if b.actions.len() > 1 && b.actions.contains(&ActionSpec::Drop) {
            return Err(ParseError::Invalid("drop must be the only action".into()));
        }
    }
    let g = GroupSpec {
        id,
        ty,
        buckets,
        selection_method,
        selection_param,
    };
    g.check()?;
    Ok(g)
}

impl fmt::Display for BucketSpec {
    /// A weight shows when not 0 (a select group's bucket shows it always:
    /// [`GroupSpec`]'s display).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.weight != 0 {
            write!(f, "weight:{},", self.weight)?;
        }
        if let Some(p) = &self.watch_port {
            write!(f, "watch_port:{p},")?;
        }
        if let Some(g) = self.watch_group {
            write!(f, "watch_group:{g},")?;
        }
        let a: Vec<String> = self.actions.iter().map(|a| a.to_string()).collect();
        write!(f, "actions={}", a.join(","))
    }
}

impl fmt::Display for GroupSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group_id={},type={}", self.id, self.ty.name())?;
        if let Some(m) = &self.selection_method {
            write!(f, ",selection_method={m}")?;
            if self.selection_param != 0 {
                write!(f, ",selection_method_param={}", self.selection_param)?;
            }
        }
        for b in &self.buckets {
            if self.ty == GroupType::Select && b.weight == 0 {
                // Without it, the default weight 1 would parse back.
                write!(f, ",bucket=weight:0,{b}")?;
            } else {
                write!(f, ",bucket={b}")?;
            }
        }
        Ok(())
    }
}
