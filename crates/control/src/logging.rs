//! ferrovsd's logger: levels per module that change at run time (`ferrovs log-level`), and
//! three output formats: text on stderr, one JSON object a line on stderr, or the systemd
//! journal's native protocol.
//!
//! * Levels: a default level and `module=level` directives, `RUST_LOG`-style (`warn,
//!   ferrovs_control::daemon=debug`); the longest module prefix that names a line's target
//!   wins. [`set_level`] changes one at run time; [`levels`] lists them.
//! * Text: `[2026-11-28T10:54:52.123Z WARN  ferrovs_control::daemon::sessions] vm1: ...`,
//!   as env_logger prints it (the format ferrovsd always had).
//! * JSON: `{"ts":"…","level":"WARN","target":"…","msg":"…","port":"vm1","reason":"…"}`:
//!   the key-value pairs a line carries (the rate limiter's `port` and `reason`) become
//!   fields.
//! * Journald: one datagram per line to the journal's socket (`/run/systemd/journal/socket`),
//!   `KEY=value` fields as <https://systemd.io/JOURNAL_NATIVE_PROTOCOL/> describes: `PRIORITY`,
//!   `MESSAGE`, `SYSLOG_IDENTIFIER`, `CODE_FILE`, `CODE_LINE`, `CODE_MODULE`, and `FERROVS_*`
//!   for the line's pairs (`FERROVS_PORT`, `FERROVS_REASON`). A value with a newline takes
//!   the binary form (name, newline, 64-bit little-endian length, value). The socket is
//!   non-blocking: a journal that does not keep up loses lines (counted in
//!   [`journal_dropped`]) instead of stalling the control thread. A message longer than
//!   [`JOURNAL_MAX_MESSAGE`] is cut (journald's memfd path for huge entries is left out).
//!
//! Why not the `systemd-journal-logger` crate: its logger owns the global `log` hook and a
//! fixed socket path, and the levels must change at run time and the tests must point the
//! output at a socket they bind; the protocol is a few lines of field encoding.
//!
//! Thread-safety: the logger is global (`log::set_logger`) and used from every thread; the
//! levels sit behind an `RwLock` taken for reading per enabled check, written only by
//! `ferrovs log-level`. PMD threads do not log per packet (drops are counters).

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The journal's native socket.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
/// A longer message is cut to this many bytes in a journal datagram.
pub const JOURNAL_MAX_MESSAGE: usize = 48 * 1024;

/// Where and how lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    /// The journal's native protocol to this datagram socket.
    Journald(PathBuf),
}

impl Format {
    /// `--log-format`: `text`, `json`, `journald` or `auto` (journald when stderr is the
    /// journal's stream, as `$JOURNAL_STREAM` says (`DEVICE:INODE` of stderr), else text).
    pub fn parse(s: &str) -> Result<Format, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            "journald" => Ok(Format::Journald(PathBuf::from(JOURNAL_SOCKET))),
            "auto" => Ok(if stderr_is_journal() {
                Format::Journald(PathBuf::from(JOURNAL_SOCKET))
            } else {
                Format::Text
            }),
            other => Err(format!(
                "unknown log format {other:?} (text, json, journald or auto)"
            )),
        }
    }
}

/// Whether `$JOURNAL_STREAM` names our stderr (systemd sets it for a unit whose
/// StandardError= is the journal; a child that inherits it with stderr redirected must not
/// believe it).
pub fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// A default level and per-module levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    pub default: LevelFilter,
    /// Module prefixes (`ferrovs_control::daemon`) and their levels, longest first.
    pub modules: Vec<(String, LevelFilter)>,
}

impl Levels {
    pub fn new(default: LevelFilter) -> Levels {
        Levels {
            default,
            modules: Vec::new(),
        }
    }

