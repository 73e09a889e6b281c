//! Rx queues by measured load: what each costs the PMD that polls it, and how they are dealt
//! over the PMDs (OVS `pmd-rxq-assign`).
//!
//! * **Measurement.** A PMD charges each burst it received from an rx queue the TSC cycles
//!   since the end of the previous non-empty burst of its iteration (or the iteration's
//!   start): the dequeue, the switching and the transmits of that burst, plus the empty polls
//!   of the queues polled just before it in the same iteration. One `rdtsc`, one relaxed load
//!   and one relaxed store per *non-empty* burst; an empty poll costs nothing extra. The
//!   cumulative count lives in the port ([`RxqLoads`], one cache line per queue pair, so two
//!   PMDs polling two pairs of one port never share a line).
//! * **History.** The control thread samples the counts every [`INTERVAL_SECS`] and keeps
//!   the last [`HISTORY`] intervals per queue (a minute, as OVS's 6 × 10 s); a queue's load is
//!   the cycles of those intervals plus those since the last sample, over the TSC time they
//!   span, so a queue measured for a second already has an estimate.
//! * **Assignment** ([`assign`]) is a pure function of the queues, their loads and pins, and
//!   the number of PMDs, so the control plane can dry-run it (the auto load balancer).
//!
//! Thread-safety: a queue's cycle slot is written by the PMD that polls the queue with a
//! load and a store (not an atomic read-modify-write). Two PMDs never poll one queue at once
//! (the queue's `try_lock`), but in the iteration after a move the old PMD may still finish a
//! burst while the new one starts: one burst's cycles may then be lost, never more. The
//! history sits behind a mutex only the control thread takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::RxqRef;

/// Queue pairs with a cycle slot (vhost-user's most queue pairs).
pub const MAX_PAIRS: usize = ferrovs_vhost::features::MAX_QUEUE_PAIRS;
/// Intervals of history kept per queue.
pub const HISTORY: usize = 6;
/// Length of one interval.
pub const INTERVAL_SECS: u64 = 10;

/// One queue's cumulative cycles, alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(AtomicU64);

/// Measured history of one queue (control thread only).
#[derive(Debug, Default, Clone, Copy)]
struct History {
    /// Cumulative cycles and TSC at the last sample (TSC 0: never sampled).
    last_cycles: u64,
    last_tsc: u64,
    /// (cycles, TSC length) of the last intervals, a ring.
    intervals: [(u64, u64); HISTORY],
    next: usize,
}

/// The rx queues' processing cycles of one port, per queue pair.
#[derive(Debug, Default)]
pub struct RxqLoads {
    slots: [Slot; MAX_PAIRS],
    hist: Mutex<[History; MAX_PAIRS]>,
}

impl RxqLoads {
    /// Charges `cycles` to queue pair `pair` (PMD, once per non-empty burst).
    #[inline]
    pub fn charge(&self, pair: u16, cycles: u64) {
        if let Some(s) = self.slots.get(pair as usize) {
            s.0.store(
                s.0.load(Ordering::Relaxed).wrapping_add(cycles),
                Ordering::Relaxed,
            );
        }
    }

    /// Cycles charged to `pair` since the port was made.
    pub fn cycles(&self, pair: u16) -> u64 {
        self.slots
            .get(pair as usize)
            .map_or(0, |s| s.0.load(Ordering::Relaxed))
    }

    /// Starts the history of the first `pairs` queues that have none (control thread, at
    /// TSC `now`): what they cost before is not counted.
    pub fn start(&self, pairs: usize, now: u64) {
        let mut h = self.hist.lock().unwrap_or_else(|e| e.into_inner());
        for (i, h) in h.iter_mut().enumerate().take(pairs.min(MAX_PAIRS)) {
            if h.last_tsc == 0 {
                h.last_cycles = self.cycles(i as u16);
                h.last_tsc = now.max(1);
            }
        }
    }

