//! OpenFlow controllers of each bridge: active connections (`tcp:`, `unix:`) with OVS's
//! reconnect backoff and inactivity probe, passive ones (`ptcp:`, `punix:`), roles and
//! the master election, and fail-open (`fail-mode=standalone`).
//!
//! Invariants:
//! * The configuration (`BridgeConfig::controllers`, ...) is the truth; the tick
//!   reconciles each bridge's [`BridgeCtl`] with it, so a change through the CLI, the
//!   database, a restart or a hot upgrade all take the same path. A new controller is tried
//!   at once. A hot upgrade hands each controller over with its connection, backoff and
//!   election (`of_handover.rs`): the controller sees no reconnect; a new daemon given no
//!   OpenFlow state (an older peer's) connects on its first tick, as after a restart.
//! * Connections are [`OfConn`]s in `OfState::conns`, handled exactly as management
//!   connections (`daemon/openflow.rs`); a TCP connect is non-blocking (the socket joins
//!   the epoll loop writable-armed and HELLO goes once it is established). Nothing here
//!   blocks the control thread.
//! * A controller is either backing off (the next attempt's time), connecting or connected
//!   (its connection's token), or listening (passive). Every end of a connection comes
//!   through `Daemon::of_closed` → [`Daemon::ctrl_disconnected`], which starts the backoff.
//! * Fail-open is a flag per bridge; while set, `publish` gives the datapath no pipeline
//!   (plain NORMAL forwarding: OVS's hidden fail-open rule above every other), leaving the
//!   rules untouched.

use std::net::TcpListener;

use ferrovs_openflow::error::{et, rrfc};
use ferrovs_openflow::{Message, OfError};

use crate::config::FailMode;
use crate::controller::{
    fail_open, Backoff, Election, Probe, ProbeAction, RoleDecision, Target, DEFAULT_MAX_BACKOFF,
    DEFAULT_PROBE,
};

use super::openflow::{OfConn, OfStream, Role};
use super::*;

/// Where a controller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CState {
    /// The next attempt (connect, or bind for passive targets) is due at this time.
    Backoff(Instant),
    /// A connection (its token) under way: TCP connect or HELLO.
    Connecting(u64),
    Connected(u64),
    /// A passive target's listener (its token).
    Listening(u64),
}

#[derive(Debug)]
pub(super) enum PassiveListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl PassiveListener {
    pub(super) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            PassiveListener::Unix(l) => l.as_fd(),
            PassiveListener::Tcp(l) => l.as_fd(),
        }
    }
}

/// One configured controller.
#[derive(Debug)]
pub(super) struct Controller {
    pub target: String,
    pub(super) parsed: Target,
    pub(super) backoff: Backoff,
    pub state: CState,
    pub(super) listener: Option<PassiveListener>,
    /// Connections made (HELLO exchanged or not).
    pub connects: u64,
    pub last_error: Option<String>,
    /// When the last connection was made and when the last one ended (OVS's
    /// `sec_since_connect` and `sec_since_disconnect` in `Controller.status`).
    pub connected_at: Option<Instant>,
    pub disconnected_at: Option<Instant>,
    /// The last failure, kept after a reconnect (OVS's rconn `last_error`, which
    /// `Controller.status` shows until another failure replaces it).
    pub ever_error: Option<String>,
}

/// What `Controller.is_connected`, `role` and `status` say of one controller (OVS's
/// `ofproto_controller_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ControllerReport {
    /// Connected, HELLO exchanged.
    pub connected: bool,
    /// `other` (equal), `master` or `slave`; `None` while not connected.
    pub role: Option<&'static str>,
    /// OVS's rconn state: `BACKOFF`, `CONNECTING`, `ACTIVE`, `IDLE` (an echo is out);
    /// `None` for a passive target (OVS writes no status for those).
    pub state: Option<&'static str>,
    pub since_connect: Option<Duration>,
    pub since_disconnect: Option<Duration>,
    pub last_error: Option<String>,
}

/// A bridge's controllers and what they decide together.
#[derive(Debug, Default)]
pub(super) struct BridgeCtl {
    pub controllers: Vec<Controller>,
    pub election: Election,
    /// Since when no controller is connected (`None`: one is, or none is configured).
    pub disconnected_since: Option<Instant>,
    pub fail_open: bool,
}

