//! The session against the real `ovsdb-server` of this machine, with the stock
//! `vswitch.ovsschema`, changed by the real `ovs-vsctl`: the command sequence of OVS-DPDK's
//! documentation, our own transactions read back by `ovs-vsctl get`, failed transactions,
//! and a server restart with resynchronisation.
//!
//! Without the OVS binaries the test skips outside CI and fails in CI (`CI=true`), like the
//! privileged tests of `tests/e2e`.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrovs_ovsdb::{ops, Datum, Event, Monitor, Remote, Replica, Row, Session, Stream, Uuid};
use serde_json::json;

const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
const DB: &str = "Open_vSwitch";
const TIMEOUT: Duration = Duration::from_secs(10);

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `bin` on the PATH, else in /usr/sbin or /usr/bin (ovsdb-server is in /usr/sbin, which a
/// non-root PATH may lack).
fn bin(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| name.into())
}

fn have(name: &str) -> bool {
    Command::new(bin(name))
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the OVS tools are here; outside CI a missing one skips the test, in CI fails it.
fn require_ovs() -> bool {
    let missing: Vec<&str> = ["ovsdb-server", "ovsdb-tool", "ovs-vsctl"]
        .into_iter()
        .filter(|b| !have(b))
        .chain((!Path::new(SCHEMA).exists()).then_some(SCHEMA))
        .collect();
    if missing.is_empty() {
        return true;
    }
    if in_ci() {
        panic!("required for this test but missing: {missing:?} (apt install openvswitch-switch)");
    }
    eprintln!("SKIP: missing {missing:?} (apt install openvswitch-switch)");
    false
}

/// A database and an `ovsdb-server` serving it on a Unix socket, in a temporary directory.
struct Server {
    dir: PathBuf,
    child: Option<Child>,
    /// A TCP port on 127.0.0.1 the server also listens on.
    tcp: Option<u16>,
}

impl Server {
    fn new(name: &str) -> Server {
        Server::with_tcp(name, None)
    }

    fn with_tcp(name: &str, tcp: Option<u16>) -> Server {
        let dir = std::env::temp_dir().join(format!("ferrovs-ovsdb-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new(bin("ovsdb-tool"))
            .arg("create")
            .arg(dir.join("conf.db"))
            .arg(SCHEMA)
            .status()
            .unwrap();
        assert!(st.success(), "ovsdb-tool create: {st}");
        let mut s = Server {
            dir,
            child: None,
            tcp,
        };
        s.start();
        s
    }

    fn sock(&self) -> PathBuf {
        self.dir.join("db.sock")
    }

    fn start(&mut self) {
        let d = &self.dir;
        let child = Command::new(bin("ovsdb-server"))
            .arg(format!("--remote=punix:{}", self.sock().display()))
            .args(self.tcp.map(|p| format!("--remote=ptcp:{p}:127.0.0.1")))
            .arg(format!(
                "--pidfile={}",
                d.join("ovsdb-server.pid").display()
            ))
            .arg(format!(
                "--unixctl={}",
                d.join("ovsdb-server.ctl").display()
            ))
            .arg(format!(
                "--log-file={}",
                d.join("ovsdb-server.log").display()
            ))
            .arg(d.join("conf.db"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ovsdb-server");
        self.child = Some(child);
        let deadline = Instant::now() + TIMEOUT;
        while std::os::unix::net::UnixStream::connect(self.sock()).is_err() {
            assert!(Instant::now() < deadline, "ovsdb-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn remote(&self) -> Remote {
        format!("unix:{}", self.sock().display()).parse().unwrap()
    }

    /// Runs `ovs-vsctl --no-wait` with `args`; returns its output, trimmed.
    fn vsctl(&self, args: &[&str]) -> String {
        let out = Command::new(bin("ovs-vsctl"))
            .arg(format!("--db=unix:{}", self.sock().display()))
            .args(["--no-wait", "--timeout=10"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovs-vsctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A session on a blocking socket with a short read timeout.
struct Client {
    stream: Stream,
    session: Session,
    events: VecDeque<Event>,
    eof: bool,
}

fn monitor() -> Monitor {
    Monitor::new()
        .table(
            "Open_vSwitch",
            &[
                "bridges",
                "next_cfg",
                "cur_cfg",
                "other_config",
                "ovs_version",
            ],
        )
        .table(
            "Bridge",
            &["name", "ports", "datapath_type", "other_config"],
        )
        .table("Port", &["name", "interfaces", "tag"])
        .table(
            "Interface",
            &[
                "name",
                "type",
                "options",
                "ofport",
                "ofport_request",
                "external_ids",
            ],
        )
}

impl Client {
    fn connect(server: &Server) -> Client {
        Client::connect_to(&server.remote())
    }

    fn connect_to(remote: &Remote) -> Client {
        Client::connect_with(remote, monitor())
    }

    /// A client of `remote` replicating `monitor`, synchronised.
    fn connect_with(remote: &Remote, monitor: Monitor) -> Client {
        let stream = Stream::connect(remote).unwrap();
        stream.set_nonblocking(false).unwrap();
        match &stream {
            Stream::Unix(s) => s.set_read_timeout(Some(Duration::from_millis(50))).unwrap(),
            Stream::Tcp(s) => s.set_read_timeout(Some(Duration::from_millis(50))).unwrap(),
        }
        let mut session = Session::new(DB, monitor);
        session.connected();
        let mut c = Client {
            stream,
            session,
            events: VecDeque::new(),
            eof: false,
        };
        c.wait_event("Synced", |e| matches!(e, Event::Synced));
        c
    }

    /// Writes what is pending, reads what arrived (for at most the read timeout).
    fn pump(&mut self) {
        while !self.session.pending_output().is_empty() {
            match self.stream.write(self.session.pending_output()) {
                Ok(n) => self.session.consume_output(n),
                Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                    self.eof = true;
                    return;
                }
                Err(e) => panic!("write: {e}"),
            }
        }
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => self.eof = true,
            Ok(n) => self.session.feed(&buf[..n]).unwrap(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => self.eof = true,
            Err(e) => panic!("read: {e}"),
        }
        self.session.check_consistency().unwrap();
        while let Some(e) = self.session.poll_event() {
            self.events.push_back(e);
        }
    }

    fn wait_event(&mut self, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(i) = self.events.iter().position(&pred) {
                return self.events.remove(i).unwrap();
            }
            assert!(!self.eof, "connection closed waiting for {what}");
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.events
            );
            self.pump();
        }
    }

    fn wait_replica(&mut self, what: &str, pred: impl Fn(&Replica) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !pred(self.session.replica()) {
            assert!(!self.eof, "connection closed waiting for {what}");
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:#?}",
                self.session.replica()
            );
            self.pump();
        }
        self.events.clear();
    }

    fn transact(
        &mut self,
        ops: Vec<serde_json::Value>,
    ) -> Result<Vec<serde_json::Value>, ferrovs_ovsdb::TxnError> {
        let id = self.session.transact(ops);
        match self.wait_event(
            "transaction reply",
            |e| matches!(e, Event::TxnReply { id: i, .. } if *i == id),
        ) {
            Event::TxnReply { result, .. } => result,
            _ => unreachable!(),
        }
    }
}

/// The row of `table` whose `name` is `name`.
fn named<'r>(r: &'r Replica, table: &str, name: &str) -> Option<(Uuid, &'r Row)> {
    r.rows(table)
        .find(|(_, row)| row["name"].as_str() == Some(name))
        .map(|(u, row)| (*u, row))
}

fn iface<'r>(r: &'r Replica, name: &str) -> Option<&'r Row> {
    named(r, "Interface", name).map(|(_, row)| row)
}

fn root(r: &Replica) -> (Uuid, &Row) {
    let (u, row) = r.rows("Open_vSwitch").next().expect("an Open_vSwitch row");
    (*u, row)
}

#[test]
fn ovs_dpdk_command_sequence_against_ovsdb_server() {
    if !require_ovs() {
        return;
    }
    let mut server = Server::new("seq");
    let mut c = Client::connect(&server);
    assert_eq!(c.session.replica().len("Open_vSwitch"), 0);
    assert!(c.session.uses_monitor_cond());

    server.vsctl(&["init"]);
    c.wait_replica("the Open_vSwitch row", |r| r.len("Open_vSwitch") == 1);

    server.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ]);
    c.wait_replica("br0", |r| {
        named(r, "Bridge", "br0")
            .is_some_and(|(_, b)| b["datapath_type"].as_str() == Some("netdev"))
            && iface(r, "br0").is_some()
    });
    let r = c.session.replica();
    let (br, _) = named(r, "Bridge", "br0").unwrap();
    assert_eq!(root(r).1["bridges"].uuids(), vec![br]);
    assert_eq!(iface(r, "br0").unwrap()["type"].as_str(), Some("internal"));

    server.vsctl(&[
        "add-port",
        "br0",
        "vhu0",
        "--",
        "set",
        "Interface",
        "vhu0",
        "type=dpdkvhostuserclient",
        "options:vhost-server-path=/tmp/x",
    ]);
    c.wait_replica("vhu0", |r| iface(r, "vhu0").is_some());
    let r = c.session.replica();
    let vhu0 = iface(r, "vhu0").unwrap();
    assert_eq!(vhu0["type"].as_str(), Some("dpdkvhostuserclient"));
    assert_eq!(
        vhu0["options"],
        Datum::strings_map([("vhost-server-path", "/tmp/x")])
    );
    assert!(vhu0["ofport_request"].is_empty());
    let (port, port_row) = named(r, "Port", "vhu0").unwrap();
    assert_eq!(
        port_row["interfaces"].uuids(),
        vec![named(r, "Interface", "vhu0").unwrap().0]
    );
    assert!(named(r, "Bridge", "br0").unwrap().1["ports"]
        .uuids()
        .contains(&port));
    assert_eq!(named(r, "Bridge", "br0").unwrap().1["ports"].len(), 2);

    server.vsctl(&["set", "Interface", "vhu0", "ofport_request=5"]);
    c.wait_replica("ofport_request", |r| {
        iface(r, "vhu0").unwrap()["ofport_request"].as_i64() == Some(5)
    });

    // Map diffs: a key added, a key changed, a key removed.
    server.vsctl(&["set", "Interface", "vhu0", "options:n_rxq=2"]);
    c.wait_replica("n_rxq", |r| iface(r, "vhu0").unwrap()["options"].len() == 2);
    server.vsctl(&["set", "Interface", "vhu0", "options:n_rxq=4"]);
    c.wait_replica("n_rxq=4", |r| {
        iface(r, "vhu0").unwrap()["options"]
            .get("n_rxq")
            .and_then(|a| a.as_str())
            == Some("4")
    });
    server.vsctl(&[
        "remove",
        "Interface",
        "vhu0",
        "options",
        "vhost-server-path",
    ]);
    c.wait_replica("options without vhost-server-path", |r| {
        iface(r, "vhu0").unwrap()["options"] == Datum::strings_map([("n_rxq", "4")])
    });
    server.vsctl(&["set", "Port", "vhu0", "tag=10"]);
    c.wait_replica("tag", |r| {
        named(r, "Port", "vhu0").unwrap().1["tag"].as_i64() == Some(10)
    });
    server.vsctl(&["clear", "Port", "vhu0", "tag"]);
    c.wait_replica("no tag", |r| {
        named(r, "Port", "vhu0").unwrap().1["tag"].is_empty()
    });

    // Our own writes, as ovs-vswitchd makes them, read back by ovs-vsctl.
    let r = c.session.replica();
    let (vhu0_uuid, _) = named(r, "Interface", "vhu0").unwrap();
    let (root_uuid, root_row) = root(r);
    let next_cfg = root_row["next_cfg"].as_i64().unwrap();
    let res = c
        .transact(vec![
            ops::update(
                "Interface",
                vhu0_uuid,
                &Row::from([("ofport".into(), Datum::integer(5))]),
            ),
            ops::update(
                "Open_vSwitch",
                root_uuid,
                &Row::from([("cur_cfg".into(), Datum::integer(next_cfg))]),
            ),
            ops::mutate(
                "Interface",
                vhu0_uuid,
                vec![(
                    "external_ids".into(),
                    "insert",
                    Datum::strings_map([("by", "ferrovs")]),
                )],
            ),
            ops::comment("ferrovs: test"),
        ])
        .unwrap();
    assert_eq!(res[0], json!({"count": 1}));
    assert_eq!(server.vsctl(&["get", "Interface", "vhu0", "ofport"]), "5");
    assert_eq!(
        server.vsctl(&["get", "Open_vSwitch", ".", "cur_cfg"]),
        next_cfg.to_string()
    );
    assert_eq!(
        server.vsctl(&["get", "Interface", "vhu0", "external_ids:by"]),
        "ferrovs"
    );
    c.wait_replica("our writes", |r| {
        iface(r, "vhu0").unwrap()["ofport"].as_i64() == Some(5)
            && root(r).1["cur_cfg"].as_i64() == Some(next_cfg)
    });

    // A wait that does not hold: the transaction fails, retryable, nothing written.
    let e = c
        .transact(vec![
            ops::wait_until_equal(
                "Interface",
                vhu0_uuid,
                &Row::from([("ofport".into(), Datum::integer(99))]),
                0,
            ),
            ops::update(
                "Interface",
                vhu0_uuid,
                &Row::from([("ofport".into(), Datum::integer(6))]),
            ),
        ])
        .unwrap_err();
    assert_eq!(
        (e.error.as_str(), e.op_index, e.retryable()),
        ("timed out", Some(0), true),
        "{e}"
    );
    // A wait that holds lets the update through.
    c.transact(vec![
        ops::wait_until_equal(
            "Interface",
            vhu0_uuid,
            &Row::from([("ofport".into(), Datum::integer(5))]),
            0,
        ),
        ops::update(
            "Interface",
            vhu0_uuid,
            &Row::from([("ofport".into(), Datum::integer(6))]),
        ),
    ])
    .unwrap();
    assert_eq!(server.vsctl(&["get", "Interface", "vhu0", "ofport"]), "6");
    // A column the schema lacks: the server's message, not retryable.
    let e = c
        .transact(vec![ops::update(
            "Interface",
            vhu0_uuid,
            &Row::from([("no_such_column".into(), Datum::integer(1))]),
        )])
        .unwrap_err();
    assert!(!e.retryable());
    assert!(e.to_string().contains("no_such_column"), "{e}");
    // An unknown table fails the request as a whole or its operation: either way an error.
    let e = c
        .transact(vec![ops::delete("No_Such_Table", vhu0_uuid)])
        .unwrap_err();
    assert!(e.to_string().contains("No_Such_Table"), "{e}");
    // Echo round trip.
    c.session.echo();
    assert!(c.session.awaiting_reply());
    let deadline = Instant::now() + TIMEOUT;
    while c.session.awaiting_reply() {
        assert!(Instant::now() < deadline, "no echo reply");
        c.pump();
    }

    // ovsdb-server killed and restarted: a new connection resynchronises to the same contents.
    c.wait_replica("ofport 6", |r| {
        iface(r, "vhu0").unwrap()["ofport"].as_i64() == Some(6)
    });
    let before = c.session.replica().clone();
    server.kill();
    let deadline = Instant::now() + TIMEOUT;
    while !c.eof {
        assert!(Instant::now() < deadline, "no EOF after the server died");
        c.pump();
    }
    c.session.disconnected();
    assert_eq!(
        c.session.replica(),
        &before,
        "the replica outlives the connection"
    );
    server.start();
    let mut c2 = Client::connect(&server);
    assert_eq!(c2.session.replica(), &before);
    // The same session reconnected resynchronises too.
    c.stream = Stream::connect(&server.remote()).unwrap();
    c.stream.set_nonblocking(false).unwrap();
    if let Stream::Unix(s) = &c.stream {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    }
    c.eof = false;
    c.session.connected();
    assert!(c.session.replica().is_empty());
    c.wait_event("Synced after reconnection", |e| matches!(e, Event::Synced));
    assert_eq!(c.session.replica(), &before);

    // del-port, del-br: rows deleted, sets diffed.
    server.vsctl(&["del-port", "br0", "vhu0"]);
    c.wait_replica("vhu0 gone", |r| {
        iface(r, "vhu0").is_none() && named(r, "Port", "vhu0").is_none()
    });
    assert_eq!(
        named(c.session.replica(), "Bridge", "br0").unwrap().1["ports"].len(),
        1
    );
    server.vsctl(&["del-br", "br0"]);
    c.wait_replica("br0 gone", |r| {
        r.len("Bridge") == 0
            && r.len("Port") == 0
            && r.len("Interface") == 0
            && root(r).1["bridges"].is_empty()
    });
    c2.wait_replica("c2 sees the same", |r| r.len("Bridge") == 0);
    assert_eq!(c2.session.replica(), c.session.replica());
}

#[test]
fn over_tcp() {
    if !require_ovs() {
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let server = Server::with_tcp("tcp", Some(port));
    server.vsctl(&["init"]);
    server.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ]);
    let remote: Remote = format!("tcp:127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "ovsdb-server did not listen on TCP"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = Client::connect_to(&remote);
    let r = c.session.replica();
    assert_eq!(r.len("Bridge"), 1);
    assert_eq!(
        named(r, "Bridge", "br0").unwrap().1["datapath_type"].as_str(),
        Some("netdev")
    );
}

#[test]
fn unknown_database_is_a_server_error() {
    if !require_ovs() {
        return;
    }
    let server = Server::new("nodb");
    let mut stream = Stream::connect(&server.remote()).unwrap();
    stream.set_nonblocking(false).unwrap();
    let mut s = Session::new("No_Such_DB", monitor());
    s.connected();
    stream.write_all(s.pending_output()).unwrap();
    let n = s.pending_output().len();
    s.consume_output(n);
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + TIMEOUT;
    let event = loop {
        assert!(Instant::now() < deadline);
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "EOF");
        s.feed(&buf[..n]).unwrap();
        if let Some(e) = s.poll_event() {
            break e;
        }
    };
    let Event::ServerError { error, .. } = event else {
        panic!("{event:?}")
    };
    assert!(error.contains("unknown database"), "{error}");
    assert!(!s.is_synced());
}

/// A session handed over by a version that monitored fewer columns moves the monitor to this
/// version's columns on the same connection (ovsdb-server cannot change a monitor's columns:
/// `monitor_cancel`, then `monitor_cond` under the same id), and then follows the database.
#[test]
fn a_restored_session_with_fewer_columns_monitors_again() {
    if !require_ovs() {
        return;
    }
    let server = Server::new("remonitor");
    server.vsctl(&["init"]);
    server.vsctl(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ]);
    server.vsctl(&[
        "add-port",
        "br0",
        "p1",
        "--",
        "set",
        "Interface",
        "p1",
        "type=dpdkvhostuserclient",
        "options:vhost-server-path=/tmp/p1.sock",
    ]);
    // The old version: Interface without options and external_ids.
    let narrow = Monitor::new()
        .table("Bridge", &["name", "ports"])
        .table("Port", &["name", "interfaces"])
        .table("Interface", &["name", "type"]);
    let mut c = Client::connect_with(&server.remote(), narrow);
    assert!(iface(c.session.replica(), "p1")
        .unwrap()
        .get("options")
        .is_none());
    let st = c.session.export().unwrap();
    // The new version goes on with the same connection.
    c.session = Session::restore(DB, monitor(), &st).unwrap();
    assert!(!c.session.is_synced());
    c.wait_event("Synced again", |e| matches!(e, Event::Synced));
    let r = c.session.replica();
    assert_eq!(
        iface(r, "p1").unwrap()["options"],
        Datum::map([(
            ferrovs_ovsdb::Atom::String("vhost-server-path".into()),
            ferrovs_ovsdb::Atom::String("/tmp/p1.sock".into())
        )])
    );
    assert_eq!(
        r.len("Open_vSwitch"),
        1,
        "a table the old version did not monitor"
    );
    // Notifications of the new monitor follow the database.
    server.vsctl(&["set", "Interface", "p1", "external_ids:vm=a"]);
    c.wait_replica("external_ids", |r| {
        iface(r, "p1").is_some_and(|i| i["external_ids"].to_json().to_string().contains("vm"))
    });
    assert!(!c.eof);
}
