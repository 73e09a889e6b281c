//! ferrovs-guest: the traffic tool of the test guests (std only, linked statically into their
//! initramfs). Every command prints one line `FERROVS-RESULT {json}` when it ends.
//!
//! ```text
//! ferrovs-guest tcp-recv PORT                      accept one stream, count bytes to EOF
//! ferrovs-guest tcp-send HOST PORT SECS [MBPS]     send for SECS (paced at MBPS if given),
//!                                                  report rate and retransmits
//! ferrovs-guest udp-recv PORT IDLE_SECS [EVERY]    count sequenced datagrams: lost, reordered,
//!                                                  corrupt, duplicates
//!                                                  (and every EVERY seconds a progress line
//!                                                  `FERROVS-PROGRESS {json}`, the same fields)
//! ferrovs-guest udp-send HOST PORT PPS COUNT SIZE  sequenced datagrams at a fixed rate
//! ferrovs-guest udp-blast HOST PORT SECS SIZE      sequenced datagrams as fast as possible
//! ferrovs-guest udp-recv-flows PORT0 N IDLE_SECS   udp-recv on ports PORT0..PORT0+N-1 at once
//! ferrovs-guest udp-send-flows HOST PORT0 N PPS COUNT SIZE
//!                                                  N flows (N sockets, so N source ports) to
//!                                                  PORT0..PORT0+N-1, each PPS and COUNT
//! ferrovs-guest sleep SECS
//! ```
//!
//! udp-recv also reports the guest's load while the stream flowed (from the first datagram
//! to the last /proc sample taken while datagrams still arrived, every 200 ms): interrupts
//! of the virtio devices per second (`irqs_per_s`, from /proc/interrupts) and the share of
//! CPU time not idle (`cpu_busy_pct`, from /proc/stat).
//!
//! A receiver counts loss from the first datagram it sees (a guest that boots into a running
//! stream reports `first`, the first sequence number, and loss after it).
//!
//! Every datagram a sender makes carries its sequence number (8 bytes, big-endian) and then a
//! payload derived from it: byte `i` (counted from the start of the datagram, `i >= 8`) is
//! `(seq * 31 + i) as u8`. A receiver checks it: a datagram whose payload does not match its
//! sequence number counts as `corrupt` (and in no other field), one whose sequence number was
//! already received as `duplicates` (it counts as neither received nor reordered). Both are how
//! a test sees stale guest memory: a receive buffer the switch wrote that a live migration did
//! not carry over holds a torn datagram or an older one.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// Prints `TAG {json}` with the fields (values already JSON).
fn line(tag: &str, fields: &[(&str, String)]) {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    println!("{tag} {{{}}}", body.join(","));
}

fn result(fields: &[(&str, String)]) {
    line("FERROVS-RESULT", fields);
}

/// The sender's TCP retransmitted segments so far (/proc/net/snmp, "Tcp:" RetransSegs).
fn retrans_segs() -> u64 {
    snmp("Tcp:", "RetransSegs")
}

/// A counter of /proc/net/snmp: `table` is the line prefix ("Tcp:", "Udp:").
fn snmp(table: &str, name: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut lines = s.lines().filter(|l| l.starts_with(table));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// A `TcpExt:` counter of /proc/net/netstat (0 if absent).
fn tcp_ext(name: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = s.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn addr(host: &str, port: &str) -> Result<SocketAddr, String> {
    format!("{host}:{port}")
        .parse()
        .map_err(|e| format!("bad address {host}:{port}: {e}"))
}

fn num(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("'{s}' is not a number"))
}

fn tcp_recv(port: &str) -> Result<(), String> {
    let l = TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|e| e.to_string())?;
    println!("FERROVS-LISTENING");
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    result(&[
        ("bytes", total.to_string()),
        ("seconds", format!("{secs:.3}")),
        ("mbps", format!("{:.1}", total as f64 * 8.0 / secs / 1e6)),
    ]);
    Ok(())
}

