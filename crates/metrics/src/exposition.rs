//! The daemon's counters as Prometheus metrics: a [`Scrape`] (the replies `ferrovs show`,
//! `port-stats`, `pmd-stats`, `upgrade-history` and `conntrack-stats` read)
//! rendered in the Prometheus text exposition format (version 0.0.4) by the official client
//! crate, `prometheus-client`, which owns the naming rules (`_total` on counters), the
//! `# HELP`/`# TYPE` lines and the escaping of label values.
//!
//! Nothing here counts anything: every value is one the daemon already reports, renamed by
//! Prometheus conventions (`ferrovs_` prefix, base units: seconds and bytes, one label per
//! dimension: `bridge`, `port`, `queue`, `reason`, `pmd`). A drop reason appears once it
//! has counted (the daemon reports those only); enumerations (a port's or the OVSDB
//! connection's state) are one gauge per possible state, 1 for the current one.
//! `docs/observability.md` lists every metric.

use std::collections::BTreeMap;

use ferrovs_proto::reply::{ConntrackStats, DirStats, PmdStats, PortStats, Show, UpgradeReport};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`render`] writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The states a port reports (`ShowPort::state`).
pub const PORT_STATES: &[&str] = &["listening", "connected", "reconnecting", "attached"];

/// The states of the OVSDB connection (`OvsdbStatus::state`).
pub const OVSDB_STATES: &[&str] = &["connecting", "syncing", "synced", "backoff"];

/// Everything one scrape reads from the daemon, as its control socket answers.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub show: Show,
    pub ports: Vec<PortStats>,
    pub pmds: Vec<PmdStats>,
    /// The last hot upgrade (`upgrade-history`), if any.
    pub last_upgrade: Option<UpgradeReport>,
    /// `conntrack-stats` (None if the daemon did not answer it).
    pub conntrack: Option<ConntrackStats>,
    /// Rules per (bridge, table), as `show` counts them.
    pub flows: BTreeMap<(String, u64), u64>,
}

type Labels = Vec<(&'static str, String)>;

/// A sample's value as the daemon reported it.
#[derive(Debug, Clone, Copy)]
enum Value {
    Int(u64),
    Float(f64),
}

/// One metric family: its help, type and samples in the order they were added.
#[derive(Debug)]
struct Fam {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Labels, Value)>,
}

/// Every family of one scrape, in first-use order, written by the client crate's encoder
/// as a [`Collector`]: a scrape's output is then in a stable order (ports as `show` lists
/// them), which a registry of `Family` metrics (hash maps) would not give.
#[derive(Debug, Default)]
struct Families(Vec<Fam>);

impl Collector for Families {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let ty = if f.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            // Help texts end in a full stop, as the registry writes those it registers.
            let help = format!("{}.", f.help);
            let mut me = enc.encode_descriptor(f.name, &help, None, ty)?;
            for (labels, v) in &f.samples {
                let e = me.encode_family(labels)?;
                match (f.counter, *v) {
                    (true, Value::Int(n)) => ConstCounter::new(n).encode(e)?,
                    (true, Value::Float(x)) => ConstCounter::new(x).encode(e)?,
                    // Gauges are signed; a count past i64::MAX saturates.
                    (false, Value::Int(n)) => {
                        ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(e)?
                    }
                    (false, Value::Float(x)) => ConstGauge::new(x).encode(e)?,
                }
            }
        }
        Ok(())
    }
}

