//! OpenFlow over the bridge's management socket, as operators use it: `ovs-ofctl -O
//! OpenFlow13 … unix:RUN_DIR/br0.mgmt` against ferrovsd, and the same sequence against real
//! OVS (Debian's ovs-vswitchd with a `datapath_type=netdev` bridge and dummy ports, its own
//! ovsdb-server and run directory): `dump-flows` of both, without statistics, must be the
//! same. Then rules added by ovs-ofctl steer and drop real packets between two namespaces
//! (TAP ports) and count them, while hostile connections come and go.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferrovs_e2e::*;

/// `dump-flows --no-stats`, one rule a line, sorted (the two switches list in their own
/// order).
fn flows(sock: &Path) -> Vec<String> {
    let out = ofctl_ok(sock, "dump-flows", &["--no-stats"]);
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("OFPST_FLOW"))
        .map(|l| l.trim().to_string())
        .collect();
    v.sort();
    v
}

/// A rule table both switches support (ports 1 and 2).
const RULES: &[&str] = &[
    "priority=100,ip,nw_dst=10.0.0.1,actions=output:2",
    "priority=90,ip,nw_src=10.1.0.0/16,actions=output:1",
    "priority=80,tcp,tp_dst=80,actions=mod_nw_tos:8,goto_table:1",
    "priority=80,udp,tp_src=53,actions=output:1,output:2",
    "priority=70,dl_dst=02:00:00:00:00:02,actions=output:2",
    "priority=70,dl_src=02:00:00:00:00:01,actions=mod_dl_src:02:00:00:00:00:99,output:2",
    "priority=60,dl_vlan=10,actions=pop_vlan,output:1",
    "priority=60,dl_vlan=20,dl_vlan_pcp=3,actions=set_field:4126->vlan_vid,output:2",
    "priority=50,arp,arp_tpa=10.0.0.1,actions=flood",
    "priority=50,arp,arp_op=2,actions=all",
    "priority=40,ipv6,ipv6_dst=2001:db8::1,actions=output:2",
    "priority=40,icmp,icmp_type=8,actions=in_port",
    "priority=40,icmp6,icmpv6_type=135,actions=normal",
    "priority=30,in_port=1,actions=output:2",
    "priority=30,in_port=2,actions=push_vlan:0x8100,set_field:4101->vlan_vid,output:1",
    "priority=20,tcp,nw_dst=10.0.0.0/8,tp_src=22,actions=mod_tp_dst:2222,output:2",
    "priority=20,cookie=0x10,udp,actions=mod_nw_dst:10.0.0.9,output:1",
    "table=1,priority=10,actions=output:2",
    "table=1,priority=5,in_port=1,actions=drop",
    "priority=10,tun_id=0x5,actions=output:1",
    "priority=10,idle_timeout=600,hard_timeout=900,ip,nw_tos=32,actions=drop",
    "priority=5,ipv6,ipv6_src=2001:db8::/32,actions=set_field:2001:db8::9->ipv6_src,output:2",
    // ARP's hardware addresses, ND, the flow label, ECN, ICMP rewrites, 802.1ad.
    "priority=45,arp,arp_sha=12:11:11:11:11:11,actions=set_field:aa:aa:aa:aa:aa:aa->arp_sha,output:2",
    "priority=45,arp,arp_tha=22:22:22:00:00:00/ff:ff:ff:00:00:00,actions=set_field:bb:bb:bb:bb:bb:bb->arp_tha,set_field:2->arp_op,set_field:1.2.3.4->arp_spa,set_field:1.2.3.5->arp_tpa,output:1",
    "priority=45,ipv6,ipv6_label=100,actions=set_field:203->ipv6_label,output:2",
    "priority=44,ipv6,ipv6_label=0x64/0xff,actions=output:1",
    "priority=45,icmp6,icmp_type=135,nd_target=20::20,nd_sll=22:22:22:22:22:22,actions=set_field:a0::a0->nd_target,set_field:aa:aa:aa:aa:aa:aa->nd_sll,output:2",
    "priority=45,icmp6,icmp_type=136,nd_tll=22:22:22:22:22:22,actions=set_field:aa:aa:aa:aa:aa:aa->nd_tll,output:1",
    "priority=45,ip,nw_ecn=1,actions=set_field:2->ip_ecn,output:2",
    "priority=45,ipv6,nw_tos=32,nw_ecn=3,actions=mod_nw_ecn:1,output:2",
    "priority=45,icmp,icmp_type=8,icmp_code=0,actions=set_field:0->icmp_type,set_field:1->icmp_code,output:2",
    "priority=45,icmp6,icmpv6_type=128,actions=set_field:129->icmpv6_type,set_field:1->icmpv6_code,output:2",
    "priority=45,ip,nw_src=10.2.0.1,actions=push_vlan:0x88a8,set_field:4196->vlan_vid,output:1",
];

