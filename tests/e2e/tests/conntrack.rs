//! Connection tracking and NAT with real peers: network namespaces behind veth pairs on a
//! bridge programmed with `ovs-ofctl -O OpenFlow13` over its management socket, each test run
//! twice with the same rule text — against Debian's ovs-vswitchd (netdev datapath, its
//! userspace conntrack: the reference, which shows the test itself is right) and against
//! ferrovs (AF_PACKET uplinks on the same kind of veth pairs).
//!
//! - A stateful firewall (`ct(table=1)`, commit of new connections from A, established and
//!   related back): ping and iperf3 work A→B; ping, iperf3 and a TCP connect B→A are
//!   refused (dropped); the ICMP port unreachable for a UDP datagram A→B is related and
//!   reaches A.
//! - SNAT to an uplink (`ct(commit,nat(src=IP))` out, `ct(nat)` for replies): the uplink's
//!   capture and `ss` see only the translated source; ping and TCP streams complete.
//! - DNAT load balancing: a virtual IP → two backends chosen by the source port's parity
//!   (`ct(commit,nat(dst=IP))`), TCP streams complete to both, each to its backend.
//! - 1000 TCP connections held open through the firewall; after a hot upgrade of ferrovs
//!   (on OVS: nothing, and as a negative control a conntrack flush) the server speaks first
//!   on every connection — a packet from B that only passes as established — and every
//!   connection answers: none reset, none lost.
//!
//! Every namespace has IPv6 off (no stray solicitations) and transmit checksum offload off on
//! its veth end (full checksums on the wire: both trackers check them), and the test owns
//! every rule on the bridge (fail-mode secure, `del-flows` first).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferrovs_e2e::ovsdb::OvsVswitchd;
use ferrovs_e2e::*;
use serde_json::Value;

/// Which switch a run programs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Ovs,
    Ferrovs,
}

impl Kind {
    fn tag(self) -> &'static str {
        match self {
            Kind::Ovs => "ovs",
            Kind::Ferrovs => "fv",
        }
    }
}

/// A namespace behind one OpenFlow port.
struct Host {
    ns: String,
    /// Its end of the veth.
    dev: String,
    ip: String,
    mac: String,
}

/// A switch with hosts 1..=n on OpenFlow ports 1..=n (`hosts[0]` is port 1), each in its own
/// namespace at 10.79.SUBNET.PORT/24 with MAC 02:00:00:79:SUBNET:PORT.
struct Rig {
    kind: Kind,
    dir: PathBuf,
    mgmt: PathBuf,
    hosts: Vec<Host>,
    ovs_ctl: Option<PathBuf>,
    // Dropped in this order: the switch (after an upgrade: the daemon running then), then
    // the namespaces and links.
    _stop: Option<StopCurrent>,
    _sw: Option<Proc>,
    _ovs: Option<OvsVswitchd>,
    _net: Net,
}

fn tools(kind: Kind, extra: &[&str]) -> bool {
    let mut ok = is_root()
        && have("ip")
        && have("ethtool")
        && have("python3")
        && have("ovs-ofctl")
        && have("sysctl");
    for t in extra {
        ok &= have(t);
    }
    if kind == Kind::Ovs {
        ok &= ovsdb::vswitchd_available() && have("ovs-appctl");
    }
    require(
        ok,
        &format!(
            "root, iproute2, ethtool, python3, sysctl, ovs-ofctl{} and {}",
            if kind == Kind::Ovs {
                ", ovs-appctl, ovs-vswitchd, ovsdb-server"
            } else {
                ""
            },
            extra.join(", ")
        ),
    )
}

