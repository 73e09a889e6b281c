//! The table as plain, versioned data (hot upgrade), and its restore as untrusted input.
//!
//! [`Tracker::export`] writes every live entry: zone, original tuple, protocol state (for TCP
//! the state and both directions' window data), flags, mark, label, the NAT binding (kind and
//! reply tuple; a defaulted field, so states written before NAT load) and the time left until it
//! expires (relative, so the clocks of the two processes need not agree). [`Tracker::restore`]
//! takes such a state from another process, which may be another version or plain wrong:
//! [`TableState::validate`] checks it all first (version, tuples, protocol states, expiries,
//! duplicates, limits), each rule with its own [`StateError`], and only then is anything
//! inserted. With the `serde` feature the types are (de)serialisable; their field names are
//! the wire format, so they only ever gain defaulted fields within a version.
//!
//! Thread-safety: export locks one shard at a time, so it is a consistent view per entry, not
//! of the whole table; the upgrade exports after the PMDs are frozen.

use std::collections::HashSet;

use crate::nat::{self, Binding, NatKind};
use crate::proto;
use crate::table::{Conn, ProtoState, Tracker};
use crate::tcp::{Side, TcpConn, TcpState};
use crate::tuple::{Family, Tuple, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};

/// The version this build writes. Version 2 added the NAT binding; this build reads 1 and 2
/// (a version 1 state has no bindings), and a build that only knows 1 refuses a version 2
/// state rather than dropping its bindings silently.
pub const STATE_VERSION: u32 = 2;
/// The oldest version this build reads.
pub const STATE_VERSION_MIN: u32 = 1;

/// A whole table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TableState {
    pub version: u32,
    pub entries: Vec<EntryState>,
}

/// A tuple as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TupleState {
    pub family: Family,
    pub proto: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
}

/// One direction of a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SideState {
    pub end: u32,
    pub maxend: u32,
    pub maxwin: u32,
    pub maxack: u32,
    pub scale: u8,
    pub flags: u8,
}

/// A TCP connection's tracking state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TcpStateData {
    pub state: u8,
    pub sides: [SideState; 2],
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

/// One connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EntryState {
    pub zone: u16,
    pub orig: TupleState,
    /// Present exactly for TCP.
    pub tcp: Option<TcpStateData>,
    pub seen_reply: bool,
    pub assured: bool,
    pub mark: u32,
    /// The 128-bit label as (high, low).
    pub label: (u64, u64),
    pub expires_in_ms: u64,
    /// The NAT binding (absent in states written before NAT, which still load).
    #[cfg_attr(feature = "serde", serde(default))]
    pub nat: Option<NatState>,
}

/// A connection's NAT binding: the kind and the translated reply tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NatState {
    pub kind: NatKind,
    pub reply: TupleState,
}

/// Why a state was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("state version {0} is not between {STATE_VERSION_MIN} and {STATE_VERSION}")]
    Version(u32),
    #[error("entry {0}: tuple is inconsistent")]
    Tuple(usize),
    #[error("entry {0}: protocol state does not match the protocol")]
    Proto(usize),
    #[error("entry {0}: TCP state {1} does not exist")]
    TcpState(usize, u8),
    #[error("entry {0}: window scale {1} above 14")]
    Scale(usize, u8),
    #[error("entry {0}: expires in {1} ms, beyond the longest timeout")]
    Expiry(usize, u64),
    #[error("entry {0}: duplicate of an earlier entry")]
    Duplicate(usize),
    #[error("{0} entries exceed the limit of {1}")]
    TooMany(usize, u32),
    #[error("zone {0}: more entries than its limit {1}")]
    ZoneLimit(u16, u32),
    #[error("entry {0}: NAT reply tuple does not fit the connection")]
    NatTuple(usize),
    #[error("entry {0}: NAT reply tuple collides with another entry's key")]
    NatCollision(usize),
    #[error("restore into a table that is not empty")]
    NotEmpty,
}

impl From<Tuple> for TupleState {
    fn from(t: Tuple) -> Self {
        TupleState {
            family: t.family,
            proto: t.proto,
            src: t.src,
            dst: t.dst,
            sport: t.sport,
            dport: t.dport,
        }
    }
}

