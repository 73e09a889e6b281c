//! Packed rings against a mock driver written here (a few lines of the guest's side of
//! §2.8): traffic both ways over several laps, notifications, and each hostile shape a
//! frontend can give a packed ring, plus a deterministic fuzz pass.
use super::packed::Pos;
use super::*;
use ferrovs_sys::guest::memory::RegionDesc;
use ferrovs_sys::guest::packed::{
    PackedDescriptor, RING_EVENT_FLAGS_DESC, RING_EVENT_FLAGS_DISABLE, RING_EVENT_FLAGS_ENABLE,
    VRING_PACKED_DESC_F_AVAIL as AVAIL, VRING_PACKED_DESC_F_USED as USED,
};
use ferrovs_sys::guest::vring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use ferrovs_sys::kernel::vnet::VnetHdr;
use ferrovs_sys::os::{self, memfd};
use ferrovs_sys::pool::Pool;

const MEM: u64 = 1 << 20;
const BASE: u64 = 0x2000_0000;
const DATA: u64 = 65536;
const F: u64 = features::VIRTIO_F_VERSION_1 | features::VIRTIO_F_RING_PACKED;

/// The guest's side of one packed ring.
struct Driver {
    mem: Arc<GuestMemory>,
    size: u16,
    /// Next slot to make available, and its wrap counter.
    next: u16,
    wrap: bool,
    /// Next used slot to read.
    used: u16,
    used_wrap: bool,
}

impl Driver {
    fn desc_write(&self, slot: u16, d: PackedDescriptor) {
        self.mem.write(16 * u64::from(slot), &d.to_bytes()).unwrap();
    }

    fn flags(&self, head: bool, more: u16) -> u16 {
        let _ = head;
        let mut f = more;
        if self.wrap {
            f |= AVAIL;
        } else {
            f |= USED;
        }
        f
    }

    /// Makes a chain of `bufs` (address, length) available with buffer `id` (the head's
    /// flags written last, as a driver must).
    fn post(&mut self, bufs: &[(u64, u32)], id: u16, write: bool) {
        let mut slots = Vec::new();
        for (i, &(addr, len)) in bufs.iter().enumerate() {
            let mut extra = if write { VRING_DESC_F_WRITE } else { 0 };
            if i + 1 < bufs.len() {
                extra |= VRING_DESC_F_NEXT;
            }
            let d = PackedDescriptor {
                addr,
                len,
                id,
                flags: self.flags(i == 0, extra),
            };
            slots.push((self.next, d));
            self.next += 1;
            if self.next == self.size {
                self.next = 0;
                self.wrap = !self.wrap;
            }
        }
        for &(s, d) in slots.iter().skip(1) {
            self.desc_write(s, d);
        }
        self.desc_write(slots[0].0, slots[0].1);
    }

    /// The next used descriptor, if the device wrote it: (id, len); skips `slots` slots.
    fn take_used(&mut self, slots: u16) -> Option<(u16, u32)> {
        let raw = self.mem.read_obj::<16>(16 * u64::from(self.used)).unwrap();
        let d = PackedDescriptor::from_bytes(&raw);
        let a = d.flags & AVAIL != 0;
        let u = d.flags & USED != 0;
        if a != self.used_wrap || u != self.used_wrap {
            return None;
        }
        self.used += slots;
        if self.used >= self.size {
            self.used -= self.size;
            self.used_wrap = !self.used_wrap;
        }
        Some((d.id, d.len))
    }
}

fn queue_sized(features: u64, size: u16) -> (VirtQueue, Driver) {
    let fd = memfd("packed", MEM, false).unwrap();
    let r = RegionDesc {
        gpa: 0,
        size: MEM,
        uaddr: BASE,
        mmap_offset: 0,
    };
    let mem = Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap());
    let mut vq = VirtQueue::default();
    vq.set_features(features);
    vq.state.size = u32::from(size);
    vq.state.addrs = Some(RingAddrs {
        desc: BASE,
        avail: BASE + 32768,
        used: BASE + 32772,
    });
    vq.state.last_avail = 0x8000; // slot 0, wrap counter 1
    vq.state.kicked = true;
    vq.state.enabled = true;
    vq.start(Some(&mem)).unwrap();
    assert!(vq.ready());
    let d = Driver {
        mem,
        size,
        next: 0,
        wrap: true,
        used: 0,
        used_wrap: true,
    };
    (vq, d)
}

fn queue(features: u64) -> (VirtQueue, Driver) {
    queue_sized(features, 16)
}

/// A frame of `len` bytes with the virtio-net header in front (12 bytes, zero).
fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; 12 + len];
    for (i, b) in f[12..].iter_mut().enumerate() {
        *b = (seq as usize * 7 + i) as u8;
    }
    f
}

