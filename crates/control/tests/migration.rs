//! Live migration, switch side, in process: mock guests play QEMU's part of the protocol
//! (dirty log, postcopy with a real userfaultfd, SEND_RARP). Real QEMU migrations are in
//! `tests/e2e/tests/migration.rs`.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrovs_packet::build;
use ferrovs_proto::Request;
use ferrovs_sys::guest::dirty_log::DirtyLog;
use ferrovs_vhost::features::VHOST_F_LOG_ALL;
use ferrovs_vhost::frontend::FrontendConfig;
use ferrovs_vhost::msg::{self, payload, Code};

mod common;
use common::*;

const A: u64 = 0x0200_0000_0001;
const B: u64 = 0x0200_0000_0002;
const C: u64 = 0x0200_0000_0003;

fn two_guests(name: &str) -> (Switch, Guest, Guest) {
    let sw = Switch::start(name);
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let a = attach(&sw.sock("vm1"), A, FrontendConfig::default());
    let b = attach(&sw.sock("vm2"), B, FrontendConfig::default());
    (sw, a, b)
}

/// Pages of `[gpa, gpa + len)`.
fn pages(gpa: u64, len: u64) -> std::ops::RangeInclusive<u64> {
    gpa / 4096..=(gpa + len - 1) / 4096
}

/// Every page whose bit is set, clearing them (what QEMU does on each pass).
fn take_marked(log: &DirtyLog) -> Vec<u64> {
    let mut v = Vec::new();
    for w in 0..log.size().div_ceil(8) {
        let bits = log.take_word(w);
        for b in 0..64 {
            if bits & (1 << b) != 0 {
                v.push(64 * w + b);
            }
        }
    }
    v
}

#[test]
fn dirty_log_marks_exactly_the_pages_the_switch_writes() {
    let (sw, mut a, mut b) = two_guests("mig-log");
    assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
    let log = b.fe.start_logging().expect("logging starts");
    let ((rx_used, rx_used_len), (rx_bufs, rx_bufs_len)) = b.fe.queue_areas(0);
    let ((tx_used, tx_used_len), _) = b.fe.queue_areas(1);
    let rx_used_pages: Vec<u64> = pages(rx_used, rx_used_len).collect();
    let tx_used_pages: Vec<u64> = pages(tx_used, tx_used_len).collect();
    let _ = take_marked(&log);

    // Guest RX: 1000 frames of 1000 bytes cycle through all 256 receive buffers (2 KiB each,
    // two per page): every buffer page and the used ring's are written by the switch.
    let got = exchange(&mut a, &mut b, 1000, 1000);
    assert_eq!(got.len(), 1000);
    let marked = take_marked(&log);
    for p in pages(rx_bufs, rx_bufs_len).chain(rx_used_pages.iter().copied()) {
        assert!(
            marked.contains(&p),
            "page {p} written by the switch, not logged"
        );
    }
    let allowed = |p: &u64| {
        pages(rx_bufs, rx_bufs_len).contains(p)
            || rx_used_pages.contains(p)
            || tx_used_pages.contains(p)
    };
    let stray: Vec<_> = marked.iter().filter(|p| !allowed(p)).collect();
    assert!(
        stray.is_empty(),
        "pages the switch never writes were logged: {stray:?}"
    );
    let s = sw.port_stats("vm2");
    assert!(s["tx"]["dirty_pages_logged"].as_u64().unwrap() >= 128);
    assert_eq!(s["migration"]["logging"], true);

    // Guest TX: the switch writes only the used ring of b's transmit queue.
    assert_eq!(exchange(&mut b, &mut a, 300, 64).len(), 300);
    let marked = take_marked(&log);
    for p in &tx_used_pages {
        assert!(marked.contains(p), "transmit used ring page {p} not logged");
    }
    assert!(
        marked
            .iter()
            .all(|p| tx_used_pages.contains(p) || rx_used_pages.contains(p)),
        "guest TX logged pages outside the used rings: {marked:?}"
    );

    // Logging off: nothing is marked any more.
    b.fe.stop_logging().unwrap();
    let _ = take_marked(&log);
    assert_eq!(exchange(&mut a, &mut b, 500, 1000).len(), 500);
    assert_eq!(
        take_marked(&log),
        Vec::<u64>::new(),
        "logged with LOG_ALL off"
    );
    assert_eq!(sw.port_stats("vm2")["migration"]["logging"], false);
    assert_eq!(sw.port_stats("vm2")["tx"]["dropped"], 0);
}

