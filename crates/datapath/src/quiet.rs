//! Quiet rx queues: polled at a bounded interval, not every iteration, while the PMD is busy.
//!
//! A cloud host puts hundreds of VMs on a PMD, most of them idle. Polling an idle vhost-user
//! queue costs a few cache lines even through the idle probe (`idle_probe.rs`: the queue's
//! lock count and the guest's `avail.idx`), about 7 cycles a queue
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
pub const DEFAULT_POLL_US: u64 = 50;

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
    /// Positions that were not quiet at the last sweep: what an iteration between sweeps
    /// polls, so that it costs nothing per quiet queue (not even a look at its slot).
    hot: Vec<u32>,
    /// The rx queue list (address, length) the last sweep saw: another list (a new
    /// snapshot) makes the next iteration a sweep.
    list: (usize, usize),
    /// The configured interval (ns) the cycles above were computed for.
    interval_ns: u64,
    /// Polls skipped (for tests and profiles).
    pub(crate) skipped: u64,
    /// The time between two sweeps of a busy PMD (the longest a quiet queue went unpolled),
    /// measured: its maximum in TSC cycles, and a histogram by [`gap_bucket`] (`pmd-stats`).
    pub(crate) gap_max: u64,
    pub(crate) gaps: [u64; GAP_BUCKETS],
    /// TSC cycles per µs.
    cycles_per_us: u64,
}

/// Buckets of the sweep-gap histogram.
pub const GAP_BUCKETS: usize = 16;

/// The histogram bucket of a gap of `us` µs: 0 for under 1 µs, `k` for `2^(k-1)..2^k` µs,
/// the last for 16 ms and more.
#[inline]
pub fn gap_bucket(us: u64) -> usize {
    ((64 - us.leading_zeros()) as usize).min(GAP_BUCKETS - 1)
}

