//! `ferrovs trace` against the datapath (a differential test): a bridge with three TAP
//! ports in three namespaces is programmed through `ovs-ofctl` with a mixed rule set
//! (goto_table, resubmit, NORMAL, drop, a table miss, ct with recirculation); for a set of
//! flows, what `ferrovs trace --json` predicts (output ports, or a drop) must be what real
//! packets sent into the switch do (the namespaces' receive counters). The trace changes no
//! state (MAC table, rule counters, conntrack, megaflows). Bad input gets a precise error
//! and leaves the daemon serving. And one case is compared with OVS's own
//! `ovs-appctl ofproto/trace` on the same rules (the rule sequence and the final actions).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferrovs_e2e::*;
use serde_json::Value;

const MACS: [&str; 3] = [
    "02:00:00:00:0a:01",
    "02:00:00:00:0a:02",
    "02:00:00:00:0a:03",
];
const IPS: [&str; 3] = ["10.9.0.1", "10.9.0.2", "10.9.0.3"];

/// Port 1 (a) to 10.9.0.2 goes through table 1; to 10.9.0.3 is dropped; other IP through
/// table 2, where UDP goes through conntrack (ct(commit,table=3)) and NORMAL, and what
/// table 2 does not know misses.
const RULES: &[&str] = &[
    "table=0,priority=200,arp,actions=NORMAL",
    "table=0,cookie=0x2a,priority=100,ip,nw_dst=10.9.0.2,actions=goto_table:1",
    "table=0,priority=100,ip,nw_dst=10.9.0.3,actions=drop",
    "table=0,priority=50,ip,actions=resubmit(,2)",
    "table=1,priority=10,icmp,actions=output:2",
    "table=1,priority=10,udp,tp_dst=7,actions=drop",
    "table=1,priority=5,actions=NORMAL",
    "table=2,priority=10,udp,actions=ct(commit,zone=4,table=3)",
    "table=2,priority=10,icmp,nw_src=10.9.0.2,actions=NORMAL",
    "table=3,priority=10,ct_state=+trk,udp,actions=NORMAL",
];

fn trace_json(dir: &Path, args: &[&str]) -> Value {
    let mut a = vec!["trace", "br0"];
    a.extend_from_slice(args);
    cli_json(dir, &a)
}

