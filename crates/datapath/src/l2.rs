//! The L2 learning-bridge decision for one packet (the default pipeline, OVS "NORMAL").
//!
//! Per packet: validate the Ethernet header, place the frame in a VLAN by the input port's
//! mode (access ports tag implicitly; trunk ports carry the 802.1Q tag, untagged = VLAN 0),
//! learn the source address, and look up the destination: a fresh unicast entry on another
//! port sends it there, anything else floods to every other port of the bridge that carries
//! the VLAN. Egress VLAN edits (push for a trunk, pop for an access port) are decided per
//! output port by [`egress_edit`].

use ferrovs_counters::DropReason;
use ferrovs_packet::{is_multicast, EthView};

use crate::port::{Port, VlanMode};
use crate::{Bridge, Snapshot};

/// What to do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Unicast(u32),
    Flood,
    Drop(DropReason),
}

/// A classified packet: its VLAN and whether it carries a tag now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub vlan: u16,
    pub tagged: bool,
    pub decision: Decision,
}

/// Decides for one frame received on `inp`. `now` is in seconds (MAC aging).
#[inline]
pub fn decide(snap: &Snapshot, bridge: &Bridge, inp: &Port, frame: &[u8], now: u32) -> Classified {
    let drop = |r| Classified {
        vlan: 0,
        tagged: false,
        decision: Decision::Drop(r),
    };
    let Some(eth) = EthView::new_checked(frame) else {
        return drop(DropReason::Runt);
    };
    let (vlan, tagged) = match (&inp.vlan, eth.vlan()) {
        (VlanMode::Access(_), Some(_)) => return drop(DropReason::Vlan),
        (VlanMode::Access(t), None) => (*t, false),
        (mode, Some(v)) => {
            if !mode.carries(v) {
                return drop(DropReason::Vlan);
            }
            (v, true)
        }
        (_, None) => (0, false),
    };
    let src = eth.src();
    if !is_multicast(src) {
        bridge.macs.learn(src, vlan, inp.id, now);
    }
    let dst = eth.dst();
    let decision = if is_multicast(dst) {
        Decision::Flood
    } else {
        match bridge.macs.lookup(dst, vlan, now) {
            Some(p) if p == inp.id => Decision::Drop(DropReason::NoRoute),
            Some(p) if snap.port(p).is_some_and(|o| o.vlan.carries(vlan)) => Decision::Unicast(p),
            _ => Decision::Flood,
        }
    };
    Classified {
        vlan,
        tagged,
        decision,
    }
}

/// VLAN edit needed to send a classified frame out of `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    None,
    Push(u16),
    Pop,
}

#[inline]
pub fn egress_edit(c: &Classified, out: &Port) -> Edit {
    match (&out.vlan, c.tagged) {
        (VlanMode::Access(_), true) => Edit::Pop,
        (VlanMode::Access(_), false) => Edit::None,
        (_, false) if c.vlan != 0 => Edit::Push(c.vlan),
        _ => Edit::None,
    }
}
