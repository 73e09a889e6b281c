//! The idle-queue probe: a PMD's cheap look at an rx queue it found empty last time.
//!
//! A full poll of a vhost-user rx queue walks the port, takes the queue's lock (an atomic
//! read-modify-write on the queue's line, another to release it), and inside the virtqueue
//! reads its state, the ring, the guest memory's postcopy and fault flags, `avail.idx`, and
//! writes nothing back only because nothing moved. With hundreds of idle queues on one PMD
//! (a cloud host: most VMs quiet) those ten-odd cache lines per queue per iteration are most
//! of the PMD's work and push the busy ports' lines out of the cache (docs/datapath.md,
//! "Many ports on one PMD").
//!
//! After a full poll found a queue empty, the PMD keeps, per rx queue it polls (by position
//! in its list), what that poll saw: the port (`Arc`, compared by pointer), the queue, the
//! queue's lock count ([`Queue::locks`]) read under the lock, the ring's `avail.idx` handle
//! and the next available index. The next polls of that queue, while nobody has locked it
//! since (same lock count: no control-plane change, no other PMD's burst, no hot-upgrade
//! resync, no injected frame: [`Port::inject_frame`] moves the count), only read
//! `avail.idx`: equal to the index we
//! would take next, the queue is still empty and the poll ends there. Anything else (the
//! guest posted a buffer, the count moved, another port in this slot) runs the full poll in
//! the same iteration, so a queue that becomes busy is served exactly as before: the probe
//! costs it two loads, never an iteration. One probe in [`FULL_EVERY`] is a full poll
//! anyway (the fault and broken-ring checks of an idle queue's memory run at least that
//! often).
//!
//! Thread-safety: owned by one PMD thread ([`crate::pmd`]'s `Worker`). The probe reads the
//! lock count and `avail.idx` without the lock: a control-plane change racing it takes
//! effect from the next poll, as if the probe had run just before the change. A stale
//! `avail.idx` handle (the frontend replaced its memory) still points into memory kept
//! mapped by the handle, and the lock count has moved anyway.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferrovs_sys::guest::vring::AvailProbe;
use ferrovs_sys::os;
use ferrovs_vhost::device::Queue;

use crate::port::{Port, PortIo};
use crate::RxqRef;

/// Every this many probes of a queue, a full poll instead.
pub(crate) const FULL_EVERY: u16 = 1024;

/// What a full poll that found the queue empty saw.
struct Seen {
    port: Arc<Port>,
    pair: u16,
    queue: Arc<Queue>,
    locks: u64,
    avail: AvailProbe,
    next: u16,
    /// Probes left before the next full poll.
    left: u16,
}

impl Seen {
    /// Starts loading the two lines a probe reads: the lock count and `avail.idx`.
    #[inline]
    fn prefetch(&self) {
        os::prefetch(&self.queue.locks as *const std::sync::atomic::AtomicU64 as *const u8);
        self.avail.prefetch();
    }
}

/// Probes prefetch the lines of the queue this many positions ahead.
const AHEAD: usize = 12;

/// One PMD's probes, by position of the rx queue in its list.
#[derive(Default)]
pub(crate) struct IdleProbes {
    seen: Vec<Option<Seen>>,
    /// Polls the probe ended (an idle queue known still empty), for tests and profiles.
    pub(crate) hits: u64,
}

impl std::fmt::Debug for IdleProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleProbes")
            .field("queues", &self.seen.iter().flatten().count())
            .field("hits", &self.hits)
            .finish()
    }
}

impl IdleProbes {
    /// An iteration over `n` rx queues starts: forget the probes of positions past them
    /// (they hold their port, queue and guest memory alive), and prefetch the first ones.
    #[inline]
    pub(crate) fn start(&mut self, n: usize) {
        if self.seen.len() > n {
            self.seen.truncate(n);
        }
        for s in self.seen.iter().take(AHEAD).flatten() {
            s.prefetch();
        }
    }

    /// Whether rx queue `rxq` (at position `i` of the PMD's list), whose port is `port`, is
    /// known to be still empty: its poll may end here.
    #[inline]
    pub(crate) fn still_empty(&mut self, i: usize, port: &Arc<Port>, rxq: RxqRef) -> bool {
        if let Some(Some(a)) = self.seen.get(i + AHEAD) {
            a.prefetch();
        }
        let Some(slot) = self.seen.get_mut(i) else {
            return false;
        };
        let Some(s) = slot else {
            return false;
        };
        let same = Arc::ptr_eq(&s.port, port)
            && s.pair == rxq.pair
            && s.left > 0
            && s.queue.locks.load(Ordering::Acquire) == s.locks;
        if !same {
            *slot = None;
            return false;
        }
        s.left -= 1;
        let empty = s.avail.avail_idx() == s.next;
        self.hits += empty as u64;
        empty
    }

    /// After a full poll of `rxq` (position `i`) received nothing: remember what a probe
    /// needs, if the queue allows it (a vhost-user queue, free, quiet:
    /// [`ferrovs_vhost::virtqueue::VirtQueue::idle_probe`]). Off the packet path: it may
    /// grow the list when the PMD's queues were added to.
    #[cold]
    pub(crate) fn learn(&mut self, i: usize, port: &Arc<Port>, rxq: RxqRef) {
        if self.seen.len() <= i {
            self.seen.resize_with(i + 1, || None);
        }
        self.seen[i] = None;
        let PortIo::Vhost { queues } = &port.io else {
            return;
        };
        let Some(q) = queues.get(2 * rxq.pair as usize + 1) else {
            return;
        };
        let Some(vq) = q.try_lock() else {
            return;
        };
        // Read under our own lock (counted): any later locker moves it.
        let locks = q.locks.load(Ordering::Relaxed);
        if let Some((avail, next)) = vq.idle_probe() {
            self.seen[i] = Some(Seen {
                port: port.clone(),
                pair: rxq.pair,
                queue: q.clone(),
                locks,
                avail,
                next,
                left: FULL_EVERY,
            });
        }
    }
}
