//! The control thread of ferrovsd.
//!
//! One thread runs one epoll loop over: the control socket and its clients, every
//! vhost-user listener and connection, the OVSDB connection (`--ovsdb`), and a 100 ms tick
//! (clock for MAC aging, client-mode reconnects, the OVSDB probe and write-back). Kernel ports (TAP, AF_XDP or AF_PACKET uplinks) are opened here and then belong to
//! the datapath alone: the control thread never reads or writes their fds. Every socket is non-blocking and every peer has its own buffers, so a client
//! or frontend that sends half a message, floods, or never reads its replies delays nobody
//! else. Configuration changes build a new datapath [`Snapshot`] and publish it; PMD threads
//! pick it up at their next iteration without taking a lock.
//!
//! The [`Daemon`] is one struct; its methods are grouped by role, one file each: `ports`
//! (bridges, ports, kernel ports), `sessions` (vhost-user connections), `ctl` (control-socket
//! clients and request dispatch), `report` (the read-only replies), `flows` (rules, megaflows,
//! revalidator), `pmds` (PMD threads and snapshot publication), `handover` (hot upgrade),
//! `openflow` (the management sockets and every OpenFlow connection's messages),
//! `controllers` (OpenFlow controllers: connections, backoff, roles, fail-open),
//! `conntrack` (the connection tracker's settings, expiry sweep, dump and hot upgrade),
//! `rxqs` (rx queues over PMDs by measured load, `pmd-rebalance`, the auto load balancer)
//! and `ovsdb` (`--ovsdb`: the database connection, its changes applied as a diff, and
//! what ferrovs writes back).
//! This file holds the state, start-up, the event loop and its tick.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use ferrovs_datapath::{
    self as dp, Bridge, Datapath, MacTable, PmdHandle, Port, PortIo, Snapshot, TapIo, UplinkIo,
    VlanMode, XdpIo,
};
use ferrovs_sys::kernel::af_packet::{AfPacket, RingGeometry};
use ferrovs_sys::kernel::af_xdp::{XskGeometry, XskSocket};
use ferrovs_sys::os::{self, Epoll, EpollEvent};
use ferrovs_vhost::conn::{Conn, Incoming};
use ferrovs_vhost::device::Device;
use ferrovs_vhost::features;

use crate::config::{self, BridgeConfig, Config, ConfigError, PortConfig, PortType, UplinkMode};
use crate::flows::BridgeRules;
use crate::limited;
use crate::options;
use crate::ratelimit::LogLimiter;
use crate::upgrade::UPGRADE_SOCKET;
use dp::flow::{BridgeFlows, MegaflowCache};
use ferrovs_flow::Pipeline;
use ferrovs_proto::{Request, Response, MAX_REQUEST};

mod bundles;
mod capture;
mod conntrack;
pub mod continuation;
mod controllers;
mod ctl;
mod flows;
mod handover;
mod learn;
mod meters;
mod nx;
mod of_handover;
mod ofports;
mod openflow;
mod ovsdb;
mod packet_io;
mod pmds;
mod ports;
mod report;
mod rxqs;
mod service;
mod sessions;
mod trace;

// The takeover restores vxlan ports by their endpoints.
use ports::tunnel_endpoints;

/// Name of the control socket in the run directory.
pub use ferrovs_proto::CTL_SOCKET;
/// Name of the saved configuration in the run directory.
pub const SAVED_CONFIG: &str = "ferrovs.conf.json";

const TICK: Duration = Duration::from_millis(100);
/// The revalidator's period: megaflow statistics pushed to the rules, idle megaflows
/// evicted, rule timeouts applied.
const REVALIDATE_EVERY: Duration = Duration::from_secs(1);
/// Longest a PMD may take to finish its iteration (and, in a hot upgrade, the old PMDs to
/// leave the rings).
const PMD_ITERATION_TIMEOUT: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How the daemon was started.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub run_dir: PathBuf,
    pub config: Option<PathBuf>,
    pub pmd_cores: Option<Vec<usize>>,
    /// Configured through this OVSDB server (`unix:PATH` or `tcp:IP:PORT`) instead of the
    /// saved configuration.
    pub ovsdb: Option<String>,
}

