//! Configured through OVSDB (`ferrovsd --ovsdb REMOTE`): the database is the configuration,
//! as it is for ovs-vswitchd.
//!
//! The connection is one more non-blocking source in the epoll loop. Whenever the replica
//! changes (initial sync, any update), the rows are mapped ([`crate::vswitchdb::desired`])
//! and applied to the running daemon as a diff: bridges and ports that are not asked for any
//! more go, new ones come, and a port whose configuration changed is deleted and added again;
//! a port whose row did not change is never touched, whatever else changes. Then one
//! transaction writes back what ovs-vswitchd writes (`cur_cfg`, every interface's `ofport`,
//! `error`, link and status columns, `datapath_id`), only the values that differ from the
//! replica; statistics follow every [`STATS_EVERY`].
//!
//! Robustness: the server going away changes nothing that runs; the daemon reconnects with
//! exponential backoff ([`BACKOFF_MIN`] to [`BACKOFF_MAX`]) and resynchronises. An idle
//! connection is probed with an echo after [`PROBE_IDLE`] and dropped after twice that
//! without a byte. A write-back that fails is retried after [`RETRY`] or at the next change.
//! Malformed input from the server is counted (`show`'s `ovsdb.refused_inputs`) and logged,
//! and costs the connection at worst, never the daemon.
//!
//! Hot upgrade: the connection is handed over with its session as plain data
//! (`Daemon::ovsdb_export`, `Daemon::ovsdb_restore`; `docs/upgrade.md`, "The OVSDB
//! connection"): the server sees no new connection and the new daemon does not resync.

use std::collections::BTreeMap;

use ferrovs_ovsdb::{ops, Atom, Datum, Event, Monitor, Remote, Row, Session, Stream, Uuid};

use crate::upgrade::{Lenient, OvsdbConnState, OvsdbState};
use crate::vswitchdb::{self, Desired, Tables};

use super::controllers::ControllerReport;
use super::*;

/// First reconnect delay; doubles up to [`BACKOFF_MAX`].
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// An echo goes out after this long without a byte from the server; twice this without
/// one drops the connection.
pub(super) const PROBE_IDLE: Duration = Duration::from_secs(5);
/// Statistics are written back this often.
pub(super) const STATS_EVERY: Duration = Duration::from_secs(5);
/// A failed write-back is sent again after this long (or at the next change).
pub(super) const RETRY: Duration = Duration::from_secs(1);

/// The ovs-vswitchd whose database behaviour ferrovs follows (the schema of its release), and
/// ferrovs's own version as build metadata: `ovs_version` stays a version tools can parse.
pub(super) fn ovs_version() -> String {
    format!("3.1.0+ferrovs.{}", env!("CARGO_PKG_VERSION"))
}

/// How often what ferrovs writes back (link state...) is compared with the replica.
const WRITEBACK_EVERY: Duration = Duration::from_millis(500);
/// A TCP connect waits at most this long (the control thread must not stall on it).
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
const DB: &str = "Open_vSwitch";

/// The tables and columns ferrovs reads: what it maps, and what it writes (to write only
/// what differs). `statistics` is written, not read (its updates would come back to us
/// every few seconds for nothing).
fn monitor() -> Monitor {
    Monitor::new()
        .table(
            "Open_vSwitch",
            &[
                "next_cfg",
                "cur_cfg",
                "other_config",
                "bridges",
                "ovs_version",
                "datapath_types",
                "iface_types",
                "datapaths",
            ],
        )
        // Written, not mapped: ovn-controller creates the `netdev` row (`datapaths`) and
        // reads its capabilities. (Not in WRITTEN_ONLY: a change by someone else is
        // written back over; the echo of ours costs one remap, once.)
        .table("Datapath", &["capabilities"])
        .table(
            "Bridge",
            &[
                "name",
                "datapath_type",
                "other_config",
                "ports",
                "datapath_id",
                "controller",
                "fail_mode",
                "protocols",
            ],
        )
        .table("Controller", CONTROLLER_COLUMNS)
        .table(
            "Port",
            &["name", "tag", "trunks", "vlan_mode", "interfaces"],
        )
        .table(
            "Interface",
            &[
                "name",
                "type",
                "options",
                "other_config",
                "ofport_request",
                "ofport",
                "error",
                "admin_state",
                "link_state",
                "mac_in_use",
                "status",
            ],
        )
}

/// The `Controller` columns ferrovs reads: what it maps, what it notes as unsupported
/// ([`CONTROLLER_UNSUPPORTED`]) and what it writes.
const CONTROLLER_COLUMNS: &[&str] = &[
    "target",
    "max_backoff",
    "inactivity_probe",
    "connection_mode",
    "type",
    "controller_queue_size",
    "controller_rate_limit",
    "controller_burst_limit",
    "enable_async_messages",
    "local_ip",
    "is_connected",
    "role",
    "status",
];

/// `Controller` columns that ask for something ferrovs does not do: set, each is noted
/// (logged once) and ignored. (`enable_async_messages=true` is what ferrovs does anyway.)
const CONTROLLER_UNSUPPORTED: &[&str] = &[
    "type",
    "controller_queue_size",
    "controller_rate_limit",
    "controller_burst_limit",
    "enable_async_messages",
    "local_ip",
];

/// The columns only the switch writes (`ovs-vswitchd`'s, and ours): a change to nothing else is
/// the echo of our own write-back, and needs no remapping. (`Interface.ofport` is also read, to
/// keep a port's number across restarts, but only ferrovs writes it: its echo changes nothing.)
const WRITTEN_ONLY: &[(&str, &[&str])] = &[
    (
        "Open_vSwitch",
        &["cur_cfg", "ovs_version", "datapath_types", "iface_types"],
    ),
    ("Bridge", &["datapath_id"]),
    ("Controller", &["is_connected", "role", "status"]),
    (
        "Interface",
        &[
            "ofport",
            "error",
            "admin_state",
            "link_state",
            "mac_in_use",
            "status",
        ],
    ),
];

/// Whether `c` changes what the configuration is mapped from: a row inserted or deleted, or
/// a column other than the ones only the switch writes modified. Each `ovs-vsctl` command
/// otherwise costs two full remaps, the second for the echo of the write-back (measured by
/// bench/ovsdb.sh at 1000 ports: ~40 ms of the daemon's CPU per remap).
fn changes_configuration(c: &ferrovs_ovsdb::Changes, now: &ferrovs_ovsdb::Replica) -> bool {
    if !c.inserted.is_empty() || !c.deleted.is_empty() {
        return true;
    }
    c.modified.iter().any(|(table, uuid)| {
        let (Some(old), Some(new)) = (c.old.get(&(table.clone(), *uuid)), now.row(table, uuid))
        else {
            return true;
        };
        let skip = WRITTEN_ONLY
            .iter()
            .find(|(t, _)| t == table)
            .map_or(&[][..], |(_, cols)| *cols);
        new.iter()
            .chain(old.iter())
            .any(|(col, _)| !skip.contains(&col.as_str()) && old.get(col) != new.get(col))
    })
}

/// The database connection and what the daemon knows of the database.
#[derive(Debug)]
pub(super) struct OvsdbLink {
    /// `unix:PATH` or `tcp:IP:PORT`, as given.
    pub remote: String,
    target: Result<Remote, String>,
    session: Session,
    stream: Option<(Stream, u64)>,
    /// Next reconnect delay, and when the next attempt is due (while not connected).
    backoff: Duration,
    next_attempt: Instant,
    last_rx: Instant,
    probe_sent: bool,
    /// The replica changed since the last apply.
    dirty: bool,
    /// The write-back in flight, and whether another is due after it.
    txn: Option<u64>,
    writeback_due: Option<Instant>,
    last_writeback: Instant,
    last_stats: Instant,
    /// `next_cfg` of the last apply (written back as `cur_cfg`).
    applied_cfg: Option<i64>,
    /// The last mapping and the ports it could not add.
    desired: Desired,
    add_errors: BTreeMap<String, String>,
    /// Statistics last written, per interface row.
    stats_written: HashMap<Uuid, Datum>,
    /// Errors and warnings already logged (each is logged when it appears).
    logged: std::collections::BTreeSet<String>,
    pub connects: u64,
    pub last_error: Option<String>,
    pub refused_inputs: u64,
    pub txn_failures: u64,
    /// Connections taken over at a hot upgrade, and those refused then.
    pub handed_over: u64,
    pub handover_refused: u64,
    /// Reconfigurations from the database (the first one is the service's readiness).
    pub applies: u64,
}

