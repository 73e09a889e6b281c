//! The connection table and the API the datapath calls: [`Tracker::execute`].
//!
//! Layout: `2^n` shards, each a `Mutex<HashMap>` from (zone, canonical tuple) to the
//! connection; a packet locks exactly one shard (picked by a keyed hash of its key), so PMD
//! threads contend only when their packets hash to the same shard, and there is no global lock
//! on the packet path. Both directions of a connection have the same canonical tuple, so one
//! entry serves both; the entry keeps its original-direction tuple to tell the direction.
//!
//! Semantics (OVS's `ct()`): every packet through `execute` is tracked (`trk`). A packet
//! that fits no connection and may open one is `new`; only a *commit* creates the entry
//! (without commit nothing is stored). A packet of a connection is `est` once the connection
//! has seen a reply (and always in the reply direction, which is also `rpl`), `new` before.
//! An ICMP error quoting a packet of a connection is `rel` (with `rpl` when it travels in the
//! reply direction). A malformed packet, one the protocol tracker refuses (a TCP segment out
//! of window, an ACK without a connection) or an ICMP error quoting no connection is `inv`.
//!
//! Limits: a global limit and per-zone limits (a default and per-zone overrides), checked at
//! commit with atomic counters; a refused commit is counted (`limit_hits`) and the packet
//! stays `new` with [`CtResult::committed`] false. Expiry: an entry past its deadline is
//! dead to lookups at once and removed by [`Tracker::sweep`], which locks one shard at a time
//! (the PMDs never all wait for it); a lookup that meets a dead entry removes it too.
//!
//! Thread-safety: `Tracker` is `Sync`; all methods take `&self`. Counters are relaxed atomics
//! (statistics, not synchronisation). Locks are never nested, so there is no lock order.
//!
//! NAT (not done yet) fits as a per-entry binding: the entry gains the translated reply tuple
//! and is then keyed under two tuples (original and translated reply), each key pointing at
//! the same connection in the shard of its own hash; see `docs/conntrack.md`.

use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::proto::{self, Timeouts};
use crate::tcp::{ConnFlags, Dir, TcpConfig, TcpConn, TcpState, Verdict};
use crate::tuple::{self, Malformed, Tuple, L4};

/// The ct_state bits, with OVS's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct CtState(pub u8);

impl CtState {
    pub const NEW: u8 = 0x01;
    pub const EST: u8 = 0x02;
    pub const REL: u8 = 0x04;
    pub const RPL: u8 = 0x08;
    pub const INV: u8 = 0x10;
    pub const TRK: u8 = 0x20;

    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

impl std::fmt::Display for CtState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (Self::NEW, "new"),
            (Self::EST, "est"),
            (Self::REL, "rel"),
            (Self::RPL, "rpl"),
            (Self::INV, "inv"),
            (Self::TRK, "trk"),
        ];
        let mut first = true;
        for (bit, n) in names {
            if self.has(bit) {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(n)?;
                first = false;
            }
        }
        Ok(())
    }
}

/// What `execute` tells the pipeline about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtResult {
    pub state: CtState,
    pub zone: u16,
    pub mark: u32,
    pub label: u128,
    /// The connection's original-direction tuple (the `ct_nw_*`/`ct_tp_*` fields); for a
    /// `new` packet its own tuple; None when invalid.
    pub orig: Option<Tuple>,
    /// The TCP state after the packet, when it belongs to a TCP connection.
    pub tcp_state: Option<TcpState>,
    /// Whether the packet's connection is in the table after it.
    pub committed: bool,
    /// Why the packet is invalid, when a header was malformed.
    pub malformed: Option<Malformed>,
}

impl CtResult {
    fn invalid(zone: u16, malformed: Option<Malformed>) -> CtResult {
        CtResult {
            state: CtState(CtState::TRK | CtState::INV),
            zone,
            mark: 0,
            label: 0,
            orig: None,
            tcp_state: None,
            committed: false,
            malformed,
        }
    }
}

