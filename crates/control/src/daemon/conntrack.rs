//! The connection tracker from the control thread: its settings, expiry, what the operator
//! sees of it, and its part in a hot upgrade.
//!
//! The daemon owns one [`ferrovs_conntrack::Tracker`], shared by every bridge's `ct()`
//! actions (zones keep them apart). The control thread never tracks a packet; it only:
//!
//! * applies the `ct-*` settings ([`config::conntrack_settings`]) at start, on `config set`
//!   and when OVSDB drops one, through the tracker's atomics (no rebuilt table, no pause);
//! * sweeps expired entries on its 100 ms tick, a tenth of the shards per tick in turn, so a
//!   whole sweep takes a second and a PMD waits at most for one shard's sweep (the packet
//!   path never sweeps; an expired entry is dead to lookups before it is swept);
//! * answers `dump-conntrack`, `flush-conntrack` and `conntrack-stats`;
//! * at a hot upgrade exports the table once the PMDs are frozen (so it is exact: no packet
//!   changes it after) and sends it in [`CT_CHUNK`]-entry `conntrack` messages before the
//!   positions; the new daemon validates and restores it before its PMDs start. A table
//!   that fails validation is refused whole, logged, counted (`restore_refused`,
//!   `restore_error` in `conntrack-stats`), and the upgrade goes on without it: the ports,
//!   rules and guests matter more than the connections, and a connection lost is re-created
//!   by its next SYN (an operator may prefer otherwise; `docs/conntrack.md` says how to
//!   check).
//!
//! Time: the tracker's clock is the daemon's clock in milliseconds (`Daemon::ct_now`), the
//! clock the PMDs pass to it; exported expiries are relative, so the two daemons' clocks
//! need not agree.

use ferrovs_conntrack::state::EntryState;
use ferrovs_conntrack::{ConnInfo, NatKind, TableState, Tuple};
use ferrovs_proto::reply::{
    ConntrackEntry, ConntrackStats, ConntrackTuple, ConntrackZone, FlushConntrack,
};

use super::*;

/// Entries per handover message (about 1 KiB each in JSON at most: far below
/// [`crate::upgrade::MAX_MSG`]).
pub(super) const CT_CHUNK: usize = 2048;
/// Ticks per full sweep pass of a small table: a pass takes `SWEEP_TICKS` x 100 ms.
const SWEEP_TICKS: usize = 10;
/// Entries per extra second of a pass: a pass scans every bucket of the table, so a big
/// table is swept more slowly (at most [`SWEEP_TICKS_MAX`] ticks per pass), as Linux's
/// conntrack garbage collector stretches its interval. Expired entries are dead to lookups
/// at once; only their memory and their share of the limits wait for the sweep.
const SWEEP_ENTRIES_PER_S: u64 = 100_000;
/// Ticks per pass of the biggest tables (10 s).
const SWEEP_TICKS_MAX: usize = 100;

/// The control thread's bookkeeping of the tracker.
#[derive(Debug, Default)]
pub(super) struct CtCtl {
    /// The next shard to sweep.
    sweep_at: usize,
    /// When the rate was last sampled, and `created` then.
    sampled: Option<(Instant, u64)>,
    new_per_s: f64,
    /// Connections restored at the takeover that started this daemon.
    restored: u64,
    /// Handed-over tables refused, and why the last was.
    restore_refused: u64,
    restore_error: Option<String>,
}

fn proto_name(t: &Tuple) -> String {
    match (t.proto, t.is_icmp()) {
        (6, _) => "tcp".into(),
        (17, _) => "udp".into(),
        (1, true) => "icmp".into(),
        (58, true) => "icmpv6".into(),
        (132, _) => "sctp".into(),
        (p, _) => p.to_string(),
    }
}

fn tuple(t: &Tuple) -> ConntrackTuple {
    let mut v = ConntrackTuple {
        code: None,
        dport: None,
        dst: t.dst_addr().to_string(),
        id: None,
        sport: None,
        src: t.src_addr().to_string(),
        icmp_type: None,
    };
    if t.is_icmp() {
        v.id = Some(t.sport);
        v.icmp_type = Some((t.dport >> 8) as u8);
        v.code = Some(t.dport as u8);
    } else if matches!(t.proto, 6 | 17) || t.sport != 0 || t.dport != 0 {
        v.sport = Some(t.sport);
        v.dport = Some(t.dport);
    }
    v
}

