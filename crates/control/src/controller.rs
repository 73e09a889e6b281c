//! OpenFlow controller connections, the pure part: targets, reconnect backoff, the
//! inactivity probe, roles and the fail-open decision, with OVS's semantics (its `rconn`,
//! `connmgr` and `fail-open`). The daemon (`daemon/controllers.rs`) owns the sockets and
//! asks these types what to do and when; nothing here does I/O, so all of it is tested
//! with a fake clock.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// OpenFlow's IANA port, the default of `tcp:` and `ptcp:` targets.
pub const DEFAULT_PORT: u16 = 6653;
/// First reconnect delay (OVS: 1 s, doubling).
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Default `max_backoff` (OVS: 8 s).
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Default inactivity probe interval (OVS: 5 s).
pub const DEFAULT_PROBE: Duration = Duration::from_secs(5);
/// Shortest probe interval (OVS raises smaller ones to 5 s; 0 turns probing off).
pub const MIN_PROBE: Duration = Duration::from_secs(5);

/// Where a bridge's controller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `tcp:IP[:PORT]`: the switch connects.
    Tcp(SocketAddr),
    /// `unix:PATH`: the switch connects.
    Unix(PathBuf),
    /// `ptcp:[PORT][:IP]`: the switch listens (default port 6653, any address).
    PTcp(SocketAddr),
    /// `punix:PATH`: the switch listens.
    PUnix(PathBuf),
}

/// A controller target that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad controller target '{target}': {why} (expected tcp:IP[:PORT], unix:PATH, ptcp:[PORT][:IP] or punix:PATH)")]
pub struct BadTarget {
    pub target: String,
    pub why: &'static str,
}

impl Target {
    /// Parses `s` as `ovs-vsctl set-controller` takes it.
    pub fn parse(s: &str) -> Result<Target, BadTarget> {
        let bad = |why| BadTarget {
            target: s.to_string(),
            why,
        };
        let (kind, rest) = s.split_once(':').ok_or_else(|| bad("no method"))?;
        match kind {
            "unix" | "punix" => {
                if rest.is_empty() {
                    return Err(bad("no path"));
                }
                let p = PathBuf::from(rest);
                Ok(if kind == "unix" {
                    Target::Unix(p)
                } else {
                    Target::PUnix(p)
                })
            }
            "tcp" => {
                let (ip, port) = split_host_port(rest).ok_or_else(|| bad("bad address"))?;
                let ip: IpAddr = ip.parse().map_err(|_| bad("bad IP address"))?;
                let port = parse_port(port).ok_or_else(|| bad("bad port"))?;
                Ok(Target::Tcp(SocketAddr::new(ip, port)))
            }
            "ptcp" => {
                // ptcp:[PORT][:IP]
                let (port, ip) = match rest.split_once(':') {
                    Some((p, ip)) => (p, Some(ip.trim_start_matches('[').trim_end_matches(']'))),
                    None => (rest, None),
                };
                let port = parse_port((!port.is_empty()).then_some(port))
                    .ok_or_else(|| bad("bad port"))?;
                let ip: IpAddr = match ip {
                    Some(ip) => ip.parse().map_err(|_| bad("bad IP address"))?,
                    None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                };
                Ok(Target::PTcp(SocketAddr::new(ip, port)))
            }
            "ssl" | "pssl" => Err(bad("SSL is not supported")),
            _ => Err(bad("unknown method")),
        }
    }

    /// Whether the switch listens (`ptcp:`, `punix:`) rather than connects.
    pub fn is_passive(&self) -> bool {
        matches!(self, Target::PTcp(_) | Target::PUnix(_))
    }
}

/// `IP[:PORT]` or `[IPv6][:PORT]`.
fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(r) = s.strip_prefix('[') {
        let (ip, tail) = r.split_once(']')?;
        match tail {
            "" => Some((ip, None)),
            t => Some((ip, Some(t.strip_prefix(':')?))),
        }
    } else if s.matches(':').count() > 1 {
        // A bare IPv6 address: no port.
        Some((s, None))
    } else {
        match s.split_once(':') {
            Some((ip, p)) => Some((ip, Some(p))),
            None => Some((s, None)),
        }
    }
}

fn parse_port(p: Option<&str>) -> Option<u16> {
    match p {
        None => Some(DEFAULT_PORT),
        Some(p) => p.parse().ok(),
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "tcp:{a}"),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
            Target::PTcp(a) => write!(f, "ptcp:{}:{}", a.port(), a.ip()),
            Target::PUnix(p) => write!(f, "punix:{}", p.display()),
        }
    }
}

