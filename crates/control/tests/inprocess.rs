//! In-process end-to-end tests: the daemon runs in a thread, mock guests (the vhost-user
//! frontend of `ferrovs-vhost`) attach over real unix sockets. No root, no VM.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ferrovs_control::{Daemon, DaemonOptions};
use ferrovs_packet::build::{self, Stamp};
use ferrovs_proto::{Reply, Request};
use ferrovs_sys::guest::vring::{Descriptor, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};
use ferrovs_vhost::frontend::{Frontend, FrontendConfig, TxQueue};
use ferrovs_vhost::msg;
use serde_json::Value;

mod common;
use common::*;

#[test]
fn forwards_between_two_guests_with_every_packet_accounted() {
    let sw = Switch::start("fwd");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    for size in [64, 1518] {
        let got = exchange(&mut a, &mut b, 2000, size);
        assert_eq!(
            got,
            (0..2000).collect::<Vec<_>>(),
            "in order, none lost, size {size}"
        );
    }
    // Back the other way, after learning.
    let got = exchange(&mut b, &mut a, 500, 200);
    assert_eq!(got.len(), 500);
    let s1 = sw.port_stats("vm1");
    let s2 = sw.port_stats("vm2");
    assert_eq!(s1["rx"]["packets"], 4000);
    assert_eq!(s2["tx"]["packets"], 4000);
    assert_eq!(s2["rx"]["packets"], 500);
    assert_eq!(s1["tx"]["packets"], 500);
    assert_eq!(s1["rx"]["dropped"], 0);
    // Ring fill: the switch took everything the guests sent (nothing waits on a from-guest
    // queue), and the guests' receive rings hold the buffers they posted back.
    for s in [&s1, &s2] {
        let q = &s["queues"];
        assert_eq!(q[1]["direction"], "from-guest");
        assert_eq!(q[1]["available"], 0, "{q}");
        let posted = q[0]["available"].as_u64().unwrap();
        assert!(posted > 0 && posted <= 256, "{q}");
    }
    let macs = sw
        .req(Request::MacTable {
            bridge: "br0".into(),
        })
        .unwrap();
    assert_eq!(macs.as_array().unwrap().len(), 2);
    let show = sw.req(Request::Show).unwrap();
    let ports = &show["bridges"][0]["ports"];
    assert_eq!(ports[0]["state"], "connected");
    assert!(ports[0]["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "mrg_rxbuf"));
}

#[test]
fn works_without_mergeable_buffers_event_idx_or_protocol_features() {
    let sw = Switch::start("legacy");
    wait_until("sockets", || sw.sock("vm2").exists());
    let cfg = FrontendConfig {
        want_features: ferrovs_vhost::features::VIRTIO_F_VERSION_1,
        ring_size: 1024,
        ..Default::default()
    };
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, cfg.clone());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, cfg);
    // Without REPLY_ACK the frontend cannot know when the switch has applied its setup;
    // frames sent before that are dropped and counted (queue_not_ready). Wait for it.
    wait_until("queues ready", || {
        let show = sw.req(Request::Show).unwrap();
        show["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["ready_queues"] == 2)
    });
    let got = exchange(&mut a, &mut b, 3000, 100).len();
    assert_eq!(
        got,
        3000,
        "{} {}",
        sw.port_stats("vm1"),
        sw.port_stats("vm2")
    );
}

#[test]
fn multiqueue_port_spreads_and_delivers() {
    let sw = Switch::start("mq");
    sw.add_port("mq1", &["queues=4"]);
    sw.add_port("mq2", &["queues=4"]);
    let cfg = FrontendConfig {
        queue_pairs: 4,
        ..Default::default()
    };
    let a = Frontend::connect(&sw.sock("mq1"), cfg.clone()).unwrap();
    let b = Frontend::connect(&sw.sock("mq2"), cfg).unwrap();
    let mut txs: Vec<_> = (0..4).map(|i| a.tx_queue(i).unwrap()).collect();
    let mut rxs: Vec<_> = (0..4).map(|i| b.rx_queue(i).unwrap()).collect();
    let mut got = 0u64;
    let t = Instant::now();
    let mut sent = 0u64;
    while got < 4000 && t.elapsed() < Duration::from_secs(10) {
        for (i, tx) in txs.iter_mut().enumerate() {
            // Keep fewer packets in flight than the receive ring holds: no drops by design.
            if sent < 4000
                && sent - got < 128
                && tx.send(&frame(
                    0x0200_0000_00b2,
                    0x0200_0000_00a1 + i as u64,
                    sent,
                    128,
                ))
            {
                sent += 1;
            }
        }
        for rx in rxs.iter_mut() {
            rx.recv_with(32, |p| {
                build::parse_udp_frame(p).expect("intact");
                got += 1;
            });
        }
    }
    assert_eq!(
        got,
        4000,
        "mq1 {} mq2 {}",
        sw.port_stats("mq1"),
        sw.port_stats("mq2")
    );
    let st = sw.port_stats("mq1");
    let used: Vec<u64> = st["queues"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["direction"] == "from-guest")
        .map(|q| q["stats"]["packets"].as_u64().unwrap())
        .collect();
    // Every rx queue was polled and carried its share (the sender round-robins over them).
    assert_eq!(used.iter().sum::<u64>(), 4000);
    assert!(
        used.iter().all(|n| *n >= 900),
        "every rx queue polled: {used:?}"
    );
}

#[test]
fn reconnecting_frontend_resumes() {
    let sw = Switch::start("reconn");
    wait_until("sockets", || sw.sock("vm2").exists());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    {
        let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
        assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
    } // a disconnects
    wait_until("disconnect seen", || {
        sw.req(Request::Show).unwrap()["bridges"][0]["ports"][0]["state"] == "listening"
    });
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
}

#[test]
fn client_mode_port_connects_and_reconnects() {
    let sw = Switch::start("client");
    wait_until("sockets", || sw.sock("vm2").exists());
    let path = sw.dir.join("guest-listens.sock");
    sw.req(Request::AddPort {
        bridge: "br0".into(),
        port: "c1".into(),
        options: vec![
            "type=vhost-user-client".into(),
            format!("path={}", path.display()),
        ],
    })
    .unwrap();
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    for round in 0..2 {
        // The "guest" listens (QEMU server=on); the switch connects with backoff.
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (s, _) = l.accept().unwrap();
        let fe = Frontend::over(s, FrontendConfig::default()).unwrap();
        let mut a = Guest {
            tx: fe.tx_queue(0).unwrap(),
            rx: fe.rx_queue(0).unwrap(),
            fe,
            mac: 0x0200_0000_00c1,
        };
        assert_eq!(
            exchange(&mut a, &mut b, 200, 64).len(),
            200,
            "round {round}"
        );
        drop(a);
        drop(l);
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn vlan_access_ports_are_isolated() {
    let sw = Switch::start("vlan");
    sw.add_port("t10a", &["tag=10"]);
    sw.add_port("t10b", &["tag=10"]);
    sw.add_port("t20", &["tag=20"]);
    let mut a = attach(
        &sw.sock("t10a"),
        0x0200_0000_0a01,
        FrontendConfig::default(),
    );
    let mut b = attach(
        &sw.sock("t10b"),
        0x0200_0000_0a02,
        FrontendConfig::default(),
    );
    let mut c = attach(&sw.sock("t20"), 0x0200_0000_1401, FrontendConfig::default());
    let mut trunk = attach(&sw.sock("vm1"), 0x0200_0000_0f01, FrontendConfig::default());
    // Broadcast from VLAN 10 reaches the other VLAN-10 port and the trunk (tagged), not VLAN 20.
    assert!(a.tx.send(&frame(ferrovs_packet::BROADCAST, a.mac, 0, 100)));
    let mut at_b = 0;
    let mut at_trunk = Vec::new();
    wait_until("flood", || {
        b.rx.recv_with(32, |_| at_b += 1);
        trunk.rx.recv_with(32, |p| at_trunk.push(p.to_vec()));
        at_b == 1 && at_trunk.len() == 1
    });
    let e = ferrovs_packet::EthView::new_checked(&at_trunk[0]).unwrap();
    assert_eq!(e.vlan(), Some(10));
    assert_eq!(at_trunk[0].len(), 104);
    std::thread::sleep(Duration::from_millis(50));
    let mut at_c = 0;
    c.rx.recv_with(32, |_| at_c += 1);
    assert_eq!(at_c, 0, "VLAN 20 saw a VLAN 10 frame");
    let _ = (&mut c.tx, &c.fe, &trunk.fe, &a.fe, &b.fe);
}

/// A hostile guest: a chain that loops. Its queue is marked broken with a counter; the
/// other ports keep forwarding.
#[test]
fn hostile_rings_break_only_their_queue() {
    let sw = Switch::start("hostile");
    sw.add_port("evil", &[]);
    wait_until("sockets", || sw.sock("vm2").exists());
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    type Corruption = Box<dyn Fn(&TxQueue) -> u16>;
    let cases: Vec<(&str, Corruption)> = vec![
        (
            "desc_chain_loop",
            Box::new(|tx: &TxQueue| {
                tx.ring().write_desc(
                    0,
                    Descriptor {
                        addr: 0,
                        len: 64,
                        flags: VRING_DESC_F_NEXT,
                        next: 1,
                    },
                );
                tx.ring().write_desc(
                    1,
                    Descriptor {
                        addr: 0,
                        len: 64,
                        flags: VRING_DESC_F_NEXT,
                        next: 0,
                    },
                );
                0
            }),
        ),
        (
            "desc_out_of_guest_memory",
            Box::new(|tx: &TxQueue| {
                tx.ring().write_desc(
                    0,
                    Descriptor {
                        addr: 1 << 40,
                        len: 64,
                        flags: 0,
                        next: 0,
                    },
                );
                0
            }),
        ),
        (
            "desc_out_of_guest_memory",
            Box::new(|tx: &TxQueue| {
                // Length that runs past the end of memory (address + length overflows).
                tx.ring().write_desc(
                    0,
                    Descriptor {
                        addr: u64::MAX - 16,
                        len: 4096,
                        flags: 0,
                        next: 0,
                    },
                );
                0
            }),
        ),
        (
            "bad_desc_index",
            Box::new(|tx: &TxQueue| {
                tx.ring().write_desc(
                    0,
                    Descriptor {
                        addr: 0,
                        len: 64,
                        flags: VRING_DESC_F_NEXT,
                        next: 9999,
                    },
                );
                0
            }),
        ),
        (
            "bad_indirect_desc",
            Box::new(|tx: &TxQueue| {
                tx.ring().write_desc(
                    0,
                    Descriptor {
                        addr: 0,
                        len: 15,
                        flags: VRING_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
                0
            }),
        ),
        (
            "bad_indirect_desc",
            Box::new(|tx: &TxQueue| {
                // Indirect table whose entry is itself indirect.
                let d = Descriptor {
                    addr: 4096,
                    len: 16,
                    flags: VRING_DESC_F_INDIRECT,
                    next: 0,
                };
                tx.ring().mem().write(4096, &d.to_bytes()).unwrap();
                tx.ring().write_desc(0, d);
                0
            }),
        ),
        (
            "desc_wrong_direction",
            Box::new(|tx: &TxQueue| {
                tx.ring().write_desc(
                    0,
                    Descriptor {
                        addr: 0,
                        len: 64,
                        flags: ferrovs_sys::guest::vring::VRING_DESC_F_WRITE,
                        next: 0,
                    },
                );
                0
            }),
        ),
    ];
    for (reason, corrupt) in cases {
        let mut evil = attach(
            &sw.sock("evil"),
            0x0200_0000_0666,
            FrontendConfig::default(),
        );
        let head = corrupt(&evil.tx);
        evil.tx.publish_raw(head);
        wait_until(reason, || {
            let st = sw.port_stats("evil");
            st["queues"][1]["broken"] != Value::Null
                && st["rx"]["drops"][reason].as_u64().unwrap_or(0) >= 1
        });
        // The bad chain was returned to the guest (length 0): it leaks no descriptor.
        wait_until("bad chain returned", || evil.tx.ring().used_idx() == 1);
        assert_eq!(
            exchange(&mut a, &mut b, 200, 64).len(),
            200,
            "others forward after {reason}"
        );
        drop(evil); // reconnect clears the broken state for the next case
        wait_until("evil gone", || {
            let show = sw.req(Request::Show).unwrap();
            show["bridges"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "evil" && p["state"] == "listening")
        });
    }
    // An available index that jumps past the ring size.
    let evil = attach(
        &sw.sock("evil"),
        0x0200_0000_0666,
        FrontendConfig::default(),
    );
    evil.tx.ring().publish_avail(5000);
    wait_until("bad_avail_idx", || {
        sw.port_stats("evil")["rx"]["drops"]["bad_avail_idx"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
    assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
}

/// A guest that truncates its memory file after the switch mapped it: the switch's next
/// access raises SIGBUS, which must break that port's queues only — not kill the daemon.
#[test]
fn guest_shrinking_its_memory_breaks_only_its_port() {
    let sw = Switch::start("sigbus");
    sw.add_port("evil", &[]);
    wait_until("sockets", || sw.sock("vm2").exists());
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    let evil = attach(
        &sw.sock("evil"),
        0x0200_0000_0666,
        FrontendConfig::default(),
    );
    assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
    evil.fe.truncate_memory(0).unwrap();
    wait_until("fault counted", || {
        let st = sw.port_stats("evil");
        st["rx"]["drops"]["guest_memory_fault"]
            .as_u64()
            .unwrap_or(0)
            >= 1
            && st["queues"][1]["broken"] != Value::Null
    });
    // The daemon is alive and the other ports forward, including floods that would go to evil.
    assert_eq!(exchange(&mut a, &mut b, 500, 64).len(), 500);
    assert!(sw.req(Request::Show).is_ok());
}

/// A frontend may hand us a blocking pipe as its call fd and never read it: once the pipe is
/// full our notifications fail with EAGAIN (the fd was made non-blocking on receipt) and
/// forwarding goes on.
#[test]
fn call_fd_that_is_a_full_blocking_pipe_never_stalls_the_pmd() {
    use std::os::fd::AsFd;
    let sw = Switch::start("pipe");
    wait_until("sockets", || sw.sock("vm2").exists());
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let cfg = FrontendConfig {
        want_features: ferrovs_vhost::features::VIRTIO_F_VERSION_1
            | ferrovs_vhost::features::VHOST_USER_F_PROTOCOL_FEATURES,
        ..Default::default()
    };
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, cfg);
    let (_reader, mut writer) = std::io::pipe().unwrap();
    // Fill the pipe, then hand it over blocking: every notification finds it full.
    ferrovs_sys::os::set_nonblocking(writer.as_fd(), true).unwrap();
    while std::io::Write::write(&mut writer, &[0u8; 4096]).is_ok() {}
    ferrovs_sys::os::set_nonblocking(writer.as_fd(), false).unwrap();
    b.fe.set_call_fd(0, writer.as_fd()).unwrap();
    // Ask for an interrupt on every used-ring update.
    b.rx.ring().set_avail_flags(0);
    let got = exchange(&mut a, &mut b, 20_000, 64);
    assert_eq!(
        got.len(),
        20_000,
        "{} {}",
        sw.port_stats("vm1"),
        sw.port_stats("vm2")
    );
    let st = sw.port_stats("vm2");
    assert!(
        st["tx"]["guest_notifications"].as_u64().unwrap() > 100,
        "notifications were attempted into the full pipe: {st}"
    );
}

/// A frontend may hand us a blocking pipe as its kick fd, write any bytes to it (not an
/// eventfd's 8), stuff it, or close its end: the PMD never blocks reading it (the fd was made
/// non-blocking on receipt), still sleeps and is woken by it in interrupt mode, and with the
/// pipe at end-of-file (readable for ever) the queue is polled instead of slept on: nothing
/// stalls, the other port goes on.
#[test]
fn kick_fd_that_is_a_blocking_pipe_never_stalls_the_pmd() {
    use std::io::Write;
    use std::os::fd::AsFd;
    let sw = Switch::start("kickpipe");
    wait_until("sockets", || sw.sock("vm2").exists());
    sw.req(Request::ConfigSet {
        key: "pmd-rx-mode".into(),
        value: "interrupt".into(),
    })
    .unwrap();
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    assert_eq!(exchange(&mut b, &mut a, 1, 64).len(), 1);
    assert_eq!(exchange(&mut a, &mut b, 1, 64).len(), 1);
    let (reader, mut writer) = std::io::pipe().unwrap();
    // Queue 1 is a's transmit queue; the pipe's read end arrives blocking.
    a.fe.set_kick_fd(1, reader.as_fd()).unwrap();
    drop(reader);
    let wakeups = |sw: &Switch| sw.req(Request::PmdStats).unwrap()[0]["kick_wakeups"].as_u64();
    let before = wakeups(&sw).unwrap();
    // Each packet's kick is 3 bytes through the pipe, a pause between packets so that the
    // PMD goes back to sleep.
    for seq in 0..200u64 {
        assert!(a.tx.send(&frame(b.mac, a.mac, seq, 64)));
        writer.write_all(&[0x55; 3]).unwrap();
        let t = Instant::now();
        let mut got = None;
        while got.is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "packet {seq} not delivered: {}",
                sw.port_stats("vm1")
            );
            b.rx.recv_with(32, |p| got = build::parse_udp_frame(p).ok().map(|s| s.seq));
        }
        assert_eq!(got, Some(seq));
        std::thread::sleep(Duration::from_micros(1500));
    }
    let after = wakeups(&sw).unwrap();
    assert!(
        after > before + 20,
        "the pipe woke the PMD: {before} -> {after}"
    );
    // Stuffed: 64 KiB the PMD drains a little per wake-up.
    let _ = ferrovs_sys::os::set_nonblocking(writer.as_fd(), true);
    while writer.write(&[0u8; 4096]).is_ok() {}
    assert_eq!(exchange(&mut b, &mut a, 2000, 64).len(), 2000);
    // Closed: the read end is at end-of-file, readable for ever.
    drop(writer);
    assert_eq!(exchange(&mut b, &mut a, 2000, 64).len(), 2000);
    for seq in 0..200u64 {
        assert!(a.tx.send(&frame(b.mac, a.mac, 1000 + seq, 64)));
    }
    let mut got = Vec::new();
    wait_until("a's frames after the pipe closed", || {
        b.rx.recv_with(32, |p| {
            got.extend(build::parse_udp_frame(p).ok().map(|s| s.seq))
        });
        got.len() == 200
    });
    assert_eq!(got, (1000..1200).collect::<Vec<_>>());
    assert!(sw.req(Request::Show).is_ok());
}

/// One frontend per port: a second connection to a connected port is closed at once and
/// counted (`refused_connections`), while the first frontend's connection and traffic go on.
/// Fds the switch never uses (SET_LOG_FD, here a blocking pipe) are accepted and closed.
#[test]
fn a_second_frontend_on_a_connected_port_is_refused_and_the_first_goes_on() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let sw = Switch::start("second");
    wait_until("sockets", || sw.sock("vm2").exists());
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    assert_eq!(exchange(&mut a, &mut b, 100, 64).len(), 100);
    // A raw second connection: the switch closes it (we read end-of-file).
    let mut s = std::os::unix::net::UnixStream::connect(sw.sock("vm1")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        s.read(&mut buf).unwrap(),
        0,
        "the second connection is closed"
    );
    // A second real frontend fails to attach.
    assert!(Frontend::connect(&sw.sock("vm1"), FrontendConfig::default()).is_err());
    wait_until("refusals counted", || {
        sw.port_stats("vm1")["refused_connections"] == 2
    });
    // The log fd is a blocking pipe nobody reads or writes: accepted, never used.
    let (_r, w) = std::io::pipe().unwrap();
    let m = msg::encode(msg::Code::SetLogFd as u32, msg::FLAG_NEED_REPLY, &[]);
    let (_, p, _) = b.fe.call_raw(&m, &[w.as_raw_fd()]).unwrap();
    assert_eq!(p, 0u64.to_le_bytes(), "SET_LOG_FD accepted");
    // The first frontends never noticed.
    assert_eq!(exchange(&mut a, &mut b, 1000, 64).len(), 1000);
    assert_eq!(exchange(&mut b, &mut a, 1000, 64).len(), 1000);
    let show = sw.req(Request::Show).unwrap();
    let vm1 = show["bridges"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "vm1")
        .unwrap()
        .clone();
    assert_eq!(vm1["state"], "connected", "{vm1}");
    assert_eq!(vm1["connects"], 1, "{vm1}");
    assert_eq!(vm1["disconnects"], 0, "{vm1}");
}

/// Malformed vhost-user messages: refused with an error count; a bad header (framing lost)
/// closes only that connection.
#[test]
fn malformed_messages_are_refused_and_isolated() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let sw = Switch::start("badmsg");
    wait_until("sockets", || sw.sock("vm2").exists());
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    sw.add_port("bad", &[]);
    // 1. wrong payload size, unknown code, missing fd: refused, connection stays.
    let mut s = std::os::unix::net::UnixStream::connect(sw.sock("bad")).unwrap();
    s.write_all(&msg::encode(msg::Code::SetVringAddr as u32, 0, &[0u8; 8]))
        .unwrap();
    s.write_all(&msg::encode(999, 0, &[])).unwrap();
    s.write_all(&msg::encode(
        msg::Code::SetVringKick as u32,
        0,
        &0u64.to_le_bytes(),
    ))
    .unwrap();
    // A memory table claiming more than its fd holds.
    let fd = ferrovs_sys::os::memfd("small", 4096, false).unwrap();
    let table = msg::payload::mem_table(&[ferrovs_sys::guest::memory::RegionDesc {
        gpa: 0,
        size: 1 << 30,
        uaddr: 0,
        mmap_offset: 0,
    }]);
    ferrovs_sys::os::send_with_fds(
        &s,
        &msg::encode(msg::Code::SetMemTable as u32, 0, &table),
        &[fd.as_raw_fd()],
    )
    .unwrap();
    wait_until("errors counted", || {
        sw.port_stats("bad")["vhost_user_errors"].as_u64().unwrap() >= 4
    });
    // 2. A message that stops halfway and never completes: nobody else stalls.
    s.write_all(&msg::encode(msg::Code::SetFeatures as u32, 0, &[1, 2, 3, 4, 5, 6, 7, 8])[..7])
        .unwrap();
    assert_eq!(exchange(&mut a, &mut b, 200, 64).len(), 200);
    assert!(sw.req(Request::Show).is_ok(), "control plane responsive");
    drop(s);
    // 3. A bad header version: the connection is closed, the port listens again.
    let mut s = std::os::unix::net::UnixStream::connect(sw.sock("bad")).unwrap();
    s.write_all(
        &msg::Header {
            code: 1,
            flags: 0x2,
            size: 0,
        }
        .encode(),
    )
    .unwrap();
    wait_until("closed", || {
        let show = sw.req(Request::Show).unwrap();
        show["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "bad" && p["disconnects"].as_u64().unwrap() >= 2)
    });
    // 4. A frontend that floods requests needing replies and never reads them is cut off.
    let s = std::os::unix::net::UnixStream::connect(sw.sock("bad")).unwrap();
    let m = msg::encode(msg::Code::GetFeatures as u32, 0, &[]);
    s.set_nonblocking(true).unwrap();
    let mut w = &s;
    for _ in 0..100_000 {
        let _ = w.write_all(&m);
    }
    assert_eq!(exchange(&mut a, &mut b, 200, 64).len(), 200);
}

#[test]
fn control_errors_are_precise_and_harmless() {
    let sw = Switch::start("ctl");
    let e = |r| sw.req(r).unwrap_err();
    assert_eq!(
        e(Request::DelPort {
            bridge: "br0".into(),
            port: "nope".into()
        }),
        "no port named nope"
    );
    assert!(e(Request::AddPort {
        bridge: "br0".into(),
        port: "x".into(),
        options: vec![
            "type=vhost-user".into(),
            "path=/x".into(),
            "queues=99".into()
        ]
    })
    .contains("queues=99 out of range"));
    let taken = sw.sock("vm1").display().to_string();
    let _holder = std::os::unix::net::UnixStream::connect(&taken);
    assert!(e(Request::AddPort {
        bridge: "br0".into(),
        port: "dup".into(),
        options: vec!["type=vhost-user".into(), format!("path={taken}")]
    })
    .contains("already used by port vm1"));
    assert!(e(Request::AddPort {
        bridge: "nobr".into(),
        port: "x".into(),
        options: vec!["type=vhost-user".into(), "path=/tmp/x".into()]
    })
    .contains("no bridge named nobr"));
    assert!(e(Request::ConfigSet {
        key: "mac-aging".into(),
        value: "-1".into()
    })
    .contains("expected an integer"));
    assert!(e(Request::ConfigSet {
        key: "pmd-cores".into(),
        value: "999".into()
    })
    .contains("core"));
    assert!(e(Request::AddPort {
        bridge: "br0".into(),
        port: "t".into(),
        options: vec!["type=tap".into()]
    })
    .contains("dev=NETDEV is required for tap ports"));
    assert!(e(Request::AddPort {
        bridge: "br0".into(),
        port: "u".into(),
        options: vec!["type=uplink".into(), "dev=0123456789abcdef".into()]
    })
    .contains("is longer than 15 bytes"));
    // Malformed JSON on the socket.
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sw.dir.join("ferrovs.ctl")).unwrap();
    s.write_all(b"{\"cmd\": \"explode\"}\nnot json\n").unwrap();
    let mut r = BufReader::new(&s);
    for _ in 0..2 {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(
            line.contains("\"ok\":false") && line.contains("malformed request"),
            "{line}"
        );
    }
    // The state is intact and persisted.
    let show = sw.req(Request::Show).unwrap();
    assert_eq!(show["bridges"][0]["ports"].as_array().unwrap().len(), 2);
    assert!(show["bad_control_requests"].as_u64().unwrap() >= 8);
    sw.req(Request::AddBridge {
        bridge: "br1".into(),
    })
    .unwrap();
    sw.req(Request::AddPort {
        bridge: "br1".into(),
        port: "p9".into(),
        options: vec![
            "type=vhost-user".into(),
            format!("path={}", sw.sock("p9").display()),
            "tag=7".into(),
        ],
    })
    .unwrap();
    let saved = ferrovs_control::Config::load(&sw.dir.join("ferrovs.conf.json")).unwrap();
    assert_eq!(saved.bridges.len(), 2);
    assert_eq!(saved.bridges[1].ports[0].tag, Some(7));
}

#[test]
fn restart_restores_saved_configuration() {
    let dir;
    {
        let sw = Switch::start("persist");
        sw.req(Request::AddBridge {
            bridge: "br9".into(),
        })
        .unwrap();
        sw.add_port("extra", &["queues=2"]);
        dir = sw.dir.clone();
        let cfg = std::fs::read_to_string(dir.join("ferrovs.conf.json")).unwrap();
        std::fs::write(
            std::env::temp_dir().join(format!("ferrovs-persist-{}.json", std::process::id())),
            cfg,
        )
        .unwrap();
    }
    let saved = std::env::temp_dir().join(format!("ferrovs-persist-{}.json", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&saved, dir.join("ferrovs.conf.json")).unwrap();
    let mut d = Daemon::start(DaemonOptions {
        run_dir: dir.clone(),
        config: None,
        pmd_cores: Some(vec![0]),
        ovsdb: None,
    })
    .unwrap();
    let show = d.handle(Request::Show);
    let Some(Reply::Show(v)) = show.result else {
        panic!("show answers a Show");
    };
    let names: Vec<_> = v.bridges.iter().map(|b| b.name.clone()).collect();
    assert_eq!(names, vec!["br0", "br9"]);
    assert!(v.bridges[0]
        .ports
        .iter()
        .any(|p| p.name == "extra" && p.queues == 2));
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(saved);
}

/// Interrupt and adaptive modes never lose a wake-up: single packets at random intervals
/// (0 to 3 ms, straddling the 300 us idle threshold, so the PMD keeps falling asleep and
/// being kicked awake), with and without EVENT_IDX, each delivered within a bound; the PMD
/// really slept and was woken by kicks; modes switch at runtime.
#[test]
fn sleeping_pmd_never_misses_a_kick() {
    let sw = Switch::start("sleep");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let set = |k: &str, v: &str| {
        sw.req(Request::ConfigSet {
            key: k.into(),
            value: v.into(),
        })
        .unwrap();
    };
    let legacy = FrontendConfig {
        want_features: ferrovs_vhost::features::VIRTIO_F_VERSION_1
            | ferrovs_vhost::features::VHOST_USER_F_PROTOCOL_FEATURES,
        ..Default::default()
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for (mode, cfg) in [
        ("adaptive", FrontendConfig::default()),
        ("interrupt", FrontendConfig::default()),
        ("interrupt", legacy.clone()),
        ("adaptive", legacy),
    ] {
        set("pmd-rx-mode", mode);
        let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, cfg.clone());
        let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, cfg);
        // Learn both addresses first.
        assert_eq!(exchange(&mut b, &mut a, 1, 64).len(), 1);
        let mut worst = Duration::ZERO;
        for seq in 0..400u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_micros(rng % 3000));
            assert!(a.tx.send(&frame(b.mac, a.mac, seq, 64)));
            let t = Instant::now();
            let mut got = None;
            while got.is_none() {
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "{mode}: packet {seq} not delivered: a kick was lost"
                );
                b.rx.recv_with(32, |p| {
                    got = build::parse_udp_frame(p).ok().map(|s| s.seq);
                });
            }
            assert_eq!(got, Some(seq));
            worst = worst.max(t.elapsed());
        }
        let pmd = &sw.req(Request::PmdStats).unwrap()[0];
        assert_eq!(pmd["rx_mode"], mode);
        assert!(
            pmd["sleeps"].as_u64().unwrap() > 0,
            "{mode}: it slept: {pmd}"
        );
        assert!(
            pmd["kick_wakeups"].as_u64().unwrap() > 0,
            "{mode}: kicks woke it: {pmd}"
        );
        eprintln!("{mode}: worst delivery {worst:?}; {pmd}");
    }
    set("pmd-rx-mode", "poll");
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    assert_eq!(exchange(&mut a, &mut b, 1000, 64).len(), 1000);
    let e = sw
        .req(Request::ConfigSet {
            key: "pmd-rx-mode".into(),
            value: "sometimes".into(),
        })
        .unwrap_err();
    assert!(e.contains("adaptive, poll or interrupt"), "{e}");
}

