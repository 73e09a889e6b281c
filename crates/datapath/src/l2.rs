//! The L2 learning-bridge decision for one packet (the default pipeline, OVS "NORMAL").
//!
//! Per packet: validate the Ethernet header, place the frame in a VLAN by the input port's
//! mode (access ports tag implicitly; trunk ports carry the 802.1Q tag, untagged = VLAN 0),
//! learn the source address, and look up the destination: a fresh unicast entry on another
//! port sends it there, anything else floods to every other port of the bridge that carries
//! the VLAN. Egress VLAN edits (push for a trunk, pop for an access port) are decided per
//! output port by [`egress_edit`].

use ferrovs_counters::DropReason;
use ferrovs_packet::{is_multicast, EthView, ETH_P_8021Q};

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

/// The bytes of a frame [`decide`] reads, as a key: both addresses, the ethertype and, for
/// an 802.1Q frame, its tag. Two frames of one burst with the same key get the same
/// decision (same port, snapshot and time; learning the first one's source again changes
/// nothing), so a burst decides once per run of equal keys. `None` below 16 bytes.
#[inline]
pub fn header_key(frame: &[u8]) -> Option<[u64; 2]> {
    let a = u64::from_le_bytes(frame.get(..8)?.try_into().ok()?);
    let mut b = u64::from_le_bytes(frame.get(8..16)?.try_into().ok()?);
    if u16::from_be_bytes([frame[12], frame[13]]) != ETH_P_8021Q {
        // Untagged: bytes 14 and 15 are payload.
        b &= 0x0000_ffff_ffff_ffff;
    }
    Some([a, b])
}

/// Decides for one frame received on `inp`. `now` is in seconds (MAC aging).
#[inline]
pub fn decide(snap: &Snapshot, bridge: &Bridge, inp: &Port, frame: &[u8], now: u32) -> Classified {
    decide_as::<true>(snap, bridge, inp, frame, now)
}

/// [`decide`] without learning the source address (`ferrovs trace`: the decision the
/// datapath would make now, changing nothing). The lookup happens as in [`decide`], after
/// where the source would have been learned: a frame whose destination is its own source
/// is seen by the trace as the table has it.
pub fn predict(snap: &Snapshot, bridge: &Bridge, inp: &Port, frame: &[u8], now: u32) -> Classified {
    decide_as::<false>(snap, bridge, inp, frame, now)
}

