//! What the daemon reports: show, port-stats, pmd-stats, mac-table, config get.

use super::*;

impl Daemon {
    pub(super) fn config_get(&self, key: Option<&str>) -> Result<Value, ConfigError> {
        let mut all = serde_json::Map::new();
        all.insert(
            "pmd-cores".into(),
            json!(self
                .pmd_cores()
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")),
        );
        all.insert(
            "mac-aging".into(),
            json!(self.config.setting_u32("mac-aging", 300).to_string()),
        );
        all.insert(
            "pmd-rx-mode".into(),
            json!(self.datapath.rx_mode().0.name()),
        );
        all.insert(
            "pmd-sleep-after-us".into(),
            json!((self.datapath.rx_mode().1 / 1000).to_string()),
        );
        all.insert(
            "pmd-sleep-max-us".into(),
            json!((self.datapath.sleep_max_ns() / 1000).to_string()),
        );
        all.insert(
            "pmd-priority".into(),
            json!(self
                .config
                .other
                .get("pmd-priority")
                .cloned()
                .unwrap_or_else(|| "normal".into())),
        );
        all.insert(
            "mac-table-size".into(),
            json!(self.config.setting_u32("mac-table-size", 8192).to_string()),
        );
        match key {
            None => Ok(Value::Object(all)),
            Some(k) => all.get(k).cloned().ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "unknown setting '{k}' (known: {})",
                    all.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            }),
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

    pub(super) fn show(&self) -> Value {
        /// What a port takes from the switch (`accepts`: else the PMD completes checksums and
        /// segments in software) and what it may hand the switch (`sends`).
        fn offloads_info(p: &PortState) -> Value {
            use ferrovs_sys::vnet::caps;
            let sends = match (&p.device, &p.port.io) {
                (Some(d), _) => features::guest_tx_caps(d.features()),
                (None, dp::PortIo::Tap(t)) if t.rx_offloads => caps::ALL,
                _ => 0,
            };
            json!({
                "accepts": caps::names(p.port.tx_caps()),
                "sends": caps::names(sends),
            })
        }
        let bridges: Vec<Value> = self
            .bridges
            .keys()
            .map(|b| {
                let ports: Vec<Value> = self
                    .ports
                    .values()
                    .filter(|p| &p.bridge == b)
                    .map(|p| {
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
                        json!({
                            "name": p.cfg.name,
                            "id": p.id,
                            "type": p.cfg.kind.name(),
                            "mode": p.port.io.mode(),
                            "path": p.cfg.path,
                            "dev": p.cfg.dev.as_ref().filter(|_| p.cfg.kind.is_kernel()),
                            "kernel": kernel_info(&p.port.io),
                            "mode_fallback_reason": p.fallback,
                            "state": Self::link_name(&p.link),
                            "queues": p.cfg.queues,
                            "ready_queues": ready,
                            "features": feats,
                            "offloads": offloads_info(p),
                            "vlan": match &p.port.vlan {
                                VlanMode::Access(t) => json!({"mode": "access", "tag": t}),
                                VlanMode::Trunk => json!({"mode": "trunk"}),
                                VlanMode::TrunkOf(l) => json!({"mode": "trunk", "trunks": l}),
                            },
                            "connects": p.connects,
                            "disconnects": p.disconnects,
                            "last_error": p.last_error,
                        })
                    })
                    .collect();
                json!({ "name": b, "ports": ports })
            })
            .collect();
        json!({
            "run_dir": self.run_dir,
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "upgrades": self.upgrades,
            "bridges": bridges,
            "pmd_cores": self.pmd_cores(),
            "hugepages": self.pmds.iter().all(|p| p.stats.hugepages.load(Ordering::Relaxed)),
            "bad_control_requests": self.bad_requests,
        })
    }

    pub(super) fn port_stats(&self, only: Option<&str>) -> Result<Value, ConfigError> {
        self.poll_kernel_drops();
        if let Some(n) = only {
            if !self.ports.contains_key(n) {
                return Err(ConfigError::Invalid(format!("no port named {n}")));
            }
        }
        let stats_json = |s: &ferrovs_vhost::stats::StatsSnapshot| {
            let drops: serde_json::Map<String, Value> = s
                .named_drops()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            json!({
                "packets": s.packets,
                "bytes": s.bytes,
                "dropped": s.total_drops(),
                "drops": drops,
                "guest_notifications": s.calls,
                "notifications_suppressed": s.calls_suppressed,
                "notifications_coalesced": s.calls_coalesced,
                "dirty_pages_logged": s.dirty_pages,
            })
        };
        let ports: Vec<Value> = self
            .ports
            .values()
            .filter(|p| only.is_none_or(|n| n == p.cfg.name))
            .map(|p| {
                let kernel_queue = |i: usize, dir: &str, s: &ferrovs_vhost::stats::QueueStats| {
                    json!({
                        "queue": i,
                        "direction": dir,
                        "ready": true,
                        "broken": null,
                        "size": null,
                        "stats": stats_json(&s.snapshot()),
                    })
                };
                let queues: Vec<Value> = match (&p.device, p.port.kernel_stats()) {
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
                            json!({
                                "queue": i,
                                "direction": if i % 2 == 0 { "to-guest" } else { "from-guest" },
                                "ready": q.ready.load(Ordering::Relaxed),
                                "broken": vq.broken.map(|e| e.to_string()),
                                "size": vq.state.size,
                                "stats": stats_json(&s),
                            })
                        })
                        .collect(),
                };
                let [sw_csum, sw_tso, sw_segments] = p.port.offload.get();
                json!({
                    "port": p.cfg.name,
                    "coalesce": {
                        "usecs": p.cfg.coalesce().usecs,
                        "frames": p.cfg.coalesce().frames,
                    },
                    "offload": {
                        "sw_csum": sw_csum,
                        "sw_tso": sw_tso,
                        "sw_segments": sw_segments,
                    },
                    "rx": stats_json(&p.port.rx_stats()),
                    "tx": stats_json(&p.port.tx_stats()),
                    "vhost_user_errors": p.device.as_ref().map_or(0, |d| d.errors),
                    "refused_connections": p.refused_connections,
                    "migration": p.device.as_ref().map(|d| {
                        let m = d.migration_info();
                        json!({
                            "logging": m.logging,
                            "log_bytes": m.log_size,
                            "postcopy": m.postcopy,
                            "postcopy_pages_missing": m.pages_missing,
                            "postcopy_pages_fetched": m.pages_fetched,
                            "rarp_announces": m.rarps,
                        })
                    }),
                    "queues": queues,
                })
            })
            .collect();
        Ok(Value::Array(ports))
    }

    pub(super) fn pmd_raw(s: &dp::PmdStats) -> [u64; 4] {
        [
            s.busy_cycles.load(Ordering::Relaxed),
            s.idle_cycles.load(Ordering::Relaxed),
            s.rx_packets.load(Ordering::Relaxed),
            s.tx_packets.load(Ordering::Relaxed),
        ]
    }

    /// The megaflow caches of the bridges with rules (shared by every PMD).
    pub(super) fn megaflow_caches(&self) -> Value {
        let v: Vec<Value> = self
            .bridges
            .iter()
            .filter(|(_, b)| b.pipeline.is_some() || b.cache.size().0 > 0)
            .map(|(name, b)| {
                let c = &b.cache.counters;
                let (entries, subtables) = b.cache.size();
                let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                json!({
                    "bridge": name,
                    "rules": b.rules.len(),
                    "entries": entries,
                    "subtables": subtables,
                    "limit": b.cache.limit(),
                    "inserted": l(&c.inserted),
                    "evicted": l(&c.evicted),
                    "invalidated": l(&c.invalidated),
                    "revalidations": l(&c.revalidations),
                    "refused_full": l(&c.limit_refused),
                    "refused_stale": l(&c.stale_refused),
                })
            })
            .collect();
        Value::Array(v)
    }

    pub(super) fn pmd_stats(&self) -> Value {
        let hz = os::tsc_hz();
        let caches = self.megaflow_caches();
        let v: Vec<Value> = self
            .pmds
            .iter()
            .zip(&self.pmd_baseline)
            .map(|(p, base)| {
                let s = &p.stats;
                let raw = Self::pmd_raw(s);
                let [busy, idle, rx, tx] = [0, 1, 2, 3].map(|i| raw[i].saturating_sub(base[i]));
                let total = (busy + idle).max(1);
                let f = s.flow.load();
                let flow = json!({
                    "packets": f.packets,
                    "emc_hits": f.emc_hits,
                    "megaflow_hits": f.megaflow_hits,
                    "upcalls": f.upcalls,
                    "emc_inserts": f.emc_inserts,
                    "emc_skipped": f.emc_skipped,
                });
                json!({
                    "pmd": s.index,
                    "core": s.core,
                    "rx_queues": s.rxqs.load(Ordering::Relaxed),
                    "rx_packets": rx,
                    "tx_packets": tx,
                    "busy_cycles": busy,
                    "idle_cycles": idle,
                    "busy_pct": (busy as f64 * 100.0 / total as f64 * 10.0).round() / 10.0,
                    "cycles_per_packet": if rx > 0 { (busy as f64 / rx as f64 * 10.0).round() / 10.0 } else { 0.0 },
                    "iterations": s.iterations.load(Ordering::Relaxed),
                    "rx_mode": self.datapath.rx_mode().0.name(),
                    "sleep_max_us": self.datapath.sleep_max_ns() / 1000,
                    "priority": self.config.other.get("pmd-priority").map_or("normal", |v| v.as_str()),
                    "priority_error": s.priority_error.get(),
                    "sleeps": s.sleeps.load(Ordering::Relaxed),
                    "kick_wakeups": s.kick_wakeups.load(Ordering::Relaxed),
                    "load_sleeps": s.load_sleeps.load(Ordering::Relaxed),
                    "sleep_cycles": s.sleep_cycles.load(Ordering::Relaxed),
                    "sleep_us": (s.sleep_cycles.load(Ordering::Relaxed) as u128 * 1_000_000 / hz.max(1) as u128) as u64,
                    "tsc_hz": hz,
                    "hugepages": s.hugepages.load(Ordering::Relaxed),
                    "flow": flow,
                    "megaflow_caches": caches.clone(),
                })
            })
            .collect();
        Value::Array(v)
    }

    pub(super) fn mac_table(&self, bridge: &str) -> Result<Value, ConfigError> {
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
        let v: Vec<Value> = b
            .macs
            .dump(now)
            .into_iter()
            .map(|e| {
                json!({
                    "mac": ferrovs_packet::mac_to_string(e.mac),
                    "vlan": e.vlan,
                    "port": names.get(&e.port).copied().unwrap_or("?"),
                    "age": e.age,
                })
            })
            .collect();
        Ok(Value::Array(v))
    }
}

