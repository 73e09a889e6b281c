//! Software offloads: what an output port that cannot take a packet's offload metadata gets
//! instead — the partial checksum completed ([`complete_csum`]) and a large TCP segment cut
//! into MSS-sized ones, each with its own correct IP and TCP headers ([`TcpSegmenter`]).
//!
//! The input is untrusted (a guest wrote both the packet and its virtio-net header): every
//! offset is checked against the frame before it is used, and a header that does not describe
//! the frame is an [`OffloadError`] (the packet is dropped and counted, nothing panics).
//!
//! Checksums are summed 8 bytes at a time with end-around carry: the ones'-complement sum is
//! the same modulo 2^64 - 1 as modulo 2^16 - 1, and 2^16 - 1 divides 2^64 - 1.

use crate::ETH_P_8021Q;

const ETH_P_8021AD: u16 = 0x88a8;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Why a packet's offload request cannot be carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("checksum start/offset outside the packet")]
    CsumOutside,
    #[error("segmentation asked for a packet that is not TCP over IPv4/IPv6")]
    NotTcp,
    #[error("IP or TCP header truncated or inconsistent")]
    BadHeaders,
    #[error("segment size 0 or too large")]
    BadGsoSize,
    #[error("checksum start does not point at the TCP header")]
    CsumNotL4,
}

/// Adds `v` to a ones'-complement sum (end-around carry: a sum near `u64::MAX` wraps into
/// its low bits, never overflows).
#[inline]
pub fn csum_add_word(sum: u64, v: u64) -> u64 {
    let (s, o) = sum.overflowing_add(v);
    s + o as u64
}

/// Adds `data` (big-endian 16-bit words, odd tail padded) to a ones'-complement sum.
#[inline]
pub fn csum_add(mut sum: u64, data: &[u8]) -> u64 {
    let mut add = |v: u64| sum = csum_add_word(sum, v);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        add(u64::from_be_bytes(w));
    }
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(2);
    for w in &mut words {
        add(u64::from(u16::from_be_bytes([w[0], w[1]])));
    }
    if let [b] = words.remainder() {
        add(u64::from(*b) << 8);
    }
    sum
}