fn tcp_send(host: &str, port: &str, secs: &str, mbps: Option<&str>) -> Result<(), String> {
    let a = addr(host, port)?;
    let dur = Duration::from_secs(num(secs)?);
    let bytes_per_sec = mbps.map(num).transpose()?.map(|m| m * 1_000_000 / 8);
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() < Duration::from_secs(60) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connect {a}: {e}")),
        }
    };
    let r0 = retrans_segs();
    // Why segments were sent again: a tail-loss probe is sent when an ACK is late (the
    // path stalled), and recovers a loss only when TCPLossProbeRecovery counts it.
    let ext0 = [
        "TCPLossProbes",
        "TCPLossProbeRecovery",
        "TCPFastRetrans",
        "TCPTimeouts",
    ]
    .map(tcp_ext);
    let t = Instant::now();
    let buf = vec![0x5au8; 1 << 16];
    let mut sent = 0u64;
    while t.elapsed() < dur {
        if let Some(bps) = bytes_per_sec {
            let due = Duration::from_secs_f64(sent as f64 / bps.max(1) as f64);
            if let Some(wait) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        s.write_all(&buf).map_err(|e| e.to_string())?;
        sent += buf.len() as u64;
    }
    s.shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    // Wait for the receiver to close: everything was delivered.
    let mut b = [0u8; 16];
    let _ = s.read(&mut b);
    let secs = t.elapsed().as_secs_f64();
    result(&[
        ("bytes", sent.to_string()),
        ("seconds", format!("{secs:.3}")),
        ("mbps", format!("{:.1}", sent as f64 * 8.0 / secs / 1e6)),
        ("retransmits", (retrans_segs() - r0).to_string()),
        (
            "loss_probes",
            (tcp_ext("TCPLossProbes") - ext0[0]).to_string(),
        ),
        (
            "loss_probe_recoveries",
            (tcp_ext("TCPLossProbeRecovery") - ext0[1]).to_string(),
        ),
        (
            "fast_retransmits",
            (tcp_ext("TCPFastRetrans") - ext0[2]).to_string(),
        ),
        ("timeouts", (tcp_ext("TCPTimeouts") - ext0[3]).to_string()),
    ]);
    Ok(())
}

/// Interrupts of the virtio devices and CPU time so far.
#[derive(Default, Clone, Copy)]
struct Load {
    at: Option<Instant>,
    irqs: u64,
    /// Jiffies not idle (idle and iowait excluded) and in all.
    busy: u64,
    total: u64,
}

impl Load {
    fn now() -> Load {
        let ints = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
        // Lines "NN:  count [count...]  chip  ...  virtioN[-...]": sum the per-CPU counts.
        let irqs = ints
            .lines()
            .filter(|l| l.contains("virtio"))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .map_while(|w| w.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum();
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        let total: u64 = cpu.iter().sum();
        let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
        Load {
            at: Some(Instant::now()),
            irqs,
            busy: total - idle,
            total,
        }
    }
}

/// What a receiver of one sequenced stream has seen.
#[derive(Default, Clone)]
struct Rx {
    received: u64,
    lost: u64,
    reordered: u64,
    /// Datagrams whose payload does not match their sequence number.
    corrupt: u64,
    /// Datagrams whose sequence number had been received before.
    duplicates: u64,
    /// Sequence numbers received, as bits from `first` (a duplicate's test).
    seen: Seen,
    /// The first and the highest sequence number seen.
    first: Option<u64>,
    next: u64,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    /// Load at the first datagram and at the last sample while datagrams arrived.
    load0: Option<Load>,
    load1: Option<Load>,
}

impl Rx {
    /// Samples the load at the first datagram, then every 200 ms while datagrams arrive.
    fn sample_load(&mut self) {
        let due = match (self.load0, self.load1) {
            (None, _) => true,
            (Some(l), None) | (_, Some(l)) => {
                l.at.is_some_and(|t| t.elapsed() >= Duration::from_millis(200))
            }
        };
        if due {
            let l = Load::now();
            if self.load0.is_none() {
                self.load0 = Some(l);
            } else {
                self.load1 = Some(l);
            }
        }
    }