/// Adaptive mode under load: bursts of 32 packets 2 ms apart (gaps longer than the 300 us idle
/// threshold, shorter than the 9.6 ms the PMD keeps polling after a queue gave half a burst)
/// keep the PMD awake; single packets with the same gaps let it sleep between them, as
/// before. Before the hold, a loaded PMD slept in nearly every such gap and the frontend's
/// next kick had to wake it (with DPDK testpmd's frontend: 26-37 sleeps in 4 s of traffic).
#[test]
fn adaptive_pmd_keeps_polling_through_short_gaps_under_load() {
    let (sw, mut a, mut b) = switch_with_two_guests("loadhold");
    let pmd = |sw: &Switch| sw.req(Request::PmdStats).unwrap()[0].clone();
    assert_eq!(pmd(&sw)["rx_mode"], "adaptive");
    let sleeps = |sw: &Switch| pmd(sw)["sleeps"].as_u64().unwrap();
    // Sends `n` frames from a in one publication, waits for all of them at b, then pauses.
    let mut seq = 0u64;
    let mut round = |a: &mut Guest, b: &mut Guest, n: usize| {
        a.tx.reclaim();
        let frames: Vec<Vec<u8>> = (0..n as u64)
            .map(|i| frame(b.mac, a.mac, seq + i, 64))
            .collect();
        assert_eq!(
            a.tx.send_with(n, |i, buf| {
                buf[..64].copy_from_slice(&frames[i]);
                64
            }),
            n
        );
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < n {
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "burst at {seq} not delivered"
            );
            b.rx.recv_with(32, |p| {
                got.extend(build::parse_udp_frame(p).ok().map(|s| s.seq))
            });
        }
        assert_eq!(got, (seq..seq + n as u64).collect::<Vec<_>>());
        seq += n as u64;
        std::thread::sleep(Duration::from_millis(2));
    };
    let s0 = sleeps(&sw);
    for _ in 0..100 {
        round(&mut a, &mut b, 1);
    }
    let light = sleeps(&sw) - s0;
    let s1 = sleeps(&sw);
    for _ in 0..100 {
        round(&mut a, &mut b, 32);
    }
    let loaded = sleeps(&sw) - s1;
    eprintln!("sleeps: {light} in 100 light gaps, {loaded} in 100 loaded ones");
    assert!(
        light >= 50,
        "single packets 2 ms apart: the PMD sleeps between them ({light})"
    );
    // A few allowed: this test's thread may itself be descheduled for 10 ms on a busy host.
    assert!(
        loaded <= 10,
        "bursts 2 ms apart: the PMD stays awake ({loaded} sleeps)"
    );
    // And it still goes to sleep once the load is over.
    let s2 = sleeps(&sw);
    wait_until("the PMD sleeps after the load", || sleeps(&sw) > s2);
}

