//! Test-traffic packets: Ethernet/IPv4/UDP frames whose payload carries a magic, a flow id, a
//! sequence number and a transmit timestamp, followed by filler derived from the sequence
//! number so that any corruption is detected.

use crate::{Mac, ETH_P_IPV4};

pub const MAGIC: u16 = 0xfe77;
/// Headers (Ethernet 14 + IPv4 20 + UDP 8) before the payload.
pub const HDRS: usize = 42;
/// Magic (2) + flow (2) + sequence (6, 48 bits) + timestamp (8).
pub const STAMP: usize = 18;
/// Smallest frame that carries a full stamp.
pub const MIN_FRAME: usize = HDRS + STAMP;

/// What a received test frame said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub flow: u16,
    pub seq: u64,
    pub tx_ns: u64,
}

/// Length of the repeating filler pattern (prime, so offsets differ for nearby sequences).
const PATTERN_PERIOD: usize = 61;

/// The filler pattern: payload byte `i` of packet `seq` is `PATTERN[(seq % 61) + i]`, so the
/// filler is one `memcpy` to write and one comparison to check.
fn pattern() -> &'static [u8] {
    static P: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        (0..10_000 + PATTERN_PERIOD)
            .map(|i| {
                ((i % PATTERN_PERIOD) as u8)
                    .wrapping_mul(31)
                    .wrapping_add(7)
            })
            .collect()
    })
}

fn filler(seq: u64, len: usize) -> &'static [u8] {
    let off = (seq % PATTERN_PERIOD as u64) as usize;
    &pattern()[off..off + len]
}

fn csum(b: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Writes a test frame of `len` bytes (at least [`MIN_FRAME`]) into `buf`; returns its length.
pub fn udp_frame(buf: &mut [u8], len: usize, dst: Mac, src: Mac, st: Stamp) -> usize {
    let len = len.clamp(MIN_FRAME, buf.len());
    let b = &mut buf[..len];
    b[0..6].copy_from_slice(&dst.to_be_bytes()[2..]);
    b[6..12].copy_from_slice(&src.to_be_bytes()[2..]);
    b[12..14].copy_from_slice(&ETH_P_IPV4.to_be_bytes());
    let ip_len = (len - 14) as u16;
    let ip = &mut b[14..34];
    ip.copy_from_slice(&[
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    let c = csum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp = &mut b[34..42];
    udp[0..2].copy_from_slice(&(1024u16.wrapping_add(st.flow)).to_be_bytes());
    udp[2..4].copy_from_slice(&9u16.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    udp[6..8].copy_from_slice(&0u16.to_be_bytes());
    write_payload(&mut b[HDRS..], st);
    len
}

/// Writes the stamp and the filler of a test frame's payload.
#[inline]
fn write_payload(p: &mut [u8], st: Stamp) {
    p[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    p[2..4].copy_from_slice(&st.flow.to_be_bytes());
    p[4..10].copy_from_slice(&st.seq.to_be_bytes()[2..]);
    p[10..18].copy_from_slice(&st.tx_ns.to_be_bytes());
    let n = p.len() - STAMP;
    p[STAMP..].copy_from_slice(filler(st.seq, n));
}

/// Precomputed headers for fast generation of equal-sized test frames: per frame only the
/// UDP source port (the flow), the stamp and the filler are written.
#[derive(Debug, Clone)]
pub struct Template {
    head: [u8; HDRS],
    len: usize,
}

impl Template {
    pub fn new(len: usize, dst: Mac, src: Mac) -> Template {
        let len = len.clamp(MIN_FRAME, 10_000);
        let mut b = vec![0u8; len];
        udp_frame(
            &mut b,
            len,
            dst,
            src,
            Stamp {
                flow: 0,
                seq: 0,
                tx_ns: 0,
            },
        );
        let mut head = [0u8; HDRS];
        head.copy_from_slice(&b[..HDRS]);
        Template { head, len }
    }

    /// Writes a frame into `buf` (at least `len` bytes); returns its length.
    #[inline]
    pub fn write(&self, buf: &mut [u8], st: Stamp) -> usize {
        let b = &mut buf[..self.len];
        b[..HDRS].copy_from_slice(&self.head);
        b[34..36].copy_from_slice(&1024u16.wrapping_add(st.flow).to_be_bytes());
        write_payload(&mut b[HDRS..], st);
        self.len
    }
}

/// Why a received frame is not a good test frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Not ours at all (other traffic): ignore.
    Foreign,
    /// Ours, but the filler is damaged.
    Corrupt,
}

/// Parses a test frame, checking the filler.
pub fn parse_udp_frame(b: &[u8]) -> Result<Stamp, Bad> {
    if b.len() < MIN_FRAME || b[12..14] != ETH_P_IPV4.to_be_bytes() || b[23] != 17 {
        return Err(Bad::Foreign);
    }
    let p = &b[42..];
    if p[0..2] != MAGIC.to_be_bytes() {
        return Err(Bad::Foreign);
    }
    let seq = u64::from_be_bytes([0, 0, p[4], p[5], p[6], p[7], p[8], p[9]]);
    let tx_ns = u64::from_be_bytes(p[10..18].try_into().unwrap_or([0; 8]));
    let st = Stamp {
        flow: u16::from_be_bytes([p[2], p[3]]),
        seq,
        tx_ns,
    };
    let n = p.len() - STAMP;
    if n > pattern().len() - PATTERN_PERIOD || p[STAMP..] != *filler(st.seq, n) {
        return Err(Bad::Corrupt);
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let mut b = [0u8; 128];
        let st = Stamp {
            flow: 3,
            seq: 77,
            tx_ns: 123,
        };
        let n = udp_frame(&mut b, 100, 1, 2, st);
        assert_eq!(n, 100);
        assert_eq!(parse_udp_frame(&b[..n]), Ok(st));
        assert_eq!(csum(&b[14..34]), 0, "IPv4 header checksum verifies");
        b[90] ^= 1;
        assert_eq!(parse_udp_frame(&b[..n]), Err(Bad::Corrupt));
        assert_eq!(parse_udp_frame(&b[..20]), Err(Bad::Foreign));
        assert_eq!(udp_frame(&mut b, 10, 1, 2, st), MIN_FRAME);
        // The template writes the same bytes as the builder.
        let t = Template::new(100, 1, 2);
        let mut c = [0u8; 128];
        let st = Stamp {
            flow: 9,
            seq: 12345,
            tx_ns: 77,
        };
        let n = t.write(&mut c, st);
        let m = udp_frame(&mut b, 100, 1, 2, st);
        assert_eq!(&c[..n], &b[..m]);
        assert_eq!(parse_udp_frame(&c[..n]), Ok(st));
    }
}
