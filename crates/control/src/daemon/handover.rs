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

use std::os::fd::{AsRawFd, OwnedFd};

use ferrovs_sys::guest::dirty_log::DirtyLog;
use ferrovs_sys::guest::memory::{GuestMemory, RegionDesc};
use ferrovs_sys::guest::vring::RingAddrs;
use ferrovs_sys::kernel::af_packet::RingPosition;
use ferrovs_sys::kernel::af_xdp::{XskFds, XskGeometry, XskRxPosition, XskStats, XskTxPosition};
use ferrovs_sys::kernel::bpf::XdpMode;
use ferrovs_vhost::device::QueuePart;
use ferrovs_vhost::stats::{DropReason, QueueStats, StatsSnapshot};
use ferrovs_vhost::virtqueue::{ChainError, VringState};

use super::*;
use crate::upgrade::{
    self, BridgeState as BridgeWire, Channel, ConnState, DeviceState, FdList, FdTable, KernelState,
    LogState, Msg, PortCounters, PortState as PortWire, QueueState, RegionState, Report, RingPos,
    RingState, State, StatsState, XdpState, XskPos, MIN_SCHEMA, SCHEMA,
};

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
        eprintln!("ferrovsd: FERROVS_UPGRADE_FAIL={step}: failing on purpose");
        if step == "hang" {
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
        std::process::exit(3);
    }
}

fn stats_wire(s: &StatsSnapshot) -> StatsState {
    StatsState {
        packets: s.packets,
        bytes: s.bytes,
        calls: s.calls,
        calls_suppressed: s.calls_suppressed,
        calls_coalesced: s.calls_coalesced,
        drops: s.named_drops().map(|(n, v)| (n.to_string(), v)).collect(),
    }
}

fn stats_from_wire(s: &StatsState) -> StatsSnapshot {
    let mut out = StatsSnapshot {
        packets: s.packets,
        bytes: s.bytes,
        calls: s.calls,
        calls_suppressed: s.calls_suppressed,
        calls_coalesced: s.calls_coalesced,
        ..Default::default()
    };
    for (name, v) in &s.drops {
        // A reason this version does not know is dropped from the counters, not fatal.
        if let Some(r) = DropReason::ALL.iter().find(|r| r.name() == name) {
            out.drops[*r as usize] += v;
        }
    }
    out
}

