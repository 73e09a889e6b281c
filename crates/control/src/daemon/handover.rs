//! Both sides of a hot upgrade (protocol and state in [`crate::upgrade`]).
//!
//! Old side: [`Daemon::on_upgrade_listener`] runs the whole handover in the control thread.
//! The PMDs keep forwarding until the freeze; vhost-user connections and control clients are
//! not read meanwhile (their messages wait in the sockets and are then read by exactly one
//! daemon: the new one after a commit, this one after a roll-back).
//!
//! New side: [`Daemon::takeover`] builds the daemon from the handed-over state with its PMDs
//! parked, so that nothing touches a ring before the old daemon has frozen.
//!
//! Kernel ports travel as their fds: a TAP fd, or an AF_PACKET socket whose RX ring the new
//! daemon maps again during prepare (mapping an existing ring needs no new socket, so no
//! frame is missed and none is read twice) and reads from the block and frame where the old
//! daemon's PMD stopped (`Frozen::rings`). An AF_XDP uplink travels as six fds (socket,
//! UMEM memfd, promiscuity socket, BPF map, program, link): the new daemon maps the same
//! UMEM and rings during prepare and, at `resume`, takes the ring indices and the free
//! transmit frames from `Frozen::xsks`, checking them against the shared rings.
//!
//! This module orchestrates only: what a device or a ring is, and whether handed-over state
//! is sound, is decided by the crate that runs it (`ferrovs_vhost::state` exports a device
//! and validates a restored one; `ferrovs_sys`'s rings give and take their positions). A
//! failure is a [`HandoverError`]; it travels to the other daemon as its message with sources.

use std::os::fd::{AsRawFd, OwnedFd};

use ferrovs_sys::kernel::af_xdp::XskFds;
use ferrovs_vhost::stats::QueueStats;

use super::*;
use crate::upgrade::{
    self, BridgeState as BridgeWire, Channel, ConnState, DeviceState, FdList, FdTable,
    GroupCounters, KernelState, LinkState, MeterCounters, Msg, PortCounters, PortState as PortWire,
    RecvError, Report, RingPos, RuleCounters, State, StateError, StatsSnapshot, XdpState, XskPos,
    MIN_SCHEMA, SCHEMA,
};

