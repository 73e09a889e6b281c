//! ferrovs: the command-line client of ferrovsd's control socket.
//!
//! Arguments are parsed with clap; every command sends one [`Request`] and prints its typed
//! reply (`--json`: the reply as the daemon sent it, pretty-printed). Errors print as
//! `ferrovs: MESSAGE` and exit 1.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod capture;

use clap::{Parser, Subcommand};
use ferrovs_proto::reply::{
    AddFlows, ConfigGet, ConntrackEntry, ConntrackStats, DelFlows, DelGroups, DirStats, FlowEntry,
    GroupEntry, MacEntry, MegaflowEntry, MeterEntry, MeterStats, PmdStats, PortStats, Show,
    UpgradeReport, Version,
};
use ferrovs_proto::{Client, Request};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod trace;

const USAGE: &str = "usage: ferrovs [--run-dir DIR] COMMAND [--json]

commands:
  show                                   bridges, ports, link state, features
  add-bridge BRIDGE | del-bridge BRIDGE
  add-port BRIDGE PORT type=TYPE [path=SOCKET] [dev=NETDEV] [queues=N] [tag=VLAN] [trunks=V,V]
           [mode=af_xdp|af_packet]       TYPE: vhost-user | vhost-user-client (path=SOCKET),
                                         tap | uplink (dev=NETDEV); an uplink uses AF_XDP
                                         where it can, else AF_PACKET, unless mode= forces one;
                                         vxlan | geneve (remote_ip=IP [key=VNI|flow]
                                         [local_ip=IP] [dst_port=4789|6081] [csum=true]):
                                         a VXLAN or Geneve tunnel port
  del-port BRIDGE PORT
  set-port PORT coalesce-usecs=US [coalesce-frames=N]
                                         guest notification coalescing of a vhost-user port
                                         (also add-port options; 0 turns it off)
  set-port PORT pmd-rxq-affinity=QUEUE:CORE[,...]
                                         pin rx queues to PMD cores (also an add-port
                                         option; empty: no pins)
  port-stats [PORT]                      packets, bytes and drops by reason, per queue
  pmd-stats | pmd-stats-clear            PMD busy/idle cycles, cycles per packet, and each
                                         PMD's rx queues with their measured usage
  pmd-rebalance                          deal the rx queues over the PMDs again by their
                                         measured load (pmd-rxq-assign; as ovs-appctl
                                         dpif-netdev/pmd-rxq-rebalance)
  mac-table BRIDGE                       learned addresses
  add-flow BRIDGE FLOW                   install a rule, ovs-ofctl syntax, e.g.
                                         'priority=100,in_port=vm1,tcp,tp_dst=80 actions=drop'
  add-flows BRIDGE FILE                  install every rule of FILE (- : stdin), one per line
                                         (# comments), all or none
  del-flows BRIDGE [--strict] [FILTER]   remove the rules FILTER covers (all without one;
                                         --strict: same match and priority only)
  dump-flows BRIDGE [FILTER]             rules with their packet and byte counters
  dump-megaflows BRIDGE                  the megaflow cache's entries
  set-controller BRIDGE TARGET...        OpenFlow controllers: tcp:IP[:PORT] unix:PATH
                                         (the switch connects) ptcp:[PORT][:IP] punix:PATH
                                         (it listens)
  del-controller BRIDGE | get-controller BRIDGE
  set-bridge BRIDGE KEY=VALUE...         datapath-id=HEX16, protocols=OpenFlow13[,...],
                                         fail-mode=standalone|secure, max-backoff=MS,
                                         inactivity-probe=MS
  add-meter BRIDGE METER | mod-meter BRIDGE METER
                                         add or change an OpenFlow meter, ovs-ofctl syntax, e.g.
                                         'meter=1,kbps,burst,band=type=drop,rate=1000,burst_size=100'
                                         (rules use it with 'actions=meter:1,...')
  del-meters BRIDGE [meter=N]            remove a meter (all without one) and its rules
  dump-meters BRIDGE [meter=N]           the meters' configurations
  meter-stats BRIDGE [meter=N]           the meters' packet, byte and band counters
  add-group BRIDGE GROUP                 add a group, ovs-ofctl syntax, e.g.
                                         'group_id=1,type=all,bucket=output:vm1,bucket=output:vm2'
  mod-group BRIDGE GROUP                 replace a group's type and buckets
  del-groups BRIDGE [group_id=N]         remove groups (all without one) and the rules using them
  dump-groups BRIDGE                     the groups
  dump-group-stats BRIDGE                the groups' and buckets' packet and byte counters
  dump-conntrack [zone=N]                tracked connections, as ovs-appctl dpctl/dump-conntrack
  flush-conntrack [zone=N]               remove tracked connections (all without a zone)
  conntrack-stats                        connection tracker counters, limits and timeouts
  log-level [[MODULE] LEVEL]             show log levels, or set the default or a module's
                                         (off, error, warn, info, debug, trace), no restart
  config get [KEY] | config set KEY VALUE    pmd-cores, pmd-rx-mode, pmd-sleep-after-us,
                                         pmd-sleep-max-us, pmd-quiet-rxq-poll-us,
                                         pmd-priority, pmd-rxq-assign
                                         (cycles, roundrobin, group), pmd-auto-lb,
                                         pmd-auto-lb-load-threshold,
                                         pmd-auto-lb-improvement-threshold,
                                         pmd-auto-lb-rebal-interval, mac-aging,
                                         mac-table-size, flow-limit, flow-max-idle,
                                         emc-insert-inv-prob, ct-max-entries,
                                         ct-zone-default-limit, ct-zone-limit:ZONE,
                                         ct-timeout-NAME (conntrack-stats lists the names)
  monitor [SECONDS]                      live per-port rates, one line per second
  upgrade [NEW-FERROVSD]                 hot upgrade: start NEW-FERROVSD (default: the ferrovsd
                                         beside this ferrovs) with --takeover; it takes every
                                         port over, no guest reconnects; prints the phases
                                         (its log: DIR/ferrovsd.log)
  upgrade-history [N]                    the last N hot upgrades and their downtime
  trace BRIDGE FLOW | --packet HEX --in-port PORT | --pcap FILE --in-port PORT [--ct-next STATE]...
                                         where a packet goes through the rules, and why
                                         (as ofproto/trace): FLOW in ovs-ofctl match syntax,
                                         e.g. 'in_port=vm1,tcp,nw_dst=10.0.0.2,tp_dst=80';
                                         --ct-next trk,est: the ct_state after each ct()
                                         (default trk,new); changes nothing
  capture PORT [--direction in|out|both] [--count N] [--snaplen N] [-w FILE|-w -] [FILTER]
                                         capture a port's packets as pcapng (FILTER: tcpdump
                                         syntax, compiled by libpcap), e.g.
                                         ferrovs capture vm1 -w - icmp | tcpdump -nr -
  version";

