//! One connection's protocol state, without I/O.
//!
//! # Life of a connection
//! The caller connects, calls [`Session::connected`], and from then on writes
//! [`Session::pending_output`] to the socket, hands what it reads to [`Session::feed`] and
//! takes [`Event`]s from [`Session::poll_event`]. On `connected` the session asks for the
//! database's schema (`get_schema`: the column types say how to read a `modify` diff and what
//! a column left out of an insert holds), then monitors the tables of its [`Monitor`] with
//! `monitor_cond` (update2 notifications), or plain `monitor` (update notifications) if the
//! server refuses `monitor_cond`. The monitor's reply fills the [`Replica`] and yields
//! [`Event::Synced`]; each later notification updates it and yields [`Event::Changed`].
//!
//! # Invariants
//! * The replica holds exactly the monitored tables' rows as the server last described them,
//!   each row with every monitored column, each value of its column's type in canonical
//!   order ([`Session::check_consistency`] verifies it; the fuzz target calls it).
//! * An update is validated whole before any of it is applied: an update that fails leaves
//!   the replica as it was.
//! * Nothing the server sends panics; anything that breaks the protocol is a
//!   [`SessionError`], after which the caller drops the connection (the session is then in
//!   an unspecified state until the next `connected`). Events queued before the error stay.
//! * Output and events grow only with the caller's requests and the server's messages; one
//!   message is at most [`Session::set_max_message`] bytes (64 MiB by default).
//!
//! Not thread-safe by design: one owner (the daemon's control thread) drives it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use serde_json::{json, Map, Value};

use crate::datum::{abbrev, DatumError, Row};
use crate::framing::{FramingError, Splitter};
use crate::schema::{ColumnType, Schema};
use crate::uuid::Uuid;

mod handover;
pub use handover::{PendingState, RestoreError, SessionState, MAX_PENDING};

/// The default limit of one message's size.
pub const MAX_MESSAGE: usize = 64 << 20;

/// The monitor id this client gives the server (its notifications name it).
pub const MONITOR_ID: &str = "ferrovs";

/// The error text of transactions in flight when the connection was lost or replaced.
pub const CONNECTION_LOST: &str = "connection lost before the reply";

/// Transaction errors after which the same transaction may succeed: a `wait` that did not
/// hold (someone else changed the row: a conflict), and the errors of a server that is
/// changing leader or could not write.
const RETRYABLE: &[&str] = &["timed out", "not leader", "canceled", "I/O error"];

/// The tables and columns to replicate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Monitor {
    tables: Vec<(String, Vec<String>)>,
}

impl Monitor {
    /// Monitors nothing yet.
    pub fn new() -> Monitor {
        Monitor::default()
    }

    /// Adds (or replaces) a table and the columns to replicate; no columns means all of them.
    /// A table or column the server's schema lacks is left out with a warning.
    pub fn table(mut self, name: &str, columns: &[&str]) -> Monitor {
        let cols = columns.iter().map(|c| c.to_string()).collect();
        match self.tables.iter_mut().find(|(t, _)| t == name) {
            Some(t) => t.1 = cols,
            None => self.tables.push((name.to_owned(), cols)),
        }
        self
    }
}

/// The monitored tables as the server has them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replica {
    tables: BTreeMap<String, BTreeMap<Uuid, Row>>,
}

impl Replica {
    /// The rows of `table` by UUID (none for a table not monitored).
    pub fn rows(&self, table: &str) -> impl Iterator<Item = (&Uuid, &Row)> {
        self.tables.get(table).into_iter().flatten()
    }

    /// One row of `table`.
    pub fn row(&self, table: &str, uuid: &Uuid) -> Option<&Row> {
        self.tables.get(table)?.get(uuid)
    }

    /// The number of rows of `table`.
    pub fn len(&self, table: &str) -> usize {
        self.tables.get(table).map_or(0, BTreeMap::len)
    }

    /// Whether no table has a row.
    pub fn is_empty(&self) -> bool {
        self.tables.values().all(BTreeMap::is_empty)
    }

    /// The names of the replicated tables.
    pub fn tables(&self) -> impl Iterator<Item = &str> {
        self.tables.keys().map(String::as_str)
    }
}

