//! A minimal HTTP/1.x server for one thing: `GET /metrics`.
//!
//! Why not a crate: the maintained synchronous servers (tiny_http, rouille on it) give no
//! deadline for a whole request nor a bound on its size, and the rest (hyper, axum, warp)
//! bring an async runtime into a daemon that has none. What a scraper needs is small, and
//! what a hostile one must not get is easy to state, so it is written here:
//!
//! * Its own threads: an accept thread and one thread per connection, at most
//!   [`Limits::max_connections`] at once (more are closed at once). Nothing runs on the
//!   PMD threads or on the control thread; a scrape asks the control socket, as `ferrovs`
//!   does, so a scraper costs the control thread what a CLI command costs.
//! * A request must arrive whole within [`Limits::request_timeout`] and be at most
//!   [`Limits::max_request`] bytes (request line and headers; a body is never read); the
//!   answer must be taken within [`Limits::write_timeout`]. Past that the connection is
//!   closed: a slow or silent client holds one connection slot for a bounded time.
//! * One request per connection (`Connection: close`), as Prometheus is happy with.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the server answers `GET /metrics` with: the body, or why there is none (503).
pub type Source = dyn Fn() -> Result<String, String> + Send + Sync;

/// Bounds on what one client may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Bytes of request line and headers.
    pub max_request: usize,
    /// From accept to the end of the headers.
    pub request_timeout: Duration,
    /// For the whole answer to be written.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 4,
            max_request: 8192,
            request_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters of the server itself (for tests and the log).
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Requests answered (any status).
    pub answered: AtomicU64,
    /// Connections closed for being too slow, too big or malformed, or over the limit.
    pub refused: AtomicU64,
    /// Connections being served now.
    pub active: AtomicUsize,
}

/// A running server: its address and counters. Its threads live as long as the process.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stats: Arc<ServerStats>,
}

impl Server {
    /// Binds `addr` and serves on a thread of its own.
    pub fn start(addr: SocketAddr, limits: Limits, source: Arc<Source>) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        Server::serve(listener, limits, source)
    }

    /// Serves on a bound listener.
    pub fn serve(listener: TcpListener, limits: Limits, source: Arc<Source>) -> io::Result<Server> {
        let addr = listener.local_addr()?;
        let stats = Arc::new(ServerStats::default());
        let st = stats.clone();
        std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || accept_loop(listener, limits, source, st))?;
        Ok(Server { addr, stats })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }
}

fn accept_loop(
    listener: TcpListener,
    limits: Limits,
    source: Arc<Source>,
    stats: Arc<ServerStats>,
) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and the like: do not spin.
                log::warn!("metrics: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if stats.active.load(Ordering::Acquire) >= limits.max_connections {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        stats.active.fetch_add(1, Ordering::AcqRel);
        let (source, stats2) = (source.clone(), stats.clone());
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let mut stream = stream;
                let counter = if serve_one(&mut stream, &limits, &*source) {
                    &stats2.answered
                } else {
                    &stats2.refused
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // The slot is free before the client sees the end of the answer: a scraper
                // that asks again at once is not refused.
                stats2.active.fetch_sub(1, Ordering::AcqRel);
                let _ = stream.shutdown(std::net::Shutdown::Write);
            });
        if let Err(e) = spawned {
            log::warn!("metrics: cannot start a connection thread: {e}");
            stats.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What a request asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    Metrics { head: bool },
    Index { head: bool },
    NotFound,
    BadMethod,
}

/// Why a request was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    TooLarge,
    Malformed,
    /// Timed out, closed early, or another I/O error: nothing to answer.
    Gone,
}

