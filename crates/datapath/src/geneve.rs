//! The Geneve header (RFC 8926) as a checked view, and its encoding.
//!
//! ```text
//!  0                   1                   2                   3
//! |Ver|  Opt Len  |O|C|    Rsvd.  |          Protocol Type        |
//! |        Virtual Network Identifier (VNI)       |    Reserved   |
//! |                    Variable-Length Options                    |
//! option: | Option Class (16) | Type (8) |R|R|R| Length (5) | data (Length × 4 bytes) |
//! ```
//!
//! [`Geneve::parse`] validates a datagram from an untrusted peer once: version 0, an
//! options area inside the datagram, every option's length inside the options area,
//! Ethernet payload (protocol type 0x6558) and not OAM; then the options are walked with
//! accessors that cannot fail. [`Geneve::map_options`] turns the options the bridge's
//! [`TlvMap`] names into `tun_metadataN` values and refuses a critical option (type bit
//! 0x80) it does not know, as RFC 8926 section 3.5 requires of an endpoint. [`write_header`]
//! encodes the header a flow-based port sends: the VNI and one option per set
//! `tun_metadataN` the map names.
//!
//! Nothing here allocates or panics on any input (tested with truncations and random bytes).

use ferrovs_flow::{TlvMap, TunnelKey};

/// The fixed part of the header.
pub const GENEVE_HLEN: usize = 8;
/// IANA's Geneve port.
pub const GENEVE_PORT: u16 = 6081;
/// Protocol type of an Ethernet payload ("Transparent Ethernet Bridging").
pub const ETH_BRIDGING: u16 = 0x6558;
/// The OAM flag (byte 1).
const FLAG_O: u8 = 0x80;
/// The "critical options present" flag (byte 1).
const FLAG_C: u8 = 0x40;
/// The critical bit of an option type.
pub const OPT_CRITICAL: u8 = 0x80;
/// Longest header we write: the fixed part and four 4-byte options.
pub const MAX_TX_HLEN: usize = GENEVE_HLEN + 4 * 8;

/// Why a datagram is not a Geneve frame we take (each a drop reason of the port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeneveError {
    /// Shorter than the fixed header and an Ethernet header.
    Runt,
    /// Version not 0.
    BadVersion,
    /// The options area or one option runs past the datagram (or the options area).
    BadLength,
    /// A payload that is not Ethernet.
    BadProtocol,
    /// An OAM frame (no OAM handling here).
    Oam,
    /// A critical option the map does not know.
    UnknownCritical,
}

/// A validated Geneve header at the start of a datagram.
#[derive(Debug, Clone, Copy)]
pub struct Geneve<'a> {
    /// The header's bytes (fixed part and options).
    hdr: &'a [u8],
}

/// One option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneveOpt<'a> {
    pub class: u16,
    /// With its critical bit.
    pub kind: u8,
    pub data: &'a [u8],
}

