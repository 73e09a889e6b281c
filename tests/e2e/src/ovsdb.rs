//! A real `ovsdb-server` with the stock `vswitch.ovsschema` for one test, and `ovs-vsctl`
//! against it: what operators and their tools (libvirt, OpenStack, OVN) run in front of
//! ovs-vswitchd, here in front of `ferrovsd --ovsdb`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{bin, have, is_root, start_switch, wait_until, Net, Proc};

/// The schema Debian's openvswitch-common ships.
pub const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// Whether ovsdb-server, ovsdb-tool, ovs-vsctl and the schema are installed.
pub fn available() -> bool {
    have("ovsdb-server") && have("ovsdb-tool") && have("ovs-vsctl") && Path::new(SCHEMA).exists()
}

/// An `ovsdb-server` serving a fresh `Open_vSwitch` database in `dir` on a unix socket,
/// killed on drop. Stopping and starting it again keeps the database file.
#[derive(Debug)]
pub struct OvsdbServer {
    pub dir: PathBuf,
    pub db: PathBuf,
    pub sock: PathBuf,
    proc: Option<Proc>,
}

impl OvsdbServer {
    /// Creates the database (`ovsdb-tool create`), starts the server and initialises the
    /// root row (`ovs-vsctl --no-wait init`).
    pub fn start(dir: &Path) -> OvsdbServer {
        let db = dir.join("conf.db");
        let _ = std::fs::remove_file(&db);
        let o = Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg(SCHEMA)
            .output()
            .expect("ovsdb-tool runs");
        assert!(
            o.status.success(),
            "ovsdb-tool create: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut s = OvsdbServer {
            dir: dir.to_path_buf(),
            db,
            sock: dir.join("db.sock"),
            proc: None,
        };
        s.run();
        s.vsctl_no_wait(&["init"]).expect("ovs-vsctl init");
        s
    }

