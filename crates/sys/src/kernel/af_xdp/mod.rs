//! AF_XDP uplinks: an existing netdev's receive queue 0 redirected to a socket by XDP.
//!
//! Pieces (all made by [`XskSocket::open`]):
//!
//! * the **UMEM**: packet memory shared with the kernel, in a memfd (so that a hot upgrade can
//!   hand it over), cut into frames of [`XskGeometry::frame_size`] bytes. Frames
//!   `0..rx_frames` are for receive, the next `tx_frames` for transmit;
//! * four **rings** mapped from the socket: *fill* (we give the kernel empty receive frames),
//!   *rx* (the kernel gives them back full), *tx* (we give frames to send), *completion* (the
//!   kernel gives sent frames back). Each is a power-of-two array with a producer and a
//!   consumer index (free-running `u32`s) in shared memory; each side writes one index;
//! * the **XDP program** ([`crate::kernel::bpf`]) redirecting queue 0 to the socket;
//! * a packet socket with no protocol holding the device in promiscuous mode (a per-socket
//!   membership, undone when the socket closes) — frames for other MAC addresses must reach
//!   XDP too.
//!
//! Frame ownership (the invariants the hot upgrade relies on):
//!
//! * **Receive frames never stay with us.** [`XskRx::release`] puts every frame it consumed
//!   back on the fill ring before it publishes the rx consumer index, so between bursts
//!   `fill.producer - rx.consumer == rx_frames` exactly. The new daemon checks it; after a
//!   roll-back, a difference tells how far a killed reader got (see [`XskRx::resync`]).
//! * **Transmit frames are free (our list) or outstanding** (posted, not yet reaped from the
//!   completion ring): `free.len() + (tx.producer - completion.consumer) == tx_frames`. The
//!   free list is plain data handed over at the freeze ([`XskTxPosition`]), checked against
//!   that count and for duplicates.
//!
//! Copy mode vs zero-copy: the socket is bound without forcing either; the kernel uses
//! zero-copy where the driver supports it (a NIC with AF_XDP support) and copy mode otherwise
//! (veth, generic XDP). The datapath copies frames in and out of the UMEM either way (the
//! switch's own buffers come from its pool), so both behave the same here.
//!
//! Safety: the rings and the UMEM are memory the kernel shares. Indices are read and written
//! with atomics (Acquire on the other side's index, Release on ours); descriptors and frame
//! bytes are moved with raw copies, never as references; every address the kernel gives
//! back is checked against the UMEM and the frame's role before use.
//!
//! Thread-safety: an [`XskRx`] has one reader, an [`XskTx`] one writer at a time (`&mut
//! self`; the datapath puts each behind its own mutex). [`XskSocket`] is shared.
//!
//! Files: `rings.rs` the shared memory (ring mappings, UMEM) and its raw accesses, `rx.rs`
//! and `tx.rs` the two ring protocols with their hand-over positions, `socket.rs` set-up,
//! adoption of handed-over fds and the kernel's counters; this file the geometry, the ring
//! arithmetic, the errors and the plain hand-over types shared by all of them.

mod rings;
mod rx;
mod socket;
mod tx;

use std::io;
use std::os::fd::OwnedFd;

use crate::kernel::bpf::BpfError;
use crate::kernel::netdev;

pub use rings::Umem;
pub use rx::{XskRx, XskRxFrame, XskRxPosition};
pub use socket::XskSocket;
pub use tx::{XskTx, XskTxPosition};

/// Shape of the UMEM and rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XskGeometry {
    /// Bytes per frame (a power of two, 2048..=4096; the kernel keeps 256 of them as
    /// headroom, so this bounds the largest frame).
    pub frame_size: u32,
    /// Receive frames, also the size of the fill and rx rings (a power of two).
    pub rx_frames: u32,
    /// Transmit frames, also the size of the tx and completion rings (a power of two).
    pub tx_frames: u32,
}

/// `XDP_PACKET_HEADROOM`: what the kernel keeps in front of a received frame.
pub const KERNEL_HEADROOM: u32 = 256;

