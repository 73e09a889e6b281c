//! Migrates a QEMU guest between two QEMUs through their QMP monitors and prints what
//! happened as one JSON line (bench/migration.sh; wiring only: `ferrovs_e2e::guest`).
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use ferrovs_e2e::guest::{migrate, MigrateOpts, Qmp};
use serde_json::json;

const USAGE: &str = "usage: ferrovs-e2e-migrate --src QMP_SOCKET --dst QMP_SOCKET --uri URI
       [--postcopy] [--postcopy-after SECS] --max-bandwidth BYTES_PER_S --downtime-limit MS
       [--timeout SECS] [--quit-source]
The destination QEMU listens at URI (its -incoming). Capabilities are set on both sides and
max-bandwidth and downtime-limit on the source, explicitly. A precopy migration not completed
within --timeout (default 60) is cancelled and reported with status \"timeout\" (it did not
converge). Prints {status, statuses, total_time_ms, downtime_ms, setup_time_ms,
ram_transferred, dirty_sync_count, stop_to_resume_ms, ...}.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut src, mut dst, mut uri) = (None, None, None);
    let (mut bw, mut dl) = (None, None);
    let mut postcopy = false;
    let mut after = 0.0;
    let mut timeout = 60.0;
    let mut quit_source = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        let r: Result<(), String> = (|| {
            match a.as_str() {
                "--src" => src = Some(val()?),
                "--dst" => dst = Some(val()?),
                "--uri" => uri = Some(val()?),
                "--postcopy" => postcopy = true,
                "--postcopy-after" => after = num(&val()?)?,
                "--max-bandwidth" => bw = Some(num(&val()?)? as u64),
                "--downtime-limit" => dl = Some(num(&val()?)? as u64),
                "--timeout" => timeout = num(&val()?)?,
                "--quit-source" => quit_source = true,
                _ => return Err(format!("unknown argument {a}")),
            }
            Ok(())
        })();
        if let Err(e) = r {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let (Some(src), Some(dst), Some(uri), Some(bw), Some(dl)) = (src, dst, uri, bw, dl) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let connect = |p: &str| Qmp::connect(Path::new(p), Duration::from_secs(20));
    let (mut s, mut d) = (connect(&src), connect(&dst));
    let mut o = MigrateOpts::new(&uri, postcopy);
    o.postcopy_after = Duration::from_secs_f64(after);
    o.max_bandwidth = bw;
    o.downtime_limit_ms = dl;
    o.timeout = Duration::from_secs_f64(timeout);
    let m = migrate(&mut s, &mut d, &o);
    let mut out = m.summary();
    out["converged"] = json!(m.status == "completed");
    out["dest_run_state"] = match d.execute("query-status", json!({})) {
        Ok(v) => v["status"].clone(),
        Err(e) => json!(e.0),
    };
    if quit_source {
        // QEMU may close the monitor before it answers.
        let _ = s.execute("quit", json!({}));
    }
    println!("{out}");
    ExitCode::SUCCESS
}

fn num(s: &str) -> Result<f64, String> {
    s.parse().map_err(|_| format!("'{s}' is not a number"))
}