/// Serves one connection; false if it was closed without an answer, or answered with an
/// error status.
fn serve_one(s: &mut TcpStream, limits: &Limits, source: &Source) -> bool {
    let asked = match read_request(s, limits) {
        Ok(a) => a,
        Err(ReadError::Gone) => return false,
        Err(ReadError::TooLarge) => {
            let _ = respond(
                s,
                limits,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
                false,
            );
            return false;
        }
        Err(ReadError::Malformed) => {
            let _ = respond(
                s,
                limits,
                "400 Bad Request",
                "text/plain",
                b"bad request\n",
                false,
            );
            return false;
        }
    };
    let ok = match asked {
        Asked::Metrics { head } => match source() {
            Ok(body) => respond(
                s,
                limits,
                "200 OK",
                crate::exposition::CONTENT_TYPE,
                body.as_bytes(),
                head,
            ),
            Err(e) => {
                let body = format!("cannot read the daemon's counters: {e}\n");
                let _ = respond(
                    s,
                    limits,
                    "503 Service Unavailable",
                    "text/plain",
                    body.as_bytes(),
                    head,
                );
                return false;
            }
        },
        Asked::Index { head } => respond(
            s,
            limits,
            "200 OK",
            "text/plain; charset=utf-8",
            b"ferrovsd metrics: GET /metrics\n",
            head,
        ),
        Asked::NotFound => {
            let _ = respond(
                s,
                limits,
                "404 Not Found",
                "text/plain",
                b"not found: GET /metrics\n",
                false,
            );
            return false;
        }
        Asked::BadMethod => {
            let _ = respond(
                s,
                limits,
                "405 Method Not Allowed",
                "text/plain",
                b"GET only\n",
                false,
            );
            return false;
        }
    };
    ok.is_ok()
}

/// Reads the request line and headers within the deadline and the size bound.
fn read_request(s: &mut TcpStream, limits: &Limits) -> Result<Asked, ReadError> {
    let deadline = Instant::now() + limits.request_timeout;
    let mut buf = vec![0u8; limits.max_request];
    let mut len = 0;
    loop {
        if let Some(end) = head_end(&buf[..len]) {
            return parse_head(&buf[..end]);
        }
        if len == buf.len() {
            return Err(ReadError::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Gone);
        }
        s.set_read_timeout(Some(left))
            .map_err(|_| ReadError::Gone)?;
        match s.read(&mut buf[len..]) {
            Ok(0) => return Err(ReadError::Gone),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(ReadError::Gone),
        }
    }
}

/// The end of the headers (the blank line), if it has arrived.
pub fn head_end(b: &[u8]) -> Option<usize> {
    b.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| b.windows(2).position(|w| w == b"\n\n"))
}

/// What a request's head (bytes before the blank line; untrusted) asks for: its request
/// line is checked, its headers are not needed.
pub fn parse_head(head: &[u8]) -> Result<Asked, ReadError> {
    let head = std::str::from_utf8(head).map_err(|_| ReadError::Malformed)?;
    let line = head.lines().next().ok_or(ReadError::Malformed)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed);
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Malformed);
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Ok(Asked::BadMethod),
    };
    let path = target.split('?').next().unwrap_or("");
    Ok(match path {
        "/metrics" => Asked::Metrics { head },
        "/" => Asked::Index { head },
        _ => Asked::NotFound,
    })
}