/// Makes frames `*seq..total` available while the ring has room for them beside `in_flight`
/// slots: `frame(seq, 60 + seq)`, a two-descriptor chain every third one, buffer id
/// `seq % 7`. Returns each one's (first slot, buffer id, slots).
fn post_frames(
    d: &mut Driver,
    seq: &mut u32,
    total: u32,
    mut in_flight: u16,
) -> Vec<(u16, u16, u16)> {
    let mut posted = Vec::new();
    loop {
        let two = seq.is_multiple_of(3);
        let need = if two { 2 } else { 1 };
        if in_flight + need > d.size || *seq >= total {
            return posted;
        }
        let f = frame(*seq, 60 + *seq as usize);
        let at = DATA + 4096 * u64::from(*seq % 32);
        d.mem.write(at, &f).unwrap();
        let id = (*seq % 7) as u16;
        let slot = d.next;
        if two {
            d.post(&[(at, 12), (at + 12, f.len() as u32 - 12)], id, false);
        } else {
            d.post(&[(at, f.len() as u32)], id, false);
        }
        posted.push((slot, id, need));
        in_flight += need;
        *seq += 1;
    }
}

#[test]
fn guest_tx_over_several_laps_in_order_with_chains() {
    // A ring of 7 (not a power of two): chains of one and two descriptors, 40 packets.
    let (mut vq, mut d) = queue_sized(F, 7);
    let pool = Pool::new(64).unwrap();
    let stats = QueueStats::default();
    let mut got = Vec::new();
    let mut seq = 0u32;
    let mut inflight: std::collections::VecDeque<(u16, u16)> = Default::default();
    while got.len() < 40 {
        let used = inflight.iter().map(|x| x.1).sum();
        for (_, id, need) in post_frames(&mut d, &mut seq, 40, used) {
            inflight.push_back((id, need));
        }
        let mut out = Vec::with_capacity(BURST);
        vq.dequeue(&pool, &mut out, BURST, &stats, "t");
        assert!(vq.broken().is_none(), "{:?}", vq.broken());
        for m in out {
            got.push(m.data().to_vec());
        }
        while let Some(&(id, slots)) = inflight.front() {
            let Some((uid, len)) = d.take_used(slots) else {
                break;
            };
            assert_eq!((uid, len), (id, 0));
            inflight.pop_front();
        }
    }
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p.as_slice(), &frame(i as u32, 60 + i)[12..], "packet {i}");
    }
    assert_eq!(stats.snapshot().packets, 40);
    // At the boundary the state is the driver's position, in the vhost-user encoding.
    let enc = d.next | if d.wrap { 0x8000 } else { 0 };
    assert_eq!((vq.state.last_avail, vq.state.used_idx), (enc, enc));
}

/// With IN_ORDER, a guest-TX burst is returned as one used descriptor at the burst's first
/// slot, carrying the last chain's buffer id; the driver skips the batch (as DPDK's in-order
/// virtio driver does) and no other slot of the burst is written.
#[test]
fn guest_tx_in_order_returns_a_burst_as_one_used_descriptor() {
    let (mut vq, mut d) = queue_sized(F | features::VIRTIO_F_IN_ORDER, 7);
    let pool = Pool::new(64).unwrap();
    let stats = QueueStats::default();
    let mut got = Vec::new();
    let mut seq = 0u32;
    // In flight: (first slot, buffer id, slots).
    let mut inflight: std::collections::VecDeque<(u16, u16, u16)> = Default::default();
    let mut bursts = 0;
    while got.len() < 40 {
        let used = inflight.iter().map(|x| x.2).sum();
        inflight.extend(post_frames(&mut d, &mut seq, 40, used));
        let mut out = Vec::with_capacity(BURST);
        let n = vq.dequeue(&pool, &mut out, BURST, &stats, "t");
        assert!(vq.broken().is_none(), "{:?}", vq.broken());
        for m in out {
            got.push(m.data().to_vec());
        }
        if n == 0 {
            continue;
        }
        bursts += 1;
        // The slots of the burst after its first still hold the driver's descriptors.
        let first = inflight.front().unwrap().0;
        let (uid, len) = d.take_used(0).expect("one used descriptor for the burst");
        assert_eq!(len, 0);
        let mut slots = 0;
        let mut chains = 0;
        while let Some((slot, id, s)) = inflight.pop_front() {
            if slot != first {
                let raw = d.mem.read_obj::<16>(16 * u64::from(slot)).unwrap();
                let f = PackedDescriptor::from_bytes(&raw).flags;
                assert_eq!(f & USED != 0, f & AVAIL == 0, "slot {slot} was written");
            }
            slots += s;
            chains += 1;
            if id == uid {
                break;
            }
        }
        assert_eq!(chains, n, "the used descriptor stands for the whole burst");
        d.take_used(slots);
    }
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p.as_slice(), &frame(i as u32, 60 + i)[12..], "packet {i}");
    }
    assert!(bursts >= 6, "{bursts} bursts");
    let enc = d.next | if d.wrap { 0x8000 } else { 0 };
    assert_eq!((vq.state.last_avail, vq.state.used_idx), (enc, enc));
    assert_eq!(d.used, d.next);
}

