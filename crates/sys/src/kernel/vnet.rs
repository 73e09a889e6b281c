//! The virtio-net header (`struct virtio_net_hdr`, virtio 1.x §5.1.6) as plain data: the
//! offload metadata a packet carries between ports.
//!
//! A guest (or the host stack, through a TAP with `IFF_VNET_HDR`) puts it in front of every
//! packet: "the checksum from `csum_start` to the end is still to be computed and stored at
//! `csum_start + csum_offset`" (`NEEDS_CSUM`, the partial checksum) and "this is one large TCP
//! segment to be cut into `gso_size`-byte pieces" (`gso_type`). ferrovs keeps it beside the
//! packet ([`crate::pool::Mbuf::vnet`]) and, at each output port, passes it on when the port
//! accepts it or does the work in software when it does not (`ferrovs_packet::offload`).
//!
//! Nothing here is unsafe; it lives in ferrovs-sys because the pool and the TAP need it.

/// `flags`: the checksum from `csum_start` on is to be completed.
pub const F_NEEDS_CSUM: u8 = 1;
/// `flags`: the checksum was validated (receive side).
pub const F_DATA_VALID: u8 = 2;

/// `gso_type` values.
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
/// `gso_type` bit: the segment carries ECN CWR (set on the first segment only).
pub const GSO_ECN: u8 = 0x80;

/// Length of the header without `num_buffers` (legacy layout).
pub const HDR_LEN: usize = 10;

/// The offload part of a virtio-net header (everything but `num_buffers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Parses the first [`HDR_LEN`] bytes (little-endian, as with VERSION_1 and on a TAP).
    #[inline]
    pub fn from_bytes(b: &[u8; HDR_LEN]) -> VnetHdr {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    /// The wire form.
    #[inline]
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }

    /// Whether the checksum is still to be completed.
    #[inline]
    pub fn needs_csum(&self) -> bool {
        self.flags & F_NEEDS_CSUM != 0
    }

    /// The segmentation asked for, without the ECN bit.
    #[inline]
    pub fn gso(&self) -> u8 {
        self.gso_type & !GSO_ECN
    }

    /// Whether anything is asked of the next hop (a checksum or a segmentation).
    #[inline]
    pub fn is_offload(&self) -> bool {
        self.needs_csum() || self.gso() != GSO_NONE
    }
}

/// What a port accepts of a packet's offload metadata (bits).
pub mod caps {
    /// Partial checksums (`NEEDS_CSUM`).
    pub const CSUM: u8 = 1;
    /// TCP over IPv4 segmentation.
    pub const TSO4: u8 = 2;
    /// TCP over IPv6 segmentation.
    pub const TSO6: u8 = 4;
    /// ECN with TSO.
    pub const TSO_ECN: u8 = 8;
    /// Everything ferrovs knows of.
    pub const ALL: u8 = CSUM | TSO4 | TSO6 | TSO_ECN;

    /// Whether a port with `caps` takes a packet with `hdr` as it is.
    #[inline]
    pub fn accepts(caps: u8, hdr: &super::VnetHdr) -> bool {
        if hdr.needs_csum() && caps & CSUM == 0 {
            return false;
        }
        let need = match hdr.gso() {
            super::GSO_NONE => return true,
            super::GSO_TCPV4 => TSO4,
            super::GSO_TCPV6 => TSO6,
            _ => return false,
        };
        let ecn = if hdr.gso_type & super::GSO_ECN != 0 {
            TSO_ECN
        } else {
            0
        };
        caps & (need | ecn) == need | ecn
    }

    /// Names for `ferrovs show`.
    pub fn names(caps: u8) -> Vec<&'static str> {
        [
            (CSUM, "csum"),
            (TSO4, "tso4"),
            (TSO6, "tso6"),
            (TSO_ECN, "tso_ecn"),
        ]
        .iter()
        .filter(|(b, _)| caps & b != 0)
        .map(|(_, n)| *n)
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_acceptance() {
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4 | GSO_ECN,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        assert_eq!(VnetHdr::from_bytes(&h.to_bytes()), h);
        assert!(h.is_offload() && h.needs_csum() && h.gso() == GSO_TCPV4);
        assert!(caps::accepts(caps::ALL, &h));
        assert!(!caps::accepts(caps::CSUM | caps::TSO4, &h), "ECN not taken");
        assert!(!caps::accepts(caps::TSO4 | caps::TSO_ECN, &h), "no csum");
        let c = VnetHdr {
            flags: F_NEEDS_CSUM,
            ..Default::default()
        };
        assert!(caps::accepts(caps::CSUM, &c) && !caps::accepts(0, &c));
        assert!(caps::accepts(0, &VnetHdr::default()));
        let udp = VnetHdr {
            gso_type: GSO_UDP_L4,
            ..c
        };
        assert!(!caps::accepts(caps::ALL, &udp));
    }
}