/// The command line (the help text is [`USAGE`], printed by `help`, `-h`, `--help` or no
/// command).
#[derive(Debug, Parser)]
#[command(
    name = "ferrovs",
    disable_help_flag = true,
    disable_help_subcommand = true,
    disable_version_flag = true
)]
struct Args {
    /// Control socket and state of the daemon (default: $FERROVS_RUN_DIR or /run/ferrovs).
    #[arg(long, value_name = "DIR", env = ferrovs_proto::RUN_DIR_ENV)]
    run_dir: Option<PathBuf>,
    /// Print the reply as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[arg(short = 'h', long = "help", global = true)]
    help: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    Help,
    Show,
    Version,
    #[command(alias = "add-br")]
    AddBridge {
        bridge: String,
    },
    #[command(alias = "del-br")]
    DelBridge {
        bridge: String,
    },
    AddPort {
        bridge: String,
        port: String,
        #[arg(allow_hyphen_values = true)]
        options: Vec<String>,
    },
    DelPort {
        bridge: String,
        port: String,
    },
    SetPort {
        port: String,
        #[arg(required = true, allow_hyphen_values = true)]
        options: Vec<String>,
    },
    PortStats {
        port: Option<String>,
    },
    PmdStats,
    PmdStatsClear,
    MacTable {
        bridge: String,
    },
    Config {
        #[command(subcommand)]
        op: ConfigOp,
    },
    Monitor {
        seconds: Option<String>,
    },
    Upgrade {
        binary: Option<String>,
    },
    UpgradeHistory {
        last: Option<String>,
    },
    AddFlow {
        bridge: String,
        flow: String,
    },
    AddFlows {
        bridge: String,
        file: String,
    },
    DelFlows {
        bridge: String,
        #[arg(long)]
        strict: bool,
        filter: Option<String>,
    },
    DumpFlows {
        bridge: String,
        filter: Option<String>,
    },
    DumpMegaflows {
        bridge: String,
    },
    SetController {
        bridge: String,
        #[arg(required = true)]
        targets: Vec<String>,
    },
    DelController {
        bridge: String,
    },
    GetController {
        bridge: String,
    },
    SetBridge {
        bridge: String,
        #[arg(required = true, allow_hyphen_values = true)]
        options: Vec<String>,
    },
    AddMeter {
        bridge: String,
        meter: String,
    },
    ModMeter {
        bridge: String,
        meter: String,
    },
    DelMeters {
        bridge: String,
        meter: Option<String>,
    },
    DumpMeters {
        bridge: String,
        meter: Option<String>,
    },
    MeterStats {
        bridge: String,
        meter: Option<String>,
    },
    /// Adds a group: `group_id=N,type=all|select|indirect|fast_failover,bucket=...`.
    AddGroup {
        bridge: String,
        group: String,
    },
    /// Replaces an existing group's type and buckets.
    ModGroup {
        bridge: String,
        group: String,
    },
    /// Deletes `group_id=N` (none: every group) and the rules that send to it.
    DelGroups {
        bridge: String,
        filter: Option<String>,
    },
    DumpGroups {
        bridge: String,
    },
    DumpGroupStats {
        bridge: String,
    },
    /// `[zone=N]`.
    DumpConntrack {
        filter: Option<String>,
    },
    /// `[zone=N]`.
    FlushConntrack {
        filter: Option<String>,
    },
    ConntrackStats,
    Trace {
        bridge: String,
        flow: Option<String>,
        #[arg(long)]
        packet: Option<String>,
        #[arg(long)]
        pcap: Option<PathBuf>,
        #[arg(long = "in-port")]
        in_port: Option<String>,
        #[arg(long = "ct-next")]
        ct_next: Vec<String>,
    },
    /// Log levels: `log-level` lists them, `log-level LEVEL` sets the default one,
    /// `log-level MODULE LEVEL` one module's (a module path prefix such as
    /// `ferrovs_control::daemon`), at once, without a restart (as `ovs-appctl vlog/set`).
    LogLevel {
        /// `[MODULE] LEVEL` (off, error, warn, info, debug, trace).
        #[arg(num_args = 0..=2)]
        args: Vec<String>,
    },
    Capture {
        port: String,
        #[arg(long, default_value = "both")]
        direction: String,
        #[arg(long, short = 'c')]
        count: Option<u64>,
        #[arg(long, short = 's')]
        snaplen: Option<u32>,
        #[arg(short = 'w', value_name = "FILE")]
        write: Option<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        filter: Vec<String>,
    },
    PmdRebalance,
}

