//! A real QEMU guest that asks for packed rings (`-device virtio-net-pci,packed=on`) from a
//! switch that does not offer them (`vhost-packed-rings` turned off): QEMU leaves
//! VIRTIO_F_RING_PACKED out of what it offers the guest, whose driver then runs on split
//! rings, and the guests talk through the switch as usual. What an operator sees who turns
//! `packed=on` on before the switch.

use std::path::Path;

use ferrovs_e2e::guest::*;
use ferrovs_e2e::*;

#[test]
fn a_packed_on_guest_runs_on_split_rings_when_the_switch_does_not_offer_them() {
    if !guests_available() {
        return;
    }
    let img = guest_image();
    let dir = run_dir("packed-fallback");
    let (pmd, _) = cores();
    let _sw = start_switch(&dir, pmd, &[]);
    // Off whatever the run (on by default; a FERROVS_GUEST_RING=packed run sets it too).
    let o = cli(&dir, &["config", "set", "vhost-packed-rings", "false"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut procs = Vec::new();
    for (name, port, mac, append) in [
        (
            "b",
            "vm2",
            "52:54:00:00:00:02",
            "ferrovs.ip=10.0.0.2/24 ferrovs.cmd=idle",
        ),
        (
            "a",
            "vm1",
            "52:54:00:00:00:01",
            "ferrovs.ip=10.0.0.1/24 ferrovs.cmd=ping ferrovs.peer=10.0.0.2 ferrovs.count=5 \
             ferrovs.wait=60",
        ),
    ] {
        let sock = dir.join(format!("{port}.sock")).display().to_string();
        assert!(Path::new(&sock).exists(), "{sock}");
        let mut g = Guest::new(
            name,
            &format!("socket,id=c0,path={sock},reconnect=1"),
            mac,
            append,
        );
        g.ring = Ring::Packed;
        assert!(g.args(&dir, &img).iter().any(|a| a.contains(",packed=on")));
        procs.push(g.start(&dir, &img));
    }
    // A first: it powers off once its pings are done (B idles).
    for (name, port) in [("a", "vm1"), ("b", "vm2")] {
        wait_console(&dir, name, &["FERROVS-NIC "], 120);
        let bits = nic_features(&console(&dir, name)).expect("FERROVS-NIC line");
        assert_eq!(
            bits.as_bytes().get(RING_PACKED_BIT),
            Some(&b'0'),
            "{name}: packed=on, switch not offering: split rings ({bits})"
        );
        let show = cli_json(&dir, &["show"]);
        let p = show["bridges"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == port)
            .unwrap()
            .clone();
        let f = p["features"].as_array().unwrap();
        assert!(f.iter().any(|x| x == "version_1"), "{p}");
        assert!(!f.iter().any(|x| x == "ring_packed"), "{p}");
    }
    let verdict = wait_console(&dir, "a", &["FERROVS-PING-OK", "FERROVS-PING-FAIL"], 120);
    assert_eq!(verdict, "FERROVS-PING-OK", "{}", console(&dir, "a"));
    drop(procs);
}