/// `pmd-stats-clear` starts every PMD count again from zero: packets and cycles, and also
/// iterations, sleeps, kick wake-ups and time asleep (before, those kept counting from the
/// daemon's start, so a benchmark's packets per iteration and time asleep over its measured
/// interval included the idle seconds before it).
#[test]
fn pmd_stats_clear_resets_every_count() {
    let (sw, mut a, mut b) = switch_with_two_guests("statsclear");
    // Single packets 2 ms apart: the adaptive PMD sleeps between them, kicks wake it.
    for _ in 0..20 {
        assert_eq!(exchange(&mut a, &mut b, 1, 64).len(), 1);
        std::thread::sleep(Duration::from_millis(2));
    }
    let pmd = |sw: &Switch| sw.req(Request::PmdStats).unwrap()[0].clone();
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    let before = pmd(&sw);
    for k in [
        "rx_packets",
        "iterations",
        "sleeps",
        "kick_wakeups",
        "sleep_cycles",
    ] {
        assert!(n(&before, k) > 0, "{k} counted before the clear: {before}");
    }
    sw.req(Request::PmdStatsClear).unwrap();
    let after = pmd(&sw);
    assert_eq!(n(&after, "rx_packets"), 0, "{after}");
    // The PMD runs on: a sleep or two (100 ms at most each) may begin right after the clear.
    for k in ["sleeps", "kick_wakeups"] {
        assert!(n(&after, k) <= 2, "{k} cleared: {after}");
    }
    assert!(
        n(&after, "sleep_us") <= 250_000,
        "time asleep cleared: {after}"
    );
    assert!(
        n(&after, "iterations") < n(&before, "iterations"),
        "{before} {after}"
    );
    assert_eq!(exchange(&mut a, &mut b, 10, 64).len(), 10);
    assert_eq!(n(&pmd(&sw), "rx_packets"), 10);
}

