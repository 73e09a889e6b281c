//! The flow pipeline driven as an operator does: the `ferrovs` CLI (add-flow, add-flows from
//! a file, dump-flows, del-flows, dump-megaflows), traffic from ferrovs-gen processes, rules
//! kept across a restart and a hot upgrade, and millions of distinct flows.

use std::path::Path;
use std::time::Duration;

use ferrovs_e2e::*;

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = cli(dir, args);
    assert!(
        o.status.success(),
        "ferrovs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(dir: &Path, args: &[&str]) -> String {
    let o = cli(dir, args);
    assert!(!o.status.success(), "ferrovs {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs ferrovs-gen txonly vm1 → vm2 (sink) with `extra`; returns its summary.
fn gen(dir: &Path, core: usize, extra: &[&str]) -> serde_json::Value {
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let core = core.to_string();
    let g = bin("ferrovs-gen").display().to_string();
    let mut args = vec![
        "-c", &core, &g, "--socket", &vm1, "--sink", &vm2, "--quiet", "--settle", "0.5",
    ];
    args.extend_from_slice(extra);
    args.push("txonly");
    Proc::spawn("gen", dir, Path::new("/usr/bin/taskset"), &args)
        .wait_json(dir, Duration::from_secs(60))
}

fn n_packets(dir: &Path, filter: &str) -> u64 {
    let v = cli_json(dir, &["dump-flows", "br0", filter]);
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| f["n_packets"].as_u64().unwrap())
        .sum()
}

#[test]
fn rules_from_the_cli_steer_traffic_and_survive_restart_and_upgrade() {
    let dir = run_dir("flows-cli");
    let (pmd, core) = cores();
    let mut sw = start_switch(&dir, pmd, &[]);
    // A bulk file with a comment, a blank line and a bad rule on line 4: nothing installed,
    // the error names the line.
    let file = dir.join("rules.txt");
    std::fs::write(
        &file,
        "# steer vm1's UDP to vm2, drop the rest of vm1's IP\n\
         priority=100,in_port=vm1,udp,tp_dst=9 actions=output:vm2\n\
         \n\
         priority=90,in_port=vm1,ip,nw_src=10.0.0.0/33 actions=drop\n",
    )
    .unwrap();
    let f = file.display().to_string();
    let e = fails(&dir, &["add-flows", "br0", &f]);
    assert!(e.contains(&format!("{f}:4:")), "{e}");
    assert_eq!(
        cli_json(&dir, &["dump-flows", "br0"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    std::fs::write(
        &file,
        "# steer vm1's UDP to vm2, drop the rest of vm1's IP\n\
         priority=100,in_port=vm1,udp,tp_dst=9 actions=output:vm2\n\
         \n\
         priority=90,in_port=vm1,ip actions=drop\n",
    )
    .unwrap();
    let out = ok(&dir, &["add-flows", "br0", &f]);
    assert!(out.contains("added 2 rule(s), 3 in all"), "{out}");
    let r = gen(
        &dir,
        core,
        &["--count", "20000", "--rate", "20000", "--flows", "4"],
    );
    assert_eq!(r["received"], 20000, "{r}");
    assert_eq!(
        n_packets(&dir, "priority=100,in_port=vm1,udp,tp_dst=9"),
        20000
    );
    let human = ok(&dir, &["dump-flows", "br0"]);
    assert!(
        human.contains("n_packets=20000, n_bytes=1280000, ") && human.contains("tp_dst=9"),
        "{human}"
    );
    // (The sink's side sends one frame of its own when it attaches: its megaflow is
    // in_port=vm2.)
    let mf = ok(&dir, &["dump-megaflows", "br0"]);
    let from_vm1 = mf.lines().filter(|l| l.starts_with("in_port=vm1,")).count();
    assert_eq!(from_vm1, 1, "4 UDP flows, one megaflow: {mf}");
    let pmd_out = ok(&dir, &["pmd-stats"]);
    assert!(
        pmd_out.contains("emc hits") && pmd_out.contains("megaflow cache br0"),
        "{pmd_out}"
    );

    // The rules are saved: a restart comes back with them.
    sw.kill();
    let mut sw = start_switch(&dir, pmd, &[]);
    assert_eq!(
        cli_json(&dir, &["dump-flows", "br0"])
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // And a hot upgrade hands them over, with their counters and install time.
    let steer = "priority=100,in_port=vm1,udp,tp_dst=9";
    let r = gen(&dir, core, &["--count", "3000", "--rate", "20000"]);
    assert_eq!(r["received"], 3000, "{r}");
    assert_eq!(n_packets(&dir, steer), 3000);
    let age = |dir: &Path| {
        cli_json(dir, &["dump-flows", "br0", steer])[0]["duration_s"]
            .as_f64()
            .unwrap()
    };
    let before = age(&dir);
    upgrade(&dir, &[]).expect("upgrade");
    assert_eq!(n_packets(&dir, steer), 3000, "counters handed over");
    assert!(age(&dir) >= before, "install time handed over");
    let r = gen(&dir, core, &["--count", "5000", "--rate", "20000"]);
    assert_eq!(r["received"], 5000, "{r}");
    assert_eq!(
        n_packets(&dir, steer),
        8000,
        "counting on after the upgrade"
    );
    assert_eq!(
        cli_json(&dir, &["dump-flows", "br0"])
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // Deleting the steering rule: vm1's UDP now hits the drop rule, counted as flow_drop.
    let out = ok(
        &dir,
        &[
            "del-flows",
            "br0",
            "--strict",
            "priority=100,in_port=vm1,udp,tp_dst=9",
        ],
    );
    assert!(out.contains("deleted 1 rule(s), 2 left"), "{out}");
    let before = port_drops(&dir, "vm1", "rx");
    let r = gen(&dir, core, &["--count", "1000", "--rate", "20000"]);
    assert_eq!(r["received"], 0, "{r}");
    assert_eq!(port_drops(&dir, "vm1", "rx") - before, 1000);
    let st = cli_json(&dir, &["port-stats", "vm1"]);
    assert!(
        st[0]["rx"]["drops"]["flow_drop"].as_u64().unwrap() >= 1000,
        "{st}"
    );
    // Back to the default: NORMAL forwards again.
    ok(&dir, &["del-flows", "br0"]);
    ok(&dir, &["add-flow", "br0", "priority=0 actions=normal"]);
    let r = gen(&dir, core, &["--count", "1000", "--rate", "20000"]);
    assert_eq!(r["received"], 1000, "{r}");
    // Precise errors, non-zero exits.
    let e = fails(
        &dir,
        &["add-flow", "br0", "priority=1,tp_dst=80 actions=drop"],
    );
    assert!(e.contains("tp_dst"), "{e}");
    let e = fails(&dir, &["add-flow", "nobridge", "actions=drop"]);
    assert!(e.contains("no bridge named nobridge"), "{e}");
    let e = fails(&dir, &["dump-flows", "br0", "in_port=vm1,nw_dst=1.2.3.4"]);
    assert!(e.contains("nw_dst"), "{e}");
    // The daemon now running is the one the upgrade started: stop it by its pid.
    let pid = cli_json(&dir, &["show"])["pid"].as_u64().unwrap();
    let _ = std::process::Command::new("kill")
        .arg(pid.to_string())
        .status();
    sw.kill();
}

/// A million distinct flows (by IPv4 source) under one rule: every packet is forwarded, the
/// megaflow cache holds one entry per rule decision, not per flow.
#[test]
fn a_million_flows_share_one_megaflow() {
    let dir = run_dir("flows-million");
    let (pmd, core) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    ok(&dir, &["del-flows", "br0"]);
    ok(
        &dir,
        &[
            "add-flow",
            "br0",
            "priority=10,in_port=vm1,ip,nw_dst=10.0.0.2 actions=output:vm2",
        ],
    );
    let r = gen(
        &dir,
        core,
        &[
            "--count",
            "1000000",
            "--ip-flows",
            "1000000",
            "--ring",
            "1024",
            "--rate",
            "200000",
        ],
    );
    let drops = path_drops(&dir, "vm1", "vm2");
    assert_eq!(
        r["received"].as_u64().unwrap() + drops,
        1_000_000,
        "every packet accounted for: {r}"
    );
    assert!(r["received"].as_u64().unwrap() >= 990_000, "{r}");
    let mf = cli_json(&dir, &["dump-megaflows", "br0"]);
    let from_vm1: Vec<_> = mf
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["match"].as_str().unwrap().starts_with("in_port=vm1,"))
        .collect();
    assert_eq!(from_vm1.len(), 1, "{mf}");
    assert_eq!(from_vm1[0]["packets"], 1_000_000, "{mf}");
    let p = &cli_json(&dir, &["pmd-stats"])[0]["flow"];
    assert!(p["upcalls"].as_u64().unwrap() <= 2, "{p}");
    assert!(p["megaflow_hits"].as_u64().unwrap() > 900_000, "{p}");
}
