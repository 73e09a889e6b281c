//! Rate-limited log lines.
//!
//! A frontend that reconnects in a loop, or a guest that keeps sending bad messages, must
//! not flood the daemon's log. Each line names a port (or `-` for the daemon itself) and a
//! reason (a short fixed tag such as `"disconnect"`); at most `burst` lines per port and
//! reason are logged per `interval`. Lines past that are counted, and one line reports how
//! many were suppressed once the interval is over (at the next line of that kind or at the
//! next [`LogLimiter::flush`], whichever comes first).
//!
//! Every line carries `port` and `reason` as key-value pairs (fields `FERROVS_PORT` and
//! `FERROVS_REASON` in the journal, `port` and `reason` in JSON; see [`crate::logging`]).
//! Lines left out are counted per limiter and in all ([`suppressed_total`], in `ferrovs
//! show --json` as `log_lines_suppressed`).
//!
//! Thread-safety: owned by the control thread (`&mut self`); no locking (the process-wide
//! total is an atomic).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static SUPPRESSED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// Lines every limiter of this process left out.
pub fn suppressed_total() -> u64 {
    SUPPRESSED_TOTAL.load(Ordering::Relaxed)
}

/// Lines per port and reason per interval, by default.
pub const DEFAULT_BURST: u32 = 5;
/// The default interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Window {
    level: log::Level,
    /// Where the last line of this kind came from.
    site: Site,
    start: Instant,
    logged: u32,
    suppressed: u64,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; first say that `suppressed` lines of its kind were left out before it (0:
    /// say nothing).
    Log { suppressed: u64 },
    /// Leave it out (counted).
    Suppress,
}

/// At most `burst` lines per (port, reason) per `interval`.
#[derive(Debug)]
pub struct LogLimiter {
    burst: u32,
    interval: Duration,
    windows: HashMap<(String, &'static str), Window>,
    suppressed: u64,
}

impl Default for LogLimiter {
    fn default() -> LogLimiter {
        LogLimiter::new(DEFAULT_BURST, DEFAULT_INTERVAL)
    }
}

impl LogLimiter {
    pub fn new(burst: u32, interval: Duration) -> LogLimiter {
        LogLimiter {
            burst,
            interval,
            windows: HashMap::new(),
            suppressed: 0,
        }
    }

    /// Lines this limiter left out.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// Decides about one line of `reason` for `port` at `now` (and counts it).
    pub fn check(
        &mut self,
        port: &str,
        reason: &'static str,
        level: log::Level,
        now: Instant,
    ) -> Verdict {
        let w = self
            .windows
            .entry((port.to_string(), reason))
            .or_insert(Window {
                level,
                site: Site {
                    module: module_path!(),
                    file: file!(),
                    line: line!(),
                },
                start: now,
                logged: 0,
                suppressed: 0,
            });
        let mut reported = 0;
        if now.duration_since(w.start) >= self.interval {
            reported = std::mem::take(&mut w.suppressed);
            w.start = now;
            w.logged = 0;
        }
        w.level = level;
        if w.logged < self.burst {
            w.logged += 1;
            Verdict::Log {
                suppressed: reported,
            }
        } else {
            w.suppressed += 1;
            self.suppressed += 1;
            SUPPRESSED_TOTAL.fetch_add(1, Ordering::Relaxed);
            Verdict::Suppress
        }
    }

    /// Logs `msg` as `PORT: MSG` unless the limit for `port` and `reason` is reached.
    #[track_caller]
    pub fn log(
        &mut self,
        level: log::Level,
        port: &str,
        reason: &'static str,
        msg: fmt::Arguments<'_>,
    ) {
        let at = std::panic::Location::caller();
        let site = Site {
            module: module_path!(),
            file: at.file(),
            line: at.line(),
        };
        self.log_from(site, level, port, reason, msg)
    }

