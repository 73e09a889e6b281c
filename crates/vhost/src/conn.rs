//! Message framing on a vhost-user socket.
//!
//! The backend side is non-blocking: [`Conn::poll_message`] reads only the bytes the current
//! message still needs (so fds of the next message are never taken early) and keeps partial
//! messages across calls; replies that cannot be written at once are queued, up to a bound
//! past which a peer that never reads is cut off. A stalled or hostile frontend therefore
//! costs its own connection only.
//!
//! The frontend side (`ferrovs-gen`, tests) uses the same framing in blocking mode.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use ferrovs_sys::os;

use crate::msg::{self, Header, ParseError, HEADER_LEN};

/// Replies queued for a peer that does not read them, before it is disconnected.
pub const MAX_PENDING_OUT: usize = 64 * 1024;

/// What reading produced.
#[derive(Debug)]
pub enum Incoming {
    /// A complete, framed message (payload not yet parsed).
    Message(Header, Vec<u8>, Vec<OwnedFd>),
    /// Nothing complete yet.
    Pending,
    /// The peer closed the connection.
    Closed,
}

/// Why a connection must be dropped.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("socket error")]
    Io(#[from] io::Error),
    #[error("bad message header")]
    Header(#[from] ParseError),
    #[error("peer does not read replies ({0} bytes queued)")]
    Backlog(usize),
}

/// One vhost-user connection.
#[derive(Debug)]
pub struct Conn {
    sock: UnixStream,
    head: [u8; HEADER_LEN],
    head_len: usize,
    header: Option<Header>,
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
    out: Vec<u8>,
}

impl Conn {
    /// Wraps a connected socket; `nonblocking` for the backend side.
    pub fn new(sock: UnixStream, nonblocking: bool) -> io::Result<Conn> {
        sock.set_nonblocking(nonblocking)?;
        Ok(Conn {
            sock,
            head: [0; HEADER_LEN],
            head_len: 0,
            header: None,
            payload: Vec::new(),
            fds: Vec::new(),
            out: Vec::new(),
        })
    }

    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Gives the socket back (for handing it to another process); fails if a message is
    /// half-read or replies are still queued.
    pub fn into_socket(self) -> Result<UnixStream, Conn> {
        if self.head_len != 0 || !self.out.is_empty() {
            return Err(self);
        }
        Ok(self.sock)
    }

    /// Takes the connection apart for a hot upgrade: the socket, the bytes of a message
    /// read only in part, the fds that came with them, and replies not yet written. Nothing
    /// is lost: [`Conn::restore`] in the next process continues exactly here.
    pub fn parts(&self) -> (&UnixStream, Vec<u8>, &[OwnedFd], &[u8]) {
        let mut partial = self.head[..self.head_len].to_vec();
        if self.header.is_some() {
            partial.extend_from_slice(&self.payload);
        }
        (&self.sock, partial, &self.fds, &self.out)
    }

    /// Rebuilds a connection from [`Conn::parts`] (non-blocking, backend side).
    pub fn restore(
        sock: UnixStream,
        partial: &[u8],
        fds: Vec<OwnedFd>,
        out: Vec<u8>,
    ) -> Result<Conn, ConnError> {
        let mut c = Conn::new(sock, true)?;
        let n = partial.len().min(HEADER_LEN);
        c.head[..n].copy_from_slice(&partial[..n]);
        c.head_len = n;
        if n == HEADER_LEN {
            let h = Header::parse(&c.head);
            msg::check_header(&h)?;
            if partial.len() - n > h.size as usize {
                return Err(ConnError::Io(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "handed-over partial message longer than its header says",
                )));
            }
            c.header = Some(h);
            c.payload = partial[n..].to_vec();
        } else if partial.len() > n {
            return Err(ConnError::Io(io::ErrorKind::InvalidData.into()));
        }
        c.fds = fds;
        c.out = out;
        Ok(c)
    }

    /// Whether a message is partially read.
    pub fn mid_message(&self) -> bool {
        self.head_len != 0
    }

    fn recv(&mut self, want: usize) -> io::Result<Option<usize>> {
        let mut tmp = [0u8; msg::MAX_PAYLOAD];
        match os::recv_with_fds(&self.sock, &mut tmp[..want]) {
            Ok((0, _)) => Ok(None),
            Ok((n, fds)) => {
                self.fds.extend(fds);
                if self.header.is_none() {
                    self.head[self.head_len..self.head_len + n].copy_from_slice(&tmp[..n]);
                } else {
                    self.payload.extend_from_slice(&tmp[..n]);
                }
                Ok(Some(n))
            }
            Err(e) => Err(e),
        }
    }

    /// Reads what is available; returns a message once one is complete.
    pub fn poll_message(&mut self) -> Result<Incoming, ConnError> {
        loop {
            let want = match self.header {
                None => HEADER_LEN - self.head_len,
                Some(h) => h.size as usize - self.payload.len(),
            };
            if want == 0 {
                let h = self
                    .header
                    .take()
                    .ok_or(ConnError::Io(io::ErrorKind::Other.into()))?;
                self.head_len = 0;
                let payload = std::mem::take(&mut self.payload);
                let fds = std::mem::take(&mut self.fds);
                return Ok(Incoming::Message(h, payload, fds));
            }
            match self.recv(want) {
                Ok(None) => return Ok(Incoming::Closed),
                Ok(Some(n)) => {
                    if self.header.is_none() {
                        self.head_len += n;
                        if self.head_len == HEADER_LEN {
                            let h = Header::parse(&self.head);
                            msg::check_header(&h)?;
                            self.header = Some(h);
                            self.payload.clear();
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Incoming::Pending),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends a message: writes what the socket takes now and queues the rest. fds cannot be
    /// queued: a message with fds (a backend's POSTCOPY_ADVISE answer) must go out at once,
    /// its fds with its first byte, or the peer is not reading and is cut off.
    pub fn send(&mut self, bytes: &[u8], fds: &[RawFd]) -> Result<(), ConnError> {
        if !self.out.is_empty() && !fds.is_empty() {
            return Err(ConnError::Backlog(self.out.len()));
        }
        if !self.out.is_empty() {
            self.out.extend_from_slice(bytes);
        } else {
            let n = match os::send_with_fds(&self.sock, bytes, fds) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e.into()),
            };
            if n < bytes.len() && n == 0 && !fds.is_empty() {
                return Err(ConnError::Io(io::ErrorKind::WouldBlock.into()));
            }
            self.out.extend_from_slice(&bytes[n..]);
        }
        if self.out.len() > MAX_PENDING_OUT {
            return Err(ConnError::Backlog(self.out.len()));
        }
        self.flush()
    }

    /// Writes queued bytes; `Ok` also when some remain (wait for writability).
    pub fn flush(&mut self) -> Result<(), ConnError> {
        while !self.out.is_empty() {
            match os::send_with_fds(&self.sock, &self.out, &[]) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether replies are waiting for the socket to become writable.
    pub fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }

    /// Blocking receive of one complete message (frontend side).
    pub fn recv_blocking(&mut self) -> Result<(Header, Vec<u8>, Vec<OwnedFd>), ConnError> {
        loop {
            match self.poll_message()? {
                Incoming::Message(h, p, f) => return Ok((h, p, f)),
                Incoming::Closed => {
                    return Err(ConnError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection",
                    )))
                }
                Incoming::Pending => {
                    // Blocking sockets never report WouldBlock; a non-blocking one waits.
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reassembles_a_message_sent_in_pieces() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut c = Conn::new(b, true).unwrap();
        let m = msg::encode(msg::Code::SetFeatures as u32, 0, &7u64.to_le_bytes());
        (&a).write_all(&m[..5]).unwrap();
        assert!(matches!(c.poll_message().unwrap(), Incoming::Pending));
        (&a).write_all(&m[5..15]).unwrap();
        assert!(matches!(c.poll_message().unwrap(), Incoming::Pending));
        assert!(c.mid_message());
        (&a).write_all(&m[15..]).unwrap();
        match c.poll_message().unwrap() {
            Incoming::Message(h, p, f) => {
                assert_eq!(h.code, 2);
                assert_eq!(p, 7u64.to_le_bytes());
                assert!(f.is_empty());
            }
            other => panic!("{other:?}"),
        }
        drop(a);
        assert!(matches!(c.poll_message().unwrap(), Incoming::Closed));
    }

    #[test]
    fn refuses_oversized_payload_header() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut c = Conn::new(b, true).unwrap();
        let h = Header {
            code: 5,
            flags: 1,
            size: 1 << 30,
        };
        (&a).write_all(&h.encode()).unwrap();
        assert!(matches!(
            c.poll_message(),
            Err(ConnError::Header(ParseError::TooLarge(_)))
        ));
    }

    #[test]
    fn cuts_off_a_peer_that_never_reads() {
        let (_a, b) = UnixStream::pair().unwrap();
        let mut c = Conn::new(b, true).unwrap();
        let big = vec![0u8; 4096];
        let mut res = Ok(());
        for _ in 0..1000 {
            res = c.send(&big, &[]);
            if res.is_err() {
                break;
            }
        }
        assert!(matches!(res, Err(ConnError::Backlog(_))));
    }
}