impl DaemonOptions {
    /// Options for a daemon in `run_dir` with everything else default.
    pub fn in_dir(run_dir: impl Into<PathBuf>) -> DaemonOptions {
        DaemonOptions {
            run_dir: run_dir.into(),
            config: None,
            pmd_cores: None,
            ovsdb: None,
        }
    }
}

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Bind(BindError),
    #[error("another ferrovsd is running with control socket {0}")]
    AlreadyRunning(PathBuf),
    #[error("takeover failed")]
    Takeover(#[source] handover::HandoverError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

#[derive(Debug, Clone, Copy)]
enum Source {
    CtlListener,
    CtlClient,
    VhostListener,
    VhostConn,
    UpgradeListener,
    Ovsdb,
    /// A bridge's OpenFlow management socket (the name is the bridge's).
    OfListener,
    OfConn,
    /// A passive controller target's listener (`ptcp:`, `punix:`; the name is the bridge's).
    CtrlListener,
    /// The datapath's packet-in queue's eventfd (`packet_io`).
    PacketIn,
    /// A bridge's learn queue's eventfd (`learn`; the name is the bridge's).
    Learn,
}

#[derive(Debug)]
struct CtlClient {
    stream: UnixStream,
    inbuf: Vec<u8>,
    /// How much of `inbuf` is known to hold no newline (a long request is scanned once).
    scanned: usize,
    out: Vec<u8>,
    closing: bool,
}

/// Link state of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Listening,
    Connected,
    Reconnecting {
        at: Instant,
        backoff: Duration,
    },
    /// A kernel port (TAP, uplink): attached to its netdev for as long as it exists.
    Attached,
}

#[derive(Debug)]
struct PortState {
    id: u32,
    /// OpenFlow port number on its bridge (see `Daemon::pick_ofport`).
    ofport: u16,
    bridge: String,
    cfg: PortConfig,
    /// The vhost-user device; `None` for kernel ports (their I/O is `port.io`).
    device: Option<Device>,
    port: Arc<Port>,
    listener: Option<(UnixListener, u64)>,
    conn: Option<(Conn, u64)>,
    link: Link,
    connects: u64,
    disconnects: u64,
    refused_connections: u64,
    /// Queues whose guest error was logged (bit per queue; see `log_broken_queues`).
    broken_logged: u64,
    last_error: Option<String>,
    /// An uplink on AF_PACKET because AF_XDP could not be set up: why.
    fallback: Option<String>,
}

#[derive(Debug)]
struct BridgeState {
    id: u32,
    macs: Arc<MacTable>,
    rules: BridgeRules,
    /// The megaflow cache (kept across snapshots; used while the rules are not plain).
    cache: Arc<MegaflowCache>,
    /// What the datapath runs: `None` while the rules are the default NORMAL only.
    pipeline: Option<Arc<Pipeline>>,
    gen: u64,
    /// The rules changed since `pipeline` was built.
    dirty: bool,
    /// The (port name, id, link up) triples `pipeline` was built with (link up only
    /// tracked while a group bucket watches a port, else false).
    built_ports: Vec<(String, u32, bool)>,
    /// OpenFlow meters: the datapath's table (shared with every snapshot) and each meter's
    /// configuration with when it was added (`meters.rs`).
    meters: Arc<dp::meter::MeterTable>,
    meter_specs: BTreeMap<u32, (ferrovs_flow::meter::MeterSpec, Instant)>,
    /// The bridge's tunnel option map (`NXT_TLV_TABLE_MOD`), shared with its tunnel ports.
    tlv: Arc<dp::TlvTable>,
}

