//! Poll-mode driver threads.
//!
//! A PMD owns a packet pool and a set of rx queues (from the published [`Snapshot`]). Each
//! iteration it loads the snapshot (one atomic load), and for each of its rx queues: takes
//! the queue's lock with `try_lock` (a queue being reconfigured is skipped for this round),
//! receives a burst of up to 32 packets ([`Port::rx_burst`]: a vhost-user dequeue, TAP reads
//! or an AF_PACKET ring), decides each packet's fate, groups packets by output port and
//! transmits each group with one [`Port::tx_burst`] (for vhost-user: one used-ring publish,
//! at most one guest notification). Scratch space is allocated once at start; the loop
//! allocates nothing.
//!
//! Accounting: TSC cycles of iterations that moved packets are *busy*, the rest *idle*;
//! cycles per packet = busy cycles / packets, as OVS's `pmd-stats-show` reports.
//!
//! Thread-safety: counters are single-writer (this thread), published with relaxed stores.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ferrovs_packet::offload::{self, TcpSegmenter};
use ferrovs_sys::guest::vring;
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};
use ferrovs_sys::os;
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::stats::DropReason;
use ferrovs_vhost::virtqueue::BURST;

use crate::flow::input::FlowCtx;
use crate::l2::{self, Decision, Edit};
use crate::port::{NotifyTimers, Port, PortIo};
use crate::{Datapath, RxMode, RxqRef, Snapshot};

/// Buffers per PMD pool: bursts in flight plus flood copies and software segments
/// (`MAX_EXTRA`), with margin.
pub const POOL_BUFFERS: u32 = 4096;
/// Large buffers per PMD pool (TSO packets of up to 64 KiB from guests and TAPs).
pub const POOL_LARGE_BUFFERS: u32 = 256;
/// Most distinct output ports one burst is grouped into before flushing.
const MAX_OUTPUTS: usize = 64;
/// Most packets one burst makes beside the received ones (VLAN-edited copies, segments of
/// TSO packets for ports without TSO): 32 packets of 64 KiB cut at a 1448-byte MSS.
const MAX_EXTRA: usize = 1536;
/// Most packets one burst sends to one port.
const MAX_PER_OUTPUT: usize = BURST + MAX_EXTRA;

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
}

impl FlowStats {
    fn publish(&self, c: &crate::flow::FlowCounters) {
        self.packets.store(c.packets, Ordering::Relaxed);
        self.emc_hits.store(c.emc_hits, Ordering::Relaxed);
        self.megaflow_hits.store(c.megaflow_hits, Ordering::Relaxed);
        self.upcalls.store(c.upcalls, Ordering::Relaxed);
        self.emc_inserts.store(c.emc_inserts, Ordering::Relaxed);
        self.emc_skipped.store(c.emc_skipped, Ordering::Relaxed);
    }

