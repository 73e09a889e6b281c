//! OpenFlow 1.3 over each bridge's passive management socket `RUN_DIR/BRIDGE.mgmt` (as
//! OVS's), so that `ovs-ofctl -O OpenFlow13 … unix:RUN_DIR/BRIDGE.mgmt` programs the bridge.
//!
//! Invariants:
//! * Every socket is non-blocking and lives in the daemon's one epoll loop. A connection's
//!   input is the codec's [`Framer`] (one message at most 64 KiB, the 16-bit length field's
//!   limit); it is read at most [`READ_BUDGET`] bytes per event (the loop is level-triggered,
//!   so the rest waits for the next turn); while [`OUT_BACKLOG`] bytes of replies wait
//!   unread, messages wait in the framer, and a peer with more than [`IN_MAX`] waiting input
//!   or [`OUT_MAX`] unread replies is dropped. No input stalls the loop or the datapath: the
//!   PMDs only ever see the published pipeline.
//! * A malformed message gets the codec's ERROR reply ([`OfError::encode_reply`]) and the
//!   connection goes on; a stream whose framing is lost (`length < 8`) or whose HELLO
//!   offers no common version gets its ERROR and is closed. Each is counted
//!   ([`OfCounters`]) and logged through the rate limiter.
//! * A FLOW_MOD changes the bridge's rules through `crate::openflow` (all or nothing), then
//!   the configuration and the datapath exactly as `ferrovs add-flow` does, before the next
//!   message (so a BARRIER reply means every earlier change is published).
//! * The listener follows the bridge (created with it, removed with it). During a hot
//!   upgrade the old daemon still holds the socket; the new one binds it on its first ticks
//!   once the old one is gone (connections are not handed over: ovs-ofctl reconnects per
//!   command).

use ferrovs_openflow::error::{et, hfc, mmfc, pmfc, rrfc};
use ferrovs_openflow::message::{capabilities, role};
use ferrovs_openflow::multipart::{
    tfpt, Desc, MultipartReplyBody as A, MultipartRequestBody as Q, PortStats as OfPortStats,
    TableFeatureProp, TableFeatures, TableStats,
};
use ferrovs_openflow::port::{state as pstate, OFPP_ANY};
use ferrovs_openflow::{
    decode, encode, encode_multipart_reply, negotiate, FrameError, Framer, Message, OfError,
    SwitchConfig, SwitchFeatures, VERSION_1_3,
};

use crate::openflow::{self as ofmap, PortMap, Selector, N_TABLES};

use super::*;

/// Bytes read from one connection per epoll event.
const READ_BUDGET: usize = 256 << 10;
/// Replies waiting unread past which the connection's input waits too.
const OUT_BACKLOG: usize = 1 << 20;
/// Replies waiting unread past which the peer is dropped (a dump of ~100 000 rules fits).
const OUT_MAX: usize = 64 << 20;
/// Input waiting (behind unread replies) past which the peer is dropped.
const IN_MAX: usize = 4 << 20;

/// What the management sockets saw, for the log and tests.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct OfCounters {
    pub accepted: u64,
    /// Messages refused with an ERROR (malformed, unsupported, refused flow-mods).
    pub errors_sent: u64,
    /// Connections closed by the switch (lost framing, no common version, flooding).
    pub dropped: u64,
    pub flow_mods: u64,
}

#[derive(Debug)]
pub(super) struct OfConn {
    stream: UnixStream,
    bridge: String,
    framer: Framer,
    out: Vec<u8>,
    /// The peer's HELLO was read and a version agreed.
    negotiated: bool,
    /// Close once `out` is written.
    closing: bool,
}

/// The management sockets and their connections.
#[derive(Debug, Default)]
pub(super) struct OfState {
    /// Bridge → its listener and epoll token (absent while the socket cannot be bound).
    listeners: HashMap<String, (UnixListener, u64)>,
    conns: HashMap<u64, OfConn>,
    pub counters: OfCounters,
}

/// The management socket's path of `bridge`.
pub fn mgmt_path(run_dir: &Path, bridge: &str) -> PathBuf {
    run_dir.join(format!("{bridge}.mgmt"))
}

/// A bridge's datapath id: the number of `vswitchdb::datapath_id`'s 16 hex digits.
fn datapath_id(bridge: &str) -> u64 {
    let s = crate::vswitchdb::datapath_id(None, None, bridge);
    u64::from_str_radix(&s, 16).unwrap_or(0)
}