    /// Interrupts per second and CPU busy % between the two load samples.
    fn load_fields(&self) -> Vec<(&'static str, String)> {
        let (Some(a), Some(b)) = (self.load0, self.load1) else {
            return vec![
                ("irqs_per_s", "null".into()),
                ("cpu_busy_pct", "null".into()),
            ];
        };
        let secs = match (a.at, b.at) {
            (Some(x), Some(y)) => (y - x).as_secs_f64().max(1e-3),
            _ => 1.0,
        };
        let busy = (b.busy - a.busy) as f64 * 100.0 / (b.total - a.total).max(1) as f64;
        vec![
            (
                "irqs_per_s",
                format!("{:.0}", (b.irqs - a.irqs) as f64 / secs),
            ),
            ("cpu_busy_pct", format!("{busy:.1}")),
        ]
    }

    /// Accounts one datagram (its bytes from the sequence number on).
    fn datagram(&mut self, d: &[u8]) {
        let Some(seq) = d
            .get(..8)
            .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
        else {
            return;
        };
        if !pattern_ok(seq, d) {
            self.corrupt += 1;
            return;
        }
        let first = *self.first.get_or_insert(seq);
        if seq < first || !self.seen.insert(seq - first) {
            // Seen before, or older than the first one (a guest that booted into a stream
            // cannot tell a late datagram from a repeated one there: counted as a duplicate).
            self.duplicates += 1;
            return;
        }
        self.add(seq);
    }

    fn add(&mut self, seq: u64) {
        let now = Instant::now();
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        if self.received == 0 {
            self.next = seq;
        }
        self.received += 1;
        if seq >= self.next {
            self.lost += seq - self.next;
            self.next = seq + 1;
        } else {
            self.reordered += 1;
            self.lost = self.lost.saturating_sub(1);
        }
    }

    fn fields(&self) -> Vec<(&'static str, String)> {
        let secs = match (self.first_at, self.last_at) {
            (Some(f), Some(l)) => (l - f).as_secs_f64(),
            _ => 0.0,
        };
        let pps = if secs > 0.0 {
            self.received as f64 / secs
        } else {
            0.0
        };
        let seq = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
        vec![
            ("received", self.received.to_string()),
            ("lost", self.lost.to_string()),
            ("reordered", self.reordered.to_string()),
            ("corrupt", self.corrupt.to_string()),
            ("duplicates", self.duplicates.to_string()),
            ("first", seq(self.first)),
            ("last", seq((self.received > 0).then(|| self.next - 1))),
            ("seconds", format!("{secs:.3}")),
            ("pps", format!("{pps:.0}")),
        ]
    }
}

/// Receives one sequenced stream on `sock` until `idle` passes without a datagram (after the
/// first one); calls `tick` with the running counts every `every` if given.
fn recv_stream(
    sock: &UdpSocket,
    idle: Duration,
    every: Option<Duration>,
    tick: impl Fn(&Rx),
) -> Rx {
    let poll = every
        .map_or(idle, |e| e.min(idle))
        .max(Duration::from_millis(10));
    let _ = sock.set_read_timeout(Some(poll));
    let mut rx = Rx::default();
    let mut buf = [0u8; 2048];
    let mut last_tick = Instant::now();
    let mut quiet_since = Instant::now();
    loop {
        match sock.recv(&mut buf) {
            Ok(n) if n >= 8 => {
                rx.datagram(&buf[..n]);
                rx.sample_load();
                quiet_since = Instant::now();
            }
            Ok(_) => {}
            Err(_) if rx.received + rx.corrupt > 0 && quiet_since.elapsed() >= idle => break,
            Err(_) => {}
        }
        if let Some(e) = every {
            if last_tick.elapsed() >= e {
                last_tick = Instant::now();
                tick(&rx);
            }
        }
    }
    rx
}

/// Writes datagram `seq`: its sequence number, then the payload derived from it.
fn fill(buf: &mut [u8], seq: u64) {
    buf[..8].copy_from_slice(&seq.to_be_bytes());
    let base = seq.wrapping_mul(31);
    for (i, b) in buf.iter_mut().enumerate().skip(8) {
        *b = base.wrapping_add(i as u64) as u8;
    }
}

/// Whether datagram `d` (sequence number `seq`) carries the payload `fill` makes.
fn pattern_ok(seq: u64, d: &[u8]) -> bool {
    let base = seq.wrapping_mul(31);
    d.iter()
        .enumerate()
        .skip(8)
        .all(|(i, b)| *b == base.wrapping_add(i as u64) as u8)
}

/// A growable set of small numbers (offsets from a stream's first sequence number).
#[derive(Default, Clone)]
struct Seen(Vec<u64>);

impl Seen {
    /// Offsets tracked (8 MiB of bits); one beyond is taken as new (a datagram of 8 bytes
    /// has no payload to check, and a torn one may carry any number).
    const MAX: u64 = 1 << 26;

