//! OpenFlow controllers, as ovs-vswitchd connects to them: a small controller endpoint in
//! the test (it speaks HELLO, FEATURES, ECHO and ROLE on the wire) that ferrovsd and a real
//! OVS netdev bridge (Debian's ovs-vswitchd, `ovs-vsctl set-controller`) both connect to;
//! the same role sequence gets the same answers from both. Then reconnects after the
//! controller restarts (with backoff), inactivity probes, fail-mode standalone and secure
//! forwarding pings between two namespaces, and hostile controllers that change nothing.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use ferrovs_e2e::ofwire::*;
use ferrovs_e2e::*;

fn ovs_tools() -> bool {
    require(
        is_root()
            && have("ip")
            && Path::new("/usr/sbin/ovs-vswitchd").exists()
            && ovsdb::available(),
        "ovs-vswitchd, ovsdb-server and ovs-vsctl (Debian's openvswitch-switch)",
    )
}

/// Debian's ovs-vswitchd with a netdev bridge br0 (datapath id 0xab).
fn start_ovs(dir: &Path) -> ovsdb::OvsVswitchd {
    let ovs = ovsdb::OvsVswitchd::start(dir, "ctlo");
    ovs.db
        .vsctl(&[
            "add-br",
            "br0",
            "--",
            "set",
            "bridge",
            "br0",
            "datapath_type=netdev",
            "other_config:datapath-id=00000000000000ab",
        ])
        .expect("add-br");
    ovs
}

/// What a switch answers to the role sequence (two controllers A and B).
fn role_sequence(a: &mut Switch, b: &mut Switch) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |what: &str, r: String| out.push(format!("{what}: {r}"));
    note("A nochange", format!("{:?}", a.role(0, 0)));
    note("A master gen 5", format!("{:?}", a.role(2, 5)));
    note("B slave gen 4 (stale)", format!("{:?}", b.role(3, 4)));
    note("B master gen 6", format!("{:?}", b.role(2, 6)));
    // A was demoted: its flow-mod is refused as a slave's.
    note("A nochange after B", format!("{:?}", a.role(0, 0)));
    note("A flow-mod as slave", format!("{:?}", a.flow_mod(5)));
    note("B flow-mod as master", format!("{:?}", b.flow_mod(6)));
    note("A equal", format!("{:?}", a.role(1, 0)));
    note("A flow-mod as equal", format!("{:?}", a.flow_mod(7)));
    note("B bad role", format!("{:?}", b.role(9, 0)));
    out
}

