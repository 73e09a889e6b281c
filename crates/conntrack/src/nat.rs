//! NAT: the binding a commit makes (`ct(commit, nat(src|dst=IP[-IP][:PORT[-PORT]]))`), the
//! search for a free translated tuple, and the in-place rewrite of frames.
//!
//! A binding is the connection's *reply tuple*: the tuple its replies carry once the
//! original direction is translated. Without NAT the reply tuple is the reverse of the
//! original one; with SNAT its destination is the chosen source address and port, with DNAT
//! its source is the chosen destination. The table keys a NATed connection under both its
//! original and its reply tuple, so a reply is found by what it carries on the wire.
//!
//! Invariants:
//! * a reply tuple has the original's family and protocol; SNAT changes only the reply's
//!   destination (address, port or ICMP id), DNAT only its source (the ICMP id is in the
//!   source slot for both); generic protocols have no ports;
//! * [`candidates`] yields a bounded number of reply tuples (at most [`MAX_PROBES`]), the
//!   untranslated one first when the range allows it;
//! * [`rewrite`] and [`rewrite_icmp_error`] run on a frame that [`crate::tuple::parse`]
//!   accepted; they re-locate the headers with checked reads, never panic, and update every
//!   checksum incrementally (RFC 1624), except the ICMP checksum of an error, which covers
//!   the quoted packet and is recomputed from scratch (as Linux does).
//!
//! Thread-safety: pure functions over borrowed data.

use std::net::IpAddr;

use crate::tuple::{Family, Tuple, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};

/// Source or destination translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum NatKind {
    Src,
    Dst,
}

/// `nat(src|dst=IP[-IP][:PORT[-PORT]])`: an inclusive address range of one family and an
/// optional inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatRange {
    pub kind: NatKind,
    pub addr_min: IpAddr,
    pub addr_max: IpAddr,
    pub ports: Option<(u16, u16)>,
}

impl NatRange {
    /// A range of one address and no port range.
    pub fn addr(kind: NatKind, a: IpAddr) -> NatRange {
        NatRange {
            kind,
            addr_min: a,
            addr_max: a,
            ports: None,
        }
    }

    /// The same range with a port range.
    pub fn with_ports(self, lo: u16, hi: u16) -> NatRange {
        NatRange {
            ports: Some((lo, hi)),
            ..self
        }
    }
}

/// The `nat` part of a `ct()` action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nat {
    /// No `nat`: the frame is never rewritten.
    #[default]
    Off,
    /// `ct(nat)`: a packet of a connection with a binding is translated.
    Apply,
    /// `ct(commit, nat(...))`: a committed new connection gets a binding from the range;
    /// a packet of an existing connection is translated by its binding (the range is then
    /// ignored, as in OVS).
    Bind(NatRange),
}

/// A connection's NAT binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Binding {
    pub kind: NatKind,
    /// The tuple of the reply direction as it travels on the wire.
    pub reply: Tuple,
}

/// Why a NAT commit was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NatError {
    #[error("NAT range is of the other address family or empty")]
    BadRange,
    #[error("no free address and port in the NAT range")]
    Exhausted,
    #[error("the connection was committed by another packet meanwhile")]
    Race,
}

/// The most candidate tuples one commit tries (the search holds one shard lock per probe).
pub const MAX_PROBES: usize = 1 << 17;
/// The most addresses of a range one commit tries.
pub const MAX_ADDRS: u128 = 64;

fn addr_bits(a: IpAddr) -> (Family, u128) {
    match a {
        IpAddr::V4(v) => (Family::V4, u128::from(u32::from(v))),
        IpAddr::V6(v) => (Family::V6, u128::from(v)),
    }
}

fn bits_to_bytes(f: Family, v: u128) -> [u8; 16] {
    let mut b = [0u8; 16];
    match f {
        Family::V4 => b[..4].copy_from_slice(&(v as u32).to_be_bytes()),
        Family::V6 => b = v.to_be_bytes(),
    }
    b
}

