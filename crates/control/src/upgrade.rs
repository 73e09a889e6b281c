//! Hot upgrade: the handover protocol and the versioned state it carries.
//!
//! The old daemon listens on `DIR/ferrovs.upgrade`, a `SOCK_SEQPACKET` unix socket (one
//! message per packet, fds attached with SCM_RIGHTS). The new daemon connects and the two
//! walk through these steps (`docs/upgrade.md` has the why):
//!
//! ```text
//!  new                                  old (keeps forwarding until FREEZE)
//!  Hello{schema range} ───────────────▶
//!                      ◀─────────────── Fds… (≤ 32 per packet), State (plain data)
//!  map memory, prefault rings,
//!  build ports (nothing touches a ring)
//!  Ready ─────────────────────────────▶ FREEZE: PMDs leave every ring at a burst boundary
//!                      ◀─────────────── Conntrack{entries}… (schema 4 peers), then
//!                      ◀─────────────── Frozen{ring positions, freeze time}
//!  start rings there, publish, wake PMDs
//!  Resumed ───────────────────────────▶ exits (commit)
//!                      ◀─────────────── Bye{final counters}
//! ```
//!
//! A failure or timeout before `Frozen` leaves the old daemon as it was. After `Frozen`, the
//! old daemon cannot know whether the new one started polling, so before it resumes it kills
//! the new one (SIGKILL to the SO_PEERCRED pid) and waits until it runs no more code, then
//! re-reads every ring's position from guest memory: no ring is ever polled by two
//! processes. vhost-user messages are read by exactly one side: the old stops reading them
//! when the handover starts, the new starts once the old has said `Bye`; a message half read
//! by the old travels in the state.
//!
//! The state is plain data with an explicit schema number. A newer daemon restores every
//! schema from [`MIN_SCHEMA`] to [`SCHEMA`]; anything else is refused with a clear error before
//! anything is touched. `tests/e2e/fixtures/upgrade-state-v*.json` keep each released schema.
//!
//! Each crate owns the plain state of what it runs: a vhost-user device is
//! [`ferrovs_vhost::state::DeviceState`] (serialised as is, through vhost's `serde` feature),
//! validated by vhost as untrusted input; ring positions and geometry are `ferrovs_sys`'s,
//! counters [`StatsSnapshot`] (`ferrovs_counters`), each serialised through its crate's
//! `serde` feature. [`State::parse`] is the one way in: JSON, schema
//! check, typed parse, validation; the takeover and the `upgrade_state` fuzz target use it.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

pub use ferrovs_counters::StatsSnapshot;
pub use ferrovs_sys::kernel::af_packet::{RingGeometry as RingState, RingPosition as RingPos};
use ferrovs_sys::kernel::af_xdp::{XskGeometry, XskRxPosition, XskStats, XskTxPosition};
use ferrovs_sys::kernel::bpf::XdpMode;
use ferrovs_sys::os;
use ferrovs_vhost::state::FdSource;
pub use ferrovs_vhost::state::{DeviceState, LogState, QueueState, RegionState};

use crate::config::{Config, PortConfig};

/// Newest schema this daemon writes. Schema 2 adds the dirty log of a port whose VM is being
/// live-migrated ([`DeviceState::log`], [`QueueState::log_addr`]); a daemon writes schema 1
/// when no port logs, so that a daemon that restores only schema 1 can still take over then
/// (and is refused, with the reason, while a migration logs). Schema 3 adds the OVSDB
/// section ([`State::ovsdb`]) and is written only by a daemon configured through OVSDB: a
/// daemon that knows nothing of OVSDB refuses it instead of running on without the database.
/// Schema 4 says that tracked connections come with the state: the old daemon exports its
/// connection table once frozen and sends it in [`Msg::Conntrack`] messages before
/// [`Msg::Frozen`]; it writes schema 4 only when it tracks connections at the hello, so a
/// daemon without connection tracking takes over from one with an empty table and is
/// refused (with the number of connections it would drop) otherwise. A peer that restores
/// schema 4 gets the table whatever schema the state has (connections made between the
/// hello and the freeze travel too).
pub const SCHEMA: u32 = 4;
/// Oldest schema this daemon restores.
pub const MIN_SCHEMA: u32 = 1;
/// Name of the upgrade socket in the run directory.
pub const UPGRADE_SOCKET: &str = "ferrovs.upgrade";
/// Handover history (one JSON line per takeover) in the run directory.
pub const HISTORY: &str = "upgrade-history.jsonl";
/// Largest handover message.
pub const MAX_MSG: usize = 8 << 20;
/// Fds per message (SCM_RIGHTS), see [`os::MAX_FDS`].
const FDS_PER_MSG: usize = 32;