/// Guest notification coalescing: a lone packet's notification waits for the port's bound
/// (never less: it was coalesced; never much more: the PMD's timer makes it, also while the
/// PMD sleeps in interrupt mode), a burst of `frames` packets notifies at once, and no
/// notification is ever lost. The receiving guest is interrupt-driven (re-arms used_event /
/// clears NO_INTERRUPT after each poll, as a NAPI driver) and waits on its call eventfd.
#[test]
fn coalescing_never_delays_a_notification_past_its_bound() {
    use ferrovs_sys::os;
    const T: Duration = Duration::from_micros(500);
    let sw = Switch::start("coalesce");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let set_port = |o: &[&str]| {
        sw.req(Request::SetPort {
            port: "vm2".into(),
            options: o.iter().map(|s| s.to_string()).collect(),
        })
    };
    let e = set_port(&["coalesce-frames=8"]).unwrap_err();
    assert!(e.contains("needs coalesce-usecs"), "{e}");
    let e = sw
        .req(Request::SetPort {
            port: "vm9".into(),
            options: vec!["coalesce-usecs=5".into()],
        })
        .unwrap_err();
    assert!(e.contains("no port named vm9"), "{e}");
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for (mode, cfg) in [
        ("poll", FrontendConfig::default()),
        ("interrupt", FrontendConfig::default()),
        (
            "adaptive",
            FrontendConfig {
                want_features: ferrovs_vhost::features::VIRTIO_F_VERSION_1
                    | ferrovs_vhost::features::VHOST_USER_F_PROTOCOL_FEATURES,
                ..Default::default()
            },
        ),
    ] {
        sw.req(Request::ConfigSet {
            key: "pmd-rx-mode".into(),
            value: mode.into(),
        })
        .unwrap();
        set_port(&["coalesce-usecs=0", "coalesce-frames=0"]).unwrap();
        let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, cfg.clone());
        let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, cfg);
        assert_eq!(exchange(&mut b, &mut a, 1, 64).len(), 1);
        assert_eq!(exchange(&mut a, &mut b, 1, 64).len(), 1);
        b.rx.set_interrupts(true);
        let call = b.fe.call_fd(0).unwrap().try_clone_to_owned().unwrap();
        let mut seq = 100u64;
        // Sends `n` frames a → b; returns how long until b's call eventfd fired, after
        // receiving them all.
        let mut send_and_wait = |a: &mut Guest, b: &mut Guest, n: u64| -> Duration {
            let _ = os::drain(call.as_fd());
            let first = seq;
            // Timed from before the send: the switch cannot have deferred anything earlier,
            // so a notification measured before the bound came early. (Timed from after it,
            // the test thread preempted between the send and the clock read on a loaded
            // machine measured a notification made at the bound as 270 µs.)
            let t = Instant::now();
            for _ in 0..n {
                assert!(a.tx.send(&frame(b.mac, a.mac, seq, 64)));
                seq += 1;
            }
            let mut got = Vec::new();
            let mut fired = None;
            // The ring is read only once the notification came: a driver that consumed the
            // packets first would have moved its used_event past them, and the switch then
            // rightly makes no notification for them (a PMD delayed past the poll on a loaded
            // machine looked like a lost one).
            while (got.len() as u64) < n || fired.is_none() {
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "{mode}: packets {first}..{seq}: got {got:?}, notified {fired:?}: a \
                     notification was lost"
                );
                if fired.is_none() {
                    if os::poll_readable(&[call.as_fd()], 10).unwrap() > 0 {
                        fired = Some(t.elapsed());
                        let _ = os::drain(call.as_fd());
                    }
                    continue;
                }
                b.rx.recv_with(32, |p| {
                    got.extend(build::parse_udp_frame(p).ok().map(|s| s.seq));
                });
            }
            assert_eq!(got, (first..seq).collect::<Vec<_>>(), "{mode}");
            fired.unwrap()
        };
        let mut pause = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_micros(rng % 1500));
        };
        // Latency is judged on up to three measurements: a host that steals the PMD's core
        // (a shared 2-core machine under CI load showed an uncoalesced p50 of 1.2 ms) can
        // only make notifications late, never early. So "never before the bound" and "no
        // notification lost" fail at once, on any measurement; the upper bounds fail only
        // when every measurement misses them.
        let mut late = Vec::new();
        for attempt in 1..=3 {
            // Coalescing off: a lone packet notifies at once.
            set_port(&["coalesce-usecs=0", "coalesce-frames=0"]).unwrap();
            let mut off: Vec<Duration> = (0..50)
                .map(|_| {
                    pause();
                    send_and_wait(&mut a, &mut b, 1)
                })
                .collect();
            set_port(&["coalesce-usecs=500", "coalesce-frames=8"]).unwrap();
            let mut lone: Vec<Duration> = (0..150)
                .map(|_| {
                    pause();
                    send_and_wait(&mut a, &mut b, 1)
                })
                .collect();
            let mut burst: Vec<Duration> = (0..30)
                .map(|_| {
                    pause();
                    send_and_wait(&mut a, &mut b, 8)
                })
                .collect();
            for v in [&mut off, &mut lone, &mut burst] {
                v.sort();
            }
            let pct = |v: &[Duration], p: usize| v[(v.len() - 1) * p / 100];
            eprintln!(
                "{mode} #{attempt}: off p50 {:?} | lone p50 {:?} p99 {:?} max {:?} | burst of 8 \
                 p50 {:?}",
                pct(&off, 50),
                pct(&lone, 50),
                pct(&lone, 99),
                lone.last().unwrap(),
                pct(&burst, 50)
            );
            // Coalesced: never before the bound (timed from before the packet was sent).
            assert!(lone[0] >= T, "{mode}: notified after {:?} < {T:?}", lone[0]);
            // ... and at the bound: the PMD's timer, not the next packet, made it. The margin
            // is the OS's (thread wake-ups on a shared 2-core machine), not the switch's.
            let mut missed = Vec::new();
            if pct(&lone, 50) >= T + Duration::from_micros(300) {
                missed.push(format!("median {:?}", pct(&lone, 50)));
            }
            if *lone.last().unwrap() >= T + Duration::from_millis(20) {
                missed.push(format!("worst {:?}", lone.last().unwrap()));
            }
            // A burst reaching the packet bound notifies without waiting for the time bound.
            if pct(&burst, 50) >= T {
                missed.push(format!("burst median {:?}", pct(&burst, 50)));
            }
            if pct(&off, 50) >= T / 2 {
                missed.push(format!("uncoalesced median {:?}", pct(&off, 50)));
            }
            if missed.is_empty() {
                break;
            }
            late.push(format!("#{attempt}: {}", missed.join(", ")));
            assert!(attempt < 3, "{mode}: late on every measurement: {late:?}");
        }
        let tx = &sw.port_stats("vm2")["tx"];
        assert!(
            tx["notifications_coalesced"].as_u64().unwrap() >= 150,
            "{tx}"
        );
        assert!(tx["guest_notifications"].as_u64().unwrap() >= 230, "{tx}");
    }
}