fn respond(
    s: &mut TcpStream,
    limits: &Limits,
    status: &str,
    content_type: &str,
    body: &[u8],
    head: bool,
) -> io::Result<()> {
    s.set_write_timeout(Some(limits.write_timeout))?;
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // The write timeout bounds each write; a client that takes a little at a time is also
    // bounded by a deadline on the whole answer.
    let deadline = Instant::now() + limits.write_timeout;
    let mut all = header.into_bytes();
    if !head {
        all.extend_from_slice(body);
    }
    let mut at = 0;
    while at < all.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_write_timeout(Some(left))?;
        match s.write(&all[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    fn server(limits: Limits) -> Server {
        let src: Arc<Source> = Arc::new(|| Ok("ferrovs_up 1\n".to_string()));
        Server::start("127.0.0.1:0".parse().unwrap(), limits, src).unwrap()
    }

    fn get(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn quick() -> Limits {
        Limits {
            max_connections: 2,
            max_request: 256,
            request_timeout: Duration::from_millis(300),
            write_timeout: Duration::from_millis(300),
        }
    }

    #[test]
    fn requests_parse_as_asked() {
        let p = |s: &str| parse_head(s.as_bytes());
        assert_eq!(
            p("GET /metrics HTTP/1.1\r\nHost: x"),
            Ok(Asked::Metrics { head: false })
        );
        assert_eq!(
            p("HEAD /metrics?x=1 HTTP/1.0"),
            Ok(Asked::Metrics { head: true })
        );
        assert_eq!(p("GET / HTTP/1.1"), Ok(Asked::Index { head: false }));
        assert_eq!(p("GET /other HTTP/1.1"), Ok(Asked::NotFound));
        assert_eq!(p("POST /metrics HTTP/1.1"), Ok(Asked::BadMethod));
        for bad in [
            "GET /metrics",
            "GET /metrics HTTP/2",
            "GET  /metrics HTTP/1.1",
            "",
            "\u{0}",
        ] {
            assert_eq!(p(bad), Err(ReadError::Malformed), "{bad:?}");
        }
        assert_eq!(parse_head(b"GET /\xff HTTP/1.1"), Err(ReadError::Malformed));
    }

    #[test]
    fn a_scrape_gets_the_body_with_the_content_type() {
        let srv = server(quick());
        let out = get(
            srv.local_addr(),
            b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(
            out.contains("Content-Type: text/plain; version=0.0.4"),
            "{out}"
        );
        assert!(out.contains("Content-Length: 13\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nferrovs_up 1\n"), "{out}");
        let out = get(srv.local_addr(), b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("\r\n\r\n"),
            "{out}"
        );
        let out = get(srv.local_addr(), b"GET /nope HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        let out = get(srv.local_addr(), b"DELETE /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        let out = get(srv.local_addr(), b"garbage\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    }

    #[test]
    fn a_source_error_is_a_503_with_its_reason() {
        let src: Arc<Source> = Arc::new(|| Err("daemon gone".to_string()));
        let srv = Server::start("127.0.0.1:0".parse().unwrap(), quick(), src).unwrap();
        let out = get(srv.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 503"), "{out}");
        assert!(out.contains("daemon gone"), "{out}");
    }

    #[test]
    fn an_oversized_request_is_refused_without_reading_it_all() {
        let srv = server(quick());
        let mut req = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        req.extend(std::iter::repeat_n(b'a', 10_000));
        let mut s = TcpStream::connect(srv.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The server stops reading at its bound: the rest may not be taken.
        let _ = s.write_all(&req);
        let mut first = String::new();
        let _ = io::BufReader::new(&s).read_line(&mut first);
        assert!(first.starts_with("HTTP/1.1 431"), "{first:?}");
    }

    #[test]
    fn silent_and_trickling_clients_are_cut_off_and_do_not_block_scrapes() {
        let limits = quick();
        let srv = server(limits);
        let addr = srv.local_addr();
        // One silent client and one that trickles a byte at a time, never ending its head.
        let silent = TcpStream::connect(addr).unwrap();
        let trickle = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(2) {
                if s.write_all(b"a").is_err() {
                    return t.elapsed();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            t.elapsed()
        });
        // Both slots are taken for at most the request timeout; meanwhile a third is
        // closed at once, not queued.
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // The trickler is cut off at the request deadline (its writes then fail).
        let cut = trickle.join().unwrap();
        assert!(cut < Duration::from_millis(1500), "trickler lasted {cut:?}");
        drop(silent);
        // After the deadline the slots are free again and a scrape is answered.
        let t = Instant::now();
        loop {
            let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            if out.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "no scrape answered: {out:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(srv.stats().refused.load(Ordering::Relaxed) >= 2);
    }

    #[test]
    fn a_client_that_never_reads_the_answer_is_cut_off() {
        // A large body and a client that does not read: the write deadline frees the slot.
        let big = "x".repeat(32 << 20);
        let src: Arc<Source> = Arc::new(move || Ok(big.clone()));
        let limits = Limits {
            max_connections: 1,
            ..quick()
        };
        let srv = Server::start("127.0.0.1:0".parse().unwrap(), limits, src).unwrap();
        let mut s = TcpStream::connect(srv.local_addr()).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let t = Instant::now();
        while srv.stats().refused.load(Ordering::Relaxed) == 0
            || srv.stats().active.load(Ordering::Relaxed) != 0
        {
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "the writer was not cut off"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(s);
    }
}
