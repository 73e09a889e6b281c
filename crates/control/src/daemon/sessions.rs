//! vhost-user sessions: accepting (server mode) or connecting with backoff (client mode),
//! serving a frontend's messages, and dropping a connection that failed.

use super::*;

impl Daemon {
    /// Drops a port's vhost-user connection and resets its device.
    pub(super) fn disconnect(&mut self, name: &str, why: Option<String>) {
        let Some(p) = self.ports.get_mut(name) else {
            return;
        };
        if let Some((c, t)) = p.conn.take() {
            let _ = self.epoll.delete(c.as_fd());
            self.tokens.remove(&t);
            p.disconnects += 1;
            if let Some(w) = &why {
                if w == PEER_CLOSED {
                    limited!(
                        self.logs,
                        Info,
                        name,
                        "disconnect",
                        "vhost-user connection closed: {w}"
                    );
                } else {
                    limited!(
                        self.logs,
                        Warn,
                        name,
                        "disconnect",
                        "vhost-user connection closed: {w}"
                    );
                }
                p.last_error = Some(w.clone());
            }
        }
        let Some(device) = p.device.as_mut() else {
            return;
        };
        device.reset();
        p.link = match p.cfg.kind {
            PortType::VhostUserClient => Link::Reconnecting {
                at: Instant::now() + BACKOFF_MIN,
                backoff: BACKOFF_MIN,
            },
            _ => Link::Listening,
        };
        self.link_changed(name);
    }

    /// Logs each vhost-user queue a guest error broke, once per break (through the rate
    /// limiter: a guest that breaks its rings and resets in a loop cannot flood the log).
    /// The PMD that found the error only counted it.
    pub(super) fn log_broken_queues(&mut self) {
        for (name, p) in self.ports.iter_mut() {
            let Some(d) = p.device.as_ref() else {
                continue;
            };
            let mut now_broken = 0u64;
            for (i, q) in d.queues().iter().enumerate().take(64) {
                let Some(e) = q.lock().broken() else {
                    continue;
                };
                now_broken |= 1 << i;
                if p.broken_logged & (1 << i) == 0 {
                    limited!(
                        self.logs,
                        Warn,
                        name,
                        "guest-error",
                        "queue {i}: guest error: {e}; queue disabled until reset"
                    );
                }
            }
            p.broken_logged = now_broken;
        }
    }

    /// A port's link went up or down: a group bucket watching it must see that (the
    /// pipeline is rebuilt when a bridge's buckets watch ports).
    pub(super) fn link_changed(&mut self, name: &str) {
        let watched = self
            .ports
            .get(name)
            .and_then(|p| self.bridges.get(&p.bridge))
            .is_some_and(|b| b.rules.watches_ports());
        if watched {
            self.publish();
        }
    }

    pub(super) fn attach(&mut self, name: &str, stream: UnixStream) {
        let conn = match Conn::new(stream, true) {
            Ok(c) => c,
            Err(e) => {
                limited!(self.logs, Warn, name, "attach", "{e}");
                return;
            }
        };
        let t = self.token(Source::VhostConn, name);
        if let Err(e) = self.epoll.add(conn.as_fd(), t, false) {
            limited!(self.logs, Error, name, "epoll", "epoll: {e}");
            self.tokens.remove(&t);
            return;
        }
        if let Some(p) = self.ports.get_mut(name) {
            p.conn = Some((conn, t));
            p.link = Link::Connected;
            p.connects += 1;
        }
        self.link_changed(name);
    }

    pub(super) fn try_connect(&mut self, name: &str) {
        let Some(p) = self.ports.get_mut(name) else {
            return;
        };
        let Link::Reconnecting { backoff, .. } = p.link else {
            return;
        };
        let Some(path) = p.cfg.path.clone() else {
            return;
        };
        match UnixStream::connect(&path) {
            Ok(s) => self.attach(name, s),
            Err(e) => {
                let next = (backoff * 2).min(BACKOFF_MAX);
                let why = format!("connect {}: {e}", path.display());
                limited!(self.logs, Info, name, "reconnect", "{why}; retrying");
                p.last_error = Some(why);
                p.link = Link::Reconnecting {
                    at: Instant::now() + backoff,
                    backoff: next,
                };
            }
        }
    }

