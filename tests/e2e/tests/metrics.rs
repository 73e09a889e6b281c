//! `ferrovsd --metrics`: a real Prometheus server (Debian's `prometheus`) scrapes ferrovsd
//! while two TAP ports in two namespaces carry pings, and the packet counters it stored
//! (asked through its HTTP API, `/api/v1/query`) are the ones `ferrovs port-stats` reports;
//! hostile scrapers (silent, trickling, oversized, a flood of connections) neither stall
//! the control plane nor keep a later scrape from being answered; and a hot upgrade goes on
//! serving on the same address, with the upgrade counted.
//!
//! The Prometheus test needs root (namespaces, TAP) and `prometheus`; in CI (CI=true) a
//! missing one is a failure, outside CI the test skips with a message.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ferrovs_e2e::*;
use serde_json::Value;

/// A free TCP port on 127.0.0.1.
fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `GET path` over HTTP/1.0: (status line, body); None if nothing answered in time.
fn http_get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// A scrape of ferrovsd's exporter: the sample `name{labels}` (labels exactly as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Percent-encodes a query string value.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server of its own (config, storage and logs in `dir`), stopped on drop.
struct Prometheus {
    _proc: Proc,
    addr: SocketAddr,
}

impl Prometheus {
    fn start(dir: &Path, target: SocketAddr) -> Prometheus {
        let addr = free_addr();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: ferrovs\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let (c, db, web) = (
            format!("--config.file={}", cfg.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address={addr}"),
        );
        let p = Proc::spawn(
            "prometheus",
            dir,
            &guest::which("prometheus"),
            &[&c, &db, &web],
        );
        let prom = Prometheus { _proc: p, addr };
        wait_until("prometheus ready", 30, || {
            http_get(addr, "/-/ready").is_some_and(|(st, _)| st.contains(" 200 "))
        });
        prom
    }

    /// `/api/v1/query`: the instant vector's samples as (labels, value).
    fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let path = format!("/api/v1/query?query={}", encode(q));
        let Some((st, body)) = http_get(self.addr, &path) else {
            return Vec::new();
        };
        assert!(st.contains(" 200 "), "{q}: {st}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{v}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let n = r["value"][1].as_str().unwrap().parse::<f64>().unwrap();
                (r["metric"].clone(), n)
            })
            .collect()
    }

    /// The single value of `q`, once Prometheus has one.
    fn one(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        assert!(r.len() <= 1, "{q}: {r:?}");
        r.first().map(|(_, v)| *v)
    }
}