/// `dump-conntrack`'s and `flush-conntrack`'s filter: `zone=N` (N in 0..=65535), or none.
fn zone_filter(f: Option<&str>) -> Result<Option<u16>, String> {
    let Some(f) = f.map(str::trim).filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let v = f
        .strip_prefix("zone=")
        .ok_or_else(|| format!("bad filter '{f}': expected zone=N"))?;
    v.parse()
        .map(Some)
        .map_err(|_| format!("bad filter '{f}': '{v}' is not a zone (0..=65535)"))
}

fn print_conntrack_stats(s: &ConntrackStats) {
    let limit = |l: Option<u32>| l.map_or_else(|| "unlimited".to_string(), |l| l.to_string());
    println!(
        "entries {} (max {})  created {}  new/s {}  expired {}  invalid {}  limit hits {}  \
         nat exhausted {}",
        s.entries,
        s.max_entries,
        s.created,
        num(s.new_per_s),
        s.expired,
        s.invalid,
        s.limit_hits,
        s.nat_exhausted
    );
    println!("zone default limit {}", limit(s.zone_default_limit));
    for z in &s.zones {
        println!(
            "zone {}: entries {} limit {}",
            z.zone,
            z.entries,
            limit(z.limit)
        );
    }
    let t: Vec<String> = s.timeouts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("timeouts (s): {}", t.join(" "));
    if s.restored + s.restore_refused != 0 {
        println!(
            "hot upgrade: restored {} connections, refused {} tables{}",
            s.restored,
            s.restore_refused,
            s.restore_error
                .as_ref()
                .map(|e| format!(" (last: {e})"))
                .unwrap_or_default()
        );
    }
}

/// `del-groups`' filter: `group_id=N` or `group_id=all`.
fn group_filter(f: Option<&str>) -> Result<Option<u32>, String> {
    let Some(f) = f.map(str::trim).filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let v = f
        .strip_prefix("group_id=")
        .ok_or_else(|| format!("bad group filter '{f}': expected group_id=N"))?;
    if v.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| format!("bad group filter '{f}': '{v}' is not a group id"))
}

#[derive(Debug, Subcommand)]
enum ConfigOp {
    Get { key: Option<String> },
    Set { key: String, value: String },
}

struct Cli {
    client: Client,
    json: bool,
}

impl Cli {
    fn call<R: DeserializeOwned>(&self, req: &Request) -> Result<R, String> {
        self.client.call(req).map_err(|e| e.message())
    }

    fn run_dir(&self) -> &std::path::Path {
        self.client.run_dir()
    }

    /// Sends `req`; prints the reply with `print`, or as JSON.
    fn show<R: DeserializeOwned + Serialize>(
        &self,
        req: Request,
        print: impl FnOnce(&R),
    ) -> Result<(), String> {
        let v: R = self.call(&req)?;
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
            );
        } else {
            print(&v);
        }
        Ok(())
    }
}

/// A number as the JSON reply spells it (`12.0`, not `12`).
fn num(f: f64) -> String {
    serde_json::to_string(&f).unwrap_or_else(|_| "-".into())
}

/// An optional value, `-` when absent.
fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), |v| v.to_string())
}

fn print_show(v: &Show) {
    println!(
        "run-dir {}  pmd-cores {}  hugepages {}",
        v.run_dir,
        serde_json::to_string(&v.pmd_cores).unwrap_or_default(),
        v.hugepages
    );
    for b in &v.bridges {
        println!("bridge {}", b.name);
        if let Some(of) = &b.openflow {
            // Only bridges with controllers say more than before.
            if !of.controllers.is_empty() {
                println!(
                    "  openflow: datapath-id {}  fail-mode {}{}  management connections {}",
                    of.datapath_id,
                    of.fail_mode,
                    if of.fail_open { " (fail-open)" } else { "" },
                    of.management_connections
                );
            }
            for c in &of.controllers {
                println!(
                    "  controller {} {}{}  role {}  connects {}",
                    c.target,
                    c.state,
                    if c.connected { " (connected)" } else { "" },
                    c.role,
                    c.connects
                );
                if let Some(e) = &c.last_error {
                    println!("    last error: {e}");
                }
            }
        }
        for p in &b.ports {
            let attach = match &p.dev {
                None => format!("path {}", opt(&p.path)),
                Some(dev) => format!("dev {dev} mode {}", p.mode),
            };
            println!(
                "  port {} ({}) {}  {}  queues {} ready {}  vlan {}",
                p.name,
                p.kind,
                p.state,
                attach,
                p.queues,
                p.ready_queues,
                p.vlan.mode.clone() + &p.vlan.tag.map(|t| format!(" {t}")).unwrap_or_default(),
            );
            if !p.features.is_empty() {
                println!("    features: {}", p.features.join(" "));
            }
            let names = |l: &[String]| -> String {
                if l.is_empty() {
                    "none".into()
                } else {
                    l.join(" ")
                }
            };
            println!(
                "    offloads: accepts {}  sends {}",
                names(&p.offloads.accepts),
                names(&p.offloads.sends)
            );
            if let Some(e) = &p.last_error {
                println!("    last error: {e}");
            }
            if let Some(r) = &p.mode_fallback_reason {
                println!("    af_packet fallback: {r}");
            }
            if p.mode == "af_xdp" {
                let (xdp_mode, bind) = match &p.kernel {
                    Some(ferrovs_proto::reply::KernelInfo::Xdp(k)) => {
                        (k.xdp_mode.as_str(), k.bind.as_str())
                    }
                    _ => ("-", "-"),
                };
                println!("    af_xdp: queue 0, xdp {xdp_mode}, {bind} mode");
            }
        }
    }
}