#[test]
fn a_missing_or_broken_log_never_lets_the_switch_write_unlogged() {
    let (sw, mut a, mut b) = two_guests("mig-badlog");
    assert_eq!(exchange(&mut a, &mut b, 50, 64).len(), 50);
    // A log the fd does not hold: refused with a non-zero answer, counted.
    let fd = ferrovs_sys::os::memfd("small-log", 4096, false).unwrap();
    let m = msg::encode(Code::SetLogBase as u32, 0, &payload::log(1 << 20, 0));
    let (h, p, _) = b.fe.call_raw(&m, &[fd.as_raw_fd()]).unwrap();
    assert_eq!(h.code, Code::SetLogBase as u32);
    assert_eq!(p, 1u64.to_le_bytes(), "refusal answered");
    assert_eq!(sw.port_stats("vm2")["vhost_user_errors"], 1);
    // LOG_ALL without a usable log: b's queues stop; frames for b are counted, not written.
    let f = b.fe.features | VHOST_F_LOG_ALL;
    let m = msg::encode(
        Code::SetFeatures as u32,
        msg::FLAG_NEED_REPLY,
        &payload::u64(f),
    );
    let (_, p, _) = b.fe.call_raw(&m, &[]).unwrap();
    assert_eq!(p, 0u64.to_le_bytes());
    wait_until("b's queues stop", || {
        sw.port_stats("vm2")["queues"][0]["ready"] == false
    });
    for i in 0..100 {
        while !a.tx.send(&frame(B, A, i, 200)) {
            a.tx.reclaim();
        }
    }
    wait_until("drops counted", || {
        sw.port_stats("vm2")["tx"]["drops"]["queue_not_ready"]
            .as_u64()
            .unwrap_or(0)
            >= 100
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        b.rx.recv_with(256, |_| {}),
        0,
        "nothing written without a log"
    );
    // A usable log: back in service.
    let log = b.fe.start_logging().unwrap();
    assert_eq!(exchange(&mut a, &mut b, 200, 64).len(), 200);
    assert!(!take_marked(&log).is_empty());
    // The frontend truncates its log under us: SIGBUS survived, b's receive queue breaks
    // (dirty_log_fault), a third port goes on.
    ferrovs_sys::os::truncate(log.fd(), 0).unwrap();
    for i in 0..20 {
        while !a.tx.send(&frame(B, A, i, 200)) {
            a.tx.reclaim();
        }
    }
    wait_until("b's queue breaks", || {
        sw.port_stats("vm2")["tx"]["drops"]["dirty_log_fault"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
    assert!(sw.port_stats("vm2")["queues"][0]["broken"]
        .as_str()
        .unwrap()
        .contains("dirty log"));
    sw.add_port("vm3", &[]);
    wait_until("vm3 socket", || sw.sock("vm3").exists());
    let mut c = attach(&sw.sock("vm3"), C, FrontendConfig::default());
    assert_eq!(exchange(&mut a, &mut c, 500, 64).len(), 500);
}

/// A postcopy destination whose pages have not arrived: while its frontend holds its faults,
/// frames for it are counted (`postcopy_page_pending`) and every other port forwards as
/// usual; once faults are served, its pages arrive and frames reach it intact.
#[test]
fn postcopy_waits_for_pages_without_stalling_other_ports() {
    let (sw, mut a, mut b) = two_guests("mig-postcopy");
    sw.add_port("vm3", &[]);
    wait_until("vm3 socket", || sw.sock("vm3").exists());
    let cfg = FrontendConfig {
        postcopy: true,
        ..Default::default()
    };
    let c = attach(&sw.sock("vm3"), C, cfg);
    let Guest {
        fe,
        tx: mut c_tx,
        rx: mut c_rx,
        ..
    } = c;
    assert_eq!(sw.port_stats("vm3")["migration"]["postcopy"], true);
    // The frontend serves faults only once `serve` is set, as a slow migration link would.
    let serve = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let (serve2, done2) = (serve.clone(), done.clone());
    let server = std::thread::spawn(move || {
        let mut served = 0u64;
        while !done2.load(Ordering::Relaxed) {
            if serve2.load(Ordering::Relaxed) {
                if let Some(_page) = fe.serve_fault().unwrap() {
                    served += 1;
                    continue;
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        (fe, served)
    });

    // Everyone speaks first, so that frames are switched, not flooded (c's transmit buffers
    // are pages it wrote itself: present).
    assert_eq!(exchange(&mut a, &mut b, 10, 64).len(), 10);
    assert_eq!(exchange(&mut b, &mut a, 10, 64).len(), 10);
    while !c_tx.send(&frame(A, C, 0, 100)) {
        c_tx.reclaim();
    }
    let mut heard = 0;
    wait_until("c's first frame at a", || {
        heard += a.rx.recv_with(8, |_| {});
        heard == 1
    });

    // Held: frames for c are refused, a and b go on at full speed.
    let t = Instant::now();
    for i in 0..64 {
        while !a.tx.send(&frame(C, A, i, 300)) {
            a.tx.reclaim();
        }
    }
    wait_until("pages missing", || {
        sw.port_stats("vm3")["tx"]["drops"]["postcopy_page_pending"]
            .as_u64()
            .unwrap_or(0)
            > 0
    });
    let got = exchange(&mut a, &mut b, 5000, 64);
    assert_eq!(got.len(), 5000, "a port stalled behind a missing page");
    let got = exchange(&mut b, &mut a, 5000, 64);
    assert_eq!(got.len(), 5000);
    assert!(t.elapsed() < Duration::from_secs(8));
    assert_eq!(c_rx.recv_with(256, |_| {}), 0);
    let m = &sw.port_stats("vm3")["migration"];
    assert!(m["postcopy_pages_missing"].as_u64().unwrap() > 0);
    assert_eq!(m["postcopy_pages_fetched"], 0);

    // Served: frames reach c intact (its buffers' pages are fetched as they are needed).
    serve.store(true, Ordering::Relaxed);
    let mut got = 0u64;
    let mut seq = 1000u64;
    let t = Instant::now();
    while got < 300 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "only {got} frames reached the postcopy guest"
        );
        if a.tx.send(&frame(C, A, seq, 300)) {
            seq += 1;
        } else {
            a.tx.reclaim();
        }
        c_rx.recv_with(32, |p| {
            build::parse_udp_frame(p).expect("intact frame");
            got += 1;
        });
        std::thread::sleep(Duration::from_micros(100));
    }
    // c's own transmit works too.
    let mut back = 0;
    for i in 1..101 {
        while !c_tx.send(&frame(A, C, i, 100)) {
            c_tx.reclaim();
        }
    }
    wait_until("c's frames at a", || {
        back += a.rx.recv_with(64, |_| {});
        back >= 100
    });
    done.store(true, Ordering::Relaxed);
    let (mut fe, served) = server.join().unwrap();
    assert!(served > 0);
    let m = sw.port_stats("vm3")["migration"].clone();
    assert!(m["postcopy_pages_fetched"].as_u64().unwrap() > 0);
    fe.postcopy_end().unwrap();
    assert_eq!(sw.port_stats("vm3")["migration"]["postcopy"], false);
    assert_eq!(sw.port_stats("vm3")["vhost_user_errors"], 0);
}

#[test]
fn send_rarp_announces_the_guest_from_its_port() {
    let (sw, mut a, mut b) = two_guests("mig-rarp");
    // The "migrated" guest has not sent anything yet: its MAC is unknown to the switch.
    let moved: u64 = 0x5254_0000_0042;
    let bytes = moved.to_be_bytes();
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&bytes[2..]);
    b.fe.send_rarp(mac).unwrap();
    let mut seen = None;
    wait_until("the RARP at a", || {
        a.rx.recv_with(32, |p| {
            if p.len() >= 60 && p[12..14] == [0x80, 0x35] {
                seen = Some(p.to_vec());
            }
        });
        seen.is_some()
    });
    let f = seen.unwrap();
    assert_eq!(&f[0..6], &[0xff; 6], "broadcast");
    assert_eq!(&f[6..12], &mac, "from the guest's MAC");
    assert_eq!(&f[22..28], &mac);
    let macs = sw
        .req(Request::MacTable {
            bridge: "br0".into(),
        })
        .unwrap();
    assert!(
        macs.as_array()
            .unwrap()
            .iter()
            .any(|e| e["mac"] == "52:54:00:00:00:42" && e["port"] == "vm2"),
        "{macs}"
    );
    assert_eq!(sw.port_stats("vm2")["migration"]["rarp_announces"], 1);
    // Frames for that MAC now go to vm2 only.
    assert_eq!(exchange(&mut a, &mut b, 10, 64).len(), 10);
}

#[test]
fn migration_requests_out_of_order_are_refused_and_harmless() {
    let (sw, mut a, mut b) = two_guests("mig-pcbad");
    // LISTEN before ADVISE: refused (QEMU asks for an answer with NEED_REPLY).
    let m = msg::encode(Code::PostcopyListen as u32, msg::FLAG_NEED_REPLY, &[]);
    let (h, p, _) = b.fe.call_raw(&m, &[]).unwrap();
    assert_eq!(h.code, Code::PostcopyListen as u32);
    assert_eq!(p, 1u64.to_le_bytes());
    // END without a postcopy: accepted (nothing to end), answered.
    let m = msg::encode(Code::PostcopyEnd as u32, msg::FLAG_NEED_REPLY, &[]);
    let (_, p, _) = b.fe.call_raw(&m, &[]).unwrap();
    assert_eq!(p, 0u64.to_le_bytes());
    // A running ring may have its log address set, not be moved.
    let bad = ferrovs_sys::guest::vring::RingAddrs {
        desc: 0x7f00_0001_0000,
        avail: 0x7f00_0001_1000,
        used: 0x7f00_0001_2000,
    };
    let m = msg::encode(
        Code::SetVringAddr as u32,
        msg::FLAG_NEED_REPLY,
        &payload::addr_logged(0, bad, Some(0x2000)),
    );
    let (_, p, _) = b.fe.call_raw(&m, &[]).unwrap();
    assert_eq!(p, 1u64.to_le_bytes(), "a running ring moved");
    assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
    // ADVISE answers with a userfaultfd.
    let m = msg::encode(Code::PostcopyAdvise as u32, 0, &[]);
    let (_, p, fds) = b.fe.call_raw(&m, &[]).unwrap();
    assert!(p.is_empty());
    assert_eq!(fds.len(), 1);
    assert_eq!(sw.port_stats("vm2")["migration"]["postcopy"], true);
    assert_eq!(sw.port_stats("vm2")["vhost_user_errors"], 2);
    assert_eq!(exchange(&mut a, &mut b, 200, 64).len(), 200);
}
