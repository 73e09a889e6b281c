//! Typed results, one per command.
//!
//! The daemon builds these and the CLI reads them. Fields are declared in the order of
//! their names: the wire form has always had its keys sorted (the daemon used to build
//! `serde_json::Value` maps), and declaring them so keeps every reply byte for byte what it
//! was. The tests round-trip replies captured from a running daemon.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod conntrack;
mod trace;
pub use conntrack::{
    ConntrackEntry, ConntrackStats, ConntrackTuple, ConntrackZone, FlushConntrack,
};
pub use trace::{Trace, TracePass, TraceStep};

/// The result of any command: what [`crate::Response`] carries from the daemon. Commands
/// that only change something answer [`Reply::Done`] (`null`).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Done,
    Show(Box<Show>),
    Version(Version),
    PortStats(Vec<PortStats>),
    PmdStats(Vec<PmdStats>),
    MacTable(Vec<MacEntry>),
    ConfigGet(ConfigGet),
    UpgradeHistory(Vec<UpgradeReport>),
    AddFlows(AddFlows),
    DelFlows(DelFlows),
    DumpFlows(Vec<FlowEntry>),
    DumpMegaflows(Vec<MegaflowEntry>),
    /// `get-controller`: the targets.
    Controllers(Vec<String>),
    DumpMeters(Vec<MeterEntry>),
    MeterStats(Vec<MeterStats>),
    DelGroups(DelGroups),
    DumpGroups(Vec<GroupEntry>),
    DumpConntrack(Vec<ConntrackEntry>),
    FlushConntrack(FlushConntrack),
    ConntrackStats(Box<ConntrackStats>),
    Trace(Box<Trace>),
    LogLevels(LogLevels),
    CaptureStarted(CaptureStarted),
}

/// `log-level`: the default level and the levels of named modules (`off`, `error`, `warn`,
/// `info`, `debug`, `trace`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LogLevels {
    pub default: String,
    /// Module path prefixes and their levels.
    #[serde(default)]
    pub modules: BTreeMap<String, String>,
}

/// `capture`: the capture runs; its packets follow on the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStarted {
    pub port: String,
    pub direction: crate::capture::Direction,
    pub snaplen: u32,
    /// Records the capture ring holds.
    pub ring_slots: usize,
    /// Instructions of the compiled filter (0: none).
    pub filter_insns: usize,
}

/// `del-groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelGroups {
    /// Groups deleted.
    pub groups: usize,
    /// Rules deleted with them (those that sent to them).
    pub rules: usize,
}

/// `dump-groups`: one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupEntry {
    /// The group in canonical (ovs-ofctl) text.
    pub group: String,
    pub duration_s: f64,
    pub n_packets: u64,
    pub n_bytes: u64,
    /// (packets, bytes) of each bucket, in order.
    pub buckets: Vec<(u64, u64)>,
}

/// `show`: the daemon, its bridges and their ports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Show {
    /// Control requests refused (malformed or invalid).
    pub bad_control_requests: u64,
    pub bridges: Vec<ShowBridge>,
    /// Every PMD's packet buffers are on huge pages.
    pub hugepages: bool,
    /// Log lines the rate limiter left out (per port and reason) since the daemon started.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub log_lines_suppressed: u64,
    /// The OVSDB connection (`ferrovsd --ovsdb`; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ovsdb: Option<OvsdbStatus>,
    /// The OpenFlow connections (absent until one was accepted or made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openflow: Option<OpenflowStatus>,
    /// The asynchronous OpenFlow path (absent until a packet-in queue or packet-out existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packet_io: Option<PacketIoStatus>,
    pub pid: u32,
    pub pmd_cores: Vec<usize>,
    pub run_dir: String,
    /// Hot upgrades this daemon's line has gone through.
    pub upgrades: u64,
    pub version: String,
}