/// The upper bound (µs, exclusive) of bucket `k` (`u64::MAX` for the last).
pub fn gap_bucket_limit(k: usize) -> u64 {
    if k + 1 >= GAP_BUCKETS {
        u64::MAX
    } else {
        1 << k
    }
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
        self.cycles_per_us = cycles(1000).max(1);
    }

    /// Forgets the measured gaps (`pmd-stats-clear`).
    pub(crate) fn clear_gaps(&mut self) {
        self.gap_max = 0;
        self.gaps = [0; GAP_BUCKETS];
    }

    /// An iteration over `rxqs` starts at TSC `now`: decides whether it is a sweep (every
    /// queue polled) or polls only the [`Self::hot`] positions.
    #[inline]
    pub(crate) fn start(&mut self, rxqs: &[RxqRef], now: u64) {
        let n = rxqs.len();
        if self.slots.len() > n {
            self.slots.truncate(n);
        }
        let list = (rxqs.as_ptr() as usize, n);
        let gap = now.wrapping_sub(self.last_sweep);
        self.sweep = self.interval == 0 || !self.busy || gap >= self.interval || list != self.list;
        if self.sweep {
            self.list = list;
            self.hot.clear();
            if self.busy && self.interval != 0 {
                self.gap_max = self.gap_max.max(gap);
                self.gaps[gap_bucket(gap / self.cycles_per_us)] += 1;
            }
            self.last_sweep = now;
        }
    }

    /// Whether this iteration polls every queue.
    #[inline]
    pub(crate) fn sweeping(&self) -> bool {
        self.sweep
    }

    /// Outside a sweep: the `k`th position to poll (None past the last), counting the
    /// quiet queues skipped when the list is done.
    #[inline]
    pub(crate) fn hot(&mut self, k: usize, n: usize) -> Option<usize> {
        match self.hot.get(k) {
            Some(&i) => Some(i as usize),
            None => {
                self.skipped += n.saturating_sub(self.hot.len()) as u64;
                None
            }
        }
    }

    /// `rxq` (position `i`) was polled at TSC `now` and gave packets or not; in a sweep, a
    /// queue that is not quiet joins the positions polled until the next one.
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
        // (Off, every iteration is a sweep: no list to keep.)
        if self.sweep
            && self.interval != 0
            && (s.since == 0 || now.wrapping_sub(s.since) < self.quiet_after)
        {
            self.hot.push(i as u32);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const HZ: u64 = 1_000_000_000; // 1 cycle = 1 ns
    const Q: RxqRef = RxqRef { port: 3, pair: 0 };
    const B: RxqRef = RxqRef { port: 4, pair: 0 };
    /// A PMD's list: B (busy) at 0, Q at 1 (a static: the list's address is its identity).
    static LIST: [RxqRef; 2] = [B, Q];

    fn on(interval_ns: u64) -> QuietQueues {
        let mut q = QuietQueues::default();
        q.configure(interval_ns, HZ);
        q
    }

    /// One iteration at `now` over `list` as `Worker::poll_at` runs it; `got(i)`: whether
    /// position `i` gives packets. Returns the positions polled.
    fn run(
        q: &mut QuietQueues,
        list: &[RxqRef],
        now: u64,
        got: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        q.start(list, now);
        let mut polled = Vec::new();
        if q.sweeping() {
            polled.extend(0..list.len());
        } else {
            let mut k = 0;
            while let Some(i) = q.hot(k, list.len()) {
                polled.push(i);
                k += 1;
            }
        }
        for &i in &polled {
            q.polled(i, list[i], got(i), now);
        }
        q.end(polled.iter().any(|&i| got(i)));
        polled
    }

    /// One iteration over LIST: B always gives packets, Q gives `q_got`. Whether Q was polled.
    fn iterate(q: &mut QuietQueues, now: u64, q_got: bool) -> bool {
        let polled = run(q, &LIST, now, |i| i == 0 || q_got);
        assert!(polled.contains(&0), "a busy queue is never skipped");
        polled.contains(&1)
    }

    /// Iterations every 5 us for 2 ms in which Q gives nothing (quiet by then); returns
    /// the time of the next one.
    fn quiet_by_now(q: &mut QuietQueues) -> u64 {
        let mut t = 1;
        while t <= 2 * QUIET_AFTER_NS {
            iterate(q, t, false);
            t += 5_000;
        }
        t
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
        // Quiet from the next sweep: iterations every 5 us poll it once in four (every 20 us).
        while iterate(&mut q, t, false) {
            t += 5_000;
        }
        t += 5_000;
        let polls: Vec<bool> = (0..12)
            .map(|k| iterate(&mut q, t + k * 5_000, false))
            .collect();
        let n = polls.iter().filter(|p| **p).count();
        assert_eq!(n, 3, "{polls:?}");
        // Never longer than the interval between two polls.
        let mut gap = 0;
        for p in polls {
            gap = if p { 0 } else { gap + 1 };
            assert!(gap < 4);
        }
        // Measured: sweeps 20 us apart (bucket 16..32 us).
        assert_eq!(q.gap_max, 20_000);
        assert_eq!(gap_bucket(20), 5);
        assert_eq!(gap_bucket_limit(5), 32);
        assert!(
            q.gaps[5] >= 2 && q.gaps.iter().sum::<u64>() == q.gaps[5],
            "{:?}",
            q.gaps
        );
        assert!(q.skipped >= 9);
    }

    #[test]
    fn a_packet_on_a_quiet_queue_makes_it_polled_every_iteration_again() {
        let mut q = on(20_000);
        let mut t = quiet_by_now(&mut q);
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
        for k in 1..100u64 {
            let now = k * QUIET_AFTER_NS;
            assert_eq!(run(&mut q, &LIST, now, |_| false), vec![0, 1]);
        }
        assert_eq!(q.skipped, 0);
        // An idle PMD's gaps (it may sleep between iterations) are not a quiet queue's wait.
        assert_eq!(q.gap_max, 0);
        assert_eq!(q.gaps, [0; GAP_BUCKETS]);
    }

    #[test]
    fn gap_buckets_are_powers_of_two_in_microseconds() {
        assert_eq!(gap_bucket(0), 0);
        assert_eq!(gap_bucket(1), 1);
        assert_eq!((gap_bucket(2), gap_bucket(3)), (2, 2));
        assert_eq!(gap_bucket(1023), 10);
        assert_eq!(gap_bucket(1 << 20), GAP_BUCKETS - 1);
        assert_eq!(gap_bucket_limit(0), 1);
        assert_eq!(gap_bucket_limit(10), 1024);
        assert_eq!(gap_bucket_limit(GAP_BUCKETS - 1), u64::MAX);
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
    fn another_list_is_swept_at_once_and_its_queues_are_not_quiet() {
        let mut q = on(20_000);
        let mut t = quiet_by_now(&mut q);
        // Q is quiet: the iteration right after a sweep polls B only.
        while run(&mut q, &LIST, t, |i| i == 0).len() != 2 {
            t += 1_000;
        }
        assert_eq!(run(&mut q, &LIST, t + 1_000, |i| i == 0), vec![0]);
        // A new snapshot's list, another queue at position 1: swept at once, then polled
        // every iteration (it has not been quiet for 1 ms).
        static OTHER: [RxqRef; 2] = [B, RxqRef { port: 9, pair: 1 }];
        assert_eq!(run(&mut q, &OTHER, t + 2_000, |i| i == 0), vec![0, 1]);
        assert_eq!(run(&mut q, &OTHER, t + 3_000, |i| i == 0), vec![0, 1]);
    }
}
