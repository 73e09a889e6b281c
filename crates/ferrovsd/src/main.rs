//! ferrovsd: parses arguments and runs the control plane; all logic lives in the libraries.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use ferrovs_control::config::parse_cores;
use ferrovs_control::logging::{Format, Levels};
use ferrovs_control::{Daemon, DaemonOptions};
use ferrovs_proto::{DEFAULT_RUN_DIR, RUN_DIR_ENV};

/// The environment variable with `RUST_LOG`-style log directives.
const LOG_ENV: &str = "FERROVS_LOG";

/// The ferrovs switch daemon.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "The ferrovs switch daemon: vhost-user, TAP and kernel ports on PMD threads, \
             driven through a control socket (see `ferrovs`).",
    after_help = "With no --config and nothing saved in DIR: bridge br0 with vhost-user server \
                  ports vm1 and vm2 at DIR/vm1.sock and DIR/vm2.sock.\n\n\
                  Logs go to stderr with levels and timestamps; FERROVS_LOG takes RUST_LOG-style \
                  directives (e.g. `debug` or `warn,ferrovs_control=debug`)."
)]
struct Cli {
    /// Control socket, saved configuration and default port sockets.
    #[arg(long, value_name = "DIR", env = RUN_DIR_ENV, default_value = DEFAULT_RUN_DIR)]
    run_dir: PathBuf,
    /// Start from this configuration (JSON) instead of the saved one.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Cores for PMD threads, e.g. 1 or 2,3 or 2-5 [default: the last core].
    #[arg(long, value_name = "LIST", value_parser = cores)]
    pmd_cores: Option<Cores>,
    /// Configured through the Open_vSwitch database of this OVSDB server, as ovs-vswitchd
    /// is (`unix:PATH` or `tcp:IP:PORT`): ovs-vsctl, libvirt, OpenStack and OVN configure
    /// ferrovs; nothing is read from or saved to DIR's configuration.
    #[arg(long, value_name = "REMOTE", conflicts_with = "config", value_parser = remote)]
    ovsdb: Option<String>,
    /// Hot upgrade: take every port over from the ferrovsd running in DIR (no guest
    /// reconnects); prints the handover's phases as one JSON line on stdout, then runs.
    /// `ferrovs upgrade` starts this for you.
    #[arg(long)]
    takeover: bool,
    /// Log level for everything FERROVS_LOG does not name [default: info, or FERROVS_LOG's].
    #[arg(long, value_name = "LEVEL", ignore_case = true, value_parser = level_parser())]
    log_level: Option<log::LevelFilter>,
    /// Serve Prometheus metrics on this address (`GET /metrics`, e.g. 127.0.0.1:9477 or
    /// `[::1]:9477`). With --takeover and no --metrics: the address the old daemon served.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// Log output: `text` (stderr), `json` (one object a line on stderr) or `journald` (the
    /// journal's native protocol, with FERROVS_PORT= and FERROVS_REASON= fields); `auto`:
    /// journald when stderr is the journal ($JOURNAL_STREAM), else text. $FERROVS_LOG_SOCKET
    /// points journald output at another socket.
    #[arg(long, value_name = "FORMAT", default_value = "auto", value_parser = log_format)]
    log_format: Format,
}

/// `--log-format`.
fn log_format(s: &str) -> Result<Format, String> {
    let f = Format::parse(s)?;
    Ok(match (f, std::env::var_os("FERROVS_LOG_SOCKET")) {
        (Format::Journald(_), Some(p)) => Format::Journald(p.into()),
        (f, _) => f,
    })
}

/// How long a new daemon waits for the old one to free the metrics address at a takeover.
const METRICS_TAKEOVER_WAIT: Duration = Duration::from_secs(30);

/// The `--metrics` address in a command line (NUL-separated, as /proc/PID/cmdline).
fn metrics_arg(cmdline: &[u8]) -> Option<SocketAddr> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.iter().enumerate().find_map(|(i, a)| {
        let v = if *a == b"--metrics" {
            *args.get(i + 1)?
        } else {
            a.strip_prefix(b"--metrics=")?
        };
        std::str::from_utf8(v).ok()?.parse().ok()
    })
}