/// One handover message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum Msg {
    /// new → old: which schemas the new daemon restores.
    Hello {
        schema_min: u32,
        schema_max: u32,
        version: String,
    },
    /// old → new: a packet of fds (referenced by index in [`State`], in arrival order).
    Fds { count: u32 },
    /// old → new: everything else.
    State(Box<State>),
    /// new → old: prepared; freeze now.
    Ready { prepare_us: u64 },
    /// old → new, between the freeze and [`Msg::Frozen`], to a peer that restores schema 4:
    /// part of the connection table (`ferrovs_conntrack`'s plain state, validated by the new
    /// daemon as untrusted input before its PMDs start; parts are concatenated).
    Conntrack(ferrovs_conntrack::TableState),
    /// old → new: rings stopped here; resume from exactly these positions.
    Frozen {
        /// CLOCK_MONOTONIC when the old daemon began to freeze.
        t_freeze_ns: u64,
        /// How long stopping the PMDs and collecting positions took.
        freeze_us: u64,
        /// Per port (by name), per queue: `last_avail` (None: not started).
        positions: Vec<(String, Vec<Option<u16>>)>,
        /// Per uplink port (by name): where the old daemon stopped reading its RX ring.
        #[serde(default)]
        rings: Vec<(String, RingPos)>,
        /// Per AF_XDP uplink (by name): ring indices and the free transmit frames.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        xsks: Vec<(String, XskPos)>,
    },
    /// new → old: forwarding.
    Resumed { t_resumed_ns: u64 },
    /// old → new: committed; the old daemon exits. Carries its final counters per port (by
    /// name) and queue (kernel ports: to the kernel, from the kernel), taken at the freeze: sent after the new daemon resumed, so that they
    /// cost nothing in the forwarding gap; the new daemon adds them to its own.
    Bye {
        #[serde(default)]
        stats: Vec<(String, Vec<StatsSnapshot>)>,
        /// Per port: counters kept by the switch rather than by a queue (added in schema 1
        /// without a version change: an older peer leaves it out).
        #[serde(default)]
        ports: Vec<(String, PortCounters)>,
        /// Per bridge (by name): its rules' counters, in the order of the rules in the
        /// handed-over configuration (`BridgeConfig::flows`; added without a version change:
        /// an older peer leaves it out, and ignores it).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rules: Vec<(String, Vec<RuleCounters>)>,
        /// Per bridge: its groups' counters, by group id (added without a version change,
        /// like `rules`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<(String, Vec<GroupCounters>)>,
        /// Per bridge: its meters' counters, by meter id (added without a version change,
        /// like `rules`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        meters: Vec<(String, Vec<MeterCounters>)>,
    },
    /// either way: this side gives up (the old daemon carries on).
    Fail { error: String },
}

/// The handed-over state.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    pub schema: u32,
    /// ferrovsd version that wrote it.
    pub version: String,
    /// Its pid.
    pub pid: i32,
    pub config: Config,
    /// Index of the control socket's listening fd.
    pub ctl_listener: u32,
    /// Index of the upgrade socket's listening fd.
    pub upgrade_listener: u32,
    pub bridges: Vec<BridgeState>,
    pub ports: Vec<PortState>,
    /// Upgrades so far (carried on; the history file has them all).
    pub upgrades: u64,
    /// A daemon configured through OVSDB (`--ovsdb`): the new daemon connects to the same
    /// server and finds every port already as the database asks (absent: not in OVSDB mode,
    /// and in what daemons older than the field wrote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ovsdb: Option<OvsdbState>,
    /// The OpenFlow connections, listeners and controllers, handed over whole (absent in
    /// what older daemons wrote, and ignored by them: then the new daemon binds the
    /// management sockets and reconnects to the controllers itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openflow: Option<OpenflowState>,
    /// The nonce in the bridge tokens of the continuations the old daemon sent
    /// (`controller(pause)`, docs/openflow.md "Continuations"): the new daemon takes it, so
    /// a controller's `NXT_RESUME` of one is not stale after the upgrade (absent: in what
    /// daemons older than the field wrote; their continuations are then stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation_nonce: Option<u32>,
}

/// The OpenFlow side of a daemon (`docs/upgrade.md`, "OpenFlow connections"): every
/// connection's socket and state, the management sockets, and each bridge's controllers.
/// Fds are indices into the fd list, as everywhere in [`State`].
///
/// A connection or a bridge's controllers are each [`Lenient`]: one that does not parse
/// (or that the new daemon refuses once parsed) is closed and counted, the rest of the
/// upgrade goes on.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct OpenflowState {
    /// Each bridge's management socket `BRIDGE.mgmt`: (bridge, listening fd).
    #[serde(default)]
    pub listeners: Vec<(String, u32)>,
    /// Every connection (management, active and accepted controller connections).
    #[serde(default)]
    pub conns: Vec<Lenient<OfConnState>>,
    /// Per bridge: its controllers, their election and fail-open state.
    #[serde(default)]
    pub bridges: Vec<Lenient<OfBridgeState>>,
    /// PORT_MOD's configuration bits, by port name (they last until a restart, as OVS's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_config: Vec<(String, u32)>,
}

/// One OpenFlow connection, at whatever byte of a message it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfConnState {
    /// The socket (fd index).
    pub socket: u32,
    /// A TCP socket (else a Unix stream socket).
    #[serde(default)]
    pub tcp: bool,
    pub bridge: String,
    /// The controller target it belongs to (`None`: a management connection).
    #[serde(default)]
    pub controller: Option<String>,
    /// HELLO exchanged; `version` is then the negotiated one.
    pub negotiated: bool,
    pub version: u8,
    /// Closing once `output` is written.
    #[serde(default)]
    pub closing: bool,
    /// A non-blocking TCP connect still under way.
    #[serde(default)]
    pub connecting: bool,
    pub role: crate::controller::Role,
    pub miss_send_len: u16,
    /// SET_ASYNC's masks: packet-in, port-status, flow-removed, each `[master/equal,
    /// slave]`.
    pub async_config: [[u32; 2]; 3],
    /// `NXPIF_*`.
    #[serde(default)]
    pub packet_in_format: u32,
    #[serde(default)]
    pub controller_id: u16,
    /// Bytes read and not yet handled (a partial message, or whole ones that waited).
    #[serde(default, with = "hex_bytes")]
    pub input: Vec<u8>,
    /// Bytes not yet written.
    #[serde(default, with = "hex_bytes")]
    pub output: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::controller::ProbeState>,
    /// Open (or closed, not committed) bundles, their messages as received.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bundles: Vec<BundleState>,
}

