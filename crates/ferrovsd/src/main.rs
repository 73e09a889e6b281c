//! ferrovsd: parses arguments and runs the control plane; all logic lives in the libraries.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ferrovs_control::config::parse_cores;
use ferrovs_control::{Daemon, DaemonOptions};

const USAGE: &str =
    "usage: ferrovsd [--run-dir DIR] [--config FILE] [--pmd-cores LIST] [--takeover]

  --run-dir DIR      control socket, saved configuration and default port sockets
                     (default: $FERROVS_RUN_DIR or /run/ferrovs)
  --config FILE      start from this configuration (JSON) instead of the saved one
  --pmd-cores LIST   cores for PMD threads, e.g. 1 or 2,3 or 2-5 (default: the last core)
  --takeover         hot upgrade: take every port over from the ferrovsd running in DIR
                     (no guest reconnects); prints the handover's phases as one JSON line
                     on stdout, then runs. `ferrovs upgrade` starts this for you.

With no --config and nothing saved in DIR: bridge br0 with vhost-user server ports vm1 and
vm2 at DIR/vm1.sock and DIR/vm2.sock.";

fn parse() -> Result<(DaemonOptions, bool), String> {
    let mut opts = DaemonOptions {
        run_dir: std::env::var_os("FERROVS_RUN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/run/ferrovs".into()),
        config: None,
        pmd_cores: None,
    };
    let mut takeover = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--run-dir" => opts.run_dir = val("--run-dir")?.into(),
            "--config" => opts.config = Some(val("--config")?.into()),
            "--pmd-cores" => {
                opts.pmd_cores = Some(parse_cores(&val("--pmd-cores")?).map_err(|e| e.to_string())?)
            }
            "--takeover" => takeover = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok((opts, takeover))
}

fn main() -> ExitCode {
    // The control plane logs through `log` (rate-limited per port and reason); info and up
    // by default, RUST_LOG overrides.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let (opts, takeover) = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ferrovsd: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("ferrovsd: cannot handle signal {sig}: {e}");
        }
    }
    let started = if takeover {
        // Outlive the `ferrovs upgrade` that started us, and its terminal.
        let _ = ferrovs_sys::os::new_session();
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
            eprintln!("ferrovsd: {msg}");
            if takeover {
                println!("{}", serde_json::json!({ "ok": false, "error": msg }));
            }
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "ferrovsd: running, control socket {}/ferrovs.ctl",
        d.run_dir().display()
    );
    d.run(&stop);
    if d.handed_over() {
        // Everything belongs to the new daemon now: touch nothing, unlink nothing.
        eprintln!("ferrovsd: handed over to a new ferrovsd; exiting");
        return ExitCode::SUCCESS;
    }
    d.shutdown();
    eprintln!("ferrovsd: stopped");
    ExitCode::SUCCESS
}