/// An Ethernet + IPv4 (or IPv6) + TCP frame with `payload` bytes of pattern and a 32-byte TCP
/// header, its checksum field holding the pseudo-header sum, as a sender that leaves the
/// checksum to the device (NEEDS_CSUM) writes it. Returns the frame and the TCP offset.
fn tcp_frame(dst: u64, src: u64, v6: bool, payload: usize) -> (Vec<u8>, usize) {
    use ferrovs_packet::offload::{csum_add, csum_fold};
    let mut f = Vec::new();
    f.extend_from_slice(&dst.to_be_bytes()[2..]);
    f.extend_from_slice(&src.to_be_bytes()[2..]);
    let l3 = 14;
    let tcp_len = 32 + payload;
    let pseudo = if v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend((0..32).map(|i| 0xfd + i as u8));
        csum_add(
            csum_add(0, &f[l3 + 8..l3 + 40]),
            &(tcp_len as u32).to_be_bytes(),
        ) + 6
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let c = !csum_fold(csum_add(0, &f[l3..l3 + 20]));
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        csum_add(0, &f[l3 + 12..l3 + 20]) + 6 + tcp_len as u64
    };
    let l4 = f.len();
    f.extend_from_slice(&[0x9c, 0x40, 0x13, 0x89, 0, 0, 0, 1, 0, 0, 0, 1]);
    f.extend_from_slice(&[0x80, 0x18, 0x01, 0xf5, 0, 0, 0, 0]);
    f.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    f.extend((0..payload).map(|i| (i % 251) as u8));
    let p = csum_fold(pseudo);
    f[l4 + 16..l4 + 18].copy_from_slice(&p.to_be_bytes());
    (f, l4)
}

