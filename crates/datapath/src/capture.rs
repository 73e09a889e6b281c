//! Packet capture on a port (`ferrovs capture`): the PMD's side.
//!
//! Every [`crate::Port`] has a [`CaptureHook`]. [`crate::Port::rx_burst`] and
//! [`crate::Port::tx_burst`] call it once per burst; while nobody captures, that costs one
//! relaxed atomic load. While a capture runs ([`CaptureHook::set`]), the hook holds a
//! [`Tap`]: a direction, a snap length, an optional classic BPF filter ([`Program`], compiled
//! by libpcap in the control plane and validated here) and a bounded ring of preallocated
//! records. For each packet of the burst the PMD runs the filter, then copies at most
//! `snaplen` bytes into the next free record.
//!
//! # Invariants
//!
//! * **The PMD never waits.** It takes the ring's lock with `try_lock`; when the lock is
//!   held (the drainer swapping it out, or another PMD on the same port) or every record is
//!   full, the packet is not captured and [`TapStats::drops`] goes up.
//! * **Bounded work per packet:** the filter runs at most [`MAX_INSNS`] instructions (jumps
//!   only go forward, checked by [`Program::new`]); the copy is at most `snaplen` bytes into
//!   memory allocated when the capture started. No allocation, system call or log line on the
//!   PMD (one `clock_gettime` through the vDSO per burst for the timestamp).
//! * **Bounded memory:** a tap owns `slots * snaplen` bytes, and its drainer as much again
//!   for the ring it swaps in ([`Ring::new`], [`Tap::swap`]).
//!
//! # Thread-safety
//!
//! The control thread installs and removes taps ([`CaptureHook::set`], `clear`) and asks
//! them to stop ([`Tap::stop`]); one drainer thread per tap takes the captured records
//! ([`Tap::swap`]); PMDs fill the ring. Counters are relaxed atomics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use ferrovs_sys::pool::Mbuf;

/// Most instructions of a filter (the kernel's and libpcap's `BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;
/// Scratch memory words of a filter.
pub const MEM_WORDS: usize = 16;
/// The largest snap length; longer packets (TSO) are truncated to it.
pub const MAX_SNAPLEN: u32 = 65535;
/// Bytes a capture ring may hold: its record count is this over the snap length, within
/// [`MIN_SLOTS`, `MAX_SLOTS`].
pub const RING_BYTES: usize = 4 << 20;
pub const MIN_SLOTS: usize = 64;
pub const MAX_SLOTS: usize = 4096;

/// One classic BPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Why a filter program was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramError {
    Empty,
    TooLong(usize),
    BadOpcode { pc: usize, code: u16 },
    JumpOutOfRange { pc: usize },
    BadMemIndex { pc: usize },
    DivByZero { pc: usize },
    NoReturn,
}

impl std::error::Error for ProgramError {}

impl std::fmt::Display for ProgramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgramError::Empty => write!(f, "empty filter program"),
            ProgramError::TooLong(n) => {
                write!(
                    f,
                    "filter program of {n} instructions (at most {MAX_INSNS})"
                )
            }
            ProgramError::BadOpcode { pc, code } => {
                write!(f, "instruction {pc}: unknown opcode {code:#06x}")
            }
            ProgramError::JumpOutOfRange { pc } => {
                write!(f, "instruction {pc}: jump beyond the program")
            }
            ProgramError::BadMemIndex { pc } => {
                write!(f, "instruction {pc}: scratch memory index out of range")
            }
            ProgramError::DivByZero { pc } => write!(f, "instruction {pc}: division by zero"),
            ProgramError::NoReturn => write!(f, "filter program does not end with a return"),
        }
    }
}

// Instruction classes and fields (classic BPF, `<pcap/bpf.h>`).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ST: u16 = 0x02;
const STX: u16 = 0x03;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const MEM: u16 = 0x60;
const LEN: u16 = 0x80;
const MSH: u16 = 0xa0;
const SRC_X: u16 = 0x08;

/// A validated classic BPF program: every opcode known, every jump inside the program and
/// forward, scratch indices below [`MEM_WORDS`], no constant division by zero, a return
/// last. Running it ([`Program::run`]) cannot panic and takes at most its length in steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    insns: Vec<Insn>,
}

