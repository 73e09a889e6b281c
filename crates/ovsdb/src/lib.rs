//! A sans-IO OVSDB client (RFC 7047): the JSON-RPC framing, a replica of monitored tables
//! kept by `monitor_cond` (update2) or `monitor` notifications, transactions and echo.
//!
//! The caller owns the socket ([`Stream`], non-blocking, in its own poll loop) and moves
//! bytes: what it reads goes to [`Session::feed`], what [`Session::pending_output`] holds goes
//! to the socket, and [`Session::poll_event`] says what happened ([`Event`]). Nothing here
//! blocks, spawns or sleeps, so one thread can serve the database connection beside every
//! other socket, and every input the server sends is validated ([`SessionError`]) before it
//! touches the replica.
//!
//! ```
//! use ferrovs_ovsdb::{Monitor, Session};
//! let mut s = Session::new("Open_vSwitch", Monitor::new().table("Bridge", &["name", "ports"]));
//! s.connected(); // after the socket connected: queues get_schema, then the monitor
//! assert!(s.pending_output().starts_with(b"{"));
//! ```
#![forbid(unsafe_code)]

mod datum;
pub mod framing;
pub mod ops;
mod remote;
pub mod schema;
mod session;
mod uuid;

pub use datum::{Atom, Datum, DatumError, Row};
pub use remote::{Remote, RemoteError, Stream, CONNECT_TIMEOUT, DEFAULT_PORT};
pub use session::{
    Changes, Event, Monitor, PendingState, Replica, RestoreError, Session, SessionError,
    SessionState, TxnError, CONNECTION_LOST, MAX_MESSAGE, MAX_PENDING, MONITOR_ID,
};
pub use uuid::{Uuid, UuidError};

#[cfg(test)]
mod session_tests;
