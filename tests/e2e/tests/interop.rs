//! Interop with DPDK: testpmd's `net_virtio_user` (a DPDK guest driver) attaches to two
//! ferrovs ports and io-forwards between them, so packets circulate both ways through ferrovs.

use std::process::Command;
use std::time::Duration;

use ferrovs_e2e::*;

#[test]
fn dpdk_virtio_user_forwards_both_ways_through_ferrovs() {
    if !require(
        have("dpdk-testpmd"),
        "dpdk-testpmd (Debian package dpdk-dev; scripts/deps.sh installs it)",
    ) {
        return;
    }
    let dir = run_dir("testpmd");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    // testpmd's main lcore sleeps; its one forwarding lcore runs on the traffic core. With
    // --stats-period it forwards until SIGINT (without it, it stops at EOF on stdin).
    let lcores = format!("{gen},{pmd}");
    let out = Command::new("timeout")
        .args([
            "-s",
            "INT",
            "-k",
            "5",
            "6",
            "dpdk-testpmd",
            "-l",
            &lcores,
            "--main-lcore",
            &pmd.to_string(),
        ])
        .args([
            "--no-pci",
            "--no-huge",
            "-m",
            "512",
            "--single-file-segments",
            "--file-prefix",
            &format!("ferrovs-e2e-{}", std::process::id()),
        ])
        .args([
            "--vdev",
            &format!("net_virtio_user0,path={vm1},queues=1"),
            "--vdev",
            &format!("net_virtio_user1,path={vm2},queues=1"),
        ])
        .args([
            "--",
            "--forward-mode=io",
            "--nb-cores=1",
            "--total-num-mbufs=16384",
            "--tx-first",
            "--stats-period",
            "1",
        ])
        .output()
        .expect("run testpmd");
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("Cause:"), "testpmd failed:\n{log}");
    let st = cli_json(&dir, &["port-stats"]);
    let get = |port: usize, d: &str| st[port][d]["packets"].as_u64().unwrap();
    // Both directions carried traffic: vm1 → vm2 and vm2 → vm1.
    for (p, name) in [(0, "vm1"), (1, "vm2")] {
        assert!(
            get(p, "rx") > 10_000,
            "{name} received too little from testpmd: {st}\n{log}"
        );
        assert!(
            get(p, "tx") > 10_000,
            "{name} sent too little to testpmd: {st}\n{log}"
        );
    }
    // testpmd's own totals agree that it received what ferrovs delivered (± the last bursts in
    // flight at exit).
    let totals: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("RX-packets:"))
        .filter_map(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        .collect();
    let rx_total = *totals.iter().max().expect("testpmd printed stats");
    let delivered = get(0, "tx") + get(1, "tx");
    assert!(
        rx_total <= delivered && delivered - rx_total < 4096,
        "testpmd rx {rx_total}, ferrovs delivered {delivered}"
    );
    std::thread::sleep(Duration::from_millis(100));
}