/// OpenFlow connections and what was refused on them (`ferrovs show --json`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenflowStatus {
    /// Connections open now, by negotiated version (`"1.3"`, `"1.4"`, `"1.5"`).
    pub connections: std::collections::BTreeMap<String, u64>,
    /// Connections that negotiated each version since the daemon started.
    pub negotiated: std::collections::BTreeMap<String, u64>,
    /// ERROR replies sent, by error name (`OFPBAC_BAD_EXP_TYPE`, `NXR_NOT_SUPPORTED`, ...).
    pub refused: std::collections::BTreeMap<String, u64>,
    /// Connections the switch closed (lost framing, no common version, flooding).
    pub dropped: u64,
    /// Nicira experimenter messages received.
    pub nx_messages: u64,
    /// Bundles committed, the messages they held, and bundles whose commit was refused.
    pub bundles_committed: u64,
    pub bundled_messages: u64,
    pub bundles_failed: u64,
    /// OpenFlow connections taken over at the last hot upgrade, and pieces of the
    /// handed-over OpenFlow state refused then (each closed alone).
    pub handed_over: u64,
    pub handover_refused: u64,
    /// Each bridge's Geneve TLV mappings, as `tun_metadataN=CLASS,TYPE,LEN`.
    pub tlv_maps: std::collections::BTreeMap<String, Vec<String>>,
}

/// Counters of PACKET_IN and PACKET_OUT (`ferrovs show --json`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PacketIoStatus {
    /// Packet-ins the PMDs queued for the control thread.
    pub packet_ins_queued: u64,
    /// Packet-ins dropped by the PMDs: the queue was full.
    pub packet_ins_dropped: u64,
    /// PACKET_IN messages written to OpenFlow connections.
    pub packet_ins_sent: u64,
    /// Packet-ins a connection missed because its messages waited unread.
    pub packet_ins_unsent: u64,
    /// PACKET_OUT messages received (refused ones included).
    pub packet_outs: u64,
    /// Packet-outs a PMD executed.
    pub packet_outs_executed: u64,
    /// Packet-outs accepted but not executed (queue full, or no Ethernet header).
    pub packet_outs_dropped: u64,
    /// `NXT_RESUME`s received, and those refused (stale, garbage, bad actions).
    #[serde(default)]
    pub resumes: u64,
    #[serde(default)]
    pub resumes_refused: u64,
    /// Packet-ins sent with a continuation (`controller(pause)`), per connection.
    #[serde(default)]
    pub continuations_sent: u64,
}

/// The OVSDB connection of a daemon configured through the database.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OvsdbStatus {
    /// `cur_cfg` written back: the last `next_cfg` applied.
    pub cur_cfg: i64,
    /// Connections made (the first one and every reconnect).
    pub connects: u64,
    /// Why the connection last failed or was dropped.
    pub last_error: Option<String>,
    /// Interfaces refused because their rows are not a configuration ferrovs can run (each
    /// has its `error` column set), at the last apply.
    pub refused_interfaces: u64,
    /// OpenFlow settings refused at the last apply (a controller target that does not
    /// parse, a bad `other_config:datapath-id`...; each logged, the rest applied).
    #[serde(default)]
    pub refused_settings: u64,
    /// Messages or rows from the server that were malformed (each logged).
    pub refused_inputs: u64,
    /// `unix:PATH` or `tcp:IP:PORT`.
    pub remote: String,
    /// `connecting`, `syncing`, `synced` or `backoff`.
    pub state: String,
    /// Write-back transactions that failed (each retried).
    pub txn_failures: u64,
    /// Connections taken over from the daemon before this one at a hot upgrade (the
    /// server saw no new connection).
    #[serde(default)]
    pub handed_over: u64,
    /// Handed-over connections refused (closed, and a new one made; each logged).
    #[serde(default)]
    pub handover_refused: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShowBridge {
    pub name: String,
    /// OpenFlow settings and connections (absent from a daemon older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openflow: Option<ShowOpenflow>,
    pub ports: Vec<ShowPort>,
    /// Rules per table, as `(table, rules)` for each table that has any (absent from a
    /// daemon older than the field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules_per_table: Vec<(u8, u64)>,
}

/// A bridge's OpenFlow side in `show`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShowOpenflow {
    #[serde(default)]
    pub controllers: Vec<ShowController>,
    /// 16 hexadecimal digits.
    #[serde(default)]
    pub datapath_id: String,
    /// `standalone` or `secure`.
    #[serde(default)]
    pub fail_mode: String,
    /// No controller connected for long enough: forwarding as a learning switch.
    #[serde(default)]
    pub fail_open: bool,
    /// Connections on the management socket now.
    #[serde(default)]
    pub management_connections: u64,
    /// Versions allowed (empty: every one the switch speaks).
    #[serde(default)]
    pub protocols: Vec<String>,
}

/// One controller of a bridge.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShowController {
    /// The current reconnect delay.
    #[serde(default)]
    pub backoff_ms: u64,
    /// HELLO exchanged on the current connection.
    #[serde(default)]
    pub connected: bool,
    /// Connections made.
    #[serde(default)]
    pub connects: u64,
    #[serde(default)]
    pub last_error: Option<String>,
    /// `equal`, `master` or `slave`.
    #[serde(default)]
    pub role: String,
    /// `backoff`, `connecting`, `connected` or `listening`.
    #[serde(default)]
    pub state: String,
    pub target: String,
}

