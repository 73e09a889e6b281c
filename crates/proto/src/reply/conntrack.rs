//! The replies of `dump-conntrack`, `flush-conntrack` and `conntrack-stats`.
//!
//! Fields in name order, as every reply (see the parent module).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One direction of a connection. ICMP queries carry `id`, `type` and `code`; TCP, UDP (and
/// other protocols with ports) `sport` and `dport`; other protocols neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackTuple {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    pub src: String,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub icmp_type: Option<u8>,
}

impl ConntrackTuple {
    /// `src=A,dst=B,sport=P,dport=Q` (ICMP: `id=I,type=T,code=C`), as OVS prints it.
    pub fn ovs_text(&self) -> String {
        let mut s = format!("src={},dst={}", self.src, self.dst);
        if let (Some(id), Some(t), Some(c)) = (self.id, self.icmp_type, self.code) {
            s += &format!(",id={id},type={t},code={c}");
        } else if let (Some(sp), Some(dp)) = (self.sport, self.dport) {
            s += &format!(",sport={sp},dport={dp}");
        }
        s
    }
}

/// `dump-conntrack`: one connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackEntry {
    /// Seen traffic both ways long enough not to be dropped first (Linux's `ASSURED`).
    pub assured: bool,
    /// The 128-bit label, `0x` and hexadecimal digits.
    pub labels: String,
    pub mark: u32,
    /// `src` or `dst` when committed with `nat(...)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<String>,
    pub orig: ConntrackTuple,
    /// The IP protocol's name (`tcp`, `udp`, `icmp`, `icmpv6`) or number.
    pub proto: String,
    /// The reply direction as it travels (translated by NAT).
    pub reply: ConntrackTuple,
    /// The TCP state (`ESTABLISHED`, ...; TCP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Seconds until it expires without further packets.
    pub timeout: u64,
    pub zone: u16,
}

impl ConntrackEntry {
    /// The line `ovs-appctl dpctl/dump-conntrack` prints for it:
    /// `tcp,orig=(...),reply=(...),zone=5,mark=1,labels=0x2a,protoinfo=(state=ESTABLISHED)`
    /// (zone, mark and labels only when not zero, as OVS).
    pub fn ovs_text(&self) -> String {
        let mut s = format!(
            "{},orig=({}),reply=({})",
            self.proto,
            self.orig.ovs_text(),
            self.reply.ovs_text()
        );
        if self.zone != 0 {
            s += &format!(",zone={}", self.zone);
        }
        if self.mark != 0 {
            s += &format!(",mark={}", self.mark);
        }
        if self.labels != "0x0" {
            s += &format!(",labels={}", self.labels);
        }
        if let Some(st) = &self.state {
            s += &format!(",protoinfo=(state={st})");
        }
        s
    }
}

/// `flush-conntrack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushConntrack {
    /// Connections removed.
    pub flushed: usize,
}

/// `conntrack-stats`: one zone with entries or a limit of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackZone {
    pub entries: u32,
    /// The limit in force (its own or the default); absent: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    pub zone: u16,
}

/// `conntrack-stats`: the tracker's counters and configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConntrackStats {
    /// Connections committed since the daemon's line started (a hot upgrade carries none
    /// over: counters restart with the new daemon).
    pub created: u64,
    /// Connections in the table.
    pub entries: u64,
    /// Removed by expiry.
    pub expired: u64,
    /// Packets that were invalid (malformed, out of window, no connection to relate to).
    pub invalid: u64,
    /// Commits refused by the global or a zone limit.
    pub limit_hits: u64,
    pub max_entries: u32,
    /// Commits with NAT refused: no free tuple in the range.
    pub nat_exhausted: u64,
    /// New connections per second over the last second.
    pub new_per_s: f64,
    /// Connections handed over by the last hot upgrade and restored.
    pub restored: u64,
    /// Handed-over tables refused at a hot upgrade (the upgrade went on without them).
    pub restore_refused: u64,
    /// Why the last one was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<String>,
    /// Shards of the table; the control thread sweeps a tenth of them every 100 ms.
    pub shards: usize,
    /// Every timeout in seconds, by name (`tcp-established`, ...).
    pub timeouts: BTreeMap<String, u32>,
    /// The limit of a zone without its own; absent: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_default_limit: Option<u32>,
    /// Zones with entries or a limit of their own, ascending.
    pub zones: Vec<ConntrackZone>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(src: &str, dst: &str, sport: u16, dport: u16) -> ConntrackTuple {
        ConntrackTuple {
            code: None,
            dport: Some(dport),
            dst: dst.into(),
            id: None,
            sport: Some(sport),
            src: src.into(),
            icmp_type: None,
        }
    }

    #[test]
    fn text_is_ovs_dump_conntrack() {
        let mut e = ConntrackEntry {
            assured: true,
            labels: "0x0".into(),
            mark: 0,
            nat: None,
            orig: t("10.0.0.1", "10.0.0.2", 1234, 80),
            proto: "tcp".into(),
            reply: t("10.0.0.2", "10.0.0.1", 80, 1234),
            state: Some("ESTABLISHED".into()),
            timeout: 432000,
            zone: 0,
        };
        assert_eq!(
            e.ovs_text(),
            "tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),\
             reply=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1234),\
             protoinfo=(state=ESTABLISHED)"
        );
        e.zone = 5;
        e.mark = 1;
        e.labels = "0x2a".into();
        assert!(e
            .ovs_text()
            .ends_with(",zone=5,mark=1,labels=0x2a,protoinfo=(state=ESTABLISHED)"));
        let icmp = ConntrackTuple {
            code: Some(0),
            dport: None,
            dst: "10.0.0.2".into(),
            id: Some(7),
            sport: None,
            src: "10.0.0.1".into(),
            icmp_type: Some(8),
        };
        assert_eq!(
            icmp.ovs_text(),
            "src=10.0.0.1,dst=10.0.0.2,id=7,type=8,code=0"
        );
        let j = serde_json::to_value(&icmp).unwrap();
        assert_eq!(j["type"], 8);
        assert!(j.get("sport").is_none());
        let back: ConntrackEntry =
            serde_json::from_value(serde_json::to_value(&e).unwrap()).unwrap();
        assert_eq!(back, e);
    }
}