/// What an update notification changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Rows inserted, as (table, uuid).
    pub inserted: Vec<(String, Uuid)>,
    /// Rows modified, as (table, uuid).
    pub modified: Vec<(String, Uuid)>,
    /// Rows deleted, as (table, uuid).
    pub deleted: Vec<(String, Uuid)>,
    /// The modified and deleted rows as they were before, by (table, uuid).
    pub old: BTreeMap<(String, Uuid), Row>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.inserted.is_empty() && self.modified.is_empty() && self.deleted.is_empty()
    }

    /// Whether a row of `table` changed.
    pub fn touches(&self, table: &str) -> bool {
        [&self.inserted, &self.modified, &self.deleted]
            .iter()
            .any(|v| v.iter().any(|(t, _)| t == table))
    }
}

/// Why a transaction failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnError {
    /// The server's `error` (e.g. "timed out", "constraint violation"), or
    /// [`CONNECTION_LOST`].
    pub error: String,
    /// The server's `details`, if any.
    pub details: Option<String>,
    /// The failing operation's index; None for the request as a whole or the commit.
    pub op_index: Option<usize>,
    /// Whether the same transaction may succeed if sent again (see [`TxnError::retryable`]).
    pub retryable: bool,
}

impl TxnError {
    fn new(error: String, details: Option<String>, op_index: Option<usize>) -> TxnError {
        let retryable = RETRYABLE.contains(&error.as_str()) || error == CONNECTION_LOST;
        TxnError {
            error,
            details,
            op_index,
            retryable,
        }
    }

    /// Whether the transaction may succeed if sent again: a failed `wait` ("timed out": the
    /// rows changed meanwhile), a server changing leader or failing to write, or a lost
    /// connection (the transaction may or may not have been committed: send only idempotent
    /// ones again).
    pub fn retryable(&self) -> bool {
        self.retryable
    }
}

impl fmt::Display for TxnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(i) = self.op_index {
            write!(f, "operation {i}: ")?;
        }
        f.write_str(&self.error)?;
        if let Some(d) = &self.details {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TxnError {}

/// What the session has to tell its caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The monitor's initial contents arrived: the replica is complete. After every
    /// (re)connection.
    Synced,
    /// An update notification was applied to the replica.
    Changed(Changes),
    /// A transaction's outcome: the operations' results, or why it failed.
    TxnReply {
        /// The id [`Session::transact`] returned.
        id: u64,
        /// One result per operation, or the error.
        result: Result<Vec<Value>, TxnError>,
    },
    /// An error reply to another request: the schema (unknown database), the monitor
    /// (unknown table) or an echo.
    ServerError {
        /// The request's id.
        id: u64,
        /// The server's error and details.
        error: String,
    },
}

