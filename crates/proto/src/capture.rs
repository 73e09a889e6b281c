//! `ferrovs capture`: the stream that follows a `capture` request's reply, and the pcapng
//! file the CLI writes from it ([`pcapng`]).
//!
//! After the daemon answers a [`crate::Request::Capture`] with
//! [`crate::reply::CaptureStarted`], the connection carries one [`CaptureEvent`] per line
//! (JSON): the packets captured, then one [`CaptureEvent::End`] saying why the capture
//! stopped, after which the daemon closes the connection. A client stops a capture by
//! closing its end.

use serde::{Deserialize, Serialize};

/// Which packets of a port a capture takes, seen from the switch: `in` what it receives
/// from the port, `out` what it sends there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    In,
    Out,
    #[default]
    Both,
}

impl Direction {
    pub fn parse(s: &str) -> Option<Direction> {
        match s {
            "in" => Some(Direction::In),
            "out" => Some(Direction::Out),
            "both" => Some(Direction::Both),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
            Direction::Both => "both",
        }
    }
}

/// One line of a capture's stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum CaptureEvent {
    Packet(CapturedPacket),
    End(CaptureEnd),
}

/// A captured packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapturedPacket {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// True: received from the port; false: sent to it.
    #[serde(rename = "in")]
    pub dir_in: bool,
    /// The packet's length; `data` holds at most the snap length of it.
    pub len: u32,
    /// The bytes kept, in hex.
    pub data: String,
}

/// Why a capture ended, and its counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureEnd {
    /// A stable name: `count`, `port-deleted`, `upgrade`, `shutdown`, `client-slow`.
    pub reason: String,
    /// What to tell the user.
    pub message: String,
    /// Packets sent to the client.
    pub captured: u64,
    /// Packets the filter rejected.
    pub filtered: u64,
    /// Packets the PMDs could not put in the capture ring (full or busy): `capture drops`.
    pub drops: u64,
    /// Packets captured but not sent because the client did not read fast enough.
    pub client_drops: u64,
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        s.push(D[usize::from(x >> 4)] as char);
        s.push(D[usize::from(x & 15)] as char);
    }
    s
}

/// The bytes of hex text `s` (either case); `None` if it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if s.len() % 2 != 0 {
        return None;
    }
    let v = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.chunks(2)
        .map(|p| Some(v(p[0])? << 4 | v(p[1])?))
        .collect()
}

/// A pcapng writer (and a small reader for tests): a Section Header Block, one Interface
/// Description Block per port (its name, link type Ethernet, nanosecond timestamps), and an
/// Enhanced Packet Block per packet with its direction in `epb_flags`. Little-endian, as
/// the reader learns from the byte-order magic. Format: the pcapng specification
/// (draft-ietf-opsawg-pcapng).
pub mod pcapng {
    const SHB: u32 = 0x0A0D_0D0A;
    const IDB: u32 = 1;
    const EPB: u32 = 6;
    const MAGIC: u32 = 0x1A2B_3C4D;
    /// `LINKTYPE_ETHERNET`.
    pub const LINKTYPE_ETHERNET: u16 = 1;
    const OPT_END: u16 = 0;
    const SHB_USERAPPL: u16 = 4;
    const IF_NAME: u16 = 2;
    const IF_TSRESOL: u16 = 9;
    const EPB_FLAGS: u16 = 2;
    /// `epb_flags` direction bits.
    pub const INBOUND: u32 = 1;
    pub const OUTBOUND: u32 = 2;

    fn opt(b: &mut Vec<u8>, code: u16, v: &[u8]) {
        b.extend_from_slice(&code.to_le_bytes());
        b.extend_from_slice(&(v.len() as u16).to_le_bytes());
        b.extend_from_slice(v);
        pad(b);
    }

    fn pad(b: &mut Vec<u8>) {
        while b.len() % 4 != 0 {
            b.push(0);
        }
    }

    /// Wraps `body` (padded to 4) as a block of type `ty`.
    fn block(ty: u32, body: &[u8]) -> Vec<u8> {
        let len = (12 + body.len()) as u32;
        let mut b = Vec::with_capacity(len as usize);
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }

