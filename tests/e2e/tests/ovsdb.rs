//! ferrovsd configured through OVSDB: a real ovsdb-server with the stock vswitch schema,
//! the real ovs-vsctl, and the command sequences of OVS-DPDK's documentation unchanged
//! (plain `ovs-vsctl`, without `--no-wait`: it returns because ferrovs writes `cur_cfg`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferrovs_e2e::ovsdb::*;
use ferrovs_e2e::*;
use serde_json::Value;

fn taskset() -> &'static Path {
    Path::new("/usr/bin/taskset")
}

/// Everything an OVSDB test needs, or a skip (never under CI=true).
fn ready() -> bool {
    require(
        available(),
        "ovsdb-server, ovsdb-tool, ovs-vsctl and vswitch.ovsschema",
    ) && require(
        is_root(),
        "root (TAP devices for the bridges' internal ports)",
    )
}

/// A database and a ferrovsd configured through it, in a fresh run directory.
fn setup(name: &str) -> (PathBuf, OvsdbServer, Proc) {
    let dir = run_dir(name);
    let db = OvsdbServer::start(&dir);
    let (pmd, _) = cores();
    let sw = start_switch_ovsdb(&dir, pmd, &db);
    (dir, db, sw)
}

/// `ferrovs show`'s port `name`, if the switch runs it.
fn port(dir: &Path, name: &str) -> Option<Value> {
    let s = cli_json(dir, &["show"]);
    s["bridges"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["ports"].as_array().unwrap().iter())
        .find(|p| p["name"] == name)
        .cloned()
}