fn bytes_to_bits(f: Family, b: &[u8; 16]) -> u128 {
    match f {
        Family::V4 => u128::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        Family::V6 => u128::from_be_bytes(*b),
    }
}

/// FNV-1a: a deterministic spread of the search's start (not a defence against flooding;
/// the search is bounded by [`MAX_PROBES`]).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Whether a protocol has ports (or an ICMP id) that NAT may choose.
fn has_ports(t: &Tuple) -> bool {
    matches!(t.proto, IPPROTO_TCP | IPPROTO_UDP) || t.is_icmp()
}

/// The port class a source port is kept in when no port range is given (OVS's and Linux's
/// rule): 1-511, 600-1023, or 1024-65535.
pub fn default_port_class(port: u16) -> (u16, u16) {
    match port {
        0..=511 => (1, 511),
        512..=1023 => (600, 1023),
        _ => (1024, 65535),
    }
}

/// The reply tuples a commit of `orig` with `range` may take, best first (see the module).
pub fn candidates(orig: &Tuple, range: &NatRange) -> Result<impl Iterator<Item = Tuple>, NatError> {
    let (f1, lo) = addr_bits(range.addr_min);
    let (f2, hi) = addr_bits(range.addr_max);
    if f1 != orig.family || f2 != orig.family || hi < lo {
        return Err(NatError::BadRange);
    }
    if let Some((a, b)) = range.ports {
        if b < a {
            return Err(NatError::BadRange);
        }
    }
    let base = orig.reverse();
    let kind = range.kind;
    let icmp = orig.is_icmp();
    // The address and port (or id) NAT replaces, as the original direction carries them.
    let (cur_addr, cur_port) = match (kind, icmp) {
        (_, true) => (
            if kind == NatKind::Src {
                orig.src
            } else {
                orig.dst
            },
            orig.sport,
        ),
        (NatKind::Src, false) => (orig.src, orig.sport),
        (NatKind::Dst, false) => (orig.dst, orig.dport),
    };
    let ports = if !has_ports(orig) {
        (cur_port, cur_port)
    } else if let Some(p) = range.ports {
        p
    } else if icmp {
        (0, u16::MAX)
    } else if kind == NatKind::Src {
        default_port_class(cur_port)
    } else {
        // DNAT without a port range keeps the destination port (Linux; see the docs for
        // what OVS does instead).
        (cur_port, cur_port)
    };
    // The whole IPv6 space counts one short (u128), which only skips its last address.
    let n_addr = (hi - lo).saturating_add(1);
    let cur_bits = bytes_to_bits(orig.family, &cur_addr);
    let addr_start = if (lo..=hi).contains(&cur_bits) {
        cur_bits - lo
    } else {
        u128::from(fnv(&[&orig.src, &orig.dst])) % n_addr
    };
    let n_port = u32::from(ports.1 - ports.0) + 1;
    let port_start =
        (fnv(&[&orig.src, &orig.dst, &orig.sport.to_be_bytes()]) % u64::from(n_port)) as u32;
    let family = orig.family;
    let it = (0..n_addr.min(MAX_ADDRS)).flat_map(move |ai| {
        // (addr_start + ai) mod n_addr, without overflow.
        let off = n_addr - addr_start;
        let a = bits_to_bytes(
            family,
            lo + if ai < off { addr_start + ai } else { ai - off },
        );
        let keep = (ports.0..=ports.1).contains(&cur_port);
        let first = keep.then_some(cur_port);
        let rest = (0..n_port)
            .map(move |i| ports.0 + ((port_start + i) % n_port) as u16)
            .filter(move |&p| !(keep && p == cur_port));
        first.into_iter().chain(rest).map(move |p| {
            let mut r = base;
            match (kind, icmp) {
                (NatKind::Src, true) => {
                    r.dst = a;
                    r.sport = p;
                }
                (NatKind::Dst, true) => {
                    r.src = a;
                    r.sport = p;
                }
                (NatKind::Src, false) => {
                    r.dst = a;
                    r.dport = p;
                }
                (NatKind::Dst, false) => {
                    r.src = a;
                    r.sport = p;
                }
            }
            r
        })
    });
    Ok(it.take(MAX_PROBES))
}

