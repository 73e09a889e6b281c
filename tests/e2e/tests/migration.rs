//! Live migration of real QEMU guests (TCG) attached to ferrovs: source and destination QEMU
//! on this host, each on its own port of one ferrovsd (`vma` for the source, `vmb` for the
//! destination), while a peer guest on `vm1` streams sequenced, pattern-filled UDP to the
//! migrating guest. What is checked:
//!
//! * memory: after a precopy migration both QEMUs are paused (the destination started with
//!   `-S`), and guest RAM saved on each side (`pmemsave`) must be identical page for page: a
//!   page the switch wrote into guest memory without logging it differs. Then the guest's
//!   receiver must report no corrupt and no duplicate datagram (a receive buffer that went
//!   stale across the migration shows up as one or the other);
//! * postcopy: pages the switch touches on the destination before they arrived must be
//!   fetched, not read as zeros;
//! * postcopy runs at 16 MiB/s, so that the stream reaches the destination for ~5 s while
//!   most pages are still on the source (at 32 MiB/s a TCG guest slow to refill its receive
//!   ring at the destination once had every page of it arrived before the first datagram);
//! * announce: the guest's MAC moves to the destination port in the switch's MAC table by an
//!   announce alone (the guests have static ARP entries and no IPv6, so the migrating guest
//!   sends nothing unasked): by the guest itself (VIRTIO_NET_F_GUEST_ANNOUNCE) after the
//!   precopy, by the switch on QEMU's request (SEND_RARP, `guest_announce=off`) after the
//!   postcopy;
//! * loss only around the switchover (from the source's stop to the MAC move, or to the end of
//!   a postcopy), bounded by that time and every datagram of it counted by a switch drop
//!   counter of a switchover reason; none after; no broken queue, the peer pings the guest.
//!
//! A first test migrates a guest without any switch port (`-netdev user`) the same ways: the
//! harness's own check (pmemsave comparison, postcopy on memfd RAM, the receiver's checks).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrovs_e2e::guest::*;
use ferrovs_e2e::*;
use serde_json::{json, Value};

/// The migrating guest and its peer.
const M_MAC: &str = "52:54:00:00:00:0a";
const P_MAC: &str = "52:54:00:00:00:02";
/// The peer's stream: datagrams per second, seconds, bytes per datagram.
const PPS: u64 = 2000;
const STREAM_SECS: u64 = 40;
const SIZE: u64 = 256;
/// VIRTIO_NET_F_GUEST_ANNOUNCE.
const GUEST_ANNOUNCE_BIT: usize = 21;

/// Pmemsave both paused sides into `dir` and compare; removes the images.
fn compare_paused_ram(dir: &Path, src: &mut Qmp, dst: &mut Qmp) -> RamComparison {
    assert_eq!(src.status(), "postmigrate");
    assert_eq!(dst.status(), "paused");
    let (a, b) = (dir.join("src.ram"), dir.join("dst.ram"));
    save_ram(src, &a);
    save_ram(dst, &b);
    let c = compare_ram(&a, &b);
    if c.differing == 0 {
        let _ = std::fs::remove_file(&a);
        let _ = std::fs::remove_file(&b);
    } else {
        eprintln!("RAM images kept: {} {}", a.display(), b.display());
    }
    c
}

/// Starts `name`, the migration destination of `g` (its NIC on `chardev` if given), listening
/// at `DIR/NAME.mig`, paused after the migration if `paused`; returns it, its process and its
/// monitor.
fn start_destination(
    dir: &Path,
    img: &Path,
    g: &Guest,
    name: &str,
    chardev: Option<&str>,
    paused: bool,
) -> (Guest, Proc, Qmp) {
    let uri = format!("unix:{}", dir.join(format!("{name}.mig")).display());
    let mut d = g.destination(name, chardev, &uri);
    d.paused = paused;
    let p = d.start(dir, img);
    let q = d.qmp(dir);
    (d, p, q)
}

fn quit(q: &mut Qmp) {
    // QEMU may close the monitor before it answers.
    let _ = q.execute("quit", json!({}));
}