/// An open bundle: its id, flags, whether it was closed, and its messages' bytes (the
/// new daemon decodes them again, as untrusted input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleState {
    pub id: u32,
    pub flags: u16,
    #[serde(default)]
    pub closed: bool,
    #[serde(default)]
    pub msgs: Vec<HexBytes>,
}

/// Bytes on the wire as a hex string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HexBytes(#[serde(with = "hex_bytes")] pub Vec<u8>);

/// A bridge's controllers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfBridgeState {
    pub bridge: String,
    /// The master election id.
    #[serde(default)]
    pub election: Option<u64>,
    /// How long no controller has been connected (`None`: one is, or none is configured).
    #[serde(default)]
    pub disconnected_ms: Option<u64>,
    #[serde(default)]
    pub fail_open: bool,
    pub controllers: Vec<CtrlState>,
}

/// One controller of a bridge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtrlState {
    pub target: String,
    pub state: CtrlLink,
    #[serde(default)]
    pub backoff: crate::controller::BackoffState,
    #[serde(default)]
    pub connects: u64,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub ever_error: Option<String>,
    /// Milliseconds since the last connection was made and the last one ended.
    #[serde(default)]
    pub connected_ms: Option<u64>,
    #[serde(default)]
    pub disconnected_ms: Option<u64>,
}

/// Where a controller is: `conn` is an index into [`OpenflowState::conns`], `fd` a
/// passive target's listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "at", rename_all = "lowercase")]
pub enum CtrlLink {
    /// The next attempt in this many milliseconds.
    Backoff {
        in_ms: u64,
    },
    Connecting {
        conn: u32,
    },
    Connected {
        conn: u32,
    },
    Listening {
        fd: u32,
    },
}

/// One element of a list that is restored element by element: one that does not parse
/// is kept as its error (and refused alone) instead of refusing the whole state.
#[derive(Debug)]
pub struct Lenient<T>(pub Result<T, String>);

impl<T: PartialEq> PartialEq for Lenient<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T: Serialize> Serialize for Lenient<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Ok(t) => t.serialize(s),
            Err(_) => s.serialize_unit(),
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(Lenient(
            serde_json::from_value(v).map_err(|e| e.to_string()),
        ))
    }
}

/// `Vec<u8>` as a lowercase hex string.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(b.len() * 2);
        for x in b {
            out.push(char::from(b"0123456789abcdef"[usize::from(x >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(x & 15)]));
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let digit = |c: u8| -> Result<u8, D::Error> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(serde::de::Error::custom("not a hex digit")),
            }
        };
        let s = s.as_bytes();
        if s.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd number of hex digits"));
        }
        s.chunks(2)
            .map(|p| Ok((digit(p[0])? << 4) | digit(p[1])?))
            .collect()
    }
}

/// The OVSDB side of a daemon, as plain data: the remote, the settings the database set,
/// and the connection itself with its session (`docs/upgrade.md`, "The OVSDB connection").
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct OvsdbState {
    /// `unix:PATH` or `tcp:IP:PORT`.
    pub remote: String,
    /// Our settings the database set (they go back to their defaults when it drops them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
    /// The connection, synchronised (absent: none was, or it did not fit, or an older
    /// daemon wrote the state; then the new daemon connects and resynchronises). One that
    /// does not parse or that the new daemon refuses is closed and counted, and the new
    /// daemon connects afresh; the rest of the upgrade goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn: Option<Lenient<OvsdbConnState>>,
}

/// The database connection at whatever byte it is: its socket (by index) and session, and
/// what the daemon does with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OvsdbConnState {
    /// The socket (fd index).
    pub socket: u32,
    /// A TCP socket (else a Unix stream socket).
    #[serde(default)]
    pub tcp: bool,
    /// The session: schema, monitor, replica, requests in flight, buffered bytes.
    pub session: ferrovs_ovsdb::SessionState,
    /// The id of the write-back transaction in flight (one at a time).
    #[serde(default)]
    pub writeback: Option<u64>,
    /// `next_cfg` of the last apply.
    #[serde(default)]
    pub applied_cfg: Option<i64>,
    /// Milliseconds since the server last sent a byte, and whether the echo that probes it
    /// is out.
    #[serde(default)]
    pub idle_ms: u64,
    #[serde(default)]
    pub probe_sent: bool,
    /// Connections made so far (carried on: `show`'s `ovsdb.connects`).
    #[serde(default)]
    pub connects: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BridgeState {
    pub name: String,
    pub id: u32,
    /// Learned addresses: (mac, vlan, port id).
    pub macs: Vec<(u64, u16, u32)>,
    /// The bridge's tunnel option map (`NXT_TLV_TABLE_MOD`'s, which a controller does not
    /// send again after a handover): (option class, type, length, `tun_metadata` index).
    /// Added without a version change: an older peer leaves it out, and ignores it. Checked
    /// by [`ferrovs_flow::TlvMap::new`] when restored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tlv: Vec<(u16, u8, u8, u8)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PortState {
    pub id: u32,
    /// OpenFlow port number (absent in what older daemons wrote: the new daemon picks one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ofport: Option<u16>,
    pub bridge: String,
    pub cfg: PortConfig,
    pub link: LinkState,
    pub listener: Option<u32>,
    pub conn: Option<ConnState>,
    /// The vhost-user device (empty for kernel ports).
    #[serde(default)]
    pub device: DeviceState,
    /// A TAP or uplink port's kernel side (absent for vhost-user ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelState>,
    pub connects: u64,
    pub disconnects: u64,
    pub refused_connections: u64,
    pub last_error: Option<String>,
    /// An uplink on AF_PACKET because AF_XDP could not be set up: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// A vhost-user connection, at whatever point of a message it is.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConnState {
    pub socket: u32,
    /// Bytes of a message read in part.
    pub partial: Vec<u8>,
    /// Fds that came with them.
    pub fds: Vec<u32>,
    /// Replies not yet written.
    pub out: Vec<u8>,
}

