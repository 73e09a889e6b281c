//! OpenFlow meters as operators use them: `ovs-ofctl -O OpenFlow13 add-meter`, `mod-meter`,
//! `del-meters`, `dump-meters`, `meter-stats`, `meter-features` and rules with `meter:N`,
//! against ferrovsd and, through the same steps, against Debian's ovs-vswitchd (a
//! `datapath_type=netdev` bridge with dummy ports, its own ovsdb-server, run directory and
//! network namespace): what ovs-ofctl prints must be the same (durations aside). Then a
//! pktps meter on a rule between two namespaces (TAP ports) limits a UDP flood to its rate,
//! and its counters agree with what arrived.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ferrovs_e2e::*;

/// A reply's entries (blocks separated by blank lines, or one a line), without the header
/// line and durations, sorted: the two switches list meters in their own order.
fn entries(out: &str) -> Vec<String> {
    let body: Vec<&str> = out.lines().skip(1).collect();
    let text = body.join("\n");
    let mut v: Vec<String> = if text.contains("\n\n") {
        text.split("\n\n").map(str::to_string).collect()
    } else {
        body.iter().map(|l| l.to_string()).collect()
    };
    for e in &mut v {
        *e = e
            .split(' ')
            .filter(|w| !w.starts_with("duration"))
            .collect::<Vec<_>>()
            .join(" ")
            .trim()
            .to_string();
    }
    v.retain(|e| !e.is_empty());
    v.sort();
    v
}

/// The OpenFlow error name ovs-ofctl printed for a refusal (or its own complaint).
fn refusal(sock: &Path, cmd: &str, arg: &str) -> String {
    let (ok, _, err) = ofctl(sock, cmd, &[arg]);
    assert!(!ok, "{cmd} {arg} was accepted");
    let first = err.lines().next().unwrap_or("").to_string();
    first
        .split("): ")
        .nth(1)
        .map(str::to_string)
        .unwrap_or(first)
}

/// What both switches go through; returns each step's observations.
fn sequence(sock: &Path) -> Vec<(String, Vec<String>)> {
    let mut steps = Vec::new();
    let mut step = |name: &str, v: Vec<String>| steps.push((name.to_string(), v));
    step(
        "meter-features",
        entries(&ofctl_ok(sock, "meter-features", &[])),
    );
    for m in [
        "meter=1,kbps,burst,band=type=drop,rate=1000,burst_size=100",
        "meter=2,pktps,band=type=drop,rate=10",
        "meter=3,kbps,stats,bands=type=drop,rate=100 type=drop,rate=500",
        "meter=4294901760,pktps,burst,stats,band=type=drop,rate=7,burst_size=3",
    ] {
        ofctl_ok(sock, "add-meter", &[m]);
    }
    for f in [
        "priority=5,in_port=1,actions=meter:1,output:2",
        "priority=6,ip,actions=meter:2,mod_nw_tos:8,output:2",
        "priority=7,in_port=2,actions=meter:2,goto_table:1",
        "table=1,priority=1,actions=meter:3,output:1",
        "priority=8,actions=meter:3",
    ] {
        ofctl_ok(sock, "add-flow", &[f]);
    }
    step("dump-meters", entries(&ofctl_ok(sock, "dump-meters", &[])));
    step(
        "dump-meters meter=3",
        entries(&ofctl_ok(sock, "dump-meters", &["meter=3"])),
    );
    step("meter-stats", entries(&ofctl_ok(sock, "meter-stats", &[])));
    step(
        "dump-flows",
        entries(&ofctl_ok(sock, "dump-flows", &["--no-stats"])),
    );
    let refusals = [
        ("add-meter", "meter=1,kbps,band=type=drop,rate=5"),
        (
            "add-meter",
            "meter=5,kbps,band=type=dscp_remark,rate=1000,prec_level=1",
        ),
        (
            "add-meter",
            "meter=6,kbps,bands=type=drop,rate=1 type=drop,rate=2 type=drop,rate=3 \
             type=drop,rate=4 type=drop,rate=5 type=drop,rate=6 type=drop,rate=7 \
             type=drop,rate=8 type=drop,rate=9",
        ),
        ("add-meter", "meter=7,kbps,pktps,band=type=drop,rate=5"),
        ("mod-meter", "meter=77,kbps,band=type=drop,rate=5"),
        ("add-flow", "priority=9,actions=meter:99,output:2"),
    ];
    step(
        "refusals",
        refusals
            .iter()
            .map(|(c, a)| format!("{c} {a}: {}", refusal(sock, c, a)))
            .collect(),
    );
    ofctl_ok(
        sock,
        "mod-meter",
        &["meter=2,pktps,burst,band=type=drop,rate=20,burst_size=30"],
    );
    step("mod-meter", entries(&ofctl_ok(sock, "dump-meters", &[])));
    step(
        "meter-stats after mod-meter",
        entries(&ofctl_ok(sock, "meter-stats", &["meter=2"])),
    );
    ofctl_ok(sock, "del-meter", &["meter=1"]);
    ofctl_ok(sock, "del-meter", &["meter=555"]);
    step(
        "del-meter: meters",
        entries(&ofctl_ok(sock, "dump-meters", &[])),
    );
    step(
        "del-meter: its rule went",
        entries(&ofctl_ok(sock, "dump-flows", &["--no-stats"])),
    );
    ofctl_ok(sock, "del-meters", &[]);
    step("del-meters", entries(&ofctl_ok(sock, "dump-meters", &[])));
    step(
        "del-meters: their rules went",
        entries(&ofctl_ok(sock, "dump-flows", &["--no-stats"])),
    );
    steps
}

