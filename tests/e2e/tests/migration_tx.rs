//! Live migration of a real QEMU guest (TCG) that *sends*: tests/e2e/tests/migration.rs
//! migrates a guest that only receives (its announce check needs a guest that sends nothing
//! unasked), so the switch's writes it checks are those into receive buffers and the receive
//! ring. Here the migrating guest streams sequenced UDP out through the switch to a peer
//! guest while it is migrated by precopy: the switch's writes into the guest are then the
//! used entries of its transmit ring (split: the used ring; packed: used descriptors in the
//! descriptor ring, and the device event structure), each of which must be logged. Both
//! QEMUs are paused at the end (the destination started with `-S`) and guest RAM must be
//! identical page for page; the destination goes on sending from where the source stopped.
//! Runs on split rings, and on packed rings with `FERROVS_GUEST_RING=packed` (guest.rs).

use std::path::Path;
use std::time::{Duration, Instant};

use ferrovs_e2e::guest::*;
use ferrovs_e2e::*;
use serde_json::{json, Value};

const M_MAC: &str = "52:54:00:00:00:0a";
const P_MAC: &str = "52:54:00:00:00:02";
/// The migrating guest's stream: datagrams per second, how many, bytes each.
const PPS: u64 = 2000;
const COUNT: u64 = 60_000;
const SIZE: u64 = 256;

fn connected(dir: &Path, name: &str) -> bool {
    cli_json(dir, &["show"])["bridges"][0]["ports"]
        .as_array()
        .is_some_and(|ps| {
            ps.iter()
                .any(|p| p["name"] == name && p["state"] == "connected")
        })
}

#[test]
fn precopy_while_the_guest_sends_keeps_guest_memory_identical() {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("migration-tx");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    let (vma, vmb) = (
        add_vhost_user_port(&dir, "vma"),
        add_vhost_user_port(&dir, "vmb"),
    );
    let vm1 = dir.join("vm1.sock").display().to_string();

    // The peer receives on vm1; the migrating guest sends to it from vma once it answers.
    let peer = Guest::new(
        "p",
        &format!("socket,id=c0,path={vm1},reconnect=1"),
        P_MAC,
        &format!(
            "ipv6.disable=1 ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool \
             ferrovs.neigh=10.0.0.1,{M_MAC} ferrovs.args=udp-recv,5001,10,1"
        ),
    );
    let _peer_proc = peer.start(&dir, &img);
    let mut src = Guest::new(
        "m-src",
        &format!("socket,id=c0,path={vma},reconnect=1"),
        M_MAC,
        &format!(
            "ipv6.disable=1 ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool \
             ferrovs.neigh=10.0.0.2,{P_MAC} ferrovs.peer=10.0.0.2 ferrovs.wait=60 \
             ferrovs.args=udp-send,10.0.0.2,5001,{PPS},{COUNT},{SIZE}"
        ),
    );
    src.qmp = true;
    let _src_proc = src.start(&dir, &img);
    let mut qs = src.qmp(&dir);

    // One second of the stream at the peer before the migration.
    let t = Instant::now();
    let before = loop {
        let p = progress(&console(&dir, "p"));
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
    };
    let ring = assert_ring(&dir, "vma", "m-src", 10);
    assert_ring(&dir, "vm1", "p", 10);

    // The destination on vmb, paused after the migration so that both RAMs can be saved.
    let uri = format!("unix:{}", dir.join("m-dst.mig").display());
    let chardev = format!("socket,id=c0,path={vmb},reconnect=1");
    let mut dst = src.destination("m-dst", Some(&chardev), &uri);
    dst.paused = true;
    let _dst_proc = dst.start(&dir, &img);
    let mut qd = dst.qmp(&dir);
    wait_until("m-dst connected to vmb", 20, || connected(&dir, "vmb"));
    let stats0 = cli_json(&dir, &["port-stats"]);

    let mig = migrate(&mut qs, &mut qd, &MigrateOpts::new(&uri, false));
    eprintln!("migration-tx ({ring} rings): {}", mig.summary());
    assert_eq!(mig.status, "completed", "{}", mig.summary());
    assert_eq!(qs.status(), "postmigrate");
    assert_eq!(qd.status(), "paused");
    let (a, b) = (dir.join("src.ram"), dir.join("dst.ram"));
    save_ram(&mut qs, &a);
    save_ram(&mut qd, &b);
    let c = compare_ram(&a, &b);
    eprintln!("migration-tx: RAM {c:?}");
    assert_eq!(c.pages, GUEST_RAM / 4096);
    assert_eq!(
        (c.differing, c.digest_a),
        (0, c.digest_b),
        "pages differ between source and destination (kept: {} {}): {c:?}",
        a.display(),
        b.display()
    );
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    let stats1 = cli_json(&dir, &["port-stats"]);
    qd.run("cont", json!({}));
    let _ = qs.execute("quit", json!({}));

    // The destination sends the rest of the stream from vmb.
    let secs = COUNT / PPS + 120;
    wait_console(&dir, "m-dst", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], secs);
    wait_console(&dir, "p", &["FERROVS-TOOL-DONE", "FERROVS-ERROR"], 60);
    let stats2 = cli_json(&dir, &["port-stats"]);
    let tx = results(&dir, "m-dst")
        .into_iter()
        .find(|r| r.get("sent").is_some())
        .unwrap_or_else(|| panic!("sender result:\n{}", console(&dir, "m-dst")));
    let rx = results(&dir, "p")
        .into_iter()
        .find(|r| r.get("received").is_some())
        .unwrap_or_else(|| panic!("receiver result:\n{}", console(&dir, "p")));
    let n = |s: &Value, p: &str, d: &str, k: &str| port_stats_of(s, p)[d][k].as_u64().unwrap_or(0);
    let logged = n(&stats1, "vma", "rx", "dirty_pages_logged")
        - n(&stats0, "vma", "rx", "dirty_pages_logged");
    let from_dst = n(&stats2, "vmb", "rx", "packets");
    eprintln!(
        "migration-tx ({ring} rings): stream before {before}; sender {tx}; receiver {rx}; \
         pages logged for the guest's transmit ring during the migration {logged}; \
         packets from the destination {from_dst}; vma rx {}; vmb rx {}; vm1 tx {}",
        port_stats_of(&stats2, "vma")["rx"],
        port_stats_of(&stats2, "vmb")["rx"],
        port_stats_of(&stats2, "vm1")["tx"],
    );
    assert_eq!(tx["send_errors"], 0, "{tx}");
    assert_eq!(tx["sent"], COUNT, "{tx}");
    assert_eq!(
        (&rx["corrupt"], &rx["duplicates"]),
        (&json!(0), &json!(0)),
        "{rx}"
    );
    assert!(logged > 0, "the transmit ring's used entries were logged");
    assert!(
        from_dst > PPS,
        "the destination went on sending: {from_dst} packets from vmb"
    );
    // Nothing the guests sent was refused or broke a queue, on either side.
    for p in stats2.as_array().unwrap() {
        for q in p["queues"].as_array().unwrap() {
            assert!(q["broken"].is_null(), "{}: {q}", p["port"]);
        }
        for d in ["rx", "tx"] {
            for r in GUEST_ERRORS {
                assert!(p[d]["drops"][r].is_null(), "{} {d}: {}", p["port"], p[d]);
            }
        }
        if p["port"] != "vm1" {
            assert_eq!(p["rx"]["dropped"], 0, "{p}");
        }
    }
    assert_port_ring(&dir, "vmb");
}
