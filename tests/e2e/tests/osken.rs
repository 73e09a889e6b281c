//! os-ken's switch test tool (PyPI `os-ken`, `os_ken/tests/switch/tester.py`) against
//! ferrovs, with OVS as the reference, through `scripts/osken-switch-tests.sh`: an OVS netdev
//! bridge in a namespace is the tester switch, veth pairs join it to the target, and os-ken
//! drives both. Here a subset of the OpenFlow 1.3 match and action cases runs (the whole
//! suite is the script's own command, its counts in docs/openflow.md): first against OVS,
//! then against ferrovs, and every case OVS passes must pass on ferrovs.
//!
//! Before every case the tester installs `in_port=2,actions=CONTROLLER` in the target (its
//! packet-in path), and every case of the subset that OVS passes must pass on ferrovs (but
//! those using an action listed in `NOT_YET`). A build that refused output to the controller
//! would fail every case at that step; the test then falls back to the script's diagnostic
//! mode (`--no-target-controller-rule`) and says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferrovs_e2e::guest::*;
use ferrovs_e2e::*;
use serde_json::Value;

/// Cases whose rules use an action the pipeline does not have yet: OVS passes them, ferrovs
/// refuses the FLOW_MOD. Remove an entry when the pipeline gains the action (MPLS has: the
/// MPLS variant of every match case pops the label in table 0).
const NOT_YET: &[&str] = &[];

/// The subset: matches and actions the pipeline has (one file per field or action).
const CASES: &str = "{match/00_IN_PORT.json,match/03_ETH_DST.json,match/03_ETH_DST_Mask.json,\
match/04_ETH_SRC.json,match/05_ETH_TYPE.json,match/11_IPV4_SRC.json,match/12_IPV4_DST_Mask.json,\
match/14_TCP_DST_IPv4.json,match/16_UDP_DST_IPv6.json,action/00_OUTPUT.json,action/18_POP_VLAN.json,\
action/15_SET_MPLS_TTL.json,action/16_DEC_MPLS_TTL.json,action/19_PUSH_MPLS.json,action/20_POP_MPLS.json,\
match/09_IP_ECN_IPv4.json,match/24_ARP_SHA.json,match/28_IPV6_FLABEL.json,match/31_IPV6_ND_TARGET.json,\
action/17_PUSH_VLAN.json,action/25_SET_FIELD/19_ICMPV4_TYPE.json,action/25_SET_FIELD/21_ARP_OP.json}";

fn venv() -> PathBuf {
    std::env::var_os("OSKEN_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/osken/venv"))
}

fn tools() -> bool {
    let osken = Command::new(venv().join("bin/python3"))
        .args(["-c", "import os_ken.tests.switch.tester, eventlet"])
        .output()
        .is_ok_and(|o| o.status.success());
    require(
        is_root()
            && have("ip")
            && have("socat")
            && have("ovs-vsctl")
            && have("ovsdb-server")
            && Path::new("/usr/sbin/ovs-vswitchd").exists(),
        "root, ip, socat and OVS (ovs-vswitchd, ovsdb-server, ovs-vsctl)",
    ) && require(
        osken,
        "os-ken and eventlet in target/osken/venv (scripts/deps.sh installs them)",
    )
}

