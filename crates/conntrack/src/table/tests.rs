use super::*;
use crate::build::{Frame, Proto};
use crate::tuple::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

fn tcp(from_a: bool, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    if from_a {
        Frame::v4(A, B, Proto::tcp(40000, 80, seq, ack, flags)).bytes()
    } else {
        Frame::v4(B, A, Proto::tcp(80, 40000, seq, ack, flags)).bytes()
    }
}

fn small() -> Tracker {
    Tracker::new(Config {
        shards: 4,
        max_entries: 100,
        ..Config::default()
    })
}

fn st(r: &CtResult) -> String {
    r.state.to_string()
}

#[test]
fn lookup_without_commit_creates_nothing() {
    let t = small();
    let r = t.execute(&tcp(true, 1, 0, TCP_SYN), 0, false, 0);
    assert_eq!(st(&r), "new+trk");
    assert!(!r.committed);
    assert_eq!(t.counters().entries, 0);
    let r = t.execute(&tcp(true, 1, 0, TCP_SYN), 0, true, 0);
    assert!(r.committed);
    assert_eq!(t.counters().entries, 1);
    assert_eq!(t.counters().created, 1);
}

#[test]
fn handshake_states_and_close() {
    let t = small();
    let steps: [(bool, u32, u32, u8, &str, TcpState); 7] = [
        (true, 100, 0, TCP_SYN, "new+trk", TcpState::SynSent),
        (true, 100, 0, TCP_SYN, "new+trk", TcpState::SynSent),
        (
            false,
            500,
            101,
            TCP_SYN | TCP_ACK,
            "est+rpl+trk",
            TcpState::SynRecv,
        ),
        (true, 101, 501, TCP_ACK, "est+trk", TcpState::Established),
        (
            true,
            101,
            501,
            TCP_FIN | TCP_ACK,
            "est+trk",
            TcpState::FinWait,
        ),
        (
            false,
            501,
            102,
            TCP_FIN | TCP_ACK,
            "est+rpl+trk",
            TcpState::LastAck,
        ),
        (true, 102, 502, TCP_ACK, "est+trk", TcpState::TimeWait),
    ];
    for (i, (a, seq, ack, fl, want, ts)) in steps.into_iter().enumerate() {
        let r = t.execute(&tcp(a, seq, ack, fl), 0, true, 1000);
        assert_eq!(st(&r), want, "step {i}");
        assert_eq!(r.tcp_state, Some(ts), "step {i}");
    }
}

