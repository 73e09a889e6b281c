//! OpenFlow controllers, as ovs-vswitchd connects to them: a small controller endpoint in
//! the test (it speaks HELLO, FEATURES, ECHO and ROLE on the wire) that ferrovsd and a real
//! OVS netdev bridge (Debian's ovs-vswitchd, `ovs-vsctl set-controller`) both connect to;
//! the same role sequence gets the same answers from both. Then reconnects after the
//! controller restarts (with backoff), inactivity probes, fail-mode standalone and secure
//! forwarding pings between two namespaces, and hostile controllers that change nothing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ferrovs_e2e::*;

const HELLO: u8 = 0;
const ERROR: u8 = 1;
const ECHO_REQUEST: u8 = 2;
const ECHO_REPLY: u8 = 3;
const FEATURES_REQUEST: u8 = 5;
const FEATURES_REPLY: u8 = 6;
const FLOW_MOD: u8 = 14;
const ROLE_REQUEST: u8 = 24;
const ROLE_REPLY: u8 = 25;
const PORT_STATUS: u8 = 12;

trait Stream: Read + Write + Send {}
impl Stream for TcpStream {}
impl Stream for UnixStream {}

/// One accepted switch connection, seen from the controller.
struct Switch {
    s: Box<dyn Stream>,
    /// ECHO_REQUESTs the switch sent (answered unless `mute`).
    echoes: u32,
    mute: bool,
}

fn header(ty: u8, len: usize, xid: u32) -> Vec<u8> {
    let mut h = vec![4, ty];
    h.extend_from_slice(&(len as u16).to_be_bytes());
    h.extend_from_slice(&xid.to_be_bytes());
    h
}

fn role_request(role: u32, gen: u64, xid: u32) -> Vec<u8> {
    let mut m = header(ROLE_REQUEST, 24, xid);
    m.extend_from_slice(&role.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(&gen.to_be_bytes());
    m
}

/// FLOW_MOD add `priority=PRIO actions=drop` (an empty OXM match, no instructions).
fn flow_mod_drop(prio: u16, xid: u32) -> Vec<u8> {
    let mut m = header(FLOW_MOD, 56, xid);
    m.extend_from_slice(&[0; 16]); // cookie, cookie_mask
    m.extend_from_slice(&[0, 0]); // table 0, ADD
    m.extend_from_slice(&[0; 4]); // timeouts
    m.extend_from_slice(&prio.to_be_bytes());
    m.extend_from_slice(&u32::MAX.to_be_bytes()); // buffer_id
    m.extend_from_slice(&u32::MAX.to_be_bytes()); // out_port
    m.extend_from_slice(&u32::MAX.to_be_bytes()); // out_group
    m.extend_from_slice(&[0; 4]); // flags, pad
    m.extend_from_slice(&[0, 1, 0, 4, 0, 0, 0, 0]); // OFPMT_OXM, length 4, padded
    m
}

impl Switch {
    fn new(s: Box<dyn Stream>) -> Switch {
        Switch {
            s,
            echoes: 0,
            mute: false,
        }
    }

    fn send(&mut self, m: &[u8]) {
        self.s.write_all(m).expect("send to the switch");
    }

    /// The next message (type, whole message); `None` when the switch closed.
    fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut h = [0u8; 8];
        self.s.read_exact(&mut h).ok()?;
        let len = u16::from_be_bytes([h[2], h[3]]) as usize;
        let mut m = h.to_vec();
        m.resize(len.max(8), 0);
        self.s.read_exact(&mut m[8..]).ok()?;
        if h[1] == ECHO_REQUEST {
            self.echoes += 1;
            if !self.mute {
                let mut r = m.clone();
                r[1] = ECHO_REPLY;
                self.send(&r);
            }
        }
        Some((h[1], m))
    }

    /// Waits for a message of type `ty` (others are skipped).
    fn expect(&mut self, ty: u8) -> Vec<u8> {
        loop {
            let (t, m) = self
                .recv()
                .unwrap_or_else(|| panic!("the switch closed while we waited for type {ty}"));
            if t == ty {
                return m;
            }
        }
    }

    /// HELLO both ways, then FEATURES: the datapath id.
    fn handshake(&mut self) -> u64 {
        let h = self.expect(HELLO);
        assert!(h[0] >= 4, "the switch offers OpenFlow 1.3");
        self.send(&header(HELLO, 8, 1));
        self.send(&header(FEATURES_REQUEST, 8, 2));
        let f = self.expect(FEATURES_REPLY);
        u64::from_be_bytes(f[8..16].try_into().unwrap())
    }

    /// A ROLE_REQUEST: `Ok((role, generation))` or `Err((type, code))`.
    fn role(&mut self, role: u32, gen: u64) -> Result<(u32, u64), (u16, u16)> {
        self.send(&role_request(role, gen, 77));
        loop {
            let (t, m) = self.recv().expect("the switch answers ROLE_REQUEST");
            match t {
                ROLE_REPLY => {
                    return Ok((
                        u32::from_be_bytes(m[8..12].try_into().unwrap()),
                        u64::from_be_bytes(m[16..24].try_into().unwrap()),
                    ))
                }
                ERROR => return Err(error_of(&m)),
                _ => {}
            }
        }
    }

    /// A FLOW_MOD followed by a BARRIER: the error it got, if any.
    fn flow_mod(&mut self, prio: u16) -> Option<(u16, u16)> {
        self.send(&flow_mod_drop(prio, 90));
        self.send(&header(20, 8, 91));
        loop {
            let (t, m) = self.recv().expect("the switch answers FLOW_MOD");
            match t {
                ERROR => return Some(error_of(&m)),
                21 => return None,
                _ => {}
            }
        }
    }
}