fn dir_line(name: &str, d: &DirStats) -> String {
    let mut out = format!(
        "{name}: packets {} bytes {} dropped {}",
        d.packets, d.bytes, d.dropped
    );
    for (k, v) in &d.drops {
        out.push_str(&format!(" {k}={v}"));
    }
    if d.guest_notifications + d.notifications_suppressed + d.notifications_coalesced != 0 {
        out.push_str(&format!(
            " | notifications {} suppressed {} coalesced {}",
            d.guest_notifications, d.notifications_suppressed, d.notifications_coalesced
        ));
    }
    out
}

fn print_port_stats(v: &Vec<PortStats>) {
    for p in v {
        let c = &p.coalesce;
        if c.usecs != 0 {
            println!(
                "port {} (coalescing: {} us, {} packets)",
                p.port, c.usecs, c.frames
            );
        } else {
            println!("port {}", p.port);
        }
        println!("  {}", dir_line("rx", &p.rx));
        println!("  {}", dir_line("tx", &p.tx));
        let o = &p.offload;
        if o.sw_csum + o.sw_tso != 0 {
            println!(
                "  software offloads: checksums {} tso packets {} segments {}",
                o.sw_csum, o.sw_tso, o.sw_segments
            );
        }
        let m = &p.migration;
        let dirty = p.tx.dirty_pages_logged + p.rx.dirty_pages_logged;
        let pc = |f: fn(&ferrovs_proto::reply::Migration) -> u64| m.as_ref().map_or(0, f);
        let flag = |f: fn(&ferrovs_proto::reply::Migration) -> bool| opt(&m.as_ref().map(f));
        if m.is_some_and(|m| m.logging || m.postcopy)
            || dirty + pc(|m| m.postcopy_pages_missing) + pc(|m| m.rarp_announces) != 0
        {
            println!(
                "  migration: logging {} ({} log bytes) dirty pages logged {} | postcopy {} \
                 pages missing {} fetched {} | rarp announces {}",
                flag(|m| m.logging),
                pc(|m| m.log_bytes),
                dirty,
                flag(|m| m.postcopy),
                pc(|m| m.postcopy_pages_missing),
                pc(|m| m.postcopy_pages_fetched),
                pc(|m| m.rarp_announces)
            );
        }
        for q in &p.queues {
            let broken = match &q.broken {
                Some(b) => format!(" BROKEN: {b}"),
                None => String::new(),
            };
            let available = match q.available {
                Some(n) => format!(" available {n}"),
                None => String::new(),
            };
            println!(
                "    queue {} {:<10} ready {:<5} {}{}{}",
                q.queue,
                q.direction,
                q.ready.to_string(),
                dir_line("", &q.stats).trim_start_matches(": "),
                available,
                broken
            );
        }
    }
}

fn print_pmd_stats(v: &Vec<PmdStats>) {
    for p in v {
        println!("pmd {} core {}:", p.pmd, opt(&p.core));
        println!(
            "  rx queues: {}  rx packets: {}  tx packets: {}",
            p.rx_queues, p.rx_packets, p.tx_packets
        );
        println!(
            "  busy cycles: {} ({}%)  idle cycles: {}  cycles per packet: {}",
            p.busy_cycles,
            num(p.busy_pct),
            p.idle_cycles,
            num(p.cycles_per_packet)
        );
        let max = p.sleep_max_us;
        println!(
            "  rx mode: {}  load-based sleep max: {}  priority: {}{}",
            p.rx_mode,
            if max == 0 {
                "off".to_string()
            } else {
                format!("{max} us")
            },
            p.priority,
            p.priority_error
                .as_ref()
                .map(|e| format!(" (not applied: {e})"))
                .unwrap_or_default()
        );
        println!(
            "  sleep time: {:.3} s  wake-ups: {} (by kick or kernel port: {})  load-based sleeps: {}",
            p.sleep_us as f64 / 1e6,
            p.sleeps,
            p.kick_wakeups,
            p.load_sleeps
        );
        println!(
            "  quiet rx queues: polled every {} while busy, {} polls skipped; {} sweeps, \
             gap p99 {} p99.9 {} max {} us",
            if p.quiet_rxq_poll_us == 0 {
                "iteration".to_string()
            } else {
                format!("{} us", p.quiet_rxq_poll_us)
            },
            p.quiet_skips,
            p.quiet_sweeps,
            p.quiet_gap_p99_us.map_or("-".into(), |u| format!("<{u}")),
            p.quiet_gap_p999_us.map_or("-".into(), |u| format!("<{u}")),
            num(p.quiet_gap_max_us)
        );
        // As ovs-appctl dpif-netdev/pmd-rxq-show.
        for q in &p.rxqs {
            println!(
                "  port: {:<16} queue-id: {:>2} ({})  pmd usage: {}",
                q.port,
                q.queue,
                if q.enabled { "enabled" } else { "disabled" },
                q.usage_pct
                    .map_or("NOT AVAIL".to_string(), |u| format!("{:>2} %", u.round()))
            );
        }
        let f = &p.flow;
        if f.packets > 0 {
            let n = f.packets.max(1) as f64;
            let pct = |x: u64| x as f64 * 100.0 / n;
            println!(
                "  flow packets: {}  emc hits: {} ({:.1}%)  megaflow hits: {} ({:.1}%)  upcalls (misses): {} ({:.1}%)  emc skipped (bypass): {} ({:.1}%)",
                f.packets,
                f.emc_hits,
                pct(f.emc_hits),
                f.megaflow_hits,
                pct(f.megaflow_hits),
                f.upcalls,
                pct(f.upcalls),
                f.emc_skipped,
                pct(f.emc_skipped)
            );
            // Only with connection tracking's recirculations (the line above is unchanged).
            if f.recirculations > 0 {
                println!(
                    "  recirculations: {}  avg. passes per packet: {:.2}",
                    f.recirculations,
                    (f.packets + f.recirculations) as f64 / n
                );
            }
        }
    }
    // The megaflow caches are shared by the PMDs: printed once.
    for c in v
        .first()
        .map(|p| &p.megaflow_caches[..])
        .unwrap_or_default()
    {
        println!(
            "megaflow cache {}: {} entries in {} subtables (limit {}), {} rules; inserted {}, evicted {}, invalidated {} in {} revalidations, refused: full {} stale {}",
            c.bridge,
            c.entries,
            c.subtables,
            c.limit,
            c.rules,
            c.inserted,
            c.evicted,
            c.invalidated,
            c.revalidations,
            c.refused_full,
            c.refused_stale
        );
        if c.xlate_too_deep + c.xlate_too_many != 0 {
            println!(
                "  translations dropped on resubmit limits: nested too deep {}, too many {}",
                c.xlate_too_deep, c.xlate_too_many
            );
        }
    }
}