/// The kernel side of a TAP or uplink port: its fd, and for an uplink the shape of the RX
/// ring the new daemon maps from the same socket (a ring is set once per socket, but any
/// holder of the socket may map it).
#[derive(Debug, Serialize, Deserialize)]
pub struct KernelState {
    /// The TAP fd, the AF_PACKET socket or the AF_XDP socket.
    pub fd: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingState>,
    /// An AF_XDP uplink's other fds and shape (absent: TAP or AF_PACKET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp: Option<XdpState>,
}

/// An AF_XDP uplink besides its socket: the UMEM memfd, the promiscuity socket, the BPF
/// map, program and link (fd indices), the UMEM's shape and the kernel counters already
/// counted. The new daemon maps the same UMEM and rings; positions come at the freeze.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct XdpState {
    pub umem: u32,
    pub promisc: u32,
    pub map: u32,
    pub prog: u32,
    pub link: u32,
    pub ifindex: u32,
    pub xdp_mode: XdpMode,
    /// `frame_size`, `rx_frames`, `tx_frames`.
    #[serde(flatten)]
    pub geometry: XskGeometry,
    /// `XDP_STATISTICS` already added to the counters (on the wire `[rx_dropped,
    /// rx_ring_full, rx_invalid_descs, tx_invalid_descs]`).
    #[serde(default)]
    pub stats_seen: XskStats,
}

/// Where an AF_XDP uplink's PMD stopped: the indices we own in the four rings, and the
/// transmit frames free in user space (every other transmit frame is outstanding). On the
/// wire one flat object: `rx_cons`, `fill_prod`, `tx_prod`, `cq_cons`, `tx_free`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XskPos {
    #[serde(flatten)]
    pub rx: XskRxPosition,
    #[serde(flatten)]
    pub tx: XskTxPosition,
}

/// A port's link on the wire (the names schemas 1 and 2 carry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    /// A vhost-user server port waiting for its frontend.
    Listening,
    /// A vhost-user port with its frontend connected.
    Connected,
    /// A vhost-user client port between attempts to connect.
    Reconnecting,
    /// A kernel port.
    Attached,
}

/// A port's own counters: drops decided by the switch for packets it received, packets that
/// found no ready queue, and offloads done in software (`[sw_csum, sw_tso, sw_segments]`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PortCounters {
    #[serde(default)]
    pub rx_drops: StatsSnapshot,
    #[serde(default)]
    pub tx_not_ready: u64,
    #[serde(default)]
    pub offload: [u64; 3],
}

/// One rule's counters at the freeze (OpenFlow's flow stats: they go on counting in the new
/// daemon, and its duration and timeouts go on from the same install time).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleCounters {
    #[serde(default)]
    pub packets: u64,
    #[serde(default)]
    pub bytes: u64,
    /// Milliseconds since it was installed.
    #[serde(default)]
    pub age_ms: u64,
    /// Seconds since its last packet; `None`: no packet yet.
    #[serde(default)]
    pub idle_s: Option<u64>,
    /// The `max_len` of each of its OUTPUT actions as the FLOW_MOD gave them (absent: all
    /// 0, as ovs-ofctl sends them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_max_len: Vec<u16>,
}

/// One group's counters at the freeze (OpenFlow's group stats); its duration goes on from
/// the same install time. The group itself travels in the configuration
/// (`BridgeConfig::groups`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCounters {
    /// The group id.
    pub id: u32,
    #[serde(default)]
    pub packets: u64,
    #[serde(default)]
    pub bytes: u64,
    /// Per bucket, in the group's order: `[packets, bytes]`.
    #[serde(default)]
    pub buckets: Vec<(u64, u64)>,
    /// Milliseconds since it was installed.
    #[serde(default)]
    pub age_ms: u64,
}

/// One meter's counters at the freeze (OpenFlow's meter stats); its duration goes on from
/// the same time. The meter itself travels in the configuration (`BridgeConfig::meters`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterCounters {
    /// The meter id.
    pub id: u32,
    /// Packets and bytes in.
    #[serde(default)]
    pub packets: u64,
    #[serde(default)]
    pub bytes: u64,
    /// Per band, in the meter's order: `[packets, bytes]` it fired for.
    #[serde(default)]
    pub bands: Vec<(u64, u64)>,
    /// Milliseconds since it was added.
    #[serde(default)]
    pub age_ms: u64,
}

/// Why handed-over state was refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("handed-over state has no schema number")]
    NoSchema,
    #[error(
        "handed-over state has schema {0}; this ferrovsd ({v}) restores schemas {MIN_SCHEMA} \
         to {SCHEMA}",
        v = env!("CARGO_PKG_VERSION")
    )]
    Schema(u64),
    #[error("handed-over state is malformed")]
    Malformed(#[source] serde_json::Error),
    #[error("port {port}: handed over without its device")]
    NoDevice { port: String },
    #[error("port {port}")]
    Device {
        port: String,
        #[source]
        source: ferrovs_vhost::state::StateError,
    },
    #[error("handed-over state names fd {0}, which did not arrive (or twice)")]
    MissingFd(u32),
}