fn entry(c: &ConnInfo) -> ConntrackEntry {
    ConntrackEntry {
        assured: c.assured,
        labels: format!("{:#x}", c.label),
        mark: c.mark,
        nat: c.nat.map(|k| {
            match k {
                NatKind::Src => "src",
                NatKind::Dst => "dst",
            }
            .to_string()
        }),
        orig: tuple(&c.orig),
        proto: proto_name(&c.orig),
        reply: tuple(&c.reply),
        state: c.tcp_state.map(|s| s.name().to_string()),
        timeout: c.expires_in_ms.div_ceil(1000),
        zone: c.zone,
    }
}

/// A handed-over table being received: its entries, up to the most this tracker may hold
/// (more would be refused by validation anyway; they are counted, not kept).
#[derive(Debug, Default)]
pub(super) struct IncomingTable {
    table: Option<TableState>,
    dropped: usize,
}

impl IncomingTable {
    pub fn add(&mut self, part: TableState, max_entries: u32) {
        let t = self.table.get_or_insert_with(|| TableState {
            version: part.version,
            entries: Vec::new(),
        });
        let room = (max_entries as usize + 1).saturating_sub(t.entries.len());
        self.dropped += part.entries.len().saturating_sub(room);
        t.entries.extend(part.entries.into_iter().take(room));
    }
}

impl Daemon {
    /// The tracker's clock: the daemon's clock (whole seconds, ticked by the control thread,
    /// read by every PMD once per iteration) in milliseconds, the clock the datapath passes
    /// to the tracker (`ferrovs_datapath::flow::ct_now_ms`).
    pub(super) fn ct_now(&self) -> u64 {
        u64::from(self.clock.load(Ordering::Relaxed)) * 1000
    }

    /// Applies the `ct-*` settings to the tracker: limits and timeouts at once, zone
    /// limits set and cleared.
    pub(super) fn apply_conntrack_config(&self) {
        let (cfg, zones) = config::conntrack_settings(&self.config.other);
        self.conntrack.reconfigure(&cfg);
        for (z, _) in self.conntrack.zone_limit_overrides() {
            if !zones.iter().any(|(w, _)| *w == z) {
                self.conntrack.set_zone_limit(z, None);
            }
        }
        for (z, l) in zones {
            self.conntrack.set_zone_limit(z, Some(l));
        }
    }

    /// The tick's share of the tracker's upkeep: a tenth of the shards swept, the rate of
    /// new connections sampled once a second.
    pub(super) fn conntrack_tick(&mut self) {
        let n = self.conntrack.shard_count();
        let now = self.ct_now();
        let secs = (self.conntrack.counters().entries / SWEEP_ENTRIES_PER_S).max(1) as usize;
        let ticks = (SWEEP_TICKS * secs).min(SWEEP_TICKS_MAX);
        for _ in 0..n.div_ceil(ticks) {
            self.conntrack.sweep_shard(self.ct.sweep_at, now);
            self.ct.sweep_at = (self.ct.sweep_at + 1) % n;
        }
        let created = self.conntrack.counters().created;
        match self.ct.sampled {
            Some((at, before)) if at.elapsed() >= Duration::from_secs(1) => {
                self.ct.new_per_s =
                    created.saturating_sub(before) as f64 / at.elapsed().as_secs_f64();
                self.ct.sampled = Some((Instant::now(), created));
            }
            Some(_) => {}
            None => self.ct.sampled = Some((Instant::now(), created)),
        }
    }

    /// `dump-conntrack`: by zone, then original tuple.
    pub(super) fn dump_conntrack(&self, zone: Option<u16>) -> Vec<ConntrackEntry> {
        let mut all = self.conntrack.connections(zone, self.ct_now());
        all.sort_by_key(|c| (c.zone, c.orig));
        all.iter().map(entry).collect()
    }

