//! The tunable part of the tracker's configuration, changed while PMDs run.
//!
//! Limits, timeouts, TCP liberal mode and checksum verification are relaxed atomics: the
//! control plane stores a new value ([`crate::Tracker::reconfigure`]) and the next packet
//! reads it; no lock, no rebuilt table. A packet reads each value once where it needs it, so
//! a change in the middle of a packet may apply to part of it (one timeout old, another
//! new), which is harmless: every value is valid on its own. Only the number of shards is
//! fixed at creation.
//!
//! A change applies to what happens next: an entry keeps the deadline it got from its last
//! packet (its next packet sets one from the new timeouts), a lowered limit refuses new
//! commits until the table has shrunk below it and removes nothing. Linux's sysctls behave
//! the same.
//!
//! Timeouts have names (`tcp-established`, `udp-replied`, ...; [`TIMEOUT_NAMES`]) so that
//! the control plane can offer each as a setting without knowing the structs.
//!
//! Thread-safety: every field is an atomic; `Live` is `Sync`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering::Relaxed};

use crate::proto::Timeouts;
use crate::table::Config;
use crate::tcp::{TcpConfig, TcpTimeouts};

/// The name of every timeout, TCP's per state then the other protocols'.
pub const TIMEOUT_NAMES: [&str; 15] = [
    "tcp-syn-sent",
    "tcp-syn-recv",
    "tcp-established",
    "tcp-fin-wait",
    "tcp-close-wait",
    "tcp-last-ack",
    "tcp-time-wait",
    "tcp-close",
    "tcp-syn-sent2",
    "tcp-retrans",
    "tcp-unack",
    "udp-unreplied",
    "udp-replied",
    "icmp",
    "generic",
];

/// No limit (the default zone limit's atomic).
const UNLIMITED: u32 = u32::MAX;

fn to_array(tcp: &TcpTimeouts, o: &Timeouts) -> [u32; 15] {
    [
        tcp.syn_sent,
        tcp.syn_recv,
        tcp.established,
        tcp.fin_wait,
        tcp.close_wait,
        tcp.last_ack,
        tcp.time_wait,
        tcp.close,
        tcp.syn_sent2,
        tcp.retrans,
        tcp.unack,
        o.udp_unreplied,
        o.udp_replied,
        o.icmp,
        o.generic,
    ]
}

fn from_array(a: [u32; 15]) -> (TcpTimeouts, Timeouts) {
    let [syn_sent, syn_recv, established, fin_wait, close_wait, last_ack, time_wait, close, syn_sent2, retrans, unack, udp_unreplied, udp_replied, icmp, generic] =
        a;
    (
        TcpTimeouts {
            syn_sent,
            syn_recv,
            established,
            fin_wait,
            close_wait,
            last_ack,
            time_wait,
            close,
            syn_sent2,
            retrans,
            unack,
        },
        Timeouts {
            udp_unreplied,
            udp_replied,
            icmp,
            generic,
        },
    )
}

impl Config {
    /// The timeout named `name` ([`TIMEOUT_NAMES`]) in seconds; None for an unknown name.
    pub fn timeout(&self, name: &str) -> Option<u32> {
        let i = TIMEOUT_NAMES.iter().position(|n| *n == name)?;
        Some(to_array(&self.tcp.timeouts, &self.timeouts)[i])
    }

    /// Sets the timeout named `name` to `secs`; false (nothing changed) for an unknown name.
    pub fn set_timeout(&mut self, name: &str, secs: u32) -> bool {
        let Some(i) = TIMEOUT_NAMES.iter().position(|n| *n == name) else {
            return false;
        };
        let mut a = to_array(&self.tcp.timeouts, &self.timeouts);
        a[i] = secs;
        (self.tcp.timeouts, self.timeouts) = from_array(a);
        true
    }
}

/// The atomics (see the module documentation).
#[derive(Debug)]
pub(crate) struct Live {
    max_entries: AtomicU32,
    default_zone_limit: AtomicU32,
    verify_checksums: AtomicBool,
    liberal: AtomicBool,
    max_retrans: AtomicU8,
    timeouts: [AtomicU32; 15],
}

impl Live {
    pub fn new(cfg: &Config) -> Live {
        let l = Live {
            max_entries: AtomicU32::new(0),
            default_zone_limit: AtomicU32::new(UNLIMITED),
            verify_checksums: AtomicBool::new(true),
            liberal: AtomicBool::new(false),
            max_retrans: AtomicU8::new(0),
            timeouts: Default::default(),
        };
        l.store(cfg);
        l
    }

    /// Stores every tunable field of `cfg` (not `shards`).
    pub fn store(&self, cfg: &Config) {
        self.max_entries.store(cfg.max_entries, Relaxed);
        // A limit of u32::MAX is as good as none.
        self.default_zone_limit
            .store(cfg.default_zone_limit.unwrap_or(UNLIMITED), Relaxed);
        self.verify_checksums.store(cfg.verify_checksums, Relaxed);
        self.liberal.store(cfg.tcp.liberal, Relaxed);
        self.max_retrans.store(cfg.tcp.max_retrans, Relaxed);
        for (a, v) in self
            .timeouts
            .iter()
            .zip(to_array(&cfg.tcp.timeouts, &cfg.timeouts))
        {
            a.store(v, Relaxed);
        }
    }

    pub fn max_entries(&self) -> u32 {
        self.max_entries.load(Relaxed)
    }

    pub fn default_zone_limit(&self) -> Option<u32> {
        match self.default_zone_limit.load(Relaxed) {
            UNLIMITED => None,
            l => Some(l),
        }
    }

    pub fn verify_checksums(&self) -> bool {
        self.verify_checksums.load(Relaxed)
    }

    fn all(&self) -> (TcpTimeouts, Timeouts) {
        from_array(std::array::from_fn(|i| self.timeouts[i].load(Relaxed)))
    }

    pub fn tcp(&self) -> TcpConfig {
        TcpConfig {
            liberal: self.liberal.load(Relaxed),
            max_retrans: self.max_retrans.load(Relaxed),
            timeouts: self.all().0,
        }
    }

    pub fn timeouts(&self) -> Timeouts {
        self.all().1
    }

    /// The configuration in force, with `shards` as given.
    pub fn config(&self, shards: usize) -> Config {
        Config {
            shards,
            max_entries: self.max_entries(),
            default_zone_limit: self.default_zone_limit(),
            tcp: self.tcp(),
            timeouts: self.timeouts(),
            verify_checksums: self.verify_checksums(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_timeout_has_a_name_and_round_trips() {
        let mut c = Config::default();
        for (i, n) in TIMEOUT_NAMES.iter().enumerate() {
            assert!(c.set_timeout(n, 1000 + i as u32), "{n}");
        }
        for (i, n) in TIMEOUT_NAMES.iter().enumerate() {
            assert_eq!(c.timeout(n), Some(1000 + i as u32), "{n}");
        }
        assert_eq!(c.tcp.timeouts.established, 1002);
        assert_eq!(c.timeouts.generic, 1014);
        assert!(!c.set_timeout("tcp-nonsense", 1));
        assert_eq!(c.timeout("tcp-nonsense"), None);
        let l = Live::new(&c);
        assert_eq!(l.config(c.shards), c);
    }
}
