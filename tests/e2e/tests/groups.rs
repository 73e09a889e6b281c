//! OpenFlow groups carrying real traffic between network namespaces: ferrovs with three
//! AF_PACKET uplinks on veth pairs (OpenFlow ports 1, 2, 3; a sender behind port 1, a
//! receiver behind each of 2 and 3), programmed with `ovs-ofctl -O OpenFlow13` over its
//! management socket. UDP to an address no one owns (a static neighbour entry in the
//! sender) goes to a group:
//!
//! - `select`: many flows (one UDP source port each) spread over both ports, each flow
//!   always to the same one;
//! - `all`: every packet to both ports;
//! - `fast_failover`: to the first bucket whose watched port is live; when the receiver
//!   sets its end of the veth down (ferrovs's end loses carrier) traffic moves to the next
//!   bucket within a bounded time, and back once the link is up again.
//!
//! Each time the group's and its buckets' counters (`dump-group-stats`) are compared with
//! what was sent and what arrived. IPv6 is off in the namespaces, so nothing but the test's
//! datagrams reaches a receiver's veth (on both ends of each pair), and the switch has no rule
//! but the test's (fail-mode secure: what misses them is dropped).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrovs_e2e::*;

/// The address the datagrams go to (no one has it) and the MAC the sender uses for it.
const DST_IP: &str = "10.78.0.100";
const DST_MAC: &str = "02:00:00:00:78:64";

fn tools() -> bool {
    require(
        is_root() && have("ip") && have("tcpdump") && have("python3") && have("ovs-ofctl"),
        "root, iproute2, tcpdump, python3 and ovs-ofctl",
    )
}

/// ferrovs with bridge `brg` and ports 1 (sender), 2 and 3 (receivers), each an uplink on a
/// veth pair whose other end is in its own namespace.
struct Topo {
    dir: PathBuf,
    _sw: Proc,
    _net: Net,
    /// Namespace and its end of the veth, by OpenFlow port (index 0: port 1).
    ns: Vec<(String, String)>,
}

