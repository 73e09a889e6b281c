//! Poll-mode driver threads.
//!
//! A PMD owns a packet pool and a set of rx queues (from the published [`Snapshot`]). Each
//! iteration it loads the snapshot (one atomic load), and for each of its rx queues: takes
//! the queue's lock with `try_lock` (a queue being reconfigured is skipped for this round),
//! receives a burst of up to 32 packets ([`Port::rx_burst`]: a vhost-user dequeue, or a
//! kernel port's burst), decides each packet's fate (the plain L2 path here, or
//! [`crate::flow::input`]), groups packets by output port and transmits each group with one
//! [`Port::tx_burst`] (the output stage, `output.rs`; for vhost-user: one used-ring publish,
//! at most one guest notification). The per-thread state (`Worker`: pool, scratch, flow
//! caches, notification timers) is allocated once at start; the loop allocates nothing.
//!
//! Accounting: TSC cycles of iterations that moved packets are *busy*, the rest *idle*;
//! cycles per packet = busy cycles / packets, as OVS's `pmd-stats-show` reports. Each rx
//! queue that gave packets is charged its burst's cycles in its port ([`crate::rxq`]), for
//! the assignment of queues by load.
//!
//! Thread-safety: counters are single-writer (this thread), published with relaxed stores.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ferrovs_counters::DropReason;
use ferrovs_sys::guest::vring;
use ferrovs_sys::os;
use ferrovs_sys::pool::Pool;
use ferrovs_vhost::virtqueue::BURST;

use crate::flow::input::FlowCtx;
use crate::l2::{self, Decision};
use crate::output::{add_output, add_output_run, Burst, Scratch};
#[cfg(doc)]
use crate::port::Port;
use crate::port::{NotifyTimers, PortIo};
use crate::{Datapath, RxMode, RxqRef, Snapshot};

/// Buffers per PMD pool: bursts in flight plus flood copies and software segments
/// (`MAX_EXTRA`), with margin.
pub const POOL_BUFFERS: u32 = 4096;
/// A PMD thread's stack: 16 MiB (of address space; only what a translation touches is
/// ever paged in).
const PMD_STACK: usize = 16 << 20;
/// Large buffers per PMD pool (TSO packets of up to 64 KiB from guests and TAPs).
pub const POOL_LARGE_BUFFERS: u32 = 256;

/// Counters of one PMD.
#[derive(Debug, Default)]
pub struct PmdStats {
    pub index: usize,
    pub core: Option<usize>,
    pub iterations: AtomicU64,
    pub busy_cycles: AtomicU64,
    pub idle_cycles: AtomicU64,
    pub rx_packets: AtomicU64,
    pub tx_packets: AtomicU64,
    pub drops: AtomicU64,
    pub hugepages: AtomicBool,
    pub rxqs: AtomicU64,
    /// Iterations completed, stored after every one (with the snapshot released): when it
    /// moves past a value read after a publish, this PMD no longer uses the old snapshot.
    pub epoch: AtomicU64,
    /// Interrupt/adaptive mode: times it slept, TSC cycles asleep, and wake-ups by a guest
    /// kick (the rest were timeouts or control-plane doorbells).
    pub sleeps: AtomicU64,
    pub sleep_cycles: AtomicU64,
    pub kick_wakeups: AtomicU64,
    /// Load-based sleeps (`pmd-sleep-max-us`): short sleeps while lightly loaded; their
    /// cycles are in `sleep_cycles` too.
    pub load_sleeps: AtomicU64,
    /// Polls of quiet rx queues skipped while busy (`quiet.rs`), and the longest time
    /// (TSC cycles) between two polls of them while busy; `quiet_gap_clear` asks the PMD to
    /// start that maximum again.
    pub quiet_skips: AtomicU64,
    pub quiet_gap_max: AtomicU64,
    /// Sweeps of a busy PMD by their gap ([`crate::quiet::gap_bucket`]).
    pub quiet_gaps: [AtomicU64; crate::quiet::GAP_BUCKETS],
    pub quiet_gap_clear: AtomicBool,
    /// Why the configured thread priority could not be applied (empty: applied or none).
    pub priority_error: std::sync::OnceLock<String>,
    /// The flow path's cache levels.
    pub flow: FlowStats,
}

/// The flow path's counters of one PMD, as published.
#[derive(Debug, Default)]
pub struct FlowStats {
    pub packets: AtomicU64,
    pub emc_hits: AtomicU64,
    pub megaflow_hits: AtomicU64,
    pub upcalls: AtomicU64,
    pub emc_inserts: AtomicU64,
    pub emc_skipped: AtomicU64,
    pub recirculations: AtomicU64,
}

impl FlowStats {
    fn publish(&self, c: &crate::flow::FlowCounters) {
        self.packets.store(c.packets, Ordering::Relaxed);
        self.emc_hits.store(c.emc_hits, Ordering::Relaxed);
        self.megaflow_hits.store(c.megaflow_hits, Ordering::Relaxed);
        self.upcalls.store(c.upcalls, Ordering::Relaxed);
        self.emc_inserts.store(c.emc_inserts, Ordering::Relaxed);
        self.emc_skipped.store(c.emc_skipped, Ordering::Relaxed);
        self.recirculations
            .store(c.recirculations, Ordering::Relaxed);
    }

    pub fn load(&self) -> crate::flow::FlowCounters {
        crate::flow::FlowCounters {
            packets: self.packets.load(Ordering::Relaxed),
            emc_hits: self.emc_hits.load(Ordering::Relaxed),
            megaflow_hits: self.megaflow_hits.load(Ordering::Relaxed),
            upcalls: self.upcalls.load(Ordering::Relaxed),
            emc_inserts: self.emc_inserts.load(Ordering::Relaxed),
            emc_skipped: self.emc_skipped.load(Ordering::Relaxed),
            recirculations: self.recirculations.load(Ordering::Relaxed),
        }
    }
}