/// The daemon.
#[derive(Debug)]
pub struct Daemon {
    run_dir: PathBuf,
    config: Config,
    datapath: Arc<Datapath>,
    clock: Arc<AtomicU32>,
    started: Instant,
    pmds: Vec<PmdHandle>,
    pmd_baseline: Vec<report::PmdCounters>,
    epoll: Epoll,
    ctl: UnixListener,
    ctl_path: PathBuf,
    /// The hot-upgrade socket (seqpacket) a new ferrovsd connects to.
    upgrade: UnixListener,
    /// Set once every port was handed to a new daemon: exit without touching anything.
    handed_over: bool,
    /// Takeovers this daemon's line has gone through.
    upgrades: u64,
    /// CPUs the process may use (the control thread is pinned to those PMDs leave free).
    all_cpus: Vec<usize>,
    clients: HashMap<u64, CtlClient>,
    ports: BTreeMap<String, PortState>,
    port_slots: Vec<bool>,
    bridges: BTreeMap<String, BridgeState>,
    bridge_slots: Vec<bool>,
    tokens: HashMap<u64, (Source, String)>,
    next_token: u64,
    /// Control requests refused (malformed or invalid).
    bad_requests: u64,
    /// Last revalidator pass (megaflow statistics, idle eviction, rule timeouts).
    last_revalidate: Instant,
    /// Log lines that may repeat (per port and reason) go through here.
    logs: LogLimiter,
    /// The OpenFlow number a port being added had last time (OVSDB's `ofport`), taken when
    /// the port asks for none and it is free.
    ofport_hint: Option<u16>,
    /// The OVSDB connection (`--ovsdb`): the database is the configuration.
    ovsdb: Option<Box<ovsdb::OvsdbLink>>,
    /// Settings the OVSDB database set (they go back to their defaults when it drops them).
    db_settings: std::collections::BTreeSet<String>,
    /// The bridges' OpenFlow management sockets and their connections.
    openflow: openflow::OfState,
    /// The connection tracker every bridge's `ct()` actions share (zones keep them apart),
    /// as OVS's one conntrack per datapath.
    conntrack: Arc<ferrovs_conntrack::Tracker>,
    /// The control thread's side of the tracker: sweep position, rates, restore results.
    ct: conntrack::CtCtl,
    /// The service manager (systemd's notify protocol, `service`).
    service: service::Service,

    /// Running packet captures (`capture.rs`).
    captures: Vec<capture::CaptureRun>,
    /// Rx queue assignment and loads (`rxqs.rs`).
    rxq: rxqs::RxqCtl,
}

/// Takes slot `id` (a takeover restores the old daemon's ids).
fn claim_slot(slots: &mut Vec<bool>, id: u32) -> Result<u32, ConfigError> {
    if id as usize > 1 << 16 {
        return Err(ConfigError::Invalid(format!("id {id} out of range")));
    }
    if slots.len() <= id as usize {
        slots.resize(id as usize + 1, false);
    }
    if slots[id as usize] {
        return Err(ConfigError::Invalid(format!("id {id} used twice")));
    }
    slots[id as usize] = true;
    Ok(id)
}

/// An error with its causes, for a one-line message: "outer: cause: root cause".
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn alloc_slot(slots: &mut Vec<bool>) -> u32 {
    if let Some(i) = slots.iter().position(|u| !u) {
        slots[i] = true;
        i as u32
    } else {
        slots.push(true);
        (slots.len() - 1) as u32
    }
}

/// Why a listening socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{} exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    #[error("socket path {} is taken by a running process", .0.display())]
    Taken(PathBuf),
    #[error("cannot create {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {}", path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot make {} non-blocking", path.display())]
    NonBlocking {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Binds a listening socket at `path`, replacing a stale socket file but never a live one.
fn bind_socket(path: &Path) -> Result<UnixListener, BindError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket(path.into()));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(BindError::Taken(path.into()));
        }
        let _ = std::fs::remove_file(path);
    }
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|source| BindError::CreateDir {
                path: dir.into(),
                source,
            })?;
        }
    }
    let l = UnixListener::bind(path).map_err(|source| BindError::Listen {
        path: path.into(),
        source,
    })?;
    l.set_nonblocking(true)
        .map_err(|source| BindError::NonBlocking {
            path: path.into(),
            source,
        })?;
    Ok(l)
}

