//! What ovn-controller asks of a chassis switch, in the datapath: `check_pkt_larger` (one
//! megaflow for packets of every length, each packet taking the branch its own length
//! picks) and `controller(meter_id=N)` (OVN's CoPP: packet-ins metered).

use std::sync::Arc;

use ferrovs_flow::meter::parse_meter;
use ferrovs_flow::{parse_flow, Pipeline, RuleStats};
use ferrovs_sys::pool::Pool;

use super::input::FlowCtx;
use super::tests::{burst, frame, resolve, snapshot_with, switch};
use crate::packet_io::PacketInQueue;

fn sized(len: usize, seq: u32) -> Vec<u8> {
    let mut f = frame(0x0a00_0001, 53, seq);
    f.resize(len, 0);
    f
}

fn tagged(len: usize, seq: u32) -> Vec<u8> {
    let mut f = sized(len - 4, seq);
    f.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    f
}

#[test]
fn small_and_large_packets_share_a_megaflow_and_take_their_own_branch() {
    let rules: Vec<String> = [
        "priority=10,in_port=vm1,udp actions=check_pkt_larger(100)->NXM_NX_REG0[0],resubmit(,1)",
        "table=1,priority=20,reg0=0x1/0x1 actions=output:vm2",
        "table=1,priority=10 actions=output:vm3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let snap = switch(&rules);
    let pool = Pool::new(256).unwrap();
    let mut fx = FlowCtx::default();
    // 100 bytes is not larger than 100; 101 is. A tagged frame of 104 bytes is 100
    // without its tag.
    let frames = vec![
        sized(64, 1),
        sized(101, 2),
        sized(100, 3),
        sized(1500, 4),
        tagged(104, 5),
        tagged(105, 6),
    ];
    for round in 0..3 {
        let (out, dropped) = burst(&snap, &pool, &mut fx, &frames);
        assert_eq!(dropped, 0);
        let lens = |port: u32| -> Vec<usize> {
            out.iter()
                .find(|(p, _)| *p == port)
                .map(|(_, v)| v.iter().map(|f| f.len()).collect())
                .unwrap_or_default()
        };
        assert_eq!(
            lens(1),
            vec![101, 1500, 105],
            "round {round}: vm2, the larger"
        );
        assert_eq!(
            lens(2),
            vec![64, 100, 104],
            "round {round}: vm3, the others"
        );
    }
    // One megaflow for all (neither the length nor the tag is in its mask): one upcall,
    // then cache hits only.
    assert_eq!(fx.counters.upcalls, 1);
    assert_eq!(fx.counters.emc_hits + fx.counters.megaflow_hits, 17);
}

#[test]
fn a_controller_action_with_a_meter_sends_only_what_the_meter_lets_through() {
    let rules = [
        "priority=10,in_port=vm1,udp,tp_dst=1 actions=controller(userdata=01.02,meter_id=7),output:vm2",
        "priority=10,in_port=vm1,udp,tp_dst=2 actions=controller(userdata=01.02)",
    ];
    let specs: Vec<_> = rules.iter().map(|r| parse_flow(r).unwrap()).collect();
    let q = Arc::new(PacketInQueue::new().unwrap());
    let snap = snapshot_with(
        Pipeline::build(
            specs.iter().map(|s| (s, Arc::new(RuleStats::default()))),
            &resolve,
        ),
        Some(q.clone()),
    );
    let bf = snap.bridge(0).unwrap().flows.as_ref().unwrap();
    // Five packets a second, a bucket of 5: a test's bursts see the bucket alone.
    bf.meters
        .set(&parse_meter("meter=7,pktps,burst,band=type=drop,rate=5,burst_size=5").unwrap());
    let pool = Pool::new(256).unwrap();
    let mut fx = FlowCtx::default();
    let metered: Vec<Vec<u8>> = (0..20).map(|i| frame(0x0a00_0001, 1, i)).collect();
    let plain: Vec<Vec<u8>> = (0..20).map(|i| frame(0x0a00_0001, 2, 100 + i)).collect();
    let mut to_vm2 = 0;
    for _ in 0..2 {
        let (out, dropped) = burst(&snap, &pool, &mut fx, &metered);
        // The packet itself goes on: every one reaches vm2.
        assert_eq!(dropped, 0);
        to_vm2 += out
            .iter()
            .find(|(p, _)| *p == 1)
            .map_or(0, |(_, v)| v.len());
        burst(&snap, &pool, &mut fx, &plain);
    }
    assert_eq!(to_vm2, 40);
    let ins = q.take();
    let metered_ins = ins.iter().filter(|p| p.action.meter_id == Some(7)).count();
    // 5 of the 40 metered copies went up, every one of the 40 unmetered ones.
    assert_eq!(metered_ins, 5);
    assert_eq!(ins.len() - metered_ins, 40);
    let m = bf.meters.get(7).unwrap().counters();
    assert_eq!((m.packets, m.bands[0].0), (40, 35));
    // A meter that does not exist (deleted) lets every copy through, as a rule's `meter`.
    bf.meters.remove(7);
    burst(&snap, &pool, &mut fx, &metered);
    assert_eq!(q.take().len(), 20);
}
