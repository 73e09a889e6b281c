//! Logs: a hostile vhost-user frontend (reconnecting in a loop with garbage, or repeating a
//! request the switch refuses) produces a bounded number of lines per port and reason plus
//! one "N suppressed" line, and a counter (`show`'s `log_lines_suppressed`); `--log-format
//! auto` under systemd (`$JOURNAL_STREAM` naming stderr) speaks the journal's native
//! protocol to a socket the test binds, with the port and reason as fields; and `ferrovs
//! log-level` changes levels without a restart. No root needed.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ferrovs_control::logging::parse_journal_entry;
use ferrovs_e2e::*;
use serde_json::Value;

/// A vhost-user message header: code, flags (version 1), payload size.
fn header(code: u32, size: u32) -> Vec<u8> {
    let mut h = code.to_le_bytes().to_vec();
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h
}

/// Connects to a port's socket `n` times, each time sending bytes that are no vhost-user
/// header (the switch drops the connection: one "disconnect" line each, unlimited).
fn garbage_connections(sock: &Path, n: usize) {
    for _ in 0..n {
        if let Ok(mut s) = UnixStream::connect(sock) {
            let _ = s.write_all(&[0xff; 12]);
            // Wait for the switch to hang up before the next one (else it refuses the
            // second frontend, another reason).
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = std::io::Read::read(&mut s, &mut [0u8; 64]);
        }
    }
}

fn lines(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("ferrovsd.err"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn of_reason<'a>(ls: &'a [Value], port: &str, reason: &str) -> Vec<&'a Value> {
    ls.iter()
        .filter(|l| l["port"] == port && l["reason"] == reason)
        .collect()
}

#[test]
fn a_hostile_frontend_cannot_flood_the_log() {
    let dir = run_dir("logs-flood");
    let (core, _) = cores();
    let _sw = start_switch(&dir, core, &["--log-format", "json"]);
    let t = Instant::now();
    // 200 connections of garbage on vm1.
    garbage_connections(&dir.join("vm1.sock"), 200);
    // 300 requests the switch refuses on one vm2 connection (an unknown request code).
    let mut s = UnixStream::connect(dir.join("vm2.sock")).unwrap();
    for _ in 0..300 {
        s.write_all(&header(999, 0)).unwrap();
    }
    wait_until("the refusals counted", 10, || {
        cli_json(&dir, &["show"])["log_lines_suppressed"]
            .as_u64()
            .unwrap_or(0)
            >= 195 + 295
    });
    let burst = ferrovs_control::ratelimit::DEFAULT_BURST as usize;
    let ls = lines(&dir);
    let disc = of_reason(&ls, "vm1", "disconnect");
    let refused = of_reason(&ls, "vm2", "refused-request");
    assert_eq!(disc.len(), burst, "{disc:?}");
    assert_eq!(refused.len(), burst, "{refused:?}");
    assert!(
        refused[0]["msg"]
            .as_str()
            .unwrap()
            .contains("vhost-user request 999 refused"),
        "{refused:?}"
    );
    // The whole flood made only a handful of lines.
    assert!(ls.len() < 20, "{} lines: {ls:?}", ls.len());
    // Once the interval is over, one line says how many were left out.
    let interval = ferrovs_control::ratelimit::DEFAULT_INTERVAL + Duration::from_secs(2);
    std::thread::sleep(interval.saturating_sub(t.elapsed()));
    wait_until("the suppressed lines reported", 5, || {
        let ls = lines(&dir);
        let sup = |port, reason, n: u64| {
            of_reason(&ls, port, reason)
                .iter()
                .any(|l| l["suppressed"].as_str() == Some(n.to_string().as_str()))
        };
        sup("vm1", "disconnect", 195) && sup("vm2", "refused-request", 295)
    });
    let ls = lines(&dir);
    assert_eq!(of_reason(&ls, "vm1", "disconnect").len(), burst + 1);
    assert_eq!(of_reason(&ls, "vm2", "refused-request").len(), burst + 1);
    assert!(
        cli_json(&dir, &["show"])["log_lines_suppressed"]
            .as_u64()
            .unwrap()
            >= 195 + 295
    );
    // The switch still serves: the port is connected and answers.
    let show = cli_json(&dir, &["show"]);
    let vm2 = &show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "vm2")
        .cloned()
        .unwrap();
    assert_eq!(vm2["state"], "connected", "{vm2}");
}

