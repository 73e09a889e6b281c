//! Geneve tunnel ports (RFC 8926) with real namespaces, as OVN creates them (`key=flow`,
//! `csum=true`): two ferrovs instances, each in its own network namespace with a TAP in its
//! stack, joined by a veth underlay. Rules set the VNI (`set_field:...->tun_id`) before
//! the output to the tunnel port and match it on receive, as OVN's physical tables do. Ping
//! and TCP (TSO packets, segmented before encapsulation) cross; the wire format is captured
//! with tcpdump and checked byte by byte; a hot upgrade of one side loses no ping.
//! Needs root; outside CI it skips without it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferrovs_e2e::tunnel::*;
use ferrovs_e2e::*;

fn privileged() -> bool {
    require(
        is_root()
            && have("ip")
            && have("ping")
            && have("iperf3")
            && have("tcpdump")
            && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping, iperf3, tcpdump and /dev/net/tun (network namespaces, veth, TAP)",
    )
}

/// One side: a Geneve port `gv` to `remote` from `local`, a TAP `tap` with `addr` in the
/// namespace's stack, and OVN-style rules (VNI 0x7b set on the way out, matched on the
/// way in; everything else dropped).
fn side(ns: &str, dir: &Path, local: &str, remote: &str, tap: &str, addr: &str) {
    ok(
        dir,
        &[
            "add-port",
            "br0",
            "gv",
            "type=geneve",
            &format!("remote_ip={remote}"),
            &format!("local_ip={local}"),
            "key=flow",
            "csum=true",
        ],
    );
    ok(
        dir,
        &["add-port", "br0", "t1", "type=tap", &format!("dev={tap}")],
    );
    Net::ip(&["-n", ns, "addr", "add", addr, "dev", tap]);
    Net::ip(&["-n", ns, "link", "set", tap, "up"]);
    for r in [
        "priority=10,in_port=t1 actions=set_field:0x7b->tun_id,output:gv",
        "priority=10,in_port=gv,tun_id=0x7b actions=output:t1",
        "priority=0 actions=drop",
    ] {
        ok(dir, &["add-flow", "br0", r]);
    }
}

/// The UDP payloads to port 6081 in a pcap file (Ethernet, IPv4 without options).
fn geneve_payloads(pcap: &[u8]) -> Vec<(Vec<u8>, u16)> {
    let mut v = Vec::new();
    let mut o = 24;
    while o + 16 <= pcap.len() {
        let n = u32::from_le_bytes(pcap[o + 8..o + 12].try_into().unwrap()) as usize;
        let f = &pcap[o + 16..(o + 16 + n).min(pcap.len())];
        o += 16 + n;
        if f.len() > 42 && f[12..14] == [0x08, 0x00] && f[23] == 17 && f[36..38] == [0x17, 0xc1] {
            let csum = u16::from_be_bytes([f[40], f[41]]);
            v.push((f[42..].to_vec(), csum));
        }
    }
    v
}

