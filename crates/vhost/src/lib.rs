//! vhost-user for ferrovs.
//!
//! * [`msg`]: the wire protocol: request codes, header, payloads parsed into checked views.
//! * [`conn`]: non-blocking message framing over a unix socket with fds (a frontend that
//!   stops halfway or never reads replies stalls only its own connection).
//! * [`virtqueue`]: the per-queue datapath: dequeue guest TX chains into packet buffers,
//!   enqueue packets into guest RX chains (mergeable buffers), every guest value checked.
//! * [`device`]: the backend state machine: one table of which message does what, which
//!   carry fds and which stop the datapath.
//! * [`state`]: a device as plain data (hot upgrade): export, and restore as untrusted input.
//! * [`frontend`]: the driver side, used by `ferrovs-gen` and by tests as a mock guest.
//! * [`features`]: feature bits.
#![forbid(unsafe_code)]

pub mod conn;
pub mod device;
pub mod features;
pub mod frontend;
mod frontend_packed;
pub mod msg;
pub mod state;
pub mod stats;
pub mod virtqueue;
