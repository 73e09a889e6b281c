//! The control thread of ferrovsd.
//!
//! One thread runs one epoll loop over: the control socket and its clients, every
//! vhost-user listener and connection, and a 100 ms tick (clock for MAC aging, client-mode
//! reconnects). Kernel ports (TAP, AF_XDP or AF_PACKET uplinks) are opened here and then belong to
//! the datapath alone: the control thread never reads or writes their fds. Every socket is non-blocking and every peer has its own buffers, so a client
//! or frontend that sends half a message, floods, or never reads its replies delays nobody
//! else. Configuration changes build a new datapath [`Snapshot`] and publish it; PMD threads
//! pick it up at their next iteration without taking a lock.

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

use serde_json::{json, Value};

use ferrovs_datapath::{
    self as dp, Bridge, Datapath, MacTable, PmdHandle, Port, PortIo, Snapshot, TapIo, UplinkIo,
    VlanMode, XdpIo,
};
use ferrovs_sys::af_packet::{AfPacket, RingGeometry};
use ferrovs_sys::af_xdp::{XskGeometry, XskSocket};
use ferrovs_sys::os::{self, Epoll, EpollEvent};
use ferrovs_vhost::conn::{Conn, Incoming};
use ferrovs_vhost::device::Device;
use ferrovs_vhost::features;

use crate::config::{self, BridgeConfig, Config, ConfigError, PortConfig, PortType, UplinkMode};
use crate::flows::BridgeRules;
use crate::options;
use ferrovs_proto::{Request, Response, MAX_REQUEST};
use crate::upgrade::UPGRADE_SOCKET;
use dp::flow::{BridgeFlows, MegaflowCache};
use ferrovs_flow::Pipeline;

mod handover;

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
}

