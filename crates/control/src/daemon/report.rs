//! What the daemon reports: show, port-stats, pmd-stats, mac-table, config get. Each builds
//! its typed reply (`ferrovs_proto::reply`); none changes anything.

use ferrovs_proto::reply::{
    self, ConfigGet, DirStats, FlowCounters, KernelInfo, MacEntry, MegaflowCacheStats, Offloads,
    PmdStats, PortStats, QueueStats, Settings, Show, ShowBridge, ShowPort, TapInfo, UplinkInfo,
    VxlanInfo, XdpInfo,
};
use ferrovs_vhost::stats::StatsSnapshot;

use super::*;

impl Daemon {
    pub(super) fn config_get(&self, key: Option<&str>) -> Result<ConfigGet, ConfigError> {
        let all = Settings {
            mac_aging: self.config.setting_u32("mac-aging", 300).to_string(),
            mac_table_size: self.config.setting_u32("mac-table-size", 8192).to_string(),
            pmd_cores: self
                .pmd_cores()
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
            pmd_priority: self
                .config
                .other
                .get("pmd-priority")
                .cloned()
                .unwrap_or_else(|| "normal".into()),
            pmd_rx_mode: self.datapath.rx_mode().0.name().into(),
            pmd_sleep_after_us: (self.datapath.rx_mode().1 / 1000).to_string(),
            pmd_sleep_max_us: (self.datapath.sleep_max_ns() / 1000).to_string(),
            pmd_rxq_assign: self.rxq_assign_mode().name().into(),
            vhost_packed_rings: self.config.packed_rings().to_string(),
            pmd_quiet_rxq_poll_us: (self.datapath.quiet_rxq_poll_ns() / 1000).to_string(),
        };
        let Some(k) = key else {
            return Ok(ConfigGet::All(Box::new(all)));
        };
        let pairs = all.pairs();
        match pairs.iter().find(|(n, _)| *n == k) {
            Some((_, v)) => Ok(ConfigGet::One(v.to_string())),
            // Any other setting `config set` took (ct-*, emc-*, flow-*, ...): as it was set.
            None if self.config.other.contains_key(k) => {
                Ok(ConfigGet::One(self.config.other[k].clone()))
            }
            None => Err(ConfigError::Invalid(format!(
                "unknown setting '{k}' (known: {})",
                pairs.map(|(n, _)| n).join(", ")
            ))),
        }
    }