impl OvsdbLink {
    pub fn new(remote: String) -> OvsdbLink {
        let now = Instant::now();
        OvsdbLink {
            target: remote.parse::<Remote>().map_err(|e| e.to_string()),
            remote,
            session: Session::new(DB, monitor()),
            stream: None,
            backoff: BACKOFF_MIN,
            next_attempt: now,
            last_rx: now,
            probe_sent: false,
            dirty: false,
            txn: None,
            writeback_due: None,
            last_writeback: now,
            last_stats: now,
            applied_cfg: None,
            desired: Desired::default(),
            add_errors: BTreeMap::new(),
            stats_written: HashMap::new(),
            logged: Default::default(),
            connects: 0,
            last_error: None,
            refused_inputs: 0,
            txn_failures: 0,
            handed_over: 0,
            handover_refused: 0,
            applies: 0,
        }
    }

    /// `show`'s view.
    pub fn status(&self) -> ferrovs_proto::reply::OvsdbStatus {
        let state = match (&self.stream, self.session.is_synced()) {
            (None, _) => "backoff",
            (Some(_), true) => "synced",
            (Some(_), false) => "syncing",
        };
        ferrovs_proto::reply::OvsdbStatus {
            cur_cfg: self.applied_cfg.unwrap_or(0),
            connects: self.connects,
            last_error: self.last_error.clone(),
            refused_interfaces: self.desired.errors.len() as u64,
            refused_settings: self.desired.refused_settings as u64,
            refused_inputs: self.refused_inputs,
            remote: self.remote.clone(),
            state: state.into(),
            txn_failures: self.txn_failures,
            handed_over: self.handed_over,
            handover_refused: self.handover_refused,
        }
    }

    /// Logs `line` at `level` unless it was logged already (a row's error is said once,
    /// not at every reconfiguration); forgets lines that no longer hold.
    fn log_new(&mut self, lines: &[(log::Level, String)]) {
        let now: std::collections::BTreeSet<String> =
            lines.iter().map(|(_, l)| l.clone()).collect();
        for (level, l) in lines {
            if !self.logged.contains(l) {
                log::log!(*level, "ovsdb: {l}");
            }
        }
        self.logged = now;
    }
}

/// Connects to `remote` (a TCP connect bounded by [`TCP_CONNECT_TIMEOUT`]).
fn connect(remote: &Remote) -> io::Result<Stream> {
    match remote {
        Remote::Tcp(a) => {
            let t = std::net::TcpStream::connect_timeout(a, TCP_CONNECT_TIMEOUT)?;
            t.set_nodelay(true)?;
            t.set_nonblocking(true)?;
            Ok(Stream::Tcp(t))
        }
        Remote::Unix(_) => Stream::connect(remote),
    }
}