    /// Applies `RUST_LOG`-style directives: `level`, `module=level`, comma-separated.
    pub fn apply(&mut self, spec: &str) -> Result<(), String> {
        for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match d.split_once('=') {
                Some((m, l)) => self.set(Some(m.trim()), parse_level(l.trim())?),
                None => match parse_level(d) {
                    Ok(l) => self.set(None, l),
                    // `RUST_LOG=ferrovs_control` means that module at trace.
                    Err(_) => self.set(Some(d), LevelFilter::Trace),
                },
            }
        }
        Ok(())
    }

    /// Sets `module`'s level (`None`: the default).
    pub fn set(&mut self, module: Option<&str>, level: LevelFilter) {
        let Some(m) = module else {
            self.default = level;
            return;
        };
        match self.modules.iter_mut().find(|(n, _)| n == m) {
            Some(e) => e.1 = level,
            None => {
                self.modules.push((m.to_string(), level));
                self.modules
                    .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
            }
        }
    }

    /// The level for a line of `target`.
    pub fn level_of(&self, target: &str) -> LevelFilter {
        self.modules
            .iter()
            .find(|(m, _)| {
                target
                    .strip_prefix(m.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
            })
            .map_or(self.default, |(_, l)| *l)
    }

    /// The most verbose level anywhere (`log::set_max_level`).
    pub fn max(&self) -> LevelFilter {
        self.modules
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, std::cmp::max)
    }
}

/// A level by name (`off`, `error`, `warn`, `info`, `debug`, `trace`).
pub fn parse_level(s: &str) -> Result<LevelFilter, String> {
    s.parse::<LevelFilter>()
        .map_err(|_| format!("unknown log level {s:?} (off, error, warn, info, debug or trace)"))
}

#[derive(Debug)]
enum Sink {
    Stderr { json: bool },
    Journal { sock: UnixDatagram, path: PathBuf },
}

/// The logger.
#[derive(Debug)]
pub struct Logger {
    levels: RwLock<Levels>,
    sink: Sink,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();
static JOURNAL_DROPPED: AtomicU64 = AtomicU64::new(0);

impl Logger {
    /// A logger writing `format` with `levels`.
    pub fn new(format: &Format, levels: Levels) -> std::io::Result<Logger> {
        let sink = match format {
            Format::Text => Sink::Stderr { json: false },
            Format::Json => Sink::Stderr { json: true },
            Format::Journald(path) => {
                let sock = UnixDatagram::unbound()?;
                sock.set_nonblocking(true)?;
                Sink::Journal {
                    sock,
                    path: path.clone(),
                }
            }
        };
        Ok(Logger {
            levels: RwLock::new(levels),
            sink,
        })
    }

