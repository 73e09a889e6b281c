//! Real Linux guests (QEMU, TCG) on ferrovs ports, in both vhost-user socket modes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferrovs_e2e::*;

/// Builds (or reuses) the guest kernel + initramfs.
fn guest_image() -> PathBuf {
    let out = repo().join("target/guest");
    let st = Command::new("bash")
        .arg(repo().join("tests/e2e/guest/build-initramfs.sh"))
        .arg(&out)
        .status()
        .expect("run build-initramfs.sh");
    assert!(st.success(), "guest image build failed");
    out
}

/// Starts a QEMU guest whose NIC uses `chardev` (a `-chardev socket,...` spec with id c0).
fn start_guest(dir: &Path, img: &Path, name: &str, chardev: &str, mac: &str, append: &str) -> Proc {
    let console = dir.join(format!("{name}.console")).display().to_string();
    let kernel = img.join("vmlinuz").display().to_string();
    let initrd = img.join("initramfs.gz").display().to_string();
    let args = [
        "-accel",
        "tcg",
        "-m",
        "256",
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
        "-nodefaults",
        "-serial",
        &format!("file:{console}"),
        "-kernel",
        &kernel,
        "-initrd",
        &initrd,
        "-append",
        &format!("console=ttyS0 quiet {append}"),
        "-object",
        "memory-backend-memfd,id=mem,size=256M,share=on",
        "-numa",
        "node,memdev=mem",
        "-chardev",
        chardev,
        "-netdev",
        "vhost-user,id=n0,chardev=c0",
        // vectors=0: QEMU 7.2 under TCG crashes when a guest enables MSI-X on vhost-user.
        "-device",
        &format!("virtio-net-pci,netdev=n0,mac={mac},vectors=0"),
    ];
    let qemu = which("qemu-system-x86_64");
    Proc::spawn(name, dir, &qemu, &args)
}