    /// `flush-conntrack`.
    pub(super) fn flush_conntrack(&mut self, zone: Option<u16>) -> FlushConntrack {
        let flushed = self.conntrack.flush(zone);
        log::info!(
            "conntrack: flushed {flushed} connections{}",
            zone.map(|z| format!(" of zone {z}")).unwrap_or_default()
        );
        FlushConntrack { flushed }
    }

    /// `conntrack-stats`.
    pub(super) fn conntrack_stats(&self) -> ConntrackStats {
        let c = self.conntrack.counters();
        let cfg = self.conntrack.config();
        let unlimited = |l: Option<u32>| l.filter(|l| *l < config::CT_UNLIMITED);
        let mut zones: BTreeMap<u16, ConntrackZone> = BTreeMap::new();
        let overrides = self.conntrack.zone_limit_overrides();
        let counts = self.conntrack.zone_counts();
        for z in overrides
            .iter()
            .map(|o| o.0)
            .chain(counts.iter().map(|c| c.0))
        {
            zones.entry(z).or_insert_with(|| ConntrackZone {
                entries: self.conntrack.zone_entries(z),
                limit: unlimited(self.conntrack.zone_limit(z)),
                zone: z,
            });
        }
        ConntrackStats {
            created: c.created,
            entries: c.entries,
            expired: c.expired,
            invalid: c.invalid,
            limit_hits: c.limit_hits,
            max_entries: cfg.max_entries,
            nat_exhausted: c.nat_exhausted,
            new_per_s: self.ct.new_per_s,
            restored: self.ct.restored,
            restore_refused: self.ct.restore_refused,
            restore_error: self.ct.restore_error.clone(),
            shards: self.conntrack.shard_count(),
            timeouts: ferrovs_conntrack::TIMEOUT_NAMES
                .iter()
                .map(|n| (n.to_string(), cfg.timeout(n).unwrap_or(0)))
                .collect(),
            zone_default_limit: unlimited(cfg.default_zone_limit),
            zones: zones.into_values().collect(),
        }
    }

    /// The table as handover messages' contents (PMDs frozen): `CT_CHUNK` entries each;
    /// none when the table is empty.
    pub(super) fn export_conntrack(&self) -> Vec<TableState> {
        let all = self.conntrack.export(self.ct_now());
        let version = all.version;
        let mut parts: Vec<TableState> = Vec::new();
        let mut entries: Vec<EntryState> = all.entries;
        while !entries.is_empty() {
            let rest = entries.split_off(entries.len().min(CT_CHUNK));
            parts.push(TableState { version, entries });
            entries = rest;
        }
        parts
    }

