//! Configured through OVSDB (`ferrovsd --ovsdb REMOTE`): the database is the configuration,
//! as it is for ovs-vswitchd.
//!
//! The connection is one more non-blocking source in the epoll loop. Whenever the replica
//! changes (initial sync, any update), the rows are mapped ([`crate::vswitchdb::desired`])
//! and applied to the running daemon as a diff: bridges and ports that are not asked for any
//! more go, new ones come, and a port whose configuration changed is deleted and added again;
//! a port whose row did not change is never touched, whatever else changes. Then one
//! transaction writes back what ovs-vswitchd writes (`cur_cfg`, every interface's `ofport`,
//! `error`, link and status columns, `datapath_id`), only the values that differ from the
//! replica; statistics follow every [`STATS_EVERY`].
//!
//! Robustness: the server going away changes nothing that runs; the daemon reconnects with
//! exponential backoff ([`BACKOFF_MIN`] to [`BACKOFF_MAX`]) and resynchronises. An idle
//! connection is probed with an echo after [`PROBE_IDLE`] and dropped after twice that
//! without a byte. A write-back that fails is retried after [`RETRY`] or at the next change.
//! Malformed input from the server is counted (`show`'s `ovsdb.refused_inputs`) and logged,
//! and costs the connection at worst, never the daemon.

use std::collections::BTreeMap;

use crate::vswitchdb::{self, Desired};

use super::*;

/// First reconnect delay; doubles up to [`BACKOFF_MAX`].
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// An echo goes out after this long without a byte from the server; twice this without
/// one drops the connection.
pub(super) const PROBE_IDLE: Duration = Duration::from_secs(5);
/// Statistics are written back this often.
pub(super) const STATS_EVERY: Duration = Duration::from_secs(5);
/// A failed write-back is sent again after this long (or at the next change).
pub(super) const RETRY: Duration = Duration::from_secs(1);

/// The ovs-vswitchd whose database behaviour ferrovs follows (the schema of its release), and
/// ferrovs's own version as build metadata: `ovs_version` stays a version tools can parse.
pub(super) fn ovs_version() -> String {
    format!("3.1.0+ferrovs.{}", env!("CARGO_PKG_VERSION"))
}

/// The database connection and what the daemon knows of the database.
#[derive(Debug)]
pub(super) struct OvsdbLink {
    /// `unix:PATH` or `tcp:IP:PORT`.
    pub remote: String,
    pub connects: u64,
    pub last_error: Option<String>,
    pub refused_inputs: u64,
    pub refused_interfaces: u64,
    pub txn_failures: u64,
    pub cur_cfg: i64,
}

impl OvsdbLink {
    pub fn new(remote: String) -> OvsdbLink {
        OvsdbLink {
            remote,
            connects: 0,
            last_error: None,
            refused_inputs: 0,
            refused_interfaces: 0,
            txn_failures: 0,
            cur_cfg: 0,
        }
    }

    /// `show`'s view.
    pub fn status(&self) -> ferrovs_proto::reply::OvsdbStatus {
        ferrovs_proto::reply::OvsdbStatus {
            cur_cfg: self.cur_cfg,
            connects: self.connects,
            last_error: self.last_error.clone(),
            refused_interfaces: self.refused_interfaces,
            refused_inputs: self.refused_inputs,
            remote: self.remote.clone(),
            state: "connecting".into(),
            txn_failures: self.txn_failures,
        }
    }
}

/// What ferrovs writes to one `Interface` row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct IfaceReport {
    /// `-1` for an interface that does not run.
    pub ofport: i64,
    pub error: Option<String>,
    pub admin_state: Option<&'static str>,
    pub link_state: Option<&'static str>,
    pub mac_in_use: Option<String>,
    pub status: BTreeMap<String, String>,
}

impl IfaceReport {
    fn failed(error: String) -> IfaceReport {
        IfaceReport {
            ofport: -1,
            error: Some(error),
            ..Default::default()
        }
    }
}

/// A netdev's MAC address from sysfs (`None`: no such device).
pub(super) fn netdev_mac(dev: &str) -> Option<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{dev}/address")).ok()?;
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A netdev's administrative and operational state from sysfs: (IFF_UP, carrier).
fn netdev_state(dev: &str) -> Option<(bool, bool)> {
    let flags = std::fs::read_to_string(format!("/sys/class/net/{dev}/flags")).ok()?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).ok()?;
    let oper = std::fs::read_to_string(format!("/sys/class/net/{dev}/operstate")).ok()?;
    let up = flags & 1 != 0;
    Some((up, up && matches!(oper.trim(), "up" | "unknown")))
}

