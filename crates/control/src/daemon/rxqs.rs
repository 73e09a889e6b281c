//! Rx queue assignment (`pmd-rxq-assign`), its measured loads, `pmd-rebalance` and the auto
//! load balancer (`pmd-auto-lb`), as OVS's dpif-netdev does them.
//!
//! The assignment is made when the set of rx queues, the number of PMDs or the pins
//! (`pmd-rxq-affinity`) change, on
//! `pmd-rebalance`, and by the auto load balancer; every other snapshot (rules, links, a new
//! `pmd-rxq-assign`) keeps the one in use, so queues do not move on every flow change, and a
//! new mode applies from the next reassignment (`pmd-rebalance` applies it at once). Loads are what the PMDs
//! measured ([`dp::rxq`]): this thread starts each queue's history when it first sees it
//! (on the 100 ms tick) and closes an interval every [`dp::rxq::INTERVAL_SECS`].
//!
//! Moving a queue loses nothing and never has two PMDs poll it at once: the new snapshot
//! moves it from one PMD's list to another's, the old PMD may finish the burst it is in, but
//! every receive takes the queue's lock with `try_lock` (a vhost-user virtqueue, a kernel
//! port's ring), so the other PMD skips it for that iteration; packets not yet taken stay in
//! the guest's ring (or the kernel's) for the new PMD, and deferred guest notifications are
//! held by queue, not by PMD.

use super::*;
use dp::rxq::{self as rq, AssignMode, RxqInfo};
use dp::RxqRef;
use ferrovs_proto::reply;

/// The control thread's rx queue state.
#[derive(Debug, Default)]
pub(super) struct RxqCtl {
    /// The assignment in use, and the queues, PMD count and mode it was made for.
    current: Vec<Vec<RxqRef>>,
    made_for: Option<(Vec<RxqRef>, usize, Vec<Option<usize>>)>,
    /// The next snapshot deals the queues again (`pmd-rebalance`, the auto load balancer).
    force: bool,
    last_interval: Option<Instant>,
    last_auto: Option<Instant>,
    /// Reassignments made by `pmd-rebalance` and by the auto load balancer.
    pub rebalances: u64,
    pub auto_rebalances: u64,
}

/// Defaults of the auto load balancer's settings (OVS's).
const AUTO_LB_LOAD_THRESHOLD: u32 = 95;
const AUTO_LB_IMPROVEMENT_THRESHOLD: u32 = 25;
const AUTO_LB_REBAL_INTERVAL_MIN: u32 = 1;

impl Daemon {
    /// `pmd-rxq-assign` (validated when set; default cycles).
    pub(super) fn rxq_assign_mode(&self) -> AssignMode {
        self.config
            .other
            .get("pmd-rxq-assign")
            .and_then(|m| AssignMode::parse(m))
            .unwrap_or_default()
    }

    /// The PMD (index) each of `rxqs` is pinned to by its port's `pmd-rxq-affinity`; a
    /// core without a PMD pins nothing (as OVS, the queue is dealt as the others).
    fn rxq_pins(&self, rxqs: &[RxqRef]) -> Vec<Option<usize>> {
        let cores = self.pmd_cores();
        let by_id: HashMap<u32, Vec<(u16, usize)>> = self
            .ports
            .values()
            .filter(|p| p.cfg.pmd_rxq_affinity.is_some())
            .map(|p| (p.id, p.cfg.rxq_affinity()))
            .collect();
        rxqs.iter()
            .map(|r| {
                let (_, core) = by_id.get(&r.port)?.iter().find(|(q, _)| *q == r.pair)?;
                cores.iter().position(|c| c == core)
            })
            .collect()
    }

    /// Every rx queue of `ports` with its measured load (ppm of a core, 0 without history)
    /// and its pin.
    fn rxq_infos(&self, ports: &[Option<Arc<Port>>]) -> Vec<RxqInfo> {
        let now = os::rdtsc();
        let rxqs = dp::all_rxqs(ports);
        let pins = self.rxq_pins(&rxqs);
        rxqs.into_iter()
            .zip(pins)
            .map(|(rxq, pin)| RxqInfo {
                rxq,
                load: ports[rxq.port as usize]
                    .as_ref()
                    .and_then(|p| p.rxq_load.load_ppm(rxq.pair, now))
                    .unwrap_or(0),
                pin,
            })
            .collect()
    }

    /// The rx queues of each PMD for a snapshot of `ports`: the assignment in use when it
    /// still fits, else a new one.
    pub(super) fn rxq_assignment(&mut self, ports: &[Option<Arc<Port>>]) -> Vec<Vec<RxqRef>> {
        let mode = self.rxq_assign_mode();
        let pmds = self.pmds.len().max(1);
        let rxqs = dp::all_rxqs(ports);
        let pins = self.rxq_pins(&rxqs);
        let key = (rxqs, pmds, pins);
        if !self.rxq.force && self.rxq.made_for.as_ref() == Some(&key) {
            return self.rxq.current.clone();
        }
        self.rxq.force = false;
        let infos = self.rxq_infos(ports);
        let a = rq::assign(mode, &infos, pmds);
        if self.rxq.made_for.is_some() && a != self.rxq.current {
            log::info!(
                "rx queues assigned ({}): {}",
                mode.name(),
                self.describe_assignment(&a, &infos)
            );
        }
        self.rxq.current = a.clone();
        self.rxq.made_for = Some(key);
        a
    }

