//! Shared by the in-process tests: a daemon in a thread and mock guests (the vhost-user
//! frontend of `ferrovs-vhost`) over real unix sockets.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrovs_control::{Daemon, DaemonOptions};
use ferrovs_packet::build::{self, Stamp};
use ferrovs_proto::{Client, Request};
use ferrovs_vhost::frontend::{Frontend, FrontendConfig, RxQueue, TxQueue};
use serde_json::Value;

pub struct Switch {
    pub dir: PathBuf,
    pub stop: Arc<AtomicBool>,
    pub thread: Option<JoinHandle<()>>,
}

impl Switch {
    pub fn start(name: &str) -> Switch {
        let dir = std::env::temp_dir().join(format!("ferrovs-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The PMD busy-polls its core; this test thread (the mock guests) must not share it,
        // or every packet waits for a scheduler time slice.
        let cpus = ferrovs_sys::os::allowed_cpus();
        let pmd = *cpus.last().unwrap();
        if let Some(other) = cpus.iter().rev().find(|c| **c != pmd) {
            ferrovs_sys::os::set_affinity(&[*other]).unwrap();
        }
        let mut d = Daemon::start(DaemonOptions {
            run_dir: dir.clone(),
            config: None,
            pmd_cores: Some(vec![pmd]),
            ovsdb: None,
        })
        .expect("daemon starts");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            d.run(&s);
            d.shutdown();
        });
        Switch {
            dir,
            stop,
            thread: Some(thread),
        }
    }

    pub fn sock(&self, port: &str) -> PathBuf {
        self.dir.join(format!("{port}.sock"))
    }

    pub fn req(&self, r: Request) -> Result<Value, String> {
        Client::new(&self.dir).call_raw(&r).map_err(|e| e.message())
    }

    pub fn port_stats(&self, port: &str) -> Value {
        self.req(Request::PortStats {
            port: Some(port.into()),
        })
        .unwrap()[0]
            .clone()
    }

    pub fn add_port(&self, port: &str, extra: &[&str]) {
        let mut options = vec![
            "type=vhost-user".to_string(),
            format!("path={}", self.sock(port).display()),
        ];
        options.extend(extra.iter().map(|s| s.to_string()));
        self.req(Request::AddPort {
            bridge: "br0".into(),
            port: port.into(),
            options,
        })
        .unwrap();
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub struct Guest {
    pub fe: Frontend,
    pub tx: TxQueue,
    pub rx: RxQueue,
    pub mac: u64,
}

pub fn attach(path: &Path, mac: u64, cfg: FrontendConfig) -> Guest {
    let fe = Frontend::connect(path, cfg).expect("frontend attaches");
    let tx = fe.tx_queue(0).unwrap();
    let rx = fe.rx_queue(0).unwrap();
    Guest { fe, tx, rx, mac }
}

/// A switch with its two default vhost-user ports, a guest attached to each (vm1: a, vm2: b,
/// default frontend configuration), both addresses learned by one frame each way.
pub fn switch_with_two_guests(name: &str) -> (Switch, Guest, Guest) {
    let sw = Switch::start(name);
    wait_until("sockets", || {
        sw.sock("vm1").exists() && sw.sock("vm2").exists()
    });
    let mut a = attach(&sw.sock("vm1"), 0x0200_0000_0001, FrontendConfig::default());
    let mut b = attach(&sw.sock("vm2"), 0x0200_0000_0002, FrontendConfig::default());
    assert_eq!(exchange(&mut b, &mut a, 1, 64).len(), 1);
    assert_eq!(exchange(&mut a, &mut b, 1, 64).len(), 1);
    (sw, a, b)
}

pub fn frame(dst: u64, src: u64, seq: u64, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    let n = build::udp_frame(
        &mut b,
        size,
        dst,
        src,
        Stamp {
            flow: 0,
            seq,
            tx_ns: 1,
        },
    );
    b.truncate(n);
    b
}

/// Sends `n` frames from `a` to `b` and returns the sequence numbers `b` received, intact.
pub fn exchange(a: &mut Guest, b: &mut Guest, n: u64, size: usize) -> Vec<u64> {
    let mut got = Vec::new();
    let mut sent = 0;
    let t = Instant::now();
    while (got.len() as u64) < n && t.elapsed() < Duration::from_secs(10) {
        // Never more in flight than b's receive ring holds (256 buffers): a receiver that is
        // descheduled while the switch delivers a backlog would otherwise overflow, counted
        // as guest_no_rx_buffers, as a real guest's ring would.
        let in_flight = sent - got.len() as u64;
        if sent < n && in_flight < 192 && a.tx.send(&frame(b.mac, a.mac, sent, size)) {
            sent += 1;
        }
        b.rx.recv_with(32, |p| {
            let st = build::parse_udp_frame(p).expect("intact frame");
            assert_eq!(p.len(), size);
            got.push(st.seq);
        });
    }
    got
}
