//! Any bytes as a vhost-user message (header + payload) with 0-3 fds: parsing must not panic.
#![no_main]
use ferrovs_vhost::msg::{check_header, parse, Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN + 1 {
        return;
    }
    let nfds = (data[0] % 4) as usize;
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&data[1..1 + HEADER_LEN]);
    let h = Header::parse(&head);
    if check_header(&h).is_err() {
        return;
    }
    let payload = &data[1 + HEADER_LEN..];
    let h = Header { size: payload.len() as u32, ..h };
    let fds = (0..nfds).map(|_| ferrovs_sys::os::eventfd().unwrap()).collect();
    let _ = parse(&h, payload, fds);
});