    /// Closes an interval of the first `pairs` queues at TSC `now` (control thread, every
    /// [`INTERVAL_SECS`]); the oldest interval is forgotten.
    pub fn sample(&self, pairs: usize, now: u64) {
        let mut h = self.hist.lock().unwrap_or_else(|e| e.into_inner());
        for (i, h) in h.iter_mut().enumerate().take(pairs.min(MAX_PAIRS)) {
            let c = self.cycles(i as u16);
            if h.last_tsc != 0 && now > h.last_tsc {
                h.intervals[h.next] = (c.wrapping_sub(h.last_cycles), now - h.last_tsc);
                h.next = (h.next + 1) % HISTORY;
            }
            h.last_cycles = c;
            h.last_tsc = now.max(1);
        }
    }

    /// The load of `pair` at TSC `now`: cycles over the TSC time of the history and the
    /// running interval, in parts per million of a core; `None` without any history.
    pub fn load_ppm(&self, pair: u16, now: u64) -> Option<u64> {
        let h = self.hist.lock().unwrap_or_else(|e| e.into_inner());
        let h = h.get(pair as usize)?;
        if h.last_tsc == 0 {
            return None;
        }
        let mut cycles = self.cycles(pair).wrapping_sub(h.last_cycles) as u128;
        let mut span = now.saturating_sub(h.last_tsc) as u128;
        for (c, t) in h.intervals {
            cycles += c as u128;
            span += t as u128;
        }
        if span == 0 {
            return None;
        }
        Some((cycles * 1_000_000 / span).min(1_000_000) as u64)
    }

    /// Forgets the history (a hot upgrade's new daemon starts measuring afresh).
    pub fn clear_history(&self) {
        *self.hist.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
    }
}

/// How rx queues are dealt over PMDs (OVS `pmd-rxq-assign`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AssignMode {
    /// Queues sorted by measured load, busiest first, dealt over the PMDs in turn, up then
    /// down (0, 1, 1, 0, 0, 1 ...): the busiest queues on different PMDs, counts even.
    #[default]
    Cycles,
    /// Queues in port order dealt over the PMDs in turn; loads ignored.
    RoundRobin,
    /// Queues sorted by measured load, each placed on the PMD with the lowest estimated
    /// load so far (ties: fewest queues, then lowest index); counts may differ.
    Group,
}

impl AssignMode {
    pub const ALL: [AssignMode; 3] = [
        AssignMode::Cycles,
        AssignMode::RoundRobin,
        AssignMode::Group,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AssignMode::Cycles => "cycles",
            AssignMode::RoundRobin => "roundrobin",
            AssignMode::Group => "group",
        }
    }

    pub fn parse(s: &str) -> Option<AssignMode> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// One rx queue as [`assign`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxqInfo {
    pub rxq: RxqRef,
    /// Measured load (any unit, the same for all; 0 without history).
    pub load: u64,
    /// The PMD (index) it is pinned to (`pmd-rxq-affinity`).
    pub pin: Option<usize>,
}

/// Deals `rxqs` over `pmds` PMDs. Pinned queues go to their PMD, which then takes no other
/// (it is *isolated*, as in OVS); the others are dealt by `mode` over the PMDs left (over
/// all of them if every PMD is isolated: a queue is never left unpolled). A pin to a PMD
/// that does not exist counts as no pin. Ties keep the order of `rxqs`.
pub fn assign(mode: AssignMode, rxqs: &[RxqInfo], pmds: usize) -> Vec<Vec<RxqRef>> {
    let pmds = pmds.max(1);
    let mut out = vec![Vec::new(); pmds];
    let mut loads = vec![0u64; pmds];
    let mut isolated = vec![false; pmds];
    let mut free: Vec<&RxqInfo> = Vec::with_capacity(rxqs.len());
    for q in rxqs {
        match q.pin.filter(|p| *p < pmds) {
            Some(p) => {
                out[p].push(q.rxq);
                loads[p] = loads[p].saturating_add(q.load);
                isolated[p] = true;
            }
            None => free.push(q),
        }
    }
    let mut targets: Vec<usize> = (0..pmds).filter(|p| !isolated[*p]).collect();
    if targets.is_empty() {
        targets = (0..pmds).collect();
    }
    if mode != AssignMode::RoundRobin {
        // Stable: equal loads keep their order.
        free.sort_by_key(|q| std::cmp::Reverse(q.load));
    }
    let n = targets.len();
    for (i, q) in free.into_iter().enumerate() {
        let p = match mode {
            AssignMode::RoundRobin => targets[i % n],
            AssignMode::Cycles => {
                let k = i % (2 * n);
                targets[if k < n { k } else { 2 * n - 1 - k }]
            }
            AssignMode::Group => *targets
                .iter()
                .min_by_key(|p| (loads[**p], out[**p].len(), **p))
                .expect("targets is never empty"),
        };
        out[p].push(q.rxq);
        loads[p] = loads[p].saturating_add(q.load);
    }
    out
}

