//! `ferrovs capture`: the daemon's side of a capture.
//!
//! A `capture` request is the last its connection makes: once the port and the filter are
//! checked, a [`Tap`] is installed on the port's capture hook, the ok reply is queued, and
//! the connection leaves the control loop for a drainer thread of its own ([`drain`]). The
//! drainer swaps the tap's ring out every millisecond, writes each record as a JSON line
//! (non-blocking, into a buffer bounded by [`OUT_MAX`]: past it records are dropped and
//! counted as `client_drops`, so a client that does not read costs a bounded buffer and
//! never stalls anything), and ends with one `end` line when the capture stops: `--count`
//! reached, the port deleted (seen at the next tick), a hot upgrade or a shutdown (every
//! capture is stopped and its end line flushed before the daemon lets go), or the client
//! closing its end (no end line then). The tick removes stopped taps from their ports, so a
//! port is back to its one relaxed load per burst.

use std::sync::Weak;
use std::thread::JoinHandle;

use ferrovs_datapath::capture::{StopReason, Tap, TapConfig};
use ferrovs_proto::capture::{hex, CaptureEnd, CaptureEvent, CapturedPacket, Direction};
use ferrovs_proto::reply::CaptureStarted;

use super::*;

/// Bytes of JSON a drainer keeps for a client that does not read; past it, records are
/// dropped and counted.
pub(super) const OUT_MAX: usize = 4 << 20;
/// How often a drainer swaps its tap's ring out.
const DRAIN_EVERY: Duration = Duration::from_millis(1);
/// How long a drainer tries to deliver the end line to a client that does not read.
const END_DEADLINE: Duration = Duration::from_secs(1);

/// A capture the daemon runs.
#[derive(Debug)]
pub(super) struct CaptureRun {
    port: String,
    /// The port captured: a port deleted (or replaced) under the same name stops it.
    dp_port: Weak<Port>,
    tap: Arc<Tap>,
    thread: Option<JoinHandle<()>>,
}

/// Whether `line` is a `capture` request (then parsed).
pub(super) fn capture_request(line: &[u8]) -> Option<Request> {
    const TAG: &[u8] = b"\"capture\"";
    if !line.windows(TAG.len()).any(|w| w == TAG) {
        return None;
    }
    match serde_json::from_slice::<Request>(line) {
        Ok(r @ Request::Capture { .. }) => Some(r),
        _ => None,
    }
}

impl Daemon {
    /// Checks a capture request and installs its tap: the reply, the tap and the count.
    pub(super) fn start_capture(
        &mut self,
        req: Request,
    ) -> Result<(CaptureStarted, Arc<Tap>, Option<u64>), String> {
        let Request::Capture {
            port,
            direction,
            count,
            snaplen,
            filter,
        } = req
        else {
            return Err("not a capture request".into());
        };
        let ps = self
            .ports
            .get(&port)
            .ok_or_else(|| format!("no port {port:?}"))?;
        if count == Some(0) {
            return Err("count must be at least 1".into());
        }
        let snaplen = crate::capture::snaplen(snaplen)?;
        let program = crate::capture::compile(filter.as_deref().unwrap_or(""))
            .map_err(|e| with_sources(&e))?;
        let filter_insns = program.as_ref().map_or(0, |p| p.insns().len());
        let tap = Arc::new(Tap::new(TapConfig {
            capture_in: direction != Direction::Out,
            capture_out: direction != Direction::In,
            snaplen,
            filter: program,
        }));
        if !ps.port.capture.set(tap.clone()) {
            return Err(format!("port {port:?} is already being captured"));
        }
        self.captures.push(CaptureRun {
            port: port.clone(),
            dp_port: Arc::downgrade(&ps.port),
            tap: tap.clone(),
            thread: None,
        });
        log::info!(
            "capture on {port} started ({}, snaplen {snaplen}, {filter_insns} filter instructions)",
            direction.name()
        );
        let started = CaptureStarted {
            port,
            direction,
            snaplen,
            ring_slots: tap.spare_ring().slots(),
            filter_insns,
        };
        Ok((started, tap, count))
    }

