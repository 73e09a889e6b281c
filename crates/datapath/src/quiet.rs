//! Quiet rx queues: polled at a bounded interval, not every iteration, while the PMD is busy.
//!
//! A cloud host puts hundreds of VMs on a PMD, most of them idle. Polling an idle vhost-user
//! queue costs a few cache lines even through the idle probe (`idle_probe.rs`: the queue's
//! lock count, the guest's `avail.idx`, the port's inject flag), about 7 cycles a queue
//! per iteration on this machine: with 254 idle queues beside two busy ones that is 15 %
//! of the PMD, taken from the busy ports (docs/datapath.md, "Many ports on one PMD").
//!
//! So a PMD tracks, per position in its rx queue list, when each queue last gave packets.
//! A queue that gave none for [`QUIET_AFTER_NS`] is *quiet*. While the PMD is busy (its
//! previous iteration moved packets), an iteration skips its quiet queues, except in a
//! *sweep*: the first iteration after the configured interval (`pmd-quiet-rxq-poll-us`)
//! since the last sweep. An iteration after one that moved nothing is always a sweep: an
//! idle PMD polls everything every time, as before, and sleeps (adaptive and interrupt
//! mode) only after checking every ring anyway (`pmd.rs`, `sleep`).
//!
//! The cost, stated: while the PMD is busy forwarding for other queues, the first packet
//! of a queue quiet for 1 ms waits at most the interval plus one iteration before it is
//! polled; a queue that gave a packet is polled every iteration again at once. An
//! interval of 0 turns this off (every queue every iteration). What a queue's rx counters
//! and load accounting see does not change: a skipped poll would have found nothing, or
//! finds it at the sweep.
//!
//! Thread-safety: owned by one PMD thread ([`crate::pmd`]'s `Worker`); plain data.

use crate::RxqRef;

/// A queue without packets this long (ns) is quiet.
pub const QUIET_AFTER_NS: u64 = 1_000_000;

/// The default interval between polls of quiet queues while the PMD is busy, in µs
/// (`pmd-quiet-rxq-poll-us`).
pub const DEFAULT_POLL_US: u64 = 20;

/// What one position of the PMD's rx queue list did lately.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The queue this position held at its last poll.
    rxq: RxqRef,
    /// TSC of the first of the empty polls in a row that this one is in; 0: the last poll
    /// gave packets.
    since: u64,
}

/// One PMD's view of which of its queues are quiet.
#[derive(Debug, Default)]
pub(crate) struct QuietQueues {
    slots: Vec<Slot>,
    /// TSC cycles between sweeps while busy (0: off).
    interval: u64,
    /// TSC cycles without packets before a queue is quiet.
    quiet_after: u64,
    last_sweep: u64,
    /// This iteration polls quiet queues too.
    sweep: bool,
    /// The previous iteration moved packets.
    busy: bool,
    /// The configured interval (ns) the cycles above were computed for.
    interval_ns: u64,
    /// Polls skipped (for tests and profiles).
    pub(crate) skipped: u64,
}

impl QuietQueues {
    /// Sets the sweep interval (ns; 0: poll every queue every iteration) for a TSC of `hz`.
    /// Cheap when nothing changed: called every iteration.
    #[inline]
    pub(crate) fn configure(&mut self, interval_ns: u64, hz: u64) {
        if interval_ns == self.interval_ns && self.quiet_after != 0 {
            return;
        }
        let cycles = |ns: u64| (ns as u128 * hz as u128 / 1_000_000_000) as u64;
        self.interval_ns = interval_ns;
        self.interval = cycles(interval_ns);
        self.quiet_after = cycles(QUIET_AFTER_NS).max(1);
    }

    /// An iteration over `n` queues starts at TSC `now`: decides whether it is a sweep.
    #[inline]
    pub(crate) fn start(&mut self, n: usize, now: u64) {
        if self.slots.len() > n {
            self.slots.truncate(n);
        }
        self.sweep =
            self.interval == 0 || !self.busy || now.wrapping_sub(self.last_sweep) >= self.interval;
        if self.sweep {
            self.last_sweep = now;
        }
    }

    /// Whether this iteration skips `rxq` (at position `i`): a quiet queue outside a sweep.
    #[inline]
    pub(crate) fn skip(&mut self, i: usize, rxq: RxqRef, now: u64) -> bool {
        if self.sweep {
            return false;
        }
        let Some(s) = self.slots.get(i) else {
            return false;
        };
        let quiet = s.rxq == rxq && s.since != 0 && now.wrapping_sub(s.since) >= self.quiet_after;
        self.skipped += quiet as u64;
        quiet
    }