    /// Restores a handed-over table before the PMDs start, or refuses it (see the module
    /// documentation). Expiries beyond this daemon's longest timeout are capped to it (a
    /// timeout lowered since the entry's last packet), not refused.
    pub(super) fn restore_conntrack(&mut self, incoming: IncomingTable) {
        let Some(mut st) = incoming.table else {
            return;
        };
        let cfg = self.conntrack.config();
        let max_ms = u64::from(ferrovs_conntrack::proto::max_timeout(
            &cfg.timeouts,
            &cfg.tcp,
        )) * 1000;
        for e in &mut st.entries {
            e.expires_in_ms = e.expires_in_ms.min(max_ms);
        }
        let result = if incoming.dropped > 0 {
            Err(ferrovs_conntrack::StateError::TooMany(
                st.entries.len() + incoming.dropped,
                cfg.max_entries,
            ))
        } else {
            self.conntrack.restore(&st, self.ct_now())
        };
        match result {
            Ok(n) => {
                self.ct.restored = n as u64;
                log::info!("takeover: {n} tracked connections restored");
            }
            Err(e) => {
                self.ct.restore_refused += 1;
                self.ct.restore_error = Some(e.to_string());
                log::error!(
                    "takeover: the handed-over connection table is refused ({e}); going on \
                     without its connections"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The replies, settings and the upgrade's table path of a real daemon (no PMD traffic:
    //! connections are made by calling the shared tracker, as the datapath does).
    use super::*;
    use ferrovs_conntrack::build::{Frame, Proto};
    use ferrovs_conntrack::nat::{Nat, NatRange};
    use ferrovs_conntrack::Commit;
    use ferrovs_proto::Request;

    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;

    fn daemon(name: &str) -> (Daemon, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ferrovs-ctctl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut opts = DaemonOptions::in_dir(&dir);
        opts.pmd_cores = Some(vec![*os::allowed_cpus().last().unwrap_or(&0)]);
        (Daemon::start(opts).expect("daemon starts"), dir)
    }

    fn ok(d: &mut Daemon, r: Request) -> serde_json::Value {
        let resp = d.handle(r);
        assert!(resp.ok, "{:?}", resp.error);
        serde_json::to_value(resp.result).unwrap()
    }

    fn err(d: &mut Daemon, r: Request) -> String {
        let resp = d.handle(r);
        assert!(!resp.ok);
        resp.error.unwrap()
    }

    /// A TCP handshake 10.0.0.1:1234 -> 10.0.0.2:80 in `zone`, committed.
    fn handshake(d: &Daemon, zone: u16, sport: u16) {
        let t = &d.conntrack;
        let now = d.ct_now();
        let a = |f: Proto| Frame::v4([10, 0, 0, 1], [10, 0, 0, 2], f).bytes();
        let b = |f: Proto| Frame::v4([10, 0, 0, 2], [10, 0, 0, 1], f).bytes();
        let c = Commit {
            commit: true,
            mark: Some((1, u32::MAX)),
            label: Some((0x2a, u128::MAX)),
        };
        assert!(
            t.execute_with(&a(Proto::tcp(sport, 80, 100, 0, SYN)), zone, &c, now)
                .committed
        );
        let r = t.execute(
            &b(Proto::tcp(80, sport, 500, 101, SYN | ACK)),
            zone,
            false,
            now,
        );
        assert!(r.committed);
        t.execute(&a(Proto::tcp(sport, 80, 101, 501, ACK)), zone, false, now);
    }

    #[test]
    fn dump_flush_and_stats() {
        let (mut d, dir) = daemon("dump");
        handshake(&d, 5, 1234);
        handshake(&d, 0, 1235);
        let nat =
            Nat::Bind(NatRange::addr(NatKind::Src, [192, 0, 2, 1].into()).with_ports(4000, 4000));
        let mut f = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::udp(7, 53, b"q")).bytes();
        assert!(
            d.conntrack
                .execute_nat(&mut f, 0, &Commit::COMMIT, &nat, d.ct_now())
                .committed
        );
        let mut e = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::echo(true, 9, 1)).bytes();
        assert!(
            d.conntrack
                .execute_nat(&mut e, 0, &Commit::COMMIT, &Nat::Off, d.ct_now())
                .committed
        );

        let all: Vec<ConntrackEntry> =
            serde_json::from_value(ok(&mut d, Request::DumpConntrack { zone: None })).unwrap();
        let text: Vec<String> = all.iter().map(|e| e.ovs_text()).collect();
        assert_eq!(
            text,
            [
                "icmp,orig=(src=10.0.0.1,dst=10.0.0.3,id=9,type=8,code=0),\
                 reply=(src=10.0.0.3,dst=10.0.0.1,id=9,type=0,code=0)",
                "tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1235,dport=80),\
                 reply=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1235),mark=1,labels=0x2a,\
                 protoinfo=(state=ESTABLISHED)",
                "udp,orig=(src=10.0.0.1,dst=10.0.0.3,sport=7,dport=53),\
                 reply=(src=10.0.0.3,dst=192.0.2.1,sport=53,dport=4000)",
                "tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),\
                 reply=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1234),zone=5,mark=1,\
                 labels=0x2a,protoinfo=(state=ESTABLISHED)",
            ]
        );
        assert_eq!(all[2].nat.as_deref(), Some("src"));
        assert!(all[1].timeout > 400_000, "established: 5 days");
        let z5 = ok(&mut d, Request::DumpConntrack { zone: Some(5) });
        assert_eq!(z5.as_array().unwrap().len(), 1);

        let st = ok(&mut d, Request::ConntrackStats);
        assert_eq!(st["entries"], 4);
        assert_eq!(st["created"], 4);
        assert_eq!(st["max_entries"], 1_000_000);
        assert_eq!(st["timeouts"]["tcp-established"], 432_000);
        assert_eq!(
            st["zones"],
            serde_json::json!([{"entries": 3, "zone": 0}, {"entries": 1, "zone": 5}])
        );
        assert!(st.get("zone_default_limit").is_none());

        let f = ok(&mut d, Request::FlushConntrack { zone: Some(5) });
        assert_eq!(f["flushed"], 1);
        assert_eq!(ok(&mut d, Request::ConntrackStats)["entries"], 3);
        let f = ok(&mut d, Request::FlushConntrack { zone: None });
        assert_eq!(f["flushed"], 3);
        assert_eq!(
            ok(&mut d, Request::DumpConntrack { zone: None }),
            serde_json::json!([])
        );
        d.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn settings_apply_at_once_and_bad_ones_are_refused() {
        let (mut d, dir) = daemon("settings");
        let set = |k: &str, v: &str| Request::ConfigSet {
            key: k.into(),
            value: v.into(),
        };
        ok(&mut d, set("ct-max-entries", "2"));
        ok(&mut d, set("ct-zone-limit:7", "1"));
        ok(&mut d, set("ct-zone-default-limit", "50"));
        ok(&mut d, set("ct-timeout-tcp-established", "3600"));
        let st = ok(&mut d, Request::ConntrackStats);
        assert_eq!(st["max_entries"], 2);
        assert_eq!(st["zone_default_limit"], 50);
        assert_eq!(st["timeouts"]["tcp-established"], 3600);
        assert_eq!(
            st["zones"],
            serde_json::json!([{"entries": 0, "limit": 1, "zone": 7}])
        );
        handshake(&d, 7, 1);
        let syn = Frame::v4([10, 0, 0, 1], [10, 0, 0, 2], Proto::tcp(2, 80, 1, 0, SYN)).bytes();
        assert!(
            !d.conntrack.execute(&syn, 7, true, d.ct_now()).committed,
            "zone limit 1"
        );
        assert!(d.conntrack.execute(&syn, 8, true, d.ct_now()).committed);
        let syn3 = Frame::v4([10, 0, 0, 1], [10, 0, 0, 2], Proto::tcp(3, 80, 1, 0, SYN)).bytes();
        assert!(
            !d.conntrack.execute(&syn3, 9, true, d.ct_now()).committed,
            "2 in all"
        );
        assert_eq!(ok(&mut d, Request::ConntrackStats)["limit_hits"], 2);
        let est = d.dump_conntrack(Some(7));
        assert!(est[0].timeout <= 3600, "{est:?}");
        // Back to the defaults: the zone's own limit goes, the others are what was set.
        ok(&mut d, set("ct-zone-limit:7", "default"));
        ok(&mut d, set("ct-zone-limit:8", "0"));
        let st = ok(&mut d, Request::ConntrackStats);
        assert_eq!(
            st["zones"],
            serde_json::json!([
                {"entries": 1, "limit": 50, "zone": 7},
                {"entries": 1, "zone": 8},
            ])
        );
        for (k, v, want) in [
            (
                "ct-max-entries",
                "0",
                "ct-max-entries=0: expected an integer in 1..=100000000",
            ),
            (
                "ct-zone-limit:x",
                "1",
                "ct-zone-limit:x: 'x' is not a conntrack zone (ct-zone-limit:ZONE with ZONE \
                 in 0..=65535)",
            ),
            (
                "ct-timeout-tcp-nope",
                "1",
                "unknown conntrack timeout 'tcp-nope' in ct-timeout-tcp-nope",
            ),
            (
                "ct-timeout-icmp",
                "-1",
                "ct-timeout-icmp=-1: expected an integer in 1..=31536000",
            ),
        ] {
            let e = err(&mut d, set(k, v));
            assert!(e.starts_with(want), "{k}={v}: {e}");
        }
        // The settings are saved and apply again at the next start.
        d.shutdown();
        drop(d);
        let mut opts = DaemonOptions::in_dir(&dir);
        opts.pmd_cores = Some(vec![*os::allowed_cpus().last().unwrap_or(&0)]);
        let mut d = Daemon::start(opts).unwrap();
        let st = ok(&mut d, Request::ConntrackStats);
        assert_eq!(st["max_entries"], 2);
        assert_eq!(st["timeouts"]["tcp-established"], 3600);
        d.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn sweep_runs_on_the_tick() {
        let (mut d, dir) = daemon("sweep");
        ok(
            &mut d,
            Request::ConfigSet {
                key: "ct-timeout-udp-unreplied".into(),
                value: "1".into(),
            },
        );
        for p in 0..100 {
            let f = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::udp(p, 53, b"q")).bytes();
            assert!(d.conntrack.execute(&f, 0, true, d.ct_now()).committed);
        }
        std::thread::sleep(Duration::from_millis(1100));
        // The tick moves the clock on, then sweeps its share.
        for _ in 0..SWEEP_TICKS {
            d.tick();
        }
        let c = d.conntrack.counters();
        assert_eq!((c.entries, c.expired), (0, 100));
        d.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }

    const FIXTURE: &str = "../../tests/e2e/fixtures/upgrade-conntrack-v4.json";

    /// The fixture of a `conntrack` handover message: TCP (established, with mark and
    /// label; IPv4 and IPv6), UDP with SNAT, an ICMP echo and a generic protocol, exported
    /// by a real tracker. `FERROVS_WRITE_FIXTURE=1` writes it again.
    fn fixture_table(d: &Daemon) -> Vec<TableState> {
        handshake(d, 5, 1234);
        let t = &d.conntrack;
        let now = d.ct_now();
        let nat =
            Nat::Bind(NatRange::addr(NatKind::Src, [192, 0, 2, 1].into()).with_ports(4000, 4000));
        let mut f = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::udp(7, 53, b"q")).bytes();
        assert!(
            t.execute_nat(&mut f, 0, &Commit::COMMIT, &nat, now)
                .committed
        );
        let e = Frame::v4([10, 0, 0, 1], [10, 0, 0, 3], Proto::echo(true, 9, 1)).bytes();
        assert!(t.execute(&e, 0, true, now).committed);
        let g = Frame::v4(
            [10, 0, 0, 1],
            [10, 0, 0, 4],
            Proto::Raw {
                proto: 47,
                payload: vec![0; 8],
            },
        );
        assert!(t.execute(&g.bytes(), 0, true, now).committed);
        let s6 = Frame::v6(1, 2, Proto::tcp(5555, 443, 7, 0, SYN)).bytes();
        assert!(t.execute(&s6, 3, true, now).committed);
        d.export_conntrack()
    }

    #[test]
    fn the_handover_fixture_restores() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
        if std::env::var_os("FERROVS_WRITE_FIXTURE").is_some() {
            let (mut d, dir) = daemon("fixture-w");
            let parts = fixture_table(&d);
            assert_eq!(parts.len(), 1);
            let m = crate::upgrade::Msg::Conntrack(parts.into_iter().next().unwrap());
            std::fs::write(&path, serde_json::to_string_pretty(&m).unwrap() + "\n").unwrap();
            d.shutdown();
            let _ = std::fs::remove_dir_all(dir);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let m: crate::upgrade::Msg = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&m).unwrap(), v, "round trip");
        let crate::upgrade::Msg::Conntrack(t) = m else {
            panic!("not a conntrack message")
        };
        let (mut d, dir) = daemon("fixture-r");
        let mut inc = IncomingTable::default();
        inc.add(t, 1_000_000);
        d.restore_conntrack(inc);
        let text: Vec<String> = d
            .dump_conntrack(None)
            .iter()
            .map(|e| e.ovs_text())
            .collect();
        assert_eq!(
            text,
            [
                "icmp,orig=(src=10.0.0.1,dst=10.0.0.3,id=9,type=8,code=0),\
                 reply=(src=10.0.0.3,dst=10.0.0.1,id=9,type=0,code=0)",
                "udp,orig=(src=10.0.0.1,dst=10.0.0.3,sport=7,dport=53),\
                 reply=(src=10.0.0.3,dst=192.0.2.1,sport=53,dport=4000)",
                "47,orig=(src=10.0.0.1,dst=10.0.0.4),reply=(src=10.0.0.4,dst=10.0.0.1)",
                "tcp,orig=(src=fd00::1,dst=fd00::2,sport=5555,dport=443),\
                 reply=(src=fd00::2,dst=fd00::1,sport=443,dport=5555),zone=3,\
                 protoinfo=(state=SYN_SENT)",
                "tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),\
                 reply=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1234),zone=5,mark=1,\
                 labels=0x2a,protoinfo=(state=ESTABLISHED)",
            ]
        );
        assert_eq!(ok(&mut d, Request::ConntrackStats)["restored"], 5);
        d.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_handed_over_table_is_restored_or_refused_whole() {
        let (mut old, dir) = daemon("up-old");
        for p in 0..(CT_CHUNK as u16 + 10) {
            handshake(&old, p % 3, 10_000 + p);
        }
        let parts = old.export_conntrack();
        assert_eq!(parts.len(), 2, "in chunks of {CT_CHUNK}");
        let before = old.dump_conntrack(None);
        old.shutdown();
        drop(old);
        // Through the wire form, as the handover sends them.
        let wire: Vec<String> = parts
            .into_iter()
            .map(|p| serde_json::to_string(&crate::upgrade::Msg::Conntrack(p)).unwrap())
            .collect();
        let receive = |max: u32| {
            let mut inc = IncomingTable::default();
            for w in &wire {
                match serde_json::from_str(w).unwrap() {
                    crate::upgrade::Msg::Conntrack(t) => inc.add(t, max),
                    m => panic!("{m:?}"),
                }
            }
            inc
        };
        let _ = std::fs::remove_dir_all(&dir);
        let (mut new, dir) = daemon("up-new");
        new.restore_conntrack(receive(1_000_000));
        let after = new.dump_conntrack(None);
        assert_eq!(after.len(), before.len());
        for (a, b) in after.iter().zip(&before) {
            assert_eq!(a.ovs_text(), b.ovs_text());
            assert!(a.timeout <= b.timeout && a.timeout + 2 >= b.timeout);
        }
        let st = ok(&mut new, Request::ConntrackStats);
        assert_eq!(st["restored"], before.len());
        assert_eq!(st["restore_refused"], 0);
        // A connection of the restored table goes on: its next segment is established.
        let a = Frame::v4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            Proto::tcp(10_000, 80, 101, 501, ACK),
        );
        let r = new.conntrack.execute(&a.bytes(), 0, false, new.ct_now());
        assert_eq!(r.state.to_string(), "est+trk");
        new.shutdown();
        drop(new);
        let _ = std::fs::remove_dir_all(&dir);

        // Too many for the new daemon's limit: refused whole, counted, and the daemon runs on.
        let (mut new, dir) = daemon("up-small");
        ok(
            &mut new,
            Request::ConfigSet {
                key: "ct-max-entries".into(),
                value: "100".into(),
            },
        );
        new.restore_conntrack(receive(100));
        let st = ok(&mut new, Request::ConntrackStats);
        assert_eq!(st["entries"], 0);
        assert_eq!(st["restore_refused"], 1);
        assert_eq!(
            st["restore_error"],
            format!("{} entries exceed the limit of 100", before.len())
        );
        // A table that fails validation (a TCP state that does not exist).
        let mut bad = receive(1_000_000);
        if let Some(t) = bad.table.as_mut() {
            t.entries[3].tcp.as_mut().unwrap().state = 42;
        }
        new.handle(Request::ConfigSet {
            key: "ct-max-entries".into(),
            value: "1000000".into(),
        });
        new.restore_conntrack(bad);
        let st = ok(&mut new, Request::ConntrackStats);
        assert_eq!(st["restore_refused"], 2);
        assert_eq!(st["restore_error"], "entry 3: TCP state 42 does not exist");
        assert_eq!(st["entries"], 0);
        new.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }
}
