//! `key=value` port options as `ferrovs add-port` and `set-port` send them, parsed into the
//! configuration model (the requests themselves are `ferrovs_proto::Request`).

use std::path::PathBuf;

use crate::config::{ConfigError, PortConfig, PortType};

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
            // Empty: no pins.
            "pmd-rxq-affinity" => p.pmd_rxq_affinity = (!v.is_empty()).then(|| v.to_string()),
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "port {}: '{k}' cannot be changed on a live port (settable: \
                     coalesce-usecs, coalesce-frames, pmd-rxq-affinity; for others delete \
                     and add the port)",
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
            "pmd-rxq-affinity" => p.pmd_rxq_affinity = Some(v.to_string()),
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
            "key" if v == "flow" => p.key_flow = true,
            "key" => {
                p.key = Some(
                    v.parse::<u32>()
                        .map_err(|_| bad(format!("{k}={v}: not a number or flow")))?,
                )
            }
            "csum" => {
                p.csum = Some(match v {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad(format!("csum={v}: true or false"))),
                })
            }
            "dst_port" => p.dst_port = Some(num(v)?),
            "ofport" => p.ofport = Some(num(v)?),
            _ => {
                return Err(bad(format!(
                    "unknown option '{k}' (known: type, path, dev, queues, tag, trunks, mode, \
                     coalesce-usecs, coalesce-frames, remote_ip, local_ip, key, csum, dst_port, ofport)"
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
