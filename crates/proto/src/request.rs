//! Requests and the response envelope.

use serde::{Deserialize, Serialize};

/// Longest request line accepted: room for a bulk `add-flows` of some 500 000 rules (all or
/// none is one request). A client sending more is answered with an error and disconnected;
/// the daemon never buffers more than this per client.
pub const MAX_REQUEST: usize = 32 << 20;

/// A control request. Port options stay `key=value` strings here: the daemon parses and
/// validates them against its configuration model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Bridges, ports, PMD cores ([`crate::reply::Show`]).
    Show,
    /// The daemon's version ([`crate::reply::Version`]).
    Version,
    AddBridge {
        bridge: String,
    },
    DelBridge {
        bridge: String,
    },
    /// Adds a port (`key=value` options as `ferrovs add-port` takes them).
    AddPort {
        bridge: String,
        port: String,
        options: Vec<String>,
    },
    DelPort {
        bridge: String,
        port: String,
    },
    /// Changes settings of a live port (`key=value`: coalesce-usecs, coalesce-frames).
    SetPort {
        port: String,
        options: Vec<String>,
    },
    /// Counters of one port or of all ([`crate::reply::PortStats`]).
    PortStats {
        port: Option<String>,
    },
    /// PMD counters ([`crate::reply::PmdStats`]).
    PmdStats,
    PmdStatsClear,
    /// A bridge's learned addresses ([`crate::reply::MacEntry`]).
    MacTable {
        bridge: String,
    },
    /// One setting or all ([`crate::reply::ConfigGet`]).
    ConfigGet {
        key: Option<String>,
    },
    ConfigSet {
        key: String,
        value: String,
    },
    /// The last takeovers (hot upgrades) with their phases.
    UpgradeHistory {
        #[serde(default)]
        last: Option<usize>,
    },
    /// Installs rules (`ferrovs add-flow` syntax), all or none.
    AddFlows {
        bridge: String,
        flows: Vec<String>,
    },
    /// Removes the rules a filter selects (none given: every rule).
    DelFlows {
        bridge: String,
        #[serde(default)]
        filter: Option<String>,
        #[serde(default)]
        strict: bool,
    },
    /// The rules (a filter selects some) with their counters.
    DumpFlows {
        bridge: String,
        #[serde(default)]
        filter: Option<String>,
    },
    /// The bridge's megaflow cache entries.
    DumpMegaflows {
        bridge: String,
    },
    /// Replaces the bridge's OpenFlow controllers (`tcp:IP[:PORT]`, `unix:PATH`,
    /// `ptcp:[PORT][:IP]`, `punix:PATH`).
    SetController {
        bridge: String,
        targets: Vec<String>,
    },
    /// Removes every controller of the bridge.
    DelController {
        bridge: String,
    },
    /// The bridge's controller targets (a list of strings).
    GetController {
        bridge: String,
    },
    /// Changes OpenFlow settings of a bridge (`key=value`: datapath-id, protocols,
    /// fail-mode, max-backoff, inactivity-probe).
    SetBridge {
        bridge: String,
        options: Vec<String>,
    },
    /// Adds an OpenFlow meter (ovs-ofctl syntax: `meter=1,kbps,band=type=drop,rate=1000`).
    AddMeter {
        bridge: String,
        meter: String,
    },
    /// Reconfigures an existing meter (same syntax).
    ModMeter {
        bridge: String,
        meter: String,
    },
    /// Deletes one meter (and the rules that use it), or every meter.
    DelMeters {
        bridge: String,
        #[serde(default)]
        meter: Option<u32>,
    },
    /// The meters' configurations ([`crate::reply::MeterEntry`]).
    DumpMeters {
        bridge: String,
        #[serde(default)]
        meter: Option<u32>,
    },
    /// The meters' counters ([`crate::reply::MeterStats`]).
    MeterStats {
        bridge: String,
        #[serde(default)]
        meter: Option<u32>,
    },
    /// Adds a group (`ferrovs add-group`, ovs-ofctl syntax); `modify`: replaces an
    /// existing one (`mod-group`).
    AddGroup {
        bridge: String,
        group: String,
        #[serde(default)]
        modify: bool,
    },
    /// Deletes a group (none given: every group) and the rules that send to it.
    DelGroups {
        bridge: String,
        #[serde(default)]
        group: Option<u32>,
    },
    /// The groups with their counters.
    DumpGroups {
        bridge: String,
    },
    /// The tracked connections (of one zone, or all) ([`crate::reply::ConntrackEntry`]).
    DumpConntrack {
        #[serde(default)]
        zone: Option<u16>,
    },
    /// Removes the tracked connections (of one zone, or all).
    FlushConntrack {
        #[serde(default)]
        zone: Option<u16>,
    },
    /// The connection tracker's counters and limits ([`crate::reply::ConntrackStats`]).
    ConntrackStats,
    /// Where a packet would go through the bridge's current rules, and why (`ferrovs
    /// trace`, [`crate::reply::Trace`]): the packet is `flow` (ovs-ofctl match syntax,
    /// `in_port` included) or `packet` (a frame in hex) received on `in_port`. `ct_next`:
    /// the `ct_state` each recirculating `ct()` is assumed to give, in order (`trk,est`;
    /// past the list, `trk,new`). Changes nothing.
    Trace {
        bridge: String,
        #[serde(default)]
        flow: Option<String>,
        #[serde(default)]
        packet: Option<String>,
        #[serde(default)]
        in_port: Option<String>,
        #[serde(default)]
        ct_next: Vec<String>,
    },
    /// Log levels ([`crate::reply::LogLevels`]): with `level`, first set it for `module`
    /// (a module path prefix such as `ferrovs_control::daemon`; none: the default level).
    LogLevel {
        #[serde(default)]
        module: Option<String>,
        #[serde(default)]
        level: Option<String>,
    },
    /// Captures a port's packets ([`crate::reply::CaptureStarted`], then a stream of
    /// [`crate::capture::CaptureEvent`] lines until the capture ends).
    Capture {
        port: String,
        #[serde(default)]
        direction: crate::capture::Direction,
        /// Stop after this many packets.
        #[serde(default)]
        count: Option<u64>,
        /// Bytes kept of each packet (default and most: 65535).
        #[serde(default)]
        snaplen: Option<u32>,
        /// A tcpdump filter expression (libpcap's syntax).
        #[serde(default)]
        filter: Option<String>,
    },
    /// Deals the rx queues over the PMDs again by their measured loads (as `ovs-appctl
    /// dpif-netdev/pmd-rxq-rebalance`).
    PmdRebalance,
}

