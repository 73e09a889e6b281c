//! Hot upgrade with real processes: `ferrovs upgrade` under traffic in both socket modes and
//! with multiqueue, a new daemon failing on purpose at each step, vhost-user messages racing
//! the handover, 100 upgrades in a row without leaks, and the versioned state.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferrovs_control::upgrade::{Channel, Msg, State, MIN_SCHEMA, SCHEMA};
use ferrovs_e2e::*;
use serde_json::Value;

fn taskset() -> &'static Path {
    Path::new("/usr/bin/taskset")
}

/// No `ferrovsd --takeover` of this run directory is left running.
fn no_takeover_left(dir: &Path) -> bool {
    let pat = format!("{} --takeover", dir.display());
    !Command::new("pgrep")
        .args(["-f", &pat])
        .output()
        .unwrap()
        .stdout
        .iter()
        .any(|b| b.is_ascii_digit())
}

fn gen_args<'a>(core: &'a str, gen: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["-c", core, gen];
    a.extend_from_slice(rest);
    a
}

fn port<'a>(show: &'a Value, name: &str) -> &'a Value {
    show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
}

#[test]
fn upgrades_under_traffic_in_both_socket_modes_with_multiqueue() {
    let dir = run_dir("upgrade");
    let (pmd, core) = cores();
    let core = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let g2 = dir.join("g2.sock").display().to_string();
    // vm1: ferrovs listens; g2: the guest listens and ferrovs connects (client mode).
    let cfg = dir.join("cfg.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"version":1,"bridges":[{{"name":"br0","ports":[
            {{"name":"vm1","type":"vhost-user","path":"{vm1}","queues":2}},
            {{"name":"g2","type":"vhost-user-client","path":"{g2}","queues":2}}]}}]}}"#
        ),
    )
    .unwrap();
    let sink = Proc::spawn(
        "sink",
        &dir,
        taskset(),
        &gen_args(
            &core,
            &gen,
            &[
                "--socket",
                &g2,
                "--server",
                "--queues",
                "2",
                "--ring",
                "1024",
                "--src",
                "02:00:00:00:00:02",
                "--quiet",
                "--duration",
                "60",
                "--idle",
                "3",
                "rxonly",
            ],
        ),
    );
    std::thread::sleep(Duration::from_millis(200));
    let cfgs = cfg.display().to_string();
    let _sw = start_switch(&dir, pmd, &["--config", &cfgs]);
    let _stop = StopCurrent(dir.clone());
    wait_until("g2 connected", 10, || {
        port(&cli_json(&dir, &["show"]), "g2")["state"] == "connected"
    });
    let tx = Proc::spawn(
        "tx",
        &dir,
        taskset(),
        &gen_args(
            &core,
            &gen,
            &[
                "--socket",
                &vm1,
                "--queues",
                "2",
                "--ring",
                "1024",
                "--rate",
                "50000",
                "--count",
                "200000",
                "--flows",
                "8",
                "--quiet",
                "--duration",
                "60",
                "txonly",
            ],
        ),
    );
    wait_until("traffic", 10, || {
        cli_json(&dir, &["port-stats", "g2"])[0]["tx"]["packets"]
            .as_u64()
            .unwrap()
            > 10_000
    });
    let mut pids = vec![daemon_pid(&dir)];
    for _ in 0..5 {
        let r = upgrade(&dir, &[]).expect("upgrade");
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["ports"], 2, "{r}");
        assert_eq!(r["queues"], 8, "{r}");
        for k in ["prepare_ms", "freeze_us", "downtime_us"] {
            assert!(r[k].as_f64().is_some(), "{k} reported: {r}");
        }
        let pid = daemon_pid(&dir);
        assert_eq!(pid, r["new_pid"].as_u64().unwrap());
        assert!(!pids.contains(&pid));
        pids.push(pid);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Guests saw no reconnect: one connection each for the whole run.
    let show = cli_json(&dir, &["show"]);
    for p in ["vm1", "g2"] {
        assert_eq!(port(&show, p)["state"], "connected", "{show}");
        assert_eq!(port(&show, p)["connects"], 1, "{show}");
        assert_eq!(port(&show, p)["disconnects"], 0, "{show}");
    }
    assert_eq!(show["upgrades"], 5);
    let r = tx.wait_json(&dir, Duration::from_secs(60));
    let rx = sink.wait_json(&dir, Duration::from_secs(60));
    let drops = path_drops(&dir, "vm1", "g2");
    eprintln!("{}", cli_json(&dir, &["port-stats"]));
    assert_eq!(r["sent"], 200_000);
    assert_eq!(rx["corrupt"], 0, "{rx}");
    assert_eq!(rx["reordered"], 0, "{rx}");
    // Every packet arrived or is a counted drop; at this rate the rings absorb the gaps.
    assert_eq!(
        rx["received"].as_u64().unwrap() + drops,
        200_000,
        "{rx}, drops {drops}"
    );
    assert_eq!(rx["lost"], 0, "{rx}");
    assert_eq!(rx["reconnects"], 0, "{rx}");
    let st = cli_json(&dir, &["port-stats", "vm1"]);
    assert_eq!(
        st[0]["rx"]["packets"], 200_000,
        "counters carried over: {st}"
    );
    let hist = cli_json(&dir, &["upgrade-history"]);
    assert_eq!(hist.as_array().unwrap().len(), 5);
    for old in &pids[..pids.len() - 1] {
        wait_until("old daemon gone", 5, || !alive(*old));
    }
}

/// Traffic of `count` packets at `rate` through vm1 → vm2 while `during` runs; checks
/// every packet is accounted for, allowing `unexplained` packets lost without a counter.
fn with_traffic(dir: &Path, count: u64, rate: u64, unexplained: u64, during: impl FnOnce()) {
    let (_, core) = cores();
    let core = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let (c, r) = (count.to_string(), rate.to_string());
    let before = path_drops(dir, "vm1", "vm2");
    let tx = Proc::spawn(
        "tx",
        dir,
        taskset(),
        &gen_args(
            &core,
            &gen,
            &[
                "--socket",
                &vm1,
                "--sink",
                &vm2,
                "--ring",
                "1024",
                "--rate",
                &r,
                "--count",
                &c,
                "--quiet",
                "--duration",
                "60",
                "txonly",
            ],
        ),
    );
    std::thread::sleep(Duration::from_millis(300));
    during();
    let res = tx.wait_json(dir, Duration::from_secs(60));
    let drops = path_drops(dir, "vm1", "vm2") - before;
    assert_eq!(res["sent"].as_u64().unwrap(), count, "{res}");
    assert_eq!(res["corrupt"], 0, "{res}");
    let received = res["received"].as_u64().unwrap();
    assert!(
        received + drops + unexplained >= count,
        "every packet accounted for (up to {unexplained} in flight in a killed daemon): \
         {res}, drops {drops}"
    );
}

