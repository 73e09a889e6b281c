//! The connection key of a frame, parsed once from untrusted bytes.
//!
//! [`parse`] reads an Ethernet frame (an optional 802.1Q tag, IPv4 or IPv6 with its extension
//! headers, then TCP, UDP, ICMP, ICMPv6 or any other protocol) and returns a [`Packet`]: the
//! [`Tuple`] and what the protocol trackers need of the L4 header. Every read is bounds-checked
//! against the IP length (not the frame's, which may carry padding); a header that is short,
//! inconsistent or fails its checksum is a [`Malformed`] reason, which the table counts as an
//! invalid packet. Nothing here allocates or panics on any input (the fuzz target checks it).
//!
//! Invariants of a [`Tuple`]:
//! * an IPv4 address sits in the first 4 bytes of its 16, the rest are zero, so one type keys
//!   both families;
//! * TCP and UDP carry their ports; ICMP and ICMPv6 echo messages carry the echo id as
//!   `sport` and `type << 8 | code` as `dport`, and [`Tuple::reverse`] maps a request type to
//!   its reply type (as Linux does), so an echo reply finds its request's connection; other
//!   protocols have zero ports;
//! * [`Tuple::canonical`] is the smaller of a tuple and its reverse, the same for both
//!   directions of a connection: the table keys and shards on it.
//!
//! ICMP errors carry the tuple of the packet they quote (`inner`): the table looks it up to
//! report the error as related (ct_state `rel`). Fragments are not reassembled: a fragment
//! is [`Malformed::Fragment`] (see `docs/conntrack.md`).
//!
//! Thread-safety: plain functions over borrowed bytes; a [`Tuple`] is `Copy`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// The address family of a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Family {
    V4,
    V6,
}

/// A connection key in one direction (see the module's invariants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    pub family: Family,
    pub proto: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
}

impl Tuple {
    /// The tuple of the other direction of the same connection.
    pub fn reverse(&self) -> Tuple {
        match self.proto {
            _ if self.is_icmp() => Tuple {
                src: self.dst,
                dst: self.src,
                dport: (u16::from(reply_type(self.proto, (self.dport >> 8) as u8)) << 8)
                    | (self.dport & 0xff),
                ..*self
            },
            _ => Tuple {
                src: self.dst,
                dst: self.src,
                sport: self.dport,
                dport: self.sport,
                ..*self
            },
        }
    }

    /// The same key for both directions: the smaller of the tuple and its reverse.
    pub fn canonical(&self) -> Tuple {
        let r = self.reverse();
        if r < *self {
            r
        } else {
            *self
        }
    }

    /// Whether this is ICMP in IPv4 or ICMPv6 in IPv6 (the other combinations are generic).
    pub fn is_icmp(&self) -> bool {
        matches!(
            (self.family, self.proto),
            (Family::V4, IPPROTO_ICMP) | (Family::V6, IPPROTO_ICMPV6)
        )
    }

    /// The source address.
    pub fn src_addr(&self) -> IpAddr {
        addr(self.family, &self.src)
    }

    /// The destination address.
    pub fn dst_addr(&self) -> IpAddr {
        addr(self.family, &self.dst)
    }

    /// Whether the tuple keeps the invariants above and may be a connection's original
    /// direction (restored state is checked with it).
    pub fn is_valid(&self) -> bool {
        let v4_ok = |a: &[u8; 16]| a[4..].iter().all(|&b| b == 0);
        let fam_ok = match self.family {
            Family::V4 => v4_ok(&self.src) && v4_ok(&self.dst),
            Family::V6 => true,
        };
        let ports_ok = match self.proto {
            IPPROTO_TCP | IPPROTO_UDP => true,
            // An original-direction tuple of ICMP is a query.
            _ if self.is_icmp() => is_echo_request(self.proto, (self.dport >> 8) as u8),
            // Everything else, ICMP in IPv6 and ICMPv6 in IPv4 included, is generic.
            _ => self.sport == 0 && self.dport == 0,
        };
        fam_ok && ports_ok
    }
}

impl fmt::Display for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "proto={} src={} dst={} sport={} dport={}",
            self.proto,
            self.src_addr(),
            self.dst_addr(),
            self.sport,
            self.dport
        )
    }
}

fn addr(family: Family, a: &[u8; 16]) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(*a)),
    }
}

