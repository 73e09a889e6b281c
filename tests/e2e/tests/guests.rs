//! Real Linux guests (QEMU, TCG) on ferrovs ports, in both vhost-user socket modes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ferrovs_e2e::guest::*;
use ferrovs_e2e::*;

/// The usual pair, one guest per socket mode: guest B listens (QEMU `server=on`) and ferrovs
/// connects to it as port vm3 (`vhost-user-client`); guest A connects to ferrovs's port vm1,
/// which listens. `b` and `a` are their kernel command lines. Returns (A, B).
fn guests_in_both_modes(dir: &Path, img: &Path, b: &str, a: &str) -> (Proc, Proc) {
    let q3 = dir.join("q3.sock").display().to_string();
    let guest_b = start_guest(
        dir,
        img,
        "b",
        &format!("socket,id=c0,path={q3},server=on,wait=off"),
        "52:54:00:00:00:02",
        b,
    );
    wait_until("guest b socket", 20, || Path::new(&q3).exists());
    let o = cli(
        dir,
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
    let guest_a = start_guest(
        dir,
        img,
        "a",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        "52:54:00:00:00:01",
        a,
    );
    (guest_a, guest_b)
}

/// Per port, the frames the switch dropped in each direction (`port-stats`).
fn dropped_by_port(stats: &serde_json::Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    stats
        .as_array()
        .expect("port-stats is an array")
        .iter()
        .map(|p| {
            let n = |d: &str| p[d]["dropped"].as_u64().expect("a drop count");
            (
                p["port"].as_str().unwrap_or("").to_string(),
                (n("rx"), n("tx")),
            )
        })
        .collect()
}

#[test]
fn two_guests_ping_through_ferrovs_in_both_socket_modes() {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    // Guest B listens (QEMU server=on) and ferrovs connects to it: port type vhost-user-client.
    let (_a, _b) = guests_in_both_modes(
        &dir,
        &img,
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=idle",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=ping ferrovs.peer=10.0.0.2 ferrovs.count=5",
    );
    wait_console(&dir, "b", &["FERROVS-GUEST-READY 52:54:00:00:00:02"], 90);
    assert_ring(&dir, "vm3", "b", 10);
    // (A powers off once its pings are done: its layout is checked while it pings.)
    let ring = assert_ring(&dir, "vm1", "a", 120);
    let verdict = wait_console(&dir, "a", &["FERROVS-PING-OK", "FERROVS-PING-FAIL"], 120);
    let st = cli_json(&dir, &["port-stats"]);
    assert_eq!(verdict, "FERROVS-PING-OK", "port stats: {st}");
    eprintln!("both socket modes on {ring} rings");
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
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests-upgrade");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let (_a, _b) = guests_in_both_modes(
        &dir,
        &img,
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=idle",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=ping ferrovs.peer=10.0.0.2 ferrovs.count=150 \
         ferrovs.interval=0.1 ferrovs.wait=60",
    );
    wait_console(&dir, "a", &["FERROVS-PEER-UP"], 120);
    assert_ring(&dir, "vm1", "a", 10);
    assert_ring(&dir, "vm3", "b", 10);
    let pid0 = cli_json(&dir, &["show"])["pid"].clone();
    let mut last_pid = pid0.clone();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(1500));
        let o = cli(&dir, &["upgrade"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        last_pid = cli_json(&dir, &["show"])["pid"].clone();
    }
    // (Before guest A powers off at the end of its pings.) The new daemon goes on with the
    // layout the guests negotiated.
    let ring = assert_port_ring(&dir, "vm1");
    assert_port_ring(&dir, "vm3");
    eprintln!("5 upgrades on {ring} rings");
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

/// A TCP stream (paced at 100 Mbit/s, below what TCG guests sustain, so that congestion
/// causes no loss of its own) and then a sequenced UDP stream between two real guests while
/// the switch is hot-upgraded every second: the TCP sender retransmits nothing, every byte
/// arrives, and no UDP datagram is lost.
#[test]
fn guest_tcp_and_udp_streams_survive_hot_upgrades() {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests-streams");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let (_a, _b) = guests_in_both_modes(
        &dir,
        &img,
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.args=tcp-recv,5000+udp-recv,5001,3",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.peer=10.0.0.2 ferrovs.wait=60 \
         ferrovs.args=tcp-send,10.0.0.2,5000,6,100+sleep,1+udp-send,10.0.0.2,5001,2000,10000,200",
    );
    wait_console(&dir, "b", &["FERROVS-LISTENING"], 120);
    wait_console(&dir, "a", &["FERROVS-PEER-UP"], 120);
    assert_ring(&dir, "vm1", "a", 10);
    assert_ring(&dir, "vm3", "b", 10);
    // Drops from here on: before b's NIC is up, a's ARP requests for it (a waits for its
    // peer) are flooded to b's port and counted there as `queue_not_ready`.
    let drops_before = dropped_by_port(&cli_json(&dir, &["port-stats"]));
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
    let ring = assert_port_ring(&dir, "vm1");
    assert_port_ring(&dir, "vm3");
    let show = cli_json(&dir, &["show"]);
    let stats = cli_json(&dir, &["port-stats"]);
    if let Some(pid) = show["pid"].as_u64() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    eprintln!("streams on {ring} rings");
    let (ra, rb) = (results(&dir, "a"), results(&dir, "b"));
    assert_eq!((ra.len(), rb.len()), (2, 2), "a: {ra:?} b: {rb:?}");
    // Where frames were dropped, if anywhere (a retransmission's cause).
    let drops: Vec<String> = stats
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} rx {} tx {}",
                p["port"], p["rx"]["drops"], p["tx"]["drops"]
            )
        })
        .collect();
    eprintln!(
        "{upgrades} upgrades; tcp {} / {}; udp {} / {}; switch drops: {} (dropped before the \
         streams: {drops_before:?})",
        ra[0],
        rb[0],
        ra[1],
        rb[1],
        drops.join(", ")
    );
    assert_eq!(ra[0]["bytes"], rb[0]["bytes"], "every TCP byte arrived");
    // No segment was lost on the way: the switch dropped nothing between the guests, and the
    // sender saw no loss (no fast retransmit, no timeout, no loss recovered by a probe). A
    // tail-loss probe alone is not a loss: Linux sends one when an ACK is ~2 RTTs late, and
    // an upgrade's pause (or the TCG guest being descheduled) can delay one that much on a
    // sub-millisecond path.
    let drops_after = dropped_by_port(&stats);
    for (port, (rx, tx)) in &drops_after {
        if port != "vm2" {
            let (rx0, tx0) = drops_before.get(port).copied().unwrap_or((0, 0));
            assert_eq!(
                (rx - rx0, tx - tx0),
                (0, 0),
                "switch drops on the guests' path while they streamed: {port} \
                 (before the streams {drops_before:?}); all drops: {drops:?}"
            );
        }
    }
    let g = |k: &str| ra[0][k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        (
            g("fast_retransmits"),
            g("timeouts"),
            g("loss_probe_recoveries")
        ),
        (0, 0, 0),
        "no TCP segment was lost: {}; switch drops: {drops:?}",
        ra[0]
    );
    assert!(
        g("retransmits") <= g("loss_probes"),
        "every retransmission was a tail-loss probe: {}",
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

/// The console of a guest split into boots (each starts with the firmware's banner).
fn boots(dir: &Path, name: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(
        &std::fs::read(dir.join(format!("{name}.console"))).unwrap_or_default(),
    )
    .to_string();
    text.split("SeaBIOS (version")
        .skip(1)
        .map(str::to_string)
        .collect()
}

fn rcvd(p: &serde_json::Value) -> u64 {
    p["received"].as_u64().unwrap_or(0)
}

/// Waits until `f` finds what it wants in the boots of a guest's console; returns it.
fn wait_boots<T>(
    dir: &Path,
    name: &str,
    what: &str,
    secs: u64,
    mut f: impl FnMut(&[String]) -> Option<T>,
) -> T {
    let t = Instant::now();
    loop {
        let b = boots(dir, name);
        if let Some(v) = f(&b) {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "{name}: no {what} within {secs}s:\n{}",
            b.join("\n=== next boot ===\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A guest reboots (`reboot -f`: QEMU resets the virtio device, the guest's driver sets it up
/// again over the same vhost-user connection: GET_VRING_BASE, new rings) and then resets its
/// NIC driver without reboot (rmmod/insmod virtio_net), while another guest sends it a
/// sequenced UDP stream at 200 pps. After each, the stream resumes and no datagram is lost
/// once it has; the daemon stays the same process, neither vhost-user connection drops, no
/// queue is broken and the sender's port drops nothing. The rebooting guest listens (QEMU
/// server=on, ferrovs port type vhost-user-client).
#[test]
fn guest_reboot_and_driver_reset_keep_the_switch_and_the_other_port_going() {
    reboot_and_reset("vhost-user-client");
}

/// The same with ferrovs listening for the rebooting guest (port type vhost-user).
#[test]
fn guest_reboot_and_driver_reset_with_ferrovs_listening() {
    reboot_and_reset("vhost-user");
}

fn reboot_and_reset(mode: &str) {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir(&format!("guests-reboot-{mode}"));
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let pid = daemon_pid(&dir);
    // B receives and takes commands on its console.
    let q3 = dir.join("q3.sock").display().to_string();
    let vm2 = dir.join("vm2.sock").display().to_string();
    let (port_b, chardev_b) = if mode == "vhost-user-client" {
        ("vm3", format!("socket,id=c0,path={q3},server=on,wait=off"))
    } else {
        ("vm2", format!("socket,id=c0,path={vm2},reconnect=1"))
    };
    let mut b = Guest::new(
        "b",
        &chardev_b,
        "52:54:00:00:00:02",
        "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.control=1 \
         ferrovs.args=udp-recv,5001,600,1",
    );
    b.reboot = true;
    b.control = true;
    let _b = b.start(&dir, &img);
    if mode == "vhost-user-client" {
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
    }
    // A (ferrovs listens) sends for up to 300 s; the test ends long before.
    let vm1 = dir.join("vm1.sock").display().to_string();
    let _a = start_guest(
        &dir,
        &img,
        "a",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        "52:54:00:00:00:01",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.peer=10.0.0.2 ferrovs.wait=60 \
         ferrovs.args=udp-send,10.0.0.2,5001,200,60000,64",
    );
    wait_console(&dir, "a", &["FERROVS-PEER-UP"], 120);
    assert_ring(&dir, "vm1", "a", 10);
    assert_ring(&dir, port_b, "b", 10);

    // Boot 1: the stream flows without loss (A starts when B answers pings, which may be
    // before B's receiver is bound: loss counts from the first datagram received).
    let before = wait_boots(&dir, "b", "2 s of the stream in boot 1", 60, |b| {
        progress(&b[0])
            .into_iter()
            .rfind(|p| p["received"].as_u64() >= Some(400))
    });
    assert_eq!(before["lost"], 0, "{before}");
    console_command(&dir, "b", "reboot");

    // Boot 2: the same initramfs and command line boot again; the stream resumes where the
    // sender is now (A never stopped), and once it has, nothing is lost.
    let boot2 = wait_boots(&dir, "b", "2 s of the stream in boot 2", 120, |b| {
        let p = progress(b.get(1)?);
        let first = p.first()?.clone();
        let later = p.iter().rfind(|x| rcvd(x) >= 400)?.clone();
        Some((first, later))
    });
    let (first2, before_reset) = boot2;
    assert!(
        first2["first"].as_u64() > before["last"].as_u64(),
        "boot 2 resumes the running stream: {first2} after {before}"
    );
    assert_eq!(before_reset["lost"], 0, "{before_reset}");
    let b2 = boots(&dir, "b")[1].clone();
    assert!(b2.contains("FERROVS-GUEST-READY 52:54:00:00:00:02"), "{b2}");

    // A driver reset without reboot.
    console_command(&dir, "b", "reset-nic");
    let after = wait_boots(
        &dir,
        "b",
        "2 s of the stream after the NIC reset",
        90,
        |b| {
            let text = b.get(1)?;
            let (_, after) = text.split_once("FERROVS-NIC-RESET-DONE")?;
            let p = progress(after);
            let resumed = p
                .iter()
                .find(|x| x["received"].as_u64() > before_reset["received"].as_u64())?
                .clone();
            let later = p.iter().rfind(|x| rcvd(x) >= rcvd(&resumed) + 400)?.clone();
            Some((resumed, later))
        },
    );
    let (resumed, later) = after;
    assert_eq!(
        later["lost"], resumed["lost"],
        "nothing lost once the stream resumed after the reset: {resumed} .. {later}"
    );
    assert_eq!(boots(&dir, "b").len(), 2, "no third boot");
    // The driver set the device up again on the same layout, after the reboot and the reset.
    for text in boots(&dir, "b") {
        for part in text.split("FERROVS-NIC-RESET-DONE") {
            if let Some(bits) = nic_features(part) {
                assert_eq!(
                    bits.as_bytes().get(RING_PACKED_BIT) == Some(&b'1'),
                    guest_ring() == Ring::Packed,
                    "b re-negotiated {bits}"
                );
            }
        }
    }
    eprintln!(
        "{mode}: reboot and reset on {} rings",
        assert_port_ring(&dir, port_b)
    );

    let show = cli_json(&dir, &["show"]);
    let stats = cli_json(&dir, &["port-stats"]);
    assert_eq!(show["pid"].as_u64(), Some(pid), "the same daemon serves");
    assert!(alive(pid));
    let ours = |name: &serde_json::Value| name == "vm1" || name == port_b;
    for p in show["bridges"][0]["ports"].as_array().unwrap() {
        if ours(&p["name"]) {
            assert_eq!(p["state"], "connected", "{p}");
            assert_eq!(p["connects"], 1, "no reconnect: {p}");
            assert_eq!(p["disconnects"], 0, "no disconnect: {p}");
            assert_eq!(p["ready_queues"], 2, "{p}");
        }
    }
    for p in stats.as_array().unwrap() {
        for q in p["queues"].as_array().unwrap() {
            assert!(q["broken"].is_null(), "{}: {q}", p["port"]);
            assert!(
                q["ready"] == true || !ours(&p["port"]),
                "{}: {q}",
                p["port"]
            );
        }
        for d in ["rx", "tx"] {
            for r in GUEST_ERRORS {
                assert!(p[d]["drops"][r].is_null(), "{} {d}: {}", p["port"], p[d]);
            }
        }
        if p["port"] == "vm1" {
            assert_eq!(
                p["rx"]["dropped"], 0,
                "the sender's port drops nothing: {p}"
            );
        }
    }
    eprintln!(
        "{mode}: boot 1: {before}\nboot 2: {first2} .. {before_reset}\nafter reset: {resumed} .. \
         {later}\n{port_b} to-guest: {}",
        stats
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["port"] == port_b)
            .unwrap()["tx"]
    );
}

/// Packets per queue of a port from `port-stats`: (to-guest, from-guest), by queue pair.
fn per_pair(stats: &serde_json::Value, port: &str) -> (Vec<u64>, Vec<u64>) {
    let p = stats
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == port)
        .unwrap_or_else(|| panic!("no port {port}: {stats}"));
    let (mut to, mut from) = (Vec::new(), Vec::new());
    for q in p["queues"].as_array().unwrap() {
        let n = q["stats"]["packets"].as_u64().unwrap();
        match q["direction"].as_str() {
            Some("to-guest") => to.push(n),
            _ => from.push(n),
        }
    }
    (to, from)
}

/// Multiqueue guests: two 4-vCPU guests with 4 queue pairs each (`mq=on`; the guest driver
/// enables min(vCPUs, pairs) = 4 at probe), XPS off so that each flow's TX queue follows
/// its hash, send each other 16 sequenced UDP flows at once. Every datagram arrives, and on
/// both ports more than one queue pair carried traffic in each direction: from the guest by
/// the guest's hash, to the guest because the switch runs two PMDs here, each preferring its
/// own queue pair of the destination.
#[test]
fn multiqueue_guests_spread_flows_over_queue_pairs_without_loss() {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("guests-mq");
    let (pmd, other) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    // Two PMDs (on a one-core machine one: the to-guest spread is then not checked).
    let two_pmds = pmd != other;
    let pmds = if two_pmds {
        format!("{other},{pmd}")
    } else {
        pmd.to_string()
    };
    for args in [
        &["config", "set", "pmd-cores", &pmds][..],
        &["del-port", "br0", "vm1"],
        &["del-port", "br0", "vm2"],
    ] {
        let o = cli(&dir, args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (flows, pps, count) = (16, 50, 400);
    let mut procs = Vec::new();
    for (name, me, peer, mac) in [
        ("a", "10.0.0.1", "10.0.0.2", "52:54:00:00:00:01"),
        ("b", "10.0.0.2", "10.0.0.1", "52:54:00:00:00:02"),
    ] {
        let sock = dir.join(format!("mq{name}.sock")).display().to_string();
        let o = cli(
            &dir,
            &[
                "add-port",
                "br0",
                &format!("mq{name}"),
                "type=vhost-user",
                &format!("path={sock}"),
                "queues=4",
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wait_until("port socket", 10, || Path::new(&sock).exists());
        let chardev = format!("socket,id=c0,path={sock},reconnect=1");
        // Both listen first, wait for the peer, give it time to listen too, then send.
        let append = format!(
            "ferrovs.ip={me}/24 ferrovs.cmd=tool ferrovs.peer={peer} ferrovs.wait=60 \
             ferrovs.xps=off ferrovs.args=bg,udp-recv-flows,6000,{flows},5+sleep,5+\
             udp-send-flows,{peer},6000,{flows},{pps},{count},64"
        );
        let mut g = Guest::new(name, &chardev, mac, &append);
        g.smp = 4;
        g.queues = 4;
        procs.push(g.start(&dir, &img));
    }
    for name in ["a", "b"] {
        wait_console(&dir, name, &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 120);
    }
    assert_ring(&dir, "mqa", "a", 10);
    assert_ring(&dir, "mqb", "b", 10);
    let stats = cli_json(&dir, &["port-stats"]);
    let show = cli_json(&dir, &["show"]);
    drop(procs);
    for name in ["a", "b"] {
        let console = std::fs::read_to_string(dir.join(format!("{name}.console"))).unwrap();
        assert!(
            console.contains("FERROVS-NIC queues=4 "),
            "{name}: {console}"
        );
        let r = results(&dir, name);
        let recv = r
            .iter()
            .find(|x| x.get("received").is_some())
            .unwrap_or_else(|| panic!("{name}: {console}"));
        let sent = r.iter().find(|x| x.get("sent").is_some()).unwrap();
        eprintln!("{name}: sent {sent}\n{name}: received {recv}");
        assert_eq!(sent["send_errors"], 0, "{name}: {sent}");
        assert_eq!(recv["received"], flows * count, "{name}: {recv}");
        assert_eq!(recv["lost"], 0, "{name}: {recv}");
    }
    for port in ["mqa", "mqb"] {
        let p = show["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == port)
            .unwrap();
        assert_eq!(p["ready_queues"], 8, "{p}");
        assert!(
            p["features"].as_array().unwrap().iter().any(|f| f == "mq"),
            "{p}"
        );
        let (to, from) = per_pair(&stats, port);
        eprintln!("{port}: packets per queue pair to the guest {to:?}, from the guest {from:?}");
        let used = |v: &[u64]| v.iter().filter(|&&n| n > 0).count();
        assert!(used(&from) > 1, "{port}: from-guest {from:?}");
        assert!(!two_pmds || used(&to) > 1, "{port}: to-guest {to:?}");
        assert!(
            from.iter().sum::<u64>() >= flows * count,
            "{port}: from-guest {from:?}"
        );
    }
    // (A few frames to a guest may be dropped while it boots: queue_not_ready, or
    // guest_no_rx_buffers before its driver has posted buffers. The flows lost nothing.)
    for p in stats.as_array().unwrap() {
        assert_eq!(p["rx"]["dropped"], 0, "{p}");
        for q in p["queues"].as_array().unwrap() {
            assert!(q["broken"].is_null(), "{}: {q}", p["port"]);
        }
        for r in GUEST_ERRORS {
            assert!(p["tx"]["drops"][r].is_null(), "{p}");
        }
    }
}

/// A real guest (checksum and TSO negotiated: its stack sends 64 KiB TCP segments with
/// partial checksums) streams TCP to a network namespace behind an uplink, which takes no
/// offload: ferrovs segments and checksums in software. The frames on the uplink's wire are
/// captured and checked (every one at most 1514 bytes, valid IPv4 and TCP checksums), every
/// byte arrives, and the receiving kernel, which checks every checksum, acknowledged them.
#[test]
fn guest_tso_to_an_uplink_without_offloads_is_segmented_on_the_wire() {
    let ok = guests_available()
        && require(
            is_root() && have("ip") && have("tcpdump") && have("ethtool"),
            "root, iproute2, tcpdump, ethtool (network namespace, capture)",
        );
    if !ok {
        return;
    }
    let img = guest_image();
    let tool = repo().join("target/guest-tool/x86_64-unknown-linux-gnu/release/ferrovs-guest");
    let dir = run_dir("guests-tso");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let mut net = Net::new();
    let ns = Net::name("nst-");
    let (uplink, veth) = (Net::name("u"), Net::name("v"));
    net.netns(&ns);
    net.veth_into(&uplink, &veth, &ns, "10.0.0.9/24");
    // No GRO where we capture: the frames as they came off the "wire".
    let _ = Net::exec(&ns, &["ethtool", "-K", &veth, "gro", "off"]);
    let o = cli(
        &dir,
        &[
            "add-port",
            "br0",
            "u1",
            "type=uplink",
            &format!("dev={uplink}"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pcap = dir.join("wire.pcap");
    let dump = Command::new("ip")
        .args([
            "netns", "exec", &ns, "tcpdump", "-i", &veth, "-Q", "in", "-nn", "-U",
        ])
        .args(["-c", "5000", "-w"])
        .arg(&pcap)
        .args(["tcp", "port", "5000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let recv_out = dir.join("ns-recv.out");
    let recv = Command::new("ip")
        .args(["netns", "exec", &ns, "timeout", "120"])
        .arg(&tool)
        .arg("tcp-recv")
        .arg("5000")
        .stdout(std::fs::File::create(&recv_out).unwrap())
        .spawn()
        .unwrap();
    let vm1 = dir.join("vm1.sock").display().to_string();
    let _a = start_guest(
        &dir,
        &img,
        "a",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        "52:54:00:00:00:01",
        "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.peer=10.0.0.9 ferrovs.wait=60 \
         ferrovs.args=tcp-send,10.0.0.9,5000,4",
    );
    wait_console(&dir, "a", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 180);
    let ring = assert_ring(&dir, "vm1", "a", 10);
    let show = cli_json(&dir, &["show"]);
    let u1 = cli_json(&dir, &["port-stats", "u1"])[0].clone();
    let _ = wait_status(recv, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    let _ = Command::new("pkill")
        .args(["-INT", "-f", &format!("tcpdump -i {veth} ")])
        .status();
    let _ = wait_status(dump, Duration::from_secs(5));
    if let Some(pid) = show["pid"].as_u64() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let vm1p = show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "vm1")
        .unwrap();
    assert!(
        vm1p["offloads"]["sends"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "tso4"),
        "the guest negotiated TSO: {vm1p}"
    );
    let ra = results(&dir, "a");
    let got = std::fs::read_to_string(&recv_out).unwrap_or_default();
    let rb: Vec<serde_json::Value> = got
        .lines()
        .filter_map(|l| l.split_once("FERROVS-RESULT ").map(|(_, j)| j.trim()))
        .filter_map(|j| serde_json::from_str(j).ok())
        .collect();
    assert_eq!((ra.len(), rb.len()), (1, 1), "a: {ra:?} namespace: {got}");
    assert!(ra[0]["bytes"].as_u64().unwrap() > 1_000_000, "{}", ra[0]);
    assert_eq!(ra[0]["bytes"], rb[0]["bytes"], "every TCP byte arrived");
    let tso = u1["offload"]["sw_tso"].as_u64().unwrap();
    let segs = u1["offload"]["sw_segments"].as_u64().unwrap();
    assert!(
        tso > 0 && segs > 2 * tso,
        "the guest's TSO packets were segmented: {u1}"
    );
    let frames = pcap_frames(&pcap);
    assert!(frames.len() >= 1000, "{} frames captured", frames.len());
    for (i, (orig, f)) in frames.iter().enumerate() {
        assert!(*orig <= 1514, "frame {i} of {orig} bytes on the wire");
        assert_eq!(
            ferrovs_packet::offload::tcp_checksums_ok(f),
            Some(true),
            "frame {i}: bad checksum"
        );
    }
    eprintln!(
        "guest -> uplink on {ring} rings: {} ({} TSO packets cut into {} segments; {} wire \
         frames checked)",
        rb[0],
        tso,
        segs,
        frames.len()
    );
    drop(net);
}

fn wait_status(mut c: std::process::Child, t: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < t {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    c.wait().ok()
}
