//! Control-socket clients: per-client buffers with backpressure, one JSON request per line,
//! and the dispatch of each request.

use ferrovs_proto::reply::{self, UpgradeReport};
use ferrovs_proto::Reply;

use super::capture;
use super::*;

impl Daemon {
    pub(super) fn on_ctl_listener(&mut self) {
        loop {
            match self.ctl.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let t = self.token(Source::CtlClient, "");
                    if self.epoll.add(s.as_fd(), t, false).is_err() {
                        self.tokens.remove(&t);
                        continue;
                    }
                    self.clients.insert(
                        t,
                        CtlClient {
                            stream: s,
                            inbuf: Vec::new(),
                            scanned: 0,
                            out: Vec::new(),
                            closing: false,
                        },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return,
            }
        }
    }

    pub(super) fn on_ctl_client(&mut self, t: u64, ev: &EpollEvent) {
        let Some(mut c) = self.clients.remove(&t) else {
            return;
        };
        let mut eof = false;
        if ev.readable || ev.hangup {
            let mut buf = [0u8; 65536];
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        c.inbuf.extend_from_slice(&buf[..n]);
                        if c.inbuf.len() > MAX_REQUEST {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        eof = true;
                        break;
                    }
                }
            }
        }
        // Backpressure: while a client has 1 MiB of replies unread, its further requests wait
        // in its buffer; they are handled once it reads (a writable event) or here, when the
        // reply went out at once.
        loop {
            let mut backlog = false;
            loop {
                if c.out.len() >= 1 << 20 {
                    backlog = true;
                    break;
                }
                let Some(off) = c.inbuf[c.scanned..].iter().position(|b| *b == b'\n') else {
                    c.scanned = c.inbuf.len();
                    break;
                };
                let pos = c.scanned + off;
                let line: Vec<u8> = c.inbuf.drain(..=pos).collect();
                c.scanned = 0;
                if let Some(req) = capture::capture_request(&line) {
                    // A capture is the connection's last request: it streams from a thread.
                    match self.start_capture(req) {
                        Ok((started, tap, count)) => {
                            let ok = Response::ok(Reply::CaptureStarted(started));
                            let r = serde_json::to_string(&ok).unwrap_or_default();
                            c.out.extend_from_slice(r.as_bytes());
                            c.out.push(b'\n');
                            let _ = self.epoll.delete(c.stream.as_fd());
                            self.tokens.remove(&t);
                            self.spawn_drainer(c.stream, c.out, tap, count);
                            return;
                        }
                        Err(e) => {
                            self.bad_requests += 1;
                            let r = serde_json::to_string(&Response::<Reply>::err(e))
                                .unwrap_or_default();
                            c.out.extend_from_slice(r.as_bytes());
                            c.out.push(b'\n');
                            continue;
                        }
                    }
                }
                let resp = self.handle_line(&line[..line.len() - 1]);
                c.out.extend_from_slice(resp.as_bytes());
                c.out.push(b'\n');
            }
            if !backlog && c.inbuf.len() > MAX_REQUEST {
                self.bad_requests += 1;
                let r = serde_json::to_string(&Response::<Reply>::err(format!(
                    "request too long (over {} MiB)",
                    MAX_REQUEST >> 20
                )))
                .unwrap_or_default();
                c.out.extend_from_slice(r.as_bytes());
                c.out.push(b'\n');
                c.inbuf.clear();
                c.scanned = 0;
                c.closing = true;
            }
            if !backlog && eof && !c.inbuf.is_empty() {
                // A last request without a newline.
                let line = std::mem::take(&mut c.inbuf);
                c.scanned = 0;
                let resp = self.handle_line(&line);
                c.out.extend_from_slice(resp.as_bytes());
                c.out.push(b'\n');
            }
            while !c.out.is_empty() {
                match c.stream.write(&c.out) {
                    Ok(n) => {
                        c.out.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        c.out.clear();
                        c.inbuf.clear();
                        eof = true;
                        break;
                    }
                }
            }
            if !(backlog && c.out.is_empty()) {
                break;
            }
        }
        // A reply may be large (dump-flows of 100 000 rules: ~20 MiB); past this, the client
        // is not reading and is dropped.
        if (eof || c.closing) && c.out.is_empty() || c.out.len() > 256 << 20 {
            let _ = self.epoll.delete(c.stream.as_fd());
            self.tokens.remove(&t);
            return;
        }
        let _ = self.epoll.modify(c.stream.as_fd(), t, !c.out.is_empty());
        self.clients.insert(t, c);
    }

    pub(super) fn handle_line(&mut self, line: &[u8]) -> String {
        let resp = match serde_json::from_slice::<Request>(line) {
            Ok(req) => self.handle(req),
            Err(e) => Response::err(format!("malformed request: {e}")),
        };
        if !resp.ok {
            self.bad_requests += 1;
        }
        serde_json::to_string(&resp).unwrap_or_else(|_| r#"{"ok":false,"error":"internal"}"#.into())
    }

    /// Handles one control request (also usable in-process by tests).
    pub fn handle(&mut self, req: Request) -> Response<Reply> {
        let changed = matches!(
            req,
            Request::AddBridge { .. }
                | Request::DelBridge { .. }
                | Request::AddPort { .. }
                | Request::DelPort { .. }
                | Request::SetPort { .. }
                | Request::ConfigSet { .. }
                | Request::AddFlows { .. }
                | Request::DelFlows { .. }
                | Request::SetController { .. }
                | Request::DelController { .. }
                | Request::SetBridge { .. }
                | Request::AddMeter { .. }
                | Request::ModMeter { .. }
                | Request::DelMeters { .. }
                | Request::AddGroup { .. }
                | Request::DelGroups { .. }
        );
        if let (Some(o), true) = (&self.ovsdb, changed) {
            let managed = matches!(
                req,
                Request::AddBridge { .. }
                    | Request::DelBridge { .. }
                    | Request::AddPort { .. }
                    | Request::DelPort { .. }
                    | Request::SetPort { .. }
                    | Request::SetController { .. }
                    | Request::DelController { .. }
                    | Request::SetBridge { .. }
            );
            if managed {
                let how = match req {
                    Request::SetController { .. } => " set-controller",
                    Request::DelController { .. } => " del-controller",
                    Request::SetBridge { .. } => {
                        " (set-fail-mode, set bridge BRIDGE protocols=... \
                         other_config:datapath-id=..., set controller ... max_backoff=...)"
                    }
                    _ => "",
                };
                let what = if how.is_empty() {
                    "bridges and ports"
                } else {
                    "OpenFlow controllers and bridge settings"
                };
                return Response::err(format!(
                    "{what} are configured through OVSDB ({}): use ovs-vsctl{how}",
                    o.remote
                ));
            }
        }
        let r = match req {
            Request::Show => Ok(Reply::Show(Box::new(self.show()))),
            Request::Version => Ok(Reply::Version(reply::Version {
                version: env!("CARGO_PKG_VERSION").into(),
            })),
            Request::AddBridge { bridge } => self.add_bridge(&bridge).map(|_| Reply::Done),
            Request::DelBridge { bridge } => self.del_bridge(&bridge).map(|_| Reply::Done),
            Request::AddPort {
                bridge,
                port,
                options,
            } => options::port_from_options(&port, &options)
                .and_then(|p| self.add_port(&bridge, p))
                .map(|_| Reply::Done),
            Request::DelPort { bridge, port } => self.del_port(&bridge, &port).map(|_| Reply::Done),
            Request::SetPort { port, options } => {
                self.set_port(&port, &options).map(|_| Reply::Done)
            }
            Request::PortStats { port } => self.port_stats(port.as_deref()).map(Reply::PortStats),
            Request::PmdStats => Ok(Reply::PmdStats(self.pmd_stats())),
            Request::PmdRebalance => self.pmd_rebalance().map(|_| Reply::Done),
            Request::PmdStatsClear => {
                self.pmd_baseline = self
                    .pmds
                    .iter()
                    .map(|p| report::PmdCounters::read(&p.stats))
                    .collect();
                for p in &self.pmds {
                    p.stats
                        .quiet_gap_clear
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Reply::Done)
            }
            Request::MacTable { bridge } => self.mac_table(&bridge).map(Reply::MacTable),
            Request::ConfigGet { key } => self.config_get(key.as_deref()).map(Reply::ConfigGet),
            Request::ConfigSet { key, value } => self.config_set(&key, &value).map(|_| Reply::Done),
            Request::UpgradeHistory { last } => Ok(Reply::UpgradeHistory(
                self.upgrade_reports(last.unwrap_or(20)),
            )),
            Request::AddFlows { bridge, flows } => {
                self.add_flows(&bridge, &flows).map(Reply::AddFlows)
            }
            Request::DelFlows {
                bridge,
                filter,
                strict,
            } => self
                .del_flows(&bridge, filter.as_deref().unwrap_or(""), strict)
                .map(Reply::DelFlows),
            Request::DumpFlows { bridge, filter } => self
                .dump_flows(&bridge, filter.as_deref())
                .map(Reply::DumpFlows),
            Request::DumpMegaflows { bridge } => {
                self.dump_megaflows(&bridge).map(Reply::DumpMegaflows)
            }
            Request::SetController { bridge, targets } => {
                self.set_controllers(&bridge, &targets).map(|_| Reply::Done)
            }
            Request::DelController { bridge } => {
                self.set_controllers(&bridge, &[]).map(|_| Reply::Done)
            }
            Request::GetController { bridge } => self
                .config
                .bridges
                .iter()
                .find(|b| b.name == bridge)
                .map(|b| Reply::Controllers(b.controllers.clone()))
                .ok_or_else(|| ConfigError::Invalid(format!("no bridge named {bridge}"))),
            Request::SetBridge { bridge, options } => {
                self.set_bridge(&bridge, &options).map(|_| Reply::Done)
            }
            Request::AddMeter { bridge, meter } => self
                .cli_set_meter(&bridge, &meter, false)
                .map(|_| Reply::Done),
            Request::ModMeter { bridge, meter } => self
                .cli_set_meter(&bridge, &meter, true)
                .map(|_| Reply::Done),
            Request::DelMeters { bridge, meter } => {
                self.cli_del_meters(&bridge, meter).map(|_| Reply::Done)
            }
            Request::DumpMeters { bridge, meter } => {
                self.dump_meters(&bridge, meter).map(Reply::DumpMeters)
            }
            Request::MeterStats { bridge, meter } => {
                self.meter_stats(&bridge, meter).map(Reply::MeterStats)
            }
            Request::AddGroup {
                bridge,
                group,
                modify,
            } => self.add_group(&bridge, &group, modify).map(|_| Reply::Done),
            Request::DelGroups { bridge, group } => {
                self.del_groups(&bridge, group).map(Reply::DelGroups)
            }
            Request::DumpGroups { bridge } => self.dump_groups(&bridge).map(Reply::DumpGroups),
            Request::DumpConntrack { zone } => Ok(Reply::DumpConntrack(self.dump_conntrack(zone))),
            Request::FlushConntrack { zone } => {
                Ok(Reply::FlushConntrack(self.flush_conntrack(zone)))
            }
            Request::Capture { .. } => Err(ConfigError::Invalid(
                "capture streams its packets: send it as a connection's request (ferrovs capture)"
                    .into(),
            )),
            Request::ConntrackStats => Ok(Reply::ConntrackStats(Box::new(self.conntrack_stats()))),
            Request::Trace {
                bridge,
                flow,
                packet,
                in_port,
                ct_next,
            } => self
                .trace(
                    &bridge,
                    flow.as_deref(),
                    packet.as_deref(),
                    in_port.as_deref(),
                    &ct_next,
                )
                .map(|t| Reply::Trace(Box::new(t))),

            Request::LogLevel { module, level } => log_level(module.as_deref(), level.as_deref())
                .map(Reply::LogLevels)
                .map_err(ConfigError::Invalid),
        };
        match r {
            Ok(v) => {
                if changed {
                    self.save();
                }
                Response::ok(v)
            }
            Err(e) => Response::err(e),
        }
    }

    pub(super) fn config_set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        if key == "pmd-cores" {
            let cores = config::parse_cores(value)?;
            let allowed = &self.all_cpus;
            if let Some(c) = cores.iter().find(|c| !allowed.contains(c)) {
                return Err(ConfigError::Invalid(format!(
                    "pmd-cores: core {c} is not available (allowed: {allowed:?})"
                )));
            }
            self.config.pmd_cores = cores;
            self.start_pmds()
                .map_err(|e| ConfigError::Invalid(format!("cannot start PMD threads: {e}")))?;
            return Ok(());
        }
        config::validate_setting(key, value)?;
        self.config.other.insert(key.into(), value.into());
        if key == "pmd-rx-mode"
            || key == "pmd-sleep-after-us"
            || key == "pmd-sleep-max-us"
            || key == "pmd-quiet-rxq-poll-us"
        {
            self.apply_rx_mode();
        }
        if key == "pmd-priority" {
            self.start_pmds()
                .map_err(|e| ConfigError::Invalid(format!("cannot start PMD threads: {e}")))?;
        }
        if key == "flow-limit" {
            self.apply_flow_limit();
        }
        if key == "emc-insert-inv-prob" {
            self.apply_rx_mode();
        }
        if key.starts_with("ct-") {
            self.apply_conntrack_config();
        }
        if key == "vhost-packed-rings" {
            let on = self.config.packed_rings();
            for p in self.ports.values_mut() {
                if let Some(d) = &mut p.device {
                    d.set_packed_rings(on);
                }
            }
        }
        if key == "mac-aging" {
            let secs = self.config.setting_u32("mac-aging", 300);
            for b in self.bridges.values() {
                b.macs.set_aging(secs);
            }
        }
        Ok(())
    }

    /// The last `n` takeovers, typed (a record this version cannot read is left out).
    fn upgrade_reports(&self, n: usize) -> Vec<UpgradeReport> {
        match self.upgrade_history(n) {
            Value::Array(all) => all
                .into_iter()
                .filter_map(|r| serde_json::from_value(r).ok())
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// `log-level [MODULE] [LEVEL]`: sets a level (when given), then lists them.
fn log_level(module: Option<&str>, level: Option<&str>) -> Result<reply::LogLevels, String> {
    use crate::logging;
    let lv = match level {
        Some(l) => {
            let l = logging::parse_level(l)?;
            let lv = logging::set_level(module.filter(|m| !m.is_empty()), l)?;
            log::info!(
                "log level of {} set to {l}",
                module.unwrap_or("everything else")
            );
            lv
        }
        None if module.is_some() => return Err("log-level: a module needs a level".into()),
        None => logging::levels()?,
    };
    Ok(reply::LogLevels {
        default: lv.default.to_string().to_lowercase(),
        modules: lv
            .modules
            .iter()
            .map(|(m, l)| (m.clone(), l.to_string().to_lowercase()))
            .collect(),
    })
}
