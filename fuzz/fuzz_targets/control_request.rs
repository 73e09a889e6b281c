//! Any bytes as a control-socket request line and as a reply: parsing must not panic, and
//! what parses re-encodes to something that parses the same.
#![no_main]
use ferrovs_proto::{reply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<Request>(data) {
        let line = serde_json::to_string(&r).expect("a request encodes");
        assert_eq!(serde_json::from_str::<Request>(&line).ok(), Some(r));
    }
    let _ = serde_json::from_slice::<reply::Show>(data);
    let _ = serde_json::from_slice::<Vec<reply::PortStats>>(data);
    let _ = serde_json::from_slice::<Vec<reply::PmdStats>>(data);
});