impl DaemonOptions {
    /// Options for a daemon in `run_dir` with everything else default.
    pub fn in_dir(run_dir: impl Into<PathBuf>) -> DaemonOptions {
        DaemonOptions {
            run_dir: run_dir.into(),
            config: None,
            pmd_cores: None,
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
    #[error("another ferrovsd is running with control socket {0}")]
    AlreadyRunning(PathBuf),
    #[error("takeover failed: {0}")]
    Takeover(String),
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
    /// The (port name, id) pairs `pipeline` was built with.
    built_ports: Vec<(String, u32)>,
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
    pmd_baseline: Vec<[u64; 4]>,
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

/// Opens the kernel side of a TAP or uplink port. An uplink without `mode=` tries AF_XDP
/// and falls back to AF_PACKET; the second value then says why AF_XDP was not used.
fn open_kernel_port(cfg: &PortConfig) -> Result<(PortIo, Option<String>), String> {
    let dev = cfg.dev.as_deref().unwrap_or_default();
    let af_packet = || {
        AfPacket::open(dev, RingGeometry::DEFAULT)
            .map(|(sock, ring)| PortIo::Uplink(UplinkIo::new(sock, ring)))
            .map_err(|e| with_sources(&e))
    };
    let af_xdp = || {
        XskSocket::open(dev, XskGeometry::DEFAULT)
            .map(|(sock, rx, tx)| PortIo::Xdp(Box::new(XdpIo::new(sock, rx, tx))))
            .map_err(|e| with_sources(&e))
    };
    match (cfg.kind, cfg.mode) {
        (PortType::Vxlan, _) => {
            let (local, remote, vni) = vxlan_endpoints(cfg);
            dp::VxlanIo::open(local, remote, vni)
                .map(|v| (PortIo::Vxlan(v), None))
                .map_err(|e| {
                    format!(
                        "cannot bind {local}: {e} (each vxlan port needs its own local_ip or \
                         dst_port)"
                    )
                })
        }
        (PortType::Tap, _) => ferrovs_sys::tap::Tap::open(dev)
            .map(|t| (PortIo::Tap(TapIo::new(t)), None))
            .map_err(|e| with_sources(&e)),
        (PortType::Uplink, Some(UplinkMode::AfPacket)) => af_packet().map(|io| (io, None)),
        (PortType::Uplink, Some(UplinkMode::AfXdp)) => af_xdp()
            .map(|io| (io, None))
            .map_err(|e| format!("mode=af_xdp: {e}")),
        (PortType::Uplink, None) if !ferrovs_sys::netdev::is_physical(dev) => {
            // What comes from this host's own stack (the peer of a veth) may be a partial
            // checksum or a GSO packet: only PACKET_VNET_HDR says so; AF_XDP frames carry no
            // such metadata and would forward pseudo-header sums as checksums.
            let why = format!(
                "{dev} is a virtual device: its peer may send partial checksums and GSO \
                 packets, whose metadata only AF_PACKET carries (mode=af_xdp forces AF_XDP)"
            );
            Ok((af_packet()?, Some(why)))
        }
        (PortType::Uplink, None) => match af_xdp() {
            Ok(io) => Ok((io, None)),
            // No such device: AF_PACKET would say the same.
            Err(e) if netdev_missing(dev) => Err(e),
            Err(why) => {
                let io = af_packet()?;
                eprintln!(
                    "ferrovs: port {}: AF_XDP unavailable ({why}); using AF_PACKET",
                    cfg.name
                );
                Ok((io, Some(why)))
            }
        },
        (PortType::VhostUser | PortType::VhostUserClient, _) => {
            Err(format!("{} is not a kernel port type", cfg.kind.name()))
        }
    }
}

/// A vxlan port's (local, remote, VNI).
fn vxlan_endpoints(cfg: &PortConfig) -> (SocketAddrV4, SocketAddrV4, u32) {
    let port = cfg.dst_port.unwrap_or(dp::tunnel::VXLAN_PORT);
    (
        SocketAddrV4::new(cfg.local_ip.unwrap_or(Ipv4Addr::UNSPECIFIED), port),
        SocketAddrV4::new(cfg.remote_ip.unwrap_or(Ipv4Addr::UNSPECIFIED), port),
        cfg.key.unwrap_or(0),
    )
}

fn netdev_missing(dev: &str) -> bool {
    ferrovs_sys::netdev::ifindex(dev).is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
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

/// Binds a listening socket at `path`, replacing a stale socket file but never a live one.
fn bind_socket(path: &Path) -> Result<UnixListener, String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "socket path {} is taken by a running process",
                path.display()
            ));
        }
        let _ = std::fs::remove_file(path);
    }
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    let l = UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
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
            Some(p) => Config::load(p)?,
            None if saved.exists() => Config::load(&saved)?,
            None => Config::default_for(&opts.run_dir),
        };
        if let Some(c) = &opts.pmd_cores {
            config.pmd_cores = c.clone();
        }
        config.validate()?;
        let ctl_path = opts.run_dir.join(CTL_SOCKET);
        let ctl = bind_socket(&ctl_path).map_err(|e| {
            if e.contains("taken") {
                DaemonError::AlreadyRunning(ctl_path.clone())
            } else {
                DaemonError::Io {
                    what: e,
                    source: io::ErrorKind::Other.into(),
                }
            }
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
            for p in &b.ports {
                if let Err(e) = d.add_port(&b.name, p.clone()) {
                    // A port that cannot come up (socket taken...) is reported, not fatal.
                    eprintln!("ferrovs: {e}");
                }
            }
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
        };
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
        if let Err(e) = self.config.save(&self.run_dir.join(SAVED_CONFIG)) {
            eprintln!("ferrovs: cannot save configuration: {e}");
        }
    }

    fn pmd_cores(&self) -> Vec<usize> {
        if !self.config.pmd_cores.is_empty() {
            return self.config.pmd_cores.clone();
        }
        vec![*self.all_cpus.last().unwrap_or(&0)]
    }

    fn start_pmds(&mut self) -> io::Result<()> {
        for mut p in self.pmds.drain(..) {
            p.stop();
        }
        let cores = self.pmd_cores();
        // Validated when set; a bad value in a hand-edited file means normal.
        let priority = self
            .config
            .other
            .get("pmd-priority")
            .and_then(|v| config::parse_priority(v).ok())
            .flatten();
        for (i, c) in cores.iter().enumerate() {
            self.pmds.push(PmdHandle::spawn(
                i,
                Some(*c),
                priority,
                self.datapath.clone(),
                self.clock.clone(),
            )?);
        }
        self.pmd_baseline = vec![[0; 4]; cores.len()];
        self.apply_rx_mode();
        // Keep the control thread off the PMD cores when there is another core (as OVS keeps
        // non-PMD threads outside pmd-cpu-mask): a PMD never waits behind it, and it never
        // waits behind a PMD.
        let others: Vec<usize> = self
            .all_cpus
            .iter()
            .copied()
            .filter(|c| !cores.contains(c))
            .collect();
        let _ = os::set_affinity(if others.is_empty() {
            &self.all_cpus
        } else {
            &others
        });
        self.publish();
        Ok(())
    }

    /// Applies `pmd-rx-mode` and `pmd-sleep-after-us` to the PMDs.
    fn apply_rx_mode(&self) {
        let mode = self
            .config
            .other
            .get("pmd-rx-mode")
            .and_then(|m| dp::RxMode::parse(m))
            .unwrap_or_default();
        let after = self
            .config
            .setting_u32("pmd-sleep-after-us", dp::DEFAULT_SLEEP_AFTER_US as u32);
        self.datapath.set_rx_mode(mode, after as u64);
        self.datapath
            .set_sleep_max_us(self.config.setting_u32("pmd-sleep-max-us", 0) as u64);
        self.datapath
            .set_emc_insert_inv_prob(self.config.setting_u32(
                "emc-insert-inv-prob",
                dp::flow::emc::DEFAULT_INSERT_INV_PROB,
            ));
        for p in &self.pmds {
            p.wake();
        }
    }

    /// Builds and publishes the datapath snapshot from the current state. When a bridge's
    /// rules (or the ports its rules name) changed, its pipeline is rebuilt with the next
    /// generation, its megaflow cache revalidated, and this returns only once every PMD has
    /// finished the iteration it was in: from then on no packet is decided by a replaced rule.
    fn publish(&mut self) {
        let mut rebuilt = Vec::new();
        for (name, b) in self.bridges.iter_mut() {
            let mut members: Vec<(String, u32)> = self
                .ports
                .values()
                .filter(|p| &p.bridge == name)
                .map(|p| (p.cfg.name.clone(), p.id))
                .collect();
            members.sort();
            if !b.dirty && (b.pipeline.is_none() || members == b.built_ports) {
                continue;
            }
            b.dirty = false;
            b.gen += 1;
            b.pipeline = if b.rules.is_plain_normal() {
                None
            } else {
                let resolve = |n: &str| members.iter().find(|(m, _)| m == n).map(|(_, id)| *id);
                Some(Arc::new(b.rules.build(&resolve)))
            };
            b.built_ports = members;
            rebuilt.push(name.clone());
        }
        self.publish_snapshot();
        if rebuilt.is_empty() {
            return;
        }
        for name in &rebuilt {
            let b = &self.bridges[name];
            b.cache.revalidate(b.pipeline.as_deref(), b.gen);
        }
        self.quiesce();
    }

    /// Waits until every PMD finished the iteration it was in (at most 1 s: a PMD that does
    /// not move on is stuck elsewhere, and waiting longer would stall the control plane).
    fn quiesce(&self) {
        if !self.wait_pmd_iterations() {
            eprintln!("ferrovs: a PMD did not finish its iteration within 1 s");
        }
    }

    /// Wakes every PMD (one waiting for work must finish that wait) and waits until each
    /// finished the iteration it was in: its epoch moved on. False after
    /// [`PMD_ITERATION_TIMEOUT`].
    fn wait_pmd_iterations(&self) -> bool {
        let seen: Vec<u64> = self
            .pmds
            .iter()
            .map(|p| p.stats.epoch.load(Ordering::Acquire))
            .collect();
        for p in &self.pmds {
            p.wake();
        }
        let t = Instant::now();
        while !self
            .pmds
            .iter()
            .zip(&seen)
            .all(|(p, s)| p.stats.epoch.load(Ordering::Acquire) > *s)
        {
            let waited = t.elapsed();
            if waited > PMD_ITERATION_TIMEOUT {
                return false;
            }
            if waited < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else {
                // A PMD sharing our core (no spare core) needs it to finish its burst.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        true
    }

    fn publish_snapshot(&mut self) {
        let mut ports: Vec<Option<Arc<Port>>> = vec![None; self.port_slots.len()];
        for p in self.ports.values() {
            ports[p.id as usize] = Some(p.port.clone());
        }
        let mut bridges: Vec<Option<Arc<Bridge>>> = vec![None; self.bridge_slots.len()];
        for (name, b) in &self.bridges {
            let members = self
                .ports
                .values()
                .filter(|p| &p.bridge == name)
                .map(|p| p.id)
                .collect();
            let flows = b.pipeline.as_ref().map(|p| BridgeFlows {
                pipeline: p.clone(),
                gen: b.gen,
                cache: b.cache.clone(),
            });
            let default_rule = b
                .pipeline
                .is_none()
                .then(|| b.rules.rules().first().map(|r| r.stats.clone()))
                .flatten();
            bridges[b.id as usize] = Some(Arc::new(Bridge {
                name: name.clone(),
                macs: b.macs.clone(),
                ports: members,
                flows,
                default_rule,
            }));
        }
        let pmd_rxqs = dp::assign_rxqs(&ports, self.pmds.len());
        self.datapath.publish(Snapshot {
            bridges,
            ports,
            pmd_rxqs,
        });
        // A sleeping PMD looks at its (new) work at once.
        for p in &self.pmds {
            p.wake();
        }
    }

    fn cfg_bridge(&mut self, name: &str) -> Option<&mut BridgeConfig> {
        self.config.bridges.iter_mut().find(|b| b.name == name)
    }

    fn add_bridge(&mut self, name: &str) -> Result<(), ConfigError> {
        self.add_bridge_as(name, None, None)
    }

    /// Adds a bridge, with datapath id `id` when given (a takeover keeps the old ids) and its
    /// saved rules (`None`: the default NORMAL rule).
    fn add_bridge_as(
        &mut self,
        name: &str,
        id: Option<u32>,
        flows: Option<&[String]>,
    ) -> Result<(), ConfigError> {
        config::validate_name("bridge", name)?;
        if self.bridges.contains_key(name) {
            return Err(ConfigError::Invalid(format!(
                "bridge {name} already exists"
            )));
        }
        let rules = match flows {
            Some(t) => BridgeRules::from_texts(t)
                .map_err(|e| ConfigError::Invalid(format!("bridge {name}: {e}")))?,
            None => BridgeRules::new(),
        };
        let id = match id {
            Some(id) => claim_slot(&mut self.bridge_slots, id)?,
            None => alloc_slot(&mut self.bridge_slots),
        };
        let size = self.config.setting_u32("mac-table-size", 8192) as usize;
        let aging = self.config.setting_u32("mac-aging", 300);
        self.bridges.insert(
            name.into(),
            BridgeState {
                id,
                macs: Arc::new(MacTable::new(size, aging)),
                cache: Arc::new(MegaflowCache::new(id)),
                pipeline: None,
                gen: 0,
                dirty: !rules.is_plain_normal(),
                rules,
                built_ports: vec![],
            },
        );
        self.apply_flow_limit();
        if self.cfg_bridge(name).is_none() {
            self.config.bridges.push(BridgeConfig {
                name: name.into(),
                ports: vec![],
                flows: None,
            });
        }
        self.sync_flows_config(name);
        self.publish();
        Ok(())
    }

    fn del_bridge(&mut self, name: &str) -> Result<(), ConfigError> {
        let Some(b) = self.bridges.get(name) else {
            return Err(ConfigError::Invalid(format!("no bridge named {name}")));
        };
        let id = b.id;
        let members: Vec<String> = self
            .ports
            .values()
            .filter(|p| p.bridge == name)
            .map(|p| p.cfg.name.clone())
            .collect();
        for p in members {
            self.del_port(name, &p)?;
        }
        if let Some(b) = self.bridges.remove(name) {
            b.cache.flush();
        }
        self.bridge_slots[id as usize] = false;
        self.config.bridges.retain(|b| b.name != name);
        self.publish();
        Ok(())
    }

    fn add_port(&mut self, bridge: &str, cfg: PortConfig) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        config::validate_port(&cfg)?;
        if !self.bridges.contains_key(bridge) {
            return bad(format!("no bridge named {bridge}"));
        }
        if let Some(p) = self.ports.get(&cfg.name) {
            return bad(format!(
                "port {} already exists on bridge {}",
                cfg.name, p.bridge
            ));
        }
        if let Some(other) = self
            .ports
            .values()
            .find(|p| p.cfg.path.is_some() && p.cfg.path == cfg.path)
        {
            return bad(format!(
                "port {}: socket path is already used by port {}",
                cfg.name, other.cfg.name
            ));
        }
        if cfg.kind.is_kernel() {
            return self.add_kernel_port(bridge, cfg);
        }
        let path = cfg.path.clone().unwrap_or_default();
        let listener = if cfg.kind == PortType::VhostUser {
            let l = bind_socket(&path)
                .map_err(|e| ConfigError::Invalid(format!("port {}: {e}", cfg.name)))?;
            Some(l)
        } else {
            None
        };
        let id = alloc_slot(&mut self.port_slots);
        let device = Device::new(&cfg.name, cfg.queues as usize);
        let link = if listener.is_some() {
            Link::Listening
        } else {
            Link::Reconnecting {
                at: Instant::now(),
                backoff: BACKOFF_MIN,
            }
        };
        let io = PortIo::Vhost {
            queues: device.queues().to_vec(),
        };
        let res = self.insert_port(
            bridge,
            cfg.clone(),
            id,
            io,
            Some(device),
            listener,
            None,
            link,
        );
        if let Err(e) = res {
            self.port_slots[id as usize] = false;
            return Err(e);
        }
        if cfg.kind == PortType::VhostUserClient {
            self.try_connect(&cfg.name);
        }
        Ok(())
    }

    /// Adds a TAP or uplink port: opens its netdev, then wires it in.
    fn add_kernel_port(&mut self, bridge: &str, cfg: PortConfig) -> Result<(), ConfigError> {
        let dev = cfg.dev.clone().unwrap_or_default();
        if let Some(other) = self
            .ports
            .values()
            .find(|p| p.cfg.kind.is_kernel() && p.cfg.dev.as_deref() == Some(dev.as_str()))
        {
            return Err(ConfigError::Invalid(format!(
                "port {}: dev {dev} is already used by port {}",
                cfg.name, other.cfg.name
            )));
        }
        let (io, fallback) = open_kernel_port(&cfg)
            .map_err(|e| ConfigError::Invalid(format!("port {}: {e}", cfg.name)))?;
        let id = alloc_slot(&mut self.port_slots);
        let name = cfg.name.clone();
        let res = self.insert_port(bridge, cfg, id, io, None, None, None, Link::Attached);
        if res.is_err() {
            self.port_slots[id as usize] = false;
        }
        if let Some(st) = self.ports.get_mut(&name) {
            st.fallback = fallback;
        }
        res
    }

    /// Wires a port into the daemon and the datapath (new, or handed over by a takeover).
    #[allow(clippy::too_many_arguments)]
    fn insert_port(
        &mut self,
        bridge: &str,
        cfg: PortConfig,
        id: u32,
        io: PortIo,
        device: Option<Device>,
        listener: Option<UnixListener>,
        conn: Option<Conn>,
        link: Link,
    ) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        let Some(b) = self.bridges.get(bridge) else {
            return bad(format!("no bridge named {bridge}"));
        };
        let bridge_id = b.id;
        let vlan = match (cfg.tag, cfg.trunks.is_empty()) {
            (Some(t), _) => VlanMode::Access(t),
            (None, true) => VlanMode::Trunk,
            (None, false) => VlanMode::TrunkOf(cfg.trunks.clone()),
        };
        if let Some(d) = &device {
            d.set_coalesce(cfg.coalesce());
        }
        let port = Arc::new(Port {
            id,
            name: cfg.name.clone(),
            bridge: bridge_id,
            vlan,
            io,
            rx_drops: Default::default(),
            tx_not_ready: Default::default(),
            offload: Default::default(),
            inject: Default::default(),
        });
        let listener = match listener {
            Some(l) => {
                let t = self.token(Source::VhostListener, &cfg.name);
                if let Err(e) = self.epoll.add(l.as_fd(), t, false) {
                    return bad(format!("port {}: epoll: {e}", cfg.name));
                }
                Some((l, t))
            }
            None => None,
        };
        let conn = match conn {
            Some(c) => {
                let t = self.token(Source::VhostConn, &cfg.name);
                if let Err(e) = self.epoll.add(c.as_fd(), t, c.wants_write()) {
                    return bad(format!("port {}: epoll: {e}", cfg.name));
                }
                Some((c, t))
            }
            None => None,
        };
        let st = PortState {
            id,
            bridge: bridge.into(),
            cfg: cfg.clone(),
            device,
            port,
            listener,
            conn,
            link,
            connects: 0,
            disconnects: 0,
            refused_connections: 0,
            last_error: None,
            fallback: None,
        };
        self.ports.insert(cfg.name.clone(), st);
        if let Some(b) = self.cfg_bridge(bridge) {
            if !b.ports.iter().any(|p| p.name == cfg.name) {
                b.ports.push(cfg.clone());
            }
        }
        self.publish();
        Ok(())
    }

    fn del_port(&mut self, bridge: &str, name: &str) -> Result<(), ConfigError> {
        match self.ports.get(name) {
            None => return Err(ConfigError::Invalid(format!("no port named {name}"))),
            Some(p) if p.bridge != bridge => {
                return Err(ConfigError::Invalid(format!(
                    "port {name} is on bridge {}, not {bridge}",
                    p.bridge
                )))
            }
            Some(_) => {}
        }
        self.disconnect(name, None);
        let Some(mut p) = self.ports.remove(name) else {
            return Ok(());
        };
        if let Some((l, t)) = p.listener.take() {
            let _ = self.epoll.delete(l.as_fd());
            self.tokens.remove(&t);
            if let Some(path) = &p.cfg.path {
                let _ = std::fs::remove_file(path);
            }
        }
        self.port_slots[p.id as usize] = false;
        if let Some(b) = self.bridges.get(bridge) {
            b.macs.flush_port(p.id);
        }
        if let Some(b) = self.cfg_bridge(bridge) {
            b.ports.retain(|x| x.name != name);
        }
        self.publish();
        Ok(())
    }

    /// Drops a port's vhost-user connection and resets its device.
    fn disconnect(&mut self, name: &str, why: Option<String>) {
        let Some(p) = self.ports.get_mut(name) else {
            return;
        };
        if let Some((c, t)) = p.conn.take() {
            let _ = self.epoll.delete(c.as_fd());
            self.tokens.remove(&t);
            p.disconnects += 1;
            if let Some(w) = &why {
                eprintln!("ferrovs: {name}: vhost-user connection closed: {w}");
                p.last_error = Some(w.clone());
            }
        }
        let Some(device) = p.device.as_mut() else {
            return;
        };
        device.reset();
        p.link = match p.cfg.kind {
            PortType::VhostUserClient => Link::Reconnecting {
                at: Instant::now() + BACKOFF_MIN,
                backoff: BACKOFF_MIN,
            },
            _ => Link::Listening,
        };
    }

    fn attach(&mut self, name: &str, stream: UnixStream) {
        let conn = match Conn::new(stream, true) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("ferrovs: {name}: {e}");
                return;
            }
        };
        let t = self.token(Source::VhostConn, name);
        if let Err(e) = self.epoll.add(conn.as_fd(), t, false) {
            eprintln!("ferrovs: {name}: epoll: {e}");
            self.tokens.remove(&t);
            return;
        }
        if let Some(p) = self.ports.get_mut(name) {
            p.conn = Some((conn, t));
            p.link = Link::Connected;
            p.connects += 1;
        }
    }

    fn try_connect(&mut self, name: &str) {
        let Some(p) = self.ports.get_mut(name) else {
            return;
        };
        let Link::Reconnecting { backoff, .. } = p.link else {
            return;
        };
        let Some(path) = p.cfg.path.clone() else {
            return;
        };
        match UnixStream::connect(&path) {
            Ok(s) => self.attach(name, s),
            Err(e) => {
                let next = (backoff * 2).min(BACKOFF_MAX);
                p.last_error = Some(format!("connect {}: {e}", path.display()));
                p.link = Link::Reconnecting {
                    at: Instant::now() + backoff,
                    backoff: next,
                };
            }
        }
    }

    fn on_vhost_listener(&mut self, name: &str) {
        loop {
            let Some(p) = self.ports.get_mut(name) else {
                return;
            };
            let Some((l, _)) = &p.listener else { return };
            match l.accept() {
                Ok((s, _)) => {
                    if p.conn.is_some() {
                        // The previous frontend may have just gone (a quick driver reload or
                        // a reconnect racing our read of its hang-up): read what it left
                        // first, then decide.
                        let ev = EpollEvent {
                            readable: true,
                            ..Default::default()
                        };
                        self.on_vhost_conn(name, &ev);
                    }
                    let Some(p) = self.ports.get_mut(name) else {
                        return;
                    };
                    if p.conn.is_some() {
                        // One frontend per port: a second one is refused, the first goes on.
                        p.refused_connections += 1;
                        eprintln!("ferrovs: {name}: refused a second vhost-user connection");
                        drop(s);
                        continue;
                    }
                    self.attach(name, s);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    eprintln!("ferrovs: {name}: accept: {e}");
                    return;
                }
            }
        }
    }

    /// Serves a vhost-user connection: at most a bounded number of messages per wake-up so
    /// that one chatty frontend cannot monopolise the control thread.
    fn on_vhost_conn(&mut self, name: &str, ev: &EpollEvent) {
        let mut failure = None;
        {
            let Some(p) = self.ports.get_mut(name) else {
                return;
            };
            let Some((conn, _)) = p.conn.as_mut() else {
                return;
            };
            if ev.writable {
                if let Err(e) = conn.flush() {
                    failure = Some(e.to_string());
                }
            }
            for _ in 0..64 {
                if failure.is_some() {
                    break;
                }
                match conn.poll_message() {
                    Ok(Incoming::Message(h, payload, fds)) => {
                        let Some(device) = p.device.as_mut() else {
                            break;
                        };
                        if let Some(reply) = device.handle_message(&h, &payload, fds) {
                            let fds: Vec<_> = reply.fds.iter().map(|f| f.as_raw_fd()).collect();
                            if let Err(e) = conn.send(&reply.bytes, &fds) {
                                failure = Some(e.to_string());
                            }
                        }
                        if let Some(mac) = device.take_announce() {
                            announce(&p.port, mac);
                        }
                    }
                    Ok(Incoming::Pending) => break,
                    Ok(Incoming::Closed) => {
                        failure = Some("peer closed the connection".into());
                    }
                    Err(e) => failure = Some(e.to_string()),
                }
            }
            for pmd in &self.pmds {
                pmd.wake();
            }
            if failure.is_none() {
                let w = conn.wants_write();
                let t = p.conn.as_ref().map(|c| c.1).unwrap_or(0);
                if let Some((c, _)) = p.conn.as_ref() {
                    let _ = self.epoll.modify(c.as_fd(), t, w);
                }
            }
        }
        if let Some(f) = failure {
            self.disconnect(name, Some(f));
        }
    }

    fn on_ctl_listener(&mut self) {
        loop {
            match self.ctl.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let t = self.token(Source::CtlClient, "");
                    if self.epoll.add(s.as_fd(), t, false).is_err() {
                        self.tokens.remove(&t);
                        continue;
                    }
                    self.clients.insert(
                        t,
                        CtlClient {
                            stream: s,
                            inbuf: Vec::new(),
                            scanned: 0,
                            out: Vec::new(),
                            closing: false,
                        },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return,
            }
        }
    }

    fn on_ctl_client(&mut self, t: u64, ev: &EpollEvent) {
        let Some(mut c) = self.clients.remove(&t) else {
            return;
        };
        let mut eof = false;
        if ev.readable || ev.hangup {
            let mut buf = [0u8; 65536];
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        c.inbuf.extend_from_slice(&buf[..n]);
                        if c.inbuf.len() > MAX_REQUEST {
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
        // Backpressure: while a client has 1 MiB of replies unread, its further requests wait
        // in its buffer; they are handled once it reads (a writable event) or here, when the
        // reply went out at once.
        loop {
            let mut backlog = false;
            loop {
                if c.out.len() >= 1 << 20 {
                    backlog = true;
                    break;
                }
                let Some(off) = c.inbuf[c.scanned..].iter().position(|b| *b == b'\n') else {
                    c.scanned = c.inbuf.len();
                    break;
                };
                let pos = c.scanned + off;
                let line: Vec<u8> = c.inbuf.drain(..=pos).collect();
                c.scanned = 0;
                let resp = self.handle_line(&line[..line.len() - 1]);
                c.out.extend_from_slice(resp.as_bytes());
                c.out.push(b'\n');
            }
            if !backlog && c.inbuf.len() > MAX_REQUEST {
                self.bad_requests += 1;
                let r = serde_json::to_string(&Response::err(format!(
                    "request too long (over {} MiB)",
                    MAX_REQUEST >> 20
                )))
                .unwrap_or_default();
                c.out.extend_from_slice(r.as_bytes());
                c.out.push(b'\n');
                c.inbuf.clear();
                c.scanned = 0;
                c.closing = true;
            }
            if !backlog && eof && !c.inbuf.is_empty() {
                // A last request without a newline.
                let line = std::mem::take(&mut c.inbuf);
                c.scanned = 0;
                let resp = self.handle_line(&line);
                c.out.extend_from_slice(resp.as_bytes());
                c.out.push(b'\n');
            }
            while !c.out.is_empty() {
                match c.stream.write(&c.out) {
                    Ok(n) => {
                        c.out.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        c.out.clear();
                        c.inbuf.clear();
                        eof = true;
                        break;
                    }
                }
            }
            if !(backlog && c.out.is_empty()) {
                break;
            }
        }
        // A reply may be large (dump-flows of 100 000 rules: ~20 MiB); past this, the client
        // is not reading and is dropped.
        if (eof || c.closing) && c.out.is_empty() || c.out.len() > 256 << 20 {
            let _ = self.epoll.delete(c.stream.as_fd());
            self.tokens.remove(&t);
            return;
        }
        let _ = self.epoll.modify(c.stream.as_fd(), t, !c.out.is_empty());
        self.clients.insert(t, c);
    }

    fn handle_line(&mut self, line: &[u8]) -> String {
        let resp = match serde_json::from_slice::<Request>(line) {
            Ok(req) => self.handle(req),
            Err(e) => Response::err(format!("malformed request: {e}")),
        };
        if !resp.ok {
            self.bad_requests += 1;
        }
        serde_json::to_string(&resp).unwrap_or_else(|_| r#"{"ok":false,"error":"internal"}"#.into())
    }

    /// Handles one control request (also usable in-process by tests).
    pub fn handle(&mut self, req: Request) -> Response {
        let changed = matches!(
            req,
            Request::AddBridge { .. }
                | Request::DelBridge { .. }
                | Request::AddPort { .. }
                | Request::DelPort { .. }
                | Request::SetPort { .. }
                | Request::ConfigSet { .. }
                | Request::AddFlows { .. }
                | Request::DelFlows { .. }
        );
        let r = match req {
            Request::Show => Ok(self.show()),
            Request::Version => Ok(json!({ "version": env!("CARGO_PKG_VERSION") })),
            Request::AddBridge { bridge } => self.add_bridge(&bridge).map(|_| Value::Null),
            Request::DelBridge { bridge } => self.del_bridge(&bridge).map(|_| Value::Null),
            Request::AddPort {
                bridge,
                port,
                options,
            } => options::port_from_options(&port, &options)
                .and_then(|p| self.add_port(&bridge, p))
                .map(|_| Value::Null),
            Request::DelPort { bridge, port } => self.del_port(&bridge, &port).map(|_| Value::Null),
            Request::SetPort { port, options } => {
                self.set_port(&port, &options).map(|_| Value::Null)
            }
            Request::PortStats { port } => self.port_stats(port.as_deref()),
            Request::PmdStats => Ok(self.pmd_stats()),
            Request::PmdStatsClear => {
                self.pmd_baseline = self.pmds.iter().map(|p| Self::pmd_raw(&p.stats)).collect();
                Ok(Value::Null)
            }
            Request::MacTable { bridge } => self.mac_table(&bridge),
            Request::ConfigGet { key } => self.config_get(key.as_deref()),
            Request::ConfigSet { key, value } => self.config_set(&key, &value).map(|_| Value::Null),
            Request::UpgradeHistory { last } => Ok(self.upgrade_history(last.unwrap_or(20))),
            Request::AddFlows { bridge, flows } => self.add_flows(&bridge, &flows),
            Request::DelFlows {
                bridge,
                filter,
                strict,
            } => self.del_flows(&bridge, filter.as_deref().unwrap_or(""), strict),
            Request::DumpFlows { bridge, filter } => self.dump_flows(&bridge, filter.as_deref()),
            Request::DumpMegaflows { bridge } => self.dump_megaflows(&bridge),
        };
        match r {
            Ok(v) => {
                if changed {
                    self.save();
                }
                Response::ok(v)
            }
            Err(e) => Response::err(e),
        }
    }

    /// `ferrovs set-port`: changes a live port's settings (coalescing), saved with the
    /// configuration and applied at once.
    fn set_port(&mut self, name: &str, options: &[String]) -> Result<(), ConfigError> {
        let p = self
            .ports
            .get_mut(name)
            .ok_or_else(|| ConfigError::Invalid(format!("no port named {name}")))?;
        let mut cfg = p.cfg.clone();
        options::port_set_options(&mut cfg, options)?;
        if let Some(d) = &p.device {
            d.set_coalesce(cfg.coalesce());
        }
        // The saved configuration lists ports under their bridges.
        for b in &mut self.config.bridges {
            for c in &mut b.ports {
                if c.name == name {
                    *c = cfg.clone();
                }
            }
        }
        p.cfg = cfg;
        Ok(())
    }

    fn config_get(&self, key: Option<&str>) -> Result<Value, ConfigError> {
        let mut all = serde_json::Map::new();
        all.insert(
            "pmd-cores".into(),
            json!(self
                .pmd_cores()
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")),
        );
        all.insert(
            "mac-aging".into(),
            json!(self.config.setting_u32("mac-aging", 300).to_string()),
        );
        all.insert(
            "pmd-rx-mode".into(),
            json!(self.datapath.rx_mode().0.name()),
        );
        all.insert(
            "pmd-sleep-after-us".into(),
            json!((self.datapath.rx_mode().1 / 1000).to_string()),
        );
        all.insert(
            "pmd-sleep-max-us".into(),
            json!((self.datapath.sleep_max_ns() / 1000).to_string()),
        );
        all.insert(
            "pmd-priority".into(),
            json!(self
                .config
                .other
                .get("pmd-priority")
                .cloned()
                .unwrap_or_else(|| "normal".into())),
        );
        all.insert(
            "mac-table-size".into(),
            json!(self.config.setting_u32("mac-table-size", 8192).to_string()),
        );
        match key {
            None => Ok(Value::Object(all)),
            Some(k) => all.get(k).cloned().ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "unknown setting '{k}' (known: {})",
                    all.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            }),
        }
    }

    fn config_set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        if key == "pmd-cores" {
            let cores = config::parse_cores(value)?;
            let allowed = &self.all_cpus;
            if let Some(c) = cores.iter().find(|c| !allowed.contains(c)) {
                return Err(ConfigError::Invalid(format!(
                    "pmd-cores: core {c} is not available (allowed: {allowed:?})"
                )));
            }
            self.config.pmd_cores = cores;
            self.start_pmds()
                .map_err(|e| ConfigError::Invalid(format!("cannot start PMD threads: {e}")))?;
            return Ok(());
        }
        config::validate_setting(key, value)?;
        self.config.other.insert(key.into(), value.into());
        if key == "pmd-rx-mode" || key == "pmd-sleep-after-us" || key == "pmd-sleep-max-us" {
            self.apply_rx_mode();
        }
        if key == "pmd-priority" {
            self.start_pmds()
                .map_err(|e| ConfigError::Invalid(format!("cannot start PMD threads: {e}")))?;
        }
        if key == "flow-limit" {
            self.apply_flow_limit();
        }
        if key == "emc-insert-inv-prob" {
            self.apply_rx_mode();
        }
        if key == "mac-aging" {
            let secs = self.config.setting_u32("mac-aging", 300);
            for b in self.bridges.values() {
                b.macs.set_aging(secs);
            }
        }
        Ok(())
    }

    fn link_name(l: &Link) -> &'static str {
        match l {
            Link::Listening => "listening",
            Link::Connected => "connected",
            Link::Reconnecting { .. } => "reconnecting",
            Link::Attached => "attached",
        }
    }

    fn show(&self) -> Value {
        /// What a port takes from the switch (`accepts`: else the PMD completes checksums and
        /// segments in software) and what it may hand the switch (`sends`).
        fn offloads_info(p: &PortState) -> Value {
            use ferrovs_sys::vnet::caps;
            let sends = match (&p.device, &p.port.io) {
                (Some(d), _) => features::guest_tx_caps(d.features()),
                (None, dp::PortIo::Tap(t)) if t.rx_offloads => caps::ALL,
                _ => 0,
            };
            json!({
                "accepts": caps::names(p.port.tx_caps()),
                "sends": caps::names(sends),
            })
        }
        let bridges: Vec<Value> = self
            .bridges
            .keys()
            .map(|b| {
                let ports: Vec<Value> = self
                    .ports
                    .values()
                    .filter(|p| &p.bridge == b)
                    .map(|p| {
                        let (ready, feats) = match &p.device {
                            Some(d) => (
                                d.queues()
                                    .iter()
                                    .filter(|q| q.ready.load(Ordering::Relaxed))
                                    .count(),
                                features::names(d.features()),
                            ),
                            None => (2, vec![]),
                        };
                        json!({
                            "name": p.cfg.name,
                            "id": p.id,
                            "type": p.cfg.kind.name(),
                            "mode": p.port.io.mode(),
                            "path": p.cfg.path,
                            "dev": p.cfg.dev.as_ref().filter(|_| p.cfg.kind.is_kernel()),
                            "kernel": kernel_info(&p.port.io),
                            "mode_fallback_reason": p.fallback,
                            "state": Self::link_name(&p.link),
                            "queues": p.cfg.queues,
                            "ready_queues": ready,
                            "features": feats,
                            "offloads": offloads_info(p),
                            "vlan": match &p.port.vlan {
                                VlanMode::Access(t) => json!({"mode": "access", "tag": t}),
                                VlanMode::Trunk => json!({"mode": "trunk"}),
                                VlanMode::TrunkOf(l) => json!({"mode": "trunk", "trunks": l}),
                            },
                            "connects": p.connects,
                            "disconnects": p.disconnects,
                            "last_error": p.last_error,
                        })
                    })
                    .collect();
                json!({ "name": b, "ports": ports })
            })
            .collect();
        json!({
            "run_dir": self.run_dir,
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "upgrades": self.upgrades,
            "bridges": bridges,
            "pmd_cores": self.pmd_cores(),
            "hugepages": self.pmds.iter().all(|p| p.stats.hugepages.load(Ordering::Relaxed)),
            "bad_control_requests": self.bad_requests,
        })
    }

    fn port_stats(&self, only: Option<&str>) -> Result<Value, ConfigError> {
        self.poll_kernel_drops();
        if let Some(n) = only {
            if !self.ports.contains_key(n) {
                return Err(ConfigError::Invalid(format!("no port named {n}")));
            }
        }
        let stats_json = |s: &ferrovs_vhost::stats::StatsSnapshot| {
            let drops: serde_json::Map<String, Value> = s
                .named_drops()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            json!({
                "packets": s.packets,
                "bytes": s.bytes,
                "dropped": s.total_drops(),
                "drops": drops,
                "guest_notifications": s.calls,
                "notifications_suppressed": s.calls_suppressed,
                "notifications_coalesced": s.calls_coalesced,
                "dirty_pages_logged": s.dirty_pages,
            })
        };
        let ports: Vec<Value> = self
            .ports
            .values()
            .filter(|p| only.is_none_or(|n| n == p.cfg.name))
            .map(|p| {
                let kernel_queue = |i: usize, dir: &str, s: &ferrovs_vhost::stats::QueueStats| {
                    json!({
                        "queue": i,
                        "direction": dir,
                        "ready": true,
                        "broken": null,
                        "size": null,
                        "stats": stats_json(&s.snapshot()),
                    })
                };
                let queues: Vec<Value> = match (&p.device, p.port.kernel_stats()) {
                    (_, Some([to, from])) => vec![
                        kernel_queue(0, "to-kernel", to),
                        kernel_queue(1, "from-kernel", from),
                    ],
                    (None, None) => vec![],
                    (Some(d), None) => d
                        .queues()
                        .iter()
                        .enumerate()
                        .map(|(i, q)| {
                            let s = q.stats.snapshot();
                            let vq = q.lock();
                            json!({
                                "queue": i,
                                "direction": if i % 2 == 0 { "to-guest" } else { "from-guest" },
                                "ready": q.ready.load(Ordering::Relaxed),
                                "broken": vq.broken.map(|e| e.to_string()),
                                "size": vq.state.size,
                                "stats": stats_json(&s),
                            })
                        })
                        .collect(),
                };
                let [sw_csum, sw_tso, sw_segments] = p.port.offload.get();
                json!({
                    "port": p.cfg.name,
                    "coalesce": {
                        "usecs": p.cfg.coalesce().usecs,
                        "frames": p.cfg.coalesce().frames,
                    },
                    "offload": {
                        "sw_csum": sw_csum,
                        "sw_tso": sw_tso,
                        "sw_segments": sw_segments,
                    },
                    "rx": stats_json(&p.port.rx_stats()),
                    "tx": stats_json(&p.port.tx_stats()),
                    "vhost_user_errors": p.device.as_ref().map_or(0, |d| d.errors),
                    "refused_connections": p.refused_connections,
                    "migration": p.device.as_ref().map(|d| {
                        let m = d.migration_info();
                        json!({
                            "logging": m.logging,
                            "log_bytes": m.log_size,
                            "postcopy": m.postcopy,
                            "postcopy_pages_missing": m.pages_missing,
                            "postcopy_pages_fetched": m.pages_fetched,
                            "rarp_announces": m.rarps,
                        })
                    }),
                    "queues": queues,
                })
            })
            .collect();
        Ok(Value::Array(ports))
    }

    fn pmd_raw(s: &dp::PmdStats) -> [u64; 4] {
        [
            s.busy_cycles.load(Ordering::Relaxed),
            s.idle_cycles.load(Ordering::Relaxed),
            s.rx_packets.load(Ordering::Relaxed),
            s.tx_packets.load(Ordering::Relaxed),
        ]
    }

    /// The megaflow caches of the bridges with rules (shared by every PMD).
    fn megaflow_caches(&self) -> Value {
        let v: Vec<Value> = self
            .bridges
            .iter()
            .filter(|(_, b)| b.pipeline.is_some() || b.cache.size().0 > 0)
            .map(|(name, b)| {
                let c = &b.cache.counters;
                let (entries, subtables) = b.cache.size();
                let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                json!({
                    "bridge": name,
                    "rules": b.rules.len(),
                    "entries": entries,
                    "subtables": subtables,
                    "limit": b.cache.limit(),
                    "inserted": l(&c.inserted),
                    "evicted": l(&c.evicted),
                    "invalidated": l(&c.invalidated),
                    "revalidations": l(&c.revalidations),
                    "refused_full": l(&c.limit_refused),
                    "refused_stale": l(&c.stale_refused),
                })
            })
            .collect();
        Value::Array(v)
    }

    fn pmd_stats(&self) -> Value {
        let hz = os::tsc_hz();
        let caches = self.megaflow_caches();
        let v: Vec<Value> = self
            .pmds
            .iter()
            .zip(&self.pmd_baseline)
            .map(|(p, base)| {
                let s = &p.stats;
                let raw = Self::pmd_raw(s);
                let [busy, idle, rx, tx] = [0, 1, 2, 3].map(|i| raw[i].saturating_sub(base[i]));
                let total = (busy + idle).max(1);
                let f = s.flow.load();
                let flow = json!({
                    "packets": f.packets,
                    "emc_hits": f.emc_hits,
                    "megaflow_hits": f.megaflow_hits,
                    "upcalls": f.upcalls,
                    "emc_inserts": f.emc_inserts,
                    "emc_skipped": f.emc_skipped,
                });
                json!({
                    "pmd": s.index,
                    "core": s.core,
                    "rx_queues": s.rxqs.load(Ordering::Relaxed),
                    "rx_packets": rx,
                    "tx_packets": tx,
                    "busy_cycles": busy,
                    "idle_cycles": idle,
                    "busy_pct": (busy as f64 * 100.0 / total as f64 * 10.0).round() / 10.0,
                    "cycles_per_packet": if rx > 0 { (busy as f64 / rx as f64 * 10.0).round() / 10.0 } else { 0.0 },
                    "iterations": s.iterations.load(Ordering::Relaxed),
                    "rx_mode": self.datapath.rx_mode().0.name(),
                    "sleep_max_us": self.datapath.sleep_max_ns() / 1000,
                    "priority": self.config.other.get("pmd-priority").map_or("normal", |v| v.as_str()),
                    "priority_error": s.priority_error.get(),
                    "sleeps": s.sleeps.load(Ordering::Relaxed),
                    "kick_wakeups": s.kick_wakeups.load(Ordering::Relaxed),
                    "load_sleeps": s.load_sleeps.load(Ordering::Relaxed),
                    "sleep_cycles": s.sleep_cycles.load(Ordering::Relaxed),
                    "sleep_us": (s.sleep_cycles.load(Ordering::Relaxed) as u128 * 1_000_000 / hz.max(1) as u128) as u64,
                    "tsc_hz": hz,
                    "hugepages": s.hugepages.load(Ordering::Relaxed),
                    "flow": flow,
                    "megaflow_caches": caches.clone(),
                })
            })
            .collect();
        Value::Array(v)
    }

    fn mac_table(&self, bridge: &str) -> Result<Value, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        let now = self.clock.load(Ordering::Relaxed);
        let names: HashMap<u32, &str> = self
            .ports
            .values()
            .map(|p| (p.id, p.cfg.name.as_str()))
            .collect();
        let v: Vec<Value> = b
            .macs
            .dump(now)
            .into_iter()
            .map(|e| {
                json!({
                    "mac": ferrovs_packet::mac_to_string(e.mac),
                    "vlan": e.vlan,
                    "port": names.get(&e.port).copied().unwrap_or("?"),
                    "age": e.age,
                })
            })
            .collect();
        Ok(Value::Array(v))
    }

    /// The revalidator's periodic pass (see [`REVALIDATE_EVERY`]).
    fn revalidator(&mut self) {
        let now_s = self.clock.load(Ordering::Relaxed);
        let max_idle = self
            .config
            .setting_u32("flow-max-idle", dp::flow::megaflow::DEFAULT_MAX_IDLE_S);
        let mut expired = Vec::new();
        for (name, b) in self.bridges.iter_mut() {
            if b.pipeline.is_none() && b.cache.size().0 == 0 {
                continue;
            }
            b.cache.maintain(now_s, max_idle);
            let now = Instant::now();
            let gone = b.rules.expire(now, |r| {
                match r.stats.used.load(Ordering::Relaxed) {
                    // Never hit: idle since installed.
                    0 => now.duration_since(r.installed),
                    u => Duration::from_secs(u64::from(now_s).saturating_sub(u)),
                }
            });
            if !gone.is_empty() {
                b.dirty = true;
                expired.push(name.clone());
            }
        }
        if expired.is_empty() {
            return;
        }
        for name in &expired {
            self.sync_flows_config(name);
        }
        self.publish();
        self.save();
    }

    /// Copies a bridge's rules into the configuration (to be saved).
    fn sync_flows_config(&mut self, bridge: &str) {
        let Some(b) = self.bridges.get(bridge) else {
            return;
        };
        let flows = (!b.rules.is_plain_normal()).then(|| b.rules.texts());
        if let Some(c) = self.cfg_bridge(bridge) {
            c.flows = flows;
        }
    }

    /// Applies `flow-limit` to every megaflow cache.
    fn apply_flow_limit(&self) {
        let limit = self
            .config
            .setting_u32("flow-limit", dp::flow::megaflow::DEFAULT_LIMIT as u32);
        for b in self.bridges.values() {
            b.cache.set_limit(limit as usize);
        }
    }

    fn bridge_mut(&mut self, bridge: &str) -> Result<&mut BridgeState, ConfigError> {
        self.bridges
            .get_mut(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))
    }

    /// `ferrovs add-flow(s)`: all the rules or none (the first bad one is named).
    fn add_flows(&mut self, bridge: &str, flows: &[String]) -> Result<Value, ConfigError> {
        let mut specs = Vec::with_capacity(flows.len());
        for (i, f) in flows.iter().enumerate() {
            let spec = ferrovs_flow::parse_flow(f).map_err(|e| {
                ConfigError::Invalid(if flows.len() == 1 {
                    format!("bad flow: {e}")
                } else {
                    format!("flow {}: {e}", i + 1)
                })
            })?;
            specs.push(spec);
        }
        let n = specs.len();
        let b = self.bridge_mut(bridge)?;
        b.rules.add(specs);
        b.dirty = true;
        self.sync_flows_config(bridge);
        self.publish();
        Ok(json!({ "added": n, "rules": self.bridges[bridge].rules.len() }))
    }

    /// `ferrovs del-flows`.
    fn del_flows(
        &mut self,
        bridge: &str,
        filter: &str,
        strict: bool,
    ) -> Result<Value, ConfigError> {
        let f = ferrovs_flow::parse_filter(filter)
            .map_err(|e| ConfigError::Invalid(format!("bad flow filter: {e}")))?;
        let b = self.bridge_mut(bridge)?;
        // Statistics of the rules going away are final: push them first (for nobody, but
        // the megaflows pointing to them are about to be revalidated anyway).
        let n = b.rules.delete(&f, strict);
        if n > 0 {
            b.dirty = true;
            self.sync_flows_config(bridge);
            self.publish();
        }
        Ok(json!({ "deleted": n, "rules": self.bridges[bridge].rules.len() }))
    }

    /// `ferrovs dump-flows`: the rules `filter` selects, with their counters.
    fn dump_flows(&self, bridge: &str, filter: Option<&str>) -> Result<Value, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        let f = ferrovs_flow::parse_filter(filter.unwrap_or(""))
            .map_err(|e| ConfigError::Invalid(format!("bad flow filter: {e}")))?;
        b.cache.push_stats();
        let v: Vec<Value> = b
            .rules
            .rules()
            .iter()
            .filter(|r| f.selects(&r.spec, false))
            .map(|r| {
                let s = &r.spec;
                json!({
                    "table": s.table,
                    "priority": s.priority,
                    "cookie": format!("{:#x}", s.cookie),
                    "duration_s": (r.installed.elapsed().as_millis() as f64 / 1000.0),
                    "idle_timeout": s.idle_timeout,
                    "hard_timeout": s.hard_timeout,
                    "n_packets": r.stats.packets.load(Ordering::Relaxed),
                    "n_bytes": r.stats.bytes.load(Ordering::Relaxed),
                    "flow": s.to_string(),
                })
            })
            .collect();
        Ok(Value::Array(v))
    }

    /// `ferrovs dump-megaflows`: the bridge's cached megaflows.
    fn dump_megaflows(&self, bridge: &str) -> Result<Value, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        let names: HashMap<u32, &str> = self
            .ports
            .values()
            .map(|p| (p.id, p.cfg.name.as_str()))
            .collect();
        let now = self.clock.load(Ordering::Relaxed);
        let v: Vec<Value> = b
            .cache
            .entries()
            .iter()
            .map(|f| {
                json!({
                    "match": crate::flows::format_megaflow(&f.key, &f.mask, &names),
                    "actions": crate::flows::format_dp_actions(&f.actions, &names),
                    "packets": f.packets.load(Ordering::Relaxed),
                    "bytes": f.bytes.load(Ordering::Relaxed),
                    "used_s_ago": now.saturating_sub(f.used.load(Ordering::Relaxed)),
                })
            })
            .collect();
        Ok(Value::Array(v))
    }

    /// Reads the kernel's AF_XDP drop counters into the ports' counters.
    fn poll_kernel_drops(&self) {
        for p in self.ports.values() {
            if let PortIo::Xdp(x) = &p.port.io {
                x.poll_kernel_drops();
            }
        }
    }

    fn tick(&mut self) {
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
    }

    /// Runs the control loop until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut events = [EpollEvent::default(); 64];
        let mut last_tick = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let n = match self.epoll.wait(&mut events, TICK.as_millis() as i32) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("ferrovs: epoll: {e}");
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
        let _ = std::fs::remove_file(&self.ctl_path);
    }
}

