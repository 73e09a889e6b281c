//! `ferrovs capture`: asks the daemon to capture a port and writes what streams back as
//! pcapng (`ferrovs_proto::capture`).

use std::io::{IsTerminal, Write};

use ferrovs_proto::capture::{pcapng, unhex, CaptureEvent, Direction};
use ferrovs_proto::reply::CaptureStarted;
use ferrovs_proto::{Client, Request};

/// What `ferrovs capture` was asked.
pub struct Args {
    pub port: String,
    pub direction: String,
    pub count: Option<u64>,
    pub snaplen: Option<u32>,
    pub write: Option<String>,
    pub filter: Vec<String>,
}

/// Runs a capture until it ends; the end's reason goes to stderr.
pub fn run(client: &Client, a: Args) -> Result<(), String> {
    let direction = Direction::parse(&a.direction).ok_or_else(|| {
        format!(
            "capture: '{}' is not a direction (in, out, both)",
            a.direction
        )
    })?;
    let to_stdout = match a.write.as_deref() {
        Some("-") => true,
        Some(_) => false,
        None if std::io::stdout().is_terminal() => {
            return Err("capture writes pcapng: -w FILE, or -w - into a pipe \
                 (ferrovs capture PORT -w - | tcpdump -nr -)"
                .into())
        }
        None => true,
    };
    let filter = a.filter.join(" ");
    let req = Request::Capture {
        port: a.port.clone(),
        direction,
        count: a.count,
        snaplen: a.snaplen,
        filter: (!filter.trim().is_empty()).then_some(filter),
    };
    let (v, mut stream) = client.stream(&req).map_err(|e| e.message())?;
    let started: CaptureStarted =
        serde_json::from_value(v).map_err(|e| format!("malformed response: {e}"))?;
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
    } else {
        let path = a.write.as_deref().unwrap_or_default();
        let f = std::fs::File::create(path).map_err(|e| format!("cannot create {path}: {e}"))?;
        Box::new(std::io::BufWriter::new(f))
    };
    eprintln!(
        "ferrovs capture: capturing on {} ({}, snaplen {}, {}), pcapng",
        started.port,
        started.direction.name(),
        started.snaplen,
        match started.filter_insns {
            0 => "no filter".to_string(),
            n => format!("filter of {n} BPF instructions"),
        }
    );
    let mut head = pcapng::section_header(concat!("ferrovs ", env!("CARGO_PKG_VERSION")));
    head.extend(pcapng::interface(&started.port, started.snaplen));
    // A reader that went away (tcpdump quit) ends the capture quietly: closing the
    // connection stops it in the daemon.
    if out.write_all(&head).and_then(|_| out.flush()).is_err() {
        return Ok(());
    }
    loop {
        let ev: Option<CaptureEvent> = stream.next_line().map_err(|e| e.message())?;
        match ev {
            None => return Err("capture: the daemon closed the capture without saying why".into()),
            Some(CaptureEvent::Packet(p)) => {
                let data = unhex(&p.data)
                    .ok_or_else(|| "capture: malformed packet from the daemon".to_string())?;
                let b = pcapng::packet(0, p.ts_ns, p.len, &data, p.dir_in);
                if out.write_all(&b).is_err() {
                    return Ok(());
                }
                if !stream.buffered() && out.flush().is_err() {
                    return Ok(());
                }
            }
            Some(CaptureEvent::End(e)) => {
                let _ = out.flush();
                eprintln!("ferrovs capture: ended: {}", e.message);
                eprintln!(
                    "{} packets captured, {} filtered out, {} dropped by the switch \
                     (capture ring full), {} dropped (reader too slow)",
                    e.captured, e.filtered, e.drops, e.client_drops
                );
                return Ok(());
            }
        }
    }
}