/// What a commit writes into the connection (`ct(commit, exec(set_field:...))`): `(value,
/// mask)` pairs; the masked bits are replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Commit {
    pub commit: bool,
    pub mark: Option<(u32, u32)>,
    pub label: Option<(u128, u128)>,
}

impl Commit {
    /// A plain `ct(commit)`.
    pub const COMMIT: Commit = Commit {
        commit: true,
        mark: None,
        label: None,
    };
    /// A `ct()` without commit.
    pub const LOOKUP: Commit = Commit {
        commit: false,
        mark: None,
        label: None,
    };
}

/// The tracker's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Number of shards (rounded up to a power of two, at least 1).
    pub shards: usize,
    /// Global limit of entries.
    pub max_entries: u32,
    /// Limit of entries per zone unless the zone has its own (None: unlimited).
    pub default_zone_limit: Option<u32>,
    pub tcp: TcpConfig,
    pub timeouts: Timeouts,
    /// Verify IPv4 header and L4 checksums (a wrong one is invalid).
    pub verify_checksums: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            shards: 256,
            max_entries: 1_000_000,
            default_zone_limit: None,
            tcp: TcpConfig::default(),
            timeouts: Timeouts::default(),
            verify_checksums: true,
        }
    }
}

/// The protocol part of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProtoState {
    Tcp(TcpConn),
    Udp,
    Icmp,
    Other,
}

/// One tracked connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conn {
    pub orig: Tuple,
    pub proto: ProtoState,
    pub seen_reply: bool,
    pub assured: bool,
    pub mark: u32,
    pub label: u128,
    /// Deadline in the caller's millisecond clock.
    pub expires: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub zone: u16,
    pub tuple: Tuple,
}

type Shard = HashMap<Key, Conn>;

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub entries: u64,
    pub created: u64,
    pub invalid: u64,
    pub limit_hits: u64,
    pub expired: u64,
}

/// The connection tracker (see the module documentation).
#[derive(Debug)]
pub struct Tracker {
    pub(crate) cfg: Config,
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
    /// Entries per zone.
    zone_count: Box<[AtomicU32]>,
    /// Per-zone limit overrides; `NO_OVERRIDE` uses the default.
    zone_limit: Box<[AtomicU32]>,
    entries: AtomicU64,
    created: AtomicU64,
    invalid: AtomicU64,
    limit_hits: AtomicU64,
    expired: AtomicU64,
}

const NO_OVERRIDE: u32 = u32::MAX;
const ZONES: usize = 1 << 16;

fn secs(s: u32) -> u64 {
    u64::from(s) * 1000
}

