//! ferrovs-gen command line (wiring only).
#![forbid(unsafe_code)]

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ferrovs_gen::{Mode, Params};
use ferrovs_packet::parse_mac;
use ferrovs_vhost::frontend::{Frontend, FrontendConfig};

const USAGE: &str =
    "usage: ferrovs-gen --socket PATH [--server] [--queues N] [--ring N] MODE [options]

MODE: txonly | rxonly | pingpong | reflect | idle (attach and stay quiet)
  --socket PATH      vhost-user socket of the backend (ferrovs, testpmd net_vhost, OVS)
  --sink PATH        txonly: also receive (and account) on this second backend socket
                     in the same thread: one process measures the whole path
  --server           listen on PATH and wait for the backend to connect (its client mode)
  --queues N         queue pairs (default 1)      --ring N   ring size (default 256)
  --rate PPS         packets per second, 0 = max (default 0)
  --count N          stop after N packets (txonly)
  --flows N          distinct UDP flows (default 1)
  --ip-flows N       txonly: also vary the IPv4 source over N addresses from 10.128.0.0,
                     packet by packet (millions of flows for flow caches; default 0: off)
  --size BYTES       frame size without FCS (default 64)
  --duration SECS    run time (default 10)
  --idle SECS        rxonly: stop after this long without packets (default 2)
  --src MAC / --dst MAC   addresses (defaults 02:00:00:00:00:01 / 02:00:00:00:00:02)
  --poisson          txonly with --rate: random (exponential) gaps of mean 1/rate
  --spin             never sleep when ahead of schedule (exact receive timestamps at low
                     rates; burns this core)
  --settle SECS      txonly: wait this long after attaching before sending (the backend
                     sets the new ports up; not measured)
  --quiet            no live line per second
  --log              play a migrating VM: ask the backend to log dirty pages (SET_LOG_BASE,
                     VHOST_F_LOG_ALL) on every port attached, and take the log every 10 ms
                     as QEMU's migration thread does (the dirty-logging cost in the bench)
Prints a JSON summary on stdout: mpps, gbps, loss, latency p50/p99/p99.9/max.";

struct Args {
    path: PathBuf,
    sink: Option<PathBuf>,
    server: bool,
    fc: FrontendConfig,
    p: Params,
    log: bool,
}

fn parse() -> Result<Args, String> {
    let mut path = None;
    let mut log = false;
    let mut sink = None;
    let mut server = false;
    let mut fc = FrontendConfig::default();
    let mut p = Params {
        mode: Mode::TxOnly,
        rate: 0,
        flows: 1,
        size: 64,
        duration: Duration::from_secs(10),
        count: 0,
        src: 0x0200_0000_0001,
        dst: 0x0200_0000_0002,
        live: true,
        idle_timeout: Duration::from_secs(2),
        poisson: false,
        spin: false,
        settle: Duration::ZERO,
        ip_flows: 0,
    };
    let mut mode = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("'{v}' is not a number"))
        };
        match a.as_str() {
            "--socket" => path = Some(PathBuf::from(val()?)),
            "--server" => server = true,
            "--sink" => sink = Some(PathBuf::from(val()?)),
            "--queues" => fc.queue_pairs = num(val()?)? as usize,
            "--ring" => fc.ring_size = num(val()?)? as u16,
            "--rate" => p.rate = num(val()?)?,
            "--count" => p.count = num(val()?)?,
            "--flows" => p.flows = num(val()?)?.clamp(1, 65000) as u16,
            "--size" => p.size = num(val()?)? as usize,
            "--duration" => {
                p.duration = Duration::from_secs_f64(val()?.parse().map_err(|_| "bad --duration")?)
            }
            "--idle" => {
                p.idle_timeout = Duration::from_secs_f64(val()?.parse().map_err(|_| "bad --idle")?)
            }
            "--src" => p.src = parse_mac(&val()?).ok_or("bad --src MAC")?,
            "--dst" => p.dst = parse_mac(&val()?).ok_or("bad --dst MAC")?,
            "--quiet" => p.live = false,
            "--log" => log = true,
            "--poisson" => p.poisson = true,
            "--spin" => p.spin = true,
            "--ip-flows" => {
                p.ip_flows = val()?
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= 1 << 24)
                    .ok_or("bad --ip-flows (0..=16777216)")?
            }
            "--settle" => {
                p.settle = Duration::from_secs_f64(val()?.parse().map_err(|_| "bad --settle")?)
            }
            "txonly" => mode = Some(Mode::TxOnly),
            "rxonly" => mode = Some(Mode::RxOnly),
            "pingpong" => mode = Some(Mode::PingPong),
            "reflect" => mode = Some(Mode::Reflect),
            "idle" => mode = Some(Mode::Idle),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    p.mode = mode.ok_or("a MODE is required")?;
    if !(1..=16).contains(&fc.queue_pairs) {
        return Err("--queues must be 1..=16".into());
    }
    if !fc.ring_size.is_power_of_two() || fc.ring_size < 8 {
        return Err("--ring must be a power of two >= 8".into());
    }
    if p.size < ferrovs_packet::build::MIN_FRAME || p.size > 1518 {
        return Err(format!(
            "--size must be {}..=1518",
            ferrovs_packet::build::MIN_FRAME
        ));
    }
    Ok(Args {
        path: path.ok_or("--socket PATH is required")?,
        sink,
        server,
        fc,
        p,
        log,
    })
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
    let Args {
        path,
        sink: sink_path,
        server,
        fc,
        p,
        log,
    } = match parse() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ferrovs-gen: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let mut listener = None;
    let fe = if server {
        let _ = std::fs::remove_file(&path);
        let l = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("ferrovs-gen: cannot listen on {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        let fe = match l.accept() {
            Ok((s, _)) => Frontend::over(s, fc.clone()),
            Err(e) => {
                eprintln!("ferrovs-gen: accept: {e}");
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
            eprintln!("ferrovs-gen: cannot attach to {}: {msg}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let mut sink = match &sink_path {
        Some(sp) => match Frontend::connect(sp, fc.clone()) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("ferrovs-gen: cannot attach to {}: {e}", sp.display());
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let log_stop = Arc::new(AtomicBool::new(false));
    let logger = if log {
        let mut fes: Vec<&mut Frontend> = vec![&mut fe];
        if let Some(s) = sink.as_mut() {
            fes.push(s);
        }
        match start_logging(&mut fes, log_stop.clone()) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("ferrovs-gen: {e}");
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
        eprintln!("ferrovs-gen: dirty log: {taken} page bits taken");
    }
    match result {
        Ok(r) => {
            println!("{}", r.to_json(p.mode));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ferrovs-gen: {e}");
            ExitCode::FAILURE
        }
    }
}
