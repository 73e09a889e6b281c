//! Continuations end to end, as OVN's pinctrl uses them: a rule's
//! `controller(userdata=…,pause)` sends the packet up as `NXT_PACKET_IN2` with its userdata,
//! the registers written before it and a continuation, and nothing after the pause happens;
//! the controller (`tests/e2e/src/resume.py`, a small client speaking OpenFlow 1.5) rewrites
//! the packet and sends `NXT_RESUME`; the rest of the frozen translation runs (the register
//! set before the pause selects the rule after it) and the rewritten packet arrives in the
//! other namespace. Hostile resumes (a stale token, a truncated continuation, an action that
//! does not exist, too many frames, none at all, another bridge's) each get OVS's error and
//! send nothing.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ferrovs_e2e::*;

/// A UDP frame from 02:00:00:00:00:01 (10.8.0.1:1234) to 02:00:00:00:00:02 (10.8.0.2:5678)
/// with the payload `0102030405060708`.
const UDP_FRAME: &str = "020000000002020000000001080045000024000100004011a6c40a0800010a080002\
                         04d2162e0010f2a70102030405060708";

fn tools() -> bool {
    require(
        is_root()
            && have("ip")
            && have("python3")
            && have("ovs-ofctl")
            && Path::new("/dev/net/tun").exists(),
        "root, iproute2, python3, ovs-ofctl and /dev/net/tun",
    )
}

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

/// Captures what arrives on `dev` in `ns` for `secs` seconds into `out` (a hex frame a
/// line).
fn capture(ns: &str, dev: &str, secs: u32, out: &Path) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(
            "import socket,sys,time\n\
             s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(3))\n\
             s.bind((sys.argv[1],0)); s.settimeout(0.2)\n\
             f=open(sys.argv[3],'w'); end=time.time()+float(sys.argv[2])\n\
             print('ready',flush=True)\n\
             while time.time()<end:\n\
             \x20   try: f.write(s.recv(65536).hex()+'\\n'); f.flush()\n\
             \x20   except socket.timeout: pass\n",
        )
        .args([dev, &secs.to_string(), &out.display().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("capture")
}

#[test]
fn a_paused_translation_resumes_with_the_controllers_packet() {
    if !tools() {
        return;
    }
    let dir = run_dir("continuations");
    let (pmd, _) = cores();
    let _sw = start_bare_switch(&dir, pmd, &["br0", "br1"]);
    let sock = dir.join("br0.mgmt");
    let other = dir.join("br1.mgmt");
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("cn1-"), Net::name("cn2-"));
    let (t1, t2) = (Net::name("ca"), Net::name("cb"));
    net.netns(&ns1);
    net.netns(&ns2);
    for (p, t, ns, a) in [
        ("t1", &t1, &ns1, "10.8.0.1/24"),
        ("t2", &t2, &ns2, "10.8.0.2/24"),
    ] {
        net.tap_port(&dir, "br0", p, t, ns, a);
        Net::no_ipv6(ns, t);
    }
    ofctl_ok(&sock, "del-flows", &[]);
    for f in [
        "table=0,priority=10,in_port=1,udp,actions=load:0x2a->NXM_NX_REG0[],resubmit(,1)",
        "table=1,priority=10,actions=controller(userdata=01.02.03,pause),resubmit(,2)",
        "table=2,priority=10,reg0=0x2a,actions=output:2",
        "table=2,priority=5,actions=drop",
    ] {
        ofctl_ok(&sock, "add-flow", &[f]);
    }
    // dump-flows prints the action as ovs-ofctl wrote it (NXAST_CONTROLLER2 both ways).
    let dump = ofctl_ok(&sock, "dump-flows", &["--no-stats"]);
    assert!(
        dump.contains("actions=controller(userdata=01.02.03,pause),resubmit(,2)"),
        "{dump}"
    );

    // The rewritten packet: the payload changed (the UDP checksum left alone: the test
    // compares bytes).
    let new = UDP_FRAME.replace("0102030405060708", "a1a2a3a4a5a6a7a8");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/resume.py");
    let mut client = Command::new("python3")
        .arg(&script)
        .arg(&sock)
        .arg(&other)
        .arg(&new)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("resume.py");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    std::thread::sleep(Duration::from_millis(300));
    let cap_file = dir.join("t2.hex");
    let mut cap = capture(&ns2, &t2, 6, &cap_file);
    let mut cap_out = BufReader::new(cap.stdout.take().unwrap()).lines();
    assert_eq!(cap_out.next().unwrap().unwrap(), "ready");
    send_raw(&ns1, &t1, UDP_FRAME);

    let pin: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(pin.get("error").is_none(), "{pin}");
    assert_eq!(pin["packet"], UDP_FRAME.replace(' ', ""), "{pin}");
    assert_eq!(pin["userdata"], "010203", "{pin}");
    let md = pin["metadata"].as_str().unwrap();
    // NXM_NX_REG0 = 0x2a, written before the pause (and in_port 1).
    assert!(md.contains("000100040000002a"), "{md}");
    assert!(md.contains("8000000400000001"), "{md}");
    let cont = pin["continuation"].as_str().unwrap();
    assert!(
        cont.starts_with("80000014465643"),
        "NXCPT_BRIDGE \"FVC\" first: {cont}"
    );

    let res: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let errs = &res["errors"];
    let err = |xid: &str| -> Vec<u64> {
        errs[xid]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
            .unwrap_or_default()
    };
    assert_eq!(err("1"), vec![0xffff, 35], "stale: NXR_STALE {res}");
    assert_eq!(err("2"), vec![14, 1], "truncated: OFPBPC_BAD_LEN {res}");
    assert_eq!(err("3"), vec![2, 0], "bad action: OFPBAC_BAD_TYPE {res}");
    assert_eq!(err("4"), vec![14, 3], "huge: OFPBPC_TOO_MANY {res}");
    assert_eq!(err("5"), vec![0xffff, 35], "none: NXR_STALE {res}");
    assert_eq!(
        err("6"),
        vec![0xffff, 35],
        "another bridge: NXR_STALE {res}"
    );
    assert!(errs.get("7").is_none(), "the good resume: {res}");
    let _ = client.wait();

    let _ = cap.wait();
    let got = std::fs::read_to_string(&cap_file).unwrap_or_default();
    let udp: Vec<&str> = got
        .lines()
        .filter(|l| l.starts_with("02000000000202000000000108004500"))
        .collect();
    assert_eq!(
        udp,
        vec![new.as_str()],
        "only the resumed (rewritten) packet reaches vm2, once"
    );
    // The refusals are counted.
    let show = cli_json(&dir, &["show"]);
    let pio = &show["packet_io"];
    assert_eq!(pio["resumes"], 7, "{pio}");
    assert_eq!(pio["resumes_refused"], 6, "{pio}");
    assert_eq!(pio["continuations_sent"], 1, "{pio}");
}