/// One `monitor --json` line.
#[derive(Serialize)]
struct MonitorLine<'a> {
    ports: &'a [PortStats],
    t: f64,
}

fn monitor(cli: &Cli, secs: Option<u64>) -> Result<(), String> {
    let start = Instant::now();
    let mut prev: Option<(Instant, Vec<PortStats>)> = None;
    loop {
        let v: Vec<PortStats> = cli.call(&Request::PortStats { port: None })?;
        let now = Instant::now();
        if let Some((t0, p0)) = &prev {
            let dt = now.duration_since(*t0).as_secs_f64();
            let mut line = String::new();
            for (a, b) in v.iter().zip(p0) {
                let rate =
                    |x: &DirStats, y: &DirStats| x.packets.saturating_sub(y.packets) as f64 / dt;
                line.push_str(&format!(
                    "{}: rx {:.3} Mpps tx {:.3} Mpps drops {}   ",
                    a.port,
                    rate(&a.rx, &b.rx) / 1e6,
                    rate(&a.tx, &b.tx) / 1e6,
                    a.rx.dropped + a.tx.dropped
                ));
            }
            if cli.json {
                let l = MonitorLine {
                    ports: &v,
                    t: start.elapsed().as_secs_f64(),
                };
                println!("{}", serde_json::to_string(&l).unwrap_or_default());
            } else {
                println!("{line}");
            }
        }
        prev = Some((now, v));
        if secs.is_some_and(|n| start.elapsed().as_secs() >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One line per takeover.
fn upgrade_line(r: &UpgradeReport) -> String {
    format!(
        "pid {} -> {} (ferrovsd {} -> {}, schema {}): {} ports / {} queues; prepare {:.1} ms, \
         freeze {} us, downtime {:.0} us, total {:.1} ms",
        r.old_pid,
        r.new_pid,
        r.old_version,
        r.new_version,
        r.schema,
        r.ports,
        r.queues,
        r.prepare_ms,
        num(r.freeze_us),
        r.downtime_us,
        r.total_ms,
    )
}

/// The CPUs this process may run on (`Cpus_allowed_list` of /proc/self/status).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    else {
        return vec![];
    };
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            cpus.extend(a..=b);
        }
    }
    cpus
}