    /// The Section Header Block, naming the application that wrote the file.
    pub fn section_header(app: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&MAGIC.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&(-1i64).to_le_bytes());
        opt(&mut body, SHB_USERAPPL, app.as_bytes());
        opt(&mut body, OPT_END, &[]);
        block(SHB, &body)
    }

    /// An Interface Description Block: Ethernet, `snaplen`, named `name`, timestamps in ns.
    pub fn interface(name: &str, snaplen: u32) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&snaplen.to_le_bytes());
        // Option values are at most 65535 bytes; a port name is far shorter.
        let name = &name.as_bytes()[..name.len().min(256)];
        opt(&mut body, IF_NAME, name);
        opt(&mut body, IF_TSRESOL, &[9]);
        opt(&mut body, OPT_END, &[]);
        block(IDB, &body)
    }

    /// An Enhanced Packet Block of interface `iface`: `data` (at most 65535 bytes are
    /// written), `orig_len` on the wire, at `ts_ns`, `dir_in` in `epb_flags`.
    pub fn packet(iface: u32, ts_ns: u64, orig_len: u32, data: &[u8], dir_in: bool) -> Vec<u8> {
        let data = &data[..data.len().min(65535)];
        let mut body = Vec::with_capacity(40 + data.len());
        body.extend_from_slice(&iface.to_le_bytes());
        body.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        body.extend_from_slice(&(ts_ns as u32).to_le_bytes());
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(&orig_len.max(data.len() as u32).to_le_bytes());
        body.extend_from_slice(data);
        pad(&mut body);
        let flags = if dir_in { INBOUND } else { OUTBOUND };
        opt(&mut body, EPB_FLAGS, &flags.to_le_bytes());
        opt(&mut body, OPT_END, &[]);
        block(EPB, &body)
    }

    /// An Enhanced Packet Block as [`read`] finds it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Packet {
        pub iface: u32,
        pub ts_ns: u64,
        pub orig_len: u32,
        pub data: Vec<u8>,
        /// `epb_flags`, if the block has them.
        pub flags: Option<u32>,
    }

    /// What [`read`] finds in a little-endian pcapng file.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct File {
        /// Interface names (`if_name`; empty without one), in order.
        pub interfaces: Vec<String>,
        pub packets: Vec<Packet>,
    }

    /// Reads a little-endian pcapng file of one section (the blocks [`section_header`],
    /// [`interface`] and [`packet`] write; others are skipped). For tests and tools: every
    /// length is checked, nothing panics. `None` if the bytes are not such a file.
    pub fn read(b: &[u8]) -> Option<File> {
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_le_bytes(
                b.get(o..o.checked_add(4)?)?.try_into().ok()?,
            ))
        };
        let mut f = File::default();
        let mut off = 0;
        let mut first = true;
        while off < b.len() {
            let ty = u32_at(off)?;
            let len = u32_at(off + 4)? as usize;
            if len < 12 || len % 4 != 0 || u32_at(off.checked_add(len)? - 4)? as usize != len {
                return None;
            }
            let body = b.get(off + 8..off + len - 4)?;
            if first && (ty != SHB || u32_at(off + 8)? != MAGIC) {
                return None;
            }
            first = false;
            match ty {
                IDB => {
                    let opts = options(body.get(8..)?)?;
                    let name = opts.iter().find(|(c, _)| *c == IF_NAME);
                    f.interfaces.push(
                        name.map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default(),
                    );
                }
                EPB => {
                    let w = |i: usize| -> Option<u32> {
                        Some(u32::from_le_bytes(
                            body.get(4 * i..4 * i + 4)?.try_into().ok()?,
                        ))
                    };
                    let cap = w(3)? as usize;
                    let data = body.get(20..20usize.checked_add(cap)?)?.to_vec();
                    let opts = options(body.get(20 + cap.div_ceil(4) * 4..)?)?;
                    let flags = opts
                        .iter()
                        .find(|(c, v)| *c == EPB_FLAGS && v.len() == 4)
                        .map(|(_, v)| u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
                    f.packets.push(Packet {
                        iface: w(0)?,
                        ts_ns: u64::from(w(1)?) << 32 | u64::from(w(2)?),
                        orig_len: w(4)?,
                        data,
                        flags,
                    });
                }
                _ => {}
            }
            off += len;
        }
        (!first).then_some(f)
    }

    /// The options of a block's tail.
    fn options(mut b: &[u8]) -> Option<Vec<(u16, Vec<u8>)>> {
        let mut out = Vec::new();
        while b.len() >= 4 {
            let code = u16::from_le_bytes([b[0], b[1]]);
            let len = usize::from(u16::from_le_bytes([b[2], b[3]]));
            if code == OPT_END {
                break;
            }
            let v = b.get(4..4 + len)?;
            out.push((code, v.to_vec()));
            b = b.get((4 + len.div_ceil(4) * 4).min(b.len())..)?;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_json_lines() {
        let p = CaptureEvent::Packet(CapturedPacket {
            ts_ns: 1,
            dir_in: true,
            len: 60,
            data: hex(&[0xde, 0xad]),
        });
        let s = serde_json::to_string(&p).unwrap();
        assert_eq!(
            s,
            r#"{"packet":{"ts_ns":1,"in":true,"len":60,"data":"dead"}}"#
        );
        assert_eq!(serde_json::from_str::<CaptureEvent>(&s).unwrap(), p);
        assert_eq!(unhex("DEad").unwrap(), vec![0xde, 0xad]);
        assert!(unhex("d").is_none() && unhex("zz").is_none());
    }

    #[test]
    fn a_written_pcapng_file_reads_back() {
        let mut b = pcapng::section_header("ferrovs test");
        b.extend(pcapng::interface("vm1", 128));
        b.extend(pcapng::packet(
            0,
            1_700_000_000_123_456_789,
            100,
            &[7; 61],
            true,
        ));
        b.extend(pcapng::packet(0, 5, 3, &[1, 2, 3], false));
        assert_eq!(b.len() % 4, 0);
        let f = pcapng::read(&b).unwrap();
        assert_eq!(f.interfaces, vec!["vm1".to_string()]);
        assert_eq!(f.packets.len(), 2);
        let p = &f.packets[0];
        assert_eq!(
            (p.ts_ns, p.orig_len, p.data.len()),
            (1_700_000_000_123_456_789, 100, 61)
        );
        assert_eq!(p.flags, Some(pcapng::INBOUND));
        assert_eq!(f.packets[1].flags, Some(pcapng::OUTBOUND));
        assert!(pcapng::read(&b[..b.len() - 1]).is_none());
        assert!(pcapng::read(&b[4..]).is_none());
    }

    /// tcpdump (libpcap's pcapng reader) reads what we write: the packets, their lengths
    /// and timestamps.
    #[test]
    fn tcpdump_reads_the_file() {
        if std::process::Command::new("tcpdump")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(std::env::var_os("CI").is_none(), "tcpdump is missing");
            eprintln!("skipped: tcpdump is not installed");
            return;
        }
        // An ICMP echo request 10.0.0.1 -> 10.0.0.2, and an ARP request cut to 20 bytes.
        let icmp = unhex(concat!(
            "020000000002020000000001080045000054000040004001",
            "26a70a0000010a0000020800f7ff000100010000000000000000",
            "000000000000000000000000000000000000000000000000000000000000",
            "00000000000000000000000000000000000000000000"
        ))
        .unwrap();
        let mut b = pcapng::section_header("ferrovs test");
        b.extend(pcapng::interface("vm1", 65535));
        b.extend(pcapng::packet(
            0,
            1_000_000_123_456_000,
            icmp.len() as u32,
            &icmp,
            true,
        ));
        b.extend(pcapng::packet(
            0,
            1_000_000_124_000_000,
            42,
            &[0xff; 20],
            false,
        ));
        let dir = std::env::temp_dir().join(format!("ferrovs-pcapng-{}", std::process::id()));
        std::fs::write(&dir, &b).unwrap();
        let out = std::process::Command::new("tcpdump")
            .args(["-nr"])
            .arg(&dir)
            .args(["-tt", "-e"])
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&dir);
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('\t')).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("1000000.123456 "), "{text}");
        assert!(
            lines[0].contains("10.0.0.1 > 10.0.0.2: ICMP echo request"),
            "{text}"
        );
        // Cut to 20 bytes, 42 on the wire.
        assert!(
            lines[1].starts_with("1000000.124000 ff:ff:ff:ff:ff:ff"),
            "{text}"
        );
        assert!(lines[1].contains("length 42"), "{text}");
        assert!(err.contains("EN10MB"), "{err}");
    }
}
