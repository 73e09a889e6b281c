//! ferrovs-gen command line (wiring only).
#![forbid(unsafe_code)]

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use ferrovs_gen::{Mode, Params};
use ferrovs_packet::build::MIN_FRAME;
use ferrovs_packet::{parse_mac, Mac};
use ferrovs_vhost::frontend::{Frontend, FrontendConfig};

/// The environment variable with `RUST_LOG`-style log directives.
const LOG_ENV: &str = "FERROVS_LOG";

/// Traffic generator and sink over vhost-user: a virtio-net driver in a process.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Traffic generator and sink over vhost-user: a virtio-net driver in a process.",
    after_help = "Prints a JSON summary on stdout: mpps, gbps, loss, latency p50/p99/p99.9/max.\n\
                  Live lines and diagnostics go to stderr with levels and timestamps; \
                  FERROVS_LOG takes RUST_LOG-style directives (e.g. `debug`)."
)]
struct Cli {
    /// What to do.
    #[arg(value_enum, value_name = "MODE")]
    mode: ModeArg,
    /// vhost-user socket of the backend (ferrovs, testpmd net_vhost, OVS).
    #[arg(long, value_name = "PATH", required_unless_present = "socket_dir")]
    socket: Option<PathBuf>,
    /// idle only: attach --ports frontends, at DIR/idle0.sock .. DIR/idle<N-1>.sock, in this
    /// one process (many quiet guests on one switch: bench/many-ports.sh).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["socket", "sink"], requires = "ports")]
    socket_dir: Option<PathBuf>,
    /// With --socket-dir: how many idle frontends.
    #[arg(long, value_name = "N", requires = "socket_dir",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    ports: Option<u32>,
    /// txonly: also receive (and account) on this second backend socket in the same thread:
    /// one process measures the whole path.
    #[arg(long, value_name = "PATH")]
    sink: Option<PathBuf>,
    /// Listen on PATH and wait for the backend to connect (its client mode).
    #[arg(long)]
    server: bool,
    /// Queue pairs.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    queues: u16,
    /// Ring size (a power of two >= 8).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = ring_size)]
    ring: u16,
    /// Packets per second, 0 = max.
    #[arg(long, value_name = "PPS", default_value_t = 0)]
    rate: u64,
    /// Stop after N packets (txonly) [default: no limit].
    #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
    count: u64,
    /// Distinct UDP flows (clamped to 1..=65000).
    #[arg(long, value_name = "N", default_value_t = 1)]
    flows: u64,
    /// txonly: also vary the IPv4 source over N addresses from 10.128.0.0, packet by packet
    /// (millions of flows for flow caches; 0: off).
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=1 << 24))]
    ip_flows: u32,
    /// Frame size without FCS.
    #[arg(long, value_name = "BYTES", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(MIN_FRAME as u64..=1518))]
    size: u64,
    /// Run time in seconds.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = seconds)]
    duration: Duration,
    /// rxonly: stop after this many seconds without packets.
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = seconds)]
    idle: Duration,
    /// Source MAC address.
    #[arg(long, value_name = "MAC", default_value = "02:00:00:00:00:01", value_parser = mac)]
    src: Mac,
    /// Destination MAC address.
    #[arg(long, value_name = "MAC", default_value = "02:00:00:00:00:02", value_parser = mac)]
    dst: Mac,
    /// txonly with --rate: random (exponential) gaps of mean 1/rate.
    #[arg(long)]
    poisson: bool,
    /// Never sleep when ahead of schedule (exact receive timestamps at low rates; burns this
    /// core).
    #[arg(long)]
    spin: bool,
    /// txonly: wait this many seconds after attaching before sending (the backend sets the
    /// new ports up; not measured).
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = seconds)]
    settle: Duration,
    /// No live line per second.
    #[arg(long)]
    quiet: bool,
    /// Play a migrating VM: ask the backend to log dirty pages (SET_LOG_BASE,
    /// VHOST_F_LOG_ALL) on every port attached, and take the log every 10 ms as QEMU's
    /// migration thread does (the dirty-logging cost in the bench). Diagnostics: see
    /// --log-level.
    #[arg(long)]
    log: bool,
    /// Packed virtqueues (VIRTIO_F_RING_PACKED): fail if the backend does not offer them
    /// (ferrovs offers them unless `vhost-packed-rings` is false).
    #[arg(long)]
    packed: bool,
    /// Log level for everything FERROVS_LOG does not name [default: info, or FERROVS_LOG's].
    #[arg(long, value_name = "LEVEL", ignore_case = true, value_parser = level_parser())]
    log_level: Option<log::LevelFilter>,
}

