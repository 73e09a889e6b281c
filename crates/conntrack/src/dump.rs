//! The table as the operator sees it: [`Tracker::connections`] lists every live
//! connection (`ferrovs dump-conntrack`), in plain public types.
//!
//! Thread-safety: like export, it locks one shard at a time, so each entry is consistent
//! but the list is not a snapshot of the whole table at one instant; packets go on being
//! tracked meanwhile (a shard is held only while its entries are copied).

use crate::nat::NatKind;
use crate::table::{ProtoState, Tracker};
use crate::tcp::TcpState;
use crate::tuple::Tuple;

/// One connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    pub zone: u16,
    /// The original direction's tuple.
    pub orig: Tuple,
    /// The reply direction's tuple as it travels (translated by NAT).
    pub reply: Tuple,
    /// The TCP state (TCP only).
    pub tcp_state: Option<TcpState>,
    pub seen_reply: bool,
    pub assured: bool,
    pub mark: u32,
    pub label: u128,
    /// Milliseconds until it expires without further packets.
    pub expires_in_ms: u64,
    /// The kind of NAT, when committed with `nat(...)`.
    pub nat: Option<NatKind>,
}

impl Tracker {
    /// Every live connection at `now` (of one zone, or all), in no particular order.
    pub fn connections(&self, zone: Option<u16>, now: u64) -> Vec<ConnInfo> {
        let mut v = Vec::new();
        self.for_each(|z, c| {
            if c.expires <= now || zone.is_some_and(|want| want != z) {
                return;
            }
            v.push(ConnInfo {
                zone: z,
                orig: c.orig,
                reply: c.reply(),
                tcp_state: match c.proto {
                    ProtoState::Tcp(t) => Some(t.state),
                    _ => None,
                },
                seen_reply: c.seen_reply,
                assured: c.assured,
                mark: c.mark,
                label: c.label,
                expires_in_ms: c.expires - now,
                nat: c.nat.map(|b| b.kind),
            });
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use crate::build::{Frame, Proto};
    use crate::nat::{Nat, NatKind, NatRange};
    use crate::tuple::TCP_SYN;
    use crate::{Commit, Config, TcpState, Tracker};

    #[test]
    fn lists_live_connections_by_zone() {
        let t = Tracker::new(Config::default());
        let syn = Frame::v4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            Proto::tcp(1234, 80, 1, 0, TCP_SYN),
        );
        assert!(t.execute(&syn.bytes(), 5, true, 0).committed);
        let udp = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::udp(7, 53, b"q"));
        let nat =
            Nat::Bind(NatRange::addr(NatKind::Src, [192, 0, 2, 1].into()).with_ports(4000, 4000));
        let mut f = udp.bytes();
        assert!(t.execute_nat(&mut f, 0, &Commit::COMMIT, &nat, 0).committed);
        let all = t.connections(None, 1000);
        assert_eq!(all.len(), 2);
        let z5 = t.connections(Some(5), 1000);
        assert_eq!(z5.len(), 1);
        let c = z5[0];
        assert_eq!(c.tcp_state, Some(TcpState::SynSent));
        assert_eq!(c.orig.sport, 1234);
        assert_eq!(c.reply, c.orig.reverse());
        assert_eq!(c.expires_in_ms, 119_000);
        let u = t.connections(Some(0), 1000)[0];
        assert_eq!(u.nat, Some(NatKind::Src));
        assert_eq!(u.reply.dport, 4000);
        // Expired entries are not listed (even before a sweep removes them).
        assert!(t.connections(None, 200_000).is_empty());
        assert_eq!(t.zone_counts(), vec![(0, 1), (5, 1)]);
    }

    #[test]
    fn reconfigure_applies_to_new_commits() {
        let t = Tracker::new(Config::default());
        let mut c = t.config();
        c.max_entries = 1;
        c.set_timeout("udp-unreplied", 7);
        t.reconfigure(&c);
        assert_eq!(t.config().max_entries, 1);
        let a = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::udp(7, 53, b"q")).bytes();
        let b = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::udp(8, 53, b"q")).bytes();
        assert!(t.execute(&a, 0, true, 0).committed);
        assert!(!t.execute(&b, 0, true, 0).committed, "global limit of 1");
        assert_eq!(t.counters().limit_hits, 1);
        assert_eq!(t.connections(None, 0)[0].expires_in_ms, 7000);
        t.set_zone_limit(9, Some(3));
        assert_eq!(t.zone_limit_overrides(), vec![(9, 3)]);
        t.set_zone_limit(9, None);
        assert!(t.zone_limit_overrides().is_empty());
        assert_eq!(t.shard_count(), 256);
    }
}