    pub(super) fn link_name(l: &Link) -> &'static str {
        match l {
            Link::Listening => "listening",
            Link::Connected => "connected",
            Link::Reconnecting { .. } => "reconnecting",
            Link::Attached => "attached",
        }
    }

    /// `(table, rules)` for each table of `bridge` that has rules.
    fn rules_per_table(&self, bridge: &str) -> Vec<(u8, u64)> {
        let mut n = std::collections::BTreeMap::new();
        if let Some(b) = self.bridges.get(bridge) {
            for r in b.rules.rules().iter() {
                *n.entry(r.spec.table).or_insert(0u64) += 1;
            }
        }
        n.into_iter().collect()
    }

    pub(super) fn show(&self) -> Show {
        let bridges = self
            .bridges
            .keys()
            .map(|b| ShowBridge {
                name: b.clone(),
                openflow: Some(self.show_openflow(b)),
                ports: self
                    .ports
                    .values()
                    .filter(|p| &p.bridge == b)
                    .map(show_port)
                    .collect(),
                rules_per_table: self.rules_per_table(b),
            })
            .collect();
        Show {
            bad_control_requests: self.bad_requests,
            bridges,
            log_lines_suppressed: crate::ratelimit::suppressed_total(),
            hugepages: self
                .pmds
                .iter()
                .all(|p| p.stats.hugepages.load(Ordering::Relaxed)),
            ovsdb: self.ovsdb.as_ref().map(|o| o.status()),
            openflow: self.openflow_status(),
            packet_io: self.packet_io_status(),
            pid: std::process::id(),
            pmd_cores: self.pmd_cores(),
            run_dir: self.run_dir.display().to_string(),
            upgrades: self.upgrades,
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    pub(super) fn port_stats(&self, only: Option<&str>) -> Result<Vec<PortStats>, ConfigError> {
        self.poll_kernel_drops();
        if let Some(n) = only {
            if !self.ports.contains_key(n) {
                return Err(ConfigError::Invalid(format!("no port named {n}")));
            }
        }
        Ok(self
            .ports
            .values()
            .filter(|p| only.is_none_or(|n| n == p.cfg.name))
            .map(port_stats)
            .collect())
    }

    /// The megaflow caches of the bridges with rules (shared by every PMD).
    pub(super) fn megaflow_caches(&self) -> Vec<MegaflowCacheStats> {
        self.bridges
            .iter()
            .filter(|(_, b)| b.pipeline.is_some() || b.cache.size().0 > 0)
            .map(|(name, b)| {
                let c = &b.cache.counters;
                let (entries, subtables) = b.cache.size();
                let (xlate_too_deep, xlate_too_many) = b.rules.xlate_failures();
                let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                MegaflowCacheStats {
                    bridge: name.clone(),
                    entries: entries as u64,
                    evicted: l(&c.evicted),
                    inserted: l(&c.inserted),
                    invalidated: l(&c.invalidated),
                    limit: b.cache.limit() as u64,
                    refused_full: l(&c.limit_refused),
                    refused_stale: l(&c.stale_refused),
                    revalidations: l(&c.revalidations),
                    rules: b.rules.len() as u64,
                    subtables: subtables as u64,
                    xlate_too_deep,
                    xlate_too_many,
                }
            })
            .collect()
    }

    pub(super) fn pmd_stats(&self) -> Vec<PmdStats> {
        let hz = os::tsc_hz();
        let caches = self.megaflow_caches();
        let mut rxqs = self.pmd_rxq_usage().into_iter();
        self.pmds
            .iter()
            .zip(&self.pmd_baseline)
            .map(|(p, base)| {
                let s = &p.stats;
                let c = PmdCounters::read(s).since(base);
                let (busy, idle, rx, tx) = (c.busy, c.idle, c.rx, c.tx);
                let total = (busy + idle).max(1);
                let f = s.flow.load();
                let sleep_cycles = c.sleep_cycles;
                let gaps = s.quiet_gaps.each_ref().map(|a| a.load(Ordering::Relaxed));
                PmdStats {
                    busy_cycles: busy,
                    busy_pct: (busy as f64 * 100.0 / total as f64 * 10.0).round() / 10.0,
                    core: s.core,
                    cycles_per_packet: if rx > 0 {
                        (busy as f64 / rx as f64 * 10.0).round() / 10.0
                    } else {
                        0.0
                    },
                    flow: FlowCounters {
                        emc_hits: f.emc_hits,
                        emc_inserts: f.emc_inserts,
                        emc_skipped: f.emc_skipped,
                        megaflow_hits: f.megaflow_hits,
                        packets: f.packets,
                        upcalls: f.upcalls,
                        recirculations: f.recirculations,
                    },
                    hugepages: s.hugepages.load(Ordering::Relaxed),
                    idle_cycles: idle,
                    iterations: c.iterations,
                    kick_wakeups: c.kick_wakeups,
                    load_sleeps: c.load_sleeps,
                    quiet_skips: c.quiet_skips,
                    quiet_rxq_poll_us: self.datapath.quiet_rxq_poll_ns() / 1000,
                    quiet_gap_max_us: (s.quiet_gap_max.load(Ordering::Relaxed) as f64 * 1e7
                        / hz.max(1) as f64)
                        .round()
                        / 10.0,
                    quiet_sweeps: gaps.iter().sum(),
                    quiet_gap_p99_us: gap_quantile(&gaps, 0.99),
                    quiet_gap_p999_us: gap_quantile(&gaps, 0.999),
                    megaflow_caches: caches.clone(),
                    pmd: s.index,
                    priority: self
                        .config
                        .other
                        .get("pmd-priority")
                        .map_or("normal", |v| v.as_str())
                        .into(),
                    priority_error: s.priority_error.get().cloned(),
                    rx_mode: self.datapath.rx_mode().0.name().into(),
                    rx_packets: rx,
                    rx_queues: s.rxqs.load(Ordering::Relaxed),
                    sleep_cycles,
                    sleep_max_us: self.datapath.sleep_max_ns() / 1000,
                    sleep_us: (sleep_cycles as u128 * 1_000_000 / hz.max(1) as u128) as u64,
                    sleeps: c.sleeps,
                    tsc_hz: hz,
                    tx_packets: tx,
                    rxqs: rxqs.next().unwrap_or_default(),
                }
            })
            .collect()
    }

    pub(super) fn mac_table(&self, bridge: &str) -> Result<Vec<MacEntry>, ConfigError> {
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}")))?;
        let now = self.clock.load(Ordering::Relaxed);
        let names: HashMap<u32, &str> = self
            .ports
            .values()
            .map(|p| (p.id, p.cfg.name.as_str()))
            .collect();
        Ok(b.macs
            .dump(now)
            .into_iter()
            .map(|e| MacEntry {
                age: e.age,
                mac: ferrovs_packet::mac_to_string(e.mac),
                port: names.get(&e.port).copied().unwrap_or("?").into(),
                vlan: e.vlan,
            })
            .collect())
    }
}

