//! The ferrovsd control protocol: typed requests and responses, and its client.
#![forbid(unsafe_code)]

use std::path::PathBuf;

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
