//! Notifications, both ways. Guest to us: kicks, wanted only while the PMD sleeps
//! (interrupt mode: `enable_kicks`, re-check `has_pending`, `drain_kick`); otherwise the guest
//! is asked not to kick. Us to guest: calls, at most one per burst and only if the guest asked
//! (EVENT_IDX `used_event`, or the NO_INTERRUPT flag), deferred by [`Coalesce`] until `frames`
//! packets wait or `usecs` have passed; the PMD's timer (`flush_due`) makes the late ones.
//!
//! Invariants: a deferred call covers every used entry since the last one (`signalled_used`);
//! none is deferred past `usecs`, nor past the ring's stop or coalescing turned off (both
//! flush). Writes to the ring's flags and `avail_event` are marked in the dirty log.
//!
//! Thread-safety: called with the queue locked (the PMD per burst or timer tick, the control
//! thread to configure); the call eventfd is written without a lock, a full counter only
//! loses that notification.

use std::os::fd::AsFd;

use ferrovs_sys::guest::vring::{
    self, SplitRing, VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY,
};
use ferrovs_sys::os;

use super::VirtQueue;
use crate::stats::QueueStats;

/// Guest notification coalescing of one queue (as `ethtool -C` `rx-usecs`/`rx-frames`):
/// notify the guest at most once per `frames` packets or `usecs` microseconds, whichever
/// comes first. `usecs == 0`: off (one notification per burst, if the guest asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Coalesce {
    pub usecs: u32,
    /// 0: no packet limit (time only).
    pub frames: u32,
}

impl Coalesce {
    pub fn is_on(&self) -> bool {
        self.usecs > 0
    }
}

impl VirtQueue {
    /// Asks the guest to kick on its next available buffer (interrupt mode, before the PMD
    /// sleeps): `avail_event = last_avail` with EVENT_IDX, else clear NO_NOTIFY. The caller
    /// must then fence and re-check [`VirtQueue::has_pending`]: a buffer published before the
    /// guest saw this request would otherwise never be kicked (the guest writes its index,
    /// fences, reads our request; we write the request, fence, read its index: one of the two
    /// sees the other's write).
    pub fn enable_kicks(&self) -> bool {
        if self.pending_sync {
            // Postcopy, ring pages not seen yet: keep polling (`has_pending` says so).
            return false;
        }
        if let Some(ring) = &self.packed {
            self.packed_kicks(ring, true);
            return true;
        }
        let Some(ring) = &self.ring else { return false };
        if self.event_idx() {
            ring.set_avail_event(self.state.last_avail);
            self.log_used_now(4 + 8 * u64::from(ring.size()), 2);
        } else {
            ring.set_used_flags(0);
            self.log_used_now(0, 2);
        }
        true
    }

    /// Back to polling: no kicks wanted.
    pub fn disable_kicks(&self) {
        if let Some(ring) = &self.packed {
            if !self.pending_sync {
                self.packed_kicks(ring, false);
            }
        }
        if let Some(ring) = &self.ring {
            if self.pending_sync {
                return;
            }
            if self.event_idx() {
                ring.set_avail_event(self.state.last_avail.wrapping_sub(1));
                self.log_used_now(4 + 8 * u64::from(ring.size()), 2);
            } else {
                ring.set_used_flags(VRING_USED_F_NO_NOTIFY);
                self.log_used_now(0, 2);
            }
        }
    }

    /// Whether the guest made buffers available that we have not consumed (or, in postcopy,
    /// the ring's pages have not been seen yet: it must be polled, not slept on).
    pub fn has_pending(&self) -> bool {
        if let Some(ring) = &self.packed {
            return self.pending_sync || self.packed_has_pending(ring);
        }
        self.ring
            .as_ref()
            .is_some_and(|r| self.pending_sync || r.avail_idx() != self.state.last_avail)
    }

