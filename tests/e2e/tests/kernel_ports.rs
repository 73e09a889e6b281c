//! Kernel ports with real processes and real namespaces: a TAP port created by ferrovs and
//! an uplink (one end of a veth pair) carry pings between two network namespaces, traffic
//! flows between a vhost-user guest and the uplink both ways, a hot upgrade in the middle of
//! a ping loses nothing, and bad port requests are refused precisely while the daemon
//! carries on. The uplink tests run twice: AF_XDP (the default on a veth) and AF_PACKET
//! (`mode=af_packet`); 100 upgrades of an AF_XDP uplink under ping leak no fd and no frame.
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

/// `mode=` for an uplink (none: the automatic choice, AF_PACKET on a veth: a virtual
/// device) and the mode `show` must report.
fn mode_opt(mode: &str) -> (Option<String>, &'static str) {
    match mode {
        "af_packet" => (Some("mode=af_packet".into()), "af_packet"),
        "af_xdp" => (Some("mode=af_xdp".into()), "af_xdp"),
        _ => (None, "af_packet"),
    }
}

fn add_uplink(dir: &Path, name: &str, dev: &str, mode: &str) {
    let dev = format!("dev={dev}");
    let mut args = vec![name, "type=uplink", &dev];
    let (opt, _) = mode_opt(mode);
    if let Some(o) = &opt {
        args.push(o);
    }
    add_port(dir, &args);
}