/// One run of the script; the cases' results by (file, case description).
fn run(target: &str, dir: &Path, extra: &[&str]) -> BTreeMap<(String, String), (bool, String)> {
    let json = dir.join(format!("{target}{}.json", extra.len()));
    let bin_dir = bin("ferrovsd").parent().unwrap().to_path_buf();
    let o = Command::new("bash")
        .arg(repo().join("scripts/osken-switch-tests.sh"))
        .args(["--target", target, "--cases", CASES, "--json"])
        .arg(&json)
        .args(extra)
        .env("FERROVS_BIN_DIR", &bin_dir)
        .env("OSKEN_VENV", venv())
        .output()
        .expect("bash runs");
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("--- {target} {extra:?}\n{out}");
    assert!(
        o.status.success(),
        "osken-switch-tests.sh --target {target}: {}{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["not_run"], Value::Array(vec![]), "files not run: {v}");
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                (
                    c["file"].as_str().unwrap().to_string(),
                    c["case"].as_str().unwrap().to_string(),
                ),
                (
                    c["result"] == "OK",
                    c["reason"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn every_case_ovs_passes_passes_on_ferrovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("osken");
    let ovs = run("ovs", &dir, &[]);
    let passed = ovs.values().filter(|(ok, _)| *ok).count();
    assert!(
        passed >= 40,
        "OVS passes only {passed} of {} cases: the harness is broken",
        ovs.len()
    );
    let mut fv = run("ferrovs", &dir, &[]);
    let strict = !fv.values().all(|(ok, reason)| {
        !ok && reason
            .starts_with("Failed to initialize flow tables: OFPErrorMsg[type=0x02, code=0x04]")
    });
    if !strict {
        eprintln!(
            "NOTE: ferrovs refuses output:CONTROLLER (no packet-in yet): diagnostic run without \
             the target's controller rule; cases that need a packet-in are left out"
        );
        fv = run("ferrovs", &dir, &["--no-target-controller-rule"]);
    }
    // A case that timed out waiting for its packet runs once more, its file alone: the
    // tester waits a few seconds, which a busy shared host sometimes outlasts; a case that
    // really fails fails twice.
    let again: std::collections::BTreeSet<String> = fv
        .iter()
        .filter(|(k, (ok, reason))| {
            !ok && reason.starts_with("Receiving timeout") && ovs.get(*k).is_some_and(|o| o.0)
        })
        .map(|(k, _)| k.0.clone())
        .collect();
    for file in &again {
        let args = if strict {
            vec!["--cases", file.as_str()]
        } else {
            vec!["--cases", file.as_str(), "--no-target-controller-rule"]
        };
        for (k, r) in run("ferrovs", &dir, &args) {
            eprintln!("rerun {} {}: {}", k.0, k.1, if r.0 { "OK" } else { &r.1 });
            fv.insert(k, r);
        }
    }
    let mut failed = Vec::new();
    let mut checked = 0;
    for (k, (ok, _)) in &ovs {
        if !ok
            || (!strict && k.1.contains("output:CONTROLLER"))
            || NOT_YET.iter().any(|a| k.1.contains(a))
        {
            continue;
        }
        checked += 1;
        match fv.get(k) {
            Some((true, _)) => {}
            Some((false, reason)) => failed.push(format!("{} {}: {reason}", k.0, k.1)),
            None => failed.push(format!("{} {}: not run", k.0, k.1)),
        }
    }
    assert!(checked >= 20, "only {checked} cases compared");
    assert!(
        failed.is_empty(),
        "{} of {checked} cases OVS passes fail on ferrovs:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Whether this ferrovs has what a reactive controller needs: active controller connections
/// (`ferrovs set-controller`, helper ctrl) and output to the controller (packet-in, helper
/// pktio), checked by asking the daemon's management socket to take an `actions=CONTROLLER`
/// rule.
fn controller_support(dir: &Path, bridge: &str) -> Result<(), String> {
    let help = cli(dir, &["help"]);
    let text =
        String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
    if !text.contains("set-controller") {
        return Err("`ferrovs set-controller` (controller connections) is not merged yet".into());
    }
    let o = Command::new("ovs-ofctl")
        .args(["-O", "OpenFlow13", "add-flow"])
        .arg(format!(
            "unix:{}",
            dir.join(format!("{bridge}.mgmt")).display()
        ))
        .arg("table=200,priority=1,actions=CONTROLLER")
        .output()
        .expect("ovs-ofctl runs");
    if !o.status.success() {
        return Err(format!(
            "output to the controller (packet-in) is not merged yet: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let _ = Command::new("ovs-ofctl")
        .args(["-O", "OpenFlow13", "del-flows"])
        .arg(format!(
            "unix:{}",
            dir.join(format!("{bridge}.mgmt")).display()
        ))
        .arg("table=200")
        .output();
    Ok(())
}

/// Starts the os-ken learning switch (`scripts/osken_learning_switch.py`, its output in
/// `DIR/osken.out`) on a free local port and makes it the only controller of `br`, in
/// fail-mode secure (nothing is forwarded but what the controller decides).
fn learning_switch(dir: &Path, br: &str) -> Proc {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let py = venv().join("bin/python3");
    let script = repo().join("scripts/osken_switch_test.py");
    let port_s = port.to_string();
    let osken = Proc::spawn(
        "osken",
        dir,
        &py,
        &[
            script.to_str().unwrap(),
            "app",
            "osken_learning_switch",
            "--ofp-listen-host",
            "127.0.0.1",
            "--ofp-tcp-listen-port",
            &port_s,
        ],
    );
    for args in [
        vec!["set-bridge", br, "fail-mode=secure", "protocols=OpenFlow13"],
        vec!["set-controller", br, &format!("tcp:127.0.0.1:{port}")],
    ] {
        let o = cli(dir, &args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    osken
}

/// A reactive controller written with os-ken (`scripts/osken_learning_switch.py`, a learning
/// switch: table-miss to the controller, PACKET_OUT of each packet-in, a FLOW_MOD per learned
/// destination; PyPI's os-ken ships no sample apps) drives
/// ferrovs between two namespaces behind AF_PACKET uplinks; pings cross, and the rules it
/// installed (priority 1, `in_port` and `eth_dst`) carry them.
#[test]
fn an_os_ken_learning_switch_connects_two_namespaces_through_ferrovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("osken-l2");
    let (core, _) = cores();
    let _sw = start_switch(&dir, core, &[]);
    let br = "brl2";
    let o = cli(&dir, &["add-bridge", br]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until("management socket", 10, || {
        dir.join(format!("{br}.mgmt")).exists()
    });
    // Both are in: a failure here is a regression, never a skip.
    controller_support(&dir, br).expect("controller connections and packet-in");
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("ol1-"), Net::name("ol2-"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (i, ns) in [(1, &ns1), (2, &ns2)] {
        let (a, b) = (Net::name(&format!("ola{i}")), Net::name(&format!("olb{i}")));
        net.veth_into(&a, &b, ns, &format!("10.77.0.{i}/24"));
        Net::ip(&["link", "set", &a, "up"]);
        let o = cli(
            &dir,
            &[
                "add-port",
                br,
                &format!("l2p{i}"),
                "type=uplink",
                &format!("dev={a}"),
                "mode=af_packet",
                &format!("ofport={i}"),
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let _osken = learning_switch(&dir, br);
    let d = dir.display().to_string();
    let mgmt = format!("unix:{d}/{br}.mgmt");
    let flows = || {
        let o = Command::new("ovs-ofctl")
            .args(["-O", "OpenFlow13", "dump-flows", &mgmt])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // The controller's table-miss rule appears once it is connected.
    wait_until("the learning switch's table-miss rule", 30, || {
        flows().contains("priority=0 actions=CONTROLLER")
    });
    let ping = |ns: &str, to: &str| {
        Net::exec(ns, &["ping", "-c", "3", "-i", "0.2", "-W", "2", to])
            .status
            .success()
    };
    assert!(
        ping(&ns1, "10.77.0.2"),
        "ns1 -> ns2 through the learning switch"
    );
    assert!(ping(&ns2, "10.77.0.1"), "ns2 -> ns1");
    let f = flows();
    let learned = f
        .lines()
        .filter(|l| l.contains("priority=1,") && l.contains("dl_dst="))
        .count();
    assert!(learned >= 2, "the learning switch installed no rules:\n{f}");
    drop(net);
}

/// The learning switch's report of one PACKET_IN (`LEARNING-SWITCH packet-in ...` on its
/// stdout): (in_port, src, dst).
fn packet_ins(dir: &Path) -> Vec<(u32, String, String)> {
    let out = std::fs::read_to_string(dir.join("osken.out")).unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_once("LEARNING-SWITCH packet-in ").map(|(_, r)| r))
        .map(|r| {
            let f = |k: &str| {
                r.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap_or("")
                    .to_string()
            };
            (f("in_port=").parse().unwrap_or(0), f("src="), f("dst="))
        })
        .collect()
}

/// `n_packets` of the rules (lines of `ovs-ofctl dump-flows`) that contain every one of
/// `parts`, summed; with how many there were.
fn rule_packets(dump: &str, parts: &[&str]) -> (usize, u64) {
    let lines: Vec<&str> = dump
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .collect();
    let n = lines
        .iter()
        .filter_map(|l| {
            l.split([',', ' '])
                .find_map(|w| w.strip_prefix("n_packets="))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum();
    (lines.len(), n)
}

/// The same learning switch between two real guests (QEMU, TCG) on vhost-user ports of a
/// bridge in fail-mode secure whose only controller it is. The guests' first pings reach the
/// controller as packet-ins (the table-miss rule), it learns both MACs and installs one rule
/// per direction (priority 1, `in_port` and `eth_dst`), seen in `ferrovs dump-flows` and
/// `ovs-ofctl dump-flows`. After that 20 pings, a TCP stream and a sequenced UDP stream
/// between the guests lose nothing and go by those rules alone: their packet counters grow by
/// at least what was sent, while no further packet-in between the two guests' addresses
/// reaches the controller (broadcast and multicast, IPv6's router solicitations and MLD
/// reports, still go to it: they are never learned).
#[test]
fn an_os_ken_learning_switch_connects_two_qemu_guests_through_ferrovs() {
    if !tools() || !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("osken-guests");
    let (core, _) = cores();
    let _sw = start_switch(&dir, core, &[]);
    let br = "brq";
    let o = cli(&dir, &["add-bridge", br]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until("management socket", 10, || {
        dir.join(format!("{br}.mgmt")).exists()
    });
    controller_support(&dir, br).expect("controller connections and packet-in");
    let (mac_a, mac_b) = ("52:54:00:00:0a:01", "52:54:00:00:0a:02");
    for (i, port) in [(1, "qa"), (2, "qb")] {
        let sock = dir.join(format!("{port}.sock")).display().to_string();
        let o = cli(
            &dir,
            &[
                "add-port",
                br,
                port,
                "type=vhost-user",
                &format!("path={sock}"),
                &format!("ofport={i}"),
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wait_until("port socket", 10, || Path::new(&sock).exists());
    }
    let _osken = learning_switch(&dir, br);
    let mgmt = dir.join(format!("{br}.mgmt"));
    let flows = || ofctl_ok(&mgmt, "dump-flows", &[]);
    wait_until("the learning switch's table-miss rule", 30, || {
        flows().contains("priority=0 actions=CONTROLLER")
    });
    // Both take commands on their consoles; B receives a TCP and then a UDP stream.
    let mut guests = Vec::new();
    for (name, port, mac, append) in [
        (
            "a",
            "qa",
            mac_a,
            "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.control=1",
        ),
        (
            "b",
            "qb",
            mac_b,
            "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.control=1 \
             ferrovs.args=tcp-recv,5000+udp-recv,5001,3",
        ),
    ] {
        let sock = dir.join(format!("{port}.sock")).display().to_string();
        let mut g = Guest::new(
            name,
            &format!("socket,id=c0,path={sock},reconnect=1"),
            mac,
            append,
        );
        g.control = true;
        guests.push(g.start(&dir, &img));
    }
    wait_console(&dir, "a", &[&format!("FERROVS-GUEST-READY {mac_a}")], 120);
    wait_console(&dir, "b", &["FERROVS-LISTENING"], 120);
    // Runs a console command on A; the console text it produced once `done` appears.
    let on_a = |cmd: &str, done: &[&str], secs: u64| -> (String, String) {
        let from = console(&dir, "a").len();
        console_command(&dir, "a", cmd);
        let t = Instant::now();
        loop {
            let text = console(&dir, "a");
            let new = text.get(from..).unwrap_or("").to_string();
            if let Some(m) = done.iter().find(|m| new.contains(**m)) {
                return (m.to_string(), new);
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "a: `{cmd}` did not end within {secs}s:\n{new}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let between = |(_, src, dst): &(u32, String, String)| {
        (src == mac_a && dst == mac_b) || (src == mac_b && dst == mac_a)
    };

    // Learning: the first pings go through the controller.
    let (v, out) = on_a(
        "ping 10.0.0.2 3",
        &["FERROVS-PING-OK", "FERROVS-PING-FAIL"],
        60,
    );
    assert_eq!(v, "FERROVS-PING-OK", "{out}");
    let learned = |f: &str| {
        let to_b = rule_packets(f, &["priority=1,", "in_port=1", &format!("dl_dst={mac_b}")]);
        let to_a = rule_packets(f, &["priority=1,", "in_port=2", &format!("dl_dst={mac_a}")]);
        (to_b, to_a)
    };
    wait_until("both learned rules", 10, || {
        let (b, a) = learned(&flows());
        b.0 == 1 && a.0 == 1
    });
    let ins0 = packet_ins(&dir);
    assert!(
        ins0.iter().any(|p| p.0 == 1 && p.1 == mac_a)
            && ins0.iter().any(|p| p.0 == 2 && p.1 == mac_b),
        "packet-ins from both guests reached the controller: {ins0:?}"
    );
    // The CLI shows the controller's rules too.
    let fv = cli_json(&dir, &["dump-flows", br]);
    let fv_text = fv.to_string();
    for mac in [mac_a, mac_b] {
        assert!(
            fv_text.contains(&format!("dl_dst={mac}")),
            "ferrovs dump-flows {br} shows the rule to {mac}: {fv}"
        );
    }
    let f0 = flows();
    let (to_b0, to_a0) = learned(&f0);
    let unicast0 = ins0.iter().filter(|p| between(p)).count();

    // Learned: pings, then a TCP and a UDP stream, by the rules alone.
    let (v, out) = on_a(
        "ping 10.0.0.2 20",
        &["FERROVS-PING-OK", "FERROVS-PING-FAIL"],
        60,
    );
    assert_eq!(v, "FERROVS-PING-OK", "{out}");
    assert!(
        out.contains("20 packets transmitted, 20 packets received"),
        "no ping lost once learned:\n{out}"
    );
    let (v, out) = on_a(
        "tool tcp-send,10.0.0.2,5000,3,50+sleep,1+udp-send,10.0.0.2,5001,200,1000,200",
        &["FERROVS-TOOL-CMD-DONE"],
        120,
    );
    assert!(!out.contains("FERROVS-ERROR"), "{v}: {out}");
    wait_console(&dir, "b", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 60);
    let (ra, rb) = (tagged(&out, "FERROVS-RESULT"), results(&dir, "b"));
    assert_eq!((ra.len(), rb.len()), (2, 2), "a: {ra:?} b: {rb:?}");
    assert!(ra[0]["bytes"].as_u64().unwrap_or(0) > 0, "{}", ra[0]);
    assert_eq!(ra[0]["bytes"], rb[0]["bytes"], "every TCP byte arrived");
    let g = |k: &str| ra[0][k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        (g("fast_retransmits"), g("timeouts")),
        (0, 0),
        "no TCP segment lost: {}",
        ra[0]
    );
    assert_eq!(rb[1]["received"], 1000, "{}", rb[1]);
    assert_eq!(rb[1]["lost"], 0, "{}", rb[1]);
    let f1 = flows();
    let (to_b1, to_a1) = learned(&f1);
    let ins1 = packet_ins(&dir);
    let unicast1 = ins1.iter().filter(|p| between(p)).count();
    eprintln!(
        "packet-ins: {} while learning ({unicast0} between the guests), {} after ({unicast1}); \
         rule A->B n_packets {} -> {}, B->A {} -> {}; tcp {} / {}; udp {}",
        ins0.len(),
        ins1.len(),
        to_b0.1,
        to_b1.1,
        to_a0.1,
        to_a1.1,
        ra[0],
        rb[0],
        rb[1]
    );
    assert_eq!(
        unicast1,
        unicast0,
        "no packet-in between the guests once learned: {:?}",
        &ins1[ins0.len()..]
    );
    assert!(
        to_b1.1 - to_b0.1 > 20 + 1000,
        "A->B traffic went by the learned rule: {} -> {}\n{f1}",
        to_b0.1,
        to_b1.1
    );
    assert!(
        to_a1.1 - to_a0.1 >= 20,
        "B->A replies went by the learned rule: {} -> {}\n{f1}",
        to_a0.1,
        to_a1.1
    );
    let stats = cli_json(&dir, &["port-stats"]);
    for p in stats.as_array().unwrap() {
        for q in p["queues"].as_array().unwrap() {
            assert!(q["broken"].is_null(), "{}: {q}", p["port"]);
        }
        for d in ["rx", "tx"] {
            for r in GUEST_ERRORS {
                assert!(p[d]["drops"][r].is_null(), "{} {d}: {}", p["port"], p[d]);
            }
        }
    }
    drop(guests);
}