#[test]
fn guest_rx_single_and_mergeable_buffers() {
    let (mut vq, mut d) = queue(F | features::VIRTIO_NET_F_MRG_RXBUF);
    let stats = QueueStats::default();
    for i in 0..16u16 {
        d.post(&[(DATA + 2048 * u64::from(i), 2048)], i, true);
    }
    let small = vec![0x11u8; 100];
    let big = vec![0x22u8; 5000];
    let pkts = [small.as_slice(), big.as_slice()];
    let sent = vq.enqueue(pkts.iter().map(|p| (*p, VnetHdr::default())), &stats, "t");
    assert_eq!(sent, 2);
    assert_eq!(d.take_used(1), Some((0, 112)));
    // The big one took three buffers, num_buffers = 3 in the first.
    assert_eq!(d.take_used(1), Some((1, 2048)));
    assert_eq!(d.take_used(1), Some((2, 2048)));
    assert_eq!(d.take_used(1), Some((3, 5012 - 4096)));
    assert_eq!(d.take_used(1), None);
    let hdr = d.mem.read_obj::<12>(DATA + 2048).unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
    let mut b = vec![0u8; 100];
    d.mem.read(DATA + 12, &mut b).unwrap();
    assert_eq!(b, small);
    // A packet that needs more buffers than are left is not placed, nothing written.
    let huge = vec![0x33u8; 30000];
    let sent = vq.enqueue(
        std::iter::once((huge.as_slice(), VnetHdr::default())),
        &stats,
        "t",
    );
    assert_eq!(sent, 0);
    assert_eq!(
        d.take_used(1),
        None,
        "a packet rolled back leaves no used descriptor"
    );
    assert!(vq.broken().is_none());
}

/// The used descriptors of a burst are written at its end: the packets placed before one
/// that is rolled back, or before a broken chain, are still returned, and nothing of the
/// packet that was not placed is.
#[test]
fn guest_rx_burst_returns_the_packets_placed_before_one_that_is_not() {
    let (mut vq, mut d) = queue(F | features::VIRTIO_NET_F_MRG_RXBUF);
    let stats = QueueStats::default();
    for i in 0..4u16 {
        d.post(&[(DATA + 2048 * u64::from(i), 2048)], i, true);
    }
    let small = vec![0x11u8; 100];
    let big = vec![0x22u8; 5000]; // three buffers, one is left
    let pkts = [small.as_slice(), small.as_slice(), big.as_slice()];
    let sent = vq.enqueue(pkts.iter().map(|p| (*p, VnetHdr::default())), &stats, "t");
    assert_eq!(sent, 2);
    assert_eq!(d.take_used(1), Some((0, 112)));
    assert_eq!(d.take_used(1), Some((1, 112)));
    assert_eq!(d.take_used(1), None, "the rolled-back packet left nothing");
    // Its buffers are still available: with one more it is placed in the next burst.
    d.post(&[(DATA + 2048 * 4, 2048)], 4, true);
    let sent = vq.enqueue(
        std::iter::once((big.as_slice(), VnetHdr::default())),
        &stats,
        "t",
    );
    assert_eq!(sent, 1);
    assert_eq!(d.take_used(1), Some((2, 2048)));
    assert_eq!(d.take_used(1), Some((3, 2048)));
    assert_eq!(d.take_used(1), Some((4, 5012 - 4096)));
    assert_eq!(d.take_used(1), None);
    // A broken chain after two good ones: the two are returned, the queue is broken.
    d.post(&[(DATA, 2048)], 0, true);
    d.post(&[(DATA + 2048, 2048)], 1, true);
    d.post(&[(DATA + 4096, 2048)], 999, true);
    let sent = vq.enqueue(
        (0..3).map(|_| (small.as_slice(), VnetHdr::default())),
        &stats,
        "t",
    );
    assert_eq!(sent, 2);
    assert_eq!(vq.broken(), Some(ChainError::PackedBadBufferId));
    assert_eq!(d.take_used(1), Some((0, 112)));
    assert_eq!(d.take_used(1), Some((1, 112)));
    assert_eq!(d.take_used(1), None);
}