impl XskGeometry {
    /// 1024 + 1024 frames of 4 KiB (8 MiB of UMEM).
    pub const DEFAULT: XskGeometry = XskGeometry {
        frame_size: 4096,
        rx_frames: 1024,
        tx_frames: 1024,
    };

    /// Bytes of UMEM.
    pub fn umem_len(&self) -> usize {
        self.frame_size as usize * (self.rx_frames as usize + self.tx_frames as usize)
    }

    /// Largest frame received or sent.
    pub fn max_frame(&self) -> usize {
        (self.frame_size - KERNEL_HEADROOM) as usize
    }

    pub fn check(&self) -> Result<(), String> {
        let ok = matches!(self.frame_size, 2048 | 4096)
            && self.rx_frames.is_power_of_two()
            && self.tx_frames.is_power_of_two()
            && (16..=16384).contains(&self.rx_frames)
            && (16..=16384).contains(&self.tx_frames);
        if ok {
            Ok(())
        } else {
            Err(format!("AF_XDP geometry {self:?} is invalid"))
        }
    }
}

/// Entries a consumer may take: `prod - cons`, never more than the ring holds.
#[inline]
pub fn ring_entries(prod: u32, cons: u32, size: u32) -> u32 {
    prod.wrapping_sub(cons).min(size)
}

/// Slots a producer may fill: the ring's size less what the consumer has not taken.
#[inline]
pub fn ring_free(prod: u32, cons: u32, size: u32) -> u32 {
    size - ring_entries(prod, cons, size)
}

/// The frame an address of the UMEM lies in, and its offset in it; `None` outside.
#[inline]
pub fn frame_of(addr: u64, frame_size: u32, frames: u32) -> Option<(u32, u32)> {
    let idx = addr / frame_size as u64;
    if idx >= frames as u64 {
        return None;
    }
    Some((idx as u32, (addr % frame_size as u64) as u32))
}

/// Why an AF_XDP uplink could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error(transparent)]
    Name(#[from] netdev::NameError),
    #[error("no network device named {0}")]
    NoDevice(String),
    #[error("{0} is not an Ethernet device (link type {1}); AF_XDP uplinks need one")]
    NotEthernet(String, u16),
    #[error("{name}: cannot {what}")]
    Setup {
        name: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{name}")]
    Bpf {
        name: String,
        #[source]
        source: BpfError,
    },
    #[error("handed-over AF_XDP fds: {0}")]
    BadFd(String),
}

/// Why a handed-over AF_XDP position ([`XskRxPosition`], [`XskTxPosition`]) was refused: it
/// comes from another process (untrusted), and is checked against the rings both share.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    #[error(
        "AF_XDP rings at rx {rx_cons}/fill {fill_prod}, handed over at {}/{}",
        .given.rx_cons,
        .given.fill_prod
    )]
    RxIndices {
        rx_cons: u32,
        fill_prod: u32,
        given: XskRxPosition,
    },
    #[error("{posted} receive frames with the kernel, expected {rx_frames}")]
    RxPosted { posted: u32, rx_frames: u32 },
    #[error(
        "AF_XDP rings at tx {tx_prod}/completion {cq_cons}, handed over at \
         {given_tx_prod}/{given_cq_cons}"
    )]
    TxIndices {
        tx_prod: u32,
        cq_cons: u32,
        given_tx_prod: u32,
        given_cq_cons: u32,
    },
    #[error("free transmit frame {frame} is not a transmit frame ({first}..{end})")]
    NotTxFrame { frame: u32, first: u32, end: u32 },
    #[error("transmit frame {0} handed over free twice")]
    FreeTwice(u32),
    #[error("{free} free + {outstanding} outstanding transmit frames, expected {tx_frames}")]
    TxFrames {
        free: usize,
        outstanding: u32,
        tx_frames: u32,
    },
}

/// The kernel's AF_XDP counters (`XDP_STATISTICS`), cumulative for the socket's life. A hot
/// upgrade carries those already counted; on the wire they are the array `[rx_dropped,
/// rx_ring_full, rx_invalid_descs, tx_invalid_descs]` (that order is the wire format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(from = "[u64; 4]", into = "[u64; 4]")
)]
pub struct XskStats {
    /// Frames dropped on receive (no fill frame, too large for a frame).
    pub rx_dropped: u64,
    /// Frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
}