/// What `show` says about a kernel port's attachment (null for vhost-user ports).
/// SEND_RARP: the frontend (QEMU after a migration, for a guest that cannot announce
/// itself) asks us to announce `mac` from its port: a RARP enters the datapath as if the
/// guest had sent it, so every bridge and switch on the way learns where the guest now is.
fn announce(port: &Port, mac: [u8; 6]) {
    port.inject.push(&ferrovs_packet::rarp_announce(mac));
    eprintln!(
        "ferrovs: {}: announcing {} (SEND_RARP)",
        port.name,
        ferrovs_packet::mac_to_string(mac.iter().fold(0u64, |m, b| m << 8 | u64::from(*b)))
    );
}

fn kernel_info(io: &PortIo) -> Value {
    match io {
        PortIo::Vhost { .. } => Value::Null,
        PortIo::Vxlan(v) => json!({
            "local": v.local.to_string(),
            "remote": v.remote.to_string(),
            "vni": v.vni,
            "rx": "recvfrom",
            "tx": "sendto",
        }),
        PortIo::Tap(t) => json!({
            "device": t.tap.name(),
            "vnet_hdr_len": ferrovs_sys::tap::VNET_HDR_LEN,
            "offloads": Vec::<&str>::new(),
        }),
        PortIo::Uplink(u) => {
            let g = u.geometry;
            json!({
                "ifindex": u.sock.ifindex(),
                "ignore_outgoing": u.sock.ignores_outgoing(),
                "rx": "tpacket_v3",
                "tx": "sendmmsg",
                "ring_blocks": g.block_nr,
                "ring_block_size": g.block_size,
                "ring_block_timeout_ms": ferrovs_sys::af_packet::RETIRE_BLOCK_MS,
            })
        }
        PortIo::Xdp(x) => {
            let g = x.sock.geometry();
            let (posted, lost) = x
                .rx_ring
                .lock()
                .map(|r| (r.posted(), r.lost()))
                .unwrap_or_default();
            let (free, outstanding, bad) = x
                .tx_ring
                .lock()
                .map(|t| (t.free_frames(), t.outstanding(), t.bad_completions()))
                .unwrap_or_default();
            json!({
                "ifindex": x.sock.ifindex(),
                "queue": 0,
                "xdp_mode": x.sock.xdp_mode().name(),
                "bind": if x.sock.zero_copy() { "zero-copy" } else { "copy" },
                "rx": "af_xdp",
                "tx": "af_xdp",
                "umem_frame_size": g.frame_size,
                "umem_rx_frames": g.rx_frames,
                "umem_tx_frames": g.tx_frames,
                "rx_frames_with_kernel": posted,
                "tx_frames_free": free,
                "tx_frames_in_flight": outstanding,
                "frames_lost": lost + bad,
            })
        }
    }
}