/// The reply type of an ICMP query type (itself when it has none).
fn reply_type(proto: u8, t: u8) -> u8 {
    match (proto, t) {
        (IPPROTO_ICMP, 8) => 0,
        (IPPROTO_ICMP, 0) => 8,
        (IPPROTO_ICMP, 13) => 14,
        (IPPROTO_ICMP, 14) => 13,
        (IPPROTO_ICMP, 15) => 16,
        (IPPROTO_ICMP, 16) => 15,
        (IPPROTO_ICMP, 17) => 18,
        (IPPROTO_ICMP, 18) => 17,
        (IPPROTO_ICMPV6, 128) => 129,
        (IPPROTO_ICMPV6, 129) => 128,
        (IPPROTO_ICMPV6, 139) => 140,
        (IPPROTO_ICMPV6, 140) => 139,
        _ => t,
    }
}

/// Whether an ICMP type may open a connection (a query, as Linux's `icmp_new`).
pub fn is_echo_request(proto: u8, t: u8) -> bool {
    matches!(
        (proto, t),
        (IPPROTO_ICMP, 8 | 13 | 15 | 17) | (IPPROTO_ICMPV6, 128 | 139)
    )
}

fn is_query_reply(proto: u8, t: u8) -> bool {
    matches!(
        (proto, t),
        (IPPROTO_ICMP, 0 | 14 | 16 | 18) | (IPPROTO_ICMPV6, 129 | 140)
    )
}

fn is_icmp_error(proto: u8, t: u8) -> bool {
    matches!(
        (proto, t),
        (IPPROTO_ICMP, 3 | 4 | 5 | 11 | 12) | (IPPROTO_ICMPV6, 1..=4)
    )
}

/// Why a frame has no connection key. Each is counted as an invalid packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("frame shorter than its Ethernet header")]
    ShortEthernet,
    #[error("not an IPv4 or IPv6 frame")]
    NotIp,
    #[error("IP header truncated or inconsistent")]
    BadIpHeader,
    #[error("IPv4 header checksum is wrong")]
    BadIpChecksum,
    #[error("a fragment (reassembly is not implemented)")]
    Fragment,
    #[error("IPv6 extension header chain truncated or too long")]
    BadExtensionHeader,
    #[error("L4 header truncated or inconsistent")]
    BadL4Header,
    #[error("L4 checksum is wrong")]
    BadL4Checksum,
    #[error("ICMP error whose quoted packet cannot be parsed")]
    BadIcmpInner,
}

/// What the TCP tracker needs of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment<'a> {
    pub seq: u32,
    pub ack: u32,
    /// The flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10, URG 0x20, ECE, CWR).
    pub flags: u8,
    pub window: u16,
    /// The options (between the fixed header and the data offset).
    pub options: &'a [u8],
    /// Data bytes (IP length minus the IP and TCP headers).
    pub payload_len: u32,
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

/// The L4 part of a parsed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4<'a> {
    Tcp(TcpSegment<'a>),
    Udp,
    /// An ICMP/ICMPv6 query (echo, timestamp, ...) or its reply.
    IcmpQuery {
        request: bool,
    },
    /// An ICMP/ICMPv6 error quoting a packet whose tuple is `inner` (as it was sent).
    IcmpError {
        inner: Tuple,
    },
    /// Any other ICMP message (never opens a connection).
    IcmpOther,
    Other,
}

/// A parsed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    pub tuple: Tuple,
    pub l4: L4<'a>,
}

/// Parses a frame. `verify_checksums` checks the IPv4 header and the L4 checksums (Linux does
/// in PREROUTING with `nf_conntrack_checksum=1`, its default; OVS's userspace tracker too).
pub fn parse(frame: &[u8], verify_checksums: bool) -> Result<Packet<'_>, Malformed> {
    parse_with(frame, verify_checksums, verify_checksums)
}

