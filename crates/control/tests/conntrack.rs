//! The conntrack commands through the control socket: replies of an empty tracker, its
//! settings, and every bad request refused with a precise error (the tables with entries
//! are tested in `daemon/conntrack.rs`, which can call the shared tracker).

use ferrovs_proto::Request;
use serde_json::json;

mod common;
use common::*;

#[test]
fn conntrack_commands_through_the_socket() {
    let sw = Switch::start("ctctl");
    assert_eq!(
        sw.req(Request::DumpConntrack { zone: None }).unwrap(),
        json!([])
    );
    assert_eq!(
        sw.req(Request::FlushConntrack { zone: Some(3) }).unwrap(),
        json!({"flushed": 0})
    );
    let st = sw.req(Request::ConntrackStats).unwrap();
    assert_eq!(st["entries"], 0);
    assert_eq!(st["max_entries"], 1_000_000);
    assert_eq!(st["shards"], 256);
    assert_eq!(st["timeouts"]["udp-replied"], 120);
    assert_eq!(st["zones"], json!([]));

    let set = |k: &str, v: &str| {
        sw.req(Request::ConfigSet {
            key: k.into(),
            value: v.into(),
        })
    };
    set("ct-zone-limit:9", "10").unwrap();
    set("ct-timeout-generic", "60").unwrap();
    let st = sw.req(Request::ConntrackStats).unwrap();
    assert_eq!(st["zones"], json!([{"entries": 0, "limit": 10, "zone": 9}]));
    assert_eq!(st["timeouts"]["generic"], 60);
    assert_eq!(
        set("ct-zone-limit:65536", "1").unwrap_err(),
        "ct-zone-limit:65536: '65536' is not a conntrack zone (ct-zone-limit:ZONE with ZONE \
         in 0..=65535)"
    );
    assert_eq!(
        set("ct-max-entries", "many").unwrap_err(),
        "ct-max-entries=many: expected an integer in 1..=100000000"
    );

    // Raw lines: a zone out of range, an unknown field.
    let raw = |line: &str| -> serde_json::Value {
        use std::io::{BufRead, BufReader, Write};
        let mut s = std::os::unix::net::UnixStream::connect(sw.dir.join("ferrovs.ctl")).unwrap();
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        let mut out = String::new();
        BufReader::new(s).read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap()
    };
    let r = raw(r#"{"cmd":"dump-conntrack","zone":65536}"#);
    assert_eq!(r["ok"], false);
    let e = r["error"].as_str().unwrap();
    assert!(
        e.starts_with("malformed request: invalid value: integer `65536`, expected u16"),
        "{e}"
    );
    let r = raw(r#"{"cmd":"flush-conntrack","zones":1}"#);
    let e = r["error"].as_str().unwrap();
    assert!(e.contains("unknown field `zones`"), "{e}");
    let r = raw(r#"{"cmd":"conntrack-stats"}"#);
    assert_eq!(r["ok"], true);
}