impl From<XskStats> for [u64; 4] {
    fn from(s: XskStats) -> [u64; 4] {
        [
            s.rx_dropped,
            s.rx_ring_full,
            s.rx_invalid_descs,
            s.tx_invalid_descs,
        ]
    }
}

impl From<[u64; 4]> for XskStats {
    fn from([rx_dropped, rx_ring_full, rx_invalid_descs, tx_invalid_descs]: [u64; 4]) -> Self {
        XskStats {
            rx_dropped,
            rx_ring_full,
            rx_invalid_descs,
            tx_invalid_descs,
        }
    }
}

/// The fds a hot upgrade hands over, in this order.
#[derive(Debug)]
pub struct XskFds {
    pub xsk: OwnedFd,
    pub umem: OwnedFd,
    pub promisc: OwnedFd,
    pub map: OwnedFd,
    pub prog: OwnedFd,
    pub link: OwnedFd,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::af_packet::{AfPacket, RingGeometry, RxFrame};
    use crate::kernel::test_veth::Veth;
    use std::os::fd::BorrowedFd;

    #[test]
    fn ring_arithmetic_wraps() {
        assert_eq!(ring_entries(5, 3, 8), 2);
        assert_eq!(ring_free(5, 3, 8), 6);
        // Free-running indices wrap around u32.
        assert_eq!(ring_entries(2, u32::MAX - 1, 8), 4);
        assert_eq!(ring_free(2, u32::MAX - 1, 8), 4);
        // A full ring, and a corrupt pair (producer "behind"): never more than the size.
        assert_eq!(ring_entries(8, 0, 8), 8);
        assert_eq!(ring_free(8, 0, 8), 0);
        assert_eq!(ring_entries(0, 1, 8), 8);
        assert_eq!(ring_free(0, 1, 8), 0);
        assert_eq!(frame_of(4096 * 3 + 256, 4096, 4), Some((3, 256)));
        assert_eq!(frame_of(4096 * 4, 4096, 4), None);
        assert_eq!(frame_of(u64::MAX, 4096, 4), None);
        let g = XskGeometry::DEFAULT;
        assert!(g.check().is_ok());
        assert_eq!(g.umem_len(), 8 << 20);
        assert_eq!(g.max_frame(), 3840);
        assert!(XskGeometry {
            frame_size: 1000,
            ..g
        }
        .check()
        .is_err());
        assert!(XskGeometry {
            rx_frames: 1000,
            ..g
        }
        .check()
        .is_err());
    }

