//! ferrovs-gen: drive a vhost-user backend as a guest would.
//!
//! Modes: `txonly` (max rate or fixed pps, N flows, packet size), `rxonly` (counts, checks
//! per-flow sequence numbers and payload integrity, one-way latency from the transmit
//! timestamp), `pingpong` (round-trip latency against a `reflect` peer) and `reflect`
//! (swaps MAC addresses and sends every packet back), `idle` (attached, rings set up, quiet;
//! with `--ports N` many such guests in one process: [`IdlePorts`]).
//!
//! The loops are burst-oriented like a DPDK application: a burst of 32, one avail-index
//! publish per burst, notifications suppressed, one clock read per burst.
#![forbid(unsafe_code)]

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrovs_packet::build::{self, Stamp};
use ferrovs_packet::Mac;
use ferrovs_sys::os::monotonic_ns;
use ferrovs_vhost::frontend::{Frontend, RxQueue, TxQueue};
use serde_json::{json, Value};

pub const BURST: usize = 32;

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    TxOnly,
    RxOnly,
    PingPong,
    Reflect,
    /// Attach, set every queue up, then only keep the connection (a guest whose NIC is up
    /// but quiet: live state for the switch to carry, e.g. across hot upgrades).
    Idle,
}

/// Traffic parameters.
#[derive(Debug, Clone)]
pub struct Params {
    pub mode: Mode,
    /// Packets per second; 0 = as fast as possible.
    pub rate: u64,
    pub flows: u16,
    pub size: usize,
    pub duration: Duration,
    /// Stop after this many packets (txonly), 0 = no limit.
    pub count: u64,
    pub src: Mac,
    pub dst: Mac,
    /// Log a line per second (info level, on stderr).
    pub live: bool,
    /// rxonly: stop after this long without traffic once some arrived.
    pub idle_timeout: Duration,
    /// txonly at a fixed rate: exponential (Poisson) gaps of mean 1/rate instead of an even
    /// schedule, one packet at a time (random arrivals: the lost-wake-up stress).
    pub poisson: bool,
    /// Never sleep while ahead of schedule: spin, so that a receive is timestamped as soon as
    /// it lands (latency benchmarks at low rates; costs this core).
    pub spin: bool,
    /// txonly: after attaching, wait this long (draining the receive rings) before the
    /// traffic and the clock start: the backend finishes setting the new ports up (a switch
    /// may poll a new port only after reconfiguring its datapath), so the start-up is not
    /// measured.
    pub settle: Duration,
    /// txonly: also vary the IPv4 source address over this many values (10.128.0.0 and up),
    /// packet by packet: up to millions of distinct flows for a switch's flow caches (the
    /// per-flow sequence accounting stays by UDP port, `flows`). 0: off.
    pub ip_flows: u32,
}

/// Sets the IPv4 source of a test frame to the `k`-th address from 10.128.0.0 and fixes
/// the header checksum.
#[inline]
fn set_ip_source(b: &mut [u8], k: u32) {
    if b.len() < 34 {
        return;
    }
    b[26..30].copy_from_slice(&(0x0a80_0000u32.wrapping_add(k)).to_be_bytes());
    b[24..26].copy_from_slice(&[0, 0]);
    let mut sum: u32 = 0;
    for w in b[14..34].chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    b[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// Latency histogram in 100 ns buckets up to 10 ms, plus the maximum.
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; 100_001],
            count: 0,
            max: 0,
            sum: 0,
        }
    }
}

impl Histogram {
    pub fn add(&mut self, ns: u64) {
        let b = ((ns / 100) as usize).min(self.buckets.len() - 1);
        self.buckets[b] += 1;
        self.count += 1;
        self.max = self.max.max(ns);
        self.sum += ns as u128;
    }

    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = ((self.count as f64) * p / 100.0).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, c) in self.buckets.iter().enumerate() {
            acc += c;
            if acc >= target {
                return i as u64 * 100 + 50;
            }
        }
        self.max
    }

    pub fn to_json(&self) -> Value {
        let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
        json!({
            "samples": self.count,
            "p50_us": us(self.percentile(50.0)),
            "p99_us": us(self.percentile(99.0)),
            "p999_us": us(self.percentile(99.9)),
            "max_us": us(self.max),
            "mean_us": if self.count > 0 { us((self.sum / self.count as u128) as u64) } else { 0.0 },
        })
    }
}