fn which(cmd: &str) -> PathBuf {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

fn wait_console(dir: &Path, name: &str, any_of: &[&str], secs: u64) -> String {
    let path = dir.join(format!("{name}.console"));
    let t = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).to_string();
        if let Some(m) = any_of.iter().find(|m| text.contains(**m)) {
            return m.to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "{name}: none of {any_of:?} within {secs}s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn two_guests_ping_through_ferrovs_in_both_socket_modes() {
    let ok = require(
        have("qemu-system-x86_64"),
        "qemu-system-x86_64 (scripts/deps.sh installs it)",
    ) && require(have("busybox"), "busybox-static")
        && require(
            std::fs::read_dir("/boot").is_ok_and(|mut d| {
                d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")))
            }),
            "a Debian kernel in /boot (linux-image-amd64)",
        );
    if !ok {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    // Guest B listens (QEMU server=on) and ferrovs connects to it: port type vhost-user-client.
    let q3 = dir.join("q3.sock").display().to_string();
    let _b = start_guest(
        &dir,
        &img,
        "b",
        &format!("socket,id=c0,path={q3},server=on,wait=off"),
        "52:54:00:00:00:02",
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=idle",
    );
    wait_until("guest b socket", 20, || Path::new(&q3).exists());
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "vm3",
            "type=vhost-user-client",
            &format!("path={q3}"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Guest A connects to ferrovs (port vm1, type vhost-user) and pings B.
    let vm1 = dir.join("vm1.sock").display().to_string();
    let _a = start_guest(
        &dir,
        &img,
        "a",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        "52:54:00:00:00:01",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=ping ferrovs.peer=10.0.0.2 ferrovs.count=5",
    );
    wait_console(&dir, "b", &["FERROVS-GUEST-READY 52:54:00:00:00:02"], 90);
    let verdict = wait_console(&dir, "a", &["FERROVS-PING-OK", "FERROVS-PING-FAIL"], 120);
    let st = cli_json(&dir, &["port-stats"]);
    assert_eq!(verdict, "FERROVS-PING-OK", "port stats: {st}");
    let show = cli_json(&dir, &["show"]);
    let ports = show["bridges"][0]["ports"].as_array().unwrap();
    let vm3 = ports.iter().find(|p| p["name"] == "vm3").unwrap();
    assert_eq!(vm3["state"], "connected");
    assert!(vm3["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "version_1"));
    let macs = cli_json(&dir, &["mac-table", "br0"]);
    let learned: Vec<_> = macs
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["mac"].as_str().unwrap().to_string(),
                e["port"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        learned.contains(&("52:54:00:00:00:01".into(), "vm1".into())),
        "{learned:?}"
    );
    assert!(
        learned.contains(&("52:54:00:00:00:02".into(), "vm3".into())),
        "{learned:?}"
    );
}

/// Real guests keep talking across hot upgrades: guest A (ferrovs listens) pings guest B
/// (B listens, ferrovs connects) 150 times at 10 Hz while the switch is upgraded five times;
/// every ping is answered and neither guest's vhost-user connection is ever re-established.
#[test]
fn guests_ping_without_loss_across_hot_upgrades() {
    let ok = require(
        have("qemu-system-x86_64"),
        "qemu-system-x86_64 (scripts/deps.sh installs it)",
    ) && require(have("busybox"), "busybox-static");
    if !ok {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests-upgrade");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let q3 = dir.join("q3.sock").display().to_string();
    let _b = start_guest(
        &dir,
        &img,
        "b",
        &format!("socket,id=c0,path={q3},server=on,wait=off"),
        "52:54:00:00:00:02",
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=idle",
    );
    wait_until("guest b socket", 20, || Path::new(&q3).exists());
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "vm3",
            "type=vhost-user-client",
            &format!("path={q3}"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let vm1 = dir.join("vm1.sock").display().to_string();
    let _a = start_guest(
        &dir,
        &img,
        "a",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        "52:54:00:00:00:01",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=ping ferrovs.peer=10.0.0.2 ferrovs.count=150 \
         ferrovs.interval=0.1 ferrovs.wait=60",
    );
    wait_console(&dir, "a", &["FERROVS-PEER-UP"], 120);
    let pid0 = cli_json(&dir, &["show"])["pid"].clone();
    let mut last_pid = pid0.clone();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(1500));
        let o = cli(&dir, &["upgrade"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        last_pid = cli_json(&dir, &["show"])["pid"].clone();
    }
    // (Before guest A powers off at the end of its pings.)
    let show = cli_json(&dir, &["show"]);
    let verdict = wait_console(&dir, "a", &["FERROVS-PING-OK", "FERROVS-PING-FAIL"], 120);
    let console = std::fs::read_to_string(dir.join("a.console")).unwrap();
    // Stop whichever daemon serves now (no longer the one this test started).
    if let Some(pid) = last_pid.as_u64() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    assert_ne!(pid0, last_pid, "the daemon was replaced");
    assert_eq!(verdict, "FERROVS-PING-OK", "{console}");
    assert!(
        console.contains("150 packets transmitted, 150 packets received"),
        "every ping answered across 5 upgrades:\n{console}"
    );
    for p in show["bridges"][0]["ports"].as_array().unwrap() {
        if p["name"] == "vm1" || p["name"] == "vm3" {
            assert_eq!(p["state"], "connected", "{p}");
            assert_eq!(p["connects"], 1, "no reconnect: {p}");
            assert_eq!(p["disconnects"], 0, "no disconnect: {p}");
        }
    }
    assert_eq!(show["upgrades"], 5);
}

/// `FERROVS-RESULT {json}` lines of a guest's console, in order.
fn results(dir: &Path, name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.console"))).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once("FERROVS-RESULT ").map(|(_, j)| j.trim()))
        .filter_map(|j| serde_json::from_str(j).ok())
        .collect()
}

/// A TCP stream (paced at 100 Mbit/s, below what TCG guests sustain, so that congestion
/// causes no loss of its own) and then a sequenced UDP stream between two real guests while
/// the switch is hot-upgraded every second: the TCP sender retransmits nothing, every byte
/// arrives, and no UDP datagram is lost.
#[test]
fn guest_tcp_and_udp_streams_survive_hot_upgrades() {
    let ok = require(
        have("qemu-system-x86_64"),
        "qemu-system-x86_64 (scripts/deps.sh installs it)",
    ) && require(have("busybox"), "busybox-static");
    if !ok {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests-streams");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let q3 = dir.join("q3.sock").display().to_string();
    let _b = start_guest(
        &dir,
        &img,
        "b",
        &format!("socket,id=c0,path={q3},server=on,wait=off"),
        "52:54:00:00:00:02",
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.args=tcp-recv,5000+udp-recv,5001,3",
    );
    wait_until("guest b socket", 20, || Path::new(&q3).exists());
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "vm3",
            "type=vhost-user-client",
            &format!("path={q3}"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let vm1 = dir.join("vm1.sock").display().to_string();
    let _a = start_guest(
        &dir,
        &img,
        "a",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        "52:54:00:00:00:01",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.peer=10.0.0.2 ferrovs.wait=60 \
         ferrovs.args=tcp-send,10.0.0.2,5000,6,100+sleep,1+udp-send,10.0.0.2,5001,2000,10000,200",
    );
    wait_console(&dir, "b", &["FERROVS-LISTENING"], 120);
    wait_console(&dir, "a", &["FERROVS-PEER-UP"], 120);
    let mut upgrades = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(11) {
        std::thread::sleep(Duration::from_millis(1000));
        let o = cli(&dir, &["upgrade"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        upgrades += 1;
    }
    wait_console(&dir, "a", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 120);
    wait_console(&dir, "b", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 120);
    let show = cli_json(&dir, &["show"]);
    let stats = cli_json(&dir, &["port-stats"]);
    if let Some(pid) = show["pid"].as_u64() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let (ra, rb) = (results(&dir, "a"), results(&dir, "b"));
    assert_eq!((ra.len(), rb.len()), (2, 2), "a: {ra:?} b: {rb:?}");
    let drops = |p: &serde_json::Value| {
        (
            p["port"].clone(),
            p["rx"]["drops"].clone(),
            p["tx"]["drops"].clone(),
        )
    };
    let drops: Vec<_> = stats.as_array().unwrap().iter().map(drops).collect();
    eprintln!(
        "{upgrades} upgrades; tcp {} / {}; udp {} / {}",
        ra[0], rb[0], ra[1], rb[1]
    );
    assert_eq!(ra[0]["bytes"], rb[0]["bytes"], "every TCP byte arrived");
    assert_eq!(
        ra[0]["retransmits"], 0,
        "no TCP segment was lost: {}; switch drops: {drops:?}",
        ra[0]
    );
    assert_eq!(
        rb[1]["received"], 10_000,
        "{}; switch drops: {drops:?}",
        rb[1]
    );
    assert_eq!(rb[1]["lost"], 0, "{}", rb[1]);
    for p in show["bridges"][0]["ports"].as_array().unwrap() {
        if p["name"] != "vm2" {
            assert_eq!(p["connects"], 1, "no reconnect: {p}");
        }
    }
}
