//! Replies captured from a running daemon (`tests/replies/*.json`, one response line each)
//! parse into their types and serialise back byte for byte.

use ferrovs_proto::reply::*;
use ferrovs_proto::Response;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn round_trip<R: DeserializeOwned + Serialize>(name: &str) -> R {
    let path = format!("{}/tests/replies/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let line = std::fs::read_to_string(&path).unwrap();
    let line = line.trim_end();
    let r: Response<R> = serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(serde_json::to_string(&r).unwrap(), line, "{name}");
    r.result.expect("a result")
}

#[test]
fn show() {
    let s: Show = round_trip("show");
    let kinds: Vec<&str> = s.bridges[0].ports.iter().map(|p| p.mode.as_str()).collect();
    for k in ["vhost-user", "tap", "af_packet", "af_xdp", "vxlan"] {
        assert!(kinds.contains(&k), "{k} in {kinds:?}");
    }
    assert!(s.bridges[0]
        .ports
        .iter()
        .any(|p| matches!(p.kernel, Some(KernelInfo::Xdp(_)))));
    assert!(s.bridges[0]
        .ports
        .iter()
        .any(|p| matches!(p.kernel, Some(KernelInfo::Uplink(_)))));
    assert!(s.bridges[0]
        .ports
        .iter()
        .any(|p| matches!(p.kernel, Some(KernelInfo::Tap(_)))));
    assert!(s.bridges[0]
        .ports
        .iter()
        .any(|p| matches!(p.kernel, Some(KernelInfo::Vxlan(_)))));
}

#[test]
fn version() {
    let _: Version = round_trip("version");
}

#[test]
fn port_stats() {
    let p: Vec<PortStats> = round_trip("port_stats");
    assert!(p.iter().any(|p| p.migration.is_some()));
}

#[test]
fn pmd_stats() {
    let p: Vec<PmdStats> = round_trip("pmd_stats");
    assert!(!p[0].megaflow_caches.is_empty());
}

#[test]
fn mac_table() {
    let _: Vec<MacEntry> = round_trip("mac_table");
}

#[test]
fn config_get() {
    assert!(matches!(round_trip("config_get"), ConfigGet::All(_)));
    assert!(matches!(round_trip("config_get_one"), ConfigGet::One(_)));
}

#[test]
fn flows() {
    let _: AddFlows = round_trip("add_flows");
    let _: DelFlows = round_trip("del_flows");
    let _: Vec<FlowEntry> = round_trip("dump_flows");
    let _: Vec<MegaflowEntry> = round_trip("dump_megaflows");
}

#[test]
fn upgrade_history() {
    let h: Vec<UpgradeReport> = round_trip("upgrade_history");
    assert_eq!(h.len(), 2);
}

#[test]
fn done_and_error() {
    let done = std::fs::read_to_string(format!(
        "{}/tests/replies/add_bridge.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert_eq!(
        serde_json::to_string(&Response::ok(Reply::Done)).unwrap(),
        done.trim_end()
    );
    let line = std::fs::read_to_string(format!(
        "{}/tests/replies/error.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let r: Response = serde_json::from_str(&line).unwrap();
    assert_eq!(serde_json::to_string(&r).unwrap(), line.trim_end());
    assert_eq!(r.error.as_deref(), Some("no bridge named nope"));
}

/// What the daemon sends serialises as the captured replies do.
#[test]
fn reply_is_transparent() {
    assert_eq!(serde_json::to_string(&Reply::Done).unwrap(), "null");
    let v = Reply::Version(Version {
        version: "0.1.0".into(),
    });
    assert_eq!(
        serde_json::to_string(&Response::ok(v)).unwrap(),
        r#"{"ok":true,"result":{"version":"0.1.0"}}"#
    );
}
