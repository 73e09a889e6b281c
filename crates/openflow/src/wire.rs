//! Checked big-endian cursors over wire bytes: every read is bounds-checked and a short
//! buffer becomes the caller's chosen [`OfError`], never a panic.

use crate::error::OfError;

/// A read cursor over one structure's bytes. `short` is the error a read past the end gives
/// (each structure names its own: a short action is `OFPBAC_BAD_LEN`, a short match
/// `OFPBMC_BAD_LEN`, a short message `OFPBRC_BAD_LEN`).
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    short: OfError,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], short: OfError) -> Self {
        Reader { buf, pos: 0, short }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], OfError> {
        if self.remaining() < n {
            return Err(self.short);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    pub(crate) fn skip(&mut self, n: usize) -> Result<(), OfError> {
        self.bytes(n).map(|_| ())
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], OfError> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, OfError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, OfError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, OfError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, OfError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// How many bytes were read so far.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// A NUL-padded string field of `n` bytes (the last byte is the terminator the spec
    /// demands; what follows the first NUL is ignored). Not UTF-8 → `bad`.
    pub(crate) fn string(&mut self, n: usize, bad: OfError) -> Result<String, OfError> {
        let raw = self.bytes(n)?;
        let raw = &raw[..n - 1];
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        String::from_utf8(raw[..end].to_vec()).map_err(|_| bad)
    }
}

/// Big-endian writes onto a `Vec<u8>`.
pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_zeros(&mut self, n: usize);
    /// Zero bytes up to the next multiple of 8 counted from `start`.
    fn pad8_from(&mut self, start: usize);
    /// A NUL-padded string of exactly `n` bytes, cut at a character boundary so at least one
    /// NUL remains.
    fn put_string(&mut self, s: &str, n: usize);
    /// Writes `v` as a big-endian u16 at `at` (a length placeholder written earlier).
    fn patch_u16(&mut self, at: usize, v: u16);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_zeros(&mut self, n: usize) {
        self.resize(self.len() + n, 0);
    }
    fn pad8_from(&mut self, start: usize) {
        let len = self.len() - start;
        self.put_zeros(pad8(len) - len);
    }
    fn put_string(&mut self, s: &str, n: usize) {
        let mut end = s.len().min(n - 1);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.extend_from_slice(&s.as_bytes()[..end]);
        self.put_zeros(n - end);
    }
    fn patch_u16(&mut self, at: usize, v: u16) {
        self[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
}

/// `len` rounded up to a multiple of 8.
pub(crate) fn pad8(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// A length as the u16 of a length field. Values the caller built may exceed it (decoded
/// values never do); the field then saturates and an error is logged, since the peer would
/// refuse the message anyway.
pub(crate) fn len16(len: usize, what: &str) -> u16 {
    u16::try_from(len).unwrap_or_else(|_| {
        log::error!("{what} of {len} bytes does not fit OpenFlow's 16-bit length");
        u16::MAX
    })
}