/// One port in `show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShowPort {
    pub connects: u64,
    /// The netdev of a kernel port.
    pub dev: Option<String>,
    pub disconnects: u64,
    /// Negotiated virtio features (vhost-user).
    pub features: Vec<String>,
    pub id: u32,
    /// How a kernel port is attached (null for vhost-user).
    pub kernel: Option<KernelInfo>,
    pub last_error: Option<String>,
    /// `vhost-user`, `tap`, `af_packet`, `af_xdp`, `vxlan`.
    pub mode: String,
    /// An uplink on AF_PACKET because AF_XDP could not be used: why.
    pub mode_fallback_reason: Option<String>,
    pub name: String,
    pub offloads: Offloads,
    /// OpenFlow port number on its bridge (0 from a daemon older than the field).
    #[serde(default)]
    pub ofport: u16,
    /// The vhost-user socket.
    pub path: Option<String>,
    pub queues: u16,
    pub ready_queues: usize,
    /// `listening`, `connected`, `reconnecting`, `attached`.
    pub state: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub vlan: Vlan,
}

/// What a port takes from the switch (`accepts`: else the PMD completes checksums and
/// segments in software) and what it may hand the switch (`sends`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offloads {
    pub accepts: Vec<String>,
    pub sends: Vec<String>,
}

/// `{"mode": "access", "tag": T}`, `{"mode": "trunk"}` or `{"mode": "trunk", "trunks": [..]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vlan {
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunks: Option<Vec<u16>>,
}

/// A kernel port's attachment, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KernelInfo {
    Xdp(XdpInfo),
    Uplink(UplinkInfo),
    Tap(TapInfo),
    Vxlan(VxlanInfo),
}

/// An AF_XDP uplink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdpInfo {
    /// `zero-copy` or `copy`.
    pub bind: String,
    pub frames_lost: u64,
    pub ifindex: u32,
    pub queue: u32,
    pub rx: String,
    pub rx_frames_with_kernel: u64,
    pub tx: String,
    pub tx_frames_free: u64,
    pub tx_frames_in_flight: u64,
    pub umem_frame_size: u64,
    pub umem_rx_frames: u64,
    pub umem_tx_frames: u64,
    /// `native`, `generic`...
    pub xdp_mode: String,
}

/// An AF_PACKET uplink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UplinkInfo {
    pub ifindex: u32,
    pub ignore_outgoing: bool,
    pub ring_block_size: u64,
    pub ring_block_timeout_ms: u64,
    pub ring_blocks: u64,
    pub rx: String,
    pub tx: String,
}

/// A TAP port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapInfo {
    pub device: String,
    pub offloads: Vec<String>,
    pub vnet_hdr_len: u64,
}

/// A VXLAN tunnel port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VxlanInfo {
    pub local: String,
    pub remote: String,
    pub rx: String,
    pub tx: String,
    /// The fixed VNI (0 with `key=flow`).
    pub vni: u32,
    /// `key=flow`: each packet's VNI (and Geneve options) from its tunnel metadata.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub key_flow: bool,
    /// Datagrams the kernel dropped at the endpoint's UDP socket, its receive buffer full
    /// (`/proc/net/udp`'s `drops`; the endpoint's, shared by the ports on it). Left out
    /// while 0, as in what older daemons wrote.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub socket_drops: u64,
}

/// `version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Version {
    pub version: String,
}

/// `port-stats`: one port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortStats {
    pub coalesce: Coalesce,
    /// Live migration (vhost-user ports; null for kernel ports).
    pub migration: Option<Migration>,
    pub offload: SoftwareOffload,
    pub port: String,
    pub queues: Vec<QueueStats>,
    pub refused_connections: u64,
    pub rx: DirStats,
    pub tx: DirStats,
    pub vhost_user_errors: u64,
}

/// Guest notification coalescing (0: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coalesce {
    pub frames: u32,
    pub usecs: u32,
}

/// Checksums and segmentation the PMD did in software for the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoftwareOffload {
    pub sw_csum: u64,
    pub sw_segments: u64,
    pub sw_tso: u64,
}

