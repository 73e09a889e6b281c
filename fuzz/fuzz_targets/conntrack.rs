//! Any bytes as frames through the connection tracker, or as a handed-over conntrack state.
//!
//! First byte even: the rest is a sequence of frames (a length byte, a zone/commit byte,
//! then the frame) fed to one `Tracker`; nothing may panic, and the table's entry counter
//! must equal what an export sees. With bit 1 of the first byte set the frames go through
//! `execute_nat` (bits 2-3 pick no NAT, `ct(nat)`, an IPv4 SNAT or an IPv6 DNAT range, small
//! enough to exhaust), and a frame that was valid leaves valid (its checksums verify); bit 4
//! treats the frames as having a partial L4 checksum (`execute_offloaded`, checksum
//! offload: nothing verified there), bit 5 runs `end_reply_conn` (`force`) before each
//! commit. First byte odd: the rest is the JSON of a `TableState`;
//! a restore must not panic, and a state that restores exports into one that restores again.
#![no_main]
use ferrovs_conntrack::{Commit, Config, Nat, NatKind, NatRange, TableState, Tracker};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn small() -> Tracker {
    Tracker::new(Config {
        shards: 4,
        max_entries: 64,
        default_zone_limit: Some(32),
        ..Config::default()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        let t = small();
        let nat = match (mode >> 2) & 3 {
            0 => Nat::Off,
            1 => Nat::Apply,
            2 => Nat::Bind(
                NatRange::addr(NatKind::Src, IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)))
                    .with_ports(1000, 1003),
            ),
            _ => Nat::Bind(NatRange {
                kind: NatKind::Dst,
                addr_min: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
                addr_max: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
                ports: None,
            }),
        };
        let mut rest = rest;
        let mut now = 0u64;
        while rest.len() >= 2 {
            let len = usize::from(rest[0]).min(rest.len() - 2);
            let flags = rest[1];
            let frame = &rest[2..2 + len];
            rest = &rest[2 + len..];
            now += u64::from(flags >> 4) * 1000;
            let (zone, commit) = (u16::from(flags & 3), flags & 4 != 0);
            let partial = mode & 0x10 != 0;
            if commit && mode & 0x20 != 0 {
                t.end_reply_conn(frame, zone, partial);
            }
            let r = if mode & 2 != 0 {
                let mut f = frame.to_vec();
                let c = if commit { Commit::COMMIT } else { Commit::LOOKUP };
                let r = t.execute_offloaded(&mut f, zone, &c, &nat, now, partial);
                if !partial && !r.state.has(ferrovs_conntrack::CtState::INV) {
                    // A valid frame (checksums verified on the way in) leaves valid.
                    assert!(
                        ferrovs_conntrack::tuple::parse(&f, true).is_ok(),
                        "a translated frame no longer verifies"
                    );
                }
                r
            } else {
                t.execute(frame, zone, commit, now)
            };
            if r.state.has(ferrovs_conntrack::CtState::INV) {
                assert!(r.orig.is_none());
            }
            if flags & 8 != 0 {
                t.sweep(now);
            }
        }
        assert_eq!(t.counters().entries as usize, t.export(0).entries.len());
    } else {
        let Ok(st) = serde_json::from_slice::<TableState>(rest) else { return };
        let t = small();
        if t.restore(&st, 1_000).is_ok() {
            let again = t.export(1_000);
            let u = small();
            u.restore(&again, 5_000).expect("an exported state restores");
        } else {
            assert_eq!(t.counters().entries, 0, "a refused state left entries behind");
        }
    }
});