#[test]
fn guest_rx_without_buffers_or_wrap_stops_cleanly() {
    let (mut vq, mut d) = queue(F);
    let stats = QueueStats::default();
    let pkt = vec![1u8; 64];
    assert_eq!(
        vq.enqueue(
            std::iter::once((pkt.as_slice(), VnetHdr::default())),
            &stats,
            "t"
        ),
        0
    );
    // Three laps of a 16-ring, 5 buffers at a time.
    let mut n = 0u16;
    for _ in 0..10 {
        for _ in 0..5 {
            d.post(&[(DATA + 2048 * u64::from(n % 16), 2048)], n % 16, true);
            n += 1;
        }
        let sent = vq.enqueue(
            (0..8).map(|_| (pkt.as_slice(), VnetHdr::default())),
            &stats,
            "t",
        );
        assert_eq!(sent, 5);
        for _ in 0..5 {
            assert!(d.take_used(1).is_some());
        }
    }
    assert!(vq.broken().is_none());
}

#[test]
fn notifications_follow_the_driver_event_structure() {
    let (mut vq, mut d) = queue(F | features::VIRTIO_RING_F_EVENT_IDX);
    let call = os::eventfd().unwrap();
    vq.call = Some(call.try_clone().unwrap());
    let stats = QueueStats::default();
    let pkt = vec![1u8; 64];
    let ring_ev = |d: &Driver, off_wrap: u16, flags: u16| {
        d.mem.write(32768, &off_wrap.to_le_bytes()).unwrap();
        d.mem.write(32770, &flags.to_le_bytes()).unwrap();
    };
    let send = |vq: &mut VirtQueue, d: &mut Driver, n: u16| {
        for _ in 0..n {
            let slot = d.next;
            d.post(&[(DATA + 2048 * u64::from(slot), 2048)], slot, true);
        }
        vq.enqueue(
            (0..n).map(|_| (pkt.as_slice(), VnetHdr::default())),
            &stats,
            "t",
        );
        for _ in 0..n {
            d.take_used(1).unwrap();
        }
    };
    ring_ev(&d, 0, RING_EVENT_FLAGS_DISABLE);
    send(&mut vq, &mut d, 2);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 0);
    ring_ev(&d, 0, RING_EVENT_FLAGS_ENABLE);
    send(&mut vq, &mut d, 2);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    // EVENT_IDX: notify when used passes slot 10 (wrap 1): 4..8 does not, 8..12 does.
    ring_ev(&d, 0x8000 | 10, RING_EVENT_FLAGS_DESC);
    send(&mut vq, &mut d, 4);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    send(&mut vq, &mut d, 4);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    // Across the wrap: event at slot 2 of the next lap (wrap 0); 12..16 no, 16..20 yes.
    ring_ev(&d, 2, RING_EVENT_FLAGS_DESC);
    send(&mut vq, &mut d, 4);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    send(&mut vq, &mut d, 4);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 3);
    // We poll: the device event structure says DISABLE; enable_kicks turns it on.
    assert_eq!(
        d.mem.read_obj::<2>(32774).unwrap(),
        RING_EVENT_FLAGS_DISABLE.to_le_bytes()
    );
    assert!(vq.enable_kicks());
    assert_eq!(
        d.mem.read_obj::<2>(32774).unwrap(),
        RING_EVENT_FLAGS_ENABLE.to_le_bytes()
    );
    vq.disable_kicks();
    assert!(!vq.has_pending());
    d.post(&[(DATA, 2048)], 0, true);
    assert!(vq.has_pending());
}

/// Runs one TX burst and returns the queue's error (and checks it is counted).
fn tx_error(vq: &mut VirtQueue) -> Option<ChainError> {
    let pool = Pool::new(64).unwrap();
    let stats = QueueStats::default();
    let mut out = Vec::with_capacity(BURST);
    vq.dequeue(&pool, &mut out, BURST, &stats, "t");
    let e = vq.broken();
    if let Some(e) = e {
        assert_eq!(stats.drops(e.reason()), 1, "{e} counted");
        assert!(!vq.ready(), "a broken queue is not polled");
    }
    e
}

#[test]
fn hostile_bad_wrap_counter() {
    // Made available with the wrong wrap counter (AVAIL = !wrap, USED = wrap): that is what a
    // descriptor of the previous lap looks like, so it is not taken: the driver stalls only
    // its own queue, nothing breaks, and the queue works once the driver gets it right.
    let (mut vq, mut d) = queue(F);
    d.mem.write(DATA, &frame(0, 60)).unwrap();
    d.desc_write(
        0,
        PackedDescriptor {
            addr: DATA,
            len: 72,
            id: 0,
            flags: USED,
        },
    );
    assert_eq!(tx_error(&mut vq), None);
    assert_eq!(vq.state.last_avail, 0x8000, "nothing taken");
    d.post(&[(DATA, 72)], 0, false);
    assert_eq!(tx_error(&mut vq), None);
    assert_eq!(d.take_used(1), Some((0, 0)));
    // A driver whose counter flipped wrongly mid-lap marks slots "used in this lap".
    d.desc_write(
        1,
        PackedDescriptor {
            addr: DATA,
            len: 72,
            id: 0,
            flags: AVAIL | USED,
        },
    );
    assert_eq!(tx_error(&mut vq), Some(ChainError::PackedBadFlags));
}

