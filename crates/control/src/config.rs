//! Configuration: what the operator asked for, as plain data.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Kinds of port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortType {
    /// vhost-user, ferrovs listens (QEMU `-chardev socket,...` without server=on connects).
    VhostUser,
    /// vhost-user, ferrovs connects to the frontend's listening socket and reconnects.
    VhostUserClient,
    /// A TAP device `dev` (created if missing): the host stack as a port.
    Tap,
    /// An existing kernel netdev `dev`, attached with AF_XDP, else AF_PACKET (`mode`).
    Uplink,
    /// A VXLAN tunnel to `remote_ip` with VNI `key`, over the host stack (UDP `dst_port`).
    Vxlan,
    /// A Geneve tunnel, as `Vxlan` (UDP 6081 by default); OVN's tunnels.
    Geneve,
}

impl PortType {
    pub fn parse(s: &str) -> Result<PortType, ConfigError> {
        Ok(match s {
            "vhost-user" => PortType::VhostUser,
            "vhost-user-client" => PortType::VhostUserClient,
            "tap" => PortType::Tap,
            "uplink" => PortType::Uplink,
            "vxlan" => PortType::Vxlan,
            "geneve" => PortType::Geneve,
            _ => {
                return Err(ConfigError::Invalid(format!(
                "unknown port type '{s}' (expected vhost-user, vhost-user-client, tap, uplink, vxlan or geneve)"
            )))
            }
        })
    }

    /// Whether the port is served by a kernel fd (TAP, uplink, tunnel socket) rather than
    /// vhost-user.
    pub fn is_kernel(self) -> bool {
        matches!(
            self,
            PortType::Tap | PortType::Uplink | PortType::Vxlan | PortType::Geneve
        )
    }

    /// Whether the port is a tunnel (VXLAN or Geneve).
    pub fn is_tunnel(self) -> bool {
        matches!(self, PortType::Vxlan | PortType::Geneve)
    }

    pub fn name(self) -> &'static str {
        match self {
            PortType::VhostUser => "vhost-user",
            PortType::VhostUserClient => "vhost-user-client",
            PortType::Tap => "tap",
            PortType::Uplink => "uplink",
            PortType::Vxlan => "vxlan",
            PortType::Geneve => "geneve",
        }
    }
}

/// One port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortConfig {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: PortType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    #[serde(default = "one")]
    pub queues: u16,
    /// Access VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<u16>,
    /// Trunk VLANs (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trunks: Vec<u16>,
    /// Uplinks: how to attach (absent: AF_XDP where it works, else AF_PACKET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<UplinkMode>,
    /// vhost-user: guest notification coalescing, at most one notification per this many
    /// microseconds (absent or 0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_usecs: Option<u32>,
    /// ... or per this many packets, whichever comes first (absent or 0: no packet limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_frames: Option<u32>,
    /// Tunnels: the remote endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_ip: Option<std::net::Ipv4Addr>,
    /// Tunnels: the local address to bind (absent: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_ip: Option<std::net::Ipv4Addr>,
    /// Tunnels: the VNI (absent: 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<u32>,
    /// Tunnels: `key=flow`, each packet's VNI (and Geneve options) from its tunnel
    /// metadata; `key` is then absent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub key_flow: bool,
    /// Tunnels: `csum` as OVS takes it (the outer UDP checksum is computed either way: the
    /// host stack does it for our socket; kept to be shown and saved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csum: Option<bool>,
    /// Tunnels: the UDP port, local and remote (absent: 4789 for VXLAN, 6081 for Geneve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_port: Option<u16>,
    /// The OpenFlow port number asked for (1..=65279, as OVS's `ofport_request`); the bridge
    /// gives it when no other port of the bridge has it, else the lowest free number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ofport: Option<u16>,
    /// Rx queues pinned to PMD cores, "QUEUE:CORE,..." (OVS's Interface
    /// `other_config:pmd-rxq-affinity`; docs/pmd.md, "Rx queue assignment").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pmd_rxq_affinity: Option<String>,
}

/// Highest OpenFlow port number a port may ask for (OpenFlow's `OFPP_MAX`, 0xff00, is the
/// first reserved one).
pub const OFPORT_MAX: u16 = 0xfeff;
/// OpenFlow's `OFPP_LOCAL`: the number of a bridge's own port (a TAP named as the bridge,
/// as OVS numbers the bridge's internal interface).
pub const OFPP_LOCAL: u16 = 0xfffe;

/// Most microseconds a guest notification may be deferred.
pub const MAX_COALESCE_USECS: u32 = 10_000;
/// Most packets a guest notification may be deferred for (the largest ring).
pub const MAX_COALESCE_FRAMES: u32 = 32_768;

impl PortConfig {
    /// A port of `kind` named `name` with every option at its default.
    pub fn new(name: &str, kind: PortType) -> PortConfig {
        PortConfig {
            name: name.to_string(),
            kind,
            path: None,
            dev: None,
            queues: 1,
            tag: None,
            trunks: vec![],
            mode: None,
            coalesce_usecs: None,
            coalesce_frames: None,
            remote_ip: None,
            local_ip: None,
            key: None,
            key_flow: false,
            csum: None,
            dst_port: None,
            ofport: None,
            pmd_rxq_affinity: None,
        }
    }

