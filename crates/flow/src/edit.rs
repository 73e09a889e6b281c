//! Header rewrites for `set_field` actions, in place, with incremental checksum updates
//! (RFC 1624): the IPv4 header checksum, and the TCP/UDP/ICMPv6 checksum over the
//! pseudo-header when an address changes or over the port (ICMP type and code, ND target and
//! link-layer address options) when one of those does; the ICMPv4 checksum covers no
//! pseudo-header, so only its own bytes' edits update it. ARP has no checksum; the IPv6
//! flow label is in no checksum. An IPv4 UDP checksum of 0 ("none") stays 0. A packet whose L4 checksum the next hop completes (virtio
//! `NEEDS_CSUM`: the field holds the pseudo-header sum, not complemented) is updated as
//! such when `partial_l4` is set.

use crate::key::{
    is_mpls, Field, ETH_ARP, ETH_IPV4, ETH_IPV6, ETH_VLAN, IP_ICMP, IP_ICMPV6, IP_TCP, IP_UDP,
    ND_NA, ND_NS,
};

/// Why a rewrite could not be done (the frame is left as it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("the frame has no {0} header")]
    Missing(&'static str),
    #[error("field {0:?} cannot be rewritten in a frame")]
    NotEditable(Field),
}

fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn wr16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// One's-complement sum of 16-bit words (no final fold).
fn sum_words(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// A checksum field `hc` (complemented) after bytes `old` became `new` (same length).
fn update_csum(hc: u16, old: &[u8], new: &[u8]) -> u16 {
    // HC' = ~(~HC + ~m + m')
    let mut s = u32::from(!hc);
    for c in old.chunks(2) {
        s += u32::from(!u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    s += sum_words(new);
    !fold(s)
}

/// A non-complemented sum field (a partial checksum) after `old` became `new`.
fn update_partial(sum: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut s = u32::from(sum);
    for c in old.chunks(2) {
        s += u32::from(!u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    s += sum_words(new);
    fold(s)
}

struct Layout {
    l3: usize,
    ethertype: u16,
    /// (offset, protocol) of TCP/UDP/ICMP/ICMPv6, when directly after the IP header (and
    /// not a later fragment) with its checksum in the frame.
    l4: Option<(usize, u8)>,
}

fn layout(f: &[u8]) -> Option<Layout> {
    let mut ty = u16::from_be_bytes(f.get(12..14)?.try_into().ok()?);
    let mut l3 = 14;
    if ty == ETH_VLAN {
        ty = u16::from_be_bytes(f.get(16..18)?.try_into().ok()?);
        l3 = 18;
    }
    let l4 = match ty {
        ETH_IPV4 => {
            let ihl = usize::from(*f.get(l3)? & 0x0f) * 4;
            if ihl < 20 || f.len() < l3 + ihl {
                return None;
            }
            let later = rd16(f, l3 + 6) & 0x1fff != 0;
            let proto = f[l3 + 9];
            (!later && matches!(proto, IP_TCP | IP_UDP | IP_ICMP)).then_some((l3 + ihl, proto))
        }
        ETH_IPV6 => {
            if f.len() < l3 + 40 {
                return None;
            }
            let proto = f[l3 + 6];
            matches!(proto, IP_TCP | IP_UDP | IP_ICMPV6).then_some((l3 + 40, proto))
        }
        _ => None,
    };
    Some(Layout {
        l3,
        ethertype: ty,
        l4: l4.filter(|(o, p)| {
            f.len()
                >= o + match *p {
                    IP_TCP => 20,
                    IP_UDP => 8,
                    _ => 4,
                }
        }),
    })
}

/// Offset of the L4 checksum field.
fn l4_csum_at(l4: usize, proto: u8) -> usize {
    match proto {
        IP_TCP => l4 + 16,
        IP_UDP => l4 + 6,
        _ => l4 + 2,
    }
}

/// Which L4 checksum an edit touches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum L4 {
    /// None (an L3 field outside the pseudo-header, or no L4 header).
    No,
    /// Bytes of the pseudo-header (IP addresses): TCP, UDP and ICMPv6, not ICMPv4.
    Pseudo,
    /// Bytes of the L4 header itself.
    Body,
}

/// Rewrites bytes `at..at+new.len()` and fixes the checksums that cover them: the IPv4
/// header checksum if `ip_hdr`, the L4 one if `l4` (pseudo-header or L4 header bytes).
fn rewrite(f: &mut [u8], lay: &Layout, at: usize, new: &[u8], ip_hdr: bool, l4: L4, partial: bool) {
    let old: Vec<u8> = f[at..at + new.len()].to_vec();
    if old == new {
        return;
    }
    if ip_hdr && lay.ethertype == ETH_IPV4 {
        let c = rd16(f, lay.l3 + 10);
        wr16(f, lay.l3 + 10, update_csum(c, &old, new));
    }
    let covered = match (l4, lay.l4) {
        (L4::No, _) | (_, None) => None,
        (L4::Pseudo, Some((_, IP_ICMP))) => None,
        (_, Some(x)) => Some(x),
    };
    if let Some((o, proto)) = covered {
        let at_c = l4_csum_at(o, proto);
        let c = rd16(f, at_c);
        let v4_udp_none = proto == IP_UDP && lay.ethertype == ETH_IPV4 && c == 0;
        if partial {
            wr16(f, at_c, update_partial(c, &old, new));
        } else if !v4_udp_none {
            let mut n = update_csum(c, &old, new);
            if proto == IP_UDP && n == 0 {
                n = 0xffff;
            }
            wr16(f, at_c, n);
        }
    }
    f[at..at + new.len()].copy_from_slice(new);
}

/// Where an NS/NA's field `fld` is: the target address, or the link-layer address in the
/// first source (`ArpSha`, type 1) or target (`ArpTha`, type 2) address option of length 1.
/// `None` when the frame is no ND message (ICMPv6 type 135/136, code 0) or lacks it.
fn nd_offset(f: &[u8], lay: &Layout, fld: Field) -> Option<usize> {
    let (o, IP_ICMPV6) = lay.l4? else {
        return None;
    };
    if f.len() < o + 24 || !matches!(f[o], ND_NS | ND_NA) || f[o + 1] != 0 {
        return None;
    }
    let want = match fld {
        Field::NdTarget => return Some(o + 8),
        Field::ArpSha => 1,
        _ => 2,
    };
    let mut off = o + 24;
    while f.len() >= off + 8 {
        let len = usize::from(f[off + 1]) * 8;
        if len == 0 || len > f.len() - off {
            return None;
        }
        if f[off] == want && len == 8 {
            return Some(off + 2);
        }
        off += len;
    }
    None
}

/// VLAN Ethertypes the MPLS edits step over (802.1Q and 802.1ad), as OVS inserts a label
/// stack after every VLAN tag.
const ETH_QINQ: u16 = 0x88a8;

/// Offset of the Ethertype after the MAC addresses and any VLAN tags; `None` when the frame
/// ends before it.
pub fn ethertype_at(f: &[u8]) -> Option<usize> {
    let mut at = 12;
    loop {
        let ty = u16::from_be_bytes(f.get(at..at + 2)?.try_into().ok()?);
        if ty != ETH_VLAN && ty != ETH_QINQ {
            return Some(at);
        }
        at += 4;
    }
}

/// The offset of the top MPLS label stack entry of `f`, if it is an MPLS frame holding one.
fn top_lse_at(f: &[u8]) -> Option<usize> {
    let at = ethertype_at(f)?;
    let ty = rd16(f, at);
    (is_mpls(ty) && f.len() >= at + 6).then_some(at + 2)
}

fn set_mpls_field(f: &mut [u8], fld: Field, v: u32) -> Result<(), EditError> {
    let at = top_lse_at(f).ok_or(EditError::Missing("MPLS"))?;
    let lse = u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
    let (mask, val) = match fld {
        Field::MplsLabel => (0xffff_f000, (v & 0xfffff) << 12),
        Field::MplsTc => (0xe00, (v & 7) << 9),
        Field::MplsBos => (0x100, (v & 1) << 8),
        _ => (0xff, v & 0xff),
    };
    f[at..at + 4].copy_from_slice(&((lse & !mask) | val).to_be_bytes());
    Ok(())
}

/// Pushes an MPLS label stack entry: `frame` is the frame with 4 bytes of room in front
/// (the frame itself starts at `frame[4..]`); afterwards `frame` is the frame with entry
/// `lse` (label·tc·bos·ttl) after the MAC addresses and VLAN tags and Ethertype
/// `ethertype`. False (nothing moved) when the frame has no complete Ethertype.
pub fn push_mpls_in_place(frame: &mut [u8], ethertype: u16, lse: u32) -> bool {
    let Some(at) = frame.get(4..).and_then(ethertype_at) else {
        return false;
    };
    frame.copy_within(4..4 + at, 0);
    frame[at..at + 2].copy_from_slice(&ethertype.to_be_bytes());
    frame[at + 2..at + 6].copy_from_slice(&lse.to_be_bytes());
    true
}

/// Pops the top MPLS label stack entry of an MPLS frame, the Ethertype becoming
/// `ethertype`: the headers before it move 4 bytes on, the frame then starts at
/// `frame[4..]`. False (the frame untouched) when it is not MPLS or holds no entry.
pub fn pop_mpls_in_place(frame: &mut [u8], ethertype: u16) -> bool {
    let Some(lse) = top_lse_at(frame) else {
        return false;
    };
    // The new Ethertype takes the entry's last two bytes; the headers before move up to it.
    let at = lse - 2;
    frame[lse + 2..lse + 4].copy_from_slice(&ethertype.to_be_bytes());
    frame.copy_within(0..at, 4);
    true
}

/// Sets field `fld` of `frame` to `v` (see the module doc).
pub fn set_field(frame: &mut [u8], fld: Field, v: u128, partial_l4: bool) -> Result<(), EditError> {
    match fld {
        Field::EthDst | Field::EthSrc => {
            if frame.len() < 14 {
                return Err(EditError::Missing("Ethernet"));
            }
            let at = if fld == Field::EthDst { 0 } else { 6 };
            frame[at..at + 6].copy_from_slice(&(v as u64).to_be_bytes()[2..]);
            return Ok(());
        }
        Field::MplsLabel | Field::MplsTc | Field::MplsTtl | Field::MplsBos => {
            return set_mpls_field(frame, fld, v as u32);
        }
        _ => {}
    }
    let lay = layout(frame).ok_or(EditError::Missing("IP"))?;
    let v4 = lay.ethertype == ETH_IPV4;
    let v6 = lay.ethertype == ETH_IPV6;
    let l3 = lay.l3;
    match fld {
        Field::Ipv4Src | Field::Ipv4Dst if v4 => {
            let at = l3 + if fld == Field::Ipv4Src { 12 } else { 16 };
            rewrite(
                frame,
                &lay,
                at,
                &(v as u32).to_be_bytes(),
                true,
                L4::Pseudo,
                partial_l4,
            );
        }
        Field::Ipv6Src | Field::Ipv6Dst if v6 => {
            let at = l3 + if fld == Field::Ipv6Src { 8 } else { 24 };
            rewrite(
                frame,
                &lay,
                at,
                &v.to_be_bytes(),
                false,
                L4::Pseudo,
                partial_l4,
            );
        }
        Field::IpTos if v4 => {
            let new = [frame[l3], v as u8];
            rewrite(frame, &lay, l3, &new, true, L4::No, false);
        }
        Field::IpTos if v6 => {
            // Traffic class spans the first two bytes: version(4) tc(8) flow(4..).
            let tc = v as u8;
            let b0 = (frame[l3] & 0xf0) | (tc >> 4);
            let b1 = (frame[l3 + 1] & 0x0f) | (tc << 4);
            frame[l3] = b0;
            frame[l3 + 1] = b1;
        }
        Field::IpTtl if v4 => {
            let new = [v as u8, frame[l3 + 9]];
            rewrite(frame, &lay, l3 + 8, &new, true, L4::No, false);
        }
        Field::IpTtl if v6 => frame[l3 + 7] = v as u8,
        Field::Ipv6Flabel if v6 => {
            let fl = (v as u32) & 0x000f_ffff;
            frame[l3 + 1] = (frame[l3 + 1] & 0xf0) | (fl >> 16) as u8;
            frame[l3 + 2] = (fl >> 8) as u8;
            frame[l3 + 3] = fl as u8;
        }
        Field::TpSrc | Field::TpDst => match lay.l4 {
            Some((o, IP_ICMP | IP_ICMPV6)) => {
                // Type and code: one 16-bit word of the ICMP checksum.
                let mut new = [frame[o], frame[o + 1]];
                new[usize::from(fld == Field::TpDst)] = v as u8;
                rewrite(frame, &lay, o, &new, false, L4::Body, partial_l4);
            }
            Some((o, _)) => {
                let at = o + if fld == Field::TpSrc { 0 } else { 2 };
                rewrite(
                    frame,
                    &lay,
                    at,
                    &(v as u16).to_be_bytes(),
                    false,
                    L4::Body,
                    partial_l4,
                );
            }
            None => return Err(EditError::Missing("TCP, UDP or ICMP")),
        },
        Field::ArpOp | Field::ArpSha | Field::ArpTha | Field::Ipv4Src | Field::Ipv4Dst
            if lay.ethertype == ETH_ARP =>
        {
            if frame.len() < l3 + 28 {
                return Err(EditError::Missing("ARP"));
            }
            let (at, n) = match fld {
                Field::ArpOp => (l3 + 6, 2),
                Field::ArpSha => (l3 + 8, 6),
                Field::Ipv4Src => (l3 + 14, 4),
                Field::ArpTha => (l3 + 18, 6),
                _ => (l3 + 24, 4),
            };
            frame[at..at + n].copy_from_slice(&v.to_be_bytes()[16 - n..]);
        }
        Field::NdTarget | Field::ArpSha | Field::ArpTha => {
            let at = nd_offset(frame, &lay, fld).ok_or(EditError::Missing("ICMPv6 ND"))?;
            let n = if fld == Field::NdTarget { 16 } else { 6 };
            let new = v.to_be_bytes();
            rewrite(frame, &lay, at, &new[16 - n..], false, L4::Body, partial_l4);
        }
        Field::Ipv4Src | Field::Ipv4Dst | Field::IpTos | Field::IpTtl => {
            return Err(EditError::Missing("IPv4"))
        }
        Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Flabel => {
            return Err(EditError::Missing("IPv6"))
        }
        Field::ArpOp => return Err(EditError::Missing("ARP")),
        f => return Err(EditError::NotEditable(f)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csum(b: &[u8]) -> u16 {
        !fold(sum_words(b))
    }

    /// An IPv4 (or IPv6) TCP/UDP frame with correct checksums.
    fn frame(v6: bool, proto: u8, vlan: bool) -> Vec<u8> {
        let l4len = if proto == IP_TCP { 20 } else { 8 } + 11;
        let l3len = if v6 { 40 } else { 20 };
        let off = if vlan { 4 } else { 0 };
        let mut f = vec![0u8; 14 + off + l3len + l4len];
        f[0..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        if vlan {
            f[12..16].copy_from_slice(&[0x81, 0, 0, 5]);
        }
        let l3 = 14 + off;
        let l4 = l3 + l3len;
        if v6 {
            f[l3 - 2..l3].copy_from_slice(&[0x86, 0xdd]);
            f[l3] = 0x60;
            wr16(&mut f, l3 + 4, l4len as u16);
            f[l3 + 6] = proto;
            f[l3 + 7] = 64;
            for i in 0..16 {
                f[l3 + 8 + i] = 0x20 + i as u8;
                f[l3 + 24 + i] = 0x40 + i as u8;
            }
        } else {
            f[l3 - 2..l3].copy_from_slice(&[0x08, 0]);
            f[l3] = 0x45;
            wr16(&mut f, l3 + 2, (20 + l4len) as u16);
            f[l3 + 8] = 64;
            f[l3 + 9] = proto;
            f[l3 + 12..l3 + 20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
            let c = csum(&f[l3..l3 + 20]);
            wr16(&mut f, l3 + 10, c);
        }
        wr16(&mut f, l4, 1111);
        wr16(&mut f, l4 + 2, 2222);
        if proto == IP_TCP {
            f[l4 + 12] = 0x50;
        } else {
            wr16(&mut f, l4 + 4, l4len as u16);
        }
        for (i, b) in f[l4 + l4len - 11..].iter_mut().enumerate() {
            *b = i as u8 * 7;
        }
        let c = l4_full(&f, l3, l4, v6, proto);
        wr16(&mut f, l4_csum_at(l4, proto), c);
        f
    }

    fn l4_full(f: &[u8], l3: usize, l4: usize, v6: bool, proto: u8) -> u16 {
        let mut s = 0u32;
        if v6 {
            s += sum_words(&f[l3 + 8..l3 + 40]);
        } else {
            s += sum_words(&f[l3 + 12..l3 + 20]);
        }
        s += u32::from(proto) + (f.len() - l4) as u32;
        let mut seg = f[l4..].to_vec();
        let at = l4_csum_at(0, proto);
        seg[at] = 0;
        seg[at + 1] = 0;
        s += sum_words(&seg);
        let c = !fold(s);
        if c == 0 && proto == IP_UDP {
            0xffff
        } else {
            c
        }
    }

    fn check(f: &[u8], v6: bool, proto: u8, vlan: bool) {
        let l3 = 14 + if vlan { 4 } else { 0 };
        let l4 = l3 + if v6 { 40 } else { 20 };
        if !v6 {
            assert_eq!(
                fold(sum_words(&f[l3..l3 + 20])),
                0xffff,
                "IPv4 header checksum"
            );
        }
        assert_eq!(
            rd16(f, l4_csum_at(l4, proto)),
            l4_full(f, l3, l4, v6, proto),
            "L4 checksum"
        );
    }

    #[test]
    fn rewrites_keep_every_checksum_valid() {
        let edits: &[(Field, u128)] = &[
            (Field::Ipv4Src, 0xc0a8_0101),
            (Field::Ipv4Dst, 0xffff_ffff),
            (Field::IpTos, 0xb8),
            (Field::IpTtl, 1),
            (Field::TpSrc, 80),
            (Field::TpDst, 0xffff),
            (Field::Ipv6Src, 0xfe80_0000_0000_0000_0000_0000_0000_0001),
            (Field::Ipv6Dst, u128::MAX),
            (Field::EthDst, 0x0200_0000_0099),
        ];
        for v6 in [false, true] {
            for proto in [IP_TCP, IP_UDP] {
                for vlan in [false, true] {
                    for &(fld, v) in edits {
                        let mut f = frame(v6, proto, vlan);
                        let r = set_field(&mut f, fld, v, false);
                        let applies = !matches!(
                            (fld, v6),
                            (Field::Ipv4Src | Field::Ipv4Dst, true)
                                | (Field::Ipv6Src | Field::Ipv6Dst, false)
                        );
                        assert_eq!(r.is_ok(), applies, "{fld:?} v6={v6}");
                        check(&f, v6, proto, vlan);
                        if applies {
                            let k = crate::FlowKey::extract(&f, 0, None);
                            assert_eq!(k.get(fld), v & fld.full(), "{fld:?} v6={v6}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ipv4_udp_without_checksum_stays_without() {
        let mut f = frame(false, IP_UDP, false);
        let at = l4_csum_at(34, IP_UDP);
        wr16(&mut f, at, 0);
        set_field(&mut f, Field::Ipv4Dst, 0x0b00_0001, false).unwrap();
        assert_eq!(rd16(&f, at), 0);
        assert_eq!(fold(sum_words(&f[14..34])), 0xffff);
    }

    #[test]
    fn frames_without_the_header_are_refused_untouched() {
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let before = arp.clone();
        assert!(set_field(&mut arp, Field::Ipv6Src, 1, false).is_err());
        assert!(set_field(&mut arp, Field::TpDst, 1, false).is_err());
        assert!(set_field(&mut arp, Field::NdTarget, 1, false).is_err());
        assert!(set_field(&mut arp[..41], Field::ArpTha, 1, false).is_err());
        assert_eq!(arp, before);
        assert!(set_field(&mut [0u8; 10], Field::EthSrc, 1, false).is_err());
        // ND fields of an ICMPv6 message that is no NS/NA, or lacks the option.
        let mut f = icmp6(128, &[]);
        let before = f.clone();
        assert!(set_field(&mut f, Field::NdTarget, 1, false).is_err());
        let mut ns = icmp6(ND_NS, &[]);
        assert!(set_field(&mut ns, Field::ArpSha, 1, false).is_err());
        assert_eq!(f, before);
    }

    /// An IPv4 ICMP echo request with correct checksums.
    fn icmp4() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 13];
        f[12..14].copy_from_slice(&[0x08, 0]);
        f[14] = 0x45;
        f[15] = 0x02; // ECN ECT(0)
        wr16(&mut f, 16, (20 + 8 + 13) as u16);
        f[22] = 64;
        f[23] = IP_ICMP;
        f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let c = csum(&f[14..34]);
        wr16(&mut f, 24, c);
        f[34] = 8;
        for (i, b) in f[38..].iter_mut().enumerate() {
            *b = 0x31 + i as u8 * 13;
        }
        let c = csum(&f[34..]);
        wr16(&mut f, 36, c);
        f
    }

    /// An ICMPv6 message of type `ty` (an NS/NA with target 2001:db8::7 and the given
    /// link-layer address options), with its checksum.
    fn icmp6(ty: u8, opts: &[(u8, [u8; 6])]) -> Vec<u8> {
        let plen = 24 + 8 * opts.len();
        let mut f = vec![0u8; 14 + 40 + plen];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14..18].copy_from_slice(&0x6012_3456u32.to_be_bytes());
        wr16(&mut f, 18, plen as u16);
        f[20] = IP_ICMPV6;
        f[21] = 255;
        for i in 0..16 {
            f[22 + i] = 0xfe - i as u8;
            f[38 + i] = 0x20 + 3 * i as u8;
        }
        f[54] = ty;
        for (i, b) in f[58..78].iter_mut().enumerate() {
            *b = 0x20 + i as u8 * 5;
        }
        for (i, (t, mac)) in opts.iter().enumerate() {
            let o = 78 + 8 * i;
            f[o] = *t;
            f[o + 1] = 1;
            f[o + 2..o + 8].copy_from_slice(mac);
        }
        let c = icmp6_full(&f);
        wr16(&mut f, 56, c);
        f
    }

    /// The ICMPv6 checksum of `f` computed from scratch (pseudo-header and message).
    fn icmp6_full(f: &[u8]) -> u16 {
        let mut s = sum_words(&f[22..54]);
        s += (f.len() - 54) as u32 + u32::from(IP_ICMPV6);
        let mut m = f[54..].to_vec();
        m[2] = 0;
        m[3] = 0;
        s += sum_words(&m);
        !fold(s)
    }

    #[test]
    fn icmp_rewrites_keep_the_checksums_valid() {
        let check4 = |f: &[u8]| {
            assert_eq!(fold(sum_words(&f[14..34])), 0xffff, "IPv4 header checksum");
            assert_eq!(fold(sum_words(&f[34..])), 0xffff, "ICMP checksum");
        };
        for (fld, v) in [
            (Field::TpSrc, 0u128),
            (Field::TpDst, 1),
            (Field::TpDst, 255),
            (Field::Ipv4Src, 0xc0a8_0101),
            (Field::Ipv4Dst, 0x0102_0304),
            (Field::IpTos, 0xb9),
        ] {
            let mut f = icmp4();
            set_field(&mut f, fld, v, false).unwrap();
            check4(&f);
            assert_eq!(crate::FlowKey::extract(&f, 0, None).get(fld), v, "{fld:?}");
        }
        let a = [2, 0, 0, 0, 0, 0xaa];
        let b = [2, 0, 0, 0, 0, 0xbb];
        let edits: &[(u8, Field, u128)] = &[
            (128, Field::TpSrc, 129),
            (128, Field::TpDst, 3),
            (
                128,
                Field::Ipv6Src,
                0x2001_0db8_0000_0000_0000_0000_0000_00a0,
            ),
            (128, Field::Ipv6Dst, u128::MAX - 5),
            (128, Field::Ipv6Flabel, 0xfedcb),
            (128, Field::IpTos, 0x03),
            (ND_NS, Field::NdTarget, 0xa0 << 112 | 0xa0),
            (ND_NS, Field::ArpSha, 0x0a0a_0a0a_0a0a),
            (ND_NA, Field::ArpTha, 0xffff_ffff_fffe),
            (ND_NA, Field::NdTarget, 1),
        ];
        for &(ty, fld, v) in edits {
            let opts: &[(u8, [u8; 6])] = if ty == ND_NS {
                &[(14, b), (1, a), (2, b)]
            } else {
                &[(2, a)]
            };
            let mut f = icmp6(ty, opts);
            set_field(&mut f, fld, v, false).unwrap();
            assert_eq!(rd16(&f, 56), icmp6_full(&f), "{fld:?} type {ty}");
            assert_eq!(crate::FlowKey::extract(&f, 0, None).get(fld), v, "{fld:?}");
        }
        // The flow label keeps the traffic class and version.
        let mut f = icmp6(128, &[]);
        set_field(&mut f, Field::Ipv6Flabel, 0xfffff, false).unwrap();
        assert_eq!(f[14..18], [0x60, 0x1f, 0xff, 0xff]);
    }

    #[test]
    fn arp_rewrites() {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        for (fld, v) in [
            (Field::ArpOp, 2u128),
            (Field::ArpSha, 0x0a0b_0c0d_0e0f),
            (Field::Ipv4Src, 0x0a00_0001),
            (Field::ArpTha, 0x0203_0405_0607),
            (Field::Ipv4Dst, 0x0a00_0002),
        ] {
            set_field(&mut f, fld, v, false).unwrap();
            assert_eq!(crate::FlowKey::extract(&f, 0, None).get(fld), v, "{fld:?}");
        }
        let k = crate::FlowKey::extract(&f, 0, None);
        assert_eq!(
            (
                k.get(Field::ArpOp),
                k.get(Field::ArpSha),
                k.get(Field::ArpTha)
            ),
            (2, 0x0a0b_0c0d_0e0f, 0x0203_0405_0607)
        );
        assert_eq!(f[14..22], [0, 1, 8, 0, 6, 4, 0, 2]);
    }

    /// A 4-byte room in front of `f` (as `Mbuf::push_front` gives).
    fn roomy(f: &[u8]) -> Vec<u8> {
        let mut v = vec![0xee; 4];
        v.extend_from_slice(f);
        v
    }

    #[test]
    fn mpls_push_pop_and_rewrites_are_byte_exact() {
        let ip: Vec<u8> = (0u8..60).collect::<Vec<_>>();
        let mut ip = ip;
        ip[12..14].copy_from_slice(&[0x08, 0x00]);
        // Push: the shim after the MACs, the new Ethertype before it.
        let mut b = roomy(&ip);
        assert!(push_mpls_in_place(&mut b, 0x8847, 0x0000_2140));
        let mut want = ip[..12].to_vec();
        want.extend_from_slice(&[0x88, 0x47, 0x00, 0x00, 0x21, 0x40]);
        want.extend_from_slice(&ip[14..]);
        assert_eq!(b, want);
        // Rewrites of the entry's fields.
        set_field(&mut b, Field::MplsLabel, 0xfffff, false).unwrap();
        set_field(&mut b, Field::MplsTc, 2, false).unwrap();
        set_field(&mut b, Field::MplsTtl, 7, false).unwrap();
        assert_eq!(&b[14..18], &[0xff, 0xff, 0xf5, 0x07]);
        set_field(&mut b, Field::MplsBos, 0, false).unwrap();
        assert_eq!(b[16], 0xf4);
        set_field(&mut b, Field::MplsBos, 1, false).unwrap();
        // Pop: back to the frame as it was, with the given Ethertype.
        assert!(pop_mpls_in_place(&mut b, 0x0800));
        assert_eq!(&b[4..], &ip[..]);
        // Not MPLS: nothing popped, nothing rewritten.
        let mut c = ip.clone();
        assert!(!pop_mpls_in_place(&mut c, 0x0800));
        assert_eq!(c, ip);
        assert_eq!(
            set_field(&mut c, Field::MplsLabel, 1, false),
            Err(EditError::Missing("MPLS"))
        );
        // Behind a VLAN tag (and an 802.1ad one): after every tag.
        let mut t = ip.clone();
        t.splice(12..12, [0x88, 0xa8, 0x00, 0x07, 0x81, 0x00, 0x00, 0x05]);
        let mut b = roomy(&t);
        assert!(push_mpls_in_place(&mut b, 0x8848, 0x0000_1140));
        assert_eq!(&b[..20], &t[..20]);
        assert_eq!(&b[20..26], &[0x88, 0x48, 0x00, 0x00, 0x11, 0x40]);
        assert_eq!(&b[26..], &t[22..]);
        assert!(pop_mpls_in_place(&mut b, 0x0800));
        assert_eq!(&b[4..], &t[..]);
        // Frames too short for an Ethertype or an entry are left alone.
        let mut s = roomy(&ip[..13]);
        assert!(!push_mpls_in_place(&mut s, 0x8847, 0));
        let mut s = ip[..16].to_vec();
        s[12..14].copy_from_slice(&[0x88, 0x47]);
        assert!(!pop_mpls_in_place(&mut s, 0x0800));
    }
}