/// The rows ferrovs maps, from the replica. Types are the schema's (the session checked
/// every value against it), so a missing value is an absent optional one.
fn tables(s: &Session) -> Tables {
    let r = s.replica();
    let text = |row: &Row, c: &str| row.get(c).and_then(Datum::as_str).unwrap_or("").to_string();
    let smap = |row: &Row, c: &str| -> BTreeMap<String, String> {
        row.get(c)
            .map(|d| {
                d.str_map()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let uuids = |row: &Row, c: &str| -> Vec<String> {
        row.get(c)
            .map(|d| d.uuids().iter().map(Uuid::to_string).collect())
            .unwrap_or_default()
    };
    let int = |row: &Row, c: &str| row.get(c).and_then(Datum::as_i64);
    let mut t = Tables {
        root: r.rows("Open_vSwitch").next().map(|(u, row)| {
            (
                u.to_string(),
                vswitchdb::RootRow {
                    next_cfg: int(row, "next_cfg").unwrap_or(0),
                    other_config: smap(row, "other_config"),
                    bridges: uuids(row, "bridges"),
                },
            )
        }),
        ..Default::default()
    };
    for (u, row) in r.rows("Bridge") {
        t.bridges.insert(
            u.to_string(),
            vswitchdb::BridgeRow {
                name: text(row, "name"),
                datapath_type: text(row, "datapath_type"),
                other_config: smap(row, "other_config"),
                ports: uuids(row, "ports"),
                controller: uuids(row, "controller"),
                fail_mode: row
                    .get("fail_mode")
                    .and_then(Datum::as_str)
                    .map(String::from),
                protocols: row
                    .get("protocols")
                    .map(|d| d.strings().into_iter().map(String::from).collect())
                    .unwrap_or_default(),
            },
        );
    }
    for (u, row) in r.rows("Controller") {
        let unsupported = CONTROLLER_UNSUPPORTED
            .iter()
            .filter_map(|c| {
                let v = row.get(*c)?;
                if v.is_empty() || (*c == "enable_async_messages" && v.as_bool() == Some(true)) {
                    return None;
                }
                let shown = v
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| v.to_json().to_string());
                Some(format!("{c}={shown}"))
            })
            .collect();
        t.controllers.insert(
            u.to_string(),
            vswitchdb::ControllerRow {
                target: text(row, "target"),
                max_backoff: int(row, "max_backoff"),
                inactivity_probe: int(row, "inactivity_probe"),
                connection_mode: row
                    .get("connection_mode")
                    .and_then(Datum::as_str)
                    .map(String::from),
                unsupported,
            },
        );
    }
    for (u, row) in r.rows("Port") {
        t.ports.insert(
            u.to_string(),
            vswitchdb::PortRow {
                name: text(row, "name"),
                tag: int(row, "tag"),
                trunks: row.get("trunks").map(Datum::integers).unwrap_or_default(),
                vlan_mode: row
                    .get("vlan_mode")
                    .and_then(Datum::as_str)
                    .map(String::from),
                interfaces: uuids(row, "interfaces"),
            },
        );
    }
    for (u, row) in r.rows("Interface") {
        t.interfaces.insert(
            u.to_string(),
            vswitchdb::InterfaceRow {
                name: text(row, "name"),
                kind: text(row, "type"),
                options: smap(row, "options"),
                other_config: smap(row, "other_config"),
                ofport_request: int(row, "ofport_request"),
                ofport: int(row, "ofport"),
            },
        );
    }
    t
}

fn string_set<'a>(items: impl IntoIterator<Item = &'a str>) -> Datum {
    Datum::set(items.into_iter().map(|s| Atom::String(s.into())))
}

fn opt_string(s: Option<&str>) -> Datum {
    s.map_or_else(Datum::empty, Datum::string)
}

fn string_map(m: &BTreeMap<String, String>) -> Datum {
    Datum::map(
        m.iter()
            .map(|(k, v)| (Atom::String(k.clone()), Atom::String(v.clone()))),
    )
}

/// Puts `value` in `row` under `col` when the replica's `current` row differs.
fn set_if_changed(row: &mut Row, current: &Row, col: &str, value: Datum) {
    if current.get(col) != Some(&value) {
        row.insert(col.to_string(), value);
    }
}

impl Daemon {
    fn link(&mut self) -> Option<&mut OvsdbLink> {
        self.ovsdb.as_deref_mut()
    }

    /// The tick's share: connect when due, probe an idle server, write back what changed,
    /// statistics every [`STATS_EVERY`].
    pub(super) fn ovsdb_tick(&mut self) {
        let now = Instant::now();
        let Some(l) = self.link() else { return };
        if l.dirty && l.session.is_synced() {
            // A connection handed over at an upgrade: its first apply (and whatever whole
            // messages the old daemon had read), should the socket not have woken us yet.
            self.ovsdb_events();
        }
        let Some(l) = self.link() else { return };
        if l.stream.is_none() {
            if now >= l.next_attempt {
                self.ovsdb_connect();
            }
            return;
        }
        let idle = l.last_rx.elapsed();
        if idle >= PROBE_IDLE * 2 {
            self.ovsdb_drop(format!(
                "no answer from the server for {} s",
                idle.as_secs()
            ));
            return;
        }
        if idle >= PROBE_IDLE && !l.probe_sent {
            l.probe_sent = true;
            l.session.echo();
        }
        let synced = l.session.is_synced();
        let due = l.writeback_due.is_some_and(|t| t <= now)
            || l.last_writeback.elapsed() >= WRITEBACK_EVERY;
        let stats = l.last_stats.elapsed() >= STATS_EVERY;
        if synced && due {
            self.ovsdb_writeback();
        }
        if synced && stats {
            self.ovsdb_statistics();
        }
        self.ovsdb_flush();
    }

    fn ovsdb_connect(&mut self) {
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        let res = match &l.target {
            Ok(r) => connect(r).map_err(|e| format!("cannot connect to {}: {e}", l.remote)),
            Err(e) => Err(e.clone()),
        };
        let stream = match res {
            Ok(s) => s,
            Err(e) => {
                limited!(
                    self.logs,
                    Warn,
                    "-",
                    "ovsdb-connect",
                    "ovsdb: {e}; retrying"
                );
                let l = self.ovsdb.as_deref_mut().expect("checked above");
                l.last_error = Some(e);
                l.next_attempt = Instant::now() + l.backoff;
                l.backoff = (l.backoff * 2).min(BACKOFF_MAX);
                return;
            }
        };
        let t = self.token(Source::Ovsdb, "");
        if let Err(e) = self.epoll.add(stream.as_fd(), t, true) {
            self.tokens.remove(&t);
            log::error!("ovsdb: epoll: {e}");
            return;
        }
        let l = self.ovsdb.as_deref_mut().expect("checked above");
        log::info!("ovsdb: connected to {}", l.remote);
        l.stream = Some((stream, t));
        l.connects += 1;
        l.last_rx = Instant::now();
        l.probe_sent = false;
        l.txn = None;
        l.stats_written.clear();
        l.session.connected();
        self.ovsdb_flush();
    }

    /// Drops the connection (the daemon goes on as configured) and schedules a reconnect.
    fn ovsdb_drop(&mut self, why: String) {
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        if let Some((s, t)) = l.stream.take() {
            let _ = self.epoll.delete(s.as_fd());
            self.tokens.remove(&t);
        }
        log::warn!("ovsdb: connection to {} lost: {why}", l.remote);
        l.session.disconnected();
        l.last_error = Some(why);
        l.txn = None;
        l.next_attempt = Instant::now() + l.backoff;
        l.backoff = (l.backoff * 2).min(BACKOFF_MAX);
        // The transactions failed by the disconnect: nothing to retry on this connection.
        while l.session.poll_event().is_some() {}
    }

    /// Writes what the session has queued; waits for writability when the socket is full.
    fn ovsdb_flush(&mut self) {
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        let Some((s, t)) = l.stream.as_mut() else {
            return;
        };
        let token = *t;
        let mut failed = None;
        while !l.session.pending_output().is_empty() {
            match s.write(l.session.pending_output()) {
                Ok(0) => {
                    failed = Some("the server closed the connection".to_string());
                    break;
                }
                Ok(n) => l.session.consume_output(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failed = Some(format!("write: {e}"));
                    break;
                }
            }
        }
        if let Some(why) = failed {
            self.ovsdb_drop(why);
            return;
        }
        let want_write = !l.session.pending_output().is_empty();
        if let Some((s, _)) = l.stream.as_ref() {
            let _ = self.epoll.modify(s.as_fd(), token, want_write);
        }
    }

    /// The connection is readable or writable.
    pub(super) fn on_ovsdb(&mut self, ev: &EpollEvent) {
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        let Some((s, _)) = l.stream.as_mut() else {
            return;
        };
        let mut failed = None;
        if ev.readable || ev.hangup {
            let mut buf = [0u8; 65536];
            // Bounded per wake-up: a server flooding us delays nobody else.
            for _ in 0..64 {
                match s.read(&mut buf) {
                    Ok(0) => {
                        failed = Some("the server closed the connection".to_string());
                        break;
                    }
                    Ok(n) => {
                        l.last_rx = Instant::now();
                        l.probe_sent = false;
                        if let Err(e) = l.session.feed(&buf[..n]) {
                            l.refused_inputs += 1;
                            failed = Some(format!(
                                "malformed input from the server: {}",
                                with_sources(&e)
                            ));
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failed = Some(format!("read: {e}"));
                        break;
                    }
                }
            }
        }
        self.ovsdb_events();
        if let Some(why) = failed {
            self.ovsdb_drop(why);
            return;
        }
        self.ovsdb_flush();
    }

    /// Handles what the session reports; reconfigures once for all the changes.
    fn ovsdb_events(&mut self) {
        let mut written = false;
        loop {
            let Some(l) = self.ovsdb.as_deref_mut() else {
                return;
            };
            let Some(ev) = l.session.poll_event() else {
                break;
            };
            match ev {
                Event::Synced => {
                    log::info!("ovsdb: synchronised with {}", l.remote);
                    l.dirty = true;
                    l.backoff = BACKOFF_MIN;
                    l.last_error = None;
                }
                Event::Changed(c) => {
                    if changes_configuration(&c, l.session.replica()) {
                        l.dirty = true;
                    }
                }
                Event::TxnReply { id, result } => {
                    if l.txn == Some(id) {
                        l.txn = None;
                        written = true;
                    }
                    if let Err(e) = result {
                        l.txn_failures += 1;
                        l.writeback_due = Some(Instant::now() + RETRY);
                        limited!(
                            self.logs,
                            Warn,
                            "-",
                            "ovsdb-txn",
                            "ovsdb: write-back transaction failed: {e}; retrying"
                        );
                    }
                }
                Event::ServerError { id, error } => {
                    l.refused_inputs += 1;
                    limited!(
                        self.logs,
                        Warn,
                        "-",
                        "ovsdb-error",
                        "ovsdb: the server refused request {id}: {error}"
                    );
                }
            }
        }
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        if l.dirty && l.session.is_synced() {
            l.dirty = false;
            self.ovsdb_reconfigure();
        } else if written && l.writeback_due.is_some_and(|t| t <= Instant::now()) {
            self.ovsdb_writeback();
        }
    }

    /// Maps the replica, applies it, writes back.
    fn ovsdb_reconfigure(&mut self) {
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        let t = tables(&l.session);
        let next_cfg = t.root.as_ref().map(|(_, r)| r.next_cfg);
        let d = vswitchdb::desired(&t, &self.run_dir);
        let failed = self.apply_desired(&d);
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        let err = |l: String| (log::Level::Error, l);
        let mut problems: Vec<(log::Level, String)> = d.warnings.iter().cloned().map(err).collect();
        for (u, e) in &d.errors {
            let name = t.interfaces.get(u).map_or("?", |i| i.name.as_str());
            problems.push(err(format!("interface {name}: {e}")));
        }
        for (p, e) in &failed {
            problems.push(err(format!("interface {p}: {e}")));
        }
        problems.extend(d.notes.iter().map(|n| (log::Level::Warn, n.clone())));
        l.log_new(&problems);
        l.desired = d;
        l.add_errors = failed;
        l.applied_cfg = next_cfg;
        l.applies += 1;
        l.writeback_due = Some(Instant::now());
        self.ovsdb_writeback();
    }

    /// One transaction with every column ferrovs writes whose value differs from the
    /// replica: `cur_cfg` and the switch's identity, each interface's state, each bridge's
    /// `datapath_id`. One at a time: another change waits for its reply.
    fn ovsdb_writeback(&mut self) {
        let Some(l) = self.ovsdb.as_deref() else {
            return;
        };
        if l.txn.is_some() || !l.session.is_synced() {
            return;
        }
        let r = l.session.replica();
        let mut txn = Vec::new();
        if let Some((u, cur)) = r.rows("Open_vSwitch").next() {
            let mut row = Row::new();
            if let Some(c) = l.applied_cfg {
                set_if_changed(&mut row, cur, "cur_cfg", Datum::integer(c));
            }
            set_if_changed(&mut row, cur, "ovs_version", Datum::string(ovs_version()));
            set_if_changed(
                &mut row,
                cur,
                "datapath_types",
                string_set([vswitchdb::DATAPATH_TYPE]),
            );
            set_if_changed(
                &mut row,
                cur,
                "iface_types",
                string_set(vswitchdb::IFACE_TYPES.iter().copied()),
            );
            if !row.is_empty() {
                txn.push(ops::update("Open_vSwitch", *u, &row));
            }
            // The `Datapath` row of our datapath type, whoever created it (ovn-controller
            // does, for `ovn-bridge-datapath-type=netdev`): what ferrovs can do.
            let dp = cur
                .get("datapaths")
                .and_then(|d| d.get(vswitchdb::DATAPATH_TYPE))
                .and_then(|a| a.as_uuid());
            if let Some((dp, dcur)) = dp.and_then(|u| Some((u, r.row("Datapath", &u)?))) {
                let mut row = Row::new();
                let caps = Datum::strings_map(vswitchdb::DATAPATH_CAPABILITIES.iter().copied());
                set_if_changed(&mut row, dcur, "capabilities", caps);
                if !row.is_empty() {
                    txn.push(ops::update("Datapath", dp, &row));
                }
            }
        }
        for (u, cur) in r.rows("Interface") {
            let key = u.to_string();
            let report = match (l.desired.errors.get(&key), l.desired.placed.get(&key)) {
                (Some(e), _) => IfaceReport::failed(e.clone()),
                (None, Some(p)) => self.iface_report(&p.port, l.add_errors.get(&p.port)),
                // Not on a bridge the root row names: nobody runs it.
                (None, None) => continue,
            };
            let mut row = Row::new();
            set_if_changed(&mut row, cur, "ofport", Datum::integer(report.ofport));
            set_if_changed(&mut row, cur, "error", opt_string(report.error.as_deref()));
            set_if_changed(&mut row, cur, "admin_state", opt_string(report.admin_state));
            set_if_changed(&mut row, cur, "link_state", opt_string(report.link_state));
            set_if_changed(
                &mut row,
                cur,
                "mac_in_use",
                opt_string(report.mac_in_use.as_deref()),
            );
            set_if_changed(&mut row, cur, "status", string_map(&report.status));
            if !row.is_empty() {
                txn.push(ops::update("Interface", *u, &row));
            }
        }
        for (name, (u, _)) in &l.desired.bridge_rows {
            let Ok(uuid) = u.parse::<Uuid>() else {
                continue;
            };
            let Some(cur) = r.row("Bridge", &uuid) else {
                continue;
            };
            let id = format!("{:016x}", self.bridge_dpid(name));
            let mut row = Row::new();
            set_if_changed(&mut row, cur, "datapath_id", Datum::string(id));
            if !row.is_empty() {
                txn.push(ops::update("Bridge", uuid, &row));
            }
        }
        txn.extend(self.controller_updates(false));
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        l.last_writeback = Instant::now();
        l.writeback_due = None;
        if txn.is_empty() {
            return;
        }
        l.txn = Some(l.session.transact(txn));
        self.ovsdb_flush();
    }

    /// `Interface.statistics` of every running interface whose counters moved (a
    /// transaction of its own, not retried: the next one comes in [`STATS_EVERY`]).
    fn ovsdb_statistics(&mut self) {
        let Some(l) = self.ovsdb.as_deref() else {
            return;
        };
        let mut txn = Vec::new();
        let mut written = Vec::new();
        for (key, p) in &l.desired.placed {
            let Ok(u) = key.parse::<Uuid>() else { continue };
            if l.session.replica().row("Interface", &u).is_none() {
                continue;
            }
            let Some(stats) = self.iface_statistics(&p.port) else {
                continue;
            };
            let d = Datum::map(
                stats
                    .into_iter()
                    .map(|(k, v)| (Atom::String(k), Atom::Integer(v))),
            );
            if l.stats_written.get(&u) == Some(&d) {
                continue;
            }
            let mut row = Row::new();
            row.insert("statistics".into(), d.clone());
            txn.push(ops::update("Interface", u, &row));
            written.push((u, d));
        }
        txn.extend(self.controller_updates(true));
        let Some(l) = self.ovsdb.as_deref_mut() else {
            return;
        };
        let placed = &l.desired.placed;
        l.stats_written
            .retain(|u, _| placed.contains_key(&u.to_string()));
        l.last_stats = Instant::now();
        if txn.is_empty() {
            return;
        }
        l.stats_written.extend(written);
        l.session.transact(txn);
    }
}

/// What ferrovs writes to one `Interface` row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct IfaceReport {
    /// `-1` for an interface that does not run.
    pub ofport: i64,
    pub error: Option<String>,
    pub admin_state: Option<&'static str>,
    pub link_state: Option<&'static str>,
    pub mac_in_use: Option<String>,
    pub status: BTreeMap<String, String>,
}

impl IfaceReport {
    fn failed(error: String) -> IfaceReport {
        IfaceReport {
            ofport: -1,
            error: Some(error),
            ..Default::default()
        }
    }
}

/// `Controller.is_connected`, `role` and `status` of a running controller, as ovs-vswitchd
/// writes them: `status` has `state`, `sec_since_connect` once it connected,
/// `sec_since_disconnect` once a connection ended and `last_error` once one failed, both
/// kept after a reconnect (as OVS's rconn; the text is OVS's: the system error without our
/// context); a passive target has none.
fn controller_columns(
    r: &ControllerReport,
) -> (bool, Option<&'static str>, BTreeMap<String, String>) {
    let mut st = BTreeMap::new();
    if let Some(state) = r.state {
        st.insert("state".to_string(), state.to_string());
        if let Some(t) = r.since_connect {
            st.insert("sec_since_connect".into(), t.as_secs().to_string());
        }
        if let Some(t) = r.since_disconnect {
            st.insert("sec_since_disconnect".into(), t.as_secs().to_string());
        }
        if let Some(e) = &r.last_error {
            st.insert("last_error".into(), ovs_error_text(e));
        }
    }
    (r.connected, r.role, st)
}

/// `status` of a `Controller` row whose target is refused.
fn controller_error_status(e: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("last_error".to_string(), e.to_string())])
}