    /// Adds `n`; false if it was there already.
    fn insert(&mut self, n: u64) -> bool {
        if n >= Self::MAX {
            return true;
        }
        let (word, bit) = ((n / 64) as usize, 1u64 << (n % 64));
        if word >= self.0.len() {
            self.0.resize(word + 1, 0);
        }
        let fresh = self.0[word] & bit == 0;
        self.0[word] |= bit;
        fresh
    }
}

/// Receive buffers of 8 MiB for the sockets made from now on: a TCG guest's receiver can be
/// descheduled for tens of milliseconds on a loaded host, and the default (208 KiB) would
/// then overflow; what the tests measure is the switch, not this guest's scheduler (the
/// receiver reports its stack's drops as rcvbuf_errors either way).
fn big_receive_buffers() {
    let _ = std::fs::write("/proc/sys/net/core/rmem_max", "16777216");
    let _ = std::fs::write("/proc/sys/net/core/rmem_default", "8388608");
}

fn udp_recv(port: &str, idle: &str, every: Option<&str>) -> Result<(), String> {
    big_receive_buffers();
    let s = UdpSocket::bind(format!("0.0.0.0:{port}")).map_err(|e| e.to_string())?;
    let idle = Duration::from_secs(num(idle)?);
    let every = every.map(num).transpose()?.map(Duration::from_secs);
    // Datagrams this guest's own stack dropped (socket buffer full, bad checksum): a loss
    // that happened after the NIC.
    let e0 = [snmp("Udp:", "RcvbufErrors"), snmp("Udp:", "InErrors")];
    println!("FERROVS-LISTENING");
    let rx = recv_stream(&s, idle, every, |rx| line("FERROVS-PROGRESS", &rx.fields()));
    let mut f = rx.fields();
    f.extend(rx.load_fields());
    f.push((
        "rcvbuf_errors",
        (snmp("Udp:", "RcvbufErrors") - e0[0]).to_string(),
    ));
    f.push(("in_errors", (snmp("Udp:", "InErrors") - e0[1]).to_string()));
    result(&f);
    Ok(())
}

fn udp_recv_flows(port0: &str, flows: &str, idle: &str) -> Result<(), String> {
    big_receive_buffers();
    let (port0, flows) = (num(port0)?, num(flows)?);
    let idle = Duration::from_secs(num(idle)?);
    let mut socks = Vec::new();
    for i in 0..flows {
        socks.push(UdpSocket::bind(format!("0.0.0.0:{}", port0 + i)).map_err(|e| e.to_string())?);
    }
    println!("FERROVS-LISTENING");
    let handles: Vec<_> = socks
        .into_iter()
        .map(|s| std::thread::spawn(move || recv_stream(&s, idle, None, |_| {})))
        .collect();
    let per: Vec<Rx> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    let sum = |f: fn(&Rx) -> u64| per.iter().map(f).sum::<u64>().to_string();
    let list = |f: fn(&Rx) -> u64| {
        let v: Vec<String> = per.iter().map(|r| f(r).to_string()).collect();
        format!("[{}]", v.join(","))
    };
    result(&[
        ("flows", flows.to_string()),
        ("received", sum(|r| r.received)),
        ("lost", sum(|r| r.lost)),
        ("reordered", sum(|r| r.reordered)),
        ("corrupt", sum(|r| r.corrupt)),
        ("duplicates", sum(|r| r.duplicates)),
        ("first", list(|r| r.first.unwrap_or(u64::MAX))),
        ("per_flow", list(|r| r.received)),
    ]);
    Ok(())
}

fn udp_send(host: &str, port: &str, pps: &str, count: &str, size: &str) -> Result<(), String> {
    let a = addr(host, port)?;
    let (pps, count, size) = (num(pps)?.max(1), num(count)?, num(size)?.clamp(8, 1472));
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; size as usize];
    let t = Instant::now();
    let mut errors = 0u64;
    for seq in 0..count {
        let due = Duration::from_secs_f64(seq as f64 / pps as f64);
        if let Some(wait) = due.checked_sub(t.elapsed()) {
            std::thread::sleep(wait);
        }
        fill(&mut buf, seq);
        if s.send_to(&buf, a).is_err() {
            errors += 1;
        }
    }
    result(&[
        ("sent", count.to_string()),
        ("send_errors", errors.to_string()),
        ("seconds", format!("{:.3}", t.elapsed().as_secs_f64())),
    ]);
    Ok(())
}

