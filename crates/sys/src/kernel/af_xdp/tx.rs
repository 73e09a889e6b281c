//! The transmit side ([`XskTx`]): the tx ring (we give the kernel frames to send), the
//! completion ring (it gives sent frames back), the free transmit frames, and where a
//! transmitter stands ([`XskTxPosition`]).
//!
//! Invariant: a transmit frame is either free (in our list, once) or outstanding (posted,
//! not yet reaped): `free.len() + (tx.producer - completion.consumer) == tx_frames`.
//! [`XskTx::resume`] checks a handed-over free list against it; [`XskTx::resync`] rebuilds
//! the list from the rings after a roll-back. A completion naming a frame that is not
//! outstanding is counted and ignored.
//!
//! Thread-safety: one writer at a time (`&mut self`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::rings::{RingMap, Umem};
use super::{frame_of, ring_entries, ring_free, ResumeError};
use crate::kernel::af_packet::SendReport;
use crate::kernel::netdev;

/// Where a transmitter is, with the frames it holds free.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XskTxPosition {
    pub tx_prod: u32,
    pub cq_cons: u32,
    /// Free transmit frames (UMEM frame indices).
    #[cfg_attr(feature = "serde", serde(rename = "tx_free"))]
    pub free: Vec<u32>,
}

/// The transmit side: tx and completion rings and the free transmit frames.
#[derive(Debug)]
pub struct XskTx {
    pub(super) umem: Arc<Umem>,
    pub(super) fd: Arc<OwnedFd>,
    /// For link-state ioctls (error paths only).
    pub(super) ctl: Arc<OwnedFd>,
    pub(super) ifindex: u32,
    pub(super) tx: RingMap,
    pub(super) cq: RingMap,
    pub(super) prod: u32,
    pub(super) cq_cons: u32,
    /// Free transmit frames (UMEM indices); capacity `tx_frames`, never reallocated.
    pub(super) free: Vec<u32>,
    /// Per transmit frame: whether it is in `free`.
    pub(super) is_free: Vec<bool>,
    /// The last kick said the device is down: do not queue frames that would wait.
    pub(super) link_down: bool,
    /// Completions naming a frame that was not outstanding (never expected).
    pub(super) bad_completions: u64,
}

impl XskTx {
    fn first(&self) -> u32 {
        self.umem.geo.rx_frames
    }

