//! Randomised hostile rings (a deterministic fuzz pass that runs in every test run):
//! whatever the guest writes into its descriptor table and rings, the queue never panics,
//! never moves the used index by more than the ring holds, and either works or breaks.
use super::*;
use ferrovs_sys::guest::dirty_log::PAGE_SIZE;
use ferrovs_sys::guest::memory::RegionDesc;
use ferrovs_sys::guest::vring::{Descriptor, VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_WRITE};
use ferrovs_sys::kernel::vnet::VnetHdr;
use ferrovs_sys::os::{self, memfd};
use ferrovs_sys::pool::Pool;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const SIZE: u32 = 16;
const MEM: u64 = 64 * 1024;
const BASE: u64 = 0x1000_0000;

fn queue(features: u64) -> (VirtQueue, Arc<GuestMemory>) {
    let fd = memfd("fuzz", MEM, false).unwrap();
    let r = RegionDesc {
        gpa: 0,
        size: MEM,
        uaddr: BASE,
        mmap_offset: 0,
    };
    let mem = Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap());
    let mut vq = VirtQueue::default();
    vq.set_features(features);
    vq.state.size = SIZE;
    vq.state.addrs = Some(RingAddrs {
        desc: BASE,
        avail: BASE + 4096,
        used: BASE + 8192,
    });
    vq.state.kicked = true;
    vq.state.enabled = true;
    vq.start(Some(&mem)).unwrap();
    (vq, mem)
}

fn scribble(mem: &GuestMemory, rng: &mut Rng) {
    // Random descriptors: addresses mostly inside memory, sometimes anywhere.
    for i in 0..SIZE as u64 {
        let addr = match rng.next() % 4 {
            0 => rng.next(),
            _ => rng.next() % (MEM + 256),
        };
        let len = match rng.next() % 4 {
            0 => rng.next() as u32,
            _ => (rng.next() % 3000) as u32,
        };
        let flags = (rng.next() % 8) as u16;
        let next = (rng.next() % (SIZE as u64 + 2)) as u16;
        mem.write(
            16 * i,
            &Descriptor {
                addr,
                len,
                flags,
                next,
            }
            .to_bytes(),
        )
        .unwrap();
    }
    // Random avail ring entries and index; random indirect tables in the data area.
    for i in 0..SIZE as u64 {
        mem.write(
            4096 + 4 + 2 * i,
            &((rng.next() % (SIZE as u64 + 3)) as u16).to_le_bytes(),
        )
        .unwrap();
    }
    let idx = (rng.next() % 40) as u16;
    mem.write(4096 + 2, &idx.to_le_bytes()).unwrap();
    for _ in 0..32 {
        let at = 16384 + (rng.next() % 4096) * 8;
        mem.write(at, &rng.next().to_le_bytes()).unwrap();
    }
}

#[test]
fn random_rings_never_panic_or_overrun() {
    let pool = Pool::new(64).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let stats = QueueStats::default();
    let mut broken = 0;
    for round in 0..3000 {
        let features = match round % 3 {
            0 => {
                features::VIRTIO_F_VERSION_1
                    | features::VIRTIO_NET_F_MRG_RXBUF
                    | features::VIRTIO_RING_F_INDIRECT_DESC
            }
            1 => features::VIRTIO_F_VERSION_1 | features::VIRTIO_RING_F_EVENT_IDX,
            _ => features::VIRTIO_F_VERSION_1 | features::VIRTIO_RING_F_INDIRECT_DESC,
        };
        let (mut vq, mem) = queue(features);
        scribble(&mem, &mut rng);
        let before = vq.state.used_idx;
        let mut out = Vec::with_capacity(BURST);
        if round % 2 == 0 {
            vq.dequeue(&pool, &mut out, BURST, &stats, "fuzz");
        } else {
            let pkt = vec![0xabu8; (rng.next() % 1600) as usize + 14];
            vq.enqueue(
                (0..8).map(|_| (pkt.as_slice(), VnetHdr::default())),
                &stats,
                "fuzz",
            );
        }
        let moved = vq.state.used_idx.wrapping_sub(before);
        assert!(
            moved as u32 <= SIZE,
            "round {round}: used index moved by {moved}"
        );
        assert!(out.len() <= BURST);
        broken += usize::from(vq.broken.is_some());
        drop(out);
        assert_eq!(pool.available(), 64, "every buffer returned");
    }
    // The generator produces both usable and hostile rings.
    assert!(broken > 100 && broken < 3000, "broken {broken} of 3000");
}

