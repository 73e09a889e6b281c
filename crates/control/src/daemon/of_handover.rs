//! Handing OpenFlow connections over at a hot upgrade: a controller or ovn-controller
//! never sees a reconnect (`docs/upgrade.md`, "OpenFlow connections").
//!
//! The old daemon exports, as plain data ([`crate::upgrade::OpenflowState`]), every
//! connection (its socket's fd, negotiated version, role, asynchronous configuration,
//! `miss_send_len`, packet-in format, controller id, the bytes read and not yet handled,
//! the bytes not yet written, the inactivity probe, open bundles with their messages), the
//! management sockets' and passive controllers' listening fds, and each bridge's
//! controllers (backoff, election id, fail-open). The new daemon restores them as
//! untrusted input.
//!
//! Invariants:
//! * Exactly one reader. The old daemon exports in its control thread, which reads no
//!   OpenFlow socket from then on (the handover runs there to its end); the new daemon
//!   registers the sockets during prepare but reads or writes none before the commit
//!   (its event loop starts after `bye`). A message half read travels as `input`, a reply
//!   half written as `output`: the new daemon goes on from exactly that byte. On a
//!   roll-back the old daemon simply carries on: it never stopped owning anything.
//! * Connections are restored after the ports, so the new daemon's PORT_STATUS `ADD` of
//!   each port it builds goes to nobody (the peers know the ports already).
//! * A connection, or a bridge's controllers, that does not parse or that the checks here
//!   refuse is closed alone and counted (`OfCounters::handover_refused`); an active
//!   controller left without its connection is reconnected at once, as before this
//!   existed. An older daemon's state has no OpenFlow section: the new daemon binds the
//!   management sockets and connects to the controllers itself.
//! * What the old daemon cannot carry within [`HANDOVER_BYTES`] of buffered bytes (a
//!   connection with tens of megabytes of unread replies or bundled messages) is left
//!   out: that peer sees its connection close, as before.

use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;

use ferrovs_openflow::{decode, Framer, Message, VERSION_1_3, VERSION_1_5};

use super::bundles::{Bundle, MAX_BUNDLES, MAX_BUNDLE_BYTES};
use super::controllers::{CState, Controller, PassiveListener};
use super::openflow::{OfConn, OfStream, IN_MAX, OUT_MAX, READ_BUDGET};
use super::*;
use crate::controller::{Backoff, Election, Probe, Target};
use crate::upgrade::{
    BundleState, CtrlLink, CtrlState, FdList, FdTable, HexBytes, Lenient, OfBridgeState,
    OfConnState, OpenflowState, StateError,
};

/// Buffered bytes (input, output, bundled messages) the old daemon hands over in all: the
/// state travels in one message of at most [`crate::upgrade::MAX_MSG`], hex-encoded.
pub(super) const HANDOVER_BYTES: usize = 2 << 20;

