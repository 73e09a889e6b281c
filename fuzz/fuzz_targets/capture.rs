//! `ferrovs capture`'s inputs: a classic BPF program (as from libpcap's compiler, but any
//! bytes here: 8 per instruction) validated and run on a packet (a guest's bytes); the
//! capture stream's lines the CLI parses (the daemon's); a pcapng file read back. Nothing may
//! panic; a validated program's answer is within what it may return.
#![no_main]
use ferrovs_datapath::capture::{Insn, Program};
use ferrovs_proto::capture::{pcapng, unhex, CaptureEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // [n: u8][n instructions of 8 bytes][packet]
    if let Some((&n, rest)) = data.split_first() {
        let n = usize::from(n).min(rest.len() / 8);
        let (prog, pkt) = rest.split_at(8 * n);
        let insns = prog
            .chunks_exact(8)
            .map(|c| Insn {
                code: u16::from_le_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        if let Ok(p) = Program::new(insns) {
            let _ = p.run(pkt);
        }
    }
    for line in data.split(|b| *b == b'\n') {
        if let Ok(CaptureEvent::Packet(p)) = serde_json::from_slice::<CaptureEvent>(line) {
            if let Some(b) = unhex(&p.data) {
                let blk = pcapng::packet(0, p.ts_ns, p.len, &b, p.dir_in);
                assert_eq!(blk.len() % 4, 0);
            }
        }
    }
    let _ = pcapng::read(data);
});
