//! PMD threads: starting them on their cores, their rx mode, and the datapath snapshots
//! published to them RCU-style (a new snapshot, then a wait until every PMD moved past it).

use super::*;

impl Daemon {
    pub(super) fn pmd_cores(&self) -> Vec<usize> {
        if !self.config.pmd_cores.is_empty() {
            return self.config.pmd_cores.clone();
        }
        vec![*self.all_cpus.last().unwrap_or(&0)]
    }

    pub(super) fn start_pmds(&mut self) -> io::Result<()> {
        for mut p in self.pmds.drain(..) {
            p.stop();
        }
        let cores = self.pmd_cores();
        // Validated when set; a bad value in a hand-edited file means normal.
        let priority = self
            .config
            .other
            .get("pmd-priority")
            .and_then(|v| config::parse_priority(v).ok())
            .flatten();
        for (i, c) in cores.iter().enumerate() {
            self.pmds.push(PmdHandle::spawn(
                i,
                Some(*c),
                priority,
                self.datapath.clone(),
                self.clock.clone(),
            )?);
        }
        self.pmd_baseline = vec![report::PmdCounters::default(); cores.len()];
        self.apply_rx_mode();
        // Keep the control thread off the PMD cores when there is another core (as OVS keeps
        // non-PMD threads outside pmd-cpu-mask): a PMD never waits behind it, and it never
        // waits behind a PMD.
        let others: Vec<usize> = self
            .all_cpus
            .iter()
            .copied()
            .filter(|c| !cores.contains(c))
            .collect();
        let _ = os::set_affinity(if others.is_empty() {
            &self.all_cpus
        } else {
            &others
        });
        self.publish();
        Ok(())
    }

    /// Applies `pmd-rx-mode`, `pmd-sleep-after-us`, `pmd-sleep-max-us`,
    /// `pmd-quiet-rxq-poll-us` and `emc-insert-inv-prob` to the PMDs.
    pub(super) fn apply_rx_mode(&self) {
        let mode = self
            .config
            .other
            .get("pmd-rx-mode")
            .and_then(|m| dp::RxMode::parse(m))
            .unwrap_or_default();
        let after = self
            .config
            .setting_u32("pmd-sleep-after-us", dp::DEFAULT_SLEEP_AFTER_US as u32);
        self.datapath.set_rx_mode(mode, after as u64);
        self.datapath
            .set_sleep_max_us(self.config.setting_u32("pmd-sleep-max-us", 0) as u64);
        self.datapath.set_quiet_rxq_poll_us(
            self.config
                .setting_u32("pmd-quiet-rxq-poll-us", dp::quiet::DEFAULT_POLL_US as u32)
                as u64,
        );
        self.datapath
            .set_emc_insert_inv_prob(self.config.setting_u32(
                "emc-insert-inv-prob",
                dp::flow::emc::DEFAULT_INSERT_INV_PROB,
            ));
        for p in &self.pmds {
            p.wake();
        }
    }

    /// Builds and publishes the datapath snapshot from the current state. When a bridge's
    /// rules (or the ports its rules name) changed, its pipeline is rebuilt with the next
    /// generation, its megaflow cache revalidated, and this returns only once every PMD has
    /// finished the iteration it was in: from then on no packet is decided by a replaced rule.
    pub(super) fn publish(&mut self) {
        let mut rebuilt = Vec::new();
        let fail_open: std::collections::HashSet<String> = self
            .bridges
            .keys()
            .filter(|b| self.is_fail_open(b))
            .cloned()
            .collect();
        // Ports not live (link, carrier, PORT_MOD down: `ofports.rs`).
        let dead: std::collections::HashSet<String> = self
            .ports
            .values()
            .filter(|p| !self.port_live(p))
            .map(|p| p.cfg.name.clone())
            .collect();
        for (name, b) in self.bridges.iter_mut() {
            // Link state matters only to buckets that watch a port.
            let watch = b.rules.watches_ports();
            let mut members: Vec<(String, u32, bool)> = self
                .ports
                .values()
                .filter(|p| &p.bridge == name)
                .map(|p| {
                    let up = watch && !dead.contains(&p.cfg.name);
                    (p.cfg.name.clone(), p.id, up)
                })
                .collect();
            members.sort();
            if !b.dirty && (b.pipeline.is_none() || members == b.built_ports) {
                continue;
            }
            b.dirty = false;
            b.gen += 1;
            let same_ports = members == b.built_ports;
            // Fail-open: OVS's hidden NORMAL rule above every other is plain NORMAL.
            b.pipeline = if b.rules.is_plain_normal() || fail_open.contains(name) {
                b.rules.take_changes();
                None
            } else {
                // A rule's port is a name, or (OpenFlow's rules on ports the bridge did not
                // have then) a number, resolved by OpenFlow number now.
                let numbers: Vec<(u32, u32)> = self
                    .ports
                    .values()
                    .filter(|p| &p.bridge == name)
                    .map(|p| (u32::from(p.ofport), p.id))
                    .collect();
                let resolve = |n: &str| {
                    members
                        .iter()
                        .find(|(m, ..)| m == n)
                        .map(|(_, id, _)| *id)
                        .or_else(|| {
                            let no = crate::openflow::absent_port_number(n)?;
                            numbers.iter().find(|(o, _)| *o == no).map(|(_, id)| *id)
                        })
                };
                let live = |id: u32| !watch || members.iter().any(|(_, i, up)| *i == id && *up);
                // A few rules changed, the ports (and their links) did not: change a copy
                // of the published pipeline (one FLOW_MOD per barrier stays O(log n)).
                let current = b.pipeline.as_deref().filter(|_| same_ports);
                let mut p = b.rules.rebuild(current, &resolve, &live);
                // What registers hold is OpenFlow port numbers (output:reg15, in_port).
                p.set_port_numbers(ferrovs_flow::pipeline::PortNumbers::new(
                    self.ports
                        .values()
                        .filter(|p| &p.bridge == name)
                        .map(|p| (u32::from(p.ofport), p.id)),
                ));
                Some(Arc::new(p))
            };
            b.built_ports = members;
            rebuilt.push(name.clone());
        }
        self.publish_snapshot();
        if rebuilt.is_empty() {
            return;
        }
        for name in &rebuilt {
            let b = &self.bridges[name];
            b.cache.revalidate(b.pipeline.as_deref(), b.gen);
        }
        self.quiesce();
    }