/// A receive ring of `SIZE` posted 2 KiB buffers, a call eventfd, and its counters.
fn rx_queue_with_buffers(features: u64) -> (VirtQueue, Arc<GuestMemory>, OwnedFd) {
    let (mut vq, mem) = queue(features);
    for i in 0..SIZE as u64 {
        let d = Descriptor {
            addr: 16384 + 2048 * i,
            len: 2048,
            flags: VRING_DESC_F_WRITE,
            next: 0,
        };
        mem.write(16 * i, &d.to_bytes()).unwrap();
        mem.write(4096 + 4 + 2 * i, &(i as u16).to_le_bytes())
            .unwrap();
    }
    mem.write(4096 + 2, &(SIZE as u16).to_le_bytes()).unwrap();
    let call = os::eventfd().unwrap();
    vq.call = Some(call.try_clone().unwrap());
    (vq, mem, call)
}

fn calls_seen(call: &OwnedFd) -> u64 {
    let mut b = [0u8; 8];
    match read_counter(call, &mut b) {
        true => u64::from_ne_bytes(b),
        false => 0,
    }
}

fn read_counter(fd: &OwnedFd, b: &mut [u8; 8]) -> bool {
    use std::io::Read;
    let mut f = std::fs::File::from(fd.try_clone().unwrap());
    f.read_exact(b).is_ok()
}

#[test]
fn a_packet_taken_back_for_lack_of_buffers_still_logs_the_used_entries_it_wrote() {
    // Two 2 KiB mergeable buffers posted, a 5000-byte frame needs three: the first two
    // are filled and their used entries written, then the packet is taken back.
    let (mut vq, mem, _call) =
        rx_queue_with_buffers(features::VIRTIO_F_VERSION_1 | features::VIRTIO_NET_F_MRG_RXBUF);
    mem.write(4096 + 2, &2u16.to_le_bytes()).unwrap();
    let log = Arc::new(DirtyLog::map(memfd("log", 4096, false).unwrap(), 64, 0).unwrap());
    vq.set_features(vq.features | features::VHOST_F_LOG_ALL);
    vq.set_log(Some(log.clone()));
    let used_page = 8192 / PAGE_SIZE;
    let _ = log.take_word(0);
    let stats = QueueStats::default();
    let before = u64::from_le_bytes(mem.read_obj::<8>(8192 + 4).unwrap());

    let pkt = vec![0x77u8; 5000];
    let sent = vq.enqueue(
        std::iter::once((pkt.as_slice(), VnetHdr::default())),
        &stats,
        "t",
    );
    assert_eq!((sent, vq.state.used_idx, vq.state.last_avail), (0, 0, 0));
    assert_ne!(
        u64::from_le_bytes(mem.read_obj::<8>(8192 + 4).unwrap()),
        before,
        "the first used entry was written"
    );
    assert!(
        log.is_marked(used_page),
        "used entries written, then taken back, are logged"
    );
    for page in [16384 / PAGE_SIZE, (16384 + 2048) / PAGE_SIZE] {
        assert!(log.is_marked(page), "buffer page {page}");
    }
}

#[test]
fn coalescing_defers_until_frames_or_time_and_never_loses_one() {
    let pkt = vec![0x5au8; 60];
    let one = || std::iter::once((pkt.as_slice(), VnetHdr::default()));
    let (mut vq, _mem, call) = rx_queue_with_buffers(features::VIRTIO_F_VERSION_1);
    let stats = QueueStats::default();
    // Off: one notification per burst (the guest asks for every one: no NO_INTERRUPT).
    assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
    assert_eq!(calls_seen(&call), 1);
    // 4 packets or 1 s: three single-packet bursts wait, the fourth notifies.
    vq.set_coalesce(
        Coalesce {
            usecs: 1_000_000,
            frames: 4,
        },
        &stats,
    );
    for _ in 0..3 {
        assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
        assert_eq!(calls_seen(&call), 0);
        assert!(vq.deferred_until().is_some());
    }
    assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
    assert_eq!(calls_seen(&call), 1);
    assert_eq!(vq.deferred_until(), None);
    assert_eq!(
        stats
            .calls_coalesced
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    // Time: not before the bound, at once after it.
    assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
    let due = vq.deferred_until().unwrap();
    assert!(vq.flush_due(due - 1, &stats));
    assert_eq!(calls_seen(&call), 0);
    assert!(!vq.flush_due(due, &stats));
    assert_eq!(calls_seen(&call), 1);
    // Stopping the ring (GET_VRING_BASE) makes a deferred one; so does turning it off.
    assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
    vq.set_coalesce(Coalesce::default(), &stats);
    assert_eq!(calls_seen(&call), 1);
    vq.set_coalesce(
        Coalesce {
            usecs: 1_000_000,
            frames: 0,
        },
        &stats,
    );
    assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
    vq.stop(&stats);
    assert_eq!(calls_seen(&call), 1);
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 5);
}

