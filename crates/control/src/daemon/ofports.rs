//! Ports as OpenFlow peers see and change them: PORT_MOD (`OFPPC_PORT_DOWN`: the port
//! leaves the datapath, neither polled nor an output, until set up again) and PORT_STATUS
//! `MODIFY` to every connection of the bridge (management and controllers) when a port's
//! administrative or link state changes.
//!
//! The configuration bits are the daemon's (`OfState::port_config`), not saved: as in
//! OVS, a PORT_MOD lasts until the switch restarts; a port deleted forgets them. Link
//! changes are noticed on the tick (at most 100 ms late) by comparing each port's link
//! with what was last announced.
//!
//! A port is *live* (OVS's `ofport_is_live`: what a fast_failover bucket's `watch_port`
//! asks) when its link is up — a vhost-user port's frontend connected; a kernel port's
//! netdev `IFF_UP` with carrier, read from sysfs on the tick — and no PORT_MOD set it
//! down. A change of liveness rebuilds the pipeline of a bridge whose buckets watch ports
//! and revalidates its megaflows ([`Daemon::link_changed`]), so traffic moves to the next
//! live bucket within a tick. A kernel netdev this namespace cannot see (a TAP moved into
//! another namespace) counts as up: only a netdev known to be down is down.

use ferrovs_openflow::error::{et, pmfc};
use ferrovs_openflow::port::{config as pconfig, state as pstate};
use ferrovs_openflow::OfError;

use super::*;

/// `OFPPR_MODIFY`.
const OFPPR_MODIFY: u8 = 2;

/// The `OFPPC_*` bits PORT_MOD may change here.
const SUPPORTED: u32 = pconfig::PORT_DOWN | pconfig::NO_PACKET_IN;

impl Daemon {
    /// Whether port `name` was set down over OpenFlow.
    pub(super) fn of_admin_down(&self, name: &str) -> bool {
        self.openflow
            .port_config
            .get(name)
            .is_some_and(|c| c & pconfig::PORT_DOWN != 0)
    }

    /// Whether port `p` is live: link up (for a kernel port, its netdev up with carrier)
    /// and not set down over OpenFlow.
    pub(super) fn port_live(&self, p: &PortState) -> bool {
        matches!(p.link, Link::Connected | Link::Attached)
            && !self.openflow.carrier_down.contains(&p.cfg.name)
            && !self.of_admin_down(&p.cfg.name)
    }

    /// `d` with the port's configuration bits (and `LINK_DOWN` while it is down, as OVS's
    /// netdev reports an administratively down device).
    pub(super) fn of_admin_desc(&self, mut d: ferrovs_openflow::Port) -> ferrovs_openflow::Port {
        let bits = self.openflow.port_config.get(&d.name).copied().unwrap_or(0);
        d.config = bits;
        if bits & pconfig::PORT_DOWN != 0 || self.openflow.carrier_down.contains(&d.name) {
            d.state = pstate::LINK_DOWN;
        }
        d
    }

    /// PORT_MOD: checks the port and its address as OVS does, applies the bits, and tells
    /// every peer (PORT_STATUS `MODIFY`) when something changed.
    pub(super) fn of_port_mod(
        &mut self,
        bridge: &str,
        pm: &ferrovs_openflow::message::PortMod,
    ) -> Result<(), OfError> {
        let name = self
            .of_ports(bridge)
            .name(pm.port_no)
            .map(str::to_string)
            .filter(|n| self.ports.get(n).is_some_and(|p| p.bridge == bridge))
            .ok_or_else(|| {
                OfError::new(
                    et::PORT_MOD_FAILED,
                    pmfc::BAD_PORT,
                    "no such port on this bridge",
                )
            })?;
        let Some((_, desc)) = self.of_port_desc(&name) else {
            return Err(OfError::new(
                et::PORT_MOD_FAILED,
                pmfc::BAD_PORT,
                "the port has no OpenFlow number",
            ));
        };
        if pm.hw_addr != desc.hw_addr {
            return Err(OfError::new(
                et::PORT_MOD_FAILED,
                pmfc::BAD_HW_ADDR,
                "hw_addr is not the port's address",
            ));
        }
        if pm.mask & !SUPPORTED & pm.config != 0 {
            return Err(OfError::new(
                et::PORT_MOD_FAILED,
                pmfc::BAD_CONFIG,
                "only PORT_DOWN and NO_PACKET_IN can be set on this switch",
            ));
        }
        let mask = pm.mask & SUPPORTED;
        let old = self.openflow.port_config.get(&name).copied().unwrap_or(0);
        let new = (old & !mask) | (pm.config & mask);
        if new == old {
            return Ok(());
        }
        if new == 0 {
            self.openflow.port_config.remove(&name);
        } else {
            self.openflow.port_config.insert(name.clone(), new);
        }
        if (old ^ new) & pconfig::PORT_DOWN != 0 {
            limited!(
                self.logs,
                Info,
                &name,
                "port-mod",
                "administratively {} over OpenFlow",
                if new & pconfig::PORT_DOWN != 0 {
                    "down"
                } else {
                    "up"
                }
            );
            self.publish_snapshot();
            self.quiesce();
            // Liveness changed: buckets watching the port move (a rebuild if any does).
            self.link_changed(&name);
        }
        if let Some((b, d)) = self.of_port_desc(&name) {
            self.of_port_status(&b, d, OFPPR_MODIFY);
        }
        Ok(())
    }