    /// Takes back the frames the kernel finished sending.
    #[inline]
    pub(super) fn reap(&mut self) {
        let prod = self.cq.producer().load(Ordering::Acquire);
        let n = ring_entries(prod, self.cq_cons, self.cq.size());
        if n == 0 {
            return;
        }
        let geo = self.umem.geo;
        let first = self.first();
        for k in 0..n {
            let addr = self.cq.read_addr(self.cq_cons.wrapping_add(k));
            match frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                Some((idx, _)) if idx >= first && !self.is_free[(idx - first) as usize] => {
                    self.is_free[(idx - first) as usize] = true;
                    self.free.push(idx);
                }
                _ => self.bad_completions += 1,
            }
        }
        self.cq_cons = self.cq_cons.wrapping_add(n);
        self.cq.consumer().store(self.cq_cons, Ordering::Release);
    }

    /// Whether the device is up with its carrier on (two ioctls: error paths only).
    fn device_running(&self) -> bool {
        netdev::running_by_index(self.ctl.as_fd(), self.ifindex)
    }

    /// Queues every frame of `pkts` for sending and kicks the kernel; a frame that cannot be
    /// queued is counted by reason, never retried.
    pub fn send_burst<'a, I>(&mut self, pkts: I) -> SendReport
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut rep = SendReport::default();
        self.reap();
        if self.link_down {
            if self.device_running() {
                self.link_down = false;
            } else {
                rep.link_down = pkts.into_iter().count();
                return rep;
            }
        }
        let geo = self.umem.geo;
        let max = geo.max_frame();
        let tx_cons = self.tx.consumer().load(Ordering::Acquire);
        let mut room = ring_free(self.prod, tx_cons, self.tx.size());
        for p in pkts {
            if p.len() > max {
                rep.oversize += 1;
                continue;
            }
            if room == 0 {
                rep.full += 1;
                continue;
            }
            let Some(idx) = self.free.pop() else {
                rep.full += 1;
                continue;
            };
            let first = self.first();
            self.is_free[(idx - first) as usize] = false;
            // SAFETY: frame `idx` is a free transmit frame: the kernel does not read it
            // until we post it, and `p.len() <= max < frame_size`; `p` is a Rust buffer.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.umem.frame(idx), p.len()) };
            let addr = idx as u64 * geo.frame_size as u64;
            self.tx.write_desc(self.prod, addr, p.len() as u32);
            self.prod = self.prod.wrapping_add(1);
            room -= 1;
            rep.sent += 1;
            rep.bytes += p.len() as u64;
        }
        if rep.sent > 0 {
            self.tx.producer().store(self.prod, Ordering::Release);
        }
        let queued = self.prod != self.tx.consumer().load(Ordering::Acquire);
        if queued && self.tx.needs_wakeup() {
            self.kick(&mut rep);
        }
        rep
    }

    /// Tells the kernel to send what is queued (copy mode sends from this call, up to 32
    /// frames each time; zero-copy only wakes the driver).
    fn kick(&mut self, rep: &mut SendReport) {
        for _ in 0..8 {
            let before = self.tx.consumer().load(Ordering::Acquire);
            // SAFETY: a zero-length, non-blocking sendto with no address.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            let after = self.tx.consumer().load(Ordering::Acquire);
            let done = after == self.prod;
            if r >= 0 {
                if done || after == before {
                    return;
                }
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                // More to send, or no skb/completion slot right now: the rest stays
                // queued for the next kick.
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    if done || after == before {
                        return;
                    }
                }
                // The device dropped one frame (consumed and completed, not sent).
                Some(libc::EBUSY) => {
                    rep.sent = rep.sent.saturating_sub(1);
                    if self.device_running() {
                        rep.full += 1;
                    } else {
                        rep.link_down += 1;
                        self.went_down(rep);
                        return;
                    }
                }
                Some(libc::ENETDOWN) | Some(libc::ENXIO) | Some(libc::ENODEV) => {
                    self.went_down(rep);
                    return;
                }
                _ => {
                    return;
                }
            }
        }
    }

    /// The device is down: what this burst queued will wait (or be dropped one per kick):
    /// count it as lost to the link, and queue nothing until the device runs again.
    fn went_down(&mut self, rep: &mut SendReport) {
        self.link_down = true;
        rep.link_down += rep.sent;
        rep.sent = 0;
        rep.bytes = 0;
    }

    /// Free transmit frames.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Transmit frames posted and not yet reaped (`tx.producer - completion.consumer`).
    pub fn outstanding(&self) -> u32 {
        self.prod.wrapping_sub(self.cq_cons)
    }

    /// Completions that named a frame not outstanding (never expected).
    pub fn bad_completions(&self) -> u64 {
        self.bad_completions
    }

    /// Where the transmitter is, free frames included: hand this to the next daemon.
    pub fn position(&self) -> XskTxPosition {
        XskTxPosition {
            tx_prod: self.prod,
            cq_cons: self.cq_cons,
            free: self.free.clone(),
        }
    }

    /// Continues from another daemon's position: the indices must match the shared rings,
    /// the free frames be transmit frames, each once, and with the outstanding ones account
    /// for every transmit frame.
    pub fn resume(&mut self, p: &XskTxPosition) -> Result<(), ResumeError> {
        let tx_prod = self.tx.producer().load(Ordering::Acquire);
        let cq_cons = self.cq.consumer().load(Ordering::Acquire);
        if (tx_prod, cq_cons) != (p.tx_prod, p.cq_cons) {
            return Err(ResumeError::TxIndices {
                tx_prod,
                cq_cons,
                given_tx_prod: p.tx_prod,
                given_cq_cons: p.cq_cons,
            });
        }
        let geo = self.umem.geo;
        let first = self.first();
        let mut is_free = vec![false; geo.tx_frames as usize];
        for &idx in &p.free {
            if idx < first || idx >= first + geo.tx_frames {
                return Err(ResumeError::NotTxFrame {
                    frame: idx,
                    first,
                    end: first + geo.tx_frames,
                });
            }
            if std::mem::replace(&mut is_free[(idx - first) as usize], true) {
                return Err(ResumeError::FreeTwice(idx));
            }
        }
        let outstanding = tx_prod.wrapping_sub(cq_cons);
        if p.free.len() as u64 + outstanding as u64 != geo.tx_frames as u64 {
            return Err(ResumeError::TxFrames {
                free: p.free.len(),
                outstanding,
                tx_frames: geo.tx_frames,
            });
        }
        self.prod = tx_prod;
        self.cq_cons = cq_cons;
        self.free.clear();
        self.free.extend_from_slice(&p.free);
        self.is_free = is_free;
        Ok(())
    }

    /// Finds the free frames again after another process may have used the rings (a
    /// roll-back): from our own state at the freeze, every frame posted since (tx slots
    /// `[our producer, shared producer)`) is outstanding and every frame reaped since
    /// (completion slots `[our consumer, shared consumer)`) is free. When those slots may
    /// have been overwritten (the other daemon ran for more than a ring's worth), the frames
    /// in the last `outstanding` tx slots are taken as the outstanding ones (exact when the
    /// kernel completes in order). Returns whether the exact method applied.
    pub fn resync(&mut self) -> bool {
        let geo = self.umem.geo;
        let first = self.first();
        let p1 = self.tx.producer().load(Ordering::Acquire);
        let c1 = self.cq.consumer().load(Ordering::Acquire);
        let kprod = self.cq.producer().load(Ordering::Acquire);
        let posted = p1.wrapping_sub(self.prod);
        let reaped = c1.wrapping_sub(self.cq_cons);
        let mut count: Vec<i64> = self
            .is_free
            .iter()
            .map(|f| if *f { 0 } else { 1 })
            .collect();
        let mut exact = posted <= self.tx.size()
            && reaped <= self.cq.size()
            && kprod.wrapping_sub(self.cq_cons) <= self.cq.size();
        if exact {
            for k in 0..posted {
                let (addr, _) = self.tx.read_desc(self.prod.wrapping_add(k));
                match frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                    Some((i, _)) if i >= first => count[(i - first) as usize] += 1,
                    _ => exact = false,
                }
            }
            for k in 0..reaped {
                let addr = self.cq.read_addr(self.cq_cons.wrapping_add(k));
                match frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                    Some((i, _)) if i >= first => count[(i - first) as usize] -= 1,
                    _ => exact = false,
                }
            }
            exact &= count.iter().all(|c| *c == 0 || *c == 1);
        }
        if !exact {
            count.iter_mut().for_each(|c| *c = 0);
            let outstanding = p1.wrapping_sub(c1).min(geo.tx_frames);
            for k in 0..outstanding {
                let (addr, _) = self.tx.read_desc(p1.wrapping_sub(1 + k));
                if let Some((i, _)) = frame_of(addr, geo.frame_size, first + geo.tx_frames) {
                    if i >= first {
                        count[(i - first) as usize] = 1;
                    }
                }
            }
        }
        self.free.clear();
        for (k, c) in count.iter().enumerate() {
            self.is_free[k] = *c == 0;
            if *c == 0 {
                self.free.push(first + k as u32);
            }
        }
        self.prod = p1;
        self.cq_cons = c1;
        exact
    }
}