#[test]
fn a_new_daemon_failing_at_any_step_leaves_the_old_one_forwarding() {
    let dir = run_dir("upgrade-fail");
    let (pmd, _) = cores();
    let d = dir.display().to_string();
    let c = pmd.to_string();
    // The old daemon waits 500 ms (not 5 s) for a new one that went silent after the freeze.
    let _sw = Proc::spawn(
        "ferrovsd",
        &dir,
        Path::new("/usr/bin/env"),
        &[
            "FERROVS_UPGRADE_RESUME_TIMEOUT_MS=500",
            bin("ferrovsd").to_str().unwrap(),
            "--run-dir",
            &d,
            "--pmd-cores",
            &c,
        ],
    );
    wait_until("control socket", 10, || {
        cli(&dir, &["show"]).status.success()
    });
    let _stop = StopCurrent(dir.clone());
    let pid = daemon_pid(&dir);
    for step in ["hello", "prepare", "ready", "hang", "resumed"] {
        // A daemon killed after it resumed may take the burst it was forwarding with it.
        let unexplained = if step == "resumed" { 64 } else { 0 };
        with_traffic(&dir, 30_000, 20_000, unexplained, || {
            let r = upgrade(&dir, &[("FERROVS_UPGRADE_FAIL", step)]);
            let e = r.expect_err(step);
            assert!(e.contains("carries on"), "{step}: {e}");
        });
        assert_eq!(daemon_pid(&dir), pid, "{step}: the old daemon still serves");
        wait_until("no takeover process left", 10, || no_takeover_left(&dir));
        let log = std::fs::read_to_string(dir.join("ferrovsd.err")).unwrap();
        if step != "hello" {
            assert!(
                log.contains("rolled back") || log.contains("handover failed"),
                "{log}"
            );
        }
    }
    // And a good one still works afterwards.
    with_traffic(&dir, 20_000, 20_000, 0, || {
        upgrade(&dir, &[]).expect("upgrade after failures");
    });
    assert_ne!(daemon_pid(&dir), pid);
}

#[test]
fn the_old_daemon_refuses_a_schema_it_cannot_hand_over_and_garbage() {
    let dir = run_dir("upgrade-schema");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let pid = daemon_pid(&dir);
    let path = dir.join("ferrovs.upgrade");
    // A "new" daemon that only restores schemas we do not write.
    let mut ch = Channel::new(ferrovs_sys::os::seqpacket_connect(&path).unwrap()).unwrap();
    ch.send(
        &Msg::Hello {
            schema_min: SCHEMA + 1,
            schema_max: SCHEMA + 5,
            version: "99.0.0".into(),
        },
        &[],
    )
    .unwrap();
    match ch.recv(Duration::from_secs(5)).unwrap().0 {
        Msg::Fail { error } => assert!(error.contains("schema"), "{error}"),
        m => panic!("expected a refusal, got {m:?}"),
    }
    // Garbage, then silence: each only ends that attempt.
    let s = ferrovs_sys::os::seqpacket_connect(&path).unwrap();
    ferrovs_sys::os::send_with_fds(&s, b"\x00not json", &[]).unwrap();
    let _silent = ferrovs_sys::os::seqpacket_connect(&path).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    with_traffic(&dir, 10_000, 20_000, 0, || {});
    assert_eq!(daemon_pid(&dir), pid);
    assert!(cli(&dir, &["show"]).status.success());
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every released schema's state still restores (parses and passes the schema check); a
/// schema from the future is refused with a clear error. `FERROVS_WRITE_FIXTURE=1` captures
/// the current schema's state from a live daemon with a guest attached.
#[test]
fn handed_over_state_of_every_released_schema_restores() {
    if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
        capture_fixture();
    }
    for schema in MIN_SCHEMA..=SCHEMA {
        let p = fixtures().join(format!("upgrade-state-v{schema}.json"));
        let text = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("fixture {} missing: {e}", p.display()));
        let v: Value = serde_json::from_str(&text).unwrap();
        let st = State::parse(text.as_bytes()).unwrap_or_else(|e| panic!("schema {schema}: {e}"));
        assert_eq!(st.schema, schema);
        assert!(!st.ports.is_empty());
        assert!(st.ports.iter().any(|p| p.conn.is_some()));
        // Written back, it is the very JSON the released binary wrote: a daemon that reads
        // only that schema reads what this one writes (field names, link and queue-error
        // names unchanged).
        let back = serde_json::to_value(Msg::State(Box::new(st))).unwrap();
        assert_eq!(back, v, "schema {schema}: state does not round-trip");
    }
    // Every other fixture too: the state of a bridge programmed over OpenFlow (rules,
    // groups, meters, controllers) and the final counters that come with it.
    let mut others = 0;
    for e in std::fs::read_dir(fixtures()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&p).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        if name.starts_with("upgrade-state-") {
            let st = State::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let back = serde_json::to_value(Msg::State(Box::new(st))).unwrap();
            assert_eq!(back, v, "{name}: state does not round-trip");
        } else if name.starts_with("upgrade-bye-") {
            let m: Msg =
                serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let Msg::Bye {
                rules,
                groups,
                meters,
                ..
            } = &m
            else {
                panic!("{name}: not a bye: {m:?}")
            };
            assert!(
                !rules.is_empty() && !groups.is_empty() && !meters.is_empty(),
                "{name}"
            );
            assert_eq!(
                serde_json::to_value(&m).unwrap(),
                v,
                "{name}: does not round-trip"
            );
        } else if name.starts_with("upgrade-conntrack-") {
            // The connection table a schema 4 daemon sends at the freeze (the control
            // crate's tests restore it into a tracker and dump it).
            let m: Msg =
                serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let Msg::Conntrack(t) = &m else {
                panic!("{name}: not a conntrack message: {m:?}")
            };
            assert!(!t.entries.is_empty(), "{name}");
            assert_eq!(
                serde_json::to_value(&m).unwrap(),
                v,
                "{name}: does not round-trip"
            );
        } else {
            continue;
        }
        others += 1;
    }
    assert!(
        others >= 2 + (SCHEMA - MIN_SCHEMA + 1) as usize,
        "{others} fixtures"
    );
    let of = State::parse(
        std::fs::read_to_string(fixtures().join("upgrade-state-v1-openflow.json"))
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let br = &of.config.bridges[0];
    assert!(br.flows.as_ref().is_some_and(|f| f.len() >= 4), "{br:?}");
    assert!(!br.groups.is_empty() && !br.meters.is_empty() && !br.controllers.is_empty());
    assert!(!br.send_flow_rem.is_empty(), "{br:?}");
    assert!(of.ports.iter().all(|p| p.ofport.is_some()));
    // A daemon with OpenFlow connections open hands them over: a controller over TCP, a
    // management connection with a bundle open and half a message read (captured by
    // `management_connections_and_bundles_survive_a_hot_upgrade`).
    let oc = State::parse(
        std::fs::read_to_string(fixtures().join("upgrade-state-v1-ofconns.json"))
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let o = oc.openflow.as_ref().expect("the OpenFlow section");
    assert!(!o.listeners.is_empty() && !o.bridges.is_empty());
    let conns: Vec<_> = o.conns.iter().map(|c| c.0.as_ref().unwrap()).collect();
    assert!(conns
        .iter()
        .any(|c| c.tcp && c.controller.is_some() && c.negotiated));
    assert!(conns
        .iter()
        .any(|c| !c.bundles.is_empty() && !c.input.is_empty()));
    // Schema 4 carries the conntrack settings in the configuration.
    let v4 = State::parse(
        std::fs::read_to_string(fixtures().join("upgrade-state-v4.json"))
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(v4.config.other["ct-max-entries"], "500000");
    v4.config.validate().unwrap();
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(format!("upgrade-state-v{SCHEMA}.json"))).unwrap(),
    )
    .unwrap();
    v["schema"] = (SCHEMA + 1).into();
    let e = State::from_json(v).unwrap_err().to_string();
    assert!(
        e.contains(&format!("schema {}", SCHEMA + 1)) && e.contains("restores schemas"),
        "{e}"
    );
}

