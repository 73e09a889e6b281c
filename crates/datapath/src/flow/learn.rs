//! The path of `learn(...)`'s rules from the PMDs to the control plane.
//!
//! A translation ([`ferrovs_flow::Pipeline::translate`], on an upcall) lists the rules its
//! `learn` actions learned ([`ferrovs_flow::Translation::learned`]) without touching the
//! tables (they belong to the control plane, which publishes them). The upcall path
//! ([`super::upcall::resolve`]) pushes them into the bridge's [`LearnQueue`], which signals
//! its eventfd when it was empty; the control thread takes the batch, adds the rules (a
//! strict modify: a learned rule replaces the one with the same table, priority and match)
//! and publishes the new pipeline. So a learned rule is in place some time after the
//! packet that taught it (the control thread's wake-up and a publication: sub-millisecond
//! when idle); OVS adds it within the upcall. Packets in between take the path they would
//! without it (for OVN's hairpin replies: a dropped first reply, retransmitted).
//!
//! Bounded: [`LearnQueue::MAX`] waiting; a full queue (or one the control thread holds at
//! that instant) drops the learned rule and counts it; a PMD never waits.
//!
//! # Thread-safety
//! PMDs push (`try_lock`, a few attempts); the control thread swaps the batch out under the
//! lock. Counters are relaxed atomics.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ferrovs_flow::learn::Learned;
use ferrovs_sys::os;

/// Counters of a learn queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LearnCounters {
    /// Learned rules queued for the control thread.
    pub queued: u64,
    /// Learned rules dropped: the queue was full or busy.
    pub dropped: u64,
}

/// PMDs → control thread, one per bridge with rules (see the module doc).
#[derive(Debug)]
pub struct LearnQueue {
    q: Mutex<VecDeque<Learned>>,
    wake: OwnedFd,
    queued: AtomicU64,
    dropped: AtomicU64,
}

impl LearnQueue {
    /// Most learned rules waiting.
    pub const MAX: usize = 4096;
    const LOCK_TRIES: usize = 64;

    pub fn new() -> io::Result<LearnQueue> {
        Ok(LearnQueue {
            q: Mutex::new(VecDeque::new()),
            wake: os::eventfd()?,
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// The eventfd the control thread watches (readable: learned rules wait).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Queues what a translation learned (PMD). Returns how many were dropped.
    pub fn push(&self, learned: Vec<Learned>) -> usize {
        let n = learned.len();
        let mut guard = None;
        for _ in 0..Self::LOCK_TRIES {
            match self.q.try_lock() {
                Ok(g) => {
                    guard = Some(g);
                    break;
                }
                Err(std::sync::TryLockError::Poisoned(e)) => {
                    guard = Some(e.into_inner());
                    break;
                }
                Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
            }
        }
        let Some(mut q) = guard else {
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
            return n;
        };
        let was_empty = q.is_empty();
        let mut dropped = 0;
        for l in learned {
            if q.len() >= Self::MAX {
                dropped += 1;
                continue;
            }
            q.push_back(l);
        }
        drop(q);
        self.queued
            .fetch_add((n - dropped) as u64, Ordering::Relaxed);
        self.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
        if was_empty && n > dropped {
            let _ = os::notify(self.wake.as_fd());
        }
        dropped
    }

    /// Takes every waiting learned rule (control thread), after clearing the eventfd.
    pub fn take(&self) -> VecDeque<Learned> {
        let _ = os::drain(self.wake.as_fd());
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *q)
    }

    pub fn counters(&self) -> LearnCounters {
        LearnCounters {
            queued: self.queued.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_flow::Match;

    fn learned(p: u16) -> Learned {
        Learned {
            table: 1,
            priority: p,
            idle_timeout: 0,
            hard_timeout: 0,
            cookie: 0,
            flags: 0,
            m: Match::catchall(),
            loads: Vec::new(),
            outputs: Vec::new(),
            origin: None,
        }
    }

    #[test]
    fn learned_rules_are_bounded_and_signalled_once() {
        let q = LearnQueue::new().unwrap();
        assert_eq!(q.push(vec![learned(1), learned(2)]), 0);
        let over: Vec<Learned> = (0..LearnQueue::MAX as u16).map(learned).collect();
        assert_eq!(q.push(over), 2, "two beyond the bound dropped");
        assert_eq!(
            q.counters(),
            LearnCounters {
                queued: LearnQueue::MAX as u64,
                dropped: 2
            }
        );
        assert_eq!(q.take().len(), LearnQueue::MAX);
        assert!(q.take().is_empty());
    }
}
