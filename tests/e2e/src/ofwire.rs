//! A controller's side of OpenFlow 1.3, just enough for tests: it listens (TCP or a Unix
//! socket), accepts a switch, exchanges HELLO and FEATURES, answers echoes and sends ROLE
//! and FLOW_MOD requests. ferrovsd and Debian's ovs-vswitchd both connect to it, so the two
//! switches' answers can be compared (`tests/controllers.rs`, `tests/ovsdb.rs`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

pub const HELLO: u8 = 0;
pub const ERROR: u8 = 1;
pub const ECHO_REQUEST: u8 = 2;
pub const ECHO_REPLY: u8 = 3;
pub const FEATURES_REQUEST: u8 = 5;
pub const FEATURES_REPLY: u8 = 6;
pub const FLOW_MOD: u8 = 14;
pub const ROLE_REQUEST: u8 = 24;
pub const ROLE_REPLY: u8 = 25;
pub const PORT_STATUS: u8 = 12;

pub trait Stream: Read + Write + Send {}
impl Stream for TcpStream {}
impl Stream for UnixStream {}

/// One accepted switch connection, seen from the controller.
pub struct Switch {
    pub s: Box<dyn Stream>,
    /// ECHO_REQUESTs the switch sent (answered unless `mute`).
    pub echoes: u32,
    pub mute: bool,
}

pub fn header(ty: u8, len: usize, xid: u32) -> Vec<u8> {
    let mut h = vec![4, ty];
    h.extend_from_slice(&(len as u16).to_be_bytes());
    h.extend_from_slice(&xid.to_be_bytes());
    h
}

pub fn role_request(role: u32, gen: u64, xid: u32) -> Vec<u8> {
    let mut m = header(ROLE_REQUEST, 24, xid);
    m.extend_from_slice(&role.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(&gen.to_be_bytes());
    m
}

/// FLOW_MOD add `priority=PRIO actions=drop` (an empty OXM match, no instructions).
pub fn flow_mod_drop(prio: u16, xid: u32) -> Vec<u8> {
    let mut m = header(FLOW_MOD, 56, xid);
    m.extend_from_slice(&[0; 16]); // cookie, cookie_mask
    m.extend_from_slice(&[0, 0]); // table 0, ADD
    m.extend_from_slice(&[0; 4]); // timeouts
    m.extend_from_slice(&prio.to_be_bytes());
    m.extend_from_slice(&u32::MAX.to_be_bytes()); // buffer_id
    m.extend_from_slice(&u32::MAX.to_be_bytes()); // out_port
    m.extend_from_slice(&u32::MAX.to_be_bytes()); // out_group
    m.extend_from_slice(&[0; 4]); // flags, pad
    m.extend_from_slice(&[0, 1, 0, 4, 0, 0, 0, 0]); // OFPMT_OXM, length 4, padded
    m
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch")
            .field("echoes", &self.echoes)
            .field("mute", &self.mute)
            .finish_non_exhaustive()
    }
}

impl Switch {
    pub fn new(s: Box<dyn Stream>) -> Switch {
        Switch {
            s,
            echoes: 0,
            mute: false,
        }
    }

    pub fn send(&mut self, m: &[u8]) {
        self.s.write_all(m).expect("send to the switch");
    }