#[test]
fn hostile_flags_that_lie() {
    // Both bits equal to the wrap counter: "used by the device" in a lap it has not reached.
    let (mut vq, d) = queue(F);
    d.desc_write(
        0,
        PackedDescriptor {
            addr: DATA,
            len: 72,
            id: 0,
            flags: AVAIL | USED,
        },
    );
    assert_eq!(tx_error(&mut vq), Some(ChainError::PackedBadFlags));
    // A chain whose second descriptor is not available.
    let (mut vq, d) = queue(F);
    d.desc_write(
        1,
        PackedDescriptor {
            addr: DATA + 12,
            len: 60,
            id: 0,
            flags: 0,
        },
    );
    d.desc_write(
        0,
        PackedDescriptor {
            addr: DATA,
            len: 12,
            id: 0,
            flags: AVAIL | VRING_DESC_F_NEXT,
        },
    );
    assert_eq!(tx_error(&mut vq), Some(ChainError::PackedBadFlags));
}

#[test]
fn hostile_chain_longer_than_the_ring() {
    let (mut vq, d) = queue(F);
    // Every descriptor of both laps available with NEXT: the walk must stop at the size.
    for s in 0..16 {
        d.desc_write(
            s,
            PackedDescriptor {
                addr: DATA,
                len: 8,
                id: 0,
                flags: AVAIL | VRING_DESC_F_NEXT,
            },
        );
    }
    assert_eq!(tx_error(&mut vq), Some(ChainError::Loop));
}

#[test]
fn hostile_buffer_id_out_of_range() {
    let (mut vq, mut d) = queue(F);
    d.mem.write(DATA, &frame(0, 60)).unwrap();
    d.post(&[(DATA, 72)], 16, false);
    assert_eq!(tx_error(&mut vq), Some(ChainError::PackedBadBufferId));
    // Guest RX too.
    let (mut vq, mut d) = queue(F);
    d.post(&[(DATA, 2048)], 999, true);
    let stats = QueueStats::default();
    let p = [0u8; 64];
    assert_eq!(
        vq.enqueue(std::iter::once((&p[..], VnetHdr::default())), &stats, "t"),
        0
    );
    assert_eq!(vq.broken(), Some(ChainError::PackedBadBufferId));
    assert_eq!(stats.drops(DropReason::PackedBadBufferId), 1);
}

#[test]
fn indirect_tables_supported_when_negotiated_refused_otherwise() {
    let table = DATA + 8192;
    let f = frame(5, 100);
    let setup = |d: &mut Driver| {
        d.mem.write(DATA, &f).unwrap();
        let e0 = PackedDescriptor {
            addr: DATA,
            len: 12,
            id: 0,
            flags: 0,
        };
        let e1 = PackedDescriptor {
            addr: DATA + 12,
            len: 100,
            id: 0,
            flags: 0,
        };
        d.mem.write(table, &e0.to_bytes()).unwrap();
        d.mem.write(table + 16, &e1.to_bytes()).unwrap();
        d.desc_write(
            0,
            PackedDescriptor {
                addr: table,
                len: 32,
                id: 3,
                flags: AVAIL | VRING_DESC_F_INDIRECT,
            },
        );
        d.next = 1;
    };
    let (mut vq, mut d) = queue(F);
    setup(&mut d);
    assert_eq!(tx_error(&mut vq), Some(ChainError::BadIndirect));

    let (mut vq, mut d) = queue(F | features::VIRTIO_RING_F_INDIRECT_DESC);
    setup(&mut d);
    let pool = Pool::new(8).unwrap();
    let stats = QueueStats::default();
    let mut out = Vec::with_capacity(BURST);
    assert_eq!(vq.dequeue(&pool, &mut out, BURST, &stats, "t"), 1);
    assert_eq!(out[0].data(), &f[12..]);
    assert_eq!(d.take_used(1), Some((3, 0)));
    assert_eq!(
        vq.state.last_avail, 0x8001,
        "an indirect chain takes one slot"
    );
    // A nested table is refused.
    let nested = PackedDescriptor {
        addr: table,
        len: 32,
        id: 0,
        flags: VRING_DESC_F_INDIRECT,
    };
    d.mem.write(table + 16, &nested.to_bytes()).unwrap();
    d.desc_write(
        1,
        PackedDescriptor {
            addr: table,
            len: 32,
            id: 3,
            flags: AVAIL | VRING_DESC_F_INDIRECT,
        },
    );
    drop(out);
    assert_eq!(tx_error(&mut vq), Some(ChainError::BadIndirect));
}