    fn frame(tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14] = tag;
        f
    }

    /// Receives frames until one tagged `tag` (skipping the host's own traffic).
    fn recv_tag(rx: &mut XskRx, tag: u8) -> Vec<u8> {
        let t = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        while t.elapsed() < std::time::Duration::from_secs(3) {
            let n = rx.available();
            let mut found = None;
            for k in 0..n {
                if let XskRxFrame::Frame(len) = rx.read(k, &mut buf) {
                    if found.is_none() && buf[12..14] == [0x88, 0xb5] && buf[14] == tag {
                        found = Some(buf[..len].to_vec());
                    }
                }
            }
            rx.release(n);
            if let Some(f) = found {
                return f;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("frame {tag} never arrived");
    }

    #[test]
    fn veth_frames_both_ways_and_the_rings_hand_over() {
        let Some((_guard, a, b)) = Veth::new("fvx", "x", "AF_XDP") else {
            return;
        };
        let (sock, mut rx, mut tx) = XskSocket::open(&a, XskGeometry::DEFAULT).unwrap();
        assert!(!sock.zero_copy(), "veth has no zero-copy");
        let (peer, mut peer_ring) = AfPacket::open(&b, RingGeometry::DEFAULT).unwrap();
        assert_eq!(rx.posted(), XskGeometry::DEFAULT.rx_frames);
        // Wire -> us. (A veth just brought up refuses frames for a moment.)
        let f1 = frame(1);
        for _ in 0..200 {
            if peer.send_burst([&f1[..]]).sent == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(recv_tag(&mut rx, 1), f1);
        assert_eq!(rx.posted(), XskGeometry::DEFAULT.rx_frames);
        // Us -> wire.
        let f2 = frame(2);
        let mut sent = 0;
        for _ in 0..200 {
            sent = tx.send_burst([&f2[..]]).sent;
            if sent == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(sent, 1);
        let mut buf = [0u8; 2048];
        let t = std::time::Instant::now();
        loop {
            match peer_ring.next(&mut buf) {
                RxFrame::Frame(60) if buf[14] == 2 => break,
                RxFrame::Empty => std::thread::sleep(std::time::Duration::from_millis(1)),
                _ => {}
            }
            assert!(t.elapsed().as_secs() < 3, "frame 2 never arrived");
        }
        // Hand over: a second mapping from copies of the fds carries on exactly.
        let dup = |f: BorrowedFd<'_>| f.try_clone_to_owned().unwrap();
        let [x, u, p, m, pr, l] = sock.handover_fds();
        let fds = XskFds {
            xsk: dup(x),
            umem: dup(u),
            promisc: dup(p),
            map: dup(m),
            prog: dup(pr),
            link: dup(l),
        };
        let (sock2, mut rx2, mut tx2) =
            XskSocket::from_fds(fds, XskGeometry::DEFAULT, sock.ifindex(), sock.xdp_mode())
                .unwrap();
        // Ring positions that do not match, or a free list that does not add up, are refused,
        // each with its own error.
        let good = rx.position();
        let bad = XskRxPosition {
            rx_cons: good.rx_cons.wrapping_add(1),
            ..good
        };
        assert!(matches!(
            rx2.resume(bad),
            Err(ResumeError::RxIndices { given, .. }) if given == bad
        ));
        rx2.resume(good).unwrap();
        let mut bad = tx.position();
        bad.tx_prod = bad.tx_prod.wrapping_add(1);
        assert!(matches!(
            tx2.resume(&bad),
            Err(ResumeError::TxIndices { .. })
        ));
        let mut bad = tx.position();
        let lost = bad.free.pop().unwrap();
        let e = tx2.resume(&bad).unwrap_err();
        let want = ResumeError::TxFrames {
            free: bad.free.len(),
            outstanding: tx.outstanding(),
            tx_frames: XskGeometry::DEFAULT.tx_frames,
        };
        assert_eq!(e, want);
        bad.free.push(bad.free[0]);
        assert_eq!(tx2.resume(&bad), Err(ResumeError::FreeTwice(bad.free[0])));
        bad.free.pop();
        bad.free.push(lost);
        bad.free[0] = 0;
        assert!(matches!(
            tx2.resume(&bad),
            Err(ResumeError::NotTxFrame { frame: 0, .. })
        ));
        tx2.resume(&tx.position()).unwrap();
        assert_eq!(
            tx2.free_frames() as u32 + tx2.outstanding(),
            XskGeometry::DEFAULT.tx_frames
        );
        let f3 = frame(3);
        assert_eq!(peer.send_burst([&f3[..]]).sent, 1);
        assert_eq!(recv_tag(&mut rx2, 3), f3);
        assert_eq!(tx2.send_burst([&f2[..]]).sent, 1);
        // Roll-back: the first reader finds its place again from the rings.
        assert_eq!(rx.resync(), 0);
        assert_eq!(rx.position(), rx2.position());
        assert!(tx.resync());
        std::thread::sleep(std::time::Duration::from_millis(20));
        tx.reap();
        tx2.reap();
        assert_eq!(tx.free_frames(), tx2.free_frames());
        assert_eq!(tx.outstanding(), 0);
        let s = sock2.statistics().unwrap();
        assert_eq!(s.rx_invalid_descs + s.tx_invalid_descs, 0);
        // Not a valid device, not Ethernet.
        assert!(matches!(
            XskSocket::open("fvx-nosuchdev", XskGeometry::DEFAULT),
            Err(XskError::NoDevice(_))
        ));
        let e = XskSocket::open("lo", XskGeometry::DEFAULT).unwrap_err();
        assert!(matches!(e, XskError::NotEthernet(_, 772)), "{e}");
    }
}