/// Debian's ovs-vswitchd (IPv6 off in its namespace) with a netdev bridge br0.
struct Ovs {
    sw: ferrovs_e2e::ovsdb::OvsVswitchd,
    mgmt: PathBuf,
}

/// OVS with br0; with `dummy`, dummy ports vm1 and vm2 as OpenFlow ports 1 and 2.
fn start_ovs(dir: &Path, dummy: bool) -> Ovs {
    let sw = ferrovs_e2e::ovsdb::OvsVswitchd::start(dir, "ovsm");
    for k in ["all", "default"] {
        Net::no_ipv6(&sw.ns, k);
    }
    let mgmt = sw.netdev_br0(dummy);
    Ovs { sw, mgmt }
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
fn ovs_ofctl_meters_on_ferrovs_print_as_on_ovs() {
    if !tools() {
        return;
    }
    let dir = run_dir("meters");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || UnixStream::connect(&sock).is_ok());
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs = start_ovs(&ovs_dir, true);
    let want = sequence(&ovs.mgmt);
    let got = sequence(&sock);
    for ((step, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(g, w, "after {step}: ferrovs (left) and OVS (right) differ");
    }
    assert_eq!(want.len(), got.len());
    assert!(want[1].1.len() == 4, "{:?}", want[1]);

    // The CLI sees the same meters, and they are saved and kept across a hot upgrade.
    let o = cli(
        &dir,
        &[
            "add-meter",
            "br0",
            "meter=9,pktps,burst,band=type=drop,rate=50,burst_size=5",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = cli(
        &dir,
        &["add-meter", "br0", "meter=9,pktps,band=type=drop,rate=5"],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("OFPMMFC_METER_EXISTS"),
        "{e}"
    );
    let o = cli(
        &dir,
        &["add-flow", "br0", "priority=3 actions=meter:10,output:vm2"],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("no meter 10"), "{e}");
    let o = cli(
        &dir,
        &["add-flow", "br0", "priority=3 actions=meter:9,output:vm2"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dump = cli_json(&dir, &["dump-meters", "br0"]);
    assert_eq!(
        dump[0]["meter"], "meter=9,pktps,burst,bands=type=drop,rate=50,burst_size=5",
        "{dump}"
    );
    let saved = std::fs::read_to_string(dir.join("ferrovs.conf.json")).unwrap();
    assert!(saved.contains("meter=9,pktps,burst"), "{saved}");
    let _stop = StopCurrent(dir.clone());
    upgrade(&dir, &[]).expect("upgrade");
    wait_until("br0.mgmt after the upgrade", 10, || {
        ofctl(&sock, "show", &[]).0
    });
    let after = ofctl_ok(&sock, "dump-meters", &[]);
    assert!(after.contains("meter=9 pktps burst bands="), "{after}");
    let stats = ofctl_ok(&sock, "meter-stats", &["meter=9"]);
    assert!(stats.contains("flow_count:1"), "{stats}");
}

fn privileged() -> bool {
    require(
        is_root()
            && have("ip")
            && have("python3")
            && have("ethtool")
            && have("ovs-ofctl")
            && Path::new("/usr/sbin/ovs-vswitchd").exists()
            && ovsdb::available()
            && Path::new("/dev/net/tun").exists(),
        "root, iproute2, python3, ethtool, ovs-ofctl, ovs-vswitchd and /dev/net/tun",
    )
}

/// Sends `n` 64-byte UDP datagrams to `to`:9999 at `pps` from namespace `ns`; returns how
/// long it took (s).
const SEND: &str = "import socket,sys,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
to,n,pps=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
t0=time.perf_counter()
for i in range(n):
    while time.perf_counter()<t0+i/pps: pass
    s.sendto(b'x'*64,(to,9999))
print(time.perf_counter()-t0)";

/// Counts UDP datagrams to port 9999 until none came for 1.5 s; prints the count.
const RECV: &str = "import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.bind(('0.0.0.0',9999))
s.settimeout(10)
n=0
try:
    s.recv(2048); n=1
    s.settimeout(1.5)
    while True:
        s.recv(2048); n+=1
except OSError:
    pass
print(n)";

/// A flood of `n` datagrams at `pps` from `ns1` to `ns2`'s 10.9.0.2: (sent in seconds,
/// received).
fn flood(ns1: &str, ns2: &str, n: u32, pps: u32) -> (f64, u64) {
    let recv = Command::new("ip")
        .args(["netns", "exec", ns2, "python3", "-c", RECV])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let o = Net::exec(
        ns1,
        &[
            "python3",
            "-c",
            SEND,
            "10.9.0.2",
            &n.to_string(),
            &pps.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let secs: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let r = recv.wait_with_output().unwrap();
    let got = String::from_utf8_lossy(&r.stdout).trim().parse().unwrap();
    (secs, got)
}

/// `meter-stats meter=1`: (packet_in_count, band 0's packet_count).
fn meter_counts(sock: &Path) -> (u64, u64) {
    let out = ofctl_ok(sock, "meter-stats", &["meter=1"]);
    let field = |name: &str| -> u64 {
        let v = out
            .split(name)
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {out}"));
        v[..v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len())]
            .parse()
            .unwrap()
    };
    (field("packet_in_count:"), field("packet_count:"))
}

#[test]
fn a_pktps_meter_limits_a_flood_to_its_rate() {
    if !privileged() {
        return;
    }
    let dir = run_dir("meters-traffic");
    let (pmd, _) = cores();
    let sw = start_bare_switch(&dir, pmd, &["br0"]);
    let sock = dir.join("br0.mgmt");
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("me1-"), Net::name("me2-"));
    let (t1, t2) = (Net::name("mta"), Net::name("mtb"));
    for ns in [&ns1, &ns2] {
        net.netns(ns);
        // Nothing but the flood crosses the meter: no IPv6 neighbour discovery.
        for k in ["all", "default"] {
            Net::no_ipv6(ns, k);
        }
    }
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.9.0.1/24"),
        ("t2", &t2, &ns2, "10.9.0.2/24"),
    ] {
        net.tap_port(&dir, "br0", p, t, ns, a);
    }
    // No ARP through the meter either.
    let link = Net::exec(&ns2, &["cat", &format!("/sys/class/net/{t2}/address")]);
    let mac = String::from_utf8_lossy(&link.stdout).trim().to_string();
    Net::ip(&[
        "-n",
        &ns1,
        "neigh",
        "add",
        "10.9.0.2",
        "lladdr",
        &mac,
        "dev",
        &t1,
        "nud",
        "permanent",
    ]);

    // 200 packets per second, bursts of 50.
    ofctl_ok(
        &sock,
        "add-meter",
        &["meter=1,pktps,burst,stats,band=type=drop,rate=200,burst_size=50"],
    );
    ofctl_ok(&sock, "del-flows", &[]);
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=10,in_port=1,actions=meter:1,output:2"],
    );
    ofctl_ok(
        &sock,
        "add-flow",
        &["priority=10,in_port=2,actions=output:1"],
    );
    // 2000 per second for 3 s.
    let n = 6000;
    let (secs, got) = flood(&ns1, &ns2, n, 2000);
    let first = got;
    let want = 50.0 + 200.0 * secs;
    assert!(
        (got as f64 - want).abs() <= want * 0.08,
        "{got} arrived of {n} sent in {secs:.2} s through a 200 pps meter (expected ~{want:.0})"
    );
    let (pin, dropped) = meter_counts(&sock);
    eprintln!("200 pps meter: {got} of {n} arrived in {secs:.3} s (expected {want:.0}); meter in {pin}, dropped {dropped}");
    assert!(pin >= u64::from(n) && pin <= u64::from(n) + 3, "{pin}");
    assert!(
        (pin - dropped).abs_diff(got) <= 3,
        "meter passed {} (in {pin}, dropped {dropped}), {got} arrived",
        pin - dropped
    );

    // A new rate takes effect on the same rule (no rule change): 1000 pps, bursts of 100.
    ofctl_ok(
        &sock,
        "mod-meter",
        &["meter=1,pktps,burst,stats,band=type=drop,rate=1000,burst_size=100"],
    );
    let (secs, got) = flood(&ns1, &ns2, 4000, 2000);
    let want = 100.0 + 1000.0 * secs;
    assert!(
        (got as f64 - want).abs() <= want * 0.08,
        "{got} arrived in {secs:.2} s through a 1000 pps meter (expected ~{want:.0})"
    );
    let (pin, dropped) = meter_counts(&sock);
    eprintln!("1000 pps meter: {got} of 4000 arrived in {secs:.3} s (expected {want:.0}); meter in {pin}, dropped {dropped}");
    assert!(
        (pin - dropped).abs_diff(got) <= 3,
        "after mod-meter: passed {} (in {pin}), {got} arrived",
        pin - dropped
    );

    // Deleting the meter deletes its rule: the flood then has no rule and is dropped.
    ofctl_ok(&sock, "del-meters", &[]);
    let flows = ofctl_ok(&sock, "dump-flows", &[]);
    assert!(!flows.contains("meter:1"), "{flows}");
    drop(sw);

    // The same meter, rules and flood through OVS's netdev bridge (veth ports, AF_PACKET):
    // the same number arrives.
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs = start_ovs(&ovs_dir, false);
    let (o1, o2) = (Net::name("mo1-"), Net::name("mo2-"));
    let mut macs = Vec::new();
    for (i, (ns, addr)) in [(&o1, "10.9.0.1/24"), (&o2, "10.9.0.2/24")]
        .into_iter()
        .enumerate()
    {
        net.netns(ns);
        for k in ["all", "default"] {
            Net::no_ipv6(ns, k);
        }
        let (a, b) = (Net::name(&format!("mv{i}a")), Net::name(&format!("mv{i}b")));
        net.veth_into(&a, &b, ns, addr);
        // The host stack leaves UDP checksums to a veth's offload: complete them.
        Net::exec(ns, &["ethtool", "-K", &b, "tx", "off"]);
        Net::ip(&["link", "set", &a, "netns", &ovs.sw.ns]);
        Net::ip(&["-n", &ovs.sw.ns, "link", "set", &a, "up"]);
        ovs.sw
            .db
            .add_port("br0", &a, &[&format!("ofport_request={}", i + 1)])
            .expect("add-port");
        let m = Net::exec(ns, &["cat", &format!("/sys/class/net/{b}/address")]);
        macs.push((b, String::from_utf8_lossy(&m.stdout).trim().to_string()));
    }
    Net::ip(&[
        "-n",
        &o1,
        "neigh",
        "add",
        "10.9.0.2",
        "lladdr",
        &macs[1].1,
        "dev",
        &macs[0].0,
        "nud",
        "permanent",
    ]);
    let m = &ovs.mgmt;
    ofctl_ok(
        m,
        "add-meter",
        &["meter=1,pktps,burst,stats,band=type=drop,rate=200,burst_size=50"],
    );
    ofctl_ok(m, "del-flows", &[]);
    ofctl_ok(
        m,
        "add-flow",
        &["priority=10,in_port=1,actions=meter:1,output:2"],
    );
    ofctl_ok(m, "add-flow", &["priority=10,in_port=2,actions=output:1"]);
    let (secs, got_ovs) = flood(&o1, &o2, n, 2000);
    let want = 50.0 + 200.0 * secs;
    let (pin, dropped) = meter_counts(m);
    eprintln!("OVS, 200 pps meter: {got_ovs} of {n} arrived in {secs:.3} s (expected {want:.0}); meter in {pin}, dropped {dropped}");
    assert!(
        (got_ovs as f64 - want).abs() <= want * 0.08,
        "OVS: {got_ovs} arrived (expected ~{want:.0})"
    );
    assert!(
        (got_ovs as f64 - first as f64).abs() <= want * 0.08,
        "OVS passed {got_ovs}, ferrovs {first}"
    );
}
