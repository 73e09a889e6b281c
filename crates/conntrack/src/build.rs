//! A builder of well-formed test frames (Ethernet, optional VLAN, IPv4/IPv6, TCP with options
//! and data, UDP, ICMP/ICMPv6 echo and errors) with correct checksums.
//!
//! It is the test double of the tracker: unit tests, the differential test against the kernel
//! and the fuzz target's seeds build their packet sequences with it. Not for the packet path
//! (it allocates).
//!
//! Thread-safety: plain values.

use crate::tuple::{Family, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6};

/// An L4 header and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proto {
    Tcp {
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        window: u16,
        options: Vec<u8>,
        payload: Vec<u8>,
    },
    Udp {
        sport: u16,
        dport: u16,
        payload: Vec<u8>,
    },
    /// An echo request or reply (ICMP or ICMPv6 after the frame's family).
    Echo { request: bool, id: u16, seq: u16 },
    /// An ICMP error quoting `quoted` (an IP packet); the type and code are the family's.
    IcmpError { ty: u8, code: u8, quoted: Vec<u8> },
    /// Any protocol number with a raw payload.
    Raw { proto: u8, payload: Vec<u8> },
}

impl Proto {
    /// A TCP segment with a 65535 window, no options and no data.
    pub fn tcp(sport: u16, dport: u16, seq: u32, ack: u32, flags: u8) -> Proto {
        Proto::Tcp {
            sport,
            dport,
            seq,
            ack,
            flags,
            window: 65535,
            options: Vec::new(),
            payload: Vec::new(),
        }
    }

    pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Proto {
        Proto::Udp {
            sport,
            dport,
            payload: payload.to_vec(),
        }
    }

    pub fn echo(request: bool, id: u16, seq: u16) -> Proto {
        Proto::Echo { request, id, seq }
    }

    /// An error quoting the IP packet of `frame` (its first 64 bytes at most).
    pub fn icmp_error(ty: u8, code: u8, frame: &Frame) -> Proto {
        let mut quoted = frame.ip_bytes();
        quoted.truncate(64);
        Proto::IcmpError { ty, code, quoted }
    }

    /// Sets a TCP segment's window.
    pub fn window(mut self, w: u16) -> Proto {
        if let Proto::Tcp { window, .. } = &mut self {
            *window = w;
        }
        self
    }

    /// Sets a TCP segment's options (padded with EOL to a multiple of 4).
    pub fn options(mut self, o: &[u8]) -> Proto {
        if let Proto::Tcp { options, .. } = &mut self {
            *options = o.to_vec();
            while options.len() % 4 != 0 {
                options.push(0);
            }
        }
        self
    }

    /// Sets a TCP segment's data to `n` bytes.
    pub fn data(mut self, n: usize) -> Proto {
        if let Proto::Tcp { payload, .. } = &mut self {
            *payload = vec![0x61; n];
        }
        self
    }
}

/// An Ethernet frame carrying one IP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub family: Family,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub proto: Proto,
    pub vlan: Option<u16>,
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub ttl: u8,
}

impl Frame {
    pub fn v4(src: [u8; 4], dst: [u8; 4], proto: Proto) -> Frame {
        let mut s = [0; 16];
        let mut d = [0; 16];
        s[..4].copy_from_slice(&src);
        d[..4].copy_from_slice(&dst);
        Frame::new(Family::V4, s, d, proto)
    }

    /// IPv6 between `fd00::<src>` and `fd00::<dst>`.
    pub fn v6(src: u16, dst: u16, proto: Proto) -> Frame {
        let mut s = [0; 16];
        let mut d = [0; 16];
        s[0] = 0xfd;
        d[0] = 0xfd;
        s[14..].copy_from_slice(&src.to_be_bytes());
        d[14..].copy_from_slice(&dst.to_be_bytes());
        Frame::new(Family::V6, s, d, proto)
    }

    pub fn new(family: Family, src: [u8; 16], dst: [u8; 16], proto: Proto) -> Frame {
        Frame {
            family,
            src,
            dst,
            proto,
            vlan: None,
            dst_mac: [0x02, 0, 0, 0, 0, 2],
            src_mac: [0x02, 0, 0, 0, 0, 1],
            ttl: 64,
        }
    }

    pub fn vlan(mut self, vid: u16) -> Frame {
        self.vlan = Some(vid);
        self
    }

    pub fn macs(mut self, dst: [u8; 6], src: [u8; 6]) -> Frame {
        self.dst_mac = dst;
        self.src_mac = src;
        self
    }

