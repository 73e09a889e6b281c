//! ferrovsd and ferrovs-gen as separate processes, as an operator runs them.

use std::time::Duration;

use ferrovs_e2e::*;

/// Sends a fixed count through vm1 → vm2 and checks every packet is accounted for:
/// received intact, or counted as a drop by the switch.
fn accounted_run(dir: &std::path::Path, gen_core: usize, extra: &[&str]) -> serde_json::Value {
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let core = gen_core.to_string();
    let mut args = vec![
        "-c",
        core.as_str(),
        bin("ferrovs-gen").to_str().unwrap().to_string().leak() as &str,
    ];
    args.extend([
        "--socket",
        vm1.as_str(),
        "--sink",
        vm2.as_str(),
        "--quiet",
        "--duration",
        "20",
    ]);
    args.extend_from_slice(extra);
    args.push("txonly");
    let before = path_drops(dir, "vm1", "vm2");
    let gen = Proc::spawn("gen", dir, std::path::Path::new("/usr/bin/taskset"), &args);
    let r = gen.wait_json(dir, Duration::from_secs(60));
    let drops = path_drops(dir, "vm1", "vm2") - before;
    let sent = r["sent"].as_u64().unwrap();
    let received = r["received"].as_u64().unwrap();
    assert_eq!(r["corrupt"], 0, "{r}");
    assert!(sent > 0);
    assert_eq!(
        sent,
        received + drops,
        "every packet accounted for: {r}, switch drops {drops}"
    );
    r
}

#[test]
fn gen_through_switch_every_packet_accounted() {
    let dir = run_dir("acct");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    // At a moderate rate with 1024-entry rings (50 ms of buffering against scheduling
    // hiccups on a shared machine) nothing may be lost.
    let r = accounted_run(
        &dir,
        gen,
        &[
            "--ring", "1024", "--count", "100000", "--rate", "20000", "--size", "64", "--flows",
            "8",
        ],
    );
    assert_eq!(r["lost"], 0, "{r}");
    let r = accounted_run(
        &dir,
        gen,
        &[
            "--ring", "1024", "--count", "20000", "--rate", "20000", "--size", "1518",
        ],
    );
    assert_eq!(r["lost"], 0, "{r}");
    // At full speed losses may happen, but each one must be a counted drop.
    accounted_run(&dir, gen, &["--count", "2000000"]);
    let pmd_stats = cli_json(&dir, &["pmd-stats"]);
    assert!(pmd_stats[0]["rx_packets"].as_u64().unwrap() >= 2_120_000);
}

/// A configuration with two vhost-user-client ports g1 and g2 (the guests listen).
fn write_client_config(cfg: &std::path::Path, g1: &str, g2: &str) {
    let text = format!(
        r#"{{"version":1,"bridges":[{{"name":"br0","ports":[
            {{"name":"g1","type":"vhost-user-client","path":"{g1}"}},
            {{"name":"g2","type":"vhost-user-client","path":"{g2}"}}]}}]}}"#
    );
    std::fs::write(cfg, text).unwrap();
}