/// A controller error as OVS words it: `cannot connect: Connection refused (os error 111)`
/// is `Connection refused`; a connection the peer closed is `End of file`.
fn ovs_error_text(e: &str) -> String {
    let e = e.strip_prefix("cannot connect: ").unwrap_or(e);
    let e = match e.rfind(" (os error ") {
        Some(i) if e.ends_with(')') => &e[..i],
        _ => e,
    };
    match e {
        "connection closed" => "End of file".into(),
        e => e.to_string(),
    }
}

/// A netdev's MAC address from sysfs (`None`: no such device).
pub(super) fn netdev_mac(dev: &str) -> Option<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{dev}/address")).ok()?;
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A netdev's administrative and operational state from sysfs: (IFF_UP, carrier).
fn netdev_state(dev: &str) -> Option<(bool, bool)> {
    let flags = std::fs::read_to_string(format!("/sys/class/net/{dev}/flags")).ok()?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).ok()?;
    let oper = std::fs::read_to_string(format!("/sys/class/net/{dev}/operstate")).ok()?;
    let up = flags & 1 != 0;
    Some((up, up && matches!(oper.trim(), "up" | "unknown")))
}

impl Daemon {
    /// Applies what the database asks for as a diff against what runs; returns the ports
    /// that could not be added (port name → why).
    pub(super) fn apply_desired(&mut self, d: &Desired) -> BTreeMap<String, String> {
        let mut failed = BTreeMap::new();
        self.apply_settings(d);
        let want: HashMap<&str, (&str, &PortConfig)> = d
            .bridges
            .iter()
            .flat_map(|b| {
                b.ports
                    .iter()
                    .map(move |p| (p.name.as_str(), (b.name.as_str(), p)))
            })
            .collect();
        // Ports that go: not asked for, moved to another bridge, or changed (beyond the
        // OpenFlow number asked for and the rx queue pins, which change in place).
        let gone: Vec<(String, String)> = self
            .ports
            .values()
            .filter(|st| match want.get(st.cfg.name.as_str()) {
                None => true,
                Some((b, cfg)) => {
                    *b != st.bridge
                        || **cfg
                            != PortConfig {
                                ofport: cfg.ofport,
                                pmd_rxq_affinity: cfg.pmd_rxq_affinity.clone(),
                                ..st.cfg.clone()
                            }
                }
            })
            .map(|st| (st.bridge.clone(), st.cfg.name.clone()))
            .collect();
        for (b, p) in gone {
            limited!(
                self.logs,
                Info,
                &p,
                "ovsdb-apply",
                "ovsdb: deleting port {p} from bridge {b}"
            );
            if let Err(e) = self.del_port(&b, &p) {
                limited!(
                    self.logs,
                    Error,
                    &p,
                    "ovsdb-apply-error",
                    "ovsdb: deleting port {p}: {e}"
                );
            }
        }
        let bridges: Vec<String> = self
            .bridges
            .keys()
            .filter(|b| !d.bridges.iter().any(|w| &w.name == *b))
            .cloned()
            .collect();
        for b in bridges {
            limited!(
                self.logs,
                Info,
                &b,
                "ovsdb-apply",
                "ovsdb: deleting bridge {b}"
            );
            if let Err(e) = self.del_bridge(&b) {
                limited!(
                    self.logs,
                    Error,
                    &b,
                    "ovsdb-apply-error",
                    "ovsdb: deleting bridge {b}: {e}"
                );
            }
        }
        for b in &d.bridges {
            if !self.bridges.contains_key(&b.name) {
                limited!(
                    self.logs,
                    Info,
                    &b.name,
                    "ovsdb-apply",
                    "ovsdb: adding bridge {}",
                    b.name
                );
                if let Err(e) = self.add_bridge(&b.name) {
                    let e = with_sources(&e);
                    limited!(self.logs, Error, &b.name, "ovsdb-apply-error", "ovsdb: {e}");
                    for p in &b.ports {
                        failed.insert(p.name.clone(), e.clone());
                    }
                    continue;
                }
            }
            // The bridge's own port first: it is OFPP_LOCAL and never takes a number.
            let mut ports: Vec<&PortConfig> = b.ports.iter().collect();
            ports.sort_by_key(|p| p.name != b.name);
            for p in ports {
                if let Some(st) = self.ports.get(&p.name) {
                    let repin = st.cfg.pmd_rxq_affinity != p.pmd_rxq_affinity;
                    if st.cfg.ofport != p.ofport {
                        self.renumber(&p.name, p.ofport);
                    }
                    if repin {
                        let a = p.pmd_rxq_affinity.clone().unwrap_or_default();
                        if let Err(e) = self.set_port(&p.name, &[format!("pmd-rxq-affinity={a}")]) {
                            limited!(self.logs, Error, &p.name, "ovsdb-apply-error", "ovsdb: {e}");
                        }
                    }
                    continue;
                }
                self.ofport_hint = d.ofport_hints.get(&p.name).copied();
                let res = self.add_port(&b.name, p.clone());
                self.ofport_hint = None;
                match res {
                    Ok(()) => limited!(
                        self.logs,
                        Info,
                        &p.name,
                        "ovsdb-apply",
                        "ovsdb: added port {} to bridge {}",
                        p.name,
                        b.name
                    ),
                    Err(e) => {
                        let e = with_sources(&e);
                        limited!(self.logs, Error, &p.name, "ovsdb-add", "ovsdb: {e}");
                        failed.insert(p.name.clone(), e);
                    }
                }
            }
        }
        self.apply_openflow(d);
        failed
    }

