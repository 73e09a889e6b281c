//! `ferrovs capture` end to end: two TAP ports in two namespaces, pings through the switch,
//! captured as pcapng and read back by tcpdump (and by our pcapng reader for the per-packet
//! direction, which tcpdump does not print); a filter, snaplen, --count, a bad filter, an
//! unknown port, a client that stops reading, a deleted port, and a hot upgrade.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrovs_e2e::*;
use ferrovs_proto::capture::{pcapng, CaptureEvent};

struct Switch {
    dir: PathBuf,
    _sw: Proc,
    _net: Net,
    ns1: String,
    ns2: String,
}

/// A switch with bridge br0 and TAP ports p1 (10.9.8.1 in ns1) and p2 (10.9.8.2 in ns2);
/// `None` (skipped) without root, ping, tcpdump or TUN outside CI.
fn switch(tag: &str) -> Option<Switch> {
    if !require(
        is_root() && have("ip") && have("ping") && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping and /dev/net/tun (network namespaces, TAP)",
    ) || !require(have("tcpdump"), "tcpdump")
    {
        return None;
    }
    let dir = run_dir(tag);
    let (pmd, _) = cores();
    let sw = start_bare_switch(&dir, pmd, &["br0"]);
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("cns1-"), Net::name("cns2-"));
    let (t1, t2) = (Net::name("ct1"), Net::name("ct2"));
    net.netns(&ns1);
    net.netns(&ns2);
    net.tap_port(&dir, "br0", "p1", &t1, &ns1, "10.9.8.1/24");
    net.tap_port(&dir, "br0", "p2", &t2, &ns2, "10.9.8.2/24");
    Net::no_ipv6(&ns1, &t1);
    Net::no_ipv6(&ns2, &t2);
    // Warm up (ARP, MAC learning).
    assert_eq!(ping(&ns1, "10.9.8.2", 1), 1);
    Some(Switch {
        dir,
        _sw: sw,
        _net: net,
        ns1,
        ns2,
    })
}

/// Starts `ferrovs capture ARGS` (stdout to `stdout`); returns once the daemon answered.
fn start_capture(
    dir: &Path,
    args: &[&str],
    stdout: Stdio,
) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut c = Command::new(bin("ferrovs"))
        .arg("--run-dir")
        .arg(dir)
        .arg("capture")
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("capturing on"), "{line}");
    (c, err)
}