fn run(cmd: &str, args: &[&str]) {
    let o = Command::new(cmd).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn exec_ok(ns: &str, args: &[&str]) -> String {
    let o = Net::exec(ns, args);
    assert!(
        o.status.success(),
        "in {ns}: {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

impl Rig {
    fn new(kind: Kind, test: &str, subnet: u8, n: usize) -> Rig {
        let dir = run_dir(&format!("ct-{test}-{}", kind.tag()));
        std::fs::write(dir.join("ctpeer.py"), include_str!("../src/ctpeer.py")).unwrap();
        let mut net = Net::new();
        let (mut sw, mut ovs, mut stop, mut ovs_ctl) = (None, None, None, None);
        let mgmt = match kind {
            Kind::Ferrovs => {
                let (core, _) = cores();
                sw = Some(start_switch(&dir, core, &[]));
                stop = Some(StopCurrent(dir.clone()));
                for args in [
                    &["add-bridge", "brc"][..],
                    &["set-bridge", "brc", "fail-mode=secure"],
                ] {
                    let o = cli(&dir, args);
                    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                }
                let m = dir.join("brc.mgmt");
                wait_until("brc.mgmt", 10, || {
                    std::os::unix::net::UnixStream::connect(&m).is_ok()
                });
                m
            }
            Kind::Ovs => {
                let d = dir.join("ovs");
                std::fs::create_dir_all(&d).unwrap();
                let o = OvsVswitchd::start(&d, "cto");
                let m = o.netdev_br0(false);
                o.db.vsctl(&["set-fail-mode", "br0", "secure"])
                    .expect("set-fail-mode");
                ovs_ctl = Some(o.unixctl());
                ovs = Some(o);
                m
            }
        };
        let mut hosts = Vec::new();
        for i in 1..=n {
            let ns = Net::name(&format!("c{i}-"));
            net.netns(&ns);
            for k in ["all", "default"] {
                exec_ok(
                    &ns,
                    &[
                        "sysctl",
                        "-qw",
                        &format!("net.ipv6.conf.{k}.disable_ipv6=1"),
                    ],
                );
            }
            let (a, b) = (Net::name(&format!("cs{i}")), Net::name(&format!("cn{i}")));
            let ip = format!("10.79.{subnet}.{i}");
            let mac = format!("02:00:00:79:{subnet:02x}:{i:02x}");
            net.veth_into(&a, &b, &ns, &format!("{ip}/24"));
            Net::ip(&["-n", &ns, "link", "set", &b, "address", &mac]);
            exec_ok(
                &ns,
                &["ethtool", "-K", &b, "tx", "off", "tso", "off", "gso", "off"],
            );
            match &ovs {
                None => {
                    run(
                        "sysctl",
                        &["-qw", &format!("net.ipv6.conf.{a}.disable_ipv6=1")],
                    );
                    Net::ip(&["link", "set", &a, "up"]);
                    let o = cli(
                        &dir,
                        &[
                            "add-port",
                            "brc",
                            &format!("c{i}"),
                            "type=uplink",
                            &format!("dev={a}"),
                            "mode=af_packet",
                            &format!("ofport={i}"),
                        ],
                    );
                    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                }
                Some(o) => {
                    Net::ip(&["link", "set", &a, "netns", &o.ns]);
                    exec_ok(
                        &o.ns,
                        &[
                            "sysctl",
                            "-qw",
                            &format!("net.ipv6.conf.{a}.disable_ipv6=1"),
                        ],
                    );
                    Net::ip(&["-n", &o.ns, "link", "set", &a, "up"]);
                    o.db.add_port("br0", &a, &[&format!("ofport_request={i}")])
                        .expect("add-port");
                }
            }
            let port = if kind == Kind::Ovs {
                format!(" {i}({a}):")
            } else {
                format!(" {i}(c{i}):")
            };
            wait_until(&format!("OpenFlow port {i}"), 10, || {
                ofctl(&mgmt, "show", &[]).1.contains(&port)
            });
            hosts.push(Host {
                ns,
                dev: b,
                ip,
                mac,
            });
        }
        Rig {
            kind,
            dir,
            mgmt,
            hosts,
            ovs_ctl,
            _stop: stop,
            _sw: sw,
            _ovs: ovs,
            _net: net,
        }
    }

    /// Host on OpenFlow port `port`.
    fn h(&self, port: usize) -> &Host {
        &self.hosts[port - 1]
    }

    /// Replaces every rule of the bridge with `rules` (ovs-ofctl's text).
    fn flows(&self, rules: &[String]) {
        ofctl_ok(&self.mgmt, "del-flows", &[]);
        for r in rules {
            ofctl_ok(&self.mgmt, "add-flow", &[r]);
        }
        let dump = ofctl_ok(&self.mgmt, "dump-flows", &[]);
        assert_eq!(
            dump.lines().filter(|l| l.contains("cookie=")).count(),
            rules.len(),
            "{dump}"
        );
    }

    /// `n_packets` of the rule with cookie `cookie` (every rule of a test has its own).
    fn n_packets(&self, cookie: u32) -> u64 {
        let out = ofctl_ok(
            &self.mgmt,
            "dump-flows",
            &[&format!("cookie={cookie:#x}/-1")],
        );
        let line = out
            .lines()
            .find(|l| l.contains(&format!("cookie={cookie:#x},")))
            .unwrap_or_else(|| panic!("no rule with cookie {cookie:#x}: {out}"));
        let v = line.split("n_packets=").nth(1).unwrap();
        v[..v.find(',').unwrap()].parse().unwrap()
    }

    /// Waits (up to 5 s: OVS pushes its datapath's counters to the rules periodically) until
    /// the rule with cookie `cookie` counted at least `n` packets.
    fn counted(&self, cookie: u32, n: u64, what: &str) {
        let t = std::time::Instant::now();
        loop {
            let got = self.n_packets(cookie);
            if got >= n {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{what}: rule {cookie:#x} counted {got} packets, not {n}: {}",
                ofctl_ok(&self.mgmt, "dump-flows", &[])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts `args` in host `port`'s namespace (killed on drop); output in DIR/NAME.*.
    fn spawn(&self, port: usize, name: &str, args: &[&str]) -> Proc {
        let mut a = vec!["netns", "exec", self.h(port).ns.as_str()];
        a.extend_from_slice(args);
        Proc::spawn(name, &self.dir, Path::new("/usr/sbin/ip"), &a)
    }

    fn peer_args(&self, args: &[&str]) -> Vec<String> {
        let mut a = vec![
            "python3".to_string(),
            self.dir.join("ctpeer.py").display().to_string(),
        ];
        a.extend(args.iter().map(|s| s.to_string()));
        a
    }

    /// Starts ctpeer.py `args` in host `port`'s namespace.
    fn spawn_peer(&self, port: usize, name: &str, args: &[&str]) -> Proc {
        let a = self.peer_args(args);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        self.spawn(port, name, &a)
    }

    /// Runs ctpeer.py `args` in host `port`'s namespace; its JSON line.
    fn peer(&self, port: usize, args: &[&str]) -> Value {
        let a = self.peer_args(args);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = exec_ok(&self.h(port).ns, &a);
        let line = out
            .lines()
            .rev()
            .find(|l| l.starts_with('{') || l.starts_with('['))
            .unwrap_or_else(|| panic!("ctpeer {args:?}: no JSON in {out}"));
        serde_json::from_str(line).unwrap()
    }

    /// Waits until something listens on TCP `port` in host `host`'s namespace.
    fn wait_listen(&self, host: usize, port: u16) {
        let ns = &self.h(host).ns;
        let f = format!("sport = :{port}");
        wait_until(&format!("a listener on {port} in {ns}"), 10, || {
            let o = Net::exec(ns, &["ss", "-Hltn", &f]);
            !String::from_utf8_lossy(&o.stdout).trim().is_empty()
        });
    }

    /// Established TCP connections to port `dport` the switch tracks (ferrovs:
    /// `dump-conntrack --json`; OVS: `dpctl/dump-conntrack`).
    fn established(&self, dport: u16) -> usize {
        match self.kind {
            Kind::Ovs => {
                let o = Command::new("ovs-appctl")
                    .arg("-t")
                    .arg(self.ovs_ctl.as_ref().unwrap())
                    .arg("dpctl/dump-conntrack")
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| {
                        l.starts_with("tcp,")
                            && l.contains(&format!(",dport={dport}),reply="))
                            && l.contains("state=ESTABLISHED")
                    })
                    .count()
            }
            Kind::Ferrovs => {
                let v = cli_json(&self.dir, &["dump-conntrack"]);
                v.as_array()
                    .unwrap_or_else(|| panic!("dump-conntrack --json: {v}"))
                    .iter()
                    .filter(|c| {
                        c["proto"] == "tcp"
                            && c["orig"]["dport"] == dport
                            && c["state"] == "ESTABLISHED"
                    })
                    .count()
            }
        }
    }
}

/// A tcpdump writing DIR/NAME.pcap, stopped (SIGINT, so the file is complete) by `stop`.
struct Capture {
    child: Child,
    path: PathBuf,
}

impl Capture {
    fn start(rig: &Rig, host: usize, name: &str, filter: &str) -> Capture {
        let h = rig.h(host);
        let path = rig.dir.join(format!("{name}.pcap"));
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &h.ns,
                "tcpdump",
                "--immediate-mode",
                "-i",
                &h.dev,
                "-Q",
                "in",
                "-nn",
                "-U",
                "-w",
            ])
            .arg(&path)
            .arg(filter)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump runs");
        // tcpdump says "listening on ..." once it captures.
        let mut line = String::new();
        BufReader::new(child.stderr.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("listening on"), "tcpdump: {line}");
        Capture { child, path }
    }

    fn stop(mut self) -> Vec<(usize, Vec<u8>)> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        pcap_frames(&self.path)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stateful firewall between port 1 (A) and port 2 (B): IP goes through the tracker; new
/// connections are allowed (and committed) from A only, established and related traffic both
/// ways; ARP passes. Cookies name the rules.
fn firewall_rules() -> Vec<String> {
    [
        "cookie=0x1,table=0,priority=100,ip,ct_state=-trk,actions=ct(table=1)",
        "cookie=0x2,table=0,priority=50,arp,actions=flood",
        "cookie=0x3,table=1,priority=100,ip,in_port=1,ct_state=+trk+new,actions=ct(commit),output:2",
        "cookie=0x4,table=1,priority=100,ip,in_port=1,ct_state=+trk+est,actions=output:2",
        "cookie=0x5,table=1,priority=100,ip,in_port=2,ct_state=+trk+est,actions=output:1",
        "cookie=0x6,table=1,priority=100,ip,in_port=2,ct_state=+trk+rel,actions=output:1",
        "cookie=0x7,table=1,priority=100,ip,in_port=1,ct_state=+trk+rel,actions=output:2",
        "cookie=0x8,table=1,priority=90,ip,in_port=2,ct_state=+trk+new,actions=drop",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The control for the firewall: the same rig with stateless rules passes everything both
/// ways (so what the firewall refuses, it refuses by its state).
fn stateless_baseline(kind: Kind) {
    if !tools(kind, &["ping", "ss"]) {
        return;
    }
    let rig = Rig::new(kind, "base", 5, 2);
    rig.flows(&[
        "cookie=0x1,priority=10,in_port=1,actions=output:2".to_string(),
        "cookie=0x2,priority=10,in_port=2,actions=output:1".to_string(),
    ]);
    let (a, b) = (rig.h(1), rig.h(2));
    assert_eq!(ping(&a.ns, &b.ip, 5), 5, "ping A→B");
    assert_eq!(ping(&b.ns, &a.ip, 5), 5, "ping B→A");
    let _sa = rig.spawn_peer(1, "name-a", &["name-server", "a", "8080"]);
    let _sb = rig.spawn_peer(2, "name-b", &["name-server", "b", "8080"]);
    rig.wait_listen(1, 8080);
    rig.wait_listen(2, 8080);
    for (from, to, name) in [(1, b, "b"), (2, a, "a")] {
        let r = rig.peer(from, &["name-client", &to.ip, "8080", "2", "43000"]);
        for c in r.as_array().unwrap() {
            assert_eq!(c["name"], name, "{r}");
            assert_eq!(c["bytes"], 16 * 16384, "{r}");
        }
    }
    let r = rig.peer(1, &["udp-rel", &b.ip, "9999", "3"]);
    assert_eq!(r["result"], "refused", "B's port unreachable");
}

#[test]
fn stateless_baseline_on_ovs() {
    stateless_baseline(Kind::Ovs);
}

#[test]
fn stateless_baseline_on_ferrovs() {
    stateless_baseline(Kind::Ferrovs);
}

fn stateful_firewall(kind: Kind) {
    if !tools(kind, &["iperf3", "ping", "ss"]) {
        return;
    }
    let rig = Rig::new(kind, "fw", 1, 2);
    rig.flows(&firewall_rules());
    let (a, b) = (rig.h(1), rig.h(2));

    // Ping A→B: new, then established replies.
    assert_eq!(ping(&a.ns, &b.ip, 10), 10, "ping A→B");
    rig.counted(0x3, 1, "committed from A");
    rig.counted(0x5, 10, "echo replies as established");
    // Ping B→A: new from B, dropped.
    let dropped = rig.n_packets(0x8);
    assert_eq!(ping(&b.ns, &a.ip, 5), 0, "ping B→A is refused");
    rig.counted(0x8, dropped + 5, "B's echo requests dropped");

    // iperf3 A→B (a server in B).
    let _srv_b = rig.spawn(2, "iperf3-b", &["iperf3", "-s", "-p", "5201"]);
    rig.wait_listen(2, 5201);
    let o = Net::exec(
        &a.ns,
        &[
            "iperf3",
            "-c",
            &b.ip,
            "-p",
            "5201",
            "-t",
            "2",
            "-J",
            "--connect-timeout",
            "3000",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "iperf3 A→B: {out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap();
    assert!(bytes > 1_000_000, "iperf3 A→B moved {bytes} bytes: {out}");
    // iperf3 B→A (a server in A): the control connection never opens.
    let _srv_a = rig.spawn(1, "iperf3-a", &["iperf3", "-s", "-p", "5201"]);
    rig.wait_listen(1, 5201);
    let o = Net::exec(
        &b.ns,
        &[
            "iperf3",
            "-c",
            &a.ip,
            "-p",
            "5201",
            "-t",
            "1",
            "--connect-timeout",
            "2000",
        ],
    );
    assert!(
        !o.status.success(),
        "iperf3 B→A went through: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    // A plain TCP connect: through A→B, refused (dropped: no answer at all) B→A.
    let r = rig.peer(1, &["connect", &b.ip, "5201", "3"]);
    assert_eq!(r["result"], "connected", "TCP A→B");
    let r = rig.peer(2, &["connect", &a.ip, "5201", "2"]);
    assert_eq!(r["result"], "timeout", "TCP B→A");

    // A datagram A→B to a closed port: B's ICMP port unreachable is related and reaches A.
    let related = rig.n_packets(0x6);
    let r = rig.peer(1, &["udp-rel", &b.ip, "9999", "3"]);
    assert_eq!(
        r["result"], "refused",
        "the ICMP error related to A's UDP flow"
    );
    rig.counted(0x6, related + 1, "counted as related");
    // Nothing from B was ever committed: still refused after all that.
    assert_eq!(ping(&b.ns, &a.ip, 3), 0, "ping B→A is refused");
}

#[test]
fn stateful_firewall_on_ovs() {
    stateful_firewall(Kind::Ovs);
}

#[test]
fn stateful_firewall_on_ferrovs() {
    stateful_firewall(Kind::Ferrovs);
}

/// A (port 1) reaches the uplink U (port 2) as 10.79.2.100; replies are translated back.
fn snat_to_uplink(kind: Kind) {
    if !tools(kind, &["ping", "ss", "tcpdump"]) {
        return;
    }
    let rig = Rig::new(kind, "snat", 2, 2);
    let (a, u) = (rig.h(1), rig.h(2));
    let snat = "10.79.2.100";
    // U answers the translated address at A's MAC (the switch's address on that segment).
    Net::ip(&[
        "-n",
        &u.ns,
        "neigh",
        "replace",
        snat,
        "lladdr",
        &a.mac,
        "dev",
        &u.dev,
        "nud",
        "permanent",
    ]);
    rig.flows(&[
        "cookie=0x1,priority=50,arp,actions=flood".to_string(),
        format!("cookie=0x2,priority=100,ip,in_port=1,actions=ct(commit,nat(src={snat})),output:2"),
        "cookie=0x3,priority=100,ip,in_port=2,actions=ct(nat,table=1)".to_string(),
        format!("cookie=0x4,table=1,priority=100,ip,in_port=2,ct_state=+trk+est,nw_dst={},actions=output:1", a.ip),
        format!("cookie=0x5,table=1,priority=100,ip,in_port=2,ct_state=+trk+rel,nw_dst={},actions=output:1", a.ip),
    ]);
    let cap = Capture::start(&rig, 2, "snat", "ip");

    assert_eq!(ping(&a.ns, &u.ip, 5), 5, "ping A→U through SNAT");
    rig.counted(0x4, 5, "replies translated back");
    // TCP streams A→U.
    let _srv = rig.spawn_peer(2, "name-server", &["name-server", "uplink", "8080"]);
    rig.wait_listen(2, 8080);
    let r = rig.peer(1, &["name-client", &u.ip, "8080", "4", "41000"]);
    for c in r.as_array().unwrap() {
        assert_eq!(c["name"], "uplink", "{r}");
        assert_eq!(c["bytes"], 16 * 16384, "{r}");
    }
    // Connections held open: U's sockets see the translated source.
    let d = rig.dir.clone();
    let _hs = rig.spawn_peer(
        2,
        "hold-server",
        &["hold-server", "8081", "5", &d.display().to_string(), "10"],
    );
    wait_until("hold-server", 10, || d.join("listening").exists());
    let hc = rig.spawn_peer(
        1,
        "hold-client",
        &[
            "hold-client",
            &u.ip,
            "8081",
            "5",
            &d.display().to_string(),
            "10",
        ],
    );
    wait_until("5 connections", 30, || d.join("ready").exists());
    let ss = exec_ok(
        &u.ns,
        &["ss", "-Htn", "state", "established", "sport = :8081"],
    );
    let peers: Vec<&str> = ss
        .lines()
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(peers.len(), 5, "{ss}");
    assert!(
        peers.iter().all(|p| p.starts_with(&format!("{snat}:"))),
        "U sees A as {snat}: {ss}"
    );
    std::fs::write(d.join("go"), "").unwrap();
    let c = hc.wait_json(&d, Duration::from_secs(30));
    assert_eq!(
        (c["hello"].as_u64(), c["push"].as_u64()),
        (Some(5), Some(5)),
        "{c}"
    );

    // Everything that reached U came from the translated address, nothing from A's own.
    let frames = cap.stop();
    let (mut translated, mut leaked) = (0, 0);
    for (_, f) in &frames {
        if f.len() >= 34 && f[12..14] == [8, 0] {
            match f[26..30] {
                [10, 79, 2, 100] => translated += 1,
                [10, 79, 2, 1] => leaked += 1,
                _ => {}
            }
        }
    }
    assert!(translated >= 50, "{translated} frames from {snat}");
    assert_eq!(leaked, 0, "frames with A's untranslated source reached U");
}

#[test]
fn snat_to_an_uplink_on_ovs() {
    snat_to_uplink(Kind::Ovs);
}

#[test]
fn snat_to_an_uplink_on_ferrovs() {
    snat_to_uplink(Kind::Ferrovs);
}

/// A (port 1) connects to the virtual IP 10.79.3.100:8080; connections from even source
/// ports go to backend b1 (port 2), from odd ones to b2 (port 3).
fn dnat_load_balancing(kind: Kind) {
    if !tools(kind, &["ss"]) {
        return;
    }
    let rig = Rig::new(kind, "dnat", 3, 3);
    let (a, b1, b2) = (rig.h(1), rig.h(2), rig.h(3));
    let (vip, vmac) = ("10.79.3.100", "02:00:00:79:03:64");
    Net::ip(&[
        "-n",
        &a.ns,
        "neigh",
        "replace",
        vip,
        "lladdr",
        vmac,
        "dev",
        &a.dev,
        "nud",
        "permanent",
    ]);
    let lb = |cookie: u32, parity: u32, to: &Host| {
        format!(
            "cookie={cookie:#x},priority=100,tcp,in_port=1,nw_dst={vip},tp_dst=8080,tp_src={parity}/1,actions=ct(commit,nat(dst={}),table=1)",
            to.ip
        )
    };
    let fwd = |cookie: u32, to: &Host, port: usize| {
        format!(
            "cookie={cookie:#x},table=1,priority=100,tcp,in_port=1,ct_state=+trk,nw_dst={},actions=set_field:{}->eth_dst,output:{port}",
            to.ip, to.mac
        )
    };
    rig.flows(&[
        "cookie=0x1,priority=50,arp,actions=flood".to_string(),
        lb(0x2, 0, b1),
        lb(0x3, 1, b2),
        "cookie=0x4,priority=100,tcp,in_port=2,actions=ct(nat,table=1)".to_string(),
        "cookie=0x5,priority=100,tcp,in_port=3,actions=ct(nat,table=1)".to_string(),
        fwd(0x6, b1, 2),
        fwd(0x7, b2, 3),
        "cookie=0x8,table=1,priority=100,tcp,in_port=2,ct_state=+trk+est,actions=output:1"
            .to_string(),
        "cookie=0x9,table=1,priority=100,tcp,in_port=3,ct_state=+trk+est,actions=output:1"
            .to_string(),
    ]);
    let _s1 = rig.spawn_peer(2, "b1", &["name-server", "b1", "8080"]);
    let _s2 = rig.spawn_peer(3, "b2", &["name-server", "b2", "8080"]);
    rig.wait_listen(2, 8080);
    rig.wait_listen(3, 8080);
    let r = rig.peer(1, &["name-client", vip, "8080", "20", "42000"]);
    let r = r.as_array().unwrap();
    assert_eq!(r.len(), 20);
    for c in r {
        let want = if c["sport"].as_u64().unwrap() % 2 == 0 {
            "b1"
        } else {
            "b2"
        };
        assert_eq!(c["name"], want, "{c}");
        assert_eq!(c["bytes"], 16 * 16384, "{c}");
    }
    for c in [0x6, 0x7, 0x8, 0x9] {
        rig.counted(c, 10, "both backends, both ways");
    }
    // The backends saw A's own address (destination NAT only).
    let seen = |h: &Host| {
        let o = exec_ok(&h.ns, &["ss", "-Htn", "state", "time-wait"]);
        o.lines()
            .chain(exec_ok(&h.ns, &["ss", "-Htn", "state", "close-wait"]).lines())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for h in [b1, b2] {
        let l = seen(h);
        // (The client closes first: the closed connections wait in the client, not here;
        // so an empty list is fine, but none may name another source than A.)
        assert!(
            l.iter()
                .all(|x| x.contains(&format!("{}:", a.ip)) || x.trim().is_empty()),
            "{l:?}"
        );
    }
}

#[test]
fn dnat_load_balancing_on_ovs() {
    dnat_load_balancing(Kind::Ovs);
}

#[test]
fn dnat_load_balancing_on_ferrovs() {
    dnat_load_balancing(Kind::Ferrovs);
}

/// What happens to the switch while 1000 connections are held open.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Meanwhile {
    /// Nothing (OVS: the reference).
    Nothing,
    /// `ferrovs upgrade`: every tracked connection must be handed over.
    Upgrade,
    /// The tracker forgets everything (OVS's `dpctl/flush-conntrack`): the negative control,
    /// what an upgrade that lost the state would do.
    Flush,
}

const CONNS: usize = 1000;

fn thousand_connections(kind: Kind, meanwhile: Meanwhile) {
    if !tools(kind, &["ss"]) {
        return;
    }
    let rig = Rig::new(kind, "hold", 4, 2);
    rig.flows(&firewall_rules());
    let b = rig.h(2);
    let d = rig.dir.clone();
    let ds = d.display().to_string();
    let n = CONNS.to_string();
    // (Only a failure waits this long; the flush case waits for nothing to come.)
    let secs = if meanwhile == Meanwhile::Flush {
        "8"
    } else {
        "60"
    };
    let srv = rig.spawn_peer(2, "hold-server", &["hold-server", "7000", &n, &ds, secs]);
    wait_until("hold-server", 10, || d.join("listening").exists());
    let cl = rig.spawn_peer(
        1,
        "hold-client",
        &["hold-client", &b.ip, "7000", &n, &ds, secs],
    );
    wait_until("1000 connections", 180, || d.join("ready").exists());
    let tracked = |rig: &Rig| rig.established(7000);
    assert!(
        tracked(&rig) >= CONNS,
        "{} connections tracked",
        tracked(&rig)
    );
    match meanwhile {
        Meanwhile::Nothing => {}
        Meanwhile::Upgrade => {
            let before = daemon_pid(&rig.dir);
            let r = upgrade(&rig.dir, &[]).expect("upgrade");
            assert_ne!(daemon_pid(&rig.dir), before, "a new daemon: {r}");
            assert!(
                tracked(&rig) >= CONNS,
                "{} connections tracked after the upgrade",
                tracked(&rig)
            );
        }
        Meanwhile::Flush => {
            let o = Command::new("ovs-appctl")
                .arg("-t")
                .arg(rig.ovs_ctl.as_ref().unwrap())
                .arg("dpctl/flush-conntrack")
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
            assert_eq!(tracked(&rig), 0);
        }
    }
    // The server speaks first: B's packets pass only as established.
    std::fs::write(d.join("go"), "").unwrap();
    let s = srv.wait_json(&d, Duration::from_secs(120));
    let c = cl.wait_json(&d, Duration::from_secs(120));
    assert_eq!(s["accepted"].as_u64(), Some(CONNS as u64), "server: {s}");
    assert_eq!(c["hello"].as_u64(), Some(CONNS as u64), "client: {c}");
    if meanwhile == Meanwhile::Flush {
        // Dropped as invalid: nothing arrives, nothing is reset either.
        assert_eq!(c["push"].as_u64(), Some(0), "client: {c}");
        assert_eq!(s["pong"].as_u64(), Some(0), "server: {s}");
        assert!(c["errors"].get("ConnectionResetError").is_none(), "{c}");
    } else {
        assert_eq!(c["push"].as_u64(), Some(CONNS as u64), "client: {c}");
        assert_eq!(s["pong"].as_u64(), Some(CONNS as u64), "server: {s}");
        assert_eq!(c["errors"], serde_json::json!({}), "client: {c}");
        assert_eq!(s["errors"], serde_json::json!({}), "server: {s}");
    }
}

#[test]
fn thousand_connections_through_the_firewall_on_ovs() {
    thousand_connections(Kind::Ovs, Meanwhile::Nothing);
}

#[test]
fn thousand_connections_are_lost_when_ovs_flushes_its_conntrack() {
    thousand_connections(Kind::Ovs, Meanwhile::Flush);
}

#[test]
fn thousand_connections_survive_a_hot_upgrade_of_ferrovs() {
    thousand_connections(Kind::Ferrovs, Meanwhile::Upgrade);
}

/// A number a guest tool's `FERROVS-RESULT` carries (as a number or a string).
fn field(v: &Value, k: &str) -> u64 {
    v[k].to_string()
        .trim_matches('"')
        .parse()
        .unwrap_or_else(|_| panic!("no number {k} in {v}"))
}

/// The firewall between two QEMU guests on ferrovs's vhost-user ports vm1 (A, OpenFlow port 1)
/// and vm2 (B, port 2): ping and a TCP stream A→B pass; ping and a TCP connect B→A are
/// dropped. (ferrovs only: Debian's OVS has no vhost-user without DPDK.)
#[test]
fn stateful_firewall_between_two_guests_on_ferrovs() {
    use ferrovs_e2e::guest::*;
    if !(guests_available() && require(have("ovs-ofctl"), "ovs-ofctl")) {
        return;
    }
    let img = guest_image();
    let dir = run_dir("ct-guests");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let sock = dir.join("br0.mgmt");
    wait_until("br0.mgmt", 10, || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let show = ofctl_ok(&sock, "show", &[]);
    assert!(
        show.contains(" 1(vm1):") && show.contains(" 2(vm2):"),
        "{show}"
    );
    ofctl_ok(&sock, "del-flows", &[]);
    for r in firewall_rules() {
        ofctl_ok(&sock, "add-flow", &[&r]);
    }
    let chardev = |port: &str| {
        format!(
            "socket,id=c0,path={},reconnect=1",
            dir.join(format!("{port}.sock")).display()
        )
    };
    let mut b = Guest::new(
        "b",
        &chardev("vm2"),
        "52:54:00:00:00:02",
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.control=1 \
         ferrovs.args=bg,tcp-recv,5000",
    );
    b.control = true;
    let _b = b.start(&dir, &img);
    let mut a = Guest::new(
        "a",
        &chardev("vm1"),
        "52:54:00:00:00:01",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.control=1 \
         ferrovs.peer=10.0.0.2 ferrovs.wait=90 ferrovs.args=bg,tcp-recv,5001",
    );
    a.control = true;
    let _a = a.start(&dir, &img);
    wait_console(&dir, "b", &["FERROVS-GUEST-READY 52:54:00:00:00:02"], 120);
    wait_console(&dir, "a", &["FERROVS-PEER-UP"], 180);
    let verdict = ["FERROVS-PING-OK", "FERROVS-PING-FAIL"];

    console_command(&dir, "a", "ping 10.0.0.2 5");
    assert_eq!(
        wait_console(&dir, "a", &verdict, 60),
        "FERROVS-PING-OK",
        "ping A→B: {}",
        console(&dir, "a")
    );
    console_command(&dir, "b", "ping 10.0.0.1 3");
    assert_eq!(
        wait_console(&dir, "b", &verdict, 60),
        "FERROVS-PING-FAIL",
        "ping B→A must be refused: {}",
        console(&dir, "b")
    );

    // A TCP stream A→B: everything A sent, B received.
    console_command(&dir, "a", "tool tcp-send,10.0.0.2,5000,3");
    wait_console(&dir, "a", &["FERROVS-TOOL-CMD-DONE"], 120);
    let sent = results(&dir, "a");
    assert_eq!(sent.len(), 1, "{}", console(&dir, "a"));
    wait_until("B's receiver result", 30, || !results(&dir, "b").is_empty());
    let got = results(&dir, "b");
    assert!(field(&sent[0], "bytes") > 0, "{sent:?}");
    assert_eq!(field(&got[0], "bytes"), field(&sent[0], "bytes"), "{got:?}");

    // B→A: the connect never completes (the tool tries for 60 s), A accepts nothing.
    console_command(&dir, "b", "tool tcp-send,10.0.0.1,5001,2");
    wait_console(&dir, "b", &["FERROVS-TOOL-CMD-DONE"], 150);
    let cb = console(&dir, "b");
    assert!(cb.contains("FERROVS-ERROR connect 10.0.0.1:5001"), "{cb}");
    assert_eq!(results(&dir, "a").len(), 1, "{}", console(&dir, "a"));
    let drops = ofctl_ok(&sock, "dump-flows", &["cookie=0x8/-1"]);
    assert!(!drops.contains("n_packets=0,"), "{drops}");
}