    /// The OpenFlow settings the database asks for, through the paths `ferrovs set-bridge`
    /// and `set-controller` take (so a change flushes the rules exactly as theirs): the
    /// settings first, then the controllers. A bridge whose settings did not change is not
    /// touched (after a hot upgrade the handed-over settings are the database's: no
    /// controller is reconnected).
    fn apply_openflow(&mut self, d: &Desired) {
        for want in &d.bridges {
            let Some(cur) = self
                .config
                .bridges
                .iter()
                .find(|b| b.name == want.name)
                .cloned()
            else {
                continue;
            };
            if !self.bridges.contains_key(&want.name) {
                continue;
            }
            let new = BridgeConfig {
                datapath_id: want.datapath_id.clone(),
                protocols: want.protocols.clone(),
                fail_mode: want.fail_mode,
                max_backoff_ms: want.max_backoff_ms,
                inactivity_probe_ms: want.inactivity_probe_ms,
                ..cur.clone()
            };
            if new != cur {
                limited!(
                    self.logs,
                    Info,
                    &want.name,
                    "ovsdb-apply",
                    "ovsdb: bridge {}: OpenFlow settings changed",
                    want.name
                );
                if let Err(e) = self.set_openflow_settings(&want.name, new) {
                    // vswitchdb left every bad value out: not expected.
                    limited!(self.logs, Error, &want.name, "ovsdb-of", "ovsdb: {e}");
                }
            }
            if cur.controllers != want.controllers {
                limited!(
                    self.logs,
                    Info,
                    &want.name,
                    "ovsdb-apply",
                    "ovsdb: bridge {}: controllers [{}]",
                    want.name,
                    want.controllers.join(", ")
                );
                if let Err(e) = self.set_controllers(&want.name, &want.controllers) {
                    limited!(self.logs, Error, &want.name, "ovsdb-of", "ovsdb: {e}");
                }
            }
        }
    }

    /// `pmd-cpu-mask` and the other settings the database carries; a setting the database
    /// no longer sets goes back to its default.
    fn apply_settings(&mut self, d: &Desired) {
        if let Some(cores) = &d.pmd_cores {
            if *cores != self.config.pmd_cores {
                let list = cores
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                if let Err(e) = self.config_set("pmd-cores", &list) {
                    limited!(
                        self.logs,
                        Error,
                        "-",
                        "ovsdb-pmd",
                        "ovsdb: pmd-cpu-mask: {e}"
                    );
                }
            }
        }
        let dropped: Vec<String> = self
            .db_settings
            .iter()
            .filter(|k| !d.settings.contains_key(*k))
            .cloned()
            .collect();
        for k in dropped {
            self.config.other.remove(&k);
            self.db_settings.remove(&k);
            self.apply_rx_mode();
            self.apply_flow_limit();
            self.apply_conntrack_config();
        }
        for (k, v) in &d.settings {
            if self.config.other.get(k) != Some(v) {
                match self.config_set(k, v) {
                    Ok(()) => {
                        self.db_settings.insert(k.clone());
                    }
                    Err(e) => limited!(self.logs, Error, "-", "ovsdb-set", "ovsdb: {e}"),
                }
            }
        }
    }

    /// A live port asks for another OpenFlow number: it takes it when no other port of its
    /// bridge has it (nothing else about the port changes).
    pub(super) fn renumber(&mut self, name: &str, request: Option<u16>) {
        let Some(st) = self.ports.get(name) else {
            return;
        };
        let bridge = st.bridge.clone();
        let taken = |n: u16| {
            self.ports
                .values()
                .any(|p| p.bridge == bridge && p.cfg.name != name && p.ofport == n)
        };
        let new = request.filter(|n| !taken(*n));
        if let Some(st) = self.ports.get_mut(name) {
            st.cfg.ofport = request;
            if let Some(n) = new {
                st.ofport = n;
            }
        }
        for b in &mut self.config.bridges {
            for c in &mut b.ports {
                if c.name == name {
                    c.ofport = request;
                }
            }
        }
    }

    /// What ferrovs writes to the `Interface` row of port `name` (`add_error`: why it could
    /// not be added).
    pub(super) fn iface_report(&self, name: &str, add_error: Option<&String>) -> IfaceReport {
        let Some(p) = self.ports.get(name) else {
            let e = add_error
                .cloned()
                .unwrap_or_else(|| format!("port {name} is not running"));
            return IfaceReport::failed(e);
        };
        let mut r = IfaceReport {
            ofport: i64::from(p.ofport),
            ..Default::default()
        };
        match &p.device {
            Some(d) => {
                let ready = d
                    .queues()
                    .iter()
                    .filter(|q| q.ready.load(Ordering::Relaxed))
                    .count();
                let up = p.conn.is_some() && ready > 0;
                r.admin_state = Some("up");
                r.link_state = Some(if up { "up" } else { "down" });
                let mode = match p.cfg.kind {
                    PortType::VhostUserClient => "client",
                    _ => "server",
                };
                let path = p.cfg.path.as_ref().map(|p| p.display().to_string());
                r.status.insert("mode".into(), mode.into());
                r.status.insert("socket".into(), path.unwrap_or_default());
                r.status
                    .insert("features".into(), format!("0x{:016x}", d.features()));
                r.status
                    .insert("num_of_vrings".into(), d.queues().len().to_string());
                r.status.insert("ready_vrings".into(), ready.to_string());
                r.status.insert(
                    "connected".into(),
                    if p.conn.is_some() { "true" } else { "false" }.into(),
                );
                if let Some(e) = &p.last_error {
                    r.status.insert("last_error".into(), e.clone());
                }
            }
            None => {
                r.status
                    .insert("driver_name".into(), p.port.io.mode().into());
                match p.cfg.dev.as_deref() {
                    Some(dev) => {
                        let (admin, link) = netdev_state(dev).unwrap_or((false, false));
                        r.admin_state = Some(if admin { "up" } else { "down" });
                        r.link_state = Some(if link { "up" } else { "down" });
                        r.mac_in_use = netdev_mac(dev).map(mac_text);
                        if let Some(why) = &p.fallback {
                            r.status.insert("af_xdp_fallback".into(), why.clone());
                        }
                    }
                    None => {
                        // A tunnel: up for as long as its socket is.
                        r.admin_state = Some("up");
                        r.link_state = Some("up");
                    }
                }
            }
        }
        r
    }

    /// `Interface.statistics` of port `name`: OVS's keys, then our drop reasons (`rx_` and
    /// `tx_` followed by the reason's name).
    pub(super) fn iface_statistics(&self, name: &str) -> Option<BTreeMap<String, i64>> {
        let p = self.ports.get(name)?;
        let (rx, tx) = (p.port.rx_stats(), p.port.tx_stats());
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut s = BTreeMap::new();
        for (dir, st) in [("rx", &rx), ("tx", &tx)] {
            s.insert(format!("{dir}_packets"), n(st.packets));
            s.insert(format!("{dir}_bytes"), n(st.bytes));
            s.insert(format!("{dir}_dropped"), n(st.total_drops()));
            s.insert(format!("{dir}_errors"), 0);
            for (reason, v) in st.named_drops() {
                if v > 0 {
                    s.insert(format!("{dir}_{reason}"), n(v));
                }
            }
        }
        Some(s)
    }