impl Daemon {
    fn bridge_cfg(&self, bridge: &str) -> Option<&BridgeConfig> {
        self.config.bridges.iter().find(|b| b.name == bridge)
    }

    pub(super) fn ctrl_max_backoff(&self, bridge: &str) -> Duration {
        self.bridge_cfg(bridge)
            .and_then(|b| b.max_backoff_ms)
            .map_or(DEFAULT_MAX_BACKOFF, |ms| {
                Duration::from_millis(u64::from(ms))
            })
    }

    fn ctrl_probe_interval(&self, bridge: &str) -> Duration {
        self.bridge_cfg(bridge)
            .and_then(|b| b.inactivity_probe_ms)
            .map_or(DEFAULT_PROBE, |ms| Duration::from_millis(u64::from(ms)))
    }

    fn fail_mode(&self, bridge: &str) -> FailMode {
        self.bridge_cfg(bridge)
            .and_then(|b| b.fail_mode)
            .unwrap_or_default()
    }

    /// Takes a bridge's OpenFlow settings from a saved or handed-over configuration (the
    /// bridge was just created from it: no flush, controllers tried at the next tick).
    pub(super) fn restore_openflow_settings(&mut self, saved: &BridgeConfig) {
        if let Some(c) = self.cfg_bridge(&saved.name) {
            c.controllers = saved.controllers.clone();
            c.datapath_id = saved.datapath_id.clone();
            c.protocols = saved.protocols.clone();
            c.fail_mode = saved.fail_mode;
            c.max_backoff_ms = saved.max_backoff_ms;
            c.inactivity_probe_ms = saved.inactivity_probe_ms;
        }
    }

    /// Brings each bridge's controllers in line with the configuration: new targets are
    /// tried at once, dropped ones closed.
    fn ctrl_sync(&mut self) {
        let now = Instant::now();
        let wanted: Vec<(String, Vec<String>)> = self
            .config
            .bridges
            .iter()
            .filter(|b| self.bridges.contains_key(&b.name))
            .map(|b| (b.name.clone(), b.controllers.clone()))
            .collect();
        for (bridge, targets) in wanted {
            let have: Vec<String> = self
                .openflow
                .ctrls
                .get(&bridge)
                .map(|c| c.controllers.iter().map(|c| c.target.clone()).collect())
                .unwrap_or_default();
            if have == targets {
                continue;
            }
            for gone in have.iter().filter(|t| !targets.contains(t)) {
                self.ctrl_close(&bridge, gone);
            }
            let max_backoff = self.ctrl_max_backoff(&bridge);
            let bc = self.openflow.ctrls.entry(bridge.clone()).or_default();
            for t in &targets {
                if bc.controllers.iter().any(|c| &c.target == t) {
                    continue;
                }
                let Ok(parsed) = Target::parse(t) else {
                    // The configuration was validated; a bad one is skipped, not fatal.
                    continue;
                };
                bc.controllers.push(Controller {
                    target: t.clone(),
                    parsed,
                    backoff: Backoff::new(max_backoff),
                    state: CState::Backoff(now),
                    listener: None,
                    connects: 0,
                    last_error: None,
                    connected_at: None,
                    disconnected_at: None,
                    ever_error: None,
                });
            }
            bc.controllers
                .sort_by_key(|c| targets.iter().position(|t| *t == c.target));
            if bc.disconnected_since.is_none() {
                bc.disconnected_since = Some(now);
            }
        }
    }

    /// Closes controller `target` of `bridge` (its connection or listener) and forgets it.
    fn ctrl_close(&mut self, bridge: &str, target: &str) {
        let Some(bc) = self.openflow.ctrls.get_mut(bridge) else {
            return;
        };
        let Some(i) = bc.controllers.iter().position(|c| c.target == target) else {
            return;
        };
        let c = bc.controllers.remove(i);
        if let Some(l) = &c.listener {
            let _ = self.epoll.delete(l.as_fd());
            if let Target::PUnix(p) = &c.parsed {
                let _ = std::fs::remove_file(p);
            }
        }
        if let CState::Listening(t) = c.state {
            self.tokens.remove(&t);
        }
        // Every connection of this controller (active, or accepted on its listener).
        let conns: Vec<u64> = self
            .openflow
            .conns
            .iter()
            .filter(|(_, x)| x.bridge == bridge && x.controller.as_deref() == Some(target))
            .map(|(t, _)| *t)
            .collect();
        for t in conns {
            if let Some(x) = self.openflow.conns.remove(&t) {
                let _ = self.epoll.delete(x.stream.as_fd());
                self.tokens.remove(&t);
            }
        }
    }

