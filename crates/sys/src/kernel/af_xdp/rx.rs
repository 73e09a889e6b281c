//! The receive side ([`XskRx`]): the rx ring (the kernel gives us full frames) and the fill
//! ring (we give it empty ones), and where a reader stands ([`XskRxPosition`]).
//!
//! Invariant: receive frames never stay with us. Every frame taken from the rx ring is put
//! back on the fill ring before the rx consumer index is published, so between bursts
//! `fill.producer - rx.consumer == rx_frames`; [`XskRx::resume`] checks it against a
//! handed-over position, [`XskRx::resync`] reads a killed reader's progress from it. Every
//! address the kernel gives back is checked to be a receive frame before use.
//!
//! Thread-safety: one reader at a time (`&mut self`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::rings::{RingMap, Umem};
use super::{frame_of, ring_entries, ring_free, ResumeError};

/// Where a receiver is (both indices are also in the shared rings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XskRxPosition {
    pub rx_cons: u32,
    pub fill_prod: u32,
}

/// What [`XskRx::read`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XskRxFrame {
    /// A frame of this many bytes was copied into the buffer.
    Frame(usize),
    /// Larger than the buffer (skipped).
    Oversize,
    /// A descriptor outside the receive frames (skipped; never recycled).
    Bad,
}

/// The receive side: rx and fill rings.
#[derive(Debug)]
pub struct XskRx {
    pub(super) umem: Arc<Umem>,
    pub(super) fd: Arc<OwnedFd>,
    pub(super) rx: RingMap,
    pub(super) fill: RingMap,
    pub(super) cons: u32,
    pub(super) fill_prod: u32,
    pub(super) zero_copy: bool,
    /// Frames lost to bad descriptors or a killed reader (never expected).
    pub(super) lost: u64,
}

impl XskRx {
    /// Frames waiting (up to the ring's size).
    #[inline]
    pub fn available(&self) -> u32 {
        let prod = self.rx.producer().load(Ordering::Acquire);
        ring_entries(prod, self.cons, self.rx.size())
    }

    /// Copies frame `k` of those [`XskRx::available`] into `dst` (nothing is consumed).
    #[inline]
    pub fn read(&self, k: u32, dst: &mut [u8]) -> XskRxFrame {
        let geo = self.umem.geo;
        let (addr, len) = self.rx.read_desc(self.cons.wrapping_add(k));
        let Some((idx, off)) = frame_of(addr, geo.frame_size, geo.rx_frames) else {
            return XskRxFrame::Bad;
        };
        let len = len as usize;
        if off as usize + len > geo.frame_size as usize {
            return XskRxFrame::Bad;
        }
        if len > dst.len() {
            return XskRxFrame::Oversize;
        }
        // SAFETY: `[off, off + len)` lies inside receive frame `idx` (checked), which the
        // kernel handed to us and does not write until we give it back on the fill ring;
        // `dst` is a distinct Rust buffer of at least `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.umem.frame(idx).add(off as usize),
                dst.as_mut_ptr(),
                len,
            )
        };
        XskRxFrame::Frame(len)
    }

    /// Consumes the first `n` frames: their UMEM frames go back on the fill ring first, then
    /// the rx consumer index moves (so a reader killed in between leaves a state that
    /// [`XskRx::resync`] recognises).
    #[inline]
    pub fn release(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        let geo = self.umem.geo;
        let fill_cons = self.fill.consumer().load(Ordering::Acquire);
        let room = ring_free(self.fill_prod, fill_cons, self.fill.size());
        let mut posted = 0;
        for k in 0..n {
            let (addr, _) = self.rx.read_desc(self.cons.wrapping_add(k));
            match frame_of(addr, geo.frame_size, geo.rx_frames) {
                Some((idx, _)) if posted < room => {
                    let base = idx as u64 * geo.frame_size as u64;
                    self.fill
                        .write_addr(self.fill_prod.wrapping_add(posted), base);
                    posted += 1;
                }
                _ => self.lost += 1,
            }
        }
        self.fill_prod = self.fill_prod.wrapping_add(posted);
        self.fill
            .producer()
            .store(self.fill_prod, Ordering::Release);
        self.cons = self.cons.wrapping_add(n);
        self.rx.consumer().store(self.cons, Ordering::Release);
        if self.zero_copy && self.fill.needs_wakeup() {
            // The driver sleeps until told there are fill buffers (zero-copy only).
            // SAFETY: a zero-length, non-blocking recvfrom with no address.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Where the reader is.
    pub fn position(&self) -> XskRxPosition {
        XskRxPosition {
            rx_cons: self.cons,
            fill_prod: self.fill_prod,
        }
    }

    /// Receive frames given to the kernel (`fill.producer - rx.consumer`): `rx_frames`
    /// between bursts.
    pub fn posted(&self) -> u32 {
        self.fill_prod.wrapping_sub(self.cons)
    }

    /// Frames lost so far (bad descriptors, a reader killed mid-burst).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Continues where the previous reader (another daemon) stopped, checking that the
    /// shared rings say the same and that every receive frame is with the kernel.
    pub fn resume(&mut self, p: XskRxPosition) -> Result<(), ResumeError> {
        let rx_cons = self.rx.consumer().load(Ordering::Acquire);
        let fill_prod = self.fill.producer().load(Ordering::Acquire);
        if (rx_cons, fill_prod) != (p.rx_cons, p.fill_prod) {
            return Err(ResumeError::RxIndices {
                rx_cons,
                fill_prod,
                given: p,
            });
        }
        let posted = fill_prod.wrapping_sub(rx_cons);
        if posted != self.umem.geo.rx_frames {
            return Err(ResumeError::RxPosted {
                posted,
                rx_frames: self.umem.geo.rx_frames,
            });
        }
        self.cons = rx_cons;
        self.fill_prod = fill_prod;
        Ok(())
    }

    /// Finds the reader's place from the shared rings after another process may have read
    /// them (a roll-back after the new daemon was killed). A reader killed after refilling
    /// but before moving the rx consumer left `d` frames both on the fill ring and in the rx
    /// ring: they are skipped (not read twice, not posted twice). Returns frames found lost
    /// (a reader killed in a way the invariant cannot explain; never expected).
    pub fn resync(&mut self) -> u32 {
        let rx_cons = self.rx.consumer().load(Ordering::Acquire);
        let fill_prod = self.fill.producer().load(Ordering::Acquire);
        let rx_frames = self.umem.geo.rx_frames;
        let d = fill_prod.wrapping_sub(rx_cons).wrapping_sub(rx_frames) as i32;
        self.cons = rx_cons;
        self.fill_prod = fill_prod;
        if d > 0 && (d as u32) <= self.available() {
            self.cons = rx_cons.wrapping_add(d as u32);
            self.rx.consumer().store(self.cons, Ordering::Release);
            0
        } else if d != 0 {
            let lost = d.unsigned_abs();
            self.lost += lost as u64;
            lost
        } else {
            0
        }
    }
}