fn outputs(t: &Value) -> Vec<String> {
    let mut v: Vec<String> = t["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Receive counters of the three namespaces' TAPs.
fn rx(ns: &[String; 3]) -> [u64; 3] {
    [0, 1, 2].map(|i| {
        Net::counter(
            &ns[i],
            &format!("fvt{i}{}", std::process::id() % 100000),
            "rx_packets",
        )
    })
}

/// Sends `n` packets from namespace `from` with `cmd` (a shell command) and returns which
/// ports (of a, b, c) received them: every port whose counter rose by at least `n` (the
/// sender's own counter is not looked at).
fn send_and_see(ns: &[String; 3], from: usize, n: u64, cmd: &str) -> Vec<String> {
    let before = rx(ns);
    for _ in 0..n {
        let o = Net::exec(&ns[from], &["sh", "-c", cmd]);
        assert!(
            o.status.success() || cmd.contains("ping"),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = rx(ns);
    let mut v: Vec<String> = (0..3)
        .filter(|&i| i != from && after[i] - before[i] >= n)
        .map(|i| ["a", "b", "c"][i].to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn trace_predicts_what_packets_do() {
    if !require(
        is_root() && have("ovs-ofctl") && have("ip"),
        "root, ip and ovs-ofctl (Debian's openvswitch-common)",
    ) {
        return;
    }
    let dir = run_dir("trace");
    let (pmd, _) = cores();
    let _sw = start_bare_switch(&dir, pmd, &["br0"]);
    let mut net = Net::new();
    let pid = std::process::id() % 100000;
    let ns: [String; 3] = [0, 1, 2].map(|i| Net::name(&format!("tr{i}")));
    for (i, port) in ["a", "b", "c"].iter().enumerate() {
        net.netns(&ns[i]);
        let tap = format!("fvt{i}{pid}");
        net.tap_port(&dir, "br0", port, &tap, &ns[i], &format!("{}/24", IPS[i]));
        Net::no_ipv6(&ns[i], &tap);
        // No echo replies among the test's packets (each case counts one direction).
        let _ = Net::exec(
            &ns[i],
            &["sysctl", "-qw", "net.ipv4.icmp_echo_ignore_all=1"],
        );
        Net::ip(&["-n", &ns[i], "link", "set", &tap, "down"]);
        Net::ip(&["-n", &ns[i], "link", "set", &tap, "address", MACS[i]]);
        Net::ip(&["-n", &ns[i], "link", "set", &tap, "up"]);
        // Static neighbours: no ARP among the test's packets.
        for j in 0..3 {
            if j != i {
                Net::ip(&[
                    "-n",
                    &ns[i],
                    "neigh",
                    "replace",
                    IPS[j],
                    "lladdr",
                    MACS[j],
                    "dev",
                    &tap,
                    "nud",
                    "permanent",
                ]);
            }
        }
    }
    let show = cli_json(&dir, &["show"]);
    let ofports: Vec<u64> = show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["ofport"].as_u64().unwrap())
        .collect();
    assert_eq!(ofports, vec![1, 2, 3], "{show}");
    let sock = dir.join("br0.mgmt");
    ofctl_ok(&sock, "del-flows", &[]);
    for r in RULES {
        ofctl_ok(&sock, "add-flow", &[r]);
    }
    let flow = |from: usize, to: usize, rest: &str| {
        format!(
            "in_port={},dl_src={},dl_dst={},{rest},nw_src={},nw_dst={}",
            ["a", "b", "c"][from],
            MACS[from],
            MACS[to],
            IPS[from],
            IPS[to]
        )
    };

    // State before any trace, to show the traces change none.
    let macs0 = cli_json(&dir, &["mac-table", "br0"]);
    let flows0 = cli_json(&dir, &["dump-flows", "br0"]);
    let mega0 = cli_json(&dir, &["dump-megaflows", "br0"]);
    let ct0 = cli_json(&dir, &["dump-conntrack"]);

    // Each case: a flow to trace, the command that sends such packets, the sender.
    struct Case {
        from: usize,
        flow: String,
        cmd: String,
        n: u64,
        want: Vec<&'static str>,
    }
    let ping = |to: usize| format!("ping -c 1 -W 1 {}", IPS[to]);
    let udp = |to: usize, port: u16| format!("echo x > /dev/udp/{}/{port}", IPS[to]);
    let cases = [
        // goto_table, an explicit output.
        Case {
            from: 0,
            flow: flow(0, 1, "icmp,icmp_type=8"),
            cmd: ping(1),
            n: 1,
            want: vec!["b"],
        },
        // A drop rule in table 1.
        Case {
            from: 0,
            flow: flow(0, 1, "udp,tp_src=40000,tp_dst=7"),
            cmd: format!("bash -c '{}'", udp(1, 7)),
            n: 1,
            want: vec![],
        },
        // A drop rule in table 0.
        Case {
            from: 0,
            flow: flow(0, 2, "icmp,icmp_type=8"),
            cmd: ping(2),
            n: 1,
            want: vec![],
        },
        // resubmit to table 2, which misses for ICMP from a to nobody known.
        Case {
            from: 0,
            flow: format!(
                "in_port=a,dl_src={},dl_dst=02:00:00:00:0a:09,icmp,icmp_type=8,nw_src={},nw_dst=10.9.0.9",
                MACS[0], IPS[0]
            ),
            cmd: format!("ip neigh replace 10.9.0.9 lladdr 02:00:00:00:0a:09 dev fvt0{pid} nud permanent; ping -c 1 -W 1 10.9.0.9"),
            n: 1,
            want: vec![],
        },
        // UDP from c to b: resubmit, ct(commit,table=3), NORMAL: b's MAC never seen yet,
        // so NORMAL floods (a and b).
        Case {
            from: 2,
            flow: flow(2, 1, "udp,tp_src=40000,tp_dst=9"),
            cmd: format!("bash -c '{}'", udp(1, 9)),
            n: 1,
            want: vec!["a", "b"],
        },
        // Table 1's NORMAL after b has sent (learned): UDP a to b, port 9.
        Case {
            from: 0,
            flow: flow(0, 1, "udp,tp_src=40000,tp_dst=9"),
            cmd: format!("bash -c '{}'", udp(1, 9)),
            n: 1,
            want: vec![],
        },
        // UDP from b to a: resubmit to table 2, ct(commit,table=3), then table 3's NORMAL
        // (a learned on a by now).
        Case {
            from: 1,
            flow: flow(1, 0, "udp,tp_src=40000,tp_dst=9"),
            cmd: format!("bash -c '{}'", udp(0, 9)),
            n: 1,
            want: vec!["a"],
        },
    ];
    let mut checked = 0;
    for (i, c) in cases.iter().enumerate() {
        if i == 5 {
            // b sends (its ICMP reply path: table 2's NORMAL): its MAC is learned on b.
            // (Echo replies are off: the request alone is what counts.)
            let _ = Net::exec(&ns[1], &["ping", "-c", "1", "-W", "1", IPS[0]]);
        }
        let t = trace_json(&dir, &[&c.flow]);
        let predicted = outputs(&t);
        let seen = send_and_see(&ns, c.from, c.n, &c.cmd);
        eprintln!(
            "case {i}: {} -> trace {predicted:?} ({}), packets {seen:?}",
            c.flow,
            t["drop"].as_str().unwrap_or("sent")
        );
        assert_eq!(
            predicted, seen,
            "case {i}: the trace and the packets differ\n{t:#}"
        );
        if i != 5 {
            let want: Vec<String> = c.want.iter().map(|s| s.to_string()).collect();
            assert_eq!(predicted, want, "case {i}\n{t:#}");
        } else {
            // Learned (b sent through NORMAL): NORMAL sends to b alone.
            assert_eq!(predicted, vec!["b".to_string()], "case {i}\n{t:#}");
        }
        checked += 1;
    }
    assert_eq!(checked, cases.len());

    // What the trace reports for the ct case: the rules in order, the recirculation with
    // the assumed state, the megaflows, NORMAL.
    let t = trace_json(&dir, &[&flow(1, 0, "udp,tp_src=40000,tp_dst=9")]);
    let p = t["passes"].as_array().unwrap();
    assert_eq!(p.len(), 2, "{t:#}");
    let tables: Vec<(u64, u64)> = p[0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["table"].as_u64().unwrap(), s["depth"].as_u64().unwrap()))
        .collect();
    assert_eq!(tables, vec![(0, 0), (2, 1)], "{t:#}");
    assert!(
        p[0]["actions"]
            .as_str()
            .unwrap()
            .contains("ct(zone=4,commit)"),
        "{t:#}"
    );
    assert!(
        p[0]["megaflow"]
            .as_str()
            .unwrap()
            .starts_with("recirc_id=0x0,"),
        "{t:#}"
    );
    assert_eq!(p[1]["ct_state"], "new,trk", "{t:#}");
    let normal = p[1]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "normal")
        .expect("a NORMAL step");
    assert!(
        normal["normal"].as_str().unwrap().contains("learned on a"),
        "{t:#}"
    );
    // The real packet committed its connection; the traces commit none.
    let ct = cli_json(&dir, &["dump-conntrack"]);
    assert!(ct.to_string().contains("10.9.0.2"), "{ct}");
    // --ct-next: with est the table-3 rule (+trk) still matches; with inv alone... also
    // +trk is required: an untracked assumption misses table 3.
    let t = trace_json(
        &dir,
        &[&flow(1, 0, "udp,tp_src=40000,tp_dst=9"), "--ct-next", "inv"],
    );
    assert!(t["drop"].as_str().unwrap().contains("table 3"), "{t:#}");

    // The traces changed nothing: the MAC table (b's MAC was learned by real packets, so
    // compare only that no entry was added by the traces before them), counters, conntrack.
    let t = trace_json(
        &dir,
        &[&format!(
            "in_port=c,dl_src=02:00:00:00:0a:77,dl_dst={},udp,tp_dst=9,nw_src=10.9.0.77,nw_dst={}",
            MACS[0], IPS[0]
        )],
    );
    assert_eq!(outputs(&t), vec!["a".to_string()], "{t:#}");
    assert_eq!(t["passes"].as_array().unwrap().len(), 2, "{t:#}");
    let macs = cli_json(&dir, &["mac-table", "br0"]);
    assert!(
        !macs.to_string().contains("02:00:00:00:0a:77"),
        "a trace learned a MAC: {macs}"
    );
    let ct = cli_json(&dir, &["dump-conntrack"]);
    assert!(
        !ct.to_string().contains("10.9.0.77"),
        "a trace committed: {ct}"
    );
    let _ = (macs0, flows0, mega0, ct0);
    let before = cli_json(&dir, &["dump-flows", "br0"]);
    let mega_before = cli_json(&dir, &["dump-megaflows", "br0"])
        .as_array()
        .unwrap()
        .len();
    for _ in 0..20 {
        trace_json(&dir, &[&flow(0, 1, "icmp,icmp_type=8")]);
    }
    let after = cli_json(&dir, &["dump-flows", "br0"]);
    let counts = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|f| f["n_packets"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(counts(&before), counts(&after), "a trace credited a rule");
    // (Megaflows may age out meanwhile, never appear.)
    assert!(
        cli_json(&dir, &["dump-megaflows", "br0"])
            .as_array()
            .unwrap()
            .len()
            <= mega_before,
        "a trace installed a megaflow"
    );

    // --packet with the same frame a real ping sends; --pcap with two frames.
    let frame = icmp_frame(0, 1);
    let t = trace_json(&dir, &["--packet", &hex(&frame), "--in-port", "a"]);
    assert_eq!(outputs(&t), vec!["b".to_string()], "{t:#}");
    let pcap = dir.join("two.pcap");
    std::fs::write(&pcap, pcap_file(&[&frame, &icmp_frame(0, 2)])).unwrap();
    let v = trace_json(&dir, &["--pcap", pcap.to_str().unwrap(), "--in-port", "1"]);
    let v = v.as_array().unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(outputs(&v[0]), vec!["b".to_string()]);
    assert!(
        v[1]["drop"]
            .as_str()
            .unwrap()
            .contains("dropped by the rules"),
        "{v:?}"
    );

    // Text output: the ofproto/trace layout.
    let o = cli(&dir, &["trace", "br0", &flow(0, 1, "icmp,icmp_type=8")]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for want in [
        "bridge(\"br0\")",
        " 0. cookie=0x2a,priority=100,ip,nw_dst=10.9.0.2",
        "    goto_table:1",
        " 1. table=1,priority=10,icmp",
        "Megaflow: recirc_id=0x0,",
        "Datapath actions: output:b",
        "Result: output to b",
    ] {
        assert!(text.contains(want), "'{want}' not in:\n{text}");
    }

    bad_input(&dir);
}

/// Each bad input: its error, and the daemon still answers.
fn bad_input(dir: &Path) {
    let bad_pcap = dir.join("bad.pcap");
    let mut p = pcap_file(&[&icmp_frame(0, 1)]);
    p.truncate(p.len() - 5);
    std::fs::write(&bad_pcap, &p).unwrap();
    let bp = bad_pcap.to_str().unwrap().to_string();
    for (args, want) in [
        (vec!["trace", "nobr", "in_port=a"], "no bridge named nobr"),
        (
            vec!["trace", "br0", "in_port=zz,ip"],
            "no port zz on bridge br0",
        ),
        (vec!["trace", "br0", "in_port=a,nw_dst=1.2.3"], "bad flow"),
        (
            vec!["trace", "br0", "in_port=a,frobnicate=1"],
            "unknown field 'frobnicate'",
        ),
        (vec!["trace", "br0", "ip"], "the flow needs in_port=PORT"),
        (
            vec!["trace", "br0", "--packet", "0102zz", "--in-port", "a"],
            "'z' at offset 4 is not a hex digit",
        ),
        (
            vec!["trace", "br0", "--packet", "010203", "--in-port", "a"],
            "truncated packet: 3 bytes",
        ),
        (
            vec!["trace", "br0", "--packet", "0102030", "--in-port", "a"],
            "odd number of hex digits",
        ),
        (
            vec![
                "trace",
                "br0",
                "--packet",
                "00000000000200000000000108004500",
            ],
            "a packet needs --in-port PORT",
        ),
        (
            vec!["trace", "br0", "--pcap", bp.as_str(), "--in-port", "a"],
            "packet 1:",
        ),
        (
            vec![
                "trace",
                "br0",
                "--pcap",
                "/nonexistent.pcap",
                "--in-port",
                "a",
            ],
            "/nonexistent.pcap",
        ),
        (
            vec!["trace", "br0", "in_port=a,ip", "--ct-next", "trk,bogus"],
            "bad ct state 'bogus'",
        ),
    ] {
        let o = cli(dir, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: '{err}' lacks '{want}'");
    }
    assert!(
        cli(dir, &["show"]).status.success(),
        "the daemon stopped answering"
    );
}

fn mac(s: &str) -> [u8; 6] {
    let mut m = [0u8; 6];
    for (i, p) in s.split(':').enumerate() {
        m[i] = u8::from_str_radix(p, 16).unwrap();
    }
    m
}

fn ip(s: &str) -> [u8; 4] {
    s.parse::<std::net::Ipv4Addr>().unwrap().octets()
}

/// An ICMP echo request from host `from` to host `to` (checksums 0: classification does
/// not look).
fn icmp_frame(from: usize, to: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&mac(MACS[to]));
    f.extend_from_slice(&mac(MACS[from]));
    f.extend_from_slice(&[8, 0, 0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 1, 0, 0]);
    f.extend_from_slice(&ip(IPS[from]));
    f.extend_from_slice(&ip(IPS[to]));
    f.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]);
    f.resize(60, 0);
    f
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn pcap_file(frames: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    v.extend_from_slice(&2u16.to_le_bytes());
    v.extend_from_slice(&4u16.to_le_bytes());
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(&65535u32.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    for f in frames {
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(f);
    }
    v
}

/// The same rules in a private OVS (netdev bridge, dummy ports 1 and 2): `ofproto/trace`
/// of one flow visits the same rules and ends in the same datapath action as `ferrovs
/// trace`.
#[test]
fn trace_agrees_with_ovs_ofproto_trace() {
    if !require(
        ovsdb::vswitchd_available() && have("ovs-ofctl") && have("ovs-appctl"),
        "ovs-vswitchd, ovsdb-server, ovs-ofctl and ovs-appctl (Debian's openvswitch-switch)",
    ) {
        return;
    }
    let dir = run_dir("trace-ovs");
    let (pmd, _) = cores();
    let _sw = start_bare_switch(&dir, pmd, &["br0"]);
    for (p, n) in [("vm1", 1), ("vm2", 2)] {
        let o = cli(
            &dir,
            &[
                "add-port",
                "br0",
                p,
                "type=vhost-user",
                &format!("path={}/{p}.sock", dir.display()),
            ],
        );
        assert!(
            o.status.success(),
            "add-port {p}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let _ = n;
    }
    let ovs_dir = dir.join("ovs");
    std::fs::create_dir_all(&ovs_dir).unwrap();
    let ovs_sw = ovsdb::OvsVswitchd::start(&ovs_dir, "tro");
    let ovs = ovs_sw.netdev_br0(true);
    let ours = dir.join("br0.mgmt");
    let rules = [
        "table=0,priority=100,tcp,tp_dst=80,actions=mod_nw_tos:32,resubmit(,1),goto_table:2",
        "table=1,priority=10,tcp,actions=load:0x5->NXM_NX_REG0[]",
        "table=2,priority=10,reg0=0x5,actions=output:2",
    ];
    for s in [&ovs, &ours] {
        ofctl_ok(s, "del-flows", &[]);
        for r in rules {
            ofctl_ok(s, "add-flow", &[r]);
        }
    }
    let flow = "in_port=1,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_dst=80";
    let o = Command::new("ovs-appctl")
        .arg(format!("--target={}", ovs_sw.unixctl().display()))
        .args(["ofproto/trace", "br0", flow])
        .output()
        .unwrap();
    let theirs = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "ofproto/trace: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("OVS:\n{theirs}");
    let o = cli(&dir, &["trace", "br0", flow]);
    let mine = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("ferrovs:\n{mine}");
    // The tables visited, in order: OVS prints " 0. ", "    1. " (resubmit), " 2. ".
    let visits = |s: &str| -> Vec<u32> {
        s.lines()
            .filter_map(|l| {
                let t = l.trim_start();
                let (n, rest) = t.split_once(". ")?;
                (!rest.is_empty()).then_some(())?;
                n.parse().ok()
            })
            .collect()
    };
    assert_eq!(visits(&mine), visits(&theirs), "tables visited");
    assert_eq!(visits(&mine), vec![0, 1, 2]);
    let dp = |s: &str| -> String {
        s.lines()
            .find_map(|l| l.strip_prefix("Datapath actions: "))
            .unwrap_or("")
            .to_string()
    };
    // OVS: `set(ipv4(tos=0x20/0xfc)),N` (N its datapath's number of vm2); ours names
    // the port.
    let (a, b) = (dp(&theirs), dp(&mine));
    let out = a.strip_prefix("set(ipv4(tos=0x20/0xfc)),");
    assert!(out.is_some_and(|n| n.parse::<u32>().is_ok()), "OVS: {a}");
    assert_eq!(b, "set(nw_tos=32),output:vm2", "ferrovs: {b}");
}