impl State {
    /// Refuses a schema this daemon does not restore, saying which it does.
    pub fn check_schema(schema: u64) -> Result<(), StateError> {
        if (u64::from(MIN_SCHEMA)..=u64::from(SCHEMA)).contains(&schema) {
            Ok(())
        } else {
            Err(StateError::Schema(schema))
        }
    }

    /// Parses state from JSON, checking the schema before anything else, then validates it.
    pub fn from_json(v: serde_json::Value) -> Result<State, StateError> {
        let schema = v
            .get("schema")
            .and_then(|s| s.as_u64())
            .ok_or(StateError::NoSchema)?;
        Self::check_schema(schema)?;
        let st: State = serde_json::from_value(v).map_err(StateError::Malformed)?;
        st.validate()?;
        Ok(st)
    }

    /// The takeover's way in, from a message's bytes: [`State::from_json`] of a `state`
    /// message (or of the bare state).
    pub fn parse(bytes: &[u8]) -> Result<State, StateError> {
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(StateError::Malformed)?;
        Self::from_json(v)
    }

    /// What can be checked before any fd is used: every vhost-user port's device (by
    /// vhost's own rules). Kernel ports are checked when their fds are adopted.
    pub fn validate(&self) -> Result<(), StateError> {
        for p in &self.ports {
            if p.cfg.kind.is_kernel() {
                continue;
            }
            p.device.validate().map_err(|source| {
                if p.device.queue_pairs == 0 {
                    StateError::NoDevice {
                        port: p.cfg.name.clone(),
                    }
                } else {
                    StateError::Device {
                        port: p.cfg.name.clone(),
                        source,
                    }
                }
            })?;
        }
        Ok(())
    }
}

/// Why receiving the state failed.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error("receiving the state")]
    Io(#[source] io::Error),
    #[error("the old daemon closed the upgrade channel")]
    Closed,
    #[error("malformed handover message")]
    Message(#[source] serde_json::Error),
    #[error("fd packet announced {announced} fds and carried {carried}")]
    FdCount { announced: u64, carried: usize },
    #[error("the old daemon refused: {0}")]
    Refused(String),
    #[error("unexpected handover message {0:?}")]
    Unexpected(Option<String>),
    #[error(transparent)]
    State(#[from] StateError),
}

/// The handover channel: one seqpacket socket, one message per packet.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
    buf: Vec<u8>,
}

impl Channel {
    pub fn new(sock: UnixStream) -> io::Result<Channel> {
        sock.set_nonblocking(false)?;
        os::set_socket_buffers(&sock, MAX_MSG)?;
        Ok(Channel {
            sock,
            buf: vec![0; MAX_MSG],
        })
    }

    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Sends one message (with up to 32 fds).
    pub fn send(&self, m: &Msg, fds: &[RawFd]) -> io::Result<()> {
        let bytes = serde_json::to_vec(m).map_err(io::Error::other)?;
        if bytes.len() > MAX_MSG {
            return Err(io::Error::other(format!(
                "handover message of {} bytes is larger than {MAX_MSG}",
                bytes.len()
            )));
        }
        let n = os::send_with_fds(&self.sock, &bytes, fds)?;
        if n != bytes.len() {
            return Err(io::Error::other("handover message cut short"));
        }
        Ok(())
    }

    /// Sends fds in packets of 32, then the message.
    pub fn send_with_fds(&self, m: &Msg, fds: &[RawFd]) -> io::Result<()> {
        for chunk in fds.chunks(FDS_PER_MSG) {
            self.send(
                &Msg::Fds {
                    count: chunk.len() as u32,
                },
                chunk,
            )?;
        }
        self.send(m, &[])
    }

    /// Receives one message, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: std::time::Duration) -> io::Result<(Msg, Vec<OwnedFd>)> {
        self.sock.set_read_timeout(Some(timeout))?;
        let (n, fds) = loop {
            match os::recv_with_fds(&self.sock, &mut self.buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no answer within {timeout:?}"),
                    ))
                }
                r => break r?,
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the other daemon closed the upgrade channel",
            ));
        }
        let m = serde_json::from_slice(&self.buf[..n])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok((m, fds))
    }

    /// Receives fd packets until the state, checking its schema before parsing the rest.
    pub fn recv_state(
        &mut self,
        timeout: std::time::Duration,
    ) -> Result<(State, Vec<OwnedFd>), RecvError> {
        let mut all = Vec::new();
        loop {
            self.sock
                .set_read_timeout(Some(timeout))
                .map_err(RecvError::Io)?;
            let (n, fds) = os::recv_with_fds(&self.sock, &mut self.buf).map_err(RecvError::Io)?;
            if n == 0 {
                return Err(RecvError::Closed);
            }
            let v: serde_json::Value =
                serde_json::from_slice(&self.buf[..n]).map_err(RecvError::Message)?;
            match v.get("msg").and_then(|m| m.as_str()) {
                Some("fds") => {
                    let announced = v.get("count").and_then(|c| c.as_u64()).unwrap_or(0);
                    if announced != fds.len() as u64 {
                        return Err(RecvError::FdCount {
                            announced,
                            carried: fds.len(),
                        });
                    }
                    all.extend(fds);
                }
                // The path `State::parse` (and the `upgrade_state` fuzz target) takes.
                Some("state") => return Ok((State::from_json(v)?, all)),
                Some("fail") => {
                    let why = v.get("error").and_then(|e| e.as_str()).unwrap_or("?");
                    return Err(RecvError::Refused(why.to_string()));
                }
                other => return Err(RecvError::Unexpected(other.map(str::to_string))),
            }
        }
    }
}