/// A vhost-user port's migration state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    pub log_bytes: u64,
    pub logging: bool,
    pub postcopy: bool,
    pub postcopy_pages_fetched: u64,
    pub postcopy_pages_missing: u64,
    /// Postcopy migrations the port took part in (POSTCOPY_LISTEN answered).
    #[serde(default)]
    pub postcopy_listens: u64,
    pub rarp_announces: u64,
}

/// Counters of one direction of a port or queue.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DirStats {
    pub bytes: u64,
    pub dirty_pages_logged: u64,
    pub dropped: u64,
    /// Drops by reason (only reasons that occurred).
    pub drops: BTreeMap<String, u64>,
    pub guest_notifications: u64,
    pub notifications_coalesced: u64,
    pub notifications_suppressed: u64,
    pub packets: u64,
}

/// One queue of a port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    /// How full the ring is (vhost-user, a started ring): the descriptors the guest made
    /// available that the switch has not taken yet (split rings: chains; packed rings:
    /// descriptor slots). On a from-guest queue, packets waiting for the switch; on a
    /// to-guest queue, empty buffers the guest has posted (0: the guest is not keeping up).
    /// Absent for kernel queues, stopped or broken rings, and during postcopy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<u32>,
    /// Why the queue stopped (a guest's bad ring), else null.
    pub broken: Option<String>,
    /// `to-guest`, `from-guest`, `to-kernel`, `from-kernel`.
    pub direction: String,
    pub queue: usize,
    pub ready: bool,
    /// Ring size (vhost-user).
    pub size: Option<u32>,
    pub stats: DirStats,
}

/// `pmd-stats`: one PMD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PmdStats {
    pub busy_cycles: u64,
    pub busy_pct: f64,
    pub core: Option<usize>,
    pub cycles_per_packet: f64,
    pub flow: FlowCounters,
    pub hugepages: bool,
    pub idle_cycles: u64,
    pub iterations: u64,
    pub kick_wakeups: u64,
    pub load_sleeps: u64,
    /// Polls of quiet rx queues skipped while busy, and the interval between the polls
    /// that were not (µs; 0: every queue every iteration). Absent from older daemons.
    #[serde(default)]
    pub quiet_skips: u64,
    #[serde(default)]
    pub quiet_rxq_poll_us: u64,
    /// The longest a quiet rx queue went unpolled while the PMD was busy, in µs, since the
    /// PMD started or `pmd-stats-clear` (the measured bound of what quiet polling adds).
    #[serde(default)]
    pub quiet_gap_max_us: f64,
    /// Sweeps of quiet rx queues while busy (since the same start), and the gap between
    /// sweeps that 99 % and 99.9 % of them stayed under (µs, the upper bound of a
    /// power-of-two bucket; null when there was none or past 16 ms).
    #[serde(default)]
    pub quiet_sweeps: u64,
    #[serde(default)]
    pub quiet_gap_p99_us: Option<u64>,
    #[serde(default)]
    pub quiet_gap_p999_us: Option<u64>,
    /// Shared by every PMD (each reports the same list).
    pub megaflow_caches: Vec<MegaflowCacheStats>,
    pub pmd: usize,
    pub priority: String,
    /// Why `priority` could not be applied.
    pub priority_error: Option<String>,
    pub rx_mode: String,
    pub rx_packets: u64,
    pub rx_queues: u64,
    pub sleep_cycles: u64,
    /// 0: load-based sleep off.
    pub sleep_max_us: u64,
    pub sleep_us: u64,
    pub sleeps: u64,
    pub tsc_hz: u64,
    pub tx_packets: u64,
    /// The rx queues this PMD polls, with their measured usage (absent when it polls none,
    /// and from older daemons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rxqs: Vec<RxqUsage>,
}

/// One rx queue of a PMD, as `ovs-appctl dpif-netdev/pmd-rxq-show` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RxqUsage {
    pub port: String,
    /// The queue pair.
    pub queue: u16,
    /// Whether the guest enabled the queue (kernel ports: always).
    pub enabled: bool,
    /// Share of a core its bursts took over the measured window (`None`: not measured yet).
    pub usage_pct: Option<f64>,
}

