//! OpenFlow 1.3, 1.4 and 1.5 over each bridge's passive management socket
//! `RUN_DIR/BRIDGE.mgmt` (as OVS's), so that `ovs-ofctl -O OpenFlow13 …
//! unix:RUN_DIR/BRIDGE.mgmt` programs the bridge and ovn-controller (which allows only 1.5)
//! connects to it.
//!
//! * Each connection speaks the version its HELLO negotiated (the highest both offer of
//!   the bridge's `protocols`, by default 1.3, 1.4 and 1.5): every message the switch sends
//!   on it is written in that version's layout ([`OfConn::encode`], [`Fanout`] for one
//!   message to many connections).
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
//! * The listener follows the bridge (created with it, removed with it). A hot upgrade
//!   hands the listener and every connection over, at the exact byte of each message
//!   (`of_handover.rs`); a new daemon given none (an older peer's state) binds the socket
//!   on its first ticks once the old one is gone.

use std::collections::BTreeSet;

use ferrovs_openflow::error::{et, hfc};
use ferrovs_openflow::message::capabilities;
use ferrovs_openflow::multipart::{
    tfpt, Desc, MultipartReplyBody as A, MultipartRequestBody as Q, PortStats as OfPortStats,
    TableFeatureProp, TableFeatures, TableStats,
};
use ferrovs_openflow::nx_msg::{pif, NxMessage, PacketIn2};
use ferrovs_openflow::port::{state as pstate, OFPP_ANY};
use ferrovs_openflow::{
    decode, encode, encode_multipart_reply_with_version, encode_with_version, negotiate,
    FrameError, Framer, Message, OfError, SwitchFeatures, VERSION_1_3, VERSION_1_5,
};

use crate::openflow::{self as ofmap, PortMap, Selector, N_TABLES};

use super::*;

/// Bytes read from one connection per epoll event.
pub(super) const READ_BUDGET: usize = 256 << 10;
/// Replies waiting unread past which the connection's input waits too.
pub(super) const OUT_BACKLOG: usize = 1 << 20;
/// Replies waiting unread past which the peer is dropped (a dump of ~100 000 rules fits).
pub(super) const OUT_MAX: usize = 64 << 20;
/// Input waiting (behind unread replies) past which the peer is dropped.
pub(super) const IN_MAX: usize = 4 << 20;

/// What the management sockets saw, for the log, `ferrovs show --json` and tests.
#[derive(Debug, Default, Clone)]
pub(super) struct OfCounters {
    pub accepted: u64,
    /// Messages refused with an ERROR (malformed, unsupported, refused flow-mods).
    pub errors_sent: u64,
    /// Connections closed by the switch (lost framing, no common version, flooding).
    pub dropped: u64,
    pub flow_mods: u64,
    /// Inactivity probes (ECHO_REQUEST) sent to idle controllers.
    pub echo_probes: u64,
    /// PACKET_IN messages written to connections (one per receiving connection).
    pub packet_ins_sent: u64,
    /// Packet-ins a receiving connection missed because its replies waited unread.
    pub packet_ins_unsent: u64,
    /// PACKET_OUT messages received (refused ones included).
    pub packet_outs: u64,
    /// Packet-outs accepted but not executed (the queue was full, or no frame).
    pub packet_outs_dropped: u64,
    /// `NXT_RESUME`s received, and those refused (garbage, stale, bad actions).
    pub resumes: u64,
    pub resumes_refused: u64,
    /// Packet-ins that carried a continuation (`controller(pause)`), per connection.
    pub continuations_sent: u64,
    /// FLOW_REMOVED messages written to connections.
    pub flow_removed_sent: u64,
    /// Connections that negotiated each version (index: wire version 4, 5, 6 → 0, 1, 2).
    pub negotiated: [u64; 3],
    /// Nicira messages received.
    pub nx_messages: u64,
    /// Bundles committed, and the messages they held.
    pub bundles_committed: u64,
    pub bundled_messages: u64,
    /// Bundles whose commit was refused (one message refused: none applied).
    pub bundles_failed: u64,
    /// Connections this daemon took over from the one it replaced (hot upgrade).
    pub handed_over: u64,
    /// Pieces of the handed-over OpenFlow state refused at a takeover (each closed alone:
    /// a connection, a listener, a bridge's controllers).
    pub handover_refused: u64,
    /// ERROR replies by error name (`OFPBAC_BAD_EXP_TYPE`, ...).
    pub refused: BTreeMap<&'static str, u64>,
}