    /// The queue pairs pinned to cores by `pmd-rxq-affinity` (validated when set).
    pub fn rxq_affinity(&self) -> Vec<(u16, usize)> {
        self.pmd_rxq_affinity
            .as_deref()
            .and_then(|a| ferrovs_datapath::rxq::parse_affinity(a, self.rx_pairs()).ok())
            .unwrap_or_default()
    }

    /// Rx queue pairs the datapath polls for this port (kernel ports: one).
    pub fn rx_pairs(&self) -> usize {
        if self.kind.is_kernel() {
            1
        } else {
            self.queues as usize
        }
    }

    /// The port's notification coalescing.
    pub fn coalesce(&self) -> ferrovs_vhost::virtqueue::Coalesce {
        ferrovs_vhost::virtqueue::Coalesce {
            usecs: self.coalesce_usecs.unwrap_or(0),
            frames: self.coalesce_frames.unwrap_or(0),
        }
    }
}

/// How an uplink is attached, when the operator forces it (`mode=` on add-port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UplinkMode {
    #[serde(rename = "af_xdp")]
    AfXdp,
    #[serde(rename = "af_packet")]
    AfPacket,
}

impl UplinkMode {
    pub fn parse(s: &str) -> Result<UplinkMode, ConfigError> {
        match s {
            "af_xdp" => Ok(UplinkMode::AfXdp),
            "af_packet" => Ok(UplinkMode::AfPacket),
            _ => Err(ConfigError::Invalid(format!(
                "unknown uplink mode '{s}' (expected af_xdp or af_packet)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            UplinkMode::AfXdp => "af_xdp",
            UplinkMode::AfPacket => "af_packet",
        }
    }
}

fn one() -> u16 {
    1
}

/// What a bridge does while no OpenFlow controller is connected (OVS's `fail_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// With controllers configured and none connected for three probe intervals, the
    /// bridge forwards as a learning switch (a hidden NORMAL rule above every other); with
    /// none configured, a flushed table gets the `priority=0 actions=NORMAL` rule.
    #[default]
    Standalone,
    /// Only what the rules say, ever.
    Secure,
}

impl FailMode {
    pub fn parse(s: &str) -> Result<FailMode, ConfigError> {
        match s {
            "standalone" => Ok(FailMode::Standalone),
            "secure" => Ok(FailMode::Secure),
            _ => Err(ConfigError::Invalid(format!(
                "unknown fail-mode '{s}' (expected secure or standalone)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FailMode::Standalone => "standalone",
            FailMode::Secure => "secure",
        }
    }
}

/// One bridge.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BridgeConfig {
    pub name: String,
    #[serde(default)]
    pub ports: Vec<PortConfig>,
    /// The bridge's rules in `ferrovs add-flow` syntax, in order; absent: the default
    /// `priority=0 actions=NORMAL` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<Vec<String>>,
    /// OpenFlow controllers (`tcp:IP[:PORT]`, `unix:PATH`, `ptcp:[PORT][:IP]`,
    /// `punix:PATH`), as `ferrovs set-controller` sets them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controllers: Vec<String>,
    /// The datapath id (16 hexadecimal digits); absent: derived from the bridge's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath_id: Option<String>,
    /// OpenFlow versions allowed (`OpenFlow13`, ...); empty: every one this switch speaks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protocols: Vec<String>,
    /// Absent: standalone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_mode: Option<FailMode>,
    /// Controllers' longest reconnect delay in milliseconds (absent: 8000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff_ms: Option<u32>,
    /// Controllers' inactivity probe in milliseconds (absent: 5000; 0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactivity_probe_ms: Option<u32>,
    /// The bridge's OpenFlow meters in ovs-ofctl syntax
    /// (`meter=1,kbps,bands=type=drop,rate=1000`), by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub meters: Vec<String>,
    /// The bridge's groups in `ferrovs add-group` (ovs-ofctl) syntax, by group id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Which of `flows` (positions from 0) were added with OpenFlow's
    /// `OFPFF_SEND_FLOW_REM`: their removal is reported to the controllers after a restart
    /// or hot upgrade too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub send_flow_rem: Vec<u32>,
}

impl BridgeConfig {
    /// The configured datapath id, or the one derived from the name.
    pub fn dpid(&self) -> u64 {
        let s = crate::vswitchdb::datapath_id(self.datapath_id.as_deref(), None, &self.name);
        u64::from_str_radix(&s, 16).unwrap_or(0)
    }

    /// Checks the OpenFlow settings.
    pub fn validate_openflow(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(format!("bridge {}: {s}", self.name)));
        for c in &self.controllers {
            if let Err(e) = crate::controller::Target::parse(c) {
                return bad(e.to_string());
            }
        }
        if let Some(d) = &self.datapath_id {
            if !valid_dpid(d) {
                return bad(format!(
                    "bad datapath-id '{d}' (expected 16 hexadecimal digits)"
                ));
            }
        }
        if let Err(e) = crate::controller::protocol_versions(&self.protocols) {
            return bad(e);
        }
        Ok(())
    }
}

/// Whether `s` is a datapath id: 16 hexadecimal digits (an optional `0x` before).
pub fn valid_dpid(s: &str) -> bool {
    let s = s.strip_prefix("0x").unwrap_or(s);
    s.len() == 16 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Format version of this file.
    #[serde(default = "one_u32")]
    pub version: u32,
    #[serde(default)]
    pub bridges: Vec<BridgeConfig>,
    /// CPU cores for PMD threads; empty: the last allowed core.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmd_cores: Vec<usize>,
    /// Other settings (`mac-aging`, ...), as `ferrovs config get/set` sees them.
    #[serde(default)]
    pub other: BTreeMap<String, String>,
}

fn one_u32() -> u32 {
    1
}

/// Configuration errors: the message says what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid configuration")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Known `other` keys with their validators.
pub const SETTINGS: &[(&str, &str)] = &[
    (
        "pmd-rx-mode",
        "how PMDs wait for packets: adaptive (poll while busy, sleep on guest kicks when \
         idle; default), poll (always busy), interrupt (sleep whenever idle)",
    ),
    (
        "pmd-sleep-after-us",
        "adaptive mode: idle microseconds before a PMD sleeps (0..=1000000, default 300)",
    ),
    (
        "pmd-sleep-max-us",
        "load-based sleep: a PMD whose queues give less than half a burst sleeps up to this \
         many microseconds per iteration (0..=10000, default 0: off; as OVS pmd-maxsleep)",
    ),
    (
        "pmd-quiet-rxq-poll-us",
        "while a PMD is busy, how often it polls its rx queues that had no packet for 1 ms \
         (0..=1000 microseconds, default 50; 0: every queue every iteration)",
    ),
    (
        "pmd-priority",
        "PMD thread scheduling: normal (default), nice:N (-20..=19) or fifo:N (SCHED_FIFO \
         priority 1..=99; needs CAP_SYS_NICE)",
    ),
    (
        "pmd-rxq-assign",
        "how rx queues are dealt over PMDs: cycles (by measured load, busiest first, in \
         turn; default), roundrobin (in port order) or group (each to the least loaded PMD); \
         as OVS pmd-rxq-assign",
    ),
    (
        "pmd-auto-lb",
        "true: reassign rx queues by load when a PMD is overloaded and it helps (default \
         false; as OVS pmd-auto-lb)",
    ),
    (
        "pmd-auto-lb-load-threshold",
        "auto load balance: PMD load % that counts as overloaded (0..=100, default 95)",
    ),
    (
        "pmd-auto-lb-improvement-threshold",
        "auto load balance: least % by which the PMDs' load variance must improve \
         (0..=100, default 25)",
    ),
    (
        "pmd-auto-lb-rebal-interval",
        "auto load balance: least minutes between two reassignments (0..=20000, default 1)",
    ),
    (
        "mac-aging",
        "seconds a learned MAC address stays valid (1..=86400, default 300)",
    ),
    (
        "mac-table-size",
        "entries per bridge MAC table (64..=1048576, default 8192)",
    ),
    (
        "flow-limit",
        "most megaflow cache entries per bridge (1..=10000000, default 200000; as OVS \
         flow-limit)",
    ),
    (
        "flow-max-idle",
        "seconds an unused megaflow stays cached (1..=3600, default 10; as OVS max-idle)",
    ),
    (
        "emc-insert-inv-prob",
        "exact-match cache insertion probability is 1 in this (0..=4294967295, default \
         100; 0 disables the EMC; as OVS emc-insert-inv-prob)",
    ),
    (
        "ct-max-entries",
        "most tracked connections in all (1..=100000000, default 1000000)",
    ),
    (
        "ct-zone-default-limit",
        "most tracked connections per zone without a limit of its own (0..=4294967294, \
         default 0: unlimited; as ovs-dpctl ct-set-limits default=N)",
    ),
    (
        "ct-zone-limit:ZONE",
        "most tracked connections in ZONE (0..=65535): 0..=4294967294 (0: unlimited) or \
         default (the default limit applies); as ovs-dpctl ct-set-limits zone=Z,limit=N",
    ),
    (
        "ct-timeout-NAME",
        "seconds a connection lives without packets, per state (1..=31536000): NAME is \
         tcp-syn-sent, tcp-syn-recv, tcp-established, tcp-fin-wait, tcp-close-wait, \
         tcp-last-ack, tcp-time-wait, tcp-close, tcp-syn-sent2, tcp-retrans, tcp-unack, \
         udp-unreplied, udp-replied, icmp or generic (defaults: Linux's)",
    ),
    (
        "vhost-packed-rings",
        "offer packed virtqueues (VIRTIO_F_RING_PACKED) to vhost-user frontends that connect \
         from now on: true or false (default true; a frontend takes them only when it asks: \
         QEMU packed=on, DPDK virtio-user packed_vq=1)",
    ),
];

/// Largest `ct-max-entries`.
pub const CT_MAX_ENTRIES: u32 = 100_000_000;
/// Longest `ct-timeout-*` (a year).
pub const CT_MAX_TIMEOUT: u32 = 31_536_000;
/// A limit of this or more is no limit (the tracker's largest).
pub const CT_UNLIMITED: u32 = u32::MAX - 1;

/// `ct-zone-limit:ZONE`'s zone.
fn ct_zone_of(k: &str) -> Result<u16, ConfigError> {
    let z = k.strip_prefix("ct-zone-limit:").unwrap_or(k);
    z.parse().map_err(|_| {
        ConfigError::Invalid(format!(
            "{k}: '{z}' is not a conntrack zone (ct-zone-limit:ZONE with ZONE in 0..=65535)"
        ))
    })
}

/// A `ct-zone-limit:ZONE` value: Some(limit, 0 meaning unlimited) or None (`default`).
fn ct_zone_limit_value(k: &str, v: &str) -> Result<Option<u32>, ConfigError> {
    if v == "default" {
        return Ok(None);
    }
    match v.parse::<u32>() {
        Ok(n) if n <= CT_UNLIMITED => Ok(Some(n)),
        _ => Err(ConfigError::Invalid(format!(
            "{k}={v}: expected an integer in 0..={CT_UNLIMITED} (0: unlimited) or default"
        ))),
    }
}

/// The connection tracker's configuration and zone limits the `ct-*` settings ask for
/// (validated settings; anything else is left at its default). Limits of 0 mean unlimited.
pub fn conntrack_settings(
    other: &BTreeMap<String, String>,
) -> (ferrovs_conntrack::Config, Vec<(u16, u32)>) {
    let mut cfg = ferrovs_conntrack::Config::default();
    let mut zones = Vec::new();
    let num = |v: &str| v.parse::<u32>().ok();
    for (k, v) in other.iter().filter(|(k, _)| k.starts_with("ct-")) {
        if k == "ct-max-entries" {
            cfg.max_entries = num(v).unwrap_or(cfg.max_entries);
        } else if k == "ct-zone-default-limit" {
            cfg.default_zone_limit = num(v).filter(|n| *n != 0);
        } else if let Some(name) = k.strip_prefix("ct-timeout-") {
            if let Some(n) = num(v) {
                cfg.set_timeout(name, n);
            }
        } else if k.starts_with("ct-zone-limit:") {
            if let (Ok(z), Ok(Some(l))) = (ct_zone_of(k), ct_zone_limit_value(k, v)) {
                zones.push((z, if l == 0 { CT_UNLIMITED } else { l }));
            }
        }
    }
    (cfg, zones)
}

impl Config {
    /// The embedded default: bridge br0 with vhost-user server ports vm1 and vm2.
    pub fn default_for(run_dir: &Path) -> Config {
        let port = |n: &str| PortConfig {
            path: Some(run_dir.join(format!("{n}.sock"))),
            ..PortConfig::new(n, PortType::VhostUser)
        };
        Config {
            version: 1,
            bridges: vec![BridgeConfig {
                name: "br0".into(),
                ports: vec![port("vm1"), port("vm2")],
                flows: None,
                ..Default::default()
            }],
            pmd_cores: vec![],
            other: BTreeMap::new(),
        }
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.into(),
            source: e,
        })?;
        let c: Config = serde_json::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            source: e,
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Writes atomically: a crash leaves either the old or the new file, never a torn one.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let err = |e| ConfigError::Write {
            path: path.into(),
            source: e,
        };
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_string_pretty(self).map_err(|e| err(e.into()))?;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(text.as_bytes()).map_err(err)?;
        f.write_all(b"\n").map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)?;
        if let Some(dir) = path.parent() {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// `vhost-packed-rings`: whether vhost-user ports offer packed rings (default: yes, as
    /// DPDK's vhost library does; a frontend takes them only when it asks, QEMU with
    /// `packed=on`, DPDK virtio-user with `packed_vq=1`).
    pub fn packed_rings(&self) -> bool {
        self.other
            .get("vhost-packed-rings")
            .is_none_or(|v| v == "true")
    }

    pub fn setting_u32(&self, key: &str, default: u32) -> u32 {
        self.other
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// Checks names, paths, VLANs and settings; the error names the offending item.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        if self.version != 1 {
            return bad(format!(
                "configuration version {} is not supported (expected 1)",
                self.version
            ));
        }
        let mut names = std::collections::HashSet::new();
        let mut paths = std::collections::HashSet::new();
        let mut devs = std::collections::HashSet::new();
        let mut bridges = std::collections::HashSet::new();
        for b in &self.bridges {
            validate_name("bridge", &b.name)?;
            if !bridges.insert(&b.name) {
                return bad(format!("bridge {} defined twice", b.name));
            }
            b.validate_openflow()?;
            if let Some(flows) = &b.flows {
                crate::flows::BridgeRules::from_texts(flows).map_err(|e| {
                    ConfigError::Invalid(format!("bridge {}: {e}: {}", b.name, e.source))
                })?;
            }
            for m in &b.meters {
                ferrovs_flow::meter::parse_meter(m).map_err(|e| {
                    ConfigError::Invalid(format!("bridge {}: meter '{m}': {e}", b.name))
                })?;
            }
            for p in &b.ports {
                validate_port(p)?;
                if !names.insert(&p.name) {
                    return bad(format!("port {} defined twice", p.name));
                }
                if let Some(dev) = p.dev.as_ref().filter(|_| p.kind.is_kernel()) {
                    if !devs.insert(dev) {
                        return bad(format!("port {}: dev {dev} used twice", p.name));
                    }
                }
                if let Some(path) = &p.path {
                    if !paths.insert(path) {
                        return bad(format!(
                            "port {}: socket path {} used twice",
                            p.name,
                            path.display()
                        ));
                    }
                }
            }
        }
        for (k, v) in &self.other {
            validate_setting(k, v)?;
        }
        Ok(())
    }
}

pub fn validate_name(what: &str, n: &str) -> Result<(), ConfigError> {
    let ok = !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{what} name '{n}' is invalid (1-64 characters of letters, digits, '-', '_', '.')"
        )))
    }
}

