//! Kernel ports with real processes and real namespaces: a TAP port created by ferrovs and
//! an uplink (one end of a veth pair, AF_PACKET) carry pings between two network
//! namespaces, traffic flows between a vhost-user guest and the uplink both ways, a hot
//! upgrade in the middle of a ping loses nothing, and bad port requests are refused
//! precisely while the daemon carries on.
//!
//! Each test makes its own namespaces and links (names carry the pid) and deletes them at
//! the end, also on failure ([`Net`]). They need root; outside CI they skip without it.

use std::path::Path;
use std::time::Duration;

use ferrovs_e2e::*;
use serde_json::Value;

fn privileged() -> bool {
    require(
        is_root() && have("ip") && have("ping") && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping and /dev/net/tun (network namespaces, veth, TAP)",
    )
}

fn add_port(dir: &Path, args: &[&str]) {
    let mut a = vec!["add-port", "br0"];
    a.extend_from_slice(args);
    let o = cli(dir, &a);
    assert!(
        o.status.success(),
        "ferrovs {}: {}",
        a.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `ferrovs add-port` that must fail: returns its error message.
fn refused(dir: &Path, args: &[&str]) -> String {
    let mut a = vec!["add-port", "br0"];
    a.extend_from_slice(args);
    let o = cli(dir, &a);
    assert!(!o.status.success(), "ferrovs {} was accepted", a.join(" "));
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

fn port<'a>(show: &'a Value, name: &str) -> &'a Value {
    show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name} in {show}"))
}

/// The setup of the first tests: namespace `ns1` with a veth end 10.9.0.1/24 whose peer is
/// uplink `u1`; namespace `ns2` with the TAP of port `t1` (created by ferrovs) as 10.9.0.2/24.
struct Pair {
    net: Net,
    ns1: String,
    ns2: String,
    veth: String,
    uplink: String,
    tap: String,
}

fn two_namespaces(dir: &Path) -> Pair {
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("ns1-"), Net::name("ns2-"));
    let (uplink, veth, tap) = (Net::name("u"), Net::name("v"), Net::name("t"));
    net.netns(&ns1);
    net.netns(&ns2);
    net.veth_into(&uplink, &veth, &ns1, "10.9.0.1/24");
    add_port(dir, &["u1", "type=uplink", &format!("dev={uplink}")]);
    net.track_link(&tap);
    add_port(dir, &["t1", "type=tap", &format!("dev={tap}")]);
    // A TAP keeps its fd when moved to another namespace.
    net.move_into(&tap, &ns2, "10.9.0.2/24");
    Pair {
        net,
        ns1,
        ns2,
        veth,
        uplink,
        tap,
    }
}

/// Pings `to` from `ns`: (transmitted, received) as ping reports them.
fn ping(ns: &str, to: &str, count: u32, interval: &str) -> (u64, u64, String) {
    let c = count.to_string();
    let o = Net::exec(ns, &["ping", "-c", &c, "-i", interval, "-W", "2", to]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {out}"))
        .to_string();
    let num = |key: &str| -> u64 {
        let i = line.find(key).unwrap();
        line[..i]
            .trim()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (num(" packets transmitted"), num(" received"), out)
}

#[test]
fn namespaces_ping_each_other_through_uplink_and_tap() {
    if !privileged() {
        return;
    }
    let dir = run_dir("kp-ping");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let p = two_namespaces(&dir);
    let (sent, got, out) = ping(&p.ns1, "10.9.0.2", 5, "0.2");
    assert_eq!((sent, got), (5, 5), "{out}");
    let show = cli_json(&dir, &["show"]);
    let u1 = port(&show, "u1");
    assert_eq!(u1["type"], "uplink", "{u1}");
    assert_eq!(u1["mode"], "af_packet", "{u1}");
    assert_eq!(u1["dev"], p.uplink.as_str(), "{u1}");
    assert_eq!(u1["state"], "attached", "{u1}");
    assert_eq!(u1["kernel"]["rx"], "tpacket_v3", "{u1}");
    let t1 = port(&show, "t1");
    assert_eq!(t1["mode"], "tap", "{t1}");
    assert_eq!(t1["kernel"]["vnet_hdr_len"], 12, "{t1}");
    // The text form names the mode too.
    let text = String::from_utf8_lossy(&cli(&dir, &["show"]).stdout).into_owned();
    assert!(
        text.contains(&format!("dev {} mode af_packet", p.uplink)),
        "{text}"
    );
    // Both directions counted on both ports, nothing dropped on the way.
    let st = cli_json(&dir, &["port-stats"]);
    for name in ["u1", "t1"] {
        let s = st
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["port"] == name)
            .unwrap();
        for d in ["rx", "tx"] {
            assert!(s[d]["packets"].as_u64().unwrap() >= 5, "{name} {d}: {s}");
        }
        assert_eq!(s["queues"][1]["direction"], "from-kernel", "{s}");
    }
    let t1_rx = &st
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["port"] == "t1")
        .unwrap()["rx"];
    assert_eq!(t1_rx["dropped"], 0, "{t1_rx}");
    // The way back too: ns2 pings ns1.
    let (sent, got, out) = ping(&p.ns2, "10.9.0.1", 3, "0.2");
    assert_eq!((sent, got), (3, 3), "{out}");
    // Deleting the ports closes the TAP (ferrovs created it) and leaves the veth alone.
    for n in ["t1", "u1"] {
        assert!(cli(&dir, &["del-port", "br0", n]).status.success());
    }
    let (_, got, _) = ping(&p.ns1, "10.9.0.2", 1, "0.2");
    assert_eq!(got, 0);
    let links = Net::exec(&p.ns1, &["ip", "link", "show", &p.veth]);
    assert!(links.status.success(), "the veth stays");
    wait_until("TAP gone with its port", 5, || {
        !Net::exec(&p.ns2, &["ip", "link", "show", &p.tap])
            .status
            .success()
    });
    drop(p.net);
}