/// Why one handed-over connection (or one bridge's controllers) was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum OfConnError {
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("no bridge {0}")]
    NoBridge(String),
    #[error("controller {0} is not configured on its bridge")]
    NoController(String),
    #[error("negotiated version {0:#04x}, which this switch does not speak")]
    Version(u8),
    #[error("{what}: {len} bytes, more than {max}")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0} bundles, more than {MAX_BUNDLES}")]
    TooManyBundles(usize),
    #[error("bundle {0} twice")]
    BundleTwice(u32),
    #[error("bundle {id}: a message that is not a FLOW_MOD or GROUP_MOD")]
    BundleMessage { id: u32 },
    #[error("bundle {id}")]
    BundleDecode {
        id: u32,
        #[source]
        source: ferrovs_openflow::OfError,
    },
    #[error("its socket is not a {0} stream socket")]
    Socket(&'static str, #[source] io::Error),
    #[error(transparent)]
    Fd(#[from] StateError),
}

impl Bundle {
    /// This bundle as plain data.
    pub(super) fn export(&self, id: u32) -> BundleState {
        BundleState {
            id,
            flags: self.flags,
            closed: self.closed,
            msgs: self.msgs.iter().map(|(_, b)| HexBytes(b.clone())).collect(),
        }
    }

    /// A bundle from handed-over state: each message decoded again, as `bundle_add`
    /// decodes it, and only what it keeps (FLOW_MOD, GROUP_MOD).
    pub(super) fn restore(s: &BundleState) -> Result<Bundle, OfConnError> {
        let mut msgs = Vec::with_capacity(s.msgs.len().min(4096));
        let mut bytes = 0;
        for HexBytes(b) in &s.msgs {
            let (_, m) =
                decode(b).map_err(|source| OfConnError::BundleDecode { id: s.id, source })?;
            if !matches!(m, Message::FlowMod(_) | Message::GroupMod(_)) {
                return Err(OfConnError::BundleMessage { id: s.id });
            }
            bytes += b.len();
            msgs.push((m, b.clone()));
        }
        Ok(Bundle {
            flags: s.flags,
            closed: s.closed,
            msgs,
            bytes,
        })
    }
}

impl OfConn {
    /// Bytes this connection would hand over (what counts against [`HANDOVER_BYTES`]).
    pub(super) fn buffered(&self) -> usize {
        self.framer.pending()
            + self.out.len()
            + self.bundles.values().map(|b| b.bytes).sum::<usize>()
    }

    /// This connection as plain data; its socket goes into `fds`.
    pub(super) fn export(&self, fds: &mut FdList, now: Instant) -> OfConnState {
        let a = &self.async_cfg;
        OfConnState {
            socket: fds.push(self.stream.as_fd().as_raw_fd()),
            tcp: matches!(self.stream, OfStream::Tcp(_)),
            bridge: self.bridge.clone(),
            controller: self.controller.clone(),
            negotiated: self.negotiated,
            version: self.version,
            closing: self.closing,
            connecting: self.connecting,
            role: self.role,
            miss_send_len: self.miss_send_len,
            async_config: [a.packet_in_mask, a.port_status_mask, a.flow_removed_mask],
            packet_in_format: self.packet_in_format,
            controller_id: self.controller_id,
            input: self.framer.unread().to_vec(),
            output: self.out.clone(),
            probe: self.probe.as_ref().map(|p| p.state(now)),
            bundles: self.bundles.iter().map(|(id, b)| b.export(*id)).collect(),
        }
    }

    /// A connection from handed-over state on its socket `fd` (untrusted: the version, the
    /// sizes of its buffers and bundles are checked, each bundled message decoded again,
    /// and the socket must be a stream socket of the kind the state says).
    pub(super) fn restore(
        s: &OfConnState,
        fd: OwnedFd,
        now: Instant,
    ) -> Result<OfConn, OfConnError> {
        if s.negotiated && !(VERSION_1_3..=VERSION_1_5).contains(&s.version) {
            return Err(OfConnError::Version(s.version));
        }
        let limit = |what, len, max| {
            if len > max {
                Err(OfConnError::TooLarge { what, len, max })
            } else {
                Ok(())
            }
        };
        limit("unread input", s.input.len(), IN_MAX + READ_BUDGET)?;
        limit("unwritten output", s.output.len(), OUT_MAX)?;
        if s.bundles.len() > MAX_BUNDLES {
            return Err(OfConnError::TooManyBundles(s.bundles.len()));
        }
        let mut bundles = BTreeMap::new();
        let mut total = 0;
        for b in &s.bundles {
            let b2 = Bundle::restore(b)?;
            total += b2.bytes;
            if bundles.insert(b.id, b2).is_some() {
                return Err(OfConnError::BundleTwice(b.id));
            }
        }
        limit("bundled messages", total, MAX_BUNDLE_BYTES)?;
        let stream = if s.tcp {
            let t = TcpStream::from(fd);
            t.local_addr()
                .and_then(|_| t.set_nonblocking(true))
                .map_err(|e| OfConnError::Socket("TCP", e))?;
            OfStream::Tcp(t)
        } else {
            let u = UnixStream::from(fd);
            u.local_addr()
                .and_then(|_| u.set_nonblocking(true))
                .map_err(|e| OfConnError::Socket("Unix", e))?;
            OfStream::Unix(u)
        };
        let mut framer = Framer::new();
        if s.negotiated {
            framer.set_version(s.version);
        }
        framer.push(&s.input);
        let [pin, ps, fr] = s.async_config;
        let mut c = OfConn::new(stream, &s.bridge, s.controller.clone(), s.connecting, &[]);
        c.framer = framer;
        c.out = s.output.clone();
        c.negotiated = s.negotiated;
        c.closing = s.closing;
        c.role = s.role;
        c.probe = s.probe.as_ref().map(|p| Probe::from_state(p, now));
        c.miss_send_len = s.miss_send_len;
        c.async_cfg = ferrovs_openflow::AsyncConfig {
            packet_in_mask: pin,
            port_status_mask: ps,
            flow_removed_mask: fr,
        };
        c.version = if s.negotiated { s.version } else { VERSION_1_3 };
        c.packet_in_format = s.packet_in_format;
        c.controller_id = s.controller_id;
        c.bundles = bundles;
        Ok(c)
    }
}

/// Milliseconds from `now` back to `t`.
fn ms_since(now: Instant, t: Instant) -> u64 {
    now.saturating_duration_since(t).as_millis() as u64
}

/// `ms` milliseconds before `now` (now, if this process's clock cannot go back that far).
fn ms_ago(now: Instant, ms: u64) -> Instant {
    now.checked_sub(Duration::from_millis(ms)).unwrap_or(now)
}

impl Daemon {
    /// Everything OpenFlow runs, as plain data, its fds into `fds`. Called by the
    /// handover in the control thread: no OpenFlow socket is read after this.
    pub(super) fn of_export(&self, fds: &mut FdList) -> OpenflowState {
        let now = Instant::now();
        let mut listeners: Vec<(String, u32)> = self
            .openflow
            .listeners
            .iter()
            .map(|(b, (l, _))| (b.clone(), fds.push(l.as_raw_fd())))
            .collect();
        listeners.sort();
        // Connections in token order (the order they were made); past the byte budget a
        // connection is left out, and closes when this daemon exits.
        let mut tokens: Vec<u64> = self.openflow.conns.keys().copied().collect();
        tokens.sort_unstable();
        let mut index = HashMap::new();
        let mut conns = Vec::new();
        let mut budget = HANDOVER_BYTES;
        for t in tokens {
            let c = &self.openflow.conns[&t];
            let n = c.buffered();
            if n > budget {
                log::warn!(
                    "upgrade: bridge {}: an OpenFlow connection with {n} bytes buffered is not \
                     handed over (it closes; a controller reconnects)",
                    c.bridge
                );
                continue;
            }
            budget -= n;
            index.insert(t, conns.len() as u32);
            conns.push(Lenient(Ok(c.export(fds, now))));
        }
        let mut bridges = Vec::new();
        for (b, bc) in &self.openflow.ctrls {
            let controllers = bc
                .controllers
                .iter()
                .map(|c| {
                    let state = match c.state {
                        CState::Backoff(at) => CtrlLink::Backoff {
                            in_ms: at.saturating_duration_since(now).as_millis() as u64,
                        },
                        CState::Connecting(t) | CState::Connected(t) => match index.get(&t) {
                            Some(&conn) if matches!(c.state, CState::Connected(_)) => {
                                CtrlLink::Connected { conn }
                            }
                            Some(&conn) => CtrlLink::Connecting { conn },
                            // Left out: the new daemon connects at once.
                            None => CtrlLink::Backoff { in_ms: 0 },
                        },
                        CState::Listening(_) => match &c.listener {
                            Some(l) => CtrlLink::Listening {
                                fd: fds.push(l.as_fd().as_raw_fd()),
                            },
                            None => CtrlLink::Backoff { in_ms: 0 },
                        },
                    };
                    CtrlState {
                        target: c.target.clone(),
                        state,
                        backoff: c.backoff.state(now),
                        connects: c.connects,
                        last_error: c.last_error.clone(),
                        ever_error: c.ever_error.clone(),
                        connected_ms: c.connected_at.map(|t| ms_since(now, t)),
                        disconnected_ms: c.disconnected_at.map(|t| ms_since(now, t)),
                    }
                })
                .collect();
            bridges.push(Lenient(Ok(OfBridgeState {
                bridge: b.clone(),
                election: bc.election.id,
                disconnected_ms: bc.disconnected_since.map(|t| ms_since(now, t)),
                fail_open: bc.fail_open,
                controllers,
            })));
        }
        let mut port_config: Vec<(String, u32)> = self
            .openflow
            .port_config
            .iter()
            .map(|(n, b)| (n.clone(), *b))
            .collect();
        port_config.sort();
        OpenflowState {
            listeners,
            conns,
            bridges,
            port_config,
        }
    }

    /// The management sockets, before the bridges are made (so that the bridge finds its
    /// socket and binds none). A bridge the configuration does not have, or a fd that is
    /// not a Unix listening socket, is skipped: that bridge binds its socket again once the
    /// old daemon is gone, as before.
    pub(super) fn of_restore_listeners(
        &mut self,
        st: &OpenflowState,
        bridges: &[String],
        fds: &mut FdTable,
    ) {
        for (bridge, i) in &st.listeners {
            let l = match fds.take(*i) {
                Ok(fd) => UnixListener::from(fd),
                Err(e) => {
                    self.of_refused(bridge, "management socket", &e);
                    continue;
                }
            };
            if !bridges.contains(bridge) || self.openflow.listeners.contains_key(bridge) {
                continue;
            }
            if let Err(e) = l.local_addr().and_then(|_| l.set_nonblocking(true)) {
                self.of_refused(bridge, "management socket", &e);
                continue;
            }
            let t = self.token(Source::OfListener, bridge);
            if self.epoll.add(l.as_fd(), t, false).is_err() {
                self.tokens.remove(&t);
                continue;
            }
            self.openflow.listeners.insert(bridge.clone(), (l, t));
        }
    }

    /// Every connection and each bridge's controllers, once the bridges and ports are
    /// built (no PORT_STATUS for the rebuilt ports reaches a handed-over peer). Nothing is
    /// read or written here: the event loop starts after the commit.
    pub(super) fn of_restore(&mut self, st: OpenflowState, fds: &mut FdTable) {
        let now = Instant::now();
        // Connections: index in the state → token.
        let mut tokens: Vec<Option<u64>> = Vec::with_capacity(st.conns.len());
        for (i, Lenient(c)) in st.conns.iter().enumerate() {
            let r = c
                .as_ref()
                .map_err(|e| OfConnError::Malformed(e.clone()))
                .and_then(|c| self.of_restore_conn(c, fds, now));
            match r {
                Ok(t) => tokens.push(Some(t)),
                Err(e) => {
                    let bridge = c.as_ref().map_or("-", |c| c.bridge.as_str()).to_string();
                    self.of_refused(&bridge, &format!("connection {i}"), &e);
                    tokens.push(None);
                }
            }
        }
        for Lenient(b) in &st.bridges {
            let r = b
                .as_ref()
                .map_err(|e| OfConnError::Malformed(e.clone()))
                .and_then(|b| self.of_restore_ctrls(b, &tokens, fds, now));
            if let Err(e) = r {
                let bridge = b.as_ref().map_or("-", |b| b.bridge.as_str()).to_string();
                self.of_refused(&bridge, "controllers", &e);
            }
        }
        // An active controller's connection that no controller claims (its bridge's
        // controllers were refused): closed, so that the controller is not connected
        // twice once the tick reconnects it.
        let claimed: Vec<u64> = self
            .openflow
            .ctrls
            .values()
            .flat_map(|bc| bc.controllers.iter())
            .filter_map(|c| match c.state {
                CState::Connecting(t) | CState::Connected(t) => Some(t),
                _ => None,
            })
            .collect();
        let orphans: Vec<u64> = tokens
            .iter()
            .flatten()
            .copied()
            .filter(|t| !claimed.contains(t))
            .filter(|t| {
                self.openflow.conns.get(t).is_some_and(|c| {
                    c.controller
                        .as_deref()
                        .is_some_and(|x| Target::parse(x).is_ok_and(|p| !p.is_passive()))
                })
            })
            .collect();
        for t in orphans {
            if let Some(c) = self.openflow.conns.remove(&t) {
                let _ = self.epoll.delete(c.stream.as_fd());
                self.tokens.remove(&t);
                let e = OfConnError::NoController(c.controller.clone().unwrap_or_default());
                self.of_refused(&c.bridge, "connection", &e);
            }
        }
        for (name, bits) in st.port_config {
            if self.ports.contains_key(&name) {
                self.openflow.port_config.insert(name, bits);
            }
        }
        // Fail-open as the old daemon had it, published before the PMDs resume.
        let open: Vec<String> = self
            .openflow
            .ctrls
            .iter()
            .filter(|(_, bc)| bc.fail_open)
            .map(|(b, _)| b.clone())
            .collect();
        for b in &open {
            if let Some(x) = self.bridges.get_mut(b) {
                x.dirty = true;
            }
        }
        if !open.is_empty() {
            self.publish();
        }
        // The peers know every port already: no PORT_STATUS on the first tick.
        for (name, p) in &self.ports {
            let up = matches!(p.link, Link::Connected | Link::Attached);
            self.openflow.link_seen.insert(name.clone(), up);
        }
        let kept = tokens.iter().flatten();
        let kept = kept.filter(|t| self.openflow.conns.contains_key(t)).count();
        self.openflow.counters.handed_over += kept as u64;
    }

    fn of_restore_conn(
        &mut self,
        c: &OfConnState,
        fds: &mut FdTable,
        now: Instant,
    ) -> Result<u64, OfConnError> {
        let fd = fds.take(c.socket)?;
        if !self.bridges.contains_key(&c.bridge) {
            return Err(OfConnError::NoBridge(c.bridge.clone()));
        }
        if let Some(t) = &c.controller {
            let known = self
                .config
                .bridges
                .iter()
                .find(|b| b.name == c.bridge)
                .is_some_and(|b| b.controllers.contains(t));
            if !known {
                return Err(OfConnError::NoController(t.clone()));
            }
        }
        let conn = OfConn::restore(c, fd, now)?;
        let t = self.token(Source::OfConn, &c.bridge);
        // Armed for writing: the first turn of the loop after the commit handles whatever
        // whole messages the old daemon had read and not handled, and writes its output
        // (a socket still connecting is not writable: nothing happens before it is).
        if let Err(e) = self.epoll.add(conn.stream.as_fd(), t, true) {
            self.tokens.remove(&t);
            return Err(OfConnError::Socket("pollable", e));
        }
        self.openflow.conns.insert(t, conn);
        Ok(t)
    }

    /// One bridge's controllers: each configured target with its state; a connection that
    /// was refused (or a listener) leaves its controller to try again at once.
    fn of_restore_ctrls(
        &mut self,
        b: &OfBridgeState,
        tokens: &[Option<u64>],
        fds: &mut FdTable,
        now: Instant,
    ) -> Result<(), OfConnError> {
        let Some(cfg) = self.config.bridges.iter().find(|x| x.name == b.bridge) else {
            return Err(OfConnError::NoBridge(b.bridge.clone()));
        };
        if !self.bridges.contains_key(&b.bridge) {
            return Err(OfConnError::NoBridge(b.bridge.clone()));
        }
        let targets = cfg.controllers.clone();
        let max = self.ctrl_max_backoff(&b.bridge);
        let mut controllers = Vec::new();
        for c in &b.controllers {
            if !targets.contains(&c.target)
                || controllers
                    .iter()
                    .any(|x: &Controller| x.target == c.target)
            {
                // Not (or no longer) configured: the tick reconciles.
                continue;
            }
            let Ok(parsed) = Target::parse(&c.target) else {
                continue;
            };
            let conn_of = |i: u32| {
                let t = tokens.get(i as usize).copied().flatten()?;
                let x = self.openflow.conns.get(&t)?;
                (x.bridge == b.bridge && x.controller.as_deref() == Some(c.target.as_str()))
                    .then_some(t)
            };
            let mut listener = None;
            let state = match c.state {
                CtrlLink::Backoff { in_ms } => {
                    CState::Backoff(now + Duration::from_millis(in_ms).min(max))
                }
                CtrlLink::Connecting { conn } => {
                    conn_of(conn).map_or(CState::Backoff(now), CState::Connecting)
                }
                CtrlLink::Connected { conn } => {
                    conn_of(conn).map_or(CState::Backoff(now), CState::Connected)
                }
                CtrlLink::Listening { fd } => {
                    match self.of_restore_passive(&b.bridge, &parsed, fds.take(fd)) {
                        Ok((l, t)) => {
                            listener = Some(l);
                            CState::Listening(t)
                        }
                        Err(e) => {
                            self.of_refused(&b.bridge, &c.target, &e);
                            CState::Backoff(now)
                        }
                    }
                }
            };
            controllers.push(Controller {
                target: c.target.clone(),
                parsed,
                backoff: Backoff::from_state(&c.backoff, max, now),
                state,
                listener,
                connects: c.connects,
                last_error: c.last_error.clone(),
                connected_at: c.connected_ms.map(|ms| ms_ago(now, ms)),
                disconnected_at: c.disconnected_ms.map(|ms| ms_ago(now, ms)),
                ever_error: c.ever_error.clone(),
            });
        }
        controllers.sort_by_key(|c| targets.iter().position(|t| *t == c.target));
        let bc = self.openflow.ctrls.entry(b.bridge.clone()).or_default();
        bc.controllers = controllers;
        bc.election = Election { id: b.election };
        bc.disconnected_since = b.disconnected_ms.map(|ms| ms_ago(now, ms));
        bc.fail_open = b.fail_open;
        Ok(())
    }

    /// A passive controller's listening socket, checked to be of its target's kind.
    fn of_restore_passive(
        &mut self,
        bridge: &str,
        target: &Target,
        fd: Result<OwnedFd, StateError>,
    ) -> Result<(PassiveListener, u64), OfConnError> {
        let fd = fd?;
        let l = match target {
            Target::PTcp(_) => {
                let l = TcpListener::from(fd);
                l.local_addr()
                    .and_then(|_| l.set_nonblocking(true))
                    .map_err(|e| OfConnError::Socket("TCP", e))?;
                PassiveListener::Tcp(l)
            }
            Target::PUnix(_) => {
                let l = UnixListener::from(fd);
                l.local_addr()
                    .and_then(|_| l.set_nonblocking(true))
                    .map_err(|e| OfConnError::Socket("Unix", e))?;
                PassiveListener::Unix(l)
            }
            _ => return Err(OfConnError::Malformed("an active target listening".into())),
        };
        let t = self.token(Source::CtrlListener, bridge);
        if let Err(e) = self.epoll.add(l.as_fd(), t, false) {
            self.tokens.remove(&t);
            return Err(OfConnError::Socket("pollable", e));
        }
        Ok((l, t))
    }

    /// A refused piece of the handed-over OpenFlow state: logged and counted; the rest
    /// goes on.
    fn of_refused(&mut self, bridge: &str, what: &str, e: &dyn std::error::Error) {
        self.openflow.counters.handover_refused += 1;
        log::warn!(
            "takeover: bridge {bridge}: handed-over OpenFlow {what} refused (closed): {}",
            with_sources(e)
        );
    }

    /// The OpenFlow side of an OpenFlow TLV table handed over in the datapath's map (the
    /// two are the same mappings: a TLV_TABLE_MOD applies only what the datapath keeps),
    /// so that NXT_TLV_TABLE_REPLY answers as before the upgrade.
    pub(super) fn of_restore_tlv(&mut self, bridge: &str, entries: &[(u16, u8, u8, u8)]) {
        if entries.is_empty() {
            return;
        }
        let maps: Vec<ferrovs_openflow::nx_msg::TlvMap> = entries
            .iter()
            .map(
                |&(class, kind, len, index)| ferrovs_openflow::nx_msg::TlvMap {
                    option_class: class,
                    option_type: kind,
                    option_len: len,
                    index: u16::from(index),
                },
            )
            .collect();
        let table = self.openflow.tlv.entry(bridge.to_string()).or_default();
        if let Err(e) = table.apply(ferrovs_openflow::nx_msg::ttmc::ADD, &maps) {
            log::warn!("takeover: bridge {bridge}: OpenFlow TLV table not restored: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Role;
    /// ofp-print.at's "OFPT_BUNDLE_ADD_MESSAGE - FLOW_MOD": its inner OpenFlow 1.4
    /// FLOW_MOD, as OVS writes it.
    fn flow_mod_bytes() -> Vec<u8> {
        let hex = "05 0e 00 90 00 00 00 02 00 00 00 00 00 00 00 00 \
                   00 00 00 00 00 00 00 00 01 00 00 00 00 00 ff ff \
                   ff ff ff ff ff ff ff ff ff ff ff ff 00 00 00 00 \
                   00 01 00 42 80 00 00 04 00 00 00 01 80 00 08 06 \
                   50 54 00 00 00 06 80 00 06 06 50 54 00 00 00 05 \
                   80 00 0a 02 08 06 80 00 0c 02 00 00 80 00 2a 02 \
                   00 02 80 00 2c 04 c0 a8 00 02 80 00 2e 04 c0 a8 \
                   00 01 00 00 00 00 00 00 00 04 00 18 00 00 00 00 \
                   00 00 00 10 00 00 00 03 00 00 00 00 00 00 00 00";
        let digits: Vec<u8> = hex
            .bytes()
            .filter(u8::is_ascii_hexdigit)
            .map(|c| (c as char).to_digit(16).unwrap() as u8)
            .collect();
        digits.chunks(2).map(|p| (p[0] << 4) | p[1]).collect()
    }

    /// A connection mid-way through everything (negotiated 1.5, master, NXT_PACKET_IN2,
    /// SET_ASYNC, half a message read, a reply half written, a bundle open with a message,
    /// an echo out) is exported and restored on the same socket with every field equal;
    /// the JSON form round-trips too.
    #[test]
    fn a_connection_round_trips() {
        let (a, mut peer) = UnixStream::pair().unwrap();
        let now = Instant::now();
        let mut c = OfConn::new(OfStream::Unix(a), "br-int", None, false, &[4, 5, 6]);
        c.negotiated = true;
        c.version = 5;
        c.framer.set_version(5);
        let fm = flow_mod_bytes();
        c.framer.push(&fm[..fm.len() / 2]);
        c.out = vec![6, 0, 0, 8];
        c.role = Role::Master;
        c.miss_send_len = 0xffff;
        c.packet_in_format = 1;
        c.controller_id = 3;
        c.async_cfg.packet_in_mask = [7, 1];
        c.probe = Some(Probe::new(Duration::from_secs(5), now));
        let b = BundleState {
            id: 9,
            flags: 3,
            closed: false,
            msgs: vec![HexBytes(fm.clone())],
        };
        c.bundles.insert(9, Bundle::restore(&b).unwrap());
        let mut fds = FdList::default();
        let st = c.export(&mut fds, now);
        assert_eq!(fds.0.len(), 1);
        assert_eq!(st.input, fm[..fm.len() / 2].to_vec());
        assert_eq!(st.bundles, vec![b]);
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["output"], "06000008");
        let back: OfConnState = serde_json::from_value(json).unwrap();
        assert_eq!(back, st);
        let fd = match &c.stream {
            OfStream::Unix(s) => OwnedFd::from(s.try_clone().unwrap()),
            OfStream::Tcp(_) => unreachable!(),
        };
        let mut r = OfConn::restore(&back, fd, now).unwrap();
        assert_eq!(r.export(&mut FdList::default(), now), st);
        // The rest of the message arrives at the new connection: one whole FLOW_MOD.
        r.framer.push(&fm[fm.len() / 2..]);
        assert_eq!(r.framer.next_message().unwrap().unwrap(), fm);
        // The output goes on from the exact byte, on the same socket.
        assert!(super::super::openflow::flush(&mut r));
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(got, [6, 0, 0, 8]);
    }

    /// Hostile state: each refusal is its own error, and nothing panics.
    #[test]
    fn a_corrupt_connection_is_refused() {
        let now = Instant::now();
        let (a, _peer) = UnixStream::pair().unwrap();
        let base = OfConn::new(OfStream::Unix(a), "br0", None, false, &[4])
            .export(&mut FdList::default(), now);
        let fd = || OwnedFd::from(UnixStream::pair().unwrap().0);
        let bad = |f: &dyn Fn(&mut OfConnState)| {
            let mut s = base.clone();
            f(&mut s);
            OfConn::restore(&s, fd(), now).unwrap_err()
        };
        let e = bad(&|s| {
            s.negotiated = true;
            s.version = 1;
        });
        assert!(matches!(e, OfConnError::Version(1)), "{e}");
        let e = bad(&|s| s.output = vec![0; OUT_MAX + 1]);
        assert!(
            matches!(
                e,
                OfConnError::TooLarge {
                    what: "unwritten output",
                    ..
                }
            ),
            "{e}"
        );
        let e = bad(&|s| s.input = vec![0; IN_MAX + READ_BUDGET + 1]);
        assert!(
            matches!(
                e,
                OfConnError::TooLarge {
                    what: "unread input",
                    ..
                }
            ),
            "{e}"
        );
        let e = bad(&|s| {
            s.bundles = vec![BundleState {
                id: 1,
                flags: 0,
                closed: false,
                msgs: vec![HexBytes(vec![6, 0, 0, 8, 0, 0, 0, 0])],
            }]
        });
        assert!(matches!(e, OfConnError::BundleMessage { id: 1 }), "{e}");
        let e = bad(&|s| {
            s.bundles = vec![BundleState {
                id: 2,
                flags: 0,
                closed: false,
                msgs: vec![HexBytes(vec![6, 14, 0, 9])],
            }]
        });
        assert!(matches!(e, OfConnError::BundleDecode { id: 2, .. }), "{e}");
        let e = bad(&|s| {
            let b = BundleState {
                id: 3,
                flags: 0,
                closed: false,
                msgs: vec![],
            };
            s.bundles = vec![b.clone(), b];
        });
        assert!(matches!(e, OfConnError::BundleTwice(3)), "{e}");
        // A TCP connection whose fd is a Unix socket, and a fd that is no socket.
        let e = bad(&|s| s.tcp = true);
        assert!(matches!(e, OfConnError::Socket("TCP", _)), "{e}");
        let file = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let e = OfConn::restore(&base, file, now).unwrap_err();
        assert!(matches!(e, OfConnError::Socket("Unix", _)), "{e}");
        // One element that does not parse is kept as its error; the list still parses.
        let list: Vec<Lenient<OfConnState>> = serde_json::from_value(serde_json::json!([
            serde_json::to_value(&base).unwrap(),
            {"socket": 1, "bridge": "br0", "negotiated": true, "version": 6, "role": "king",
             "miss_send_len": 0, "async_config": [[0, 0], [0, 0], [0, 0]]},
            {"socket": 2, "input": "xyz"},
        ]))
        .unwrap();
        assert!(list[0].0.is_ok());
        assert!(list[1].0.as_ref().unwrap_err().contains("king"));
        assert!(list[2].0.is_err());
    }
}