/// Where `prog` is on `$PATH`.
fn which(prog: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// The new daemon's first line: its report, or why it failed.
#[derive(Deserialize)]
struct Outcome {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
}

/// systemd's variables in a process's environment (`/proc/PID/environ`, NUL-separated)
/// that a daemon taking its place needs: `NOTIFY_SOCKET`, `WATCHDOG_USEC`.
fn service_vars(environ: &[u8]) -> Vec<(String, String)> {
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('='))
        .filter(|(k, _)| matches!(*k, "NOTIFY_SOCKET" | "WATCHDOG_USEC"))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Where the new daemon logs: DIR/ferrovsd.log, or, under systemd (`systemctl reload`, whose
/// stderr is the unit's journal stream: `$JOURNAL_STREAM`), the journal, as the old one did.
fn upgrade_log(file: std::fs::File) -> std::process::Stdio {
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        std::process::Stdio::inherit()
    } else {
        file.into()
    }
}

/// Starts the new daemon with `--takeover` and reports how the handover went.
fn upgrade(cli: &Cli, binary: Option<&str>) -> Result<(), String> {
    use std::io::BufRead;
    let bin: PathBuf = match binary {
        Some(b) => b.into(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("ferrovsd")))
            .filter(|p| p.exists())
            .unwrap_or_else(|| "ferrovsd".into()),
    };
    // Start the new daemon off the PMD cores: its start-up (loading, mapping, building
    // ports) must not preempt the PMDs still forwarding there. taskset pins it (and execs
    // it: the pid is the daemon's); without taskset it starts unpinned.
    let mut others = Vec::new();
    let mut service_env = Vec::new();
    if let Ok(show) = cli.call::<Show>(&Request::Show) {
        service_env = std::fs::read(format!("/proc/{}/environ", show.pid))
            .map(|e| service_vars(&e))
            .unwrap_or_default();
        others = allowed_cpus()
            .into_iter()
            .filter(|c| !show.pmd_cores.contains(c))
            .collect();
    }
    let found = bin.is_file() || bin.to_str().and_then(which).is_some();
    let taskset = which("taskset").filter(|_| found && !others.is_empty());
    let log_path = cli.run_dir().join("ferrovsd.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let mut cmd = match &taskset {
        Some(t) => {
            let list: Vec<String> = others.iter().map(|c| c.to_string()).collect();
            let mut c = std::process::Command::new(t);
            c.arg("-c").arg(list.join(",")).arg(&bin);
            c
        }
        None => std::process::Command::new(&bin),
    };
    // The old daemon's service manager and watchdog period become the new one's (systemd
    // gives neither WATCHDOG_USEC to `systemctl reload`'s command, nor NOTIFY_SOCKET to a
    // `ferrovs upgrade` typed in a shell); WATCHDOG_PID names a process that is leaving.
    cmd.envs(service_env).env_remove("WATCHDOG_PID");
    let mut child = cmd
        .arg("--run-dir")
        .arg(cli.run_dir())
        .arg("--takeover")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(upgrade_log(log))
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    let _ = std::io::BufReader::new(out).read_line(&mut line);
    let line = line.trim();
    let report = match serde_json::from_str::<Outcome>(line) {
        Ok(o) if o.ok => serde_json::from_str::<UpgradeReport>(line).map_err(|e| e.to_string()),
        Ok(o) => Err(o.error.unwrap_or_else(|| "-".into())),
        Err(_) => {
            // It died before reporting: reap it and say so.
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(format!(
                "{} exited ({status}) without a report",
                bin.display()
            ))
        }
    };
    let report = report.map_err(|e| {
        let _ = child.wait();
        format!(
            "upgrade failed, the running ferrovsd carries on: {e} (log: {})",
            log_path.display()
        )
    })?;
    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        println!("upgraded: {}", upgrade_line(&report));
    }
    Ok(())
}

/// Parses a count argument: `what: 'x' is not ...`.
fn count<T: std::str::FromStr>(
    arg: Option<String>,
    err: impl Fn(&str) -> String,
) -> Result<Option<T>, String> {
    arg.map(|n| n.parse().map_err(|_| err(&n))).transpose()
}

/// A clap error as one line: ours for an unknown command, clap's otherwise.
fn usage_error(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::InvalidSubcommand {
        if let Some(ContextValue::String(c)) = e.get(ContextKind::InvalidSubcommand) {
            return format!("unknown command '{c}'\n{USAGE}");
        }
    }
    if matches!(
        e.kind(),
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) && std::env::args().any(|a| a == "config")
    {
        return format!("usage: config get [KEY] | config set KEY VALUE\n{USAGE}");
    }
    // clap's message up to its usage line, on one line.
    let text = e.render().to_string();
    let msg: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(|l| l.trim().trim_start_matches("error: "))
        .filter(|l| !l.is_empty())
        .collect();
    format!("{}\n{USAGE}", msg.join(" "))
}