/// A PMD's flow lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowCounters {
    pub emc_hits: u64,
    pub emc_inserts: u64,
    pub emc_skipped: u64,
    pub megaflow_hits: u64,
    pub packets: u64,
    pub upcalls: u64,
    /// Passes after a packet's first (`ct(table=T)` recirculations); left out when zero
    /// (so replies without connection tracking are as before), absent from older daemons.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recirculations: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A bridge's megaflow cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MegaflowCacheStats {
    pub bridge: String,
    pub entries: u64,
    pub evicted: u64,
    pub inserted: u64,
    pub invalidated: u64,
    pub limit: u64,
    pub refused_full: u64,
    pub refused_stale: u64,
    pub revalidations: u64,
    pub rules: u64,
    pub subtables: u64,
    /// Translations (upcalls) that failed on OVS's resubmit limits and dropped their
    /// packet: nested deeper than 64, more than 4096 resubmits. Left out when zero, absent
    /// from older daemons.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub xlate_too_deep: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub xlate_too_many: u64,
}

/// `mac-table`: one learned address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacEntry {
    /// Seconds since last seen.
    pub age: u32,
    pub mac: String,
    pub port: String,
    pub vlan: u16,
}

/// `config get`: every setting, or one setting's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigGet {
    All(Box<Settings>),
    One(String),
}

/// The settings `config get` reports, as strings (`config set` takes the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Settings {
    pub mac_aging: String,
    pub mac_table_size: String,
    pub pmd_cores: String,
    pub pmd_priority: String,
    pub pmd_rx_mode: String,
    pub pmd_sleep_after_us: String,
    pub pmd_sleep_max_us: String,
    /// Absent from older daemons.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pmd_rxq_assign: String,
    /// Absent from older daemons.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vhost_packed_rings: String,
    /// Absent from older daemons.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pmd_quiet_rxq_poll_us: String,
}

impl Settings {
    /// `(name, value)` in name order.
    pub fn pairs(&self) -> [(&'static str, &str); 10] {
        [
            ("mac-aging", &self.mac_aging),
            ("mac-table-size", &self.mac_table_size),
            ("pmd-cores", &self.pmd_cores),
            ("pmd-priority", &self.pmd_priority),
            ("pmd-quiet-rxq-poll-us", &self.pmd_quiet_rxq_poll_us),
            ("pmd-rx-mode", &self.pmd_rx_mode),
            ("pmd-rxq-assign", &self.pmd_rxq_assign),
            ("pmd-sleep-after-us", &self.pmd_sleep_after_us),
            ("pmd-sleep-max-us", &self.pmd_sleep_max_us),
            ("vhost-packed-rings", &self.vhost_packed_rings),
        ]
    }
}

/// A hot upgrade as the new daemon reports it (one JSON line on its stdout) and as
/// `upgrade-history` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradeReport {
    /// Unix time of the takeover.
    pub at: u64,
    /// Freeze start (old daemon) to new PMDs running: the forwarding gap.
    pub downtime_us: f64,
    pub freeze_us: f64,
    pub new_pid: u32,
    pub new_version: String,
    pub ok: bool,
    pub old_pid: i32,
    pub old_version: String,
    pub ports: usize,
    pub prepare_ms: f64,
    pub queues: usize,
    pub schema: u32,
    pub total_ms: f64,
}

/// `add-flows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddFlows {
    pub added: usize,
    /// Rules on the bridge now.
    pub rules: usize,
}

/// `del-flows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelFlows {
    pub deleted: usize,
    /// Rules on the bridge now.
    pub rules: usize,
}

/// `dump-flows`: one rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowEntry {
    /// Hexadecimal, `0x..`.
    pub cookie: String,
    pub duration_s: f64,
    /// The rule in canonical text.
    pub flow: String,
    pub hard_timeout: u64,
    pub idle_timeout: u64,
    pub n_bytes: u64,
    pub n_packets: u64,
    pub priority: u64,
    pub table: u64,
}

/// `dump-megaflows`: one cached megaflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MegaflowEntry {
    pub actions: String,
    pub bytes: u64,
    /// Fields and masks.
    #[serde(rename = "match")]
    pub matches: String,
    pub packets: u64,
    pub used_s_ago: u64,
}

/// `dump-meters`: one meter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterEntry {
    pub id: u32,
    /// The meter in ovs-ofctl syntax (`meter=1,kbps,bands=type=drop,rate=1000`).
    pub meter: String,
}

/// `meter-stats`: one meter's counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeterStats {
    /// Per band, in the meter's order: the packets and bytes it dropped.
    pub bands: Vec<MeterBandStats>,
    pub byte_in_count: u64,
    pub duration_s: f64,
    /// Rules using the meter.
    pub flow_count: u64,
    pub id: u32,
    pub packet_in_count: u64,
}

/// `meter-stats`: one band's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterBandStats {
    pub byte_count: u64,
    pub packet_count: u64,
}