impl Program {
    /// Validates `insns` (untrusted: from libpcap's compiler, or from a fuzzer).
    pub fn new(insns: Vec<Insn>) -> Result<Program, ProgramError> {
        let n = insns.len();
        if n == 0 {
            return Err(ProgramError::Empty);
        }
        if n > MAX_INSNS {
            return Err(ProgramError::TooLong(n));
        }
        for (pc, i) in insns.iter().enumerate() {
            let bad = ProgramError::BadOpcode { pc, code: i.code };
            if i.code > 0xff {
                return Err(bad);
            }
            let mem_ok = (i.k as usize) < MEM_WORDS;
            match i.code & 0x07 {
                LD => match i.code & 0xe0 {
                    IMM | LEN if i.code & 0x18 == W => {}
                    ABS | IND if i.code & 0x18 != 0x18 => {}
                    MEM if i.code & 0x18 == W => {
                        if !mem_ok {
                            return Err(ProgramError::BadMemIndex { pc });
                        }
                    }
                    _ => return Err(bad),
                },
                LDX => match i.code & 0xf8 {
                    c if c == IMM | W || c == LEN | W => {}
                    c if c == MSH | B => {}
                    c if c == MEM | W => {
                        if !mem_ok {
                            return Err(ProgramError::BadMemIndex { pc });
                        }
                    }
                    _ => return Err(bad),
                },
                ST | STX => {
                    if i.code & 0xf8 != 0 {
                        return Err(bad);
                    }
                    if !mem_ok {
                        return Err(ProgramError::BadMemIndex { pc });
                    }
                }
                ALU => {
                    let op = i.code & 0xf0;
                    if op > 0xa0 || (op == 0x80 && i.code & SRC_X != 0) {
                        return Err(bad);
                    }
                    if (op == 0x30 || op == 0x90) && i.code & SRC_X == 0 && i.k == 0 {
                        return Err(ProgramError::DivByZero { pc });
                    }
                }
                JMP => {
                    let op = i.code & 0xf0;
                    let rest = n - pc - 1;
                    let ok = match op {
                        0x00 => i.code & SRC_X == 0 && (i.k as usize) < rest,
                        0x10..=0x40 => (i.jt as usize) < rest && (i.jf as usize) < rest,
                        _ => return Err(bad),
                    };
                    if !ok {
                        return Err(ProgramError::JumpOutOfRange { pc });
                    }
                }
                RET => {
                    if i.code & 0x18 == 0x18 || i.code & 0xe0 != 0 {
                        return Err(bad);
                    }
                }
                _ => {
                    // MISC: TAX (0x00) and TXA (0x80).
                    if i.code & 0xf8 != 0 && i.code & 0xf8 != 0x80 {
                        return Err(bad);
                    }
                }
            }
        }
        if insns[n - 1].code & 0x07 != RET {
            return Err(ProgramError::NoReturn);
        }
        Ok(Program { insns })
    }

    /// The instructions.
    pub fn insns(&self) -> &[Insn] {
        &self.insns
    }