    /// [`LogLimiter::log`] from `site` (the caller's module, file and line, which `limited!`
    /// passes: `ferrovs log-level MODULE LEVEL` applies to its lines, and the journal's
    /// CODE_FILE and CODE_LINE name it).
    pub fn log_from(
        &mut self,
        site: Site,
        level: log::Level,
        port: &str,
        reason: &'static str,
        msg: fmt::Arguments<'_>,
    ) {
        match self.check(port, reason, level, Instant::now()) {
            Verdict::Log { suppressed } => {
                if suppressed > 0 {
                    report_suppressed(site, level, port, reason, suppressed);
                }
                let kvs: [(&str, log::kv::Value<'_>); 2] =
                    [("port", port.into()), ("reason", reason.into())];
                emit(site, level, &kvs, format_args!("{port}: {msg}"));
            }
            Verdict::Suppress => {}
        }
        if let Some(w) = self.windows.get_mut(&(port.to_string(), reason)) {
            w.site = site;
        }
    }

    /// Reports the lines suppressed in intervals that are over, and forgets idle windows;
    /// returns how many (port, reason, suppressed) it reported.
    pub fn flush(&mut self, now: Instant) -> Vec<(String, &'static str, u64)> {
        let mut out = Vec::new();
        let interval = self.interval;
        self.windows.retain(|(port, reason), w| {
            if now.duration_since(w.start) < interval {
                return true;
            }
            if w.suppressed > 0 {
                report_suppressed(w.site, w.level, port, reason, w.suppressed);
                out.push((port.clone(), *reason, w.suppressed));
            }
            false
        });
        out
    }
}

/// Where a line comes from.
#[derive(Debug, Clone, Copy)]
pub struct Site {
    pub module: &'static str,
    pub file: &'static str,
    pub line: u32,
}

/// One line, with `kvs` as its key-value pairs, from `site`.
fn emit(
    site: Site,
    level: log::Level,
    kvs: &[(&str, log::kv::Value<'_>)],
    args: fmt::Arguments<'_>,
) {
    let meta = log::Metadata::builder()
        .level(level)
        .target(site.module)
        .build();
    let logger = log::logger();
    if level > log::max_level() || !logger.enabled(&meta) {
        return;
    }
    logger.log(
        &log::Record::builder()
            .metadata(meta)
            .module_path(Some(site.module))
            .file(Some(site.file))
            .line(Some(site.line))
            .key_values(&kvs)
            .args(args)
            .build(),
    );
}

fn report_suppressed(site: Site, level: log::Level, port: &str, reason: &str, n: u64) {
    let kvs: [(&str, log::kv::Value<'_>); 3] = [
        ("port", port.into()),
        ("reason", reason.into()),
        ("suppressed", n.into()),
    ];
    emit(
        site,
        level,
        &kvs,
        format_args!("{port}: {n} '{reason}' line(s) suppressed"),
    );
}

/// Logs through a [`LogLimiter`]: `limited!(limiter, Warn, port, "reason", "fmt", args..)`.
#[macro_export]
macro_rules! limited {
    ($lim:expr, $level:ident, $port:expr, $reason:expr, $($arg:tt)+) => {
        $lim.log_from(
            $crate::ratelimit::Site {
                module: module_path!(),
                file: file!(),
                line: line!(),
            },
            log::Level::$level,
            $port,
            $reason,
            format_args!($($arg)+),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Level::Warn;

    #[test]
    fn limits_per_port_and_reason_then_reports() {
        let mut l = LogLimiter::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            l.check("vm1", "disconnect", Warn, at(0)),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            l.check("vm1", "disconnect", Warn, at(1)),
            Verdict::Log { suppressed: 0 }
        );
        for i in 0..5 {
            assert_eq!(
                l.check("vm1", "disconnect", Warn, at(2 + i)),
                Verdict::Suppress
            );
        }
        // Another reason and another port have their own budget.
        assert_eq!(
            l.check("vm1", "reconnect", Warn, at(3)),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            l.check("vm2", "disconnect", Warn, at(3)),
            Verdict::Log { suppressed: 0 }
        );
        // Next interval: the count comes with the first line.
        assert_eq!(
            l.check("vm1", "disconnect", Warn, at(10_000)),
            Verdict::Log { suppressed: 5 }
        );
        assert_eq!(
            l.check("vm1", "disconnect", Warn, at(10_001)),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            l.check("vm1", "disconnect", Warn, at(10_002)),
            Verdict::Suppress
        );
        // Or with a flush once the interval is over, when no line comes.
        assert!(l.flush(at(15_000)).is_empty());
        assert_eq!(
            l.flush(at(20_002)),
            vec![("vm1".to_string(), "disconnect", 1)]
        );
        // Flushed windows start afresh.
        assert_eq!(
            l.check("vm1", "disconnect", Warn, at(20_003)),
            Verdict::Log { suppressed: 0 }
        );
    }
}