/// The decision, learning the source when `LEARN` (one function for the datapath and the
/// trace; each instance is compiled apart, the datapath's exactly as before).
#[inline]
fn decide_as<const LEARN: bool>(
    snap: &Snapshot,
    bridge: &Bridge,
    inp: &Port,
    frame: &[u8],
    now: u32,
) -> Classified {
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
    if LEARN && !is_multicast(src) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{frame, l2_switch, mac, BCAST};

    /// `mac(n)` as the MAC table keys it.
    fn key(n: u8) -> u64 {
        0x0200_0000_0000 | u64::from(n)
    }

    fn decide_on(snap: &Snapshot, port: u32, f: &[u8]) -> Classified {
        let inp = snap.port(port).unwrap();
        decide(snap, snap.bridge(0).unwrap(), inp, f, 10)
    }

    /// `predict` (the trace's) decides as `decide` and learns nothing.
    #[test]
    fn predict_decides_without_learning() {
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk, VlanMode::Trunk]);
        let b = snap.bridge(0).unwrap();
        let p = |port: u32, f: &[u8]| predict(&snap, b, snap.port(port).unwrap(), f, 10);
        let c = p(0, &frame(mac(2), mac(1), None, 0));
        assert_eq!(c.decision, Decision::Flood);
        assert_eq!(b.macs.lookup(key(1), 0, 10), None);
        decide_on(&snap, 1, &frame(mac(1), mac(2), None, 0));
        let c = p(0, &frame(mac(2), mac(1), None, 0));
        assert_eq!(c.decision, Decision::Unicast(1));
        assert_eq!(b.macs.lookup(key(1), 0, 10), None);
        assert_eq!(
            p(1, &frame(mac(2), mac(1), None, 0)).decision,
            Decision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn learns_sources_floods_unknown_and_unicasts_known() {
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk, VlanMode::Trunk]);
        let macs = &snap.bridge(0).unwrap().macs;
        // Unknown destination: flood; the source is learned on port 0.
        let c = decide_on(&snap, 0, &frame(mac(2), mac(1), None, 0));
        assert_eq!(c.decision, Decision::Flood);
        assert_eq!((c.vlan, c.tagged), (0, false));
        assert_eq!(macs.lookup(key(1), 0, 10), Some(0));
        // The reply goes to port 0 only; its source is learned on port 1.
        let c = decide_on(&snap, 1, &frame(mac(1), mac(2), None, 0));
        assert_eq!(c.decision, Decision::Unicast(0));
        assert_eq!(macs.lookup(key(2), 0, 10), Some(1));
        // Broadcast floods even when known, and a multicast source is never learned.
        let c = decide_on(&snap, 2, &frame(BCAST, mac(3), None, 0));
        assert_eq!(c.decision, Decision::Flood);
        let mut mcast_src = mac(4);
        mcast_src[0] |= 1;
        decide_on(&snap, 2, &frame(mac(1), mcast_src, None, 0));
        assert_eq!(macs.lookup(0x0300_0000_0004, 0, 10), None);
        // A station that moves is learned on its new port.
        let c = decide_on(&snap, 2, &frame(mac(2), mac(1), None, 0));
        assert_eq!(c.decision, Decision::Unicast(1));
        assert_eq!(macs.lookup(key(1), 0, 10), Some(2));
    }

    /// The key covers what `decide` reads and nothing else.
    #[test]
    fn header_key_is_the_addresses_ethertype_and_tag() {
        let k = |f: &[u8]| header_key(f).unwrap();
        let a = frame(mac(2), mac(1), None, 1);
        let mut b = frame(mac(2), mac(1), None, 2);
        b[14] = 0x45;
        b[15] = 0x10;
        assert_eq!(
            k(&a),
            k(&b),
            "an untagged frame's payload is not in the key"
        );
        assert_ne!(k(&a), k(&frame(mac(3), mac(1), None, 1)));
        assert_ne!(k(&a), k(&frame(mac(2), mac(4), None, 1)));
        let mut arp = a.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_ne!(k(&a), k(&arp));
        let t10 = frame(mac(2), mac(1), Some(10), 1);
        assert_ne!(k(&t10), k(&frame(mac(2), mac(1), Some(11), 1)));
        assert_ne!(k(&t10), k(&a));
        assert_eq!(k(&t10), k(&frame(mac(2), mac(1), Some(10), 2)));
        assert_eq!(header_key(&a[..15]), None);
    }

    #[test]
    fn a_frame_for_its_own_port_is_dropped() {
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk]);
        decide_on(&snap, 0, &frame(mac(9), mac(1), None, 0));
        let c = decide_on(&snap, 0, &frame(mac(1), mac(5), None, 0));
        assert_eq!(c.decision, Decision::Drop(DropReason::NoRoute));
    }

    #[test]
    fn runts_are_dropped() {
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk]);
        let c = decide_on(&snap, 0, &[0u8; 13]);
        assert_eq!(c.decision, Decision::Drop(DropReason::Runt));
        // A tag announced but cut off.
        let mut f = frame(mac(2), mac(1), Some(5), 0);
        f.truncate(16);
        assert_eq!(
            decide_on(&snap, 0, &f).decision,
            Decision::Drop(DropReason::Runt)
        );
    }

    #[test]
    fn access_ports_tag_implicitly_and_refuse_tagged_frames() {
        let snap = l2_switch(&[VlanMode::Access(10), VlanMode::Trunk]);
        let c = decide_on(&snap, 0, &frame(BCAST, mac(1), None, 0));
        assert_eq!((c.vlan, c.tagged), (10, false));
        assert_eq!(c.decision, Decision::Flood);
        // Learned in VLAN 10, not 0.
        let macs = &snap.bridge(0).unwrap().macs;
        assert_eq!(macs.lookup(key(1), 10, 10), Some(0));
        assert_eq!(macs.lookup(key(1), 0, 10), None);
        let c = decide_on(&snap, 0, &frame(BCAST, mac(1), Some(10), 0));
        assert_eq!(c.decision, Decision::Drop(DropReason::Vlan));
    }

    #[test]
    fn trunks_carry_their_vlans_only() {
        let snap = l2_switch(&[VlanMode::TrunkOf(vec![10, 20]), VlanMode::Trunk]);
        let c = decide_on(&snap, 0, &frame(BCAST, mac(1), Some(20), 0));
        assert_eq!((c.vlan, c.tagged, c.decision), (20, true, Decision::Flood));
        let c = decide_on(&snap, 0, &frame(BCAST, mac(1), Some(30), 0));
        assert_eq!(c.decision, Decision::Drop(DropReason::Vlan));
        // Untagged on a trunk: VLAN 0, carried by every trunk.
        let c = decide_on(&snap, 0, &frame(BCAST, mac(1), None, 0));
        assert_eq!((c.vlan, c.tagged, c.decision), (0, false, Decision::Flood));
        // A plain trunk carries any VLAN.
        let c = decide_on(&snap, 1, &frame(BCAST, mac(2), Some(30), 0));
        assert_eq!((c.vlan, c.decision), (30, Decision::Flood));
    }

    #[test]
    fn a_known_destination_outside_the_vlan_floods() {
        // Port 1 learned mac(2) in VLAN 20 on a trunk, but is now asked for VLAN 30, which
        // it does not carry: flood instead of a unicast it would refuse.
        let snap = l2_switch(&[
            VlanMode::Trunk,
            VlanMode::TrunkOf(vec![20]),
            VlanMode::Trunk,
        ]);
        snap.bridge(0).unwrap().macs.learn(key(2), 30, 1, 10);
        let c = decide_on(&snap, 0, &frame(mac(2), mac(1), Some(30), 0));
        assert_eq!(c.decision, Decision::Flood);
    }

    #[test]
    fn egress_edits_push_for_trunks_and_pop_for_access_ports() {
        let snap = l2_switch(&[VlanMode::Access(10), VlanMode::Trunk, VlanMode::Access(10)]);
        let (access, trunk) = (snap.port(0).unwrap(), snap.port(1).unwrap());
        let untagged_10 = Classified {
            vlan: 10,
            tagged: false,
            decision: Decision::Flood,
        };
        let tagged_10 = Classified {
            tagged: true,
            ..untagged_10
        };
        let untagged_0 = Classified {
            vlan: 0,
            ..untagged_10
        };
        assert_eq!(egress_edit(&untagged_10, trunk), Edit::Push(10));
        assert_eq!(egress_edit(&untagged_10, access), Edit::None);
        assert_eq!(egress_edit(&tagged_10, access), Edit::Pop);
        assert_eq!(egress_edit(&tagged_10, trunk), Edit::None);
        assert_eq!(egress_edit(&untagged_0, trunk), Edit::None);
    }
}