/// Reconnect backoff as OVS's `rconn`: the first attempt at once; after a failure wait 1 s,
/// doubling up to `max`; a connection that lasted longer than the current delay resets it
/// to 1 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    cur: Duration,
    max: Duration,
    /// The last attempt plus `cur`: a failure after this resets the delay.
    deadline: Option<Instant>,
}

impl Backoff {
    pub fn new(max: Duration) -> Backoff {
        Backoff {
            cur: Duration::ZERO,
            max: max.max(BACKOFF_MIN),
            deadline: None,
        }
    }

    /// A connection attempt starts at `now`.
    pub fn attempt(&mut self, now: Instant) {
        self.deadline = Some(now + self.cur);
    }

    /// The attempt failed or the connection dropped at `now`: how long to wait.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.cur = match self.deadline {
            Some(d) if now < d => (self.cur * 2).clamp(BACKOFF_MIN, self.max),
            _ => BACKOFF_MIN,
        };
        self.deadline = Some(now + self.cur);
        self.cur
    }

    /// The current delay.
    pub fn current(&self) -> Duration {
        self.cur
    }
}

/// A [`Backoff`] as plain data, for a hot upgrade: the current delay, and how long until
/// a failure stops doubling it (`None`: no attempt yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackoffState {
    pub current_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
}

impl Backoff {
    /// This backoff at `now`, as plain data.
    pub fn state(&self, now: Instant) -> BackoffState {
        BackoffState {
            current_ms: self.cur.as_millis() as u64,
            deadline_ms: self
                .deadline
                .map(|d| d.saturating_duration_since(now).as_millis() as u64),
        }
    }

    /// A backoff from handed-over state (untrusted: the delay is kept within `max`, the
    /// deadline within the delay).
    pub fn from_state(s: &BackoffState, max: Duration, now: Instant) -> Backoff {
        let max = max.max(BACKOFF_MIN);
        let cur = Duration::from_millis(s.current_ms).min(max);
        Backoff {
            cur,
            max,
            deadline: s
                .deadline_ms
                .map(|ms| now + Duration::from_millis(ms).min(cur)),
        }
    }
}

/// What the inactivity probe wants done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAction {
    Nothing,
    /// Send an ECHO_REQUEST.
    SendEcho,
    /// No reply to the echo: drop the connection.
    Disconnect,
}

/// OVS's inactivity probe: after `interval` with nothing received, an echo; after another
/// `interval` still with nothing, the connection is dead.
#[derive(Debug, Clone)]
pub struct Probe {
    interval: Option<Duration>,
    last_rx: Instant,
    echo_sent: Option<Instant>,
}

impl Probe {
    /// `interval` 0 turns probing off; below [`MIN_PROBE`] it is raised to it.
    pub fn new(interval: Duration, now: Instant) -> Probe {
        Probe {
            interval: (!interval.is_zero()).then(|| interval.max(MIN_PROBE)),
            last_rx: now,
            echo_sent: None,
        }
    }

    /// Something arrived from the peer.
    pub fn received(&mut self, now: Instant) {
        self.last_rx = now;
        self.echo_sent = None;
    }

    pub fn poll(&mut self, now: Instant) -> ProbeAction {
        let Some(i) = self.interval else {
            return ProbeAction::Nothing;
        };
        match self.echo_sent {
            Some(t) if now.duration_since(t) >= i => ProbeAction::Disconnect,
            Some(_) => ProbeAction::Nothing,
            None if now.duration_since(self.last_rx) >= i => {
                self.echo_sent = Some(now);
                ProbeAction::SendEcho
            }
            None => ProbeAction::Nothing,
        }
    }

    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Whether an echo went out and nothing came back yet (OVS's rconn state `IDLE`).
    pub fn echo_outstanding(&self) -> bool {
        self.echo_sent.is_some()
    }

    /// This probe at `now`, as plain data (a hot upgrade carries it, so that a peer that
    /// went silent is still probed, and dropped, on time).
    pub fn state(&self, now: Instant) -> ProbeState {
        ProbeState {
            interval_ms: self.interval.map_or(0, |i| i.as_millis() as u64),
            idle_ms: now.saturating_duration_since(self.last_rx).as_millis() as u64,
            echo_ms: self
                .echo_sent
                .map(|t| now.saturating_duration_since(t).as_millis() as u64),
        }
    }

    /// A probe from handed-over state (untrusted: an interval below [`MIN_PROBE`] is raised
    /// as [`Probe::new`] does; times this process cannot represent count as now).
    pub fn from_state(s: &ProbeState, now: Instant) -> Probe {
        let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms)).unwrap_or(now);
        let mut p = Probe::new(Duration::from_millis(s.interval_ms), now);
        p.last_rx = ago(s.idle_ms);
        p.echo_sent = s.echo_ms.map(ago);
        p
    }
}