impl From<TupleState> for Tuple {
    fn from(t: TupleState) -> Self {
        Tuple {
            family: t.family,
            proto: t.proto,
            src: t.src,
            dst: t.dst,
            sport: t.sport,
            dport: t.dport,
        }
    }
}

fn side_state(s: &Side) -> SideState {
    SideState {
        end: s.end,
        maxend: s.maxend,
        maxwin: s.maxwin,
        maxack: s.maxack,
        scale: s.scale,
        flags: s.flags,
    }
}

fn side(s: &SideState) -> Side {
    Side {
        end: s.end,
        maxend: s.maxend,
        maxwin: s.maxwin,
        maxack: s.maxack,
        scale: s.scale,
        flags: s.flags,
    }
}

impl TableState {
    /// Checks everything `restore` relies on, against the limits of `tracker`.
    pub fn validate(&self, tracker: &Tracker) -> Result<(), StateError> {
        if !(STATE_VERSION_MIN..=STATE_VERSION).contains(&self.version) {
            return Err(StateError::Version(self.version));
        }
        let cfg = tracker.config();
        if self.entries.len() > cfg.max_entries as usize {
            return Err(StateError::TooMany(self.entries.len(), cfg.max_entries));
        }
        let max_ms = u64::from(proto::max_timeout(&cfg.timeouts, &cfg.tcp)) * 1000;
        let mut seen = HashSet::with_capacity(self.entries.len());
        let mut per_zone: std::collections::HashMap<u16, u32> = Default::default();
        let mut reply_keys = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let t = Tuple::from(e.orig);
            if !t.is_valid() {
                return Err(StateError::Tuple(i));
            }
            match (t.proto, &e.tcp) {
                (IPPROTO_TCP, Some(tcp)) => {
                    if TcpState::from_u8(tcp.state).is_none() {
                        return Err(StateError::TcpState(i, tcp.state));
                    }
                    for s in &tcp.sides {
                        if s.scale > 14 {
                            return Err(StateError::Scale(i, s.scale));
                        }
                    }
                }
                (IPPROTO_TCP, None) | (_, Some(_)) => return Err(StateError::Proto(i)),
                _ => {}
            }
            if e.expires_in_ms > max_ms {
                return Err(StateError::Expiry(i, e.expires_in_ms));
            }
            if !seen.insert((e.zone, t.canonical())) {
                return Err(StateError::Duplicate(i));
            }
            if let Some(n) = &e.nat {
                let r = Tuple::from(n.reply);
                if !nat::binding_is_consistent(&t, n.kind, &r) {
                    return Err(StateError::NatTuple(i));
                }
                if r.canonical() != t.canonical() {
                    reply_keys.push((i, (e.zone, r.canonical())));
                }
            }
            *per_zone.entry(e.zone).or_default() += 1;
        }
        // A reply key must be nobody else's key, original or reply.
        for (i, k) in reply_keys {
            if !seen.insert(k) {
                return Err(StateError::NatCollision(i));
            }
        }
        for (z, n) in per_zone {
            if let Some(l) = tracker.zone_limit(z) {
                if n > l {
                    return Err(StateError::ZoneLimit(z, l));
                }
            }
        }
        Ok(())
    }
}

impl Tracker {
    /// Every live entry at `now` as plain data.
    pub fn export(&self, now: u64) -> TableState {
        let mut entries = Vec::new();
        self.for_each(|zone, c| {
            if c.expires <= now {
                return;
            }
            let tcp = match &c.proto {
                ProtoState::Tcp(t) => Some(TcpStateData {
                    state: t.state as u8,
                    sides: [side_state(&t.sides[0]), side_state(&t.sides[1])],
                    last_dir: t.last_dir,
                    last_index: t.last_index,
                    last_seq: t.last_seq,
                    last_ack: t.last_ack,
                    last_end: t.last_end,
                    last_win: t.last_win,
                    last_wscale: t.last_wscale,
                    last_flags: t.last_flags,
                    retrans: t.retrans,
                }),
                _ => None,
            };
            entries.push(EntryState {
                zone,
                orig: c.orig.into(),
                tcp,
                seen_reply: c.seen_reply,
                assured: c.assured,
                mark: c.mark,
                label: ((c.label >> 64) as u64, c.label as u64),
                expires_in_ms: c.expires - now,
                nat: c.nat.map(|b| NatState {
                    kind: b.kind,
                    reply: b.reply.into(),
                }),
            });
        });
        TableState {
            version: STATE_VERSION,
            entries,
        }
    }

