//! Any bytes as a frame: the Ethernet view and the test-frame parser must not panic.
#![no_main]
use ferrovs_packet::{build, EthView};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(e) = EthView::new_checked(data) {
        let _ = (e.dst(), e.src(), e.vlan(), e.ethertype());
    }
    let _ = build::parse_udp_frame(data);
});