#[test]
fn invalid_packets_are_counted() {
    let t = small();
    // An ACK without a connection: no mid-stream pickup.
    assert_eq!(
        st(&t.execute(&tcp(true, 1, 1, TCP_ACK), 0, true, 0)),
        "inv+trk"
    );
    // Garbage.
    assert_eq!(st(&t.execute(&[1, 2, 3], 0, true, 0)), "inv+trk");
    assert_eq!(t.counters().invalid, 2);
    assert_eq!(t.counters().entries, 0);
    // A first fragment (more-fragments set), even a SYN: not reassembled, invalid, counted.
    let mut f = tcp(true, 100, 0, TCP_SYN);
    f[14 + 6] |= 0x20;
    f[24..26].copy_from_slice(&[0, 0]);
    let sum = f[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    f[24..26].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
    assert_eq!(st(&t.execute(&f, 0, true, 0)), "inv+trk");
    assert_eq!(t.counters().fragments, 1);
    assert_eq!(t.counters().invalid, 3);
    assert_eq!(t.counters().entries, 0);
}

#[test]
fn rst_before_reply_deletes() {
    let t = small();
    t.execute(&tcp(true, 100, 0, TCP_SYN), 0, true, 0);
    let r = t.execute(&tcp(false, 0, 101, TCP_RST | TCP_ACK), 0, true, 0);
    assert_eq!(st(&r), "est+rpl+trk");
    assert_eq!(t.counters().entries, 0);
}

#[test]
fn zones_are_separate() {
    let t = small();
    t.execute(&tcp(true, 100, 0, TCP_SYN), 1, true, 0);
    let r = t.execute(&tcp(false, 500, 101, TCP_SYN | TCP_ACK), 2, true, 0);
    assert_eq!(st(&r), "inv+trk");
    let r = t.execute(&tcp(false, 500, 101, TCP_SYN | TCP_ACK), 1, true, 0);
    assert_eq!(st(&r), "est+rpl+trk");
}

#[test]
fn udp_and_icmp_related() {
    let t = small();
    let q = Frame::v4(A, B, Proto::udp(5000, 53, b"q"));
    assert_eq!(st(&t.execute(&q.bytes(), 0, true, 0)), "new+trk");
    let err = Frame::v4([10, 0, 0, 9], A, Proto::icmp_error(3, 3, &q));
    let r = t.execute(&err.bytes(), 0, false, 0);
    assert_eq!(st(&r), "rel+rpl+trk");
    assert_eq!(r.orig.map(|o| o.dport), Some(53));
    let a = Frame::v4(B, A, Proto::udp(53, 5000, b"a"));
    assert_eq!(st(&t.execute(&a.bytes(), 0, true, 0)), "est+rpl+trk");
    assert_eq!(st(&t.execute(&q.bytes(), 0, true, 0)), "est+trk");
    // An error quoting an unknown flow is invalid.
    let other = Frame::v4(A, B, Proto::udp(5001, 53, b"q"));
    let err = Frame::v4([10, 0, 0, 9], A, Proto::icmp_error(3, 3, &other));
    assert_eq!(st(&t.execute(&err.bytes(), 0, false, 0)), "inv+trk");
}

#[test]
fn icmp_echo() {
    let t = small();
    let req = Frame::v4(A, B, Proto::echo(true, 7, 1)).bytes();
    let rep = Frame::v4(B, A, Proto::echo(false, 7, 1)).bytes();
    assert_eq!(st(&t.execute(&rep, 0, true, 0)), "inv+trk");
    assert_eq!(st(&t.execute(&req, 0, true, 0)), "new+trk");
    assert_eq!(st(&t.execute(&rep, 0, true, 0)), "est+rpl+trk");
    assert_eq!(st(&t.execute(&req, 0, true, 0)), "est+trk");
}

#[test]
fn limits_refuse_and_count() {
    let t = Tracker::new(Config {
        shards: 2,
        max_entries: 3,
        default_zone_limit: Some(2),
        ..Config::default()
    });
    let f = |p: u16| Frame::v4(A, B, Proto::udp(p, 53, b"")).bytes();
    assert!(t.execute(&f(1), 0, true, 0).committed);
    assert!(t.execute(&f(2), 0, true, 0).committed);
    let r = t.execute(&f(3), 0, true, 0);
    assert!(!r.committed);
    assert_eq!(st(&r), "new+trk");
    assert!(t.execute(&f(3), 1, true, 0).committed);
    assert!(!t.execute(&f(4), 2, true, 0).committed); // global limit
    t.set_zone_limit(0, Some(5));
    assert_eq!(t.counters().limit_hits, 2);
    assert_eq!(t.zone_entries(0), 2);
    assert_eq!(t.counters().entries, 3);
}

#[test]
fn expiry_and_sweep() {
    let t = small();
    let q = Frame::v4(A, B, Proto::udp(1, 2, b"")).bytes();
    t.execute(&q, 0, true, 0);
    assert_eq!(t.sweep(29_999), 0);
    assert_eq!(t.sweep(30_000), 1);
    assert_eq!(t.counters().entries, 0);
    assert_eq!(t.counters().expired, 1);
    // A lookup past the deadline sees a new connection and drops the dead one.
    t.execute(&q, 0, true, 0);
    let r = t.execute(&q, 0, true, 40_000);
    assert_eq!(st(&r), "new+trk");
    assert_eq!(t.counters().entries, 1);
    assert_eq!(t.counters().expired, 2);
}

#[test]
fn sweep_and_flush_give_memory_back() {
    let t = Tracker::new(Config {
        max_entries: 100_000,
        shards: 4,
        ..Config::default()
    });
    let udp = |i: u32| {
        let [a, b, c, d] = (0x0a00_0000 | i).to_be_bytes();
        Frame::v4([a, b, c, d], B, Proto::udp(1, 2, b"")).bytes()
    };
    for i in 0..20_000 {
        assert!(t.execute(&udp(i), 0, true, 0).committed);
    }
    assert!(t.capacity() >= 20_000);
    // All but one expire: the swept shards shrink to what they hold.
    t.execute(&udp(0), 0, true, 25_000);
    assert_eq!(t.sweep(30_000), 19_999);
    assert!(t.capacity() < 1_000, "{}", t.capacity());
    for i in 0..20_000 {
        t.execute(&udp(i), 0, true, 40_000);
    }
    assert_eq!(t.flush(None), 20_000);
    assert!(t.capacity() < 1_000, "{}", t.capacity());
    // And they grow again.
    assert!(t.execute(&udp(7), 0, true, 50_000).committed);
}

#[test]
fn mark_and_label_on_commit() {
    let t = small();
    let q = Frame::v4(A, B, Proto::udp(1, 2, b"")).bytes();
    let c = Commit {
        commit: true,
        mark: Some((0xab, 0xff)),
        label: Some((1 << 100, u128::MAX)),
    };
    let r = t.execute_with(&q, 0, &c, 0);
    assert_eq!((r.mark, r.label), (0xab, 1 << 100));
    let r = t.execute(&q, 0, false, 0);
    assert_eq!((r.mark, r.label), (0xab, 1 << 100));
}

#[test]
fn export_restore_round_trip() {
    let t = small();
    t.execute(&tcp(true, 100, 0, TCP_SYN), 3, true, 0);
    t.execute(&tcp(false, 500, 101, TCP_SYN | TCP_ACK), 3, true, 0);
    t.execute(&tcp(true, 101, 501, TCP_ACK), 3, true, 0);
    let q = Frame::v4(A, B, Proto::udp(1, 2, b"")).bytes();
    t.execute_with(
        &q,
        0,
        &Commit {
            commit: true,
            mark: Some((9, !0)),
            label: None,
        },
        0,
    );
    let s = t.export(10);
    assert_eq!(s.entries.len(), 2);
    let u = small();
    assert_eq!(u.restore(&s, 1_000_000), Ok(2));
    assert_eq!(u.export(1_000_000 - 10).entries.len(), 2);
    // The restored connection goes on: data from B is established.
    let r = u.execute(&tcp(false, 501, 101, TCP_ACK), 3, true, 1_000_001);
    assert_eq!(st(&r), "est+rpl+trk");
    assert_eq!(r.tcp_state, Some(TcpState::Established));
    assert_eq!(u.execute(&q, 0, false, 1_000_001).mark, 9);
    // Not into a table that has entries.
    assert_eq!(u.restore(&s, 0), Err(crate::StateError::NotEmpty));
}

#[test]
fn hostile_restore_is_refused() {
    use crate::state::*;
    let t = small();
    t.execute(&tcp(true, 100, 0, TCP_SYN), 0, true, 0);
    let good = t.export(0);
    let check = |f: &dyn Fn(&mut TableState), want: fn(&StateError) -> bool| {
        let mut s = good.clone();
        f(&mut s);
        let u = small();
        let e = u.restore(&s, 0).unwrap_err();
        assert!(want(&e), "{e:?}");
        assert_eq!(u.counters().entries, 0);
    };
    check(&|s| s.version = 99, |e| {
        matches!(e, StateError::Version(99))
    });
    check(&|s| s.entries[0].orig.src[10] = 1, |e| {
        matches!(e, StateError::Tuple(0))
    });
    check(&|s| s.entries[0].tcp = None, |e| {
        matches!(e, StateError::Proto(0))
    });
    check(&|s| s.entries[0].tcp.as_mut().unwrap().state = 10, |e| {
        matches!(e, StateError::TcpState(0, 10))
    });
    check(
        &|s| s.entries[0].tcp.as_mut().unwrap().sides[1].scale = 15,
        |e| matches!(e, StateError::Scale(0, 15)),
    );
    check(&|s| s.entries[0].expires_in_ms = u64::MAX, |e| {
        matches!(e, StateError::Expiry(0, _))
    });
    check(&|s| s.entries.push(s.entries[0]), |e| {
        matches!(e, StateError::Duplicate(1))
    });
    check(
        &|s| {
            for p in 0..200u16 {
                let mut e = s.entries[0];
                e.orig.sport = p;
                s.entries.push(e);
            }
        },
        |e| matches!(e, StateError::TooMany(..)),
    );
    check(&|s| s.entries[0].orig.proto = 17, |e| {
        matches!(e, StateError::Proto(0))
    });
}

#[test]
fn concurrent_execute() {
    let t = std::sync::Arc::new(Tracker::new(Config::default()));
    let hs: Vec<_> = (0..4u16)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                for p in 0..500u16 {
                    let f = Frame::v4(A, B, Proto::udp(w * 1000 + p, 53, b"")).bytes();
                    assert!(t.execute(&f, 0, true, 0).committed);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(t.counters().entries, 2000);
    assert_eq!(t.flush(None), 2000);
    assert_eq!(t.counters().entries, 0);
}

/// A deterministic fuzz pass (the coverage-guided one is `fuzz/fuzz_targets/conntrack.rs`):
/// valid frames with random bytes flipped and random truncations, through one tracker.
#[test]
fn mutated_frames_never_panic() {
    let t = Tracker::new(Config {
        shards: 4,
        max_entries: 50,
        default_zone_limit: Some(20),
        // Mutations would mostly fail the checksums; go past them into the trackers.
        verify_checksums: false,
        ..Config::default()
    });
    let seeds = [
        tcp(true, 1, 0, TCP_SYN),
        tcp(false, 5, 2, TCP_SYN | TCP_ACK),
        Frame::v4(
            A,
            B,
            Proto::tcp(1, 2, 3, 4, TCP_SYN)
                .options(&[2, 4, 5, 180, 4, 2, 3, 3, 7, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2]),
        )
        .bytes(),
        Frame::v6(1, 2, Proto::udp(1, 2, b"hello")).vlan(3).bytes(),
        Frame::v4(
            [9, 9, 9, 9],
            A,
            Proto::icmp_error(3, 3, &Frame::v4(A, B, Proto::udp(1, 2, b""))),
        )
        .bytes(),
        Frame::v6(
            2,
            1,
            Proto::icmp_error(1, 4, &Frame::v6(1, 2, Proto::udp(1, 2, b""))),
        )
        .bytes(),
        Frame::v4(A, B, Proto::echo(true, 1, 1)).bytes(),
        Frame::v6(1, 2, Proto::echo(true, 1, 1)).bytes(),
        Frame::v6(
            1,
            2,
            Proto::Raw {
                proto: 1,
                payload: vec![8, 0, 0, 0, 0, 1, 0, 1],
            },
        )
        .bytes(),
        Frame::v4(
            A,
            B,
            Proto::Raw {
                proto: 47,
                payload: vec![0; 8],
            },
        )
        .bytes(),
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
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
        let r = t.execute(&f, (rnd() % 3) as u16, rnd() % 2 == 0, i * 10);
        assert_eq!(r.state.has(CtState::INV), r.orig.is_none());
        if i % 1000 == 0 {
            t.sweep(i * 10);
        }
    }
    assert_eq!(t.counters().entries as usize, t.export(0).entries.len());
    assert!(t.counters().entries <= 50);
    // Whatever the frames made, its export restores.
    let s = t.export(0);
    let u = Tracker::new(Config {
        shards: 4,
        max_entries: 50,
        default_zone_limit: Some(20),
        ..Config::default()
    });
    assert_eq!(u.restore(&s, 0), Ok(s.entries.len()));
}

#[test]
fn tcp_timeouts_follow_the_state() {
    let t = small();
    let day = 24 * 3600 * 1000;
    // SYN_SENT: 120 s; a retransmitted SYN does not extend it.
    t.execute(&tcp(true, 100, 0, TCP_SYN), 0, true, 0);
    t.execute(&tcp(true, 100, 0, TCP_SYN), 0, true, 60_000);
    assert_eq!(t.sweep(119_999), 0);
    assert_eq!(t.sweep(120_000), 1);
    // ESTABLISHED: 5 days.
    t.execute(&tcp(true, 100, 0, TCP_SYN), 0, true, 0);
    t.execute(&tcp(false, 500, 101, TCP_SYN | TCP_ACK), 0, true, 0);
    t.execute(&tcp(true, 101, 501, TCP_ACK), 0, true, 0);
    assert_eq!(t.sweep(5 * day - 1), 0);
    // A RST: CLOSE, 10 s.
    t.execute(&tcp(false, 501, 0, TCP_RST), 0, true, 1000);
    assert_eq!(t.sweep(10_999), 0);
    assert_eq!(t.sweep(11_000), 1);
}

#[test]
fn restore_respects_zone_limits() {
    let t = small();
    let f = |p: u16| Frame::v4(A, B, Proto::udp(p, 53, b"")).bytes();
    t.execute(&f(1), 4, true, 0);
    t.execute(&f(2), 4, true, 0);
    let s = t.export(0);
    let u = small();
    u.set_zone_limit(4, Some(1));
    assert_eq!(u.restore(&s, 0), Err(crate::StateError::ZoneLimit(4, 1)));
    assert_eq!(u.counters().entries, 0);
    u.set_zone_limit(4, None);
    assert_eq!(u.restore(&s, 0), Ok(2));
    assert_eq!(u.zone_entries(4), 2);
}

#[test]
fn foreign_icmp_and_other_protocols_are_generic_and_restore() {
    let t = small();
    // ICMP (1) inside IPv6 and a protocol without ports (GRE, 47) inside IPv4.
    let icmp_in_v6 = Frame::v6(
        1,
        2,
        Proto::Raw {
            proto: 1,
            payload: vec![8, 0, 0, 0, 0, 1, 0, 1],
        },
    )
    .bytes();
    let gre = Frame::v4(
        A,
        B,
        Proto::Raw {
            proto: 47,
            payload: vec![0; 8],
        },
    )
    .bytes();
    let gre_back = Frame::v4(
        B,
        A,
        Proto::Raw {
            proto: 47,
            payload: vec![0; 8],
        },
    )
    .bytes();
    assert_eq!(st(&t.execute(&icmp_in_v6, 0, true, 0)), "new+trk");
    assert_eq!(st(&t.execute(&gre, 0, true, 0)), "new+trk");
    assert_eq!(st(&t.execute(&gre_back, 0, true, 0)), "est+rpl+trk");
    let s = t.export(0);
    assert_eq!(s.entries.len(), 2);
    let u = small();
    assert_eq!(u.restore(&s, 0), Ok(2));
    assert_eq!(st(&u.execute(&gre, 0, true, 1)), "est+trk");
}

#[test]
fn sweep_while_packets_flow() {
    let t = std::sync::Arc::new(Tracker::new(Config {
        shards: 8,
        ..Config::default()
    }));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut now = 0;
            while !stop.load(Relaxed) {
                now += 1000;
                t.sweep(now);
            }
        })
    };
    let workers: Vec<_> = (0..3u16)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..3000u64 {
                    let f =
                        Frame::v4(A, B, Proto::udp(w * 5000 + (i % 1000) as u16, 53, b"")).bytes();
                    t.execute(&f, w, true, i * 50);
                }
            })
        })
        .collect();
    for h in workers {
        h.join().unwrap();
    }
    stop.store(true, Relaxed);
    sweeper.join().unwrap();
    let c = t.counters();
    assert_eq!(c.entries as usize, t.export(0).entries.len());
    assert_eq!(c.created - c.expired, c.entries);
    assert_eq!(
        (0..3).map(|z| u64::from(t.zone_entries(z))).sum::<u64>(),
        c.entries
    );
}