    /// Forgets every controller of `bridge` (bridge removed).
    pub(super) fn ctrl_remove_bridge(&mut self, bridge: &str) {
        let targets: Vec<String> = self
            .openflow
            .ctrls
            .get(bridge)
            .map(|c| c.controllers.iter().map(|c| c.target.clone()).collect())
            .unwrap_or_default();
        for t in targets {
            self.ctrl_close(bridge, &t);
        }
        self.openflow.ctrls.remove(bridge);
    }

    /// The tick's share: reconcile, attempts that are due, inactivity probes, fail-open.
    pub(super) fn ctrl_tick(&mut self) {
        self.ctrl_sync();
        let now = Instant::now();
        let due: Vec<(String, String)> = self
            .openflow
            .ctrls
            .iter()
            .flat_map(|(b, bc)| {
                bc.controllers
                    .iter()
                    .filter(|c| matches!(c.state, CState::Backoff(at) if at <= now))
                    .map(|c| (b.clone(), c.target.clone()))
            })
            .collect();
        for (b, t) in due {
            self.ctrl_attempt(&b, &t);
        }
        self.ctrl_probes(now);
        self.ctrl_fail_open(now);
    }

    /// Sends echoes to idle controllers and drops those that never answered.
    fn ctrl_probes(&mut self, now: Instant) {
        let mut echo = Vec::new();
        let mut dead = Vec::new();
        for (t, c) in self.openflow.conns.iter_mut() {
            let Some(p) = &mut c.probe else { continue };
            match p.poll(now) {
                ProbeAction::Nothing => {}
                ProbeAction::SendEcho => echo.push(*t),
                ProbeAction::Disconnect => dead.push(*t),
            }
        }
        for t in echo {
            if let Some(c) = self.openflow.conns.get_mut(&t) {
                self.openflow.counters.echo_probes += 1;
                let bytes = c.encode(&Message::EchoRequest(vec![]), 0);
                c.out.extend_from_slice(&bytes);
            }
            self.of_rearm(t);
        }
        for t in dead {
            if let Some(c) = self.openflow.conns.remove(&t) {
                self.openflow.counters.dropped += 1;
                limited!(
                    self.logs,
                    Warn,
                    &c.bridge,
                    "controller",
                    "OpenFlow controller {} did not answer the inactivity probe: disconnected",
                    c.controller.as_deref().unwrap_or("?")
                );
                self.of_closed(t, c, Some("no reply to the inactivity probe".into()));
            }
        }
    }

    /// Starts or stops fail-open per bridge (see [`fail_open`]).
    fn ctrl_fail_open(&mut self, now: Instant) {
        let mut changed = false;
        let bridges: Vec<String> = self.openflow.ctrls.keys().cloned().collect();
        for b in bridges {
            let connected =
                self.openflow.conns.values().any(|c| {
                    c.bridge == b && c.controller.is_some() && c.negotiated && !c.connecting
                });
            let mode = self.fail_mode(&b);
            let probe = self.ctrl_probe_interval(&b);
            let Some(bc) = self.openflow.ctrls.get_mut(&b) else {
                continue;
            };
            if connected {
                bc.disconnected_since = None;
            } else if bc.disconnected_since.is_none() {
                bc.disconnected_since = Some(now);
            }
            let open = fail_open(
                mode,
                !bc.controllers.is_empty(),
                bc.disconnected_since.map(|s| now.duration_since(s)),
                probe,
            );
            if open != bc.fail_open {
                bc.fail_open = open;
                log::info!(
                    "bridge {b}: {}",
                    if open {
                        "no controller connected: fail-open (forwarding as a learning switch)"
                    } else {
                        "controller connected: fail-open ends"
                    }
                );
                if let Some(st) = self.bridges.get_mut(&b) {
                    st.dirty = true;
                    changed = true;
                }
            }
        }
        if changed {
            self.publish();
        }
    }

    /// Whether `bridge` is in fail-open (the datapath forwards as NORMAL).
    pub(super) fn is_fail_open(&self, bridge: &str) -> bool {
        self.openflow.ctrls.get(bridge).is_some_and(|c| c.fail_open)
    }