/// A [`Probe`] as plain data: its interval (0: off), how long since the peer last sent
/// anything, and how long since the outstanding echo went (`None`: none is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeState {
    pub interval_ms: u64,
    pub idle_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo_ms: Option<u64>,
}

/// A role number OpenFlow does not define.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown OpenFlow role {0}")]
pub struct BadRole(pub u32);

/// A connection's OpenFlow role (`OFPCR_ROLE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Equal,
    Master,
    Slave,
}

impl Role {
    /// From `OFPCR_ROLE_*` (`NOCHANGE` is `None`; an unknown value is an error carrying it).
    pub fn from_wire(v: u32) -> Result<Option<Role>, BadRole> {
        use ferrovs_openflow::message::role;
        match v {
            role::NOCHANGE => Ok(None),
            role::EQUAL => Ok(Some(Role::Equal)),
            role::MASTER => Ok(Some(Role::Master)),
            role::SLAVE => Ok(Some(Role::Slave)),
            _ => Err(BadRole(v)),
        }
    }

    pub fn to_wire(self) -> u32 {
        use ferrovs_openflow::message::role;
        match self {
            Role::Equal => role::EQUAL,
            Role::Master => role::MASTER,
            Role::Slave => role::SLAVE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Equal => "equal",
            Role::Master => "master",
            Role::Slave => "slave",
        }
    }
}

/// A bridge's master election id (OVS's `master_election_id`): once defined, a request for
/// master or slave with an older id (by serial number arithmetic) is stale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Election {
    pub id: Option<u64>,
}

/// What a ROLE_REQUEST does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleDecision {
    /// Reply with this role; when `demote_others`, every other master becomes slave.
    Grant { role: Role, demote_others: bool },
    /// `OFPRRFC_STALE`.
    Stale,
    /// `OFPRRFC_BAD_ROLE`.
    BadRole,
}

impl Election {
    /// A ROLE_REQUEST for wire role `role` with `generation_id`, from a connection in
    /// `current` role.
    pub fn request(&mut self, current: Role, role: u32, generation_id: u64) -> RoleDecision {
        let want = match Role::from_wire(role) {
            Ok(Some(r)) => r,
            Ok(None) => {
                return RoleDecision::Grant {
                    role: current,
                    demote_others: false,
                }
            }
            Err(BadRole(_)) => return RoleDecision::BadRole,
        };
        if want != Role::Equal {
            if let Some(id) = self.id {
                if (generation_id.wrapping_sub(id) as i64) < 0 {
                    return RoleDecision::Stale;
                }
            }
            self.id = Some(generation_id);
        }
        RoleDecision::Grant {
            role: want,
            demote_others: want == Role::Master,
        }
    }

    /// The generation id a ROLE_REPLY carries (all ones while undefined, as OVS's).
    pub fn reply_id(&self) -> u64 {
        self.id.unwrap_or(u64::MAX)
    }
}

/// Whether a bridge in `fail_mode` runs OVS's fail-open (the hidden `NORMAL` rule above
/// every other): standalone, with controllers configured, none of them connected for three
/// probe intervals (idle, echo, reconnect) — `disconnected_for` is how long no controller
/// has been connected (`None`: one is).
pub fn fail_open(
    mode: crate::config::FailMode,
    has_controllers: bool,
    disconnected_for: Option<Duration>,
    max_probe: Duration,
) -> bool {
    if mode != crate::config::FailMode::Standalone || !has_controllers {
        return false;
    }
    let trigger = if max_probe.is_zero() {
        Duration::from_secs(1)
    } else {
        max_probe * 3
    };
    disconnected_for.is_some_and(|d| d >= trigger)
}

