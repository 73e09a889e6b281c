//! Any bytes as a guest's descriptor table, rings and buffers: dequeue and enqueue must not
//! panic, must not move the used index past the ring size, and must return every buffer.
//! Half the inputs run with dirty logging on (a migrating frontend, a log with any used-ring
//! log address): every page written must then be marked in the log. Inputs with bit 0x20
//! of the first byte run a packed ring (`VIRTIO_F_RING_PACKED`) of 1..=16 descriptors over
//! the same bytes (descriptor ring at 0, driver event at 4096, device event at 8192) from a
//! base the input picks: its position must stay inside the ring, used equal to available.
//! Bit 0x10 adds `VIRTIO_F_IN_ORDER`.
#![no_main]
use std::sync::Arc;

use ferrovs_sys::guest::memory::{GuestMemory, RegionDesc};
use ferrovs_sys::guest::vring::RingAddrs;
use ferrovs_sys::kernel::vnet::{VnetHdr, HDR_LEN};
use ferrovs_sys::pool::Pool;
use ferrovs_vhost::features::*;
use ferrovs_vhost::stats::QueueStats;
use ferrovs_vhost::virtqueue::{VirtQueue, VringState, BURST};
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
    let packed = data[0] & 0x20 != 0;
    let features = if packed { features | VIRTIO_F_RING_PACKED } else { features };
    // Bit 0x10: IN_ORDER (a packed ring's guest TX then returns a burst as one used entry).
    let features = if data[0] & 0x10 != 0 { features | VIRTIO_F_IN_ORDER } else { features };
    let size = if packed { 1 + u32::from(data[1] >> 4) } else { 16 };
    // Packed: slot (below the size, else the queue starts broken) and wrap counter.
    let base = if packed { u16::from(data[1] & 0x1f) | (u16::from(data[0] & 1) << 15) } else { 0 };
    let logging = data[0] & 0x80 != 0;
    let log = logging.then(|| {
        let lfd = ferrovs_sys::os::memfd("fuzz-log", 4096, false).unwrap();
        Arc::new(ferrovs_sys::guest::dirty_log::DirtyLog::map(lfd, 8, 0).unwrap())
    });
    let mut vq = VirtQueue::default();
    vq.set_features(if logging { features | VHOST_F_LOG_ALL } else { features });
    vq.set_log(log.clone());
    vq.configure(VringState {
        size,
        last_avail: base,
        addrs: Some(RingAddrs { desc: BASE, avail: BASE + 4096, used: BASE + 8192 }),
        kicked: true,
        enabled: true,
        // The used ring's log address as the frontend claims it (any value).
        log_addr: (data[0] & 0x40 != 0).then(|| u64::from(data[1]) << 12),
        ..VringState::default()
    });
    if vq.start(Some(&mem)).is_err() {
        return;
    }
    let stats = QueueStats::default();
    let before = vq.state().used_idx;
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
    if packed {
        let st = vq.state();
        assert_eq!(st.last_avail, st.used_idx, "packed: used position is the available one");
        assert!(vq.broken().is_some() || u32::from(st.last_avail & 0x7fff) < size);
        if let (Some(log), false) = (&log, st.used_idx == before) {
            // Used descriptors are written in the descriptor ring (guest-physical page 0).
            assert!(log.is_marked(0), "used descriptors written, page 0 not logged");
        }
    } else {
        assert!(vq.state().used_idx.wrapping_sub(before) <= 16);
    }
    if let (Some(log), false) = (&log, packed || vq.state().used_idx == before) {
        // Used entries were written: the page of `used.idx` (guest-physical 8192, or where the
        // frontend claimed the used ring is) is marked, when the log covers it.
        let page = vq.state().log_addr.unwrap_or(8192) >> 12;
        if page < 64 {
            assert!(log.is_marked(page), "used ring written, page {page} not logged");
        }
    }
    assert_eq!(pool.available(), 64);
    assert_eq!(pool.available_large(), 4);
});
