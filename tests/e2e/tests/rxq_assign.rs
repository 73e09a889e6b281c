//! Rx queue assignment by measured load (`pmd-rxq-assign`, `pmd-rebalance`) with two PMDs
//! and four vhost-user ports driven by ferrovs-gen, as separate processes.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use ferrovs_e2e::*;

/// Starts ferrovsd with PMDs on cores 0 and 1 (the embedded default: br0 with vm1, vm2).
fn start_two_pmds(dir: &Path) -> Proc {
    let d = dir.display().to_string();
    let p = Proc::spawn(
        "ferrovsd",
        dir,
        &bin("ferrovsd"),
        &["--run-dir", d.as_str(), "--pmd-cores", "0,1"],
    );
    wait_until("control socket", 10, || {
        dir.join("ferrovs.ctl").exists() && cli(dir, &["show"]).status.success()
    });
    p
}

fn ok(dir: &Path, args: &[&str]) {
    let o = cli(dir, args);
    assert!(
        o.status.success(),
        "ferrovs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The error `ferrovs ARGS` fails with.
fn err(dir: &Path, args: &[&str]) -> String {
    let o = cli(dir, args);
    assert!(!o.status.success(), "ferrovs {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

/// PMD index polling `port`'s queue 0, from `pmd-stats --json`.
fn pmd_of(stats: &Value, port: &str) -> Option<u64> {
    stats.as_array()?.iter().find_map(|p| {
        p["rxqs"]
            .as_array()?
            .iter()
            .any(|q| q["port"] == port && q["queue"] == 0)
            .then(|| p["pmd"].as_u64().unwrap())
    })
}

/// Measured usage of `port`'s queue 0 (`None`: not measured yet).
fn usage_of(stats: &Value, port: &str) -> Option<f64> {
    stats.as_array()?.iter().find_map(|p| {
        p["rxqs"]
            .as_array()?
            .iter()
            .find(|q| q["port"] == port && q["queue"] == 0)
            .and_then(|q| q["usage_pct"].as_f64())
    })
}

/// ferrovs-gen sending from `src` to `sink` (on core `core`), `count` packets at `rate`.
fn start_gen(dir: &Path, name: &str, core: usize, src: &str, sink: &str, macs: u8) -> Proc {
    let socket = dir.join(format!("{src}.sock")).display().to_string();
    let sink = dir.join(format!("{sink}.sock")).display().to_string();
    let (s, d) = (
        format!("02:00:00:00:{macs:02x}:01"),
        format!("02:00:00:00:{macs:02x}:02"),
    );
    let c = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    Proc::spawn(
        name,
        dir,
        Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &c,
            &gen,
            "--socket",
            &socket,
            "--sink",
            &sink,
            "--src",
            &s,
            "--dst",
            &d,
            "--quiet",
            "--ring",
            "1024",
            "--rate",
            "20000",
            "--count",
            "300000",
            "--duration",
            "120",
            "txonly",
        ],
    )
}

#[test]
fn rebalance_by_cycles_moves_busy_queues_apart_losing_nothing() {
    if !require(
        std::thread::available_parallelism().map_or(0, |n| n.get()) >= 2,
        "2 cores (PMDs on cores 0 and 1)",
    ) {
        return;
    }
    let dir = run_dir("rxq");
    let _sw = start_two_pmds(&dir);
    ok(&dir, &["config", "set", "pmd-rxq-assign", "roundrobin"]);
    // A second bridge: each generator's flood stays with its own sink.
    ok(&dir, &["add-bridge", "br1"]);
    for p in ["vm3", "vm4"] {
        let path = format!("path={}", dir.join(format!("{p}.sock")).display());
        ok(&dir, &["add-port", "br1", p, "type=vhost-user", &path]);
    }
    // Round robin in port order: vm1 and vm3 share a PMD.
    let st = cli_json(&dir, &["pmd-stats"]);
    let (p1, p3) = (pmd_of(&st, "vm1").unwrap(), pmd_of(&st, "vm3").unwrap());
    assert_eq!(p1, p3, "roundrobin put vm1 and vm3 together: {st}");
    assert_ne!(pmd_of(&st, "vm2").unwrap(), p1);

    let (_, gen_core) = cores();
    let b12 = path_drops(&dir, "vm1", "vm2");
    let b34 = path_drops(&dir, "vm3", "vm4");
    let g1 = start_gen(&dir, "gen1", gen_core, "vm1", "vm2", 1);
    let g2 = start_gen(&dir, "gen2", gen_core, "vm3", "vm4", 2);
    wait_until("both senders measured", 60, || {
        let st = cli_json(&dir, &["pmd-stats"]);
        ["vm1", "vm3"]
            .iter()
            .all(|p| usage_of(&st, p).is_some_and(|u| u > 0.0))
    });
    // Roundrobin ignores loads: a rebalance keeps them together.
    ok(&dir, &["pmd-rebalance"]);
    let st = cli_json(&dir, &["pmd-stats"]);
    assert_eq!(pmd_of(&st, "vm1"), pmd_of(&st, "vm3"), "{st}");
    // A new mode applies at the next reassignment, not before.
    ok(&dir, &["config", "set", "pmd-rxq-assign", "cycles"]);
    assert_eq!(
        cli_json(&dir, &["config", "get"])["pmd-rxq-assign"],
        "cycles"
    );
    let st = cli_json(&dir, &["pmd-stats"]);
    assert_eq!(pmd_of(&st, "vm1"), pmd_of(&st, "vm3"), "{st}");
    // Under cycles the two busy queues go to different PMDs, while traffic flows.
    ok(&dir, &["pmd-rebalance"]);
    let st = cli_json(&dir, &["pmd-stats"]);
    assert_ne!(pmd_of(&st, "vm1"), pmd_of(&st, "vm3"), "{st}");
    for p in ["vm1", "vm2", "vm3", "vm4"] {
        assert!(pmd_of(&st, p).is_some(), "{p} polled by some PMD: {st}");
    }
    // The text form shows them as ovs-appctl dpif-netdev/pmd-rxq-show does.
    let text = String::from_utf8_lossy(&cli(&dir, &["pmd-stats"]).stdout).to_string();
    for p in ["vm1", "vm3"] {
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("port: {p} ")) && l.contains("pmd usage:")),
            "{text}"
        );
    }
    // Every packet of both flows is accounted for across the moves.
    for (g, src, sink, before) in [(g1, "vm1", "vm2", b12), (g2, "vm3", "vm4", b34)] {
        let r = g.wait_json(&dir, Duration::from_secs(180));
        let drops = path_drops(&dir, src, sink) - before;
        let (sent, received) = (r["sent"].as_u64().unwrap(), r["received"].as_u64().unwrap());
        assert_eq!(r["corrupt"], 0, "{r}");
        assert_eq!(sent, 300_000, "{r}");
        assert_eq!(
            sent,
            received + drops,
            "{src} -> {sink}: every packet received or counted as a drop: {r}, drops {drops}"
        );
    }
    // Pinning (pmd-rxq-affinity): vm2's queue on core 1's PMD, which then polls nothing else.
    ok(&dir, &["set-port", "vm2", "pmd-rxq-affinity=0:1"]);
    let st = cli_json(&dir, &["pmd-stats"]);
    let pinned = st
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["core"] == 1)
        .unwrap();
    let on: Vec<&str> = pinned["rxqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["port"].as_str().unwrap())
        .collect();
    assert_eq!(on, vec!["vm2"], "{st}");
    ok(&dir, &["set-port", "vm2", "pmd-rxq-affinity="]);
    let st = cli_json(&dir, &["pmd-stats"]);
    for p in st.as_array().unwrap() {
        assert_eq!(p["rxqs"].as_array().unwrap().len(), 2, "{st}");
    }
}

