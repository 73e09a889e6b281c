//! `ferrovs trace BRIDGE FLOW | --packet HEX | --pcap FILE [--in-port PORT] [--ct-next
//! STATE]...`: asks the daemon where a packet would go (`Request::Trace`) and prints the
//! answer as `ovs-appctl ofproto/trace` does. A pcap or pcapng file is read here (with the
//! `pcap-file` crate's parsers over the file in memory) and each of its Ethernet frames is
//! traced in turn.

use std::path::Path;

use ferrovs_proto::reply::{Trace, TracePass};
use ferrovs_proto::Request;

use crate::Cli;

/// Largest capture file read.
const MAX_PCAP: u64 = 64 << 20;
/// Most packets of a capture traced.
const MAX_PACKETS: usize = 10_000;

/// The trace command's arguments.
pub struct TraceArgs {
    pub bridge: String,
    pub flow: Option<String>,
    pub packet: Option<String>,
    pub pcap: Option<std::path::PathBuf>,
    pub in_port: Option<String>,
    pub ct_next: Vec<String>,
}

pub fn run(cli: &Cli, a: TraceArgs) -> Result<(), String> {
    let req = |flow: Option<String>, packet: Option<String>| Request::Trace {
        bridge: a.bridge.clone(),
        flow,
        packet,
        in_port: a.in_port.clone(),
        ct_next: a.ct_next.clone(),
    };
    match (&a.flow, &a.packet, &a.pcap) {
        (Some(_), None, None) | (None, Some(_), None) => {
            cli.show(req(a.flow.clone(), a.packet.clone()), print_trace)
        }
        (None, None, Some(file)) => {
            if a.in_port.is_none() {
                return Err("trace --pcap needs --in-port PORT".into());
            }
            let frames = read_capture(file)?;
            let mut all = Vec::new();
            for (i, f) in frames.iter().enumerate() {
                let t: Trace = cli
                    .call(&req(None, Some(hex(f))))
                    .map_err(|e| format!("{}: packet {}: {e}", file.display(), i + 1))?;
                if !cli.json {
                    if i > 0 {
                        println!();
                    }
                    println!("Packet {} ({} bytes)", i + 1, f.len());
                    print_trace(&t);
                }
                all.push(t);
            }
            if cli.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?
                );
            }
            Ok(())
        }
        (None, None, None) => Err("trace: give a FLOW, --packet HEX or --pcap FILE".into()),
        _ => Err("trace: give one of FLOW, --packet HEX and --pcap FILE".into()),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The Ethernet frames of a pcap or pcapng file.
fn read_capture(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let name = path.display();
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{name}: {e}"))?
        .len();
    if len > MAX_PCAP {
        return Err(format!("{name}: larger than {} MiB", MAX_PCAP >> 20));
    }
    let data = std::fs::read(path).map_err(|e| format!("{name}: {e}"))?;
    parse_capture(&data).map_err(|e| format!("{name}: {e}"))
}

/// The Ethernet frames of a capture in memory (pcap or pcapng, by its magic number): at
/// most [`MAX_PACKETS`]; a truncated or malformed file is an error naming the packet.
pub(crate) fn parse_capture(data: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    use pcap_file::DataLink;
    let mut out = Vec::new();
    if data.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        use pcap_file::pcapng::{Block, PcapNgParser};
        let (mut rest, mut p) =
            PcapNgParser::new(data).map_err(|e| format!("not a pcapng file: {e}"))?;
        while !rest.is_empty() && out.len() < MAX_PACKETS {
            let (r, block) = p
                .next_block(rest)
                .map_err(|e| format!("block after packet {}: {e}", out.len()))?;
            rest = r;
            let frame = match &block {
                Block::EnhancedPacket(b) => {
                    let link = p.packet_interface(b).map(|i| i.linktype);
                    if link != Some(DataLink::ETHERNET) {
                        return Err(format!(
                            "packet {}: link type {link:?}, not Ethernet",
                            out.len() + 1
                        ));
                    }
                    b.data.to_vec()
                }
                Block::SimplePacket(b) => b.data.to_vec(),
                _ => continue,
            };
            out.push(frame);
        }
    } else {
        use pcap_file::pcap::PcapParser;
        let (mut rest, p) = PcapParser::new(data).map_err(|e| format!("not a pcap file: {e}"))?;
        if p.header().datalink != DataLink::ETHERNET {
            return Err(format!("link type {:?}, not Ethernet", p.header().datalink));
        }
        while !rest.is_empty() && out.len() < MAX_PACKETS {
            let (r, pkt) = p
                .next_packet(rest)
                .map_err(|e| format!("packet {}: {e}", out.len() + 1))?;
            rest = r;
            out.push(pkt.data.to_vec());
        }
    }
    if out.is_empty() {
        return Err("no packets".into());
    }
    Ok(out)
}