fn capture_fixture() {
    let dir = run_dir("upgrade-fixture");
    let (pmd, core) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let core = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let _tx = Proc::spawn(
        "tx",
        &dir,
        taskset(),
        &gen_args(
            &core,
            &gen,
            &[
                "--socket",
                &vm1,
                "--sink",
                &vm2,
                "--rate",
                "1000",
                "--log",
                "--quiet",
                "--duration",
                "10",
                "txonly",
            ],
        ),
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut ch =
        Channel::new(ferrovs_sys::os::seqpacket_connect(&dir.join("ferrovs.upgrade")).unwrap())
            .unwrap();
    ch.send(
        &Msg::Hello {
            schema_min: MIN_SCHEMA,
            schema_max: SCHEMA,
            version: "fixture".into(),
        },
        &[],
    )
    .unwrap();
    // Schema 2 (a port logs); schema 3's fixture comes from a daemon configured through
    // OVSDB (tests/ovsdb.rs).
    let (st, _fds) = ch.recv_state(Duration::from_secs(5)).unwrap();
    let schema = st.schema;
    ch.send(
        &Msg::Fail {
            error: "capturing a fixture".into(),
        },
        &[],
    )
    .unwrap();
    std::fs::create_dir_all(fixtures()).unwrap();
    let text = serde_json::to_string_pretty(&Msg::State(Box::new(st))).unwrap();
    std::fs::write(
        fixtures().join(format!("upgrade-state-v{schema}.json")),
        text,
    )
    .unwrap();
}

/// A frontend (re)negotiating its device while upgrades run: every request is answered by
/// exactly one daemon (no error, no lost reply), and the port forwards afterwards.
#[test]
fn vhost_user_messages_racing_the_handover() {
    use ferrovs_vhost::frontend::{Frontend, FrontendConfig};
    let dir = run_dir("upgrade-race");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let vm1 = dir.join("vm1.sock");
    // The upgrades run from one shell started before the guest opens any socket: a fork of
    // this process would hold the guest's socket open and hide its hang-ups.
    let script = format!(
        "for i in $(seq 25); do {} --run-dir {} upgrade >/dev/null || exit 1; done",
        bin("ferrovs").display(),
        dir.display()
    );
    let mut upgrades = Command::new("bash").arg("-c").arg(&script).spawn().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, p2) = (stop.clone(), vm1.clone());
    let guest = std::thread::spawn(move || {
        let mut setups = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            // A full device setup (features, memory table, rings) then a driver reset.
            let fe = Frontend::connect(&p2, FrontendConfig::default())
                .unwrap_or_else(|e| panic!("setup {setups} failed: {e:?}"));
            let mut tx = fe.tx_queue(0).unwrap();
            tx.send(&[0xffu8; 64]);
            drop(tx);
            drop(fe);
            setups += 1;
        }
        setups
    });
    let st = upgrades.wait().unwrap();
    assert!(st.success(), "25 upgrades while the guest renegotiates");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    while !guest.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "a vhost-user request went unanswered across a handover"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let setups = guest.join().unwrap();
    assert!(setups >= 10, "{setups} setups");
    assert_eq!(cli_json(&dir, &["show"])["upgrades"], 25);
    let st = cli_json(&dir, &["port-stats", "vm1"]);
    assert_eq!(st[0]["vhost_user_errors"], 0, "{st}");
    with_traffic(&dir, 10_000, 20_000, 0, || {});
}

fn fd_count(pid: u64) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn rss_kib(pid: u64) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn a_hundred_upgrades_in_a_row_leak_nothing() {
    let dir = run_dir("upgrade-100");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    with_traffic(&dir, 150_000, 10_000, 0, || {
        for _ in 0..5 {
            upgrade(&dir, &[]).expect("upgrade");
        }
        let pid = daemon_pid(&dir);
        let fds = (0..10)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(50));
                fd_count(pid)
            })
            .min()
            .unwrap();
        let rss = rss_kib(pid);
        for i in 0..95 {
            upgrade(&dir, &[]).unwrap_or_else(|e| panic!("upgrade {i}: {e}"));
        }
        let pid = daemon_pid(&dir);
        // (The control connection that asked for the pid may still be open for a moment.)
        wait_until("fds back to where they were", 5, || fd_count(pid) <= fds);
        let grown = rss_kib(pid).saturating_sub(rss);
        assert!(grown < 8 * 1024, "RSS grew by {grown} KiB over 95 upgrades");
    });
    assert_eq!(cli_json(&dir, &["show"])["upgrades"], 100);
}

