//! The session driven by hand-written server messages: start-up, update2 and update
//! notifications, transactions, echo, reconnection, and hostile input.

use serde_json::{json, Value};

use crate::*;

const DB: &str = "Open_vSwitch";
const U1: &str = "11111111-1111-1111-1111-111111111111";
const U2: &str = "22222222-2222-2222-2222-222222222222";
const U3: &str = "33333333-3333-3333-3333-333333333333";

fn u(s: &str) -> Uuid {
    s.parse().unwrap()
}

fn schema() -> Value {
    json!({
        "name": DB, "version": "8.3.1",
        "tables": {
            "Bridge": {"columns": {
                "name": {"type": "string"},
                "ports": {"type": {"key": {"type": "uuid", "refTable": "Port"}, "min": 0, "max": "unlimited"}},
                "datapath_type": {"type": "string"},
            }},
            "Interface": {"columns": {
                "name": {"type": "string"},
                "ofport": {"type": {"key": "integer", "min": 0, "max": 1}},
                "options": {"type": {"key": "string", "value": "string", "min": 0, "max": "unlimited"}},
                "mtu": {"type": {"key": "integer", "min": 0, "max": 1}},
            }},
            "Other": {"columns": {"x": {"type": "integer"}}},
        }
    })
}

/// Takes everything the session wants to send, as parsed messages.
fn drain(s: &mut Session) -> Vec<Value> {
    let out = s.pending_output().to_vec();
    s.consume_output(out.len());
    serde_json::Deserializer::from_slice(&out)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .collect()
}