/// The harness's own check, with no switch involved: a guest on QEMU's user network streams
/// UDP to itself over loopback (its memory keeps changing) and is migrated twice: precopy to a
/// destination started with `-S` (both sides' RAM identical once it completes), then from
/// there by postcopy (on the memfd RAM every test guest has). The guest's receiver sees
/// every datagram once, intact.
#[test]
fn harness_migrates_a_guest_without_a_switch_port_precopy_then_postcopy() {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("migration-harness");
    let mut g = Guest::new(
        "h0",
        "",
        M_MAC,
        "ferrovs.ip=10.0.2.15/24 ferrovs.cmd=tool \
         ferrovs.args=bg,udp-recv,5001,5,1+sleep,1+udp-send,127.0.0.1,5001,1000,25000,256",
    );
    g.nic = Nic::User;
    g.qmp = true;
    let _h0 = g.start(&dir, &img);
    let mut q0 = g.qmp(&dir);
    eprintln!("h0 on {} rings", assert_guest_ring(&dir, "h0", 120));
    wait_until("the stream inside h0", 120, || {
        progress(&console(&dir, "h0"))
            .last()
            .is_some_and(|p| p["received"].as_u64() >= Some(1000))
    });

    let (d1, _h1, mut q1) = start_destination(&dir, &img, &g, "h1", None, true);
    let m1 = migrate(
        &mut q0,
        &mut q1,
        &MigrateOpts::new(d1.incoming.as_ref().unwrap(), false),
    );
    eprintln!("precopy h0 -> h1: {}", m1.summary());
    assert_eq!(m1.status, "completed", "{}", m1.summary());
    let ram = compare_paused_ram(&dir, &mut q0, &mut q1);
    eprintln!("RAM: {ram:?}");
    assert_eq!(ram.pages, GUEST_RAM / 4096);
    assert_eq!(ram.differing, 0, "{ram:?}");
    q1.run("cont", json!({}));
    quit(&mut q0);
    // (Long enough for h1 to print progress of its own.)
    std::thread::sleep(Duration::from_secs(2));

    let (d2, _h2, mut q2) = start_destination(&dir, &img, &d1, "h2", None, false);
    let m2 = migrate(
        &mut q1,
        &mut q2,
        &MigrateOpts::new(d2.incoming.as_ref().unwrap(), true),
    );
    eprintln!("postcopy h1 -> h2: {}", m2.summary());
    assert_eq!(m2.status, "completed", "{}", m2.summary());
    assert!(
        m2.statuses.iter().any(|s| s == "postcopy-active"),
        "{:?}",
        m2.statuses
    );
    assert!(m2.stopped_ms().is_some(), "h2 runs: {}", m2.summary());
    quit(&mut q1);

    wait_console(&dir, "h2", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 120);
    let r = results(&dir, "h2");
    let rx = r
        .iter()
        .find(|x| x.get("received").is_some())
        .unwrap_or_else(|| panic!("{r:?}"));
    eprintln!("h0 -> h1 -> h2 loopback stream: {rx}");
    assert_eq!(
        (
            &rx["received"],
            &rx["lost"],
            &rx["corrupt"],
            &rx["duplicates"]
        ),
        (&json!(25000), &json!(0), &json!(0), &json!(0)),
        "{rx}"
    );
    // The stream ran before, between and after the migrations.
    for name in ["h0", "h1", "h2"] {
        assert!(
            !progress(&console(&dir, name)).is_empty(),
            "{name} printed progress"
        );
    }
}

/// A precopy migration under receive traffic, the guest announcing itself.
#[test]
fn precopy_under_receive_traffic_keeps_guest_memory_identical() {
    migration_under_traffic("migration-precopy", false, true);
}

/// A postcopy migration under receive traffic, announced by the switch (SEND_RARP).
#[test]
fn postcopy_under_receive_traffic_then_announce_by_rarp() {
    migration_under_traffic("migration-postcopy", true, false);
}

/// `after - before` of a port counter (`dir`: "rx" from the guest, "tx" to it).
fn delta(before: &Value, after: &Value, name: &str, dir: &str, key: &str) -> u64 {
    let v = |s: &Value| port_stats_of(s, name)[dir][key].as_u64().unwrap_or(0);
    v(after) - v(before)
}