#[test]
fn hostile_addresses_and_lengths() {
    // A buffer outside guest memory.
    let (mut vq, mut d) = queue(F);
    d.post(&[(MEM - 8, 72)], 0, false);
    assert_eq!(tx_error(&mut vq), Some(ChainError::OutOfMemory));
    // A receive buffer too short for the header.
    let (mut vq, mut d) = queue(F);
    d.post(&[(DATA, 0)], 0, true);
    let stats = QueueStats::default();
    let p = [0u8; 64];
    vq.enqueue(std::iter::once((&p[..], VnetHdr::default())), &stats, "t");
    assert_eq!(vq.broken(), Some(ChainError::OutOfMemory));
    // A receive buffer the device may not write into.
    let (mut vq, mut d) = queue(F);
    d.post(&[(DATA, 2048)], 0, false);
    vq.enqueue(std::iter::once((&p[..], VnetHdr::default())), &stats, "t");
    assert_eq!(vq.broken(), Some(ChainError::WrongDirection));
}

#[test]
fn a_base_past_the_ring_breaks_the_queue_and_others_go_on() {
    let (mut bad, _d) = queue(F);
    bad.state.last_avail = 0x8000 | 16;
    let mem = bad.mem().cloned();
    bad.start(mem.as_ref()).unwrap();
    assert_eq!(bad.broken(), Some(ChainError::BadAvailIdx));
    assert!(!bad.ready());
    // Another queue on the same memory is unaffected.
    let (mut good, mut d) = queue(F);
    d.mem.write(DATA, &frame(1, 60)).unwrap();
    d.post(&[(DATA, 72)], 0, false);
    assert_eq!(tx_error(&mut good), None);
    assert_eq!(d.take_used(1), Some((0, 0)));
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_packed_rings_never_panic_or_overrun() {
    let pool = Pool::new(64).unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let stats = QueueStats::default();
    let mut broken = 0;
    for round in 0..2000 {
        let mut f = F;
        if round % 2 == 0 {
            f |= features::VIRTIO_RING_F_INDIRECT_DESC | features::VIRTIO_NET_F_MRG_RXBUF;
        }
        let size = 1 + (rng.next() % 16) as u16;
        let (mut vq, d) = queue_sized(f, size);
        for s in 0..size {
            let addr = match rng.next() % 4 {
                0 => rng.next(),
                _ => DATA + rng.next() % 16384,
            };
            let len = match rng.next() % 4 {
                0 => rng.next() as u32,
                _ => (rng.next() % 3000) as u32,
            };
            let flags = (rng.next() as u16) & (AVAIL | USED | 7);
            let id = (rng.next() % (u64::from(size) + 2)) as u16;
            d.desc_write(
                s,
                PackedDescriptor {
                    addr,
                    len,
                    id,
                    flags,
                },
            );
        }
        for _ in 0..16 {
            let at = DATA + 8192 + (rng.next() % 1024) * 8;
            d.mem.write(at, &rng.next().to_le_bytes()).unwrap();
        }
        d.mem
            .write(32768, &(rng.next() as u32).to_le_bytes())
            .unwrap();
        let mut out = Vec::with_capacity(BURST);
        if round % 3 == 0 {
            let pkt = vec![0xabu8; (rng.next() % 1600) as usize + 14];
            vq.enqueue(
                (0..8).map(|_| (pkt.as_slice(), VnetHdr::default())),
                &stats,
                "fuzz",
            );
        } else {
            vq.dequeue(&pool, &mut out, BURST, &stats, "fuzz");
        }
        assert!(Pos::decode(vq.state.last_avail).slot < size);
        assert_eq!(vq.state.last_avail, vq.state.used_idx);
        broken += usize::from(vq.broken().is_some());
        drop(out);
        assert_eq!(pool.available(), 64);
    }
    assert!(broken > 100 && broken < 2000, "broken {broken} of 2000");
}

#[test]
fn dirty_log_marks_used_descriptors_buffers_and_the_device_event() {
    use ferrovs_sys::guest::dirty_log::{DirtyLog, PAGE_SIZE};
    // MEM is 256 pages: a log of 32 bytes covers it.
    let log = Arc::new(DirtyLog::map(memfd("log", 4096, false).unwrap(), 32, 0).unwrap());
    let (mut vq, mut d) = queue(F);
    vq.set_log(Some(log.clone()));
    vq.set_features(F | features::VHOST_F_LOG_ALL);
    // Starting marked nothing yet (the log arrived after); re-start marks the device event.
    let mem = vq.mem().cloned();
    vq.start(mem.as_ref()).unwrap();
    assert!(log.is_marked(32772 / PAGE_SIZE), "device event structure");
    for w in 0..4 {
        let _ = log.take_word(w);
    }
    // Guest RX: the buffer's page and the used descriptor's page.
    let rx_buf = DATA + 20 * PAGE_SIZE;
    d.post(&[(rx_buf, 2048)], 0, true);
    let stats = QueueStats::default();
    let p = [7u8; 100];
    assert_eq!(
        vq.enqueue(std::iter::once((&p[..], VnetHdr::default())), &stats, "t"),
        1
    );
    assert!(log.is_marked(rx_buf / PAGE_SIZE), "packet data");
    assert!(log.is_marked(0), "used descriptor in the ring");
    assert!(stats.dirty_pages.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    for w in 0..4 {
        let _ = log.take_word(w);
    }
    // Guest TX: nothing is written but the used descriptor.
    d.mem.write(DATA, &frame(0, 60)).unwrap();
    d.post(&[(DATA, 72)], 1, false);
    let pool = Pool::new(8).unwrap();
    let mut out = Vec::with_capacity(BURST);
    assert_eq!(vq.dequeue(&pool, &mut out, BURST, &stats, "t"), 1);
    assert!(log.is_marked(0), "used descriptor in the ring");
    assert!(!log.is_marked(DATA / PAGE_SIZE), "a TX buffer is only read");
}

/// The burst prefetch of a packed ring looks only at descriptors the driver made available in
/// the lap of the position it starts from, follows the ring across its end, and a buffer
/// outside guest memory is skipped (a hint, never an access); the packets it hinted at then
/// arrive intact.
#[test]
fn burst_prefetch_walks_only_available_descriptors_across_laps() {
    use super::prefetch::{prefetch_ahead_packed, prefetch_burst_packed};
    let (mut vq, mut d) = queue_sized(F, 7);
    let addrs = vq.state.addrs.unwrap();
    let ring = PackedRing::new(d.mem.clone(), addrs, 7).unwrap();
    let at = |slot, wrap| Pos { slot, wrap };
    assert_eq!(prefetch_burst_packed(&ring, at(0, true), 32, false), 0);
    d.post(&[(DATA, 100)], 0, false);
    d.post(&[(DATA + 4096, 300), (DATA + 8192, 50)], 1, false);
    d.post(&[(MEM - 8, 900)], 2, false); // mostly outside guest memory
    assert_eq!(prefetch_burst_packed(&ring, at(0, true), 32, false), 900);
    assert_eq!(prefetch_burst_packed(&ring, at(0, true), 2, false), 300);
    // The previous lap's view of the same slots: nothing available.
    assert_eq!(prefetch_burst_packed(&ring, at(0, false), 32, false), 0);
    prefetch_ahead_packed(&ring, at(3, true), u64::MAX, false);
    prefetch_ahead_packed(&ring, at(4, true), u64::MAX, false);
    // The first two packets arrive (the third is not taken: max 2).
    let pool = Pool::new(64).unwrap();
    let stats = QueueStats::default();
    let mut out = Vec::with_capacity(BURST);
    vq.dequeue(&pool, &mut out, 2, &stats, "t");
    assert_eq!(out.len(), 2, "{:?}", vq.broken());
    // Slots 4, 5, 6 of this lap and 0, 1 of the next (wrap counter flipped).
    let (mut vq, mut d) = queue_sized(F, 7);
    for i in 0..4u16 {
        d.post(&[(DATA + 4096 * u64::from(i), 64)], i, false);
    }
    let mut out = Vec::with_capacity(BURST);
    vq.dequeue(&pool, &mut out, BURST, &stats, "t");
    assert_eq!(out.len(), 4);
    for _ in 0..4 {
        d.take_used(1).unwrap();
    }
    drop(out);
    for i in 0..5u16 {
        let f = frame(u32::from(i), 60 + 10 * usize::from(i));
        d.mem.write(DATA + 4096 * u64::from(i), &f).unwrap();
        d.post(&[(DATA + 4096 * u64::from(i), f.len() as u32)], i, false);
    }
    let ring = PackedRing::new(d.mem.clone(), addrs, 7).unwrap();
    assert_eq!(
        prefetch_burst_packed(&ring, at(4, true), 32, false),
        12 + 100
    );
    assert_eq!(
        prefetch_burst_packed(&ring, at(0, false), 32, false),
        12 + 100
    );
    assert_eq!(prefetch_burst_packed(&ring, at(0, true), 32, false), 0);
    let mut out = Vec::with_capacity(BURST);
    vq.dequeue(&pool, &mut out, BURST, &stats, "t");
    assert_eq!(out.len(), 5);
    for (i, m) in out.iter().enumerate() {
        assert_eq!(m.data(), &frame(i as u32, 60 + 10 * i)[12..]);
    }
}

/// Guest TX writes a burst's first used descriptor last, and a burst cut short by a broken
/// chain still returns every chain taken before it (the first one included), in order.
#[test]
fn guest_tx_burst_cut_short_returns_every_chain_taken() {
    let (mut vq, mut d) = queue(F);
    for i in 0..3u16 {
        let f = frame(u32::from(i), 60);
        d.mem.write(DATA + 4096 * u64::from(i), &f).unwrap();
        d.post(&[(DATA + 4096 * u64::from(i), f.len() as u32)], i, false);
    }
    d.post(&[(DATA, 72)], 16, false); // buffer id out of range: breaks the queue
    let pool = Pool::new(64).unwrap();
    let stats = QueueStats::default();
    let mut out = Vec::with_capacity(BURST);
    assert_eq!(vq.dequeue(&pool, &mut out, BURST, &stats, "t"), 3);
    assert_eq!(vq.broken(), Some(ChainError::PackedBadBufferId));
    for i in 0..3u16 {
        assert_eq!(d.take_used(1), Some((i, 0)), "chain {i}");
        assert_eq!(out[usize::from(i)].data(), &frame(u32::from(i), 60)[12..]);
    }
    assert_eq!(d.take_used(1), None, "the broken chain is not returned");
    // One chain alone: its used descriptor is the burst's first, written at the end.
    let (mut vq, mut d) = queue(F);
    d.mem.write(DATA, &frame(9, 60)).unwrap();
    d.post(&[(DATA, 72)], 5, false);
    let mut out = Vec::with_capacity(BURST);
    assert_eq!(vq.dequeue(&pool, &mut out, BURST, &stats, "t"), 1);
    assert_eq!(d.take_used(1), Some((5, 0)));
}

/// Guest TX takes a chain of one descriptor by a fast path and anything else by the general
/// copy: each packet of `tests::tx_cases` (offload headers taken, refused and out of bounds,
/// segmentation, a runt, one too big) sent as one descriptor gives what the same bytes sent as
/// two (the header, then the packet) give, and what the case must give.
#[test]
fn guest_tx_one_descriptor_is_judged_as_a_chain_of_two() {
    use super::tests::{check_tx_case, tx_cases, tx_outcome};
    let f = F | features::VIRTIO_NET_F_CSUM | features::VIRTIO_NET_F_HOST_TSO4;
    let pool = Pool::with_large(64, 2).unwrap();
    for (i, (hdr, len, want)) in tx_cases().into_iter().enumerate() {
        let mut seen = Vec::new();
        for split in [false, true] {
            let (mut vq, mut d) = queue(f);
            let mut bytes = frame(i as u32, len);
            bytes[..10].copy_from_slice(&hdr.to_bytes());
            d.mem.write(DATA, &bytes).unwrap();
            let n = bytes.len() as u32;
            if split {
                d.post(&[(DATA, 12), (DATA + 12, n - 12)], 3, false);
            } else {
                d.post(&[(DATA, n)], 3, false);
            }
            seen.push(tx_outcome(&mut vq, &pool, &bytes, i));
            assert_eq!(
                d.take_used(if split { 2 } else { 1 }),
                Some((3, 0)),
                "case {i}"
            );
        }
        check_tx_case(&seen, want, i);
    }
}

#[test]
fn available_counts_the_slots_posted_and_not_taken_across_laps() {
    let (mut vq, mut d) = queue_sized(F, 7);
    let pool = Pool::new(64).unwrap();
    let stats = QueueStats::default();
    assert_eq!(vq.available(), Some(0));
    let mut seq = 0u32;
    let mut taken = 0;
    // Frames 0..5: chains of 2, 1, 1, 2, 1 slots (a chain of two every third frame).
    let chains = post_frames(&mut d, &mut seq, 5, 0);
    let posted: u16 = chains.iter().map(|p| p.2).sum();
    assert_eq!(posted, 7);
    assert_eq!(vq.available(), Some(7), "a full lap");
    let mut out = Vec::with_capacity(BURST);
    taken += vq.dequeue(&pool, &mut out, 2, &stats, "t");
    assert_eq!(vq.available(), Some(4), "two chains (3 slots) taken");
    taken += vq.dequeue(&pool, &mut out, BURST, &stats, "t");
    assert_eq!((taken, vq.available()), (5, Some(0)));
    // The driver takes the used slots back and posts into the next lap.
    for &(_, _, slots) in &chains {
        assert!(d.take_used(slots).is_some());
    }
    let posted: u16 = post_frames(&mut d, &mut seq, 8, 0)
        .iter()
        .map(|p| p.2)
        .sum();
    assert_eq!(vq.available(), Some(posted), "the next lap's slots");
    assert!(vq.broken().is_none());
}
