//! The calls the datapath makes beside `execute`: `ct(commit, force)`
//! ([`Tracker::end_reply_conn`]) and frames with a partial L4 checksum (checksum offload,
//! [`Tracker::execute_offloaded`], [`nat::rewrite_offloaded`]).

use ferrovs_conntrack::build::{Frame, Proto};
use ferrovs_conntrack::tuple::{self, Tuple};
use ferrovs_conntrack::{nat, Commit, CtState, Nat, NatKind, NatRange, Tracker};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, seq: u32, ack: u32, f: u8) -> Vec<u8> {
    Frame::v4(src, dst, Proto::tcp(sport, dport, seq, ack, f)).bytes()
}

fn tuple_of(f: &[u8]) -> Tuple {
    tuple::parse(f, true).unwrap().tuple
}

/// Ones-complement sum of `b` (folded, not complemented).
fn sum(mut acc: u32, b: &[u8]) -> u32 {
    for w in b.chunks(2) {
        acc += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// The L4 offset and the checksum's offset in it, for an IPv4 frame without options.
fn l4(f: &[u8]) -> (usize, usize) {
    let at = if f[23] == 6 { 16 } else { 6 };
    (34, at)
}

/// `f` as a device with checksum offload gets it: the L4 checksum field holds the
/// pseudo-header sum.
fn to_partial(mut f: Vec<u8>) -> Vec<u8> {
    let (l4, at) = l4(&f);
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let mut s = sum(0, &f[26..34]);
    s = sum(s, &[0, f[23]]);
    s = sum(s, &((total - 20) as u16).to_be_bytes());
    f[l4 + at..l4 + at + 2].copy_from_slice(&(s as u16).to_be_bytes());
    f
}

/// What the device does: the sum from the L4 header on, complemented, into the field.
fn complete(mut f: Vec<u8>) -> Vec<u8> {
    let (l4, at) = l4(&f);
    let c = !(sum(0, &f[l4..]) as u16);
    f[l4 + at..l4 + at + 2].copy_from_slice(&c.to_be_bytes());
    f
}

#[test]
fn force_ends_a_connection_seen_in_its_reply_direction_only() {
    let t = Tracker::new(Default::default());
    let syn = tcp(A, B, 1000, 80, 1, 0, SYN);
    assert!(t.execute(&syn, 3, true, 0).committed);
    // The original direction, another zone, no connection: nothing ends.
    assert!(!t.end_reply_conn(&syn, 3, false));
    let reply = tcp(B, A, 80, 1000, 7, 2, SYN | ACK);
    assert!(!t.end_reply_conn(&reply, 4, false));
    assert!(!t.end_reply_conn(&tcp(B, A, 81, 1000, 7, 2, SYN), 3, false));
    assert_eq!(t.zone_entries(3), 1);
    // The reply direction: ended, and the commit after it tracks B → A as new.
    let rsyn = tcp(B, A, 80, 1000, 7, 0, SYN);
    assert!(t.end_reply_conn(&rsyn, 3, false));
    assert_eq!(t.zone_entries(3), 0);
    let r = t.execute(&rsyn, 3, true, 0);
    assert_eq!(r.state, CtState(CtState::TRK | CtState::NEW));
    assert_eq!(r.orig, Some(tuple_of(&rsyn)));
    // Malformed frames end nothing.
    assert!(!t.end_reply_conn(&rsyn[..20], 3, false));
}

#[test]
fn force_through_a_nat_alias_ends_the_owner_and_its_alias() {
    let t = Tracker::new(Default::default());
    let nat = Nat::Bind(NatRange::addr(NatKind::Src, [192, 0, 2, 1].into()));
    let mut syn = tcp(A, B, 1000, 80, 1, 0, SYN);
    let r = t.execute_nat(&mut syn, 0, &Commit::COMMIT, &nat, 0);
    assert!(r.committed);
    let sport = u16::from_be_bytes([syn[34], syn[35]]);
    // B answers the translated address: the reply direction, found through the alias.
    let reply = tcp(B, [192, 0, 2, 1], 80, sport, 7, 0, SYN);
    assert!(t.end_reply_conn(&reply, 0, false));
    assert_eq!(t.counters().entries, 0);
    // The alias went with it: the reply is new now, and may be committed itself.
    let r = t.execute(&reply, 0, true, 0);
    assert!(r.state.has(CtState::NEW) && r.committed);
}

#[test]
fn a_partial_checksum_is_not_verified_and_nat_keeps_it_right() {
    for (proto_tcp, kind) in [
        (true, NatKind::Src),
        (true, NatKind::Dst),
        (false, NatKind::Src),
        (false, NatKind::Dst),
    ] {
        let full = if proto_tcp {
            tcp(A, B, 1000, 80, 1, 0, SYN)
        } else {
            Frame::v4(A, B, Proto::udp(1000, 53, b"query")).bytes()
        };
        let mut partial = to_partial(full.clone());
        assert!(
            tuple::parse(&partial, true).is_err(),
            "partial is not valid as such"
        );
        assert!(tuple::parse_with(&partial, true, false).is_ok());
        let range = NatRange::addr(kind, [198, 51, 100, 7].into()).with_ports(2000, 2000);
        let t = Tracker::new(Default::default());
        let r = t.execute_offloaded(&mut partial, 0, &Commit::COMMIT, &Nat::Bind(range), 0, true);
        assert!(r.committed && r.malformed.is_none(), "{r:?}");
        let done = complete(partial);
        let to = tuple_of(&done);
        match kind {
            NatKind::Src => assert_eq!(
                (to.src[..4].to_vec(), to.sport),
                (vec![198, 51, 100, 7], 2000)
            ),
            NatKind::Dst => assert_eq!(
                (to.dst[..4].to_vec(), to.dport),
                (vec![198, 51, 100, 7], 2000)
            ),
        }
        // The same translation of the full frame gives the same bytes once completed.
        let mut f = full.clone();
        nat::rewrite(&mut f, &tuple_of(&full), &to);
        assert_eq!(f, done);
    }
}
