//! Differential test against the Linux kernel's nf_conntrack.
//!
//! The same packet sequences go through the kernel and through `ferrovs-conntrack`, and the
//! two must agree packet by packet on the verdict (`new`, `est`, `rel`, `inv`, and whether the
//! packet is in the reply direction) and on the TCP state after it.
//!
//! The kernel side: a network namespace with a veth whose host end we inject frames into
//! with an AF_PACKET socket (a small python3 helper: this crate has no unsafe code), IPv4 and
//! IPv6 forwarding to a veth without ARP (so every accepted packet is confirmed at
//! POSTROUTING, as a forwarding firewall would), `nf_conntrack_tcp_loose=0` (no mid-stream
//! pickup, as ours), and an nftables chain that counts each packet under its `ct state` and
//! `ct direction`. After each packet the counters say the kernel's verdict and
//! `conntrack -L -o extended` says its TCP state.
//!
//! Needs root, `ip`, `nft`, `conntrack` and `python3`; skips with a message otherwise, except
//! under `CI=true` where a skip is a failure. Deliberate disagreements are listed per case
//! with their reason (`Case::expected_diffs`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferrovs_conntrack::build::{Frame, Proto};
use ferrovs_conntrack::tuple::{self, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN};
use ferrovs_conntrack::{Config, CtState, Tracker};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh_ok(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The namespace, its veth and the injector; torn down on drop.
struct Kernel {
    ns: String,
    host_if: String,
    mac: [u8; 6],
    injector: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

const RULES: &str = r#"
table inet fvct {
    counter c_new {}
    counter c_est {}
    counter c_rel {}
    counter c_inv {}
    counter c_unt {}
    counter c_rpl {}
    chain pre {
        type filter hook prerouting priority 0; policy accept;
        iifname != "fvct-n" accept
        ct direction reply counter name "c_rpl"
        ct state invalid counter name "c_inv" accept
        ct state new counter name "c_new" accept
        ct state established counter name "c_est" accept
        ct state related counter name "c_rel" accept
        ct state untracked counter name "c_unt" accept
    }
}
"#;

const INJECTOR: &str = r#"
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
for line in sys.stdin:
    s.send(bytes.fromhex(line.strip()))
    print("ok", flush=True)
"#;

impl Kernel {
    fn setup() -> Kernel {
        let ns = format!("fvct-{}", std::process::id());
        // Names of our own (several test runs may share the machine); the namespace end is
        // created inside the namespace, so its fixed name never meets another run's.
        let host_if = format!("fvh-{}", std::process::id());
        sh_ok(&["ip", "link", "del", &host_if]);
        sh_ok(&["ip", "netns", "del", &ns]);
        sh(&["ip", "netns", "add", &ns]);
        let guard = Cleanup(ns.clone(), host_if.clone());
        let nsx = |args: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", ns.as_str()];
            v.extend_from_slice(args);
            sh(&v)
        };
        sh(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", "fvct-n", "netns", &ns,
        ]);
        sh_ok(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{host_if}.disable_ipv6=1"),
        ]);
        sh(&["ip", "link", "set", &host_if, "up"]);
        nsx(&["ip", "link", "set", "lo", "up"]);
        // The way out: a veth pair inside the namespace, without ARP, so forwarded packets
        // leave at once (to the peer, which drops them: not its MAC).
        nsx(&[
            "ip", "link", "add", "o", "type", "veth", "peer", "name", "o2",
        ]);
        nsx(&["ip", "link", "set", "o", "arp", "off"]);
        nsx(&["sysctl", "-qw", "net.ipv6.conf.o2.disable_ipv6=1"]);
        nsx(&["ip", "link", "set", "o2", "up"]);
        for (k, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv6.conf.default.accept_dad", "0"),
        ] {
            nsx(&["sysctl", "-qw", &format!("{k}={v}")]);
        }
        nsx(&["ip", "link", "set", "fvct-n", "up"]);
        nsx(&["ip", "link", "set", "o", "up"]);
        nsx(&["sysctl", "-qw", "net.ipv4.conf.fvct-n.rp_filter=0"]);
        nsx(&["ip", "addr", "add", "192.168.250.1/24", "dev", "fvct-n"]);
        nsx(&["ip", "addr", "add", "fd01::1/64", "dev", "fvct-n", "nodad"]);
        nsx(&["ip", "route", "add", "10.0.0.0/8", "dev", "o"]);
        nsx(&["ip", "-6", "route", "add", "fd00::/16", "dev", "o"]);
        let rules = std::env::temp_dir().join(format!("fvct-{}.nft", std::process::id()));
        std::fs::write(&rules, RULES).unwrap();
        nsx(&["nft", "-f", rules.to_str().unwrap()]);
        let _ = std::fs::remove_file(&rules);
        // The module is loaded now, so its per-namespace sysctls exist.
        nsx(&["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=0"]);
        nsx(&[
            "sysctl",
            "-qw",
            "net.netfilter.nf_conntrack_tcp_be_liberal=0",
        ]);
        nsx(&["sysctl", "-qw", "net.netfilter.nf_conntrack_checksum=1"]);
        let mac_s = nsx(&["cat", "/sys/class/net/fvct-n/address"]);
        let mut mac = [0u8; 6];
        for (i, p) in mac_s.trim().split(':').enumerate().take(6) {
            mac[i] = u8::from_str_radix(p, 16).unwrap();
        }
        let mut injector = Command::new("python3")
            .args(["-c", INJECTOR, &host_if])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let tx = injector.stdin.take().unwrap();
        let rx = BufReader::new(injector.stdout.take().unwrap());
        std::mem::forget(guard);
        Kernel {
            ns,
            host_if,
            mac,
            injector,
            tx,
            rx,
        }
    }

    fn nsx(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "netns", "exec", self.ns.as_str()];
        v.extend_from_slice(args);
        sh(&v)
    }

    /// (new, est, rel, inv, untracked, reply) packet counts.
    fn counters(&self) -> [u64; 6] {
        let j = self.nsx(&["nft", "-j", "list", "counters", "table", "inet", "fvct"]);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        let mut c = [0u64; 6];
        for item in v["nftables"].as_array().unwrap() {
            let Some(ctr) = item.get("counter") else {
                continue;
            };
            let i = match ctr["name"].as_str().unwrap() {
                "c_new" => 0,
                "c_est" => 1,
                "c_rel" => 2,
                "c_inv" => 3,
                "c_unt" => 4,
                "c_rpl" => 5,
                _ => continue,
            };
            c[i] = ctr["packets"].as_u64().unwrap();
        }
        c
    }

    /// Injects a frame into the namespace.
    fn inject(&mut self, frame: &[u8]) {
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(self.tx, "{hex}").unwrap();
        let mut line = String::new();
        self.rx.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok", "injector");
    }

    /// Sends a frame and returns the kernel's verdict for it.
    fn send(&mut self, frame: &[u8]) -> String {
        let before = self.counters();
        self.inject(frame);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let after = self.counters();
            let d: Vec<u64> = (0..6).map(|i| after[i] - before[i]).collect();
            if d[..5].iter().sum::<u64>() > 0 {
                let v = ["new", "est", "rel", "inv", "untracked"]
                    .iter()
                    .zip(&d)
                    .filter(|(_, n)| **n > 0)
                    .map(|(s, _)| *s)
                    .collect::<Vec<_>>()
                    .join("|");
                return if d[5] > 0 { format!("{v}+rpl") } else { v };
            }
            if Instant::now() > deadline {
                return "lost".into();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The TCP state of the connection with this original source port, or "-".
    fn tcp_state(&self, v6: bool, sport: u16) -> String {
        let out = self.nsx(&["conntrack", "-L", "-o", "extended"]);
        let fam = if v6 { "ipv6" } else { "ipv4" };
        for l in out.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.first() != Some(&fam) || w.get(2) != Some(&"tcp") {
                continue;
            }
            let first_sport = w.iter().find(|x| x.starts_with("sport="));
            if first_sport == Some(&format!("sport={sport}").as_str()) {
                return w.get(5).unwrap_or(&"?").to_string();
            }
        }
        "-".into()
    }

    fn flush(&self) {
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns, "conntrack", "-F"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Tears the namespace down if the setup fails half-way.
struct Cleanup(String, String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        sh_ok(&["ip", "link", "del", &self.1]);
        sh_ok(&["ip", "netns", "del", &self.0]);
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.injector.kill();
        let _ = self.injector.wait();
        sh_ok(&["ip", "link", "del", &self.host_if]);
        sh_ok(&["ip", "netns", "del", &self.ns]);
    }
}

fn ours_verdict(r: &ferrovs_conntrack::CtResult) -> String {
    let s = r.state;
    let v = if s.has(CtState::INV) {
        "inv"
    } else if s.has(CtState::REL) {
        "rel"
    } else if s.has(CtState::EST) {
        "est"
    } else if s.has(CtState::NEW) {
        "new"
    } else {
        "?"
    };
    if s.has(CtState::RPL) {
        format!("{v}+rpl")
    } else {
        v.to_string()
    }
}

const A4: [u8; 4] = [10, 0, 0, 1];
const B4: [u8; 4] = [10, 0, 0, 2];
const R4: [u8; 4] = [10, 0, 0, 254];

/// A packet of a case: the frame, and for TCP the original source port to read states by.
struct Pkt {
    frame: Frame,
}

struct Case {
    name: &'static str,
    pkts: Vec<Pkt>,
    /// (packet index, reason): packets where our verdict or state deliberately differs.
    expected_diffs: Vec<(usize, &'static str)>,
}

/// TCP between A:sport and B:80 (`a`: from A).
fn t(a: bool, sport: u16, seq: u32, ack: u32, flags: u8) -> Pkt {
    let p = if a {
        Proto::tcp(sport, 80, seq, ack, flags)
    } else {
        Proto::tcp(80, sport, seq, ack, flags)
    };
    let (s, d) = if a { (A4, B4) } else { (B4, A4) };
    Pkt {
        frame: Frame::v4(s, d, p),
    }
}

fn td(a: bool, sport: u16, seq: u32, ack: u32, n: usize) -> Pkt {
    let mut p = t(a, sport, seq, ack, TCP_ACK | TCP_PSH);
    p.frame.proto = p.frame.proto.data(n);
    p
}

fn t6(a: bool, sport: u16, seq: u32, ack: u32, flags: u8) -> Pkt {
    let p = if a {
        Proto::tcp(sport, 80, seq, ack, flags)
    } else {
        Proto::tcp(80, sport, seq, ack, flags)
    };
    let (s, d) = if a { (1, 2) } else { (2, 1) };
    Pkt {
        frame: Frame::v6(s, d, p),
    }
}

/// SYN, SYN-ACK, ACK with ISNs 1000 (A) and 5000 (B).
fn handshake(sport: u16) -> Vec<Pkt> {
    vec![
        t(true, sport, 1000, 0, TCP_SYN),
        t(false, sport, 5000, 1001, TCP_SYN | TCP_ACK),
        t(true, sport, 1001, 5001, TCP_ACK),
    ]
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let mut case = |name, pkts, expected_diffs| {
        v.push(Case {
            name,
            pkts,
            expected_diffs,
        })
    };
    let mut p = handshake(41001);
    p.push(td(true, 41001, 1001, 5001, 100));
    p.push(t(false, 41001, 5001, 1101, TCP_ACK));
    p.push(td(false, 41001, 5001, 1101, 50));
    p.push(t(true, 41001, 1101, 5051, TCP_ACK));
    case("tcp 3-way handshake and data", p, vec![]);

    case(
        "tcp simultaneous open",
        vec![
            t(true, 41002, 1000, 0, TCP_SYN),
            t(false, 41002, 5000, 0, TCP_SYN),
            t(true, 41002, 1000, 5001, TCP_SYN | TCP_ACK),
            t(false, 41002, 5000, 1001, TCP_SYN | TCP_ACK),
            t(false, 41002, 5001, 1001, TCP_ACK),
            t(true, 41002, 1001, 5001, TCP_ACK),
        ],
        vec![],
    );

    let mut p = handshake(41003);
    p.push(t(false, 41003, 5001, 0, TCP_RST));
    p.push(t(true, 41003, 1001, 5001, TCP_ACK));
    case("tcp RST in window", p, vec![]);

    let mut p = handshake(41004);
    p.push(t(false, 41004, 90_000_000, 0, TCP_RST));
    p.push(t(false, 41004, 4000, 0, TCP_RST));
    p.push(t(true, 41004, 1001, 5001, TCP_ACK));
    p.push(t(false, 41004, 5001, 1001, TCP_RST | TCP_ACK));
    case("tcp RST out of window then in window", p, vec![]);

    let mut p = handshake(41005);
    p.push(t(true, 41005, 1001, 5001, TCP_FIN | TCP_ACK));
    p.push(t(false, 41005, 5001, 1002, TCP_ACK));
    p.push(t(false, 41005, 5001, 1002, TCP_FIN | TCP_ACK));
    p.push(t(true, 41005, 1002, 5002, TCP_ACK));
    p.push(t(true, 41005, 1002, 5002, TCP_ACK));
    case("tcp FIN close, client first", p, vec![]);

    let mut p = handshake(41006);
    p.push(t(false, 41006, 5001, 1001, TCP_FIN | TCP_ACK));
    p.push(t(true, 41006, 1001, 5002, TCP_ACK));
    p.push(t(true, 41006, 1001, 5002, TCP_FIN | TCP_ACK));
    p.push(t(false, 41006, 5002, 1002, TCP_ACK));
    case("tcp FIN close, server first", p, vec![]);

    let mut p = handshake(41007);
    p.push(t(true, 41007, 1001, 5001, TCP_FIN | TCP_ACK));
    p.push(t(false, 41007, 5001, 1001, TCP_FIN | TCP_ACK));
    p.push(t(true, 41007, 1002, 5002, TCP_ACK));
    p.push(t(false, 41007, 5002, 1002, TCP_ACK));
    case("tcp simultaneous close", p, vec![]);

    let mut p = handshake(41008);
    p.push(t(true, 41008, 1001, 5001, TCP_FIN | TCP_ACK));
    p.push(t(false, 41008, 5001, 1002, TCP_FIN | TCP_ACK));
    p.push(t(true, 41008, 1002, 5002, TCP_ACK));
    p.push(t(true, 41008, 9000, 0, TCP_SYN));
    p.push(t(false, 41008, 7000, 9001, TCP_SYN | TCP_ACK));
    case("tcp reopen from TIME_WAIT", p, vec![]);

    case(
        "tcp retransmissions",
        vec![
            t(true, 41009, 1000, 0, TCP_SYN),
            t(true, 41009, 1000, 0, TCP_SYN),
            t(false, 41009, 5000, 1001, TCP_SYN | TCP_ACK),
            t(false, 41009, 5000, 1001, TCP_SYN | TCP_ACK),
            t(true, 41009, 1001, 5001, TCP_ACK),
            td(true, 41009, 1001, 5001, 100),
            td(true, 41009, 1001, 5001, 100),
            t(false, 41009, 5001, 1101, TCP_ACK),
            td(true, 41009, 1001, 5001, 100),
            t(false, 41009, 5001, 1101, TCP_ACK),
        ],
        vec![],
    );

    let mut p = handshake(41010);
    p.push(td(true, 41010, 1001 + 70_000, 5001, 10));
    p.push(td(true, 41010, 1001 + 2_000_000_000, 5001, 10));
    p.push(t(false, 41010, 5001, 1001 + 500_000, TCP_ACK));
    p.push(t(false, 41010, 5001 + 3_000_000, 1001, TCP_ACK));
    p.push(td(true, 41010, 1001, 5001, 10));
    case("tcp out-of-window data and acks", p, vec![]);

    case(
        "tcp data before the handshake completes",
        vec![
            t(true, 41011, 1000, 0, TCP_SYN),
            td(true, 41011, 1001, 0, 20),
            t(false, 41011, 5000, 1001, TCP_SYN | TCP_ACK),
            td(true, 41011, 1001, 5001, 20),
            t(false, 41011, 5001, 1021, TCP_ACK),
        ],
        vec![],
    );

    case(
        "tcp no mid-stream pickup",
        vec![
            t(true, 41012, 1000, 5000, TCP_ACK),
            td(false, 41012, 5000, 1000, 10),
            t(true, 41012, 1000, 5000, TCP_FIN | TCP_ACK),
        ],
        vec![],
    );

    case(
        "tcp RST answering a SYN",
        vec![
            t(true, 41013, 1000, 0, TCP_SYN),
            t(false, 41013, 0, 1001, TCP_RST | TCP_ACK),
            t(true, 41013, 1000, 0, TCP_SYN),
        ],
        vec![],
    );

    case(
        "tcp bad flags",
        vec![
            t(true, 41014, 1000, 0, TCP_SYN | TCP_FIN),
            t(true, 41014, 1000, 0, TCP_SYN),
            t(false, 41014, 5000, 1001, TCP_SYN | TCP_RST),
            t(false, 41014, 5000, 1001, 0),
        ],
        vec![],
    );

    // Window scaling: both SYNs offer it; then data beyond 65535 but within the scaled window.
    let ws = [1u8, 3, 3, 7];
    let mut syn = t(true, 41015, 1000, 0, TCP_SYN);
    syn.frame.proto = syn.frame.proto.options(&ws).window(1000);
    let mut synack = t(false, 41015, 5000, 1001, TCP_SYN | TCP_ACK);
    synack.frame.proto = synack.frame.proto.options(&ws).window(1000);
    let mut ack = t(true, 41015, 1001, 5001, TCP_ACK);
    ack.frame.proto = ack.frame.proto.window(1000);
    // B's ACK advertises 1000 << 7 = 128000 bytes.
    let mut back = t(false, 41015, 5001, 1001, TCP_ACK);
    back.frame.proto = back.frame.proto.window(1000);
    let mut big = td(true, 41015, 1001 + 100_000, 5001, 1000);
    big.frame.proto = big.frame.proto.window(1000);
    let mut too_big = td(true, 41015, 1001 + 400_000, 5001, 1000);
    too_big.frame.proto = too_big.frame.proto.window(1000);
    case(
        "tcp window scaling",
        vec![syn, synack, ack, back, big, too_big],
        vec![],
    );

    let mut p = handshake(41017);
    p.push(t(true, 41017, 3000, 0, TCP_SYN));
    p.push(t(false, 41017, 5001, 1001, TCP_ACK));
    p.push(td(true, 41017, 1001, 5001, 10));
    case("tcp SYN on an established connection", p, vec![]);

    let mut p = handshake(41018);
    p.push(td(true, 41018, 1001, 5001, 100));
    p.push(t(false, 41018, 5001, 1101, TCP_ACK));
    // A RST below what the peer has acknowledged, then one at it.
    p.push(t(true, 41018, 1050, 0, TCP_RST));
    p.push(t(true, 41018, 1101, 0, TCP_RST));
    p.push(td(true, 41018, 1101, 5001, 10));
    case("tcp RST below the acknowledged sequence", p, vec![]);

    let mut p = handshake(41019);
    p.push(t(true, 41019, 1001, 5001, TCP_FIN | TCP_ACK));
    p.push(t(true, 41019, 1001, 5001, TCP_FIN | TCP_ACK));
    p.push(t(false, 41019, 5001, 1002, TCP_ACK));
    p.push(td(false, 41019, 5001, 1002, 30));
    p.push(t(true, 41019, 1002, 5031, TCP_ACK));
    p.push(t(false, 41019, 5031, 1002, TCP_FIN | TCP_ACK));
    p.push(t(true, 41019, 1002, 5032, TCP_ACK));
    case(
        "tcp half close with data and a retransmitted FIN",
        p,
        vec![],
    );

    // SACK: both SYNs permit it; B's ACKs carry SACK blocks, one within what A sent,
    // one beyond it.
    let sack_perm = [4u8, 2, 1, 1];
    let mut syn = t(true, 41020, 1000, 0, TCP_SYN);
    syn.frame.proto = syn.frame.proto.options(&sack_perm);
    let mut synack = t(false, 41020, 5000, 1001, TCP_SYN | TCP_ACK);
    synack.frame.proto = synack.frame.proto.options(&sack_perm);
    let sack_ack = |right: u32| {
        let mut p = t(false, 41020, 5001, 1001, TCP_ACK);
        let mut o = vec![1u8, 1, 5, 10];
        o.extend_from_slice(&1101u32.to_be_bytes());
        o.extend_from_slice(&right.to_be_bytes());
        p.frame.proto = p.frame.proto.options(&o);
        p
    };
    case(
        "tcp SACK blocks",
        vec![
            syn,
            synack,
            t(true, 41020, 1001, 5001, TCP_ACK),
            td(true, 41020, 1001, 5001, 100),
            td(true, 41020, 1101, 5001, 100),
            sack_ack(1201),
            sack_ack(90_000),
            td(true, 41020, 1201, 5001, 10),
        ],
        vec![],
    );

    // A zero window from B, then a one-byte window probe from A, then the window opens.
    let mut zero = t(false, 41021, 5001, 1001, TCP_ACK);
    zero.frame.proto = zero.frame.proto.window(0);
    let mut p = handshake(41021);
    p.push(zero);
    p.push(td(true, 41021, 1001, 5001, 1));
    p.push(td(true, 41021, 1001, 5001, 1400));
    p.push(t(false, 41021, 5001, 1002, TCP_ACK));
    p.push(td(true, 41021, 1002, 5001, 100));
    case("tcp zero window and probe", p, vec![]);

    // The client aborts: RST from the original direction in SYN_SENT and after the handshake.
    case(
        "tcp client aborts in SYN_SENT",
        vec![
            t(true, 41022, 1000, 0, TCP_SYN),
            t(true, 41022, 1001, 0, TCP_RST),
            t(true, 41022, 1001, 0, TCP_SYN),
        ],
        vec![],
    );

    // An ICMP error about a packet of the reply direction (B's SYN-ACK) comes to B.
    let mut p = handshake(41023);
    let synack = t(false, 41023, 5000, 1001, TCP_SYN | TCP_ACK);
    p.push(Pkt {
        frame: Frame::v4(R4, B4, Proto::icmp_error(11, 0, &synack.frame)),
    });
    case(
        "icmp time exceeded related to tcp, original direction",
        p,
        vec![],
    );

    let u = |a: bool, sp: u16| Pkt {
        frame: if a {
            Frame::v4(A4, B4, Proto::udp(sp, 53, b"query"))
        } else {
            Frame::v4(B4, A4, Proto::udp(53, sp, b"answer"))
        },
    };
    case(
        "udp one way",
        vec![u(true, 42001), u(true, 42001), u(true, 42001)],
        vec![],
    );
    case(
        "udp replied",
        vec![
            u(true, 42002),
            u(false, 42002),
            u(true, 42002),
            u(false, 42002),
        ],
        vec![],
    );

    let e = |a: bool, request: bool, id: u16| Pkt {
        frame: if a {
            Frame::v4(A4, B4, Proto::echo(request, id, 1))
        } else {
            Frame::v4(B4, A4, Proto::echo(request, id, 1))
        },
    };
    case(
        "icmp echo",
        vec![
            e(true, true, 7),
            e(false, false, 7),
            e(true, true, 7),
            e(false, false, 7),
        ],
        vec![],
    );
    case(
        "icmp echo reply without request",
        vec![e(false, false, 8)],
        vec![],
    );

    let q = Frame::v4(A4, B4, Proto::udp(42003, 53, b"query"));
    case(
        "icmp port unreachable related to udp",
        vec![
            Pkt { frame: q.clone() },
            Pkt {
                frame: Frame::v4(B4, A4, Proto::icmp_error(3, 3, &q)),
            },
            Pkt {
                frame: Frame::v4(
                    B4,
                    A4,
                    Proto::icmp_error(3, 3, &Frame::v4(A4, B4, Proto::udp(42999, 53, b"query"))),
                ),
            },
        ],
        vec![],
    );
    let syn = t(true, 41016, 1000, 0, TCP_SYN);
    let unreach = Frame::v4(R4, A4, Proto::icmp_error(3, 1, &syn.frame));
    case(
        "icmp host unreachable related to tcp",
        vec![syn, Pkt { frame: unreach }],
        vec![],
    );

    case(
        "ipv6 tcp handshake and close",
        vec![
            t6(true, 43001, 1000, 0, TCP_SYN),
            t6(false, 43001, 5000, 1001, TCP_SYN | TCP_ACK),
            t6(true, 43001, 1001, 5001, TCP_ACK),
            t6(true, 43001, 1001, 5001, TCP_FIN | TCP_ACK),
            t6(false, 43001, 5001, 1002, TCP_FIN | TCP_ACK),
            t6(true, 43001, 1002, 5002, TCP_ACK),
        ],
        vec![],
    );
    let q6 = Frame::v6(1, 2, Proto::udp(43002, 53, b"query"));
    case(
        "icmpv6 port unreachable related to udp",
        vec![
            Pkt { frame: q6.clone() },
            Pkt {
                frame: Frame::v6(2, 1, Proto::icmp_error(1, 4, &q6)),
            },
            Pkt {
                frame: Frame::v6(2, 1, Proto::udp(53, 43002, b"answer")),
            },
        ],
        vec![],
    );
    case(
        "ipv6 icmp echo",
        vec![
            Pkt {
                frame: Frame::v6(1, 2, Proto::echo(true, 9, 1)),
            },
            Pkt {
                frame: Frame::v6(2, 1, Proto::echo(false, 9, 1)),
            },
        ],
        vec![],
    );
    v
}

const NAT_RULES: &str = r#"
table ip fvnat {
    chain post {
        type nat hook postrouting priority 100; policy accept;
        oifname "o" meta l4proto { tcp, udp } snat to 198.51.100.1:5000
    }
}
"#;

/// Prints every frame arriving on an interface as a hex line.
const CAPTURE: &str = r#"
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
print("ready", flush=True)
while True:
    print(s.recv(65535).hex(), flush=True)
"#;

/// (src, dst, sport, dport) of an IPv4 frame.
type Addrs4 = ([u8; 4], [u8; 4], u16, u16);

/// The addresses and ports, and the L4 bytes, of an IPv4 TCP/UDP frame.
fn v4_l4(frame: &[u8]) -> Option<(Addrs4, Vec<u8>)> {
    let p = tuple::parse(frame, false).ok()?.tuple;
    if p.family != tuple::Family::V4 || !matches!(p.proto, 6 | 17) {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let mut s = [0u8; 4];
    let mut d = [0u8; 4];
    s.copy_from_slice(&p.src[..4]);
    d.copy_from_slice(&p.dst[..4]);
    Some(((s, d, p.sport, p.dport), ip.get(ihl..total)?.to_vec()))
}

/// SNAT against nftables' `snat to 198.51.100.1:5000` (one address, one port, so the
/// translation is the same whoever chooses): the kernel's forwarded frame, captured on the
/// way out, and ours must carry the same addresses, ports and L4 bytes (checksum included);
/// a second connection needing the same port is dropped by the kernel and refused by us.
fn snat_cases(k: &mut Kernel, disagreements: &mut Vec<String>) {
    use ferrovs_conntrack::{Commit, Nat, NatError, NatKind, NatRange};
    use std::sync::mpsc;
    k.flush();
    let rules = std::env::temp_dir().join(format!("fvnat-{}.nft", std::process::id()));
    std::fs::write(&rules, NAT_RULES).unwrap();
    k.nsx(&["nft", "-f", rules.to_str().unwrap()]);
    let _ = std::fs::remove_file(&rules);
    let mut cap = Command::new("ip")
        .args(["netns", "exec", &k.ns, "python3", "-c", CAPTURE, "o2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = BufReader::new(cap.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "capture");
    let (txc, rxc) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { break };
            let b: Vec<u8> = (0..l.len() / 2)
                .filter_map(|i| u8::from_str_radix(l.get(2 * i..2 * i + 2)?, 16).ok())
                .collect();
            if txc.send(b).is_err() {
                break;
            }
        }
    });
    let ours = Tracker::new(Config::default());
    let nat = Nat::Bind(
        NatRange::addr(NatKind::Src, std::net::IpAddr::from([198, 51, 100, 1]))
            .with_ports(5000, 5000),
    );
    let pkts = [
        ("tcp syn", t(true, 41000, 1000, 0, TCP_SYN).frame, true),
        (
            "tcp syn, port taken",
            t(true, 41001, 1000, 0, TCP_SYN).frame,
            false,
        ),
        (
            "tcp retransmitted syn",
            t(true, 41000, 1000, 0, TCP_SYN).frame,
            true,
        ),
        (
            "udp",
            Frame::v4(A4, R4, Proto::udp(41002, 53, b"query")),
            true,
        ),
    ];
    for (name, f, translated) in pkts {
        let mut frame = f.macs(k.mac, [0x02, 0, 0, 0, 0, 0x99]).bytes();
        while rxc.try_recv().is_ok() {}
        k.inject(&frame);
        let want = v4_l4(&frame).map(|(t, _)| (t.1, t.3));
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut kernel = None;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(b) = rxc.recv_timeout(left) else { break };
            // The frame going to the same destination address and port.
            if let Some((t, l4)) = v4_l4(&b) {
                if Some((t.1, t.3)) == want {
                    kernel = Some((t, l4));
                    break;
                }
            }
        }
        let r = ours.execute_nat(&mut frame, 0, &Commit::COMMIT, &nat, 1);
        let mine = if r.nat_error.is_some() {
            None
        } else {
            v4_l4(&frame)
        };
        eprintln!(
            "  snat {name}: kernel {:?} ours {:?} ({})",
            kernel.as_ref().map(|x| x.0),
            mine.as_ref().map(|x| x.0),
            r.state
        );
        if kernel != mine || kernel.is_some() != translated {
            disagreements.push(format!(
                "snat {name}: kernel {:?}, ours {:?}",
                kernel.map(|x| x.0),
                mine.map(|x| x.0)
            ));
        }
        if !translated && r.nat_error != Some(NatError::Exhausted) {
            disagreements.push(format!("snat {name}: ours {:?}", r.nat_error));
        }
    }
    let _ = cap.kill();
    let _ = cap.wait();
}

fn tcp_sport(f: &Frame) -> Option<(bool, u16)> {
    match &f.proto {
        Proto::Tcp { sport, dport, .. } => Some((
            f.family == tuple::Family::V6,
            if *dport == 80 { *sport } else { *dport },
        )),
        _ => None,
    }
}

#[test]
fn kernel_conntrack_agrees() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let tools = ["ip", "nft", "conntrack", "python3"];
    let missing: Vec<_> = tools.iter().filter(|t| !have(t)).collect();
    if !root || !missing.is_empty() {
        let what = format!("root ({root}) and tools (missing: {missing:?})");
        if in_ci() {
            panic!("required for the conntrack differential test but missing: {what}");
        }
        eprintln!("SKIP: conntrack differential test needs {what}");
        return;
    }
    let mut k = Kernel::setup();
    let start = Instant::now();
    let mut disagreements = Vec::new();
    let mut agreed = 0usize;
    let mut total = 0usize;
    for case in cases() {
        k.flush();
        let ours = Tracker::new(Config::default());
        eprintln!("case: {}", case.name);
        for (i, p) in case.pkts.iter().enumerate() {
            let frame = p
                .frame
                .clone()
                .macs(k.mac, [0x02, 0, 0, 0, 0, 0x99])
                .bytes();
            let kv = k.send(&frame);
            let now = start.elapsed().as_millis() as u64;
            let r = ours.execute(&frame, 0, true, now);
            let ov = ours_verdict(&r);
            let (ks, os) = match tcp_sport(&p.frame) {
                Some((v6, sport)) => {
                    let ks = k.tcp_state(v6, sport);
                    let parsed = tuple::parse(&frame, true).unwrap().tuple;
                    let os = ours
                        .lookup(0, &parsed, now)
                        .and_then(|(_, s)| s)
                        .map_or("-".to_string(), |s| s.name().to_string());
                    (ks, os)
                }
                None => (String::new(), String::new()),
            };
            total += 1;
            let same = kv == ov && ks == os;
            eprintln!(
                "  #{i}: kernel {kv:<8} {ks:<12} ours {ov:<8} {os:<12} {}",
                if same { "" } else { "DIFFERENT" }
            );
            let expected = case.expected_diffs.iter().find(|(j, _)| *j == i);
            match (same, expected) {
                (true, None) => agreed += 1,
                (true, Some((_, why))) => disagreements.push(format!(
                    "{} #{i}: expected a difference ({why}) but both say {kv} {ks}",
                    case.name
                )),
                (false, Some((_, why))) => eprintln!("    expected difference: {why}"),
                (false, None) => disagreements.push(format!(
                    "{} #{i}: kernel {kv} {ks}, ours {ov} {os}",
                    case.name
                )),
            }
        }
    }
    eprintln!("{agreed}/{total} packets agree");
    snat_cases(&mut k, &mut disagreements);
    assert!(
        disagreements.is_empty(),
        "disagreements with the kernel:\n{}",
        disagreements.join("\n")
    );
}
