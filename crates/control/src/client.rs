//! A client of the control socket (used by the `ferrovs` CLI and by tests).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::daemon::CTL_SOCKET;
use crate::proto::{Request, Response};

/// Sends one request to the daemon whose run directory is `run_dir`; returns its result or
/// its error message.
pub fn call(run_dir: &Path, req: &Request) -> Result<Value, String> {
    let path = run_dir.join(CTL_SOCKET);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        format!(
            "cannot reach ferrovsd at {}: {e} (is it running? --run-dir?)",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut resp = String::new();
    BufReader::new(&s)
        .read_line(&mut resp)
        .map_err(|e| format!("receive: {e}"))?;
    let r: Response =
        serde_json::from_str(&resp).map_err(|e| format!("malformed response: {e}"))?;
    if r.ok {
        Ok(r.result.unwrap_or(Value::Null))
    } else {
        Err(r.error.unwrap_or_else(|| "request failed".into()))
    }
}
