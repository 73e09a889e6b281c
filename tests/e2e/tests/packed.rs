//! Packed virtqueues through the switch as an operator runs it: ferrovsd with
//! `vhost-packed-rings=true`, `ferrovs-gen --packed` sending vm1 → vm2 (separate processes,
//! no root, no VM). Every packet arrives intact and in order, and `ferrovs show` names the
//! ring layout among the ports' features.

use std::time::Duration;

use ferrovs_e2e::*;

fn gen_run(dir: &std::path::Path, core: usize, extra: &[&str]) -> serde_json::Value {
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let core = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    let mut args = vec![
        "-c",
        core.as_str(),
        gen.as_str(),
        "--socket",
        vm1.as_str(),
        "--sink",
        vm2.as_str(),
        "--quiet",
        "--duration",
        "30",
        "--packed",
    ];
    args.extend_from_slice(extra);
    args.push("txonly");
    let p = Proc::spawn("gen", dir, std::path::Path::new("/usr/bin/taskset"), &args);
    p.wait_json(dir, Duration::from_secs(60))
}

fn features(dir: &std::path::Path, port: &str) -> Vec<String> {
    let show = cli_json(dir, &["show"]);
    show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .map(|p| {
            p["features"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn forwards_vm1_to_vm2_on_packed_rings_intact_and_in_order() {
    let dir = run_dir("packed");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    // Turned off, `--packed` refuses a backend that does not offer them.
    let o = cli(&dir, &["config", "set", "vhost-packed-rings", "false"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let vm1 = dir.join("vm1.sock").display().to_string();
    let o = std::process::Command::new(bin("ferrovs-gen"))
        .args([
            "--socket", &vm1, "--packed", "--quiet", "--count", "1", "txonly",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "packed rings are off");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("did not offer packed rings"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = cli(&dir, &["config", "set", "vhost-packed-rings", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (count, size) in [("100000", "64"), ("20000", "1518")] {
        let r = gen_run(
            &dir,
            gen,
            &[
                "--ring", "1024", "--count", count, "--rate", "20000", "--size", size, "--flows",
                "8",
            ],
        );
        assert_eq!(
            r["sent"].as_u64().unwrap(),
            count.parse::<u64>().unwrap(),
            "{r}"
        );
        assert_eq!(r["received"], r["sent"], "every packet arrives: {r}");
        assert_eq!(r["lost"], 0, "{r}");
        assert_eq!(r["reordered"], 0, "in order: {r}");
        assert_eq!(r["corrupt"], 0, "intact: {r}");
    }
    // While a packed frontend is attached, `show` names the layout among its features.
    let gen_bin = bin("ferrovs-gen");
    let mut idle = Proc::spawn(
        "idle",
        &dir,
        &gen_bin,
        &["--socket", &vm1, "--packed", "--quiet", "idle"],
    );
    wait_until("ring_packed in show", 10, || {
        features(&dir, "vm1").iter().any(|f| f == "ring_packed")
    });
    assert!(!features(&dir, "vm2").iter().any(|f| f == "ring_packed"));
    idle.kill();
}

/// DPDK's virtio-user driver (`packed_vq=1`), a packed-ring frontend nobody here wrote,
/// mac-forwards between vm1 and vm2 through the switch for a few seconds: both ways carry
/// traffic, `show` names `ring_packed`, and the switch drops nothing.
#[test]
fn dpdk_virtio_user_on_packed_rings_forwards_both_ways() {
    if !require(
        have("dpdk-testpmd"),
        "dpdk-testpmd (Debian package dpdk-dev; scripts/deps.sh installs it)",
    ) {
        return;
    }
    let dir = run_dir("packed-testpmd");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let o = cli(&dir, &["config", "set", "vhost-packed-rings", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let lcores = format!("{gen},{pmd}");
    let child = std::process::Command::new("timeout")
        .args(["-s", "INT", "-k", "5", "6", "dpdk-testpmd", "-l", &lcores])
        .args([
            "--main-lcore",
            &pmd.to_string(),
            "--no-pci",
            "--no-huge",
            "-m",
            "512",
        ])
        .args([
            "--single-file-segments",
            "--file-prefix",
            &format!("ferrovs-e2e-packed-{}", std::process::id()),
        ])
        .args([
            "--vdev",
            &format!("net_virtio_user0,path={vm1},queues=1,packed_vq=1,mac=02:00:00:00:00:01"),
            "--vdev",
            &format!("net_virtio_user1,path={vm2},queues=1,packed_vq=1,mac=02:00:00:00:00:00"),
        ])
        .args([
            "--",
            "--forward-mode=mac",
            "--nb-cores=1",
            "--total-num-mbufs=16384",
        ])
        .args(["--tx-first", "--stats-period", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run testpmd");
    // DPDK's virtio-user takes IN_ORDER too: its transmit bursts then come back as one
    // used descriptor each, which its in-order cleanup walks.
    wait_until("testpmd on packed rings, in order", 10, || {
        ["vm1", "vm2"].iter().all(|p| {
            let f = features(&dir, p);
            f.iter().any(|f| f == "ring_packed") && f.iter().any(|f| f == "in_order")
        })
    });
    let out = child.wait_with_output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("Cause:"), "testpmd failed:\n{log}");
    let st = cli_json(&dir, &["port-stats"]);
    for (p, name) in [(0, "vm1"), (1, "vm2")] {
        for d in ["rx", "tx"] {
            assert!(
                st[p][d]["packets"].as_u64().unwrap() > 10_000,
                "{name} {d}: too little: {st}\n{log}"
            );
        }
        assert_eq!(st[p]["rx"]["dropped"], 0, "{name}: {st}");
    }
}

/// Hot upgrade of ports on packed rings, under traffic: the rings' positions (slot and wrap
/// counter) are handed over as plain data and the new daemon goes on where the old one
/// stopped: every packet arrives or is a counted drop, none corrupt, and the frontend stays
/// on packed rings.
#[test]
fn hot_upgrade_carries_packed_rings_under_traffic() {
    let dir = run_dir("packed-upgrade");
    let (pmd, core) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let o = cli(&dir, &["config", "set", "vhost-packed-rings", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (vm1, vm2) = (
        dir.join("vm1.sock").display().to_string(),
        dir.join("vm2.sock").display().to_string(),
    );
    let gen = bin("ferrovs-gen").display().to_string();
    let core = core.to_string();
    let before = path_drops(&dir, "vm1", "vm2");
    let tx = Proc::spawn(
        "tx",
        &dir,
        std::path::Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen,
            "--socket",
            &vm1,
            "--sink",
            &vm2,
            "--packed",
            "--ring",
            "1024",
            "--rate",
            "20000",
            "--count",
            "80000",
            "--quiet",
            "--duration",
            "60",
            "txonly",
        ],
    );
    wait_until("packed rings up", 10, || {
        features(&dir, "vm1").iter().any(|f| f == "ring_packed")
    });
    let first = daemon_pid(&dir);
    for _ in 0..2 {
        let r = upgrade(&dir, &[]).expect("hot upgrade");
        assert_eq!(daemon_pid(&dir), r["new_pid"].as_u64().unwrap(), "{r}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_ne!(daemon_pid(&dir), first);
    // Still on packed rings, and no queue broken, in the daemon that took over (traffic is
    // still running: 80000 packets at 20000 per second).
    for port in ["vm1", "vm2"] {
        assert!(features(&dir, port).iter().any(|f| f == "ring_packed"));
    }
    let st = cli_json(&dir, &["port-stats"]);
    for p in 0..2 {
        for q in st[p]["queues"].as_array().unwrap() {
            assert_eq!(
                q["ready"], true,
                "no queue broken across the upgrades: {st}"
            );
        }
    }
    let res = tx.wait_json(&dir, Duration::from_secs(60));
    let drops = path_drops(&dir, "vm1", "vm2") - before;
    assert_eq!(res["sent"], 80000, "{res}");
    assert_eq!(res["corrupt"], 0, "{res}");
    let received = res["received"].as_u64().unwrap();
    eprintln!("across two upgrades: {res}, switch drops {drops}");
    assert!(
        received + drops >= 80000,
        "every packet accounted for: {res}, drops {drops}"
    );
}