impl Daemon {
    /// Binds the management socket of `bridge` (bridge created, or retried on the tick).
    pub(super) fn of_listen(&mut self, bridge: &str) {
        if self.openflow.listeners.contains_key(bridge) {
            return;
        }
        let path = mgmt_path(&self.run_dir, bridge);
        match bind_socket(&path) {
            Ok(l) => {
                let t = self.token(Source::OfListener, bridge);
                if self.epoll.add(l.as_fd(), t, false).is_err() {
                    self.tokens.remove(&t);
                    return;
                }
                self.openflow.listeners.insert(bridge.to_string(), (l, t));
            }
            Err(e) => limited!(
                self.logs,
                Warn,
                bridge,
                "mgmt",
                "OpenFlow management socket: {}",
                with_sources(&e)
            ),
        }
    }

    /// Closes the management socket of `bridge` and its connections (bridge removed).
    pub(super) fn of_unlisten(&mut self, bridge: &str) {
        if let Some((l, t)) = self.openflow.listeners.remove(bridge) {
            let _ = self.epoll.delete(l.as_fd());
            self.tokens.remove(&t);
            let _ = std::fs::remove_file(mgmt_path(&self.run_dir, bridge));
        }
        let gone: Vec<u64> = self
            .openflow
            .conns
            .iter()
            .filter(|(_, c)| c.bridge == bridge)
            .map(|(t, _)| *t)
            .collect();
        for t in gone {
            if let Some(c) = self.openflow.conns.remove(&t) {
                let _ = self.epoll.delete(c.stream.as_fd());
                self.tokens.remove(&t);
            }
        }
    }

    /// The tick: binds the sockets of bridges that have none yet (after a takeover).
    pub(super) fn of_tick(&mut self) {
        let missing: Vec<String> = self
            .bridges
            .keys()
            .filter(|b| !self.openflow.listeners.contains_key(*b))
            .cloned()
            .collect();
        for b in missing {
            self.of_listen(&b);
        }
    }

    /// Removes every management socket (shutdown).
    pub(super) fn of_shutdown(&mut self) {
        let names: Vec<String> = self.openflow.listeners.keys().cloned().collect();
        for b in names {
            self.of_unlisten(&b);
        }
    }