    fn proto_number(&self) -> u8 {
        match &self.proto {
            Proto::Tcp { .. } => 6,
            Proto::Udp { .. } => 17,
            Proto::Echo { .. } | Proto::IcmpError { .. } => match self.family {
                Family::V4 => IPPROTO_ICMP,
                Family::V6 => IPPROTO_ICMPV6,
            },
            Proto::Raw { proto, .. } => *proto,
        }
    }

    fn l4_bytes(&self) -> Vec<u8> {
        let v6 = self.family == Family::V6;
        let mut l4 = match &self.proto {
            Proto::Tcp {
                sport,
                dport,
                seq,
                ack,
                flags,
                window,
                options,
                payload,
            } => {
                let mut h = Vec::with_capacity(20 + options.len() + payload.len());
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&seq.to_be_bytes());
                h.extend_from_slice(&ack.to_be_bytes());
                h.push((((20 + options.len()) / 4) as u8) << 4);
                h.push(*flags);
                h.extend_from_slice(&window.to_be_bytes());
                h.extend_from_slice(&[0, 0, 0, 0]);
                h.extend_from_slice(options);
                h.extend_from_slice(payload);
                h
            }
            Proto::Udp {
                sport,
                dport,
                payload,
            } => {
                let mut h = Vec::new();
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
                h.extend_from_slice(&[0, 0]);
                h.extend_from_slice(payload);
                h
            }
            Proto::Echo { request, id, seq } => {
                let ty = match (v6, request) {
                    (false, true) => 8,
                    (false, false) => 0,
                    (true, true) => 128,
                    (true, false) => 129,
                };
                let mut h = vec![ty, 0, 0, 0];
                h.extend_from_slice(&id.to_be_bytes());
                h.extend_from_slice(&seq.to_be_bytes());
                h.extend_from_slice(b"ferrovs-ping");
                h
            }
            Proto::IcmpError { ty, code, quoted } => {
                let mut h = vec![*ty, *code, 0, 0, 0, 0, 0, 0];
                h.extend_from_slice(quoted);
                h
            }
            Proto::Raw { payload, .. } => payload.clone(),
        };
        let proto = self.proto_number();
        let csum_at = match &self.proto {
            Proto::Tcp { .. } => Some(16),
            Proto::Udp { .. } => Some(6),
            Proto::Echo { .. } | Proto::IcmpError { .. } => Some(2),
            Proto::Raw { .. } => None,
        };
        if let Some(at) = csum_at {
            let pseudo = proto != IPPROTO_ICMP;
            let c = checksum(self.family, &self.src, &self.dst, proto, &l4, pseudo);
            let c = if proto == 17 && c == 0 { 0xffff } else { c };
            l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        l4
    }

    /// The IP packet (no Ethernet header).
    pub fn ip_bytes(&self) -> Vec<u8> {
        let l4 = self.l4_bytes();
        let proto = self.proto_number();
        let mut ip = Vec::with_capacity(40 + l4.len());
        match self.family {
            Family::V4 => {
                ip.extend_from_slice(&[0x45, 0]);
                ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
                ip.extend_from_slice(&[0, 1, 0x40, 0, self.ttl, proto, 0, 0]);
                ip.extend_from_slice(&self.src[..4]);
                ip.extend_from_slice(&self.dst[..4]);
                let c = !fold(sum(0, &ip));
                ip[10..12].copy_from_slice(&c.to_be_bytes());
            }
            Family::V6 => {
                ip.extend_from_slice(&[0x60, 0, 0, 0]);
                ip.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                ip.push(proto);
                ip.push(self.ttl);
                ip.extend_from_slice(&self.src);
                ip.extend_from_slice(&self.dst);
            }
        }
        ip.extend_from_slice(&l4);
        ip
    }

    /// The whole frame.
    pub fn bytes(&self) -> Vec<u8> {
        let mut f = Vec::with_capacity(80);
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        if let Some(vid) = self.vlan {
            f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
            f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
        }
        let et = match self.family {
            Family::V4 => ETH_P_IPV4,
            Family::V6 => ETH_P_IPV6,
        };
        f.extend_from_slice(&et.to_be_bytes());
        f.extend_from_slice(&self.ip_bytes());
        f
    }
}

fn sum(mut acc: u32, b: &[u8]) -> u32 {
    for c in b.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

fn checksum(f: Family, src: &[u8; 16], dst: &[u8; 16], proto: u8, l4: &[u8], pseudo: bool) -> u16 {
    let mut acc = 0;
    if pseudo {
        let n = if f == Family::V4 { 4 } else { 16 };
        acc = sum(acc, &src[..n]);
        acc = sum(acc, &dst[..n]);
        acc += l4.len() as u32;
        acc += u32::from(proto);
    }
    !fold(sum(acc, l4))
}
