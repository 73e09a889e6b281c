//! Splitting a byte stream into OpenFlow messages.
//!
//! A [`Framer`] owns a connection's receive buffer. Bytes go in as they were read, in any
//! split; whole messages come out, by the 8-byte header's length. It never blocks and
//! keeps at most one partial message plus what the caller pushed: a peer cannot make it
//! grow beyond one read's worth above 64 KiB.
//!
//! Two refusals: a header length below 8 ([`FrameError::BadLength`]) loses the stream's
//! framing, so the caller answers `OFPBRC_BAD_LEN` and closes the connection; a message
//! of a version the connection did not negotiate ([`FrameError::BadVersion`]) is consumed
//! whole and handed back, so the caller answers `OFPBRC_BAD_VERSION` and goes on. (The
//! 16-bit length field cannot exceed 65535.) Before negotiation (no version set) any
//! version passes: the first message is a HELLO of the peer's version.

use crate::error::{brc, et, OfError};
use crate::message::Header;
use crate::HEADER_LEN;

/// A framing refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header's length is below the header's own 8 bytes: the stream is lost.
    #[error("OpenFlow header says length {0}, below the 8-byte header")]
    BadLength(u16),
    /// A whole message of a version other than the negotiated one (its bytes, for the
    /// error reply).
    #[error("OpenFlow message of version {version:#04x} on a connection that negotiated another")]
    BadVersion {
        /// The message's version.
        version: u8,
        /// The whole message.
        message: Vec<u8>,
    },
}

impl FrameError {
    /// The OpenFlow error to answer with: `OFPBRC_BAD_LEN` (then close) or
    /// `OFPBRC_BAD_VERSION` (with [`FrameError::BadVersion`]'s message as the request).
    pub fn of_error(&self) -> OfError {
        match self {
            FrameError::BadLength(_) => {
                OfError::new(et::BAD_REQUEST, brc::BAD_LEN, "header length below 8")
            }
            FrameError::BadVersion { .. } => OfError::new(
                et::BAD_REQUEST,
                brc::BAD_VERSION,
                "message of a version this connection did not negotiate",
            ),
        }
    }
}

/// The receive side of one connection.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    start: usize,
    version: Option<u8>,
}

impl Framer {
    /// A framer that accepts any version until [`set_version`](Self::set_version).
    pub fn new() -> Framer {
        Framer::default()
    }

    /// Fixes the negotiated version: messages of another version are refused from now on.
    pub fn set_version(&mut self, version: u8) {
        self.version = Some(version);
    }

    /// The negotiated version, if any.
    pub fn version(&self) -> Option<u8> {
        self.version
    }

    /// Appends bytes read from the connection.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that do not yet make a whole message.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The bytes pushed and not yet taken as messages (a partial message, or whole ones
    /// waiting behind unread replies). A hot upgrade hands them to the next daemon, which
    /// pushes them into a new framer and goes on from exactly that byte.
    pub fn unread(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The next whole message (header included), `Ok(None)` if more bytes are needed.
    /// After [`FrameError::BadLength`] the framer keeps returning it.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let avail = &self.buf[self.start..];
        let Some(h) = Header::parse(avail) else {
            self.compact();
            return Ok(None);
        };
        let len = usize::from(h.length);
        if len < HEADER_LEN {
            return Err(FrameError::BadLength(h.length));
        }
        if avail.len() < len {
            self.compact();
            return Ok(None);
        }
        let message = avail[..len].to_vec();
        self.start += len;
        match self.version {
            Some(v) if v != h.version => Err(FrameError::BadVersion {
                version: h.version,
                message,
            }),
            _ => Ok(Some(message)),
        }
    }

    /// Drops consumed bytes once they are the larger part of the buffer.
    fn compact(&mut self) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}