fn bridges(dir: &Path) -> Vec<String> {
    let s = cli_json(dir, &["show"]);
    s["bridges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

/// `ferrovs-gen ARGS` on the traffic core.
fn gen(dir: &Path, name: &str, args: &[&str]) -> Proc {
    let (_, core) = cores();
    let core = core.to_string();
    let g = bin("ferrovs-gen").display().to_string();
    let mut a = vec!["-c", core.as_str(), g.as_str()];
    a.extend_from_slice(args);
    Proc::spawn(name, dir, taskset(), &a)
}

/// `count` packets at `rate` from `from`'s socket to `to`'s (both ferrovs-listening ports)
/// while `during` runs; every packet must arrive (none lost, none dropped).
fn stream(dir: &Path, from: &Path, to: &Path, count: u64, rate: u64, during: impl FnOnce()) {
    let (c, r) = (count.to_string(), rate.to_string());
    let (f, t) = (from.display().to_string(), to.display().to_string());
    let tx = gen(
        dir,
        "tx",
        &[
            "--socket",
            &f,
            "--sink",
            &t,
            "--ring",
            "1024",
            "--rate",
            &r,
            "--count",
            &c,
            "--quiet",
            "--duration",
            "60",
            "txonly",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    during();
    let res = tx.wait_json(dir, Duration::from_secs(90));
    assert_eq!(res["sent"].as_u64().unwrap(), count, "{res}");
    assert_eq!(res["corrupt"], 0, "{res}");
    assert_eq!(
        res["received"].as_u64().unwrap(),
        count,
        "nothing lost: {res}"
    );
}

/// OVS-DPDK's documentation, command by command: a netdev bridge, a vhost-user client port
/// and a server port, an OpenFlow number asked for, traffic between them, then removal.
#[test]
fn the_ovs_dpdk_documentation_sequence() {
    if !ready() {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-doc");
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    assert_eq!(bridges(&dir), vec!["br0"]);
    assert_eq!(db.get("Interface", "br0", "ofport").unwrap(), "65534");
    assert_eq!(port(&dir, "br0").unwrap()["type"], "tap");
    // The frontend of the client port listens (as QEMU with server=on).
    let vhu0 = dir.join("vhu0.sock");
    let path = vhu0.display().to_string();
    let sink = gen(
        &dir,
        "sink",
        &[
            "--socket",
            &path,
            "--server",
            "--ring",
            "1024",
            "--src",
            "02:00:00:00:00:02",
            "--quiet",
            "--duration",
            "60",
            "--idle",
            "5",
            "rxonly",
        ],
    );
    db.add_port(
        "br0",
        "vhu0",
        &[
            "type=dpdkvhostuserclient",
            &format!("options:vhost-server-path={path}"),
        ],
    )
    .unwrap();
    db.add_port("br0", "dpdkvhostuser0", &["type=dpdkvhostuser"])
        .unwrap();
    // ferrovs listens at vhost-sock-dir (by default its run directory)/NAME.
    let server_sock = dir.join("dpdkvhostuser0");
    assert!(server_sock.exists());
    db.vsctl(&["set", "Interface", "vhu0", "ofport_request=5"])
        .unwrap();
    assert_eq!(db.get("Interface", "vhu0", "ofport").unwrap(), "5");
    assert_eq!(port(&dir, "vhu0").unwrap()["ofport"], 5);
    db.vsctl(&["wait-until", "Interface", "vhu0", "link_state=up"])
        .unwrap();
    assert_eq!(
        db.get("Interface", "vhu0", "status:mode").unwrap(),
        "client"
    );
    assert_eq!(db.get("Interface", "vhu0", "error").unwrap(), "[]");
    assert_eq!(
        db.get("Interface", "dpdkvhostuser0", "link_state").unwrap(),
        "down"
    );
    // Traffic: dpdkvhostuser0 → vhu0.
    let s = server_sock.display().to_string();
    let tx = gen(
        &dir,
        "tx",
        &[
            "--socket",
            &s,
            "--ring",
            "1024",
            "--rate",
            "10000",
            "--count",
            "20000",
            "--quiet",
            "--duration",
            "30",
            "txonly",
        ],
    );
    let sent = tx.wait_json(&dir, Duration::from_secs(60));
    let got = sink.wait_json(&dir, Duration::from_secs(60));
    assert_eq!(sent["sent"], 20000, "{sent}");
    let drops = path_drops(&dir, "dpdkvhostuser0", "vhu0");
    assert_eq!(got["corrupt"], 0, "{got}");
    // Every generated packet is received or a counted drop. The counters may also hold the
    // generators' own announce frames (one each, flooded before the other side posted its
    // receive buffers): at most two counted drops beyond the 20 000.
    let accounted = got["received"].as_u64().unwrap() + drops;
    assert!((20000..=20002).contains(&accounted), "{got}, drops {drops}");
    // What ovs-vswitchd would show and list.
    let show = db.vsctl(&["show"]).unwrap();
    for want in [
        "Bridge br0",
        "datapath_type: netdev",
        "Port vhu0",
        "type: dpdkvhostuserclient",
        "options: {vhost-server-path=",
        "Port dpdkvhostuser0",
        "type: dpdkvhostuser",
        "ovs_version: \"3.1.0+ferrovs.",
    ] {
        assert!(show.contains(want), "{want} in:\n{show}");
    }
    let list = db.vsctl(&["list", "Interface", "vhu0"]).unwrap();
    assert!(list.contains("ofport              : 5"), "{list}");
    assert!(
        list.contains("link_state          : down") || list.contains("link_state          : up")
    );
    // (The bridge's TAP adds what the host stack sends: IPv6 neighbour discovery...)
    wait_until("statistics written", 15, || {
        db.get("Interface", "vhu0", "statistics:tx_packets")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= 20000)
    });
    let rx: u64 = db
        .get("Interface", "dpdkvhostuser0", "statistics:rx_packets")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(rx, 20000);
    let dp = db.get("Bridge", "br0", "datapath_id").unwrap();
    assert_eq!(dp.len(), 16, "{dp}");
    assert_eq!(
        db.get("Open_vSwitch", ".", "datapath_types").unwrap(),
        "[netdev]"
    );
    // Removal.
    db.vsctl(&["del-port", "br0", "dpdkvhostuser0"]).unwrap();
    assert!(port(&dir, "dpdkvhostuser0").is_none());
    assert!(!server_sock.exists());
    assert!(port(&dir, "vhu0").is_some());
    db.vsctl(&["del-br", "br0"]).unwrap();
    assert!(bridges(&dir).is_empty());
    let s = cli_json(&dir, &["show"]);
    assert_eq!(s["ovsdb"]["state"], "synced", "{s}");
    assert_eq!(s["ovsdb"]["refused_inputs"], 0, "{s}");
}

/// Each bad row lands in its interface's `error` with the port absent (`ofport` -1), and
/// the good ports forward as if nothing were wrong.
#[test]
fn bad_configuration_lands_in_interface_error() {
    if !ready() {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-bad");
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    // ovs-vsctl returns (cur_cfg) and warns about the interface's error.
    let add = |name: &str, settings: &[&str]| {
        db.add_port("br0", name, settings).unwrap();
    };
    add("good1", &["type=dpdkvhostuser", "ofport_request=7"]);
    add("good2", &["type=dpdkvhostuser"]);
    add("weird", &["type=gre0"]);
    add("nopath", &["type=dpdkvhostuserclient"]);
    add("dup7", &["type=dpdkvhostuser", "ofport_request=7"]);
    add("vx", &["type=vxlan", "options:key=5"]);
    add("pp", &["type=patch", "options:peer=x"]);
    db.vsctl(&[
        "add-br",
        "brs",
        "--",
        "set",
        "bridge",
        "brs",
        "datapath_type=system",
    ])
    .unwrap();
    db.add_port("brs", "sysp", &["type=dpdkvhostuser"]).unwrap();
    let cases = [
        ("weird", "interface type gre0 is not supported"),
        (
            "nopath",
            "options:vhost-server-path is required for dpdkvhostuserclient interfaces",
        ),
        (
            "dup7",
            "ofport_request=7 is already requested by another interface",
        ),
        ("vx", "options:remote_ip is required for vxlan interfaces"),
        ("pp", "patch ports are not supported"),
        ("sysp", "datapath_type system is not supported"),
        ("brs", "datapath_type system is not supported"),
    ];
    for (name, why) in cases {
        let e = db.get("Interface", name, "error").unwrap();
        assert!(e.contains(why), "{name}: {e}");
        assert_eq!(db.get("Interface", name, "ofport").unwrap(), "-1", "{name}");
        assert!(port(&dir, name).is_none(), "{name} must not run");
    }
    assert_eq!(bridges(&dir), vec!["br0"]);
    assert_eq!(db.get("Interface", "good1", "ofport").unwrap(), "7");
    assert_eq!(db.get("Interface", "good1", "error").unwrap(), "[]");
    let s = cli_json(&dir, &["show"]);
    assert_eq!(s["ovsdb"]["refused_interfaces"], 7, "{s}");
    stream(
        &dir,
        &dir.join("good1"),
        &dir.join("good2"),
        10_000,
        10_000,
        || {},
    );
    // Fixing a row brings its port up; the others are not touched.
    let connects = port(&dir, "good1").unwrap()["connects"].clone();
    db.vsctl(&[
        "set",
        "Interface",
        "vx",
        "options:remote_ip=127.0.0.9",
        "options:local_ip=127.0.0.1",
    ])
    .unwrap();
    assert_eq!(db.get("Interface", "vx", "error").unwrap(), "[]");
    assert!(port(&dir, "vx").is_some());
    assert_eq!(port(&dir, "good1").unwrap()["connects"], connects);
}

/// ovsdb-server killed and restarted under traffic: not a packet lost (the switch keeps its
/// configuration), then a change made after the restart is applied.
#[test]
fn ovsdb_server_restart_under_traffic() {
    if !ready() {
        return;
    }
    let (dir, mut db, _sw) = setup("ovsdb-restart");
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    for p in ["p1", "p2"] {
        db.add_port("br0", p, &["type=dpdkvhostuser"]).unwrap();
    }
    stream(
        &dir,
        &dir.join("p1"),
        &dir.join("p2"),
        40_000,
        10_000,
        || {
            db.kill();
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(cli_json(&dir, &["show"])["ovsdb"]["state"], "backoff");
            db.run();
        },
    );
    db.add_port("br0", "p3", &["type=dpdkvhostuser"]).unwrap();
    assert!(port(&dir, "p3").is_some());
    assert_eq!(db.get("Interface", "p3", "error").unwrap(), "[]");
    let s = cli_json(&dir, &["show"]);
    assert!(s["ovsdb"]["connects"].as_u64().unwrap() >= 2, "{s}");
}

/// Hot upgrade in OVSDB mode under traffic: the new daemon reconnects to the database and
/// finds every port as the database asks, so no live port is reconfigured.
#[test]
fn hot_upgrade_in_ovsdb_mode_under_traffic() {
    if !ready() {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-upgrade");
    let _stop = StopCurrent(dir.clone());
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    for p in ["p1", "p2"] {
        db.add_port("br0", p, &["type=dpdkvhostuser"]).unwrap();
    }
    db.vsctl(&["set", "Interface", "p2", "ofport_request=9"])
        .unwrap();
    let old = daemon_pid(&dir);
    stream(
        &dir,
        &dir.join("p1"),
        &dir.join("p2"),
        30_000,
        10_000,
        || {
            let r = upgrade(&dir, &[]).expect("upgrade");
            assert_eq!(r["ok"], true, "{r}");
        },
    );
    assert_ne!(daemon_pid(&dir), old);
    for p in ["p1", "p2"] {
        let st = port(&dir, p).unwrap();
        assert_eq!(st["connects"], 1, "{p} was not reconfigured: {st}");
    }
    assert_eq!(port(&dir, "p2").unwrap()["ofport"], 9);
    db.add_port("br0", "p3", &["type=dpdkvhostuser"]).unwrap();
    assert!(port(&dir, "p3").is_some());
    assert_eq!(db.get("Interface", "p2", "ofport").unwrap(), "9");
    let s = cli_json(&dir, &["show"]);
    assert_eq!(s["ovsdb"]["state"], "synced", "{s}");
}

/// The local inode of `pid`'s connection to the unix socket `server` (from `ss -xpn`: the
/// server's end names the path and its peer's inode, the client's end that inode and the
/// process).
fn db_conn_inode(server: &Path, pid: u64) -> Option<u64> {
    let o = std::process::Command::new("ss")
        .args(["-xpn"])
        .output()
        .expect("ss runs");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let path = server.display().to_string();
    // Columns: Netid State Recv-Q Send-Q Local Inode Peer Inode [Process].
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let server_peers: Vec<&str> = rows
        .iter()
        .filter(|r| r.len() >= 8 && r[4] == path)
        .map(|r| r[7])
        .collect();
    let me = format!("pid={pid},");
    rows.iter()
        .filter(|r| r.len() >= 9 && server_peers.contains(&r[5]))
        .find(|r| r[8..].iter().any(|c| c.contains(&me)))
        .and_then(|r| r[5].parse().ok())
}

/// The database connection is handed over at a hot upgrade: the new daemon goes on on the
/// very socket the old one had (same inode; ovsdb-server sees no new connection), with
/// no resynchronisation, and `ovs-vsctl add-port`s run during and right after the upgrade
/// are each applied once (an update applied twice would be refused as an insert of an
/// existing row and cost the connection; one lost would leave its `ovs-vsctl` waiting for
/// `cur_cfg`). `FERROVS_WRITE_FIXTURE=1` captures `upgrade-state-v3-ovsdbconn.json` here.
#[test]
fn the_database_connection_is_handed_over_at_an_upgrade() {
    use ferrovs_control::upgrade::{Channel, Msg};
    if !ready() {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-handover");
    let _stop = StopCurrent(dir.clone());
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    for p in ["p1", "p2"] {
        db.add_port("br0", p, &["type=dpdkvhostuser"]).unwrap();
    }
    let old = daemon_pid(&dir);
    if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
        let path = dir.join("ferrovs.upgrade");
        let mut ch = Channel::new(ferrovs_sys::os::seqpacket_connect(&path).unwrap()).unwrap();
        let hello = Msg::Hello {
            schema_min: 3,
            schema_max: 3,
            version: "0.0.1".into(),
        };
        ch.send(&hello, &[]).unwrap();
        let (st, _fds) = ch.recv_state(Duration::from_secs(5)).unwrap();
        let fail = Msg::Fail {
            error: "capturing a fixture".into(),
        };
        ch.send(&fail, &[]).unwrap();
        assert!(st.ovsdb.as_ref().unwrap().conn.is_some());
        let text = serde_json::to_string_pretty(&Msg::State(Box::new(st))).unwrap();
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-state-v3-ovsdbconn.json");
        std::fs::write(path, text).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let inode = db_conn_inode(&db.sock, old).expect("the old daemon's database connection");
    let before = cli_json(&dir, &["show"])["ovsdb"].clone();
    assert_eq!(before["connects"], 1, "{before}");
    // add-ports racing the upgrade (each waits for cur_cfg: for the switch to apply it).
    let vsctl = std::thread::scope(|sc| {
        let adds = sc.spawn(|| {
            let mut out = Vec::new();
            for p in ["p3", "p4", "p5", "p6"] {
                out.push(db.add_port("br0", p, &["type=dpdkvhostuser"]));
                std::thread::sleep(Duration::from_millis(5));
            }
            out
        });
        let t = std::time::Instant::now();
        let r = upgrade(&dir, &[]).expect("upgrade");
        assert_eq!(r["ok"], true, "{r}");
        eprintln!(
            "upgrade: prepare {} ms, downtime {} us, total {} ms ({:?} wall)",
            r["prepare_ms"],
            r["downtime_us"],
            r["total_ms"],
            t.elapsed()
        );
        // And right after it.
        let after = db.add_port("br0", "p7", &["type=dpdkvhostuser"]);
        let mut v = adds.join().unwrap();
        v.push(after);
        v
    });
    for r in &vsctl {
        assert!(r.is_ok(), "{r:?}");
    }
    let new = daemon_pid(&dir);
    assert_ne!(new, old);
    assert_eq!(
        db_conn_inode(&db.sock, new),
        Some(inode),
        "the new daemon goes on on the old daemon's connection"
    );
    let s = cli_json(&dir, &["show"])["ovsdb"].clone();
    assert_eq!(s["state"], "synced", "{s}");
    assert_eq!(s["connects"], 1, "no new connection: {s}");
    assert_eq!(s["handed_over"], 1, "{s}");
    assert_eq!(s["handover_refused"], 0, "{s}");
    assert_eq!(s["refused_inputs"], 0, "no update applied twice: {s}");
    for p in ["p1", "p2", "p3", "p4", "p5", "p6", "p7"] {
        let st = port(&dir, p).unwrap_or_else(|| panic!("{p} runs"));
        let ofport = db.get("Interface", p, "ofport").unwrap();
        assert_eq!(ofport, st["ofport"].to_string(), "{p}");
    }
    // The server's own view: one monitor, the switch's one session.
    let mem = std::process::Command::new("ovs-appctl")
        .arg("-t")
        .arg(dir.join("ovsdb-server.ctl"))
        .arg("memory/show")
        .output()
        .unwrap();
    eprintln!(
        "ovsdb-server memory/show: {}",
        String::from_utf8_lossy(&mem.stdout)
    );
    // A later change still arrives on the handed-over connection.
    db.vsctl(&["del-port", "br0", "p7"]).unwrap();
    assert!(port(&dir, "p7").is_none());
}

/// A hostile or broken server: one that never answers is dropped after the inactivity
/// probe, one that sends garbage or a reply that is not a schema is dropped at once with a
/// counted, logged refusal; the daemon answers its control socket throughout and keeps
/// reconnecting.
#[test]
fn a_silent_or_garbage_server_costs_the_connection_only() {
    use std::io::{Read, Write};
    let dir = run_dir("ovsdb-hostile");
    let sock = dir.join("fake.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        let replies: [&[u8]; 3] = [
            b"",
            b"{\"id\":0,\"result\":]]]\n",
            b"{\"id\":0,\"result\":42,\"error\":null}",
        ];
        for r in replies {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            if !r.is_empty() {
                s.write_all(r).unwrap();
            }
            held.push(s);
        }
        held
    });
    let (pmd, _) = cores();
    let remote = format!("unix:{}", sock.display());
    let _sw = start_switch(&dir, pmd, &["--ovsdb", &remote]);
    let t = std::time::Instant::now();
    wait_until("three connections", 30, || {
        let t0 = std::time::Instant::now();
        let s = cli_json(&dir, &["show"]);
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the control socket stalled"
        );
        s["ovsdb"]["connects"].as_u64().unwrap() >= 3
            && s["ovsdb"]["refused_inputs"].as_u64().unwrap() >= 2
    });
    // The first connection only went after the probe went unanswered (2 x 5 s).
    assert!(t.elapsed() >= Duration::from_secs(9), "{:?}", t.elapsed());
    let s = cli_json(&dir, &["show"]);
    let e = s["ovsdb"]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(e.contains("malformed input from the server"), "{s}");
    assert!(s["bridges"].as_array().unwrap().is_empty());
    drop(server.join().unwrap());
    let log = std::fs::read_to_string(dir.join("ferrovsd.err")).unwrap();
    assert!(log.contains("no answer from the server for 10 s"), "{log}");
}

/// The same over TCP (`--ovsdb tcp:IP:PORT`), as a remote database is reached.
#[test]
fn configured_over_tcp() {
    if !ready() {
        return;
    }
    let dir = run_dir("ovsdb-tcp");
    let db = OvsdbServer::start(&dir);
    let remote = db.add_tcp_remote();
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &["--ovsdb", &remote]);
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    db.add_port("br0", "p1", &["type=dpdkvhostuser"]).unwrap();
    assert!(port(&dir, "p1").is_some());
    assert_eq!(db.get("Interface", "p1", "ofport").unwrap(), "1");
    let s = cli_json(&dir, &["show"]);
    assert_eq!(s["ovsdb"]["remote"], remote.as_str());
    assert_eq!(s["ovsdb"]["state"], "synced");
}

/// The harness itself: a fresh database, ovs-vsctl against it, a restart keeps the data.
#[test]
fn the_database_harness_works() {
    if !require(
        available(),
        "ovsdb-server, ovsdb-tool, ovs-vsctl and vswitch.ovsschema",
    ) {
        return;
    }
    let dir = run_dir("ovsdb-harness");
    let mut db = OvsdbServer::start(&dir);
    db.vsctl_no_wait(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    assert_eq!(db.get("Bridge", "br0", "datapath_type").unwrap(), "netdev");
    db.kill();
    assert!(db.vsctl_no_wait(&["show"]).is_err());
    db.run();
    assert_eq!(db.vsctl_no_wait(&["list-br"]).unwrap().trim(), "br0");
}

/// Two QEMU guests on dpdkvhostuserclient ports made by ovs-vsctl (each QEMU listens, as
/// OVS-DPDK's documentation sets them up) ping each other through ferrovs.
#[test]
fn two_guests_on_ovs_vsctl_client_ports_ping() {
    use ferrovs_e2e::guest::*;
    if !ready() || !guests_available() {
        return;
    }
    let img = guest_image();
    let (dir, db, _sw) = setup("ovsdb-guests");
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    let mut guests = Vec::new();
    for (name, mac, append) in [
        (
            "b",
            "52:54:00:00:00:02",
            "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=idle",
        ),
        (
            "a",
            "52:54:00:00:00:01",
            "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=ping ferrovs.peer=10.0.0.2 ferrovs.count=20",
        ),
    ] {
        let sock = dir.join(format!("vhu-{name}.sock")).display().to_string();
        guests.push(start_guest(
            &dir,
            &img,
            name,
            &format!("socket,id=c0,path={sock},server=on,wait=off"),
            mac,
            append,
        ));
        wait_until("guest socket", 20, || Path::new(&sock).exists());
        let iface = format!("vhu{name}");
        db.add_port(
            "br0",
            &iface,
            &[
                "type=dpdkvhostuserclient",
                &format!("options:vhost-server-path={sock}"),
            ],
        )
        .unwrap();
    }
    wait_console(&dir, "b", &["FERROVS-GUEST-READY 52:54:00:00:00:02"], 90);
    wait_console(&dir, "a", &["FERROVS-GUEST-READY 52:54:00:00:00:01"], 90);
    // While both drivers run: guest a powers off once its 20 pings (1 s apart) are done, and
    // its link goes down with it.
    for iface in ["vhua", "vhub"] {
        db.vsctl(&["wait-until", "Interface", iface, "link_state=up"])
            .unwrap();
        let f = db.get("Interface", iface, "status:features").unwrap();
        assert!(f.starts_with("0x"), "{f}");
    }
    let verdict = wait_console(&dir, "a", &["FERROVS-PING-OK", "FERROVS-PING-FAIL"], 120);
    let st = cli_json(&dir, &["port-stats"]);
    assert_eq!(verdict, "FERROVS-PING-OK", "port stats: {st}");
}

/// In OVSDB mode the daemon hands over schema 3 only: a new daemon that restores only older
/// schemas (one that knows nothing of OVSDB and would run on without the database) is
/// refused, saying why, and the old one goes on. `FERROVS_WRITE_FIXTURE=1` captures schema
/// 3's fixture (`tests/e2e/fixtures/upgrade-state-v3.json`) from this daemon.
#[test]
fn ovsdb_mode_hands_over_schema_3_only() {
    use ferrovs_control::upgrade::{Channel, Msg};
    if !ready() {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-schema");
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    for p in ["p1", "p2"] {
        db.add_port("br0", p, &["type=dpdkvhostuser"]).unwrap();
    }
    db.vsctl(&["set", "Interface", "p2", "ofport_request=9"])
        .unwrap();
    let p1 = dir.join("p1").display().to_string();
    let _frontend = gen(&dir, "idle", &["--socket", &p1, "--duration", "30", "idle"]);
    db.vsctl(&["wait-until", "Interface", "p1", "link_state=up"])
        .unwrap();
    let pid = daemon_pid(&dir);
    let hello = |min: u32, max: u32| {
        let path = dir.join("ferrovs.upgrade");
        let ch = Channel::new(ferrovs_sys::os::seqpacket_connect(&path).unwrap()).unwrap();
        let version = "0.0.1".to_string();
        let m = Msg::Hello {
            schema_min: min,
            schema_max: max,
            version,
        };
        ch.send(&m, &[]).unwrap();
        ch
    };
    let mut ch = hello(1, 2);
    match ch.recv(Duration::from_secs(5)).unwrap().0 {
        Msg::Fail { error } => assert!(
            error.contains("configured through OVSDB") && error.contains("schema 3"),
            "{error}"
        ),
        m => panic!("expected a refusal, got {m:?}"),
    }
    if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
        let mut ch = hello(3, 3);
        let (st, _fds) = ch.recv_state(Duration::from_secs(5)).unwrap();
        assert_eq!(st.schema, 3);
        let fail = Msg::Fail {
            error: "capturing a fixture".into(),
        };
        ch.send(&fail, &[]).unwrap();
        let text = serde_json::to_string_pretty(&Msg::State(Box::new(st))).unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-state-v3.json");
        std::fs::write(path, text).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(daemon_pid(&dir), pid);
    assert_eq!(port(&dir, "p1").unwrap()["state"], "connected");
    assert_eq!(cli_json(&dir, &["show"])["ovsdb"]["state"], "synced");
}

/// `Controller` columns ovs-vswitchd writes, with the timers' values left out (they depend
/// on when one looks): `is_connected`, `role`, and `status` as `key=value` with
/// `sec_since_*` shown by key only.
fn controller_columns(db: &OvsdbServer, bridge: &str) -> String {
    let get = |c: &str| db.get("Controller", bridge, c).unwrap();
    let status = get("status");
    let status: Vec<String> = status
        .trim_matches(|c| c == '{' || c == '}')
        .split(", ")
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if k.starts_with("sec_since_") {
                k.to_string()
            } else {
                format!("{k}={}", v.trim_matches('"'))
            }
        })
        .collect();
    format!(
        "is_connected={} role={} status={{{}}}",
        get("is_connected"),
        get("role"),
        status.join(", ")
    )
}

/// Waits until `controller_columns` of `db` is `want`.
fn wait_columns(db: &OvsdbServer, bridge: &str, want: &str, secs: u64) {
    let t = std::time::Instant::now();
    loop {
        let got = controller_columns(db, bridge);
        if got == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "Controller of {bridge}: {got}, expected {want}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The OpenFlow settings through the database, as `ovs-vsctl` drives ovs-vswitchd:
/// `set-controller` connects (the controller sees the datapath id of
/// `other_config:datapath-id`), `Controller.is_connected`/`role`/`status` and
/// `Bridge.datapath_id` are written back as Debian's ovs-vswitchd (netdev, beside it in the
/// same run) writes them for the same command sequence; `set-fail-mode` changes forwarding
/// without a controller; `set controller` settings do not reconnect; `del-controller`
/// closes the connection; a hot upgrade costs the controller nothing (its connection is
/// handed over); a bad target or datapath id on one bridge is logged, counted and written to its
/// row while the other bridge works on.
#[test]
fn openflow_settings_through_ovsdb_as_ovs_vswitchd() {
    use ferrovs_e2e::ofwire::*;
    if !ready()
        || !require(
            ovsdb::vswitchd_available() && have("ping"),
            "ovs-vswitchd, ping",
        )
    {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-ofctl");
    let _stop = StopCurrent(dir.clone());
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs = ovsdb::OvsVswitchd::start(&ovs_dir, "odbc");
    let both = |args: &[&str]| {
        db.vsctl(args).unwrap();
        ovs.db.vsctl(args).unwrap();
    };
    both(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
        "other_config:datapath-id=0000000000000abc",
        "other_config:disable-in-band=true",
    ]);
    for d in [&db, &ovs.db] {
        d.wait_get("Bridge", "br0", "datapath_id", "0000000000000abc", 10);
    }

    // Two namespaces on br0 (ferrovs's TAPs): standalone without a controller forwards,
    // secure does not, standalone again does.
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("odb1-"), Net::name("odb2-"));
    let (t1, t2) = (Net::name("odt1"), Net::name("odt2"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (t, ns, a) in [(&t1, &ns1, "10.9.1.1/24"), (&t2, &ns2, "10.9.1.2/24")] {
        db.add_port("br0", t, &["type=tap"]).unwrap();
        net.move_into(t, ns, a);
    }
    assert_eq!(ping(&ns1, "10.9.1.2", 5), 5, "standalone, no controller");
    both(&["set-fail-mode", "br0", "secure"]);
    assert_eq!(ping(&ns1, "10.9.1.2", 5), 0, "secure, no controller");
    both(&["set-fail-mode", "br0", "standalone"]);
    assert_eq!(ping(&ns1, "10.9.1.2", 5), 5, "standalone again");

    // A controller on a Unix socket for each switch.
    let (fsock, osock) = (dir.join("ctl.sock"), ovs_dir.join("ctl.sock"));
    let (fl, ol) = (Listener::unix(&fsock), Listener::unix(&osock));
    db.vsctl(&[
        "set-controller",
        "br0",
        &format!("unix:{}", fsock.display()),
    ])
    .unwrap();
    ovs.db
        .vsctl(&[
            "set-controller",
            "br0",
            &format!("unix:{}", osock.display()),
        ])
        .unwrap();
    let (mut f, mut o) = (fl.accept(10), ol.accept(20));
    assert_eq!(
        f.handshake(),
        0xabc,
        "FEATURES_REPLY: other_config:datapath-id"
    );
    assert_eq!(o.handshake(), 0xabc);
    let connected = "is_connected=true role=other status={sec_since_connect, state=ACTIVE}";
    wait_columns(&ovs.db, "br0", connected, 10);
    wait_columns(&db, "br0", connected, 10);
    // A role asked for shows in the row.
    assert_eq!(f.role(2, 1), Ok((2, 1)));
    assert_eq!(o.role(2, 1), Ok((2, 1)));
    let master = connected.replace("role=other", "role=master");
    wait_columns(&ovs.db, "br0", &master, 10);
    wait_columns(&db, "br0", &master, 10);
    let s = cli_json(&dir, &["show"]);
    let of = &s["bridges"][0]["openflow"];
    assert_eq!(of["datapath_id"], "0000000000000abc", "{of}");
    assert_eq!(of["controllers"][0]["role"], "master", "{of}");
    // The controller's own settings: no reconnect.
    both(&[
        "set",
        "controller",
        "br0",
        "max_backoff=2000",
        "inactivity_probe=0",
        "connection_mode=out-of-band",
    ]);
    std::thread::sleep(Duration::from_secs(1));
    let c = &cli_json(&dir, &["show"])["bridges"][0]["openflow"]["controllers"][0];
    assert_eq!(
        (c["connects"].as_u64(), &c["connected"]),
        (Some(1), &true.into()),
        "{c}"
    );
    // The controller side goes away: both back off and say why.
    drop((f, o));
    let _ = std::fs::remove_file(&fsock);
    let _ = std::fs::remove_file(&osock);
    let backoff = "is_connected=false role=[] status={last_error=No such file or directory, \
                   sec_since_connect, sec_since_disconnect, state=BACKOFF}";
    wait_columns(&ovs.db, "br0", backoff, 15);
    wait_columns(&db, "br0", backoff, 15);
    let (fl, ol) = (Listener::unix(&fsock), Listener::unix(&osock));
    let (mut f, mut o) = (fl.accept(10), ol.accept(10));
    f.handshake();
    o.handshake();
    // The last error and the time since the disconnection stay (OVS's rconn keeps them).
    let connected = "is_connected=true role=other status={last_error=No such file or \
                     directory, sec_since_connect, sec_since_disconnect, state=ACTIVE}";
    wait_columns(&ovs.db, "br0", connected, 10);
    wait_columns(&db, "br0", connected, 10);

    // A hot upgrade hands the connection over: no reconnect, the new daemon answers on the
    // same socket, the status columns say the same (the last error kept), and the settings
    // came from the database again (nothing lost, nothing twice).
    let before =
        cli_json(&dir, &["show"])["bridges"][0]["openflow"]["controllers"][0]["connects"].clone();
    upgrade(&dir, &[]).expect("upgrade");
    f.send(&header(FEATURES_REQUEST, 8, 9));
    let r = f.expect(FEATURES_REPLY);
    assert_eq!(
        u64::from_be_bytes(r[8..16].try_into().unwrap()),
        0xabc,
        "datapath-id kept across the upgrade"
    );
    wait_columns(&db, "br0", connected, 10);
    std::thread::sleep(Duration::from_secs(2));
    let s = cli_json(&dir, &["show"]);
    let of = &s["bridges"][0]["openflow"];
    assert_eq!(of["controllers"].as_array().unwrap().len(), 1, "{of}");
    assert_eq!(
        of["controllers"][0]["connects"], before,
        "no reconnect: {of}"
    );
    assert_eq!(of["fail_mode"], "standalone", "{of}");
    assert!(fl.try_accept().is_none(), "no reconnect");

    // del-controller closes it; standalone with none: NORMAL forwarding again.
    both(&["del-controller", "br0"]);
    assert!(
        f.recv_until_closed(10),
        "del-controller closes the connection"
    );
    assert!(o.recv_until_closed(10));
    assert_eq!(ping(&ns1, "10.9.1.2", 5), 5, "standalone, controller gone");
    for d in [&db, &ovs.db] {
        assert_eq!(d.vsctl(&["list", "controller"]).unwrap().trim(), "");
    }

    // Bad values on a second bridge: logged, counted, in the row; br0 forwards on.
    db.vsctl(&[
        "add-br",
        "brx",
        "--",
        "set",
        "bridge",
        "brx",
        "datapath_type=netdev",
        "other_config:datapath-id=xyz",
    ])
    .unwrap();
    db.vsctl(&["set-controller", "brx", "tcp:1.2.3"]).unwrap();
    let e = db.get("Controller", "brx", "status:last_error").unwrap();
    assert!(e.contains("bad controller target 'tcp:1.2.3'"), "{e}");
    assert_eq!(
        db.get("Controller", "brx", "is_connected").unwrap(),
        "false"
    );
    let dp = db.get("Bridge", "brx", "datapath_id").unwrap();
    assert!(dp.len() == 16 && dp != "0000000000000xyz", "{dp}");
    let s = cli_json(&dir, &["show"]);
    assert_eq!(s["ovsdb"]["refused_settings"], 2, "{s}");
    // (The daemon the upgrade started logs to ferrovsd.log.)
    let log = ["ferrovsd.err", "ferrovsd.log"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .collect::<String>();
    for want in [
        "ovsdb: bridge brx: controller: bad controller target 'tcp:1.2.3'",
        "ovsdb: bridge brx: other_config:datapath-id=xyz: not 16 hexadecimal digits",
    ] {
        assert!(log.contains(want), "{want} in the log");
    }
    assert_eq!(ping(&ns1, "10.9.1.2", 5), 5, "br0 forwards on");
    // The CLI says where these settings live.
    let o = cli(&dir, &["set-controller", "br0", "tcp:127.0.0.1:1"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("use ovs-vsctl set-controller"), "{e}");
}

/// The PMD (core) polling `port`'s queue 0, and everything that PMD polls, from `pmd-stats`.
fn pmd_polling(dir: &Path, port: &str) -> Option<(u64, Vec<String>)> {
    let st = cli_json(dir, &["pmd-stats"]);
    st.as_array()?.iter().find_map(|p| {
        let rxqs = p["rxqs"].as_array()?;
        rxqs.iter()
            .any(|q| q["port"] == port && q["queue"] == 0)
            .then(|| {
                let all = rxqs.iter().map(|q| q["port"].as_str().unwrap().to_string());
                (p["core"].as_u64().unwrap(), all.collect())
            })
    })
}

/// `Interface other_config:pmd-rxq-affinity` set, changed and removed with ovs-vsctl pins and
/// unpins the queue as OVS does (the pinned PMD polls nothing else); a bad list is a warning
/// and the port runs unpinned.
#[test]
fn pmd_rxq_affinity_through_ovs_vsctl() {
    if !ready() {
        return;
    }
    let (dir, db, _sw) = setup("ovsdb-rxq-affinity");
    db.vsctl(&["set", "Open_vSwitch", ".", "other_config:pmd-cpu-mask=0x3"])
        .unwrap();
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    wait_until("two PMDs", 10, || {
        cli_json(&dir, &["pmd-stats"]).as_array().map(Vec::len) == Some(2)
    });
    for name in ["vhu1", "vhu2", "vhu3"] {
        db.add_port("br0", name, &["type=dpdkvhostuser"]).unwrap();
    }
    db.vsctl(&[
        "set",
        "Interface",
        "vhu1",
        "other_config:pmd-rxq-affinity=0:1",
    ])
    .unwrap();
    wait_until("vhu1 pinned to core 1 alone", 10, || {
        pmd_polling(&dir, "vhu1") == Some((1, vec!["vhu1".to_string()]))
    });
    // Moved to core 0: that PMD is isolated now, the others go to core 1.
    db.vsctl(&[
        "set",
        "Interface",
        "vhu1",
        "other_config:pmd-rxq-affinity=0:0",
    ])
    .unwrap();
    wait_until("vhu1 pinned to core 0 alone", 10, || {
        pmd_polling(&dir, "vhu1") == Some((0, vec!["vhu1".to_string()]))
    });
    assert_eq!(pmd_polling(&dir, "vhu2").unwrap().0, 1);
    assert_eq!(pmd_polling(&dir, "vhu3").unwrap().0, 1);
    // Removed: no PMD is isolated.
    db.vsctl(&[
        "remove",
        "Interface",
        "vhu1",
        "other_config",
        "pmd-rxq-affinity",
    ])
    .unwrap();
    wait_until("vhu1 unpinned", 10, || {
        pmd_polling(&dir, "vhu1").is_some_and(|(_, all)| all.len() > 1)
    });
    // A bad list: a warning, the port stays up and unpinned.
    db.vsctl(&[
        "set",
        "Interface",
        "vhu2",
        "other_config:pmd-rxq-affinity=0-1",
    ])
    .unwrap();
    wait_until("the warning logged", 10, || {
        std::fs::read_to_string(dir.join("ferrovsd.err"))
            .unwrap_or_default()
            .contains("interface vhu2: other_config:pmd-rxq-affinity: '0-1' is not QUEUE:CORE")
    });
    assert!(port(&dir, "vhu2").is_some());
    assert!(pmd_polling(&dir, "vhu2").is_some_and(|(_, all)| all.len() > 1));
}