/// Groups of every type both switches support (ports 1 and 2).
const GROUPS: &[&str] = &[
    "group_id=1,type=all,bucket=output:1,bucket=set_field:02:00:00:00:00:09->eth_dst,output:2",
    "group_id=2,type=select,bucket=weight:3,output:1,bucket=weight:5,output:2",
    "group_id=3,type=fast_failover,bucket=watch_port:1,output:1,bucket=watch_port:2,output:2",
    "group_id=4,type=indirect,bucket=push_vlan:0x8100,set_field:4101->vlan_vid,group:1",
];

/// Rules with groups, the action set, metadata and TTL actions.
const GROUP_RULES: &[&str] = &[
    "priority=200,ip,nw_dst=10.9.0.1,actions=group:1",
    "priority=200,ip,nw_dst=10.9.0.2,actions=dec_ttl,group:2",
    "priority=200,tcp,tp_dst=7,actions=write_actions(group:3),write_metadata:0x1/0xff,goto_table:2",
    "table=2,priority=10,metadata=0x1/0xff,actions=set_queue:1,clear_actions,write_actions(output:2)",
    "table=2,priority=5,ip,metadata=0x2,actions=mod_nw_ttl:9,group:4",
];

/// MPLS matches and actions (OVS prints `set_mpls_ttl:9` as `set_mpls_ttl(9)` and
/// `set_mpls_label:N` as `set_field:N->mpls_label`).
const MPLS_RULES: &[&str] = &[
    "priority=300,in_port=1,ip,actions=push_mpls:0x8847,output:2",
    "priority=300,in_port=1,arp,actions=push_mpls:0x8848,output:2",
    "priority=300,in_port=2,mpls,actions=push_mpls:0x8847,output:1",
    "priority=300,in_port=1,mpls,mpls_label=5,actions=pop_mpls:0x0800,goto_table:1",
    "priority=300,in_port=1,mpls,mpls_label=6,actions=dec_mpls_ttl,set_mpls_ttl:9,set_field:7->mpls_label,set_field:3->mpls_tc,output:2",
    "priority=300,in_port=1,mplsm,mpls_label=8,mpls_tc=2,mpls_bos=0,actions=pop_mpls:0x8847,goto_table:1",
    "table=1,priority=300,mpls,mpls_label=9,actions=output:2",
    "priority=300,in_port=1,mpls,mpls_label=11,actions=set_mpls_label:12,set_mpls_tc:2,output:2",
    "priority=300,mpls,mpls_label=13,actions=pop_mpls:0x0800,mod_nw_dst:10.0.0.1,output:2",
];

/// `dump-groups` or `dump-group-stats` lines (header left out), sorted.
fn group_lines(sock: &Path, cmd: &str) -> Vec<String> {
    let out = ofctl_ok(sock, cmd, &[]);
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("OFPST_"))
        .map(|l| l.trim().to_string())
        .collect();
    v.sort();
    v
}