/// MODE on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// Send: --rate, --flows, --size; with --sink, also receive and account.
    Txonly,
    /// Receive: count, check per-flow sequence numbers and payloads, one-way latency.
    Rxonly,
    /// Round-trip latency against a `reflect` peer.
    Pingpong,
    /// Swap the MAC addresses and send every packet back.
    Reflect,
    /// Attach, set every queue up and stay quiet (live state for the switch to carry).
    Idle,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Txonly => Mode::TxOnly,
            ModeArg::Rxonly => Mode::RxOnly,
            ModeArg::Pingpong => Mode::PingPong,
            ModeArg::Reflect => Mode::Reflect,
            ModeArg::Idle => Mode::Idle,
        }
    }
}

/// `--ring`: a power of two >= 8 that fits a virtqueue size.
fn ring_size(s: &str) -> Result<u16, String> {
    s.parse::<u16>()
        .ok()
        .filter(|n| n.is_power_of_two() && *n >= 8)
        .ok_or_else(|| "must be a power of two >= 8 (at most 32768)".to_string())
}

/// A non-negative number of seconds, fractions allowed.
fn seconds(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("'{s}' is not a number of seconds"))
}

/// `--src`, `--dst`: six hex bytes separated by colons.
fn mac(s: &str) -> Result<Mac, String> {
    parse_mac(s).ok_or_else(|| format!("'{s}' is not a MAC address (e.g. 02:00:00:00:00:01)"))
}

/// `--log-level`: a level by name, the names listed in the help.
fn level_parser() -> impl TypedValueParser<Value = log::LevelFilter> {
    PossibleValuesParser::new(["off", "error", "warn", "info", "debug", "trace"])
        .map(|s| s.parse().unwrap_or(log::LevelFilter::Info))
}

/// Leveled, timestamped logs on stderr: info by default, then `$FERROVS_LOG`'s directives,
/// then `--log-level` for everything those do not name.
fn init_logging(level: Option<log::LevelFilter>) {
    let mut b = env_logger::Builder::new();
    b.filter_level(log::LevelFilter::Info)
        .format_timestamp_millis()
        .target(env_logger::Target::Stderr);
    if let Ok(spec) = std::env::var(LOG_ENV) {
        b.parse_filters(&spec);
    }
    if let Some(l) = level {
        b.filter_level(l);
    }
    b.init();
}

struct Args {
    path: PathBuf,
    /// `idle --socket-dir DIR --ports N`.
    idle_ports: Option<(PathBuf, usize)>,
    sink: Option<PathBuf>,
    server: bool,
    fc: FrontendConfig,
    p: Params,
    log: bool,
    packed: bool,
}

impl From<Cli> for Args {
    fn from(c: Cli) -> Args {
        let d = FrontendConfig::default();
        let want_features = if c.packed {
            d.want_features | ferrovs_vhost::features::VIRTIO_F_RING_PACKED
        } else {
            d.want_features
        };
        let fc = FrontendConfig {
            queue_pairs: usize::from(c.queues),
            ring_size: c.ring,
            want_features,
            ..d
        };
        let p = Params {
            mode: c.mode.into(),
            rate: c.rate,
            flows: c.flows.clamp(1, 65000) as u16,
            size: c.size as usize,
            duration: c.duration,
            count: c.count,
            src: c.src,
            dst: c.dst,
            live: !c.quiet,
            idle_timeout: c.idle,
            poisson: c.poisson,
            spin: c.spin,
            settle: c.settle,
            ip_flows: c.ip_flows,
        };
        Args {
            path: c.socket.unwrap_or_default(),
            idle_ports: c.socket_dir.zip(c.ports.map(|n| n as usize)),
            sink: c.sink,
            server: c.server,
            fc,
            p,
            log: c.log,
            packed: c.packed,
        }
    }
}