#[test]
fn vhost_user_guest_and_uplink_exchange_traffic_both_ways() {
    if !privileged() {
        return;
    }
    let dir = run_dir("kp-gen");
    let (pmd, core) = cores();
    let core = core.to_string();
    let gen = bin("ferrovs-gen").display().to_string();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let _sw = start_switch(&dir, pmd, &[]);
    let mut net = Net::new();
    let ns1 = Net::name("ns1-");
    let (uplink, veth) = (Net::name("u"), Net::name("v"));
    net.netns(&ns1);
    net.veth_into(&uplink, &veth, &ns1, "10.9.0.1/24");
    add_port(&dir, &["u1", "type=uplink", &format!("dev={uplink}")]);

    // Guest → uplink: 2000 frames from vm1 (to an unknown address: flooded) reach ns1.
    // (Nothing is sent to u1 before: ns1's own frames come from u1 and go elsewhere.)
    let before = Net::counter(&ns1, &veth, "rx_packets");
    let tx = Proc::spawn(
        "tx",
        &dir,
        Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen,
            "--socket",
            &vm1,
            "--count",
            "2000",
            "--rate",
            "20000",
            "--quiet",
            "--duration",
            "20",
            "txonly",
        ],
    );
    let r = tx.wait_json(&dir, Duration::from_secs(30));
    assert_eq!(r["sent"], 2000, "{r}");
    let delivered = || Net::counter(&ns1, &veth, "rx_packets") - before;
    // Only vm1's frames go to u1 here: each one was sent or counted as a drop, and never as
    // a link down (the link is up; a veth's full queue is kernel_tx_full).
    let u1 = &cli_json(&dir, &["port-stats", "u1"])[0];
    let (sent, dropped) = (
        u1["tx"]["packets"].as_u64().unwrap(),
        u1["tx"]["dropped"].as_u64().unwrap(),
    );
    assert_eq!(sent + dropped, 2000, "{u1}");
    assert!(dropped <= 20, "{u1}");
    assert!(u1["tx"]["drops"].get("kernel_link_down").is_none(), "{u1}");
    wait_until("frames in ns1", 5, || delivered() >= sent);

    // Uplink → guest: ns1 sends 50 pings to the guest's address (learned on vm1 above).
    let rx = Proc::spawn(
        "rx",
        &dir,
        Path::new("/usr/bin/taskset"),
        &[
            "-c",
            &core,
            &gen,
            "--socket",
            &vm1,
            "--quiet",
            "--duration",
            "6",
            "rxonly",
        ],
    );
    wait_until("vm1 connected", 10, || {
        port(&cli_json(&dir, &["show"]), "vm1")["state"] == "connected"
    });
    Net::ip(&[
        "-n",
        &ns1,
        "neigh",
        "add",
        "10.9.0.3",
        "lladdr",
        "02:00:00:00:00:01",
        "dev",
        &veth,
    ]);
    let vm1_before = cli_json(&dir, &["port-stats", "vm1"])[0]["tx"]["packets"]
        .as_u64()
        .unwrap();
    // No reply comes (the guest only counts): ping's exit status is not the point.
    let _ = ping(&ns1, "10.9.0.3", 50, "0.02");
    let r = rx.wait_json(&dir, Duration::from_secs(30));
    assert!(
        r["foreign"].as_u64().unwrap() >= 50,
        "guest saw the pings: {r}"
    );
    let vm1_after = cli_json(&dir, &["port-stats", "vm1"])[0]["tx"]["packets"]
        .as_u64()
        .unwrap();
    assert!(vm1_after - vm1_before >= 50, "{vm1_before} -> {vm1_after}");
    let u1 = &cli_json(&dir, &["port-stats", "u1"])[0];
    assert!(u1["rx"]["packets"].as_u64().unwrap() >= 50, "{u1}");
    drop(net);
}

