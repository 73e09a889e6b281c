//! Rate-limited log lines.
//!
//! A frontend that reconnects in a loop, or a guest that keeps sending bad messages, must
//! not flood the daemon's log. Each line names a port (or `-` for the daemon itself) and a
//! reason (a short fixed tag such as `"disconnect"`); at most `burst` lines per port and
//! reason are logged per `interval`. Lines past that are counted, and one line reports how
//! many were suppressed once the interval is over (at the next line of that kind or at the
//! next [`LogLimiter::flush`], whichever comes first).
//!
//! Thread-safety: owned by the control thread (`&mut self`); no locking.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Lines per port and reason per interval, by default.
pub const DEFAULT_BURST: u32 = 5;
/// The default interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Window {
    level: log::Level,
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
        }
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
            Verdict::Suppress
        }
    }

    /// Logs `msg` as `PORT: MSG` unless the limit for `port` and `reason` is reached.
    pub fn log(
        &mut self,
        level: log::Level,
        port: &str,
        reason: &'static str,
        msg: fmt::Arguments<'_>,
    ) {
        match self.check(port, reason, level, Instant::now()) {
            Verdict::Log { suppressed } => {
                if suppressed > 0 {
                    log::log!(level, "{port}: {suppressed} '{reason}' line(s) suppressed");
                }
                log::log!(level, "{port}: {msg}");
            }
            Verdict::Suppress => {}
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
                log::log!(
                    w.level,
                    "{port}: {} '{reason}' line(s) suppressed",
                    w.suppressed
                );
                out.push((port.clone(), *reason, w.suppressed));
            }
            false
        });
        out
    }
}

/// Logs through a [`LogLimiter`]: `limited!(limiter, Warn, port, "reason", "fmt", args..)`.
#[macro_export]
macro_rules! limited {
    ($lim:expr, $level:ident, $port:expr, $reason:expr, $($arg:tt)+) => {
        $lim.log(log::Level::$level, $port, $reason, format_args!($($arg)+))
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
