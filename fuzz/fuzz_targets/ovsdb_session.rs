//! Any bytes from an OVSDB server, in any chunks, to a session just connected and to one
//! already synced: never a panic; the replica stays consistent with the monitored columns'
//! types after every feed; and the chunking changes nothing (replica, output, events and
//! whether it fails are those of feeding the bytes whole).
#![no_main]
use ferrovs_ovsdb::{Monitor, Session};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

const U1: &str = "11111111-1111-1111-1111-111111111111";
const U2: &str = "22222222-2222-2222-2222-222222222222";

fn session(synced: bool) -> Session {
    let mut s = Session::new(
        "DB",
        Monitor::new()
            .table("Bridge", &["name", "ports", "flag", "ratio"])
            .table("Interface", &["name", "ofport", "options"])
            .table("Missing", &[]),
    );
    s.connected();
    if !synced {
        return s;
    }
    // Request ids are 1 (get_schema) and 2 (monitor_cond).
    let schema = json!({"id": 1, "error": null, "result": {"name": "DB", "tables": {
        "Bridge": {"columns": {
            "name": {"type": "string"},
            "ports": {"type": {"key": {"type": "uuid", "refTable": "Interface"}, "min": 0, "max": "unlimited"}},
            "flag": {"type": "boolean"},
            "ratio": {"type": {"key": "real", "min": 0, "max": 2}},
        }},
        "Interface": {"columns": {
            "name": {"type": "string"},
            "ofport": {"type": {"key": "integer", "min": 0, "max": 1}},
            "options": {"type": {"key": "string", "value": "string", "min": 0, "max": "unlimited"}},
        }},
    }}});
    let initial = json!({"id": 2, "error": null, "result": {
        "Bridge": {U1: {"initial": {"name": "br0", "ports": ["uuid", U2]}}},
        "Interface": {U2: {"initial": {"name": "p", "options": ["map", [["a", "b"]]]}}},
    }});
    s.feed(schema.to_string().as_bytes()).expect("schema");
    s.feed(initial.to_string().as_bytes()).expect("initial contents");
    assert!(s.is_synced());
    s
}

fn drain(s: &mut Session) -> (Vec<u8>, Vec<ferrovs_ovsdb::Event>) {
    let out = s.pending_output().to_vec();
    s.consume_output(out.len());
    (out, std::iter::from_fn(|| s.poll_event()).collect())
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, data)) = data.split_first() else {
        return;
    };
    let synced = seed & 1 == 1;
    let mut whole = session(synced);
    whole.set_max_message(1 << 16);
    let whole_ok = whole.feed(data).is_ok();
    whole.check_consistency().expect("consistent after a whole feed");

    let mut chunked = session(synced);
    chunked.set_max_message(1 << 16);
    let mut rng = u64::from(seed) | 1;
    let mut rest = data;
    let mut chunked_ok = true;
    while !rest.is_empty() {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = (1 + (rng >> 33) as usize % 16).min(rest.len());
        let r = chunked.feed(&rest[..n]);
        chunked.check_consistency().expect("consistent after each chunk");
        rest = &rest[n..];
        if r.is_err() {
            chunked_ok = false;
            break;
        }
    }
    assert_eq!(whole_ok, chunked_ok);
    assert_eq!(whole.replica(), chunked.replica());
    assert_eq!(drain(&mut whole), drain(&mut chunked));
});
