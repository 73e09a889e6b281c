//! Connection tracking for ferrovs: the state of every connection a `ct()` action sees.
//!
//! * [`mod@tuple`]: the connection key of a frame, parsed from untrusted bytes once;
//! * [`tcp`]: TCP's state machine and window tracking with the semantics of Linux's
//!   `nf_conntrack_proto_tcp`;
//! * [`proto`]: UDP, ICMP/ICMPv6 and generic protocols, and the timeouts;
//! * [`table`]: the sharded table and [`Tracker::execute`], the call the datapath makes;
//! * [`state`]: the table as versioned plain data for hot upgrade, restored as untrusted;
//! * [`build`]: a builder of test frames (the crate's test double);
//! * [`dump`]: the connections as the operator lists them;
//! * [`live`]: limits and timeouts changed while PMDs run.
//!
//! The design, the states and the differences from Linux and OVS are in `docs/conntrack.md`.
//! * [`nat`]: SNAT/DNAT bindings, the search for a free tuple and the rewrite of frames.
//!
//! The datapath's PMDs call [`Tracker::execute_with`] / [`Tracker::execute_offloaded`] for
//! the `ct()` action (`crates/datapath/src/flow/input.rs`).
#![forbid(unsafe_code)]

pub mod build;
pub mod dump;
pub mod live;
pub mod nat;
pub mod proto;
pub mod state;
pub mod table;
pub mod tcp;
pub mod tuple;

pub use dump::ConnInfo;
pub use live::TIMEOUT_NAMES;
pub use nat::{Nat, NatError, NatKind, NatRange};
pub use proto::Timeouts;
pub use state::{NatState, StateError, TableState};
pub use table::{Commit, Config, Counters, CtResult, CtState, Tracker};
pub use tcp::{TcpConfig, TcpState, TcpTimeouts};
pub use tuple::{Malformed, Tuple};