/// A protocol violation by the server: the caller drops the connection.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The byte stream is not a sequence of JSON objects of bounded size.
    #[error("bad framing")]
    Framing(#[from] FramingError),
    /// A message is not valid JSON (or nests deeper than 128 levels).
    #[error("a message is not valid JSON")]
    Json(#[source] serde_json::Error),
    /// A JSON object that is neither a JSON-RPC request, notification nor reply.
    #[error("malformed JSON-RPC message: {0}")]
    BadMessage(String),
    /// A reply whose id names no request in flight.
    #[error("reply to unknown request id {0}")]
    UnknownReply(String),
    /// A reply of the wrong shape.
    #[error("malformed reply to {request} (id {id}): {reason}")]
    BadReply {
        /// The request's method.
        request: &'static str,
        /// The request's id.
        id: u64,
        /// What is wrong.
        reason: String,
    },
    /// A notification this session did not ask for, or at the wrong time.
    #[error("unexpected {method:?} notification: {reason}")]
    UnexpectedNotification {
        /// The notification's method.
        method: String,
        /// Why it is unexpected.
        reason: &'static str,
    },
    /// The schema cannot be read.
    #[error("bad schema of database {db}: {reason}")]
    BadSchema {
        /// The database.
        db: String,
        /// What is wrong.
        reason: String,
    },
    /// An update that is not a table-updates object.
    #[error("malformed update: {0}")]
    BadUpdates(String),
    /// An update of a table that is not monitored.
    #[error("update of table {0:?}, which is not monitored")]
    UnmonitoredTable(String),
    /// An update of a column that is not monitored.
    #[error("update of column {table}.{column}, which is not monitored")]
    UnmonitoredColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A row update of the wrong shape.
    #[error("malformed update of {table} row {uuid}: {reason}")]
    BadRowUpdate {
        /// The table.
        table: String,
        /// The row's UUID as sent (abbreviated).
        uuid: String,
        /// What is wrong.
        reason: String,
    },
    /// A column value that does not fit the column's type.
    #[error("bad value in {table} row {uuid} column {column}")]
    BadDatum {
        /// The table.
        table: String,
        /// The row.
        uuid: Uuid,
        /// The column.
        column: String,
        /// What is wrong with the value.
        #[source]
        source: DatumError,
    },
    /// An insert of a row that exists.
    #[error("insert of {table} row {uuid}, which exists")]
    RowExists {
        /// The table.
        table: String,
        /// The row.
        uuid: Uuid,
    },
    /// The server keeps sending requests but does not read our replies.
    #[error("{bytes} bytes of replies wait for the server to read them")]
    OutputBacklog {
        /// The unsent bytes.
        bytes: usize,
    },
    /// A modify or delete of a row that does not exist.
    #[error("{op} of {table} row {uuid}, which does not exist")]
    NoSuchRow {
        /// "modify" or "delete".
        op: &'static str,
        /// The table.
        table: String,
        /// The row.
        uuid: Uuid,
    },
}

/// A request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Schema,
    MonitorCond,
    Monitor,
    Transact {
        n_ops: usize,
    },
    Echo,
    /// The cancel of a restored session's monitor, before it monitors again.
    MonitorCancel,
}

impl Pending {
    fn method(self) -> &'static str {
        match self {
            Pending::Schema => "get_schema",
            Pending::MonitorCond => "monitor_cond",
            Pending::Monitor => "monitor",
            Pending::Transact { .. } => "transact",
            Pending::Echo => "echo",
            Pending::MonitorCancel => "monitor_cancel",
        }
    }
}

/// Where the connection is in its start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not connected (or `connected` not called yet).
    Idle,
    /// `get_schema` sent.
    Schema,
    /// A monitor request sent (`cond`: monitor_cond).
    Monitoring { cond: bool },
    /// The replica is complete; notifications of this kind follow.
    Synced { cond: bool },
    /// The schema or monitor request failed ([`Event::ServerError`]); transactions still work.
    Failed,
}

/// One row's validated change, applied once the whole update is validated.
struct Staged {
    table: String,
    uuid: Uuid,
    new: Option<Row>,
}

/// One connection's protocol state (see the module documentation).
#[derive(Debug)]
pub struct Session {
    /// Unknown requests from the server (logged at powers of two).
    unknown_requests: u64,
    db: String,
    monitor: Monitor,
    /// The monitored tables' columns and their types (from the schema).
    columns: BTreeMap<String, BTreeMap<String, ColumnType>>,
    phase: Phase,
    replica: Replica,
    splitter: Splitter,
    max_message: usize,
    out: Vec<u8>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    events: VecDeque<Event>,
    /// The schema as the server sent it (a hot upgrade hands it over with the replica).
    schema: Option<Value>,
    /// A restored session is moving its monitor to this version's columns
    /// ([`Session::restore`]): the old monitor's notifications are ignored, and the new
    /// monitor's reply replaces the replica.
    remonitoring: bool,
}

impl Session {
    /// A session for database `db` (e.g. "Open_vSwitch") that replicates `monitor`'s tables.
    /// Nothing happens until [`connected`](Session::connected).
    pub fn new(db: &str, monitor: Monitor) -> Session {
        Session {
            unknown_requests: 0,
            db: db.to_owned(),
            monitor,
            columns: BTreeMap::new(),
            phase: Phase::Idle,
            replica: Replica::default(),
            splitter: Splitter::new(MAX_MESSAGE),
            max_message: MAX_MESSAGE,
            out: Vec::new(),
            pending: HashMap::new(),
            next_id: 1,
            events: VecDeque::new(),
            schema: None,
            remonitoring: false,
        }
    }