    /// The tick: PORT_STATUS `MODIFY` for every port whose link came up or went down.
    pub(super) fn of_link_changes(&mut self) {
        self.openflow.carrier_down = self
            .ports
            .values()
            .filter(|p| p.cfg.kind.is_kernel() && p.link == Link::Attached)
            .filter(|p| {
                p.cfg
                    .dev
                    .as_deref()
                    .is_some_and(|dev| netdev_down(Path::new(SYS_CLASS_NET), dev))
            })
            .map(|p| p.cfg.name.clone())
            .collect();
        let mut changed = Vec::new();
        for (name, p) in &self.ports {
            let up = matches!(p.link, Link::Connected | Link::Attached)
                && !self.openflow.carrier_down.contains(name);
            match self.openflow.link_seen.get(name) {
                Some(&was) if was != up => changed.push((name.clone(), up)),
                None => changed.push((name.clone(), up)),
                _ => {}
            }
        }
        self.openflow
            .link_seen
            .retain(|n, _| self.ports.contains_key(n));
        self.openflow
            .port_config
            .retain(|n, _| self.ports.contains_key(n));
        for (name, up) in changed {
            let first = self.openflow.link_seen.insert(name.clone(), up).is_none();
            if first {
                // A new port: its PORT_STATUS ADD already went.
                continue;
            }
            // A kernel port's carrier is seen only here (a vhost-user link rebuilt where it
            // changed; again is a no-op).
            self.link_changed(&name);
            if let Some((b, d)) = self.of_port_desc(&name) {
                self.of_port_status(&b, d, OFPPR_MODIFY);
            }
        }
    }
}

/// Where the kernel shows this namespace's netdevs.
const SYS_CLASS_NET: &str = "/sys/class/net";

/// Whether netdev `dev` under `sys_class_net` is known to be down: administratively (no
/// `IFF_UP` in `flags`) or without carrier (`carrier` reads 0; the kernel refuses to read
/// it while the device is down). A netdev that is not there (another namespace) or whose
/// files cannot be read is not known to be down.
pub(super) fn netdev_down(sys_class_net: &Path, dev: &str) -> bool {
    if dev.is_empty() || dev.contains('/') || dev == "." || dev == ".." {
        return false;
    }
    let base = sys_class_net.join(dev);
    let Some(flags) = std::fs::read_to_string(base.join("flags"))
        .ok()
        .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
    else {
        return false;
    };
    const IFF_UP: u32 = 1;
    if flags & IFF_UP == 0 {
        return true;
    }
    std::fs::read_to_string(base.join("carrier")).is_ok_and(|c| c.trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys/class/net` with `dev`'s flags and carrier (None: no carrier file).
    fn sysfs(dev: &str, flags: &str, carrier: Option<&str>) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "ferrovs-netdev-down-{}-{dev}-{flags}-{}",
            std::process::id(),
            carrier.unwrap_or("none")
        ));
        let d = root.join(dev);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("flags"), format!("{flags}\n")).unwrap();
        if let Some(c) = carrier {
            std::fs::write(d.join("carrier"), format!("{c}\n")).unwrap();
        }
        root
    }

    #[test]
    fn a_netdev_is_down_when_not_up_or_without_carrier() {
        // IFF_UP with carrier: up.
        let r = sysfs("v1", "0x1003", Some("1"));
        assert!(!netdev_down(&r, "v1"));
        // IFF_UP, carrier lost (a veth whose peer went down): down.
        let r = sysfs("v2", "0x1003", Some("0"));
        assert!(netdev_down(&r, "v2"));
        // Not IFF_UP (the kernel refuses to read carrier then): down.
        let r = sysfs("v3", "0x1002", None);
        assert!(netdev_down(&r, "v3"));
        // Not in this namespace, or a name that is not a netdev's: not known to be down.
        assert!(!netdev_down(&r, "elsewhere"));
        assert!(!netdev_down(&r, "../v3"));
        assert!(!netdev_down(&r, ""));
        // Unreadable flags: not known to be down.
        let r = sysfs("v4", "garbage", Some("0"));
        assert!(!netdev_down(&r, "v4"));
    }
}