impl Topo {
    fn new(test: &str) -> Topo {
        let dir = run_dir(test);
        let (core, _) = cores();
        let sw = start_switch(&dir, core, &[]);
        let o = cli(&dir, &["add-bridge", "brg"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = cli(&dir, &["set-bridge", "brg", "fail-mode=secure"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wait_until("management socket", 10, || dir.join("brg.mgmt").exists());
        let mut net = Net::new();
        let mut ns = Vec::new();
        for i in 1..=3 {
            let n = Net::name(&format!("gr{i}-"));
            net.netns(&n);
            for k in ["all", "default"] {
                Net::no_ipv6(&n, k);
            }
            let (a, b) = (Net::name(&format!("gra{i}")), Net::name(&format!("grb{i}")));
            net.veth_into(&a, &b, &n, &format!("10.78.0.{i}/24"));
            // (Else our end sends IPv6 router solicitations and MLD reports to theirs.)
            let o = Command::new("sysctl")
                .args(["-qw", &format!("net.ipv6.conf.{a}.disable_ipv6=1")])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            Net::ip(&["link", "set", &a, "up"]);
            let o = cli(
                &dir,
                &[
                    "add-port",
                    "brg",
                    &format!("g{i}"),
                    "type=uplink",
                    &format!("dev={a}"),
                    "mode=af_packet",
                    &format!("ofport={i}"),
                ],
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            ns.push((n, b));
        }
        let (n1, b1) = &ns[0];
        Net::ip(&[
            "-n",
            n1,
            "neigh",
            "replace",
            DST_IP,
            "lladdr",
            DST_MAC,
            "dev",
            b1,
            "nud",
            "permanent",
        ]);
        Topo {
            dir,
            _sw: sw,
            _net: net,
            ns,
        }
    }

    fn mgmt(&self) -> PathBuf {
        self.dir.join("brg.mgmt")
    }

    /// Frames received by the namespace end of port `port`'s veth so far.
    fn rx(&self, port: usize) -> u64 {
        let (n, b) = &self.ns[port - 1];
        Net::counter(n, b, "rx_packets")
    }

    /// Sends `count` datagrams on each of `flows` UDP source ports from `sport0` on (to
    /// `DST_IP`, port 9) from behind port 1, a flow after the other, 0.5 ms apart.
    fn send(&self, sport0: u16, flows: u16, count: u32) {
        let script = "import socket,sys,time\n\
            s0,n,c=int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3])\n\
            for p in range(s0,s0+n):\n\
            \x20   s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
            \x20   s.bind(('0.0.0.0',p))\n\
            \x20   for i in range(c):\n\
            \x20       s.sendto(b'ferrovs-group-%d-%d'%(p,i),(sys.argv[4],9))\n\
            \x20       time.sleep(0.0005)\n\
            \x20   s.close()\n";
        let o = Net::exec(
            &self.ns[0].0,
            &[
                "python3",
                "-c",
                script,
                &sport0.to_string(),
                &flows.to_string(),
                &count.to_string(),
                DST_IP,
            ],
        );
        assert!(
            o.status.success(),
            "sender: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Starts capturing the test's datagrams behind port `port` into `DIR/NAME.pcap`.
    fn capture(&self, port: usize, name: &str) -> Capture {
        let (n, b) = &self.ns[port - 1];
        let path = self.dir.join(format!("{name}.pcap"));
        let child = Command::new("ip")
            // --immediate-mode: each packet as it comes (else libpcap hands packets over in
            // blocks with a 1 s timeout, and those still in a block at SIGINT are lost).
            .args([
                "netns",
                "exec",
                n,
                "tcpdump",
                "--immediate-mode",
                "-i",
                b,
                "-nn",
                "-U",
                "-w",
            ])
            .arg(&path)
            .args(["udp", "and", "dst", "host", DST_IP])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump runs");
        // tcpdump says "listening on ..." once it captures.
        let mut c = Capture { child, path };
        c.wait_listening();
        c
    }

    /// `dump-group-stats` of group `id`: (packets, per-bucket packets).
    fn group_stats(&self, id: u32) -> (u64, Vec<u64>) {
        let out = ofctl_ok(
            &self.mgmt(),
            "dump-group-stats",
            &[&format!("group_id={id}")],
        );
        let line = out
            .lines()
            .find(|l| l.contains(&format!("group_id={id},")))
            .unwrap_or_else(|| panic!("no group {id} in dump-group-stats:\n{out}"));
        group_counts(line)
    }
}

/// A `dump-group-stats` line: (packet_count, each bucket's packet_count in order).
fn group_counts(line: &str) -> (u64, Vec<u64>) {
    let mut parts = line.trim().split("bucket");
    let head = parts.next().unwrap_or("");
    let packets = |s: &str| {
        s.split([',', ':', ' '])
            .find_map(|w| w.strip_prefix("packet_count="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no packet_count in {s:?} of {line:?}"))
    };
    (packets(head), parts.map(packets).collect())
}

/// A running tcpdump (stopped, and its file read, by [`Capture::finish`]).
struct Capture {
    child: Child,
    path: PathBuf,
}

impl Capture {
    fn wait_listening(&mut self) {
        use std::io::Read;
        let mut err = self.child.stderr.take().expect("piped stderr");
        let mut seen = Vec::new();
        let t = Instant::now();
        let mut b = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("listening on") {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "tcpdump did not start: {}",
                String::from_utf8_lossy(&seen)
            );
            match err.read(&mut b) {
                Ok(0) => panic!("tcpdump exited: {}", String::from_utf8_lossy(&seen)),
                Ok(n) => seen.extend_from_slice(&b[..n]),
                Err(e) => panic!("tcpdump: {e}"),
            }
        }
        // Keep draining its stderr so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut err, &mut std::io::sink());
        });
    }

    /// Stops tcpdump (SIGINT: it flushes its file) and returns the UDP source port of each
    /// datagram it captured.
    fn finish(mut self) -> Vec<u16> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        pcap_frames(&self.path)
            .iter()
            .filter_map(|(_, f)| udp_sport(f))
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The UDP source port of an Ethernet/IPv4/UDP frame.
fn udp_sport(f: &[u8]) -> Option<u16> {
    if f.len() < 14 + 20 + 8 || f[12..14] != [0x08, 0x00] || f[23] != 17 {
        return None;
    }
    let l4 = 14 + usize::from(f[14] & 0x0f) * 4;
    Some(u16::from_be_bytes([*f.get(l4)?, *f.get(l4 + 1)?]))
}

/// A select group spreads 64 flows over its two buckets' ports, every datagram of a flow to
/// the same port; the group counted every datagram and each bucket what its port received.
#[test]
fn a_select_group_spreads_flows_over_ports_each_flow_to_one() {
    if !tools() {
        return;
    }
    let t = Topo::new("groups-select");
    let m = t.mgmt();
    ofctl_ok(
        &m,
        "add-group",
        &["group_id=1,type=select,bucket=output:2,bucket=output:3"],
    );
    ofctl_ok(
        &m,
        "add-flow",
        &[&format!(
            "priority=10,in_port=1,udp,nw_dst={DST_IP},actions=group:1"
        )],
    );
    let (c2, c3) = (t.capture(2, "p2"), t.capture(3, "p3"));
    let (flows, count) = (64u16, 5u32);
    t.send(20000, flows, count);
    let (s2, s3) = (c2.finish(), c3.finish());
    let tally = |v: &[u16]| {
        let mut m: BTreeMap<u16, u32> = BTreeMap::new();
        for p in v {
            *m.entry(*p).or_default() += 1;
        }
        m
    };
    let (by2, by3) = (tally(&s2), tally(&s3));
    eprintln!(
        "select: {} flows to port 2 ({} datagrams), {} to port 3 ({})",
        by2.len(),
        s2.len(),
        by3.len(),
        s3.len()
    );
    for p in 20000..20000 + flows {
        let (a, b) = (
            by2.get(&p).copied().unwrap_or(0),
            by3.get(&p).copied().unwrap_or(0),
        );
        assert!(
            (a, b) == (count, 0) || (a, b) == (0, count),
            "flow from port {p}: {a} datagrams to port 2, {b} to port 3 (all {count} to one)"
        );
    }
    assert!(
        !by2.is_empty() && !by3.is_empty(),
        "both buckets carry flows: {by2:?} {by3:?}"
    );
    let total = u64::from(flows) * u64::from(count);
    let (g, buckets) = t.group_stats(1);
    assert_eq!(g, total, "the group counted every datagram");
    assert_eq!(
        buckets,
        vec![s2.len() as u64, s3.len() as u64],
        "each bucket counted what its port received"
    );
}

/// An all group copies every datagram to both ports; the group and each bucket counted
/// every one.
#[test]
fn an_all_group_copies_to_every_bucket() {
    if !tools() {
        return;
    }
    let t = Topo::new("groups-all");
    let m = t.mgmt();
    ofctl_ok(
        &m,
        "add-group",
        &["group_id=2,type=all,bucket=output:2,bucket=output:3"],
    );
    ofctl_ok(
        &m,
        "add-flow",
        &[&format!(
            "priority=10,in_port=1,udp,nw_dst={DST_IP},actions=group:2"
        )],
    );
    let (c2, c3) = (t.capture(2, "p2"), t.capture(3, "p3"));
    t.send(21000, 10, 10);
    let (s2, s3) = (c2.finish(), c3.finish());
    assert_eq!((s2.len(), s3.len()), (100, 100), "every datagram to both");
    let mut a = s2.clone();
    let mut b = s3.clone();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "the same datagrams");
    assert_eq!(t.group_stats(2), (100, vec![100, 100]));
}

/// A fast_failover group sends to port 2 while it is live; when the receiver behind it sets
/// its veth end down (ferrovs's end loses carrier) the datagrams go to port 3 within a
/// bounded time, and back to port 2 once it is up again. The group counted every datagram,
/// its buckets split them as the ports saw them (bucket 0 also counts those sent into the
/// dead link before ferrovs noticed).
#[test]
fn a_fast_failover_group_follows_the_watched_ports_carrier() {
    if !tools() {
        return;
    }
    let t = Topo::new("groups-ff");
    let m = t.mgmt();
    ofctl_ok(
        &m,
        "add-group",
        &["group_id=3,type=fast_failover,bucket=watch_port:2,output:2,bucket=watch_port:3,output:3"],
    );
    ofctl_ok(
        &m,
        "add-flow",
        &[&format!(
            "priority=10,in_port=1,udp,nw_dst={DST_IP},actions=group:3"
        )],
    );
    let mut sent = 0u64;
    let rx0 = (t.rx(2), t.rx(3));
    // Port 2 is live: everything to it.
    t.send(22000, 1, 20);
    sent += 20;
    wait_until("20 datagrams behind port 2", 5, || t.rx(2) >= rx0.0 + 20);
    assert_eq!(t.rx(3), rx0.1, "nothing to port 3 while port 2 is live");
    let pd = |port: usize| {
        let (n, b) = &t.ns[port - 1];
        Net::ip(&["-n", n, "link", "set", b, "down"]);
    };
    let pu = |port: usize| {
        let (n, b) = &t.ns[port - 1];
        Net::ip(&["-n", n, "link", "set", b, "up"]);
    };
    // Port 2's link goes down: the datagrams move to port 3.
    let rx3 = t.rx(3);
    pd(2);
    let down_at = Instant::now();
    let moved = loop {
        t.send(22001, 1, 1);
        sent += 1;
        if t.rx(3) > rx3 {
            break down_at.elapsed();
        }
        assert!(
            down_at.elapsed() < Duration::from_secs(3),
            "traffic did not move to port 3 within 3 s of port 2's link going down"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let show = cli_json(&t.dir, &["show"]);
    let port_desc = ofctl_ok(&m, "dump-ports-desc", &[]);
    let rx3 = t.rx(3);
    t.send(22002, 1, 20);
    sent += 20;
    wait_until("20 datagrams behind port 3", 5, || t.rx(3) >= rx3 + 20);
    // Port 2 is back: the datagrams go to it again.
    pu(2);
    let rx2 = t.rx(2);
    let up_at = Instant::now();
    let back = loop {
        t.send(22003, 1, 1);
        sent += 1;
        if t.rx(2) > rx2 {
            break up_at.elapsed();
        }
        assert!(
            up_at.elapsed() < Duration::from_secs(5),
            "traffic did not come back to port 2 within 5 s of its link coming up"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let (rx2, rx3) = (t.rx(2), t.rx(3));
    t.send(22004, 1, 20);
    sent += 20;
    wait_until("20 datagrams behind port 2 again", 5, || {
        t.rx(2) >= rx2 + 20
    });
    assert_eq!(t.rx(3), rx3, "nothing to port 3 once port 2 is back");
    eprintln!(
        "fast_failover: moved to port 3 {moved:?} after port 2 went down, back {back:?} after \
         it came up; {sent} datagrams"
    );
    // While it was down, OpenFlow showed port 2 down.
    let g2 = show["bridges"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == "brg"))
        .map(|b| b.to_string())
        .unwrap_or_default();
    let line2 = port_desc
        .lines()
        .skip_while(|l| !l.contains("2(g2)"))
        .take(4)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        line2.contains("LINK_DOWN"),
        "dump-ports-desc shows port 2's link down while it was:\n{port_desc}\n{g2}"
    );
    let (g, buckets) = t.group_stats(3);
    let to2 = t.rx(2) - rx0.0;
    let to3 = t.rx(3) - rx0.1;
    assert_eq!(g, sent, "the group counted every datagram");
    assert_eq!(buckets.len(), 2, "{buckets:?}");
    assert_eq!(buckets[0] + buckets[1], sent, "{buckets:?}");
    assert_eq!(buckets[1], to3, "bucket 1 counted what port 3 received");
    assert!(
        buckets[0] >= to2 && buckets[0] - to2 <= 1 + moved.as_millis() as u64 / 10,
        "bucket 0 counted what port 2 received ({to2}) and what went into its dead link \
         before the switch noticed: {buckets:?}"
    );
}