#[test]
fn coalesced_notifications_honour_used_event_and_no_interrupt() {
    let pkt = vec![0x5au8; 60];
    let two = || (0..2).map(|_| (pkt.as_slice(), VnetHdr::default()));
    let c = Coalesce {
        usecs: 1_000_000,
        frames: 4,
    };
    // EVENT_IDX: the guest wants a notification when used.idx passes used_event (here:
    // after entry 2, i.e. within the second burst). The deferred notification covers
    // both bursts, so it is made.
    let (mut vq, mem, call) =
        rx_queue_with_buffers(features::VIRTIO_F_VERSION_1 | features::VIRTIO_RING_F_EVENT_IDX);
    let used_event_at = 8192 + 4 + 8 * SIZE as u64;
    mem.write(used_event_at, &2u16.to_le_bytes()).unwrap();
    let stats = QueueStats::default();
    vq.set_coalesce(c, &stats);
    vq.enqueue(two(), &stats, "t");
    assert_eq!(calls_seen(&call), 0);
    vq.enqueue(two(), &stats, "t");
    assert_eq!(
        calls_seen(&call),
        1,
        "used_event 2 lies in the deferred range 0..4"
    );
    // used_event far ahead: no notification, counted as suppressed.
    mem.write(used_event_at, &100u16.to_le_bytes()).unwrap();
    vq.enqueue(two(), &stats, "t");
    vq.enqueue(two(), &stats, "t");
    assert_eq!(calls_seen(&call), 0);
    assert_eq!(
        stats
            .calls_suppressed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Without EVENT_IDX, NO_INTERRUPT suppresses the deferred one too.
    let (mut vq, mem, call) = rx_queue_with_buffers(features::VIRTIO_F_VERSION_1);
    mem.write(4096, &VRING_AVAIL_F_NO_INTERRUPT.to_le_bytes())
        .unwrap();
    let stats = QueueStats::default();
    vq.set_coalesce(c, &stats);
    vq.enqueue(two(), &stats, "t");
    vq.enqueue(two(), &stats, "t");
    assert_eq!(calls_seen(&call), 0);
    assert_eq!(
        stats
            .calls_suppressed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// The idle-queue probe (`idle_probe`): offered for a quiet ring, its `avail.idx` handle
/// sees the guest's next buffer, and it is withheld from a broken ring or one whose position
/// waits for a resync; every lock of the queue moves its lock count.
#[test]
fn an_idle_probe_sees_what_the_queue_would_and_is_withheld_when_not_quiet() {
    let (mut vq, mem) = queue(0);
    let stats = QueueStats::default();
    let pool = Pool::new(64).unwrap();
    let mut out = Vec::with_capacity(32);
    assert_eq!(vq.dequeue(&pool, &mut out, 32, &stats, "t"), 0);
    let (probe, next) = vq.idle_probe().expect("a quiet ring offers a probe");
    assert_eq!((probe.avail_idx(), next), (0, 0));
    // The guest posts a (garbage) chain: the probe sees the index move.
    mem.write(4096 + 2, &1u16.to_le_bytes()).unwrap();
    assert_eq!(probe.avail_idx(), 1);
    // Something known pending (read into the cache, not yet taken): no probe.
    let r = vq.ring.take().unwrap();
    assert!(matches!(vq.pending(&r), Ok(1)));
    vq.ring = Some(r);
    assert!(vq.idle_probe().is_none());
    // A broken ring: no probe.
    vq.mark_broken(ChainError::BadAvailIdx, &stats);
    assert!(vq.idle_probe().is_none());
    // A ring waiting for its resync (hot upgrade): no probe.
    let (mut vq, _mem) = queue(0);
    assert!(vq.idle_probe().is_some());
    vq.pending_sync = true;
    assert!(vq.idle_probe().is_none());
    // The lock count.
    let q = crate::device::Queue::default();
    let l0 = q.locks.load(std::sync::atomic::Ordering::Relaxed);
    drop(q.lock());
    let g = q.try_lock().expect("free");
    assert!(q.try_lock().is_none());
    drop(g);
    assert_eq!(q.locks.load(std::sync::atomic::Ordering::Relaxed), l0 + 2);
}

/// Guest-TX packets for the one-descriptor tests of both layouts, each with what it must give:
/// a plain packet, checksum offload taken, checksum offsets out of bounds, TSO (into a large
/// buffer), a refused segmentation type, a runt, one too big. `Ok((header, large))` is the
/// packet with that metadata, `Err(reason)` the drop counted.
pub(super) fn tx_cases() -> Vec<(VnetHdr, usize, TxWant)> {
    use ferrovs_sys::kernel::vnet::{F_NEEDS_CSUM, GSO_TCPV4, GSO_UDP};
    let csum = |start: u16, offset: u16| VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: start,
        csum_offset: offset,
        ..VnetHdr::default()
    };
    let gso = |gso_type: u8| VnetHdr {
        gso_type,
        gso_size: 1400,
        hdr_len: 54,
        ..csum(34, 16)
    };
    vec![
        (VnetHdr::default(), 60, Ok((VnetHdr::default(), false))),
        (csum(34, 16), 60, Ok((csum(34, 16), false))),
        (csum(50, 16), 60, Err(DropReason::BadOffload)),
        (gso(GSO_TCPV4), 60, Ok((gso(GSO_TCPV4), true))),
        (gso(GSO_UDP), 60, Err(DropReason::BadOffload)),
        (VnetHdr::default(), 10, Err(DropReason::Runt)),
        (VnetHdr::default(), 12_000, Err(DropReason::Oversize)),
    ]
}

/// What a guest-TX case must give: its packet's metadata and whether it took a large buffer,
/// or the drop reason counted.
pub(super) type TxWant = Result<(VnetHdr, bool), DropReason>;

/// What one guest-TX burst of one chain gave: its packets (bytes, metadata, large buffer)
/// and its drops by the reasons [`tx_cases`] can end in.
pub(super) type TxOutcome = (Vec<(Vec<u8>, VnetHdr, bool)>, Vec<u64>);

const TX_REASONS: [DropReason; 4] = [
    DropReason::Runt,
    DropReason::Oversize,
    DropReason::BadOffload,
    DropReason::NoMbuf,
];

/// One guest-TX burst of `vq` (which holds one chain of `bytes`: header, then packet): what
/// it gave.
pub(super) fn tx_outcome(vq: &mut VirtQueue, pool: &Pool, bytes: &[u8], case: usize) -> TxOutcome {
    let stats = QueueStats::default();
    let mut out = Vec::with_capacity(BURST);
    vq.dequeue(pool, &mut out, BURST, &stats, "t");
    assert!(vq.broken().is_none(), "case {case}");
    let got: Vec<_> = out
        .iter()
        .map(|m| (m.data().to_vec(), m.vnet, m.is_large()))
        .collect();
    assert!(
        got.iter().all(|(p, _, _)| p[..] == bytes[12..]),
        "case {case}"
    );
    (got, TX_REASONS.iter().map(|&r| stats.drops(r)).collect())
}

/// Checks that one descriptor and two gave the same, and what the case must give.
pub(super) fn check_tx_case(seen: &[TxOutcome], want: TxWant, case: usize) {
    assert_eq!(seen[0], seen[1], "case {case}: one descriptor against two");
    let (got, drops) = &seen[0];
    assert_eq!(
        got.len() + drops.iter().sum::<u64>() as usize,
        1,
        "case {case}"
    );
    let outcome = got.first().map(|g| Ok((g.1, g.2))).or_else(|| {
        drops
            .iter()
            .position(|&n| n == 1)
            .map(|k| Err(TX_REASONS[k]))
    });
    assert_eq!(outcome, Some(want), "case {case}");
}

/// Split rings: each packet of [`tx_cases`], sent as one descriptor, gives what the same bytes
/// sent as two give: the same packet and metadata or the same drop. Guest RX takes a buffer
/// of one descriptor by its fast path and anything else by the general fill: a packet placed
/// into one receive descriptor reads back as into two.
#[test]
fn one_descriptor_is_judged_as_a_chain_of_two() {
    use ferrovs_sys::guest::vring::VRING_DESC_F_NEXT;
    const DATA: u64 = 16384;
    let desc = |mem: &GuestMemory, i: u64, addr: u64, len: u32, flags: u16, next: u16| {
        let d = Descriptor {
            addr,
            len,
            flags,
            next,
        };
        mem.write(16 * i, &d.to_bytes()).unwrap();
    };
    // One chain at avail slot 0: `[0]` or `[0] -> [1]` split after the 12-byte header.
    let post = |mem: &GuestMemory, n: u32, split: bool, write: u16| {
        if split {
            desc(mem, 0, DATA, 12, VRING_DESC_F_NEXT | write, 1);
            desc(mem, 1, DATA + 12, n - 12, write, 0);
        } else {
            desc(mem, 0, DATA, n, write, 0);
        }
        mem.write(4096 + 4, &0u16.to_le_bytes()).unwrap();
        mem.write(4096 + 2, &1u16.to_le_bytes()).unwrap();
    };
    let used = |mem: &GuestMemory| {
        let u = mem.read_obj::<12>(8192).unwrap();
        let f = |i: usize| u32::from_le_bytes(u[i..i + 4].try_into().unwrap());
        (u16::from_le_bytes([u[2], u[3]]), f(4), f(8))
    };
    let f = features::VIRTIO_F_VERSION_1
        | features::VIRTIO_NET_F_CSUM
        | features::VIRTIO_NET_F_HOST_TSO4;
    let pool = Pool::with_large(64, 2).unwrap();
    for (i, (hdr, len, want)) in tx_cases().into_iter().enumerate() {
        let mut seen = Vec::new();
        for split in [false, true] {
            let (mut vq, mem) = queue(f);
            let mut bytes = vec![0u8; 12 + len];
            bytes[..10].copy_from_slice(&hdr.to_bytes());
            for (j, b) in bytes[12..].iter_mut().enumerate() {
                *b = (i * 31 + j) as u8;
            }
            mem.write(DATA, &bytes).unwrap();
            post(&mem, bytes.len() as u32, split, 0);
            seen.push(tx_outcome(&mut vq, &pool, &bytes, i));
            assert_eq!(used(&mem), (1, 0, 0), "case {i}: one used entry, head 0");
        }
        check_tx_case(&seen, want, i);
    }
    // Guest RX: one buffer of 2048 bytes, or the same as 12 + 2036; with and without
    // mergeable buffers (num_buffers = 1 in the header with them).
    for mrg in [0, features::VIRTIO_NET_F_MRG_RXBUF] {
        let mut seen = Vec::new();
        for split in [false, true] {
            let (mut vq, mem) = queue(features::VIRTIO_F_VERSION_1 | mrg);
            mem.write(DATA, &[0xee; 2048]).unwrap();
            post(&mem, 2048, split, VRING_DESC_F_WRITE);
            let pkt: Vec<u8> = (0..64u8).collect();
            let stats = QueueStats::default();
            let sent = vq.enqueue(std::iter::once((&pkt[..], VnetHdr::default())), &stats, "t");
            assert_eq!(sent, 1);
            let mut back = vec![0u8; 76];
            mem.read(DATA, &mut back).unwrap();
            assert_eq!(back[12..], pkt[..]);
            assert_eq!(back[10], u8::from(mrg != 0), "num_buffers");
            seen.push((used(&mem), back));
        }
        assert_eq!(seen[0].0, (1, 0, 76), "used entry: head 0, 76 bytes");
        assert_eq!(seen[0], seen[1], "one descriptor against two");
    }
}

#[test]
fn available_counts_what_the_guest_posted_and_the_switch_has_not_taken() {
    let (mut vq, mem, _call) = rx_queue_with_buffers(features::VIRTIO_F_VERSION_1);
    // Guest RX: all 16 buffers posted, none filled.
    assert_eq!(vq.available(), Some(16));
    let stats = QueueStats::default();
    let pkt = [0x11u8; 60];
    let sent = vq.enqueue(
        std::iter::repeat_n((&pkt[..], VnetHdr::default()), 5),
        &stats,
        "t",
    );
    assert_eq!(sent, 5);
    assert_eq!(vq.available(), Some(11));
    // The guest posts the five back (avail.idx moves on by five): all 16 again.
    mem.write(4096 + 2, &21u16.to_le_bytes()).unwrap();
    assert_eq!(vq.available(), Some(16));
    // A guest whose avail.idx runs more than a ring ahead: the figure is capped at the ring,
    // and the next burst breaks the queue, after which there is no figure.
    let (mut vq, mem, _call) = rx_queue_with_buffers(features::VIRTIO_F_VERSION_1);
    mem.write(4096 + 2, &100u16.to_le_bytes()).unwrap();
    assert_eq!(vq.available(), Some(16));
    let sent = vq.enqueue(std::iter::once((&pkt[..], VnetHdr::default())), &stats, "t");
    assert_eq!(sent, 0);
    assert_eq!(vq.broken(), Some(ChainError::BadAvailIdx));
    assert_eq!(vq.available(), None);
    // A stopped ring has none either.
    assert_eq!(VirtQueue::default().available(), None);
}