/// Each PMD's estimated load under `assignment`: the sum of its queues' loads (a queue
/// missing from `rxqs` counts 0).
pub fn pmd_loads(assignment: &[Vec<RxqRef>], rxqs: &[RxqInfo]) -> Vec<u64> {
    assignment
        .iter()
        .map(|qs| {
            qs.iter()
                .map(|r| rxqs.iter().find(|q| q.rxq == *r).map_or(0, |q| q.load))
                .fold(0u64, u64::saturating_add)
        })
        .collect()
}

/// Variance of `loads` (the auto load balancer's measure of imbalance).
pub fn variance(loads: &[u64]) -> f64 {
    if loads.is_empty() {
        return 0.0;
    }
    let n = loads.len() as f64;
    let mean = loads.iter().map(|l| *l as f64).sum::<f64>() / n;
    loads
        .iter()
        .map(|l| (*l as f64 - mean).powi(2))
        .sum::<f64>()
        / n
}

/// The auto load balancer's decision (OVS `pmd-auto-lb`): given each PMD's load now and
/// under a dry-run assignment (ppm of a core), whether to apply it: some PMD is at or over
/// `load_pct`, and the variance of the loads falls by `improve_pct` % or more. Returns the
/// improvement (%) when it applies.
pub fn worth_rebalancing(now: &[u64], dry: &[u64], load_pct: u32, improve_pct: u32) -> Option<f64> {
    if now.iter().all(|l| *l < u64::from(load_pct) * 10_000) {
        return None;
    }
    let before = variance(now);
    if before <= 0.0 {
        return None;
    }
    let gain = (before - variance(dry)) * 100.0 / before;
    (gain >= f64::from(improve_pct)).then_some(gain)
}

