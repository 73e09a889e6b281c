//! The `Open_vSwitch` database (OVS's `vswitch.ovsschema`) mapped onto our configuration:
//! pure functions, no I/O.
//!
//! [`Tables`] is the part of the database ferrovs reads, as plain typed rows (the daemon's
//! `ovsdb` role fills it from the replica the OVSDB client keeps); [`desired`] turns it into
//! the [`Config`] to run and, for every interface that cannot run, the precise reason
//! (written back to `Interface.error`). A bad row affects its own interface only: the port
//! is left out and every other port is mapped as if it were not there. Nothing here panics
//! on any input: every value a database may hold is either mapped or refused with a reason.
//!
//! The OpenFlow settings (`Bridge.controller`, `fail_mode`, `protocols`,
//! `other_config:datapath-id`, the `Controller` rows) become the same [`BridgeConfig`] fields
//! `ferrovs set-controller` and `set-bridge` set. A bad value (a target that does not parse,
//! a datapath id that is not 16 hexadecimal digits, an unknown protocol) is left out with a
//! precise line in [`Desired::warnings`] and counted in [`Desired::refused_settings`]; the
//! rest of the bridge's settings and every other bridge apply as if it were not there.
//! Columns ferrovs cannot honour (`connection_mode=in-band`, rate limits...) are ignored
//! with a line in [`Desired::notes`].
//!
//! What each column means and what is not supported: `docs/ovsdb.md`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::config::{self, BridgeConfig, Config, FailMode, PortConfig, PortType, OFPORT_MAX};

/// `Interface.type` values ferrovs runs (written to `Open_vSwitch.iface_types`).
pub const IFACE_TYPES: &[&str] = &[
    "dpdkvhostuser",
    "dpdkvhostuserclient",
    "internal",
    "system",
    "tap",
    "vxlan",
    "geneve",
];

/// The only `Bridge.datapath_type` ferrovs runs (written to `Open_vSwitch.datapath_types`).
pub const DATAPATH_TYPE: &str = "netdev";

/// `Datapath.capabilities` of the `netdev` datapath as ferrovs writes it (the keys of
/// ovs-vswitchd.conf.db(5), each `true` only when ferrovs does what the key means; OVS 3.1
/// netdev writes every key, so do we, `false` where ferrovs falls short):
///
/// * `recirc`, `ct_state`, `ct_zone`, `ct_mark`, `ct_label`, `ct_clear`: `ct(table=T)`
///   recirculates, the ct fields are matched and written (docs/conntrack.md);
/// * `ct_state_nat`: the tracker sets `+snat`/`+dnat` and `ct(nat)` runs;
/// * `ct_orig_tuple`: `ct_nw_src`/`ct_nw_dst`/`ct_nw_proto`/`ct_tp_*` for IPv4, and
///   `ct(force)` (`resubmit(,T,ct)` is not supported); `ct_orig_tuple6`: no IPv6 tuple;
/// * `check_pkt_len`: `check_pkt_larger` is decided per packet in the datapath;
/// * `max_hash_alg` 0: a select group hashes the 5-tuple, not symmetrically (1 would be
///   `OVS_HASH_ALG_SYM_L4`); `max_vlan_headers` 1, `max_mpls_depth` 1: the key holds one;
/// * `ct_zero_snat` false: `nat(src=0.0.0.0)` does not mean "only on a port collision";
///   `ct_flush` false: no `NXT_CT_FLUSH` (the 5-tuple flush; `NXT_CT_FLUSH_ZONE` works);
///   `clone` false: no datapath clone (OpenFlow's `clone` runs in place);
///   `ct_timeout`, `ct_eventmask`, `masked_set_action`, `tnl_push_pop`, `trunc`, `nd_ext`,
///   `explicit_drop_action`, `lb_output_action`, `ufid`, `add_mpls`: not implemented.
///
/// ovn-controller reads `ct_zero_snat`, `ct_flush` and `max_hash_alg`: it then keeps its
/// own workarounds for the first two and uses `dp_hash` without the symmetric algorithm.
pub const DATAPATH_CAPABILITIES: &[(&str, &str)] = &[
    ("add_mpls", "false"),
    ("check_pkt_len", "true"),
    ("clone", "false"),
    ("ct_clear", "true"),
    ("ct_eventmask", "false"),
    ("ct_flush", "false"),
    ("ct_label", "true"),
    ("ct_mark", "true"),
    ("ct_orig_tuple", "true"),
    ("ct_orig_tuple6", "false"),
    ("ct_state", "true"),
    ("ct_state_nat", "true"),
    ("ct_timeout", "false"),
    ("ct_zero_snat", "false"),
    ("ct_zone", "true"),
    ("explicit_drop_action", "false"),
    ("lb_output_action", "false"),
    ("masked_set_action", "false"),
    ("max_hash_alg", "0"),
    ("max_mpls_depth", "1"),
    ("max_vlan_headers", "1"),
    ("nd_ext", "false"),
    ("recirc", "true"),
    ("tnl_push_pop", "false"),
    ("trunc", "false"),
    ("ufid", "false"),
];

/// Checks an `--ovsdb` remote: `unix:PATH` or `tcp:IP[:PORT]` (an active connection, as
/// ovs-vswitchd's database argument).
pub fn check_remote(s: &str) -> Result<(), String> {
    s.parse::<ferrovs_ovsdb::Remote>().map(|_| ()).map_err(|e| {
        format!("{e} (ferrovs connects to the server; punix: and ptcp: are the server's side)")
    })
}

/// The root row's columns ferrovs reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootRow {
    pub next_cfg: i64,
    pub other_config: BTreeMap<String, String>,
    /// Bridge row uuids.
    pub bridges: Vec<String>,
}

/// A `Bridge` row's columns ferrovs reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeRow {
    pub name: String,
    pub datapath_type: String,
    pub other_config: BTreeMap<String, String>,
    /// Port row uuids.
    pub ports: Vec<String>,
    /// Controller row uuids (`controller`).
    pub controller: Vec<String>,
    /// `fail_mode` (`None`: unset, standalone).
    pub fail_mode: Option<String>,
    /// `protocols` (empty: every version the switch speaks).
    pub protocols: Vec<String>,
}

