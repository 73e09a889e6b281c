//! OpenFlow 1.4 and 1.5 on the management socket, as ovn-controller speaks them.
//!
//! 1. Debian's `ovs-ofctl -O OpenFlow15` (OVS's own encoders, the ones ovn-controller links)
//!    against ferrovsd: version negotiation, FEATURES and 1.5 port descriptions, flows in a
//!    bundle (all or nothing), the Geneve TLV table, 1.5 group-mods with a selection method,
//!    1.5 packet-outs; `-O OpenFlow13` unchanged beside it, and a bridge limited to 1.3.
//! 2. The real ovn-controller (OVN 23.03, `ovn-host`) on one chassis: a private vswitch
//!    ovsdb-server and southbound ovsdb-server, ferrovsd configured through the first,
//!    ovn-controller through both; its three OpenFlow connections (ofctrl, pinctrl, the
//!    feature probe) must negotiate 1.5 and stay up; what it sends that ferrovs refuses is
//!    counted by error name in `ferrovs show --json`'s `openflow` (and printed).
//! 3. The same chassis across a hot upgrade: ovn-controller's connections are handed over
//!    (no reconnect in its log) and it sends no flow again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ferrovs_e2e::ovsdb::*;
use ferrovs_e2e::*;
use serde_json::Value;

