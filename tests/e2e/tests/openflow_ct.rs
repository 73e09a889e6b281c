//! Connection tracking over OpenFlow, as operators and controllers program it: the same
//! `ovs-ofctl -O OpenFlow13` commands with `ct()`, `ct_clear` and the `ct_*` matches against
//! ferrovsd's management socket and against real OVS (Debian's ovs-vswitchd, a
//! `datapath_type=netdev` bridge with dummy ports): `dump-flows` of both, without
//! statistics, must be the same; what ferrovs cannot hold (ALGs, `ct_ipv6_*`) is refused
//! with its OpenFlow error and changes nothing. The same comparison for OVN's register
//! programs (registers, `load`, `move`, `resubmit`, `output:REG`, a zone from a register).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use ferrovs_e2e::*;

/// `dump-flows --no-stats`, one rule a line, sorted.
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

/// A stateful pipeline both switches take (ports 1 and 2). `nat(...)` is written before
/// `exec(...)`: OVS keeps the nested actions in the order written and prints a `nat` that
/// follows a `set_field` inside `exec(...)`, an order a rule's `ct()` does not keep.
const CT_RULES: &[&str] = &[
    "table=0,priority=100,ip,ct_state=-trk,actions=ct(table=1,zone=5)",
    "table=0,priority=90,ipv6,ct_state=-trk,actions=ct(table=1,zone=6,nat)",
    "table=1,priority=100,ct_state=+trk+new,tcp,actions=ct(commit,zone=5,nat(src=10.0.0.1-10.0.0.2:1000-2000),exec(set_field:0x1->ct_mark)),output:1",
    "table=1,priority=95,ct_state=+trk+new,udp,actions=ct(commit,zone=5,nat(dst=10.1.1.1:53)),output:1",
    "table=1,priority=94,ct_state=+trk+new,ipv6,actions=ct(commit,zone=6,nat(dst=[2001:db8::1]:80),exec(set_field:0xab->ct_label)),output:1",
    "table=1,priority=93,ct_state=+trk+new,icmp,actions=ct(commit,force,zone=5,exec(set_field:0x2->ct_mark,set_field:0x1->ct_label)),output:2",
    "table=1,priority=90,ct_state=+trk+est-rel,ct_mark=1/1,actions=ct_clear,output:2",
    "table=1,priority=80,ip,ct_state=+trk-inv,ct_label=0x1/0xff,ct_nw_proto=6,ct_nw_src=10.0.0.1,ct_nw_dst=10.0.0.0/24,ct_tp_src=80,ct_tp_dst=0x100/0xff00,ct_zone=5,actions=output:2",
    "table=1,priority=70,ct_state=+trk+inv,actions=drop",
    "table=1,priority=60,ct_state=+rel+rpl+snat+dnat,ct_mark=0x10,actions=output:1",
    "table=2,priority=10,ip,actions=ct(commit,zone=65535,table=3)",
];