/// Reads a pcap file's frames.
fn pcap_frames(path: &Path) -> Vec<String> {
    let b = std::fs::read(path).unwrap_or_default();
    let mut v = Vec::new();
    let mut at = 24;
    while b.len() >= at + 16 {
        let n = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16;
        if b.len() < at + n {
            break;
        }
        v.push(b[at..at + n].iter().map(|x| format!("{x:02x}")).collect());
        at += n;
    }
    v
}

/// The same flows, client and hostile resumes against OVS 3.1 (netdev bridge, dummy ports):
/// the same packet-in (userdata, reg0) and errors, and the rewritten packet out of port 2.
/// Two differences, ours by design: OVS takes any number of frames (`OFPBPC_TOO_MANY` is
/// ferrovs's bound) and resumes that one (the original packet goes out too), and it resumes
/// a continuation that another bridge's connection brings (on the bridge that made it).
#[test]
fn ovs_resumes_the_same_way() {
    if !tools() || !ferrovs_e2e::ovsdb::vswitchd_available() {
        return;
    }
    let dir = run_dir("continuations-ovs");
    let sw = ferrovs_e2e::ovsdb::OvsVswitchd::start(&dir, "cnovs");
    let sock = sw.netdev_br0(true);
    sw.db
        .vsctl(&[
            "add-br",
            "br1",
            "--",
            "set",
            "bridge",
            "br1",
            "datapath_type=netdev",
        ])
        .expect("add-br br1");
    let other = dir.join("br1.mgmt");
    wait_until("br1.mgmt", 10, || UnixStream::connect(&other).is_ok());
    let pcap = dir.join("vm2.pcap");
    let p = pcap.display().to_string();
    sw.db
        .vsctl(&["set", "interface", "vm2", &format!("options:tx_pcap={p}")])
        .expect("tx_pcap");
    ofctl_ok(&sock, "del-flows", &[]);
    for f in [
        "table=0,priority=10,in_port=1,udp,actions=load:0x2a->NXM_NX_REG0[],resubmit(,1)",
        "table=1,priority=10,actions=controller(userdata=01.02.03,pause),resubmit(,2)",
        "table=2,priority=10,reg0=0x2a,actions=output:2",
        "table=2,priority=5,actions=drop",
    ] {
        ofctl_ok(&sock, "add-flow", &[f]);
    }
    let dump = ofctl_ok(&sock, "dump-flows", &["--no-stats"]);
    assert!(
        dump.contains("actions=controller(userdata=01.02.03,pause),resubmit(,2)"),
        "{dump}"
    );
    let new = UDP_FRAME.replace("0102030405060708", "a1a2a3a4a5a6a7a8");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/resume.py");
    let mut client = Command::new("python3")
        .arg(&script)
        .arg(&sock)
        .arg(&other)
        .arg(&new)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("resume.py");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    std::thread::sleep(Duration::from_millis(300));
    let o = Command::new("ovs-appctl")
        .arg("-t")
        .arg(sw.unixctl())
        .args(["netdev-dummy/receive", "vm1", UDP_FRAME])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pin: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(pin["userdata"], "010203", "{pin}");
    let md = pin["metadata"].as_str().unwrap();
    // OVS 1.5 writes reg0 as the high half of OXM_OF_PKT_REG0, masked.
    assert!(
        md.contains("800101100000002a00000000ffffffff00000000"),
        "{md}"
    );
    let res: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let errs = &res["errors"];
    let err = |xid: &str| -> Vec<u64> {
        errs[xid]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
            .unwrap_or_default()
    };
    assert_eq!(err("1"), vec![0xffff, 35], "stale {res}");
    assert_eq!(err("2"), vec![14, 1], "truncated {res}");
    assert_eq!(err("3"), vec![2, 0], "bad action {res}");
    assert_eq!(err("5"), vec![0xffff, 35], "none {res}");
    // OVS finds the bridge a continuation names whichever bridge's connection brings it
    // (xlate_resume looks the ofproto up by its uuid) and resumes it there; ferrovs
    // refuses it (NXR_STALE): a bridge's controller cannot inject into another bridge.
    assert!(errs.get("6").is_none(), "another bridge {res}");
    assert!(errs.get("7").is_none(), "{res}");
    let _ = client.wait();
    std::thread::sleep(Duration::from_millis(500));
    let out: Vec<String> = pcap_frames(&pcap)
        .into_iter()
        .filter(|f| f.starts_with("02000000000202000000000108004500"))
        .collect();
    assert!(
        out.contains(&new),
        "the rewritten packet leaves vm2: {out:?}"
    );
}