    /// Waits until every PMD finished the iteration it was in (at most 1 s: a PMD that does
    /// not move on is stuck elsewhere, and waiting longer would stall the control plane).
    /// Not in standby (a new daemon preparing a hot upgrade): its PMDs were started parked
    /// and park until the resume, holding no snapshot, and a parked PMD's epoch does not
    /// move, so the wait would only last its 1 s, once per publish, while the old daemon's
    /// control thread waits for `ready` (prepare was 4.0 s with a bridge holding rules).
    pub(super) fn quiesce(&self) {
        if self.datapath.standby() {
            return;
        }
        if !self.wait_pmd_iterations() {
            log::warn!("a PMD did not finish its iteration within 1 s");
        }
    }

    /// Wakes every PMD (one waiting for work must finish that wait) and waits until each
    /// finished the iteration it was in: its epoch moved on. False after
    /// [`PMD_ITERATION_TIMEOUT`].
    pub(super) fn wait_pmd_iterations(&self) -> bool {
        let seen: Vec<u64> = self
            .pmds
            .iter()
            .map(|p| p.stats.epoch.load(Ordering::Acquire))
            .collect();
        for p in &self.pmds {
            p.wake();
        }
        let t = Instant::now();
        while !self
            .pmds
            .iter()
            .zip(&seen)
            .all(|(p, s)| p.stats.epoch.load(Ordering::Acquire) > *s)
        {
            let waited = t.elapsed();
            if waited > PMD_ITERATION_TIMEOUT {
                return false;
            }
            if waited < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else {
                // A PMD sharing our core (no spare core) needs it to finish its burst.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        true
    }

    pub(super) fn publish_snapshot(&mut self) {
        let mut ports: Vec<Option<Arc<Port>>> = vec![None; self.port_slots.len()];
        // A port an OpenFlow peer set down (PORT_MOD) is out of the datapath: not polled,
        // never an output.
        for p in self
            .ports
            .values()
            .filter(|p| !self.of_admin_down(&p.cfg.name))
        {
            ports[p.id as usize] = Some(p.port.clone());
        }
        // The packet-in queue exists once some bridge has rules beyond the default.
        let packet_in = if self.bridges.values().any(|b| b.pipeline.is_some()) {
            self.packet_in_queue()
        } else {
            self.openflow.packet_in.clone()
        };
        let with_rules: Vec<String> = self
            .bridges
            .iter()
            .filter(|(_, b)| b.pipeline.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        let learn: HashMap<String, Arc<ferrovs_datapath::flow::learn::LearnQueue>> = with_rules
            .into_iter()
            .filter_map(|n| self.learn_queue(&n).map(|q| (n, q)))
            .collect();
        let mut bridges: Vec<Option<Arc<Bridge>>> = vec![None; self.bridge_slots.len()];
        for (name, b) in &self.bridges {
            let members = self
                .ports
                .values()
                .filter(|p| &p.bridge == name && !self.of_admin_down(&p.cfg.name))
                .map(|p| p.id)
                .collect();
            let flows = b.pipeline.as_ref().map(|p| BridgeFlows {
                pipeline: p.clone(),
                gen: b.gen,
                cache: b.cache.clone(),
                meters: b.meters.clone(),
                packet_in: packet_in.clone(),
                conntrack: self.conntrack.clone(),
                learn: learn.get(name).cloned(),
            });
            let default_rule = (b.pipeline.is_none() && !self.is_fail_open(name))
                .then(|| b.rules.rules().first().map(|r| r.stats.clone()))
                .flatten();
            bridges[b.id as usize] = Some(Arc::new(Bridge {
                name: name.clone(),
                macs: b.macs.clone(),
                ports: members,
                flows,
                default_rule,
            }));
        }
        let pmd_rxqs = self.rxq_assignment(&ports);
        self.datapath.publish(Snapshot {
            bridges,
            ports,
            pmd_rxqs,
        });
        // A sleeping PMD looks at its (new) work at once.
        for p in &self.pmds {
            p.wake();
        }
    }
}
