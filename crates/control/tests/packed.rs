//! Packed virtqueues end to end, in process: the daemon in a thread, two mock guests on
//! packed rings (`ferrovs-vhost`'s frontend, as `ferrovs-gen --packed` drives it). No root,
//! no VM.

use ferrovs_proto::Request;
use ferrovs_vhost::features::VIRTIO_F_RING_PACKED;
use ferrovs_vhost::frontend::FrontendConfig;

mod common;
use common::*;

fn packed_cfg() -> FrontendConfig {
    let d = FrontendConfig::default();
    FrontendConfig {
        want_features: d.want_features | VIRTIO_F_RING_PACKED,
        ..d
    }
}

fn features_of(sw: &Switch, i: usize) -> Vec<String> {
    let show = sw.req(Request::Show).unwrap();
    show["bridges"][0]["ports"][i]["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn packed_rings_are_offered_by_default_and_can_be_turned_off() {
    let sw = Switch::start("packed-off");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let a = attach(&sw.sock("vm1"), 0x0200_0000_0001, packed_cfg());
    assert!(a.fe.packed(), "offered by default");
    drop(a);
    sw.req(Request::ConfigSet {
        key: "vhost-packed-rings".into(),
        value: "false".into(),
    })
    .unwrap();
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, packed_cfg());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, packed_cfg());
    assert!(!a.fe.packed(), "not offered with vhost-packed-rings=false");
    assert_eq!(exchange(&mut a, &mut b, 300, 64).len(), 300);
    assert!(!features_of(&sw, 0).iter().any(|f| f == "ring_packed"));
}

#[test]
fn forwards_on_packed_rings_in_order_and_intact() {
    let sw = Switch::start("packed-fwd");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    sw.req(Request::ConfigSet {
        key: "vhost-packed-rings".into(),
        value: "true".into(),
    })
    .unwrap();
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, packed_cfg());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, packed_cfg());
    assert!(a.fe.packed() && b.fe.packed());
    // Several laps of the 256-descriptor rings, both sizes (1518 B takes mergeable buffers'
    // single-buffer path; the rings wrap many times).
    for size in [64, 1518] {
        let got = exchange(&mut a, &mut b, 3000, size);
        assert_eq!(
            got,
            (0..3000).collect::<Vec<_>>(),
            "in order, none lost, size {size}: vm1 {} vm2 {}",
            sw.port_stats("vm1"),
            sw.port_stats("vm2")
        );
    }
    let got = exchange(&mut b, &mut a, 1000, 200);
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    let s1 = sw.port_stats("vm1");
    assert_eq!(s1["rx"]["packets"], 6000);
    assert_eq!(s1["rx"]["dropped"], 0);
    assert!(features_of(&sw, 0).iter().any(|f| f == "ring_packed"));
    assert!(features_of(&sw, 1).iter().any(|f| f == "ring_packed"));
    assert_eq!(a.rx.errors + b.rx.errors, 0);
    // GET_VRING_BASE on a packed ring: slot and wrap counter of both positions, equal.
    let base = a.fe.get_vring_base(1).unwrap();
    assert_eq!(base >> 16, base & 0xffff, "{base:#x}");
}

/// A frontend that gives a packed ring a bad base (a slot past the ring, a used position
/// that differs from the available one) is refused with a nonzero ack; the other port goes
/// on forwarding.
#[test]
fn a_bad_packed_ring_base_is_refused() {
    use ferrovs_vhost::msg::{self, payload, Code};
    let sw = Switch::start("packed-base");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    sw.req(Request::ConfigSet {
        key: "vhost-packed-rings".into(),
        value: "true".into(),
    })
    .unwrap();
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, packed_cfg());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, packed_cfg());
    // vm1's frontend stops its TX queue, then offers bad bases for it.
    let base = a.fe.get_vring_base(1).unwrap();
    assert_eq!(
        base, 0x8000_8000,
        "nothing sent yet: slot 0, wrap counters 1"
    );
    let ack = |fe: &mut ferrovs_vhost::frontend::Frontend, num: u32| {
        let m = msg::encode(
            Code::SetVringBase as u32,
            msg::FLAG_NEED_REPLY,
            &payload::state(1, num),
        );
        let (_, p, _) = fe.call_raw(&m, &[]).unwrap();
        u64::from_le_bytes(p[..8].try_into().unwrap())
    };
    assert_ne!(
        ack(&mut a.fe, 0x8000 | 256),
        0,
        "slot past a 256-entry ring"
    );
    assert_ne!(
        ack(&mut a.fe, 0x8005_8004),
        0,
        "used differs from available"
    );
    assert_eq!(ack(&mut a.fe, 0x8004_8004), 0, "a good base");
    assert_eq!(
        ack(&mut a.fe, 0x8004),
        0,
        "used omitted: the same as available"
    );
    // The other port is unaffected: vm2 → vm1's receive queue still works.
    let got = exchange(&mut b, &mut a, 200, 64);
    assert_eq!(got.len(), 200);
}

/// `VIRTIO_F_IN_ORDER` is offered on both ring layouts (the device uses buffers in the order
/// they were made available: DPDK's driver then runs its in-order paths, as it does with
/// DPDK's own backend). A frontend that takes it forwards in order and intact, and `show`
/// names it.
#[test]
fn in_order_is_offered_on_both_layouts() {
    use ferrovs_vhost::features::VIRTIO_F_IN_ORDER;
    let sw = Switch::start("in-order");
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let in_order = |packed: bool| {
        let d = if packed {
            packed_cfg()
        } else {
            FrontendConfig::default()
        };
        FrontendConfig {
            want_features: d.want_features | VIRTIO_F_IN_ORDER,
            ..d
        }
    };
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, in_order(false));
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, in_order(false));
    assert_eq!(
        exchange(&mut a, &mut b, 2000, 64),
        (0..2000).collect::<Vec<_>>()
    );
    for i in 0..2 {
        let f = features_of(&sw, i);
        assert!(f.iter().any(|f| f == "in_order"), "{f:?}");
        assert!(!f.iter().any(|f| f == "ring_packed"), "{f:?}");
    }
    drop((a, b));
    sw.req(Request::ConfigSet {
        key: "vhost-packed-rings".into(),
        value: "true".into(),
    })
    .unwrap();
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, in_order(true));
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, in_order(true));
    assert!(a.fe.packed() && b.fe.packed());
    assert_eq!(
        exchange(&mut a, &mut b, 2000, 1518),
        (0..2000).collect::<Vec<_>>()
    );
    let f = features_of(&sw, 0);
    assert!(
        f.iter().any(|f| f == "in_order") && f.iter().any(|f| f == "ring_packed"),
        "{f:?}"
    );
}

/// `config get` reads back `vhost-packed-rings` (and any other setting `config set` took).
#[test]
fn config_get_reads_back_what_config_set_took() {
    let sw = Switch::start("config-get");
    let get = |k: &str| {
        sw.req(Request::ConfigGet {
            key: Some(k.into()),
        })
    };
    assert_eq!(get("vhost-packed-rings").unwrap(), "true");
    for (k, v) in [("vhost-packed-rings", "false"), ("ct-max-entries", "5000")] {
        sw.req(Request::ConfigSet {
            key: k.into(),
            value: v.into(),
        })
        .unwrap();
        assert_eq!(get(k).unwrap(), v, "{k}");
    }
    let all = sw.req(Request::ConfigGet { key: None }).unwrap();
    assert_eq!(all["vhost-packed-rings"], "false", "{all}");
    assert!(get("no-such-setting").is_err());
}