    /// Runs the program on `pkt` (its whole length on the wire is `pkt.len()`): how many
    /// bytes to keep, 0 to reject. A load beyond the packet, or a division by a zero X,
    /// rejects it (as libpcap's `bpf_filter`).
    pub fn run(&self, pkt: &[u8]) -> u32 {
        let (mut a, mut x) = (0u32, 0u32);
        let mut mem = [0u32; MEM_WORDS];
        let mut pc = 0usize;
        let load = |off: u32, size: u16| -> Option<u32> {
            let off = off as usize;
            match size {
                W => pkt
                    .get(off..off.checked_add(4)?)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
                H => pkt
                    .get(off..off.checked_add(2)?)
                    .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]]))),
                _ => pkt.get(off).map(|b| u32::from(*b)),
            }
        };
        while let Some(i) = self.insns.get(pc) {
            pc += 1;
            let k = i.k;
            match i.code & 0x07 {
                LD => {
                    a = match i.code & 0xe0 {
                        IMM => k,
                        LEN => pkt.len() as u32,
                        MEM => mem[k as usize % MEM_WORDS],
                        ABS => match load(k, i.code & 0x18) {
                            Some(v) => v,
                            None => return 0,
                        },
                        _ => match x.checked_add(k).and_then(|o| load(o, i.code & 0x18)) {
                            Some(v) => v,
                            None => return 0,
                        },
                    }
                }
                LDX => {
                    x = match i.code & 0xe0 {
                        IMM => k,
                        LEN => pkt.len() as u32,
                        MEM => mem[k as usize % MEM_WORDS],
                        _ => match pkt.get(k as usize) {
                            Some(b) => 4 * u32::from(b & 0x0f),
                            None => return 0,
                        },
                    }
                }
                ST => mem[k as usize % MEM_WORDS] = a,
                STX => mem[k as usize % MEM_WORDS] = x,
                ALU => {
                    let v = if i.code & SRC_X != 0 { x } else { k };
                    a = match i.code & 0xf0 {
                        0x00 => a.wrapping_add(v),
                        0x10 => a.wrapping_sub(v),
                        0x20 => a.wrapping_mul(v),
                        0x30 => match a.checked_div(v) {
                            Some(r) => r,
                            None => return 0,
                        },
                        0x40 => a | v,
                        0x50 => a & v,
                        0x60 => a.checked_shl(v).unwrap_or(0),
                        0x70 => a.checked_shr(v).unwrap_or(0),
                        0x80 => a.wrapping_neg(),
                        0x90 => match a.checked_rem(v) {
                            Some(r) => r,
                            None => return 0,
                        },
                        _ => a ^ v,
                    }
                }
                JMP => {
                    let v = if i.code & SRC_X != 0 { x } else { k };
                    let taken = match i.code & 0xf0 {
                        0x00 => {
                            pc += k as usize;
                            continue;
                        }
                        0x10 => a == v,
                        0x20 => a > v,
                        0x30 => a >= v,
                        _ => a & v != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                RET => {
                    return match i.code & 0x18 {
                        0x00 => k,
                        0x08 => x,
                        _ => a,
                    }
                }
                MISC => {
                    if i.code & 0xf8 == 0 {
                        x = a;
                    } else {
                        a = x;
                    }
                }
                _ => return 0,
            }
        }
        0
    }
}

/// Which way a captured packet went, seen from the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Received from the port (a guest's or the kernel's transmit).
    In,
    /// Sent to the port.
    Out,
}

/// What a capture takes.
#[derive(Debug, Clone)]
pub struct TapConfig {
    pub capture_in: bool,
    pub capture_out: bool,
    /// Bytes kept of each packet (1 to [`MAX_SNAPLEN`]).
    pub snaplen: u32,
    /// Packets the program rejects are not captured.
    pub filter: Option<Program>,
}

/// One captured packet.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// Nanoseconds since the Unix epoch (the burst's time).
    pub ts_ns: u64,
    pub dir_in: bool,
    /// The packet's length (before truncation).
    pub orig_len: u32,
    /// At most `snaplen` bytes of it.
    pub data: Vec<u8>,
}

/// A fixed set of preallocated records, filled in order.
#[derive(Debug)]
pub struct Ring {
    recs: Vec<Record>,
    len: usize,
}

impl Ring {
    /// A ring for snap length `snaplen`: [`RING_BYTES`] / `snaplen` records, within
    /// [`MIN_SLOTS`, `MAX_SLOTS`], each with room for `snaplen` bytes.
    pub fn new(snaplen: u32) -> Ring {
        let slots = (RING_BYTES / snaplen.max(1) as usize).clamp(MIN_SLOTS, MAX_SLOTS);
        Ring {
            recs: (0..slots)
                .map(|_| Record {
                    data: Vec::with_capacity(snaplen as usize),
                    ..Default::default()
                })
                .collect(),
            len: 0,
        }
    }

    /// Records the ring holds at most.
    pub fn slots(&self) -> usize {
        self.recs.len()
    }

    /// The records filled.
    pub fn records(&self) -> &[Record] {
        &self.recs[..self.len]
    }

    /// Empties the ring (its memory stays).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    #[inline]
    fn push(&mut self, ts_ns: u64, dir_in: bool, pkt: &[u8], keep: usize) -> bool {
        let Some(r) = self.recs.get_mut(self.len) else {
            return false;
        };
        r.ts_ns = ts_ns;
        r.dir_in = dir_in;
        r.orig_len = pkt.len() as u32;
        r.data.clear();
        r.data.extend_from_slice(&pkt[..keep.min(pkt.len())]);
        self.len += 1;
        true
    }
}

/// A tap's counters.
#[derive(Debug, Default)]
pub struct TapStats {
    /// Packets put in the ring.
    pub captured: AtomicU64,
    /// Packets the filter rejected.
    pub filtered: AtomicU64,
    /// Packets not captured: the ring was full or busy (`capture drops`).
    pub drops: AtomicU64,
}

