//! The asynchronous OpenFlow path, as operators see it with `ovs-ofctl -O OpenFlow13`:
//! `monitor … 65535` sees the PACKET_IN a table-miss rule `actions=CONTROLLER:65535` sends
//! (the same text as real OVS, a `datapath_type=netdev` bridge in the same run, prints for
//! the same frame), `packet-out` frames arrive in a namespace (to a port, and through the
//! tables), bad packet-outs get OVS's errors, and a flood of packet-ins neither stalls the
//! daemon nor stops forwarding.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrovs_e2e::*;

/// `ovs-ofctl -O OpenFlow13 monitor unix:SOCK 65535`, its output in `out`; killed on drop.
struct Monitor {
    child: Child,
    out: PathBuf,
}

impl Monitor {
    fn start(sock: &Path, out: PathBuf) -> Monitor {
        let f = std::fs::File::create(&out).unwrap();
        let child = Command::new("ovs-ofctl")
            // Its unixctl socket goes to OVS_RUNDIR.
            .env("OVS_RUNDIR", out.parent().unwrap())
            .args(["-O", "OpenFlow13", "monitor"])
            .arg(format!("unix:{}", sock.display()))
            .arg("65535")
            // ovs-ofctl prints what it receives on stderr, its diagnostics too.
            .stdout(Stdio::from(f.try_clone().unwrap()))
            .stderr(Stdio::from(f))
            .spawn()
            .expect("ovs-ofctl monitor");
        // It has set its miss_send_len once its SET_CONFIG went out; give it that long.
        std::thread::sleep(Duration::from_millis(700));
        Monitor { child, out }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// The first message whose header line contains `what`: its lines (header and decoded
    /// packet), waiting up to 10 s.
    fn wait_for(&self, what: &str) -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let text = self.text();
            let lines: Vec<&str> = text.lines().collect();
            if let Some(i) = lines.iter().position(|l| l.contains(what)) {
                if what.contains("PACKET_IN") && i + 1 >= lines.len() {
                    // The decoded packet line is not there yet.
                } else {
                    let mut v = vec![lines[i].to_string()];
                    if let Some(n) = lines.get(i + 1) {
                        if !n.starts_with("OFPT_") && !n.starts_with("NXT_") {
                            v.push(n.to_string());
                        }
                    }
                    return v;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no {what} in monitor output:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A message's text after its header (`OFPT_PACKET_IN (OF1.3) (xid=0x0): ` or OVS's
/// `NXT_PACKET_IN2 …`): what both switches must print the same.
fn body(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match l.find("): ") {
            Some(i) if l.starts_with("OFPT_") || l.starts_with("NXT_") => l[i + 3..].to_string(),
            _ => l.clone(),
        })
        .collect()
}

/// A UDP frame from 02:00:00:00:00:01 (10.8.0.1:1234) to 02:00:00:00:00:02 (10.8.0.2:5678).
const UDP_FRAME: &str = "020000000002020000000001080045000024000100004011a6c40a0800010a080002\
                         04d2162e0010f2a70102030405060708";

/// Sends `hex` on `dev` in `ns` through an AF_PACKET socket.
fn send_raw(ns: &str, dev: &str, hex: &str) {
    let o = Net::exec(
        ns,
        &[
            "python3",
            "-c",
            "import socket,sys; s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW); \
             s.bind((sys.argv[1],0)); s.send(bytes.fromhex(sys.argv[2]))",
            dev,
            hex,
        ],
    );
    assert!(
        o.status.success(),
        "raw send: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Debian's ovs-vswitchd with a netdev bridge br0 and dummy ports vm1, vm2 (OpenFlow ports
/// 1 and 2).
struct Ovs {
    sw: ferrovs_e2e::ovsdb::OvsVswitchd,
    mgmt: PathBuf,
    ctl: PathBuf,
}

fn start_ovs(dir: &Path) -> Ovs {
    let sw = ferrovs_e2e::ovsdb::OvsVswitchd::start(dir, "pio");
    let mgmt = sw.netdev_br0(true);
    let ctl = sw.unixctl();
    Ovs { sw, mgmt, ctl }
}

fn tools() -> bool {
    require(
        is_root()
            && have("ip")
            && have("ping")
            && have("python3")
            && have("ovs-ofctl")
            && have("ovs-appctl")
            && Path::new("/dev/net/tun").exists()
            && Path::new("/usr/sbin/ovs-vswitchd").exists()
            && ovsdb::available(),
        "root, iproute2, ping, python3, /dev/net/tun and Debian's openvswitch-switch",
    )
}

/// ferrovsd with br0 and TAP ports t1, t2 (OpenFlow ports 1 and 2) in namespaces
/// (10.8.0.1, 10.8.0.2).
struct Ferrovs {
    _sw: Proc,
    net: Net,
    dir: PathBuf,
    sock: PathBuf,
    ns: (String, String),
    taps: (String, String),
}

fn start_ferrovs(name: &str) -> Ferrovs {
    let dir = run_dir(name);
    let (pmd, _) = cores();
    let sw = start_bare_switch(&dir, pmd, &["br0"]);
    let sock = dir.join("br0.mgmt");
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("pi1-"), Net::name("pi2-"));
    let (t1, t2) = (Net::name("pa"), Net::name("pb"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.8.0.1/24"),
        ("t2", &t2, &ns2, "10.8.0.2/24"),
    ] {
        net.tap_port(&dir, "br0", p, t, ns, a);
    }
    // No IPv6 chatter (router solicitations would be packet-ins too).
    for (ns, t) in [(&ns1, &t1), (&ns2, &t2)] {
        Net::no_ipv6(ns, t);
    }
    Ferrovs {
        _sw: sw,
        net,
        dir,
        sock,
        ns: (ns1, ns2),
        taps: (t1, t2),
    }
}

#[test]
fn packet_in_of_a_table_miss_is_what_ovs_sends() {
    if !tools() {
        return;
    }
    let f = start_ferrovs("packet-in");
    let ovs_dir = run_dir("packet-in-ovs");
    let ovs = start_ovs(&ovs_dir);
    for sock in [&f.sock, &ovs.mgmt] {
        ofctl_ok(sock, "del-flows", &[]);
        ofctl_ok(sock, "add-flow", &["priority=0,actions=CONTROLLER:65535"]);
        ofctl_ok(
            sock,
            "add-flow",
            &["priority=5,cookie=0x42,udp,tp_dst=9999,actions=controller:20"],
        );
    }
    // dump-flows prints the controller actions as OVS prints them.
    let dump = |s: &Path| {
        let mut v: Vec<String> = ofctl_ok(s, "dump-flows", &["--no-stats"])
            .lines()
            .map(|l| l.trim().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(dump(&f.sock), dump(&ovs.mgmt));

    // The same frame into port 1 of each: the same packet-in (miss, then the action with
    // its cookie; max_len truncates nothing, in OVS either: it buffers nothing).
    let mf = Monitor::start(&f.sock, f.dir.join("monitor.txt"));
    let mo = Monitor::start(&ovs.mgmt, ovs_dir.join("monitor.txt"));
    send_raw(&f.ns.0, &f.taps.0, UDP_FRAME);
    let ovs_receive = |hex: &str| {
        let o = Command::new("ovs-appctl")
            .arg("-t")
            .arg(&ovs.ctl)
            .args(["netdev-dummy/receive", "vm1", hex])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    ovs_receive(UDP_FRAME);
    let a = body(&mf.wait_for("PACKET_IN"));
    let b = body(&mo.wait_for("PACKET_IN"));
    assert_eq!(a, b, "ferrovs vs OVS");
    assert!(
        a[0].contains("(via no_match)") && a[0].contains("in_port=1"),
        "{a:?}"
    );
    drop((mf, mo));

    let to_9999 = UDP_FRAME.replace("162e0010", "270f0010");
    let mf = Monitor::start(&f.sock, f.dir.join("monitor2.txt"));
    let mo = Monitor::start(&ovs.mgmt, ovs_dir.join("monitor2.txt"));
    send_raw(&f.ns.0, &f.taps.0, &to_9999);
    ovs_receive(&to_9999);
    let a = body(&mf.wait_for("PACKET_IN"));
    let b = body(&mo.wait_for("PACKET_IN"));
    assert_eq!(a, b, "ferrovs vs OVS");
    assert!(
        a[0].contains("cookie=0x42")
            && a[0].contains("(via action)")
            && a[0].contains("data_len=50"),
        "{a:?}"
    );
    drop((mf, mo));

    // A ping: its echo request comes up as a packet-in (ARP first).
    let m = Monitor::start(&f.sock, f.dir.join("monitor3.txt"));
    let _ = Net::exec(
        &f.ns.0,
        &["ping", "-c", "3", "-i", "0.2", "-W", "1", "10.8.0.2"],
    );
    let arp = m.wait_for("PACKET_IN");
    assert!(
        arp[0].contains("in_port=1") && arp[1].starts_with("arp,"),
        "{arp:?}"
    );
    // A connection that never set miss_send_len gets no packet-in.
    let mut quiet = UnixStream::connect(&f.sock).unwrap();
    quiet.write_all(&[4, 0, 0, 8, 0, 0, 0, 1]).unwrap();
    quiet
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let _ = Net::exec(
        &f.ns.0,
        &["ping", "-c", "2", "-i", "0.2", "-W", "1", "10.8.0.2"],
    );
    let mut buf = [0u8; 4096];
    let n = quiet.read(&mut buf).unwrap();
    assert_eq!(n, 16, "only the HELLO: {:?}", &buf[..n]);
    assert!(
        quiet.read(&mut buf).is_err(),
        "a service connection without miss_send_len got a message"
    );
}

#[test]
fn packet_out_reaches_a_namespace_and_bad_ones_get_ovss_errors() {
    if !tools() {
        return;
    }
    let f = start_ferrovs("packet-out");
    let (ns2, t2) = (&f.ns.1, &f.taps.1);
    let rx = || Net::counter(ns2, t2, "rx_packets");
    // To a port.
    let before = rx();
    ofctl_ok(
        &f.sock,
        "packet-out",
        &[&format!(
            "in_port=controller packet={UDP_FRAME} actions=output:2"
        )],
    );
    wait_until("the packet-out on t2", 5, || rx() > before);
    // Through the tables as if received on port 1 (and from LOCAL-less CONTROLLER too).
    ofctl_ok(&f.sock, "del-flows", &[]);
    ofctl_ok(
        &f.sock,
        "add-flow",
        &["priority=10,in_port=1,actions=output:2"],
    );
    let before = rx();
    ofctl_ok(
        &f.sock,
        "packet-out",
        &[&format!("in_port=1 packet={UDP_FRAME} actions=TABLE")],
    );
    wait_until("the TABLE packet-out on t2", 5, || rx() > before);
    assert!(ofctl_ok(&f.sock, "dump-flows", &[]).contains("n_packets=1,"));
    // With edits: a VLAN tag pushed and a MAC rewritten still arrive.
    let before = rx();
    ofctl_ok(
        &f.sock,
        "packet-out",
        &[&format!(
            "in_port=controller packet={UDP_FRAME} \
             actions=set_field:02:00:00:00:00:77->eth_src,push_vlan:0x8100,set_field:4097->vlan_vid,output:2"
        )],
    );
    wait_until("the edited packet-out on t2", 5, || rx() > before);
    // Refusals, with OVS's error names.
    let (ok, _, err) = ofctl(
        &f.sock,
        "packet-out",
        &[&format!("in_port=7 packet={UDP_FRAME} actions=output:2")],
    );
    assert!(!ok && err.contains("OFPBRC_BAD_PORT"), "{err}");
    let (ok, _, err) = ofctl(
        &f.sock,
        "packet-out",
        &[&format!("in_port=1 packet={UDP_FRAME} actions=output:9")],
    );
    assert!(!ok && err.contains("OFPBAC_BAD_OUT_PORT"), "{err}");
    let (ok, _, err) = ofctl(
        &f.sock,
        "packet-out",
        &[&format!("in_port=1 packet={UDP_FRAME} actions=group:1")],
    );
    assert!(!ok && err.contains("OFPBAC_BAD_OUT_GROUP"), "{err}");
    // Garbage frames are sent as they are or dropped, never a crash.
    for hex in ["ffffffffffffffffffffffffffff", &"ab".repeat(1500)] {
        let _ = ofctl(
            &f.sock,
            "packet-out",
            &[&format!(
                "in_port=controller packet={hex} actions=output:2,TABLE"
            )],
        );
        ofctl_ok(
            &f.sock,
            "packet-out",
            &[&format!("in_port=controller packet={hex} actions=output:2")],
        );
    }
    // A buffer id: OFPBRC_BUFFER_UNKNOWN (raw message: ovs-ofctl always sends NO_BUFFER).
    let mut s = UnixStream::connect(&f.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[4, 0, 0, 8, 0, 0, 0, 1]).unwrap();
    let frame = hex(UDP_FRAME);
    let mut po = vec![4u8, 13, 0, 0, 0, 0, 0, 9];
    po.extend_from_slice(&7u32.to_be_bytes()); // buffer_id
    po.extend_from_slice(&0xffff_fffdu32.to_be_bytes()); // in_port CONTROLLER
    po.extend_from_slice(&0u16.to_be_bytes()); // actions_len
    po.extend_from_slice(&[0; 6]);
    po.extend_from_slice(&frame);
    let len = po.len() as u16;
    po[2..4].copy_from_slice(&len.to_be_bytes());
    s.write_all(&po).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < 16 + 12 {
        let n = s.read(&mut buf).expect("an error reply");
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    // After the HELLO: OFPT_ERROR, type OFPET_BAD_REQUEST (1), code BUFFER_UNKNOWN (8).
    assert_eq!(got[17], 1, "{got:?}");
    assert_eq!(&got[24..28], &[0, 1, 0, 8], "{got:?}");
    // The switch still works.
    ofctl_ok(&f.sock, "show", &[]);
    let _ = &f.net;
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_flood_of_packet_ins_is_bounded_and_forwarding_goes_on() {
    if !tools() {
        return;
    }
    let f = start_ferrovs("packet-in-flood");
    // Everything from port 1 goes up as well as across; from port 2 straight back.
    ofctl_ok(&f.sock, "del-flows", &[]);
    ofctl_ok(
        &f.sock,
        "add-flow",
        &["priority=10,in_port=1,actions=CONTROLLER:65535,output:2"],
    );
    ofctl_ok(
        &f.sock,
        "add-flow",
        &["priority=10,in_port=2,actions=output:1"],
    );
    // A peer that asks for packet-ins and never reads them.
    let mut lazy = UnixStream::connect(&f.sock).unwrap();
    lazy.write_all(&[4, 0, 0, 8, 0, 0, 0, 1]).unwrap();
    // SET_CONFIG: flags 0, miss_send_len 0xffff.
    lazy.write_all(&[4, 9, 0, 12, 0, 0, 0, 2, 0, 0, 0xff, 0xff])
        .unwrap();
    // A flood from ns1 (ping -f, 20 000 echo requests of 1 KB).
    let flood = Net::exec(
        &f.ns.0,
        &[
            "ping", "-f", "-c", "20000", "-s", "1000", "-W", "1", "10.8.0.2",
        ],
    );
    let _ = flood;
    // Pings still get through, the daemon still answers.
    let o = Net::exec(
        &f.ns.0,
        &["ping", "-c", "10", "-i", "0.05", "-W", "1", "10.8.0.2"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("10 received"), "{out}");
    ofctl_ok(&f.sock, "show", &[]);
    let show = cli_json(&f.dir, &["show"]);
    let of = &show["packet_io"];
    assert!(
        of["packet_ins_queued"].as_u64().unwrap_or(0) > 0,
        "packet-in counters in show: {of}"
    );
    drop(lazy);
}

/// A FLOW_REMOVED line without its duration (which differs by when each switch looked).
fn without_duration(l: &str) -> String {
    l.split([' ', ','])
        .filter(|t| !t.starts_with("duration"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn flow_removed_on_hard_timeout_and_delete_as_ovs() {
    if !tools() {
        return;
    }
    let f = start_ferrovs("flow-removed");
    let ovs_dir = run_dir("flow-removed-ovs");
    let ovs = start_ovs(&ovs_dir);
    let mut seen = Vec::new();
    for (sock, dir) in [(&f.sock, &f.dir), (&ovs.mgmt, &ovs_dir)] {
        let m = Monitor::start(sock, dir.join("monitor-fr.txt"));
        ofctl_ok(
            sock,
            "add-flow",
            &["send_flow_rem,hard_timeout=1,priority=7,cookie=0x7,udp,actions=drop"],
        );
        ofctl_ok(
            sock,
            "add-flow",
            &["send_flow_rem,priority=8,tcp,actions=drop"],
        );
        // No FLOW_REMOVED for a rule that did not ask.
        ofctl_ok(sock, "add-flow", &["priority=9,icmp,actions=drop"]);
        // dump-flows shows the flag.
        let dump = ofctl_ok(sock, "dump-flows", &["tcp"]);
        assert!(dump.contains("send_flow_rem"), "{dump}");
        let hard = m.wait_for("reason=hard");
        ofctl_ok(sock, "del-flows", &["tcp"]);
        ofctl_ok(sock, "del-flows", &["icmp"]);
        let del = m.wait_for("reason=delete");
        std::thread::sleep(Duration::from_millis(300));
        let n = m.text().matches("FLOW_REMOVED").count();
        assert_eq!(n, 2, "{}", m.text());
        seen.push((
            without_duration(&body(&hard)[0]),
            without_duration(&body(&del)[0]),
        ));
    }
    assert_eq!(seen[0], seen[1], "ferrovs vs OVS");
}

/// The frames of a pcap file (OVS's dummy port `options:tx_pcap`), in order.
fn pcap_frames(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).unwrap_or_default();
    let mut v = Vec::new();
    let mut at = 24;
    while b.len() >= at + 16 {
        let n = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16;
        if b.len() < at + n {
            break;
        }
        v.push(b[at..at + n].to_vec());
        at += n;
    }
    v
}

/// MPLS on the wire: the same three frames into port 1 of ferrovs and of OVS, through the
/// same rules (push_mpls over IPv4 with a label rewrite; pop_mpls and a later table matching
/// and rewriting the inner UDP header; dec_mpls_ttl then a second entry pushed), leave port
/// 2 byte for byte the same.
#[test]
fn mpls_frames_leave_byte_exact_as_ovs_sends_them() {
    if !tools() {
        return;
    }
    let f = start_ferrovs("mpls-wire");
    let ovs_dir = run_dir("mpls-wire-ovs");
    let ovs = start_ovs(&ovs_dir);
    let pcap = ovs_dir.join("vm2.pcap");
    let p = pcap.display().to_string();
    ovs.sw
        .db
        .vsctl(&["set", "interface", "vm2", &format!("options:tx_pcap={p}")])
        .expect("tx_pcap");
    let rules = [
        "priority=10,in_port=1,udp,nw_src=10.8.0.1,actions=push_mpls:0x8847,set_field:77->mpls_label,output:2",
        "priority=10,in_port=1,mpls,mpls_label=78,actions=pop_mpls:0x0800,goto_table:1",
        "priority=10,in_port=1,mpls,mpls_label=79,actions=dec_mpls_ttl,push_mpls:0x8848,set_field:5->mpls_tc,output:2",
        "table=1,priority=10,udp,tp_dst=5678,actions=mod_nw_dst:10.8.0.3,output:2",
    ];
    for sock in [&f.sock, &ovs.mgmt] {
        ofctl_ok(sock, "del-flows", &[]);
        for r in rules {
            ofctl_ok(sock, "add-flow", &[r]);
        }
    }
    let dump = |s: &Path| {
        let mut v: Vec<String> = ofctl_ok(s, "dump-flows", &["--no-stats"])
            .lines()
            .map(|l| l.trim().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(dump(&f.sock), dump(&ovs.mgmt));
    // The UDP frame, then it under label 78 (TC 3, TTL 9), then under label 79.
    let ip = &UDP_FRAME[28..];
    let frames = [
        UDP_FRAME.to_string(),
        format!(
            "{}8847{:08x}{ip}",
            &UDP_FRAME[..24],
            78 << 12 | 3 << 9 | 1 << 8 | 9
        ),
        format!(
            "{}8847{:08x}{ip}",
            &UDP_FRAME[..24],
            79 << 12 | 3 << 9 | 1 << 8 | 9
        ),
    ];
    // ferrovs's port 2 is a TAP in a namespace: a raw socket there takes what arrives.
    let rx = Command::new("ip")
        .args(["netns", "exec", &f.ns.1, "python3", "-c"])
        .arg(
            "import socket,sys\n\
             s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(3))\n\
             s.bind((sys.argv[1],0)); s.settimeout(8); n=0\n\
             while n<3:\n\
             \x20   d,a=s.recvfrom(65535)\n\
             \x20   if a[2]==4 or d[:6]!=bytes.fromhex('020000000002'): continue\n\
             \x20   print(d.hex(),flush=True); n+=1\n",
        )
        .arg(&f.taps.1)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for fr in &frames {
        send_raw(&f.ns.0, &f.taps.0, fr);
        let o = Command::new("ovs-appctl")
            .arg("-t")
            .arg(&ovs.ctl)
            .args(["netdev-dummy/receive", "vm1", fr])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = rx.wait_with_output().unwrap();
    let got: Vec<Vec<u8>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(hex)
        .collect();
    wait_until("OVS's three frames", 10, || pcap_frames(&pcap).len() >= 3);
    let want = pcap_frames(&pcap);
    assert_eq!(got.len(), 3, "ferrovs sent {got:02x?}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g, w,
            "frame {i}: ferrovs (left) and OVS (right) differ:\n{g:02x?}\n{w:02x?}"
        );
    }
    // What the rules did: label 77 with the IP TTL; the popped frame rewritten; TTL 8 under
    // a second entry with TC 5.
    assert_eq!(&want[0][12..18], &[0x88, 0x47, 0x00, 0x04, 0xd1, 0x40]);
    assert_eq!(&want[1][12..14], &[0x08, 0x00]);
    assert_eq!(&want[1][30..34], &[10, 8, 0, 3]);
    assert_eq!(
        &want[2][12..22],
        &[0x88, 0x48, 0x00, 0x04, 0xfa, 0x08, 0x00, 0x04, 0xf7, 0x08]
    );
}
