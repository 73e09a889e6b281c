//! A synchronised session as plain data, so that another process can go on with the same
//! connection (a hot upgrade: `docs/upgrade.md`, "The OVSDB connection").
//!
//! What the server holds for the connection is the monitor (its id, [`MONITOR_ID`](super::MONITOR_ID), the
//! tables and columns it was asked for, and whether it sends update2 or update
//! notifications) and the requests it has not answered; what the client holds is the replica
//! those notifications built, the schema that types its columns, the requests it awaits, the
//! id of the next one, and the bytes between the two: read and not yet handled, queued and
//! not yet written. [`SessionState`] is all of that, so the new process neither asks for the
//! schema nor monitors again, and every notification the server sends is applied exactly
//! once, by whichever process reads it.
//!
//! Invariants:
//! * Only a synchronised session is exported ([`Session::export`] says `None` otherwise:
//!   the caller lets the new process reconnect). Its events must have been taken first
//!   (they are not part of the state).
//! * [`Session::restore`] treats the state as untrusted: the schema is parsed again, the
//!   columns it gives for this client's [`Monitor`] must be exactly those the server
//!   monitors (a new version that reads more columns reconnects instead of running on a
//!   replica without them), the replica goes through the same validation as a monitor's
//!   reply, request ids are unique and below the next id, buffers are bounded, and the
//!   unhandled input is fed through the same parser as the socket's bytes.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Monitor, Pending, Phase, Session, SessionError};
use crate::schema::{ColumnType, Schema};

/// The most requests awaiting a reply a restored session takes (the daemon has one
/// write-back, one statistics transaction and one echo out at a time).
pub const MAX_PENDING: usize = 1024;

/// A synchronised session as plain data (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    /// The database.
    pub db: String,
    /// The database's schema, as the server sent it in reply to `get_schema`.
    pub schema: Value,
    /// The tables and the columns the server monitors for this connection (monitor id
    /// [`MONITOR_ID`](super::MONITOR_ID)).
    pub monitored: BTreeMap<String, Vec<String>>,
    /// Notifications come as update2 (`monitor_cond`), else as update (`monitor`).
    pub cond: bool,
    /// The replica, as table-updates2 whose rows are all `initial`.
    pub replica: Value,
    /// Requests the server has not answered yet.
    #[serde(default)]
    pub pending: Vec<PendingState>,
    /// The id of the next request.
    pub next_id: u64,
    /// Bytes read and not yet handled: the beginning of a message.
    #[serde(default, with = "hex")]
    pub input: Vec<u8>,
    /// Bytes not yet written.
    #[serde(default, with = "hex")]
    pub output: Vec<u8>,
}

/// A request awaiting its reply, and what it was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum PendingState {
    /// A transaction of `n_ops` operations.
    Transact { id: u64, n_ops: usize },
    /// An echo (an inactivity probe).
    Echo { id: u64 },
}

impl PendingState {
    fn id(self) -> u64 {
        match self {
            PendingState::Transact { id, .. } | PendingState::Echo { id } => id,
        }
    }
}