/// Waits for the capture to exit (at most `secs`): its status and the rest of its stderr.
fn finish(
    mut c: Child,
    mut err: BufReader<std::process::ChildStderr>,
    secs: u64,
) -> (bool, String) {
    let t = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = c.kill();
            panic!("the capture did not end within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut s = String::new();
    err.read_to_string(&mut s).unwrap();
    (st.success(), s)
}

fn tcpdump(file: &Path) -> Vec<String> {
    let o = Command::new("tcpdump")
        .arg("-nr")
        .arg(file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn pings_are_captured_with_their_direction_filtered_and_counted() {
    let Some(s) = switch("capture") else { return };
    let file = s.dir.join("p1.pcapng");
    let f = file.display().to_string();
    // An ICMP filter: ARP and anything else stays out; 3 pings are 6 packets.
    let (c, err) = start_capture(
        &s.dir,
        &["p1", "--count", "6", "-w", &f, "icmp"],
        Stdio::null(),
    );
    assert_eq!(ping(&s.ns1, "10.9.8.2", 4), 4);
    let (ok, msg) = finish(c, err, 10);
    assert!(ok, "{msg}");
    assert!(
        msg.contains("ended: the capture took the packets --count asked for"),
        "{msg}"
    );
    assert!(msg.contains("6 packets captured"), "{msg}");
    let lines = tcpdump(&file);
    assert_eq!(lines.len(), 6, "{lines:?}");
    for (i, l) in lines.iter().enumerate() {
        let want = if i % 2 == 0 {
            "10.9.8.1 > 10.9.8.2: ICMP echo request"
        } else {
            "10.9.8.2 > 10.9.8.1: ICMP echo reply"
        };
        assert!(l.contains(want), "{l}");
    }
    // The direction, per packet: requests came in from p1, replies went out to it.
    let pf = pcapng::read(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(pf.interfaces, vec!["p1".to_string()]);
    for (i, p) in pf.packets.iter().enumerate() {
        let want = if i % 2 == 0 {
            pcapng::INBOUND
        } else {
            pcapng::OUTBOUND
        };
        assert_eq!(p.flags, Some(want), "packet {i}");
        assert_eq!((p.iface, p.data.len(), p.orig_len), (0, 98, 98));
    }

    // --direction in on p2 (what ns2 sends: the replies), cut to 38 bytes, into tcpdump
    // through a pipe.
    let (c, err) = start_capture(
        &s.dir,
        &[
            "p2",
            "--direction",
            "in",
            "--snaplen",
            "38",
            "-c",
            "2",
            "-w",
            "-",
            "icmp",
        ],
        Stdio::piped(),
    );
    let mut c = c;
    let td = Command::new("tcpdump")
        .args(["-nr", "-"])
        .stdin(c.stdout.take().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(ping(&s.ns1, "10.9.8.2", 2), 2);
    let (ok, msg) = finish(c, err, 10);
    assert!(ok, "{msg}");
    let o = td.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "{text} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for l in lines {
        assert!(l.contains("10.9.8.2 > 10.9.8.1: "), "{l}");
        assert!(l.contains("[|icmp]"), "truncated: {l}");
    }
}

#[test]
fn bad_requests_get_precise_errors() {
    let Some(s) = switch("capture-bad") else {
        return;
    };
    let run = |args: &[&str]| {
        let mut a = vec!["capture"];
        a.extend_from_slice(args);
        let o = cli(&s.dir, &a);
        assert!(!o.status.success(), "{args:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = run(&["p1", "-w", "/dev/null", "tcp", "prot", "80"]);
    assert!(
        e.contains("bad filter \"tcp prot 80\"") && e.contains("syntax error"),
        "{e}"
    );
    let e = run(&["nope", "-w", "/dev/null"]);
    assert!(e.contains("no port \"nope\""), "{e}");
    let e = run(&["p1", "--snaplen", "0", "-w", "/dev/null"]);
    assert!(e.contains("snaplen 0 out of range"), "{e}");
    let e = run(&["p1", "--direction", "sideways", "-w", "/dev/null"]);
    assert!(e.contains("not a direction"), "{e}");
    // One capture per port at a time.
    let (c, err) = start_capture(&s.dir, &["p1", "-w", "/dev/null"], Stdio::null());
    let e = run(&["p1", "-w", "/dev/null"]);
    assert!(e.contains("already being captured"), "{e}");
    // The client goes away (Ctrl-C; killed here, as SIGINT is ignored by processes a
    // non-interactive shell starts in the background, as CI may): the port takes a new
    // capture at once after the tick.
    let mut c = c;
    c.kill().unwrap();
    let _ = finish(c, err, 5);
    wait_until("the port free again", 5, || {
        let mut ch = Command::new(bin("ferrovs"))
            .arg("--run-dir")
            .arg(&s.dir)
            .args(["capture", "p1", "-c", "1", "-w", "/dev/null", "icmp"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut l = String::new();
        BufReader::new(ch.stderr.take().unwrap())
            .read_line(&mut l)
            .unwrap();
        let ok = l.contains("capturing on");
        let _ = ch.kill();
        let _ = ch.wait();
        ok
    });
    assert!(cli(&s.dir, &["show"]).status.success());
}

/// A client that asks for a capture and never reads: the daemon answers others at once,
/// the pings go through, records past the client's buffer are dropped and counted; when
/// the port is deleted the client gets the end line with those counts.
#[test]
fn a_client_that_stops_reading_stalls_nothing() {
    let Some(s) = switch("capture-slow") else {
        return;
    };
    let mut c = UnixStream::connect(s.dir.join("ferrovs.ctl")).unwrap();
    c.write_all(b"{\"cmd\":\"capture\",\"port\":\"p1\"}\n")
        .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":true"), "{line}");
    // 3000 big pings, as fast as they come back: far more than the client's buffer. The
    // PMD does not wait for the capture: they all come back (a flood ping on a busy host
    // may lose one or two to its own timeout).
    let o = Net::exec(
        &s.ns1,
        &[
            "ping", "-f", "-c", "3000", "-s", "1400", "-W", "1", "10.9.8.2",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let sumline = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or("");
    let received: u64 = sumline
        .split(", ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(received >= 2990, "{out}");
    let t = Instant::now();
    assert!(cli(&s.dir, &["show"]).status.success());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "show took {:?}",
        t.elapsed()
    );
    // The port goes: the capture ends; the client reads everything, then the end line.
    assert!(cli(&s.dir, &["del-port", "br0", "p1"]).status.success());
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut packets, mut end) = (0u64, None);
    for l in r.lines() {
        match serde_json::from_str::<CaptureEvent>(&l.unwrap()).unwrap() {
            CaptureEvent::Packet(_) => packets += 1,
            CaptureEvent::End(e) => {
                end = Some(e);
                break;
            }
        }
    }
    let e = end.expect("an end line");
    eprintln!("slow client: {packets} packets read, end {e:?}");
    assert_eq!(e.reason, "port-deleted");
    assert_eq!(e.captured, packets);
    assert!(e.client_drops > 0, "{e:?}");
}

/// A hot upgrade ends a running capture cleanly (exit 0, a clear line); the new daemon
/// captures again.
#[test]
fn a_hot_upgrade_ends_the_capture_cleanly() {
    let Some(s) = switch("capture-upgrade") else {
        return;
    };
    let _stop = StopCurrent(s.dir.clone());
    let file = s.dir.join("up.pcapng");
    let f = file.display().to_string();
    let (c, err) = start_capture(&s.dir, &["p1", "-w", &f, "icmp"], Stdio::null());
    assert_eq!(ping(&s.ns1, "10.9.8.2", 2), 2);
    let r = upgrade(&s.dir, &[]).expect("upgrade");
    let (ok, msg) = finish(c, err, 10);
    assert!(ok, "{msg}");
    assert!(msg.contains("ended: the daemon was hot-upgraded"), "{msg}");
    assert_eq!(tcpdump(&file).len(), 4, "the packets before the upgrade");
    assert_eq!(r["new_pid"].as_u64(), Some(daemon_pid(&s.dir)));
    // Against the new daemon.
    let file = s.dir.join("after.pcapng");
    let f = file.display().to_string();
    let (c, err) = start_capture(&s.dir, &["p2", "-c", "2", "-w", &f, "icmp"], Stdio::null());
    assert_eq!(ping(&s.ns2, "10.9.8.1", 1), 1);
    let (ok, msg) = finish(c, err, 10);
    assert!(ok, "{msg}");
    assert_eq!(tcpdump(&file).len(), 2);
}

/// A vhost-user port (a VM's, invisible to tcpdump on the host): ferrovs-gen sends through
/// vm1 to vm2; captures on both ports see the frames, `in` on vm1 and `out` on vm2.
#[test]
fn a_vhost_user_port_is_captured() {
    let dir = run_dir("capture-vhost");
    let (pmd, gen) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    if !require(have("tcpdump"), "tcpdump") {
        return;
    }
    let (f1, f2) = (dir.join("vm1.pcapng"), dir.join("vm2.pcapng"));
    let (a1, a2) = (f1.display().to_string(), f2.display().to_string());
    // The sink announces its MAC with a 64-byte broadcast, which floods out of vm1: the
    // filter keeps the generator's 128-byte frames only (libpcap's `greater`: length >=).
    let (c1, e1) = start_capture(
        &dir,
        &["vm1", "-c", "5", "-w", &a1, "udp", "and", "greater", "128"],
        Stdio::null(),
    );
    let (c2, e2) = start_capture(
        &dir,
        &[
            "vm2",
            "--direction",
            "out",
            "-c",
            "5",
            "-w",
            &a2,
            "greater",
            "128",
        ],
        Stdio::null(),
    );
    let vm1 = dir.join("vm1.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let o = Command::new("taskset")
        .args(["-c", &gen.to_string()])
        .arg(bin("ferrovs-gen"))
        .args([
            "--socket",
            &vm1,
            "--sink",
            &vm2,
            "--quiet",
            "--duration",
            "5",
        ])
        .args([
            "--count", "200", "--rate", "1000", "--size", "128", "txonly",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (c, e, f, flag) in [
        (c1, e1, &f1, pcapng::INBOUND),
        (c2, e2, &f2, pcapng::OUTBOUND),
    ] {
        let (ok, msg) = finish(c, e, 10);
        assert!(ok && msg.contains("5 packets captured"), "{msg}");
        let lines = tcpdump(f);
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(
            lines.iter().all(|l| l.contains(" UDP, length ")),
            "{lines:?}"
        );
        let pf = pcapng::read(&std::fs::read(f).unwrap()).unwrap();
        assert!(pf
            .packets
            .iter()
            .all(|p| p.flags == Some(flag) && p.orig_len == 128));
    }
}