/// A running PMD.
#[derive(Debug)]
pub struct PmdHandle {
    pub stats: Arc<PmdStats>,
    stop: Arc<AtomicBool>,
    /// Rung by the control plane so that a sleeping PMD looks at its work again.
    doorbell: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl PmdHandle {
    /// Starts PMD `index`, pinned to `core` if given. `clock` is seconds, ticked by the
    /// control plane (MAC aging).
    pub fn spawn(
        index: usize,
        core: Option<usize>,
        priority: Option<os::ThreadPriority>,
        dp: Arc<Datapath>,
        clock: Arc<AtomicU32>,
    ) -> std::io::Result<PmdHandle> {
        let stats = Arc::new(PmdStats {
            index,
            core,
            ..Default::default()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let doorbell = Arc::new(os::eventfd()?);
        let bell = doorbell.clone();
        let pool = Pool::with_large(POOL_BUFFERS, POOL_LARGE_BUFFERS)?;
        stats.hugepages.store(pool.hugepages(), Ordering::Relaxed);
        let (s, st) = (stats.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("pmd{index}"))
            // Upcalls translate on this thread: a translation recurses once per nested
            // resubmit (OVN's pipelines nest some 130 deep; the bound is 512).
            .stack_size(PMD_STACK)
            .spawn(move || {
                if let Some(c) = core {
                    if let Err(e) = os::set_affinity(&[c]) {
                        log::warn!("pmd{index}: cannot pin to core {c}: {e}");
                    }
                }
                if let Some(p) = priority {
                    if let Err(e) = os::set_thread_priority(p) {
                        log::warn!("pmd{index}: cannot set priority {p:?}: {e}");
                        let _ = s.priority_error.set(format!("{p:?}: {e}"));
                    }
                }
                // Short sleeps (load-based, coalescing timers) end when asked, not up to
                // 50 us later.
                let _ = os::set_timer_slack_ns(1000);
                run(index, &pool, &dp, &clock, &s, &st, &bell);
            })?;
        Ok(PmdHandle {
            stats,
            stop,
            doorbell,
            thread: Some(thread),
        })
    }

    /// Wakes a parked or sleeping PMD (standby, nothing assigned, interrupt mode): it looks
    /// at the published snapshot and its queues again.
    pub fn wake(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        let _ = os::notify(self.doorbell.as_fd());
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = os::notify(self.doorbell.as_fd());
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for PmdHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    index: usize,
    pool: &Pool,
    dp: &Datapath,
    clock: &AtomicU32,
    stats: &PmdStats,
    stop: &AtomicBool,
    doorbell: &OwnedFd,
) {
    let hz = os::tsc_hz().max(1);
    let mut idle_since = os::rdtsc();
    let (mut sleeps, mut sleep_cycles, mut kick_wakeups) = (0u64, 0u64, 0u64);
    let (mut load_sleeps, mut load_sleep_ns) = (0u64, 0u64);
    let mut worker = Worker::new(index, pool);
    let (mut busy, mut idle, mut iters, mut rx, mut tx, mut drops) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut last = os::rdtsc();
    // TSC of the last loaded iteration (an rx queue gave half a burst or more): adaptive mode
    // holds off sleeping for longer after one (`IdleGate`).
    let mut loaded_at = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if dp.standby() {
            worker.timers.flush_all();
            stats.epoch.store(iters, Ordering::Release);
            std::thread::park_timeout(std::time::Duration::from_millis(50));
            last = os::rdtsc();
            continue;
        }
        let snap = dp.guard();
        let now = clock.load(Ordering::Relaxed);
        worker.fx.emc.set_insert_inv_prob(dp.emc_insert_inv_prob());
        let mine: &[RxqRef] = snap
            .pmd_rxqs
            .get(index)
            .map(|v| v.as_slice())
            .unwrap_or(&[]);
        worker.quiet.configure(dp.quiet_rxq_poll_ns(), hz);
        let mut it = worker.poll_at(&snap, mine, now, os::rdtsc());
        it.tx += worker.packet_outs(&snap, dp.packet_out(), now);
        // Loaded: an rx queue gave half a burst or more. Both the adaptive hold and the
        // load-based sleep go by it.
        let (moved, loaded) = (it.rx, it.max_batch >= (BURST / 2) as u64);
        worker.quiet.end(moved > 0);
        rx += it.rx;
        tx += it.tx;
        drops += it.dropped;
        let assigned = mine.len();
        drop(snap);
        let t = os::rdtsc();
        if assigned == 0 {
            // Frozen (hot upgrade) or nothing left to poll: no timer will run for these.
            worker.timers.flush_all();
        } else {
            worker.timers.run(t);
        }
        if moved > 0 {
            busy += t.wrapping_sub(last);
        } else {
            idle += t.wrapping_sub(last);
        }
        last = t;
        if loaded {
            loaded_at = t;
        }
        if moved > 0 {
            idle_since = t;
        } else if assigned > 0 {
            let (mode, after_ns) = dp.rx_mode();
            let gate = match mode {
                RxMode::Poll => None,
                RxMode::Interrupt => Some(IdleGate::INTERRUPT),
                RxMode::Adaptive => Some(IdleGate::adaptive(after_ns, hz)),
            };
            if gate.is_some_and(|g| g.may_sleep(t, idle_since, loaded_at)) {
                if let Some(why) = sleep(dp, index, doorbell, timeout_ns(&worker.timers, t, hz)) {
                    let w = os::rdtsc();
                    sleeps += 1;
                    sleep_cycles += w.wrapping_sub(t);
                    kick_wakeups += (why == Wake::Kick) as u64;
                    stats.sleeps.store(sleeps, Ordering::Relaxed);
                    stats.sleep_cycles.store(sleep_cycles, Ordering::Relaxed);
                    stats.kick_wakeups.store(kick_wakeups, Ordering::Relaxed);
                    last = w;
                    if why != Wake::Timeout {
                        // Work is likely: poll for a while before sleeping again. After a
                        // timeout, one empty poll and back to sleep.
                        idle_since = w;
                    }
                }
            }
        }
        // Load-based sleep (OVS pmd-maxsleep): while no queue fills half a burst, sleep a
        // little longer each iteration, up to the maximum; a fuller burst polls flat out again.
        let sleep_max_ns = dp.sleep_max_ns();
        if sleep_max_ns == 0 || loaded || assigned == 0 || dp.rx_mode().0 == RxMode::Interrupt {
            load_sleep_ns = 0;
        } else {
            if load_sleep_ns > 0 {
                let ns = load_sleep_ns.min(timeout_ns(&worker.timers, last, hz));
                let _ = os::poll_readable_ns(&[doorbell.as_fd()], ns);
                let w = os::rdtsc();
                sleep_cycles += w.wrapping_sub(last);
                load_sleeps += 1;
                stats.sleep_cycles.store(sleep_cycles, Ordering::Relaxed);
                stats.load_sleeps.store(load_sleeps, Ordering::Relaxed);
                last = w;
            }
            load_sleep_ns = (load_sleep_ns + LOAD_SLEEP_STEP_NS).min(sleep_max_ns);
        }
        iters += 1;
        stats.epoch.store(iters, Ordering::Release);
        if iters & 0xff == 0 || moved == 0 {
            stats.iterations.store(iters, Ordering::Relaxed);
            stats.busy_cycles.store(busy, Ordering::Relaxed);
            stats.idle_cycles.store(idle, Ordering::Relaxed);
            stats.rx_packets.store(rx, Ordering::Relaxed);
            stats.tx_packets.store(tx, Ordering::Relaxed);
            stats.drops.store(drops, Ordering::Relaxed);
            stats.rxqs.store(assigned as u64, Ordering::Relaxed);
            stats
                .quiet_skips
                .store(worker.quiet.skipped, Ordering::Relaxed);
            if stats.quiet_gap_clear.swap(false, Ordering::Relaxed) {
                worker.quiet.clear_gaps();
            }
            for (a, n) in stats.quiet_gaps.iter().zip(worker.quiet.gaps) {
                a.store(n, Ordering::Relaxed);
            }
            stats
                .quiet_gap_max
                .store(worker.quiet.gap_max, Ordering::Relaxed);
            stats.flow.publish(&worker.fx.counters);
        }
        if assigned == 0 {
            // Nothing assigned: don't spin a core for nothing (a new snapshot or a freeze
            // wakes us at once: see `PmdHandle::wake`).
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
    worker.timers.flush_all();
}

/// When an idle PMD may go to sleep (interrupt and adaptive mode).
///
/// Adaptive mode sleeps after `after` TSC cycles without a packet, but after a loaded
/// iteration (an rx queue gave half a burst or more) it waits [`LOADED_HOLD_FACTOR`] times as
/// long, counted from that iteration. A PMD under load meets gaps longer than the idle
/// threshold: a frontend that frees a ring's worth of transmitted buffers at once, or whose
/// vCPU the host preempts. Sleeping in such a gap costs more than it saves: the frontend's
/// next kick is a syscall that wakes our thread (0.1-0.5 ms each on this VM host, seen under
/// strace), our vCPU halts and comes back cold, and a closed loop waits on both. Measured
/// 2026-11-29 with DPDK testpmd's virtio-user frontend (2 ports, 64 B, split rings): the
/// adaptive PMD slept 26-37 times in 4 s of traffic, each sleep ended by a kick, and in 4
/// interleaved rounds made 0.45-1.01x the rate of the same build in poll mode
/// (docs/pmd.md). A PMD whose queues never fill half a burst (guests sending now and then)
/// sleeps after the idle threshold as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IdleGate {
    /// Idle TSC cycles before sleeping, lightly loaded.
    after: u64,
    /// Cycles since the last loaded iteration before sleeping.
    after_loaded: u64,
}

/// How many idle thresholds an adaptive PMD keeps polling after a loaded iteration (with the
/// default 300 us: 9.6 ms).
const LOADED_HOLD_FACTOR: u64 = 32;

impl IdleGate {
    /// Interrupt mode: sleep after every empty poll, loaded or not.
    const INTERRUPT: IdleGate = IdleGate {
        after: 0,
        after_loaded: 0,
    };

    /// Adaptive mode with an idle threshold of `after_ns`, TSC at `hz`.
    fn adaptive(after_ns: u64, hz: u64) -> IdleGate {
        // Built on every idle poll: one u64 division, as before the hold. The product
        // saturates past about 7 s at 2.6 GHz; `pmd-sleep-after-us` stops at 1 s.
        let after = after_ns.saturating_mul(hz) / 1_000_000_000;
        IdleGate {
            after,
            after_loaded: after.saturating_mul(LOADED_HOLD_FACTOR),
        }
    }

    /// Whether a PMD idle since TSC `idle_since`, last loaded at `loaded_at` (0: never), may
    /// sleep at `now`.
    #[inline]
    fn may_sleep(&self, now: u64, idle_since: u64, loaded_at: u64) -> bool {
        now.wrapping_sub(idle_since) >= self.after
            && (loaded_at == 0 || now.wrapping_sub(loaded_at) >= self.after_loaded)
    }
}

/// Load-based sleep grows by this much per lightly loaded iteration (OVS: 1 us).
const LOAD_SLEEP_STEP_NS: u64 = 1000;

/// How long a PMD may sleep from TSC `now`: the safety net, or less when a deferred guest
/// notification falls due sooner.
fn timeout_ns(timers: &NotifyTimers, now: u64, hz: u64) -> u64 {
    let max = MAX_SLEEP_MS as u64 * 1_000_000;
    match timers.earliest() {
        u64::MAX => max,
        t => (t.saturating_sub(now) as u128 * 1_000_000_000 / hz as u128).min(max as u128) as u64,
    }
}

/// Longest sleep (a safety net: the control plane rings the doorbell on every snapshot,
/// freeze and handled vhost-user message, so new queues are seen at once).
const MAX_SLEEP_MS: u32 = 100;

/// Interrupt mode: asks the guest of every rx queue of this PMD to kick, re-checks every ring
/// (the race: a buffer made available just before the guest saw our request is never kicked,
/// so it must be seen here), then sleeps on the kick eventfds and the doorbell. Returns None
/// when it could not sleep (work pending, a queue busy or without kick fd), else what woke
/// it. Off the packet path: it may allocate.
#[cold]
fn sleep(dp: &Datapath, index: usize, doorbell: &OwnedFd, timeout_ns: u64) -> Option<Wake> {
    let snap = dp.guard();
    let mine = snap.pmd_rxqs.get(index)?;
    let mut armed: Vec<Arc<ferrovs_vhost::device::Queue>> = Vec::with_capacity(mine.len());
    let mut kicks: Vec<OwnedFd> = Vec::with_capacity(mine.len());
    // Kernel ports' fds: polled, never read here (reading would take a frame).
    let mut kernel: Vec<OwnedFd> = Vec::new();
    let disarm = |armed: &[Arc<ferrovs_vhost::device::Queue>]| {
        for q in armed {
            q.lock().disable_kicks();
        }
    };
    for rxq in mine {
        let Some(port) = snap.port(rxq.port) else {
            continue;
        };
        let queues = match &port.io {
            PortIo::Vhost { queues } => queues,
            // Kernel ports: their fd is readable (level-triggered) while frames wait, so
            // there is no race to close; sleep on it too. A port without one (or an fd that
            // cannot be cloned) keeps the PMD polling.
            io => {
                let fd = io.kernel().and_then(|k| k.wait_fd());
                match fd.map(|fd| fd.try_clone_to_owned()) {
                    Some(Ok(fd)) => kernel.push(fd),
                    _ => {
                        disarm(&armed);
                        return None;
                    }
                }
                continue;
            }
        };
        let Some(q) = queues.get(2 * rxq.pair as usize + 1) else {
            continue;
        };
        if !q.ready.load(Ordering::Acquire) {
            continue;
        }
        let Some(vq) = q.try_lock() else {
            disarm(&armed);
            return None;
        };
        // A frontend that polls (no kick fd) cannot wake us: keep polling.
        let Some(k) = vq.kick().and_then(|k| k.try_clone_to_owned().ok()) else {
            drop(vq);
            disarm(&armed);
            return None;
        };
        vq.enable_kicks();
        drop(vq);
        kicks.push(k);
        armed.push(q.clone());
    }
    drop(snap);
    vring::fence();
    if armed.iter().any(|q| q.lock().has_pending()) {
        disarm(&armed);
        return None;
    }
    let mut fds: Vec<BorrowedFd<'_>> = kicks.iter().chain(&kernel).map(|k| k.as_fd()).collect();
    fds.push(doorbell.as_fd());
    let ready = os::poll_readable_ns(&fds, timeout_ns).unwrap_or(0);
    let mut kicked = false;
    for k in &kicks {
        kicked |= os::drain(k.as_fd()).is_ok_and(|n| n > 0);
    }
    let rung = os::drain(doorbell.as_fd()).is_ok_and(|n| n > 0);
    disarm(&armed);
    Some(match (kicked, rung, ready) {
        (true, _, _) => Wake::Kick,
        (_, true, _) => Wake::Doorbell,
        // A kernel port has frames.
        (_, _, 1..) => Wake::Kick,
        _ => Wake::Timeout,
    })
}

/// What ended a sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    Kick,
    Doorbell,
    Timeout,
}

/// What one PMD iteration moved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Iteration {
    /// Packets received, transmitted and dropped.
    pub rx: u64,
    pub tx: u64,
    pub dropped: u64,
    /// The largest burst one rx queue gave.
    pub max_batch: u64,
}

/// The state a PMD thread carries from burst to burst, allocated once: its pool, the burst
/// scratch, the flow path's caches and the deferred guest notifications.
pub(crate) struct Worker<'p> {
    pub index: usize,
    pub pool: &'p Pool,
    pub sc: Scratch<'p>,
    pub timers: NotifyTimers,
    pub fx: FlowCtx,
    /// Packet-outs taken from the queue, executed this iteration.
    pouts: Vec<crate::packet_io::PacketOut>,
    /// What the last full poll of each idle rx queue saw (`idle_probe.rs`).
    probes: crate::idle_probe::IdleProbes,
    /// Which rx queues are quiet, polled at an interval while busy (`quiet.rs`).
    pub(crate) quiet: crate::quiet::QuietQueues,
}

impl<'p> Worker<'p> {
    pub(crate) fn new(index: usize, pool: &'p Pool) -> Worker<'p> {
        Worker {
            index,
            pool,
            sc: Scratch::new(),
            timers: NotifyTimers::default(),
            fx: FlowCtx::default(),
            pouts: Vec::with_capacity(crate::packet_io::PacketOutQueue::BATCH),
            probes: Default::default(),
            quiet: Default::default(),
        }
    }

    /// Polls every rx queue of `rxqs` once (one PMD iteration's packet work). A queue that
    /// gave packets is charged the cycles since the last one that did ([`crate::rxq`]).
    #[cfg(test)]
    pub(crate) fn poll(&mut self, snap: &Snapshot, rxqs: &[RxqRef], now: u32) -> Iteration {
        self.poll_at(snap, rxqs, now, os::rdtsc())
    }

    /// [`Self::poll`] for an iteration that started at TSC `tsc`: quiet queues
    /// (`quiet.rs`) are skipped unless this iteration is a sweep.
    #[inline]
    pub(crate) fn poll_at(
        &mut self,
        snap: &Snapshot,
        rxqs: &[RxqRef],
        now: u32,
        tsc: u64,
    ) -> Iteration {
        let mut it = Iteration::default();
        self.probes.start(rxqs.len());
        self.quiet.start(rxqs, tsc);
        let sweep = self.quiet.sweeping();
        let mut mark = tsc;
        let mut k = 0;
        loop {
            // A sweep polls every queue; between sweeps, only those not quiet at the last.
            let i = if sweep {
                k
            } else {
                match self.quiet.hot(k, rxqs.len()) {
                    Some(i) => i,
                    None => break,
                }
            };
            k += 1;
            let Some(rxq) = rxqs.get(i) else {
                break;
            };
            let (r, t, d) = self.poll_rxq(snap, i, *rxq, now);
            self.quiet.polled(i, *rxq, r > 0, tsc);
            if r > 0 {
                let t = os::rdtsc();
                if let Some(p) = snap.port(rxq.port) {
                    p.rxq_load.charge(rxq.pair, t.wrapping_sub(mark));
                }
                mark = t;
            }
            it.rx += r;
            it.max_batch = it.max_batch.max(r);
            it.tx += t;
            it.dropped += d;
        }
        it
    }

    /// Executes the packet-outs waiting in `q` (at most a batch of them), each as if its input
    /// port had received it: with its own actions, or through the bridge's tables (or the
    /// learning bridge when the bridge has only the default rule). Returns the packets
    /// transmitted.
    pub(crate) fn packet_outs(
        &mut self,
        snap: &Snapshot,
        q: &crate::packet_io::PacketOutQueue,
        now: u32,
    ) -> u64 {
        q.take_into(&mut self.pouts);
        if self.pouts.is_empty() {
            return 0;
        }
        let mut list = std::mem::take(&mut self.pouts);
        let mut sent = 0;
        for po in &list {
            let Some(bridge) = snap.bridge(po.bridge) else {
                continue;
            };
            let Some(mut m) = self.pool.alloc_for(po.data.len()) else {
                po.inp.rx_drops.drop(DropReason::NoMbuf, 1);
                continue;
            };
            let Some(b) = m.fill(po.data.len()) else {
                continue;
            };
            b.copy_from_slice(&po.data);
            self.sc.batch.push(m);
            let b = Burst {
                snap,
                bridge,
                inp: &po.inp,
                pool: self.pool,
                now,
            };
            match (&po.actions, &bridge.flows) {
                (crate::packet_io::PacketOutActions::Table, Some(bf)) => {
                    crate::flow::input::process(&b, bf, &mut self.sc, &mut self.fx);
                }
                (crate::packet_io::PacketOutActions::Table, None) => {
                    plain_l2(&b, &mut self.sc);
                }
                (crate::packet_io::PacketOutActions::Actions(a), _) => {
                    crate::flow::input::execute_actions(&b, &mut self.sc, &mut self.fx, 0, a);
                }
            }
            sent += self.sc.flush(snap, self.index, &mut self.timers).0;
        }
        q.executed(list.len() as u64);
        list.clear();
        self.pouts = list;
        sent
    }

    /// Polls one rx queue (position `i` of this PMD's list); returns (received,
    /// transmitted, dropped).
    #[inline]
    fn poll_rxq(&mut self, snap: &Snapshot, i: usize, rxq: RxqRef, now: u32) -> (u64, u64, u64) {
        let Some(inp) = snap.port(rxq.port) else {
            return (0, 0, 0);
        };
        if self.probes.still_empty(i, inp, rxq) {
            return (0, 0, 0);
        }
        let sc = &mut self.sc;
        inp.rx_burst_tunnel(
            rxq.pair,
            self.pool,
            &mut sc.batch,
            Some(&mut sc.rx_tun),
            &mut self.timers,
        );
        let n = sc.batch.len();
        if n == 0 {
            self.probes.learn(i, inp, rxq);
            return (0, 0, 0);
        }
        let Some(bridge) = snap.bridge(inp.bridge) else {
            inp.rx_drops.drop(DropReason::NoRoute, n as u64);
            sc.batch.clear();
            sc.rx_tun.clear();
            return (n as u64, 0, n as u64);
        };
        let b = Burst {
            snap,
            bridge,
            inp,
            pool: self.pool,
            now,
        };
        let mut dropped = if let Some(bf) = &bridge.flows {
            crate::flow::input::process(&b, bf, sc, &mut self.fx)
        } else {
            if let Some(r) = &bridge.default_rule {
                let bytes: usize = sc.batch.iter().map(|m| m.len()).sum();
                r.packets.fetch_add(n as u64, Ordering::Relaxed);
                r.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                if r.used.load(Ordering::Relaxed) != u64::from(now) {
                    r.used.store(u64::from(now), Ordering::Relaxed);
                }
            }
            plain_l2(&b, sc)
        };
        let (sent, d) = sc.flush(snap, self.index, &mut self.timers);
        dropped += d;
        (n as u64, sent, dropped)
    }
}

/// The default pipeline (NORMAL only): the learning-bridge decision per packet, no flow key.
#[inline]
fn plain_l2<'p>(b: &Burst<'_, 'p>, sc: &mut Scratch<'p>) -> u64 {
    let Burst {
        snap,
        bridge,
        inp,
        pool,
        now,
    } = *b;
    let mut dropped = 0u64;
    // The decision of the last frame, by its header: a run of frames with one header (one
    // flow, the common case in a burst) is decided once.
    let mut last: Option<([u64; 2], l2::Classified)> = None;
    // The run's output list, when its first frame went to one port as it is: the rest of
    // the run joins that list.
    let mut run_slot: Option<usize> = None;
    for i in 0..sc.batch.len() {
        let frame = sc.batch[i].data();
        let c = match l2::header_key(frame) {
            Some(k) => match last {
                Some((lk, lc)) if lk == k => {
                    if run_slot.is_some_and(|s| sc.join(s, i)) {
                        continue;
                    }
                    lc
                }
                _ => {
                    let c = l2::decide(snap, bridge, inp, frame, now);
                    last = Some((k, c));
                    run_slot = None;
                    c
                }
            },
            None => {
                run_slot = None;
                l2::decide(snap, bridge, inp, frame, now)
            }
        };
        match c.decision {
            Decision::Drop(r) => {
                inp.rx_drops.drop(r, 1);
                dropped += 1;
            }
            Decision::Unicast(p) => {
                if let Some(out) = snap.port(p) {
                    if run_slot.is_none() {
                        run_slot = add_output_run(sc, pool, i, &c, inp, out);
                    } else {
                        add_output(sc, pool, i, &c, inp, out);
                    }
                }
            }
            Decision::Flood => {
                for &p in &bridge.ports {
                    if p == inp.id {
                        continue;
                    }
                    if let Some(out) = snap.port(p) {
                        if out.vlan.carries(c.vlan) {
                            add_output(sc, pool, i, &c, inp, out);
                        }
                    }
                }
            }
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::VlanMode;
    use crate::testutil::{dummy, frame, l2_switch, mac, vlan_of, BCAST};

    #[test]
    fn adaptive_pmd_sleeps_after_the_idle_threshold_or_longer_after_load() {
        // A 1 GHz TSC: one cycle a nanosecond.
        let g = IdleGate::adaptive(300_000, 1_000_000_000);
        assert_eq!((g.after, g.after_loaded), (300_000, 9_600_000));
        let t0 = 1_000_000_000u64;
        // Never loaded: the idle threshold alone.
        assert!(!g.may_sleep(t0 + 299_999, t0, 0));
        assert!(g.may_sleep(t0 + 300_000, t0, 0));
        // Loaded when the idle spell began: 9.6 ms from then, however long the spell.
        assert!(!g.may_sleep(t0 + 300_000, t0, t0));
        assert!(!g.may_sleep(t0 + 9_599_999, t0, t0));
        assert!(g.may_sleep(t0 + 9_600_000, t0, t0));
        // Loaded long before a lightly loaded stretch: the idle threshold again.
        assert!(g.may_sleep(t0 + 300_000, t0, t0 - 9_300_000));
        assert!(!g.may_sleep(t0 + 300_000, t0, t0 - 9_299_999));
        // Interrupt mode: every empty poll, loaded or not.
        assert!(IdleGate::INTERRUPT.may_sleep(t0, t0, t0));
        // The TSC wraps: differences, not comparisons.
        let near = u64::MAX - 100;
        assert!(!g.may_sleep(near.wrapping_add(200), near, near));
        assert!(g.may_sleep(near.wrapping_add(9_600_000), near, near));
    }

    /// One PMD iteration over every port's queue of `snap`.
    fn iterate(w: &mut Worker<'_>, snap: &Snapshot) -> Iteration {
        w.poll(snap, &snap.pmd_rxqs[0], 10)
    }

    #[test]
    fn an_iteration_floods_learns_and_then_unicasts() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk, VlanMode::Trunk]);
        let a = frame(mac(2), mac(1), None, 1);
        dummy(&snap, 0).push_rx(&a);
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.dropped, it.max_batch), (1, 2, 0, 1));
        assert_eq!(dummy(&snap, 0).take_sent(), Vec::<Vec<u8>>::new());
        assert_eq!(dummy(&snap, 1).take_sent(), vec![a.clone()]);
        assert_eq!(dummy(&snap, 2).take_sent(), vec![a]);
        // The reply: mac(1) was learned on port 0.
        let b = frame(mac(1), mac(2), None, 2);
        dummy(&snap, 1).push_rx(&b);
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx), (1, 1));
        assert_eq!(dummy(&snap, 0).take_sent(), vec![b]);
        assert!(dummy(&snap, 2).take_sent().is_empty());
        // Counted on both sides; every buffer back in the pool.
        let p0 = snap.port(0).unwrap();
        assert_eq!((p0.rx_stats().packets, p0.tx_stats().packets), (1, 1));
        assert_eq!(pool.available(), 256);
    }

    /// A burst decides once per run of frames with one header: the run is forwarded as its
    /// first frame, and the next header is decided afresh, with what the run learned.
    #[test]
    fn a_burst_decides_runs_of_one_header_once_and_others_afresh() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk, VlanMode::Trunk]);
        let f1 = frame(mac(2), mac(1), None, 1);
        let f2 = frame(mac(2), mac(1), None, 2);
        // To mac(1), learned on port 0 by f1: back to its own port, dropped.
        let f3 = frame(mac(1), mac(9), None, 3);
        let f4 = frame(mac(2), mac(1), None, 4);
        let f5 = frame(mac(2), mac(1), Some(7), 5);
        for f in [&f1, &f2, &f3, &f4, &f5] {
            dummy(&snap, 0).push_rx(f);
        }
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.dropped), (5, 8, 1));
        for p in [1, 2] {
            let got = dummy(&snap, p).take_sent();
            assert_eq!(got.len(), 4, "port {p}");
            assert_eq!(&got[..3], &[f1.clone(), f2.clone(), f4.clone()], "port {p}");
            assert_eq!(vlan_of(&got[3]), Some(7));
        }
        assert!(dummy(&snap, 0).take_sent().is_empty());
        assert_eq!(pool.available(), 256);
    }

    /// A run of frames unicast to one port as they are joins that port's list after its
    /// first frame; a run that needs a VLAN edit takes every frame through the edit; runs
    /// that come back later in the burst keep the order of every port's frames.
    #[test]
    fn unicast_runs_join_their_output_in_order_and_edits_stay_per_frame() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        let snap = l2_switch(&[VlanMode::Access(10), VlanMode::Trunk, VlanMode::Access(10)]);
        // Learn mac(1) on the trunk (VLAN 10) and mac(3) on access port 2.
        dummy(&snap, 1).push_rx(&frame(BCAST, mac(1), Some(10), 1));
        iterate(&mut w, &snap);
        dummy(&snap, 2).push_rx(&frame(BCAST, mac(3), None, 2));
        iterate(&mut w, &snap);
        for p in 0..3 {
            dummy(&snap, p).take_sent();
        }
        let to3: Vec<_> = (10..14).map(|s| frame(mac(3), mac(2), None, s)).collect();
        let to1: Vec<_> = (20..22).map(|s| frame(mac(1), mac(2), None, s)).collect();
        for f in [&to3[0], &to3[1], &to1[0], &to1[1], &to3[2], &to3[3]] {
            dummy(&snap, 0).push_rx(f);
        }
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.dropped), (6, 6, 0));
        assert_eq!(dummy(&snap, 2).take_sent(), to3);
        let trunk = dummy(&snap, 1).take_sent();
        let tagged: Vec<_> = (20..22)
            .map(|s| frame(mac(1), mac(2), Some(10), s))
            .collect();
        assert_eq!(trunk, tagged);
        assert!(dummy(&snap, 0).take_sent().is_empty());
        assert_eq!(pool.available(), 256);
    }

    #[test]
    fn vlans_are_pushed_to_trunks_popped_to_access_ports_and_kept_apart() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        let snap = l2_switch(&[
            VlanMode::Access(10),
            VlanMode::Trunk,
            VlanMode::Access(20),
            VlanMode::TrunkOf(vec![20]),
        ]);
        // Untagged on access port 10: tagged 10 on the trunk only.
        dummy(&snap, 0).push_rx(&frame(BCAST, mac(1), None, 1));
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx), (1, 1));
        let got = dummy(&snap, 1).take_sent();
        assert_eq!(got.len(), 1);
        assert_eq!(vlan_of(&got[0]), Some(10));
        assert_eq!(got[0].len(), 68);
        assert!(dummy(&snap, 2).take_sent().is_empty());
        assert!(dummy(&snap, 3).take_sent().is_empty());
        // Tagged 20 from the trunk: untagged to access port 20, still tagged to trunk-of-20.
        let f = frame(BCAST, mac(2), Some(20), 2);
        dummy(&snap, 1).push_rx(&f);
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx), (1, 2));
        assert_eq!(
            dummy(&snap, 2).take_sent(),
            vec![frame(BCAST, mac(2), None, 2)]
        );
        assert_eq!(dummy(&snap, 3).take_sent(), vec![f]);
        assert!(dummy(&snap, 0).take_sent().is_empty());
        assert_eq!(pool.available(), 256);
    }

    #[test]
    fn a_burst_leaves_as_one_transmit_per_port_in_order() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk, VlanMode::Trunk]);
        // Learn mac(2) on port 1.
        dummy(&snap, 1).push_rx(&frame(BCAST, mac(2), None, 0));
        iterate(&mut w, &snap);
        dummy(&snap, 0).take_sent();
        dummy(&snap, 2).take_sent();
        let (b0, b2) = (dummy(&snap, 0).tx_bursts(), dummy(&snap, 2).tx_bursts());
        let frames: Vec<_> = (0..40).map(|i| frame(mac(2), mac(1), None, i)).collect();
        for f in &frames {
            dummy(&snap, 0).push_rx(f);
        }
        let before = dummy(&snap, 1).tx_bursts();
        // A burst is at most BURST packets: 32, then the remaining 8.
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.max_batch), (32, 32, 32));
        assert_eq!(dummy(&snap, 1).tx_bursts(), before + 1);
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx), (8, 8));
        assert_eq!(dummy(&snap, 1).tx_bursts(), before + 2);
        assert_eq!(dummy(&snap, 1).take_sent(), frames);
        // Nothing to the other ports, not even an empty burst.
        assert_eq!(dummy(&snap, 0).tx_bursts(), b0);
        assert_eq!(dummy(&snap, 2).tx_bursts(), b2);
        // A flood of a burst: one transmit per other port.
        for i in 0..32 {
            dummy(&snap, 0).push_rx(&frame(BCAST, mac(1), None, i));
        }
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx), (32, 64));
        assert_eq!(dummy(&snap, 1).tx_bursts(), before + 3);
        assert_eq!(dummy(&snap, 2).tx_bursts(), b2 + 1);
        assert_eq!(pool.available(), 256);
    }

    #[test]
    fn drops_are_counted_by_reason_where_they_happen() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        let snap = l2_switch(&[VlanMode::Access(10), VlanMode::Trunk, VlanMode::Trunk]);
        let (p0, p1, p2) = (
            snap.port(0).unwrap(),
            snap.port(1).unwrap(),
            snap.port(2).unwrap(),
        );
        // A runt never reaches the switch: the port's receive side counts it.
        dummy(&snap, 0).push_rx(&[0u8; 10]);
        // A tagged frame on an access port: the switch drops it (vlan_mismatch).
        dummy(&snap, 0).push_rx(&frame(BCAST, mac(1), Some(10), 0));
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.dropped), (1, 0, 1));
        let rx0 = p0.rx_stats();
        assert_eq!(rx0.drops[DropReason::Runt as usize], 1);
        assert_eq!(rx0.drops[DropReason::Vlan as usize], 1);
        assert_eq!(rx0.total_drops(), 2);
        // Output failures are counted on the output port: link down, queue full.
        dummy(&snap, 1).set_link(false);
        dummy(&snap, 2).set_tx_room(Some(1));
        for i in 0..3 {
            dummy(&snap, 0).push_rx(&frame(BCAST, mac(1), None, i));
        }
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.dropped), (3, 1, 5));
        assert_eq!(p1.tx_stats().drops[DropReason::KernelLinkDown as usize], 3);
        let tx2 = p2.tx_stats();
        assert_eq!(tx2.drops[DropReason::KernelTxFull as usize], 2);
        assert_eq!(tx2.packets, 1);
        assert_eq!(dummy(&snap, 2).take_sent().len(), 1);
        assert_eq!(pool.available(), 256);
    }

    #[test]
    fn a_port_without_its_bridge_drops_as_no_route() {
        let pool = Pool::new(64).unwrap();
        let mut w = Worker::new(0, &pool);
        let mut snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk]);
        snap.bridges[0] = None;
        dummy(&snap, 0).push_rx(&frame(BCAST, mac(1), None, 0));
        let it = iterate(&mut w, &snap);
        assert_eq!((it.rx, it.tx, it.dropped), (1, 0, 1));
        let rx = snap.port(0).unwrap().rx_stats();
        assert_eq!(rx.drops[DropReason::NoRoute as usize], 1);
        assert!(dummy(&snap, 1).take_sent().is_empty());
        assert_eq!(pool.available(), 64);
    }

    #[test]
    fn a_quiet_queue_of_a_busy_pmd_is_served_at_the_next_sweep_and_then_every_iteration() {
        let pool = Pool::new(256).unwrap();
        let mut w = Worker::new(0, &pool);
        // 1 TSC cycle = 1 ns; sweeps every 20 us while busy.
        w.quiet.configure(20_000, 1_000_000_000);
        let snap = l2_switch(&[VlanMode::Trunk, VlanMode::Trunk, VlanMode::Trunk]);
        let rxqs = snap.pmd_rxqs[0].clone();
        // Iterations every 5 us; port 0 always busy, ports 1 and 2 silent for 2 ms.
        let mut t = 1_000u64;
        let step = |w: &mut Worker<'_>, t: &mut u64| {
            dummy(&snap, 0).push_rx(&frame(mac(9), mac(1), None, 0));
            let it = w.poll_at(&snap, &rxqs, 10, *t);
            w.quiet.end(it.rx > 0);
            *t += 5_000;
            it
        };
        while t < 2_000_000 {
            step(&mut w, &mut t);
        }
        assert!(w.quiet.skipped > 0, "ports 1 and 2 are quiet by now");
        // A frame arrives on quiet port 2: served within four iterations (20 us), not later.
        let f = frame(BCAST, mac(2), None, 7);
        dummy(&snap, 2).push_rx(&f);
        let mut waited = 0;
        loop {
            let it = step(&mut w, &mut t);
            if it.rx == 2 {
                break;
            }
            assert_eq!(it.rx, 1, "only port 0 until the sweep");
            waited += 1;
            assert!(waited < 4, "a quiet queue waited {waited} iterations");
        }
        // Port 2 is busy again: its next frames go out in the iteration they arrive.
        for k in 0..10 {
            dummy(&snap, 2).push_rx(&frame(BCAST, mac(2), None, k));
            assert_eq!(step(&mut w, &mut t).rx, 2, "iteration {k}");
        }
        // Nothing was lost on the way: every frame from port 2 reached port 1.
        let to1 = dummy(&snap, 1).take_sent();
        assert_eq!(to1.iter().filter(|s| s[6..12] == mac(2)).count(), 11);
        // An idle PMD (the previous iteration moved nothing) polls everything at once.
        for _ in 0..300 {
            let it = w.poll_at(&snap, &rxqs, 10, t);
            w.quiet.end(it.rx > 0);
            t += 5_000;
        }
        dummy(&snap, 1).push_rx(&frame(BCAST, mac(3), None, 1));
        let it = w.poll_at(&snap, &rxqs, 10, t);
        assert_eq!(it.rx, 1);
        assert_eq!(pool.available(), 256);
    }

    #[test]
    fn a_pmd_thread_forwards_between_dummy_ports() {
        let dp = Arc::new(Datapath::new());
        dp.set_rx_mode(RxMode::Poll, 0);
        dp.publish(l2_switch(&[VlanMode::Trunk, VlanMode::Trunk]));
        let clock = Arc::new(AtomicU32::new(1));
        let mut pmd = PmdHandle::spawn(0, None, None, dp.clone(), clock).unwrap();
        let snap = dp.load();
        for i in 0..100 {
            dummy(&snap, 0).push_rx(&frame(BCAST, mac(1), None, i));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        // The counters are published when an iteration finds nothing.
        while (got.len() < 100 || pmd.stats.tx_packets.load(Ordering::Relaxed) < 100)
            && std::time::Instant::now() < deadline
        {
            got.extend(dummy(&snap, 1).take_sent());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pmd.stop();
        assert_eq!(got.len(), 100);
        assert!(got.iter().enumerate().all(|(i, f)| f[63] == i as u8));
        assert_eq!(pmd.stats.rx_packets.load(Ordering::Relaxed), 100);
        assert_eq!(pmd.stats.tx_packets.load(Ordering::Relaxed), 100);
    }
}