fn run() -> Result<(), String> {
    let args = Args::try_parse().map_err(|e| usage_error(&e))?;
    let cli = Cli {
        client: Client::new(args.run_dir.unwrap_or_else(ferrovs_proto::default_run_dir)),
        json: args.json,
    };
    let cmd = match args.cmd {
        Some(Cmd::Help) | None => None,
        _ if args.help => None,
        Some(c) => Some(c),
    };
    let Some(cmd) = cmd else {
        println!("{USAGE}");
        return Ok(());
    };
    let done = |_: &()| {};
    match cmd {
        Cmd::Help => Ok(()),
        Cmd::Show => cli.show(Request::Show, print_show),
        Cmd::Version => cli.show(Request::Version, |v: &Version| {
            println!("ferrovsd {}", v.version)
        }),
        Cmd::AddBridge { bridge } => cli.show(Request::AddBridge { bridge }, done),
        Cmd::DelBridge { bridge } => cli.show(Request::DelBridge { bridge }, done),
        Cmd::AddPort {
            bridge,
            port,
            options,
        } => cli.show(
            Request::AddPort {
                bridge,
                port,
                options,
            },
            done,
        ),
        Cmd::DelPort { bridge, port } => cli.show(Request::DelPort { bridge, port }, done),
        Cmd::SetPort { port, options } => cli.show(Request::SetPort { port, options }, done),
        Cmd::SetController { bridge, targets } => {
            cli.show(Request::SetController { bridge, targets }, done)
        }
        Cmd::DelController { bridge } => cli.show(Request::DelController { bridge }, done),
        Cmd::GetController { bridge } => {
            cli.show(Request::GetController { bridge }, |v: &Vec<String>| {
                for t in v {
                    println!("{t}");
                }
            })
        }
        Cmd::SetBridge { bridge, options } => {
            cli.show(Request::SetBridge { bridge, options }, done)
        }
        Cmd::PortStats { port } => cli.show(Request::PortStats { port }, print_port_stats),
        Cmd::PmdStats => cli.show(Request::PmdStats, print_pmd_stats),
        Cmd::PmdStatsClear => cli.show(Request::PmdStatsClear, done),
        Cmd::MacTable { bridge } => cli.show(Request::MacTable { bridge }, |v: &Vec<MacEntry>| {
            println!(" port                VLAN  MAC                Age");
            for e in v {
                println!(
                    " {:<18} {:>4}  {}  {:>4}",
                    e.port,
                    e.vlan.to_string(),
                    e.mac,
                    e.age.to_string()
                );
            }
        }),
        Cmd::Config {
            op: ConfigOp::Get { key },
        } => cli.show(Request::ConfigGet { key }, |v: &ConfigGet| match v {
            ConfigGet::All(s) => s.pairs().iter().for_each(|(k, v)| println!("{k}={v}")),
            ConfigGet::One(v) => println!("{v}"),
        }),
        Cmd::Config {
            op: ConfigOp::Set { key, value },
        } => cli.show(Request::ConfigSet { key, value }, done),
        Cmd::Upgrade { binary } => upgrade(&cli, binary.as_deref()),
        Cmd::UpgradeHistory { last } => {
            let last = count(last, |n| format!("upgrade-history: '{n}' is not a count"))?;
            cli.show(
                Request::UpgradeHistory { last },
                |v: &Vec<UpgradeReport>| {
                    for r in v {
                        println!("{}", upgrade_line(r));
                    }
                },
            )
        }
        Cmd::AddFlow { bridge, flow } => cli.show(
            Request::AddFlows {
                bridge,
                flows: vec![flow],
            },
            |_: &AddFlows| {},
        ),
        Cmd::AddFlows { bridge, file } => add_flows_file(&cli, &bridge, &file),
        Cmd::DelFlows {
            bridge,
            strict,
            filter,
        } => cli.show(
            Request::DelFlows {
                bridge,
                filter,
                strict,
            },
            |v: &DelFlows| println!("deleted {} rule(s), {} left", v.deleted, v.rules),
        ),
        Cmd::DumpFlows { bridge, filter } => {
            cli.show(Request::DumpFlows { bridge, filter }, print_flows)
        }
        Cmd::AddGroup { bridge, group } => cli.show(
            Request::AddGroup {
                bridge,
                group,
                modify: false,
            },
            done,
        ),
        Cmd::ModGroup { bridge, group } => cli.show(
            Request::AddGroup {
                bridge,
                group,
                modify: true,
            },
            done,
        ),
        Cmd::DelGroups { bridge, filter } => {
            let group = group_filter(filter.as_deref())?;
            cli.show(Request::DelGroups { bridge, group }, |v: &DelGroups| {
                println!("deleted {} group(s) and {} rule(s)", v.groups, v.rules)
            })
        }
        Cmd::DumpGroups { bridge } => {
            cli.show(Request::DumpGroups { bridge }, |v: &Vec<GroupEntry>| {
                for g in v {
                    println!(" {}", g.group);
                }
            })
        }
        Cmd::DumpGroupStats { bridge } => {
            cli.show(Request::DumpGroups { bridge }, |v: &Vec<GroupEntry>| {
                for g in v {
                    let id = g
                        .group
                        .split(',')
                        .next()
                        .unwrap_or_default()
                        .trim_start_matches("group_id=");
                    let mut line = format!(
                        " group_id={id},duration={:.3}s,packet_count={},byte_count={}",
                        g.duration_s, g.n_packets, g.n_bytes
                    );
                    for (i, (p, b)) in g.buckets.iter().enumerate() {
                        line += &format!(",bucket{i}:packet_count={p},byte_count={b}");
                    }
                    println!("{line}");
                }
            })
        }
        Cmd::DumpMegaflows { bridge } => cli.show(
            Request::DumpMegaflows { bridge },
            |v: &Vec<MegaflowEntry>| {
                for e in v {
                    println!(
                        "{}, packets:{}, bytes:{}, used:{}s, actions:{}",
                        e.matches, e.packets, e.bytes, e.used_s_ago, e.actions
                    );
                }
            },
        ),
        Cmd::AddMeter { bridge, meter } => cli.show(Request::AddMeter { bridge, meter }, done),
        Cmd::ModMeter { bridge, meter } => cli.show(Request::ModMeter { bridge, meter }, done),
        Cmd::DelMeters { bridge, meter } => {
            let meter = meter_filter(meter.as_deref())?;
            cli.show(Request::DelMeters { bridge, meter }, done)
        }
        Cmd::DumpMeters { bridge, meter } => {
            let meter = meter_filter(meter.as_deref())?;
            cli.show(
                Request::DumpMeters { bridge, meter },
                |v: &Vec<MeterEntry>| {
                    for m in v {
                        println!("{}", m.meter);
                    }
                },
            )
        }
        Cmd::MeterStats { bridge, meter } => {
            let meter = meter_filter(meter.as_deref())?;
            cli.show(
                Request::MeterStats { bridge, meter },
                |v: &Vec<MeterStats>| {
                    for m in v {
                        println!(
                            "meter:{} flow_count:{} packet_in_count:{} byte_in_count:{} duration:{:.3}s bands:",
                            m.id, m.flow_count, m.packet_in_count, m.byte_in_count, m.duration_s
                        );
                        for (i, b) in m.bands.iter().enumerate() {
                            println!("{i}: packet_count:{} byte_count:{}", b.packet_count, b.byte_count);
                        }
                    }
                },
            )
        }
        Cmd::DumpConntrack { filter } => {
            let zone = zone_filter(filter.as_deref())?;
            cli.show(
                Request::DumpConntrack { zone },
                |v: &Vec<ConntrackEntry>| {
                    for e in v {
                        println!("{}", e.ovs_text());
                    }
                },
            )
        }
        Cmd::FlushConntrack { filter } => {
            let zone = zone_filter(filter.as_deref())?;
            cli.show(
                Request::FlushConntrack { zone },
                |_: &ferrovs_proto::reply::FlushConntrack| {},
            )
        }
        Cmd::ConntrackStats => cli.show(Request::ConntrackStats, |s: &ConntrackStats| {
            print_conntrack_stats(s)
        }),
        Cmd::Trace {
            bridge,
            flow,
            packet,
            pcap,
            in_port,
            ct_next,
        } => trace::run(
            &cli,
            trace::TraceArgs {
                bridge,
                flow,
                packet,
                pcap,
                in_port,
                ct_next,
            },
        ),

        Cmd::LogLevel { args } => {
            let (module, level) = match args.as_slice() {
                [] => (None, None),
                [l] => (None, Some(l.clone())),
                [m, l] => (Some(m.clone()), Some(l.clone())),
                _ => return Err("log-level: [MODULE] LEVEL".into()),
            };
            cli.show(
                Request::LogLevel { module, level },
                |v: &ferrovs_proto::reply::LogLevels| {
                    println!("default: {}", v.default);
                    for (m, l) in &v.modules {
                        println!("{m}: {l}");
                    }
                },
            )
        }
        Cmd::Monitor { seconds } => {
            let secs = count(seconds, |n| {
                format!("monitor: '{n}' is not a number of seconds")
            })?;
            monitor(&cli, secs)
        }
        Cmd::Capture {
            port,
            direction,
            count,
            snaplen,
            write,
            filter,
        } => capture::run(
            &cli.client,
            capture::Args {
                port,
                direction,
                count,
                snaplen,
                write,
                filter,
            },
        ),
        Cmd::PmdRebalance => cli.show(Request::PmdRebalance, done),
    }
}

