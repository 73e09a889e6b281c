//! TCP tracking with the semantics of Linux's `nf_conntrack_proto_tcp` (our own code).
//!
//! A connection is one [`TcpConn`]: its [`TcpState`] and per direction a [`Side`] (what that
//! direction has sent: `end`, the highest sequence plus length; `maxend`, the right edge of
//! the window its peer advertised; `maxwin`, its largest window; its window scale and the
//! options its SYN carried). Each segment is classified as SYN, SYN-ACK, FIN, ACK, RST or none
//! ([`Index`]) and looked up in the per-direction transition table [`next_state`]; an
//! *invalid* transition marks the packet invalid without changing anything, an *ignored* one
//! lets it through without changing the state (the endpoints may be in sync while we are not),
//! anything else must then pass the window checks (Guido van Rooij's, as
//! Linux applies them: upper and lower bounds for the sequence and the (selective)
//! acknowledgement, with scaling from the SYNs and tolerance for retransmissions) before the
//! new state is taken and the timeout chosen.
//!
//! Differences from Linux: none in the decisions we track, by design, except that no
//! mid-stream pickup happens (Linux's `nf_conntrack_tcp_loose=0`, OVS's behaviour) and
//! SYN-proxy is absent. Liberal mode ([`TcpConfig::liberal`], Linux's
//! `nf_conntrack_tcp_be_liberal`) is off by default. Sequence numbers wrap: every comparison
//! is [`before`]/[`after`] on `u32` differences.
//!
//! Thread-safety: a `TcpConn` is plain data owned by its table entry, mutated under its
//! shard's lock.

use crate::tuple::{
    TcpSegment, TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG,
};

/// The tracked state of a TCP connection (Linux's names and order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum TcpState {
    None = 0,
    SynSent = 1,
    SynRecv = 2,
    Established = 3,
    FinWait = 4,
    CloseWait = 5,
    LastAck = 6,
    TimeWait = 7,
    Close = 8,
    SynSent2 = 9,
}

impl TcpState {
    pub const ALL: [TcpState; 10] = [
        TcpState::None,
        TcpState::SynSent,
        TcpState::SynRecv,
        TcpState::Established,
        TcpState::FinWait,
        TcpState::CloseWait,
        TcpState::LastAck,
        TcpState::TimeWait,
        TcpState::Close,
        TcpState::SynSent2,
    ];

    /// The state with this number, if any.
    pub fn from_u8(v: u8) -> Option<TcpState> {
        TcpState::ALL.get(usize::from(v)).copied()
    }

    /// The name `conntrack -L` prints.
    pub fn name(self) -> &'static str {
        match self {
            TcpState::None => "NONE",
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait => "FIN_WAIT",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
            TcpState::SynSent2 => "SYN_SENT2",
        }
    }
}

/// The class of a segment in the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Index {
    Syn = 0,
    SynAck = 1,
    Fin = 2,
    Ack = 3,
    Rst = 4,
    None = 5,
}

impl Index {
    pub fn of(flags: u8) -> Index {
        if flags & TCP_RST != 0 {
            Index::Rst
        } else if flags & TCP_SYN != 0 {
            if flags & TCP_ACK != 0 {
                Index::SynAck
            } else {
                Index::Syn
            }
        } else if flags & TCP_FIN != 0 {
            Index::Fin
        } else if flags & TCP_ACK != 0 {
            Index::Ack
        } else {
            Index::None
        }
    }
}

/// What the transition table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    To(TcpState),
    /// Let the packet through without changing the state.
    Ignore,
    Invalid,
}

/// The direction of a packet relative to the connection's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Original = 0,
    Reply = 1,
}

impl Dir {
    fn idx(self) -> usize {
        self as usize
    }
    fn other(self) -> Dir {
        match self {
            Dir::Original => Dir::Reply,
            Dir::Reply => Dir::Original,
        }
    }
}

/// The per-direction transition table (columns: the current state in [`TcpState`] order).
pub fn next_state(dir: Dir, index: Index, state: TcpState) -> Next {
    use Next::{Ignore as IG, Invalid as IV};
    use TcpState::*;
    const NO: Next = Next::To(None);
    const SS: Next = Next::To(SynSent);
    const SR: Next = Next::To(SynRecv);
    const ES: Next = Next::To(Established);
    const FW: Next = Next::To(FinWait);
    const CW: Next = Next::To(CloseWait);
    const LA: Next = Next::To(LastAck);
    const TW: Next = Next::To(TimeWait);
    const CL: Next = Next::To(Close);
    const S2: Next = Next::To(SynSent2);
    let _ = NO;
    //                   NO  SS  SR  ES  FW  CW  LA  TW  CL  S2
    const ORIG: [[Next; 10]; 6] = [
        /* syn    */ [SS, SS, IG, IG, IG, IG, IG, SS, SS, S2],
        /* synack */ [IV, IV, SR, IV, IV, IV, IV, IV, IV, SR],
        /* fin    */ [IV, IV, FW, FW, LA, LA, LA, TW, CL, IV],
        /* ack    */ [ES, IV, ES, ES, CW, CW, TW, TW, CL, IV],
        /* rst    */ [IV, CL, CL, CL, CL, CL, CL, CL, CL, CL],
        /* none   */ [IV; 10],
    ];
    const REPLY: [[Next; 10]; 6] = [
        /* syn    */ [IV, S2, IV, IV, IV, IV, IV, SS, IV, S2],
        /* synack */ [IV, SR, IG, IG, IG, IG, IG, IG, IG, SR],
        /* fin    */ [IV, IV, FW, FW, LA, LA, LA, TW, CL, IV],
        /* ack    */ [IV, IG, SR, ES, CW, CW, TW, TW, CL, IG],
        /* rst    */ [IV, CL, CL, CL, CL, CL, CL, CL, CL, CL],
        /* none   */ [IV; 10],
    ];
    let t = if dir == Dir::Original { &ORIG } else { &REPLY };
    t[index as usize][state as usize]
}