    /// "pmd0: vm1/0 (43 %), ...; pmd1: ..." for the log.
    fn describe_assignment(&self, a: &[Vec<RxqRef>], infos: &[RxqInfo]) -> String {
        a.iter()
            .enumerate()
            .map(|(i, qs)| {
                let list: Vec<String> = qs
                    .iter()
                    .map(|r| {
                        let load = infos.iter().find(|q| q.rxq == *r).map_or(0, |q| q.load);
                        format!(
                            "{}/{} ({} %)",
                            self.port_name_of(r.port),
                            r.pair,
                            load / 10_000
                        )
                    })
                    .collect();
                format!("pmd{i}: {}", list.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn port_name_of(&self, id: u32) -> &str {
        self.ports
            .values()
            .find(|p| p.id == id)
            .map_or("?", |p| p.cfg.name.as_str())
    }

    /// `pmd-rebalance`: deals the rx queues again by their measured loads (as `ovs-appctl
    /// dpif-netdev/pmd-rxq-rebalance`).
    pub(super) fn pmd_rebalance(&mut self) -> Result<(), ConfigError> {
        if self.pmds.len() < 2 {
            return Err(ConfigError::Invalid(format!(
                "pmd-rebalance: only one PMD (pmd-cores {}): nothing to balance",
                self.pmd_cores()
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        self.rxq.force = true;
        self.rxq.rebalances += 1;
        self.publish_snapshot();
        Ok(())
    }

    /// The tick's part: start new queues' history, close an interval when due, and let the
    /// auto load balancer look at it.
    pub(super) fn rxq_tick(&mut self) {
        let now = os::rdtsc();
        for p in self.ports.values() {
            p.port.rxq_load.start(p.port.rx_queues(), now);
        }
        let due = self
            .rxq
            .last_interval
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(rq::INTERVAL_SECS));
        if !due {
            return;
        }
        self.rxq.last_interval = Some(Instant::now());
        for p in self.ports.values() {
            p.port.rxq_load.sample(p.port.rx_queues(), now);
        }
        self.auto_load_balance();
    }

    /// The auto load balancer (OVS `pmd-auto-lb`): when some PMD's measured load is at or
    /// over `pmd-auto-lb-load-threshold` %, dry-run the assignment; apply it when it lowers
    /// the variance of the PMDs' loads by `pmd-auto-lb-improvement-threshold` % or more, at
    /// most once per `pmd-auto-lb-rebal-interval` minutes. Not with roundrobin (it ignores
    /// loads), nor with one PMD.
    fn auto_load_balance(&mut self) {
        let on = self
            .config
            .other
            .get("pmd-auto-lb")
            .is_some_and(|v| v == "true");
        let mode = self.rxq_assign_mode();
        if !on || mode == AssignMode::RoundRobin || self.pmds.len() < 2 {
            return;
        }
        let every = Duration::from_secs(
            60 * u64::from(
                self.config
                    .setting_u32("pmd-auto-lb-rebal-interval", AUTO_LB_REBAL_INTERVAL_MIN),
            ),
        );
        if self.rxq.last_auto.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        let snap = self.datapath.load();
        let infos = self.rxq_infos(&snap.ports);
        let threshold = self
            .config
            .setting_u32("pmd-auto-lb-load-threshold", AUTO_LB_LOAD_THRESHOLD);
        let improve = self.config.setting_u32(
            "pmd-auto-lb-improvement-threshold",
            AUTO_LB_IMPROVEMENT_THRESHOLD,
        );
        let now = rq::pmd_loads(&snap.pmd_rxqs, &infos);
        let dry = rq::assign(mode, &infos, self.pmds.len());
        if dry == snap.pmd_rxqs {
            return;
        }
        let Some(gain) =
            rq::worth_rebalancing(&now, &rq::pmd_loads(&dry, &infos), threshold, improve)
        else {
            return;
        };
        log::info!(
            "auto load balance: a PMD is over {threshold} % (loads {:?} %), variance improves \
             {gain:.0} %: reassigning",
            now.iter().map(|l| l / 10_000).collect::<Vec<_>>()
        );
        self.rxq.last_auto = Some(Instant::now());
        self.rxq.auto_rebalances += 1;
        self.rxq.force = true;
        self.publish_snapshot();
    }

    /// Each PMD's rx queues as `pmd-stats` shows them.
    pub(super) fn pmd_rxq_usage(&self) -> Vec<Vec<reply::RxqUsage>> {
        let snap = self.datapath.load();
        let now = os::rdtsc();
        (0..self.pmds.len())
            .map(|i| {
                snap.pmd_rxqs
                    .get(i)
                    .map(|qs| {
                        qs.iter()
                            .filter_map(|r| {
                                let p = snap.port(r.port)?;
                                let enabled = match &p.io {
                                    PortIo::Vhost { queues } => queues
                                        .get(2 * r.pair as usize + 1)
                                        .is_some_and(|q| q.ready.load(Ordering::Relaxed)),
                                    _ => true,
                                };
                                Some(reply::RxqUsage {
                                    port: p.name.clone(),
                                    queue: r.pair,
                                    enabled,
                                    usage_pct: p
                                        .rxq_load
                                        .load_ppm(r.pair, now)
                                        .map(|ppm| (ppm as f64 / 1000.0).round() / 10.0),
                                })
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    }
}
