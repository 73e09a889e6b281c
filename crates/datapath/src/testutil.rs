//! Test fixtures shared by the datapath's unit tests: bridges of dummy ports and frames.

use std::sync::Arc;

use crate::dummy::DummyIo;
use crate::port::{Port, PortIo, VlanMode};
use crate::{Bridge, MacTable, RxqRef, Snapshot};

/// A port `id` of bridge 0 over a dummy port accepting offloads `caps`.
pub(crate) fn dummy_port(id: u32, vlan: VlanMode, caps: u8) -> Port {
    Port {
        id,
        name: format!("d{id}"),
        bridge: 0,
        vlan,
        io: PortIo::Dummy(DummyIo::new(caps)),
        rx_drops: Default::default(),
        tx_not_ready: Default::default(),
        offload: Default::default(),
        inject: Default::default(),
        capture: Default::default(),
        rxq_load: Default::default(),
    }
}

/// One bridge (id 0, plain L2) of dummy ports `0..vlans.len()` with these VLAN modes, every
/// port's queue polled by PMD 0.
pub(crate) fn l2_switch(vlans: &[VlanMode]) -> Snapshot {
    let ports: Vec<_> = vlans
        .iter()
        .enumerate()
        .map(|(i, v)| Some(Arc::new(dummy_port(i as u32, v.clone(), 0))))
        .collect();
    let bridge = Bridge {
        name: "br0".into(),
        macs: Arc::new(MacTable::new(1024, 300)),
        ports: (0..vlans.len() as u32).collect(),
        flows: None,
        default_rule: None,
    };
    Snapshot {
        bridges: vec![Some(Arc::new(bridge))],
        pmd_rxqs: vec![(0..vlans.len() as u32)
            .map(|port| RxqRef { port, pair: 0 })
            .collect()],
        ports,
    }
}

/// The dummy I/O of port `id`.
pub(crate) fn dummy(snap: &Snapshot, id: u32) -> &DummyIo {
    match &snap.port(id).expect("port").io {
        PortIo::Dummy(d) => d,
        _ => panic!("port {id} is not a dummy port"),
    }
}

/// The MAC address 02:00:00:00:00:`n`.
pub(crate) fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

/// A 64-byte frame `src` → `dst` (IPv4 ethertype, zero payload but for `seq` in its last
/// byte), with an 802.1Q tag of `vlan` if given.
pub(crate) fn frame(dst: [u8; 6], src: [u8; 6], vlan: Option<u16>, seq: u8) -> Vec<u8> {
    let mut f = Vec::with_capacity(68);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    if let Some(v) = vlan {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&[0x08, 0x00]);
    f.resize(f.len() + 50, 0);
    *f.last_mut().unwrap() = seq;
    f
}

/// The 802.1Q VLAN of a frame, if tagged.
pub(crate) fn vlan_of(f: &[u8]) -> Option<u16> {
    (f[12..14] == [0x81, 0x00]).then(|| u16::from_be_bytes([f[14], f[15]]) & 0x0fff)
}

/// The broadcast address.
pub(crate) const BCAST: [u8; 6] = [0xff; 6];
