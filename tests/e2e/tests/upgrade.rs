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

    // The controller: one reconnect, at once, and nothing else.
    wait_until("the controller's second handshake", 5, || {
        ctl.saw(1, Controller::FEATURES_REPLY)
    });
    assert_eq!(ctl.counts(), (2, 1), "exactly one reconnect");
    // SEND_FLOW_REM kept: deleting the rule tells the (new) connection.
    ofctl_ok(
        &sock,
        "del-flows",
        &["--strict", "priority=40,ip,nw_dst=10.99.0.2"],
    );
    wait_until("FLOW_REMOVED", 5, || ctl.saw(1, Controller::FLOW_REMOVED));
    assert_eq!(ctl.counts(), (2, 1));

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
    wait_until("the controller's third handshake", 10, || {
        ctl.saw(2, Controller::FEATURES_REPLY)
    });
    ofctl_ok(
        &sock,
        "del-flows",
        &["--strict", "priority=40,ip,nw_dst=10.99.0.5"],
    );
    wait_until("FLOW_REMOVED after the restart", 5, || {
        ctl.saw(2, Controller::FLOW_REMOVED)
    });

    if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
        capture_openflow_fixture(&dir);
    }
}

/// Plays the new daemon through a whole handover with the daemon serving `dir` (a guest
/// sending meanwhile, so that its connection is in the state) and writes what it hands
/// over: the state and the final counters.
fn capture_openflow_fixture(dir: &Path) {
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
    let write = |what: &str, v: String| {
        std::fs::write(
            fixtures().join(format!("upgrade-{what}-v{schema}-openflow.json")),
            v,
        )
        .unwrap()
    };
    write(
        "state",
        serde_json::to_string_pretty(&Msg::State(Box::new(st))).unwrap(),
    );
    write("bye", serde_json::to_string_pretty(&bye).unwrap());
}