/// The reply as `ofproto/trace` lays it out: the flow, then per pass (bridge, then each
/// recirculation) every table with its rule and actions, nested resubmits indented, then
/// the megaflow and the datapath actions; at the end the outputs or the drop reason.
pub(crate) fn print_trace(t: &Trace) {
    println!("Flow: {}", t.flow);
    for (i, p) in t.passes.iter().enumerate() {
        println!();
        let title = if i == 0 {
            format!("bridge(\"{}\")", t.bridge)
        } else {
            format!(
                "recirc(recirc_id={}) with ct_state={} (assumed)",
                p.recirc_id,
                p.ct_state.as_deref().unwrap_or("?")
            )
        };
        println!("{title}");
        println!("{}", "-".repeat(title.len()));
        print_pass(p);
        println!();
        println!("Megaflow: {}", p.megaflow);
        println!("Datapath actions: {}", p.actions);
        if let Some(e) = &p.error {
            println!("Translation failed: {e}");
        }
    }
    println!();
    match &t.drop {
        Some(d) => println!("Result: drop ({d})"),
        None => println!("Result: output to {}", t.outputs.join(", ")),
    }
    if t.plain_l2 {
        println!("(the bridge has only the default NORMAL rule: plain L2 switching)");
    }
}

fn print_pass(p: &TracePass) {
    for s in &p.steps {
        let pad = "    ".repeat(s.depth);
        match s.kind.as_str() {
            "rule" => {
                // The match as dump-flows prints it (table, cookie and priority in it).
                println!(
                    "{pad}{:2}. {}",
                    s.table,
                    s.matches.as_deref().unwrap_or("?")
                );
                println!("{pad}    {}", s.actions.as_deref().unwrap_or(""));
            }
            "miss" => {
                println!("{pad}{:2}. No match.", s.table);
                println!("{pad}    drop");
            }
            _ => {
                println!("{pad}    NORMAL: {}", s.normal.as_deref().unwrap_or(""));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap(frames: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        v.extend_from_slice(&2u16.to_le_bytes());
        v.extend_from_slice(&4u16.to_le_bytes());
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&65535u32.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        for f in frames {
            v.extend_from_slice(&[0; 8]);
            v.extend_from_slice(&(f.len() as u32).to_le_bytes());
            v.extend_from_slice(&(f.len() as u32).to_le_bytes());
            v.extend_from_slice(f);
        }
        v
    }

    #[test]
    fn captures_parse_or_say_why() {
        let a = [0x11u8; 60];
        let b = [0x22u8; 64];
        let file = pcap(&[&a, &b]);
        assert_eq!(parse_capture(&file).unwrap(), vec![a.to_vec(), b.to_vec()]);
        // Truncated in the second packet.
        let e = parse_capture(&file[..file.len() - 3]).unwrap_err();
        assert!(e.starts_with("packet 2:"), "{e}");
        assert!(parse_capture(&file[..10])
            .unwrap_err()
            .contains("not a pcap file"));
        assert_eq!(parse_capture(&pcap(&[])).unwrap_err(), "no packets");
        let mut raw = pcap(&[&a]);
        raw[20] = 101; // LINKTYPE_RAW
        assert!(parse_capture(&raw).unwrap_err().contains("not Ethernet"));
        assert!(parse_capture(b"\x0a\x0d\x0d\x0a\x00")
            .unwrap_err()
            .contains("not a pcapng file"));
    }
}
