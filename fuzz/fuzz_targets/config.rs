//! Any bytes as `add-port` options and as a configuration file: parsing and validation must
//! not panic.
#![no_main]
use ferrovs_control::options::port_from_options;
use ferrovs_control::Config;
use ferrovs_proto::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Request::AddPort { port, options, .. }) = serde_json::from_slice::<Request>(data) {
        let _ = port_from_options(&port, &options);
    }
    if let Ok(c) = serde_json::from_slice::<Config>(data) {
        let _ = c.validate();
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = ferrovs_control::config::parse_cores(s);
        let opts: Vec<String> = s.split(' ').map(String::from).collect();
        let _ = port_from_options("p", &opts);
    }
});
