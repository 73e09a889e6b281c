//! The metrics exporter's untrusted inputs: any bytes as an HTTP request head (the scraper's),
//! and any daemon replies the exposition is rendered from. Nothing may panic; a rendered
//! exposition has one TYPE line per family.
#![no_main]
use ferrovs_metrics::{http, render, Scrape};
use ferrovs_proto::reply;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(end) = http::head_end(data) {
        let _ = http::parse_head(&data[..end]);
    }
    let _ = http::parse_head(data);
    // Replies as JSON: a Show, then port-stats and pmd-stats, split at the first NUL.
    let mut parts = data.split(|b| *b == 0);
    let Some(Ok(show)) = parts.next().map(serde_json::from_slice::<reply::Show>) else {
        return;
    };
    let ports = parts
        .next()
        .and_then(|p| serde_json::from_slice::<Vec<reply::PortStats>>(p).ok())
        .unwrap_or_default();
    let pmds = parts
        .next()
        .and_then(|p| serde_json::from_slice::<Vec<reply::PmdStats>>(p).ok())
        .unwrap_or_default();
    let text = render(&Scrape {
        show,
        ports,
        pmds,
        last_upgrade: None,
        conntrack: None,
        flows: Default::default(),
    });
    let mut seen = std::collections::HashSet::new();
    for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        assert!(seen.insert(l.to_string()), "{l}");
    }
});