/// A port whose VM is being live-migrated: its dirty log is handed over with it (the new
/// daemon goes on marking it, schema 2), a new daemon that restores only schema 1 is refused
/// with the reason, and a postcopy under way (its userfaultfd registers the old process's
/// mappings) refuses the upgrade, naming the port, until it ends.
#[test]
fn upgrades_during_a_live_migration() {
    let dir = run_dir("upgrade-migrating");
    let (pmd, core) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let gen = bin("ferrovs-gen").display().to_string();
    let core = core.to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm3 = dir.join("vm3.sock").display().to_string();
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "vm3",
            "type=vhost-user",
            &format!("path={vm3}"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // vm1 -> vm3 at 20 kpps, both ports logging as during a migration.
    let _tx = Proc::spawn(
        "migrating",
        &dir,
        taskset(),
        &gen_args(
            &core,
            &gen,
            &[
                "--socket",
                &vm1,
                "--sink",
                &vm3,
                "--log",
                "--rate",
                "20000",
                "--duration",
                "60",
                "--quiet",
                "txonly",
            ],
        ),
    );
    let dirty = |dir: &Path| {
        cli_json(dir, &["port-stats", "vm3"])[0]["tx"]["dirty_pages_logged"]
            .as_u64()
            .unwrap_or(0)
    };
    wait_until("vm3 logging its traffic", 10, || dirty(&dir) > 0);
    // A new daemon restoring only schema 1 cannot carry the log: refused, with the reason.
    let mut ch =
        Channel::new(ferrovs_sys::os::seqpacket_connect(&dir.join("ferrovs.upgrade")).unwrap())
            .unwrap();
    ch.send(
        &Msg::Hello {
            schema_min: 1,
            schema_max: 1,
            version: "0.0.1-old".into(),
        },
        &[],
    )
    .unwrap();
    match ch.recv(Duration::from_secs(5)).unwrap().0 {
        Msg::Fail { error } => assert!(
            error.contains("live-migrated") && error.contains("schema 2"),
            "{error}"
        ),
        m => panic!("expected a refusal, got {m:?}"),
    }
    // A real upgrade hands the log over: the new daemon marks it.
    let pid = daemon_pid(&dir);
    upgrade(&dir, &[]).expect("upgrade while vm3 logs");
    assert_ne!(daemon_pid(&dir), pid);
    let m = &cli_json(&dir, &["port-stats", "vm3"])[0]["migration"];
    assert_eq!(m["logging"], true, "{m}");
    wait_until("the new daemon marking vm3's log", 10, || dirty(&dir) > 0);
    // Postcopy: refused while it runs, named.
    let vm2 = dir.join("vm2.sock");
    let fe = ferrovs_vhost::frontend::Frontend::connect(
        &vm2,
        ferrovs_vhost::frontend::FrontendConfig {
            postcopy: true,
            ..Default::default()
        },
    )
    .expect("postcopy frontend");
    let e = upgrade(&dir, &[]).expect_err("upgrade refused during a postcopy");
    assert!(e.contains("vm2") && e.contains("postcopy"), "{e}");
    drop(fe);
    wait_until("vm2 reset", 10, || {
        cli_json(&dir, &["port-stats", "vm2"])[0]["migration"]["postcopy"] == false
    });
    upgrade(&dir, &[]).expect("upgrade after the postcopy");
}

/// Hot upgrade across versions, both ways, under traffic: the older build's ferrovsd (from
/// `FERROVS_OLD_BIN_DIR`, e.g. main's `target/release`) hands over to this one, and this one
/// back to the older one. Skipped without `FERROVS_OLD_BIN_DIR`.
#[test]
fn upgrades_across_an_older_build_both_ways() {
    let Some(old_dir) = std::env::var_os("FERROVS_OLD_BIN_DIR") else {
        eprintln!("skipped: set FERROVS_OLD_BIN_DIR to an older build's binaries");
        return;
    };
    let old = PathBuf::from(old_dir).join("ferrovsd");
    assert!(old.exists(), "{} missing", old.display());
    let new = bin("ferrovsd");
    let dir = run_dir("upgrade-across");
    let (pmd, _) = cores();
    let (d, c) = (dir.display().to_string(), pmd.to_string());
    let _sw = Proc::spawn(
        "ferrovsd",
        &dir,
        &old,
        &["--run-dir", &d, "--pmd-cores", &c],
    );
    wait_until("control socket", 10, || {
        cli(&dir, &["show"]).status.success()
    });
    let _stop = StopCurrent(dir.clone());
    let upgrade_to = |binary: &Path| {
        let o = Command::new(bin("ferrovs"))
            .arg("--run-dir")
            .arg(&dir)
            .arg("upgrade")
            .arg(binary)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "upgrade to {}: {}",
            binary.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        daemon_pid(&dir)
    };
    let mut pid = daemon_pid(&dir);
    for (what, binary) in [("older -> this", &new), ("this -> older", &old)] {
        let mut next = 0;
        with_traffic(&dir, 20_000, 20_000, 0, || next = upgrade_to(binary));
        assert_ne!(next, pid, "{what}: a new daemon serves");
        pid = next;
    }
    let show = cli_json(&dir, &["show"]);
    assert_eq!(show["upgrades"], 2, "{show}");
}

/// A controller endpoint of the test's own: it accepts every connection the switch makes,
/// answers HELLO with HELLO and FEATURES_REQUEST, ECHO_REQUEST with ECHO_REPLY, and keeps
/// each connection's message types (in arrival order) and whether it closed.
struct Controller {
    port: u16,
    conns: ConnLog,
}

/// Per connection: the types of the messages it received, and whether it closed.
type ConnLog = std::sync::Arc<std::sync::Mutex<Vec<(Vec<u8>, bool)>>>;

impl Controller {
    const HELLO: u8 = 0;
    const ECHO_REQUEST: u8 = 2;
    const FEATURES_REPLY: u8 = 6;
    const PACKET_IN: u8 = 10;
    const FLOW_REMOVED: u8 = 11;

    fn start() -> Controller {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = conns.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let i = {
                    let mut c = log.lock().unwrap();
                    c.push((Vec::new(), false));
                    c.len() - 1
                };
                let log = log.clone();
                std::thread::spawn(move || {
                    let hdr = |ty: u8, xid: u32| {
                        let mut h = vec![4, ty, 0, 8];
                        h.extend_from_slice(&xid.to_be_bytes());
                        h
                    };
                    let mut ok = s.write_all(&hdr(Self::HELLO, 1)).is_ok()
                        && s.write_all(&hdr(5, 2)).is_ok(); // FEATURES_REQUEST
                    while ok {
                        let mut h = [0u8; 8];
                        if s.read_exact(&mut h).is_err() {
                            break;
                        }
                        let len = usize::from(u16::from_be_bytes([h[2], h[3]])).max(8);
                        let mut m = h.to_vec();
                        m.resize(len, 0);
                        if s.read_exact(&mut m[8..]).is_err() {
                            break;
                        }
                        if h[1] == Self::ECHO_REQUEST {
                            let mut r = m.clone();
                            r[1] = 3; // ECHO_REPLY
                            ok = s.write_all(&r).is_ok();
                        }
                        log.lock().unwrap()[i].0.push(h[1]);
                    }
                    log.lock().unwrap()[i].1 = true;
                });
            }
        });
        Controller { port, conns }
    }

    /// (connections accepted, of which closed).
    fn counts(&self) -> (usize, usize) {
        let c = self.conns.lock().unwrap();
        (c.len(), c.iter().filter(|(_, closed)| *closed).count())
    }

    /// Whether connection `i` has received a message of type `ty`.
    fn saw(&self, i: usize, ty: u8) -> bool {
        let c = self.conns.lock().unwrap();
        c.get(i).is_some_and(|(m, _)| m.contains(&ty))
    }
}