impl Daemon {
    /// Loads the configuration (given file, else saved, else the embedded default), binds the
    /// control socket, starts the PMDs and creates every port.
    pub fn start(opts: DaemonOptions) -> Result<Daemon, DaemonError> {
        std::fs::create_dir_all(&opts.run_dir).map_err(io_err(format!(
            "cannot create run directory {}",
            opts.run_dir.display()
        )))?;
        let saved = opts.run_dir.join(SAVED_CONFIG);
        let mut config = match &opts.config {
            // The database is the configuration: start with nothing, it says the rest.
            _ if opts.ovsdb.is_some() => Config {
                bridges: vec![],
                ..Config::default_for(&opts.run_dir)
            },
            Some(p) => Config::load(p)?,
            None if saved.exists() => Config::load(&saved)?,
            None => Config::default_for(&opts.run_dir),
        };
        if let Some(c) = &opts.pmd_cores {
            config.pmd_cores = c.clone();
        }
        config.validate()?;
        let ctl_path = opts.run_dir.join(CTL_SOCKET);
        let ctl = bind_socket(&ctl_path).map_err(|e| match e {
            BindError::Taken(p) => DaemonError::AlreadyRunning(p),
            e => DaemonError::Bind(e),
        })?;
        let upath = opts.run_dir.join(UPGRADE_SOCKET);
        let _ = std::fs::remove_file(&upath);
        let upgrade = os::seqpacket_listener(&upath)
            .map_err(io_err(format!("cannot listen on {}", upath.display())))?;
        let mut d = Daemon::assemble(&opts.run_dir, config.clone(), ctl, upgrade)?;
        d.start_pmds().map_err(io_err("cannot start PMD threads"))?;
        for b in &config.bridges {
            d.add_bridge_as(&b.name, None, b.flows.as_deref())
                .map_err(DaemonError::Config)?;
            d.restore_openflow_settings(b);
            d.restore_meters(&b.name, &b.meters);
            d.restore_flow_rem(&b.name, &b.send_flow_rem);
            for p in &b.ports {
                if let Err(e) = d.add_port(&b.name, p.clone()) {
                    // A port that cannot come up (socket taken...) is reported, not fatal.
                    log::error!("{e}");
                }
            }
        }
        if let Some(remote) = &opts.ovsdb {
            log::info!("configured through OVSDB at {remote}");
            d.ovsdb = Some(Box::new(ovsdb::OvsdbLink::new(remote.clone())));
        }
        d.save();
        Ok(d)
    }

    /// A daemon with no bridges, ports or PMDs yet, serving `ctl` and `upgrade`.
    fn assemble(
        run_dir: &Path,
        config: Config,
        ctl: UnixListener,
        upgrade: UnixListener,
    ) -> Result<Daemon, DaemonError> {
        let epoll = Epoll::new().map_err(io_err("epoll"))?;
        let mut d = Daemon {
            run_dir: run_dir.to_path_buf(),
            config: Config {
                bridges: vec![],
                ..config
            },
            datapath: Arc::new(Datapath::new()),
            clock: Arc::new(AtomicU32::new(0)),
            started: Instant::now(),
            pmds: Vec::new(),
            pmd_baseline: Vec::new(),
            epoll,
            ctl,
            ctl_path: run_dir.join(CTL_SOCKET),
            upgrade,
            handed_over: false,
            upgrades: 0,
            all_cpus: os::allowed_cpus(),
            clients: HashMap::new(),
            ports: BTreeMap::new(),
            port_slots: Vec::new(),
            bridges: BTreeMap::new(),
            bridge_slots: Vec::new(),
            tokens: HashMap::new(),
            next_token: 1,
            bad_requests: 0,
            last_revalidate: Instant::now(),
            logs: LogLimiter::default(),
            ofport_hint: None,
            ovsdb: None,
            db_settings: Default::default(),
            openflow: Default::default(),
            conntrack: Arc::new(ferrovs_conntrack::Tracker::new(Default::default())),
            ct: Default::default(),
            service: Default::default(),

            captures: Vec::new(),
            rxq: Default::default(),
        };
        d.apply_conntrack_config();
        let t = d.token(Source::CtlListener, "");
        d.epoll
            .add(d.ctl.as_fd(), t, false)
            .map_err(io_err("epoll"))?;
        let t = d.token(Source::UpgradeListener, "");
        d.epoll
            .add(d.upgrade.as_fd(), t, false)
            .map_err(io_err("epoll"))?;
        Ok(d)
    }