#[test]
fn a_million_half_open_syns_stay_within_their_zone_limit() {
    // A SYN flood from a million (address, port) pairs committed in zone 1, limited to
    // 10 000 entries: the table holds 10 000, every other commit is refused and counted, and
    // zone 2 (its own limit) still commits. The flood costs no entries beyond the limit.
    let t = Tracker::new(Config {
        shards: 16,
        max_entries: 20_000,
        default_zone_limit: Some(10_000),
        ..Config::default()
    });
    let mut committed = 0u32;
    for i in 0..1_000_000u32 {
        let src = [10, 1, (i >> 16) as u8, (i >> 8) as u8];
        let f = Frame::v4(
            src,
            B,
            Proto::tcp(1024 + (i & 0xff) as u16, 80, i, 0, TCP_SYN),
        );
        let r = t.execute(&f.bytes(), 1, true, 0);
        assert!(r.state.has(CtState::NEW), "{i}: {}", r.state);
        committed += u32::from(r.committed);
    }
    assert_eq!(committed, 10_000);
    assert_eq!(t.zone_entries(1), 10_000);
    assert_eq!(t.counters().entries, 10_000);
    assert_eq!(t.counters().limit_hits, 990_000);
    let r = t.execute(&tcp(true, 100, 0, TCP_SYN), 2, true, 0);
    assert!(r.committed, "zone 2 is not starved by zone 1's flood");
    // Half-open entries expire on the SYN_SENT timeout, freeing the zone.
    let gone = t.sweep(u64::from(crate::tcp::TcpTimeouts::default().syn_sent) * 1000 + 1);
    assert_eq!(gone, 10_001);
    assert_eq!(t.counters().entries, 0);
}