/// `ovs-ofctl dump-flows` lines (header left out), each without its counters and ages, and
/// each rule's duration in seconds, sorted by rule.
fn flows_and_durations(sock: &Path) -> (Vec<String>, Vec<f64>, Vec<u64>) {
    let out = ofctl_ok(sock, "dump-flows", &[]);
    let mut rows: Vec<(String, f64, u64)> = out
        .lines()
        .filter(|l| !l.starts_with("OFPST_FLOW"))
        .map(|l| {
            let mut dur = 0.0;
            let mut packets = 0;
            let kept: Vec<&str> = l
                .trim()
                .split(' ')
                .filter(|w| {
                    let w = w.trim_end_matches(',');
                    if let Some(d) = w.strip_prefix("duration=") {
                        dur = d.trim_end_matches('s').parse().unwrap();
                        return false;
                    }
                    if let Some(p) = w.strip_prefix("n_packets=") {
                        packets = p.parse().unwrap();
                        return false;
                    }
                    !(w.starts_with("n_bytes=")
                        || w.starts_with("idle_age=")
                        || w.starts_with("hard_age="))
                })
                .collect();
            (kept.join(" "), dur, packets)
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    (
        rows.iter().map(|r| r.0.clone()).collect(),
        rows.iter().map(|r| r.1).collect(),
        rows.iter().map(|r| r.2).collect(),
    )
}

/// The number after `name` in `text` (the first occurrence after `from`).
fn count_after(text: &str, from: &str, name: &str) -> u64 {
    let t = &text[text
        .find(from)
        .unwrap_or_else(|| panic!("no {from} in {text}"))..];
    let v = t
        .split(name)
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in {t}"));
    v[..v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len())]
        .parse()
        .unwrap()
}

/// A bridge programmed over OpenFlow (a meter, a select group, rules with a cookie,
/// timeouts and SEND_FLOW_REM) with a controller connected and traffic through the group:
/// a hot upgrade keeps every rule, group and meter with their counters (they go on from
/// where they were), the rules' durations, the port numbers and SEND_FLOW_REM; the
/// controller sees exactly one reconnect, at once; every packet arrives or is a counted
/// drop. With `FERROVS_WRITE_FIXTURE=1` it then captures the state and the final counters
/// such a daemon hands over (`fixtures/upgrade-*-v1-openflow.json`).
#[test]
fn openflow_state_and_counters_survive_a_hot_upgrade() {
    if !require(have("ovs-ofctl"), "ovs-ofctl (openvswitch-common)") {
        return;
    }
    let dir = run_dir("upgrade-openflow");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let sock = dir.join("br0.mgmt");
    wait_until("management socket", 10, || sock.exists());
    // The controller first: a bridge that gets its first controller flushes its tables
    // (as OVS's).
    let ctl = Controller::start();
    let o = cli(
        &dir,
        &[
            "set-controller",
            "br0",
            &format!("tcp:127.0.0.1:{}", ctl.port),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until("the controller's handshake", 10, || {
        ctl.saw(0, Controller::FEATURES_REPLY)
    });

    ofctl_ok(
        &sock,
        "add-meter",
        &["meter=1,kbps,stats,band=type=drop,rate=100000000"],
    );
    ofctl_ok(
        &sock,
        "add-group",
        &["group_id=1,type=select,bucket=weight:1,output:2,bucket=weight:1,output:2"],
    );
    for f in [
        "priority=100,in_port=1,actions=meter:1,group:1",
        "priority=100,in_port=2,actions=output:1",
        "cookie=0x42,priority=50,idle_timeout=3000,hard_timeout=3600,ip,nw_dst=10.99.0.1,actions=drop",
    ] {
        ofctl_ok(&sock, "add-flow", &[f]);
    }
    ofctl_ok(
        &sock,
        "add-flow",
        &["send_flow_rem,cookie=0x43,priority=40,ip,nw_dst=10.99.0.2,actions=drop"],
    );
    ofctl_ok(&sock, "add-flow", &[TO_CONTROLLER]);
    let ports_before = ofctl_ok(&sock, "dump-ports-desc", &[]);
    let (mut flows_before, mut dur_before, mut group_before, mut meter_before) =
        (vec![], vec![], 0, 0);
    let mut rule_before = 0;
    let pid = daemon_pid(&dir);
    let count = 60_000;
    with_traffic(&dir, count, 20_000, 0, || {
        std::thread::sleep(Duration::from_millis(500));
        let (f, d, p) = flows_and_durations(&sock);
        (flows_before, dur_before) = (f, d);
        rule_before = p.iter().max().copied().unwrap_or(0);
        group_before = count_after(
            &ofctl_ok(&sock, "dump-group-stats", &[]),
            "group_id=1",
            "packet_count=",
        );
        meter_before = count_after(
            &ofctl_ok(&sock, "meter-stats", &[]),
            "meter:1",
            "packet_in_count:",
        );
        assert!(group_before > 0 && meter_before > 0 && rule_before > 0);
        let r = upgrade(&dir, &[]).expect("upgrade");
        assert_eq!(r["ok"], true, "{r}");
        // (docs/upgrade.md quotes these: a bridge with rules, prepare and downtime.)
        eprintln!(
            "upgrade with rules: prepare {} ms, downtime {} us, total {} ms",
            r["prepare_ms"], r["downtime_us"], r["total_ms"]
        );
    });
    assert_ne!(daemon_pid(&dir), pid, "a new daemon serves");
    // The new daemon binds the management socket on its first tick after the old one left.
    wait_until("the management socket again", 10, || {
        ofctl(&sock, "dump-flows", &[]).0
    });
    let show = cli_json(&dir, &["show"]);
    let received = cli_json(&dir, &["port-stats", "vm2"])[0]["tx"]["packets"]
        .as_u64()
        .unwrap();
    assert!(received > 0, "{show}");

    // Every rule, with its cookie, timeouts and flags; durations go on.
    let (flows_after, dur_after, packets_after) = flows_and_durations(&sock);
    assert_eq!(flows_after, flows_before, "rules kept across the upgrade");
    for kept in ["send_flow_rem", "hard_timeout=3600", "cookie=0x42"] {
        assert!(
            flows_after.iter().any(|l| l.contains(kept)),
            "{kept}: {flows_after:?}"
        );
    }
    for (a, b) in dur_after.iter().zip(&dur_before) {
        assert!(
            a >= b,
            "durations go on: {dur_after:?} after {dur_before:?}"
        );
    }
    // Counters go on from where they were: the whole run's packets, not only the new
    // daemon's.
    let rule_after = packets_after.iter().max().copied().unwrap_or(0);
    let group_after = count_after(
        &ofctl_ok(&sock, "dump-group-stats", &[]),
        "group_id=1",
        "packet_count=",
    );
    let meter_out = ofctl_ok(&sock, "meter-stats", &[]);
    let meter_after = count_after(&meter_out, "meter:1", "packet_in_count:");
    for (what, before, after) in [
        ("rule", rule_before, rule_after),
        ("group", group_before, group_after),
        ("meter", meter_before, meter_after),
    ] {
        assert!(
            after >= before && after >= received,
            "{what}: {after} packets after the upgrade, {before} before, {received} \
             forwarded in all"
        );
    }
    let buckets = ofctl_ok(&sock, "dump-group-stats", &[]);
    assert!(buckets.contains("bucket0:packet_count="), "{buckets}");
    // The same port numbers.
    assert_eq!(ofctl_ok(&sock, "dump-ports-desc", &[]), ports_before);

    // The controller: no reconnect; a packet-in after the upgrade comes on its one
    // connection, handed over.
    assert!(!ctl.saw(0, Controller::PACKET_IN));
    packet_out_to_controller(&sock);
    wait_until("a packet-in on the handed-over connection", 5, || {
        ctl.saw(0, Controller::PACKET_IN)
    });
    assert_eq!(ctl.counts(), (1, 0), "no reconnect");
    // SEND_FLOW_REM kept: deleting the rule tells the same connection.
    ofctl_ok(
        &sock,
        "del-flows",
        &["--strict", "priority=40,ip,nw_dst=10.99.0.2"],
    );
    wait_until("FLOW_REMOVED", 5, || ctl.saw(0, Controller::FLOW_REMOVED));
    assert_eq!(ctl.counts(), (1, 0));
    let of = &cli_json(&dir, &["show"])["openflow"];
    assert_eq!(of["handover_refused"], 0, "{of}");
    assert!(of["handed_over"].as_u64().is_some_and(|n| n >= 1), "{of}");

    // A restart (stop, start from the saved configuration) keeps SEND_FLOW_REM too.
    ofctl_ok(
        &sock,
        "add-flow",
        &["send_flow_rem,cookie=0x45,priority=40,ip,nw_dst=10.99.0.5,actions=drop"],
    );
    let (flows_saved, _, _) = flows_and_durations(&sock);
    let old = daemon_pid(&dir);
    Command::new("kill").arg(old.to_string()).status().unwrap();
    wait_until("the daemon stopped", 10, || !alive(old));
    let _sw2 = start_switch(&dir, pmd, &[]);
    wait_until("the management socket after the restart", 10, || {
        ofctl(&sock, "dump-flows", &[]).0
    });
    assert_eq!(flows_and_durations(&sock).0, flows_saved, "rules kept");
    wait_until("the controller's second handshake", 10, || {
        ctl.saw(1, Controller::FEATURES_REPLY)
    });
    ofctl_ok(
        &sock,
        "del-flows",
        &["--strict", "priority=40,ip,nw_dst=10.99.0.5"],
    );
    wait_until("FLOW_REMOVED after the restart", 5, || {
        ctl.saw(1, Controller::FLOW_REMOVED)
    });

    if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
        capture_openflow_fixture(&dir, "openflow");
    }
}

/// Plays the new daemon through a whole handover with the daemon serving `dir` (a guest
/// sending meanwhile, so that its connection is in the state) and writes what it hands
/// over: the state and the final counters.
fn capture_openflow_fixture(dir: &Path, what: &str) {
    // A rule that asks for FLOW_REMOVED (the test's own one was deleted).
    ofctl_ok(
        &dir.join("br0.mgmt"),
        "add-flow",
        &["send_flow_rem,cookie=0x44,priority=30,ip,nw_dst=10.99.0.3,actions=drop"],
    );
    let (_, core) = cores();
    let core = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let _tx = Proc::spawn(
        "tx-fixture",
        dir,
        taskset(),
        &gen_args(
            &core,
            &gen,
            &[
                "--socket",
                &vm1,
                "--sink",
                &vm2,
                "--rate",
                "1000",
                "--quiet",
                "--duration",
                "10",
                "txonly",
            ],
        ),
    );
    std::thread::sleep(Duration::from_millis(1000));
    let mut ch =
        Channel::new(ferrovs_sys::os::seqpacket_connect(&dir.join("ferrovs.upgrade")).unwrap())
            .unwrap();
    ch.send(
        &Msg::Hello {
            schema_min: MIN_SCHEMA,
            schema_max: SCHEMA,
            version: "fixture".into(),
        },
        &[],
    )
    .unwrap();
    let (st, _fds) = ch.recv_state(Duration::from_secs(5)).unwrap();
    let schema = st.schema;
    ch.send(&Msg::Ready { prepare_us: 1 }, &[]).unwrap();
    let (frozen, _) = ch.recv(Duration::from_secs(5)).unwrap();
    assert!(matches!(frozen, Msg::Frozen { .. }), "{frozen:?}");
    ch.send(&Msg::Resumed { t_resumed_ns: 1 }, &[]).unwrap();
    let (bye, _) = ch.recv(Duration::from_secs(5)).unwrap();
    assert!(matches!(bye, Msg::Bye { .. }), "{bye:?}");
    let write = |kind: &str, v: String| {
        std::fs::write(
            fixtures().join(format!("upgrade-{kind}-v{schema}-{what}.json")),
            v,
        )
        .unwrap()
    };
    write(
        "state",
        serde_json::to_string_pretty(&Msg::State(Box::new(st))).unwrap(),
    );
    if what == "openflow" {
        // Its rules', groups' and meters' final counters.
        write("bye", serde_json::to_string_pretty(&bye).unwrap());
    }
}

/// A UDP frame from 10.8.0.1 to 10.8.0.2, ports 1234 → 5678 (no guest sends it).
const UDP_FRAME: &str = "020000000002020000000001080045000024000100004011a6c40a0800010a080002\
                         04d2162e0010f2a70102030405060708";

/// The rule that sends [`UDP_FRAME`] to the controllers.
const TO_CONTROLLER: &str =
    "priority=60000,udp,nw_src=10.8.0.1,tp_dst=5678,actions=CONTROLLER:65535";

/// A PACKET_OUT of [`UDP_FRAME`] through the tables: [`TO_CONTROLLER`] sends it to every
/// controller (and management connection with a `miss_send_len`) as a PACKET_IN.
fn packet_out_to_controller(sock: &Path) {
    ofctl_ok(
        sock,
        "packet-out",
        &[&format!(
            "in_port=controller packet={UDP_FRAME} actions=TABLE"
        )],
    );
}

/// `ovs-ofctl -O OpenFlow13 monitor unix:SOCK 65535`, its output in `out`; killed on drop.
struct Monitor {
    child: std::process::Child,
    out: PathBuf,
}

impl Monitor {
    fn start(sock: &Path, out: PathBuf) -> Monitor {
        let f = std::fs::File::create(&out).unwrap();
        let child = Command::new("ovs-ofctl")
            .env("OVS_RUNDIR", out.parent().unwrap())
            .args(["-O", "OpenFlow13", "monitor"])
            .arg(format!("unix:{}", sock.display()))
            .arg("65535")
            .stdout(std::process::Stdio::from(f.try_clone().unwrap()))
            .stderr(std::process::Stdio::from(f))
            .spawn()
            .expect("ovs-ofctl monitor");
        // Its SET_CONFIG (miss_send_len) has gone out by then.
        std::thread::sleep(Duration::from_millis(700));
        Monitor { child, out }
    }

    fn count(&self, what: &str) -> usize {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .matches(what)
            .count()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OpenFlow 1.4 BUNDLE_CONTROL (`type_`: 0 open, 4 commit; flags ordered|atomic).
fn bundle_control(id: u32, type_: u16, xid: u32) -> Vec<u8> {
    let mut m = vec![5, 33, 0, 16];
    m.extend_from_slice(&xid.to_be_bytes());
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&type_.to_be_bytes());
    m.extend_from_slice(&3u16.to_be_bytes());
    m
}

/// An OpenFlow 1.4 BUNDLE_ADD_MESSAGE of `inner` (flags ordered|atomic).
fn bundle_add(id: u32, inner: &[u8], xid: u32) -> Vec<u8> {
    let mut m = vec![5, 34];
    m.extend_from_slice(&((16 + inner.len()) as u16).to_be_bytes());
    m.extend_from_slice(&xid.to_be_bytes());
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&3u16.to_be_bytes());
    m.extend_from_slice(inner);
    m
}

/// The management socket across a hot upgrade: `ovs-ofctl monitor` keeps its connection
/// and receives the packet-in sent after the upgrade; a client that opened a bundle and
/// sent half of its COMMIT before the upgrade sends the other half after it and gets
/// COMMIT_REPLY, the bundled rule in place; `ovs-ofctl` works at once after the upgrade
/// (the listening socket came over too).
#[test]
fn management_connections_and_bundles_survive_a_hot_upgrade() {
    use ferrovs_e2e::ofwire;
    if !require(have("ovs-ofctl"), "ovs-ofctl (openvswitch-common)") {
        return;
    }
    let dir = run_dir("upgrade-mgmt");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let sock = dir.join("br0.mgmt");
    wait_until("management socket", 10, || sock.exists());
    // A TCP controller too (first: a bridge's first controller flushes its tables).
    let ctl = ofwire::Listener::tcp();
    let o = cli(
        &dir,
        &[
            "set-controller",
            "br0",
            &format!("tcp:127.0.0.1:{}", ctl.port()),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut c = ctl.accept(10);
    c.handshake();
    ofctl_ok(&sock, "add-flow", &[TO_CONTROLLER]);
    let mut mon = Monitor::start(&sock, dir.join("monitor.txt"));
    packet_out_to_controller(&sock);
    wait_until("the packet-in before the upgrade", 5, || {
        mon.count("PACKET_IN") == 1
    });
    c.expect(10);

    // A bundle client (OpenFlow 1.4): open, add a FLOW_MOD, half a COMMIT.
    let s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = ofwire::Switch::new(Box::new(s));
    b.expect(ofwire::HELLO);
    b.send(&[5, 0, 0, 8, 0, 0, 0, 1]);
    b.send(&bundle_control(7, 0, 2));
    let r = b.expect(33);
    assert_eq!(&r[12..14], &[0, 1], "OPEN_REPLY: {r:?}");
    let mut fm = ofwire::flow_mod_drop(4321, 3);
    fm[0] = 5;
    b.send(&bundle_add(7, &fm, 3));
    let commit = bundle_control(7, 4, 4);
    b.send(&commit[..10]);
    // Read by the old daemon (its framer holds the half) before it hands over.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!ofctl_ok(&sock, "dump-flows", &[]).contains("priority=4321"));

    let pid = daemon_pid(&dir);
    let r = upgrade(&dir, &[]).expect("upgrade");
    assert_eq!(r["ok"], true, "{r}");
    assert_ne!(daemon_pid(&dir), pid, "a new daemon serves");
    // The listening socket came over: no wait for a rebind.
    let (ok, _, err) = ofctl(&sock, "dump-flows", &[]);
    assert!(ok, "ovs-ofctl right after the upgrade: {err}");

    // The rest of the COMMIT, to the new daemon: the bundle commits.
    b.send(&commit[10..]);
    loop {
        let (t, m) = b.recv().expect("the switch answers the commit");
        assert_ne!(t, ofwire::ERROR, "{m:?}");
        if t == 33 {
            assert_eq!(&m[12..14], &[0, 5], "COMMIT_REPLY: {m:?}");
            break;
        }
    }
    assert!(
        ofctl_ok(&sock, "dump-flows", &[]).contains("priority=4321 actions=drop"),
        "the bundled rule is in place"
    );

    // The monitor and the controller kept their connections and get the next packet-in.
    packet_out_to_controller(&sock);
    wait_until("the packet-in after the upgrade", 5, || {
        mon.count("PACKET_IN") == 2
    });
    c.expect(10);
    assert!(
        ctl.try_accept().is_none(),
        "the controller saw no reconnect"
    );
    assert!(mon.running(), "ovs-ofctl monitor still runs");
    let text = std::fs::read_to_string(dir.join("monitor.txt")).unwrap();
    assert!(
        !text.contains("connection closed") && !text.contains("End of file"),
        "{text}"
    );
    let of = &cli_json(&dir, &["show"])["openflow"];
    assert_eq!(of["handover_refused"], 0, "{of}");
    assert!(of["handed_over"].as_u64().is_some_and(|n| n >= 3), "{of}");

    if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
        // A bundle open and half a message read when the state is taken.
        b.send(&bundle_control(8, 0, 5));
        b.expect(33);
        let mut fm = ofwire::flow_mod_drop(4322, 6);
        fm[0] = 5;
        b.send(&bundle_add(8, &fm, 6));
        b.send(&commit[..10]);
        std::thread::sleep(Duration::from_millis(300));
        capture_openflow_fixture(&dir, "ofconns");
    }
}

/// Hostile handed-over OpenFlow state: the test plays the old daemon and hands a new
/// ferrovsd a management socket and four connections, of which one is sound, one claims a
/// version no switch speaks, one does not parse and one names a fd never sent. The new
/// daemon takes over, serves the sound connection (its ECHO_REQUEST is answered on the
/// same socket, after the half of it the "old daemon" had read), closes the other three
/// and counts them.
#[test]
fn a_corrupt_connection_in_the_handed_over_state_is_refused_alone() {
    use ferrovs_control::upgrade::FdList;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};
    let dir = run_dir("upgrade-hostile-of");
    let (pmd, _) = cores();
    let ctl = UnixListener::bind(dir.join("ferrovs.ctl")).unwrap();
    let up = ferrovs_sys::os::seqpacket_listener(&dir.join("ferrovs.upgrade")).unwrap();
    let mgmt = UnixListener::bind(dir.join("br0.mgmt")).unwrap();
    let (good, mut good_peer) = UnixStream::pair().unwrap();
    let (bad, mut bad_peer) = UnixStream::pair().unwrap();
    let (junk, mut junk_peer) = UnixStream::pair().unwrap();
    for p in [&good_peer, &bad_peer, &junk_peer] {
        p.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let mut fds = FdList::default();
    let [i_ctl, i_up, i_mgmt, i_good, i_bad, i_junk] = [
        ctl.as_raw_fd(),
        up.as_raw_fd(),
        mgmt.as_raw_fd(),
        good.as_raw_fd(),
        bad.as_raw_fd(),
        junk.as_raw_fd(),
    ]
    .map(|fd| fds.push(fd));
    // An ECHO_REQUEST (1.5) of which the old daemon had read the first 5 bytes.
    let echo = [6u8, 2, 0, 12, 0, 0, 0, 9, 1, 2, 3, 4];
    let conn = |socket: u32, version: u8, input: &str| {
        serde_json::json!({
            "socket": socket, "bridge": "br0", "negotiated": true, "version": version,
            "role": "equal", "miss_send_len": 0,
            "async_config": [[3, 0], [7, 7], [7, 0]], "input": input, "output": "",
        })
    };
    let mut junk_conn = conn(i_junk, 6, "");
    junk_conn["role"] = serde_json::json!("king");
    let state = serde_json::json!({
        "msg": "state", "schema": 1, "version": "test", "pid": std::process::id(),
        "config": {"version": 1, "bridges": [{"name": "br0", "ports": []}],
                   "pmd_cores": [pmd], "other": {}},
        "ctl_listener": i_ctl, "upgrade_listener": i_up,
        "bridges": [{"name": "br0", "id": 0, "macs": []}],
        "ports": [], "upgrades": 0,
        "openflow": {
            "listeners": [["br0", i_mgmt]],
            "conns": [conn(i_good, 6, "0602000c00"), conn(i_bad, 9, ""), junk_conn,
                      conn(99, 6, "")],
            "bridges": [],
        },
    });
    let pmd_s = pmd.to_string();
    let d = dir.display().to_string();
    let _new = Proc::spawn(
        "ferrovsd-takeover",
        &dir,
        &bin("ferrovsd"),
        &["--run-dir", &d, "--pmd-cores", &pmd_s, "--takeover"],
    );
    up.set_nonblocking(false).unwrap();
    let (s, _) = up.accept().unwrap();
    let mut ch = Channel::new(s).unwrap();
    let (hello, _) = ch.recv(Duration::from_secs(10)).unwrap();
    assert!(matches!(hello, Msg::Hello { .. }), "{hello:?}");
    // The state as raw JSON (with its fds), as an old daemon sends it.
    for chunk in fds.0.chunks(32) {
        ch.send(
            &Msg::Fds {
                count: chunk.len() as u32,
            },
            chunk,
        )
        .unwrap();
    }
    let bytes = serde_json::to_vec(&state).unwrap();
    assert_eq!(
        ferrovs_sys::os::send_with_fds(ch.socket(), &bytes, &[]).unwrap(),
        bytes.len()
    );
    let (ready, _) = ch.recv(Duration::from_secs(30)).unwrap();
    assert!(matches!(ready, Msg::Ready { .. }), "{ready:?}");
    ch.send(
        &Msg::Frozen {
            t_freeze_ns: 0,
            freeze_us: 0,
            positions: vec![],
            rings: vec![],
            xsks: vec![],
        },
        &[],
    )
    .unwrap();
    let (resumed, _) = ch.recv(Duration::from_secs(10)).unwrap();
    assert!(matches!(resumed, Msg::Resumed { .. }), "{resumed:?}");
    ch.send(
        &Msg::Bye {
            stats: vec![],
            ports: vec![],
            rules: vec![],
            groups: vec![],
            meters: vec![],
        },
        &[],
    )
    .unwrap();
    // The "old daemon" exits: its copies close.
    drop((good, bad, junk, mgmt, ctl, up));
    let _stop = StopCurrent(dir.clone());

    // The sound connection: the rest of the echo, and its reply on the same socket.
    good_peer.write_all(&echo[5..]).unwrap();
    let mut reply = [0u8; 12];
    good_peer.read_exact(&mut reply).unwrap();
    assert_eq!(reply[..2], [6, 3], "ECHO_REPLY: {reply:?}");
    assert_eq!(reply[4..], echo[4..]);
    // The others are closed.
    for (what, p) in [
        ("bad version", &mut bad_peer),
        ("unparsable", &mut junk_peer),
    ] {
        let mut b = [0u8; 8];
        assert_eq!(p.read(&mut b).unwrap(), 0, "{what}: closed");
    }
    let of = &cli_json(&dir, &["show"])["openflow"];
    assert_eq!(of["handover_refused"], 3, "{of}");
    assert_eq!(of["handed_over"], 1, "{of}");
    // The management socket came over: ovs-ofctl is served.
    if have("ovs-ofctl") {
        ofctl_ok(&dir.join("br0.mgmt"), "show", &[]);
    }
}
