//! Any bytes as a frame: the Ethernet view, the test-frame parser and the software offloads
//! (checksum completion and TCP segmentation, which run on what a guest claims in its virtio
//! header) must not panic, and every segment must fit the size the segmenter announced.
#![no_main]
use ferrovs_packet::offload::{complete_csum, TcpSegmenter};
use ferrovs_packet::{build, EthView};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(e) = EthView::new_checked(data) {
        let _ = (e.dst(), e.src(), e.vlan(), e.ethertype());
    }
    let _ = build::parse_udp_frame(data);
    // The first four bytes play the guest's csum_start/csum_offset (or gso_size/csum_start).
    if data.len() < 4 {
        return;
    }
    let a = u16::from_le_bytes([data[0], data[1]]);
    let b = u16::from_le_bytes([data[2], data[3]]);
    let frame = &data[4..];
    let mut copy = frame.to_vec();
    let _ = complete_csum(&mut copy, usize::from(a), usize::from(b));
    if let Ok(seg) = TcpSegmenter::new(frame, a, b) {
        assert!(seg.count() >= 1 && !seg.is_empty());
        let mut out = vec![0u8; 65536 + 64];
        let mut total = 0;
        for i in 0..seg.count().min(64) {
            let len = seg.len(i);
            assert!(len <= frame.len());
            seg.write(i, &mut out[..len]);
            total += len;
        }
        assert!(seg.count() > 64 || total >= frame.len());
    }
});
