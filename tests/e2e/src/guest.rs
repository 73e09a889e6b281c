//! Real QEMU guests for the tests: the guest image (`tests/e2e/guest`), how a guest is
//! started (TCG, 256 MiB and two pages of shared memfd RAM, a virtio-net NIC), its serial
//! console, its QMP monitor, and live migration between two QEMUs on this host.
//!
//! QEMU facts these helpers encode: `-accel tcg` (no usable KVM here); guest RAM is
//! `memory-backend-memfd,share=on` (vhost-user needs shared memory, and postcopy on shared
//! memory needs the memfd); `vectors=0` on the NIC (QEMU 7.2 under TCG crashes when a guest
//! enables MSI-X on a vhost-user NIC); RAM two pages over 256 MiB ([`GUEST_RAM`]: QEMU 7.2's
//! TCG loses guest stores during a migration when RAM is a multiple of 256 KiB). A migration
//! destination is the same command line plus `-incoming URI` (and `-S` to keep it paused
//! after the migration).
//!
//! The ring layout: `FERROVS_GUEST_RING=packed` runs every guest with `packed=on` on its
//! NIC and every switch [`crate::start_switch`] starts with `vhost-packed-rings=true`, so the
//! same guest tests run a second time on packed virtqueues (scripts/test.sh does);
//! [`assert_ring`] checks that the switch and the guest's driver both negotiated the layout
//! the run asked for. Unset or `split`: split rings, as QEMU and the switch default to.

use std::hash::Hasher;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::{have, repo, require, Proc};

/// Guest RAM (the memfd backend's size, and what `pmemsave` covers): 256 MiB and two pages
/// (QEMU rounds `-m` up to 8 KiB).
///
/// The odd pages work around a QEMU 7.2 bug under TCG (fixed upstream in 9.0 by "physmem:
/// Fix migration dirty bitmap coherency with TCG memory access"; Debian 12's 7.2 lacks it).
/// When a RAM block is a whole number of 64-page bitmap words, each migration pass clears
/// its dirty bits word by word and does not reset the vCPU's TLB; a page the guest had
/// already written keeps a TLB entry that no longer traps, so its next stores are never
/// logged and never sent. After a precopy migration the destination then holds a few pages
/// of stale guest-kernel data (counters one behind, older timestamps): seen here as 7-22
/// differing pages in about one run in seven. Any other size takes QEMU's page-by-page path,
/// which resets the TLB. The switch's own writes are logged through vhost-user and are not
/// affected; with KVM (production) the kernel tracks guest stores.
pub const GUEST_RAM: u64 = (256 << 20) + 8192;

/// Whether real guests can run here: QEMU, busybox and a Debian kernel in /boot (the guest
/// image is built from them). Outside CI a test skips with what is missing; in CI that is a
/// failure.
pub fn guests_available() -> bool {
    require(
        have("qemu-system-x86_64"),
        "qemu-system-x86_64 (scripts/deps.sh installs it)",
    ) && require(have("busybox"), "busybox-static")
        && require(
            std::fs::read_dir("/boot").is_ok_and(|mut d| {
                d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")))
            }),
            "a Debian kernel in /boot (linux-image-amd64)",
        )
}

/// Builds (or reuses) the guest kernel + initramfs; returns their directory.
pub fn guest_image() -> PathBuf {
    let out = repo().join("target/guest");
    let st = Command::new("bash")
        .arg(repo().join("tests/e2e/guest/build-initramfs.sh"))
        .arg(&out)
        .status()
        .expect("run build-initramfs.sh");
    assert!(st.success(), "guest image build failed");
    out
}

/// The full path of a command on PATH (empty if there is none).
pub fn which(cmd: &str) -> PathBuf {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// The virtqueue layout of the guests' NICs (`FERROVS_GUEST_RING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    Split,
    /// `packed=on` on the NIC (VIRTIO_F_RING_PACKED, bit 34), the switch offering it.
    Packed,
}

/// The ring layout this run's guests use: `FERROVS_GUEST_RING` = `split` (or unset) or
/// `packed`; anything else is a mistake in the command line and panics.
pub fn guest_ring() -> Ring {
    match std::env::var("FERROVS_GUEST_RING").as_deref() {
        Err(_) | Ok("") | Ok("split") => Ring::Split,
        Ok("packed") => Ring::Packed,
        Ok(other) => panic!("FERROVS_GUEST_RING={other}: expected split or packed"),
    }
}

