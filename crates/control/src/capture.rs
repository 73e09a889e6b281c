//! `ferrovs capture`'s filter: a tcpdump expression compiled by libpcap's own compiler
//! (`pcap_compile` on a dead Ethernet handle, through the `pcap` crate) into classic BPF,
//! then validated as untrusted input into the datapath's [`Program`], which the PMDs run
//! (`ferrovs_datapath::capture`). Nothing here parses the expression itself.

use ferrovs_datapath::capture::{Insn, Program, MAX_SNAPLEN};

/// Why a filter expression was refused.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// libpcap's compiler refused it: its message.
    #[error("bad filter {expr:?}: {message}")]
    Compile { expr: String, message: String },
    /// The compiled program did not validate (never expected from libpcap).
    #[error("filter {expr:?} compiled to a program the datapath refuses: {source}")]
    Program {
        expr: String,
        #[source]
        source: ferrovs_datapath::capture::ProgramError,
    },
}

/// Compiles `expr` (tcpdump syntax) for Ethernet frames. An empty expression is `None`
/// (every packet).
pub fn compile(expr: &str) -> Result<Option<Program>, FilterError> {
    let expr = expr.trim();
    if expr.is_empty() {
        return Ok(None);
    }
    let err = |m: String| FilterError::Compile {
        expr: expr.into(),
        message: m,
    };
    let dead = pcap::Capture::dead(pcap::Linktype::ETHERNET).map_err(|e| err(pcap_msg(&e)))?;
    let prog = dead.compile(expr, true).map_err(|e| err(pcap_msg(&e)))?;
    let insns = prog
        .get_instructions()
        .iter()
        .map(|i| parse_insn(&i.to_string()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| err("unreadable instruction from libpcap".into()))?;
    Program::new(insns)
        .map(Some)
        .map_err(|source| FilterError::Program {
            expr: expr.into(),
            source,
        })
}

/// libpcap's own message (the crate's `Display` adds a prefix).
fn pcap_msg(e: &pcap::Error) -> String {
    match e {
        pcap::Error::PcapError(m) => m.clone(),
        e => e.to_string(),
    }
}

/// The `pcap` crate shows an instruction as `code jt jf k` (its fields are private).
fn parse_insn(s: &str) -> Option<Insn> {
    let mut it = s.split(' ');
    let insn = Insn {
        code: it.next()?.parse().ok()?,
        jt: it.next()?.parse().ok()?,
        jf: it.next()?.parse().ok()?,
        k: it.next()?.parse().ok()?,
    };
    it.next().is_none().then_some(insn)
}

/// The snap length a request asks for, checked: 1 to 65535, default 65535.
pub fn snaplen(asked: Option<u32>) -> Result<u32, String> {
    match asked {
        None => Ok(MAX_SNAPLEN),
        Some(n) if (1..=MAX_SNAPLEN).contains(&n) => Ok(n),
        Some(n) => Err(format!("snaplen {n} out of range (1 to {MAX_SNAPLEN})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ethertype: u16, proto: u8, src: [u8; 4], dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 74];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&60u16.to_be_bytes());
        f[22] = 64;
        f[23] = proto;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    /// Our interpreter decides as libpcap's `pcap_offline_filter` on the same program, for
    /// filters tcpdump users write and packets of every kind (a differential test).
    #[test]
    fn the_datapath_runs_programs_as_libpcap_does() {
        let filters = [
            "icmp",
            "tcp port 80",
            "udp and dst port 53",
            "host 10.0.0.2",
            "src net 10.0.0.0/24 and not icmp",
            "arp or (ip and tcp[tcpflags] & tcp-syn != 0)",
            "vlan 10",
            "ether src 02:00:00:00:00:01",
            "ip[8] < 65 and len > 60",
            "ip6",
            "greater 70",
            "tcp[13] & 2 = 2 or udp[2:2] > 1000",
        ];
        let mut pkts = vec![
            frame(0x0800, 1, [10, 0, 0, 1], [10, 0, 0, 2], 0),
            frame(0x0800, 6, [10, 0, 0, 1], [10, 0, 0, 3], 80),
            frame(0x0800, 17, [10, 0, 1, 1], [10, 0, 0, 2], 53),
            frame(0x0806, 0, [0; 4], [0; 4], 0),
            frame(0x86dd, 6, [0; 4], [0; 4], 0),
            vec![0u8; 10],
            vec![],
        ];
        let mut syn = frame(0x0800, 6, [10, 0, 0, 1], [10, 0, 0, 2], 22);
        syn[47] = 2;
        pkts.push(syn);
        let mut tagged = vec![0u8; 78];
        tagged[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        tagged[14..16].copy_from_slice(&10u16.to_be_bytes());
        tagged[16..18].copy_from_slice(&0x0800u16.to_be_bytes());
        pkts.push(tagged);
        for f in filters {
            let ours = compile(f).unwrap().unwrap();
            let dead = pcap::Capture::dead(pcap::Linktype::ETHERNET).unwrap();
            let theirs = dead.compile(f, true).unwrap();
            let mut hits = 0;
            for p in &pkts {
                let a = ours.run(p) != 0;
                assert_eq!(a, theirs.filter(p), "{f} on {p:02x?}");
                hits += usize::from(a);
            }
            assert!(hits > 0 || f == "ip6", "{f} matched nothing");
        }
    }

    #[test]
    fn a_bad_filter_gets_libpcap_s_message() {
        let e = compile("tcp prot 80").unwrap_err().to_string();
        assert!(e.starts_with("bad filter \"tcp prot 80\": "), "{e}");
        assert!(e.contains("syntax error"), "{e}");
        let e = compile("host nosuchhost.invalid").unwrap_err().to_string();
        assert!(e.contains("nosuchhost"), "{e}");
        assert!(compile("  ").unwrap().is_none());
        assert_eq!(snaplen(None), Ok(65535));
        assert!(snaplen(Some(0)).is_err() && snaplen(Some(70000)).is_err());
    }
}