    /// The next message (type, whole message); `None` when the switch closed.
    pub fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut h = [0u8; 8];
        self.s.read_exact(&mut h).ok()?;
        let len = u16::from_be_bytes([h[2], h[3]]) as usize;
        let mut m = h.to_vec();
        m.resize(len.max(8), 0);
        self.s.read_exact(&mut m[8..]).ok()?;
        if h[1] == ECHO_REQUEST {
            self.echoes += 1;
            if !self.mute {
                let mut r = m.clone();
                r[1] = ECHO_REPLY;
                self.send(&r);
            }
        }
        Some((h[1], m))
    }

    /// Reads until the switch closes the connection; whether it did within `secs` (less
    /// than the 20 s read timeout, which also ends `recv`).
    pub fn recv_until_closed(&mut self, secs: u64) -> bool {
        let t = Instant::now();
        while self.recv().is_some() {}
        t.elapsed() < Duration::from_secs(secs)
    }

    /// Waits for a message of type `ty` (others are skipped).
    pub fn expect(&mut self, ty: u8) -> Vec<u8> {
        loop {
            let (t, m) = self
                .recv()
                .unwrap_or_else(|| panic!("the switch closed while we waited for type {ty}"));
            if t == ty {
                return m;
            }
        }
    }

    /// HELLO both ways, then FEATURES: the datapath id.
    pub fn handshake(&mut self) -> u64 {
        let h = self.expect(HELLO);
        assert!(h[0] >= 4, "the switch offers OpenFlow 1.3");
        self.send(&header(HELLO, 8, 1));
        self.send(&header(FEATURES_REQUEST, 8, 2));
        let f = self.expect(FEATURES_REPLY);
        u64::from_be_bytes(f[8..16].try_into().unwrap())
    }

    /// A ROLE_REQUEST: `Ok((role, generation))` or `Err((type, code))`.
    pub fn role(&mut self, role: u32, gen: u64) -> Result<(u32, u64), (u16, u16)> {
        self.send(&role_request(role, gen, 77));
        loop {
            let (t, m) = self.recv().expect("the switch answers ROLE_REQUEST");
            match t {
                ROLE_REPLY => {
                    return Ok((
                        u32::from_be_bytes(m[8..12].try_into().unwrap()),
                        u64::from_be_bytes(m[16..24].try_into().unwrap()),
                    ))
                }
                ERROR => return Err(error_of(&m)),
                _ => {}
            }
        }
    }

    /// A FLOW_MOD followed by a BARRIER: the error it got, if any.
    pub fn flow_mod(&mut self, prio: u16) -> Option<(u16, u16)> {
        self.send(&flow_mod_drop(prio, 90));
        self.send(&header(20, 8, 91));
        loop {
            let (t, m) = self.recv().expect("the switch answers FLOW_MOD");
            match t {
                ERROR => return Some(error_of(&m)),
                21 => return None,
                _ => {}
            }
        }
    }
}

/// PORT_MOD (OpenFlow 1.3).
pub fn port_mod(port: u32, hw: [u8; 6], config: u32, mask: u32) -> Vec<u8> {
    let mut m = header(16, 40, 55);
    m.extend_from_slice(&port.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(&hw);
    m.extend_from_slice(&[0; 2]);
    m.extend_from_slice(&config.to_be_bytes());
    m.extend_from_slice(&mask.to_be_bytes());
    m.extend_from_slice(&[0; 8]);
    m
}

pub fn error_of(m: &[u8]) -> (u16, u16) {
    (
        u16::from_be_bytes([m[8], m[9]]),
        u16::from_be_bytes([m[10], m[11]]),
    )
}

/// The controller's listening socket (TCP on loopback, or a Unix socket).
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub fn tcp() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        Listener::Tcp(l)
    }

    pub fn tcp_at(port: u16) -> Listener {
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        l.set_nonblocking(true).unwrap();
        Listener::Tcp(l)
    }

    pub fn unix(path: &Path) -> Listener {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path).unwrap();
        l.set_nonblocking(true).unwrap();
        Listener::Unix(l)
    }

    pub fn port(&self) -> u16 {
        match self {
            Listener::Tcp(l) => l.local_addr().unwrap().port(),
            Listener::Unix(_) => 0,
        }
    }

    /// A switch waiting to connect, if any (does not wait).
    pub fn try_accept(&self) -> Option<Switch> {
        let setup = |s: Box<dyn Stream>| Switch::new(s);
        match self {
            Listener::Tcp(l) => l.accept().ok().map(|(s, _)| {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
                setup(Box::new(s))
            }),
            Listener::Unix(l) => l.accept().ok().map(|(s, _)| {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
                setup(Box::new(s))
            }),
        }
    }

    /// The next switch to connect, within `secs`.
    pub fn accept(&self, secs: u64) -> Switch {
        let t = Instant::now();
        loop {
            if let Some(s) = self.try_accept() {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "no switch connected within {secs} s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