impl<'a> Geneve<'a> {
    /// Checks the header at the start of `d` (the UDP payload); the inner frame starts at
    /// [`Geneve::len`].
    pub fn parse(d: &'a [u8]) -> Result<Geneve<'a>, GeneveError> {
        if d.len() < GENEVE_HLEN + 14 {
            return Err(GeneveError::Runt);
        }
        if d[0] >> 6 != 0 {
            return Err(GeneveError::BadVersion);
        }
        let hlen = GENEVE_HLEN + usize::from(d[0] & 0x3f) * 4;
        if d.len() < hlen + 14 {
            return Err(GeneveError::BadLength);
        }
        if u16::from_be_bytes([d[2], d[3]]) != ETH_BRIDGING {
            return Err(GeneveError::BadProtocol);
        }
        if d[1] & FLAG_O != 0 {
            return Err(GeneveError::Oam);
        }
        // Every option inside the options area.
        let mut o = GENEVE_HLEN;
        while o < hlen {
            if o + 4 > hlen {
                return Err(GeneveError::BadLength);
            }
            o += 4 + usize::from(d[o + 3] & 0x1f) * 4;
            if o > hlen {
                return Err(GeneveError::BadLength);
            }
        }
        Ok(Geneve { hdr: &d[..hlen] })
    }

    /// Header length (fixed part and options): where the inner frame starts.
    #[allow(clippy::len_without_is_empty)]
    #[inline]
    pub fn len(&self) -> usize {
        self.hdr.len()
    }

    #[inline]
    pub fn vni(&self) -> u32 {
        u32::from_be_bytes([0, self.hdr[4], self.hdr[5], self.hdr[6]])
    }

    /// The C flag: the sender says a critical option is present.
    #[inline]
    pub fn critical(&self) -> bool {
        self.hdr[1] & FLAG_C != 0
    }

    /// The options, in order (validated by [`Geneve::parse`]).
    #[inline]
    pub fn options(&self) -> impl Iterator<Item = GeneveOpt<'a>> + 'a {
        let h = self.hdr;
        let mut o = GENEVE_HLEN;
        std::iter::from_fn(move || {
            let head = h.get(o..o + 4)?;
            let n = usize::from(head[3] & 0x1f) * 4;
            let data = h.get(o + 4..o + 4 + n)?;
            o += 4 + n;
            Some(GeneveOpt {
                class: u16::from_be_bytes([head[0], head[1]]),
                kind: head[2],
                data,
            })
        })
    }

    /// Writes the options `map` names into `t` (`meta[N]` and bit N of `present`); an
    /// option it does not name is skipped, unless critical: then the frame must be dropped
    /// (`UnknownCritical`).
    #[inline]
    pub fn map_options(&self, map: &TlvMap, t: &mut TunnelKey) -> Result<(), GeneveError> {
        for opt in self.options() {
            match map.by_option(opt.class, opt.kind, opt.data.len()) {
                Some(e) => {
                    let i = usize::from(e.index);
                    if let (Some(m), Ok(v)) = (t.meta.get_mut(i), <[u8; 4]>::try_from(opt.data)) {
                        *m = u32::from_be_bytes(v);
                    }
                    t.present |= 1 << i;
                }
                None if opt.kind & OPT_CRITICAL != 0 => return Err(GeneveError::UnknownCritical),
                None => {}
            }
        }
        Ok(())
    }
}

/// Writes the header for VNI `vni` and, with `t`, one option per present `tun_metadataN`
/// that `map` names, into the front of `buf` (at least [`MAX_TX_HLEN`] bytes); returns its
/// length. The C flag is set when an option written is critical.
#[inline]
pub fn write_header(buf: &mut [u8], vni: u32, t: Option<&TunnelKey>, map: &TlvMap) -> usize {
    let mut o = GENEVE_HLEN;
    let mut crit = false;
    if let Some(t) = t.filter(|t| t.present != 0) {
        for (i, v) in t.meta.iter().enumerate() {
            if t.present & (1 << i) == 0 {
                continue;
            }
            let Some(e) = map.by_index(i) else { continue };
            let n = usize::from(e.len);
            let Some(b) = buf.get_mut(o..o + 4 + n) else {
                break;
            };
            b[..2].copy_from_slice(&e.class.to_be_bytes());
            b[2] = e.kind;
            b[3] = (n / 4) as u8;
            if n == 4 {
                b[4..8].copy_from_slice(&v.to_be_bytes());
            }
            crit |= e.kind & OPT_CRITICAL != 0;
            o += 4 + n;
        }
    }
    let h = &mut buf[..GENEVE_HLEN];
    h[0] = ((o - GENEVE_HLEN) / 4) as u8;
    h[1] = if crit { FLAG_C } else { 0 };
    h[2..4].copy_from_slice(&ETH_BRIDGING.to_be_bytes());
    h[4..7].copy_from_slice(&vni.to_be_bytes()[1..]);
    h[7] = 0;
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_flow::TlvEntry;

    const OVN: TlvEntry = TlvEntry {
        class: 0x0102,
        kind: 0x80,
        len: 4,
        index: 0,
    };

    fn inner() -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f
    }

    /// A Geneve datagram of the shape OVS pushes for OVN (OVS prints it as
    /// `geneve(crit,vni=0x7b,options({class=0x102,type=0x80,len=4,0x...}))`: the C flag, VNI
    /// 0x7b, one critical 4-byte option of OVN's class 0x0102, type 0x80), with the inner
    /// frame behind it. The bytes follow RFC 8926 figures 2 and 3 field by field.
    fn ovn_datagram(opt: u32) -> Vec<u8> {
        let mut d = vec![
            0x02, 0x40, 0x65, 0x58, 0x00, 0x00, 0x7b, 0x00, // ver 0, optlen 2, C, VNI 0x7b
            0x01, 0x02, 0x80, 0x01, // class 0x0102, type 0x80, length 1 (4 bytes)
        ];
        d.extend_from_slice(&opt.to_be_bytes());
        d.extend_from_slice(&inner());
        d
    }

    #[test]
    fn ovn_s_header_parses_and_maps_to_tun_metadata0() {
        let d = ovn_datagram(0x0001_0002);
        let g = Geneve::parse(&d).unwrap();
        assert_eq!((g.len(), g.vni(), g.critical()), (16, 0x7b, true));
        let opts: Vec<_> = g.options().collect();
        assert_eq!(
            opts,
            [GeneveOpt {
                class: 0x0102,
                kind: 0x80,
                data: &[0, 1, 0, 2]
            }]
        );
        assert_eq!(&d[g.len()..], &inner()[..]);
        let map = TlvMap::new([OVN]).unwrap();
        let mut t = TunnelKey::default();
        g.map_options(&map, &mut t).unwrap();
        assert_eq!((t.meta[0], t.present), (0x0001_0002, 1));
        // Without the map the critical option is unknown: drop.
        let mut t = TunnelKey::default();
        assert_eq!(
            g.map_options(&TlvMap::default(), &mut t),
            Err(GeneveError::UnknownCritical)
        );
    }