/// Drops by reason, `after - before`, of one direction of a port (reasons that moved).
fn drop_delta(before: &Value, after: &Value, name: &str, dir: &str) -> Vec<(String, u64)> {
    let reasons = port_stats_of(after, name)[dir]["drops"]
        .as_object()
        .cloned();
    reasons
        .unwrap_or_default()
        .iter()
        .filter_map(|(k, v)| {
            let was = port_stats_of(before, name)[dir]["drops"][k]
                .as_u64()
                .unwrap_or(0);
            let d = v.as_u64().unwrap_or(0) - was;
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// A port's migration counters: its `migration` object and pages logged each way.
fn migration_counters(stats: &Value, name: &str) -> Value {
    let p = port_stats_of(stats, name);
    json!({
        "migration": p["migration"],
        "dirty_pages_logged": {"to_guest": p["tx"]["dirty_pages_logged"],
                               "from_guest": p["rx"]["dirty_pages_logged"]},
    })
}

/// Which port the switch has learned `mac` on, if any.
fn mac_port(dir: &Path, mac: &str) -> Option<String> {
    cli_json(dir, &["mac-table", "br0"])
        .as_array()?
        .iter()
        .find(|e| e["mac"] == mac)
        .and_then(|e| e["port"].as_str().map(String::from))
}

fn port_state(dir: &Path, name: &str) -> Value {
    let show = cli_json(dir, &["show"]);
    show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn migration_under_traffic(name: &str, postcopy: bool, guest_announce: bool) {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir(name);
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let (vma, vmb) = (
        add_vhost_user_port(&dir, "vma"),
        add_vhost_user_port(&dir, "vmb"),
    );
    let vm1 = dir.join("vm1.sock").display().to_string();

    // The migrating guest receives only; it knows its peer's MAC (no ARP of its own) and
    // has no IPv6 (whose router solicitations go on for an hour after boot): it sends nothing
    // unasked. The peer has no IPv6 either (its multicast would flood to the ports).
    let mut src = Guest::new(
        "m-src",
        &format!("socket,id=c0,path={vma},reconnect=1"),
        M_MAC,
        &format!(
            "ipv6.disable=1 ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool \
             ferrovs.neigh=10.0.0.2,{P_MAC} ferrovs.args=udp-recv,5001,10,1"
        ),
    );
    src.qmp = true;
    src.guest_announce = guest_announce;
    let _src_proc = src.start(&dir, &img);
    // The peer streams to it, and takes a `ping` command on its console later.
    let mut peer = Guest::new(
        "p",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        P_MAC,
        &format!(
            "ipv6.disable=1 ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.control=1 \
             ferrovs.neigh=10.0.0.1,{M_MAC} ferrovs.peer=10.0.0.1 ferrovs.wait=60 \
             ferrovs.args=udp-send,10.0.0.1,5001,{PPS},{},{SIZE}",
            PPS * STREAM_SECS
        ),
    );
    peer.control = true;
    let _peer_proc = peer.start(&dir, &img);
    let mut qs = src.qmp(&dir);

    // One second of the stream, without loss, before the migration.
    let before = {
        let t = Instant::now();
        loop {
            let p = progress(&console(&dir, "m-src"));
            if let Some(p) = p.iter().rfind(|p| p["received"].as_u64() >= Some(PPS)) {
                break p.clone();
            }
            assert!(
                t.elapsed() < Duration::from_secs(150),
                "no stream: m-src:\n{}\np:\n{}",
                console(&dir, "m-src"),
                console(&dir, "p")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    assert_eq!(
        (&before["lost"], &before["corrupt"]),
        (&json!(0), &json!(0)),
        "{before}"
    );
    assert_eq!(mac_port(&dir, M_MAC).as_deref(), Some("vma"));
    assert_ring(&dir, "vma", "m-src", 10);
    assert_ring(&dir, "vm1", "p", 10);

    // The destination, on vmb; paused after a precopy migration (RAM compared first).
    let chardev = format!("socket,id=c0,path={vmb},reconnect=1");
    let (dst, _dst_proc, mut qd) =
        start_destination(&dir, &img, &src, "m-dst", Some(&chardev), !postcopy);
    wait_until("m-dst connected to vmb", 20, || {
        port_state(&dir, "vmb")["state"] == "connected"
    });
    let stats0 = cli_json(&dir, &["port-stats"]);

    // The MAC table is watched from the start of the migration (in postcopy the
    // destination runs, and may be announced, before the migration has completed).
    let watch = MacWatch::start(&dir, M_MAC, "vmb");
    let mut opts = MigrateOpts::new(dst.incoming.as_ref().unwrap(), postcopy);
    if postcopy {
        // RAM (~85 MB in use) takes ~5 s to follow: the guest runs at the destination, and
        // the switch writes into its receive buffers there, while most pages have not arrived.
        opts.max_bandwidth = 16 << 20;
    }
    let mig = migrate(&mut qs, &mut qd, &opts);
    let completed = now_epoch();
    eprintln!("{name}: {}", mig.summary());
    assert_eq!(mig.status, "completed", "{}", mig.summary());
    if postcopy {
        assert!(
            mig.statuses.iter().any(|s| s == "postcopy-active"),
            "{:?}",
            mig.statuses
        );
    }
    let stop = mig.source_stop.expect("STOP event of the source");

    let mut ram = None;
    let resumed = if postcopy {
        mig.dest_resume.expect("the destination runs")
    } else {
        // Both sides paused: the switch wrote into guest memory up to the source's stop;
        // every page it wrote must have been logged, and sent again.
        let c = compare_paused_ram(&dir, &mut qs, &mut qd);
        eprintln!("{name}: RAM {c:?}");
        assert_eq!(c.pages, GUEST_RAM / 4096);
        assert_eq!(
            (c.differing, c.digest_a),
            (0, c.digest_b),
            "pages differ between source and destination: {c:?}"
        );
        ram = Some(c);
        qd.run("cont", json!({}));
        now_epoch()
    };

    // Announce: the MAC moves to vmb while the source still exists (stopped, its port
    // connected), and the guest sends nothing unasked (static ARP, no IPv6), so that
    // nothing but the announce moves it.
    let moved = watch.wait(Duration::from_secs(20)).unwrap_or_else(|| {
        panic!(
            "{M_MAC} not on vmb 20 s after the destination ran: {:?}; m-dst:\n{}",
            mac_port(&dir, M_MAC),
            console(&dir, "m-dst")
        )
    });
    let announce_ms = (moved - resumed) * 1e3;
    let features = nic_features(&console(&dir, "m-src")).expect("FERROVS-NIC line");
    assert_eq!(
        features.as_bytes().get(GUEST_ANNOUNCE_BIT) == Some(&b'1'),
        guest_announce,
        "GUEST_ANNOUNCE negotiated as configured: {features}"
    );
    quit(&mut qs);

    // The stream goes on at the destination. Loss and switch drops end with the switchover
    // (the MAC move, and in postcopy the last page): counted from 3 s later to the end of the
    // stream they stay as they are.
    let switched = moved.max(completed);
    std::thread::sleep(Duration::from_secs_f64(
        (switched + 3.0 - now_epoch()).clamp(0.0, 30.0),
    ));
    let after = progress(&console(&dir, "m-dst"))
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("m-dst: no progress:\n{}", console(&dir, "m-dst")));
    let stats_mid = cli_json(&dir, &["port-stats"]);
    console_command(&dir, "p", "ping 10.0.0.1 5");
    let ping = wait_console(&dir, "p", &["FERROVS-PING-OK", "FERROVS-PING-FAIL"], 60);
    wait_console(
        &dir,
        "m-dst",
        &["FERROVS-TOOL-DONE", "FERROVS-ERROR"],
        STREAM_SECS + 120,
    );
    let stats1 = cli_json(&dir, &["port-stats"]);
    let rx = results(&dir, "m-dst")
        .into_iter()
        .find(|r| r.get("received").is_some())
        .expect("receiver result");
    let tx = results(&dir, "p")
        .into_iter()
        .find(|r| r.get("sent").is_some())
        .expect("sender result");

    let lost = rx["lost"].as_u64().unwrap();
    let stopped_s = switched - stop;
    let path = [("vm1", "rx"), ("vma", "tx"), ("vmb", "tx")];
    let path_drops = |a: &Value, b: &Value| -> u64 {
        path.iter().map(|(p, d)| delta(a, b, p, d, "dropped")).sum()
    };
    let window: Vec<_> = path
        .iter()
        .map(|(p, d)| (*p, *d, drop_delta(&stats0, &stats_mid, p, d)))
        .collect();
    eprintln!(
        "{name}: announce {announce_ms:.0} ms after the destination ran ({}); source stop to \
         the end of the switchover {:.0} ms; stream before {before}, after the switchover {after}, at the end \
         {rx}; sender {tx}; switch drops around the switchover {window:?}, after it {}; \
         RAM {ram:?}; vma {}; vmb {}",
        if guest_announce {
            "guest announce"
        } else {
            "SEND_RARP"
        },
        stopped_s * 1e3,
        path_drops(&stats_mid, &stats1),
        migration_counters(&stats1, "vma"),
        migration_counters(&stats1, "vmb"),
    );

    assert_eq!(ping, "FERROVS-PING-OK", "{}", console(&dir, "p"));
    assert_eq!(
        (&rx["corrupt"], &rx["duplicates"]),
        (&json!(0), &json!(0)),
        "no stale receive buffer: {rx}"
    );
    assert_eq!(tx["send_errors"], 0, "{tx}");
    assert_eq!(rx["lost"], after["lost"], "no loss after the switchover");
    assert_eq!(
        path_drops(&stats_mid, &stats1),
        0,
        "no switch drop on the path after the switchover"
    );
    assert!(
        rx["received"].as_u64() > after["received"].as_u64().map(|r| r + PPS),
        "the stream went on after the switchover: {after} .. {rx}"
    );
    assert!(
        (lost as f64) <= PPS as f64 * (stopped_s + 0.5),
        "lost {lost} > {PPS}/s x ({stopped_s:.2} s from the source's stop to the MAC move or \
         the migration's end + 0.5 s)"
    );
    // Around the switchover: every datagram lost was dropped, and counted, by the switch on
    // its way (or by the guest's stack), for a reason of the switchover only: the source's
    // queues stopped, the destination's not yet refilled by its guest or their pages not
    // yet arrived (postcopy). (The switch drops a few more: broadcasts, flooded to the
    // stopped port too.)
    let accounted = path_drops(&stats0, &stats_mid) + rx["in_errors"].as_u64().unwrap_or(0);
    assert!(
        lost <= accounted,
        "lost {lost} > {accounted} counted by the switch and the guest: {window:?}"
    );
    for (p, d, reasons) in &window {
        for (r, _) in reasons {
            assert!(
                [
                    "queue_not_ready",
                    "guest_no_rx_buffers",
                    "postcopy_page_pending"
                ]
                .contains(&r.as_str()),
                "{p} {d}: drops for {r}: {window:?}"
            );
        }
    }
    for p in stats1.as_array().unwrap() {
        for q in p["queues"].as_array().unwrap() {
            assert!(q["broken"].is_null(), "{}: {q}", p["port"]);
        }
        for d in ["rx", "tx"] {
            for r in GUEST_ERRORS {
                assert!(p[d]["drops"][r].is_null(), "{} {d}: {}", p["port"], p[d]);
            }
        }
    }
    // The switch logged the pages it wrote while the source migrated precopy (a postcopy
    // may switch over before the switch wrote any); at the destination of a postcopy it
    // registered the guest's memory for the migration (POSTCOPY_LISTEN) and ended it, and
    // every page it found missing was brought in (whether any was missing depends on
    // whether the guest's RX buffers arrived before the switch wrote into them: CI saw
    // runs with none). It announced the guest itself only when asked to (SEND_RARP, a
    // guest without GUEST_ANNOUNCE).
    if postcopy {
        let m = &port_stats_of(&stats1, "vmb")["migration"];
        assert_eq!(m["postcopy_listens"].as_u64(), Some(1), "{m}");
        assert_eq!(m["postcopy"].as_bool(), Some(false), "postcopy ended: {m}");
        let missing = m["postcopy_pages_missing"].as_u64().unwrap_or(0);
        eprintln!(
            "migration-postcopy: the switch found {missing} pages missing at the destination"
        );
    } else {
        assert!(
            delta(&stats0, &stats1, "vma", "tx", "dirty_pages_logged") > 0,
            "pages logged: {}",
            port_stats_of(&stats1, "vma")
        );
    }
    let rarps = port_stats_of(&stats1, "vmb")["migration"]["rarp_announces"].as_u64();
    if guest_announce {
        assert_eq!(rarps, Some(0), "{}", port_stats_of(&stats1, "vmb"));
    } else {
        assert!(rarps >= Some(1), "{}", port_stats_of(&stats1, "vmb"));
    }
    // The destination's port goes on with the layout the source negotiated (QEMU sets the
    // destination's rings up from the migrated device state).
    eprintln!("{name}: on {} rings", assert_port_ring(&dir, "vmb"));
    let b = port_state(&dir, "vmb");
    assert_eq!(
        (&b["state"], &b["connects"]),
        (&json!("connected"), &json!(1)),
        "{b}"
    );
}

/// Watches the switch's MAC table from a thread: when a MAC is first seen on a port.
struct MacWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Option<f64>>,
}

impl MacWatch {
    fn start(dir: &Path, mac: &str, port: &str) -> MacWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, mac, port, s) = (
            dir.to_path_buf(),
            mac.to_string(),
            port.to_string(),
            stop.clone(),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if mac_port(&dir, &mac).as_deref() == Some(port.as_str()) {
                    return Some(now_epoch());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            None
        });
        MacWatch { stop, thread }
    }

    /// The time (seconds since the epoch) the MAC was first seen there, waiting up to
    /// `timeout` more.
    fn wait(self, timeout: Duration) -> Option<f64> {
        let t = Instant::now();
        while !self.thread.is_finished() && t.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}