impl Daemon {
    /// Applies what the database asks for as a diff against what runs; returns the ports
    /// that could not be added (port name → why).
    pub(super) fn apply_desired(&mut self, d: &Desired) -> BTreeMap<String, String> {
        let mut failed = BTreeMap::new();
        self.apply_settings(d);
        let want: HashMap<&str, (&str, &PortConfig)> = d
            .bridges
            .iter()
            .flat_map(|b| {
                b.ports
                    .iter()
                    .map(move |p| (p.name.as_str(), (b.name.as_str(), p)))
            })
            .collect();
        // Ports that go: not asked for, moved to another bridge, or changed (beyond the
        // OpenFlow number asked for, which changes in place).
        let gone: Vec<(String, String)> = self
            .ports
            .values()
            .filter(|st| match want.get(st.cfg.name.as_str()) {
                None => true,
                Some((b, cfg)) => {
                    *b != st.bridge
                        || **cfg
                            != PortConfig {
                                ofport: cfg.ofport,
                                ..st.cfg.clone()
                            }
                }
            })
            .map(|st| (st.bridge.clone(), st.cfg.name.clone()))
            .collect();
        for (b, p) in gone {
            log::info!("ovsdb: deleting port {p} from bridge {b}");
            if let Err(e) = self.del_port(&b, &p) {
                log::error!("ovsdb: deleting port {p}: {e}");
            }
        }
        let bridges: Vec<String> = self
            .bridges
            .keys()
            .filter(|b| !d.bridges.iter().any(|w| &w.name == *b))
            .cloned()
            .collect();
        for b in bridges {
            log::info!("ovsdb: deleting bridge {b}");
            if let Err(e) = self.del_bridge(&b) {
                log::error!("ovsdb: deleting bridge {b}: {e}");
            }
        }
        for b in &d.bridges {
            if !self.bridges.contains_key(&b.name) {
                log::info!("ovsdb: adding bridge {}", b.name);
                if let Err(e) = self.add_bridge(&b.name) {
                    let e = with_sources(&e);
                    log::error!("ovsdb: {e}");
                    for p in &b.ports {
                        failed.insert(p.name.clone(), e.clone());
                    }
                    continue;
                }
            }
            // The bridge's own port first: it is OFPP_LOCAL and never takes a number.
            let mut ports: Vec<&PortConfig> = b.ports.iter().collect();
            ports.sort_by_key(|p| p.name != b.name);
            for p in ports {
                if let Some(st) = self.ports.get(&p.name) {
                    if st.cfg.ofport != p.ofport {
                        self.renumber(&p.name, p.ofport);
                    }
                    continue;
                }
                self.ofport_hint = d.ofport_hints.get(&p.name).copied();
                let res = self.add_port(&b.name, p.clone());
                self.ofport_hint = None;
                match res {
                    Ok(()) => log::info!("ovsdb: added port {} to bridge {}", p.name, b.name),
                    Err(e) => {
                        let e = with_sources(&e);
                        limited!(self.logs, Error, &p.name, "ovsdb-add", "ovsdb: {e}");
                        failed.insert(p.name.clone(), e);
                    }
                }
            }
        }
        failed
    }

    /// `pmd-cpu-mask` and the other settings the database carries; a setting the database
    /// no longer sets goes back to its default.
    fn apply_settings(&mut self, d: &Desired) {
        if let Some(cores) = &d.pmd_cores {
            if *cores != self.config.pmd_cores {
                let list = cores
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                if let Err(e) = self.config_set("pmd-cores", &list) {
                    limited!(
                        self.logs,
                        Error,
                        "-",
                        "ovsdb-pmd",
                        "ovsdb: pmd-cpu-mask: {e}"
                    );
                }
            }
        }
        let dropped: Vec<String> = self
            .db_settings
            .iter()
            .filter(|k| !d.settings.contains_key(*k))
            .cloned()
            .collect();
        for k in dropped {
            self.config.other.remove(&k);
            self.db_settings.remove(&k);
            self.apply_rx_mode();
            self.apply_flow_limit();
        }
        for (k, v) in &d.settings {
            if self.config.other.get(k) != Some(v) {
                match self.config_set(k, v) {
                    Ok(()) => {
                        self.db_settings.insert(k.clone());
                    }
                    Err(e) => limited!(self.logs, Error, "-", "ovsdb-set", "ovsdb: {e}"),
                }
            }
        }
    }