    pub fn load(&self) -> crate::flow::FlowCounters {
        crate::flow::FlowCounters {
            packets: self.packets.load(Ordering::Relaxed),
            emc_hits: self.emc_hits.load(Ordering::Relaxed),
            megaflow_hits: self.megaflow_hits.load(Ordering::Relaxed),
            upcalls: self.upcalls.load(Ordering::Relaxed),
            emc_inserts: self.emc_inserts.load(Ordering::Relaxed),
            emc_skipped: self.emc_skipped.load(Ordering::Relaxed),
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
            .spawn(move || {
                if let Some(c) = core {
                    if let Err(e) = os::set_affinity(&[c]) {
                        eprintln!("ferrovs: pmd{index}: cannot pin to core {c}: {e}");
                    }
                }
                if let Some(p) = priority {
                    if let Err(e) = os::set_thread_priority(p) {
                        eprintln!("ferrovs: pmd{index}: cannot set priority {p:?}: {e}");
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

/// Per-output packet list.
pub(crate) struct TxList {
    port: u32,
    idx: Vec<u16>,
}

/// Scratch of one PMD, allocated once.
pub(crate) struct Scratch<'p> {
    pub(crate) batch: Vec<Mbuf<'p>>,
    /// Copies with VLAN edits; referenced as `BURST + i`.
    pub(crate) extra: Vec<Mbuf<'p>>,
    /// Software segments of one packet before they join `extra`.
    segs: Vec<Mbuf<'p>>,
    outs: Vec<TxList>,
    nouts: usize,
}

impl<'p> Scratch<'p> {
    /// Packet `i`: `batch[i]`, or `extra[i - BURST]` from `BURST` on.
    #[inline]
    pub(crate) fn at(&self, i: usize) -> &Mbuf<'p> {
        if i < BURST {
            &self.batch[i]
        } else {
            &self.extra[i - BURST]
        }
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, i: usize) -> &mut Mbuf<'p> {
        if i < BURST {
            &mut self.batch[i]
        } else {
            &mut self.extra[i - BURST]
        }
    }

    /// Scratch with every list at its full capacity.
    pub(crate) fn new() -> Scratch<'p> {
        Scratch {
            batch: Vec::with_capacity(BURST),
            extra: Vec::with_capacity(MAX_EXTRA),
            segs: Vec::with_capacity(MAX_EXTRA),
            outs: (0..MAX_OUTPUTS)
                .map(|_| TxList {
                    port: 0,
                    idx: Vec::with_capacity(MAX_PER_OUTPUT),
                })
                .collect(),
            nouts: 0,
        }
    }

    /// The burst's output lists so far: (port, packet indices) in the order they were made.
    #[cfg(test)]
    pub(crate) fn outputs(&self) -> impl Iterator<Item = (u32, &[u16])> {
        self.outs[..self.nouts]
            .iter()
            .map(|l| (l.port, l.idx.as_slice()))
    }

    /// Forgets the burst's output lists and extra packets (the received ones stay).
    #[cfg(test)]
    pub(crate) fn reset_outputs(&mut self) {
        self.nouts = 0;
        self.extra.clear();
    }

    /// A copy of packet `i` (with its offload metadata) in `extra`; its index, or `None`
    /// when no buffer is left.
    pub(crate) fn copy(&mut self, pool: &'p Pool, i: usize) -> Option<usize> {
        if self.extra.len() == self.extra.capacity() {
            return None;
        }
        let src = self.at(i);
        let len = src.len();
        let mut m = pool.alloc_for(len)?;
        m.fill(len)?.copy_from_slice(src.data());
        m.vnet = src.vnet;
        self.extra.push(m);
        Some(BURST + self.extra.len() - 1)
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
    let mut timers = NotifyTimers::default();
    let mut fx = FlowCtx::default();
    let mut sc = Scratch::new();
    let (mut busy, mut idle, mut iters, mut rx, mut tx, mut drops) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut last = os::rdtsc();
    while !stop.load(Ordering::Relaxed) {
        if dp.standby() {
            timers.flush_all();
            stats.epoch.store(iters, Ordering::Release);
            std::thread::park_timeout(std::time::Duration::from_millis(50));
            last = os::rdtsc();
            continue;
        }
        let snap = dp.guard();
        let now = clock.load(Ordering::Relaxed);
        fx.emc.set_insert_inv_prob(dp.emc_insert_inv_prob());
        let mine: &[RxqRef] = snap
            .pmd_rxqs
            .get(index)
            .map(|v| v.as_slice())
            .unwrap_or(&[]);
        let (mut moved, mut max_batch) = (0u64, 0u64);
        for rxq in mine {
            let (r, t, d) = poll_rxq(&snap, *rxq, pool, &mut sc, &mut timers, &mut fx, now, index);
            moved += r;
            max_batch = max_batch.max(r);
            rx += r;
            tx += t;
            drops += d;
        }
        let assigned = mine.len();
        drop(snap);
        let t = os::rdtsc();
        if assigned == 0 {
            // Frozen (hot upgrade) or nothing left to poll: no timer will run for these.
            timers.flush_all();
        } else {
            timers.run(t);
        }
        if moved > 0 {
            busy += t.wrapping_sub(last);
        } else {
            idle += t.wrapping_sub(last);
        }
        last = t;
        if moved > 0 {
            idle_since = t;
        } else if assigned > 0 {
            let (mode, after_ns) = dp.rx_mode();
            let after = match mode {
                RxMode::Poll => u64::MAX,
                RxMode::Interrupt => 0,
                RxMode::Adaptive => after_ns.saturating_mul(hz) / 1_000_000_000,
            };
            if t.wrapping_sub(idle_since) >= after {
                if let Some(why) = sleep(dp, index, doorbell, timeout_ns(&timers, t, hz)) {
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
        if sleep_max_ns == 0
            || max_batch >= (BURST / 2) as u64
            || assigned == 0
            || dp.rx_mode().0 == RxMode::Interrupt
        {
            load_sleep_ns = 0;
        } else {
            if load_sleep_ns > 0 {
                let ns = load_sleep_ns.min(timeout_ns(&timers, last, hz));
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
            stats.flow.publish(&fx.counters);
        }
        if assigned == 0 {
            // Nothing assigned: don't spin a core for nothing (a new snapshot or a freeze
            // wakes us at once: see `PmdHandle::wake`).
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
    timers.flush_all();
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
            // there is no race to close; sleep on it too.
            PortIo::Tap(t) => {
                match t.tap.as_fd().try_clone_to_owned() {
                    Ok(fd) => kernel.push(fd),
                    Err(_) => {
                        disarm(&armed);
                        return None;
                    }
                }
                continue;
            }
            PortIo::Uplink(u) => {
                match u.sock.as_fd().try_clone_to_owned() {
                    Ok(fd) => kernel.push(fd),
                    Err(_) => {
                        disarm(&armed);
                        return None;
                    }
                }
                continue;
            }
            // A tunnel's UDP socket: readable while datagrams wait.
            PortIo::Vxlan(v) => {
                match v.sock.try_clone() {
                    Ok(s) => kernel.push(OwnedFd::from(s)),
                    Err(_) => {
                        disarm(&armed);
                        return None;
                    }
                }
                continue;
            }
            // AF_XDP: the socket is readable while the rx ring holds frames.
            PortIo::Xdp(x) => {
                match x.sock.as_fd().try_clone_to_owned() {
                    Ok(fd) => kernel.push(fd),
                    Err(_) => {
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
        let Ok(vq) = q.vq.try_lock() else {
            disarm(&armed);
            return None;
        };
        // A frontend that polls (no kick fd) cannot wake us: keep polling.
        let Some(k) = vq.kick.as_ref().and_then(|k| k.try_clone().ok()) else {
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

/// Polls one rx queue; returns (received, transmitted, dropped).
#[allow(clippy::too_many_arguments)]
#[inline]
fn poll_rxq<'p>(
    snap: &Snapshot,
    rxq: RxqRef,
    pool: &'p Pool,
    sc: &mut Scratch<'p>,
    timers: &mut NotifyTimers,
    fx: &mut FlowCtx,
    now: u32,
    pmd: usize,
) -> (u64, u64, u64) {
    let Some(inp) = snap.port(rxq.port) else {
        return (0, 0, 0);
    };
    inp.rx_burst(rxq.pair, pool, &mut sc.batch, timers);
    let n = sc.batch.len();
    if n == 0 {
        return (0, 0, 0);
    }
    let Some(bridge) = snap.bridge(inp.bridge) else {
        inp.rx_drops.drop(DropReason::NoRoute, n as u64);
        sc.batch.clear();
        return (n as u64, 0, n as u64);
    };
    sc.nouts = 0;
    let mut dropped = if let Some(bf) = &bridge.flows {
        crate::flow::input::process(snap, bridge, bf, inp, pool, sc, fx, now)
    } else {
        if let Some(r) = &bridge.default_rule {
            let bytes: usize = sc.batch.iter().map(|m| m.len()).sum();
            r.packets.fetch_add(n as u64, Ordering::Relaxed);
            r.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            if r.used.load(Ordering::Relaxed) != u64::from(now) {
                r.used.store(u64::from(now), Ordering::Relaxed);
            }
        }
        plain_l2(snap, bridge, inp, pool, sc, now)
    };
    let mut sent = 0u64;
    for o in 0..sc.nouts {
        let list = &sc.outs[o];
        let Some(out) = snap.port(list.port) else {
            continue;
        };
        let (s, d) = transmit(out, &list.idx, &sc.batch, &sc.extra, pmd, timers);
        sent += s;
        dropped += d;
    }
    sc.batch.clear();
    sc.extra.clear();
    (n as u64, sent, dropped)
}

/// The default pipeline (NORMAL only): the learning-bridge decision per packet, no flow key.
#[inline]
fn plain_l2<'p>(
    snap: &Snapshot,
    bridge: &crate::Bridge,
    inp: &Port,
    pool: &'p Pool,
    sc: &mut Scratch<'p>,
    now: u32,
) -> u64 {
    let mut dropped = 0u64;
    for i in 0..sc.batch.len() {
        let c = l2::decide(snap, bridge, inp, sc.batch[i].data(), now);
        match c.decision {
            Decision::Drop(r) => {
                inp.rx_drops.drop(r, 1);
                dropped += 1;
            }
            Decision::Unicast(p) => {
                if let Some(out) = snap.port(p) {
                    add_output(sc, pool, i, &c, inp, out);
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

/// Adds packet `i` (`BURST + k`: `extra[k]`) to `out`'s list, making a VLAN-edited copy if
/// the port needs one, and doing in software the offloads the packet asks for that the port
/// cannot take.
#[inline]
pub(crate) fn add_output<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    i: usize,
    c: &l2::Classified,
    inp: &Port,
    out: &Port,
) {
    let edit = l2::egress_edit(c, out);
    let ol = sc.at(i).vnet;
    if ol.is_offload() && !caps::accepts(out.tx_caps(), &ol) {
        match software_offload(sc, pool, i, edit, out) {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => {
                inp.rx_drops.drop(DropReason::BadOffload, 1);
                return;
            }
        }
    }
    let idx = match edit {
        Edit::None => i as u16,
        _ => {
            if sc.extra.len() == sc.extra.capacity() {
                out.rx_drops.drop(DropReason::NoMbuf, 1);
                return;
            }
            let src = sc.at(i);
            let len = src.len() + if matches!(edit, Edit::Push(_)) { 4 } else { 0 };
            let Some(mut m) = pool.alloc_for(len) else {
                out.rx_drops.drop(DropReason::NoMbuf, 1);
                return;
            };
            let Some(b) = m.fill(len) else { return };
            match edit {
                Edit::Push(v) => {
                    b[4..].copy_from_slice(src.data());
                    ferrovs_packet::push_vlan_in_place(b, v);
                }
                _ => {
                    b.copy_from_slice(src.data());
                    ferrovs_packet::pop_vlan_in_place(b);
                    m.pull_front(4);
                }
            }
            m.vnet = shift_offsets(src.vnet, edit);
            sc.extra.push(m);
            (BURST + sc.extra.len() - 1) as u16
        }
    };
    push_output(&mut sc.outs, &mut sc.nouts, out, idx);
}

/// [`add_output`] for several packets sent as they are (no VLAN edit) to one port: the
/// output's list is found once and the packets join it in order; a packet asking for an
/// offload `out` cannot take goes through [`add_output`] (software offload) in its place.
#[inline]
pub(crate) fn add_outputs<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    pkts: &[u16],
    inp: &Port,
    out: &Port,
) {
    let Some(slot) = output_slot(&mut sc.outs, &mut sc.nouts, out) else {
        out.rx_drops.drop(DropReason::NoRoute, pkts.len() as u64);
        return;
    };
    for &i in pkts {
        let ol = sc.at(i as usize).vnet;
        if ol.is_offload() && !caps::accepts(out.tx_caps(), &ol) {
            add_output(sc, pool, i as usize, &AS_IS, inp, out);
            continue;
        }
        let list = &mut sc.outs[slot].idx;
        if list.len() < list.capacity() {
            list.push(i);
        }
    }
}

/// A classification that sends packets as they are (no VLAN edit on any port).
const AS_IS: l2::Classified = l2::Classified {
    vlan: 0,
    tagged: false,
    decision: Decision::Flood,
};

/// The offload metadata of a packet after a VLAN edit moved its headers.
#[inline]
fn shift_offsets(mut h: VnetHdr, edit: Edit) -> VnetHdr {
    if h.is_offload() {
        let d: i32 = match edit {
            Edit::Push(_) => 4,
            Edit::Pop => -4,
            Edit::None => 0,
        };
        h.csum_start = (i32::from(h.csum_start) + d).max(0) as u16;
        h.hdr_len = (i32::from(h.hdr_len) + d).max(0) as u16;
    }
    h
}

/// Adds packet `idx` (`BURST + k`: `extra[k]`) to `out`'s list.
#[inline]
fn push_output(outs: &mut [TxList], nouts: &mut usize, out: &Port, idx: u16) {
    let Some(slot) = output_slot(outs, nouts, out) else {
        out.rx_drops.drop(DropReason::NoRoute, 1);
        return;
    };
    if outs[slot].idx.len() < outs[slot].idx.capacity() {
        outs[slot].idx.push(idx);
    }
}

/// The index of `out`'s list in `outs`, started if needed; `None` when `MAX_OUTPUTS` lists
/// are already in use.
#[inline]
fn output_slot(outs: &mut [TxList], nouts: &mut usize, out: &Port) -> Option<usize> {
    match outs[..*nouts].iter().position(|l| l.port == out.id) {
        Some(s) => Some(s),
        None if *nouts < MAX_OUTPUTS => {
            outs[*nouts].port = out.id;
            outs[*nouts].idx.clear();
            *nouts += 1;
            Some(*nouts - 1)
        }
        None => None,
    }
}

/// Does for port `out` what packet `i` asks of the next hop and `out` cannot do. A partial
/// checksum is completed in place (the packet stays valid for every other port: it is then
/// simply complete), and `Ok(false)` says to send it on as usual. A TSO packet is cut into
/// segments (with `edit` applied to each) added to `out`'s list: `Ok(true)`. `Err`: the
/// header does not describe the packet (the input port counts it).
#[cold]
fn software_offload<'p>(
    sc: &mut Scratch<'p>,
    pool: &'p Pool,
    i: usize,
    edit: Edit,
    out: &Port,
) -> Result<bool, offload::OffloadError> {
    let Scratch {
        batch,
        extra,
        segs,
        outs,
        nouts,
    } = sc;
    let src = if i < BURST {
        &batch[i]
    } else {
        &extra[i - BURST]
    };
    let h = src.vnet;
    if h.gso() != vnet::GSO_NONE {
        let seg = TcpSegmenter::new(src.data(), h.gso_size, h.csum_start)?;
        if seg.count() > 1 {
            out.offload.sw_tso.fetch_add(1, Ordering::Relaxed);
            // Segments go to `segs` first (the source may be in `extra`), then join `extra`
            // at the indices already given to `out`'s list.
            let base = extra.len();
            segs.clear();
            for k in 0..seg.count() {
                let len = seg.len(k);
                let m = (base + segs.len() < extra.capacity())
                    .then(|| pool.alloc_for(len))
                    .flatten();
                let Some(mut m) = m else {
                    out.rx_drops
                        .drop(DropReason::NoMbuf, (seg.count() - k) as u64);
                    break;
                };
                let Some(b) = m.fill(len) else { break };
                seg.write(k, b);
                match edit {
                    Edit::None => {}
                    Edit::Push(v) => {
                        if let Some(_front) = m.push_front(4) {
                            ferrovs_packet::push_vlan_in_place(m.data_mut(), v);
                        }
                    }
                    Edit::Pop => {
                        ferrovs_packet::pop_vlan_in_place(m.data_mut());
                        m.pull_front(4);
                    }
                }
                push_output(outs, nouts, out, (BURST + base + segs.len()) as u16);
                segs.push(m);
            }
            let made = segs.len() as u64;
            extra.append(segs);
            out.offload.sw_segments.fetch_add(made, Ordering::Relaxed);
            return Ok(true);
        }
    }
    // One segment's worth, or only a checksum: complete it in place.
    let m = if i < BURST {
        &mut batch[i]
    } else {
        &mut extra[i - BURST]
    };
    offload::complete_csum(
        m.data_mut(),
        usize::from(h.csum_start),
        usize::from(h.csum_offset),
    )?;
    m.vnet = VnetHdr::default();
    out.offload.sw_csum.fetch_add(1, Ordering::Relaxed);
    Ok(false)
}

/// Sends packets `idx` to `out`; returns (sent, dropped).
#[inline]
fn transmit(
    out: &Port,
    idx: &[u16],
    batch: &[Mbuf<'_>],
    extra: &[Mbuf<'_>],
    pmd: usize,
    timers: &mut NotifyTimers,
) -> (u64, u64) {
    let mbuf = |i: &u16| {
        let i = *i as usize;
        if i < BURST {
            &batch[i]
        } else {
            &extra[i - BURST]
        }
    };
    out.tx_burst(pmd, idx.len(), idx.iter().map(mbuf), timers)
}
