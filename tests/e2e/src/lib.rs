//! Helpers for tests that run ferrovs as separate processes: locate the binaries, run each
//! process in its own session (as the benches do), kill everything on drop, and decide
//! whether a privileged test may skip (never under CI=true).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Directory of the release binaries (`FERROVS_BIN_DIR`, else `target/release`).
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("FERROVS_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release"));
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not built: run `cargo build --release` first",
        p.display()
    );
    p
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Whether we run in CI, where skipping a privileged test is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Returns true if the test may run; otherwise skips (outside CI) or panics (in CI).
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if in_ci() {
        panic!("required for this test but missing: {what}");
    }
    eprintln!("SKIP: {what}");
    false
}

/// Whether a command is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"))
}

/// A process killed (with its session) on drop.
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    /// Starts `cmd` in its own session with stdout/stderr to files under `log_dir`.
    pub fn spawn(name: &str, log_dir: &Path, program: &Path, args: &[&str]) -> Proc {
        let out = std::fs::File::create(log_dir.join(format!("{name}.out"))).unwrap();
        let err = std::fs::File::create(log_dir.join(format!("{name}.err"))).unwrap();
        let child = Command::new("setsid")
            .arg(program)
            .args(args)
            .stdout(out)
            .stderr(err)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        Proc {
            child,
            name: name.into(),
        }
    }

    /// Waits for exit (bounded) and returns stdout as JSON (the last JSON line).
    pub fn wait_json(mut self, log_dir: &Path, timeout: Duration) -> Value {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let out =
                    std::fs::read_to_string(log_dir.join(format!("{}.out", self.name))).unwrap();
                let err = std::fs::read_to_string(log_dir.join(format!("{}.err", self.name)))
                    .unwrap_or_default();
                assert!(st.success(), "{} failed: {st}\n{err}", self.name);
                let line = out
                    .lines()
                    .rev()
                    .find(|l| l.starts_with('{'))
                    .unwrap_or_else(|| panic!("{}: no JSON in output:\n{out}\n{err}", self.name));
                return serde_json::from_str(line).unwrap();
            }
            assert!(
                t.elapsed() < timeout,
                "{} did not finish in {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A private run directory. Directories of earlier runs of the same test are removed (the
/// latest one stays for its logs).
pub fn run_dir(name: &str) -> PathBuf {
    let prefix = format!("ferrovs-e2e-{name}-");
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let d = std::env::temp_dir().join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the CLI; returns its output.
pub fn cli(run_dir: &Path, args: &[&str]) -> Output {
    Command::new(bin("ferrovs"))
        .arg("--run-dir")
        .arg(run_dir)
        .args(args)
        .output()
        .unwrap()
}

/// Runs the CLI with `--json` and parses the result (panics on failure).
pub fn cli_json(run_dir: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let o = cli(run_dir, &a);
    assert!(
        o.status.success(),
        "ferrovs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Waits until `f` holds, up to `secs`.
pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts ferrovsd on `dir` with its PMD on `core`; waits for the control socket.
pub fn start_switch(dir: &Path, core: usize, extra: &[&str]) -> Proc {
    let d = dir.display().to_string();
    let c = core.to_string();
    let mut args = vec!["--run-dir", d.as_str(), "--pmd-cores", c.as_str()];
    args.extend_from_slice(extra);
    let p = Proc::spawn("ferrovsd", dir, &bin("ferrovsd"), &args);
    wait_until("control socket", 10, || {
        dir.join("ferrovs.ctl").exists() && cli(dir, &["show"]).status.success()
    });
    p
}

/// The last core (where PMDs go) and another one for traffic.
pub fn cores() -> (usize, usize) {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (n - 1, if n > 1 { n - 2 } else { 0 })
}

/// Drops the switch counted for a port in one direction: `"rx"` (from the guest) or `"tx"`.
pub fn port_drops(dir: &Path, port: &str, dir_name: &str) -> u64 {
    let s = cli_json(dir, &["port-stats", port]);
    s[0][dir_name]["dropped"].as_u64().unwrap()
}

/// Drops on the path from `from` to `to`.
pub fn path_drops(dir: &Path, from: &str, to: &str) -> u64 {
    port_drops(dir, from, "rx") + port_drops(dir, to, "tx")
}