    /// One attempt: connect (active) or bind (passive).
    fn ctrl_attempt(&mut self, bridge: &str, target: &str) {
        let now = Instant::now();
        let Some(c) = self.ctrl_find(bridge, target) else {
            return;
        };
        c.backoff.attempt(now);
        let parsed = c.parsed.clone();
        let res: io::Result<(OfStream, bool)> = match &parsed {
            Target::Tcp(a) => {
                os::tcp_connect_nonblocking(*a).map(|(s, done)| (OfStream::Tcp(s), !done))
            }
            Target::Unix(p) => UnixStream::connect(p).and_then(|s| {
                s.set_nonblocking(true)?;
                Ok((OfStream::Unix(s), false))
            }),
            Target::PTcp(a) => {
                let r = TcpListener::bind(a).and_then(|l| {
                    l.set_nonblocking(true)?;
                    Ok(PassiveListener::Tcp(l))
                });
                return self.ctrl_listen(bridge, target, r);
            }
            Target::PUnix(p) => {
                let r = bind_socket(p)
                    .map(PassiveListener::Unix)
                    .map_err(|e| io::Error::other(with_sources(&e)));
                return self.ctrl_listen(bridge, target, r);
            }
        };
        let (stream, connecting) = match res {
            Ok(x) => x,
            Err(e) => {
                let why = format!("cannot connect: {e}");
                return self.ctrl_failed(bridge, target, why);
            }
        };
        let t = self.token(Source::OfConn, bridge);
        if self.epoll.add(stream.as_fd(), t, connecting).is_err() {
            self.tokens.remove(&t);
            return self.ctrl_failed(bridge, target, "epoll".into());
        }
        let versions = self.of_versions(bridge);
        let mut conn = OfConn::new(
            stream,
            bridge,
            Some(target.to_string()),
            connecting,
            &versions,
        );
        if let Some(c) = self.ctrl_find(bridge, target) {
            c.state = CState::Connecting(t);
        }
        if !connecting {
            self.ctrl_connected(&mut conn);
        }
        self.openflow.conns.insert(t, conn);
        if !connecting {
            // HELLO goes now.
            self.on_of_conn(
                t,
                &EpollEvent {
                    token: t,
                    readable: false,
                    writable: true,
                    hangup: false,
                },
            );
        }
    }

    fn ctrl_listen(&mut self, bridge: &str, target: &str, r: io::Result<PassiveListener>) {
        let l = match r {
            Ok(l) => l,
            Err(e) => return self.ctrl_failed(bridge, target, format!("cannot listen: {e}")),
        };
        let t = self.token(Source::CtrlListener, bridge);
        if self.epoll.add(l.as_fd(), t, false).is_err() {
            self.tokens.remove(&t);
            return self.ctrl_failed(bridge, target, "epoll".into());
        }
        if let Some(c) = self.ctrl_find(bridge, target) {
            c.state = CState::Listening(t);
            c.listener = Some(l);
            c.last_error = None;
        }
    }

    /// A passive controller's listener is readable: accept every waiting connection.
    pub(super) fn on_ctrl_listener(&mut self, t: u64, bridge: &str) {
        let target = self.openflow.ctrls.get(bridge).and_then(|bc| {
            bc.controllers
                .iter()
                .find(|c| c.state == CState::Listening(t))
                .map(|c| c.target.clone())
        });
        let Some(target) = target else { return };
        loop {
            let Some(c) = self.ctrl_find(bridge, &target) else {
                return;
            };
            let accepted = match &c.listener {
                Some(PassiveListener::Unix(l)) => l.accept().map(|(s, _)| OfStream::Unix(s)),
                Some(PassiveListener::Tcp(l)) => l.accept().map(|(s, _)| OfStream::Tcp(s)),
                None => return,
            };
            let Ok(s) = accepted else { return };
            let nb = match &s {
                OfStream::Unix(s) => s.set_nonblocking(true),
                OfStream::Tcp(s) => s.set_nonblocking(true),
            };
            if nb.is_err() {
                continue;
            }
            let ct = self.token(Source::OfConn, bridge);
            if self.epoll.add(s.as_fd(), ct, false).is_err() {
                self.tokens.remove(&ct);
                continue;
            }
            self.openflow.counters.accepted += 1;
            let versions = self.of_versions(bridge);
            let mut conn = OfConn::new(s, bridge, Some(target.clone()), false, &versions);
            self.ctrl_connected(&mut conn);
            self.openflow.conns.insert(ct, conn);
            self.on_of_conn(
                ct,
                &EpollEvent {
                    token: ct,
                    readable: false,
                    writable: true,
                    hangup: false,
                },
            );
        }
    }

