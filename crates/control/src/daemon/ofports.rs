//! Ports as OpenFlow peers see and change them: PORT_MOD (`OFPPC_PORT_DOWN`: the port
//! leaves the datapath, neither polled nor an output, until set up again) and PORT_STATUS
//! `MODIFY` to every connection of the bridge (management and controllers) when a port's
//! administrative or link state changes.
//!
//! The configuration bits are the daemon's (`OfState::port_config`), not saved: as in
//! OVS, a PORT_MOD lasts until the switch restarts; a port deleted forgets them. Link
//! changes are noticed on the tick (at most 100 ms late) by comparing each port's link
//! with what was last announced.

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

    /// `d` with the port's configuration bits (and `LINK_DOWN` while it is down, as OVS's
    /// netdev reports an administratively down device).
    pub(super) fn of_admin_desc(&self, mut d: ferrovs_openflow::Port) -> ferrovs_openflow::Port {
        let bits = self.openflow.port_config.get(&d.name).copied().unwrap_or(0);
        d.config = bits;
        if bits & pconfig::PORT_DOWN != 0 {
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
            log::info!(
                "port {name}: administratively {} over OpenFlow",
                if new & pconfig::PORT_DOWN != 0 {
                    "down"
                } else {
                    "up"
                }
            );
            self.publish_snapshot();
            self.quiesce();
        }
        if let Some((b, d)) = self.of_port_desc(&name) {
            self.of_port_status(&b, d, OFPPR_MODIFY);
        }
        Ok(())
    }

    /// The tick: PORT_STATUS `MODIFY` for every port whose link came up or went down.
    pub(super) fn of_link_changes(&mut self) {
        let mut changed = Vec::new();
        for (name, p) in &self.ports {
            let up = matches!(p.link, Link::Connected | Link::Attached);
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
            if let Some((b, d)) = self.of_port_desc(&name) {
                self.of_port_status(&b, d, OFPPR_MODIFY);
            }
        }
    }
}