/// VIRTIO_F_RING_PACKED.
pub const RING_PACKED_BIT: usize = 34;

/// Asserts that switch port `port` and the driver of guest `guest` (its `FERROVS-NIC` line,
/// waited for up to `secs`) negotiated the layout of [`guest_ring`]: `ring_packed` among the
/// port's features in `ferrovs show` and bit 34 of `/sys/class/net/eth0/device/features` in
/// the guest, both or neither. Returns the layout's name for the test's log.
pub fn assert_ring(dir: &Path, port: &str, guest: &str, secs: u64) -> &'static str {
    assert_guest_ring(dir, guest, secs);
    assert_port_ring(dir, port)
}

/// The guest half of [`assert_ring`] (a guest on no switch port, or whose console no longer
/// shows its driver's probe: a migration destination).
pub fn assert_guest_ring(dir: &Path, guest: &str, secs: u64) -> &'static str {
    wait_console(dir, guest, &["FERROVS-NIC "], secs);
    let bits = nic_features(&console(dir, guest)).expect("FERROVS-NIC line");
    let packed = bits.as_bytes().get(RING_PACKED_BIT) == Some(&b'1');
    assert_eq!(
        packed,
        guest_ring() == Ring::Packed,
        "{:?} rings asked for; guest {guest} negotiated features {bits}",
        guest_ring()
    );
    ring_name()
}

/// The switch half of [`assert_ring`]: `ring_packed` among port `port`'s features in
/// `ferrovs show` exactly when the run is on packed rings.
pub fn assert_port_ring(dir: &Path, port: &str) -> &'static str {
    let show = crate::cli_json(dir, &["show"]);
    let features: Vec<String> = show["bridges"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|b| b["ports"].as_array().into_iter().flatten())
        .filter(|p| p["name"] == port)
        .flat_map(|p| p["features"].as_array().into_iter().flatten())
        .filter_map(|f| f.as_str().map(String::from))
        .collect();
    assert!(!features.is_empty(), "port {port}: no features in {show}");
    assert_eq!(
        features.iter().any(|f| f == "ring_packed"),
        guest_ring() == Ring::Packed,
        "{:?} rings asked for; port {port} features {features:?}",
        guest_ring()
    );
    ring_name()
}

fn ring_name() -> &'static str {
    match guest_ring() {
        Ring::Split => "split",
        Ring::Packed => "packed",
    }
}

/// The guest's NIC.
#[derive(Debug, Clone)]
pub enum Nic {
    /// virtio-net on `-netdev vhost-user`; the `-chardev socket,...` spec, with id c0.
    VhostUser(String),
    /// virtio-net on QEMU's own user-mode network (`-netdev user`): no switch involved.
    User,
    /// No NIC at all.
    None,
}

/// How a test guest is started.
#[derive(Debug, Clone)]
pub struct Guest {
    /// Names the files of this QEMU in the run dir: `NAME.console`, `NAME.qmp`, `NAME.out`.
    pub name: String,
    pub nic: Nic,
    pub mac: String,
    /// Kernel command line after `console=ttyS0 quiet` (build-initramfs.sh's `ferrovs.*`).
    pub append: String,
    pub smp: u32,
    /// Queue pairs of the NIC (`mq=on` when more than one).
    pub queues: u32,
    /// A guest reboot resets the machine (else QEMU exits, `-no-reboot`).
    pub reboot: bool,
    /// The serial console is also a socket `NAME.serial` that `console_command` writes to
    /// (the log still goes to `NAME.console`).
    pub control: bool,
    /// `guest_announce=off` on the NIC when false: the guest is not offered
    /// VIRTIO_NET_F_GUEST_ANNOUNCE, and after a migration QEMU asks the vhost-user backend to
    /// announce it (SEND_RARP) instead.
    pub guest_announce: bool,
    /// A QMP monitor at `NAME.qmp` (connect with [`Qmp::connect`]).
    pub qmp: bool,
    /// `-incoming URI` (`unix:PATH` or `tcp:127.0.0.1:PORT`): a migration destination.
    pub incoming: Option<String>,
    /// `-S`: the vCPUs do not start (a destination then stays paused after the migration
    /// until `cont`).
    pub paused: bool,
    /// The NIC's virtqueue layout (`packed=on` when packed); [`guest_ring`] by default.
    pub ring: Ring,
}