/// An OpenFlow connection's socket: the management socket's and `unix:`/`punix:`
/// controllers' are Unix streams, `tcp:`/`ptcp:` controllers' TCP.
#[derive(Debug)]
pub(super) enum OfStream {
    Unix(UnixStream),
    Tcp(std::net::TcpStream),
}

impl Read for OfStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            OfStream::Unix(s) => s.read(buf),
            OfStream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for OfStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            OfStream::Unix(s) => s.write(buf),
            OfStream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for OfStream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            OfStream::Unix(s) => s.as_fd(),
            OfStream::Tcp(s) => s.as_fd(),
        }
    }
}

pub use crate::controller::Role;

#[derive(Debug)]
pub(super) struct OfConn {
    pub(super) stream: OfStream,
    pub(super) bridge: String,
    pub(super) framer: Framer,
    pub(super) out: Vec<u8>,
    /// The peer's HELLO was read and a version agreed.
    pub(super) negotiated: bool,
    /// Close once `out` is written.
    pub(super) closing: bool,
    /// The connection's OpenFlow role (ROLE_REQUEST); equal until asked.
    pub(super) role: Role,
    /// The controller (its target) this connection belongs to; `None`: a management
    /// connection (a service connection in OVS's terms: never refused as a slave).
    pub(super) controller: Option<String>,
    /// A non-blocking TCP connect still under way (HELLO goes once it is done).
    pub(super) connecting: bool,
    /// The inactivity probe (controller connections).
    pub(super) probe: Option<crate::controller::Probe>,
    /// A service connection (the management socket: asynchronous messages only after a
    /// non-zero `miss_send_len`), not a controller's (`packet_io`).
    pub(super) service: bool,
    /// SET_CONFIG's `miss_send_len` (0 for a service connection until it sets one).
    pub(super) miss_send_len: u16,
    /// Which asynchronous messages this connection gets (SET_ASYNC).
    pub(super) async_cfg: ferrovs_openflow::AsyncConfig,
    /// The negotiated wire version (1.3 until HELLO).
    pub(super) version: u8,
    /// `NXPIF_*` (NXT_SET_PACKET_IN_FORMAT): standard, or `NXT_PACKET_IN2`.
    pub(super) packet_in_format: u32,
    /// NXT_SET_CONTROLLER_ID's id (kept; ferrovs sends no message that carries it).
    pub(super) controller_id: u16,
    /// Open bundles by id (`bundles.rs`).
    pub(super) bundles: BTreeMap<u32, super::bundles::Bundle>,
}

impl OfConn {
    /// A new connection on `stream`, HELLO queued unless `connecting`.
    pub(super) fn new(
        stream: OfStream,
        bridge: &str,
        controller: Option<String>,
        connecting: bool,
        versions: &[u8],
    ) -> OfConn {
        let service = controller.is_none();
        OfConn {
            stream,
            bridge: bridge.to_string(),
            framer: Framer::new(),
            out: if connecting {
                Vec::new()
            } else {
                hello(versions)
            },
            negotiated: false,
            closing: false,
            role: Role::Equal,
            controller,
            connecting,
            probe: None,
            service,
            miss_send_len: if service {
                0
            } else {
                super::packet_io::DEFAULT_MISS_SEND_LEN
            },
            async_cfg: super::packet_io::DEFAULT_ASYNC,
            version: VERSION_1_3,
            packet_in_format: pif::STANDARD,
            controller_id: 0,
            bundles: BTreeMap::new(),
        }
    }

    /// `m` encoded in this connection's version.
    pub(super) fn encode(&self, m: &Message, xid: u32) -> Vec<u8> {
        encode_with_version(m, self.version, xid)
    }
}