/// `--log`: logging on for every attached port; a thread takes the log's bits every 10 ms
/// (clearing them, so the switch's next marks land on lines it no longer holds, as with
/// QEMU) until `stop`. Returns the thread, which yields how many page bits it took.
fn start_logging(
    fes: &mut [&mut Frontend],
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<u64>, String> {
    let mut logs = Vec::new();
    for fe in fes.iter_mut() {
        logs.push(fe.start_logging().map_err(|e| format!("dirty log: {e}"))?);
    }
    Ok(std::thread::spawn(move || {
        let mut taken = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
            for l in &logs {
                for w in 0..l.size().div_ceil(8) {
                    taken += u64::from(l.take_word(w).count_ones());
                }
            }
        }
        taken
    }))
}

fn main() -> ExitCode {
    // Man page and completions for the package (`$FERROVS_WRITE_DOCS`), then exit.
    ferrovs_docgen::write_if_asked(<Cli as clap::CommandFactory>::command);
    let Args {
        path,
        idle_ports,
        sink: sink_path,
        server,
        fc,
        p,
        log,
        packed,
    } = {
        // Usage errors exit 2 with clap's message on stderr; --help prints to stdout, exits 0.
        let cli = Cli::parse();
        init_logging(cli.log_level);
        Args::from(cli)
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    if idle_ports.is_none() && std::env::args().any(|a| a == "--ports" || a.starts_with("--ports="))
    {
        eprintln!("ferrovs-gen: --ports goes with --socket-dir");
        return ExitCode::from(2);
    }
    if let Some((dir, n)) = idle_ports {
        return idle_many(&dir, n, server, &fc, &p, &stop);
    }
    let mut listener = None;
    let fe = if server {
        let _ = std::fs::remove_file(&path);
        let l = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                log::error!("cannot listen on {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        let fe = match l.accept() {
            Ok((s, _)) => Frontend::over(s, fc.clone()),
            Err(e) => {
                log::error!("accept: {e}");
                return ExitCode::FAILURE;
            }
        };
        listener = Some(l);
        fe
    } else {
        Frontend::connect(&path, fc.clone())
    };
    let mut fe = match fe {
        Ok(f) => f,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            log::error!("cannot attach to {}: {msg}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let mut sink = match &sink_path {
        Some(sp) => match Frontend::connect(sp, fc.clone()) {
            Ok(f) => Some(f),
            Err(e) => {
                log::error!("cannot attach to {}: {e}", sp.display());
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    if packed {
        for (f, at) in std::iter::once((&fe, &path)).chain(sink.as_ref().zip(sink_path.as_ref())) {
            if !f.packed() {
                log::error!(
                    "{} did not offer packed rings (ferrovs: `ferrovs config set vhost-packed-rings true`)",
                    at.display()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let log_stop = Arc::new(AtomicBool::new(false));
    let logger = if log {
        let mut fes: Vec<&mut Frontend> = vec![&mut fe];
        if let Some(s) = sink.as_mut() {
            fes.push(s);
        }
        match start_logging(&mut fes, log_stop.clone()) {
            Ok(t) => Some(t),
            Err(e) => {
                log::error!("{e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let result = ferrovs_gen::run(&mut fe, sink.as_ref(), listener.as_ref(), &p, &stop);
    log_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(t) = logger {
        let taken = t.join().unwrap_or(0);
        log::info!("dirty log: {taken} page bits taken");
    }
    match result {
        Ok(r) => {
            println!("{}", r.to_json(p.mode));
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `idle --socket-dir DIR --ports N`: attaches every frontend, says so on stderr (the
/// bench waits for that line), holds them until the duration ends or a signal, then prints
/// the JSON summary.
fn idle_many(
    dir: &std::path::Path,
    n: usize,
    server: bool,
    fc: &FrontendConfig,
    p: &Params,
    stop: &AtomicBool,
) -> ExitCode {
    if p.mode != Mode::Idle {
        eprintln!("ferrovs-gen: --socket-dir and --ports go with the idle mode only");
        return ExitCode::from(2);
    }
    let paths: Vec<PathBuf> = (0..n).map(|i| ferrovs_gen::idle_socket(dir, i)).collect();
    let ports = match ferrovs_gen::IdlePorts::attach(&paths, server, fc, stop) {
        Ok(ports) => ports,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    log::info!("idle: {} frontends attached, rings set up", ports.len());
    println!("{}", ports.hold(p.duration, stop));
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("ferrovs-gen").chain(args.iter().copied()))
            .map(Args::from)
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_those_of_before() {
        let a = parse(&["--socket", "s", "rxonly"]).unwrap();
        assert_eq!(a.path, PathBuf::from("s"));
        assert_eq!((a.sink, a.server, a.log), (None, false, false));
        assert_eq!((a.fc.queue_pairs, a.fc.ring_size), (1, 256));
        let p = a.p;
        assert_eq!(p.mode, Mode::RxOnly);
        assert_eq!(
            (p.rate, p.count, p.flows, p.size, p.ip_flows),
            (0, 0, 1, 64, 0)
        );
        assert_eq!(p.duration, Duration::from_secs(10));
        assert_eq!(p.idle_timeout, Duration::from_secs(2));
        assert_eq!(p.settle, Duration::ZERO);
        assert_eq!((p.src, p.dst), (0x0200_0000_0001, 0x0200_0000_0002));
        assert!(p.live && !p.poisson && !p.spin);
    }

    #[test]
    fn every_flag_parses_as_before() {
        let a = parse(&[
            "--socket",
            "a",
            "--sink",
            "b",
            "--server",
            "--queues",
            "4",
            "--ring",
            "1024",
            "--rate",
            "1000",
            "--count",
            "5",
            "--flows",
            "70000",
            "--ip-flows",
            "16777216",
            "--size",
            "1518",
            "--duration",
            "0.5",
            "--idle",
            "1.5",
            "--src",
            "02:00:00:00:00:0a",
            "--dst",
            "02:00:00:00:00:0b",
            "--poisson",
            "--spin",
            "--settle",
            "2",
            "--quiet",
            "--log",
            "--log-level",
            "warn",
            "txonly",
        ])
        .unwrap();
        assert_eq!(a.sink, Some(PathBuf::from("b")));
        assert!(a.server && a.log);
        assert_eq!((a.fc.queue_pairs, a.fc.ring_size), (4, 1024));
        let p = a.p;
        assert_eq!(p.mode, Mode::TxOnly);
        assert_eq!((p.rate, p.count, p.flows, p.size), (1000, 5, 65000, 1518));
        assert_eq!(p.ip_flows, 1 << 24);
        assert_eq!(p.duration, Duration::from_millis(500));
        assert_eq!(p.idle_timeout, Duration::from_millis(1500));
        assert_eq!(p.settle, Duration::from_secs(2));
        assert_eq!((p.src, p.dst), (0x0200_0000_000a, 0x0200_0000_000b));
        assert!(!p.live && p.poisson && p.spin);
        let c = Cli::try_parse_from([
            "ferrovs-gen",
            "--socket",
            "s",
            "idle",
            "--log-level",
            "WARN",
        ]);
        assert_eq!(c.unwrap().log_level, Some(log::LevelFilter::Warn));
        let a = parse(&["idle", "--socket-dir", "d", "--ports", "64", "--server"]).unwrap();
        assert_eq!(a.idle_ports, Some((PathBuf::from("d"), 64)));
        assert!(a.server);
        // MODE may come first, as before.
        assert_eq!(
            parse(&["idle", "--socket", "s"]).unwrap().p.mode,
            Mode::Idle
        );
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            &["txonly"][..],
            &["--socket", "s"],
            &["--socket", "s", "sideways"],
            &["--socket", "s", "--queues", "0", "txonly"],
            &["--socket", "s", "--queues", "17", "txonly"],
            &["--socket", "s", "--ring", "100", "txonly"],
            &["--socket", "s", "--ring", "4", "txonly"],
            &["--socket", "s", "--size", "59", "txonly"],
            &["--socket", "s", "--size", "1519", "txonly"],
            &["--socket", "s", "--ip-flows", "16777217", "txonly"],
            &["--socket", "s", "--duration", "-1", "txonly"],
            &["--socket", "s", "--src", "02:00", "txonly"],
            &["--socket", "s", "--bogus", "txonly"],
            &["--socket", "s", "--log-level", "loud", "txonly"],
            &["--socket-dir", "d", "idle"],
            &["--socket-dir", "d", "--ports", "0", "idle"],
            &["--socket-dir", "d", "--ports", "2", "--socket", "s", "idle"],
        ] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