    /// Limits one message's size (default [`MAX_MESSAGE`]), and the unsent replies to the
    /// server's own requests (a server that sends echo requests but never reads).
    pub fn set_max_message(&mut self, bytes: usize) {
        self.splitter = Splitter::new(bytes);
        self.max_message = bytes;
    }

    /// The database this session works on.
    pub fn db(&self) -> &str {
        &self.db
    }

    /// A new connection: fails the transactions in flight ([`CONNECTION_LOST`], retryable),
    /// forgets unsent output and the replica, and queues the schema request that starts the
    /// monitor.
    pub fn connected(&mut self) {
        self.lose_connection();
        self.replica = Replica::default();
        self.columns.clear();
        self.schema = None;
        self.phase = Phase::Schema;
        self.request(Pending::Schema, "get_schema", json!([self.db]));
    }

    /// The connection is gone: fails the transactions in flight now (so that the caller may
    /// queue them again after reconnecting) and forgets unsent output. The replica stays as
    /// it was until the next [`connected`](Session::connected).
    pub fn disconnected(&mut self) {
        self.lose_connection();
        self.phase = Phase::Idle;
    }

    fn lose_connection(&mut self) {
        self.remonitoring = false;
        let mut lost: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| matches!(p, Pending::Transact { .. }))
            .map(|(id, _)| *id)
            .collect();
        lost.sort_unstable();
        for id in lost {
            self.events.push_back(Event::TxnReply {
                id,
                result: Err(TxnError::new(CONNECTION_LOST.into(), None, None)),
            });
        }
        self.pending.clear();
        self.out.clear();
        self.splitter.reset();
    }

    /// Whether the replica is complete (the monitor's reply arrived on this connection).
    pub fn is_synced(&self) -> bool {
        matches!(self.phase, Phase::Synced { .. })
    }

    /// Whether notifications come as update2 (`monitor_cond`) rather than update.
    pub fn uses_monitor_cond(&self) -> bool {
        matches!(
            self.phase,
            Phase::Synced { cond: true } | Phase::Monitoring { cond: true }
        )
    }

    /// Parses what arrived. A protocol violation is an error; the caller drops the connection.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), SessionError> {
        while !bytes.is_empty() {
            let (n, msg) = self.splitter.advance(bytes)?;
            bytes = &bytes[n..];
            if let Some(msg) = msg {
                self.handle(&msg)?;
            }
        }
        Ok(())
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Queues a transaction of `ops` (see [`ops`](crate::ops)) on the database; returns its
    /// id, which its [`Event::TxnReply`] carries.
    pub fn transact(&mut self, ops: Vec<Value>) -> u64 {
        let n_ops = ops.len();
        let mut params = Vec::with_capacity(n_ops + 1);
        params.push(json!(self.db));
        params.extend(ops);
        self.request(
            Pending::Transact { n_ops },
            "transact",
            Value::Array(params),
        )
    }

    /// Queues an echo request (an inactivity probe). The server's own echo requests are
    /// answered without the caller.
    pub fn echo(&mut self) -> u64 {
        self.request(Pending::Echo, "echo", json!([]))
    }

    /// The bytes to write to the socket.
    pub fn pending_output(&self) -> &[u8] {
        &self.out
    }

    /// Records that the first `n` bytes of [`pending_output`](Session::pending_output) were
    /// written.
    pub fn consume_output(&mut self, n: usize) {
        let n = n.min(self.out.len());
        self.out.drain(..n);
    }

    /// The monitored tables as the server has them.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The monitored tables and their columns' types, once the schema arrived.
    pub fn monitored_columns(&self) -> &BTreeMap<String, BTreeMap<String, ColumnType>> {
        &self.columns
    }

    /// Whether a request (echo, transact, schema, monitor) awaits its reply.
    pub fn awaiting_reply(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Checks the replica's invariants: only monitored tables, every row with exactly the
    /// monitored columns, every value of its column's type, canonical and within its size.
    pub fn check_consistency(&self) -> Result<(), String> {
        for (t, rows) in &self.replica.tables {
            let cols = self
                .columns
                .get(t)
                .ok_or_else(|| format!("table {t} is not monitored"))?;
            for (u, row) in rows {
                if row.len() != cols.len() {
                    return Err(format!(
                        "{t} row {u} has {} columns, not {}",
                        row.len(),
                        cols.len()
                    ));
                }
                for (c, ty) in cols {
                    let d = row
                        .get(c)
                        .ok_or_else(|| format!("{t} row {u} lacks column {c}"))?;
                    if !ty.admits(d) {
                        return Err(format!("{t} row {u} column {c}: {d:?} is not of {ty:?}"));
                    }
                }
            }
        }
        Ok(())
    }

    fn send(&mut self, msg: &Value) {
        self.out.extend_from_slice(msg.to_string().as_bytes());
    }

    fn request(&mut self, kind: Pending, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.pending.insert(id, kind);
        self.send(&json!({"method": method, "params": params, "id": id}));
        id
    }

    fn handle(&mut self, msg: &[u8]) -> Result<(), SessionError> {
        let v: Value = serde_json::from_slice(msg).map_err(SessionError::Json)?;
        let Value::Object(mut o) = v else {
            return Err(SessionError::BadMessage("not an object".into()));
        };
        if let Some(method) = o.remove("method") {
            let Value::String(method) = method else {
                return Err(SessionError::BadMessage(format!(
                    "method {} is not a string",
                    abbrev(&method)
                )));
            };
            let params = match o.remove("params") {
                Some(Value::Array(p)) => p,
                Some(p) => {
                    return Err(SessionError::BadMessage(format!(
                        "{method} params {} are not an array",
                        abbrev(&p)
                    )))
                }
                None => Vec::new(),
            };
            match o.remove("id") {
                None | Some(Value::Null) => self.notification(method, params),
                Some(id) => {
                    if self.out.len() > self.max_message {
                        return Err(SessionError::OutputBacklog {
                            bytes: self.out.len(),
                        });
                    }
                    self.server_request(&method, params, id);
                    Ok(())
                }
            }
        } else if o.contains_key("result") || o.contains_key("error") {
            let idv = o.remove("id").unwrap_or(Value::Null);
            let id = idv
                .as_u64()
                .ok_or_else(|| SessionError::UnknownReply(abbrev(&idv)))?;
            let kind = self
                .pending
                .remove(&id)
                .ok_or_else(|| SessionError::UnknownReply(id.to_string()))?;
            let error = o.remove("error").unwrap_or(Value::Null);
            let result = o.remove("result").unwrap_or(Value::Null);
            if error.is_null() {
                self.reply(id, kind, result)
            } else {
                self.error_reply(id, kind, &error);
                Ok(())
            }
        } else {
            Err(SessionError::BadMessage(
                "neither a request nor a reply".into(),
            ))
        }
    }

    /// The server's request: `echo` is answered with its params; anything else with an error.
    fn server_request(&mut self, method: &str, params: Vec<Value>, id: Value) {
        if method == "echo" {
            self.send(&json!({"id": id, "result": params, "error": null}));
        } else {
            // A server repeating it must not flood the log: the 1st, 2nd, 4th, 8th... one.
            self.unknown_requests += 1;
            if self.unknown_requests.is_power_of_two() {
                log::warn!(
                    "ovsdb: the server sent an unknown request {method:?} ({} so far); \
                     answering with an error",
                    self.unknown_requests
                );
            }
            self.send(&json!({"id": id, "result": null, "error": "unknown method"}));
        }
    }

    fn notification(&mut self, method: String, params: Vec<Value>) -> Result<(), SessionError> {
        let cond = match method.as_str() {
            "update2" => true,
            "update" => false,
            "update3" => {
                return Err(SessionError::UnexpectedNotification {
                    method,
                    reason: "this client never asks for monitor_cond_since",
                })
            }
            _ => {
                log::debug!("ovsdb: ignoring notification {method:?}");
                return Ok(());
            }
        };
        if self.remonitoring && matches!(self.phase, Phase::Monitoring { .. }) {
            // The old monitor's, until the server has handled its cancel: the new
            // monitor's reply carries every row.
            return Ok(());
        }
        if self.phase != (Phase::Synced { cond }) {
            return Err(SessionError::UnexpectedNotification {
                method,
                reason: "no monitor of that kind is established",
            });
        }
        let [monitor_id, updates] = params.as_slice() else {
            return Err(SessionError::BadMessage(format!(
                "{method} has {} params, not 2",
                params.len()
            )));
        };
        if monitor_id.as_str() != Some(MONITOR_ID) {
            return Err(SessionError::UnexpectedNotification {
                method,
                reason: "it names another monitor",
            });
        }
        let changes = self.apply_updates(updates, cond, false)?;
        if !changes.is_empty() {
            self.events.push_back(Event::Changed(changes));
        }
        Ok(())
    }

    fn error_reply(&mut self, id: u64, kind: Pending, error: &Value) {
        let (text, details) = error_text(error);
        match kind {
            Pending::Transact { .. } => self.events.push_back(Event::TxnReply {
                id,
                result: Err(TxnError::new(text, details, None)),
            }),
            Pending::MonitorCond => {
                log::info!(
                    "ovsdb: the server refused monitor_cond ({text}); falling back to monitor"
                );
                self.send_monitor(false);
            }
            _ => {
                let error = match details {
                    Some(d) => format!("{text}: {d}"),
                    None => text,
                };
                log::warn!("ovsdb: {} failed: {error}", kind.method());
                if matches!(kind, Pending::Schema | Pending::Monitor) {
                    self.phase = Phase::Failed;
                }
                self.events.push_back(Event::ServerError { id, error });
            }
        }
    }

    fn reply(&mut self, id: u64, kind: Pending, result: Value) -> Result<(), SessionError> {
        let bad = |reason: String| SessionError::BadReply {
            request: kind.method(),
            id,
            reason,
        };
        match kind {
            Pending::Echo | Pending::MonitorCancel => Ok(()),
            Pending::Schema => {
                let schema = Schema::parse(&result).map_err(|reason| SessionError::BadSchema {
                    db: self.db.clone(),
                    reason,
                })?;
                self.columns = self.select_columns(&schema);
                self.schema = Some(result);
                self.send_monitor(true);
                Ok(())
            }
            Pending::MonitorCond | Pending::Monitor => {
                let cond = kind == Pending::MonitorCond;
                if std::mem::take(&mut self.remonitoring) {
                    self.replica = Replica::default();
                }
                self.apply_updates(&result, cond, true)?;
                for t in self.columns.keys() {
                    self.replica.tables.entry(t.clone()).or_default();
                }
                self.phase = Phase::Synced { cond };
                self.events.push_back(Event::Synced);
                Ok(())
            }
            Pending::Transact { n_ops } => {
                let Value::Array(results) = result else {
                    return Err(bad(format!("result {} is not an array", abbrev(&result))));
                };
                if results.len() < n_ops {
                    return Err(bad(format!(
                        "{} results for {n_ops} operations",
                        results.len()
                    )));
                }
                let mut failed = None;
                for (i, r) in results.iter().enumerate() {
                    match r {
                        Value::Object(o) => {
                            if let Some(e) = o.get("error") {
                                let (text, details) = error_text(&Value::Object(o.clone()));
                                if !e.is_string() {
                                    return Err(bad(format!(
                                        "operation {i}'s error is not a string"
                                    )));
                                }
                                failed.get_or_insert((i, text, details));
                            }
                        }
                        Value::Null => {}
                        other => {
                            return Err(bad(format!(
                                "operation {i}'s result {} is not an object",
                                abbrev(other)
                            )))
                        }
                    }
                }
                let result = match failed {
                    Some((i, text, details)) => {
                        Err(TxnError::new(text, details, (i < n_ops).then_some(i)))
                    }
                    None => Ok(results),
                };
                self.events.push_back(Event::TxnReply { id, result });
                Ok(())
            }
        }
    }

    /// The monitored tables and columns the schema has (the others left out with a warning).
    fn select_columns(&self, schema: &Schema) -> BTreeMap<String, BTreeMap<String, ColumnType>> {
        let mut out = BTreeMap::new();
        for (table, wanted) in &self.monitor.tables {
            let Some(have) = schema.tables.get(table) else {
                log::warn!(
                    "ovsdb: database {} has no table {table}; not monitored",
                    self.db
                );
                continue;
            };
            let mut cols = BTreeMap::new();
            if wanted.is_empty() {
                for (c, ty) in have {
                    if !c.starts_with('_') {
                        cols.insert(c.clone(), ty.clone());
                    }
                }
            }
            for c in wanted {
                match have.get(c) {
                    Some(ty) if !c.starts_with('_') => {
                        cols.insert(c.clone(), ty.clone());
                    }
                    _ => log::warn!(
                        "ovsdb: table {table} of {} has no column {c:?}; not monitored",
                        self.db
                    ),
                }
            }
            if !cols.is_empty() {
                out.insert(table.clone(), cols);
            }
        }
        out
    }

    fn send_monitor(&mut self, cond: bool) {
        let mut reqs = Map::new();
        for (t, cols) in &self.columns {
            let columns: Vec<&String> = cols.keys().collect();
            let req = if cond {
                json!([{ "columns": columns }])
            } else {
                json!({ "columns": columns })
            };
            reqs.insert(t.clone(), req);
        }
        let (kind, method) = if cond {
            (Pending::MonitorCond, "monitor_cond")
        } else {
            (Pending::Monitor, "monitor")
        };
        self.phase = Phase::Monitoring { cond };
        self.request(kind, method, json!([self.db, MONITOR_ID, reqs]));
    }

    /// Validates `updates` (table-updates2 if `v2`, else table-updates) whole, then applies
    /// it. `initial`: the monitor's reply, whose rows are all inserts.
    fn apply_updates(
        &mut self,
        updates: &Value,
        v2: bool,
        initial: bool,
    ) -> Result<Changes, SessionError> {
        let Value::Object(tables) = updates else {
            return Err(SessionError::BadUpdates(format!(
                "{} is not an object",
                abbrev(updates)
            )));
        };
        let mut staged = Vec::new();
        for (table, rows) in tables {
            let cols = self
                .columns
                .get(table)
                .ok_or_else(|| SessionError::UnmonitoredTable(table.clone()))?;
            let Value::Object(rows) = rows else {
                return Err(SessionError::BadUpdates(format!(
                    "table {table}'s update {} is not an object",
                    abbrev(rows)
                )));
            };
            let existing = self.replica.tables.get(table);
            for (uuid_text, ru) in rows {
                let bad = |reason: &str| SessionError::BadRowUpdate {
                    table: table.clone(),
                    uuid: uuid_text.chars().take(64).collect(),
                    reason: reason.to_owned(),
                };
                let uuid: Uuid = uuid_text.parse().map_err(|_| bad("not a UUID"))?;
                let old = existing.and_then(|t| t.get(&uuid));
                let Value::Object(ru) = ru else {
                    return Err(bad("not an object"));
                };
                let cx = RowCx { table, uuid, cols };
                let new = if v2 {
                    let [(op, body)] = ru.iter().collect::<Vec<_>>()[..] else {
                        return Err(bad("not exactly one of initial, insert, delete, modify"));
                    };
                    match op.as_str() {
                        "initial" | "insert" => Some(cx.insert(old, body)?),
                        "delete" if initial => return Err(bad("delete in the initial contents")),
                        "delete" => {
                            cx.existing("delete", old)?;
                            None
                        }
                        "modify" if initial => return Err(bad("modify in the initial contents")),
                        "modify" => Some(cx.modify(cx.existing("modify", old)?, body)?),
                        _ => return Err(bad("not exactly one of initial, insert, delete, modify")),
                    }
                } else {
                    if ru.keys().any(|k| k != "old" && k != "new") {
                        return Err(bad("a member other than old and new"));
                    }
                    if let Some(o) = ru.get("old") {
                        if !o.is_object() {
                            return Err(bad("old is not an object"));
                        }
                    }
                    match (ru.contains_key("old"), ru.get("new")) {
                        (false, Some(new)) => Some(cx.insert(old, new)?),
                        (true, Some(_)) if initial => {
                            return Err(bad("old in the initial contents"))
                        }
                        (true, Some(new)) => Some(cx.replace(cx.existing("modify", old)?, new)?),
                        (true, None) if initial => {
                            return Err(bad("delete in the initial contents"))
                        }
                        (true, None) => {
                            cx.existing("delete", old)?;
                            None
                        }
                        (false, None) => return Err(bad("neither old nor new")),
                    }
                };
                staged.push(Staged {
                    table: table.clone(),
                    uuid,
                    new,
                });
            }
        }
        let mut changes = Changes::default();
        for Staged { table, uuid, new } in staged {
            let rows = self.replica.tables.entry(table.clone()).or_default();
            let old = match new {
                Some(row) => rows.insert(uuid, row),
                None => rows.remove(&uuid),
            };
            let kind = match (&old, rows.contains_key(&uuid)) {
                (None, _) => &mut changes.inserted,
                (Some(_), true) => &mut changes.modified,
                (Some(_), false) => &mut changes.deleted,
            };
            kind.push((table.clone(), uuid));
            if let Some(old) = old {
                changes.old.insert((table, uuid), old);
            }
        }
        Ok(changes)
    }
}