/// Why a capture stopped (set once, by whoever stops it first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum StopReason {
    Count = 1,
    ClientClosed = 2,
    PortDeleted = 3,
    Upgrade = 4,
    Shutdown = 5,
    ClientSlow = 6,
}

impl StopReason {
    fn from_u8(v: u8) -> Option<StopReason> {
        Some(match v {
            1 => StopReason::Count,
            2 => StopReason::ClientClosed,
            3 => StopReason::PortDeleted,
            4 => StopReason::Upgrade,
            5 => StopReason::Shutdown,
            6 => StopReason::ClientSlow,
            _ => return None,
        })
    }
}

/// A running capture on one port: its configuration, ring and counters.
#[derive(Debug)]
pub struct Tap {
    cfg: TapConfig,
    ring: Mutex<Ring>,
    pub stats: TapStats,
    stop: AtomicU8,
}

impl Tap {
    pub fn new(mut cfg: TapConfig) -> Tap {
        cfg.snaplen = cfg.snaplen.clamp(1, MAX_SNAPLEN);
        Tap {
            ring: Mutex::new(Ring::new(cfg.snaplen)),
            cfg,
            stats: TapStats::default(),
            stop: AtomicU8::new(0),
        }
    }

    pub fn config(&self) -> &TapConfig {
        &self.cfg
    }

    /// An empty ring of this tap's shape, for its drainer to [`Tap::swap`] in.
    pub fn spare_ring(&self) -> Ring {
        Ring::new(self.cfg.snaplen)
    }