/// PORT_MOD (OpenFlow 1.3).
fn port_mod(port: u32, hw: [u8; 6], config: u32, mask: u32) -> Vec<u8> {
    let mut m = header(16, 40, 55);
    m.extend_from_slice(&port.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(&hw);
    m.extend_from_slice(&[0; 2]);
    m.extend_from_slice(&config.to_be_bytes());
    m.extend_from_slice(&mask.to_be_bytes());
    m.extend_from_slice(&[0; 8]);
    m
}

fn error_of(m: &[u8]) -> (u16, u16) {
    (
        u16::from_be_bytes([m[8], m[9]]),
        u16::from_be_bytes([m[10], m[11]]),
    )
}

/// The controller's listening socket (TCP on loopback, or a Unix socket).
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn tcp() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        Listener::Tcp(l)
    }

    fn tcp_at(port: u16) -> Listener {
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        l.set_nonblocking(true).unwrap();
        Listener::Tcp(l)
    }

    fn unix(path: &Path) -> Listener {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path).unwrap();
        l.set_nonblocking(true).unwrap();
        Listener::Unix(l)
    }

    fn port(&self) -> u16 {
        match self {
            Listener::Tcp(l) => l.local_addr().unwrap().port(),
            Listener::Unix(_) => 0,
        }
    }

    /// The next switch to connect, within `secs`.
    fn accept(&self, secs: u64) -> Switch {
        let t = Instant::now();
        loop {
            let s: Option<Box<dyn Stream>> = match self {
                Listener::Tcp(l) => l.accept().ok().map(|(s, _)| {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
                    Box::new(s) as Box<dyn Stream>
                }),
                Listener::Unix(l) => l.accept().ok().map(|(s, _)| {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
                    Box::new(s) as Box<dyn Stream>
                }),
            };
            if let Some(s) = s {
                return Switch::new(s);
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "no switch connected within {secs} s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn ovs_tools() -> bool {
    require(
        is_root()
            && have("ip")
            && Path::new("/usr/sbin/ovs-vswitchd").exists()
            && ovsdb::available(),
        "ovs-vswitchd, ovsdb-server and ovs-vsctl (Debian's openvswitch-switch)",
    )
}

/// Debian's ovs-vswitchd with a netdev bridge br0 in a namespace of its own, configured
/// through its own ovsdb-server in `dir`; killed on drop.
struct Ovs {
    _vswitchd: Proc,
    db: ovsdb::OvsdbServer,
    _net: Net,
}

fn start_ovs(dir: &Path) -> Ovs {
    let mut net = Net::new();
    let ns = Net::name("ctlo");
    net.netns(&ns);
    let db = ovsdb::OvsdbServer::start(dir);
    let d = dir.display().to_string();
    let args = [
        "netns".to_string(),
        "exec".to_string(),
        ns.clone(),
        "/usr/bin/env".to_string(),
        format!("OVS_RUNDIR={d}"),
        format!("OVS_LOGDIR={d}"),
        format!("OVS_DBDIR={d}"),
        "/usr/sbin/ovs-vswitchd".to_string(),
        db.remote(),
        "--enable-dummy".to_string(),
        format!("--unixctl={d}/ovs-vswitchd.ctl"),
        format!("--pidfile={d}/ovs-vswitchd.pid"),
        format!("--log-file={d}/ovs-vswitchd.log"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vswitchd = Proc::spawn("ovs-vswitchd", dir, Path::new("/usr/sbin/ip"), &args);
    db.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
        "other_config:datapath-id=00000000000000ab",
    ])
    .expect("add-br");
    Ovs {
        _vswitchd: vswitchd,
        db,
        _net: net,
    }
}

/// What a switch answers to the role sequence (two controllers A and B).
fn role_sequence(a: &mut Switch, b: &mut Switch) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |what: &str, r: String| out.push(format!("{what}: {r}"));
    note("A nochange", format!("{:?}", a.role(0, 0)));
    note("A master gen 5", format!("{:?}", a.role(2, 5)));
    note("B slave gen 4 (stale)", format!("{:?}", b.role(3, 4)));
    note("B master gen 6", format!("{:?}", b.role(2, 6)));
    // A was demoted: its flow-mod is refused as a slave's.
    note("A nochange after B", format!("{:?}", a.role(0, 0)));
    note("A flow-mod as slave", format!("{:?}", a.flow_mod(5)));
    note("B flow-mod as master", format!("{:?}", b.flow_mod(6)));
    note("A equal", format!("{:?}", a.role(1, 0)));
    note("A flow-mod as equal", format!("{:?}", a.flow_mod(7)));
    note("B bad role", format!("{:?}", b.role(9, 0)));
    out
}

#[test]
fn controllers_connect_as_to_ovs_roles_reconnect_backoff_and_probes() {
    if !ovs_tools() {
        return;
    }
    let dir = run_dir("controllers");
    let (pmd, _) = cores();
    let conf = dir.join("conf.json");
    std::fs::write(
        &conf,
        r#"{"version":1,"bridges":[{"name":"br0","ports":[]}],"pmd_cores":[0],"other":{}}"#,
    )
    .unwrap();
    let c = conf.display().to_string();
    let _sw = start_switch(&dir, pmd, &["--config", &c]);

    // Two controllers: one over TCP, one over a Unix socket.
    let tcp = Listener::tcp();
    let usock = dir.join("ctl-b.sock");
    let unix = Listener::unix(&usock);
    let targets = [
        format!("tcp:127.0.0.1:{}", tcp.port()),
        format!("unix:{}", usock.display()),
    ];
    let o = cli(&dir, &["set-bridge", "br0", "datapath-id=00000000000000ab"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut args = vec!["set-controller", "br0"];
    args.extend(targets.iter().map(String::as_str));
    let o = cli(&dir, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = cli(&dir, &["get-controller", "br0"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout)
            .lines()
            .collect::<Vec<_>>(),
        targets.to_vec()
    );
    let mut a = tcp.accept(10);
    let mut b = unix.accept(10);
    assert_eq!(a.handshake(), 0xab);
    assert_eq!(b.handshake(), 0xab);
    wait_until("show: both controllers connected", 10, || {
        let s = cli_json(&dir, &["show"]);
        let c = &s["bridges"][0]["openflow"]["controllers"];
        c[0]["connected"] == true && c[1]["connected"] == true
    });

    // The same role sequence against OVS (its controllers on Unix sockets: it runs in a
    // namespace of its own).
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs = start_ovs(&ovs_dir);
    let (oa_path, ob_path) = (ovs_dir.join("ctl-a.sock"), ovs_dir.join("ctl-b.sock"));
    let (oal, obl) = (Listener::unix(&oa_path), Listener::unix(&ob_path));
    ovs.db
        .vsctl(&[
            "set-controller",
            "br0",
            &format!("unix:{}", oa_path.display()),
            &format!("unix:{}", ob_path.display()),
        ])
        .expect("ovs-vsctl set-controller");
    let (mut oa, mut ob) = (oal.accept(20), obl.accept(20));
    assert_eq!(oa.handshake(), 0xab);
    assert_eq!(ob.handshake(), 0xab);
    let want = role_sequence(&mut oa, &mut ob);
    let got = role_sequence(&mut a, &mut b);
    assert_eq!(
        got, want,
        "ferrovs (left) and OVS (right) answer roles differently"
    );
    assert!(
        want.iter()
            .any(|l| l.starts_with("A flow-mod as slave") && l.contains("(1, 10)")),
        "{want:?}"
    );
    let s = cli_json(&dir, &["show"]);
    assert_eq!(
        s["bridges"][0]["openflow"]["controllers"][1]["role"],
        "master"
    );
    drop((oa, ob, ovs));

    // The controller restarts: the switch reconnects, backing off 1, 2, 4 ... s meanwhile.
    let port = tcp.port();
    drop(tcp);
    drop(a);
    wait_until("backoff grows past 2 s", 20, || {
        let s = cli_json(&dir, &["show"]);
        s["bridges"][0]["openflow"]["controllers"][0]["backoff_ms"]
            .as_u64()
            .unwrap_or(0)
            >= 4000
    });
    let t = Instant::now();
    let tcp = Listener::tcp_at(port);
    let mut a = tcp.accept(10);
    assert!(t.elapsed() <= Duration::from_secs(9), "max_backoff is 8 s");
    a.handshake();
    let s = cli_json(&dir, &["show"]);
    assert!(
        s["bridges"][0]["openflow"]["controllers"][0]["connects"]
            .as_u64()
            .unwrap()
            >= 2,
        "{s}"
    );

    // Inactivity probe: an idle controller gets an echo after 5 s; one that does not
    // answer is dropped after another 5 s and the switch reconnects.
    let t = Instant::now();
    a.mute = true;
    while a.echoes == 0 {
        assert!(a.recv().is_some(), "the switch closed before probing");
    }
    let probed = t.elapsed();
    assert!(
        probed >= Duration::from_secs(4) && probed <= Duration::from_secs(8),
        "{probed:?}"
    );
    while a.recv().is_some() {}
    let dropped = t.elapsed();
    assert!(dropped >= Duration::from_secs(9), "{dropped:?}");
    let mut a = tcp.accept(10);
    a.handshake();

    // A hot upgrade: the controller sees one reconnect, at once.
    let _stop = StopCurrent(dir.clone());
    upgrade(&dir, &[]).expect("upgrade");
    let t = Instant::now();
    while a.recv().is_some() {}
    let mut a2 = tcp.accept(5);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(a2.handshake(), 0xab, "datapath-id kept across the upgrade");
    let got = cli(&dir, &["get-controller", "br0"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).lines().count(),
        2,
        "controllers kept across the upgrade"
    );
    drop(b);
}

fn privileged() -> bool {
    require(
        is_root() && have("ip") && have("ping") && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping and /dev/net/tun (network namespaces, TAP)",
    )
}

fn ping(ns: &str, to: &str, count: u32) -> u64 {
    let c = count.to_string();
    let o = Net::exec(ns, &["ping", "-c", &c, "-i", "0.05", "-W", "1", to]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {out}"));
    line.split(", ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn show_of(dir: &Path) -> serde_json::Value {
    cli_json(dir, &["show"])["bridges"][0]["openflow"].clone()
}

#[test]
fn fail_mode_standalone_forwards_without_a_controller_secure_never_and_hostile_controllers_change_nothing(
) {
    if !privileged() {
        return;
    }
    let dir = run_dir("controllers-fail");
    let (pmd, _) = cores();
    let conf = dir.join("conf.json");
    std::fs::write(
        &conf,
        r#"{"version":1,"bridges":[{"name":"br0","ports":[]}],"pmd_cores":[0],"other":{}}"#,
    )
    .unwrap();
    let c = conf.display().to_string();
    let _sw = start_switch(&dir, pmd, &["--config", &c]);
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("cf1-"), Net::name("cf2-"));
    let (t1, t2) = (Net::name("cfa"), Net::name("cfb"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.9.0.1/24"),
        ("t2", &t2, &ns2, "10.9.0.2/24"),
    ] {
        net.track_link(t);
        let o = cli(
            &dir,
            &["add-port", "br0", p, "type=tap", &format!("dev={t}")],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        net.move_into(t, ns, a);
    }
    // No controller, standalone: the default NORMAL rule.
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5);

    // Secure with no controller: the table is flushed and stays empty.
    let ok = |args: &[&str]| {
        let o = cli(&dir, args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(&["set-bridge", "br0", "fail-mode=secure"]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 0);
    // Back to standalone: flushed again, with the NORMAL rule.
    ok(&["set-bridge", "br0", "fail-mode=standalone"]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5);

    // A controller nobody answers: the table is flushed (as OVS's when the first
    // controller comes); standalone fails open after three probe intervals (15 s).
    let dead = Listener::tcp();
    let port = dead.port();
    drop(dead);
    ok(&["set-controller", "br0", &format!("tcp:127.0.0.1:{port}")]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 0, "no rule, no controller yet");
    wait_until("fail-open", 25, || show_of(&dir)["fail_open"] == true);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5, "fail-open forwards");
    // Secure: fail-open ends at once.
    ok(&["set-bridge", "br0", "fail-mode=secure"]);
    wait_until("fail-open ends", 5, || show_of(&dir)["fail_open"] == false);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 0, "secure never fails open");
    ok(&["set-bridge", "br0", "fail-mode=standalone"]);
    wait_until("fail-open again", 5, || show_of(&dir)["fail_open"] == true);

    // A controller connects: fail-open ends (its rules, none yet, decide: drop).
    let tcp = Listener::tcp_at(port);
    let mut a = tcp.accept(15);
    a.handshake();
    wait_until("fail-open ends on connect", 5, || {
        show_of(&dir)["fail_open"] == false
    });
    assert_eq!(ping(&ns1, "10.9.0.2", 3), 0);

    // Hostile controllers while the bridge forwards (a NORMAL rule from the management
    // socket's CLI twin): garbage, a huge message, a controller that never reads.
    ok(&["add-flow", "br0", "priority=0,actions=normal"]);
    let pinger = std::thread::spawn({
        let ns1 = ns1.clone();
        move || ping(&ns1, "10.9.0.2", 60)
    });
    a.send(&[0xde; 4096]);
    let mut big = header(ECHO_REQUEST, 65535, 3);
    big.resize(65535, 0xab);
    for _ in 0..4 {
        let _ = a.s.write_all(&big);
    }
    // The switch never reads more than it can answer: flood it with echoes unread.
    let mut echo = header(ECHO_REQUEST, 60008, 4);
    echo.resize(60008, 0x55);
    let flood = std::thread::spawn(move || {
        // (Loopback TCP buffers hold some 20 MB between the two before the switch's own
        // limits come into play.)
        for _ in 0..2000 {
            if a.s.write_all(&echo).is_err() {
                return true;
            }
        }
        false
    });
    assert!(
        flood.join().unwrap(),
        "a controller that never reads was not dropped"
    );
    let rx = pinger.join().unwrap();
    assert!(rx >= 59, "the switch forwarded throughout: {rx}/60");
    // It reconnects (the switch backs off, then tries again) and the daemon answers.
    let mut a = tcp.accept(15);
    a.handshake();
    let o = cli(&dir, &["show"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("controller tcp:127.0.0.1:{port}")),
        "{text}"
    );

    // PORT_MOD: ovs-ofctl sets t2 down over the management socket; the ping stops and the
    // controller hears PORT_STATUS (MODIFY, config PORT_DOWN); up again, it flows.
    if have("ovs-ofctl") {
        let mgmt = format!("unix:{}", dir.join("br0.mgmt").display());
        let mod_port = |how: &str| {
            let o = std::process::Command::new("ovs-ofctl")
                .args(["-O", "OpenFlow13", "mod-port", &mgmt, "t2", how])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };
        mod_port("down");
        let st = a.expect(PORT_STATUS);
        assert_eq!(st[8], 2, "reason OFPPR_MODIFY");
        assert_eq!(&st[16..20], &2u32.to_be_bytes(), "port 2");
        assert_eq!(&st[48..52], &1u32.to_be_bytes(), "config OFPPC_PORT_DOWN");
        assert_eq!(ping(&ns1, "10.9.0.2", 5), 0, "t2 is down");
        mod_port("up");
        let st = a.expect(PORT_STATUS);
        assert_eq!(&st[48..52], &0u32.to_be_bytes());
        assert_eq!(ping(&ns1, "10.9.0.2", 5), 5, "t2 is up again");
        // From the controller: a port that does not exist, and a wrong address.
        a.send(&port_mod(99, [0; 6], 1, 1));
        assert_eq!(error_of(&a.expect(ERROR)), (7, 0), "OFPPMFC_BAD_PORT");
        a.send(&port_mod(2, [0; 6], 1, 1));
        assert_eq!(error_of(&a.expect(ERROR)), (7, 1), "OFPPMFC_BAD_HW_ADDR");
        assert_eq!(ping(&ns1, "10.9.0.2", 3), 3);
    }

    // Removing the controller flushes the table; standalone with none: NORMAL.
    ok(&["del-controller", "br0"]);
    assert_eq!(ping(&ns1, "10.9.0.2", 5), 5);
}