    /// Hands the client's connection (with the bytes still to send it) to a drainer thread.
    pub(super) fn spawn_drainer(
        &mut self,
        stream: UnixStream,
        out: Vec<u8>,
        tap: Arc<Tap>,
        count: Option<u64>,
    ) {
        let Some(run) = self.captures.iter_mut().find(|r| Arc::ptr_eq(&r.tap, &tap)) else {
            return;
        };
        let t = tap.clone();
        match std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || drain(stream, out, t, count))
        {
            Ok(h) => run.thread = Some(h),
            Err(e) => {
                log::error!("capture on {}: cannot start its thread: {e}", run.port);
                tap.stop(StopReason::Shutdown);
            }
        }
    }

    /// The tick: stops captures whose port went away, takes stopped taps off their ports,
    /// and reaps finished drainers.
    pub(super) fn capture_tick(&mut self) {
        if self.captures.is_empty() {
            return;
        }
        for r in &self.captures {
            let alive = self
                .ports
                .get(&r.port)
                .is_some_and(|p| Weak::ptr_eq(&r.dp_port, &Arc::downgrade(&p.port)));
            if !alive {
                r.tap.stop(StopReason::PortDeleted);
            }
            if r.tap.stopped().is_some() {
                if let Some(p) = r.dp_port.upgrade() {
                    p.capture.clear(&r.tap);
                }
            }
        }
        self.captures.retain_mut(|r| {
            let done = r.thread.as_ref().is_none_or(|h| h.is_finished());
            if done {
                if let Some(h) = r.thread.take() {
                    let _ = h.join();
                }
                let s = &r.tap.stats;
                log::info!(
                    "capture on {} ended ({:?}): {} captured, {} filtered, {} drops",
                    r.port,
                    r.tap.stopped(),
                    s.captured.load(Ordering::Relaxed),
                    s.filtered.load(Ordering::Relaxed),
                    s.drops.load(Ordering::Relaxed)
                );
            }
            !done
        });
    }

    /// Stops every capture (a hot upgrade, a shutdown) and waits for their end lines to go
    /// out (each drainer gives up after [`END_DEADLINE`]).
    pub(super) fn stop_captures(&mut self, why: StopReason) {
        for r in &self.captures {
            r.tap.stop(why);
        }
        for r in &mut self.captures {
            if let Some(p) = r.dp_port.upgrade() {
                p.capture.clear(&r.tap);
            }
            if let Some(h) = r.thread.take() {
                let _ = h.join();
            }
        }
        self.captures.clear();
    }
}

/// What the user reads when a capture ends.
fn end_of(why: StopReason) -> (&'static str, &'static str) {
    match why {
        StopReason::Count => ("count", "the capture took the packets --count asked for"),
        StopReason::ClientClosed => ("client-closed", "the client closed the capture"),
        StopReason::PortDeleted => ("port-deleted", "the port was deleted"),
        StopReason::Upgrade => (
            "upgrade",
            "the daemon was hot-upgraded (captures do not survive an upgrade); start it again",
        ),
        StopReason::Shutdown => ("shutdown", "the daemon is shutting down"),
        StopReason::ClientSlow => ("client-slow", "the client did not read"),
    }
}

fn push_line(out: &mut Vec<u8>, ev: &CaptureEvent) {
    if serde_json::to_writer(&mut *out, ev).is_ok() {
        out.push(b'\n');
    }
}

/// Writes what it can of `out` without blocking; an error when the client is gone.
fn write_some(s: &mut UnixStream, out: &mut Vec<u8>) -> io::Result<()> {
    while !out.is_empty() {
        match s.write(out) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A capture's drainer thread (see the module's text).
fn drain(mut s: UnixStream, mut out: Vec<u8>, tap: Arc<Tap>, count: Option<u64>) {
    let _ = s.set_nonblocking(true);
    let mut spare = tap.spare_ring();
    let (mut sent, mut client_drops) = (0u64, 0u64);
    let mut scratch = [0u8; 256];
    loop {
        // Read before the swap: what was captured before a stop still goes out.
        let mut stopped = tap.stopped();
        tap.swap(&mut spare);
        for r in spare.records() {
            if count.is_some_and(|c| sent >= c) {
                break;
            }
            if out.len() >= OUT_MAX {
                client_drops += 1;
                continue;
            }
            push_line(
                &mut out,
                &CaptureEvent::Packet(CapturedPacket {
                    ts_ns: r.ts_ns,
                    dir_in: r.dir_in,
                    len: r.orig_len,
                    data: hex(&r.data),
                }),
            );
            sent += 1;
        }
        if count.is_some_and(|c| sent >= c) {
            tap.stop(StopReason::Count);
            stopped = tap.stopped();
        }
        // The client says nothing after its request: end of file is it leaving.
        let gone = match s.read(&mut scratch) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        };
        if gone || write_some(&mut s, &mut out).is_err() {
            tap.stop(StopReason::ClientClosed);
            return;
        }
        if let Some(why) = stopped {
            let st = &tap.stats;
            let (reason, message) = end_of(why);
            push_line(
                &mut out,
                &CaptureEvent::End(CaptureEnd {
                    reason: reason.into(),
                    message: message.into(),
                    captured: sent,
                    filtered: st.filtered.load(Ordering::Relaxed),
                    drops: st.drops.load(Ordering::Relaxed),
                    client_drops,
                }),
            );
            let deadline = Instant::now() + END_DEADLINE;
            while !out.is_empty() && Instant::now() < deadline {
                if write_some(&mut s, &mut out).is_err() {
                    break;
                }
                std::thread::sleep(DRAIN_EVERY);
            }
            return;
        }
        std::thread::sleep(DRAIN_EVERY);
    }
}