    /// A live port asks for another OpenFlow number: it takes it when no other port of its
    /// bridge has it (nothing else about the port changes).
    pub(super) fn renumber(&mut self, name: &str, request: Option<u16>) {
        let Some(st) = self.ports.get(name) else {
            return;
        };
        let bridge = st.bridge.clone();
        let taken = |n: u16| {
            self.ports
                .values()
                .any(|p| p.bridge == bridge && p.cfg.name != name && p.ofport == n)
        };
        let new = request.filter(|n| !taken(*n));
        if let Some(st) = self.ports.get_mut(name) {
            st.cfg.ofport = request;
            if let Some(n) = new {
                st.ofport = n;
            }
        }
        for b in &mut self.config.bridges {
            for c in &mut b.ports {
                if c.name == name {
                    c.ofport = request;
                }
            }
        }
    }

    /// What ferrovs writes to the `Interface` row of port `name` (`add_error`: why it could
    /// not be added).
    pub(super) fn iface_report(&self, name: &str, add_error: Option<&String>) -> IfaceReport {
        let Some(p) = self.ports.get(name) else {
            let e = add_error
                .cloned()
                .unwrap_or_else(|| format!("port {name} is not running"));
            return IfaceReport::failed(e);
        };
        let mut r = IfaceReport {
            ofport: i64::from(p.ofport),
            ..Default::default()
        };
        match &p.device {
            Some(d) => {
                let ready = d
                    .queues()
                    .iter()
                    .filter(|q| q.ready.load(Ordering::Relaxed))
                    .count();
                let up = p.conn.is_some() && ready > 0;
                r.admin_state = Some("up");
                r.link_state = Some(if up { "up" } else { "down" });
                let mode = match p.cfg.kind {
                    PortType::VhostUserClient => "client",
                    _ => "server",
                };
                let path = p.cfg.path.as_ref().map(|p| p.display().to_string());
                r.status.insert("mode".into(), mode.into());
                r.status.insert("socket".into(), path.unwrap_or_default());
                r.status
                    .insert("features".into(), format!("0x{:016x}", d.features()));
                r.status
                    .insert("num_of_vrings".into(), d.queues().len().to_string());
                r.status.insert("ready_vrings".into(), ready.to_string());
                r.status.insert(
                    "connected".into(),
                    if p.conn.is_some() { "true" } else { "false" }.into(),
                );
                if let Some(e) = &p.last_error {
                    r.status.insert("last_error".into(), e.clone());
                }
            }
            None => {
                r.status
                    .insert("driver_name".into(), p.port.io.mode().into());
                match p.cfg.dev.as_deref() {
                    Some(dev) => {
                        let (admin, link) = netdev_state(dev).unwrap_or((false, false));
                        r.admin_state = Some(if admin { "up" } else { "down" });
                        r.link_state = Some(if link { "up" } else { "down" });
                        r.mac_in_use = netdev_mac(dev).map(mac_text);
                        if let Some(why) = &p.fallback {
                            r.status.insert("af_xdp_fallback".into(), why.clone());
                        }
                    }
                    None => {
                        // A tunnel: up for as long as its socket is.
                        r.admin_state = Some("up");
                        r.link_state = Some("up");
                    }
                }
            }
        }
        r
    }

    /// `Interface.statistics` of port `name`: OVS's keys, then our drop reasons (`rx_` and
    /// `tx_` followed by the reason's name).
    pub(super) fn iface_statistics(&self, name: &str) -> Option<BTreeMap<String, i64>> {
        let p = self.ports.get(name)?;
        let (rx, tx) = (p.port.rx_stats(), p.port.tx_stats());
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut s = BTreeMap::new();
        for (dir, st) in [("rx", &rx), ("tx", &tx)] {
            s.insert(format!("{dir}_packets"), n(st.packets));
            s.insert(format!("{dir}_bytes"), n(st.bytes));
            s.insert(format!("{dir}_dropped"), n(st.total_drops()));
            s.insert(format!("{dir}_errors"), 0);
            for (reason, v) in st.named_drops() {
                if v > 0 {
                    s.insert(format!("{dir}_{reason}"), n(v));
                }
            }
        }
        Some(s)
    }

    /// `Bridge.datapath_id` of `bridge`.
    pub(super) fn bridge_datapath_id(&self, bridge: &str, configured: Option<&str>) -> String {
        let mac = self
            .ports
            .get(bridge)
            .filter(|p| p.bridge == bridge)
            .and_then(|p| p.cfg.dev.as_deref())
            .and_then(netdev_mac);
        vswitchdb::datapath_id(configured, mac, bridge)
    }
}
