//! systemd's service notification protocol (`sd_notify(3)`), the sending side.
//!
//! A service started with `Type=notify` finds a `SOCK_DGRAM` unix socket in `$NOTIFY_SOCKET`
//! (a path, or `@NAME` for an abstract address) and sends it datagrams of `KEY=VALUE` lines:
//! `READY=1`, `STATUS=...`, `WATCHDOG=1`, `STOPPING=1`, `MAINPID=N`. With `WatchdogSec=` set,
//! `$WATCHDOG_USEC` gives the period and `$WATCHDOG_PID` the process it is meant for.
//! systemd documents the protocol as stable (systemd.io, "Interface Portability and
//! Stability"); it is a single `sendto(2)`, which `std` does for both address kinds without
//! raw system calls of our own, so we write it here rather than take a crate: the daemon needs to choose
//! the socket and the watchdog period itself at a hot upgrade (`docs/packaging.md`), which
//! the crates' environment-only entry points do not allow.
//!
//! Sending never blocks (the socket is non-blocking) and never fails the caller: a service
//! manager that is gone or slow loses a status line, the switch goes on.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The environment variable with the notification socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// The environment variable with the watchdog period in microseconds.
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The environment variable with the pid the watchdog is meant for.
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Why a notification socket address is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddrError {
    #[error("{NOTIFY_SOCKET} is empty")]
    Empty,
    #[error("{NOTIFY_SOCKET} is neither an absolute path nor @NAME: {0:?}")]
    Relative(String),
    #[error("{NOTIFY_SOCKET} is too long for a unix socket address ({0} bytes)")]
    TooLong(usize),
}

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
    /// The address as given, for messages.
    name: String,
}

/// A `$NOTIFY_SOCKET` value as a socket address.
pub fn parse_addr(s: &str) -> Result<SocketAddr, AddrError> {
    // sun_path is 108 bytes; a path needs its NUL, an abstract name its leading NUL.
    const MAX: usize = 107;
    if s.is_empty() {
        return Err(AddrError::Empty);
    }
    if s.len() > MAX {
        return Err(AddrError::TooLong(s.len()));
    }
    if let Some(name) = s.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        return SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|_| AddrError::TooLong(s.len()));
    }
    if !s.starts_with('/') {
        return Err(AddrError::Relative(s.into()));
    }
    SocketAddr::from_pathname(s).map_err(|_| AddrError::TooLong(s.len()))
}

impl Notifier {
    /// A notifier for the socket named `addr` (a path or `@NAME`).
    pub fn new(addr: &str) -> io::Result<Notifier> {
        let parsed =
            parse_addr(addr).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        Ok(Notifier {
            sock,
            addr: parsed,
            name: addr.into(),
        })
    }

    /// The notifier `$NOTIFY_SOCKET` names, if it names one (else the reason, for the log).
    pub fn from_env() -> Option<io::Result<Notifier>> {
        let v = std::env::var(NOTIFY_SOCKET).ok()?;
        Some(Notifier::new(&v))
    }

    /// The socket's address as given.
    pub fn addr(&self) -> &str {
        &self.name
    }

    /// Sends one datagram of `KEY=VALUE` lines.
    pub fn send(&self, msg: &str) -> io::Result<()> {
        self.sock
            .send_to_addr(msg.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

/// A `STATUS=` value: one line (a newline would start another assignment).
pub fn status_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The watchdog period systemd asks for, from the values of `$WATCHDOG_USEC` and
/// `$WATCHDOG_PID`: `None` when there is none, it is 0 or unparsable, or it is meant for
/// another process (`pid` is ours). `any_pid`: a daemon taking over at a hot upgrade
/// accepts a period meant for the process that started it (it becomes the main process).
pub fn watchdog_period(
    usec: Option<&str>,
    wd_pid: Option<&str>,
    pid: u32,
    any_pid: bool,
) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(p) = wd_pid {
        if !any_pid && p.trim().parse::<u32>().ok() != Some(pid) {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

/// [`watchdog_period`] of this process's environment.
pub fn watchdog_from_env(any_pid: bool) -> Option<Duration> {
    watchdog_period(
        std::env::var(WATCHDOG_USEC).ok().as_deref(),
        std::env::var(WATCHDOG_PID).ok().as_deref(),
        std::process::id(),
        any_pid,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::linux::net::SocketAddrExt;

    #[test]
    fn addresses_parse_as_systemd_writes_them() {
        let a = parse_addr("/run/systemd/notify").unwrap();
        assert_eq!(
            a.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        let a = parse_addr("@/org/freedesktop/systemd1/notify/123").unwrap();
        assert_eq!(
            a.as_abstract_name(),
            Some(&b"/org/freedesktop/systemd1/notify/123"[..])
        );
        assert_eq!(parse_addr("").unwrap_err(), AddrError::Empty);
        assert!(matches!(
            parse_addr("run/notify"),
            Err(AddrError::Relative(_))
        ));
        let long = format!("/{}", "x".repeat(200));
        assert_eq!(parse_addr(&long).unwrap_err(), AddrError::TooLong(201));
    }

    #[test]
    fn datagrams_reach_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("ferrovs-sdnotify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap()).unwrap();
        n.send("READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=up");
        std::fs::remove_dir_all(&dir).unwrap();

        let name = format!("ferrovs-sdnotify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
            .unwrap();
        let n = Notifier::new(&format!("@{name}")).unwrap();
        n.send("WATCHDOG=1").unwrap();
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn a_missing_listener_is_an_error_not_a_hang() {
        let n = Notifier::new("/nonexistent/ferrovs/notify").unwrap();
        assert!(n.send("READY=1").is_err());
        assert!(Notifier::new("relative").is_err());
    }

    #[test]
    fn the_watchdog_period_is_for_this_process_only() {
        let p = |u, w, any| watchdog_period(u, w, 42, any);
        assert_eq!(
            p(Some("3000000"), Some("42"), false),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            p(Some("3000000"), None, false),
            Some(Duration::from_secs(3))
        );
        assert_eq!(p(Some("3000000"), Some("41"), false), None);
        assert_eq!(
            p(Some("3000000"), Some("41"), true),
            Some(Duration::from_secs(3))
        );
        assert_eq!(p(Some("0"), None, false), None);
        assert_eq!(p(Some("soon"), None, false), None);
        assert_eq!(p(None, Some("42"), false), None);
    }

    #[test]
    fn a_status_is_one_line() {
        assert_eq!(status_line("a\nb\rc"), "a b c");
    }
}