    /// The updates of `Controller` rows whose `is_connected`, `role` or `status` differ from
    /// the replica. As ovs-vswitchd: a change of state, role or error is written at the next
    /// write-back; `sec_since_connect`/`sec_since_disconnect` alone only with the
    /// statistics (`timers`), every [`STATS_EVERY`].
    fn controller_updates(&self, timers: bool) -> Vec<Value> {
        let Some(l) = self.ovsdb.as_deref() else {
            return Vec::new();
        };
        let r = l.session.replica();
        let mut out = Vec::new();
        for (key, p) in &l.desired.controller_rows {
            let Ok(u) = key.parse::<Uuid>() else { continue };
            let Some(cur) = r.row("Controller", &u) else {
                continue;
            };
            let (connected, role, status) = match &p.error {
                Some(e) => (false, None, controller_error_status(e)),
                None => match self.controller_report(&p.bridge, &p.target) {
                    Some(rep) => controller_columns(&rep),
                    None => continue,
                },
            };
            let role = opt_string(role);
            let status_d = string_map(&status);
            let differs = |col: &str, v: &Datum| cur.get(col) != Some(v);
            let changed = differs("is_connected", &Datum::boolean(connected))
                || differs("role", &role)
                || {
                    let untimed = |m: BTreeMap<String, String>| {
                        m.into_iter()
                            .filter(|(k, _)| !k.starts_with("sec_since_"))
                            .collect::<BTreeMap<_, _>>()
                    };
                    let have: BTreeMap<String, String> = cur
                        .get("status")
                        .map(|d| {
                            d.str_map()
                                .into_iter()
                                .map(|(k, v)| (k.to_string(), v.to_string()))
                                .collect()
                        })
                        .unwrap_or_default();
                    let keys = |m: &BTreeMap<String, String>| {
                        m.keys().cloned().collect::<std::collections::BTreeSet<_>>()
                    };
                    keys(&have) != keys(&status) || untimed(have) != untimed(status.clone())
                }
                || (timers && differs("status", &status_d));
            if !changed {
                continue;
            }
            let mut row = Row::new();
            set_if_changed(&mut row, cur, "is_connected", Datum::boolean(connected));
            set_if_changed(&mut row, cur, "role", role);
            set_if_changed(&mut row, cur, "status", status_d);
            if !row.is_empty() {
                out.push(ops::update("Controller", u, &row));
            }
        }
        out
    }

    /// The datapath id `bridge` runs with (FEATURES_REPLY, `Bridge.datapath_id`, `show`):
    /// the configured one; else, configured through OVSDB, `0000` and the MAC of the bridge's
    /// internal port, as ovs-vswitchd derives it; else the one derived from the name.
    pub(super) fn bridge_dpid(&self, bridge: &str) -> u64 {
        let cfg = self.config.bridges.iter().find(|b| b.name == bridge);
        let configured = cfg.and_then(|b| b.datapath_id.as_deref());
        let text = if self.ovsdb.is_some() {
            self.bridge_datapath_id(bridge, configured)
        } else {
            vswitchdb::datapath_id(configured, None, bridge)
        };
        u64::from_str_radix(&text, 16).unwrap_or(0)
    }

    /// `Bridge.datapath_id` of `bridge`.
    pub(super) fn bridge_datapath_id(&self, bridge: &str, configured: Option<&str>) -> String {
        let mac = self
            .ports
            .get(bridge)
            .filter(|p| p.bridge == bridge)
            .and_then(|p| p.cfg.dev.as_deref())
            .and_then(netdev_mac);
        vswitchdb::datapath_id(configured, mac, bridge)
    }
}

/// At most this much of the session (its JSON: mostly the replica) travels in the handover
/// message (at most [`crate::upgrade::MAX_MSG`] with everything else); a bigger one is left
/// out and the new daemon connects and resynchronises.
const HANDOVER_BYTES: usize = 3 << 20;