/// Receive-side accounting per flow.
#[derive(Debug, Default, Clone)]
struct FlowRx {
    next: u64,
    received: u64,
    lost: u64,
    reordered: u64,
}

/// Results.
#[derive(Debug, Default)]
pub struct Report {
    pub sent: u64,
    pub received: u64,
    pub bytes: u64,
    pub lost: u64,
    pub reordered: u64,
    pub corrupt: u64,
    pub foreign: u64,
    pub elapsed: Duration,
    pub latency: Histogram,
    pub size: usize,
    /// Times the backend went away and came back (`--server`).
    pub reconnects: u64,
    /// Longest time between two received packets once packets flowed: the longest
    /// forwarding gap the traffic saw (switch restart, hot upgrade).
    pub max_gap_ns: u64,
    last_rx_ns: u64,
}

impl Report {
    pub fn to_json(&self, mode: Mode) -> Value {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        // What arrived when we receive (rxonly, or txonly with a sink), else what was sent.
        let pkts = if self.received > 0 || mode != Mode::TxOnly {
            self.received
        } else {
            self.sent
        };
        let wire_bits = pkts as f64 * ((self.size + 24) as f64) * 8.0; // + preamble, FCS, IFG
        json!({
            "mode": format!("{mode:?}").to_lowercase(),
            "seconds": (secs * 1000.0).round() / 1000.0,
            "sent": self.sent,
            "received": self.received,
            "lost": self.lost,
            "reordered": self.reordered,
            "corrupt": self.corrupt,
            "foreign": self.foreign,
            "mpps": (pkts as f64 / secs / 1e4).round() / 100.0,
            "gbps": (wire_bits / secs / 1e7).round() / 100.0,
            "size": self.size,
            "reconnects": self.reconnects,
            "max_gap_us": (self.max_gap_ns as f64 / 100.0).round() / 10.0,
            "latency": self.latency.to_json(),
        })
    }
}

struct Live {
    on: bool,
    last_ns: u64,
    last_pkts: u64,
}

impl Live {
    fn tick(&mut self, now_ns: u64, what: &str, pkts: u64, extra: &str) {
        if !self.on || now_ns.saturating_sub(self.last_ns) < 1_000_000_000 {
            return;
        }
        let dt = (now_ns - self.last_ns) as f64 / 1e9;
        log::info!(
            "{what} {:.3} Mpps (total {pkts}){extra}",
            (pkts - self.last_pkts) as f64 / dt / 1e6
        );
        self.last_ns = now_ns;
        self.last_pkts = pkts;
    }
}

/// Sends a broadcast from `src` so that the switch learns where it is (as a guest's
/// gratuitous ARP would).
fn announce(tx: &mut TxQueue, src: Mac) {
    let mut f = [0u8; 64];
    let st = Stamp {
        flow: u16::MAX,
        seq: 0,
        tx_ns: 0,
    };
    let n = build::udp_frame(&mut f, 64, ferrovs_packet::BROADCAST, src, st);
    tx.send(&f[..n]);
}

