//! The ferrovsd control protocol: typed requests and responses, and its client.
//!
//! A client connects to `RUN_DIR/ferrovs.ctl` ([`CTL_SOCKET`]), writes one JSON object per
//! line and reads one JSON object per line back. Requests ([`Request`]) are tagged by
//! `"cmd"`; responses are `{"ok": true, "result": ...}` or `{"ok": false, "error": "message"}`
//! ([`Response`]); each command's result has its own type in [`reply`]. See
//! `docs/control-protocol.md` for every command.
//!
//! This crate depends on serde alone, so that the CLI, the fuzz targets and any other client
//! build without the datapath.
#![forbid(unsafe_code)]

use std::path::PathBuf;

pub mod capture;
mod client;
pub mod reply;
mod request;

pub use client::{Client, ClientError, Stream};
pub use reply::Reply;
pub use request::{Request, Response, MAX_REQUEST};

/// The control socket's file name in the run directory.
pub const CTL_SOCKET: &str = "ferrovs.ctl";

/// The environment variable that names the run directory when `--run-dir` is not given.
pub const RUN_DIR_ENV: &str = "FERROVS_RUN_DIR";

/// The run directory when neither `--run-dir` nor `$FERROVS_RUN_DIR` names one.
pub const DEFAULT_RUN_DIR: &str = "/run/ferrovs";

/// The run directory the binaries use by default: `$FERROVS_RUN_DIR`, else `/run/ferrovs`.
pub fn default_run_dir() -> PathBuf {
    std::env::var_os(RUN_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_RUN_DIR.into())
}
