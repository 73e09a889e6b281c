//! Splitting a byte stream into JSON-RPC messages.
//!
//! OVSDB's JSON-RPC puts objects one after the other on the stream with no delimiter (optional
//! whitespace between them), and a read may end anywhere, even inside a multi-byte character.
//! [`Splitter`] scans each byte once, tracking whether it is inside a string (and after a
//! backslash there) and the depth of `{`/`[`; a message ends where the depth returns to zero.
//! It does not validate JSON (the parser does, on the complete message); it only finds where
//! each message ends, refuses a message that does not start with `{`, and caps a message's
//! size so that a peer cannot make us buffer without bound.

/// Why the byte stream cannot be split into messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// A message starts with something else than `{`.
    #[error("a message starts with byte 0x{byte:02x} instead of '{{'")]
    NotAnObject {
        /// The offending byte.
        byte: u8,
    },
    /// A message grew beyond the limit before it ended.
    #[error("a message exceeds {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
}

/// An incremental splitter of concatenated JSON objects.
#[derive(Debug, Clone)]
pub struct Splitter {
    buf: Vec<u8>,
    depth: usize,
    in_string: bool,
    escape: bool,
    limit: usize,
}

impl Splitter {
    /// A splitter that refuses messages longer than `limit` bytes.
    pub fn new(limit: usize) -> Splitter {
        Splitter {
            buf: Vec::new(),
            depth: 0,
            in_string: false,
            escape: false,
            limit,
        }
    }

    /// Forgets a partial message (a new connection).
    pub fn reset(&mut self) {
        self.buf = Vec::new();
        self.depth = 0;
        self.in_string = false;
        self.escape = false;
    }

    /// The part of a message read so far (what a hot upgrade hands over: fed again to a
    /// fresh splitter, it leaves that splitter in this one's state).
    pub fn partial(&self) -> &[u8] {
        &self.buf
    }

    /// Whether part of a message has been read.
    pub fn is_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Scans `bytes` up to the end of the next message. Returns how many bytes were consumed
    /// and, if a message ended, the message. Call again with the rest.
    pub fn advance(&mut self, bytes: &[u8]) -> Result<(usize, Option<Vec<u8>>), FramingError> {
        let mut i = 0;
        if self.depth == 0 {
            while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b'\n' | b'\r') {
                i += 1;
            }
            match bytes.get(i) {
                None => return Ok((i, None)),
                Some(b'{') => {}
                Some(&byte) => return Err(FramingError::NotAnObject { byte }),
            }
        }
        let start = i;
        let mut end = None;
        while i < bytes.len() {
            let b = bytes[i];
            i += 1;
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    // depth >= 1 here: the first byte of a message is '{'.
                    self.depth -= 1;
                    if self.depth == 0 {
                        end = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        if self.buf.len() + (i - start) > self.limit {
            return Err(FramingError::TooLarge { limit: self.limit });
        }
        self.buf.extend_from_slice(&bytes[start..i]);
        match end {
            Some(_) => Ok((i, Some(std::mem::take(&mut self.buf)))),
            None => Ok((i, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(
        s: &mut Splitter,
        mut bytes: &[u8],
        out: &mut Vec<Vec<u8>>,
    ) -> Result<(), FramingError> {
        while !bytes.is_empty() {
            let (n, msg) = s.advance(bytes)?;
            out.extend(msg);
            bytes = &bytes[n..];
        }
        Ok(())
    }

    const STREAM: &str = concat!(
        " {\"id\":1,\"result\":{\"a\":[1,{\"b\":\"}]{[\\\"\\\\\"}]},\"error\":null}\n",
        "{\"method\":\"echo\",\"params\":[\"é\\u00e9\"],\"id\":\"x\"}",
        "\r\n\t{}{\"k\":\"\\\\\"}",
    );

    fn expected() -> Vec<Vec<u8>> {
        vec![
            br#"{"id":1,"result":{"a":[1,{"b":"}]{[\"\\"}]},"error":null}"#.to_vec(),
            "{\"method\":\"echo\",\"params\":[\"é\\u00e9\"],\"id\":\"x\"}"
                .as_bytes()
                .to_vec(),
            b"{}".to_vec(),
            br#"{"k":"\\"}"#.to_vec(),
        ]
    }

    #[test]
    fn every_split_point() {
        let bytes = STREAM.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let mut s = Splitter::new(1 << 20);
                let mut out = Vec::new();
                for chunk in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                    split_all(&mut s, chunk, &mut out).unwrap();
                }
                assert_eq!(out, expected(), "split at {a}, {b}");
                assert!(!s.is_partial());
            }
        }
    }

    #[test]
    fn byte_by_byte() {
        let mut s = Splitter::new(1 << 20);
        let mut out = Vec::new();
        for b in STREAM.as_bytes() {
            split_all(&mut s, std::slice::from_ref(b), &mut out).unwrap();
        }
        assert_eq!(out, expected());
        for m in &out {
            serde_json::from_slice::<serde_json::Value>(m).unwrap();
        }
    }

    #[test]
    fn refuses() {
        let mut s = Splitter::new(16);
        assert_eq!(
            s.advance(b"  [1]").unwrap_err(),
            FramingError::NotAnObject { byte: b'[' }
        );
        let mut s = Splitter::new(16);
        assert!(s.advance(b"{\"a\":\"").is_ok());
        assert_eq!(
            s.advance(b"0123456789abcdef").unwrap_err(),
            FramingError::TooLarge { limit: 16 }
        );
        // Exactly at the limit is fine.
        let mut s = Splitter::new(4);
        assert_eq!(s.advance(b"{\"\"}").unwrap(), (4, Some(b"{\"\"}".to_vec())));
        // Deep nesting is split (the parser refuses it), never recursed into.
        let deep = format!("{}{}", "{".repeat(100_000), "}".repeat(100_000));
        let mut s = Splitter::new(1 << 20);
        let (n, msg) = s.advance(deep.as_bytes()).unwrap();
        assert_eq!(n, deep.len());
        assert!(serde_json::from_slice::<serde_json::Value>(&msg.unwrap()).is_err());
    }
}