    #[test]
    fn written_header_is_what_ovs_sends_and_round_trips() {
        let map = TlvMap::new([OVN]).unwrap();
        let t = TunnelKey {
            id: 0x7b,
            meta: [0x0001_0002, 0, 0, 0],
            present: 1,
            ..TunnelKey::default()
        };
        let mut buf = [0u8; MAX_TX_HLEN];
        let n = write_header(&mut buf, 0x7b, Some(&t), &map);
        assert_eq!(&buf[..n], &ovn_datagram(0x0001_0002)[..16]);
        // No option set, or none mapped: the bare 8-byte header.
        let n = write_header(&mut buf, 5, None, &map);
        assert_eq!(&buf[..n], &[0, 0, 0x65, 0x58, 0, 0, 5, 0]);
        let n = write_header(&mut buf, 5, Some(&t), &TlvMap::default());
        assert_eq!(n, GENEVE_HLEN);
        // Non-critical options of 0 and 4 bytes; a present index without a mapping is left
        // out.
        let map = TlvMap::new([
            TlvEntry {
                class: 0xffff,
                kind: 0x01,
                len: 0,
                index: 1,
            },
            TlvEntry {
                class: 0x0001,
                kind: 0x02,
                len: 4,
                index: 3,
            },
        ])
        .unwrap();
        let t = TunnelKey {
            meta: [9, 0, 0, 0xdead_beef],
            present: 0b1011,
            ..TunnelKey::default()
        };
        let mut d = vec![0u8; MAX_TX_HLEN];
        let n = write_header(&mut d, 0xff_ffff, Some(&t), &map);
        d.truncate(n);
        assert_eq!(
            d,
            [
                0x03, 0x00, 0x65, 0x58, 0xff, 0xff, 0xff, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0x01,
                0x02, 0x01, 0xde, 0xad, 0xbe, 0xef
            ]
        );
        d.extend_from_slice(&inner());
        let g = Geneve::parse(&d).unwrap();
        let mut back = TunnelKey::default();
        g.map_options(&map, &mut back).unwrap();
        assert_eq!((back.meta, back.present), ([0, 0, 0, 0xdead_beef], 0b1010));
    }

    #[test]
    fn malformed_and_malicious_headers_are_refused() {
        let good = ovn_datagram(7);
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut d = good.clone();
            f(&mut d);
            Geneve::parse(&d).map(|g| g.len())
        };
        assert_eq!(bad(&|d| d[0] |= 0x40), Err(GeneveError::BadVersion));
        assert_eq!(bad(&|d| d[0] |= 0x80), Err(GeneveError::BadVersion));
        assert_eq!(bad(&|d| d[2] = 0x08), Err(GeneveError::BadProtocol));
        assert_eq!(bad(&|d| d[1] |= FLAG_O), Err(GeneveError::Oam));
        // Options area beyond the datagram (63 × 4 bytes).
        assert_eq!(bad(&|d| d[0] = 0x3f), Err(GeneveError::BadLength));
        // An option longer than the options area.
        assert_eq!(bad(&|d| d[11] = 2), Err(GeneveError::BadLength));
        assert_eq!(bad(&|d| d[11] = 0x1f), Err(GeneveError::BadLength));
        // An options area one word longer takes the next word as a zero-length option.
        assert_eq!(bad(&|d| d[0] = 3), Ok(20));
        // The reserved bits of the option length byte are ignored (length is 5 bits).
        assert_eq!(bad(&|d| d[11] = 0xe1), Ok(16));
        // A non-critical unknown option is skipped.
        let mut d = good.clone();
        d[10] = 0x05;
        let g = Geneve::parse(&d).unwrap();
        let mut t = TunnelKey::default();
        g.map_options(&TlvMap::new([OVN]).unwrap(), &mut t).unwrap();
        assert_eq!(t.present, 0);
        // Every truncation: an error, never a panic; the full datagram parses.
        for n in 0..good.len() {
            let r = Geneve::parse(&good[..n]);
            assert!(r.is_err() || n >= 16 + 14, "{n}");
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let map = TlvMap::new([OVN]).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut parsed = 0;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 200) as usize;
            let mut d: Vec<u8> = (0..len).map(|i| (x >> (i % 57)) as u8).collect();
            if len > 4 {
                // Often a plausible header, so the option walk runs.
                d[0] &= 0x0f;
                d[1] &= 0x7f;
                d[2..4].copy_from_slice(&ETH_BRIDGING.to_be_bytes());
            }
            if let Ok(g) = Geneve::parse(&d) {
                parsed += 1;
                assert!(g.len() <= d.len());
                let total: usize = g.options().map(|o| 4 + o.data.len()).sum();
                assert_eq!(GENEVE_HLEN + total, g.len());
                let _ = g.map_options(&map, &mut TunnelKey::default());
            }
        }
        assert!(parsed > 100, "{parsed}");
    }
}
