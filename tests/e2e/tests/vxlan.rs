//! VXLAN tunnel ports with real namespaces: two ferrovs instances, each in its own network
//! namespace, carry guest traffic (ferrovs-gen on a vhost-user port of each) over a VXLAN
//! tunnel between them, every packet accounted for, the remote guest's MAC learned on the
//! tunnel port; and ferrovs interoperates with the Linux kernel's own vxlan device: ping and
//! TCP from a TAP's stack (TSO packets, segmented by ferrovs in software before
//! encapsulation, inner checksums verified by the receiving kernel), across a hot upgrade.
//! Needs root; outside CI it skips without it.

use std::path::Path;
use std::time::Duration;

use ferrovs_e2e::tunnel::*;
use ferrovs_e2e::*;

fn privileged() -> bool {
    require(
        is_root()
            && have("ip")
            && have("ping")
            && have("iperf3")
            && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping, iperf3 and /dev/net/tun (network namespaces, veth, TAP, vxlan)",
    )
}

fn drops(dir: &Path, port: &str, way: &str) -> u64 {
    cli_json(dir, &["port-stats", port])[0][way]["dropped"]
        .as_u64()
        .unwrap()
}

#[test]
fn vxlan_carries_guest_traffic_between_two_switches_and_interoperates_with_the_kernel() {
    if !privileged() {
        return;
    }
    let mut net = Net::new();
    let (ns_a, ns_b, ns_c) = (Net::name("va"), Net::name("vb"), Net::name("vc"));
    for ns in [&ns_a, &ns_b, &ns_c] {
        net.netns(ns);
    }
    // Underlay: A 10.77.0.1 -- B 10.77.0.2, A 10.78.0.1 -- C 10.78.0.2.
    let (ab, ba, ac, ca) = (
        Net::name("ab"),
        Net::name("ba"),
        Net::name("ac"),
        Net::name("ca"),
    );
    underlay(
        &mut net,
        &ab,
        &ns_a,
        "10.77.0.1/24",
        &ba,
        &ns_b,
        "10.77.0.2/24",
    );
    underlay(
        &mut net,
        &ac,
        &ns_a,
        "10.78.0.1/24",
        &ca,
        &ns_c,
        "10.78.0.2/24",
    );
    let (pmd, gen_core) = cores();
    let (dir_a, dir_b) = (run_dir("vxlan-a"), run_dir("vxlan-b"));
    let mut sw_a = switch_in(&ns_a, &dir_a, pmd);
    let mut sw_b = switch_in(&ns_b, &dir_b, pmd);
    ok(
        &dir_a,
        &[
            "add-port",
            "br0",
            "vx",
            "type=vxlan",
            "remote_ip=10.77.0.2",
            "local_ip=10.77.0.1",
            "key=42",
        ],
    );
    ok(
        &dir_b,
        &[
            "add-port",
            "br0",
            "vx",
            "type=vxlan",
            "remote_ip=10.77.0.1",
            "key=42",
        ],
    );

    // B takes from the tunnel only VNI 42 from A, by rule: the flow key carries the
    // tunnel metadata of what a tunnel port receives.
    ok(
        &dir_b,
        &[
            "add-flow",
            "br0",
            "priority=10,in_port=vx,tun_id=42,tun_src=10.77.0.1 actions=normal",
        ],
    );
    ok(
        &dir_b,
        &["add-flow", "br0", "priority=5,in_port=vx actions=drop"],
    );
    ok(&dir_b, &["add-flow", "br0", "priority=0 actions=normal"]);

    // 1. Guest traffic A:vm1 -> tunnel -> B:vm2, every packet accounted for.
    let vm1 = dir_a.join("vm1.sock").display().to_string();
    let vm2 = dir_b.join("vm2.sock").display().to_string();
    let g = bin("ferrovs-gen").display().to_string();
    let core = gen_core.to_string();
    let r = Proc::spawn(
        "gen",
        &dir_a,
        Path::new("/usr/bin/taskset"),
        &[
            "-c", &core, &g, "--socket", &vm1, "--sink", &vm2, "--quiet", "--settle", "0.5",
            "--count", "20000", "--rate", "10000", "--size", "300", "--flows", "4", "txonly",
        ],
    )
    .wait_json(&dir_a, Duration::from_secs(60));
    // What the kernel dropped at B's tunnel socket (its receive buffer full while B's PMD
    // was not polling) is counted too, on the port's endpoint.
    let socket_drops = port_of(&cli_json(&dir_b, &["show"]), "vx")["kernel"]["socket_drops"]
        .as_u64()
        .unwrap_or(0);
    let lost = drops(&dir_a, "vm1", "rx")
        + drops(&dir_a, "vx", "tx")
        + drops(&dir_b, "vx", "rx")
        + drops(&dir_b, "vm2", "tx")
        + socket_drops;
    assert_eq!(r["corrupt"], 0, "{r}");
    assert_eq!(
        r["sent"].as_u64().unwrap(),
        r["received"].as_u64().unwrap() + lost,
        "every packet accounted for: {r}"
    );
    assert_eq!(r["received"], 20000, "{r}");
    let flows = cli_json(&dir_b, &["dump-flows", "br0", "tun_id=42"]);
    assert_eq!(flows[0]["n_packets"], 20000, "{flows}");
    // B learned the sending guest's address on its tunnel port.
    let macs = cli_json(&dir_b, &["mac-table", "br0"]);
    assert!(
        macs.as_array()
            .unwrap()
            .iter()
            .any(|e| e["mac"] == "02:00:00:00:00:01" && e["port"] == "vx"),
        "{macs}"
    );
    let show = cli_json(&dir_a, &["show"]);
    let vx = port_of(&show, "vx");
    assert_eq!(vx["mode"], "vxlan", "{vx}");
    assert_eq!(vx["kernel"]["vni"], 42, "{vx}");

    // 2. The kernel's vxlan device in C (VNI 7) and a TAP in A's stack on one segment.
    Net::ip(&[
        "-n",
        &ns_c,
        "link",
        "add",
        "vxk",
        "type",
        "vxlan",
        "id",
        "7",
        "remote",
        "10.78.0.1",
        "local",
        "10.78.0.2",
        "dstport",
        "4789",
        "dev",
        &ca,
    ]);
    Net::ip(&["-n", &ns_c, "link", "set", "vxk", "mtu", "1500"]);
    // A veth never computes the checksums it is offered to offload: the inner TCP
    // checksums the kernel's vxlan device leaves to its lower device would cross to us
    // unfinished (a NIC computes them before the wire). Make the kernel side finish them.
    for dev in [ca.as_str(), "vxk"] {
        let o = Net::exec(&ns_c, &["ethtool", "-K", dev, "tx", "off"]);
        assert!(
            o.status.success(),
            "ethtool: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Net::ip(&["-n", &ns_c, "addr", "add", "192.168.77.2/24", "dev", "vxk"]);
    Net::ip(&["-n", &ns_c, "link", "set", "vxk", "up"]);
    ok(
        &dir_a,
        &[
            "add-port",
            "br0",
            "vk",
            "type=vxlan",
            "remote_ip=10.78.0.2",
            "local_ip=10.78.0.1",
            "key=7",
        ],
    );
    let tap = Net::name("vt");
    ok(
        &dir_a,
        &["add-port", "br0", "t1", "type=tap", &format!("dev={tap}")],
    );
    // The TAP was made in A's namespace (ferrovsd runs there).
    Net::ip(&["-n", &ns_a, "addr", "add", "192.168.77.1/24", "dev", &tap]);
    Net::ip(&["-n", &ns_a, "link", "set", &tap, "up"]);
    let o = Net::exec(
        &ns_a,
        &["ping", "-c", "20", "-i", "0.05", "-W", "2", "192.168.77.2"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(" 0% packet loss"),
        "ping through the tunnel:\n{out}"
    );

    // 3. TCP from the TAP's stack (TSO packets) to the kernel's vxlan device: ferrovs cuts
    // them into segments before encapsulating; the receiving kernel checks every inner
    // checksum (a bad one would be dropped and stall the stream).
    iperf3_through(&ns_a, &ns_c, "192.168.77.2", &dir_a);
    let st = cli_json(&dir_a, &["port-stats", "vk"]);
    assert!(
        st[0]["offload"]["sw_tso"].as_u64().unwrap() > 0,
        "TSO packets were segmented: {st}"
    );
    assert_eq!(st[0]["tx"]["dropped"], 0, "{st}");

    // 4. A hot upgrade hands the tunnel sockets over: a ping across it loses nothing.
    let show = ping_across_upgrade(&ns_a, &dir_a, "192.168.77.2");
    stop_pair(&show, &mut sw_a, &mut sw_b);
    drop(net);
}

/// Bad tunnel ports are refused precisely, and the daemon goes on.
#[test]
fn bad_vxlan_ports_are_refused() {
    let dir = run_dir("vxlan-bad");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    for (args, want) in [
        (vec!["type=vxlan"], "remote_ip=IPV4 is required"),
        (
            vec!["type=vxlan", "remote_ip=10.0.0.300"],
            "not an IPv4 address",
        ),
        (
            vec!["type=vxlan", "remote_ip=10.0.0.3", "key=16777216"],
            "a VNI is 24 bits",
        ),
        (
            vec!["type=vxlan", "remote_ip=10.0.0.3", "dev=eth0"],
            "not path or dev",
        ),
        (
            vec!["type=tap", "dev=x0", "remote_ip=10.0.0.3"],
            "are for tunnel ports",
        ),
        (
            vec!["type=vxlan", "remote_ip=10.0.0.3", "local_ip=192.0.2.77"],
            "cannot bind 192.0.2.77:4789",
        ),
    ] {
        let mut a = vec!["add-port", "br0", "vbad"];
        a.extend(args.iter().copied());
        let o = cli(&dir, &a);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(want), "{a:?}: {e}");
    }
    // A second port on the same local endpoint shares its socket; one to the same remote
    // is refused with the reason.
    ok(
        &dir,
        &[
            "add-port",
            "br0",
            "v1",
            "type=vxlan",
            "remote_ip=10.0.0.3",
            "dst_port=14789",
        ],
    );
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "v2",
            "type=vxlan",
            "remote_ip=10.0.0.4",
            "dst_port=14789",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "v3",
            "type=vxlan",
            "remote_ip=10.0.0.4",
            "dst_port=14789",
        ],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("port v2 already tunnels to 10.0.0.4"),
        "{e}"
    );
    assert!(cli(&dir, &["show"]).status.success());
}