/// Fds collected while writing [`State`]: indices are positions in this list.
#[derive(Debug, Default)]
pub struct FdList(pub Vec<RawFd>);

impl FdList {
    pub fn push(&mut self, fd: RawFd) -> u32 {
        self.0.push(fd);
        (self.0.len() - 1) as u32
    }
}

/// Fds received with [`State`], taken by index exactly once.
#[derive(Debug)]
pub struct FdTable(Vec<Option<OwnedFd>>);

impl FdTable {
    pub fn new(fds: Vec<OwnedFd>) -> FdTable {
        FdTable(fds.into_iter().map(Some).collect())
    }

    pub fn take(&mut self, i: u32) -> Result<OwnedFd, StateError> {
        self.0.take_fd(i).ok_or(StateError::MissingFd(i))
    }

    pub fn take_opt(&mut self, i: Option<u32>) -> Result<Option<OwnedFd>, StateError> {
        i.map(|i| self.take(i)).transpose()
    }
}

impl FdSource for FdTable {
    fn take_fd(&mut self, index: u32) -> Option<OwnedFd> {
        self.0.take_fd(index)
    }
}

/// Phases of one takeover, as `ferrovs upgrade` prints them and the history keeps them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub ok: bool,
    pub old_pid: i32,
    pub new_pid: u32,
    pub old_version: String,
    pub new_version: String,
    pub schema: u32,
    pub ports: usize,
    pub queues: usize,
    /// Connect to resumed, new daemon's view.
    pub total_ms: f64,
    /// State received → ready (maps, prefaults, builds ports) while the old forwards.
    pub prepare_ms: f64,
    /// Old daemon: stop PMDs and collect positions.
    pub freeze_us: f64,
    /// Freeze start (old) → new PMDs running: the forwarding gap.
    pub downtime_us: f64,
    /// Unix time of the takeover.
    pub at: u64,
}

#[cfg(test)]
mod tests {
    //! The wire format is what schemas 1 and 2 wrote (old binaries read what we write, we
    //! read what they wrote), and every refusal of `State::parse` is its own error.
    use super::*;
    use ferrovs_counters::DropReason;
    use ferrovs_vhost::state::StateError as DeviceStateError;
    use ferrovs_vhost::virtqueue::ChainError;
    use serde_json::{json, Value};

    const V1: &str = include_str!("../../../tests/e2e/fixtures/upgrade-state-v1.json");

    fn v1() -> Value {
        serde_json::from_str(V1).unwrap()
    }

