//! Any bytes as a handed-over OVSDB session (`SessionState`, what a hot upgrade carries):
//! never a panic; a state that restores gives a consistent, synchronised session whose
//! export restores again to the same replica and output.
#![no_main]
use ferrovs_ovsdb::{Monitor, RestoreError, Session, SessionState};
use libfuzzer_sys::fuzz_target;

fn monitor() -> Monitor {
    Monitor::new()
        .table("Bridge", &["name", "ports", "flag", "ratio"])
        .table("Interface", &["name", "ofport", "options"])
}

fuzz_target!(|data: &[u8]| {
    let Ok(st) = serde_json::from_slice::<SessionState>(data) else {
        return;
    };
    let Ok(s) = Session::restore("DB", monitor(), &st) else {
        return;
    };
    s.check_consistency().expect("a restored replica is consistent");
    if let Some(again) = s.export() {
        match Session::restore("DB", monitor(), &again) {
            Ok(r) => {
                assert_eq!(r.replica(), s.replica());
                assert_eq!(r.pending_output(), s.pending_output());
            }
            // Replies to the server's echo requests in the input grew the output.
            Err(RestoreError::TooLarge { .. }) => {}
            Err(e) => panic!("an export does not restore: {e}"),
        }
    }
});
