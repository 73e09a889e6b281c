//! ferrovs: the command-line client of ferrovsd's control socket.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferrovs_proto::{Client, Request};
use serde_json::Value;

const USAGE: &str = "usage: ferrovs [--run-dir DIR] COMMAND [--json]

commands:
  show                                   bridges, ports, link state, features
  add-bridge BRIDGE | del-bridge BRIDGE
  add-port BRIDGE PORT type=TYPE [path=SOCKET] [dev=NETDEV] [queues=N] [tag=VLAN] [trunks=V,V]
           [mode=af_xdp|af_packet]       TYPE: vhost-user | vhost-user-client (path=SOCKET),
                                         tap | uplink (dev=NETDEV); an uplink uses AF_XDP
                                         where it can, else AF_PACKET, unless mode= forces one;
                                         vxlan (remote_ip=IP [key=VNI] [local_ip=IP]
                                         [dst_port=4789]): a VXLAN tunnel port
  del-port BRIDGE PORT
  set-port PORT coalesce-usecs=US [coalesce-frames=N]
                                         guest notification coalescing of a vhost-user port
                                         (also add-port options; 0 turns it off)
  port-stats [PORT]                      packets, bytes and drops by reason, per queue
  pmd-stats | pmd-stats-clear            PMD busy/idle cycles, cycles per packet
  mac-table BRIDGE                       learned addresses
  add-flow BRIDGE FLOW                   install a rule, ovs-ofctl syntax, e.g.
                                         'priority=100,in_port=vm1,tcp,tp_dst=80 actions=drop'
  add-flows BRIDGE FILE                  install every rule of FILE (- : stdin), one per line
                                         (# comments), all or none
  del-flows BRIDGE [--strict] [FILTER]   remove the rules FILTER covers (all without one;
                                         --strict: same match and priority only)
  dump-flows BRIDGE [FILTER]             rules with their packet and byte counters
  dump-megaflows BRIDGE                  the megaflow cache's entries
  config get [KEY] | config set KEY VALUE    pmd-cores, pmd-rx-mode, pmd-sleep-after-us,
                                         pmd-sleep-max-us, pmd-priority, mac-aging,
                                         mac-table-size, flow-limit, flow-max-idle,
                                         emc-insert-inv-prob
  monitor [SECONDS]                      live per-port rates, one line per second
  upgrade [NEW-FERROVSD]                 hot upgrade: start NEW-FERROVSD (default: the ferrovsd
                                         beside this ferrovs) with --takeover; it takes every
                                         port over, no guest reconnects; prints the phases
                                         (its log: DIR/ferrovsd.log)
  upgrade-history [N]                    the last N hot upgrades and their downtime
  version";

struct Cli {
    run_dir: PathBuf,
    json: bool,
}

impl Cli {
    fn call(&self, req: &Request) -> Result<Value, String> {
        Client::new(&self.run_dir)
            .call_raw(req)
            .map_err(|e| e.message())
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_show(v: &Value) {
    println!(
        "run-dir {}  pmd-cores {}  hugepages {}",
        s(&v["run_dir"]),
        s(&v["pmd_cores"]),
        s(&v["hugepages"])
    );
    for b in v["bridges"].as_array().into_iter().flatten() {
        println!("bridge {}", s(&b["name"]));
        for p in b["ports"].as_array().into_iter().flatten() {
            let feats: Vec<String> = p["features"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            let attach = if p["dev"].is_null() {
                format!("path {}", s(&p["path"]))
            } else {
                format!("dev {} mode {}", s(&p["dev"]), s(&p["mode"]))
            };
            println!(
                "  port {} ({}) {}  {}  queues {} ready {}  vlan {}",
                s(&p["name"]),
                s(&p["type"]),
                s(&p["state"]),
                attach,
                s(&p["queues"]),
                s(&p["ready_queues"]),
                s(&p["vlan"]["mode"])
                    + &p["vlan"]
                        .get("tag")
                        .map(|t| format!(" {t}"))
                        .unwrap_or_default(),
            );
            if !feats.is_empty() {
                println!("    features: {}", feats.join(" "));
            }
            let names = |v: &Value| -> String {
                let l: Vec<String> = v.as_array().into_iter().flatten().map(s).collect();
                if l.is_empty() {
                    "none".into()
                } else {
                    l.join(" ")
                }
            };
            println!(
                "    offloads: accepts {}  sends {}",
                names(&p["offloads"]["accepts"]),
                names(&p["offloads"]["sends"])
            );
            if p["last_error"] != Value::Null {
                println!("    last error: {}", s(&p["last_error"]));
            }
            if p["mode_fallback_reason"] != Value::Null {
                println!("    af_packet fallback: {}", s(&p["mode_fallback_reason"]));
            }
            if p["mode"] == "af_xdp" {
                let k = &p["kernel"];
                println!(
                    "    af_xdp: queue 0, xdp {}, {} mode",
                    s(&k["xdp_mode"]),
                    s(&k["bind"])
                );
            }
        }
    }
}

fn dir_line(name: &str, d: &Value) -> String {
    let mut out = format!(
        "{name}: packets {} bytes {} dropped {}",
        s(&d["packets"]),
        s(&d["bytes"]),
        s(&d["dropped"])
    );
    if let Some(m) = d["drops"].as_object() {
        for (k, v) in m {
            out.push_str(&format!(" {k}={v}"));
        }
    }
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    if n("guest_notifications") + n("notifications_suppressed") + n("notifications_coalesced") != 0
    {
        out.push_str(&format!(
            " | notifications {} suppressed {} coalesced {}",
            n("guest_notifications"),
            n("notifications_suppressed"),
            n("notifications_coalesced")
        ));
    }
    out
}

fn print_port_stats(v: &Value) {
    for p in v.as_array().into_iter().flatten() {
        let c = &p["coalesce"];
        if c["usecs"].as_u64().unwrap_or(0) != 0 {
            println!(
                "port {} (coalescing: {} us, {} packets)",
                s(&p["port"]),
                s(&c["usecs"]),
                s(&c["frames"])
            );
        } else {
            println!("port {}", s(&p["port"]));
        }
        println!("  {}", dir_line("rx", &p["rx"]));
        println!("  {}", dir_line("tx", &p["tx"]));
        let o = &p["offload"];
        if o["sw_csum"].as_u64().unwrap_or(0) + o["sw_tso"].as_u64().unwrap_or(0) != 0 {
            println!(
                "  software offloads: checksums {} tso packets {} segments {}",
                s(&o["sw_csum"]),
                s(&o["sw_tso"]),
                s(&o["sw_segments"])
            );
        }
        let m = &p["migration"];
        let dirty = p["tx"]["dirty_pages_logged"].as_u64().unwrap_or(0)
            + p["rx"]["dirty_pages_logged"].as_u64().unwrap_or(0);
        let pc = |k: &str| m[k].as_u64().unwrap_or(0);
        if m["logging"] == Value::Bool(true)
            || m["postcopy"] == Value::Bool(true)
            || dirty + pc("postcopy_pages_missing") + pc("rarp_announces") != 0
        {
            println!(
                "  migration: logging {} ({} log bytes) dirty pages logged {} | postcopy {} \
                 pages missing {} fetched {} | rarp announces {}",
                s(&m["logging"]),
                pc("log_bytes"),
                dirty,
                s(&m["postcopy"]),
                pc("postcopy_pages_missing"),
                pc("postcopy_pages_fetched"),
                pc("rarp_announces")
            );
        }
        for q in p["queues"].as_array().into_iter().flatten() {
            let broken = if q["broken"] != Value::Null {
                format!(" BROKEN: {}", s(&q["broken"]))
            } else {
                String::new()
            };
            println!(
                "    queue {} {:<10} ready {:<5} {}{}",
                s(&q["queue"]),
                s(&q["direction"]),
                s(&q["ready"]),
                dir_line("", &q["stats"]).trim_start_matches(": "),
                broken
            );
        }
    }
}

fn print_pmd_stats(v: &Value) {
    for p in v.as_array().into_iter().flatten() {
        println!("pmd {} core {}:", s(&p["pmd"]), s(&p["core"]));
        println!(
            "  rx queues: {}  rx packets: {}  tx packets: {}",
            s(&p["rx_queues"]),
            s(&p["rx_packets"]),
            s(&p["tx_packets"])
        );
        println!(
            "  busy cycles: {} ({}%)  idle cycles: {}  cycles per packet: {}",
            s(&p["busy_cycles"]),
            s(&p["busy_pct"]),
            s(&p["idle_cycles"]),
            s(&p["cycles_per_packet"])
        );
        let max = p["sleep_max_us"].as_u64().unwrap_or(0);
        println!(
            "  rx mode: {}  load-based sleep max: {}  priority: {}{}",
            s(&p["rx_mode"]),
            if max == 0 {
                "off".to_string()
            } else {
                format!("{max} us")
            },
            s(&p["priority"]),
            p["priority_error"]
                .as_str()
                .map(|e| format!(" (not applied: {e})"))
                .unwrap_or_default()
        );
        println!(
            "  sleep time: {:.3} s  wake-ups: {} (by kick or kernel port: {})  load-based sleeps: {}",
            p["sleep_us"].as_u64().unwrap_or(0) as f64 / 1e6,
            s(&p["sleeps"]),
            s(&p["kick_wakeups"]),
            s(&p["load_sleeps"])
        );
        let f = &p["flow"];
        if f["packets"].as_u64().unwrap_or(0) > 0 {
            let n = f["packets"].as_u64().unwrap_or(0).max(1) as f64;
            let pct = |k: &str| f[k].as_u64().unwrap_or(0) as f64 * 100.0 / n;
            println!(
                "  flow packets: {}  emc hits: {} ({:.1}%)  megaflow hits: {} ({:.1}%)  upcalls (misses): {} ({:.1}%)  emc skipped (bypass): {} ({:.1}%)",
                s(&f["packets"]),
                s(&f["emc_hits"]),
                pct("emc_hits"),
                s(&f["megaflow_hits"]),
                pct("megaflow_hits"),
                s(&f["upcalls"]),
                pct("upcalls"),
                s(&f["emc_skipped"]),
                pct("emc_skipped")
            );
        }
    }
    // The megaflow caches are shared by the PMDs: printed once.
    let caches = v
        .as_array()
        .and_then(|a| a.first())
        .and_then(|p| p["megaflow_caches"].as_array());
    for c in caches.into_iter().flatten() {
        println!(
            "megaflow cache {}: {} entries in {} subtables (limit {}), {} rules; inserted {}, evicted {}, invalidated {} in {} revalidations, refused: full {} stale {}",
            s(&c["bridge"]),
            s(&c["entries"]),
            s(&c["subtables"]),
            s(&c["limit"]),
            s(&c["rules"]),
            s(&c["inserted"]),
            s(&c["evicted"]),
            s(&c["invalidated"]),
            s(&c["revalidations"]),
            s(&c["refused_full"]),
            s(&c["refused_stale"])
        );
    }
}

fn monitor(cli: &Cli, secs: Option<u64>) -> Result<(), String> {
    let start = Instant::now();
    let mut prev: Option<(Instant, Value)> = None;
    loop {
        let v = cli.call(&Request::PortStats { port: None })?;
        let now = Instant::now();
        if let Some((t0, p0)) = &prev {
            let dt = now.duration_since(*t0).as_secs_f64();
            let mut line = String::new();
            for (a, b) in v
                .as_array()
                .into_iter()
                .flatten()
                .zip(p0.as_array().into_iter().flatten())
            {
                let rate = |dir: &str| {
                    (a[dir]["packets"]
                        .as_u64()
                        .unwrap_or(0)
                        .saturating_sub(b[dir]["packets"].as_u64().unwrap_or(0)))
                        as f64
                        / dt
                };
                let drops = a["rx"]["dropped"].as_u64().unwrap_or(0)
                    + a["tx"]["dropped"].as_u64().unwrap_or(0);
                line.push_str(&format!(
                    "{}: rx {:.3} Mpps tx {:.3} Mpps drops {}   ",
                    s(&a["port"]),
                    rate("rx") / 1e6,
                    rate("tx") / 1e6,
                    drops
                ));
            }
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"t": start.elapsed().as_secs_f64(), "ports": v})
                );
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
fn upgrade_line(r: &Value) -> String {
    format!(
        "pid {} -> {} (ferrovsd {} -> {}, schema {}): {} ports / {} queues; prepare {:.1} ms, \
         freeze {} us, downtime {:.0} us, total {:.1} ms",
        s(&r["old_pid"]),
        s(&r["new_pid"]),
        s(&r["old_version"]),
        s(&r["new_version"]),
        s(&r["schema"]),
        s(&r["ports"]),
        s(&r["queues"]),
        r["prepare_ms"].as_f64().unwrap_or(0.0),
        s(&r["freeze_us"]),
        r["downtime_us"].as_f64().unwrap_or(0.0),
        r["total_ms"].as_f64().unwrap_or(0.0),
    )
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
    // ports) must not preempt the PMDs still forwarding there.
    if let Ok(show) = cli.call(&Request::Show) {
        let pmd: Vec<usize> = show["pmd_cores"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_u64().map(|c| c as usize))
            .collect();
        let others: Vec<usize> = ferrovs_sys::os::allowed_cpus()
            .into_iter()
            .filter(|c| !pmd.contains(c))
            .collect();
        if !others.is_empty() {
            let _ = ferrovs_sys::os::set_affinity(&others);
        }
    }
    let log_path = cli.run_dir.join("ferrovsd.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let mut child = std::process::Command::new(&bin)
        .arg("--run-dir")
        .arg(&cli.run_dir)
        .arg("--takeover")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    let _ = std::io::BufReader::new(out).read_line(&mut line);
    let v: Value = serde_json::from_str(line.trim()).unwrap_or_else(|_| {
        // It died before reporting: reap it and say so.
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        serde_json::json!({"ok": false, "error": format!("{} exited ({status}) without a report", bin.display())})
    });
    if v["ok"] != Value::Bool(true) {
        let _ = child.wait();
        return Err(format!(
            "upgrade failed, the running ferrovsd carries on: {} (log: {})",
            s(&v["error"]),
            log_path.display()
        ));
    }
    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        println!("upgraded: {}", upgrade_line(&v));
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    args.retain(|a| a != "--json");
    let mut run_dir = std::env::var_os("FERROVS_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/run/ferrovs".into());
    if args.first().map(String::as_str) == Some("--run-dir") {
        if args.len() < 2 {
            return Err("--run-dir needs a value".into());
        }
        run_dir = args[1].clone().into();
        args.drain(..2);
    }
    let cli = Cli { run_dir, json };
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let need = |n: usize| {
        if a.len() == n {
            Ok(())
        } else {
            Err(format!("'{}' takes {} argument(s)\n{USAGE}", a[0], n - 1))
        }
    };
    let (req, printer): (Request, fn(&Value)) = match a.first().copied() {
        None | Some("-h") | Some("--help") | Some("help") => {
            println!("{USAGE}");
            return Ok(());
        }
        Some("show") => (Request::Show, print_show),
        Some("version") => (Request::Version, |v| {
            println!("ferrovsd {}", s(&v["version"]))
        }),
        Some("add-bridge") | Some("add-br") => {
            need(2)?;
            (
                Request::AddBridge {
                    bridge: a[1].into(),
                },
                |_| {},
            )
        }
        Some("del-bridge") | Some("del-br") => {
            need(2)?;
            (
                Request::DelBridge {
                    bridge: a[1].into(),
                },
                |_| {},
            )
        }
        Some("add-port") => {
            if a.len() < 3 {
                return Err(format!("add-port takes BRIDGE PORT and options\n{USAGE}"));
            }
            let options = a[3..].iter().map(|s| s.to_string()).collect();
            (
                Request::AddPort {
                    bridge: a[1].into(),
                    port: a[2].into(),
                    options,
                },
                |_| {},
            )
        }
        Some("del-port") => {
            need(3)?;
            (
                Request::DelPort {
                    bridge: a[1].into(),
                    port: a[2].into(),
                },
                |_| {},
            )
        }
        Some("set-port") => {
            if a.len() < 3 {
                return Err(format!(
                    "set-port takes PORT and KEY=VALUE options\n{USAGE}"
                ));
            }
            (
                Request::SetPort {
                    port: a[1].into(),
                    options: a[2..].iter().map(|s| s.to_string()).collect(),
                },
                |_| {},
            )
        }
        Some("port-stats") => {
            if a.len() > 2 {
                return Err(format!("port-stats takes at most one port\n{USAGE}"));
            }
            (
                Request::PortStats {
                    port: a.get(1).map(|s| s.to_string()),
                },
                print_port_stats,
            )
        }
        Some("pmd-stats") => (Request::PmdStats, print_pmd_stats),
        Some("pmd-stats-clear") => (Request::PmdStatsClear, |_| {}),
        Some("mac-table") => {
            need(2)?;
            (
                Request::MacTable {
                    bridge: a[1].into(),
                },
                |v| {
                    println!(" port                VLAN  MAC                Age");
                    for e in v.as_array().into_iter().flatten() {
                        println!(
                            " {:<18} {:>4}  {}  {:>4}",
                            s(&e["port"]),
                            s(&e["vlan"]),
                            s(&e["mac"]),
                            s(&e["age"])
                        );
                    }
                },
            )
        }
        Some("config") => match a.get(1).copied() {
            Some("get") if a.len() <= 3 => (
                Request::ConfigGet {
                    key: a.get(2).map(|s| s.to_string()),
                },
                |v| match v {
                    Value::Object(m) => m.iter().for_each(|(k, v)| println!("{k}={}", s(v))),
                    other => println!("{}", s(other)),
                },
            ),
            Some("set") if a.len() == 4 => (
                Request::ConfigSet {
                    key: a[2].into(),
                    value: a[3].into(),
                },
                |_| {},
            ),
            _ => {
                return Err(format!(
                    "usage: config get [KEY] | config set KEY VALUE\n{USAGE}"
                ))
            }
        },
        Some("upgrade") => {
            if a.len() > 2 {
                return Err(format!(
                    "upgrade takes at most the new binary's path\n{USAGE}"
                ));
            }
            return upgrade(&cli, a.get(1).copied());
        }
        Some("upgrade-history") => {
            let last = match a.get(1) {
                Some(n) => Some(
                    n.parse()
                        .map_err(|_| format!("upgrade-history: '{n}' is not a count"))?,
                ),
                None => None,
            };
            (Request::UpgradeHistory { last }, |v| {
                for r in v.as_array().into_iter().flatten() {
                    println!("{}", upgrade_line(r));
                }
            })
        }
        Some("add-flow") => {
            need(3)?;
            (
                Request::AddFlows {
                    bridge: a[1].into(),
                    flows: vec![a[2].into()],
                },
                |_| {},
            )
        }
        Some("add-flows") => {
            need(3)?;
            return add_flows_file(&cli, a[1], a[2]);
        }
        Some("del-flows") => {
            let strict = a.contains(&"--strict");
            let rest: Vec<&str> = a[1..]
                .iter()
                .copied()
                .filter(|x| *x != "--strict")
                .collect();
            if rest.is_empty() || rest.len() > 2 {
                return Err(format!(
                    "del-flows takes BRIDGE, --strict and a FILTER\n{USAGE}"
                ));
            }
            (
                Request::DelFlows {
                    bridge: rest[0].into(),
                    filter: rest.get(1).map(|s| s.to_string()),
                    strict,
                },
                |v| {
                    println!(
                        "deleted {} rule(s), {} left",
                        s(&v["deleted"]),
                        s(&v["rules"])
                    )
                },
            )
        }
        Some("dump-flows") => {
            if a.len() < 2 || a.len() > 3 {
                return Err(format!("dump-flows takes BRIDGE and a FILTER\n{USAGE}"));
            }
            (
                Request::DumpFlows {
                    bridge: a[1].into(),
                    filter: a.get(2).map(|s| s.to_string()),
                },
                print_flows,
            )
        }
        Some("dump-megaflows") => {
            need(2)?;
            (
                Request::DumpMegaflows {
                    bridge: a[1].into(),
                },
                |v| {
                    for e in v.as_array().into_iter().flatten() {
                        println!(
                            "{}, packets:{}, bytes:{}, used:{}s, actions:{}",
                            s(&e["match"]),
                            s(&e["packets"]),
                            s(&e["bytes"]),
                            s(&e["used_s_ago"]),
                            s(&e["actions"])
                        );
                    }
                },
            )
        }
        Some("monitor") => {
            let secs = match a.get(1) {
                Some(n) => Some(
                    n.parse()
                        .map_err(|_| format!("monitor: '{n}' is not a number of seconds"))?,
                ),
                None => None,
            };
            return monitor(&cli, secs);
        }
        Some(other) => return Err(format!("unknown command '{other}'\n{USAGE}")),
    };
    let v = cli.call(&req)?;
    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        printer(&v);
    }
    Ok(())
}

/// `dump-flows`, as ovs-ofctl prints it.
fn print_flows(v: &Value) {
    for r in v.as_array().into_iter().flatten() {
        println!(
            " cookie={}, duration={:.3}s, table={}, n_packets={}, n_bytes={}, {}",
            s(&r["cookie"]),
            r["duration_s"].as_f64().unwrap_or(0.0),
            s(&r["table"]),
            s(&r["n_packets"]),
            s(&r["n_bytes"]),
            s(&r["flow"])
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
    let v = cli.call(&req).map_err(|e| {
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
        println!("{v}");
    } else {
        println!(
            "added {} rule(s), {} in all",
            s(&v["added"]),
            s(&v["rules"])
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrovs: {e}");
            ExitCode::FAILURE
        }
    }
}
