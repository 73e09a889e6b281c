//! Any bytes as frames through the connection tracker, or as a handed-over conntrack state.
//!
//! First byte even: the rest is a sequence of frames (a length byte, a zone/commit byte,
//! then the frame) fed to one `Tracker`; nothing may panic, and the table's entry counter
//! must equal what an export sees. First byte odd: the rest is the JSON of a `TableState`;
//! a restore must not panic, and a state that restores exports into one that restores again.
#![no_main]
use ferrovs_conntrack::{Config, TableState, Tracker};
use libfuzzer_sys::fuzz_target;

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
        let mut rest = rest;
        let mut now = 0u64;
        while rest.len() >= 2 {
            let len = usize::from(rest[0]).min(rest.len() - 2);
            let flags = rest[1];
            let frame = &rest[2..2 + len];
            rest = &rest[2 + len..];
            now += u64::from(flags >> 4) * 1000;
            let r = t.execute(frame, u16::from(flags & 3), flags & 4 != 0, now);
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