/// What `show` says about a kernel port's attachment (null for vhost-user ports).
pub(super) fn kernel_info(io: &PortIo) -> Value {
    match io {
        PortIo::Vhost { .. } => Value::Null,
        PortIo::Vxlan(v) => json!({
            "local": v.local.to_string(),
            "remote": v.remote.to_string(),
            "vni": v.vni,
            "rx": "recvfrom",
            "tx": "sendto",
        }),
        PortIo::Tap(t) => json!({
            "device": t.tap.name(),
            "vnet_hdr_len": ferrovs_sys::tap::VNET_HDR_LEN,
            "offloads": Vec::<&str>::new(),
        }),
        PortIo::Uplink(u) => {
            let g = u.geometry;
            json!({
                "ifindex": u.sock.ifindex(),
                "ignore_outgoing": u.sock.ignores_outgoing(),
                "rx": "tpacket_v3",
                "tx": "sendmmsg",
                "ring_blocks": g.block_nr,
                "ring_block_size": g.block_size,
                "ring_block_timeout_ms": ferrovs_sys::af_packet::RETIRE_BLOCK_MS,
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
            json!({
                "ifindex": x.sock.ifindex(),
                "queue": 0,
                "xdp_mode": x.sock.xdp_mode().name(),
                "bind": if x.sock.zero_copy() { "zero-copy" } else { "copy" },
                "rx": "af_xdp",
                "tx": "af_xdp",
                "umem_frame_size": g.frame_size,
                "umem_rx_frames": g.rx_frames,
                "umem_tx_frames": g.tx_frames,
                "rx_frames_with_kernel": posted,
                "tx_frames_free": free,
                "tx_frames_in_flight": outstanding,
                "frames_lost": lost + bad,
            })
        }
    }
}