    /// `T` reads `old` and writes it back unchanged.
    fn same<T: Serialize + serde::de::DeserializeOwned>(old: Value) -> T {
        let t: T = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), old);
        t
    }

    #[test]
    fn a_bridge_s_tlv_map_travels_and_old_states_have_none() {
        let b = same::<BridgeState>(json!({
            "name": "br-int", "id": 1, "macs": [], "tlv": [[258, 128, 4, 0]],
        }));
        assert_eq!(b.tlv, vec![(0x0102, 0x80, 4, 0)]);
        let b = same::<BridgeState>(json!({"name": "br0", "id": 0, "macs": []}));
        assert!(b.tlv.is_empty());
        // The v1 fixture's bridges (written before the field) read.
        for b in v1()["bridges"].as_array().unwrap() {
            let b: BridgeState = serde_json::from_value(b.clone()).unwrap();
            assert!(b.tlv.is_empty());
        }
    }

    #[test]
    fn link_states_travel_by_their_old_names() {
        for (name, l) in [
            ("listening", LinkState::Listening),
            ("connected", LinkState::Connected),
            ("reconnecting", LinkState::Reconnecting),
            ("attached", LinkState::Attached),
        ] {
            assert_eq!(same::<LinkState>(json!(name)), l);
        }
        assert!(serde_json::from_value::<LinkState>(json!("flapping")).is_err());
    }

    #[test]
    fn kernel_positions_and_geometry_keep_their_shape() {
        let m = same::<Msg>(json!({
            "msg": "frozen", "t_freeze_ns": 5, "freeze_us": 6,
            "positions": [["vm1", [1, null]]],
            "rings": [["up0", {"block": 3, "taken": 4}]],
            "xsks": [["xdp0", {"rx_cons": 1, "fill_prod": 2, "tx_prod": 3, "cq_cons": 4,
                               "tx_free": [7, 8]}]],
        }));
        let Msg::Frozen { rings, xsks, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(rings[0].1, RingPos { block: 3, taken: 4 });
        assert_eq!(xsks[0].1.rx.fill_prod, 2);
        assert_eq!(xsks[0].1.tx.free, vec![7, 8]);
        let k = same::<KernelState>(json!({
            "fd": 3,
            "xdp": {"umem": 4, "promisc": 5, "map": 6, "prog": 7, "link": 8, "ifindex": 9,
                    "xdp_mode": "generic", "frame_size": 4096, "rx_frames": 2048,
                    "tx_frames": 1024, "stats_seen": [1, 2, 3, 4]},
        }));
        assert_eq!(k.xdp.unwrap().xdp_mode, XdpMode::Generic);
        same::<KernelState>(json!({
            "fd": 3, "ring": {"block_size": 65536, "block_nr": 64, "frame_size": 2048},
        }));
    }

    #[test]
    fn counters_keep_their_shape() {
        let m = same::<Msg>(json!({
            "msg": "bye",
            "stats": [["vm1", [
                {"packets": 4, "bytes": 240, "calls": 2, "calls_suppressed": 1,
                 "calls_coalesced": 3, "drops": [["runt", 2], ["no_route", 5]]},
                {"packets": 0, "bytes": 0, "calls": 0, "calls_suppressed": 0,
                 "calls_coalesced": 0, "drops": []},
            ]]],
            "ports": [["vm1", {
                "rx_drops": {"packets": 0, "bytes": 0, "calls": 0, "calls_suppressed": 0,
                             "calls_coalesced": 0, "drops": [["vlan_mismatch", 9]]},
                "tx_not_ready": 6, "offload": [1, 2, 3],
            }]],
        }));
        let Msg::Bye { stats, ports, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(stats[0].1[0].drops[DropReason::NoRoute as usize], 5);
        assert_eq!(ports[0].1.rx_drops.drops[DropReason::Vlan as usize], 9);
        // An older peer's counters: no call counters besides `calls`, no port counters.
        let m: Msg = serde_json::from_value(json!({
            "msg": "bye",
            "stats": [["vm1", [{"packets": 4, "bytes": 240, "calls": 2, "drops": []}]]],
        }))
        .unwrap();
        let Msg::Bye {
            stats,
            ports,
            rules,
            groups,
            meters,
        } = m
        else {
            panic!("{m:?}")
        };
        assert_eq!(stats[0].1[0].calls_coalesced, 0);
        assert!(ports.is_empty());
        assert!(rules.is_empty(), "an older peer sends no rule counters");
        assert!(groups.is_empty() && meters.is_empty());
        // Rule counters (in the order of the configuration's rules), as written now.
        let m = same::<Msg>(json!({
            "msg": "bye",
            "stats": [],
            "ports": [],
            "rules": [["br0", [
                {"packets": 3000, "bytes": 192000, "age_ms": 1500, "idle_s": 0},
                {"packets": 0, "bytes": 0, "age_ms": 1500, "idle_s": null},
            ]]],
        }));
        let Msg::Bye { rules, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(rules[0].1[0].packets, 3000);
        assert_eq!(rules[0].1[1].idle_s, None);
        // OUTPUT max_len, group and meter counters, as written now.
        let m = same::<Msg>(json!({
            "msg": "bye",
            "stats": [],
            "ports": [],
            "rules": [["br0", [
                {"packets": 1, "bytes": 64, "age_ms": 10, "idle_s": 0,
                 "output_max_len": [0, 128]},
            ]]],
            "groups": [["br0", [
                {"id": 1, "packets": 30, "bytes": 1920, "buckets": [[10, 640], [20, 1280]],
                 "age_ms": 1500},
            ]]],
            "meters": [["br0", [
                {"id": 7, "packets": 30, "bytes": 1920, "bands": [[2, 128]], "age_ms": 900},
            ]]],
        }));
        let Msg::Bye {
            rules,
            groups,
            meters,
            ..
        } = m
        else {
            panic!("{m:?}")
        };
        assert_eq!(rules[0].1[0].output_max_len, vec![0, 128]);
        assert_eq!(groups[0].1[0].buckets[1], (20, 1280));
        assert_eq!(meters[0].1[0].bands, vec![(2, 128)]);
        let k: KernelState = serde_json::from_value(json!({
            "fd": 3,
            "xdp": {"umem": 4, "promisc": 5, "map": 6, "prog": 7, "link": 8, "ifindex": 9,
                    "xdp_mode": "native", "frame_size": 4096, "rx_frames": 2048,
                    "tx_frames": 1024, "stats_seen": [1, 2, 3, 4]},
        }))
        .unwrap();
        let seen = k.xdp.unwrap().stats_seen;
        assert_eq!((seen.rx_dropped, seen.tx_invalid_descs), (1, 4));
    }

    #[test]
    fn a_broken_queue_travels_by_its_drop_reason() {
        let mut v = v1();
        v["ports"][0]["device"]["queues"][1]["broken"] = json!("desc_chain_loop");
        let st = State::from_json(v.clone()).unwrap();
        assert_eq!(st.ports[0].device.queues[1].broken, Some(ChainError::Loop));
        v["ports"][0]["device"]["queues"][1]["broken"] = json!("no_such_reason");
        assert!(matches!(State::from_json(v), Err(StateError::Malformed(_))));
    }

    #[test]
    fn no_schema_and_unknown_schemas() {
        let mut v = v1();
        v.as_object_mut().unwrap().remove("schema");
        assert!(matches!(State::from_json(v), Err(StateError::NoSchema)));
        for s in [0, u64::from(SCHEMA) + 1, u64::MAX] {
            let mut v = v1();
            v["schema"] = json!(s);
            assert!(matches!(State::from_json(v), Err(StateError::Schema(x)) if x == s));
        }
    }

    #[test]
    fn malformed_state() {
        assert!(matches!(
            State::parse(b"{\"schema\":1,"),
            Err(StateError::Malformed(_))
        ));
        let mut v = v1();
        v["ports"][0]["link"] = json!(7);
        assert!(matches!(State::from_json(v), Err(StateError::Malformed(_))));
    }

    #[test]
    fn a_vhost_port_without_its_device() {
        let mut v = v1();
        v["ports"][1].as_object_mut().unwrap().remove("device");
        let e = State::from_json(v).unwrap_err();
        assert!(
            matches!(&e, StateError::NoDevice { port } if port == "vm2"),
            "{e}"
        );
    }

    #[test]
    fn a_device_vhost_refuses_is_refused_with_the_port_named() {
        let mut v = v1();
        v["ports"][0]["device"]["queues"][0]["addrs"][2] = json!(8);
        let e = State::from_json(v).unwrap_err();
        assert!(
            matches!(
                &e,
                StateError::Device {
                    port,
                    source: DeviceStateError::RingOutsideMemory { queue: 0, .. }
                } if port == "vm1"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_ovsdb_section_is_optional_and_round_trips() {
        let st = State::from_json(v1()).unwrap();
        assert_eq!(st.ovsdb, None);
        let mut v = v1();
        v["ovsdb"] = json!({"remote": "unix:/run/openvswitch/db.sock",
                            "settings": ["pmd-sleep-max-us"]});
        v["ports"][0]["ofport"] = json!(5);
        let st = State::from_json(v.clone()).unwrap();
        let o = st.ovsdb.as_ref().unwrap();
        assert_eq!(o.remote, "unix:/run/openvswitch/db.sock");
        assert_eq!(o.settings, vec!["pmd-sleep-max-us".to_string()]);
        assert_eq!(st.ports[0].ofport, Some(5));
        assert_eq!(serde_json::to_value(Msg::State(Box::new(st))).unwrap(), v);
        // The connection (schema 3 unchanged: a defaulted field); one that does not parse
        // is kept as its error, for the daemon to refuse alone.
        let session = json!({"db": "Open_vSwitch", "schema": {}, "monitored": {}, "cond": true,
                             "replica": {}, "pending": [{"request": "echo", "id": 3}],
                             "next_id": 4, "input": "7b22", "output": ""});
        v["ovsdb"]["conn"] = json!({"socket": 2, "tcp": false, "session": session,
                                    "writeback": null, "applied_cfg": 7, "idle_ms": 10,
                                    "probe_sent": true, "connects": 1});
        let st = State::from_json(v.clone()).unwrap();
        let c = st
            .ovsdb
            .as_ref()
            .unwrap()
            .conn
            .as_ref()
            .unwrap()
            .0
            .as_ref()
            .unwrap();
        assert_eq!(c.session.input, b"{\"");
        assert_eq!(
            c.session.pending,
            vec![ferrovs_ovsdb::PendingState::Echo { id: 3 }]
        );
        assert_eq!(serde_json::to_value(Msg::State(Box::new(st))).unwrap(), v);
        v["ovsdb"]["conn"] = json!({"socket": "x"});
        let st = State::from_json(v.clone()).unwrap();
        assert!(st.ovsdb.unwrap().conn.unwrap().0.is_err());
        v["ovsdb"] = json!({"remote": 7});
        assert!(matches!(State::from_json(v), Err(StateError::Malformed(_))));
    }

    #[test]
    fn fds_are_taken_once() {
        let mut t = FdTable::new(vec![os::memfd("t", 8, false).unwrap()]);
        assert!(t.take(0).is_ok());
        assert!(matches!(t.take(0), Err(StateError::MissingFd(0))));
        assert!(matches!(t.take_opt(Some(9)), Err(StateError::MissingFd(9))));
        assert!(t.take_opt(None).unwrap().is_none());
    }

    /// A schema 4 state with the continuation nonce (a field serde-defaults: the states
    /// without it read as before) restores it and writes it back the same.
    #[test]
    fn the_continuation_nonce_travels() {
        const C: &str =
            include_str!("../../../tests/e2e/fixtures/upgrade-state-v4-continuation.json");
        let st = State::parse(C.as_bytes()).unwrap();
        assert_eq!(st.continuation_nonce, Some(0x1234_5678));
        let v: Value = serde_json::from_str(C).unwrap();
        assert_eq!(serde_json::to_value(Msg::State(Box::new(st))).unwrap(), v);
        let old = State::parse(V1.as_bytes()).unwrap();
        assert_eq!(old.continuation_nonce, None);
    }

    /// Rules travel as their ovs-ofctl text in the configuration: a schema 4 state whose
    /// bridge holds an OVN-shaped register program (loads, moves, resubmits, output:reg,
    /// a ct zone from a register) restores exactly those rules.
    #[test]
    fn a_register_program_travels_as_text_and_restores_the_same_rules() {
        const REGS: &str =
            include_str!("../../../tests/e2e/fixtures/upgrade-state-v4-registers.json");
        let st = State::parse(REGS.as_bytes()).unwrap();
        st.config.validate().unwrap();
        let flows = st.config.bridges[0].flows.clone().unwrap();
        assert!(flows.iter().any(|f| f.contains("NXM_NX_REG13[0..15]")));
        let rules = crate::flows::BridgeRules::from_texts(&flows).unwrap();
        assert_eq!(rules.rules().len(), flows.len());
        // Printed (as the next daemon saves them) and parsed again: the same rules.
        let back: Vec<String> = rules.rules().iter().map(|r| r.spec.to_string()).collect();
        let again = crate::flows::BridgeRules::from_texts(&back).unwrap();
        for (a, b) in rules.rules().iter().zip(again.rules()) {
            assert_eq!(a.spec, b.spec);
        }
        let v: Value = serde_json::from_str(REGS).unwrap();
        assert_eq!(serde_json::to_value(Msg::State(Box::new(st))).unwrap(), v);
    }
}