fn link_wire(l: &Link) -> &'static str {
    Daemon::link_name(l)
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
                        self.handed_over = true;
                        return;
                    }
                    Err(e) => eprintln!("ferrovs: upgrade: handover failed, carrying on: {e}"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    eprintln!("ferrovs: upgrade: accept: {e}");
                    return;
                }
            }
        }
    }

    fn handover(&mut self, sock: UnixStream) -> Result<(), String> {
        let pid = os::peer_pid(&sock).map_err(|e| format!("peer credentials: {e}"))?;
        let mut ch = Channel::new(sock).map_err(|e| e.to_string())?;
        // The new daemon says hello as soon as it connects; anything slower is not one.
        let (hello, _) = ch
            .recv(HELLO_TIMEOUT)
            .map_err(|e| format!("waiting for hello: {e}"))?;
        let Msg::Hello {
            schema_min,
            schema_max,
            version,
        } = hello
        else {
            return Err(format!("expected hello, got {hello:?}"));
        };
        // Schema 2 only when a port's VM is being migrated (its dirty log travels too).
        let logging = self
            .ports
            .iter()
            .find_map(|(name, p)| p.device.as_ref()?.log().map(|_| name.clone()));
        let schema = if logging.is_some() { 2 } else { 1 };
        if !(schema_min..=schema_max).contains(&schema) {
            let why = match &logging {
                Some(name) => {
                    format!(" (port {name} is being live-migrated: its dirty log needs schema 2)")
                }
                None => String::new(),
            };
            let e = format!(
                "this ferrovsd ({}) hands over schema {schema}{why}; the new one ({version}) \
                 restores schemas {schema_min} to {schema_max}",
                env!("CARGO_PKG_VERSION")
            );
            let _ = ch.send(&Msg::Fail { error: e.clone() }, &[]);
            return Err(e);
        }
        // A live migration cannot be handed over: its userfaultfd registers this process's
        // mappings, and the dirty log would have to be marked without a gap. Refused until
        // it ends (checked on the control thread, which reads vhost-user messages: none can
        // start a migration between this check and the export).
        if let Some(e) = self.ports.iter().find_map(|(name, p)| {
            let why = p.device.as_ref()?.migrating()?;
            Some(format!(
                "port {name}: {why}; upgrade after the migration ends"
            ))
        }) {
            let _ = ch.send(&Msg::Fail { error: e.clone() }, &[]);
            return Err(e);
        }
        eprintln!("ferrovs: upgrade: handing over to pid {pid} (ferrovsd {version})");
        let mut fds = FdList::default();
        let mut state = self.export_state(&mut fds);
        state.schema = schema;
        ch.send_with_fds(&Msg::State(Box::new(state)), &fds.0)
            .map_err(|e| format!("sending state: {e}"))?;
        match ch.recv(PREPARE_TIMEOUT) {
            Ok((Msg::Ready { .. }, _)) => {}
            Ok((Msg::Fail { error }, _)) => return Err(format!("new daemon failed: {error}")),
            Ok((m, _)) => return Err(format!("expected ready, got {m:?}")),
            Err(e) => return Err(format!("waiting for the new daemon to prepare: {e}")),
        }

        // Freeze: from here the new daemon may start polling as soon as it has the positions.
        let _rt = Realtime::enter();
        let t0 = os::monotonic_ns();
        self.freeze()?;
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
                PortIo::Uplink(u) => {
                    let pos = lock_ring(u).position();
                    let pos = RingPos {
                        block: pos.block,
                        taken: pos.taken,
                    };
                    Some((n.clone(), pos))
                }
                _ => None,
            })
            .collect();
        let xsks = self
            .ports
            .iter()
            .filter_map(|(n, p)| match &p.port.io {
                PortIo::Xdp(x) => {
                    let rx = lock(&x.rx_ring).position();
                    let tx = lock(&x.tx_ring).position();
                    let pos = XskPos {
                        rx_cons: rx.rx_cons,
                        fill_prod: rx.fill_prod,
                        tx_prod: tx.tx_prod,
                        cq_cons: tx.cq_cons,
                        tx_free: tx.free,
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
            return Err(format!("sending ring positions: {e}"));
        }
        match ch.recv(resume_timeout()) {
            Ok((Msg::Resumed { .. }, _)) => {
                // Frozen since the freeze: these are the final counters.
                let stats = self
                    .ports
                    .iter()
                    .map(|(n, p)| {
                        let sets = counter_sets(p).into_iter();
                        (n.clone(), sets.map(|q| stats_wire(&q.snapshot())).collect())
                    })
                    .collect();
                let ports = self
                    .ports
                    .iter()
                    .map(|(n, p)| {
                        let c = PortCounters {
                            rx_drops: stats_wire(&p.port.rx_drops.snapshot()),
                            tx_not_ready: p.port.tx_not_ready.load(Ordering::Relaxed),
                            offload: p.port.offload.get(),
                        };
                        (n.clone(), c)
                    })
                    .collect();
                let _ = ch.send(&Msg::Bye { stats, ports }, &[]);
                eprintln!("ferrovs: upgrade: pid {pid} took over; exiting");
                Ok(())
            }
            other => {
                let why = match other {
                    Ok((Msg::Fail { error }, _)) => format!("new daemon failed: {error}"),
                    Ok((m, _)) => format!("expected resumed, got {m:?}"),
                    Err(e) => format!("waiting for the new daemon to resume: {e}"),
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
    fn freeze(&mut self) -> Result<(), String> {
        self.datapath.publish(Snapshot::default());
        if !self.wait_pmd_iterations() {
            self.thaw(false);
            return Err("PMDs did not stop within 1 s".into());
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
                        eprintln!(
                            "ferrovs: upgrade: port {}: AF_XDP rings resynchronised \
                             ({lost} receive frames lost, transmit frames {})",
                            p.cfg.name,
                            if exact { "exact" } else { "by ring order" }
                        );
                    }
                }
            }
        }
        self.publish();
        eprintln!("ferrovs: upgrade: rolled back; forwarding again");
    }

    /// Kills the new daemon and waits until it runs no more code.
    fn fence(&self, pid: i32) {
        if let Err(e) = os::kill_hard(pid) {
            eprintln!("ferrovs: upgrade: cannot kill pid {pid}: {e}");
        }
        let t = Instant::now();
        while !os::process_dead(pid) {
            if t.elapsed() > Duration::from_secs(10) {
                eprintln!("ferrovs: upgrade: pid {pid} still runs 10 s after SIGKILL");
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
                    (Some(d), _) => (export_device(d, fds), None),
                    (None, PortIo::Vxlan(v)) => {
                        let fd = fds.push(v.sock.as_fd().as_raw_fd());
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
                        let g = u.geometry;
                        let ring = Some(RingState {
                            block_size: g.block_size,
                            block_nr: g.block_nr,
                            frame_size: g.frame_size,
                        });
                        let fd = fds.push(u.sock.as_fd().as_raw_fd());
                        let k = KernelState {
                            fd,
                            ring,
                            xdp: None,
                        };
                        (DeviceState::default(), Some(k))
                    }
                    (None, PortIo::Xdp(x)) => {
                        let [xsk, umem, promisc, map, prog, link] =
                            x.sock.handover_fds().map(|f| fds.push(f.as_raw_fd()));
                        let g = x.sock.geometry();
                        let seen = *lock(&x.stats_seen);
                        let xdp = XdpState {
                            umem,
                            promisc,
                            map,
                            prog,
                            link,
                            ifindex: x.sock.ifindex(),
                            xdp_mode: x.sock.xdp_mode().name().to_string(),
                            frame_size: g.frame_size,
                            rx_frames: g.rx_frames,
                            tx_frames: g.tx_frames,
                            stats_seen: [
                                seen.rx_dropped,
                                seen.rx_ring_full,
                                seen.rx_invalid_descs,
                                seen.tx_invalid_descs,
                            ],
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
                    bridge: p.bridge.clone(),
                    cfg: p.cfg.clone(),
                    link: link_wire(&p.link).to_string(),
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
        }
    }

    /// Starts as the successor of the ferrovsd running in `opts.run_dir`: takes over its
    /// ports without any guest noticing, or fails leaving the old daemon as it was.
    pub fn takeover(opts: DaemonOptions) -> Result<(Daemon, Report), DaemonError> {
        let t_start = Instant::now();
        let err = DaemonError::Takeover;
        let path = opts.run_dir.join(upgrade::UPGRADE_SOCKET);
        let sock = os::seqpacket_connect(&path).map_err(|e| {
            err(format!(
                "no ferrovsd accepts upgrades at {}: {e}",
                path.display()
            ))
        })?;
        let mut ch = Channel::new(sock).map_err(|e| err(e.to_string()))?;
        ch.send(
            &Msg::Hello {
                schema_min: MIN_SCHEMA,
                schema_max: SCHEMA,
                version: env!("CARGO_PKG_VERSION").into(),
            },
            &[],
        )
        .map_err(|e| err(format!("hello: {e}")))?;
        fail_at("hello");
        let (state, fds) = ch.recv_state(PREPARE_TIMEOUT).map_err(err)?;
        let t_state = Instant::now();
        let (schema, old_version, old_pid) = (state.schema, state.version.clone(), state.pid);
        let mut d = match Daemon::restore(&opts, state, fds) {
            Ok(d) => d,
            Err(e) => {
                let _ = ch.send(&Msg::Fail { error: e.clone() }, &[]);
                return Err(err(e));
            }
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
        .map_err(|e| err(format!("ready: {e}")))?;
        fail_at("ready");
        let (t_freeze_ns, freeze_us, positions, rings, xsks) = match ch.recv(FROZEN_TIMEOUT) {
            Ok((
                Msg::Frozen {
                    t_freeze_ns,
                    freeze_us,
                    positions,
                    rings,
                    xsks,
                },
                _,
            )) => (t_freeze_ns, freeze_us, positions, rings, xsks),
            Ok((m, _)) => return Err(err(format!("expected the freeze, got {m:?}"))),
            Err(e) => return Err(err(format!("waiting for the freeze: {e}"))),
        };
        fail_at("hang");
        if let Err(e) = d.resume_ports(&positions, &rings, &xsks) {
            let _ = ch.send(&Msg::Fail { error: e.clone() }, &[]);
            return Err(err(e));
        }
        let t_resumed = os::monotonic_ns();
        fail_at("resumed");
        if let Err(e) = ch.send(
            &Msg::Resumed {
                t_resumed_ns: t_resumed,
            },
            &[],
        ) {
            eprintln!("ferrovsd: takeover: telling the old daemon we run: {e}");
        }
        match ch.recv(BYE_TIMEOUT) {
            Ok((Msg::Bye { stats, ports }, _)) => d.restore_stats(&stats, &ports),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            Ok((m, _)) => eprintln!("ferrovsd: takeover: expected bye, got {m:?}"),
            Err(e) => eprintln!("ferrovsd: takeover: waiting for bye: {e}"),
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
            eprintln!("ferrovs: cannot record upgrade in {}: {e}", path.display());
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
    fn restore(opts: &DaemonOptions, state: State, fds: Vec<OwnedFd>) -> Result<Daemon, String> {
        let mut fds = FdTable::new(fds);
        let ctl = UnixListener::from(fds.take(state.ctl_listener)?);
        let upgrade = UnixListener::from(fds.take(state.upgrade_listener)?);
        for l in [&ctl, &upgrade] {
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
        }
        let mut config = state.config.clone();
        if let Some(c) = &opts.pmd_cores {
            config.pmd_cores = c.clone();
        }
        config.validate().map_err(|e| e.to_string())?;
        let mut d =
            Daemon::assemble(&opts.run_dir, config, ctl, upgrade).map_err(|e| e.to_string())?;
        d.datapath.set_standby(true);
        d.start_pmds()
            .map_err(|e| format!("cannot start PMD threads: {e}"))?;
        d.upgrades = state.upgrades;
        for b in &state.bridges {
            let flows = state
                .config
                .bridges
                .iter()
                .find(|c| c.name == b.name)
                .and_then(|c| c.flows.clone());
            d.add_bridge_as(&b.name, Some(b.id), flows.as_deref())
                .map_err(|e| e.to_string())?;
            let macs = &d.bridges[&b.name].macs;
            for &(mac, vlan, port) in &b.macs {
                macs.learn(mac, vlan, port, 0);
            }
        }
        for p in state.ports {
            d.restore_port(p, &mut fds)?;
        }
        Ok(d)
    }

    fn restore_port(&mut self, p: PortWire, fds: &mut FdTable) -> Result<(), String> {
        let name = p.cfg.name.clone();
        let ctx = |e: String| format!("port {name}: {e}");
        config::validate_port(&p.cfg).map_err(|e| ctx(e.to_string()))?;
        if p.cfg.kind.is_kernel() {
            return self.restore_kernel_port(p, fds);
        }
        let mem = if p.device.regions.is_empty() {
            None
        } else {
            let mut table = Vec::new();
            for r in &p.device.regions {
                let desc = RegionDesc {
                    gpa: r.gpa,
                    size: r.size,
                    uaddr: r.uaddr,
                    mmap_offset: r.mmap_offset,
                };
                table.push((desc, fds.take(r.fd).map_err(ctx)?));
            }
            let m = GuestMemory::map(table).map_err(|e| ctx(format!("guest memory: {e}")))?;
            Some(Arc::new(m))
        };
        let log = match &p.device.log {
            None => None,
            Some(l) => {
                let fd = fds.take(l.fd).map_err(ctx)?;
                let log = DirtyLog::map(fd, l.size, l.offset)
                    .map_err(|e| ctx(format!("dirty log: {e}")))?;
                Some(Arc::new(log))
            }
        };
        let dev = Device::restore(
            &name,
            p.device.queue_pairs,
            p.device.features,
            p.device.protocol,
            p.device.errors,
            mem,
            log,
        );
        if p.device.queues.len() != dev.queues().len() {
            return Err(ctx(format!(
                "{} queues handed over for {} queue pairs",
                p.device.queues.len(),
                dev.queue_pairs()
            )));
        }
        for (i, q) in p.device.queues.iter().enumerate() {
            let part = QueuePart {
                state: VringState {
                    size: q.size,
                    addrs: q
                        .addrs
                        .map(|[desc, avail, used]| RingAddrs { desc, avail, used }),
                    last_avail: q.last_avail,
                    used_idx: q.used_idx,
                    enabled: q.enabled,
                    kicked: q.kicked,
                    log_addr: q.log_addr,
                },
                kick: fds.take_opt(q.kick).map_err(ctx)?,
                call: fds.take_opt(q.call).map_err(ctx)?,
                err: fds.take_opt(q.err).map_err(ctx)?,
                broken: q.broken.as_deref().and_then(ChainError::from_name),
            };
            if let Some(k) = &part.kick {
                let _ = os::set_nonblocking(k.as_fd(), true);
            }
            if let Some(c) = &part.call {
                let _ = os::set_nonblocking(c.as_fd(), true);
            }
            dev.restore_queue(i, part).map_err(|e| ctx(e.to_string()))?;
        }
        dev.prefault();
        let listener = match p.listener {
            Some(i) => {
                let l = UnixListener::from(fds.take(i).map_err(ctx)?);
                l.set_nonblocking(true).map_err(|e| ctx(e.to_string()))?;
                Some(l)
            }
            None => None,
        };
        let conn = match p.conn {
            Some(c) => {
                let sock = UnixStream::from(fds.take(c.socket).map_err(ctx)?);
                let cfds = c
                    .fds
                    .iter()
                    .map(|i| fds.take(*i))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(ctx)?;
                Some(Conn::restore(sock, &c.partial, cfds, c.out).map_err(|e| ctx(e.to_string()))?)
            }
            None => None,
        };
        let link = match (p.link.as_str(), conn.is_some()) {
            ("connected", true) => Link::Connected,
            ("listening", _) if listener.is_some() => Link::Listening,
            _ => Link::Reconnecting {
                at: Instant::now(),
                backoff: BACKOFF_MIN,
            },
        };
        claim_slot(&mut self.port_slots, p.id).map_err(|e| ctx(e.to_string()))?;
        let io = PortIo::Vhost {
            queues: dev.queues().to_vec(),
        };
        self.insert_port(&p.bridge, p.cfg, p.id, io, Some(dev), listener, conn, link)
            .map_err(|e| ctx(e.to_string()))?;
        if let Some(st) = self.ports.get_mut(&name) {
            st.connects = p.connects;
            st.disconnects = p.disconnects;
            st.refused_connections = p.refused_connections;
            st.last_error = p.last_error;
        }
        Ok(())
    }

    /// A TAP or uplink port from its handed-over fd (an uplink's ring mapped again).
    fn restore_kernel_port(&mut self, p: PortWire, fds: &mut FdTable) -> Result<(), String> {
        let name = p.cfg.name.clone();
        let ctx = |e: String| format!("port {name}: {e}");
        let k = p
            .kernel
            .as_ref()
            .ok_or_else(|| ctx("handed over without its kernel fd".into()))?;
        let fd = fds.take(k.fd).map_err(ctx)?;
        let io = match p.cfg.kind {
            PortType::Vxlan => {
                let (_, remote, vni) = super::vxlan_endpoints(&p.cfg);
                let sock = std::net::UdpSocket::from(fd);
                PortIo::Vxlan(dp::VxlanIo::new(sock, remote, vni).map_err(|e| ctx(e.to_string()))?)
            }
            PortType::Tap => {
                let tap = ferrovs_sys::kernel::tap::Tap::from_fd(fd)
                    .map_err(|e| ctx(with_sources(&e)))?;
                PortIo::Tap(TapIo::new(tap))
            }
            _ if k.xdp.is_some() => {
                let x = k.xdp.clone().unwrap_or_else(|| unreachable!());
                let geo = XskGeometry {
                    frame_size: x.frame_size,
                    rx_frames: x.rx_frames,
                    tx_frames: x.tx_frames,
                };
                let mode = XdpMode::from_name(&x.xdp_mode)
                    .ok_or_else(|| ctx(format!("unknown XDP mode {}", x.xdp_mode)))?;
                let xfds = XskFds {
                    xsk: fd,
                    umem: fds.take(x.umem).map_err(ctx)?,
                    promisc: fds.take(x.promisc).map_err(ctx)?,
                    map: fds.take(x.map).map_err(ctx)?,
                    prog: fds.take(x.prog).map_err(ctx)?,
                    link: fds.take(x.link).map_err(ctx)?,
                };
                let (sock, rx, tx) =
                    ferrovs_sys::kernel::af_xdp::XskSocket::from_fds(xfds, geo, x.ifindex, mode)
                        .map_err(|e| ctx(with_sources(&e)))?;
                let io = XdpIo::new(sock, rx, tx);
                let [a, b, c, d] = x.stats_seen;
                *lock(&io.stats_seen) = XskStats {
                    rx_dropped: a,
                    rx_ring_full: b,
                    rx_invalid_descs: c,
                    tx_invalid_descs: d,
                };
                PortIo::Xdp(Box::new(io))
            }
            _ => {
                let r = k
                    .ring
                    .ok_or_else(|| ctx("uplink handed over without its ring geometry".into()))?;
                let geo = RingGeometry {
                    block_size: r.block_size,
                    block_nr: r.block_nr,
                    frame_size: r.frame_size,
                };
                let (sock, ring) = AfPacket::from_fd(fd, geo).map_err(|e| ctx(with_sources(&e)))?;
                PortIo::Uplink(UplinkIo::new(sock, ring))
            }
        };
        claim_slot(&mut self.port_slots, p.id).map_err(|e| ctx(e.to_string()))?;
        self.insert_port(&p.bridge, p.cfg, p.id, io, None, None, None, Link::Attached)
            .map_err(|e| ctx(e.to_string()))?;
        if let Some(st) = self.ports.get_mut(&name) {
            st.last_error = p.last_error;
            st.fallback = p.fallback;
        }
        Ok(())
    }

    /// Carries the old daemon's counters on (as they stood at the freeze).
    fn restore_stats(&self, stats: &[(String, Vec<StatsState>)], ports: &[(String, PortCounters)]) {
        for (name, qs) in stats {
            if let Some(p) = self.ports.get(name) {
                for (q, s) in counter_sets(p).into_iter().zip(qs) {
                    q.restore(&stats_from_wire(s));
                }
            }
        }
        for (name, c) in ports {
            if let Some(p) = self.ports.get(name) {
                p.port.rx_drops.restore(&stats_from_wire(&c.rx_drops));
                p.port
                    .tx_not_ready
                    .fetch_add(c.tx_not_ready, Ordering::Relaxed);
                p.port.offload.restore(c.offload);
            }
        }
    }

    /// Starts every ring where the old daemon froze it and wakes the PMDs.
    fn resume_ports(
        &mut self,
        positions: &[(String, Vec<Option<u16>>)],
        rings: &[(String, RingPos)],
        xsks: &[(String, XskPos)],
    ) -> Result<(), String> {
        for (name, p) in self.ports.iter() {
            let PortIo::Xdp(x) = &p.port.io else { continue };
            let pos = xsks
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, pos)| pos)
                .ok_or_else(|| format!("port {name}: no AF_XDP ring positions at the freeze"))?;
            let rx = XskRxPosition {
                rx_cons: pos.rx_cons,
                fill_prod: pos.fill_prod,
            };
            let tx = XskTxPosition {
                tx_prod: pos.tx_prod,
                cq_cons: pos.cq_cons,
                free: pos.tx_free.clone(),
            };
            lock(&x.rx_ring)
                .resume(rx)
                .map_err(|e| format!("port {name}: {e}"))?;
            lock(&x.tx_ring)
                .resume(&tx)
                .map_err(|e| format!("port {name}: {e}"))?;
        }
        for (name, pos) in positions {
            let p = self
                .ports
                .get(name)
                .ok_or_else(|| format!("positions for unknown port {name}"))?;
            if let Some(d) = &p.device {
                d.resume(pos).map_err(|e| format!("port {name}: {e}"))?;
            }
        }
        for (name, pos) in rings {
            let Some(PortIo::Uplink(u)) = self.ports.get(name).map(|p| &p.port.io) else {
                return Err(format!("ring position for {name}, which is not an uplink"));
            };
            let pos = RingPosition {
                block: pos.block,
                taken: pos.taken,
            };
            lock_ring(u)
                .set_position(pos)
                .map_err(|e| format!("port {name}: {e}"))?;
        }
        self.datapath.set_standby(false);
        for p in &self.pmds {
            p.wake();
        }
        Ok(())
    }
}

/// A vhost-user device's state; its fds go into `fds`.
fn export_device(d: &Device, fds: &mut FdList) -> DeviceState {
    let regions = d
        .memory()
        .map(|m| {
            m.regions()
                .zip(m.fds())
                .map(|(r, fd)| RegionState {
                    gpa: r.gpa,
                    size: r.size,
                    uaddr: r.uaddr,
                    mmap_offset: r.mmap_offset,
                    fd: fds.push(fd.as_raw_fd()),
                })
                .collect()
        })
        .unwrap_or_default();
    let queues = d
        .queues()
        .iter()
        .map(|q| {
            let vq = q.lock();
            let st = vq.state;
            QueueState {
                size: st.size,
                addrs: st.addrs.map(|a| [a.desc, a.avail, a.used]),
                last_avail: st.last_avail,
                used_idx: st.used_idx,
                enabled: st.enabled,
                kicked: st.kicked,
                kick: vq.kick.as_ref().map(|f| fds.push(f.as_raw_fd())),
                call: vq.call.as_ref().map(|f| fds.push(f.as_raw_fd())),
                err: vq.err.as_ref().map(|f| fds.push(f.as_raw_fd())),
                broken: vq.broken.map(|b| b.name().to_string()),
                log_addr: st.log_addr,
            }
        })
        .collect();
    DeviceState {
        queue_pairs: d.queue_pairs(),
        features: d.features(),
        protocol: d.protocol_features(),
        errors: d.errors,
        regions,
        queues,
        log: d.log().map(|l| LogState {
            fd: fds.push(l.fd().as_raw_fd()),
            size: l.size(),
            offset: l.offset(),
        }),
    }
}
