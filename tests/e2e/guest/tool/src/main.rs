//! ferrovs-guest: the traffic tool of the test guests (std only, linked statically into their
//! initramfs). Every command prints one line `FERROVS-RESULT {json}` when it ends.
//!
//! ```text
//! ferrovs-guest tcp-recv PORT                      accept one stream, count bytes to EOF
//! ferrovs-guest tcp-send HOST PORT SECS [MBPS]     send for SECS (paced at MBPS if given),
//!                                                  report rate and retransmits
//! ferrovs-guest udp-recv PORT IDLE_SECS            count sequenced datagrams: lost, reordered
//! ferrovs-guest udp-send HOST PORT PPS COUNT SIZE  sequenced datagrams at a fixed rate
//! ferrovs-guest sleep SECS
//! ```
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

fn result(fields: &[(&str, String)]) {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    println!("FERROVS-RESULT {{{}}}", body.join(","));
}

/// The sender's TCP retransmitted segments so far (/proc/net/snmp, "Tcp:" RetransSegs).
fn retrans_segs() -> u64 {
    let s = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut lines = s.lines().filter(|l| l.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RetransSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn addr(host: &str, port: &str) -> Result<SocketAddr, String> {
    format!("{host}:{port}")
        .parse()
        .map_err(|e| format!("bad address {host}:{port}: {e}"))
}

fn num(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("'{s}' is not a number"))
}

fn tcp_recv(port: &str) -> Result<(), String> {
    let l = TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|e| e.to_string())?;
    println!("FERROVS-LISTENING");
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    result(&[
        ("bytes", total.to_string()),
        ("seconds", format!("{secs:.3}")),
        ("mbps", format!("{:.1}", total as f64 * 8.0 / secs / 1e6)),
    ]);
    Ok(())
}

fn tcp_send(host: &str, port: &str, secs: &str, mbps: Option<&str>) -> Result<(), String> {
    let a = addr(host, port)?;
    let dur = Duration::from_secs(num(secs)?);
    let bytes_per_sec = mbps.map(num).transpose()?.map(|m| m * 1_000_000 / 8);
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() < Duration::from_secs(60) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connect {a}: {e}")),
        }
    };
    let r0 = retrans_segs();
    let t = Instant::now();
    let buf = vec![0x5au8; 1 << 16];
    let mut sent = 0u64;
    while t.elapsed() < dur {
        if let Some(bps) = bytes_per_sec {
            let due = Duration::from_secs_f64(sent as f64 / bps.max(1) as f64);
            if let Some(wait) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        s.write_all(&buf).map_err(|e| e.to_string())?;
        sent += buf.len() as u64;
    }
    s.shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    // Wait for the receiver to close: everything was delivered.
    let mut b = [0u8; 16];
    let _ = s.read(&mut b);
    let secs = t.elapsed().as_secs_f64();
    result(&[
        ("bytes", sent.to_string()),
        ("seconds", format!("{secs:.3}")),
        ("mbps", format!("{:.1}", sent as f64 * 8.0 / secs / 1e6)),
        ("retransmits", (retrans_segs() - r0).to_string()),
    ]);
    Ok(())
}

fn udp_recv(port: &str, idle: &str) -> Result<(), String> {
    let s = UdpSocket::bind(format!("0.0.0.0:{port}")).map_err(|e| e.to_string())?;
    let idle = Duration::from_secs(num(idle)?);
    s.set_read_timeout(Some(idle)).map_err(|e| e.to_string())?;
    println!("FERROVS-LISTENING");
    let (mut received, mut reordered, mut next, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut buf = [0u8; 2048];
    loop {
        match s.recv(&mut buf) {
            Ok(n) if n >= 8 => {
                let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or([0; 8]));
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                received += 1;
                if seq >= next {
                    lost += seq - next;
                    next = seq + 1;
                } else {
                    reordered += 1;
                    lost = lost.saturating_sub(1);
                }
            }
            Ok(_) => {}
            Err(_) if received > 0 => break,
            Err(_) => {}
        }
    }
    let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
    result(&[
        ("received", received.to_string()),
        ("lost", lost.to_string()),
        ("reordered", reordered.to_string()),
        ("seconds", format!("{secs:.3}")),
    ]);
    Ok(())
}

fn udp_send(host: &str, port: &str, pps: &str, count: &str, size: &str) -> Result<(), String> {
    let a = addr(host, port)?;
    let (pps, count, size) = (num(pps)?.max(1), num(count)?, num(size)?.clamp(8, 1472));
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; size as usize];
    let t = Instant::now();
    let mut errors = 0u64;
    for seq in 0..count {
        let due = Duration::from_secs_f64(seq as f64 / pps as f64);
        if let Some(wait) = due.checked_sub(t.elapsed()) {
            std::thread::sleep(wait);
        }
        buf[..8].copy_from_slice(&seq.to_be_bytes());
        if s.send_to(&buf, a).is_err() {
            errors += 1;
        }
    }
    result(&[
        ("sent", count.to_string()),
        ("send_errors", errors.to_string()),
        ("seconds", format!("{:.3}", t.elapsed().as_secs_f64())),
    ]);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = match a.as_slice() {
        ["tcp-recv", port] => tcp_recv(port),
        ["tcp-send", host, port, secs] => tcp_send(host, port, secs, None),
        ["tcp-send", host, port, secs, mbps] => tcp_send(host, port, secs, Some(mbps)),
        ["sleep", secs] => num(secs).map(|s| std::thread::sleep(Duration::from_secs(s))),
        ["udp-recv", port, idle] => udp_recv(port, idle),
        ["udp-send", host, port, pps, count, size] => udp_send(host, port, pps, count, size),
        _ => Err("usage: see the source header".into()),
    };
    if let Err(e) = r {
        println!("FERROVS-ERROR {e}");
        std::process::exit(1);
    }
}