/// The fields of every datagram received within `wait`.
fn datagrams(sock: &UnixDatagram, wait: Duration) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    let t = Instant::now();
    let mut buf = vec![0u8; 128 * 1024];
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    while t.elapsed() < wait {
        if let Ok(n) = sock.recv(&mut buf) {
            let f = parse_journal_entry(&buf[..n]).expect("a well-formed journal entry");
            out.push(
                f.into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                    .collect(),
            );
        }
    }
    out
}

fn field<'a>(e: &'a [(String, String)], k: &str) -> Option<&'a str> {
    e.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

#[test]
fn journald_native_protocol_and_runtime_levels() {
    let dir = run_dir("logs-journald");
    let (core, _) = cores();
    let jpath = dir.join("journal.sock");
    let journal = UnixDatagram::bind(&jpath).unwrap();
    // Under systemd, $JOURNAL_STREAM names stderr's device and inode: the file Proc::spawn
    // truncates keeps its inode.
    let err = dir.join("ferrovsd.err");
    std::fs::write(&err, b"").unwrap();
    let m = std::fs::metadata(&err).unwrap();
    let js = format!("JOURNAL_STREAM={}:{}", m.dev(), m.ino());
    let ls = format!("FERROVS_LOG_SOCKET={}", jpath.display());
    let d = dir.display().to_string();
    let c = core.to_string();
    let ferrovsd = bin("ferrovsd").display().to_string();
    let _sw = Proc::spawn(
        "ferrovsd",
        &dir,
        Path::new("/usr/bin/env"),
        &[&js, &ls, &ferrovsd, "--run-dir", &d, "--pmd-cores", &c],
    );
    wait_until("control socket", 10, || {
        cli(&dir, &["show"]).status.success()
    });
    let es = datagrams(&journal, Duration::from_millis(500));
    let running = es
        .iter()
        .find(|e| field(e, "MESSAGE").is_some_and(|m| m.starts_with("running, control socket")))
        .unwrap_or_else(|| panic!("no start line in {es:?}"));
    assert_eq!(field(running, "PRIORITY"), Some("6"));
    assert_eq!(field(running, "SYSLOG_IDENTIFIER"), Some("ferrovsd"));
    assert!(field(running, "CODE_FILE").is_some_and(|f| f.ends_with("main.rs")));
    assert!(field(running, "CODE_LINE").is_some_and(|l| l.parse::<u32>().is_ok()));
    // Nothing went to stderr: the journal has it all.
    assert_eq!(std::fs::read_to_string(&err).unwrap(), "");

    // A port's line carries the port and reason as fields.
    garbage_connections(&dir.join("vm1.sock"), 1);
    let es = datagrams(&journal, Duration::from_millis(500));
    let disc = es
        .iter()
        .find(|e| field(e, "FERROVS_REASON") == Some("disconnect"))
        .unwrap_or_else(|| panic!("no disconnect line in {es:?}"));
    assert_eq!(field(disc, "FERROVS_PORT"), Some("vm1"));
    assert_eq!(field(disc, "PRIORITY"), Some("4"));
    assert!(field(disc, "MESSAGE")
        .unwrap()
        .contains("bad message header"));

    // Levels change without a restart: the sessions module to error leaves warnings out...
    let lv = cli_json(
        &dir,
        &["log-level", "ferrovs_control::daemon::sessions", "error"],
    );
    assert_eq!(lv["modules"]["ferrovs_control::daemon::sessions"], "error");
    assert_eq!(lv["default"], "info");
    garbage_connections(&dir.join("vm2.sock"), 1);
    let es = datagrams(&journal, Duration::from_millis(500));
    assert!(
        !es.iter().any(|e| field(e, "FERROVS_PORT") == Some("vm2")),
        "{es:?}"
    );
    // ... and back to warn lets them through again.
    cli_json(
        &dir,
        &["log-level", "ferrovs_control::daemon::sessions", "warn"],
    );
    garbage_connections(&dir.join("vm2.sock"), 1);
    let es = datagrams(&journal, Duration::from_millis(500));
    assert!(
        es.iter().any(|e| field(e, "FERROVS_PORT") == Some("vm2")),
        "{es:?}"
    );
    // The default level, and a bad level refused with a precise message.
    assert_eq!(cli_json(&dir, &["log-level", "warn"])["default"], "warn");
    let o = cli(&dir, &["log-level", "loud"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown log level \"loud\""));
    assert_eq!(cli_json(&dir, &["log-level"])["default"], "warn");
}