    /// Restores an exported state into this (empty) table at `now`, after validation;
    /// returns the number of entries.
    pub fn restore(&self, state: &TableState, now: u64) -> Result<usize, StateError> {
        if self.counters().entries != 0 {
            return Err(StateError::NotEmpty);
        }
        state.validate(self)?;
        for (i, e) in state.entries.iter().enumerate() {
            let orig = Tuple::from(e.orig);
            let proto = match (orig.proto, &e.tcp) {
                (IPPROTO_TCP, Some(t)) => ProtoState::Tcp(TcpConn {
                    state: TcpState::from_u8(t.state).ok_or(StateError::TcpState(i, t.state))?,
                    sides: [side(&t.sides[0]), side(&t.sides[1])],
                    last_dir: t.last_dir & 1,
                    last_index: t.last_index.min(5),
                    last_seq: t.last_seq,
                    last_ack: t.last_ack,
                    last_end: t.last_end,
                    last_win: t.last_win,
                    last_wscale: t.last_wscale.min(14),
                    last_flags: t.last_flags,
                    retrans: t.retrans,
                }),
                (IPPROTO_UDP, None) => ProtoState::Udp,
                (IPPROTO_ICMP | IPPROTO_ICMPV6, None) if orig.is_icmp() => ProtoState::Icmp,
                (_, None) => ProtoState::Other,
                _ => return Err(StateError::Proto(i)),
            };
            let conn = Conn {
                orig,
                proto,
                seen_reply: e.seen_reply,
                assured: e.assured,
                mark: e.mark,
                label: (u128::from(e.label.0) << 64) | u128::from(e.label.1),
                expires: now.saturating_add(e.expires_in_ms),
                nat: e.nat.map(|n| Binding {
                    kind: n.kind,
                    reply: n.reply.into(),
                }),
            };
            if !self.insert_restored(e.zone, conn) {
                // Validation ruled out duplicates, reply-key collisions and limits; only a
                // racing packet can get here.
                self.flush(None);
                return Err(StateError::Duplicate(i));
            }
        }
        log::info!("conntrack: restored {} connections", state.entries.len());
        Ok(state.entries.len())
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use crate::build::{Frame, Proto};
    use crate::tuple::TCP_SYN;
    use crate::{Config, TableState, Tracker};

    #[test]
    fn json_round_trip() {
        let t = Tracker::new(Config::default());
        let f = Frame::v6(1, 2, Proto::tcp(1, 2, 3, 0, TCP_SYN)).bytes();
        t.execute(&f, 7, true, 0);
        let s = t.export(0);
        let j = serde_json::to_string(&s).unwrap();
        let back: TableState = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
        let u = Tracker::new(Config::default());
        assert_eq!(u.restore(&back, 0), Ok(1));
    }

    fn nat_table() -> (Tracker, Vec<u8>) {
        use crate::nat::{Nat, NatKind, NatRange};
        let t = Tracker::new(Config::default());
        let n = std::net::IpAddr::from([198, 51, 100, 1]);
        let nat = Nat::Bind(NatRange::addr(NatKind::Src, n).with_ports(5000, 5000));
        let mut f = Frame::v4([10, 0, 0, 1], [192, 0, 2, 80], Proto::udp(7, 53, b"q")).bytes();
        assert!(
            t.execute_nat(&mut f, 3, &crate::Commit::COMMIT, &nat, 0)
                .committed
        );
        let mut g = Frame::v4([10, 0, 0, 2], [192, 0, 2, 80], Proto::udp(7, 53, b"q")).bytes();
        let nat = Nat::Bind(NatRange::addr(NatKind::Src, n).with_ports(5001, 5001));
        assert!(
            t.execute_nat(&mut g, 3, &crate::Commit::COMMIT, &nat, 0)
                .committed
        );
        let reply = Frame::v4(
            [192, 0, 2, 80],
            [198, 51, 100, 1],
            Proto::udp(53, 5000, b"a"),
        );
        (t, reply.bytes())
    }

    #[test]
    fn bindings_survive_export_and_restore() {
        use crate::nat::Nat;
        let (t, reply) = nat_table();
        let s = t.export(0);
        assert!(s.entries.iter().all(|e| e.nat.is_some()));
        let j = serde_json::to_string(&s).unwrap();
        let back: TableState = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
        let u = Tracker::new(Config::default());
        assert_eq!(u.restore(&back, 10), Ok(2));
        // The restored connection's reply is found by its translated tuple and translated.
        let mut b = reply.clone();
        let r = u.execute_nat(&mut b, 3, &crate::Commit::LOOKUP, &Nat::Apply, 20);
        assert_eq!(r.state.to_string(), "est+rpl+trk+dnat");
        let want = Frame::v4([192, 0, 2, 80], [10, 0, 0, 1], Proto::udp(53, 7, b"a"));
        assert_eq!(b, want.bytes());
        assert_eq!(u.export(20).entries.len(), 2);
    }

    #[test]
    fn a_state_written_before_nat_loads() {
        let t = Tracker::new(Config::default());
        let f = Frame::v4([1, 0, 0, 1], [1, 0, 0, 2], Proto::udp(1, 2, b"")).bytes();
        t.execute(&f, 0, true, 0);
        let mut v: serde_json::Value = serde_json::to_value(t.export(0)).unwrap();
        for e in v["entries"].as_array_mut().unwrap() {
            e.as_object_mut().unwrap().remove("nat");
        }
        v["version"] = 1.into();
        let old: TableState = serde_json::from_value(v).unwrap();
        assert!(old.entries[0].nat.is_none());
        assert_eq!(Tracker::new(Config::default()).restore(&old, 0), Ok(1));
    }

    #[test]
    fn hostile_bindings_are_refused() {
        use crate::state::{StateError, TupleState};
        use crate::tuple::Tuple;
        let (t, _) = nat_table();
        let good = t.export(0);
        let refused = |s: &TableState, want: StateError| {
            let u = Tracker::new(Config::default());
            assert_eq!(u.restore(s, 0), Err(want));
            assert_eq!(u.counters().entries, 0);
            assert!(u.export(0).entries.is_empty());
        };
        // Two connections with the same reply tuple.
        let mut s = good.clone();
        s.entries[1].nat = s.entries[0].nat;
        refused(&s, StateError::NatCollision(1));
        // A reply key that is another connection's own key.
        let mut s = good.clone();
        let other: Tuple = s.entries[1].orig.into();
        let mut n0 = s.entries[0].nat.unwrap();
        let mut r: Tuple = n0.reply.into();
        r.dst = other.src;
        r.dport = other.sport;
        n0.reply = TupleState::from(r);
        s.entries[0].nat = Some(n0);
        refused(&s, StateError::NatCollision(0));
        // A binding that changes what its kind cannot (SNAT moving the server's port).
        let mut s = good.clone();
        let mut n0 = s.entries[0].nat.unwrap();
        n0.reply.sport ^= 1;
        s.entries[0].nat = Some(n0);
        refused(&s, StateError::NatTuple(0));
        // Garbage in the padding of an IPv4 address; another protocol.
        let mut s = good.clone();
        let mut n0 = s.entries[0].nat.unwrap();
        n0.reply.dst[9] = 1;
        s.entries[0].nat = Some(n0);
        refused(&s, StateError::NatTuple(0));
        let mut s = good.clone();
        let mut n0 = s.entries[0].nat.unwrap();
        n0.reply.proto = 6;
        s.entries[0].nat = Some(n0);
        refused(&s, StateError::NatTuple(0));
    }
}
