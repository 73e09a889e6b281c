//! os-ken's switch test tool (PyPI `os-ken`, `os_ken/tests/switch/tester.py`) against
//! ferrovs, with OVS as the reference, through `scripts/osken-switch-tests.sh`: an OVS netdev
//! bridge in a namespace is the tester switch, veth pairs join it to the target, and os-ken
//! drives both. Here a subset of the OpenFlow 1.3 match and action cases runs (the whole
//! suite is the script's own command, its counts in docs/openflow.md): first against OVS,
//! then against ferrovs, and every case OVS passes must pass on ferrovs.
//!
//! Before every case the tester installs `in_port=2,actions=CONTROLLER` in the target. While
//! ferrovs refuses output to the controller (packet-in is not merged yet) every case fails
//! at that step; the test then runs the script's diagnostic mode
//! (`--no-target-controller-rule`, the tester keeps its own rule) and leaves out the cases
//! that need a packet-in from the target. Once ferrovs takes the rule, the strict run
//! counts and every case of the subset must pass as on OVS (but those using an action
//! listed in `NOT_YET`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

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
action/15_SET_MPLS_TTL.json,action/16_DEC_MPLS_TTL.json,action/19_PUSH_MPLS.json,action/20_POP_MPLS.json}";

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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = dir.display().to_string();
    let py = venv().join("bin/python3");
    let script = repo().join("scripts/osken_switch_test.py");
    let port_s = port.to_string();
    let _osken = Proc::spawn(
        "osken",
        &dir,
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
        let o = cli(&dir, &args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
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
