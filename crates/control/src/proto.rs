//! The control-socket protocol.
//!
//! A client connects to `RUN_DIR/ferrovs.ctl`, writes one JSON object per line and reads one
//! JSON object per line back. Requests are tagged by `"cmd"`; responses are
//! `{"ok": true, "result": ...}` or `{"ok": false, "error": "message"}`.
//! See `docs/control-protocol.md` for every command.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, PortConfig, PortType};

/// Longest request line accepted: room for a bulk `add-flows` of some 500 000 rules (all or
/// none is one request). A client sending more is answered with an error and disconnected;
/// the daemon never buffers more than this per client.
pub const MAX_REQUEST: usize = 32 << 20;

/// A control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Show,
    Version,
    AddBridge {
        bridge: String,
    },
    DelBridge {
        bridge: String,
    },
    AddPort {
        bridge: String,
        port: String,
        options: Vec<String>,
    },
    DelPort {
        bridge: String,
        port: String,
    },
    /// Changes settings of a live port (`key=value`: coalesce-usecs, coalesce-frames).
    SetPort {
        port: String,
        options: Vec<String>,
    },
    PortStats {
        port: Option<String>,
    },
    PmdStats,
    PmdStatsClear,
    MacTable {
        bridge: String,
    },
    ConfigGet {
        key: Option<String>,
    },
    ConfigSet {
        key: String,
        value: String,
    },
    /// The last takeovers (hot upgrades) with their phases.
    UpgradeHistory {
        #[serde(default)]
        last: Option<usize>,
    },
    /// Installs rules (`ferrovs add-flow` syntax), all or none.
    AddFlows {
        bridge: String,
        flows: Vec<String>,
    },
    /// Removes the rules a filter selects (none given: every rule).
    DelFlows {
        bridge: String,
        #[serde(default)]
        filter: Option<String>,
        #[serde(default)]
        strict: bool,
    },
    /// The rules (a filter selects some) with their counters.
    DumpFlows {
        bridge: String,
        #[serde(default)]
        filter: Option<String>,
    },
    /// The bridge's megaflow cache entries.
    DumpMegaflows {
        bridge: String,
    },
}

/// A response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(v: serde_json::Value) -> Response {
        Response {
            ok: true,
            result: Some(v),
            error: None,
        }
    }

    pub fn err(e: impl std::fmt::Display) -> Response {
        Response {
            ok: false,
            result: None,
            error: Some(e.to_string()),
        }
    }
}

/// Applies a `coalesce-usecs`/`coalesce-frames` option to `p` (range checks are
/// [`crate::config::validate_port`]'s).
fn set_coalesce(p: &mut PortConfig, k: &str, v: &str) -> Result<(), ConfigError> {
    let n = v
        .parse::<u32>()
        .map_err(|_| ConfigError::Invalid(format!("port {}: {k}={v}: not a number", p.name)))?;
    let n = (n != 0).then_some(n);
    if k == "coalesce-usecs" {
        p.coalesce_usecs = n;
    } else {
        p.coalesce_frames = n;
    }
    Ok(())
}

/// Changes a port's settings that apply without re-creating it (`ferrovs set-port`).
pub fn port_set_options(p: &mut PortConfig, opts: &[String]) -> Result<(), ConfigError> {
    for o in opts {
        let (k, v) = o.split_once('=').ok_or_else(|| {
            ConfigError::Invalid(format!("port {}: option '{o}' is not KEY=VALUE", p.name))
        })?;
        match k {
            "coalesce-usecs" | "coalesce-frames" => set_coalesce(p, k, v)?,
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "port {}: '{k}' cannot be changed on a live port (settable: \
                     coalesce-usecs, coalesce-frames; for others delete and add the port)",
                    p.name
                )))
            }
        }
    }
    crate::config::validate_port(p)
}

/// Builds a port from `key=value` options as `ferrovs add-port` takes them.
pub fn port_from_options(name: &str, opts: &[String]) -> Result<PortConfig, ConfigError> {
    let bad = |s: String| ConfigError::Invalid(format!("port {name}: {s}"));
    let mut p = PortConfig::new(name, PortType::VhostUser);
    let mut kind = None;
    for o in opts {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| bad(format!("option '{o}' is not KEY=VALUE")))?;
        let num = |v: &str| {
            v.parse::<u16>()
                .map_err(|_| bad(format!("{k}={v}: not a number")))
        };
        match k {
            "type" => kind = Some(PortType::parse(v)?),
            "path" => p.path = Some(PathBuf::from(v)),
            "dev" => p.dev = Some(v.to_string()),
            "queues" => p.queues = num(v)?,
            "tag" => p.tag = Some(num(v)?),
            "trunks" => {
                p.trunks = v.split(',').map(num).collect::<Result<_, _>>()?;
            }
            "mode" => {
                p.mode = Some(crate::config::UplinkMode::parse(v).map_err(|e| bad(e.to_string()))?)
            }
            "coalesce-usecs" | "coalesce-frames" => set_coalesce(&mut p, k, v)?,
            "remote_ip" | "local_ip" => {
                let a: std::net::Ipv4Addr = v
                    .parse()
                    .map_err(|_| bad(format!("{k}={v}: not an IPv4 address")))?;
                if k == "remote_ip" {
                    p.remote_ip = Some(a);
                } else {
                    p.local_ip = Some(a);
                }
            }
            "key" => {
                p.key = Some(
                    v.parse::<u32>()
                        .map_err(|_| bad(format!("{k}={v}: not a number")))?,
                )
            }
            "dst_port" => p.dst_port = Some(num(v)?),
            _ => {
                return Err(bad(format!(
                    "unknown option '{k}' (known: type, path, dev, queues, tag, trunks, mode, \
                     coalesce-usecs, coalesce-frames, remote_ip, local_ip, key, dst_port)"
                )))
            }
        }
    }
    p.kind = kind.ok_or_else(|| bad("type=TYPE is required".into()))?;
    crate::config::validate_port(&p)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_json() {
        let r: Request =
            serde_json::from_str(r#"{"cmd":"del-port","bridge":"br0","port":"vm1"}"#).unwrap();
        assert_eq!(
            r,
            Request::DelPort {
                bridge: "br0".into(),
                port: "vm1".into()
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
    }

    #[test]
    fn port_options() {
        let p = port_from_options(
            "p",
            &[
                "type=vhost-user".into(),
                "path=/tmp/p.sock".into(),
                "queues=4".into(),
                "tag=10".into(),
            ],
        )
        .unwrap();
        assert_eq!((p.queues, p.tag), (4, Some(10)));
        let e = port_from_options("p", &["type=vhost-user".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("path=SOCKET is required"), "{e}");
        let e = port_from_options(
            "p",
            &[
                "type=vhost-user".into(),
                "path=/x".into(),
                "queues=abc".into(),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("queues=abc: not a number"), "{e}");
        assert!(port_from_options("p", &["colour=red".into()]).is_err());
        assert!(port_from_options("p", &["path=/x".into()])
            .unwrap_err()
            .to_string()
            .contains("type=TYPE"));
    }
}