    fn ctrl_find(&mut self, bridge: &str, target: &str) -> Option<&mut Controller> {
        self.openflow
            .ctrls
            .get_mut(bridge)?
            .controllers
            .iter_mut()
            .find(|c| c.target == target)
    }

    fn ctrl_failed(&mut self, bridge: &str, target: &str, why: String) {
        let now = Instant::now();
        let Some(c) = self.ctrl_find(bridge, target) else {
            return;
        };
        let wait = c.backoff.failed(now);
        c.state = CState::Backoff(now + wait);
        c.last_error = Some(why.clone());
        c.ever_error = Some(why.clone());
        limited!(
            self.logs,
            Info,
            bridge,
            "controller",
            "OpenFlow controller {target}: {why}; next attempt in {} s",
            wait.as_secs()
        );
    }

    /// A controller connection is established (HELLO about to go).
    pub(super) fn ctrl_connected(&mut self, conn: &mut OfConn) {
        let probe = self.ctrl_probe_interval(&conn.bridge);
        conn.probe = Some(Probe::new(probe, Instant::now()));
        let Some(target) = conn.controller.clone() else {
            return;
        };
        let bridge = conn.bridge.clone();
        if let Some(c) = self.ctrl_find(&bridge, &target) {
            c.connects += 1;
            c.last_error = None;
            c.connected_at = Some(Instant::now());
            if let CState::Connecting(t) = c.state {
                c.state = CState::Connected(t);
            }
        }
    }

    /// A controller's connection `t` ended (`why`: a failure worth reporting).
    pub(super) fn ctrl_disconnected(
        &mut self,
        bridge: &str,
        target: &str,
        t: u64,
        why: Option<String>,
    ) {
        let is_this = self.ctrl_find(bridge, target).is_some_and(
            |c| matches!(c.state, CState::Connecting(x) | CState::Connected(x) if x == t),
        );
        if is_this {
            if let Some(c) = self.ctrl_find(bridge, target) {
                if matches!(c.state, CState::Connected(_)) {
                    c.disconnected_at = Some(Instant::now());
                }
            }
            self.ctrl_failed(
                bridge,
                target,
                why.unwrap_or_else(|| "connection closed".into()),
            );
        }
    }

    /// ROLE_REQUEST (OVS's `handle_role_request`): the bridge's election decides; a new
    /// master demotes every other master to slave.
    pub(super) fn of_role_request(
        &mut self,
        c: &mut OfConn,
        r: &ferrovs_openflow::Role,
        xid: u32,
        msg: &[u8],
    ) {
        let bc = self.openflow.ctrls.entry(c.bridge.clone()).or_default();
        match bc.election.request(c.role, r.role, r.generation_id) {
            RoleDecision::Grant {
                role,
                demote_others,
            } => {
                if demote_others {
                    for o in self.openflow.conns.values_mut() {
                        if o.bridge == c.bridge && o.role == Role::Master {
                            o.role = Role::Slave;
                        }
                    }
                }
                c.role = role;
                let gen = self
                    .openflow
                    .ctrls
                    .get(&c.bridge)
                    .map_or(0, |b| b.election.reply_id());
                let bytes = c.encode(
                    &Message::RoleReply(ferrovs_openflow::Role {
                        role: role.to_wire(),
                        generation_id: gen,
                    }),
                    xid,
                );
                c.out.extend_from_slice(&bytes);
            }
            RoleDecision::Stale => self.of_refuse(
                c,
                OfError::new(et::ROLE_REQUEST_FAILED, rrfc::STALE, "stale generation id"),
                msg,
            ),
            RoleDecision::BadRole => self.of_refuse(
                c,
                OfError::new(et::ROLE_REQUEST_FAILED, rrfc::BAD_ROLE, "unknown role"),
                msg,
            ),
        }
    }