/// The OpenFlow versions of `protocols` names (`OpenFlow10` … `OpenFlow15`); an unknown
/// name is an error.
pub fn protocol_versions(protocols: &[String]) -> Result<Vec<u8>, String> {
    protocols
        .iter()
        .map(|p| {
            Ok(match p.as_str() {
                "OpenFlow10" => 0x01,
                "OpenFlow11" => 0x02,
                "OpenFlow12" => 0x03,
                "OpenFlow13" => 0x04,
                "OpenFlow14" => 0x05,
                "OpenFlow15" => 0x06,
                _ => {
                    return Err(format!(
                        "unknown protocol '{p}' (expected OpenFlow10 ... OpenFlow15)"
                    ))
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FailMode;

    #[test]
    fn targets() {
        assert_eq!(
            Target::parse("tcp:127.0.0.1").unwrap(),
            Target::Tcp("127.0.0.1:6653".parse().unwrap())
        );
        assert_eq!(
            Target::parse("tcp:10.0.0.1:6633").unwrap(),
            Target::Tcp("10.0.0.1:6633".parse().unwrap())
        );
        assert_eq!(
            Target::parse("tcp:[::1]:7000").unwrap(),
            Target::Tcp("[::1]:7000".parse().unwrap())
        );
        assert_eq!(
            Target::parse("unix:/run/c.sock").unwrap(),
            Target::Unix("/run/c.sock".into())
        );
        assert_eq!(
            Target::parse("ptcp:6654").unwrap(),
            Target::PTcp("0.0.0.0:6654".parse().unwrap())
        );
        assert_eq!(
            Target::parse("ptcp:6654:127.0.0.1").unwrap(),
            Target::PTcp("127.0.0.1:6654".parse().unwrap())
        );
        assert_eq!(
            Target::parse("ptcp:").unwrap(),
            Target::PTcp("0.0.0.0:6653".parse().unwrap())
        );
        for bad in [
            "tcp:",
            "tcp:1.2.3",
            "tcp:1.2.3.4:99999",
            "unix:",
            "ssl:1.2.3.4",
            "x",
            "udp:1:2",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        for s in [
            "tcp:127.0.0.1:6653",
            "unix:/x",
            "ptcp:6653:0.0.0.0",
            "punix:/y",
        ] {
            assert_eq!(Target::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn backoff_doubles_to_max_and_resets_after_a_long_connection() {
        let t0 = Instant::now();
        let mut b = Backoff::new(DEFAULT_MAX_BACKOFF);
        let mut now = t0;
        let mut waits = vec![];
        for _ in 0..6 {
            b.attempt(now);
            // Refused at once.
            let w = b.failed(now + Duration::from_millis(1));
            waits.push(w.as_secs());
            now += w;
        }
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
        // A connection that lived longer than the delay: back to 1 s.
        b.attempt(now);
        assert_eq!(b.failed(now + Duration::from_secs(60)), BACKOFF_MIN);
        // max_backoff below 1 s is 1 s.
        let mut b = Backoff::new(Duration::ZERO);
        b.attempt(t0);
        assert_eq!(b.failed(t0), BACKOFF_MIN);
    }

    #[test]
    fn probe_echoes_then_drops() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut p = Probe::new(Duration::from_secs(1), t0);
        assert_eq!(p.interval(), Some(MIN_PROBE));
        assert_eq!(p.poll(t0 + 4 * s), ProbeAction::Nothing);
        assert_eq!(p.poll(t0 + 5 * s), ProbeAction::SendEcho);
        assert_eq!(p.poll(t0 + 6 * s), ProbeAction::Nothing);
        p.received(t0 + 7 * s);
        assert_eq!(p.poll(t0 + 11 * s), ProbeAction::Nothing);
        assert_eq!(p.poll(t0 + 12 * s), ProbeAction::SendEcho);
        assert_eq!(p.poll(t0 + 17 * s), ProbeAction::Disconnect);
        let mut off = Probe::new(Duration::ZERO, t0);
        assert_eq!(off.poll(t0 + 1000 * s), ProbeAction::Nothing);
    }

    /// A probe and a backoff handed over carry on exactly where they were (the new daemon
    /// echoes and drops on the old one's schedule), and hostile values stay in bounds.
    #[test]
    fn probe_and_backoff_state_round_trip() {
        let s = Duration::from_secs(1);
        let t0 = Instant::now() + 100 * s;
        let mut p = Probe::new(5 * s, t0);
        assert_eq!(p.poll(t0 + 5 * s), ProbeAction::SendEcho);
        let st = p.state(t0 + 7 * s);
        assert_eq!(
            st,
            ProbeState {
                interval_ms: 5000,
                idle_ms: 7000,
                echo_ms: Some(2000)
            }
        );
        let back: ProbeState = serde_json::from_value(serde_json::to_value(st).unwrap()).unwrap();
        // Restored at t1: the echo went 2 s ago, so the peer is dropped 3 s later.
        let t1 = t0 + 50 * s;
        let mut q = Probe::from_state(&back, t1);
        assert!(q.echo_outstanding());
        assert_eq!(q.poll(t1 + 2 * s), ProbeAction::Nothing);
        assert_eq!(q.poll(t1 + 3 * s), ProbeAction::Disconnect);
        // No echo out, idle 4 s: the echo goes 1 s after the takeover.
        let st = ProbeState {
            interval_ms: 5000,
            idle_ms: 4000,
            echo_ms: None,
        };
        let mut q = Probe::from_state(&st, t1);
        assert_eq!(q.poll(t1), ProbeAction::Nothing);
        assert_eq!(q.poll(t1 + s), ProbeAction::SendEcho);
        // Hostile: a 1 ms interval is raised to 5 s; times before this process's clock
        // count as now.
        let q = Probe::from_state(
            &ProbeState {
                interval_ms: 1,
                idle_ms: u64::MAX,
                echo_ms: Some(u64::MAX),
            },
            t1,
        );
        assert_eq!(q.interval(), Some(MIN_PROBE));

        let mut b = Backoff::new(DEFAULT_MAX_BACKOFF);
        b.attempt(t0);
        b.failed(t0);
        b.attempt(t0 + s);
        let st = b.state(t0 + s);
        assert_eq!(
            st,
            BackoffState {
                current_ms: 1000,
                deadline_ms: Some(1000)
            }
        );
        let mut c = Backoff::from_state(&st, DEFAULT_MAX_BACKOFF, t1);
        // Failing within the deadline doubles, as it would have in the old daemon.
        assert_eq!(c.failed(t1), 2 * s);
        // Hostile: a delay beyond max_backoff is cut to it, a deadline to the delay.
        let c = Backoff::from_state(
            &BackoffState {
                current_ms: u64::MAX,
                deadline_ms: Some(u64::MAX),
            },
            DEFAULT_MAX_BACKOFF,
            t1,
        );
        assert_eq!(c.current(), DEFAULT_MAX_BACKOFF);
    }

    #[test]
    fn roles_and_generations() {
        use ferrovs_openflow::message::role;
        let mut e = Election::default();
        // Equal never looks at the generation.
        assert_eq!(
            e.request(Role::Equal, role::EQUAL, 5),
            RoleDecision::Grant {
                role: Role::Equal,
                demote_others: false
            }
        );
        assert_eq!(e.id, None);
        assert_eq!(e.reply_id(), u64::MAX);
        assert_eq!(
            e.request(Role::Equal, role::MASTER, 10),
            RoleDecision::Grant {
                role: Role::Master,
                demote_others: true
            }
        );
        assert_eq!(e.reply_id(), 10);
        assert_eq!(e.request(Role::Equal, role::SLAVE, 9), RoleDecision::Stale);
        assert_eq!(
            e.request(Role::Equal, role::SLAVE, 10),
            RoleDecision::Grant {
                role: Role::Slave,
                demote_others: false
            }
        );
        // Serial number arithmetic: u64::MAX is older than 10... and 0 newer than MAX.
        assert_eq!(
            e.request(Role::Slave, role::MASTER, u64::MAX),
            RoleDecision::Stale
        );
        e.id = Some(u64::MAX);
        assert!(matches!(
            e.request(Role::Slave, role::MASTER, 0),
            RoleDecision::Grant { .. }
        ));
        // NOCHANGE reports the current role.
        assert_eq!(
            e.request(Role::Slave, role::NOCHANGE, 0),
            RoleDecision::Grant {
                role: Role::Slave,
                demote_others: false
            }
        );
        assert_eq!(e.request(Role::Slave, 7, 0), RoleDecision::BadRole);
    }

    #[test]
    fn fail_open_decisions() {
        let p = DEFAULT_PROBE;
        let s = Duration::from_secs(1);
        // Secure never; no controllers never (the default NORMAL rule does it then).
        assert!(!fail_open(FailMode::Secure, true, Some(100 * s), p));
        assert!(!fail_open(FailMode::Standalone, false, Some(100 * s), p));
        // Standalone: after three probe intervals without a controller.
        assert!(!fail_open(FailMode::Standalone, true, Some(14 * s), p));
        assert!(fail_open(FailMode::Standalone, true, Some(15 * s), p));
        assert!(!fail_open(FailMode::Standalone, true, None, p));
        // Probing off: one second.
        assert!(fail_open(
            FailMode::Standalone,
            true,
            Some(s),
            Duration::ZERO
        ));
    }

    #[test]
    fn protocols() {
        assert_eq!(
            protocol_versions(&["OpenFlow13".into(), "OpenFlow10".into()]).unwrap(),
            [4, 1]
        );
        assert!(protocol_versions(&["OpenFlow16".into()]).is_err());
    }
}