impl Guest {
    /// A guest whose NIC is on vhost-user `chardev` (a `-chardev socket,...` spec with id c0).
    pub fn new(name: &str, chardev: &str, mac: &str, append: &str) -> Guest {
        Guest {
            name: name.into(),
            nic: Nic::VhostUser(chardev.into()),
            mac: mac.into(),
            append: append.into(),
            smp: 1,
            queues: 1,
            reboot: false,
            control: false,
            guest_announce: true,
            qmp: false,
            incoming: None,
            paused: false,
            ring: guest_ring(),
        }
    }

    /// The migration destination of this guest: the same machine, named `name`, its NIC (if
    /// vhost-user) on `chardev`, waiting for the migration stream at `incoming`.
    pub fn destination(&self, name: &str, chardev: Option<&str>, incoming: &str) -> Guest {
        let mut d = self.clone();
        d.name = name.into();
        if let (Nic::VhostUser(c), Some(new)) = (&mut d.nic, chardev) {
            *c = new.into();
        }
        d.incoming = Some(incoming.into());
        d.qmp = true;
        d
    }

    /// QEMU's arguments for this guest, files under `dir`, image `img`.
    pub fn args(&self, dir: &Path, img: &Path) -> Vec<String> {
        let file = |ext: &str| {
            dir.join(format!("{}.{ext}", self.name))
                .display()
                .to_string()
        };
        let console = file("console");
        let mut a: Vec<String> = [
            "-accel",
            "tcg",
            "-m",
            &format!("{}k", GUEST_RAM >> 10),
            "-smp",
            &self.smp.to_string(),
            "-nographic",
            "-nodefaults",
        ]
        .map(String::from)
        .into();
        if !self.reboot {
            a.push("-no-reboot".into());
        }
        if self.control {
            let serial = file("serial");
            a.extend([
                "-chardev".into(),
                format!("socket,id=con,path={serial},server=on,wait=off,logfile={console}"),
                "-serial".into(),
                "chardev:con".into(),
            ]);
        } else {
            a.extend(["-serial".into(), format!("file:{console}")]);
        }
        a.extend([
            "-kernel".into(),
            img.join("vmlinuz").display().to_string(),
            "-initrd".into(),
            img.join("initramfs.gz").display().to_string(),
            "-append".into(),
            format!("console=ttyS0 quiet {}", self.append),
            "-object".into(),
            format!("memory-backend-memfd,id=mem,size={GUEST_RAM},share=on"),
            "-numa".into(),
            "node,memdev=mem".into(),
        ]);
        // vectors=0: QEMU 7.2 under TCG crashes when a guest enables MSI-X on vhost-user.
        let mut device = format!("virtio-net-pci,netdev=n0,mac={},vectors=0", self.mac);
        if !self.guest_announce {
            device.push_str(",guest_announce=off");
        }
        if self.ring == Ring::Packed {
            device.push_str(",packed=on");
        }
        match &self.nic {
            Nic::VhostUser(chardev) => {
                if self.queues > 1 {
                    device.push_str(",mq=on");
                }
                a.extend([
                    "-chardev".into(),
                    chardev.clone(),
                    "-netdev".into(),
                    format!("vhost-user,id=n0,chardev=c0,queues={}", self.queues),
                    "-device".into(),
                    device,
                ]);
            }
            Nic::User => a.extend([
                "-netdev".into(),
                "user,id=n0".into(),
                "-device".into(),
                device,
            ]),
            Nic::None => {}
        }
        if self.qmp {
            a.extend([
                "-qmp".into(),
                format!("unix:{},server=on,wait=off", file("qmp")),
            ]);
        }
        if let Some(uri) = &self.incoming {
            a.extend(["-incoming".into(), uri.clone()]);
        }
        if self.paused {
            a.push("-S".into());
        }
        a
    }

    /// Starts this QEMU in its own session.
    pub fn start(&self, dir: &Path, img: &Path) -> Proc {
        let args = self.args(dir, img);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Proc::spawn(&self.name, dir, &which("qemu-system-x86_64"), &args)
    }