/// A `Controller` row's columns ferrovs reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerRow {
    pub target: String,
    /// Milliseconds (the schema's minimum is 1000).
    pub max_backoff: Option<i64>,
    /// Milliseconds; 0 turns the probe off.
    pub inactivity_probe: Option<i64>,
    /// `in-band` or `out-of-band` (`None`: OVS's default, in-band where it applies).
    pub connection_mode: Option<String>,
    /// Columns that are set but that ferrovs does not honour, as `column=value` (filled by
    /// the daemon from `type`, `controller_queue_size`, `controller_rate_limit`,
    /// `controller_burst_limit`, `enable_async_messages`, `local_ip`...).
    pub unsupported: Vec<String>,
}

/// A `Port` row's columns ferrovs reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRow {
    pub name: String,
    pub tag: Option<i64>,
    pub trunks: Vec<i64>,
    pub vlan_mode: Option<String>,
    /// Interface row uuids.
    pub interfaces: Vec<String>,
}

/// An `Interface` row's columns ferrovs reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceRow {
    pub name: String,
    /// `type`.
    pub kind: String,
    pub options: BTreeMap<String, String>,
    /// `other_config` (ferrovs reads `pmd-rxq-affinity`).
    pub other_config: BTreeMap<String, String>,
    pub ofport_request: Option<i64>,
    /// What ferrovs last wrote (kept across restarts as OVS does when nothing is requested).
    pub ofport: Option<i64>,
}

/// The rows ferrovs reads, by uuid (as text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tables {
    /// The `Open_vSwitch` row (`None`: the database has none yet).
    pub root: Option<(String, RootRow)>,
    pub bridges: BTreeMap<String, BridgeRow>,
    pub ports: BTreeMap<String, PortRow>,
    pub interfaces: BTreeMap<String, InterfaceRow>,
    pub controllers: BTreeMap<String, ControllerRow>,
}

/// Which controller of which bridge a `Controller` row is (what its status columns report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerPlacement {
    pub bridge: String,
    /// The target as the bridge's configuration holds it.
    pub target: String,
    /// Why the row does not run (its target is refused), written to `status:last_error`.
    pub error: Option<String>,
}

/// Where a configured interface runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub bridge: String,
    /// The ferrovs port (named as the interface).
    pub port: String,
}

/// What the database asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Bridges and their ports (only `bridges` is meaningful; settings are below).
    pub bridges: Vec<BridgeConfig>,
    /// `other_config:pmd-cpu-mask` (`None`: not set, keep ours).
    pub pmd_cores: Option<Vec<usize>>,
    /// Our settings the database sets (`pmd-sleep-max-us`, `flow-limit`, ...).
    pub settings: BTreeMap<String, String>,
    /// Interface uuid → why it does not run (exactly the interfaces that are refused).
    pub errors: BTreeMap<String, String>,
    /// Interface uuid → the port that runs it.
    pub placed: BTreeMap<String, Placement>,
    /// Port name → the OpenFlow number written last time (a hint kept across restarts).
    pub ofport_hints: BTreeMap<String, u16>,
    /// Bridge name → its row's uuid and `other_config:datapath-id`.
    pub bridge_rows: BTreeMap<String, (String, Option<String>)>,
    /// Controller row uuid → the bridge and controller it is.
    pub controller_rows: BTreeMap<String, ControllerPlacement>,
    /// Problems with values that are not an interface's (unknown settings values...), each a
    /// log line.
    pub warnings: Vec<String>,
    /// OpenFlow values left out because they are bad (each also in `warnings`).
    pub refused_settings: usize,
    /// Columns ferrovs ignores because it cannot do what they ask (logged once, as warnings).
    pub notes: Vec<String>,
}

/// Settings `Open_vSwitch.other_config` carries over, with their conversion to ours.
fn map_setting(key: &str, value: &str) -> Option<Result<(&'static str, String), String>> {
    let num = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("other_config:{key}={v}: not a number"))
    };
    Some(match key {
        "pmd-maxsleep" => num(value).map(|n| ("pmd-sleep-max-us", n.to_string())),
        "flow-limit" => num(value).map(|n| ("flow-limit", n.to_string())),
        // OVS takes milliseconds; our megaflows age in seconds.
        "max-idle" => num(value).map(|ms| ("flow-max-idle", ms.div_ceil(1000).max(1).to_string())),
        "emc-insert-inv-prob" => num(value).map(|n| ("emc-insert-inv-prob", n.to_string())),
        // Rx queue assignment: the same names and values as OVS.
        "pmd-rxq-assign" => Ok(("pmd-rxq-assign", value.trim().to_string())),
        "pmd-auto-lb" => Ok(("pmd-auto-lb", value.trim().to_string())),
        "pmd-auto-lb-load-threshold" => {
            num(value).map(|n| ("pmd-auto-lb-load-threshold", n.to_string()))
        }
        "pmd-auto-lb-improvement-threshold" => {
            num(value).map(|n| ("pmd-auto-lb-improvement-threshold", n.to_string()))
        }
        "pmd-auto-lb-rebal-interval" => {
            num(value).map(|n| ("pmd-auto-lb-rebal-interval", n.to_string()))
        }
        _ => return None,
    })
}

/// Parses `pmd-cpu-mask` (hexadecimal, `0x` optional) into a core list.
pub fn parse_cpu_mask(mask: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("other_config:pmd-cpu-mask={mask}: expected a hexadecimal CPU mask");
    let hex = mask
        .trim()
        .strip_prefix("0x")
        .or_else(|| mask.trim().strip_prefix("0X"))
        .unwrap_or(mask.trim());
    if hex.is_empty() || hex.len() > 256 {
        return Err(bad());
    }
    let mut cores = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let d = c.to_digit(16).ok_or_else(bad)? as usize;
        for b in 0..4 {
            if d & (1 << b) != 0 {
                cores.push(i * 4 + b);
            }
        }
    }
    if cores.is_empty() {
        return Err(format!(
            "other_config:pmd-cpu-mask={mask}: no core set (at least one PMD is needed)"
        ));
    }
    Ok(cores)
}

/// Where `dpdkvhostuser` sockets go: `other_config:vhost-sock-dir` (relative to the run
/// directory, as OVS's is to its run directory), else the run directory.
fn sock_dir(run_dir: &Path, root: Option<&RootRow>) -> Result<PathBuf, String> {
    match root.and_then(|r| r.other_config.get("vhost-sock-dir")) {
        None => Ok(run_dir.to_path_buf()),
        Some(d) if d.split('/').any(|c| c == "..") => Err(format!(
            "other_config:vhost-sock-dir={d}: '..' is not allowed (a directory under the run \
             directory, or an absolute path)"
        )),
        Some(d) => Ok(run_dir.join(d)),
    }
}

