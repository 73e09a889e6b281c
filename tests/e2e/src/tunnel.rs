//! What the tunnel tests (`vxlan.rs`, `geneve.rs`) share: a switch per network namespace,
//! an underlay veth between two namespaces, TCP through a tunnel with iperf3, and a ping
//! across a hot upgrade of one side.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{bin, cli, cli_json, wait_until, Net, Proc};

/// `ferrovs ARGS` on `dir`, which must succeed.
pub fn ok(dir: &Path, args: &[&str]) {
    let o = cli(dir, args);
    assert!(
        o.status.success(),
        "ferrovs {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// ferrovsd on `dir` inside namespace `ns`, its PMD on `core`, answering its control socket.
pub fn switch_in(ns: &str, dir: &Path, core: usize) -> Proc {
    let d = dir.display().to_string();
    let c = core.to_string();
    let f = bin("ferrovsd").display().to_string();
    let p = Proc::spawn(
        "ferrovsd",
        dir,
        Path::new("/usr/sbin/ip"),
        &["netns", "exec", ns, &f, "--run-dir", &d, "--pmd-cores", &c],
    );
    wait_until("control socket", 10, || {
        dir.join("ferrovs.ctl").exists() && cli(dir, &["show"]).status.success()
    });
    p
}

/// An underlay link: a veth pair `a` (in `ns_a`, `addr_a`) -- `b` (in `ns_b`, `addr_b`),
/// MTU 1600 on both ends (room for the outer headers around a 1500-byte inner MTU).
pub fn underlay(
    net: &mut Net,
    a: &str,
    ns_a: &str,
    addr_a: &str,
    b: &str,
    ns_b: &str,
    addr_b: &str,
) {
    net.veth_into(a, b, ns_b, addr_b);
    Net::ip(&["link", "set", a, "netns", ns_a]);
    Net::ip(&["-n", ns_a, "addr", "add", addr_a, "dev", a]);
    Net::ip(&["-n", ns_a, "link", "set", a, "up"]);
    Net::ip(&["-n", ns_a, "link", "set", a, "mtu", "1600"]);
    Net::ip(&["-n", ns_b, "link", "set", b, "mtu", "1600"]);
}

/// Waits up to 10 s for `c` to end, then kills it.
pub fn wait(mut c: Child) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    c.wait().ok()
}

/// Two seconds of iperf3 TCP from namespace `client` to a one-shot server on `server_addr`
/// in namespace `server`; asserts more than a megabyte arrived (`dir`'s port statistics
/// in the message if not).
pub fn iperf3_through(client: &str, server: &str, server_addr: &str, dir: &Path) {
    let srv = Command::new("ip")
        .args([
            "netns",
            "exec",
            server,
            "iperf3",
            "-s",
            "-1",
            "-B",
            server_addr,
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let o = Net::exec(
        client,
        &[
            "timeout",
            "30",
            "iperf3",
            "-c",
            server_addr,
            "-t",
            "2",
            "-J",
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let _ = wait(srv);
    let bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(
        bytes > 1_000_000,
        "iperf3 through the tunnel: {} {}; switch: {}",
        v["error"],
        String::from_utf8_lossy(&o.stderr),
        cli_json(dir, &["port-stats"])
    );
}

/// A ping from namespace `ns` to `to` (60 at 50 ms) while the switch on `dir` (in `ns`) is
/// hot-upgraded: none may be lost, and the daemon counts one upgrade. Returns its `show`.
pub fn ping_across_upgrade(ns: &str, dir: &Path, to: &str) -> Value {
    let ping = Command::new("ip")
        .args([
            "netns", "exec", ns, "ping", "-c", "60", "-i", "0.05", "-W", "2", to,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let f = bin("ferrovs").display().to_string();
    let d = dir.display().to_string();
    let up = Net::exec(ns, &[&f, "--run-dir", &d, "upgrade", "--json"]);
    assert!(
        up.status.success(),
        "upgrade: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let out = ping.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains(" 0% packet loss"),
        "ping across the upgrade:\n{out}"
    );
    let show = cli_json(dir, &["show"]);
    assert_eq!(show["upgrades"], 1, "{show}");
    show
}

/// Stops the upgraded daemon of `show` (its pid changed: `Proc` holds the old one) and both
/// original processes.
pub fn stop_pair(show: &Value, a: &mut Proc, b: &mut Proc) {
    if let Some(pid) = show["pid"].as_u64() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    a.kill();
    b.kill();
}

/// The port named `name` in the first bridge of a `show`.
pub fn port_of<'a>(show: &'a Value, name: &str) -> &'a Value {
    show["bridges"][0]["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no port {name}: {show}"))
}