/// One asynchronous message for several connections, encoded once per wire version and
/// packet-in format it goes out in (a PACKET_IN becomes an `NXT_PACKET_IN2` for a
/// connection that asked for that format).
#[derive(Debug)]
pub(super) struct Fanout {
    msg: Message,
    done: Vec<(u8, bool, Vec<u8>)>,
    /// A packet-in's `NXPINT_USERDATA` and `NXPINT_CONTINUATION` (only `NXT_PACKET_IN2`
    /// carries them).
    userdata: Option<Vec<u8>>,
    continuation: Option<Vec<u8>>,
}

impl Fanout {
    pub(super) fn new(msg: Message) -> Fanout {
        Fanout {
            msg,
            done: Vec::new(),
            userdata: None,
            continuation: None,
        }
    }

    /// A packet-in with what only `NXT_PACKET_IN2` carries.
    pub(super) fn packet_in(
        msg: Message,
        userdata: Option<Vec<u8>>,
        continuation: Option<Vec<u8>>,
    ) -> Fanout {
        Fanout {
            userdata,
            continuation,
            ..Fanout::new(msg)
        }
    }

    /// Whether connection `c` gets a continuation (it reads `NXT_PACKET_IN2`).
    pub(super) fn continues(&self, c: &OfConn) -> bool {
        self.continuation.is_some() && c.packet_in_format == pif::NXT_PACKET_IN2
    }

    /// The bytes for connection `c`.
    pub(super) fn bytes(&mut self, c: &OfConn) -> &[u8] {
        let pin2 = c.packet_in_format == pif::NXT_PACKET_IN2;
        let pin2 = pin2 && matches!(self.msg, Message::PacketIn(_));
        let i = match self
            .done
            .iter()
            .position(|(v, p, _)| *v == c.version && *p == pin2)
        {
            Some(i) => i,
            None => {
                let bytes = match &self.msg {
                    Message::PacketIn(p) if pin2 => {
                        let mut p2 = packet_in2(p);
                        p2.userdata = self.userdata.clone();
                        p2.continuation = self.continuation.clone();
                        c.encode(&Message::Experimenter(NxMessage::PacketIn2(p2)), 0)
                    }
                    m => c.encode(m, 0),
                };
                self.done.push((c.version, pin2, bytes));
                self.done.len() - 1
            }
        };
        &self.done[i].2
    }
}

/// A PACKET_IN as `NXT_PACKET_IN2` (as OVS writes it: the full length only when the frame
/// was cut, the buffer id only when buffered; userdata and continuation added by
/// [`Fanout`]).
pub(super) fn packet_in2(p: &ferrovs_openflow::PacketIn) -> PacketIn2 {
    PacketIn2 {
        packet: p.data.clone(),
        full_len: (usize::from(p.total_len) != p.data.len()).then_some(u32::from(p.total_len)),
        buffer_id: (p.buffer_id != ferrovs_openflow::message::OFP_NO_BUFFER).then_some(p.buffer_id),
        table_id: p.table_id,
        cookie: p.cookie,
        reason: p.reason,
        metadata: p.match_.fields.clone(),
        userdata: None,
        continuation: None,
    }
}

impl OfConn {
    /// A connect under way: `None` while it still is, else whether it worked.
    fn stream_error(&self, ev: &EpollEvent) -> Option<io::Result<()>> {
        let OfStream::Tcp(s) = &self.stream else {
            return Some(Ok(()));
        };
        match s.take_error() {
            Ok(Some(e)) | Err(e) => return Some(Err(e)),
            Ok(None) => {}
        }
        if !(ev.writable || ev.hangup) {
            return None;
        }
        Some(s.peer_addr().map(|_| ()))
    }
}

/// Our HELLO offering `versions` (the highest in the header).
pub(super) fn hello(versions: &[u8]) -> Vec<u8> {
    let mut m = encode(
        &Message::Hello {
            versions: versions.to_vec(),
        },
        0,
    );
    if let Some(v) = versions.iter().max() {
        m[0] = *v;
    }
    m
}

