//! The journal's native protocol (ferrovsd --log-format journald): any bytes split at the
//! first NUL into a message and a port name become one entry, which must parse back into the
//! same fields (the binary form for values with newlines, lengths, cut messages); any bytes
//! as an entry must not make the parser panic.
#![no_main]
use ferrovs_control::logging::{journal_entry, parse_journal_entry, JOURNAL_MAX_MESSAGE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_journal_entry(data);
    let (msg, port) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let msg = String::from_utf8_lossy(msg);
    let port = String::from_utf8_lossy(port);
    let kvs: [(&str, log::kv::Value<'_>); 1] = [("port", port.as_ref().into())];
    // One statement: the record borrows `format_args!`'s temporary.
    let entry = journal_entry(
        &log::Record::builder()
            .level(log::Level::Warn)
            .target("fuzz")
            .key_values(&kvs)
            .args(format_args!("{msg}"))
            .build(),
    );
    let fields = parse_journal_entry(&entry).expect("our own entry parses");
    let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let m = get("MESSAGE").expect("MESSAGE");
    assert!(msg.as_bytes().starts_with(&m));
    assert!(m.len() == msg.len() || m.len() > JOURNAL_MAX_MESSAGE - 4);
    assert_eq!(get("FERROVS_PORT").as_deref(), Some(port.as_bytes()));
    assert_eq!(get("PRIORITY").as_deref(), Some(&b"4"[..]));
});