#[test]
fn offloads_pass_through_or_are_done_in_software() {
    use ferrovs_packet::offload::tcp_checksums_ok;
    use ferrovs_sys::kernel::vnet::{self, VnetHdr};
    use ferrovs_vhost::features::OFFLOADS;
    let sw = Switch::start("offload");
    sw.add_port("vm3", &[]);
    wait_until("sockets", || {
        ["vm1", "vm2", "vm3"].iter().all(|p| sw.sock(p).exists())
    });
    let big = FrontendConfig {
        ring_size: 64,
        buf_size: 70_000,
        want_features: FrontendConfig::default().want_features | OFFLOADS,
        ..Default::default()
    };
    // A sends TSO; B takes TSO (gets the packet as sent); C has no offload feature at all.
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, big.clone());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, big);
    let mut c = attach(&sw.sock("vm3"), 0x0200_0000_0003, FrontendConfig::default());
    let show = sw.req(Request::Show).unwrap();
    let port = |n: &str| {
        show["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(
        port("vm1")["offloads"]["sends"],
        serde_json::json!(["csum", "tso4", "tso6", "tso_ecn"])
    );
    assert_eq!(
        port("vm2")["offloads"]["accepts"],
        serde_json::json!(["csum", "tso4", "tso6", "tso_ecn"])
    );
    assert_eq!(port("vm3")["offloads"]["accepts"], serde_json::json!([]));

    // Destination unknown to the switch: flooded to B and C, so each packet is seen both
    // ways at once.
    let unknown = 0x0200_0000_00ee;
    let drain = |g: &mut Guest, want: usize| {
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < want && t.elapsed() < Duration::from_secs(10) {
            g.rx.recv_with_hdr(64, |h, p| got.push((h, p.to_vec())));
        }
        std::thread::sleep(Duration::from_millis(50));
        g.rx.recv_with_hdr(64, |h, p| got.push((h, p.to_vec())));
        got
    };
    let mut expect_segments = 0;
    for (v6, payload, mss) in [
        (false, 20_000, 1448),
        (true, 30_000, 1428),
        (false, 60_000, 1448),
    ] {
        let (f, l4) = tcp_frame(unknown, a.mac, v6, payload);
        let hdr = VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: if v6 { vnet::GSO_TCPV6 } else { vnet::GSO_TCPV4 },
            hdr_len: (l4 + 32) as u16,
            gso_size: mss,
            csum_start: l4 as u16,
            csum_offset: 16,
        };
        assert!(a.tx.send_offload(&f, &hdr));
        let got_b = drain(&mut b, 1);
        assert_eq!(got_b.len(), 1, "B takes the TSO packet whole");
        assert_eq!(got_b[0].0, hdr, "with its header");
        assert_eq!(got_b[0].1, f);
        let n = payload.div_ceil(mss as usize);
        expect_segments += n;
        let got_c = drain(&mut c, n);
        assert_eq!(got_c.len(), n, "C gets MSS-sized segments");
        let mut data = Vec::new();
        for (h, p) in &got_c {
            assert_eq!(*h, VnetHdr::default());
            assert!(p.len() <= l4 + 32 + mss as usize, "segment of {}", p.len());
            assert_eq!(tcp_checksums_ok(p), Some(true), "v6 {v6}");
            data.extend_from_slice(&p[l4 + 32..]);
        }
        assert_eq!(data, f[l4 + 32..], "payload intact and in order");
    }
    // A checksum only, unicast (the switch learns B and C first): B gets it partial, C
    // complete. (Flooded to both, it would be completed once for both.)
    let hello = |g: &mut Guest| {
        let f = frame(0x0200_0000_0001, g.mac, 0, 64);
        assert!(g.tx.send(&f));
    };
    hello(&mut b);
    hello(&mut c);
    assert_eq!(drain(&mut a, 2).len(), 2);
    let (f, l4) = tcp_frame(b.mac, a.mac, false, 1000);
    let hdr = VnetHdr {
        flags: vnet::F_NEEDS_CSUM,
        csum_start: l4 as u16,
        csum_offset: 16,
        ..Default::default()
    };
    assert!(a.tx.send_offload(&f, &hdr));
    let got_b = drain(&mut b, 1);
    assert_eq!((got_b[0].0, &got_b[0].1), (hdr, &f));
    let (mut f, l4) = tcp_frame(c.mac, a.mac, false, 1000);
    assert!(a.tx.send_offload(&f, &hdr));
    let got_c = drain(&mut c, 1);
    assert_eq!(got_c.len(), 1);
    assert_eq!(got_c[0].0, VnetHdr::default());
    assert_eq!(tcp_checksums_ok(&got_c[0].1), Some(true));
    ferrovs_packet::offload::complete_csum(&mut f, l4, 16).unwrap();
    assert_eq!(got_c[0].1, f, "only the checksum changed");

    let s3 = sw.port_stats("vm3");
    assert_eq!(s3["offload"]["sw_tso"], 3);
    assert_eq!(s3["offload"]["sw_segments"], expect_segments);
    assert_eq!(s3["offload"]["sw_csum"], 1);
    assert_eq!(sw.port_stats("vm2")["offload"]["sw_tso"], 0);

    // Bad offload requests: dropped and counted at the sender, its queue keeps working.
    let (f, l4) = tcp_frame(unknown, a.mac, false, 5000);
    let bad = [
        // UDP fragmentation offload was not negotiated.
        VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: vnet::GSO_UDP,
            gso_size: 1400,
            csum_start: l4 as u16,
            csum_offset: 6,
            ..Default::default()
        },
        // The checksum field lies beyond the packet.
        VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            csum_start: 5000,
            csum_offset: 200,
            ..Default::default()
        },
        // TSO without a partial checksum.
        VnetHdr {
            gso_type: vnet::GSO_TCPV4,
            gso_size: 1448,
            ..Default::default()
        },
        // TSO whose checksum start is not the TCP header (C cannot segment it; B, which
        // negotiated TSO, gets it as sent, like a NIC would).
        VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: vnet::GSO_TCPV4,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
            ..Default::default()
        },
    ];
    for h in &bad {
        assert!(a.tx.send_offload(&f, h));
    }
    wait_until("bad offloads counted", || {
        let s = sw.port_stats("vm1");
        s["rx"]["drops"]["bad_offload"] == 4
    });
    assert_eq!(drain(&mut b, 1).len(), 1);
    assert!(drain(&mut c, 0).is_empty(), "C got none of them");
    let s1 = sw.port_stats("vm1");
    assert!(s1["queues"][1]["broken"].is_null());
    // And the port still forwards.
    let got = exchange(&mut a, &mut c, 100, 200);
    assert_eq!(got.len(), 100);
}

// ---- The flow pipeline ------------------------------------------------------------------

fn udp(dst: u64, src: u64, flow: u16, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; 100];
    let n = build::udp_frame(
        &mut b,
        100,
        dst,
        src,
        Stamp {
            flow,
            seq,
            tx_ns: 1,
        },
    );
    b.truncate(n);
    b
}

fn udp_dst_port(p: &[u8]) -> u16 {
    u16::from_be_bytes([p[36], p[37]])
}