/// Parses `pmd-rxq-affinity` ("QUEUE:CORE,...", as OVS's Interface option): the core each
/// listed queue pair is pinned to. Queue ids must be below `pairs`, each listed once.
pub fn parse_affinity(s: &str, pairs: usize) -> Result<Vec<(u16, usize)>, String> {
    let mut out: Vec<(u16, usize)> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (q, c) = item
            .split_once(':')
            .ok_or_else(|| format!("pmd-rxq-affinity: '{item}' is not QUEUE:CORE"))?;
        let q: u16 = q.trim().parse().map_err(|_| {
            format!(
                "pmd-rxq-affinity: queue '{}' in '{item}' is not a number",
                q.trim()
            )
        })?;
        let c: usize = c.trim().parse().map_err(|_| {
            format!(
                "pmd-rxq-affinity: core '{}' in '{item}' is not a number",
                c.trim()
            )
        })?;
        if q as usize >= pairs {
            return Err(format!(
                "pmd-rxq-affinity: queue {q} in '{item}' does not exist (the port has {pairs})"
            ));
        }
        if out.iter().any(|(x, _)| *x == q) {
            return Err(format!("pmd-rxq-affinity: queue {q} listed twice"));
        }
        out.push((q, c));
    }
    if out.is_empty() {
        return Err(format!("pmd-rxq-affinity: '{s}' lists no QUEUE:CORE"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(port: u32, pair: u16, load: u64) -> RxqInfo {
        RxqInfo {
            rxq: RxqRef { port, pair },
            load,
            pin: None,
        }
    }

    fn ports(a: &[Vec<RxqRef>]) -> Vec<Vec<u32>> {
        a.iter()
            .map(|v| v.iter().map(|r| r.port).collect())
            .collect()
    }

    #[test]
    fn roundrobin_deals_in_port_order_and_ignores_load() {
        let qs = [q(0, 0, 90), q(1, 0, 0), q(2, 0, 80), q(3, 0, 0)];
        let a = assign(AssignMode::RoundRobin, &qs, 2);
        assert_eq!(ports(&a), vec![vec![0, 2], vec![1, 3]]);
    }

    #[test]
    fn cycles_puts_the_two_busiest_on_different_pmds_zig_zag() {
        // Round robin put 0 and 2 (the busy ones) together; cycles splits them.
        let qs = [q(0, 0, 90), q(1, 0, 0), q(2, 0, 80), q(3, 0, 0)];
        let a = assign(AssignMode::Cycles, &qs, 2);
        assert_eq!(ports(&a), vec![vec![0, 3], vec![2, 1]]);
        // Three PMDs, six queues: 0,1,2,2,1,0 by descending load.
        let qs: Vec<_> = (0..6).map(|i| q(i, 0, 60 - 10 * i as u64)).collect();
        let a = assign(AssignMode::Cycles, &qs, 3);
        assert_eq!(ports(&a), vec![vec![0, 5], vec![1, 4], vec![2, 3]]);
    }

    #[test]
    fn group_fills_the_least_loaded_pmd() {
        // One heavy queue alone; the light ones gather on the other PMD.
        let qs = [q(0, 0, 100), q(1, 0, 30), q(2, 0, 30), q(3, 0, 30)];
        let a = assign(AssignMode::Group, &qs, 2);
        assert_eq!(ports(&a), vec![vec![0], vec![1, 2, 3]]);
        // Cycles keeps counts even instead.
        let a = assign(AssignMode::Cycles, &qs, 2);
        assert_eq!(ports(&a), vec![vec![0, 3], vec![1, 2]]);
    }

    #[test]
    fn ties_and_queues_without_history_keep_their_order_and_spread() {
        // No history at all: every mode spreads them evenly, in port order.
        let qs: Vec<_> = (0..4).map(|i| q(i, 0, 0)).collect();
        for m in AssignMode::ALL {
            let a = assign(m, &qs, 2);
            assert_eq!(
                a.iter().map(Vec::len).collect::<Vec<_>>(),
                vec![2, 2],
                "{m:?}"
            );
        }
        assert_eq!(
            ports(&assign(AssignMode::Group, &qs, 2)),
            vec![vec![0, 2], vec![1, 3]]
        );
        assert_eq!(
            ports(&assign(AssignMode::Cycles, &qs, 2)),
            vec![vec![0, 3], vec![1, 2]]
        );
        // Equal loads: the earlier queue first.
        let qs = [q(5, 0, 10), q(4, 0, 10)];
        assert_eq!(
            ports(&assign(AssignMode::Cycles, &qs, 2)),
            vec![vec![5], vec![4]]
        );
    }

    #[test]
    fn more_pmds_than_queues_and_no_queues() {
        let qs = [q(0, 0, 5), q(0, 1, 7)];
        for m in AssignMode::ALL {
            let a = assign(m, &qs, 4);
            assert_eq!(a.len(), 4);
            assert_eq!(a.iter().map(Vec::len).sum::<usize>(), 2);
            assert!(a.iter().all(|v| v.len() <= 1), "{m:?}: {a:?}");
            assert_eq!(assign(m, &[], 3), vec![vec![]; 3]);
            // Zero PMDs means one.
            assert_eq!(assign(m, &qs, 0).len(), 1);
        }
    }

    #[test]
    fn pinned_queues_isolate_their_pmd() {
        let mut qs = vec![q(0, 0, 1), q(1, 0, 50), q(2, 0, 40), q(3, 0, 0)];
        qs[0].pin = Some(1);
        for m in AssignMode::ALL {
            let a = assign(m, &qs, 2);
            assert_eq!(ports(&a)[1], vec![0], "{m:?}");
            assert_eq!(a[0].len(), 3);
        }
        // Every PMD isolated: the rest still get polled; a pin past the PMDs is no pin.
        let mut qs = vec![q(0, 0, 1), q(1, 0, 1), q(2, 0, 9), q(3, 0, 0)];
        qs[0].pin = Some(0);
        qs[1].pin = Some(1);
        qs[3].pin = Some(7);
        let a = assign(AssignMode::Group, &qs, 2);
        assert_eq!(a.iter().map(Vec::len).sum::<usize>(), 4);
    }

    #[test]
    fn loads_and_variance() {
        let qs = [q(0, 0, 90), q(1, 0, 0), q(2, 0, 80), q(3, 0, 0)];
        let rr = assign(AssignMode::RoundRobin, &qs, 2);
        let cy = assign(AssignMode::Cycles, &qs, 2);
        assert_eq!(pmd_loads(&rr, &qs), vec![170, 0]);
        assert_eq!(pmd_loads(&cy, &qs), vec![90, 80]);
        assert!(variance(&pmd_loads(&cy, &qs)) < variance(&pmd_loads(&rr, &qs)));
        assert_eq!(variance(&[]), 0.0);
        assert_eq!(variance(&[5, 5]), 0.0);
    }

    #[test]
    fn the_auto_load_balancer_needs_an_overloaded_pmd_and_enough_gain() {
        // 98 % and 20 %: over 95, and even 59/59 is a 100 % gain.
        assert_eq!(
            worth_rebalancing(&[980_000, 200_000], &[590_000, 590_000], 95, 25),
            Some(100.0)
        );
        // Nobody over the threshold: nothing, however unbalanced.
        assert_eq!(
            worth_rebalancing(&[900_000, 0], &[450_000, 450_000], 95, 25),
            None
        );
        // Over, and the dry run helps by 1 - (0.32 / 0.38)^2 = 29 %: enough for 25, not 30.
        let g = worth_rebalancing(&[960_000, 200_000], &[900_000, 260_000], 95, 25);
        assert_eq!(g.map(|g| g.round()), Some(29.0));
        assert_eq!(
            worth_rebalancing(&[960_000, 200_000], &[900_000, 260_000], 95, 30),
            None
        );
        // Balanced already (variance 0) or a single PMD: nothing to gain.
        assert_eq!(
            worth_rebalancing(&[990_000, 990_000], &[990_000, 990_000], 95, 0),
            None
        );
        assert_eq!(worth_rebalancing(&[990_000], &[990_000], 95, 0), None);
    }

    #[test]
    fn history_measures_load_over_the_intervals() {
        let l = RxqLoads::default();
        assert_eq!(l.load_ppm(0, 100), None);
        l.start(2, 1000);
        l.charge(0, 500);
        // Half of the 1000 cycles since the start, before any interval closed.
        assert_eq!(l.load_ppm(0, 2000), Some(500_000));
        assert_eq!(l.load_ppm(1, 2000), Some(0));
        l.sample(2, 2000);
        l.charge(0, 1000);
        assert_eq!(l.load_ppm(0, 3000), Some(750_000));
        // Old intervals fall out of the window.
        for i in 0..=HISTORY as u64 {
            l.sample(2, 3000 + i * 1000);
        }
        assert_eq!(l.load_ppm(0, 3000 + HISTORY as u64 * 1000), Some(0));
        // Out-of-range pairs are ignored, not a panic.
        l.charge(MAX_PAIRS as u16, 5);
        assert_eq!(l.cycles(MAX_PAIRS as u16), 0);
        assert_eq!(l.load_ppm(MAX_PAIRS as u16, 1), None);
        l.clear_history();
        assert_eq!(l.load_ppm(0, 1), None);
    }

    #[test]
    fn affinity_strings_parse_or_say_why_not() {
        assert_eq!(parse_affinity("0:3, 1:1", 2), Ok(vec![(0, 3), (1, 1)]));
        assert_eq!(
            parse_affinity("0-3", 2),
            Err("pmd-rxq-affinity: '0-3' is not QUEUE:CORE".into())
        );
        assert_eq!(
            parse_affinity("x:1", 2),
            Err("pmd-rxq-affinity: queue 'x' in 'x:1' is not a number".into())
        );
        assert_eq!(
            parse_affinity("0:y", 2),
            Err("pmd-rxq-affinity: core 'y' in '0:y' is not a number".into())
        );
        assert_eq!(
            parse_affinity("2:0", 2),
            Err("pmd-rxq-affinity: queue 2 in '2:0' does not exist (the port has 2)".into())
        );
        assert_eq!(
            parse_affinity("0:0,0:1", 2),
            Err("pmd-rxq-affinity: queue 0 listed twice".into())
        );
        assert_eq!(
            parse_affinity(" , ", 2),
            Err("pmd-rxq-affinity: ' , ' lists no QUEUE:CORE".into())
        );
    }
}