/// One interface's port, or why it cannot run.
fn map_interface(
    iface: &InterfaceRow,
    port: &PortRow,
    sock_dir: &Result<PathBuf, String>,
) -> Result<PortConfig, String> {
    let name = iface.name.as_str();
    config::validate_name("interface", name).map_err(|e| e.to_string())?;
    let opt = |k: &str| iface.options.get(k).map(String::as_str);
    let mut p = match iface.kind.as_str() {
        "dpdkvhostuser" => {
            let dir = sock_dir.as_ref().map_err(Clone::clone)?;
            PortConfig {
                path: Some(dir.join(name)),
                ..PortConfig::new(name, PortType::VhostUser)
            }
        }
        "dpdkvhostuserclient" => {
            let Some(path) = opt("vhost-server-path").filter(|p| !p.is_empty()) else {
                return Err(
                    "options:vhost-server-path is required for dpdkvhostuserclient interfaces"
                        .into(),
                );
            };
            PortConfig {
                path: Some(PathBuf::from(path)),
                ..PortConfig::new(name, PortType::VhostUserClient)
            }
        }
        "internal" | "tap" => PortConfig {
            dev: Some(name.into()),
            ..PortConfig::new(name, PortType::Tap)
        },
        "system" | "" => PortConfig {
            dev: Some(name.into()),
            ..PortConfig::new(name, PortType::Uplink)
        },
        "vxlan" => map_tunnel(iface, PortType::Vxlan)?,
        "geneve" => map_tunnel(iface, PortType::Geneve)?,
        "patch" => return Err("patch ports are not supported".into()),
        other => {
            return Err(format!(
                "interface type {other} is not supported (ferrovs runs {})",
                IFACE_TYPES.join(", ")
            ))
        }
    };
    if let Some(n) = opt("n_rxq") {
        let q = n
            .parse::<u16>()
            .map_err(|_| format!("options:n_rxq={n}: not a number"))?;
        if p.kind.is_kernel() && q != 1 {
            return Err(format!(
                "options:n_rxq={n}: {} interfaces have one queue",
                iface.kind
            ));
        }
        p.queues = q;
    }
    if let Some(r) = iface.ofport_request {
        if !(1..=i64::from(OFPORT_MAX)).contains(&r) {
            return Err(format!("ofport_request={r} out of range 1..={OFPORT_MAX}"));
        }
        p.ofport = Some(r as u16);
    }
    match port.vlan_mode.as_deref() {
        None | Some("access") | Some("trunk") => {}
        Some(m) => {
            return Err(format!(
                "port {}: vlan_mode={m} is not supported (access and trunk are)",
                port.name
            ))
        }
    }
    match port.tag {
        Some(t) if !(1..=4094).contains(&t) => {
            return Err(format!("port {}: tag={t} out of range 1..=4094", port.name))
        }
        Some(t) if port.vlan_mode.as_deref() != Some("trunk") => p.tag = Some(t as u16),
        _ => {
            let bad = port.trunks.iter().find(|t| !(1..=4094).contains(*t));
            if let Some(t) = bad {
                return Err(format!(
                    "port {}: trunk VLAN {t} out of range 1..=4094",
                    port.name
                ));
            }
            p.trunks = port.trunks.iter().map(|t| *t as u16).collect();
            p.trunks.sort_unstable();
            p.trunks.dedup();
        }
    }
    config::validate_port(&p).map_err(|e| e.to_string())?;
    Ok(p)
}

/// A `vxlan` or `geneve` interface's options (OVN's tunnels: `remote_ip`, `key=flow`,
/// `csum=true`, maybe `local_ip`).
fn map_tunnel(iface: &InterfaceRow, kind: PortType) -> Result<PortConfig, String> {
    let mut p = PortConfig::new(&iface.name, kind);
    let name = kind.name();
    for (k, v) in &iface.options {
        let ip = || {
            v.parse::<Ipv4Addr>().map_err(|_| {
                if v == "flow" {
                    format!("options:{k}=flow is not supported (give an IPv4 address)")
                } else {
                    format!("options:{k}={v}: not an IPv4 address")
                }
            })
        };
        match k.as_str() {
            "remote_ip" => p.remote_ip = Some(ip()?),
            "local_ip" => p.local_ip = Some(ip()?),
            "key" if v == "flow" => p.key_flow = true,
            "in_key" | "out_key" => {
                return Err(format!(
                    "options:{k} is not supported (key sets both directions)"
                ))
            }
            "csum" => {
                p.csum = Some(match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(format!("options:csum={v}: true or false")),
                })
            }
            "key" => {
                p.key = Some(
                    v.parse::<u32>()
                        .map_err(|_| format!("options:key={v}: not a number"))?,
                )
            }
            "dst_port" => {
                p.dst_port = Some(
                    v.parse::<u16>()
                        .map_err(|_| format!("options:dst_port={v}: not a UDP port"))?,
                )
            }
            "n_rxq" => {}
            other => {
                return Err(format!(
                    "options:{other} is not supported on {name} interfaces (remote_ip, \
                     local_ip, key, csum and dst_port are)"
                ))
            }
        }
    }
    if p.remote_ip.is_none() {
        return Err(format!(
            "options:remote_ip is required for {name} interfaces"
        ));
    }
    Ok(p)
}