fn events(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn one(s: &mut Session) -> Event {
    let mut e = events(s);
    assert_eq!(e.len(), 1, "{e:?}");
    e.remove(0)
}

fn feed(s: &mut Session, v: Value) {
    s.feed(v.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{v}: {e}"));
}

fn monitor() -> Monitor {
    Monitor::new()
        .table("Bridge", &["name", "ports"])
        .table("Interface", &["name", "ofport", "options"])
        .table("Missing", &[])
}

fn initial() -> Value {
    json!({
        "Bridge": {U1: {"initial": {"name": "br0", "ports": ["set", [["uuid", U2], ["uuid", U3]]]}}},
        "Interface": {
            U2: {"initial": {"name": "vhu0", "ofport": 1, "options": ["map", [["vhost-server-path", "/tmp/x"]]]}},
            U3: {"initial": {"name": "vhu1"}},
        }
    })
}

/// A session through get_schema and monitor_cond, synced with `initial()`.
fn synced() -> Session {
    let mut s = Session::new(DB, monitor());
    assert!(!s.awaiting_reply());
    s.connected();
    let req = drain(&mut s);
    assert_eq!(req.len(), 1);
    assert_eq!(req[0]["method"], "get_schema");
    assert_eq!(req[0]["params"], json!([DB]));
    feed(
        &mut s,
        json!({"id": req[0]["id"], "result": schema(), "error": null}),
    );
    let req = drain(&mut s);
    assert_eq!(req[0]["method"], "monitor_cond");
    assert_eq!(
        req[0]["params"],
        json!([DB, MONITOR_ID, {
            "Bridge": [{"columns": ["name", "ports"]}],
            "Interface": [{"columns": ["name", "ofport", "options"]}],
        }])
    );
    assert!(s.awaiting_reply());
    feed(
        &mut s,
        json!({"id": req[0]["id"], "result": initial(), "error": null}),
    );
    assert_eq!(events(&mut s), vec![Event::Synced]);
    assert!(s.is_synced() && s.uses_monitor_cond() && !s.awaiting_reply());
    s.check_consistency().unwrap();
    s
}

fn iface(s: &Session, uuid: &str) -> Row {
    s.replica().row("Interface", &u(uuid)).unwrap().clone()
}

fn changed(s: &mut Session) -> Changes {
    match events(s).as_slice() {
        [Event::Changed(c)] => c.clone(),
        e => panic!("expected one Changed, got {e:?}"),
    }
}

fn update2(s: &mut Session, updates: Value) -> Changes {
    feed(
        s,
        json!({"method": "update2", "params": [MONITOR_ID, updates], "id": null}),
    );
    s.check_consistency().unwrap();
    changed(s)
}

#[test]
fn initial_contents_with_defaults() {
    let s = synced();
    let r = s.replica();
    assert_eq!(r.len("Bridge"), 1);
    let br = r.row("Bridge", &u(U1)).unwrap();
    assert_eq!(br["name"].as_str(), Some("br0"));
    assert_eq!(br["ports"].uuids(), vec![u(U2), u(U3)]);
    // Columns left out of an initial row hold their defaults.
    let vhu1 = iface(&s, U3);
    assert!(vhu1["ofport"].is_empty());
    assert_eq!(vhu1["options"], Datum::empty_map());
    assert_eq!(r.rows("Interface").count(), 2);
    assert_eq!(r.rows("Missing").count(), 0);
    assert_eq!(r.rows("Nope").count(), 0);
    assert_eq!(r.tables().collect::<Vec<_>>(), vec!["Bridge", "Interface"]);
}

#[test]
fn update2_map_diffs() {
    let mut s = synced();
    // Add a key, change a key.
    let c = update2(
        &mut s,
        json!({"Interface": {U2: {"modify": {"options": ["map", [["n_rxq", "2"], ["vhost-server-path", "/tmp/y"]]]}}}}),
    );
    assert_eq!(c.modified, vec![("Interface".to_string(), u(U2))]);
    assert!(c.inserted.is_empty() && c.deleted.is_empty());
    assert_eq!(
        c.old[&("Interface".to_string(), u(U2))]["options"]
            .str_map()
            .get("vhost-server-path"),
        Some(&"/tmp/x")
    );
    assert_eq!(
        iface(&s, U2)["options"],
        Datum::strings_map([("n_rxq", "2"), ("vhost-server-path", "/tmp/y")])
    );
    // Remove a key: the diff names it with its current value.
    update2(
        &mut s,
        json!({"Interface": {U2: {"modify": {"options": ["map", [["vhost-server-path", "/tmp/y"]]]}}}}),
    );
    assert_eq!(
        iface(&s, U2)["options"],
        Datum::strings_map([("n_rxq", "2")])
    );
    update2(
        &mut s,
        json!({"Interface": {U2: {"modify": {"options": ["map", [["n_rxq", "2"]]]}}}}),
    );
    assert_eq!(iface(&s, U2)["options"], Datum::empty_map());
}

#[test]
fn update2_set_toggles_and_scalars() {
    let mut s = synced();
    let u4 = "44444444-4444-4444-4444-444444444444";
    // One element toggled (a bare atom), then two at once.
    update2(
        &mut s,
        json!({"Bridge": {U1: {"modify": {"ports": ["uuid", U2]}}}}),
    );
    assert_eq!(
        s.replica().row("Bridge", &u(U1)).unwrap()["ports"].uuids(),
        vec![u(U3)]
    );
    update2(
        &mut s,
        json!({"Bridge": {U1: {"modify": {"ports": ["set", [["uuid", U3], ["uuid", u4]]]}}}}),
    );
    assert_eq!(
        s.replica().row("Bridge", &u(U1)).unwrap()["ports"].uuids(),
        vec![u(u4)]
    );
    // An optional scalar: the new value, then cleared; a scalar replaced.
    update2(
        &mut s,
        json!({"Interface": {U2: {"modify": {"ofport": 5}}}}),
    );
    assert_eq!(iface(&s, U2)["ofport"].as_i64(), Some(5));
    update2(
        &mut s,
        json!({"Interface": {U2: {"modify": {"ofport": ["set", []]}}}}),
    );
    assert!(iface(&s, U2)["ofport"].is_empty());
    update2(
        &mut s,
        json!({"Interface": {U3: {"modify": {"ofport": 7, "name": "vhu9"}}}}),
    );
    assert_eq!(iface(&s, U3)["ofport"].as_i64(), Some(7));
    assert_eq!(iface(&s, U3)["name"].as_str(), Some("vhu9"));
}

#[test]
fn update2_insert_and_delete() {
    let mut s = synced();
    let u4 = "44444444-4444-4444-4444-444444444444";
    let c = update2(
        &mut s,
        json!({
            "Interface": {u4: {"insert": {"name": "vhu2", "ofport": 3}}, U3: {"delete": null}},
            "Bridge": {U1: {"modify": {"ports": ["set", [["uuid", U3], ["uuid", u4]]]}}}
        }),
    );
    assert_eq!(c.inserted, vec![("Interface".to_string(), u(u4))]);
    assert_eq!(c.deleted, vec![("Interface".to_string(), u(U3))]);
    assert_eq!(c.modified, vec![("Bridge".to_string(), u(U1))]);
    assert_eq!(
        c.old[&("Interface".to_string(), u(U3))]["name"].as_str(),
        Some("vhu1")
    );
    assert!(c.touches("Bridge") && !c.touches("Other"));
    assert!(s.replica().row("Interface", &u(U3)).is_none());
    assert_eq!(iface(&s, u4)["ofport"].as_i64(), Some(3));
    assert_eq!(iface(&s, u4)["options"], Datum::empty_map());
}

#[test]
fn plain_monitor_fallback() {
    let mut s = Session::new(DB, monitor());
    s.connected();
    let req = drain(&mut s);
    feed(
        &mut s,
        json!({"id": req[0]["id"], "result": schema(), "error": null}),
    );
    let req = drain(&mut s);
    feed(
        &mut s,
        json!({"id": req[0]["id"], "result": null, "error": {"error": "unknown method"}}),
    );
    let req = drain(&mut s);
    assert_eq!(req[0]["method"], "monitor");
    assert_eq!(
        req[0]["params"][2]["Bridge"],
        json!({"columns": ["name", "ports"]})
    );
    assert!(events(&mut s).is_empty());
    feed(
        &mut s,
        json!({"id": req[0]["id"], "error": null, "result": {
            "Interface": {U2: {"new": {"name": "vhu0", "ofport": 1, "options": ["map", [["a", "1"]]]}}}
        }}),
    );
    assert_eq!(events(&mut s), vec![Event::Synced]);
    assert!(!s.uses_monitor_cond());
    let upd = |s: &mut Session, v: Value| {
        feed(
            s,
            json!({"method": "update", "params": [MONITOR_ID, v], "id": null}),
        );
        s.check_consistency().unwrap();
        changed(s)
    };
    // modify: old has the changed columns' old values; new holds full values.
    let c = upd(
        &mut s,
        json!({"Interface": {U2: {"old": {"options": ["map", [["a", "1"]]]}, "new": {"name": "vhu0", "ofport": 1, "options": ["map", [["b", "2"]]]}}}}),
    );
    assert_eq!(c.modified.len(), 1);
    assert_eq!(iface(&s, U2)["options"], Datum::strings_map([("b", "2")]));
    let c = upd(
        &mut s,
        json!({"Interface": {U3: {"new": {"name": "vhu1"}}}}),
    );
    assert_eq!(c.inserted.len(), 1);
    let c = upd(
        &mut s,
        json!({"Interface": {U2: {"old": {"name": "vhu0"}}}}),
    );
    assert_eq!(c.deleted.len(), 1);
    assert_eq!(s.replica().len("Interface"), 1);
    // update2 on a plain monitor is a violation.
    let e = s
        .feed(
            json!({"method": "update2", "params": [MONITOR_ID, {}], "id": null})
                .to_string()
                .as_bytes(),
        )
        .unwrap_err();
    assert!(
        matches!(e, SessionError::UnexpectedNotification { .. }),
        "{e}"
    );
}

#[test]
fn monitor_refused_is_a_server_error() {
    let mut s = Session::new(DB, monitor());
    s.connected();
    let req = drain(&mut s);
    feed(
        &mut s,
        json!({"id": req[0]["id"], "result": null, "error": {"error": "unknown database", "details": "no db"}}),
    );
    assert_eq!(
        events(&mut s),
        vec![Event::ServerError {
            id: req[0]["id"].as_u64().unwrap(),
            error: "unknown database: no db".into()
        }]
    );
    assert!(!s.is_synced());
}

#[test]
fn transactions() {
    let mut s = synced();
    let ops = vec![
        ops::update(
            "Interface",
            u(U2),
            &Row::from([("ofport".into(), Datum::integer(5))]),
        ),
        ops::comment("ferrovs"),
    ];
    let id = s.transact(ops.clone());
    let req = drain(&mut s);
    assert_eq!(req[0]["method"], "transact");
    assert_eq!(req[0]["id"], id);
    assert_eq!(req[0]["params"], json!([DB, ops[0], ops[1]]));
    assert!(s.awaiting_reply());
    feed(
        &mut s,
        json!({"id": id, "result": [{"count": 1}, {}], "error": null}),
    );
    assert_eq!(
        events(&mut s),
        vec![Event::TxnReply {
            id,
            result: Ok(vec![json!({"count": 1}), json!({})])
        }]
    );

    // A failed wait: retryable, with its index.
    let id = s.transact(vec![json!({"op": "wait"}), json!({"op": "update"})]);
    feed(
        &mut s,
        json!({"id": id, "error": null, "result": [{"error": "timed out", "details": "\"wait\" timed out"}, null]}),
    );
    let Event::TxnReply {
        id: got,
        result: Err(e),
    } = one(&mut s)
    else {
        panic!()
    };
    assert_eq!(got, id);
    assert_eq!(
        (e.error.as_str(), e.op_index, e.retryable()),
        ("timed out", Some(0), true)
    );
    assert_eq!(e.to_string(), "operation 0: timed out: \"wait\" timed out");

    // A commit failure: one more result than operations; not retryable.
    let id = s.transact(vec![json!({"op": "insert"})]);
    feed(
        &mut s,
        json!({"id": id, "error": null, "result": [{"uuid": ["uuid", U1]}, {"error": "constraint violation", "details": "dup"}]}),
    );
    let Event::TxnReply { result: Err(e), .. } = one(&mut s) else {
        panic!()
    };
    assert_eq!((e.op_index, e.retryable()), (None, false));

    // The request refused as a whole.
    let id = s.transact(vec![]);
    feed(
        &mut s,
        json!({"id": id, "result": null, "error": "unknown database"}),
    );
    let Event::TxnReply { result: Err(e), .. } = one(&mut s) else {
        panic!()
    };
    assert_eq!(e.error, "unknown database");
    drain(&mut s);

    // Lost with the connection: failed at the reconnection, retryable.
    let id = s.transact(vec![ops::comment("x")]);
    s.disconnected();
    assert!(s.pending_output().is_empty());
    let Event::TxnReply {
        id: got,
        result: Err(e),
    } = one(&mut s)
    else {
        panic!()
    };
    assert_eq!(
        (got, e.error.as_str(), e.retryable()),
        (id, CONNECTION_LOST, true)
    );
    // The replica survives the disconnection, not the reconnection.
    assert_eq!(s.replica().len("Interface"), 2);
    s.connected();
    assert!(s.replica().is_empty());
    assert_eq!(drain(&mut s)[0]["method"], "get_schema");
}

#[test]
fn transact_reply_shapes_are_checked() {
    for result in [json!({}), json!([]), json!([5]), json!([{"error": 5}])] {
        let mut s = synced();
        let id = s.transact(vec![ops::comment("x")]);
        let e = s
            .feed(
                json!({"id": id, "result": result, "error": null})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap_err();
        assert!(matches!(e, SessionError::BadReply { .. }), "{result}: {e}");
    }
}

#[test]
fn echo_both_ways() {
    let mut s = synced();
    feed(
        &mut s,
        json!({"method": "echo", "params": ["x", 1], "id": "echo-7"}),
    );
    assert_eq!(
        drain(&mut s),
        vec![json!({"id": "echo-7", "result": ["x", 1], "error": null})]
    );
    feed(&mut s, json!({"method": "steal", "params": [], "id": [1]}));
    assert_eq!(drain(&mut s)[0]["error"], "unknown method");
    let id = s.echo();
    assert!(s.awaiting_reply());
    let req = drain(&mut s);
    assert_eq!(req, vec![json!({"method": "echo", "params": [], "id": id})]);
    feed(&mut s, json!({"id": id, "result": [], "error": null}));
    assert!(!s.awaiting_reply());
    assert!(events(&mut s).is_empty());
    // Unknown notifications are ignored.
    feed(
        &mut s,
        json!({"method": "locked", "params": ["l"], "id": null}),
    );
    feed(&mut s, json!({"method": "locked", "params": ["l"]}));
}

#[test]
fn output_is_consumed_partially() {
    let mut s = Session::new(DB, monitor());
    s.connected();
    let all = s.pending_output().to_vec();
    s.consume_output(3);
    assert_eq!(s.pending_output(), &all[3..]);
    s.consume_output(usize::MAX);
    assert!(s.pending_output().is_empty());
}

/// Feeds `bytes` to a synced session; must fail, leave the replica as it was, never panic.
fn hostile(bytes: &[u8]) -> SessionError {
    let mut s = synced();
    let before = s.replica().clone();
    let e = s.feed(bytes).expect_err(&String::from_utf8_lossy(bytes));
    assert_eq!(s.replica(), &before, "{e}");
    s.check_consistency().unwrap();
    e
}

fn upd2(v: Value) -> Vec<u8> {
    json!({"method": "update2", "params": [MONITOR_ID, v], "id": null})
        .to_string()
        .into_bytes()
}

#[test]
fn hostile_messages() {
    use SessionError as E;
    let m = |e: &SessionError, ok: bool| assert!(ok, "{e:?}");
    let e = hostile(b"[1]");
    m(&e, matches!(e, E::Framing(_)));
    let e = hostile(b"{\"id\": 1, \"result\": tru}");
    m(&e, matches!(e, E::Json(_)));
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    let e = hostile(deep.as_bytes());
    m(&e, matches!(e, E::Json(_)));
    let e = hostile(b"{\"foo\": 1}");
    m(&e, matches!(e, E::BadMessage(_)));
    let e = hostile(b"{\"method\": 5, \"params\": []}");
    m(&e, matches!(e, E::BadMessage(_)));
    let e = hostile(b"{\"method\": \"update2\", \"params\": {}}");
    m(&e, matches!(e, E::BadMessage(_)));
    let e = hostile(b"{\"method\": \"update2\", \"params\": [\"ferrovs\"]}");
    m(&e, matches!(e, E::BadMessage(_)));
    let e = hostile(b"{\"id\": 999, \"result\": null, \"error\": null}");
    m(&e, matches!(e, E::UnknownReply(_)));
    let e = hostile(b"{\"id\": \"x\", \"result\": null, \"error\": null}");
    m(&e, matches!(e, E::UnknownReply(_)));
    let e = hostile(b"{\"method\": \"update3\", \"params\": [\"ferrovs\", null, {}]}");
    m(&e, matches!(e, E::UnexpectedNotification { .. }));
    let e = hostile(
        &json!({"method": "update2", "params": ["other", {}], "id": null})
            .to_string()
            .into_bytes(),
    );
    m(&e, matches!(e, E::UnexpectedNotification { .. }));
    let e = hostile(&upd2(json!([])));
    m(&e, matches!(e, E::BadUpdates(_)));
    let e = hostile(&upd2(json!({"Bridge": 5})));
    m(&e, matches!(e, E::BadUpdates(_)));
    let e = hostile(&upd2(json!({"Other": {}})));
    m(&e, matches!(e, E::UnmonitoredTable(_)));
    let e = hostile(&upd2(json!({"Interface": {U2: {"modify": {"mtu": 1500}}}})));
    m(&e, matches!(e, E::UnmonitoredColumn { .. }));
    let e = hostile(&upd2(json!({"Interface": {"nope": {"delete": null}}})));
    m(&e, matches!(e, E::BadRowUpdate { .. }));
    let e = hostile(&upd2(
        json!({"Interface": {U2: {"delete": null, "insert": {}}}}),
    ));
    m(&e, matches!(e, E::BadRowUpdate { .. }));
    let e = hostile(&upd2(json!({"Interface": {U2: {"upsert": {}}}})));
    m(&e, matches!(e, E::BadRowUpdate { .. }));
    let e = hostile(&upd2(json!({"Interface": {U2: 5}})));
    m(&e, matches!(e, E::BadRowUpdate { .. }));
    let e = hostile(&upd2(json!({"Interface": {U2: {"modify": 5}}})));
    m(&e, matches!(e, E::BadRowUpdate { .. }));
    let e = hostile(&upd2(json!({"Interface": {U2: {"insert": {"name": "x"}}}})));
    m(&e, matches!(e, E::RowExists { .. }));
    let u9 = "99999999-9999-9999-9999-999999999999";
    let e = hostile(&upd2(json!({"Interface": {u9: {"delete": null}}})));
    m(&e, matches!(e, E::NoSuchRow { op: "delete", .. }));
    let e = hostile(&upd2(json!({"Interface": {u9: {"modify": {}}}})));
    m(&e, matches!(e, E::NoSuchRow { op: "modify", .. }));
    // Wrong types, wrong kinds, sizes beyond the column's.
    for (col, v) in [
        ("name", json!(5)),
        ("name", json!(["set", []])),
        ("name", json!(["set", ["a", "b"]])),
        ("ofport", json!("1")),
        ("ofport", json!(1.5)),
        ("ofport", json!(["set", [1, 2]])),
        ("options", json!(["set", []])),
        ("options", json!("a")),
        ("options", json!(["map", [["a", 1]]])),
        ("options", json!(["map", [["a", "1"], ["a", "2"]]])),
    ] {
        let e = hostile(&upd2(json!({"Interface": {U2: {"modify": {col: v}}}})));
        m(&e, matches!(e, E::BadDatum { .. }));
    }
    let e = hostile(&upd2(
        json!({"Bridge": {U1: {"modify": {"ports": ["uuid", "x"]}}}}),
    ));
    m(&e, matches!(e, E::BadDatum { .. }));
    // A valid row beside a bad one: nothing applied.
    let e = hostile(&upd2(json!({
        "Bridge": {U1: {"modify": {"name": "br9"}}},
        "Interface": {U2: {"modify": {"ofport": "x"}}},
    })));
    m(&e, matches!(e, E::BadDatum { .. }));
}

#[test]
fn hostile_start_up() {
    // A schema that cannot be read.
    let mut s = Session::new(DB, monitor());
    s.connected();
    let req = drain(&mut s);
    let e = s
        .feed(
            json!({"id": req[0]["id"], "result": {"tables": 5}, "error": null})
                .to_string()
                .as_bytes(),
        )
        .unwrap_err();
    assert!(matches!(e, SessionError::BadSchema { .. }), "{e}");
    // An update before the monitor's reply; a delete in the initial contents.
    let mut s = Session::new(DB, monitor());
    s.connected();
    let req = drain(&mut s);
    feed(
        &mut s,
        json!({"id": req[0]["id"], "result": schema(), "error": null}),
    );
    let req = drain(&mut s);
    let e = s.feed(&upd2(json!({}))).unwrap_err();
    assert!(
        matches!(e, SessionError::UnexpectedNotification { .. }),
        "{e}"
    );
    let e = s
        .feed(json!({"id": req[0]["id"], "result": {"Interface": {U2: {"delete": null}}}, "error": null}).to_string().as_bytes())
        .unwrap_err();
    assert!(matches!(e, SessionError::BadRowUpdate { .. }), "{e}");
    assert!(!s.is_synced());
}

#[test]
fn message_size_cap() {
    let mut s = synced();
    s.set_max_message(1024);
    let big = upd2(json!({"Interface": {U2: {"modify": {"name": "x".repeat(2000)}}}}));
    assert!(matches!(
        s.feed(&big).unwrap_err(),
        SessionError::Framing(_)
    ));
}

#[test]
fn server_that_never_reads() {
    let mut s = synced();
    s.set_max_message(4096);
    let echo = json!({"method": "echo", "params": ["x".repeat(1000)], "id": 1}).to_string();
    let mut n = 0;
    let e = loop {
        match s.feed(echo.as_bytes()) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 10, "no backlog limit");
    };
    assert!(matches!(e, SessionError::OutputBacklog { .. }), "{e}");
    // Written out, the replies make room again.
    let all = s.pending_output().len();
    s.consume_output(all);
    s.feed(echo.as_bytes()).unwrap();
}

/// A deterministic pseudo-random generator for the chunking tests.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

#[test]
fn any_chunking_gives_the_same_replica() {
    let mut stream = Vec::new();
    let u4 = "44444444-4444-4444-4444-444444444444";
    for v in [
        json!({"Interface": {U2: {"modify": {"options": ["map", [["n_rxq", "2"], ["p", "{\"]}"]]]}}}}),
        json!({"Interface": {u4: {"insert": {"name": "é\\\"x"}}}}),
        json!({"Bridge": {U1: {"modify": {"ports": ["set", [["uuid", U2], ["uuid", u4]]]}}}}),
        json!({"Interface": {U3: {"delete": null}}}),
    ] {
        stream.extend(upd2(v));
        stream.extend(b" \n");
    }
    stream.extend(
        json!({"method": "echo", "params": [], "id": 0})
            .to_string()
            .into_bytes(),
    );
    let mut whole = synced();
    whole.feed(&stream).unwrap();
    let expect = whole.replica().clone();
    let expect_out = drain(&mut whole);
    assert_eq!(events(&mut whole).len(), 4);
    // Every single split point, then byte by byte, then random chunks.
    let mut splits: Vec<Vec<usize>> = (0..=stream.len()).map(|i| vec![i]).collect();
    splits.push((0..=stream.len()).collect());
    let mut rng = Lcg(17);
    for _ in 0..200 {
        let mut cuts = vec![0];
        while *cuts.last().unwrap() < stream.len() {
            let next = cuts.last().unwrap() + 1 + rng.next(64);
            cuts.push(next.min(stream.len()));
        }
        splits.push(cuts);
    }
    for cuts in splits {
        let mut s = synced();
        let mut prev = 0;
        for &c in cuts.iter().chain([stream.len()].iter()) {
            s.feed(&stream[prev..c]).unwrap();
            prev = c;
        }
        assert_eq!(s.replica(), &expect, "cuts {cuts:?}");
        assert_eq!(drain(&mut s), expect_out);
        assert_eq!(events(&mut s).len(), 4);
        s.check_consistency().unwrap();
    }
}

/// A synchronised session exported in the middle of everything (a transaction and an echo
/// out, half an update2 read, a request half written) and restored from its JSON goes on
/// exactly where it was: same replica, same output to the byte, the rest of the update
/// completes it, the transaction's reply finds its id, the next request gets the next id.
#[test]
fn a_session_hands_over_mid_message() {
    let mut s = synced();
    let txn = s.transact(vec![json!({"op": "comment", "comment": "x"})]);
    let echo = s.echo();
    let out = s.pending_output().to_vec();
    s.consume_output(7);
    let note = json!({"method": "update2", "params": [MONITOR_ID, {
        "Interface": {U3: {"modify": {"ofport": 5}}}
    }], "id": null})
    .to_string();
    let (a, b) = note.as_bytes().split_at(20);
    s.feed(a).unwrap();
    assert!(events(&mut s).is_empty());
    let st = s.export().expect("synced");
    assert_eq!(st.input, a);
    assert_eq!(st.output, &out[7..]);
    assert_eq!(
        st.pending,
        vec![
            PendingState::Transact { id: txn, n_ops: 1 },
            PendingState::Echo { id: echo }
        ]
    );
    let text = serde_json::to_string(&st).unwrap();
    let back: SessionState = serde_json::from_str(&text).unwrap();
    assert_eq!(back, st);
    let mut r = Session::restore(DB, monitor(), &back).unwrap();
    assert!(r.is_synced() && r.uses_monitor_cond() && r.awaiting_reply());
    assert_eq!(r.replica(), s.replica());
    assert_eq!(r.pending_output(), &out[7..]);
    assert_eq!(r.export().unwrap(), st);
    r.feed(b).unwrap();
    let c = changed(&mut r);
    assert_eq!(c.modified, vec![("Interface".to_string(), u(U3))]);
    assert_eq!(iface(&r, U3)["ofport"], Datum::integer(5));
    feed(&mut r, json!({"id": txn, "result": [{}], "error": null}));
    assert!(matches!(one(&mut r), Event::TxnReply { id, result: Ok(_) } if id == txn));
    feed(&mut r, json!({"id": echo, "result": [], "error": null}));
    assert!(events(&mut r).is_empty() && !r.awaiting_reply());
    assert_eq!(r.echo(), echo + 1);
    r.check_consistency().unwrap();
    // A plain-monitor session keeps its kind of notification.
    let mut st2 = st.clone();
    st2.cond = false;
    st2.input.clear();
    let r = Session::restore(DB, monitor(), &st2).unwrap();
    assert!(r.is_synced() && !r.uses_monitor_cond());
}

/// A session handed over by a version that monitored fewer columns (or other ones) goes on
/// on the same connection: restored with the columns the server monitors, it cancels that
/// monitor and makes this version's under the same id, ignores the old monitor's
/// notifications until the reply, and the reply replaces the replica (`Synced`, as after a
/// new connection). Transactions in flight keep their ids.
#[test]
fn a_session_from_a_version_with_other_columns_monitors_again() {
    let mut old = synced();
    let txn = old.transact(vec![json!({"op": "comment", "comment": "x"})]);
    drain(&mut old);
    let mut st = old.export().unwrap();
    // The old version read no Interface options.
    st.monitored
        .get_mut("Interface")
        .unwrap()
        .retain(|c| c != "options");
    for u in [U2, U3] {
        let row = st.replica["Interface"][u]["initial"]
            .as_object_mut()
            .unwrap();
        row.remove("options");
    }
    let mut r = Session::restore(DB, monitor(), &st).unwrap();
    assert!(!r.is_synced() && r.awaiting_reply());
    assert_eq!(iface(&r, U2).get("options"), None);
    let req = drain(&mut r);
    assert_eq!(req.len(), 2, "{req:?}");
    assert_eq!(req[0]["method"], "monitor_cancel");
    assert_eq!(req[0]["params"], json!([MONITOR_ID]));
    assert_eq!(req[1]["method"], "monitor_cond");
    assert_eq!(
        req[1]["params"],
        json!([DB, MONITOR_ID, {
            "Bridge": [{"columns": ["name", "ports"]}],
            "Interface": [{"columns": ["name", "ofport", "options"]}],
        }])
    );
    assert!(req[0]["id"].as_u64().unwrap() > txn);
    // The old monitor's notification, sent before the server handled the cancel.
    feed(
        &mut r,
        json!({"method": "update2", "params": [MONITOR_ID, {
            "Interface": {U3: {"modify": {"ofport": 9}}}
        }], "id": null}),
    );
    assert!(events(&mut r).is_empty());
    feed(
        &mut r,
        json!({"id": req[0]["id"], "result": {}, "error": null}),
    );
    feed(&mut r, json!({"id": txn, "result": [{}], "error": null}));
    assert!(matches!(one(&mut r), Event::TxnReply { id, result: Ok(_) } if id == txn));
    feed(
        &mut r,
        json!({"id": req[1]["id"], "result": initial(), "error": null}),
    );
    assert_eq!(events(&mut r), vec![Event::Synced]);
    assert!(r.is_synced() && r.uses_monitor_cond() && !r.awaiting_reply());
    assert_eq!(r.replica(), synced().replica());
    r.check_consistency().unwrap();
    // Now it is this version's session: handed over again, it restores as is.
    let again = r.export().unwrap();
    assert_eq!(again.monitored, synced().export().unwrap().monitored);
    assert!(Session::restore(DB, monitor(), &again).unwrap().is_synced());
    // Notifications of the new monitor apply.
    feed(
        &mut r,
        json!({"method": "update2", "params": [MONITOR_ID, {
            "Interface": {U3: {"modify": {"ofport": 9}}}
        }], "id": null}),
    );
    assert_eq!(
        changed(&mut r).modified,
        vec![("Interface".to_string(), u(U3))]
    );
}

/// Only a synchronised session is exported.
#[test]
fn only_a_synced_session_is_exported() {
    let mut s = Session::new(DB, monitor());
    assert!(s.export().is_none());
    s.connected();
    assert!(s.export().is_none());
    assert!(synced().export().is_some());
}

/// Every corrupt state is refused with its own error.
#[test]
fn a_corrupt_session_state_is_refused() {
    let good = synced().export().unwrap();
    let refuse = |f: &dyn Fn(&mut SessionState), m: &dyn Fn(&RestoreError) -> bool| {
        let mut st = good.clone();
        f(&mut st);
        let e = Session::restore(DB, monitor(), &st).unwrap_err();
        assert!(m(&e), "{e:?}");
    };
    refuse(&|s| s.db = "OVN_Northbound".into(), &|e| {
        matches!(e, RestoreError::Database { .. })
    });
    refuse(&|s| s.schema = json!({"name": 7}), &|e| {
        matches!(e, RestoreError::Schema(_))
    });
    refuse(
        &|s| {
            s.monitored
                .get_mut("Bridge")
                .unwrap()
                .push("no_such_column".into());
        },
        &|e| matches!(e, RestoreError::Monitor(m) if m.contains("Bridge.no_such_column")),
    );
    refuse(
        &|s| s.replica["Interface"][U3]["initial"]["ofport"] = json!("five"),
        &|e| matches!(e, RestoreError::Replica(SessionError::BadDatum { .. })),
    );
    refuse(&|s| s.replica["Other"] = json!({}), &|e| {
        matches!(e, RestoreError::Replica(SessionError::UnmonitoredTable(_)))
    });
    refuse(
        &|s| s.replica["Bridge"][U1] = json!({"modify": {"name": "x"}}),
        &|e| matches!(e, RestoreError::Replica(SessionError::BadRowUpdate { .. })),
    );
    refuse(
        &|s| s.pending = vec![PendingState::Echo { id: 1 }, PendingState::Echo { id: 1 }],
        &|e| matches!(e, RestoreError::PendingId { id: 1, .. }),
    );
    refuse(
        &|s| s.pending = vec![PendingState::Echo { id: s.next_id }],
        &|e| matches!(e, RestoreError::PendingId { .. }),
    );
    refuse(
        &|s| s.pending = vec![PendingState::Echo { id: 0 }; MAX_PENDING + 1],
        &|e| matches!(e, RestoreError::TooManyPending(_)),
    );
    refuse(&|s| s.output = vec![b' '; MAX_MESSAGE + 1], &|e| {
        matches!(e, RestoreError::TooLarge { what: "output", .. })
    });
    refuse(&|s| s.input = b"[1]".to_vec(), &|e| {
        matches!(e, RestoreError::Input(SessionError::Framing(_)))
    });
    // A reply to a request that is not in flight, whole in the input.
    refuse(
        &|s| s.input = br#"{"id": 1, "result": [], "error": null}"#.to_vec(),
        &|e| matches!(e, RestoreError::Input(SessionError::UnknownReply(_))),
    );
    // Bytes that are not hex.
    let mut v = serde_json::to_value(&good).unwrap();
    v["input"] = json!("7g");
    assert!(serde_json::from_value::<SessionState>(v).is_err());
}
