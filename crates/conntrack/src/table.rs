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
//! NAT ([`Tracker::execute_nat`]): a connection committed with `nat(...)` carries a binding,
//! its translated reply tuple, and is keyed under two keys: its own (the canonical original
//! tuple) holds the connection, the reply tuple's canonical key holds an alias naming the
//! owner key. The two keys may be in different shards; a packet that meets an alias releases
//! that shard before it locks the owner's, so locks are still never nested, and an alias
//! whose owner went away in between is stale and removed. The search for a free reply tuple
//! at commit locks each candidate's shard in turn (with the original key's shard released)
//! and reserves the first free key by inserting the alias; see `docs/conntrack.md`.

use std::collections::hash_map::{Entry, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::live::Live;
use crate::nat::{self, Binding, Nat, NatError, NatKind, NatRange};
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
    /// The packet's source was translated (SNAT's original direction, DNAT's replies).
    pub const SNAT: u8 = 0x40;
    /// The packet's destination was translated (DNAT's original direction, SNAT's replies).
    pub const DNAT: u8 = 0x80;

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
            (Self::SNAT, "snat"),
            (Self::DNAT, "dnat"),
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
    /// Why a commit with NAT was refused (the packet stays `new`, `committed` false).
    pub nat_error: Option<NatError>,
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
            nat_error: None,
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
    /// The NAT binding, if committed with NAT.
    pub nat: Option<Binding>,
}

impl Conn {
    /// The tuple of the reply direction as it travels (translated by NAT).
    pub fn reply(&self) -> Tuple {
        self.nat.map_or_else(|| self.orig.reverse(), |b| b.reply)
    }
}

/// What a key holds: the connection, or (the reply key of a NATed connection) the canonical
/// tuple of the key that holds it, in the same zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Conn(Conn),
    Alias(Tuple),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    pub zone: u16,
    pub tuple: Tuple,
}

/// Five words into the hasher: the derived impl feeds it every field and both 16-byte
/// addresses (with their lengths) one call at a time, which cost more than the rest of a
/// lookup together.
impl Hash for Key {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let t = &self.tuple;
        let head = u64::from(self.zone) << 48
            | (t.family as u64) << 40
            | u64::from(t.proto) << 32
            | u64::from(t.sport) << 16
            | u64::from(t.dport);
        let word =
            |a: &[u8; 16], i: usize| u64::from_ne_bytes(a[i..i + 8].try_into().expect("8 bytes"));
        state.write_u64(head);
        state.write_u64(word(&t.src, 0));
        state.write_u64(word(&t.src, 8));
        state.write_u64(word(&t.dst, 0));
        state.write_u64(word(&t.dst, 8));
    }
}

/// Shard maps hash with the tracker's keys (`ahash`, seeded at random per tracker): a
/// guest chooses the tuples, so the hash must be keyed, and SipHash (std's default) took
/// most of a tracked packet's cycles.
type Shard = HashMap<Key, Slot, ahash::RandomState>;

/// Gives a shard's memory back when it holds under a quarter of what it has room for (after
/// a flush, or a sweep of a flood of short-lived entries): a sweep scans every bucket, so a
/// table that once held millions would otherwise cost a sweep of millions for ever, and
/// pollute the cache the PMDs share with it.
fn fit(shard: &mut Shard) {
    if shard.capacity() > 4 * (shard.len() + 64) {
        shard.shrink_to(2 * shard.len());
    }
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub entries: u64,
    pub created: u64,
    pub invalid: u64,
    pub limit_hits: u64,
    pub expired: u64,
    /// Commits with NAT refused (no free tuple in the range, or a range that cannot apply).
    pub nat_exhausted: u64,
    /// IP fragments seen (not reassembled: each is `+trk+inv`, counted in `invalid` too).
    pub fragments: u64,
}