    fn levels(&self) -> std::sync::RwLockReadGuard<'_, Levels> {
        self.levels.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= self.levels().level_of(m.target())
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        match &self.sink {
            Sink::Stderr { json: false } => {
                let line = format!(
                    "[{} {:<5} {}] {}\n",
                    timestamp(SystemTime::now()),
                    r.level(),
                    r.target(),
                    r.args()
                );
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            Sink::Stderr { json: true } => {
                let mut line = json_line(r, SystemTime::now()).to_string();
                line.push('\n');
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            Sink::Journal { sock, path } => {
                if sock.send_to(&journal_entry(r), path).is_err() {
                    JOURNAL_DROPPED.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// Installs the logger for this process (once).
pub fn init(format: &Format, levels: Levels) -> Result<(), String> {
    let max = levels.max();
    let logger = Logger::new(format, levels).map_err(|e| format!("log output: {e}"))?;
    if LOGGER.set(logger).is_err() {
        return Err("the logger is already installed".into());
    }
    let l = LOGGER.get().ok_or("the logger is not installed")?;
    log::set_logger(l).map_err(|e| e.to_string())?;
    log::set_max_level(max);
    Ok(())
}

/// Changes a level at run time (`None`: the default); fails when this process logs
/// through another logger (a test harness).
pub fn set_level(module: Option<&str>, level: LevelFilter) -> Result<Levels, String> {
    let l = LOGGER
        .get()
        .ok_or("this process does not log through ferrovs's logger")?;
    let mut lv = l.levels.write().unwrap_or_else(|p| p.into_inner());
    lv.set(module, level);
    log::set_max_level(lv.max());
    Ok(lv.clone())
}

/// The levels in force.
pub fn levels() -> Result<Levels, String> {
    LOGGER
        .get()
        .map(|l| l.levels().clone())
        .ok_or_else(|| "this process does not log through ferrovs's logger".into())
}

/// Lines the journal did not take (its socket was full or gone).
pub fn journal_dropped() -> u64 {
    JOURNAL_DROPPED.load(Ordering::Relaxed)
}

/// `2026-11-28T10:54:52.123Z`.
pub fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// A line's key-value pairs, as strings.
fn pairs(r: &Record<'_>) -> Vec<(String, String)> {
    struct V(Vec<(String, String)>);
    impl<'k> log::kv::VisitSource<'k> for V {
        fn visit_pair(
            &mut self,
            k: log::kv::Key<'k>,
            v: log::kv::Value<'k>,
        ) -> Result<(), log::kv::Error> {
            self.0.push((k.to_string(), v.to_string()));
            Ok(())
        }
    }
    let mut v = V(Vec::new());
    let _ = r.key_values().visit(&mut v);
    v.0
}

/// One JSON line.
pub fn json_line(r: &Record<'_>, t: SystemTime) -> serde_json::Value {
    let mut o = serde_json::Map::new();
    o.insert("ts".into(), timestamp(t).into());
    o.insert("level".into(), r.level().as_str().into());
    o.insert("target".into(), r.target().into());
    o.insert("msg".into(), r.args().to_string().into());
    for (k, v) in pairs(r) {
        o.entry(k).or_insert(v.into());
    }
    serde_json::Value::Object(o)
}

/// syslog priority of a level.
fn priority(l: Level) -> u8 {
    match l {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// Appends one field in the native protocol's form.
fn field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    if value.contains(&b'\n') {
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        out.push(b'=');
    }
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// A journal field name for a pair's key: `FERROVS_` and the key upper-cased, anything but
/// `A-Z0-9_` as `_` (journald drops fields with other names).
fn journal_key(k: &str) -> String {
    let mut s = String::from("FERROVS_");
    s.extend(k.chars().map(|c| match c.to_ascii_uppercase() {
        c @ ('A'..='Z' | '0'..='9') => c,
        _ => '_',
    }));
    s
}

/// One journal entry (a datagram).
pub fn journal_entry(r: &Record<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    field(
        &mut out,
        "PRIORITY",
        priority(r.level()).to_string().as_bytes(),
    );
    let msg = r.args().to_string();
    let mut cut = msg.len().min(JOURNAL_MAX_MESSAGE);
    while !msg.is_char_boundary(cut) {
        cut -= 1;
    }
    field(&mut out, "MESSAGE", &msg.as_bytes()[..cut]);
    field(&mut out, "SYSLOG_IDENTIFIER", b"ferrovsd");
    field(&mut out, "TARGET", r.target().as_bytes());
    if let Some(f) = r.file() {
        field(&mut out, "CODE_FILE", f.as_bytes());
    }
    if let Some(l) = r.line() {
        field(&mut out, "CODE_LINE", l.to_string().as_bytes());
    }
    if let Some(m) = r.module_path() {
        field(&mut out, "CODE_MODULE", m.as_bytes());
    }
    for (k, v) in pairs(r) {
        field(&mut out, &journal_key(&k), v.as_bytes());
    }
    out
}

/// Parses a journal entry back into fields (for tests and tools): `KEY=value` lines and the
/// binary form; `None` when malformed.
pub fn parse_journal_entry(mut b: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let nl = b.iter().position(|c| *c == b'\n')?;
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|c| *c == b'=') {
            out.push((
                String::from_utf8(line[..eq].to_vec()).ok()?,
                line[eq + 1..].to_vec(),
            ));
            b = &b[nl + 1..];
        } else {
            let name = String::from_utf8(line.to_vec()).ok()?;
            let rest = &b[nl + 1..];
            let len = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?) as usize;
            let value = rest.get(8..8usize.checked_add(len)?)?;
            if rest.get(8 + len) != Some(&b'\n') {
                return None;
            }
            out.push((name, value.to_vec()));
            b = &rest[9 + len..];
        }
    }
    Some(out)
}

/// Where the journal socket is for `path` (tests bind their own).
pub fn journal_path(path: &Path) -> Format {
    Format::Journald(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(f: &'a [(String, Vec<u8>)], k: &str) -> Option<&'a str> {
        f.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
    }

    #[test]
    fn levels_by_longest_module_prefix() {
        let mut l = Levels::new(LevelFilter::Info);
        l.apply("warn,ferrovs_control=debug,ferrovs_control::daemon::ovsdb=error")
            .unwrap();
        assert_eq!(l.level_of("ferrovs_vhost::device"), LevelFilter::Warn);
        assert_eq!(l.level_of("ferrovs_control::daemon"), LevelFilter::Debug);
        assert_eq!(
            l.level_of("ferrovs_control::daemon::ovsdb"),
            LevelFilter::Error
        );
        // A prefix matches whole path segments only.
        assert_eq!(l.level_of("ferrovs_controlx"), LevelFilter::Warn);
        assert_eq!(l.max(), LevelFilter::Debug);
        l.set(Some("ferrovs_control"), LevelFilter::Off);
        assert_eq!(l.level_of("ferrovs_control::x"), LevelFilter::Off);
        assert_eq!(l.modules.len(), 2);
        assert!(l.apply("bogus=loud").unwrap_err().contains("loud"));
    }

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_863_292_123);
        assert_eq!(timestamp(t), "2026-11-28T10:54:52.123Z");
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(timestamp(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn json_and_journal_carry_port_and_reason() {
        let args = format_args!("vm1: line\nwith a newline");
        let kvs: [(&str, log::kv::Value<'_>); 2] =
            [("port", "vm1".into()), ("reason", "disconnect".into())];
        let r = Record::builder()
            .level(Level::Warn)
            .target("ferrovs_control::daemon::sessions")
            .file(Some("crates/control/src/daemon/sessions.rs"))
            .line(Some(42))
            .module_path(Some("ferrovs_control::daemon::sessions"))
            .key_values(&kvs)
            .args(args)
            .build();
        let j = json_line(&r, UNIX_EPOCH);
        assert_eq!(j["level"], "WARN");
        assert_eq!(j["port"], "vm1");
        assert_eq!(j["reason"], "disconnect");
        assert_eq!(j["msg"], "vm1: line\nwith a newline");
        let f = parse_journal_entry(&journal_entry(&r)).unwrap();
        assert_eq!(get(&f, "PRIORITY"), Some("4"));
        assert_eq!(get(&f, "MESSAGE"), Some("vm1: line\nwith a newline"));
        assert_eq!(get(&f, "FERROVS_PORT"), Some("vm1"));
        assert_eq!(get(&f, "FERROVS_REASON"), Some("disconnect"));
        assert_eq!(get(&f, "CODE_LINE"), Some("42"));
        assert_eq!(
            get(&f, "CODE_FILE"),
            Some("crates/control/src/daemon/sessions.rs")
        );
        assert_eq!(get(&f, "SYSLOG_IDENTIFIER"), Some("ferrovsd"));
        assert_eq!(journal_key("a-b.c"), "FERROVS_A_B_C");
        assert!(parse_journal_entry(b"MESSAGE\n\xff\xff\xff\xff\xff\xff\xff\xffx\n").is_none());
    }

    #[test]
    fn formats_by_name() {
        assert_eq!(Format::parse("json"), Ok(Format::Json));
        assert!(Format::parse("xml").unwrap_err().contains("xml"));
        // JOURNAL_STREAM naming another file is not the journal.
        assert!(matches!(Format::parse("text"), Ok(Format::Text)));
    }
}