impl Switch {
    fn add_flows(&self, flows: &[&str]) -> Result<Value, String> {
        self.req(Request::AddFlows {
            bridge: "br0".into(),
            flows: flows.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn del_flows(&self, filter: &str, strict: bool) -> Value {
        self.req(Request::DelFlows {
            bridge: "br0".into(),
            filter: Some(filter.into()),
            strict,
        })
        .unwrap()
    }

    fn dump_flows(&self) -> Vec<Value> {
        self.req(Request::DumpFlows {
            bridge: "br0".into(),
            filter: None,
        })
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
    }

    fn drops(&self, port: &str, reason: &str) -> u64 {
        self.port_stats(port)["rx"]["drops"][reason]
            .as_u64()
            .unwrap_or(0)
    }
}

/// Three guests on one bridge: rules steer, drop and rewrite; counters follow; deleting a
/// rule goes back to NORMAL at once.
#[test]
fn flow_rules_steer_drop_rewrite_and_count() {
    let sw = Switch::start("flows");
    sw.add_port("vm3", &[]);
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    let mut c = attach(&sw.sock("vm3"), 0x0200_0000_0003, FrontendConfig::default());
    // Learn b's address (NORMAL), so unicast to b is not flooded.
    assert!(b.tx.send(&udp(ferrovs_packet::BROADCAST, b.mac, 0, 0)));
    let (mut flooded_a, mut flooded_c) = (0, 0);
    wait_until("learning", || {
        a.rx.recv_with(32, |_| flooded_a += 1);
        c.rx.recv_with(32, |_| flooded_c += 1);
        flooded_a == 1 && flooded_c == 1
    });
    sw.add_flows(&[
        // flow 1 (src port 1025) goes to vm3 instead of vm2
        "priority=100,in_port=vm1,udp,tp_src=1025 actions=output:vm3",
        // flow 2 is dropped
        "priority=100,in_port=vm1,udp,tp_src=1026 actions=drop",
        // flow 3 is rewritten to port 7 and sent on by NORMAL
        "priority=100,in_port=vm1,udp,tp_src=1027 actions=mod_tp_dst:7,normal",
    ])
    .unwrap();
    assert_eq!(sw.dump_flows().len(), 4, "3 rules + the default NORMAL");
    for seq in 0..40u64 {
        let flow = (seq % 4) as u16; // 0: NORMAL, 1: vm3, 2: drop, 3: rewrite
        while !a.tx.send(&udp(b.mac, a.mac, flow, seq)) {}
    }
    let (mut at_b, mut at_c) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    while !(at_b.len() + at_c.len() == 30 && sw.drops("vm1", "flow_drop") == 10) {
        b.rx.recv_with(32, |p| {
            at_b.push((build::parse_udp_frame(p).unwrap().seq, udp_dst_port(p)))
        });
        c.rx.recv_with(32, |p| at_c.push(build::parse_udp_frame(p).unwrap().seq));
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "at vm2 {at_b:?}, at vm3 {at_c:?}, vm1 {}, flows {:?}",
            sw.port_stats("vm1"),
            sw.dump_flows()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(at_c.iter().all(|s| s % 4 == 1), "{at_c:?}");
    assert_eq!(at_c.len(), 10);
    for (s, port) in &at_b {
        match s % 4 {
            0 => assert_eq!(*port, 9),
            3 => assert_eq!(*port, 7, "rewritten"),
            _ => panic!("seq {s} reached vm2"),
        }
    }
    let flows = sw.dump_flows();
    for f in &flows {
        let text = f["flow"].as_str().unwrap();
        let n = f["n_packets"].as_u64().unwrap();
        if text.contains("1025") || text.contains("1026") || text.contains("1027") {
            assert_eq!(n, 10, "{text}");
            assert_eq!(f["n_bytes"].as_u64().unwrap(), 1000, "{text}");
        }
    }
    // Deleting the steering rule: the very next packets follow NORMAL again.
    let r = sw.del_flows("priority=100,in_port=vm1,udp,tp_src=1025", true);
    assert_eq!(r["deleted"], 1);
    for seq in 100..110u64 {
        while !a.tx.send(&udp(b.mac, a.mac, 1, seq)) {}
    }
    let mut n = 0;
    wait_until("NORMAL again", || {
        b.rx.recv_with(32, |p| {
            assert_eq!(build::parse_udp_frame(p).unwrap().seq / 100, 1);
            n += 1
        });
        n == 10
    });
    let mut stray = 0;
    c.rx.recv_with(32, |_| stray += 1);
    assert_eq!(stray, 0, "a deleted rule still steered packets");
    // Non-strict delete of everything in_port=vm1 covers: the two rules left.
    assert_eq!(sw.del_flows("in_port=vm1", false)["deleted"], 2);
    assert_eq!(sw.dump_flows().len(), 1);
    let _ = (&a.fe, &b.fe, &c.fe, &mut b.tx, &mut c.tx);
}

/// Rules flip between forward, drop and rewrite while packets flow through the EMC and the
/// megaflow cache: after every acknowledged change, every packet is decided by the new rule
/// alone (a stale cached decision would deliver a packet that must be dropped, drop one that
/// must arrive, or leave a port unrewritten).
#[test]
fn revalidation_under_rule_churn_never_uses_a_stale_rule() {
    let sw = Switch::start("churn");
    sw.req(Request::ConfigSet {
        key: "emc-insert-inv-prob".into(),
        value: "1".into(),
    })
    .unwrap();
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    // Some rules that never match, so the cache has several subtables.
    sw.add_flows(&[
        "priority=50,ip,nw_dst=192.168.0.0/16 actions=drop",
        "priority=40,in_port=vm2,tcp actions=drop",
        "priority=30,udp,tp_dst=53 actions=drop",
    ])
    .unwrap();
    let mut seq = 0u64;
    let mut drops = sw.drops("vm1", "flow_drop");
    for epoch in 0..45u64 {
        let (rule, outcome) = match epoch % 3 {
            0 => (
                "priority=200,in_port=vm1,udp,tp_dst=9 actions=output:vm2",
                9,
            ),
            1 => ("priority=200,in_port=vm1,udp,tp_dst=9 actions=drop", 0),
            _ => (
                "priority=200,in_port=vm1,udp,tp_dst=9 actions=mod_tp_dst:99,output:vm2",
                99,
            ),
        };
        // Same match and priority: the add replaces the rule.
        sw.add_flows(&[rule]).unwrap();
        let first = seq;
        for i in 0..64u16 {
            // 16 flows, 4 packets each: EMC and megaflow entries per flow, all invalidated
            // at each change.
            while !a.tx.send(&udp(b.mac, a.mac, i % 16, seq)) {}
            seq += 1;
        }
        if outcome == 0 {
            wait_until("drops", || sw.drops("vm1", "flow_drop") == drops + 64);
            drops += 64;
        } else {
            let mut got = 0;
            wait_until("delivery", || {
                b.rx.recv_with(32, |p| {
                    let s = build::parse_udp_frame(p).unwrap().seq;
                    assert!(s >= first, "epoch {epoch}: packet {s} of an earlier epoch");
                    assert_eq!(udp_dst_port(p), outcome, "epoch {epoch}: stale action");
                    got += 1;
                });
                got == 64
            });
        }
        assert_eq!(
            sw.drops("vm1", "flow_drop"),
            drops,
            "epoch {epoch}: stale drop"
        );
    }
    // Nothing arrived late from a drop epoch.
    std::thread::sleep(Duration::from_millis(50));
    let mut late = 0;
    b.rx.recv_with(32, |_| late += 1);
    assert_eq!(late, 0);
    let pmd = &sw.req(Request::PmdStats).unwrap()[0];
    let f = &pmd["flow"];
    assert!(f["emc_hits"].as_u64().unwrap() > 0, "{pmd}");
    assert!(f["upcalls"].as_u64().unwrap() >= 45, "{pmd}");
    let caches = pmd["megaflow_caches"].as_array().unwrap();
    assert!(caches[0]["invalidated"].as_u64().unwrap() > 0, "{pmd}");
    let _ = (&a.fe, &b.fe, &mut b.tx);
}

/// The megaflow of a rule on one field ignores the others: many flows, one entry per input
/// port, decided by the cache after the first upcall.
#[test]
fn megaflows_wildcard_what_the_rules_ignore() {
    let sw = Switch::start("megaflow");
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    sw.add_flows(&[
        "priority=10,udp,tp_dst=9 actions=output:vm2",
        "priority=5,tcp actions=drop",
    ])
    .unwrap();
    for i in 0..200u16 {
        while !a.tx.send(&udp(b.mac, a.mac, i, u64::from(i))) {}
    }
    let mut got = 0;
    wait_until("delivery", || {
        b.rx.recv_with(32, |_| got += 1);
        got == 200
    });
    let mf = sw
        .req(Request::DumpMegaflows {
            bridge: "br0".into(),
        })
        .unwrap();
    let mf = mf.as_array().unwrap();
    assert_eq!(mf.len(), 1, "{mf:?}");
    let m = mf[0]["match"].as_str().unwrap();
    assert!(m.contains("in_port=vm1") && m.contains("tp_dst=9"), "{m}");
    assert!(!m.contains("tp_src") && !m.contains("nw_src"), "{m}");
    assert_eq!(mf[0]["packets"].as_u64(), Some(200));
    let f = &sw.req(Request::PmdStats).unwrap()[0]["flow"];
    assert!(f["upcalls"].as_u64().unwrap() <= 2, "{f}");
    let _ = (&a.fe, &b.fe, &mut b.tx);
}

#[test]
fn rule_timeouts_expire() {
    let sw = Switch::start("timeouts");
    sw.add_flows(&[
        "priority=10,hard_timeout=1,tcp actions=drop",
        "priority=11,idle_timeout=1,udp actions=drop",
        "priority=12,icmp actions=drop",
    ])
    .unwrap();
    assert_eq!(sw.dump_flows().len(), 4);
    wait_until("both timed rules expired", || sw.dump_flows().len() == 2);
    let left: Vec<String> = sw
        .dump_flows()
        .iter()
        .map(|f| f["flow"].as_str().unwrap().to_string())
        .collect();
    assert!(left.iter().any(|f| f.contains("icmp")), "{left:?}");
}

#[test]
fn bad_flows_are_refused_whole_with_a_precise_error() {
    let sw = Switch::start("badflows");
    let e = sw
        .add_flows(&["priority=1,nw_dts=10.0.0.1 actions=drop"])
        .unwrap_err();
    assert!(e.contains("nw_dts"), "{e}");
    let e = sw
        .add_flows(&[
            "priority=1,udp actions=drop",
            "priority=1,tp_dst=80 actions=drop",
        ])
        .unwrap_err();
    assert!(e.starts_with("flow 2: "), "{e}");
    let e = sw
        .req(Request::AddFlows {
            bridge: "nope".into(),
            flows: vec!["actions=drop".into()],
        })
        .unwrap_err();
    assert!(e.contains("no bridge named nope"), "{e}");
    let e = sw
        .req(Request::DelFlows {
            bridge: "br0".into(),
            filter: Some("tp_dst=99999".into()),
            strict: false,
        })
        .unwrap_err();
    assert!(e.contains("bad flow filter"), "{e}");
    // Nothing was installed, and the bridge still switches as before.
    assert_eq!(sw.dump_flows().len(), 1);
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    assert_eq!(exchange(&mut a, &mut b, 50, 100).len(), 50);
}

/// A bulk load of 50 000 rules is one request (all or none) of some 3 MiB, and dumping them
/// is a reply of some 10 MiB: both go through the control socket whole.
#[test]
fn bulk_rules_go_through_the_control_socket_whole() {
    let sw = Switch::start("bulk");
    let flows: Vec<String> = (0..50_000u32)
        .map(|i| {
            format!(
                "priority=20,ip,nw_dst=10.{}.{}.{} actions=drop",
                100 + (i >> 16),
                (i >> 8) & 0xff,
                i & 0xff
            )
        })
        .collect();
    let r = sw
        .req(Request::AddFlows {
            bridge: "br0".into(),
            flows,
        })
        .unwrap();
    assert_eq!(r["rules"], 50_001);
    assert_eq!(sw.dump_flows().len(), 50_001);
    // The switch still forwards (10.0.0.2 matches none; the default NORMAL rule decides).
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    assert_eq!(exchange(&mut a, &mut b, 100, 100).len(), 100);
}

/// Every port has an OpenFlow number on its bridge: the one it asks for when free, else the
/// lowest free one; the bridge's own TAP (named as the bridge) is OFPP_LOCAL.
#[test]
fn ports_get_openflow_numbers() {
    let sw = Switch::start("ofport");
    let ofports = || -> Vec<(String, u64)> {
        let s = sw.req(Request::Show).unwrap();
        s["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["ofport"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(ofports(), vec![("vm1".into(), 1), ("vm2".into(), 2)]);
    sw.add_port("a", &["ofport=7"]);
    sw.add_port("b", &["ofport=7"]);
    sw.add_port("c", &[]);
    let got = ofports();
    let of = |n: &str| got.iter().find(|p| p.0 == n).unwrap().1;
    assert_eq!((of("a"), of("b"), of("c")), (7, 3, 4));
    let e = sw
        .req(Request::AddPort {
            bridge: "br0".into(),
            port: "d".into(),
            options: vec![
                "type=vhost-user".into(),
                format!("path={}", sw.sock("d").display()),
                "ofport=65280".into(),
            ],
        })
        .unwrap_err();
    assert!(e.contains("ofport=65280 out of range 1..=65279"), "{e}");
    if !std::path::Path::new("/dev/net/tun").exists() {
        return;
    }
    sw.req(Request::AddPort {
        bridge: "br0".into(),
        port: "br0".into(),
        options: vec![
            "type=tap".into(),
            format!("dev=fvloc{}", std::process::id() % 100_000),
        ],
    })
    .unwrap();
    let got = ofports();
    assert_eq!(got.iter().find(|p| p.0 == "br0").unwrap().1, 65534);
}

/// A guest that sends now and then (a queue quiet for more than 1 ms each time) beside a busy
/// pair on the same PMD: its quiet queue is polled at the sweep interval while the PMD is busy
/// (`pmd-stats` counts the skipped polls), and every frame it sends still arrives, intact.
/// `pmd-quiet-rxq-poll-us 0` polls every queue every iteration again.
#[test]
fn a_quiet_guest_beside_a_busy_pair_loses_nothing() {
    let sw = Switch::start("quiet");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    sw.add_port("vm3", &[]);
    let get = |k: &str| {
        sw.req(Request::ConfigGet {
            key: Some(k.into()),
        })
        .unwrap()
    };
    assert_eq!(get("pmd-quiet-rxq-poll-us"), "50");
    let skips = || -> u64 {
        let s = sw.req(Request::PmdStats).unwrap();
        s.as_array()
            .unwrap()
            .iter()
            .map(|p| p["quiet_skips"].as_u64().unwrap())
            .sum()
    };
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    let mut c = attach(&sw.sock("vm3"), 0x0200_0000_0003, FrontendConfig::default());
    // Learn every address: b's replies and c's first frame.
    assert_eq!(exchange(&mut a, &mut b, 10, 64).len(), 10);
    assert_eq!(exchange(&mut b, &mut a, 10, 64).len(), 10);
    assert_eq!(exchange(&mut c, &mut b, 10, 64).len(), 10);
    // a streams to b; every 10 ms c sends one frame to b (its queue quiet in between).
    let run = |a: &mut Guest, b: &mut Guest, c: &mut Guest, n_c: u64| -> (u64, u64) {
        let (mut sent, mut from_a, mut from_c) = (0u64, 0u64, 0u64);
        let mut c_sent = 0u64;
        let mut next_c = Instant::now() + Duration::from_millis(10);
        let deadline = Instant::now() + Duration::from_secs(20);
        while (c_sent < n_c || from_c < c_sent) && Instant::now() < deadline {
            if sent - from_a < 192 && a.tx.send(&frame(b.mac, a.mac, sent, 64)) {
                sent += 1;
            }
            if c_sent < n_c && Instant::now() >= next_c {
                assert!(c.tx.send(&frame(b.mac, c.mac, c_sent, 128)));
                c_sent += 1;
                next_c += Duration::from_millis(10);
            }
            b.rx.recv_with(32, |p| {
                let st = build::parse_udp_frame(p).expect("intact frame");
                if p.len() == 128 {
                    assert_eq!(st.seq, from_c, "c's frames in order");
                    from_c += 1;
                } else {
                    from_a += 1;
                }
            });
            // Floods (none expected once learned) would fill a's and c's receive rings.
            a.rx.recv_with(32, |_| {});
            c.rx.recv_with(32, |_| {});
        }
        (from_a, from_c)
    };
    let before = skips();
    let (from_a, from_c) = run(&mut a, &mut b, &mut c, 50);
    assert_eq!(from_c, 50, "every frame of the quiet guest arrived");
    assert!(from_a > 1000, "the busy pair forwarded ({from_a})");
    // The PMD publishes its counters at least every 256 iterations.
    wait_until("quiet skips published", || skips() > before);
    let gap = sw.req(Request::PmdStats).unwrap()[0]["quiet_gap_max_us"]
        .as_f64()
        .unwrap();
    eprintln!(
        "quiet polls skipped: {}, longest wait {gap} us",
        skips() - before
    );
    assert!(gap > 0.0, "the longest wait of a quiet queue is measured");
    // Off: no poll is skipped any more.
    sw.req(Request::ConfigSet {
        key: "pmd-quiet-rxq-poll-us".into(),
        value: "0".into(),
    })
    .unwrap();
    assert_eq!(get("pmd-quiet-rxq-poll-us"), "0");
    std::thread::sleep(Duration::from_millis(50));
    let off = skips();
    let (_, from_c) = run(&mut a, &mut b, &mut c, 10);
    assert_eq!(from_c, 10);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(skips(), off);
    assert_eq!(sw.port_stats("vm3")["rx"]["dropped"], 0);
    assert!(sw
        .req(Request::ConfigSet {
            key: "pmd-quiet-rxq-poll-us".into(),
            value: "1001".into(),
        })
        .unwrap_err()
        .contains("0..=1000"));
}