/// Side flags.
pub const F_WINDOW_SCALE: u8 = 0x01;
pub const F_SACK_PERM: u8 = 0x02;
pub const F_CLOSE_INIT: u8 = 0x04;
pub const F_BE_LIBERAL: u8 = 0x08;
pub const F_DATA_UNACKNOWLEDGED: u8 = 0x10;
pub const F_MAXACK_SET: u8 = 0x20;
/// Connection flags (`last_flags`).
const L_SIMULTANEOUS_OPEN: u8 = 0x04;
const L_CHALLENGE_ACK: u8 = 0x40;

const MAX_WSCALE: u8 = 14;
const MAXACKWINCONST: u32 = 66000;
const TCPOPT_EOL: u8 = 0;
const TCPOPT_NOP: u8 = 1;
const TCPOPT_WINDOW: u8 = 3;
const TCPOPT_SACK_PERM: u8 = 4;
const TCPOPT_SACK: u8 = 5;
const TCPOPT_TIMESTAMP: u8 = 8;

/// What one direction has sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Side {
    pub end: u32,
    pub maxend: u32,
    pub maxwin: u32,
    pub maxack: u32,
    pub scale: u8,
    pub flags: u8,
}

/// `a` is before `b` in sequence space.
pub fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a` is after `b` in sequence space.
pub fn after(a: u32, b: u32) -> bool {
    before(b, a)
}

/// The per-state timeouts in seconds, Linux's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TcpTimeouts {
    pub syn_sent: u32,
    pub syn_recv: u32,
    pub established: u32,
    pub fin_wait: u32,
    pub close_wait: u32,
    pub last_ack: u32,
    pub time_wait: u32,
    pub close: u32,
    pub syn_sent2: u32,
    /// After `max_retrans` retransmissions without an acceptable ACK, or a zero window.
    pub retrans: u32,
    /// While data is unacknowledged.
    pub unack: u32,
}

impl Default for TcpTimeouts {
    fn default() -> Self {
        TcpTimeouts {
            syn_sent: 120,
            syn_recv: 60,
            established: 5 * 24 * 3600,
            fin_wait: 120,
            close_wait: 60,
            last_ack: 30,
            time_wait: 120,
            close: 10,
            syn_sent2: 120,
            retrans: 300,
            unack: 300,
        }
    }
}

impl TcpTimeouts {
    pub fn of(&self, s: TcpState) -> u32 {
        match s {
            TcpState::None | TcpState::SynSent => self.syn_sent,
            TcpState::SynRecv => self.syn_recv,
            TcpState::Established => self.established,
            TcpState::FinWait => self.fin_wait,
            TcpState::CloseWait => self.close_wait,
            TcpState::LastAck => self.last_ack,
            TcpState::TimeWait => self.time_wait,
            TcpState::Close => self.close,
            TcpState::SynSent2 => self.syn_sent2,
        }
    }

    /// The longest timeout (restored expiries are capped by it).
    pub fn max(&self) -> u32 {
        TcpState::ALL
            .iter()
            .map(|s| self.of(*s))
            .chain([self.retrans, self.unack])
            .max()
            .unwrap_or(0)
    }
}

/// TCP tracking options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// Accept out-of-window segments except RSTs (`nf_conntrack_tcp_be_liberal`).
    pub liberal: bool,
    /// Retransmissions before the shorter `retrans` timeout applies.
    pub max_retrans: u8,
    pub timeouts: TcpTimeouts,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            liberal: false,
            max_retrans: 3,
            timeouts: TcpTimeouts::default(),
        }
    }
}

/// What the connection-level flags say about the connection (kept by the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnFlags {
    pub seen_reply: bool,
    pub assured: bool,
}

/// The verdict of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// In window: the state may have changed; refresh the entry's timeout to `timeout`
    /// seconds (None: keep it, a retransmitted SYN must not keep an entry alive).
    Accept {
        timeout: Option<u32>,
        /// The packet answers with RST before any reply: delete the entry after it.
        kill: bool,
        set_assured: bool,
    },
    /// Let through, the state unchanged.
    Ignore,
    /// Invalid: the state unchanged.
    Invalid,
    /// A SYN reopening a closed connection: delete the entry and track it anew.
    Reopen,
}

/// Whether the flag combination is one TCP allows (Linux's `tcp_valid_flags`; PSH, ECE and
/// CWR never matter).
pub fn valid_flags(flags: u8) -> bool {
    let f = flags & !(TCP_ECE | TCP_CWR | TCP_PSH);
    const FIN: u8 = TCP_FIN;
    const SYN: u8 = TCP_SYN;
    const RST: u8 = TCP_RST;
    const ACK: u8 = TCP_ACK;
    const URG: u8 = TCP_URG;
    matches!(
        f,
        SYN | 0x22 // SYN|URG
            | 0x12 // SYN|ACK
            | RST
            | 0x14 // RST|ACK
            | 0x11 // FIN|ACK
            | 0x31 // FIN|ACK|URG
            | ACK
            | 0x30 // ACK|URG
    ) && (f & !(FIN | SYN | RST | ACK | URG)) == 0
}

/// One TCP connection's tracking state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConn {
    pub state: TcpState,
    pub sides: [Side; 2],
    pub last_dir: u8,
    pub last_index: u8,
    pub last_seq: u32,
    pub last_ack: u32,
    pub last_end: u32,
    pub last_win: u16,
    pub last_wscale: u8,
    pub last_flags: u8,
    pub retrans: u8,
}

fn seg_end(s: &TcpSegment<'_>) -> u32 {
    s.seq
        .wrapping_add(s.payload_len)
        .wrapping_add(u32::from(s.flags & TCP_SYN != 0))
        .wrapping_add(u32::from(s.flags & TCP_FIN != 0))
}

/// Window scale and SACK-permitted from a SYN's options into `side` (bounded walk).
fn parse_options(opts: &[u8], side: &mut Side) {
    side.scale = 0;
    side.flags &= F_BE_LIBERAL;
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            TCPOPT_EOL => return,
            TCPOPT_NOP => i += 1,
            kind => {
                let Some(&len) = opts.get(i + 1) else { return };
                let len = usize::from(len);
                if len < 2 || i + len > opts.len() {
                    return;
                }
                if kind == TCPOPT_SACK_PERM && len == 2 {
                    side.flags |= F_SACK_PERM;
                } else if kind == TCPOPT_WINDOW && len == 3 {
                    side.scale = opts[i + 2].min(MAX_WSCALE);
                    side.flags |= F_WINDOW_SCALE;
                }
                i += len;
            }
        }
    }
}

/// The highest right edge among the SACK blocks, if higher than `sack`.
fn highest_sack(opts: &[u8], mut sack: u32) -> u32 {
    // Timestamps alone (NOP NOP TS 10): the common case, nothing to find.
    if opts.len() == 12 && opts[..4] == [TCPOPT_NOP, TCPOPT_NOP, TCPOPT_TIMESTAMP, 10] {
        return sack;
    }
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            TCPOPT_EOL => break,
            TCPOPT_NOP => i += 1,
            kind => {
                let Some(&len) = opts.get(i + 1) else { break };
                let len = usize::from(len);
                if len < 2 || i + len > opts.len() {
                    break;
                }
                if kind == TCPOPT_SACK && len >= 10 && (len - 2) % 8 == 0 {
                    for block in opts[i + 2..i + len].chunks_exact(8) {
                        let right = u32::from_be_bytes([block[4], block[5], block[6], block[7]]);
                        if after(right, sack) {
                            sack = right;
                        }
                    }
                    break;
                }
                i += len;
            }
        }
    }
    sack
}

enum WindowCheck {
    Accept,
    Ignore,
    Invalid,
}

impl TcpConn {
    /// The state for a connection's first segment, or None when it may not open one (only a
    /// SYN does: no mid-stream pickup). The segment is then passed to [`TcpConn::update`] in the
    /// original direction, as Linux does.
    pub fn new(seg: &TcpSegment<'_>) -> Option<TcpConn> {
        if !valid_flags(seg.flags)
            || next_state(Dir::Original, Index::of(seg.flags), TcpState::None)
                != Next::To(TcpState::SynSent)
        {
            return None;
        }
        let end = seg_end(seg);
        let mut s0 = Side {
            end,
            maxend: end,
            maxwin: u32::from(seg.window).max(1),
            ..Side::default()
        };
        parse_options(seg.options, &mut s0);
        Some(TcpConn {
            state: TcpState::None,
            sides: [s0, Side::default()],
            last_dir: 0,
            last_index: Index::None as u8,
            last_seq: 0,
            last_ack: 0,
            last_end: 0,
            last_win: 0,
            last_wscale: 0,
            last_flags: 0,
            retrans: 0,
        })
    }

    /// Whether the connection is established and assured (Linux's
    /// `nf_conntrack_tcp_established`).
    fn established(&self, flags: ConnFlags) -> bool {
        self.state == TcpState::Established && flags.assured
    }

    fn init_sender(&mut self, dir: Dir, seg: &TcpSegment<'_>, end: u32) {
        let d = dir.idx();
        let sender = &mut self.sides[d];
        sender.end = end;
        sender.maxend = end;
        sender.maxwin = u32::from(seg.window).max(1);
        parse_options(seg.options, sender);
        // Scaling only when both SYNs offered it (RFC 1323).
        let both = self.sides[0].flags & self.sides[1].flags & F_WINDOW_SCALE != 0;
        if dir == Dir::Reply && !both {
            self.sides[0].scale = 0;
            self.sides[1].scale = 0;
        }
    }

    fn invalid_or_liberal(&self, dir: Dir, cfg: &TcpConfig, res: WindowCheck) -> WindowCheck {
        if cfg.liberal || self.sides[dir.idx()].flags & F_BE_LIBERAL != 0 {
            WindowCheck::Accept
        } else {
            res
        }
    }

    /// The window checks; updates the sides when the segment is acceptable.
    fn in_window(
        &mut self,
        dir: Dir,
        index: Index,
        seg: &TcpSegment<'_>,
        cfg: &TcpConfig,
    ) -> WindowCheck {
        let (d, r) = (dir.idx(), dir.other().idx());
        let mut seq = seg.seq;
        let mut ack = seg.ack;
        let mut sack = ack;
        let win_raw = seg.window;
        let mut win = u32::from(win_raw);
        let mut end = seg_end(seg);
        let has_ack = seg.flags & TCP_ACK != 0;
        let syn = seg.flags & TCP_SYN != 0;
        if self.sides[r].flags & F_SACK_PERM != 0 {
            sack = highest_sack(seg.options, sack);
        }

        if self.sides[d].maxwin == 0 {
            if syn {
                self.init_sender(dir, seg, end);
                if !has_ack {
                    // Simultaneous open.
                    return WindowCheck::Accept;
                }
            } else {
                // Mid-stream (only reachable from a restored or picked-up entry).
                let scale = self.sides[d].scale;
                let swin = win << scale;
                let sender = &mut self.sides[d];
                sender.end = end;
                sender.maxwin = swin.max(1);
                sender.maxend = end.wrapping_add(sender.maxwin);
                if self.sides[r].maxwin == 0 {
                    self.sides[r].end = sack;
                    self.sides[r].maxend = sack;
                } else if sack == self.sides[r].end.wrapping_add(1) {
                    self.sides[r].end = self.sides[r].end.wrapping_add(1);
                }
            }
        } else if syn
            && after(end, self.sides[d].end)
            && matches!(self.state, TcpState::SynSent | TcpState::SynRecv)
        {
            // A new SYN (or SYN-ACK) with higher sequence numbers: re-initialise.
            self.init_sender(dir, seg, end);
            if dir == Dir::Reply && !has_ack {
                return WindowCheck::Accept;
            }
        }

        if !has_ack || (seg.flags & TCP_RST != 0 && ack == 0) {
            // No ACK (or a broken stack's RST|ACK with ack 0): pretend it acked everything.
            ack = self.sides[r].end;
            sack = ack;
        }
        if seg.flags & TCP_RST != 0 && seq == 0 && self.state == TcpState::SynSent {
            // A RST answering a SYN.
            seq = self.sides[d].end;
            end = seq;
        }

        let sender = self.sides[d];
        let receiver = self.sides[r];
        let maxackwin = sender.maxwin.max(MAXACKWINCONST);
        let seq_ok = before(seq, sender.maxend.wrapping_add(1));
        if !seq_ok {
            let overshot = end.wrapping_sub(sender.maxend).wrapping_add(1);
            let ack_ok = after(sack, receiver.end.wrapping_sub(maxackwin).wrapping_sub(1));
            let in_recv_win = receiver.maxwin != 0
                && after(
                    end,
                    sender.end.wrapping_sub(receiver.maxwin).wrapping_sub(1),
                );
            if in_recv_win
                && ack_ok
                && overshot <= receiver.maxwin
                && before(sack, receiver.end.wrapping_add(1))
            {
                // More bytes than the receive window allows: ignored, but remember the end
                // so that the peer's ACK of it stays acceptable.
                self.sides[d].end = end;
                self.sides[d].flags |= F_DATA_UNACKNOWLEDGED;
                return self.invalid_or_liberal(dir, cfg, WindowCheck::Ignore);
            }
            return self.invalid_or_liberal(dir, cfg, WindowCheck::Invalid);
        }
        if !before(sack, receiver.end.wrapping_add(1)) {
            // Acknowledges data not seen yet.
            return self.invalid_or_liberal(dir, cfg, WindowCheck::Invalid);
        }
        let in_recv_win = receiver.maxwin == 0
            || after(
                end,
                sender.end.wrapping_sub(receiver.maxwin).wrapping_sub(1),
            );
        if !in_recv_win {
            // Retransmission of data already acknowledged.
            return self.invalid_or_liberal(dir, cfg, WindowCheck::Ignore);
        }
        if !after(sack, receiver.end.wrapping_sub(maxackwin).wrapping_sub(1)) {
            // An overly delayed ACK.
            return self.invalid_or_liberal(dir, cfg, WindowCheck::Ignore);
        }

        if !syn {
            win = win.wrapping_shl(u32::from(sender.scale));
        }
        // Update the sender.
        let swin = win.wrapping_add(sack.wrapping_sub(ack));
        let s = &mut self.sides[d];
        if s.maxwin < swin {
            s.maxwin = swin;
        }
        if after(end, s.end) {
            s.end = end;
            s.flags |= F_DATA_UNACKNOWLEDGED;
        }
        if has_ack {
            if s.flags & F_MAXACK_SET == 0 {
                s.maxack = ack;
                s.flags |= F_MAXACK_SET;
            } else if after(ack, s.maxack) {
                s.maxack = ack;
            }
        }
        let sender_maxend = s.maxend;
        // Update the receiver.
        let rcv = &mut self.sides[r];
        if rcv.maxwin != 0 && after(end, sender_maxend) {
            rcv.maxwin = rcv.maxwin.wrapping_add(end.wrapping_sub(sender_maxend));
        }
        if after(sack.wrapping_add(win), rcv.maxend.wrapping_sub(1)) {
            rcv.maxend = sack.wrapping_add(win);
            if win == 0 {
                rcv.maxend = rcv.maxend.wrapping_add(1);
            }
        }
        if ack == rcv.end {
            rcv.flags &= !F_DATA_UNACKNOWLEDGED;
        }
        // Retransmissions.
        if index == Index::Ack {
            if self.last_dir == d as u8
                && self.last_seq == seq
                && self.last_ack == ack
                && self.last_end == end
                && self.last_win == win_raw
            {
                self.retrans = self.retrans.saturating_add(1);
            } else {
                self.last_dir = d as u8;
                self.last_seq = seq;
                self.last_ack = ack;
                self.last_end = end;
                self.last_win = win_raw;
                self.retrans = 0;
            }
        }
        WindowCheck::Accept
    }

    /// Tracks one segment of this connection in direction `dir`.
    pub fn update(
        &mut self,
        dir: Dir,
        seg: &TcpSegment<'_>,
        conn: ConnFlags,
        cfg: &TcpConfig,
    ) -> Verdict {
        if !valid_flags(seg.flags) {
            return Verdict::Invalid;
        }
        let d = dir.idx() as u8;
        let old = self.state;
        let index = Index::of(seg.flags);
        let mut old_state = old;
        let mut next = next_state(dir, index, old);
        let mut skip_window = false;

        if next == Next::To(TcpState::SynSent) && old >= TcpState::TimeWait {
            // A SYN on a closed or aborted connection: reopen when it was really closed.
            let closing = (self.sides[0].flags | self.sides[1].flags) & F_CLOSE_INIT != 0;
            if closing || (self.last_dir == d && self.last_index == Index::Rst as u8) {
                return Verdict::Reopen;
            }
            next = Next::Ignore;
        }
        match next {
            Next::Ignore => {
                if index == Index::SynAck
                    && self.last_index == Index::Syn as u8
                    && self.last_dir != d
                    && seg.ack == self.last_end
                {
                    // This SYN-ACK answers a SYN we ignored: the endpoints are in sync, get
                    // in sync from what we noted of that SYN.
                    old_state = TcpState::SynSent;
                    next = Next::To(TcpState::SynRecv);
                    let ld = usize::from(self.last_dir & 1);
                    let s = &mut self.sides[ld];
                    s.end = self.last_end;
                    s.maxend = self.last_end;
                    s.maxwin = u32::from(self.last_win).max(1);
                    s.scale = self.last_wscale;
                    self.last_flags &= !L_CHALLENGE_ACK;
                    s.flags = self.last_flags;
                    let me = &mut self.sides[dir.idx()];
                    *me = Side {
                        flags: me.flags & F_BE_LIBERAL,
                        ..Side::default()
                    };
                } else {
                    self.last_index = index as u8;
                    self.last_dir = d;
                    self.last_seq = seg.seq;
                    self.last_end = seg_end(seg);
                    self.last_win = seg.window;
                    if index == Index::Syn && dir == Dir::Original {
                        let mut seen = Side::default();
                        parse_options(seg.options, &mut seen);
                        self.last_flags = 0;
                        self.last_wscale = 0;
                        if seen.flags & F_WINDOW_SCALE != 0 {
                            self.last_flags |= F_WINDOW_SCALE;
                            self.last_wscale = seen.scale;
                        }
                        if seen.flags & F_SACK_PERM != 0 {
                            self.last_flags |= F_SACK_PERM;
                        }
                        if old == TcpState::LastAck {
                            self.last_flags |= L_CHALLENGE_ACK;
                        }
                    }
                    if old == TcpState::SynSent && index == Index::Ack && dir == Dir::Reply {
                        self.last_ack = seg.ack;
                    }
                    return Verdict::Ignore;
                }
            }
            Next::Invalid => return Verdict::Invalid,
            Next::To(TcpState::TimeWait) => {
                if old == TcpState::LastAck
                    && index == Index::Ack
                    && self.last_dir != d
                    && self.last_index == Index::Syn as u8
                    && self.last_flags & L_CHALLENGE_ACK != 0
                {
                    // An RFC 5961 challenge ACK, not the ACK of the last FIN.
                    self.last_flags &= !L_CHALLENGE_ACK;
                    return Verdict::Ignore;
                }
            }
            Next::To(TcpState::SynSent2) => self.last_flags |= L_SIMULTANEOUS_OPEN,
            Next::To(TcpState::SynRecv) => {
                if dir == Dir::Reply
                    && index == Index::Ack
                    && self.last_flags & L_SIMULTANEOUS_OPEN != 0
                {
                    next = Next::To(TcpState::Established);
                }
            }
            Next::To(TcpState::Close) if index == Index::Rst => {
                let r = dir.other().idx();
                if matches!(
                    old,
                    TcpState::FinWait
                        | TcpState::LastAck
                        | TcpState::TimeWait
                        | TcpState::Close
                        | TcpState::CloseWait
                ) {
                    skip_window = true;
                } else {
                    let mut decided = false;
                    if self.sides[r].flags & F_MAXACK_SET != 0
                        && self.last_index != Index::Syn as u8
                    {
                        let seq = seg.seq;
                        if seq == 0 && !self.established(conn) {
                            decided = true;
                        } else {
                            if before(seq, self.sides[r].maxack) {
                                return Verdict::Invalid;
                            }
                            // At the expected sequence, before establishment, or part of a
                            // train of data then RST: the window check decides.
                            if !self.established(conn)
                                || seq == self.sides[r].maxack
                                || (self.last_index == Index::Ack as u8
                                    && self.last_dir == d
                                    && seq == self.last_end)
                            {
                                decided = true;
                            } else {
                                // Not exactly at the expected sequence: keep the state to
                                // allow a challenge ACK.
                                next = Next::To(old);
                            }
                        }
                    }
                    if decided {
                        // Linux's `break`: the window check decides.
                    } else if ((conn.seen_reply && self.last_index == Index::Syn as u8)
                        || (!conn.assured && self.last_index == Index::Ack as u8))
                        && seg.ack == self.last_end
                    {
                        // A RST answering a SYN or ACK we let through: skip the window.
                        skip_window = true;
                    } else if old == TcpState::SynSent
                        && self.last_index == Index::Ack as u8
                        && self.last_dir == Dir::Reply as u8
                        && seg.seq == self.last_ack
                    {
                        // A RST answering a challenge ACK we let through.
                        skip_window = true;
                    }
                }
            }
            Next::To(_) => {}
        }
        let Next::To(new) = next else {
            return Verdict::Invalid;
        };

        if !skip_window {
            match self.in_window(dir, index, seg, cfg) {
                WindowCheck::Accept => {}
                WindowCheck::Ignore => return Verdict::Ignore,
                WindowCheck::Invalid => return Verdict::Invalid,
            }
        }

        self.last_index = index as u8;
        self.last_dir = d;
        self.state = new;
        if old_state != new && new == TcpState::FinWait {
            self.sides[dir.idx()].flags |= F_CLOSE_INIT;
        }

        let t = &cfg.timeouts;
        let unacked = (self.sides[0].flags | self.sides[1].flags) & F_DATA_UNACKNOWLEDGED != 0;
        let mut timeout = if self.retrans >= cfg.max_retrans && t.of(new) > t.retrans {
            t.retrans
        } else if index == Index::Rst {
            t.close
        } else if unacked && t.of(new) > t.unack {
            t.unack
        } else if self.last_win == 0 && t.of(new) > t.retrans {
            t.retrans
        } else {
            t.of(new)
        };
        if !conn.seen_reply {
            if seg.flags & TCP_RST != 0 {
                return Verdict::Accept {
                    timeout: Some(timeout),
                    kill: true,
                    set_assured: false,
                };
            }
            if index == Index::Syn && old_state == TcpState::SynSent {
                // No refresh on a retransmitted SYN.
                return Verdict::Accept {
                    timeout: None,
                    kill: false,
                    set_assured: false,
                };
            }
            if new == TcpState::Established && timeout > t.unack {
                timeout = t.unack;
            }
            return Verdict::Accept {
                timeout: Some(timeout),
                kill: false,
                set_assured: false,
            };
        }
        // `seen_reply` here is the flag before this packet; the table sets it after a reply
        // direction packet is accepted.
        let set_assured = !conn.assured
            && matches!(old_state, TcpState::SynRecv | TcpState::Established)
            && new == TcpState::Established;
        Verdict::Accept {
            timeout: Some(timeout),
            kill: false,
            set_assured,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(seq: u32, ack: u32, flags: u8) -> TcpSegment<'static> {
        TcpSegment {
            seq,
            ack,
            flags,
            window: 1000,
            options: &[],
            payload_len: 0,
        }
    }

    fn data(seq: u32, ack: u32, n: u32) -> TcpSegment<'static> {
        TcpSegment {
            payload_len: n,
            ..seg(seq, ack, TCP_ACK)
        }
    }

    struct Conn {
        c: TcpConn,
        f: ConnFlags,
        cfg: TcpConfig,
    }

    impl Conn {
        fn open(s: &TcpSegment<'_>) -> Conn {
            let mut c = Conn {
                c: TcpConn::new(s).expect("a SYN opens"),
                f: ConnFlags::default(),
                cfg: TcpConfig::default(),
            };
            assert!(matches!(c.go(Dir::Original, s), Verdict::Accept { .. }));
            c
        }
        fn go(&mut self, dir: Dir, s: &TcpSegment<'_>) -> Verdict {
            let v = self.c.update(dir, s, self.f, &self.cfg);
            if let Verdict::Accept { set_assured, .. } = v {
                self.f.assured |= set_assured;
            }
            if dir == Dir::Reply && matches!(v, Verdict::Accept { .. } | Verdict::Ignore) {
                self.f.seen_reply = true;
            }
            v
        }
        fn handshake(isn_a: u32, isn_b: u32) -> Conn {
            let mut c = Conn::open(&seg(isn_a, 0, TCP_SYN));
            assert!(matches!(
                c.go(
                    Dir::Reply,
                    &seg(isn_b, isn_a.wrapping_add(1), TCP_SYN | TCP_ACK)
                ),
                Verdict::Accept { .. }
            ));
            assert!(matches!(
                c.go(
                    Dir::Original,
                    &seg(isn_a.wrapping_add(1), isn_b.wrapping_add(1), TCP_ACK)
                ),
                Verdict::Accept { .. }
            ));
            assert_eq!(c.c.state, TcpState::Established);
            assert!(c.f.assured);
            c
        }
    }

    #[test]
    fn only_a_syn_opens() {
        assert!(TcpConn::new(&seg(1, 0, TCP_SYN)).is_some());
        for f in [
            TCP_ACK,
            TCP_SYN | TCP_ACK,
            TCP_FIN | TCP_ACK,
            TCP_RST,
            0,
            TCP_SYN | TCP_FIN,
        ] {
            assert!(TcpConn::new(&seg(1, 0, f)).is_none(), "flags {f:#x}");
        }
    }

    #[test]
    fn flag_combinations() {
        assert!(valid_flags(TCP_SYN | TCP_ECE | TCP_CWR));
        assert!(valid_flags(TCP_ACK | TCP_PSH));
        assert!(!valid_flags(TCP_SYN | TCP_FIN));
        assert!(!valid_flags(TCP_SYN | TCP_RST));
        assert!(!valid_flags(0));
        assert!(!valid_flags(TCP_FIN));
        assert!(!valid_flags(
            TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK | TCP_URG | TCP_PSH
        ));
    }

    #[test]
    fn table_edges() {
        use TcpState::*;
        assert_eq!(
            next_state(Dir::Original, Index::Syn, TimeWait),
            Next::To(SynSent)
        );
        assert_eq!(
            next_state(Dir::Reply, Index::Syn, SynSent),
            Next::To(SynSent2)
        );
        assert_eq!(
            next_state(Dir::Original, Index::SynAck, SynSent),
            Next::Invalid
        );
        assert_eq!(next_state(Dir::Reply, Index::Ack, SynSent), Next::Ignore);
        assert_eq!(
            next_state(Dir::Original, Index::Ack, SynSent),
            Next::Invalid
        );
        for s in TcpState::ALL {
            assert_eq!(next_state(Dir::Original, Index::None, s), Next::Invalid);
            assert_eq!(next_state(Dir::Reply, Index::None, s), Next::Invalid);
        }
    }

    #[test]
    fn handshake_with_wraparound() {
        let mut c = Conn::handshake(u32::MAX - 1, u32::MAX);
        assert_eq!(c.c.sides[0].end, u32::MAX);
        assert_eq!(c.c.sides[1].end, 0);
        // Data across the wrap, acknowledged across it.
        assert!(matches!(
            c.go(Dir::Original, &data(u32::MAX, 0, 100)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.sides[0].end, 99);
        assert!(matches!(
            c.go(Dir::Reply, &seg(0, 99, TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.go(Dir::Reply, &seg(0, 100, TCP_ACK)), Verdict::Invalid);
    }

    #[test]
    fn close_sequences() {
        let mut c = Conn::handshake(100, 500);
        assert!(matches!(
            c.go(Dir::Original, &seg(101, 501, TCP_FIN | TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::FinWait);
        assert!(matches!(
            c.go(Dir::Reply, &seg(501, 102, TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::CloseWait);
        assert!(matches!(
            c.go(Dir::Reply, &seg(501, 102, TCP_FIN | TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::LastAck);
        assert!(matches!(
            c.go(Dir::Original, &seg(102, 502, TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::TimeWait);
        // A new SYN reopens.
        assert_eq!(c.go(Dir::Original, &seg(9000, 0, TCP_SYN)), Verdict::Reopen);
    }

    #[test]
    fn rst_in_and_out_of_window() {
        let mut c = Conn::handshake(100, 500);
        assert_eq!(
            c.go(Dir::Reply, &seg(50_000_000, 0, TCP_RST)),
            Verdict::Invalid
        );
        assert_eq!(c.c.state, TcpState::Established);
        assert!(matches!(
            c.go(Dir::Reply, &seg(501, 0, TCP_RST)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::Close);
    }

    #[test]
    fn rst_before_reply_kills() {
        let mut c = Conn::open(&seg(100, 0, TCP_SYN));
        let v = c.go(Dir::Reply, &seg(0, 101, TCP_RST | TCP_ACK));
        assert!(matches!(v, Verdict::Accept { kill: true, .. }), "{v:?}");
    }

    #[test]
    fn out_of_window_data_and_retransmission() {
        let mut c = Conn::handshake(100, 500);
        // 10 bytes of data, acked.
        assert!(matches!(
            c.go(Dir::Original, &data(101, 501, 10)),
            Verdict::Accept { .. }
        ));
        assert!(matches!(
            c.go(Dir::Reply, &seg(501, 111, TCP_ACK)),
            Verdict::Accept { .. }
        ));
        // Far beyond the advertised window: invalid.
        assert_eq!(
            c.go(Dir::Original, &data(101 + 10_000_000, 501, 10)),
            Verdict::Invalid
        );
        // ACK of data never sent: invalid.
        assert_eq!(
            c.go(Dir::Reply, &seg(501, 5_000_000, TCP_ACK)),
            Verdict::Invalid
        );
        // Retransmission of acked data: accepted (it is within the window's lower bound).
        assert!(matches!(
            c.go(Dir::Original, &data(101, 501, 10)),
            Verdict::Accept { .. }
        ));
        assert!(matches!(
            c.go(Dir::Original, &data(101, 501, 10)),
            Verdict::Accept { .. }
        ));
        assert!(c.c.retrans >= 1);
    }

    #[test]
    fn window_scaling_needs_both_sides() {
        let ws = [TCPOPT_WINDOW, 3, 7, TCPOPT_NOP];
        let syn = TcpSegment {
            options: &ws,
            ..seg(100, 0, TCP_SYN)
        };
        let mut c = Conn::open(&syn);
        assert_eq!(c.c.sides[0].scale, 7);
        // The SYN-ACK has no window scale: both scales drop to 0.
        c.go(Dir::Reply, &seg(500, 101, TCP_SYN | TCP_ACK));
        assert_eq!(c.c.sides[0].scale, 0);
        let mut c = Conn::open(&syn);
        let synack = TcpSegment {
            options: &ws,
            ..seg(500, 101, TCP_SYN | TCP_ACK)
        };
        c.go(Dir::Reply, &synack);
        assert_eq!((c.c.sides[0].scale, c.c.sides[1].scale), (7, 7));
        // A scaled window lets data far beyond 1000 bytes through.
        c.go(Dir::Original, &seg(101, 501, TCP_ACK));
        assert!(matches!(
            c.go(Dir::Original, &data(101, 501, 60_000)),
            Verdict::Accept { .. }
        ));
    }

    #[test]
    fn sack_and_hostile_options() {
        let opts = [TCPOPT_SACK, 10, 0, 0, 0, 1, 0, 0, 0, 9];
        assert_eq!(highest_sack(&opts, 5), 9);
        assert_eq!(highest_sack(&opts, 50), 50);
        for bad in [
            &[3u8][..],
            &[3, 0],
            &[3, 1, 1],
            &[5, 255, 1],
            &[2, 4, 5, 10, 1, 1],
            &[1; 40],
        ] {
            let mut s = Side::default();
            parse_options(bad, &mut s);
            let _ = highest_sack(bad, 0);
        }
        let mut s = Side::default();
        parse_options(&[TCPOPT_WINDOW, 3, 200], &mut s);
        assert_eq!(s.scale, MAX_WSCALE);
    }

    #[test]
    fn simultaneous_open() {
        let mut c = Conn::open(&seg(100, 0, TCP_SYN));
        assert!(matches!(
            c.go(Dir::Reply, &seg(500, 0, TCP_SYN)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::SynSent2);
        assert!(matches!(
            c.go(Dir::Original, &seg(100, 501, TCP_SYN | TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::SynRecv);
        assert!(matches!(
            c.go(Dir::Reply, &seg(501, 101, TCP_ACK)),
            Verdict::Accept { .. }
        ));
        assert_eq!(c.c.state, TcpState::Established);
    }

    #[test]
    fn liberal_accepts_out_of_window() {
        let mut c = Conn::handshake(100, 500);
        c.cfg.liberal = true;
        assert!(matches!(
            c.go(Dir::Original, &data(101 + 10_000_000, 501, 10)),
            Verdict::Accept { .. }
        ));
    }
}