/// [`parse`] with the IPv4 header checksum (`verify_ip`) and the L4 checksums (`verify_l4`)
/// checked or not separately: a frame with checksum offload has a partial L4 checksum,
/// which only the device completes (OVS trusts those too).
pub fn parse_with(frame: &[u8], verify_ip: bool, verify_l4: bool) -> Result<Packet<'_>, Malformed> {
    if frame.len() < 14 {
        return Err(Malformed::ShortEthernet);
    }
    let mut ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let mut off = 14;
    // At most two tags (QinQ); a third is not IP as far as we are concerned.
    for _ in 0..2 {
        if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
            let t = frame
                .get(off + 2..off + 4)
                .ok_or(Malformed::ShortEthernet)?;
            ethertype = u16::from_be_bytes([t[0], t[1]]);
            off += 4;
        }
    }
    let l3 = &frame[off..];
    match ethertype {
        ETH_P_IPV4 => parse_ipv4(l3, verify_ip, verify_l4, false),
        ETH_P_IPV6 => parse_ipv6(l3, verify_l4, false),
        _ => Err(Malformed::NotIp),
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Ones-complement sum of `b` folded into `acc` (not yet complemented); NAT recomputes
/// ICMP checksums with it.
pub(crate) fn sum_bytes(acc: u32, b: &[u8]) -> u32 {
    sum(acc, b)
}

/// Ones-complement sum of `b` folded into `acc` (not yet complemented).
fn sum(mut acc: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// The L4 checksum of `seg` with the pseudo header of `family`, complemented (0 when the
/// checksum in the segment is right).
fn l4_checksum(family: Family, src: &[u8; 16], dst: &[u8; 16], proto: u8, seg: &[u8]) -> u16 {
    let n = if family == Family::V4 { 4 } else { 16 };
    let mut acc = sum(0, &src[..n]);
    acc = sum(acc, &dst[..n]);
    let len = seg.len() as u32;
    acc = sum(acc, &(len >> 16).to_be_bytes()[2..]);
    acc = sum(acc, &(len as u16).to_be_bytes());
    acc = sum(acc, &[0, proto]);
    !(sum(acc, seg) as u16)
}

/// Parses an IPv4 packet. `inner` (a packet quoted by an ICMP error) may be truncated after
/// the first 8 bytes of its L4 header and has no checksum to verify.
fn parse_ipv4(
    b: &[u8],
    verify_ip: bool,
    verify: bool,
    inner: bool,
) -> Result<Packet<'_>, Malformed> {
    if b.len() < 20 || b[0] >> 4 != 4 {
        return Err(Malformed::BadIpHeader);
    }
    let ihl = usize::from(b[0] & 0x0f) * 4;
    let total = usize::from(be16(b, 2));
    if ihl < 20 || b.len() < ihl || total < ihl || (!inner && total > b.len()) {
        return Err(Malformed::BadIpHeader);
    }
    if verify_ip && !inner && sum(0, &b[..ihl]) != 0xffff {
        return Err(Malformed::BadIpChecksum);
    }
    let frag = be16(b, 6);
    if frag & 0x3fff != 0 {
        // MF set or a non-zero offset.
        return Err(Malformed::Fragment);
    }
    let proto = b[9];
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src[..4].copy_from_slice(&b[12..16]);
    dst[..4].copy_from_slice(&b[16..20]);
    let end = if inner { b.len().min(total) } else { total };
    let l4 = &b[ihl..end];
    parse_l4(Family::V4, proto, src, dst, l4, verify && !inner, inner)
}

/// Parses an IPv6 packet and its extension headers (hop-by-hop, routing, destination options;
/// a fragment header is a fragment).
fn parse_ipv6(b: &[u8], verify: bool, inner: bool) -> Result<Packet<'_>, Malformed> {
    if b.len() < 40 || b[0] >> 4 != 6 {
        return Err(Malformed::BadIpHeader);
    }
    let payload = usize::from(be16(b, 4));
    if !inner && 40 + payload > b.len() {
        return Err(Malformed::BadIpHeader);
    }
    let end = (40 + payload).min(b.len());
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&b[8..24]);
    dst.copy_from_slice(&b[24..40]);
    let mut next = b[6];
    let mut off = 40;
    // A bounded walk: at most 8 extension headers.
    for _ in 0..8 {
        match next {
            0 | 43 | 60 => {
                let h = b.get(off..off + 2).ok_or(Malformed::BadExtensionHeader)?;
                let len = (usize::from(h[1]) + 1) * 8;
                if off + len > end {
                    return Err(Malformed::BadExtensionHeader);
                }
                next = h[0];
                off += len;
            }
            44 => return Err(Malformed::Fragment),
            _ => {
                let l4 = &b[off..end];
                return parse_l4(Family::V6, next, src, dst, l4, verify && !inner, inner);
            }
        }
    }
    Err(Malformed::BadExtensionHeader)
}