/// A `[meter=]N` or `[meter=]all` argument: one meter, or every one (`None`).
fn meter_filter(arg: Option<&str>) -> Result<Option<u32>, String> {
    let Some(a) = arg else { return Ok(None) };
    let v = a.strip_prefix("meter=").unwrap_or(a);
    if v.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    let n = match v.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => v.parse(),
    };
    match n {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(format!("'{a}' is not meter=N (N from 1) or meter=all")),
    }
}

/// `dump-flows`, as ovs-ofctl prints it.
fn print_flows(v: &Vec<FlowEntry>) {
    for r in v {
        // The table is in the stats part already: the rule's own text names it too.
        let table = format!("table={},", r.table);
        let flow = r.flow.strip_prefix(&table).unwrap_or(&r.flow);
        println!(
            " cookie={}, duration={:.3}s, table={}, n_packets={}, n_bytes={}, {}",
            r.cookie, r.duration_s, r.table, r.n_packets, r.n_bytes, flow
        );
    }
}

/// `add-flows BRIDGE FILE`: one request with every rule of the file; an error names the
/// file's line.
fn add_flows_file(cli: &Cli, bridge: &str, path: &str) -> Result<(), String> {
    let text = if path == "-" {
        let mut t = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut t)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        t
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?
    };
    let mut lines = Vec::new();
    let mut flows = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        lines.push(i + 1);
        flows.push(l.to_string());
    }
    let req = Request::AddFlows {
        bridge: bridge.into(),
        flows,
    };
    let v: AddFlows = cli.call(&req).map_err(|e| {
        // "flow N: why" -> "FILE:LINE: why"
        let parsed = e.strip_prefix("flow ").and_then(|r| {
            let (n, why) = r.split_once(": ")?;
            let n: usize = n.parse().ok()?;
            Some((*lines.get(n.checked_sub(1)?)?, why.to_string()))
        });
        match parsed {
            Some((line, why)) => format!("{path}:{line}: {why}"),
            None => e,
        }
    })?;
    if cli.json {
        println!("{}", serde_json::to_string(&v).map_err(|e| e.to_string())?);
    } else {
        println!("added {} rule(s), {} in all", v.added, v.rules);
    }
    Ok(())
}

fn main() -> ExitCode {
    // Man page and completions for the package (`$FERROVS_WRITE_DOCS`), then exit. The
    // commands' help is USAGE, so the page carries it.
    ferrovs_docgen::write_if_asked(|| {
        <Args as clap::CommandFactory>::command()
            .version(env!("CARGO_PKG_VERSION"))
            .about("The command-line client of ferrovsd's control socket")
            .long_about(
                "Sends one request to the ferrovsd running in the run directory and prints \
                 its reply (--json: the reply as JSON). Errors print as `ferrovs: MESSAGE` \
                 and exit 1.",
            )
            .mut_arg("help", |a| a.help("Print the commands (as `ferrovs help`)"))
            .after_help(USAGE)
    });
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrovs: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_daemons_service_variables_are_found_in_its_environment() {
        let env = b"PATH=/usr/bin\0NOTIFY_SOCKET=/run/systemd/notify\0WATCHDOG_PID=7\0\
                    WATCHDOG_USEC=60000000\0bogus\0\xff=1\0";
        assert_eq!(
            service_vars(env),
            [
                (
                    "NOTIFY_SOCKET".to_string(),
                    "/run/systemd/notify".to_string()
                ),
                ("WATCHDOG_USEC".to_string(), "60000000".to_string()),
            ]
        );
        assert!(service_vars(b"").is_empty());
    }
}