/// Why a handed-over session is refused (the caller closes the connection and makes a new
/// one).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The state is for another database.
    #[error("the state is for database {theirs:?}, not {ours:?}")]
    Database { theirs: String, ours: String },
    /// The schema does not parse.
    #[error("bad schema: {0}")]
    Schema(String),
    /// The server monitors other columns than this client reads.
    #[error("the server monitors other columns than this version reads ({0})")]
    Monitor(String),
    /// The replica is not a valid monitor reply for the schema.
    #[error("bad replica")]
    Replica(#[source] SessionError),
    /// The replica breaks an invariant.
    #[error("inconsistent replica: {0}")]
    Inconsistent(String),
    /// Too many requests in flight.
    #[error("{0} requests in flight, more than {MAX_PENDING}")]
    TooManyPending(usize),
    /// A request id twice, or not below the next id.
    #[error("request id {id} is twice in flight or not below the next id {next}")]
    PendingId { id: u64, next: u64 },
    /// A buffer larger than a message may be.
    #[error("{what}: {len} bytes, more than {max}")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// The unhandled input does not parse.
    #[error("bad unhandled input")]
    Input(#[source] SessionError),
}

impl Session {
    /// The session as plain data, when it is synchronised (`None` otherwise: while it asks
    /// for the schema or the monitor, a new connection costs nothing). Take its events first.
    pub fn export(&self) -> Option<SessionState> {
        let Phase::Synced { cond } = self.phase else {
            return None;
        };
        let schema = self.schema.clone()?;
        let mut replica = Map::new();
        for (table, rows) in &self.replica.tables {
            let mut t = Map::new();
            for (uuid, row) in rows {
                let cols: Map<String, Value> =
                    row.iter().map(|(c, d)| (c.clone(), d.to_json())).collect();
                let mut r = Map::new();
                r.insert("initial".into(), Value::Object(cols));
                t.insert(uuid.to_string(), Value::Object(r));
            }
            replica.insert(table.clone(), Value::Object(t));
        }
        let mut pending: Vec<PendingState> = self
            .pending
            .iter()
            .filter_map(|(&id, &p)| match p {
                Pending::Transact { n_ops } => Some(PendingState::Transact { id, n_ops }),
                Pending::Echo => Some(PendingState::Echo { id }),
                // Not while synced.
                Pending::Schema
                | Pending::Monitor
                | Pending::MonitorCond
                | Pending::MonitorCancel => None,
            })
            .collect();
        pending.sort_by_key(|p| p.id());
        Some(SessionState {
            db: self.db.clone(),
            schema,
            monitored: self.monitored(),
            cond,
            replica: Value::Object(replica),
            pending,
            next_id: self.next_id,
            input: self.splitter.partial().to_vec(),
            output: self.out.clone(),
        })
    }

    /// The monitored tables and columns, by name.
    fn monitored(&self) -> BTreeMap<String, Vec<String>> {
        self.columns
            .iter()
            .map(|(t, cols)| (t.clone(), cols.keys().cloned().collect()))
            .collect()
    }

    /// A session that goes on from `st` on the same connection (untrusted: see the module
    /// documentation). Whole messages in `st.input` are handled here: their events wait in
    /// [`poll_event`](Session::poll_event).
    pub fn restore(db: &str, monitor: Monitor, st: &SessionState) -> Result<Session, RestoreError> {
        if st.db != db {
            return Err(RestoreError::Database {
                theirs: st.db.clone(),
                ours: db.to_owned(),
            });
        }
        let mut s = Session::new(db, monitor);
        let schema = Schema::parse(&st.schema).map_err(RestoreError::Schema)?;
        let ours = s.select_columns(&schema);
        // The columns the server monitors for this connection: the old version's, which
        // may differ from this version's. The replica is restored with those, then the
        // monitor is moved to ours on the same connection (`remonitor`).
        s.columns = BTreeMap::new();
        for (t, cols) in &st.monitored {
            let mut typed = BTreeMap::new();
            for c in cols {
                let ty = schema.tables.get(t).and_then(|have| have.get(c));
                let Some(ty) = ty.filter(|_| !c.starts_with('_')) else {
                    return Err(RestoreError::Monitor(format!(
                        "column {t}.{c} is not in the schema"
                    )));
                };
                typed.insert(c.clone(), ty.clone());
            }
            s.columns.insert(t.clone(), typed);
        }
        let widen = s.columns != ours;
        for (what, len) in [
            ("unhandled input", st.input.len()),
            ("output", st.output.len()),
        ] {
            if len > s.max_message {
                let max = s.max_message;
                return Err(RestoreError::TooLarge { what, len, max });
            }
        }
        if st.pending.len() > MAX_PENDING {
            return Err(RestoreError::TooManyPending(st.pending.len()));
        }
        let mut pending = HashMap::new();
        for p in &st.pending {
            let kind = match *p {
                PendingState::Transact { n_ops, .. } => Pending::Transact { n_ops },
                PendingState::Echo { .. } => Pending::Echo,
            };
            let id = p.id();
            if id >= st.next_id || pending.insert(id, kind).is_some() {
                let next = st.next_id;
                return Err(RestoreError::PendingId { id, next });
            }
        }
        s.apply_updates(&st.replica, true, true)
            .map_err(RestoreError::Replica)?;
        for t in s.columns.keys() {
            s.replica.tables.entry(t.clone()).or_default();
        }
        s.check_consistency().map_err(RestoreError::Inconsistent)?;
        s.schema = Some(st.schema.clone());
        s.phase = Phase::Synced { cond: st.cond };
        s.pending = pending;
        s.next_id = st.next_id;
        s.out = st.output.clone();
        s.feed(&st.input).map_err(RestoreError::Input)?;
        if widen {
            s.remonitor(ours);
        }
        Ok(s)
    }

    /// Moves a restored session's monitor to `columns` (this version's) on the same
    /// connection: ovsdb-server cannot change a monitor's columns, so the monitor is
    /// cancelled and made again under the same id (the server handles the two in order).
    /// Until the reply, the session is not synchronised and the old monitor's notifications
    /// are ignored; the reply replaces the replica and says [`Event::Synced`](super::Event),
    /// as a new connection's does.
    fn remonitor(&mut self, columns: BTreeMap<String, BTreeMap<String, ColumnType>>) {
        let cond = self.uses_monitor_cond();
        log::info!(
            "ovsdb: the handed-over monitor has other columns than this version reads; \
             monitoring again on the same connection"
        );
        self.request(
            Pending::MonitorCancel,
            "monitor_cancel",
            serde_json::json!([super::MONITOR_ID]),
        );
        self.columns = columns;
        self.remonitoring = true;
        self.send_monitor(cond);
    }
}

/// `Vec<u8>` as a lowercase hex string (bytes read may end inside a UTF-8 character).
mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(b.len() * 2);
        for x in b {
            out.push(char::from(DIGITS[usize::from(x >> 4)]));
            out.push(char::from(DIGITS[usize::from(x & 15)]));
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let digit = |c: u8| -> Result<u8, D::Error> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                _ => Err(serde::de::Error::custom("not a lowercase hex digit")),
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