impl Tracker {
    pub fn new(cfg: Config) -> Tracker {
        let n = cfg.shards.max(1).next_power_of_two();
        Tracker {
            cfg: Config { shards: n, ..cfg },
            shards: (0..n).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            zone_count: (0..ZONES).map(|_| AtomicU32::new(0)).collect(),
            zone_limit: (0..ZONES).map(|_| AtomicU32::new(NO_OVERRIDE)).collect(),
            entries: AtomicU64::new(0),
            created: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            limit_hits: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sets (Some) or clears (None: the default applies) a zone's limit.
    pub fn set_zone_limit(&self, zone: u16, limit: Option<u32>) {
        let v = limit.map_or(NO_OVERRIDE, |l| l.min(NO_OVERRIDE - 1));
        self.zone_limit[usize::from(zone)].store(v, Relaxed);
    }

    /// The limit in force for a zone.
    pub fn zone_limit(&self, zone: u16) -> Option<u32> {
        match self.zone_limit[usize::from(zone)].load(Relaxed) {
            NO_OVERRIDE => self.cfg.default_zone_limit,
            l => Some(l),
        }
    }

    /// Entries in a zone.
    pub fn zone_entries(&self, zone: u16) -> u32 {
        self.zone_count[usize::from(zone)].load(Relaxed)
    }

    pub fn counters(&self) -> Counters {
        Counters {
            entries: self.entries.load(Relaxed),
            created: self.created.load(Relaxed),
            invalid: self.invalid.load(Relaxed),
            limit_hits: self.limit_hits.load(Relaxed),
            expired: self.expired.load(Relaxed),
        }
    }

    fn shard_of(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let h = self.hasher.hash_one(key) as usize;
        let m = &self.shards[h & (self.shards.len() - 1)];
        // A panic while holding a shard lock leaves a consistent map (no update is torn
        // across a panic point), so a poisoned lock is still usable.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves room for one entry in `zone` (global and zone limits); false when refused.
    fn reserve(&self, zone: u16) -> bool {
        let global = self.entries.fetch_add(1, Relaxed);
        if global >= u64::from(self.cfg.max_entries) {
            self.entries.fetch_sub(1, Relaxed);
            return false;
        }
        let zc = &self.zone_count[usize::from(zone)];
        let n = zc.fetch_add(1, Relaxed);
        if let Some(limit) = self.zone_limit(zone) {
            if n >= limit {
                zc.fetch_sub(1, Relaxed);
                self.entries.fetch_sub(1, Relaxed);
                return false;
            }
        }
        true
    }

    fn release(&self, zone: u16) {
        self.entries.fetch_sub(1, Relaxed);
        self.zone_count[usize::from(zone)].fetch_sub(1, Relaxed);
    }

    /// `ct(zone=zone)` or, with `commit`, `ct(commit, zone=zone)` on a frame at `now`
    /// (milliseconds of a monotonic clock).
    pub fn execute(&self, frame: &[u8], zone: u16, commit: bool, now: u64) -> CtResult {
        let c = if commit {
            Commit::COMMIT
        } else {
            Commit::LOOKUP
        };
        self.execute_with(frame, zone, &c, now)
    }

    /// `execute` with mark and label setters applied on commit.
    pub fn execute_with(&self, frame: &[u8], zone: u16, commit: &Commit, now: u64) -> CtResult {
        let pkt = match tuple::parse(frame, self.cfg.verify_checksums) {
            Ok(p) => p,
            Err(e) => {
                self.invalid.fetch_add(1, Relaxed);
                return CtResult::invalid(zone, Some(e));
            }
        };
        if let L4::IcmpError { inner } = pkt.l4 {
            return self.related(zone, &inner, now);
        }
        let key = Key {
            zone,
            tuple: pkt.tuple.canonical(),
        };
        let mut shard = self.shard_of(&key);
        if let Some(conn) = shard.get_mut(&key) {
            if conn.expires > now {
                match self.update(conn, &pkt, commit, zone, now) {
                    Updated::Result(r) => return r,
                    Updated::Kill(r) => {
                        shard.remove(&key);
                        self.release(zone);
                        return r;
                    }
                    Updated::Invalid => {
                        self.invalid.fetch_add(1, Relaxed);
                        return CtResult::invalid(zone, None);
                    }
                    Updated::Reopen => {}
                }
            } else {
                self.expired.fetch_add(1, Relaxed);
            }
            shard.remove(&key);
            self.release(zone);
        }
        // No connection: may this packet open one?
        let proto = match pkt.l4 {
            L4::Tcp(seg) => match TcpConn::new(&seg) {
                Some(t) => ProtoState::Tcp(t),
                None => {
                    self.invalid.fetch_add(1, Relaxed);
                    return CtResult::invalid(zone, None);
                }
            },
            L4::Udp => ProtoState::Udp,
            L4::IcmpQuery { request: true } => ProtoState::Icmp,
            L4::IcmpQuery { request: false } | L4::IcmpOther | L4::IcmpError { .. } => {
                self.invalid.fetch_add(1, Relaxed);
                return CtResult::invalid(zone, None);
            }
            L4::Other => ProtoState::Other,
        };
        let mut conn = Conn {
            orig: pkt.tuple,
            proto,
            seen_reply: false,
            assured: false,
            mark: 0,
            label: 0,
            expires: now,
        };
        let timeout = match (&mut conn.proto, pkt.l4) {
            (ProtoState::Tcp(t), L4::Tcp(seg)) => {
                match t.update(Dir::Original, &seg, ConnFlags::default(), &self.cfg.tcp) {
                    Verdict::Accept { timeout, .. } => {
                        timeout.unwrap_or(self.cfg.tcp.timeouts.syn_sent)
                    }
                    _ => {
                        self.invalid.fetch_add(1, Relaxed);
                        return CtResult::invalid(zone, None);
                    }
                }
            }
            (ProtoState::Udp, _) => self.cfg.timeouts.udp_unreplied,
            (ProtoState::Icmp, _) => self.cfg.timeouts.icmp,
            _ => self.cfg.timeouts.generic,
        };
        conn.expires = now.saturating_add(secs(timeout));
        let tcp_state = match conn.proto {
            ProtoState::Tcp(t) => Some(t.state),
            _ => None,
        };
        let mut result = CtResult {
            state: CtState(CtState::TRK | CtState::NEW),
            zone,
            mark: 0,
            label: 0,
            orig: Some(pkt.tuple),
            tcp_state,
            committed: false,
            malformed: None,
        };
        if !commit.commit {
            return result;
        }
        if !self.reserve(zone) {
            self.limit_hits.fetch_add(1, Relaxed);
            return result;
        }
        apply_commit(&mut conn, commit);
        result.mark = conn.mark;
        result.label = conn.label;
        result.committed = true;
        shard.insert(key, conn);
        self.created.fetch_add(1, Relaxed);
        result
    }

    fn update(
        &self,
        conn: &mut Conn,
        pkt: &tuple::Packet<'_>,
        commit: &Commit,
        zone: u16,
        now: u64,
    ) -> Updated {
        let dir = if pkt.tuple == conn.orig {
            Dir::Original
        } else {
            Dir::Reply
        };
        let seen_reply_before = conn.seen_reply;
        let mut kill = false;
        let accepted_refresh: Option<u32>;
        match (&mut conn.proto, pkt.l4) {
            (ProtoState::Tcp(t), L4::Tcp(seg)) => {
                let flags = ConnFlags {
                    seen_reply: conn.seen_reply,
                    assured: conn.assured,
                };
                match t.update(dir, &seg, flags, &self.cfg.tcp) {
                    Verdict::Accept {
                        timeout,
                        kill: k,
                        set_assured,
                    } => {
                        accepted_refresh = timeout;
                        kill = k;
                        conn.assured |= set_assured;
                    }
                    Verdict::Ignore => accepted_refresh = None,
                    Verdict::Invalid => return Updated::Invalid,
                    Verdict::Reopen => return Updated::Reopen,
                }
            }
            (ProtoState::Udp, L4::Udp) => {
                let (t, assured) = proto::udp_update(&self.cfg.timeouts, conn.seen_reply);
                conn.assured |= assured;
                accepted_refresh = Some(t);
            }
            (ProtoState::Icmp, L4::IcmpQuery { request }) => {
                // The original direction carries the requests, the reply direction replies.
                if request != (dir == Dir::Original) {
                    return Updated::Invalid;
                }
                accepted_refresh = Some(self.cfg.timeouts.icmp);
            }
            (ProtoState::Other, L4::Other) => accepted_refresh = Some(self.cfg.timeouts.generic),
            // Same key, different kind of packet (cannot happen with a consistent table).
            _ => return Updated::Invalid,
        }
        if let Some(t) = accepted_refresh {
            conn.expires = now.saturating_add(secs(t));
        }
        if dir == Dir::Reply {
            conn.seen_reply = true;
        }
        if commit.commit {
            apply_commit(conn, commit);
        }
        let mut bits = CtState::TRK;
        bits |= match dir {
            Dir::Reply => CtState::EST | CtState::RPL,
            Dir::Original if seen_reply_before => CtState::EST,
            Dir::Original => CtState::NEW,
        };
        let r = CtResult {
            state: CtState(bits),
            zone,
            mark: conn.mark,
            label: conn.label,
            orig: Some(conn.orig),
            tcp_state: match conn.proto {
                ProtoState::Tcp(t) => Some(t.state),
                _ => None,
            },
            committed: !kill,
            malformed: None,
        };
        if kill {
            Updated::Kill(r)
        } else {
            Updated::Result(r)
        }
    }

    fn related(&self, zone: u16, inner: &Tuple, now: u64) -> CtResult {
        let key = Key {
            zone,
            tuple: inner.canonical(),
        };
        let shard = self.shard_of(&key);
        match shard.get(&key) {
            Some(c) if c.expires > now => {
                // The quoted packet went in the original direction: the error comes back
                // in the reply direction.
                let mut bits = CtState::TRK | CtState::REL;
                if *inner == c.orig {
                    bits |= CtState::RPL;
                }
                CtResult {
                    state: CtState(bits),
                    zone,
                    mark: c.mark,
                    label: c.label,
                    orig: Some(c.orig),
                    tcp_state: None,
                    committed: true,
                    malformed: None,
                }
            }
            _ => {
                drop(shard);
                self.invalid.fetch_add(1, Relaxed);
                CtResult::invalid(zone, None)
            }
        }
    }

    /// Removes expired entries, one shard locked at a time; returns how many.
    pub fn sweep(&self, now: u64) -> usize {
        (0..self.shards.len())
            .map(|i| self.sweep_shard(i, now))
            .sum()
    }

    /// Removes the expired entries of shard `i` (modulo the shard count).
    pub fn sweep_shard(&self, i: usize, now: u64) -> usize {
        let mut shard = self.shards[i & (self.shards.len() - 1)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut gone = Vec::new();
        shard.retain(|k, c| {
            let keep = c.expires > now;
            if !keep {
                gone.push(k.zone);
            }
            keep
        });
        drop(shard);
        for z in &gone {
            self.release(*z);
        }
        self.expired.fetch_add(gone.len() as u64, Relaxed);
        gone.len()
    }

    /// Removes every entry (of one zone, or all); returns how many.
    pub fn flush(&self, zone: Option<u16>) -> usize {
        let mut n = 0;
        for s in self.shards.iter() {
            let mut shard = s.lock().unwrap_or_else(|e| e.into_inner());
            let mut gone = Vec::new();
            shard.retain(|k, _| {
                let keep = zone.is_some_and(|z| z != k.zone);
                if !keep {
                    gone.push(k.zone);
                }
                keep
            });
            drop(shard);
            for z in &gone {
                self.release(*z);
            }
            n += gone.len();
        }
        n
    }

    /// Visits every entry (shard by shard) with its zone.
    pub(crate) fn for_each(&self, mut f: impl FnMut(u16, &Conn)) {
        for s in self.shards.iter() {
            let shard = s.lock().unwrap_or_else(|e| e.into_inner());
            for (k, c) in shard.iter() {
                f(k.zone, c);
            }
        }
    }

    /// Inserts a validated entry (restore); false if its key is taken or a limit refuses it.
    pub(crate) fn insert_restored(&self, zone: u16, conn: Conn) -> bool {
        let key = Key {
            zone,
            tuple: conn.orig.canonical(),
        };
        let mut shard = self.shard_of(&key);
        match shard.entry(key) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                if !self.reserve(zone) {
                    return false;
                }
                v.insert(conn);
                true
            }
        }
    }

    /// The state of a connection, looked up by either direction's tuple (tests, the CLI).
    pub fn lookup(&self, zone: u16, t: &Tuple, now: u64) -> Option<(Tuple, Option<TcpState>)> {
        let key = Key {
            zone,
            tuple: t.canonical(),
        };
        let shard = self.shard_of(&key);
        shard.get(&key).filter(|c| c.expires > now).map(|c| {
            (
                c.orig,
                match c.proto {
                    ProtoState::Tcp(t) => Some(t.state),
                    _ => None,
                },
            )
        })
    }
}

enum Updated {
    Result(CtResult),
    Kill(CtResult),
    Invalid,
    Reopen,
}

fn apply_commit(conn: &mut Conn, c: &Commit) {
    if let Some((v, m)) = c.mark {
        conn.mark = (conn.mark & !m) | (v & m);
    }
    if let Some((v, m)) = c.label {
        conn.label = (conn.label & !m) | (v & m);
    }
}

#[cfg(test)]
mod tests;
