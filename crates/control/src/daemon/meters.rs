//! OpenFlow meters of each bridge, for the CLI (`ferrovs add-meter`, `mod-meter`,
//! `del-meters`, `dump-meters`, `meter-stats`) and OpenFlow (METER_MOD, the METER,
//! METER_CONFIG and METER_FEATURES multiparts) alike.
//!
//! Invariants:
//! * A bridge's meters live in three places kept equal: the datapath's
//!   [`dp::meter::MeterTable`] (shared with every snapshot: adding, reconfiguring or
//!   deleting a meter needs no new pipeline), `BridgeState::meter_specs` (the configuration
//!   and when the meter was added), and the saved configuration (`BridgeConfig::meters`, in
//!   ovs-ofctl syntax, which hot upgrade carries).
//! * Every change is checked once, by `crate::openflow::meters::check_meter` (OVS's
//!   checks and errors); the CLI reports the same error by name.
//! * Deleting a meter deletes the rules that use it (as OVS) and publishes them before the
//!   meter leaves the datapath's table, so no cached megaflow runs unmetered in between.

use ferrovs_flow::meter::{parse_meter, MeterSpec};
use ferrovs_flow::ActionSpec;
use ferrovs_openflow::message::meter as ofp_meter;
use ferrovs_openflow::multipart::{Counter, MeterConfig, MeterStats as OfMeterStats};
use ferrovs_openflow::{MeterMod, OfError};
use ferrovs_proto::reply::{MeterBandStats, MeterEntry, MeterStats};

use crate::openflow::meters as ofm;

use super::*;

/// Whether `spec` runs packets through meter `id`.
fn uses(spec: &ferrovs_flow::FlowSpec, ids: &[u32]) -> bool {
    spec.actions
        .iter()
        .any(|a| matches!(a, ActionSpec::Meter(m) if ids.contains(m)))
}

impl Daemon {
    /// Loads a bridge's saved meters (start-up, takeover) into its table. A meter that does
    /// not parse (`Config::validate` refuses such a file anyway) or that the switch would
    /// refuse (a hand-written DSCP_REMARK band, a duplicate id) is logged and left out.
    pub(super) fn restore_meters(&mut self, bridge: &str, texts: &[String]) {
        let Some(b) = self.bridges.get_mut(bridge) else {
            return;
        };
        for t in texts {
            let checked = parse_meter(t).map_err(|e| e.to_string()).and_then(|spec| {
                let exists = b.meter_specs.contains_key(&spec.id);
                ofm::check_meter(&spec, false, exists, b.meter_specs.len())
                    .map(|_| spec)
                    .map_err(|e| e.reason.to_string())
            });
            match checked {
                Ok(spec) => {
                    b.meters.set(&spec);
                    b.meter_specs.insert(spec.id, (spec, Instant::now()));
                }
                Err(e) => log::warn!("bridge {bridge}: saved meter '{t}' left out: {e}"),
            }
        }
        self.sync_meters_config(bridge);
    }

    /// Copies a bridge's meters into the configuration (to be saved).
    fn sync_meters_config(&mut self, bridge: &str) {
        let Some(b) = self.bridges.get(bridge) else {
            return;
        };
        let texts = b.meter_specs.values().map(|(s, _)| s.to_string()).collect();
        if let Some(c) = self.cfg_bridge(bridge) {
            c.meters = texts;
        }
    }

    /// Adds (`modify` false) or reconfigures meter `spec.id`, checked as OVS checks it.
    pub(super) fn set_meter(
        &mut self,
        bridge: &str,
        spec: MeterSpec,
        modify: bool,
    ) -> Result<(), OfError> {
        let Some(b) = self.bridges.get_mut(bridge) else {
            return Ok(());
        };
        let old = b.meter_specs.get(&spec.id).map(|x| x.1);
        ofm::check_meter(&spec, modify, old.is_some(), b.meter_specs.len())?;
        b.meters.set(&spec);
        b.meter_specs
            .insert(spec.id, (spec, old.unwrap_or_else(Instant::now)));
        self.sync_meters_config(bridge);
        Ok(())
    }

    /// Deletes meter `id` (`None`: every meter) and the rules that use it; returns how many
    /// meters went.
    pub(super) fn delete_meters(&mut self, bridge: &str, id: Option<u32>) -> usize {
        let Some(b) = self.bridges.get_mut(bridge) else {
            return 0;
        };
        let gone: Vec<u32> = match id {
            Some(i) => b
                .meter_specs
                .contains_key(&i)
                .then_some(i)
                .into_iter()
                .collect(),
            None => b.meter_specs.keys().copied().collect(),
        };
        if gone.is_empty() {
            return 0;
        }
        let all = b.rules.rules_mut();
        let before = all.len();
        all.retain(|r| !uses(&r.spec, &gone));
        if all.len() != before {
            b.dirty = true;
            self.sync_flows_config(bridge);
            // The rules' megaflows are revalidated away before the meters go.
            self.publish();
        }
        let b = self.bridges.get_mut(bridge).expect("bridge checked above");
        for i in &gone {
            b.meter_specs.remove(i);
            b.meters.remove(*i);
        }
        self.sync_meters_config(bridge);
        gone.len()
    }

    /// Whether the bridge has meter `id`.
    pub(super) fn has_meter(&self, bridge: &str, id: u32) -> bool {
        self.bridges
            .get(bridge)
            .is_some_and(|b| b.meter_specs.contains_key(&id))
    }