pub fn validate_port(p: &PortConfig) -> Result<(), ConfigError> {
    let bad = |s: String| Err(ConfigError::Invalid(format!("port {}: {s}", p.name)));
    validate_name("port", &p.name)?;
    if let Some(a) = &p.pmd_rxq_affinity {
        if let Err(e) = ferrovs_datapath::rxq::parse_affinity(a, p.rx_pairs()) {
            return bad(e);
        }
    }
    if p.queues == 0 || p.queues as usize > ferrovs_vhost::features::MAX_QUEUE_PAIRS {
        return bad(format!(
            "queues={} out of range 1..={}",
            p.queues,
            ferrovs_vhost::features::MAX_QUEUE_PAIRS
        ));
    }
    if let Some(t) = p.tag {
        if t == 0 || t > 4094 {
            return bad(format!("tag={t} out of range 1..=4094"));
        }
        if !p.trunks.is_empty() {
            return bad("tag and trunks are exclusive".into());
        }
    }
    if let Some(n) = p.ofport.filter(|n| *n == 0 || *n > OFPORT_MAX) {
        return bad(format!("ofport={n} out of range 1..={OFPORT_MAX}"));
    }
    if let Some(t) = p.trunks.iter().find(|t| **t == 0 || **t > 4094) {
        return bad(format!("trunk VLAN {t} out of range 1..=4094"));
    }
    match p.kind {
        PortType::VhostUser | PortType::VhostUserClient => match &p.path {
            None => return bad("path=SOCKET is required for vhost-user ports".into()),
            Some(path) if path.as_os_str().len() >= 108 => {
                return bad(format!(
                    "socket path {} is longer than 107 bytes",
                    path.display()
                ))
            }
            Some(_) => {}
        },
        PortType::Vxlan | PortType::Geneve => {
            let kind = p.kind.name();
            if p.remote_ip.is_none() {
                return bad(format!("remote_ip=IPV4 is required for {kind} ports"));
            }
            if p.key_flow && p.key.is_some() {
                return bad("key=flow and key=VNI are exclusive".into());
            }
            if p.key.is_some_and(|k| k > 0x00ff_ffff) {
                return bad(format!(
                    "key={}: a VNI is 24 bits (0..=16777215)",
                    p.key.unwrap_or(0)
                ));
            }
            if p.dst_port == Some(0) {
                let d = if p.kind == PortType::Geneve {
                    6081
                } else {
                    4789
                };
                return bad(format!("dst_port=0: give a UDP port (default {d})"));
            }
            if p.path.is_some() || p.dev.is_some() {
                return bad(format!(
                    "{kind} ports take remote_ip, key, local_ip, dst_port and csum, not path or dev"
                ));
            }
            if p.queues != 1 {
                return bad(format!("queues={}: {kind} ports have one queue", p.queues));
            }
        }
        PortType::Tap | PortType::Uplink => {
            let kind = p.kind.name();
            let Some(dev) = &p.dev else {
                return bad(format!("dev=NETDEV is required for {kind} ports"));
            };
            if let Err(e) = ferrovs_sys::kernel::netdev::check_name(dev) {
                return bad(format!("dev={dev}: {e}"));
            }
            if let Some(path) = &p.path {
                return bad(format!(
                    "path={} is for vhost-user ports; {kind} ports take dev=NETDEV",
                    path.display()
                ));
            }
            if p.queues != 1 {
                return bad(format!(
                    "queues={}: {kind} ports have one queue (multiqueue is not supported yet)",
                    p.queues
                ));
            }
        }
    }
    if !p.kind.is_tunnel()
        && (p.remote_ip.is_some()
            || p.local_ip.is_some()
            || p.key.is_some()
            || p.key_flow
            || p.csum.is_some()
            || p.dst_port.is_some())
    {
        return bad(format!(
            "remote_ip, local_ip, key, csum and dst_port are for tunnel ports, not {}",
            p.kind.name()
        ));
    }
    let c = p.coalesce();
    if c.usecs > MAX_COALESCE_USECS {
        return bad(format!(
            "coalesce-usecs={} out of range 0..={MAX_COALESCE_USECS}",
            c.usecs
        ));
    }
    if c.frames > MAX_COALESCE_FRAMES {
        return bad(format!(
            "coalesce-frames={} out of range 0..={MAX_COALESCE_FRAMES}",
            c.frames
        ));
    }
    if c.frames > 0 && c.usecs == 0 {
        return bad(format!(
            "coalesce-frames={} needs coalesce-usecs (the bound on how long a notification \
             may wait)",
            c.frames
        ));
    }
    if (c.usecs > 0 || c.frames > 0) && p.kind.is_kernel() {
        return bad(format!(
            "coalescing is for vhost-user ports (a {} port is notified by the kernel)",
            p.kind.name()
        ));
    }
    if let (Some(m), false) = (p.mode, p.kind == PortType::Uplink) {
        return bad(format!(
            "mode={} is for uplink ports (a {} port has one way to attach)",
            m.name(),
            p.kind.name()
        ));
    }
    Ok(())
}