/// Why a handed-over database connection was refused (it is closed, and the new daemon
/// connects afresh).
#[derive(Debug, thiserror::Error)]
pub(super) enum OvsdbConnError {
    #[error("malformed: {0}")]
    Malformed(String),
    #[error(transparent)]
    Fd(#[from] crate::upgrade::StateError),
    #[error("its socket is not a {0} stream socket")]
    Socket(&'static str, #[source] io::Error),
    #[error("a {socket} socket for remote {remote}")]
    Kind {
        socket: &'static str,
        remote: String,
    },
    #[error("session")]
    Session(#[source] Box<ferrovs_ovsdb::RestoreError>),
    #[error("epoll")]
    Epoll(#[source] io::Error),
}

impl Daemon {
    /// The OVSDB side as plain data, the connection's socket into `fds` when it is
    /// synchronised. Called by the handover in the control thread: the socket is read and
    /// written no more (its events were handled when its bytes were read).
    pub(super) fn ovsdb_export(&self, fds: &mut crate::upgrade::FdList) -> Option<OvsdbState> {
        let l = self.ovsdb.as_deref()?;
        let conn = l.stream.as_ref().and_then(|(stream, _)| {
            let Some(session) = l.session.export() else {
                log::info!("upgrade: ovsdb: not synchronised; the new daemon reconnects");
                return None;
            };
            let size = serde_json::to_vec(&session).map_or(usize::MAX, |v| v.len());
            if size > HANDOVER_BYTES {
                log::warn!(
                    "upgrade: ovsdb: the session is {size} bytes, more than {HANDOVER_BYTES}; \
                     the new daemon reconnects"
                );
                return None;
            }
            Some(Lenient(Ok(OvsdbConnState {
                socket: fds.push(stream.as_raw_fd()),
                tcp: matches!(stream, Stream::Tcp(_)),
                session,
                writeback: l.txn,
                applied_cfg: l.applied_cfg,
                idle_ms: l.last_rx.elapsed().as_millis() as u64,
                probe_sent: l.probe_sent,
                connects: l.connects,
            })))
        });
        Some(OvsdbState {
            remote: l.remote.clone(),
            settings: self.db_settings.iter().cloned().collect(),
            conn,
        })
    }

    /// The database link from handed-over state: the connection goes on where the old
    /// daemon left it (registered now, read and written once the event loop runs, after
    /// the commit), or, refused, is closed and counted, and a new one is made at the first
    /// tick. The first turn applies the replica as a diff (it finds every port as the
    /// database asks) and writes back what differs.
    pub(super) fn ovsdb_restore(
        &mut self,
        remote: String,
        conn: Option<Lenient<OvsdbConnState>>,
        fds: &mut crate::upgrade::FdTable,
    ) {
        self.ovsdb = Some(Box::new(OvsdbLink::new(remote)));
        let Some(Lenient(c)) = conn else { return };
        let r = c
            .map_err(OvsdbConnError::Malformed)
            .and_then(|c| self.ovsdb_restore_conn(&c, fds));
        let l = self.ovsdb.as_deref_mut().expect("set above");
        match r {
            Ok(()) => {
                l.handed_over += 1;
                log::info!("takeover: ovsdb: the connection to {} goes on", l.remote);
            }
            Err(e) => {
                l.handover_refused += 1;
                log::warn!(
                    "takeover: ovsdb: handed-over connection to {} refused (closed; \
                     connecting afresh): {}",
                    l.remote,
                    with_sources(&e)
                );
            }
        }
    }

    fn ovsdb_restore_conn(
        &mut self,
        c: &OvsdbConnState,
        fds: &mut crate::upgrade::FdTable,
    ) -> Result<(), OvsdbConnError> {
        let fd = fds.take(c.socket)?;
        let l = self.ovsdb.as_deref().expect("set by the caller");
        let kind = if c.tcp { "TCP" } else { "Unix" };
        let tcp_remote = matches!(l.target, Ok(Remote::Tcp(_)));
        if c.tcp != tcp_remote {
            return Err(OvsdbConnError::Kind {
                socket: kind,
                remote: l.remote.clone(),
            });
        }
        let stream = if c.tcp {
            let t = std::net::TcpStream::from(fd);
            t.peer_addr()
                .and_then(|_| t.set_nonblocking(true))
                .map_err(|e| OvsdbConnError::Socket(kind, e))?;
            Stream::Tcp(t)
        } else {
            let u = UnixStream::from(fd);
            u.peer_addr()
                .and_then(|_| u.set_nonblocking(true))
                .map_err(|e| OvsdbConnError::Socket(kind, e))?;
            Stream::Unix(u)
        };
        let session = Session::restore(DB, monitor(), &c.session)
            .map_err(|e| OvsdbConnError::Session(Box::new(e)))?;
        let t = self.token(Source::Ovsdb, "");
        // Armed for writing: the first turn of the loop after the commit writes the output
        // the old daemon had not, and handles what it had read.
        if let Err(e) = self.epoll.add(stream.as_fd(), t, true) {
            self.tokens.remove(&t);
            return Err(OvsdbConnError::Epoll(e));
        }
        let l = self.ovsdb.as_deref_mut().expect("set by the caller");
        let now = Instant::now();
        l.session = session;
        l.stream = Some((stream, t));
        l.connects = c.connects;
        l.txn = c.writeback;
        l.applied_cfg = c.applied_cfg;
        l.last_rx = now
            .checked_sub(Duration::from_millis(c.idle_ms))
            .unwrap_or(now);
        l.probe_sent = c.probe_sent;
        l.dirty = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ROOT: &str = "00000000-0000-0000-0000-000000000001";
    const BR: &str = "00000000-0000-0000-0000-000000000002";
    const PORT: &str = "00000000-0000-0000-0000-000000000003";
    const IFACE: &str = "00000000-0000-0000-0000-000000000004";

    /// The columns ferrovs monitors, typed as `vswitch.ovsschema` types them.
    fn schema() -> Value {
        let s = |t: &str| json!({"type": t});
        let opt = |t: &str| json!({"type": {"key": t, "min": 0, "max": 1}});
        let set = |t: &str| json!({"type": {"key": t, "min": 0, "max": "unlimited"}});
        let refs = |t: &str| json!({"type": {"key": {"type": "uuid", "refTable": t}, "min": 0, "max": "unlimited"}});
        let smap =
            || json!({"type": {"key": "string", "value": "string", "min": 0, "max": "unlimited"}});
        json!({"name": "Open_vSwitch", "version": "8.3.1", "tables": {
            "Open_vSwitch": {"columns": {
                "next_cfg": s("integer"), "cur_cfg": s("integer"), "other_config": smap(),
                "bridges": refs("Bridge"), "ovs_version": opt("string"),
                "datapath_types": set("string"), "iface_types": set("string")}},
            "Bridge": {"columns": {
                "name": s("string"), "datapath_type": s("string"), "other_config": smap(),
                "ports": refs("Port"), "datapath_id": opt("string")}},
            "Port": {"columns": {
                "name": s("string"), "tag": opt("integer"), "trunks": set("integer"),
                "vlan_mode": opt("string"), "interfaces": refs("Interface")}},
            "Interface": {"columns": {
                "name": s("string"), "type": s("string"), "options": smap(),
                "other_config": smap(),
                "ofport_request": opt("integer"), "ofport": opt("integer"),
                "error": opt("string"), "admin_state": opt("string"),
                "link_state": opt("string"), "mac_in_use": opt("string"),
                "status": smap()}},
        }})
    }

    /// A session synced with one bridge, port and interface, as ovs-vsctl leaves them.
    fn synced() -> Session {
        let mut s = Session::new(DB, monitor());
        s.connected();
        let take = |s: &mut Session| {
            let out = s.pending_output().to_vec();
            s.consume_output(out.len());
            serde_json::from_slice::<Value>(&out).unwrap()
        };
        let req = take(&mut s);
        let reply = json!({"id": req["id"], "result": schema(), "error": null});
        s.feed(reply.to_string().as_bytes()).unwrap();
        let req = take(&mut s);
        let uuid = |u: &str| json!(["uuid", u]);
        let initial = json!({
            "Open_vSwitch": {ROOT: {"initial": {
                "next_cfg": 3, "bridges": uuid(BR),
                "other_config": ["map", [["pmd-cpu-mask", "0x2"], ["dpdk-init", "true"]]]}}},
            "Bridge": {BR: {"initial": {
                "name": "br0", "datapath_type": "netdev", "ports": uuid(PORT)}}},
            "Port": {PORT: {"initial": {
                "name": "vhu0", "tag": 10, "interfaces": uuid(IFACE)}}},
            "Interface": {IFACE: {"initial": {
                "name": "vhu0", "type": "dpdkvhostuserclient", "ofport_request": 5,
                "options": ["map", [["vhost-server-path", "/tmp/vhu0.sock"]]]}}},
        });
        let reply = json!({"id": req["id"], "result": initial, "error": null});
        s.feed(reply.to_string().as_bytes()).unwrap();
        assert_eq!(s.poll_event(), Some(Event::Synced));
        s
    }

    /// Feeds one update2 notification of the monitor; returns what it changed.
    fn update(s: &mut Session, tables: Value) -> ferrovs_ovsdb::Changes {
        let n =
            json!({"id": null, "method": "update2", "params": [ferrovs_ovsdb::MONITOR_ID, tables]});
        s.feed(n.to_string().as_bytes()).unwrap();
        match s.poll_event() {
            Some(Event::Changed(c)) => c,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn only_a_change_to_what_the_switch_reads_remaps() {
        let mut s = synced();
        // The echo of a write-back: cur_cfg, an interface's ofport and state.
        let c = update(
            &mut s,
            json!({
                "Open_vSwitch": {ROOT: {"modify": {"cur_cfg": 3, "ovs_version": "x"}}},
                "Interface": {IFACE: {"modify": {
                    "ofport": 5, "link_state": "up", "status": ["map", [["mode", "client"]]]}}},
            }),
        );
        assert!(!changes_configuration(&c, s.replica()), "{c:?}");
        // A change the operator made: next_cfg and a port's VLAN.
        let c = update(&mut s, json!({"Port": {PORT: {"modify": {"tag": 20}}}}));
        assert!(changes_configuration(&c, s.replica()), "{c:?}");
        let c = update(
            &mut s,
            json!({"Open_vSwitch": {ROOT: {"modify": {"next_cfg": 4}}}}),
        );
        assert!(changes_configuration(&c, s.replica()), "{c:?}");
        // A row deleted is always one.
        let c = update(&mut s, json!({"Interface": {IFACE: {"delete": null}}}));
        assert!(changes_configuration(&c, s.replica()), "{c:?}");
    }

    #[test]
    fn the_replica_becomes_the_rows_vswitchdb_maps() {
        let s = synced();
        let t = tables(&s);
        let (root, r) = t.root.as_ref().unwrap();
        assert_eq!(root, ROOT);
        assert_eq!(r.next_cfg, 3);
        assert_eq!(r.bridges, vec![BR.to_string()]);
        assert_eq!(r.other_config["pmd-cpu-mask"], "0x2");
        assert_eq!(t.bridges[BR].datapath_type, "netdev");
        assert_eq!(t.ports[PORT].tag, Some(10));
        assert!(t.ports[PORT].trunks.is_empty() && t.ports[PORT].vlan_mode.is_none());
        let i = &t.interfaces[IFACE];
        assert_eq!(
            (i.kind.as_str(), i.ofport_request, i.ofport),
            ("dpdkvhostuserclient", Some(5), None)
        );
        let d = vswitchdb::desired(&t, Path::new("/run"));
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        let p = &d.bridges[0].ports[0];
        assert_eq!(
            (p.kind, p.tag, p.ofport),
            (PortType::VhostUserClient, Some(10), Some(5))
        );
        assert_eq!(d.pmd_cores, Some(vec![1]));
        assert_eq!(d.placed[IFACE].port, "vhu0");
    }

    #[test]
    fn only_what_differs_is_written() {
        let s = synced();
        let u: Uuid = IFACE.parse().unwrap();
        let cur = s.replica().row("Interface", &u).unwrap();
        let mut row = Row::new();
        // Absent optional values and empty maps as the replica holds them: nothing to write.
        set_if_changed(&mut row, cur, "error", opt_string(None));
        set_if_changed(&mut row, cur, "status", string_map(&BTreeMap::new()));
        assert!(row.is_empty(), "{row:?}");
        set_if_changed(&mut row, cur, "ofport", Datum::integer(5));
        set_if_changed(&mut row, cur, "error", opt_string(Some("no")));
        assert_eq!(row.len(), 2);
        let op = ops::update("Interface", u, &row);
        assert_eq!(op["row"]["ofport"], json!(5));
    }

    #[test]
    fn netdev_helpers() {
        assert_eq!(mac_text([0x52, 0x54, 0, 0xab, 1, 2]), "52:54:00:ab:01:02");
        assert_eq!(netdev_mac("lo"), Some([0; 6]));
        assert_eq!(netdev_mac("no-such-dev0"), None);
        assert!(ovs_version().starts_with("3.1.0+ferrovs."));
    }

    fn daemon(name: &str) -> (Daemon, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ferrovs-dbho-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut opts = DaemonOptions::in_dir(&dir);
        opts.pmd_cores = Some(vec![*os::allowed_cpus().last().unwrap_or(&0)]);
        (Daemon::start(opts).expect("daemon starts"), dir)
    }

    /// A connection state on a fresh socket pair: (state, fds, the server's end).
    fn handed(session: &Session) -> (OvsdbConnState, Vec<std::os::fd::OwnedFd>, UnixStream) {
        let (ours, server) = UnixStream::pair().unwrap();
        let st = OvsdbConnState {
            socket: 0,
            tcp: false,
            session: session.export().unwrap(),
            writeback: None,
            applied_cfg: Some(3),
            idle_ms: 1200,
            probe_sent: false,
            connects: 4,
        };
        (st, vec![std::os::fd::OwnedFd::from(ours)], server)
    }

    /// A handed-over connection goes on on the same socket: the session's output (a
    /// transaction the old daemon had half written) goes out from the exact byte, the
    /// write-back's reply finds its id, and the first turn maps the replica; the counters
    /// say it was handed over.
    #[test]
    fn a_handed_over_connection_goes_on() {
        let (mut d, dir) = daemon("ok");
        let mut s = synced();
        let id = s.transact(vec![json!({"op": "comment", "comment": "write-back"})]);
        let out = s.pending_output().to_vec();
        s.consume_output(10);
        let (mut st, fds, mut server) = handed(&s);
        st.writeback = Some(id);
        let remote = "unix:/nonexistent/db.sock".to_string();
        let mut fds = crate::upgrade::FdTable::new(fds);
        d.ovsdb_restore(remote, Some(Lenient(Ok(st))), &mut fds);
        let l = d.ovsdb.as_deref().unwrap();
        assert_eq!((l.handed_over, l.handover_refused), (1, 0));
        assert_eq!(l.connects, 4);
        assert_eq!(l.txn, Some(id));
        assert!(l.stream.is_some() && l.session.is_synced() && l.dirty);
        let status = l.status();
        assert_eq!(status.state, "synced");
        assert_eq!(status.cur_cfg, 3);
        // The first turn: the rest of the output, then the mapping (the interface's client
        // socket does not exist: its error is written back after the reply).
        d.ovsdb_tick();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut got = vec![0; out.len() - 10];
        server.read_exact(&mut got).unwrap();
        assert_eq!(got, out[10..]);
        let l = d.ovsdb.as_deref().unwrap();
        assert!(!l.dirty);
        assert_eq!(l.desired.bridge_rows.len(), 1);
        let reply = json!({"id": id, "result": [{}], "error": null});
        server.write_all(reply.to_string().as_bytes()).unwrap();
        let ev = EpollEvent {
            readable: true,
            ..Default::default()
        };
        d.on_ovsdb(&ev);
        // The reply found its id; the write-back the mapping asked for goes out next, with
        // the next id of the old daemon's numbering.
        assert_eq!(d.ovsdb.as_deref().unwrap().txn, Some(id + 1));
        let mut buf = vec![0; 65536];
        let n = server.read(&mut buf).unwrap();
        let next: Value = serde_json::Deserializer::from_slice(&buf[..n])
            .into_iter()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(next["method"], "transact");
        assert_eq!(next["id"], id + 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A corrupt entry costs that connection only: it is closed (the server sees its end)
    /// and counted, and the daemon connects afresh at its first tick.
    #[test]
    fn a_corrupt_handed_over_connection_is_closed_and_counted() {
        let (mut d, dir) = daemon("bad");
        let remote = "unix:/nonexistent/db.sock".to_string();
        let s = synced();
        type Corrupt = Box<dyn Fn(&mut OvsdbConnState)>;
        let cases: Vec<(&str, Corrupt)> = vec![
            ("tcp", Box::new(|c| c.tcp = true)),
            ("db", Box::new(|c| c.session.db = "OVN_Southbound".into())),
            (
                "replica",
                Box::new(|c| c.session.replica["Bridge"][BR]["initial"]["name"] = json!(7)),
            ),
            ("fd", Box::new(|c| c.socket = 3)),
        ];
        for (i, (what, f)) in cases.iter().enumerate() {
            let (mut st, fds, mut server) = handed(&s);
            f(&mut st);
            let mut fds = crate::upgrade::FdTable::new(fds);
            d.ovsdb_restore(remote.clone(), Some(Lenient(Ok(st))), &mut fds);
            drop(fds);
            let l = d.ovsdb.as_deref().unwrap();
            assert_eq!(l.handover_refused, 1, "{what}");
            assert!(l.stream.is_none(), "{what}");
            assert_eq!(l.status().state, "backoff", "{what}");
            // Closed: the server reads the end of the stream.
            let mut b = [0u8; 1];
            assert_eq!(server.read(&mut b).unwrap(), 0, "{what} {i}");
        }
        // One that does not parse; and a fd that is no socket.
        let mut fds = crate::upgrade::FdTable::new(vec![]);
        d.ovsdb_restore(remote.clone(), Some(Lenient(Err("x".into()))), &mut fds);
        assert_eq!(d.ovsdb.as_deref().unwrap().handover_refused, 1);
        let (st, _, _server) = handed(&s);
        let mut fds = crate::upgrade::FdTable::new(vec![os::memfd("x", 8, false).unwrap()]);
        d.ovsdb_restore(remote, Some(Lenient(Ok(st))), &mut fds);
        assert_eq!(d.ovsdb.as_deref().unwrap().handover_refused, 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The fixture captured from a live daemon (`tests/ovsdb.rs`'s
    /// `the_database_connection_is_handed_over_at_an_upgrade`, `FERROVS_WRITE_FIXTURE=1`)
    /// restores: its replica is the database the test built. That version did not monitor
    /// `Interface.other_config`, so the restored session monitors again on the same
    /// connection (cancel, then this version's monitor), and is synchronised by its reply.
    #[test]
    fn the_captured_connection_restores() {
        const FIXTURE: &str =
            include_str!("../../../../tests/e2e/fixtures/upgrade-state-v3-ovsdbconn.json");
        let st = crate::upgrade::State::parse(FIXTURE.as_bytes()).unwrap();
        assert_eq!(st.schema, 3);
        let o = st.ovsdb.unwrap();
        let c = o.conn.unwrap().0.unwrap();
        assert!(!c.session.monitored["Interface"].contains(&"other_config".to_string()));
        let mut s = Session::restore(DB, monitor(), &c.session).unwrap();
        let t = tables(&s);
        assert_eq!(t.bridges.len(), 1);
        assert_eq!(t.interfaces.len(), 3, "br0, p1, p2");
        assert!(!s.is_synced());
        let out = String::from_utf8(s.pending_output().to_vec()).unwrap();
        let reqs: Vec<Value> = serde_json::Deserializer::from_str(&out)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let methods: Vec<&str> = reqs.iter().filter_map(|r| r["method"].as_str()).collect();
        assert_eq!(
            &methods[methods.len() - 2..],
            ["monitor_cancel", "monitor_cond"]
        );
        let m = &reqs[reqs.len() - 1];
        assert!(m["params"][2]["Interface"][0]["columns"]
            .as_array()
            .unwrap()
            .contains(&json!("other_config")));
        // The server's replies: the cancel, then the new monitor's rows (the old replica
        // with an other_config on one interface).
        let mut rows = c.session.replica.clone();
        for (_, r) in rows["Interface"].as_object_mut().unwrap().iter_mut() {
            r["initial"]["other_config"] = json!(["map", [["pmd-rxq-affinity", "0:1"]]]);
        }
        for reply in [
            json!({"id": reqs[reqs.len() - 2]["id"], "result": {}, "error": null}),
            json!({"id": m["id"], "result": rows, "error": null}),
        ] {
            s.feed(reply.to_string().as_bytes()).unwrap();
        }
        while s.poll_event().is_some_and(|e| e != Event::Synced) {}
        assert!(s.is_synced());
        let t = tables(&s);
        assert_eq!(t.interfaces.len(), 3);
        assert!(t.interfaces.values().all(|i| i
            .other_config
            .get("pmd-rxq-affinity")
            .map(String::as_str)
            == Some("0:1")));
    }
}