/// A response: `{"ok": true, "result": ...}` or `{"ok": false, "error": "message"}`. The
/// daemon sends `Response<Reply>`; a client reads the result as the command's type.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response<R = serde_json::Value> {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<R>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl<R> Response<R> {
    /// A success carrying `v`.
    pub fn ok(v: R) -> Response<R> {
        Response {
            ok: true,
            result: Some(v),
            error: None,
        }
    }

    /// A failure with the message users see.
    pub fn err(e: impl std::fmt::Display) -> Response<R> {
        Response {
            ok: false,
            result: None,
            error: Some(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_json() {
        let r: Request =
            serde_json::from_str(r#"{"cmd":"del-port","bridge":"br0","port":"vm1"}"#).unwrap();
        assert_eq!(
            r,
            Request::DelPort {
                bridge: "br0".into(),
                port: "vm1".into()
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
    }

    /// Every kind of request survives a trip through its wire form, and its tag is the
    /// command name the documentation gives.
    #[test]
    fn every_request_round_trips() {
        let s = |x: &str| x.to_string();
        let all = [
            (Request::Show, "show"),
            (Request::Version, "version"),
            (Request::AddBridge { bridge: s("br0") }, "add-bridge"),
            (Request::DelBridge { bridge: s("br0") }, "del-bridge"),
            (
                Request::AddPort {
                    bridge: s("br0"),
                    port: s("vm1"),
                    options: vec![s("type=vhost-user"), s("path=/tmp/vm1.sock")],
                },
                "add-port",
            ),
            (
                Request::DelPort {
                    bridge: s("br0"),
                    port: s("vm1"),
                },
                "del-port",
            ),
            (
                Request::SetPort {
                    port: s("vm1"),
                    options: vec![s("coalesce-usecs=50")],
                },
                "set-port",
            ),
            (Request::PortStats { port: None }, "port-stats"),
            (
                Request::PortStats {
                    port: Some(s("vm1")),
                },
                "port-stats",
            ),
            (Request::PmdStats, "pmd-stats"),
            (Request::PmdStatsClear, "pmd-stats-clear"),
            (Request::MacTable { bridge: s("br0") }, "mac-table"),
            (Request::ConfigGet { key: None }, "config-get"),
            (
                Request::ConfigGet {
                    key: Some(s("pmd-cores")),
                },
                "config-get",
            ),
            (
                Request::ConfigSet {
                    key: s("mac-aging"),
                    value: s("10"),
                },
                "config-set",
            ),
            (Request::UpgradeHistory { last: Some(3) }, "upgrade-history"),
            (Request::UpgradeHistory { last: None }, "upgrade-history"),
            (
                Request::AddFlows {
                    bridge: s("br0"),
                    flows: vec![s("priority=1 actions=drop")],
                },
                "add-flows",
            ),
            (
                Request::DelFlows {
                    bridge: s("br0"),
                    filter: Some(s("in_port=vm1")),
                    strict: true,
                },
                "del-flows",
            ),
            (
                Request::DumpFlows {
                    bridge: s("br0"),
                    filter: None,
                },
                "dump-flows",
            ),
            (
                Request::DumpMegaflows { bridge: s("br0") },
                "dump-megaflows",
            ),
            (
                Request::SetController {
                    bridge: s("br0"),
                    targets: vec![s("tcp:127.0.0.1:6653")],
                },
                "set-controller",
            ),
            (
                Request::DelController { bridge: s("br0") },
                "del-controller",
            ),
            (
                Request::GetController { bridge: s("br0") },
                "get-controller",
            ),
            (
                Request::SetBridge {
                    bridge: s("br0"),
                    options: vec![s("fail-mode=secure")],
                },
                "set-bridge",
            ),
            (
                Request::AddMeter {
                    bridge: s("br0"),
                    meter: s("meter=1,pktps,band=type=drop,rate=10"),
                },
                "add-meter",
            ),
            (
                Request::ModMeter {
                    bridge: s("br0"),
                    meter: s("meter=1,pktps,band=type=drop,rate=20"),
                },
                "mod-meter",
            ),
            (
                Request::DelMeters {
                    bridge: s("br0"),
                    meter: Some(1),
                },
                "del-meters",
            ),
            (
                Request::DumpMeters {
                    bridge: s("br0"),
                    meter: None,
                },
                "dump-meters",
            ),
            (
                Request::MeterStats {
                    bridge: s("br0"),
                    meter: Some(2),
                },
                "meter-stats",
            ),
            (
                Request::AddGroup {
                    bridge: s("br0"),
                    group: s("group_id=1,bucket=output:vm1"),
                    modify: false,
                },
                "add-group",
            ),
            (
                Request::DelGroups {
                    bridge: s("br0"),
                    group: Some(1),
                },
                "del-groups",
            ),
            (Request::DumpGroups { bridge: s("br0") }, "dump-groups"),
            (Request::DumpConntrack { zone: Some(5) }, "dump-conntrack"),
            (Request::DumpConntrack { zone: None }, "dump-conntrack"),
            (Request::FlushConntrack { zone: Some(0) }, "flush-conntrack"),
            (Request::FlushConntrack { zone: None }, "flush-conntrack"),
            (Request::ConntrackStats, "conntrack-stats"),
            (
                Request::Trace {
                    bridge: s("br0"),
                    flow: Some(s("in_port=vm1,tcp,tp_dst=80")),
                    packet: None,
                    in_port: None,
                    ct_next: vec![s("trk,est")],
                },
                "trace",
            ),
            (
                Request::LogLevel {
                    module: Some(s("ferrovs_vhost")),
                    level: Some(s("debug")),
                },
                "log-level",
            ),
            (Request::PmdRebalance, "pmd-rebalance"),
        ];
        for (req, cmd) in all {
            let line = serde_json::to_string(&req).unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["cmd"], cmd, "{line}");
            assert_eq!(
                serde_json::from_str::<Request>(&line).unwrap(),
                req,
                "{line}"
            );
        }
        // Optional fields may be left out; a zone is 16 bits.
        let r: Request = serde_json::from_str(r#"{"cmd":"dump-conntrack"}"#).unwrap();
        assert_eq!(r, Request::DumpConntrack { zone: None });
        let e = serde_json::from_str::<Request>(r#"{"cmd":"flush-conntrack","zone":70000}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("70000"), "{e}");
        let r: Request = serde_json::from_str(r#"{"cmd":"del-flows","bridge":"b"}"#).unwrap();
        assert_eq!(
            r,
            Request::DelFlows {
                bridge: s("b"),
                filter: None,
                strict: false
            }
        );
    }
}