/// The sequence both switches go through; returns each step's `dump-flows`.
fn sequence(sock: &Path) -> Vec<(String, Vec<String>)> {
    let mut steps = Vec::new();
    for r in RULES {
        ofctl_ok(sock, "add-flow", &[r]);
    }
    steps.push(("add-flow".to_string(), flows(sock)));
    ofctl_ok(sock, "mod-flows", &["ip,actions=output:1"]);
    steps.push(("mod-flows".to_string(), flows(sock)));
    ofctl_ok(
        sock,
        "mod-flows",
        &["--strict", "priority=30,in_port=1,actions=drop"],
    );
    steps.push(("mod-flows --strict".to_string(), flows(sock)));
    ofctl_ok(sock, "del-flows", &["--strict", "priority=50,arp,arp_op=2"]);
    steps.push(("del-flows --strict".to_string(), flows(sock)));
    ofctl_ok(sock, "del-flows", &["tcp"]);
    steps.push(("del-flows tcp".to_string(), flows(sock)));
    ofctl_ok(sock, "del-flows", &["cookie=0x10/-1"]);
    steps.push(("del-flows cookie".to_string(), flows(sock)));
    ofctl_ok(sock, "del-flows", &["table=1"]);
    steps.push(("del-flows table=1".to_string(), flows(sock)));
    for g in GROUPS {
        ofctl_ok(sock, "add-group", &[g]);
    }
    steps.push(("dump-groups".to_string(), group_lines(sock, "dump-groups")));
    for r in GROUP_RULES {
        ofctl_ok(sock, "add-flow", &[r]);
    }
    steps.push(("add-flow groups".to_string(), flows(sock)));
    let stats: Vec<String> = group_lines(sock, "dump-group-stats")
        .iter()
        .map(|l| {
            // Durations differ; ref_count and counters must not.
            l.split(',')
                .filter(|f| !f.starts_with("duration="))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    steps.push(("dump-group-stats".to_string(), stats));
    ofctl_ok(
        sock,
        "mod-group",
        &["group_id=2,type=select,bucket=output:1"],
    );
    steps.push(("mod-group".to_string(), group_lines(sock, "dump-groups")));
    ofctl_ok(sock, "del-groups", &["group_id=4"]);
    ofctl_ok(sock, "del-groups", &["group_id=1"]);
    steps.push((
        "del-groups: groups".to_string(),
        group_lines(sock, "dump-groups"),
    ));
    steps.push(("del-groups: rules".to_string(), flows(sock)));
    for r in MPLS_RULES {
        ofctl_ok(sock, "add-flow", &[r]);
    }
    steps.push(("add-flow mpls".to_string(), flows(sock)));
    ofctl_ok(sock, "del-flows", &["mpls,mpls_label=6"]);
    steps.push(("del-flows mpls_label".to_string(), flows(sock)));
    steps
}

/// Debian's ovs-vswitchd with a netdev bridge br0 and dummy ports vm1, vm2 (OpenFlow ports
/// 1 and 2).
struct Ovs {
    _sw: ferrovs_e2e::ovsdb::OvsVswitchd,
    mgmt: PathBuf,
}

fn start_ovs(dir: &Path) -> Ovs {
    let sw = ferrovs_e2e::ovsdb::OvsVswitchd::start(dir, "ovs");
    let mgmt = sw.netdev_br0(true);
    Ovs { _sw: sw, mgmt }
}

fn tools() -> bool {
    require(
        is_root()
            && have("ip")
            && have("ovs-ofctl")
            && Path::new("/usr/sbin/ovs-vswitchd").exists()
            && ovsdb::available(),
        "ovs-ofctl, ovs-vswitchd, ovsdb-server and ovs-vsctl (Debian's openvswitch-switch)",
    )
}

#[test]
fn ovs_ofctl_programs_ferrovs_as_it_programs_ovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("openflow");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || UnixStream::connect(&sock).is_ok());

    // show, port descriptions, tables.
    let show = ofctl_ok(&sock, "show", &[]);
    assert!(show.contains("n_tables:254"), "{show}");
    assert!(show.contains(" 1(vm1): addr:"), "{show}");
    assert!(show.contains(" 2(vm2): addr:"), "{show}");
    let desc = ofctl_ok(&sock, "dump-ports-desc", &[]);
    assert!(desc.contains("state:      LINK_DOWN"), "{desc}");
    let tables = ofctl_ok(&sock, "dump-tables", &[]);
    assert!(tables.contains("table 0:"), "{tables}");
    let ports = ofctl_ok(&sock, "dump-ports", &[]);
    assert!(ports.contains("port  1: rx pkts=0"), "{ports}");
    let d = ofctl_ok(&sock, "dump-desc", &[]);
    assert!(d.contains("Manufacturer: ferrovs"), "{d}");

    // The same sequence against OVS and ferrovs: the same rules at every step.
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs = start_ovs(&ovs_dir);
    let want = sequence(&ovs.mgmt);
    let got = sequence(&sock);
    for ((step, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(g, w, "after {step}: ferrovs (left) and OVS (right) differ");
    }
    assert!(want[0].1.len() >= 20, "{:?}", want[0]);

    // Rules added over OpenFlow are the CLI's rules, saved with the configuration.
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=77,udp,tp_dst=9,actions=output:2"],
    );
    let cli_dump = cli_json(&dir, &["dump-flows", "br0"]);
    assert!(
        cli_dump
            .to_string()
            .contains("priority=77,udp,tp_dst=9 actions=output:vm2"),
        "{cli_dump}"
    );
    // (Written on the daemon's next tick, not per FLOW_MOD.)
    wait_until("the rule in the saved configuration", 5, || {
        std::fs::read_to_string(dir.join("ferrovs.conf.json"))
            .unwrap()
            .contains("priority=77,udp,tp_dst=9")
    });
    // And survive a hot upgrade (the new daemon takes the socket over).
    let _stop = StopCurrent(dir.clone());
    upgrade(&dir, &[]).expect("upgrade");
    wait_until("br0.mgmt after the upgrade", 10, || {
        ofctl(&sock, "show", &[]).0
    });
    let after = flows(&sock);
    assert!(
        after
            .iter()
            .any(|l| l.contains("priority=77,udp,tp_dst=9 actions=output:2")),
        "{after:?}"
    );

    // Refusals: ovs-ofctl prints the OpenFlow error (the same as OVS's where OVS refuses).
    for (rule, err) in [
        ("priority=1,actions=group:1", "OFPBAC_BAD_OUT_GROUP"),
        // (output:9, to a port the bridge lacks, is accepted, as OVS does.)
        (
            "priority=1,actions=meter:1,output:1",
            "OFPMMFC_INVALID_METER",
        ),
        // OpenFlow 1.3 has no mask for nd_target (OVS's extension), and ferrovs's decoder
        // follows the specification.
        (
            "priority=1,icmp6,icmp_type=135,nd_target=20::/64,actions=output:1",
            "OFPBMC_BAD_MASK",
        ),
    ] {
        let (ok, _, e) = ofctl(&sock, "add-flow", &[rule]);
        assert!(!ok, "{rule} was accepted");
        assert!(e.contains(err), "{rule}: {e}");
    }
    // Groups: added, shown as ovs-ofctl prints them, refused twice, deleted.
    let group = "group_id=1,type=all,bucket=output:1";
    let (ok, _, e) = ofctl(&sock, "add-group", &[group]);
    assert!(ok, "{e}");
    let (ok, _, e) = ofctl(&sock, "add-group", &[group]);
    assert!(!ok && e.contains("OFPGMFC_GROUP_EXISTS"), "{e}");
    let out = ofctl_ok(&sock, "dump-groups", &[]);
    assert!(
        out.contains(" group_id=1,type=all,bucket=actions=output:1"),
        "{out}"
    );
    let (ok, _, e) = ofctl(&sock, "del-groups", &["group_id=1"]);
    assert!(ok, "{e}");
    let out = ofctl_ok(&sock, "dump-groups", &[]);
    assert!(!out.contains("group_id=1"), "{out}");
    let (ok, _, e) = ofctl(
        &sock,
        "add-meter",
        &["meter=1,kbps,band=type=dscp_remark,rate=1000,prec_level=1"],
    );
    assert!(!ok && e.contains("OFPMMFC_BAD_BAND"), "{e}");
    // The refusals changed nothing.
    assert_eq!(flows(&sock), after);
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn privileged() -> bool {
    require(
        is_root() && have("ip") && have("ping") && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping and /dev/net/tun (network namespaces, TAP)",
    )
}

/// `n_packets` of the rule whose `dump-flows` line contains `what`.
fn n_packets(sock: &Path, what: &str) -> u64 {
    let out = ofctl_ok(sock, "dump-flows", &[]);
    let line = out
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no rule {what} in {out}"));
    let v = line.split("n_packets=").nth(1).unwrap();
    v[..v.find(',').unwrap()].parse().unwrap()
}

fn ping(ns: &str, to: &str, count: u32) -> (u64, u64) {
    let c = count.to_string();
    let o = Net::exec(ns, &["ping", "-c", &c, "-i", "0.05", "-W", "1", to]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {out}"));
    let num = |i: usize| -> u64 {
        line.split(", ")
            .nth(i)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (num(0), num(1))
}

#[test]
fn rules_from_ovs_ofctl_steer_real_packets_and_hostile_peers_change_nothing() {
    if !(privileged() && require(have("ovs-ofctl"), "ovs-ofctl")) {
        return;
    }
    let dir = run_dir("openflow-traffic");
    let (pmd, _) = cores();
    // A bridge with nothing but two TAP ports (no vhost-user ports).
    let _sw = start_bare_switch(&dir, pmd, &["br0"]);
    let sock = dir.join("br0.mgmt");
    // A peer past HELLO sees the ports come (PORT_STATUS, type 12).
    let mut peer = UnixStream::connect(&sock).unwrap();
    peer.write_all(&[4, 0, 0, 8, 0, 0, 0, 1]).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("of1-"), Net::name("of2-"));
    let (t1, t2) = (Net::name("ta"), Net::name("tb"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.8.0.1/24"),
        ("t2", &t2, &ns2, "10.8.0.2/24"),
    ] {
        net.tap_port(&dir, "br0", p, t, ns, a);
    }
    let desc = ofctl_ok(&sock, "dump-ports-desc", &[]);
    assert!(desc.contains("1(t1)") && desc.contains("2(t2)"), "{desc}");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !(contains(&got, b"t1") && contains(&got, b"t2")) {
        let n = peer.read(&mut buf).expect("PORT_STATUS of t1 and t2");
        assert!(n > 0, "the switch closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    // HELLO (16 bytes, with its version bitmap {1.3, 1.4, 1.5}; the header carries the
    // highest, as OVS's), then PORT_STATUS in the negotiated 1.3 (80 bytes, reason ADD).
    assert_eq!(&got[..4], &[6, 0, 0, 16]);
    assert_eq!(&got[12..16], &[0, 0, 0, 0x70]);
    assert_eq!(&got[16..20], &[4, 12, 0, 80], "{got:?}");
    assert_eq!(got[24], 0, "reason OFPPR_ADD");
    drop(peer);

    // Steer by port; ICMP counted by its own rule.
    ofctl_ok(&sock, "del-flows", &[]);
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=10,in_port=1,actions=output:2"],
    );
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=10,in_port=2,actions=output:1"],
    );
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=20,icmp,in_port=1,actions=output:2"],
    );
    let (tx, rx) = ping(&ns1, "10.8.0.2", 20);
    assert_eq!((tx, rx), (20, 20));
    assert!(n_packets(&sock, "icmp,in_port=1") >= 20);
    assert!(n_packets(&sock, "priority=10,in_port=2") >= 20);

    // Drop ICMP from t1: pings fail, the drop rule counts them.
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=30,icmp,in_port=1,actions=drop"],
    );
    let (tx, rx) = ping(&ns1, "10.8.0.2", 10);
    assert_eq!((tx, rx), (10, 0));
    assert!(n_packets(&sock, "priority=30") >= 10);
    ofctl_ok(
        &sock,
        "del-flows",
        &["--strict", "priority=30,icmp,in_port=1"],
    );

    // Hostile peers while a ping runs: garbage, a truncated header, a 64 KiB message,
    // a wrong version, a peer that never reads, 100 connections opened and abandoned.
    let pinger = std::thread::spawn({
        let ns1 = ns1.clone();
        move || ping(&ns1, "10.8.0.2", 60)
    });
    let mut s = UnixStream::connect(&sock).unwrap();
    let _ = s.write_all(&[0xde; 4096]);
    drop(s);
    let mut s = UnixStream::connect(&sock).unwrap();
    let _ = s.write_all(&[4, 0, 0]);
    drop(s);
    let mut s = UnixStream::connect(&sock).unwrap();
    let mut hello = vec![4u8, 0, 0, 8, 0, 0, 0, 1];
    let mut big = vec![4u8, 14, 0xff, 0xff, 0, 0, 0, 2];
    big.resize(65535, 0xab);
    hello.extend_from_slice(&big);
    let _ = s.write_all(&hello);
    drop(s);
    let mut s = UnixStream::connect(&sock).unwrap();
    let _ = s.write_all(&[1, 0, 0, 8, 0, 0, 0, 1]);
    drop(s);
    // A peer that sends 9 MB of ECHO_REQUESTs and never reads a reply: dropped.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(&[4, 0, 0, 8, 0, 0, 0, 1]);
    let mut echo = vec![4u8, 2, 0xea, 0x68, 0, 0, 0, 3];
    echo.resize(60008, 0x55);
    let mut refused = false;
    for _ in 0..150 {
        if s.write_all(&echo).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "a peer that never reads was not dropped");
    drop(s);
    let abandoned: Vec<UnixStream> = (0..100)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    // The next ovs-ofctl works while they hang.
    ofctl_ok(&sock, "show", &[]);
    drop(abandoned);
    let (tx, rx) = pinger.join().unwrap();
    assert_eq!(tx, 60);
    assert!(rx >= 59, "the switch forwarded throughout: {rx}/60");
    ofctl_ok(&sock, "dump-flows", &[]);
    let stats = ofctl_ok(&sock, "dump-ports", &["1"]);
    assert!(!stats.contains("rx pkts=0,"), "{stats}");
    std::thread::sleep(Duration::from_millis(100));

    if require(have("tcpdump"), "tcpdump") {
        rewritten_frames_leave_with_valid_checksums(&sock, &dir, &ns1, &ns2, &t1, &t2);
    }
}

/// One's-complement sum of 16-bit big-endian words.
fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// Whether a checksum over `s` (the checksum field included) verifies.
fn verifies(mut s: u32) -> bool {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s == 0xffff
}

/// ICMP, ARP and ND frames from t1, rewritten by set_field rules (ICMP code and ECN; ARP's
/// sender addresses; an NS's target, source link-layer option and flow label), arrive at t2
/// with every field as set and every checksum valid, recomputed here from the captured bytes.
fn rewritten_frames_leave_with_valid_checksums(
    sock: &Path,
    dir: &Path,
    ns1: &str,
    ns2: &str,
    t1: &str,
    t2: &str,
) {
    ofctl_ok(sock, "del-flows", &[]);
    for r in [
        "priority=50,in_port=1,icmp,icmp_type=8,actions=set_field:3->icmp_code,set_field:1->ip_ecn,output:2",
        "priority=50,in_port=1,arp,actions=set_field:02:bb:bb:bb:bb:bb->arp_sha,set_field:10.8.0.77->arp_spa,output:2",
        "priority=50,in_port=1,icmp6,icmp_type=135,actions=set_field:2001:db8:8::99->nd_target,set_field:02:aa:aa:aa:aa:aa->nd_sll,set_field:0x12345->ipv6_label,output:2",
        "priority=10,in_port=1,actions=output:2",
        "priority=10,in_port=2,actions=output:1",
    ] {
        ofctl_ok(sock, "add-flow", &[r]);
    }
    for (ns, t, a) in [(ns1, t1, "2001:db8:8::1/64"), (ns2, t2, "2001:db8:8::2/64")] {
        Net::exec(ns, &["ip", "-6", "addr", "add", a, "dev", t, "nodad"]);
    }
    let pcap = dir.join("rewritten.pcap");
    let dump = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns2,
            "tcpdump",
            "--immediate-mode",
            "-i",
            t2,
            "-Q",
            "in",
            "-nn",
            "-U",
            "-w",
        ])
        .arg(&pcap)
        .args(["icmp or arp or icmp6"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // ICMP echo requests (the peer's address is resolved); ARP requests for an absent
    // address; neighbour solicitations for an IPv6 address of t2.
    let _ = ping(ns1, "10.8.0.2", 3);
    let _ = Net::exec(
        ns1,
        &["ping", "-c", "2", "-i", "0.3", "-W", "1", "10.8.0.3"],
    );
    let _ = Net::exec(
        ns1,
        &[
            "ping",
            "-6",
            "-c",
            "2",
            "-i",
            "0.3",
            "-W",
            "1",
            "2001:db8:8::2",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let _ = std::process::Command::new("kill")
        .args(["-INT", &dump.id().to_string()])
        .status();
    let mut dump = dump;
    let _ = dump.wait();
    let (mut icmp, mut arp, mut ns) = (0, 0, 0);
    for (_, f) in pcap_frames(&pcap) {
        if f.len() < 14 || f[6..12] == [0u8; 6] {
            continue;
        }
        match u16::from_be_bytes([f[12], f[13]]) {
            0x0800 if f.len() >= 42 && f[23] == 1 && f[34] == 8 => {
                let ihl = usize::from(f[14] & 0xf) * 4;
                assert!(
                    verifies(sum16(&f[14..14 + ihl])),
                    "IPv4 header checksum {f:02x?}"
                );
                assert_eq!(f[15] & 3, 1, "ECN set {f:02x?}");
                let tot = usize::from(u16::from_be_bytes([f[16], f[17]]));
                let l4 = 14 + ihl;
                assert_eq!(f[l4 + 1], 3, "ICMP code set {f:02x?}");
                assert!(verifies(sum16(&f[l4..14 + tot])), "ICMP checksum {f:02x?}");
                icmp += 1;
            }
            0x0806 if f.len() >= 42 && f[21] == 1 => {
                assert_eq!(f[22..28], [2, 0xbb, 0xbb, 0xbb, 0xbb, 0xbb], "{f:02x?}");
                assert_eq!(f[28..32], [10, 8, 0, 77], "{f:02x?}");
                arp += 1;
            }
            0x86dd if f.len() >= 78 && f[20] == 58 && f[54] == 135 => {
                let flow = u32::from_be_bytes([0, f[15] & 0xf, f[16], f[17]]);
                assert_eq!(flow, 0x12345, "{f:02x?}");
                let plen = usize::from(u16::from_be_bytes([f[18], f[19]]));
                assert_eq!(
                    f[62..78],
                    [0x20, 1, 0xd, 0xb8, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99],
                    "{f:02x?}"
                );
                let mut sll = None;
                let mut o = 78;
                while o + 8 <= 54 + plen && f[o + 1] != 0 {
                    if f[o] == 1 {
                        sll = Some(f[o + 2..o + 8].to_vec());
                    }
                    o += usize::from(f[o + 1]) * 8;
                }
                // A solicitation from an unspecified source carries no SLL option.
                if f[22..38] != [0u8; 16] {
                    assert_eq!(sll, Some(vec![2, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa]), "{f:02x?}");
                }
                let pseudo = sum16(&f[22..54]) + plen as u32 + 58;
                assert!(
                    verifies(pseudo + sum16(&f[54..54 + plen])),
                    "ICMPv6 checksum {f:02x?}"
                );
                ns += 1;
            }
            _ => {}
        }
    }
    assert!(
        icmp >= 3 && arp >= 1 && ns >= 1,
        "icmp {icmp}, arp {arp}, ns {ns}"
    );
}
