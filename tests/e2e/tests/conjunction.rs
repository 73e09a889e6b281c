//! Conjunctive matches over OpenFlow, as OVN's ACLs and OpenStack's security groups install
//! them: `ovs-ofctl` adds soft rules (`conjunction(id,k/n)`) and `conj_id=N` rules to
//! ferrovsd and to real OVS (Debian's ovs-vswitchd, a netdev bridge with dummy ports), in
//! OpenFlow 1.3 and 1.5; `dump-flows` of both must be the same; then packet-outs through the
//! tables (`actions=TABLE`) must credit the same rules on both (a completed conjunction
//! credits its `conj_id` rule, never the soft ones; an incomplete one falls through).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use ferrovs_e2e::*;

fn ofctl_v(version: &str, sock: &Path, cmd: &str, args: &[&str]) -> String {
    let o = Command::new("ovs-ofctl")
        .args(["-O", version, "--timeout=10", cmd])
        .arg(format!("unix:{}", sock.display()))
        .args(args)
        .output()
        .expect("ovs-ofctl runs");
    assert!(
        o.status.success(),
        "ovs-ofctl {cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `dump-flows` lines (`--no-stats`, or only `n_packets` kept), sorted.
fn flows(version: &str, sock: &Path, stats: bool) -> Vec<String> {
    let out = if stats {
        ofctl_v(version, sock, "dump-flows", &[])
    } else {
        ofctl_v(version, sock, "dump-flows", &["--no-stats"])
    };
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("OFPST_FLOW") && !l.starts_with("NXST_FLOW"))
        .map(|l| {
            // Keep n_packets and the rule; durations, bytes and idle ages differ.
            l.trim()
                .split([',', ' '])
                .filter(|f| {
                    !f.is_empty()
                        && !f.starts_with("duration=")
                        && !f.starts_with("n_bytes=")
                        && !f.starts_with("idle_age=")
                        && !f.starts_with("cookie=")
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    v.sort();
    v
}

/// OVN's shape for `ip4.src == {10.0.0.1, 10.0.0.2} && tcp.dst == {80, 443}` (conjunction
/// 7), a rule in two conjunctions (7 and 8), a three-clause conjunction 9, and what is
/// left for the rest.
const RULES_13: &[&str] = &[
    "priority=100,ip,nw_src=10.0.0.1,actions=conjunction(7,1/2),conjunction(8,1/2)",
    "priority=100,ip,nw_src=10.0.0.2,actions=conjunction(7,1/2)",
    "priority=100,tcp,tp_dst=80,actions=conjunction(7,2/2)",
    "priority=100,tcp,tp_dst=443,actions=conjunction(7,2/2)",
    "priority=100,conj_id=7,ip,actions=output:2",
    "priority=100,tcp,tp_dst=22,actions=conjunction(8,2/2)",
    "priority=100,conj_id=8,ip,actions=output:1",
    "priority=0,actions=drop",
];

const RULES_15: &[&str] = &[
    "priority=50,ip,nw_dst=10.0.0.9,actions=conjunction(9,1/3)",
    "priority=50,tcp,tp_src=1000,actions=conjunction(9,2/3)",
    "priority=50,tcp,tp_dst=8080,actions=conjunction(9,3/3)",
    "priority=50,conj_id=9,actions=output:2",
];

/// An Ethernet + IPv4 + TCP frame (checksums left 0: classification does not look).
fn tcp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> String {
    let mut f: Vec<u8> = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0];
    f.extend_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0x20, 0, 0, 0, 0, 0]);
    f.iter().map(|b| format!("{b:02x}")).collect()
}

/// Adds the rules, then sends the packets through the tables.
fn program(sock: &Path) {
    for r in RULES_13 {
        ofctl_v("OpenFlow13", sock, "add-flow", &[r]);
    }
    for r in RULES_15 {
        ofctl_v("OpenFlow15", sock, "add-flow", &[r]);
    }
}

fn send(sock: &Path) {
    let a = [10, 0, 0, 1];
    let b = [10, 0, 0, 2];
    let c = [10, 0, 0, 3];
    let nine = [10, 0, 0, 9];
    for frame in [
        tcp_frame(a, c, 5, 80),         // 7 completes
        tcp_frame(b, c, 5, 443),        // 7 completes
        tcp_frame(a, c, 5, 22),         // 8 completes
        tcp_frame(b, c, 5, 22),         // 8 incomplete: table miss rule
        tcp_frame(c, c, 5, 80),         // 7 incomplete
        tcp_frame(c, nine, 1000, 8080), // 9 completes (3 clauses)
        tcp_frame(c, nine, 1001, 8080), // 9 incomplete
    ] {
        ofctl_v(
            "OpenFlow13",
            sock,
            "packet-out",
            &[&format!("in_port=1 packet={frame} actions=TABLE")],
        );
    }
}

fn tools() -> bool {
    require(
        is_root()
            && have("ovs-ofctl")
            && Path::new("/usr/sbin/ovs-vswitchd").exists()
            && ovsdb::available(),
        "ovs-ofctl, ovs-vswitchd, ovsdb-server and ovs-vsctl (Debian's openvswitch-switch)",
    )
}

#[test]
fn conjunctive_rules_install_dump_and_match_as_in_ovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("conjunction");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || UnixStream::connect(&sock).is_ok());
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs_sw = ovsdb::OvsVswitchd::start(&ovs_dir, "ovs");
    let ovs = ovs_sw.netdev_br0(true);

    program(&ovs);
    program(&sock);
    for v in ["OpenFlow13", "OpenFlow15"] {
        let (want, got) = (flows(v, &ovs, false), flows(v, &sock, false));
        assert_eq!(got, want, "{v}: ferrovs (left) and OVS (right) differ");
        assert!(got.iter().any(|l| l.contains("conj_id=7")), "{got:?}");
        assert!(
            got.iter()
                .any(|l| l.contains("actions=conjunction(7,1/2),conjunction(8,1/2)")),
            "{got:?}"
        );
    }
    send(&ovs);
    send(&sock);
    // Stats reach the rules through the megaflows' counters, a moment later.
    let counted = |s: &Path| {
        flows("OpenFlow13", s, true)
            .iter()
            .filter_map(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix("n_packets="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum::<u64>()
    };
    wait_until("OVS counts the packets", 10, || counted(&ovs) >= 7);
    wait_until("ferrovs counts the packets", 10, || counted(&sock) >= 7);
    let (want, got) = (
        flows("OpenFlow13", &ovs, true),
        flows("OpenFlow13", &sock, true),
    );
    eprintln!("{}", got.join("\n"));
    assert_eq!(
        got, want,
        "ferrovs (left) and OVS (right) credited other rules"
    );
    let of = |needle: &str| {
        got.iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle}: {got:?}"))
            .clone()
    };
    assert!(of("conj_id=7").contains("n_packets=2"), "{got:?}");
    assert!(of("conj_id=8").contains("n_packets=1"), "{got:?}");
    assert!(of("conj_id=9").contains("n_packets=1"), "{got:?}");
    assert!(of("priority=0").contains("n_packets=3"), "{got:?}");

    // A clause's rule deleted: the conjunction no longer completes for its values.
    for s in [&ovs, &sock] {
        ofctl_v(
            "OpenFlow13",
            s,
            "del-flows",
            &["--strict", "priority=100,tcp,tp_dst=80"],
        );
        ofctl_v(
            "OpenFlow13",
            s,
            "packet-out",
            &[&format!(
                "in_port=1 packet={} actions=TABLE",
                tcp_frame([10, 0, 0, 1], [10, 0, 0, 3], 5, 80)
            )],
        );
    }
    wait_until("ferrovs counts the packet", 10, || counted(&sock) >= 8);
    wait_until("OVS counts the packet", 10, || counted(&ovs) >= 8);
    let (want, got) = (
        flows("OpenFlow13", &ovs, true),
        flows("OpenFlow13", &sock, true),
    );
    assert_eq!(got, want, "after the deletion");
}