/// Waits for the backend to connect again (until `deadline`), then sets the device up.
fn reaccept(
    l: &UnixListener,
    cfg: ferrovs_vhost::frontend::FrontendConfig,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<Option<Frontend>, String> {
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Frontend::over(s, cfg).map(Some).map_err(|e| e.to_string());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(None)
}

/// Receives one burst on `rxq`, accounting every test packet in `r`/`flows`.
fn rx_burst(rxq: &mut RxQueue, now: u64, r: &mut Report, flows: &mut Vec<FlowRx>) -> usize {
    rxq.recv_with(BURST, |pkt| match build::parse_udp_frame(pkt) {
        Ok(st) if st.flow != u16::MAX => {
            if r.last_rx_ns != 0 {
                r.max_gap_ns = r.max_gap_ns.max(now.saturating_sub(r.last_rx_ns));
            }
            r.last_rx_ns = now;
            r.received += 1;
            r.bytes += pkt.len() as u64;
            if st.tx_ns > 0 && now >= st.tx_ns {
                r.latency.add(now - st.tx_ns);
            }
            let i = st.flow as usize;
            if i >= flows.len() {
                flows.resize(i + 1, FlowRx::default());
            }
            let f = &mut flows[i];
            f.received += 1;
            if st.seq >= f.next {
                f.lost += st.seq - f.next;
                f.next = st.seq + 1;
            } else {
                f.reordered += 1;
                f.lost = f.lost.saturating_sub(1);
            }
        }
        Ok(_) => {}
        Err(build::Bad::Corrupt) => r.corrupt += 1,
        Err(build::Bad::Foreign) => r.foreign += 1,
    })
}

/// Runs `p` on every queue pair of `fe` until the duration ends or `stop` is set. With
/// `sink`, txonly also receives on the sink's queues in the same thread (one process, one
/// core, exact end-to-end accounting: the `txrx` of the bench).
///
/// With `relisten` (the `--server` listener), a backend that goes away (a switch restart) is
/// waited for and the device set up again on its new connection, as QEMU does with a
/// `server=on` chardev; counters and sequence numbers carry on.
pub fn run(
    fe: &mut Frontend,
    sink: Option<&Frontend>,
    relisten: Option<&UnixListener>,
    p: &Params,
    stop: &AtomicBool,
) -> Result<Report, String> {
    let mut sink_rxs: Vec<RxQueue> = match sink {
        Some(s) => (0..s.config().queue_pairs)
            .map(|i| s.rx_queue(i))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    if let Some(s) = sink {
        // Announce the sink's MAC so the switch learns it.
        let mut t = s.tx_queue(0).map_err(|e| e.to_string())?;
        let mut f = [0u8; 64];
        let n = build::udp_frame(
            &mut f,
            64,
            ferrovs_packet::BROADCAST,
            p.dst,
            Stamp {
                flow: u16::MAX,
                seq: 0,
                tx_ns: 0,
            },
        );
        t.send(&f[..n]);
    }
    let pairs = fe.config().queue_pairs;
    let mut txs: Vec<TxQueue> = (0..pairs)
        .map(|i| fe.tx_queue(i))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut rxs: Vec<RxQueue> = (0..pairs)
        .map(|i| fe.rx_queue(i))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut r = Report {
        size: p.size,
        ..Default::default()
    };
    if p.mode == Mode::TxOnly && !p.settle.is_zero() {
        let until = Instant::now() + p.settle;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            for rx in rxs.iter_mut().chain(sink_rxs.iter_mut()) {
                rx.recv_with(BURST, |_| {});
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let start = Instant::now();
    let start_ns = monotonic_ns();
    let dur_ns = p.duration.as_nanos().min(u64::MAX as u128) as u64;
    let mut live = Live {
        on: p.live,
        last_ns: start_ns,
        last_pkts: 0,
    };
    let mut flows: Vec<FlowRx> = Vec::new();
    let mut seq = vec![0u64; p.flows.max(1) as usize];
    let mut ip_next = 0u32;
    // Flows are pinned to queue pairs (flow % pairs == queue), as RSS would, so that one
    // flow's packets never race each other over two queues.
    let mut flow_rr = vec![0u16; pairs.max(1)];
    let mut last_rx = Instant::now();
    let mut q = 0usize;
    let (mut next_due, mut rng) = (start_ns, start_ns | 1);
    if p.mode == Mode::RxOnly || p.mode == Mode::Reflect {
        // Announce our MAC so the switch learns it (as a guest's gratuitous ARP would).
        let mut f = [0u8; 64];
        let n = build::udp_frame(
            &mut f,
            64,
            ferrovs_packet::BROADCAST,
            p.src,
            Stamp {
                flow: u16::MAX,
                seq: 0,
                tx_ns: 0,
            },
        );
        txs[0].send(&f[..n]);
    }
    let mut pending_ping: Option<(u64, Instant)> = None;
    let mut ping_seq = 0u64;
    let template = build::Template::new(p.size, p.dst, p.src);
    let mut last_check = start_ns;
    loop {
        // One clock read per iteration (a vDSO call costs ~90 cycles here): timestamps,
        // the deadline and the live line all use it.
        let now = monotonic_ns();
        if stop.load(Ordering::Relaxed) || now - start_ns >= dur_ns {
            break;
        }
        if now - last_check >= 100_000_000 {
            last_check = now;
            if fe.peer_closed() {
                let Some(l) = relisten else { break };
                let cfg = fe.config().clone();
                let Some(new) = reaccept(l, cfg, stop, start + p.duration)? else {
                    break;
                };
                *fe = new;
                r.reconnects += 1;
                txs = (0..pairs)
                    .map(|i| fe.tx_queue(i))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?;
                rxs = (0..pairs)
                    .map(|i| fe.rx_queue(i))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?;
                if p.mode == Mode::RxOnly || p.mode == Mode::Reflect {
                    announce(&mut txs[0], p.src);
                }
                continue;
            }
        }
        match p.mode {
            Mode::TxOnly => {
                if p.count > 0 && r.sent >= p.count {
                    break;
                }
                let mut allowed = BURST as u64;
                if p.rate > 0 && p.poisson {
                    allowed = u64::from(now >= next_due);
                    if allowed == 1 {
                        // Exponential gap: -ln(U) / rate, U uniform in (0, 1].
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let u = ((rng >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                        next_due = now + (-u.ln() / p.rate as f64 * 1e9) as u64;
                    }
                } else if p.rate > 0 {
                    let due = ((now - start_ns) as f64 / 1e9 * p.rate as f64) as u64;
                    allowed = allowed.min(due.saturating_sub(r.sent));
                }
                if p.count > 0 {
                    allowed = allowed.min(p.count - r.sent);
                }
                let tx = &mut txs[q];
                tx.reclaim();
                if allowed > 0 {
                    let nflows = p.flows.max(1) as usize;
                    let per_queue = nflows.div_ceil(pairs).max(1);
                    let rr = &mut flow_rr[q];
                    let ipf = &mut ip_next;
                    let n = tx.send_with(allowed as usize, |_, buf| {
                        let mut flow = (*rr as usize) * pairs + q;
                        if flow >= nflows {
                            flow = q % nflows;
                        }
                        *rr = ((*rr as usize + 1) % per_queue) as u16;
                        let flow = flow as u16;
                        let s = &mut seq[flow as usize];
                        let st = Stamp {
                            flow,
                            seq: *s,
                            tx_ns: now,
                        };
                        *s += 1;
                        let len = template.write(buf, st);
                        if p.ip_flows > 0 {
                            set_ip_source(buf, *ipf);
                            *ipf = (*ipf + 1) % p.ip_flows;
                        }
                        len
                    });
                    r.sent += n as u64;
                    r.bytes += (n * p.size) as u64;
                }
                // Keep the receive ring drained so the peer side never stalls on us.
                rxs[q].recv_with(BURST, |_| {});
                let mut got = 0;
                for srx in sink_rxs.iter_mut() {
                    got += rx_burst(srx, now, &mut r, &mut flows);
                }
                if allowed == 0 && got == 0 && p.rate > 0 && p.rate < 1_000_000 && !p.spin {
                    // Ahead of schedule: give the core away rather than spin.
                    std::thread::sleep(Duration::from_micros(20));
                }
                live.tick(now, "tx", r.sent, "");
            }
            Mode::RxOnly => {
                let n = rx_burst(&mut rxs[q], now, &mut r, &mut flows);
                if n > 0 {
                    last_rx = Instant::now();
                } else if r.received > 0 && last_rx.elapsed() >= p.idle_timeout {
                    break;
                }
                live.tick(now, "rx", r.received, "");
            }
            Mode::Idle => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Mode::Reflect => {
                let mut back: Vec<[u8; 2048]> = Vec::new();
                let mut lens = Vec::new();
                rxs[q].recv_with(BURST, |pkt| {
                    let mut b = [0u8; 2048];
                    let n = pkt.len().min(2048);
                    b[..n].copy_from_slice(&pkt[..n]);
                    if n >= 12 {
                        let (d, s) = b.split_at_mut(6);
                        d.swap_with_slice(&mut s[..6]);
                    }
                    back.push(b);
                    lens.push(n);
                });
                if !back.is_empty() {
                    r.received += back.len() as u64;
                    let tx = &mut txs[q];
                    tx.reclaim();
                    let sent = tx.send_with(back.len(), |i, buf| {
                        buf[..lens[i]].copy_from_slice(&back[i][..lens[i]]);
                        lens[i]
                    });
                    r.sent += sent as u64;
                } else {
                    std::thread::yield_now();
                }
                live.tick(now, "reflect", r.received, "");
            }
            Mode::PingPong => {
                if pending_ping.is_none() {
                    let tx = &mut txs[q];
                    tx.reclaim();
                    let now = monotonic_ns();
                    let s = ping_seq;
                    if tx.send_with(1, |_, buf| {
                        build::udp_frame(
                            buf,
                            p.size,
                            p.dst,
                            p.src,
                            Stamp {
                                flow: 0,
                                seq: s,
                                tx_ns: now,
                            },
                        )
                    }) == 1
                    {
                        r.sent += 1;
                        pending_ping = Some((s, Instant::now()));
                    }
                }
                let now = monotonic_ns();
                let mut got = None;
                rxs[q].recv_with(BURST, |pkt| {
                    if let Ok(st) = build::parse_udp_frame(pkt) {
                        got = Some((st, now));
                    }
                });
                if let (Some((st, now)), Some((s, _))) = (got, pending_ping) {
                    if st.seq == s {
                        r.received += 1;
                        r.latency.add(now.saturating_sub(st.tx_ns));
                        pending_ping = None;
                        ping_seq += 1;
                        if let Some(gap) = 1_000_000_000u64.checked_div(p.rate) {
                            std::thread::sleep(Duration::from_nanos(gap));
                        }
                    }
                }
                if let Some((_, t)) = pending_ping {
                    if t.elapsed() > Duration::from_millis(200) {
                        r.lost += 1;
                        pending_ping = None;
                        ping_seq += 1;
                    }
                }
                live.tick(now, "pingpong", r.received, "");
            }
        }
        q = (q + 1) % pairs;
    }
    r.elapsed = start.elapsed();
    if !sink_rxs.is_empty() {
        // Collect what is still in flight.
        let mut idle = Instant::now();
        while idle.elapsed() < Duration::from_millis(300) {
            let mut got = 0;
            let now = monotonic_ns();
            for srx in sink_rxs.iter_mut() {
                got += rx_burst(srx, now, &mut r, &mut flows);
            }
            if got > 0 {
                idle = Instant::now();
            }
        }
        // Packets never seen at all after the last one per flow (or of a whole flow that
        // never arrived) count as lost too.
        if flows.len() < seq.len() {
            flows.resize(seq.len(), FlowRx::default());
        }
        for (f, sent) in flows.iter_mut().zip(&seq) {
            f.lost += sent.saturating_sub(f.next);
        }
    }
    if p.mode == Mode::RxOnly || !sink_rxs.is_empty() {
        if p.mode == Mode::RxOnly && r.received > 0 {
            // Measure up to the last packet, not the idle wait after it.
            r.elapsed = r.elapsed.saturating_sub(last_rx.elapsed());
        }
        for f in &flows {
            r.lost += f.lost;
            r.reordered += f.reordered;
        }
    }
    if p.mode == Mode::TxOnly {
        // Let the backend consume what is queued before we report.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200)
            && txs.iter_mut().any(|tx| {
                tx.reclaim();
                tx.room() < tx.ring().size() as usize
            })
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(r)
}

/// `idle --ports N`: many quiet guests in one process, for the many-ports benchmark and
/// test. Each frontend is attached (memory table, every vring set up with its kick and call
/// fds, enabled), its receive buffers are all posted and its transmit ring is set up empty;
/// then nothing more: the backend's PMD polls these queues and finds nothing, as it does
/// for the idle VMs of a cloud host.
pub struct IdlePorts {
    fes: Vec<Frontend>,
    /// Held so that the posted receive buffers stay the driver's.
    _rxs: Vec<RxQueue>,
    _txs: Vec<TxQueue>,
}

impl std::fmt::Debug for IdlePorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdlePorts")
            .field("ports", &self.fes.len())
            .finish_non_exhaustive()
    }
}

impl IdlePorts {
    /// Attaches a frontend to each of `paths`: as a client of the backend's socket, or
    /// (`server`) listening there for the backend to connect (its client mode). In server
    /// mode every socket is bound before the first accept, so a backend may connect to them
    /// in any order.
    pub fn attach(
        paths: &[std::path::PathBuf],
        server: bool,
        cfg: &ferrovs_vhost::frontend::FrontendConfig,
        stop: &AtomicBool,
    ) -> Result<IdlePorts, String> {
        let mut listeners = Vec::new();
        if server {
            for p in paths {
                let _ = std::fs::remove_file(p);
                let l = UnixListener::bind(p)
                    .map_err(|e| format!("cannot listen on {}: {e}", p.display()))?;
                listeners.push(l);
            }
        }
        let mut fes = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            let fe = match listeners.get(i) {
                Some(l) => reaccept(l, cfg.clone(), stop, Instant::now() + IDLE_ATTACH_WAIT)?
                    .ok_or_else(|| format!("{}: no backend connected", p.display()))?,
                None => Frontend::connect(p, cfg.clone())
                    .map_err(|e| format!("cannot attach to {}: {e}", p.display()))?,
            };
            fes.push(fe);
        }
        let (mut rxs, mut txs) = (Vec::new(), Vec::new());
        for fe in &fes {
            for q in 0..fe.config().queue_pairs {
                rxs.push(fe.rx_queue(q).map_err(|e| e.to_string())?);
                txs.push(fe.tx_queue(q).map_err(|e| e.to_string())?);
            }
        }
        Ok(IdlePorts {
            fes,
            _rxs: rxs,
            _txs: txs,
        })
    }

    pub fn len(&self) -> usize {
        self.fes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fes.is_empty()
    }

    /// Frontends whose backend closed the connection.
    pub fn closed(&self) -> usize {
        self.fes.iter().filter(|f| f.peer_closed()).count()
    }

    /// Sleeps until `stop` is set or `duration` has passed; returns the JSON summary.
    pub fn hold(&self, duration: Duration, stop: &AtomicBool) -> Value {
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) && start.elapsed() < duration {
            std::thread::sleep(Duration::from_millis(50));
        }
        json!({
            "mode": "idle",
            "ports": self.len(),
            "closed": self.closed(),
            "seconds": (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        })
    }
}

/// How long `idle --ports N --server` waits for the backend to connect to each socket.
const IDLE_ATTACH_WAIT: Duration = Duration::from_secs(60);

/// The socket of idle port `i` in `dir`: `idle<i>.sock`.
pub fn idle_socket(dir: &std::path::Path, i: usize) -> std::path::PathBuf {
    dir.join(format!("idle{i}.sock"))
}
