//! Any bytes as a guest's descriptor table, rings and buffers: dequeue and enqueue must not
//! panic, must not move the used index past the ring size, and must return every buffer.
#![no_main]
use std::sync::Arc;

use ferrovs_sys::guest::{GuestMemory, RegionDesc};
use ferrovs_sys::pool::Pool;
use ferrovs_sys::vnet::{VnetHdr, HDR_LEN};
use ferrovs_sys::vring::RingAddrs;
use ferrovs_vhost::features::*;
use ferrovs_vhost::stats::QueueStats;
use ferrovs_vhost::virtqueue::{VirtQueue, BURST};
use libfuzzer_sys::fuzz_target;

const MEM: u64 = 64 * 1024;
const BASE: u64 = 0x1000_0000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let fd = ferrovs_sys::os::memfd("fuzz", MEM, false).unwrap();
    let r = RegionDesc { gpa: 0, size: MEM, uaddr: BASE, mmap_offset: 0 };
    let mem = Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap());
    // The input is the guest's first 16 KiB: descriptor table at 0, avail at 4096, used at 8192.
    let n = data.len().min(16 * 1024);
    mem.write(0, &data[..n]).unwrap();
    let features = match data[0] % 4 {
        0 => VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF | VIRTIO_RING_F_INDIRECT_DESC,
        1 => VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX,
        2 => VIRTIO_F_VERSION_1 | VIRTIO_RING_F_INDIRECT_DESC | OFFLOADS,
        _ => VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF | OFFLOADS,
    };
    let mut vq = VirtQueue::default();
    vq.set_features(features);
    vq.state.size = 16;
    vq.state.addrs = Some(RingAddrs { desc: BASE, avail: BASE + 4096, used: BASE + 8192 });
    vq.state.kicked = true;
    vq.state.enabled = true;
    if vq.start(Some(&mem)).is_err() {
        return;
    }
    let stats = QueueStats::default();
    let before = vq.state.used_idx;
    let pool = Pool::with_large(64, 4).unwrap();
    {
        let mut out = Vec::with_capacity(BURST);
        if data[1] % 2 == 0 {
            vq.dequeue(&pool, &mut out, BURST, &stats, "fuzz");
        } else {
            // Packets of any size with any offload header the switch could hand to a guest.
            let pkt = vec![0x5au8; 60 + (data[1] as usize) * 6];
            let mut h = [0u8; HDR_LEN];
            let tail = &data[data.len().saturating_sub(HDR_LEN)..];
            h[..tail.len()].copy_from_slice(tail);
            let hdr = VnetHdr::from_bytes(&h);
            vq.enqueue((0..8).map(|_| (pkt.as_slice(), hdr)), &stats, "fuzz");
        }
    }
    assert!(vq.state.used_idx.wrapping_sub(before) <= 16);
    assert_eq!(pool.available(), 64);
    assert_eq!(pool.available_large(), 4);
});