    pub(super) fn on_vhost_listener(&mut self, name: &str) {
        loop {
            let Some(p) = self.ports.get_mut(name) else {
                return;
            };
            let Some((l, _)) = &p.listener else { return };
            match l.accept() {
                Ok((s, _)) => {
                    if p.conn.is_some() {
                        // The previous frontend may have just gone (a quick driver reload or
                        // a reconnect racing our read of its hang-up): read what it left
                        // first, then decide.
                        let ev = EpollEvent {
                            readable: true,
                            ..Default::default()
                        };
                        self.on_vhost_conn(name, &ev);
                    }
                    let Some(p) = self.ports.get_mut(name) else {
                        return;
                    };
                    if p.conn.is_some() {
                        // One frontend per port: a second one is refused, the first goes on.
                        p.refused_connections += 1;
                        limited!(
                            self.logs,
                            Warn,
                            name,
                            "refused",
                            "refused a second vhost-user connection"
                        );
                        drop(s);
                        continue;
                    }
                    self.attach(name, s);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    limited!(self.logs, Warn, name, "accept", "accept: {e}");
                    return;
                }
            }
        }
    }

    /// Serves a vhost-user connection: at most a bounded number of messages per wake-up so
    /// that one chatty frontend cannot monopolise the control thread.
    pub(super) fn on_vhost_conn(&mut self, name: &str, ev: &EpollEvent) {
        let mut failure = None;
        {
            let Some(p) = self.ports.get_mut(name) else {
                return;
            };
            let Some((conn, _)) = p.conn.as_mut() else {
                return;
            };
            if ev.writable {
                if let Err(e) = conn.flush() {
                    failure = Some(e.to_string());
                }
            }
            for _ in 0..64 {
                if failure.is_some() {
                    break;
                }
                match conn.poll_message() {
                    Ok(Incoming::Message(h, payload, fds)) => {
                        let Some(device) = p.device.as_mut() else {
                            break;
                        };
                        if let Some(reply) = device.handle_message(&h, &payload, fds) {
                            let fds: Vec<_> = reply.fds.iter().map(|f| f.as_raw_fd()).collect();
                            if let Err(e) = conn.send(&reply.bytes, &fds) {
                                failure = Some(e.to_string());
                            }
                        }
                        if let Some(r) = device.take_refusal() {
                            limited!(self.logs, Warn, name, "refused-request", "{r}");
                        }
                        if let Some(mac) = device.take_announce() {
                            announce(&p.port, mac, &mut self.logs);
                        }
                    }
                    Ok(Incoming::Pending) => break,
                    Ok(Incoming::Closed) => {
                        failure = Some(PEER_CLOSED.into());
                    }
                    Err(e) => failure = Some(e.to_string()),
                }
            }
            for pmd in &self.pmds {
                pmd.wake();
            }
            if failure.is_none() {
                let w = conn.wants_write();
                let t = p.conn.as_ref().map(|c| c.1).unwrap_or(0);
                if let Some((c, _)) = p.conn.as_ref() {
                    let _ = self.epoll.modify(c.as_fd(), t, w);
                }
            }
        }
        if let Some(f) = failure {
            self.disconnect(name, Some(f));
        }
    }
}

/// SEND_RARP: the frontend (QEMU after a migration, for a guest that cannot announce
/// itself) asks us to announce `mac` from its port: a RARP enters the datapath as if the
/// guest had sent it, so every bridge and switch on the way learns where the guest now is.
pub(super) fn announce(port: &Port, mac: [u8; 6], logs: &mut LogLimiter) {
    port.inject_frame(&ferrovs_packet::rarp_announce(mac));
    limited!(
        logs,
        Info,
        &port.name,
        "announce",
        "announcing {} (SEND_RARP)",
        ferrovs_packet::mac_to_string(mac.iter().fold(0u64, |m, b| m << 8 | u64::from(*b)))
    );
}

/// The reason a connection closes when the frontend hung up (logged at info, not warn).
const PEER_CLOSED: &str = "peer closed the connection";