#[test]
fn multiqueue_ports_through_processes() {
    let dir = run_dir("mq");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    for p in ["vm1", "vm2"] {
        let o = cli(&dir, &["del-port", "br0", p]);
        assert!(o.status.success());
        let path = format!("path={}", dir.join(format!("{p}.sock")).display());
        let o = cli(
            &dir,
            &["add-port", "br0", p, "type=vhost-user", &path, "queues=4"],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let r = accounted_run(
        &dir,
        gen,
        &[
            "--queues", "4", "--ring", "1024", "--count", "40000", "--rate", "20000", "--flows",
            "16",
        ],
    );
    assert_eq!(r["lost"], 0, "{r}");
    let st = cli_json(&dir, &["port-stats", "vm1"]);
    let polled = st[0]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["direction"] == "from-guest" && q["stats"]["packets"].as_u64().unwrap() > 0)
        .count();
    assert_eq!(polled, 4, "all four rx queues carried traffic");
}

#[test]
fn client_mode_connects_to_listening_guests() {
    // The "guests" listen (like QEMU server=on); ferrovsd connects to them as a client.
    let dir = run_dir("client");
    let (pmd, gen) = cores();
    let cfg = dir.join("client.json");
    let g1 = dir.join("g1.sock").display().to_string();
    let g2 = dir.join("g2.sock").display().to_string();
    write_client_config(&cfg, &g1, &g2);
    let core = gen.to_string();
    let gen_bin = bin("ferrovs-gen").display().to_string();
    // g2: a sink that waits for the switch to connect.
    let sink = Proc::spawn(
        "sink",
        &dir,
        std::path::Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen_bin,
            "--socket",
            &g2,
            "--server",
            "--ring",
            "1024",
            "--src",
            "02:00:00:00:00:02",
            "--quiet",
            "--duration",
            "30",
            "--idle",
            "3",
            "rxonly",
        ],
    );
    let tx = Proc::spawn(
        "tx",
        &dir,
        std::path::Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen_bin,
            "--socket",
            &g1,
            "--server",
            "--ring",
            "1024",
            "--quiet",
            "--duration",
            "30",
            "--count",
            "20000",
            "--rate",
            "10000",
            "txonly",
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    let cfgs = cfg.display().to_string();
    let sw = start_switch(&dir, pmd, &["--config", &cfgs]);
    wait_until("both connected", 10, || {
        let s = cli_json(&dir, &["show"]);
        s["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "connected")
    });
    let r = tx.wait_json(&dir, Duration::from_secs(30));
    let rx = sink.wait_json(&dir, Duration::from_secs(30));
    assert_eq!(r["sent"], 20000);
    // Packets sent before the switch had connected to g2 are counted drops (queue not
    // ready); everything else arrives.
    let drops = path_drops(&dir, "g1", "g2");
    assert_eq!(
        rx["received"].as_u64().unwrap() + drops,
        20000,
        "{rx}, drops {drops}"
    );
    assert_eq!(rx["corrupt"], 0);
    drop(sw);
}

#[test]
fn frontend_reconnects_mid_stream() {
    let dir = run_dir("reconn");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let core = gen.to_string();
    let gen_bin = bin("ferrovs-gen").display().to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let sink = Proc::spawn(
        "sink",
        &dir,
        std::path::Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen_bin,
            "--socket",
            &vm2,
            "--src",
            "02:00:00:00:00:02",
            "--quiet",
            "--duration",
            "30",
            "--idle",
            "3",
            "rxonly",
        ],
    );
    let mut total = 0;
    for round in 0..3 {
        // A sender that is killed mid-stream, then a new one.
        let name = format!("tx{round}");
        let mut tx = Proc::spawn(
            &name,
            &dir,
            std::path::Path::new("/usr/bin/taskset"),
            &[
                "-c",
                &core,
                &gen_bin,
                "--socket",
                &vm1,
                "--quiet",
                "--duration",
                "30",
                "--rate",
                "50000",
                "txonly",
            ],
        );
        std::thread::sleep(Duration::from_millis(500));
        tx.kill();
        wait_until("vm1 listening again", 10, || {
            let s = cli_json(&dir, &["show"]);
            s["bridges"][0]["ports"][0]["state"] == "listening"
        });
        total += 1;
    }
    // The sink kept receiving throughout, with nothing corrupt.
    let rx = sink.wait_json(&dir, Duration::from_secs(40));
    assert_eq!(rx["corrupt"], 0);
    assert!(rx["received"].as_u64().unwrap() > 30_000, "{rx}");
    assert_eq!(total, 3);
    let st = cli_json(&dir, &["show"]);
    assert!(st["bridges"][0]["ports"][0]["connects"].as_u64().unwrap() >= 3);
}

#[test]
fn cli_reports_bad_requests_with_nonzero_exit() {
    let dir = run_dir("cli");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let bad: &[(&[&str], &str)] = &[
        (&["del-port", "br0", "nope"], "no port named nope"),
        (
            &[
                "add-port",
                "br0",
                "x",
                "type=vhost-user",
                "path=/tmp/x.sock",
                "queues=abc",
            ],
            "queues=abc: not a number",
        ),
        (
            &["add-port", "br0", "x", "type=bogus"],
            "unknown port type 'bogus'",
        ),
        (&["port-stats", "ghost"], "no port named ghost"),
        (&["frobnicate"], "unknown command"),
        (
            &["config", "set", "mac-aging", "zero"],
            "expected an integer",
        ),
    ];
    for (args, msg) in bad {
        let o = cli(&dir, args);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
    }
    let taken = dir.join("vm1.sock").display().to_string();
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "dup",
            "type=vhost-user",
            &format!("path={taken}"),
        ],
    );
    assert!(!o.status.success());
    // The socket of a *live* process that is not a port of ours.
    let foreign = dir.join("foreign.sock");
    let _l = std::os::unix::net::UnixListener::bind(&foreign).unwrap();
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "f",
            "type=vhost-user",
            &format!("path={}", foreign.display()),
        ],
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("taken"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Human output of the good commands works.
    for args in [
        &["show"][..],
        &["port-stats"],
        &["pmd-stats"],
        &["mac-table", "br0"],
        &["config", "get"],
    ] {
        let o = cli(&dir, args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!o.stdout.is_empty() || args[0] == "mac-table");
    }
    // A second daemon on the same run directory refuses to start.
    let o = std::process::Command::new(bin("ferrovsd"))
        .arg("--run-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("another ferrovsd is running"));
}

#[test]
fn client_mode_survives_switch_restart() {
    // The "guests" listen (QEMU server=on); ferrovsd connects to them. Kill ferrovsd
    // mid-stream and start it again: it reconnects, the guests set their devices up again on
    // the new connection (as QEMU does) and traffic resumes, nothing corrupt.
    let dir = run_dir("restart");
    let (pmd, gen) = cores();
    let g1 = dir.join("g1.sock").display().to_string();
    let g2 = dir.join("g2.sock").display().to_string();
    let cfg = dir.join("client.json");
    write_client_config(&cfg, &g1, &g2);
    let core = gen.to_string();
    let gen_bin = bin("ferrovs-gen").display().to_string();
    let taskset = std::path::Path::new("/usr/bin/taskset");
    let sink = Proc::spawn(
        "sink",
        &dir,
        taskset,
        &[
            "-c",
            &core,
            &gen_bin,
            "--socket",
            &g2,
            "--server",
            "--ring",
            "1024",
            "--src",
            "02:00:00:00:00:02",
            "--quiet",
            "--duration",
            "12",
            "rxonly",
        ],
    );
    let tx = Proc::spawn(
        "tx",
        &dir,
        taskset,
        &[
            "-c",
            &core,
            &gen_bin,
            "--socket",
            &g1,
            "--server",
            "--ring",
            "1024",
            "--quiet",
            "--duration",
            "10",
            "--rate",
            "10000",
            "txonly",
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    let cfgs = cfg.display().to_string();
    let connected = |dir: &std::path::Path| {
        let s = cli_json(dir, &["show"]);
        s["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "connected")
    };
    let mut sw = start_switch(&dir, pmd, &["--config", &cfgs]);
    wait_until("connected", 10, || connected(&dir));
    std::thread::sleep(Duration::from_secs(2));
    let before = cli_json(&dir, &["port-stats", "g2"])[0]["tx"]["packets"]
        .as_u64()
        .unwrap();
    assert!(
        before > 5_000,
        "traffic flowed before the restart: {before}"
    );
    sw.kill();
    std::thread::sleep(Duration::from_millis(500));
    let _sw2 = start_switch(&dir, pmd, &["--config", &cfgs]);
    wait_until("reconnected", 10, || connected(&dir));
    wait_until("traffic resumed", 10, || {
        cli_json(&dir, &["port-stats", "g2"])[0]["tx"]["packets"]
            .as_u64()
            .unwrap()
            > 5_000
    });
    let t = tx.wait_json(&dir, Duration::from_secs(30));
    let rx = sink.wait_json(&dir, Duration::from_secs(30));
    assert_eq!(t["reconnects"], 1, "{t}");
    assert_eq!(rx["reconnects"], 1, "{rx}");
    assert_eq!(rx["corrupt"], 0);
    // Lost: only what was sent while no switch was running.
    let sent = t["sent"].as_u64().unwrap();
    let received = rx["received"].as_u64().unwrap();
    assert!(received > sent * 3 / 4, "sent {sent}, received {received}");
}

/// The lost-wake-up stress: single packets at random (Poisson) intervals for minutes
/// (`FERROVS_STRESS_SECS`, default 120) while the PMD's rx mode, idle threshold, load-based
/// sleep and the receiving port's coalescing change under it every second. Every packet must
/// be delivered: a wake-up lost while the PMD sleeps, or a notification lost in a mode
/// switch, shows as a missing sequence number.
#[test]
fn random_single_packets_for_minutes_while_modes_switch_lose_nothing() {
    let secs: u64 = std::env::var("FERROVS_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let dir = run_dir("stress");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let (core, dur) = (gen.to_string(), secs.to_string());
    let g = Proc::spawn(
        "gen",
        &dir,
        std::path::Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            bin("ferrovs-gen").to_str().unwrap(),
            "--socket",
            &vm1,
            "--sink",
            &vm2,
            "--quiet",
            "--ring",
            "1024",
            "--duration",
            &dur,
            "--rate",
            "2000",
            "--poisson",
            "txonly",
        ],
    );
    let steps: &[&[&str]] = &[
        &["config", "set", "pmd-rx-mode", "interrupt"],
        &[
            "set-port",
            "vm2",
            "coalesce-usecs=200",
            "coalesce-frames=16",
        ],
        &["config", "set", "pmd-rx-mode", "adaptive"],
        &["config", "set", "pmd-sleep-after-us", "50"],
        &["config", "set", "pmd-sleep-max-us", "300"],
        &["config", "set", "pmd-rx-mode", "poll"],
        &["set-port", "vm2", "coalesce-usecs=0", "coalesce-frames=0"],
        &["config", "set", "pmd-rx-mode", "interrupt"],
        &["config", "set", "pmd-sleep-max-us", "0"],
        &["config", "set", "pmd-rx-mode", "adaptive"],
        &["config", "set", "pmd-sleep-after-us", "300"],
    ];
    let t = std::time::Instant::now();
    let mut i = 0;
    while t.elapsed() < Duration::from_secs(secs.saturating_sub(2)) {
        std::thread::sleep(Duration::from_secs(1));
        let o = cli(&dir, steps[i % steps.len()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        i += 1;
    }
    let r = g.wait_json(&dir, Duration::from_secs(secs + 60));
    let pmd = &cli_json(&dir, &["pmd-stats"])[0];
    eprintln!("{i} switches; gen {r}; pmd {pmd}");
    assert_eq!(r["corrupt"], 0, "{r}");
    assert!(r["sent"].as_u64().unwrap() > secs * 1000, "{r}");
    assert_eq!(r["sent"], r["received"], "every packet delivered: {r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert!(pmd["sleeps"].as_u64().unwrap() > 0, "{pmd}");
    assert!(pmd["kick_wakeups"].as_u64().unwrap() > 0, "{pmd}");
    assert!(pmd["load_sleeps"].as_u64().unwrap() > 0, "{pmd}");
}

/// CPU partitioning: the PMD thread runs on its core under the configured scheduling
/// (SCHED_FIFO, a nice level, or normal), the control thread stays off the PMD core.
#[test]
fn pmd_priority_and_pinning_are_applied() {
    let dir = run_dir("prio");
    let (pmd, _) = cores();
    let sw = start_switch(&dir, pmd, &[]);
    let pid = sw.child.id();
    // /proc/PID/task/TID/stat fields after the command: state is field 3; nice 19,
    // rt_priority 40, policy 41 (1-based).
    let pmd_stat = || -> Option<Vec<String>> {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let p = t.path();
            if std::fs::read_to_string(p.join("comm")).ok()?.trim() == "pmd0" {
                let st = std::fs::read_to_string(p.join("stat")).ok()?;
                let rest = &st[st.rfind(')')? + 2..];
                let cpus = std::fs::read_to_string(p.join("status")).ok()?;
                let allowed = cpus
                    .lines()
                    .find(|l| l.starts_with("Cpus_allowed_list"))?
                    .split(':')
                    .nth(1)?
                    .trim()
                    .to_string();
                let mut v: Vec<String> = std::iter::once(allowed)
                    .chain(rest.split(' ').map(String::from))
                    .collect();
                // v[0]: allowed CPUs; v[1]: state (field 3), so field k is v[k - 2].
                v.truncate(42);
                return Some(v);
            }
        }
        None
    };
    let (mut nice, mut rt, mut policy) = (String::new(), String::new(), String::new());
    for (setting, want_policy, want_rt, want_nice) in [
        ("fifo:10", "1", "10", "0"),
        ("nice:5", "0", "0", "5"),
        ("normal", "0", "0", "0"),
    ] {
        let o = cli(&dir, &["config", "set", "pmd-priority", setting]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let st = &cli_json(&dir, &["pmd-stats"])[0];
        if let Some(e) = st["priority_error"].as_str() {
            assert!(!in_ci(), "{setting} refused in CI (root): {e}");
            eprintln!("skip: {setting} refused here: {e}");
            continue;
        }
        wait_until("the restarted PMD thread", 10, || {
            pmd_stat().is_some_and(|v| {
                (nice, rt, policy) = (v[19 - 2].clone(), v[40 - 2].clone(), v[41 - 2].clone());
                policy == want_policy && rt == want_rt && nice == want_nice
            })
        });
        let v = pmd_stat().unwrap();
        assert_eq!(v[0], pmd.to_string(), "PMD pinned to its core");
        assert_eq!(st["priority"], setting);
    }
    // The control thread (the main thread: TID == PID) keeps off the PMD core when there is
    // another.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let allowed = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap()
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    if cores().0 > 0 {
        assert!(
            !parse_list(&allowed).contains(&pmd),
            "control thread allowed on {allowed}, PMD core {pmd}"
        );
    }
    let e = cli(&dir, &["config", "set", "pmd-priority", "fifo:0"]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("fifo:N (1..=99)"));
}

/// `0-2,5` → [0, 1, 2, 5].
fn parse_list(s: &str) -> Vec<usize> {
    s.split(',')
        .flat_map(|p| match p.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<usize>>(),
            None => vec![p.parse().unwrap()],
        })
        .collect()
}