/// The management sockets and their connections.
#[derive(Debug, Default)]
pub(super) struct OfState {
    /// Bridge → its listener and epoll token (absent while the socket cannot be bound).
    pub(super) listeners: HashMap<String, (UnixListener, u64)>,
    pub(super) conns: HashMap<u64, OfConn>,
    pub counters: OfCounters,
    /// Bridges whose rules changed in the messages being handled: published once they are
    /// all handled (or at a barrier), not once per FLOW_MOD.
    pub(super) unpublished: BTreeSet<String>,
    /// Bridges whose rules changed since the configuration was last written (on the tick).
    pub(super) unsaved: BTreeSet<String>,
    /// No write before this (a write of n rules costs O(n): at most a tenth of the time goes
    /// to them while FLOW_MODs keep coming).
    save_after: Option<Instant>,
    /// Each bridge's controllers, master election and fail-open state.
    pub(super) ctrls: HashMap<String, super::controllers::BridgeCtl>,
    /// Ports' OpenFlow configuration bits set by PORT_MOD (`OFPPC_*`), by port name.
    pub(super) port_config: HashMap<String, u32>,
    /// Each port's link as its OpenFlow peers last heard of it (PORT_STATUS on change).
    pub(super) link_seen: HashMap<String, bool>,
    /// Kernel ports (TAP, uplink) whose netdev is down (not `IFF_UP`, or no carrier), as
    /// last read on the tick (`ofports.rs`): not live for a fast_failover bucket,
    /// `LINK_DOWN` to OpenFlow peers.
    pub(super) carrier_down: std::collections::HashSet<String>,
    /// The datapath's packet-in queue (`packet_io`), once made.
    pub(super) packet_in: Option<Arc<ferrovs_datapath::packet_io::PacketInQueue>>,
    /// The buffer packet-ins are taken into (kept: its capacity is reused).
    pub(super) packet_in_buf: std::collections::VecDeque<ferrovs_datapath::packet_io::PacketIn>,
    /// Bridge → the rules added with `OFPFF_SEND_FLOW_REM` (`packet_io`).
    pub(super) send_flow_rem: HashMap<String, std::collections::HashSet<super::packet_io::RuleId>>,
    /// Bridge → its Geneve TLV table (`nx.rs`).
    pub(super) tlv: HashMap<String, super::nx::TlvTable>,
    /// Learn queues and learned rules (`learn.rs`).
    pub(super) learn: super::learn::LearnState,
}

