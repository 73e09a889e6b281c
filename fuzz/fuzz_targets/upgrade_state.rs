//! Any bytes as the handed-over state a new ferrovsd receives on takeover: the same parse
//! (JSON, schema check, typed parse) and validation (every vhost-user device by vhost's own
//! rules) as `Channel::recv_state` must not panic, and a state that passes writes back into
//! JSON that passes again (what we write, we read).
#![no_main]
use ferrovs_control::upgrade::State;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(st) = State::parse(data) else { return };
    let again = serde_json::to_vec(&st).expect("a parsed state serialises");
    if let Err(e) = State::parse(&again) {
        panic!("a state that passed does not pass again once written: {e}");
    }
});
