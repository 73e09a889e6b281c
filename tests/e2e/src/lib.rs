//! Helpers for tests that run ferrovs as separate processes: locate the binaries, run each
//! process in its own session (as the benches do), kill everything on drop, and decide
//! whether a privileged test may skip (never under CI=true).
#![forbid(unsafe_code)]

pub mod guest;
pub mod ofwire;
pub mod ovsdb;
pub mod tunnel;

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
/// latest one stays for its logs), but not those of a test process still running (the same
/// test run at the same time from another checkout).
pub fn run_dir(name: &str) -> PathBuf {
    let prefix = format!("ferrovs-e2e-{name}-");
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let file = e.file_name().to_string_lossy().to_string();
            let Some(pid) = file.strip_prefix(&prefix) else {
                continue;
            };
            // (Only this test's: "guests-" must not take "guests-upgrade-PID".)
            match pid.parse::<u64>() {
                Ok(pid) if !alive(pid) => {}
                _ => continue,
            }
            let _ = std::fs::remove_dir_all(e.path());
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
    // A guest run on packed rings (guest.rs, `FERROVS_GUEST_RING=packed`): offer them.
    if guest::guest_ring() == guest::Ring::Packed {
        let o = cli(dir, &["config", "set", "vhost-packed-rings", "true"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    p
}

/// Starts ferrovsd as [`start_switch`] does, but configured with `bridges` and no port
/// (not the embedded default configuration), and waits for each bridge's OpenFlow
/// management socket `BRIDGE.mgmt`.
pub fn start_bare_switch(dir: &Path, core: usize, bridges: &[&str]) -> Proc {
    let conf = dir.join("conf.json");
    let list: Vec<String> = bridges
        .iter()
        .map(|b| format!(r#"{{"name":"{b}","ports":[]}}"#))
        .collect();
    std::fs::write(
        &conf,
        format!(
            r#"{{"version":1,"bridges":[{}],"pmd_cores":[0],"other":{{}}}}"#,
            list.join(",")
        ),
    )
    .unwrap();
    let c = conf.display().to_string();
    let p = start_switch(dir, core, &["--config", &c]);
    for b in bridges {
        let sock = dir.join(format!("{b}.mgmt"));
        wait_until(&format!("{b}.mgmt"), 10, || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
    }
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

/// Runs `ferrovs upgrade --json` (hot upgrade) with `env`; returns the report, or stderr.
pub fn upgrade(dir: &Path, env: &[(&str, &str)]) -> Result<Value, String> {
    let mut c = Command::new(bin("ferrovs"));
    c.arg("--run-dir").arg(dir).args(["upgrade", "--json"]);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    if o.status.success() {
        Ok(serde_json::from_slice(&o.stdout).expect("upgrade report"))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

/// Stops whichever daemon serves `dir` when the test ends: after a takeover that is no
/// longer the process the test started.
#[derive(Debug)]
pub struct StopCurrent(pub PathBuf);

impl Drop for StopCurrent {
    fn drop(&mut self) {
        let o = cli(&self.0, &["show", "--json"]);
        if let Ok(v) = serde_json::from_slice::<Value>(&o.stdout) {
            if let Some(pid) = v["pid"].as_u64() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
                let t = Instant::now();
                while alive(pid) && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

/// The pid of the daemon serving `dir` now.
pub fn daemon_pid(dir: &Path) -> u64 {
    cli_json(dir, &["show"])["pid"].as_u64().unwrap()
}

/// Whether `pid` runs (not gone, not a zombie).
pub fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Network namespaces and links made for one test, deleted on drop (also when the test
/// fails). Names carry the test process's pid so that tests never share them.
#[derive(Debug, Default)]
pub struct Net {
    namespaces: Vec<String>,
    links: Vec<String>,
}

impl Net {
    pub fn new() -> Net {
        Net::default()
    }

    /// A name unique to this test process: `fv{tag}{pid}`, at most 15 bytes for a tag of
    /// up to 6 bytes.
    pub fn name(tag: &str) -> String {
        format!("fv{tag}{}", std::process::id() % 10_000_000)
    }

    /// Runs `ip ARGS`, panicking with its error output on failure.
    pub fn ip(args: &[&str]) {
        let o = Command::new("ip").args(args).output().unwrap();
        assert!(
            o.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Creates network namespace `name` (with its loopback up).
    pub fn netns(&mut self, name: &str) {
        Net::ip(&["netns", "add", name]);
        self.namespaces.push(name.into());
        Net::ip(&["-n", name, "link", "set", "lo", "up"]);
    }

    /// Creates a veth pair `a`/`b`; `b` goes into namespace `ns` with `addr` (CIDR), up.
    pub fn veth_into(&mut self, a: &str, b: &str, ns: &str, addr: &str) {
        Net::ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
        self.links.push(a.into());
        Net::ip(&["link", "set", b, "netns", ns]);
        Net::ip(&["-n", ns, "addr", "add", addr, "dev", b]);
        Net::ip(&["-n", ns, "link", "set", b, "up"]);
    }

    /// Moves link `dev` (a TAP ferrovs created) into `ns` with `addr`, up.
    pub fn move_into(&mut self, dev: &str, ns: &str, addr: &str) {
        self.links.push(dev.into());
        Net::ip(&["link", "set", dev, "netns", ns]);
        Net::ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
        Net::ip(&["-n", ns, "link", "set", dev, "up"]);
    }

    /// Adds TAP port `port` named `tap` to `bridge` of the switch whose run directory is
    /// `run_dir`, and moves the TAP into `ns` with `addr` (CIDR), up.
    pub fn tap_port(
        &mut self,
        run_dir: &Path,
        bridge: &str,
        port: &str,
        tap: &str,
        ns: &str,
        addr: &str,
    ) {
        self.track_link(tap);
        let o = cli(
            run_dir,
            &["add-port", bridge, port, "type=tap", &format!("dev={tap}")],
        );
        assert!(
            o.status.success(),
            "add-port {port}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.move_into(tap, ns, addr);
    }

    /// Turns IPv6 off on `dev` in `ns`: no router solicitations or DAD among a test's
    /// packets (they would be packet-ins, or pass a meter).
    pub fn no_ipv6(ns: &str, dev: &str) {
        let _ = Net::exec(
            ns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{dev}.disable_ipv6=1"),
            ],
        );
    }

    /// Forgets nothing: also deletes `dev` at the end if it is still in this namespace.
    pub fn track_link(&mut self, dev: &str) {
        self.links.push(dev.into());
    }

    /// Runs a command inside namespace `ns`.
    pub fn exec(ns: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .output()
            .unwrap()
    }

    /// A counter of `dev` in `ns` from sysfs (e.g. `rx_packets`).
    pub fn counter(ns: &str, dev: &str, what: &str) -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/{what}");
        let o = Net::exec(ns, &["cat", &path]);
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{path} in {ns}: {}", String::from_utf8_lossy(&o.stderr)))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the virtual links in it; links left in ours go too.
        for ns in self.namespaces.drain(..).rev() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
        for l in self.links.drain(..).rev() {
            let _ = Command::new("ip").args(["link", "del", &l]).output();
        }
    }
}

/// Frames of a pcap file (the classic format tcpdump writes): (original length, bytes).
pub fn pcap_frames(path: &Path) -> Vec<(usize, Vec<u8>)> {
    let b = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    if b.len() < 24 {
        return out;
    }
    let u32le = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(u32le(0), 0xa1b2c3d4, "a little-endian pcap");
    let mut at = 24;
    while at + 16 <= b.len() {
        let (incl, orig) = (u32le(at + 8), u32le(at + 12));
        if at + 16 + incl > b.len() {
            break;
        }
        out.push((orig, b[at + 16..at + 16 + incl].to_vec()));
        at += 16 + incl;
    }
    out
}

/// `ovs-ofctl -O OpenFlow13 CMD unix:SOCK ARGS` (options among `args`, `--strict` and the
/// like, go before the command): (success, stdout, stderr).
pub fn ofctl(sock: &Path, cmd: &str, args: &[&str]) -> (bool, String, String) {
    let mut c = std::process::Command::new("ovs-ofctl");
    c.args(["-O", "OpenFlow13", "--timeout=10"]);
    let (flags, rest): (Vec<&str>, Vec<&str>) = args.iter().partition(|a| a.starts_with("--"));
    c.args(&flags)
        .arg(cmd)
        .arg(format!("unix:{}", sock.display()))
        .args(&rest);
    let o = c.output().expect("ovs-ofctl runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// [`ofctl`] that must succeed; its stdout.
pub fn ofctl_ok(sock: &Path, cmd: &str, args: &[&str]) -> String {
    let (ok, out, err) = ofctl(sock, cmd, args);
    assert!(ok, "ovs-ofctl {cmd} {args:?} on {}: {err}", sock.display());
    out
}

/// `ping -c COUNT` (50 ms apart, 1 s deadline each) from namespace `ns` to `to`: how many
/// replies came back.
pub fn ping(ns: &str, to: &str, count: u32) -> u64 {
    let c = count.to_string();
    let o = Net::exec(ns, &["ping", "-c", &c, "-i", "0.05", "-W", "1", to]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {out}"));
    line.split(", ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `ferrovs add-port br0 NAME type=vhost-user path=DIR/NAME.sock`; waits for the socket and
/// returns its path.
pub fn add_vhost_user_port(dir: &Path, name: &str) -> String {
    let sock = dir.join(format!("{name}.sock")).display().to_string();
    let o = cli(
        dir,
        &[
            "add-port",
            "br0",
            name,
            "type=vhost-user",
            &format!("path={sock}"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until("port socket", 10, || Path::new(&sock).exists());
    sock
}

/// Port `name`'s stats from a `port-stats` array.
pub fn port_stats_of<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == name)
        .unwrap_or_else(|| panic!("no port {name}: {stats}"))
}