    /// Sets notification coalescing (control plane; takes effect at the next burst). Turning
    /// it off makes a deferred notification at once.
    pub fn set_coalesce(&mut self, c: Coalesce, stats: &QueueStats) {
        self.coalesce = c;
        self.coalesce_tsc = u64::from(c.usecs) * os::tsc_hz() / 1_000_000;
        if !c.is_on() {
            self.flush(stats);
        }
    }

    pub fn coalesce(&self) -> Coalesce {
        self.coalesce
    }

    /// After a burst moved the used index from `old`: notify the guest now, or defer (when
    /// coalescing and neither bound is reached yet).
    #[inline]
    pub(super) fn notify(&mut self, ring: &SplitRing, old: u16, stats: &QueueStats) {
        let new = self.state.used_idx;
        if old == new {
            return;
        }
        if self.defer_notification(u32::from(new.wrapping_sub(old)), stats) {
            return;
        }
        self.signal(ring, stats);
    }

    /// Coalescing: whether the notification of `n` more used entries is deferred (counted)
    /// rather than made now.
    #[inline]
    pub(super) fn defer_notification(&mut self, n: u32, stats: &QueueStats) -> bool {
        if self.coalesce.is_on() {
            let now = os::rdtsc();
            if self.deferred_since == 0 {
                self.deferred_since = now.max(1);
            }
            self.deferred_pkts = self.deferred_pkts.saturating_add(n);
            let frames_due =
                self.coalesce.frames != 0 && self.deferred_pkts >= self.coalesce.frames;
            if !frames_due && now.wrapping_sub(self.deferred_since) < self.coalesce_tsc {
                stats
                    .calls_coalesced
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// Notifies the guest of every used entry since the last notification decision, if it
    /// asked for that (EVENT_IDX `used_event`, else the NO_INTERRUPT flag).
    fn signal(&mut self, ring: &SplitRing, stats: &QueueStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let (old, new) = (self.signalled_used, self.state.used_idx);
        self.signalled_used = new;
        self.deferred_since = 0;
        self.deferred_pkts = 0;
        if old == new {
            return;
        }
        vring::fence();
        let want = if self.event_idx() {
            vring::need_event(ring.used_event(), new, old)
        } else {
            ring.avail_flags() & VRING_AVAIL_F_NO_INTERRUPT == 0
        };
        match &self.call {
            Some(call) if want => {
                // A full pipe or a closed peer only loses this notification.
                let _ = os::notify(call.as_fd());
                stats.calls.fetch_add(1, Relaxed);
            }
            _ => {
                stats.calls_suppressed.fetch_add(1, Relaxed);
            }
        }
    }

    /// TSC by which the deferred notification is due; `None` if none is deferred.
    #[inline]
    pub fn deferred_until(&self) -> Option<u64> {
        (self.deferred_since != 0).then(|| self.deferred_since.wrapping_add(self.coalesce_tsc))
    }

    /// Makes the deferred notification if it is due at TSC `now` (the PMD's timer). Returns
    /// whether one is still deferred.
    #[inline]
    pub fn flush_due(&mut self, now: u64, stats: &QueueStats) -> bool {
        match self.deferred_until() {
            None => false,
            Some(t) if now.wrapping_sub(t) as i64 >= 0 => {
                self.flush(stats);
                false
            }
            Some(_) => true,
        }
    }

    /// Makes a deferred notification now (before a PMD sleeps, when the ring stops).
    pub fn flush(&mut self, stats: &QueueStats) {
        if self.deferred_since != 0 {
            if let Some(ring) = self.packed.take() {
                self.packed_signal(&ring, stats);
                self.packed = Some(ring);
            }
            if let Some(ring) = self.ring.take() {
                self.signal(&ring, stats);
                self.ring = Some(ring);
            }
            self.deferred_since = 0;
            self.deferred_pkts = 0;
        }
    }

    /// Drains the kick eventfd (interrupt mode, later) and reports whether it fired.
    pub fn drain_kick(&self) -> bool {
        self.kick
            .as_ref()
            .is_some_and(|k| os::drain(k.as_fd()).is_ok())
    }
}