/// The management socket's path of `bridge`.
pub fn mgmt_path(run_dir: &Path, bridge: &str) -> PathBuf {
    run_dir.join(format!("{bridge}.mgmt"))
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
        self.ctrl_remove_bridge(bridge);
    }

    /// Publishes the rule changes of the messages handled so far (one pipeline build per
    /// bridge for a whole batch of FLOW_MODs). Called once the messages a connection sent
    /// are handled, and before a BARRIER_REPLY promises they are in effect.
    pub(super) fn of_publish(&mut self) {
        if self.openflow.unpublished.is_empty() {
            return;
        }
        for b in std::mem::take(&mut self.openflow.unpublished) {
            self.learn_gc(&b);
            if let Some(b) = self.bridges.get_mut(&b) {
                b.dirty = true;
            }
        }
        self.publish();
    }

    /// Copies OpenFlow's rule changes into the configuration and writes it: on the tick (a
    /// flood of FLOW_MODs rewrites the file now and then, not once per message: see
    /// [`OfState::save_after`]) and, with `now`, before a handover or shutdown.
    pub(super) fn of_save(&mut self, now: bool) {
        if self.openflow.unsaved.is_empty()
            || (!now && self.openflow.save_after.is_some_and(|t| Instant::now() < t))
        {
            return;
        }
        let t0 = Instant::now();
        for b in std::mem::take(&mut self.openflow.unsaved) {
            self.sync_flows_config(&b);
        }
        self.save();
        self.openflow.save_after = Some(Instant::now() + t0.elapsed() * 9);
    }

    /// The tick: binds the sockets of bridges that have none yet (after a takeover).
    pub(super) fn of_tick(&mut self) {
        self.of_save(false);
        let missing: Vec<String> = self
            .bridges
            .keys()
            .filter(|b| !self.openflow.listeners.contains_key(*b))
            .cloned()
            .collect();
        for b in missing {
            self.of_listen(&b);
        }
        self.ctrl_tick();
        self.of_link_changes();
    }

    /// Removes every management socket (shutdown).
    pub(super) fn of_shutdown(&mut self) {
        self.of_save(true);
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
                    let versions = self.of_versions(bridge);
                    let mut c = OfConn::new(OfStream::Unix(s), bridge, None, false, &versions);
                    flush(&mut c);
                    self.openflow.conns.insert(t, c);
                    self.of_rearm(t);
                }
                Err(_) => return,
            }
        }
    }

    pub(super) fn of_rearm(&mut self, t: u64) {
        if let Some(c) = self.openflow.conns.get(&t) {
            let _ = self.epoll.modify(c.stream.as_fd(), t, !c.out.is_empty());
        }
    }

    pub(super) fn on_of_conn(&mut self, t: u64, ev: &EpollEvent) {
        let Some(mut c) = self.openflow.conns.remove(&t) else {
            return;
        };
        if c.connecting {
            match c.stream_error(ev) {
                None => {
                    // Still connecting (a spurious wake-up).
                    self.openflow.conns.insert(t, c);
                    return;
                }
                Some(Err(e)) => {
                    c.closing = true;
                    self.of_closed(t, c, Some(format!("connection failed: {e}")));
                    return;
                }
                Some(Ok(())) => {
                    c.connecting = false;
                    let versions = self.of_versions(&c.bridge);
                    c.out = hello(&versions);
                    self.ctrl_connected(&mut c);
                }
            }
        }
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
                        if let Some(p) = &mut c.probe {
                            p.received(Instant::now());
                        }
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
        self.of_publish();
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
            self.of_closed(t, c, None);
            return;
        }
        self.openflow.conns.insert(t, c);
        self.of_rearm(t);
    }

    /// A connection is gone: out of the loop, and its controller (if any) backs off.
    pub(super) fn of_closed(&mut self, t: u64, c: OfConn, why: Option<String>) {
        let _ = self.epoll.delete(c.stream.as_fd());
        self.tokens.remove(&t);
        if let Some(target) = &c.controller {
            self.ctrl_disconnected(&c.bridge, target, t, why);
        }
    }

    /// The OpenFlow versions `bridge` speaks: 1.3, 1.4 and 1.5, less those its
    /// `protocols` leave out (none in common: every HELLO fails).
    pub(super) fn of_versions(&self, bridge: &str) -> Vec<u8> {
        let allowed = self
            .config
            .bridges
            .iter()
            .find(|b| b.name == bridge)
            .map(|b| crate::controller::protocol_versions(&b.protocols).unwrap_or_default())
            .unwrap_or_default();
        (VERSION_1_3..=VERSION_1_5)
            .filter(|v| allowed.is_empty() || allowed.contains(v))
            .collect()
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

    pub(super) fn of_refuse(&mut self, c: &mut OfConn, e: OfError, msg: &[u8]) {
        self.openflow.counters.errors_sent += 1;
        *self
            .openflow
            .counters
            .refused
            .entry(e.name().unwrap_or("OTHER"))
            .or_default() += 1;
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
                    let ours = self.of_versions(&c.bridge);
                    match negotiate(&ours, h.version, &versions) {
                        Some(v) => {
                            c.framer.set_version(v);
                            c.negotiated = true;
                            c.version = v;
                            if let Some(n) = self
                                .openflow
                                .counters
                                .negotiated
                                .get_mut(usize::from(v.saturating_sub(VERSION_1_3)))
                            {
                                *n += 1;
                            }
                            log::debug!(
                                "bridge {}: OpenFlow connection negotiated version {:#04x}",
                                c.bridge,
                                v
                            );
                        }
                        None => {
                            self.openflow.counters.dropped += 1;
                            c.closing = true;
                            self.of_refuse(
                                c,
                                OfError::new(
                                    et::HELLO_FAILED,
                                    hfc::INCOMPATIBLE,
                                    "no common OpenFlow version (this bridge speaks 1.3, 1.4 and 1.5, as its protocols allow)",
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
        let reply = |c: &mut OfConn, m: &Message| {
            let bytes = c.encode(m, h.xid);
            c.out.extend_from_slice(&bytes)
        };
        if c.controller.is_some() && c.role == Role::Slave && changes_state(&m) {
            // OVS's reject_slave_controller: a slave controller reads, never writes.
            return self.of_refuse(
                c,
                OfError::new(
                    et::BAD_REQUEST,
                    ferrovs_openflow::error::brc::IS_SLAVE,
                    "this controller is a slave",
                ),
                msg,
            );
        }
        match m {
            Message::Hello { .. } | Message::EchoReply(_) | Message::Error(_) => {}
            Message::EchoRequest(d) => reply(c, &Message::EchoReply(d)),
            Message::FeaturesRequest => reply(
                c,
                &Message::FeaturesReply(SwitchFeatures {
                    datapath_id: self.bridge_dpid(&c.bridge),
                    n_buffers: 0,
                    n_tables: N_TABLES,
                    auxiliary_id: 0,
                    capabilities: capabilities::FLOW_STATS
                        | capabilities::TABLE_STATS
                        | capabilities::PORT_STATS,
                }),
            ),
            Message::GetConfigRequest
            | Message::SetConfig(_)
            | Message::SetAsync(_)
            | Message::GetAsyncRequest => {
                if let Some(r) = Self::of_async_config(c, &m) {
                    reply(c, &r);
                }
            }
            Message::PacketOut(po) => {
                let bridge = c.bridge.clone();
                if let Err(e) = self.of_packet_out(&bridge, &po) {
                    self.of_refuse(c, e, msg);
                }
            }
            Message::BarrierRequest => {
                // What came before the barrier is in effect when it is answered.
                self.of_publish();
                reply(c, &Message::BarrierReply)
            }
            Message::RoleRequest(r) => self.of_role_request(c, &r, h.xid, msg),
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
            Message::MeterMod(mm) => {
                if let Err(e) = self.of_meter_mod(&c.bridge, &mm) {
                    self.of_refuse(c, e, msg)
                }
            }
            Message::PortMod(pm) => {
                if let Err(e) = self.of_port_mod(&c.bridge, &pm) {
                    self.of_refuse(c, e, msg)
                }
            }
            Message::Experimenter(nx) => self.of_nicira(c, nx, h.xid, msg),
            Message::BundleControl(b) => self.of_bundle_control(c, b, h.xid, msg),
            Message::BundleAdd(a) => self.of_bundle_add(c, a, msg),
            Message::MultipartRequest(r) => match self.of_multipart(&c.bridge, &r.body) {
                Ok(body) => {
                    for part in encode_multipart_reply_with_version(&body, c.version, h.xid) {
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

    pub(super) fn of_ports(&self, bridge: &str) -> PortMap {
        PortMap::new(
            bridge,
            self.ports
                .values()
                .filter(|p| p.bridge == bridge)
                .map(|p| (p.ofport, p.cfg.name.as_str())),
        )
    }

    /// A FLOW_MOD: the rules change as `ferrovs add-flow`/`del-flows` change them.
    pub(super) fn of_flow_mod(
        &mut self,
        bridge: &str,
        fm: &ferrovs_openflow::FlowMod,
    ) -> Result<(), OfError> {
        let ports = self.of_ports(bridge);
        // A rule's meter must exist (OVS: OFPMMFC_INVALID_METER).
        if let Some(m) = crate::openflow::meters::flow_mod_meter(&fm.instructions) {
            let adds = !matches!(
                fm.command,
                ferrovs_openflow::message::fc::DELETE
                    | ferrovs_openflow::message::fc::DELETE_STRICT
            );
            if adds && !self.has_meter(bridge, m) {
                return Err(crate::openflow::meters::missing_meter());
            }
        }
        // Rules that may go with a FLOW_REMOVED (a delete while some asked for one).
        let before = self.of_flow_rem_candidates(bridge, fm);
        let Some(b) = self.bridges.get_mut(bridge) else {
            return Ok(());
        };
        let applied = ofmap::apply_flow_mod(&mut b.rules, fm, &ports)?;
        let changed = match applied {
            ofmap::Applied::Added => true,
            ofmap::Applied::Modified(n) | ofmap::Applied::Deleted(n) => n > 0,
        };
        if changed {
            self.openflow.unpublished.insert(bridge.to_string());
            self.openflow.unsaved.insert(bridge.to_string());
        }
        self.of_flow_mod_applied(bridge, fm, before);
        Ok(())
    }

    /// A GROUP_MOD: applied to the bridge's groups (with the rules that use a deleted
    /// group), published and saved as FLOW_MODs are (once the messages read are handled, or
    /// at a barrier; saved on the tick).
    pub(super) fn of_group_mod(
        &mut self,
        bridge: &str,
        gm: &ferrovs_openflow::GroupMod,
    ) -> Result<(), OfError> {
        let ports = self.of_ports(bridge);
        let Some(b) = self.bridges.get_mut(bridge) else {
            return Ok(());
        };
        ofmap::apply_group_mod(&mut b.rules, gm, &ports)?;
        self.openflow.unpublished.insert(bridge.to_string());
        self.openflow.unsaved.insert(bridge.to_string());
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
                        .map(|x| {
                            let mut s = ofmap::flow_stats(x, &ports);
                            s.flags |= self.of_flow_rem_flag(bridge, &x.spec);
                            s
                        })
                        .collect(),
                )
            }
            Q::Aggregate(r) => {
                let sel = Selector::from_stats_request(r, &ports)?;
                b.cache.push_stats();
                A::Aggregate(ofmap::aggregate(&b.rules, &sel))
            }
            Q::Table => {
                b.cache.push_stats();
                A::Table(
                    (0..N_TABLES)
                        .map(|t| {
                            let (lookup_count, matched_count) = b.rules.table_lookups(t);
                            TableStats {
                                table_id: t,
                                active_count: b
                                    .rules
                                    .rules()
                                    .iter()
                                    .filter(|r| r.spec.table == t)
                                    .count() as u32,
                                lookup_count,
                                matched_count,
                            }
                        })
                        .collect(),
                )
            }
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
                    .map(|d| self.of_admin_desc(d))
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
            Q::Meter { meter_id } => A::Meter(self.of_meter_stats(bridge, *meter_id)),
            Q::MeterConfig { meter_id } => A::MeterConfig(self.of_meter_config(bridge, *meter_id)),
            Q::MeterFeatures => A::MeterFeatures(crate::openflow::meters::features()),
        })
    }
}

impl Daemon {
    /// The description of port `name` as its bridge's OpenFlow peers know it.
    pub(super) fn of_port_desc(&self, name: &str) -> Option<(String, ferrovs_openflow::Port)> {
        let p = self.ports.get(name)?;
        let d = port_desc(p, &self.of_ports(&p.bridge))?;
        Some((p.bridge.clone(), self.of_admin_desc(d)))
    }

    /// PORT_STATUS (`reason`: `OFPPR_ADD`, `_DELETE`, `_MODIFY`) to every peer of `bridge`
    /// past HELLO.
    pub(super) fn of_port_status(
        &mut self,
        bridge: &str,
        port: ferrovs_openflow::Port,
        reason: u8,
    ) {
        let mut msg = Fanout::new(Message::PortStatus { reason, port });
        let tokens: Vec<u64> = self
            .openflow
            .conns
            .iter()
            .filter(|(_, c)| {
                // The management socket keeps getting every port status (as it always has);
                // a controller's connection per its async configuration.
                c.bridge == bridge
                    && c.negotiated
                    && !c.closing
                    && (c.service
                        || c.receives_async(super::packet_io::AsyncKind::PortStatus, reason))
            })
            .map(|(t, _)| *t)
            .collect();
        for t in tokens {
            if let Some(c) = self.openflow.conns.get_mut(&t) {
                if c.out.len() < OUT_MAX {
                    let bytes = msg.bytes(c);
                    c.out.extend_from_slice(bytes);
                }
                let _ = flush(c);
            }
            self.of_rearm(t);
        }
    }
}

/// A port's `ofp_port`: a stable local MAC (ports have no MAC of their own: the guest's or
/// the kernel's is on the other side), state `LIVE` or `LINK_DOWN`.
/// Whether a message changes the switch (refused from a slave, as OVS's
/// `reject_slave_controller` callers).
fn changes_state(m: &Message) -> bool {
    matches!(
        m,
        Message::FlowMod(_)
            | Message::GroupMod(_)
            | Message::MeterMod(_)
            | Message::PortMod(_)
            | Message::PacketOut(_)
            | Message::TableMod { .. }
            | Message::BundleControl(_)
            | Message::BundleAdd(_)
    )
}

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
pub(super) fn flush(c: &mut OfConn) -> bool {
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
    let insts = [it::GOTO_TABLE, it::APPLY_ACTIONS, it::METER];
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