fn add_port(dir: &Path, args: &[&str]) {
    let mut a = vec!["add-port", "br0"];
    a.extend_from_slice(args);
    let o = cli(dir, &a);
    assert!(
        o.status.success(),
        "ferrovs {}: {}",
        a.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `port-stats PORT`: (rx packets, tx packets, rx bytes, tx bytes).
fn port_counters(dir: &Path, port: &str) -> [u64; 4] {
    let s = cli_json(dir, &["port-stats", port]);
    let n = |d: &str, k: &str| s[0][d][k].as_u64().unwrap();
    [
        n("rx", "packets"),
        n("tx", "packets"),
        n("rx", "bytes"),
        n("tx", "bytes"),
    ]
}

#[test]
fn prometheus_stores_the_packet_counters_ferrovs_reports() {
    if !require(
        is_root() && have("ip") && have("ping") && Path::new("/dev/net/tun").exists(),
        "root, iproute2, ping and /dev/net/tun (network namespaces, TAP)",
    ) || !require(
        have("prometheus"),
        "prometheus (scripts/deps.sh installs it)",
    ) {
        return;
    }
    let dir = run_dir("metrics");
    let (pmd, _) = cores();
    let maddr = free_addr();
    let m = maddr.to_string();
    let _sw = start_switch(&dir, pmd, &["--metrics", &m]);
    // Two namespaces, each with the TAP of one port.
    let mut net = Net::new();
    let (ns1, ns2) = (Net::name("mns1-"), Net::name("mns2-"));
    let (t1, t2) = (Net::name("mt1"), Net::name("mt2"));
    net.netns(&ns1);
    net.netns(&ns2);
    net.track_link(&t1);
    net.track_link(&t2);
    add_port(&dir, &["t1", "type=tap", &format!("dev={t1}")]);
    add_port(&dir, &["t2", "type=tap", &format!("dev={t2}")]);
    net.move_into(&t1, &ns1, "10.9.7.1/24");
    net.move_into(&t2, &ns2, "10.9.7.2/24");
    // Rules: the traffic goes through the OpenFlow pipeline and its megaflow cache (a
    // lone NORMAL rule is the plain learning switch).
    for r in [
        "priority=10,icmp,actions=normal",
        "priority=0,actions=normal",
    ] {
        let o = cli(&dir, &["add-flow", "br0", r]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let prom = Prometheus::start(&dir, maddr);
    let pings = 50;
    let got = ping(&ns1, "10.9.7.2", pings);
    assert_eq!(got, u64::from(pings), "every ping answered");

    // Counters now (A); Prometheus's value once it scraped after A; counters then (B).
    // Traffic has stopped: A <= stored <= B (B - A: stray IPv6/ARP, if any).
    std::thread::sleep(Duration::from_millis(300));
    let a: Vec<[u64; 4]> = ["t1", "t2"]
        .iter()
        .map(|p| port_counters(&dir, p))
        .collect();
    let names = [
        "ferrovs_port_rx_packets_total",
        "ferrovs_port_tx_packets_total",
        "ferrovs_port_rx_bytes_total",
        "ferrovs_port_tx_bytes_total",
    ];
    let mut stored = [[0f64; 4]; 2];
    let t = Instant::now();
    'wait: loop {
        let mut all = true;
        for (i, p) in ["t1", "t2"].iter().enumerate() {
            for (j, n) in names.iter().enumerate() {
                let q = format!("{n}{{job=\"ferrovs\",bridge=\"br0\",port=\"{p}\"}}");
                stored[i][j] = prom.one(&q).unwrap_or(-1.0);
                all &= stored[i][j] >= a[i][j] as f64;
            }
        }
        if all {
            break 'wait;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "Prometheus never stored counters as high as {a:?}: {stored:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let b: Vec<[u64; 4]> = ["t1", "t2"]
        .iter()
        .map(|p| port_counters(&dir, p))
        .collect();
    for i in 0..2 {
        for j in 0..4 {
            assert!(
                a[i][j] as f64 <= stored[i][j] && stored[i][j] <= b[i][j] as f64,
                "port t{} {}: ferrovs {} then {}, Prometheus {}",
                i + 1,
                names[j],
                a[i][j],
                b[i][j],
                stored[i][j]
            );
        }
    }
    // The pings went through both ports both ways.
    for (i, c) in a.iter().enumerate() {
        assert!(
            c[0] >= u64::from(pings) && c[1] >= u64::from(pings),
            "t{}: {c:?}",
            i + 1
        );
    }
    eprintln!("ferrovs t1/t2 (rx, tx packets, rx, tx bytes): {a:?}; Prometheus {stored:?}");

    // The rest of what a scrape carries reached Prometheus too.
    assert_eq!(prom.one("up{job=\"ferrovs\"}"), Some(1.0));
    let q = "ferrovs_port_state{port=\"vm1\",state=\"listening\"}";
    assert_eq!(prom.one(q), Some(1.0), "{q}");
    let q = "ferrovs_port_state{port=\"t1\",state=\"attached\"}";
    assert_eq!(prom.one(q), Some(1.0), "{q}");
    let busy = prom.query("ferrovs_pmd_busy_cycles_total");
    assert!(
        !busy.is_empty() && busy.iter().all(|(_, v)| *v > 0.0),
        "{busy:?}"
    );
    for q in [
        "ferrovs_pmd_idle_cycles_total",
        "ferrovs_pmd_cycles_per_packet",
        "ferrovs_pmd_upcalls_total",
        "ferrovs_megaflow_entries",
        "ferrovs_upgrades_total",
        "ferrovs_build_info",
    ] {
        assert!(!prom.query(q).is_empty(), "{q} not stored");
    }
    let q = "ferrovs_flows{bridge=\"br0\",table=\"0\"}";
    assert_eq!(prom.one(q), Some(2.0), "{q}");
    let q = "ferrovs_bridge_rules{bridge=\"br0\"}";
    assert_eq!(prom.one(q), Some(2.0), "{q}");
    let pmd = cli_json(&dir, &["pmd-stats"]);
    let upcalls = pmd[0]["flow"]["upcalls"].as_u64().unwrap() as f64;
    let stored_upcalls = prom.one("sum(ferrovs_pmd_upcalls_total)").unwrap();
    assert!(
        stored_upcalls <= upcalls && stored_upcalls > 0.0,
        "upcalls: Prometheus {stored_upcalls}, ferrovs {upcalls}"
    );
    // What the ports dropped (if anything) is by reason, never another label.
    for (m, _) in prom.query("{__name__=~\"ferrovs_port_.x_drops_total\"}") {
        assert!(m["reason"].is_string(), "{m}");
    }
    drop(net);
}

/// Holds `n` connections that send `what` and then nothing.
fn hold(addr: SocketAddr, n: usize, what: &[u8]) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| {
            let mut s = TcpStream::connect(addr).ok()?;
            let _ = s.write_all(what);
            Some(s)
        })
        .collect()
}

/// How long `ferrovs show` takes.
fn show_time(dir: &Path) -> Duration {
    let t = Instant::now();
    let o = cli(dir, &["show"]);
    assert!(o.status.success());
    t.elapsed()
}

#[test]
fn hostile_scrapers_stall_nothing_and_a_later_scrape_is_answered() {
    let dir = run_dir("metrics-hostile");
    let (pmd, _) = cores();
    let maddr = free_addr();
    let m = maddr.to_string();
    let _sw = start_switch(&dir, pmd, &["--metrics", &m]);
    let (st, body) = http_get(maddr, "/metrics").expect("a scrape");
    assert!(st.contains(" 200 "), "{st}");
    assert_eq!(
        sample(
            &body,
            "ferrovs_port_state{bridge=\"br0\",port=\"vm1\",state=\"listening\"}"
        ),
        Some(1.0),
        "{body}"
    );

    // An oversized head is refused (431) without being read whole.
    let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 64 << 10));
    let mut s = TcpStream::connect(maddr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(&big);
    let mut first = [0u8; 12];
    let _ = s.read_exact(&mut first);
    assert_eq!(
        &first,
        b"HTTP/1.1 431",
        "{:?}",
        String::from_utf8_lossy(&first)
    );
    drop(s);

    // Every connection slot (4) taken: silent clients and a head that never ends.
    let t = Instant::now();
    let mut held = hold(maddr, 3, b"");
    held.extend(hold(maddr, 1, b"GET /metrics HTTP/1.1\r\nX-Slow: "));
    std::thread::sleep(Duration::from_millis(100));
    // A flood of connections beyond the slots: each closed at once, none queued.
    let flood = hold(maddr, 200, b"GET /metrics HTTP/1.1\r\n\r\n");
    let t0 = Instant::now();
    let refused = http_get(maddr, "/metrics");
    assert!(
        refused.as_ref().is_none_or(|(st, _)| !st.contains(" 200 ")),
        "answered with every slot taken: {refused:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // The control plane answers as ever meanwhile.
    for _ in 0..5 {
        let d = show_time(&dir);
        assert!(d < Duration::from_secs(1), "ferrovs show took {d:?}");
    }
    drop(flood);
    // At the request deadline (5 s) the slots are free again and a scrape is answered.
    let answered = loop {
        if let Some((st, body)) = http_get(maddr, "/metrics") {
            if st.contains(" 200 ") {
                break body;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no scrape answered after the hostile clients"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let waited = t.elapsed();
    eprintln!("a scrape answered {waited:?} after the hostile clients took every slot");
    assert!(
        waited > Duration::from_secs(4),
        "{waited:?}: the slots were not held"
    );
    assert!(
        answered.contains("ferrovs_pmd_busy_cycles_total"),
        "{answered}"
    );
    drop(held);
    let (st, _) = http_get(maddr, "/nothing").expect("an answer");
    assert!(st.contains(" 404 "), "{st}");
}

#[test]
fn a_hot_upgrade_serves_on_the_same_address_and_is_counted() {
    let dir = run_dir("metrics-upgrade");
    let (pmd, _) = cores();
    let maddr = free_addr();
    let m = maddr.to_string();
    let _sw = start_switch(&dir, pmd, &["--metrics", &m]);
    let _stop = StopCurrent(dir.clone());
    let (_, body) = http_get(maddr, "/metrics").expect("a scrape");
    assert_eq!(sample(&body, "ferrovs_upgrades_total"), Some(0.0), "{body}");
    assert_eq!(sample(&body, "ferrovs_upgrade_last_downtime_seconds"), None);
    let r = upgrade(&dir, &[]).expect("upgrade");
    let downtime = r["downtime_us"].as_f64().unwrap() / 1e6;
    let t = Instant::now();
    let body = loop {
        if let Some((st, body)) = http_get(maddr, "/metrics") {
            if st.contains(" 200 ") && sample(&body, "ferrovs_upgrades_total") == Some(1.0) {
                break body;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the new daemon does not serve metrics"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "metrics served by the new daemon {:?} after the upgrade",
        t.elapsed()
    );
    let got = sample(&body, "ferrovs_upgrade_last_downtime_seconds").unwrap();
    assert!((got - downtime).abs() < 1e-9, "{got} vs {downtime}");
    assert_eq!(r["new_pid"].as_u64(), Some(daemon_pid(&dir)));
}