/// Folds a sum to 16 bits (not complemented).
#[inline]
pub fn csum_fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Completes a partial checksum (virtio `NEEDS_CSUM`): sums `frame[start..]`, whose field at
/// `start + offset` holds the pseudo-header sum the sender placed there, and stores the
/// complement. A UDP checksum (offset 6) that comes out 0 is sent as 0xffff (0 means "none").
pub fn complete_csum(frame: &mut [u8], start: usize, offset: usize) -> Result<(), OffloadError> {
    let at = start.checked_add(offset).ok_or(OffloadError::CsumOutside)?;
    if at.checked_add(2).is_none_or(|end| end > frame.len()) {
        return Err(OffloadError::CsumOutside);
    }
    let mut c = !csum_fold(csum_add(0, &frame[start..]));
    if c == 0 && offset == 6 {
        c = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Whether the checksum stored at `frame[start + offset]` is right for `frame[start..]` plus
/// the pseudo-header sum `pseudo` (for tests and checks).
pub fn verify_l4(frame: &[u8], start: usize, pseudo: u64) -> bool {
    csum_fold(csum_add(pseudo, &frame[start..])) == 0xffff
}

/// Offset of the network header and its ethertype, after up to two VLAN tags.
fn l3_of(frame: &[u8]) -> Result<(usize, u16), OffloadError> {
    let mut at = 12;
    for _ in 0..3 {
        let et = frame
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or(OffloadError::BadHeaders)?;
        if et == ETH_P_8021Q || et == ETH_P_8021AD {
            at += 4;
            continue;
        }
        return Ok((at + 2, et));
    }
    Err(OffloadError::BadHeaders)
}

/// A TCP pseudo-header sum for a segment of `l4_len` bytes.
fn pseudo_sum(frame: &[u8], l3: usize, v6: bool, l4_len: usize) -> u64 {
    if v6 {
        let s = csum_add(0, &frame[l3 + 8..l3 + 40]);
        let s = csum_add(s, &(l4_len as u32).to_be_bytes());
        csum_add_word(s, u64::from(IPPROTO_TCP))
    } else {
        let s = csum_add(0, &frame[l3 + 12..l3 + 20]);
        csum_add_word(s, u64::from(IPPROTO_TCP) + l4_len as u64)
    }
}

/// Cuts one large TCP segment (virtio `GSO_TCPV4`/`GSO_TCPV6`) into segments of at most
/// `mss` bytes of payload, as the kernel's GSO does: each a copy of the headers with the IPv4
/// total length, id (+1 per segment) and header checksum, or the IPv6 payload length, the TCP
/// sequence number, and the flags fixed (FIN and PSH only on the last, CWR only on the first),
/// and a full TCP checksum.
#[derive(Debug, Clone, Copy)]
pub struct TcpSegmenter<'a> {
    frame: &'a [u8],
    l3: usize,
    l4: usize,
    hdrs: usize,
    mss: usize,
    v6: bool,
    count: usize,
}

impl<'a> TcpSegmenter<'a> {
    /// Checks that `frame` is TCP over IPv4 or IPv6 whose TCP header starts at `csum_start`
    /// (the virtio header's), and prepares segments of `mss` payload bytes.
    pub fn new(frame: &'a [u8], mss: u16, csum_start: u16) -> Result<Self, OffloadError> {
        let (l3, et) = l3_of(frame)?;
        let (v6, l4) = match et {
            ETH_P_IPV4 => {
                let b = *frame.get(l3).ok_or(OffloadError::BadHeaders)?;
                let ihl = usize::from(b & 0x0f) * 4;
                if b >> 4 != 4 || ihl < 20 || frame.len() < l3 + ihl {
                    return Err(OffloadError::BadHeaders);
                }
                if frame[l3 + 9] != IPPROTO_TCP {
                    return Err(OffloadError::NotTcp);
                }
                (false, l3 + ihl)
            }
            ETH_P_IPV6 => {
                if frame.len() < l3 + 40 || frame[l3] >> 4 != 6 {
                    return Err(OffloadError::BadHeaders);
                }
                if frame[l3 + 6] != IPPROTO_TCP {
                    return Err(OffloadError::NotTcp);
                }
                (true, l3 + 40)
            }
            _ => return Err(OffloadError::NotTcp),
        };
        if usize::from(csum_start) != l4 {
            return Err(OffloadError::CsumNotL4);
        }
        let doff = usize::from(*frame.get(l4 + 12).ok_or(OffloadError::BadHeaders)? >> 4) * 4;
        let hdrs = l4 + doff;
        if doff < 20 || frame.len() < hdrs {
            return Err(OffloadError::BadHeaders);
        }
        let mss = usize::from(mss);
        if mss == 0 || hdrs + mss > 65535 + 18 {
            return Err(OffloadError::BadGsoSize);
        }
        let payload = frame.len() - hdrs;
        Ok(TcpSegmenter {
            frame,
            l3,
            l4,
            hdrs,
            mss,
            v6,
            count: payload.div_ceil(mss).max(1),
        })
    }

    /// How many segments.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Length of segment `i` (headers included).
    pub fn len(&self, i: usize) -> usize {
        let payload = self.frame.len() - self.hdrs;
        self.hdrs + (payload - i * self.mss).min(self.mss)
    }

    /// Whether there is no segment (never: a bare header is one segment).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Writes segment `i` into `out`, which must be exactly [`TcpSegmenter::len`]`(i)` bytes.
    pub fn write(&self, i: usize, out: &mut [u8]) {
        let (f, l3, l4, hdrs) = (self.frame, self.l3, self.l4, self.hdrs);
        let len = out.len();
        debug_assert_eq!(len, self.len(i));
        let from = hdrs + i * self.mss;
        out[..hdrs].copy_from_slice(&f[..hdrs]);
        out[hdrs..].copy_from_slice(&f[from..from + len - hdrs]);
        if self.v6 {
            out[l3 + 4..l3 + 6].copy_from_slice(&((len - l3 - 40) as u16).to_be_bytes());
        } else {
            out[l3 + 2..l3 + 4].copy_from_slice(&((len - l3) as u16).to_be_bytes());
            let id = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]).wrapping_add(i as u16);
            out[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
            out[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
            let c = !csum_fold(csum_add(0, &out[l3..l4]));
            out[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        let seq = u32::from_be_bytes([f[l4 + 4], f[l4 + 5], f[l4 + 6], f[l4 + 7]])
            .wrapping_add((i * self.mss) as u32);
        out[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        if i + 1 != self.count {
            out[l4 + 13] &= !(TCP_FIN | TCP_PSH);
        }
        if i != 0 {
            out[l4 + 13] &= !TCP_CWR;
        }
        out[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
        let pseudo = pseudo_sum(out, l3, self.v6, len - l4);
        let c = !csum_fold(csum_add(pseudo, &out[l4..]));
        out[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
    }
}

/// Checks a complete TCP/IPv4 or TCP/IPv6 frame's checksums (IPv4 header and TCP), for tests
/// and the wire checks of the offload tests. `None` if the frame is not TCP over IP.
pub fn tcp_checksums_ok(frame: &[u8]) -> Option<bool> {
    let (l3, et) = l3_of(frame).ok()?;
    let (v6, l4, end) = match et {
        ETH_P_IPV4 => {
            let ihl = usize::from(*frame.get(l3)? & 0x0f) * 4;
            if frame.len() < l3 + ihl || ihl < 20 || frame[l3 + 9] != IPPROTO_TCP {
                return None;
            }
            let tot = usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]));
            if csum_fold(csum_add(0, &frame[l3..l3 + ihl])) != 0xffff {
                return Some(false);
            }
            (false, l3 + ihl, l3 + tot)
        }
        ETH_P_IPV6 => {
            if frame.len() < l3 + 40 || frame[l3 + 6] != IPPROTO_TCP {
                return None;
            }
            let pl = usize::from(u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]));
            (true, l3 + 40, l3 + 40 + pl)
        }
        _ => return None,
    };
    if end > frame.len() || end < l4 + 20 {
        return Some(false);
    }
    let f = &frame[..end];
    Some(verify_l4(f, l4, pseudo_sum(f, l3, v6, end - l4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference checksum: 16-bit words one at a time.
    fn slow_sum(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from(c[0]) << 8
            };
            s += u32::from(w);
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn wide_sum_matches_word_sum() {
        let mut r = Rng(7);
        for len in 0..300 {
            let d: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            assert_eq!(csum_fold(csum_add(0, &d)), slow_sum(&d), "len {len}");
        }
        let ff = vec![0xffu8; 4096];
        assert_eq!(csum_fold(csum_add(0, &ff)), slow_sum(&ff));
    }

    /// Found by the fuzzer: addresses of all ones make the 64-bit sum of the pseudo-header
    /// u64::MAX; adding the protocol and length must carry around, not overflow.
    #[test]
    fn pseudo_header_sum_of_all_ones_carries_around() {
        assert_eq!(csum_add_word(u64::MAX, 6), 6);
        for v6 in [false, true] {
            let mut f = vec![0xffu8; 14 + 40 + 20];
            f[12..14].copy_from_slice(&if v6 { ETH_P_IPV6 } else { ETH_P_IPV4 }.to_be_bytes());
            let l4_len = 20;
            let mut pseudo = if v6 {
                f[22..54].to_vec()
            } else {
                f[26..34].to_vec()
            };
            pseudo.extend_from_slice(&[0, IPPROTO_TCP]);
            pseudo.extend_from_slice(&(l4_len as u16).to_be_bytes());
            assert_eq!(
                csum_fold(pseudo_sum(&f, 14, v6, l4_len)),
                slow_sum(&pseudo),
                "v6 {v6}"
            );
        }
    }

    /// An Ethernet + IPv4/IPv6 + TCP frame with `payload` bytes, its TCP checksum field
    /// holding the pseudo-header sum (as a sender using NEEDS_CSUM leaves it).
    fn tcp_frame(v6: bool, vlan: bool, payload: usize, flags: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        }
        let l3 = f.len() + 2;
        let tcp_len = 32 + payload;
        if v6 {
            f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
            f.extend_from_slice(&[IPPROTO_TCP, 64]);
            f.extend((0..32).map(|i| i as u8));
        } else {
            f.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
            f.extend_from_slice(&[0x45, 0]);
            f.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            f.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, IPPROTO_TCP, 0, 0]);
            f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
            let c = !csum_fold(csum_add(0, &f[l3..l3 + 20]));
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        let l4 = f.len();
        f.extend_from_slice(&[0x13, 0x88, 0xc3, 0x50]); // ports
        f.extend_from_slice(&0xfffff000u32.to_be_bytes()); // seq, wraps
        f.extend_from_slice(&1u32.to_be_bytes()); // ack
        f.extend_from_slice(&[0x80, flags, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]); // options
        f.extend((0..payload).map(|i| (i * 7 + 3) as u8));
        let p = csum_fold(pseudo_sum(&f, l3, v6, tcp_len));
        f[l4 + 16..l4 + 18].copy_from_slice(&p.to_be_bytes());
        f
    }

    #[test]
    fn completes_partial_checksums() {
        for v6 in [false, true] {
            let mut f = tcp_frame(v6, false, 1000, 0x18);
            let l4 = if v6 { 54 } else { 34 };
            assert_eq!(tcp_checksums_ok(&f), Some(false));
            complete_csum(&mut f, l4, 16).unwrap();
            assert_eq!(tcp_checksums_ok(&f), Some(true), "v6 {v6}");
        }
        let mut f = vec![0u8; 40];
        assert_eq!(complete_csum(&mut f, 30, 9), Err(OffloadError::CsumOutside));
        assert_eq!(
            complete_csum(&mut f, usize::MAX, 9),
            Err(OffloadError::CsumOutside)
        );
        // UDP: a zero result is sent as 0xffff.
        let mut u = vec![0u8; 8];
        u[6..8].copy_from_slice(&[0xff, 0xff]);
        complete_csum(&mut u, 0, 6).unwrap();
        assert_eq!(&u[6..8], &[0xff, 0xff]);
    }

    #[test]
    fn segments_like_the_kernel() {
        for (v6, vlan) in [(false, false), (true, false), (false, true), (true, true)] {
            let payload = 10_000;
            let mss = 1448;
            let f = tcp_frame(v6, vlan, payload, 0x80 | 0x18 | 0x01); // CWR PSH ACK FIN
            let l4 = if v6 { 54 } else { 34 } + if vlan { 4 } else { 0 };
            let s = TcpSegmenter::new(&f, mss, l4 as u16).unwrap();
            assert_eq!(s.count(), payload.div_ceil(mss as usize));
            let mut data = Vec::new();
            for i in 0..s.count() {
                let mut out = vec![0u8; s.len(i)];
                s.write(i, &mut out);
                assert!(out.len() <= l4 + 32 + mss as usize);
                assert_eq!(tcp_checksums_ok(&out), Some(true), "segment {i}");
                let seq = u32::from_be_bytes(out[l4 + 4..l4 + 8].try_into().unwrap());
                assert_eq!(seq, 0xfffff000u32.wrapping_add((i * mss as usize) as u32));
                let fl = out[l4 + 13];
                assert_eq!(fl & TCP_CWR != 0, i == 0);
                assert_eq!(fl & (TCP_FIN | TCP_PSH) != 0, i + 1 == s.count());
                if !v6 {
                    let l3 = l4 - 20;
                    let id = u16::from_be_bytes([out[l3 + 4], out[l3 + 5]]);
                    assert_eq!(id, 0x1234 + i as u16);
                }
                data.extend_from_slice(&out[l4 + 32..]);
            }
            assert_eq!(data, f[l4 + 32..], "payload reassembles");
        }
    }

    #[test]
    fn refuses_what_it_cannot_segment() {
        let f = tcp_frame(false, false, 3000, 0x10);
        assert_eq!(
            TcpSegmenter::new(&f, 1448, 30).unwrap_err(),
            OffloadError::CsumNotL4
        );
        assert_eq!(
            TcpSegmenter::new(&f, 0, 34).unwrap_err(),
            OffloadError::BadGsoSize
        );
        let mut udp = f.clone();
        udp[14 + 9] = 17;
        assert_eq!(
            TcpSegmenter::new(&udp, 1448, 34).unwrap_err(),
            OffloadError::NotTcp
        );
        assert!(TcpSegmenter::new(&f[..40], 1448, 34).is_err());
        let mut bad_doff = f.clone();
        bad_doff[34 + 12] = 0xf0; // 60 bytes of TCP header: fits; 0x10 would be too short
        assert!(TcpSegmenter::new(&bad_doff, 1448, 34).is_ok());
        bad_doff[34 + 12] = 0x10;
        assert_eq!(
            TcpSegmenter::new(&bad_doff, 1448, 34).unwrap_err(),
            OffloadError::BadHeaders
        );
        // Random garbage never panics.
        let mut r = Rng(99);
        for _ in 0..20_000 {
            let len = (r.next() % 200) as usize;
            let mut g: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            if len > 24 && r.next().is_multiple_of(2) {
                g[12..14].copy_from_slice(&ETH_P_IPV4.to_be_bytes());
                g[14] = 0x45;
                g[23] = IPPROTO_TCP;
            }
            let start = (r.next() % 80) as u16;
            if let Ok(s) = TcpSegmenter::new(&g, (r.next() % 100) as u16, start) {
                for i in 0..s.count() {
                    let mut out = vec![0u8; s.len(i)];
                    s.write(i, &mut out);
                }
            }
            let _ = complete_csum(&mut g, start as usize, (r.next() % 40) as usize);
            let _ = tcp_checksums_ok(&g);
        }
    }
}