pub fn validate_setting(k: &str, v: &str) -> Result<(), ConfigError> {
    let range = |lo: u32, hi: u32| match v.parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(()),
        _ => Err(ConfigError::Invalid(format!(
            "{k}={v}: expected an integer in {lo}..={hi}"
        ))),
    };
    match k {
        "mac-aging" => range(1, 86400),
        "mac-table-size" => range(64, 1 << 20),
        "pmd-sleep-after-us" => range(0, 1_000_000),
        "pmd-sleep-max-us" => range(0, 10_000),
        "pmd-quiet-rxq-poll-us" => range(0, 1000),
        "flow-limit" => range(1, 10_000_000),
        "flow-max-idle" => range(1, 3600),
        "emc-insert-inv-prob" => range(0, u32::MAX),
        "ct-max-entries" => range(1, CT_MAX_ENTRIES),
        "ct-zone-default-limit" => range(0, CT_UNLIMITED),
        _ if k.starts_with("ct-zone-limit:") => {
            ct_zone_of(k)?;
            ct_zone_limit_value(k, v).map(|_| ())
        }
        _ if k.starts_with("ct-timeout-") => {
            let name = &k["ct-timeout-".len()..];
            if ferrovs_conntrack::TIMEOUT_NAMES.contains(&name) {
                range(1, CT_MAX_TIMEOUT)
            } else {
                Err(ConfigError::Invalid(format!(
                    "unknown conntrack timeout '{name}' in {k} (known: {})",
                    ferrovs_conntrack::TIMEOUT_NAMES.join(", ")
                )))
            }
        }
        "pmd-priority" => parse_priority(v).map(|_| ()),
        "pmd-rxq-assign" => match ferrovs_datapath::rxq::AssignMode::parse(v) {
            Some(_) => Ok(()),
            None => Err(ConfigError::Invalid(format!(
                "{k}={v}: expected cycles, roundrobin or group"
            ))),
        },
        "pmd-auto-lb" | "vhost-packed-rings" => match v {
            "true" | "false" => Ok(()),
            _ => Err(ConfigError::Invalid(format!(
                "{k}={v}: expected true or false"
            ))),
        },
        "pmd-auto-lb-load-threshold" | "pmd-auto-lb-improvement-threshold" => range(0, 100),
        "pmd-auto-lb-rebal-interval" => range(0, 20_000),
        "pmd-rx-mode" => match v {
            "adaptive" | "poll" | "interrupt" => Ok(()),
            _ => Err(ConfigError::Invalid(format!(
                "{k}={v}: expected adaptive, poll or interrupt"
            ))),
        },
        _ => Err(ConfigError::Invalid(format!(
            "unknown setting '{k}' (known: {})",
            SETTINGS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Parses `pmd-priority`: `normal`, `nice:N` or `fifo:N`; `None` for normal (the thread is
/// left as created).
pub fn parse_priority(v: &str) -> Result<Option<ferrovs_sys::os::ThreadPriority>, ConfigError> {
    use ferrovs_sys::os::ThreadPriority;
    let bad = || {
        ConfigError::Invalid(format!(
            "pmd-priority={v}: expected normal, nice:N (-20..=19) or fifo:N (1..=99)"
        ))
    };
    if v == "normal" {
        return Ok(None);
    }
    let (kind, n) = v.split_once(':').ok_or_else(bad)?;
    let n: i32 = n.parse().map_err(|_| bad())?;
    match kind {
        "nice" if (-20..=19).contains(&n) => Ok(Some(ThreadPriority::Nice(n))),
        "fifo" if (1..=99).contains(&n) => Ok(Some(ThreadPriority::Fifo(n))),
        _ => Err(bad()),
    }
}

/// Parses a core list such as `1`, `0,2`, `2-5`.
pub fn parse_cores(s: &str) -> Result<Vec<usize>, ConfigError> {
    let bad = || ConfigError::Invalid(format!("core list '{s}' is invalid (e.g. 1 or 0,2 or 2-5)"));
    let mut v = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b || b >= 1024 {
                    return Err(bad());
                }
                v.extend(a..=b);
            }
            None => v.push(part.trim().parse().map_err(|_| bad())?),
        }
    }
    v.sort_unstable();
    v.dedup();
    if v.is_empty() || v.iter().any(|c| *c >= 1024) {
        return Err(bad());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_round_trips() {
        let dir = std::env::temp_dir().join(format!("ferrovs-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Config::default_for(&dir);
        c.validate().unwrap();
        let f = dir.join("c.json");
        c.save(&f).unwrap();
        assert_eq!(Config::load(&f).unwrap(), c);
        std::fs::write(&f, "{ not json").unwrap();
        assert!(matches!(Config::load(&f), Err(ConfigError::Parse { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_bad_values_with_precise_messages() {
        let mut c = Config::default_for(Path::new("/tmp"));
        c.bridges[0].ports[1].path = c.bridges[0].ports[0].path.clone();
        assert!(c.validate().unwrap_err().to_string().contains("used twice"));
        let mut c = Config::default_for(Path::new("/tmp"));
        c.bridges[0].ports[0].tag = Some(5000);
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "port vm1: tag=5000 out of range 1..=4094"
        );
        let mut c = Config::default_for(Path::new("/tmp"));
        c.bridges[0].ports[0].queues = 0;
        assert!(c.validate().unwrap_err().to_string().contains("queues=0"));
        assert!(validate_setting("mac-aging", "0").is_err());
        assert!(validate_setting("nope", "1")
            .unwrap_err()
            .to_string()
            .contains("unknown setting"));
        assert_eq!(parse_cores("0,2-3").unwrap(), vec![0, 2, 3]);
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("x").is_err());
        assert!(PortType::parse("vhost").is_err());
    }

    #[test]
    fn conntrack_settings_are_checked_and_applied() {
        let err = |k: &str, v: &str| validate_setting(k, v).unwrap_err().to_string();
        assert_eq!(
            err("ct-max-entries", "0"),
            "ct-max-entries=0: expected an integer in 1..=100000000"
        );
        assert_eq!(
            err("ct-zone-limit:70000", "5"),
            "ct-zone-limit:70000: '70000' is not a conntrack zone (ct-zone-limit:ZONE with \
             ZONE in 0..=65535)"
        );
        assert_eq!(
            err("ct-zone-limit:5", "lots"),
            "ct-zone-limit:5=lots: expected an integer in 0..=4294967294 (0: unlimited) or \
             default"
        );
        assert!(err("ct-timeout-tcp-establised", "5")
            .starts_with("unknown conntrack timeout 'tcp-establised' in ct-timeout-tcp-establised (known: tcp-syn-sent,"));
        assert_eq!(
            err("ct-timeout-udp-replied", "0"),
            "ct-timeout-udp-replied=0: expected an integer in 1..=31536000"
        );
        for (k, v) in [
            ("ct-max-entries", "5000"),
            ("ct-zone-default-limit", "100"),
            ("ct-zone-limit:5", "10"),
            ("ct-zone-limit:6", "0"),
            ("ct-zone-limit:7", "default"),
            ("ct-timeout-tcp-established", "3600"),
        ] {
            validate_setting(k, v).unwrap();
        }
        let other: BTreeMap<String, String> = [
            ("ct-max-entries", "5000"),
            ("ct-zone-default-limit", "100"),
            ("ct-zone-limit:5", "10"),
            ("ct-zone-limit:6", "0"),
            ("ct-zone-limit:7", "default"),
            ("ct-timeout-tcp-established", "3600"),
            ("mac-aging", "10"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (cfg, zones) = conntrack_settings(&other);
        assert_eq!(cfg.max_entries, 5000);
        assert_eq!(cfg.default_zone_limit, Some(100));
        assert_eq!(cfg.tcp.timeouts.established, 3600);
        assert_eq!(zones, vec![(5, 10), (6, CT_UNLIMITED)]);
        let (cfg, zones) = conntrack_settings(&BTreeMap::new());
        assert_eq!(cfg, ferrovs_conntrack::Config::default());
        assert!(zones.is_empty());
    }

    #[test]
    fn coalescing_and_priority_settings_are_checked() {
        let opts = |o: &[&str]| {
            let v: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            crate::options::port_from_options("p", &v).map_err(|e| e.to_string())
        };
        let p = opts(&[
            "type=vhost-user",
            "path=/tmp/p",
            "coalesce-usecs=50",
            "coalesce-frames=32",
        ])
        .unwrap();
        assert_eq!((p.coalesce().usecs, p.coalesce().frames), (50, 32));
        let e = opts(&["type=vhost-user", "path=/tmp/p", "coalesce-frames=32"]).unwrap_err();
        assert!(e.contains("needs coalesce-usecs"), "{e}");
        let e = opts(&["type=vhost-user", "path=/tmp/p", "coalesce-usecs=20000"]).unwrap_err();
        assert!(e.contains("out of range 0..=10000"), "{e}");
        let e = opts(&["type=vhost-user", "path=/tmp/p", "coalesce-usecs=-1"]).unwrap_err();
        assert!(e.contains("not a number"), "{e}");
        let e = opts(&["type=tap", "dev=t0", "coalesce-usecs=50"]).unwrap_err();
        assert!(e.contains("for vhost-user ports"), "{e}");
        let mut p = p;
        let set = |p: &mut PortConfig, o: &str| {
            crate::options::port_set_options(p, &[o.to_string()]).map_err(|e| e.to_string())
        };
        set(&mut p, "coalesce-usecs=0").unwrap_err(); // frames 32 left without a bound
        set(&mut p, "coalesce-frames=0").unwrap();
        set(&mut p, "coalesce-usecs=0").unwrap();
        assert!(!p.coalesce().is_on());
        let e = set(&mut p, "tag=5").unwrap_err();
        assert!(e.contains("cannot be changed on a live port"), "{e}");

        // Rx queue pins: add-port and set-port, checked against the port's queues.
        let q = opts(&[
            "type=vhost-user",
            "path=/tmp/q",
            "queues=2",
            "pmd-rxq-affinity=0:1,1:0",
        ])
        .unwrap();
        assert_eq!(q.rxq_affinity(), vec![(0, 1), (1, 0)]);
        let e = opts(&["type=vhost-user", "path=/tmp/q", "pmd-rxq-affinity=1:0"]).unwrap_err();
        assert_eq!(
            e,
            "port p: pmd-rxq-affinity: queue 1 in '1:0' does not exist (the port has 1)"
        );
        let e = opts(&["type=tap", "dev=t0", "pmd-rxq-affinity=0-1"]).unwrap_err();
        assert_eq!(e, "port p: pmd-rxq-affinity: '0-1' is not QUEUE:CORE");
        let mut q = q;
        let e = set(&mut q, "pmd-rxq-affinity=0:x").unwrap_err();
        assert!(e.contains("core 'x' in '0:x' is not a number"), "{e}");
        set(&mut q, "pmd-rxq-affinity=").unwrap();
        assert_eq!(q.pmd_rxq_affinity, None);

        use ferrovs_sys::os::ThreadPriority;
        assert_eq!(parse_priority("normal").unwrap(), None);
        assert_eq!(
            parse_priority("fifo:50").unwrap(),
            Some(ThreadPriority::Fifo(50))
        );
        assert_eq!(
            parse_priority("nice:-5").unwrap(),
            Some(ThreadPriority::Nice(-5))
        );
        for bad in ["fifo:0", "fifo:100", "nice:20", "rt:5", "fifo", "high"] {
            assert!(parse_priority(bad).is_err(), "{bad}");
            assert!(validate_setting("pmd-priority", bad).is_err(), "{bad}");
        }
        assert!(validate_setting("pmd-sleep-max-us", "500").is_ok());
        assert!(validate_setting("pmd-sleep-max-us", "10001").is_err());
        assert!(validate_setting("pmd-quiet-rxq-poll-us", "0").is_ok());
        assert!(validate_setting("pmd-quiet-rxq-poll-us", "1000").is_ok());
        assert!(validate_setting("pmd-quiet-rxq-poll-us", "1001").is_err());
        assert!(validate_setting("pmd-quiet-rxq-poll-us", "-1").is_err());
        for m in ["cycles", "roundrobin", "group"] {
            assert!(validate_setting("pmd-rxq-assign", m).is_ok());
        }
        assert_eq!(
            validate_setting("pmd-rxq-assign", "busiest")
                .unwrap_err()
                .to_string(),
            "pmd-rxq-assign=busiest: expected cycles, roundrobin or group"
        );
        assert!(validate_setting("pmd-auto-lb", "yes").is_err());
        assert!(validate_setting("pmd-auto-lb-load-threshold", "101").is_err());
        assert!(validate_setting("pmd-auto-lb-rebal-interval", "20000").is_ok());
    }

    #[test]
    fn kernel_ports_need_a_valid_dev() {
        let port = |kind, dev: Option<&str>| PortConfig {
            dev: dev.map(String::from),
            ..PortConfig::new("k", kind)
        };
        let err = |p: &PortConfig| validate_port(p).unwrap_err().to_string();
        assert!(validate_port(&port(PortType::Tap, Some("fvtap0"))).is_ok());
        assert!(validate_port(&port(PortType::Uplink, Some("eth0"))).is_ok());
        assert_eq!(
            err(&port(PortType::Tap, None)),
            "port k: dev=NETDEV is required for tap ports"
        );
        assert_eq!(
            err(&port(PortType::Uplink, Some("a234567890123456"))),
            "port k: dev=a234567890123456: network device name 'a234567890123456' is longer \
             than 15 bytes"
        );
        assert!(err(&port(PortType::Uplink, Some("a/b"))).contains("is invalid"));
        let mut p = port(PortType::Tap, Some("t0"));
        p.queues = 2;
        assert!(err(&p).contains("queues=2: tap ports have one queue"));
        let mut p = port(PortType::Tap, Some("t0"));
        p.path = Some("/tmp/x".into());
        assert!(err(&p).contains("path=/tmp/x is for vhost-user ports"));
        let mut c = Config::default_for(Path::new("/tmp"));
        c.bridges[0].ports.push(port(PortType::Tap, Some("t0")));
        let mut q = port(PortType::Uplink, Some("t0"));
        q.name = "k2".into();
        c.bridges[0].ports.push(q);
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "port k2: dev t0 used twice"
        );
    }
}