fn two_namespaces(dir: &Path, mode: &str) -> Pair {
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("ns1-"), Net::name("ns2-"));
    let (uplink, veth, tap) = (Net::name("u"), Net::name("v"), Net::name("t"));
    net.netns(&ns1);
    net.netns(&ns2);
    net.veth_into(&uplink, &veth, &ns1, "10.9.0.1/24");
    if mode == "af_xdp" {
        // The namespace's stack leaves TCP/UDP checksums to the device (partial); AF_XDP
        // carries no word of it. A physical wire never carries partial checksums: with
        // checksumming done by the peer's stack, the veth stands in for one.
        no_partial_checksums(&ns1, &veth);
    }
    add_uplink(dir, "u1", &uplink, mode);
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
    ping_summary(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// (transmitted, received) from ping's output.
fn ping_summary(out: String) -> (u64, u64, String) {
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

/// Turns off transmit checksumming (and so TSO) on `dev` in `ns`: its stack then sends
/// complete frames, as a physical wire delivers them.
fn no_partial_checksums(ns: &str, dev: &str) {
    let o = Net::exec(ns, &["ethtool", "-K", dev, "tx", "off"]);
    assert!(o.status.success(), "ethtool -K {dev} tx off: {o:?}");
}

#[test]
fn namespaces_ping_each_other_through_uplink_and_tap_af_xdp() {
    namespaces_ping_each_other("af_xdp");
}

#[test]
fn namespaces_ping_each_other_through_uplink_and_tap_af_packet() {
    namespaces_ping_each_other("auto");
    namespaces_ping_each_other("af_packet");
}

fn namespaces_ping_each_other(mode: &str) {
    if !privileged() {
        return;
    }
    let (_, want) = mode_opt(mode);
    let dir = run_dir("kp-ping");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let p = two_namespaces(&dir, mode);
    let (sent, got, out) = ping(&p.ns1, "10.9.0.2", 5, "0.2");
    assert_eq!((sent, got), (5, 5), "{out}");
    let show = cli_json(&dir, &["show"]);
    let u1 = port(&show, "u1");
    assert_eq!(u1["type"], "uplink", "{u1}");
    assert_eq!(u1["mode"], want, "{u1}");
    assert_eq!(u1["dev"], p.uplink.as_str(), "{u1}");
    assert_eq!(u1["state"], "attached", "{u1}");
    if mode == "auto" {
        // A veth is virtual: AF_PACKET, for the offload metadata, and `show` says why.
        let why = u1["mode_fallback_reason"].as_str().unwrap_or_default();
        assert!(why.contains("is a virtual device"), "{u1}");
    } else {
        assert_eq!(u1["mode_fallback_reason"], Value::Null, "{u1}");
    }
    if want == "af_xdp" {
        // A veth: XDP in the driver, copy mode (no zero-copy), every receive frame with
        // the kernel between bursts.
        assert_eq!(u1["kernel"]["rx"], "af_xdp", "{u1}");
        assert_eq!(u1["kernel"]["bind"], "copy", "{u1}");
        assert_eq!(
            u1["kernel"]["rx_frames_with_kernel"], u1["kernel"]["umem_rx_frames"],
            "{u1}"
        );
    } else {
        assert_eq!(u1["kernel"]["rx"], "tpacket_v3", "{u1}");
        // The forced mode is saved with the port.
        let saved = std::fs::read_to_string(dir.join("ferrovs.conf.json")).unwrap();
        assert_eq!(
            saved.contains("\"mode\": \"af_packet\""),
            mode == "af_packet",
            "{saved}"
        );
    }
    let t1 = port(&show, "t1");
    assert_eq!(t1["mode"], "tap", "{t1}");
    assert_eq!(t1["kernel"]["vnet_hdr_len"], 12, "{t1}");
    // The text form names the mode too.
    let text = String::from_utf8_lossy(&cli(&dir, &["show"]).stdout).into_owned();
    assert!(
        text.contains(&format!("dev {} mode {want}", p.uplink)),
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
fn vhost_user_guest_and_uplink_exchange_traffic_both_ways_af_xdp() {
    guest_and_uplink_exchange_traffic("af_xdp");
}

#[test]
fn vhost_user_guest_and_uplink_exchange_traffic_both_ways_af_packet() {
    guest_and_uplink_exchange_traffic("af_packet");
}

fn guest_and_uplink_exchange_traffic(mode: &str) {
    if !privileged() {
        return;
    }
    let (_, want) = mode_opt(mode);
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
    add_uplink(&dir, "u1", &uplink, mode);
    assert_eq!(port(&cli_json(&dir, &["show"]), "u1")["mode"], want);
    // The uplink was just brought up: a veth refuses frames until its carrier is on.
    wait_until("uplink carrier", 5, || {
        std::fs::read_to_string(format!("/sys/class/net/{uplink}/operstate"))
            .is_ok_and(|s| s.trim() == "up")
    });

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
    // A veth refuses a send when its peer's backlog is full (ENOBUFS: the rest of that
    // burst is refused too, and counted); on a loaded machine that can be one whole burst.
    assert!(dropped <= 2 * 32, "{u1}");
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
fn hot_upgrade_in_the_middle_of_a_ping_loses_nothing_af_xdp() {
    hot_upgrade_mid_ping("af_xdp");
}

#[test]
fn hot_upgrade_in_the_middle_of_a_ping_loses_nothing_af_packet() {
    hot_upgrade_mid_ping("af_packet");
}

fn hot_upgrade_mid_ping(mode: &str) {
    if !privileged() {
        return;
    }
    let (_, want) = mode_opt(mode);
    let dir = run_dir("kp-upgrade");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let p = two_namespaces(&dir, mode);
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
    assert_eq!(port(&show, "u1")["mode"], want);
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
    assert_eq!(
        refused(&dir, &["t1", "type=tap", "dev=x", "mode=af_xdp"]),
        "ferrovs: port t1: mode=af_xdp is for uplink ports (a tap port has one way to attach)"
    );
    assert_eq!(
        refused(&dir, &["u1", "type=uplink", "dev=x", "mode=fast"]),
        "ferrovs: port u1: unknown uplink mode 'fast' (expected af_xdp or af_packet)"
    );
    assert_eq!(
        refused(
            &dir,
            &[
                "u1",
                "type=uplink",
                &format!("dev={missing}"),
                "mode=af_xdp"
            ]
        ),
        format!("ferrovs: port u1: mode=af_xdp: no network device named {missing}")
    );
    if is_root() {
        // Loopback: AF_XDP cannot work (not Ethernet). Forced, a precise error; automatic,
        // the AF_PACKET fallback with the reason in `show`.
        assert_eq!(
            refused(&dir, &["u1", "type=uplink", "dev=lo", "mode=af_xdp"]),
            "ferrovs: port u1: mode=af_xdp: lo is not an Ethernet device (link type 772); \
             AF_XDP uplinks need one"
        );
        add_port(&dir, &["u1", "type=uplink", "dev=lo"]);
        let show = cli_json(&dir, &["show"]);
        let u1 = port(&show, "u1");
        assert_eq!(u1["mode"], "af_packet", "{u1}");
        assert_eq!(
            u1["mode_fallback_reason"],
            "lo is a virtual device: its peer may send partial checksums and GSO packets, \
             whose metadata only AF_PACKET carries (mode=af_xdp forces AF_XDP)",
            "{u1}"
        );
        let text = String::from_utf8_lossy(&cli(&dir, &["show"]).stdout).into_owned();
        assert!(
            text.contains("af_packet fallback: lo is a virtual device"),
            "{text}"
        );
        assert!(cli(&dir, &["del-port", "br0", "u1"]).status.success());
    }
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
    assert!(show["bad_control_requests"].as_u64().unwrap() >= 10);
    let saved = std::fs::read_to_string(dir.join("ferrovs.conf.json")).unwrap();
    assert!(
        !saved.contains("uplink") && !saved.contains("\"tap\""),
        "{saved}"
    );
}

/// Open fds of process `pid`.
#[test]
fn hundred_upgrades_of_an_af_xdp_uplink_under_ping_leak_no_fd_and_no_frame() {
    if !privileged() {
        return;
    }
    let dir = run_dir("kp-leak");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let _stop = StopCurrent(dir.clone());
    let p = two_namespaces(&dir, "af_xdp");
    let (sent, got, out) = ping(&p.ns1, "10.9.0.2", 3, "0.1");
    assert_eq!((sent, got), (3, 3), "{out}");
    // The first takeover's fd count is the reference (a daemon started by hand holds other
    // fds than one started by `ferrovs upgrade`).
    let r = upgrade(&dir, &[]).expect("upgrade");
    assert_eq!(r["ok"], true, "{r}");
    let first = daemon_pid(&dir);
    let fd_list = |pid: u64| {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|l| l.display().to_string())
            .collect();
        v.sort();
        v
    };
    // The reference is taken once the new daemon has settled (two reads 200 ms apart agree):
    // right after `ferrovs upgrade` returns, it may still be opening its last fd.
    let settled = |pid: u64| {
        let mut a = fd_list(pid);
        for _ in 0..25 {
            std::thread::sleep(Duration::from_millis(200));
            let b = fd_list(pid);
            if a == b {
                break;
            }
            a = b;
        }
        a
    };
    let before = settled(first);
    let umem = |show: &Value| {
        let k = &port(show, "u1")["kernel"];
        let n = |f: &str| k[f].as_u64().unwrap_or_else(|| panic!("{f} in {k}"));
        (
            n("rx_frames_with_kernel"),
            n("umem_rx_frames"),
            n("tx_frames_free") + n("tx_frames_in_flight"),
            n("umem_tx_frames"),
            n("frames_lost"),
        )
    };
    // A ping every 10 ms until told to stop (`ip netns exec` execs ping: same pid).
    let pinger = std::process::Command::new("ip")
        .args([
            "netns", "exec", &p.ns1, "ping", "-i", "0.01", "-W", "2", "10.9.0.2",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for i in 0..100 {
        let r = upgrade(&dir, &[]).expect("upgrade");
        assert_eq!(r["ok"], true, "upgrade {i}: {r}");
        let show = cli_json(&dir, &["show"]);
        let (posted, rx_frames, tx_accounted, tx_frames, lost) = umem(&show);
        assert_eq!(
            posted, rx_frames,
            "upgrade {i}: receive frames all with the kernel"
        );
        assert_eq!(
            tx_accounted, tx_frames,
            "upgrade {i}: transmit frames free or in flight"
        );
        assert_eq!(lost, 0, "upgrade {i}");
        assert_eq!(port(&show, "u1")["mode"], "af_xdp");
    }
    let pid = daemon_pid(&dir);
    // (A control client's connection may still be closing.)
    let mut after = fd_list(pid);
    let t = std::time::Instant::now();
    while after.len() != before.len() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        after = settled(pid);
    }
    assert_eq!(
        after.len(),
        before.len(),
        "fds of the daemon after 100 upgrades: {before:?} -> {after:?}"
    );
    // Stop the pinger (SIGINT to its pid: it prints its summary).
    std::thread::sleep(Duration::from_millis(500));
    let ok = std::process::Command::new("kill")
        .args(["-INT", &pinger.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -INT ping");
    let o = pinger.wait_with_output().unwrap();
    let (sent, got, out) = ping_summary(String::from_utf8_lossy(&o.stdout).into_owned());
    assert!(sent >= 100, "{out}");
    // A ping lost at most now and then (the one burst in flight at the kill of an upgrade
    // is not lost; the pinger's own interrupt may cut the last reply).
    assert!(
        sent - got <= 2,
        "{sent} sent, {got} received across 100 upgrades:\n{out}"
    );
    let st = cli_json(&dir, &["port-stats", "u1"]);
    assert_eq!(st[0]["rx"]["dropped"], 0, "{st}");
    assert_eq!(st[0]["tx"]["dropped"], 0, "{st}");
    drop(p.net);
}

/// iperf3 from `client_ns` to `server` (in `server_ns`) for 2 s: bytes received.
fn iperf(server_ns: &str, server: &str, client_ns: &str) -> u64 {
    let srv = std::process::Command::new("ip")
        .args([
            "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", server,
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let o = Net::exec(
        client_ns,
        &["timeout", "30", "iperf3", "-c", server, "-t", "2", "-J"],
    );
    let _ = wait_child(srv, Duration::from_secs(10));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0)
}

fn wait_child(mut c: std::process::Child, t: Duration) -> Option<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    while start.elapsed() < t {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    c.wait().ok()
}

#[test]
fn tcp_between_namespaces_through_uplink_and_tap_with_offloads_af_packet() {
    tcp_between_namespaces("auto");
}

#[test]
fn tcp_between_namespaces_through_uplink_and_tap_with_offloads_af_xdp() {
    tcp_between_namespaces("af_xdp");
}

/// TCP both ways between the TAP's namespace (its stack sends TSO packets of up to 64 KiB
/// and partial checksums: the TAP takes offloads) and the uplink's (no offload: ferrovs
/// segments and checksums in software), with the frames on the uplink's wire captured and
/// checked: every one at most MTU-sized, with valid IPv4 and TCP checksums.
fn tcp_between_namespaces(mode: &str) {
    if !privileged() {
        return;
    }
    if !require(
        have("iperf3") && have("tcpdump") && have("ethtool"),
        "iperf3, tcpdump, ethtool",
    ) {
        return;
    }
    let dir = run_dir(&format!("kp-tcp-{mode}"));
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let p = two_namespaces(&dir, mode);
    // No GRO at the capture point: the capture shows frames as they came off the "wire".
    let _ = Net::exec(&p.ns1, &["ethtool", "-K", &p.veth, "gro", "off"]);
    let (sent, got, out) = ping(&p.ns1, "10.9.0.2", 3, "0.2");
    assert_eq!((sent, got), (3, 3), "{out}");
    let pcap = dir.join("wire.pcap");
    let dump = std::process::Command::new("ip")
        .args([
            "netns", "exec", &p.ns1, "tcpdump", "-i", &p.veth, "-Q", "in", "-nn", "-U",
        ])
        .args(["-c", "3000", "-w"])
        .arg(&pcap)
        .args(["tcp", "port", "5201"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // TAP namespace → uplink namespace: TSO segmented by ferrovs.
    let up = iperf(&p.ns1, "10.9.0.1", &p.ns2);
    // Uplink namespace → TAP namespace: what AF_PACKET hands over with its metadata (or,
    // AF_XDP, complete frames) goes to the TAP.
    let down = iperf(&p.ns2, "10.9.0.2", &p.ns1);
    let _ = wait_child(dump, Duration::from_secs(3));
    assert!(up > 1_000_000, "TCP towards the uplink moved {up} bytes");
    assert!(down > 1_000_000, "TCP from the uplink moved {down} bytes");
    let frames = pcap_frames(&pcap);
    assert!(frames.len() >= 1000, "{} frames captured", frames.len());
    for (i, (orig, f)) in frames.iter().enumerate() {
        assert!(*orig <= 1514, "frame {i} of {orig} bytes on the wire");
        assert_eq!(
            ferrovs_packet::offload::tcp_checksums_ok(f),
            Some(true),
            "frame {i}: bad checksum"
        );
    }
    let u1 = &cli_json(&dir, &["port-stats", "u1"])[0];
    let tso = u1["offload"]["sw_tso"].as_u64().unwrap();
    let segs = u1["offload"]["sw_segments"].as_u64().unwrap();
    assert!(
        tso > 0 && segs > tso,
        "the TAP's TSO packets were segmented: {u1}"
    );
    let t1 = &cli_json(&dir, &["port-stats", "t1"])[0];
    assert_eq!(t1["rx"]["drops"].get("bad_offload"), None, "{t1}");
    drop(p);
}