/// What the database asks for, with every refused interface's reason. `run_dir` is where
/// `dpdkvhostuser` sockets go by default.
pub fn desired(t: &Tables, run_dir: &Path) -> Desired {
    let mut d = Desired::default();
    let root = t.root.as_ref().map(|(_, r)| r);
    if let Some(r) = root {
        for (k, v) in &r.other_config {
            if k == "pmd-cpu-mask" {
                match parse_cpu_mask(v) {
                    Ok(c) => d.pmd_cores = Some(c),
                    Err(e) => d.warnings.push(e),
                }
                continue;
            }
            match map_setting(k, v) {
                None => {}
                Some(Ok((ours, value))) => match config::validate_setting(ours, &value) {
                    Ok(()) => {
                        d.settings.insert(ours.to_string(), value);
                    }
                    Err(e) => d.warnings.push(format!("other_config:{k}={v}: {e}")),
                },
                Some(Err(e)) => d.warnings.push(e),
            }
        }
    }
    let sock_dir = sock_dir(run_dir, root);
    if let Err(e) = &sock_dir {
        d.warnings.push(e.clone());
    }
    // Only bridges the root row names exist for OVS (others are garbage being collected).
    let bridge_ids: Vec<&String> = root.map(|r| r.bridges.iter().collect()).unwrap_or_default();
    let mut bridge_names = HashSet::new();
    let mut claimed_ifaces = HashSet::new();
    let mut paths = HashSet::new();
    let mut devs = HashSet::new();
    let mut bridges: Vec<(&String, &BridgeRow)> = bridge_ids
        .iter()
        .filter_map(|u| t.bridges.get(*u).map(|b| (*u, b)))
        .collect();
    bridges.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    for (buuid, b) in bridges {
        // Every interface of the bridge, with its port (an interface referenced twice is
        // refused as a second reference of the same row).
        let mut members: Vec<(&String, &InterfaceRow, &PortRow, usize)> = Vec::new();
        for pu in &b.ports {
            let Some(port) = t.ports.get(pu) else {
                continue;
            };
            for iu in &port.interfaces {
                if let Some(i) = t.interfaces.get(iu) {
                    members.push((iu, i, port, port.interfaces.len()));
                }
            }
        }
        let bridge_err = if let Err(e) = config::validate_name("bridge", &b.name) {
            Some(e.to_string())
        } else if !bridge_names.insert(b.name.clone()) {
            Some(format!("bridge {} is defined twice", b.name))
        } else if b.datapath_type != DATAPATH_TYPE {
            let shown = if b.datapath_type.is_empty() {
                "system (the default)"
            } else {
                b.datapath_type.as_str()
            };
            Some(format!(
                "bridge {}: datapath_type {shown} is not supported: ferrovs is a userspace \
                 switch (set datapath_type=netdev)",
                b.name
            ))
        } else {
            None
        };
        if let Some(e) = bridge_err {
            d.warnings.push(e.clone());
            for (iu, ..) in members {
                if claimed_ifaces.insert(iu.clone()) {
                    d.errors.insert(iu.clone(), e.clone());
                }
            }
            continue;
        }
        d.bridge_rows.insert(
            b.name.clone(),
            (buuid.clone(), b.other_config.get("datapath-id").cloned()),
        );
        // Ports whose interface already holds its requested number come first, so that
        // a duplicate request is refused on the interface that asked later.
        members.sort_by_key(|(_, i, ..)| {
            let holds = i.ofport_request.is_some() && i.ofport == i.ofport_request;
            (!holds, i.name.clone())
        });
        let mut requested = BTreeSet::new();
        let mut ports = Vec::new();
        for (iu, i, port, n) in members {
            if !claimed_ifaces.insert(iu.clone()) {
                continue;
            }
            let mapped = if n != 1 {
                Err(format!(
                    "port {}: bonds are not supported (the port has {n} interfaces)",
                    port.name
                ))
            } else {
                map_interface(i, port, &sock_dir).map(|mut p| {
                    // A bad pin list is left out with a warning; the port runs unpinned.
                    if let Some(a) = i.other_config.get("pmd-rxq-affinity") {
                        match ferrovs_datapath::rxq::parse_affinity(a, p.rx_pairs()) {
                            Ok(_) => p.pmd_rxq_affinity = Some(a.clone()),
                            Err(e) => d
                                .warnings
                                .push(format!("interface {}: other_config:{e}", i.name)),
                        }
                    }
                    p
                })
            };
            let checked = mapped.and_then(|p| {
                if let Some(r) = p.ofport {
                    if !requested.insert(r) {
                        return Err(format!(
                            "ofport_request={r} is already requested by another interface \
                             of bridge {}",
                            b.name
                        ));
                    }
                }
                if let Some(path) = p.path.clone() {
                    if !paths.insert(path.clone()) {
                        return Err(format!(
                            "socket path {} is used by another interface",
                            path.display()
                        ));
                    }
                }
                if let Some(dev) = p.dev.clone() {
                    if !devs.insert(dev.clone()) {
                        return Err(format!("network device {dev} is used by another interface"));
                    }
                }
                Ok(p)
            });
            match checked {
                Ok(p) => {
                    if let Some(o) = i.ofport.filter(|o| (1..=i64::from(OFPORT_MAX)).contains(o)) {
                        d.ofport_hints.insert(p.name.clone(), o as u16);
                    }
                    d.placed.insert(
                        iu.clone(),
                        Placement {
                            bridge: b.name.clone(),
                            port: p.name.clone(),
                        },
                    );
                    ports.push(p);
                }
                Err(e) => {
                    d.errors.insert(iu.clone(), e);
                }
            }
        }
        ports.sort_by(|a, b| a.name.cmp(&b.name));
        let mut bc = BridgeConfig {
            name: b.name.clone(),
            ports,
            flows: None,
            ..Default::default()
        };
        map_openflow(b, t, &mut bc, &mut d);
        d.bridges.push(bc);
    }
    d
}