/// Why a handover (old side) or a takeover (new side) failed. Either way the old daemon
/// carries on.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("{step}")]
    Io {
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{step}: expected {expected}, got {got}")]
    Unexpected {
        step: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error("new daemon failed: {0}")]
    NewFailed(String),
    #[error(
        "this ferrovsd ({ours}) hands over schema {schema}{why}; the new one ({theirs}) \
         restores schemas {min} to {max}",
        ours = env!("CARGO_PKG_VERSION"),
        why = match (.migrating, .ovsdb) {
            (_, true) => " (it is configured through OVSDB: the database section needs \
                           schema 3)"
                .to_string(),
            (Some(port), false) => format!(
                " (port {port} is being live-migrated: its dirty log needs schema 2)"
            ),
            (None, false) => String::new(),
        }
    )]
    Schema {
        schema: u32,
        migrating: Option<String>,
        ovsdb: bool,
        theirs: String,
        min: u32,
        max: u32,
    },
    #[error(
        "this ferrovsd ({ours}) tracks {entries} connections, which need schema 4; the new \
         one ({theirs}) restores schemas up to {max} and would drop them (flush-conntrack \
         first to upgrade to it anyway)",
        ours = env!("CARGO_PKG_VERSION")
    )]
    Conntrack {
        entries: u64,
        theirs: String,
        max: u32,
    },
    #[error("port {port}: {why}; upgrade after the migration ends")]
    Migrating { port: String, why: &'static str },
    #[error("PMDs did not stop within 1 s")]
    Freeze,
    #[error("no ferrovsd accepts upgrades at {}", .path.display())]
    NoOldDaemon {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Recv(#[from] RecvError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("configuration")]
    Config(#[from] ConfigError),
    #[error("daemon")]
    Daemon(#[source] Box<DaemonError>),
    #[error("cannot start PMD threads")]
    Pmds(#[source] io::Error),
    #[error("port {port}")]
    Port {
        port: String,
        #[source]
        source: PortError,
    },
    #[error("positions for unknown port {0}")]
    UnknownPort(String),
    #[error("ring position for {0}, which is not an uplink")]
    NotUplink(String),
}

/// Why one port could not be restored or resumed.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("device")]
    Device(#[from] ferrovs_vhost::state::StateError),
    #[error("{0}")]
    Conn(#[from] ferrovs_vhost::conn::ConnError),
    #[error("listening socket")]
    Listener(#[source] io::Error),
    #[error("handed over without its kernel fd")]
    NoKernelFd,
    #[error("uplink handed over without its ring geometry")]
    NoRing,
    #[error("cannot adopt its kernel side")]
    Kernel(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("resuming its queues")]
    Resume(#[source] ferrovs_vhost::device::DeviceError),
    #[error("no AF_XDP ring positions at the freeze")]
    NoXskPosition,
    #[error("resuming its AF_PACKET ring")]
    Position(#[source] ferrovs_sys::kernel::af_packet::PositionError),
    #[error("resuming its AF_XDP rings")]
    XskPosition(#[source] ferrovs_sys::kernel::af_xdp::ResumeError),
}

impl HandoverError {
    fn port(port: &str) -> impl FnOnce(PortError) -> HandoverError + '_ {
        move |source| HandoverError::Port {
            port: port.to_string(),
            source,
        }
    }
}

fn io_at(step: &'static str) -> impl FnOnce(io::Error) -> HandoverError {
    move |source| HandoverError::Io { step, source }
}

fn kernel<E: std::error::Error + Send + Sync + 'static>(e: E) -> PortError {
    PortError::Kernel(Box::new(e))
}

/// Per bridge (by name): one thing per group, meter or rule.
type PerBridge<T> = Vec<(String, Vec<T>)>;

/// Longest a connecting daemon may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest the new daemon may take to prepare (map memory, build ports).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the new daemon waits for the freeze once it said ready.
const FROZEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the new daemon waits for the old one's goodbye.
const BYE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest the old daemon waits for "resumed" after the freeze
/// (`FERROVS_UPGRADE_RESUME_TIMEOUT_MS`, for tests).
fn resume_timeout() -> Duration {
    std::env::var("FERROVS_UPGRADE_RESUME_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(5))
}

/// Failure injection for tests: `FERROVS_UPGRADE_FAIL=STEP` makes the new daemon die (or
/// hang) at STEP: hello, prepare, ready, hang, resumed.
fn fail_at(step: &str) {
    if std::env::var("FERROVS_UPGRADE_FAIL").is_ok_and(|s| s == step) {
        log::warn!("takeover: FERROVS_UPGRADE_FAIL={step}: failing on purpose");
        if step == "hang" {
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
        std::process::exit(3);
    }
}

fn link_wire(l: &Link) -> LinkState {
    match l {
        Link::Listening => LinkState::Listening,
        Link::Connected => LinkState::Connected,
        Link::Reconnecting { .. } => LinkState::Reconnecting,
        Link::Attached => LinkState::Attached,
    }
}

/// A port's counter sets in handover order: a vhost-user port's queues in virtio order, a
/// kernel port's "to the kernel" then "from the kernel".
fn counter_sets(p: &PortState) -> Vec<&QueueStats> {
    match (&p.device, p.port.kernel_stats()) {
        (Some(d), _) => d.queues().iter().map(|q| &q.stats).collect(),
        (None, Some(k)) => k.to_vec(),
        (None, None) => vec![],
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_ring(u: &UplinkIo) -> std::sync::MutexGuard<'_, ferrovs_sys::kernel::af_packet::RxRing> {
    u.ring.lock().unwrap_or_else(|p| p.into_inner())
}

/// SCHED_FIFO for the calling thread while alive (best effort: without the privilege the
/// handover still works, only with more jitter).
struct Realtime(bool);

impl Realtime {
    fn enter() -> Realtime {
        Realtime(os::set_realtime(true).is_ok())
    }
}

impl Drop for Realtime {
    fn drop(&mut self) {
        if self.0 {
            let _ = os::set_realtime(false);
        }
    }
}

impl Daemon {
    /// A new daemon connected to the upgrade socket: hand everything over. On success this
    /// daemon is done (`handed_over`); on failure it carries on as before.
    pub(super) fn on_upgrade_listener(&mut self) {
        loop {
            match self.upgrade.accept() {
                Ok((s, _)) => match self.handover(s) {
                    Ok(()) => {
                        self.stop_captures(ferrovs_datapath::capture::StopReason::Upgrade);
                        self.handed_over = true;
                        return;
                    }
                    Err(e) => log::error!(
                        "upgrade: handover failed, carrying on: {}",
                        with_sources(&e)
                    ),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::error!("upgrade: accept: {e}");
                    return;
                }
            }
        }
    }

    fn handover(&mut self, sock: UnixStream) -> Result<(), HandoverError> {
        let pid = os::peer_pid(&sock).map_err(io_at("peer credentials"))?;
        let mut ch = Channel::new(sock).map_err(io_at("upgrade channel"))?;
        // The new daemon says hello as soon as it connects; anything slower is not one.
        let (hello, _) = ch.recv(HELLO_TIMEOUT).map_err(io_at("waiting for hello"))?;
        let Msg::Hello {
            schema_min,
            schema_max,
            version,
        } = hello
        else {
            return Err(HandoverError::Unexpected {
                step: "hello",
                expected: "hello",
                got: format!("{hello:?}"),
            });
        };
        // Schema 2 when a port's VM is being migrated (its dirty log travels too).
        let logging = self
            .ports
            .iter()
            .find_map(|(name, p)| p.device.as_ref()?.log().map(|_| name.clone()));
        // Schema 3 only in OVSDB mode: a daemon that cannot restore it must not take over
        // and run on without the database.
        // Schema 4 when connections are tracked: they travel at the freeze.
        let tracked = self.conntrack.counters().entries;
        let schema = match (&self.ovsdb, &logging) {
            _ if tracked > 0 => 4,
            (Some(_), _) => 3,
            (None, Some(_)) => 2,
            (None, None) => 1,
        };
        if tracked > 0 && schema_max < 4 {
            let e = HandoverError::Conntrack {
                entries: tracked,
                theirs: version,
                max: schema_max,
            };
            return Err(refuse(&ch, e));
        }
        if !(schema_min..=schema_max).contains(&schema) {
            let e = HandoverError::Schema {
                schema,
                ovsdb: self.ovsdb.is_some(),
                migrating: logging,
                theirs: version,
                min: schema_min,
                max: schema_max,
            };
            return Err(refuse(&ch, e));
        }
        // A live migration cannot be handed over: its userfaultfd registers this process's
        // mappings, and the dirty log would have to be marked without a gap. Refused until
        // it ends (checked on the control thread, which reads vhost-user messages: none can
        // start a migration between this check and the export).
        if let Some(e) = self.ports.iter().find_map(|(name, p)| {
            let why = p.device.as_ref()?.migrating()?;
            Some(HandoverError::Migrating {
                port: name.clone(),
                why,
            })
        }) {
            return Err(refuse(&ch, e));
        }
        log::info!("upgrade: handing over to pid {pid} (ferrovsd {version})");
        // Rules OpenFlow changed since the last tick go into the configuration handed over.
        self.of_save(true);
        let mut fds = FdList::default();
        let mut state = self.export_state(&mut fds);
        state.schema = schema;
        ch.send_with_fds(&Msg::State(Box::new(state)), &fds.0)
            .map_err(io_at("sending state"))?;
        match ch.recv(PREPARE_TIMEOUT) {
            Ok((Msg::Ready { .. }, _)) => {}
            Ok((Msg::Fail { error }, _)) => return Err(HandoverError::NewFailed(error)),
            Ok((m, _)) => {
                return Err(HandoverError::Unexpected {
                    step: "prepare",
                    expected: "ready",
                    got: format!("{m:?}"),
                })
            }
            Err(e) => return Err(io_at("waiting for the new daemon to prepare")(e)),
        }

        // Freeze: from here the new daemon may start polling as soon as it has the positions.
        let _rt = Realtime::enter();
        let t0 = os::monotonic_ns();
        self.freeze()?;
        // The connection table, exact now that no PMD runs (before the positions: until
        // the new daemon has them it cannot have started, so a failure here rolls back
        // without a fence).
        if schema_max >= 4 {
            for part in self.export_conntrack() {
                if let Err(e) = ch.send(&Msg::Conntrack(part), &[]) {
                    self.thaw(false);
                    return Err(io_at("sending the connection table")(e));
                }
            }
        } else if self.conntrack.counters().entries > 0 {
            log::warn!(
                "upgrade: {} connections tracked since the hello are dropped (the new \
                 ferrovsd restores schemas up to {schema_max})",
                self.conntrack.counters().entries
            );
        }
        let positions: Vec<(String, Vec<Option<u16>>)> = self
            .ports
            .iter()
            .map(|(n, p)| {
                let pos = p.device.as_ref().map(|d| d.positions());
                (n.clone(), pos.unwrap_or_default())
            })
            .collect();
        let rings = self
            .ports
            .iter()
            .filter_map(|(n, p)| match &p.port.io {
                PortIo::Uplink(u) => Some((n.clone(), lock_ring(u).position())),
                _ => None,
            })
            .collect();
        let xsks = self
            .ports
            .iter()
            .filter_map(|(n, p)| match &p.port.io {
                PortIo::Xdp(x) => {
                    let pos = XskPos {
                        rx: lock(&x.rx_ring).position(),
                        tx: lock(&x.tx_ring).position(),
                    };
                    Some((n.clone(), pos))
                }
                _ => None,
            })
            .collect();
        let t1 = os::monotonic_ns();
        let frozen = Msg::Frozen {
            t_freeze_ns: t0,
            freeze_us: (t1 - t0) / 1000,
            positions,
            rings,
            xsks,
        };
        if let Err(e) = ch.send(&frozen, &[]) {
            // It never got the positions: it cannot have started.
            self.thaw(false);
            return Err(io_at("sending ring positions")(e));
        }
        match ch.recv(resume_timeout()) {
            Ok((Msg::Resumed { .. }, _)) => {
                // Frozen since the freeze: these are the final counters.
                let stats = self
                    .ports
                    .iter()
                    .map(|(n, p)| {
                        let sets = counter_sets(p).into_iter();
                        (n.clone(), sets.map(|q| q.snapshot()).collect())
                    })
                    .collect();
                let ports = self
                    .ports
                    .iter()
                    .map(|(n, p)| {
                        let c = PortCounters {
                            rx_drops: p.port.rx_drops.snapshot(),
                            tx_not_ready: p.port.tx_not_ready.load(Ordering::Relaxed),
                            offload: p.port.offload.get(),
                        };
                        (n.clone(), c)
                    })
                    .collect();
                let rules = self.rule_counters();
                let (groups, meters) = self.group_and_meter_counters();
                // Before the new daemon may finish: systemd must never see its main
                // process exit.
                self.service_handing_over(pid);
                let _ = ch.send(
                    &Msg::Bye {
                        stats,
                        ports,
                        rules,
                        groups,
                        meters,
                    },
                    &[],
                );
                log::info!("upgrade: pid {pid} took over; exiting");
                Ok(())
            }
            other => {
                let why = match other {
                    Ok((Msg::Fail { error }, _)) => HandoverError::NewFailed(error),
                    Ok((m, _)) => HandoverError::Unexpected {
                        step: "resume",
                        expected: "resumed",
                        got: format!("{m:?}"),
                    },
                    Err(e) => io_at("waiting for the new daemon to resume")(e),
                };
                // It may have started polling: make sure it is dead before we poll again.
                self.fence(pid);
                self.thaw(true);
                Err(why)
            }
        }
    }

    /// Stops the PMDs at a burst boundary: publish an empty datapath, then wait until every
    /// PMD finished the iteration it was in (its epoch moved on).
    fn freeze(&mut self) -> Result<(), HandoverError> {
        self.datapath.publish(Snapshot::default());
        if !self.wait_pmd_iterations() {
            self.thaw(false);
            return Err(HandoverError::Freeze);
        }
        Ok(())
    }

    /// Resumes forwarding after a failed handover; with `resync`, ring positions are read
    /// back from guest memory (and from AF_PACKET rings) first: the other daemon may have
    /// moved them. An uplink's reader goes back to the oldest block still handed to user
    /// space; frames the other daemon took from that block (at most the rest of it) are
    /// forwarded again.
    fn thaw(&mut self, resync: bool) {
        if resync {
            for p in self.ports.values() {
                if let Some(d) = &p.device {
                    d.resync();
                }
                if let PortIo::Uplink(u) = &p.port.io {
                    let mut ring = lock_ring(u);
                    let at_freeze = ring.position();
                    ring.resync(Some(at_freeze));
                }
                if let PortIo::Xdp(x) = &p.port.io {
                    let lost = lock(&x.rx_ring).resync();
                    let exact = lock(&x.tx_ring).resync();
                    if lost > 0 || !exact {
                        log::warn!(
                            "upgrade: port {}: AF_XDP rings resynchronised \
                             ({lost} receive frames lost, transmit frames {})",
                            p.cfg.name,
                            if exact { "exact" } else { "by ring order" }
                        );
                    }
                }
            }
        }
        self.publish();
        log::warn!("upgrade: rolled back; forwarding again");
    }

    /// Kills the new daemon and waits until it runs no more code.
    fn fence(&self, pid: i32) {
        if let Err(e) = os::kill_hard(pid) {
            log::error!("upgrade: cannot kill pid {pid}: {e}");
        }
        let t = Instant::now();
        while !os::process_dead(pid) {
            if t.elapsed() > Duration::from_secs(10) {
                log::error!("upgrade: pid {pid} still runs 10 s after SIGKILL");
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Everything the new daemon needs, as plain data; fds go into `fds`.
    fn export_state(&self, fds: &mut FdList) -> State {
        let now = self.clock.load(Ordering::Relaxed);
        let bridges = self
            .bridges
            .iter()
            .map(|(name, b)| BridgeWire {
                name: name.clone(),
                id: b.id,
                macs: b
                    .macs
                    .dump(now)
                    .into_iter()
                    .map(|e| (e.mac, e.vlan, e.port))
                    .collect(),
                tlv: b
                    .tlv
                    .load()
                    .entries()
                    .iter()
                    .map(|e| (e.class, e.kind, e.len, e.index))
                    .collect(),
            })
            .collect();
        let ports = self
            .ports
            .values()
            .map(|p| {
                let conn = p.conn.as_ref().map(|(c, _)| {
                    let (sock, partial, cfds, out) = c.parts();
                    ConnState {
                        socket: fds.push(sock.as_raw_fd()),
                        partial,
                        fds: cfds.iter().map(|f| fds.push(f.as_raw_fd())).collect(),
                        out: out.to_vec(),
                    }
                });
                let (device, kernel) = match (&p.device, &p.port.io) {
                    (Some(d), _) => (d.export(&mut fds.0), None),
                    (None, PortIo::Tunnel(v)) => {
                        let fd = fds.push(v.ep.sock.as_fd().as_raw_fd());
                        let k = KernelState {
                            fd,
                            ring: None,
                            xdp: None,
                        };
                        (DeviceState::default(), Some(k))
                    }
                    (None, PortIo::Tap(t)) => {
                        let fd = fds.push(t.tap.as_fd().as_raw_fd());
                        let k = KernelState {
                            fd,
                            ring: None,
                            xdp: None,
                        };
                        (DeviceState::default(), Some(k))
                    }
                    (None, PortIo::Uplink(u)) => {
                        let fd = fds.push(u.sock.as_fd().as_raw_fd());
                        let k = KernelState {
                            fd,
                            ring: Some(u.geometry),
                            xdp: None,
                        };
                        (DeviceState::default(), Some(k))
                    }
                    (None, PortIo::Xdp(x)) => {
                        let [xsk, umem, promisc, map, prog, link] =
                            x.sock.handover_fds().map(|f| fds.push(f.as_raw_fd()));
                        let xdp = XdpState {
                            umem,
                            promisc,
                            map,
                            prog,
                            link,
                            ifindex: x.sock.ifindex(),
                            xdp_mode: x.sock.xdp_mode(),
                            geometry: x.sock.geometry(),
                            stats_seen: *lock(&x.stats_seen),
                        };
                        let k = KernelState {
                            fd: xsk,
                            ring: None,
                            xdp: Some(xdp),
                        };
                        (DeviceState::default(), Some(k))
                    }
                    (None, PortIo::Vhost { .. }) => (DeviceState::default(), None),
                };
                PortWire {
                    id: p.id,
                    ofport: Some(p.ofport),
                    bridge: p.bridge.clone(),
                    cfg: p.cfg.clone(),
                    link: link_wire(&p.link),
                    listener: p.listener.as_ref().map(|(l, _)| fds.push(l.as_raw_fd())),
                    conn,
                    device,
                    kernel,
                    connects: p.connects,
                    disconnects: p.disconnects,
                    refused_connections: p.refused_connections,
                    last_error: p.last_error.clone(),
                    fallback: p.fallback.clone(),
                }
            })
            .collect();
        let config = Config {
            bridges: self.config.bridges.clone(),
            ..self.config.clone()
        };
        State {
            schema: SCHEMA,
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id() as i32,
            config,
            ctl_listener: fds.push(self.ctl.as_raw_fd()),
            upgrade_listener: fds.push(self.upgrade.as_raw_fd()),
            bridges,
            ports,
            upgrades: self.upgrades,
            ovsdb: self.ovsdb_export(fds),
            openflow: Some(self.of_export(fds)),
            continuation_nonce: Some(super::continuation::current_nonce()),
        }
    }

    /// Starts as the successor of the ferrovsd running in `opts.run_dir`: takes over its
    /// ports without any guest noticing, or fails leaving the old daemon as it was.
    pub fn takeover(opts: DaemonOptions) -> Result<(Daemon, Report), DaemonError> {
        Self::take_over(opts).map_err(DaemonError::Takeover)
    }

    fn take_over(opts: DaemonOptions) -> Result<(Daemon, Report), HandoverError> {
        let t_start = Instant::now();
        let path = opts.run_dir.join(upgrade::UPGRADE_SOCKET);
        let sock = match os::seqpacket_connect(&path) {
            Ok(s) => s,
            Err(source) => return Err(HandoverError::NoOldDaemon { path, source }),
        };
        let mut ch = Channel::new(sock).map_err(io_at("upgrade channel"))?;
        ch.send(
            &Msg::Hello {
                schema_min: MIN_SCHEMA,
                schema_max: SCHEMA,
                version: env!("CARGO_PKG_VERSION").into(),
            },
            &[],
        )
        .map_err(io_at("hello"))?;
        fail_at("hello");
        let (state, fds) = match ch.recv_state(PREPARE_TIMEOUT) {
            Ok(s) => s,
            Err(e) => return Err(refuse(&ch, e.into())),
        };
        let t_state = Instant::now();
        let (schema, old_version, old_pid) = (state.schema, state.version.clone(), state.pid);
        let mut d = match Daemon::restore(&opts, state, fds) {
            Ok(d) => d,
            Err(e) => return Err(refuse(&ch, e)),
        };
        fail_at("prepare");
        let prepare = t_state.elapsed();
        // From here to the end, a few hundred microseconds that must not queue behind other
        // work on this core.
        let rt = Realtime::enter();
        ch.send(
            &Msg::Ready {
                prepare_us: prepare.as_micros() as u64,
            },
            &[],
        )
        .map_err(io_at("ready"))?;
        fail_at("ready");
        let mut table = conntrack::IncomingTable::default();
        let max_entries = d.conntrack.config().max_entries;
        let (t_freeze_ns, freeze_us, positions, rings, xsks) = loop {
            match ch.recv(FROZEN_TIMEOUT) {
                Ok((Msg::Conntrack(part), _)) => table.add(part, max_entries),
                Ok((
                    Msg::Frozen {
                        t_freeze_ns,
                        freeze_us,
                        positions,
                        rings,
                        xsks,
                    },
                    _,
                )) => break (t_freeze_ns, freeze_us, positions, rings, xsks),
                Ok((m, _)) => {
                    return Err(HandoverError::Unexpected {
                        step: "freeze",
                        expected: "frozen",
                        got: format!("{m:?}"),
                    })
                }
                Err(e) => return Err(io_at("waiting for the freeze")(e)),
            }
        };
        fail_at("hang");
        // Before any PMD runs: a refused table is counted, and the upgrade goes on.
        d.restore_conntrack(table);
        if let Err(e) = d.resume_ports(&positions, &rings, &xsks) {
            return Err(refuse(&ch, e));
        }
        let t_resumed = os::monotonic_ns();
        fail_at("resumed");
        if let Err(e) = ch.send(
            &Msg::Resumed {
                t_resumed_ns: t_resumed,
            },
            &[],
        ) {
            log::warn!("takeover: telling the old daemon we run: {e}");
        }
        match ch.recv(BYE_TIMEOUT) {
            Ok((
                Msg::Bye {
                    stats,
                    ports,
                    rules,
                    groups,
                    meters,
                },
                _,
            )) => {
                d.restore_stats(&stats, &ports);
                d.restore_rule_counters(&rules);
                d.restore_group_and_meter_counters(&groups, &meters);
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            Ok((m, _)) => log::warn!("takeover: expected bye, got {m:?}"),
            Err(e) => log::warn!("takeover: waiting for bye: {e}"),
        }
        drop(rt);
        d.upgrades += 1;
        let report = Report {
            ok: true,
            old_pid,
            new_pid: std::process::id(),
            old_version,
            new_version: env!("CARGO_PKG_VERSION").into(),
            schema,
            ports: d.ports.len(),
            queues: d.ports.values().map(|p| counter_sets(p).len()).sum(),
            total_ms: t_start.elapsed().as_secs_f64() * 1e3,
            prepare_ms: prepare.as_secs_f64() * 1e3,
            freeze_us: freeze_us as f64,
            downtime_us: t_resumed.saturating_sub(t_freeze_ns) as f64 / 1e3,
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        d.record_upgrade(&report);
        d.save();
        Ok((d, report))
    }

    /// Appends a takeover to the run directory's history.
    fn record_upgrade(&self, r: &Report) {
        let path = self.run_dir.join(upgrade::HISTORY);
        let line = serde_json::to_string(r).unwrap_or_default() + "\n";
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = res {
            log::warn!("upgrade: cannot record it in {}: {e}", path.display());
        }
    }

    /// The last `n` takeovers (newest last).
    pub(super) fn upgrade_history(&self, n: usize) -> Value {
        let path = self.run_dir.join(upgrade::HISTORY);
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let all: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let skip = all.len().saturating_sub(n);
        Value::Array(all.into_iter().skip(skip).collect())
    }

    /// Builds the daemon from handed-over state; PMDs parked, rings not started.
    fn restore(
        opts: &DaemonOptions,
        mut state: State,
        fds: Vec<OwnedFd>,
    ) -> Result<Daemon, HandoverError> {
        let mut fds = FdTable::new(fds);
        let ctl = UnixListener::from(fds.take(state.ctl_listener)?);
        let upgrade = UnixListener::from(fds.take(state.upgrade_listener)?);
        for l in [&ctl, &upgrade] {
            l.set_nonblocking(true)
                .map_err(io_at("listening sockets"))?;
        }
        let mut config = state.config.clone();
        if let Some(c) = &opts.pmd_cores {
            config.pmd_cores = c.clone();
        }
        config.validate()?;
        let mut d = Daemon::assemble(&opts.run_dir, config, ctl, upgrade)
            .map_err(|e| HandoverError::Daemon(Box::new(e)))?;
        d.datapath.set_standby(true);
        d.start_pmds().map_err(HandoverError::Pmds)?;
        d.upgrades = state.upgrades;
        if let Some(n) = state.continuation_nonce {
            // Before any packet-in: the old daemon's continuations stay valid.
            super::continuation::adopt_nonce(n);
        }
        let remote = opts
            .ovsdb
            .clone()
            .or_else(|| state.ovsdb.as_ref().map(|o| o.remote.clone()));
        let mut ovsdb_conn = None;
        if let Some(o) = &mut state.ovsdb {
            d.db_settings = o.settings.iter().cloned().collect();
            // (A new daemon told another remote makes its own connection.)
            if remote.as_deref() == Some(o.remote.as_str()) {
                ovsdb_conn = o.conn.take();
            }
        }
        // The OpenFlow management sockets before the bridges (which then bind none).
        let openflow = state.openflow.take();
        if let Some(of) = &openflow {
            let names: Vec<String> = state.bridges.iter().map(|b| b.name.clone()).collect();
            d.of_restore_listeners(of, &names, &mut fds);
        }
        for b in &state.bridges {
            let flows = state
                .config
                .bridges
                .iter()
                .find(|c| c.name == b.name)
                .and_then(|c| c.flows.clone());
            d.add_bridge_as(&b.name, Some(b.id), flows.as_deref())?;
            let groups = state
                .config
                .bridges
                .iter()
                .find(|c| c.name == b.name)
                .map(|c| c.groups.clone())
                .unwrap_or_default();
            d.restore_groups(&b.name, &groups)?;
            if let Some(c) = state.config.bridges.iter().find(|c| c.name == b.name) {
                d.restore_openflow_settings(c);
                d.restore_meters(&b.name, &c.meters);
                d.restore_flow_rem(&b.name, &c.send_flow_rem);
            }
            let macs = &d.bridges[&b.name].macs;
            for &(mac, vlan, port) in &b.macs {
                macs.learn(mac, vlan, port, 0);
            }
            // Before the ports: a tunnel port reads its bridge's map from the start.
            let tlv = ferrovs_flow::TlvMap::new(b.tlv.iter().map(|&(class, kind, len, index)| {
                ferrovs_flow::TlvEntry {
                    class,
                    kind,
                    len,
                    index,
                }
            }))
            .map_err(|e| ConfigError::Invalid(format!("bridge {}: tlv map: {e}", b.name)))?;
            d.set_tlv_map(&b.name, tlv);
            d.of_restore_tlv(&b.name, &b.tlv);
        }
        for p in state.ports {
            let name = p.cfg.name.clone();
            d.restore_port(p, &mut fds)
                .map_err(HandoverError::port(&name))?;
        }
        // Connections and controllers once the ports are built (their PORT_STATUS reach
        // no handed-over peer); nothing is read or written before the commit.
        if let Some(of) = openflow {
            d.of_restore(of, &mut fds);
        }
        // The database connection last: its first apply finds every port built.
        if let Some(r) = remote {
            d.ovsdb_restore(r, ovsdb_conn, &mut fds);
        }
        Ok(d)
    }

    fn restore_port(&mut self, p: PortWire, fds: &mut FdTable) -> Result<(), PortError> {
        config::validate_port(&p.cfg)?;
        if p.cfg.kind.is_kernel() {
            return self.restore_kernel_port(p, fds);
        }
        let name = p.cfg.name.clone();
        let mut dev = Device::restore(&name, &p.device, fds)?;
        dev.set_packed_rings(self.config.packed_rings());
        let listener = match p.listener {
            Some(i) => {
                let l = UnixListener::from(fds.take(i)?);
                l.set_nonblocking(true).map_err(PortError::Listener)?;
                Some(l)
            }
            None => None,
        };
        let conn = match p.conn {
            Some(c) => {
                let sock = UnixStream::from(fds.take(c.socket)?);
                let cfds = c
                    .fds
                    .iter()
                    .map(|i| fds.take(*i))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(Conn::restore(sock, &c.partial, cfds, c.out)?)
            }
            None => None,
        };
        let link = match (p.link, conn.is_some()) {
            (LinkState::Connected, true) => Link::Connected,
            (LinkState::Listening, _) if listener.is_some() => Link::Listening,
            _ => Link::Reconnecting {
                at: Instant::now(),
                backoff: BACKOFF_MIN,
            },
        };
        claim_slot(&mut self.port_slots, p.id)?;
        let io = PortIo::Vhost {
            queues: dev.queues().to_vec(),
        };
        self.insert_port(
            &p.bridge,
            p.cfg,
            (p.id, p.ofport),
            io,
            Some(dev),
            listener,
            conn,
            link,
        )?;
        if let Some(st) = self.ports.get_mut(&name) {
            st.connects = p.connects;
            st.disconnects = p.disconnects;
            st.refused_connections = p.refused_connections;
            st.last_error = p.last_error;
        }
        Ok(())
    }

    /// A TAP or uplink port from its handed-over fd (an uplink's ring mapped again).
    fn restore_kernel_port(&mut self, p: PortWire, fds: &mut FdTable) -> Result<(), PortError> {
        let name = p.cfg.name.clone();
        let k = p.kernel.as_ref().ok_or(PortError::NoKernelFd)?;
        let fd = fds.take(k.fd)?;
        let io = match p.cfg.kind {
            PortType::Vxlan | PortType::Geneve => {
                let (encap, _, remote, vni) = super::tunnel_endpoints(&p.cfg);
                let tlv = self.bridge_tlv(&p.bridge);
                // Ports that shared an endpoint each handed its socket over: the first one
                // restored makes the endpoint, the others join it (their copy of the fd is
                // closed).
                match self.shared_endpoint(&p.cfg).ok().flatten() {
                    Some(ep) => PortIo::Tunnel(dp::TunnelIo::on_endpoint(ep, remote, vni, tlv)),
                    None => {
                        let sock = std::net::UdpSocket::from(fd);
                        PortIo::Tunnel(
                            dp::TunnelIo::with_socket(sock, encap, remote, vni, tlv)
                                .map_err(kernel)?,
                        )
                    }
                }
            }
            PortType::Tap => {
                let tap = ferrovs_sys::kernel::tap::Tap::from_fd(fd).map_err(kernel)?;
                PortIo::Tap(TapIo::new(tap))
            }
            _ if k.xdp.is_some() => {
                let x = k.xdp.clone().unwrap_or_else(|| unreachable!());
                let xfds = XskFds {
                    xsk: fd,
                    umem: fds.take(x.umem)?,
                    promisc: fds.take(x.promisc)?,
                    map: fds.take(x.map)?,
                    prog: fds.take(x.prog)?,
                    link: fds.take(x.link)?,
                };
                let (sock, rx, tx) = ferrovs_sys::kernel::af_xdp::XskSocket::from_fds(
                    xfds, x.geometry, x.ifindex, x.xdp_mode,
                )
                .map_err(kernel)?;
                let io = XdpIo::new(sock, rx, tx);
                *lock(&io.stats_seen) = x.stats_seen;
                PortIo::Xdp(Box::new(io))
            }
            _ => {
                let geo = k.ring.ok_or(PortError::NoRing)?;
                let (sock, ring) = AfPacket::from_fd(fd, geo).map_err(kernel)?;
                PortIo::Uplink(UplinkIo::new(sock, ring))
            }
        };
        claim_slot(&mut self.port_slots, p.id)?;
        self.insert_port(
            &p.bridge,
            p.cfg,
            (p.id, p.ofport),
            io,
            None,
            None,
            None,
            Link::Attached,
        )?;
        if let Some(st) = self.ports.get_mut(&name) {
            st.last_error = p.last_error;
            st.fallback = p.fallback;
        }
        Ok(())
    }

    /// Carries the old daemon's counters on (as they stood at the freeze).
    fn restore_stats(
        &self,
        stats: &[(String, Vec<StatsSnapshot>)],
        ports: &[(String, PortCounters)],
    ) {
        for (name, qs) in stats {
            if let Some(p) = self.ports.get(name) {
                for (q, s) in counter_sets(p).into_iter().zip(qs) {
                    q.restore(s);
                }
            }
        }
        for (name, c) in ports {
            if let Some(p) = self.ports.get(name) {
                p.port.rx_drops.restore(&c.rx_drops);
                p.port
                    .tx_not_ready
                    .fetch_add(c.tx_not_ready, Ordering::Relaxed);
                p.port.offload.restore(c.offload);
            }
        }
    }

    /// Every bridge's rule counters, megaflows' pushed first (at the freeze: final).
    fn rule_counters(&self) -> Vec<(String, Vec<RuleCounters>)> {
        let now_s = u64::from(self.clock.load(Ordering::Relaxed));
        self.bridges
            .iter()
            .map(|(name, b)| {
                b.cache.push_stats();
                let rules = b
                    .rules
                    .rules()
                    .iter()
                    .map(|r| {
                        let used = r.stats.used.load(Ordering::Relaxed);
                        RuleCounters {
                            packets: r.stats.packets.load(Ordering::Relaxed),
                            bytes: r.stats.bytes.load(Ordering::Relaxed),
                            age_ms: r.installed.elapsed().as_millis() as u64,
                            idle_s: (used != 0).then(|| now_s.saturating_sub(used)),
                            output_max_len: r.output_max_len.clone(),
                        }
                    })
                    .collect();
                (name.clone(), rules)
            })
            .collect()
    }

    /// Adds the old daemon's rule counters to ours and takes over each rule's install time
    /// (duration, hard timeout) and last use (idle timeout). A rule idle since before this
    /// daemon's clock began (it counts seconds from its start) counts as used at its start:
    /// its idle timeout runs again from the takeover. A bridge whose rule count differs is
    /// left alone (never mixed up), with a warning.
    fn restore_rule_counters(&mut self, rules: &[(String, Vec<RuleCounters>)]) {
        let now_s = u64::from(self.clock.load(Ordering::Relaxed));
        for (name, counters) in rules {
            let Some(b) = self.bridges.get(name) else {
                continue;
            };
            let ours = b.rules.rules();
            if ours.len() != counters.len() {
                log::warn!(
                    "takeover: bridge {name}: {} rule counters for {} rules: counters start again",
                    counters.len(),
                    ours.len()
                );
                continue;
            }
            let mut max_lens = Vec::new();
            for (r, c) in ours.iter().zip(counters) {
                r.stats.packets.fetch_add(c.packets, Ordering::Relaxed);
                r.stats.bytes.fetch_add(c.bytes, Ordering::Relaxed);
                if let Some(idle) = c.idle_s {
                    let used = now_s.saturating_sub(idle).max(1);
                    r.stats.used.fetch_max(used, Ordering::Relaxed);
                }
                if !c.output_max_len.is_empty() {
                    max_lens.push((r.spec.clone(), c.output_max_len.clone()));
                }
            }
            let b = self.bridges.get_mut(name).expect("looked up above");
            let now = Instant::now();
            for (r, c) in b.rules.rules_installed_mut().zip(counters) {
                if let Some(t) = now.checked_sub(Duration::from_millis(c.age_ms)) {
                    *r = t;
                }
            }
            for (spec, lens) in max_lens {
                b.rules.set_output_max_len(&spec, lens);
            }
        }
    }

    /// Every bridge's group and meter counters (at the freeze: final), by id.
    fn group_and_meter_counters(&self) -> (PerBridge<GroupCounters>, PerBridge<MeterCounters>) {
        let mut groups = Vec::new();
        let mut meters = Vec::new();
        for (name, b) in &self.bridges {
            // Megaflows push their packets to the groups' counters too.
            b.cache.push_stats();
            let gs: Vec<GroupCounters> = b
                .rules
                .groups()
                .iter()
                .map(|(&id, g)| {
                    let ((packets, bytes), buckets) = g.stats.snapshot();
                    GroupCounters {
                        id,
                        packets,
                        bytes,
                        buckets,
                        age_ms: g.installed.elapsed().as_millis() as u64,
                    }
                })
                .collect();
            if !gs.is_empty() {
                groups.push((name.clone(), gs));
            }
            let ms: Vec<MeterCounters> = b
                .meter_specs
                .iter()
                .filter_map(|(&id, (_, since))| {
                    let c = b.meters.get(id)?.counters();
                    Some(MeterCounters {
                        id,
                        packets: c.packets,
                        bytes: c.bytes,
                        bands: c.bands,
                        age_ms: since.elapsed().as_millis() as u64,
                    })
                })
                .collect();
            if !ms.is_empty() {
                meters.push((name.clone(), ms));
            }
        }
        (groups, meters)
    }

    /// Adds the old daemon's group and meter counters to ours (by id; a group or meter we
    /// lack is skipped) and takes over their install times (durations).
    fn restore_group_and_meter_counters(
        &mut self,
        groups: &PerBridge<GroupCounters>,
        meters: &PerBridge<MeterCounters>,
    ) {
        let now = Instant::now();
        let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms));
        for (name, gs) in groups {
            let Some(b) = self.bridges.get_mut(name) else {
                continue;
            };
            for c in gs {
                let Some(g) = b.rules.groups().get(&c.id) else {
                    log::warn!(
                        "takeover: bridge {name}: counters of unknown group {}",
                        c.id
                    );
                    continue;
                };
                g.stats.restore((c.packets, c.bytes), &c.buckets);
                if let (Some(t), Some(at)) = (b.rules.group_installed_mut(c.id), ago(c.age_ms)) {
                    *t = at;
                }
            }
        }
        for (name, ms) in meters {
            let Some(b) = self.bridges.get_mut(name) else {
                continue;
            };
            for c in ms {
                let Some(m) = b.meters.get(c.id) else {
                    log::warn!(
                        "takeover: bridge {name}: counters of unknown meter {}",
                        c.id
                    );
                    continue;
                };
                m.restore(&dp::meter::MeterCounters {
                    packets: c.packets,
                    bytes: c.bytes,
                    bands: c.bands.clone(),
                });
                if let (Some((_, since)), Some(at)) = (b.meter_specs.get_mut(&c.id), ago(c.age_ms))
                {
                    *since = at;
                }
            }
        }
    }

    /// Starts every ring where the old daemon froze it and wakes the PMDs.
    fn resume_ports(
        &mut self,
        positions: &[(String, Vec<Option<u16>>)],
        rings: &[(String, RingPos)],
        xsks: &[(String, XskPos)],
    ) -> Result<(), HandoverError> {
        for (name, p) in self.ports.iter() {
            let PortIo::Xdp(x) = &p.port.io else { continue };
            let at = HandoverError::port(name);
            let Some(pos) = xsks.iter().find(|(n, _)| n == name).map(|(_, pos)| pos) else {
                return Err(at(PortError::NoXskPosition));
            };
            let resumed = lock(&x.rx_ring)
                .resume(pos.rx)
                .and_then(|()| lock(&x.tx_ring).resume(&pos.tx));
            resumed.map_err(|e| at(PortError::XskPosition(e)))?;
        }
        for (name, pos) in positions {
            let p = self
                .ports
                .get(name)
                .ok_or_else(|| HandoverError::UnknownPort(name.clone()))?;
            if let Some(d) = &p.device {
                d.resume(pos)
                    .map_err(|e| HandoverError::port(name)(PortError::Resume(e)))?;
            }
        }
        for (name, pos) in rings {
            let Some(PortIo::Uplink(u)) = self.ports.get(name).map(|p| &p.port.io) else {
                return Err(HandoverError::NotUplink(name.clone()));
            };
            lock_ring(u)
                .set_position(*pos)
                .map_err(|e| HandoverError::port(name)(PortError::Position(e)))?;
        }
        self.datapath.set_standby(false);
        for p in &self.pmds {
            p.wake();
        }
        Ok(())
    }
}

/// Sends the reason this side gives up to the other daemon (best effort) and returns it.
fn refuse(ch: &Channel, e: HandoverError) -> HandoverError {
    let error = with_sources(&e);
    let _ = ch.send(&Msg::Fail { error }, &[]);
    e
}
