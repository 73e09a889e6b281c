//! What ovn-controller asks of a chassis switch: through OVSDB, against a real
//! ovsdb-server with the stock vswitch schema, the `Datapath` row it creates for `netdev`
//! gets the capabilities ferrovs has (docs/ovsdb.md); through OpenFlow, with ovs-ofctl, a
//! `controller(meter_id=N)` (OVN's CoPP) sends only what meter N lets through, and the
//! meter's band counts the rest (docs/openflow.md, Continuations).

use std::path::Path;
use std::time::{Duration, Instant};

use ferrovs_e2e::ovsdb::*;
use ferrovs_e2e::*;

/// ovn-controller's transaction (OVN 23.03 `controller/ovn-controller.c`,
/// `process_br_int`): a `Datapath` row inserted and mapped from `Open_vSwitch.datapaths`
/// under its type; ferrovsd fills `capabilities`.
#[test]
fn the_datapath_row_gets_ferrovs_capabilities() {
    if !require(
        available(),
        "ovsdb-server, ovsdb-tool, ovs-vsctl and vswitch.ovsschema",
    ) || !require(
        is_root(),
        "root (TAP devices for the bridges' internal ports)",
    ) {
        return;
    }
    let dir = run_dir("ovn-chassis-datapath");
    let db = OvsdbServer::start(&dir);
    let (pmd, _) = cores();
    let _sw = start_switch_ovsdb(&dir, pmd, &db);
    db.vsctl_no_wait(&[
        "--",
        "--id=@dp",
        "create",
        "Datapath",
        "external_ids:ovn=chassis",
        "--",
        "set",
        "Open_vSwitch",
        ".",
        "datapaths:netdev=@dp",
    ])
    .unwrap();
    let uuid = db
        .vsctl_no_wait(&["get", "Open_vSwitch", ".", "datapaths:netdev"])
        .unwrap()
        .trim()
        .to_string();
    let caps = |key: &str| {
        db.vsctl_no_wait(&[
            "--if-exists",
            "get",
            "Datapath",
            &uuid,
            &format!("capabilities:{key}"),
        ])
        .map(|s| s.trim().trim_matches('"').to_string())
        .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while caps("check_pkt_len") != "true" {
        assert!(
            Instant::now() < deadline,
            "capabilities not written: {:?}",
            db.vsctl_no_wait(&["list", "Datapath"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for (key, want) in [
        ("recirc", "true"),
        ("ct_state", "true"),
        ("ct_zone", "true"),
        ("ct_state_nat", "true"),
        ("ct_zero_snat", "false"),
        ("ct_flush", "false"),
        ("max_hash_alg", "0"),
    ] {
        assert_eq!(caps(key), want, "{key}");
    }
    // Someone overwriting them: written back as ferrovs has them.
    db.vsctl_no_wait(&["set", "Datapath", &uuid, "capabilities:ct_flush=true"])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while caps("ct_flush") != "false" {
        assert!(Instant::now() < deadline, "capabilities not written back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// ferrovsd with br0 and TAP ports t1, t2 (OpenFlow ports 1 and 2) in namespaces
/// (10.9.0.1, 10.9.0.2); returns the daemon, the namespaces (kept while `net` lives), the
/// run directory and the OpenFlow socket.
fn switch_with_two_namespaces(name: &str) -> (Proc, Net, (String, String), std::path::PathBuf) {
    let dir = run_dir(name);
    let (pmd, _) = cores();
    let sw = start_bare_switch(&dir, pmd, &["br0"]);
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("cp1-"), Net::name("cp2-"));
    let (t1, t2) = (Net::name("ca"), Net::name("cb"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.9.0.1/24"),
        ("t2", &t2, &ns2, "10.9.0.2/24"),
    ] {
        net.tap_port(&dir, "br0", p, t, ns, a);
        Net::no_ipv6(ns, t);
    }
    (sw, net, (ns1, ns2), dir)
}

/// OVN's CoPP: every packet from port 1 goes up through `controller(userdata=...,
/// meter_id=1)` and across; a burst of 200 pings is answered whole while the packet-ins
/// stay within the meter's 5-packet bucket and 2 pktps rate; `meter-stats` counts the rest
/// in the band.
#[test]
fn a_metered_controller_action_bounds_its_packet_ins() {
    if !require(
        is_root()
            && have("ip")
            && have("ping")
            && have("ovs-ofctl")
            && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping, ovs-ofctl and /dev/net/tun",
    ) {
        return;
    }
    let (_sw, _net, (ns1, _ns2), dir) = switch_with_two_namespaces("ovn-copp");
    let sock = dir.join("br0.mgmt");
    ofctl_ok(&sock, "del-flows", &[]);
    ofctl_ok(
        &sock,
        "add-meter",
        &["meter=1,pktps,burst,stats,band=type=drop,rate=2,burst_size=5"],
    );
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=10,in_port=1,actions=controller(userdata=00.00.00.0a,meter_id=1),output:2"],
    );
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=10,in_port=2,actions=output:1"],
    );
    let dump = ofctl_ok(&sock, "dump-flows", &["in_port=1"]);
    assert!(dump.contains("meter_id=1"), "{dump}");
    let t0 = Instant::now();
    let o = Net::exec(
        &ns1,
        &["ping", "-c", "200", "-i", "0.002", "-W", "1", "10.9.0.2"],
    );
    let secs = t0.elapsed().as_secs_f64();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("200 received"), "{out}");
    let show = cli_json(&dir, &["show"]);
    let queued = show["packet_io"]["packet_ins_queued"].as_u64().unwrap_or(0);
    // The bucket (5) and 2 a second for as long as the pings ran (and an ARP or two).
    let bound = 5 + (2.0 * secs).ceil() as u64 + 2;
    assert!(
        queued >= 5 && queued <= bound,
        "{queued} packet-ins in {secs:.1} s (bound {bound})"
    );
    let stats = ofctl_ok(&sock, "meter-stats", &["meter=1"]);
    let band: u64 = stats
        .split("0: packet_count:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stats}"));
    assert!(band >= 190, "band drops {band}:\n{stats}");
    eprintln!("copp: 200 pings in {secs:.2} s, {queued} packet-ins, {band} metered out\n{stats}");
}