/// The context of one row update: its table, row and the monitored columns' types.
struct RowCx<'a> {
    table: &'a str,
    uuid: Uuid,
    cols: &'a BTreeMap<String, ColumnType>,
}

impl RowCx<'_> {
    fn bad_datum(&self, column: &str, source: DatumError) -> SessionError {
        SessionError::BadDatum {
            table: self.table.to_owned(),
            uuid: self.uuid,
            column: column.to_owned(),
            source,
        }
    }

    fn columns<'v>(
        &self,
        body: &'v Value,
    ) -> Result<impl Iterator<Item = (&'v String, &'v Value, &ColumnType)>, SessionError> {
        let Value::Object(body) = body else {
            return Err(SessionError::BadRowUpdate {
                table: self.table.to_owned(),
                uuid: self.uuid.to_string(),
                reason: format!("row {} is not an object", abbrev(body)),
            });
        };
        body.iter()
            .map(|(c, v)| match self.cols.get(c) {
                Some(ty) => Ok((c, v, ty)),
                None => Err(SessionError::UnmonitoredColumn {
                    table: self.table.to_owned(),
                    column: c.clone(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Vec::into_iter)
    }

    fn existing<'r>(
        &self,
        op: &'static str,
        old: Option<&'r Row>,
    ) -> Result<&'r Row, SessionError> {
        old.ok_or_else(|| SessionError::NoSuchRow {
            op,
            table: self.table.to_owned(),
            uuid: self.uuid,
        })
    }

    /// A new row: the columns given, the others at their defaults.
    fn insert(&self, old: Option<&Row>, body: &Value) -> Result<Row, SessionError> {
        if old.is_some() {
            return Err(SessionError::RowExists {
                table: self.table.to_owned(),
                uuid: self.uuid,
            });
        }
        let mut row: Row = self
            .cols
            .iter()
            .map(|(c, ty)| (c.clone(), ty.default_datum()))
            .collect();
        for (c, v, ty) in self.columns(body)? {
            let d = ty.parse_datum(v).map_err(|e| self.bad_datum(c, e))?;
            row.insert(c.clone(), d);
        }
        Ok(row)
    }

    /// update2 `modify`: each column's diff applied.
    fn modify(&self, old: &Row, body: &Value) -> Result<Row, SessionError> {
        let mut row = old.clone();
        for (c, v, ty) in self.columns(body)? {
            let before = old.get(c).cloned().unwrap_or_else(|| ty.default_datum());
            let d = ty
                .apply_diff(&before, v)
                .map_err(|e| self.bad_datum(c, e))?;
            row.insert(c.clone(), d);
        }
        Ok(row)
    }

    /// update `new` of a modified row: the columns given replaced.
    fn replace(&self, old: &Row, body: &Value) -> Result<Row, SessionError> {
        let mut row = old.clone();
        for (c, v, ty) in self.columns(body)? {
            let d = ty.parse_datum(v).map_err(|e| self.bad_datum(c, e))?;
            row.insert(c.clone(), d);
        }
        Ok(row)
    }
}

/// An error value's text and details: a string, or an object with `error` and `details`.
fn error_text(e: &Value) -> (String, Option<String>) {
    match e {
        Value::String(s) => (s.clone(), None),
        Value::Object(o) => {
            let text = match o.get("error") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => abbrev(v),
                None => abbrev(e),
            };
            let details = o.get("details").map(|d| match d {
                Value::String(s) => s.clone(),
                d => abbrev(d),
            });
            (text, details)
        }
        other => (abbrev(other), None),
    }
}