/// The OpenFlow settings of bridge row `b` into `bc` (the fields `ferrovs set-controller`
/// and `set-bridge` set); each bad value is left out, counted and said in `d.warnings`.
fn map_openflow(b: &BridgeRow, t: &Tables, bc: &mut BridgeConfig, d: &mut Desired) {
    let name = &b.name;
    fn bad(d: &mut Desired, line: String) {
        d.refused_settings += 1;
        d.warnings.push(line);
    }
    match b.fail_mode.as_deref() {
        None => {}
        Some(m) => match FailMode::parse(m) {
            Ok(f) => bc.fail_mode = Some(f),
            Err(e) => bad(d, format!("bridge {name}: fail_mode: {e}")),
        },
    }
    for p in &b.protocols {
        match crate::controller::protocol_versions(std::slice::from_ref(p)) {
            Ok(_) => bc.protocols.push(p.clone()),
            Err(e) => bad(d, format!("bridge {name}: protocols: {e}")),
        }
    }
    bc.protocols.sort();
    bc.protocols.dedup();
    if !bc.protocols.is_empty() && !bc.protocols.iter().any(|p| p == "OpenFlow13") {
        d.notes.push(format!(
            "bridge {name}: protocols={} leaves out OpenFlow13, the only version ferrovs \
             speaks: every OpenFlow connection to this bridge fails its HELLO",
            bc.protocols.join(",")
        ));
    }
    if let Some(id) = b.other_config.get("datapath-id") {
        if config::valid_dpid(id) {
            bc.datapath_id = Some(id.trim_start_matches("0x").to_ascii_lowercase());
        } else {
            bad(
                d,
                format!(
                    "bridge {name}: other_config:datapath-id={id}: not 16 hexadecimal digits \
                     (the id derived from the bridge's MAC address is used)"
                ),
            );
        }
    }
    // Controllers, by target (the rows' order in the database means nothing).
    let mut rows: Vec<(&String, &ControllerRow)> = b
        .controller
        .iter()
        .filter_map(|u| t.controllers.get(u).map(|c| (u, c)))
        .collect();
    rows.sort_by(|a, b| (&a.1.target, a.0).cmp(&(&b.1.target, b.0)));
    let mut backoffs = BTreeSet::new();
    let mut probes = BTreeSet::new();
    for (u, c) in rows {
        let placement = |error: Option<String>| ControllerPlacement {
            bridge: name.clone(),
            target: c.target.clone(),
            error,
        };
        if let Err(e) = crate::controller::Target::parse(&c.target) {
            bad(d, format!("bridge {name}: controller: {e}"));
            d.controller_rows
                .insert(u.clone(), placement(Some(e.to_string())));
            continue;
        }
        d.controller_rows.insert(u.clone(), placement(None));
        if bc.controllers.contains(&c.target) {
            // Two rows with one target are one controller (as OVS's).
            continue;
        }
        bc.controllers.push(c.target.clone());
        let ms = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
        if let Some(v) = c.max_backoff {
            backoffs.insert(ms(v));
            if bc.max_backoff_ms.is_none() {
                bc.max_backoff_ms = Some(ms(v));
            }
        }
        match c.inactivity_probe {
            Some(v) if v < 0 => bad(
                d,
                format!(
                    "bridge {name}: controller {}: inactivity_probe={v}: negative",
                    c.target
                ),
            ),
            Some(v) => {
                probes.insert(ms(v));
                if bc.inactivity_probe_ms.is_none() {
                    bc.inactivity_probe_ms = Some(ms(v));
                }
            }
            None => {}
        }
        if c.connection_mode.as_deref() == Some("in-band") {
            d.notes.push(format!(
                "bridge {name}: controller {}: connection_mode=in-band is not supported: \
                 ferrovs reaches controllers out-of-band, through the host's stack",
                c.target
            ));
        }
        for col in &c.unsupported {
            d.notes.push(format!(
                "bridge {name}: controller {}: {col} is not supported (ignored)",
                c.target
            ));
        }
    }
    for (what, set, used) in [
        ("max_backoff", &backoffs, bc.max_backoff_ms),
        ("inactivity_probe", &probes, bc.inactivity_probe_ms),
    ] {
        if set.len() > 1 {
            d.notes.push(format!(
                "bridge {name}: controllers ask for different {what} values ({}); ferrovs has \
                 one per bridge and uses {} (the first controller's, by target)",
                set.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                used.unwrap_or_default()
            ));
        }
    }
}

