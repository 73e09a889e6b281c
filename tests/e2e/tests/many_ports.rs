//! Many ports on one PMD (issue 16): 64 idle frontends (`ferrovs-gen idle --socket-dir
//! --ports`) attached to the switch's client-mode ports beside the two busy ones, all on the
//! one PMD. `ferrovs show` lists every idle port connected with both queues ready, and
//! traffic between the busy pair still arrives, every packet, intact: the busy
//! ports' queues were idle (probed, `idle_probe.rs`) until the traffic started, so this also
//! checks that a probed queue that becomes busy is served. No timing assertions (the rates
//! are bench/many-ports.sh's).

use std::time::Duration;

use ferrovs_e2e::*;

const IDLE: usize = 64;

#[test]
fn sixty_four_idle_frontends_attach_and_the_busy_pair_still_forwards() {
    let dir = run_dir("many-ports");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let idle_dir = dir.join("idle");
    std::fs::create_dir_all(&idle_dir).unwrap();
    let n = IDLE.to_string();
    let idle_d = idle_dir.display().to_string();
    let mut idle = Proc::spawn(
        "idle",
        &dir,
        &bin("ferrovs-gen"),
        &[
            "idle",
            "--server",
            "--socket-dir",
            &idle_d,
            "--ports",
            &n,
            "--duration",
            "600",
        ],
    );
    let last = idle_dir.join(format!("idle{}.sock", IDLE - 1));
    wait_until("idle frontends listening", 20, || last.exists());
    for i in 0..IDLE {
        let path = format!("path={}", idle_dir.join(format!("idle{i}.sock")).display());
        let name = format!("idle{i}");
        let o = cli(
            &dir,
            &["add-port", "br0", &name, "type=vhost-user-client", &path],
        );
        assert!(
            o.status.success(),
            "add-port {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Every idle port connected, both its queues ready, all on the one PMD.
    let ready = || {
        let s = cli_json(&dir, &["show"]);
        let ports = s["bridges"][0]["ports"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ports
            .iter()
            .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("idle")))
            .filter(|p| p["state"] == "connected" && p["ready_queues"] == 2)
            .count()
            == IDLE
    };
    wait_until("64 idle ports connected and ready", 60, ready);
    let err = std::fs::read_to_string(dir.join("idle.err")).unwrap_or_default();
    assert!(err.contains("64 frontends attached"), "{err}");
    let st = cli_json(&dir, &["pmd-stats"]);
    assert_eq!(st[0]["rx_queues"], (IDLE + 2) as u64, "{st}");
    // Let the PMD poll the quiet queues for a while (their probes armed, the busy pair's too).
    std::thread::sleep(Duration::from_millis(500));

    // The busy pair: every packet received intact or counted as a drop by the switch.
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let core = gen.to_string();
    let gen_bin = bin("ferrovs-gen").display().to_string();
    let busy = Proc::spawn(
        "busy",
        &dir,
        std::path::Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen_bin,
            "--socket",
            &vm1,
            "--sink",
            &vm2,
            "--quiet",
            "--ring",
            "1024",
            "--count",
            "50000",
            "--rate",
            "20000",
            "--flows",
            "8",
            "--duration",
            "30",
            "txonly",
        ],
    );
    let r = busy.wait_json(&dir, Duration::from_secs(60));
    let (sent, received) = (r["sent"].as_u64().unwrap(), r["received"].as_u64().unwrap());
    assert_eq!(sent, 50_000, "{r}");
    // At this moderate rate with 1024-entry rings, every packet arrives, intact, unless the
    // sink's process stalls for longer than its receive ring lasts (51 ms: seen on a loaded
    // machine, a 61 ms stall); then the switch drops what finds no receive buffer and counts
    // it on vm2 (`guest_no_rx_buffers`), and those are the only packets missing. (Other drop
    // counters are not compared: the sink's broadcast announce is flooded to the 64 idle
    // ports as well, whose receive rings nobody empties.)
    let vm2_stats = cli_json(&dir, &["port-stats", "vm2"]);
    let no_buffers = vm2_stats[0]["tx"]["drops"]["guest_no_rx_buffers"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        (
            received + no_buffers,
            r["lost"].as_u64(),
            r["corrupt"].as_u64()
        ),
        (sent, Some(no_buffers), Some(0)),
        "{r}\n{vm2_stats}"
    );
    assert!(
        no_buffers < sent / 10,
        "{no_buffers} of {sent} dropped for want of receive buffers: {r}"
    );

    // The idle frontends are still attached and saw no connection closed.
    assert!(ready(), "idle ports still connected and ready");
    idle.kill();
    let out = std::fs::read_to_string(dir.join("idle.out")).unwrap_or_default();
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("{}");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(
        (v["ports"].as_u64(), v["closed"].as_u64()),
        (Some(IDLE as u64), Some(0)),
        "{v}"
    );
}