fn udp_blast(host: &str, port: &str, secs: &str, size: &str) -> Result<(), String> {
    let a = addr(host, port)?;
    let (dur, size) = (Duration::from_secs(num(secs)?), num(size)?.clamp(8, 1472));
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    s.connect(a).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; size as usize];
    let t = Instant::now();
    let (mut seq, mut errors) = (0u64, 0u64);
    while t.elapsed() < dur {
        // The clock is read once every 64 datagrams.
        for _ in 0..64 {
            fill(&mut buf, seq);
            seq += 1;
            if s.send(&buf).is_err() {
                errors += 1;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    result(&[
        ("sent", seq.to_string()),
        ("send_errors", errors.to_string()),
        ("seconds", format!("{secs:.3}")),
        ("pps", format!("{:.0}", seq as f64 / secs)),
    ]);
    Ok(())
}

fn udp_send_flows(
    host: &str,
    port0: &str,
    flows: &str,
    pps: &str,
    count: &str,
    size: &str,
) -> Result<(), String> {
    let (port0, flows) = (num(port0)?, num(flows)?.max(1));
    let (pps, count, size) = (num(pps)?.max(1), num(count)?, num(size)?.clamp(8, 1472));
    let mut socks = Vec::new();
    for i in 0..flows {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        s.connect(addr(host, &(port0 + i).to_string())?)
            .map_err(|e| e.to_string())?;
        socks.push(s);
    }
    let mut buf = vec![0u8; size as usize];
    let t = Instant::now();
    let mut errors = 0u64;
    // Round `seq` sends datagram `seq` of every flow.
    for seq in 0..count {
        let due = Duration::from_secs_f64(seq as f64 / pps as f64);
        if let Some(wait) = due.checked_sub(t.elapsed()) {
            std::thread::sleep(wait);
        }
        fill(&mut buf, seq);
        for s in &socks {
            if s.send(&buf).is_err() {
                errors += 1;
            }
        }
    }
    result(&[
        ("flows", flows.to_string()),
        ("sent", (count * flows).to_string()),
        ("send_errors", errors.to_string()),
        ("seconds", format!("{:.3}", t.elapsed().as_secs_f64())),
    ]);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = match a.as_slice() {
        ["tcp-recv", port] => tcp_recv(port),
        ["tcp-send", host, port, secs] => tcp_send(host, port, secs, None),
        ["tcp-send", host, port, secs, mbps] => tcp_send(host, port, secs, Some(mbps)),
        ["sleep", secs] => num(secs).map(|s| std::thread::sleep(Duration::from_secs(s))),
        ["udp-recv", port, idle] => udp_recv(port, idle, None),
        ["udp-recv", port, idle, every] => udp_recv(port, idle, Some(every)),
        ["udp-blast", host, port, secs, size] => udp_blast(host, port, secs, size),
        ["udp-recv-flows", port0, n, idle] => udp_recv_flows(port0, n, idle),
        ["udp-send-flows", host, port0, n, pps, count, size] => {
            udp_send_flows(host, port0, n, pps, count, size)
        }
        ["udp-send", host, port, pps, count, size] => udp_send(host, port, pps, count, size),
        _ => Err("usage: see the source header".into()),
    };
    if let Err(e) = r {
        println!("FERROVS-ERROR {e}");
        std::process::exit(1);
    }
}