/// One port as `show` lists it.
fn show_port(p: &PortState) -> ShowPort {
    let (ready, feats) = match &p.device {
        Some(d) => (
            d.queues()
                .iter()
                .filter(|q| q.ready.load(Ordering::Relaxed))
                .count(),
            features::names(d.features()),
        ),
        None => (2, vec![]),
    };
    ShowPort {
        connects: p.connects,
        dev: p.cfg.dev.clone().filter(|_| p.cfg.kind.is_kernel()),
        disconnects: p.disconnects,
        features: feats.into_iter().map(String::from).collect(),
        id: p.id,
        kernel: kernel_info(&p.port.io),
        last_error: p.last_error.clone(),
        mode: p.port.io.mode().into(),
        mode_fallback_reason: p.fallback.clone(),
        name: p.cfg.name.clone(),
        offloads: offloads_info(p),
        ofport: p.ofport,
        path: p.cfg.path.as_ref().map(|p| p.display().to_string()),
        queues: p.cfg.queues,
        ready_queues: ready,
        state: Daemon::link_name(&p.link).into(),
        kind: p.cfg.kind.name().into(),
        vlan: match &p.port.vlan {
            VlanMode::Access(t) => reply::Vlan {
                mode: "access".into(),
                tag: Some(*t),
                trunks: None,
            },
            VlanMode::Trunk => reply::Vlan {
                mode: "trunk".into(),
                tag: None,
                trunks: None,
            },
            VlanMode::TrunkOf(l) => reply::Vlan {
                mode: "trunk".into(),
                tag: None,
                trunks: Some(l.clone()),
            },
        },
    }
}

/// What a port takes from the switch (`accepts`: else the PMD completes checksums and
/// segments in software) and what it may hand the switch (`sends`).
fn offloads_info(p: &PortState) -> Offloads {
    use ferrovs_sys::kernel::vnet::caps;
    let sends = match (&p.device, &p.port.io) {
        (Some(d), _) => features::guest_tx_caps(d.features()),
        (None, dp::PortIo::Tap(t)) if t.rx_offloads => caps::ALL,
        _ => 0,
    };
    let names = |c| caps::names(c).into_iter().map(String::from).collect();
    Offloads {
        accepts: names(p.port.tx_caps()),
        sends: names(sends),
    }
}

/// One direction's counters.
fn dir_stats(s: &StatsSnapshot) -> DirStats {
    DirStats {
        bytes: s.bytes,
        dirty_pages_logged: s.dirty_pages,
        dropped: s.total_drops(),
        drops: s.named_drops().map(|(k, v)| (k.to_string(), v)).collect(),
        guest_notifications: s.calls,
        notifications_coalesced: s.calls_coalesced,
        notifications_suppressed: s.calls_suppressed,
        packets: s.packets,
    }
}

/// One port's `port-stats`.
fn port_stats(p: &PortState) -> PortStats {
    let kernel_queue = |i: usize, dir: &str, s: &ferrovs_vhost::stats::QueueStats| QueueStats {
        available: None,
        broken: None,
        direction: dir.into(),
        queue: i,
        ready: true,
        size: None,
        stats: dir_stats(&s.snapshot()),
    };
    let queues = match (&p.device, p.port.kernel_stats()) {
        (_, Some([to, from])) => vec![
            kernel_queue(0, "to-kernel", to),
            kernel_queue(1, "from-kernel", from),
        ],
        (None, None) => vec![],
        (Some(d), None) => d
            .queues()
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let s = q.stats.snapshot();
                let vq = q.lock();
                QueueStats {
                    available: vq.available().map(u32::from),
                    broken: vq.broken().map(|e| e.to_string()),
                    direction: if i % 2 == 0 { "to-guest" } else { "from-guest" }.into(),
                    queue: i,
                    ready: q.ready.load(Ordering::Relaxed),
                    size: Some(vq.state().size),
                    stats: dir_stats(&s),
                }
            })
            .collect(),
    };
    let [sw_csum, sw_tso, sw_segments] = p.port.offload.get();
    let c = p.cfg.coalesce();
    PortStats {
        coalesce: reply::Coalesce {
            frames: c.frames,
            usecs: c.usecs,
        },
        migration: p.device.as_ref().map(|d| {
            let m = d.migration_info();
            reply::Migration {
                log_bytes: m.log_size,
                logging: m.logging,
                postcopy: m.postcopy,
                postcopy_pages_fetched: m.pages_fetched,
                postcopy_pages_missing: m.pages_missing,
                postcopy_listens: m.postcopy_listens,
                rarp_announces: m.rarps,
            }
        }),
        offload: reply::SoftwareOffload {
            sw_csum,
            sw_segments,
            sw_tso,
        },
        port: p.cfg.name.clone(),
        queues,
        refused_connections: p.refused_connections,
        rx: dir_stats(&p.port.rx_stats()),
        tx: dir_stats(&p.port.tx_stats()),
        vhost_user_errors: p.device.as_ref().map_or(0, |d| d.errors),
    }
}