    /// `rxq` (position `i`) was polled at TSC `now` and gave packets or not.
    #[inline]
    pub(crate) fn polled(&mut self, i: usize, rxq: RxqRef, got: bool, now: u64) {
        if self.slots.len() <= i {
            self.grow(i);
        }
        let s = &mut self.slots[i];
        if s.rxq != rxq || got {
            *s = Slot { rxq, since: 0 };
        }
        if !got && s.since == 0 {
            s.since = now.max(1);
        }
    }

    #[cold]
    fn grow(&mut self, i: usize) {
        self.slots.resize(
            i + 1,
            Slot {
                rxq: RxqRef {
                    port: u32::MAX,
                    pair: u16::MAX,
                },
                since: 0,
            },
        );
    }

    /// The iteration ended; it moved packets or not.
    #[inline]
    pub(crate) fn end(&mut self, moved: bool) {
        self.busy = moved;
    }

    /// Whether the iteration in progress is a sweep.
    #[cfg(test)]
    pub(crate) fn sweeping(&self) -> bool {
        self.sweep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HZ: u64 = 1_000_000_000; // 1 cycle = 1 ns
    const Q: RxqRef = RxqRef { port: 3, pair: 0 };
    const B: RxqRef = RxqRef { port: 4, pair: 0 };

    fn on(interval_ns: u64) -> QuietQueues {
        let mut q = QuietQueues::default();
        q.configure(interval_ns, HZ);
        q
    }

    /// One iteration at `now` over `[B, Q]`: B always gives packets, Q gives `q_got`.
    /// Returns whether Q was polled.
    fn iterate(q: &mut QuietQueues, now: u64, q_got: bool) -> bool {
        q.start(2, now);
        assert!(!q.skip(0, B, now), "a busy queue is never skipped");
        q.polled(0, B, true, now);
        let polled = !q.skip(1, Q, now);
        if polled {
            q.polled(1, Q, q_got, now);
        }
        q.end(true);
        polled
    }

    #[test]
    fn a_queue_empty_for_a_millisecond_is_polled_once_per_interval_while_busy() {
        let mut q = on(20_000);
        let mut t = 1;
        // Not yet quiet: polled every iteration for the first millisecond.
        while t < QUIET_AFTER_NS {
            assert!(iterate(&mut q, t, false), "polled at {t}");
            t += 5_000;
        }
        // Quiet now: iterations every 5 us poll it once in four (every 20 us).
        let polls: Vec<bool> = (0..12)
            .map(|k| iterate(&mut q, t + k * 5_000, false))
            .collect();
        let n = polls.iter().filter(|p| **p).count();
        assert_eq!(n, 3, "{polls:?}");
        assert_eq!(q.skipped, 9);
        // Never longer than the interval between two polls.
        let mut gap = 0;
        for p in polls {
            gap = if p { 0 } else { gap + 1 };
            assert!(gap < 4);
        }
    }

    #[test]
    fn a_packet_on_a_quiet_queue_makes_it_polled_every_iteration_again() {
        let mut q = on(20_000);
        let mut t = 1;
        while t <= 2 * QUIET_AFTER_NS {
            iterate(&mut q, t, false);
            t += 5_000;
        }
        // The next sweep finds a packet.
        while !iterate(&mut q, t, true) {
            t += 5_000;
        }
        for _ in 0..10 {
            t += 5_000;
            assert!(iterate(&mut q, t, false));
        }
    }

    #[test]
    fn an_idle_pmd_polls_everything_every_iteration() {
        let mut q = on(20_000);
        q.start(1, 1);
        q.polled(0, Q, false, 1);
        q.end(false);
        for k in 1..100u64 {
            let now = k * QUIET_AFTER_NS;
            q.start(1, now);
            assert!(q.sweeping());
            assert!(!q.skip(0, Q, now));
            q.polled(0, Q, false, now);
            q.end(false);
        }
        assert_eq!(q.skipped, 0);
    }

    #[test]
    fn interval_zero_polls_every_queue_every_iteration() {
        let mut q = on(0);
        let mut t = 1;
        for _ in 0..1000 {
            assert!(iterate(&mut q, t, false));
            t += 5_000;
        }
        assert_eq!(q.skipped, 0);
    }

    #[test]
    fn another_queue_at_a_position_is_not_quiet() {
        let mut q = on(20_000);
        let mut t = 1;
        while t <= 2 * QUIET_AFTER_NS {
            iterate(&mut q, t, false);
            t += 5_000;
        }
        // The list changed: another queue at position 1 is polled, then counts from now.
        let other = RxqRef { port: 9, pair: 1 };
        q.start(2, t);
        q.polled(0, B, true, t);
        // Not a sweep right after one? Either way the new queue is never skipped.
        assert!(!q.skip(1, other, t));
        q.polled(1, other, false, t);
        q.end(true);
        assert!(!q.skip(1, other, t + 1));
    }
}