/// Collects one scrape's samples; [`Builder::finish`] encodes them.
struct Builder {
    fams: Families,
    index: BTreeMap<&'static str, usize>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            fams: Families::default(),
            index: BTreeMap::new(),
        }
    }

    fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        counter: bool,
        labels: Labels,
        v: Value,
    ) {
        let fams = &mut self.fams.0;
        let i = *self.index.entry(name).or_insert_with(|| {
            fams.push(Fam {
                name,
                help,
                counter,
                samples: Vec::new(),
            });
            fams.len() - 1
        });
        debug_assert_eq!(fams[i].counter, counter, "{name}: one type per family");
        fams[i].samples.push((labels, v));
    }

    /// A counter; `name` without the prefix and without `_total` (the encoder adds both).
    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, v: u64) {
        self.add(name, help, true, labels, Value::Int(v));
    }

    /// An integer gauge.
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, v: u64) {
        self.add(name, help, false, labels, Value::Int(v));
    }

    fn float(&mut self, name: &'static str, help: &'static str, labels: Labels, v: f64) {
        self.add(name, help, false, labels, Value::Float(v));
    }

    /// One gauge per state in `all` (and `current`, if it is none of them): 1 for `current`.
    fn state_set(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &Labels,
        all: &[&str],
        current: &str,
    ) {
        let mut states: Vec<&str> = all.to_vec();
        if !states.contains(&current) {
            states.push(current);
        }
        for s in states {
            let mut l = labels.clone();
            l.push(("state", s.to_string()));
            self.gauge(name, help, l, u64::from(s == current));
        }
    }

    fn finish(self) -> String {
        let mut reg = Registry::with_prefix("ferrovs");
        reg.register_collector(Box::new(self.fams));
        let mut out = String::new();
        // Writing to a String cannot fail; the encoder fails only on its writer's errors.
        let _ = prometheus_text::encode(&mut out, &reg);
        out
    }
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Packets, bytes and drops by reason of one direction.
fn direction(
    b: &mut Builder,
    names: [&'static str; 3],
    helps: [&'static str; 3],
    labels: &Labels,
    s: &DirStats,
) {
    b.counter(names[0], helps[0], labels.clone(), s.packets);
    b.counter(names[1], helps[1], labels.clone(), s.bytes);
    for (reason, n) in &s.drops {
        let mut l = labels.clone();
        l.push(("reason", reason.clone()));
        b.counter(names[2], helps[2], l, *n);
    }
}

/// The text exposition of one scrape.
pub fn render(s: &Scrape) -> String {
    let mut b = Builder::new();
    let show = &s.show;
    b.gauge(
        "build_info",
        "The running ferrovsd's version (always 1)",
        l(&[("version", &show.version)]),
        1,
    );
    b.counter(
        "control_bad_requests",
        "Control socket requests refused (malformed or invalid)",
        vec![],
        show.bad_control_requests,
    );
    b.counter(
        "log_lines_suppressed",
        "Log lines the rate limiter left out (per port and reason)",
        vec![],
        show.log_lines_suppressed,
    );

    // Ports: state from `show`, counters from `port-stats`.
    let mut bridge_of: BTreeMap<&str, &str> = BTreeMap::new();
    for br in &show.bridges {
        for p in &br.ports {
            bridge_of.insert(&p.name, &br.name);
            let labels = l(&[("bridge", &br.name), ("port", &p.name)]);
            b.state_set(
                "port_state",
                "The port's connection state (vhost-user: listening, connected, reconnecting; kernel ports: attached); 1 for the current one",
                &labels,
                PORT_STATES,
                &p.state,
            );
            b.counter(
                "port_connects",
                "vhost-user connections the port accepted or made",
                labels.clone(),
                p.connects,
            );
            b.counter(
                "port_disconnects",
                "vhost-user connections the port lost",
                labels.clone(),
                p.disconnects,
            );
            b.gauge(
                "port_queues",
                "Queues the port has",
                labels.clone(),
                u64::from(p.queues),
            );
            b.gauge(
                "port_ready_queues",
                "Queues ready (started by the guest, or a kernel port's)",
                labels.clone(),
                p.ready_queues as u64,
            );
        }
    }
    for p in &s.ports {
        let bridge = bridge_of.get(p.port.as_str()).copied().unwrap_or("");
        let labels = l(&[("bridge", bridge), ("port", &p.port)]);
        direction(
            &mut b,
            ["port_rx_packets", "port_rx_bytes", "port_rx_drops"],
            [
                "Packets the switch received on the port (from the guest or the kernel)",
                "Bytes the switch received on the port",
                "Packets or buffers received on the port and dropped, by reason",
            ],
            &labels,
            &p.rx,
        );
        direction(
            &mut b,
            ["port_tx_packets", "port_tx_bytes", "port_tx_drops"],
            [
                "Packets the switch sent on the port (to the guest or the kernel)",
                "Bytes the switch sent on the port",
                "Packets to be sent on the port and dropped, by reason",
            ],
            &labels,
            &p.tx,
        );
        b.counter(
            "port_vhost_user_errors",
            "vhost-user protocol messages refused on the port",
            labels.clone(),
            p.vhost_user_errors,
        );
        b.counter(
            "port_refused_connections",
            "vhost-user connections refused (one already active)",
            labels.clone(),
            p.refused_connections,
        );
        for q in &p.queues {
            let queue = q.queue.to_string();
            let ql = l(&[("bridge", bridge), ("port", &p.port), ("queue", &queue)]);
            if q.direction.starts_with("from-") {
                direction(
                    &mut b,
                    ["queue_rx_packets", "queue_rx_bytes", "queue_rx_drops"],
                    [
                        "Packets the switch received on the queue",
                        "Bytes the switch received on the queue",
                        "Packets or buffers received on the queue and dropped, by reason",
                    ],
                    &ql,
                    &q.stats,
                );
            } else {
                direction(
                    &mut b,
                    ["queue_tx_packets", "queue_tx_bytes", "queue_tx_drops"],
                    [
                        "Packets the switch sent on the queue",
                        "Bytes the switch sent on the queue",
                        "Packets to be sent on the queue and dropped, by reason",
                    ],
                    &ql,
                    &q.stats,
                );
            }
            b.gauge(
                "queue_ready",
                "1 if the queue is ready (started and not broken)",
                ql.clone(),
                u64::from(q.ready),
            );
            if let Some(n) = q.available {
                b.gauge(
                    "queue_available",
                    "Descriptors the guest made available that the switch has not taken: \
                     packets waiting (from-guest) or empty buffers posted (to-guest)",
                    ql.clone(),
                    u64::from(n),
                );
            }
            b.gauge(
                "queue_broken",
                "1 if the queue stopped on a guest's bad ring",
                ql,
                u64::from(q.broken.is_some()),
            );
        }
    }

    // PMD threads.
    for p in &s.pmds {
        let pmd = p.pmd.to_string();
        let labels = l(&[("pmd", &pmd)]);
        let c = |b: &mut Builder, name, help, v| b.counter(name, help, labels.clone(), v);
        c(
            &mut b,
            "pmd_busy_cycles",
            "TSC cycles the PMD spent on iterations that moved packets",
            p.busy_cycles,
        );
        c(
            &mut b,
            "pmd_idle_cycles",
            "TSC cycles the PMD spent polling empty queues",
            p.idle_cycles,
        );
        c(
            &mut b,
            "pmd_sleep_cycles",
            "TSC cycles the PMD spent asleep (waiting for a kick, and load-based sleeps)",
            p.sleep_cycles,
        );
        c(
            &mut b,
            "pmd_iterations",
            "Poll loop iterations",
            p.iterations,
        );
        c(
            &mut b,
            "pmd_sleeps",
            "Times the PMD slept until a kick (adaptive and interrupt mode)",
            p.sleeps,
        );
        c(
            &mut b,
            "pmd_rx_packets",
            "Packets the PMD received from its queues",
            p.rx_packets,
        );
        c(
            &mut b,
            "pmd_tx_packets",
            "Packets the PMD sent",
            p.tx_packets,
        );
        c(
            &mut b,
            "pmd_emc_hits",
            "Packets classified by the exact-match cache",
            p.flow.emc_hits,
        );
        c(
            &mut b,
            "pmd_megaflow_hits",
            "Packets classified by the megaflow cache (EMC misses)",
            p.flow.megaflow_hits,
        );
        c(
            &mut b,
            "pmd_upcalls",
            "Packets that missed both caches and went to the slow path",
            p.flow.upcalls,
        );
        c(
            &mut b,
            "pmd_emc_inserts",
            "Exact-match cache insertions",
            p.flow.emc_inserts,
        );
        c(
            &mut b,
            "pmd_recirculations",
            "Passes after a packet's first (ct(table=T) recirculations)",
            p.flow.recirculations,
        );
        b.float(
            "pmd_cycles_per_packet",
            "Busy TSC cycles per packet received, since the counters were last cleared",
            labels.clone(),
            p.cycles_per_packet,
        );
        b.float(
            "pmd_busy_ratio",
            "Busy cycles over busy and idle cycles (0 to 1)",
            labels.clone(),
            p.busy_pct / 100.0,
        );
        b.gauge(
            "pmd_rx_queues",
            "Queues the PMD polls",
            labels.clone(),
            p.rx_queues,
        );
        b.gauge(
            "pmd_tsc_hertz",
            "The TSC frequency cycle counters count at",
            labels.clone(),
            p.tsc_hz,
        );
    }
    // Megaflow caches: every PMD reports the same list; the first one's is enough.
    for m in s
        .pmds
        .first()
        .map(|p| &p.megaflow_caches[..])
        .unwrap_or(&[])
    {
        let labels = l(&[("bridge", &m.bridge)]);
        b.gauge(
            "megaflow_entries",
            "Megaflows cached",
            labels.clone(),
            m.entries,
        );
        b.gauge(
            "megaflow_limit",
            "The megaflow cache's size limit",
            labels.clone(),
            m.limit,
        );
        b.gauge(
            "megaflow_subtables",
            "Masks (subtables) in the megaflow cache",
            labels.clone(),
            m.subtables,
        );
        b.counter(
            "megaflow_inserted",
            "Megaflows installed",
            labels.clone(),
            m.inserted,
        );
        b.counter(
            "megaflow_evicted",
            "Megaflows evicted (idle or over the limit)",
            labels.clone(),
            m.evicted,
        );
        b.counter(
            "megaflow_invalidated",
            "Megaflows removed by revalidation after a rule change",
            labels.clone(),
            m.invalidated,
        );
        b.counter(
            "megaflow_revalidations",
            "Revalidation passes",
            labels.clone(),
            m.revalidations,
        );
        for (reason, n) in [("full", m.refused_full), ("stale", m.refused_stale)] {
            let mut rl = labels.clone();
            rl.push(("reason", reason.into()));
            b.counter(
                "megaflow_refused",
                "Megaflow installs refused, by reason (full: at the limit; stale: the rules changed meanwhile)",
                rl,
                n,
            );
        }
        b.gauge(
            "bridge_rules",
            "OpenFlow rules installed on the bridge (every table)",
            labels,
            m.rules,
        );
    }
    for ((bridge, table), n) in &s.flows {
        let t = table.to_string();
        b.gauge(
            "flows",
            "OpenFlow rules installed, per table",
            l(&[("bridge", bridge), ("table", &t)]),
            *n,
        );
    }

    // Connection tracking.
    if let Some(ct) = &s.conntrack {
        b.gauge(
            "conntrack_entries",
            "Connections in the connection tracker",
            vec![],
            ct.entries,
        );
        b.gauge(
            "conntrack_max_entries",
            "The connection tracker's limit",
            vec![],
            u64::from(ct.max_entries),
        );
        for (name, help, v) in [
            ("conntrack_created", "Connections committed", ct.created),
            ("conntrack_expired", "Connections expired", ct.expired),
            (
                "conntrack_invalid",
                "Packets the tracker found invalid",
                ct.invalid,
            ),
            (
                "conntrack_limit_hits",
                "Commits refused by the global or a zone limit",
                ct.limit_hits,
            ),
            (
                "conntrack_nat_exhausted",
                "Commits with NAT refused: no free tuple",
                ct.nat_exhausted,
            ),
        ] {
            b.counter(name, help, vec![], v);
        }
    }

    // Hot upgrades.
    b.counter(
        "upgrades",
        "Hot upgrades this daemon's line has gone through",
        vec![],
        show.upgrades,
    );
    if let Some(u) = &s.last_upgrade {
        b.float(
            "upgrade_last_downtime_seconds",
            "The last hot upgrade's forwarding gap (old daemon's freeze to the new PMDs running)",
            vec![],
            u.downtime_us / 1e6,
        );
        b.float(
            "upgrade_last_timestamp_seconds",
            "Unix time of the last hot upgrade",
            vec![],
            u.at as f64,
        );
    }

    // OpenFlow and OVSDB connections.
    for br in &show.bridges {
        let Some(of) = &br.openflow else { continue };
        let labels = l(&[("bridge", &br.name)]);
        b.gauge(
            "openflow_management_connections",
            "Connections on the bridge's management socket",
            labels.clone(),
            of.management_connections,
        );
        b.gauge(
            "openflow_fail_open",
            "1 if no controller connected for long enough and the bridge forwards as a learning switch",
            labels.clone(),
            u64::from(of.fail_open),
        );
        for c in &of.controllers {
            let cl = l(&[("bridge", &br.name), ("target", &c.target)]);
            b.gauge(
                "openflow_controller_connected",
                "1 if HELLO was exchanged on the controller's current connection",
                cl.clone(),
                u64::from(c.connected),
            );
            b.counter(
                "openflow_controller_connects",
                "Connections made to (or accepted from) the controller",
                cl,
                c.connects,
            );
        }
    }
    if let Some(of) = &show.openflow {
        for (version, n) in &of.connections {
            b.gauge(
                "openflow_connections",
                "OpenFlow connections open, by negotiated version",
                l(&[("version", version)]),
                *n,
            );
        }
        for (error, n) in &of.refused {
            b.counter(
                "openflow_errors_sent",
                "OpenFlow ERROR replies sent, by error",
                l(&[("error", error)]),
                *n,
            );
        }
        b.counter(
            "openflow_dropped_connections",
            "OpenFlow connections the switch closed (lost framing, no common version, flooding)",
            vec![],
            of.dropped,
        );
    }
    if let Some(db) = &show.ovsdb {
        let labels = l(&[("remote", &db.remote)]);
        b.state_set(
            "ovsdb_state",
            "The OVSDB connection's state; 1 for the current one",
            &labels,
            OVSDB_STATES,
            &db.state,
        );
        b.counter(
            "ovsdb_connects",
            "Connections made to the OVSDB server",
            labels.clone(),
            db.connects,
        );
        b.counter(
            "ovsdb_txn_failures",
            "Write-back transactions that failed",
            labels.clone(),
            db.txn_failures,
        );
        b.gauge(
            "ovsdb_cur_cfg",
            "The last next_cfg applied (written back as cur_cfg)",
            labels,
            u64::try_from(db.cur_cfg).unwrap_or(0),
        );
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_proto::reply::{OvsdbStatus, ShowController, ShowOpenflow};

    /// The result of a reply captured from a running daemon (the proto crate's fixtures).
    fn reply<T: serde::de::DeserializeOwned>(text: &str) -> T {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        serde_json::from_value(v["result"].clone()).unwrap()
    }

    fn fixture() -> Scrape {
        let mut upgrades: Vec<UpgradeReport> = reply(include_str!(
            "../../proto/tests/replies/upgrade_history.json"
        ));
        Scrape {
            show: reply(include_str!("../../proto/tests/replies/show.json")),
            ports: reply(include_str!("../../proto/tests/replies/port_stats.json")),
            pmds: reply(include_str!("../../proto/tests/replies/pmd_stats.json")),
            last_upgrade: upgrades.pop(),
            conntrack: None,
            flows: BTreeMap::from([(("br0".into(), 0), 2), (("br0".into(), 10), 1)]),
        }
    }

    /// Sample lines as (name, labels, value); checks the grammar of every line on the way.
    /// One sample: name, labels, value.
    type Sample = (String, Vec<(String, String)>, f64);

    fn samples(text: &str) -> Vec<Sample> {
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.chars().enumerate().all(|(i, c)| {
                    c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
                })
        };
        let mut out = Vec::new();
        let mut typed: BTreeMap<String, String> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (n, t) = rest.split_once(' ').unwrap();
                assert!(name_ok(n), "{line}");
                assert!(["counter", "gauge"].contains(&t), "{line}");
                assert!(
                    typed.insert(n.into(), t.into()).is_none(),
                    "two TYPE lines: {line}"
                );
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (head, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            let (name, labels) = match head.split_once('{') {
                None => (head.to_string(), Vec::new()),
                Some((n, rest)) => {
                    let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
                    (n.to_string(), parse_labels(body))
                }
            };
            assert!(name_ok(&name), "{line}");
            let t = typed
                .get(&name)
                .unwrap_or_else(|| panic!("no TYPE for {line}"));
            assert_eq!(t == "counter", name.ends_with("_total"), "{line}");
            out.push((name, labels, value));
        }
        out
    }

    /// `k="v",...` with the format's escapes (`\\`, `\"`, `\n`) undone.
    fn parse_labels(body: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut chars = body.chars().peekable();
        while chars.peek().is_some() {
            let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
            assert_eq!(chars.next(), Some('"'), "{body}");
            let mut v = String::new();
            loop {
                match chars
                    .next()
                    .unwrap_or_else(|| panic!("unterminated: {body}"))
                {
                    '\\' => match chars.next() {
                        Some('\\') => v.push('\\'),
                        Some('"') => v.push('"'),
                        Some('n') => v.push('\n'),
                        o => panic!("bad escape {o:?} in {body}"),
                    },
                    '"' => break,
                    c => v.push(c),
                }
            }
            out.push((key, v));
            if chars.peek() == Some(&',') {
                chars.next();
            }
        }
        out
    }

    fn value(s: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        s.iter()
            .find(|(n, l, _)| {
                n == name
                    && l.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|(_, _, v)| *v)
    }

    #[test]
    fn names_types_and_labels_follow_the_conventions() {
        let text = render(&fixture());
        let s = samples(&text);
        assert!(s.len() > 50, "{text}");
        let allowed = [
            "bridge", "port", "queue", "reason", "pmd", "state", "table", "version", "target",
            "error", "remote",
        ];
        for (name, labels, _) in &s {
            assert!(name.starts_with("ferrovs_"), "{name}");
            for (k, _) in labels {
                assert!(allowed.contains(&k.as_str()), "{name}: label {k}");
            }
        }
        // Every HELP line ends in one full stop (the encoder adds it).
        for line in text.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(line.ends_with('.') && !line.ends_with(".."), "{line}");
        }
        // A stable order: the same scrape renders the same, ports in `port-stats` order.
        assert_eq!(text, render(&fixture()));
        let at = |p: &str| {
            text.find(&format!(
                "ferrovs_port_rx_packets_total{{bridge=\"br0\",port=\"{p}\"}}"
            ))
            .unwrap()
        };
        assert!(at("tap0") < at("up0") && at("up0") < at("vm1"), "{text}");
        assert!(
            text.contains("# TYPE ferrovs_port_rx_packets_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE ferrovs_pmd_cycles_per_packet gauge\n"),
            "{text}"
        );
    }

    #[test]
    fn ring_fill_is_a_gauge_only_where_the_daemon_has_one() {
        let mut f = fixture();
        let vm1 = f.ports.iter_mut().find(|p| p.port == "vm1").unwrap();
        vm1.queues[0].available = Some(1021);
        vm1.queues[1].available = Some(3);
        let s = samples(&render(&f));
        let q = |p: &str, q: &str| {
            value(
                &s,
                "ferrovs_queue_available",
                &[("bridge", "br0"), ("port", p), ("queue", q)],
            )
        };
        assert_eq!(q("vm1", "0"), Some(1021.0));
        assert_eq!(q("vm1", "1"), Some(3.0));
        // Kernel queues and stopped rings have no figure, so no sample.
        assert_eq!(q("tap0", "0"), None);
        assert_eq!(q("vm2", "0"), None);
    }

    #[test]
    fn values_are_the_daemons_own() {
        let s = samples(&render(&fixture()));
        let port = |n: &str, p: &str| value(&s, n, &[("bridge", "br0"), ("port", p)]);
        assert_eq!(port("ferrovs_port_rx_packets_total", "tap0"), Some(9.0));
        assert_eq!(port("ferrovs_port_rx_bytes_total", "tap0"), Some(726.0));
        assert_eq!(
            port("ferrovs_port_tx_packets_total", "tap0"),
            Some(650542.0)
        );
        assert_eq!(port("ferrovs_port_tx_bytes_total", "up0"), Some(45538406.0));
        let q =
            |n: &str, q: &str| value(&s, n, &[("bridge", "br0"), ("port", "tap0"), ("queue", q)]);
        assert_eq!(q("ferrovs_queue_tx_packets_total", "0"), Some(650542.0));
        assert_eq!(q("ferrovs_queue_rx_packets_total", "1"), Some(9.0));
        assert_eq!(q("ferrovs_queue_rx_packets_total", "0"), None);
        assert_eq!(q("ferrovs_queue_ready", "1"), Some(1.0));
        // vhost-user state: one gauge per state, 1 for the current one.
        let st = |p: &str, state: &str| {
            value(
                &s,
                "ferrovs_port_state",
                &[("bridge", "br0"), ("port", p), ("state", state)],
            )
        };
        assert_eq!(st("vm1", "listening"), Some(1.0));
        assert_eq!(st("vm1", "connected"), Some(0.0));
        assert_eq!(st("vmk", "reconnecting"), Some(1.0));
        assert_eq!(st("tap0", "attached"), Some(1.0));
        let pmd = |n: &str| value(&s, n, &[("pmd", "0")]);
        assert_eq!(pmd("ferrovs_pmd_busy_cycles_total"), Some(14222037585.0));
        assert_eq!(pmd("ferrovs_pmd_idle_cycles_total"), Some(79870.0));
        assert_eq!(pmd("ferrovs_pmd_sleep_cycles_total"), Some(0.0));
        assert_eq!(pmd("ferrovs_pmd_cycles_per_packet"), Some(73886.9));
        assert_eq!(pmd("ferrovs_pmd_emc_hits_total"), Some(191738.0));
        assert_eq!(pmd("ferrovs_pmd_megaflow_hits_total"), Some(740.0));
        assert_eq!(pmd("ferrovs_pmd_upcalls_total"), Some(6.0));
        assert_eq!(pmd("ferrovs_pmd_busy_ratio"), Some(1.0));
        let br = |n: &str| value(&s, n, &[("bridge", "br0")]);
        assert_eq!(br("ferrovs_megaflow_entries"), Some(4.0));
        assert_eq!(br("ferrovs_bridge_rules"), Some(2.0));
        assert_eq!(
            value(&s, "ferrovs_flows", &[("bridge", "br0"), ("table", "10")]),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "ferrovs_upgrade_last_downtime_seconds", &[]),
            Some(303.178e-6)
        );
        assert_eq!(
            value(&s, "ferrovs_upgrade_last_timestamp_seconds", &[]),
            Some(1795627028.0)
        );
        assert_eq!(
            value(&s, "ferrovs_build_info", &[("version", "0.1.0")]),
            Some(1.0)
        );
        // The drops the daemon counted, by reason, and no other.
        let d = |p: &str, r: &str| {
            value(
                &s,
                "ferrovs_port_tx_drops_total",
                &[("bridge", "br0"), ("port", p), ("reason", r)],
            )
        };
        assert_eq!(d("vm1", "queue_not_ready"), Some(650551.0));
        assert_eq!(d("vx0", "tx_error"), Some(650556.0));
        assert_eq!(
            s.iter()
                .filter(|(n, _, _)| n.ends_with("_drops_total"))
                .count(),
            5
        );
        // Nothing the daemon did not report: no conntrack, no OVSDB.
        assert!(!s.iter().any(
            |(n, _, _)| n.starts_with("ferrovs_conntrack_") || n.starts_with("ferrovs_ovsdb_")
        ));
    }

    #[test]
    fn drops_are_by_reason_and_only_those_counted() {
        let mut f = fixture();
        let p = &mut f.ports[0];
        p.rx.drops.insert("runt".into(), 3);
        p.rx.drops.insert("no_route".into(), 5);
        p.tx.drops.insert("kernel_tx_full".into(), 7);
        p.queues[0].stats.drops.insert("kernel_tx_full".into(), 7);
        let s = samples(&render(&f));
        let d =
            |n: &str, r: &str| value(&s, n, &[("bridge", "br0"), ("port", "tap0"), ("reason", r)]);
        assert_eq!(d("ferrovs_port_rx_drops_total", "runt"), Some(3.0));
        assert_eq!(d("ferrovs_port_rx_drops_total", "no_route"), Some(5.0));
        assert_eq!(
            d("ferrovs_port_tx_drops_total", "kernel_tx_full"),
            Some(7.0)
        );
        assert_eq!(d("ferrovs_port_tx_drops_total", "runt"), None);
        assert_eq!(
            value(
                &s,
                "ferrovs_queue_tx_drops_total",
                &[
                    ("bridge", "br0"),
                    ("port", "tap0"),
                    ("queue", "0"),
                    ("reason", "kernel_tx_full")
                ]
            ),
            Some(7.0)
        );
        assert_eq!(
            s.iter()
                .filter(|(n, _, _)| n.ends_with("_drops_total"))
                .count(),
            5 + 4
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut f = fixture();
        let odd = "a\"b\\c\nd";
        f.show.bridges[0].openflow = Some(ShowOpenflow {
            controllers: vec![ShowController {
                target: odd.into(),
                connected: true,
                connects: 2,
                ..Default::default()
            }],
            ..Default::default()
        });
        f.show.ovsdb = Some(OvsdbStatus {
            remote: "unix:/run/x\"y".into(),
            state: "weird".into(),
            connects: 1,
            ..Default::default()
        });
        let text = render(&f);
        assert!(
            text.contains(
                r#"ferrovs_openflow_controller_connected{bridge="br0",target="a\"b\\c\nd"} 1"#
            ),
            "{text}"
        );
        let s = samples(&text);
        let c = |n: &str| value(&s, n, &[("bridge", "br0"), ("target", odd)]);
        assert_eq!(c("ferrovs_openflow_controller_connected"), Some(1.0));
        assert_eq!(c("ferrovs_openflow_controller_connects_total"), Some(2.0));
        // A state this version does not list is still reported, as the current one.
        let db = |st: &str| {
            value(
                &s,
                "ferrovs_ovsdb_state",
                &[("remote", "unix:/run/x\"y"), ("state", st)],
            )
        };
        assert_eq!(db("weird"), Some(1.0));
        assert_eq!(db("synced"), Some(0.0));
    }

    #[test]
    fn conntrack_is_exported_when_the_daemon_answers() {
        let mut f = fixture();
        f.conntrack = Some(ConntrackStats {
            created: 10,
            entries: 4,
            expired: 6,
            invalid: 1,
            limit_hits: 0,
            max_entries: 1000,
            nat_exhausted: 0,
            new_per_s: 0.0,
            restored: 0,
            restore_refused: 0,
            restore_error: None,
            shards: 16,
            timeouts: BTreeMap::new(),
            zone_default_limit: None,
            zones: vec![],
        });
        let s = samples(&render(&f));
        assert_eq!(value(&s, "ferrovs_conntrack_entries", &[]), Some(4.0));
        assert_eq!(
            value(&s, "ferrovs_conntrack_max_entries", &[]),
            Some(1000.0)
        );
        assert_eq!(
            value(&s, "ferrovs_conntrack_created_total", &[]),
            Some(10.0)
        );
    }
}