fn parse_l4(
    family: Family,
    proto: u8,
    src: [u8; 16],
    dst: [u8; 16],
    l4: &[u8],
    verify: bool,
    inner: bool,
) -> Result<Packet<'_>, Malformed> {
    let mut tuple = Tuple {
        family,
        proto,
        src,
        dst,
        sport: 0,
        dport: 0,
    };
    let l4v = match proto {
        IPPROTO_TCP => {
            if inner {
                // A quoted segment: only its ports are certain to be there.
                let h = l4.get(..4).ok_or(Malformed::BadIcmpInner)?;
                tuple.sport = be16(h, 0);
                tuple.dport = be16(h, 2);
                return Ok(Packet {
                    tuple,
                    l4: L4::Other,
                });
            }
            if l4.len() < 20 {
                return Err(Malformed::BadL4Header);
            }
            let doff = usize::from(l4[12] >> 4) * 4;
            if doff < 20 || doff > l4.len() {
                return Err(Malformed::BadL4Header);
            }
            if verify && l4_checksum(family, &src, &dst, proto, l4) != 0 {
                return Err(Malformed::BadL4Checksum);
            }
            tuple.sport = be16(l4, 0);
            tuple.dport = be16(l4, 2);
            L4::Tcp(TcpSegment {
                seq: be32(l4, 4),
                ack: be32(l4, 8),
                flags: l4[13],
                window: be16(l4, 14),
                options: &l4[20..doff],
                payload_len: (l4.len() - doff) as u32,
            })
        }
        IPPROTO_UDP => {
            if inner {
                let h = l4.get(..4).ok_or(Malformed::BadIcmpInner)?;
                tuple.sport = be16(h, 0);
                tuple.dport = be16(h, 2);
                return Ok(Packet {
                    tuple,
                    l4: L4::Other,
                });
            }
            if l4.len() < 8 {
                return Err(Malformed::BadL4Header);
            }
            let ulen = usize::from(be16(l4, 4));
            if ulen < 8 || ulen > l4.len() {
                return Err(Malformed::BadL4Header);
            }
            let csum = be16(l4, 6);
            let skip = family == Family::V4 && csum == 0;
            if verify && !skip && l4_checksum(family, &src, &dst, proto, &l4[..ulen]) != 0 {
                return Err(Malformed::BadL4Checksum);
            }
            tuple.sport = be16(l4, 0);
            tuple.dport = be16(l4, 2);
            L4::Udp
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let icmp_v6 = proto == IPPROTO_ICMPV6;
            if icmp_v6 != (family == Family::V6) {
                // ICMP in IPv6 or ICMPv6 in IPv4: a generic protocol, as Linux treats it.
                return Ok(Packet {
                    tuple,
                    l4: L4::Other,
                });
            }
            let h = l4.get(..8).ok_or(if inner {
                Malformed::BadIcmpInner
            } else {
                Malformed::BadL4Header
            })?;
            let (ty, code) = (h[0], h[1]);
            if is_echo_request(proto, ty) || is_query_reply(proto, ty) {
                if verify && !icmp_ok(family, &src, &dst, proto, l4) {
                    return Err(Malformed::BadL4Checksum);
                }
                tuple.sport = be16(h, 4);
                tuple.dport = u16::from(ty) << 8 | u16::from(code);
                L4::IcmpQuery {
                    request: is_echo_request(proto, ty),
                }
            } else if is_icmp_error(proto, ty) {
                if inner {
                    // An error quoting an error is never related to anything.
                    return Err(Malformed::BadIcmpInner);
                }
                if verify && !icmp_ok(family, &src, &dst, proto, l4) {
                    return Err(Malformed::BadL4Checksum);
                }
                let quoted = &l4[8..];
                let innerp = if family == Family::V4 {
                    parse_ipv4(quoted, false, false, true)
                } else {
                    parse_ipv6(quoted, false, true)
                }
                .map_err(|_| Malformed::BadIcmpInner)?;
                L4::IcmpError {
                    inner: innerp.tuple,
                }
            } else {
                if verify && !icmp_ok(family, &src, &dst, proto, l4) {
                    return Err(Malformed::BadL4Checksum);
                }
                L4::IcmpOther
            }
        }
        _ => L4::Other,
    };
    Ok(Packet { tuple, l4: l4v })
}