/// What both switches do with the same commands: each step's `dump-flows`.
fn sequence(sock: &Path) -> Vec<(String, Vec<String>)> {
    let mut steps = Vec::new();
    for r in CT_RULES {
        ofctl_ok(sock, "add-flow", &[r]);
        steps.push((format!("add-flow {r}"), flows(sock)));
    }
    ofctl_ok(
        sock,
        "mod-flows",
        &["table=1,ct_state=+trk+inv,actions=ct_clear,output:1"],
    );
    steps.push(("mod-flows".to_string(), flows(sock)));
    ofctl_ok(sock, "del-flows", &["table=1,ct_state=+trk+new,tcp"]);
    steps.push(("del-flows ct_state".to_string(), flows(sock)));
    steps
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

struct Ovs {
    _sw: ferrovs_e2e::ovsdb::OvsVswitchd,
    mgmt: PathBuf,
}

#[test]
fn ct_rules_from_ovs_ofctl_are_the_same_on_ferrovs_and_ovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("openflow-ct");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || UnixStream::connect(&sock).is_ok());

    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let sw = ferrovs_e2e::ovsdb::OvsVswitchd::start(&ovs_dir, "ovsct");
    let ovs = Ovs {
        mgmt: sw.netdev_br0(true),
        _sw: sw,
    };
    let want = sequence(&ovs.mgmt);
    let got = sequence(&sock);
    for ((step, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(g, w, "after {step}: ferrovs (left) and OVS (right) differ");
    }
    let last = &want[CT_RULES.len() - 1].1;
    assert!(
        last.len() == CT_RULES.len() + 1 && last[0] == "priority=0 actions=NORMAL",
        "every ct rule installed beside the default rule: {last:#?}"
    );

    // Rules with ct added over OpenFlow are the CLI's rules.
    let cli_dump = cli_json(&dir, &["dump-flows", "br0"]).to_string();
    assert!(cli_dump.contains("ct(table=1,zone=5)"), "{cli_dump}");
    assert!(cli_dump.contains("ct_clear"), "{cli_dump}");

    // What ferrovs cannot hold is refused with its error (OVS takes these).
    let before = flows(&sock);
    for (rule, err) in [
        ("tcp,actions=ct(commit,alg=ftp)", "OFPBAC_BAD_ARGUMENT"),
        (
            "ip,actions=ct(commit,nat(src=10.0.0.1-10.0.0.9,persistent))",
            "OFPBAC_BAD_ARGUMENT",
        ),
        (
            "ipv6,ct_state=+trk-inv,ct_ipv6_src=2001:db8::1,actions=drop",
            "OFPBMC_BAD_FIELD",
        ),
    ] {
        let (ok, _, e) = ofctl(&ovs.mgmt, "add-flow", &[rule]);
        assert!(ok, "OVS refused {rule}: {e}");
        let (ok, _, e) = ofctl(&sock, "add-flow", &[rule]);
        assert!(!ok, "{rule} was accepted");
        assert!(e.contains(err), "{rule}: {e}");
    }
    assert_eq!(flows(&sock), before, "the refusals changed nothing");
}

/// An OVN-shaped register program (ports 1 and 2).
const REG_RULES: &[&str] = &[
    "table=0,priority=100,in_port=1,actions=load:0x1->NXM_NX_REG14[],load:0x7->OXM_OF_METADATA[],resubmit(,8)",
    "table=0,priority=100,in_port=2,actions=load:0x2->NXM_NX_REG14[],load:0x1->NXM_NX_REG10[7],resubmit(,8)",
    "table=8,priority=50,metadata=0x7,reg14=0x1,actions=move:NXM_NX_REG14[]->NXM_NX_REG15[],resubmit(,10)",
    "table=8,priority=40,reg0=0x1/0x1,xxreg1=0x10/0xff,actions=resubmit(1,9),resubmit:2",
    "table=10,priority=100,ip,ct_state=-trk,actions=ct(table=11,zone=NXM_NX_REG13[0..15])",
    "table=10,priority=50,actions=set_field:0x5/0xff->reg3,set_field:0x8->xxreg2,resubmit(,37)",
    "table=11,priority=100,arp,actions=move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],load:0x2->NXM_OF_ARP_OP[]",
    "table=11,priority=90,ip,ct_state=+trk+est,actions=ct(commit,zone=NXM_NX_CT_MARK[0..15]),move:NXM_OF_IP_SRC[]->NXM_NX_XXREG0[96..127]",
    "table=37,priority=100,reg15=0x1,actions=output:NXM_NX_REG15[]",
    "table=37,priority=90,reg15=0x2,actions=load:0->NXM_OF_IN_PORT[],output:NXM_NX_REG15[0..15]",
];

#[test]
fn register_rules_from_ovs_ofctl_are_the_same_on_ferrovs_and_ovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("openflow-regs");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || UnixStream::connect(&sock).is_ok());
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let sw = ferrovs_e2e::ovsdb::OvsVswitchd::start(&ovs_dir, "ovsregs");
    let ovs = Ovs {
        mgmt: sw.netdev_br0(true),
        _sw: sw,
    };
    let add_all = |sock: &Path| -> Vec<String> {
        for r in REG_RULES {
            ofctl_ok(sock, "add-flow", &[r]);
        }
        flows(sock)
    };
    let want = add_all(&ovs.mgmt);
    let got = add_all(&sock);
    assert_eq!(got, want, "ferrovs (left) and OVS (right) differ");
    assert_eq!(want.len(), REG_RULES.len() + 1, "{want:#?}");
    // Rules with registers added over OpenFlow are the CLI's rules.
    let cli_dump = cli_json(&dir, &["dump-flows", "br0"]).to_string();
    assert!(cli_dump.contains("resubmit(,8)"), "{cli_dump}");
    assert!(cli_dump.contains("zone=NXM_NX_REG13[0..15]"), "{cli_dump}");
}