    /// Exchanges the tap's ring with `spare` (emptied first): the drainer then reads the
    /// records at leisure. O(1) under the lock.
    pub fn swap(&self, spare: &mut Ring) {
        spare.clear();
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut *r, spare);
    }

    /// Asks the capture to stop; the first reason given wins. The PMDs capture nothing more.
    pub fn stop(&self, why: StopReason) {
        let _ = self
            .stop
            .compare_exchange(0, why as u8, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Why the capture stopped, if it did.
    pub fn stopped(&self) -> Option<StopReason> {
        StopReason::from_u8(self.stop.load(Ordering::Acquire))
    }

    /// Captures what passes the filter of `pkts`, which went `dir` (PMD).
    fn capture<'a, 'p: 'a>(&self, dir: Dir, pkts: impl Iterator<Item = &'a Mbuf<'p>>) {
        let want = match dir {
            Dir::In => self.cfg.capture_in,
            Dir::Out => self.cfg.capture_out,
        };
        if !want || self.stop.load(Ordering::Relaxed) != 0 {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let ring = self.ring.try_lock();
        let mut ring = ring.ok();
        let (mut captured, mut filtered, mut drops) = (0u64, 0u64, 0u64);
        for m in pkts {
            let pkt = m.data();
            let keep = match &self.cfg.filter {
                Some(p) => p.run(pkt) as usize,
                None => usize::MAX,
            };
            if keep == 0 {
                filtered += 1;
                continue;
            }
            let keep = keep.min(self.cfg.snaplen as usize);
            if ring
                .as_mut()
                .is_some_and(|r| r.push(ts, dir == Dir::In, pkt, keep))
            {
                captured += 1;
            } else {
                drops += 1;
            }
        }
        for (c, v) in [
            (&self.stats.captured, captured),
            (&self.stats.filtered, filtered),
            (&self.stats.drops, drops),
        ] {
            if v != 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        }
    }
}

/// A port's capture point: off (one relaxed load per burst), or a [`Tap`].
#[derive(Debug, Default)]
pub struct CaptureHook {
    on: AtomicBool,
    tap: ArcSwapOption<Tap>,
}

impl CaptureHook {
    /// Installs `tap` (control plane). False if another capture runs on the port.
    pub fn set(&self, tap: Arc<Tap>) -> bool {
        let cur = self.tap.load();
        if cur.as_ref().is_some_and(|t| t.stopped().is_none()) {
            return false;
        }
        self.tap.store(Some(tap));
        self.on.store(true, Ordering::Release);
        true
    }

    /// Removes `tap` if it is the one installed (control plane).
    pub fn clear(&self, tap: &Arc<Tap>) {
        let cur = self.tap.load();
        if cur.as_ref().is_some_and(|t| Arc::ptr_eq(t, tap)) {
            self.on.store(false, Ordering::Release);
            self.tap.store(None);
        }
    }

    /// The tap installed, if any.
    pub fn tap(&self) -> Option<Arc<Tap>> {
        self.tap.load_full()
    }

    /// Offers a burst that went `dir` to the capture (PMD): nothing unless one runs.
    #[inline]
    pub fn offer<'a, 'p: 'a>(&self, dir: Dir, pkts: impl Iterator<Item = &'a Mbuf<'p>>) {
        if self.on.load(Ordering::Relaxed) {
            self.offer_slow(dir, pkts);
        }
    }

    #[cold]
    #[inline(never)]
    fn offer_slow<'a, 'p: 'a>(&self, dir: Dir, pkts: impl Iterator<Item = &'a Mbuf<'p>>) {
        if let Some(t) = &*self.tap.load() {
            t.capture(dir, pkts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_sys::pool::Pool;

    fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }

    /// `ether proto 0x0800` as libpcap compiles it (`tcpdump -d ip`).
    fn ip_only() -> Program {
        Program::new(vec![
            insn(0x28, 0, 0, 12),
            insn(0x15, 0, 1, 0x0800),
            insn(0x06, 0, 0, 262144),
            insn(0x06, 0, 0, 0),
        ])
        .unwrap()
    }

    fn frame(ethertype: u16, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f
    }

    #[test]
    fn a_program_runs_as_libpcap_compiled_it() {
        let p = ip_only();
        assert_eq!(p.run(&frame(0x0800, 60)), 262144);
        assert_eq!(p.run(&frame(0x0806, 60)), 0);
        // A load beyond the packet rejects it.
        assert_eq!(p.run(&[0u8; 13]), 0);
        // ldxb 4*([14]&0xf); ld [x+14]; ret a
        let p = Program::new(vec![
            insn(0xb1, 0, 0, 14),
            insn(0x50, 0, 0, 14),
            insn(0x16, 0, 0, 0),
        ])
        .unwrap();
        let mut f = frame(0x0800, 60);
        f[14] = 0x45;
        f[34] = 7;
        assert_eq!(p.run(&f), 7);
        // Scratch memory, ALU, division by a zero X, TAX/TXA.
        let p = Program::new(vec![
            insn(0x00, 0, 0, 10), // ld #10
            insn(0x02, 0, 0, 3),  // st M[3]
            insn(0x01, 0, 0, 0),  // ldx #0
            insn(0x3c, 0, 0, 0),  // div x
            insn(0x16, 0, 0, 0),  // ret a
        ])
        .unwrap();
        assert_eq!(p.run(&[]), 0);
        let p = Program::new(vec![
            insn(0x00, 0, 0, 6),  // ld #6
            insn(0x02, 0, 0, 15), // st M[15]
            insn(0x61, 0, 0, 15), // ldx M[15]
            insn(0x24, 0, 0, 7),  // mul #7
            insn(0x1c, 0, 0, 0),  // sub x
            insn(0x64, 0, 0, 40), // lsh #40 (beyond the width: 0)
            insn(0x87, 0, 0, 0),  // txa
            insn(0x25, 1, 0, 5),  // jgt #5
            insn(0x06, 0, 0, 0),
            insn(0x16, 0, 0, 0),
        ])
        .unwrap();
        assert_eq!(p.run(&[]), 6);
    }

    #[test]
    fn bad_programs_are_refused() {
        let ret = insn(0x06, 0, 0, 0);
        assert_eq!(Program::new(vec![]), Err(ProgramError::Empty));
        assert!(matches!(
            Program::new(vec![ret; MAX_INSNS + 1]),
            Err(ProgramError::TooLong(_))
        ));
        assert!(Program::new(vec![ret; MAX_INSNS]).is_ok());
        assert_eq!(
            Program::new(vec![insn(0x15, 1, 0, 0), ret]),
            Err(ProgramError::JumpOutOfRange { pc: 0 })
        );
        assert_eq!(
            Program::new(vec![insn(0x05, 0, 0, 1), ret]),
            Err(ProgramError::JumpOutOfRange { pc: 0 })
        );
        assert_eq!(
            Program::new(vec![insn(0x02, 0, 0, 16), ret]),
            Err(ProgramError::BadMemIndex { pc: 0 })
        );
        assert_eq!(
            Program::new(vec![insn(0x34, 0, 0, 0), ret]),
            Err(ProgramError::DivByZero { pc: 0 })
        );
        assert_eq!(
            Program::new(vec![insn(0x00, 0, 0, 0)]),
            Err(ProgramError::NoReturn)
        );
        for code in [0x0f, 0xff, 0x18, 0xd5, 0x100, 0x1e] {
            assert!(
                matches!(
                    Program::new(vec![insn(code, 0, 0, 0), ret]),
                    Err(ProgramError::BadOpcode { .. })
                ),
                "{code:#x}"
            );
        }
    }

    #[test]
    fn a_hook_costs_nothing_off_and_captures_filtered_truncated_when_on() {
        let pool = Pool::new(8).unwrap();
        let mk = |f: &[u8]| {
            let mut m = pool.alloc().unwrap();
            m.fill(f.len()).unwrap().copy_from_slice(f);
            m
        };
        let pkts = [mk(&frame(0x0800, 100)), mk(&frame(0x0806, 60))];
        let hook = CaptureHook::default();
        hook.offer(Dir::In, pkts.iter());
        let tap = Arc::new(Tap::new(TapConfig {
            capture_in: true,
            capture_out: false,
            snaplen: 64,
            filter: Some(ip_only()),
        }));
        assert!(hook.set(tap.clone()));
        assert!(!hook.set(Arc::new(Tap::new(tap.config().clone()))));
        hook.offer(Dir::In, pkts.iter());
        hook.offer(Dir::Out, pkts.iter());
        let mut spare = tap.spare_ring();
        tap.swap(&mut spare);
        let r = spare.records();
        assert_eq!(r.len(), 1);
        assert!(r[0].dir_in);
        assert_eq!((r[0].orig_len, r[0].data.len()), (100, 64));
        assert_eq!(tap.stats.filtered.load(Ordering::Relaxed), 1);
        // A full ring: drops counted, the PMD goes on.
        let slots = spare.slots();
        for _ in 0..=slots {
            hook.offer(Dir::In, pkts[..1].iter());
        }
        assert_eq!(tap.stats.drops.load(Ordering::Relaxed), 1);
        assert_eq!(tap.stats.captured.load(Ordering::Relaxed), 1 + slots as u64);
        // Stopped: nothing more, and the port takes a new capture.
        tap.stop(StopReason::Count);
        tap.stop(StopReason::Upgrade);
        assert_eq!(tap.stopped(), Some(StopReason::Count));
        hook.offer(Dir::In, pkts[..1].iter());
        assert_eq!(tap.stats.drops.load(Ordering::Relaxed), 1);
        hook.clear(&tap);
        assert!(hook.tap().is_none());
        assert!(hook.set(Arc::new(Tap::new(tap.config().clone()))));
    }

    /// A deterministic fuzz pass: random programs of likely opcodes; those that validate
    /// run on random packets without panicking, within their length in steps.
    #[test]
    fn random_programs_validate_or_are_refused_and_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let codes = [
            0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x0c, 0x0e, 0x15, 0x16, 0x1c, 0x20,
            0x25, 0x28, 0x30, 0x34, 0x35, 0x3c, 0x40, 0x44, 0x45, 0x48, 0x50, 0x54, 0x60, 0x61,
            0x64, 0x74, 0x80, 0x81, 0x84, 0x87, 0x94, 0x9c, 0xa4, 0xb1, 0x1d, 0x2d,
        ];
        let (mut valid, mut accepted) = (0, 0);
        for _ in 0..20_000 {
            let n = 1 + (rnd() % 12) as usize;
            let insns = (0..n)
                .map(|_| {
                    let r = rnd();
                    Insn {
                        code: codes[(r % codes.len() as u64) as usize],
                        jt: (r >> 8) as u8 % 4,
                        jf: (r >> 16) as u8 % 4,
                        k: match (r >> 24) % 4 {
                            0 => (r >> 32) as u32,
                            _ => (r >> 32) as u32 % 80,
                        },
                    }
                })
                .collect();
            if let Ok(p) = Program::new(insns) {
                valid += 1;
                let len = (rnd() % 100) as usize;
                let pkt: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
                accepted += usize::from(p.run(&pkt) != 0);
            }
        }
        assert!(
            valid > 300 && accepted > 100,
            "{valid} valid, {accepted} accepted"
        );
    }

    #[test]
    fn the_ring_is_bounded() {
        assert_eq!(Ring::new(65535).slots(), MIN_SLOTS);
        assert_eq!(Ring::new(96).slots(), MAX_SLOTS);
        assert_eq!(Ring::new(2048).slots(), 2048);
    }
}
