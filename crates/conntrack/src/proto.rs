//! The trackers of UDP, ICMP/ICMPv6 queries and every other protocol, and the timeouts of all
//! protocols ([`Timeouts`]).
//!
//! * UDP: any datagram opens a connection; until a reply is seen the entry lives
//!   `udp_unreplied` seconds (Linux: 30), after it `udp_replied` (120) and it is assured.
//! * ICMP/ICMPv6: only a query (echo, timestamp, information, address mask; ICMPv6 echo and
//!   node information) opens a connection, its reply is the reply direction, `icmp` (30)
//!   seconds. An ICMP error is never a connection of its own: the table reports it as related
//!   to the connection of the packet it quotes (`rel`), or invalid when there is none.
//!   Other ICMP messages (router or neighbour discovery) are invalid through `ct()`, as in
//!   OVS (Linux leaves some of them untracked).
//! * Anything else: one generic connection per (addresses, protocol), `generic` (600) seconds.
//!
//! Thread-safety: plain data and pure functions, mutated under the entry's shard lock.

use crate::tcp::TcpConfig;

/// Timeouts of the non-TCP protocols in seconds, Linux's defaults; the TCP ones are in
/// [`TcpConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Timeouts {
    pub udp_unreplied: u32,
    pub udp_replied: u32,
    pub icmp: u32,
    pub generic: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            udp_unreplied: 30,
            udp_replied: 120,
            icmp: 30,
            generic: 600,
        }
    }
}

/// The timeout of a UDP packet's connection after it; whether it becomes assured.
pub fn udp_update(t: &Timeouts, seen_reply: bool) -> (u32, bool) {
    if seen_reply {
        (t.udp_replied, true)
    } else {
        (t.udp_unreplied, false)
    }
}

/// The longest timeout of any protocol (restored expiries are capped by it).
pub fn max_timeout(t: &Timeouts, tcp: &TcpConfig) -> u32 {
    [
        t.udp_unreplied,
        t.udp_replied,
        t.icmp,
        t.generic,
        tcp.timeouts.max(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_timeouts() {
        let t = Timeouts::default();
        assert_eq!(udp_update(&t, false), (30, false));
        assert_eq!(udp_update(&t, true), (120, true));
        assert_eq!(max_timeout(&t, &TcpConfig::default()), 5 * 24 * 3600);
    }
}