    /// The meters `id` selects (`None`: all), in id order, with their counters.
    fn meter_rows(
        &self,
        bridge: &str,
        id: Option<u32>,
    ) -> Vec<(MeterSpec, Instant, u32, dp::meter::MeterCounters)> {
        let Some(b) = self.bridges.get(bridge) else {
            return vec![];
        };
        b.meter_specs
            .iter()
            .filter(|(k, _)| id.is_none_or(|i| i == **k))
            .map(|(k, (s, since))| {
                let flows = b
                    .rules
                    .rules()
                    .iter()
                    .filter(|r| uses(&r.spec, &[*k]))
                    .count();
                let c = b.meters.get(*k).map(|m| m.counters()).unwrap_or_default();
                (s.clone(), *since, flows as u32, c)
            })
            .collect()
    }

    // ---- The CLI ----

    fn meter_arg(bridge: &str, text: &str) -> Result<MeterSpec, ConfigError> {
        parse_meter(text)
            .map_err(|e| ConfigError::Invalid(format!("bridge {bridge}: bad meter: {e}")))
    }

    /// `ferrovs add-meter` / `mod-meter`.
    pub(super) fn cli_set_meter(
        &mut self,
        bridge: &str,
        text: &str,
        modify: bool,
    ) -> Result<(), ConfigError> {
        self.bridge_mut(bridge)?;
        let spec = Self::meter_arg(bridge, text)?;
        let id = spec.id;
        self.set_meter(bridge, spec, modify).map_err(|e| {
            ConfigError::Invalid(format!(
                "bridge {bridge}: meter {id}: {} ({})",
                e.reason,
                e.name().unwrap_or("OFPET_METER_MOD_FAILED")
            ))
        })
    }

    /// `ferrovs del-meters`.
    pub(super) fn cli_del_meters(
        &mut self,
        bridge: &str,
        id: Option<u32>,
    ) -> Result<(), ConfigError> {
        self.bridge_mut(bridge)?;
        self.delete_meters(bridge, id);
        Ok(())
    }

    /// `ferrovs dump-meters`.
    pub(super) fn dump_meters(
        &mut self,
        bridge: &str,
        id: Option<u32>,
    ) -> Result<Vec<MeterEntry>, ConfigError> {
        self.bridge_mut(bridge)?;
        Ok(self
            .meter_rows(bridge, id)
            .into_iter()
            .map(|(s, ..)| MeterEntry {
                id: s.id,
                meter: s.to_string(),
            })
            .collect())
    }

    /// `ferrovs meter-stats`.
    pub(super) fn meter_stats(
        &mut self,
        bridge: &str,
        id: Option<u32>,
    ) -> Result<Vec<MeterStats>, ConfigError> {
        self.bridge_mut(bridge)?;
        Ok(self
            .meter_rows(bridge, id)
            .into_iter()
            .map(|(s, since, flows, c)| MeterStats {
                bands: c
                    .bands
                    .iter()
                    .map(|&(p, b)| MeterBandStats {
                        packet_count: p,
                        byte_count: b,
                    })
                    .collect(),
                byte_in_count: c.bytes,
                duration_s: since.elapsed().as_secs_f64(),
                flow_count: u64::from(flows),
                id: s.id,
                packet_in_count: c.packets,
            })
            .collect())
    }

    // ---- OpenFlow ----

    /// A METER_MOD.
    pub(super) fn of_meter_mod(&mut self, bridge: &str, mm: &MeterMod) -> Result<(), OfError> {
        if mm.command == ofp_meter::DELETE {
            let id = (mm.meter_id != ofp_meter::ALL).then_some(mm.meter_id);
            if self.delete_meters(bridge, id) > 0 {
                self.save();
            }
            return Ok(());
        }
        let exists = self.has_meter(bridge, mm.meter_id);
        let count = self.bridges.get(bridge).map_or(0, |b| b.meter_specs.len());
        let spec = ofm::meter_from_of(mm, exists, count)?;
        self.set_meter(bridge, spec, mm.command == ofp_meter::MODIFY)?;
        self.save();
        Ok(())
    }

    /// The METER multipart: counters of meter `id` (`OFPM_ALL`: every meter).
    pub(super) fn of_meter_stats(&self, bridge: &str, id: u32) -> Vec<OfMeterStats> {
        let id = (id != ofp_meter::ALL).then_some(id);
        self.meter_rows(bridge, id)
            .into_iter()
            .map(|(s, since, flows, c)| {
                let d = since.elapsed();
                OfMeterStats {
                    meter_id: s.id,
                    flow_count: flows,
                    packet_in_count: c.packets,
                    byte_in_count: c.bytes,
                    duration_sec: d.as_secs() as u32,
                    duration_nsec: d.subsec_nanos(),
                    band_stats: c
                        .bands
                        .iter()
                        .map(|&(p, b)| Counter {
                            packet_count: p,
                            byte_count: b,
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// The METER_CONFIG multipart.
    pub(super) fn of_meter_config(&self, bridge: &str, id: u32) -> Vec<MeterConfig> {
        let id = (id != ofp_meter::ALL).then_some(id);
        self.meter_rows(bridge, id)
            .into_iter()
            .map(|(s, ..)| MeterConfig {
                flags: s.flags,
                meter_id: s.id,
                bands: ofm::bands_to_of(&s),
            })
            .collect()
    }
}