fn icmp_ok(family: Family, src: &[u8; 16], dst: &[u8; 16], proto: u8, l4: &[u8]) -> bool {
    if family == Family::V4 {
        sum(0, l4) == 0xffff
    } else {
        l4_checksum(family, src, dst, proto, l4) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{Frame, Proto};

    #[test]
    fn tcp_v4_tuple_and_reverse() {
        let f = Frame::v4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            Proto::tcp(1000, 80, 5, 0, TCP_SYN),
        );
        let b = f.bytes();
        let p = parse(&b, true).unwrap();
        assert_eq!(p.tuple.sport, 1000);
        assert_eq!(p.tuple.dport, 80);
        assert_eq!(p.tuple.reverse().reverse(), p.tuple);
        assert_eq!(p.tuple.canonical(), p.tuple.reverse().canonical());
        assert!(p.tuple.is_valid());
        match p.l4 {
            L4::Tcp(s) => {
                assert_eq!(s.seq, 5);
                assert_eq!(s.flags, TCP_SYN);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn vlan_and_padding() {
        let f = Frame::v4([10, 0, 0, 1], [10, 0, 0, 2], Proto::udp(1, 2, b"x")).vlan(7);
        let mut b = f.bytes();
        b.extend_from_slice(&[0; 20]); // Ethernet padding beyond the IP length
        let p = parse(&b, true).unwrap();
        assert_eq!(p.l4, L4::Udp);
    }

    #[test]
    fn echo_reply_reverses_to_request() {
        let req = Frame::v4([1, 1, 1, 1], [2, 2, 2, 2], Proto::echo(true, 77, 1));
        let rep = Frame::v4([2, 2, 2, 2], [1, 1, 1, 1], Proto::echo(false, 77, 1));
        let a = parse(&req.bytes(), true).unwrap().tuple;
        let b = parse(&rep.bytes(), true).unwrap().tuple;
        assert_eq!(a.reverse(), b);
        assert_eq!(a.canonical(), b.canonical());
        let req6 = Frame::v6(1, 2, Proto::echo(true, 9, 1));
        let rep6 = Frame::v6(2, 1, Proto::echo(false, 9, 1));
        let a = parse(&req6.bytes(), true).unwrap().tuple;
        let b = parse(&rep6.bytes(), true).unwrap().tuple;
        assert_eq!(a.reverse(), b);
    }

    #[test]
    fn icmp_error_carries_inner_tuple() {
        let udp = Frame::v4([10, 0, 0, 1], [10, 0, 0, 2], Proto::udp(5000, 53, b"q"));
        let err = Frame::v4([10, 0, 0, 9], [10, 0, 0, 1], Proto::icmp_error(3, 3, &udp));
        let b = err.bytes();
        let p = parse(&b, true).unwrap();
        let inner = parse(&udp.bytes(), true).unwrap().tuple;
        assert_eq!(p.l4, L4::IcmpError { inner });
    }

    #[test]
    fn malformed_reasons() {
        let good = Frame::v4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            Proto::tcp(1, 2, 0, 0, TCP_SYN),
        )
        .bytes();
        assert_eq!(parse(&good[..10], true), Err(Malformed::ShortEthernet));
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(parse(&arp, true), Err(Malformed::NotIp));
        let mut bad = good.clone();
        bad[14 + 10] ^= 1;
        assert_eq!(parse(&bad, true), Err(Malformed::BadIpChecksum));
        let mut bad = good.clone();
        bad[14 + 20 + 16] ^= 1;
        assert_eq!(parse(&bad, true), Err(Malformed::BadL4Checksum));
        assert!(parse(&bad, false).is_ok());
        // Truncated below the IP total length.
        assert_eq!(
            parse(&good[..good.len() - 1], true),
            Err(Malformed::BadIpHeader)
        );
        let mut frag = good.clone();
        frag[14 + 6] = 0x20; // MF
        assert!(matches!(parse(&frag, false), Err(Malformed::Fragment)));
        // TCP data offset beyond the segment.
        let mut bad = good.clone();
        bad[14 + 20 + 12] = 0xf0;
        assert_eq!(parse(&bad, false), Err(Malformed::BadL4Header));
    }

    #[test]
    fn every_truncation_is_an_error_or_a_packet() {
        let frames = [
            Frame::v4([1, 0, 0, 1], [1, 0, 0, 2], Proto::tcp(1, 2, 3, 4, TCP_ACK)).bytes(),
            Frame::v6(1, 2, Proto::udp(1, 2, b"abc")).bytes(),
            Frame::v4(
                [1, 0, 0, 9],
                [1, 0, 0, 1],
                Proto::icmp_error(
                    3,
                    3,
                    &Frame::v4([1, 0, 0, 1], [1, 0, 0, 2], Proto::udp(1, 2, b"")),
                ),
            )
            .bytes(),
        ];
        for f in &frames {
            for n in 0..=f.len() {
                let _ = parse(&f[..n], true);
            }
        }
    }
}