/// `Bridge.datapath_id`: `other_config:datapath-id` when it is 16 hexadecimal digits, else
/// derived from the bridge's MAC address (`0000` and its 12 digits), as OVS does.
pub fn datapath_id(configured: Option<&str>, mac: Option<[u8; 6]>, bridge: &str) -> String {
    if let Some(c) = configured {
        let c = c.strip_prefix("0x").unwrap_or(c);
        if c.len() == 16 && c.chars().all(|ch| ch.is_ascii_hexdigit()) {
            return c.to_ascii_lowercase();
        }
    }
    let mac = mac.unwrap_or_else(|| {
        // No MAC (no bridge port yet): a stable locally administered address from the name.
        let h = bridge
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
            .to_be_bytes();
        [0x02, h[1], h[2], h[3], h[4], h[5]]
    });
    format!(
        "0000{}",
        mac.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// The settings of `config` the database changes: `Desired` applied to `base`.
pub fn merged_config(base: &Config, d: &Desired) -> Config {
    let mut c = base.clone();
    c.bridges = d.bridges.clone();
    if let Some(p) = &d.pmd_cores {
        c.pmd_cores = p.clone();
    }
    for (k, v) in &d.settings {
        c.other.insert(k.clone(), v.clone());
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A database with bridge `br0` (netdev) holding one port per interface given.
    /// (name, type, options) of one interface.
    type Iface<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    fn db(ifaces: &[Iface]) -> Tables {
        let mut t = Tables::default();
        let mut bridge = BridgeRow {
            name: "br0".into(),
            datapath_type: "netdev".into(),
            ..Default::default()
        };
        for (n, (name, kind, opts)) in ifaces.iter().enumerate() {
            let iu = format!("i{n}");
            let pu = format!("p{n}");
            t.interfaces.insert(
                iu.clone(),
                InterfaceRow {
                    name: name.to_string(),
                    kind: kind.to_string(),
                    options: map(opts),
                    ..Default::default()
                },
            );
            t.ports.insert(
                pu.clone(),
                PortRow {
                    name: name.to_string(),
                    interfaces: vec![iu],
                    ..Default::default()
                },
            );
            bridge.ports.push(pu);
        }
        t.bridges.insert("b0".into(), bridge);
        t.root = Some((
            "root".into(),
            RootRow {
                bridges: vec!["b0".into()],
                ..Default::default()
            },
        ));
        t
    }

    fn ports(d: &Desired) -> Vec<&PortConfig> {
        d.bridges.iter().flat_map(|b| &b.ports).collect()
    }

    #[test]
    fn the_ovs_dpdk_documentation_setup_maps() {
        let t = db(&[
            ("br0", "internal", &[]),
            (
                "vhu0",
                "dpdkvhostuserclient",
                &[("vhost-server-path", "/tmp/vhu0.sock"), ("n_rxq", "2")],
            ),
            ("dpdkvhostuser0", "dpdkvhostuser", &[]),
            ("eth9", "", &[]),
            (
                "vx0",
                "vxlan",
                &[
                    ("remote_ip", "10.0.0.2"),
                    ("key", "42"),
                    ("dst_port", "4790"),
                ],
            ),
        ]);
        let d = desired(&t, Path::new("/run/fv"));
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        let p = ports(&d);
        let by = |n: &str| *p.iter().find(|p| p.name == n).unwrap();
        assert_eq!(by("br0").kind, PortType::Tap);
        assert_eq!(by("br0").dev.as_deref(), Some("br0"));
        assert_eq!(by("vhu0").kind, PortType::VhostUserClient);
        assert_eq!(by("vhu0").queues, 2);
        assert_eq!(
            by("dpdkvhostuser0").path.as_deref(),
            Some(Path::new("/run/fv/dpdkvhostuser0"))
        );
        assert_eq!(by("eth9").kind, PortType::Uplink);
        assert_eq!(by("vx0").remote_ip, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!((by("vx0").key, by("vx0").dst_port), (Some(42), Some(4790)));
        assert_eq!(d.placed.len(), 5);
        let mut c = Config::default_for(Path::new("/run/fv"));
        c.bridges = d.bridges.clone();
        c.validate().unwrap();
    }

    /// The tunnel port ovn-controller 23.03 creates per remote chassis (`encaps.c`:
    /// `type=geneve`, `options:remote_ip`, `key=flow`, `csum=true`, and `local_ip` when the
    /// chassis sets `ovn-encap-ip` for it).
    #[test]
    fn ovn_s_geneve_tunnel_maps() {
        let t = db(&[(
            "ovn-ch2-0",
            "geneve",
            &[
                ("remote_ip", "192.168.50.2"),
                ("key", "flow"),
                ("csum", "true"),
                ("local_ip", "192.168.50.1"),
            ],
        )]);
        let d = desired(&t, Path::new("/run"));
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        let p = ports(&d);
        let g = p[0];
        assert_eq!(g.kind, PortType::Geneve);
        assert_eq!(g.remote_ip, Some(Ipv4Addr::new(192, 168, 50, 2)));
        assert_eq!(g.local_ip, Some(Ipv4Addr::new(192, 168, 50, 1)));
        assert!(g.key_flow);
        assert_eq!((g.key, g.csum, g.dst_port), (None, Some(true), None));
        // A VXLAN port may take key=flow too; in_key/out_key and a bad csum are refused.
        let t = db(&[
            ("v", "vxlan", &[("remote_ip", "10.0.0.2"), ("key", "flow")]),
            (
                "g1",
                "geneve",
                &[("remote_ip", "10.0.0.3"), ("in_key", "flow")],
            ),
            (
                "g2",
                "geneve",
                &[("remote_ip", "10.0.0.4"), ("csum", "yes")],
            ),
            ("g3", "geneve", &[("key", "flow")]),
        ]);
        let d = desired(&t, Path::new("/run"));
        let e = |i: usize| d.errors.get(&format!("i{i}")).cloned().unwrap_or_default();
        assert_eq!(e(0), "");
        assert!(e(1).contains("options:in_key is not supported"), "{}", e(1));
        assert_eq!(e(2), "options:csum=yes: true or false");
        assert_eq!(e(3), "options:remote_ip is required for geneve interfaces");
    }

    #[test]
    fn bad_interfaces_get_precise_errors_and_others_map() {
        let t = db(&[
            ("good", "dpdkvhostuser", &[]),
            ("weird", "gre", &[]),
            ("nopath", "dpdkvhostuserclient", &[]),
            ("vx", "vxlan", &[("key", "5")]),
            ("vxf", "vxlan", &[("remote_ip", "flow")]),
            ("pp", "patch", &[("peer", "x")]),
            ("bad/name", "internal", &[]),
            ("q", "dpdkvhostuser", &[("n_rxq", "x")]),
        ]);
        let d = desired(&t, Path::new("/run"));
        let e = |i: usize| d.errors.get(&format!("i{i}")).cloned().unwrap_or_default();
        assert!(
            e(1).contains("interface type gre is not supported"),
            "{}",
            e(1)
        );
        assert_eq!(
            e(2),
            "options:vhost-server-path is required for dpdkvhostuserclient interfaces"
        );
        assert_eq!(e(3), "options:remote_ip is required for vxlan interfaces");
        assert!(e(4).contains("remote_ip=flow is not supported"), "{}", e(4));
        assert_eq!(e(5), "patch ports are not supported");
        assert!(
            e(6).contains("interface name 'bad/name' is invalid"),
            "{}",
            e(6)
        );
        assert_eq!(e(7), "options:n_rxq=x: not a number");
        assert!(!d.errors.contains_key("i0"));
        assert_eq!(ports(&d).len(), 1);
        assert_eq!(d.errors.len(), 7);
    }

    #[test]
    fn a_bridge_that_is_not_netdev_is_refused_on_each_interface() {
        for (dt, shown) in [("", "system (the default)"), ("system", "system")] {
            let mut t = db(&[("a", "dpdkvhostuser", &[]), ("b", "internal", &[])]);
            t.bridges.get_mut("b0").unwrap().datapath_type = dt.into();
            let d = desired(&t, Path::new("/run"));
            assert!(d.bridges.is_empty());
            assert_eq!(d.errors.len(), 2);
            let e = &d.errors["i0"];
            assert!(
                e.contains(&format!("datapath_type {shown} is not supported")),
                "{e}"
            );
            assert_eq!(d.warnings.len(), 1);
        }
    }

    #[test]
    fn a_duplicate_ofport_request_is_refused_on_the_later_interface() {
        let mut t = db(&[("a", "dpdkvhostuser", &[]), ("b", "dpdkvhostuser", &[])]);
        // `b` asked first and already holds 5; `a` asks for it now.
        for (i, holds) in [("i0", None), ("i1", Some(5))] {
            let r = t.interfaces.get_mut(i).unwrap();
            r.ofport_request = Some(5);
            r.ofport = holds;
        }
        let d = desired(&t, Path::new("/run"));
        assert!(d.errors["i0"].contains("ofport_request=5 is already requested"));
        assert_eq!(ports(&d)[0].name, "b");
        assert_eq!(ports(&d)[0].ofport, Some(5));
        assert_eq!(d.ofport_hints.get("b"), Some(&5));
    }

    #[test]
    fn vlans_bonds_and_shared_sockets() {
        let mut t = db(&[
            ("t", "dpdkvhostuser", &[]),
            ("k", "dpdkvhostuser", &[]),
            ("n", "dpdkvhostuser", &[]),
            ("c1", "dpdkvhostuserclient", &[("vhost-server-path", "/s")]),
            ("c2", "dpdkvhostuserclient", &[("vhost-server-path", "/s")]),
        ]);
        let p = |t: &mut Tables, i: &str| t.ports.get_mut(i).unwrap().clone();
        let mut t0 = p(&mut t, "p0");
        t0.tag = Some(10);
        t0.trunks = vec![20];
        t.ports.insert("p0".into(), t0);
        let mut t1 = p(&mut t, "p1");
        t1.trunks = vec![30, 20, 30];
        t.ports.insert("p1".into(), t1);
        let mut t2 = p(&mut t, "p2");
        t2.vlan_mode = Some("native-tagged".into());
        t2.interfaces.push("i9".into());
        t.interfaces.insert("i9".into(), InterfaceRow::default());
        t.ports.insert("p2".into(), t2);
        let d = desired(&t, Path::new("/run"));
        let ps = ports(&d);
        let by = |n: &str| ps.iter().find(|p| p.name == n).copied();
        assert_eq!(
            (by("t").unwrap().tag, by("t").unwrap().trunks.len()),
            (Some(10), 0)
        );
        assert_eq!(by("k").unwrap().trunks, vec![20, 30]);
        assert!(
            d.errors["i2"].contains("bonds are not supported"),
            "{:?}",
            d.errors
        );
        assert!(by("c1").is_some());
        assert!(d.errors["i4"].contains("socket path /s is used by another interface"));
    }

    #[test]
    fn settings_and_masks() {
        assert_eq!(parse_cpu_mask("0x6").unwrap(), vec![1, 2]);
        assert_eq!(parse_cpu_mask("100").unwrap(), vec![8]);
        assert!(parse_cpu_mask("0").unwrap_err().contains("no core set"));
        assert!(parse_cpu_mask("zz").is_err());
        assert!(parse_cpu_mask("").is_err());
        let mut t = db(&[]);
        t.root.as_mut().unwrap().1.other_config = map(&[
            ("pmd-cpu-mask", "0x2"),
            ("pmd-maxsleep", "50"),
            ("max-idle", "2500"),
            ("flow-limit", "0"),
            ("dpdk-init", "true"),
            ("vhost-sock-dir", "../etc"),
        ]);
        let d = desired(&t, Path::new("/run"));
        assert_eq!(d.pmd_cores, Some(vec![1]));
        assert_eq!(d.settings["pmd-sleep-max-us"], "50");
        assert_eq!(d.settings["flow-max-idle"], "3");
        assert!(!d.settings.contains_key("flow-limit"));
        assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
    }

    #[test]
    fn interface_rxq_affinity_pins_or_warns() {
        let mut t = db(&[
            ("a", "dpdkvhostuser", &[("n_rxq", "2")]),
            ("b", "dpdkvhostuser", &[]),
        ]);
        for (_, i) in t.interfaces.iter_mut() {
            let a = if i.name == "a" { "0:3,1:1" } else { "1:0" };
            i.other_config = map(&[("pmd-rxq-affinity", a)]);
        }
        let d = desired(&t, Path::new("/run"));
        let ps = ports(&d);
        let by = |n: &str| ps.iter().find(|p| p.name == n).copied().unwrap();
        assert_eq!(by("a").pmd_rxq_affinity.as_deref(), Some("0:3,1:1"));
        assert_eq!(by("a").rxq_affinity(), vec![(0, 3), (1, 1)]);
        // b has one queue: its pin list is refused, the port still runs.
        assert_eq!(by("b").pmd_rxq_affinity, None);
        assert_eq!(
            d.warnings,
            vec![
                "interface b: other_config:pmd-rxq-affinity: queue 1 in '1:0' does not exist \
                  (the port has 1)"
                    .to_string()
            ]
        );
    }

    #[test]
    fn rxq_assignment_settings_map_as_ovs_names_them() {
        let mut t = db(&[]);
        t.root.as_mut().unwrap().1.other_config = map(&[
            ("pmd-rxq-assign", "group"),
            ("pmd-auto-lb", "true"),
            ("pmd-auto-lb-load-threshold", "80"),
            ("pmd-auto-lb-improvement-threshold", "10"),
            ("pmd-auto-lb-rebal-interval", "5"),
        ]);
        let d = desired(&t, Path::new("/run"));
        assert_eq!(d.settings["pmd-rxq-assign"], "group");
        assert_eq!(d.settings["pmd-auto-lb"], "true");
        assert_eq!(d.settings["pmd-auto-lb-load-threshold"], "80");
        assert_eq!(d.settings["pmd-auto-lb-improvement-threshold"], "10");
        assert_eq!(d.settings["pmd-auto-lb-rebal-interval"], "5");
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        // A mode OVS does not have is refused with a warning, the rest still applies.
        t.root.as_mut().unwrap().1.other_config =
            map(&[("pmd-rxq-assign", "busiest"), ("pmd-auto-lb", "true")]);
        let d = desired(&t, Path::new("/run"));
        assert!(!d.settings.contains_key("pmd-rxq-assign"));
        assert_eq!(
            d.warnings,
            vec![
                "other_config:pmd-rxq-assign=busiest: pmd-rxq-assign=busiest: expected \
                  cycles, roundrobin or group"
                    .to_string()
            ]
        );
    }

    #[test]
    fn unreferenced_bridges_and_empty_databases() {
        let d = desired(&Tables::default(), Path::new("/run"));
        assert_eq!(d, Desired::default());
        let mut t = db(&[("a", "dpdkvhostuser", &[])]);
        t.root.as_mut().unwrap().1.bridges.clear();
        assert!(desired(&t, Path::new("/run")).bridges.is_empty());
    }

    #[test]
    fn datapath_ids() {
        assert_eq!(
            datapath_id(Some("00000000000000AB"), None, "br0"),
            "00000000000000ab"
        );
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        assert_eq!(
            datapath_id(Some("zz"), Some(mac), "br0"),
            "0000525400010203"
        );
        let a = datapath_id(None, None, "br0");
        assert_eq!(a.len(), 16);
        assert_eq!(a, datapath_id(None, None, "br0"));
        assert_ne!(a, datapath_id(None, None, "br1"));
    }

    /// `db` with controllers on `br0`: (uuid, row).
    fn with_controllers(rows: &[(&str, ControllerRow)]) -> Tables {
        let mut t = db(&[("br0", "internal", &[])]);
        for (u, r) in rows {
            t.controllers.insert(u.to_string(), r.clone());
            t.bridges
                .get_mut("b0")
                .unwrap()
                .controller
                .push(u.to_string());
        }
        t
    }

    fn ctl(target: &str) -> ControllerRow {
        ControllerRow {
            target: target.into(),
            ..Default::default()
        }
    }

    #[test]
    fn openflow_settings_map_to_what_the_cli_sets() {
        let mut t = with_controllers(&[
            (
                "c1",
                ControllerRow {
                    max_backoff: Some(2000),
                    inactivity_probe: Some(0),
                    connection_mode: Some("out-of-band".into()),
                    ..ctl("tcp:127.0.0.1:6653")
                },
            ),
            ("c0", ctl("unix:/run/c.sock")),
        ]);
        let b = t.bridges.get_mut("b0").unwrap();
        b.fail_mode = Some("secure".into());
        b.protocols = vec!["OpenFlow13".into(), "OpenFlow10".into()];
        b.other_config = map(&[
            ("datapath-id", "0000000000000ABC"),
            ("disable-in-band", "true"),
        ]);
        let d = desired(&t, Path::new("/run"));
        let bc = &d.bridges[0];
        assert_eq!(
            bc.controllers,
            vec!["tcp:127.0.0.1:6653", "unix:/run/c.sock"],
            "by target"
        );
        assert_eq!(bc.fail_mode, Some(FailMode::Secure));
        assert_eq!(bc.protocols, vec!["OpenFlow10", "OpenFlow13"]);
        assert_eq!(bc.datapath_id.as_deref(), Some("0000000000000abc"));
        assert_eq!(bc.max_backoff_ms, Some(2000));
        assert_eq!(bc.inactivity_probe_ms, Some(0));
        bc.validate_openflow().unwrap();
        assert_eq!(bc.dpid(), 0xabc);
        assert!(d.warnings.is_empty() && d.notes.is_empty(), "{d:?}");
        assert_eq!(d.refused_settings, 0);
        assert_eq!(d.controller_rows["c0"].target, "unix:/run/c.sock");
        assert_eq!(d.controller_rows["c1"].bridge, "br0");
        // Nothing set: the defaults, as a bridge the CLI made.
        let d = desired(&db(&[("br0", "internal", &[])]), Path::new("/run"));
        let bc = &d.bridges[0];
        assert!(bc.controllers.is_empty() && bc.protocols.is_empty());
        assert_eq!(
            (bc.fail_mode, bc.datapath_id.as_ref(), bc.max_backoff_ms),
            (None, None, None)
        );
    }

    #[test]
    fn bad_openflow_values_are_left_out_counted_and_said() {
        let mut t = with_controllers(&[
            ("c0", ctl("tcp:1.2.3")),
            ("c1", ctl("tcp:127.0.0.1:6653")),
            (
                "c2",
                ControllerRow {
                    inactivity_probe: Some(-5),
                    ..ctl("unix:/x")
                },
            ),
        ]);
        let b = t.bridges.get_mut("b0").unwrap();
        b.fail_mode = Some("loose".into());
        b.protocols = vec!["OpenFlow13".into(), "OpenFlow99".into()];
        b.other_config = map(&[("datapath-id", "abc")]);
        // A second, good bridge is untouched by the first one's values.
        let mut good = t.bridges["b0"].clone();
        good.name = "br1".into();
        good.ports.clear();
        good.controller = vec!["c1".into()];
        good.fail_mode = Some("secure".into());
        good.protocols.clear();
        good.other_config.clear();
        t.bridges.insert("b1".into(), good);
        t.root.as_mut().unwrap().1.bridges.push("b1".into());
        let d = desired(&t, Path::new("/run"));
        let bc = &d.bridges[0];
        assert_eq!(bc.controllers, vec!["tcp:127.0.0.1:6653", "unix:/x"]);
        assert_eq!(bc.fail_mode, None);
        assert_eq!(bc.protocols, vec!["OpenFlow13"]);
        assert_eq!(bc.datapath_id, None);
        assert_eq!(bc.inactivity_probe_ms, None);
        bc.validate_openflow().unwrap();
        assert_eq!(d.refused_settings, 5, "{:?}", d.warnings);
        let w = d.warnings.join("\n");
        for want in [
            "bridge br0: controller: bad controller target 'tcp:1.2.3'",
            "bridge br0: fail_mode: unknown fail-mode 'loose'",
            "bridge br0: protocols: unknown protocol 'OpenFlow99'",
            "bridge br0: other_config:datapath-id=abc: not 16 hexadecimal digits",
            "bridge br0: controller unix:/x: inactivity_probe=-5: negative",
        ] {
            assert!(w.contains(want), "{want} in\n{w}");
        }
        let refused = &d.controller_rows["c0"];
        assert!(refused.error.as_deref().unwrap().contains("bad IP address"));
        assert_eq!(d.controller_rows["c1"].error, None);
        let b1 = &d.bridges[1];
        assert_eq!(
            (b1.name.as_str(), &b1.controllers, b1.fail_mode),
            (
                "br1",
                &vec!["tcp:127.0.0.1:6653".to_string()],
                Some(FailMode::Secure)
            )
        );
        // Bridge br1's row of the shared controller: placed on br1 (the later bridge).
        assert!(d.controller_rows.contains_key("c1"));
    }

    #[test]
    fn what_ferrovs_cannot_do_is_noted_not_refused() {
        let t = with_controllers(&[
            (
                "c0",
                ControllerRow {
                    connection_mode: Some("in-band".into()),
                    max_backoff: Some(4000),
                    inactivity_probe: Some(9000),
                    unsupported: vec!["controller_rate_limit=100".into()],
                    ..ctl("tcp:127.0.0.1:1")
                },
            ),
            (
                "c1",
                ControllerRow {
                    max_backoff: Some(1000),
                    inactivity_probe: Some(9000),
                    ..ctl("tcp:127.0.0.1:2")
                },
            ),
        ]);
        let mut t = t;
        t.bridges.get_mut("b0").unwrap().protocols = vec!["OpenFlow10".into()];
        let d = desired(&t, Path::new("/run"));
        let bc = &d.bridges[0];
        assert_eq!(bc.controllers.len(), 2);
        assert_eq!(bc.max_backoff_ms, Some(4000), "the first by target");
        assert_eq!(bc.inactivity_probe_ms, Some(9000));
        assert_eq!(d.refused_settings, 0);
        let n = d.notes.join("\n");
        for want in [
            "connection_mode=in-band is not supported",
            "controller_rate_limit=100 is not supported (ignored)",
            "different max_backoff values (1000, 4000)",
            "protocols=OpenFlow10 leaves out OpenFlow13",
        ] {
            assert!(n.contains(want), "{want} in\n{n}");
        }
        assert!(!n.contains("inactivity_probe"), "{n}");
        // Two rows with one target are one controller.
        let t = with_controllers(&[
            ("c0", ctl("tcp:127.0.0.1:1")),
            ("c1", ctl("tcp:127.0.0.1:1")),
        ]);
        let d = desired(&t, Path::new("/run"));
        assert_eq!(d.bridges[0].controllers.len(), 1);
        assert_eq!(d.controller_rows.len(), 2);
    }

    #[test]
    fn remotes() {
        assert!(check_remote("unix:/run/openvswitch/db.sock").is_ok());
        assert!(check_remote("tcp:127.0.0.1:6640").is_ok());
        assert!(check_remote("tcp:[::1]:6640").is_ok());
        assert!(check_remote("tcp:127.0.0.1").is_ok());
        for bad in ["unix:", "tcp:1.2.3", "punix:/x", "/x", "ssl:1.2.3.4:6640"] {
            assert!(check_remote(bad).is_err(), "{bad}");
        }
    }
}