    pub(super) fn on_of_listener(&mut self, bridge: &str) {
        loop {
            let Some((l, _)) = self.openflow.listeners.get(bridge) else {
                return;
            };
            match l.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let t = self.token(Source::OfConn, bridge);
                    if self.epoll.add(s.as_fd(), t, false).is_err() {
                        self.tokens.remove(&t);
                        continue;
                    }
                    self.openflow.counters.accepted += 1;
                    let mut c = OfConn {
                        stream: s,
                        bridge: bridge.to_string(),
                        framer: Framer::new(),
                        out: encode(
                            &Message::Hello {
                                versions: vec![VERSION_1_3],
                            },
                            0,
                        ),
                        negotiated: false,
                        closing: false,
                    };
                    flush(&mut c);
                    self.openflow.conns.insert(t, c);
                    self.of_rearm(t);
                }
                Err(_) => return,
            }
        }
    }

    fn of_rearm(&mut self, t: u64) {
        if let Some(c) = self.openflow.conns.get(&t) {
            let _ = self.epoll.modify(c.stream.as_fd(), t, !c.out.is_empty());
        }
    }

    pub(super) fn on_of_conn(&mut self, t: u64, ev: &EpollEvent) {
        let Some(mut c) = self.openflow.conns.remove(&t) else {
            return;
        };
        let mut eof = false;
        if ev.readable || ev.hangup {
            // Always read what is there (the loop is level-triggered: unread input would
            // wake it again and again); while replies wait, the messages wait whole in the
            // framer, up to IN_MAX.
            let mut buf = [0u8; 65536];
            let mut read = 0;
            while read < READ_BUDGET {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        read += n;
                        if c.closing {
                            // Closing: what the peer still sends is not read any more.
                            continue;
                        }
                        c.framer.push(&buf[..n]);
                        self.of_handle(&mut c);
                        if c.framer.pending() > IN_MAX {
                            self.openflow.counters.dropped += 1;
                            limited!(
                                self.logs,
                                Warn,
                                &c.bridge,
                                "mgmt",
                                "OpenFlow peer sends without reading its replies: dropped"
                            );
                            eof = true;
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        eof = true;
                        break;
                    }
                }
            }
        }
        if !c.closing && c.out.len() < OUT_BACKLOG {
            // Writable again: messages that waited for the backlog to drain.
            self.of_handle(&mut c);
        }
        if !flush(&mut c) {
            eof = true;
        }
        if c.out.len() > OUT_MAX {
            self.openflow.counters.dropped += 1;
            limited!(
                self.logs,
                Warn,
                &c.bridge,
                "mgmt",
                "OpenFlow peer does not read its replies: dropped"
            );
            eof = true;
        }
        if eof || (c.closing && c.out.is_empty()) {
            let _ = self.epoll.delete(c.stream.as_fd());
            self.tokens.remove(&t);
            return;
        }
        self.openflow.conns.insert(t, c);
        self.of_rearm(t);
    }

    /// Handles every whole message in the connection's framer (until the backlog is full).
    fn of_handle(&mut self, c: &mut OfConn) {
        while !c.closing && c.out.len() < OUT_BACKLOG {
            match c.framer.next_message() {
                Ok(Some(msg)) => self.of_message(c, &msg),
                Ok(None) => return,
                Err(e) => {
                    let reply = match &e {
                        FrameError::BadVersion { message, .. } => {
                            e.of_error().encode_reply(message)
                        }
                        FrameError::BadLength(_) => {
                            // The stream is lost: answer with the header we have and close.
                            c.closing = true;
                            self.openflow.counters.dropped += 1;
                            e.of_error().encode_reply(&[])
                        }
                    };
                    self.openflow.counters.errors_sent += 1;
                    limited!(self.logs, Info, &c.bridge, "mgmt", "OpenFlow: {e}");
                    c.out.extend_from_slice(&reply);
                }
            }
        }
    }

    fn of_refuse(&mut self, c: &mut OfConn, e: OfError, msg: &[u8]) {
        self.openflow.counters.errors_sent += 1;
        limited!(
            self.logs,
            Info,
            &c.bridge,
            "mgmt",
            "OpenFlow request refused with {}: {}",
            e.name().unwrap_or("an error"),
            e
        );
        c.out.extend_from_slice(&e.encode_reply(msg));
    }

    fn of_message(&mut self, c: &mut OfConn, msg: &[u8]) {
        let decoded = decode(msg);
        if !c.negotiated {
            // The first message must be HELLO (§6.3.1).
            match decoded {
                Ok((h, Message::Hello { versions })) => {
                    match negotiate(&[VERSION_1_3], h.version, &versions) {
                        Some(v) => {
                            c.framer.set_version(v);
                            c.negotiated = true;
                        }
                        None => {
                            self.openflow.counters.dropped += 1;
                            c.closing = true;
                            self.of_refuse(
                                c,
                                OfError::new(
                                    et::HELLO_FAILED,
                                    hfc::INCOMPATIBLE,
                                    "no common OpenFlow version (this switch speaks 1.3)",
                                ),
                                msg,
                            );
                        }
                    }
                }
                _ => {
                    self.openflow.counters.dropped += 1;
                    c.closing = true;
                    self.of_refuse(
                        c,
                        OfError::new(
                            et::HELLO_FAILED,
                            hfc::INCOMPATIBLE,
                            "the first message must be HELLO",
                        ),
                        msg,
                    );
                }
            }
            return;
        }
        let (h, m) = match decoded {
            Ok(x) => x,
            Err(e) => return self.of_refuse(c, e, msg),
        };
        let reply = |c: &mut OfConn, m: &Message| c.out.extend_from_slice(&encode(m, h.xid));
        match m {
            Message::Hello { .. } | Message::EchoReply(_) | Message::Error(_) => {}
            Message::EchoRequest(d) => reply(c, &Message::EchoReply(d)),
            Message::FeaturesRequest => reply(
                c,
                &Message::FeaturesReply(SwitchFeatures {
                    datapath_id: datapath_id(&c.bridge),
                    n_buffers: 0,
                    n_tables: N_TABLES,
                    auxiliary_id: 0,
                    capabilities: capabilities::FLOW_STATS
                        | capabilities::TABLE_STATS
                        | capabilities::PORT_STATS,
                }),
            ),
            Message::GetConfigRequest => reply(
                c,
                &Message::GetConfigReply(SwitchConfig {
                    flags: 0,
                    miss_send_len: 128,
                }),
            ),
            // Fragments are treated normally, and nothing goes to a controller yet.
            Message::SetConfig(_) => {}
            Message::BarrierRequest => reply(c, &Message::BarrierReply),
            Message::RoleRequest(r) => {
                // One management connection at a time has no one to compete with: equal
                // and master are granted as asked; slave would refuse every change, which
                // this switch does not enforce, so it is refused.
                match r.role {
                    role::NOCHANGE | role::EQUAL | role::MASTER => {
                        let granted = if r.role == role::NOCHANGE {
                            role::EQUAL
                        } else {
                            r.role
                        };
                        reply(
                            c,
                            &Message::RoleReply(ferrovs_openflow::Role {
                                role: granted,
                                generation_id: r.generation_id,
                            }),
                        )
                    }
                    _ => self.of_refuse(
                        c,
                        OfError::new(
                            et::ROLE_REQUEST_FAILED,
                            rrfc::UNSUP,
                            "the slave role is not supported",
                        ),
                        msg,
                    ),
                }
            }
            Message::FlowMod(fm) => {
                self.openflow.counters.flow_mods += 1;
                if let Err(e) = self.of_flow_mod(&c.bridge, &fm) {
                    self.of_refuse(c, e, msg);
                }
            }
            Message::GroupMod(g) => {
                if let Err(e) = self.of_group_mod(&c.bridge, &g) {
                    self.of_refuse(c, e, msg);
                }
            }
            // Deleting meters that do not exist is no error (OpenFlow 1.3).
            Message::MeterMod(m) if m.command == ferrovs_openflow::message::meter::DELETE => {}
            Message::MeterMod(mm) => {
                let e = if mm.command == ferrovs_openflow::message::meter::ADD {
                    OfError::new(
                        et::METER_MOD_FAILED,
                        mmfc::OUT_OF_METERS,
                        "meters are not supported yet",
                    )
                } else {
                    OfError::new(
                        et::METER_MOD_FAILED,
                        mmfc::UNKNOWN_METER,
                        "meters are not supported yet (no meter exists)",
                    )
                };
                self.of_refuse(c, e, msg)
            }
            Message::PortMod(_) => self.of_refuse(
                c,
                OfError::new(
                    et::PORT_MOD_FAILED,
                    pmfc::EPERM,
                    "port configuration over OpenFlow is not supported yet",
                ),
                msg,
            ),
            Message::MultipartRequest(r) => match self.of_multipart(&c.bridge, &r.body) {
                Ok(body) => {
                    for part in encode_multipart_reply(&body, h.xid) {
                        c.out.extend_from_slice(&part);
                    }
                }
                Err(e) => self.of_refuse(c, e, msg),
            },
            // Packet-out, table-mod, async configuration and what a controller (not a
            // switch) sends: not supported.
            _ => self.of_refuse(
                c,
                OfError::new(
                    et::BAD_REQUEST,
                    ferrovs_openflow::error::brc::BAD_TYPE,
                    "message type not supported",
                ),
                msg,
            ),
        }
    }

    fn of_ports(&self, bridge: &str) -> PortMap {
        PortMap::new(
            bridge,
            self.ports
                .values()
                .filter(|p| p.bridge == bridge)
                .map(|p| (p.ofport, p.cfg.name.as_str())),
        )
    }

    /// A FLOW_MOD: the rules change as `ferrovs add-flow`/`del-flows` change them.
    fn of_flow_mod(&mut self, bridge: &str, fm: &ferrovs_openflow::FlowMod) -> Result<(), OfError> {
        let ports = self.of_ports(bridge);
        let Some(b) = self.bridges.get_mut(bridge) else {
            return Ok(());
        };
        let applied = ofmap::apply_flow_mod(&mut b.rules, fm, &ports)?;
        let changed = match applied {
            ofmap::Applied::Added => true,
            ofmap::Applied::Modified(n) | ofmap::Applied::Deleted(n) => n > 0,
        };
        if changed {
            b.dirty = true;
            self.sync_flows_config(bridge);
            self.publish();
            self.save();
        }
        Ok(())
    }

    /// A GROUP_MOD: applied to the bridge's groups (with the rules that use a deleted
    /// group), published and saved.
    fn of_group_mod(
        &mut self,
        bridge: &str,
        gm: &ferrovs_openflow::GroupMod,
    ) -> Result<(), OfError> {
        let ports = self.of_ports(bridge);
        let Some(b) = self.bridges.get_mut(bridge) else {
            return Ok(());
        };
        ofmap::apply_group_mod(&mut b.rules, gm, &ports)?;
        b.dirty = true;
        self.sync_flows_config(bridge);
        self.publish();
        self.save();
        Ok(())
    }

    fn of_multipart(&self, bridge: &str, q: &Q) -> Result<A, OfError> {
        let ports = self.of_ports(bridge);
        let b = &self.bridges[bridge];
        Ok(match q {
            Q::Desc => A::Desc(Desc {
                mfr_desc: "ferrovs".into(),
                hw_desc: "ferrovs userspace switch".into(),
                sw_desc: env!("CARGO_PKG_VERSION").into(),
                serial_num: "None".into(),
                dp_desc: bridge.into(),
            }),
            Q::Flow(r) => {
                let sel = Selector::from_stats_request(r, &ports)?;
                b.cache.push_stats();
                A::Flow(
                    b.rules
                        .rules()
                        .iter()
                        .filter(|x| sel.selects(&x.spec))
                        .map(|x| ofmap::flow_stats(x, &ports))
                        .collect(),
                )
            }
            Q::Aggregate(r) => {
                let sel = Selector::from_stats_request(r, &ports)?;
                b.cache.push_stats();
                A::Aggregate(ofmap::aggregate(&b.rules, &sel))
            }
            Q::Table => A::Table(
                (0..N_TABLES)
                    .map(|t| TableStats {
                        table_id: t,
                        active_count: b.rules.rules().iter().filter(|r| r.spec.table == t).count()
                            as u32,
                        lookup_count: 0,
                        matched_count: 0,
                    })
                    .collect(),
            ),
            Q::PortStats { port_no } => {
                let mut v = Vec::new();
                for p in self.ports.values().filter(|p| p.bridge == bridge) {
                    let Some(no) = ports.number(&p.cfg.name) else {
                        continue;
                    };
                    if *port_no != OFPP_ANY && *port_no != no {
                        continue;
                    }
                    let Ok(s) = self.port_stats(Some(&p.cfg.name)) else {
                        continue;
                    };
                    let Some(s) = s.first() else { continue };
                    v.push(OfPortStats {
                        port_no: no,
                        rx_packets: s.rx.packets,
                        tx_packets: s.tx.packets,
                        rx_bytes: s.rx.bytes,
                        tx_bytes: s.tx.bytes,
                        rx_dropped: s.rx.dropped,
                        tx_dropped: s.tx.dropped,
                        ..Default::default()
                    });
                }
                A::PortStats(v)
            }
            Q::PortDesc => A::PortDesc(
                self.ports
                    .values()
                    .filter(|p| p.bridge == bridge)
                    .filter_map(|p| port_desc(p, &ports))
                    .collect(),
            ),
            Q::TableFeatures => A::TableFeatures(
                (0..N_TABLES)
                    .map(|t| TableFeatures {
                        table_id: t,
                        name: format!("table{t}"),
                        metadata_match: 0,
                        metadata_write: 0,
                        config: 0,
                        max_entries: 1_000_000,
                        properties: table_props(t),
                    })
                    .collect(),
            ),
            Q::Group { group_id } => {
                b.cache.push_stats();
                A::Group(ofmap::group_stats(&b.rules, *group_id))
            }
            Q::GroupDesc => A::GroupDesc(
                b.rules
                    .groups()
                    .values()
                    .map(|g| ofmap::group_desc(&g.spec, &ports))
                    .collect(),
            ),
            Q::GroupFeatures => A::GroupFeatures(ofmap::group_features()),
            Q::Meter { .. } => A::Meter(vec![]),
            Q::MeterConfig { .. } => A::MeterConfig(vec![]),
            Q::MeterFeatures => {
                return Err(OfError::new(
                    et::BAD_REQUEST,
                    ferrovs_openflow::error::brc::BAD_MULTIPART,
                    "meters are not supported yet",
                ))
            }
        })
    }
}