#[test]
fn bad_assignment_input_gets_precise_errors() {
    let dir = run_dir("rxq-bad");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    assert_eq!(
        err(&dir, &["config", "set", "pmd-rxq-assign", "busiest"]),
        "ferrovs: pmd-rxq-assign=busiest: expected cycles, roundrobin or group"
    );
    assert_eq!(
        cli_json(&dir, &["config", "get"])["pmd-rxq-assign"],
        "cycles"
    );
    let e = err(&dir, &["pmd-rebalance"]);
    assert_eq!(
        e,
        format!("ferrovs: pmd-rebalance: only one PMD (pmd-cores {pmd}): nothing to balance")
    );
    assert!(err(&dir, &["config", "set", "pmd-auto-lb", "yes"]).contains("expected true or false"));
    assert_eq!(
        err(&dir, &["set-port", "vm1", "pmd-rxq-affinity=0-1"]),
        "ferrovs: port vm1: pmd-rxq-affinity: '0-1' is not QUEUE:CORE"
    );
    assert_eq!(
        err(&dir, &["set-port", "vm1", "pmd-rxq-affinity=1:0"]),
        "ferrovs: port vm1: pmd-rxq-affinity: queue 1 in '1:0' does not exist (the port has 1)"
    );
    let path = format!("path={}", dir.join("vm3.sock").display());
    assert_eq!(
        err(
            &dir,
            &[
                "add-port",
                "br0",
                "vm3",
                "type=vhost-user",
                &path,
                "pmd-rxq-affinity=0:z"
            ]
        ),
        "ferrovs: port vm3: pmd-rxq-affinity: core 'z' in '0:z' is not a number"
    );
    // A pin to a core without a PMD is accepted and pins nothing (as OVS).
    ok(&dir, &["set-port", "vm1", "pmd-rxq-affinity=0:999"]);
    ok(&dir, &["config", "set", "pmd-auto-lb", "true"]);
    // One PMD: its queues listed with the usage measured so far.
    let st = cli_json(&dir, &["pmd-stats"]);
    assert_eq!(st[0]["rxqs"].as_array().unwrap().len(), 2, "{st}");
}