/// `ovs-ofctl -O VERSIONS ARGS… unix:SOCK REST…`: (success, stdout, stderr).
fn ofctl_v(versions: &str, sock: &Path, cmd: &str, args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new("ovs-ofctl");
    c.args(["-O", versions, "--timeout=10"]);
    let (flags, rest): (Vec<&str>, Vec<&str>) = args.iter().partition(|a| a.starts_with("--"));
    c.args(&flags)
        .arg(cmd)
        .arg(format!("unix:{}", sock.display()))
        .args(&rest);
    let o = c.output().expect("ovs-ofctl runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn of15(sock: &Path, cmd: &str, args: &[&str]) -> String {
    let (ok, out, err) = ofctl_v("OpenFlow15", sock, cmd, args);
    assert!(ok, "ovs-ofctl -O OpenFlow15 {cmd} {args:?}: {err}");
    out
}

fn openflow_status(dir: &Path) -> Value {
    cli_json(dir, &["show"])["openflow"].clone()
}

/// `ferrovs dump-flows br0`, each rule as JSON text.
fn rules(dir: &Path) -> Vec<String> {
    let v = cli_json(dir, &["dump-flows", "br0"]);
    let arr = v.as_array().unwrap_or_else(|| panic!("dump-flows: {v}"));
    arr.iter().map(|r| r.to_string()).collect()
}

#[test]
fn ovs_ofctl_openflow15() {
    if !require(have("ovs-ofctl"), "ovs-ofctl (openvswitch-common)") {
        return;
    }
    let dir = run_dir("of15");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || sock.exists());

    // Negotiation: 1.5, 1.4, 1.3 alone; 1.0 alone has nothing in common.
    let out = of15(&sock, "show", &[]);
    assert!(out.contains("OFPT_FEATURES_REPLY (OF1.5)"), "{out}");
    assert!(out.contains("vm1") && out.contains("vm2"), "{out}");
    let (ok, out, err) = ofctl_v("OpenFlow14", &sock, "dump-ports-desc", &[]);
    assert!(ok, "{err}");
    assert!(out.contains("OFPST_PORT_DESC reply (OF1.4)"), "{out}");
    let (ok, out, _) = ofctl_v("OpenFlow13", &sock, "show", &[]);
    assert!(ok && out.contains("OFPT_FEATURES_REPLY (OF1.3)"), "{out}");
    let (ok, _, err) = ofctl_v("OpenFlow10", &sock, "show", &[]);
    assert!(!ok, "1.0 must not be negotiated");
    assert!(err.contains("version negotiation failed"), "{err}");

    // Flows in a 1.5 bundle (open, add × 3, commit, barrier): all in.
    let before = rules(&dir).len();
    let flows = dir.join("flows.txt");
    std::fs::write(
        &flows,
        "priority=100,ip,nw_dst=10.0.0.1,actions=output:2\n\
         priority=90,arp,actions=flood\n\
         table=1,priority=10,actions=output:1\n",
    )
    .unwrap();
    of15(&sock, "add-flows", &["--bundle", flows.to_str().unwrap()]);
    let r = rules(&dir);
    assert_eq!(r.len(), before + 3, "{r:?}");
    // 1.5 flow statistics (OXS) and aggregate.
    let out = of15(&sock, "dump-flows", &[]);
    assert!(out.contains("OFPST_FLOW reply (OF1.5)"), "{out}");
    assert!(out.contains("nw_dst=10.0.0.1"), "{out}");
    let out = of15(&sock, "dump-aggregate", &[]);
    assert!(out.contains(&format!("flow_count={}", before + 3)), "{out}");
    // A bundle with a rule the codec refuses (note, a Nicira action ferrovs lacks):
    // its ADD gets the error, ovs-ofctl sees it at its barrier and discards the bundle.
    std::fs::write(
        &flows,
        "priority=80,ip,actions=output:1\n\
         priority=70,ip,actions=note:01.02.03.04.05.06,output:1\n",
    )
    .unwrap();
    let (ok, _, err) = ofctl_v(
        "OpenFlow15",
        &sock,
        "add-flows",
        &["--bundle", flows.to_str().unwrap()],
    );
    assert!(!ok && err.contains("OFPBAC_BAD_VENDOR_TYPE"), "{err}");
    assert_eq!(
        rules(&dir).len(),
        before + 3,
        "a discarded bundle was applied"
    );
    // A bundle whose second rule the switch refuses only when applying it (a group it
    // lacks): the commit fails whole (the first rule is taken back), as OVS's.
    std::fs::write(
        &flows,
        "priority=80,ip,actions=output:1\n\
         priority=70,ip,actions=group:99\n",
    )
    .unwrap();
    let (ok, _, err) = ofctl_v(
        "OpenFlow15",
        &sock,
        "add-flows",
        &["--bundle", flows.to_str().unwrap()],
    );
    assert!(!ok, "a bundle with a refused flow must fail");
    assert!(
        err.contains("OFPBAC_BAD_OUT_GROUP") || err.contains("OFPBFC_MSG_FAILED"),
        "{err}"
    );
    assert_eq!(
        rules(&dir).len(),
        before + 3,
        "the bundle was applied in part"
    );
    let st = openflow_status(&dir);
    assert_eq!(st["bundles_committed"], 1, "{st}");
    assert_eq!(st["bundles_failed"], 1, "{st}");
    assert!(
        st["refused"]["OFPBAC_BAD_EXP_TYPE"].as_u64() >= Some(1),
        "{st}"
    );

    // The Geneve TLV table: ovn-controller's mapping, then a duplicate.
    of15(
        &sock,
        "add-tlv-map",
        &["{class=0x0102,type=0x80,len=4}->tun_metadata0"],
    );
    let out = of15(&sock, "dump-tlv-map", &[]);
    assert!(
        out.contains("0x102") && out.contains("tun_metadata0"),
        "{out}"
    );
    let (ok, _, err) = ofctl_v(
        "OpenFlow15",
        &sock,
        "add-tlv-map",
        &["{class=0x0102,type=0x81,len=8}->tun_metadata0"],
    );
    assert!(!ok && err.contains("NXTTMFC_ALREADY_MAPPED"), "{err}");
    let st = openflow_status(&dir);
    assert_eq!(
        st["tlv_maps"]["br0"][0], "tun_metadata0=0x0102,0x80,4",
        "{st}"
    );

    // A 1.5 select group with OVN's selection method, then a rule using it.
    of15(
        &sock,
        "add-group",
        &["group_id=7,type=select,selection_method=dp_hash,bucket=bucket_id=0,weight=100,actions=output:1,bucket=bucket_id=1,weight=100,actions=output:2"],
    );
    let g = cli(&dir, &["dump-groups", "br0"]);
    let g = String::from_utf8_lossy(&g.stdout);
    assert!(g.contains("group_id=7") && g.contains("select"), "{g}");
    of15(&sock, "add-flow", &["priority=5,udp,actions=group:7"]);

    // A 1.5 packet-out (in_port in the match).
    of15(
        &sock,
        "packet-out",
        &["in_port=1 packet=ffffffffffff0200000000010806000108000604000102000000000100000000000000000000000000 actions=output:2"],
    );
    // OpenFlow 1.3 works as before beside it.
    let (ok, out, err) = ofctl_v("OpenFlow13", &sock, "dump-flows", &[]);
    assert!(ok, "{err}");
    assert!(out.contains("nw_dst=10.0.0.1"), "{out}");
    let st = openflow_status(&dir);
    assert!(st["negotiated"]["1.5"].as_u64().unwrap() >= 8, "{st}");
    eprintln!("openflow status: {st}");

    // A bridge whose protocols leave out 1.4 and 1.5 refuses them.
    let o = cli(&dir, &["set-bridge", "br0", "protocols=OpenFlow13"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ok, _, err) = ofctl_v("OpenFlow15", &sock, "show", &[]);
    assert!(!ok && err.contains("version negotiation failed"), "{err}");
    assert!(ofctl_v("OpenFlow13", &sock, "show", &[]).0);
}

/// The southbound schema of Debian's ovn-common.
const SB_SCHEMA: &str = "/usr/share/ovn/ovn-sb.ovsschema";

/// An ovsdb-server on `db` listening at `sock` (detached, killed through its pidfile).
fn ovsdb_server(dir: &Path, name: &str, schema: &str) -> PathBuf {
    let db = dir.join(format!("{name}.db"));
    let sock = dir.join(format!("{name}.sock"));
    let o = Command::new("ovsdb-tool")
        .arg("create")
        .arg(&db)
        .arg(schema)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new("ovsdb-server")
        .arg(&db)
        .arg(format!("--remote=punix:{}", sock.display()))
        .arg(format!("--pidfile={}/{name}.pid", dir.display()))
        .arg(format!("--unixctl={}/{name}.ctl", dir.display()))
        .arg(format!("--log-file={}/{name}.log", dir.display()))
        .arg("--detach")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    sock
}

/// Kills the daemon whose pidfile is `dir/NAME.pid`.
fn kill_pidfile(dir: &Path, name: &str) {
    if let Ok(pid) = std::fs::read_to_string(dir.join(format!("{name}.pid"))) {
        let _ = Command::new("kill").arg(pid.trim()).status();
    }
}

struct Daemons(PathBuf);

impl Drop for Daemons {
    fn drop(&mut self) {
        for n in ["ovn-controller", "sb", "vs"] {
            kill_pidfile(&self.0, n);
        }
    }
}

/// Log lines of `file` containing `what`.
fn lines(file: &Path, what: &str) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

/// One chassis: a private vswitch and southbound ovsdb-server, ferrovsd configured
/// through the first, ovn-controller through both; returned once its three OpenFlow
/// connections negotiated 1.5 and its TLV map is in place (`None`: a tool or root is
/// missing, the test is skipped).
struct Chassis {
    dir: PathBuf,
    log: PathBuf,
    // Dropped in this order: the switch, then the databases and ovn-controller.
    _sw: Proc,
    _d: Daemons,
}

fn ovn_chassis(name: &str) -> Option<Chassis> {
    if !(require(
        have("ovn-controller") && Path::new(SB_SCHEMA).exists(),
        "ovn-controller and the OVN southbound schema (Debian's ovn-host)",
    ) && require(available(), "ovsdb-server, ovsdb-tool, ovs-vsctl")
        && require(is_root(), "root (br-int's internal port is a TAP)"))
    {
        return None;
    }
    let dir = run_dir(name);
    let d = Daemons(dir.clone());
    let vs = ovsdb_server(&dir, "vs", "/usr/share/openvswitch/vswitch.ovsschema");
    let sb = ovsdb_server(&dir, "sb", SB_SCHEMA);
    let vsctl = |args: &[&str]| {
        let o = Command::new("ovs-vsctl")
            .arg(format!("--db=unix:{}", vs.display()))
            .arg("--no-wait")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    vsctl(&["init"]);
    let remote = format!("external_ids:ovn-remote=unix:{}", sb.display());
    vsctl(&[
        "set",
        "open",
        ".",
        "external_ids:system-id=chassis-1",
        &remote,
        "external_ids:ovn-encap-type=geneve",
        "external_ids:ovn-encap-ip=127.0.0.1",
        "external_ids:ovn-bridge-datapath-type=netdev",
    ]);
    // The SB_Global row northd would make (ovn-controller 23.03 crashes without it, with
    // OVS as with ferrovs).
    let o = Command::new("ovn-sbctl")
        .arg(format!("--db=unix:{}", sb.display()))
        .arg("init")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (pmd, _) = cores();
    let remote = format!("unix:{}", vs.display());
    let sw = start_switch(&dir, pmd, &["--ovsdb", &remote]);
    // ovn-controller finds br-int.mgmt in OVS_RUNDIR: ferrovsd's run directory.
    let log = dir.join("ovn-controller.log");
    let o = Command::new("ovn-controller")
        .env("OVS_RUNDIR", &dir)
        .env("OVN_RUNDIR", &dir)
        .arg(&remote)
        .arg(format!("--pidfile={}/ovn-controller.pid", dir.display()))
        .arg(format!("--log-file={}", log.display()))
        .args([
            "-vconsole:off",
            "-vfile:info",
            "-vvconn:file:dbg",
            "--detach",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until("br-int.mgmt", 30, || dir.join("br-int.mgmt").exists());
    // Three connections (ofctrl, pinctrl, features) negotiate 1.5.
    wait_until("three OpenFlow 1.5 connections", 30, || {
        openflow_status(&dir)["negotiated"]["1.5"]
            .as_u64()
            .is_some_and(|n| n >= 3)
    });
    wait_until("the TLV map", 30, || {
        openflow_status(&dir)["tlv_maps"]["br-int"][0] == "tun_metadata0=0x0102,0x80,4"
    });
    Some(Chassis {
        dir,
        log,
        _sw: sw,
        _d: d,
    })
}

#[test]
fn ovn_controller_single_chassis() {
    let Some(ch) = ovn_chassis("ovn-controller") else {
        return;
    };
    let (dir, log) = (&ch.dir, &ch.log);
    let first = openflow_status(dir);
    std::thread::sleep(Duration::from_secs(15));
    let st = openflow_status(dir);
    let negotiated = lines(log, "negotiated OpenFlow version 0x06");
    let disconnects = lines(log, "connection closed by peer");
    eprintln!("ovn-controller negotiations:\n{}", negotiated.join("\n"));
    eprintln!("disconnects seen by ovn-controller: {}", disconnects.len());
    eprintln!("ferrovs openflow status after 15 s: {st}");
    for l in lines(log, "OpenFlow error") {
        eprintln!("ovn-controller: {l}");
    }
    assert!(negotiated.len() >= 3, "{negotiated:?}");
    // The switch never drops ovn-controller.
    assert_eq!(st["dropped"], first["dropped"], "{st}");
    assert!(disconnects.is_empty(), "{disconnects:?}");
    // pinctrl's and the feature probe's connections stay up (ofctrl reconnects by itself
    // on any OpenFlow error: until every flow OVN sends is supported it may cycle).
    assert!(st["connections"]["1.5"].as_u64().unwrap_or(0) >= 2, "{st}");
    assert_eq!(
        st["tlv_maps"]["br-int"][0], "tun_metadata0=0x0102,0x80,4",
        "{st}"
    );
}

/// The real ovn-controller across a hot upgrade: its three OpenFlow connections are
/// handed over (its log shows no new negotiation, no connection closed, no reconnect), it
/// sends no flow again (the new daemon commits no bundle: ovn-controller did not resync),
/// and the TLV table answers as before.
#[test]
fn ovn_controller_keeps_its_connections_across_a_hot_upgrade() {
    let Some(ch) = ovn_chassis("ovn-upgrade") else {
        return;
    };
    let (dir, log) = (&ch.dir, &ch.log);
    let _stop = StopCurrent(dir.clone());
    // Settled: no bundle for 3 s.
    let mut last = openflow_status(dir)["bundles_committed"].clone();
    let t = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = openflow_status(dir)["bundles_committed"].clone();
        if now == last || t.elapsed() > Duration::from_secs(30) {
            break;
        }
        last = now;
    }
    let before = openflow_status(dir);
    let count = |what: &str| lines(log, what).len();
    let (neg, closed, connecting) = (
        count("negotiated OpenFlow version"),
        count("connection closed"),
        count("connecting..."),
    );
    let r = upgrade(dir, &[]).expect("upgrade");
    assert_eq!(r["ok"], true, "{r}");
    std::thread::sleep(Duration::from_secs(10));
    let after = openflow_status(dir);
    eprintln!("before the upgrade: {before}\nafter: {after}");
    for l in lines(log, "rconn") {
        eprintln!("ovn-controller: {l}");
    }
    assert_eq!(after["handover_refused"], 0, "{after}");
    assert!(
        after["handed_over"].as_u64().is_some_and(|n| n >= 3),
        "{after}"
    );
    assert_eq!(
        count("negotiated OpenFlow version"),
        neg,
        "no new negotiation"
    );
    assert_eq!(count("connection closed"), closed, "no connection closed");
    assert_eq!(count("connecting..."), connecting, "no reconnect");
    // No resync: ovn-controller sent the new daemon no bundle (its counters start at 0).
    assert_eq!(after["bundles_committed"], 0, "{after}");
    assert!(
        after["connections"]["1.5"].as_u64().unwrap_or(0) >= 3,
        "{after}"
    );
    assert_eq!(after["tlv_maps"], before["tlv_maps"], "{after}");
}