    /// Connects to this guest's QMP monitor (it must have been started with `qmp`).
    pub fn qmp(&self, dir: &Path) -> Qmp {
        Qmp::connect(
            &dir.join(format!("{}.qmp", self.name)),
            Duration::from_secs(20),
        )
    }
}

/// Starts a QEMU guest whose NIC uses `chardev` (a `-chardev socket,...` spec with id c0).
pub fn start_guest(
    dir: &Path,
    img: &Path,
    name: &str,
    chardev: &str,
    mac: &str,
    append: &str,
) -> Proc {
    Guest::new(name, chardev, mac, append).start(dir, img)
}

/// Types `cmd` on the serial console of a guest started with `control` (its /init reads
/// commands there: build-initramfs.sh, `ferrovs.control=1`).
pub fn console_command(dir: &Path, name: &str, cmd: &str) {
    let path = dir.join(format!("{name}.serial"));
    let mut s = UnixStream::connect(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    s.write_all(format!("{cmd}\n").as_bytes()).unwrap();
    // Give QEMU time to read the line before the connection closes.
    std::thread::sleep(Duration::from_millis(500));
}

/// The console text of guest `name` (lossy UTF-8; empty before it exists).
pub fn console(dir: &Path, name: &str) -> String {
    String::from_utf8_lossy(&std::fs::read(dir.join(format!("{name}.console"))).unwrap_or_default())
        .into_owned()
}

/// Waits up to `secs` for any of `any_of` on the console of `name`; returns the one seen.
pub fn wait_console(dir: &Path, name: &str, any_of: &[&str], secs: u64) -> String {
    let t = Instant::now();
    loop {
        let text = console(dir, name);
        if let Some(m) = any_of.iter().find(|m| text.contains(**m)) {
            return m.to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "{name}: none of {any_of:?} within {secs}s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `TAG {json}` lines of a piece of console text, in order.
pub fn tagged(text: &str, tag: &str) -> Vec<Value> {
    let tag = format!("{tag} ");
    text.lines()
        .filter_map(|l| l.split_once(tag.as_str()).map(|(_, j)| j.trim()))
        .filter_map(|j| serde_json::from_str(j).ok())
        .collect()
}

/// `FERROVS-RESULT {json}` lines of a guest's console, in order.
pub fn results(dir: &Path, name: &str) -> Vec<Value> {
    tagged(&console(dir, name), "FERROVS-RESULT")
}

/// `FERROVS-PROGRESS {json}` lines of a piece of console text, in order.
pub fn progress(text: &str) -> Vec<Value> {
    tagged(text, "FERROVS-PROGRESS")
}

/// The virtio feature bits the guest's driver negotiated (`FERROVS-NIC ... features=`, a
/// string of '0'/'1' by bit number), from its first NIC line.
pub fn nic_features(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.split_once("FERROVS-NIC ")?.1.split_once("features="))
        .map(|(_, f)| f.trim().to_string())
}

/// Drop reasons that mean a guest handed the switch something broken (never expected from a
/// guest that resets its device properly).
pub const GUEST_ERRORS: &[&str] = &[
    "bad_desc_index",
    "desc_chain_loop",
    "bad_indirect_desc",
    "desc_out_of_guest_memory",
    "desc_wrong_direction",
    "bad_avail_idx",
    "queue_broken",
];

/// A QMP client (QEMU's JSON monitor) on a unix socket: one command at a time, its reply
/// read while the asynchronous events that come before it are kept (with their times).
#[derive(Debug)]
pub struct Qmp {
    stream: UnixStream,
    buf: Vec<u8>,
    /// QEMU closed the monitor (it exited).
    closed: bool,
    /// Events received so far, oldest first (`{"event", "data", "timestamp"}`).
    pub events: Vec<Value>,
}

/// An error reply of QMP, or no reply at all.
#[derive(Debug, Clone)]
pub struct QmpError(pub String);

impl std::fmt::Display for QmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Qmp {
    /// Connects (retrying while QEMU starts, up to `timeout`), reads the greeting and enters
    /// command mode (`qmp_capabilities`).
    pub fn connect(path: &Path, timeout: Duration) -> Qmp {
        let t = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(t.elapsed() < timeout, "QMP {}: {e}", path.display());
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let mut q = Qmp {
            stream,
            buf: Vec::new(),
            closed: false,
            events: Vec::new(),
        };
        let greeting = q
            .message(Instant::now() + timeout)
            .unwrap_or_else(|| panic!("QMP {}: no greeting", path.display()));
        assert!(greeting.get("QMP").is_some(), "QMP greeting: {greeting}");
        q.run("qmp_capabilities", json!({}));
        q
    }

    /// The next message, or None at `deadline` or once QEMU has closed the monitor.
    fn message(&mut self, deadline: Instant) -> Option<Value> {
        loop {
            if let Some(n) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=n).collect();
                match serde_json::from_slice(&line) {
                    Ok(v) => return Some(v),
                    Err(e) => panic!("QMP: bad message {:?}: {e}", String::from_utf8_lossy(&line)),
                }
            }
            if self.closed {
                return None;
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.closed = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("QMP: {e}"),
            }
        }
    }

    /// Executes `cmd` with `args` (a JSON object); returns its `return` value or its error.
    /// Events that arrive first are kept in `events`.
    pub fn execute(&mut self, cmd: &str, args: Value) -> Result<Value, QmpError> {
        let mut req = json!({ "execute": cmd });
        if args.as_object().is_some_and(|o| !o.is_empty()) {
            req["arguments"] = args;
        }
        let mut line = req.to_string();
        line.push('\n');
        if let Err(e) = self.stream.write_all(line.as_bytes()) {
            self.closed = true;
            return Err(QmpError(format!("{cmd}: {e}")));
        }
        // pmemsave of the whole RAM takes the longest (a second or two).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let m = self.message(deadline).ok_or_else(|| {
                QmpError(if self.closed {
                    format!("{cmd}: QEMU closed the monitor")
                } else {
                    format!("{cmd}: no reply within 120 s")
                })
            })?;
            if m.get("event").is_some() {
                self.events.push(m);
            } else if let Some(r) = m.get("return") {
                return Ok(r.clone());
            } else if let Some(e) = m.get("error") {
                return Err(QmpError(format!("{cmd}: {} ({})", e["desc"], e["class"])));
            }
        }
    }

    /// `execute`, panicking on an error.
    pub fn run(&mut self, cmd: &str, args: Value) -> Value {
        self.execute(cmd, args)
            .unwrap_or_else(|e| panic!("QMP {e}"))
    }

    /// Waits up to `timeout` for event `name` (one already received counts); returns it.
    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.events.iter().find(|e| e["event"] == name) {
                return Some(e.clone());
            }
            let m = self.message(deadline)?;
            if m.get("event").is_some() {
                self.events.push(m);
            }
        }
    }

    /// The time (seconds since the epoch, host clock) of the last event `name` received.
    pub fn event_time(&self, name: &str) -> Option<f64> {
        self.events
            .iter()
            .rfind(|e| e["event"] == name)
            .map(timestamp)
    }

    /// The run state (`query-status`): "running", "paused", "postmigrate", "inmigrate"...
    pub fn status(&mut self) -> String {
        self.run("query-status", json!({}))["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// An event's time: seconds since the epoch (QEMU stamps events with the host's clock, so
/// times of two QEMUs on one host compare).
pub fn timestamp(event: &Value) -> f64 {
    let t = &event["timestamp"];
    t["seconds"].as_f64().unwrap_or(0.0) + t["microseconds"].as_f64().unwrap_or(0.0) / 1e6
}

/// Now, as seconds since the epoch (to set beside event times).
pub fn now_epoch() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How to migrate.
#[derive(Debug, Clone)]
pub struct MigrateOpts {
    /// Where the destination listens (its `-incoming`).
    pub uri: String,
    /// Postcopy: `postcopy-ram` on both sides, `migrate-start-postcopy` once the migration
    /// has run `postcopy_after` (zero: at once; QEMU then switches over at its next
    /// iteration, with (nearly) every page still on the source).
    pub postcopy: bool,
    pub postcopy_after: Duration,
    /// Bytes per second, in both phases (QMP `max-bandwidth` and `max-postcopy-bandwidth`:
    /// QEMU's postcopy phase is otherwise unlimited).
    pub max_bandwidth: u64,
    /// The longest stop precopy may plan for, in ms (QMP `downtime-limit`).
    pub downtime_limit_ms: u64,
    /// A migration not completed by then is cancelled (`migrate_cancel`): it did not
    /// converge.
    pub timeout: Duration,
}

impl MigrateOpts {
    pub fn new(uri: &str, postcopy: bool) -> MigrateOpts {
        MigrateOpts {
            uri: uri.into(),
            postcopy,
            postcopy_after: Duration::ZERO,
            max_bandwidth: 1 << 30,
            downtime_limit_ms: 300,
            timeout: Duration::from_secs(120),
        }
    }
}

/// What a migration did.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The source's final status: "completed", "failed", "cancelled", or "timeout" (did not
    /// complete in time and was cancelled).
    pub status: String,
    /// The source's last `query-migrate` (total-time, downtime, setup-time, ram...); on a
    /// timeout, the last one before the cancel (expected-downtime, ram remaining...).
    pub info: Value,
    /// The source's statuses in the order seen ("setup", "active", "postcopy-active"...).
    pub statuses: Vec<String>,
    /// When the source stopped its vCPUs (its STOP event) and the destination started them
    /// (RESUME; none while a destination started with `-S` stays paused), seconds since the
    /// epoch. RESUME - STOP is the downtime as the guest lives it (QEMU 7.2's own `downtime`
    /// is not reliable in postcopy).
    pub source_stop: Option<f64>,
    pub dest_resume: Option<f64>,
    /// The destination's incoming status when it ended.
    pub dest_status: String,
    /// The highest `dirty-pages-rate` (pages/s dirtied in the guest, by the guest and by
    /// the switch's logged writes) QEMU reported while it ran.
    pub dirty_pages_rate_max: u64,
}

impl Migration {
    /// RESUME on the destination - STOP on the source, in ms.
    pub fn stopped_ms(&self) -> Option<f64> {
        Some((self.dest_resume? - self.source_stop?) * 1e3)
    }

    /// A JSON summary (for test logs and the bench).
    pub fn summary(&self) -> Value {
        let ram = &self.info["ram"];
        json!({
            "status": self.status,
            "statuses": self.statuses,
            "total_time_ms": self.info["total-time"],
            "downtime_ms": self.info["downtime"],
            "setup_time_ms": self.info["setup-time"],
            "ram_transferred": ram["transferred"],
            "ram_remaining": ram["remaining"],
            "dirty_sync_count": ram["dirty-sync-count"],
            "dirty_pages_rate_max": self.dirty_pages_rate_max,
            "expected_downtime_ms": self.info["expected-downtime"],
            "postcopy_requests": ram["postcopy-requests"],
            "stop_to_resume_ms": self.stopped_ms().map(|v| (v * 10.0).round() / 10.0),
            "source_stop_epoch": self.source_stop,
            "dest_resume_epoch": self.dest_resume,
            "dest_status": self.dest_status,
        })
    }
}

/// Migrates the guest behind `src` to the destination QEMU behind `dst` (started with
/// `-incoming o.uri`). Sets the capabilities on both sides and the parameters on the source
/// explicitly, starts the migration, switches to postcopy if asked, and waits for a final
/// status, cancelling at `o.timeout`. Returns whatever happened; never panics on a failed
/// migration (the caller asserts).
pub fn migrate(src: &mut Qmp, dst: &mut Qmp, o: &MigrateOpts) -> Migration {
    let caps = json!({ "capabilities": [{ "capability": "postcopy-ram", "state": o.postcopy }] });
    src.run("migrate-set-capabilities", caps.clone());
    dst.run("migrate-set-capabilities", caps);
    src.run(
        "migrate-set-parameters",
        json!({
            "max-bandwidth": o.max_bandwidth,
            "max-postcopy-bandwidth": o.max_bandwidth,
            "downtime-limit": o.downtime_limit_ms,
        }),
    );
    let start = Instant::now();
    src.run("migrate", json!({ "uri": o.uri }));
    let mut statuses: Vec<String> = Vec::new();
    let mut postcopy_started = false;
    let mut rate_max = 0;
    let mut info;
    let status = loop {
        info = src.run("query-migrate", json!({}));
        let s = info["status"].as_str().unwrap_or("none").to_string();
        rate_max = rate_max.max(info["ram"]["dirty-pages-rate"].as_u64().unwrap_or(0));
        if statuses.last() != Some(&s) {
            statuses.push(s.clone());
        }
        match s.as_str() {
            "completed" | "failed" | "cancelled" => break s,
            "setup" | "active"
                if o.postcopy && !postcopy_started && start.elapsed() >= o.postcopy_after =>
            {
                src.run("migrate-start-postcopy", json!({}));
                postcopy_started = true;
            }
            _ => {}
        }
        if start.elapsed() >= o.timeout && !s.starts_with("postcopy") {
            // Precopy that did not converge (postcopy cannot be cancelled: it always ends).
            // What it had done is `info` as it stands (the destination QEMU exits once the
            // migration is cancelled).
            let _ = src.execute("migrate_cancel", json!({}));
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                let i = src.run("query-migrate", json!({}));
                if matches!(i["status"].as_str(), Some("cancelled" | "failed")) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            break "timeout".to_string();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The destination finishes loading after the source's last byte: wait for its verdict.
    let mut dest_status = String::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        dest_status = match dst.execute("query-migrate", json!({})) {
            Ok(v) => v["status"].as_str().unwrap_or("none").to_string(),
            Err(e) => e.0,
        };
        if status != "completed" || matches!(dest_status.as_str(), "completed" | "failed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let running = dst
        .execute("query-status", json!({}))
        .is_ok_and(|s| s["status"] == "running");
    let dest_resume = if status == "completed" && running {
        dst.wait_event("RESUME", Duration::from_secs(5))
            .map(|e| timestamp(&e))
    } else {
        None
    };
    Migration {
        status,
        source_stop: src.event_time("STOP"),
        info,
        statuses,
        dest_resume,
        dest_status,
        dirty_pages_rate_max: rate_max,
    }
}

/// Two copies of guest RAM (`pmemsave` files) compared page by page.
#[derive(Debug, Clone)]
pub struct RamComparison {
    pub pages: u64,
    /// Pages (4 KiB) whose contents differ, and the guest-physical addresses of the first 16.
    pub differing: u64,
    pub first_differing: Vec<u64>,
    /// For each of those pages: the first and last differing byte and how many differ.
    pub spans: Vec<(usize, usize, usize)>,
    /// A 64-bit digest of each file (SipHash of its bytes).
    pub digest_a: u64,
    pub digest_b: u64,
}

/// Saves guest-physical memory 0..GUEST_RAM of the guest behind `q` to `path` (`pmemsave`;
/// the VM should be stopped).
pub fn save_ram(q: &mut Qmp, path: &Path) {
    q.run(
        "pmemsave",
        json!({ "val": 0, "size": GUEST_RAM, "filename": path.display().to_string() }),
    );
}

/// Compares two RAM images page by page.
pub fn compare_ram(a: &Path, b: &Path) -> RamComparison {
    const PAGE: usize = 4096;
    let open = |p: &Path| {
        BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        )
    };
    let (mut ra, mut rb) = (open(a), open(b));
    let (mut ha, mut hb) = (
        std::collections::hash_map::DefaultHasher::new(),
        std::collections::hash_map::DefaultHasher::new(),
    );
    let (mut pa, mut pb) = ([0u8; PAGE], [0u8; PAGE]);
    let mut c = RamComparison {
        pages: 0,
        differing: 0,
        first_differing: Vec::new(),
        spans: Vec::new(),
        digest_a: 0,
        digest_b: 0,
    };
    loop {
        let na = read_page(&mut ra, &mut pa);
        let nb = read_page(&mut rb, &mut pb);
        if na == 0 && nb == 0 {
            break;
        }
        ha.write(&pa[..na]);
        hb.write(&pb[..nb]);
        if pa[..na] != pb[..nb] {
            if c.first_differing.len() < 16 {
                c.first_differing.push(c.pages * PAGE as u64);
                let diff: Vec<usize> = (0..na.min(nb)).filter(|&i| pa[i] != pb[i]).collect();
                c.spans.push((
                    diff.first().copied().unwrap_or(0),
                    diff.last().copied().unwrap_or(0),
                    diff.len(),
                ));
            }
            c.differing += 1;
        }
        c.pages += 1;
    }
    c.digest_a = ha.finish();
    c.digest_b = hb.finish();
    c
}

/// Reads up to a page (less only at the end of the file); returns the bytes read.
fn read_page(r: &mut impl BufRead, page: &mut [u8]) -> usize {
    let mut n = 0;
    while n < page.len() {
        match r.read(&mut page[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reading a RAM image: {e}"),
        }
    }
    n
}
