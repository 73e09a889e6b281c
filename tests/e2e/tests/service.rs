//! ferrovsd as a systemd service, with this test as the service manager: a real
//! `NOTIFY_SOCKET` listener (docs/packaging.md). READY=1 comes once the configuration is
//! applied, WATCHDOG=1 at half the period, a hot upgrade hands MAINPID= over and the new
//! daemon says READY=1 and pings, STOPPING=1 at the end. A socket that is wrong or gone
//! costs the daemon nothing. (tests/package/run.sh does the same under the real systemd.)

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrovs_e2e::*;

/// Starts ferrovsd on `dir` with `env`, in its own session, logs in `dir`.
fn spawn(dir: &Path, core: usize, env: &[(&str, &str)]) -> Child {
    let err = std::fs::File::create(dir.join("ferrovsd.err")).unwrap();
    let mut c = Command::new("setsid");
    c.arg(bin("ferrovsd"))
        .arg("--run-dir")
        .arg(dir)
        .arg("--pmd-cores")
        .arg(core.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err);
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// The next datagram, within `timeout`.
fn next(rx: &UnixDatagram, timeout: Duration) -> Option<String> {
    rx.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 4096];
    let n = rx.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Every datagram for `d`.
fn collect(rx: &UnixDatagram, d: Duration) -> Vec<String> {
    let t = Instant::now();
    let mut out = Vec::new();
    while let Some(left) = d.checked_sub(t.elapsed()) {
        match next(rx, left.max(Duration::from_millis(1))) {
            Some(m) => out.push(m),
            None => break,
        }
    }
    out
}

fn stop(pid: u64) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
    wait_until("the daemon to exit", 10, || !alive(pid));
}

#[test]
fn ready_after_configuration_watchdog_upgrade_and_stop() {
    let dir = run_dir("service");
    let (core, _) = cores();
    let sock = dir.join("notify");
    let rx = UnixDatagram::bind(&sock).unwrap();
    let _guard = StopCurrent(dir.clone());
    let mut child = spawn(
        &dir,
        core,
        &[
            ("NOTIFY_SOCKET", sock.to_str().unwrap()),
            ("WATCHDOG_USEC", "300000"),
        ],
    );

    // The first thing the daemon says is READY=1, and by then every port exists.
    let first = next(&rx, Duration::from_secs(10)).expect("no READY=1 within 10 s");
    let show = cli_json(&dir, &["show"]);
    assert!(
        first.starts_with("READY=1\n"),
        "first notification: {first:?}"
    );
    assert!(
        first.contains("STATUS=1 bridges, 2 ports (0 connected), 1 PMDs"),
        "{first:?}"
    );
    let ports: Vec<&str> = show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["vm1", "vm2"], "{show}");
    for p in ["vm1.sock", "vm2.sock"] {
        assert!(dir.join(p).exists(), "{p} not there at READY=1");
    }

    // WATCHDOG=1 every half period (150 ms, on a 100 ms tick): about 5 a second.
    let msgs = collect(&rx, Duration::from_secs(1));
    let pings = msgs.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!((3..=10).contains(&pings), "{pings} pings in 1 s: {msgs:?}");

    // A hot upgrade started by hand (this process has no NOTIFY_SOCKET: the new daemon
    // takes the old one's): the old daemon names the new one, which says READY=1 itself.
    let old = u64::from(child.id());
    let r = upgrade(&dir, &[]).expect("upgrade");
    let new = r["new_pid"].as_u64().unwrap();
    assert_ne!(new, old);
    let msgs = collect(&rx, Duration::from_secs(1));
    let handed = msgs
        .iter()
        .position(|m| m.starts_with(&format!("MAINPID={new}\nSTATUS=handed over to pid {new}")))
        .unwrap_or_else(|| panic!("no MAINPID={new} from the old daemon: {msgs:?}"));
    let ready = msgs
        .iter()
        .position(|m| m.starts_with(&format!("MAINPID={new}\nREADY=1\nSTATUS=")))
        .unwrap_or_else(|| panic!("no READY=1 from the new daemon: {msgs:?}"));
    assert!(handed < ready, "{msgs:?}");
    let _ = child.wait();
    // The new daemon pings with the old one's period.
    let msgs = collect(&rx, Duration::from_secs(1));
    let pings = msgs.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(
        (3..=10).contains(&pings),
        "{pings} pings in 1 s after the upgrade: {msgs:?}"
    );

    stop(new);
    let msgs = collect(&rx, Duration::from_millis(300));
    assert!(
        msgs.iter().any(|m| m.starts_with("STOPPING=1")),
        "no STOPPING=1: {msgs:?}"
    );
}

#[test]
fn a_wrong_or_absent_notify_socket_costs_nothing() {
    let (core, _) = cores();
    for (tag, value) in [
        ("service-relative", "relative/notify"),
        ("service-gone", "/nonexistent/ferrovs/notify"),
        ("service-abstract", "@ferrovs-e2e-nobody-listens"),
    ] {
        let dir = run_dir(tag);
        let mut child = spawn(
            &dir,
            core,
            &[("NOTIFY_SOCKET", value), ("WATCHDOG_USEC", "100000")],
        );
        wait_until("control socket", 10, || {
            cli(&dir, &["show"]).status.success()
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(cli(&dir, &["show"]).status.success(), "{tag}");
        assert!(
            child.try_wait().unwrap().is_none(),
            "{tag}: the daemon exited"
        );
        stop(u64::from(child.id()));
        let _ = child.wait();
        let log = std::fs::read_to_string(dir.join("ferrovsd.err")).unwrap();
        let want = if tag == "service-relative" {
            "neither an absolute path nor @NAME"
        } else {
            "service manager at"
        };
        assert!(log.contains(want), "{tag}: {log}");
    }
}