    /// Whether this daemon handed everything to a new one (it must exit without cleanup).
    pub fn handed_over(&self) -> bool {
        self.handed_over
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    fn token(&mut self, s: Source, name: &str) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        self.tokens.insert(t, (s, name.to_string()));
        t
    }

    fn save(&mut self) {
        if self.ovsdb.is_some() {
            // The database keeps the configuration; the saved file stays what it was.
            return;
        }
        if let Err(e) = self.config.save(&self.run_dir.join(SAVED_CONFIG)) {
            limited!(
                self.logs,
                Error,
                "-",
                "save",
                "cannot save configuration: {}",
                with_sources(&e)
            );
        }
    }
    fn tick(&mut self) {
        self.logs.flush(Instant::now());
        self.log_broken_queues();
        self.clock
            .store(self.started.elapsed().as_secs() as u32, Ordering::Relaxed);
        self.poll_kernel_drops();
        if self.last_revalidate.elapsed() >= REVALIDATE_EVERY {
            self.last_revalidate = Instant::now();
            self.revalidator();
        }
        let now = Instant::now();
        let due: Vec<String> = self
            .ports
            .values()
            .filter(|p| matches!(p.link, Link::Reconnecting { at, .. } if at <= now))
            .map(|p| p.cfg.name.clone())
            .collect();
        for n in due {
            self.try_connect(&n);
        }
        self.ovsdb_tick();
        self.of_tick();
        self.conntrack_tick();
        self.service_tick();

        self.capture_tick();
        self.rxq_tick();
    }

    /// Runs the control loop until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut events = [EpollEvent::default(); 64];
        let mut last_tick = Instant::now();
        self.service_tick();
        while !stop.load(Ordering::Relaxed) {
            let n = match self.epoll.wait(&mut events, TICK.as_millis() as i32) {
                Ok(n) => n,
                Err(e) => {
                    limited!(self.logs, Error, "-", "epoll", "epoll: {e}");
                    std::thread::sleep(TICK);
                    0
                }
            };
            for ev in &events[..n] {
                let Some((src, name)) = self.tokens.get(&ev.token).cloned() else {
                    continue;
                };
                match src {
                    Source::CtlListener => self.on_ctl_listener(),
                    Source::CtlClient => self.on_ctl_client(ev.token, ev),
                    Source::VhostListener => self.on_vhost_listener(&name),
                    Source::VhostConn => self.on_vhost_conn(&name, ev),
                    Source::UpgradeListener => self.on_upgrade_listener(),
                    Source::Ovsdb => self.on_ovsdb(ev),
                    Source::OfListener => self.on_of_listener(&name),
                    Source::OfConn => self.on_of_conn(ev.token, ev),
                    Source::CtrlListener => self.on_ctrl_listener(ev.token, &name),
                    Source::PacketIn => self.on_packet_in(),
                    Source::Learn => self.on_learn(&name),
                }
                if self.handed_over {
                    return;
                }
            }
            if last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                self.tick();
            }
        }
    }

    /// Stops PMDs, closes connections and removes sockets.
    pub fn shutdown(&mut self) {
        self.service_stopping();

        self.stop_captures(ferrovs_datapath::capture::StopReason::Shutdown);
        for mut p in self.pmds.drain(..) {
            p.stop();
        }
        let names: Vec<String> = self.ports.keys().cloned().collect();
        for n in names {
            self.disconnect(&n, None);
            if let Some(p) = self.ports.get(&n) {
                if p.cfg.kind == PortType::VhostUser {
                    if let Some(path) = &p.cfg.path {
                        let _ = std::fs::remove_file(path);
                    }
                }
            }
        }
        self.of_shutdown();
        let _ = std::fs::remove_file(&self.ctl_path);
    }
}
