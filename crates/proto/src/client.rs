//! A client of the control socket: one request, one typed reply.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::{Request, CTL_SOCKET};

/// How long a reply may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request got no result.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens at the control socket.
    #[error("cannot reach ferrovsd at {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("send")]
    Send(#[source] io::Error),
    #[error("receive")]
    Receive(#[source] io::Error),
    /// The reply is not JSON, or not the shape the request's result has.
    #[error("malformed response")]
    Malformed(#[source] serde_json::Error),
    /// The daemon refused the request: its message.
    #[error("{0}")]
    Daemon(String),
}

impl ClientError {
    /// The one-line message the CLI prints: the error with its cause, and for an unreachable
    /// daemon a hint.
    pub fn message(&self) -> String {
        match self {
            ClientError::Connect { path, source } => format!(
                "cannot reach ferrovsd at {}: {source} (is it running? --run-dir?)",
                path.display()
            ),
            ClientError::Send(e) => format!("send: {e}"),
            ClientError::Receive(e) => format!("receive: {e}"),
            ClientError::Malformed(e) => format!("malformed response: {e}"),
            ClientError::Daemon(m) => m.clone(),
        }
    }
}

/// The envelope as a client reads it: the result is parsed once its type is known.
#[derive(Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<String>,
}

/// A client of the daemon whose run directory is `run_dir`; each call is one connection.
#[derive(Debug, Clone)]
pub struct Client {
    run_dir: PathBuf,
}

impl Client {
    pub fn new(run_dir: impl Into<PathBuf>) -> Client {
        Client {
            run_dir: run_dir.into(),
        }
    }

    /// The run directory this client talks to.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Sends `req` and parses its result as `R` (`()` for commands that answer null,
    /// `serde_json::Value` for any).
    pub fn call<R: DeserializeOwned>(&self, req: &Request) -> Result<R, ClientError> {
        let v = self.call_raw(req)?;
        serde_json::from_value(v).map_err(ClientError::Malformed)
    }

    /// Sends `req` and returns its result untyped.
    pub fn call_raw(&self, req: &Request) -> Result<serde_json::Value, ClientError> {
        self.open(req).map(|(v, _)| v)
    }

    /// Sends a request that streams (`capture`): its result, then the connection to read
    /// the stream's lines from ([`Stream::next_line`]), without a timeout.
    pub fn stream(&self, req: &Request) -> Result<(serde_json::Value, Stream), ClientError> {
        let (v, r) = self.open(req)?;
        r.get_ref()
            .set_read_timeout(None)
            .map_err(ClientError::Receive)?;
        Ok((v, Stream { r }))
    }

    fn open(
        &self,
        req: &Request,
    ) -> Result<(serde_json::Value, BufReader<UnixStream>), ClientError> {
        let path = self.run_dir.join(CTL_SOCKET);
        let mut s = UnixStream::connect(&path).map_err(|source| ClientError::Connect {
            path: path.clone(),
            source,
        })?;
        s.set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(ClientError::Receive)?;
        let mut line = serde_json::to_string(req).map_err(ClientError::Malformed)?;
        line.push('\n');
        s.write_all(line.as_bytes()).map_err(ClientError::Send)?;
        let mut resp = String::new();
        let mut reader = BufReader::new(s);
        reader.read_line(&mut resp).map_err(ClientError::Receive)?;
        let r: Envelope = serde_json::from_str(&resp).map_err(ClientError::Malformed)?;
        if r.ok {
            Ok((r.result.unwrap_or(serde_json::Value::Null), reader))
        } else {
            Err(ClientError::Daemon(
                r.error.unwrap_or_else(|| "request failed".into()),
            ))
        }
    }
}

/// The lines a streaming request's reply is followed by.
#[derive(Debug)]
pub struct Stream {
    r: BufReader<UnixStream>,
}

impl Stream {
    /// Whether bytes of further lines are read already (a caller flushes its output when
    /// none are).
    pub fn buffered(&self) -> bool {
        !self.r.buffer().is_empty()
    }

    /// The next line as a `T`; `None` when the daemon closed the connection.
    pub fn next_line<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ClientError> {
        let mut line = String::new();
        match self.r.read_line(&mut line).map_err(ClientError::Receive)? {
            0 => Ok(None),
            _ => serde_json::from_str(&line)
                .map(Some)
                .map_err(ClientError::Malformed),
        }
    }
}
