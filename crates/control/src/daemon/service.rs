//! The daemon as a systemd service (`Type=notify`, `dist/ferrovsd.service`).
//!
//! * `READY=1` once the configuration is applied: `Daemon::start` has created every bridge,
//!   port and OpenFlow listener before the loop runs; with `--ovsdb`, also the database's
//!   first contents (the first reconfiguration after the initial sync). A daemon that took
//!   over at a hot upgrade is ready when the loop starts (its configuration came with the
//!   state), and says `MAINPID=` itself.
//! * `STATUS=` a one-line summary (bridges, ports, connected ports, PMDs), sent when it
//!   changes, checked once a second.
//! * `WATCHDOG=1` from the control loop's tick, at half the period systemd asks for: a
//!   control thread that stalls stops pinging, and systemd restarts the service.
//! * At a hot upgrade the old daemon, the main process, names the new one (`MAINPID=`)
//!   before it sends `bye` and exits, so systemd never sees its main process exit.
//! * `STOPPING=1` when shutting down.
//!
//! Nothing here can fail the daemon: a lost datagram is logged (rate-limited) and counted.
//! Thread-safety: control thread only.

use std::time::{Duration, Instant};

use super::{Daemon, Link};
use crate::limited;
use crate::sdnotify::{self, Notifier};

/// How often the status line is recomputed.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// What the daemon tells its service manager, and when it last did.
#[derive(Debug)]
pub(super) struct Service {
    notifier: Option<Notifier>,
    /// The watchdog period systemd asked for.
    watchdog: Option<Duration>,
    last_ping: Instant,
    /// This daemon took over at a hot upgrade (it is ready as soon as it runs).
    takeover: bool,
    ready: bool,
    status: String,
    last_status: Option<Instant>,
    /// Datagrams that could not be sent.
    pub send_errors: u64,
}

impl Default for Service {
    fn default() -> Service {
        Service {
            notifier: None,
            watchdog: None,
            last_ping: Instant::now(),
            takeover: false,
            ready: false,
            status: String::new(),
            last_status: None,
            send_errors: 0,
        }
    }
}

impl Daemon {
    /// Talks to the service manager `$NOTIFY_SOCKET` names, if any; `takeover`: this
    /// daemon took over at a hot upgrade (it accepts the watchdog period of the process
    /// that started it, and names itself the main process).
    pub fn attach_service_manager(&mut self, takeover: bool) {
        let notifier = match Notifier::from_env() {
            None => return,
            Some(Ok(n)) => n,
            Some(Err(e)) => {
                log::error!("service manager: {e}; not notifying");
                return;
            }
        };
        let watchdog = sdnotify::watchdog_from_env(takeover);
        log::info!(
            "service manager at {}{}",
            notifier.addr(),
            watchdog.map_or(String::new(), |w| format!(", watchdog {w:?}"))
        );
        self.service = Service {
            notifier: Some(notifier),
            watchdog,
            takeover,
            ..Service::default()
        };
    }

    /// The configuration is applied: everything `start` creates, and the database's first
    /// contents when configured through OVSDB.
    fn configured(&self) -> bool {
        self.service.takeover || self.ovsdb.as_deref().is_none_or(|l| l.applies > 0)
    }

    fn notify(&mut self, msg: &str) {
        let Some(n) = &self.service.notifier else {
            return;
        };
        if let Err(e) = n.send(msg) {
            self.service.send_errors += 1;
            limited!(
                self.logs,
                Warn,
                "-",
                "sd_notify",
                "service manager at {}: {e}",
                n.addr()
            );
        }
    }

    fn status_text(&self) -> String {
        let connected = self
            .ports
            .values()
            .filter(|p| matches!(p.link, Link::Connected | Link::Attached))
            .count();
        format!(
            "{} bridges, {} ports ({} connected), {} PMDs",
            self.bridges.len(),
            self.ports.len(),
            connected,
            self.pmds.len()
        )
    }

    /// Called from the loop's start and every tick: readiness, the watchdog, the status.
    pub(super) fn service_tick(&mut self) {
        if self.service.notifier.is_none() {
            return;
        }
        let now = Instant::now();
        if !self.service.ready && self.configured() {
            self.service.ready = true;
            self.service.status = self.status_text();
            self.service.last_status = Some(now);
            let mut msg = format!(
                "READY=1\nSTATUS={}",
                sdnotify::status_line(&self.service.status)
            );
            if self.service.takeover {
                msg = format!("MAINPID={}\n{msg}", std::process::id());
            }
            self.notify(&msg);
            log::info!("service manager: ready ({})", self.service.status);
        } else if self.service.ready
            && self
                .service
                .last_status
                .is_none_or(|t| now.duration_since(t) >= STATUS_EVERY)
        {
            self.service.last_status = Some(now);
            let s = self.status_text();
            if s != self.service.status {
                self.notify(&format!("STATUS={}", sdnotify::status_line(&s)));
                self.service.status = s;
            }
        }
        if let Some(w) = self.service.watchdog {
            if now.duration_since(self.service.last_ping) >= w / 2 {
                self.service.last_ping = now;
                self.notify("WATCHDOG=1");
            }
        }
    }

    /// The old daemon at a hot upgrade, before its last message: the new daemon `pid` is
    /// the service's main process from now on.
    pub(super) fn service_handing_over(&mut self, pid: i32) {
        self.notify(&format!(
            "MAINPID={pid}\nSTATUS=handed over to pid {pid} (hot upgrade)"
        ));
    }

    /// Shutting down.
    pub(super) fn service_stopping(&mut self) {
        self.notify("STOPPING=1\nSTATUS=stopping");
    }
}