/// Starts the exporter for the daemon in `run_dir`. At a takeover the old daemon may still
/// hold the address for a moment: a thread retries until it is free (bounded).
fn start_metrics(addr: SocketAddr, run_dir: &Path, takeover: bool) -> Result<(), String> {
    match ferrovs_metrics::serve(addr, run_dir) {
        Ok(s) => {
            log::info!("metrics on http://{}/metrics", s.local_addr());
            return Ok(());
        }
        Err(e) if !(takeover && e.kind() == std::io::ErrorKind::AddrInUse) => {
            return Err(format!("--metrics {addr}: {e}"));
        }
        Err(_) => {}
    }
    let run_dir = run_dir.to_path_buf();
    let t = Instant::now();
    let spawned = std::thread::Builder::new()
        .name("metrics-bind".into())
        .spawn(move || loop {
            match ferrovs_metrics::serve(addr, &run_dir) {
                Ok(s) => {
                    log::info!("metrics on http://{}/metrics", s.local_addr());
                    return;
                }
                Err(e) if t.elapsed() > METRICS_TAKEOVER_WAIT => {
                    log::error!("--metrics {addr}: {e} (gave up after {METRICS_TAKEOVER_WAIT:?})");
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        });
    spawned
        .map(|_| ())
        .map_err(|e| format!("--metrics {addr}: {e}"))
}

/// One `--pmd-cores` value (an alias: clap reads a bare `Vec` as a repeated option).
type Cores = Vec<usize>;

/// `--pmd-cores`: a core list as the configuration takes it.
fn cores(s: &str) -> Result<Cores, String> {
    parse_cores(s).map_err(|e| e.to_string())
}

/// `--ovsdb`: a remote as ovs-vswitchd takes it (active connections only).
fn remote(s: &str) -> Result<String, String> {
    ferrovs_control::vswitchdb::check_remote(s).map(|()| s.to_string())
}

/// `--log-level`: a level by name, the names listed in the help.
fn level_parser() -> impl TypedValueParser<Value = log::LevelFilter> {
    PossibleValuesParser::new(["off", "error", "warn", "info", "debug", "trace"])
        .map(|s| s.parse().unwrap_or(log::LevelFilter::Info))
}

/// Leveled logs in `format`: info by default, then `$FERROVS_LOG`'s directives, then
/// `--log-level` for everything those do not name; `ferrovs log-level` changes them later.
fn init_logging(level: Option<log::LevelFilter>, format: &Format) {
    let mut lv = Levels::new(log::LevelFilter::Info);
    let mut bad = None;
    if let Ok(spec) = std::env::var(LOG_ENV) {
        if let Err(e) = lv.apply(&spec) {
            bad = Some(format!("{LOG_ENV}: {e}"));
        }
    }
    if let Some(l) = level {
        lv.default = l;
    }
    if let Err(e) = ferrovs_control::logging::init(format, lv) {
        eprintln!("ferrovsd: {e}");
    }
    if let Some(b) = bad {
        log::warn!("{b}");
    }
}

fn main() -> ExitCode {
    // Man page and completions for the package (`$FERROVS_WRITE_DOCS`), then exit.
    ferrovs_docgen::write_if_asked(<Cli as clap::CommandFactory>::command);
    // Usage errors exit 2 with clap's message on stderr; --help prints to stdout and exits 0.
    let cli = Cli::parse();
    init_logging(cli.log_level, &cli.log_format);
    let takeover = cli.takeover;
    let mut metrics = cli.metrics;
    let opts = DaemonOptions {
        run_dir: cli.run_dir,
        config: cli.config,
        pmd_cores: cli.pmd_cores,
        ovsdb: cli.ovsdb,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            log::warn!("cannot handle signal {sig}: {e}");
        }
    }
    let started = if takeover {
        // Outlive the `ferrovs upgrade` that started us, and its terminal.
        let _ = ferrovs_sys::os::new_session();
        if metrics.is_none() {
            // Serve where the old daemon serves (read now: it exits after the handover).
            metrics = ferrovs_proto::Client::new(&opts.run_dir)
                .call::<ferrovs_proto::reply::Show>(&ferrovs_proto::Request::Show)
                .ok()
                .and_then(|s| std::fs::read(format!("/proc/{}/cmdline", s.pid)).ok())
                .and_then(|c| metrics_arg(&c));
        }
        Daemon::takeover(opts).map(|(d, report)| {
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
            // Whoever read the report may go away: never die of EPIPE on stdout later.
            let _ = ferrovs_sys::os::stdout_to_null();
            d
        })
    } else {
        Daemon::start(opts)
    };
    let mut d = match started {
        Ok(d) => d,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            log::error!("{msg}");
            if takeover {
                println!("{}", serde_json::json!({ "ok": false, "error": msg }));
            }
            return ExitCode::FAILURE;
        }
    };
    if let Some(addr) = metrics {
        if let Err(e) = start_metrics(addr, d.run_dir(), takeover) {
            log::error!("{e}");
            d.shutdown();
            return ExitCode::FAILURE;
        }
    }
    log::info!(
        "running, control socket {}",
        d.run_dir().join(ferrovs_proto::CTL_SOCKET).display()
    );
    // systemd (Type=notify): READY=1 from the loop once configured, the watchdog, status.
    d.attach_service_manager(takeover);
    d.run(&stop);
    if d.handed_over() {
        // Everything belongs to the new daemon now: touch nothing, unlink nothing.
        log::info!("handed over to a new ferrovsd; exiting");
        return ExitCode::SUCCESS;
    }
    d.shutdown();
    log::info!("stopped");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_old_daemons_metrics_address_is_found_in_its_command_line() {
        let a = |s: &str| metrics_arg(s.replace(' ', "\0").as_bytes());
        let want = Some("127.0.0.1:9477".parse().unwrap());
        assert_eq!(
            a("ferrovsd --run-dir /x --metrics 127.0.0.1:9477 --takeover"),
            want
        );
        assert_eq!(a("ferrovsd --metrics=127.0.0.1:9477"), want);
        assert_eq!(a("ferrovsd --run-dir /x"), None);
        assert_eq!(a("ferrovsd --metrics"), None);
        assert_eq!(a("ferrovsd --metrics bogus"), None);
    }

    #[test]
    fn every_flag_parses_as_before() {
        let c = Cli::try_parse_from([
            "ferrovsd",
            "--run-dir",
            "/tmp/x",
            "--config",
            "c.json",
            "--pmd-cores",
            "2-3",
            "--takeover",
            "--log-level",
            "DEBUG",
        ])
        .unwrap();
        assert_eq!(c.run_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.config, Some(PathBuf::from("c.json")));
        assert_eq!(c.pmd_cores, Some(vec![2, 3]));
        assert!(c.takeover);
        assert_eq!(c.log_level, Some(log::LevelFilter::Debug));
        assert_eq!(c.ovsdb, None);
        assert_eq!(c.metrics, None);
        let c = Cli::try_parse_from(["ferrovsd", "--metrics", "127.0.0.1:9477"]).unwrap();
        assert_eq!(c.metrics, Some("127.0.0.1:9477".parse().unwrap()));
        let c = Cli::try_parse_from(["ferrovsd", "--metrics", "[::1]:9477"]).unwrap();
        assert_eq!(c.metrics, Some("[::1]:9477".parse().unwrap()));
        for bad in ["9477", "localhost:9477", "1.2.3.4"] {
            let e = Cli::try_parse_from(["ferrovsd", "--metrics", bad]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        let c = Cli::try_parse_from(["ferrovsd", "--ovsdb", "unix:/run/db.sock"]).unwrap();
        assert_eq!(c.ovsdb.as_deref(), Some("unix:/run/db.sock"));
        let c = Cli::try_parse_from(["ferrovsd", "--ovsdb", "tcp:127.0.0.1:6640"]).unwrap();
        assert_eq!(c.ovsdb.as_deref(), Some("tcp:127.0.0.1:6640"));
        for bad in ["punix:/x", "tcp:1.2.3", "/run/db.sock", "unix:"] {
            let e = Cli::try_parse_from(["ferrovsd", "--ovsdb", bad]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        let e = Cli::try_parse_from(["ferrovsd", "--ovsdb", "unix:/x", "--config", "c.json"])
            .unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = Cli::try_parse_from(["ferrovsd", "--pmd-cores", "3-1"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("core list '3-1' is invalid"), "{e}");
        assert_eq!(
            Cli::try_parse_from(["ferrovsd", "--bogus"])
                .unwrap_err()
                .exit_code(),
            2
        );
    }
}