#[test]
fn geneve_key_flow_carries_ping_and_tcp_between_two_switches_across_an_upgrade() {
    if !privileged() {
        return;
    }
    let mut net = Net::new();
    let (ns_a, ns_b) = (Net::name("ga"), Net::name("gb"));
    for ns in [&ns_a, &ns_b] {
        net.netns(ns);
    }
    let (ab, ba) = (Net::name("gab"), Net::name("gba"));
    // Room for the outer headers (58 bytes with OVN's option) around a 1500-byte MTU.
    underlay(
        &mut net,
        &ab,
        &ns_a,
        "10.79.0.1/24",
        &ba,
        &ns_b,
        "10.79.0.2/24",
    );
    let (pmd, _) = cores();
    let (dir_a, dir_b) = (run_dir("geneve-a"), run_dir("geneve-b"));
    let mut sw_a = switch_in(&ns_a, &dir_a, pmd);
    let mut sw_b = switch_in(&ns_b, &dir_b, pmd);
    let (tap_a, tap_b) = (Net::name("gta"), Net::name("gtb"));
    side(
        &ns_a,
        &dir_a,
        "10.79.0.1",
        "10.79.0.2",
        &tap_a,
        "192.168.79.1/24",
    );
    side(
        &ns_b,
        &dir_b,
        "10.79.0.2",
        "10.79.0.1",
        &tap_b,
        "192.168.79.2/24",
    );
    // A second Geneve port on A's endpoint (as OVN makes one per remote chassis): A's ports
    // share one socket, and `gv` takes only B's datagrams (the sibling path), across the
    // upgrade too.
    ok(
        &dir_a,
        &[
            "add-port",
            "br0",
            "gv9",
            "type=geneve",
            "remote_ip=10.79.0.9",
            "local_ip=10.79.0.1",
            "key=flow",
        ],
    );

    // 1. Ping, with the underlay captured.
    let pcap = dir_a.join("geneve.pcap");
    let cap = Command::new("ip")
        .args([
            "netns", "exec", &ns_a, "tcpdump", "-i", &ab, "-U", "-c", "4", "-w",
        ])
        .arg(&pcap)
        .args(["udp", "port", "6081"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let o = Net::exec(
        &ns_a,
        &["ping", "-c", "20", "-i", "0.05", "-W", "2", "192.168.79.2"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(" 0% packet loss"),
        "ping through the tunnel:\n{out}\nA: {}\nB: {}",
        cli_json(&dir_a, &["port-stats"]),
        cli_json(&dir_b, &["port-stats"])
    );
    let _ = wait(cap);
    let frames = geneve_payloads(&std::fs::read(&pcap).unwrap_or_default());
    assert!(!frames.is_empty(), "no Geneve datagram captured");
    for (g, csum) in &frames {
        // Version 0, no options, no flags, Ethernet payload, VNI 0x7b.
        assert_eq!(g[..8], [0, 0, 0x65, 0x58, 0, 0, 0x7b, 0], "{g:02x?}");
        // csum=true: the host stack computed the outer UDP checksum.
        assert_ne!(*csum, 0);
    }
    let show = cli_json(&dir_a, &["show"]);
    let gv = port_of(&show, "gv");
    assert_eq!(gv["mode"], "geneve", "{gv}");
    assert_eq!(gv["kernel"]["key_flow"], true, "{gv}");

    // 2. TCP (TSO from the TAP's stack, segmented by ferrovs before encapsulation; the
    // receiving stack checks every inner checksum).
    iperf3_through(&ns_a, &ns_b, "192.168.79.2", &dir_a);
    let st = cli_json(&dir_a, &["port-stats", "gv"]);
    assert_eq!(st[0]["tx"]["dropped"], 0, "{st}");

    // 3. A hot upgrade of A hands the Geneve socket over: no ping lost.
    let show = ping_across_upgrade(&ns_a, &dir_a, "192.168.79.2");
    stop_pair(&show, &mut sw_a, &mut sw_b);
    drop(net);
}

/// Interop with OVS's userspace Geneve (Debian's ovs-vswitchd, netdev datapath; this machine
/// has no geneve kernel module): OVS in namespace O with the underlay on a `br-phy` bridge
/// (the userspace-tunneling setup of OVS's documentation) and an internal port on `br-int`,
/// ferrovs in namespace A; both set VNI 0x7b by rule. A ping crosses both ways; the capture
/// shows each side's Geneve header. Then OVS adds OVN's option (class 0x0102, type 0x80:
/// critical) through its TLV map: ferrovs, whose map does not name it, drops those frames
/// and counts them (`tunnel_bad_header`), as RFC 8926 asks.
#[test]
fn geneve_interoperates_with_ovs_userspace_tunnels() {
    if !require(
        ferrovs_e2e::ovsdb::vswitchd_available() && have("tcpdump") && have("ping"),
        "root, ovs-vswitchd, ovsdb-server, tcpdump, ping",
    ) {
        return;
    }
    let dir_o = run_dir("geneve-ovs");
    let ovs = ferrovs_e2e::ovsdb::OvsVswitchd::start(&dir_o, "go");
    let ns_o = ovs.ns.clone();
    let mut net = Net::new();
    let ns_a = Net::name("gi");
    net.netns(&ns_a);
    // Underlay: A's end 10.80.0.1; O's end is a port of br-phy, whose internal port has
    // 10.80.0.2.
    let (ao, oa) = (Net::name("gao"), Net::name("goa"));
    Net::ip(&["link", "add", &ao, "type", "veth", "peer", "name", &oa]);
    net.track_link(&ao);
    Net::ip(&["link", "set", &oa, "netns", &ns_o]);
    Net::ip(&["-n", &ns_o, "link", "set", &oa, "up"]);
    Net::ip(&["-n", &ns_o, "link", "set", &oa, "mtu", "1600"]);
    Net::ip(&["link", "set", &ao, "netns", &ns_a]);
    Net::ip(&["-n", &ns_a, "addr", "add", "10.80.0.1/24", "dev", &ao]);
    Net::ip(&["-n", &ns_a, "link", "set", &ao, "up"]);
    Net::ip(&["-n", &ns_a, "link", "set", &ao, "mtu", "1600"]);
    // A veth never completes a checksum it is offered to offload: our outer UDP checksum
    // would reach OVS as the bare pseudo-header sum, which OVS's userspace tunnel verifies
    // and drops (a NIC completes it on the wire). Make the kernel compute it.
    let o = Net::exec(&ns_a, &["ethtool", "-K", &ao, "tx", "off"]);
    assert!(
        o.status.success(),
        "ethtool: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let vs = |args: &[&str]| {
        ovs.db
            .vsctl(args)
            .unwrap_or_else(|e| panic!("ovs-vsctl {args:?}: {e}"))
    };
    vs(&[
        "add-br",
        "br-phy",
        "--",
        "set",
        "bridge",
        "br-phy",
        "datapath_type=netdev",
    ]);
    vs(&["add-port", "br-phy", &oa]);
    Net::ip(&["-n", &ns_o, "addr", "add", "10.80.0.2/24", "dev", "br-phy"]);
    Net::ip(&["-n", &ns_o, "link", "set", "br-phy", "up"]);
    vs(&[
        "add-br",
        "br-int",
        "--",
        "set",
        "bridge",
        "br-int",
        "datapath_type=netdev",
    ]);
    vs(&[
        "add-port",
        "br-int",
        "gnv",
        "--",
        "set",
        "interface",
        "gnv",
        "type=geneve",
        "options:remote_ip=10.80.0.1",
        "options:key=flow",
        "ofport_request=10",
    ]);
    vs(&[
        "add-port",
        "br-int",
        "p0",
        "--",
        "set",
        "interface",
        "p0",
        "type=internal",
        "ofport_request=1",
    ]);
    Net::ip(&["-n", &ns_o, "addr", "add", "192.168.80.2/24", "dev", "p0"]);
    Net::ip(&["-n", &ns_o, "link", "set", "p0", "up"]);
    Net::ip(&["-n", &ns_o, "link", "set", "p0", "mtu", "1400"]);
    let int = ovs.dir.join("br-int.mgmt");
    wait_until("OVS's br-int.mgmt", 10, || {
        std::os::unix::net::UnixStream::connect(&int).is_ok()
    });
    ofctl_ok(&int, "del-flows", &[]);
    for r in [
        "priority=10,in_port=1 actions=set_field:0x7b->tun_id,output:10",
        "priority=10,in_port=10,tun_id=0x7b actions=output:1",
    ] {
        ofctl_ok(&int, "add-flow", &[r]);
    }

    let (pmd, _) = cores();
    let dir_a = run_dir("geneve-ovs-a");
    let mut sw_a = switch_in(&ns_a, &dir_a, pmd);
    let tap = Net::name("gti");
    side(
        &ns_a,
        &dir_a,
        "10.80.0.1",
        "10.80.0.2",
        &tap,
        "192.168.80.1/24",
    );
    Net::ip(&["-n", &ns_a, "link", "set", &tap, "mtu", "1400"]);

    let pcap = dir_a.join("ovs.pcap");
    let cap = Command::new("ip")
        .args([
            "netns", "exec", &ns_a, "tcpdump", "-i", &ao, "-U", "-c", "6", "-w",
        ])
        .arg(&pcap)
        .args(["udp", "port", "6081"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // OVS resolves the remote by ARP through br-phy first: allow the first pings to go.
    let o = Net::exec(
        &ns_a,
        &["ping", "-c", "30", "-i", "0.1", "-W", "2", "192.168.80.2"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let log = std::fs::read_to_string(ovs.dir.join("ovs-vswitchd.log")).unwrap_or_default();
    let appctl = |args: &[&str]| {
        let o = Command::new("ovs-appctl")
            .arg(format!("--target={}", ovs.unixctl().display()))
            .args(args)
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    if std::env::var_os("GENEVE_DEBUG").is_some() {
        eprintln!("route: {}", appctl(&["ovs/route/show"]));
        eprintln!("neigh: {}", appctl(&["tnl/neigh/show"]));
        eprintln!("ports: {}", appctl(&["tnl/ports/show"]));
        eprintln!("dp flows: {}", appctl(&["dpctl/dump-flows"]));
        eprintln!(
            "ns_a neigh: {}",
            String::from_utf8_lossy(&Net::exec(&ns_a, &["ip", "neigh"]).stdout)
        );
        eprintln!(
            "ns_o addr: {}",
            String::from_utf8_lossy(&Net::exec(&ns_o, &["ip", "addr"]).stdout)
        );
        eprintln!(
            "br-phy flows: {}",
            ofctl_ok(&ovs.dir.join("br-phy.mgmt"), "dump-flows", &[])
        );
        eprintln!("br-int flows: {}", ofctl_ok(&int, "dump-flows", &[]));
    }
    assert!(
        !out.contains(" 100% packet loss") && out.contains("bytes from 192.168.80.2"),
        "ping ferrovs -> OVS over Geneve:\n{out}\nferrovs: {}\nOVS log tail: {}",
        cli_json(&dir_a, &["port-stats"]),
        &log[log.len().saturating_sub(3000)..]
    );
    let _ = wait(cap);
    let frames = geneve_payloads(&std::fs::read(&pcap).unwrap_or_default());
    // Both directions' headers: ours (no option) and OVS's (no option, VNI 0x7b).
    assert!(
        frames.len() >= 2,
        "{} Geneve datagrams captured",
        frames.len()
    );
    for (g, _) in &frames {
        assert_eq!(g[..8], [0, 0, 0x65, 0x58, 0, 0, 0x7b, 0], "{g:02x?}");
    }
    eprintln!(
        "ferrovs <-> OVS: {}; {} Geneve datagrams captured, first header {:02x?}",
        out.lines()
            .find(|l| l.contains("packet loss"))
            .unwrap_or(""),
        frames.len(),
        &frames[0].0[..8]
    );

    // OVN's option, critical, unknown to ferrovs's (empty) map: dropped and counted.
    ofctl_ok(
        &int,
        "add-tlv-map",
        &["{class=0x102,type=0x80,len=4}->tun_metadata0"],
    );
    ofctl_ok(
        &int,
        "add-flow",
        &["priority=20,in_port=1 actions=set_field:0x7b->tun_id,\
           set_field:0x10002->tun_metadata0,output:10"],
    );
    let bad_before = cli_json(&dir_a, &["port-stats", "gv"])[0]["rx"]["drops"]["tunnel_bad_header"]
        .as_u64()
        .unwrap_or(0);
    let _ = Net::exec(
        &ns_o,
        &["ping", "-c", "3", "-i", "0.2", "-W", "1", "192.168.80.1"],
    );
    let st = cli_json(&dir_a, &["port-stats", "gv"]);
    let bad = st[0]["rx"]["drops"]["tunnel_bad_header"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        bad > bad_before,
        "OVS's critical option was not refused: {st}"
    );
    eprintln!(
        "OVS's frames with OVN's critical option refused: tunnel_bad_header {bad_before} -> {bad}"
    );

    sw_a.kill();
    drop(net);
    drop(ovs);
}

/// Bad Geneve ports are refused precisely, and the daemon goes on.
#[test]
fn bad_geneve_ports_are_refused() {
    let dir = run_dir("geneve-bad");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    for (args, want) in [
        (
            vec!["type=geneve"],
            "remote_ip=IPV4 is required for geneve ports",
        ),
        (
            vec!["type=geneve", "remote_ip=10.0.0.3", "key=flow", "key=5"],
            "key=flow and key=VNI are exclusive",
        ),
        (
            vec!["type=geneve", "remote_ip=10.0.0.3", "csum=yes"],
            "csum=yes: true or false",
        ),
        (
            vec!["type=tap", "dev=x0", "key=flow"],
            "are for tunnel ports",
        ),
        (
            vec!["type=geneve", "remote_ip=10.0.0.3", "local_ip=192.0.2.77"],
            "cannot bind 192.0.2.77:6081",
        ),
    ] {
        let mut a = vec!["add-port", "br0", "gbad"];
        a.extend(args.iter().copied());
        let o = cli(&dir, &a);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(want), "{a:?}: {e}");
    }
    ok(
        &dir,
        &[
            "add-port",
            "br0",
            "g1",
            "type=geneve",
            "remote_ip=10.0.0.3",
            "key=flow",
            "dst_port=16081",
        ],
    );
    assert!(cli(&dir, &["show"]).status.success());
}