impl Daemon {
    /// The description of port `name` as its bridge's OpenFlow peers know it.
    pub(super) fn of_port_desc(&self, name: &str) -> Option<(String, ferrovs_openflow::Port)> {
        let p = self.ports.get(name)?;
        let d = port_desc(p, &self.of_ports(&p.bridge))?;
        Some((p.bridge.clone(), d))
    }

    /// PORT_STATUS (`reason`: `OFPPR_ADD`, `_DELETE`, `_MODIFY`) to every peer of `bridge`
    /// past HELLO.
    pub(super) fn of_port_status(
        &mut self,
        bridge: &str,
        port: ferrovs_openflow::Port,
        reason: u8,
    ) {
        let msg = encode(&Message::PortStatus { reason, port }, 0);
        let tokens: Vec<u64> = self
            .openflow
            .conns
            .iter()
            .filter(|(_, c)| c.bridge == bridge && c.negotiated && !c.closing)
            .map(|(t, _)| *t)
            .collect();
        for t in tokens {
            if let Some(c) = self.openflow.conns.get_mut(&t) {
                if c.out.len() < OUT_MAX {
                    c.out.extend_from_slice(&msg);
                }
                let _ = flush(c);
            }
            self.of_rearm(t);
        }
    }
}

/// A port's `ofp_port`: a stable local MAC (ports have no MAC of their own: the guest's or
/// the kernel's is on the other side), state `LIVE` or `LINK_DOWN`.
fn port_desc(p: &PortState, ports: &PortMap) -> Option<ferrovs_openflow::Port> {
    let no = ports.number(&p.cfg.name)?;
    let up = matches!(p.link, Link::Connected | Link::Attached);
    Some(ferrovs_openflow::Port {
        port_no: no,
        hw_addr: port_mac(&p.cfg.name),
        name: p.cfg.name.clone(),
        config: 0,
        state: if up { pstate::LIVE } else { pstate::LINK_DOWN },
        ..Default::default()
    })
}

