use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;
use crate::build::{Frame, Proto};
use crate::table::{Commit, Config, CtResult, CtState, Tracker};
use crate::tuple::{parse, TCP_ACK, TCP_RST, TCP_SYN};

const A: [u8; 4] = [10, 0, 0, 1];
const A2: [u8; 4] = [10, 0, 0, 3];
const B: [u8; 4] = [192, 0, 2, 80];
const N: [u8; 4] = [198, 51, 100, 1];
const R: [u8; 4] = [203, 0, 113, 9];

fn ip(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

fn small() -> Tracker {
    Tracker::new(Config {
        shards: 4,
        max_entries: 100,
        ..Config::default()
    })
}

fn snat(a: [u8; 4]) -> Nat {
    Nat::Bind(NatRange::addr(NatKind::Src, ip(a)))
}

/// Runs a frame through `execute_nat`; returns the result and the frame as it leaves.
fn run(t: &Tracker, f: &Frame, commit: bool, nat: &Nat) -> (CtResult, Vec<u8>) {
    let mut b = f.bytes();
    let c = if commit {
        Commit::COMMIT
    } else {
        Commit::LOOKUP
    };
    let r = t.execute_nat(&mut b, 0, &c, nat, 1);
    // Every frame that leaves is well formed with its checksums right.
    if !r.state.has(CtState::INV) {
        parse(&b, true).expect("a translated frame verifies");
    }
    (r, b)
}

fn tcp(s: [u8; 4], d: [u8; 4], sp: u16, dp: u16, seq: u32, ack: u32, fl: u8) -> Frame {
    Frame::v4(s, d, Proto::tcp(sp, dp, seq, ack, fl))
}

#[test]
fn snat_tcp_both_directions_byte_exact() {
    let t = small();
    let (r, out) = run(&t, &tcp(A, B, 40000, 80, 1, 0, TCP_SYN), true, &snat(N));
    assert!(r.committed);
    assert_eq!(r.state.to_string(), "new+trk+snat");
    // No port range: the source port is kept when free.
    assert_eq!(out, tcp(N, B, 40000, 80, 1, 0, TCP_SYN).bytes());
    // The reply comes to the translated address and goes back to the client.
    let (r, out) = run(
        &t,
        &tcp(B, N, 80, 40000, 100, 2, TCP_SYN | TCP_ACK),
        false,
        &Nat::Apply,
    );
    assert_eq!(r.state.to_string(), "est+rpl+trk+dnat");
    assert_eq!(out, tcp(B, A, 80, 40000, 100, 2, TCP_SYN | TCP_ACK).bytes());
    let (r, out) = run(
        &t,
        &tcp(A, B, 40000, 80, 2, 101, TCP_ACK),
        false,
        &Nat::Apply,
    );
    assert_eq!(r.state.to_string(), "est+trk+snat");
    assert_eq!(out, tcp(N, B, 40000, 80, 2, 101, TCP_ACK).bytes());
    // Without `nat` the frame is tracked and left alone.
    let f = tcp(A, B, 40000, 80, 2, 101, TCP_ACK);
    let (r, out) = run(&t, &f, false, &Nat::Off);
    assert_eq!(r.state.to_string(), "est+trk");
    assert_eq!(out, f.bytes());
    // The untranslated reply is not the connection's reply.
    let (r, _) = run(
        &t,
        &tcp(B, A, 80, 40000, 101, 2, TCP_ACK),
        false,
        &Nat::Apply,
    );
    assert!(r.state.has(CtState::INV));
    assert_eq!(t.counters().entries, 1);
}

#[test]
fn port_collision_and_default_classes() {
    let t = small();
    let (_, out) = run(&t, &tcp(A, B, 40000, 80, 1, 0, TCP_SYN), true, &snat(N));
    assert_eq!(out, tcp(N, B, 40000, 80, 1, 0, TCP_SYN).bytes());
    // Another client with the same source port: another port of the same class.
    let (r, _) = run(&t, &tcp(A2, B, 40000, 80, 1, 0, TCP_SYN), true, &snat(N));
    assert!(r.committed);
    let orig = parse(&tcp(A2, B, 40000, 80, 1, 0, TCP_SYN).bytes(), true)
        .unwrap()
        .tuple;
    let (kind, reply) = t.binding(0, &orig).unwrap();
    assert_eq!(kind, NatKind::Src);
    assert_ne!(reply.dport, 40000);
    assert!((1024..=65535).contains(&reply.dport));
    assert_eq!(&reply.dst[..4], &N);
    // Privileged classes: 1-511 and 600-1023.
    for (sp, lo, hi) in [(100u16, 1u16, 511u16), (700, 600, 1023)] {
        run(&t, &tcp(A, B, sp, 80, 1, 0, TCP_SYN), true, &snat(N));
        run(&t, &tcp(A2, B, sp, 80, 1, 0, TCP_SYN), true, &snat(N));
        let o = parse(&tcp(A2, B, sp, 80, 1, 0, TCP_SYN).bytes(), true)
            .unwrap()
            .tuple;
        let (_, reply) = t.binding(0, &o).unwrap();
        assert_ne!(reply.dport, sp);
        assert!((lo..=hi).contains(&reply.dport), "{sp} -> {}", reply.dport);
    }
    assert_eq!(default_port_class(0), (1, 511));
    assert_eq!(default_port_class(512), (600, 1023));
    assert_eq!(default_port_class(1024), (1024, 65535));
}

#[test]
fn exhaustion_refuses_and_counts() {
    let t = small();
    let nat = Nat::Bind(NatRange::addr(NatKind::Src, ip(N)).with_ports(5000, 5001));
    let mut ports = Vec::new();
    for sp in [1000u16, 1001] {
        let (r, out) = run(&t, &tcp(A, B, sp, 80, 1, 0, TCP_SYN), true, &nat);
        assert!(r.committed);
        let p = parse(&out, true).unwrap().tuple;
        assert_eq!(&p.src[..4], &N);
        ports.push(p.sport);
    }
    ports.sort();
    assert_eq!(ports, [5000, 5001]);
    let f = tcp(A, B, 1002, 80, 1, 0, TCP_SYN);
    let (r, out) = run(&t, &f, true, &nat);
    assert!(!r.committed);
    assert_eq!(r.nat_error, Some(NatError::Exhausted));
    assert_eq!(r.state.to_string(), "new+trk");
    assert_eq!(out, f.bytes(), "a refused commit leaves the frame alone");
    assert_eq!(t.counters().nat_exhausted, 1);
    assert_eq!(t.counters().entries, 2);
    assert_eq!(t.zone_entries(0), 2);
    // The port in range is kept when free.
    let t = small();
    let (_, out) = run(&t, &tcp(A, B, 5001, 80, 1, 0, TCP_SYN), true, &nat);
    assert_eq!(out, tcp(N, B, 5001, 80, 1, 0, TCP_SYN).bytes());
    // A range of the other family or upside down is refused.
    let bad = Nat::Bind(NatRange::addr(
        NatKind::Src,
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ));
    let (r, _) = run(&t, &tcp(A2, B, 1, 80, 1, 0, TCP_SYN), true, &bad);
    assert_eq!(r.nat_error, Some(NatError::BadRange));
    let bad = Nat::Bind(NatRange::addr(NatKind::Src, ip(N)).with_ports(10, 9));
    let (r, _) = run(&t, &tcp(A2, B, 1, 80, 1, 0, TCP_SYN), true, &bad);
    assert_eq!(r.nat_error, Some(NatError::BadRange));
}

#[test]
fn removal_frees_the_translated_tuple() {
    let t = small();
    let nat = Nat::Bind(NatRange::addr(NatKind::Src, ip(N)).with_ports(5000, 5000));
    // RST before any reply deletes the connection, and its reply key with it.
    run(&t, &tcp(A, B, 1000, 80, 1, 0, TCP_SYN), true, &nat);
    let (r, _) = run(&t, &tcp(A, B, 1000, 80, 2, 0, TCP_RST), false, &Nat::Apply);
    assert!(!r.committed);
    let (r, _) = run(&t, &tcp(A2, B, 1000, 80, 1, 0, TCP_SYN), true, &nat);
    assert!(r.committed);
    // Expiry and sweep.
    assert_eq!(t.sweep(u64::MAX), 1);
    let (r, _) = run(&t, &tcp(A, B, 1000, 80, 1, 0, TCP_SYN), true, &nat);
    assert!(r.committed);
    // Flush.
    assert_eq!(t.flush(Some(0)), 1);
    let (r, _) = run(&t, &tcp(A2, B, 1000, 80, 1, 0, TCP_SYN), true, &nat);
    assert!(r.committed);
    assert_eq!(t.counters().entries, 1);
    assert_eq!(t.export(1).entries.len(), 1);
}

#[test]
fn dnat_udp_v6_and_zero_udp_checksum_v4() {
    let t = small();
    let vip = Frame::v6(1, 0x100, Proto::udp(5000, 53, b"query"));
    let mut backend = [0u8; 16];
    backend[0] = 0xfd;
    backend[15] = 2;
    let nat = Nat::Bind(
        NatRange::addr(NatKind::Dst, IpAddr::V6(Ipv6Addr::from(backend))).with_ports(5353, 5353),
    );
    let (r, out) = run(&t, &vip, true, &nat);
    assert_eq!(r.state.to_string(), "new+trk+dnat");
    assert_eq!(
        out,
        Frame::v6(1, 2, Proto::udp(5000, 5353, b"query")).bytes()
    );
    let (r, out) = run(
        &t,
        &Frame::v6(2, 1, Proto::udp(5353, 5000, b"answer")),
        false,
        &Nat::Apply,
    );
    assert_eq!(r.state.to_string(), "est+rpl+trk+snat");
    assert_eq!(
        out,
        Frame::v6(0x100, 1, Proto::udp(53, 5000, b"answer")).bytes()
    );
    // IPv4 UDP without a checksum stays without.
    let zero = |f: Frame| {
        let mut b = f.bytes();
        b[14 + 20 + 6] = 0;
        b[14 + 20 + 7] = 0;
        b
    };
    let mut b = zero(Frame::v4(A, B, Proto::udp(7, 9, b"x")));
    let r = t.execute_nat(&mut b, 0, &Commit::COMMIT, &snat(N), 1);
    assert!(r.committed);
    assert_eq!(b, zero(Frame::v4(N, B, Proto::udp(7, 9, b"x"))));
}

#[test]
fn icmp_echo_id_is_translated_on_collision() {
    let t = small();
    let (_, out) = run(
        &t,
        &Frame::v4(A, B, Proto::echo(true, 77, 1)),
        true,
        &snat(N),
    );
    assert_eq!(out, Frame::v4(N, B, Proto::echo(true, 77, 1)).bytes());
    let (r, out) = run(
        &t,
        &Frame::v4(A2, B, Proto::echo(true, 77, 1)),
        true,
        &snat(N),
    );
    assert!(r.committed);
    let id = parse(&out, true).unwrap().tuple.sport;
    assert_ne!(id, 77);
    assert_eq!(out, Frame::v4(N, B, Proto::echo(true, id, 1)).bytes());
    let (r, out) = run(
        &t,
        &Frame::v4(B, N, Proto::echo(false, id, 1)),
        false,
        &Nat::Apply,
    );
    assert_eq!(r.state.to_string(), "est+rpl+trk+dnat");
    assert_eq!(out, Frame::v4(B, A2, Proto::echo(false, 77, 1)).bytes());
}

#[test]
fn icmp_errors_are_translated() {
    // SNAT: an error about the translated datagram, sent to the NAT address, goes back to
    // the client with the quoted datagram as the client sent it.
    let t = small();
    let udp = Frame::v4(A, B, Proto::udp(5000, 53, b"q"));
    let (_, out) = run(&t, &udp, true, &snat(N));
    let sent = Frame::v4(N, B, Proto::udp(5000, 53, b"q"));
    assert_eq!(out, sent.bytes());
    let err = Frame::v4(R, N, Proto::icmp_error(3, 3, &sent));
    let (r, out) = run(&t, &err, false, &Nat::Apply);
    assert_eq!(r.state.to_string(), "rel+rpl+trk+dnat");
    assert_eq!(out, Frame::v4(R, A, Proto::icmp_error(3, 3, &udp)).bytes());
    // With Ethernet padding after the IP packet: the padding is left alone.
    let mut padded = err.bytes();
    padded.extend_from_slice(&[0xee; 10]);
    let r = t.execute_nat(&mut padded, 0, &Commit::LOOKUP, &Nat::Apply, 1);
    assert!(r.state.has(CtState::REL));
    let mut want = Frame::v4(R, A, Proto::icmp_error(3, 3, &udp)).bytes();
    want.extend_from_slice(&[0xee; 10]);
    assert_eq!(padded, want);

    // DNAT over TCP, an error in each direction.
    let t = small();
    let nat = Nat::Bind(NatRange::addr(NatKind::Dst, ip(B)).with_ports(8080, 8080));
    let syn = tcp(A, N, 40000, 80, 1, 0, TCP_SYN);
    let (_, out) = run(&t, &syn, true, &nat);
    let to_backend = tcp(A, B, 40000, 8080, 1, 0, TCP_SYN);
    assert_eq!(out, to_backend.bytes());
    // A router between us and the backend: the client sees it from the service address.
    let err = Frame::v4(R, A, Proto::icmp_error(3, 1, &to_backend));
    let (r, out) = run(&t, &err, false, &Nat::Apply);
    assert_eq!(r.state.to_string(), "rel+rpl+trk+snat");
    assert_eq!(out, Frame::v4(N, A, Proto::icmp_error(3, 1, &syn)).bytes());
    // The backend's SYN-ACK reaches the client as the service's.
    let synack = tcp(B, A, 8080, 40000, 50, 2, TCP_SYN | TCP_ACK);
    let (_, out) = run(&t, &synack, false, &Nat::Apply);
    let seen = tcp(N, A, 80, 40000, 50, 2, TCP_SYN | TCP_ACK);
    assert_eq!(out, seen.bytes());
    // A router on the client's side quotes what the client saw: the error goes on to the
    // backend, quoting what the backend sent.
    let err = Frame::v4(R, N, Proto::icmp_error(11, 0, &seen));
    let (r, out) = run(&t, &err, false, &Nat::Apply);
    assert_eq!(r.state.to_string(), "rel+trk+dnat");
    assert_eq!(
        out,
        Frame::v4(R, B, Proto::icmp_error(11, 0, &synack)).bytes()
    );

    // ICMPv6: SNAT of UDP in IPv6, the error's checksum covers the pseudo header.
    let t = small();
    let mut n6 = [0u8; 16];
    n6[0] = 0xfd;
    n6[15] = 0x99;
    let nat = Nat::Bind(NatRange::addr(NatKind::Src, IpAddr::V6(Ipv6Addr::from(n6))));
    let udp = Frame::v6(1, 2, Proto::udp(5000, 53, b"q"));
    let (_, out) = run(&t, &udp, true, &nat);
    let sent = Frame::v6(0x99, 2, Proto::udp(5000, 53, b"q"));
    assert_eq!(out, sent.bytes());
    let err = Frame::v6(7, 0x99, Proto::icmp_error(1, 4, &sent));
    let (r, out) = run(&t, &err, false, &Nat::Apply);
    assert_eq!(r.state.to_string(), "rel+rpl+trk+dnat");
    assert_eq!(out, Frame::v6(7, 1, Proto::icmp_error(1, 4, &udp)).bytes());
}

#[test]
fn candidates_are_bounded_and_consistent() {
    let f = tcp(A, B, 40000, 80, 1, 0, TCP_SYN).bytes();
    let orig = parse(&f, true).unwrap().tuple;
    let wide = NatRange {
        kind: NatKind::Src,
        addr_min: ip([10, 0, 0, 0]),
        addr_max: ip([10, 255, 255, 255]),
        ports: None,
    };
    let mut n = 0;
    for r in candidates(&orig, &wide).unwrap() {
        assert!(binding_is_consistent(&orig, NatKind::Src, &r));
        n += 1;
    }
    assert_eq!(n, MAX_PROBES);
    // The whole IPv6 space as a range (no overflow anywhere).
    let f6 = Frame::v6(1, 2, Proto::udp(1, 2, b"")).bytes();
    let o6 = parse(&f6, true).unwrap().tuple;
    let all = NatRange {
        kind: NatKind::Src,
        addr_min: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        addr_max: IpAddr::V6(Ipv6Addr::from(u128::MAX)),
        ports: Some((1, 1)),
    };
    assert_eq!(candidates(&o6, &all).unwrap().count(), MAX_ADDRS as usize);
    let top = NatRange {
        addr_min: IpAddr::V6(Ipv6Addr::from(u128::MAX - 1)),
        ..all
    };
    assert_eq!(candidates(&o6, &top).unwrap().count(), 2);
    let one = NatRange::addr(NatKind::Dst, ip(N)).with_ports(1, 3);
    let c: Vec<_> = candidates(&orig, &one).unwrap().collect();
    assert_eq!(c.len(), 3);
    assert!(c
        .iter()
        .all(|r| binding_is_consistent(&orig, NatKind::Dst, r)));
    assert!(!binding_is_consistent(&orig, NatKind::Src, &c[0]));
}

/// Random well-formed flows through random NAT ranges: every frame that leaves verifies
/// (checksums recomputed from scratch by the parser), and mutated frames never panic.
#[test]
fn random_flows_verify_and_mutations_never_panic() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let t = Tracker::new(Config {
        shards: 8,
        max_entries: 2000,
        ..Config::default()
    });
    for _ in 0..3000 {
        let a = [10, 0, 0, (rnd() % 4) as u8];
        let b = [192, 0, 2, (rnd() % 4) as u8];
        let sp = (rnd() % 6) as u16 * 300;
        let dp = (rnd() % 3) as u16 + 1;
        let f = match rnd() % 5 {
            0 => tcp(a, b, sp, dp, rnd() as u32, 0, TCP_SYN),
            1 => Frame::v4(a, b, Proto::udp(sp, dp, b"abc")),
            2 => Frame::v4(a, b, Proto::echo(true, sp, 1)),
            3 => Frame::v6(u16::from(a[3]), 0x100, Proto::udp(sp, dp, b"abcd")),
            _ => Frame::v4(
                a,
                b,
                Proto::Raw {
                    proto: 47,
                    payload: vec![1; 5],
                },
            ),
        };
        let v6 = matches!(f.bytes()[12..14], [0x86, 0xdd]);
        let lo = |n: u8| {
            if v6 {
                let mut b = [0u8; 16];
                b[0] = 0xfd;
                b[15] = n;
                IpAddr::V6(Ipv6Addr::from(b))
            } else {
                ip([198, 51, 100, n])
            }
        };
        let kind = if rnd() % 2 == 0 {
            NatKind::Src
        } else {
            NatKind::Dst
        };
        let mut range = NatRange {
            kind,
            addr_min: lo(1),
            addr_max: lo((rnd() % 3) as u8 + 1),
            ports: None,
        };
        if rnd() % 2 == 0 {
            let p = (rnd() % 4) as u16 + 1000;
            range.ports = Some((p, p + (rnd() % 3) as u16));
        }
        // `run` checks that what leaves verifies.
        let (r, _) = run(&t, &f, true, &Nat::Bind(range));
        assert!(r.committed || r.nat_error.is_some() || !r.state.has(CtState::NEW));
    }
    // Replies and errors for a sample of connections, built from their bindings.
    let s = t.export(1);
    for e in s.entries.iter().take(300) {
        let Some(n) = e.nat else { continue };
        let reply: crate::tuple::Tuple = n.reply.into();
        if reply.proto != crate::tuple::IPPROTO_UDP || reply.family != Family::V4 {
            continue;
        }
        let mut s4 = [0u8; 4];
        let mut d4 = [0u8; 4];
        s4.copy_from_slice(&reply.src[..4]);
        d4.copy_from_slice(&reply.dst[..4]);
        let rf = Frame::v4(s4, d4, Proto::udp(reply.sport, reply.dport, b"r"));
        let (r, _) = run(&t, &rf, false, &Nat::Apply);
        assert!(r.state.has(CtState::RPL), "{}", r.state);
        let err = Frame::v4(R, d4, Proto::icmp_error(3, 3, &rf));
        let _ = run(&t, &err, false, &Nat::Apply);
    }
    // Mutations, past the checksums, through NAT.
    let t = Tracker::new(Config {
        shards: 4,
        max_entries: 50,
        verify_checksums: false,
        ..Config::default()
    });
    let seeds = [
        tcp(A, B, 1, 2, 3, 0, TCP_SYN).bytes(),
        Frame::v4(A, B, Proto::udp(1, 2, b"x")).bytes(),
        Frame::v6(1, 2, Proto::udp(1, 2, b"x")).bytes(),
        Frame::v4(
            R,
            N,
            Proto::icmp_error(3, 3, &Frame::v4(N, B, Proto::udp(1, 2, b""))),
        )
        .bytes(),
        Frame::v6(
            9,
            2,
            Proto::icmp_error(1, 4, &Frame::v6(2, 3, Proto::udp(1, 2, b""))),
        )
        .bytes(),
        Frame::v4(A, B, Proto::echo(true, 1, 1)).bytes(),
    ];
    for i in 0..20_000u64 {
        let mut f = seeds[(rnd() % seeds.len() as u64) as usize].clone();
        for _ in 0..(rnd() % 4) {
            let at = (rnd() % f.len() as u64) as usize;
            f[at] = rnd() as u8;
        }
        if rnd() % 8 == 0 {
            let n = (rnd() % (f.len() as u64 + 1)) as usize;
            f.truncate(n);
        }
        let nat = match rnd() % 3 {
            0 => Nat::Apply,
            1 => snat(N),
            _ => Nat::Bind(NatRange::addr(NatKind::Dst, ip(B)).with_ports(1, 2)),
        };
        let r = t.execute_nat(&mut f, 0, &Commit::COMMIT, &nat, i);
        assert_eq!(r.state.has(CtState::INV), r.orig.is_none());
    }
    assert_eq!(t.counters().entries as usize, t.export(0).entries.len());
    let s = t.export(0);
    let u = Tracker::new(Config {
        shards: 4,
        max_entries: 50,
        ..Config::default()
    });
    assert_eq!(u.restore(&s, 0), Ok(s.entries.len()));
}