/// The connection tracker (see the module documentation).
#[derive(Debug)]
pub struct Tracker {
    /// Limits, timeouts and options, changed at run time ([`Tracker::reconfigure`]): every
    /// field of [`Config`] but the shard count (`shards.len()`), read from here only.
    live: Live,
    shards: Box<[Mutex<Shard>]>,
    /// Picks a key's shard; independent of the shard maps' own seeds.
    hasher: ahash::RandomState,
    /// Entries per zone.
    zone_count: Box<[AtomicU32]>,
    /// Per-zone limit overrides; `NO_OVERRIDE` uses the default.
    zone_limit: Box<[AtomicU32]>,
    entries: AtomicU64,
    created: AtomicU64,
    invalid: AtomicU64,
    limit_hits: AtomicU64,
    expired: AtomicU64,
    nat_exhausted: AtomicU64,
    fragments: AtomicU64,
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
            live: Live::new(&cfg),
            shards: (0..n)
                .map(|_| Mutex::new(HashMap::with_hasher(ahash::RandomState::new())))
                .collect(),
            hasher: ahash::RandomState::new(),
            zone_count: (0..ZONES).map(|_| AtomicU32::new(0)).collect(),
            zone_limit: (0..ZONES).map(|_| AtomicU32::new(NO_OVERRIDE)).collect(),
            entries: AtomicU64::new(0),
            created: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            limit_hits: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            nat_exhausted: AtomicU64::new(0),
            fragments: AtomicU64::new(0),
        }
    }

    /// The configuration in force (limits and timeouts as last set by
    /// [`Tracker::reconfigure`]).
    pub fn config(&self) -> Config {
        self.live.config(self.shards.len())
    }

    /// Applies every field of `cfg` but `shards` (fixed at creation) while packets are
    /// tracked: see `live.rs` for what a change does to existing entries.
    pub fn reconfigure(&self, cfg: &Config) {
        self.live.store(cfg);
    }

    /// The number of shards ([`Tracker::sweep_shard`] takes an index below it).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Entries the shards have room for without growing.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).capacity())
            .sum()
    }

    /// Zones with a limit of their own, with it (ascending zones).
    pub fn zone_limit_overrides(&self) -> Vec<(u16, u32)> {
        self.zone_limit
            .iter()
            .enumerate()
            .filter_map(|(z, l)| match l.load(Relaxed) {
                NO_OVERRIDE => None,
                l => Some((z as u16, l)),
            })
            .collect()
    }

    /// Zones with entries, with their count (ascending zones).
    pub fn zone_counts(&self) -> Vec<(u16, u32)> {
        self.zone_count
            .iter()
            .enumerate()
            .filter_map(|(z, n)| match n.load(Relaxed) {
                0 => None,
                n => Some((z as u16, n)),
            })
            .collect()
    }

    /// Sets (Some) or clears (None: the default applies) a zone's limit.
    pub fn set_zone_limit(&self, zone: u16, limit: Option<u32>) {
        let v = limit.map_or(NO_OVERRIDE, |l| l.min(NO_OVERRIDE - 1));
        self.zone_limit[usize::from(zone)].store(v, Relaxed);
    }

    /// The limit in force for a zone.
    pub fn zone_limit(&self, zone: u16) -> Option<u32> {
        match self.zone_limit[usize::from(zone)].load(Relaxed) {
            NO_OVERRIDE => self.live.default_zone_limit(),
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
            nat_exhausted: self.nat_exhausted.load(Relaxed),
            fragments: self.fragments.load(Relaxed),
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
        if global >= u64::from(self.live.max_entries()) {
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

    /// `execute` with mark and label setters applied on commit. The frame is not modified:
    /// a connection with a NAT binding is tracked but not translated (see
    /// [`Tracker::execute_nat`]).
    pub fn execute_with(&self, frame: &[u8], zone: u16, commit: &Commit, now: u64) -> CtResult {
        self.track(frame, zone, commit, &Nat::Off, now, Retry::first(false))
            .0
    }

    /// `execute_with` and NAT: `ct(commit, nat(src|dst=...))` binds a committed new
    /// connection to a translated tuple from the range, and with [`Nat::Apply`] or
    /// [`Nat::Bind`] a packet of a connection with a binding is rewritten in place (the
    /// original direction translated, the reply direction translated back, an ICMP error
    /// related to the connection translated in its outer address and quoted packet). A
    /// commit whose range has no free tuple is refused ([`CtResult::nat_error`], counted in
    /// `nat_exhausted`); the packet then stays `new` and untranslated.
    pub fn execute_nat(
        &self,
        frame: &mut [u8],
        zone: u16,
        commit: &Commit,
        nat: &Nat,
        now: u64,
    ) -> CtResult {
        self.execute_offloaded(frame, zone, commit, nat, now, false)
    }

    /// [`Tracker::execute_nat`] for a frame whose TCP or UDP checksum may be *partial*
    /// (`l4_partial`: checksum offload from a guest or NIC, the field holding only the
    /// pseudo-header sum): its L4 checksum is not verified (the IPv4 header's still is, per
    /// the configuration) and a NAT rewrite keeps it partial (see
    /// [`nat::rewrite_offloaded`]).
    pub fn execute_offloaded(
        &self,
        frame: &mut [u8],
        zone: u16,
        commit: &Commit,
        nat: &Nat,
        now: u64,
        l4_partial: bool,
    ) -> CtResult {
        let (r, x) = self.track(frame, zone, commit, nat, now, Retry::first(l4_partial));
        match x {
            Some(Xlate::Plain { from, to }) => {
                nat::rewrite_offloaded(frame, &from, &to, l4_partial)
            }
            Some(Xlate::Error {
                outer,
                inner_from,
                inner_to,
            }) => nat::rewrite_icmp_error(frame, outer, &inner_from, &inner_to),
            None => {}
        }
        r
    }

    fn inv(&self, zone: u16) -> (CtResult, Option<Xlate>) {
        self.invalid.fetch_add(1, Relaxed);
        (CtResult::invalid(zone, None), None)
    }

    /// The tracking of one packet; `depth` bounds the retries after a stale alias (and says
    /// whether the L4 checksum is partial).
    fn track(
        &self,
        frame: &[u8],
        zone: u16,
        commit: &Commit,
        nat: &Nat,
        now: u64,
        depth: Retry,
    ) -> (CtResult, Option<Xlate>) {
        let v = self.live.verify_checksums();
        let pkt = match tuple::parse_with(frame, v, v && !depth.l4_partial) {
            Ok(p) => p,
            Err(e) => {
                self.invalid.fetch_add(1, Relaxed);
                if e == Malformed::Fragment {
                    self.fragments.fetch_add(1, Relaxed);
                }
                return (CtResult::invalid(zone, Some(e)), None);
            }
        };
        if let L4::IcmpError { inner } = pkt.l4 {
            return self.related(zone, &inner, nat, now);
        }
        let key = Key {
            zone,
            tuple: pkt.tuple.canonical(),
        };
        let mut shard = self.shard_of(&key);
        // One lookup: a hit is updated in place.
        match shard.get_mut(&key) {
            Some(Slot::Alias(owner)) => {
                let owner = Key {
                    zone,
                    tuple: *owner,
                };
                drop(shard);
                return self.track_alias(frame, &pkt, key, owner, commit, nat, now, depth);
            }
            Some(Slot::Conn(conn)) => {
                if conn.expires > now {
                    let Some(dir) = direction(conn, &pkt.tuple) else {
                        drop(shard);
                        return self.inv(zone);
                    };
                    match self.update(conn, dir, &pkt, commit, nat, zone, now) {
                        Updated::Result(r, x) => return (r, x),
                        Updated::Kill(r, x) => {
                            let gone = shard.remove(&key);
                            drop(shard);
                            self.release(zone);
                            if let Some(Slot::Conn(c)) = gone {
                                self.drop_alias(zone, &c, key.tuple);
                            }
                            return (r, x);
                        }
                        Updated::Invalid => {
                            drop(shard);
                            return self.inv(zone);
                        }
                        Updated::Reopen => {}
                    }
                } else {
                    self.expired.fetch_add(1, Relaxed);
                }
                let gone = shard.remove(&key);
                self.release(zone);
                if let Some(Slot::Conn(c)) = gone {
                    if c.nat.is_some() {
                        drop(shard);
                        self.drop_alias(zone, &c, key.tuple);
                        if depth.n >= 2 {
                            return self.inv(zone);
                        }
                        return self.track(frame, zone, commit, nat, now, depth.next());
                    }
                }
            }
            None => {}
        }
        // No connection: may this packet open one?
        let proto = match pkt.l4 {
            L4::Tcp(seg) => match TcpConn::new(&seg) {
                Some(t) => ProtoState::Tcp(t),
                None => {
                    drop(shard);
                    return self.inv(zone);
                }
            },
            L4::Udp => ProtoState::Udp,
            L4::IcmpQuery { request: true } => ProtoState::Icmp,
            L4::IcmpQuery { request: false } | L4::IcmpOther | L4::IcmpError { .. } => {
                drop(shard);
                return self.inv(zone);
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
            nat: None,
        };
        let timeout = match (&mut conn.proto, pkt.l4) {
            (ProtoState::Tcp(t), L4::Tcp(seg)) => {
                let tcp = self.live.tcp();
                match t.update(Dir::Original, &seg, ConnFlags::default(), &tcp) {
                    Verdict::Accept { timeout, .. } => timeout.unwrap_or(tcp.timeouts.syn_sent),
                    _ => {
                        drop(shard);
                        return self.inv(zone);
                    }
                }
            }
            (ProtoState::Udp, _) => self.live.timeouts().udp_unreplied,
            (ProtoState::Icmp, _) => self.live.timeouts().icmp,
            _ => self.live.timeouts().generic,
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
            nat_error: None,
        };
        if !commit.commit {
            return (result, None);
        }
        if !self.reserve(zone) {
            self.limit_hits.fetch_add(1, Relaxed);
            return (result, None);
        }
        apply_commit(&mut conn, commit);
        result.mark = conn.mark;
        result.label = conn.label;
        let mut xlate = None;
        if let Nat::Bind(range) = nat {
            // The search locks the shards of candidate reply keys one at a time, so the
            // original key's shard is released meanwhile (locks are never nested).
            drop(shard);
            if let Err(e) = self.bind(zone, key.tuple, &mut conn, range) {
                self.release(zone);
                self.nat_exhausted.fetch_add(1, Relaxed);
                result.nat_error = Some(e);
                return (result, None);
            }
            shard = self.shard_of(&key);
            if shard.contains_key(&key) {
                drop(shard);
                self.drop_alias(zone, &conn, key.tuple);
                self.release(zone);
                result.nat_error = Some(NatError::Race);
                return (result, None);
            }
            xlate = translation(&conn, Dir::Original, &pkt.tuple, nat);
            result.state.0 |= nat_bits(&conn, Dir::Original);
        }
        result.committed = true;
        shard.insert(key, Slot::Conn(conn));
        self.created.fetch_add(1, Relaxed);
        (result, xlate)
    }

    /// A packet whose key is the reply key of a NATed connection: the connection is under
    /// `owner` (looked up after the alias's shard is released).
    #[allow(clippy::too_many_arguments)]
    fn track_alias(
        &self,
        frame: &[u8],
        pkt: &tuple::Packet<'_>,
        key: Key,
        owner: Key,
        commit: &Commit,
        nat: &Nat,
        now: u64,
        depth: Retry,
    ) -> (CtResult, Option<Xlate>) {
        let zone = key.zone;
        let mut shard = self.shard_of(&owner);
        let live = match shard.get(&owner) {
            Some(Slot::Conn(c)) if c.nat.map(|b| b.reply.canonical()) == Some(key.tuple) => {
                Some(c.expires > now)
            }
            _ => None,
        };
        match live {
            Some(true) => {
                if let Some(Slot::Conn(conn)) = shard.get_mut(&owner) {
                    let Some(dir) = direction(conn, &pkt.tuple) else {
                        drop(shard);
                        return self.inv(zone);
                    };
                    match self.update(conn, dir, pkt, commit, nat, zone, now) {
                        Updated::Result(r, x) => return (r, x),
                        Updated::Kill(r, x) => {
                            shard.remove(&owner);
                            drop(shard);
                            self.release(zone);
                            self.remove_alias(key, owner.tuple);
                            return (r, x);
                        }
                        Updated::Invalid => {
                            drop(shard);
                            return self.inv(zone);
                        }
                        Updated::Reopen => {
                            shard.remove(&owner);
                            drop(shard);
                            self.release(zone);
                            self.remove_alias(key, owner.tuple);
                        }
                    }
                }
            }
            Some(false) => {
                shard.remove(&owner);
                drop(shard);
                self.release(zone);
                self.expired.fetch_add(1, Relaxed);
                self.remove_alias(key, owner.tuple);
            }
            None => {
                // A stale alias (its connection went away between two locks).
                drop(shard);
                self.remove_alias(key, owner.tuple);
            }
        }
        if depth.n >= 2 {
            return self.inv(zone);
        }
        self.track(frame, zone, commit, nat, now, depth.next())
    }

    /// Finds a free reply tuple for `conn` in `range` and reserves its key (an alias to
    /// `owner`, the connection's own key).
    fn bind(
        &self,
        zone: u16,
        owner: Tuple,
        conn: &mut Conn,
        range: &NatRange,
    ) -> Result<(), NatError> {
        let ident = conn.orig.reverse();
        for r in nat::candidates(&conn.orig, range)? {
            let b = Binding {
                kind: range.kind,
                reply: r,
            };
            if r == ident {
                // Untranslated: the connection's own key covers it.
                conn.nat = Some(b);
                return Ok(());
            }
            let rk = Key {
                zone,
                tuple: r.canonical(),
            };
            if rk.tuple == owner {
                continue;
            }
            let mut s = self.shard_of(&rk);
            if let Entry::Vacant(v) = s.entry(rk) {
                v.insert(Slot::Alias(owner));
                conn.nat = Some(b);
                return Ok(());
            }
        }
        Err(NatError::Exhausted)
    }

    /// Removes the alias at `key` if it still points at `owner`.
    fn remove_alias(&self, key: Key, owner: Tuple) {
        let mut s = self.shard_of(&key);
        if matches!(s.get(&key), Some(Slot::Alias(o)) if *o == owner) {
            s.remove(&key);
        }
    }

    /// Removes the reply-key alias of a removed connection, if it has one.
    fn drop_alias(&self, zone: u16, conn: &Conn, owner: Tuple) {
        if let Some(b) = conn.nat {
            let rk = Key {
                zone,
                tuple: b.reply.canonical(),
            };
            if rk.tuple != owner {
                self.remove_alias(rk, owner);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        conn: &mut Conn,
        dir: Dir,
        pkt: &tuple::Packet<'_>,
        commit: &Commit,
        nat: &Nat,
        zone: u16,
        now: u64,
    ) -> Updated {
        let seen_reply_before = conn.seen_reply;
        let mut kill = false;
        let accepted_refresh: Option<u32>;
        match (&mut conn.proto, pkt.l4) {
            (ProtoState::Tcp(t), L4::Tcp(seg)) => {
                let flags = ConnFlags {
                    seen_reply: conn.seen_reply,
                    assured: conn.assured,
                };
                match t.update(dir, &seg, flags, &self.live.tcp()) {
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
                let (t, assured) = proto::udp_update(&self.live.timeouts(), conn.seen_reply);
                conn.assured |= assured;
                accepted_refresh = Some(t);
            }
            (ProtoState::Icmp, L4::IcmpQuery { request }) => {
                // The original direction carries the requests, the reply direction replies.
                if request != (dir == Dir::Original) {
                    return Updated::Invalid;
                }
                accepted_refresh = Some(self.live.timeouts().icmp);
            }
            (ProtoState::Other, L4::Other) => accepted_refresh = Some(self.live.timeouts().generic),
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
        let xlate = translation(conn, dir, &pkt.tuple, nat);
        if xlate.is_some() {
            bits |= nat_bits(conn, dir);
        }
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
            nat_error: None,
        };
        if kill {
            Updated::Kill(r, xlate)
        } else {
            Updated::Result(r, xlate)
        }
    }

    fn related(&self, zone: u16, inner: &Tuple, nat: &Nat, now: u64) -> (CtResult, Option<Xlate>) {
        let mut key = Key {
            zone,
            tuple: inner.canonical(),
        };
        let mut shard = self.shard_of(&key);
        if let Some(Slot::Alias(owner)) = shard.get(&key) {
            let alias = key.tuple;
            key.tuple = *owner;
            drop(shard);
            shard = self.shard_of(&key);
            match shard.get(&key) {
                Some(Slot::Conn(c)) if c.nat.map(|b| b.reply.canonical()) == Some(alias) => {}
                _ => {
                    drop(shard);
                    return self.inv(zone);
                }
            }
        }
        match shard.get(&key) {
            Some(Slot::Conn(c)) if c.expires > now => {
                let reply = c.reply();
                // The quoted packet went in the original direction (untranslated, or as
                // translated): the error comes back in the reply direction.
                let quoted_orig = *inner == c.orig || *inner == reply.reverse();
                let mut bits = CtState::TRK | CtState::REL;
                if quoted_orig {
                    bits |= CtState::RPL;
                }
                let mut xlate = None;
                if let (Some(b), false) = (c.nat, matches!(nat, Nat::Off)) {
                    let (dir, inner_to, outer) = if quoted_orig && *inner == reply.reverse() {
                        // Back to what the original side sent; the outer address of the
                        // translated side becomes the original side's view.
                        let outer = match b.kind {
                            NatKind::Src => (false, c.orig.src),
                            NatKind::Dst => (true, c.orig.dst),
                        };
                        (Dir::Reply, c.orig, outer)
                    } else if !quoted_orig && *inner == c.orig.reverse() {
                        let outer = match b.kind {
                            NatKind::Src => (true, reply.dst),
                            NatKind::Dst => (false, reply.src),
                        };
                        (Dir::Original, reply, outer)
                    } else {
                        (Dir::Original, *inner, (true, [0; 16]))
                    };
                    if inner_to != *inner {
                        bits |= nat_bits(c, dir);
                        xlate = Some(Xlate::Error {
                            outer: Some(outer),
                            inner_from: *inner,
                            inner_to,
                        });
                    }
                }
                let r = CtResult {
                    state: CtState(bits),
                    zone,
                    mark: c.mark,
                    label: c.label,
                    orig: Some(c.orig),
                    tcp_state: None,
                    committed: true,
                    malformed: None,
                    nat_error: None,
                };
                (r, xlate)
            }
            _ => {
                drop(shard);
                self.inv(zone)
            }
        }
    }

    /// Removes expired entries, one shard locked at a time; returns how many.
    pub fn sweep(&self, now: u64) -> usize {
        (0..self.shards.len())
            .map(|i| self.sweep_shard(i, now))
            .sum()
    }

    /// Removes the expired entries of shard `i` (modulo the shard count), then the reply
    /// keys of the NATed ones (each in its own shard, after this one is released).
    pub fn sweep_shard(&self, i: usize, now: u64) -> usize {
        let mut shard = self.shards[i & (self.shards.len() - 1)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut gone = Vec::new();
        shard.retain(|k, s| match s {
            Slot::Conn(c) if c.expires <= now => {
                gone.push((k.zone, k.tuple, c.nat));
                false
            }
            _ => true,
        });
        fit(&mut shard);
        drop(shard);
        for (z, owner, b) in &gone {
            self.release(*z);
            if let Some(b) = b {
                let rk = Key {
                    zone: *z,
                    tuple: b.reply.canonical(),
                };
                if rk.tuple != *owner {
                    self.remove_alias(rk, *owner);
                }
            }
        }
        self.expired.fetch_add(gone.len() as u64, Relaxed);
        gone.len()
    }

    /// `ct(commit, force)`'s first step: if the packet of `frame` belongs to a connection of
    /// `zone` in that connection's *reply* direction, the connection is ended (removed with
    /// its NAT alias), so the commit that follows tracks the packet anew with its own
    /// direction as the original (OVS's `force`). `l4_partial` as in
    /// [`Tracker::execute_offloaded`]. Returns whether one was ended. A packet of
    /// no connection, of its original direction, malformed, or an ICMP error changes
    /// nothing. Locks one shard at a time (two when the packet's key is a NAT alias).
    pub fn end_reply_conn(&self, frame: &[u8], zone: u16, l4_partial: bool) -> bool {
        let v = self.live.verify_checksums();
        let Ok(pkt) = tuple::parse_with(frame, v, v && !l4_partial) else {
            return false;
        };
        if let L4::IcmpError { .. } = pkt.l4 {
            return false;
        }
        let mut key = Key {
            zone,
            tuple: pkt.tuple.canonical(),
        };
        let mut shard = self.shard_of(&key);
        if let Some(Slot::Alias(owner)) = shard.get(&key) {
            let owner = *owner;
            drop(shard);
            key = Key { zone, tuple: owner };
            shard = self.shard_of(&key);
        }
        let reply = matches!(
            shard.get(&key),
            Some(Slot::Conn(c)) if direction(c, &pkt.tuple) == Some(Dir::Reply)
        );
        if !reply {
            return false;
        }
        let gone = shard.remove(&key);
        drop(shard);
        self.release(zone);
        if let Some(Slot::Conn(c)) = gone {
            self.drop_alias(zone, &c, key.tuple);
        }
        true
    }

    /// Removes every entry (of one zone, or all); returns how many.
    pub fn flush(&self, zone: Option<u16>) -> usize {
        let mut n = 0;
        for s in self.shards.iter() {
            let mut shard = s.lock().unwrap_or_else(|e| e.into_inner());
            let mut gone = Vec::new();
            shard.retain(|k, s| {
                let keep = zone.is_some_and(|z| z != k.zone);
                // Aliases go with their zone, uncounted.
                if !keep && matches!(s, Slot::Conn(_)) {
                    gone.push(k.zone);
                }
                keep
            });
            fit(&mut shard);
            drop(shard);
            for z in &gone {
                self.release(*z);
            }
            n += gone.len();
        }
        n
    }

    /// Visits every connection (shard by shard) with its zone.
    pub(crate) fn for_each(&self, mut f: impl FnMut(u16, &Conn)) {
        for s in self.shards.iter() {
            let shard = s.lock().unwrap_or_else(|e| e.into_inner());
            for (k, s) in shard.iter() {
                if let Slot::Conn(c) = s {
                    f(k.zone, c);
                }
            }
        }
    }

    /// Inserts a validated entry (restore); false if one of its keys is taken or a limit
    /// refuses it.
    pub(crate) fn insert_restored(&self, zone: u16, conn: Conn) -> bool {
        let key = Key {
            zone,
            tuple: conn.orig.canonical(),
        };
        let alias = conn
            .nat
            .map(|b| Key {
                zone,
                tuple: b.reply.canonical(),
            })
            .filter(|rk| rk.tuple != key.tuple);
        if let Some(rk) = alias {
            let mut s = self.shard_of(&rk);
            match s.entry(rk) {
                Entry::Occupied(_) => return false,
                Entry::Vacant(v) => {
                    v.insert(Slot::Alias(key.tuple));
                }
            }
        }
        let mut shard = self.shard_of(&key);
        let ok = match shard.entry(key) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                if self.reserve(zone) {
                    v.insert(Slot::Conn(conn));
                    true
                } else {
                    false
                }
            }
        };
        drop(shard);
        if !ok {
            if let Some(rk) = alias {
                self.remove_alias(rk, key.tuple);
            }
        }
        ok
    }

    /// The state of a connection, looked up by either direction's tuple (the reply's as
    /// translated by NAT) (tests, the CLI).
    pub fn lookup(&self, zone: u16, t: &Tuple, now: u64) -> Option<(Tuple, Option<TcpState>)> {
        let mut key = Key {
            zone,
            tuple: t.canonical(),
        };
        let mut shard = self.shard_of(&key);
        if let Some(Slot::Alias(owner)) = shard.get(&key) {
            key.tuple = *owner;
            drop(shard);
            shard = self.shard_of(&key);
        }
        match shard.get(&key) {
            Some(Slot::Conn(c)) if c.expires > now => Some((
                c.orig,
                match c.proto {
                    ProtoState::Tcp(t) => Some(t.state),
                    _ => None,
                },
            )),
            _ => None,
        }
    }

    /// A connection's NAT binding (tests, the CLI).
    pub fn binding(&self, zone: u16, orig: &Tuple) -> Option<(NatKind, Tuple)> {
        let key = Key {
            zone,
            tuple: orig.canonical(),
        };
        match self.shard_of(&key).get(&key) {
            Some(Slot::Conn(c)) => c.nat.map(|b| (b.kind, b.reply)),
            _ => None,
        }
    }
}

/// The direction of a packet with tuple `t` in `conn` (None: it shares the key but is
/// neither direction, e.g. the untranslated reply of a NATed connection).
/// How many times one packet's tracking was retried after a stale NAT alias (bounded), and
/// whether its L4 checksum is partial (not verified).
#[derive(Debug, Clone, Copy)]
struct Retry {
    n: u8,
    l4_partial: bool,
}

impl Retry {
    fn first(l4_partial: bool) -> Retry {
        Retry { n: 0, l4_partial }
    }

    fn next(self) -> Retry {
        Retry {
            n: self.n + 1,
            ..self
        }
    }
}

fn direction(conn: &Conn, t: &Tuple) -> Option<Dir> {
    if *t == conn.orig {
        Some(Dir::Original)
    } else if *t == conn.reply() {
        Some(Dir::Reply)
    } else {
        None
    }
}

/// The rewrite of a packet of `conn` in `dir`, when NAT is asked for and bound.
fn translation(conn: &Conn, dir: Dir, from: &Tuple, nat: &Nat) -> Option<Xlate> {
    if matches!(nat, Nat::Off) {
        return None;
    }
    conn.nat?;
    let to = match dir {
        Dir::Original => conn.reply().reverse(),
        Dir::Reply => conn.orig.reverse(),
    };
    Some(Xlate::Plain { from: *from, to })
}

/// The ct_state NAT bit of a translated packet: which of its addresses was rewritten
/// (SNAT's replies get their destination rewritten: `dnat`, as OVS reports).
fn nat_bits(conn: &Conn, dir: Dir) -> u8 {
    match (conn.nat.map(|b| b.kind), dir) {
        (Some(NatKind::Src), Dir::Original) | (Some(NatKind::Dst), Dir::Reply) => CtState::SNAT,
        (Some(NatKind::Dst), Dir::Original) | (Some(NatKind::Src), Dir::Reply) => CtState::DNAT,
        (None, _) => 0,
    }
}

/// How `execute_nat` rewrites the frame after tracking it.
enum Xlate {
    Plain {
        from: Tuple,
        to: Tuple,
    },
    Error {
        outer: Option<(bool, [u8; 16])>,
        inner_from: Tuple,
        inner_to: Tuple,
    },
}

enum Updated {
    Result(CtResult, Option<Xlate>),
    Kill(CtResult, Option<Xlate>),
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
