//! Where the database is (`unix:PATH`, `tcp:IP:PORT`) and the socket to it.
//!
//! The session itself does no I/O; these are the few lines a caller needs to open the
//! connection it then drives (non-blocking, in its own poll loop).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// OVSDB's default TCP port, used when `tcp:IP` names none.
pub const DEFAULT_PORT: u16 = 6640;

/// How long [`Stream::connect`] waits for a TCP connection: a peer that does not answer
/// must not hold the caller's thread for the kernel's minutes of SYN retries.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// An OVSDB server's address, in ovs-vsctl's `--db` syntax.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Remote {
    /// `unix:PATH`
    Unix(PathBuf),
    /// `tcp:IP:PORT` (IPv6 as `tcp:[::1]:6640`); the port defaults to 6640.
    Tcp(SocketAddr),
}

/// A remote that is neither `unix:PATH` nor `tcp:IP[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not unix:PATH or tcp:IP:PORT")]
pub struct RemoteError(pub String);

impl FromStr for Remote {
    type Err = RemoteError;

    fn from_str(s: &str) -> Result<Remote, RemoteError> {
        let err = || RemoteError(s.to_owned());
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(err());
            }
            return Ok(Remote::Unix(PathBuf::from(path)));
        }
        let addr = s.strip_prefix("tcp:").ok_or_else(err)?;
        if let Ok(a) = addr.parse::<SocketAddr>() {
            return Ok(Remote::Tcp(a));
        }
        let ip = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']'));
        let ip: IpAddr = ip.unwrap_or(addr).parse().map_err(|_| err())?;
        Ok(Remote::Tcp(SocketAddr::new(ip, DEFAULT_PORT)))
    }
}

impl fmt::Display for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Remote::Unix(p) => write!(f, "unix:{}", p.display()),
            Remote::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A connection to an OVSDB server.
#[derive(Debug)]
pub enum Stream {
    /// A Unix-domain stream socket.
    Unix(UnixStream),
    /// A TCP connection (Nagle off: requests are small and latency matters).
    Tcp(TcpStream),
}

impl Stream {
    /// Connects (blocking: a local socket answers at once; a TCP peer gets at most
    /// [`CONNECT_TIMEOUT`], and the caller retries with backoff), then makes the socket
    /// non-blocking.
    pub fn connect(remote: &Remote) -> io::Result<Stream> {
        let s = match remote {
            Remote::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
            Remote::Tcp(a) => {
                let t = TcpStream::connect_timeout(a, CONNECT_TIMEOUT)?;
                t.set_nodelay(true)?;
                Stream::Tcp(t)
            }
        };
        s.set_nonblocking(true)?;
        Ok(s)
    }

    /// Makes the socket blocking or not.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        for (s, shown) in [
            (
                "unix:/run/openvswitch/db.sock",
                "unix:/run/openvswitch/db.sock",
            ),
            ("tcp:127.0.0.1:6641", "tcp:127.0.0.1:6641"),
            ("tcp:[::1]:6640", "tcp:[::1]:6640"),
            ("tcp:10.0.0.1", "tcp:10.0.0.1:6640"),
            ("tcp:[fe80::1]", "tcp:[fe80::1]:6640"),
        ] {
            let r: Remote = s.parse().unwrap();
            assert_eq!(r.to_string(), shown);
            assert_eq!(shown.parse::<Remote>().unwrap(), r);
        }
        for bad in [
            "",
            "unix:",
            "ssl:1.2.3.4:6640",
            "tcp:host:6640",
            "tcp:1.2.3.4:x",
            "/path",
        ] {
            assert!(bad.parse::<Remote>().is_err(), "{bad}");
        }
    }

    #[test]
    fn connect_unix() {
        let dir = std::env::temp_dir().join(format!("ferrovs-ovsdb-remote-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sock");
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut s = Stream::connect(&Remote::Unix(path.clone())).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(
            s.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        peer.write_all(b"{}").unwrap();
        s.set_nonblocking(false).unwrap();
        assert_eq!(s.read(&mut buf).unwrap(), 2);
        assert!(s.as_raw_fd() >= 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn connect_tcp() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let remote = Remote::Tcp(l.local_addr().unwrap());
        let mut s = Stream::connect(&remote).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.write_all(b"{}").unwrap();
        s.set_nonblocking(false).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(s.read(&mut buf).unwrap(), 2);
        s.write_all(b"{}").unwrap();
        assert_eq!(peer.read(&mut buf).unwrap(), 2);
    }
}