    /// Flushes `bridge`'s rules as OVS's `ofproto_flush_flows`: every rule goes, and with no
    /// controller in standalone mode the default `priority=0 actions=NORMAL` comes back.
    pub(super) fn ctrl_flush(&mut self, bridge: &str) {
        let standalone = self.fail_mode(bridge) == FailMode::Standalone;
        let no_controllers = self
            .bridge_cfg(bridge)
            .is_none_or(|b| b.controllers.is_empty());
        let Some(b) = self.bridges.get_mut(bridge) else {
            return;
        };
        b.rules = if standalone && no_controllers {
            crate::flows::BridgeRules::new()
        } else {
            crate::flows::BridgeRules::from_texts(&[])
                .unwrap_or_else(|_| crate::flows::BridgeRules::new())
        };
        b.dirty = true;
        self.sync_flows_config(bridge);
        self.publish();
    }

    /// `ferrovs set-controller`/`del-controller`: the targets change; when the bridge goes
    /// from no controller to some or back, its rules are flushed (as OVS's bridge does).
    pub(super) fn set_controllers(
        &mut self,
        bridge: &str,
        targets: &[String],
    ) -> Result<(), ConfigError> {
        if !self.bridges.contains_key(bridge) {
            return Err(ConfigError::Invalid(format!("no bridge named {bridge}")));
        }
        for t in targets {
            Target::parse(t).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        let Some(cfg) = self.cfg_bridge(bridge) else {
            return Err(ConfigError::Invalid(format!("no bridge named {bridge}")));
        };
        let had = !cfg.controllers.is_empty();
        cfg.controllers = targets.to_vec();
        if had == targets.is_empty() {
            self.ctrl_flush(bridge);
        }
        self.ctrl_sync();
        Ok(())
    }

    /// `ferrovs set-bridge BRIDGE key=value...`: datapath-id, protocols, fail-mode,
    /// max-backoff (ms), inactivity-probe (ms).
    pub(super) fn set_bridge(
        &mut self,
        bridge: &str,
        options: &[String],
    ) -> Result<(), ConfigError> {
        let Some(cur) = self.bridge_cfg(bridge).cloned() else {
            return Err(ConfigError::Invalid(format!("no bridge named {bridge}")));
        };
        let mut new = cur.clone();
        for o in options {
            let Some((k, v)) = o.split_once('=') else {
                return Err(ConfigError::Invalid(format!(
                    "set-bridge: '{o}' is not key=value"
                )));
            };
            let ms = |v: &str| {
                v.parse::<u32>().map_err(|_| {
                    ConfigError::Invalid(format!("set-bridge: {k}: '{v}' is not milliseconds"))
                })
            };
            match k {
                "datapath-id" => new.datapath_id = (!v.is_empty()).then(|| v.to_string()),
                "protocols" => {
                    new.protocols = v
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(String::from)
                        .collect()
                }
                "fail-mode" => {
                    new.fail_mode = if v.is_empty() {
                        None
                    } else {
                        Some(FailMode::parse(v)?)
                    }
                }
                "max-backoff" => new.max_backoff_ms = Some(ms(v)?),
                "inactivity-probe" => new.inactivity_probe_ms = Some(ms(v)?),
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "set-bridge: unknown setting '{k}' (expected datapath-id, protocols, fail-mode, max-backoff or inactivity-probe)"
                    )))
                }
            }
        }
        self.set_openflow_settings(bridge, new)
    }

    /// A bridge's OpenFlow settings become `new` (its `controllers` are not looked at: see
    /// [`Daemon::set_controllers`]): a fail-mode change with no controller flushes the
    /// rules (OVS's `connmgr_set_fail_mode`), a new `max_backoff` restarts the backoffs.
    /// `ferrovs set-bridge` and the database (`daemon/ovsdb.rs`) both come here.
    pub(super) fn set_openflow_settings(
        &mut self,
        bridge: &str,
        mut new: BridgeConfig,
    ) -> Result<(), ConfigError> {
        let Some(cur) = self.bridge_cfg(bridge).cloned() else {
            return Err(ConfigError::Invalid(format!("no bridge named {bridge}")));
        };
        new.controllers = cur.controllers.clone();
        new.validate_openflow()?;
        let mode_changed = new.fail_mode.unwrap_or_default() != cur.fail_mode.unwrap_or_default();
        let backoff_changed = new.max_backoff_ms != cur.max_backoff_ms;
        if let Some(c) = self.cfg_bridge(bridge) {
            *c = new.clone();
        }
        if mode_changed && new.controllers.is_empty() {
            // OVS's connmgr_set_fail_mode: with no controller the table is flushed.
            self.ctrl_flush(bridge);
        }
        if backoff_changed {
            let max = self.ctrl_max_backoff(bridge);
            if let Some(bc) = self.openflow.ctrls.get_mut(bridge) {
                for c in &mut bc.controllers {
                    c.backoff = Backoff::new(max);
                }
            }
        }
        Ok(())
    }

    /// What the database's `Controller` row of `target` on `bridge` reports (`None`: no such
    /// controller runs).
    pub(super) fn controller_report(&self, bridge: &str, target: &str) -> Option<ControllerReport> {
        let bc = self.openflow.ctrls.get(bridge)?;
        let c = bc.controllers.iter().find(|c| c.target == target)?;
        let now = Instant::now();
        let since = |t: Option<Instant>| t.map(|t| now.duration_since(t));
        let role_of = |c: &OfConn| match c.role {
            Role::Master => "master",
            Role::Slave => "slave",
            Role::Equal => "other",
        };
        if c.parsed.is_passive() {
            // OVS reports a listener's own status nowhere; a connection accepted on it
            // shows as connected.
            let conn = self.openflow.conns.values().find(|x| {
                x.bridge == bridge && x.controller.as_deref() == Some(target) && x.negotiated
            });
            return Some(ControllerReport {
                connected: conn.is_some(),
                role: conn.map(role_of),
                state: None,
                since_connect: None,
                since_disconnect: None,
                last_error: None,
            });
        }
        let conn = match c.state {
            CState::Connected(t) => self.openflow.conns.get(&t).filter(|x| x.negotiated),
            _ => None,
        };
        let state = match (c.state, conn) {
            (CState::Backoff(_), _) => "BACKOFF",
            (_, Some(x)) if x.probe.as_ref().is_some_and(|p| p.echo_outstanding()) => "IDLE",
            (_, Some(_)) => "ACTIVE",
            _ => "CONNECTING",
        };
        Some(ControllerReport {
            connected: conn.is_some(),
            role: conn.map(role_of),
            state: Some(state),
            since_connect: since(c.connected_at),
            since_disconnect: since(c.disconnected_at),
            last_error: c.ever_error.clone(),
        })
    }

    /// What `show` says of a bridge's OpenFlow connections.
    pub(super) fn show_openflow(&self, bridge: &str) -> ferrovs_proto::reply::ShowOpenflow {
        use ferrovs_proto::reply::{ShowController, ShowOpenflow};
        let cfg = self.bridge_cfg(bridge);
        let role_of = |t: u64| {
            self.openflow
                .conns
                .get(&t)
                .map_or("equal", |c| c.role.name())
                .to_string()
        };
        let controllers = self
            .openflow
            .ctrls
            .get(bridge)
            .map(|bc| {
                bc.controllers
                    .iter()
                    .map(|c| {
                        let (state, connected, role) = match c.state {
                            CState::Backoff(_) => ("backoff", false, "equal".into()),
                            CState::Connecting(_) => ("connecting", false, "equal".into()),
                            CState::Connected(t) => (
                                "connected",
                                self.openflow.conns.get(&t).is_some_and(|x| x.negotiated),
                                role_of(t),
                            ),
                            CState::Listening(_) => ("listening", false, "equal".into()),
                        };
                        ShowController {
                            target: c.target.clone(),
                            state: state.into(),
                            connected,
                            role,
                            connects: c.connects,
                            backoff_ms: c.backoff.current().as_millis() as u64,
                            last_error: c.last_error.clone(),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let passive = self
            .openflow
            .conns
            .values()
            .filter(|c| c.bridge == bridge && c.controller.is_none())
            .count();
        ShowOpenflow {
            datapath_id: format!("{:016x}", self.bridge_dpid(bridge)),
            fail_mode: cfg
                .and_then(|b| b.fail_mode)
                .unwrap_or_default()
                .name()
                .into(),
            fail_open: self.is_fail_open(bridge),
            protocols: cfg.map(|b| b.protocols.clone()).unwrap_or_default(),
            controllers,
            management_connections: passive as u64,
        }
    }
}