    /// Starts the server process on the existing database; waits for its socket.
    pub fn run(&mut self) {
        assert!(self.proc.is_none(), "ovsdb-server already runs");
        let _ = std::fs::remove_file(&self.sock);
        let arg = |k: &str, p: &Path| format!("--{k}={}", p.display());
        let args = [
            self.db.display().to_string(),
            format!("--remote=punix:{}", self.sock.display()),
            arg("pidfile", &self.dir.join("ovsdb-server.pid")),
            arg("unixctl", &self.dir.join("ovsdb-server.ctl")),
            arg("log-file", &self.dir.join("ovsdb-server.log")),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.proc = Some(Proc::spawn(
            "ovsdb-server",
            &self.dir,
            Path::new("/usr/sbin/ovsdb-server"),
            &args,
        ));
        let sock = self.sock.clone();
        wait_until("ovsdb-server socket", 10, || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
    }

    /// Kills the server (SIGKILL: as a crash); the database file stays.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Makes the server also listen on TCP (localhost, a free port); returns `tcp:IP:PORT`.
    pub fn add_tcp_remote(&self) -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let o = Command::new("ovs-appctl")
            .arg("-t")
            .arg(self.dir.join("ovsdb-server.ctl"))
            .arg("ovsdb-server/add-remote")
            .arg(format!("ptcp:{port}:127.0.0.1"))
            .output()
            .expect("ovs-appctl runs");
        assert!(
            o.status.success(),
            "ovsdb-server/add-remote: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let addr = format!("127.0.0.1:{port}");
        wait_until("ovsdb-server TCP remote", 10, || {
            std::net::TcpStream::connect(&addr).is_ok()
        });
        format!("tcp:{addr}")
    }

    /// `unix:SOCK`, as `ferrovsd --ovsdb` and `ovs-vsctl --db` take it.
    pub fn remote(&self) -> String {
        format!("unix:{}", self.sock.display())
    }

    /// Runs `ovs-vsctl --db=unix:SOCK --timeout=20 ARGS` (so a test never hangs); stdout, or
    /// stderr with the exit status.
    pub fn vsctl(&self, args: &[&str]) -> Result<String, String> {
        self.vsctl_with(&["--timeout=20"], args)
    }

    /// `ovs-vsctl add-port BRIDGE NAME -- set Interface NAME SETTINGS...` (waits for the
    /// switch, as `vsctl`).
    pub fn add_port(&self, bridge: &str, name: &str, settings: &[&str]) -> Result<String, String> {
        let mut a = vec!["add-port", bridge, name, "--", "set", "Interface", name];
        a.extend_from_slice(settings);
        self.vsctl(&a)
    }

    /// `ovs-vsctl --no-wait`: does not wait for the switch to apply the change.
    pub fn vsctl_no_wait(&self, args: &[&str]) -> Result<String, String> {
        self.vsctl_with(&["--timeout=20", "--no-wait"], args)
    }

    fn vsctl_with(&self, opts: &[&str], args: &[&str]) -> Result<String, String> {
        let o = Command::new("ovs-vsctl")
            .arg(format!("--db={}", self.remote()))
            .args(opts)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run ovs-vsctl: {e}"))?;
        if o.status.success() {
            Ok(String::from_utf8_lossy(&o.stdout).into_owned())
        } else {
            Err(format!(
                "ovs-vsctl {}: {}: {}",
                args.join(" "),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    }

    /// `ovs-vsctl get TABLE RECORD COLUMN`, trimmed (strings lose their quotes).
    pub fn get(&self, table: &str, record: &str, column: &str) -> Result<String, String> {
        self.vsctl_no_wait(&["get", table, record, column])
            .map(|s| s.trim().trim_matches('"').to_string())
    }

    /// Waits until `get TABLE RECORD COLUMN` is `want`.
    pub fn wait_get(&self, table: &str, record: &str, column: &str, want: &str, secs: u64) {
        let what = format!("{table} {record} {column}={want}");
        let mut last = String::new();
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(secs) {
            match self.get(table, record, column) {
                Ok(v) if v == want => return,
                Ok(v) => last = v,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what} (last: {last})");
    }
}

impl Drop for OvsdbServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `ferrovsd --ovsdb` (PMD on `core`) in `dir`, configured through `db`.
pub fn start_switch_ovsdb(dir: &Path, core: usize, db: &OvsdbServer) -> Proc {
    let _ = bin("ferrovsd");
    let remote = db.remote();
    start_switch(dir, core, &["--ovsdb", &remote])
}

/// Whether Debian's ovs-vswitchd can run beside the database tools (and root, for its
/// namespace).
pub fn vswitchd_available() -> bool {
    available() && is_root() && have("ip") && Path::new("/usr/sbin/ovs-vswitchd").exists()
}

/// Debian's ovs-vswitchd (userspace datapath: bridges with `datapath_type=netdev`) in a
/// network namespace of its own, configured through its own `ovsdb-server` in `dir`: the
/// reference a test compares ferrovs with. Killed on drop. Its controllers are best
/// reached over Unix sockets (its loopback is not the test's).
#[derive(Debug)]
pub struct OvsVswitchd {
    _vswitchd: Proc,
    pub db: OvsdbServer,
    _net: Net,
    /// The network namespace it runs in.
    pub ns: String,
    /// Its run directory (sockets, logs, `BRIDGE.mgmt`).
    pub dir: PathBuf,
}

impl OvsVswitchd {
    /// Starts the database and the daemon in namespace `fv{tag}PID`.
    pub fn start(dir: &Path, tag: &str) -> OvsVswitchd {
        let mut net = Net::new();
        let ns = Net::name(tag);
        net.netns(&ns);
        let db = OvsdbServer::start(dir);
        let d = dir.display().to_string();
        let args = [
            "netns".to_string(),
            "exec".to_string(),
            ns.clone(),
            "/usr/bin/env".to_string(),
            format!("OVS_RUNDIR={d}"),
            format!("OVS_LOGDIR={d}"),
            format!("OVS_DBDIR={d}"),
            "/usr/sbin/ovs-vswitchd".to_string(),
            db.remote(),
            "--enable-dummy".to_string(),
            format!("--unixctl={d}/ovs-vswitchd.ctl"),
            format!("--pidfile={d}/ovs-vswitchd.pid"),
            format!("--log-file={d}/ovs-vswitchd.log"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let vswitchd = Proc::spawn("ovs-vswitchd", dir, Path::new("/usr/sbin/ip"), &args);
        OvsVswitchd {
            _vswitchd: vswitchd,
            db,
            _net: net,
            ns,
            dir: dir.to_path_buf(),
        }
    }

    /// Adds the netdev bridge br0 (with `dummy`, dummy ports vm1 and vm2 as OpenFlow ports 1
    /// and 2) and waits for its management socket, which it returns.
    pub fn netdev_br0(&self, dummy: bool) -> PathBuf {
        self.db
            .vsctl(&[
                "add-br",
                "br0",
                "--",
                "set",
                "bridge",
                "br0",
                "datapath_type=netdev",
            ])
            .expect("add-br");
        if dummy {
            for (p, n) in [("vm1", "1"), ("vm2", "2")] {
                self.db
                    .add_port("br0", p, &["type=dummy", &format!("ofport_request={n}")])
                    .expect("add-port");
            }
        }
        let mgmt = self.dir.join("br0.mgmt");
        wait_until("OVS's br0.mgmt", 10, || {
            std::os::unix::net::UnixStream::connect(&mgmt).is_ok()
        });
        mgmt
    }

    /// Its `ovs-appctl` target (`--target`).
    pub fn unixctl(&self) -> PathBuf {
        self.dir.join("ovs-vswitchd.ctl")
    }
}