/// Threads committing SNAT connections into a small port range at once: no two get the same
/// translated tuple, the range is used up exactly, and the rest are refused and counted.
#[test]
fn concurrent_commits_never_share_a_tuple() {
    let t = std::sync::Arc::new(Tracker::new(Config {
        shards: 16,
        max_entries: 10_000,
        ..Config::default()
    }));
    let nat = Nat::Bind(NatRange::addr(NatKind::Src, ip(N)).with_ports(2000, 2099));
    let threads: Vec<_> = (0..4u8)
        .map(|th| {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for i in 0..50u16 {
                    let f = tcp([10, 1, th, 1], B, 1000 + i, 80, 1, 0, TCP_SYN);
                    let (r, b) = run(&t, &f, true, &nat);
                    if r.committed {
                        out.push(parse(&b, true).unwrap().tuple.sport);
                    } else {
                        assert_eq!(r.nat_error, Some(NatError::Exhausted));
                    }
                }
                out
            })
        })
        .collect();
    let mut ports: Vec<u16> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    ports.sort();
    assert_eq!(ports, (2000..2100).collect::<Vec<_>>());
    assert_eq!(t.counters().entries, 100);
    assert_eq!(t.counters().nat_exhausted, 100);
    // Every reply finds its connection.
    for p in 2000..2100u16 {
        let f = tcp(B, N, 80, p, 7, 2, TCP_SYN | TCP_ACK);
        let (r, _) = run(&t, &f, false, &Nat::Apply);
        assert!(r.state.has(CtState::RPL), "{p}: {}", r.state);
    }
}