#[test]
fn an_out_of_window_flood_changes_nothing() {
    let t = small();
    t.execute(&tcp(true, 100, 0, TCP_SYN), 0, true, 0);
    t.execute(&tcp(false, 500, 101, TCP_SYN | TCP_ACK), 0, true, 0);
    assert_eq!(
        st(&t.execute(&tcp(true, 101, 501, TCP_ACK), 0, true, 0)),
        "est+trk"
    );
    let invalid = t.counters().invalid;
    // 100 000 segments far outside either window (a quarter of the sequence space ahead:
    // half of it would be ambiguous, as in Linux), data and RSTs alike.
    for i in 0..100_000u32 {
        let seq = 0x4000_0000u32 + i.wrapping_mul(7919) % 0x1000_0000;
        let flags = if i % 2 == 0 { TCP_ACK } else { TCP_RST };
        let r = t.execute(&tcp(i % 3 == 0, seq, seq, flags), 0, true, 0);
        assert_eq!(st(&r), "inv+trk", "{i}");
    }
    assert_eq!(t.counters().invalid - invalid, 100_000);
    assert_eq!(t.counters().entries, 1);
    // The connection still passes its in-window segments both ways.
    assert_eq!(
        st(&t.execute(&tcp(true, 101, 501, TCP_ACK), 0, true, 0)),
        "est+trk"
    );
    assert_eq!(
        st(&t.execute(&tcp(false, 501, 101, TCP_ACK), 0, true, 0)),
        "est+rpl+trk"
    );
}