#[test]
fn controllers_connect_as_to_ovs_roles_reconnect_backoff_and_probes() {
    if !ovs_tools() {
        return;
    }
    let dir = run_dir("controllers");
    let (pmd, _) = cores();
    let _sw = start_bare_switch(&dir, pmd, &["br0"]);

    // Two controllers: one over TCP, one over a Unix socket.
    let tcp = Listener::tcp();
    let usock = dir.join("ctl-b.sock");
    let unix = Listener::unix(&usock);
    let targets = [
        format!("tcp:127.0.0.1:{}", tcp.port()),
        format!("unix:{}", usock.display()),
    ];
    let o = cli(&dir, &["set-bridge", "br0", "datapath-id=00000000000000ab"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut args = vec!["set-controller", "br0"];
    args.extend(targets.iter().map(String::as_str));
    let o = cli(&dir, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = cli(&dir, &["get-controller", "br0"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout)
            .lines()
            .collect::<Vec<_>>(),
        targets.to_vec()
    );
    let mut a = tcp.accept(10);
    let mut b = unix.accept(10);
    assert_eq!(a.handshake(), 0xab);
    assert_eq!(b.handshake(), 0xab);
    wait_until("show: both controllers connected", 10, || {
        let s = cli_json(&dir, &["show"]);
        let c = &s["bridges"][0]["openflow"]["controllers"];
        c[0]["connected"] == true && c[1]["connected"] == true
    });

    // The same role sequence against OVS (its controllers on Unix sockets: it runs in a
    // namespace of its own).
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs = start_ovs(&ovs_dir);
    let (oa_path, ob_path) = (ovs_dir.join("ctl-a.sock"), ovs_dir.join("ctl-b.sock"));
    let (oal, obl) = (Listener::unix(&oa_path), Listener::unix(&ob_path));
    ovs.db
        .vsctl(&[
            "set-controller",
            "br0",
            &format!("unix:{}", oa_path.display()),
            &format!("unix:{}", ob_path.display()),
        ])
        .expect("ovs-vsctl set-controller");
    let (mut oa, mut ob) = (oal.accept(20), obl.accept(20));
    assert_eq!(oa.handshake(), 0xab);
    assert_eq!(ob.handshake(), 0xab);
    let want = role_sequence(&mut oa, &mut ob);
    let got = role_sequence(&mut a, &mut b);
    assert_eq!(
        got, want,
        "ferrovs (left) and OVS (right) answer roles differently"
    );
    assert!(
        want.iter()
            .any(|l| l.starts_with("A flow-mod as slave") && l.contains("(1, 10)")),
        "{want:?}"
    );
    let s = cli_json(&dir, &["show"]);
    assert_eq!(
        s["bridges"][0]["openflow"]["controllers"][1]["role"],
        "master"
    );
    drop((oa, ob, ovs));

    // The controller restarts: the switch reconnects, backing off 1, 2, 4 ... s meanwhile.
    let port = tcp.port();
    drop(tcp);
    drop(a);
    wait_until("backoff grows past 2 s", 20, || {
        let s = cli_json(&dir, &["show"]);
        s["bridges"][0]["openflow"]["controllers"][0]["backoff_ms"]
            .as_u64()
            .unwrap_or(0)
            >= 4000
    });
    let t = Instant::now();
    let tcp = Listener::tcp_at(port);
    let mut a = tcp.accept(10);
    assert!(t.elapsed() <= Duration::from_secs(9), "max_backoff is 8 s");
    a.handshake();
    let s = cli_json(&dir, &["show"]);
    assert!(
        s["bridges"][0]["openflow"]["controllers"][0]["connects"]
            .as_u64()
            .unwrap()
            >= 2,
        "{s}"
    );

    // Inactivity probe: an idle controller gets an echo after 5 s; one that does not
    // answer is dropped after another 5 s and the switch reconnects.
    let t = Instant::now();
    a.mute = true;
    while a.echoes == 0 {
        assert!(a.recv().is_some(), "the switch closed before probing");
    }
    let probed = t.elapsed();
    assert!(
        probed >= Duration::from_secs(4) && probed <= Duration::from_secs(8),
        "{probed:?}"
    );
    while a.recv().is_some() {}
    let dropped = t.elapsed();
    assert!(dropped >= Duration::from_secs(9), "{dropped:?}");
    let mut a = tcp.accept(10);
    a.handshake();

    // A hot upgrade hands the connection over: no reconnect; the new daemon answers on the
    // same socket, with the same datapath id and the same count of connections made.
    let _stop = StopCurrent(dir.clone());
    let connects = |d: &Path| {
        cli_json(d, &["show"])["bridges"][0]["openflow"]["controllers"][0]["connects"].clone()
    };
    let before = connects(&dir);
    upgrade(&dir, &[]).expect("upgrade");
    a.send(&header(FEATURES_REQUEST, 8, 9));
    let f = a.expect(FEATURES_REPLY);
    assert_eq!(
        u64::from_be_bytes(f[8..16].try_into().unwrap()),
        0xab,
        "datapath-id kept across the upgrade"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(tcp.try_accept().is_none(), "no reconnect");
    assert_eq!(connects(&dir), before);
    let got = cli(&dir, &["get-controller", "br0"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).lines().count(),
        2,
        "controllers kept across the upgrade"
    );
    drop(b);
}

fn privileged() -> bool {
    require(
        is_root() && have("ip") && have("ping") && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping and /dev/net/tun (network namespaces, TAP)",
    )
}

fn show_of(dir: &Path) -> serde_json::Value {
    cli_json(dir, &["show"])["bridges"][0]["openflow"].clone()
}

#[test]
fn fail_mode_standalone_forwards_without_a_controller_secure_never_and_hostile_controllers_change_nothing(
) {
    if !privileged() {
        return;
    }
    let dir = run_dir("controllers-fail");
    let (pmd, _) = cores();
    let _sw = start_bare_switch(&dir, pmd, &["br0"]);
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("cf1-"), Net::name("cf2-"));
    let (t1, t2) = (Net::name("cfa"), Net::name("cfb"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.9.0.1/24"),
        ("t2", &t2, &ns2, "10.9.0.2/24"),
    ] {
        net.tap_port(&dir, "br0", p, t, ns, a);
    }
    // No controller, standalone: the default NORMAL rule.
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5);

    // Secure with no controller: the table is flushed and stays empty.
    let ok = |args: &[&str]| {
        let o = cli(&dir, args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(&["set-bridge", "br0", "fail-mode=secure"]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 0);
    // Back to standalone: flushed again, with the NORMAL rule.
    ok(&["set-bridge", "br0", "fail-mode=standalone"]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5);

    // A controller nobody answers: the table is flushed (as OVS's when the first
    // controller comes); standalone fails open after three probe intervals (15 s).
    let dead = Listener::tcp();
    let port = dead.port();
    drop(dead);
    ok(&["set-controller", "br0", &format!("tcp:127.0.0.1:{port}")]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 0, "no rule, no controller yet");
    wait_until("fail-open", 25, || show_of(&dir)["fail_open"] == true);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5, "fail-open forwards");
    // Secure: fail-open ends at once.
    ok(&["set-bridge", "br0", "fail-mode=secure"]);
    wait_until("fail-open ends", 5, || show_of(&dir)["fail_open"] == false);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 0, "secure never fails open");
    ok(&["set-bridge", "br0", "fail-mode=standalone"]);
    wait_until("fail-open again", 5, || show_of(&dir)["fail_open"] == true);

    // A controller connects: fail-open ends (its rules, none yet, decide: drop).
    let tcp = Listener::tcp_at(port);
    let mut a = tcp.accept(15);
    a.handshake();
    wait_until("fail-open ends on connect", 5, || {
        show_of(&dir)["fail_open"] == false
    });
    assert_eq!(ping(&ns1, "10.9.0.2", 3), 0);

    // Hostile controllers while the bridge forwards (a NORMAL rule from the management
    // socket's CLI twin): garbage, a huge message, a controller that never reads.
    ok(&["add-flow", "br0", "priority=0,actions=normal"]);
    let pinger = std::thread::spawn({
        let ns1 = ns1.clone();
        move || ping(&ns1, "10.9.0.2", 60)
    });
    a.send(&[0xde; 4096]);
    let mut big = header(ECHO_REQUEST, 65535, 3);
    big.resize(65535, 0xab);
    for _ in 0..4 {
        let _ = a.s.write_all(&big);
    }
    // The switch never reads more than it can answer: flood it with echoes unread.
    let mut echo = header(ECHO_REQUEST, 60008, 4);
    echo.resize(60008, 0x55);
    let flood = std::thread::spawn(move || {
        // (Loopback TCP buffers hold some 20 MB between the two before the switch's own
        // limits come into play.)
        for _ in 0..2000 {
            if a.s.write_all(&echo).is_err() {
                return true;
            }
        }
        false
    });
    assert!(
        flood.join().unwrap(),
        "a controller that never reads was not dropped"
    );
    let rx = pinger.join().unwrap();
    assert!(rx >= 59, "the switch forwarded throughout: {rx}/60");
    // It reconnects (the switch backs off, then tries again) and the daemon answers.
    let mut a = tcp.accept(15);
    a.handshake();
    let o = cli(&dir, &["show"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("controller tcp:127.0.0.1:{port}")),
        "{text}"
    );

    // PORT_MOD: ovs-ofctl sets t2 down over the management socket; the ping stops and the
    // controller hears PORT_STATUS (MODIFY, config PORT_DOWN); up again, it flows.
    if have("ovs-ofctl") {
        let mgmt = format!("unix:{}", dir.join("br0.mgmt").display());
        let mod_port = |how: &str| {
            let o = std::process::Command::new("ovs-ofctl")
                .args(["-O", "OpenFlow13", "mod-port", &mgmt, "t2", how])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };
        mod_port("down");
        let st = a.expect(PORT_STATUS);
        assert_eq!(st[8], 2, "reason OFPPR_MODIFY");
        assert_eq!(&st[16..20], &2u32.to_be_bytes(), "port 2");
        assert_eq!(&st[48..52], &1u32.to_be_bytes(), "config OFPPC_PORT_DOWN");
        assert_eq!(ping(&ns1, "10.9.0.2", 5), 0, "t2 is down");
        mod_port("up");
        let st = a.expect(PORT_STATUS);
        assert_eq!(&st[48..52], &0u32.to_be_bytes());
        assert_eq!(ping(&ns1, "10.9.0.2", 5), 5, "t2 is up again");
        // From the controller: a port that does not exist, and a wrong address.
        a.send(&port_mod(99, [0; 6], 1, 1));
        assert_eq!(error_of(&a.expect(ERROR)), (7, 0), "OFPPMFC_BAD_PORT");
        a.send(&port_mod(2, [0; 6], 1, 1));
        assert_eq!(error_of(&a.expect(ERROR)), (7, 1), "OFPPMFC_BAD_HW_ADDR");
        assert_eq!(ping(&ns1, "10.9.0.2", 3), 3);
    }

    // Removing the controller flushes the table; standalone with none: NORMAL.
    ok(&["del-controller", "br0"]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5);
}