/// Whether `reply` may be the reply tuple of `orig` under `kind` (restore checks it).
pub fn binding_is_consistent(orig: &Tuple, kind: NatKind, reply: &Tuple) -> bool {
    let base = orig.reverse();
    if reply.family != orig.family || reply.proto != orig.proto {
        return false;
    }
    if reply.family == Family::V4
        && (reply.src[4..].iter().any(|&b| b != 0) || reply.dst[4..].iter().any(|&b| b != 0))
    {
        return false;
    }
    if !has_ports(orig) && (reply.sport != 0 || reply.dport != 0) {
        return false;
    }
    match (kind, orig.is_icmp()) {
        (_, true) if reply.dport != base.dport => false,
        (NatKind::Src, true) => reply.src == base.src,
        (NatKind::Dst, true) => reply.dst == base.dst,
        (NatKind::Src, false) => reply.src == base.src && reply.sport == base.sport,
        (NatKind::Dst, false) => reply.dst == base.dst && reply.dport == base.dport,
    }
}

// ---- frame rewriting ----

fn get16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    if let Some(s) = b.get_mut(at..at + 2) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

/// RFC 1624 eqn. 3: the checksum `c` after the 16-bit words `old` became `new`.
fn csum_replace(c: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut acc = u32::from(!c);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        acc += u32::from(!u16::from_be_bytes([o[0], o[1]]));
        acc += u32::from(u16::from_be_bytes([n[0], n[1]]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Updates the checksum at `at` (if it is inside `b`) for `old` → `new`; `udp4` keeps a zero
/// (absent) IPv4 UDP checksum zero, `udp` maps a computed zero to 0xffff.
fn fix(b: &mut [u8], at: usize, old: &[u8], new: &[u8], udp: bool, udp4: bool) {
    let Some(c) = get16(b, at) else { return };
    if udp4 && c == 0 {
        return;
    }
    let mut n = csum_replace(c, old, new);
    if udp && n == 0 {
        n = 0xffff;
    }
    put16(b, at, n);
}

/// Where the headers of an IP packet starting at `l3` and contained in `b[..limit]` are:
/// (L4 offset, protocol, end). A quoted packet (`inner`) may be cut short by `limit`.
fn locate_ip(
    b: &[u8],
    l3: usize,
    limit: usize,
    family: Family,
    inner: bool,
) -> Option<(usize, u8, usize)> {
    let limit = limit.min(b.len());
    match family {
        Family::V4 => {
            let ihl = usize::from(b.get(l3)? & 0x0f) * 4;
            let total = usize::from(get16(b, l3 + 2)?);
            let end = if inner {
                limit.min(l3 + total)
            } else {
                l3 + total
            };
            (end <= limit && ihl >= 20).then_some((l3 + ihl, *b.get(l3 + 9)?, end))
        }
        Family::V6 => {
            let payload = usize::from(get16(b, l3 + 4)?);
            let end = limit.min(l3 + 40 + payload);
            let mut next = *b.get(l3 + 6)?;
            let mut off = l3 + 40;
            for _ in 0..8 {
                match next {
                    0 | 43 | 60 => {
                        let len = (usize::from(*b.get(off + 1)?) + 1) * 8;
                        next = *b.get(off)?;
                        off += len;
                    }
                    _ => return (off <= end).then_some((off, next, end)),
                }
            }
            None
        }
    }
}

/// The L3 offset and family of an Ethernet frame (up to two VLAN tags).
fn locate_eth(b: &[u8]) -> Option<(usize, Family)> {
    let mut et = get16(b, 12)?;
    let mut off = 14;
    for _ in 0..2 {
        if et == crate::tuple::ETH_P_8021Q || et == crate::tuple::ETH_P_8021AD {
            et = get16(b, off + 2)?;
            off += 4;
        }
    }
    match et {
        crate::tuple::ETH_P_IPV4 => Some((off, Family::V4)),
        crate::tuple::ETH_P_IPV6 => Some((off, Family::V6)),
        _ => None,
    }
}

fn addr_range(family: Family, l3: usize, src: bool) -> std::ops::Range<usize> {
    match (family, src) {
        (Family::V4, true) => l3 + 12..l3 + 16,
        (Family::V4, false) => l3 + 16..l3 + 20,
        (Family::V6, true) => l3 + 8..l3 + 24,
        (Family::V6, false) => l3 + 24..l3 + 40,
    }
}

/// Rewrites one address of the IP header at `l3` and the checksums covering it (the IPv4
/// header's, the L4 pseudo-header's at `l4_csum` when the protocol has one).
fn set_addr(b: &mut [u8], family: Family, l3: usize, src: bool, new: &[u8; 16], l4: L4Csum) {
    let r = addr_range(family, l3, src);
    let n = r.len();
    let Some(old) = b.get(r.clone()).map(|s| {
        let mut o = [0u8; 16];
        o[..n].copy_from_slice(s);
        o
    }) else {
        return;
    };
    if old[..n] == new[..n] {
        return;
    }
    b[r].copy_from_slice(&new[..n]);
    if family == Family::V4 {
        fix(b, l3 + 10, &old[..n], &new[..n], false, false);
    }
    if let Some((at, udp, pseudo)) = l4.0 {
        if l4.1 {
            fix_partial(b, at, &old[..n], &new[..n]);
        } else if pseudo {
            fix(
                b,
                at,
                &old[..n],
                &new[..n],
                udp,
                udp && family == Family::V4,
            );
        }
    }
}

/// Where an L4 checksum is: (offset, is UDP, covers the pseudo header), and whether it is
/// *partial* (checksum offload, TCP and UDP only: the field holds the folded pseudo-header
/// sum, not complemented, the rest to be computed by whoever completes it).
#[derive(Clone, Copy)]
struct L4Csum(Option<(usize, bool, bool)>, bool);

fn l4_csum(family: Family, proto: u8, l4: usize, end: usize, partial: bool) -> L4Csum {
    let (at, udp, pseudo) = match (proto, family) {
        (IPPROTO_TCP, _) => (l4 + 16, false, true),
        (IPPROTO_UDP, _) => (l4 + 6, true, true),
        (IPPROTO_ICMP, Family::V4) => (l4 + 2, false, false),
        (IPPROTO_ICMPV6, Family::V6) => (l4 + 2, false, true),
        _ => return L4Csum(None, false),
    };
    let partial = partial && matches!(proto, IPPROTO_TCP | IPPROTO_UDP);
    L4Csum((at + 2 <= end).then_some((at, udp, pseudo)), partial)
}

/// Updates the partial checksum (a pseudo-header sum, see [`L4Csum`]) at `at` for `old` →
/// `new`: the sum itself moves by `new - old` (RFC 1624 on its complement).
fn fix_partial(b: &mut [u8], at: usize, old: &[u8], new: &[u8]) {
    let Some(c) = get16(b, at) else { return };
    put16(b, at, !csum_replace(!c, old, new));
}

/// Rewrites the packet at `l3` from tuple `from` to tuple `to` (addresses, then ports or
/// the ICMP id).
#[allow(clippy::too_many_arguments)]
fn rewrite_ip(
    b: &mut [u8],
    family: Family,
    l3: usize,
    limit: usize,
    inner: bool,
    from: &Tuple,
    to: &Tuple,
    partial: bool,
) {
    let Some((l4, proto, end)) = locate_ip(b, l3, limit, family, inner) else {
        return;
    };
    let cs = l4_csum(family, proto, l4, end, partial);
    set_addr(b, family, l3, true, &to.src, cs);
    set_addr(b, family, l3, false, &to.dst, cs);
    let udp4 = proto == IPPROTO_UDP && family == Family::V4;
    let udp = proto == IPPROTO_UDP;
    let slots: [(usize, u16, u16); 2] = if from.is_icmp() {
        // The id; the type is never translated.
        [(l4 + 4, from.sport, to.sport), (0, 0, 0)]
    } else if matches!(proto, IPPROTO_TCP | IPPROTO_UDP) {
        [(l4, from.sport, to.sport), (l4 + 2, from.dport, to.dport)]
    } else {
        return;
    };
    for (at, old, new) in slots {
        if old == new || at + 2 > end {
            continue;
        }
        put16(b, at, new);
        // Ports are not in the pseudo header: a partial checksum does not cover them yet.
        if let (Some((c, _, _)), false) = (cs.0, cs.1) {
            fix(b, c, &old.to_be_bytes(), &new.to_be_bytes(), udp, udp4);
        }
    }
}

/// Rewrites a frame whose tuple is `from` so that it carries `to`.
pub fn rewrite(frame: &mut [u8], from: &Tuple, to: &Tuple) {
    rewrite_offloaded(frame, from, to, false);
}

/// [`rewrite`] for a frame whose TCP or UDP checksum may be partial (`l4_partial`: checksum
/// offload, the field holding the pseudo-header sum): that sum follows the addresses, and
/// the ports are left to whoever completes the checksum.
pub fn rewrite_offloaded(frame: &mut [u8], from: &Tuple, to: &Tuple, l4_partial: bool) {
    if from == to {
        return;
    }
    if let Some((l3, family)) = locate_eth(frame) {
        let limit = frame.len();
        rewrite_ip(frame, family, l3, limit, false, from, to, l4_partial);
    }
}

/// Translates an ICMP error: the outer source or destination address becomes `outer` (when
/// Some), the quoted packet goes from `inner_from` to `inner_to` (with its IP header and,
/// where quoted, L4 checksums updated), and the ICMP checksum is recomputed.
pub fn rewrite_icmp_error(
    frame: &mut [u8],
    outer: Option<(bool, [u8; 16])>,
    inner_from: &Tuple,
    inner_to: &Tuple,
) {
    let Some((l3, family)) = locate_eth(frame) else {
        return;
    };
    let Some((l4, proto, end)) = locate_ip(frame, l3, frame.len(), family, false) else {
        return;
    };
    if let Some((src, a)) = outer {
        // The ICMP checksum is recomputed below, so no L4 checksum to fix here.
        set_addr(frame, family, l3, src, &a, L4Csum(None, false));
    }
    // The quote ends where the outer packet does (not at the frame's padding).
    rewrite_ip(
        frame,
        family,
        l4 + 8,
        end,
        true,
        inner_from,
        inner_to,
        false,
    );
    if end > frame.len() || l4 + 4 > end {
        return;
    }
    put16(frame, l4 + 2, 0);
    let mut acc = 0u32;
    if family == Family::V6 && proto == IPPROTO_ICMPV6 {
        let len = (end - l4) as u32;
        acc = crate::tuple::sum_bytes(acc, &frame[l3 + 8..l3 + 40]);
        acc = crate::tuple::sum_bytes(acc, &len.to_be_bytes());
        acc = crate::tuple::sum_bytes(acc, &[0, 0, 0, IPPROTO_ICMPV6]);
    }
    let c = !(crate::tuple::sum_bytes(acc, &frame[l4..end]) as u16);
    put16(frame, l4 + 2, c);
}

#[cfg(test)]
mod tests;