/// Datagrams the kernel dropped at UDP socket `fd` (of this process's network namespace)
/// because its receive buffer was full: the `drops` column of `udp_table` (the kernel's
/// `/proc/self/net/udp`) on the socket's inode; 0 when either cannot be read.
pub(super) fn udp_socket_drops(udp_table: &Path, fd: std::os::fd::RawFd) -> u64 {
    let Some(inode) = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .and_then(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
    else {
        return 0;
    };
    socket_drops_in(
        &std::fs::read_to_string(udp_table).unwrap_or_default(),
        &inode,
    )
}

/// The `drops` (last) column of the line of `table` (`/proc/net/udp`'s format: `sl
/// local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ref
/// pointer drops`) whose inode is `inode`.
fn socket_drops_in(table: &str, inode: &str) -> u64 {
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 13 && f[9] == inode)
        .and_then(|f| f.last()?.parse().ok())
        .unwrap_or(0)
}

/// What `show` says about a kernel port's attachment (`None` for vhost-user ports).
pub(super) fn kernel_info(io: &PortIo) -> Option<KernelInfo> {
    Some(match io {
        PortIo::Vhost { .. } => return None,
        PortIo::Tunnel(v) => KernelInfo::Vxlan(VxlanInfo {
            local: v.local.to_string(),
            remote: v.remote.to_string(),
            rx: "recvfrom".into(),
            tx: "sendto".into(),
            vni: match v.vni {
                dp::TunnelVni::Fixed(n) => n,
                dp::TunnelVni::Flow => 0,
            },
            key_flow: v.takes_metadata(),
            socket_drops: udp_socket_drops(
                Path::new("/proc/self/net/udp"),
                std::os::fd::AsRawFd::as_raw_fd(v.sock()),
            ),
        }),
        PortIo::Tap(t) => KernelInfo::Tap(TapInfo {
            device: t.tap.name().into(),
            offloads: vec![],
            vnet_hdr_len: ferrovs_sys::kernel::tap::VNET_HDR_LEN as u64,
        }),
        PortIo::Uplink(u) => {
            let g = u.geometry;
            KernelInfo::Uplink(UplinkInfo {
                ifindex: u.sock.ifindex(),
                ignore_outgoing: u.sock.ignores_outgoing(),
                ring_block_size: g.block_size as u64,
                ring_block_timeout_ms: ferrovs_sys::kernel::af_packet::RETIRE_BLOCK_MS as u64,
                ring_blocks: g.block_nr as u64,
                rx: "tpacket_v3".into(),
                tx: "sendmmsg".into(),
            })
        }
        PortIo::Xdp(x) => {
            let g = x.sock.geometry();
            let (posted, lost) = x
                .rx_ring
                .lock()
                .map(|r| (r.posted(), r.lost()))
                .unwrap_or_default();
            let (free, outstanding, bad) = x
                .tx_ring
                .lock()
                .map(|t| (t.free_frames(), t.outstanding(), t.bad_completions()))
                .unwrap_or_default();
            KernelInfo::Xdp(XdpInfo {
                bind: if x.sock.zero_copy() {
                    "zero-copy"
                } else {
                    "copy"
                }
                .into(),
                frames_lost: lost + bad,
                ifindex: x.sock.ifindex(),
                queue: 0,
                rx: "af_xdp".into(),
                rx_frames_with_kernel: posted as u64,
                tx: "af_xdp".into(),
                tx_frames_free: free as u64,
                tx_frames_in_flight: outstanding as u64,
                umem_frame_size: g.frame_size as u64,
                umem_rx_frames: g.rx_frames as u64,
                umem_tx_frames: g.tx_frames as u64,
                xdp_mode: x.sock.xdp_mode().name().into(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_drops_are_read_by_inode_from_the_udp_table() {
        let table = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  1: 0100000A:12B5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n\
  2: 0100000A:17C1 00000000:0000 07 00000000:00034000 00:00000000 00000000     0        0 777 2 0000000000000000 0\n";
        assert_eq!(socket_drops_in(table, "4242"), 17);
        assert_eq!(socket_drops_in(table, "777"), 0);
        assert_eq!(socket_drops_in(table, "9"), 0);
        assert_eq!(socket_drops_in("garbage", "4242"), 0);
    }

    /// A real socket that nobody reads, flooded past its receive buffer: the kernel's count
    /// of what it dropped is what the port reports.
    #[test]
    fn a_full_udp_socket_s_kernel_drops_are_counted() {
        use std::os::fd::AsRawFd;
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let table = Path::new("/proc/self/net/udp");
        assert_eq!(udp_socket_drops(table, rx.as_raw_fd()), 0);
        for _ in 0..5000 {
            let _ = tx.send_to(&[0u8; 1000], to);
        }
        assert!(udp_socket_drops(table, rx.as_raw_fd()) > 0);
    }
}

/// The upper bound (µs) of the histogram bucket that holds quantile `q` of the sweep gaps
/// (`ferrovs_datapath::quiet`); None without sweeps, or in the open last bucket.
fn gap_quantile(gaps: &[u64], q: f64) -> Option<u64> {
    let total: u64 = gaps.iter().sum();
    if total == 0 {
        return None;
    }
    let want = (total as f64 * q).ceil() as u64;
    let mut seen = 0;
    for (k, n) in gaps.iter().enumerate() {
        seen += n;
        if seen >= want {
            let limit = dp::quiet::gap_bucket_limit(k);
            return (limit != u64::MAX).then_some(limit);
        }
    }
    None
}

#[cfg(test)]
mod gap_tests {
    use super::gap_quantile;

    #[test]
    fn quantiles_are_bucket_upper_bounds() {
        assert_eq!(gap_quantile(&[0; 16], 0.99), None);
        let mut g = [0u64; 16];
        g[5] = 990; // 16..32 us
        g[7] = 9; // 64..128 us
        g[12] = 1; // 2048..4096 us
        assert_eq!(gap_quantile(&g, 0.99), Some(32));
        assert_eq!(gap_quantile(&g, 0.999), Some(128));
        assert_eq!(gap_quantile(&g, 1.0), Some(4096));
        g[15] = 10;
        assert_eq!(gap_quantile(&g, 1.0), None);
    }
}

/// The cumulative counters of one PMD, which `pmd-stats-clear` rebases: every count and
/// every figure derived from them (cycles per packet, packets per iteration, time asleep)
/// starts again from zero, as after OVS's `dpif-netdev/pmd-stats-clear`. (The quiet-queue
/// gap histogram is cleared by the PMD itself.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PmdCounters {
    busy: u64,
    idle: u64,
    rx: u64,
    tx: u64,
    iterations: u64,
    sleeps: u64,
    sleep_cycles: u64,
    kick_wakeups: u64,
    load_sleeps: u64,
    quiet_skips: u64,
}

impl PmdCounters {
    pub(super) fn read(s: &dp::PmdStats) -> PmdCounters {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        PmdCounters {
            busy: l(&s.busy_cycles),
            idle: l(&s.idle_cycles),
            rx: l(&s.rx_packets),
            tx: l(&s.tx_packets),
            iterations: l(&s.iterations),
            sleeps: l(&s.sleeps),
            sleep_cycles: l(&s.sleep_cycles),
            kick_wakeups: l(&s.kick_wakeups),
            load_sleeps: l(&s.load_sleeps),
            quiet_skips: l(&s.quiet_skips),
        }
    }

    /// These counts since `base` (a counter behind its base, which never happens, reads 0).
    fn since(self, base: &PmdCounters) -> PmdCounters {
        PmdCounters {
            busy: self.busy.saturating_sub(base.busy),
            idle: self.idle.saturating_sub(base.idle),
            rx: self.rx.saturating_sub(base.rx),
            tx: self.tx.saturating_sub(base.tx),
            iterations: self.iterations.saturating_sub(base.iterations),
            sleeps: self.sleeps.saturating_sub(base.sleeps),
            sleep_cycles: self.sleep_cycles.saturating_sub(base.sleep_cycles),
            kick_wakeups: self.kick_wakeups.saturating_sub(base.kick_wakeups),
            load_sleeps: self.load_sleeps.saturating_sub(base.load_sleeps),
            quiet_skips: self.quiet_skips.saturating_sub(base.quiet_skips),
        }
    }
}
