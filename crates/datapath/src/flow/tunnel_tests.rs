//! Tunnel metadata through the flow path, with PMD iterations over dummy ports: port 0 is a
//! guest (`vm1`), port 1 plays a `key=flow` tunnel port (`tun`): it receives frames with
//! per-frame metadata and captures the metadata of every frame sent to it. As OVN uses a
//! Geneve port: `set_field:...->tun_id` and `set_field:...->tun_metadata0` before the
//! output, `tun_id` and `tun_metadata0` matched on receive (through `ct(table=...)` too).

use std::net::Ipv4Addr;
use std::sync::Arc;

use ferrovs_flow::{parse_flow, FlowSpec, Pipeline, RuleStats, TunnelKey};
use ferrovs_sys::pool::Pool;

use super::{BridgeFlows, MegaflowCache};
use crate::pmd::Worker;
use crate::port::{Port, PortIo, VlanMode};
use crate::testutil::dummy;
use crate::{Bridge, MacTable, RxqRef, Snapshot};

const NAMES: [&str; 2] = ["vm1", "tun"];

fn switch(rules: &[&str]) -> Snapshot {
    let specs: Vec<FlowSpec> = rules.iter().map(|r| parse_flow(r).unwrap()).collect();
    let pipeline = Pipeline::build(
        specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
        &|n: &str| NAMES.iter().position(|x| *x == n).map(|i| i as u32),
    );
    let ports = (0..2u32)
        .map(|id| {
            let io = crate::dummy::DummyIo::new(0);
            io.set_tunnel(id == 1);
            Some(Arc::new(Port {
                id,
                name: NAMES[id as usize].into(),
                bridge: 0,
                vlan: VlanMode::Trunk,
                io: PortIo::Dummy(io),
                rx_drops: Default::default(),
                tx_not_ready: Default::default(),
                offload: Default::default(),
                inject: Default::default(),
                capture: Default::default(),
                rxq_load: Default::default(),
            }))
        })
        .collect();
    let bridge = Bridge {
        name: "br0".into(),
        macs: Arc::new(MacTable::new(1024, 300)),
        ports: vec![0, 1],
        flows: Some(BridgeFlows {
            pipeline: Arc::new(pipeline),
            gen: 0,
            cache: Arc::new(MegaflowCache::new(0)),
            meters: Default::default(),
            packet_in: None,
            conntrack: Arc::new(ferrovs_conntrack::Tracker::new(Default::default())),
            learn: None,
        }),
        default_rule: None,
    };
    Snapshot {
        bridges: vec![Some(Arc::new(bridge))],
        ports,
        pmd_rxqs: vec![vec![
            RxqRef { port: 0, pair: 0 },
            RxqRef { port: 1, pair: 0 },
        ]],
    }
}

/// A UDP frame 10.0.0.1:1000 → 10.0.0.2:`dport` with a valid IPv4 header checksum.
fn udp(dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&50u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    let sum = ferrovs_packet::offload::csum_fold(ferrovs_packet::offload::csum_add(0, &f[14..34]));
    f[24..26].copy_from_slice(&(!sum).to_be_bytes());
    f[34..36].copy_from_slice(&1000u16.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[38..40].copy_from_slice(&30u16.to_be_bytes());
    f
}

fn meta(id: u64, m0: u32) -> TunnelKey {
    TunnelKey {
        id,
        src: Ipv4Addr::new(192, 168, 50, 2),
        dst: Ipv4Addr::new(192, 168, 50, 1),
        meta: [m0, 0, 0, 0],
        present: u8::from(m0 != 0),
    }
}

#[test]
fn set_tunnel_fields_go_with_each_output_to_a_flow_port() {
    let pool = Pool::new(256).unwrap();
    let mut w = Worker::new(0, &pool);
    let snap = switch(&[
        "priority=10,in_port=vm1,udp,tp_dst=1 actions=set_field:0x7b->tun_id,\
         set_field:0x10002->tun_metadata0,output:tun",
        // Metadata changed between two outputs: each copy carries its own.
        "priority=10,in_port=vm1,udp,tp_dst=2 actions=set_tunnel:1,output:tun,\
         set_field:0x5->tun_metadata0,set_tunnel:2,output:tun",
        "priority=0 actions=drop",
    ]);
    for _ in 0..3 {
        dummy(&snap, 0).push_rx(&udp(1));
    }
    w.poll(&snap, &snap.pmd_rxqs[0], 10);
    let want = TunnelKey {
        id: 0x7b,
        meta: [0x10002, 0, 0, 0],
        present: 1,
        ..TunnelKey::default()
    };
    assert_eq!(dummy(&snap, 1).take_sent().len(), 3);
    assert_eq!(dummy(&snap, 1).take_sent_tunnels(), vec![Some(want); 3]);
    dummy(&snap, 0).push_rx(&udp(2));
    w.poll(&snap, &snap.pmd_rxqs[0], 10);
    let t = dummy(&snap, 1).take_sent_tunnels();
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].unwrap().id, t[0].unwrap().present), (1, 0));
    assert_eq!(
        (
            t[1].unwrap().id,
            t[1].unwrap().meta[0],
            t[1].unwrap().present
        ),
        (2, 5, 1)
    );
    // The guest port takes no metadata: nothing recorded there.
    assert!(dummy(&snap, 0).take_sent_tunnels().is_empty());
}

#[test]
fn received_metadata_is_matched_per_packet() {
    let pool = Pool::new(256).unwrap();
    let mut w = Worker::new(0, &pool);
    let snap = switch(&[
        "priority=10,in_port=tun,tun_id=0x7b,tun_metadata0=0x10002 actions=output:vm1",
        "priority=5,in_port=tun,tun_metadata0=0x3/0xffff actions=drop",
        "priority=0 actions=drop",
    ]);
    let tun = dummy(&snap, 1);
    // One burst, three packets of three metadata: only the first matches.
    tun.push_rx_tunnel(&udp(1), meta(0x7b, 0x10002));
    tun.push_rx_tunnel(&udp(2), meta(0x7c, 0x10002));
    tun.push_rx_tunnel(&udp(3), meta(0x7b, 0x10003));
    tun.push_rx_tunnel(&udp(4), meta(0x7b, 0x10002));
    w.poll(&snap, &snap.pmd_rxqs[0], 10);
    let got = dummy(&snap, 0).take_sent();
    assert_eq!(got, vec![udp(1), udp(4)]);
}

#[test]
fn a_recirculated_pass_keeps_the_received_metadata() {
    let pool = Pool::new(256).unwrap();
    let mut w = Worker::new(0, &pool);
    let snap = switch(&[
        "table=0,priority=10,in_port=tun,udp actions=ct(table=1)",
        "table=1,priority=10,udp,ct_state=+trk+new,tun_metadata0=0x10002 \
         actions=set_field:0x9->tun_metadata1,ct(table=2)",
        "table=2,priority=10,udp,ct_state=+trk,tun_metadata1=0x9,tun_id=0x7b actions=output:vm1",
        "table=2,priority=0 actions=drop",
        "table=1,priority=0 actions=drop",
    ]);
    dummy(&snap, 1).push_rx_tunnel(&udp(7), meta(0x7b, 0x10002));
    dummy(&snap, 1).push_rx_tunnel(&udp(8), meta(0x7b, 0x10004));
    w.poll(&snap, &snap.pmd_rxqs[0], 10);
    assert_eq!(dummy(&snap, 0).take_sent(), vec![udp(7)]);
}