#[test]
fn hot_upgrade_in_the_middle_of_a_ping_loses_nothing() {
    if !privileged() {
        return;
    }
    let dir = run_dir("kp-upgrade");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let p = two_namespaces(&dir);
    let first = daemon_pid(&dir);
    // 100 pings at 20 per second (5 s), two upgrades while they run.
    let pinger = {
        let ns1 = p.ns1.clone();
        std::thread::spawn(move || ping(&ns1, "10.9.0.2", 100, "0.05"))
    };
    let mut pids = vec![first];
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(1500));
        let r = upgrade(&dir, &[]).expect("upgrade");
        assert_eq!(r["ok"], true, "{r}");
        // vm1, vm2 (vhost-user, 2 queues each), u1 and t1 (2 counter sets each).
        assert_eq!(r["ports"], 4, "{r}");
        assert_eq!(r["queues"], 8, "{r}");
        let pid = daemon_pid(&dir);
        assert!(!pids.contains(&pid));
        pids.push(pid);
    }
    let (sent, got, out) = pinger.join().unwrap();
    assert_eq!(
        (sent, got),
        (100, 100),
        "no ping lost across two upgrades:\n{out}"
    );
    for old in &pids[..2] {
        wait_until("old daemon gone", 5, || !alive(*old));
    }
    // Counters carried over: the new daemon counts every ping of the run.
    let st = cli_json(&dir, &["port-stats", "t1"]);
    assert!(st[0]["tx"]["packets"].as_u64().unwrap() >= 100, "{st}");
    let show = cli_json(&dir, &["show"]);
    assert_eq!(show["upgrades"], 2);
    assert_eq!(port(&show, "u1")["mode"], "af_packet");
    // After the takeover the ports still work in both directions.
    let (sent, got, out) = ping(&p.ns2, "10.9.0.1", 3, "0.2");
    assert_eq!((sent, got), (3, 3), "{out}");
    drop(p.net);
}

#[test]
fn bad_kernel_port_requests_are_refused_precisely() {
    let dir = run_dir("kp-bad");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let pid = daemon_pid(&dir);
    let missing = Net::name("nx");
    assert_eq!(
        refused(&dir, &["t1", "type=tap"]),
        "ferrovs: port t1: dev=NETDEV is required for tap ports"
    );
    assert_eq!(
        refused(&dir, &["u1", "type=uplink"]),
        "ferrovs: port u1: dev=NETDEV is required for uplink ports"
    );
    assert_eq!(
        refused(&dir, &["u1", "type=uplink", &format!("dev={missing}")]),
        format!("ferrovs: port u1: no network device named {missing}")
    );
    assert_eq!(
        refused(&dir, &["u1", "type=uplink", "dev=abcdefghijklmnop"]),
        "ferrovs: port u1: dev=abcdefghijklmnop: network device name 'abcdefghijklmnop' is \
         longer than 15 bytes"
    );
    assert_eq!(
        refused(&dir, &["t1", "type=tap", "dev=a/b"]),
        "ferrovs: port t1: dev=a/b: network device name 'a/b' is invalid (no '/', ':', \
         whitespace, '.' or '..')"
    );
    assert!(refused(&dir, &["t1", "type=tap", "dev=x", "queues=2"])
        .contains("queues=2: tap ports have one queue"));
    assert!(
        refused(&dir, &["t1", "type=tap", "dev=x", "path=/tmp/x.sock"])
            .contains("path=/tmp/x.sock is for vhost-user ports")
    );
    if is_root() && have("ip") {
        // A name that exists and is not a TAP; the same netdev for two ports.
        let mut net = Net::new();
        let (a, b) = (Net::name("a"), Net::name("b"));
        Net::ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        net.track_link(&a);
        assert_eq!(
            refused(&dir, &["t1", "type=tap", &format!("dev={a}")]),
            format!("ferrovs: port t1: {a} exists and is not a TAP device")
        );
        add_port(&dir, &["u1", "type=uplink", &format!("dev={a}")]);
        assert_eq!(
            refused(&dir, &["u2", "type=uplink", &format!("dev={a}")]),
            format!("ferrovs: port u2: dev {a} is already used by port u1")
        );
        assert!(cli(&dir, &["del-port", "br0", "u1"]).status.success());
        drop(net);
    }
    // The daemon carries on, unchanged.
    assert_eq!(daemon_pid(&dir), pid);
    let show = cli_json(&dir, &["show"]);
    let names: Vec<&str> = show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vm1", "vm2"], "{show}");
    assert!(show["bad_control_requests"].as_u64().unwrap() >= 7);
    let saved = std::fs::read_to_string(dir.join("ferrovs.conf.json")).unwrap();
    assert!(
        !saved.contains("uplink") && !saved.contains("\"tap\""),
        "{saved}"
    );
}