/// Writes what it can; false when the peer is gone.
fn flush(c: &mut OfConn) -> bool {
    while !c.out.is_empty() {
        match c.stream.write(&c.out) {
            Ok(0) => return false,
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
    true
}

/// A stable, locally administered MAC for a port's description.
fn port_mac(name: &str) -> [u8; 6] {
    let h = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        .to_be_bytes();
    [0x02, h[1], h[2], h[3], h[4], h[5]]
}

/// The eight properties OpenFlow 1.3 requires of a table's features: what the pipeline
/// takes (apply-actions and goto-table; the actions and fields `crate::openflow` maps).
fn table_props(t: u8) -> Vec<TableFeatureProp> {
    use ferrovs_openflow::action::{at, it};
    use ferrovs_openflow::oxm::Field as F;
    let insts = [it::GOTO_TABLE, it::APPLY_ACTIONS];
    let acts = [
        at::OUTPUT,
        at::PUSH_VLAN,
        at::POP_VLAN,
        at::SET_NW_TTL,
        at::SET_FIELD,
    ];
    let next: Vec<u8> = (t.saturating_add(1)..N_TABLES).collect();
    let matches = [
        F::InPort,
        F::EthDst,
        F::EthSrc,
        F::EthType,
        F::VlanVid,
        F::VlanPcp,
        F::IpDscp,
        F::IpProto,
        F::Ipv4Src,
        F::Ipv4Dst,
        F::TcpSrc,
        F::TcpDst,
        F::UdpSrc,
        F::UdpDst,
        F::SctpSrc,
        F::SctpDst,
        F::Icmpv4Type,
        F::Icmpv4Code,
        F::ArpOp,
        F::ArpSpa,
        F::ArpTpa,
        F::Ipv6Src,
        F::Ipv6Dst,
        F::Icmpv6Type,
        F::Icmpv6Code,
        F::TunnelId,
    ];
    let sets = [
        F::EthDst,
        F::EthSrc,
        F::VlanVid,
        F::VlanPcp,
        F::IpDscp,
        F::Ipv4Src,
        F::Ipv4Dst,
        F::TcpSrc,
        F::TcpDst,
        F::UdpSrc,
        F::UdpDst,
        F::Ipv6Src,
        F::Ipv6Dst,
        F::TunnelId,
    ];
    let mut v = Vec::new();
    for miss in [0, 1] {
        v.push(TableFeatureProp::instructions(
            tfpt::INSTRUCTIONS + miss,
            &insts,
        ));
        v.push(TableFeatureProp::next_tables(
            tfpt::NEXT_TABLES + miss,
            &next,
        ));
        v.push(TableFeatureProp::actions(tfpt::WRITE_ACTIONS + miss, &[]));
        v.push(TableFeatureProp::actions(tfpt::APPLY_ACTIONS + miss, &acts));
        v.push(TableFeatureProp::oxm_ids(
            tfpt::WRITE_SETFIELD + miss,
            &[],
            false,
        ));
        v.push(TableFeatureProp::oxm_ids(
            tfpt::APPLY_SETFIELD + miss,
            &sets,
            false,
        ));
    }
    v.push(TableFeatureProp::oxm_ids(tfpt::MATCH, &matches, true));
    v.push(TableFeatureProp::oxm_ids(tfpt::WILDCARDS, &matches, false));
    v
}
